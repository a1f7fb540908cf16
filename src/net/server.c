/* The memory node (`flextier serve`): a single-threaded event loop.
 *
 * Trust boundary (docs/protocol.md, "Trust model"). The node listens on
 * exactly one socket: FlexTier's TCP port on the --listen address, the
 * front door that the codec agent and the pipeline worker use too
 * (door.h). Every session starts there and must pass the mutual HMAC
 * challenge-response (auth.c) within a deadline, on the door's thread,
 * before the node looks at any other message; until then a connection can
 * send nothing but HELLO and AUTH, each a fixed small size, and gets
 * generic errors. Unauthenticated connections have their own cap; under
 * pressure the stalled ones are dropped first; an address that fails
 * repeatedly is refused for a growing while, or, when real clients share
 * it, only its failing connections are held back.
 *
 * Data then moves over that TCP connection (FlexTier reads a frame's
 * bytes straight into the pool block reserved for it) or, when client and
 * node share a UCX transport that does not trust its peers blindly
 * (shared memory, RDMA; UCX's TCP transport only with --trusted-network),
 * over UCX active messages: the client sends its worker address over the
 * authenticated connection (UCXB), the node opens an endpoint to it, and
 * every AM request must carry the session id the node handed out at AUTH.
 * UCX itself listens on nothing (no sockaddr listener, no TCP interface
 * unless trusted, and then only on the --listen interface). With the UCP
 * registration cache off, UCX registers pool memory for one transfer and
 * deregisters it when the transfer ends: a remote key reaches one tensor's
 * bytes, for as long as that transfer runs.
 *
 * Pool: one anonymous mapping of `capacity` bytes; frames live at offsets
 * handed out by a first-fit free list (256-byte granularity, coalescing).
 *
 * PUT: the whole frame in one message, received straight into a block;
 * or pipelined (PUTB reserves, PUTD pieces land at their offsets while the
 * client encodes the next ones, PUTC brings the header last). A frame
 * becomes visible only once every byte is in and its header (which holds
 * the writer's per-chunk checksums) validates, replacing an older version
 * in one step; readers check every chunk's checksum when they decode.
 *
 * GET/GETR: replies are sent straight from the pool under a lease (a
 * reference count): an overwrite or delete unlinks the entry at once but
 * frees its block when the last lease ends. A reply the client does not
 * take within the lease timeout closes its connection.
 *
 * Spill: when an allocation fails and a spill dir is configured, the
 * least-recently-used resident entries without leases are written to
 * files (O_EXCL|O_NOFOLLOW, in a 0700 directory held open) and their
 * blocks freed; a GET of a spilled entry reads it back, or, when neither
 * the pool nor the spill file system has room for that, is served from
 * its file directly. Spill is a cache of this process's pool: files of an
 * earlier run are deleted at start.
 *
 * Shared memory (cma.h): a client on this host presents its session's
 * nonce on our Unix socket (CMAB offer / claim); the kernel names the
 * process, and every copy to or from it is checked first. */
#define _GNU_SOURCE   /* accept4 */
#include "auth.h"
#include "cma.h"
#include "door.h"
#include "msg.h"
#include "net.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/uio.h>
#include <unistd.h>
#include <ucp/api/ucp.h>

#define ALIGN 256u
#define BUCKETS 4096u
#define MAX_PROTO_ERRORS 16u     /* UCX path (datagrams): then the conn closes */
#define MAX_OPS_PER_CONN 1024u   /* bounds per-connection server memory */
#define MAX_XPUTS_PER_CONN 64u   /* open pipelined writes per connection */
#define SMALL_MAX FT_MSG_MAX_ADDR /* largest payload read into heap memory */
#define READ_BUDGET (16u << 20)  /* bytes read from one conn per loop turn */

typedef struct fblk { uint64_t off, len; struct fblk *next; } fblk;

typedef struct entry {
    char          key[FT_KEY_MAX + 1];
    uint64_t      id;
    uint64_t      off, size, alloc, header_size;
    uint64_t      spill_hash;  /* XXH3 of the bytes written to its spill file */
    uint64_t      spill_id;    /* its spill file's number (ftspill-N.bin)  */
    int           resident;    /* in the pool (else in a spill file) */
    int           dead;        /* unlinked; free when leases drop to 0 */
    unsigned      leases;
    struct entry *hnext, *prev, *next;  /* hash chain, LRU list */
} entry;

/* An open pipelined write (PUTB .. PUTC). */
typedef struct xput {
    uint64_t     xid;
    char         key[FT_KEY_MAX + 1];
    uint64_t     off, alloc, reserve, header_size;
    uint64_t     pos;           /* frame offset the next PUTD must start at */
    unsigned     recvs;         /* payload receives in flight */
    ft_status    fail;          /* first failure (the commit reports it) */
    int          committing;    /* PUTC seen; commit once recvs == 0 */
    uint64_t     commit_req, frame_size;
    int          commit_via_ucx;
    struct xput *next;
} xput;

typedef struct server server;
typedef struct conn conn;

enum { RX_NONE, RX_PUT, RX_PUTD, RX_PUTC };

/* One outstanding operation: a reply being sent (TCP queue or UCX send)
 * or a frame payload being received. */
typedef struct op {
    server    *S;
    conn      *c;
    int        via_ucx;
    entry     *lease;          /* reply data is this entry's bytes */
    void      *heap;           /* reply data owned by the op */
    uint64_t   req_id;
    uint64_t   count_out;      /* GET payload bytes for the stats */
    double     deadline;       /* UCX reply: lease timeout */
    /* receive */
    int        rx;             /* RX_* */
    xput      *x;
    char       key[FT_KEY_MAX + 1];
    uint64_t   off, size, alloc;
    /* TCP send */
    uint8_t    hdr[FT_MSG_HDR_SIZE];
    const uint8_t *data;
    size_t     len, sent;
    struct op *qnext;                /* conn's TCP send queue */
    struct op *unext, *uprev;        /* server's UCX sends with a deadline */
} op;

enum { RXP_HDR, RXP_KEY, RXP_PAYLOAD, RXP_DISCARD };

struct conn {
    uint64_t      id;
    int           fd;
    char          peer[64];
    struct sockaddr_storage sa;
    int           authed, dead;
    unsigned      refs;                 /* outstanding ops */
    unsigned      proto_errors;
    uint64_t      session;
    /* TCP input */
    int           rxp;
    uint8_t       rx_hdr[FT_MSG_MAX_HDR];
    size_t        rx_have, rx_need;
    ft_msg        rx_m;
    uint8_t      *rx_dst;
    uint64_t      rx_len, rx_done;
    op           *rx_op;                /* frame payload being read */
    uint8_t      *small;                /* SMALL_MAX bytes, on first use */
    /* TCP output */
    op           *out_head, *out_tail;
    double        t_out;                /* last output progress */
    /* shared-memory path (cma.h): the client's process, verified */
    uint64_t      peer_inode;           /* its socket, when on this host */
    ft_cma_peer   cma;                  /* pidfd -1: path not open */
    uint8_t       cma_nonce[FT_CMA_NONCE];
    int           cma_offered;          /* 1: the nonce is this session's;
                                           -1: claimed (once per conn) */
    /* UCX */
    ucp_ep_h      uep;
    ucs_status_ptr_t close_req;
    int           uep_closing;
    xput         *xputs;
    unsigned      nxputs;
    struct conn  *next;
};

struct server {
    ft_node_params p;
    ft_door       *door;                  /* the front door (door.h) */
    ucp_context_h  ctx;
    ucp_worker_h   w;
    int            efd;
    ucp_address_t *waddr;
    size_t         waddr_len;
    int            ucx_tcp;
    uint8_t       *pool;
    uint64_t       cap;
    fblk          *free_list;
    uint64_t       used;
    entry         *tab[BUCKETS];
    entry         *lru_head, *lru_tail;   /* head = most recent */
    uint64_t       next_entry_id;
    uint64_t       next_spill_id;         /* spill file names, never reused */
    uint64_t       tensors, spilled, spill_used;
    int            spill_dfd;
    conn          *conns;
    unsigned       nauthed;               /* read by the door's thread */
    uint64_t       next_conn_id, total_conns;
    uint64_t       bytes_in, bytes_out, puts, gets;
    uint64_t       dropped_am;
    op            *uops;                  /* UCX sends with a deadline */
    int            has_token;
    double         lease_s;
    ft_pool       *copiers;               /* shared-memory copies (cma.c) */
    ft_cma_door   *cma_door;              /* NULL: no shared-memory path */
};

/* ------------------------------------------------------------ allocator */

static int pool_alloc(server *S, uint64_t size, uint64_t *off, uint64_t *alloc)
{
    uint64_t n = (size + ALIGN - 1) / ALIGN * ALIGN;
    if (n == 0) n = ALIGN;
    for (fblk **pp = &S->free_list; *pp; pp = &(*pp)->next) {
        fblk *b = *pp;
        if (b->len < n) continue;
        *off = b->off;
        *alloc = n;
        b->off += n;
        b->len -= n;
        if (b->len == 0) {
            *pp = b->next;
            free(b);
        }
        S->used += n;
        return 1;
    }
    return 0;
}

static void pool_free(server *S, uint64_t off, uint64_t n)
{
    if (n == 0) return;
    S->used -= n;
    fblk **pp = &S->free_list, *prev = NULL;
    while (*pp && (*pp)->off < off) { prev = *pp; pp = &(*pp)->next; }
    fblk *next = *pp;
    if (prev && prev->off + prev->len == off) {
        prev->len += n;
        if (next && prev->off + prev->len == next->off) {
            prev->len += next->len;
            prev->next = next->next;
            free(next);
        }
        return;
    }
    if (next && off + n == next->off) {
        next->off = off;
        next->len += n;
        return;
    }
    fblk *b = malloc(sizeof *b);
    if (!b) {   /* leak the block rather than corrupt the list */
        FT_LOG(FT_LOG_ERROR, "serve: out of memory freeing a pool block");
        return;
    }
    b->off = off;
    b->len = n;
    b->next = next;
    *pp = b;
}

/* ------------------------------------------------------------- entries */

