/* Helpers shared by the benchmarks in bench/: CPU clocks and a qsort
 * comparison for medians. */
#ifndef FT_BENCH_UTIL_H
#define FT_BENCH_UTIL_H
#include <time.h>

/* Process CPU seconds: robust to the time-sharing of a loaded machine
 * (a 1-thread context does all its work on one thread). */
static inline double bench_process_cpu(void)
{
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* The calling thread's CPU seconds. */
static inline double bench_thread_cpu(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* qsort order of doubles */
static inline int bench_cmpd(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
#endif
