/*
 * flextier/cuda.h - the CUDA backend: device detection, the codec on the
 * GPU (q8/q4 dequantization of frames, byte-plane regrouping, KV-row
 * quantization) and a compute context with the semantics of ft_ctx
 * (flextier/engine.h) running on one GPU with cuBLAS.
 *
 * Every function exists in every build. The backend itself is a plugin,
 * libflextier-cuda.so, that the library opens (dlopen) the first time one
 * of these functions needs it, so a process that never asks for CUDA maps
 * no CUDA library (docs/cuda.md, "The plugin": where it is looked for;
 * FLEXTIER_CUDA_PLUGIN overrides). A build without CUDA (no nvcc at
 * configure time, or -DFT_CUDA=OFF) returns FT_ERR_UNSUPPORTED with the
 * detail "this build has no CUDA backend ..."; a plugin that cannot be
 * found or loaded says so; a machine without an NVIDIA GPU or driver
 * gives FT_ERR_UNSUPPORTED with "no NVIDIA GPU or driver found
 * (cudaGetDeviceCount: ...)", one whose GPU the runtime cannot use "no
 * usable CUDA device (...)". Other CUDA runtime and cuBLAS failures become
 * FT_ERR_NOMEM (out of device or pinned memory) or FT_ERR_INTERNAL with the
 * call, the CUDA error name and its string in ft_last_error().
 *
 * Design, tolerances and what has been verified on a GPU: docs/cuda.md.
 *
 * Thread-safety: a decoder and a context are used by one host thread at a
 * time. Functions taking device pointers expect memory from
 * ft_cuda_malloc (or cudaMalloc) on the current device.
 */
#ifndef FLEXTIER_CUDA_H
#define FLEXTIER_CUDA_H

#include "flextier/core.h"
#include "flextier/codec.h"
#include "flextier/engine.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- device */

/* 1 if this library was built with the CUDA backend (its plugin), else 0.
 * Loads nothing. */
FT_API int ft_cuda_built(void);

/* FT_OK if at least one CUDA device can be used (loads the plugin).
 * Otherwise FT_ERR_UNSUPPORTED, and detail (if not NULL, n bytes) receives
 * why: "this build has no CUDA backend (...)", "the CUDA backend
 * libflextier-cuda.so was not found (...)", "no NVIDIA GPU or driver found
 * (no /dev/nvidia<N> device; cudaGetDeviceCount: ...)" or "no usable CUDA
 * device (cudaGetDeviceCount: ...)". Also sets ft_last_error. Tests use it to skip; the
 * CLI to explain. */
FT_API ft_status ft_cuda_available(char *detail, size_t n);

typedef struct ft_cuda_device_info {
    int device;                 /* ordinal                                  */
    char name[256];
    int cc_major, cc_minor;     /* compute capability (9.0 for H100/H200)   */
    int sm_count;
    uint64_t total_mem;         /* bytes of device memory                   */
    int runtime_version;        /* cudaRuntimeGetVersion (13000 = 13.0)     */
    int driver_version;         /* cudaDriverGetVersion                     */
} ft_cuda_device_info;

FT_API ft_status ft_cuda_device_info_get(int device, ft_cuda_device_info *out);

/* ---------------------------------------------------------------- memory */

/* Device memory (cudaMalloc) and pinned host memory (cudaHostAlloc).
 * Free functions accept NULL. Copies are synchronous (cudaMemcpy). */
FT_API ft_status ft_cuda_malloc(size_t n, void **out);
FT_API void ft_cuda_free(void *p);
FT_API ft_status ft_cuda_host_alloc(size_t n, void **out);
FT_API void ft_cuda_host_free(void *p);
FT_API ft_status ft_cuda_copy_to_device(void *dst, const void *src, size_t n);
FT_API ft_status ft_cuda_copy_to_host(void *dst, const void *src, size_t n);

/* --------------------------------------------------------- codec on GPU */

/* Convert n elements between f32/f16/bf16 in device memory, bit for bit
 * as ft_convert (round to nearest even, NaN kept and made quiet, f16
 * overflow to Inf). Synchronous. */
FT_API ft_status ft_cuda_convert(void *dst, ft_dtype dst_dt, const void *src, ft_dtype src_dt, size_t n);

