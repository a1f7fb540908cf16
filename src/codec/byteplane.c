/* Float byte-plane codec (FT_CODEC_BYTEPLANE), after ZipNN: each element's
 * bytes are regrouped so that the exponent forms one clean byte plane and
 * the (near-random) sign and mantissa bits the others; every plane is then
 * entropy-coded, stored raw, or stored as one byte when constant.
 *
 * Chunk payload (little endian; the frame carries the version), specified
 * in docs/codec-byteplane.md:
 *   u8  modes        2 bits per plane, plane k in bits 2k..2k+1:
 *                    0 raw (n bytes), 1 entropy-coded, 2 constant (1 byte),
 *                    3 invalid; bits above the last plane are zero
 *   u32 size[e]      compressed size of each entropy-coded plane, in plane
 *                    order (0 < size < n)
 *   plane payloads   in plane order
 * n = raw_bytes / element size = bytes per plane. The payload must be
 * consumed exactly. */
#include "codec_internal.h"
#include "byteplane.h"

#include <math.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define FT_BP_X86 1
#endif
#if defined(__aarch64__)
#include <arm_neon.h>
#define FT_BP_NEON 1
#endif

enum { BP_RAW = 0, BP_ENTROPY = 1, BP_CONST = 2 };

unsigned ft_bp_nplanes(ft_dtype dt)
{
    switch (dt) {
    case FT_BF16: case FT_F16: return 2;
    case FT_F32: return 4;
    default: return 0;
    }
}

/* ------------------------------------------------------- scalar kernels */

static inline uint16_t ld16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static inline uint32_t ld32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline void st16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }
static inline void st32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }

static void split_from(ft_dtype dt, const uint8_t *s, size_t i, size_t n, uint8_t *const *P)
{
    switch (dt) {
    case FT_BF16:
        for (; i < n; i++) {
            uint16_t x = ld16(s + 2 * i);
            P[0][i] = (uint8_t)(x >> 7);
            P[1][i] = (uint8_t)(((x >> 8) & 0x80) | (x & 0x7F));
        }
        break;
    case FT_F16:
        for (; i < n; i++) {
            uint16_t x = ld16(s + 2 * i);
            P[0][i] = (uint8_t)(x >> 8);
            P[1][i] = (uint8_t)x;
        }
        break;
    case FT_F32:
        for (; i < n; i++) {
            uint32_t x = ld32(s + 4 * i);
            P[0][i] = (uint8_t)(x >> 23);
            P[1][i] = (uint8_t)(((x >> 24) & 0x80) | ((x >> 16) & 0x7F));
            P[2][i] = (uint8_t)(x >> 8);
            P[3][i] = (uint8_t)x;
        }
        break;
    default: break;
    }
}

static void merge_from(ft_dtype dt, const uint8_t *const *P, size_t i, size_t n, uint8_t *d)
{
    switch (dt) {
    case FT_BF16:
        for (; i < n; i++) {
            uint32_t e = P[0][i], s = P[1][i];
            st16(d + 2 * i, (uint16_t)(((s & 0x80) << 8) | (e << 7) | (s & 0x7F)));
        }
        break;
    case FT_F16:
        for (; i < n; i++) st16(d + 2 * i, (uint16_t)((P[0][i] << 8) | P[1][i]));
        break;
    case FT_F32:
        for (; i < n; i++) {
            uint32_t e = P[0][i], s = P[1][i], m = P[2][i], l = P[3][i];
            st32(d + 4 * i, ((s & 0x80) << 24) | (e << 23) | ((s & 0x7F) << 16) | (m << 8) | l);
        }
        break;
    default: break;
    }
}

void ft_bp_split_ref(ft_dtype dt, const void *src, size_t n, uint8_t *const *planes)
{
    split_from(dt, src, 0, n, planes);
}

void ft_bp_merge_ref(ft_dtype dt, const uint8_t *const *planes, size_t n, void *dst)
{
    merge_from(dt, planes, 0, n, dst);
}

/* --------------------------------------------------------- SIMD kernels */

