/* A pipeline link over UCX tag messages (flextier/pipe.h): one endpoint
 * to the next stage, receives matched by the run's tag. UCX's transport
 * policy is the memory node's (src/net/net.h): RDMA, or TCP only on a
 * network named trusted; never UCX's shared-memory transports. */
#include "flextier/pipe.h"
#include "net/net.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <ucp/api/ucp.h>

typedef struct sbuf {
    uint8_t *p;
    size_t cap;
    int busy;
} sbuf;

typedef struct {
    ft_pipe_link base;
    ucp_context_h ctx;
    ucp_worker_h w;
    int efd;
    ucp_ep_h ep;
    uint64_t tag;
    int watch[FT_PIPE_MAX_STAGES + 1], nwatch;
    int failed;
    char why[160];
    sbuf **sb;                 /* send copies; a send owns one until it completes */
    int nsb;
} ucx_link;

typedef struct {
    int done;
    ucs_status_t st;
    size_t len;
} rx_state;

static void ep_err(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    ucx_link *u = arg;
    (void)ep;
    u->failed = 1;
    snprintf(u->why, sizeof u->why, "the next stage's endpoint failed: %s", ucs_status_string(status));
}

static void send_cb(void *req, ucs_status_t status, void *user)
{
    sbuf *b = user;
    (void)status;   /* a failed send fails its endpoint too (ep_err) */
    b->busy = 0;
    ucp_request_free(req);
}

static void recv_cb(void *req, ucs_status_t status, const ucp_tag_recv_info_t *info, void *user)
{
    rx_state *r = user;
    (void)req;
    r->st = status;
    r->len = info ? info->length : 0;
    r->done = 1;
}

static ft_status u_send(ft_pipe_link *l, const void *buf, size_t len)
{
    ucx_link *u = (ucx_link *)l;
    if (u->failed) return ft_set_error(FT_ERR_NET, "ucx link: %s", u->why);
    if (!u->ep) return ft_set_error(FT_ERR_INVALID_ARG, "ucx link: not connected");
    ucp_worker_progress(u->w);
    sbuf *b = NULL;
    for (int i = 0; i < u->nsb && !b; i++) if (!u->sb[i]->busy) b = u->sb[i];
    if (!b) {   /* all copies in flight: one more (a ring holds at most a micro-batch count of them) */
        sbuf **nv = realloc(u->sb, (size_t)(u->nsb + 1) * sizeof *nv);
        if (!nv) return FT_ERR_NOMEM;
        u->sb = nv;
        if (!(b = calloc(1, sizeof *b))) return FT_ERR_NOMEM;
        u->sb[u->nsb++] = b;
    }
    if (b->cap < len) {
        ft_free_aligned(b->p);
        b->cap = 0;
        if (!(b->p = ft_malloc_aligned(len ? len : 64, 64))) return ft_set_error(FT_ERR_NOMEM, "ucx link: %zu bytes", len);
        b->cap = len;
    }
    memcpy(b->p, buf, len);
    b->busy = 1;
    ucp_request_param_t rp;
    memset(&rp, 0, sizeof rp);
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    rp.cb.send = send_cb;
    rp.user_data = b;
    ucs_status_ptr_t r = ucp_tag_send_nbx(u->ep, b->p, len, u->tag, &rp);
    if (r == NULL) {
        b->busy = 0;
    } else if (UCS_PTR_IS_ERR(r)) {
        b->busy = 0;
        u->failed = 1;
        snprintf(u->why, sizeof u->why, "send: %s", ucs_status_string(UCS_PTR_STATUS(r)));
        return ft_set_error(FT_ERR_NET, "ucx link: %s", u->why);
    }
    return FT_OK;
}

/* Any event on a watched socket (the control connection: nothing is sent
 * on it during a run) means the other side is gone. */
static int watched_event(ucx_link *u, struct pollfd *pf, int n)
{
    for (int i = 0; i < n; i++)
        if (pf[i].fd != u->efd && pf[i].revents) return 1;
    return 0;
}