static unsigned hkey(const char *k, size_t n) { return (unsigned)(ft_xxh3(k, n) % BUCKETS); }

static entry **lookup(server *S, const char *key, size_t n)
{
    entry **pp = &S->tab[hkey(key, n)];
    while (*pp && !(strlen((*pp)->key) == n && !memcmp((*pp)->key, key, n))) pp = &(*pp)->hnext;
    return pp;
}

static void lru_unlink(server *S, entry *e)
{
    if (e->prev) e->prev->next = e->next; else if (S->lru_head == e) S->lru_head = e->next;
    if (e->next) e->next->prev = e->prev; else if (S->lru_tail == e) S->lru_tail = e->prev;
    e->prev = e->next = NULL;
}

static void lru_push(server *S, entry *e)
{
    e->prev = NULL;
    e->next = S->lru_head;
    if (S->lru_head) S->lru_head->prev = e;
    S->lru_head = e;
    if (!S->lru_tail) S->lru_tail = e;
}

static void spill_name(const entry *e, char *buf, size_t n)
{
    snprintf(buf, n, "ftspill-%llu.bin", (unsigned long long)e->spill_id);
}

/* Open a spill file of ours for reading: never a link, never blocking on
 * a FIFO or device put in its place, only a regular file. -1 otherwise. */
static int open_spill_file(server *S, const char *name)
{
    int fd = openat(S->spill_dfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    struct stat sb;
    if (fd >= 0 && (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode))) {
        close(fd);
        errno = EINVAL;
        fd = -1;
    }
    return fd;
}

/* Release an unlinked entry's storage. */
static void entry_destroy(server *S, entry *e)
{
    if (e->resident) {
        pool_free(S, e->off, e->alloc);
    } else {
        char name[64];
        spill_name(e, name, sizeof name);
        unlinkat(S->spill_dfd, name, 0);
        S->spill_used -= e->size;
        S->spilled--;
    }
    free(e);
}

/* Remove from the table; storage goes when the last lease ends. */
static void entry_unlink(server *S, entry **pp)
{
    entry *e = *pp;
    *pp = e->hnext;
    lru_unlink(S, e);
    S->tensors--;
    if (e->leases) e->dead = 1;
    else entry_destroy(S, e);
}

/* A new spill file: created here, never an existing file or a link. The
 * bytes are hashed as they are written (while in cache) so that a reload
 * notices a file changed on disk. */
static int write_spill(server *S, const char *name, const void *data, size_t n, uint64_t *hash)
{
    *hash = ft_xxh3(data, n);
    int fd = openat(S->spill_dfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) return -1;
    const uint8_t *b = data;
    while (n) {
        ssize_t w = write(fd, b, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            int e = w < 0 ? errno : ENOSPC;
            close(fd);
            unlinkat(S->spill_dfd, name, 0);
            errno = e;
            return -1;
        }
        b += w;
        n -= (size_t)w;
    }
    return close(fd);
}

/* Spill the least-recently-used resident, unleased entry (not exclude).
 * credit: spill bytes about to be released (a reload frees its own file),
 * so that reloading needs no free spill space. */
static int spill_one(server *S, const entry *exclude, uint64_t credit)
{
    if (S->spill_dfd < 0) return 0;
    for (entry *e = S->lru_tail; e; e = e->prev) {
        if (!e->resident || e->leases || e == exclude) continue;
        if (S->spill_used + e->size > S->p.spill_capacity + credit) return 0;
        char name[64];
        int rc = -1;
        /* a name taken by something else (a file, a directory, a FIFO
         * planted there): the next name, rather than failing every later
         * spill on this one */
        for (int tries = 0; rc != 0 && tries < 8; tries++) {
            e->spill_id = ++S->next_spill_id;
            spill_name(e, name, sizeof name);
            rc = write_spill(S, name, S->pool + e->off, e->size, &e->spill_hash);
            int err = rc != 0 ? errno : 0;
            if (err == EEXIST && unlinkat(S->spill_dfd, name, 0) == 0) {   /* a file, FIFO, link */
                rc = write_spill(S, name, S->pool + e->off, e->size, &e->spill_hash);
                err = rc != 0 ? errno : 0;
            }
            if (err == EEXIST) {
                /* a directory: skip a random stretch of names, so that
                 * planting a run of them does not stall spilling */
                uint32_t jump = 0;
                if (ft_net_random(&jump, sizeof jump) != FT_OK) jump = 0;
                S->next_spill_id += jump & 0xfffff;
                FT_LOG(FT_LOG_WARN, "serve: something is in the way of spill file %s/%s: skipped",
                       S->p.spill_dir, name);
            } else if (rc != 0) {
                errno = err;
                break;
            }
        }
        if (rc != 0) {
            FT_LOG(FT_LOG_ERROR, "serve: spill to %s/%s failed: %s", S->p.spill_dir, name,
                   strerror(errno));
            return 0;
        }
        pool_free(S, e->off, e->alloc);
        e->resident = 0;
        S->spill_used += e->size;
        S->spilled++;
        FT_LOG(FT_LOG_INFO, "serve: spilled '%s' (%llu bytes)", e->key, (unsigned long long)e->size);
        return 1;
    }
    return 0;
}

static int alloc_spilling(server *S, uint64_t size, const entry *exclude, uint64_t credit,
                          uint64_t *off, uint64_t *alloc)
{
    if (size > S->cap) return 0;
    for (;;) {
        if (pool_alloc(S, size, off, alloc)) return 1;
        if (!spill_one(S, exclude, credit)) return 0;
    }
}

/* Bring a spilled entry back into the pool; the file must hold exactly
 * the bytes that were written (XXH3). The entry's own file is about to
 * go, so its bytes count as free spill space while others are spilled to
 * make room: a reload needs no free spill space. */
