/* Internal to src/offload. */
#ifndef FT_OFFLOAD_INTERNAL_H
#define FT_OFFLOAD_INTERNAL_H
#include <pthread.h>

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
