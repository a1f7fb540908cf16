/* The generic store layer: URI dispatch, codec work around the backends'
 * frame operations, and the async request queue. */
#include "store_internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

ft_status ft_buf_reserve(ft_buf *b, size_t n)
{
    if (n <= b->cap && b->p) return FT_OK;
    if (b->fixed)
        return ft_set_error(FT_ERR_BUFFER_SMALL, "frame of %zu bytes, buffer of %zu", n, b->cap);
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < n) {
        if (cap > SIZE_MAX / 2) return ft_set_error(FT_ERR_NOMEM, "buffer of %zu bytes", n);
        cap *= 2;
    }
    uint8_t *p = ft_malloc_aligned(cap, FT_BUF_ALIGN);
    if (!p) return ft_set_error(FT_ERR_NOMEM, "buffer of %zu bytes", cap);
    ft_free_aligned(b->p);
    b->p = p;
    b->cap = cap;
    return FT_OK;
}

void ft_buf_free(ft_buf *b)
{
    if (!b || b->fixed) return;
    ft_free_aligned(b->p);
    b->p = NULL;
    b->cap = 0;
}

ft_status ft_key_validate(const char *key)
{
    if (!key) return ft_set_error(FT_ERR_INVALID_ARG, "key is NULL");
    size_t n = 0;
    for (; key[n]; n++) {
        unsigned char c = (unsigned char)key[n];
        if (n >= FT_KEY_MAX)
            return ft_set_error(FT_ERR_INVALID_ARG, "key longer than %u bytes", FT_KEY_MAX);
        if (c < 0x21 || c > 0x7e)
            return ft_set_error(FT_ERR_INVALID_ARG,
                                "key byte %zu (0x%02x) is not printable ASCII", n, c);
    }
    if (n == 0) return ft_set_error(FT_ERR_INVALID_ARG, "empty key");
    return FT_OK;
}

static int keep_char(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (c >= '0' && c <= '9') || c == '_' || c == '-';
}

ft_status ft_key_escape(const char *key, char *out, size_t cap)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t o = 0;
    for (size_t i = 0; key[i]; i++) {
        unsigned char c = (unsigned char)key[i];
        if (keep_char(c)) {
            if (o + 1 >= cap) goto too_long;
            out[o++] = (char)c;
        } else {
            if (o + 3 >= cap) goto too_long;
            out[o++] = '%';
            out[o++] = hex[c >> 4];
            out[o++] = hex[c & 15];
        }
    }
    out[o] = 0;
    return FT_OK;
too_long:
    return ft_set_error(FT_ERR_INVALID_ARG, "key too long once escaped for a file name");
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

ft_status ft_key_unescape(const char *name, size_t len, char *out, size_t cap)
{
    size_t o = 0;
    for (size_t i = 0; i < len; i++) {
        int c = (unsigned char)name[i];
        if (c == '%') {
            if (i + 2 >= len) return FT_ERR_INVALID_ARG;
            int h = hexval(name[i + 1]), l = hexval(name[i + 2]);
            if (h < 0 || l < 0) return FT_ERR_INVALID_ARG;
            c = h * 16 + l;
            i += 2;
        } else if (!keep_char((unsigned char)c)) {
            return FT_ERR_INVALID_ARG;
        }
        if (o + 1 >= cap) return FT_ERR_INVALID_ARG;
        out[o++] = (char)c;
    }
    out[o] = 0;
    return ft_key_validate(out) == FT_OK ? FT_OK : FT_ERR_INVALID_ARG;
}

void ft_list_free(char **keys, size_t n)
{
    if (!keys) return;
    for (size_t i = 0; i < n; i++) free(keys[i]);
    free(keys);
}

/* ------------------------------------------------------------ the store */

/* Per-thread working state: a codec context and reusable buffers. */
typedef struct wctx {
    ft_codec_ctx *cc;
    ft_buf        enc;   /* encoded frame (write) / received frame (read) */
} wctx;

typedef enum { REQ_WRITE, REQ_READ, REQ_READ_FRAME } req_kind;

struct ft_request {
    ft_store       *s;
    req_kind        kind;
    char            key[FT_KEY_MAX + 1];
    ft_tensor       src;          /* write: copy of the descriptor */
    ft_codec_params cp;
    int             has_cp;
    ft_tensor      *dst;          /* read */
    size_t          cap;
    void           *fbuf;         /* read frame: the caller's buffer */
    size_t         *fsize;
    ft_status       status;       /* FT_INPROGRESS until done */
    char            detail[256];
    ft_request     *next;
};

