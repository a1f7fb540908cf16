/* Compute kernels of the CUDA forward pass (the host side is
 * cuda_ctx.c; the linear layers are cuBLAS GEMMs issued from there).
 *
 * Activations are f32 everywhere; weights reach these kernels only as
 * norm weights and biases (f32) or embedding rows (f32 or bf16). Each
 * kernel mirrors a CPU reference (src/engine/kernels.c, forward.c) and is
 * written for clarity: one block per row for row-wise reductions, one
 * thread per element otherwise. Results differ from the CPU only in the
 * order of floating-point sums (tree reductions, the online softmax), so
 * tests compare with explicit tolerances (tests/cuda/test_cuda_kernels.c). */
#include "cuda_internal.h"

#include <cuda_runtime.h>
#include <stdint.h>

#define ROW_THREADS 256          /* threads per row-wise block */
#define ATT_THREADS 128          /* threads per attention block (4 warps) */
#define ATT_TILE 128             /* positions per attention tile */
#define ATT_MAX_HD 1024          /* head_dim limit (config.c) */

static __device__ __forceinline__ float bf16_to_f32(uint16_t h)
{
    return __uint_as_float((uint32_t)h << 16);
}

static __device__ __forceinline__ float load_w(int dt, const void *p, uint64_t i)
{
    return dt == FT_BF16 ? bf16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

static unsigned blocks_for(uint64_t n, unsigned threads)
{
    uint64_t b = (n + threads - 1) / threads;
    if (b > 65535u * 8u) b = 65535u * 8u;
    return b ? (unsigned)b : 1u;
}

#define GRID_STRIDE(i, n)                                                        \
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);  \
         i += (uint64_t)gridDim.x * blockDim.x)

/* Block-wide sum / max of one value per thread; every thread gets the
 * result. red: shared scratch of 32 floats. Must be reached by all
 * threads of the block. */
static __device__ float block_sum(float v, float *red)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    int w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    __syncthreads();                      /* red may still be read by a previous call */
    if ((threadIdx.x & 31) == 0) red[w] = v;
    __syncthreads();
    float t = 0.0f;
    for (int i = 0; i < nw; i++) t += red[i];
    return t;
}

static __device__ float block_max(float v, float *red)
{
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    int w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    __syncthreads();
    if ((threadIdx.x & 31) == 0) red[w] = v;
    __syncthreads();
    float t = red[0];
    for (int i = 1; i < nw; i++) t = fmaxf(t, red[i]);
    return t;
}

/* ----------------------------------------------------------- embedding */

static __global__ void k_embed(float *x, const void *emb, int dt, const int32_t *tok, int E)
{
    int r = blockIdx.x;
    uint64_t base = (uint64_t)tok[r] * (uint64_t)E;
    for (int i = threadIdx.x; i < E; i += blockDim.x)
        x[(uint64_t)r * E + i] = load_w(dt, emb, base + (uint64_t)i);
}

extern "C" cudaError_t ftk_embed(float *x, const void *emb, int emb_dt, const int32_t *tokens,
                                 int rows, int E, cudaStream_t s)
{
    if (rows <= 0) return cudaSuccess;
    k_embed<<<rows, ROW_THREADS, 0, s>>>(x, emb, emb_dt, tokens, E);
    return cudaGetLastError();
}

static __global__ void k_add_pos(float *x, const void *pe, int dt, const int *pos, int offset, int H)
{
    int r = blockIdx.x;
    uint64_t base = (uint64_t)(pos[r] + offset) * (uint64_t)H;
    for (int i = threadIdx.x; i < H; i += blockDim.x)
        x[(uint64_t)r * H + i] += load_w(dt, pe, base + (uint64_t)i);
}

extern "C" cudaError_t ftk_add_pos(float *x, const void *pe, int pe_dt, const int *pos, int offset,
                                   int rows, int H, cudaStream_t s)
{
    if (rows <= 0) return cudaSuccess;
    k_add_pos<<<rows, ROW_THREADS, 0, s>>>(x, pe, pe_dt, pos, offset, H);
    return cudaGetLastError();
}

/* --------------------------------------------------------------- norms */

