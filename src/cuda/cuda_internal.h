/* Internal to the CUDA backend: the kernel launchers (codec_kernels.cu,
 * forward.cu), shared by the host C files and the tests, and the error
 * helpers. Everything here is plain C so that gcc-compiled host code and
 * nvcc-compiled kernel files agree on it.
 *
 * Launchers enqueue work on `s` and return the launch status
 * (cudaGetLastError); they never synchronize. Pointers are device
 * pointers unless said otherwise. dtype arguments are ft_dtype values
 * (FT_F32, FT_F16, FT_BF16). */
#ifndef FT_CUDA_INTERNAL_H
#define FT_CUDA_INTERNAL_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#include "flextier/core.h"
#include "kern_math.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------ errors (cuda_device.c) */

/* FT_OK for cudaSuccess; otherwise sets the detail "<what>: <error name>:
 * <error string>" and returns FT_ERR_NOMEM (allocation failures),
 * FT_ERR_UNSUPPORTED (no device / driver) or FT_ERR_INTERNAL. Also clears
 * a sticky-free error from cudaGetLastError so the next call starts clean. */
ft_status ft_cuda_status(cudaError_t e, const char *what);
/* "no CUDA device" check for the current process (cached after the first
 * successful call). */
ft_status ft_cuda_require(int device);

#define FT_CU(call, what)                                           \
    do {                                                            \
        ft_status st_cu_ = ft_cuda_status((call), (what));          \
        if (st_cu_ != FT_OK) return st_cu_;                          \
    } while (0)

/* --------------------------------------------- codec (codec_kernels.cu) */

/* n elements src (src_dt) -> dst (dst_dt), src_dt != dst_dt, bit for bit
 * as ft_convert. */
cudaError_t ftk_convert(void *dst, int dst_dt, const void *src, int src_dt, uint64_t n,
                        cudaStream_t s);

/* ftk_qgeom: kern_math.h. */

/* table[c] = byte offset of chunk c's payload in the frame (n_chunks
 * entries), computed on the device from the geometry (one thread). */
cudaError_t ftk_q_table(const ftk_qgeom *g, uint64_t *table, cudaStream_t s);
/* 1 when ftk_q_dequant takes the 8-values-per-thread path for (g, dst),
 * which reads no chunk table (ftk_q_table need not run). */
int ftk_q_fast(const ftk_qgeom *g, const void *dst);
/* Dequantize every element of the frame (device copy `frame`) into dst as
 * out_dt, using the chunk table. */
cudaError_t ftk_q_dequant(const ftk_qgeom *g, const uint8_t *frame, const uint64_t *table,
                          int out_dt, void *dst, cudaStream_t s);

/* Byte planes -> values. planes holds, for each chunk c of chunk_elems
 * elements (the last may be shorter), its planes back to back at byte
 * offset c * chunk_elems * nplanes: plane k of chunk c (n_c bytes) at
 * + k * n_c. dt: the frame's dtype (bf16/f16: 2 planes, f32: 4), values
 * assembled as in docs/codec-byteplane.md, then converted to out_dt. */
cudaError_t ftk_bp_merge(int dt, const uint8_t *planes, uint64_t numel, uint64_t chunk_elems,
                         int out_dt, void *dst, cudaStream_t s);

/* KV rows: rows x n f32 (row stride n) -> rows x ft_qrow_bytes(bits, n,
 * group) bytes, as ft_qrow_encode per row. params: device scratch of
 * rows * (n / group) pairs of floats. *err (device, set to ULLONG_MAX
 * before the call) receives the minimum over failing groups of
 * 4 * (row * (n / group) + group index) + code, code 1 for a non-finite
 * value and 2 for a range fp16 parameters cannot hold (the CPU reports the
 * first failing group of a row); on failure dst is unspecified. */
cudaError_t ftk_qrow_encode(int bits, const float *src, uint64_t rows, uint64_t n, uint32_t group,
                            uint8_t *dst, void *params, unsigned long long *err, cudaStream_t s);
cudaError_t ftk_qrow_decode(int bits, const uint8_t *src, uint64_t rows, uint64_t n,
                            uint32_t group, float *dst, cudaStream_t s);

/* -------------------------------------------------- compute (forward.cu) */

/* x[r, :E] = emb[tokens[r], :E] (emb: vocab x E in emb_dt). */
cudaError_t ftk_embed(float *x, const void *emb, int emb_dt, const int32_t *tokens, int rows,
                      int E, cudaStream_t s);
/* x[r, :H] += pe[pos[r] + offset, :H] (OPT learned positions). */
cudaError_t ftk_add_pos(float *x, const void *pe, int pe_dt, const int *pos, int offset, int rows,
                        int H, cudaStream_t s);
/* Per row of n: RMSNorm (w may be NULL = 1) / LayerNorm (w, b may be NULL)
 * as ft_k_rmsnorm_ref / ft_k_layernorm_ref. out may equal x. */
cudaError_t ftk_rmsnorm(float *out, const float *x, const float *w, int rows, int n, float eps,
                        cudaStream_t s);
cudaError_t ftk_layernorm(float *out, const float *x, const float *w, const float *b, int rows,
                          int n, float eps, cudaStream_t s);
/* RoPE (HF rotate_half) in place on rows of n_heads heads of hd values
 * (row stride ld), row r at position pos[r]; cos/sin: [max_seq][hd/2]. */
cudaError_t ftk_rope(float *x, int rows, int ld, int n_heads, int hd, const int *pos,
                     const float *cos_t, const float *sin_t, cudaStream_t s);
/* Append the call's K and V rows to the caches of one layer:
 * kc/vc + (slot * max_seq + pos) * kvdim for row r of slot row_slot[r]
 * at position row_pos[r]. */
cudaError_t ftk_kv_append(float *kc, float *vc, const float *k, const float *v,
                          const int *row_slot, const int *row_pos, int rows, int kvdim,
                          int max_seq, cudaStream_t s);
/* Causal attention of each row r (its query at q + r*qdim) over positions
 * 0..row_pos[r] of its slot's cache (kc/vc as above), all n_heads heads,
 * head h reading KV head h / (n_heads / n_kv_heads): out + r*qdim + h*hd.
 * Scores scaled by `scale`, softmax in f32. */
cudaError_t ftk_attention(float *out, const float *q, const float *kc, const float *vc,
                          const int *row_slot, const int *row_pos, int rows, int n_heads,
                          int n_kv_heads, int hd, int max_seq, float scale, cudaStream_t s);
/* g = silu(g) * u; x = max(x, 0); y[r, :] += b; x += y (n elements). */
cudaError_t ftk_silu_mul(float *g, const float *u, uint64_t n, cudaStream_t s);
cudaError_t ftk_relu(float *x, uint64_t n, cudaStream_t s);
cudaError_t ftk_add_bias(float *y, const float *b, int rows, int n, cudaStream_t s);
cudaError_t ftk_add(float *x, const float *y, uint64_t n, cudaStream_t s);
/* dst[i, :n] = src[idx[i], :n] for i < nrows. */
cudaError_t ftk_gather_rows(float *dst, const float *src, const int *idx, int nrows, int n,
                            cudaStream_t s);
/* out[r] = first index of the largest value of logits[r, :vocab] (NaNs
 * never win; 0 if no value is >= -Inf), as ft_sampler_sample's argmax. */
cudaError_t ftk_argmax(int32_t *out, const float *logits, int rows, int vocab, cudaStream_t s);

#ifdef __cplusplus
}
#endif
#endif
