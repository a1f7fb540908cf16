/* SIMD products on stored weights (contract: wkernels.h). Compiled per
 * function with target attributes, chosen at run time by wkernels.c.
 *
 * Shapes. Every product is "dot style": weights and activations are both
 * contiguous along the input dimension, so the stored rows are used in
 * place (no packing), each accumulator is a vector of partial sums over
 * input columns, reduced once per output at the end. A block of O weight
 * rows x R activation rows keeps O*R accumulators in registers; each
 * weight vector is loaded (and widened/unpacked) once per block and used
 * R times. Rows are walked in L2-sized blocks so that, for prefill, the
 * activations of a block stay in L2 while the weights stream.
 *
 *   16-bit weights, f32 x (decode; f16 always): O = 4, R <= 6 (AVX-512),
 *       O = 4, R <= 2 (AVX2); the weight widened exactly (bf16: shift,
 *       f16: vcvtph2ps), one FMA per (weight vector, row).
 *   bf16 weights, bf16 x (prefill): vdpbf16ps, O = 6, R <= 4 (32
 *       products per instruction, exact products, f32 sums).
 *   q8/q4 weights, int8 x: per 64-element unit one vpdpbusd (u8 weights x
 *       s8 activations, int32 lanes), converted and scaled by
 *       step * xs into f32 lanes; the min term m * xsum is added lane-wise
 *       for 16 groups at once from the f16 parameters. q4: the unit's 32
 *       bytes are broadcast to both halves of a zmm, the upper half
 *       shifted by 4, masked to nibbles: evens below, odds above, which is
 *       how ft_wk_prep laid the activations out. AVX2: vpmaddubsw +
 *       vpmaddwd; q8 bytes are made signed (u - 128) and multiplied as
 *       |w'| x sign(x, w') so that pair sums cannot saturate (<= 2 * 128 *
 *       127), the 128 * sum(x) this drops folded into the min term. */
#include "wkernels.h"
#include "kernels.h"
#include "flextier/core.h"

#include <cblas.h>
#include <math.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>

/* F32 weights: the engine's f32 kernels (the decode ones are
 * ft_k_matmul_rows / ft_k_matmul_xt), OpenBLAS sgemm for prefill. */
static void product_f32(float *y, int ldy, const ft_wk_act *a, const ft_wmat *W, int o0, int o1,
                        const float *b)
{
    const ft_kernels *kn = ft_k_get();
    const float *Wd = (const float *)W->data + (size_t)o0 * W->cols;
    const float *bb = b ? b + o0 : NULL;
    if (a->xt) {
        kn->matmul_xt(y + o0, ldy, a->xt, a->ldx, a->rows, Wd, o1 - o0, W->cols, bb);
    } else if (a->rows <= FT_WK_DECODE_ROWS) {
        kn->matmul_rows(y + o0, ldy, a->x, a->rows, Wd, o1 - o0, W->cols, bb);
    } else {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, a->rows, o1 - o0, W->cols, 1.0f, a->x,
                    W->cols, Wd, W->cols, 0.0f, y + o0, ldy);
        if (bb)
            for (int r = 0; r < a->rows; r++)
                for (int o = 0; o < o1 - o0; o++) y[(size_t)r * ldy + o0 + o] += bb[o];
    }
}

/* Rows per L2 block of activations of `bytes_per_row`, a multiple of m. */
static int row_block(size_t bytes_per_row, int m)
{
    size_t rb = ((size_t)256 << 10) / (bytes_per_row ? bytes_per_row : 1);
    if (rb < (size_t)m) rb = (size_t)m;
    if (rb > 4096) rb = 4096;
    return (int)(rb / (size_t)m * (size_t)m);
}

#define INL inline __attribute__((always_inline))
#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#define VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#define BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c")))
#define UNROLL _Pragma("GCC unroll 8")

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

