/* ucx://HOST:PORT backend: a client of `flextier serve` (protocol 2,
 * docs/protocol.md).
 *
 * A session starts with a TCP connection to HOST:PORT and the mutual
 * challenge-response (auth.c): the client proves it knows the token, then
 * checks that the node does too; the token never crosses the wire. When
 * the node offers a UCX data path (shared memory or RDMA; TCP only on a
 * network its operator named trusted) and FLEXTIER_TRANSPORT is not
 * "tcp", the client opens it: it sends its UCP worker address over the
 * authenticated connection (UCXB), connects to the node's worker and
 * checks the path with a PING; every UCX request then carries the session
 * id. Otherwise requests and replies travel on the TCP connection itself.
 *
 * One session per store, guarded by a mutex: any thread may issue a
 * request; the thread that waits drives progress (UCX and the socket), so
 * requests from several threads (the async workers) are in flight
 * together. A request's header lives in its `pend` on the waiting thread's
 * stack until its send, its reply and any receive of the reply's data
 * have completed. Reply data lands directly in the caller's buffer.
 *
 * Every wait has a deadline (params.timeout_ms). A peer failure or a
 * timeout fails every pending request and closes the session; the next
 * call reconnects (and authenticates again). */
#include "net/auth.h"
#include "net/cma.h"
#include "net/msg.h"
#include "net/net.h"
#include "store_internal.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>
#include <ucp/api/ucp.h>

#define FT_READ_FIRST (4u << 20)   /* first range of a read              */
#define FT_READ_FIRST_CMA (256u << 10) /* ... on the shared-memory path,
                                      where a round trip costs ~50 us: the
                                      rest lands in the output directly  */
#define FT_READ_RANGE (4u << 20)   /* later ranges                        */
#define FT_READ_RANGE_CMA (16u << 20) /* ... on the shared-memory path: they
                                      land in the output, nothing buffers
                                      them, and the node's copy of a larger
                                      range runs faster                   */
#define FT_READ_DEPTH 4            /* ranges in flight                    */

struct rx_token;

typedef struct pend {
    uint64_t     id;
    int          replied;     /* reply header arrived (or failure)       */
    int          send_pending;
    int          recv_pending;
    int          via_ucx;
    int          byref;       /* GETRV: the node wrote arg bytes to fixed */
    ft_status    st;          /* reply status / failure                  */
    char         detail[256];
    uint64_t     aux, arg;
    ft_buf      *rbuf;        /* where reply data goes (NULL: none)       */
    uint8_t     *fixed;       /* or into this fixed buffer ...            */
    size_t       fixed_cap;   /* ... of this many bytes                   */
    size_t       rlen;
    uint8_t      hdr[FT_MSG_MAX_HDR];
    size_t       hlen;
    uint8_t      body[FT_MSG_GETRV_SIZE];   /* small request payloads     */
    const uint8_t *data;      /* TCP: payload being written              */
    size_t       dlen, sent;
    struct pend *qnext;       /* TCP send queue                           */
    struct rx_token *rx;      /* the pending UCX rendezvous receive       */
    struct pend *next;
} pend;

/* User data of a UCX rendezvous receive. In UCX 1.13 force-closing the
 * endpoint of a dead peer does not complete a pending AM rendezvous
 * receive, so the waiter abandons it instead (the token is marked, kept on
 * the client's list and the pend released) and the worker is destroyed
 * (close_ep_locked); if UCX ever calls back, the callback only frees the
 * token. Accessed under the client lock (callbacks run in progress). */
typedef struct rx_token {
    pend *p;
    int abandoned;
    struct rx_token *next;   /* on ucx_client.dropped once abandoned */
} rx_token;

enum { MODE_AUTO, MODE_TCP, MODE_CMA, MODE_UCX };

