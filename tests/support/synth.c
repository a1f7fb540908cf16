/* Test support: synthetic tensors (synth.h). */
#include "synth.h"

#include <math.h>

void ft_test_store_f(ft_dtype dt, void *p, size_t i, float v)
{
    if (dt == FT_F32) ((float *)p)[i] = v;
    else if (dt == FT_BF16) ((uint16_t *)p)[i] = ft_f32_to_bf16_1(v);
    else ((uint16_t *)p)[i] = ft_f32_to_f16_1(v);
}

float ft_test_load_f(ft_dtype dt, const void *p, size_t i)
{
    if (dt == FT_F32) return ((const float *)p)[i];
    if (dt == FT_BF16) return ft_bf16_to_f32_1(((const uint16_t *)p)[i]);
    return ft_f16_to_f32_1(((const uint16_t *)p)[i]);
}

void *ft_test_weights(ft_dtype dt, uint64_t n, uint64_t row, uint64_t seed)
{
    if (!ft_dtype_is_float(dt) && dt != FT_I32 && dt != FT_I8 && dt != FT_U8) return NULL;
    uint64_t bytes = ft_dtype_nbytes(dt, n);
    uint8_t *p = ft_malloc_aligned((size_t)bytes + 64, 64);
    if (!p) return NULL;
    if (ft_dtype_is_float(dt)) {
        if (ft_synth_weights(dt, n, row, seed, p) != FT_OK) { ft_free_aligned(p); return NULL; }
        return p;
    }
    float *f = ft_malloc_aligned((n ? n : 1) * sizeof(float), 64);
    if (!f || ft_synth_weights(FT_F32, n, row, seed, f) != FT_OK) {
        ft_free_aligned(f);
        ft_free_aligned(p);
        return NULL;
    }
    for (uint64_t i = 0; i < n; i++) {
        if (dt == FT_I32) ((int32_t *)p)[i] = (int32_t)(f[i] * 1e6f);
        else p[i] = (uint8_t)(int32_t)(f[i] * 1000.0f);   /* wraps: bytes, not values */
    }
    ft_free_aligned(f);
    return p;
}

void *ft_test_mixed(ft_dtype dt, uint64_t n, uint64_t seed)
{
    uint8_t *p = ft_malloc_aligned((size_t)n * 4 + 64, 64);
    if (!p) return NULL;
    uint64_t s = seed;
    float scale = 1.0f, c = 0.0f;
    int mode = 0;
    for (uint64_t i = 0; i < n; i++) {
        if (i % 97 == 0) {
            scale = ldexpf(1.0f, (int)(ft_rand_u64(&s) % 16) - 10);
            mode = (int)(ft_rand_u64(&s) % 8);
            c = (float)((int)(ft_rand_u64(&s) % 200) - 100) * 0.37f;
        }
        float v = ((float)(ft_rand_u64(&s) >> 40) / (float)(1 << 24) * 2.0f - 1.0f) * scale;
        uint64_t r = ft_rand_u64(&s) % 64;
        if (r == 0) v *= 50.0f;
        else if (r == 1) v = 0.0f;
        else if (r == 2) v = -0.0f;
        if (mode == 0) v = c;             /* constant run */
        else if (mode == 1) v += c;       /* offset run */
        ft_test_store_f(dt, p, i, v);
    }
    return p;
}
