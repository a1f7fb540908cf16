/* ucx://HOST:PORT backend: a client of `flextier serve`.
 *
 * One UCP worker and one endpoint (client/server sockaddr mode, error
 * handling mode PEER) per store, guarded by a mutex: any thread may issue
 * a request; the thread that waits drives ucp_worker_progress, so requests
 * from several threads (the async workers) are in flight together. The
 * request header lives on the waiting thread's stack until its send, its
 * reply and any rendezvous receive of the reply's data have completed.
 *
 * Every wait has a deadline (params.timeout_ms). A peer failure (the
 * endpoint error callback) or a timeout fails every pending request and
 * force-closes the endpoint, which completes all outstanding UCX
 * operations; the next call reconnects. */
#include "msg.h"
#include "net.h"
#include "store/store_internal.h"

#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <ucp/api/ucp.h>

struct rx_token;

typedef struct pend {
    uint64_t     id;
    int          replied;     /* reply header arrived (or failure)       */
    int          send_pending;
    int          recv_pending;
    ft_status    st;          /* reply status / failure                  */
    char         detail[128];
    uint64_t     aux;
    ft_buf      *rbuf;        /* where reply data goes (NULL: none)       */
    uint8_t     *fixed;       /* or into this fixed buffer ...            */
    size_t       fixed_cap;   /* ... of this many bytes                   */
    size_t       rlen;
    uint8_t      hdr[FT_MSG_MAX_HDR];
    uint8_t      body[FT_MSG_RANGE_SIZE];   /* small request payloads     */
    struct rx_token *rx;      /* the pending rendezvous receive's token   */
    struct pend *next;
} pend;

/* User data of a rendezvous receive. In UCX 1.13 force-closing the
 * endpoint of a dead peer does not complete a pending AM rendezvous
 * receive, so the waiter abandons it instead (the token is marked and the
 * pend released); if UCX ever calls back, the callback only frees the
 * token. Accessed under the client lock (callbacks run in progress). */
typedef struct rx_token {
    pend *p;
    int abandoned;
} rx_token;

typedef struct ucx_client {
    ft_store_backend base;
    char             where[300];
    struct sockaddr_storage addr;
    socklen_t        alen;
    char             token[FT_MSG_MAX_TOKEN];
    size_t           token_len;
    int              timeout_ms;
    pthread_mutex_t  lock;
    pthread_cond_t   cond;        /* something completed / progress free */
    int              progressing; /* a thread sleeps in poll(efd)        */
    ucp_context_h    ctx;
    ucp_worker_h     w;
    int              efd;
    ucp_ep_h         ep;
    int              dead;        /* ep failed: close it, fail requests   */
    uint64_t         next_id;
    pend            *pending;
    double           last_progress; /* ft_now() when the worker last did work */
} ucx_client;

static ft_status st_from_ucs(ucs_status_t s)
{
    switch (s) {
    case UCS_OK: return FT_OK;
    case UCS_ERR_NO_MEMORY: return FT_ERR_NOMEM;
    case UCS_ERR_TIMED_OUT: return FT_ERR_TIMEOUT;
    default: return FT_ERR_NET;
    }
}

static void fail_all(ucx_client *c, ft_status st, const char *why)
{
    for (pend *p = c->pending; p; p = p->next) {
        if (!p->replied) {
            p->replied = 1;
            p->st = st;
            snprintf(p->detail, sizeof p->detail, "%s", why);
        }
    }
}

static void ep_err_cb(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    ucx_client *c = arg;
    if (ep != c->ep) return;
    FT_LOG(FT_LOG_WARN, "ucx://%s: connection failed: %s", c->where, ucs_status_string(status));
    c->dead = 1;
    fail_all(c, FT_ERR_NET, ucs_status_string(status));
}

static void send_cb(void *req, ucs_status_t status, void *user)
{
    pend *p = user;
    p->send_pending = 0;
    if (status != UCS_OK && p->st == FT_OK) {
        p->st = st_from_ucs(status);
        snprintf(p->detail, sizeof p->detail, "send: %s", ucs_status_string(status));
        p->replied = 1;
    }
    ucp_request_free(req);
}

