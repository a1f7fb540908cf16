/* Byte-plane split/merge kernels of the byte-plane codec (byteplane.c),
 * exposed for tests. The plane layouts are specified in
 * docs/codec-byteplane.md:
 *   bf16 (2 planes): p0 = exponent (bits 14..7), p1 = sign<<7 | mantissa
 *   f16  (2 planes): p0 = high byte (sign|exp5|mant2), p1 = low byte
 *   f32  (4 planes): p0 = exponent (bits 30..23), p1 = sign<<7 | mant[22:16],
 *                    p2 = mant[15:8], p3 = mant[7:0]
 * planes[k] points at n bytes (k < ft_bp_nplanes(dt)); the src/dst element
 * buffers need no alignment. FT_API: also called by the CUDA backend in
 * the library above (exported, not public API). */
#ifndef FT_CODEC_BYTEPLANE_H
#define FT_CODEC_BYTEPLANE_H

#include "flextier/core.h"

#define FT_BP_MAX_PLANES 4

/* Planes per element for a float dtype; 0 for any other dtype. */
FT_API unsigned ft_bp_nplanes(ft_dtype dt);

/* Dispatching versions (SIMD when available and enabled). */
FT_API void ft_bp_split(ft_dtype dt, const void *src, size_t n, uint8_t *const *planes);
void ft_bp_merge(ft_dtype dt, const uint8_t *const *planes, size_t n, void *dst);

/* Scalar references. */
void ft_bp_split_ref(ft_dtype dt, const void *src, size_t n, uint8_t *const *planes);
void ft_bp_merge_ref(ft_dtype dt, const uint8_t *const *planes, size_t n, void *dst);

/* SIMD bodies: process a prefix of the elements and return how many were
 * done (the caller finishes the tail with the _ref version); 0 when the
 * CPU lacks the instructions. */
size_t ft_bp_split_avx512(ft_dtype dt, const void *src, size_t n, uint8_t *const *planes);
size_t ft_bp_merge_avx512(ft_dtype dt, const uint8_t *const *planes, size_t n, void *dst);
size_t ft_bp_split_avx2(ft_dtype dt, const void *src, size_t n, uint8_t *const *planes);
size_t ft_bp_merge_avx2(ft_dtype dt, const uint8_t *const *planes, size_t n, void *dst);
/* AArch64 Advanced SIMD (0 elsewhere). */
size_t ft_bp_split_neon(ft_dtype dt, const void *src, size_t n, uint8_t *const *planes);
size_t ft_bp_merge_neon(ft_dtype dt, const uint8_t *const *planes, size_t n, void *dst);

#endif