/* ft_k_rmsnorm_ref: out = (x * (1 / sqrt(mean(x^2) + eps))) * w */
static __global__ void k_rmsnorm(float *out, const float *x, const float *w, int n, float eps)
{
    __shared__ float red[32];
    const float *xr = x + (uint64_t)blockIdx.x * n;
    float *orow = out + (uint64_t)blockIdx.x * n;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
    ss = block_sum(ss, red);
    float r = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        orow[i] = (xr[i] * r) * (w ? w[i] : 1.0f);
}

extern "C" cudaError_t ftk_rmsnorm(float *out, const float *x, const float *w, int rows, int n,
                                   float eps, cudaStream_t s)
{
    if (rows <= 0) return cudaSuccess;
    k_rmsnorm<<<rows, ROW_THREADS, 0, s>>>(out, x, w, n, eps);
    return cudaGetLastError();
}

/* ft_k_layernorm_ref: mean, then the variance of (x - mean), then
 * (x - mean) / sqrt(var + eps) * w + b. Every thread reads its elements of
 * the row before the first reduction's barrier, so out may equal x. */
static __global__ void k_layernorm(float *out, const float *x, const float *w, const float *b, int n,
                                   float eps)
{
    __shared__ float red[32];
    const float *xr = x + (uint64_t)blockIdx.x * n;
    float *orow = out + (uint64_t)blockIdx.x * n;
    float sum = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) sum += xr[i];
    float mean = block_sum(sum, red) / (float)n;
    float var = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float d = xr[i] - mean;
        var += d * d;
    }
    var = block_sum(var, red) / (float)n;
    float r = 1.0f / sqrtf(var + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float y = (xr[i] - mean) * r;
        orow[i] = y * (w ? w[i] : 1.0f) + (b ? b[i] : 0.0f);
    }
}

extern "C" cudaError_t ftk_layernorm(float *out, const float *x, const float *w, const float *b,
                                     int rows, int n, float eps, cudaStream_t s)
{
    if (rows <= 0) return cudaSuccess;
    k_layernorm<<<rows, ROW_THREADS, 0, s>>>(out, x, w, b, n, eps);
    return cudaGetLastError();
}

/* ---------------------------------------------------------------- RoPE */

/* ft_k_rope_ref at position pos[r]: for each head and i < hd/2,
 * (a, b) = (x[i], x[i + hd/2]) -> (a c - b s, b c + a s). One thread per
 * (head, i) pair owns both elements it writes. */
static __global__ void k_rope(float *x, int ld, int n_heads, int hd, const int *pos,
                              const float *cos_t, const float *sin_t)
{
    int r = blockIdx.x, half = hd / 2;
    float *row = x + (uint64_t)r * ld;
    const float *c = cos_t + (uint64_t)pos[r] * half;
    const float *sn = sin_t + (uint64_t)pos[r] * half;
    for (int t = threadIdx.x; t < n_heads * half; t += blockDim.x) {
        int h = t / half, i = t - h * half;
        float *v = row + (uint64_t)h * hd;
        float a = v[i], b = v[i + half];
        v[i] = a * c[i] - b * sn[i];
        v[i + half] = b * c[i] + a * sn[i];
    }
}

extern "C" cudaError_t ftk_rope(float *x, int rows, int ld, int n_heads, int hd, const int *pos,
                                const float *cos_t, const float *sin_t, cudaStream_t s)
{
    if (rows <= 0) return cudaSuccess;
    k_rope<<<rows, ROW_THREADS, 0, s>>>(x, ld, n_heads, hd, pos, cos_t, sin_t);
    return cudaGetLastError();
}

/* ------------------------------------------------------------ KV cache */

static __global__ void k_kv_append(float *kc, float *vc, const float *k, const float *v,
                                   const int *row_slot, const int *row_pos, int rows, int kvdim,
                                   int max_seq)
{
    GRID_STRIDE(t, (uint64_t)rows * kvdim) {
        uint64_t r = t / (uint64_t)kvdim, d = t - r * (uint64_t)kvdim;
        uint64_t dst = ((uint64_t)row_slot[r] * (uint64_t)max_seq + (uint64_t)row_pos[r]) * kvdim + d;
        kc[dst] = k[t];
        vc[dst] = v[t];
    }
}

extern "C" cudaError_t ftk_kv_append(float *kc, float *vc, const float *k, const float *v,
                                     const int *row_slot, const int *row_pos, int rows, int kvdim,
                                     int max_seq, cudaStream_t s)
{
    if (rows <= 0) return cudaSuccess;
    uint64_t n = (uint64_t)rows * kvdim;
    k_kv_append<<<blocks_for(n, 256), 256, 0, s>>>(kc, vc, k, v, row_slot, row_pos, rows, kvdim, max_seq);
    return cudaGetLastError();
}

