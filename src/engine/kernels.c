/* Scalar reference kernels and the run-time dispatch. The SIMD versions
 * live in kernels_x86.c. */
#include "kernels.h"
#include "kernels_simd.h"
#include "flextier/core.h"

#include <math.h>
#include <pthread.h>

float ft_k_dot_ref(const float *a, const float *b, int n)
{
    float s = 0;
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

void ft_k_axpy_ref(float *y, float a, const float *x, int n)
{
    for (int i = 0; i < n; i++) y[i] += a * x[i];
}

void ft_k_rmsnorm_ref(float *out, const float *x, const float *w, int n, float eps)
{
    float ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    float r = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = 0; i < n; i++) out[i] = (x[i] * r) * (w ? w[i] : 1.0f);
}

void ft_k_layernorm_ref(float *out, const float *x, const float *w, const float *b, int n, float eps)
{
    float mean = 0, var = 0;
    for (int i = 0; i < n; i++) mean += x[i];
    mean /= (float)n;
    for (int i = 0; i < n; i++) { float d = x[i] - mean; var += d * d; }
    var /= (float)n;
    float r = 1.0f / sqrtf(var + eps);
    for (int i = 0; i < n; i++) {
        float y = (x[i] - mean) * r;
        out[i] = y * (w ? w[i] : 1.0f) + (b ? b[i] : 0.0f);
    }
}

void ft_k_softmax_ref(float *x, int n)
{
    float mx = x[0];
    for (int i = 1; i < n; i++) if (x[i] > mx) mx = x[i];
    float s = 0;
    for (int i = 0; i < n; i++) { x[i] = expf(x[i] - mx); s += x[i]; }
    float inv = 1.0f / s;
    for (int i = 0; i < n; i++) x[i] *= inv;
}

void ft_k_rope_ref(float *x, int n_heads, int head_dim, const float *c, const float *s)
{
    int h = head_dim / 2;
    for (int hd = 0; hd < n_heads; hd++) {
        float *v = x + (size_t)hd * head_dim;
        for (int i = 0; i < h; i++) {
            float a = v[i], b = v[i + h];
            v[i] = a * c[i] - b * s[i];
            v[i + h] = b * c[i] + a * s[i];
        }
    }
}

