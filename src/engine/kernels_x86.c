/* AVX2+FMA and AVX-512 kernels, compiled per function with target
 * attributes and chosen at run time by kernels.c. Tails fall back to the
 * scalar loop. exp uses the Cephes polynomial (about 1 ulp over the range
 * softmax and silu need). */
#include "kernels.h"
#include "kernels_simd.h"

#include <math.h>

#if defined(__x86_64__)
#include <immintrin.h>

#define AVX2 __attribute__((target("avx2,fma")))
#define AVX512 __attribute__((target("avx512f,avx2,fma")))

AVX2 static inline float hsum256(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

AVX2 static inline __m256 exp256(__m256 x)
{
    const __m256 hi = _mm256_set1_ps(88.3762626647949f), lo = _mm256_set1_ps(-88.3762626647949f);
    const __m256 log2e = _mm256_set1_ps(1.44269504088896341f);
    const __m256 c1 = _mm256_set1_ps(0.693359375f), c2 = _mm256_set1_ps(-2.12194440e-4f);
    x = _mm256_max_ps(_mm256_min_ps(x, hi), lo);
    __m256 fx = _mm256_round_ps(_mm256_mul_ps(x, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    x = _mm256_fnmadd_ps(fx, c1, x);
    x = _mm256_fnmadd_ps(fx, c2, x);
    __m256 z = _mm256_mul_ps(x, x);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, z, x);
    y = _mm256_add_ps(y, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

AVX2 float ft_k_dot_avx2(const float *a, const float *b, int n)
{
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    float s = hsum256(_mm256_add_ps(s0, s1));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

AVX2 void ft_k_axpy_avx2(float *y, float a, const float *x, int n)
{
    __m256 va = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}

AVX2 void ft_k_rmsnorm_avx2(float *out, const float *x, const float *w, int n, float eps)
{
    float r = 1.0f / sqrtf(ft_k_dot_avx2(x, x, n) / (float)n + eps);
    __m256 vr = _mm256_set1_ps(r);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), vr);
        if (w) v = _mm256_mul_ps(v, _mm256_loadu_ps(w + i));
        _mm256_storeu_ps(out + i, v);
    }
    for (; i < n; i++) out[i] = (x[i] * r) * (w ? w[i] : 1.0f);
}

AVX2 void ft_k_layernorm_avx2(float *out, const float *x, const float *w, const float *b, int n, float eps)
{
    __m256 s = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) s = _mm256_add_ps(s, _mm256_loadu_ps(x + i));
    float mean = hsum256(s);
    for (; i < n; i++) mean += x[i];
    mean /= (float)n;
    __m256 vm = _mm256_set1_ps(mean);
    s = _mm256_setzero_ps();
    for (i = 0; i + 8 <= n; i += 8) {
        __m256 d = _mm256_sub_ps(_mm256_loadu_ps(x + i), vm);
        s = _mm256_fmadd_ps(d, d, s);
    }
    float var = hsum256(s);
    for (; i < n; i++) { float d = x[i] - mean; var += d * d; }
    var /= (float)n;
    float r = 1.0f / sqrtf(var + eps);
    __m256 vr = _mm256_set1_ps(r);
    for (i = 0; i + 8 <= n; i += 8) {
        __m256 y = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm), vr);
        if (w) y = _mm256_mul_ps(y, _mm256_loadu_ps(w + i));
        if (b) y = _mm256_add_ps(y, _mm256_loadu_ps(b + i));
        _mm256_storeu_ps(out + i, y);
    }
    for (; i < n; i++) {
        float y = (x[i] - mean) * r;
        out[i] = y * (w ? w[i] : 1.0f) + (b ? b[i] : 0.0f);
    }
}

AVX2 void ft_k_softmax_avx2(float *x, int n)
{
    int i = 0;
    __m256 vm = _mm256_set1_ps(-INFINITY);
    for (; i + 8 <= n; i += 8) vm = _mm256_max_ps(vm, _mm256_loadu_ps(x + i));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vm), _mm256_extractf128_ps(vm, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    float mx = _mm_cvtss_f32(m4);
    for (; i < n; i++) if (x[i] > mx) mx = x[i];
    vm = _mm256_set1_ps(mx);
    __m256 vs = _mm256_setzero_ps();
    for (i = 0; i + 8 <= n; i += 8) {
        __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm));
        _mm256_storeu_ps(x + i, e);
        vs = _mm256_add_ps(vs, e);
    }
    float s = hsum256(vs);
    for (; i < n; i++) { x[i] = expf(x[i] - mx); s += x[i]; }
    float inv = 1.0f / s;
    __m256 vi = _mm256_set1_ps(inv);
    for (i = 0; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), vi));
    for (; i < n; i++) x[i] *= inv;
}

