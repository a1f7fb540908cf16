/* Per-element math of the GPU codec kernels, shared by the CUDA kernels
 * (compiled by nvcc for the device) and by host C code: the test
 * tests/cuda/test_cuda_hostmath.c runs these very functions on the CPU,
 * element by element, against the CPU codec (src/core/convert.c,
 * src/codec/quant.c, byteplane.c), so the index math and the bit-level
 * arithmetic are verified on machines without a GPU. The kernels add only
 * the launch (one thread per element or byte, grid-stride loops).
 *
 * The functions are line-by-line ports of the CPU definitions. Every
 * floating-point operation whose rounding matters is spelled with a KM_*
 * macro: the device's explicitly rounded intrinsics (__fmul_rn, ...; no
 * contraction into fma, no flush-to-zero) or the plain C operator on the
 * host (the library is built without -ffast-math and for baseline x86-64,
 * which has no fma instruction to contract into). No CUDA header is needed
 * here. */
#ifndef FT_CUDA_KERN_MATH_H
#define FT_CUDA_KERN_MATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "flextier/core.h"

#ifdef __CUDACC__
#define FT_HD static __host__ __device__ __forceinline__
#else
#define FT_HD static inline
#endif

#if defined(__CUDA_ARCH__)
#define KM_FMUL(a, b) __fmul_rn((a), (b))
#define KM_FSUB(a, b) __fsub_rn((a), (b))
#define KM_FDIV(a, b) __fdiv_rn((a), (b))
#define KM_FMA(a, b, c) __fmaf_rn((a), (b), (c))
#define KM_DMUL(a, b) __dmul_rn((a), (b))
#define KM_DADD(a, b) __dadd_rn((a), (b))
#define KM_DSUB(a, b) __dsub_rn((a), (b))
#define KM_RINT_U(t) __float2uint_rn(t)
#else
#define KM_FMUL(a, b) ((a) * (b))
#define KM_FSUB(a, b) ((a) - (b))
#define KM_FDIV(a, b) ((a) / (b))
#define KM_FMA(a, b, c) fmaf((a), (b), (c))
#define KM_DMUL(a, b) ((a) * (b))
#define KM_DADD(a, b) ((a) + (b))
#define KM_DSUB(a, b) ((a) - (b))
#define KM_RINT_U(t) ((unsigned)rintf(t))
#endif

FT_HD uint32_t km_f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
FT_HD float km_u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* 64-bit unsigned division with a 32-bit fast path (operands are almost
 * always below 2^32; on the GPU 64-bit division is a long software
 * sequence). */
FT_HD uint64_t km_udiv(uint64_t a, uint64_t b)
{
    if (((a | b) >> 32) == 0) return (uint64_t)((uint32_t)a / (uint32_t)b);
    return a / b;
}

/* ------------------------------------------------ dtype conversion */