/* O weight rows x R activation rows; x f32 (xh = 0) or bf16 (xh = 1). */
AVX2 static INL void hx2_blk(float *y, int ldy, const void *xv, int ldx, int xh, const uint16_t *w,
                             int cols, const float *b, const int O, const int R, const int f16)
{
    __m256 acc[4][2];
    UNROLL for (int o = 0; o < O; o++) UNROLL for (int r = 0; r < R; r++) acc[o][r] = _mm256_setzero_ps();
    const float *xf = xv;
    const uint16_t *xb = xv;
    int i = 0;
    for (; i + 8 <= cols; i += 8) {
        __m256 wv[4];
        UNROLL for (int o = 0; o < O; o++) wv[o] = h8(w + (size_t)o * cols + i, f16);
        UNROLL for (int r = 0; r < R; r++) {
            __m256 x = xh ? h8(xb + (size_t)r * ldx + i, 0) : _mm256_loadu_ps(xf + (size_t)r * ldx + i);
            UNROLL for (int o = 0; o < O; o++) acc[o][r] = _mm256_fmadd_ps(wv[o], x, acc[o][r]);
        }
    }
    UNROLL for (int o = 0; o < O; o++) UNROLL for (int r = 0; r < R; r++) {
        float s = hsum8(acc[o][r]);
        for (int k = i; k < cols; k++)
            s += (xh ? ft_bf16_to_f32_1(xb[(size_t)r * ldx + k]) : xf[(size_t)r * ldx + k])
                 * h1(w[(size_t)o * cols + k], f16);
        y[(size_t)r * ldy + o] = s + (b ? b[o] : 0.0f);
    }
}

AVX2 static void hx2(float *y, int ldy, const void *x, int ldx, int xh, int rows, const uint16_t *W,
                     int cols, int o0, int o1, const float *b, int f16)
{
    int RB = row_block((size_t)cols * 4, 2);
    for (int r0 = 0; r0 < rows; r0 += RB) {
        int r1 = rows - r0 < RB ? rows : r0 + RB;
        for (int o = o0; o < o1;) {
            int O = o1 - o >= 4 ? 4 : 1;
            const uint16_t *w = W + (size_t)o * cols;
            const float *bb = b ? b + o : NULL;
            for (int r = r0; r < r1;) {
                int R = r1 - r >= 2 ? 2 : 1;
                float *yy = y + (size_t)r * ldy + o;
                const void *xx = xh ? (const void *)((const uint16_t *)x + (size_t)r * ldx)
                                    : (const void *)((const float *)x + (size_t)r * ldx);
                if (f16) {
                    if (O == 4 && R == 2) hx2_blk(yy, ldy, xx, ldx, xh, w, cols, bb, 4, 2, 1);
                    else if (O == 4) hx2_blk(yy, ldy, xx, ldx, xh, w, cols, bb, 4, 1, 1);
                    else if (R == 2) hx2_blk(yy, ldy, xx, ldx, xh, w, cols, bb, 1, 2, 1);
                    else hx2_blk(yy, ldy, xx, ldx, xh, w, cols, bb, 1, 1, 1);
                } else {
                    if (O == 4 && R == 2) hx2_blk(yy, ldy, xx, ldx, xh, w, cols, bb, 4, 2, 0);
                    else if (O == 4) hx2_blk(yy, ldy, xx, ldx, xh, w, cols, bb, 4, 1, 0);
                    else if (R == 2) hx2_blk(yy, ldy, xx, ldx, xh, w, cols, bb, 1, 2, 0);
                    else hx2_blk(yy, ldy, xx, ldx, xh, w, cols, bb, 1, 1, 0);
                }
                r += R;
            }
            o += O;
        }
    }
}

