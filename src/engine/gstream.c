/* The token embeddings and the LM head read on demand from the
 * checkpoint file (ft_load_params.stream_globals): pread of whole rows,
 * converted to the compute format as a resident load converts them. With
 * stream_direct_io past the page cache (O_DIRECT: the checkpoint's tensor
 * offsets are not block-aligned, so the blocks covering the rows are read
 * and the rows moved to the buffer's start); else buffered, the pages
 * dropped behind the reads when asked (a memory cgroup charges the page
 * cache to the reader). Direct reads have no kernel read-ahead: a
 * context's reader thread (ft_gs_reader) reads the head's next chunk
 * while the pool computes this one. */
#define _GNU_SOURCE
#include "engine_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static ft_dtype plain(ft_wfmt f) { return f == FT_WF_BF16 ? FT_BF16 : f == FT_WF_F16 ? FT_F16 : FT_F32; }

int ft_gstream_chunk_rows(const ft_gstream *g)
{
    if (g->chunk_rows > 0) {
        int r = (g->chunk_rows + 23) / 24 * 24;
        return r >= g->rows ? g->rows : r;
    }
    size_t row = (size_t)ft_dtype_nbytes(plain(g->fmt), (size_t)g->cols);
    size_t src = (size_t)ft_dtype_nbytes(g->src, (size_t)g->cols);
    if (src > row) row = src;
    size_t r = (4u << 20) / (row ? row : 1);
    r = r / 96 * 96;
    if (r < 96) r = 96;
    return r >= (size_t)g->rows ? g->rows : (int)r;
}

static void drop(const ft_gstream *g, uint64_t off, uint64_t len)
{
    if (g->drop_cache) (void)posix_fadvise(g->fd, (off_t)off, (off_t)len, POSIX_FADV_DONTNEED);
}

static int direct(const ft_gstream *g)
{
    return g->dfd >= 0 && !__atomic_load_n(&g->direct_refused, __ATOMIC_RELAXED);
}

int ft_gstream_direct_now(const ft_gstream *g) { return g && direct(g); }

void ft_gstream_prefetch(const ft_gstream *g, int r0, int n)
{
    if (r0 < 0 || n <= 0 || r0 >= g->rows || direct(g)) return;
    if (r0 + n > g->rows) n = g->rows - r0;
    size_t rb = (size_t)ft_dtype_nbytes(g->src, (size_t)g->cols);
    (void)posix_fadvise(g->fd, (off_t)(g->off + (uint64_t)r0 * rb), (off_t)((uint64_t)n * rb), POSIX_FADV_WILLNEED);
}

/* Bytes [off, off + len) into buf (FT_GSTREAM_ALIGN-aligned, room for len
 * + FT_GSTREAM_SLACK) past the page cache: the aligned blocks that cover
 * them in one read, the bytes then moved to buf's start. FT_ERR_UNSUPPORTED
 * where the file system refuses (EINVAL), nothing set. */
static ft_status read_direct(const ft_gstream *g, uint64_t off, size_t len, uint8_t *buf)
{
    const uint64_t a0 = off & ~(uint64_t)(FT_GSTREAM_ALIGN - 1);
    const size_t lead = (size_t)(off - a0), need = lead + len;
    const size_t span = (need + FT_GSTREAM_ALIGN - 1) & ~(size_t)(FT_GSTREAM_ALIGN - 1);
    size_t got = 0;
    while (got < need) {
        ssize_t k = g->dpread ? g->dpread(g->dfd, buf + got, span - got, (off_t)(a0 + got))
                              : pread(g->dfd, buf + got, span - got, (off_t)(a0 + got));
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && errno == EINVAL) return FT_ERR_UNSUPPORTED;
        /* short only at the end of the file: past it, nothing more */
        if (k <= 0 || (got + (size_t)k < need && (((size_t)k) & (FT_GSTREAM_ALIGN - 1))))
            return ft_set_error(FT_ERR_IO, "streamed matrix: direct read of %zu bytes at %llu: %s", span - got,
                                (unsigned long long)(a0 + got), k < 0 ? strerror(errno) : "end of file");
        got += (size_t)k;
    }
    if (lead) memmove(buf, buf + lead, len);
    return FT_OK;
}