AVX2 void ft_k_rope_avx2(float *x, int n_heads, int head_dim, const float *c, const float *s)
{
    int h = head_dim / 2;
    for (int hd = 0; hd < n_heads; hd++) {
        float *v = x + (size_t)hd * head_dim;
        int i = 0;
        for (; i + 8 <= h; i += 8) {
            __m256 a = _mm256_loadu_ps(v + i), b = _mm256_loadu_ps(v + i + h);
            __m256 vc = _mm256_loadu_ps(c + i), vs = _mm256_loadu_ps(s + i);
            _mm256_storeu_ps(v + i, _mm256_fmsub_ps(a, vc, _mm256_mul_ps(b, vs)));
            _mm256_storeu_ps(v + i + h, _mm256_fmadd_ps(b, vc, _mm256_mul_ps(a, vs)));
        }
        for (; i < h; i++) {
            float a = v[i], b = v[i + h];
            v[i] = a * c[i] - b * s[i];
            v[i + h] = b * c[i] + a * s[i];
        }
    }
}

AVX2 void ft_k_silu_mul_avx2(float *g, const float *u, int n)
{
    const __m256 one = _mm256_set1_ps(1.0f);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(g + i);
        __m256 e = exp256(_mm256_sub_ps(_mm256_setzero_ps(), x));
        __m256 y = _mm256_div_ps(x, _mm256_add_ps(one, e));
        _mm256_storeu_ps(g + i, _mm256_mul_ps(y, _mm256_loadu_ps(u + i)));
    }
    for (; i < n; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

AVX512 float ft_k_dot_avx512(const float *a, const float *b, int n)
{
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
        s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
    }
    for (; i + 16 <= n; i += 16) s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        s1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), s1);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

AVX512 void ft_k_axpy_avx512(float *y, float a, const float *x, int n)
{
    __m512 va = _mm512_set1_ps(a);
    int i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(y + i, m, _mm512_fmadd_ps(va, _mm512_maskz_loadu_ps(m, x + i),
                                                        _mm512_maskz_loadu_ps(m, y + i)));
    }
}

AVX512 void ft_k_rmsnorm_avx512(float *out, const float *x, const float *w, int n, float eps)
{
    float r = 1.0f / sqrtf(ft_k_dot_avx512(x, x, n) / (float)n + eps);
    __m512 vr = _mm512_set1_ps(r);
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_mul_ps(_mm512_loadu_ps(x + i), vr);
        if (w) v = _mm512_mul_ps(v, _mm512_loadu_ps(w + i));
        _mm512_storeu_ps(out + i, v);
    }
    for (; i < n; i++) out[i] = (x[i] * r) * (w ? w[i] : 1.0f);
}
/* 4 weight rows x 2 input rows per block: 8 accumulators, 6 loads per 8
 * FMAs; masked tails, so any `in` works. */
