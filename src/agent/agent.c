/* `flextier agent`: the codec agent (flextier/agent.h, docs/agent.md).
 *
 * Front door. The agent listens on one TCP port, the memory node's front
 * door (src/net/door.h): the node's mutual HMAC challenge-response on the
 * door's thread, concurrent, with deadlines, a cap, back-off, token-file
 * checks and protected mode. Only authenticated connections reach the
 * main thread; their requests and replies are the agent's messages
 * (net/agent_msg.h) on that connection. UCX listens on nothing: the
 * agent's UCP context has no listener, no shared-memory transports and no
 * TCP unless --trusted-network (and then only on the --listen
 * interface); it only opens RMA endpoints to the worker addresses that
 * authenticated clients send (checked by ft_net_ucx_addr_check first).
 *
 * Threads. The main thread owns the connections and the UCP worker (RMA
 * get/put into the clients' registered buffers), single-threaded like
 * the memory node. `threads` worker
 * threads do what blocks: the codec work and the memory-node I/O, through
 * the public store API (ft_*_async on one ucx:// store per memory node,
 * whose own worker threads encode/decode with one core each). A request
 * is a job that moves between the two through queues, in phases:
 *
 *   WRITE  worker: reserve staging -> main: RMA get of the client's tensor
 *          -> worker: encode + store on the node -> main: reply
 *   READ   worker: stat, reserve staging, fetch + decode into it (the
 *          store client pipelines ranges and chunk decoding) -> main: RMA
 *          put into the client's buffer, flush (remote completion) -> reply
 *   others worker: the store call -> main: reply (with its body)
 *
 * Data path. A client on this machine is identified by the kernel
 * (FT_AOP_CMA: it presents its session's nonce on our Unix socket, and the
 * kernel names the process; net/cma.h) and its tensors then move by
 * cross-memory attach, process_vm_readv/writev, on the worker threads,
 * each copy after the checks of ft_cma_check (same process, not exec'd,
 * our uid, dumpable): one kernel copy, charged to the agent, none of it on
 * the client's cores. Any other client (a host seen from a DPU) is
 * served by UCX RMA on an endpoint to its worker address (RDMA where the
 * fabric has it); UCX 1.13 emulates RMA with active messages on TCP and
 * shared memory, which the client's worker then serves, so on one machine
 * CMA is the path that takes the work off the client.
 *
 * Staging (the only place a tensor lives here) is bounded by max_staging:
 * a job that does not fit waits, without holding a worker thread, until
 * finishing jobs release theirs. A job holds a reference on its
 * connection; a connection that dies (PEER error mode) is force-closed by
 * the main loop and freed when its last job is gone, so a client killed
 * mid-transfer leaves nothing behind: its WRITE never reaches the node,
 * its READ's put fails and the staging is freed. */
#define _GNU_SOURCE   /* process_vm_readv/writev */
#include "net/agent_msg.h"
#include "net/cma.h"
#include "net/auth.h"
#include "net/door.h"
#include "net/msg.h"
#include "net/net.h"
#include "flextier/agent.h"
#include "flextier/store.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>
#include <ucp/api/ucp.h>

#define MAX_OPS_PER_CONN 256u
#define READ_BUDGET (16u << 20)   /* bytes read from one conn per loop turn */

typedef struct agent agent;

typedef struct job job;

typedef struct aconn {
    int           fd;            /* the authenticated TCP connection     */
    ucp_ep_h      rma_ep;        /* to the client's worker address: RMA  */
    uint64_t      id;
    char          peer[64];
    int           authed, dead, closed;
    unsigned      node;          /* memory node chosen at HELLO */
    ft_cma_peer   cma;           /* verified same-machine client: tensors
                                    move by process_vm_readv/writev (closed:
                                    by UCX RMA on rma_ep) */
    uint8_t       cma_nonce[FT_CMA_NONCE];
    int           cma_offered;   /* 1 offered, -1 claimed (once per conn) */
    uint8_t       challenge[FT_AMSG_CHALLENGE];
    unsigned      refs;          /* jobs and replies outstanding */
    ucs_status_ptr_t rma_close_req;
    /* input: header (+ key), then body */
    uint8_t       rx_hdr[FT_AMSG_MAX_HDR];
    size_t        rx_have, rx_need;
    int           rx_body;
    uint8_t      *rx_buf;
    uint64_t      rx_len, rx_done;
    /* output: replies in order */
    job          *tx_head, *tx_tail;
    struct aconn *next;
} aconn;

enum phase {
    P_RESERVE,   /* worker: staging for a WRITE          */
    P_GET,       /* main: RMA get from the client         */
    P_WRITE,     /* worker: encode + store                */
    P_READ,      /* worker: stat + fetch + decode         */
    P_PUT,       /* main: RMA put into the client, flush  */
    P_EXEC,      /* worker: the other operations          */
    P_REPLY      /* main: reply                           */
};

struct job {
    agent        *A;
    aconn        *c;
    uint16_t      op;
    enum phase    phase;
    uint64_t      req_id;
    char          key[FT_KEY_MAX + 1];
    ft_tensor     t;             /* WRITE: tensor (data = staging); READ: result */
    ft_codec_params cp;
    int           out_dtype;     /* READ */
    uint64_t      raddr, rlen;   /* the client's buffer */
    uint8_t       rkey_buf[FT_AMSG_MAX_RKEY];
    size_t        rkey_len;
    ucp_rkey_h    rkey;
    uint8_t      *staging;
    uint64_t      staged;        /* bytes of max_staging held */
    uint64_t      need;          /* bytes to reserve */
    void         *body;          /* reply body or PUTF frame (heap) */
    size_t        body_len;
    int           body_aligned;  /* body from ft_malloc_aligned */
    uint64_t      aux;
    ft_status     st;
    char          detail[FT_AMSG_ERR_MAX + 1];
    uint8_t       hdr[FT_AMSG_MAX_HDR];
    size_t        tx_hlen;       /* reply on the wire: hdr, then tx_body */
    const void   *tx_body;
    size_t        tx_blen, tx_off;
    struct job   *next;
};

struct agent {
    ft_agent_params p;
    ft_store      *up[FT_AGENT_MAX_NODES];
    char           node_names[FT_AGENT_MAX_NODES][FT_AMSG_MAX_NODE + 1]; /* HOST:PORT */
    ft_door       *door;
    ucp_context_h  ctx;           /* NULL: no UCX toward clients (CMA only) */
    ucp_worker_h   w;
    ft_cma_door   *cma_door;     /* NULL: no cross-memory attach */
    int            efd, evfd;
    aconn         *conns;
    unsigned       nconns;        /* read by the door's thread (admission) */
    /* queues (q_lock) */
    pthread_mutex_t q_lock;
    pthread_cond_t  q_cond;
    job           *work_head, *work_tail;   /* to the workers      */
    job           *done_head, *done_tail;   /* to the main thread  */
    job           *wait_head, *wait_tail;   /* waiting for staging */
    uint64_t       staged;                  /* bytes reserved      */
    unsigned       jobs;                    /* alive (main thread) */
    int            stop_workers;
    pthread_t     *threads;
    unsigned       nthreads;
};

