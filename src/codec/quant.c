/* Group-wise asymmetric quantization (q8, q4), FlexGen style with a
 * guaranteed error bound. Layout and bound: docs/codec-quant.md.
 *
 * A chunk is a run of whole slabs (o, g) of the [outer, D, inner] view, so
 * its elements are contiguous. This file walks the slabs, computes the
 * per-group fp16 parameters and validates; the per-element work is done by
 * the kernels of quant_kern.h (scalar here; AVX-512 and AVX2 in
 * quant_x86.c, NEON in quant_neon.c). */
#include "codec_internal.h"
#include "quant_kern.h"

#include <math.h>
#include <string.h>

/* Column block for inner > 1: parameters of up to QBLK groups live on the
 * stack while the rows of a slab are processed. */
#define QBLK 512

static inline uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

static inline float ld1(ft_dtype dt, const void *p, size_t i)
{
    switch (dt) {
    case FT_F32: return ((const float *)p)[i];
    case FT_BF16: return ft_bf16_to_f32_1(((const uint16_t *)p)[i]);
    default: return ft_f16_to_f32_1(((const uint16_t *)p)[i]);
    }
}

static inline void st1(ft_dtype dt, void *p, size_t i, float y)
{
    switch (dt) {
    case FT_F32: ((float *)p)[i] = y; break;
    case FT_BF16: ((uint16_t *)p)[i] = ft_f32_to_bf16_1(y); break;
    default: ((uint16_t *)p)[i] = ft_f32_to_f16_1(y); break;
    }
}

static inline unsigned getq(int bits, const uint8_t *p, uint64_t k)
{
    if (bits == 8) return p[k];
    return (p[k >> 1] >> (4 * (k & 1))) & 15u;
}

static inline void putq(int bits, uint8_t *p, uint64_t k, unsigned q)
{
    if (bits == 8) { p[k] = (uint8_t)q; return; }
    uint8_t *b = &p[k >> 1];
    if (k & 1) *b = (uint8_t)((*b & 0x0fu) | (q << 4));
    else *b = (uint8_t)((*b & 0xf0u) | q);
}

/* Round half to even for 0 <= t < 2^22 (adding 1.5 * 2^23 leaves no
 * fraction bits). Like all float code here it assumes the default
 * round-to-nearest mode; the SIMD kernels convert with explicit RNE. A NaN
 * t clamps to 0 here and in the SIMD kernels (max(NaN, 0) = 0). */
static inline unsigned quant1(float x, float mn, float inv, float bmax)
{
    float t = (x - mn) * inv;
    t = t > 0.0f ? t : 0.0f;
    t = t < bmax ? t : bmax;
    float r = (t + 12582912.0f) - 12582912.0f;
    return (unsigned)r;
}

void ft_qdec_bcast_ref(int bits, ft_dtype odt, const uint8_t *p, uint64_t k, size_t n,
                       float mn, float step, void *out)
{
    for (size_t i = 0; i < n; i++)
        st1(odt, out, i, (float)getq(bits, p, k + i) * step + mn);
}

void ft_qdec_vec_ref(int bits, ft_dtype odt, const uint8_t *p, uint64_t k, size_t n,
                     const float *mn, const float *step, int fin, void *out)
{
    (void)fin;
    for (size_t i = 0; i < n; i++)
        st1(odt, out, i, (float)getq(bits, p, k + i) * step[i] + mn[i]);
}

static inline uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

void ft_qdec_groups_ref(int bits, ft_dtype odt, const uint8_t *hdr, const uint8_t *p,
                        uint64_t k, size_t ngroups, size_t g, void *out)
{
    size_t os = ft_dtype_bits(odt) / 8;
    for (size_t j = 0; j < ngroups; j++)
        ft_qdec_bcast_ref(bits, odt, p, k + j * g, g, ft_f16_to_f32_1(get16(hdr + 4 * j)),
                          ft_f16_to_f32_1(get16(hdr + 4 * j + 2)), (uint8_t *)out + j * g * os);
}