static ft_status read_buffered(const ft_gstream *g, uint64_t off, size_t len, uint8_t *buf)
{
    size_t got = 0;
    while (got < len) {
        ssize_t k = pread(g->fd, buf + got, len - got, (off_t)(off + got));
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0)
            return ft_set_error(FT_ERR_IO, "streamed matrix: read of %zu bytes at %llu: %s", len - got,
                                (unsigned long long)(off + got), k < 0 ? strerror(errno) : "end of file");
        got += (size_t)k;
    }
    drop(g, off, len);
    return FT_OK;
}

ft_status ft_gstream_read(ft_gstream *g, int r0, int n, void *dst, void *raw)
{
    if (r0 < 0 || n < 0 || r0 + n > g->rows)
        return ft_set_error(FT_ERR_INVALID_ARG, "streamed matrix: rows [%d, %d) of %d", r0, r0 + n, g->rows);
    size_t rb = (size_t)ft_dtype_nbytes(g->src, (size_t)g->cols);
    size_t len = (size_t)n * rb;
    if (!len) return FT_OK;
    uint64_t off = g->off + (uint64_t)r0 * rb;
    ft_dtype dd = plain(g->fmt);
    uint8_t *buf = dd == g->src ? dst : raw;
    ft_status st = FT_ERR_UNSUPPORTED;
    if (direct(g) && ((uintptr_t)buf & (FT_GSTREAM_ALIGN - 1)) == 0) {
        st = read_direct(g, off, len, buf);
        if (st == FT_ERR_UNSUPPORTED && !__atomic_exchange_n(&g->direct_refused, 1, __ATOMIC_RELAXED))
            FT_LOG(FT_LOG_DEBUG, "streamed matrix: the file system refuses O_DIRECT reads: read through the page "
                   "cache from now on");
    }
    if (st == FT_ERR_UNSUPPORTED) st = read_buffered(g, off, len, buf);
    if (st) return st;
    __atomic_fetch_add(&g->bytes_read, (uint64_t)len, __ATOMIC_RELAXED);
    if (buf != dst) return ft_convert(dst, dd, buf, g->src, (size_t)n * (size_t)g->cols);
    return FT_OK;
}

/* ------------------------------------------------------ the reader */

struct ft_gs_reader {
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;         /* the reader waits: a job, a free buffer, quit */
    pthread_cond_t done;       /* the owner waits: a chunk ready, reads stopped */
    int quit, active, stop, failed, reading;
    ft_gstream *g;
    int R, nchunks, next;      /* chunk k: rows [k R, ..), buffer (k + 1) & 1 */
    void *dst[2], *raw[2];
    int state[2];              /* GS_FREE, GS_HELD (the owner's), GS_READY */
    int chunk[2];              /* the chunk a READY buffer holds */
    ft_status st;
    char msg[512];
};
enum { GS_FREE, GS_HELD, GS_READY };

