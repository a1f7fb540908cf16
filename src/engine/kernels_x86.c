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
#endif
