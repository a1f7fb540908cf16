/* membw.c - streaming-read DRAM bandwidth, the denominator of the decode
 * roofline in scripts/bench/llamacpp.sh (docs/bench-peers.md).
 *
 *   membw [THREADS] [MIB] [REPS]      prints "<GB/s>" (best of REPS)
 *
 * Each thread sums its own contiguous slice of a MIB-MiB buffer (default
 * 1024, far beyond any cache) with eight independent 64-byte vector
 * accumulators, which is what a GEMV over weights streamed from DRAM does.
 * The buffer is written first (page faults are not timed); the threads
 * start together at a barrier and the time runs from the first one's start
 * to the last one's end. GB = 1e9 bytes.
 * Built by the peer scripts with -O3 -march=native; not part of FlexTier. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef float v16 __attribute__((vector_size(64)));

typedef struct {
    const v16 *p;
    size_t n;             /* vectors */
    pthread_barrier_t *bar;
    double sink, t0, t1;
} job;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void *reader(void *arg)
{
    job *j = arg;
    v16 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, a4 = {0}, a5 = {0}, a6 = {0}, a7 = {0};
    pthread_barrier_wait(j->bar);
    j->t0 = now();
    size_t i = 0;
    for (; i + 8 <= j->n; i += 8) {
        a0 += j->p[i]; a1 += j->p[i + 1]; a2 += j->p[i + 2]; a3 += j->p[i + 3];
        a4 += j->p[i + 4]; a5 += j->p[i + 5]; a6 += j->p[i + 6]; a7 += j->p[i + 7];
    }
    for (; i < j->n; i++) a0 += j->p[i];
    v16 s = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7;
    double t = 0;
    for (int k = 0; k < 16; k++) t += s[k];
    j->sink = t;
    j->t1 = now();
    return NULL;
}

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 1;
    long mib = argc > 2 ? atol(argv[2]) : 1024;
    int reps = argc > 3 ? atoi(argv[3]) : 5;
    if (threads < 1 || threads > 1024 || mib < 1 || reps < 1) {
        fprintf(stderr, "usage: membw [THREADS] [MIB] [REPS]\n");
        return 2;
    }
    size_t bytes = (size_t)mib << 20, nv = bytes / sizeof(v16);
    v16 *buf = aligned_alloc(4096, nv * sizeof(v16));
    if (!buf) { fprintf(stderr, "membw: cannot allocate %ld MiB\n", mib); return 1; }
    memset(buf, 1, nv * sizeof(v16));
    pthread_t *tid = calloc((size_t)threads, sizeof *tid);
    job *jobs = calloc((size_t)threads, sizeof *jobs);
    if (!tid || !jobs) { fprintf(stderr, "membw: out of memory\n"); return 1; }
    double best = 0, sink = 0;
    for (int r = 0; r < reps; r++) {
        pthread_barrier_t bar;
        pthread_barrier_init(&bar, NULL, (unsigned)threads);
        size_t per = nv / (size_t)threads;
        for (int t = 0; t < threads; t++) {
            jobs[t] = (job){.p = buf + per * (size_t)t, .n = t == threads - 1 ? nv - per * (size_t)t : per, .bar = &bar};
            if (pthread_create(&tid[t], NULL, reader, &jobs[t])) { fprintf(stderr, "membw: pthread_create\n"); return 1; }
        }
        /* from the first thread's start to the last one's end */
        double t0 = 1e300, t1 = 0;
        for (int t = 0; t < threads; t++) {
            pthread_join(tid[t], NULL);
            sink += jobs[t].sink;
            if (jobs[t].t0 < t0) t0 = jobs[t].t0;
            if (jobs[t].t1 > t1) t1 = jobs[t].t1;
        }
        double dt = t1 - t0;
        pthread_barrier_destroy(&bar);
        double gbs = (double)(nv * sizeof(v16)) / dt / 1e9;
        if (gbs > best) best = gbs;
    }
    printf("%.2f\n", best);
    if (sink == 12345.678) fputs("", stderr);   /* keep the sums alive */
    free(jobs);
    free(tid);
    free(buf);
    return 0;
}
