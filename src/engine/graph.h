/* The engine's interface to its device backends (src/cuda includes this,
 * never engine_internal.h): the model's
 * computation written once (graph.c) over a backend's operations. A
 * backend (the CPU context in forward.c, the CUDA context in
 * src/cuda/cuda_ctx.c) owns the activation buffers, the KV cache and the
 * weights on its device, and implements each operation there; the graph
 * decides what runs, in which order, on which buffers and weights: the
 * architecture's blocks (pre/post-norm, RoPE or learned positions,
 * SwiGLU or ReLU, project_in/out, the final norm) exist only in graph.c.
 *
 * Buffers are named (ft_gbuf); their widths follow from the operation
 * (hidden for X/XB, the matrix's rows for a product's output). Weights are
 * named by (layer handle, slot): a layer handle is what the backend's
 * layer_begin returned for that layer (NULL = the model-wide tensors,
 * slots GW_*), slots LW_* / GW_* (above); a bias slot of -1,
 * or one the model does not have, is no bias. */
#ifndef FT_ENGINE_GRAPH_H
#define FT_ENGINE_GRAPH_H
#include "flextier/engine.h"

/* ------------------------------------------ what a backend may know */

/* Per-layer weight slots, in the field order of ft_layer_weights. */
enum {
    LW_NORM1_W, LW_NORM1_B, LW_Q, LW_QB, LW_K, LW_KB, LW_V, LW_VB, LW_O, LW_OB,
    LW_NORM2_W, LW_NORM2_B, LW_GATE, LW_GATE_B, LW_UP, LW_UP_B, LW_DOWN, LW_DOWN_B,
    LW_QNORM, LW_KNORM, LW_POST_ATTN_NORM, LW_POST_FFN_NORM, LW_ROUTER, LW_SHARED_GATE,
    LW_COUNT
};
/* Expert matrices: slot LW_EXPERT(e, k), k = 0 gate, 1 up, 2 down. */
#define LW_EXPERT(e, k) (LW_COUNT + 3 * (e) + (k))
enum { LW_EXP_GATE = 0, LW_EXP_UP = 1, LW_EXP_DOWN = 2 };
/* Model-wide weight slots. */
enum {
    GW_TOK_EMB, GW_POS_EMB, GW_PROJ_IN, GW_PROJ_OUT, GW_FINAL_NORM_W, GW_FINAL_NORM_B,
    GW_LM_HEAD, GW_COUNT
};

/* The architecture's building blocks (how norm/pos/ffn ops compute). */
enum { FT_NORM_LAYER = 0, FT_NORM_RMS = 1 };
enum { FT_POS_LEARNED = 0, FT_POS_ROPE = 1 };
enum { FT_FFN_RELU = 0, FT_FFN_SWIGLU = 1 };

typedef struct ft_model_blocks { int norm, pos, ffn, pos_offset; } ft_model_blocks;
void ft_model_get_blocks(const ft_model *m, ft_model_blocks *out);

/* What a model's graph needs beyond the OPT / Llama blocks: a backend
 * that lacks one of these refuses the model (ft_model_features_name
 * names them). */
enum {
    FT_FEAT_QK_NORM = 1u << 0,       /* qk_norm op                          */
    FT_FEAT_NORM_PLUS_ONE = 1u << 1, /* (1 + w) RMSNorm                     */
    FT_FEAT_SANDWICH = 1u << 2,      /* post-attention / post-FFN norms     */
    FT_FEAT_GELU = 1u << 3,          /* GeGLU                               */
    FT_FEAT_EMBED_SCALE = 1u << 4,   /* scale op on the embeddings          */
    FT_FEAT_ATTN_SCALE = 1u << 5,    /* score scale other than 1/sqrt(hd)  */
    FT_FEAT_SOFTCAP = 1u << 6,       /* attention / logit soft-capping      */
    FT_FEAT_LOCAL_ROPE = 1u << 7,    /* a second RoPE base for sliding layers */
    FT_FEAT_MOE = 1u << 8            /* moe op                              */
};
unsigned ft_model_features(const ft_model *m);
/* "qk_norm, moe" etc. for the bits of f into buf. */
const char *ft_model_features_name(unsigned f, char *buf, size_t n);

/* Shapes (2 dims at most) of a slot; return ndim. */
int ft_model_global_shape(const ft_model *m, int slot, int64_t shape[2]);
int ft_layer_shape(const ft_model_config *c, int slot, int64_t shape[2]);
/* The model-wide tensor of a slot (absent: data and chunk NULL). */
const ft_wmat *ft_model_global(const ft_model *m, int slot);
/* The architecture has layer tensor `slot` (for this config). */
int ft_model_layer_has(const ft_model *m, int slot);
/* The layers' weights are in the model (not external). */
int ft_model_layers_loaded(const ft_model *m);

/* A tensor of an f32 model's layer as a plain pointer (NULL if absent). */
static inline const float *ft_layer_f32(const ft_layer_weights *cw, int slot)
{
    ft_layer_weights *w = (ft_layer_weights *)(uintptr_t)cw;   /* the accessors serve writers too; read only here */
    return ft_layer_slot_is_matrix(slot) ? (const float *)ft_layer_weights_mat(w, slot)->data
                                         : *ft_layer_weights_vec(w, slot);
}

/* RoPE inverse frequencies (head_dim/2 of them), with llama3 scaling, in
 * f32 exactly as transformers computes them (forward.c; the CUDA backend
 * builds its tables from the same function). */
