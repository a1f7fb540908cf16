/* SIMD products on stored weights (contract: wkernels.h). Compiled per
 * function with target attributes, chosen at run time by wkernels.c.
 *
 *   x as given, bf16/f16 weights (decode): "dot style": both operands
 *       contiguous along the input dimension, so stored rows are used in
 *       place; 4 weight rows x up to 6 rows of x per block (24 vector
 *       accumulators of partial sums, reduced once per output); each
 *       weight vector widened once (bf16: shift, f16: vcvtph2ps) and used
 *       for every row. f32 weights: the engine's ft_k_matmul_rows /
 *       ft_k_matmul_xt.
 *   x transposed (prefill; f32 >= 16 rows, bf16/f16 >= 25): per block of
 *       12 weight rows x 512 columns an f32 panel (copied, widened or
 *       dequantized by the codec's kernels; constant row stride, so one
 *       register addresses all 12 rows) is broadcast against 32-row
 *       vectors of x: 24 accumulators, no horizontal sums. Columns outer
 *       for prefill (x's slice stays in L2), tiles stored through 16 x 16
 *       transposes; decode prefetches the next panel's source while a
 *       panel is computed on.
 *   q8/q4 (int8 x): VNNI vpdpbusd, u8 weights x s8 activations, int32
 *       lanes converted and scaled by step * xs per group; the min terms
 *       m * xs * sum(xq) lane-wise, 16 groups at a time. One row: 64-element
 *       units (q4: 32 bytes broadcast to both halves, the upper half
 *       shifted by 4, masked to nibbles). Quads of rows: one 16-element
 *       sub-block broadcast to the four 128-bit lanes serves 4 rows per
 *       instruction. AVX2: vpmaddubsw + vpmaddwd; q8 bytes made signed
 *       (q - 128) and multiplied as |w'| x sign(x, w') so that pair sums
 *       cannot saturate (<= 2 * 128 * 127), the dropped 128 * sum(xq)
 *       folded into the min term. */
#include "wkernels.h"
#include "kernels.h"
#include "flextier/core.h"
#include "codec/quant_kern.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>

#define INL inline __attribute__((always_inline))
#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#define VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#define BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx512bf16,avx2,fma,f16c")))
/* Register blocking needs the small constant loops unrolled. Sanitizer
 * builds skip that (the arrays then live in memory: slower, the same
 * results), which keeps clang's ASan/UBSan/libFuzzer build of this file
 * from taking minutes. */
#if defined(__SANITIZE_ADDRESS__)
#define FT_WK_SANITIZE 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FT_WK_SANITIZE 1
#endif
#endif
#ifdef FT_WK_SANITIZE
#define UNROLL
#else
#define UNROLL _Pragma("GCC unroll 32")
#endif

static inline float f16_1(const uint8_t *p) { return ft_f16_to_f32_1((uint16_t)(p[0] | p[1] << 8)); }

/* ================================================================ AVX2 */

AVX2 static INL float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* 8 16-bit values (bf16 or f16) widened to f32. */
AVX2 static INL __m256 h8(const uint16_t *p, int f16)
{
    __m128i v = _mm_loadu_si128((const __m128i *)p);
    return f16 ? _mm256_cvtph_ps(v) : _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16));
}

static INL float h1(uint16_t v, int f16) { return f16 ? ft_f16_to_f32_1(v) : ft_bf16_to_f32_1(v); }

/* O weight rows x R activation rows (x f32). */
AVX2 static INL void hx2_blk(float *y, int ldy, const float *x, int ldx, const uint16_t *w, int cols,
                             const float *b, const int O, const int R, const int f16)
{
    __m256 acc[4][2];
    UNROLL for (int o = 0; o < O; o++) UNROLL for (int r = 0; r < R; r++) acc[o][r] = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= cols; i += 8) {
        __m256 wv[4];
        UNROLL for (int o = 0; o < O; o++) wv[o] = h8(w + (size_t)o * cols + i, f16);
        UNROLL for (int r = 0; r < R; r++) {
            __m256 xv = _mm256_loadu_ps(x + (size_t)r * ldx + i);
            UNROLL for (int o = 0; o < O; o++) acc[o][r] = _mm256_fmadd_ps(wv[o], xv, acc[o][r]);
        }
    }
    UNROLL for (int o = 0; o < O; o++) UNROLL for (int r = 0; r < R; r++) {
        float s = hsum8(acc[o][r]);
        for (int k = i; k < cols; k++) s += x[(size_t)r * ldx + k] * h1(w[(size_t)o * cols + k], f16);
        y[(size_t)r * ldy + o] = s + (b ? b[o] : 0.0f);
    }
}

AVX2 static void hx2(float *y, int ldy, const float *x, int ldx, int rows, const uint16_t *W, int cols,
                     int o0, int o1, const float *b, int f16)
{
    for (int o = o0; o < o1;) {
        int O = o1 - o >= 4 ? 4 : 1;
        const uint16_t *w = W + (size_t)o * cols;
        const float *bb = b ? b + o : NULL;
        for (int r = 0; r < rows;) {
            int R = rows - r >= 2 ? 2 : 1;
            float *yy = y + (size_t)r * ldy + o;
            const float *xx = x + (size_t)r * ldx;
            if (f16) {
                if (O == 4 && R == 2) hx2_blk(yy, ldy, xx, ldx, w, cols, bb, 4, 2, 1);
                else if (O == 4) hx2_blk(yy, ldy, xx, ldx, w, cols, bb, 4, 1, 1);
                else if (R == 2) hx2_blk(yy, ldy, xx, ldx, w, cols, bb, 1, 2, 1);
                else hx2_blk(yy, ldy, xx, ldx, w, cols, bb, 1, 1, 1);
            } else {
                if (O == 4 && R == 2) hx2_blk(yy, ldy, xx, ldx, w, cols, bb, 4, 2, 0);
                else if (O == 4) hx2_blk(yy, ldy, xx, ldx, w, cols, bb, 4, 1, 0);
                else if (R == 2) hx2_blk(yy, ldy, xx, ldx, w, cols, bb, 1, 2, 0);
                else hx2_blk(yy, ldy, xx, ldx, w, cols, bb, 1, 1, 0);
            }
            r += R;
        }
        o += O;
    }
}

AVX2 static void attend_h_avx2(float *out, const float *q, const uint16_t *K, const uint16_t *V, int ld,
                               int npos, int hd, float scale, float *sc, int f16)
{
    for (int p = 0; p < npos; p++) {
        const uint16_t *k = K + (size_t)p * ld;
        __m256 s = _mm256_setzero_ps();
        int i = 0;
        for (; i + 8 <= hd; i += 8) s = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), h8(k + i, f16), s);
        float t = hsum8(s);
        for (; i < hd; i++) t += q[i] * h1(k[i], f16);
        sc[p] = t * scale;
    }
    ft_k_softmax(sc, npos);
    for (int i = 0; i < hd; i++) out[i] = 0.0f;
    for (int p = 0; p < npos; p++) {
        const uint16_t *v = V + (size_t)p * ld;
        __m256 w = _mm256_set1_ps(sc[p]);
        int i = 0;
        for (; i + 8 <= hd; i += 8)
            _mm256_storeu_ps(out + i, _mm256_fmadd_ps(w, h8(v + i, f16), _mm256_loadu_ps(out + i)));
        for (; i < hd; i++) out[i] += sc[p] * h1(v[i], f16);
    }
}

/* ============================================================= AVX-512 */

/* Batch-1 products stream their weights once: a block of O rows is read
 * while the rows `pf_ahead` further on (at least PF_AHEAD bytes ahead,
 * whole blocks; the same column) are prefetched into L2, one line per
 * 64 bytes of each row. Measured on AMD EPYC (Zen 4; docs/engine.md):
 * 1.2-2.2x over an L1 prefetch 16 groups ahead within the row; the same
 * rows prefetched into L1 instead of L2 gained 1.0-1.3x (q8/q4) and lost
 * 0.8x (bf16). */
#define PF_AHEAD 8192

/* bf16 batch 1 reads one weight row after another with no software
 * prefetch when x fits in this many bytes of L1 beside the stream: a
 * single sequential stream, which the hardware prefetchers follow from
 * page to page. Measured on AMD EPYC (Zen 4): 28-31 GB/s (the streaming
 * read's 27-31) against 24-27 with 4 rows and L2 prefetch ahead; with f32
 * x of 22 KiB (5632 columns) it lost (18 against 24 GB/s). */
#define B1_ONE 16384

/* FLEXTIER_WK_PREFETCH=row: the previous form instead (q8/q4: L1, 16
 * groups ahead within the row; bf16/f16: none), for A/B runs on other
 * CPUs (it was tuned on Sapphire Rapids). */
static int pf_row(void)
{
    static int v = -1;
    int x = __atomic_load_n(&v, __ATOMIC_RELAXED);
    if (x < 0) {
        const char *e = getenv("FLEXTIER_WK_PREFETCH");
        x = e && !strcmp(e, "row");
        __atomic_store_n(&v, x, __ATOMIC_RELAXED);
    }
    return x;
}

/* FLEXTIER_WK_PF_AHEAD=BYTES: another distance (benchmarks). */
static size_t pf_bytes(void)
{
    static long v = -1;
    long x = __atomic_load_n(&v, __ATOMIC_RELAXED);
    if (x < 0) {
        const char *e = getenv("FLEXTIER_WK_PF_AHEAD");
        x = e ? strtol(e, NULL, 10) : 0;
        x = x > 0 && x <= (64l << 20) ? x : PF_AHEAD;
        __atomic_store_n(&v, x, __ATOMIC_RELAXED);
    }
    return (size_t)x;
}

static int pf_ahead(size_t rowbytes, int O)
{
    if (pf_row()) return 0;
    size_t blk = rowbytes * (size_t)O, n = (pf_bytes() + blk - 1) / blk;
    return (int)(n ? n : 1) * O;
}

AVX512 static INL __m512 h16(const uint16_t *p, __mmask16 m, int f16)
{
    __m256i v = m == 0xffff ? _mm256_loadu_si256((const __m256i *)p) : _mm256_maskz_loadu_epi16(m, p);
    return f16 ? _mm512_cvtph_ps(v) : _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
}

/* O weight rows x R activation rows (x f32); masked tails. nx: the
 * weight rows a few blocks ahead (NULL: none), prefetched into L2 one
 * line per row every 32 columns (see PF_AHEAD). */
