/* The train layer's internals, for its tests (tests/train): the backward
 * of every op of the llama-family graph, each the derivative of the
 * forward the trainer runs, and the transposed product on stored weights. */
#ifndef FT_TRAIN_INTERNAL_H
#define FT_TRAIN_INTERNAL_H
#include "flextier/train.h"

/* dx[r*ldx + i] += sum_{o0 <= o < o1} dy[r*ldy + o] W[o][i] for r < rows
 * (x-gradient of a frozen linear: W^T dy, on W as stored; q8/q4 rows
 * dequantized as ft_wmat_row_f32 does). row: W->cols floats of scratch. */
void ft_tr_matT(float *dx, int ldx, const float *dy, int ldy, int rows, const ft_wmat *W, int o0, int o1,
                float *row);
void ft_tr_matT_ref(float *dx, int ldx, const float *dy, int ldy, int rows, const ft_wmat *W, int o0, int o1,
                    float *row);

/* The trainer's W^T dy: W dequantized and transposed into one f32 matrix
 * (t's scratch), the engine's f32 product on it, added into dx
 * (R x W->cols, contiguous); dy R x W->rows. */
/* lora_dropout's masks (train.c): the key of micro-batch a of optimizer
 * step `step`, and the factors (0 or 1 / (1 - p)) of a rows x cols input of
 * module `module` of `layer` */
uint64_t ft_tr_dropout_key(uint64_t seed, int step, int micro_batch);
void ft_tr_dropout_mask(uint64_t key, int layer, int module, float p, int rows, int cols, float *mk);
ft_status ft_tr_matT_fast(ft_trainer *t, float *dx, const float *dy, int R, const ft_wmat *W);

/* With bf16 activations on (ft_wk_bf16_activations) and AVX512_BF16, the
 * trainer's products of >= 16 rows on bf16 weights (forward x W^T and the
 * backward's dy W) run on the bf16 GEMMs (engine/gemm_bf16.h) unless this
 * is off: default on, FLEXTIER_TRAIN_GEMM=0 turns it off (the engine's
 * FT_WK_X_B16 products then, W transposed for dy W: the same operands, a
 * different order of sums); the setter is for tests and benchmarks. */
int ft_tr_gemm(void);
void ft_tr_set_gemm(int on);

/* C[m*ldc + n] = fma chain over k < K, in k order, from C's value:
 * c = fma(P[m*psm + k*psk], Q[k*ldq + n], c), for m < M, n0 <= n < n1
 * (the adapters' products: dA += dt^T x, dx += dt A, dB^T += (s tl)^T dy;
 * the same values as an axpy per k, each output one fixed sequence
 * whatever the column split). AVX-512: 6 rows x 64 columns of
 * accumulators; the _ref twin elsewhere (FLEXTIER_NO_SIMD too). */
void ft_tr_acc(float *C, int ldc, const float *P, int psm, int psk, int M, int K, const float *Q, int ldq, int n0,
               int n1);
void ft_tr_acc_ref(float *C, int ldc, const float *P, int psm, int psk, int M, int K, const float *Q, int ldq, int n0,
                   int n1);

/* C[m*ldc + n] = sum_k P[m*ldp + k] Q[n*ldq + k] for m0 <= m < m1, n < N
 * (the adapters' narrow products: x A^T and dy B with N = rank): AVX-512
 * sums 16 lanes along k (6 rows x 4 outputs at a time) and reduces each
 * once; the _ref twin one fma chain (they agree within f32 reassociation;
 * each output the same sequence for any row range). */
void ft_tr_dots(float *C, int ldc, const float *P, int ldp, int m0, int m1, const float *Q, int ldq, int N, int K);
void ft_tr_dots_ref(float *C, int ldc, const float *P, int ldp, int m0, int m1, const float *Q, int ldq, int N, int K);

/* dst[c*ldd + o] = src[o*lds + c] for o < n, c < m (16-bit values: bf16
 * or f16 kept as stored); n = m = 16 uses AVX2 where the CPU has it, the
 * scalar _ref twin otherwise (FLEXTIER_NO_SIMD too). */
