/* AVX-512 group-quantization kernels (see quant_kern.h for the contract).
 * Each kernel handles the aligned bulk and hands heads (an odd q4 start)
 * and tails to its scalar twin, so results equal ft_qkern_ref() bit for
 * bit: decode is (float)q * step + min (the product is exact, so the FMA
 * used here rounds exactly like the scalar multiply-add), bf16 output uses
 * the same integer round-to-nearest-even as ft_f32_to_bf16_1 (not
 * VCVTNEPS2BF16, which flushes subnormals), f16 output VCVTPS2PH with RNE
 * (which ft_f32_to_f16_1 mirrors, NaN handling included). */
#include "quant_kern.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define TGT __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#define AI  __attribute__((always_inline)) inline

/* ----------------------------------------------------------------- loads */

static TGT AI __m512 q8_16(const uint8_t *p)
{
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)));
}

/* 16 bytes of nibbles -> 32 values, element order (low nibble first). */
static TGT AI void q4_32(const uint8_t *p, __m512 *a, __m512 *b)
{
    const __m128i m = _mm_set1_epi8(15);
    __m128i v = _mm_loadu_si128((const __m128i *)p);
    __m128i lo = _mm_and_si128(v, m), hi = _mm_and_si128(_mm_srli_epi16(v, 4), m);
    *a = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi)));
    *b = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpackhi_epi8(lo, hi)));
}

/* 8 bytes of nibbles -> 16 values. */
static TGT AI __m512 q4_16(const uint8_t *p)
{
    const __m128i m = _mm_set1_epi8(15);
    __m128i v = _mm_loadl_epi64((const __m128i *)p);
    __m128i lo = _mm_and_si128(v, m), hi = _mm_and_si128(_mm_srli_epi16(v, 4), m);
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi)));
}

static TGT AI __m512 ld_x(ft_dtype dt, const void *p, size_t i)
{
    if (dt == FT_F32) return _mm512_loadu_ps((const float *)p + i);
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i));
    if (dt == FT_BF16) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    return _mm512_cvtph_ps(h);
}

/* ---------------------------------------------------------------- stores */

static TGT AI __m256i to_bf16(__m512 y)
{
    __m512i u = _mm512_castps_si512(y);
    __mmask16 nan = _mm512_cmp_ps_mask(y, y, _CMP_UNORD_Q);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb));
    r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(u, _mm512_set1_epi32(0x400000)));
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16));
}