typedef struct ucx_client {
    ft_store_backend base;
    char             where[300];
    struct sockaddr_storage addr;
    socklen_t        alen;
    uint8_t          token[FT_TOKEN_MAX];
    size_t           token_len;
    int              timeout_ms;
    int              mode;
    pthread_mutex_t  lock;
    pthread_cond_t   cond;        /* something completed / progress free */
    int              progressing; /* a thread sleeps in poll             */
    /* the session */
    int              fd;          /* -1: none                             */
    int              dead;        /* failed: close it, fail requests      */
    uint64_t         session;
    uint64_t         next_id, next_xid;
    pend            *pending;
    pend            *out_head, *out_tail;
    double           last_progress;
    /* TCP replies being read */
    int              rxp;         /* 0 header, 1 payload, 2 discard       */
    uint8_t          rx_hdr[FT_MSG_HDR_SIZE];
    size_t           rx_have;
    ft_msg           rx_m;
    pend            *rx_p;
    uint8_t         *rx_dst;
    uint64_t         rx_len, rx_done;
    uint8_t          rx_detail[FT_MSG_MAX_DETAIL];
    /* UCX data path */
    ucp_context_h    ctx;
    ucp_worker_h     w;
    int              efd;
    rx_token        *dropped;   /* abandoned receives, freed with the worker */
    int              ctx_tcp;     /* the context may use TCP              */
    ucp_ep_h         ep;
    int              use_ucx;
    /* shared-memory path: the node copies to/from our memory (cma.h) */
    int              cma;
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
    FT_LOG(FT_LOG_WARN, "ucx://%s: UCX path failed: %s", c->where, ucs_status_string(status));
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
        t->abandoned = 2;   /* called back: freed when the worker goes */
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

/* A reply header arrived for p: record it; return where its payload of
 * len bytes goes (NULL: nowhere, p carries the error). */
static uint8_t *reply_begin(pend *p, const ft_msg *m, size_t len)
{
    p->replied = 1;
    p->st = (ft_status)m->status;
    p->aux = m->aux;
    p->arg = m->arg;
    if (m->status != FT_OK || len == 0) return NULL;
    if (p->fixed) {
        if (len > p->fixed_cap) {
            p->st = FT_ERR_PROTOCOL;
            snprintf(p->detail, sizeof p->detail, "reply of %zu bytes, expected <= %zu", len,
                     p->fixed_cap);
            return NULL;
        }
        p->rlen = len;
        return p->fixed;
    }
    if (!p->rbuf) {
        p->st = FT_ERR_PROTOCOL;
        snprintf(p->detail, sizeof p->detail, "unexpected reply data");
        return NULL;
    }
    if (ft_buf_reserve(p->rbuf, len) != FT_OK) {
        p->st = p->rbuf->fixed ? FT_ERR_BUFFER_SMALL : FT_ERR_NOMEM;
        snprintf(p->detail, sizeof p->detail, "no room for %zu reply bytes", len);
        return NULL;
    }
    p->rlen = len;
    return p->rbuf->p;
}

static void reply_detail(pend *p, const void *text, size_t n)
{
    if (n > sizeof p->detail - 1) n = sizeof p->detail - 1;
    if (n) memcpy(p->detail, text, n);
    p->detail[n] = 0;
    for (size_t i = 0; i < n; i++)   /* text from the peer: printable only */
        if ((unsigned char)p->detail[i] < 0x20 || (unsigned char)p->detail[i] > 0x7e) p->detail[i] = '?';
    if (!n) snprintf(p->detail, sizeof p->detail, "node: %s", ft_status_str(p->st));
}

static ucs_status_t reply_cb(void *arg, const void *header, size_t hlen, void *data,
                             size_t len, const ucp_am_recv_param_t *param)
{
    ucx_client *c = arg;
    ft_msg m;
    if (ft_msg_parse(header, hlen, 1, UINT64_MAX, &m) != FT_OK || m.data_len != len) {
        FT_LOG(FT_LOG_WARN, "ucx://%s: malformed reply dropped: %s", c->where, ft_last_error());
        return UCS_OK;
    }
    if (m.session != c->session) return UCS_OK;   /* not from our node's session */
    pend *p = c->pending;
    while (p && p->id != m.req_id) p = p->next;
    if (!p || p->replied || !p->via_ucx) return UCS_OK;   /* late reply to a failed request */
    const int rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
    if (m.status != FT_OK) {
        p->replied = 1;
        p->st = (ft_status)m.status;
        if (!rndv) reply_detail(p, data, len); else reply_detail(p, NULL, 0);
        return UCS_OK;
    }
    uint8_t *dst = reply_begin(p, &m, len);
    if (!dst) return UCS_OK;
    if (rndv) {
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

/* ------------------------------------------------------------ TCP path */

static void rx_reset(ucx_client *c)
{
    c->rxp = 0;
    c->rx_have = 0;
    c->rx_p = NULL;
    c->rx_dst = NULL;
    c->rx_len = c->rx_done = 0;
}

/* Write what the socket takes. Returns 1 if anything moved. */
static int tcp_flush(ucx_client *c)
{
    int moved = 0;
    while (!c->dead && c->out_head) {
        pend *p = c->out_head;
        struct iovec iov[2];
        int n = 0;
        if (p->sent < p->hlen) {
            iov[n].iov_base = p->hdr + p->sent;
            iov[n++].iov_len = p->hlen - p->sent;
        }
        if (p->dlen) {
            size_t d = p->sent > p->hlen ? p->sent - p->hlen : 0;
            iov[n].iov_base = (void *)(p->data + d);
            iov[n++].iov_len = p->dlen - d;
        }
        struct msghdr mh;
        memset(&mh, 0, sizeof mh);
        mh.msg_iov = iov;
        mh.msg_iovlen = (size_t)n;
        ssize_t w = sendmsg(c->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) break;
            FT_LOG(FT_LOG_WARN, "ucx://%s: connection failed: %s", c->where, strerror(errno));
            c->dead = 1;
            fail_all(c, FT_ERR_NET, strerror(errno));
            break;
        }
        moved = 1;
        p->sent += (size_t)w;
        if (p->sent == p->hlen + p->dlen) {
            p->send_pending = 0;
            c->out_head = p->qnext;
            if (!c->out_head) c->out_tail = NULL;
        }
    }
    return moved;
}

/* Read replies that have arrived (up to a budget). Returns 1 if anything
 * moved. */
static int tcp_read(ucx_client *c)
{
    int moved = 0;
    size_t budget = 8u << 20;
    uint8_t sink[16384];
    while (!c->dead && budget) {
        uint8_t *dst;
        size_t want;
        if (c->rxp == 0) {
            dst = c->rx_hdr + c->rx_have;
            want = FT_MSG_HDR_SIZE - c->rx_have;
        } else {
            want = (size_t)(c->rx_len - c->rx_done);
            if (c->rxp == 1) {
                dst = c->rx_dst + c->rx_done;
            } else {
                dst = sink;
                if (want > sizeof sink) want = sizeof sink;
            }
        }
        if (want > budget) want = budget;
        ssize_t r = recv(c->fd, dst, want, MSG_DONTWAIT);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        if (r <= 0) {
            const char *why = r == 0 ? "the node closed the connection" : strerror(errno);
            FT_LOG(FT_LOG_WARN, "ucx://%s: %s", c->where, why);
            c->dead = 1;
            fail_all(c, FT_ERR_NET, why);
            break;
        }
        moved = 1;
        budget -= (size_t)r;
        if (c->rxp == 0) {
            c->rx_have += (size_t)r;
            if (c->rx_have < FT_MSG_HDR_SIZE) continue;
            ft_msg m;
            if (ft_msg_parse(c->rx_hdr, FT_MSG_HDR_SIZE, 1, UINT64_MAX, &m) != FT_OK) {
                char why[200];
                snprintf(why, sizeof why, "malformed reply: %s", ft_last_error());
                FT_LOG(FT_LOG_WARN, "ucx://%s: %s", c->where, why);
                c->dead = 1;
                fail_all(c, FT_ERR_PROTOCOL, why);
                break;
            }
            c->rx_m = m;
            c->rx_len = m.data_len;
            c->rx_done = 0;
            pend *p = c->pending;
            while (p && p->id != m.req_id) p = p->next;
            if (p && (p->replied || p->via_ucx)) p = NULL;
            uint8_t *d = NULL;
            if (p && m.status != FT_OK) {
                p->replied = 1;
                p->st = (ft_status)m.status;
                if (m.data_len <= sizeof c->rx_detail) d = c->rx_detail;
                else reply_detail(p, NULL, 0);
            } else if (p) {
                d = reply_begin(p, &m, (size_t)m.data_len);
            }
            c->rx_have = 0;
            if (m.data_len == 0) {
                if (p && m.status != FT_OK) reply_detail(p, NULL, 0);
                rx_reset(c);
                continue;
            }
            c->rx_p = d ? p : NULL;
            c->rx_dst = d;
            c->rxp = d ? 1 : 2;
            if (d && p) p->recv_pending = 1;
        } else {
            c->rx_done += (uint64_t)r;
            if (c->rx_done < c->rx_len) continue;
            pend *p = c->rx_p;
            if (p) {
                p->recv_pending = 0;
                if (c->rx_dst == c->rx_detail) reply_detail(p, c->rx_detail, (size_t)c->rx_len);
            }
            rx_reset(c);
        }
    }
    return moved;
}

/* Force-close the UCX endpoint: completes its outstanding sends (with an
 * error); receives it leaves pending are abandoned (see rx_token). */
static void close_ep_locked(ucx_client *c)
{
    if (!c->ep) return;
    ucp_request_param_t p;
    memset(&p, 0, sizeof p);
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_EP_CLOSE_FLAG_FORCE;
    ucp_ep_h ep = c->ep;
    c->ep = NULL;
    ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &p);
    if (r && !UCS_PTR_IS_ERR(r)) {
        double dl = ft_now() + 5.0;
        while (ucp_request_check_status(r) == UCS_INPROGRESS && ft_now() < dl)
            ucp_worker_progress(c->w);
        ucp_request_free(r);
    }
    int abandoned = 0;
    for (pend *q = c->pending; q; q = q->next)
        if (q->via_ucx && q->recv_pending && q->rx) {
            q->rx->abandoned = 1;
            q->rx->next = c->dropped;
            c->dropped = q->rx;
            q->rx = NULL;
            q->recv_pending = 0;
            abandoned++;
            if (q->st == FT_OK) {
                q->st = FT_ERR_NET;
                snprintf(q->detail, sizeof q->detail, "connection closed during a receive");
            }
        }
    /* A receive still posted after a force close can yet be written: UCX
     * (1.13) keeps the rendezvous request on the worker, and fragments
     * already taken off the wire, or an RDMA put of a live peer, land in
     * its buffer, which our caller frees when we return the error. Only
     * destroying the worker (its requests, its memory registrations) ends
     * them: the next call opens a new one. */
    if (abandoned && c->w) {
        ucp_worker_destroy(c->w);
        ucp_cleanup(c->ctx);
        c->w = NULL;
        c->ctx = NULL;
        c->efd = -1;
        while (c->dropped) {
            rx_token *t = c->dropped;
            c->dropped = t->next;
            free(t);
        }
    }
}

/* Close the session: fail every pending request, drop the UCX endpoint
 * and the socket. */
static void close_session_locked(ucx_client *c)
{
    fail_all(c, FT_ERR_NET, "connection closed");
    close_ep_locked(c);
    for (pend *q = c->pending; q; q = q->next)
        if (q->recv_pending || q->send_pending) {
            q->recv_pending = q->send_pending = 0;
            if (q->st == FT_OK) {
                q->st = FT_ERR_NET;
                snprintf(q->detail, sizeof q->detail, "connection closed during a transfer");
            }
        }
    c->out_head = c->out_tail = NULL;
    rx_reset(c);
    if (c->fd >= 0) close(c->fd);
    c->fd = -1;
    c->use_ucx = 0;
    c->cma = 0;
    c->session = 0;
    c->dead = 0;
    pthread_cond_broadcast(&c->cond);
}

static int progress_locked(ucx_client *c)
{
    int moved = 0;
    if (c->w) moved |= ucp_worker_progress(c->w) != 0;
    if (c->fd >= 0 && !c->dead) {
        moved |= tcp_flush(c);
        moved |= tcp_read(c);
    }
    if (moved) c->last_progress = ft_now();
    return moved;
}

static int pend_done(const pend *p)
{
    return p->replied && !p->send_pending && !p->recv_pending;
}

/* Wait until done(p) (pend_done, or only its send when send_only). */
static ft_status wait_until(ucx_client *c, pend *p, int send_only, double deadline)
{
    for (;;) {
        if (send_only ? (!p->send_pending || p->replied) : pend_done(p)) break;
        if (c->dead) {
            close_session_locked(c);
            continue;
        }
        if (c->progressing) {
            /* another thread sleeps in poll; it wakes within 5 ms */
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 5000000L;
            if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
            pthread_cond_timedwait(&c->cond, &c->lock, &ts);
        } else if (progress_locked(c)) {
            pthread_cond_broadcast(&c->cond);
            continue;
        }
        if (send_only ? (!p->send_pending || p->replied) : pend_done(p)) break;
        /* time out only when the deadline passed AND the connection has been
         * idle for a whole timeout: a large transfer on a slow link that is
         * still moving is not cut off (a dead peer is caught by PEER mode
         * and TCP keepalive) */
        double now = ft_now();
        if (now > deadline && now - c->last_progress > c->timeout_ms / 1000.0) {
            if (!p->replied) {
                FT_LOG(FT_LOG_WARN, "ucx://%s: request timed out; reconnecting", c->where);
                p->replied = 1;
                p->st = FT_ERR_TIMEOUT;
                snprintf(p->detail, sizeof p->detail, "no reply within %d ms", c->timeout_ms);
            }
            c->dead = 1;
            continue;
        }
        if (c->progressing) continue;
        if (c->w && ucp_worker_arm(c->w) == UCS_ERR_BUSY) continue;
        struct pollfd pfd[2];
        nfds_t n = 0;
        if (c->fd >= 0) {
            pfd[n].fd = c->fd;
            pfd[n].events = (short)(POLLIN | (c->out_head ? POLLOUT : 0));
            pfd[n++].revents = 0;
        }
        if (c->w) {
            pfd[n].fd = c->efd;
            pfd[n].events = POLLIN;
            pfd[n++].revents = 0;
        }
        c->progressing = 1;
        pthread_mutex_unlock(&c->lock);
        poll(pfd, n, 5);
        pthread_mutex_lock(&c->lock);
        c->progressing = 0;
    }
    return p->st;
}

static ft_status wait_locked(ucx_client *c, pend *p, double deadline)
{
    return wait_until(c, p, 0, deadline);
}

/* Queue a request (p zeroed by the caller except rbuf/fixed/body). Lock
 * held, session up. The reply completes p; wait with wait_locked, then
 * unlink_locked. The payload must stay valid until p's send is done. */
static void submit_x(ucx_client *c, pend *p, uint16_t op, const char *key, const void *data,
                     size_t dlen, uint64_t aux, uint64_t arg, uint64_t xid)
{
    p->id = ++c->next_id;
    p->next = c->pending;
    c->pending = p;
    ft_msg m;
    memset(&m, 0, sizeof m);
    m.opcode = op;
    m.req_id = p->id;
    m.key = key;
    m.key_len = key ? (uint32_t)strlen(key) : 0;
    m.data_len = dlen;
    m.aux = aux;
    m.arg = arg;
    m.xid = xid;
    m.session = c->session;
    p->hlen = ft_msg_encode(p->hdr, &m);
    if (c->fd < 0 || c->dead) {
        p->replied = 1;
        p->st = FT_ERR_NET;
        snprintf(p->detail, sizeof p->detail, "not connected");
        return;
    }
    p->via_ucx = c->use_ucx;
    if (!c->use_ucx) {
        p->data = data;
        p->dlen = dlen;
        p->sent = 0;
        p->send_pending = 1;
        p->qnext = NULL;
        if (c->out_tail) c->out_tail->qnext = p; else c->out_head = p;
        c->out_tail = p;
        tcp_flush(c);
        return;
    }
    ucp_request_param_t rp;
    memset(&rp, 0, sizeof rp);
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    rp.cb.send = send_cb;
    rp.user_data = p;
    ucs_status_ptr_t r = ucp_am_send_nbx(c->ep, FT_AM_REQUEST, p->hdr, p->hlen, data, dlen, &rp);
    if (UCS_PTR_IS_ERR(r)) {
        p->replied = 1;
        p->st = FT_ERR_NET;
        snprintf(p->detail, sizeof p->detail, "send: %s", ucs_status_string(UCS_PTR_STATUS(r)));
    } else if (r) {
        p->send_pending = 1;
    }
}

static void submit_locked(ucx_client *c, pend *p, uint16_t op, const char *key, const void *data,
                          size_t dlen)
{
    submit_x(c, p, op, key, data, dlen, 0, 0, 0);
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

/* Send one request and wait for its reply. Lock held, session up. */
static ft_status call_locked(ucx_client *c, uint16_t op, const char *key, const void *data,
                             size_t dlen, ft_buf *rbuf, size_t *rlen)
{
    pend p;
    memset(&p, 0, sizeof p);
    p.rbuf = rbuf;
    submit_locked(c, &p, op, key, data, dlen);
    ft_status st = wait_locked(c, &p, ft_now() + c->timeout_ms / 1000.0);
    unlink_locked(c, &p);
    if (st != FT_OK) return pend_error(c, &p);
    if (rlen) *rlen = p.rlen;
    return FT_OK;
}

/* ----------------------------------------------------------- handshake */

/* Blocking I/O on the fresh socket (nothing else is in flight yet). */
static ft_status hs_io(ucx_client *c, int out, void *buf, size_t n, double deadline,
                       const char *step)
{
    uint8_t *b = buf;
    while (n) {
        ssize_t r = out ? send(c->fd, b, n, MSG_NOSIGNAL | MSG_DONTWAIT)
                        : recv(c->fd, b, n, MSG_DONTWAIT);
        if (r > 0) {
            b += r;
            n -= (size_t)r;
            continue;
        }
        if (r < 0 && errno == EINTR) continue;
        if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK))
            return ft_set_error(FT_ERR_NET,
                                "ucx://%s: the node closed the connection during %s (it refuses "
                                "an address after repeated failures, and a node older than "
                                "protocol 2 does not speak it: see the node's log)",
                                c->where, step);
        int left = (int)((deadline - ft_now()) * 1000);
        if (left <= 0)
            return ft_set_error(FT_ERR_TIMEOUT,
                                "ucx://%s: no answer to %s within %d ms (is it a FlexTier memory "
                                "node of protocol 2? older nodes spoke UCX sockaddr)",
                                c->where, step, c->timeout_ms);
        struct pollfd pfd = {c->fd, (short)(out ? POLLOUT : POLLIN), 0};
        poll(&pfd, 1, left);
    }
    return FT_OK;
}