static void recv_cb(void *req, ucs_status_t status, size_t length, void *user)
{
    rx_token *t = user;
    (void)length;
    if (t->abandoned) {
        free(t);
        ucp_request_free(req);
        return;
    }
    pend *p = t->p;
    free(t);
    p->rx = NULL;
    p->recv_pending = 0;
    if (status != UCS_OK && p->st == FT_OK) {
        p->st = st_from_ucs(status);
        snprintf(p->detail, sizeof p->detail, "receive: %s", ucs_status_string(status));
    }
    ucp_request_free(req);
}

static ucs_status_t reply_cb(void *arg, const void *header, size_t hlen, void *data,
                             size_t len, const ucp_am_recv_param_t *param)
{
    ucx_client *c = arg;
    ft_msg m;
    if (ft_msg_parse(header, hlen, len, 1, UINT64_MAX, &m) != FT_OK) {
        FT_LOG(FT_LOG_WARN, "ucx://%s: malformed reply dropped: %s", c->where, ft_last_error());
        return UCS_OK;
    }
    pend *p = c->pending;
    while (p && p->id != m.req_id) p = p->next;
    if (!p || p->replied) return UCS_OK;    /* late reply to a failed request */
    p->replied = 1;
    p->st = (ft_status)m.status;
    p->aux = m.aux;
    if (m.status != FT_OK) {
        size_t n = len < sizeof p->detail - 1 ? len : sizeof p->detail - 1;
        if (n && !(param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {
            memcpy(p->detail, data, n);     /* error detail text */
            p->detail[n] = 0;
        } else {
            snprintf(p->detail, sizeof p->detail, "server: %s", ft_status_str(p->st));
        }
        return UCS_OK;
    }
    if (len == 0) return UCS_OK;
    uint8_t *dst;
    if (p->fixed) {
        if (len > p->fixed_cap) {
            p->st = FT_ERR_PROTOCOL;
            snprintf(p->detail, sizeof p->detail, "reply of %zu bytes, expected <= %zu", len,
                     p->fixed_cap);
            return UCS_OK;
        }
        dst = p->fixed;
    } else if (!p->rbuf) {
        p->st = FT_ERR_PROTOCOL;
        snprintf(p->detail, sizeof p->detail, "unexpected reply data");
        return UCS_OK;
    } else if (ft_buf_reserve(p->rbuf, len) != FT_OK) {
        p->st = p->rbuf->fixed ? FT_ERR_BUFFER_SMALL : FT_ERR_NOMEM;
        snprintf(p->detail, sizeof p->detail, "no room for %zu reply bytes", len);
        return UCS_OK;
    } else {
        dst = p->rbuf->p;
    }
    p->rlen = len;
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
        rx_token *t = malloc(sizeof *t);
        if (!t) {
            p->st = FT_ERR_NOMEM;
            snprintf(p->detail, sizeof p->detail, "no memory for a receive");
            return UCS_OK;
        }
        t->p = p;
        t->abandoned = 0;
        ucp_request_param_t rp;
        memset(&rp, 0, sizeof rp);
        rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
        rp.cb.recv_am = recv_cb;
        rp.user_data = t;
        ucs_status_ptr_t r = ucp_am_recv_data_nbx(c->w, data, dst, len, &rp);
        if (UCS_PTR_IS_ERR(r)) {
            free(t);
            p->st = FT_ERR_NET;
            snprintf(p->detail, sizeof p->detail, "receive: %s",
                     ucs_status_string(UCS_PTR_STATUS(r)));
        } else if (r) {
            p->rx = t;
            p->recv_pending = 1;
        } else {
            free(t);   /* completed at once: no callback */
        }
        return UCS_INPROGRESS;
    }
    memcpy(dst, data, len);
    return UCS_OK;
}

/* Force-close the endpoint (completes every outstanding operation). */
static void close_ep_locked(ucx_client *c)
{
    if (!c->ep) return;
    ucp_request_param_t p;
    memset(&p, 0, sizeof p);
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_EP_CLOSE_FLAG_FORCE;
    ucp_ep_h ep = c->ep;
    c->ep = NULL;
    fail_all(c, FT_ERR_NET, "connection closed");
    ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &p);
    if (r && !UCS_PTR_IS_ERR(r)) {
        double dl = ft_now() + 5.0;
        while (ucp_request_check_status(r) == UCS_INPROGRESS && ft_now() < dl)
            ucp_worker_progress(c->w);
        ucp_request_free(r);
    }
    /* Receives the closed endpoint left pending are abandoned: no data
     * can arrive for them any more (see rx_token). */
    for (pend *q = c->pending; q; q = q->next)
        if (q->recv_pending && q->rx) {
            q->rx->abandoned = 1;
            q->rx = NULL;
            q->recv_pending = 0;
            if (q->st == FT_OK) {
                q->st = FT_ERR_NET;
                snprintf(q->detail, sizeof q->detail, "connection closed during a receive");
            }
        }
    c->dead = 0;
    pthread_cond_broadcast(&c->cond);
}