int ft_qminmax_ref(ft_dtype idt, const void *src, size_t n, float *mn, float *mx)
{
    float a = *mn, b = *mx;
    for (size_t i = 0; i < n; i++) {
        float x = ld1(idt, src, i);
        if (!isfinite(x)) return 1;
        a = x < a ? x : a;
        b = x > b ? x : b;
    }
    *mn = a;
    *mx = b;
    return 0;
}

int ft_qminmax_vec_ref(ft_dtype idt, const void *src, size_t n, float *mn, float *mx)
{
    for (size_t i = 0; i < n; i++) {
        float x = ld1(idt, src, i);
        if (!isfinite(x)) return 1;
        mn[i] = x < mn[i] ? x : mn[i];
        mx[i] = x > mx[i] ? x : mx[i];
    }
    return 0;
}

void ft_qenc_bcast_ref(int bits, ft_dtype idt, const void *src, size_t n, float mn, float inv,
                       uint8_t *p, uint64_t k)
{
    float bmax = (float)((1u << bits) - 1);
    for (size_t i = 0; i < n; i++) putq(bits, p, k + i, quant1(ld1(idt, src, i), mn, inv, bmax));
}

void ft_qenc_vec_ref(int bits, ft_dtype idt, const void *src, size_t n, const float *mn,
                     const float *inv, uint8_t *p, uint64_t k)
{
    float bmax = (float)((1u << bits) - 1);
    for (size_t i = 0; i < n; i++)
        putq(bits, p, k + i, quant1(ld1(idt, src, i), mn[i], inv[i], bmax));
}

static const ft_qkern qkern_ref = {
    "scalar", ft_qdec_bcast_ref, ft_qdec_vec_ref, ft_qdec_groups_ref, ft_qminmax_ref,
    ft_qminmax_vec_ref, ft_qenc_bcast_ref, ft_qenc_vec_ref};

const ft_qkern *ft_qkern_ref(void) { return &qkern_ref; }

static const ft_qkern *qkern_forced;

void ft_qkern_override(const ft_qkern *k) { qkern_forced = k; }

const ft_qkern *ft_qkern_best(void)
{
    if (qkern_forced) return qkern_forced;
    const ft_qkern *k = ft_qkern_avx512();
    if (!k) k = ft_qkern_avx2();
    if (!k) k = ft_qkern_neon();
    return k ? k : &qkern_ref;
}

/* ------------------------------------------------------ group parameters */

static uint16_t h_next_up(uint16_t h)
{
    if (h == 0x8000u) return 0x0001u;
    return (h & 0x8000u) ? (uint16_t)(h - 1) : (uint16_t)(h + 1);
}


/* fp16 -> f32 for finite h: move the bits into place and rebias by 2^112
 * (exact for normals and subnormals alike). */
static inline float h2f(uint16_t h)
{
    uint32_t u = ((uint32_t)(h & 0x7fffu) << 13);
    float f;
    memcpy(&f, &u, 4);
    f *= 5.192296858534828e+33f;   /* 2^112 */
    return (h & 0x8000u) ? -f : f;
}

/* |f| (bits absu, finite, < 65520) truncated to fp16 magnitude bits;
 * *inexact = whether bits were dropped. */
static inline uint16_t f16_trunc(uint32_t absu, int *inexact)
{
    if (absu >= 0x38800000u) {                   /* fp16 normal range */
        *inexact = (absu & 0x1fffu) != 0;
        return (uint16_t)((absu - 0x38000000u) >> 13);
    }
    uint32_t e = absu >> 23;
    if (e < 103) { *inexact = absu != 0; return 0; }   /* below 2^-24 */
    uint32_t m = (absu & 0x7fffffu) | 0x800000u, sh = 126 - e;   /* 14..23 */
    *inexact = (m & ((1u << sh) - 1)) != 0;
    return (uint16_t)(m >> sh);
}

