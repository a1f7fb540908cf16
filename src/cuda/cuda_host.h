/* Internal to the CUDA backend's host code (C only): the frame decoder's
 * asynchronous core, shared by ft_cuda_decode_frame and the weight
 * streaming of cuda_ctx.c. */
#ifndef FT_CUDA_HOST_H
#define FT_CUDA_HOST_H

#include "cuda_internal.h"
#include "codec/codec_internal.h"
#include "flextier/cuda.h"

/* Staging that grows to the largest input seen. Device staging is only
 * touched by work on one stream (the caller's `s`); before it grows, that
 * stream is synchronized. The pinned host staging receives what the CPU
 * decodes (byte planes, lz4/zstd/deflate output); the host waits for the
 * event `h_done` (the last copy out of it) before writing it again. */
typedef struct ft_cuda_dec_ws {
    uint8_t *d_stage;
    size_t d_cap;
    uint64_t *d_table;
    size_t table_cap;          /* entries */
    uint8_t *h_stage;
    size_t h_cap;
    cudaEvent_t h_done;
    int h_used;                /* h_done has been recorded */
    ft_codec_ctx *cpu;         /* lz4/zstd/deflate frames (created on first use) */
    ft_worker_ws ws;           /* entropy stage of byte planes */
    /* Pipelined q8/q4 (ft_cuda_dec_pipeline): the compressed bytes copied
     * on the caller's stream into two staging buffers in turn, the
     * dequantize kernels on the stream ks, so that the copy of one tensor
     * overlaps the decode of the one before instead of waiting for it
     * (the copy engine stays busy). Events order the two streams: a
     * buffer is rewritten only after the kernel reading it is done, and
     * ft_cuda_dec_join makes the caller's stream wait for every kernel. */
    int pipe;
    cudaStream_t ks;
    uint8_t *p_stage[2];
    size_t p_cap[2];
    uint64_t *p_table[2];
    size_t p_tcap[2];          /* entries */
    cudaEvent_t p_copied[2], p_done[2], p_join;
    int p_used[2];             /* p_done[b] has been recorded */
    int p_next;                /* the buffer of the next tensor */
    int p_pending;             /* kernels on ks not yet joined */
} ft_cuda_dec_ws;

ft_status ft_cuda_dec_ws_init(ft_cuda_dec_ws *w);
void ft_cuda_dec_ws_release(ft_cuda_dec_ws *w);
/* Turn on the pipelined q8/q4 decode for this workspace (creates its
 * kernel stream and events). After enqueuing a set of tensors, the caller
 * calls ft_cuda_dec_join before anything on its stream relies on them. */
ft_status ft_cuda_dec_pipeline(ft_cuda_dec_ws *w);
/* Make `s` wait for the decode kernels enqueued so far (a no-op when the
 * workspace is not pipelined or nothing is pending). */
ft_status ft_cuda_dec_join(ft_cuda_dec_ws *w, cudaStream_t s);

/* Enqueue on `s` the decode of a parsed frame (fi from ft_frame_parse of
 * frame[0..fi->frame_size)) into dst (device, room for fi->numel values of
 * out_dt). Host-side work (validation, hashes unless trusted, CPU stages)
 * happens before this returns; the frame's host memory must stay valid
 * until the work on `s` completes. *h2d (may be NULL) += bytes copied to
 * the device. */
ft_status ft_cuda_dec_frame_async(ft_cuda_dec_ws *w, const uint8_t *frame, const ft_frame_info *fi,
                                  int trusted, ft_dtype out_dt, void *dst, cudaStream_t s,
                                  uint64_t *h2d);
/* Enqueue on `s`: n raw values of src_dt (host memory) into dst (device)
 * as out_dt (copied directly when the dtypes match, else through the
 * device staging and the convert kernel). */
ft_status ft_cuda_dec_raw_async(ft_cuda_dec_ws *w, const void *src, ft_dtype src_dt, uint64_t n,
                                ft_dtype out_dt, void *dst, cudaStream_t s, uint64_t *h2d);

/* A matrix in a CPU engine compute format (flextier/engine.h ft_wmat: the
 * offloading scheduler's view of a streamed layer) into device memory as
 * out_dt: f32/bf16/f16 copied and converted; q8/q4 row chunks gathered
 * into the device staging (runs of contiguous chunks in one copy) and
 * dequantized there by the frame kernels. The host memory may be reused
 * once the copies are done (pageable memory: when this returns). */
ft_status ft_cuda_dec_wmat_async(ft_cuda_dec_ws *w, const ft_wmat *m, ft_dtype out_dt, void *dst, cudaStream_t s,
                                 uint64_t *h2d);

/* The context's model and sizes (cuda_ctx.c; the plugin's ctx_shape, from
 * which the loader builds ft_cuda_ctx_forward_ops). */
void ft_cuda_ctx_shape(const ft_cuda_ctx *c, const ft_model **m, int *max_batch, int *max_seq);

#endif