static ft_status u_recv(ft_pipe_link *l, void *buf, size_t cap, size_t *len, int timeout_ms)
{
    ucx_link *u = (ucx_link *)l;
    if (u->failed) return ft_set_error(FT_ERR_NET, "ucx link: %s", u->why);
    rx_state rx = {0, UCS_OK, 0};
    ucp_request_param_t rp;
    memset(&rp, 0, sizeof rp);
    /* Always a request, completed through the callback (which gets the
     * length): UCX 1.13 left recv_info unset when a message already
     * waiting in the unexpected queue completed the receive at once, so a
     * second micro-batch's message read as 0 bytes. */
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    rp.cb.recv = recv_cb;
    rp.user_data = &rx;
    ucs_status_ptr_t r = ucp_tag_recv_nbx(u->w, buf, cap, u->tag, (ucp_tag_t)-1, &rp);
    if (UCS_PTR_IS_ERR(r)) return ft_set_error(FT_ERR_NET, "ucx link: receive: %s", ucs_status_string(UCS_PTR_STATUS(r)));
    if (r == NULL) return ft_set_error(FT_ERR_INTERNAL, "ucx link: a receive completed without a request");
    double dl = timeout_ms >= 0 ? ft_now() + timeout_ms / 1000.0 : 0;
    const char *abort_why = NULL;
    while (!rx.done) {
        if (ucp_worker_progress(u->w)) continue;
        if (u->failed) { abort_why = u->why; break; }
        if (timeout_ms >= 0 && ft_now() > dl) { abort_why = "timeout"; break; }
        if (ucp_worker_arm(u->w) == UCS_ERR_BUSY) continue;
        struct pollfd pf[FT_PIPE_MAX_STAGES + 2];
        int n = 0;
        pf[n++] = (struct pollfd){u->efd, POLLIN, 0};
        for (int i = 0; i < u->nwatch; i++) pf[n++] = (struct pollfd){u->watch[i], POLLIN, 0};
        int wait = 100;
        if (timeout_ms >= 0) {
            int left = (int)((dl - ft_now()) * 1000) + 1;
            if (left < wait) wait = left;
        }
        if (poll(pf, (nfds_t)n, wait) > 0 && watched_event(u, pf, n)) {
            abort_why = "the control connection closed (the driver or a worker is gone)";
            break;
        }
    }
    if (!rx.done) {
        ucp_request_cancel(u->w, r);
        double cdl = ft_now() + 2;
        while (!rx.done && ft_now() < cdl) ucp_worker_progress(u->w);
        if (rx.done) ucp_request_free(r);   /* else leaked: UCX still owns it */
        if (!strcmp(abort_why, "timeout"))
            return ft_set_error(FT_ERR_TIMEOUT, "ucx link: no message within %d ms", timeout_ms);
        u->failed = 1;
        if (abort_why != u->why) snprintf(u->why, sizeof u->why, "%s", abort_why);
        return ft_set_error(FT_ERR_NET, "ucx link: %s", u->why);
    }
    if (r) ucp_request_free(r);
    if (rx.st == UCS_ERR_MESSAGE_TRUNCATED) {
        u->failed = 1;
        snprintf(u->why, sizeof u->why, "a message larger than %zu bytes", cap);
        return ft_set_error(FT_ERR_BUFFER_SMALL, "ucx link: %s", u->why);
    }
    if (rx.st != UCS_OK) return ft_set_error(FT_ERR_NET, "ucx link: receive: %s", ucs_status_string(rx.st));
    *len = rx.len;
    return FT_OK;
}

