/* Engine compute kernels. Each has a scalar _ref twin (the definition the
 * SIMD versions are tested against); the un-suffixed entry points dispatch
 * at run time (AVX-512 > AVX2+FMA > scalar; FLEXTIER_NO_SIMD=1 forces
 * scalar). All take unaligned pointers. */
#ifndef FT_ENGINE_KERNELS_H
#define FT_ENGINE_KERNELS_H
#include <stddef.h>

float ft_k_dot(const float *a, const float *b, int n);
float ft_k_dot_ref(const float *a, const float *b, int n);
/* y += a * x */
void ft_k_axpy(float *y, float a, const float *x, int n);
void ft_k_axpy_ref(float *y, float a, const float *x, int n);
/* out = x / sqrt(mean(x^2) + eps) * w   (HF LlamaRMSNorm, f32) */
void ft_k_rmsnorm(float *out, const float *x, const float *w, int n, float eps);
void ft_k_rmsnorm_ref(float *out, const float *x, const float *w, int n, float eps);
/* out = (x - mean) / sqrt(var + eps) * w + b; w/b may be NULL (1 / 0). */
void ft_k_layernorm(float *out, const float *x, const float *w, const float *b, int n, float eps);
void ft_k_layernorm_ref(float *out, const float *x, const float *w, const float *b, int n, float eps);
/* In-place softmax over n >= 1 values. */
void ft_k_softmax(float *x, int n);
void ft_k_softmax_ref(float *x, int n);
/* HF rotate_half RoPE on n_heads heads of head_dim (even) at one position:
 * x[i] = x[i] c[i] - x[i+h] s[i], x[i+h] = x[i+h] c[i] + x[i] s[i], h = hd/2. */
void ft_k_rope(float *x, int n_heads, int head_dim, const float *cos, const float *sin);
void ft_k_rope_ref(float *x, int n_heads, int head_dim, const float *cos, const float *sin);
/* g = silu(g) * u */
void ft_k_silu_mul(float *g, const float *u, int n);
void ft_k_silu_mul_ref(float *g, const float *u, int n);

/* y[r*ldy + o] = dot(x[r*in ..], W[o*in ..]) (+ b[o]) for r < rows, o < nout:
 * a small-batch matrix product against weights in (out, in) layout that
 * reads each weight row once per block of 4 outputs. */
void ft_k_matmul_rows(float *y, int ldy, const float *x, int rows, const float *W, int nout,
                      int in, const float *b);
void ft_k_matmul_rows_ref(float *y, int ldy, const float *x, int rows, const float *W, int nout,
                          int in, const float *b);

/* The same product for 8..32 rows with x given transposed, xt[i*ldx + r]
 * (ldx = 16 or 32, rows <= ldx, 64-byte aligned, rows past `rows` zero):
 * each output is one sequential fused multiply-add chain over i, the bias
 * added last, so a row's result does not depend on how many rows there
 * are, and the SIMD kernel equals the scalar one bit for bit. Outputs are
 * vectors along the rows, so there are no horizontal sums, and no weight
 * packing (x, not W, is transposed: it is the small operand). */
void ft_k_matmul_xt_ref(float *y, int ldy, const float *xt, int ldx, int rows, const float *W, int nout,
                        int in, const float *b);
/* x (rows x in, row stride in) -> xt as above. */
void ft_k_transpose_rows(float *xt, int ldx, const float *x, int rows, int in);

/* One query row of causal attention over npos cached positions:
 * sc[p] = scale * dot(q, K + p*ld); softmax(sc); out = sum_p sc[p] V[p*ld..].
 * sc: npos floats of scratch (left holding the probabilities). */
void ft_k_attend(float *out, const float *q, const float *K, const float *V, int ld, int npos,
                 int hd, float scale, float *sc);
void ft_k_attend_ref(float *out, const float *q, const float *K, const float *V, int ld, int npos,
                     int hd, float scale, float *sc);

/* The same over a query's positions split into segments (a sliding
 * window whose ring buffer wraps, then the rows of the current call): one
 * softmax over all sum(n) positions, segment order = position order. All
 * segments share the row stride ld. sc: sum(n) floats of scratch. */
typedef struct ft_attn_seg { const float *k, *v; int n; } ft_attn_seg;
void ft_k_attend_segs(float *out, const float *q, const ft_attn_seg *seg, int nseg, int ld, int hd,
                      float scale, float *sc);
void ft_k_attend_segs_ref(float *out, const float *q, const ft_attn_seg *seg, int nseg, int ld, int hd,
                          float scale, float *sc);

/* The dispatch table, for hot loops that want to resolve it once. */
typedef struct ft_kernels {
    const char *name;
    float (*dot)(const float *, const float *, int);
    void (*axpy)(float *, float, const float *, int);
    void (*rmsnorm)(float *, const float *, const float *, int, float);
    void (*layernorm)(float *, const float *, const float *, const float *, int, float);
    void (*softmax)(float *, int);
    void (*rope)(float *, int, int, const float *, const float *);
    void (*silu_mul)(float *, const float *, int);
    void (*matmul_rows)(float *, int, const float *, int, const float *, int, int, const float *);
    void (*attend)(float *, const float *, const float *, const float *, int, int, int, float, float *);
    void (*attend_segs)(float *, const float *, const ft_attn_seg *, int, int, int, float, float *);
    /* NULL where no SIMD version exists (the engine then uses matmul_rows) */
    void (*matmul_xt)(float *, int, const float *, int, int, const float *, int, int, const float *);
} ft_kernels;
const ft_kernels *ft_k_get(void);

/* Which implementation the dispatcher chose: "avx512", "avx2" or "scalar". */
const char *ft_k_impl(void);
#endif
