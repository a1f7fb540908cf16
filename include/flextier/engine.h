/*
 * flextier/engine.h - the CPU inference engine: model configuration
 * (Hugging Face config.json), weights, a batched layer-major forward pass
 * with a per-sequence KV cache, sampling and batched generation.
 *
 * Architectures: OPT (model_type "opt"), Llama ("llama", and "mistral"
 * with its sliding window) and Qwen2 ("qwen2", sliding windows included). Each is a small
 * table in src/engine/arch_<name>.c (tensor names and feature flags); the
 * forward pass is shared.
 *
 * Shape of the computation (FlexGen's): every forward call takes a batch of
 * sequences, each contributing any number of new tokens (prefill: the whole
 * prompt; decode: one token). All new tokens of all sequences are stacked
 * into one matrix, so every linear layer is one cblas_sgemm over the whole
 * batch; attention runs per (sequence, head) on the thread pool. The pass is
 * layer-major: layer 0 for the whole batch, then layer 1, ... Before each
 * layer an optional hook runs ("make layer i's weights present"), which is
 * where the offloading scheduler streams weights from other tiers.
 *
 * Weights are f32 in memory (bf16/f16 checkpoints are converted once at
 * load), in the Hugging Face (out_features, in_features) layout.
 *
 * Thread-safety: an ft_model is immutable after load and may be shared by
 * several contexts; an ft_ctx is used by one thread at a time (it uses its
 * own thread pool internally).
 */
#ifndef FLEXTIER_ENGINE_H
#define FLEXTIER_ENGINE_H

#include "flextier/core.h"
#include "flextier/codec.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- config */

typedef enum ft_arch_id {
    FT_ARCH_OPT = 1,
    FT_ARCH_LLAMA = 2,     /* also model_type "mistral" (same graph)        */
    FT_ARCH_QWEN2 = 3,     /* Llama with q/k/v biases, no o_proj bias       */
    FT_ARCH_QWEN3 = 4,     /* Llama with per-head q/k RMSNorm; "qwen3_moe"  */
    FT_ARCH_PHI3 = 5,      /* Llama with fused qkv_proj and gate_up_proj    */
    FT_ARCH_GEMMA2 = 6,    /* sandwich norms, (1 + w) RMSNorm, GELU-tanh,
                              soft-capping; "gemma3_text" too              */
    FT_ARCH_MIXTRAL = 7,   /* Mistral attention, sparse MoE FFN             */
    FT_ARCH_OLMOE = 8      /* q/k RMSNorm over the projection, sparse MoE   */
} ft_arch_id;

/* FFN activations (hidden_act / hidden_activation). */
typedef enum ft_act {
    FT_ACT_SILU = 0,       /* SwiGLU: silu(gate) * up                       */
    FT_ACT_GELU_TANH = 1,  /* GeGLU: gelu_pytorch_tanh(gate) * up           */
    FT_ACT_RELU = 2        /* OPT: relu(fc1)                                 */
} ft_act;

#define FT_MAX_EXPERTS 1024

#define FT_MAX_EOS 8
#define FT_MAX_LAYERS 1024

/* RoPE variants (rope_type in transformers); anything else is refused. */
typedef enum ft_rope_type {
    FT_ROPE_DEFAULT = 0,
    FT_ROPE_LINEAR = 1,    /* positions divided by factor                   */
    FT_ROPE_DYNAMIC = 2,   /* NTK: equals default up to max_position_embeddings,
                              which bounds every context here              */
    FT_ROPE_LLAMA3 = 3,
    FT_ROPE_YARN = 4
} ft_rope_type;

/* Parsing flags. */
#define FT_CONFIG_STRICT 1  /* an unknown key is an error, not a warning     */

/* Everything the engine reads from config.json (+ generation_config.json).
 * Fields not used by an architecture are 0. */