/* ----------------------------------------------------------- attention */

/* One block per (row, head). The positions 0..row_pos[r] of the row's
 * sequence are processed in tiles of ATT_TILE with the online softmax:
 *   scores of the tile (one warp per position, lanes over head_dim),
 *   m' = max(m, tile max), every score s -> exp(s - m'),
 *   l = l * exp(m - m') + sum, acc = acc * exp(m - m') + sum_p e_p V_p,
 * and at the end out = acc / l: the same softmax-weighted sum as
 * ft_k_attend_ref (which normalizes first), up to rounding. */
static __global__ void k_attention(float *out, const float *q, const float *kc, const float *vc,
                                   const int *row_slot, const int *row_pos, int n_heads,
                                   int n_kv_heads, int hd, int max_seq, float scale)
{
    __shared__ float q_s[ATT_MAX_HD];
    __shared__ float acc[ATT_MAX_HD];
    __shared__ float sc[ATT_TILE];
    __shared__ float red[32];
    const int r = blockIdx.x / n_heads, h = blockIdx.x - r * n_heads;
    const int kvdim = n_kv_heads * hd, qdim = n_heads * hd;
    const int kvh = h / (n_heads / n_kv_heads);
    const int npos = row_pos[r] + 1;
    const uint64_t cache0 = (uint64_t)row_slot[r] * (uint64_t)max_seq * (uint64_t)kvdim + (uint64_t)kvh * hd;
    const float *K = kc + cache0, *V = vc + cache0;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;

    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        q_s[d] = q[(uint64_t)r * qdim + (uint64_t)h * hd + d];
        acc[d] = 0.0f;
    }
    __syncthreads();
    float m = -INFINITY, l = 0.0f;      /* identical in every thread */
    for (int p0 = 0; p0 < npos; p0 += ATT_TILE) {
        int nt = npos - p0 < ATT_TILE ? npos - p0 : ATT_TILE;
        for (int t = warp; t < nt; t += nwarps) {
            const float *kr = K + (uint64_t)(p0 + t) * kvdim;
            float dot = 0.0f;
            for (int d = lane; d < hd; d += 32) dot += q_s[d] * kr[d];
            for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
            if (lane == 0) sc[t] = dot * scale;
        }
        __syncthreads();
        float tm = -INFINITY;
        for (int t = threadIdx.x; t < nt; t += blockDim.x) tm = fmaxf(tm, sc[t]);
        tm = block_max(tm, red);
        float mn = fmaxf(m, tm);
        float alpha = expf(m - mn);      /* 0 on the first tile (m = -inf) */
        float part = 0.0f;
        for (int t = threadIdx.x; t < nt; t += blockDim.x) {
            float e = expf(sc[t] - mn);
            sc[t] = e;
            part += e;
        }
        float ts = block_sum(part, red);  /* its barriers also publish sc[] */
        l = l * alpha + ts;
        for (int d = threadIdx.x; d < hd; d += blockDim.x) {
            float a = acc[d] * alpha;
            for (int t = 0; t < nt; t++) a += sc[t] * V[(uint64_t)(p0 + t) * kvdim + d];
            acc[d] = a;
        }
        m = mn;
        __syncthreads();                  /* sc[] is rewritten by the next tile */
    }
    float inv = 1.0f / l;
    for (int d = threadIdx.x; d < hd; d += blockDim.x)
        out[(uint64_t)r * qdim + (uint64_t)h * hd + d] = acc[d] * inv;
}

extern "C" cudaError_t ftk_attention(float *out, const float *q, const float *kc, const float *vc,
                                     const int *row_slot, const int *row_pos, int rows, int n_heads,
                                     int n_kv_heads, int hd, int max_seq, float scale, cudaStream_t s)
{
    if (rows <= 0) return cudaSuccess;
    if (hd > ATT_MAX_HD || n_kv_heads <= 0 || n_heads % n_kv_heads) return cudaErrorInvalidValue;
    uint64_t blocks = (uint64_t)rows * (uint64_t)n_heads;
    if (blocks > 0x7fffffffu) return cudaErrorInvalidValue;
    k_attention<<<(unsigned)blocks, ATT_THREADS, 0, s>>>(out, q, kc, vc, row_slot, row_pos, n_heads,
                                                        n_kv_heads, hd, max_seq, scale);
    return cudaGetLastError();
}

