/* agent://HOST:PORT[/NODE] backend: a client of `flextier agent`.
 *
 * The agent does the codec work, so this backend implements the store's
 * tensor-level operations itself (ops.write, ops.read): it names the
 * caller's tensor buffer (address, capacity) and waits; the agent reads
 * the raw tensor out of it, or writes the decoded tensor into it: by
 * cross-memory attach when both run on one machine (nothing for this
 * side to do), or by UCP RMA on an endpoint to this process's UCX worker
 * (RDMA from a DPU; TCP only when the agent says the operator named the
 * network trusted), for which the buffer is registered per request (no
 * registration cache: a buffer freed and reallocated at the same address
 * would otherwise be served stale translations on RDMA).
 *
 * Connection: TCP to the agent's port, which is the memory node's front
 * door (src/net/door.h: mutual HMAC challenge-response, the token never
 * crosses the wire), then the agent's messages (net/agent_msg.h) on that
 * connection. One connection per store, guarded by a mutex; the thread
 * that waits reads replies for everyone (and progresses the UCX worker,
 * which serves emulated RMA on TCP), so requests from several threads
 * (the store's async workers) are in flight together. Every wait has a
 * deadline (timeout_ms, cut only when the connection has also been idle
 * that long); a dead agent fails every pending request with FT_ERR_NET
 * at once, and the next call reconnects. */
#include "net/agent_msg.h"
#include "net/cma.h"
#include "net/auth.h"
#include "net/door.h"
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
#include <unistd.h>
#include <ucp/api/ucp.h>

#define MAX_REPLY_BODY (1ull << 40)   /* a GETF frame: bounded by the node's frames */

typedef struct apend {
    uint64_t     id;
    int          replied;
    ft_status    st;
    char         detail[FT_AMSG_ERR_MAX + 1];
    uint64_t     aux;
    ft_buf      *rbuf;        /* reply body goes here (grown) ...        */
    uint8_t     *fixed;       /* ... or into this fixed buffer            */
    size_t       fixed_cap;
    size_t       rlen;
    struct apend *next;
} apend;

typedef struct agent_client {
    ft_store_backend base;
    char             where[300];
    char             node[FT_AMSG_MAX_NODE + 1];
    struct sockaddr_storage addr;
    socklen_t        alen;
    uint8_t          token[FT_TOKEN_MAX];
    size_t           token_len;
    int              timeout_ms;
    pthread_mutex_t  lock;
    pthread_cond_t   cond;
    int              progressing;
    int              fd;          /* -1: not connected */
    int              dead;
    uint64_t         next_id;
    apend           *pending;
    double           last_progress;
    /* the reply being read (by whichever thread reads) */
    uint8_t          rx_hdr[FT_AMSG_MAX_HDR];
    size_t           rx_have, rx_need;
    int              rx_body;
    ft_amsg          rx_m;
    apend           *rx_p;        /* NULL: the body is discarded */
    uint8_t         *rx_dst;
    uint64_t         rx_len, rx_done;
    /* UCX: the agent's RMA into our buffers (when it offers UCX) */
    ucp_context_h    ctx;
    ucp_worker_h     w;
    int              efd;
    uint8_t          challenge[FT_AMSG_CHALLENGE];   /* HELLO reply, shown to the agent */
    int              cma;         /* the agent reaches our memory by CMA */
} agent_client;

static void fail_all(agent_client *c, ft_status st, const char *why)
{
    for (apend *p = c->pending; p; p = p->next)
        if (!p->replied) {
            p->replied = 1;
            p->st = st;
            snprintf(p->detail, sizeof p->detail, "%s", why);
        }
}

static void rx_reset(agent_client *c)
{
    c->rx_have = 0;
    c->rx_need = FT_AMSG_HDR_SIZE;
    c->rx_body = 0;
    c->rx_p = NULL;
    c->rx_dst = NULL;
    c->rx_len = c->rx_done = 0;
}

static void close_locked(agent_client *c)
{
    if (c->fd >= 0) close(c->fd);
    c->fd = -1;
    rx_reset(c);
    fail_all(c, FT_ERR_NET, "connection to the agent closed");
    c->dead = 0;
    pthread_cond_broadcast(&c->cond);
}

