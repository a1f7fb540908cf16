/* agent://HOST:PORT[/NODE] backend: a client of `flextier agent`.
 *
 * The agent does the codec work, so this backend implements the store's
 * tensor-level operations itself (ops.write, ops.read): it
 * registers the caller's tensor buffer with UCX (ucp_mem_map), sends its
 * address and packed remote key, and waits; the agent reads the raw
 * tensor out of it, or writes the decoded tensor into it, by RMA. The
 * client's CPU only registers memory and exchanges two small messages per
 * tensor. Registration is per request (no cache: a buffer freed and
 * reallocated at the same address would otherwise be served stale
 * translations on RDMA).
 *
 * One UCP worker and endpoint per store (client/server sockaddr, PEER
 * error handling), guarded by a mutex; the thread that waits drives
 * progress, so requests from several threads (the store's async workers)
 * are in flight together. Every wait has a deadline (timeout_ms, cut only
 * when the connection has also been idle that long); a dead agent fails
 * every pending request with FT_ERR_NET at once, and the next call
 * reconnects. */
#include "net/agent_msg.h"
#include "net/cma.h"
#include "store_internal.h"

#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <ucp/api/ucp.h>

struct rx_token;

typedef struct apend {
    uint64_t     id;
    int          replied, send_pending, recv_pending;
    ft_status    st;
    char         detail[FT_AMSG_ERR_MAX + 1];
    uint64_t     aux;
    ft_buf      *rbuf;        /* reply body goes here (grown) ...        */
    uint8_t     *fixed;       /* ... or into this fixed buffer            */
    size_t       fixed_cap;
    size_t       rlen;
    uint8_t      hdr[FT_AMSG_MAX_HDR];
    struct rx_token *rx;
    struct apend *next;
} apend;

/* A pending rendezvous receive (see src/store/ucx_client.c: a force-closed
 * endpoint may never complete it, so the waiter abandons it). */
typedef struct rx_token {
    apend *p;
    int abandoned;
} rx_token;

typedef struct agent_client {
    ft_store_backend base;
    char             where[300];
    char             node[FT_AMSG_MAX_NODE + 1];
    struct sockaddr_storage addr;
    socklen_t        alen;
    char             token[FT_AMSG_MAX_TOKEN];
    size_t           token_len;
    int              timeout_ms;
    pthread_mutex_t  lock;
    pthread_cond_t   cond;
    int              progressing;
    ucp_context_h    ctx;
    ucp_worker_h     w;
    int              efd;
    ucp_ep_h         ep;
    int              dead;
    uint64_t         next_id;
    apend           *pending;
    double           last_progress;
    uint8_t          challenge[FT_AMSG_CHALLENGE];   /* HELLO reply, shown to the agent */
    int              cma;         /* the agent reaches our memory by CMA */
} agent_client;

static ft_status st_from_ucs(ucs_status_t s)
{
    switch (s) {
    case UCS_OK: return FT_OK;
    case UCS_ERR_NO_MEMORY: return FT_ERR_NOMEM;
    case UCS_ERR_TIMED_OUT: return FT_ERR_TIMEOUT;
    default: return FT_ERR_NET;
    }
}

static void fail_all(agent_client *c, ft_status st, const char *why)
{
    for (apend *p = c->pending; p; p = p->next)
        if (!p->replied) {
            p->replied = 1;
            p->st = st;
            snprintf(p->detail, sizeof p->detail, "%s", why);
        }
}

static void ep_err_cb(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    agent_client *c = arg;
    if (ep != c->ep) return;
    FT_LOG(FT_LOG_WARN, "agent://%s: connection failed: %s", c->where, ucs_status_string(status));
    c->dead = 1;
    fail_all(c, FT_ERR_NET, ucs_status_string(status));
}

static void send_cb(void *req, ucs_status_t status, void *user)
{
    apend *p = user;
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
    apend *p = t->p;
    free(t);
    p->rx = NULL;
    p->recv_pending = 0;
    if (status != UCS_OK && p->st == FT_OK) {
        p->st = st_from_ucs(status);
        snprintf(p->detail, sizeof p->detail, "receive: %s", ucs_status_string(status));
    }
    ucp_request_free(req);
}