static TGT AI void st_y(ft_dtype dt, void *out, size_t i, __m512 y)
{
    if (dt == FT_F32) _mm512_storeu_ps((float *)out + i, y);
    else if (dt == FT_BF16) _mm256_storeu_si256((__m256i *)((uint16_t *)out + i), to_bf16(y));
    else _mm256_storeu_si256((__m256i *)((uint16_t *)out + i),
                             _mm512_cvtps_ph(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

static inline size_t osize(ft_dtype dt) { return dt == FT_F32 ? 4 : 2; }

/* ---------------------------------------------------------------- decode */

/* vec = 0: broadcast (mn0, st0); vec = 1: per-element arrays. */
static TGT AI void dec_impl(int bits, ft_dtype odt, int vec, const uint8_t *p, uint64_t k,
                            size_t n, float mn0, float st0, const float *mn, const float *st,
                            void *out)
{
    size_t i = 0;
    if (bits == 4 && (k & 1) && n) {
        if (vec) ft_qdec_vec_ref(4, odt, p, k, 1, mn, st, out);
        else ft_qdec_bcast_ref(4, odt, p, k, 1, mn0, st0, out);
        i = 1;
    }
    const __m512 bm = _mm512_set1_ps(mn0), bs = _mm512_set1_ps(st0);
#define MN(o) (vec ? _mm512_loadu_ps(mn + i + (o)) : bm)
#define ST(o) (vec ? _mm512_loadu_ps(st + i + (o)) : bs)
    if (bits == 4) {
        for (; i + 32 <= n; i += 32) {
            __m512 a, b;
            q4_32(p + ((k + i) >> 1), &a, &b);
            st_y(odt, out, i, _mm512_fmadd_ps(a, ST(0), MN(0)));
            st_y(odt, out, i + 16, _mm512_fmadd_ps(b, ST(16), MN(16)));
        }
        if (i + 16 <= n) {
            st_y(odt, out, i, _mm512_fmadd_ps(q4_16(p + ((k + i) >> 1)), ST(0), MN(0)));
            i += 16;
        }
    } else {
        for (; i + 16 <= n; i += 16)
            st_y(odt, out, i, _mm512_fmadd_ps(q8_16(p + k + i), ST(0), MN(0)));
    }
#undef MN
#undef ST
    if (i < n) {
        void *o = (uint8_t *)out + i * osize(odt);
        if (vec) ft_qdec_vec_ref(bits, odt, p, k + i, n - i, mn + i, st + i, o);
        else ft_qdec_bcast_ref(bits, odt, p, k + i, n - i, mn0, st0, o);
    }
}

#define DEC_CASES(VEC, ...)                                                  \
    switch ((bits == 4 ? 3 : 0) + (odt == FT_F32 ? 0 : odt == FT_BF16 ? 1 : 2)) { \
    case 0: dec_impl(8, FT_F32, VEC, __VA_ARGS__); break;                    \
    case 1: dec_impl(8, FT_BF16, VEC, __VA_ARGS__); break;                   \
    case 2: dec_impl(8, FT_F16, VEC, __VA_ARGS__); break;                    \
    case 3: dec_impl(4, FT_F32, VEC, __VA_ARGS__); break;                    \
    case 4: dec_impl(4, FT_BF16, VEC, __VA_ARGS__); break;                   \
    default: dec_impl(4, FT_F16, VEC, __VA_ARGS__); break;                   \
    }

TGT static void dec_bcast_avx512(int bits, ft_dtype odt, const uint8_t *p, uint64_t k, size_t n,
                                 float mn, float step, void *out)
{
    DEC_CASES(0, p, k, n, mn, step, NULL, NULL, out)
}

TGT static void dec_vec_avx512(int bits, ft_dtype odt, const uint8_t *p, uint64_t k, size_t n,
                               const float *mn, const float *step, void *out)
{
    DEC_CASES(1, p, k, n, 0.0f, 0.0f, mn, step, out)
}

/* ---------------------------------------------------------------- minmax */

static TGT AI __mmask16 nonfinite(__m512 x)
{
    const __m512i e = _mm512_set1_epi32(0x7f800000);
    return _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_castps_si512(x), e), e);
}

static TGT AI int minmax_impl(ft_dtype dt, const void *src, size_t n, float *mn, float *mx)
{
    __m512 a = _mm512_set1_ps(*mn), b = _mm512_set1_ps(*mx);
    __m512 a2 = a, b2 = b;
    __mmask16 bad = 0;
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512 x = ld_x(dt, src, i), y = ld_x(dt, src, i + 16);
        bad |= nonfinite(x) | nonfinite(y);
        a = _mm512_min_ps(a, x); b = _mm512_max_ps(b, x);
        a2 = _mm512_min_ps(a2, y); b2 = _mm512_max_ps(b2, y);
    }
    for (; i + 16 <= n; i += 16) {
        __m512 x = ld_x(dt, src, i);
        bad |= nonfinite(x);
        a = _mm512_min_ps(a, x); b = _mm512_max_ps(b, x);
    }
    if (bad) return 1;
    float lo = _mm512_reduce_min_ps(_mm512_min_ps(a, a2));
    float hi = _mm512_reduce_max_ps(_mm512_max_ps(b, b2));
    if (ft_qminmax_ref(dt, (const uint8_t *)src + i * (dt == FT_F32 ? 4 : 2), n - i, &lo, &hi))
        return 1;
    *mn = lo;
    *mx = hi;
    return 0;
}

TGT static int minmax_avx512(ft_dtype dt, const void *src, size_t n, float *mn, float *mx)
{
    if (dt == FT_F32) return minmax_impl(FT_F32, src, n, mn, mx);
    if (dt == FT_BF16) return minmax_impl(FT_BF16, src, n, mn, mx);
    return minmax_impl(FT_F16, src, n, mn, mx);
}

static TGT AI int minmax_vec_impl(ft_dtype dt, const void *src, size_t n, float *mn, float *mx)
{
    __mmask16 bad = 0;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 x = ld_x(dt, src, i);
        bad |= nonfinite(x);
        _mm512_storeu_ps(mn + i, _mm512_min_ps(_mm512_loadu_ps(mn + i), x));
        _mm512_storeu_ps(mx + i, _mm512_max_ps(_mm512_loadu_ps(mx + i), x));
    }
    if (bad) return 1;
    return ft_qminmax_vec_ref(dt, (const uint8_t *)src + i * (dt == FT_F32 ? 4 : 2), n - i,
                              mn + i, mx + i);
}

TGT static int minmax_vec_avx512(ft_dtype dt, const void *src, size_t n, float *mn, float *mx)
{
    if (dt == FT_F32) return minmax_vec_impl(FT_F32, src, n, mn, mx);
    if (dt == FT_BF16) return minmax_vec_impl(FT_BF16, src, n, mn, mx);
    return minmax_vec_impl(FT_F16, src, n, mn, mx);
}

/* ---------------------------------------------------------------- encode */

