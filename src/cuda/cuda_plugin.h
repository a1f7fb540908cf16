/* The boundary between libflextier and its CUDA backend plugin
 * (libflextier-cuda.so, docs/cuda.md "The plugin").
 *
 * libflextier defines every public ft_cuda_* function (cuda_loader.c): on
 * the first call that needs the backend it opens the plugin with dlopen and
 * asks it for this table; a CPU-only process never opens it, so it maps no
 * CUDA library. The plugin (cuda_plugin_entry.c with the backend's sources
 * and a private copy of the layers it calls) exports one symbol,
 * FT_CUDA_PLUGIN_ENTRY, and keeps everything else local: its error detail
 * and log level are its own, so the loader clears the one and sets the
 * other before each call, and copies the detail into the caller's
 * ft_last_error() after a failure.
 *
 * The plugin reads the caller's ft_model with its own copy of the engine,
 * so both must come from the same build: `build_id` (FT_CUDA_BUILD_ID, made
 * once per build tree at configure time) is checked along with `abi` and
 * `size` before anything else is used. */
#ifndef FT_CUDA_PLUGIN_H
#define FT_CUDA_PLUGIN_H

#include "flextier/cuda.h"

#define FT_CUDA_PLUGIN_ABI 1
#define FT_CUDA_PLUGIN_ENTRY "ft_cuda_plugin_api_get"
#define FT_CUDA_PLUGIN_FILE "libflextier-cuda.so"

typedef struct ft_cuda_plugin_api {
    uint32_t abi;               /* FT_CUDA_PLUGIN_ABI                        */
    uint32_t size;              /* sizeof(ft_cuda_plugin_api)                */
    const char *build_id;       /* FT_CUDA_BUILD_ID of the plugin's build    */
    const char *version;        /* FT_VERSION_STRING                         */
    /* the plugin's per-thread error detail, and its log level (the
     * loader passes the caller's before each call) */
    const char *(*last_error)(void);
    void (*clear_error)(void);
    void (*set_log_level)(ft_log_level lvl);
    /* flextier/cuda.h, one entry per function (ft_cuda_built,
     * ft_cuda_ctx_forward_ops and ft_cuda_generate live in the loader) */
    ft_status (*available)(char *detail, size_t n);
    ft_status (*device_info_get)(int device, ft_cuda_device_info *out);
    ft_status (*malloc_)(size_t n, void **out);
    void (*free_)(void *p);
    ft_status (*host_alloc)(size_t n, void **out);
    void (*host_free)(void *p);
    ft_status (*copy_to_device)(void *dst, const void *src, size_t n);
    ft_status (*copy_to_host)(void *dst, const void *src, size_t n);
    ft_status (*convert)(void *dst, ft_dtype dst_dt, const void *src, ft_dtype src_dt, size_t n);
    ft_status (*decoder_create)(int device, ft_cuda_decoder **out);
    void (*decoder_free)(ft_cuda_decoder *d);
    ft_status (*decode_frame)(ft_cuda_decoder *d, const void *frame, size_t size, ft_dtype out_dtype, void *dst,
                              size_t cap, ft_frame_info *info);
    ft_status (*qrow_encode)(int bits, const float *src, size_t rows, size_t n, uint32_t group, void *dst);
    ft_status (*qrow_decode)(int bits, const void *src, size_t rows, size_t n, uint32_t group, float *dst);
    ft_status (*layer_source_hook)(void *source, int layer, ft_cuda_wsrc *src);
    ft_status (*ctx_create)(const ft_model *m, const ft_cuda_ctx_params *p, ft_cuda_ctx **out);
    void (*ctx_free)(ft_cuda_ctx *c);
    ft_status (*ctx_forward)(ft_cuda_ctx *c, size_t n, const int *slots, const int32_t *const *tokens,
                             const size_t *ntok, float *logits, int all_rows);
    ft_status (*ctx_forward_greedy)(ft_cuda_ctx *c, size_t n, const int *slots, const int32_t *const *tokens,
                                    const size_t *ntok, int32_t *next);
    void (*ctx_reset)(ft_cuda_ctx *c, int slot);
    int (*ctx_seq_len)(const ft_cuda_ctx *c, int slot);
    ft_status (*ctx_kv)(ft_cuda_ctx *c, int layer, int slot, float *k, float *v, int *len, int *kv_dim);
    void (*ctx_get_stats)(const ft_cuda_ctx *c, ft_cuda_stats *out);
    /* the context's model and sizes, for ft_cuda_ctx_forward_ops */
    void (*ctx_shape)(const ft_cuda_ctx *c, const ft_model **m, int *max_batch, int *max_seq);
    ft_status (*host_weights_create)(const ft_model *m, const ft_cuda_host_weights_params *p,
                                     ft_cuda_host_weights **out);
    void (*host_weights_free)(ft_cuda_host_weights *hw);
    uint64_t (*host_weights_bytes)(const ft_cuda_host_weights *hw);
    ft_status (*host_weights_hook)(void *hw, int layer, ft_cuda_wsrc *src);
} ft_cuda_plugin_api;

/* The plugin's one exported function (FT_CUDA_PLUGIN_ENTRY). */
typedef const ft_cuda_plugin_api *(*ft_cuda_plugin_entry_fn)(void);

#endif
