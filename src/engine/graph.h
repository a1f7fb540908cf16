/* Internal to the engine and its device backends (src/cuda): the model's
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
 * slots GW_*), slots LW_* / GW_* (engine_internal.h); a bias slot of -1,
 * or one the model does not have, is no bias. */
#ifndef FT_ENGINE_GRAPH_H
#define FT_ENGINE_GRAPH_H
#include "engine_internal.h"

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

/* One forward call on a backend whose row metadata (tokens, positions,
 * sequences) is set up: embeddings, every layer, then for want 1 (the
 * last row of each of the n sequences) or 2 (every row) the final norm,
 * project_out and LM head into FT_GB_LOGITS (*nsel rows). want 0: no
 * logits. On error the failing layer is reported by *failed_layer (-1:
 * before or after the layers). */
ft_status ft_graph_forward(const ft_backend_ops *o, void *b, const ft_model *m, int rows, int n, int want,
                           int *nsel, int *failed_layer);
#endif