AVX512 void ft_k_matmul_rows_avx512(float *y, int ldy, const float *x, int rows, const float *W,
                                    int nout, int in, const float *b)
{
    int o = 0;
    for (; o + 4 <= nout; o += 4) {
        const float *w0 = W + (size_t)o * in, *w1 = w0 + in, *w2 = w1 + in, *w3 = w2 + in;
        int r = 0;
        for (; r + 2 <= rows; r += 2) {
            const float *x0 = x + (size_t)r * in, *x1 = x0 + in;
            __m512 a00 = _mm512_setzero_ps(), a01 = a00, a02 = a00, a03 = a00;
            __m512 a10 = a00, a11 = a00, a12 = a00, a13 = a00;
            for (int i = 0; i < in; i += 16) {
                __mmask16 m = in - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (in - i)) - 1);
                __m512 v0 = _mm512_maskz_loadu_ps(m, x0 + i), v1 = _mm512_maskz_loadu_ps(m, x1 + i);
                __m512 q = _mm512_maskz_loadu_ps(m, w0 + i);
                a00 = _mm512_fmadd_ps(v0, q, a00); a10 = _mm512_fmadd_ps(v1, q, a10);
                q = _mm512_maskz_loadu_ps(m, w1 + i);
                a01 = _mm512_fmadd_ps(v0, q, a01); a11 = _mm512_fmadd_ps(v1, q, a11);
                q = _mm512_maskz_loadu_ps(m, w2 + i);
                a02 = _mm512_fmadd_ps(v0, q, a02); a12 = _mm512_fmadd_ps(v1, q, a12);
                q = _mm512_maskz_loadu_ps(m, w3 + i);
                a03 = _mm512_fmadd_ps(v0, q, a03); a13 = _mm512_fmadd_ps(v1, q, a13);
            }
            float *y0 = y + (size_t)r * ldy + o, *y1 = y0 + ldy;
            y0[0] = _mm512_reduce_add_ps(a00) + (b ? b[o] : 0.0f);
            y0[1] = _mm512_reduce_add_ps(a01) + (b ? b[o + 1] : 0.0f);
            y0[2] = _mm512_reduce_add_ps(a02) + (b ? b[o + 2] : 0.0f);
            y0[3] = _mm512_reduce_add_ps(a03) + (b ? b[o + 3] : 0.0f);
            y1[0] = _mm512_reduce_add_ps(a10) + (b ? b[o] : 0.0f);
            y1[1] = _mm512_reduce_add_ps(a11) + (b ? b[o + 1] : 0.0f);
            y1[2] = _mm512_reduce_add_ps(a12) + (b ? b[o + 2] : 0.0f);
            y1[3] = _mm512_reduce_add_ps(a13) + (b ? b[o + 3] : 0.0f);
        }
        for (; r < rows; r++)
            for (int k = 0; k < 4; k++)
                y[(size_t)r * ldy + o + k] = ft_k_dot_avx512(x + (size_t)r * in, W + (size_t)(o + k) * in, in)
                                             + (b ? b[o + k] : 0.0f);
    }
    for (; o < nout; o++)
        for (int r = 0; r < rows; r++)
            y[(size_t)r * ldy + o] = ft_k_dot_avx512(x + (size_t)r * in, W + (size_t)o * in, in)
                                     + (b ? b[o] : 0.0f);
}
/* 12 outputs x 32 rows (24 accumulators) or 24 outputs x 16 rows per
 * block; per input i: the x column (1-2 aligned loads) and one broadcast
 * weight per output, fused into the FMA. A tail block repeats its last
 * weight row (results not stored). */
#define XT_FMA2(k) { __m512 wb = _mm512_set1_ps(w##k[i]); a##k##0 = _mm512_fmadd_ps(x0, wb, a##k##0); \
                     a##k##1 = _mm512_fmadd_ps(x1, wb, a##k##1); }