static ucs_status_t reply_cb(void *arg, const void *header, size_t hlen, void *data, size_t len,
                             const ucp_am_recv_param_t *param)
{
    agent_client *c = arg;
    ft_amsg m;
    if (ft_amsg_parse(header, hlen, len, 1, UINT64_MAX, &m) != FT_OK) {
        FT_LOG(FT_LOG_WARN, "agent://%s: malformed reply dropped: %s", c->where, ft_last_error());
        return UCS_OK;
    }
    apend *p = c->pending;
    while (p && p->id != m.req_id) p = p->next;
    if (!p || p->replied) return UCS_OK;
    p->replied = 1;
    p->st = (ft_status)m.status;
    p->aux = m.aux;
    int rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
    if (m.status != FT_OK) {
        size_t n = len < sizeof p->detail - 1 ? len : sizeof p->detail - 1;
        if (n && !rndv) {
            memcpy(p->detail, data, n);
            p->detail[n] = 0;
            for (size_t i = 0; i < n; i++)   /* text from the peer: printable only */
                if ((unsigned char)p->detail[i] < 0x20 || (unsigned char)p->detail[i] > 0x7e) p->detail[i] = '?';
        } else {
            snprintf(p->detail, sizeof p->detail, "agent: %s", ft_status_str(p->st));
        }
        return UCS_OK;
    }
    if (len == 0) return UCS_OK;
    uint8_t *dst;
    if (p->fixed) {
        if (len > p->fixed_cap) {
            p->st = FT_ERR_PROTOCOL;
            snprintf(p->detail, sizeof p->detail, "reply of %zu bytes, expected <= %zu", len, p->fixed_cap);
            return UCS_OK;
        }
        dst = p->fixed;
    } else if (!p->rbuf) {
        p->st = FT_ERR_PROTOCOL;
        snprintf(p->detail, sizeof p->detail, "unexpected reply data");
        return UCS_OK;
    } else if (ft_buf_reserve(p->rbuf, len) != FT_OK) {
        p->st = FT_ERR_NOMEM;
        snprintf(p->detail, sizeof p->detail, "no memory for %zu reply bytes", len);
        return UCS_OK;
    } else {
        dst = p->rbuf->p;
    }
    p->rlen = len;
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
            snprintf(p->detail, sizeof p->detail, "receive: %s", ucs_status_string(UCS_PTR_STATUS(r)));
        } else if (r) {
            p->rx = t;
            p->recv_pending = 1;
        } else {
            free(t);
        }
        return UCS_INPROGRESS;
    }
    memcpy(dst, data, len);
    return UCS_OK;
}

static void close_ep_locked(agent_client *c)
{
    if (!c->ep) return;
    ucp_request_param_t p;
    memset(&p, 0, sizeof p);
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_EP_CLOSE_FLAG_FORCE;
    ucp_ep_h ep = c->ep;
    c->ep = NULL;
    fail_all(c, FT_ERR_NET, "connection to the agent closed");
    ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &p);
    if (r && !UCS_PTR_IS_ERR(r)) {
        double dl = ft_now() + 5.0;
        while (ucp_request_check_status(r) == UCS_INPROGRESS && ft_now() < dl) ucp_worker_progress(c->w);
        ucp_request_free(r);
    }
    for (apend *q = c->pending; q; q = q->next)
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

static int pend_done(const apend *p) { return p->replied && !p->send_pending && !p->recv_pending; }