typedef struct ft_model_config {
    ft_arch_id arch;
    char model_type[32];        /* as in config.json                       */
    int hidden;                 /* hidden_size                             */
    int n_layers;               /* num_hidden_layers                       */
    int n_heads;                /* num_attention_heads                     */
    int n_kv_heads;             /* num_key_value_heads (OPT: = n_heads)    */
    int head_dim;               /* head_dim or hidden / n_heads            */
    int ffn;                    /* ffn_dim / intermediate_size             */
    int vocab;                  /* vocab_size                              */
    int max_pos;                /* max_position_embeddings                 */
    float norm_eps;             /* rms_norm_eps (Llama), 1e-5 (OPT)        */
    int tie_word_embeddings;    /* lm_head shares embed_tokens             */
    /* OPT */
    int word_embed_proj_dim;    /* == hidden unless project_in/out exist   */
    int do_layer_norm_before;   /* 1: pre-LN (most OPTs), 0: post-LN (350m) */
    int enable_bias;            /* linear layers have biases               */
    int ln_affine;              /* layer_norm_elementwise_affine           */
    int final_norm;             /* a final layer norm exists               */
    /* Llama: RoPE, from rope_parameters (transformers 5) or the top-level
     * rope_theta + rope_scaling (4.x); contradictory layouts are refused */
    int attention_bias, mlp_bias;
    float rope_theta;
    int rope_type;              /* ft_rope_type                            */
    float rope_factor;          /* linear, dynamic, llama3, yarn           */
    float rope_low_freq_factor, rope_high_freq_factor;   /* llama3        */
    int rope_orig_max_pos;      /* llama3, yarn: original_max_position_embeddings */
    float rope_beta_fast, rope_beta_slow;                /* yarn          */
    int rope_truncate;          /* yarn: floor/ceil the correction range   */
    float rope_attention_factor;   /* yarn: cos/sin are scaled by it; else 1 */
    /* Sliding-window attention (Mistral sliding_window; Qwen2
     * use_sliding_window + max_window_layers or layer_types): a layer with
     * layer_sliding[l] set attends to the last sliding_window positions
     * (itself included). 0 = no window anywhere. */
    int sliding_window;
    unsigned char layer_sliding[FT_MAX_LAYERS];
    /* Newer families (0 = off). qk_norm: 1 RMSNorm of each head of q and
     * k over head_dim (qwen3, gemma3), 2 over the whole q / k projection
     * (olmoe); before RoPE. norm_plus_one: RMSNorm weights act as (1 + w)
     * (gemma). sandwich_norm: a norm on the attention output and on the
     * FFN output before each residual add (gemma2/3: post_attention_layernorm,
     * post_feedforward_layernorm; the FFN's input norm is then
     * pre_feedforward_layernorm). embed_scale: embeddings multiplied by it
     * (gemma: sqrt(hidden_size) rounded to f32). attn_scale: the score
     * scale (0: 1/sqrt(head_dim); gemma: query_pre_attn_scalar^-1/2).
     * attn_softcap / final_softcap: cap * tanh(x / cap) on attention scores
     * / final logits (gemma2). rope_local_theta: the RoPE base of sliding
     * layers, unscaled (gemma3's rope_local_base_freq; 0: every layer uses
     * rope_theta and the scaling). */
    int act;                    /* ft_act                                  */
    int qk_norm, norm_plus_one, sandwich_norm;
    float embed_scale, attn_scale, attn_softcap, final_softcap;
    float rope_local_theta;
    /* Mixture of experts (mixtral, qwen3_moe, olmoe): n_experts experts of
     * moe_ffn each on the layers with layer_moe[l] set (the others are
     * dense with ffn); the router's softmax over all experts picks the
     * n_experts_used largest, whose weights are renormalised to sum 1 when
     * moe_norm_topk is set. 0 experts: a dense model. shared_expert
     * (qwen2_moe): each sparse layer also has a shared expert, a SwiGLU MLP
     * of width ffn in the dense MLP's slots (w_gate, w_up, w_down), whose
     * output, times sigmoid(w_shared_gate . x), is added to the routed
     * experts' sum. no_qkv_bias: qwen2 / qwen2_moe without q/k/v biases
     * (qwen2_moe's qkv_bias = false). */
    int n_experts, n_experts_used, moe_ffn, moe_norm_topk;
    int shared_expert, no_qkv_bias;
    unsigned char layer_moe[FT_MAX_LAYERS];
    /* special tokens (-1 = none) */
    int32_t bos_id, pad_id;
    int32_t eos_ids[FT_MAX_EOS];
    int n_eos;
    /* generation_config.json defaults (0 = not given) */
    int gen_do_sample;
    float gen_temperature, gen_top_p, gen_repetition_penalty;
    int gen_top_k, gen_max_new_tokens;
} ft_model_config;

/* Parse a config.json held in memory. `what` names the file in error
 * messages. FT_ERR_CORRUPT: not JSON, a field of the wrong type or an
 * absurd value (0 layers, heads not dividing hidden, sizes beyond the
 * engine's limits), contradictory layouts (rope_theta / rope_scaling at the
 * top level and in rope_parameters with different values);
 * FT_ERR_UNSUPPORTED: an unknown model_type or an option that changes the
 * math and is not implemented (activation other than relu for OPT, a
 * rope_type other than default/linear/dynamic/llama3/yarn,
 * partial_rotary_factor != 1, quantization_config, ...). The detail names
 * the file and the field.
 *
 * Every key is accounted for: implemented, on an explicit list of keys
 * that do not change the forward pass (bookkeeping, training-only dropout,
 * legacy generation defaults), or unknown. An unknown key is logged as a
 * warning naming it, or with FT_CONFIG_STRICT (flags) refused with
 * FT_ERR_UNSUPPORTED. The environment variable FLEXTIER_STRICT=1 makes
 * every parse strict (the test suite sets it). */
FT_API ft_status ft_model_config_parse(const char *json, size_t len, const char *what,
                                       ft_model_config *out);
FT_API ft_status ft_model_config_parse_ex(const char *json, size_t len, const char *what,
                                          unsigned flags, ft_model_config *out);
/* Apply a generation_config.json held in memory to *cfg (token ids and
 * sampling defaults); keys checked as above. */
FT_API ft_status ft_model_config_parse_generation(const char *json, size_t len,
                                                  const char *what, ft_model_config *cfg);
FT_API ft_status ft_model_config_parse_generation_ex(const char *json, size_t len, const char *what,
                                                     unsigned flags, ft_model_config *cfg);
/* Read DIR/config.json and, when present, DIR/generation_config.json. */
FT_API ft_status ft_model_config_load(const char *dir, ft_model_config *out);
FT_API ft_status ft_model_config_load_ex(const char *dir, unsigned flags, ft_model_config *out);
/* Attention window of layer l: sliding_window, or 0 (full attention). */
FT_API int ft_model_config_layer_window(const ft_model_config *cfg, int layer);

/* -------------------------------------------------- weights as stored */