static ft_status reload(server *S, entry *e)
{
    uint64_t off, alloc;
    if (!alloc_spilling(S, e->size, e, e->size, &off, &alloc))
        return ft_set_error(FT_ERR_NO_SPACE, "no pool space to reload '%s'", e->key);
    char name[64];
    spill_name(e, name, sizeof name);
    int fd = open_spill_file(S, name);
    size_t n = 0;
    while (fd >= 0 && n < e->size) {
        ssize_t r = pread(fd, S->pool + off + n, e->size - n, (off_t)n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        n += (size_t)r;
    }
    if (fd >= 0) close(fd);
    if (n != e->size || ft_xxh3(S->pool + off, e->size) != e->spill_hash) {
        pool_free(S, off, alloc);
        return ft_set_error(FT_ERR_CORRUPT, "spill file %s/%s for '%s' is corrupt or missing",
                            S->p.spill_dir, name, e->key);
    }
    unlinkat(S->spill_dfd, name, 0);
    S->spill_used -= e->size;
    S->spilled--;
    e->off = off;
    e->alloc = alloc;
    e->resident = 1;
    FT_LOG(FT_LOG_INFO, "serve: reloaded '%s' from spill", e->key);
    return FT_OK;
}

/* --------------------------------------------------------------- ops */

static void uops_unlink(server *S, op *o)
{
    if (o->uprev) o->uprev->unext = o->unext; else if (S->uops == o) S->uops = o->unext;
    if (o->unext) o->unext->uprev = o->uprev;
    o->unext = o->uprev = NULL;
}

static op *op_new(server *S, conn *c, uint64_t req_id, int via_ucx)
{
    op *o = calloc(1, sizeof *o);
    if (!o) return NULL;
    o->S = S;
    o->c = c;
    o->req_id = req_id;
    o->via_ucx = via_ucx;
    c->refs++;
    return o;
}

static void op_finish(op *o, ucs_status_t status)
{
    server *S = o->S;
    if (o->deadline) uops_unlink(S, o);
    if (o->lease) {
        entry *e = o->lease;
        if (--e->leases == 0 && e->dead) entry_destroy(S, e);
    }
    if (status == UCS_OK) S->bytes_out += o->count_out;
    free(o->heap);
    o->c->refs--;
    free(o);
}

static void conn_close(server *S, conn *c, const char *why);

/* Write what the socket takes from the conn's reply queue. */
static void tcp_flush(server *S, conn *c)
{
    while (!c->dead && c->out_head) {
        op *o = c->out_head;
        struct iovec iov[2];
        int n = 0;
        size_t total = FT_MSG_HDR_SIZE + o->len;
        if (o->sent < FT_MSG_HDR_SIZE) {
            iov[n].iov_base = o->hdr + o->sent;
            iov[n++].iov_len = FT_MSG_HDR_SIZE - o->sent;
        }
        if (o->len) {
            size_t d = o->sent > FT_MSG_HDR_SIZE ? o->sent - FT_MSG_HDR_SIZE : 0;
            iov[n].iov_base = (void *)(o->data + d);
            iov[n++].iov_len = o->len - d;
        }
        struct msghdr mh;
        memset(&mh, 0, sizeof mh);
        mh.msg_iov = iov;
        mh.msg_iovlen = (size_t)n;
        ssize_t w = sendmsg(c->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return;
            conn_close(S, c, strerror(errno));
            return;
        }
        c->t_out = ft_now();
        o->sent += (size_t)w;
        if (o->sent == total) {
            c->out_head = o->qnext;
            if (!c->out_head) c->out_tail = NULL;
            op_finish(o, UCS_OK);
        }
    }
}

static void ucx_sent_cb(void *req, ucs_status_t status, void *user)
{
    op *o = user;
    if (status != UCS_OK)
        FT_LOG(FT_LOG_INFO, "serve: conn %llu: reply not delivered: %s",
               (unsigned long long)o->c->id, ucs_status_string(status));
    op_finish(o, status);
    ucp_request_free(req);
}

/* Send a reply on the path the request came by; data stays valid until
 * the send completes (it belongs to the op: a heap buffer or a leased
 * entry). Takes ownership of o. */
static void send_reply(conn *c, op *o, uint16_t opcode, ft_status st, const void *data,
                       size_t len, uint64_t aux, uint64_t arg)
{
    server *S = o->S;
    if (c->dead) { op_finish(o, UCS_ERR_CANCELED); return; }
    ft_msg m;
    memset(&m, 0, sizeof m);
    m.opcode = (uint16_t)(opcode | FT_OP_REPLY);
    m.req_id = o->req_id;
    m.status = (int32_t)st;
    m.data_len = len;
    m.aux = aux;
    m.arg = arg;
    m.session = o->via_ucx ? c->session : 0;
    ft_msg_encode(o->hdr, &m);
    if (!o->via_ucx) {
        o->data = data;
        o->len = len;
        if (!c->out_head) c->t_out = ft_now();
        if (c->out_tail) c->out_tail->qnext = o; else c->out_head = o;
        c->out_tail = o;
        tcp_flush(S, c);
        return;
    }
    if (!c->uep) { op_finish(o, UCS_ERR_NOT_CONNECTED); return; }
    ucp_request_param_t rp;
    memset(&rp, 0, sizeof rp);
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    rp.cb.send = ucx_sent_cb;
    rp.user_data = o;
    /* no memh: with the node's registration cache off, UCX registers the
     * bytes of this reply for this send only */
    ucs_status_ptr_t r = ucp_am_send_nbx(c->uep, FT_AM_REPLY, o->hdr, FT_MSG_HDR_SIZE, data, len, &rp);
    if (UCS_PTR_IS_ERR(r)) {
        op_finish(o, UCS_PTR_STATUS(r));
    } else if (!r) {
        op_finish(o, UCS_OK);
    } else if (o->lease) {
        /* a client that never takes the reply must not pin the lease */
        o->deadline = ft_now() + S->lease_s + (double)len / 50e6;
        o->unext = S->uops;
        if (S->uops) S->uops->uprev = o;
        S->uops = o;
    }
}

/* A reply without data, or with an error detail as text. */
static void reply_status(server *S, conn *c, int via_ucx, uint16_t opcode, uint64_t req_id,
                         ft_status st, const char *detail)
{
    op *o = op_new(S, c, req_id, via_ucx);
    if (!o) return;
    size_t n = 0;
    if (st != FT_OK && detail && *detail) {
        n = strlen(detail);
        if (n > FT_MSG_MAX_DETAIL) n = FT_MSG_MAX_DETAIL;
        o->heap = malloc(n);
        if (o->heap) memcpy(o->heap, detail, n); else n = 0;
    }
    send_reply(c, o, opcode, st, o->heap, n, 0, 0);
}

/* -------------------------------------------------------- frame payloads */

static xput *xput_find(conn *c, uint64_t xid)
{
    for (xput *x = c->xputs; x; x = x->next)
        if (x->xid == xid) return x;
    return NULL;
}

static void xput_drop(server *S, conn *c, xput *x)
{
    for (xput **pp = &c->xputs; *pp; pp = &(*pp)->next)
        if (*pp == x) {
            *pp = x->next;
            break;
        }
    c->nxputs--;
    pool_free(S, x->off, x->alloc);
    free(x);
}

/* Make e (zeroed, allocated by the caller so that committing cannot fail)
 * the entry of the frame in [off, off + size) of the pool. */
static void commit_entry(server *S, entry *e, const char *key, uint64_t off, uint64_t size,
                         uint64_t alloc, uint64_t header_size)
{
    size_t kl = strlen(key);
    memcpy(e->key, key, kl + 1);
    e->id = ++S->next_entry_id;
    e->off = off;
    e->size = size;
    e->alloc = alloc;
    e->header_size = header_size;
    e->resident = 1;
    entry **pp = lookup(S, key, kl);
    if (*pp) entry_unlink(S, pp);     /* old version: freed when unleased */
    pp = lookup(S, key, kl);
    e->hnext = *pp;
    *pp = e;
    lru_push(S, e);
    S->tensors++;
    S->puts++;
    S->bytes_in += size;
    FT_LOG(FT_LOG_DEBUG, "serve: PUT '%s' %llu bytes", key, (unsigned long long)size);
}

/* All of a pipelined write is in (or it failed): validate, commit, answer. */
static void xput_commit(server *S, conn *c, xput *x)
{
    ft_status st = x->fail;
    char detail[FT_MSG_MAX_DETAIL] = "";
    ft_frame_info fi;
    if (st == FT_OK) {
        st = ft_frame_parse(S->pool + x->off, (size_t)x->header_size, &fi);
        if (st != FT_OK) {
            st = FT_ERR_CORRUPT;
            snprintf(detail, sizeof detail, "frame rejected: %s", ft_last_error());
        } else if (fi.header_size != x->header_size || fi.frame_size != x->frame_size ||
                   x->pos != x->frame_size) {
            st = FT_ERR_CORRUPT;
            snprintf(detail, sizeof detail, "frame of %llu bytes, %llu arrived",
                     (unsigned long long)fi.frame_size, (unsigned long long)x->pos);
        }
    } else {
        snprintf(detail, sizeof detail, "%s", st == FT_ERR_NO_SPACE ? "memory node full"
                                                                    : "pipelined write failed");
    }
    uint64_t need = (x->frame_size + ALIGN - 1) / ALIGN * ALIGN;
    entry *e = st == FT_OK ? calloc(1, sizeof *e) : NULL;
    if (st == FT_OK && !e) {
        st = FT_ERR_NOMEM;
        snprintf(detail, sizeof detail, "out of memory");
    }
    if (st == FT_OK) {
        /* give back what the reservation held beyond the frame */
        if (need < x->alloc) pool_free(S, x->off + need, x->alloc - need);
        commit_entry(S, e, x->key, x->off, x->frame_size, need, fi.header_size);
        x->alloc = 0;   /* the block belongs to the entry now */
    } else {
        FT_LOG(FT_LOG_WARN, "serve: conn %llu: PUT '%s': %s", (unsigned long long)c->id, x->key,
               detail);
    }
    int via = x->commit_via_ucx;
    uint64_t req = x->commit_req;
    xput_drop(S, c, x);
    reply_status(S, c, via, FT_OP_PUTC, req, st, detail);
}

/* Where a frame-carrying request's payload goes: a pool block. Returns
 * the receive op, or NULL after answering with an error (the payload is
 * then discarded). */
static op *rx_prepare(server *S, conn *c, const ft_msg *m, int via_ucx, uint8_t **dst)
{
    ft_status st = FT_OK;
    const char *detail = "";
    xput *x = NULL;
    uint64_t off = 0, alloc = 0;
    switch (m->opcode) {
    case FT_OP_PUT:
        if (!alloc_spilling(S, m->data_len, NULL, 0, &off, &alloc)) {
            st = FT_ERR_NO_SPACE;
            detail = "memory node full (capacity and spill tier exhausted)";
        }
        break;
    case FT_OP_PUTD:
    case FT_OP_PUTC:
        x = xput_find(c, m->xid);
        if (!x) {
            st = FT_ERR_PROTOCOL;
            detail = "unknown transfer id";
        } else if (x->fail != FT_OK) {
            st = x->fail;   /* the PUTB already failed: drop the bytes */
            detail = "pipelined write failed";
        } else if (m->opcode == FT_OP_PUTD &&
                   (m->arg != x->pos || m->data_len > x->reserve - x->pos)) {
            st = x->fail = FT_ERR_PROTOCOL;
            detail = "PUTD out of order or beyond the reservation";
        } else if (m->opcode == FT_OP_PUTC && x->committing) {
            x = NULL;   /* a second commit: answered on its own */
            st = FT_ERR_PROTOCOL;
            detail = "transfer already committing";
        } else if (m->opcode == FT_OP_PUTC &&
                   (m->data_len != x->header_size || m->arg > x->reserve ||
                    m->key_len != strlen(x->key) || memcmp(m->key, x->key, m->key_len))) {
            st = x->fail = FT_ERR_PROTOCOL;
            detail = "PUTC does not match its PUTB";
        }
        break;
    default:
        st = FT_ERR_INTERNAL;
    }
    op *o = NULL;
    if (st == FT_OK && !(o = op_new(S, c, m->req_id, via_ucx))) {
        st = FT_ERR_NOMEM;
        detail = "out of memory";
        if (m->opcode == FT_OP_PUT) pool_free(S, off, alloc);
    }
    if (st != FT_OK) {
        if (x && m->opcode == FT_OP_PUTC) {
            /* answer the commit once the pieces in flight are done */
            x->committing = 1;
            x->commit_req = m->req_id;
            x->commit_via_ucx = via_ucx;
            x->frame_size = m->arg;
            if (x->fail == FT_OK) x->fail = st;
            if (x->recvs == 0) xput_commit(S, c, x);
        } else {
            reply_status(S, c, via_ucx, m->opcode, m->req_id, st, detail);
        }
        return NULL;
    }
    o->rx = m->opcode == FT_OP_PUT ? RX_PUT : m->opcode == FT_OP_PUTD ? RX_PUTD : RX_PUTC;
    o->size = m->data_len;
    if (o->rx == RX_PUT) {
        memcpy(o->key, m->key, m->key_len);
        o->key[m->key_len] = 0;
        o->off = off;
        o->alloc = alloc;
        *dst = S->pool + off;
    } else if (o->rx == RX_PUTD) {
        o->x = x;
        x->recvs++;
        *dst = S->pool + x->off + x->pos;
        x->pos += m->data_len;
    } else {
        o->x = x;
        x->recvs++;
        x->committing = 1;
        x->commit_req = m->req_id;
        x->commit_via_ucx = via_ucx;
        x->frame_size = m->arg;
        *dst = S->pool + x->off;
    }
    return o;
}

/* A frame payload finished arriving (status != UCS_OK: it did not). */
static void rx_complete(op *o, ucs_status_t status)
{
    server *S = o->S;
    conn *c = o->c;
    if (o->rx == RX_PUT) {
        ft_status st = FT_OK;
        char detail[FT_MSG_MAX_DETAIL] = "";
        ft_frame_info fi;
        if (status != UCS_OK) {
            FT_LOG(FT_LOG_WARN, "serve: conn %llu: PUT '%s' aborted: %s", (unsigned long long)c->id,
                   o->key, ucs_status_string(status));
            pool_free(S, o->off, o->alloc);
            op_finish(o, status);
            return;
        }
        if (ft_frame_parse(S->pool + o->off, (size_t)o->size, &fi) != FT_OK ||
            fi.frame_size != o->size) {
            st = FT_ERR_CORRUPT;
            snprintf(detail, sizeof detail, "frame rejected: %s", ft_last_error());
        }
        entry *e = st == FT_OK ? calloc(1, sizeof *e) : NULL;
        if (st == FT_OK && !e) {
            st = FT_ERR_NOMEM;
            snprintf(detail, sizeof detail, "out of memory");
        }
        if (st == FT_OK) {
            commit_entry(S, e, o->key, o->off, o->size, o->alloc, fi.header_size);
        } else {
            FT_LOG(FT_LOG_WARN, "serve: conn %llu: PUT '%s': %s", (unsigned long long)c->id, o->key,
                   detail);
            pool_free(S, o->off, o->alloc);
        }
        reply_status(S, c, o->via_ucx, FT_OP_PUT, o->req_id, st, detail);
        op_finish(o, UCS_OK);
        return;
    }
    xput *x = o->x;
    x->recvs--;
    if (status != UCS_OK && x->fail == FT_OK) x->fail = FT_ERR_NET;
    if (o->rx == RX_PUTD)
        reply_status(S, c, o->via_ucx, FT_OP_PUTD, o->req_id,
                     status == UCS_OK ? FT_OK : FT_ERR_NET, "receive failed");
    if (x->committing && x->recvs == 0) xput_commit(S, c, x);
    op_finish(o, status);
}

/* ------------------------------------------------------------ other ops */

static void handle_get(server *S, conn *c, int via_ucx, const ft_msg *m, int header_only,
                       const uint8_t *range, const uint8_t *ref)
{
    entry **pp = lookup(S, m->key, m->key_len);
    entry *e = *pp;
    if (!e) {
        reply_status(S, c, via_ucx, m->opcode, m->req_id, FT_ERR_NOT_FOUND, "no such tensor");
        return;
    }
    uint64_t r_off = 0, r_len = e->size;
    if (range) {
        uint64_t ver = ft_get_le64(range), off = ft_get_le64(range + 8), len = ft_get_le64(range + 16);
        if (ver && ver != e->id) {
            reply_status(S, c, via_ucx, m->opcode, m->req_id, FT_ERR_BUSY, "tensor was replaced");
            return;
        }
        if (off >= e->size || len == 0 || len > FT_MSG_MAX_RANGE) {
            reply_status(S, c, via_ucx, m->opcode, m->req_id, FT_ERR_PROTOCOL, "bad range");
            return;
        }
        r_off = off;
        r_len = e->size - off < len ? e->size - off : len;
    }
    int direct = 0;   /* served straight from its spill file */
    if (!e->resident && !header_only) {
        ft_status st = reload(S, e);
        if (st == FT_ERR_NO_SPACE) {
            /* the pool is full and nothing more can be spilled (the spill
             * file system may be full): the tensor stays readable, read
             * from its file without a pool copy */
            FT_LOG(FT_LOG_INFO, "serve: %s: reading it from its spill file", ft_last_error());
            ft_clear_error();
            direct = 1;
        } else if (st != FT_OK) {
            FT_LOG(FT_LOG_ERROR, "serve: %s", ft_last_error());
            if (st == FT_ERR_CORRUPT) entry_unlink(S, pp);
            reply_status(S, c, via_ucx, m->opcode, m->req_id, st, ft_last_error());
            return;
        }
    }
    op *o = op_new(S, c, m->req_id, via_ucx);
    if (!o) return;
    lru_unlink(S, e);
    lru_push(S, e);
    if ((header_only || direct) && !e->resident) {
        /* the header, or (direct) the range: from the spill file */
        uint64_t f_off = header_only ? 0 : r_off, f_len = header_only ? e->header_size : r_len;
        char name[64];
        spill_name(e, name, sizeof name);
        o->heap = malloc(f_len ? f_len : 1);
        int fd = o->heap ? open_spill_file(S, name) : -1;
        size_t n = 0;
        while (fd >= 0 && n < f_len) {
            ssize_t r = pread(fd, (uint8_t *)o->heap + n, f_len - n, (off_t)(f_off + n));
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) break;
            n += (size_t)r;
        }
        if (fd >= 0) close(fd);
        /* a whole read is checked against the hash taken at spill time;
         * a range is checked by the client against the frame's own chunk
         * hashes */
        int bad = n != f_len || (direct && f_off == 0 && f_len == e->size &&
                                 ft_xxh3(o->heap, f_len) != e->spill_hash);
        ft_status st = !o->heap ? FT_ERR_NOMEM : bad ? FT_ERR_IO : FT_OK;
        if (st == FT_OK && direct && ref) {
            uint64_t addr = ft_get_le64(ref), cap = ft_get_le64(ref + 8);
            if (f_len > cap) st = ft_set_error(FT_ERR_PROTOCOL, "range of %llu bytes, buffer %llu",
                                               (unsigned long long)f_len, (unsigned long long)cap);
            else st = ft_cma_write(S->copiers, &c->cma, o->heap, addr, (size_t)f_len);
        }
        if (st != FT_OK) {
            op_finish(o, UCS_OK);
            reply_status(S, c, via_ucx, m->opcode, m->req_id, st,
                         st == FT_ERR_IO ? "spill file unreadable" : ft_last_error());
            return;
        }
        if (!header_only) {
            if (r_off == 0) S->gets++;
            o->count_out = f_len;
        }
        if (direct && ref) send_reply(c, o, m->opcode, FT_OK, NULL, 0, e->id, f_len);
        else send_reply(c, o, m->opcode, FT_OK, o->heap, f_len, e->id, 0);
        return;
    }
    if (ref) {
        /* GETRV: the node writes the range into the client's memory itself */
        uint64_t addr = ft_get_le64(ref), cap = ft_get_le64(ref + 8);
        ft_status st = FT_OK;
        if (r_len > cap) st = ft_set_error(FT_ERR_PROTOCOL, "range of %llu bytes, buffer %llu",
                                           (unsigned long long)r_len, (unsigned long long)cap);
        else st = ft_cma_write(S->copiers, &c->cma, S->pool + e->off + r_off, addr, (size_t)r_len);
        if (st != FT_OK) {
            FT_LOG(FT_LOG_WARN, "serve: conn %llu (%s): %s", (unsigned long long)c->id, c->peer,
                   ft_last_error());
            op_finish(o, UCS_OK);
            reply_status(S, c, via_ucx, m->opcode, m->req_id, st, ft_last_error());
            return;
        }
        if (r_off == 0) S->gets++;
        o->count_out = r_len;
        send_reply(c, o, m->opcode, FT_OK, NULL, 0, e->id, r_len);
        return;
    }
    e->leases++;
    o->lease = e;
    if (!header_only) {
        if (r_off == 0) S->gets++;
        o->count_out = r_len;
    }
    send_reply(c, o, m->opcode, FT_OK, S->pool + e->off + r_off,
               header_only ? e->header_size : r_len, e->id, 0);
}