/* q8/q4, AVX2: 2 weight rows x R <= 2 activation rows. */
AVX2 static INL void q2_blk(float *y, int ldy, const ft_wk_act *a, int r0, const ft_wmat *W, int o,
                            const float *b, const int O, const int R, const int q4)
{
    const int G = W->group, gpr = a->gpr, gpad = a->gpad, nu = (G + 63) / 64;
    const uint8_t *par[2], *vb[2];
    for (int k = 0; k < O; k++) {
        const uint8_t *vals;
        size_t k0;
        ft_wk_qrow(W, o + k, &par[k], &vals, &k0);
        vb[k] = vals + (q4 ? k0 / 2 : k0);
    }
    __m256 acc[2][2];
    float msum[2][2] = {{0}};
    for (int k = 0; k < O; k++) for (int r = 0; r < R; r++) acc[k][r] = _mm256_setzero_ps();
    const __m256i ones = _mm256_set1_epi16(1), lo4 = _mm256_set1_epi8(15), x80 = _mm256_set1_epi8((char)0x80);
    for (int g = 0; g < gpr; g++) {
        float s[2];
        for (int k = 0; k < O; k++) {
            s[k] = f16_1(par[k] + 4 * g + 2);
            /* q8 multiplies (q - 128): its min term carries the 128 * step */
            float m = f16_1(par[k] + 4 * g) + (q4 ? 0.0f : 128.0f * s[k]);
            for (int r = 0; r < R; r++) msum[k][r] += m * a->xsum[(size_t)(r0 + r) * gpr + g];
        }
        for (int u = 0; u < nu; u++) {
            int un = u < nu - 1 ? 64 : G - 64 * (nu - 1);
            __m256i w0[2], w1[2];
            for (int k = 0; k < O; k++) {
                const uint8_t *p = vb[k] + (q4 ? ((size_t)g * G + 64 * (size_t)u) / 2 : (size_t)g * G + 64 * (size_t)u);
                uint8_t tmp[64];
                int nb = q4 ? un / 2 : un;
                if (nb < (q4 ? 32 : 64)) { memset(tmp, 0, sizeof tmp); memcpy(tmp, p, (size_t)nb); p = tmp; }
                if (q4) {
                    __m256i v = _mm256_loadu_si256((const __m256i *)p);
                    w0[k] = _mm256_and_si256(v, lo4);
                    w1[k] = _mm256_and_si256(_mm256_srli_epi16(v, 4), lo4);
                } else {
                    w0[k] = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)p), x80);
                    w1[k] = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(p + 32)), x80);
                }
            }
            for (int r = 0; r < R; r++) {
                const int8_t *xp = a->xq + ((size_t)(r0 + r) * gpr + g) * gpad + 64 * (size_t)u;
                __m256i x0 = _mm256_load_si256((const __m256i *)xp), x1 = _mm256_load_si256((const __m256i *)(xp + 32));
                float xs = a->xs[(size_t)(r0 + r) * gpr + g];
                for (int k = 0; k < O; k++) {
                    __m256i t;
                    if (q4) {
                        t = _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(w0[k], x0),
                                                               _mm256_maddubs_epi16(w1[k], x1)), ones);
                    } else {
                        __m256i p0 = _mm256_maddubs_epi16(_mm256_abs_epi8(w0[k]), _mm256_sign_epi8(x0, w0[k]));
                        __m256i p1 = _mm256_maddubs_epi16(_mm256_abs_epi8(w1[k]), _mm256_sign_epi8(x1, w1[k]));
                        t = _mm256_add_epi32(_mm256_madd_epi16(p0, ones), _mm256_madd_epi16(p1, ones));
                    }
                    acc[k][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t), _mm256_set1_ps(s[k] * xs), acc[k][r]);
                }
            }
        }
    }
    for (int k = 0; k < O; k++)
        for (int r = 0; r < R; r++)
            y[(size_t)r * ldy + k] = hsum8(acc[k][r]) + msum[k][r] + (b ? b[k] : 0.0f);
}

AVX2 static void product_q_avx2(float *y, int ldy, const ft_wk_act *a, const ft_wmat *W, int o0,
                                int o1, const float *b)
{
    int q4 = W->fmt == FT_WF_Q4;
    if (q4 && (W->group & 1)) { ft_wk_product_ref(y, ldy, a, W, o0, o1, b); return; }
    int RB = row_block((size_t)a->gpr * a->gpad, 2);
    for (int r0 = 0; r0 < a->rows; r0 += RB) {
        int r1 = a->rows - r0 < RB ? a->rows : r0 + RB;
        for (int o = o0; o < o1;) {
            int O = o1 - o >= 2 ? 2 : 1;
            for (int r = r0; r < r1;) {
                int R = r1 - r >= 2 ? 2 : 1;
                float *yy = y + (size_t)r * ldy + o;
                const float *bb = b ? b + o : NULL;
                if (q4) {
                    if (O == 2 && R == 2) q2_blk(yy, ldy, a, r, W, o, bb, 2, 2, 1);
                    else if (O == 2) q2_blk(yy, ldy, a, r, W, o, bb, 2, 1, 1);
                    else if (R == 2) q2_blk(yy, ldy, a, r, W, o, bb, 1, 2, 1);
                    else q2_blk(yy, ldy, a, r, W, o, bb, 1, 1, 1);
                } else {
                    if (O == 2 && R == 2) q2_blk(yy, ldy, a, r, W, o, bb, 2, 2, 0);
                    else if (O == 2) q2_blk(yy, ldy, a, r, W, o, bb, 2, 1, 0);
                    else if (R == 2) q2_blk(yy, ldy, a, r, W, o, bb, 1, 2, 0);
                    else q2_blk(yy, ldy, a, r, W, o, bb, 1, 1, 0);
                }
                r += R;
            }
            o += O;
        }
    }
}

