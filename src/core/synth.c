/* Synthetic LLM-like weights for benchmarks: Gaussian, sigma 0.02 scaled
 * per row by exp(0.25 * N(0,1)) (the distribution the codec targets are
 * stated on; see shared/notes/compression.md). Deterministic in seed. */
#include "flextier/core.h"

#include <math.h>

ft_status ft_synth_weights(ft_dtype dt, uint64_t n, uint64_t row, uint64_t seed, void *out)
{
    if (!ft_dtype_is_float(dt) || !row) return FT_ERR_INVALID_ARG;
    uint64_t s = seed;
    float buf[1024];
    float sigma = 0.02f;
    for (uint64_t i = 0; i < n; i += 1024) {
        size_t m = n - i < 1024 ? (size_t)(n - i) : 1024;
        for (size_t k = 0; k < m; k++) {
            if ((i + k) % row == 0) sigma = (float)(0.02 * exp(0.25 * ft_rand_gauss(&s)));
            buf[k] = (float)ft_rand_gauss(&s) * sigma;
        }
        ft_convert((uint8_t *)out + ft_dtype_nbytes(dt, i), dt, buf, FT_F32, m);
    }
    return FT_OK;
}
