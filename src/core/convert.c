/* f32 <-> f16 <-> bf16 conversion: scalar reference and run-time dispatch. */
#include "flextier/core.h"
#include "convert_simd.h"

#include <string.h>

static inline uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

uint16_t ft_f32_to_bf16_1(float f)
{
    uint32_t u = f2u(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)          /* NaN: keep, make quiet */
        return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);              /* round to nearest even */
    return (uint16_t)(u >> 16);
}

float ft_bf16_to_f32_1(uint16_t h) { return u2f((uint32_t)h << 16); }

/* Same results as x86 F16C (VCVTPS2PH with RNE): NaNs keep the top 10
 * payload bits and become quiet. */
uint16_t ft_f32_to_f16_1(float f)
{
    uint32_t u = f2u(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t absu = u & 0x7fffffffu;
    if (absu > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00u | ((absu >> 13) & 0x3ffu));
    if (absu >= 0x477ff000u)                       /* rounds to >= 65536 */
        return (uint16_t)(sign | 0x7c00u);
    if (absu < 0x38800000u) {                      /* f16 subnormal or 0 */
        if (absu < 0x33000000u) return (uint16_t)sign;  /* < 2^-25: to 0 */
        uint32_t e = absu >> 23;                   /* 102..112 */
        uint32_t m = (absu & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - e;                  /* 14..24 */
        uint32_t q = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1u))) q++;
        return (uint16_t)(sign | q);
    }
    /* Normal: rebias exponent (127 -> 15) and round the mantissa. */
    uint32_t r = absu - 0x38000000u;               /* exponent - 112 */
    r += 0xfffu + ((r >> 13) & 1u);
    return (uint16_t)(sign | (r >> 13));
}

float ft_f16_to_f32_1(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f)   /* Inf, or NaN made quiet as x86 F16C does */
        return u2f(sign | 0x7f800000u | (m << 13) | (m ? 0x400000u : 0));
    if (e == 0) {
        if (m == 0) return u2f(sign);
        /* Subnormal: m * 2^-24, exactly representable in f32. */
        float v = (float)m * 5.9604644775390625e-8f;
        return sign ? -v : v;
    }
    return u2f(sign | ((e + 112u) << 23) | (m << 13));
}

void ft_f32_to_f16_ref(uint16_t *dst, const float *src, size_t n)
{ for (size_t i = 0; i < n; i++) dst[i] = ft_f32_to_f16_1(src[i]); }
void ft_f16_to_f32_ref(float *dst, const uint16_t *src, size_t n)
{ for (size_t i = 0; i < n; i++) dst[i] = ft_f16_to_f32_1(src[i]); }
void ft_f32_to_bf16_ref(uint16_t *dst, const float *src, size_t n)
{ for (size_t i = 0; i < n; i++) dst[i] = ft_f32_to_bf16_1(src[i]); }
void ft_bf16_to_f32_ref(float *dst, const uint16_t *src, size_t n)
{ for (size_t i = 0; i < n; i++) dst[i] = ft_bf16_to_f32_1(src[i]); }

/* Dispatch: each SIMD kernel handles the bulk and returns how many
 * elements it converted; the scalar reference finishes the tail. */
void ft_f32_to_f16(uint16_t *dst, const float *src, size_t n)
{
    size_t k = 0;
    if (ft_cpu()->f16c && ft_cpu()->avx2) k = ft_f32_to_f16_f16c(dst, src, n);
    ft_f32_to_f16_ref(dst + k, src + k, n - k);
}

void ft_f16_to_f32(float *dst, const uint16_t *src, size_t n)
{
    size_t k = 0;
    if (ft_cpu()->f16c && ft_cpu()->avx2) k = ft_f16_to_f32_f16c(dst, src, n);
    ft_f16_to_f32_ref(dst + k, src + k, n - k);
}

void ft_f32_to_bf16(uint16_t *dst, const float *src, size_t n)
{
    size_t k = 0;
    if (ft_cpu()->avx512f && ft_cpu()->avx512bw) k = ft_f32_to_bf16_avx512(dst, src, n);
    else if (ft_cpu()->avx2) k = ft_f32_to_bf16_avx2(dst, src, n);
    ft_f32_to_bf16_ref(dst + k, src + k, n - k);
}

void ft_bf16_to_f32(float *dst, const uint16_t *src, size_t n)
{
    size_t k = 0;
    if (ft_cpu()->avx2) k = ft_bf16_to_f32_avx2(dst, src, n);
    ft_bf16_to_f32_ref(dst + k, src + k, n - k);
}

ft_status ft_convert(void *dst, ft_dtype dd, const void *src, ft_dtype sd, size_t n)
{
    if ((!dst || !src) && n) return FT_ERR_INVALID_ARG;
    if (dd == sd) {
        if (ft_dtype_bits(dd) == 0) return FT_ERR_INVALID_ARG;
        if (n) memmove(dst, src, ft_dtype_nbytes(dd, n));
        return FT_OK;
    }
    if (!ft_dtype_is_float(dd) || !ft_dtype_is_float(sd))
        return ft_set_error(FT_ERR_UNSUPPORTED, "cannot convert %s to %s",
                            ft_dtype_name(sd), ft_dtype_name(dd));
    if (sd == FT_F32) {
        if (dd == FT_F16) ft_f32_to_f16(dst, src, n);
        else ft_f32_to_bf16(dst, src, n);
        return FT_OK;
    }
    if (dd == FT_F32) {
        if (sd == FT_F16) ft_f16_to_f32(dst, src, n);
        else ft_bf16_to_f32(dst, src, n);
        return FT_OK;
    }
    /* f16 <-> bf16 through f32 in cache-sized blocks (both roundings are
     * exact-then-RNE, so this equals a direct conversion). */
    float tmp[1024];
    for (size_t i = 0; i < n; i += 1024) {
        size_t m = n - i < 1024 ? n - i : 1024;
        const uint16_t *s = (const uint16_t *)src + i;
        uint16_t *d = (uint16_t *)dst + i;
        if (sd == FT_F16) { ft_f16_to_f32(tmp, s, m); ft_f32_to_bf16(d, tmp, m); }
        else { ft_bf16_to_f32(tmp, s, m); ft_f32_to_f16(d, tmp, m); }
    }
    return FT_OK;
}