struct ft_store {
    ft_store_backend *be;
    ft_store_params   params;
    pthread_mutex_t   sync_lock;  /* guards sync_ctx */
    wctx              sync_ctx;
    /* async */
    pthread_mutex_t   q_lock;
    pthread_cond_t    q_cond;     /* work available / stop */
    pthread_cond_t    done_cond;  /* a request finished */
    ft_request       *q_head, *q_tail;
    pthread_t        *threads;
    unsigned          nthreads;
    int               started, stop;
};

void ft_store_default_params(ft_store_params *p)
{
    memset(p, 0, sizeof *p);
    p->queue_depth = 4;
    p->timeout_ms = 30000;
    const char *t = getenv("FLEXTIER_TIMEOUT_MS");
    if (t && atoi(t) > 0) p->timeout_ms = atoi(t);
    p->direct_io = ft_direct_io_env();
}

ft_status ft_store_open(const char *uri, const ft_store_params *params,
                        ft_store **out)
{
    if (!uri || !out) return ft_set_error(FT_ERR_INVALID_ARG, "NULL uri/out");
    ft_store_params p;
    if (params) p = *params; else ft_store_default_params(&p);
    if (p.queue_depth == 0) p.queue_depth = 4;
    if (p.queue_depth > 64) p.queue_depth = 64;
    if (p.timeout_ms <= 0) p.timeout_ms = 30000;

    ft_store *s = calloc(1, sizeof *s);
    if (!s) return ft_set_error(FT_ERR_NOMEM, "store");
    s->params = p;
    s->params.token_file = NULL;   /* not kept: the caller owns the string */
    pthread_mutex_init(&s->sync_lock, NULL);
    pthread_mutex_init(&s->q_lock, NULL);
    pthread_cond_init(&s->q_cond, NULL);
    pthread_cond_init(&s->done_cond, NULL);

    const char *spec = NULL;
    const ft_store_scheme *sc = ft_store_scheme_find(uri, &spec);
    ft_status st;
    if (sc) {
        st = sc->open(spec, &p, &s->be);
    } else {
        char known[256] = "";
        for (size_t i = 0; ft_store_schemes[i]; i++)
            snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", i ? ", " : "",
                     ft_store_schemes[i]->usage);
        st = ft_set_error(FT_ERR_INVALID_ARG, "unknown store URI '%s' (%s)", uri, known);
    }
    if (st != FT_OK) goto fail;
    st = ft_codec_ctx_create(p.codec_threads, &s->sync_ctx.cc);
    if (st != FT_OK) goto fail;
    *out = s;
    return FT_OK;
fail:
    if (s->be) s->be->ops->close(s->be);
    pthread_mutex_destroy(&s->sync_lock);
    pthread_mutex_destroy(&s->q_lock);
    pthread_cond_destroy(&s->q_cond);
    pthread_cond_destroy(&s->done_cond);
    free(s);
    return st;
}

/* --------------------------------------------------------- operations */

static ft_status do_write(ft_store *s, wctx *w, const char *key,
                          const ft_tensor *t, const ft_codec_params *cp)
{
    ft_status st = ft_key_validate(key);
    if (st != FT_OK) return st;
    if (!t || (!t->data && t->ndim)) return ft_set_error(FT_ERR_INVALID_ARG, "NULL tensor");
    ft_codec_params raw;
    if (!cp) {
        ft_codec_default_params(&raw);
        raw.codec = FT_CODEC_RAW;
        cp = &raw;
    }
    if (s->be->ops->write) return s->be->ops->write(s->be, key, w->cc, &w->enc, t, cp);
    size_t bound = ft_encode_bound(cp, t->dtype, t->ndim, t->shape);
    if (bound == 0)
        return ft_set_error(FT_ERR_INVALID_ARG, "invalid codec params or shape for '%s'", key);
    st = ft_buf_reserve(&w->enc, bound);
    if (st != FT_OK) return st;
    size_t fsize = 0;
    st = ft_encode(w->cc, cp, t, w->enc.p, w->enc.cap, &fsize);
    if (st != FT_OK) return st;
    return s->be->ops->put(s->be, key, w->enc.p, fsize);
}

/* dst->data == NULL: allocate (out dtype = dst->dtype if alloc_dtype >= 0
 * else the frame's). */