AVX2 static void product_avx2(float *y, int ldy, const ft_wk_act *a, const ft_wmat *W, int o0, int o1,
                              const float *b)
{
    if (o0 >= o1) return;
    switch (a->mode) {
    case FT_WK_X_Q8: product_q_avx2(y, ldy, a, W, o0, o1, b); return;
    case FT_WK_X_BF16:
        hx2(y, ldy, a->xb, a->ldb, 1, a->rows, W->data, W->cols, o0, o1, b, 0);
        return;
    case FT_WK_X_F32:
        if (W->fmt == FT_WF_F32) { product_f32(y, ldy, a, W, o0, o1, b); return; }
        hx2(y, ldy, a->x, W->cols, 0, a->rows, W->data, W->cols, o0, o1, b, W->fmt == FT_WF_F16);
        return;
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

AVX512 static INL __m512 h16(const uint16_t *p, __mmask16 m, int f16)
{
    __m256i v = m == 0xffff ? _mm256_loadu_si256((const __m256i *)p) : _mm256_maskz_loadu_epi16(m, p);
    return f16 ? _mm512_cvtph_ps(v) : _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
}

/* O weight rows x R activation rows, x f32 (xh = 0) or bf16 (xh = 1). */
AVX512 static INL void hx512_blk(float *y, int ldy, const void *xv, int ldx, const int xh,
                                 const uint16_t *w, int cols, const float *b, const int O, const int R,
                                 const int f16)
{
    __m512 acc[4][6];
    UNROLL for (int o = 0; o < O; o++) UNROLL for (int r = 0; r < R; r++) acc[o][r] = _mm512_setzero_ps();
    const float *xf = xv;
    const uint16_t *xb = xv;
    for (int i = 0; i < cols; i += 16) {
        __mmask16 m = cols - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (cols - i)) - 1);
        __m512 wv[4];
        UNROLL for (int o = 0; o < O; o++) wv[o] = h16(w + (size_t)o * cols + i, m, f16);
        UNROLL for (int r = 0; r < R; r++) {
            __m512 x = xh ? h16(xb + (size_t)r * ldx + i, m, 0) : _mm512_maskz_loadu_ps(m, xf + (size_t)r * ldx + i);
            UNROLL for (int o = 0; o < O; o++) acc[o][r] = _mm512_fmadd_ps(wv[o], x, acc[o][r]);
        }
    }
    UNROLL for (int o = 0; o < O; o++) UNROLL for (int r = 0; r < R; r++)
        y[(size_t)r * ldy + o] = _mm512_reduce_add_ps(acc[o][r]) + (b ? b[o] : 0.0f);
}

#define HX512_R(O, F)                                                                          \
    switch (R) {                                                                               \
    case 6: hx512_blk(yy, ldy, xx, ldx, xh, w, cols, bb, O, 6, F); break;                      \
    case 5: hx512_blk(yy, ldy, xx, ldx, xh, w, cols, bb, O, 5, F); break;                      \
    case 4: hx512_blk(yy, ldy, xx, ldx, xh, w, cols, bb, O, 4, F); break;                      \
    case 3: hx512_blk(yy, ldy, xx, ldx, xh, w, cols, bb, O, 3, F); break;                      \
    case 2: hx512_blk(yy, ldy, xx, ldx, xh, w, cols, bb, O, 2, F); break;                      \
    default: hx512_blk(yy, ldy, xx, ldx, xh, w, cols, bb, O, 1, F); break;                     \
    }

AVX512 static void hx512_f(float *y, int ldy, const float *x, int ldx, int rows, const uint16_t *W,
                           int cols, int o0, int o1, const float *b, int f16)
{
    const int xh = 0;
    int RB = row_block((size_t)cols * 4, 6);
    for (int r0 = 0; r0 < rows; r0 += RB) {
        int r1 = rows - r0 < RB ? rows : r0 + RB;
        for (int o = o0; o < o1;) {
            int O = o1 - o >= 4 ? 4 : 1;
            const uint16_t *w = W + (size_t)o * cols;
            const float *bb = b ? b + o : NULL;
            for (int r = r0; r < r1;) {
                int R = r1 - r >= 6 ? 6 : r1 - r;
                float *yy = y + (size_t)r * ldy + o;
                const float *xx = x + (size_t)r * ldx;
                if (O == 4) { if (f16) { HX512_R(4, 1) } else { HX512_R(4, 0) } }
                else { if (f16) { HX512_R(1, 1) } else { HX512_R(1, 0) } }
                r += R;
            }
            o += O;
        }
    }
}