static void q_push(job **head, job **tail, job *j)
{
    j->next = NULL;
    if (*tail) (*tail)->next = j; else *head = j;
    *tail = j;
}

static job *q_pop(job **head, job **tail)
{
    job *j = *head;
    if (j) {
        *head = j->next;
        if (!*head) *tail = NULL;
        j->next = NULL;
    }
    return j;
}

static void to_workers(agent *A, job *j)
{
    pthread_mutex_lock(&A->q_lock);
    q_push(&A->work_head, &A->work_tail, j);
    pthread_cond_signal(&A->q_cond);
    pthread_mutex_unlock(&A->q_lock);
}

static void to_main(agent *A, job *j)
{
    pthread_mutex_lock(&A->q_lock);
    q_push(&A->done_head, &A->done_tail, j);
    pthread_mutex_unlock(&A->q_lock);
    uint64_t one = 1;
    ssize_t r = write(A->evfd, &one, sizeof one);
    (void)r;   /* a full counter still wakes the loop */
}

static void job_fail(job *j, ft_status st, const char *detail)
{
    if (j->st == FT_OK) {
        j->st = st;
        snprintf(j->detail, sizeof j->detail, "%s", detail && *detail ? detail : ft_status_str(st));
    }
    j->phase = P_REPLY;
}

/* --------------------------------------------------------------- staging */

/* Reserve j->need bytes of max_staging (q_lock held). A request larger
 * than the whole budget runs alone. */
static int staging_try(agent *A, job *j)
{
    if (A->staged && A->staged + j->need > A->p.max_staging) return 0;
    A->staged += j->need;
    j->staged = j->need;
    return 1;
}

static void staging_release(agent *A, job *j)
{
    free(j->staging);
    j->staging = NULL;
    if (!j->staged) return;
    pthread_mutex_lock(&A->q_lock);
    A->staged -= j->staged;
    j->staged = 0;
    /* waiting jobs that fit now go back to the workers, in order */
    while (A->wait_head) {
        job *w = A->wait_head;
        if (A->staged && A->staged + w->need > A->p.max_staging) break;
        q_pop(&A->wait_head, &A->wait_tail);
        q_push(&A->work_head, &A->work_tail, w);
        pthread_cond_signal(&A->q_cond);
    }
    pthread_mutex_unlock(&A->q_lock);
}

/* ------------------------------------------------------------------- CMA */

/* Copies go through ft_cma_read/ft_cma_write (net/cma.c): each one
 * checks first that the process is still the one the kernel named. */

/* ---------------------------------------------------------------- workers */

static ft_status wait_req(ft_request *r)
{
    ft_status st = ft_request_wait(r, -1);
    ft_request_free(r);
    return st;
}

static void detail_from_error(job *j, ft_status st)
{
    j->st = st;
    snprintf(j->detail, sizeof j->detail, "%s", ft_last_error());
}

/* READ: stat, reserve staging in the output dtype, fetch + decode. Returns
 * 0 when the job waits for staging. */
static int do_read(agent *A, job *j, ft_store *up)
{
    if (!j->staged && j->out_dtype >= 0 && j->rlen <= A->p.max_staging) {
        /* the output dtype is known: the client's capacity bounds the
         * staging (the store refuses a larger tensor), no size query */
        j->need = j->rlen;
        j->t.dtype = (ft_dtype)j->out_dtype;
        pthread_mutex_lock(&A->q_lock);
        int ok = staging_try(A, j);
        if (!ok) q_push(&A->wait_head, &A->wait_tail, j);
        pthread_mutex_unlock(&A->q_lock);
        if (!ok) return 0;
    }
    if (!j->staged) {
        ft_tensor_stat ts;
        ft_status st = ft_stat_tensor(up, j->key, &ts);
        if (st != FT_OK) { detail_from_error(j, st); return 1; }
        int od = j->out_dtype < 0 ? (int)ts.dtype : j->out_dtype;
        uint64_t numel = 0;
        if (ft_shape_numel(ts.ndim, ts.shape, &numel) != FT_OK) {
            detail_from_error(j, FT_ERR_CORRUPT);
            return 1;
        }
        uint64_t need = ft_dtype_nbytes((ft_dtype)od, numel);
        if (need > j->rlen) {
            j->aux = need;
            j->st = FT_ERR_BUFFER_SMALL;
            snprintf(j->detail, sizeof j->detail,
                     "decoded tensor needs %llu bytes, buffer has %llu", (unsigned long long)need,
                     (unsigned long long)j->rlen);
            return 1;
        }
        j->need = need;
        j->t.dtype = (ft_dtype)od;
        pthread_mutex_lock(&A->q_lock);
        int ok = staging_try(A, j);
        if (!ok) q_push(&A->wait_head, &A->wait_tail, j);
        pthread_mutex_unlock(&A->q_lock);
        if (!ok) return 0;
    }
    size_t cap = (size_t)j->need;
    j->staging = malloc(cap ? cap : 1);
    if (!j->staging) {
        j->st = FT_ERR_NOMEM;
        snprintf(j->detail, sizeof j->detail, "agent: no memory for %zu bytes", cap);
        return 1;
    }
    ft_tensor dst;
    memset(&dst, 0, sizeof dst);
    dst.dtype = j->t.dtype;
    dst.data = j->staging;
    ft_request *r = NULL;
    ft_status st = ft_read_tensor_async(up, j->key, &dst, cap, &r);
    if (st == FT_OK) st = wait_req(r);
    if (st == FT_ERR_BUFFER_SMALL && j->out_dtype >= 0 && j->rlen <= A->p.max_staging) {
        detail_from_error(j, st);   /* the client's buffer is too small */
        return 1;
    }
    if (st == FT_ERR_BUFFER_SMALL) {
        /* replaced by a larger tensor since the stat: start over */
        staging_release(A, j);
        j->st = FT_ERR_BUSY;
        snprintf(j->detail, sizeof j->detail, "tensor '%.120s' replaced during the read", j->key);
        return 1;
    }
    if (st != FT_OK) { detail_from_error(j, st); return 1; }
    dst.data = NULL;
    j->t = dst;
    uint64_t numel = 0;
    ft_tensor_numel(&j->t, &numel);
    j->need = ft_dtype_nbytes(j->t.dtype, numel);
    j->phase = P_PUT;
    if (ft_cma_peer_open(&j->c->cma)) {
        st = ft_cma_write(NULL, &j->c->cma, j->staging, j->raddr, (size_t)j->need);
        if (st != FT_OK) detail_from_error(j, st);
        j->phase = P_REPLY;
    }
    return 1;
}