static void u_close(ft_pipe_link *l)
{
    ucx_link *u = (ucx_link *)l;
    if (!u) return;
    if (u->w) {
        /* let sends in flight finish (the END message), a few seconds at most */
        double dl = ft_now() + 3;
        for (;;) {
            int busy = 0;
            for (int i = 0; i < u->nsb; i++) busy |= u->sb[i]->busy;
            if (!busy || u->failed || ft_now() > dl) break;
            ucp_worker_progress(u->w);
        }
        if (u->ep) {
            ucp_request_param_t p;
            memset(&p, 0, sizeof p);
            p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
            p.flags = UCP_EP_CLOSE_FLAG_FORCE;
            ucs_status_ptr_t r = ucp_ep_close_nbx(u->ep, &p);
            if (r && !UCS_PTR_IS_ERR(r)) {
                double cdl = ft_now() + 2;
                while (ucp_request_check_status(r) == UCS_INPROGRESS && ft_now() < cdl) ucp_worker_progress(u->w);
                ucp_request_free(r);
            }
        }
        /* a send still pending owns its copy until the worker goes */
        ucp_worker_destroy(u->w);
    }
    if (u->ctx) ucp_cleanup(u->ctx);
    for (int i = 0; i < u->nsb; i++) {
        ft_free_aligned(u->sb[i]->p);
        free(u->sb[i]);
    }
    free(u->sb);
    free(u);
}

static const ft_pipe_link_ops ucx_ops = {"ucx", u_send, u_recv, u_close};

ft_status ft_pipe_ucx_create(uint64_t tag, int trusted_tcp, const char *devices, ft_pipe_link **out)
{
    if (!out) return FT_ERR_INVALID_ARG;
    ucx_link *u = calloc(1, sizeof *u);
    if (!u) return FT_ERR_NOMEM;
    u->base.ops = &ucx_ops;
    u->tag = tag;
    u->efd = -1;
    ft_net_ucx_opts o;
    memset(&o, 0, sizeof o);
    o.allow_tcp = trusted_tcp;
    o.net_devices = devices;
    o.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
    ucs_status_t s = ft_net_ucp_open("flextier-pipe", &o, &u->ctx, &u->w, &u->efd);
    if (s != UCS_OK) {
        ft_status st = s == UCS_ERR_UNSUPPORTED
            ? ft_set_error(FT_ERR_UNSUPPORTED, "ucx link: no UCX transport reaches other hosts here (no RDMA "
                           "device; UCX's TCP only on a network named trusted: --trusted-network)")
            : ft_set_error(FT_ERR_NET, "ucx link: %s", ucs_status_string(s));
        u_close(&u->base);
        return st;
    }
    *out = &u->base;
    return FT_OK;
}

ft_status ft_pipe_ucx_address(ft_pipe_link *l, void *buf, size_t cap, size_t *len)
{
    ucx_link *u = (ucx_link *)l;
    ucp_address_t *a = NULL;
    size_t n = 0;
    ucs_status_t s = ucp_worker_get_address(u->w, &a, &n);
    if (s != UCS_OK) return ft_set_error(FT_ERR_NET, "ucx link: worker address: %s", ucs_status_string(s));
    ft_status st = FT_OK;
    if (n > cap) st = ft_set_error(FT_ERR_BUFFER_SMALL, "ucx link: a worker address of %zu bytes", n);
    else memcpy(buf, a, n);
    ucp_worker_release_address(u->w, a);
    if (!st) *len = n;
    return st;
}

ft_status ft_pipe_ucx_connect(ft_pipe_link *l, const void *next_addr, size_t len)
{
    ucx_link *u = (ucx_link *)l;
    if (u->ep) return ft_set_error(FT_ERR_INVALID_ARG, "ucx link: already connected");
    ucs_status_t s = ft_net_ucp_connect(u->w, next_addr, len, ep_err, u, &u->ep);
    if (s != UCS_OK) {
        u->ep = NULL;
        return ft_set_error(FT_ERR_NET, "ucx link: cannot reach the next stage: %s", ucs_status_string(s));
    }
    return FT_OK;
}

void ft_pipe_ucx_watch(ft_pipe_link *l, int fd)
{
    ucx_link *u = (ucx_link *)l;
    if (u && fd >= 0 && u->nwatch < FT_PIPE_MAX_STAGES + 1) u->watch[u->nwatch++] = fd;
}