static void fill_stats(server *S, ft_store_stats *st)
{
    memset(st, 0, sizeof *st);
    st->capacity = S->cap;
    st->used = S->used;
    st->tensors = S->tensors;
    st->connections = S->nauthed;
    st->total_connections = S->total_conns;
    st->bytes_in = S->bytes_in;
    st->bytes_out = S->bytes_out;
    st->spill_capacity = S->spill_dfd >= 0 ? S->p.spill_capacity : 0;
    st->spill_used = S->spill_used;
    st->spilled_tensors = S->spilled;
    st->puts = S->puts;
    st->gets = S->gets;
}

static void handle_list(server *S, conn *c, int via_ucx, const ft_msg *m)
{
    size_t n = 4;
    uint32_t count = 0;
    for (unsigned i = 0; i < BUCKETS; i++)
        for (entry *e = S->tab[i]; e; e = e->hnext) { n += 2 + strlen(e->key); count++; }
    op *o = op_new(S, c, m->req_id, via_ucx);
    if (!o) return;
    uint8_t *b = o->heap = malloc(n);
    if (!b) {
        op_finish(o, UCS_OK);
        reply_status(S, c, via_ucx, FT_OP_LIST, m->req_id, FT_ERR_NOMEM, "list");
        return;
    }
    ft_put_le32(b, count);
    size_t off = 4;
    for (unsigned i = 0; i < BUCKETS; i++)
        for (entry *e = S->tab[i]; e; e = e->hnext) {
            size_t kl = strlen(e->key);
            ft_put_le16(b + off, (uint16_t)kl);
            memcpy(b + off + 2, e->key, kl);
            off += 2 + kl;
        }
    send_reply(c, o, FT_OP_LIST, FT_OK, b, n, 0, 0);
}

static void uep_err_cb(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    conn *c = arg;
    (void)ep;
    if (!c->dead)
        FT_LOG(FT_LOG_INFO, "serve: conn %llu (%s): UCX path failed: %s", (unsigned long long)c->id,
               c->peer, ucs_status_string(status));
    c->uep_closing = 1;   /* conn_close runs from the main loop */
}

/* UCXB: open the UCX data path to the client's worker. */
static void handle_ucxb(server *S, conn *c, const ft_msg *m, const uint8_t *addr)
{
    if (!S->w) {
        reply_status(S, c, 0, m->opcode, m->req_id, FT_ERR_UNSUPPORTED, "this node has no UCX data path");
        return;
    }
    if (c->uep) {
        reply_status(S, c, 0, m->opcode, m->req_id, FT_ERR_PROTOCOL, "UCX path already open");
        return;
    }
    if (ft_net_ucx_addr_check(addr, (size_t)m->data_len) != FT_OK) {
        /* a protocol error: this connection ends, the node goes on */
        char why[160];
        snprintf(why, sizeof why, "%s", ft_last_error());
        reply_status(S, c, 0, m->opcode, m->req_id, FT_ERR_PROTOCOL, "malformed UCX worker address");
        conn_close(S, c, why);
        return;
    }
    ucs_status_t s = ft_net_ucp_connect(S->w, addr, (size_t)m->data_len, uep_err_cb, c, &c->uep);
    if (s != UCS_OK) {
        c->uep = NULL;
        char why[128];
        snprintf(why, sizeof why, "cannot reach the client over UCX: %s", ucs_status_string(s));
        reply_status(S, c, 0, m->opcode, m->req_id, FT_ERR_NET, why);
        return;
    }
    FT_LOG(FT_LOG_INFO, "serve: conn %llu (%s): UCX data path open", (unsigned long long)c->id, c->peer);
    reply_status(S, c, 0, m->opcode, m->req_id, FT_OK, NULL);
}