/* bf16 x bf16 without vdpbf16ps: both widened, f32 FMA. */
AVX512 static void hx512_b(float *y, int ldy, const uint16_t *x, int ldx, int rows, const uint16_t *W,
                           int cols, int o0, int o1, const float *b)
{
    const int xh = 1;
    int RB = row_block((size_t)ldx * 2, 6);
    for (int r0 = 0; r0 < rows; r0 += RB) {
        int r1 = rows - r0 < RB ? rows : r0 + RB;
        for (int o = o0; o < o1;) {
            int O = o1 - o >= 4 ? 4 : 1;
            const uint16_t *w = W + (size_t)o * cols;
            const float *bb = b ? b + o : NULL;
            for (int r = r0; r < r1;) {
                int R = r1 - r >= 6 ? 6 : r1 - r;
                float *yy = y + (size_t)r * ldy + o;
                const uint16_t *xx = x + (size_t)r * ldx;
                if (O == 4) { HX512_R(4, 0) } else { HX512_R(1, 0) }
                r += R;
            }
            o += O;
        }
    }
}
#undef HX512_R

/* One 64-element unit of q8/q4 weights as 64 u8 values (q4: evens in
 * bytes 0..31, odds in 32..63); nb = bytes stored for the unit (64 or 32
 * when whole). Masked loads: never reads past the unit. */
AVX512 static INL __m512i qunit512(const uint8_t *p, int nb, const int q4)
{
    if (!q4) return nb == 64 ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi8(((__mmask64)1 << nb) - 1, p);
    __m256i h = nb == 32 ? _mm256_loadu_si256((const __m256i *)p)
                         : _mm256_maskz_loadu_epi8(((__mmask32)1 << nb) - 1, p);
    __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(h), h, 1);
    z = _mm512_mask_srli_epi16(z, (__mmask32)0xFFFF0000u, z, 4);
    return _mm512_and_si512(z, _mm512_set1_epi8(15));
}

AVX512 static INL void qparams512(const uint8_t *par, __mmask16 gm, __m512 *mv, __m512 *sv)
{
    __m512i p = _mm512_maskz_loadu_epi32(gm, par);
    *mv = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(p));
    *sv = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(p, 16)));
}

/* q8/q4 with VNNI: 4 weight rows x R <= 4 activation rows. */
VNNI static INL void q512_blk(float *y, int ldy, const ft_wk_act *a, int r0, const ft_wmat *W, int o,
                              const float *b, const int O, const int R, const int q4)
{
    const int G = W->group, gpr = a->gpr, gpad = a->gpad, nu = (G + 63) / 64;
    const uint8_t *par[4], *vb[4];
    UNROLL for (int k = 0; k < O; k++) {
        const uint8_t *vals;
        size_t k0;
        ft_wk_qrow(W, o + k, &par[k], &vals, &k0);
        vb[k] = vals + (q4 ? k0 / 2 : k0);
    }
    __m512 acc[4][4];
    UNROLL for (int k = 0; k < O; k++) UNROLL for (int r = 0; r < R; r++) acc[k][r] = _mm512_setzero_ps();
    float sf[4][16] __attribute__((aligned(64)));
    for (int g0 = 0; g0 < gpr; g0 += 16) {
        int ng = gpr - g0 < 16 ? gpr - g0 : 16;
        __mmask16 gm = (__mmask16)((1u << ng) - 1);
        UNROLL for (int k = 0; k < O; k++) {
            __m512 mv, sv;
            qparams512(par[k] + 4 * (size_t)g0, gm, &mv, &sv);
            _mm512_store_ps(sf[k], sv);
            UNROLL for (int r = 0; r < R; r++)
                acc[k][r] = _mm512_fmadd_ps(mv, _mm512_maskz_loadu_ps(gm, a->xsum + (size_t)(r0 + r) * gpr + g0), acc[k][r]);
        }
        for (int g = g0; g < g0 + ng; g++) {
            __m512 sb[4];
            UNROLL for (int k = 0; k < O; k++) sb[k] = _mm512_set1_ps(sf[k][g - g0]);
            for (int u = 0; u < nu; u++) {
                int un = u < nu - 1 ? 64 : G - 64 * (nu - 1);
                size_t e = (size_t)g * G + 64 * (size_t)u;
                __m512i wv[4];
                UNROLL for (int k = 0; k < O; k++) wv[k] = qunit512(vb[k] + (q4 ? e / 2 : e), q4 ? un / 2 : un, q4);
                UNROLL for (int r = 0; r < R; r++) {
                    size_t xi = (size_t)(r0 + r) * gpr + g;
                    __m512i xv = _mm512_load_si512(a->xq + xi * gpad + 64 * (size_t)u);
                    __m512 xs = _mm512_set1_ps(a->xs[xi]);
                    UNROLL for (int k = 0; k < O; k++) {
                        __m512i t = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv[k], xv);
                        acc[k][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t), _mm512_mul_ps(sb[k], xs), acc[k][r]);
                    }
                }
            }
        }
    }
    UNROLL for (int k = 0; k < O; k++) UNROLL for (int r = 0; r < R; r++)
        y[(size_t)r * ldy + k] = _mm512_reduce_add_ps(acc[k][r]) + (b ? b[k] : 0.0f);
}