#ifdef FT_BP_X86
__attribute__((target("avx512f,avx512bw")))
static size_t split_avx512(ft_dtype dt, const uint8_t *s, size_t n, uint8_t *const *P)
{
    size_t i = 0;
    if (dt == FT_BF16 || dt == FT_F16) {
        const __m512i lo7 = _mm512_set1_epi16(0x7F), hib = _mm512_set1_epi16(0x80);
        for (; i + 32 <= n; i += 32) {
            __m512i x = _mm512_loadu_si512((const void *)(s + 2 * i));
            __m512i a, b;
            if (dt == FT_BF16) {
                a = _mm512_srli_epi16(x, 7);   /* vpmovwb truncates to the exponent */
                b = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(x, 8), hib),
                                    _mm512_and_si512(x, lo7));
            } else {
                a = _mm512_srli_epi16(x, 8);
                b = x;
            }
            _mm256_storeu_si256((__m256i *)(P[0] + i), _mm512_cvtepi16_epi8(a));
            _mm256_storeu_si256((__m256i *)(P[1] + i), _mm512_cvtepi16_epi8(b));
        }
    } else if (dt == FT_F32) {
        const __m512i lo7 = _mm512_set1_epi32(0x7F), hib = _mm512_set1_epi32(0x80);
        for (; i + 16 <= n; i += 16) {
            __m512i x = _mm512_loadu_si512((const void *)(s + 4 * i));
            __m512i e = _mm512_srli_epi32(x, 23);
            __m512i sm = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(x, 24), hib),
                                         _mm512_and_si512(_mm512_srli_epi32(x, 16), lo7));
            _mm_storeu_si128((__m128i *)(P[0] + i), _mm512_cvtepi32_epi8(e));
            _mm_storeu_si128((__m128i *)(P[1] + i), _mm512_cvtepi32_epi8(sm));
            _mm_storeu_si128((__m128i *)(P[2] + i), _mm512_cvtepi32_epi8(_mm512_srli_epi32(x, 8)));
            _mm_storeu_si128((__m128i *)(P[3] + i), _mm512_cvtepi32_epi8(x));
        }
    }
    return i;
}

__attribute__((target("avx512f,avx512bw")))
static size_t merge_avx512(ft_dtype dt, const uint8_t *const *P, size_t n, uint8_t *d)
{
    size_t i = 0;
    if (dt == FT_BF16 || dt == FT_F16) {
        const __m512i lo7 = _mm512_set1_epi16(0x7F), hib = _mm512_set1_epi16(0x80);
        for (; i + 32 <= n; i += 32) {
            __m512i a = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(P[0] + i)));
            __m512i b = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(P[1] + i)));
            __m512i x;
            if (dt == FT_BF16)
                x = _mm512_or_si512(_mm512_or_si512(_mm512_slli_epi16(_mm512_and_si512(b, hib), 8),
                                                    _mm512_slli_epi16(a, 7)),
                                    _mm512_and_si512(b, lo7));
            else
                x = _mm512_or_si512(_mm512_slli_epi16(a, 8), b);
            _mm512_storeu_si512((void *)(d + 2 * i), x);
        }
    } else if (dt == FT_F32) {
        const __m512i lo7 = _mm512_set1_epi32(0x7F), hib = _mm512_set1_epi32(0x80);
        for (; i + 16 <= n; i += 16) {
            __m512i e = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(P[0] + i)));
            __m512i s = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(P[1] + i)));
            __m512i m = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(P[2] + i)));
            __m512i l = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(P[3] + i)));
            __m512i x = _mm512_or_si512(_mm512_slli_epi32(_mm512_and_si512(s, hib), 24),
                                        _mm512_slli_epi32(e, 23));
            x = _mm512_or_si512(x, _mm512_slli_epi32(_mm512_and_si512(s, lo7), 16));
            x = _mm512_or_si512(x, _mm512_or_si512(_mm512_slli_epi32(m, 8), l));
            _mm512_storeu_si512((void *)(d + 4 * i), x);
        }
    }
    return i;
}

