/* The backward of the llama-family ops (train_internal.h), f32. The
 * transposed product uses the engine's axpy kernel and has a scalar
 * reference twin; the rest is scalar code. */
#include "train/train_internal.h"

#include "engine/kernels.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

/* the engine's dot/axpy (SIMD with scalar twins, tests/engine) */
#define KDOT(a, b, n) (kk->dot((a), (b), (n)))
#define KAXPY(y, a, x, n) (kk->axpy((y), (a), (x), (n)))

static const float *wrow(const ft_wmat *W, int o, float *buf)
{
    if (W->fmt == FT_WF_F32) return (const float *)W->data + (size_t)o * (size_t)W->cols;
    ft_wmat_row_f32(W, o, buf);
    return buf;
}

void ft_tr_matT(float *dx, int ldx, const float *dy, int ldy, int rows, const ft_wmat *W, int o0, int o1,
                float *row)
{
    /* blocks of RB rows keep their dx rows in cache while every weight row
     * passes; a stored row is converted once per block */
    enum { RB = 32 };
    const ft_kernels *k = ft_k_get();
    for (int r0 = 0; r0 < rows; r0 += RB) {
        int r1 = rows - r0 < RB ? rows : r0 + RB;
        for (int o = o0; o < o1; o++) {
            const float *w = NULL;
            for (int r = r0; r < r1; r++) {
                float g = dy[(size_t)r * (size_t)ldy + (size_t)o];
                if (g == 0.0f) continue;
                if (!w) w = wrow(W, o, row);
                k->axpy(dx + (size_t)r * (size_t)ldx, g, w, W->cols);
            }
        }
    }
}

void ft_tr_matT_ref(float *dx, int ldx, const float *dy, int ldy, int rows, const ft_wmat *W, int o0, int o1,
                    float *row)
{
    for (int o = o0; o < o1; o++) {
        const float *w = wrow(W, o, row);
        for (int r = 0; r < rows; r++)
            for (int i = 0; i < W->cols; i++)
                dx[(size_t)r * (size_t)ldx + (size_t)i] += dy[(size_t)r * (size_t)ldy + (size_t)o] * w[i];
    }
}

void ft_tr_rmsnorm_bwd(float *dx, const float *x, const float *w, const float *dy, int n, float eps)
{
    /* y_i = w_i x_i s, s = (mean(x^2) + eps)^-1/2:
     * dx_i = s w_i dy_i - x_i s^3 / n * sum_j w_j dy_j x_j */
    float ss = 0.0f;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    float s = 1.0f / sqrtf(ss / (float)n + eps);
    float dot = 0.0f;
    for (int i = 0; i < n; i++) dot += w[i] * dy[i] * x[i];
    float c = dot * s * s * s / (float)n;
    for (int i = 0; i < n; i++) dx[i] += s * w[i] * dy[i] - x[i] * c;
}

void ft_tr_rope_bwd(float *dx, int n_heads, int head_dim, const float *cos, const float *sin)
{
    /* forward: y_i = x_i c - x_{i+h} s, y_{i+h} = x_{i+h} c + x_i s */
    int h = head_dim / 2;
    for (int hd = 0; hd < n_heads; hd++) {
        float *d = dx + (size_t)hd * (size_t)head_dim;
        for (int i = 0; i < h; i++) {
            float a = d[i], b = d[i + h];
            d[i] = a * cos[i] + b * sin[i];
            d[i + h] = b * cos[i] - a * sin[i];
        }
    }
}

void ft_tr_silu_mul_bwd(float *dg, float *du, const float *g, const float *u, const float *dy, int n)
{
    for (int i = 0; i < n; i++) {
        float sg = 1.0f / (1.0f + expf(-g[i]));
        float silu = g[i] * sg;
        du[i] = dy[i] * silu;
        dg[i] = dy[i] * u[i] * sg * (1.0f + g[i] * (1.0f - sg));
    }
}