#define Q512_R(O, Q4)                                                     \
    switch (R) {                                                          \
    case 4: q512_blk(yy, ldy, a, r, W, o, bb, O, 4, Q4); break;           \
    case 3: q512_blk(yy, ldy, a, r, W, o, bb, O, 3, Q4); break;           \
    case 2: q512_blk(yy, ldy, a, r, W, o, bb, O, 2, Q4); break;           \
    default: q512_blk(yy, ldy, a, r, W, o, bb, O, 1, Q4); break;          \
    }

VNNI static void product_q_vnni(float *y, int ldy, const ft_wk_act *a, const ft_wmat *W, int o0,
                                int o1, const float *b)
{
    int q4 = W->fmt == FT_WF_Q4;
    if (q4 && (W->group & 1)) { ft_wk_product_ref(y, ldy, a, W, o0, o1, b); return; }
    int RB = row_block((size_t)a->gpr * a->gpad, 4);
    for (int r0 = 0; r0 < a->rows; r0 += RB) {
        int r1 = a->rows - r0 < RB ? a->rows : r0 + RB;
        for (int o = o0; o < o1;) {
            int O = o1 - o >= 4 ? 4 : 1;
            const float *bb = b ? b + o : NULL;
            for (int r = r0; r < r1;) {
                int R = r1 - r >= 4 ? 4 : r1 - r;
                float *yy = y + (size_t)r * ldy + o;
                if (O == 4) { if (q4) { Q512_R(4, 1) } else { Q512_R(4, 0) } }
                else { if (q4) { Q512_R(1, 1) } else { Q512_R(1, 0) } }
                r += R;
            }
            o += O;
        }
    }
}
#undef Q512_R

static int have_vnni(void) { return ft_cpu()->avx512vnni; }

AVX512 static void product_avx512(float *y, int ldy, const ft_wk_act *a, const ft_wmat *W, int o0,
                                  int o1, const float *b)
{
    if (o0 >= o1) return;
    switch (a->mode) {
    case FT_WK_X_Q8:
        if (have_vnni()) product_q_vnni(y, ldy, a, W, o0, o1, b);
        else product_q_avx2(y, ldy, a, W, o0, o1, b);
        return;
    case FT_WK_X_BF16:
        hx512_b(y, ldy, a->xb, a->ldb, a->rows, W->data, W->cols, o0, o1, b);
        return;
    case FT_WK_X_F32:
        if (W->fmt == FT_WF_F32) { product_f32(y, ldy, a, W, o0, o1, b); return; }
        hx512_f(y, ldy, a->x, W->cols, a->rows, W->data, W->cols, o0, o1, b, W->fmt == FT_WF_F16);
        return;
    }
}

/* bf16 x bf16 with vdpbf16ps: O <= 6 weight rows x R <= 4 rows; x rows
 * are zero padded to ldb (a multiple of 32), the weights' tail masked. */
