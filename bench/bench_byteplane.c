/* Timing harness for the byte-plane codec (bench/, run by hand):
 *   bench_byteplane [codec=bp-zstd] [dtype=bf16] [elements=16777216] [reps=5] [level=0]
 *                   [chunk_size=262144]
 * Synthetic weights (ft_synth_weights): rows of 4096 Gaussian values,
 * sigma 0.02 with a per-row scale 0.02*exp(0.25*N(0,1)), cast to dtype.
 * One thread. Prints the ratio and the median encode/decode speed in GB/s of raw tensor
 * bytes: wall-clock and process CPU time (the latter is robust to other
 * load on the machine). */
#include "flextier/codec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "bench_util.h"

int main(int argc, char **argv)
{
    const char *cname = argc > 1 ? argv[1] : "bp-zstd";
    const char *dname = argc > 2 ? argv[2] : "bf16";
    uint64_t n = argc > 3 ? strtoull(argv[3], NULL, 0) : (16u << 20);
    int reps = argc > 4 ? atoi(argv[4]) : 5;
    int level = argc > 5 ? atoi(argv[5]) : 0;
    ft_dtype dt = !strcmp(dname, "f32") ? FT_F32 : !strcmp(dname, "f16") ? FT_F16 : FT_BF16;
    ft_codec_params p;
    ft_codec_default_params(&p);
    if (ft_codec_parse(cname, &p.codec, &p.entropy)) { fprintf(stderr, "bad codec\n"); return 2; }
    p.level = level;
    if (argc > 6) p.chunk_size = (uint32_t)strtoul(argv[6], NULL, 0);
    if (reps < 1 || reps > 101) reps = 5;
    size_t es = ft_dtype_bits(dt) / 8, nb = n * es;
    ft_tensor t = {0};
    int64_t shape[2] = {(int64_t)(n / 4096), 4096};
    if (n % 4096) { shape[0] = (int64_t)n; }
    ft_tensor_init(&t, dt, n % 4096 ? 1 : 2, shape, ft_malloc_aligned(nb + 64, 64));
    if (!t.data || ft_synth_weights(dt, n, 4096, 42, t.data)) { fprintf(stderr, "synthetic data: %s\n", ft_last_error()); return 1; }
    ft_codec_ctx *ctx;
    ft_codec_ctx_create(1, &ctx);
    size_t bound = ft_encode_bound(&p, dt, t.ndim, t.shape), fs = 0;
    uint8_t *frame = ft_malloc_aligned(bound, 64);
    ft_tensor d = {0};
    d.dtype = dt;
    d.data = ft_malloc_aligned(nb + 64, 64);
    double te[101], td[101], ce[101], cd[101];
    for (int r = 0; r < reps; r++) {
        double c0 = bench_process_cpu(), t0 = ft_now();
        if (ft_encode(ctx, &p, &t, frame, bound, &fs)) { fprintf(stderr, "encode: %s\n", ft_last_error()); return 1; }
        double t1 = ft_now(), c1 = bench_process_cpu();
        if (ft_decode(ctx, frame, fs, &d, nb)) { fprintf(stderr, "decode: %s\n", ft_last_error()); return 1; }
        double t2 = ft_now(), c2 = bench_process_cpu();
        ce[r] = c1 - c0;
        cd[r] = c2 - c1;
        te[r] = t1 - t0;
        td[r] = t2 - t1;
    }
    if (memcmp(d.data, t.data, nb)) { fprintf(stderr, "MISMATCH\n"); return 1; }
    qsort(te, (size_t)reps, sizeof te[0], bench_cmpd);
    qsort(td, (size_t)reps, sizeof td[0], bench_cmpd);
    qsort(ce, (size_t)reps, sizeof ce[0], bench_cmpd);
    qsort(cd, (size_t)reps, sizeof cd[0], bench_cmpd);
    printf("%-10s %-4s lv %2d chunk %7u %5.1f MB size %6.2f%% ratio %.4fx | wall: enc %.3f dec %.3f GB/s"
           " | cpu-time: enc %.3f dec %.3f GB/s | medians of %d\n",
           cname, dname, level, p.chunk_size, nb / 1e6, 100.0 * fs / nb, (double)nb / fs,
           nb / te[reps / 2] / 1e9, nb / td[reps / 2] / 1e9, nb / ce[reps / 2] / 1e9,
           nb / cd[reps / 2] / 1e9, reps);
    ft_codec_ctx_free(ctx);
    ft_free_aligned(frame);
    ft_free_aligned(d.data);
    ft_free_aligned(t.data);
    return 0;
}