static int pend_done(const pend *p)
{
    return p->replied && !p->send_pending && !p->recv_pending;
}

static ft_status wait_locked(ucx_client *c, pend *p, double deadline)
{
    while (!pend_done(p)) {
        if (c->dead) {
            close_ep_locked(c);
            if (pend_done(p)) break;
        }
        if (c->progressing) {
            /* another thread sleeps on the event fd; it wakes within 5 ms */
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 5000000L;
            if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
            pthread_cond_timedwait(&c->cond, &c->lock, &ts);
        } else if (ucp_worker_progress(c->w)) {
            c->last_progress = ft_now();
            pthread_cond_broadcast(&c->cond);
            continue;
        }
        if (pend_done(p)) break;
        /* time out only when the deadline passed AND the connection has been
         * idle for a whole timeout: a large transfer on a slow link that is
         * still moving is not cut off (a dead peer is caught by PEER mode) */
        double now = ft_now();
        if (now > deadline && now - c->last_progress > c->timeout_ms / 1000.0) {
            if (!p->replied) {
                /* no answer: drop the connection so UCX releases our
                 * buffers; the next call reconnects */
                FT_LOG(FT_LOG_WARN, "ucx://%s: request timed out; reconnecting", c->where);
                p->replied = 1;
                p->st = FT_ERR_TIMEOUT;
                snprintf(p->detail, sizeof p->detail, "no reply within %d ms", c->timeout_ms);
            }
            c->dead = 1;
            continue;
        }
        if (c->progressing) continue;
        if (ucp_worker_arm(c->w) == UCS_ERR_BUSY) continue;
        c->progressing = 1;
        pthread_mutex_unlock(&c->lock);
        struct pollfd pfd = {c->efd, POLLIN, 0};
        poll(&pfd, 1, 5);
        pthread_mutex_lock(&c->lock);
        c->progressing = 0;
    }
    return p->st;
}

/* Queue a request (p zeroed by the caller except rbuf/fixed). Lock held,
 * connection up. The reply completes p; wait with wait_locked, then
 * unlink_locked. */
static void submit_locked(ucx_client *c, pend *p, uint16_t op, const char *key,
                          const void *data, size_t dlen, uint64_t aux)
{
    p->id = ++c->next_id;
    p->next = c->pending;
    c->pending = p;
    uint32_t klen = key ? (uint32_t)strlen(key) : 0;
    size_t hlen = ft_msg_encode(p->hdr, op, p->id, 0, key, klen, dlen, aux, 0);
    if (!c->ep || c->dead) {
        p->replied = 1;
        p->st = FT_ERR_NET;
        snprintf(p->detail, sizeof p->detail, "not connected");
        return;
    }
    ucp_request_param_t rp;
    memset(&rp, 0, sizeof rp);
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                      UCP_OP_ATTR_FIELD_FLAGS;
    rp.flags = UCP_AM_SEND_FLAG_REPLY;
    rp.cb.send = send_cb;
    rp.user_data = p;
    ucs_status_ptr_t r = ucp_am_send_nbx(c->ep, FT_AM_REQUEST, p->hdr, hlen, data, dlen, &rp);
    if (UCS_PTR_IS_ERR(r)) {
        p->replied = 1;
        p->st = FT_ERR_NET;
        snprintf(p->detail, sizeof p->detail, "send: %s", ucs_status_string(UCS_PTR_STATUS(r)));
    } else if (r) {
        p->send_pending = 1;
    }
}