AVX512 static INL void hx512_blk(float *y, int ldy, const float *x, int ldx, const uint16_t *w, int cols,
                                 const float *b, const int O, const int R, const int f16, const uint16_t *nx,
                                 const float *xd, int ldd)
{
    __m512 acc[4][6], acc2[4][6];
    UNROLL for (int o = 0; o < O; o++) UNROLL for (int r = 0; r < R; r++) acc[o][r] = _mm512_setzero_ps();
    int i = 0;
    if (!f16 && xd) {
        /* bf16, x deinterleaved (ft_wk_act.xd): 32 weights per load, the
         * evens widened by a shift, the odds by an AND; one and two rows
         * keep the odds in their own accumulators (independent chains) */
        const __m512i hi = _mm512_set1_epi32((int)0xffff0000u);
        const int R2 = R <= 2 ? R : 0;
        UNROLL for (int o = 0; o < O; o++) UNROLL for (int r = 0; r < R2; r++) acc2[o][r] = _mm512_setzero_ps();
        for (; i + 32 <= cols; i += 32) {
            if (nx)
                UNROLL for (int o = 0; o < O; o++) _mm_prefetch((const char *)(nx + (size_t)o * cols + i), _MM_HINT_T1);
            __m512 we[4], wo[4];
            UNROLL for (int o = 0; o < O; o++) {
                __m512i v = _mm512_loadu_si512(w + (size_t)o * cols + i);
                we[o] = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
                wo[o] = _mm512_castsi512_ps(_mm512_and_si512(v, hi));
            }
            UNROLL for (int r = 0; r < R; r++) {
                __m512 xe = _mm512_loadu_ps(xd + (size_t)r * ldd + i), xo = _mm512_loadu_ps(xd + (size_t)r * ldd + i + 16);
                UNROLL for (int o = 0; o < O; o++) {
                    acc[o][r] = _mm512_fmadd_ps(we[o], xe, acc[o][r]);
                    if (R <= 2) acc2[o][r] = _mm512_fmadd_ps(wo[o], xo, acc2[o][r]);
                    else acc[o][r] = _mm512_fmadd_ps(wo[o], xo, acc[o][r]);
                }
            }
        }
        UNROLL for (int o = 0; o < O; o++) UNROLL for (int r = 0; r < R2; r++) acc[o][r] = _mm512_add_ps(acc[o][r], acc2[o][r]);
    }
    for (; i < cols; i += 16) {
        __mmask16 m = cols - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (cols - i)) - 1);
        if (nx && !(i & 31))
            UNROLL for (int o = 0; o < O; o++) _mm_prefetch((const char *)(nx + (size_t)o * cols + i), _MM_HINT_T1);
        __m512 wv[4];
        UNROLL for (int o = 0; o < O; o++) wv[o] = h16(w + (size_t)o * cols + i, m, f16);
        UNROLL for (int r = 0; r < R; r++) {
            __m512 xv = _mm512_maskz_loadu_ps(m, x + (size_t)r * ldx + i);
            UNROLL for (int o = 0; o < O; o++) acc[o][r] = _mm512_fmadd_ps(wv[o], xv, acc[o][r]);
        }
    }
    UNROLL for (int o = 0; o < O; o++) UNROLL for (int r = 0; r < R; r++)
        y[(size_t)r * ldy + o] = _mm512_reduce_add_ps(acc[o][r]) + (b ? b[o] : 0.0f);
}

#define HX512_R(O, F)                                                                          \
    switch (R) {                                                                               \
    case 6: hx512_blk(yy, ldy, xx, ldx, w, cols, bb, O, 6, F, nx, xdd, ldd); break;                          \
    case 5: hx512_blk(yy, ldy, xx, ldx, w, cols, bb, O, 5, F, nx, xdd, ldd); break;                          \
    case 4: hx512_blk(yy, ldy, xx, ldx, w, cols, bb, O, 4, F, nx, xdd, ldd); break;                          \
    case 3: hx512_blk(yy, ldy, xx, ldx, w, cols, bb, O, 3, F, nx, xdd, ldd); break;                          \
    case 2: hx512_blk(yy, ldy, xx, ldx, w, cols, bb, O, 2, F, nx, xdd, ldd); break;                          \
    default: hx512_blk(yy, ldy, xx, ldx, w, cols, bb, O, 1, F, nx, xdd, ldd); break;                         \
    }

/* X_F32 (rows < 25): blocks of at most 6 rows (4 x 6 accumulators;
 * the weight rows, 4 x cols x 2 bytes, stay in L1 between blocks). */
AVX512 static void hx512_f(float *y, int ldy, const float *x, int ldx, int rows, const uint16_t *W,
                           int cols, int o0, int o1, const float *b, int f16, const float *xd)
{
    const int ldd = cols & ~31;
    const int ahead = pf_ahead((size_t)cols * 2, 4);
    /* batch 1, bf16, x (deinterleaved, f32) at most 16 KiB: one weight row
     * at a time, no software prefetch: a single sequential stream, which
     * the hardware prefetchers follow across pages (B1_ONE) */
    const int one = rows == 1 && !f16 && xd && !pf_row() && (size_t)cols * 4 <= B1_ONE;
    for (int o = o0; o < o1;) {
        int O = o1 - o >= 4 && !one ? 4 : 1;
        const uint16_t *w = W + (size_t)o * cols;
        const float *bb = b ? b + o : NULL;
        for (int r = 0; r < rows;) {
            int R = rows - r >= 6 ? 6 : rows - r;
            /* the rows ahead, while the first rows of x pass over this block */
            const uint16_t *nx = r == 0 && !one && o + ahead + O <= o1 ? W + (size_t)(o + ahead) * cols : NULL;
            float *yy = y + (size_t)r * ldy + o;
            const float *xx = x + (size_t)r * ldx, *xdd = xd ? xd + (size_t)r * ldd : NULL;
            if (O == 4) { if (f16) { HX512_R(4, 1) } else { HX512_R(4, 0) } }
            else { if (f16) { HX512_R(1, 1) } else { HX512_R(1, 0) } }
            r += R;
        }
        o += O;
    }
}
#undef HX512_R

/* Attention for one query row over 16-bit K/V (as ft_k_attend_avx512):
 * scores 4 positions per step, the output row kept in registers
 * (hd <= 128). */
AVX512 static void attend_h_avx512(float *out, const float *q, const uint16_t *K, const uint16_t *V,
                                   int ld, int npos, int hd, float scale, float *sc, int f16)
{
    if (hd > 128) { attend_h_avx2(out, q, K, V, ld, npos, hd, scale, sc, f16); return; }
    int nch = (hd + 15) / 16;
    __mmask16 last = (hd % 16) ? (__mmask16)((1u << (hd % 16)) - 1) : (__mmask16)0xffff;
    __m512 qv[8];
    for (int c = 0; c < nch; c++) qv[c] = _mm512_maskz_loadu_ps(c == nch - 1 ? last : 0xffff, q + c * 16);
    int p = 0;
    for (; p + 4 <= npos; p += 4) {
        const uint16_t *k0 = K + (size_t)p * ld, *k1 = k0 + ld, *k2 = k1 + ld, *k3 = k2 + ld;
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int c = 0; c < nch; c++) {
            __mmask16 m = c == nch - 1 ? last : 0xffff;
            a0 = _mm512_fmadd_ps(qv[c], h16(k0 + c * 16, m, f16), a0);
            a1 = _mm512_fmadd_ps(qv[c], h16(k1 + c * 16, m, f16), a1);
            a2 = _mm512_fmadd_ps(qv[c], h16(k2 + c * 16, m, f16), a2);
            a3 = _mm512_fmadd_ps(qv[c], h16(k3 + c * 16, m, f16), a3);
        }
        sc[p] = _mm512_reduce_add_ps(a0) * scale;
        sc[p + 1] = _mm512_reduce_add_ps(a1) * scale;
        sc[p + 2] = _mm512_reduce_add_ps(a2) * scale;
        sc[p + 3] = _mm512_reduce_add_ps(a3) * scale;
    }
    for (; p < npos; p++) {
        const uint16_t *k0 = K + (size_t)p * ld;
        __m512 a0 = _mm512_setzero_ps();
        for (int c = 0; c < nch; c++) a0 = _mm512_fmadd_ps(qv[c], h16(k0 + c * 16, c == nch - 1 ? last : 0xffff, f16), a0);
        sc[p] = _mm512_reduce_add_ps(a0) * scale;
    }
    ft_k_softmax(sc, npos);
    __m512 acc[8];
    for (int c = 0; c < nch; c++) acc[c] = _mm512_setzero_ps();
    for (p = 0; p < npos; p++) {
        const uint16_t *v = V + (size_t)p * ld;
        __m512 w = _mm512_set1_ps(sc[p]);
        for (int c = 0; c < nch; c++) acc[c] = _mm512_fmadd_ps(w, h16(v + c * 16, c == nch - 1 ? last : 0xffff, f16), acc[c]);
    }
    for (int c = 0; c < nch; c++) _mm512_mask_storeu_ps(out + c * 16, c == nch - 1 ? last : 0xffff, acc[c]);
}

/* ======================================================== X_T products */

/* Columns per panel (K block): the f32 panel of OB <= 12 weight rows is
 * 12 * 512 * 4 = 24 KiB of stack; x's slice for all row blocks stays in
 * L2 (512 rows x 512 columns x 4 = 1 MiB). */
#define KC 512

/* Row o's values [k0, k0 + nk) as f32 into dst: bf16/f16 widened (core
 * converters), q8/q4 dequantized as the codec decodes them (its group
 * kernels when the range holds whole groups). */
static void wrow_f32(float *dst, const ft_wmat *W, int o, int k0, int nk)
{
    size_t off = (size_t)o * W->cols + (size_t)k0;
    if (W->fmt == FT_WF_BF16) { ft_bf16_to_f32(dst, (const uint16_t *)W->data + off, (size_t)nk); return; }
    if (W->fmt == FT_WF_F16) { ft_f16_to_f32(dst, (const uint16_t *)W->data + off, (size_t)nk); return; }
    const uint8_t *par, *vals;
    size_t e0;
    ft_wk_qrow(W, o, &par, &vals, &e0);
    int G = W->group, bits = W->fmt == FT_WF_Q8 ? 8 : 4;
    if (k0 % G == 0 && nk % G == 0) {
        ft_qkern_best()->dec_groups(bits, FT_F32, par + 4 * (size_t)(k0 / G), vals, e0 + (size_t)k0,
                                    (size_t)(nk / G), (size_t)G, dst);
        return;
    }
    for (int i = 0; i < nk; i++) {
        int g = (k0 + i) / G;
        size_t e = e0 + (size_t)k0 + (size_t)i;
        int q = bits == 4 ? (vals[e >> 1] >> ((e & 1) * 4)) & 15 : vals[e];
        dst[i] = (float)q * f16_1(par + 4 * g + 2) + f16_1(par + 4 * g);
    }
}

/* A tile computes tmp[j*ldx + r] = sum_{i < nk} xt[i*ldx + r] pan[j*KC + i]
 * for the OB panel rows j and the ldx rows of one block. The panel's
 * constant row stride lets one register address every weight row. */
typedef struct { const char *base; size_t stride; int rows, lines; } wk_pf;   /* lines of rows to prefetch */
typedef void (*xt_tile_fn)(float *tmp, const float *xt, int ldx, const float *pan, int nk, const wk_pf *pf, int add);

/* y rows (r < nr) += / = the 12 x 32 tile tmp[j*32 + r] (j < no): 16 x 16
 * transposes, then one masked vector per row (scalar stores, 32 rows 8 KiB
 * apart, all fall in one L1 set). The bias goes in with the last columns:
 * (y + t) + b, as the scalar path. */