static ft_status hs_send(ucx_client *c, uint16_t op, uint64_t arg, const void *data, size_t n,
                         double deadline, const char *step)
{
    uint8_t h[FT_MSG_HDR_SIZE];
    ft_msg m;
    memset(&m, 0, sizeof m);
    m.opcode = op;
    m.req_id = ++c->next_id;
    m.data_len = n;
    m.arg = arg;
    ft_msg_encode(h, &m);
    ft_status st = hs_io(c, 1, h, sizeof h, deadline, step);
    if (st == FT_OK && n) st = hs_io(c, 1, (void *)data, n, deadline, step);
    return st;
}

/* A handshake reply: header parsed into *m, payload (<= cap) into buf. */
static ft_status hs_recv(ucx_client *c, ft_msg *m, uint8_t *buf, size_t cap, double deadline,
                         const char *step)
{
    uint8_t h[FT_MSG_HDR_SIZE];
    ft_status st = hs_io(c, 0, h, sizeof h, deadline, step);
    if (st != FT_OK) return st;
    if (ft_msg_parse(h, sizeof h, 1, cap, m) != FT_OK)
        return ft_set_error(FT_ERR_PROTOCOL, "ucx://%s: bad answer to %s: %s", c->where, step,
                            ft_last_error());
    if (m->data_len && (st = hs_io(c, 0, buf, (size_t)m->data_len, deadline, step)) != FT_OK)
        return st;
    if (m->status != FT_OK) {
        char text[FT_MSG_MAX_DETAIL + 1];
        size_t n = m->data_len < FT_MSG_MAX_DETAIL ? (size_t)m->data_len : FT_MSG_MAX_DETAIL;
        for (size_t i = 0; i < n; i++) text[i] = (buf[i] >= 0x20 && buf[i] < 0x7f) ? (char)buf[i] : '?';
        text[n] = 0;
        return ft_set_error((ft_status)m->status, "ucx://%s: %s refused: %s", c->where, step,
                            n ? text : ft_status_str((ft_status)m->status));
    }
    return FT_OK;
}

