/* bench_wkernels: products on stored weights (src/engine/wkernels.h) per
 * format, shape, row count and thread count, beside the DRAM roofline.
 *
 *   build/bench/bench_wkernels [-t THREADS,..] [-r ROWS,..] [-f FMT,..]
 *                              [-s OUTxIN,..] [-n RUNS] [-m MiB] [-x 1]
 *
 * Defaults: threads 1,2; rows 1,4,8,12,16,32,512; formats
 * f32,bf16,f16,q8,q4 (q8/q4 group 64); shapes 2048x2048, 5632x2048,
 * 2048x5632; 7 runs (median); weights cycled through a working set of
 * -m MiB (default 1024) of copies of the matrix, so that every product
 * reads its weights from DRAM as a model's layers do (this VM reports a
 * 260 MiB L3). -x 1 also times every configuration in the other form
 * (x transposed, FT_WK_X_T, where the default is not, and the reverse)
 * in alternation with the default, to choose where the engine switches. The roofline is a streaming read (AVX-512 or AVX2 loads)
 * of the same working set with the same threads.
 *
 * Prints per configuration: wall time per product (median), weight GB/s
 * (stored bytes / time), GFLOP/s (2 rows out in / time), and the GB/s as
 * a fraction of the roofline. Each product includes its ft_wk_prep (the
 * activation preparation the engine does once per product).
 *
 * Time: with 1 thread, the thread's CPU time (other processes sharing the
 * cores do not inflate it; they still share the memory bandwidth), with
 * more threads wall time (noisy on a shared machine: medians of -n runs);
 * FT_BENCH_WALL=1 uses wall time throughout. */
#include "engine/wkernels.h"
#include "flextier/core.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <time.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

