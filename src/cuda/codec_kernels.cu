/* The codec on the GPU: dtype conversion, q8/q4 dequantization of frame
 * payloads, byte-plane regrouping and KV-row quantization.
 *
 * Written to be obviously equal to the CPU definitions, not fast: one
 * thread per output element (or per packed byte when encoding), the
 * element's chunk, group and parameters recomputed from its index. The
 * bit-level helpers below are line-by-line ports of src/core/convert.c
 * (conversions) and src/codec/quant.c (ft_qparams and the quantizer), so
 * the results are bit for bit the CPU's; tests/cuda/test_cuda_codec.c
 * compares them byte for byte.
 *
 * Floating point: this file must not be compiled with --use_fast_math
 * (flush-to-zero would change fp16 subnormal parameters); the intrinsics
 * __fmaf_rn, __fsub_rn, __fmul_rn, __fdiv_rn pin down every rounding. */
#include "cuda_internal.h"

#include <cuda_runtime.h>
#include <stdint.h>

/* ------------------------------------------------------------ helpers */

static __device__ __forceinline__ uint32_t f2u(float f) { return __float_as_uint(f); }
static __device__ __forceinline__ float u2f(uint32_t u) { return __uint_as_float(u); }

/* 64-bit unsigned division with a 32-bit fast path (the operands are
 * almost always below 2^32; the branch is uniform across a warp). */
static __device__ __forceinline__ uint64_t udiv(uint64_t a, uint64_t b)
{
    if (((a | b) >> 32) == 0) return (uint64_t)((uint32_t)a / (uint32_t)b);
    return a / b;
}

/* ft_f32_to_bf16_1 */
static __device__ uint16_t d_f32_to_bf16(float f)
{
    uint32_t u = f2u(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static __device__ __forceinline__ float d_bf16_to_f32(uint16_t h) { return u2f((uint32_t)h << 16); }

/* ft_f32_to_f16_1 */
static __device__ uint16_t d_f32_to_f16(float f)
{
    uint32_t u = f2u(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t absu = u & 0x7fffffffu;
    if (absu > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((absu >> 13) & 0x3ffu));
    if (absu >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);
    if (absu < 0x38800000u) {
        if (absu < 0x33000000u) return (uint16_t)sign;
        uint32_t e = absu >> 23;
        uint32_t m = (absu & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - e;
        uint32_t q = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1u))) q++;
        return (uint16_t)(sign | q);
    }
    uint32_t r = absu - 0x38000000u;
    r += 0xfffu + ((r >> 13) & 1u);
    return (uint16_t)(sign | (r >> 13));
}

/* ft_f16_to_f32_1 */
static __device__ float d_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f) return u2f(sign | 0x7f800000u | (m << 13) | (m ? 0x400000u : 0));
    if (e == 0) {
        if (m == 0) return u2f(sign);
        float v = __fmul_rn((float)m, 5.9604644775390625e-8f);   /* m * 2^-24, exact */
        return sign ? -v : v;
    }
    return u2f(sign | ((e + 112u) << 23) | (m << 13));
}

static __device__ __forceinline__ float d_load(int dt, const void *p, uint64_t i)
{
    if (dt == FT_F32) return ((const float *)p)[i];
    if (dt == FT_BF16) return d_bf16_to_f32(((const uint16_t *)p)[i]);
    return d_f16_to_f32(((const uint16_t *)p)[i]);
}

static __device__ __forceinline__ void d_store(int dt, void *p, uint64_t i, float y)
{
    if (dt == FT_F32) ((float *)p)[i] = y;
    else if (dt == FT_BF16) ((uint16_t *)p)[i] = d_f32_to_bf16(y);
    else ((uint16_t *)p)[i] = d_f32_to_f16(y);
}

/* Grid for n elements, grid-stride loops; capped so huge tensors loop. */
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
    GRID_STRIDE(i, n) d_store(dst_dt, dst, i, d_load(src_dt, src, i));
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

static __device__ __forceinline__ uint16_t get16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

/* Payload bytes of chunk c: 4 per group plus the packed values
 * (quant.c ft_quant_chunk_size), from the chunk's slab range. */