/* A reply's header is in: where its body goes. 0: protocol error. */
static int rx_header(agent_client *c)
{
    ft_amsg m;
    uint64_t dl = ft_get_le64(c->rx_hdr + 24);
    if (ft_amsg_parse(c->rx_hdr, c->rx_need, dl > SIZE_MAX ? SIZE_MAX : (size_t)dl, 1, MAX_REPLY_BODY,
                      &m) != FT_OK) {
        FT_LOG(FT_LOG_WARN, "agent://%s: malformed reply: %s", c->where, ft_last_error());
        return 0;
    }
    c->rx_m = m;
    c->rx_body = 1;
    c->rx_len = m.data_len;
    c->rx_done = 0;
    c->rx_dst = NULL;
    apend *p = c->pending;
    while (p && (p->id != m.req_id || p->replied)) p = p->next;
    c->rx_p = p;
    if (!p) return 1;   /* nobody waits any more: discard */
    p->st = (ft_status)m.status;
    p->aux = m.aux;
    if (m.status != FT_OK) {
        p->detail[0] = 0;
        c->rx_dst = (uint8_t *)p->detail;   /* up to sizeof - 1 bytes, the rest discarded */
        return 1;
    }
    if (m.data_len == 0) return 1;
    if (p->fixed) {
        if (m.data_len > p->fixed_cap) {
            p->st = FT_ERR_PROTOCOL;
            snprintf(p->detail, sizeof p->detail, "reply of %llu bytes, expected <= %zu",
                     (unsigned long long)m.data_len, p->fixed_cap);
            c->rx_p = NULL;
            p->replied = 1;
            return 1;
        }
        c->rx_dst = p->fixed;
    } else if (!p->rbuf) {
        p->st = FT_ERR_PROTOCOL;
        snprintf(p->detail, sizeof p->detail, "unexpected reply data");
        c->rx_p = NULL;
        p->replied = 1;
        return 1;
    } else if (m.data_len > SIZE_MAX || ft_buf_reserve(p->rbuf, (size_t)m.data_len) != FT_OK) {
        p->st = FT_ERR_NOMEM;
        snprintf(p->detail, sizeof p->detail, "no memory for %llu reply bytes", (unsigned long long)m.data_len);
        c->rx_p = NULL;
        p->replied = 1;
        return 1;
    } else {
        c->rx_dst = p->rbuf->p;
    }
    p->rlen = (size_t)m.data_len;
    return 1;
}

static void rx_body_done(agent_client *c)
{
    apend *p = c->rx_p;
    if (p) {
        if (p->st != FT_OK) {
            size_t n = c->rx_len < sizeof p->detail - 1 ? (size_t)c->rx_len : sizeof p->detail - 1;
            p->detail[n] = 0;
            for (size_t i = 0; i < n; i++)   /* text from the peer: printable only */
                if ((unsigned char)p->detail[i] < 0x20 || (unsigned char)p->detail[i] > 0x7e) p->detail[i] = '?';
            if (!n) snprintf(p->detail, sizeof p->detail, "agent: %s", ft_status_str(p->st));
        }
        p->replied = 1;
    }
    rx_reset(c);
}

/* Read what the socket has (lock held). Returns 1 if anything moved;
 * marks the connection dead on an error. */
static int rx_progress_locked(agent_client *c)
{
    int moved = 0;
    uint8_t sink[4096];
    while (c->fd >= 0 && !c->dead) {
        uint8_t *dst;
        size_t want;
        if (!c->rx_body) {
            dst = c->rx_hdr + c->rx_have;
            want = c->rx_need - c->rx_have;
        } else {
            uint64_t left = c->rx_len - c->rx_done;
            if (c->rx_p && c->rx_dst == (uint8_t *)c->rx_p->detail) {
                size_t room = sizeof c->rx_p->detail - 1;
                dst = c->rx_done < room ? c->rx_dst + c->rx_done : sink;
                want = c->rx_done < room ? room - (size_t)c->rx_done : sizeof sink;
            } else if (c->rx_p && c->rx_dst) {
                dst = c->rx_dst + c->rx_done;
                want = left > (1u << 30) ? (1u << 30) : (size_t)left;
            } else {
                dst = sink;
                want = sizeof sink;
            }
            if (want > left) want = (size_t)left;
            if (want == 0) {
                rx_body_done(c);
                moved = 1;
                continue;
            }
        }
        ssize_t r = recv(c->fd, dst, want, MSG_DONTWAIT);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        if (r <= 0) {
            FT_LOG(FT_LOG_WARN, "agent://%s: connection lost: %s", c->where, r == 0 ? "closed by the agent" : strerror(errno));
            c->dead = 1;
            break;
        }
        moved = 1;
        if (c->rx_body) {
            c->rx_done += (uint64_t)r;
            if (c->rx_done == c->rx_len) rx_body_done(c);
            continue;
        }
        c->rx_have += (size_t)r;
        if (c->rx_have < c->rx_need) continue;
        if (c->rx_need == FT_AMSG_HDR_SIZE) {
            size_t hl = 0;
            if (ft_amsg_header_len(c->rx_hdr, &hl) != FT_OK) {
                FT_LOG(FT_LOG_WARN, "agent://%s: malformed reply: %s", c->where, ft_last_error());
                c->dead = 1;
                break;
            }
            c->rx_need = hl;
            if (hl > c->rx_have) continue;
        }
        if (!rx_header(c)) {
            c->dead = 1;
            break;
        }
        if (c->rx_len == 0) rx_body_done(c);
    }
    return moved;
}