AVX512 static void store_tile_512(float *y, int ldy, const float *tmp, int no, int nr, int first, const float *b)
{
    __mmask16 m = (__mmask16)((1u << no) - 1);
    __m512 bv = b ? _mm512_maskz_loadu_ps(m, b) : _mm512_setzero_ps();
    for (int h = 0; h < 2 && 16 * h < nr; h++) {
        __m512 r[16], t[16];
        for (int j = 0; j < 16; j++) r[j] = j < 12 ? _mm512_load_ps(tmp + (size_t)j * 32 + 16 * h) : _mm512_setzero_ps();
        for (int i = 0; i < 8; i++) {
            t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
            t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
        }
        for (int i = 0; i < 4; i++) {
            r[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
            r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
            r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
            r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
        }
        for (int i = 0; i < 4; i++) {
            t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
            t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xDD);
            t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
            t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xDD);
        }
        for (int i = 0; i < 8; i++) {
            r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
            r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xDD);
        }
        int n = nr - 16 * h < 16 ? nr - 16 * h : 16;
        for (int i = 0; i < n; i++) {
            float *yr = y + (size_t)(16 * h + i) * ldy;
            __m512 v = first ? r[i] : _mm512_add_ps(_mm512_maskz_loadu_ps(m, yr), r[i]);
            if (b) v = _mm512_add_ps(v, bv);
            _mm512_mask_storeu_ps(yr, m, v);
        }
    }
}

/* One panel (rows [o, o + no) x columns [k0, k0 + nk)) against row blocks
 * [b0, b1), accumulated into y (the bias with the last columns). run
 * (decode, AVX-512's 12 x 32 tile): the tile's running sum over the
 * column blocks, kept in tile order between the calls of one row block
 * (run = t0, then run + t, lane-wise); y is stored once, after the last
 * columns, as (run + t) + b: the same operations as storing y = t0 and
 * then y = (y + t) per block, without the transposes in between. */
static void xt_step(float *y, int ldy, const ft_wk_act *a, const ft_wmat *W, int o, int no, int k0, int nk,
                    int b0, int b1, const float *b, int OB, xt_tile_fn tile, float *pan, const wk_pf *pf,
                    float *run)
{
    const int ldx = a->ldx, cols = W->cols, last = k0 + nk == cols;
    float tmp_[12 * 32] __attribute__((aligned(64)));
    float *tmp = run && OB == 12 && ldx == 32 ? run : tmp_;
    /* the panel: rows read one after another (sequential streams for the
     * hardware prefetcher), widened / dequantized */
    for (int j = 0; j < OB; j++) {
        float *pj = pan + (size_t)j * KC;
        if (j >= no) memset(pj, 0, (size_t)nk * sizeof(float));
        else if (W->fmt == FT_WF_F32)
            memcpy(pj, (const float *)W->data + (size_t)(o + j) * cols + k0, (size_t)nk * sizeof(float));
        else wrow_f32(pj, W, o + j, k0, nk);
    }
    for (int bk = b0; bk < b1; bk++) {
        const int carry = tmp == run;
        tile(tmp, a->xt + ((size_t)bk * cols + (size_t)k0) * ldx, ldx, pan, nk, bk == b0 ? pf : NULL, carry && k0 > 0);
        int nr = a->rows - bk * ldx < ldx ? a->rows - bk * ldx : ldx;
        if (OB == 12 && ldx == 32) {   /* AVX-512: rows of the tile as vectors */
            if (carry && !last) continue;
            store_tile_512(y + (size_t)bk * ldx * ldy + o, ldy, tmp, no, nr, carry || k0 == 0, b && last ? b + o : NULL);
            continue;
        }
        for (int j = 0; j < no; j++) {
            float bj = b && last ? b[o + j] : 0.0f;
            float *yp = y + (size_t)bk * ldx * ldy + o + j;
            const float *t = tmp + (size_t)j * ldx;
            if (k0 == 0) for (int r = 0; r < nr; r++) yp[(size_t)r * ldy] = t[r] + bj;
            else for (int r = 0; r < nr; r++) yp[(size_t)r * ldy] = (yp[(size_t)r * ldy] + t[r]) + bj;
        }
    }
}

/* Row blocks per pass of a prefill: their x columns [k0, k0 + KC) (16 x
 * 32 x 512 x 4 = 1 MiB) stay in L2 while every panel of the range passes
 * over them (8: 20% slower at 512 x 2048 x 2048, the panels refilled
 * twice as often). */
#define XT_BLKS 16

static void product_xt(float *y, int ldy, const ft_wk_act *a, const ft_wmat *W, int o0, int o1,
                       const float *b, int OB, xt_tile_fn tile)
{
    const int cols = W->cols, q = W->fmt == FT_WF_Q8 || W->fmt == FT_WF_Q4;
    int kc = KC;
    if (q && W->group <= KC) kc = KC / W->group * W->group;
    float pan[12 * KC] __attribute__((aligned(64)));
    if (a->nblk > 1) {   /* prefill: columns outer, so x's slice is reused from L2 */
        for (int b0 = 0; b0 < a->nblk; b0 += XT_BLKS) {
            int b1 = a->nblk - b0 < XT_BLKS ? a->nblk : b0 + XT_BLKS;
            for (int k0 = 0; k0 < cols; k0 += kc) {
                int nk = cols - k0 < kc ? cols - k0 : kc;
                for (int o = o0; o < o1; o += OB)
                    xt_step(y, ldy, a, W, o, o1 - o < OB ? o1 - o : OB, k0, nk, b0, b1, b, OB, tile, pan, NULL, NULL);
            }
        }
        return;
    }
    /* decode (one block of rows): each panel's arithmetic overlaps the
     * prefetch of the next panel's source (f32/bf16/f16); the tile's
     * running sum stays in run across the column blocks (xt_step) */
    float run[12 * 32] __attribute__((aligned(64)));
    for (int o = o0; o < o1; o += OB) {
        int no = o1 - o < OB ? o1 - o : OB;
        for (int k0 = 0; k0 < cols; k0 += kc) {
            int nk = cols - k0 < kc ? cols - k0 : kc;
            wk_pf pf = {NULL, 0, 0, 0};
            if (!q) {
                int no2 = k0 + nk < cols ? no : (o1 - o - OB < OB ? o1 - o - OB : OB);
                int nk2 = k0 + nk < cols ? (cols - k0 - nk < kc ? cols - k0 - nk : kc) : (cols < kc ? cols : kc);
                size_t es = W->fmt == FT_WF_F32 ? 4 : 2;
                size_t first = k0 + nk < cols ? (size_t)o * cols + (size_t)(k0 + nk) : (size_t)(o + OB) * cols;
                if (no2 > 0) {
                    pf.base = (const char *)W->data + first * es;
                    pf.stride = (size_t)cols * es;
                    pf.rows = no2;
                    pf.lines = (int)(((size_t)nk2 * es + 63) / 64) + 1;
                }
            }
            xt_step(y, ldy, a, W, o, no, k0, nk, 0, 1, b, OB, tile, pan, pf.base ? &pf : NULL, run);
        }
    }
}

/* AVX2: 6 weight rows x 16 rows per pass (12 accumulators), both halves
 * of a 32-row block in turn. */
AVX2 static void xt_tile_avx2(float *tmp, const float *xt, int ldx, const float *pan, int nk, const wk_pf *pf, int add)
{
    (void)add;   /* xt_step carries a running sum for the 12 x 32 tile only */
    for (int h = 0; h < ldx; h += 16) {
        __m256 acc[6][2];
        UNROLL for (int j = 0; j < 6; j++) acc[j][0] = acc[j][1] = _mm256_setzero_ps();
        for (int i = 0; i < nk; i++) {
            __m256 x0 = _mm256_load_ps(xt + (size_t)i * ldx + h), x1 = _mm256_load_ps(xt + (size_t)i * ldx + h + 8);
            UNROLL for (int j = 0; j < 6; j++) {
                __m256 wb = _mm256_broadcast_ss(pan + (size_t)j * KC + i);
                acc[j][0] = _mm256_fmadd_ps(x0, wb, acc[j][0]);
                acc[j][1] = _mm256_fmadd_ps(x1, wb, acc[j][1]);
            }
        }
        UNROLL for (int j = 0; j < 6; j++) {
            _mm256_store_ps(tmp + (size_t)j * ldx + h, acc[j][0]);
            _mm256_store_ps(tmp + (size_t)j * ldx + h + 8, acc[j][1]);
        }
    }
}

/* AVX-512 (as ft_k_matmul_xt_avx512): 12 weight rows x 32 rows (24
 * accumulators); per column one or two aligned x loads and one
 * broadcast per weight row, fused into the FMAs. With pf, two lines of
 * the next panel's source are prefetched per column, so that the next
 * panel's DRAM reads overlap this tile's arithmetic (decode: otherwise
 * the two take turns); into L2: in L1 the 64 KiB of x the tile streams
 * evicted them before the panel was widened (Zen 4, 32 x 2048 x 2048
 * bf16: 91 -> 93 GFLOP/s; the tile itself runs at the FMA peak). */
AVX512 static INL void xt_tile_512_i(float *tmp, const float *xt, int ldx, const float *pan, int nk,
                                     const wk_pf *pf, const int usepf, const int add)
{
    int pj = 0, pl = 0;
#define PF_STEP                                                                                    \
    if (usepf) {                                                                                   \
        for (int t = 0; t < 2 && pl < pf->lines; t++) {                                            \
            _mm_prefetch(pf->base + (size_t)pj * pf->stride + (size_t)pl * 64, _MM_HINT_T1);        \
            if (++pj == pf->rows) { pj = 0; pl++; }                                                \
        }                                                                                          \
    }
    if (ldx == 16) {   /* f32 decode uses ft_k_matmul_xt; this serves the others' forced forms */
        __m512 acc[12];
        UNROLL for (int j = 0; j < 12; j++) acc[j] = _mm512_setzero_ps();
        for (int i = 0; i < nk; i++) {
            PF_STEP
            __m512 x0 = _mm512_load_ps(xt + (size_t)i * 16);
            UNROLL for (int j = 0; j < 12; j++) acc[j] = _mm512_fmadd_ps(x0, _mm512_set1_ps(pan[(size_t)j * KC + i]), acc[j]);
        }
        UNROLL for (int j = 0; j < 12; j++) _mm512_store_ps(tmp + (size_t)j * 16, acc[j]);
    } else {
        __m512 acc[12][2];
        UNROLL for (int j = 0; j < 12; j++) acc[j][0] = acc[j][1] = _mm512_setzero_ps();
        for (int i = 0; i < nk; i++) {
            PF_STEP
            __m512 x0 = _mm512_load_ps(xt + (size_t)i * 32), x1 = _mm512_load_ps(xt + (size_t)i * 32 + 16);
            UNROLL for (int j = 0; j < 12; j++) {
                __m512 wb = _mm512_set1_ps(pan[(size_t)j * KC + i]);
                acc[j][0] = _mm512_fmadd_ps(x0, wb, acc[j][0]);
                acc[j][1] = _mm512_fmadd_ps(x1, wb, acc[j][1]);
            }
        }
        if (add)   /* the running sum of xt_step: run + t */
            UNROLL for (int j = 0; j < 12; j++) {
                _mm512_store_ps(tmp + (size_t)j * 32, _mm512_add_ps(_mm512_load_ps(tmp + (size_t)j * 32), acc[j][0]));
                _mm512_store_ps(tmp + (size_t)j * 32 + 16, _mm512_add_ps(_mm512_load_ps(tmp + (size_t)j * 32 + 16), acc[j][1]));
            }
        else
            UNROLL for (int j = 0; j < 12; j++) {
                _mm512_store_ps(tmp + (size_t)j * 32, acc[j][0]);
                _mm512_store_ps(tmp + (size_t)j * 32 + 16, acc[j][1]);
            }
    }
#undef PF_STEP
}