void ft_tr_gelu_mul_bwd(float *dg, float *du, const float *g, const float *u, const float *dy, int n)
{
    /* gelu_tanh(x) = x/2 (1 + tanh(k0 (x + k1 x^3))), as the engine's GeGLU */
    const float k0 = 0.7978845608028654f, k1 = 0.044715f;
    for (int i = 0; i < n; i++) {
        float x = g[i], th = tanhf(k0 * (x + k1 * x * x * x));
        float gel = 0.5f * x * (1.0f + th);
        float d = 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * k0 * (1.0f + 3.0f * k1 * x * x);
        du[i] = dy[i] * gel;
        dg[i] = dy[i] * u[i] * d;
    }
}

static int first_pos(int i, int window) { return window > 0 && i - window + 1 > 0 ? i - window + 1 : 0; }

void ft_tr_attn_fwd(float *out, float *P, const float *q, const float *k, const float *v, int T, int nh, int nkv,
                    int hd, int window)
{
    ft_tr_attn_fwd_g(out, P, q, k, v, T, nh, nkv, hd, window, 0, nkv, 1.0f / sqrtf((float)hd), 0.0f);
}

void ft_tr_attn_fwd_g(float *out, float *P, const float *q, const float *k, const float *v, int T, int nh, int nkv,
                      int hd, int window, int g0, int g1, float scale, float cap)
{
    const int qw = nh * hd, kw = nkv * hd, rep = nh / nkv;
    const ft_kernels *kk = ft_k_get();
    for (int h = g0 * rep; h < g1 * rep; h++) {
        int g = h / rep;
        for (int i = 0; i < T; i++) {
            float *p = P + ((size_t)h * (size_t)T + (size_t)i) * (size_t)T;
            const float *qi = q + (size_t)i * (size_t)qw + (size_t)h * (size_t)hd;
            int j0 = first_pos(i, window);
            float mx = -INFINITY;
            for (int j = 0; j < T; j++) {
                if (j < j0 || j > i) { p[j] = 0.0f; continue; }
                const float *kj = k + (size_t)j * (size_t)kw + (size_t)g * (size_t)hd;
                p[j] = KDOT(qi, kj, hd) * scale;
                if (cap != 0.0f) p[j] = tanhf(p[j] / cap) * cap;   /* gemma2's soft-capping */
                if (p[j] > mx) mx = p[j];
            }
            float sum = 0.0f;
            for (int j = j0; j <= i; j++) {
                p[j] = expf(p[j] - mx);
                sum += p[j];
            }
            for (int j = j0; j <= i; j++) p[j] /= sum;
            float *oi = out + (size_t)i * (size_t)qw + (size_t)h * (size_t)hd;
            memset(oi, 0, sizeof(float) * (size_t)hd);
            for (int j = j0; j <= i; j++) KAXPY(oi, p[j], v + (size_t)j * (size_t)kw + (size_t)g * (size_t)hd, hd);
        }
    }
}

void ft_tr_attn_bwd(float *dq, float *dk, float *dv, const float *dout, const float *P, const float *q,
                    const float *k, const float *v, int T, int nh, int nkv, int hd, int window)
{
    ft_tr_attn_bwd_g(dq, dk, dv, dout, P, q, k, v, T, nh, nkv, hd, window, 0, nkv, 1.0f / sqrtf((float)hd), 0.0f);
}