/* Frames into device memory. The work splits between host and GPU by
 * codec (docs/cuda.md):
 *   q8, q4     the frame's bytes are copied as they are (compressed bytes
 *              cross PCIe) and dequantized on the GPU, bit for bit as
 *              ft_decode (y = q*step + min in f32, then rounded to the
 *              output dtype), any group_dim and group size;
 *   byteplane  each plane's entropy stage (zstd/lz4/deflate) is decoded on
 *              the CPU, the planes are copied, and the GPU regroups them
 *              into values (and converts to the output dtype);
 *   raw        the payload is copied and converted on the GPU;
 *   lz4, zstd, deflate: decoded on the CPU (ft_decode_chunk, hashes
 *              checked), copied, converted on the GPU.
 * The header (and its hash) is validated on the host with ft_frame_parse.
 * Chunk hashes: checked on the host for q8/q4 and raw (they cover the
 * payload), for lz4/zstd/deflate and for stored byteplane chunks; NOT for
 * coded byteplane chunks (their hash covers the raw bytes, which only ever
 * exist on the GPU).
 * A decoder owns a CUDA stream, device staging and pinned staging that
 * grow to the largest frame seen, and a codec context for the CPU stages. */
typedef struct ft_cuda_decoder ft_cuda_decoder;

/* device: CUDA ordinal (made current on the calling thread). */
FT_API ft_status ft_cuda_decoder_create(int device, ft_cuda_decoder **out);
FT_API void ft_cuda_decoder_free(ft_cuda_decoder *d);

/* Decode the frame frame[0..size) (host memory; pinned memory copies
 * faster) into dst (device memory, cap bytes) as out_dtype (f32, bf16 or
 * f16; the frame's float dtype or any of these). Returns when dst holds
 * the tensor. info (may be NULL) receives the parsed header.
 * FT_ERR_CORRUPT for a frame that fails validation (nothing written to
 * dst then), FT_ERR_BUFFER_SMALL if cap is too small, FT_ERR_UNSUPPORTED
 * for a non-float frame or output dtype. */
FT_API ft_status ft_cuda_decode_frame(ft_cuda_decoder *d, const void *frame, size_t size,
                                      ft_dtype out_dtype, void *dst, size_t cap, ft_frame_info *info);

/* KV-cache rows on the GPU: `rows` rows of n f32 values each (src,
 * device, row stride n) are quantized group by group (groups of `group`
 * along the row, n % group == 0) into rows of ft_qrow_bytes(bits, n,
 * group) bytes each (dst, device, back to back), byte for byte what
 * ft_qrow_encode writes for each row (the same fp16 min rounded down and
 * step rounded up, ft_qparams, and the same rounding of every value).
 * FT_ERR_INVALID_ARG for bad sizes or a NaN/Inf value, FT_ERR_UNSUPPORTED
 * for a group whose range does not fit fp16 (dst is then unspecified).
 * Synchronous. bits: 8 or 4. */
FT_API ft_status ft_cuda_qrow_encode(int bits, const float *src, size_t rows, size_t n, uint32_t group,
                                     void *dst);
/* The inverse, bit for bit as ft_qrow_decode. */
FT_API ft_status ft_cuda_qrow_decode(int bits, const void *src, size_t rows, size_t n, uint32_t group,
                                     float *dst);

/* ------------------------------------------------------ compute context */

/* Layer tensors in ft_layer_weights field order (norm1_w, norm1_b, wq, bq,
 * wk, bk, wv, bv, wo, bo, norm2_w, norm2_b, w_gate, b_gate, w_up, b_up,
 * w_down, b_down, q_norm, k_norm, post_attn_norm, post_ffn_norm,
 * w_router, w_shared_gate): FT_LAYER_SLOTS. The last six are absent in every
 * model the CUDA backend computes (it refuses the families that have them). */
#define FT_CUDA_LAYER_TENSORS 24

typedef enum ft_cuda_wsrc_kind {
    FT_CUDA_WSRC_ABSENT = 0,    /* the architecture has no such tensor     */
    FT_CUDA_WSRC_RAW = 1,       /* data: numel values of `dtype` (f32, bf16
                                   or f16), row-major (out, in) layout     */
    FT_CUDA_WSRC_FRAME = 2,     /* data: one frame (any codec) of the tensor,
                                   with the tensor's exact shape           */
    FT_CUDA_WSRC_WMAT = 3       /* wmat: a matrix in a CPU engine compute
                                   format (f32/bf16/f16, or q8/q4 row
                                   chunks: what an offloading scheduler
                                   streams), dequantized on the GPU        */
} ft_cuda_wsrc_kind;

/* Where one tensor of a streamed layer comes from: host memory. Pinned
 * memory (ft_cuda_host_alloc) lets the copy overlap compute; pageable
 * memory works but the copy is staged by the driver. */