/* The formats the engine computes on directly (no f32 copy). */
typedef enum ft_wfmt {
    FT_WF_F32 = 0,   /* exact reference path                              */
    FT_WF_BF16 = 1,
    FT_WF_F16 = 2,
    FT_WF_Q8 = 3,    /* FlexGen group quantization, 8 bits (codec q8)     */
    FT_WF_Q4 = 4     /* 4 bits, two per byte (codec q4)                   */
} ft_wfmt;

FT_API const char *ft_wfmt_name(ft_wfmt f);   /* "f32", "bf16", ...; "?" if invalid */

/* A weight matrix of `rows` x `cols` (Hugging Face (out, in) layout) as it
 * is stored. F32/BF16/F16: `data` holds rows x cols elements, row-major,
 * row stride cols. Q8/Q4: the matrix is group-quantized along each row in
 * groups of `group` consecutive values (cols % group == 0), in the frame
 * chunk layout of the q8/q4 codecs (docs/codec-quant.md, group_dim = last):
 * chunk c holds rows [c * rows_per_chunk, min(rows, (c+1) * rows_per_chunk))
 * and its payload `chunk[c]` is, for its n_rows x (cols / group) groups in
 * row-major order, the f16 (min, step) pairs of every group (4 bytes each),
 * then the values (q8: one byte each; q4: two per byte, the even element
 * in the low nibble). A value q decodes to q * step + min. So a verified
 * q8/q4 frame whose chunks hold whole rows is computed on in place. */
typedef struct ft_wmat {
    ft_wfmt fmt;
    int rows, cols;
    const void *data;                 /* F32 / BF16 / F16                  */
    int group;                        /* Q8 / Q4                           */
    int rows_per_chunk;               /* Q8 / Q4: >= 1                      */
    const uint8_t *const *chunk;      /* Q8 / Q4: ceil(rows / rows_per_chunk) */
} ft_wmat;

/* ----------------------------------------------------------------- model */

/* The weights of one transformer layer. Matrices are ft_wmat views in
 * their stored format (Hugging Face (out, in) layout); norm weights and
 * biases are f32 vectors. A matrix with data == NULL and chunk == NULL, or
 * a NULL vector, is absent (the architecture/config has no such tensor).
 * Norm 1 is the attention norm (OPT self_attn_layer_norm, Llama
 * input_layernorm); norm 2 the FFN norm (OPT final_layer_norm, Llama
 * post_attention_layernorm). FFN: OPT fc1 = up, fc2 = down; Llama
 * gate/up/down. Each layer's tensors normally live in one buffer the model
 * owns; a layer hook (the offloading scheduler) may point a layer at its
 * own buffers for one forward call. */
typedef struct ft_layer_weights {
    const float *norm1_w, *norm1_b;
    ft_wmat wq;     const float *bq;
    ft_wmat wk;     const float *bk;
    ft_wmat wv;     const float *bv;
    ft_wmat wo;     const float *bo;
    const float *norm2_w, *norm2_b;
    ft_wmat w_gate; const float *b_gate;
    ft_wmat w_up;   const float *b_up;
    ft_wmat w_down; const float *b_down;
    /* newer families (absent elsewhere) */
    const float *q_norm, *k_norm;          /* qk_norm                      */
    const float *post_attn_norm, *post_ffn_norm;   /* sandwich_norm        */
    ft_wmat w_router;                      /* MoE: [n_experts][hidden]     */
    ft_wmat w_shared_gate;                 /* MoE with a shared expert: [1][hidden] */
    /* MoE: the experts' matrices, 3 per expert (gate, up, down; slots
     * FT_LAYER_SLOTS + 3 * e + k), n_experts of them on a sparse layer,
     * else 0 and NULL. The array belongs to whoever filled the struct (the
     * model for its own layers): a hook that replaces experts points this
     * at its own array, never writes into the model's. */
    int n_experts;
    ft_wmat *experts;
    /* MoE: experts the supplier of these weights has not made present
     * (an offloading scheduler streaming them on demand). Called once the
     * layer's router has run, with the union of the experts the call's
     * rows selected (increasing, n of them) and the layer's MoE input x
     * (rows x hidden, to predict the next layer's experts): it must make
     * exactly those present in w->experts. NULL: every expert is here. */
    ft_status (*fetch_experts)(void *user, int layer, const int *experts, int n, const float *x, int rows,
                               struct ft_layer_weights *w);
    void *fetch_user;
} ft_layer_weights;

/* 1 if the matrix is present. */
static inline int ft_wmat_present(const ft_wmat *w) { return w && (w->data || w->chunk); }

/* Bytes a matrix of rows x cols occupies in format f with group `group`
 * (q8/q4: parameters + values, without any frame header). */
FT_API uint64_t ft_wmat_bytes(ft_wfmt f, int rows, int cols, int group);

/* The q8/q4 group size the engine uses for a matrix with `cols` columns:
 * 64 when it divides cols, else 32 when that does, else 0 (the matrix
 * cannot be computed on in a quantized format; it stays bf16). */
FT_API int ft_wmat_group_for(int cols);

/* A view of a verified-or-trusted q8/q4 frame (flextier/codec.h) of a 2-D
 * float tensor quantized along its last dimension, whose chunks hold whole
 * rows: fills *w (pointing into `frame`) and chunk_ptrs (room for
 * max_chunks). FT_ERR_UNSUPPORTED when the frame is not such a frame
 * (other codec, group_dim, a short last group, rows split across chunks);
 * FT_ERR_CORRUPT when it does not parse. The chunk hashes are NOT checked
 * here (ft_frame_verify does that). */