/* CMAB: open the shared-memory path once the kernel vouches for the
 * client process (cma.h): arg 1 asks for the offer (this session's
 * nonce and the Unix socket's name), arg 2 confirms that the client has
 * presented the nonce there. */
static void handle_cmab(server *S, conn *c, const ft_msg *m)
{
    ft_status st;
    uint8_t offer[FT_CMA_OFFER_SIZE];
    int offering = m->arg == FT_CMAB_OFFER;
    if (ft_cma_peer_open(&c->cma)) {
        st = ft_set_error(FT_ERR_PROTOCOL, "shared-memory path already open");
    } else if (!S->cma_door) {
        st = ft_set_error(FT_ERR_UNSUPPORTED, "this node has no shared-memory path");
    } else if (!c->peer_inode) {
        st = ft_set_error(FT_ERR_UNSUPPORTED, "the client is not on this host");
    } else if (offering && c->cma_offered) {
        st = ft_set_error(FT_ERR_PROTOCOL, "CMAB offered once per connection");
    } else if (offering) {
        st = ft_cma_door_offer(S->cma_door, c->cma_nonce, offer);
        c->cma_offered = st == FT_OK;
    } else if (c->cma_offered != 1) {
        st = ft_set_error(FT_ERR_PROTOCOL, "CMAB confirmed before it was offered");
    } else {
        /* one try per connection; the client wrote the nonce before it
         * confirmed, so it is there already (a short wait covers a full
         * accept queue) */
        c->cma_offered = -1;
        st = ft_cma_door_claim(S->cma_door, c->cma_nonce, 0.25, &c->cma);
        memset(c->cma_nonce, 0, sizeof c->cma_nonce);
    }
    if (st == FT_OK && offering) {
        op *o = op_new(S, c, m->req_id, 0);
        if (!o) return;
        if (!(o->heap = malloc(sizeof offer))) {
            op_finish(o, UCS_OK);
            reply_status(S, c, 0, m->opcode, m->req_id, FT_ERR_NOMEM, "out of memory");
            return;
        }
        memcpy(o->heap, offer, sizeof offer);
        send_reply(c, o, m->opcode, FT_OK, o->heap, sizeof offer, 0, 0);
        return;
    }
    if (st == FT_OK) {
        FT_LOG(FT_LOG_INFO, "serve: conn %llu (%s): shared-memory path open (process %d)",
               (unsigned long long)c->id, c->peer, (int)c->cma.pid);
    } else {
        FT_LOG(FT_LOG_INFO, "serve: conn %llu (%s): no shared-memory path: %s",
               (unsigned long long)c->id, c->peer, ft_last_error());
    }
    reply_status(S, c, 0, m->opcode, m->req_id, st, ft_last_error());
}

/* PUTDV: a piece of a pipelined write, read by the node straight from the
 * client's memory into the reserved block. */
static void handle_putdv(server *S, conn *c, const ft_msg *m, const uint8_t *ref)
{
    uint64_t addr = ft_get_le64(ref), len = ft_get_le64(ref + 8);
    xput *x = xput_find(c, m->xid);
    ft_status st = FT_OK;
    if (!x) {
        st = ft_set_error(FT_ERR_PROTOCOL, "unknown transfer id");
    } else if (x->fail != FT_OK) {
        st = ft_set_error(x->fail, "pipelined write failed");
    } else if (x->committing || len == 0 || m->arg != x->pos || len > x->reserve - x->pos) {
        st = x->fail = ft_set_error(FT_ERR_PROTOCOL, "PUTDV out of order or beyond the reservation");
    } else {
        st = ft_cma_read(S->copiers, &c->cma, S->pool + x->off + x->pos, addr, (size_t)len);
        x->pos += len;
        if (st != FT_OK) {
            x->fail = st;
            FT_LOG(FT_LOG_WARN, "serve: conn %llu (%s): %s", (unsigned long long)c->id, c->peer,
                   ft_last_error());
        }
    }
    reply_status(S, c, 0, m->opcode, m->req_id, st, ft_last_error());
}

/* An authenticated request with its small payload (or none) in hand. */
static void dispatch(server *S, conn *c, int via_ucx, const ft_msg *m, const uint8_t *payload)
{
    switch (m->opcode) {
    case FT_OP_GET:
        handle_get(S, c, via_ucx, m, 0, NULL, NULL);
        return;
    case FT_OP_GETR:
        handle_get(S, c, via_ucx, m, 0, payload, NULL);
        return;
    case FT_OP_GETRV:
        if (via_ucx || !ft_cma_peer_open(&c->cma)) break;
        handle_get(S, c, via_ucx, m, 0, payload, payload + FT_MSG_RANGE_SIZE);
        return;
    case FT_OP_PUTDV:
        if (via_ucx || !ft_cma_peer_open(&c->cma)) break;
        handle_putdv(S, c, m, payload);
        return;
    case FT_OP_CMAB:
        if (via_ucx) break;
        handle_cmab(S, c, m);
        return;
    case FT_OP_STAT:
        if (m->key_len) {
            handle_get(S, c, via_ucx, m, 1, NULL, NULL);
        } else {
            op *o = op_new(S, c, m->req_id, via_ucx);
            if (!o) return;
            ft_store_stats s;
            fill_stats(S, &s);
            o->heap = malloc(FT_MSG_STATS_SIZE);
            if (!o->heap) { op_finish(o, UCS_OK); return; }
            ft_msg_stats_encode(&s, o->heap);
            send_reply(c, o, FT_OP_STAT, FT_OK, o->heap, FT_MSG_STATS_SIZE, 0, 0);
        }
        return;
    case FT_OP_DEL: {
        entry **pp = lookup(S, m->key, m->key_len);
        if (!*pp) {
            reply_status(S, c, via_ucx, FT_OP_DEL, m->req_id, FT_ERR_NOT_FOUND, "no such tensor");
        } else {
            entry_unlink(S, pp);
            reply_status(S, c, via_ucx, FT_OP_DEL, m->req_id, FT_OK, NULL);
        }
        return;
    }
    case FT_OP_LIST:
        handle_list(S, c, via_ucx, m);
        return;
    case FT_OP_PING:
        reply_status(S, c, via_ucx, FT_OP_PING, m->req_id, FT_OK, NULL);
        return;
    case FT_OP_PUTB: {
        if (c->nxputs >= MAX_XPUTS_PER_CONN || xput_find(c, m->xid)) {
            reply_status(S, c, via_ucx, m->opcode, m->req_id, FT_ERR_BUSY,
                         c->nxputs >= MAX_XPUTS_PER_CONN ? "too many writes in flight"
                                                         : "transfer id in use");
            return;
        }
        xput *x = calloc(1, sizeof *x);
        if (!x) {
            reply_status(S, c, via_ucx, m->opcode, m->req_id, FT_ERR_NOMEM, "out of memory");
            return;
        }
        x->xid = m->xid;
        memcpy(x->key, m->key, m->key_len);
        x->reserve = m->arg;
        x->header_size = m->aux;
        x->pos = m->aux;
        ft_status st = FT_OK;
        if (!alloc_spilling(S, m->arg, NULL, 0, &x->off, &x->alloc)) {
            /* keep the transfer id so that its pieces are dropped and the
             * commit answers the same */
            x->fail = st = FT_ERR_NO_SPACE;
            x->off = x->alloc = 0;
        }
        x->next = c->xputs;
        c->xputs = x;
        c->nxputs++;
        reply_status(S, c, via_ucx, m->opcode, m->req_id, st,
                     "memory node full (capacity and spill tier exhausted)");
        return;
    }
    case FT_OP_UCXB:
        if (via_ucx) break;
        handle_ucxb(S, c, m, payload);
        return;
    default:
        break;
    }
    reply_status(S, c, via_ucx, m->opcode, m->req_id, FT_ERR_PROTOCOL, "opcode not allowed here");
}

/* ------------------------------------------------------- authentication */

/* The front door's admission (door.h, on the door's thread): the
 * connection limit, a session id, the UCX address when the client wants
 * it, and whether the client is on this host (the shared-memory path).
 * Reads only what the main thread does not change after start (S->w,
 * S->waddr, S->ucx_tcp) and the authenticated count (atomic). */
static ft_status node_admit(void *arg, ft_door_conn *dc, uint8_t *extra, size_t cap, size_t *len,
                           uint64_t *aux, uint64_t *flags, const char **detail)
{
    server *S = arg;
    *len = 0;
    if (__atomic_load_n(&S->nauthed, __ATOMIC_ACQUIRE) >= S->p.max_connections) {
        *detail = "connection limit reached";
        return FT_ERR_BUSY;
    }
    uint64_t session = 0;
    while (session == 0)
        if (ft_net_random(&session, sizeof session) != FT_OK) {
            *detail = "internal error";
            return FT_ERR_INTERNAL;
        }
    int offer = S->w && (dc->client_flags & FT_CLIENT_UCX) && S->waddr_len <= cap;
    if (offer) {
        memcpy(extra, S->waddr, S->waddr_len);
        *len = S->waddr_len;
    }
    uint64_t f = (offer ? FT_NODE_UCX : 0) | (offer && S->ucx_tcp ? FT_NODE_UCX_TCP : 0);
    /* a client on this host may use the shared-memory path (CMAB) */
    struct sockaddr_storage me;
    socklen_t ml = sizeof me;
    dc->tag = 0;
    if (getsockname(dc->fd, (struct sockaddr *)&me, &ml) == 0 &&
        (dc->tag = ft_cma_peer_inode(&dc->sa, &me)) != 0)
        f |= FT_NODE_LOCAL | ((uint64_t)(uint32_t)getpid() << 32);
    *aux = session;
    *flags = f;
    return FT_OK;
}

/* ------------------------------------------------------------ TCP input */

