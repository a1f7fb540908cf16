/* Decode with the LM head streamed from the checkpoint file
 * (ft_load_params.stream_globals = FT_STREAM_LM_HEAD), read through the
 * page cache or past it (O_DIRECT): per-token time and tokens/s of
 * greedy-free decode steps (fixed tokens), the head re-read every step.
 * Public API only, so the same source builds against any version of the
 * library (before/after comparisons). Pages of the checkpoint are
 * dropped (POSIX_FADV_DONTNEED) before the run: the buffered reads start
 * cold; direct reads never use the page cache.
 *
 *   bench_head_stream MODEL_DIR DIRECT(0|1|r) [STEPS=16] [THREADS=0: all]
 *
 * (r: the head resident in memory, for its compute time.) One line:
 * direct (-1: resident), steps, median and mean ms per token, tok/s (steps
 * over their total time), MiB read from the file per token. */
#define _GNU_SOURCE
#include "flextier/engine.h"
#include "flextier/model.h"
#include "bench_util.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL_DIR DIRECT(0|1|r) [STEPS] [THREADS]\n", argv[0]);
        return 2;
    }
    const char *dir = argv[1];
    int direct = argv[2][0] == 'r' ? -1 : atoi(argv[2]), steps = argc > 3 ? atoi(argv[3]) : 16;
    unsigned threads = argc > 4 ? (unsigned)atoi(argv[4]) : 0;
    if (steps < 1 || steps > 4096) steps = 16;
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    int fd = open(path, O_RDONLY);
    if (fd >= 0) {
        (void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        close(fd);
    }
    ft_load_params lp;
    ft_load_params_default(&lp);
    lp.stream_globals = direct >= 0 ? FT_STREAM_LM_HEAD : 0;
    lp.stream_direct_io = direct >= 0 ? direct : 0;
    lp.stream_drop_cache = 1;
    ft_model *m = NULL;
    ft_status st = ft_model_load(dir, &lp, &m);
    if (st) {
        fprintf(stderr, "load: %s\n", ft_last_error());
        return 1;
    }
    const ft_model_config *cfg = ft_model_get_config(m);
    ft_ctx_params cp = {0};
    cp.max_batch = 1;
    cp.max_seq = steps + 8;
    cp.threads = threads;
    cp.kv_dtype = FT_F32;
    ft_ctx *c = NULL;
    float *logits = calloc((size_t)cfg->vocab, sizeof(float));
    double *t = calloc((size_t)steps, sizeof(double));
    if (!logits || !t || (st = ft_ctx_create(m, &cp, &c))) {
        fprintf(stderr, "ctx: %s\n", ft_last_error());
        return 1;
    }
    int slot = 0;
    int32_t prompt[4] = {1, 15, 27, 99};
    const int32_t *toks[1] = {prompt};
    size_t ntok[1] = {4};
    if ((st = ft_ctx_forward(c, 1, &slot, toks, ntok, logits, 0))) {
        fprintf(stderr, "prefill: %s\n", ft_last_error());
        return 1;
    }
    uint64_t b0 = ft_model_stream_bytes_read(m);
    double t0 = now_s();
    for (int s = 0; s < steps; s++) {
        int32_t tok = (int32_t)((s * 7919 + 3) % cfg->vocab);
        const int32_t *one[1] = {&tok};
        size_t n1[1] = {1};
        double a = now_s();
        if ((st = ft_ctx_forward(c, 1, &slot, one, n1, logits, 0))) {
            fprintf(stderr, "step %d: %s\n", s, ft_last_error());
            return 1;
        }
        t[s] = now_s() - a;
    }
    double total = now_s() - t0;
    uint64_t b1 = ft_model_stream_bytes_read(m);
    double mean = total / steps;
    qsort(t, (size_t)steps, sizeof *t, bench_cmpd);
    printf("direct %d steps %d median_ms %.2f mean_ms %.2f tok_s %.2f mib_per_tok %.1f\n", direct, steps,
           t[steps / 2] * 1e3, mean * 1e3, steps / total, (double)(b1 - b0) / steps / 1048576.0);
    ft_ctx_free(c);
    ft_model_free(m);
    free(logits);
    free(t);
    return 0;
}