/* ---------------------------------------------------------- elementwise */

/* ft_k_silu_mul_ref: g = g / (1 + exp(-g)) * u */
static __global__ void k_silu_mul(float *g, const float *u, uint64_t n)
{
    GRID_STRIDE(i, n) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

extern "C" cudaError_t ftk_silu_mul(float *g, const float *u, uint64_t n, cudaStream_t s)
{
    if (n == 0) return cudaSuccess;
    k_silu_mul<<<blocks_for(n, 256), 256, 0, s>>>(g, u, n);
    return cudaGetLastError();
}

static __global__ void k_relu(float *x, uint64_t n)
{
    GRID_STRIDE(i, n) x[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

extern "C" cudaError_t ftk_relu(float *x, uint64_t n, cudaStream_t s)
{
    if (n == 0) return cudaSuccess;
    k_relu<<<blocks_for(n, 256), 256, 0, s>>>(x, n);
    return cudaGetLastError();
}

static __global__ void k_add_bias(float *y, const float *b, int rows, int n)
{
    GRID_STRIDE(i, (uint64_t)rows * n) y[i] += b[i % (uint64_t)n];
}

extern "C" cudaError_t ftk_add_bias(float *y, const float *b, int rows, int n, cudaStream_t s)
{
    if (rows <= 0 || n <= 0) return cudaSuccess;
    k_add_bias<<<blocks_for((uint64_t)rows * n, 256), 256, 0, s>>>(y, b, rows, n);
    return cudaGetLastError();
}

static __global__ void k_add(float *x, const float *y, uint64_t n)
{
    GRID_STRIDE(i, n) x[i] += y[i];
}

extern "C" cudaError_t ftk_add(float *x, const float *y, uint64_t n, cudaStream_t s)
{
    if (n == 0) return cudaSuccess;
    k_add<<<blocks_for(n, 256), 256, 0, s>>>(x, y, n);
    return cudaGetLastError();
}

static __global__ void k_gather_rows(float *dst, const float *src, const int *idx, int n)
{
    int r = blockIdx.x;
    const float *s = src + (uint64_t)idx[r] * n;
    for (int i = threadIdx.x; i < n; i += blockDim.x) dst[(uint64_t)r * n + i] = s[i];
}

extern "C" cudaError_t ftk_gather_rows(float *dst, const float *src, const int *idx, int nrows, int n,
                                       cudaStream_t s)
{
    if (nrows <= 0) return cudaSuccess;
    k_gather_rows<<<nrows, ROW_THREADS, 0, s>>>(dst, src, idx, n);
    return cudaGetLastError();
}

/* -------------------------------------------------------------- argmax */

/* (value, index) pairs reduced with km_argmax_better: the start
 * (-Inf, INT_MAX) loses to any value >= -Inf, and a row with no such value
 * (all NaN) gives index 0, as the CPU's argmax. */
static __global__ void k_argmax(int32_t *out, const float *logits, int vocab)
{
    __shared__ float sv[ROW_THREADS];
    __shared__ int si[ROW_THREADS];
    const float *x = logits + (uint64_t)blockIdx.x * vocab;
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        float v = x[i];
        if (km_argmax_better(v, i, bv, bi)) { bv = v; bi = i; }
    }
    sv[threadIdx.x] = bv;
    si[threadIdx.x] = bi;
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride >>= 1) {
        if ((int)threadIdx.x < stride) {
            float v = sv[threadIdx.x + stride];
            int i = si[threadIdx.x + stride];
            if (km_argmax_better(v, i, sv[threadIdx.x], si[threadIdx.x])) {
                sv[threadIdx.x] = v;
                si[threadIdx.x] = i;
            }
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = si[0] == 0x7fffffff ? 0 : si[0];
}

extern "C" cudaError_t ftk_argmax(int32_t *out, const float *logits, int rows, int vocab, cudaStream_t s)
{
    if (rows <= 0) return cudaSuccess;
    k_argmax<<<rows, ROW_THREADS, 0, s>>>(out, logits, vocab);
    return cudaGetLastError();
}