void ft_tr_attn_bwd_g(float *dq, float *dk, float *dv, const float *dout, const float *P, const float *q,
                      const float *k, const float *v, int T, int nh, int nkv, int hd, int window, int g0, int g1,
                      float scale, float cap)
{
    const int qw = nh * hd, kw = nkv * hd, rep = nh / nkv;
    const ft_kernels *kk = ft_k_get();
    /* dP_j of a row, kept between the two passes (without it: computed twice) */
    float *dp = malloc(sizeof(float) * (size_t)(T > 0 ? T : 1));
    for (int h = g0 * rep; h < g1 * rep; h++) {
        int g = h / rep;
        for (int i = 0; i < T; i++) {
            const float *p = P + ((size_t)h * (size_t)T + (size_t)i) * (size_t)T;
            const float *doi = dout + (size_t)i * (size_t)qw + (size_t)h * (size_t)hd;
            const float *qi = q + (size_t)i * (size_t)qw + (size_t)h * (size_t)hd;
            float *dqi = dq + (size_t)i * (size_t)qw + (size_t)h * (size_t)hd;
            int j0 = first_pos(i, window);
            /* dP_j = dot(do_i, v_j); dv_j += P_j do_i */
            float rs = 0.0f;
            for (int j = j0; j <= i; j++) {
                float d = KDOT(doi, v + (size_t)j * (size_t)kw + (size_t)g * (size_t)hd, hd);
                if (dp) dp[j] = d;
                rs += p[j] * d;
            }
            for (int j = j0; j <= i; j++) {
                const float *vj = v + (size_t)j * (size_t)kw + (size_t)g * (size_t)hd;
                const float *kj = k + (size_t)j * (size_t)kw + (size_t)g * (size_t)hd;
                float *dvj = dv + (size_t)j * (size_t)kw + (size_t)g * (size_t)hd;
                float *dkj = dk + (size_t)j * (size_t)kw + (size_t)g * (size_t)hd;
                float ds = p[j] * ((dp ? dp[j] : KDOT(doi, vj, hd)) - rs) * scale;
                if (cap != 0.0f) {   /* d(cap tanh(x / cap)) / dx = 1 - tanh^2 */
                    float th = tanhf(KDOT(qi, kj, hd) * scale / cap);
                    ds *= 1.0f - th * th;
                }
                KAXPY(dvj, p[j], doi, hd);
                KAXPY(dqi, ds, kj, hd);
                KAXPY(dkj, ds, qi, hd);
            }
        }
    }
    free(dp);
}

void ft_tr_layernorm_bwd(float *dx, const float *x, const float *w, const float *dy, int n, float eps)
{
    /* y_i = w_i xh_i + b_i, xh = (x - mean) r, r = (var + eps)^-1/2, g = w dy:
     * dx_i = r (g_i - mean(g) - xh_i mean(g xh)) */
    float mean = 0.0f, var = 0.0f;
    for (int i = 0; i < n; i++) mean += x[i];
    mean /= (float)n;
    for (int i = 0; i < n; i++) {
        float d = x[i] - mean;
        var += d * d;
    }
    var /= (float)n;
    float r = 1.0f / sqrtf(var + eps), sg = 0.0f, sgx = 0.0f;
    for (int i = 0; i < n; i++) {
        float g = (w ? w[i] : 1.0f) * dy[i];
        sg += g;
        sgx += g * (x[i] - mean) * r;
    }
    sg /= (float)n;
    sgx /= (float)n;
    for (int i = 0; i < n; i++) {
        float g = (w ? w[i] : 1.0f) * dy[i];
        dx[i] += r * (g - sg - (x[i] - mean) * r * sgx);
    }
}

/* ------------------------------------------ 16-bit 16 x 16 transposes */

void ft_tr_transpose16_ref(uint16_t *dst, size_t ldd, const uint16_t *src, size_t lds, int n, int m)
{
    for (int c = 0; c < m; c++)
        for (int o = 0; o < n; o++) dst[(size_t)c * ldd + (size_t)o] = src[(size_t)o * lds + (size_t)c];
}

#if defined(__x86_64__) || defined(__i386__)
/* AVX2: 16 rows of 16 values, unpacked at 16, 32 and 64 bits within the
 * 128-bit lanes (column pairs, then 4 rows per column, then 8), the lanes
 * then joined: 64 shuffles per tile instead of 256 scalar moves. */