__attribute__((target("avx2")))
static size_t split_avx2(ft_dtype dt, const uint8_t *s, size_t n, uint8_t *const *P)
{
    size_t i = 0;
    if (dt == FT_BF16 || dt == FT_F16) {
        const __m256i ff = _mm256_set1_epi16(0xFF), lo7 = _mm256_set1_epi16(0x7F),
                      hib = _mm256_set1_epi16(0x80);
        for (; i + 32 <= n; i += 32) {
            __m256i x0 = _mm256_loadu_si256((const __m256i *)(s + 2 * i));
            __m256i x1 = _mm256_loadu_si256((const __m256i *)(s + 2 * i + 32));
            __m256i a0, a1, b0, b1;
            if (dt == FT_BF16) {
                a0 = _mm256_and_si256(_mm256_srli_epi16(x0, 7), ff);
                a1 = _mm256_and_si256(_mm256_srli_epi16(x1, 7), ff);
                b0 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(x0, 8), hib), _mm256_and_si256(x0, lo7));
                b1 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(x1, 8), hib), _mm256_and_si256(x1, lo7));
            } else {
                a0 = _mm256_srli_epi16(x0, 8);
                a1 = _mm256_srli_epi16(x1, 8);
                b0 = _mm256_and_si256(x0, ff);
                b1 = _mm256_and_si256(x1, ff);
            }
            /* packus interleaves 128-bit lanes; 0xD8 restores the order */
            __m256i a = _mm256_permute4x64_epi64(_mm256_packus_epi16(a0, a1), 0xD8);
            __m256i b = _mm256_permute4x64_epi64(_mm256_packus_epi16(b0, b1), 0xD8);
            _mm256_storeu_si256((__m256i *)(P[0] + i), a);
            _mm256_storeu_si256((__m256i *)(P[1] + i), b);
        }
    } else if (dt == FT_F32) {
        /* Per 128-bit lane: bytes of 4 elements grouped as [l m s e]
         * dwords; then a dword permute and a 4x4 qword transpose. */
        const __m256i grp = _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15,
                                             0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
        const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        const __m256i lo16 = _mm256_set1_epi32(0xFFFF), lo7 = _mm256_set1_epi32(0x7F),
                      hib = _mm256_set1_epi32(0x80), ff = _mm256_set1_epi32(0xFF);
        for (; i + 32 <= n; i += 32) {
            __m256i v[4];
            for (int k = 0; k < 4; k++) {
                __m256i x = _mm256_loadu_si256((const __m256i *)(s + 4 * i + 32 * k));
                __m256i e = _mm256_and_si256(_mm256_srli_epi32(x, 23), ff);
                __m256i sm = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(x, 24), hib),
                                             _mm256_and_si256(_mm256_srli_epi32(x, 16), lo7));
                __m256i y = _mm256_or_si256(_mm256_and_si256(x, lo16),
                                            _mm256_or_si256(_mm256_slli_epi32(sm, 16), _mm256_slli_epi32(e, 24)));
                v[k] = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(y, grp), perm);
            }
            __m256i A = _mm256_unpacklo_epi64(v[0], v[1]), B = _mm256_unpacklo_epi64(v[2], v[3]);
            __m256i C = _mm256_unpackhi_epi64(v[0], v[1]), D = _mm256_unpackhi_epi64(v[2], v[3]);
            _mm256_storeu_si256((__m256i *)(P[3] + i), _mm256_permute2x128_si256(A, B, 0x20));
            _mm256_storeu_si256((__m256i *)(P[1] + i), _mm256_permute2x128_si256(A, B, 0x31));
            _mm256_storeu_si256((__m256i *)(P[2] + i), _mm256_permute2x128_si256(C, D, 0x20));
            _mm256_storeu_si256((__m256i *)(P[0] + i), _mm256_permute2x128_si256(C, D, 0x31));
        }
    }
    return i;
}

__attribute__((target("avx2")))
static size_t merge_avx2(ft_dtype dt, const uint8_t *const *P, size_t n, uint8_t *d)
{
    size_t i = 0;
    if (dt == FT_BF16 || dt == FT_F16) {
        const __m256i lo7 = _mm256_set1_epi16(0x7F), hib = _mm256_set1_epi16(0x80);
        for (; i + 16 <= n; i += 16) {
            __m256i a = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(P[0] + i)));
            __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(P[1] + i)));
            __m256i x;
            if (dt == FT_BF16)
                x = _mm256_or_si256(_mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(b, hib), 8),
                                                    _mm256_slli_epi16(a, 7)),
                                    _mm256_and_si256(b, lo7));
            else
                x = _mm256_or_si256(_mm256_slli_epi16(a, 8), b);
            _mm256_storeu_si256((__m256i *)(d + 2 * i), x);
        }
    } else if (dt == FT_F32) {
        const __m256i lo7 = _mm256_set1_epi32(0x7F), hib = _mm256_set1_epi32(0x80);
        for (; i + 8 <= n; i += 8) {
            __m256i e = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(P[0] + i)));
            __m256i s = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(P[1] + i)));
            __m256i m = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(P[2] + i)));
            __m256i l = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(P[3] + i)));
            __m256i x = _mm256_or_si256(_mm256_slli_epi32(_mm256_and_si256(s, hib), 24),
                                        _mm256_slli_epi32(e, 23));
            x = _mm256_or_si256(x, _mm256_slli_epi32(_mm256_and_si256(s, lo7), 16));
            x = _mm256_or_si256(x, _mm256_or_si256(_mm256_slli_epi32(m, 8), l));
            _mm256_storeu_si256((__m256i *)(d + 4 * i), x);
        }
    }
    return i;
}
#endif

