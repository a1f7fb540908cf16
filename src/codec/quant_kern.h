/* Internal: group-quantization kernels (quant.c drives them, quant_x86.c
 * has the AVX-512 versions; ft_qkern_best is FT_API: the engine's weight
 * kernels, in the library above, call it - exported, not public API). Every SIMD kernel has a scalar twin in the
 * table returned by ft_qkern_ref(); tests compare them bit for bit.
 * quant_neon.c has the AArch64 (NEON) versions.
 *
 * Conventions shared by all kernels:
 *  - `bits` is 8 or 4. Packed values are addressed by value index `k`:
 *    q8 byte k; q4 nibble k = byte k/2, low nibble when k is even.
 *  - q4 encoders write nibbles k..k+n-1 only: a partial first byte (k odd)
 *    keeps its low nibble, a partial last byte keeps its high nibble, so
 *    runs may be written in any order.
 *  - Decoded value: y = (float)q * step + min in f32 (q*step is exact: q
 *    has at most 8 significant bits and step is an fp16 value, so fused and
 *    unfused evaluation agree), then rounded to the output dtype with
 *    ft_f32_to_bf16_1 or ft_f32_to_f16_1 semantics (RNE, NaN made quiet).
 *  - Quantized value: t = (x - min) * inv (inv = 1 over step, or 0 when step is
 *    0), clamped to [0, 2^bits - 1], rounded half to even.
 *  - `_bcast` kernels use one (min, step) for the run (inner == 1: a group
 *    is contiguous); `_vec` kernels use per-element parameter arrays (a row
 *    of a slab when inner > 1: element i belongs to group i). */
#ifndef FT_QUANT_KERN_H
#define FT_QUANT_KERN_H

#include "flextier/core.h"

typedef struct ft_qkern {
    const char *name;
    void (*dec_bcast)(int bits, ft_dtype odt, const uint8_t *packed, uint64_t k, size_t n,
                      float mn, float step, void *out);
    /* fin != 0 promises that every mn[i] and step[i] is finite (allows a
     * faster bf16 conversion); the result is the same either way. */
    void (*dec_vec)(int bits, ft_dtype odt, const uint8_t *packed, uint64_t k, size_t n,
                    const float *mn, const float *step, int fin, void *out);
    /* ngroups consecutive groups of g values each (inner == 1), group j
     * with fp16 (min, step) at hdr + 4j (little endian) and values
     * k + j*g ...; out receives ngroups*g values. */
    void (*dec_groups)(int bits, ft_dtype odt, const uint8_t *hdr, const uint8_t *packed,
                       uint64_t k, size_t ngroups, size_t g, void *out);
    /* min/max over n elements (reduction into *mn and *mx, which hold the
     * running values on entry). Returns nonzero if any element is NaN or
     * Inf (then *mn and *mx are unspecified). */
    int (*minmax)(ft_dtype idt, const void *src, size_t n, float *mn, float *mx);
    /* element-wise: mn[i] = min(mn[i], x[i]), mx[i] = max(mx[i], x[i]). */
    int (*minmax_vec)(ft_dtype idt, const void *src, size_t n, float *mn, float *mx);
    void (*enc_bcast)(int bits, ft_dtype idt, const void *src, size_t n, float mn, float inv,
                      uint8_t *packed, uint64_t k);
    void (*enc_vec)(int bits, ft_dtype idt, const void *src, size_t n, const float *mn,
                    const float *inv, uint8_t *packed, uint64_t k);
} ft_qkern;

/* Scalar reference kernels (always available). */
const ft_qkern *ft_qkern_ref(void);
/* AVX-512 kernels, or NULL when not compiled in or the CPU lacks
 * AVX-512F/BW/VL or F16C (or FLEXTIER_NO_SIMD=1). */
const ft_qkern *ft_qkern_avx512(void);
/* AVX2 + FMA + F16C kernels, or NULL. */
const ft_qkern *ft_qkern_avx2(void);
/* AArch64 Advanced SIMD kernels (quant_neon.c), or NULL. */
const ft_qkern *ft_qkern_neon(void);
/* Every table usable on this CPU: i = 0 is the scalar one; NULL past the
 * end (tests compare each against i = 0). */
const ft_qkern *ft_qkern_list(int i);
/* The table quant.c uses: the best available, or the one set with
 * ft_qkern_override. */
FT_API const ft_qkern *ft_qkern_best(void);
/* Tests only (not thread-safe: call while no encode/decode runs): make
 * quant.c use table k; NULL restores the default. */
void ft_qkern_override(const ft_qkern *k);

/* Scalar kernels, also used by the SIMD ones for heads and tails. */
void ft_qdec_bcast_ref(int bits, ft_dtype odt, const uint8_t *packed, uint64_t k, size_t n,
                       float mn, float step, void *out);
void ft_qdec_vec_ref(int bits, ft_dtype odt, const uint8_t *packed, uint64_t k, size_t n,
                     const float *mn, const float *step, int fin, void *out);
void ft_qdec_groups_ref(int bits, ft_dtype odt, const uint8_t *hdr, const uint8_t *packed,
                        uint64_t k, size_t ngroups, size_t g, void *out);
int ft_qminmax_ref(ft_dtype idt, const void *src, size_t n, float *mn, float *mx);
int ft_qminmax_vec_ref(ft_dtype idt, const void *src, size_t n, float *mn, float *mx);
void ft_qenc_bcast_ref(int bits, ft_dtype idt, const void *src, size_t n, float mn, float inv,
                       uint8_t *packed, uint64_t k);
void ft_qenc_vec_ref(int bits, ft_dtype idt, const void *src, size_t n, const float *mn,
                     const float *inv, uint8_t *packed, uint64_t k);

/* Per-group parameters (exposed for tests). Given the group's finite min
 * and max, computes min16 = fp16 rounded toward -inf of mn and step16 =
 * the smallest fp16 >= (mx - min16)/B with min16 + B*step16 >= mx (exact).
 * FT_ERR_UNSUPPORTED (no message) if |mn| > 65504 or step16 > 65504. */
ft_status ft_qparams(float mn, float mx, unsigned bmax, uint16_t *min16, uint16_t *step16);

#endif