static void do_exec(job *j, ft_store *up)
{
    ft_status st = FT_OK;
    switch (j->op) {
    case FT_AOP_DEL:
        st = ft_delete_tensor(up, j->key);
        break;
    case FT_AOP_STAT: {
        ft_tensor_stat ts;
        st = ft_stat_tensor(up, j->key, &ts);
        if (st == FT_OK && !(j->body = malloc(FT_AMSG_STAT_SIZE))) st = FT_ERR_NOMEM;
        if (st == FT_OK) {
            ft_amsg_stat_encode(&ts, j->body);
            j->body_len = FT_AMSG_STAT_SIZE;
        }
        break;
    }
    case FT_AOP_STATS: {
        ft_store_stats s;
        st = ft_store_stats_get(up, &s);
        if (st == FT_OK && !(j->body = malloc(FT_AMSG_STATS_SIZE))) st = FT_ERR_NOMEM;
        if (st == FT_OK) {
            ft_amsg_stats_encode(&s, j->body);
            j->body_len = FT_AMSG_STATS_SIZE;
        }
        break;
    }
    case FT_AOP_LIST: {
        char **keys = NULL;
        size_t n = 0;
        st = ft_list_tensors(up, &keys, &n);
        if (st == FT_OK) {
            uint8_t *b = NULL;
            size_t bl = 0;
            st = ft_amsg_list_encode(keys, n, &b, &bl);
            ft_list_free(keys, n);
            j->body = b;
            j->body_len = bl;
        }
        break;
    }
    case FT_AOP_PUTF:
        st = ft_store_put_frame(up, j->key, j->body, j->body_len);
        free(j->body);
        j->body = NULL;
        j->body_len = 0;
        break;
    case FT_AOP_GETF: {
        void *f = NULL;
        size_t n = 0;
        st = ft_store_get_frame(up, j->key, &f, &n);
        if (st == FT_OK) {
            j->body = f;
            j->body_len = n;
            j->body_aligned = 1;
        }
        break;
    }
    default:
        st = ft_set_error(FT_ERR_INTERNAL, "opcode %u", j->op);
    }
    if (st != FT_OK) detail_from_error(j, st);
}

static void *worker_main(void *arg)
{
    agent *A = arg;
    for (;;) {
        pthread_mutex_lock(&A->q_lock);
        while (!A->work_head && !A->stop_workers) pthread_cond_wait(&A->q_cond, &A->q_lock);
        job *j = q_pop(&A->work_head, &A->work_tail);
        pthread_mutex_unlock(&A->q_lock);
        if (!j) break;
        ft_clear_error();
        ft_store *up = A->up[j->c->node];
        int post = 1;
        switch (j->phase) {
        case P_RESERVE:
            pthread_mutex_lock(&A->q_lock);
            if (!staging_try(A, j)) {
                q_push(&A->wait_head, &A->wait_tail, j);
                post = 0;
            }
            pthread_mutex_unlock(&A->q_lock);
            if (!post) break;
            j->staging = malloc(j->need ? j->need : 1);
            if (!j->staging) {
                job_fail(j, FT_ERR_NOMEM, "agent: no memory for the tensor");
                break;
            }
            j->phase = P_GET;
            if (!ft_cma_peer_open(&j->c->cma)) break;   /* the main thread gets it by RMA */
            {
                ft_status st = ft_cma_read(NULL, &j->c->cma, j->staging, j->raddr, (size_t)j->need);
                if (st != FT_OK) {
                    job_fail(j, st, ft_last_error());
                    break;
                }
            }
            j->phase = P_WRITE;   /* encode and store on this thread */
            __attribute__((fallthrough));
        case P_WRITE: {
            j->t.data = j->staging;
            ft_request *r = NULL;
            ft_status st = ft_write_tensor_async(up, j->key, &j->t, &j->cp, &r);
            if (st == FT_OK) st = wait_req(r);
            if (st != FT_OK) detail_from_error(j, st);
            j->phase = P_REPLY;
            break;
        }
        case P_READ:
            post = do_read(A, j, up);
            if (post && j->phase == P_READ) j->phase = P_REPLY;
            break;
        case P_EXEC:
            do_exec(j, up);
            j->phase = P_REPLY;
            break;
        default:
            job_fail(j, FT_ERR_INTERNAL, "job in a main-thread phase on a worker");
        }
        if (post) to_main(A, j);
    }
    return NULL;
}

/* ------------------------------------------------------------ main thread */

static void job_free(job *j)
{
    agent *A = j->A;
    staging_release(A, j);
    if (j->rkey) ucp_rkey_destroy(j->rkey);
    if (j->body_aligned) ft_free_aligned(j->body);
    else free(j->body);
    j->c->refs--;
    A->jobs--;
    free(j);
}

static void conn_flush(aconn *c);

static void send_reply(job *j)
{
    aconn *c = j->c;
    if (c->dead) { job_free(j); return; }
    const void *body = NULL;
    size_t blen = 0;
    uint64_t aux = 0;
    if (j->st != FT_OK) {
        body = j->detail;
        blen = strlen(j->detail);
        if (j->st == FT_ERR_BUFFER_SMALL) aux = j->aux;
    } else if (j->op == FT_AOP_READ) {
        /* the result's descriptor, built in the staging-free body */
        if (!(j->body = malloc(FT_AMSG_DESC_SIZE))) {
            job_fail(j, FT_ERR_NOMEM, "agent: no memory");
            body = j->detail;
            blen = strlen(j->detail);
        } else {
            ft_amsg_desc_encode(&j->t, j->body);
            body = j->body;
            blen = FT_AMSG_DESC_SIZE;
        }
    } else {
        body = j->body;
        blen = j->body_len;
        if (j->op == FT_AOP_WRITE) aux = j->aux;
    }
    j->tx_hlen = ft_amsg_encode(j->hdr, (uint16_t)(j->op | FT_AOP_REPLY), j->req_id, (int32_t)j->st, NULL, 0,
                                blen, 0, 0, aux);
    j->tx_body = body;
    j->tx_blen = blen;
    j->tx_off = 0;
    j->next = NULL;
    if (c->tx_tail) c->tx_tail->next = j; else c->tx_head = j;
    c->tx_tail = j;
    conn_flush(c);
}