/* Open the UCX data path to the node's worker at naddr. */
static ft_status ucx_setup_locked(ucx_client *c, const uint8_t *naddr, size_t nlen, int allow_tcp,
                                  double deadline)
{
    if (c->w && c->ctx_tcp != allow_tcp) {   /* another policy: a new context */
        ucp_worker_destroy(c->w);
        ucp_cleanup(c->ctx);
        c->w = NULL;
        c->ctx = NULL;
    }
    if (!c->w) {
        /* One context per node, on the rail that reaches it: the interface
         * the kernel routed this session's TCP connection through (and,
         * for RDMA, the ports behind it). A client with several NICs
         * (rails) reaches each node through its own; UCX left to choose
         * among all devices tries unreachable ones. UCX over TCP also
         * listens only there. */
        char devs[512] = "";
        struct sockaddr_storage local;
        socklen_t ll = sizeof local;
        if (getsockname(c->fd, (struct sockaddr *)&local, &ll) == 0) ft_net_devices_for(&local, devs, sizeof devs);
        if (!allow_tcp) {   /* RDMA only: the ports behind the netdev, not the netdev itself */
            char *comma = strchr(devs, ',');
            if (comma) memmove(devs, comma + 1, strlen(comma + 1) + 1);
            else devs[0] = 0;
        }
        /* the node writes reply data into our buffers: this thread only
         * checks and decodes what has landed */
        ft_net_ucx_opts uo = {allow_tcp, devs, "put_zcopy", 0, 0, NULL};
        ucs_status_t s = ft_net_ucp_open("flextier-client", &uo, &c->ctx, &c->w, &c->efd);
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
            if (c->w) ucp_worker_destroy(c->w);
            if (c->ctx) ucp_cleanup(c->ctx);
            c->w = NULL;
            c->ctx = NULL;
            return ft_set_error(FT_ERR_NET, "no local UCX transport (%s)", ucs_status_string(s));
        }
        c->ctx_tcp = allow_tcp;
    }
    ucp_address_t *mine = NULL;
    size_t mlen = 0;
    ucs_status_t s = ucp_worker_get_address(c->w, &mine, &mlen);
    if (s != UCS_OK) return ft_set_error(FT_ERR_NET, "UCX worker address: %s", ucs_status_string(s));
    ft_status st = mlen > FT_MSG_MAX_ADDR ? ft_set_error(FT_ERR_NET, "UCX worker address too long")
                                          : hs_send(c, FT_OP_UCXB, 0, mine, mlen, deadline, "UCXB");
    ucp_worker_release_address(c->w, mine);
    ft_msg m;
    uint8_t buf[FT_MSG_MAX_DETAIL];
    if (st == FT_OK) st = hs_recv(c, &m, buf, sizeof buf, deadline, "UCXB");
    if (st != FT_OK) return st;
    s = ft_net_ucp_connect(c->w, naddr, nlen, ep_err_cb, c, &c->ep);
    if (s != UCS_OK) {
        c->ep = NULL;
        return ft_set_error(FT_ERR_NET, "cannot reach the node over UCX: %s", ucs_status_string(s));
    }
    /* check the path with a PING; a failure here falls back to TCP
     * without losing the session */
    c->use_ucx = 1;
    pend p;
    memset(&p, 0, sizeof p);
    submit_locked(c, &p, FT_OP_PING, NULL, NULL, 0);
    double dl = ft_now() + (c->timeout_ms < 10000 ? c->timeout_ms : 10000) / 1000.0;
    while (!pend_done(&p) && !c->dead && ft_now() < dl) {
        if (ucp_worker_progress(c->w)) continue;
        if (ucp_worker_arm(c->w) == UCS_ERR_BUSY) continue;
        struct pollfd pfd = {c->efd, POLLIN, 0};
        poll(&pfd, 1, 5);
    }
    int ok = pend_done(&p) && p.st == FT_OK && !c->dead;
    if (!ok) {
        c->use_ucx = 0;
        c->dead = 0;
        close_ep_locked(c);   /* completes the PING's send before p goes */
        if (p.st == FT_OK) snprintf(p.detail, sizeof p.detail, "no answer over UCX");
    }
    unlink_locked(c, &p);
    if (!ok) return ft_set_error(FT_ERR_NET, "PING over UCX: %s", p.detail[0] ? p.detail : "failed");
    return FT_OK;
}

/* Open the shared-memory path (net/cma.h): take the session's offer,
 * present its nonce on the node's Unix socket (the kernel tells the node
 * who we are; ft_cma_present lets that process reach our memory where
 * Yama asks for it), then confirm. */
static ft_status cma_setup_locked(ucx_client *c, double deadline)
{
    ft_status st;
    ft_msg m;
    uint8_t buf[FT_MSG_MAX_DETAIL > FT_CMA_OFFER_SIZE ? FT_MSG_MAX_DETAIL : FT_CMA_OFFER_SIZE];
    int ufd = -1;
    st = hs_send(c, FT_OP_CMAB, FT_CMAB_OFFER, NULL, 0, deadline, "CMAB");
    if (st == FT_OK) st = hs_recv(c, &m, buf, sizeof buf, deadline, "CMAB");
    if (st == FT_OK && m.data_len != FT_CMA_OFFER_SIZE)
        st = ft_set_error(FT_ERR_PROTOCOL, "ucx://%s: CMAB offer of %llu bytes", c->where,
                          (unsigned long long)m.data_len);
    if (st == FT_OK) st = ft_cma_present(buf, &ufd);
    memset(buf, 0, sizeof buf);
    if (st == FT_OK) st = hs_send(c, FT_OP_CMAB, FT_CMAB_CLAIM, NULL, 0, deadline, "CMAB");
    if (st == FT_OK) st = hs_recv(c, &m, buf, sizeof buf, deadline, "CMAB");
    if (ufd >= 0) close(ufd);
    if (st == FT_OK) c->cma = 1;
    return st;
}