static double now(int threads)
{
    static int wall = -1;
    if (wall < 0) wall = getenv("FT_BENCH_WALL") && *getenv("FT_BENCH_WALL") == '1';
    if (wall || threads > 1) return ft_now();
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

/* ------------------------------------------------------------ roofline */

typedef struct { const uint8_t *p; size_t n; unsigned parts; volatile uint64_t sink[64]; } rd_job;

#if defined(__x86_64__)
__attribute__((target("avx512f"))) static uint64_t read512(const uint8_t *p, size_t n)
{
    __m512i a = _mm512_setzero_si512(), b = a, c = a, d = a;
    for (size_t i = 0; i + 256 <= n; i += 256) {
        a = _mm512_add_epi64(a, _mm512_load_si512(p + i));
        b = _mm512_add_epi64(b, _mm512_load_si512(p + i + 64));
        c = _mm512_add_epi64(c, _mm512_load_si512(p + i + 128));
        d = _mm512_add_epi64(d, _mm512_load_si512(p + i + 192));
    }
    return (uint64_t)_mm512_reduce_add_epi64(_mm512_add_epi64(_mm512_add_epi64(a, b), _mm512_add_epi64(c, d)));
}
__attribute__((target("avx2"))) static uint64_t read256(const uint8_t *p, size_t n)
{
    __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
    for (size_t i = 0; i + 128 <= n; i += 128) {
        a = _mm256_add_epi64(a, _mm256_load_si256((const __m256i *)(p + i)));
        b = _mm256_add_epi64(b, _mm256_load_si256((const __m256i *)(p + i + 32)));
        c = _mm256_add_epi64(c, _mm256_load_si256((const __m256i *)(p + i + 64)));
        d = _mm256_add_epi64(d, _mm256_load_si256((const __m256i *)(p + i + 96)));
    }
    __m256i s = _mm256_add_epi64(_mm256_add_epi64(a, b), _mm256_add_epi64(c, d));
    return (uint64_t)_mm256_extract_epi64(s, 0) + (uint64_t)_mm256_extract_epi64(s, 3);
}
#endif

static uint64_t read_plain(const uint8_t *p, size_t n)
{
#if defined(__x86_64__)
    if (ft_cpu()->avx512f) return read512(p, n);
    if (ft_cpu()->avx2) return read256(p, n);
#endif
    uint64_t s = 0;
    for (size_t i = 0; i + 8 <= n; i += 64) { uint64_t v; memcpy(&v, p + i, 8); s += v; }
    return s;
}

static void rd_task(void *arg, size_t i, unsigned w)
{
    rd_job *j = arg;
    size_t part = j->n / j->parts / 256 * 256;
    j->sink[w] += read_plain(j->p + i * part, part);
}

static double roofline(ft_pool *pool, unsigned threads, size_t bytes, int runs)
{
    uint8_t *buf = ft_malloc_aligned(bytes, 64);
    if (!buf) return 0;
    memset(buf, 1, bytes);
    rd_job j = {buf, bytes, threads, {0}};
    double t[64];
    for (int k = 0; k < runs; k++) {
        double t0 = now((int)threads);
        ft_pool_run(threads > 1 ? pool : NULL, threads, rd_task, &j);
        t[k] = now((int)threads) - t0;
    }
    ft_free_aligned(buf);
    return (double)(bytes / threads / 256 * 256 * threads) / median(t, runs) / 1e9;
}

/* ------------------------------------------------------------ matrices */

typedef struct {
    ft_wmat *W;          /* ncopies views */
    int ncopies;
    uint8_t **bufs;
    const uint8_t **chunk_ptrs;
    size_t bytes;        /* stored bytes of one copy */
} wset;

static uint64_t seed = 99;
static float frand(void) { return (float)(ft_rand_u64(&seed) >> 40) / (float)(1 << 24) * 2.0f - 1.0f; }

static int wset_make(wset *s, ft_wfmt fmt, int out, int in, size_t mib)
{
    memset(s, 0, sizeof *s);
    size_t n = (size_t)out * in;
    int G = 64;
    size_t bytes;
    switch (fmt) {
    case FT_WF_F32: bytes = n * 4; break;
    case FT_WF_BF16: case FT_WF_F16: bytes = n * 2; break;
    case FT_WF_Q8: bytes = 4 * n / G + n; break;
    default: bytes = 4 * n / G + n / 2; break;
    }
    s->bytes = bytes;
    s->ncopies = (int)((mib << 20) / bytes);
    if (s->ncopies < 1) s->ncopies = 1;
    s->W = calloc((size_t)s->ncopies, sizeof *s->W);
    s->bufs = calloc((size_t)s->ncopies, sizeof *s->bufs);
    s->chunk_ptrs = calloc((size_t)s->ncopies, sizeof *s->chunk_ptrs);
    if (!s->W || !s->bufs || !s->chunk_ptrs) return -1;
    /* one random copy, replicated */
    uint8_t *proto = ft_malloc_aligned(bytes, 64);
    if (!proto) return -1;
    if (fmt == FT_WF_F32) for (size_t i = 0; i < n; i++) ((float *)proto)[i] = frand() * 0.05f;
    else if (fmt == FT_WF_BF16) for (size_t i = 0; i < n; i++) ((uint16_t *)proto)[i] = ft_f32_to_bf16_1(frand() * 0.05f);
    else if (fmt == FT_WF_F16) for (size_t i = 0; i < n; i++) ((uint16_t *)proto)[i] = ft_f32_to_f16_1(frand() * 0.05f);
    else {
        size_t np = n / G;
        for (size_t g = 0; g < np; g++) {
            uint16_t m = ft_f32_to_f16_1(-0.05f), st = ft_f32_to_f16_1(fmt == FT_WF_Q8 ? 0.1f / 255 : 0.1f / 15);
            memcpy(proto + 4 * g, &m, 2);
            memcpy(proto + 4 * g + 2, &st, 2);
        }
        for (size_t i = 4 * np; i < bytes; i++) proto[i] = (uint8_t)(ft_rand_u64(&seed) >> 56);
    }
    for (int c = 0; c < s->ncopies; c++) {
        s->bufs[c] = c ? ft_malloc_aligned(bytes, 64) : proto;
        if (!s->bufs[c]) return -1;
        if (c) memcpy(s->bufs[c], proto, bytes);
        s->chunk_ptrs[c] = s->bufs[c];
        ft_wmat *W = &s->W[c];
        W->fmt = fmt;
        W->rows = out;
        W->cols = in;
        if (fmt == FT_WF_Q8 || fmt == FT_WF_Q4) {
            W->group = G;
            W->rows_per_chunk = out;     /* one chunk of whole rows */
            W->chunk = &s->chunk_ptrs[c];
        } else {
            W->data = s->bufs[c];
        }
    }
    return 0;
}

static void wset_free(wset *s)
{
    for (int c = 0; c < s->ncopies; c++) ft_free_aligned(s->bufs[c]);
    free(s->W);
    free(s->bufs);
    free(s->chunk_ptrs);
}

/* ------------------------------------------------------------- product */

typedef struct { float *y; const ft_wk_act *a; const ft_wmat *W; int chunk; } pjob;

static void p_task(void *arg, size_t i, unsigned w)
{
    (void)w;
    pjob *j = arg;
    int o0 = (int)i * j->chunk, o1 = o0 + j->chunk;
    if (o1 > j->W->rows) o1 = j->W->rows;
    ft_wk_product(j->y, j->W->rows, j->a, j->W, o0, o1, NULL);
}

static int parse_list(const char *s, int *v, int max)
{
    int n = 0;
    while (*s && n < max) {
        v[n++] = atoi(s);
        const char *c = strchr(s, ',');
        if (!c) break;
        s = c + 1;
    }
    return n;
}

int main(int argc, char **argv)
{
    int threads[8] = {1, 2}, nth = 2;
    int rowsv[16] = {1, 4, 8, 12, 16, 32, 512}, nrows = 7;
    ft_wfmt fmts[8] = {FT_WF_F32, FT_WF_BF16, FT_WF_F16, FT_WF_Q8, FT_WF_Q4};
    int nf = 5;
    int shapes[8][2] = {{2048, 2048}, {5632, 2048}, {2048, 5632}}, ns = 3;
    int runs = 7;
    size_t mib = 1024;
    int xt_ab = 0;
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : "";
        if (!strcmp(argv[i], "-t")) { nth = parse_list(v, threads, 8); i++; }
        else if (!strcmp(argv[i], "-r")) { nrows = parse_list(v, rowsv, 16); i++; }
        else if (!strcmp(argv[i], "-n")) { runs = atoi(v); i++; }
        else if (!strcmp(argv[i], "-m")) { mib = (size_t)atoll(v); i++; }
        else if (!strcmp(argv[i], "-x")) { xt_ab = atoi(v); i++; }
        else if (!strcmp(argv[i], "-f")) {
            nf = 0;
            for (const char *s = v; *s && nf < 8;) {
                static const char *names[] = {"f32", "bf16", "f16", "q8", "q4"};
                int k;
                for (k = 0; k < 5; k++)
                    if (!strncmp(s, names[k], strlen(names[k])) && (s[strlen(names[k])] == ',' || !s[strlen(names[k])])) break;
                if (k == 5) { fprintf(stderr, "bench_wkernels: unknown format in '%s'\n", v); return 2; }
                fmts[nf++] = (ft_wfmt)k;
                const char *c = strchr(s, ',');
                if (!c) break;
                s = c + 1;
            }
            i++;
        } else if (!strcmp(argv[i], "-s")) {
            ns = 0;
            for (const char *s = v; *s && ns < 8;) {
                if (sscanf(s, "%dx%d", &shapes[ns][0], &shapes[ns][1]) != 2) {
                    fprintf(stderr, "bench_wkernels: bad shape in '%s' (want OUTxIN)\n", v);
                    return 2;
                }
                ns++;
                const char *c = strchr(s, ',');
                if (!c) break;
                s = c + 1;
            }
            i++;
        } else {
            fprintf(stderr, "usage: bench_wkernels [-t THREADS,..] [-r ROWS,..] [-f FMT,..] [-s OUTxIN,..] "
                            "[-n RUNS] [-m MiB] [-x 1]\n");
            return 2;
        }
    }
    if (runs < 1 || runs > 64 || nth < 1 || nrows < 1 || mib < 1) { fprintf(stderr, "bench_wkernels: bad arguments\n"); return 2; }
    for (int t = 0; t < nth; t++) if (threads[t] < 1 || threads[t] > 64) { fprintf(stderr, "bench_wkernels: bad threads\n"); return 2; }
    for (int r = 0; r < nrows; r++) if (rowsv[r] < 1 || rowsv[r] > 4096) { fprintf(stderr, "bench_wkernels: bad rows\n"); return 2; }

    unsigned maxth = 1;
    for (int t = 0; t < nth; t++) if ((unsigned)threads[t] > maxth) maxth = (unsigned)threads[t];
    ft_pool *pool = NULL;
    if (ft_pool_create(maxth, &pool)) { fprintf(stderr, "bench_wkernels: %s\n", ft_last_error()); return 1; }
    printf("kernels: %s (vdpbf16ps / FMA multiply-adds per s: %.2f); working set %zu MiB; median of %d runs "
           "(1 thread: CPU time)\n", ft_wk_best()->name, ft_wk_bf16_gain(), mib, runs);
    double roof[8];
    for (int t = 0; t < nth; t++) {
        roof[t] = roofline(pool, (unsigned)threads[t], mib << 20, runs);
        printf("DRAM roofline (streaming read), %d thread%s: %.1f GB/s\n", threads[t], threads[t] > 1 ? "s" : "", roof[t]);
    }
    printf("%-5s %-10s %4s %3s %10s %8s %8s %7s %9s\n", "fmt", "out x in", "rows", "thr", "us/prod", "GB/s",
           "GFLOP/s", "%roof", "rows/ms");
    int maxrows = 1;
    for (int r = 0; r < nrows; r++) if (rowsv[r] > maxrows) maxrows = rowsv[r];
    for (int s = 0; s < ns; s++) {
        int out = shapes[s][0], in = shapes[s][1];
        float *x = ft_malloc_aligned((size_t)maxrows * in * 4, 64);
        float *y = ft_malloc_aligned((size_t)maxrows * out * 4, 64);
        if (!x || !y) return 1;
        for (size_t i = 0; i < (size_t)maxrows * in; i++) x[i] = frand();
        for (int f = 0; f < nf; f++) {
            wset ws;
            if (wset_make(&ws, fmts[f], out, in, mib)) { fprintf(stderr, "bench_wkernels: out of memory\n"); return 1; }
            for (int r = 0; r < nrows; r++) {
                int rows = rowsv[r];
                int nv = xt_ab ? 2 : 1;
                size_t wsz = ft_wk_ws_size(&ws.W[0], rows);
                /* the other form: x transposed if the default is not, else not */
                ft_wk_set_xt_rows(fmts[f], 1);
                size_t wsz2 = ft_wk_ws_size(&ws.W[0], rows);
                ft_wk_set_xt_rows(fmts[f], 0);
                int def_xt = ft_wk_ws_size(&ws.W[0], rows) == wsz2 && wsz2 > 0;
                int other = def_xt ? 100000 : 1;
                ft_wk_set_xt_rows(fmts[f], 0);
                if (wsz2 > wsz) wsz = wsz2;
                void *wsp = wsz ? ft_malloc_aligned(wsz, 64) : NULL;
                for (int t = 0; t < nth; t++) {
                    int th = threads[t];
                    int tasks = th == 1 ? 1 : th * 4;
                    int chunk = (out + tasks - 1) / tasks;
                    chunk = (chunk + 23) / 24 * 24;
                    size_t ntask = (size_t)((out + chunk - 1) / chunk);
                    double tm[2][64];
                    int cyc = 0;
                    /* as many products per timed run as it takes to pass 20 ms (small
                     * ones); with -x 1 the two variants alternate run by run */
                    int reps = 1;
                    for (int k = -1; k < runs; k++)
                        for (int v = 0; v < nv; v++) {
                            ft_wk_set_xt_rows(fmts[f], v ? other : 0);
                            double t0 = now(th);
                            for (int rep = 0; rep < reps; rep++) {
                                const ft_wmat *W = &ws.W[cyc++ % ws.ncopies];
                                ft_wk_act a;
                                if (ft_wk_prep(&a, wsp, wsz, W, x, rows)) { fprintf(stderr, "bench_wkernels: %s\n", ft_last_error()); return 1; }
                                pjob j = {y, &a, W, chunk};
                                ft_pool_run(ntask > 1 && th > 1 ? pool : NULL, ntask, p_task, &j);
                            }
                            double dt = (now(th) - t0) / reps;
                            if (k < 0) { if (!v) reps = dt >= 0.02 ? 1 : (int)(0.02 / dt) + 1; continue; }  /* warm-up */
                            tm[v][k] = dt;
                        }
                    ft_wk_set_xt_rows(fmts[f], 0);
                    for (int v = 0; v < nv; v++) {
                        double tmed = median(tm[v], runs);
                        double gbs = (double)ws.bytes / tmed / 1e9;
                        double gfl = 2.0 * rows * out * (double)in / tmed / 1e9;
                        printf("%-5s %4dx%-5d %4d %3d %10.1f %8.2f %8.1f %6.0f%% %9.2f%s\n", ft_wfmt_name(fmts[f]), out, in,
                               rows, th, tmed * 1e6, gbs, gfl, 100.0 * gbs / roof[t], rows / tmed / 1e3,
                               v ? (def_xt ? "  (x as given)" : "  (x transposed)") : "");
                    }
                    fflush(stdout);
                }
                ft_free_aligned(wsp);
            }
            wset_free(&ws);
        }
        ft_free_aligned(x);
        ft_free_aligned(y);
    }
    ft_pool_free(pool);
    return 0;
}