void ft_rope_inv_freq(const ft_model_config *cfg, float *inv, int half);
/* cos/sin tables [npos][head_dim/2] from those frequencies, times yarn's
 * attention factor (the CPU and CUDA contexts both build theirs here). */
void ft_rope_tables(const ft_model_config *cfg, size_t npos, float *cos, float *sin);
/* The smallest attention window of any layer (0: none). */
int ft_config_min_window(const ft_model_config *cfg);

/* ----------------------------------------------- the backend's ops */

typedef enum ft_gbuf {
    FT_GB_X,        /* hidden states [rows][hidden] (the residual stream)  */
    FT_GB_XB,       /* scratch of the same shape (also embeddings [E])    */
    FT_GB_Q, FT_GB_K, FT_GB_V, FT_GB_ATT,
    FT_GB_H1, FT_GB_H2,
    FT_GB_SEL, FT_GB_SEL2,   /* the rows that want logits                 */
    FT_GB_LOGITS,   /* the output: [nsel][vocab]                           */
    FT_GB_COUNT
} ft_gbuf;

typedef struct ft_backend_ops {
    /* token embeddings of the call's rows (word_embed_proj_dim wide) */
    ft_status (*embed)(void *b, ft_gbuf out, int rows);
    /* learned position embeddings added to X (OPT) */
    ft_status (*add_positions)(void *b, int rows);
    /* make layer l's weights present on the device (streaming, hooks) and
     * its KV cache ready; *w: the handle the other ops get */
    ft_status (*layer_begin)(void *b, int l, const void **w);
    /* the layer is computed (write its cache back, free its slot) */
    ft_status (*layer_end)(void *b, int l);
    ft_status (*norm)(void *b, ft_gbuf out, ft_gbuf in, int rows, const void *w, int slot_w, int slot_b);
    ft_status (*linear)(void *b, ft_gbuf y, ft_gbuf x, int rows, const void *w, int slot, int slot_b);
    /* RoPE on Q and K at the rows' positions */
    ft_status (*rope)(void *b, int rows);
    /* append the rows' K/V to layer l's cache, attend: ATT */
    ft_status (*attention)(void *b, int l, int rows);
    /* H1 = act(H1) (* H2 for SwiGLU) */
    ft_status (*ffn_act)(void *b, int rows);
    /* y += x, hidden wide */
    ft_status (*add)(void *b, ft_gbuf y, ft_gbuf x, int rows);
    /* out[j] = in[last row of sequence j] for the call's n sequences */
    ft_status (*gather_last)(void *b, ft_gbuf out, ft_gbuf in, int n);
    /* --- the newer families' ops (NULL in a backend that refuses them:
     * ft_model_features) */
    /* RMSNorm of Q and K (LW_QNORM, LW_KNORM) per head or whole (qk_norm) */
    ft_status (*qk_norm)(void *b, int rows, const void *w);
    /* buf *= f, hidden wide */
    ft_status (*scale)(void *b, ft_gbuf buf, int rows, float f);
    /* logits = cap * tanh(logits / cap), vocab wide */
    ft_status (*softcap)(void *b, ft_gbuf buf, int rows, float cap);
    /* out = the layer's mixture of experts applied to in (router, top-k,
     * the selected experts' SwiGLU FFNs, weighted sum), hidden wide */
    ft_status (*moe)(void *b, ft_gbuf out, ft_gbuf in, int rows, const void *w);
} ft_backend_ops;

/* The checks every backend's forward makes (ft_ctx_forward's contract):
 * the batch, slots (in range, distinct), tokens (in the vocabulary), the
 * context's room per sequence (seq_len[slot] + ntok <= max_seq) and per
 * call (rows <= max_rows); *rows receives the call's new tokens. */
typedef struct ft_call_limits {
    int vocab, max_batch, max_seq, max_rows, all_logits;
    const int *seq_len;
} ft_call_limits;

ft_status ft_graph_check_call(const ft_call_limits *lim, size_t n, const int *slots, const int32_t *const *tokens,
                              const size_t *ntok, int all_rows, size_t *rows);
/* The same for a call whose input is not tokens (need_tokens 0: a
 * pipeline stage after the first takes hidden states; tokens may be NULL
 * and are not looked at). */
ft_status ft_graph_check_call_ex(const ft_call_limits *lim, size_t n, const int *slots, const int32_t *const *tokens,
                                 const size_t *ntok, int all_rows, int need_tokens, size_t *rows);

/* One forward call on a backend whose row metadata (tokens, positions,
 * sequences) is set up: embeddings, every layer, then for want 1 (the
 * last row of each of the n sequences) or 2 (every row) the final norm,
 * project_out and LM head into FT_GB_LOGITS (*nsel rows). want 0: no
 * logits. On error the failing layer is reported by *failed_layer (-1:
 * before or after the layers). */
ft_status ft_graph_forward(const ft_backend_ops *o, void *b, const ft_model *m, int rows, int n, int want,
                           int *nsel, int *failed_layer);
/* A pipeline stage's part of that call (ft_ctx_forward_layers): layers
 * [l0, l1). With l0 > 0 the embeddings are skipped (the backend has put
 * the previous stage's hidden states in FT_GB_X); want must be 0 unless
 * l1 is the last layer. ft_graph_forward is the range [0, n_layers). */
ft_status ft_graph_forward_layers(const ft_backend_ops *o, void *b, const ft_model *m, int rows, int n, int l0,
                                  int l1, int want, int *nsel, int *failed_layer);
#endif
