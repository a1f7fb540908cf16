/* A small fork-join thread pool: ft_pool_run is a blocking parallel-for in
 * which the caller takes part. Work items are claimed with an atomic
 * counter, so uneven items balance themselves.
 *
 * Decoding one token runs a few hundred short jobs (one per matrix
 * product, norm and attention), microseconds apart: waking a sleeping
 * thread through a condition variable costs tens of microseconds each
 * time, so workers (and the caller waiting for them) first spin for a
 * short while (FLEXTIER_SPIN_US, default 100 microseconds; 0 disables)
 * and only then sleep. Between tokens, or when the pool is idle, they
 * sleep as before. */
#include "flextier/core.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct ft_pool {
    unsigned nthreads;          /* including the caller */
    pthread_t *threads;
    pthread_mutex_t mu;         /* protects the fields below */
    pthread_cond_t start_cv, done_cv;
    pthread_mutex_t run_mu;     /* serializes ft_pool_run callers */
    _Atomic uint64_t generation;/* bumped (under mu) for every job      */
    _Atomic int stop;
    _Atomic unsigned active;    /* workers still in the current job     */
    _Atomic uint64_t spin_ns;   /* spin this long before sleeping       */
    int spin_pinned;            /* FLEXTIER_SPIN_US gave it: kept       */
    /* current job */
    ft_pool_fn fn;
    void *arg;
    size_t n;
    atomic_size_t next;
};

typedef struct { ft_pool *pool; unsigned id; } worker_arg;

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static double mono_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double spin_of(ft_pool *p)
{
    return (double)atomic_load_explicit(&p->spin_ns, memory_order_relaxed) * 1e-9;
}

/* Spin until *v != old (ret 1) or spin_s elapses (ret 0). */
static int spin_change_u64(_Atomic uint64_t *v, uint64_t old, _Atomic int *stop, double spin_s)
{
    if (spin_s <= 0) return 0;
    double end = 0;
    for (unsigned k = 0;; k++) {
        if (atomic_load_explicit(v, memory_order_acquire) != old || atomic_load_explicit(stop, memory_order_relaxed))
            return 1;
        cpu_relax();
        if ((k & 63) == 63) {
            double t = mono_now();
            if (!end) end = t + spin_s;
            else if (t > end) return 0;
        }
    }
}

static void run_items(ft_pool *p, unsigned worker)
{
    for (;;) {
        size_t i = atomic_fetch_add_explicit(&p->next, 1, memory_order_relaxed);
        if (i >= p->n) break;
        p->fn(p->arg, i, worker);
    }
}

static void *worker_main(void *a)
{
    worker_arg wa = *(worker_arg *)a;
    free(a);
    ft_pool *p = wa.pool;
    uint64_t seen = 0;
    for (;;) {
        if (!spin_change_u64(&p->generation, seen, &p->stop, spin_of(p))) {
            pthread_mutex_lock(&p->mu);
            while (!atomic_load(&p->stop) && atomic_load(&p->generation) == seen)
                pthread_cond_wait(&p->start_cv, &p->mu);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->stop)) break;
        seen = atomic_load_explicit(&p->generation, memory_order_acquire);
        run_items(p, wa.id);
        if (atomic_fetch_sub_explicit(&p->active, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&p->mu);   /* the caller may be asleep */
            pthread_cond_signal(&p->done_cv);
            pthread_mutex_unlock(&p->mu);
        }
    }
    return NULL;
}

unsigned ft_default_threads(void)
{
    const char *e = getenv("FLEXTIER_THREADS");
    if (e && *e) {
        long v = strtol(e, NULL, 10);
        if (v > 0 && v <= 1024) return (unsigned)v;
    }
    return ft_usable_cpus();
}