static void unlink_locked(ucx_client *c, pend *p)
{
    pend **pp = &c->pending;
    while (*pp && *pp != p) pp = &(*pp)->next;
    if (*pp) *pp = p->next;
}

static ft_status pend_error(ucx_client *c, const pend *p)
{
    return ft_set_error(p->st, "ucx://%s: %s", c->where,
                        p->detail[0] ? p->detail : ft_status_str(p->st));
}

/* Send one request and wait for its reply. Lock held, connection up. */
static ft_status call_locked(ucx_client *c, uint16_t op, const char *key,
                             const void *data, size_t dlen, uint64_t aux,
                             ft_buf *rbuf, size_t *rlen)
{
    pend p;
    memset(&p, 0, sizeof p);
    p.rbuf = rbuf;
    submit_locked(c, &p, op, key, data, dlen, aux);
    ft_status st = wait_locked(c, &p, ft_now() + c->timeout_ms / 1000.0);
    unlink_locked(c, &p);
    if (st != FT_OK) return pend_error(c, &p);
    if (rlen) *rlen = p.rlen;
    return FT_OK;
}

static ft_status connect_locked(ucx_client *c)
{
    ucp_ep_params_t ep;
    memset(&ep, 0, sizeof ep);
    ep.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    ep.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    ep.sockaddr.addr = (const struct sockaddr *)&c->addr;
    ep.sockaddr.addrlen = c->alen;
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = ep_err_cb;
    ep.err_handler.arg = c;
    c->dead = 0;
    ucs_status_t s = ucp_ep_create(c->w, &ep, &c->ep);
    if (s != UCS_OK) {
        c->ep = NULL;
        return ft_set_error(FT_ERR_NET, "ucx://%s: cannot connect: %s", c->where,
                            ucs_status_string(s));
    }
    ft_status st = call_locked(c, FT_OP_HELLO, NULL, c->token, c->token_len, 0, NULL, NULL);
    if (st != FT_OK) {
        char why[300];
        snprintf(why, sizeof why, "%s", ft_last_error());
        close_ep_locked(c);
        return ft_set_error(st, "%s", why);
    }
    FT_LOG(FT_LOG_INFO, "ucx://%s: connected", c->where);
    return FT_OK;
}

static ft_status call(ucx_client *c, uint16_t op, const char *key, const void *data,
                      size_t dlen, uint64_t aux, ft_buf *rbuf, size_t *rlen)
{
    pthread_mutex_lock(&c->lock);
    ft_status st = FT_OK;
    if (c->dead) close_ep_locked(c);
    if (!c->ep) st = connect_locked(c);
    if (st == FT_OK) st = call_locked(c, op, key, data, dlen, aux, rbuf, rlen);
    pthread_mutex_unlock(&c->lock);
    return st;
}

/* ------------------------------------------------------------ backend */

static ft_status cl_put(ft_store_backend *b, const char *key, const void *frame, size_t size)
{
    return call((ucx_client *)b, FT_OP_PUT, key, frame, size, ft_xxh3(frame, size), NULL, NULL);
}

static ft_status cl_get(ft_store_backend *b, const char *key, ft_buf *out, size_t *size)
{
    size_t n = 0;
    ft_status st = call((ucx_client *)b, FT_OP_GET, key, NULL, 0, 0, out, &n);
    if (st == FT_OK) *size = n;
    return st;
}

static ft_status cl_del(ft_store_backend *b, const char *key)
{
    return call((ucx_client *)b, FT_OP_DEL, key, NULL, 0, 0, NULL, NULL);
}

static ft_status cl_stat(ft_store_backend *b, const char *key, ft_frame_info *info)
{
    ft_buf buf = {0};
    size_t n = 0;
    ft_status st = call((ucx_client *)b, FT_OP_STAT, key, NULL, 0, 0, &buf, &n);
    ft_frame_info fi;
    if (st == FT_OK) st = ft_frame_parse(buf.p, n, &fi);
    if (st == FT_OK && fi.header_size != n)
        st = ft_set_error(FT_ERR_PROTOCOL, "stat reply of %zu bytes", n);
    ft_buf_free(&buf);
    if (st == FT_OK) *info = fi;
    return st;
}