ft_status ft_qparams(float mn, float mx, unsigned bmax, uint16_t *min16, uint16_t *step16)
{
    if (!(fabsf(mn) <= 65504.0f) || !(mx >= mn)) return FT_ERR_UNSUPPORTED;
    /* min16: fp16 rounded toward -inf (directly, no search). */
    int inexact;
    uint16_t h = f16_trunc(f2u(mn) & 0x7fffffffu, &inexact);
    if (mn < 0.0f) h = (uint16_t)(0x8000u | (h + (unsigned)inexact));
    if (h == 0x8000u) h = 0;                     /* -0 and +0 encode alike */
    double m16 = h2f(h);
    /* step16: smallest non-negative fp16 with m16 + B*step16 >= mx. The
     * estimate (rounded up) is almost always it; the two loops make it
     * exact, tested in double where every quantity (fp16 * 8 bits + fp16,
     * compared with an f32) is exact. */
    double B = bmax;
    double invb = bmax == 15 ? 1.0 / 15 : bmax == 255 ? 1.0 / 255 : 1.0 / B;   /* no divide */
    double need = ((double)mx - m16) * invb;
    if (need > 65504.0) return FT_ERR_UNSUPPORTED;
    uint16_t s = f16_trunc(f2u((float)need), &inexact);
    s = (uint16_t)(s + (unsigned)inexact);
    while (s > 0 && m16 + B * h2f((uint16_t)(s - 1)) >= (double)mx) s--;
    while (m16 + B * h2f(s) < (double)mx) {
        s = h_next_up(s);
        if (s > 0x7bffu) return FT_ERR_UNSUPPORTED;
    }
    *min16 = h;
    *step16 = s;
    return FT_OK;
}

/* ------------------------------------------------------------- geometry */

static inline int qbits(const ft_frame_info *fi) { return fi->codec == FT_CODEC_Q8 ? 8 : 4; }

/* Slab index of element e (e at a slab boundary, or numel). */
static uint64_t slab_of(const ft_layout *L, uint64_t e)
{
    uint64_t row = L->D * L->inner;
    return (e / row) * L->ngroups + (e % row) / (L->G * L->inner);
}

static size_t packed_bytes(int bits, uint64_t cnt)
{
    return (size_t)(bits == 8 ? cnt : (cnt + 1) / 2);
}

size_t ft_quant_chunk_size(const ft_frame_info *fi, const ft_layout *L, uint64_t off, uint64_t cnt)
{
    if (cnt == 0 || L->D == 0 || L->inner == 0 || L->G == 0) return 0;
    uint64_t groups = (slab_of(L, off + cnt) - slab_of(L, off)) * L->inner;
    return (size_t)(4 * groups) + packed_bytes(qbits(fi), cnt);
}

/* Checks that [off, off+cnt) is a whole number of slabs; sets the first
 * slab (o, g). */
static int chunk_geometry(const ft_layout *L, uint64_t off, uint64_t cnt, uint64_t *o, uint64_t *g)
{
    if (L->D == 0 || L->inner == 0 || L->G == 0 || off > L->numel || cnt > L->numel - off)
        return 0;
    uint64_t row = L->D * L->inner, r = off % row;
    if (r % (L->G * L->inner)) return 0;
    *o = off / row;
    *g = r / (L->G * L->inner);
    uint64_t e = off + cnt;
    if (e != L->numel && (e % row) % (L->G * L->inner)) return 0;
    return 1;
}

static inline void put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
/* First non-finite element of a run (for the error message). */
static size_t find_nonfinite(ft_dtype dt, const void *src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(ld1(dt, src, i))) return i;
    return n;
}