AVX512 static void xt_tile_512(float *tmp, const float *xt, int ldx, const float *pan, int nk, const wk_pf *pf, int add)
{
    if (add) {
        if (pf) xt_tile_512_i(tmp, xt, ldx, pan, nk, pf, 1, 1);
        else xt_tile_512_i(tmp, xt, ldx, pan, nk, pf, 0, 1);
    } else {
        if (pf) xt_tile_512_i(tmp, xt, ldx, pan, nk, pf, 1, 0);
        else xt_tile_512_i(tmp, xt, ldx, pan, nk, pf, 0, 0);
    }
}

/* ===================================== X_B16: bf16 x, batch-invariant */

/* Every X_B16 kernel is "dot style": output (r, o) accumulates in its own
 * vector, along the columns, in column order, then one fixed reduction
 * and the bias. The blocking (O weight rows x R rows of x, ranges of
 * rows and outputs) changes which outputs are computed together, never
 * the operations that make one, so a row's results have the same bits
 * at every row count and output split (wk_bf16_batch_invariant). The
 * rows of x are padded with zeros to ldh (a multiple of 32), so the last
 * columns load x whole and mask only the weights. */

/* avx512bf16: O <= 4 weight rows x R <= 6 rows of x, 24 accumulators;
 * per 32 columns one load per weight row and per row of x, one
 * vdpbf16ps per pair (lane l: columns 32k + 2l, 32k + 2l + 1). nx: the
 * weight rows a few blocks on (NULL: none), prefetched into L2 one line
 * per row every 32 columns (PF_AHEAD). */
BF16 static INL void b16_blk(float *y, int ldy, const uint16_t *xh, int ldh, const uint16_t *w, int cols,
                             const float *b, const int O, const int R, const uint16_t *nx)
{
    __m512 acc[4][6];
    UNROLL for (int o = 0; o < O; o++) UNROLL for (int r = 0; r < R; r++) acc[o][r] = _mm512_setzero_ps();
    for (int i = 0; i < cols; i += 32) {
        __mmask32 m = cols - i >= 32 ? ~(__mmask32)0 : (__mmask32)((1u << (cols - i)) - 1);
        if (nx) UNROLL for (int o = 0; o < O; o++) _mm_prefetch((const char *)(nx + (size_t)o * cols + i), _MM_HINT_T1);
        __m512bh wv[4];
        UNROLL for (int o = 0; o < O; o++)
            wv[o] = (__m512bh)(cols - i >= 32 ? _mm512_loadu_si512(w + (size_t)o * cols + i)
                                              : _mm512_maskz_loadu_epi16(m, w + (size_t)o * cols + i));
        UNROLL for (int r = 0; r < R; r++) {
            __m512bh xv = (__m512bh)_mm512_load_si512(xh + (size_t)r * ldh + i);
            UNROLL for (int o = 0; o < O; o++) acc[o][r] = _mm512_dpbf16_ps(acc[o][r], wv[o], xv);
        }
    }
    UNROLL for (int o = 0; o < O; o++) UNROLL for (int r = 0; r < R; r++)
        y[(size_t)r * ldy + o] = _mm512_reduce_add_ps(acc[o][r]) + (b ? b[o] : 0.0f);
}

/* Rows of x per pass (ldh * 2 bytes each): they stay in L2 while every
 * weight block of the range passes over them. */
#define B16_L2 (384u << 10)

#define B16_R(O)                                                                                   \
    switch (R) {                                                                                   \
    case 6: b16_blk(yy, ldy, xx, ldh, w, cols, bb, O, 6, nx); break;                               \
    case 5: b16_blk(yy, ldy, xx, ldh, w, cols, bb, O, 5, nx); break;                               \
    case 4: b16_blk(yy, ldy, xx, ldh, w, cols, bb, O, 4, nx); break;                               \
    case 3: b16_blk(yy, ldy, xx, ldh, w, cols, bb, O, 3, nx); break;                               \
    case 2: b16_blk(yy, ldy, xx, ldh, w, cols, bb, O, 2, nx); break;                               \
    default: b16_blk(yy, ldy, xx, ldh, w, cols, bb, O, 1, nx); break;                              \
    }

BF16 static void product_b16(float *y, int ldy, const ft_wk_act *a, const ft_wmat *W, int o0, int o1,
                             const float *b)
{
    const int cols = W->cols, ldh = a->ldh;
    const uint16_t *W16 = W->data;
    const int ahead = pf_ahead((size_t)cols * 2, 4);
    /* batch 1 (x in bf16 at most B1_ONE bytes): one weight row at a time,
     * no software prefetch (B1_ONE) */
    const int one = a->rows == 1 && !pf_row() && (size_t)ldh * 2 <= B1_ONE;
    int rb = (int)(B16_L2 / ((size_t)ldh * 2));
    rb = rb < 6 ? 6 : rb / 6 * 6;
    for (int r0 = 0; r0 < a->rows; r0 += rb) {
        int r1 = a->rows - r0 < rb ? a->rows : r0 + rb;
        for (int o = o0; o < o1;) {
            int O = o1 - o >= 4 && !one ? 4 : 1;
            const uint16_t *w = W16 + (size_t)o * cols;
            const float *bb = b ? b + o : NULL;
            for (int r = r0; r < r1;) {
                int R = r1 - r >= 6 ? 6 : r1 - r;
                /* the rows ahead, while the first rows of x pass over this block */
                const uint16_t *nx = r == 0 && !one && o + ahead + O <= o1 ? W16 + (size_t)(o + ahead) * cols : NULL;
                float *yy = y + (size_t)r * ldy + o;
                const uint16_t *xx = a->xh + (size_t)r * ldh;
                if (O == 4) { B16_R(4) } else { B16_R(1) }
                r += R;
            }
            o += O;
        }
    }
}
#undef B16_R

/* The others: both widened to f32 (shifts), FMAs, 16 lanes (AVX-512) or
 * 8 (AVX2) along the columns. */
AVX512 static INL void b16f_blk512(float *y, int ldy, const uint16_t *xh, int ldh, const uint16_t *w, int cols,
                                   const float *b, const int O, const int R, const uint16_t *nx)
{
    __m512 acc[4][6];
    UNROLL for (int o = 0; o < O; o++) UNROLL for (int r = 0; r < R; r++) acc[o][r] = _mm512_setzero_ps();
    for (int i = 0; i < cols; i += 16) {
        __mmask16 m = cols - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (cols - i)) - 1);
        if (nx && !(i & 31))
            UNROLL for (int o = 0; o < O; o++) _mm_prefetch((const char *)(nx + (size_t)o * cols + i), _MM_HINT_T1);
        __m512 wv[4];
        UNROLL for (int o = 0; o < O; o++) wv[o] = h16(w + (size_t)o * cols + i, m, 0);
        UNROLL for (int r = 0; r < R; r++) {
            __m512 xv = h16(xh + (size_t)r * ldh + i, 0xffff, 0);
            UNROLL for (int o = 0; o < O; o++) acc[o][r] = _mm512_fmadd_ps(wv[o], xv, acc[o][r]);
        }
    }
    UNROLL for (int o = 0; o < O; o++) UNROLL for (int r = 0; r < R; r++)
        y[(size_t)r * ldy + o] = _mm512_reduce_add_ps(acc[o][r]) + (b ? b[o] : 0.0f);
}

#define B16F_R(O)                                                                                  \
    switch (R) {                                                                                   \
    case 6: b16f_blk512(yy, ldy, xx, ldh, w, cols, bb, O, 6, nx); break;                           \
    case 5: b16f_blk512(yy, ldy, xx, ldh, w, cols, bb, O, 5, nx); break;                           \
    case 4: b16f_blk512(yy, ldy, xx, ldh, w, cols, bb, O, 4, nx); break;                           \
    case 3: b16f_blk512(yy, ldy, xx, ldh, w, cols, bb, O, 3, nx); break;                           \
    case 2: b16f_blk512(yy, ldy, xx, ldh, w, cols, bb, O, 2, nx); break;                           \
    default: b16f_blk512(yy, ldy, xx, ldh, w, cols, bb, O, 1, nx); break;                          \
    }

AVX512 static void product_b16f_512(float *y, int ldy, const ft_wk_act *a, const ft_wmat *W, int o0, int o1,
                                    const float *b)
{
    const int cols = W->cols, ldh = a->ldh;
    const uint16_t *W16 = W->data;
    const int ahead = pf_ahead((size_t)cols * 2, 4);
    int rb = (int)(B16_L2 / ((size_t)ldh * 2));
    rb = rb < 6 ? 6 : rb / 6 * 6;
    for (int r0 = 0; r0 < a->rows; r0 += rb) {
        int r1 = a->rows - r0 < rb ? a->rows : r0 + rb;
        for (int o = o0; o < o1;) {
            int O = o1 - o >= 4 ? 4 : 1;
            const uint16_t *w = W16 + (size_t)o * cols;
            const float *bb = b ? b + o : NULL;
            for (int r = r0; r < r1;) {
                int R = r1 - r >= 6 ? 6 : r1 - r;
                const uint16_t *nx = r == 0 && o + ahead + O <= o1 ? W16 + (size_t)(o + ahead) * cols : NULL;
                float *yy = y + (size_t)r * ldy + o;
                const uint16_t *xx = a->xh + (size_t)r * ldh;
                if (O == 4) { B16F_R(4) } else { B16F_R(1) }
                r += R;
            }
            o += O;
        }
    }
}
#undef B16F_R

/* AVX2: 4 weight rows x 2 rows of x (8 accumulators); the weights'
 * last columns (cols % 8) one by one, after the vector sum. */
AVX2 static INL void b16f_blk2(float *y, int ldy, const uint16_t *xh, int ldh, const uint16_t *w, int cols,
                               const float *b, const int O, const int R)
{
    __m256 acc[4][2];
    UNROLL for (int o = 0; o < O; o++) UNROLL for (int r = 0; r < R; r++) acc[o][r] = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= cols; i += 8) {
        __m256 wv[4];
        UNROLL for (int o = 0; o < O; o++) wv[o] = h8(w + (size_t)o * cols + i, 0);
        UNROLL for (int r = 0; r < R; r++) {
            __m256 xv = h8(xh + (size_t)r * ldh + i, 0);
            UNROLL for (int o = 0; o < O; o++) acc[o][r] = _mm256_fmadd_ps(wv[o], xv, acc[o][r]);
        }
    }
    UNROLL for (int o = 0; o < O; o++) UNROLL for (int r = 0; r < R; r++) {
        float s = hsum8(acc[o][r]);
        for (int k = i; k < cols; k++)
            s = fmaf(ft_bf16_to_f32_1(xh[(size_t)r * ldh + k]), ft_bf16_to_f32_1(w[(size_t)o * cols + k]), s);
        y[(size_t)r * ldy + o] = s + (b ? b[o] : 0.0f);
    }
}

