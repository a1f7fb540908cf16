/* `flextier worker` and the driver's side of it (flextier/pipe.h,
 * docs/pipeline.md "Workers").
 *
 * A worker listens on one TCP port. A driver connects, authenticates with
 * the memory node's mutual challenge-response (src/net/auth.c: HELLO,
 * AUTH over the node's message header; the token never crosses the wire),
 * then the two exchange control frames on that connection:
 *
 *   driver -> worker   JOB    the stage parameters (ft_pipe_stage_format)
 *   worker -> driver   JOBOK  the worker's UCX address, once the stage is
 *                             built (or ERR with a one-line reason)
 *   driver -> worker   NEXT   the UCX address of the next stage
 *   worker -> driver   READY
 *
 * after which activations flow over UCX and the connection stays open
 * and silent: either side closing it ends the run on the other. The
 * listening side is the memory node's front door (src/net/door.h): the
 * handshakes of any number of connecting peers run concurrently on the
 * door's thread, while a job runs too (a driver that authenticates then
 * is told the worker is busy).
 * Control frame: u32 magic "FTPC", u32 type, u32 length (<= 64 KiB),
 * u32 zero, then the payload. One driver at a time. */
#include "flextier/pipe.h"
#include "pipe_internal.h"
#include "net/auth.h"
#include "net/door.h"
#include "net/msg.h"
#include "net/net.h"

#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define CTL_MAGIC 0x43505446u   /* "FTPC" */
#define CTL_MAX (64u << 10)
enum { CTL_JOB = 1, CTL_JOBOK = 2, CTL_ERR = 3, CTL_NEXT = 4, CTL_READY = 5 };

#define HS_S 5.0          /* handshake deadline                       */
#define JOB_S 30.0        /* the job after authenticating             */
#define LOAD_S 1800.0     /* a stage loading its model                */

static ft_status ctl_send(int fd, uint32_t type, const void *p, size_t n, double dl, const char *what)
{
    uint8_t h[16];
    ft_put_le32(h, CTL_MAGIC);
    ft_put_le32(h + 4, type);
    ft_put_le32(h + 8, (uint32_t)n);
    ft_put_le32(h + 12, 0);
    ft_status st = ft_net_io_full(fd, 1, h, sizeof h, dl, what);
    if (!st && n) st = ft_net_io_full(fd, 1, (void *)p, n, dl, what);
    return st;
}

/* A control frame; ERR frames become an error carrying their text. */
static ft_status ctl_recv(int fd, uint32_t want, void *buf, size_t cap, size_t *n, double dl, const char *what)
{
    uint8_t h[16];
    ft_status st = ft_net_io_full(fd, 0, h, sizeof h, dl, what);
    if (st) return st;
    uint32_t type = ft_get_le32(h + 4), len = ft_get_le32(h + 8);
    if (ft_get_le32(h) != CTL_MAGIC || ft_get_le32(h + 12) || len > CTL_MAX || (type != want && type != CTL_ERR))
        return ft_set_error(FT_ERR_PROTOCOL, "%s: a malformed control frame (type %u, %u bytes)", what, type, len);
    char text[201];
    if (type == CTL_ERR) {
        uint8_t t[200];
        size_t k = len < sizeof t ? len : sizeof t;
        if ((st = ft_net_io_full(fd, 0, t, k, dl, what))) return st;
        for (size_t i = 0; i < k; i++) text[i] = t[i] >= 0x20 && t[i] < 0x7f ? (char)t[i] : '?';
        text[k] = 0;
        return ft_set_error(FT_ERR_NET, "%s: %s", what, text);
    }
    if (len > cap) return ft_set_error(FT_ERR_PROTOCOL, "%s: a control frame of %u bytes (room for %zu)", what, len, cap);
    if (len && (st = ft_net_io_full(fd, 0, buf, len, dl, what))) return st;
    *n = len;
    return FT_OK;
}

static ft_status load_token(const char *file, uint8_t *tok, size_t *len)
{
    *len = 0;
    const char *f = file ? file : getenv("FLEXTIER_TOKEN_FILE");
    if (!f || !*f) return FT_OK;
    return ft_net_read_token(f, FT_TOKEN_MIN, tok, FT_TOKEN_MAX, len);
}

/* ---------------------------------------------------------------- worker */

/* One driver's job, start to end. */
/* busy: the door's admission flag, released before this job's last word
 * to its driver (a driver that reconnects at once on a refusal or after
 * a run found the worker still busy: test_pipe under load). The next job
 * runs only once this one has returned (ft_worker_run's loop). */