/* Write queued replies until the socket is full. */
static void conn_flush(aconn *c)
{
    while (c->tx_head && !c->dead) {
        job *j = c->tx_head;
        size_t total = j->tx_hlen + j->tx_blen;
        while (j->tx_off < total) {
            struct iovec iov[2];
            int n = 0;
            if (j->tx_off < j->tx_hlen) {
                iov[n].iov_base = j->hdr + j->tx_off;
                iov[n++].iov_len = j->tx_hlen - j->tx_off;
                if (j->tx_blen) {
                    iov[n].iov_base = (void *)j->tx_body;
                    iov[n++].iov_len = j->tx_blen;
                }
            } else {
                iov[n].iov_base = (uint8_t *)j->tx_body + (j->tx_off - j->tx_hlen);
                iov[n++].iov_len = total - j->tx_off;
            }
            struct msghdr mh;
            memset(&mh, 0, sizeof mh);
            mh.msg_iov = iov;
            mh.msg_iovlen = (size_t)n;
            ssize_t w = sendmsg(c->fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
            if (w < 0 && errno == EINTR) continue;
            if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
            if (w <= 0) {
                FT_LOG(FT_LOG_INFO, "agent: conn %llu (%s): reply not delivered: %s", (unsigned long long)c->id,
                       c->peer, strerror(errno));
                c->dead = 1;
                return;
            }
            j->tx_off += (size_t)w;
        }
        c->tx_head = j->next;
        if (!c->tx_head) c->tx_tail = NULL;
        job_free(j);
    }
}

static ft_status unpack_rkey(job *j)
{
    ucs_status_t s = ucp_ep_rkey_unpack(j->c->rma_ep, j->rkey_buf, &j->rkey);
    if (s != UCS_OK) {
        j->rkey = NULL;
        return ft_set_error(FT_ERR_PROTOCOL, "cannot unpack the client's remote key: %s",
                            ucs_status_string(s));
    }
    return FT_OK;
}

static void main_step(agent *A, job *j);

static void get_done_cb(void *req, ucs_status_t status, void *user)
{
    job *j = user;
    if (status != UCS_OK) {
        char d[160];
        snprintf(d, sizeof d, "reading the client's tensor: %s", ucs_status_string(status));
        job_fail(j, FT_ERR_NET, d);
    }
    ucp_request_free(req);
    main_step(j->A, j);
}

static void flush_done_cb(void *req, ucs_status_t status, void *user)
{
    job *j = user;
    if (status != UCS_OK) {
        char d[160];
        snprintf(d, sizeof d, "writing into the client's buffer: %s", ucs_status_string(status));
        job_fail(j, FT_ERR_NET, d);
    }
    j->phase = P_REPLY;
    ucp_request_free(req);
    main_step(j->A, j);
}

/* Advance a job that is in a main-thread phase (or hand it on). */
static void main_step(agent *A, job *j)
{
    if (j->c->dead) { job_free(j); return; }
    ucp_request_param_t rp;   /* callbacks: rp.cb.send is set per operation */
    memset(&rp, 0, sizeof rp);
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    rp.user_data = j;
    switch (j->phase) {
    case P_GET: {
        /* After the get: destroy the rkey, then encode on a worker. */
        if (j->rkey == NULL && j->need) {
            if (unpack_rkey(j) != FT_OK) { job_fail(j, FT_ERR_PROTOCOL, ft_last_error()); break; }
            j->phase = P_GET;
            rp.cb.send = get_done_cb;
            ucs_status_ptr_t r = ucp_get_nbx(j->c->rma_ep, j->staging, j->need, j->raddr, j->rkey, &rp);
            if (UCS_PTR_IS_ERR(r)) {
                job_fail(j, FT_ERR_NET, ucs_status_string(UCS_PTR_STATUS(r)));
                break;
            }
            if (r) return;          /* get_done_cb continues */
        }
        if (j->phase == P_REPLY) break;
        if (j->rkey) { ucp_rkey_destroy(j->rkey); j->rkey = NULL; }
        j->phase = P_WRITE;
        to_workers(A, j);
        return;
    }
    case P_PUT: {
        if (j->need) {
            if (unpack_rkey(j) != FT_OK) { job_fail(j, FT_ERR_PROTOCOL, ft_last_error()); break; }
            ucp_request_param_t pp;
            memset(&pp, 0, sizeof pp);
            ucs_status_ptr_t r = ucp_put_nbx(j->c->rma_ep, j->staging, j->need, j->raddr, j->rkey, &pp);
            if (UCS_PTR_IS_ERR(r)) {
                job_fail(j, FT_ERR_NET, ucs_status_string(UCS_PTR_STATUS(r)));
                break;
            }
            if (r) ucp_request_free(r);   /* completes on its own; the flush reports errors */
            /* the reply may only leave once the bytes are in the client's
             * buffer: flush = remote completion of the put */
            j->phase = P_REPLY;
            rp.cb.send = flush_done_cb;
            ucs_status_ptr_t f = ucp_ep_flush_nbx(j->c->rma_ep, &rp);
            if (UCS_PTR_IS_ERR(f)) {
                job_fail(j, FT_ERR_NET, ucs_status_string(UCS_PTR_STATUS(f)));
                break;
            }
            if (f) return;          /* flush_done_cb continues */
        }
        j->phase = P_REPLY;
        break;
    }
    case P_REPLY:
        break;
    default:
        to_workers(A, j);
        return;
    }
    staging_release(A, j);    /* before the reply: the tensor is delivered */
    send_reply(j);
}

static void drain_done(agent *A)
{
    uint64_t v;
    ssize_t r = read(A->evfd, &v, sizeof v);
    (void)r;
    for (;;) {
        pthread_mutex_lock(&A->q_lock);
        job *j = q_pop(&A->done_head, &A->done_tail);
        pthread_mutex_unlock(&A->q_lock);
        if (!j) break;
        main_step(A, j);
    }
}

/* ------------------------------------------------------------- requests */

static job *job_new(agent *A, aconn *c, const ft_amsg *m)
{
    job *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    j->A = A;
    j->c = c;
    j->op = m->opcode;
    j->req_id = m->req_id;
    if (m->key_len) memcpy(j->key, m->key, m->key_len);
    j->key[m->key_len] = 0;
    c->refs++;
    A->jobs++;
    return j;
}

/* An error reply without a job of its own. */
static void reply_error(agent *A, aconn *c, const ft_amsg *m, uint16_t op, ft_status st,
                        const char *detail)
{
    ft_amsg mm = *m;
    mm.key_len = 0;
    job *j = job_new(A, c, &mm);
    if (!j) return;
    j->op = op;
    job_fail(j, st, detail);
    send_reply(j);
}

static void conn_err_cb(void *arg, ucp_ep_h ep, ucs_status_t status);

/* The first message after the front door: the memory node to use and the
 * client's UCX worker address (for RMA). The token was checked at the
 * door. */
static void handle_hello(agent *A, aconn *c, const ft_amsg *m, const void *data)
{
    ft_amsg_hello h;
    ft_status st = ft_amsg_hello_parse(data, m->data_len, &h);
    if (st != FT_OK) { reply_error(A, c, m, FT_AOP_HELLO, st, ft_last_error()); return; }
    if (c->authed) { reply_error(A, c, m, FT_AOP_HELLO, FT_ERR_PROTOCOL, "HELLO twice"); return; }
    unsigned node = 0;
    if (h.node[0]) {
        const char *want = strncmp(h.node, "ucx://", 6) ? h.node : h.node + 6;
        for (node = 0; node < A->p.n_nodes; node++)
            if (!strcmp(A->node_names[node], want)) break;
        if (node == A->p.n_nodes) {
            char d[FT_AMSG_ERR_MAX];
            snprintf(d, sizeof d, "memory node '%.100s' is not one of this agent's (--node)", h.node);
            reply_error(A, c, m, FT_AOP_HELLO, FT_ERR_INVALID_ARG, d);
            return;
        }
    }
    if (h.waddr_len && A->w) {
        if (ft_net_ucx_addr_check(h.waddr, h.waddr_len) != FT_OK) {
            /* a protocol error: this connection ends, the agent goes on */
            FT_LOG(FT_LOG_WARN, "agent: conn %llu (%s): %s; closing it", (unsigned long long)c->id, c->peer,
                   ft_last_error());
            c->dead = 1;
            return;
        }
        /* PEER mode: a client that dies must fail our operations, not
         * leave UCX with an endpoint in undefined state (seen crashing
         * under qemu). */
        ucs_status_t s = ft_net_ucp_connect(A->w, h.waddr, h.waddr_len, conn_err_cb, c, &c->rma_ep);
        if (s != UCS_OK) {
            c->rma_ep = NULL;
            FT_LOG(FT_LOG_INFO, "agent: conn %llu (%s): no UCX endpoint to the client: %s",
                   (unsigned long long)c->id, c->peer, ucs_status_string(s));
        }
    }
    c->node = node;
    c->authed = 1;
    FT_LOG(FT_LOG_INFO, "agent: conn %llu (%s): node %s%s", (unsigned long long)c->id, c->peer,
           A->node_names[node], c->rma_ep ? ", UCX RMA possible" : "");
    job *j = job_new(A, c, m);
    if (!j) return;
    j->phase = P_REPLY;
    /* the CMA challenge (see FT_AOP_CMA) */
    if (getrandom(c->challenge, sizeof c->challenge, 0) == (ssize_t)sizeof c->challenge &&
        (j->body = malloc(FT_AMSG_CHALLENGE))) {
        memcpy(j->body, c->challenge, FT_AMSG_CHALLENGE);
        j->body_len = FT_AMSG_CHALLENGE;
    }
    send_reply(j);
}

/* Cross-memory attach (net/cma.h): step 1 (body u64 1) answers with
 * this session's nonce and our Unix socket's name; step 2 (u64 2): the
 * client has presented the nonce there, the kernel names its process. */
static void handle_cma(agent *A, aconn *c, const ft_amsg *m, const void *data)
{
    const uint8_t *b = data;
    uint64_t step = 0;
    for (int i = 7; i >= 0; i--) step = (step << 8) | b[i];
    uint8_t offer[FT_CMA_OFFER_SIZE];
    ft_status st;
    if (ft_cma_peer_open(&c->cma)) {
        st = ft_set_error(FT_ERR_PROTOCOL, "cross-memory attach already set up");
    } else if (!A->cma_door) {
        st = ft_set_error(FT_ERR_UNSUPPORTED, "this agent has no cross-memory attach");
    } else if (step == 1 && !c->cma_offered) {
        st = ft_cma_door_offer(A->cma_door, c->cma_nonce, offer);
        c->cma_offered = st == FT_OK;
    } else if (step == 2 && c->cma_offered == 1) {
        c->cma_offered = -1;   /* one try per connection */
        st = ft_cma_door_claim(A->cma_door, c->cma_nonce, 0.25, &c->cma);
        memset(c->cma_nonce, 0, sizeof c->cma_nonce);
    } else {
        st = ft_set_error(FT_ERR_PROTOCOL, "cross-memory attach step %llu out of order",
                          (unsigned long long)step);
    }
    if (st != FT_OK) {
        FT_LOG(FT_LOG_INFO, "agent: conn %llu (%s): no CMA: %s", (unsigned long long)c->id, c->peer,
               ft_last_error());
        reply_error(A, c, m, FT_AOP_CMA, st == FT_ERR_PROTOCOL ? st : FT_ERR_UNSUPPORTED,
                    "cross-memory attach to the client is not possible; using UCX RMA");
        return;
    }
    job *j = job_new(A, c, m);
    if (!j) return;
    j->phase = P_REPLY;
    if (step == 1) {
        if ((j->body = malloc(sizeof offer))) {
            memcpy(j->body, offer, sizeof offer);
            j->body_len = sizeof offer;
        } else {
            job_fail(j, FT_ERR_NOMEM, "agent: out of memory");
        }
    } else {
        FT_LOG(FT_LOG_INFO, "agent: conn %llu (%s): same machine, tensors move by CMA (pid %d)",
               (unsigned long long)c->id, c->peer, (int)c->cma.pid);
    }
    send_reply(j);
}

/* One whole request of an authenticated connection (header hdr of hlen
 * bytes, body of m.data_len bytes, heap). *taken: the job keeps body. */
static void on_request(agent *A, aconn *c, const uint8_t *hdr, size_t hlen, uint8_t *body, int *taken)
{
    ft_amsg m;
    const void *data = body;
    ft_status st = ft_amsg_parse(hdr, hlen, (size_t)ft_get_le64(hdr + 24), 0, A->p.max_staging, &m);
    if (st != FT_OK) {
        /* the framing held (the reader checked the lengths), the message
         * did not: answer it and close (one protocol error ends the
         * connection, as on the node's TCP path) */
        FT_LOG(FT_LOG_WARN, "agent: conn %llu (%s): bad message: %s", (unsigned long long)c->id, c->peer,
               ft_last_error());
        c->dead = 1;
        return;
    }
    if (c->refs >= MAX_OPS_PER_CONN) {
        reply_error(A, c, &m, m.opcode, FT_ERR_BUSY, "too many requests in flight");
        return;
    }
    if (m.opcode == FT_AOP_HELLO) { handle_hello(A, c, &m, data); return; }
    if (!c->authed) {
        reply_error(A, c, &m, m.opcode, FT_ERR_PROTOCOL, "HELLO first");
        return;
    }
    if (m.opcode == FT_AOP_CMA) { handle_cma(A, c, &m, data); return; }
    job *j = job_new(A, c, &m);
    if (!j) return;
    const uint8_t *rk = NULL;
    size_t rkl = 0;
    switch (m.opcode) {
    case FT_AOP_WRITE: {
        st = ft_amsg_write_parse(data, m.data_len, &j->t, &j->cp, &rk, &rkl);
        uint64_t nb = 0;
        if (st == FT_OK) ft_tensor_nbytes(&j->t, &nb);
        if (st == FT_OK && nb != m.len)
            st = ft_set_error(FT_ERR_PROTOCOL, "WRITE of %llu bytes for a tensor of %llu",
                              (unsigned long long)m.len, (unsigned long long)nb);
        /* staging bounds what the agent takes (and what ft_encode_bound,
         * linear in the chunk count, is asked about) */
        if (st == FT_OK && nb > A->p.max_staging)
            st = ft_set_error(FT_ERR_NO_SPACE, "tensor of %llu bytes over the agent's staging (%llu, --max-staging)",
                              (unsigned long long)nb, (unsigned long long)A->p.max_staging);
        if (st == FT_OK && nb && !ft_cma_peer_open(&c->cma) && (rkl == 0 || !c->rma_ep))
            st = ft_set_error(FT_ERR_PROTOCOL, "WRITE without a data path (no CMA, no remote key or UCX endpoint)");
        if (st == FT_OK && ft_encode_bound(&j->cp, j->t.dtype, j->t.ndim, j->t.shape) == 0)
            st = ft_set_error(FT_ERR_INVALID_ARG, "invalid codec params or shape for '%s'", j->key);
        if (st != FT_OK) { job_fail(j, st, ft_last_error()); send_reply(j); return; }
        memcpy(j->rkey_buf, rk, rkl);
        j->rkey_len = rkl;
        j->raddr = m.addr;
        j->need = nb;
        j->phase = P_RESERVE;
        to_workers(A, j);
        return;
    }
    case FT_AOP_READ:
        st = ft_amsg_read_parse(data, m.data_len, &j->out_dtype, &rk, &rkl);
        if (st == FT_OK && m.len && !ft_cma_peer_open(&c->cma) && (rkl == 0 || !c->rma_ep))
            st = ft_set_error(FT_ERR_PROTOCOL, "READ without a data path (no CMA, no remote key or UCX endpoint)");
        if (st != FT_OK) { job_fail(j, st, ft_last_error()); send_reply(j); return; }
        memcpy(j->rkey_buf, rk, rkl);
        j->rkey_len = rkl;
        j->raddr = m.addr;
        j->rlen = m.len;
        j->phase = P_READ;
        to_workers(A, j);
        return;
    case FT_AOP_PUTF:
        j->body = body;   /* the frame, received whole */
        j->body_len = (size_t)m.data_len;
        *taken = 1;
        j->phase = P_EXEC;
        to_workers(A, j);
        return;
    default:
        j->phase = P_EXEC;
        to_workers(A, j);
        return;
    }
}

/* ---------------------------------------------------------- connections */

static void conn_err_cb(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    aconn *c = arg;
    (void)ep;
    if (!c->dead)
        FT_LOG(FT_LOG_INFO, "agent: conn %llu (%s): UCX endpoint failed: %s", (unsigned long long)c->id,
               c->peer, ucs_status_string(status));
    c->dead = 1;
}

/* The door's admission (door.h, on its thread): the connection limit, and
 * what UCX the agent offers. */
static ft_status agent_admit(void *arg, ft_door_conn *dc, uint8_t *extra, size_t cap, size_t *len,
                             uint64_t *aux, uint64_t *flags, const char **detail)
{
    agent *A = arg;
    (void)dc; (void)extra; (void)cap; (void)aux;
    *len = 0;
    if (__atomic_load_n(&A->nconns, __ATOMIC_ACQUIRE) >= A->p.max_connections) {
        *detail = "connection limit reached";
        return FT_ERR_BUSY;
    }
    *flags = (A->w ? FT_NODE_UCX : 0) | (A->w && A->p.trusted_network ? FT_NODE_UCX_TCP : 0);
    return FT_OK;
}

static void accept_conns(agent *A)
{
    ft_door_conn dc;
    while (ft_door_take(A->door, &dc)) {
        aconn *c = calloc(1, sizeof *c);
        if (!c) {
            close(dc.fd);
            continue;
        }
        ft_cma_peer_init(&c->cma);
        c->fd = dc.fd;
        c->id = dc.id;
        snprintf(c->peer, sizeof c->peer, "%s", dc.peer);
        c->rx_need = FT_AMSG_HDR_SIZE;
        c->next = A->conns;
        A->conns = c;
        __atomic_add_fetch(&A->nconns, 1, __ATOMIC_RELEASE);
    }
}

/* Read what a connection sent: whole requests go to on_request. */
static void conn_read(agent *A, aconn *c)
{
    size_t budget = READ_BUDGET;
    while (!c->dead && budget) {
        if (c->refs >= MAX_OPS_PER_CONN + 1) return;   /* it waits for its replies */
        uint8_t *dst;
        size_t want;
        if (!c->rx_body) {
            dst = c->rx_hdr + c->rx_have;
            want = c->rx_need - c->rx_have;
        } else {
            dst = c->rx_buf + c->rx_done;
            want = (size_t)(c->rx_len - c->rx_done);
        }
        if (want > budget) want = budget;
        ssize_t r = want ? recv(c->fd, dst, want, MSG_DONTWAIT) : 0;
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        if (r <= 0 && want) {
            FT_LOG(FT_LOG_INFO, "agent: conn %llu (%s) closed%s%s", (unsigned long long)c->id, c->peer,
                   r < 0 ? ": " : "", r < 0 ? strerror(errno) : "");
            c->dead = 1;
            return;
        }
        budget -= (size_t)r;
        if (!c->rx_body) {
            c->rx_have += (size_t)r;
            if (c->rx_have < c->rx_need) continue;
            if (c->rx_need == FT_AMSG_HDR_SIZE) {
                size_t hl = 0;
                if (ft_amsg_header_len(c->rx_hdr, &hl) != FT_OK) {
                    FT_LOG(FT_LOG_WARN, "agent: conn %llu (%s): %s; closing it", (unsigned long long)c->id,
                           c->peer, ft_last_error());
                    c->dead = 1;
                    return;
                }
                c->rx_need = hl;
                if (hl > c->rx_have) continue;
            }
            /* the body: bounded before a byte of it is buffered */
            uint64_t dl = ft_get_le64(c->rx_hdr + 24);
            ft_amsg m;
            if (ft_amsg_parse(c->rx_hdr, c->rx_need, (size_t)(dl > SIZE_MAX ? SIZE_MAX : dl), 0,
                              A->p.max_staging, &m) != FT_OK) {
                FT_LOG(FT_LOG_WARN, "agent: conn %llu (%s): bad message: %s; closing it",
                       (unsigned long long)c->id, c->peer, ft_last_error());
                c->dead = 1;
                return;
            }
            c->rx_len = m.data_len;
            c->rx_done = 0;
            c->rx_buf = malloc(m.data_len ? (size_t)m.data_len : 1);
            if (!c->rx_buf) {
                FT_LOG(FT_LOG_WARN, "agent: conn %llu (%s): no memory for a %llu-byte message; closing it",
                       (unsigned long long)c->id, c->peer, (unsigned long long)m.data_len);
                c->dead = 1;
                return;
            }
            c->rx_body = 1;
        } else {
            c->rx_done += (uint64_t)r;
        }
        if (c->rx_done < c->rx_len) continue;
        int taken = 0;
        on_request(A, c, c->rx_hdr, c->rx_need, c->rx_buf, &taken);
        if (!taken) free(c->rx_buf);
        c->rx_buf = NULL;
        c->rx_body = 0;
        c->rx_have = 0;
        c->rx_need = FT_AMSG_HDR_SIZE;
    }
}

static void reap_conns(agent *A, int force_all)
{
    for (aconn **pp = &A->conns; *pp;) {
        aconn *c = *pp;
        if (force_all) c->dead = 1;
        if (c->dead && !c->closed) {
            while (c->tx_head) {   /* replies not sent */
                job *j = c->tx_head;
                c->tx_head = j->next;
                job_free(j);
            }
            c->tx_tail = NULL;
            if (c->fd >= 0) close(c->fd);
            c->fd = -1;
            free(c->rx_buf);
            c->rx_buf = NULL;
            if (c->rma_ep) {
                ucp_request_param_t p;
                memset(&p, 0, sizeof p);
                p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
                p.flags = UCP_EP_CLOSE_FLAG_FORCE;
                c->rma_close_req = ucp_ep_close_nbx(c->rma_ep, &p);
                if (UCS_PTR_IS_ERR(c->rma_close_req)) c->rma_close_req = NULL;
            }
            c->closed = 1;
            __atomic_sub_fetch(&A->nconns, 1, __ATOMIC_RELEASE);
        }
        if (c->closed && c->rma_close_req &&
            ucp_request_check_status(c->rma_close_req) != UCS_INPROGRESS) {
            ucp_request_free(c->rma_close_req);
            c->rma_close_req = NULL;
        }
        if (c->closed && !c->rma_close_req && c->refs == 0) {
            *pp = c->next;
            ft_cma_peer_close(&c->cma);
            free(c);
            continue;
        }
        pp = &c->next;
    }
}

/* ------------------------------------------------------------------ run */

void ft_agent_default_params(ft_agent_params *p)
{
    memset(p, 0, sizeof *p);
    p->listen = "127.0.0.1:13340";
    p->max_connections = 256;
}

/* The UCP context toward the clients: RMA into their buffers (wakeup),
 * under the node's policy (net.h): no shared memory, TCP only on a
 * trusted network and only on the --listen interface. None when the
 * policy leaves no transport: clients on this machine use CMA. */
static void ucp_open(agent *A, const struct sockaddr_storage *listen_addr)
{
    char devs[512];
    ft_net_listen_devices(listen_addr, A->p.trusted_network, devs, sizeof devs);
    ft_net_ucx_opts uo = {A->p.trusted_network, devs, NULL, 0,
                          UCP_FEATURE_AM | UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP, A->p.client_tls};
    ucs_status_t s = ft_net_ucp_open("flextier-agent", &uo, &A->ctx, &A->w, &A->efd);
    if (s != UCS_OK) {
        if (s == UCS_ERR_UNSUPPORTED)
            FT_LOG(FT_LOG_INFO, "agent: no UCX toward clients (no RDMA device; UCX over TCP needs "
                   "--trusted-network): clients on this machine only (cross-memory attach)");
        else
            FT_LOG(FT_LOG_WARN, "agent: no UCX toward clients (%s): clients on this machine only",
                   ucs_status_string(s));
        if (A->w) ucp_worker_destroy(A->w);
        if (A->ctx) ucp_cleanup(A->ctx);
        A->w = NULL;
        A->ctx = NULL;
        A->efd = -1;
        return;
    }
    FT_LOG(FT_LOG_INFO, "agent: UCX RMA toward authenticated clients (%s%s%s)",
           A->p.trusted_network ? "TCP allowed on the trusted network" : "RDMA only",
           devs[0] ? ", devices " : "", devs);
}

static void shutdown_agent(agent *A)
{
    ft_door_close(A->door);   /* no new connections */
    A->door = NULL;
    reap_conns(A, 1);
    /* jobs finish (their upstream operations end, bounded by the store
     * timeouts); the main-thread steps see dead connections and free */
    double dl = ft_now() + 30.0;
    while ((A->conns || A->jobs) && ft_now() < dl) {
        if (A->w) ucp_worker_progress(A->w);
        drain_done(A);
        reap_conns(A, 0);
        if (A->jobs) usleep(1000);
    }
    if (A->threads) {
        pthread_mutex_lock(&A->q_lock);
        A->stop_workers = 1;
        /* jobs still waiting for staging are dropped with their conns */
        pthread_cond_broadcast(&A->q_cond);
        pthread_mutex_unlock(&A->q_lock);
        for (unsigned i = 0; i < A->nthreads; i++) pthread_join(A->threads[i], NULL);
        free(A->threads);
    }
    ft_cma_door_close(A->cma_door);
    if (A->w) ucp_worker_destroy(A->w);
    if (A->ctx) ucp_cleanup(A->ctx);
    for (unsigned i = 0; i < FT_AGENT_MAX_NODES; i++) ft_store_close(A->up[i]);
    if (A->evfd >= 0) close(A->evfd);
    pthread_mutex_destroy(&A->q_lock);
    pthread_cond_destroy(&A->q_cond);
    free(A);
}

ft_status ft_agent_run(const ft_agent_params *params)
{
    ft_agent_params p;
    if (params) p = *params; else ft_agent_default_params(&p);
    if (!p.listen) p.listen = "127.0.0.1:13340";
    if (!p.max_connections) p.max_connections = 256;
    if (!p.max_staging) p.max_staging = 2ull << 30;
    if (!p.threads) p.threads = 8;
    if (p.threads > 64) p.threads = 64;
    if (p.n_nodes == 0 || p.n_nodes > FT_AGENT_MAX_NODES)
        return ft_set_error(FT_ERR_INVALID_ARG, "the agent needs 1..%d memory nodes (--node ucx://HOST:PORT)",
                            FT_AGENT_MAX_NODES);
    agent *A = calloc(1, sizeof *A);
    if (!A) return ft_set_error(FT_ERR_NOMEM, "agent");
    A->p = p;
    A->efd = -1;
    A->evfd = -1;
    pthread_mutex_init(&A->q_lock, NULL);
    pthread_cond_init(&A->q_cond, NULL);
    ft_status st = FT_OK;
    struct pollfd *pf = NULL;
    aconn **who = NULL;
    /* the configuration first (listen address, token file, protected
     * mode): the front door refuses what the node refuses */
    struct sockaddr_storage la;
    {
        socklen_t ll;
        if ((st = ft_net_resolve(p.listen, 1, &la, &ll)) != FT_OK) goto out;
        if ((st = ft_door_check_listen("agent", p.listen, &la, p.token_file != NULL, p.insecure)) != FT_OK) goto out;
        if (p.token_file) {
            uint8_t tok[FT_TOKEN_MAX];
            size_t tl = 0;
            st = ft_net_read_token(p.token_file, FT_TOKEN_MIN, tok, sizeof tok, &tl);
            memset(tok, 0, sizeof tok);
            if (st != FT_OK) goto out;
        }
    }
    /* the memory nodes, through the public store API with our own token */
    for (unsigned i = 0; i < p.n_nodes; i++) {
        const char *u = p.nodes[i];
        if (!u || strncmp(u, "ucx://", 6) || strlen(u + 6) > FT_AMSG_MAX_NODE || !u[6]) {
            st = ft_set_error(FT_ERR_INVALID_ARG, "memory node '%s' is not ucx://HOST:PORT", u ? u : "");
            goto out;
        }
        snprintf(A->node_names[i], sizeof A->node_names[i], "%s", u + 6);
        ft_store_params sp;
        ft_store_default_params(&sp);
        sp.token_file = p.node_token_file;
        sp.queue_depth = p.threads;
        sp.codec_threads = 1;
        if (p.timeout_ms > 0) sp.timeout_ms = p.timeout_ms;
        if ((st = ft_store_open(u, &sp, &A->up[i])) != FT_OK) {
            st = ft_set_error(st, "memory node %s: %s", u, ft_last_error());
            goto out;
        }
    }
    A->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (A->evfd < 0) { st = ft_set_error(FT_ERR_IO, "eventfd: %s", strerror(errno)); goto out; }
    if (ft_cma_door_open(&A->cma_door) != FT_OK) {
        FT_LOG(FT_LOG_INFO, "agent: no cross-memory attach: %s", ft_last_error());
        A->cma_door = NULL;
        ft_clear_error();
    }
    ft_door_params dp;
    memset(&dp, 0, sizeof dp);
    dp.what = "agent";
    dp.listen = p.listen;
    dp.token_file = p.token_file;
    dp.insecure = p.insecure;
    dp.admit = agent_admit;
    dp.arg = A;
    /* the UCX context (on the --listen interface) before the door:
     * admission, on the door's thread, reads A->w */
    ucp_open(A, &la);
    dp.max_unauth = 64;
    if ((st = ft_door_open(&dp, &A->door)) != FT_OK) goto out;
    A->threads = calloc(p.threads, sizeof *A->threads);
    if (!A->threads) { st = ft_set_error(FT_ERR_NOMEM, "threads"); goto out; }
    for (unsigned i = 0; i < p.threads; i++) {
        if (pthread_create(&A->threads[i], NULL, worker_main, A) != 0) break;
        A->nthreads = i + 1;
    }
    if (!A->nthreads) { st = ft_set_error(FT_ERR_NOMEM, "pthread_create failed"); goto out; }
    size_t cap = (size_t)p.max_connections + 4;
    pf = calloc(cap, sizeof *pf);
    who = calloc(cap, sizeof *who);
    if (!pf || !who) { st = ft_set_error(FT_ERR_NOMEM, "agent"); goto out; }
    FT_LOG(FT_LOG_INFO, "agent: listening on %s%s, %u worker threads, %u memory node(s), staging %llu bytes",
           ft_door_bound(A->door), ft_door_has_token(A->door) ? "" : " (no token)", A->nthreads, p.n_nodes,
           (unsigned long long)p.max_staging);
    if (p.on_ready) p.on_ready(p.arg, ft_door_bound(A->door));

    while (!(p.stop && *p.stop)) {
        accept_conns(A);
        reap_conns(A, 0);
        drain_done(A);
        if (A->w && ucp_worker_progress(A->w)) continue;
        if (A->w && ucp_worker_arm(A->w) == UCS_ERR_BUSY) continue;
        size_t n = 0;
        pf[n] = (struct pollfd){ft_door_fd(A->door), POLLIN, 0};
        who[n++] = NULL;
        pf[n] = (struct pollfd){A->evfd, POLLIN, 0};
        who[n++] = NULL;
        pf[n] = (struct pollfd){A->w ? A->efd : -1, POLLIN, 0};
        who[n++] = NULL;
        for (aconn *c = A->conns; c && n < cap; c = c->next) {
            if (c->closed || c->dead) continue;
            short ev = c->refs >= MAX_OPS_PER_CONN + 1 ? 0 : POLLIN;
            if (c->tx_head) ev |= POLLOUT;
            pf[n] = (struct pollfd){c->fd, ev, 0};
            who[n++] = c;
        }
        int r = poll(pf, n, 100);
        for (size_t i = 3; r > 0 && i < n; i++) {
            aconn *c = who[i];
            if (!pf[i].revents || c->dead) continue;
            if (pf[i].revents & POLLOUT) conn_flush(c);
            if (pf[i].revents & (POLLIN | POLLERR | POLLHUP)) conn_read(A, c);
        }
    }
    FT_LOG(FT_LOG_INFO, "agent: shutting down");
out:
    free(pf);
    free(who);
    shutdown_agent(A);
    return st;
}