void ft_k_silu_mul_ref(float *g, const float *u, int n)
{
    for (int i = 0; i < n; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

void ft_k_matmul_rows_ref(float *y, int ldy, const float *x, int rows, const float *W, int nout,
                          int in, const float *b)
{
    for (int r = 0; r < rows; r++)
        for (int o = 0; o < nout; o++)
            y[(size_t)r * ldy + o] = ft_k_dot_ref(x + (size_t)r * in, W + (size_t)o * in, in) + (b ? b[o] : 0.0f);
}

void ft_k_matmul_xt_ref(float *y, int ldy, const float *xt, int ldx, int rows, const float *W, int nout,
                        int in, const float *b)
{
    for (int o = 0; o < nout; o++)
        for (int r = 0; r < rows; r++) {
            float acc = 0.0f;
            for (int i = 0; i < in; i++) acc = fmaf(xt[(size_t)i * ldx + r], W[(size_t)o * in + i], acc);
            y[(size_t)r * ldy + o] = acc + (b ? b[o] : 0.0f);
        }
}

void ft_k_transpose_rows(float *xt, int ldx, const float *x, int rows, int in)
{
    for (int i = 0; i < in; i++) {
        float *t = xt + (size_t)i * ldx;
        for (int r = 0; r < rows; r++) t[r] = x[(size_t)r * in + i];
        for (int r = rows; r < ldx; r++) t[r] = 0.0f;
    }
}

void ft_k_attend_ref(float *out, const float *q, const float *K, const float *V, int ld, int npos,
                     int hd, float scale, float *sc)
{
    for (int p = 0; p < npos; p++) sc[p] = ft_k_dot_ref(q, K + (size_t)p * ld, hd) * scale;
    ft_k_softmax_ref(sc, npos);
    for (int i = 0; i < hd; i++) out[i] = 0;
    for (int p = 0; p < npos; p++) ft_k_axpy_ref(out, sc[p], V + (size_t)p * ld, hd);
}

void ft_k_attend_segs_ref(float *out, const float *q, const ft_attn_seg *seg, int nseg, int ld, int hd,
                          float scale, float *sc)
{
    int np = 0;
    for (int s = 0; s < nseg; s++)
        for (int p = 0; p < seg[s].n; p++) sc[np++] = ft_k_dot_ref(q, seg[s].k + (size_t)p * ld, hd) * scale;
    ft_k_softmax_ref(sc, np);
    for (int i = 0; i < hd; i++) out[i] = 0;
    np = 0;
    for (int s = 0; s < nseg; s++)
        for (int p = 0; p < seg[s].n; p++) ft_k_axpy_ref(out, sc[np++], seg[s].v + (size_t)p * ld, hd);
}

/* SIMD tiers: composed from the dispatched dot/softmax/axpy. */
__attribute__((unused)) static void attend_segs_composed(float *out, const float *q, const ft_attn_seg *seg, int nseg, int ld,
                                 int hd, float scale, float *sc);

/* AVX2 tier: composed from the dispatched kernels. */
__attribute__((unused)) static void attend_composed(float *out, const float *q, const float *kc, const float *vc, int ld,
                            int npos, int hd, float scale, float *sc);

__attribute__((unused)) static void matmul_rows_dot(float *y, int ldy, const float *x, int rows, const float *W, int nout,
                            int in, const float *b);

/* ------------------------------------------------------------ dispatch */

typedef ft_kernels ktable;

static ktable K;
static pthread_once_t K_once = PTHREAD_ONCE_INIT;

static void k_init(void)
{
    K = (ktable){"scalar", ft_k_dot_ref, ft_k_axpy_ref, ft_k_rmsnorm_ref, ft_k_layernorm_ref,
                 ft_k_softmax_ref, ft_k_rope_ref, ft_k_silu_mul_ref, ft_k_matmul_rows_ref,
                 ft_k_attend_ref, ft_k_attend_segs_ref, NULL};
#if defined(__x86_64__)
    const ft_cpu_features *f = ft_cpu();
    if (!ft_simd_enabled()) return;
    if (f->avx2 && f->fma) {
        K = (ktable){"avx2", ft_k_dot_avx2, ft_k_axpy_avx2, ft_k_rmsnorm_avx2, ft_k_layernorm_avx2,
                     ft_k_softmax_avx2, ft_k_rope_avx2, ft_k_silu_mul_avx2, matmul_rows_dot,
                     attend_composed, attend_segs_composed, NULL};
    }
    if (f->avx512f && f->avx2 && f->fma) {
        K.name = "avx512";
        K.dot = ft_k_dot_avx512;
        K.axpy = ft_k_axpy_avx512;
        K.rmsnorm = ft_k_rmsnorm_avx512;
        K.matmul_rows = ft_k_matmul_rows_avx512;
        K.attend = ft_k_attend_avx512;
        K.matmul_xt = ft_k_matmul_xt_avx512;
    }
#endif
}

static inline const ktable *kt(void)
{
    pthread_once(&K_once, k_init);
    return &K;
}

const char *ft_k_impl(void) { return kt()->name; }
const ft_kernels *ft_k_get(void) { return kt(); }
float ft_k_dot(const float *a, const float *b, int n) { return kt()->dot(a, b, n); }
void ft_k_axpy(float *y, float a, const float *x, int n) { kt()->axpy(y, a, x, n); }
void ft_k_rmsnorm(float *out, const float *x, const float *w, int n, float eps)
{ kt()->rmsnorm(out, x, w, n, eps); }
void ft_k_layernorm(float *out, const float *x, const float *w, const float *b, int n, float eps)
{ kt()->layernorm(out, x, w, b, n, eps); }
void ft_k_softmax(float *x, int n) { kt()->softmax(x, n); }
void ft_k_rope(float *x, int nh, int hd, const float *c, const float *s) { kt()->rope(x, nh, hd, c, s); }
void ft_k_silu_mul(float *g, const float *u, int n) { kt()->silu_mul(g, u, n); }
void ft_k_matmul_rows(float *y, int ldy, const float *x, int rows, const float *W, int nout, int in,
                      const float *b)
{ kt()->matmul_rows(y, ldy, x, rows, W, nout, in, b); }

void ft_k_attend_segs(float *out, const float *q, const ft_attn_seg *seg, int nseg, int ld, int hd,
                      float scale, float *sc)
{ kt()->attend_segs(out, q, seg, nseg, ld, hd, scale, sc); }

__attribute__((unused)) static void attend_segs_composed(float *out, const float *q, const ft_attn_seg *seg, int nseg, int ld,
                                 int hd, float scale, float *sc)
{
    int np = 0;
    for (int s = 0; s < nseg; s++)
        for (int p = 0; p < seg[s].n; p++) sc[np++] = K.dot(q, seg[s].k + (size_t)p * ld, hd) * scale;
    K.softmax(sc, np);
    for (int i = 0; i < hd; i++) out[i] = 0;
    np = 0;
    for (int s = 0; s < nseg; s++)
        for (int p = 0; p < seg[s].n; p++) K.axpy(out, sc[np++], seg[s].v + (size_t)p * ld, hd);
}

void ft_k_attend(float *out, const float *q, const float *kc, const float *vc, int ld, int npos,
                 int hd, float scale, float *sc)
{ kt()->attend(out, q, kc, vc, ld, npos, hd, scale, sc); }

__attribute__((unused)) static void attend_composed(float *out, const float *q, const float *kc, const float *vc, int ld,
                            int npos, int hd, float scale, float *sc)
{
    for (int p = 0; p < npos; p++) sc[p] = K.dot(q, kc + (size_t)p * ld, hd) * scale;
    K.softmax(sc, npos);
    for (int i = 0; i < hd; i++) out[i] = 0;
    for (int p = 0; p < npos; p++) K.axpy(out, sc[p], vc + (size_t)p * ld, hd);
}

/* AVX2 tier: row-by-row dots with the dispatched dot kernel. */
__attribute__((unused)) static void matmul_rows_dot(float *y, int ldy, const float *x, int rows, const float *W, int nout,
                            int in, const float *b)
{
    for (int o = 0; o < nout; o++)
        for (int r = 0; r < rows; r++)
            y[(size_t)r * ldy + o] = K.dot(x + (size_t)r * in, W + (size_t)o * in, in) + (b ? b[o] : 0.0f);
}