static __device__ uint64_t q_chunk_bytes(const ftk_qgeom *g, uint64_t c)
{
    uint64_t total = g->outer * g->ngroups;
    uint64_t s0 = c * g->spc, s1 = s0 + g->spc;
    if (s1 > total) s1 = total;
    uint64_t o0 = s0 / g->ngroups, g0 = s0 % g->ngroups;
    uint64_t o1 = s1 / g->ngroups, g1 = s1 % g->ngroups;
    uint64_t e0 = (o0 * g->D + g0 * g->G) * g->inner;
    uint64_t e1 = (o1 * g->D + g1 * g->G) * g->inner;
    uint64_t cnt = e1 - e0;
    return 4 * (s1 - s0) * g->inner + (g->bits == 8 ? cnt : (cnt + 1) / 2);
}

static __global__ void k_q_table(ftk_qgeom g, uint64_t *table)
{
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    uint64_t pos = g.header_size;
    for (uint32_t c = 0; c < g.n_chunks; c++) {
        table[c] = pos;
        pos += q_chunk_bytes(&g, c);
    }
}

extern "C" cudaError_t ftk_q_table(const ftk_qgeom *g, uint64_t *table, cudaStream_t s)
{
    if (g->n_chunks == 0) return cudaSuccess;
    k_q_table<<<1, 1, 0, s>>>(*g, table);
    return cudaGetLastError();
}

/* Element e of the [outer, D, inner] view: its slab (o, g), the chunk
 * holding that slab, the chunk's first element, and inside the chunk the
 * group's (min, step) at 4 * ((slab - s0) * inner + i) and the value at
 * position e - (chunk's first element) of the packed values. */
static __global__ void k_q_dequant(ftk_qgeom g, const uint8_t *frame, const uint64_t *table,
                                   int out_dt, void *dst)
{
    const uint64_t row = g.D * g.inner;
    const uint64_t total = g.outer * g.ngroups;
    GRID_STRIDE(e, g.numel) {
        uint64_t o = udiv(e, row), r = e - o * row;
        uint64_t d = udiv(r, g.inner), i = r - d * g.inner;
        uint64_t slab = o * g.ngroups + udiv(d, g.G);
        uint64_t c = udiv(slab, g.spc), s0 = c * g.spc;
        uint64_t s1 = s0 + g.spc < total ? s0 + g.spc : total;
        uint64_t o0 = udiv(s0, g.ngroups), g0 = s0 - o0 * g.ngroups;
        uint64_t off = (o0 * g.D + g0 * g.G) * g.inner;
        uint64_t k = e - off;
        const uint8_t *p = frame + table[c];
        const uint8_t *hp = p + 4 * ((slab - s0) * g.inner + i);
        const uint8_t *packed = p + 4 * (s1 - s0) * g.inner;
        unsigned q = g.bits == 8 ? packed[k] : (packed[k >> 1] >> (4 * (unsigned)(k & 1))) & 15u;
        float mn = d_f16_to_f32(get16(hp)), step = d_f16_to_f32(get16(hp + 2));
        /* q*step is exact in f32, so the fused and the unfused (CPU) forms agree */
        d_store(out_dt, dst, e, __fmaf_rn((float)q, step, mn));
    }
}

extern "C" cudaError_t ftk_q_dequant(const ftk_qgeom *g, const uint8_t *frame, const uint64_t *table,
                                     int out_dt, void *dst, cudaStream_t s)
{
    if (g->numel == 0) return cudaSuccess;
    unsigned b, t;
    grid_for(g->numel, &b, &t);
    k_q_dequant<<<b, t, 0, s>>>(*g, frame, table, out_dt, dst);
    return cudaGetLastError();
}

/* ------------------------------------------------------- byte planes */

