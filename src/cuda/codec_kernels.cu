/* The codec on the GPU: dtype conversion, q8/q4 dequantization of frame
 * payloads, byte-plane regrouping and KV-row quantization.
 *
 * The per-element math lives in kern_math.h (line-by-line ports of the
 * CPU definitions, also run on the host by tests/cuda/test_cuda_hostmath.c);
 * this file only launches it: one thread per output element (or per
 * packed byte when encoding), grid-stride loops, every element's chunk,
 * group and parameters recomputed from its index. Bit for bit the CPU's
 * results: tests/cuda/test_cuda_codec.c compares them byte for byte.
 *
 * Must not be compiled with --use_fast_math (flush-to-zero would change
 * fp16 subnormal parameters). */
#include "cuda_internal.h"

#include <cuda_runtime.h>
#include <stdint.h>

/* Grid for n elements; capped so that huge tensors loop. */
static void grid_for(uint64_t n, unsigned *blocks, unsigned *threads)
{
    *threads = 256;
    uint64_t b = (n + 255) / 256;
    if (b > 65535u * 8u) b = 65535u * 8u;
    if (b == 0) b = 1;
    *blocks = (unsigned)b;
}

#define GRID_STRIDE(i, n)                                                        \
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);  \
         i += (uint64_t)gridDim.x * blockDim.x)

/* ----------------------------------------------------------- convert */

static __global__ void k_convert(void *dst, int dst_dt, const void *src, int src_dt, uint64_t n)
{
    GRID_STRIDE(i, n) km_store(dst_dt, dst, i, km_load(src_dt, src, i));
}

extern "C" cudaError_t ftk_convert(void *dst, int dst_dt, const void *src, int src_dt, uint64_t n,
                                   cudaStream_t s)
{
    if (n == 0) return cudaSuccess;
    unsigned b, t;
    grid_for(n, &b, &t);
    k_convert<<<b, t, 0, s>>>(dst, dst_dt, src, src_dt, n);
    return cudaGetLastError();
}

/* --------------------------------------------------------- q8/q4 decode */

static __global__ void k_q_table(ftk_qgeom g, uint64_t *table)
{
    if (blockIdx.x == 0 && threadIdx.x == 0) km_q_table(&g, table);
}

extern "C" cudaError_t ftk_q_table(const ftk_qgeom *g, uint64_t *table, cudaStream_t s)
{
    if (g->n_chunks == 0) return cudaSuccess;
    k_q_table<<<1, 1, 0, s>>>(*g, table);
    return cudaGetLastError();
}

static __global__ void k_q_dequant(ftk_qgeom g, const uint8_t *frame, const uint64_t *table, int out_dt,
                                   void *dst)
{
    GRID_STRIDE(e, g.numel) km_store(out_dt, dst, e, km_q_dequant(&g, frame, table, e));
}

/* km_q_dequant8: one thread per 8 values, stored as one 16-byte (bf16,
 * f16) or two (f32) vector writes; dst 16-byte aligned. */
static __global__ void k_q_dequant8(ftk_qgeom g, const uint8_t *frame, int out_dt, void *dst)
{
    const uint32_t n8 = (uint32_t)(g.numel / 8);
    for (uint32_t t = blockIdx.x * blockDim.x + threadIdx.x; t < n8; t += gridDim.x * blockDim.x) {
        float v[8];
        km_q_dequant8(&g, frame, t, v);
        if (out_dt == FT_F32) {
            float4 *o = (float4 *)dst + 2 * (uint64_t)t;
            o[0] = make_float4(v[0], v[1], v[2], v[3]);
            o[1] = make_float4(v[4], v[5], v[6], v[7]);
        } else {
            uint32_t w[4];
            for (int j = 0; j < 4; j++) {
                uint32_t lo = out_dt == FT_BF16 ? km_f32_to_bf16(v[2 * j]) : km_f32_to_f16(v[2 * j]);
                uint32_t hi = out_dt == FT_BF16 ? km_f32_to_bf16(v[2 * j + 1]) : km_f32_to_f16(v[2 * j + 1]);
                w[j] = lo | (hi << 16);
            }
            ((uint4 *)dst)[t] = make_uint4(w[0], w[1], w[2], w[3]);
        }
    }
}

extern "C" int ftk_q_fast(const ftk_qgeom *g, const void *dst)
{
    return km_q_fast8_ok(g) && ((uintptr_t)dst & 15) == 0;
}

extern "C" cudaError_t ftk_q_dequant(const ftk_qgeom *g, const uint8_t *frame, const uint64_t *table,
                                     int out_dt, void *dst, cudaStream_t s)
{
    if (g->numel == 0) return cudaSuccess;
    unsigned b, t;
    if (ftk_q_fast(g, dst)) {
        grid_for(g->numel / 8, &b, &t);
        k_q_dequant8<<<b, t, 0, s>>>(*g, frame, out_dt, dst);
        return cudaGetLastError();
    }
    grid_for(g->numel, &b, &t);
    k_q_dequant<<<b, t, 0, s>>>(*g, frame, table, out_dt, dst);
    return cudaGetLastError();
}