static ft_status wait_locked(agent_client *c, apend *p, double deadline)
{
    while (!p->replied) {
        if (c->dead) {
            close_locked(c);
            break;
        }
        if (c->progressing) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 5000000L;
            if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
            pthread_cond_timedwait(&c->cond, &c->lock, &ts);
        } else {
            int moved = rx_progress_locked(c);
            if (c->w && ucp_worker_progress(c->w)) moved = 1;
            if (moved) {
                c->last_progress = ft_now();
                pthread_cond_broadcast(&c->cond);
                continue;
            }
        }
        if (p->replied) break;
        double now = ft_now();
        if (now > deadline && now - c->last_progress > c->timeout_ms / 1000.0) {
            FT_LOG(FT_LOG_WARN, "agent://%s: request timed out; reconnecting", c->where);
            p->replied = 1;
            p->st = FT_ERR_TIMEOUT;
            snprintf(p->detail, sizeof p->detail, "no reply from the agent within %d ms", c->timeout_ms);
            c->dead = 1;
            continue;
        }
        if (c->progressing || c->dead) continue;
        if (c->w && ucp_worker_arm(c->w) == UCS_ERR_BUSY) continue;
        c->progressing = 1;
        int fd = c->fd;
        pthread_mutex_unlock(&c->lock);
        struct pollfd pfd[2] = {{fd, POLLIN, 0}, {c->w ? c->efd : -1, POLLIN, 0}};
        poll(pfd, 2, 50);
        pthread_mutex_lock(&c->lock);
        c->progressing = 0;
    }
    return p->st;
}

/* Queue a request (p zeroed except rbuf/fixed) and send it. Lock held. */
static void submit_locked(agent_client *c, apend *p, uint16_t op, const char *key, const void *body,
                          size_t blen, uint64_t addr, uint64_t len)
{
    p->id = ++c->next_id;
    p->next = c->pending;
    c->pending = p;
    if (c->fd < 0 || c->dead) {
        p->replied = 1;
        p->st = FT_ERR_NET;
        snprintf(p->detail, sizeof p->detail, "not connected");
        return;
    }
    uint8_t hdr[FT_AMSG_MAX_HDR];
    uint32_t klen = key ? (uint32_t)strlen(key) : 0;
    size_t hlen = ft_amsg_encode(hdr, op, p->id, 0, key, klen, blen, addr, len, 0);
    double dl = ft_now() + c->timeout_ms / 1000.0;
    ft_status st = ft_net_io_full(c->fd, 1, hdr, hlen, dl, "agent");
    if (st == FT_OK && blen) st = ft_net_io_full(c->fd, 1, (void *)body, blen, dl, "agent");
    if (st != FT_OK) {
        p->replied = 1;
        p->st = FT_ERR_NET;
        snprintf(p->detail, sizeof p->detail, "send: %s", ft_last_error());
        c->dead = 1;
        return;
    }
    c->last_progress = ft_now();
}