static ft_status connect_locked(ucx_client *c)
{
    if (c->fd >= 0) close_session_locked(c);
    double deadline = ft_now() + c->timeout_ms / 1000.0;
    ft_status st = ft_net_tcp_connect(&c->addr, c->alen, c->timeout_ms, c->where, &c->fd);
    if (st != FT_OK) {
        c->fd = -1;
        return ft_set_error(st, "ucx://%s", ft_last_error());
    }
    ft_hs_client hs;
    uint8_t buf[FT_MSG_PROOF + FT_MSG_MAX_ADDR];
    ft_msg m;
    size_t plen = 0, rest = 0;
    uint8_t proof[FT_MSG_PROOF];
    st = ft_hs_client_init(&hs, c->token_len ? c->token : NULL, c->token_len);
    if (st == FT_OK) st = hs_send(c, FT_OP_HELLO, 0, hs.nc, FT_MSG_NONCE, deadline, "HELLO");
    if (st == FT_OK) st = hs_recv(c, &m, buf, FT_MSG_NONCE, deadline, "HELLO");
    if (st == FT_OK && (st = ft_hs_client_challenge(&hs, &m, buf, proof, &plen)) != FT_OK)
        st = ft_set_error(st, "ucx://%s: %s", c->where, ft_last_error());
    if (st == FT_OK)
        st = hs_send(c, FT_OP_AUTH, (c->mode == MODE_AUTO || c->mode == MODE_UCX) ? FT_CLIENT_UCX : 0,
                     proof, plen, deadline,
                     "AUTH");
    if (st == FT_OK) st = hs_recv(c, &m, buf, sizeof buf, deadline, "AUTH");
    if (st == FT_OK && (st = ft_hs_client_finish(&hs, &m, buf, &rest)) != FT_OK)
        st = ft_set_error(st, "ucx://%s: %s", c->where, ft_last_error());
    memset(&hs, 0, sizeof hs);
    memset(proof, 0, sizeof proof);
    if (st == FT_OK) {
        c->session = m.aux;
        c->last_progress = ft_now();
        rx_reset(c);
        const int offered = (m.arg & FT_NODE_UCX) && m.data_len > rest;
        const int local = (m.arg & FT_NODE_LOCAL) != 0;
        if (local && (c->mode == MODE_AUTO || c->mode == MODE_CMA)) {
            ft_status cs = cma_setup_locked(c, deadline);
            if (cs != FT_OK) {
                if (c->mode == MODE_CMA) st = ft_set_error(cs, "ucx://%s: shared-memory path: %s", c->where, ft_last_error());
                else FT_LOG(FT_LOG_INFO, "ucx://%s: no shared-memory path (%s)", c->where, ft_last_error());
            }
        } else if (c->mode == MODE_CMA) {
            st = ft_set_error(FT_ERR_UNSUPPORTED,
                              "ucx://%s: FLEXTIER_TRANSPORT=cma but the node is not on this host", c->where);
        }
        if (st == FT_OK && c->cma) {
            /* the shared-memory path it is */
        } else if (st == FT_OK && offered && (c->mode == MODE_AUTO || c->mode == MODE_UCX)) {
            ft_status us = ucx_setup_locked(c, buf + rest, (size_t)m.data_len - rest,
                                            (m.arg & FT_NODE_UCX_TCP) != 0, deadline);
            if (us != FT_OK) {
                if (c->mode == MODE_UCX) st = ft_set_error(us, "ucx://%s: UCX data path: %s", c->where, ft_last_error());
                else FT_LOG(FT_LOG_INFO, "ucx://%s: no UCX data path (%s); using TCP", c->where,
                            ft_last_error());
            }
        } else if (st == FT_OK && c->mode == MODE_UCX) {
            st = ft_set_error(FT_ERR_UNSUPPORTED,
                              "ucx://%s: FLEXTIER_TRANSPORT=ucx but the node offers no UCX data "
                              "path (it has none, or only TCP without --trusted-network)", c->where);
        }
    }
    if (st != FT_OK) {
        char why[400];
        snprintf(why, sizeof why, "%s", ft_last_error());
        close_session_locked(c);
        return ft_set_error(st, "%s", why);
    }
    FT_LOG(FT_LOG_INFO, "ucx://%s: connected (%s)", c->where,
           c->cma ? "shared memory" : c->use_ucx ? "UCX data path" : "TCP");
    return FT_OK;
}

static ft_status ensure_locked(ucx_client *c)
{
    if (c->dead) close_session_locked(c);
    return c->fd >= 0 ? FT_OK : connect_locked(c);
}

static ft_status call(ucx_client *c, uint16_t op, const char *key, const void *data,
                      size_t dlen, ft_buf *rbuf, size_t *rlen)
{
    pthread_mutex_lock(&c->lock);
    ft_status st = ensure_locked(c);
    if (st == FT_OK) st = call_locked(c, op, key, data, dlen, rbuf, rlen);
    pthread_mutex_unlock(&c->lock);
    return st;
}

/* ------------------------------------------------------------ backend */

/* An already encoded frame, straight from the caller's buffer: one PUT,
 * or on the shared-memory path (large frames) PUTB + one PUTDV the node
 * reads itself + PUTC with the header. */
static ft_status cl_put(ft_store_backend *b, const char *key, const void *frame, size_t size)
{
    ucx_client *c = (ucx_client *)b;
    ft_frame_info fi;
    pthread_mutex_lock(&c->lock);
    ft_status st = ensure_locked(c);
    int byref = st == FT_OK && c->cma && size > FT_READ_FIRST &&
                ft_frame_parse(frame, size, &fi) == FT_OK && fi.frame_size == size &&
                fi.header_size < size;
    if (st != FT_OK || !byref) {
        if (st == FT_OK) st = call_locked(c, FT_OP_PUT, key, frame, size, NULL, NULL);
        pthread_mutex_unlock(&c->lock);
        return st;
    }
    const uint64_t xid = ++c->next_xid, hs = fi.header_size;
    pend pb, pd, pc;
    memset(&pb, 0, sizeof pb);
    memset(&pd, 0, sizeof pd);
    memset(&pc, 0, sizeof pc);
    ft_put_le64(pd.body, (uint64_t)(uintptr_t)((const uint8_t *)frame + hs));
    ft_put_le64(pd.body + 8, size - hs);
    submit_x(c, &pb, FT_OP_PUTB, key, NULL, 0, hs, size, xid);
    submit_x(c, &pd, FT_OP_PUTDV, NULL, pd.body, FT_MSG_REF_SIZE, 0, hs, xid);
    submit_x(c, &pc, FT_OP_PUTC, key, frame, hs, 0, size, xid);
    double dl = ft_now() + c->timeout_ms / 1000.0;
    pend *all[3] = {&pb, &pd, &pc};
    for (int i = 0; i < 3; i++) {
        ft_status w = wait_locked(c, all[i], dl);
        unlink_locked(c, all[i]);
        if (w != FT_OK && st == FT_OK) st = pend_error(c, all[i]);
    }
    pthread_mutex_unlock(&c->lock);
    return st;
}


static ft_status cl_del(ft_store_backend *b, const char *key)
{
    return call((ucx_client *)b, FT_OP_DEL, key, NULL, 0, NULL, NULL);
}

static ft_status cl_stat(ft_store_backend *b, const char *key, ft_frame_info *info)
{
    ft_buf buf = {0};
    size_t n = 0;
    ft_status st = call((ucx_client *)b, FT_OP_STAT, key, NULL, 0, &buf, &n);
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
    ft_status st = call((ucx_client *)b, FT_OP_LIST, NULL, NULL, 0, &buf, &len);
    if (st == FT_OK) st = ft_msg_list_parse(buf.p, len, keys, n);
    ft_buf_free(&buf);
    return st;
}

static ft_status cl_stats(ft_store_backend *b, ft_store_stats *out)
{
    ft_buf buf = {0};
    size_t len = 0;
    ft_status st = call((ucx_client *)b, FT_OP_STAT, NULL, NULL, 0, &buf, &len);
    if (st == FT_OK) st = ft_msg_stats_parse(buf.p, len, out);
    ft_buf_free(&buf);
    return st;
}

/* ------------------------------------------------------ pipelined write
 *
 * A frame of more than FT_PIPE_MIN bytes is written in pieces of about
 * FT_PIECE raw bytes: PUTB reserves the frame's worst case on the node,
 * each piece is encoded (in parallel on the codec threads) and sent as a
 * PUTD while the next piece is being encoded, and PUTC brings the header
 * (with every chunk's size and checksum) last; the node commits then.
 * Raw pieces are not copied at all: they go out from the caller's tensor,
 * hashed once on the way. FT_PIPE_DEPTH pieces are in flight. */

#define FT_PIECE      (4u << 20)
#define FT_PIPE_MIN   (2u << 20)
#define FT_PIPE_DEPTH 3

static ft_status write_whole(ucx_client *c, const char *key, ft_codec_ctx *cc, ft_buf *scratch,
                             const ft_tensor *t, const ft_codec_params *cp, size_t bound)
{
    ft_status st = ft_buf_reserve(scratch, bound);
    size_t fsize = 0;
    if (st == FT_OK) st = ft_encode(cc, cp, t, scratch->p, scratch->cap, &fsize);
    if (st == FT_OK) st = call(c, FT_OP_PUT, key, scratch->p, fsize, NULL, NULL);
    return st;
}

