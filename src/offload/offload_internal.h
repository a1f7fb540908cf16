/* Internal to src/offload. */
#ifndef FT_OFFLOAD_INTERNAL_H
#define FT_OFFLOAD_INTERNAL_H
#include <pthread.h>

/* The scheduler's stores read a layer's tensors this many at once (one
 * reading thread each); the cost model counts them as threads on the
 * cores where the reads are the kernel's copies (the page cache). */
#define FT_SCHED_READERS 8

/* The cost model's fair share of the cores (planner.c): groups of
 * threads, each thread with `work` seconds of CPU to do, runnable from
 * the start (after < 0) or once group `after` is done. */
typedef struct { double threads, work; int after; } ft_fs_group;
double ft_cost_fair_share(double cores, const ft_fs_group *g, int n);

/* Ask an I/O thread that waits on cv for work (or stop) to stop, and join it. */
static inline void ft_io_thread_stop(pthread_mutex_t *mu, pthread_cond_t *cv, int *stop, pthread_t t)
{
    pthread_mutex_lock(mu);
    *stop = 1;
    pthread_cond_broadcast(cv);
    pthread_mutex_unlock(mu);
    pthread_join(t, NULL);
}
#endif