static ft_status nonfinite_error(ft_dtype dt, const void *src, size_t n, uint64_t base)
{
    size_t i = find_nonfinite(dt, src, n);
    float x = i < n ? ld1(dt, src, i) : 0.0f;
    return ft_set_error(FT_ERR_INVALID_ARG,
                        "cannot quantize a non-finite value (%s) at element %llu",
                        isnan(x) ? "NaN" : (x > 0 ? "+Inf" : "-Inf"),
                        (unsigned long long)(base + i));
}

static ft_status params_error(float mn, float mx, unsigned bmax, uint64_t elem)
{
    return ft_set_error(FT_ERR_UNSUPPORTED,
                        "group at element %llu: range [%g, %g] cannot be quantized with fp16 "
                        "parameters (needs |min| <= 65504 and (max - min)/%u <= 65504)",
                        (unsigned long long)elem, (double)mn, (double)mx, bmax);
}

ft_status ft_quant_encode_chunk(const ft_frame_info *fi, const ft_layout *L, uint64_t off,
                                uint64_t cnt, const void *src, void *dst, size_t cap, size_t *out)
{
    uint64_t o, g;
    if (cnt == 0) { *out = 0; return FT_OK; }
    if (!chunk_geometry(L, off, cnt, &o, &g))
        return ft_set_error(FT_ERR_INTERNAL, "quant chunk [%llu, +%llu) is not slab-aligned",
                            (unsigned long long)off, (unsigned long long)cnt);
    size_t size = ft_quant_chunk_size(fi, L, off, cnt);
    if (cap < size) return ft_set_error(FT_ERR_BUFFER_SMALL, "quant chunk needs %zu bytes", size);
    const ft_qkern *K = ft_qkern_best();
    const int bits = qbits(fi);
    const unsigned bmax = (1u << bits) - 1;
    const ft_dtype idt = fi->dtype;
    const size_t isz = L->esize;
    const uint64_t inner = L->inner;
    uint8_t *hdr = dst;
    uint64_t ngroups_chunk = (slab_of(L, off + cnt) - slab_of(L, off)) * inner;
    uint8_t *packed = hdr + 4 * ngroups_chunk;
    if (bits == 4 && (cnt & 1)) packed[cnt / 2] = 0;         /* pad nibble */
    const uint8_t *s8 = src;
    uint64_t e0 = 0, j = 0;
    while (e0 < cnt) {
        uint64_t glen = L->D - g * L->G < L->G ? L->D - g * L->G : L->G;
        if (inner == 1) {
            /* A run of full groups (or the short last group of a row),
             * in batches: min/max of all, then the parameters (independent
             * latency chains that overlap), then the quantization. */
            uint64_t run = 1;
            if (glen == L->G) {
                run = L->D / L->G - g;
                if (run > (cnt - e0) / glen) run = (cnt - e0) / glen;
            }
            enum { NB = 64 };
            float bmn[NB], bmx[NB], binv[NB];
            for (uint64_t r0 = 0; r0 < run; r0 += NB) {
                size_t nb = (size_t)(run - r0 < NB ? run - r0 : NB);
                uint64_t eb = e0 + r0 * glen;
                for (size_t b = 0; b < nb; b++) {
                    const uint8_t *x = s8 + (eb + b * glen) * isz;
                    bmn[b] = INFINITY;
                    bmx[b] = -INFINITY;
                    if (K->minmax(idt, x, glen, &bmn[b], &bmx[b]))
                        return nonfinite_error(idt, x, glen, off + eb + b * glen);
                }
                for (size_t b = 0; b < nb; b++) {
                    uint16_t h, s;
                    if (ft_qparams(bmn[b], bmx[b], bmax, &h, &s))
                        return params_error(bmn[b], bmx[b], bmax, off + eb + b * glen);
                    put16(hdr + 4 * (j + r0 + b), h);
                    put16(hdr + 4 * (j + r0 + b) + 2, s);
                    float fs = h2f(s);
                    bmn[b] = h2f(h);
                    binv[b] = fs > 0 ? 1.0f / fs : 0.0f;
                }
                for (size_t b = 0; b < nb; b++)
                    K->enc_bcast(bits, idt, s8 + (eb + b * glen) * isz, glen, bmn[b], binv[b],
                                 packed, eb + b * glen);
            }
            e0 += run * glen;
            j += run;
            g += run;
            if (g == L->ngroups) { g = 0; o++; }
            continue;
        } else {
            float mn[QBLK], mx[QBLK], inv[QBLK];
            for (uint64_t i0 = 0; i0 < inner; i0 += QBLK) {
                size_t nb = (size_t)(inner - i0 < QBLK ? inner - i0 : QBLK);
                for (size_t i = 0; i < nb; i++) { mn[i] = INFINITY; mx[i] = -INFINITY; }
                for (uint64_t d = 0; d < glen; d++) {
                    const uint8_t *x = s8 + (e0 + d * inner + i0) * isz;
                    if (K->minmax_vec(idt, x, nb, mn, mx))
                        return nonfinite_error(idt, x, nb, off + e0 + d * inner + i0);
                }
                for (size_t i = 0; i < nb; i++) {
                    uint16_t h, s;
                    if (ft_qparams(mn[i], mx[i], bmax, &h, &s))
                        return params_error(mn[i], mx[i], bmax, off + e0 + i0 + i);
                    uint8_t *hp = hdr + 4 * (j * inner + i0 + i);
                    put16(hp, h);
                    put16(hp + 2, s);
                    float fs = h2f(s);
                    mn[i] = h2f(h);
                    inv[i] = fs > 0 ? 1.0f / fs : 0.0f;
                }
                for (uint64_t d = 0; d < glen; d++) {
                    uint64_t e = e0 + d * inner + i0;
                    K->enc_vec(bits, idt, s8 + e * isz, nb, mn, inv, packed, e);
                }
            }
        }
        e0 += glen * inner;
        j++;
        if (++g == L->ngroups) { g = 0; o++; }
    }
    (void)o;
    *out = size;
    return FT_OK;
}

