/* In-process ring of pipeline links: one queue per participant, guarded by
 * a mutex (tests, and a pipeline of threads). */
#include "flextier/pipe.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct qmsg {
    struct qmsg *next;
    size_t len;
    uint8_t data[];
} qmsg;

typedef struct ring {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n, open;
    qmsg **head, **tail;      /* per participant: its incoming queue */
    char *closed;             /* per participant: its end is closed  */
} ring;

typedef struct {
    ft_pipe_link base;
    ring *r;
    int me;
} local_link;

static ft_status l_send(ft_pipe_link *l, const void *buf, size_t len)
{
    local_link *ll = (local_link *)l;
    ring *r = ll->r;
    qmsg *q = malloc(sizeof *q + (len ? len : 1));
    if (!q) return ft_set_error(FT_ERR_NOMEM, "local link: %zu bytes", len);
    q->next = NULL;
    q->len = len;
    memcpy(q->data, buf, len);
    int to = (ll->me + 1) % r->n;
    pthread_mutex_lock(&r->mu);
    if (r->tail[to]) r->tail[to]->next = q; else r->head[to] = q;
    r->tail[to] = q;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    return FT_OK;
}

static ft_status l_recv(ft_pipe_link *l, void *buf, size_t cap, size_t *len, int timeout_ms)
{
    local_link *ll = (local_link *)l;
    ring *r = ll->r;
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    if (timeout_ms >= 0) {
        dl.tv_sec += timeout_ms / 1000;
        dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (dl.tv_nsec >= 1000000000L) { dl.tv_sec++; dl.tv_nsec -= 1000000000L; }
    }
    pthread_mutex_lock(&r->mu);
    while (!r->head[ll->me]) {
        /* the previous participant left: nothing more will come (others
         * may close first: the end of a run goes around the ring) */
        if (r->closed[(ll->me + r->n - 1) % r->n]) {
            pthread_mutex_unlock(&r->mu);
            return ft_set_error(FT_ERR_NET, "local link: the previous stage closed its end");
        }
        int e = timeout_ms >= 0 ? pthread_cond_timedwait(&r->cv, &r->mu, &dl) : pthread_cond_wait(&r->cv, &r->mu);
        if (e == ETIMEDOUT && !r->head[ll->me]) {
            pthread_mutex_unlock(&r->mu);
            return ft_set_error(FT_ERR_TIMEOUT, "local link: no message within %d ms", timeout_ms);
        }
    }
    qmsg *q = r->head[ll->me];
    if (q->len > cap) {
        pthread_mutex_unlock(&r->mu);
        return ft_set_error(FT_ERR_BUFFER_SMALL, "local link: a message of %zu bytes, room for %zu", q->len, cap);
    }
    r->head[ll->me] = q->next;
    if (!q->next) r->tail[ll->me] = NULL;
    pthread_mutex_unlock(&r->mu);
    memcpy(buf, q->data, q->len);
    *len = q->len;
    free(q);
    return FT_OK;
}

static void l_close(ft_pipe_link *l)
{
    local_link *ll = (local_link *)l;
    ring *r = ll->r;
    pthread_mutex_lock(&r->mu);
    int left = --r->open;
    r->closed[ll->me] = 1;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    free(ll);
    if (left) return;
    for (int i = 0; i < r->n; i++)
        for (qmsg *q = r->head[i], *nx; q; q = nx) {
            nx = q->next;
            free(q);
        }
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r->head);
    free(r->tail);
    free(r->closed);
    free(r);
}

static const ft_pipe_link_ops local_ops = {"local", l_send, l_recv, l_close};

ft_status ft_pipe_local_ring(int n, ft_pipe_link **links)
{
    if (n < 1 || n > FT_PIPE_MAX_STAGES || !links) return ft_set_error(FT_ERR_INVALID_ARG, "local ring of %d", n);
    ring *r = calloc(1, sizeof *r);
    if (!r) return FT_ERR_NOMEM;
    r->n = n;
    r->head = calloc((size_t)n, sizeof *r->head);
    r->tail = calloc((size_t)n, sizeof *r->tail);
    r->closed = calloc((size_t)n, 1);
    if (!r->head || !r->tail || !r->closed) {
        free(r->head);
        free(r->tail);
        free(r->closed);
        free(r);
        return FT_ERR_NOMEM;
    }
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    for (int i = 0; i < n; i++) {
        local_link *ll = calloc(1, sizeof *ll);
        if (!ll) {
            for (int k = 0; k < i; k++) l_close(links[k]);   /* the last close frees the ring */
            if (i == 0) {
                pthread_mutex_destroy(&r->mu);
                pthread_cond_destroy(&r->cv);
                free(r->head);
                free(r->tail);
                free(r->closed);
                free(r);
            }
            return FT_ERR_NOMEM;
        }
        ll->base.ops = &local_ops;
        ll->r = r;
        ll->me = i;
        r->open++;
        links[i] = &ll->base;
    }
    return FT_OK;
}