static ft_status do_read(ft_store *s, wctx *w, const char *key, ft_tensor *dst,
                         size_t cap, int alloc, int alloc_dtype)
{
    ft_status st = ft_key_validate(key);
    if (st != FT_OK) return st;
    if (!dst) return ft_set_error(FT_ERR_INVALID_ARG, "NULL tensor");
    if (s->be->ops->read)
        return s->be->ops->read(s->be, key, w->cc, &w->enc, dst, cap, alloc, alloc_dtype);
    size_t fsize = 0;
    st = s->be->ops->get(s->be, key, &w->enc, &fsize);
    if (st != FT_OK) return st;
    if (alloc) return ft_decode_alloc(w->cc, w->enc.p, fsize, alloc_dtype, dst);
    return ft_decode(w->cc, w->enc.p, fsize, dst, cap);
}

ft_status ft_write_tensor(ft_store *s, const char *key, const ft_tensor *t,
                          const ft_codec_params *cp)
{
    if (!s) return ft_set_error(FT_ERR_INVALID_ARG, "NULL store");
    pthread_mutex_lock(&s->sync_lock);
    ft_status st = do_write(s, &s->sync_ctx, key, t, cp);
    pthread_mutex_unlock(&s->sync_lock);
    return st;
}

ft_status ft_read_tensor(ft_store *s, const char *key, int out_dtype,
                         ft_tensor *out)
{
    if (!s || !out) return ft_set_error(FT_ERR_INVALID_ARG, "NULL store/out");
    ft_tensor t;
    memset(&t, 0, sizeof t);
    pthread_mutex_lock(&s->sync_lock);
    ft_status st = do_read(s, &s->sync_ctx, key, &t, 0, 1, out_dtype);
    pthread_mutex_unlock(&s->sync_lock);
    if (st == FT_OK) *out = t;
    return st;
}

ft_status ft_read_tensor_into(ft_store *s, const char *key, ft_tensor *dst,
                              size_t cap)
{
    if (!s || !dst || !dst->data)
        return ft_set_error(FT_ERR_INVALID_ARG, "NULL store/dst/buffer");
    pthread_mutex_lock(&s->sync_lock);
    ft_status st = do_read(s, &s->sync_ctx, key, dst, cap, 0, 0);
    pthread_mutex_unlock(&s->sync_lock);
    return st;
}

ft_status ft_delete_tensor(ft_store *s, const char *key)
{
    if (!s) return ft_set_error(FT_ERR_INVALID_ARG, "NULL store");
    ft_status st = ft_key_validate(key);
    if (st != FT_OK) return st;
    return s->be->ops->del(s->be, key);
}

ft_status ft_stat_tensor(ft_store *s, const char *key, ft_tensor_stat *out)
{
    if (!s || !out) return ft_set_error(FT_ERR_INVALID_ARG, "NULL store/out");
    ft_status st = ft_key_validate(key);
    if (st != FT_OK) return st;
    ft_frame_info fi;
    st = s->be->ops->stat(s->be, key, &fi);
    if (st != FT_OK) return st;
    ft_tensor_stat r;
    memset(&r, 0, sizeof r);
    r.dtype = fi.dtype;
    r.ndim = fi.ndim;
    memcpy(r.shape, fi.shape, sizeof r.shape);
    r.codec = fi.codec;
    r.entropy = fi.entropy;
    r.level = fi.level;
    r.raw_bytes = fi.raw_size;
    r.stored_bytes = fi.frame_size;
    *out = r;
    return FT_OK;
}

ft_status ft_list_tensors(ft_store *s, char ***keys, size_t *n)
{
    if (!s || !keys || !n) return ft_set_error(FT_ERR_INVALID_ARG, "NULL argument");
    return s->be->ops->list(s->be, keys, n);
}

ft_status ft_store_stats_get(ft_store *s, ft_store_stats *out)
{
    if (!s || !out) return ft_set_error(FT_ERR_INVALID_ARG, "NULL argument");
    return s->be->ops->stats(s->be, out);
}