#ifdef FT_BP_NEON
/* NEON: vld2q/vld4q de-interleave the element bytes (b0 = lowest) of 16
 * elements into byte vectors, so every plane is a few shifts and selects
 * on 16 bytes; vst2q/vst4q interleave them back. bf16 / f32 top bytes:
 * exponent = hi << 1 | next >> 7, sign|mantissa = (hi & 0x80) | (next & 0x7F). */
static size_t split_neon(ft_dtype dt, const uint8_t *s, size_t n, uint8_t *const *P)
{
    size_t i = 0;
    const uint8x16_t hib = vdupq_n_u8(0x80);
    if (dt == FT_BF16 || dt == FT_F16) {
        for (; i + 16 <= n; i += 16) {
            uint8x16x2_t x = vld2q_u8(s + 2 * i);   /* val[0] low bytes, val[1] high */
            if (dt == FT_BF16) {
                vst1q_u8(P[0] + i, vsliq_n_u8(vshrq_n_u8(x.val[0], 7), x.val[1], 1));
                vst1q_u8(P[1] + i, vbslq_u8(hib, x.val[1], x.val[0]));
            } else {
                vst1q_u8(P[0] + i, x.val[1]);
                vst1q_u8(P[1] + i, x.val[0]);
            }
        }
    } else if (dt == FT_F32) {
        for (; i + 16 <= n; i += 16) {
            uint8x16x4_t x = vld4q_u8(s + 4 * i);
            vst1q_u8(P[0] + i, vsliq_n_u8(vshrq_n_u8(x.val[2], 7), x.val[3], 1));
            vst1q_u8(P[1] + i, vbslq_u8(hib, x.val[3], x.val[2]));
            vst1q_u8(P[2] + i, x.val[1]);
            vst1q_u8(P[3] + i, x.val[0]);
        }
    }
    return i;
}

static size_t merge_neon(ft_dtype dt, const uint8_t *const *P, size_t n, uint8_t *d)
{
    size_t i = 0;
    const uint8x16_t hib = vdupq_n_u8(0x80);
    if (dt == FT_BF16 || dt == FT_F16) {
        for (; i + 16 <= n; i += 16) {
            uint8x16_t a = vld1q_u8(P[0] + i), b = vld1q_u8(P[1] + i);
            uint8x16x2_t x;
            if (dt == FT_BF16) {
                x.val[1] = vbslq_u8(hib, b, vshrq_n_u8(a, 1));   /* sign | exp >> 1 */
                x.val[0] = vbslq_u8(hib, vshlq_n_u8(a, 7), b);   /* exp << 7 | mant */
            } else {
                x.val[1] = a;
                x.val[0] = b;
            }
            vst2q_u8(d + 2 * i, x);
        }
    } else if (dt == FT_F32) {
        for (; i + 16 <= n; i += 16) {
            uint8x16_t e = vld1q_u8(P[0] + i), sm = vld1q_u8(P[1] + i);
            uint8x16x4_t x;
            x.val[3] = vbslq_u8(hib, sm, vshrq_n_u8(e, 1));
            x.val[2] = vbslq_u8(hib, vshlq_n_u8(e, 7), sm);
            x.val[1] = vld1q_u8(P[2] + i);
            x.val[0] = vld1q_u8(P[3] + i);
            vst4q_u8(d + 4 * i, x);
        }
    }
    return i;
}
#endif

size_t ft_bp_split_neon(ft_dtype dt, const void *src, size_t n, uint8_t *const *planes)
{
#ifdef FT_BP_NEON
    if (ft_cpu()->neon) return split_neon(dt, src, n, planes);
#endif
    (void)dt; (void)src; (void)n; (void)planes;
    return 0;
}