AVX2 static void product_b16f_avx2(float *y, int ldy, const ft_wk_act *a, const ft_wmat *W, int o0, int o1,
                                   const float *b)
{
    const int cols = W->cols, ldh = a->ldh;
    const uint16_t *W16 = W->data;
    for (int o = o0; o < o1;) {
        int O = o1 - o >= 4 ? 4 : 1;
        const uint16_t *w = W16 + (size_t)o * cols;
        const float *bb = b ? b + o : NULL;
        for (int r = 0; r < a->rows;) {
            int R = a->rows - r >= 2 ? 2 : 1;
            float *yy = y + (size_t)r * ldy + o;
            const uint16_t *xx = a->xh + (size_t)r * ldh;
            if (O == 4) { if (R == 2) b16f_blk2(yy, ldy, xx, ldh, w, cols, bb, 4, 2); else b16f_blk2(yy, ldy, xx, ldh, w, cols, bb, 4, 1); }
            else { if (R == 2) b16f_blk2(yy, ldy, xx, ldh, w, cols, bb, 1, 2); else b16f_blk2(yy, ldy, xx, ldh, w, cols, bb, 1, 1); }
            r += R;
        }
        o += O;
    }
}

/* Multiply-adds per second, vdpbf16ps over vfmadd231ps (zmm, 12
 * independent chains, register operands): best of 5 runs of each. */
BF16 static double bf16_gain_run(void)
{
    double best[2] = {1e30, 1e30};
    for (int rep = 0; rep < 5; rep++)
        for (int k = 0; k < 2; k++) {
            __m512 acc[12];   /* distinct, so that the chains stay independent */
            UNROLL for (int j = 0; j < 12; j++) {
                acc[j] = _mm512_set1_ps((float)j);
                __asm__ volatile("" : "+v"(acc[j]));
            }
            __m512 xf = _mm512_set1_ps(1e-3f);
            __m512bh xh = (__m512bh)_mm512_set1_epi16(0x3a83);
            double t0 = ft_now();
            if (k == 0)
                for (int n = 0; n < 4000; n++) {
                    UNROLL for (int j = 0; j < 12; j++) acc[j] = _mm512_dpbf16_ps(acc[j], xh, xh);
                    __asm__ volatile("" : "+v"(xh));
                }
            else
                for (int n = 0; n < 4000; n++) {
                    UNROLL for (int j = 0; j < 12; j++) acc[j] = _mm512_fmadd_ps(acc[j], xf, xf);
                    __asm__ volatile("" : "+v"(xf));
                }
            double t = ft_now() - t0;
            UNROLL for (int j = 1; j < 12; j++) acc[0] = _mm512_add_ps(acc[0], acc[j]);
            volatile float sink = _mm512_reduce_add_ps(acc[0]);
            (void)sink;
            if (t < best[k]) best[k] = t;
        }
    /* 32 multiply-adds per vdpbf16ps, 16 per FMA */
    return best[0] > 0 ? 2.0 * best[1] / best[0] : 0.0;
}

/* ====================================================== X_Q8 products */

/* AVX2: 2 weight rows x 1 quad. A ymm holds 2 rows' 16 bytes of one
 * sub-block; weights broadcast to both 128-bit lanes. q8 multiplies
 * (q - 128) as |q - 128| x sign(x, q - 128) (pair sums <= 2*128*127, no
 * saturation); the dropped 128 * sum(xq) goes into the min term. */
AVX2 static INL void q2_blk(float *y, int ldy, const ft_wk_act *a, int quad, const ft_wmat *W, int o,
                            const float *b, const int O, const int q4)
{
    const int G = W->group, gpr = a->gpr, nsb = a->nsb;
    const uint8_t *par[2], *vb[2];
    for (int k = 0; k < O; k++) {
        const uint8_t *vals;
        size_t e0;
        ft_wk_qrow(W, o + k, &par[k], &vals, &e0);
        vb[k] = vals + (q4 ? e0 / 2 : e0);
    }
    __m256 acc[2][2];
    for (int k = 0; k < O; k++) acc[k][0] = acc[k][1] = _mm256_setzero_ps();
    const __m256i ones = _mm256_set1_epi16(1), lo4 = _mm256_set1_epi8(15), x80 = _mm256_set1_epi8((char)0x80);
    for (int g = 0; g < gpr; g++) {
        size_t xi = ((size_t)quad * gpr + g);
        for (int k = 0; k < O; k++) {
            float s = f16_1(par[k] + 4 * g + 2), m = f16_1(par[k] + 4 * g) + (q4 ? 0.0f : 128.0f * s);
            __m256i i0 = _mm256_setzero_si256(), i1 = i0;
            for (int sb = 0; sb < nsb; sb++) {
                int un = sb < nsb - 1 ? 16 : G - 16 * (nsb - 1);
                size_t e = (size_t)g * G + 16 * (size_t)sb;
                uint8_t t16[16] = {0};
                __m256i wv;
                if (q4) {
                    const uint8_t *p = vb[k] + e / 2;
                    uint64_t v8 = 0;
                    memcpy(&v8, p, (size_t)(un / 2));
                    __m256i z = _mm256_set1_epi64x((long long)v8);
                    z = _mm256_blend_epi32(z, _mm256_srli_epi64(z, 4), 0xCC);
                    wv = _mm256_and_si256(z, lo4);
                } else {
                    const uint8_t *p = vb[k] + e;
                    if (un < 16) { memcpy(t16, p, (size_t)un); p = t16; }
                    wv = _mm256_xor_si256(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)p)), x80);
                }
                const int8_t *xp = a->xq + (xi * nsb + (size_t)sb) * 64;
                __m256i x0 = _mm256_load_si256((const __m256i *)xp), x1 = _mm256_load_si256((const __m256i *)(xp + 32));
                __m256i p0, p1;
                if (q4) {
                    p0 = _mm256_maddubs_epi16(wv, x0);
                    p1 = _mm256_maddubs_epi16(wv, x1);
                } else {
                    __m256i wa = _mm256_abs_epi8(wv);
                    p0 = _mm256_maddubs_epi16(wa, _mm256_sign_epi8(x0, wv));
                    p1 = _mm256_maddubs_epi16(wa, _mm256_sign_epi8(x1, wv));
                }
                i0 = _mm256_add_epi32(i0, _mm256_madd_epi16(p0, ones));
                i1 = _mm256_add_epi32(i1, _mm256_madd_epi16(p1, ones));
            }
            __m256 sv = _mm256_set1_ps(s), mv = _mm256_set1_ps(m);
            const float *x4 = a->xs4 + xi * 16, *u4 = a->xsum4 + xi * 16;
            acc[k][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i0), _mm256_mul_ps(sv, _mm256_loadu_ps(x4)), acc[k][0]);
            acc[k][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i1), _mm256_mul_ps(sv, _mm256_loadu_ps(x4 + 8)), acc[k][1]);
            acc[k][0] = _mm256_fmadd_ps(mv, _mm256_loadu_ps(u4), acc[k][0]);
            acc[k][1] = _mm256_fmadd_ps(mv, _mm256_loadu_ps(u4 + 8), acc[k][1]);
        }
    }
    for (int k = 0; k < O; k++) {
        float t[16];
        _mm256_storeu_ps(t, acc[k][0]);
        _mm256_storeu_ps(t + 8, acc[k][1]);
        for (int j = 0; j < 4 && quad * 4 + j < a->rows; j++)
            y[(size_t)(quad * 4 + j) * ldy + o + k] = ((t[4 * j] + t[4 * j + 1]) + (t[4 * j + 2] + t[4 * j + 3]))
                                                      + (b ? b[o + k] : 0.0f);
    }
}

/* ------------------------------------------------ one row (batch-1 decode) */

/* AVX2, one row: 2 weight rows; a 64-element unit is two ymm of
 * activations (q4: evens, odds) against the unit's 32 bytes (q4: low and
 * high nibbles) or 64 bytes (q8, made signed as in q2_blk). */
AVX2 static INL void q2r1_blk(float *y, const ft_wk_act *a, const ft_wmat *W, int o, const float *b,
                              const int O, const int q4)
{
    const int G = W->group, gpr = a->gpr, nu = a->nu;
    const uint8_t *par[2], *vb[2];
    for (int k = 0; k < O; k++) {
        const uint8_t *vals;
        size_t e0;
        ft_wk_qrow(W, o + k, &par[k], &vals, &e0);
        vb[k] = vals + (q4 ? e0 / 2 : e0);
    }
    __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    float msum[2] = {0, 0};
    const __m256i ones = _mm256_set1_epi16(1), lo4 = _mm256_set1_epi8(15), x80 = _mm256_set1_epi8((char)0x80);
    for (int g = 0; g < gpr; g++) {
        __m256i it[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
        for (int u = 0; u < nu; u++) {
            int un = u < nu - 1 ? 64 : G - 64 * (nu - 1);
            size_t e = (size_t)g * G + 64 * (size_t)u;
            const int8_t *xp = a->xq + ((size_t)g * nu + (size_t)u) * 64;
            __m256i x0, x1;
            if (q4 && G == 64) {   /* 4 groups interleaved: evens, odds of each half */
                xp = a->xq + (size_t)(g >> 2) * 256 + (size_t)(g & 3) * 16;
                x0 = _mm256_set_m128i(_mm_loadu_si128((const __m128i *)(xp + 128)), _mm_loadu_si128((const __m128i *)xp));
                x1 = _mm256_set_m128i(_mm_loadu_si128((const __m128i *)(xp + 192)), _mm_loadu_si128((const __m128i *)(xp + 64)));
            } else {
                x0 = _mm256_load_si256((const __m256i *)xp);
                x1 = _mm256_load_si256((const __m256i *)(xp + 32));
            }
            for (int k = 0; k < O; k++) {
                uint8_t t64[64];
                const uint8_t *p = vb[k] + (q4 ? e / 2 : e);
                int nb = q4 ? un / 2 : un;
                if (nb < (q4 ? 32 : 64)) { memset(t64, 0, sizeof t64); memcpy(t64, p, (size_t)nb); p = t64; }
                if (q4) {
                    __m256i v = _mm256_loadu_si256((const __m256i *)p);
                    __m256i pr = _mm256_add_epi16(_mm256_maddubs_epi16(_mm256_and_si256(v, lo4), x0),
                                                  _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(v, 4), lo4), x1));
                    it[k] = _mm256_add_epi32(it[k], _mm256_madd_epi16(pr, ones));
                } else {
                    __m256i w0 = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)p), x80);
                    __m256i w1 = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(p + 32)), x80);
                    __m256i p0 = _mm256_maddubs_epi16(_mm256_abs_epi8(w0), _mm256_sign_epi8(x0, w0));
                    __m256i p1 = _mm256_maddubs_epi16(_mm256_abs_epi8(w1), _mm256_sign_epi8(x1, w1));
                    it[k] = _mm256_add_epi32(it[k], _mm256_add_epi32(_mm256_madd_epi16(p0, ones), _mm256_madd_epi16(p1, ones)));
                }
            }
        }
        for (int k = 0; k < O; k++) {
            float st = f16_1(par[k] + 4 * g + 2), m = f16_1(par[k] + 4 * g) + (q4 ? 0.0f : 128.0f * st);
            acc[k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(it[k]), _mm256_set1_ps(st * a->xs[g]), acc[k]);
            msum[k] += m * a->xsum[g];
        }
    }
    for (int k = 0; k < O; k++) y[o + k] = hsum8(acc[k]) + msum[k] + (b ? b[o + k] : 0.0f);
}

