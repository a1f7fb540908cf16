/* AArch64 Advanced SIMD (NEON) group-quantization kernels, the table a
 * BlueField DPU's Arm cores use (see quant_kern.h for the contract). Like
 * the x86 kernels, each one handles the aligned bulk 16 values at a time
 * and hands heads (an odd q4 start) and tails to its scalar twin, so the
 * results equal ft_qkern_ref() bit for bit:
 *  - decode: y = (float)q * step + min with FMLA (q * step is exact, so the
 *    fused and the unfused forms round the same); bf16 output by the same
 *    integer round-to-nearest-even as ft_f32_to_bf16_1; f16 output by
 *    FCVTN, which rounds to nearest even with FPCR at its Linux default
 *    (no flush to zero), like ft_f32_to_f16_1. Only parameters known to be
 *    finite take the vector path (the NaN/Inf cases only come from hostile
 *    frames and go to the scalar code).
 *  - encode: t = (x - min) * inv clamped with FMAXNM/FMINNM (a NaN becomes
 *    0, as in the scalar code), FCVTNU rounds half to even.
 *  - minmax: lane-wise FMIN/FMAX; those order -0 below +0 where the scalar
 *    code keeps the first of two equal values, so a run whose minimum or
 *    maximum is zero is recomputed by the scalar code (rare in weights). */
#include "quant_kern.h"

#if defined(__aarch64__)
#include <arm_neon.h>
#include <string.h>

#define AI __attribute__((always_inline)) static inline

/* ----------------------------------------------------------------- loads */

/* 16 bytes -> 16 values as 4 x f32. */
AI void q8_16(const uint8_t *p, float32x4_t v[4])
{
    uint8x16_t b = vld1q_u8(p);
    uint16x8_t lo = vmovl_u8(vget_low_u8(b)), hi = vmovl_u8(vget_high_u8(b));
    v[0] = vcvtq_f32_u32(vmovl_u16(vget_low_u16(lo)));
    v[1] = vcvtq_f32_u32(vmovl_u16(vget_high_u16(lo)));
    v[2] = vcvtq_f32_u32(vmovl_u16(vget_low_u16(hi)));
    v[3] = vcvtq_f32_u32(vmovl_u16(vget_high_u16(hi)));
}

/* 8 bytes of nibbles -> 16 values in element order (low nibble first). */
AI void q4_16(const uint8_t *p, float32x4_t v[4])
{
    uint8x8_t b = vld1_u8(p);
    uint8x8_t lo = vand_u8(b, vdup_n_u8(15)), hi = vshr_n_u8(b, 4);
    uint8x16_t q = vcombine_u8(vzip1_u8(lo, hi), vzip2_u8(lo, hi));
    uint16x8_t a = vmovl_u8(vget_low_u8(q)), c = vmovl_u8(vget_high_u8(q));
    v[0] = vcvtq_f32_u32(vmovl_u16(vget_low_u16(a)));
    v[1] = vcvtq_f32_u32(vmovl_u16(vget_high_u16(a)));
    v[2] = vcvtq_f32_u32(vmovl_u16(vget_low_u16(c)));
    v[3] = vcvtq_f32_u32(vmovl_u16(vget_high_u16(c)));
}

/* 4 input values as f32 (bf16: exact shift; f16: FCVTL, exact). */
AI float32x4_t ld4(ft_dtype dt, const void *p, size_t i)
{
    if (dt == FT_F32) return vld1q_f32((const float *)p + i);
    uint16x4_t h = vld1_u16((const uint16_t *)p + i);
    if (dt == FT_BF16) return vreinterpretq_f32_u32(vshll_n_u16(h, 16));
    return vcvt_f32_f16(vreinterpret_f16_u16(h));
}

/* ---------------------------------------------------------------- stores */

/* Finite y only: (u + 0x7fff + lsb) >> 16. */
AI uint16x4_t to_bf16(float32x4_t y)
{
    uint32x4_t u = vreinterpretq_u32_f32(y);
    uint32x4_t lsb = vandq_u32(vshrq_n_u32(u, 16), vdupq_n_u32(1));
    return vshrn_n_u32(vaddq_u32(u, vaddq_u32(vdupq_n_u32(0x7fff), lsb)), 16);
}

AI void st4(ft_dtype dt, void *out, size_t i, float32x4_t y)
{
    if (dt == FT_F32) vst1q_f32((float *)out + i, y);
    else if (dt == FT_BF16) vst1_u16((uint16_t *)out + i, to_bf16(y));
    else vst1_u16((uint16_t *)out + i, vreinterpret_u16_f16(vcvt_f16_f32(y)));
}