size_t ft_bp_merge_neon(ft_dtype dt, const uint8_t *const *planes, size_t n, void *dst)
{
#ifdef FT_BP_NEON
    if (ft_cpu()->neon) return merge_neon(dt, planes, n, dst);
#endif
    (void)dt; (void)planes; (void)n; (void)dst;
    return 0;
}

size_t ft_bp_split_avx512(ft_dtype dt, const void *src, size_t n, uint8_t *const *planes)
{
#ifdef FT_BP_X86
    if (ft_cpu()->avx512f && ft_cpu()->avx512bw) return split_avx512(dt, src, n, planes);
#endif
    (void)dt; (void)src; (void)n; (void)planes;
    return 0;
}

size_t ft_bp_merge_avx512(ft_dtype dt, const uint8_t *const *planes, size_t n, void *dst)
{
#ifdef FT_BP_X86
    if (ft_cpu()->avx512f && ft_cpu()->avx512bw) return merge_avx512(dt, planes, n, dst);
#endif
    (void)dt; (void)planes; (void)n; (void)dst;
    return 0;
}

size_t ft_bp_split_avx2(ft_dtype dt, const void *src, size_t n, uint8_t *const *planes)
{
#ifdef FT_BP_X86
    if (ft_cpu()->avx2) return split_avx2(dt, src, n, planes);
#endif
    (void)dt; (void)src; (void)n; (void)planes;
    return 0;
}

size_t ft_bp_merge_avx2(ft_dtype dt, const uint8_t *const *planes, size_t n, void *dst)
{
#ifdef FT_BP_X86
    if (ft_cpu()->avx2) return merge_avx2(dt, planes, n, dst);
#endif
    (void)dt; (void)planes; (void)n; (void)dst;
    return 0;
}

void ft_bp_split(ft_dtype dt, const void *src, size_t n, uint8_t *const *planes)
{
    size_t i = 0;
    if (ft_simd_enabled()) {
        i = ft_bp_split_avx512(dt, src, n, planes);
        if (i == 0) i = ft_bp_split_avx2(dt, src, n, planes);
        if (i == 0) i = ft_bp_split_neon(dt, src, n, planes);
    }
    split_from(dt, src, i, n, planes);
}

void ft_bp_merge(ft_dtype dt, const uint8_t *const *planes, size_t n, void *dst)
{
    size_t i = 0;
    if (ft_simd_enabled()) {
        i = ft_bp_merge_avx512(dt, planes, n, dst);
        if (i == 0) i = ft_bp_merge_avx2(dt, planes, n, dst);
        if (i == 0) i = ft_bp_merge_neon(dt, planes, n, dst);
    }
    merge_from(dt, planes, i, n, dst);
}

/* ------------------------------------------------------------ the codec */

size_t ft_bp_bound(const ft_frame_info *fi, size_t raw_bytes)
{
    unsigned np = ft_bp_nplanes(fi->dtype);
    if (np == 0) np = FT_BP_MAX_PLANES;
    /* modes byte + one size per plane + planes never larger than raw */
    return 1 + 4 * (size_t)np + raw_bytes;
}

static int plane_is_const(const uint8_t *p, size_t n)
{
    if (n == 0) return 0;
    uint8_t c = p[0];
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {   /* block test vectorizes; exit per block */
        uint8_t acc = 0;
        for (size_t k = 0; k < 64; k++) acc |= (uint8_t)(p[i + k] ^ c);
        if (acc) return 0;
    }
    for (; i < n; i++)
        if (p[i] != c) return 0;
    return 1;
}

/* Cheap test of whether entropy coding a plane can pay: the order-0
 * entropy of a sample of up to 64 runs of 64 bytes spread over the plane.
 * Planes of random mantissa bits estimate at ~7.95 bits/byte (the sample
 * biases the estimate low by ~0.05); they are stored raw without running
 * the entropy coder, which would cost as much time as everything else.
 * Data whose redundancy is only in long repeats (flat histogram) is
 * stored raw too: documented limitation, weights do not look like that. */