FT_API ft_status ft_wmat_from_frame(const void *frame, size_t size, ft_wmat *w,
                                    const uint8_t **chunk_ptrs, uint32_t max_chunks);

/* Codec parameters that encode a rows x cols matrix of `dtype` (f32, bf16
 * or f16) for ft_wmat_from_frame: q8 (bits 8) or q4 (4), group
 * ft_wmat_group_for(cols), chunks of whole rows (about 256 KiB of raw
 * bytes each). FT_ERR_UNSUPPORTED when ft_wmat_group_for(cols) is 0. */
FT_API ft_status ft_wmat_codec_params(int bits, ft_dtype dtype, int rows, int cols,
                                      ft_codec_params *out);

/* Row r of a matrix converted to f32 (dequantized for q8/q4): cols floats
 * into dst. For embedding lookups and tests. */
FT_API void ft_wmat_row_f32(const ft_wmat *w, int r, float *dst);

typedef struct ft_model ft_model;

/* ft_load_params.weights: keep every matrix in the checkpoint's dtype. */
#define FT_WEIGHTS_AS_STORED (-1)

#define FT_LOAD_LAYOUT_ONLY 2

typedef struct ft_load_params {
    /* Called now and then during a long load with done/total bytes. */
    void (*progress)(void *user, uint64_t done, uint64_t total);
    void *user;
    /* 1: check the layer tensors (presence, shape, dtype) but do not load
     * them: no memory is allocated for them and every layer's weights are
     * absent until a layer hook (the offloading scheduler) supplies them.
     * FT_LOAD_LAYOUT_ONLY (2): the globals (embeddings, LM head, final
     * norm) are not loaded either: the model only says what it would hold
     * (ft_model_weight_bytes, ft_model_global_bytes, ft_model_layer_bytes,
     * ft_model_tensor_layout), for budgets and planning; it cannot run. */
    int external_layers;
    /* FT_CONFIG_STRICT: unknown config keys are errors (ft_model_config_parse) */
    unsigned config_flags;
    /* The format the matrices are kept and computed in: an ft_wfmt, or
     * FT_WEIGHTS_AS_STORED (the checkpoint's f32/bf16/f16, what
     * ft_load_params_default sets). A zeroed struct means f32 (exact).
     * q8/q4 quantize at load (group ft_wmat_group_for(cols), along rows);
     * embeddings and an untied LM head then stay bf16 (as llama.cpp keeps
     * its output matrix at higher precision), and so does a matrix whose
     * width no group size divides. Norms and biases are always f32. */
    int weights;
    /* FT_STREAM_EMBED / FT_STREAM_LM_HEAD: leave the token embeddings /
     * the LM head in the checkpoint file, not in memory. The forward pass
     * reads the rows of its tokens from the file (pread), and the LM head
     * in chunks of rows (about 4 MiB each, the next one read ahead while
     * this one is computed), in the format a resident load would hold
     * them (so the logits are bit-identical). A tied head is the
     * embedding matrix: either flag streams both. stream_drop_cache: drop
     * the pages read from the page cache (a memory cgroup charges them). */
    unsigned stream_globals;
    int stream_drop_cache;
    /* Rows per chunk of a streamed LM head (0: about 4 MiB; else rounded
     * up to a multiple of 24, the product kernels' split; tests use small
     * ones to cross chunk boundaries). */
    int stream_chunk_rows;
    /* Read the streamed rows past the page cache (O_DIRECT: nothing is
     * charged to a memory cgroup, no kernel copy): 1 on, 0 off, -1 (what
     * ft_load_params_default sets; FLEXTIER_DIRECT_IO=0|1 in the
     * environment sets it instead) on with stream_drop_cache. A file
     * system that refuses O_DIRECT is read through the page cache (the
     * pages dropped with stream_drop_cache), said at debug log level. */
    int stream_direct_io;
} ft_load_params;

#define FT_STREAM_EMBED 1u
#define FT_STREAM_LM_HEAD 2u

FT_API void ft_load_params_default(ft_load_params *p);

/* Load a Hugging Face model directory: config (as ft_model_config_load)
 * and the safetensors checkpoint (single or sharded). Every tensor the
 * architecture needs must be present with the exact shape; f32/f16/bf16
 * are accepted and converted to params->weights. params may be NULL (f32).
 * Errors name the file and tensor (FT_ERR_NOT_FOUND for a missing tensor,
 * FT_ERR_CORRUPT for a wrong shape, FT_ERR_UNSUPPORTED for a dtype). */
FT_API ft_status ft_model_load(const char *dir, const ft_load_params *params,
                               ft_model **out);
/* A model with every weight zero, in f32 (tests, gen-model): fill the
 * weights through ft_model_tensor(). */
FT_API ft_status ft_model_create(const ft_model_config *cfg, ft_model **out);
/* As ft_model_create; external_layers as in ft_load_params. */
FT_API ft_status ft_model_create_ex(const ft_model_config *cfg, int external_layers, ft_model **out);
/* As ft_model_create_ex with the plain matrices in format `want` (f32,
 * bf16, f16: zero, usable at once; q8/q4 entries are usable only once
 * stored, as in ft_model_convert). */
FT_API ft_status ft_model_create_fmt(const ft_model_config *cfg, int external_layers, ft_wfmt want, ft_model **out);
/* A copy of a loaded (not external-layer) model with its matrices in
 * format `weights` (an ft_wfmt or FT_WEIGHTS_AS_STORED: the source's),
 * by the rules of ft_load_params.weights. */