__attribute__((target("avx2"))) static void tr16_avx2(uint16_t *dst, size_t ldd, const uint16_t *src, size_t lds)
{
    __m256i r[16], t[16], v[2][8];
    for (int i = 0; i < 16; i++) r[i] = _mm256_loadu_si256((const __m256i *)(src + (size_t)i * lds));
    for (int i = 0; i < 8; i++) {   /* 32-bit units: (row 2i, row 2i+1) of cols 0-3 | 8-11, 4-7 | 12-15 */
        t[2 * i] = _mm256_unpacklo_epi16(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_epi16(r[2 * i], r[2 * i + 1]);
    }
    for (int g = 0; g < 4; g++) {   /* 64-bit units: rows 4g..4g+3 of one column */
        r[4 * g + 0] = _mm256_unpacklo_epi32(t[4 * g], t[4 * g + 2]);       /* cols 0,1 | 8,9   */
        r[4 * g + 1] = _mm256_unpackhi_epi32(t[4 * g], t[4 * g + 2]);       /* cols 2,3 | 10,11 */
        r[4 * g + 2] = _mm256_unpacklo_epi32(t[4 * g + 1], t[4 * g + 3]);   /* cols 4,5 | 12,13 */
        r[4 * g + 3] = _mm256_unpackhi_epi32(t[4 * g + 1], t[4 * g + 3]);   /* cols 6,7 | 14,15 */
    }
    for (int h = 0; h < 2; h++)   /* 128-bit units: rows 8h..8h+7 of one column */
        for (int k = 0; k < 4; k++) {
            v[h][2 * k] = _mm256_unpacklo_epi64(r[8 * h + k], r[8 * h + 4 + k]);       /* col 2k   | 2k+8 */
            v[h][2 * k + 1] = _mm256_unpackhi_epi64(r[8 * h + k], r[8 * h + 4 + k]);   /* col 2k+1 | 2k+9 */
        }
    for (int c = 0; c < 8; c++) {
        _mm256_storeu_si256((__m256i *)(dst + (size_t)c * ldd), _mm256_permute2x128_si256(v[0][c], v[1][c], 0x20));
        _mm256_storeu_si256((__m256i *)(dst + (size_t)(c + 8) * ldd),
                            _mm256_permute2x128_si256(v[0][c], v[1][c], 0x31));
    }
}
#endif

void ft_tr_transpose16(uint16_t *dst, size_t ldd, const uint16_t *src, size_t lds, int n, int m)
{
#if defined(__x86_64__) || defined(__i386__)
    if (n == 16 && m == 16 && ft_simd_enabled() && ft_cpu()->avx2) {
        tr16_avx2(dst, ldd, src, lds);
        return;
    }
#endif
    ft_tr_transpose16_ref(dst, ldd, src, lds, n, m);
}

/* ------------------------------------- f32 products of the adapters */

void ft_tr_acc_ref(float *C, int ldc, const float *P, int psm, int psk, int M, int K, const float *Q, int ldq, int n0,
                   int n1)
{
    for (int m = 0; m < M; m++)
        for (int n = n0; n < n1; n++) {
            float c = C[(size_t)m * (size_t)ldc + (size_t)n];
            for (int k = 0; k < K; k++)
                c = fmaf(P[(size_t)m * (size_t)psm + (size_t)k * (size_t)psk], Q[(size_t)k * (size_t)ldq + (size_t)n], c);
            C[(size_t)m * (size_t)ldc + (size_t)n] = c;
        }
}

#if defined(__x86_64__)
#define TR_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma")))
#if defined(__SANITIZE_ADDRESS__)
#define TR_NO_UNROLL 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TR_NO_UNROLL 1
#endif
#endif
#ifdef TR_NO_UNROLL
#define TR_UNROLL
#else
#define TR_UNROLL _Pragma("GCC unroll 32")
#endif

/* MR rows of C x 64 columns (masks m): 24 accumulators loaded from C, one
 * FMA per (k, row, vector) in k order, stored back */
TR_AVX512 static inline __attribute__((always_inline)) void acc_blk(float *C, int ldc, const float *P, int psm, int psk,
                                                                     int K, const float *Q, int ldq, const int MR,
                                                                     const __mmask16 *m)
{
    __m512 acc[6][4];
    TR_UNROLL for (int r = 0; r < MR; r++) TR_UNROLL for (int v = 0; v < 4; v++)
        acc[r][v] = _mm512_maskz_loadu_ps(m[v], C + (size_t)r * (size_t)ldc + 16 * v);
    for (int k = 0; k < K; k++) {
        __m512 q[4];
        TR_UNROLL for (int v = 0; v < 4; v++) q[v] = _mm512_maskz_loadu_ps(m[v], Q + (size_t)k * (size_t)ldq + 16 * v);
        TR_UNROLL for (int r = 0; r < MR; r++) {
            __m512 p = _mm512_set1_ps(P[(size_t)r * (size_t)psm + (size_t)k * (size_t)psk]);
            TR_UNROLL for (int v = 0; v < 4; v++) acc[r][v] = _mm512_fmadd_ps(p, q[v], acc[r][v]);
        }
    }
    TR_UNROLL for (int r = 0; r < MR; r++) TR_UNROLL for (int v = 0; v < 4; v++)
        _mm512_mask_storeu_ps(C + (size_t)r * (size_t)ldc + 16 * v, m[v], acc[r][v]);
}

TR_AVX512 static void acc_avx512(float *C, int ldc, const float *P, int psm, int psk, int M, int K, const float *Q,
                                 int ldq, int n0, int n1)
{
    for (int nb = n0; nb < n1; nb += 64) {
        __mmask16 m[4];
        for (int v = 0; v < 4; v++) {
            int c = n1 - nb - 16 * v;
            m[v] = c >= 16 ? (__mmask16)0xffff : c <= 0 ? 0 : (__mmask16)((1u << c) - 1);
        }
        for (int r = 0; r < M; r += 6) {
            float *cc = C + (size_t)r * (size_t)ldc + (size_t)nb;
            const float *pp = P + (size_t)r * (size_t)psm, *qq = Q + (size_t)nb;
            switch (M - r < 6 ? M - r : 6) {
            case 6: acc_blk(cc, ldc, pp, psm, psk, K, qq, ldq, 6, m); break;
            case 5: acc_blk(cc, ldc, pp, psm, psk, K, qq, ldq, 5, m); break;
            case 4: acc_blk(cc, ldc, pp, psm, psk, K, qq, ldq, 4, m); break;
            case 3: acc_blk(cc, ldc, pp, psm, psk, K, qq, ldq, 3, m); break;
            case 2: acc_blk(cc, ldc, pp, psm, psk, K, qq, ldq, 2, m); break;
            default: acc_blk(cc, ldc, pp, psm, psk, K, qq, ldq, 1, m); break;
            }
        }
    }
}
#endif

void ft_tr_dots_ref(float *C, int ldc, const float *P, int ldp, int m0, int m1, const float *Q, int ldq, int N, int K)
{
    for (int m = m0; m < m1; m++)
        for (int n = 0; n < N; n++) {
            float s = 0.0f;
            for (int k = 0; k < K; k++) s = fmaf(P[(size_t)m * (size_t)ldp + (size_t)k], Q[(size_t)n * (size_t)ldq + (size_t)k], s);
            C[(size_t)m * (size_t)ldc + (size_t)n] = s;
        }
}

#if defined(__x86_64__)
/* MR rows of P x NQ rows of Q: MR x NQ vector sums along k (16 lanes,
 * the last vector masked), each reduced once */
TR_AVX512 static inline __attribute__((always_inline)) void dots_blk(float *C, int ldc, const float *P, int ldp,
                                                                      const float *Q, int ldq, int K, const int MR,
                                                                      const int NQ)
{
    __m512 acc[6][4];
    TR_UNROLL for (int r = 0; r < MR; r++) TR_UNROLL for (int v = 0; v < NQ; v++) acc[r][v] = _mm512_setzero_ps();
    for (int k = 0; k < K; k += 16) {
        __mmask16 m = K - k >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (K - k)) - 1);
        __m512 q[4];
        TR_UNROLL for (int v = 0; v < NQ; v++) q[v] = _mm512_maskz_loadu_ps(m, Q + (size_t)v * (size_t)ldq + (size_t)k);
        TR_UNROLL for (int r = 0; r < MR; r++) {
            __m512 p = _mm512_maskz_loadu_ps(m, P + (size_t)r * (size_t)ldp + (size_t)k);
            TR_UNROLL for (int v = 0; v < NQ; v++) acc[r][v] = _mm512_fmadd_ps(p, q[v], acc[r][v]);
        }
    }
    TR_UNROLL for (int r = 0; r < MR; r++) TR_UNROLL for (int v = 0; v < NQ; v++)
        C[(size_t)r * (size_t)ldc + (size_t)v] = _mm512_reduce_add_ps(acc[r][v]);
}