/* One 64-element unit of weights as 64 u8 (q4: the 32 bytes in both
 * halves, the upper half shifted: low nibbles (evens) below, high
 * nibbles (odds) above); nb = bytes stored for the unit. */
VNNI static INL __m512i qunit512(const uint8_t *p, int nb, const int q4)
{
    if (!q4) return nb == 64 ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi8(((__mmask64)1 << nb) - 1, p);
    __m512i z = nb == 32 ? _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)p))
                         : _mm512_broadcast_i64x4(_mm256_maskz_loadu_epi8(((__mmask32)1 << nb) - 1, p));
    z = _mm512_mask_srli_epi16(z, (__mmask32)0xFFFF0000u, z, 4);
    return _mm512_and_si512(z, _mm512_set1_epi8(15));
}

/* VNNI, one row: O <= 4 weight rows; per unit one vpdpbusd per weight
 * row (all 64 lanes useful), per group one conversion and one FMA by
 * step * xs; the min terms lane-wise for 16 groups at a time. The rows
 * `ahead` further on (0: none) are prefetched into L2 (PF_AHEAD). */
VNNI static INL void q512r1_blk(float *y, const ft_wk_act *a, const ft_wmat *W, int o, const float *b,
                                const int O, const int q4, const int NU, int ahead)
{
    const int G = W->group, gpr = a->gpr, nu = NU ? NU : a->nu;
    const uint8_t *par[4], *vb[4], *nx[4];
    UNROLL for (int k = 0; k < O; k++) {
        const uint8_t *vals;
        size_t e0;
        ft_wk_qrow(W, o + k, &par[k], &vals, &e0);
        vb[k] = vals + (q4 ? e0 / 2 : e0);
        nx[k] = NULL;
        if (ahead) {
            const uint8_t *np;
            ft_wk_qrow(W, o + ahead + k, &np, &vals, &e0);
            nx[k] = vals + (q4 ? e0 / 2 : e0);
        }
    }
    const size_t gb = q4 ? (size_t)G / 2 : (size_t)G;   /* value bytes per group */
    size_t pfo = 0;                                      /* next offset to prefetch */
    const int rowpf = pf_row();
    __m512 acc[4];
    UNROLL for (int k = 0; k < O; k++) acc[k] = _mm512_setzero_ps();
    float cf[4][16] __attribute__((aligned(64)));
    for (int g0 = 0; g0 < gpr; g0 += 16) {
        int ng = gpr - g0 < 16 ? gpr - g0 : 16;
        __mmask16 gm = (__mmask16)((1u << ng) - 1);
        __m512 xsv = _mm512_maskz_loadu_ps(gm, a->xs + g0), usv = _mm512_maskz_loadu_ps(gm, a->xsum + g0);
        UNROLL for (int k = 0; k < O; k++) {
            __m512i p = _mm512_maskz_loadu_epi32(gm, par[k] + 4 * (size_t)g0);
            __m512 mv = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(p));
            __m512 sv = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(p, 16)));
            _mm512_store_ps(cf[k], _mm512_mul_ps(sv, xsv));
            acc[k] = _mm512_fmadd_ps(mv, usv, acc[k]);
            _mm_prefetch((const char *)(par[k] + 4 * (size_t)(g0 + 32)), _MM_HINT_T0);
        }
        for (int g = g0; g < g0 + ng; g++) {
            __m512i it[4];
            UNROLL for (int k = 0; k < O; k++) it[k] = _mm512_setzero_si512();
            if (ahead)
                for (; pfo < (size_t)(g + 1) * gb; pfo += 64)
                    UNROLL for (int k = 0; k < O; k++) _mm_prefetch((const char *)(nx[k] + pfo), _MM_HINT_T1);
            else if (rowpf)
                UNROLL for (int k = 0; k < O; k++) _mm_prefetch((const char *)(vb[k] + (size_t)(g + 16) * gb), _MM_HINT_T0);
            for (int u = 0; u < nu; u++) {
                int un = NU || u < nu - 1 ? 64 : G - 64 * (nu - 1);
                size_t e = (size_t)g * G + 64 * (size_t)u;
                __m512i xv = _mm512_load_si512(a->xq + ((size_t)g * nu + (size_t)u) * 64);
                UNROLL for (int k = 0; k < O; k++)
                    it[k] = _mm512_dpbusd_epi32(it[k], qunit512(vb[k] + (q4 ? e / 2 : e), q4 ? un / 2 : un, q4), xv);
            }
            UNROLL for (int k = 0; k < O; k++)
                acc[k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(it[k]), _mm512_set1_ps(cf[k][g - g0]), acc[k]);
        }
    }
    UNROLL for (int k = 0; k < O; k++) y[o + k] = _mm512_reduce_add_ps(acc[k]) + (b ? b[o + k] : 0.0f);
}

/* VNNI, one row, q4 with group 64: 4 groups at a time (the activations'
 * interleaved layout, ft_wk_qpos1). The 4 groups' 128 weight bytes are
 * two loads; two lane shuffles put bytes 0-15 (S0) and 16-31 (S1) of
 * group j in quarter j; their low and high nibbles are 4 vpdpbusd into
 * one int32 vector (lanes 4j..4j+3: group j), so the conversion and the
 * FMA by step * xs (permuted to the quarters) are one per 4 groups
 * instead of one per group. O <= 4 weight rows; rows `ahead` on are
 * prefetched into L2. */
VNNI static INL void q512r1_q4g(float *y, const ft_wk_act *a, const ft_wmat *W, int o, const float *b,
                                const int O, int ahead)
{
    const int gpr = a->gpr;
    const uint8_t *par[4], *vb[4], *nx[4];
    UNROLL for (int k = 0; k < O; k++) {
        const uint8_t *vals;
        size_t e0;
        ft_wk_qrow(W, o + k, &par[k], &vals, &e0);
        vb[k] = vals + e0 / 2;
        nx[k] = NULL;
        if (ahead) {
            const uint8_t *np;
            ft_wk_qrow(W, o + ahead + k, &np, &vals, &e0);
            nx[k] = vals + e0 / 2;
        }
    }
    const __m512i m4 = _mm512_set1_epi8(15);
    const __m512i qidx = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    size_t pfo = 0;
    const int rowpf = pf_row();
    __m512 acc[4];
    UNROLL for (int k = 0; k < O; k++) acc[k] = _mm512_setzero_ps();
    for (int g0 = 0; g0 < gpr; g0 += 16) {
        int ng = gpr - g0 < 16 ? gpr - g0 : 16;
        __mmask16 gm = (__mmask16)((1u << ng) - 1);
        __m512 xsv = _mm512_maskz_loadu_ps(gm, a->xs + g0), usv = _mm512_maskz_loadu_ps(gm, a->xsum + g0);
        __m512 cfv[4];
        UNROLL for (int k = 0; k < O; k++) {
            __m512i p = _mm512_maskz_loadu_epi32(gm, par[k] + 4 * (size_t)g0);
            __m512 mv = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(p));
            __m512 sv = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(p, 16)));
            cfv[k] = _mm512_mul_ps(sv, xsv);
            acc[k] = _mm512_fmadd_ps(mv, usv, acc[k]);
            _mm_prefetch((const char *)(par[k] + 4 * (size_t)(g0 + 32)), _MM_HINT_T0);
        }
        for (int m = 0; m < ng; m += 4) {
            const int g = g0 + m, nvg = ng - m < 4 ? ng - m : 4;
            if (ahead)
                for (; pfo < (size_t)(g + nvg) * 32; pfo += 64)
                    UNROLL for (int k = 0; k < O; k++) _mm_prefetch((const char *)(nx[k] + pfo), _MM_HINT_T1);
            else if (rowpf)
                UNROLL for (int k = 0; k < O; k++) {
                    _mm_prefetch((const char *)(vb[k] + (size_t)(g + 16) * 32), _MM_HINT_T0);
                    _mm_prefetch((const char *)(vb[k] + (size_t)(g + 18) * 32), _MM_HINT_T0);
                }
            const int8_t *xq = a->xq + (size_t)(g >> 2) * 256;
            __m512i x0 = _mm512_load_si512(xq), x1 = _mm512_load_si512(xq + 64);
            __m512i x2 = _mm512_load_si512(xq + 128), x3 = _mm512_load_si512(xq + 192);
            __m512i idx = _mm512_add_epi32(qidx, _mm512_set1_epi32(m));
            UNROLL for (int k = 0; k < O; k++) {
                const uint8_t *wp = vb[k] + (size_t)g * 32;
                __m512i A, B;
                if (nvg == 4) {
                    A = _mm512_loadu_si512(wp);
                    B = _mm512_loadu_si512(wp + 64);
                } else {   /* the row's last groups: bytes past them are not read */
                    int n = nvg * 32;
                    A = _mm512_maskz_loadu_epi8(n >= 64 ? ~(__mmask64)0 : ((__mmask64)1 << n) - 1, wp);
                    B = n > 64 ? _mm512_maskz_loadu_epi8(((__mmask64)1 << (n - 64)) - 1, wp + 64) : _mm512_setzero_si512();
                }
                __m512i S0 = _mm512_shuffle_i64x2(A, B, 0x88), S1 = _mm512_shuffle_i64x2(A, B, 0xDD);
                __m512i it = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_and_si512(S0, m4), x0);
                it = _mm512_dpbusd_epi32(it, _mm512_and_si512(_mm512_srli_epi16(S0, 4), m4), x1);
                it = _mm512_dpbusd_epi32(it, _mm512_and_si512(S1, m4), x2);
                it = _mm512_dpbusd_epi32(it, _mm512_and_si512(_mm512_srli_epi16(S1, 4), m4), x3);
                acc[k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(it), _mm512_permutexvar_ps(idx, cfv[k]), acc[k]);
            }
        }
    }
    UNROLL for (int k = 0; k < O; k++) y[o + k] = _mm512_reduce_add_ps(acc[k]) + (b ? b[o + k] : 0.0f);
}

AVX2 static void product_q_avx2(float *y, int ldy, const ft_wk_act *a, const ft_wmat *W, int o0,
                                int o1, const float *b)
{
    int q4 = W->fmt == FT_WF_Q4;
    if (q4 && (W->group & 1)) { ft_wk_product_ref(y, ldy, a, W, o0, o1, b); return; }
    if (a->row1) {
        for (int o = o0; o < o1;) {
            int O = o1 - o >= 2 ? 2 : 1;
            if (q4) { if (O == 2) q2r1_blk(y, a, W, o, b, 2, 1); else q2r1_blk(y, a, W, o, b, 1, 1); }
            else { if (O == 2) q2r1_blk(y, a, W, o, b, 2, 0); else q2r1_blk(y, a, W, o, b, 1, 0); }
            o += O;
        }
        return;
    }
    for (int o = o0; o < o1;) {
        int O = o1 - o >= 2 ? 2 : 1;
        for (int q = 0; q < a->nquad; q++) {
            if (q4) { if (O == 2) q2_blk(y, ldy, a, q, W, o, b, 2, 1); else q2_blk(y, ldy, a, q, W, o, b, 1, 1); }
            else { if (O == 2) q2_blk(y, ldy, a, q, W, o, b, 2, 0); else q2_blk(y, ldy, a, q, W, o, b, 1, 0); }
        }
        o += O;
    }
}