static ft_status cl_list(ft_store_backend *b, char ***keys, size_t *n)
{
    ft_buf buf = {0};
    size_t len = 0;
    ft_status st = call((ucx_client *)b, FT_OP_LIST, NULL, NULL, 0, 0, &buf, &len);
    if (st == FT_OK) st = ft_msg_list_parse(buf.p, len, keys, n);
    ft_buf_free(&buf);
    return st;
}

static ft_status cl_stats(ft_store_backend *b, ft_store_stats *out)
{
    ft_buf buf = {0};
    size_t len = 0;
    ft_status st = call((ucx_client *)b, FT_OP_STAT, NULL, NULL, 0, 0, &buf, &len);
    if (st == FT_OK) st = ft_msg_stats_parse(buf.p, len, out);
    ft_buf_free(&buf);
    return st;
}

/* ------------------------------------------------------ pipelined read
 *
 * A read asks for the first FT_READ_RANGE bytes of the frame (GETR); a
 * frame that fits is decoded whole. A larger one is fetched in further
 * ranges, FT_READ_DEPTH in flight, all pinned to the version the first
 * reply named (a concurrent overwrite makes them fail with FT_ERR_BUSY and
 * the read starts over), and each chunk is decoded (and its hash checked)
 * as soon as its bytes have arrived, while later ranges are on the wire. */

#define FT_READ_RANGE (4u << 20)
#define FT_READ_DEPTH 4

static void range_body(pend *p, uint64_t ver, uint64_t off, uint64_t len)
{
    ft_put_le64(p->body, ver);
    ft_put_le64(p->body + 8, off);
    ft_put_le64(p->body + 16, len);
}

static ft_status decode_whole(ft_codec_ctx *cc, const void *frame, size_t n, ft_tensor *dst,
                              size_t cap, int alloc, int alloc_dtype)
{
    if (alloc) return ft_decode_alloc(cc, frame, n, alloc_dtype, dst);
    return ft_decode(cc, frame, n, dst, cap);
}

/* Grow b to n bytes keeping its first keep bytes. */
static ft_status buf_grow_keep(ft_buf *b, size_t n, size_t keep)
{
    if (b->cap >= n) return FT_OK;
    uint8_t *p = ft_malloc_aligned(n, 64);
    if (!p) return ft_set_error(FT_ERR_NOMEM, "frame buffer of %zu bytes", n);
    memcpy(p, b->p, keep);
    ft_free_aligned(b->p);
    b->p = p;
    b->cap = n;
    return FT_OK;
}