ft_status ft_store_put_frame(ft_store *s, const char *key, const void *frame,
                             size_t size)
{
    if (!s || !frame) return ft_set_error(FT_ERR_INVALID_ARG, "NULL argument");
    ft_status st = ft_key_validate(key);
    if (st != FT_OK) return st;
    ft_frame_info fi;
    st = ft_frame_parse(frame, size, &fi);
    if (st != FT_OK) return st;
    if (fi.frame_size != size)
        return ft_set_error(FT_ERR_CORRUPT, "frame is %llu bytes, buffer %zu",
                            (unsigned long long)fi.frame_size, size);
    return s->be->ops->put(s->be, key, frame, size);
}

ft_status ft_store_get_frame(ft_store *s, const char *key, void **frame,
                             size_t *size)
{
    if (!s || !frame || !size) return ft_set_error(FT_ERR_INVALID_ARG, "NULL argument");
    ft_status st = ft_key_validate(key);
    if (st != FT_OK) return st;
    ft_buf b = {0};
    size_t n = 0;
    st = s->be->ops->get(s->be, key, &b, &n);
    if (st != FT_OK) { ft_buf_free(&b); return st; }
    *frame = b.p;
    *size = n;
    return FT_OK;
}

/* ---------------------------------------------------------------- async */

static void finish(ft_store *s, ft_request *r, ft_status st)
{
    pthread_mutex_lock(&s->q_lock);
    r->status = st;
    if (st != FT_OK) snprintf(r->detail, sizeof r->detail, "%s", ft_last_error());
    pthread_cond_broadcast(&s->done_cond);
    pthread_mutex_unlock(&s->q_lock);
}

static void *worker_main(void *arg)
{
    ft_store *s = arg;
    wctx w = {0};
    ft_status cst = ft_codec_ctx_create(1, &w.cc);
    for (;;) {
        pthread_mutex_lock(&s->q_lock);
        while (!s->q_head && !s->stop) pthread_cond_wait(&s->q_cond, &s->q_lock);
        ft_request *r = s->q_head;
        if (!r) { pthread_mutex_unlock(&s->q_lock); break; }
        s->q_head = r->next;
        if (!s->q_head) s->q_tail = NULL;
        pthread_mutex_unlock(&s->q_lock);

        ft_status st;
        if (cst != FT_OK) st = cst;
        else if (r->kind == REQ_WRITE)
            st = do_write(s, &w, r->key, &r->src, r->has_cp ? &r->cp : NULL);
        else if (r->kind == REQ_READ_FRAME) {
            ft_buf fb = {r->fbuf, r->cap, 1};
            st = s->be->ops->get(s->be, r->key, &fb, r->fsize);
        }
        else
            st = do_read(s, &w, r->key, r->dst, r->cap, r->dst->data == NULL, -1);
        finish(s, r, st);
    }
    ft_codec_ctx_free(w.cc);
    ft_buf_free(&w.enc);
    return NULL;
}

static ft_status start_workers(ft_store *s)
{
    /* called with q_lock held */
    if (s->started) return FT_OK;
    s->threads = calloc(s->params.queue_depth, sizeof *s->threads);
    if (!s->threads) return ft_set_error(FT_ERR_NOMEM, "threads");
    for (unsigned i = 0; i < s->params.queue_depth; i++) {
        if (pthread_create(&s->threads[i], NULL, worker_main, s) != 0) {
            if (i == 0) {
                free(s->threads);
                s->threads = NULL;
                return ft_set_error(FT_ERR_NOMEM, "pthread_create failed");
            }
            break;
        }
        s->nthreads = i + 1;
    }
    s->started = 1;
    return FT_OK;
}

static ft_status submit(ft_store *s, ft_request *r, ft_request **out)
{
    pthread_mutex_lock(&s->q_lock);
    ft_status st = start_workers(s);
    if (st != FT_OK) {
        pthread_mutex_unlock(&s->q_lock);
        free(r);
        return st;
    }
    r->status = FT_INPROGRESS;
    if (s->q_tail) s->q_tail->next = r; else s->q_head = r;
    s->q_tail = r;
    pthread_cond_signal(&s->q_cond);
    pthread_mutex_unlock(&s->q_lock);
    *out = r;
    return FT_OK;
}

ft_status ft_write_tensor_async(ft_store *s, const char *key,
                                const ft_tensor *t, const ft_codec_params *cp,
                                ft_request **req)
{
    if (!s || !t || !req) return ft_set_error(FT_ERR_INVALID_ARG, "NULL argument");
    ft_status st = ft_key_validate(key);
    if (st != FT_OK) return st;
    ft_request *r = calloc(1, sizeof *r);
    if (!r) return ft_set_error(FT_ERR_NOMEM, "request");
    r->s = s;
    r->kind = REQ_WRITE;
    snprintf(r->key, sizeof r->key, "%s", key);
    r->src = *t;
    if (cp) { r->cp = *cp; r->has_cp = 1; }
    return submit(s, r, req);
}

