/* bf16 GEMMs for products of many rows (training, issue 24): on bf16
 * weights read as stored, with activations rounded to bf16, f32 sums.
 *
 *   nt: C[r][n] (=|+=) sum_k A[r][k] W[n][k]   (+ bias[n])  y = x W^T, the forward
 *   nn: C[r][n] (=|+=) sum_k A[r][k] W[k][n]                dx = dy W, the x-gradient
 *                                                           of a frozen linear (W not
 *                                                           transposed, no copy)
 *
 * A: rows of bf16 values (ft_gb_round: f32 rounded to nearest even, as
 * ft_f32_to_bf16_1), lda >= ft_gb_lda(K) (even), zeros in [K, lda).
 *
 * Order of operations, the same in the scalar _ref and the SIMD kernel:
 * k in chunks of FT_GB_KC; per chunk and output a f32 sum s, from +0, over
 * the chunk's pairs p (k = 2p, 2p + 1) in order:
 *   s += A[r][2p + 1] B(2p + 1, n); s += A[r][2p] B(2p, n)
 * (each product of two bf16 values is exact in f32: two roundings per
 * pair, RNE); then C = s for the first chunk when not accumulating, else
 * C = C + s; after the last chunk C = C + bias[n]. The SIMD kernel
 * (AVX512_BF16: one vdpbf16ps per pair, 16 outputs per vector) computes
 * the pair with the instruction's own rounding (Intel documents the two
 * roundings above, with denormal inputs and outputs flushed to zero), so
 * the two agree within a pair's rounding each (tests/engine/test_gemm_bf16.c
 * checks |d| <= (K + 2 K/FT_GB_KC + 4) 2^-24 sum |a b| and reports how
 * often they are bit-identical).
 *
 * Each output is one fixed sequence of operations on its own row of A and
 * its own column of B: the same bits for any output range [n0, n1) and any
 * row count, so callers may split n over threads freely.
 *
 * The kernel (gemm_bf16_x86.c): 6 rows x 64 outputs per block, 24 vector
 * accumulators; per chunk a panel of 64 outputs x FT_GB_KC/2 pairs is
 * packed (nt: 16 x 16 transposes of 32-bit pairs of W's rows; nn: two rows
 * of W interleaved by 16-bit permutes), 32 KiB in L1, and every block of 6
 * rows runs over it with the rows' pairs broadcast. */
#ifndef FT_ENGINE_GEMM_BF16_H
#define FT_ENGINE_GEMM_BF16_H

#include <stddef.h>
#include <stdint.h>

#define FT_GB_KC 256

/* The row stride of A for K columns: K rounded up to a multiple of 32 (64-byte rows). */
int ft_gb_lda(int K);

/* A[r*lda + k] = bf16(x[r*ldx + k]) (RNE) for k < K, 0 for K <= k < lda. */
void ft_gb_round(uint16_t *A, int lda, const float *x, int ldx, int rows, int K);

/* W: the nt product's matrix, N x K with row stride ldw (>= K); outputs
 * n0 <= n < n1 of every row r < rows. acc: add to C, else overwrite. */
void ft_gb_nt(float *C, int ldc, const uint16_t *A, int lda, int rows, const uint16_t *W, int ldw, int K, int n0,
              int n1, const float *bias, int acc);
void ft_gb_nt_ref(float *C, int ldc, const uint16_t *A, int lda, int rows, const uint16_t *W, int ldw, int K,
                  int n0, int n1, const float *bias, int acc);

/* W: the nn product's matrix, K x N with row stride ldw (>= n1). */
void ft_gb_nn(float *C, int ldc, const uint16_t *A, int lda, int rows, const uint16_t *W, int ldw, int K, int n0,
              int n1, const float *bias, int acc);
void ft_gb_nn_ref(float *C, int ldc, const uint16_t *A, int lda, int rows, const uint16_t *W, int ldw, int K,
                  int n0, int n1, const float *bias, int acc);

/* 1 when ft_gb_nt/nn run the SIMD kernel (AVX512_BF16 present, SIMD not
 * disabled by FLEXTIER_NO_SIMD); else they run the _ref code, which is
 * correct but slow: callers use their own paths then. */
int ft_gb_simd(void);

/* The SIMD kernels (gemm_bf16_x86.c); not called without AVX512_BF16. */
void ft_gb_nt_avx512bf16(float *C, int ldc, const uint16_t *A, int lda, int rows, const uint16_t *W, int ldw,
                         int K, int n0, int n1, const float *bias, int acc);
void ft_gb_nn_avx512bf16(float *C, int ldc, const uint16_t *A, int lda, int rows, const uint16_t *W, int ldw,
                         int K, int n0, int n1, const float *bias, int acc);
#endif