FT_API ft_status ft_model_convert(const ft_model *src, int weights, ft_model **out);
FT_API void ft_model_free(ft_model *m);                 /* NULL ok */

FT_API const ft_model_config *ft_model_get_config(const ft_model *m);
/* Total bytes of weights held, in their stored formats (what the layers
 * of an external-layer model would take is included). */
FT_API uint64_t ft_model_weight_bytes(const ft_model *m);
/* Bytes of the token embeddings and of an untied LM head (0 when tied) in
 * the format they are computed in, streamed or not. */
FT_API void ft_model_global_split(const ft_model *m, uint64_t *embed, uint64_t *head);
/* FT_STREAM_* bits the model was loaded with, and the bytes read so far
 * from the files of those streamed matrices. */
FT_API unsigned ft_model_streamed(const ft_model *m);
FT_API uint64_t ft_model_stream_bytes_read(const ft_model *m);
/* The format of the layer matrices (the format of the largest share when
 * some matrices fell back to bf16). */
FT_API ft_wfmt ft_model_weights_format(const ft_model *m);

/* Enumerate the model's tensors under their Hugging Face names (in
 * checkpoint order: globals then layers). *view is a writable view of the
 * model's own storage in its stored dtype (f32, bf16 or f16; a tied
 * lm_head is not listed separately); FT_ERR_UNSUPPORTED for a q8/q4
 * matrix (use ft_model_layer / ft_wmat_row_f32). FT_ERR_NOT_FOUND when
 * i >= count. */
FT_API size_t ft_model_tensor_count(const ft_model *m);
FT_API ft_status ft_model_tensor(ft_model *m, size_t i, const char **name,
                                 ft_tensor *view);

/* ------------------------------------------------------ layer layout */

/* What a weight scheduler (flextier/offload.h) or another backend needs
 * to supply a model's layers per call without touching its internals.
 * Slots: the fields of ft_layer_weights in order (0 .. FT_LAYER_SLOTS-1);
 * a slot holds a matrix (ft_wmat) or an f32 vector (norms, biases). */
#define FT_LAYER_SLOTS 24
/* The router's and the shared-expert gate's slots (w_router, w_shared_gate). */
#define FT_LAYER_SLOT_ROUTER 22
#define FT_LAYER_SLOT_SHARED_GATE 23
/* Expert k (0 gate, 1 up, 2 down) of expert e: a matrix slot past the
 * fixed ones (ft_layer_weights.experts). */
#define FT_EXPERT_SLOT(e, k) (FT_LAYER_SLOTS + 3 * (e) + (k))
FT_API int ft_layer_slot_is_matrix(int slot);
FT_API ft_wmat *ft_layer_weights_mat(ft_layer_weights *w, int slot);        /* NULL: a vector slot */
FT_API const float **ft_layer_weights_vec(ft_layer_weights *w, int slot);   /* NULL: a matrix slot */

typedef struct ft_tensor_layout {
    const char *name;       /* Hugging Face name                           */
    int layer;              /* -1: model-wide                              */
    int slot;               /* in its layer (or the model-wide table)      */
    int ndim;
    int64_t shape[2];
    ft_wfmt fmt;            /* as the model keeps it (vectors: f32)        */
    int group;              /* q8/q4                                       */
    uint32_t n_chunks;      /* q8/q4: the chunks of its frame              */
} ft_tensor_layout;

/* Tensor i (0 .. ft_model_tensor_count - 1) as the model keeps it. */
FT_API ft_status ft_model_tensor_layout(const ft_model *m, size_t i, ft_tensor_layout *out);
/* The format the model keeps tensor i in when its matrices are asked to
 * be `want` (ft_load_params.weights' rules: vectors f32, embeddings and
 * head bf16 for q8/q4, bf16 when no group divides a row); *group: the
 * q8/q4 group. */
FT_API ft_wfmt ft_model_format_for(const ft_model *m, size_t i, ft_wfmt want, int *group);
/* The format the model's matrices were asked to be kept in. */
FT_API ft_wfmt ft_model_format_requested(const ft_model *m);
/* Tensor i's source in an open checkpoint (its name, or the architecture's
 * alternative prefix: base-model checkpoints). */
struct ft_checkpoint;
FT_API ft_status ft_model_checkpoint_tensor(const ft_model *m, const struct ft_checkpoint *ck, size_t i, ft_tensor *t);

/* Layer i's weights (NULL if out of range), read-only: the model is
 * immutable once loaded. A scheduler gives a forward call other weights
 * through the layer hook (ft_ctx_set_layer_hook), never by writing here. */
FT_API const ft_layer_weights *ft_model_layer(const ft_model *m, int i);
/* Bytes of one layer's weights in their stored formats (all layers have
 * the same size). */
FT_API uint64_t ft_model_layer_bytes(const ft_model *m);
/* Bytes of the globals (embeddings, LM head, final norm, ...) held in
 * memory (streamed ones, ft_load_params.stream_globals, excluded). */
FT_API uint64_t ft_model_global_bytes(const ft_model *m);
/* A pipeline stage (flextier/pipe.h) holds one end of the model: give the
 * pages of the model-wide tensors it never reads back to the kernel. The
 * input end (input_end: token and position embeddings, project_in) and
 * the output end (output_end: final norm, project_out, LM head; a tied
 * head keeps the embeddings) are kept. The released tensors read as zeros
 * from then on: the model may only be used for such a stage's layers.
 * Returns the bytes given back. */