static ft_status read_once(ucx_client *c, const char *key, ft_codec_ctx *cc, ft_buf *scratch,
                           ft_tensor *dst, size_t cap, int alloc, int alloc_dtype)
{
    ft_status st = ft_buf_reserve(scratch, FT_READ_RANGE);
    if (st != FT_OK) return st;
    pend first;
    memset(&first, 0, sizeof first);
    first.fixed = scratch->p;
    first.fixed_cap = FT_READ_RANGE;
    range_body(&first, 0, 0, FT_READ_RANGE);
    pthread_mutex_lock(&c->lock);
    if (c->dead) close_ep_locked(c);
    if (!c->ep) st = connect_locked(c);
    if (st == FT_OK) {
        submit_locked(c, &first, FT_OP_GETR, key, first.body, FT_MSG_RANGE_SIZE, 0);
        st = wait_locked(c, &first, ft_now() + c->timeout_ms / 1000.0);
        unlink_locked(c, &first);
        if (st != FT_OK) st = pend_error(c, &first);
    }
    pthread_mutex_unlock(&c->lock);
    if (st != FT_OK) return st;
    const uint64_t ver = first.aux;
    const size_t got = first.rlen;
    ft_frame_info fi;
    st = ft_frame_parse(scratch->p, got, &fi);
    if (st == FT_ERR_BUFFER_SMALL && got == FT_READ_RANGE) {
        /* a header larger than the first range: fetch the frame whole */
        size_t n = 0;
        st = call(c, FT_OP_GET, key, NULL, 0, 0, scratch, &n);
        return st == FT_OK ? decode_whole(cc, scratch->p, n, dst, cap, alloc, alloc_dtype) : st;
    }
    if (st != FT_OK) return ft_set_error(FT_ERR_CORRUPT, "ucx://%s: '%s': %s", c->where, key,
                                         ft_last_error());
    if (fi.frame_size <= got) {
        if (fi.frame_size != got)
            return ft_set_error(FT_ERR_CORRUPT, "ucx://%s: '%s': frame size mismatch", c->where, key);
        return decode_whole(cc, scratch->p, got, dst, cap, alloc, alloc_dtype);
    }

    /* pipelined: output first */
    int od = alloc ? (alloc_dtype < 0 ? (int)fi.dtype : alloc_dtype) : (int)dst->dtype;
    if (od < 0 || od >= FT_DTYPE_COUNT) return ft_set_error(FT_ERR_INVALID_ARG, "output dtype");
    size_t need = (size_t)ft_dtype_nbytes((ft_dtype)od, fi.numel);
    if (!alloc && need > cap)
        return ft_set_error(FT_ERR_BUFFER_SMALL, "decoded tensor needs %zu bytes, buffer has %zu",
                            need, cap);
    if ((st = buf_grow_keep(scratch, (size_t)fi.frame_size, got)) != FT_OK) return st;
    uint8_t *out = alloc ? ft_malloc_aligned(need ? need : 64, 64) : dst->data;
    if (!out) return ft_set_error(FT_ERR_NOMEM, "cannot allocate %zu bytes", need);

    pend pr[FT_READ_DEPTH];
    size_t plen[FT_READ_DEPTH];
    unsigned head = 0, nfly = 0;
    uint64_t next_off = got, done_off = got;
    uint32_t next_chunk = 0;
    pthread_mutex_lock(&c->lock);
    for (;;) {
        while (st == FT_OK && nfly < FT_READ_DEPTH && next_off < fi.frame_size) {
            unsigned k = (head + nfly) % FT_READ_DEPTH;
            uint64_t len = fi.frame_size - next_off;
            if (len > FT_READ_RANGE) len = FT_READ_RANGE;
            memset(&pr[k], 0, sizeof pr[k]);
            pr[k].fixed = scratch->p + next_off;
            pr[k].fixed_cap = (size_t)len;
            plen[k] = (size_t)len;
            range_body(&pr[k], ver, next_off, len);
            submit_locked(c, &pr[k], FT_OP_GETR, key, pr[k].body, FT_MSG_RANGE_SIZE, 0);
            next_off += len;
            nfly++;
        }
        /* decode what has arrived while the rest is in flight */
        pthread_mutex_unlock(&c->lock);
        while (st == FT_OK && next_chunk < fi.n_chunks) {
            ft_chunk_info ch;
            st = ft_frame_chunk(scratch->p, (size_t)fi.frame_size, &fi, next_chunk, &ch);
            if (st != FT_OK || ch.enc_offset + ch.enc_size > done_off) break;
            size_t o = (size_t)ft_dtype_nbytes((ft_dtype)od, ch.elem_offset);
            st = ft_decode_chunk(cc, &fi, &ch, scratch->p + ch.enc_offset, (ft_dtype)od, out + o,
                                 need - o, 0);
            next_chunk++;
        }
        pthread_mutex_lock(&c->lock);
        if (nfly == 0) break;
        pend *p = &pr[head];
        ft_status w = wait_locked(c, p, ft_now() + c->timeout_ms / 1000.0);
        unlink_locked(c, p);
        if (st == FT_OK) {
            if (w != FT_OK) st = pend_error(c, p);
            else if (p->aux != ver) st = ft_set_error(FT_ERR_BUSY, "tensor replaced during read");
            else if (p->rlen != plen[head])
                st = ft_set_error(FT_ERR_PROTOCOL, "range reply of %zu bytes", p->rlen);
        }
        if (st == FT_OK) done_off += plen[head];
        head = (head + 1) % FT_READ_DEPTH;
        nfly--;
        if (st != FT_OK && nfly == 0) break;   /* drained after an error */
    }
    pthread_mutex_unlock(&c->lock);
    if (st == FT_OK && (next_chunk != fi.n_chunks || done_off != fi.frame_size))
        st = ft_set_error(FT_ERR_CORRUPT, "ucx://%s: '%s': chunks do not cover the frame", c->where,
                          key);
    if (st != FT_OK) {
        if (alloc) ft_free_aligned(out);
        return st;
    }
    dst->dtype = (ft_dtype)od;
    dst->data = out;
    dst->ndim = fi.ndim;
    memset(dst->shape, 0, sizeof dst->shape);
    if (fi.ndim) memcpy(dst->shape, fi.shape, fi.ndim * sizeof fi.shape[0]);
    return FT_OK;
}