static ft_status cl_write(ft_store_backend *b, const char *key, ft_codec_ctx *cc, ft_buf *scratch,
                          const ft_tensor *t, const ft_codec_params *cp)
{
    ucx_client *c = (ucx_client *)b;
    ft_encoder *e = NULL;
    ft_status st = ft_encoder_begin(cc, cp, t, &e);
    if (st != FT_OK) return st;
    uint32_t nch = 0;
    size_t hsize = 0, bound = 0;
    int zc = 0;
    ft_encoder_info(e, &nch, &hsize, &bound, &zc);
    if (bound <= FT_PIPE_MIN || nch < 2) {
        ft_encoder_free(e);
        return write_whole(c, key, cc, scratch, t, cp, bound);
    }
    /* pieces: runs of whole chunks of about FT_PIECE raw bytes */
    uint32_t per = 1;
    size_t one = ft_encoder_raw_bytes(e, 0, 1);
    if (one && one < FT_PIECE) per = (uint32_t)(FT_PIECE / one);
    size_t slot = zc ? 0 : ft_encoder_run_bound(e, 0, per);
    if ((st = ft_buf_reserve(scratch, slot * FT_PIPE_DEPTH + hsize)) != FT_OK) {
        ft_encoder_free(e);
        return st;
    }
    pend pb, pc, pd[FT_PIPE_DEPTH];
    memset(&pb, 0, sizeof pb);
    memset(&pc, 0, sizeof pc);
    memset(pd, 0, sizeof pd);
    int used[FT_PIPE_DEPTH] = {0};
    ft_status first_err = FT_OK;
    char why[300] = "";
    pthread_mutex_lock(&c->lock);
    st = ensure_locked(c);
    if (st != FT_OK) {
        pthread_mutex_unlock(&c->lock);
        ft_encoder_free(e);
        return st;
    }
    const uint64_t xid = ++c->next_xid;
    const double dl0 = ft_now();
    submit_x(c, &pb, FT_OP_PUTB, key, NULL, 0, hsize, bound, xid);
    uint64_t off = hsize;
    uint32_t k = 0;
    for (uint32_t first = 0; first < nch && first_err == FT_OK; first += per, k++) {
        uint32_t cnt = nch - first < per ? nch - first : per;
        unsigned s = k % FT_PIPE_DEPTH;
        if (used[s]) {   /* this slot's piece must be on the wire and answered */
            ft_status w = wait_locked(c, &pd[s], dl0 + c->timeout_ms / 1000.0);
            unlink_locked(c, &pd[s]);
            used[s] = 0;
            if (w != FT_OK && first_err == FT_OK) {
                first_err = w;
                pend_error(c, &pd[s]);
                snprintf(why, sizeof why, "%s", ft_last_error());
            }
        }
        if (pb.replied && pb.st != FT_OK) break;   /* e.g. no space: stop early */
        if (first_err != FT_OK) break;
        /* encode while earlier pieces move (the lock is free meanwhile) */
        pthread_mutex_unlock(&c->lock);
        const void *payload = NULL;
        size_t psize = 0;
        ft_status es = ft_encoder_encode(e, first, cnt, scratch->p + (size_t)s * slot, slot,
                                         &payload, &psize);
        pthread_mutex_lock(&c->lock);
        if (es != FT_OK) {
            first_err = es;
            snprintf(why, sizeof why, "%s", ft_last_error());
            break;
        }
        if (c->dead || c->fd < 0) break;   /* the waits below report it */
        memset(&pd[s], 0, sizeof pd[s]);
        if (c->cma) {   /* the node reads the piece from our memory */
            ft_put_le64(pd[s].body, (uint64_t)(uintptr_t)payload);
            ft_put_le64(pd[s].body + 8, psize);
            submit_x(c, &pd[s], FT_OP_PUTDV, NULL, pd[s].body, FT_MSG_REF_SIZE, 0, off, xid);
        } else {
            submit_x(c, &pd[s], FT_OP_PUTD, NULL, payload, psize, 0, off, xid);
        }
        used[s] = 1;
        off += psize;
        progress_locked(c);
    }
    /* the header last; after a failure a placeholder of the same size
     * closes the transfer on the node */
    uint8_t *hdr = scratch->p + (size_t)FT_PIPE_DEPTH * slot;
    uint64_t fsize = off;
    int complete = first_err == FT_OK && !(pb.replied && pb.st != FT_OK) && k * (uint64_t)per >= nch;
    if (complete) {
        ft_status hs = ft_encoder_header(e, hdr, hsize, &fsize);
        if (hs != FT_OK) {
            first_err = hs;
            snprintf(why, sizeof why, "%s", ft_last_error());
            complete = 0;
        }
    }
    if (!complete) {
        memset(hdr, 0, hsize);
        fsize = hsize;
    }
    if (c->fd >= 0 && !c->dead)
        submit_x(c, &pc, FT_OP_PUTC, key, hdr, hsize, 0, fsize, xid);
    else
        pc.replied = 1, pc.st = FT_ERR_NET, snprintf(pc.detail, sizeof pc.detail, "connection lost");
    double dl = ft_now() + c->timeout_ms / 1000.0;
    ft_status sb = wait_locked(c, &pb, dl);
    unlink_locked(c, &pb);
    ft_status sc = wait_locked(c, &pc, dl);
    unlink_locked(c, &pc);
    for (unsigned s = 0; s < FT_PIPE_DEPTH; s++)
        if (used[s]) {
            ft_status w = wait_locked(c, &pd[s], dl);
            unlink_locked(c, &pd[s]);
            if (w != FT_OK && first_err == FT_OK) {
                first_err = w;
                pend_error(c, &pd[s]);
                snprintf(why, sizeof why, "%s", ft_last_error());
            }
        }
    ft_status st_out = FT_OK;
    if (sb != FT_OK) {
        st_out = pend_error(c, &pb);
    } else if (first_err != FT_OK) {
        st_out = ft_set_error(first_err, "%s", why);
    } else if (sc != FT_OK) {
        st_out = pend_error(c, &pc);
    }
    pthread_mutex_unlock(&c->lock);
    ft_encoder_free(e);
    /* the worst case did not fit but the frame itself may (a compressing
     * codec): encode it whole and send its exact size */
    if (st_out == FT_ERR_NO_SPACE && sb != FT_OK && !zc && !ft_codec_is_lossy(cp->codec))
        return write_whole(c, key, cc, scratch, t, cp, bound);
    return st_out;
}

/* ------------------------------------------------------ pipelined read
 *
 * A read asks for the first FT_READ_FIRST bytes of the frame (GETR; on the
 * shared-memory path FT_READ_FIRST_CMA); a
 * frame that fits is decoded whole. A larger one is fetched in further
 * ranges, FT_READ_DEPTH in flight, all pinned to the version the first
 * reply named (a concurrent overwrite makes them fail with FT_ERR_BUSY and
 * the read starts over), and each chunk is decoded (and its hash checked)
 * as soon as its bytes have arrived, while later ranges are on the wire.
 * A raw frame read in its own dtype skips the staging buffer: its ranges
 * land in the output itself and each chunk's checksum is verified in
 * place. */


static void range_body(pend *p, uint64_t ver, uint64_t off, uint64_t len)
{
    ft_put_le64(p->body, ver);
    ft_put_le64(p->body + 8, off);
    ft_put_le64(p->body + 16, len);
}

/* Ask for frame bytes [off, off + len) into p->fixed: inline (GETR) or,
 * on the shared-memory path, by reference (GETRV: the node writes them
 * into p->fixed itself). Lock held. */
static void submit_range(ucx_client *c, pend *p, const char *key, uint64_t ver, uint64_t off,
                         uint64_t len)
{
    range_body(p, ver, off, len);
    if (c->cma) {
        p->byref = 1;
        ft_put_le64(p->body + 24, (uint64_t)(uintptr_t)p->fixed);
        ft_put_le64(p->body + 32, p->fixed_cap);
        submit_locked(c, p, FT_OP_GETRV, key, p->body, FT_MSG_GETRV_SIZE);
    } else {
        submit_locked(c, p, FT_OP_GETR, key, p->body, FT_MSG_RANGE_SIZE);
    }
}

/* Bytes a completed range request delivered (a node that claims more than
 * it was given room for is broken: 0, which no caller accepts). */