static void *reader_main(void *arg)
{
    ft_gs_reader *r = arg;
    pthread_mutex_lock(&r->mu);
    for (;;) {
        if (r->quit) break;
        int k = r->next, b = (k + 1) & 1;
        if (!(r->active && !r->stop && !r->failed && k < r->nchunks && r->state[b] == GS_FREE)) {
            pthread_cond_wait(&r->cv, &r->mu);
            continue;
        }
        r->next++;
        r->reading = 1;
        r->state[b] = GS_HELD;
        ft_gstream *g = r->g;
        int r0 = k * r->R, n = g->rows - r0 < r->R ? g->rows - r0 : r->R;
        void *dst = r->dst[b], *raw = r->raw[b];
        pthread_mutex_unlock(&r->mu);
        ft_status st = ft_gstream_read(g, r0, n, dst, raw);
        pthread_mutex_lock(&r->mu);
        r->reading = 0;
        if (st) {
            r->failed = 1;
            r->st = st;
            snprintf(r->msg, sizeof r->msg, "%s", ft_last_error());
            r->state[b] = GS_FREE;
        } else {
            r->state[b] = GS_READY;
            r->chunk[b] = k;
        }
        pthread_cond_broadcast(&r->done);
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

ft_status ft_gs_reader_create(ft_gs_reader **out)
{
    ft_gs_reader *r = calloc(1, sizeof *r);
    if (!r) return ft_set_error(FT_ERR_NOMEM, "streamed matrix: reader");
    if (pthread_mutex_init(&r->mu, NULL)) {
        free(r);
        return ft_set_error(FT_ERR_NOMEM, "streamed matrix: reader mutex");
    }
    if (pthread_cond_init(&r->cv, NULL)) {
        pthread_mutex_destroy(&r->mu);
        free(r);
        return ft_set_error(FT_ERR_NOMEM, "streamed matrix: reader condition");
    }
    if (pthread_cond_init(&r->done, NULL)) {
        pthread_cond_destroy(&r->cv);
        pthread_mutex_destroy(&r->mu);
        free(r);
        return ft_set_error(FT_ERR_NOMEM, "streamed matrix: reader condition");
    }
    int e = pthread_create(&r->th, NULL, reader_main, r);
    if (e) {
        pthread_cond_destroy(&r->done);
        pthread_cond_destroy(&r->cv);
        pthread_mutex_destroy(&r->mu);
        free(r);
        return ft_set_error(FT_ERR_NOMEM, "streamed matrix: reader thread: %s", strerror(e));
    }
    *out = r;
    return FT_OK;
}

void ft_gs_reader_start(ft_gs_reader *r, ft_gstream *g, int R, void *dst0, void *raw0, void *dst1, void *raw1)
{
    pthread_mutex_lock(&r->mu);
    r->g = g;
    r->R = R;
    r->nchunks = (g->rows + R - 1) / R;
    r->next = 0;
    r->dst[0] = dst0; r->raw[0] = raw0;
    r->dst[1] = dst1; r->raw[1] = raw1;
    r->state[0] = GS_HELD;   /* until released: the embeddings may use it */
    r->state[1] = GS_FREE;
    r->st = FT_OK;
    r->failed = r->stop = 0;
    r->active = 1;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

int ft_gs_reader_active(const ft_gs_reader *r) { return r && r->active; }

void ft_gs_reader_release(ft_gs_reader *r, int b)
{
    pthread_mutex_lock(&r->mu);
    r->state[b] = GS_FREE;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

ft_status ft_gs_reader_get(ft_gs_reader *r, int k, int *b)
{
    int bb = (k + 1) & 1;
    pthread_mutex_lock(&r->mu);
    while (!r->failed && !(r->state[bb] == GS_READY && r->chunk[bb] == k)) pthread_cond_wait(&r->done, &r->mu);
    ft_status st = FT_OK;
    if (r->state[bb] == GS_READY && r->chunk[bb] == k) r->state[bb] = GS_HELD;
    else st = r->st;
    pthread_mutex_unlock(&r->mu);
    if (st) return ft_set_error(st, "%s", r->msg);
    *b = bb;
    return FT_OK;
}

void ft_gs_reader_stop(ft_gs_reader *r)
{
    if (!r || !r->active) return;
    pthread_mutex_lock(&r->mu);
    r->stop = 1;
    while (r->reading) pthread_cond_wait(&r->done, &r->mu);
    r->active = 0;
    pthread_mutex_unlock(&r->mu);
}

void ft_gs_reader_free(ft_gs_reader *r)
{
    if (!r) return;
    ft_gs_reader_stop(r);
    pthread_mutex_lock(&r->mu);
    r->quit = 1;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    pthread_join(r->th, NULL);
    pthread_cond_destroy(&r->done);
    pthread_cond_destroy(&r->cv);
    pthread_mutex_destroy(&r->mu);
    free(r);
}