FT_API uint64_t ft_model_release_globals(ft_model *m, int input_end, int output_end);

/* --------------------------------------------------------------- context */

typedef struct ft_ctx ft_ctx;

typedef struct ft_ctx_params {
    int max_batch;        /* sequence slots (KV caches)                    */
    int max_seq;          /* tokens per sequence, prompt + generated       */
    int max_rows;         /* new tokens per forward call over all
                             sequences (0: max_batch * max_seq)            */
    int all_logits;       /* 1: ft_ctx_forward may return logits of every
                             row (needs max_rows x vocab floats)           */
    unsigned threads;     /* 0: ft_default_threads()                       */
    int external_kv;      /* 1: the context holds no KV cache; KV hooks
                             (ft_ctx_set_kv_hooks) lend each layer's cache
                             for the sequences of a step (offloading)     */
    ft_dtype kv_dtype;    /* element type of the context's KV cache:
                             FT_F32 (what a zeroed struct gives: exact),
                             FT_BF16 or FT_F16 (half the memory; K and V
                             rows are rounded once when appended, the
                             attention math stays f32). external_kv
                             contexts exchange f32 rows with their hooks
                             and must leave this FT_F32.                  */
} ft_ctx_params;

/* Called before layer `layer` is computed. It may replace *w (e.g. with
 * weights it just streamed in). Returning an error aborts the forward. */
typedef ft_status (*ft_layer_hook)(void *user, int layer, ft_layer_weights *w);

/* The sequences of one forward call, as the KV hooks see them: sequence
 * j has past[j] tokens cached in slot slots[j] and appends ntok[j]. */
typedef struct ft_kv_step {
    size_t n;
    const int *slots;
    const int *past;
    const size_t *ntok;
} ft_kv_step;

/* A context created with external_kv calls these around every layer.
 * load: before layer `layer` is computed (after the layer hook), set k[j]
 * and v[j] for every sequence j of the step to buffers of max_seq rows of
 * kv_dim floats whose rows [0, past[j]) hold that layer's cache; the layer
 * writes its new rows [past[j], past[j] + ntok[j]) into them and reads
 * rows up to there. store: after the layer, with the same buffers: the
 * new rows are final (write them back). The buffers must stay valid and
 * unchanged from load to store. An error aborts the forward (sequence
 * lengths unchanged; rows at or past `past` may have been written). */
typedef struct ft_kv_hooks {
    ft_status (*load)(void *user, int layer, const ft_kv_step *s, float **k, float **v);
    ft_status (*store)(void *user, int layer, const ft_kv_step *s, float *const *k, float *const *v);
    void *user;
} ft_kv_hooks;

/* A context: KV caches for max_batch sequences of max_seq tokens and all
 * scratch buffers, allocated here once; the forward pass never allocates.
 * A sliding-window layer whose window W is shorter than max_seq keeps a
 * ring of W rows per sequence instead of max_seq (position p in row
 * p % W); with external_kv every layer has full rows and attention is
 * masked to the window.
 * FT_ERR_INVALID_ARG if max_seq exceeds the model's position limit (OPT's
 * learned positions). */
FT_API ft_status ft_ctx_create(const ft_model *m, const ft_ctx_params *p, ft_ctx **out);
FT_API void ft_ctx_free(ft_ctx *c);                     /* NULL ok */
FT_API void ft_ctx_set_layer_hook(ft_ctx *c, ft_layer_hook hook, void *user);
/* For a context created with external_kv (copied; NULL clears). A forward
 * without hooks fails with FT_ERR_INVALID_ARG. */
FT_API void ft_ctx_set_kv_hooks(ft_ctx *c, const ft_kv_hooks *h);
/* LoRA adapters applied in the forward pass, unmerged (docs/training.md,
 * "Adapters at inference"): a projection's output becomes
 * y = W x + b + sum_k scale_k B_k (A_k x), the adapters added in the order
 * they were given, each after the one before (PEFT's LoraLayer.forward:
 * result = result + lora_B(lora_A(x)) * scaling per active adapter). W
 * stays in its stored format (f32, bf16, q8, q4, streamed by a scheduler);
 * A and B are f32. A set is built once for a model and may be shared by
 * several contexts (read-only while they run). */
typedef struct ft_lora ft_lora;
FT_API ft_status ft_lora_create(const ft_model *m, ft_lora **out);
FT_API void ft_lora_free(ft_lora *l);                   /* NULL ok */
/* Add one adapted projection. module: its Hugging Face module path, as
 * PEFT's keys name it without "base_model.model." and ".lora_A.weight"
 * ("model.layers.3.self_attn.q_proj", OPT "model.decoder.layers.0.fc1"):
 * module + ".weight" must be one of the model's q/k/v/o or MLP matrices,
 * or one expert's (transformers 4's "model.layers.3.block_sparse_moe.
 * experts.5.w1"). A is [rank][in], B [out][rank] (row-major f32, copied)
 * with in/out the projection's. FT_ERR_UNSUPPORTED for a module that is
 * not such a matrix of this model (fused and router projections included),
 * FT_ERR_INVALID_ARG for a rank < 1, a non-finite scale or value. */
FT_API ft_status ft_lora_add(ft_lora *l, const char *module, int rank, float scale, const float *A, const float *B);
/* LoRA on the fused expert parameters of layer L's mixture of experts
 * (module "model.layers.L.mlp.experts"; PEFT's target_parameters on
 * transformers 5's gate_up_proj [E, 2F, H] or down_proj [E, H, F], told
 * apart by in x out): A [E rank][in], B [out][E rank] in PEFT's layout
 * (expert e's A rows e rank .. e rank + rank - 1, its B column j at
 * j E + e); W_e + scale B_e A_e per expert, applied as the experts' own
 * entries (gate_up: gate rows [0, F), up rows [F, 2F)). */