ft_status ft_pool_create(unsigned nthreads, ft_pool **out)
{
    if (!out) return FT_ERR_INVALID_ARG;
    if (nthreads == 0) nthreads = ft_default_threads();
    if (nthreads > 1024) return ft_set_error(FT_ERR_INVALID_ARG, "too many threads");
    ft_pool *p = calloc(1, sizeof *p);
    if (!p) return FT_ERR_NOMEM;
    p->nthreads = nthreads;
    long us = 100;
    const char *sp = getenv("FLEXTIER_SPIN_US");
    if (sp && *sp) {
        long v = strtol(sp, NULL, 10);
        if (v >= 0 && v <= 1000000) {
            us = v;
            p->spin_pinned = 1;
        }
    }
    atomic_init(&p->spin_ns, (uint64_t)us * 1000u);
    pthread_mutex_init(&p->mu, NULL);
    pthread_mutex_init(&p->run_mu, NULL);
    pthread_cond_init(&p->start_cv, NULL);
    pthread_cond_init(&p->done_cv, NULL);
    if (nthreads > 1) {
        p->threads = calloc(nthreads - 1, sizeof *p->threads);
        if (!p->threads) { ft_pool_free(p); return FT_ERR_NOMEM; }
        for (unsigned i = 0; i + 1 < nthreads; i++) {
            worker_arg *wa = malloc(sizeof *wa);
            if (wa) { wa->pool = p; wa->id = i + 1; }
            if (!wa || pthread_create(&p->threads[i], NULL, worker_main, wa)) {
                free(wa);
                p->nthreads = i + 1;   /* only join those started */
                ft_pool_free(p);
                return ft_set_error(FT_ERR_NOMEM, "cannot start worker thread");
            }
        }
    }
    *out = p;
    return FT_OK;
}

void ft_pool_free(ft_pool *p)
{
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, 1);
    pthread_cond_broadcast(&p->start_cv);
    pthread_mutex_unlock(&p->mu);
    if (p->threads)
        for (unsigned i = 0; i + 1 < p->nthreads; i++) pthread_join(p->threads[i], NULL);
    free(p->threads);
    pthread_mutex_destroy(&p->mu);
    pthread_mutex_destroy(&p->run_mu);
    pthread_cond_destroy(&p->start_cv);
    pthread_cond_destroy(&p->done_cv);
    free(p);
}

unsigned ft_pool_size(const ft_pool *p) { return p ? p->nthreads : 1; }

void ft_pool_set_spin_us(ft_pool *p, unsigned us)
{
    if (p && !p->spin_pinned && us <= 1000000)
        atomic_store_explicit(&p->spin_ns, (uint64_t)us * 1000u, memory_order_relaxed);
}

void ft_pool_run(ft_pool *p, size_t n, ft_pool_fn fn, void *arg)
{
    if (n == 0) return;
    if (!p || p->nthreads == 1 || n == 1) {
        for (size_t i = 0; i < n; i++) fn(arg, i, 0);
        return;
    }
    pthread_mutex_lock(&p->run_mu);
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->arg = arg;
    p->n = n;
    atomic_store(&p->next, 0);
    atomic_store(&p->active, p->nthreads - 1);
    atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);   /* spinning workers start */
    pthread_cond_broadcast(&p->start_cv);                                 /* sleeping ones wake */
    pthread_mutex_unlock(&p->mu);
    run_items(p, 0);
    if (atomic_load_explicit(&p->active, memory_order_acquire)) {
        /* spin a while for the workers, then sleep until the last signals */
        double end = 0;
        double spin_s = spin_of(p);
        for (unsigned k = 0; spin_s > 0 && atomic_load_explicit(&p->active, memory_order_acquire); k++) {
            cpu_relax();
            if ((k & 63) == 63) {
                double t = mono_now();
                if (!end) end = t + spin_s;
                else if (t > end) break;
            }
        }
        pthread_mutex_lock(&p->mu);
        while (atomic_load_explicit(&p->active, memory_order_acquire)) pthread_cond_wait(&p->done_cv, &p->mu);
        pthread_mutex_unlock(&p->mu);
    }
    pthread_mutex_unlock(&p->run_mu);
}
