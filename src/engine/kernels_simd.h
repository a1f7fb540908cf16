/* SIMD kernel variants (kernels_x86.c); same contracts as kernels.h. */
#ifndef FT_ENGINE_KERNELS_SIMD_H
#define FT_ENGINE_KERNELS_SIMD_H
float ft_k_dot_avx2(const float *a, const float *b, int n);
void ft_k_axpy_avx2(float *y, float a, const float *x, int n);
void ft_k_rmsnorm_avx2(float *out, const float *x, const float *w, int n, float eps);
void ft_k_layernorm_avx2(float *out, const float *x, const float *w, const float *b, int n, float eps);
void ft_k_softmax_avx2(float *x, int n);
void ft_k_rope_avx2(float *x, int n_heads, int head_dim, const float *c, const float *s);
void ft_k_silu_mul_avx2(float *g, const float *u, int n);
float ft_k_dot_avx512(const float *a, const float *b, int n);
void ft_k_axpy_avx512(float *y, float a, const float *x, int n);
void ft_k_rmsnorm_avx512(float *out, const float *x, const float *w, int n, float eps);
void ft_k_matmul_xt_avx512(float *y, int ldy, const float *xt, int ldx, int rows, const float *W, int nout,
                           int in, const float *b);
void ft_k_matmul_rows_avx512(float *y, int ldy, const float *x, int rows, const float *W, int nout,
                             int in, const float *b);
void ft_k_attend_avx512(float *out, const float *q, const float *K, const float *V, int ld, int npos,
                        int hd, float scale, float *sc);
#endif
