/* bench_quant: single-thread q8/q4 quantize / dequantize throughput on a
 * bf16 tensor of synthetic weights (ft_synth_weights) through the public
 * API (ft_encode / ft_decode, including the payload hashes), median of R
 * runs.
 *
 *   build/bench/bench_quant [ROWS COLS [RUNS]]     (default 4096 4096 7)
 *
 * Quantize GB/s counts bf16 input bytes; dequantize GB/s counts output
 * bytes (bf16 or f32). Small tensors are encoded/decoded repeatedly per
 * timed run (about 16M elements per run), which measures the in-cache
 * speed, e.g. `bench_quant 64 2048`. FLEXTIER_NO_SIMD=1 measures the
 * scalar kernels. */
#include "flextier/codec.h"

#include <stdio.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>

/* This thread's CPU time: with a 1-thread context all the work runs on the
 * calling thread, and CPU time is not inflated when other processes
 * share the cores (wall time is; FT_BENCH_WALL=1 uses it instead). */
static double now(void)
{
    static int wall = -1;
    if (wall < 0) wall = getenv("FT_BENCH_WALL") && *getenv("FT_BENCH_WALL") == '1';
    if (wall) return ft_now();
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return v[n / 2];
}

int main(int argc, char **argv)
{
    int64_t shape[2] = {4096, 4096};
    int runs = 7;
    if (argc > 2) { shape[0] = atoll(argv[1]); shape[1] = atoll(argv[2]); }
    if (argc > 3) runs = atoi(argv[3]);
    if (shape[0] <= 0 || shape[1] <= 0 || runs < 1 || runs > 101) {
        fprintf(stderr, "usage: bench_quant [ROWS COLS [RUNS]]\n");
        return 2;
    }
    size_t n = (size_t)(shape[0] * shape[1]);
    int inner = n >= (1u << 24) ? 1 : (int)((1u << 24) / n);   /* repetitions per timed run */
    uint16_t *src = ft_malloc_aligned(n * 2, 64);
    float *out = ft_malloc_aligned(n * 4, 64);
    if (!src || !out) return 1;
    if (ft_synth_weights(FT_BF16, n, (uint64_t)shape[1], 12345, src)) return 1;
    ft_codec_ctx *ctx;
    if (ft_codec_ctx_create(1, &ctx)) return 1;
    ft_tensor t;
    ft_tensor_init(&t, FT_BF16, 2, shape, src);
    printf("bench_quant %lldx%lld bf16, 1 thread, median of %d runs (x%d each), SIMD %s, %s time\n",
           (long long)shape[0], (long long)shape[1], runs, inner, ft_simd_enabled() ? "on" : "off",
           getenv("FT_BENCH_WALL") && *getenv("FT_BENCH_WALL") == '1' ? "wall" : "thread CPU");
    printf("%-4s %-9s %8s %12s %14s %14s\n", "codec", "group_dim", "ratio", "quant GB/s",
           "deq->bf16 GB/s", "deq->f32 GB/s");
    for (int c = 0; c < 2; c++)
        for (int gd = 0; gd < 2; gd++) {
            ft_codec_params p;
            ft_codec_default_params(&p);
            p.codec = c ? FT_CODEC_Q8 : FT_CODEC_Q4;
            p.group_dim = gd ? 0 : -1;
            size_t bound = ft_encode_bound(&p, FT_BF16, 2, shape), fs = 0;
            uint8_t *frame = ft_malloc_aligned(bound, 64);
            double te[101], tb[101], tf[101];
            for (int r = 0; r < runs; r++) {
                double t0 = now();
                ft_status st = FT_OK;
                for (int m = 0; m < inner && !st; m++) st = ft_encode(ctx, &p, &t, frame, bound, &fs);
                te[r] = (now() - t0) / inner;
                if (st) { fprintf(stderr, "encode: %s\n", ft_last_error()); return 1; }
            }
            for (int o = 0; o < 2; o++)
                for (int r = 0; r < runs; r++) {
                    ft_tensor d = {0};
                    d.dtype = o ? FT_F32 : FT_BF16;
                    d.data = out;
                    double t0 = now();
                    ft_status st = FT_OK;
                    for (int m = 0; m < inner && !st; m++) st = ft_decode(ctx, frame, fs, &d, n * 4);
                    (o ? tf : tb)[r] = (now() - t0) / inner;
                    if (st) { fprintf(stderr, "decode: %s\n", ft_last_error()); return 1; }
                }
            printf("%-5s %-9s %7.3fx %12.2f %14.2f %14.2f\n", ft_codec_name(p.codec),
                   gd ? "0" : "last", (double)(n * 2) / (double)fs, n * 2 / median(te, runs) / 1e9,
                   n * 2 / median(tb, runs) / 1e9, n * 4 / median(tf, runs) / 1e9);
            ft_free_aligned(frame);
        }
    ft_codec_ctx_free(ctx);
    ft_free_aligned(src);
    ft_free_aligned(out);
    return 0;
}