/* One 16-element sub-block of weights as u8 in each 128-bit lane (q4:
 * evens in bytes 0..7, odds in 8..15); un = elements stored. */
VNNI static INL __m512i qsub512(const uint8_t *p, int un, const int q4)
{
    if (!q4) {
        __m128i v = un == 16 ? _mm_loadu_si128((const __m128i *)p) : _mm_maskz_loadu_epi8((__mmask16)((1u << un) - 1), p);
        return _mm512_broadcast_i32x4(v);
    }
    __m512i z;
    if (un == 16) {
        long long v8;
        memcpy(&v8, p, 8);   /* unaligned: vpbroadcastq from memory */
        z = _mm512_set1_epi64(v8);
    }
    else z = _mm512_broadcastq_epi64(_mm_maskz_loadu_epi8((__mmask16)((1u << (un / 2)) - 1), p));
    z = _mm512_mask_srli_epi64(z, (__mmask8)0xAA, z, 4);
    return _mm512_and_si512(z, _mm512_set1_epi8(15));
}

#define QPF 8   /* groups of weights prefetched ahead */

/* VNNI: 4 weight rows x Q <= 4 quads (16 rows). Per (weight row, group):
 * nsb sub-blocks, each one broadcast load (q4: + shift + and) and Q
 * vpdpbusd into int32 lanes (4 per row); then per quad one conversion,
 * the scale (step x the rows' xs) and the min term, lane-wise in f32. */
VNNI static INL void q512_blk(float *y, int ldy, const ft_wk_act *a, int q0, const ft_wmat *W, int o,
                              const float *b, const int O, const int Q, const int q4, const int NSB)
{
    const int G = W->group, gpr = a->gpr, nsb = a->nsb;
    const uint8_t *par[4], *vb[4];
    UNROLL for (int k = 0; k < O; k++) {
        const uint8_t *vals;
        size_t e0;
        ft_wk_qrow(W, o + k, &par[k], &vals, &e0);
        vb[k] = vals + (q4 ? e0 / 2 : e0);
    }
    __m512 acc[4][4];
    UNROLL for (int k = 0; k < O; k++) UNROLL for (int q = 0; q < Q; q++) acc[k][q] = _mm512_setzero_ps();
    float sf[4][16] __attribute__((aligned(64))), mf[4][16] __attribute__((aligned(64)));
    for (int g0 = 0; g0 < gpr; g0 += 16) {
        int ng = gpr - g0 < 16 ? gpr - g0 : 16;
        __mmask16 gm = (__mmask16)((1u << ng) - 1);
        UNROLL for (int k = 0; k < O; k++) {
            __m512i p = _mm512_maskz_loadu_epi32(gm, par[k] + 4 * (size_t)g0);
            _mm512_store_ps(mf[k], _mm512_cvtph_ps(_mm512_cvtepi32_epi16(p)));
            _mm512_store_ps(sf[k], _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(p, 16))));
        }
        UNROLL for (int k = 0; k < O; k++) _mm_prefetch((const char *)(par[k] + 4 * (size_t)(g0 + 32)), _MM_HINT_T0);
        for (int g = g0; g < g0 + ng; g++) {
            UNROLL for (int k = 0; k < O; k++) {
                /* the weights a few groups ahead: latency-bound otherwise (the
                 * 4 rows advance 64 or 32 bytes per group each) */
                _mm_prefetch((const char *)(vb[k] + (size_t)(g + QPF) * G / (q4 ? 2 : 1)), _MM_HINT_T0);
                __m512i ia[4];
                UNROLL for (int q = 0; q < Q; q++) ia[q] = _mm512_setzero_si512();
                const int8_t *xg = a->xq + ((size_t)q0 * gpr + g) * nsb * 64;
                const size_t qstride = (size_t)gpr * nsb * 64;
                if (NSB) {   /* whole sub-blocks, unrolled (G = 16 NSB) */
                    const uint8_t *wp = vb[k] + (size_t)g * G / (q4 ? 2 : 1);
                    UNROLL for (int sb = 0; sb < NSB; sb++) {
                        __m512i wv = qsub512(wp + sb * (q4 ? 8 : 16), 16, q4);
                        UNROLL for (int q = 0; q < Q; q++)
                            ia[q] = _mm512_dpbusd_epi32(ia[q], wv, _mm512_load_si512(xg + q * qstride + sb * 64));
                    }
                } else {
                    for (int sb = 0; sb < nsb; sb++) {
                        int un = sb < nsb - 1 ? 16 : G - 16 * (nsb - 1);
                        size_t e = (size_t)g * G + 16 * (size_t)sb;
                        __m512i wv = qsub512(vb[k] + (q4 ? e / 2 : e), un, q4);
                        UNROLL for (int q = 0; q < Q; q++)
                            ia[q] = _mm512_dpbusd_epi32(ia[q], wv, _mm512_load_si512(xg + q * qstride + (size_t)sb * 64));
                    }
                }
                __m512 sv = _mm512_set1_ps(sf[k][g - g0]), mv = _mm512_set1_ps(mf[k][g - g0]);
                UNROLL for (int q = 0; q < Q; q++) {
                    size_t xi = ((size_t)(q0 + q) * gpr + g) * 16;
                    acc[k][q] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia[q]), _mm512_mul_ps(sv, _mm512_load_ps(a->xs4 + xi)), acc[k][q]);
                    acc[k][q] = _mm512_fmadd_ps(mv, _mm512_load_ps(a->xsum4 + xi), acc[k][q]);
                }
            }
        }
    }
    UNROLL for (int k = 0; k < O; k++) UNROLL for (int q = 0; q < Q; q++) {
        /* lanes 4j..4j+3 -> row j: two in-lane swaps and adds */
        __m512 v = acc[k][q];
        v = _mm512_add_ps(v, _mm512_permute_ps(v, 0xB1));
        v = _mm512_add_ps(v, _mm512_permute_ps(v, 0x4E));
        float t[16] __attribute__((aligned(64)));
        _mm512_store_ps(t, v);
        for (int j = 0; j < 4 && (q0 + q) * 4 + j < a->rows; j++)
            y[(size_t)((q0 + q) * 4 + j) * ldy + o + k] = t[4 * j] + (b ? b[o + k] : 0.0f);
    }
}

#define Q512_Q(O, Q4, NSB)                                                \
    switch (Q) {                                                          \
    case 4: q512_blk(y, ldy, a, q, W, o, b, O, 4, Q4, NSB); break;        \
    case 3: q512_blk(y, ldy, a, q, W, o, b, O, 3, Q4, NSB); break;        \
    case 2: q512_blk(y, ldy, a, q, W, o, b, O, 2, Q4, NSB); break;        \
    default: q512_blk(y, ldy, a, q, W, o, b, O, 1, Q4, NSB); break;       \
    }

VNNI static void product_q_vnni(float *y, int ldy, const ft_wk_act *a, const ft_wmat *W, int o0,
                                int o1, const float *b)
{
    int q4 = W->fmt == FT_WF_Q4;
    if (q4 && (W->group & 1)) { ft_wk_product_ref(y, ldy, a, W, o0, o1, b); return; }
    int g64 = W->group == 64;   /* the default group: sub-block loop unrolled */
    if (a->row1 && q4 && W->group == 64) {
        const int ah = pf_ahead((size_t)W->cols / 2, 4);
        for (int o = o0; o < o1;) {
            if (o1 - o >= 4) {
                q512r1_q4g(y, a, W, o, b, 4, o + ah + 4 <= o1 ? ah : 0);
                o += 4;
            } else {
                q512r1_q4g(y, a, W, o, b, 1, 0);
                o++;
            }
        }
        return;
    }
    if (a->row1) {
        const int ah = pf_ahead(q4 ? (size_t)W->cols / 2 : (size_t)W->cols, 4);
        for (int o = o0; o < o1;) {
            if (o1 - o >= 4) {
                int pa = o + ah + 4 <= o1 ? ah : 0;
                if (g64) { if (q4) q512r1_blk(y, a, W, o, b, 4, 1, 1, pa); else q512r1_blk(y, a, W, o, b, 4, 0, 1, pa); }
                else { if (q4) q512r1_blk(y, a, W, o, b, 4, 1, 0, pa); else q512r1_blk(y, a, W, o, b, 4, 0, 0, pa); }
                o += 4;
            } else {
                if (q4) q512r1_blk(y, a, W, o, b, 1, 1, 0, 0); else q512r1_blk(y, a, W, o, b, 1, 0, 0, 0);
                o++;
            }
        }
        return;
    }
    /* quads in blocks whose activations (gpr * nsb * 64 bytes each) stay
     * in L2 while every weight row of the range passes over them */
    int qb = (int)(((size_t)512 << 10) / ((size_t)a->gpr * a->nsb * 64));
    qb = qb < 4 ? 4 : qb / 4 * 4;
    for (int q0 = 0; q0 < a->nquad; q0 += qb) {
    int q1 = a->nquad - q0 < qb ? a->nquad : q0 + qb;
    for (int o = o0; o < o1;) {
        int O = o1 - o >= 4 ? 4 : 1;
        for (int q = q0; q < q1;) {
            int Q = q1 - q >= 4 ? 4 : q1 - q;
            if (O == 4 && g64) { if (q4) { Q512_Q(4, 1, 4) } else { Q512_Q(4, 0, 4) } }
            else if (O == 4) { if (q4) { Q512_Q(4, 1, 0) } else { Q512_Q(4, 0, 0) } }
            else { if (q4) { Q512_Q(1, 1, 0) } else { Q512_Q(1, 0, 0) } }
            q += Q;
        }
        o += O;
    }
    }
}
#undef Q512_Q


/* ================================================ X_Q8 activation prep */

/* The quantizer of ft_wk_prep_q_ref, 16 lanes: max|x| (and whether any x
 * is NaN or beyond 3.4e38, the reference's test), then per sub-block
 * round-half-even (vcvtps2dq in the default rounding mode, as rintf),
 * clamp, q4's evens-then-odds permutation, narrowing store. */