static void unlink_locked(agent_client *c, apend *p)
{
    apend **pp = &c->pending;
    while (*pp && *pp != p) pp = &(*pp)->next;
    if (*pp) *pp = p->next;
    if (c->rx_p == p) {   /* its body keeps coming: discard it */
        c->rx_p = NULL;
        c->rx_dst = NULL;
    }
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

/* The agent offers UCX: our worker for its RMA (once per store). */
static void ucx_open_locked(agent_client *c, uint64_t flags)
{
    if (c->w || !(flags & FT_NODE_UCX)) return;
    char devs[512] = "";
    struct sockaddr_storage local;
    socklen_t ll = sizeof local;
    if (getsockname(c->fd, (struct sockaddr *)&local, &ll) == 0) ft_net_devices_for(&local, devs, sizeof devs);
    ft_net_ucx_opts uo = {(flags & FT_NODE_UCX_TCP) != 0, devs, NULL, 0,
                          UCP_FEATURE_AM | UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP, NULL};
    ucs_status_t s = ft_net_ucp_open("flextier-agent-client", &uo, &c->ctx, &c->w, &c->efd);
    if (s != UCS_OK) {
        FT_LOG(FT_LOG_INFO, "agent://%s: no UCX on this side (%s)", c->where, ucs_status_string(s));
        if (c->w) ucp_worker_destroy(c->w);
        if (c->ctx) ucp_cleanup(c->ctx);
        c->w = NULL;
        c->ctx = NULL;
        c->efd = -1;
    }
}

static ft_status connect_locked(agent_client *c)
{
    c->dead = 0;
    rx_reset(c);
    double dl = ft_now() + c->timeout_ms / 1000.0;
    ft_status st = ft_net_tcp_connect(&c->addr, c->alen, c->timeout_ms, c->where, &c->fd);
    if (st != FT_OK) {
        c->fd = -1;
        return ft_set_error(st, "agent://%s", ft_last_error());
    }
    uint64_t flags = 0;
    char who[320];
    snprintf(who, sizeof who, "agent://%s", c->where);
    st = ft_door_client_auth(c->fd, c->token_len ? c->token : NULL, c->token_len, 0, dl, who, NULL, 0, NULL,
                             &flags, NULL);
    if (st != FT_OK) {
        char why[400];
        snprintf(why, sizeof why, "%s", ft_last_error());
        close_locked(c);
        return ft_set_error(st, "%s", why);
    }
    ucx_open_locked(c, flags);
    static _Thread_local uint8_t hello[FT_AMSG_MAX_HELLO];
    ucp_address_t *wa = NULL;
    size_t wal = 0;
    if (c->w && ucp_worker_get_address(c->w, &wa, &wal) != UCS_OK) {
        wa = NULL;
        wal = 0;
    }
    size_t hl = ft_amsg_hello_encode(hello, sizeof hello, c->node, wa, wal);
    if (wa) ucp_worker_release_address(c->w, wa);
    if (hl == 0) {
        close_locked(c);
        return ft_set_error(FT_ERR_NET, "agent://%s: worker address of %zu bytes", c->where, wal);
    }
    apend p;
    memset(&p, 0, sizeof p);
    p.fixed = c->challenge;
    p.fixed_cap = sizeof c->challenge;
    st = call_locked(c, &p, FT_AOP_HELLO, NULL, hello, hl, 0, 0);
    if (st != FT_OK) {
        char why[300];
        snprintf(why, sizeof why, "%s", ft_last_error());
        close_locked(c);
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
    if (!c->cma && !c->w) {
        close_locked(c);
        return ft_set_error(FT_ERR_UNSUPPORTED,
                            "agent://%s: no way for the agent to reach this process's tensors: not "
                            "on its machine (cross-memory attach refused) and no UCX between us (the "
                            "agent needs an RDMA device, or --trusted-network for UCX over TCP)",
                            c->where);
    }
    FT_LOG(FT_LOG_INFO, "agent://%s: connected (tensors move by %s)", c->where,
           c->cma ? "cross-memory attach" : "UCX RMA");
    return FT_OK;
}

static ft_status ensure_locked(agent_client *c)
{
    if (c->dead) close_locked(c);
    return c->fd >= 0 ? FT_OK : connect_locked(c);
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
    pthread_mutex_lock(&c->lock);
    close_locked(c);
    pthread_mutex_unlock(&c->lock);
    if (c->w) ucp_worker_destroy(c->w);
    if (c->ctx) ucp_cleanup(c->ctx);
    pthread_mutex_destroy(&c->lock);
    pthread_cond_destroy(&c->cond);
    memset(c->token, 0, sizeof c->token);
    free(c);
}

static const ft_store_ops agent_ops = {ac_put, ac_get, ac_del, ac_stat, ac_list,
                                       ac_stats, ac_close, ac_read, ac_write};

static ft_status agent_open(const char *spec, const ft_store_params *p, ft_store_backend **out)
{
    agent_client *c = calloc(1, sizeof *c);
    if (!c) return ft_set_error(FT_ERR_NOMEM, "agent client");
    c->base.ops = &agent_ops;
    c->efd = -1;
    c->fd = -1;
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
    if ((st = ft_net_resolve(hostport, 0, &c->addr, &c->alen)) != FT_OK) goto fail;
    const char *tf = p->token_file ? p->token_file : getenv("FLEXTIER_TOKEN_FILE");
    /* the same checks as every token file (a private regular file, >= 16 bytes) */
    if (tf && *tf && (st = ft_net_read_token(tf, FT_TOKEN_MIN, c->token, sizeof c->token, &c->token_len)) != FT_OK)
        goto fail;
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