static ft_status wait_locked(agent_client *c, apend *p, double deadline)
{
    while (!pend_done(p)) {
        if (c->dead) {
            close_ep_locked(c);
            if (pend_done(p)) break;
        }
        if (c->progressing) {
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
        double now = ft_now();
        if (now > deadline && now - c->last_progress > c->timeout_ms / 1000.0) {
            if (!p->replied) {
                FT_LOG(FT_LOG_WARN, "agent://%s: request timed out; reconnecting", c->where);
                p->replied = 1;
                p->st = FT_ERR_TIMEOUT;
                snprintf(p->detail, sizeof p->detail, "no reply from the agent within %d ms", c->timeout_ms);
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

/* Queue a request (p zeroed except rbuf/fixed). Lock held. */
static void submit_locked(agent_client *c, apend *p, uint16_t op, const char *key, const void *body,
                          size_t blen, uint64_t addr, uint64_t len)
{
    p->id = ++c->next_id;
    p->next = c->pending;
    c->pending = p;
    uint32_t klen = key ? (uint32_t)strlen(key) : 0;
    size_t hlen = ft_amsg_encode(p->hdr, op, p->id, 0, key, klen, blen, addr, len, 0);
    if (!c->ep || c->dead) {
        p->replied = 1;
        p->st = FT_ERR_NET;
        snprintf(p->detail, sizeof p->detail, "not connected");
        return;
    }
    ucp_request_param_t rp;
    memset(&rp, 0, sizeof rp);
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
    rp.flags = UCP_AM_SEND_FLAG_REPLY;
    rp.cb.send = send_cb;
    rp.user_data = p;
    ucs_status_ptr_t r = ucp_am_send_nbx(c->ep, FT_AM_AGENT_REQUEST, p->hdr, hlen, body, blen, &rp);
    if (UCS_PTR_IS_ERR(r)) {
        p->replied = 1;
        p->st = FT_ERR_NET;
        snprintf(p->detail, sizeof p->detail, "send: %s", ucs_status_string(UCS_PTR_STATUS(r)));
    } else if (r) {
        p->send_pending = 1;
    }
}

static void unlink_locked(agent_client *c, apend *p)
{
    apend **pp = &c->pending;
    while (*pp && *pp != p) pp = &(*pp)->next;
    if (*pp) *pp = p->next;
}

static ft_status pend_error(agent_client *c, const apend *p)
{
    return ft_set_error(p->st, "agent://%s: %s", c->where, p->detail[0] ? p->detail : ft_status_str(p->st));
}

/* One request and its reply. Lock held, connection up. */
static ft_status call_locked(agent_client *c, apend *p, uint16_t op, const char *key, const void *body,
                             size_t blen, uint64_t addr, uint64_t len)
{
    submit_locked(c, p, op, key, body, blen, addr, len);
    ft_status st = wait_locked(c, p, ft_now() + c->timeout_ms / 1000.0);
    unlink_locked(c, p);
    return st != FT_OK ? pend_error(c, p) : FT_OK;
}

/* FT_AOP_CMA body: u64 step (1: offer, 2: claim), u64 0. */
static ft_status cma_step_locked(agent_client *c, uint64_t step, uint8_t *reply, size_t cap)
{
    uint8_t body[FT_AMSG_CMA_SIZE];
    memset(body, 0, sizeof body);
    for (int i = 0; i < 8; i++) body[i] = (uint8_t)(step >> (8 * i));
    apend q;
    memset(&q, 0, sizeof q);
    q.fixed = reply;
    q.fixed_cap = cap;
    ft_status st = call_locked(c, &q, FT_AOP_CMA, NULL, body, sizeof body, 0, 0);
    if (st == FT_OK && reply && q.rlen != cap)
        st = ft_set_error(FT_ERR_PROTOCOL, "agent://%s: CMA offer of %zu bytes", c->where, q.rlen);
    return st;
}

static ft_status cma_setup_locked(agent_client *c)
{
    uint8_t offer[FT_CMA_OFFER_SIZE];
    int ufd = -1;
    ft_status st = cma_step_locked(c, 1, offer, sizeof offer);
    if (st == FT_OK) st = ft_cma_present(offer, &ufd);
    memset(offer, 0, sizeof offer);
    if (st == FT_OK) st = cma_step_locked(c, 2, NULL, 0);
    if (ufd >= 0) close(ufd);
    return st;
}

static ft_status connect_locked(agent_client *c)
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
        return ft_set_error(FT_ERR_NET, "agent://%s: cannot connect: %s", c->where, ucs_status_string(s));
    }
    static _Thread_local uint8_t hello[FT_AMSG_MAX_HELLO];
    ucp_address_t *wa = NULL;
    size_t wal = 0;
    s = ucp_worker_get_address(c->w, &wa, &wal);
    if (s != UCS_OK) {
        close_ep_locked(c);
        return ft_set_error(FT_ERR_NET, "agent://%s: worker address: %s", c->where, ucs_status_string(s));
    }
    size_t hl = ft_amsg_hello_encode(hello, sizeof hello, c->token, c->token_len, c->node, wa, wal);
    ucp_worker_release_address(c->w, wa);
    if (hl == 0) {
        close_ep_locked(c);
        return ft_set_error(FT_ERR_NET, "agent://%s: worker address of %zu bytes", c->where, wal);
    }
    apend p;
    memset(&p, 0, sizeof p);
    p.fixed = c->challenge;
    p.fixed_cap = sizeof c->challenge;
    ft_status st = call_locked(c, &p, FT_AOP_HELLO, NULL, hello, hl, 0, 0);
    memset(hello, 0, hl);
    if (st != FT_OK) {
        char why[300];
        snprintf(why, sizeof why, "%s", ft_last_error());
        close_ep_locked(c);
        return ft_set_error(st, "%s", why);
    }
    /* Same machine? Present the session's nonce on the agent's Unix
     * socket (net/cma.h): the kernel tells the agent who we are, and it
     * moves our tensors by CMA (no work on our cores); otherwise by UCX
     * RMA. */
    c->cma = 0;
    const char *no_cma = getenv("FLEXTIER_AGENT_NO_CMA");   /* tests: force UCX RMA */
    if (p.rlen == FT_AMSG_CHALLENGE && !(no_cma && *no_cma && strcmp(no_cma, "0"))) {
        c->cma = cma_setup_locked(c) == FT_OK;
        ft_clear_error();
    }
    FT_LOG(FT_LOG_INFO, "agent://%s: connected (tensors move by %s)", c->where,
           c->cma ? "cross-memory attach" : "UCX RMA");
    return FT_OK;
}

static ft_status ensure_locked(agent_client *c)
{
    if (c->dead) close_ep_locked(c);
    return c->ep ? FT_OK : connect_locked(c);
}

static ft_status call(agent_client *c, uint16_t op, const char *key, const void *body, size_t blen,
                      ft_buf *rbuf, size_t *rlen)
{
    apend p;
    memset(&p, 0, sizeof p);
    p.rbuf = rbuf;
    pthread_mutex_lock(&c->lock);
    ft_status st = ensure_locked(c);
    if (st == FT_OK) st = call_locked(c, &p, op, key, body, blen, 0, 0);
    pthread_mutex_unlock(&c->lock);
    if (st == FT_OK && rlen) *rlen = p.rlen;
    return st;
}

/* ------------------------------------------------ registered buffers */

typedef struct reg {
    ucp_mem_h memh;
    void *rkey;
    size_t rkey_len;
} reg;

/* Register [data, data + n) and pack its remote key (lock held). */
static ft_status reg_map(agent_client *c, void *data, size_t n, reg *r)
{
    memset(r, 0, sizeof *r);
    if (n == 0) return FT_OK;
    ucp_mem_map_params_t mp;
    memset(&mp, 0, sizeof mp);
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    mp.address = data;
    mp.length = n;
    ucs_status_t s = ucp_mem_map(c->ctx, &mp, &r->memh);
    if (s != UCS_OK) {
        r->memh = NULL;
        return ft_set_error(FT_ERR_NET, "agent://%s: cannot register %zu bytes: %s", c->where, n,
                            ucs_status_string(s));
    }
    s = ucp_rkey_pack(c->ctx, r->memh, &r->rkey, &r->rkey_len);
    if (s != UCS_OK || r->rkey_len > FT_AMSG_MAX_RKEY) {
        if (s == UCS_OK) ucp_rkey_buffer_release(r->rkey);
        ucp_mem_unmap(c->ctx, r->memh);
        memset(r, 0, sizeof *r);
        return ft_set_error(FT_ERR_NET, "agent://%s: cannot pack a remote key", c->where);
    }
    return FT_OK;
}

static void reg_unmap(agent_client *c, reg *r)
{
    if (r->rkey) ucp_rkey_buffer_release(r->rkey);
    if (r->memh) ucp_mem_unmap(c->ctx, r->memh);
    memset(r, 0, sizeof *r);
}

/* ------------------------------------------------------------ backend */

static ft_status ac_write(ft_store_backend *b, const char *key, ft_codec_ctx *cc, ft_buf *scratch,
                          const ft_tensor *t, const ft_codec_params *cp)
{
    (void)cc;
    (void)scratch;   /* the agent encodes */
    agent_client *c = (agent_client *)b;
    uint64_t nb = 0;
    ft_status st = ft_tensor_nbytes(t, &nb);
    if (st != FT_OK) return st;
    if (ft_encode_bound(cp, t->dtype, t->ndim, t->shape) == 0)
        return ft_set_error(FT_ERR_INVALID_ARG, "invalid codec params or shape for '%s'", key);
    uint8_t body[FT_AMSG_DESC_SIZE + FT_AMSG_CP_SIZE + 4 + FT_AMSG_MAX_RKEY];
    apend p;
    memset(&p, 0, sizeof p);
    reg r;
    pthread_mutex_lock(&c->lock);
    st = ensure_locked(c);
    /* CMA: the agent reads our memory directly, nothing to register */
    if (st == FT_OK) st = reg_map(c, t->data, c->cma ? 0 : (size_t)nb, &r);
    if (st == FT_OK) {
        size_t bl = ft_amsg_write_encode(body, sizeof body, t, cp, r.rkey, r.rkey_len);
        st = call_locked(c, &p, FT_AOP_WRITE, key, body, bl, (uint64_t)(uintptr_t)t->data, nb);
        /* the reply comes after the agent's get completed (or failed):
         * only then may the buffer be unregistered */
        reg_unmap(c, &r);
    }
    pthread_mutex_unlock(&c->lock);
    return st;
}

static ft_status ac_stat(ft_store_backend *b, const char *key, ft_frame_info *info);

/* Read into dst (cap bytes, dtype dst->dtype), or allocate (alloc: in
 * alloc_dtype, < 0 = stored) after asking for the tensor's size. The
 * agent writes the decoded tensor into the registered buffer before it
 * replies. */
static ft_status ac_read(ft_store_backend *b, const char *key, ft_codec_ctx *cc, ft_buf *scratch,
                         ft_tensor *dst, size_t cap, int alloc, int alloc_dtype)
{
    agent_client *c = (agent_client *)b;
    (void)cc;
    (void)scratch;
    for (int attempt = 0; attempt < 4; attempt++) {
        int od = alloc ? alloc_dtype : (int)dst->dtype;
        uint8_t *buf = alloc ? NULL : dst->data;
        size_t n = cap;
        if (alloc) {
            ft_frame_info fi;
            ft_status st = ac_stat(b, key, &fi);
            if (st != FT_OK) return st;
            if (od < 0) od = (int)fi.dtype;
            n = (size_t)ft_dtype_nbytes((ft_dtype)od, fi.numel);
            buf = ft_malloc_aligned(n ? n : 64, 64);
            if (!buf) return ft_set_error(FT_ERR_NOMEM, "cannot allocate %zu bytes", n);
        }
        uint8_t body[8 + FT_AMSG_MAX_RKEY], res[FT_AMSG_DESC_SIZE];
        apend p;
        memset(&p, 0, sizeof p);
        p.fixed = res;
        p.fixed_cap = sizeof res;
        reg r;
        pthread_mutex_lock(&c->lock);
        ft_status st = ensure_locked(c);
        if (st == FT_OK) st = reg_map(c, buf, c->cma ? 0 : n, &r);
        if (st == FT_OK) {
            size_t bl = ft_amsg_read_encode(body, sizeof body, od, r.rkey, r.rkey_len);
            st = call_locked(c, &p, FT_AOP_READ, key, body, bl, (uint64_t)(uintptr_t)buf, n);
            reg_unmap(c, &r);
        }
        pthread_mutex_unlock(&c->lock);
        ft_tensor t;
        if (st == FT_OK && p.rlen != FT_AMSG_DESC_SIZE)
            st = ft_set_error(FT_ERR_PROTOCOL, "agent://%s: READ reply of %zu bytes", c->where, p.rlen);
        if (st == FT_OK) st = ft_amsg_desc_parse(res, &t);
        uint64_t got = 0;
        if (st == FT_OK && (ft_tensor_nbytes(&t, &got) != FT_OK || got > n || (int)t.dtype != od))
            st = ft_set_error(FT_ERR_PROTOCOL, "agent://%s: READ reply describes another tensor", c->where);
        if (st != FT_OK) {
            if (alloc) ft_free_aligned(buf);
            /* replaced by a larger tensor between the size query and the
             * read: ask again */
            if (alloc && (st == FT_ERR_BUFFER_SMALL || st == FT_ERR_BUSY)) continue;
            if (!alloc && st == FT_ERR_BUSY) continue;
            return st;
        }
        t.data = buf;
        *dst = t;
        return FT_OK;
    }
    return ft_set_error(FT_ERR_BUSY, "agent://%s: '%s' kept changing during the read", c->where, key);
}

static ft_status ac_put(ft_store_backend *b, const char *key, const void *frame, size_t size)
{
    return call((agent_client *)b, FT_AOP_PUTF, key, frame, size, NULL, NULL);
}

static ft_status ac_get(ft_store_backend *b, const char *key, ft_buf *out, size_t *size)
{
    size_t n = 0;
    ft_status st = call((agent_client *)b, FT_AOP_GETF, key, NULL, 0, out, &n);
    if (st == FT_OK) *size = n;
    return st;
}

static ft_status ac_del(ft_store_backend *b, const char *key)
{
    return call((agent_client *)b, FT_AOP_DEL, key, NULL, 0, NULL, NULL);
}

static ft_status ac_stat(ft_store_backend *b, const char *key, ft_frame_info *info)
{
    ft_buf buf = {0};
    size_t n = 0;
    ft_status st = call((agent_client *)b, FT_AOP_STAT, key, NULL, 0, &buf, &n);
    ft_tensor_stat ts;
    if (st == FT_OK) st = ft_amsg_stat_parse(buf.p, n, &ts);
    ft_buf_free(&buf);
    if (st != FT_OK) return st;
    ft_frame_info fi;
    memset(&fi, 0, sizeof fi);
    fi.version = FT_FRAME_VERSION;
    fi.codec = ts.codec;
    fi.entropy = ts.entropy;
    fi.level = ts.level;
    fi.dtype = ts.dtype;
    fi.ndim = ts.ndim;
    memcpy(fi.shape, ts.shape, sizeof fi.shape);
    if (ft_shape_numel(ts.ndim, ts.shape, &fi.numel) != FT_OK)
        return ft_set_error(FT_ERR_PROTOCOL, "agent: stat of an invalid shape");
    fi.raw_size = ts.raw_bytes;
    fi.frame_size = ts.stored_bytes;
    *info = fi;
    return FT_OK;
}

static ft_status ac_list(ft_store_backend *b, char ***keys, size_t *n)
{
    ft_buf buf = {0};
    size_t len = 0;
    ft_status st = call((agent_client *)b, FT_AOP_LIST, NULL, NULL, 0, &buf, &len);
    if (st == FT_OK) st = ft_amsg_list_parse(buf.p, len, keys, n);
    ft_buf_free(&buf);
    return st;
}

static ft_status ac_stats(ft_store_backend *b, ft_store_stats *out)
{
    ft_buf buf = {0};
    size_t len = 0;
    ft_status st = call((agent_client *)b, FT_AOP_STATS, NULL, NULL, 0, &buf, &len);
    if (st == FT_OK) st = ft_amsg_stats_parse(buf.p, len, out);
    ft_buf_free(&buf);
    return st;
}

static void ac_close(ft_store_backend *b)
{
    agent_client *c = (agent_client *)b;
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

static const ft_store_ops agent_ops = {ac_put, ac_get, ac_del, ac_stat, ac_list,
                                       ac_stats, ac_close, ac_read, ac_write};

static ft_status resolve(const char *hostport, struct sockaddr_storage *addr, socklen_t *alen)
{
    char host[256];
    const char *colon, *h = hostport;
    size_t hl;
    if (hostport[0] == '[') {
        const char *e = strchr(hostport, ']');
        if (!e || e[1] != ':') goto bad;
        h = hostport + 1;
        hl = (size_t)(e - h);
        colon = e + 1;
    } else {
        colon = strrchr(hostport, ':');
        if (!colon) goto bad;
        hl = (size_t)(colon - hostport);
    }
    if (hl == 0 || hl >= sizeof host || !colon[1]) goto bad;
    memcpy(host, h, hl);
    host[hl] = 0;
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    int e = getaddrinfo(host, colon + 1, &hints, &res);
    if (e != 0 || !res) return ft_set_error(FT_ERR_NET, "cannot resolve '%s': %s", hostport, gai_strerror(e));
    memcpy(addr, res->ai_addr, res->ai_addrlen);
    *alen = res->ai_addrlen;
    freeaddrinfo(res);
    return FT_OK;
bad:
    return ft_set_error(FT_ERR_INVALID_ARG, "agent:// URI: expected HOST:PORT[/NODE], got '%s'", hostport);
}

static ft_status read_token(const char *path, char *buf, size_t cap, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return ft_set_error(FT_ERR_IO, "token file %s: %s", path, strerror(errno));
    size_t n = fread(buf, 1, cap, f);
    int big = n == cap && fgetc(f) != EOF;
    fclose(f);
    if (big) return ft_set_error(FT_ERR_INVALID_ARG, "token file %s over %zu bytes", path, cap - 1);
    while (n && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ')) n--;
    if (n == 0) return ft_set_error(FT_ERR_INVALID_ARG, "token file %s is empty", path);
    *len = n;
    return FT_OK;
}

static ft_status agent_open(const char *spec, const ft_store_params *p, ft_store_backend **out)
{
    agent_client *c = calloc(1, sizeof *c);
    if (!c) return ft_set_error(FT_ERR_NOMEM, "agent client");
    c->base.ops = &agent_ops;
    c->efd = -1;
    c->timeout_ms = p->timeout_ms;
    pthread_mutex_init(&c->lock, NULL);
    pthread_cond_init(&c->cond, NULL);
    snprintf(c->where, sizeof c->where, "%s", spec);
    ft_status st = FT_OK;
    char hostport[300];
    const char *slash = strchr(spec, '/');
    size_t hl = slash ? (size_t)(slash - spec) : strlen(spec);
    if (hl >= sizeof hostport) {
        st = ft_set_error(FT_ERR_INVALID_ARG, "agent:// URI too long");
        goto fail;
    }
    memcpy(hostport, spec, hl);
    hostport[hl] = 0;
    if (slash) {
        const char *node = slash + 1;
        if (!strncmp(node, "ucx://", 6)) node += 6;
        size_t nl = strlen(node);
        if (nl == 0 || nl > FT_AMSG_MAX_NODE || !strchr(node, ':')) {
            st = ft_set_error(FT_ERR_INVALID_ARG, "agent:// URI: memory node '%s' is not HOST:PORT", slash + 1);
            goto fail;
        }
        for (size_t i = 0; i < nl; i++)
            if ((unsigned char)node[i] < 0x21 || (unsigned char)node[i] > 0x7e) {
                st = ft_set_error(FT_ERR_INVALID_ARG, "agent:// URI: bad byte in the memory node");
                goto fail;
            }
        memcpy(c->node, node, nl + 1);
    }
    if ((st = resolve(hostport, &c->addr, &c->alen)) != FT_OK) goto fail;
    const char *tf = p->token_file ? p->token_file : getenv("FLEXTIER_TOKEN_FILE");
    if (tf && *tf && (st = read_token(tf, c->token, sizeof c->token, &c->token_len)) != FT_OK) goto fail;

    ucp_config_t *cfg = NULL;
    ucs_status_t s = ucp_config_read(NULL, NULL, &cfg);
    if (s == UCS_OK) {
        ucp_params_t up;
        memset(&up, 0, sizeof up);
        up.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
        up.features = UCP_FEATURE_AM | UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
        up.name = "flextier-agent-client";
        s = ucp_init(&up, cfg, &c->ctx);
        ucp_config_release(cfg);
    }
    if (s == UCS_OK) {
        ucp_worker_params_t wp;
        memset(&wp, 0, sizeof wp);
        wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
        wp.thread_mode = UCS_THREAD_MODE_SINGLE;
        s = ucp_worker_create(c->ctx, &wp, &c->w);
    }
    if (s == UCS_OK) s = ucp_worker_get_efd(c->w, &c->efd);
    if (s == UCS_OK) {
        ucp_am_handler_param_t hp;
        memset(&hp, 0, sizeof hp);
        hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                        UCP_AM_HANDLER_PARAM_FIELD_ARG;
        hp.id = FT_AM_AGENT_REPLY;
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
        ac_close(&c->base);
        return ft_set_error(st, "%s", why);
    }
}

const ft_store_scheme ft_store_scheme_agent = {"agent://", NULL, "agent://HOST:PORT[/NODE]", agent_open};