AVX512 static void prep_q_512(const ft_wk_qdst *d, const float *x, int rows)
{
    const int G = d->group;
    const __m512i eo = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    const __m512 thr = _mm512_set1_ps(3.4e38f);
    for (int r = 0; r < rows; r++)
        for (int g = 0; g < d->gpr; g++) {
            const float *v = x + (size_t)r * d->cols + (size_t)g * G;
            __m512 mx = _mm512_setzero_ps();
            __mmask16 bad = 0;
            for (int i = 0; i < G; i += 16) {
                __mmask16 m = G - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (G - i)) - 1);
                __m512 a = _mm512_abs_ps(_mm512_maskz_loadu_ps(m, v + i));
                bad |= _mm512_mask_cmp_ps_mask(m, a, thr, _CMP_NLE_UQ);
                mx = _mm512_max_ps(mx, a);
            }
            float amax = _mm512_reduce_max_ps(mx), s = 0.0f, sum = 0.0f;
            if (bad) { s = NAN; sum = NAN; }
            else if (amax > 0.0f) {
                __m512 inv = _mm512_set1_ps(127.0f / amax);
                __m512i isum = _mm512_setzero_si512();
                const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
                if (d->row1) {   /* 64-element units; q4: the unit's evens, then its odds */
                    const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
                    const __m512i od = _mm512_add_epi32(ev, _mm512_set1_epi32(1));
                    for (int u = 0; u < d->nu; u++) {
                        __m512i q[4];
                        for (int p = 0; p < 4; p++) {
                            int i = 64 * u + 16 * p, n = G - i < 0 ? 0 : G - i > 16 ? 16 : G - i;
                            __mmask16 m = (__mmask16)((1u << n) - 1);
                            q[p] = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, v + (n ? i : 0)), inv));
                            q[p] = _mm512_min_epi32(_mm512_max_epi32(q[p], lo), hi);
                            isum = _mm512_add_epi32(isum, q[p]);
                        }
                        int8_t *dst = d->xq + ((size_t)g * d->nu + (size_t)u) * 64;
                        if (d->q4 && G == 64) {   /* 4 groups interleaved (ft_wk_qpos1) */
                            dst = d->xq + (size_t)(g >> 2) * 256 + (size_t)(g & 3) * 16;
                            _mm_storeu_si128((__m128i *)dst, _mm512_cvtepi32_epi8(_mm512_permutex2var_epi32(q[0], ev, q[1])));
                            _mm_storeu_si128((__m128i *)(dst + 64), _mm512_cvtepi32_epi8(_mm512_permutex2var_epi32(q[0], od, q[1])));
                            _mm_storeu_si128((__m128i *)(dst + 128), _mm512_cvtepi32_epi8(_mm512_permutex2var_epi32(q[2], ev, q[3])));
                            _mm_storeu_si128((__m128i *)(dst + 192), _mm512_cvtepi32_epi8(_mm512_permutex2var_epi32(q[2], od, q[3])));
                        } else if (d->q4) {
                            _mm_storeu_si128((__m128i *)dst, _mm512_cvtepi32_epi8(_mm512_permutex2var_epi32(q[0], ev, q[1])));
                            _mm_storeu_si128((__m128i *)(dst + 16), _mm512_cvtepi32_epi8(_mm512_permutex2var_epi32(q[2], ev, q[3])));
                            _mm_storeu_si128((__m128i *)(dst + 32), _mm512_cvtepi32_epi8(_mm512_permutex2var_epi32(q[0], od, q[1])));
                            _mm_storeu_si128((__m128i *)(dst + 48), _mm512_cvtepi32_epi8(_mm512_permutex2var_epi32(q[2], od, q[3])));
                        } else {
                            for (int p = 0; p < 4; p++) _mm_storeu_si128((__m128i *)(dst + 16 * p), _mm512_cvtepi32_epi8(q[p]));
                        }
                    }
                } else for (int sb = 0; sb < d->nsb; sb++) {
                    int i = 16 * sb;
                    __mmask16 m = G - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (G - i)) - 1);
                    __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, v + i), inv));
                    q = _mm512_min_epi32(_mm512_max_epi32(q, lo), hi);
                    isum = _mm512_add_epi32(isum, q);
                    if (d->q4) q = _mm512_permutexvar_epi32(eo, q);
                    _mm_storeu_si128((__m128i *)(d->xq + ft_wk_qsub(d->gpr, d->nsb, r, g, sb)), _mm512_cvtepi32_epi8(q));
                }
                s = amax / 127.0f;
                sum = s * (float)_mm512_reduce_add_epi32(isum);
            }
            ft_wk_prep_q_put(d, r, g, s, sum);
        }
}

/* The same with 8 lanes; the permuted narrowing is scalar. */
AVX2 static void prep_q_avx2(const ft_wk_qdst *d, const float *x, int rows)
{
    const int G = d->group;
    const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)), thr = _mm256_set1_ps(3.4e38f);
    for (int r = 0; r < rows; r++)
        for (int g = 0; g < d->gpr; g++) {
            const float *v = x + (size_t)r * d->cols + (size_t)g * G;
            __m256 mx = _mm256_setzero_ps();
            int bad = 0, i = 0;
            for (; i + 8 <= G; i += 8) {
                __m256 a = _mm256_and_ps(_mm256_loadu_ps(v + i), absm);
                bad |= _mm256_movemask_ps(_mm256_cmp_ps(a, thr, _CMP_NLE_UQ));
                mx = _mm256_max_ps(mx, a);
            }
            float t8[8];
            _mm256_storeu_ps(t8, mx);
            float amax = 0.0f;
            for (int k = 0; k < 8; k++) amax = t8[k] > amax ? t8[k] : amax;
            for (; i < G; i++) {
                float a = fabsf(v[i]);
                bad |= !(a <= 3.4e38f);
                amax = a > amax ? a : amax;
            }
            float s = 0.0f, sum = 0.0f;
            if (bad) { s = NAN; sum = NAN; }
            else if (amax > 0.0f) {
                float finv = 127.0f / amax;
                __m256 inv = _mm256_set1_ps(finv);
                const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
                int isum = 0;
                for (int sb = 0; sb < d->nsb; sb++) {
                    int i0 = 16 * sb, n = G - i0 < 16 ? G - i0 : 16;
                    int32_t q[16];
                    int k = 0;
                    for (; k + 8 <= n; k += 8) {
                        __m256i qv = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + i0 + k), inv));
                        _mm256_storeu_si256((__m256i *)(q + k), _mm256_min_epi32(_mm256_max_epi32(qv, lo), hi));
                    }
                    for (; k < n; k++) {
                        float t = rintf(v[i0 + k] * finv);
                        q[k] = t > 127.0f ? 127 : t < -127.0f ? -127 : (int)t;
                    }
                    int8_t *dst = d->xq + ft_wk_qsub(d->gpr, d->nsb, r, g, sb);
                    for (k = 0; k < n; k++) {
                        if (d->row1) d->xq[ft_wk_qpos1(d->q4, d->nu, G, g, i0 + k)] = (int8_t)q[k];
                        else dst[d->q4 ? ((k & 1) ? 8 + (k >> 1) : (k >> 1)) : k] = (int8_t)q[k];
                        isum += q[k];
                    }
                }
                s = amax / 127.0f;
                sum = s * (float)isum;
            }
            ft_wk_prep_q_put(d, r, g, s, sum);
        }
}

/* ============================================================== tables */

AVX2 static void product_avx2(float *y, int ldy, const ft_wk_act *a, const ft_wmat *W, int o0, int o1,
                              const float *b)
{
    if (o0 >= o1) return;
    switch (a->mode) {
    case FT_WK_X_Q8: product_q_avx2(y, ldy, a, W, o0, o1, b); return;
    case FT_WK_X_B16: product_b16f_avx2(y, ldy, a, W, o0, o1, b); return;
    case FT_WK_X_T: product_xt(y, ldy, a, W, o0, o1, b, 6, xt_tile_avx2); return;
    case FT_WK_X_F32:
        if (W->fmt == FT_WF_F32) {
            ft_k_get()->matmul_rows(y + o0, ldy, a->x, a->rows, (const float *)W->data + (size_t)o0 * W->cols,
                                    o1 - o0, W->cols, b ? b + o0 : NULL);
            return;
        }
        hx2(y, ldy, a->x, W->cols, a->rows, W->data, W->cols, o0, o1, b, W->fmt == FT_WF_F16);
        return;
    }
}

AVX512 static void product_avx512_common(float *y, int ldy, const ft_wk_act *a, const ft_wmat *W, int o0,
                                         int o1, const float *b, int vnni)
{
    if (o0 >= o1) return;
    switch (a->mode) {
    case FT_WK_X_Q8:
        if (vnni) product_q_vnni(y, ldy, a, W, o0, o1, b);
        else product_q_avx2(y, ldy, a, W, o0, o1, b);
        return;
    case FT_WK_X_B16: product_b16f_512(y, ldy, a, W, o0, o1, b); return;
    case FT_WK_X_T:
        if (W->fmt == FT_WF_F32 && a->nblk == 1 && ft_k_get()->matmul_xt) {
            /* f32 decode: the engine's kernel streams the weights as stored */
            ft_k_get()->matmul_xt(y + o0, ldy, a->xt, a->ldx, a->rows, (const float *)W->data + (size_t)o0 * W->cols,
                                  o1 - o0, W->cols, b ? b + o0 : NULL);
            return;
        }
        product_xt(y, ldy, a, W, o0, o1, b, 12, xt_tile_512);
        return;
    case FT_WK_X_F32:
        if (W->fmt == FT_WF_F32) {
            ft_k_get()->matmul_rows(y + o0, ldy, a->x, a->rows, (const float *)W->data + (size_t)o0 * W->cols,
                                    o1 - o0, W->cols, b ? b + o0 : NULL);
            return;
        }
        hx512_f(y, ldy, a->x, W->cols, a->rows, W->data, W->cols, o0, o1, b, W->fmt == FT_WF_F16, a->xd);
        return;
    }
}

static void product_avx512(float *y, int ldy, const ft_wk_act *a, const ft_wmat *W, int o0, int o1,
                           const float *b)
{
    product_avx512_common(y, ldy, a, W, o0, o1, b, 0);
}

static void product_avx512vnni(float *y, int ldy, const ft_wk_act *a, const ft_wmat *W, int o0, int o1,
                               const float *b)
{
    product_avx512_common(y, ldy, a, W, o0, o1, b, 1);
}

BF16 static void product_avx512bf16(float *y, int ldy, const ft_wk_act *a, const ft_wmat *W, int o0, int o1,
                                    const float *b)
{
    if (o0 < o1 && a->mode == FT_WK_X_B16) {
        product_b16(y, ldy, a, W, o0, o1, b);
        return;
    }
    product_avx512_common(y, ldy, a, W, o0, o1, b, 1);
}

static const ft_wk_table t_avx2 = {"avx2", product_avx2, attend_h_avx2, prep_q_avx2};
static const ft_wk_table t_avx512 = {"avx512", product_avx512, attend_h_avx512, prep_q_512};
static const ft_wk_table t_avx512vnni = {"avx512vnni", product_avx512vnni, attend_h_avx512, prep_q_512};
static const ft_wk_table t_avx512bf16 = {"avx512bf16", product_avx512bf16, attend_h_avx512, prep_q_512};

const ft_wk_table *ft_wk_avx2(void)
{
    const ft_cpu_features *f = ft_cpu();
    return f->avx2 && f->fma && f->f16c ? &t_avx2 : NULL;
}

const ft_wk_table *ft_wk_avx512(void)
{
    const ft_cpu_features *f = ft_cpu();
    return ft_wk_avx2() && f->avx512f && f->avx512bw && f->avx512vl ? &t_avx512 : NULL;
}

const ft_wk_table *ft_wk_avx512vnni(void)
{
    return ft_wk_avx512() && ft_cpu()->avx512vnni ? &t_avx512vnni : NULL;
}

const ft_wk_table *ft_wk_avx512bf16(void)
{
    return ft_wk_avx512vnni() && ft_cpu()->avx512bf16 ? &t_avx512bf16 : NULL;
}

double ft_wk_bf16_gain(void)
{
    return ft_wk_avx512bf16() ? bf16_gain_run() : 0.0;
}
#else
const ft_wk_table *ft_wk_avx2(void) { return NULL; }
const ft_wk_table *ft_wk_avx512(void) { return NULL; }
const ft_wk_table *ft_wk_avx512vnni(void) { return NULL; }
const ft_wk_table *ft_wk_avx512bf16(void) { return NULL; }
double ft_wk_bf16_gain(void) { return 0.0; }
#endif