static inline size_t osize(ft_dtype dt) { return dt == FT_F32 ? 4 : 2; }

/* ---------------------------------------------------------------- decode */

/* vec = 0: one (mn0, st0); vec = 1: per-element arrays. Parameters
 * finite (checked by the callers). */
AI void dec_impl(int bits, ft_dtype odt, int vec, const uint8_t *p, uint64_t k, size_t n,
                 float mn0, float st0, const float *mn, const float *st, void *out)
{
    size_t i = 0;
    if (bits == 4 && (k & 1) && n) {
        if (vec) ft_qdec_vec_ref(4, odt, p, k, 1, mn, st, 1, out);
        else ft_qdec_bcast_ref(4, odt, p, k, 1, mn0, st0, out);
        i = 1;
    }
    const float32x4_t bm = vdupq_n_f32(mn0), bs = vdupq_n_f32(st0);
    for (; i + 16 <= n; i += 16) {
        float32x4_t q[4];
        if (bits == 4) q4_16(p + ((k + i) >> 1), q);
        else q8_16(p + k + i, q);
        for (int j = 0; j < 4; j++) {
            float32x4_t m = vec ? vld1q_f32(mn + i + 4 * j) : bm;
            float32x4_t s = vec ? vld1q_f32(st + i + 4 * j) : bs;
            st4(odt, out, i + 4 * j, vfmaq_f32(m, q[j], s));
        }
    }
    if (i < n) {
        void *o = (uint8_t *)out + i * osize(odt);
        if (vec) ft_qdec_vec_ref(bits, odt, p, k + i, n - i, mn + i, st + i, 1, o);
        else ft_qdec_bcast_ref(bits, odt, p, k + i, n - i, mn0, st0, o);
    }
}

#define DEC_CASES(F, ...)                                                    \
    switch ((bits == 4 ? 3 : 0) + (odt == FT_F32 ? 0 : odt == FT_BF16 ? 1 : 2)) { \
    case 0: F(8, FT_F32, __VA_ARGS__); break;                                \
    case 1: F(8, FT_BF16, __VA_ARGS__); break;                               \
    case 2: F(8, FT_F16, __VA_ARGS__); break;                                \
    case 3: F(4, FT_F32, __VA_ARGS__); break;                                \
    case 4: F(4, FT_BF16, __VA_ARGS__); break;                               \
    default: F(4, FT_F16, __VA_ARGS__); break;                               \
    }

static inline int finite2(float a, float b)
{
    uint32_t u, v;
    memcpy(&u, &a, 4);
    memcpy(&v, &b, 4);
    return (u & 0x7f800000u) != 0x7f800000u && (v & 0x7f800000u) != 0x7f800000u;
}

static void dec_bcast_neon(int bits, ft_dtype odt, const uint8_t *p, uint64_t k, size_t n,
                           float mn, float step, void *out)
{
    if (!finite2(mn, step)) {
        ft_qdec_bcast_ref(bits, odt, p, k, n, mn, step, out);
        return;
    }
#define F_(B, D, ...) dec_impl(B, D, 0, __VA_ARGS__)
    DEC_CASES(F_, p, k, n, mn, step, NULL, NULL, out)
#undef F_
}

static void dec_vec_neon(int bits, ft_dtype odt, const uint8_t *p, uint64_t k, size_t n,
                         const float *mn, const float *step, int fin, void *out)
{
    if (!fin) {
        ft_qdec_vec_ref(bits, odt, p, k, n, mn, step, fin, out);
        return;
    }
#define F_(B, D, ...) dec_impl(B, D, 1, __VA_ARGS__)
    DEC_CASES(F_, p, k, n, 0.0f, 0.0f, mn, step, out)
#undef F_
}

/* Runs of whole groups: parameters converted per group, the bulk loop
 * inlined with them. */
AI void groups_impl(int bits, ft_dtype odt, const uint8_t *hdr, const uint8_t *p, uint64_t k,
                    size_t ng, size_t g, void *out)
{
    const size_t os = osize(odt);
    for (size_t j = 0; j < ng; j++) {
        uint16_t h[2];
        memcpy(h, hdr + 4 * j, 4);   /* little endian: min, step */
        uint8_t *o = (uint8_t *)out + j * g * os;
        if ((h[0] & 0x7c00u) == 0x7c00u || (h[1] & 0x7c00u) == 0x7c00u) {
            ft_qdec_groups_ref(bits, odt, hdr + 4 * j, p, k + j * g, 1, g, o);
            continue;
        }
        float32x4_t ms = vcvt_f32_f16(vreinterpret_f16_u16(vld1_dup_u16(h)));
        float32x4_t ss = vcvt_f32_f16(vreinterpret_f16_u16(vld1_dup_u16(h + 1)));
        dec_impl(bits, odt, 0, p, k + j * g, g, vgetq_lane_f32(ms, 0), vgetq_lane_f32(ss, 0),
                 NULL, NULL, o);
    }
}

