/* Internal: SIMD conversion kernels. Each converts a prefix of the input
 * and returns its length; callers finish with the _ref twin. */
#ifndef FT_CONVERT_SIMD_H
#define FT_CONVERT_SIMD_H
#include <stddef.h>
#include <stdint.h>
size_t ft_f32_to_f16_f16c(uint16_t *dst, const float *src, size_t n);
size_t ft_f16_to_f32_f16c(float *dst, const uint16_t *src, size_t n);
size_t ft_f32_to_bf16_avx512(uint16_t *dst, const float *src, size_t n);
size_t ft_f32_to_bf16_avx2(uint16_t *dst, const float *src, size_t n);
size_t ft_bf16_to_f32_avx2(float *dst, const uint16_t *src, size_t n);
#endif
