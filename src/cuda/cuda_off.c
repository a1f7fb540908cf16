/* The CUDA backend's API in a build without CUDA (no CUDA compiler at
 * configure time, or -DFT_CUDA=OFF): every entry point reports why, so
 * callers (the CLI's --device cuda, the tests) need no #ifdef. */
#include <string.h>
#include "flextier/cuda.h"

#define OFF_DETAIL "built without CUDA (configured with FT_CUDA=OFF, as a sanitizer/fuzzing/Python build, " \
                   "or without a CUDA compiler; rebuild with the CUDA toolkit installed or " \
                   "-DFT_CUDA=ON -DCMAKE_CUDA_COMPILER=/path/to/nvcc)"

static ft_status off(void) { return ft_set_error(FT_ERR_UNSUPPORTED, "%s", OFF_DETAIL); }

int ft_cuda_built(void) { return 0; }

ft_status ft_cuda_available(char *detail, size_t n)
{
    if (detail && n) {
        size_t i = 0;
        for (const char *s = OFF_DETAIL; *s && i + 1 < n; s++) detail[i++] = *s;
        detail[i] = 0;
    }
    return off();
}

ft_status ft_cuda_device_info_get(int device, ft_cuda_device_info *out) { (void)device; (void)out; return off(); }
ft_status ft_cuda_malloc(size_t n, void **out) { (void)n; (void)out; return off(); }
void ft_cuda_free(void *p) { (void)p; }
ft_status ft_cuda_host_alloc(size_t n, void **out) { (void)n; (void)out; return off(); }
void ft_cuda_host_free(void *p) { (void)p; }
ft_status ft_cuda_copy_to_device(void *dst, const void *src, size_t n) { (void)dst; (void)src; (void)n; return off(); }
ft_status ft_cuda_copy_to_host(void *dst, const void *src, size_t n) { (void)dst; (void)src; (void)n; return off(); }

ft_status ft_cuda_convert(void *dst, ft_dtype dst_dt, const void *src, ft_dtype src_dt, size_t n)
{
    (void)dst; (void)dst_dt; (void)src; (void)src_dt; (void)n;
    return off();
}

ft_status ft_cuda_decoder_create(int device, ft_cuda_decoder **out) { (void)device; (void)out; return off(); }
void ft_cuda_decoder_free(ft_cuda_decoder *d) { (void)d; }

ft_status ft_cuda_decode_frame(ft_cuda_decoder *d, const void *frame, size_t size, ft_dtype out_dtype,
                               void *dst, size_t cap, ft_frame_info *info)
{
    (void)d; (void)frame; (void)size; (void)out_dtype; (void)dst; (void)cap; (void)info;
    return off();
}

ft_status ft_cuda_qrow_encode(int bits, const float *src, size_t rows, size_t n, uint32_t group, void *dst)
{
    (void)bits; (void)src; (void)rows; (void)n; (void)group; (void)dst;
    return off();
}

ft_status ft_cuda_qrow_decode(int bits, const void *src, size_t rows, size_t n, uint32_t group, float *dst)
{
    (void)bits; (void)src; (void)rows; (void)n; (void)group; (void)dst;
    return off();
}

ft_status ft_cuda_ctx_create(const ft_model *m, const ft_cuda_ctx_params *p, ft_cuda_ctx **out)
{
    (void)m; (void)p; (void)out;
    return off();
}

void ft_cuda_ctx_free(ft_cuda_ctx *c) { (void)c; }

ft_status ft_cuda_ctx_forward(ft_cuda_ctx *c, size_t n, const int *slots, const int32_t *const *tokens,
                              const size_t *ntok, float *logits, int all_rows)
{
    (void)c; (void)n; (void)slots; (void)tokens; (void)ntok; (void)logits; (void)all_rows;
    return off();
}

ft_status ft_cuda_ctx_forward_greedy(ft_cuda_ctx *c, size_t n, const int *slots, const int32_t *const *tokens,
                                     const size_t *ntok, int32_t *next)
{
    (void)c; (void)n; (void)slots; (void)tokens; (void)ntok; (void)next;
    return off();
}

void ft_cuda_ctx_reset(ft_cuda_ctx *c, int slot) { (void)c; (void)slot; }
int ft_cuda_ctx_seq_len(const ft_cuda_ctx *c, int slot) { (void)c; (void)slot; return 0; }

ft_status ft_cuda_ctx_kv(ft_cuda_ctx *c, int layer, int slot, float *k, float *v, int *len, int *kv_dim)
{
    (void)c; (void)layer; (void)slot; (void)k; (void)v; (void)len; (void)kv_dim;
    return off();
}

void ft_cuda_ctx_get_stats(const ft_cuda_ctx *c, ft_cuda_stats *out)
{
    (void)c;
    if (out) *out = (ft_cuda_stats){0};
}

void ft_cuda_ctx_forward_ops(ft_cuda_ctx *c, ft_forward_ops *out)
{
    (void)c;
    if (out) memset(out, 0, sizeof *out);   /* no context exists without CUDA */
}

ft_status ft_cuda_generate(ft_cuda_ctx *c, size_t n, const int32_t *const *prompts, const size_t *prompt_len,
                           const ft_gen_params *p, int32_t *const *out, size_t *n_out, ft_gen_stats *stats)
{
    (void)c; (void)n; (void)prompts; (void)prompt_len; (void)p; (void)out; (void)n_out; (void)stats;
    return off();
}

ft_status ft_cuda_host_weights_create(const ft_model *m, const ft_cuda_host_weights_params *p,
                                      ft_cuda_host_weights **out)
{
    (void)m; (void)p; (void)out;
    return off();
}

void ft_cuda_host_weights_free(ft_cuda_host_weights *hw) { (void)hw; }
uint64_t ft_cuda_host_weights_bytes(const ft_cuda_host_weights *hw) { (void)hw; return 0; }

ft_status ft_cuda_host_weights_hook(void *hw, int layer, ft_cuda_wsrc *src)
{
    (void)hw; (void)layer; (void)src;
    return off();
}

ft_status ft_cuda_layer_source_hook(void *source, int layer, ft_cuda_wsrc *src)
{
    (void)source; (void)layer; (void)src;
    return off();
}