/* ft_f32_to_bf16_1 */
FT_HD uint16_t km_f32_to_bf16(float f)
{
    uint32_t u = km_f2u(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

FT_HD float km_bf16_to_f32(uint16_t h) { return km_u2f((uint32_t)h << 16); }

/* ft_f32_to_f16_1 */
FT_HD uint16_t km_f32_to_f16(float f)
{
    uint32_t u = km_f2u(f);
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
FT_HD float km_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f) return km_u2f(sign | 0x7f800000u | (m << 13) | (m ? 0x400000u : 0));
    if (e == 0) {
        if (m == 0) return km_u2f(sign);
        float v = KM_FMUL((float)m, 5.9604644775390625e-8f);   /* m * 2^-24, exact */
        return sign ? -v : v;
    }
    return km_u2f(sign | ((e + 112u) << 23) | (m << 13));
}

/* Element i of a float array of dtype dt (FT_F32, FT_BF16, FT_F16). */
FT_HD float km_load(int dt, const void *p, uint64_t i)
{
    if (dt == FT_F32) return ((const float *)p)[i];
    if (dt == FT_BF16) return km_bf16_to_f32(((const uint16_t *)p)[i]);
    return km_f16_to_f32(((const uint16_t *)p)[i]);
}

FT_HD void km_store(int dt, void *p, uint64_t i, float y)
{
    if (dt == FT_F32) ((float *)p)[i] = y;
    else if (dt == FT_BF16) ((uint16_t *)p)[i] = km_f32_to_bf16(y);
    else ((uint16_t *)p)[i] = km_f32_to_f16(y);
}

/* ------------------------------------------------ q8/q4 frames */

/* Geometry of a q8/q4 frame (docs/codec-quant.md), from the host's
 * ft_layout: the tensor viewed as [outer, D, inner], groups of G along D,
 * slabs (o, g) in chunks of spc slabs. Chunk payloads follow each other
 * from header_size in the frame (ft_frame_parse checks that every chunk
 * has exactly the size its layout gives). */
typedef struct ftk_qgeom {
    uint64_t numel, outer, D, inner, G, ngroups, spc;
    uint32_t n_chunks;
    int bits;                 /* 8 or 4 */
    uint64_t header_size;
} ftk_qgeom;

FT_HD uint16_t km_get16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

/* Element offset of slab s (ft_layout_chunk's arithmetic). */
FT_HD uint64_t km_slab_elem(const ftk_qgeom *g, uint64_t s)
{
    uint64_t o = km_udiv(s, g->ngroups), gi = s - o * g->ngroups;
    return (o * g->D + gi * g->G) * g->inner;
}

/* Payload bytes of chunk c: 4 per group plus the packed values
 * (quant.c ft_quant_chunk_size). */
FT_HD uint64_t km_q_chunk_bytes(const ftk_qgeom *g, uint64_t c)
{
    uint64_t total = g->outer * g->ngroups;
    uint64_t s0 = c * g->spc, s1 = s0 + g->spc < total ? s0 + g->spc : total;
    uint64_t cnt = km_slab_elem(g, s1) - km_slab_elem(g, s0);
    return 4 * (s1 - s0) * g->inner + (g->bits == 8 ? cnt : (cnt + 1) / 2);
}

/* table[c] = byte offset of chunk c's payload in the frame (one thread on
 * the GPU: n_chunks is small). */
FT_HD void km_q_table(const ftk_qgeom *g, uint64_t *table)
{
    uint64_t pos = g->header_size;
    for (uint32_t c = 0; c < g->n_chunks; c++) {
        table[c] = pos;
        pos += km_q_chunk_bytes(g, c);
    }
}

/* Element e: its slab (o, g) of the [outer, D, inner] view, the chunk
 * holding that slab and the chunk's first element; in the chunk's
 * payload the group's fp16 (min, step) at 4 * ((slab - s0) * inner + i)
 * and the value at position e - (first element) of the packed values.
 * Returns q * step + min in f32 (q*step is exact, so the fused form equals
 * the CPU's multiply-then-add). */
FT_HD float km_q_dequant(const ftk_qgeom *g, const uint8_t *frame, const uint64_t *table, uint64_t e)
{
    const uint64_t row = g->D * g->inner;
    const uint64_t total = g->outer * g->ngroups;
    uint64_t o = km_udiv(e, row), r = e - o * row;
    uint64_t d = km_udiv(r, g->inner), i = r - d * g->inner;
    uint64_t slab = o * g->ngroups + km_udiv(d, g->G);
    uint64_t c = km_udiv(slab, g->spc), s0 = c * g->spc;
    uint64_t s1 = s0 + g->spc < total ? s0 + g->spc : total;
    uint64_t k = e - km_slab_elem(g, s0);
    const uint8_t *p = frame + table[c];
    const uint8_t *hp = p + 4 * ((slab - s0) * g->inner + i);
    const uint8_t *packed = p + 4 * (s1 - s0) * g->inner;
    unsigned q = g->bits == 8 ? packed[k] : (packed[k >> 1] >> (4 * (unsigned)(k & 1))) & 15u;
    return KM_FMA((float)q, km_f16_to_f32(km_get16(hp + 2)), km_f16_to_f32(km_get16(hp)));
}

/* The fast path of the common layout: groups along the contiguous last
 * dimension (inner 1), whole groups of a multiple of 8 (D % G == 0,
 * G % 8 == 0) and fewer than 2^32 elements. Then element e's slab is e / G
 * and a run of 8 elements from a multiple of 8 lies in one group: one
 * thread per 8 values with one header and a 32-bit index path (the
 * general km_q_dequant spends five divisions per element). */
FT_HD int km_q_fast8_ok(const ftk_qgeom *g)
{
    return g->inner == 1 && g->G >= 8 && g->G % 8 == 0 && g->D % g->G == 0 && g->numel % 8 == 0 &&
           g->numel < ((uint64_t)1 << 32) && g->spc >= 1 && g->spc < ((uint64_t)1 << 32);
}

/* Elements 8t .. 8t+7 (km_q_fast8_ok(g)), each equal to km_q_dequant's.
 * No chunk table: every chunk before the last holds spc whole slabs, so
 * chunk c's payload starts at header_size + c * (bytes of a full chunk). */
FT_HD void km_q_dequant8(const ftk_qgeom *g, const uint8_t *frame, uint32_t t, float v[8])
{
    const uint32_t G = (uint32_t)g->G, spc = (uint32_t)g->spc;
    const uint32_t total = (uint32_t)(g->outer * g->ngroups);
    const uint32_t e0 = t * 8u;
    const uint32_t slab = e0 / G;
    const uint32_t c = slab / spc, s0 = c * spc;
    const uint32_t s1 = s0 + spc < total ? s0 + spc : total;
    const uint32_t k = e0 - s0 * G;
    const uint64_t full = 4u * (uint64_t)spc + (g->bits == 8 ? (uint64_t)spc * G : (uint64_t)spc * G / 2);
    const uint8_t *p = frame + g->header_size + (uint64_t)c * full;
    const uint8_t *hp = p + 4u * (slab - s0);
    const uint8_t *packed = p + 4u * (s1 - s0);
    const float mn = km_f16_to_f32(km_get16(hp)), step = km_f16_to_f32(km_get16(hp + 2));
    if (g->bits == 8) {
        for (int j = 0; j < 8; j++) v[j] = KM_FMA((float)packed[k + (uint32_t)j], step, mn);
    } else {
        const uint8_t *b = packed + (k >> 1);
        for (int j = 0; j < 4; j++) {
            v[2 * j] = KM_FMA((float)(b[j] & 15u), step, mn);
            v[2 * j + 1] = KM_FMA((float)(b[j] >> 4), step, mn);
        }
    }
}

/* ------------------------------------------------ byte planes */

/* The value bits of element e from its chunk's planes (layout of
 * ftk_bp_merge: chunk c of E elements at c*E*nplanes, plane k of it at
 * + k*n_c), assembled as in docs/codec-byteplane.md. */
FT_HD uint32_t km_bp_bits(int dt, const uint8_t *planes, uint64_t numel, uint64_t E, uint64_t e)
{
    const uint64_t np = dt == FT_F32 ? 4 : 2;
    uint64_t c = km_udiv(e, E), i = e - c * E;
    uint64_t nc = numel - c * E < E ? numel - c * E : E;
    const uint8_t *b = planes + c * E * np + i;
    if (dt == FT_F32) {
        uint32_t ex = b[0], s = b[nc], m = b[2 * nc], l = b[3 * nc];
        return ((s & 0x80u) << 24) | (ex << 23) | ((s & 0x7Fu) << 16) | (m << 8) | l;
    }
    uint32_t p0 = b[0], p1 = b[nc];
    if (dt == FT_BF16) return ((p1 & 0x80u) << 8) | (p0 << 7) | (p1 & 0x7Fu);
    return (p0 << 8) | p1;
}

/* Store the bits of a dt value as out_dt: as they are for the same dtype
 * (NaN payloads kept, like a lossless decode), else converted. */
FT_HD void km_bp_store(int dt, int out_dt, void *dst, uint64_t e, uint32_t bits)
{
    if (out_dt == dt) {
        if (dt == FT_F32) ((uint32_t *)dst)[e] = bits;
        else ((uint16_t *)dst)[e] = (uint16_t)bits;
        return;
    }
    float v = dt == FT_F32 ? km_u2f(bits)
              : dt == FT_BF16 ? km_bf16_to_f32((uint16_t)bits) : km_f16_to_f32((uint16_t)bits);
    km_store(out_dt, dst, e, v);
}

/* ------------------------------------------------ KV-row quantization */

/* quant.c: h_next_up, h2f, f16_trunc, ft_qparams, quant1. */
FT_HD uint16_t km_h_next_up(uint16_t h)
{
    if (h == 0x8000u) return 0x0001u;
    return (h & 0x8000u) ? (uint16_t)(h - 1) : (uint16_t)(h + 1);
}

FT_HD float km_h2f(uint16_t h)
{
    float f = km_u2f((uint32_t)(h & 0x7fffu) << 13);
    f = KM_FMUL(f, 5.192296858534828e+33f);   /* 2^112: exact, subnormals included */
    return (h & 0x8000u) ? -f : f;
}

FT_HD uint16_t km_f16_trunc(uint32_t absu, int *inexact)
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

/* ft_qparams: 0 on success, 1 when fp16 parameters cannot hold the range.
 * Every double quantity (fp16 x 8 bits + fp16, compared with an f32) is
 * exact, as the CPU version notes. */
FT_HD int km_qparams(float mn, float mx, unsigned bmax, uint16_t *min16, uint16_t *step16)
{
    if (!(fabsf(mn) <= 65504.0f) || !(mx >= mn)) return 1;
    int inexact;
    uint16_t h = km_f16_trunc(km_f2u(mn) & 0x7fffffffu, &inexact);
    if (mn < 0.0f) h = (uint16_t)(0x8000u | (h + (unsigned)inexact));
    if (h == 0x8000u) h = 0;
    double m16 = km_h2f(h);
    double B = bmax;
    double invb = bmax == 15 ? 1.0 / 15 : bmax == 255 ? 1.0 / 255 : 1.0 / B;
    double need = KM_DMUL(KM_DSUB((double)mx, m16), invb);
    if (need > 65504.0) return 1;
    uint16_t s = km_f16_trunc(km_f2u((float)need), &inexact);
    s = (uint16_t)(s + (unsigned)inexact);
    while (s > 0 && KM_DADD(m16, KM_DMUL(B, (double)km_h2f((uint16_t)(s - 1)))) >= (double)mx) s--;
    while (KM_DADD(m16, KM_DMUL(B, (double)km_h2f(s))) < (double)mx) {
        s = km_h_next_up(s);
        if (s > 0x7bffu) return 1;
    }
    *min16 = h;
    *step16 = s;
    return 0;
}

/* t = (x - min) * inv clamped to [0, B], rounded half to even. */
FT_HD unsigned km_quant1(float x, float mn, float inv, float bmax)
{
    float t = KM_FMUL(KM_FSUB(x, mn), inv);
    t = t > 0.0f ? t : 0.0f;
    t = t < bmax ? t : bmax;
    return KM_RINT_U(t);
}

/* One group of a KV row: x[0..group). Returns 0 and the fp16 parameters
 * plus (min, 1/step) as f32, 1 for a non-finite value, 2 for a range fp16
 * parameters cannot hold (ft_qrow_encode's order: the finiteness check
 * first, then the parameters). */
FT_HD int km_qrow_group(int bits, const float *x, uint32_t group, uint16_t *h16, uint16_t *s16, float *mn_out,
                        float *inv_out)
{
    float mn = km_u2f(0x7f800000u), mx = km_u2f(0xff800000u);   /* +Inf, -Inf */
    int bad = 0;
    for (uint32_t i = 0; i < group; i++) {
        float v = x[i];
        if (!isfinite(v)) bad = 1;
        mn = v < mn ? v : mn;
        mx = v > mx ? v : mx;
    }
    if (bad) return 1;
    uint16_t h, s;
    if (km_qparams(mn, mx, (1u << bits) - 1, &h, &s)) return 2;
    float fs = km_h2f(s);
    *h16 = h;
    *s16 = s;
    *mn_out = km_h2f(h);
    *inv_out = fs > 0.0f ? KM_FDIV(1.0f, fs) : 0.0f;
    return 0;
}

/* Packed byte b of a row of n values (q8: value b; q4: values 2b (low
 * nibble) and 2b+1, the high nibble 0 past the end). par: (min, 1/step)
 * of each group of the row, as pairs of floats. */
FT_HD uint8_t km_qrow_byte(int bits, const float *x, uint64_t n, uint32_t group, const float *par, uint64_t b)
{
    const float bmax = (float)((1u << bits) - 1);
    if (bits == 8) {
        uint64_t g = b / group;
        return (uint8_t)km_quant1(x[b], par[2 * g], par[2 * g + 1], bmax);
    }
    uint64_t k = 2 * b, g0 = k / group;
    unsigned lo = km_quant1(x[k], par[2 * g0], par[2 * g0 + 1], bmax), hi = 0;
    if (k + 1 < n) {
        uint64_t g1 = (k + 1) / group;
        hi = km_quant1(x[k + 1], par[2 * g1], par[2 * g1 + 1], bmax);
    }
    return (uint8_t)(lo | (hi << 4));
}

/* Value k of an encoded row (ft_qrow_decode: dec_groups to f32). */
FT_HD float km_qrow_value(int bits, const uint8_t *row, uint64_t n, uint32_t group, uint64_t k)
{
    const uint64_t ng = n / group;
    const uint8_t *hp = row + 4 * (k / group);
    const uint8_t *packed = row + 4 * ng;
    unsigned q = bits == 8 ? packed[k] : (packed[k >> 1] >> (4 * (unsigned)(k & 1))) & 15u;
    return KM_FMA((float)q, km_f16_to_f32(km_get16(hp + 2)), km_f16_to_f32(km_get16(hp)));
}

/* ------------------------------------------------ argmax */

/* (v, i) beats (bv, bi): larger value, or equal value and lower index.
 * NaN never beats anything. With the start (-Inf, INT32_MAX), reducing
 * all elements in any order and tree shape gives the first index of the
 * largest value, as the CPU sampler's argmax. */
FT_HD int km_argmax_better(float v, int i, float bv, int bi)
{
    return v > bv || (v == bv && i < bi);
}

#endif