FT_API ft_status ft_lora_add_experts(ft_lora *l, const char *module, int rank, int n_experts, int in, int out,
                                     float scale, const float *A, const float *B);
/* The projection's shape: *out x *in, or FT_ERR_UNSUPPORTED as ft_lora_add. */
FT_API ft_status ft_lora_module_shape(const ft_lora *l, const char *module, int *out, int *in);
/* Adapted projections added; the bytes of A and B held. */
FT_API size_t ft_lora_count(const ft_lora *l);
FT_API uint64_t ft_lora_bytes(const ft_lora *l);
/* Apply l in every later forward call of c (NULL: none). l must be of c's
 * model and outlive its use by c. Sizes the context's LoRA scratch
 * (max_rows x the largest rank / projection). */
FT_API ft_status ft_ctx_set_lora(ft_ctx *c, const ft_lora *l);
/* Bytes held by the KV cache (0 with external_kv) and by scratch buffers. */
FT_API uint64_t ft_ctx_kv_bytes(const ft_ctx *c);
FT_API uint64_t ft_ctx_scratch_bytes(const ft_ctx *c);
/* What ft_ctx_create(m, p) would hold (KV cache, scratch), without
 * creating it: for memory budgets. m may be a layout-only model. */
FT_API ft_status ft_ctx_estimate(const ft_model *m, const ft_ctx_params *p, uint64_t *kv_bytes,
                                 uint64_t *scratch_bytes);

/* Forget a sequence's tokens (its slot becomes empty). */
FT_API void ft_ctx_reset(ft_ctx *c, int slot);
/* Tokens already in a slot's cache. */
FT_API int ft_ctx_seq_len(const ft_ctx *c, int slot);
/* Keep the first len tokens of a slot's cache (0 <= len <= its length):
 * the next forward appends at position len. FT_ERR_UNSUPPORTED when a
 * sliding-window layer's ring has wrapped (its early rows are gone). */
FT_API ft_status ft_ctx_truncate(ft_ctx *c, int slot, int len);
/* Copy the first len tokens of slot src's cache into slot dst (whose
 * length becomes len): a shared prefix computed once. FT_ERR_UNSUPPORTED
 * for an external_kv context and for a wrapped sliding-window ring. */
FT_API ft_status ft_ctx_copy_prefix(ft_ctx *c, int src, int dst, int len);
/* A slot's KV rows as bytes, for keeping a prefix elsewhere (the server's
 * prefix cache in a store): the buffer holds, for each layer, K then V,
 * each rows_in_buf rows of kv_dim elements of the context's KV dtype
 * (ft_ctx_kv_dtype); cap bytes >= 2 * n_layers * rows_in_buf * kv_dim *
 * element size. import 0: rows [0, len) of the slot into the buffer
 * (len <= its length); import 1: the buffer's first len rows into the slot,
 * whose length becomes len. FT_ERR_UNSUPPORTED for an external_kv context
 * or a sliding-window ring that cannot hold the positions. */
FT_API ft_status ft_ctx_kv_rows(ft_ctx *c, int slot, int len, void *buf, size_t cap, int import, int rows_in_buf);
FT_API ft_dtype ft_ctx_kv_dtype(const ft_ctx *c);
/* The KV cache of (layer, slot): `len` rows of kv_dim floats each for K
 * and V (row stride kv_dim), kv_dim = n_kv_heads * head_dim.
 * FT_ERR_UNSUPPORTED for an external_kv context and for a layer that keeps
 * a ring of its sliding window. */
FT_API ft_status ft_ctx_kv(ft_ctx *c, int layer, int slot, float **k, float **v,
                           int *len, int *kv_dim);

/* One batched forward step. For each j < n: append ntok[j] >= 1 tokens
 * tokens[j][..] to sequence slot slots[j] (slots distinct). logits: NULL,
 * or room for the logits (vocab floats per row) of the LAST token of each
 * sequence (n rows) or, with all_rows (needs ctx all_logits), of every new
 * token in order (sum ntok rows). Errors: FT_ERR_INVALID_ARG (bad slot,
 * token id >= vocab, total rows > max_rows), FT_ERR_NO_SPACE (a sequence
 * would exceed max_seq), or the hook's status; on error the caches of the
 * sequences involved are unchanged, except after a failure past a layer
 * that keeps a sliding-window ring: its overwritten rows are gone, so the
 * sequences of the call are reset (ft_ctx_seq_len 0). */
FT_API ft_status ft_ctx_forward(ft_ctx *c, size_t n, const int *slots,
                                const int32_t *const *tokens, const size_t *ntok,
                                float *logits, int all_rows);