typedef struct ft_cuda_wsrc {
    ft_cuda_wsrc_kind kind;
    ft_dtype dtype;             /* RAW only                                 */
    const void *data;
    size_t bytes;
    int trusted;                /* FRAME: 1 = skip the chunk hashes (the
                                   caller made or checked the frame; the
                                   header is always validated)             */
    const ft_wmat *wmat;        /* WMAT only                                */
} ft_cuda_wsrc;

/* Called by ft_cuda_ctx_forward for layer `layer` (in order 0, 1, ...,
 * while the previous layer computes): fill src[0..FT_CUDA_LAYER_TENSORS).
 * Entries are preset to ABSENT. The memory must stay valid and unchanged
 * until the layer's copies are done: the context waits for them before it
 * calls the hook for the next layer (so a scheduler may reuse layer l's
 * buffers once it is asked for layer l + 1). An error aborts the forward. */
typedef ft_status (*ft_cuda_weight_hook)(void *user, int layer, ft_cuda_wsrc *src);

/* Any engine layer hook as a CUDA weight hook: the offloading scheduler
 * (ft_offload_hook: weights on the host, disk and memory-node tiers, raw,
 * byte-plane or q8/q4) feeds the GPU exactly as it feeds the CPU engine;
 * its matrices go to the device as FT_CUDA_WSRC_WMAT, its vectors as raw
 * f32. Set hook/user/model, then pass ft_cuda_layer_source_hook and the
 * struct as ft_cuda_ctx_params.hook / hook_user. */
typedef struct ft_cuda_layer_source {
    ft_layer_hook hook;
    void *user;
    const ft_model *model;
    ft_layer_weights w;           /* the current layer's views (internal)   */
} ft_cuda_layer_source;
FT_API ft_status ft_cuda_layer_source_hook(void *source, int layer, ft_cuda_wsrc *src);

typedef struct ft_cuda_ctx_params {
    int max_batch;        /* sequence slots (KV caches)                      */
    int max_seq;          /* tokens per sequence, prompt + generated         */
    int max_rows;         /* new tokens per forward call (0: max_batch *
                             max_seq, capped at 2^24)                         */
    int all_logits;       /* 1: forward may return the logits of every row   */
    int device;           /* CUDA ordinal                                    */
    int f32_weights;      /* 0: weights in device memory as bf16 and every
                             linear layer a bf16 x bf16 cuBLAS GEMM with f32
                             accumulation (default); 1: f32 weights and f32
                             GEMMs (exact-ish, for checking against the CPU) */
    int stream_weights;   /* 0: every weight uploaded once at creation;
                             1: layers streamed from host memory through
                             `hook` into two device slots, the copy (and GPU
                             decode) of layer i+1 overlapping compute of
                             layer i. Model-wide tensors (embeddings, final
                             norm, LM head) are always resident.            */
    ft_cuda_weight_hook hook;
    void *hook_user;
} ft_cuda_ctx_params;

typedef struct ft_cuda_ctx ft_cuda_ctx;

/* Create a context on p->device for model m (m must outlive it; its
 * layers need not be loaded when stream_weights = 1, only its model-wide
 * tensors). Allocates everything on the device here: weights (unless
 * streamed), two layer slots and staging (streamed), the KV cache
 * (f32, [layer][k|v][slot][max_seq][kv_dim]) and activations; the forward
 * pass never allocates except to grow the streaming staging buffers the
 * first time a larger frame arrives. FT_ERR_INVALID_ARG for bad params
 * (as ft_ctx_create), FT_ERR_UNSUPPORTED without a device, FT_ERR_NOMEM
 * when the device is too small (the detail gives the sizes). */
FT_API ft_status ft_cuda_ctx_create(const ft_model *m, const ft_cuda_ctx_params *p, ft_cuda_ctx **out);
FT_API void ft_cuda_ctx_free(ft_cuda_ctx *c);                 /* NULL ok */

/* Exactly ft_ctx_forward's contract (flextier/engine.h): for each j < n,
 * append ntok[j] tokens tokens[j][..] to slot slots[j]; logits (host
 * memory, f32): NULL, or the last row of each sequence (n x vocab), or
 * with all_rows every new row in order. Errors as ft_ctx_forward, plus
 * CUDA failures and the weight hook's status; on error the sequences'
 * lengths are unchanged. Returns when the logits are in host memory. */