static void rx_reset(conn *c)
{
    c->rxp = RXP_HDR;
    c->rx_have = 0;
    c->rx_need = FT_MSG_HDR_SIZE;
    c->rx_op = NULL;
    c->rx_dst = NULL;
    c->rx_len = c->rx_done = 0;
}

/* A complete header: decide where its payload goes. Returns 0 when the
 * connection was closed. */
static int tcp_header(server *S, conn *c)
{
    ft_msg m;
    ft_status st = ft_msg_parse(c->rx_hdr, c->rx_have, 0, S->cap, &m);
    if (st == FT_ERR_NO_SPACE && c->authed) {
        /* well formed, only larger than the pool: answer, drop the payload,
         * keep the connection */
        uint64_t dlen = ft_get_le64(c->rx_hdr + 24);
        reply_status(S, c, 0, ft_get_le16(c->rx_hdr + 6), ft_get_le64(c->rx_hdr + 8), st,
                     ft_last_error());
        if (c->dead) return 0;
        c->rx_len = dlen;
        c->rx_done = 0;
        c->rxp = dlen ? RXP_DISCARD : RXP_HDR;
        if (!dlen) rx_reset(c);
        return 1;
    }
    if (st != FT_OK) {
        char why[256];
        snprintf(why, sizeof why, "bad message: %s", ft_last_error());
        uint64_t id = ft_get_le64(c->rx_hdr + 8);
        /* on a stream the framing is lost: answer and close */
        reply_status(S, c, 0, FT_OP_HELLO, id, st, ft_last_error());
        FT_LOG(FT_LOG_WARN, "serve: conn %llu (%s): %s", (unsigned long long)c->id, c->peer, why);
        conn_close(S, c, NULL);
        return 0;
    }
    c->rx_m = m;
    c->rx_len = m.data_len;
    c->rx_done = 0;
    if (m.data_len == 0) {
        rx_reset(c);
        if (c->refs >= MAX_OPS_PER_CONN)
            reply_status(S, c, 0, m.opcode, m.req_id, FT_ERR_BUSY, "too many requests in flight");
        else
            dispatch(S, c, 0, &m, NULL);
        return !c->dead;
    }
    if (m.opcode == FT_OP_PUT || m.opcode == FT_OP_PUTD || m.opcode == FT_OP_PUTC) {
        uint8_t *dst = NULL;
        op *o = c->refs >= MAX_OPS_PER_CONN ? NULL : rx_prepare(S, c, &m, 0, &dst);
        if (!o && c->refs >= MAX_OPS_PER_CONN)
            reply_status(S, c, 0, m.opcode, m.req_id, FT_ERR_BUSY, "too many requests in flight");
        if (c->dead) return 0;
        c->rx_op = o;
        c->rx_dst = dst;
        c->rxp = o ? RXP_PAYLOAD : RXP_DISCARD;
        return 1;
    }
    if (m.data_len > SMALL_MAX) {   /* parse rules keep every other payload small */
        conn_close(S, c, "payload too large");
        return 0;
    }
    if (!c->small && !(c->small = malloc(SMALL_MAX))) {
        conn_close(S, c, "out of memory");
        return 0;
    }
    c->rx_dst = c->small;
    c->rxp = RXP_PAYLOAD;
    return 1;
}

/* The payload is in. Returns 0 when the connection was closed. */
static int tcp_payload_done(server *S, conn *c)
{
    op *o = c->rx_op;
    ft_msg m = c->rx_m;
    const uint8_t *payload = c->rx_dst;
    rx_reset(c);
    if (o) {
        rx_complete(o, UCS_OK);
        return !c->dead;
    }
    if (c->refs >= MAX_OPS_PER_CONN)
        reply_status(S, c, 0, m.opcode, m.req_id, FT_ERR_BUSY, "too many requests in flight");
    else
        dispatch(S, c, 0, &m, payload);
    return !c->dead;
}

static void tcp_read(server *S, conn *c)
{
    size_t budget = READ_BUDGET;
    uint8_t sink[65536];
    while (!c->dead && budget) {
        uint8_t *dst;
        size_t want;
        switch (c->rxp) {
        case RXP_HDR:
        case RXP_KEY:
            dst = c->rx_hdr + c->rx_have;
            want = c->rx_need - c->rx_have;
            break;
        case RXP_PAYLOAD:
            dst = c->rx_dst + c->rx_done;
            want = (size_t)(c->rx_len - c->rx_done);
            break;
        default:
            dst = sink;
            want = (size_t)(c->rx_len - c->rx_done);
            if (want > sizeof sink) want = sizeof sink;
            break;
        }
        if (want > budget) want = budget;
        ssize_t r = want ? recv(c->fd, dst, want, MSG_DONTWAIT) : 0;
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        if (r <= 0 && want) {
            conn_close(S, c, r == 0 ? "closed by the client" : strerror(errno));
            return;
        }
        budget -= (size_t)r;
        if (c->rxp == RXP_HDR || c->rxp == RXP_KEY) {
            c->rx_have += (size_t)r;
            if (c->rxp == RXP_HDR && c->rx_have >= 4 && ft_get_le32(c->rx_hdr) != FT_MSG_MAGIC) {
                /* not FlexTier: no need to wait for a whole header */
                tcp_header(S, c);   /* answers and closes */
                return;
            }
            if (c->rx_have < c->rx_need) continue;
            if (c->rxp == RXP_HDR) {
                size_t hlen;
                ft_status st = ft_msg_header_len(c->rx_hdr, &hlen);
                if (st != FT_OK) {
                    if (!tcp_header(S, c)) return;   /* answers and closes */
                    continue;
                }
                if (hlen > c->rx_have) {
                    c->rxp = RXP_KEY;
                    c->rx_need = hlen;
                    continue;
                }
            }
            if (!tcp_header(S, c)) return;
            if (c->rxp == RXP_PAYLOAD || c->rxp == RXP_DISCARD) continue;
        } else {
            c->rx_done += (uint64_t)r;
            if (c->rx_done < c->rx_len) continue;
            if (c->rxp == RXP_DISCARD) {
                rx_reset(c);
                continue;
            }
            if (!tcp_payload_done(S, c)) return;
        }
    }
}

/* ------------------------------------------------------------- UCX input */

static conn *find_session(server *S, uint64_t session)
{
    if (session == 0) return NULL;
    for (conn *c = S->conns; c; c = c->next)
        if (c->session == session && c->authed && c->uep && !c->dead && !c->uep_closing) return c;
    return NULL;
}

static void ucx_rx_cb(void *req, ucs_status_t status, size_t length, void *user)
{
    op *o = user;
    if (status == UCS_OK && length != o->size) status = UCS_ERR_MESSAGE_TRUNCATED;
    rx_complete(o, status);
    ucp_request_free(req);
}

