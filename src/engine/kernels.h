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

/* Which implementation the dispatcher chose: "avx512", "avx2" or "scalar". */
const char *ft_k_impl(void);
#endif