static size_t range_got(const pend *p)
{
    if (!p->byref) return p->rlen;
    return p->arg <= p->fixed_cap ? (size_t)p->arg : 0;
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

/* Ask for frame bytes [off, off + len) into p->fixed and wait for them
 * (submit_range); lock held. */
static ft_status range_wait_locked(ucx_client *c, pend *p, const char *key, uint64_t ver, uint64_t off,
                                   uint64_t len)
{
    submit_range(c, p, key, ver, off, len);
    ft_status st = wait_locked(c, p, ft_now() + c->timeout_ms / 1000.0);
    unlink_locked(c, p);
    return st != FT_OK ? pend_error(c, p) : FT_OK;
}

/* Wait for a later range of a read (version ver, want bytes) and, with
 * check (no error yet: the first one's message is kept), check its
 * reply; lock held. */
static ft_status range_done_locked(ucx_client *c, pend *p, uint64_t ver, size_t want, int check)
{
    ft_status w = wait_locked(c, p, ft_now() + c->timeout_ms / 1000.0);
    unlink_locked(c, p);
    if (!check) return FT_OK;
    if (w != FT_OK) return pend_error(c, p);
    if (p->aux != ver) return ft_set_error(FT_ERR_BUSY, "tensor replaced during read");
    if (range_got(p) != want) return ft_set_error(FT_ERR_PROTOCOL, "range reply of %zu bytes", range_got(p));
    return FT_OK;
}

/* The frame's header from the got bytes of its first range (first_len
 * asked for) at buf: FT_OK with *fi; FT_ERR_BUFFER_SMALL, no error set,
 * where the header is larger than the range (read the frame whole);
 * else the frame is corrupt. */
static ft_status first_info(const ucx_client *c, const char *key, const uint8_t *buf, size_t got,
                            size_t first_len, ft_frame_info *fi)
{
    ft_status st = ft_frame_parse(buf, got, fi);
    if (st == FT_ERR_BUFFER_SMALL && got == first_len) {
        ft_clear_error();
        return FT_ERR_BUFFER_SMALL;
    }
    if (st != FT_OK) return ft_set_error(FT_ERR_CORRUPT, "ucx://%s: '%s': %s", c->where, key, ft_last_error());
    if (fi->frame_size < got)
        return ft_set_error(FT_ERR_CORRUPT, "ucx://%s: '%s': frame size mismatch", c->where, key);
    return FT_OK;
}

/* A whole frame on the shared-memory path: the node writes it into out
 * itself (GETRV), in ranges. The first, as large as out has room for (up
 * to FT_READ_RANGE_CMA), gives the frame's size and version; the rest
 * follow FT_READ_DEPTH in flight. 1 in *tcp where the frame's header is
 * larger than the first range (nothing read: the caller asks by GET).
 * Before, a GET on this path came back on the TCP connection, the node's
 * send and the client's receive each a copy by the kernel: the h2048
 * Llama's layers on a loopback node at 2.1-2.6 GB/s, the node's core
 * half in _copy_from_iter. */
static ft_status get_byref(ucx_client *c, const char *key, ft_buf *out, size_t *size, int *tcp)
{
    *tcp = 0;
    size_t first_len = out->cap > FT_READ_FIRST_CMA ? out->cap : FT_READ_FIRST_CMA;
    if (first_len > FT_READ_RANGE_CMA) first_len = FT_READ_RANGE_CMA;
    if (out->fixed && out->cap < first_len) first_len = out->cap;
    ft_status st = ft_buf_reserve(out, first_len ? first_len : 1);
    if (st != FT_OK) return st;
    pend first;
    memset(&first, 0, sizeof first);
    first.fixed = out->p;
    first.fixed_cap = first_len;
    pthread_mutex_lock(&c->lock);
    st = ensure_locked(c);
    if (st == FT_OK && !c->cma) {   /* the path changed (a reconnect) */
        pthread_mutex_unlock(&c->lock);
        *tcp = 1;
        return FT_OK;
    }
    if (st == FT_OK) st = range_wait_locked(c, &first, key, 0, 0, first_len);
    pthread_mutex_unlock(&c->lock);
    if (st != FT_OK) return st;
    const uint64_t ver = first.aux;
    const size_t got = range_got(&first);
    ft_frame_info fi;
    st = first_info(c, key, out->p, got, first_len, &fi);
    if (st == FT_ERR_BUFFER_SMALL) {
        *tcp = 1;
        return FT_OK;
    }
    if (st != FT_OK) return st;
    if (fi.frame_size == got) {
        *size = got;
        return FT_OK;
    }
    if (fi.frame_size > SIZE_MAX) return ft_set_error(FT_ERR_NOMEM, "frame of %llu bytes",
                                                      (unsigned long long)fi.frame_size);
    if (out->fixed) st = ft_buf_reserve(out, (size_t)fi.frame_size);
    else st = buf_grow_keep(out, (size_t)fi.frame_size, got);
    if (st != FT_OK) return st;
    pend pr[FT_READ_DEPTH];
    size_t plen[FT_READ_DEPTH];
    unsigned head = 0, nfly = 0;
    uint64_t next_off = got;
    pthread_mutex_lock(&c->lock);
    for (;;) {
        while (st == FT_OK && nfly < FT_READ_DEPTH && next_off < fi.frame_size) {
            unsigned k = (head + nfly) % FT_READ_DEPTH;
            uint64_t len = fi.frame_size - next_off;
            if (len > FT_READ_RANGE_CMA) len = FT_READ_RANGE_CMA;
            memset(&pr[k], 0, sizeof pr[k]);
            pr[k].fixed = out->p + next_off;
            pr[k].fixed_cap = (size_t)len;
            plen[k] = (size_t)len;
            submit_range(c, &pr[k], key, ver, next_off, len);
            next_off += len;
            nfly++;
        }
        if (nfly == 0) break;
        ft_status w = range_done_locked(c, &pr[head], ver, plen[head], st == FT_OK);
        if (st == FT_OK) st = w;
        head = (head + 1) % FT_READ_DEPTH;
        nfly--;
    }
    pthread_mutex_unlock(&c->lock);
    if (st == FT_OK) *size = (size_t)fi.frame_size;
    return st;
}

static ft_status cl_get(ft_store_backend *b, const char *key, ft_buf *out, size_t *size)
{
    ucx_client *c = (ucx_client *)b;
    pthread_mutex_lock(&c->lock);
    int cma = ensure_locked(c) == FT_OK && c->cma;
    pthread_mutex_unlock(&c->lock);
    if (cma) {
        /* a frame replaced while it was read: read again (as cl_read) */
        ft_status st = FT_ERR_BUSY;
        int tcp = 0;
        for (int attempt = 0; attempt < 8 && st == FT_ERR_BUSY && !tcp; attempt++)
            st = get_byref(c, key, out, size, &tcp);
        if (!tcp) return st;
    }
    size_t n = 0;
    ft_status st = call(c, FT_OP_GET, key, NULL, 0, out, &n);
    if (st == FT_OK) *size = n;
    return st;
}

static ft_status read_once(ucx_client *c, const char *key, ft_codec_ctx *cc, ft_buf *scratch,
                           ft_tensor *dst, size_t cap, int alloc, int alloc_dtype)
{
    ft_status st = ft_buf_reserve(scratch, FT_READ_FIRST);
    if (st != FT_OK) return st;
    pend first;
    memset(&first, 0, sizeof first);
    size_t first_len = FT_READ_FIRST;
    uint64_t range = FT_READ_RANGE;
    pthread_mutex_lock(&c->lock);
    st = ensure_locked(c);
    if (st == FT_OK) {
        if (c->cma) {
            first_len = FT_READ_FIRST_CMA;
            range = FT_READ_RANGE_CMA;
        }
        first.fixed = scratch->p;
        first.fixed_cap = first_len;
        st = range_wait_locked(c, &first, key, 0, 0, first_len);
    }
    pthread_mutex_unlock(&c->lock);
    if (st != FT_OK) return st;
    const uint64_t ver = first.aux;
    const size_t got = range_got(&first);
    ft_frame_info fi;
    st = first_info(c, key, scratch->p, got, first_len, &fi);
    if (st == FT_ERR_BUFFER_SMALL) {
        /* a header larger than the first range: fetch the frame whole */
        size_t n = 0;
        st = call(c, FT_OP_GET, key, NULL, 0, scratch, &n);
        return st == FT_OK ? decode_whole(cc, scratch->p, n, dst, cap, alloc, alloc_dtype) : st;
    }
    if (st != FT_OK) return st;
    if (fi.frame_size == got) return decode_whole(cc, scratch->p, got, dst, cap, alloc, alloc_dtype);

    /* pipelined: output first */
    int od = alloc ? (alloc_dtype < 0 ? (int)fi.dtype : alloc_dtype) : (int)dst->dtype;
    if (od < 0 || od >= FT_DTYPE_COUNT) return ft_set_error(FT_ERR_INVALID_ARG, "output dtype");
    size_t need = (size_t)ft_dtype_nbytes((ft_dtype)od, fi.numel);
    if (!alloc && need > cap)
        return ft_set_error(FT_ERR_BUFFER_SMALL, "decoded tensor needs %zu bytes, buffer has %zu",
                            need, cap);
    /* zero copy: a raw frame read in its own dtype */
    const int zc = fi.codec == FT_CODEC_RAW && od == (int)fi.dtype &&
                   fi.frame_size == fi.header_size + fi.raw_size;
    if (!zc && (st = buf_grow_keep(scratch, (size_t)fi.frame_size, got)) != FT_OK) return st;
    uint8_t *out = alloc ? ft_malloc_aligned(need ? need : 64, 64) : dst->data;
    if (!out) return ft_set_error(FT_ERR_NOMEM, "cannot allocate %zu bytes", need);

    /* chunks wholly in the first range decode from it; the rest comes by
     * range, raw ones straight into out */
    uint32_t next_chunk = 0;
    uint64_t next_off = got, done_off = got;
    while (st == FT_OK && next_chunk < fi.n_chunks) {
        ft_chunk_info ch;
        st = ft_frame_chunk(scratch->p, got, &fi, next_chunk, &ch);
        if (st != FT_OK || ch.enc_offset + ch.enc_size > got) break;
        size_t o = (size_t)ft_dtype_nbytes((ft_dtype)od, ch.elem_offset);
        st = ft_decode_chunk(cc, &fi, &ch, scratch->p + ch.enc_offset, (ft_dtype)od, out + o,
                             need - o, 0);
        next_chunk++;
    }
    uint64_t zc_base = 0;   /* zero copy: frame offset that maps to out[0] */
    if (st == FT_OK && zc && next_chunk < fi.n_chunks) {
        ft_chunk_info ch;
        st = ft_frame_chunk(scratch->p, got, &fi, next_chunk, &ch);
        if (st == FT_OK && (!(ch.flags & FT_CHUNK_STORED) || ch.enc_offset != fi.header_size + ch.raw_offset))
            st = ft_set_error(FT_ERR_CORRUPT, "raw chunk %u not stored in place", next_chunk);
        next_off = done_off = ch.enc_offset;   /* re-fetch a chunk the first range cut */
        zc_base = fi.header_size;
    }
    pend pr[FT_READ_DEPTH];
    size_t plen[FT_READ_DEPTH];
    unsigned head = 0, nfly = 0;
    pthread_mutex_lock(&c->lock);
    for (;;) {
        while (st == FT_OK && nfly < FT_READ_DEPTH && next_off < fi.frame_size) {
            unsigned k = (head + nfly) % FT_READ_DEPTH;
            uint64_t len = fi.frame_size - next_off;
            if (len > range) len = range;
            memset(&pr[k], 0, sizeof pr[k]);
            pr[k].fixed = zc ? out + (next_off - zc_base) : scratch->p + next_off;
            pr[k].fixed_cap = (size_t)len;
            plen[k] = (size_t)len;
            submit_range(c, &pr[k], key, ver, next_off, len);
            next_off += len;
            nfly++;
        }
        /* decode (or check) what has arrived while the rest is in flight */
        pthread_mutex_unlock(&c->lock);
        while (st == FT_OK && next_chunk < fi.n_chunks) {
            ft_chunk_info ch;
            st = ft_frame_chunk(scratch->p, got, &fi, next_chunk, &ch);
            if (st != FT_OK || ch.enc_offset + ch.enc_size > done_off) break;
            if (zc) {
                if (!(ch.flags & FT_CHUNK_STORED) || ch.enc_offset != zc_base + ch.raw_offset)
                    st = ft_set_error(FT_ERR_CORRUPT, "raw chunk %u not stored in place", next_chunk);
                else if (ft_xxh3(out + ch.raw_offset, ch.raw_size) != ch.hash)
                    st = ft_set_error(FT_ERR_CORRUPT, "chunk at element %llu: checksum mismatch",
                                      (unsigned long long)ch.elem_offset);
            } else {
                size_t o = (size_t)ft_dtype_nbytes((ft_dtype)od, ch.elem_offset);
                st = ft_decode_chunk(cc, &fi, &ch, scratch->p + ch.enc_offset, (ft_dtype)od,
                                     out + o, need - o, 0);
            }
            next_chunk++;
        }
        pthread_mutex_lock(&c->lock);
        if (nfly == 0) break;
        ft_status w = range_done_locked(c, &pr[head], ver, plen[head], st == FT_OK);
        if (st == FT_OK) st = w;
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
    for (int attempt = 0; attempt < 8 && st == FT_ERR_BUSY; attempt++)
        st = read_once((ucx_client *)b, key, cc, scratch, dst, cap, alloc, alloc_dtype);
    return st;
}

static void cl_close(ft_store_backend *b)
{
    ucx_client *c = (ucx_client *)b;
    pthread_mutex_lock(&c->lock);
    close_session_locked(c);
    pthread_mutex_unlock(&c->lock);
    if (c->w) ucp_worker_destroy(c->w);
    if (c->ctx) ucp_cleanup(c->ctx);
    pthread_mutex_destroy(&c->lock);
    pthread_cond_destroy(&c->cond);
    memset(c->token, 0, sizeof c->token);
    free(c);
}

static const ft_store_ops ucx_ops = {cl_put, cl_get, cl_del, cl_stat, cl_list,
                                     cl_stats, cl_close, cl_read, cl_write};

static ft_status ucx_open(const char *hostport, const ft_store_params *p, ft_store_backend **out)
{
    ucx_client *c = calloc(1, sizeof *c);
    if (!c) return ft_set_error(FT_ERR_NOMEM, "ucx client");
    c->base.ops = &ucx_ops;
    c->efd = -1;
    c->fd = -1;
    c->timeout_ms = p->timeout_ms;
    snprintf(c->where, sizeof c->where, "%s", hostport);
    pthread_mutex_init(&c->lock, NULL);
    pthread_cond_init(&c->cond, NULL);
    ft_status st = ft_net_resolve(hostport, 0, &c->addr, &c->alen);
    const char *mode = getenv("FLEXTIER_TRANSPORT");
    if (st == FT_OK && mode && *mode && strcmp(mode, "auto")) {
        if (!strcmp(mode, "tcp")) c->mode = MODE_TCP;
        else if (!strcmp(mode, "cma")) c->mode = MODE_CMA;
        else if (!strcmp(mode, "ucx")) c->mode = MODE_UCX;
        else st = ft_set_error(FT_ERR_INVALID_ARG, "FLEXTIER_TRANSPORT='%s': auto, tcp, cma or ucx", mode);
    }
    const char *tf = p->token_file ? p->token_file : getenv("FLEXTIER_TOKEN_FILE");
    if (st == FT_OK && tf && *tf)
        st = ft_net_read_token(tf, 1, c->token, sizeof c->token, &c->token_len);
    if (st != FT_OK) goto fail;
    pthread_mutex_lock(&c->lock);
    st = connect_locked(c);
    pthread_mutex_unlock(&c->lock);
    if (st != FT_OK) goto fail;
    *out = &c->base;
    return FT_OK;
fail:
    {
        char why[400];
        snprintf(why, sizeof why, "%s", ft_last_error());
        cl_close(&c->base);
        return ft_set_error(st, "%s", why);
    }
}

const ft_store_scheme ft_store_scheme_ucx = {"ucx://", NULL, "ucx://HOST:PORT", ucx_open};