#define DOTS_NQ(MR)                                                                                \
    switch (NQ) {                                                                                  \
    case 4: dots_blk(cc, ldc, pp, ldp, qq, ldq, K, MR, 4); break;                                  \
    case 3: dots_blk(cc, ldc, pp, ldp, qq, ldq, K, MR, 3); break;                                  \
    case 2: dots_blk(cc, ldc, pp, ldp, qq, ldq, K, MR, 2); break;                                  \
    default: dots_blk(cc, ldc, pp, ldp, qq, ldq, K, MR, 1); break;                                 \
    }

TR_AVX512 static void dots_avx512(float *C, int ldc, const float *P, int ldp, int m0, int m1, const float *Q, int ldq,
                                  int N, int K)
{
    for (int n = 0; n < N; n += 4) {
        const int NQ = N - n < 4 ? N - n : 4;
        for (int r = m0; r < m1; r += 6) {
            float *cc = C + (size_t)r * (size_t)ldc + (size_t)n;
            const float *pp = P + (size_t)r * (size_t)ldp, *qq = Q + (size_t)n * (size_t)ldq;
            if (m1 - r >= 6) { DOTS_NQ(6) }
            else for (int i = 0; i < m1 - r; i++) {
                cc = C + (size_t)(r + i) * (size_t)ldc + (size_t)n;
                pp = P + (size_t)(r + i) * (size_t)ldp;
                DOTS_NQ(1)
            }
        }
    }
}
#undef DOTS_NQ
#endif

void ft_tr_dots(float *C, int ldc, const float *P, int ldp, int m0, int m1, const float *Q, int ldq, int N, int K)
{
#if defined(__x86_64__)
    if (ft_simd_enabled() && ft_cpu()->avx512f && ft_cpu()->avx512bw && ft_cpu()->avx512vl) {
        dots_avx512(C, ldc, P, ldp, m0, m1, Q, ldq, N, K);
        return;
    }
#endif
    ft_tr_dots_ref(C, ldc, P, ldp, m0, m1, Q, ldq, N, K);
}

void ft_tr_acc(float *C, int ldc, const float *P, int psm, int psk, int M, int K, const float *Q, int ldq, int n0,
               int n1)
{
#if defined(__x86_64__)
    if (ft_simd_enabled() && ft_cpu()->avx512f && ft_cpu()->avx512bw && ft_cpu()->avx512vl) {
        acc_avx512(C, ldc, P, psm, psk, M, K, Q, ldq, n0, n1);
        return;
    }
#endif
    ft_tr_acc_ref(C, ldc, P, psm, psk, M, K, Q, ldq, n0, n1);
}