void ft_tr_transpose16(uint16_t *dst, size_t ldd, const uint16_t *src, size_t lds, int n, int m);
void ft_tr_transpose16_ref(uint16_t *dst, size_t ldd, const uint16_t *src, size_t lds, int n, int m);

/* RMSNorm y = x / sqrt(mean(x^2) + eps) * w over n: dx += d/dx of dot(dy, y). */
void ft_tr_rmsnorm_bwd(float *dx, const float *x, const float *w, const float *dy, int n, float eps);
/* LayerNorm y = (x - mean) / sqrt(var + eps) * w + b over n (w NULL: 1):
 * dx += d/dx of dot(dy, y) (b does not enter). */
void ft_tr_layernorm_bwd(float *dx, const float *x, const float *w, const float *dy, int n, float eps);
/* RoPE backward: the inverse rotation (any cos/sin, scaled ones too). */
void ft_tr_rope_bwd(float *dx, int n_heads, int head_dim, const float *cos, const float *sin);
/* g' = silu(g) * u: given dy, dg and du (overwritten). */
void ft_tr_silu_mul_bwd(float *dg, float *du, const float *g, const float *u, const float *dy, int n);

/* g' = gelu_tanh(g) * u (GeGLU, gemma): given dy, dg and du (overwritten). */
void ft_tr_gelu_mul_bwd(float *dg, float *du, const float *g, const float *u, const float *dy, int n);

/* Causal attention of one sequence of T rows, GQA: q [T][nh*hd], k, v
 * [T][nkv*hd], out [T][nh*hd], P [nh][T][T] (probabilities, saved for the
 * backward); window > 0: a row attends to the last `window` positions. */
void ft_tr_attn_fwd(float *out, float *P, const float *q, const float *k, const float *v, int T, int nh, int nkv,
                    int hd, int window);
/* dq, dk, dv (accumulated) from dout, with P from the forward. */
void ft_tr_attn_bwd(float *dq, float *dk, float *dv, const float *dout, const float *P, const float *q,
                    const float *k, const float *v, int T, int nh, int nkv, int hd, int window);

/* The same for the heads of kv heads [g0, g1) only (threads split there:
 * the heads of one kv head add into the same dk/dv). */
/* scale: the score scale (1/sqrt(hd), or gemma's query_pre_attn_scalar^-1/2);
 * cap != 0: scores soft-capped to cap tanh(s / cap) (gemma2). */
void ft_tr_attn_fwd_g(float *out, float *P, const float *q, const float *k, const float *v, int T, int nh, int nkv,
                      int hd, int window, int g0, int g1, float scale, float cap);
void ft_tr_attn_bwd_g(float *dq, float *dk, float *dv, const float *dout, const float *P, const float *q,
                      const float *k, const float *v, int T, int nh, int nkv, int hd, int window, int g0, int g1,
                      float scale, float cap);

/* Loss over batch sequences of seq tokens (without an update); with
 * grad_scale != 0 the parameters' gradients get grad_scale * d(mean loss)
 * added. *loss_sum: summed token loss, *n: predicted tokens. */
ft_status ft_trainer_loss_grad(ft_trainer *t, const int32_t *tokens, int batch, int seq, double grad_scale,
                               double *loss_sum, int64_t *n);
/* The flat trainable parameters and their gradients (n floats each). */
float *ft_trainer_param_data(ft_trainer *t, size_t *n);
float *ft_trainer_grad_data(ft_trainer *t, size_t *n);


/* For adapter.c: module k of n (layer k / 7, target k % 7): 0 if not
 * trained, else its PEFT tensor names, data and shapes. */
size_t ft_tr_n_mods(const ft_trainer *t);
int ft_tr_mod(const ft_trainer *t, size_t k, char *a_name, char *b_name, size_t cap, float **A, float **B,
              int64_t ashape[2], int64_t bshape[2]);
const ft_train_params *ft_tr_params(const ft_trainer *t);
const char *ft_tr_target_name(int i);
/* the parameters, Adam moments and steps taken (for the state file) */
void ft_tr_state(ft_trainer *t, float **w, float **m1, float **m2, int *step);
void ft_tr_set_step(ft_trainer *t, int step);
#endif