#define BP_SAMPLE_RUNS 64
#define BP_SAMPLE_RUN 64
#define BP_MAX_BITS 7.8
static int plane_worth_coding(const uint8_t *p, size_t n)
{
    if (n < 64) return 0;   /* headers would eat any gain */
    uint32_t h[256] = {0};
    size_t total = 0;
    if (n <= BP_SAMPLE_RUNS * BP_SAMPLE_RUN) {
        for (size_t i = 0; i < n; i++) h[p[i]]++;
        total = n;
    } else {
        size_t step = (n - BP_SAMPLE_RUN) / (BP_SAMPLE_RUNS - 1);
        for (size_t r = 0; r < BP_SAMPLE_RUNS; r++) {
            const uint8_t *q = p + r * step;
            for (size_t k = 0; k < BP_SAMPLE_RUN; k++) h[q[k]]++;
        }
        total = BP_SAMPLE_RUNS * BP_SAMPLE_RUN;
    }
    double bits = 0, inv = 1.0 / (double)total;
    for (int s = 0; s < 256; s++)
        if (h[s]) {
            double f = h[s] * inv;
            bits -= f * log2(f);
        }
    return bits <= BP_MAX_BITS;
}

static ft_status plane_encode(ft_worker_ws *ws, const ft_frame_info *fi, const uint8_t *src,
                              size_t n, uint8_t *dst, size_t cap, size_t *out)
{
    /* Level 0 with zstd: literal-only zstd frames (Huffman, no match
     * search); see docs/codec-byteplane.md for the measurements. */
    if (fi->entropy == FT_CODEC_ZSTD && fi->level == 0)
        return ft_zstd_literals_encode(ws, src, n, dst, cap, out);
    return ft_entropy_encode(ws, fi->entropy, fi->level, src, n, dst, cap, out);
}

ft_status ft_bp_encode_chunk(ft_worker_ws *ws, const ft_frame_info *fi, const void *src,
                             size_t raw_bytes, void *dst, size_t cap, size_t *out)
{
    unsigned np = ft_bp_nplanes(fi->dtype);
    if (np == 0)
        return ft_set_error(FT_ERR_INVALID_ARG, "byteplane: dtype %s is not a float",
                            ft_dtype_name(fi->dtype));
    size_t es = ft_dtype_bits(fi->dtype) / 8;
    if (raw_bytes % es) return ft_set_error(FT_ERR_INVALID_ARG, "byteplane: partial element");
    size_t n = raw_bytes / es;
    size_t hmax = 1 + 4 * (size_t)np;
    if (cap < hmax) return FT_ERR_BUFFER_SMALL;
    uint8_t *planes = ft_ws_scratch(ws, 0, raw_bytes);
    if (!planes) return FT_ERR_NOMEM;
    uint8_t *P[FT_BP_MAX_PLANES];
    for (unsigned k = 0; k < np; k++) P[k] = planes + k * n;
    ft_bp_split(fi->dtype, src, n, P);

    /* Payloads go after the largest header; the header is written and the
     * payloads moved down once the number of coded planes is known. */
    uint8_t *d = dst;
    size_t pos = hmax;
    unsigned modes = 0, ne = 0;
    uint32_t sizes[FT_BP_MAX_PLANES];
    for (unsigned k = 0; k < np; k++) {
        unsigned mode = BP_RAW;
        size_t len = n;
        if (plane_is_const(P[k], n)) {
            mode = BP_CONST;
            len = 1;
            if (cap - pos < 1) return FT_ERR_BUFFER_SMALL;
            d[pos] = P[k][0];
        } else if (plane_worth_coding(P[k], n)) {
            size_t got = 0;
            ft_status st = plane_encode(ws, fi, P[k], n, d + pos, cap - pos, &got);
            if (st == FT_OK && got > 0 && got < n && got <= UINT32_MAX) {
                mode = BP_ENTROPY;
                len = got;
                sizes[ne++] = (uint32_t)got;
            } else if (st != FT_OK && st != FT_ERR_BUFFER_SMALL) {
                return st;
            }
        }
        if (mode == BP_RAW) {
            if (cap - pos < n) return FT_ERR_BUFFER_SMALL;
            memcpy(d + pos, P[k], n);
        }
        modes |= mode << (2 * k);
        pos += len;
    }
    size_t hs = 1 + 4 * (size_t)ne;
    if (hs != hmax) memmove(d + hs, d + hmax, pos - hmax);
    d[0] = (uint8_t)modes;
    for (unsigned j = 0; j < ne; j++) {
        uint32_t v = sizes[j];
        for (int b = 0; b < 4; b++) d[1 + 4 * j + b] = (uint8_t)(v >> (8 * b));
    }
    *out = pos - (hmax - hs);
    return FT_OK;
}

