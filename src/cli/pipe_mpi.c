/* The pipeline over MPI (Open MPI): ranks form the ring, point-to-point
 * messages carry what a UCX link would (pipe_mpi.h, docs/pipeline.md).
 * MPI calls come from the main thread only (MPI_THREAD_FUNNELED); errors
 * are returned, not fatal, so that a failure ends with a message. */
#include "pipe_mpi.h"

#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PIPE_TAG 0x4654

static int g_init;

int ft_cli_mpi_built(void) { return 1; }

static ft_status mpi_err(int rc, const char *what)
{
    char s[MPI_MAX_ERROR_STRING];
    int n = 0;
    if (MPI_Error_string(rc, s, &n) != MPI_SUCCESS) snprintf(s, sizeof s, "error %d", rc);
    return ft_set_error(FT_ERR_NET, "MPI: %s: %s", what, s);
}

ft_status ft_cli_mpi_init(int *rank, int *size)
{
    if (!g_init) {
        int provided = 0;
        int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided);
        if (rc != MPI_SUCCESS) return mpi_err(rc, "MPI_Init_thread");
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
        g_init = 1;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, rank);
    MPI_Comm_size(MPI_COMM_WORLD, size);
    return FT_OK;
}

void ft_cli_mpi_finalize(void)
{
    if (g_init) MPI_Finalize();
    g_init = 0;
}

void ft_cli_mpi_abort(void)
{
    if (g_init) MPI_Abort(MPI_COMM_WORLD, 1);
}

typedef struct {
    uint8_t *p;
    size_t cap;
    MPI_Request req;
    int busy;
} mbuf;

typedef struct {
    ft_pipe_link base;
    int next, prev;
    mbuf **b;
    int nb;
} mpi_link;

static void reap(mpi_link *m)
{
    for (int i = 0; i < m->nb; i++)
        if (m->b[i]->busy) {
            int done = 0;
            MPI_Test(&m->b[i]->req, &done, MPI_STATUS_IGNORE);
            if (done) m->b[i]->busy = 0;
        }
}

static ft_status m_send(ft_pipe_link *l, const void *buf, size_t len)
{
    mpi_link *m = (mpi_link *)l;
    if (len > INT_MAX) return ft_set_error(FT_ERR_INVALID_ARG, "MPI link: a message of %zu bytes", len);
    reap(m);
    mbuf *b = NULL;
    for (int i = 0; i < m->nb && !b; i++) if (!m->b[i]->busy) b = m->b[i];
    if (!b) {
        mbuf **nv = realloc(m->b, (size_t)(m->nb + 1) * sizeof *nv);
        if (!nv) return FT_ERR_NOMEM;
        m->b = nv;
        if (!(b = calloc(1, sizeof *b))) return FT_ERR_NOMEM;
        m->b[m->nb++] = b;
    }
    if (b->cap < len) {
        ft_free_aligned(b->p);
        b->cap = 0;
        if (!(b->p = ft_malloc_aligned(len ? len : 64, 64))) return FT_ERR_NOMEM;
        b->cap = len;
    }
    memcpy(b->p, buf, len);
    int rc = MPI_Isend(b->p, (int)len, MPI_BYTE, m->next, PIPE_TAG, MPI_COMM_WORLD, &b->req);
    if (rc != MPI_SUCCESS) return mpi_err(rc, "MPI_Isend");
    b->busy = 1;
    return FT_OK;
}

/* Probe (sleeping briefly between probes, so that a stage waiting for
 * its input leaves the core to the others), then receive. */
static ft_status m_recv(ft_pipe_link *l, void *buf, size_t cap, size_t *len, int timeout_ms)
{
    mpi_link *m = (mpi_link *)l;
    double dl = timeout_ms >= 0 ? ft_now() + timeout_ms / 1000.0 : 0;
    MPI_Status s;
    for (int spins = 0;; spins++) {
        int flag = 0;
        int rc = MPI_Iprobe(m->prev, PIPE_TAG, MPI_COMM_WORLD, &flag, &s);
        if (rc != MPI_SUCCESS) return mpi_err(rc, "MPI_Iprobe");
        if (flag) break;
        reap(m);
        if (timeout_ms >= 0 && ft_now() > dl)
            return ft_set_error(FT_ERR_TIMEOUT, "MPI link: no message within %d ms", timeout_ms);
        if (spins > 64) {
            struct timespec ts = {0, 50000};
            nanosleep(&ts, NULL);
        }
    }
    int count = 0;
    MPI_Get_count(&s, MPI_BYTE, &count);
    if (count < 0 || (size_t)count > cap)
        return ft_set_error(FT_ERR_BUFFER_SMALL, "MPI link: a message of %d bytes, room for %zu", count, cap);
    int rc = MPI_Recv(buf, count, MPI_BYTE, m->prev, PIPE_TAG, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) return mpi_err(rc, "MPI_Recv");
    *len = (size_t)count;
    return FT_OK;
}