ft_status ft_quant_decode_chunk(const ft_frame_info *fi, const ft_layout *L, uint64_t off,
                                uint64_t cnt, const void *src, size_t n, ft_dtype out_dt, void *dst)
{
    uint64_t o, g;
    if (out_dt != FT_F32 && out_dt != FT_BF16 && out_dt != FT_F16)
        return ft_set_error(FT_ERR_UNSUPPORTED, "cannot dequantize to %s", ft_dtype_name(out_dt));
    if (cnt == 0) return n == 0 ? FT_OK : ft_set_error(FT_ERR_CORRUPT, "empty quant chunk has a payload");
    if (!chunk_geometry(L, off, cnt, &o, &g))
        return ft_set_error(FT_ERR_CORRUPT, "quant chunk [%llu, +%llu) is not slab-aligned",
                            (unsigned long long)off, (unsigned long long)cnt);
    if (n != ft_quant_chunk_size(fi, L, off, cnt))
        return ft_set_error(FT_ERR_CORRUPT, "quant chunk at element %llu: %zu payload bytes, "
                            "expected %zu", (unsigned long long)off, n,
                            ft_quant_chunk_size(fi, L, off, cnt));
    const ft_qkern *K = ft_qkern_best();
    const int bits = qbits(fi);
    const uint64_t inner = L->inner;
    const size_t osz = ft_dtype_bits(out_dt) / 8;
    const uint8_t *hdr = src;
    uint64_t ngroups_chunk = (slab_of(L, off + cnt) - slab_of(L, off)) * inner;
    const uint8_t *packed = hdr + 4 * ngroups_chunk;
    if (bits == 4 && (cnt & 1) && (packed[cnt / 2] >> 4))
        return ft_set_error(FT_ERR_CORRUPT, "quant chunk at element %llu: pad nibble not zero",
                            (unsigned long long)off);
    uint8_t *d8 = dst;
    uint64_t e0 = 0, j = 0;
    while (e0 < cnt) {
        uint64_t glen = L->D - g * L->G < L->G ? L->D - g * L->G : L->G;
        if (inner == 1) {
            /* A run of full groups up to the end of the row or chunk. */
            uint64_t run = 1;
            if (glen == L->G) {
                run = L->D / L->G - g;
                if (run > (cnt - e0) / glen) run = (cnt - e0) / glen;
            }
            K->dec_groups(bits, out_dt, hdr + 4 * j, packed, e0, (size_t)run, (size_t)glen,
                          d8 + e0 * osz);
            e0 += run * glen;
            j += run;
            g += run;
            if (g == L->ngroups) { g = 0; o++; }
            continue;
        } else {
            float mn[QBLK], st[QBLK];
            for (uint64_t i0 = 0; i0 < inner; i0 += QBLK) {
                size_t nb = (size_t)(inner - i0 < QBLK ? inner - i0 : QBLK);
                const uint8_t *hp = hdr + 4 * (j * inner + i0);
                int fin = 1;
                for (size_t i = 0; i < nb; i++) {
                    uint16_t a = get16(hp + 4 * i), b = get16(hp + 4 * i + 2);
                    fin &= (a & 0x7c00u) != 0x7c00u && (b & 0x7c00u) != 0x7c00u;
                    mn[i] = ft_f16_to_f32_1(a);
                    st[i] = ft_f16_to_f32_1(b);
                }
                for (uint64_t d = 0; d < glen; d++) {
                    uint64_t e = e0 + d * inner + i0;
                    K->dec_vec(bits, out_dt, packed, e, nb, mn, st, fin, d8 + e * osz);
                }
            }
        }
        e0 += glen * inner;
        j++;
        if (++g == L->ngroups) { g = 0; o++; }
    }
    (void)o;
    return FT_OK;
}

