/* The CUDA backend plugin's one exported function: its function table
 * (cuda_plugin.h). Linked into libflextier-cuda.so only, with a version
 * script that keeps every other symbol local. */
#include "cuda_plugin.h"
#include "cuda_host.h"

#ifndef FT_CUDA_BUILD_ID
#error "FT_CUDA_BUILD_ID must be defined (src/cuda/CMakeLists.txt)"
#endif

static const ft_cuda_plugin_api api = {
    .abi = FT_CUDA_PLUGIN_ABI,
    .size = sizeof(ft_cuda_plugin_api),
    .build_id = FT_CUDA_BUILD_ID,
    .version = FT_VERSION_STRING,
    .last_error = ft_last_error,
    .clear_error = ft_clear_error,
    .set_log_level = ft_log_set_level,
    .available = ft_cuda_available,
    .device_info_get = ft_cuda_device_info_get,
    .malloc_ = ft_cuda_malloc,
    .free_ = ft_cuda_free,
    .host_alloc = ft_cuda_host_alloc,
    .host_free = ft_cuda_host_free,
    .copy_to_device = ft_cuda_copy_to_device,
    .copy_to_host = ft_cuda_copy_to_host,
    .convert = ft_cuda_convert,
    .decoder_create = ft_cuda_decoder_create,
    .decoder_free = ft_cuda_decoder_free,
    .decode_frame = ft_cuda_decode_frame,
    .qrow_encode = ft_cuda_qrow_encode,
    .qrow_decode = ft_cuda_qrow_decode,
    .layer_source_hook = ft_cuda_layer_source_hook,
    .ctx_create = ft_cuda_ctx_create,
    .ctx_free = ft_cuda_ctx_free,
    .ctx_forward = ft_cuda_ctx_forward,
    .ctx_forward_greedy = ft_cuda_ctx_forward_greedy,
    .ctx_reset = ft_cuda_ctx_reset,
    .ctx_seq_len = ft_cuda_ctx_seq_len,
    .ctx_kv = ft_cuda_ctx_kv,
    .ctx_get_stats = ft_cuda_ctx_get_stats,
    .ctx_shape = ft_cuda_ctx_shape,
    .host_weights_create = ft_cuda_host_weights_create,
    .host_weights_free = ft_cuda_host_weights_free,
    .host_weights_bytes = ft_cuda_host_weights_bytes,
    .host_weights_hook = ft_cuda_host_weights_hook,
};

__attribute__((visibility("default"))) const ft_cuda_plugin_api *ft_cuda_plugin_api_get(void);

const ft_cuda_plugin_api *ft_cuda_plugin_api_get(void) { return &api; }