#define XT_FMA1(k) { a##k = _mm512_fmadd_ps(x0, _mm512_set1_ps(w##k[i]), a##k); }
AVX512 void ft_k_matmul_xt_avx512(float *y, int ldy, const float *xt, int ldx, int rows, const float *W,
                                  int nout, int in, const float *b)
{
    float tmp[24 * 32] __attribute__((aligned(64)));
    const int ob = ldx == 32 ? 12 : 24;
    for (int o = 0; o < nout; o += ob) {
        int no = nout - o < ob ? nout - o : ob;
        const float *w[24];
        for (int k = 0; k < 24; k++) w[k] = W + (size_t)(o + (k < no ? k : no - 1)) * in;
        if (ldx == 32) {
            const float *w0 = w[0], *w1 = w[1], *w2 = w[2], *w3 = w[3], *w4 = w[4], *w5 = w[5];
            const float *w6 = w[6], *w7 = w[7], *w8 = w[8], *w9 = w[9], *w10 = w[10], *w11 = w[11];
            __m512 z = _mm512_setzero_ps();
            __m512 a00 = z, a01 = z, a10 = z, a11 = z, a20 = z, a21 = z, a30 = z, a31 = z, a40 = z, a41 = z;
            __m512 a50 = z, a51 = z, a60 = z, a61 = z, a70 = z, a71 = z, a80 = z, a81 = z, a90 = z, a91 = z;
            __m512 a100 = z, a101 = z, a110 = z, a111 = z;
            for (int i = 0; i < in; i++) {
                __m512 x0 = _mm512_load_ps(xt + (size_t)i * 32), x1 = _mm512_load_ps(xt + (size_t)i * 32 + 16);
                XT_FMA2(0) XT_FMA2(1) XT_FMA2(2) XT_FMA2(3) XT_FMA2(4) XT_FMA2(5)
                XT_FMA2(6) XT_FMA2(7) XT_FMA2(8) XT_FMA2(9) XT_FMA2(10) XT_FMA2(11)
            }
            __m512 acc[24] = {a00, a01, a10, a11, a20, a21, a30, a31, a40, a41, a50, a51,
                              a60, a61, a70, a71, a80, a81, a90, a91, a100, a101, a110, a111};
            for (int k = 0; k < 24; k++) _mm512_store_ps(tmp + k * 16, acc[k]);   /* tmp[out][32 rows] */
        } else {
            const float *w0 = w[0], *w1 = w[1], *w2 = w[2], *w3 = w[3], *w4 = w[4], *w5 = w[5];
            const float *w6 = w[6], *w7 = w[7], *w8 = w[8], *w9 = w[9], *w10 = w[10], *w11 = w[11];
            const float *w12 = w[12], *w13 = w[13], *w14 = w[14], *w15 = w[15], *w16 = w[16], *w17 = w[17];
            const float *w18 = w[18], *w19 = w[19], *w20 = w[20], *w21 = w[21], *w22 = w[22], *w23 = w[23];
            __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
            __m512 a8 = a0, a9 = a0, a10 = a0, a11 = a0, a12 = a0, a13 = a0, a14 = a0, a15 = a0;
            __m512 a16 = a0, a17 = a0, a18 = a0, a19 = a0, a20 = a0, a21 = a0, a22 = a0, a23 = a0;
            for (int i = 0; i < in; i++) {
                __m512 x0 = _mm512_load_ps(xt + (size_t)i * 16);
                XT_FMA1(0) XT_FMA1(1) XT_FMA1(2) XT_FMA1(3) XT_FMA1(4) XT_FMA1(5) XT_FMA1(6) XT_FMA1(7)
                XT_FMA1(8) XT_FMA1(9) XT_FMA1(10) XT_FMA1(11) XT_FMA1(12) XT_FMA1(13) XT_FMA1(14) XT_FMA1(15)
                XT_FMA1(16) XT_FMA1(17) XT_FMA1(18) XT_FMA1(19) XT_FMA1(20) XT_FMA1(21) XT_FMA1(22) XT_FMA1(23)
            }
            __m512 acc[24] = {a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11,
                              a12, a13, a14, a15, a16, a17, a18, a19, a20, a21, a22, a23};
            for (int k = 0; k < 24; k++) _mm512_store_ps(tmp + k * 16, acc[k]);   /* tmp[out][16 rows] */
        }
        for (int k = 0; k < no; k++) {
            float bk = b ? b[o + k] : 0.0f;
            const float *t = tmp + (size_t)k * ldx;
            for (int r = 0; r < rows; r++) y[(size_t)r * ldy + o + k] = t[r] + bk;
        }
    }
}
#undef XT_FMA1
#undef XT_FMA2

/* Attention for one query row. Scores: 4 positions per step, so each
 * horizontal reduction is shared by 4 dot products' worth of loads; the
 * weighted V sum keeps the output row in registers (hd <= 128) instead of
 * reloading it per position. */