/* ------------------------------------------------------ row quantization */

size_t ft_qrow_bytes(int bits, size_t n, uint32_t group)
{
    if ((bits != 4 && bits != 8) || group == 0 || n % group) return 0;
    return 4 * (n / group) + packed_bytes(bits, n);
}

ft_status ft_qrow_encode(int bits, const float *src, size_t n, uint32_t group, void *dst)
{
    if (!ft_qrow_bytes(bits, n, group) || !src || !dst)
        return ft_set_error(FT_ERR_INVALID_ARG, "qrow: %zu values in groups of %u at %d bits", n, group, bits);
    const ft_qkern *K = ft_qkern_best();
    const unsigned bmax = (1u << bits) - 1;
    size_t ng = n / group;
    uint8_t *hdr = dst, *packed = hdr + 4 * ng;
    if (bits == 4 && (n & 1)) packed[n / 2] = 0;   /* pad nibble */
    for (size_t j = 0; j < ng; j++) {
        const float *x = src + j * group;
        float mn = INFINITY, mx = -INFINITY;
        if (K->minmax(FT_F32, x, group, &mn, &mx)) return nonfinite_error(FT_F32, x, group, j * group);
        uint16_t h, s;
        if (ft_qparams(mn, mx, bmax, &h, &s)) return params_error(mn, mx, bmax, j * group);
        put16(hdr + 4 * j, h);
        put16(hdr + 4 * j + 2, s);
        float fs = h2f(s);
        K->enc_bcast(bits, FT_F32, x, group, h2f(h), fs > 0 ? 1.0f / fs : 0.0f, packed, j * group);
    }
    return FT_OK;
}

void ft_qrow_decode(int bits, const void *src, size_t n, uint32_t group, float *dst)
{
    size_t ng = n / group;
    const uint8_t *hdr = src;
    ft_qkern_best()->dec_groups(bits, FT_F32, hdr, hdr + 4 * ng, 0, ng, group, dst);
}