BF16 static INL void bf_blk(float *y, int ldy, const uint16_t *x, int ldb, const uint16_t *w, int cols,
                            const float *b, const int O, const int R)
{
    __m512 acc[6][4];
    UNROLL for (int o = 0; o < O; o++) UNROLL for (int r = 0; r < R; r++) acc[o][r] = _mm512_setzero_ps();
    int i = 0;
    for (; i + 32 <= cols; i += 32) {
        __m512i wv[6];
        UNROLL for (int o = 0; o < O; o++) wv[o] = _mm512_loadu_si512(w + (size_t)o * cols + i);
        UNROLL for (int r = 0; r < R; r++) {
            __m512i xv = _mm512_load_si512(x + (size_t)r * ldb + i);
            UNROLL for (int o = 0; o < O; o++)
                acc[o][r] = _mm512_dpbf16_ps(acc[o][r], (__m512bh)wv[o], (__m512bh)xv);
        }
    }
    if (i < cols) {
        __mmask32 m = (__mmask32)((1ull << (cols - i)) - 1);
        __m512i wv[6];
        UNROLL for (int o = 0; o < O; o++) wv[o] = _mm512_maskz_loadu_epi16(m, w + (size_t)o * cols + i);
        UNROLL for (int r = 0; r < R; r++) {
            __m512i xv = _mm512_load_si512(x + (size_t)r * ldb + i);
            UNROLL for (int o = 0; o < O; o++)
                acc[o][r] = _mm512_dpbf16_ps(acc[o][r], (__m512bh)wv[o], (__m512bh)xv);
        }
    }
    UNROLL for (int o = 0; o < O; o++) UNROLL for (int r = 0; r < R; r++)
        y[(size_t)r * ldy + o] = _mm512_reduce_add_ps(acc[o][r]) + (b ? b[o] : 0.0f);
}

#define BF_R(O)                                                        \
    switch (R) {                                                       \
    case 4: bf_blk(yy, ldy, xx, ldb, w, cols, bb, O, 4); break;        \
    case 3: bf_blk(yy, ldy, xx, ldb, w, cols, bb, O, 3); break;        \
    case 2: bf_blk(yy, ldy, xx, ldb, w, cols, bb, O, 2); break;        \
    default: bf_blk(yy, ldy, xx, ldb, w, cols, bb, O, 1); break;       \
    }

BF16 static void bf_dp(float *y, int ldy, const uint16_t *x, int ldb, int rows, const uint16_t *W,
                       int cols, int o0, int o1, const float *b)
{
    int RB = row_block((size_t)ldb * 2, 4);
    for (int r0 = 0; r0 < rows; r0 += RB) {
        int r1 = rows - r0 < RB ? rows : r0 + RB;
        for (int o = o0; o < o1;) {
            int O = o1 - o >= 6 ? 6 : 1;
            const uint16_t *w = W + (size_t)o * cols;
            const float *bb = b ? b + o : NULL;
            for (int r = r0; r < r1;) {
                int R = r1 - r >= 4 ? 4 : r1 - r;
                float *yy = y + (size_t)r * ldy + o;
                const uint16_t *xx = x + (size_t)r * ldb;
                if (O == 6) { BF_R(6) } else { BF_R(1) }
                r += R;
            }
            o += O;
        }
    }
}
#undef BF_R

BF16 static void product_avx512bf16(float *y, int ldy, const ft_wk_act *a, const ft_wmat *W, int o0,
                                    int o1, const float *b)
{
    if (o0 >= o1) return;
    if (a->mode == FT_WK_X_BF16) { bf_dp(y, ldy, a->xb, a->ldb, a->rows, W->data, W->cols, o0, o1, b); return; }
    product_avx512(y, ldy, a, W, o0, o1, b);
}

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

static const ft_wk_table t_avx2 = {"avx2", product_avx2, attend_h_avx2};
static const ft_wk_table t_avx512 = {"avx512", product_avx512, attend_h_avx512};
static const ft_wk_table t_avx512bf16 = {"avx512bf16", product_avx512bf16, attend_h_avx512};

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

const ft_wk_table *ft_wk_avx512bf16(void)
{
    const ft_cpu_features *f = ft_cpu();
    return ft_wk_avx512() && f->avx512bf16 && f->avx512vnni ? &t_avx512bf16 : NULL;
}
#else
const ft_wk_table *ft_wk_avx2(void) { return NULL; }
const ft_wk_table *ft_wk_avx512(void) { return NULL; }
const ft_wk_table *ft_wk_avx512bf16(void) { return NULL; }
#endif