/* ------------------------------------------------------- byte planes */

static __global__ void k_bp_merge(int dt, const uint8_t *planes, uint64_t numel, uint64_t E, int out_dt,
                                  void *dst)
{
    GRID_STRIDE(e, numel) km_bp_store(dt, out_dt, dst, e, km_bp_bits(dt, planes, numel, E, e));
}

extern "C" cudaError_t ftk_bp_merge(int dt, const uint8_t *planes, uint64_t numel, uint64_t chunk_elems,
                                    int out_dt, void *dst, cudaStream_t s)
{
    if (numel == 0) return cudaSuccess;
    unsigned b, t;
    grid_for(numel, &b, &t);
    k_bp_merge<<<b, t, 0, s>>>(dt, planes, numel, chunk_elems, out_dt, dst);
    return cudaGetLastError();
}

/* ------------------------------------------------- KV-row quantization */

/* Phase 1: one thread per (row, group): parameters, the 4-byte group
 * header, and (min, 1/step) for phase 2. A failing group records
 * min(4 * flat group index + code) in *err. */
static __global__ void k_qrow_params(int bits, const float *src, uint64_t rows, uint64_t n, uint32_t group,
                                     uint8_t *dst, uint64_t rowbytes, float *par, unsigned long long *err)
{
    const uint64_t ng = n / group;
    GRID_STRIDE(t, rows * ng) {
        uint64_t r = t / ng, j = t - r * ng;
        uint16_t h = 0, s = 0;
        float mn = 0.0f, inv = 0.0f;
        int bad = km_qrow_group(bits, src + r * n + j * group, group, &h, &s, &mn, &inv);
        if (bad) atomicMin(err, (unsigned long long)(4 * t + (uint64_t)bad));
        uint8_t *hp = dst + r * rowbytes + 4 * j;
        hp[0] = (uint8_t)h; hp[1] = (uint8_t)(h >> 8);
        hp[2] = (uint8_t)s; hp[3] = (uint8_t)(s >> 8);
        par[2 * t] = bad ? 0.0f : mn;
        par[2 * t + 1] = bad ? 0.0f : inv;
    }
}

/* Phase 2: one thread per packed byte of each row: each byte is written by
 * exactly one thread (q4 nibbles of two groups may share a byte). */
static __global__ void k_qrow_pack(int bits, const float *src, uint64_t rows, uint64_t n, uint32_t group,
                                   uint8_t *dst, uint64_t rowbytes, const float *par)
{
    const uint64_t ng = n / group;
    const uint64_t nb = bits == 8 ? n : (n + 1) / 2;
    GRID_STRIDE(t, rows * nb) {
        uint64_t r = t / nb, b = t - r * nb;
        dst[r * rowbytes + 4 * ng + b] = km_qrow_byte(bits, src + r * n, n, group, par + 2 * r * ng, b);
    }
}

extern "C" cudaError_t ftk_qrow_encode(int bits, const float *src, uint64_t rows, uint64_t n, uint32_t group,
                                       uint8_t *dst, void *params, unsigned long long *err, cudaStream_t s)
{
    if (rows == 0 || n == 0) return cudaSuccess;
    const uint64_t ng = n / group;
    const uint64_t nb = bits == 8 ? n : (n + 1) / 2;
    const uint64_t rowbytes = 4 * ng + nb;
    float *par = (float *)params;
    unsigned b, t;
    grid_for(rows * ng, &b, &t);
    k_qrow_params<<<b, t, 0, s>>>(bits, src, rows, n, group, dst, rowbytes, par, err);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    grid_for(rows * nb, &b, &t);
    k_qrow_pack<<<b, t, 0, s>>>(bits, src, rows, n, group, dst, rowbytes, par);
    return cudaGetLastError();
}

static __global__ void k_qrow_decode(int bits, const uint8_t *src, uint64_t rows, uint64_t n, uint32_t group,
                                     float *dst)
{
    const uint64_t rowbytes = 4 * (n / group) + (bits == 8 ? n : (n + 1) / 2);
    GRID_STRIDE(t, rows * n) {
        uint64_t r = t / n, k = t - r * n;
        dst[t] = km_qrow_value(bits, src + r * rowbytes, n, group, k);
    }
}

extern "C" cudaError_t ftk_qrow_decode(int bits, const uint8_t *src, uint64_t rows, uint64_t n, uint32_t group,
                                       float *dst, cudaStream_t s)
{
    if (rows == 0 || n == 0) return cudaSuccess;
    unsigned b, t;
    grid_for(rows * n, &b, &t);
    k_qrow_decode<<<b, t, 0, s>>>(bits, src, rows, n, group, dst);
    return cudaGetLastError();
}