static ucs_status_t on_am(void *arg, const void *header, size_t hlen, void *data, size_t len,
                          const ucp_am_recv_param_t *param)
{
    server *S = arg;
    /* who sent it: only the session id says; anything else is dropped */
    uint64_t session = hlen >= FT_MSG_HDR_SIZE ? ft_get_le64((const uint8_t *)header + 56) : 0;
    conn *c = find_session(S, session);
    if (!c) {
        S->dropped_am++;
        FT_LOG(FT_LOG_DEBUG, "serve: UCX message without a valid session dropped");
        return UCS_OK;
    }
    ft_msg m;
    ft_status st = ft_msg_parse(header, hlen, 0, S->cap, &m);
    if (st == FT_OK && m.data_len != len)
        st = ft_set_error(FT_ERR_PROTOCOL, "data length %llu but %zu bytes arrived",
                          (unsigned long long)m.data_len, len);
    if (st == FT_OK && (m.opcode == FT_OP_HELLO || m.opcode == FT_OP_AUTH || m.opcode == FT_OP_UCXB ||
                        m.opcode == FT_OP_CMAB || m.opcode == FT_OP_PUTDV || m.opcode == FT_OP_GETRV))
        st = ft_set_error(FT_ERR_PROTOCOL, "opcode %u not allowed over UCX", m.opcode);
    if (st == FT_OK && len && !(param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) && !data)
        st = ft_set_error(FT_ERR_PROTOCOL, "payload missing");
    if (st != FT_OK) {
        FT_LOG(FT_LOG_WARN, "serve: conn %llu (%s): bad UCX message: %s", (unsigned long long)c->id,
               c->peer, ft_last_error());
        if (hlen >= 16)
            reply_status(S, c, 1, FT_OP_HELLO, ft_get_le64((const uint8_t *)header + 8), st,
                         ft_last_error());
        if (++c->proto_errors > MAX_PROTO_ERRORS) {
            FT_LOG(FT_LOG_WARN, "serve: conn %llu: too many protocol errors, closing",
                   (unsigned long long)c->id);
            c->uep_closing = 1;
        }
        return UCS_OK;
    }
    if (c->refs >= MAX_OPS_PER_CONN) {
        reply_status(S, c, 1, m.opcode, m.req_id, FT_ERR_BUSY, "too many requests in flight");
        return UCS_OK;
    }
    if (m.opcode == FT_OP_PUT || m.opcode == FT_OP_PUTD || m.opcode == FT_OP_PUTC) {
        uint8_t *dst = NULL;
        op *o = rx_prepare(S, c, &m, 1, &dst);
        if (!o) return UCS_OK;   /* answered; UCX drops the data */
        if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
            ucp_request_param_t rp;
            memset(&rp, 0, sizeof rp);
            rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
            rp.cb.recv_am = ucx_rx_cb;
            rp.user_data = o;
            /* no memh: registered for this receive only (cache off) */
            ucs_status_ptr_t r = ucp_am_recv_data_nbx(S->w, data, dst, len, &rp);
            if (UCS_PTR_IS_ERR(r)) rx_complete(o, UCS_PTR_STATUS(r));
            else if (!r) rx_complete(o, UCS_OK);
            return UCS_OK;
        }
        memcpy(dst, data, len);
        rx_complete(o, UCS_OK);
        return UCS_OK;
    }
    if (len && (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {
        reply_status(S, c, 1, m.opcode, m.req_id, FT_ERR_PROTOCOL, "small payloads must be eager");
        return UCS_OK;
    }
    dispatch(S, c, 1, &m, data);
    return UCS_OK;
}

/* ---------------------------------------------------------- connections */

static void conn_close(server *S, conn *c, const char *why)
{
    if (c->dead) return;
    c->dead = 1;
    if (why)
        FT_LOG(FT_LOG_INFO, "serve: conn %llu (%s) closed: %s", (unsigned long long)c->id, c->peer, why);
    while (c->out_head) {   /* replies not sent: release their leases */
        op *o = c->out_head;
        c->out_head = o->qnext;
        op_finish(o, UCS_ERR_CANCELED);
    }
    c->out_tail = NULL;
    if (c->rx_op) {   /* a frame payload half read */
        op *o = c->rx_op;
        c->rx_op = NULL;
        rx_complete(o, UCS_ERR_CONNECTION_RESET);
    }
    if (c->fd >= 0) close(c->fd);
    c->fd = -1;
    ft_cma_peer_close(&c->cma);
    __atomic_sub_fetch(&S->nauthed, 1, __ATOMIC_RELEASE);
}

static void conn_free(server *S, conn *c)
{
    while (c->xputs) xput_drop(S, c, c->xputs);
    free(c->small);
    free(c);
}

/* Close dead connections' UCX endpoints; free them once nothing refers
 * to them. */
static void reap_conns(server *S)
{
    for (conn **pp = &S->conns; *pp;) {
        conn *c = *pp;
        if (c->uep_closing && !c->dead) conn_close(S, c, "UCX path failed");
        if (c->dead && c->uep) {
            ucp_request_param_t p;
            memset(&p, 0, sizeof p);
            p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
            p.flags = UCP_EP_CLOSE_FLAG_FORCE;
            c->close_req = ucp_ep_close_nbx(c->uep, &p);
            if (UCS_PTR_IS_ERR(c->close_req)) c->close_req = NULL;
            c->uep = NULL;
        }
        if (c->close_req && ucp_request_check_status(c->close_req) != UCS_INPROGRESS) {
            ucp_request_free(c->close_req);
            c->close_req = NULL;
        }
        if (c->dead && !c->close_req && c->refs == 0) {
            FT_LOG(FT_LOG_DEBUG, "serve: conn %llu freed", (unsigned long long)c->id);
            *pp = c->next;
            conn_free(S, c);
            continue;
        }
        pp = &c->next;
    }
}

/* Connections the front door authenticated. */
static void accept_conns(server *S)
{
    ft_door_conn dc;
    while (ft_door_take(S->door, &dc)) {
        conn *c = calloc(1, sizeof *c);
        if (!c) {
            close(dc.fd);
            continue;
        }
        c->fd = dc.fd;
        ft_cma_peer_init(&c->cma);
        c->sa = dc.sa;
        c->id = dc.id;
        snprintf(c->peer, sizeof c->peer, "%s", dc.peer);
        c->authed = 1;
        c->session = dc.aux;
        c->peer_inode = dc.tag;
        rx_reset(c);
        c->next = S->conns;
        S->conns = c;
        __atomic_add_fetch(&S->nauthed, 1, __ATOMIC_RELEASE);
        S->total_conns++;
    }
}

/* Deadlines: replies nobody takes (handshakes: the door's). */
static void check_timers(server *S)
{
    double now = ft_now();
    for (conn *c = S->conns; c; c = c->next) {
        if (c->dead) continue;
        if (c->out_head && now - c->t_out > S->lease_s) {
            conn_close(S, c, "replies not taken within the lease timeout");
        }
    }
    for (op *o = S->uops; o; o = o->unext)
        if (now > o->deadline && !o->c->uep_closing) {
            FT_LOG(FT_LOG_WARN, "serve: conn %llu (%s): reply not taken within the lease timeout",
                   (unsigned long long)o->c->id, o->c->peer);
            o->c->uep_closing = 1;
        }
}

/* ------------------------------------------------------------------ run */

void ft_node_default_params(ft_node_params *p)
{
    memset(p, 0, sizeof *p);
    p->listen = "127.0.0.1:13337";
    p->max_connections = 256;
    p->max_unauth = 64;
    p->auth_timeout_ms = 5000;
    p->lease_timeout_ms = 30000;
}

static void cleanup(server *S)
{
    for (conn *c = S->conns; c; c = c->next) conn_close(S, c, NULL);
    if (S->w) {
        double dl = ft_now() + 3.0;
        reap_conns(S);
        while (S->conns && ft_now() < dl) {
            ucp_worker_progress(S->w);
            reap_conns(S);
        }
    } else {
        reap_conns(S);
    }
    ft_door_close(S->door);
    for (unsigned i = 0; i < BUCKETS; i++) {
        entry *e = S->tab[i];
        while (e) {
            entry *n = e->hnext;
            if (!e->resident) {
                char name[64];
                spill_name(e, name, sizeof name);
                unlinkat(S->spill_dfd, name, 0);
            }
            free(e);
            e = n;
        }
    }
    while (S->free_list) {
        fblk *n = S->free_list->next;
        free(S->free_list);
        S->free_list = n;
    }
    if (S->spill_dfd >= 0) close(S->spill_dfd);
    if (S->pool) munmap(S->pool, S->cap);
    if (S->waddr) ucp_worker_release_address(S->w, S->waddr);
    if (S->w) ucp_worker_destroy(S->w);
    if (S->ctx) ucp_cleanup(S->ctx);
    ft_pool_free(S->copiers);
    ft_cma_door_close(S->cma_door);
    free(S);
}

/* The spill directory: ours, 0700, writable; stale files of an earlier
 * run removed (the pool they belonged to is gone). */
static ft_status open_spill_dir(server *S)
{
    const char *dir = S->p.spill_dir;
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dfd < 0) {
        int e = errno;
        struct stat lb;
        if (lstat(dir, &lb) == 0 && S_ISLNK(lb.st_mode))
            return ft_set_error(FT_ERR_INVALID_ARG, "spill dir %s is a symbolic link: name the "
                                "directory itself", dir);
        return ft_set_error(FT_ERR_INVALID_ARG, "spill dir %s: %s", dir, strerror(e));
    }
    S->spill_dfd = dfd;
    struct stat sb;
    if (fstat(dfd, &sb) != 0) return ft_set_error(FT_ERR_IO, "spill dir %s: %s", dir, strerror(errno));
    if (sb.st_uid != geteuid())
        return ft_set_error(FT_ERR_INVALID_ARG, "spill dir %s belongs to another user (uid %u)", dir,
                            (unsigned)sb.st_uid);
    if (sb.st_mode & 077)
        return ft_set_error(FT_ERR_INVALID_ARG,
                            "spill dir %s is accessible by group or others (mode 0%03o): use a "
                            "directory of mode 0700", dir, (unsigned)(sb.st_mode & 0777));
    char probe[64];
    snprintf(probe, sizeof probe, ".ftspill-probe-%d", (int)getpid());
    int fd = openat(dfd, probe, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    int ok = fd >= 0 && write(fd, "x", 1) == 1;
    int err = errno;
    if (fd >= 0) close(fd);
    if (fd >= 0) unlinkat(dfd, probe, 0);
    if (!ok) return ft_set_error(FT_ERR_INVALID_ARG, "spill dir %s is not writable: %s", dir, strerror(err));
    struct statvfs vs;
    if (fstatvfs(dfd, &vs) == 0) {
        uint64_t fs = (uint64_t)vs.f_blocks * vs.f_frsize;
        if (S->p.spill_capacity > fs && !S->p.overcommit)
            return ft_set_error(FT_ERR_INVALID_ARG,
                                "--spill-capacity %llu is above the size of the file system of %s "
                                "(%llu bytes; --overcommit to allow)",
                                (unsigned long long)S->p.spill_capacity, dir, (unsigned long long)fs);
    }
    int dfd2 = dup(dfd);
    DIR *d = dfd2 >= 0 ? fdopendir(dfd2) : NULL;
    struct dirent *de;
    unsigned stale = 0;
    while (d && (de = readdir(d))) {
        unsigned long long id;
        char tail[8];
        if (sscanf(de->d_name, "ftspill-%llu.%7s", &id, tail) == 2 && !strcmp(tail, "bin") &&
            unlinkat(dfd, de->d_name, 0) == 0)   /* a link is removed, not followed */
            stale++;
    }
    if (d) closedir(d); else if (dfd2 >= 0) close(dfd2);
    if (stale) FT_LOG(FT_LOG_INFO, "serve: removed %u stale spill files", stale);
    return FT_OK;
}

static ft_status check_params(server *S, const struct sockaddr_storage *addr)
{
    const ft_node_params *p = &S->p;
    if (p->capacity == 0) return ft_set_error(FT_ERR_INVALID_ARG, "capacity must be > 0");
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    uint64_t phys = pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz : 0;
    if (phys && p->capacity > phys && !p->overcommit)
        return ft_set_error(FT_ERR_INVALID_ARG,
                            "--capacity %llu is above this machine's memory (%llu bytes; "
                            "--overcommit to allow)", (unsigned long long)p->capacity,
                            (unsigned long long)phys);
    if (p->capacity > (1ull << 50))
        return ft_set_error(FT_ERR_INVALID_ARG, "--capacity %llu is beyond any pool this node can map",
                            (unsigned long long)p->capacity);
    if (p->spill_dir && p->spill_capacity == 0)
        return ft_set_error(FT_ERR_INVALID_ARG, "--spill-dir needs --spill-capacity");
    if (!p->spill_dir && p->spill_capacity)
        return ft_set_error(FT_ERR_INVALID_ARG, "--spill-capacity needs --spill-dir");
    if (!p->token_file && !ft_net_is_loopback(addr) && !p->insecure)
        return ft_set_error(FT_ERR_INVALID_ARG,
                            "refusing %s without a token: anyone who can reach it could read and "
                            "write every tensor (--token-file FILE, or --insecure)",
                            p->listen);
    if (p->max_unauth == 0 || p->max_connections == 0)
        return ft_set_error(FT_ERR_INVALID_ARG, "connection limits must be > 0");
    /* every connection is a file descriptor */
    struct rlimit rl;
    uint64_t need = (uint64_t)p->max_connections + p->max_unauth + 64;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < need) {
        if (rl.rlim_max >= need || rl.rlim_max == RLIM_INFINITY) {
            rl.rlim_cur = need;
            setrlimit(RLIMIT_NOFILE, &rl);
        }
        if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < need)
            return ft_set_error(FT_ERR_INVALID_ARG,
                                "--max-connections %u needs %llu file descriptors, the limit is %llu "
                                "(ulimit -n)", p->max_connections, (unsigned long long)need,
                                (unsigned long long)rl.rlim_cur);
    }
    return FT_OK;
}