static __global__ void k_bp_merge(int dt, const uint8_t *planes, uint64_t numel, uint64_t E,
                                  int out_dt, void *dst)
{
    const unsigned np = dt == FT_F32 ? 4u : 2u;
    GRID_STRIDE(e, numel) {
        uint64_t c = udiv(e, E), i = e - c * E;
        uint64_t nc = numel - c * E < E ? numel - c * E : E;
        const uint8_t *b = planes + c * E * np + i;
        if (dt == FT_F32) {
            uint32_t ex = b[0], s = b[nc], m = b[2 * nc], l = b[3 * nc];
            uint32_t u = ((s & 0x80u) << 24) | (ex << 23) | ((s & 0x7Fu) << 16) | (m << 8) | l;
            if (out_dt == FT_F32) ((uint32_t *)dst)[e] = u;
            else d_store(out_dt, dst, e, u2f(u));
        } else {
            uint32_t p0 = b[0], p1 = b[nc];
            uint16_t h = dt == FT_BF16 ? (uint16_t)(((p1 & 0x80u) << 8) | (p0 << 7) | (p1 & 0x7Fu))
                                       : (uint16_t)((p0 << 8) | p1);
            if (out_dt == dt) ((uint16_t *)dst)[e] = h;
            else d_store(out_dt, dst, e, dt == FT_BF16 ? d_bf16_to_f32(h) : d_f16_to_f32(h));
        }
    }
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

/* src/codec/quant.c: h_next_up, h2f, f16_trunc, ft_qparams. */
static __device__ uint16_t h_next_up(uint16_t h)
{
    if (h == 0x8000u) return 0x0001u;
    return (h & 0x8000u) ? (uint16_t)(h - 1) : (uint16_t)(h + 1);
}

static __device__ float h2f(uint16_t h)
{
    float f = u2f((uint32_t)(h & 0x7fffu) << 13);
    f = __fmul_rn(f, 5.192296858534828e+33f);   /* 2^112, exact (also for subnormals) */
    return (h & 0x8000u) ? -f : f;
}

static __device__ uint16_t f16_trunc(uint32_t absu, int *inexact)
{
    if (absu >= 0x38800000u) {
        *inexact = (absu & 0x1fffu) != 0;
        return (uint16_t)((absu - 0x38000000u) >> 13);
    }
    uint32_t e = absu >> 23;
    if (e < 103) { *inexact = absu != 0; return 0; }
    uint32_t m = (absu & 0x7fffffu) | 0x800000u, sh = 126 - e;
    *inexact = (m & ((1u << sh) - 1)) != 0;
    return (uint16_t)(m >> sh);
}

/* Every double quantity below (fp16 x 8 bits + fp16, compared with an
 * f32) is exact, so contraction into fma cannot change a result; the
 * explicit __dmul_rn/__dadd_rn keep the expressions as written anyway. */
static __device__ int qparams(float mn, float mx, unsigned bmax, uint16_t *min16, uint16_t *step16)
{
    if (!(fabsf(mn) <= 65504.0f) || !(mx >= mn)) return 1;
    int inexact;
    uint16_t h = f16_trunc(f2u(mn) & 0x7fffffffu, &inexact);
    if (mn < 0.0f) h = (uint16_t)(0x8000u | (h + (unsigned)inexact));
    if (h == 0x8000u) h = 0;
    double m16 = h2f(h);
    double B = bmax;
    double invb = bmax == 15 ? 1.0 / 15 : bmax == 255 ? 1.0 / 255 : 1.0 / B;
    double need = __dmul_rn(__dsub_rn((double)mx, m16), invb);
    if (need > 65504.0) return 1;
    uint16_t s = f16_trunc(f2u((float)need), &inexact);
    s = (uint16_t)(s + (unsigned)inexact);
    while (s > 0 && __dadd_rn(m16, __dmul_rn(B, (double)h2f((uint16_t)(s - 1)))) >= (double)mx) s--;
    while (__dadd_rn(m16, __dmul_rn(B, (double)h2f(s))) < (double)mx) {
        s = h_next_up(s);
        if (s > 0x7bffu) return 1;
    }
    *min16 = h;
    *step16 = s;
    return 0;
}

/* quant.c quant1: t = (x - min) * inv, clamped to [0, B], round half to
 * even. */
static __device__ __forceinline__ unsigned quant1(float x, float mn, float inv, float bmax)
{
    float t = __fmul_rn(__fsub_rn(x, mn), inv);
    t = t > 0.0f ? t : 0.0f;
    t = t < bmax ? t : bmax;
    return __float2uint_rn(t);
}

/* Phase 1: one thread per (row, group): min/max, parameters, the 4-byte
 * group header, and (min, 1/step) for phase 2. A failing group records
 * min(4 * flat group index + code) in *err (code 1: non-finite value,
 * 2: range not representable), as the CPU reports the first failing group. */
static __global__ void k_qrow_params(int bits, const float *src, uint64_t rows, uint64_t n,
                                     uint32_t group, uint8_t *dst, uint64_t rowbytes, float2 *par,
                                     unsigned long long *err)
{
    const uint64_t ng = n / group;
    const unsigned bmax = (1u << bits) - 1;
    GRID_STRIDE(t, rows * ng) {
        uint64_t r = t / ng, j = t - r * ng;
        const float *x = src + r * n + j * group;
        float mn = u2f(0x7f800000u), mx = u2f(0xff800000u);   /* +Inf, -Inf */
        int bad = 0;
        for (uint32_t i = 0; i < group; i++) {
            float v = x[i];
            if (!isfinite(v)) bad = 1;
            mn = v < mn ? v : mn;
            mx = v > mx ? v : mx;
        }
        uint16_t h = 0, s = 0;
        if (!bad && qparams(mn, mx, bmax, &h, &s)) bad = 2;
        if (bad) {
            atomicMin(err, (unsigned long long)(4 * t + (uint64_t)bad));
            par[t] = make_float2(0.0f, 0.0f);
            continue;
        }
        uint8_t *hp = dst + r * rowbytes + 4 * j;
        hp[0] = (uint8_t)h; hp[1] = (uint8_t)(h >> 8);
        hp[2] = (uint8_t)s; hp[3] = (uint8_t)(s >> 8);
        float fs = h2f(s);
        par[t] = make_float2(h2f(h), fs > 0.0f ? __fdiv_rn(1.0f, fs) : 0.0f);
    }
}

/* Phase 2: one thread per packed byte of each row (q4: values 2b and
 * 2b+1, low nibble first; the high nibble of an odd row's last byte is
 * the zero pad). Each byte is written by exactly one thread. */
static __global__ void k_qrow_pack(int bits, const float *src, uint64_t rows, uint64_t n,
                                   uint32_t group, uint8_t *dst, uint64_t rowbytes, const float2 *par)
{
    const uint64_t ng = n / group;
    const uint64_t nb = bits == 8 ? n : (n + 1) / 2;
    const float bmax = (float)((1u << bits) - 1);
    GRID_STRIDE(t, rows * nb) {
        uint64_t r = t / nb, b = t - r * nb;
        const float *x = src + r * n;
        const float2 *p = par + r * ng;
        uint8_t *out = dst + r * rowbytes + 4 * ng;
        if (bits == 8) {
            float2 q = p[b / group];
            out[b] = (uint8_t)quant1(x[b], q.x, q.y, bmax);
        } else {
            uint64_t k = 2 * b;
            float2 q0 = p[k / group];
            unsigned lo = quant1(x[k], q0.x, q0.y, bmax), hi = 0;
            if (k + 1 < n) {
                float2 q1 = p[(k + 1) / group];
                hi = quant1(x[k + 1], q1.x, q1.y, bmax);
            }
            out[b] = (uint8_t)(lo | (hi << 4));
        }
    }
}

extern "C" cudaError_t ftk_qrow_encode(int bits, const float *src, uint64_t rows, uint64_t n,
                                       uint32_t group, uint8_t *dst, void *params,
                                       unsigned long long *err, cudaStream_t s)
{
    if (rows == 0 || n == 0) return cudaSuccess;
    const uint64_t ng = n / group;
    const uint64_t rowbytes = 4 * ng + (bits == 8 ? n : (n + 1) / 2);
    unsigned b, t;
    grid_for(rows * ng, &b, &t);
    float2 *par = (float2 *)params;
    k_qrow_params<<<b, t, 0, s>>>(bits, src, rows, n, group, dst, rowbytes, par, err);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    grid_for(rows * (bits == 8 ? n : (n + 1) / 2), &b, &t);
    k_qrow_pack<<<b, t, 0, s>>>(bits, src, rows, n, group, dst, rowbytes, par);
    return cudaGetLastError();
}

/* Decode: one thread per value, as ft_qrow_decode (dec_groups to f32). */
static __global__ void k_qrow_decode(int bits, const uint8_t *src, uint64_t rows, uint64_t n,
                                     uint32_t group, float *dst)
{
    const uint64_t ng = n / group;
    const uint64_t rowbytes = 4 * ng + (bits == 8 ? n : (n + 1) / 2);
    GRID_STRIDE(t, rows * n) {
        uint64_t r = t / n, k = t - r * n;
        const uint8_t *row = src + r * rowbytes;
        const uint8_t *hp = row + 4 * (k / group);
        const uint8_t *packed = row + 4 * ng;
        unsigned q = bits == 8 ? packed[k] : (packed[k >> 1] >> (4 * (unsigned)(k & 1))) & 15u;
        dst[t] = __fmaf_rn((float)q, d_f16_to_f32(get16(hp + 2)), d_f16_to_f32(get16(hp)));
    }
}

extern "C" cudaError_t ftk_qrow_decode(int bits, const uint8_t *src, uint64_t rows, uint64_t n,
                                       uint32_t group, float *dst, cudaStream_t s)
{
    if (rows == 0 || n == 0) return cudaSuccess;
    unsigned b, t;
    grid_for(rows * n, &b, &t);
    k_qrow_decode<<<b, t, 0, s>>>(bits, src, rows, n, group, dst);
    return cudaGetLastError();
}