static ft_status worker_job(const ft_worker_params *p, int fd, const char *peer, int *busy)
{
    char text[CTL_MAX + 1];
    size_t n = 0;
    ft_status st = ctl_recv(fd, CTL_JOB, text, CTL_MAX, &n, ft_now() + JOB_S, peer);
    if (st) return st;
    text[n] = 0;
    ft_pipe_stage_params sp;
    ft_pipe_stage *stage = NULL;
    ft_pipe_link *link = NULL;
    uint8_t addr[FT_MSG_MAX_ADDR];
    size_t alen = 0;
    if ((st = ft_pipe_stage_parse(text, n, &sp))) goto fail;
    if ((st = ft_worker_job_check(p, &sp))) goto fail;   /* what a job may name */
    if (sp.stage == sp.n_stages - 1) {
        st = ft_set_error(FT_ERR_PROTOCOL, "a worker runs stage 0..S-2, not the last (the driver's)");
        goto fail;
    }
    FT_LOG(FT_LOG_INFO, "worker: %s: stage %d of %d, layers %d-%d of %s", peer, sp.stage, sp.n_stages, sp.l0,
           sp.l1 - 1, sp.model_dir);
    if ((st = ft_pipe_stage_create(&sp, p->off, &stage))) goto fail;
    char devs[512] = "";
    struct sockaddr_storage local;
    socklen_t ll = sizeof local;
    if (getsockname(fd, (struct sockaddr *)&local, &ll) == 0) ft_net_devices_for(&local, devs, sizeof devs);
    if ((st = ft_pipe_ucx_create(sp.job, p->trusted_network, devs, &link))) goto fail;
    if ((st = ft_pipe_ucx_address(link, addr, sizeof addr, &alen))) goto fail;
    if ((st = ctl_send(fd, CTL_JOBOK, addr, alen, ft_now() + JOB_S, peer))) goto out;
    if ((st = ctl_recv(fd, CTL_NEXT, addr, sizeof addr, &alen, ft_now() + LOAD_S, peer))) goto out;
    if ((st = ft_pipe_ucx_connect(link, addr, alen))) goto fail;
    if ((st = ctl_send(fd, CTL_READY, NULL, 0, ft_now() + JOB_S, peer))) goto out;
    ft_pipe_ucx_watch(link, fd);
    /* the run's CPU time and wall time (benchmarks: a stage's busy share
     * on a machine whose cores are shared) */
    struct timespec c0, c1;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
    double w0 = ft_now();
    st = ft_pipe_worker_run(stage, link);
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
    double cpu = (double)(c1.tv_sec - c0.tv_sec) + (double)(c1.tv_nsec - c0.tv_nsec) * 1e-9, wall = ft_now() - w0;
    if (st == FT_OK) {
        /* The end message is on its way around the ring: keep this
         * connection (whose closing would end the driver's wait) until the
         * driver closes it. */
        double dl = ft_now() + 30;
        uint8_t b;
        __atomic_store_n(busy, 0, __ATOMIC_RELEASE);
        while (ft_now() < dl) {
            struct pollfd pf = {fd, POLLIN, 0};
            if (poll(&pf, 1, 1000) > 0 && recv(fd, &b, 1, MSG_DONTWAIT) <= 0) break;
        }
        FT_LOG(FT_LOG_INFO, "worker: %s: run ended (CPU %.3f s in %.3f s)", peer, cpu, wall);
    }
    goto out;
fail:
    {
        char why[200];
        snprintf(why, sizeof why, "%s", ft_last_error());
        __atomic_store_n(busy, 0, __ATOMIC_RELEASE);
        ctl_send(fd, CTL_ERR, why, strlen(why), ft_now() + 2, peer);
        ft_set_error(st, "%s", why);
    }
out:
    ft_pipe_link_close(link);
    ft_pipe_stage_free(stage);
    return st;
}

/* The front door's admission (door.h): one driver at a time. */
static ft_status worker_admit(void *arg, ft_door_conn *c, uint8_t *extra, size_t cap, size_t *len,
                              uint64_t *aux, uint64_t *flags, const char **detail)
{
    (void)c; (void)extra; (void)cap; (void)aux; (void)flags;
    *len = 0;
    if (__atomic_load_n((const int *)arg, __ATOMIC_ACQUIRE)) {
        *detail = "this worker runs another driver's job";
        return FT_ERR_BUSY;
    }
    return FT_OK;
}

ft_status ft_worker_run(const ft_worker_params *p)
{
    if (!p || !p->listen) return ft_set_error(FT_ERR_INVALID_ARG, "worker: no listen address");
    /* the node's front door: concurrent handshakes with deadlines, a cap,
     * back-off, token-file checks, protected mode (src/net/door.h) */
    int busy = 0;
    const char *tf = p->token_file ? p->token_file : getenv("FLEXTIER_TOKEN_FILE");
    ft_door_params dp;
    memset(&dp, 0, sizeof dp);
    dp.what = "worker";
    dp.listen = p->listen;
    dp.token_file = tf && *tf ? tf : NULL;
    dp.admit = worker_admit;
    dp.arg = &busy;
    ft_door *door = NULL;
    ft_status st = ft_door_open(&dp, &door);
    if (st) return st;
    if (p->on_ready) p->on_ready(p->arg, ft_door_bound(door));
    while (!(p->stop && *p->stop)) {
        ft_door_conn dc;
        if (!ft_door_take(door, &dc)) {
            struct pollfd pf = {ft_door_fd(door), POLLIN, 0};
            poll(&pf, 1, 100);
            continue;
        }
        __atomic_store_n(&busy, 1, __ATOMIC_RELEASE);
        ft_status js = worker_job(p, dc.fd, dc.peer, &busy);
        if (js != FT_OK) FT_LOG(FT_LOG_WARN, "worker: %s: %s", dc.peer, ft_last_error());
        close(dc.fd);
        __atomic_store_n(&busy, 0, __ATOMIC_RELEASE);
        if (p->once) break;
    }
    ft_door_close(door);
    return FT_OK;
}