static ft_status cl_read(ft_store_backend *b, const char *key, ft_codec_ctx *cc, ft_buf *scratch,
                         ft_tensor *dst, size_t cap, int alloc, int alloc_dtype)
{
    ft_status st = FT_ERR_BUSY;
    for (int attempt = 0; attempt < 4 && st == FT_ERR_BUSY; attempt++)
        st = read_once((ucx_client *)b, key, cc, scratch, dst, cap, alloc, alloc_dtype);
    return st;
}

static void cl_close(ft_store_backend *b)
{
    ucx_client *c = (ucx_client *)b;
    if (c->w) {
        pthread_mutex_lock(&c->lock);
        close_ep_locked(c);
        pthread_mutex_unlock(&c->lock);
        ucp_worker_destroy(c->w);
    }
    if (c->ctx) ucp_cleanup(c->ctx);
    pthread_mutex_destroy(&c->lock);
    pthread_cond_destroy(&c->cond);
    memset(c->token, 0, sizeof c->token);
    free(c);
}

static const ft_store_ops ucx_ops = {cl_put, cl_get, cl_del, cl_stat,
                                     cl_list, cl_stats, cl_close, cl_read};

ft_status ft_ucx_backend_open(const char *hostport, const ft_store_params *p,
                              ft_store_backend **out)
{
    ucx_client *c = calloc(1, sizeof *c);
    if (!c) return ft_set_error(FT_ERR_NOMEM, "ucx client");
    c->base.ops = &ucx_ops;
    c->efd = -1;
    c->timeout_ms = p->timeout_ms;
    snprintf(c->where, sizeof c->where, "%s", hostport);
    pthread_mutex_init(&c->lock, NULL);
    pthread_cond_init(&c->cond, NULL);
    ft_status st = ft_net_resolve(hostport, 0, &c->addr, &c->alen);
    const char *tf = p->token_file ? p->token_file : getenv("FLEXTIER_TOKEN_FILE");
    if (st == FT_OK && tf && *tf)
        st = ft_net_read_token(tf, c->token, sizeof c->token, &c->token_len);
    if (st != FT_OK) goto fail;

    /* one worker, serialized by c->lock */
    ucs_status_t s = ft_net_ucp_open("flextier-client", &c->ctx, &c->w, &c->efd);
    if (s == UCS_OK) {
        ucp_am_handler_param_t hp;
        memset(&hp, 0, sizeof hp);
        hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                        UCP_AM_HANDLER_PARAM_FIELD_ARG;
        hp.id = FT_AM_REPLY;
        hp.cb = reply_cb;
        hp.arg = c;
        s = ucp_worker_set_am_recv_handler(c->w, &hp);
    }
    if (s != UCS_OK) {
        st = ft_set_error(FT_ERR_NET, "UCX init: %s", ucs_status_string(s));
        goto fail;
    }
    pthread_mutex_lock(&c->lock);
    st = connect_locked(c);
    pthread_mutex_unlock(&c->lock);
    if (st != FT_OK) goto fail;
    *out = &c->base;
    return FT_OK;
fail:
    {
        char why[300];
        snprintf(why, sizeof why, "%s", ft_last_error());
        cl_close(&c->base);
        return ft_set_error(st, "%s", why);
    }
}