ft_status ft_read_tensor_async(ft_store *s, const char *key, ft_tensor *dst,
                               size_t cap, ft_request **req)
{
    if (!s || !dst || !req) return ft_set_error(FT_ERR_INVALID_ARG, "NULL argument");
    ft_status st = ft_key_validate(key);
    if (st != FT_OK) return st;
    ft_request *r = calloc(1, sizeof *r);
    if (!r) return ft_set_error(FT_ERR_NOMEM, "request");
    r->s = s;
    r->kind = REQ_READ;
    snprintf(r->key, sizeof r->key, "%s", key);
    r->dst = dst;
    r->cap = cap;
    return submit(s, r, req);
}

ft_status ft_read_frame_async(ft_store *s, const char *key, void *buf, size_t cap, size_t *size,
                              ft_request **req)
{
    if (!s || !buf || !size || !req) return ft_set_error(FT_ERR_INVALID_ARG, "NULL argument");
    ft_status st = ft_key_validate(key);
    if (st != FT_OK) return st;
    ft_request *r = calloc(1, sizeof *r);
    if (!r) return ft_set_error(FT_ERR_NOMEM, "request");
    r->s = s;
    r->kind = REQ_READ_FRAME;
    snprintf(r->key, sizeof r->key, "%s", key);
    r->fbuf = buf;
    r->cap = cap;
    r->fsize = size;
    return submit(s, r, req);
}

ft_status ft_request_test(ft_request *r)
{
    if (!r) return ft_set_error(FT_ERR_INVALID_ARG, "NULL request");
    pthread_mutex_lock(&r->s->q_lock);
    ft_status st = r->status;
    pthread_mutex_unlock(&r->s->q_lock);
    if (st < 0) ft_set_error(st, "%s", r->detail);
    return st;
}

ft_status ft_request_wait(ft_request *r, int timeout_ms)
{
    if (!r) return ft_set_error(FT_ERR_INVALID_ARG, "NULL request");
    ft_store *s = r->s;
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    if (timeout_ms >= 0) {
        dl.tv_sec += timeout_ms / 1000;
        dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (dl.tv_nsec >= 1000000000L) { dl.tv_sec++; dl.tv_nsec -= 1000000000L; }
    }
    pthread_mutex_lock(&s->q_lock);
    while (r->status == FT_INPROGRESS) {
        if (timeout_ms < 0) {
            pthread_cond_wait(&s->done_cond, &s->q_lock);
        } else if (pthread_cond_timedwait(&s->done_cond, &s->q_lock, &dl) == ETIMEDOUT) {
            break;
        }
    }
    ft_status st = r->status;
    pthread_mutex_unlock(&s->q_lock);
    if (st == FT_INPROGRESS) return ft_set_error(FT_ERR_TIMEOUT, "request still running");
    if (st < 0) ft_set_error(st, "%s", r->detail);
    return st;
}

void ft_request_free(ft_request *r)
{
    if (!r) return;
    ft_store *s = r->s;
    pthread_mutex_lock(&s->q_lock);
    while (r->status == FT_INPROGRESS) pthread_cond_wait(&s->done_cond, &s->q_lock);
    pthread_mutex_unlock(&s->q_lock);
    free(r);
}

void ft_store_close(ft_store *s)
{
    if (!s) return;
    pthread_mutex_lock(&s->q_lock);
    s->stop = 1;
    pthread_cond_broadcast(&s->q_cond);
    pthread_mutex_unlock(&s->q_lock);
    for (unsigned i = 0; i < s->nthreads; i++) pthread_join(s->threads[i], NULL);
    free(s->threads);
    /* Requests still queued after stop were never run; workers drain the
     * queue before exiting, so the queue is empty here. */
    if (s->be) s->be->ops->close(s->be);
    ft_codec_ctx_free(s->sync_ctx.cc);
    ft_buf_free(&s->sync_ctx.enc);
    pthread_mutex_destroy(&s->sync_lock);
    pthread_mutex_destroy(&s->q_lock);
    pthread_cond_destroy(&s->q_cond);
    pthread_cond_destroy(&s->done_cond);
    free(s);
}