static void dec_groups_neon(int bits, ft_dtype odt, const uint8_t *hdr, const uint8_t *p,
                            uint64_t k, size_t ng, size_t g, void *out)
{
    DEC_CASES(groups_impl, hdr, p, k, ng, g, out)
}

/* ---------------------------------------------------------------- minmax */

AI uint32x4_t nonfinite(float32x4_t x)
{
    const uint32x4_t e = vdupq_n_u32(0x7f800000u);
    return vceqq_u32(vandq_u32(vreinterpretq_u32_f32(x), e), e);
}

AI int minmax_impl(ft_dtype dt, const void *src, size_t n, float *mn, float *mx)
{
    float32x4_t a = vdupq_n_f32(*mn), b = vdupq_n_f32(*mx), a2 = a, b2 = b;
    uint32x4_t bad = vdupq_n_u32(0);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        float32x4_t x = ld4(dt, src, i), y = ld4(dt, src, i + 4);
        bad = vorrq_u32(bad, vorrq_u32(nonfinite(x), nonfinite(y)));
        a = vminq_f32(a, x); b = vmaxq_f32(b, x);
        a2 = vminq_f32(a2, y); b2 = vmaxq_f32(b2, y);
    }
    if (vmaxvq_u32(bad)) return 1;
    float lo = vminvq_f32(vminq_f32(a, a2)), hi = vmaxvq_f32(vmaxq_f32(b, b2));
    if (ft_qminmax_ref(dt, (const uint8_t *)src + i * (dt == FT_F32 ? 4 : 2), n - i, &lo, &hi))
        return 1;
    if (lo == 0.0f || hi == 0.0f) {   /* the sign of a zero: as the scalar code picks it */
        float l2 = *mn, h2 = *mx;
        if (ft_qminmax_ref(dt, src, n, &l2, &h2)) return 1;
        lo = l2;
        hi = h2;
    }
    *mn = lo;
    *mx = hi;
    return 0;
}

static int minmax_neon(ft_dtype dt, const void *src, size_t n, float *mn, float *mx)
{
    if (dt == FT_F32) return minmax_impl(FT_F32, src, n, mn, mx);
    if (dt == FT_BF16) return minmax_impl(FT_BF16, src, n, mn, mx);
    return minmax_impl(FT_F16, src, n, mn, mx);
}

/* Element-wise, with the scalar code's exact choice: x replaces the
 * running value only when strictly smaller (larger). */
AI int minmax_vec_impl(ft_dtype dt, const void *src, size_t n, float *mn, float *mx)
{
    uint32x4_t bad = vdupq_n_u32(0);
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        float32x4_t x = ld4(dt, src, i);
        bad = vorrq_u32(bad, nonfinite(x));
        float32x4_t a = vld1q_f32(mn + i), b = vld1q_f32(mx + i);
        vst1q_f32(mn + i, vbslq_f32(vcltq_f32(x, a), x, a));
        vst1q_f32(mx + i, vbslq_f32(vcgtq_f32(x, b), x, b));
    }
    if (vmaxvq_u32(bad)) return 1;
    return ft_qminmax_vec_ref(dt, (const uint8_t *)src + i * (dt == FT_F32 ? 4 : 2), n - i,
                              mn + i, mx + i);
}

static int minmax_vec_neon(ft_dtype dt, const void *src, size_t n, float *mn, float *mx)
{
    if (dt == FT_F32) return minmax_vec_impl(FT_F32, src, n, mn, mx);
    if (dt == FT_BF16) return minmax_vec_impl(FT_BF16, src, n, mn, mx);
    return minmax_vec_impl(FT_F16, src, n, mn, mx);
}

/* ---------------------------------------------------------------- encode */

AI uint32x4_t quant4(float32x4_t x, float32x4_t mn, float32x4_t inv, float32x4_t bmax)
{
    float32x4_t t = vmulq_f32(vsubq_f32(x, mn), inv);
    t = vminnmq_f32(vmaxnmq_f32(t, vdupq_n_f32(0.0f)), bmax);
    return vcvtnq_u32_f32(t);
}

