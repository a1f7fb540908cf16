/* A small fork-join thread pool: ft_pool_run is a blocking parallel-for in
 * which the caller takes part. Work items are claimed with an atomic
 * counter, so uneven items balance themselves. */
#include "flextier/core.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct ft_pool {
    unsigned nthreads;          /* including the caller */
    pthread_t *threads;
    pthread_mutex_t mu;         /* protects the fields below */
    pthread_cond_t start_cv, done_cv;
    pthread_mutex_t run_mu;     /* serializes ft_pool_run callers */
    uint64_t generation;
    int stop;
    unsigned active;            /* workers still in the current job */
    /* current job */
    ft_pool_fn fn;
    void *arg;
    size_t n;
    atomic_size_t next;
};

typedef struct { ft_pool *pool; unsigned id; } worker_arg;

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
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && p->generation == seen)
            pthread_cond_wait(&p->start_cv, &p->mu);
        if (p->stop) break;
        seen = p->generation;
        pthread_mutex_unlock(&p->mu);
        run_items(p, wa.id);
        pthread_mutex_lock(&p->mu);
        if (--p->active == 0) pthread_cond_signal(&p->done_cv);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

unsigned ft_default_threads(void)
{
    const char *e = getenv("FLEXTIER_THREADS");
    if (e && *e) {
        long v = strtol(e, NULL, 10);
        if (v > 0 && v <= 1024) return (unsigned)v;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (unsigned)n : 1;
}

ft_status ft_pool_create(unsigned nthreads, ft_pool **out)
{
    if (!out) return FT_ERR_INVALID_ARG;
    if (nthreads == 0) nthreads = ft_default_threads();
    if (nthreads > 1024) return ft_set_error(FT_ERR_INVALID_ARG, "too many threads");
    ft_pool *p = calloc(1, sizeof *p);
    if (!p) return FT_ERR_NOMEM;
    p->nthreads = nthreads;
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
    p->stop = 1;
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
    p->active = p->nthreads - 1;
    p->generation++;
    pthread_cond_broadcast(&p->start_cv);
    pthread_mutex_unlock(&p->mu);
    run_items(p, 0);
    pthread_mutex_lock(&p->mu);
    while (p->active) pthread_cond_wait(&p->done_cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
    pthread_mutex_unlock(&p->run_mu);
}