/* The UCX data path: none when the policy leaves no transport. */
static void open_ucx(server *S, const struct sockaddr_storage *addr)
{
    /* the interface of --listen (and the RDMA ports behind it): one rail */
    char devs[512];
    ft_net_listen_devices(addr, S->p.trusted_network, devs, sizeof devs);
    ft_net_ucx_opts uo = {S->p.trusted_network, devs, "get_zcopy", 1, 0, NULL};
    ucs_status_t s = ft_net_ucp_open("flextier-serve", &uo, &S->ctx, &S->w, &S->efd);
    if (s == UCS_OK) {
        ucp_am_handler_param_t hp;
        memset(&hp, 0, sizeof hp);
        hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                        UCP_AM_HANDLER_PARAM_FIELD_ARG;
        hp.id = FT_AM_REQUEST;
        hp.cb = on_am;
        hp.arg = S;
        s = ucp_worker_set_am_recv_handler(S->w, &hp);
    }
    if (s == UCS_OK) s = ucp_worker_get_address(S->w, &S->waddr, &S->waddr_len);
    if (s == UCS_OK && S->waddr_len > FT_MSG_MAX_ADDR) s = UCS_ERR_EXCEEDS_LIMIT;
    if (s != UCS_OK) {
        if (s == UCS_ERR_UNSUPPORTED)
            FT_LOG(FT_LOG_INFO, "serve: no UCX data path: the transports UCX_TLS allows need "
                   "--trusted-network; clients use the node's TCP path");
        else
            FT_LOG(FT_LOG_WARN, "serve: no UCX data path (%s); clients use the node's TCP path",
                   ucs_status_string(s));
        if (S->waddr) ucp_worker_release_address(S->w, S->waddr);
        if (S->w) ucp_worker_destroy(S->w);
        if (S->ctx) ucp_cleanup(S->ctx);
        S->waddr = NULL;
        S->w = NULL;
        S->ctx = NULL;
        S->efd = -1;
        return;
    }
    S->ucx_tcp = S->p.trusted_network;
    FT_LOG(FT_LOG_INFO, "serve: UCX data path for authenticated clients (%s%s%s)",
           S->ucx_tcp ? "TCP allowed on the trusted network" : "shared memory and RDMA only",
           devs[0] ? ", devices " : "", devs);
}

ft_status ft_node_run(const ft_node_params *params)
{
    ft_node_params p;
    if (params) p = *params; else ft_node_default_params(&p);
    if (!p.listen) p.listen = "127.0.0.1:13337";
    if (!p.max_connections) p.max_connections = 256;
    if (!p.max_unauth) p.max_unauth = 64;
    if (p.auth_timeout_ms <= 0) p.auth_timeout_ms = 5000;
    if (p.lease_timeout_ms <= 0) p.lease_timeout_ms = 30000;
    server *S = calloc(1, sizeof *S);
    if (!S) return ft_set_error(FT_ERR_NOMEM, "server");
    S->p = p;
    S->efd = -1;
    S->spill_dfd = -1;
    S->lease_s = p.lease_timeout_ms / 1000.0;
    ft_status st = FT_OK;
    struct sockaddr_storage addr;
    socklen_t alen;
    char bound[128];
    if ((st = ft_net_resolve(p.listen, 1, &addr, &alen)) != FT_OK) goto out;
    if ((st = check_params(S, &addr)) != FT_OK) goto out;
    if (p.token_file) {   /* checked here too: configuration errors before the pool */
        uint8_t tok[FT_TOKEN_MAX];
        size_t tl = 0;
        st = ft_net_read_token(p.token_file, FT_TOKEN_MIN, tok, sizeof tok, &tl);
        memset(tok, 0, sizeof tok);
        if (st != FT_OK) goto out;
        S->has_token = 1;
    }
    if (p.spill_dir && (st = open_spill_dir(S)) != FT_OK) goto out;
    S->cap = (p.capacity + ALIGN - 1) / ALIGN * ALIGN;
    S->pool = mmap(NULL, S->cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (S->pool == MAP_FAILED) {
        S->pool = NULL;
        st = ft_set_error(FT_ERR_NOMEM, "cannot map a pool of %llu bytes", (unsigned long long)S->cap);
        goto out;
    }
    S->free_list = malloc(sizeof *S->free_list);
    if (!S->free_list) { st = FT_ERR_NOMEM; goto out; }
    S->free_list->off = 0;
    S->free_list->len = S->cap;
    S->free_list->next = NULL;
    /* threads for the shared-memory path's copies (FLEXTIER_THREADS).
     * They sleep between copies rather than spin (unless FLEXTIER_SPIN_US
     * says): a copy is a range of MiBs, milliseconds long, and a spinning
     * worker takes a core from the client beside it on this machine.
     * Measured on 2 vCPUs, a loopback node's row (1 compute thread): 182-222
     * tok/s with the node's workers spinning 100 us, 234-267 without, and
     * the planner's link probe read 6.6-13.3 GB/s then, 10.2-12.8 now. */
    if (ft_default_threads() > 1 && ft_pool_create(ft_default_threads(), &S->copiers) != FT_OK)
        S->copiers = NULL;
    ft_pool_set_spin_us(S->copiers, 0);
    if (ft_cma_door_open(&S->cma_door) != FT_OK) {
        FT_LOG(FT_LOG_INFO, "serve: no shared-memory path: %s", ft_last_error());
        S->cma_door = NULL;
        ft_clear_error();
    }
    /* the UCX context before the door: admission reads S->w and S->waddr */
    open_ucx(S, &addr);
    {
        ft_door_params dp;
        memset(&dp, 0, sizeof dp);
        dp.what = "serve";
        dp.listen = p.listen;
        dp.token_file = p.token_file;
        dp.insecure = p.insecure;
        dp.max_unauth = p.max_unauth;
        dp.auth_timeout_ms = p.auth_timeout_ms;
        dp.max_extra = FT_MSG_MAX_ADDR;
        dp.admit = node_admit;
        dp.arg = S;
        if ((st = ft_door_open(&dp, &S->door)) != FT_OK) goto out;
        snprintf(bound, sizeof bound, "%s", ft_door_bound(S->door));
    }
    FT_LOG(FT_LOG_INFO, "serve: listening on %s, pool %llu bytes%s%s%s", bound,
           (unsigned long long)S->cap, p.spill_dir ? ", spill to " : "",
           p.spill_dir ? p.spill_dir : "", S->has_token ? ", token required" : ", no token");
    if (p.on_ready) p.on_ready(p.arg, bound);

    struct pollfd *pfd = NULL;
    conn **pconn = NULL;
    size_t pcap = 0;
    while (!(p.stop && *p.stop)) {
        accept_conns(S);   /* what the door authenticated (cheap when none) */
        check_timers(S);
        reap_conns(S);
        int busy = 0;
        if (S->w) {
            for (int i = 0; i < 64 && ucp_worker_progress(S->w); i++) busy = 1;
            reap_conns(S);
        }
        size_t n = 0, need = 8;
        for (conn *c = S->conns; c; c = c->next) need++;
        if (need > pcap) {
            struct pollfd *np = realloc(pfd, need * sizeof *np);
            conn **nc = np ? realloc(pconn, need * sizeof *nc) : NULL;
            if (np) pfd = np;
            if (nc) pconn = nc;
            if (!np || !nc) { st = ft_set_error(FT_ERR_NOMEM, "poll set"); break; }
            pcap = need;
        }
        double now = ft_now(), wake = now + 0.1;
        for (conn *c = S->conns; c; c = c->next) {
            if (c->dead) continue;
            pfd[n].fd = c->fd;
            pfd[n].events = (short)(POLLIN | (c->out_head ? POLLOUT : 0));
            pfd[n].revents = 0;
            pconn[n++] = c;
        }
        size_t lidx = n;
        pfd[n].fd = ft_door_fd(S->door);
        pfd[n].events = POLLIN;
        pfd[n++].revents = 0;
        if (S->w) {
            pfd[n].fd = S->efd;
            pfd[n].events = POLLIN;
            pfd[n++].revents = 0;
            if (!busy && ucp_worker_arm(S->w) == UCS_ERR_BUSY) busy = 1;
        }
        int timeout = busy ? 0 : (int)((wake - now) * 1000) + 1;
        if (timeout < 0) timeout = 0;
        int r = poll(pfd, n, timeout);
        if (r < 0 && errno != EINTR) {
            st = ft_set_error(FT_ERR_NET, "poll: %s", strerror(errno));
            break;
        }
        if (r <= 0) continue;
        for (size_t i = 0; i < lidx; i++) {
            conn *c = pconn[i];
            if (c->dead || !pfd[i].revents) continue;
            if (pfd[i].revents & POLLOUT) tcp_flush(S, c);
            if (!c->dead && (pfd[i].revents & (POLLIN | POLLERR | POLLHUP))) tcp_read(S, c);
        }
        if (pfd[lidx].revents & POLLIN) accept_conns(S);
    }
    free(pfd);
    free(pconn);
    uint64_t refused = 0;
    ft_door_stats(S->door, &refused, NULL);
    FT_LOG(FT_LOG_INFO, "serve: shutting down (%llu tensors, %llu bytes in, %llu bytes out; "
           "%llu connections refused during back-off, %llu UCX messages without a session dropped)",
           (unsigned long long)S->tensors, (unsigned long long)S->bytes_in,
           (unsigned long long)S->bytes_out, (unsigned long long)refused,
           (unsigned long long)S->dropped_am);
out:
    cleanup(S);
    return st;
}