ft_status ft_bp_decode_chunk(ft_worker_ws *ws, const ft_frame_info *fi, const void *src,
                             size_t n_in, void *dst, size_t raw_bytes)
{
    unsigned np = ft_bp_nplanes(fi->dtype);
    if (np == 0)
        return ft_set_error(FT_ERR_CORRUPT, "byteplane frame of non-float dtype %s",
                            ft_dtype_name(fi->dtype));
    size_t es = ft_dtype_bits(fi->dtype) / 8;
    if (raw_bytes % es)
        return ft_set_error(FT_ERR_CORRUPT, "byteplane chunk of %zu bytes is not whole elements",
                            raw_bytes);
    size_t n = raw_bytes / es;
    const uint8_t *s = src;
    if (n_in < 1) return ft_set_error(FT_ERR_CORRUPT, "byteplane chunk: empty payload");
    unsigned modes = s[0], ne = 0;
    if (np < 4 && (modes >> (2 * np)))
        return ft_set_error(FT_ERR_CORRUPT, "byteplane chunk: unused mode bits set (0x%02x)", modes);
    for (unsigned k = 0; k < np; k++) {
        unsigned m = (modes >> (2 * k)) & 3;
        if (m == 3) return ft_set_error(FT_ERR_CORRUPT, "byteplane chunk: plane %u has mode 3", k);
        if (m == BP_ENTROPY) ne++;
    }
    size_t hs = 1 + 4 * (size_t)ne;
    if (n_in < hs)
        return ft_set_error(FT_ERR_CORRUPT, "byteplane chunk: %zu bytes, header needs %zu", n_in, hs);
    /* Plane sources: raw planes are read in place from the payload. */
    const uint8_t *P[FT_BP_MAX_PLANES];
    const uint8_t *sp[FT_BP_MAX_PLANES];
    size_t sl[FT_BP_MAX_PLANES];
    size_t pos = hs;
    unsigned j = 0, nscratch = 0;
    for (unsigned k = 0; k < np; k++) {
        unsigned m = (modes >> (2 * k)) & 3;
        size_t len;
        if (m == BP_RAW) len = n;
        else if (m == BP_CONST) len = 1;
        else {
            const uint8_t *q = s + 1 + 4 * j++;
            len = (size_t)q[0] | (size_t)q[1] << 8 | (size_t)q[2] << 16 | (size_t)q[3] << 24;
            if (len == 0 || len >= n)
                return ft_set_error(FT_ERR_CORRUPT,
                                    "byteplane chunk: plane %u coded size %zu outside 1..%zu",
                                    k, len, n ? n - 1 : 0);
        }
        if (m != BP_RAW) nscratch++;
        if (len > n_in - pos)
            return ft_set_error(FT_ERR_CORRUPT,
                                "byteplane chunk: plane %u (%zu bytes) overruns the payload", k, len);
        sp[k] = s + pos;
        sl[k] = len;
        pos += len;
    }
    if (pos != n_in)
        return ft_set_error(FT_ERR_CORRUPT, "byteplane chunk: %zu trailing bytes", n_in - pos);
    if (n == 0) return FT_OK;
    uint8_t *scratch = NULL;
    if (nscratch && !(scratch = ft_ws_scratch(ws, 0, nscratch * n))) return FT_ERR_NOMEM;
    unsigned used = 0;
    for (unsigned k = 0; k < np; k++) {
        unsigned m = (modes >> (2 * k)) & 3;
        if (m == BP_RAW) { P[k] = sp[k]; continue; }
        uint8_t *t = scratch + (size_t)used++ * n;
        if (m == BP_CONST) {
            memset(t, sp[k][0], n);
        } else {
            /* zstd: the literal-only frames this codec writes have a fast
             * decoder; anything else it leaves to libzstd */
            ft_status st = FT_ERR_UNSUPPORTED;
            if (fi->entropy == FT_CODEC_ZSTD) st = ft_zstd_lit_decode(ws, sp[k], sl[k], t, n);
            if (st == FT_ERR_UNSUPPORTED) st = ft_entropy_decode(ws, fi->entropy, sp[k], sl[k], t, n);
            if (st) return st;
        }
        P[k] = t;
    }
    ft_bp_merge(fi->dtype, P, n, dst);
    return FT_OK;
}