/* ---------------------------------------------------------------- driver */

struct ft_pipe_remote {
    int fd[FT_PIPE_MAX_STAGES];
    int n;
};

void ft_pipe_disconnect(ft_pipe_remote *r)
{
    if (!r) return;
    for (int i = 0; i < r->n; i++)
        if (r->fd[i] >= 0) close(r->fd[i]);
    free(r);
}

static ft_status driver_auth(int fd, const uint8_t *tok, size_t tlen, const char *who)
{
    return ft_door_client_auth(fd, tok, tlen, 0, ft_now() + HS_S, who, NULL, 0, NULL, NULL, NULL);
}

ft_status ft_pipe_connect(const char *const *workers, int n_workers, const ft_pipe_stage_params *params,
                          const char *token_file, int trusted_network, uint64_t job, ft_pipe_link **link,
                          ft_pipe_remote **out)
{
    if (!workers || n_workers < 1 || n_workers >= FT_PIPE_MAX_STAGES || !params || !link || !out)
        return ft_set_error(FT_ERR_INVALID_ARG, "pipeline: %d workers", n_workers);
    ft_pipe_remote *r = calloc(1, sizeof *r);
    if (!r) return FT_ERR_NOMEM;
    for (int i = 0; i < FT_PIPE_MAX_STAGES; i++) r->fd[i] = -1;
    r->n = n_workers;
    uint8_t tok[FT_TOKEN_MAX];
    size_t tlen = 0;
    ft_pipe_link *own = NULL;
    uint8_t (*addr)[FT_MSG_MAX_ADDR] = calloc((size_t)n_workers + 1, sizeof *addr);
    size_t alen[FT_PIPE_MAX_STAGES + 1] = {0};
    ft_status st = addr ? load_token(token_file, tok, &tlen) : FT_ERR_NOMEM;
    for (int i = 0; i < n_workers && !st; i++) {
        struct sockaddr_storage sa;
        socklen_t sl;
        char who[300];
        snprintf(who, sizeof who, "worker %s (stage %d)", workers[i], i);
        if ((st = ft_net_resolve(workers[i], 0, &sa, &sl))) break;
        if (!tlen && !ft_net_is_loopback(&sa)) {
            st = ft_set_error(FT_ERR_INVALID_ARG, "%s: not a loopback address: give the workers' token file", who);
            break;
        }
        if ((st = ft_net_tcp_connect(&sa, sl, 10000, who, &r->fd[i]))) break;
        if ((st = driver_auth(r->fd[i], tok, tlen, who))) break;
        char text[CTL_MAX];
        size_t n = 0;
        if ((st = ft_pipe_stage_format(&params[i], text, sizeof text, &n))) break;
        if ((st = ctl_send(r->fd[i], CTL_JOB, text, n, ft_now() + JOB_S, who))) break;
    }
    memset(tok, 0, sizeof tok);
    if (!st) {   /* this end, on the interface that reaches the first worker */
        char devs[512] = "";
        struct sockaddr_storage local;
        socklen_t ll = sizeof local;
        if (getsockname(r->fd[0], (struct sockaddr *)&local, &ll) == 0) ft_net_devices_for(&local, devs, sizeof devs);
        st = ft_pipe_ucx_create(job, trusted_network, devs, &own);
        if (!st) st = ft_pipe_ucx_address(own, addr[n_workers], FT_MSG_MAX_ADDR, &alen[n_workers]);
    }
    for (int i = 0; i < n_workers && !st; i++) {
        char who[300];
        snprintf(who, sizeof who, "worker %s (stage %d)", workers[i], i);
        st = ctl_recv(r->fd[i], CTL_JOBOK, addr[i], FT_MSG_MAX_ADDR, &alen[i], ft_now() + LOAD_S, who);
    }
    for (int i = 0; i < n_workers && !st; i++) {
        char who[300];
        size_t z;
        snprintf(who, sizeof who, "worker %s (stage %d)", workers[i], i);
        st = ctl_send(r->fd[i], CTL_NEXT, addr[i + 1], alen[i + 1], ft_now() + JOB_S, who);
        if (!st) st = ctl_recv(r->fd[i], CTL_READY, NULL, 0, &z, ft_now() + JOB_S, who);
    }
    if (!st) st = ft_pipe_ucx_connect(own, addr[0], alen[0]);
    free(addr);
    if (st) {
        ft_pipe_link_close(own);
        ft_pipe_disconnect(r);
        return st;
    }
    for (int i = 0; i < n_workers; i++) ft_pipe_ucx_watch(own, r->fd[i]);
    *link = own;
    *out = r;
    return FT_OK;
}