FT_API ft_status ft_cuda_ctx_forward(ft_cuda_ctx *c, size_t n, const int *slots,
                                     const int32_t *const *tokens, const size_t *ntok,
                                     float *logits, int all_rows);

/* As ft_cuda_ctx_forward for the last row of each sequence, but returns
 * the greedy token of each (argmax on the device, first index of the
 * largest logit as ft_sampler_sample does) instead of the logits: only n
 * token ids cross PCIe. */
FT_API ft_status ft_cuda_ctx_forward_greedy(ft_cuda_ctx *c, size_t n, const int *slots,
                                            const int32_t *const *tokens, const size_t *ntok,
                                            int32_t *next);

FT_API void ft_cuda_ctx_reset(ft_cuda_ctx *c, int slot);
FT_API int ft_cuda_ctx_seq_len(const ft_cuda_ctx *c, int slot);
/* Copy the KV cache of (layer, slot) to host memory: len rows of kv_dim
 * floats each for k and v (either may be NULL; room for max_seq rows). */
FT_API ft_status ft_cuda_ctx_kv(ft_cuda_ctx *c, int layer, int slot, float *k, float *v, int *len,
                                int *kv_dim);

typedef struct ft_cuda_stats {
    uint64_t weight_bytes;      /* device bytes of resident weights         */
    uint64_t slot_bytes;        /* device bytes of the two streaming slots  */
    uint64_t kv_bytes, scratch_bytes;
    uint64_t h2d_weight_bytes;  /* bytes of streamed weights copied so far  */
    uint64_t layers_streamed;
    double hook_s;              /* host time in the hook and CPU decode     */
    double stall_s;             /* GPU time the compute stream stood idle
                                   between layers, waiting for streamed
                                   weights (CUDA events)                   */
    double copy_s;              /* GPU time the load stream spent copying
                                   and decoding streamed weights           */
    double forward_s;           /* wall time in successful forward calls    */
} ft_cuda_stats;
FT_API void ft_cuda_ctx_get_stats(const ft_cuda_ctx *c, ft_cuda_stats *out);

/* ft_generate (flextier/engine.h) on a CUDA context, same contract and
 * statistics (wall clock; the CPU-time fields are the host's). Greedy
 * sampling without repetition penalty takes the argmax on the device;
 * anything else copies the logits and samples with ft_sampler_sample, so
 * the same seed gives the same choices as the CPU engine given the same
 * logits. */
/* The context as the generation loop sees it (flextier/engine.h). */
FT_API void ft_cuda_ctx_forward_ops(ft_cuda_ctx *c, ft_forward_ops *out);
FT_API ft_status ft_cuda_generate(ft_cuda_ctx *c, size_t n, const int32_t *const *prompts,
                                  const size_t *prompt_len, const ft_gen_params *p,
                                  int32_t *const *out, size_t *n_out, ft_gen_stats *stats);

/* ------------------------------------------- host weights for streaming */

/* A model's layer tensors packed once into pinned host memory, served by
 * ft_cuda_host_weights_hook: matrices as raw bf16 (codec FT_CODEC_RAW),
 * q8/q4 frames (groups of group_size along group_dim, FlexGen's weight
 * compression; default 64 along the input dimension, -1), or byteplane
 * frames of the bf16 values (lossless); 1-D tensors (norms, biases) always
 * raw f32. The model's layers must be loaded. Encoding runs on `threads`
 * CPU threads (0: default). */
typedef struct ft_cuda_host_weights ft_cuda_host_weights;

typedef struct ft_cuda_host_weights_params {
    ft_codec_id codec;          /* RAW, Q8, Q4 or BYTEPLANE                  */
    uint32_t group_size;        /* q8/q4, 0: 64                              */
    int32_t group_dim;          /* q8/q4: -1 (input dim) or 0 (output dim)   */
    unsigned threads;
} ft_cuda_host_weights_params;

FT_API ft_status ft_cuda_host_weights_create(const ft_model *m, const ft_cuda_host_weights_params *p,
                                             ft_cuda_host_weights **out);
FT_API void ft_cuda_host_weights_free(ft_cuda_host_weights *hw);
/* Pinned bytes held (what crosses PCIe per pass over all layers). */
FT_API uint64_t ft_cuda_host_weights_bytes(const ft_cuda_host_weights *hw);
/* The ft_cuda_weight_hook to pass with hook_user = hw. */
FT_API ft_status ft_cuda_host_weights_hook(void *hw, int layer, ft_cuda_wsrc *src);

#ifdef __cplusplus
}
#endif
#endif