static void m_close(ft_pipe_link *l)
{
    mpi_link *m = (mpi_link *)l;
    double dl = ft_now() + 3;
    for (;;) {
        reap(m);
        int busy = 0;
        for (int i = 0; i < m->nb; i++) busy |= m->b[i]->busy;
        if (!busy || ft_now() > dl) break;
    }
    for (int i = 0; i < m->nb; i++) {
        if (m->b[i]->busy) MPI_Cancel(&m->b[i]->req);
        ft_free_aligned(m->b[i]->p);
        free(m->b[i]);
    }
    free(m->b);
    free(m);
}

static const ft_pipe_link_ops mpi_ops = {"mpi", m_send, m_recv, m_close};

ft_status ft_cli_mpi_link(int rank, int size, ft_pipe_link **out)
{
    mpi_link *m = calloc(1, sizeof *m);
    if (!m) return FT_ERR_NOMEM;
    m->base.ops = &mpi_ops;
    m->next = (rank + 1) % size;
    m->prev = (rank + size - 1) % size;
    *out = &m->base;
    return FT_OK;
}

ft_status ft_cli_mpi_allgather(const void *mine, size_t len, void *all, size_t cap, size_t *lens)
{
    if (len > cap || cap > INT_MAX) return ft_set_error(FT_ERR_INVALID_ARG, "MPI allgather: %zu bytes", len);
    int size = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    unsigned long long l = len, *ls = calloc((size_t)size, sizeof *ls);
    uint8_t *mb = calloc(1, cap ? cap : 1);
    if (!ls || !mb) { free(ls); free(mb); return FT_ERR_NOMEM; }
    memcpy(mb, mine, len);
    int rc = MPI_Allgather(&l, 1, MPI_UNSIGNED_LONG_LONG, ls, 1, MPI_UNSIGNED_LONG_LONG, MPI_COMM_WORLD);
    if (rc == MPI_SUCCESS) rc = MPI_Allgather(mb, (int)cap, MPI_BYTE, all, (int)cap, MPI_BYTE, MPI_COMM_WORLD);
    for (int r = 0; r < size; r++) lens[r] = (size_t)ls[r];
    free(ls);
    free(mb);
    return rc == MPI_SUCCESS ? FT_OK : mpi_err(rc, "MPI_Allgather");
}

ft_status ft_cli_mpi_allgather_double(double v, double *all)
{
    int rc = MPI_Allgather(&v, 1, MPI_DOUBLE, all, 1, MPI_DOUBLE, MPI_COMM_WORLD);
    return rc == MPI_SUCCESS ? FT_OK : mpi_err(rc, "MPI_Allgather");
}

/* Blocking point-to-point bytes for the trainer's data-parallel steps
 * (ft_train_comm; cmd_finetune.c), in pieces of at most INT_MAX. */
#define DP_TAG 0x4655

ft_status ft_cli_mpi_send(void *user, int to, const void *buf, size_t len)
{
    (void)user;
    const char *p = buf;
    do {
        int n = len > INT_MAX ? INT_MAX : (int)len;
        int rc = MPI_Send(p, n, MPI_BYTE, to, DP_TAG, MPI_COMM_WORLD);
        if (rc != MPI_SUCCESS) return mpi_err(rc, "MPI_Send");
        p += n;
        len -= (size_t)n;
    } while (len);
    return FT_OK;
}

ft_status ft_cli_mpi_recv(void *user, int from, void *buf, size_t len)
{
    (void)user;
    char *p = buf;
    do {
        int n = len > INT_MAX ? INT_MAX : (int)len, got = 0;
        MPI_Status s;
        /* wait without spinning (a blocking MPI_Recv polls a core while
         * the rank before finishes its micro-batches) */
        for (int spins = 0;; spins++) {
            int flag = 0;
            int rc = MPI_Iprobe(from, DP_TAG, MPI_COMM_WORLD, &flag, &s);
            if (rc != MPI_SUCCESS) return mpi_err(rc, "MPI_Iprobe");
            if (flag) break;
            if (spins > 64) {
                struct timespec ts = {0, 50000};
                nanosleep(&ts, NULL);
            }
        }
        int rc = MPI_Recv(p, n, MPI_BYTE, from, DP_TAG, MPI_COMM_WORLD, &s);
        if (rc != MPI_SUCCESS) return mpi_err(rc, "MPI_Recv");
        MPI_Get_count(&s, MPI_BYTE, &got);
        if (got != n)
            return ft_set_error(FT_ERR_PROTOCOL, "MPI: rank %d sent %d bytes where %d were expected", from, got, n);
        p += n;
        len -= (size_t)n;
    } while (len);
    return FT_OK;
}
