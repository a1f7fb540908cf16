/* Test support: synthetic tensors. Weight-like data comes from the
 * library's one generator (ft_synth_weights, flextier/core.h); the rest
 * are the edge-case mixes the codec tests need. Every buffer is new,
 * 64-byte aligned, with 64 bytes of slack (free with ft_free_aligned);
 * NULL when allocation fails. Deterministic in seed. */
#ifndef FT_SUPPORT_SYNTH_H
#define FT_SUPPORT_SYNTH_H
#include "flextier/core.h"

/* n LLM-like weights (ft_synth_weights, rows of `row`) as dt. Float dtypes
 * hold the values; i32, i8 and u8 hold them scaled (i32: x 1e6, 8-bit:
 * x 1000, truncated), compressible like weights; NULL for other dtypes. */
void *ft_test_weights(ft_dtype dt, uint64_t n, uint64_t row, uint64_t seed);

/* n values of a float dtype with a spread of magnitudes, for quantization:
 * runs of 97 with a per-run scale 2^-10..2^5, occasional 50x outliers,
 * exact zeros and negative zeros, constant and offset runs. */
void *ft_test_mixed(ft_dtype dt, uint64_t n, uint64_t seed);

/* Store one f32 value as dt (f32, bf16 or f16) at index i / load it. */
void  ft_test_store_f(ft_dtype dt, void *p, size_t i, float v);
float ft_test_load_f(ft_dtype dt, const void *p, size_t i);
#endif