/* 16 codes (u32, 0..255) -> 16 bytes. */
AI uint8x16_t narrow16(const uint32x4_t q[4])
{
    uint16x8_t lo = vcombine_u16(vmovn_u32(q[0]), vmovn_u32(q[1]));
    uint16x8_t hi = vcombine_u16(vmovn_u32(q[2]), vmovn_u32(q[3]));
    return vcombine_u8(vmovn_u16(lo), vmovn_u16(hi));
}

AI void enc_impl(int bits, ft_dtype idt, int vec, const void *src, size_t n, float mn0,
                 float inv0, const float *mn, const float *inv, uint8_t *p, uint64_t k)
{
    size_t i = 0;
    if (bits == 4 && (k & 1) && n) {
        if (vec) ft_qenc_vec_ref(4, idt, src, 1, mn, inv, p, k);
        else ft_qenc_bcast_ref(4, idt, src, 1, mn0, inv0, p, k);
        i = 1;
    }
    const float32x4_t bm = vdupq_n_f32(mn0), bi = vdupq_n_f32(inv0);
    const float32x4_t bmax = vdupq_n_f32((float)((1u << bits) - 1));
    for (; i + 16 <= n; i += 16) {
        uint32x4_t q[4];
        for (int j = 0; j < 4; j++) {
            float32x4_t m = vec ? vld1q_f32(mn + i + 4 * j) : bm;
            float32x4_t v = vec ? vld1q_f32(inv + i + 4 * j) : bi;
            q[j] = quant4(ld4(idt, src, i + 4 * j), m, v, bmax);
        }
        uint8x16_t b = narrow16(q);
        if (bits == 8) {
            vst1q_u8(p + k + i, b);
        } else {
            /* byte pairs (even, odd) -> even | odd << 4 */
            uint16x8_t w = vreinterpretq_u16_u8(b);
            vst1_u8(p + ((k + i) >> 1), vmovn_u16(vorrq_u16(w, vshrq_n_u16(w, 4))));
        }
    }
    if (i < n) {
        const void *s = (const uint8_t *)src + i * (idt == FT_F32 ? 4 : 2);
        if (vec) ft_qenc_vec_ref(bits, idt, s, n - i, mn + i, inv + i, p, k + i);
        else ft_qenc_bcast_ref(bits, idt, s, n - i, mn0, inv0, p, k + i);
    }
}

#define ENC_CASES(VEC, ...)                                                     \
    switch ((bits == 4 ? 3 : 0) + (idt == FT_F32 ? 0 : idt == FT_BF16 ? 1 : 2)) { \
    case 0: enc_impl(8, FT_F32, VEC, __VA_ARGS__); break;                        \
    case 1: enc_impl(8, FT_BF16, VEC, __VA_ARGS__); break;                       \
    case 2: enc_impl(8, FT_F16, VEC, __VA_ARGS__); break;                        \
    case 3: enc_impl(4, FT_F32, VEC, __VA_ARGS__); break;                        \
    case 4: enc_impl(4, FT_BF16, VEC, __VA_ARGS__); break;                       \
    default: enc_impl(4, FT_F16, VEC, __VA_ARGS__); break;                       \
    }

static void enc_bcast_neon(int bits, ft_dtype idt, const void *src, size_t n, float mn,
                           float inv, uint8_t *p, uint64_t k)
{
    ENC_CASES(0, src, n, mn, inv, NULL, NULL, p, k)
}

static void enc_vec_neon(int bits, ft_dtype idt, const void *src, size_t n, const float *mn,
                         const float *inv, uint8_t *p, uint64_t k)
{
    ENC_CASES(1, src, n, 0.0f, 0.0f, mn, inv, p, k)
}

static const ft_qkern qkern_neon = {"neon", dec_bcast_neon, dec_vec_neon, dec_groups_neon,
                                    minmax_neon, minmax_vec_neon, enc_bcast_neon, enc_vec_neon};

const ft_qkern *ft_qkern_neon(void) { return ft_cpu()->neon ? &qkern_neon : NULL; }

const ft_qkern *ft_qkern_avx512(void) { return NULL; }
const ft_qkern *ft_qkern_avx2(void) { return NULL; }

const ft_qkern *ft_qkern_list(int i)
{
    if (i == 0) return ft_qkern_ref();
    if (i == 1) return ft_qkern_neon();
    return NULL;
}
#endif
