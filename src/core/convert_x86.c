/* x86 SIMD conversion kernels, compiled per function with target
 * attributes and selected at run time by convert.c.
 *
 * f32 -> bf16 deliberately uses integer rounding instead of AVX512-BF16's
 * VCVTNEPS2BF16: that instruction flushes subnormal inputs to zero, which
 * would break bit-equality with the round-to-nearest-even reference (and
 * with PyTorch). The integer form is exact and memory-bound anyway. */
#include "convert_simd.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

__attribute__((target("avx2,f16c")))
size_t ft_f32_to_f16_f16c(uint16_t *dst, const float *src, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i),
                                    _MM_FROUND_TO_NEAREST_INT);
        _mm_storeu_si128((__m128i *)(dst + i), h);
    }
    return i;
}

__attribute__((target("avx2,f16c")))
size_t ft_f16_to_f32_f16c(float *dst, const uint16_t *src, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    return i;
}

__attribute__((target("avx512f,avx512bw")))
size_t ft_f32_to_bf16_avx512(uint16_t *dst, const float *src, size_t n)
{
    const __m512i absmask = _mm512_set1_epi32(0x7fffffff);
    const __m512i inf = _mm512_set1_epi32(0x7f800000);
    const __m512i bias = _mm512_set1_epi32(0x7fff);
    const __m512i one = _mm512_set1_epi32(1);
    const __m512i qbit = _mm512_set1_epi32(0x400000);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i u = _mm512_loadu_si512(src + i);
        __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, absmask), inf);
        __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), one);
        __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(bias, lsb));
        r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(u, qbit));
        _mm256_storeu_si256((__m256i *)(dst + i),
                            _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16)));
    }
    return i;
}

__attribute__((target("avx2")))
size_t ft_f32_to_bf16_avx2(uint16_t *dst, const float *src, size_t n)
{
    const __m256i absmask = _mm256_set1_epi32(0x7fffffff);
    const __m256i inf = _mm256_set1_epi32(0x7f800000);
    const __m256i bias = _mm256_set1_epi32(0x7fff);
    const __m256i one = _mm256_set1_epi32(1);
    const __m256i qbit = _mm256_set1_epi32(0x400000);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i r2[2];
        for (int h = 0; h < 2; h++) {
            __m256i u = _mm256_loadu_si256((const __m256i *)(src + i + 8 * h));
            __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, absmask), inf);
            __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), one);
            __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(bias, lsb));
            r = _mm256_blendv_epi8(r, _mm256_or_si256(u, qbit), nan);
            r2[h] = _mm256_srli_epi32(r, 16);
        }
        /* packus works per 128-bit lane; fix the order with a permute. */
        __m256i p = _mm256_packus_epi32(r2[0], r2[1]);
        p = _mm256_permute4x64_epi64(p, 0xd8);
        _mm256_storeu_si256((__m256i *)(dst + i), p);
    }
    return i;
}

__attribute__((target("avx2")))
size_t ft_bf16_to_f32_avx2(float *dst, const uint16_t *src, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(src + i)));
        _mm256_storeu_si256((__m256i *)(dst + i), _mm256_slli_epi32(v, 16));
    }
    return i;
}
#else
size_t ft_f32_to_f16_f16c(uint16_t *d, const float *s, size_t n) { (void)d; (void)s; (void)n; return 0; }
size_t ft_f16_to_f32_f16c(float *d, const uint16_t *s, size_t n) { (void)d; (void)s; (void)n; return 0; }
size_t ft_f32_to_bf16_avx512(uint16_t *d, const float *s, size_t n) { (void)d; (void)s; (void)n; return 0; }
size_t ft_f32_to_bf16_avx2(uint16_t *d, const float *s, size_t n) { (void)d; (void)s; (void)n; return 0; }
size_t ft_bf16_to_f32_avx2(float *d, const uint16_t *s, size_t n) { (void)d; (void)s; (void)n; return 0; }
#endif
