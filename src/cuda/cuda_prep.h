/* Internal to the CUDA backend: the host-side halves of the GPU codec and
 * of the GEMM mapping, in plain C without CUDA (cuda_prep.c is compiled
 * in every build, so tests/cuda/test_cuda_hostmath.c checks them, with the
 * kernels' per-element math of kern_math.h, on machines without a GPU). */
#ifndef FT_CUDA_PREP_H
#define FT_CUDA_PREP_H

#include "codec/codec_internal.h"
#include "kern_math.h"

/* q8/q4 frame (parsed by ft_frame_parse): every chunk's payload size,
 * hash (unless trusted) and q4 pad nibble checked, and the geometry the
 * kernels need. FT_ERR_CORRUPT naming the chunk. */
ft_status ft_cuda_prep_quant(const uint8_t *frame, const ft_frame_info *fi, int trusted, ftk_qgeom *g);
/* raw frame: every chunk stored, of its raw size, hash (unless trusted);
 * the payload (fi->raw_size bytes at frame + header_size) is the tensor. */
ft_status ft_cuda_prep_raw(const uint8_t *frame, const ft_frame_info *fi, int trusted);
/* byteplane frame: every chunk's planes into `planes` (fi->raw_size bytes,
 * the layout ftk_bp_merge reads: chunk c of *chunk_elems elements at
 * c * chunk_elems * nplanes, plane k at + k * n_c), validating each
 * payload as ft_bp_decode_chunk does and decoding its entropy stage with
 * ws; stored chunks are split (their hash checked unless trusted). The
 * hashes of coded chunks cover the raw bytes and are not checked. */
ft_status ft_cuda_prep_byteplane(ft_worker_ws *ws, const uint8_t *frame, const ft_frame_info *fi, int trusted,
                                 uint8_t *planes, uint64_t *chunk_elems);

/* cuBLAS is column-major: y[rows, out] = x[rows, in] W[out, in]^T
 * (row-major, W in the Hugging Face (out, in) layout) is, in its terms,
 * Y^T (out x rows, ldc = out) = op(W) X^T with W seen as the in x out
 * matrix (lda = in) transposed, and X^T the in x rows matrix (ldb = in).
 * The same parameters work for cblas_sgemm(CblasColMajor, ...), which the
 * host test uses to check them. */
typedef struct ft_cuda_gemm_dims {
    int trans_a, trans_b;          /* 1: transposed (CUBLAS_OP_T) */
    int m, n, k, lda, ldb, ldc;
} ft_cuda_gemm_dims;
void ft_cuda_gemm_dims_for(int rows, int in, int out, ft_cuda_gemm_dims *d);

#endif