static TGT AI __m512i quant16(__m512 x, __m512 mn, __m512 inv, __m512 bmax)
{
    __m512 t = _mm512_mul_ps(_mm512_sub_ps(x, mn), inv);
    t = _mm512_min_ps(_mm512_max_ps(t, _mm512_setzero_ps()), bmax);
    return _mm512_cvt_roundps_epi32(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

/* 32 values (0..15) -> 16 bytes, low nibble = even element. */
static TGT AI __m128i pack4(__m512i a, __m512i b)
{
    __m128i qa = _mm512_cvtepi32_epi8(a), qb = _mm512_cvtepi32_epi8(b);
    const __m128i m = _mm_set1_epi16(0x00ff);
    qa = _mm_and_si128(_mm_or_si128(qa, _mm_srli_epi16(qa, 4)), m);
    qb = _mm_and_si128(_mm_or_si128(qb, _mm_srli_epi16(qb, 4)), m);
    return _mm_packus_epi16(qa, qb);
}

static TGT AI void enc_impl(int bits, ft_dtype idt, int vec, const void *src, size_t n,
                            float mn0, float inv0, const float *mn, const float *inv,
                            uint8_t *p, uint64_t k)
{
    size_t i = 0;
    if (bits == 4 && (k & 1) && n) {
        if (vec) ft_qenc_vec_ref(4, idt, src, 1, mn, inv, p, k);
        else ft_qenc_bcast_ref(4, idt, src, 1, mn0, inv0, p, k);
        i = 1;
    }
    const __m512 bm = _mm512_set1_ps(mn0), bi = _mm512_set1_ps(inv0);
    const __m512 bmax = _mm512_set1_ps((float)((1u << bits) - 1));
#define MN(o) (vec ? _mm512_loadu_ps(mn + i + (o)) : bm)
#define IV(o) (vec ? _mm512_loadu_ps(inv + i + (o)) : bi)
    if (bits == 4) {
        for (; i + 32 <= n; i += 32) {
            __m512i a = quant16(ld_x(idt, src, i), MN(0), IV(0), bmax);
            __m512i b = quant16(ld_x(idt, src, i + 16), MN(16), IV(16), bmax);
            _mm_storeu_si128((__m128i *)(p + ((k + i) >> 1)), pack4(a, b));
        }
    } else {
        for (; i + 16 <= n; i += 16)
            _mm_storeu_si128((__m128i *)(p + k + i),
                             _mm512_cvtepi32_epi8(quant16(ld_x(idt, src, i), MN(0), IV(0), bmax)));
    }
#undef MN
#undef IV
    if (i < n) {
        const void *s = (const uint8_t *)src + i * (idt == FT_F32 ? 4 : 2);
        if (vec) ft_qenc_vec_ref(bits, idt, s, n - i, mn + i, inv + i, p, k + i);
        else ft_qenc_bcast_ref(bits, idt, s, n - i, mn0, inv0, p, k + i);
    }
}

#define ENC_CASES(VEC, ...)                                                  \
    switch ((bits == 4 ? 3 : 0) + (idt == FT_F32 ? 0 : idt == FT_BF16 ? 1 : 2)) { \
    case 0: enc_impl(8, FT_F32, VEC, __VA_ARGS__); break;                    \
    case 1: enc_impl(8, FT_BF16, VEC, __VA_ARGS__); break;                   \
    case 2: enc_impl(8, FT_F16, VEC, __VA_ARGS__); break;                    \
    case 3: enc_impl(4, FT_F32, VEC, __VA_ARGS__); break;                    \
    case 4: enc_impl(4, FT_BF16, VEC, __VA_ARGS__); break;                   \
    default: enc_impl(4, FT_F16, VEC, __VA_ARGS__); break;                   \
    }

TGT static void enc_bcast_avx512(int bits, ft_dtype idt, const void *src, size_t n, float mn,
                                 float inv, uint8_t *p, uint64_t k)
{
    ENC_CASES(0, src, n, mn, inv, NULL, NULL, p, k)
}

TGT static void enc_vec_avx512(int bits, ft_dtype idt, const void *src, size_t n,
                               const float *mn, const float *inv, uint8_t *p, uint64_t k)
{
    ENC_CASES(1, src, n, 0.0f, 0.0f, mn, inv, p, k)
}

static const ft_qkern qkern_avx512 = {
    "avx512", dec_bcast_avx512, dec_vec_avx512, minmax_avx512, minmax_vec_avx512,
    enc_bcast_avx512, enc_vec_avx512};

const ft_qkern *ft_qkern_avx512(void)
{
    const ft_cpu_features *c = ft_cpu();
    return c->avx512f && c->avx512bw && c->avx512vl && c->f16c ? &qkern_avx512 : NULL;
}

#else
const ft_qkern *ft_qkern_avx512(void) { return NULL; }
#endif