AVX512 void ft_k_attend_avx512(float *out, const float *q, const float *K, const float *V, int ld,
                               int npos, int hd, float scale, float *sc)
{
    if (hd > 128) {
        for (int p = 0; p < npos; p++) sc[p] = ft_k_dot_avx512(q, K + (size_t)p * ld, hd) * scale;
        ft_k_softmax_avx2(sc, npos);
        for (int i = 0; i < hd; i++) out[i] = 0;
        for (int p = 0; p < npos; p++) ft_k_axpy_avx512(out, sc[p], V + (size_t)p * ld, hd);
        return;
    }
    int nch = (hd + 15) / 16;
    __mmask16 last = (hd % 16) ? (__mmask16)((1u << (hd % 16)) - 1) : (__mmask16)0xffff;
    __m512 qv[8];
    for (int c = 0; c < nch; c++) qv[c] = _mm512_maskz_loadu_ps(c == nch - 1 ? last : 0xffff, q + c * 16);
    int p = 0;
    for (; p + 4 <= npos; p += 4) {
        const float *k0 = K + (size_t)p * ld, *k1 = k0 + ld, *k2 = k1 + ld, *k3 = k2 + ld;
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int c = 0; c < nch; c++) {
            __mmask16 m = c == nch - 1 ? last : 0xffff;
            a0 = _mm512_fmadd_ps(qv[c], _mm512_maskz_loadu_ps(m, k0 + c * 16), a0);
            a1 = _mm512_fmadd_ps(qv[c], _mm512_maskz_loadu_ps(m, k1 + c * 16), a1);
            a2 = _mm512_fmadd_ps(qv[c], _mm512_maskz_loadu_ps(m, k2 + c * 16), a2);
            a3 = _mm512_fmadd_ps(qv[c], _mm512_maskz_loadu_ps(m, k3 + c * 16), a3);
        }
        sc[p] = _mm512_reduce_add_ps(a0) * scale;
        sc[p + 1] = _mm512_reduce_add_ps(a1) * scale;
        sc[p + 2] = _mm512_reduce_add_ps(a2) * scale;
        sc[p + 3] = _mm512_reduce_add_ps(a3) * scale;
    }
    for (; p < npos; p++) {
        const float *k0 = K + (size_t)p * ld;
        __m512 a0 = _mm512_setzero_ps();
        for (int c = 0; c < nch; c++)
            a0 = _mm512_fmadd_ps(qv[c], _mm512_maskz_loadu_ps(c == nch - 1 ? last : 0xffff, k0 + c * 16), a0);
        sc[p] = _mm512_reduce_add_ps(a0) * scale;
    }
    ft_k_softmax_avx2(sc, npos);
    __m512 acc[8];
    for (int c = 0; c < nch; c++) acc[c] = _mm512_setzero_ps();
    for (p = 0; p < npos; p++) {
        const float *v = V + (size_t)p * ld;
        __m512 w = _mm512_set1_ps(sc[p]);
        for (int c = 0; c < nch; c++)
            acc[c] = _mm512_fmadd_ps(w, _mm512_maskz_loadu_ps(c == nch - 1 ? last : 0xffff, v + c * 16), acc[c]);
    }
    for (int c = 0; c < nch; c++) _mm512_mask_storeu_ps(out + c * 16, c == nch - 1 ? last : 0xffff, acc[c]);
}
#else
/* Non-x86: the dispatcher never selects these. */
float ft_k_dot_avx2(const float *a, const float *b, int n) { return ft_k_dot_ref(a, b, n); }
void ft_k_axpy_avx2(float *y, float a, const float *x, int n) { ft_k_axpy_ref(y, a, x, n); }
void ft_k_rmsnorm_avx2(float *o, const float *x, const float *w, int n, float e) { ft_k_rmsnorm_ref(o, x, w, n, e); }
void ft_k_layernorm_avx2(float *o, const float *x, const float *w, const float *b, int n, float e)
{ ft_k_layernorm_ref(o, x, w, b, n, e); }
void ft_k_softmax_avx2(float *x, int n) { ft_k_softmax_ref(x, n); }
void ft_k_rope_avx2(float *x, int nh, int hd, const float *c, const float *s) { ft_k_rope_ref(x, nh, hd, c, s); }
void ft_k_silu_mul_avx2(float *g, const float *u, int n) { ft_k_silu_mul_ref(g, u, n); }
float ft_k_dot_avx512(const float *a, const float *b, int n) { return ft_k_dot_ref(a, b, n); }
void ft_k_axpy_avx512(float *y, float a, const float *x, int n) { ft_k_axpy_ref(y, a, x, n); }
void ft_k_rmsnorm_avx512(float *o, const float *x, const float *w, int n, float e) { ft_k_rmsnorm_ref(o, x, w, n, e); }
void ft_k_matmul_rows_avx512(float *y, int ldy, const float *x, int rows, const float *W, int nout,
                             int in, const float *b)
{ ft_k_matmul_rows_ref(y, ldy, x, rows, W, nout, in, b); }
void ft_k_matmul_xt_avx512(float *y, int ldy, const float *xt, int ldx, int rows, const float *W, int nout,
                           int in, const float *b)
{ ft_k_matmul_xt_ref(y, ldy, xt, ldx, rows, W, nout, in, b); }
void ft_k_attend_avx512(float *out, const float *q, const float *K, const float *V, int ld, int npos,
                        int hd, float scale, float *sc)
{ ft_k_attend_ref(out, q, K, V, ld, npos, hd, scale, sc); }
#endif