/* A pipeline stage's share of one forward step (flextier/pipe.h): layers
 * [l0, l1) of the step that ft_ctx_forward(c, n, slots, tokens, ntok, ...)
 * describes; ft_ctx_forward is ft_ctx_forward_layers(..., 0, n_layers, ...).
 * Input: with l0 == 0 the tokens (embeddings computed here; hidden_in
 * unused), else hidden_in: the hidden states the previous stage returned,
 * rows x hidden floats (rows = sum ntok, sequences in order; tokens may
 * be NULL). Output: with hidden_out the hidden states after layer l1 - 1
 * (rows x hidden floats, before any final norm; logits unused), else (l1
 * must then be n_layers) the logits as ft_ctx_forward. Hooks see absolute
 * layer indices. The
 * context's sequence lengths advance as in ft_ctx_forward, so every stage
 * of a pipeline keeps its own (equal) lengths. An empty range (l0 == l1)
 * is allowed: the embeddings alone (l0 == 0), the head alone (l0 ==
 * n_layers), or the hidden states passed through. The KV cache of a layer the
 * stage never computes is never written (its pages stay untouched).
 * Errors as ft_ctx_forward, and FT_ERR_INVALID_ARG for a bad range or a
 * missing input or output buffer. */
FT_API ft_status ft_ctx_forward_layers(ft_ctx *c, size_t n, const int *slots, const int32_t *const *tokens,
                                const size_t *ntok, const float *hidden_in, int l0, int l1,
                                float *hidden_out, float *logits, int all_rows);

/* -------------------------------------------------------------- sampling */

typedef struct ft_sampling {
    float temperature;          /* <= 0: greedy (argmax)                    */
    int top_k;                  /* 0: off                                   */
    float top_p;                /* 0 or >= 1: off                           */
    float repetition_penalty;   /* 1 or 0: off (HF: divide positive logits,
                                   multiply negative ones, of tokens seen)  */
    uint64_t seed;
} ft_sampling;

typedef struct ft_sampler ft_sampler;
/* Workspace for one vocabulary (allocated once). */
FT_API ft_status ft_sampler_create(int vocab, ft_sampler **out);
FT_API void ft_sampler_free(ft_sampler *s);
/* Pick a token from logits (modified in place). history: tokens seen so
 * far (prompt + generated) for the repetition penalty. rng: per-sequence
 * state (seed it with ft_sampling.seed). Order as in transformers:
 * repetition penalty, temperature, top-k, top-p, then a draw. */
FT_API int32_t ft_sampler_sample(ft_sampler *s, const ft_sampling *p, float *logits,
                                 const int32_t *history, size_t n_history,
                                 uint64_t *rng);

/* ------------------------------------------------------------ generation */

/* Per new token; return nonzero to stop that sequence (e.g. a stop
 * string). seq indexes the prompts passed to ft_generate. */
typedef int (*ft_token_cb)(void *user, size_t seq, int32_t token);

typedef struct ft_gen_params {
    size_t max_new_tokens;
    ft_sampling sampling;
    int ignore_eos;             /* 1: do not stop at the config's EOS ids   */
    ft_token_cb on_token;       /* may be NULL                              */
    void *user;
} ft_gen_params;

typedef struct ft_gen_stats {
    size_t prefill_tokens, decode_tokens;
    double prefill_s, decode_s;           /* wall clock                     */
    double prefill_cpu_s, decode_cpu_s;   /* process CPU time (all threads):
                                             on a shared machine, tokens per
                                             CPU-second is the steadier figure */
    double decode_thread_cpu_s;           /* the calling thread's CPU time in
                                             decode: over the time it was not
                                             waiting for the offloaded tiers,
                                             the share of a core it got     */
    double decode_thread_runq_s;          /* the time it waited for a core
                                             while runnable (Linux
                                             schedstat), -1 where unknown:
                                             cpu / (cpu + runq) is its share
                                             of a core, reads it blocked in
                                             left out                       */
} ft_gen_stats;

/* Generate for n prompts as one batch (n <= max_batch; slots 0..n-1 are
 * reset first). out[j] receives up to max_new_tokens ids, n_out[j] how
 * many (an EOS token that stopped a sequence is included). Prefill runs
 * once over all prompts, then decode steps over the sequences still
 * active. */
FT_API ft_status ft_generate(ft_ctx *c, size_t n, const int32_t *const *prompts,
                             const size_t *prompt_len, const ft_gen_params *p,
                             int32_t *const *out, size_t *n_out, ft_gen_stats *stats);

/* A compute context as the generation loop sees it: the CPU context
 * (ft_ctx_forward_ops) and the CUDA context (ft_cuda_ctx_forward_ops,
 * flextier/cuda.h) provide one, so generation is written once. forward:
 * as ft_ctx_forward with the last row's logits of each sequence;
 * forward_greedy (optional, NULL: not offered): the argmax of those rows
 * instead, computed where the logits are; reset: empty a slot. */
typedef struct ft_forward_ops {
    void *ctx;
    const ft_model_config *cfg;
    int max_batch, max_seq;
    ft_status (*forward)(void *ctx, size_t n, const int *slots, const int32_t *const *tokens,
                         const size_t *ntok, float *logits);
    ft_status (*forward_greedy)(void *ctx, size_t n, const int *slots, const int32_t *const *tokens,
                                const size_t *ntok, int32_t *next);
    void (*reset)(void *ctx, int slot);
} ft_forward_ops;

FT_API void ft_ctx_forward_ops(ft_ctx *c, ft_forward_ops *out);

/* ft_generate over any context: the one generation loop (greedy without a
 * repetition penalty uses forward_greedy when the context offers it; the
 * same seed gives the same choices as on the CPU given the same logits). */
FT_API ft_status ft_generate_with(const ft_forward_ops *f, size_t n, const int32_t *const *prompts,
                                  const size_t *prompt_len, const ft_gen_params *p,
                                  int32_t *const *out, size_t *n_out, ft_gen_stats *stats);

#ifdef __cplusplus
}
#endif
#endif
