/* The memory node (`flextier serve`): a single-threaded UCP event loop.
 *
 * Pool: one anonymous mapping of `capacity` bytes, registered once with
 * ucp_mem_map; frames live at offsets handed out by a first-fit free list
 * (256-byte granularity, coalescing on free).
 *
 * PUT: the request AM carries the frame as its payload. Eager payloads are
 * copied into a pool block; rendezvous payloads are received by
 * ucp_am_recv_data_nbx straight into the block. Only when the whole frame
 * is there, ft_frame_parse accepts it and its XXH3 matches the client's,
 * does the entry become visible (replacing any older one in one step).
 * A failed or aborted receive just frees the block.
 *
 * GET: the reply AM's payload is sent straight from the pool; the entry
 * holds a lease (leases++) until the send completes, so an overwrite or
 * delete meanwhile unlinks the entry but frees its block only when the
 * last lease ends.
 *
 * Spill: when an allocation fails and a spill dir is configured, the
 * least-recently-used resident entries without leases are written to
 * files and their blocks freed; a GET of a spilled entry reads it back
 * into the pool (checking its XXH3) before sending.
 *
 * Connections: PEER error mode; a failed endpoint is force-closed from the
 * main loop, which completes its outstanding operations (callbacks release
 * their blocks / leases); the conn struct is freed when its last operation
 * is gone. Other clients are unaffected. */
#include "msg.h"
#include "store/store_internal.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>
#include <ucp/api/ucp.h>

#include "net.h"


#define ALIGN 256u
#define BUCKETS 4096u
#define MAX_PROTO_ERRORS 16u
#define MAX_PENDING_CONN 64u
#define MAX_OPS_PER_CONN 1024u   /* bounds per-connection server memory */

typedef struct fblk { uint64_t off, len; struct fblk *next; } fblk;

typedef struct entry {
    char          key[FT_KEY_MAX + 1];
    uint64_t      id;
    uint64_t      off, size, alloc, hash, header_size;
    int           resident;    /* in the pool (else in a spill file) */
    int           dead;        /* unlinked; free when leases drop to 0 */
    unsigned      leases;
    struct entry *hnext, *prev, *next;  /* hash chain, LRU list */
} entry;

typedef struct conn {
    ucp_ep_h      ep;
    uint64_t      id;
    char          peer[64];
    int           authed, dead, closed;
    unsigned      refs;          /* outstanding operations */
    unsigned      proto_errors;
    ucs_status_ptr_t close_req;
    struct conn  *next;
} conn;

typedef struct server server;

typedef struct op {
    server  *S;
    conn    *c;
    entry   *lease;            /* GET: leased entry */
    void    *heap;             /* reply data owned by the op */
    uint64_t req_id;
    uint64_t count_out;        /* GET payload bytes for the stats */
    /* PUT */
    char     key[FT_KEY_MAX + 1];
    uint64_t off, size, alloc, hash;
    uint8_t  hdr[FT_MSG_MAX_HDR];
} op;

struct server {
    ft_node_params p;
    ucp_context_h  ctx;
    ucp_worker_h   w;
    ucp_listener_h listener;
    int            efd;
    uint8_t       *pool;
    uint64_t       cap;
    ucp_mem_h      memh;
    fblk          *free_list;
    uint64_t       used;
    entry         *tab[BUCKETS];
    entry         *lru_head, *lru_tail;   /* head = most recent */
    uint64_t       next_entry_id;
    uint64_t       tensors, spilled, spill_used;
    conn          *conns;
    unsigned       nconns;
    uint64_t       next_conn_id, total_conns;
    uint64_t       bytes_in, bytes_out, puts, gets;
    ucp_conn_request_h pending_conn[MAX_PENDING_CONN];
    unsigned       npending_conn;
    char           token[FT_MSG_MAX_TOKEN];
    size_t         token_len;
    int            has_token;
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

static void spill_path(server *S, const entry *e, char *buf, size_t n)
{
    snprintf(buf, n, "%s/ftspill-%llu.bin", S->p.spill_dir, (unsigned long long)e->id);
}

/* Release an unlinked entry's storage. */
static void entry_destroy(server *S, entry *e)
{
    if (e->resident) {
        pool_free(S, e->off, e->alloc);
    } else {
        char path[4200];
        spill_path(S, e, path, sizeof path);
        unlink(path);
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

static int write_file(const char *path, const void *data, size_t n)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return -1;
    const uint8_t *b = data;
    while (n) {
        ssize_t w = write(fd, b, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) { close(fd); unlink(path); return -1; }
        b += w;
        n -= (size_t)w;
    }
    return close(fd);
}

static int spill_one(server *S, const entry *exclude)
{
    if (!S->p.spill_dir) return 0;
    for (entry *e = S->lru_tail; e; e = e->prev) {
        if (!e->resident || e->leases || e == exclude) continue;
        if (S->spill_used + e->size > S->p.spill_capacity) return 0;
        char path[4200];
        spill_path(S, e, path, sizeof path);
        if (write_file(path, S->pool + e->off, e->size) != 0) {
            FT_LOG(FT_LOG_ERROR, "serve: spill to %s failed: %s", path, strerror(errno));
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

static int alloc_spilling(server *S, uint64_t size, const entry *exclude,
                          uint64_t *off, uint64_t *alloc)
{
    for (;;) {
        if (pool_alloc(S, size, off, alloc)) return 1;
        if (!spill_one(S, exclude)) return 0;
    }
}

/* Bring a spilled entry back into the pool. */
static ft_status reload(server *S, entry *e)
{
    uint64_t off, alloc;
    if (!alloc_spilling(S, e->size, e, &off, &alloc))
        return ft_set_error(FT_ERR_NO_SPACE, "no pool space to reload '%s'", e->key);
    char path[4200];
    spill_path(S, e, path, sizeof path);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    size_t n = 0;
    while (fd >= 0 && n < e->size) {
        ssize_t r = pread(fd, S->pool + off + n, e->size - n, (off_t)n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        n += (size_t)r;
    }
    if (fd >= 0) close(fd);
    if (n != e->size || ft_xxh3(S->pool + off, e->size) != e->hash) {
        pool_free(S, off, alloc);
        return ft_set_error(FT_ERR_CORRUPT, "spill file %s for '%s' is corrupt or missing",
                            path, e->key);
    }
    unlink(path);
    S->spill_used -= e->size;
    S->spilled--;
    e->off = off;
    e->alloc = alloc;
    e->resident = 1;
    FT_LOG(FT_LOG_INFO, "serve: reloaded '%s' from spill", e->key);
    return FT_OK;
}

/* --------------------------------------------------------------- replies */

static void op_finish(op *o, ucs_status_t status)
{
    server *S = o->S;
    if (o->lease) {
        entry *e = o->lease;
        if (--e->leases == 0 && e->dead) entry_destroy(S, e);
    }
    if (status == UCS_OK) S->bytes_out += o->count_out;
    free(o->heap);
    o->c->refs--;
    free(o);
}

static void reply_sent_cb(void *req, ucs_status_t status, void *user)
{
    op *o = user;
    if (status != UCS_OK)
        FT_LOG(FT_LOG_INFO, "serve: conn %llu: reply not delivered: %s",
               (unsigned long long)o->c->id, ucs_status_string(status));
    op_finish(o, status);
    ucp_request_free(req);
}

/* Send a reply; data stays valid until the send completes (it belongs to
 * the op: a heap buffer or a leased entry). Takes ownership of o. */
static void send_reply_aux(conn *c, op *o, uint16_t opcode, ft_status st,
                           const void *data, size_t len, uint64_t aux)
{
    if (c->dead) { op_finish(o, UCS_ERR_CANCELED); return; }
    size_t hlen = ft_msg_encode(o->hdr, (uint16_t)(opcode | FT_OP_REPLY), o->req_id,
                                (int32_t)st, NULL, 0, len, aux, 0);
    ucp_request_param_t rp;
    memset(&rp, 0, sizeof rp);
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    rp.cb.send = reply_sent_cb;
    rp.user_data = o;
    if (o->lease && o->lease->resident) {
        rp.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
        rp.memh = o->S->memh;
    }
    ucs_status_ptr_t r = ucp_am_send_nbx(c->ep, FT_AM_REPLY, o->hdr, hlen, data, len, &rp);
    if (UCS_PTR_IS_ERR(r)) op_finish(o, UCS_PTR_STATUS(r));
    else if (!r) op_finish(o, UCS_OK);
}

static void send_reply(conn *c, op *o, uint16_t opcode, ft_status st, const void *data,
                       size_t len)
{
    send_reply_aux(c, o, opcode, st, data, len, 0);
}

static op *op_new(server *S, conn *c, uint64_t req_id)
{
    op *o = calloc(1, sizeof *o);
    if (!o) return NULL;
    o->S = S;
    o->c = c;
    o->req_id = req_id;
    c->refs++;
    return o;
}

/* A reply without data, or with an error detail as text. */
static void reply_status(server *S, conn *c, uint16_t opcode, uint64_t req_id,
                         ft_status st, const char *detail)
{
    op *o = op_new(S, c, req_id);
    if (!o) return;
    size_t n = 0;
    if (st != FT_OK && detail && *detail) {
        n = strlen(detail);
        if (n > 200) n = 200;
        o->heap = malloc(n);
        if (o->heap) memcpy(o->heap, detail, n); else n = 0;
    }
    send_reply(c, o, opcode, st, o->heap, n);
}

/* ------------------------------------------------------------------ PUT */

static void put_done(op *o, ucs_status_t status)
{
    server *S = o->S;
    conn *c = o->c;
    ft_status st = FT_OK;
    char detail[200] = "";
    if (status != UCS_OK || c->dead) {
        FT_LOG(FT_LOG_WARN, "serve: conn %llu: PUT '%s' aborted: %s", (unsigned long long)c->id,
               o->key, ucs_status_string(status));
        pool_free(S, o->off, o->alloc);
        op_finish(o, status);
        return;
    }
    ft_frame_info fi;
    uint8_t *frame = S->pool + o->off;
    if (ft_frame_parse(frame, o->size, &fi) != FT_OK || fi.frame_size != o->size) {
        st = FT_ERR_CORRUPT;
        snprintf(detail, sizeof detail, "frame rejected: %s", ft_last_error());
    } else if (ft_xxh3(frame, o->size) != o->hash) {
        st = FT_ERR_CORRUPT;
        snprintf(detail, sizeof detail, "frame checksum mismatch");
    }
    entry *e = NULL;
    if (st == FT_OK && !(e = calloc(1, sizeof *e))) {
        st = FT_ERR_NOMEM;
        snprintf(detail, sizeof detail, "out of memory");
    }
    if (st != FT_OK) {
        FT_LOG(FT_LOG_WARN, "serve: conn %llu: PUT '%s': %s", (unsigned long long)c->id, o->key, detail);
        pool_free(S, o->off, o->alloc);
        reply_status(S, c, FT_OP_PUT, o->req_id, st, detail);
        op_finish(o, UCS_OK);
        return;
    }
    size_t kl = strlen(o->key);
    memcpy(e->key, o->key, kl + 1);
    e->id = ++S->next_entry_id;
    e->off = o->off;
    e->size = o->size;
    e->alloc = o->alloc;
    e->hash = o->hash;
    e->header_size = fi.header_size;
    e->resident = 1;
    entry **pp = lookup(S, o->key, kl);
    if (*pp) entry_unlink(S, pp);     /* old version: freed when unleased */
    pp = lookup(S, o->key, kl);
    e->hnext = *pp;
    *pp = e;
    lru_push(S, e);
    S->tensors++;
    S->puts++;
    S->bytes_in += o->size;
    FT_LOG(FT_LOG_DEBUG, "serve: PUT '%s' %llu bytes", o->key, (unsigned long long)o->size);
    reply_status(S, c, FT_OP_PUT, o->req_id, FT_OK, NULL);
    op_finish(o, UCS_OK);
}

static void put_recv_cb(void *req, ucs_status_t status, size_t length, void *user)
{
    op *o = user;
    if (status == UCS_OK && length != o->size) status = UCS_ERR_MESSAGE_TRUNCATED;
    put_done(o, status);
    ucp_request_free(req);
}

static void handle_put(server *S, conn *c, const ft_msg *m, void *data,
                       const ucp_am_recv_param_t *param)
{
    uint64_t off, alloc;
    if (m->data_len > S->cap || !alloc_spilling(S, m->data_len, NULL, &off, &alloc)) {
        reply_status(S, c, FT_OP_PUT, m->req_id, FT_ERR_NO_SPACE,
                     "memory node full (capacity and spill tier exhausted)");
        return;
    }
    op *o = op_new(S, c, m->req_id);
    if (!o) {
        pool_free(S, off, alloc);
        return;
    }
    memcpy(o->key, m->key, m->key_len);
    o->key[m->key_len] = 0;
    o->off = off;
    o->alloc = alloc;
    o->size = m->data_len;
    o->hash = m->aux;
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
        ucp_request_param_t rp;
        memset(&rp, 0, sizeof rp);
        rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                          UCP_OP_ATTR_FIELD_MEMH;
        rp.cb.recv_am = put_recv_cb;
        rp.user_data = o;
        rp.memh = S->memh;
        ucs_status_ptr_t r = ucp_am_recv_data_nbx(S->w, data, S->pool + off, o->size, &rp);
        if (UCS_PTR_IS_ERR(r)) put_done(o, UCS_PTR_STATUS(r));
        else if (!r) put_done(o, UCS_OK);
        return;
    }
    memcpy(S->pool + off, data, o->size);
    put_done(o, UCS_OK);
}

/* ------------------------------------------------------------ other ops */

static void handle_get(server *S, conn *c, const ft_msg *m, int header_only,
                       const uint8_t *range)
{
    entry **pp = lookup(S, m->key, m->key_len);
    entry *e = *pp;
    if (!e) {
        reply_status(S, c, m->opcode, m->req_id, FT_ERR_NOT_FOUND, "no such tensor");
        return;
    }
    uint64_t r_off = 0, r_len = e->size;
    if (range) {
        uint64_t ver = ft_get_le64(range), off = ft_get_le64(range + 8), len = ft_get_le64(range + 16);
        if (ver && ver != e->id) {
            reply_status(S, c, m->opcode, m->req_id, FT_ERR_BUSY, "tensor was replaced");
            return;
        }
        if (off >= e->size || len == 0 || len > FT_MSG_MAX_RANGE) {
            reply_status(S, c, m->opcode, m->req_id, FT_ERR_PROTOCOL, "bad range");
            return;
        }
        r_off = off;
        r_len = e->size - off < len ? e->size - off : len;
    }
    if (!e->resident && !header_only) {
        ft_status st = reload(S, e);
        if (st != FT_OK) {
            FT_LOG(FT_LOG_ERROR, "serve: %s", ft_last_error());
            if (st == FT_ERR_CORRUPT) entry_unlink(S, pp);
            reply_status(S, c, m->opcode, m->req_id, st, ft_last_error());
            return;
        }
    }
    op *o = op_new(S, c, m->req_id);
    if (!o) return;
    lru_unlink(S, e);
    lru_push(S, e);
    if (header_only && !e->resident) {
        char path[4200];
        spill_path(S, e, path, sizeof path);
        o->heap = malloc(e->header_size);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        ssize_t r = (fd >= 0 && o->heap) ? pread(fd, o->heap, e->header_size, 0) : -1;
        if (fd >= 0) close(fd);
        if (r != (ssize_t)e->header_size) {
            op_finish(o, UCS_OK);
            reply_status(S, c, m->opcode, m->req_id, FT_ERR_IO, "spill file unreadable");
            return;
        }
        send_reply(c, o, m->opcode, FT_OK, o->heap, e->header_size);
        return;
    }
    e->leases++;
    o->lease = e;
    if (!header_only) {
        if (r_off == 0) S->gets++;
        o->count_out = r_len;
    }
    send_reply_aux(c, o, m->opcode, FT_OK, S->pool + e->off + r_off,
                   header_only ? e->header_size : r_len, e->id);
}

static void fill_stats(server *S, ft_store_stats *st)
{
    memset(st, 0, sizeof *st);
    st->capacity = S->cap;
    st->used = S->used;
    st->tensors = S->tensors;
    st->connections = S->nconns;
    st->total_connections = S->total_conns;
    st->bytes_in = S->bytes_in;
    st->bytes_out = S->bytes_out;
    st->spill_capacity = S->p.spill_dir ? S->p.spill_capacity : 0;
    st->spill_used = S->spill_used;
    st->spilled_tensors = S->spilled;
    st->puts = S->puts;
    st->gets = S->gets;
}

static void handle_list(server *S, conn *c, const ft_msg *m)
{
    size_t n = 4;
    uint32_t count = 0;
    for (unsigned i = 0; i < BUCKETS; i++)
        for (entry *e = S->tab[i]; e; e = e->hnext) { n += 2 + strlen(e->key); count++; }
    op *o = op_new(S, c, m->req_id);
    if (!o) return;
    uint8_t *b = o->heap = malloc(n);
    if (!b) {
        op_finish(o, UCS_OK);
        reply_status(S, c, FT_OP_LIST, m->req_id, FT_ERR_NOMEM, "list");
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
    send_reply(c, o, FT_OP_LIST, FT_OK, b, n);
}

static int token_ok(server *S, const void *tok, size_t n)
{
    /* constant time in the token contents (the length is not secret) */
    if (n == 0 || !tok) return 0;
    unsigned char diff = (unsigned char)(n != S->token_len);
    const unsigned char *a = tok, *b = (const unsigned char *)S->token;
    for (size_t i = 0; i < S->token_len; i++) diff |= (unsigned char)(a[i < n ? i : 0] ^ b[i]);
    return diff == 0;
}

static conn *find_conn(server *S, ucp_ep_h ep)
{
    for (conn *c = S->conns; c; c = c->next)
        if (c->ep == ep && !c->dead) return c;
    return NULL;
}

static ucs_status_t on_request(void *arg, const void *header, size_t hlen, void *data,
                               size_t len, const ucp_am_recv_param_t *param)
{
    server *S = arg;
    conn *c = (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)
                  ? find_conn(S, param->reply_ep) : NULL;
    if (!c) return UCS_OK;    /* unknown or dying connection: drop */
    ft_msg m;
    ft_status st = ft_msg_parse(header, hlen, len, 0, S->cap, &m);
    if (st != FT_OK) {
        FT_LOG(FT_LOG_WARN, "serve: conn %llu (%s): bad message: %s", (unsigned long long)c->id,
               c->peer, ft_last_error());
        /* answer if the request id is readable so the client fails fast */
        if (hlen >= 16) {
            uint64_t id = ft_get_le64((const uint8_t *)header + 8);
            ft_status rs = (st == FT_ERR_UNSUPPORTED) ? st : FT_ERR_PROTOCOL;
            if (strstr(ft_last_error(), "above limit")) rs = FT_ERR_NO_SPACE;
            reply_status(S, c, FT_OP_HELLO, id, rs, ft_last_error());
        }
        if (++c->proto_errors > MAX_PROTO_ERRORS) {
            FT_LOG(FT_LOG_WARN, "serve: conn %llu: too many protocol errors, closing",
                   (unsigned long long)c->id);
            c->dead = 1;
        }
        return UCS_OK;
    }
    if (c->refs >= MAX_OPS_PER_CONN) {
        reply_status(S, c, m.opcode, m.req_id, FT_ERR_BUSY, "too many requests in flight");
        return UCS_OK;
    }
    if (m.opcode != FT_OP_HELLO && !c->authed) {
        reply_status(S, c, m.opcode, m.req_id, FT_ERR_AUTH, "not authenticated (HELLO first)");
        return UCS_OK;
    }
    switch (m.opcode) {
    case FT_OP_HELLO: {
        int ok = 1;
        if (m.data_len && (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) ok = 0;
        else if (S->has_token) ok = token_ok(S, data, m.data_len);
        if (ok) {
            c->authed = 1;
            FT_LOG(FT_LOG_INFO, "serve: conn %llu (%s): authenticated", (unsigned long long)c->id,
                   c->peer);
            reply_status(S, c, FT_OP_HELLO, m.req_id, FT_OK, NULL);
        } else {
            c->authed = 0;
            FT_LOG(FT_LOG_WARN, "serve: conn %llu (%s): authentication failed",
                   (unsigned long long)c->id, c->peer);
            reply_status(S, c, FT_OP_HELLO, m.req_id, FT_ERR_AUTH, "wrong or missing token");
        }
        return UCS_OK;
    }
    case FT_OP_PUT:
        handle_put(S, c, &m, data, param);
        return UCS_OK;
    case FT_OP_GET:
        handle_get(S, c, &m, 0, NULL);
        return UCS_OK;
    case FT_OP_GETR:
        if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
            reply_status(S, c, m.opcode, m.req_id, FT_ERR_PROTOCOL, "range must be eager");
            return UCS_OK;
        }
        handle_get(S, c, &m, 0, data);
        return UCS_OK;
    case FT_OP_STAT:
        if (m.key_len) {
            handle_get(S, c, &m, 1, NULL);
        } else {
            op *o = op_new(S, c, m.req_id);
            if (!o) return UCS_OK;
            ft_store_stats s;
            fill_stats(S, &s);
            o->heap = malloc(FT_MSG_STATS_SIZE);
            if (!o->heap) { op_finish(o, UCS_OK); return UCS_OK; }
            ft_msg_stats_encode(&s, o->heap);
            send_reply(c, o, FT_OP_STAT, FT_OK, o->heap, FT_MSG_STATS_SIZE);
        }
        return UCS_OK;
    case FT_OP_DEL: {
        entry **pp = lookup(S, m.key, m.key_len);
        if (!*pp) {
            reply_status(S, c, FT_OP_DEL, m.req_id, FT_ERR_NOT_FOUND, "no such tensor");
        } else {
            entry_unlink(S, pp);
            reply_status(S, c, FT_OP_DEL, m.req_id, FT_OK, NULL);
        }
        return UCS_OK;
    }
    case FT_OP_LIST:
        handle_list(S, c, &m);
        return UCS_OK;
    }
    return UCS_OK;
}

/* ---------------------------------------------------------- connections */

static void conn_err_cb(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    conn *c = arg;
    (void)ep;
    if (!c->dead)
        FT_LOG(FT_LOG_INFO, "serve: conn %llu (%s) closed: %s", (unsigned long long)c->id,
               c->peer, ucs_status_string(status));
    c->dead = 1;
}

static void conn_req_cb(ucp_conn_request_h req, void *arg)
{
    server *S = arg;
    if (S->npending_conn >= MAX_PENDING_CONN || S->nconns >= S->p.max_connections) {
        FT_LOG(FT_LOG_WARN, "serve: connection limit reached, rejecting");
        ucp_listener_reject(S->listener, req);
        return;
    }
    S->pending_conn[S->npending_conn++] = req;
}

static void accept_conns(server *S)
{
    for (unsigned i = 0; i < S->npending_conn; i++) {
        ucp_conn_request_h req = S->pending_conn[i];
        conn *c = calloc(1, sizeof *c);
        if (!c) { ucp_listener_reject(S->listener, req); continue; }
        c->id = ++S->next_conn_id;
        ucp_conn_request_attr_t a;
        a.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
        snprintf(c->peer, sizeof c->peer, "?");
        if (ucp_conn_request_query(req, &a) == UCS_OK) {
            char host[INET6_ADDRSTRLEN] = "?";
            int port = 0;
            if (a.client_address.ss_family == AF_INET) {
                struct sockaddr_in *sin = (struct sockaddr_in *)&a.client_address;
                inet_ntop(AF_INET, &sin->sin_addr, host, sizeof host);
                port = ntohs(sin->sin_port);
            } else if (a.client_address.ss_family == AF_INET6) {
                struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&a.client_address;
                inet_ntop(AF_INET6, &s6->sin6_addr, host, sizeof host);
                port = ntohs(s6->sin6_port);
            }
            snprintf(c->peer, sizeof c->peer, "%s:%d", host, port);
        }
        ucp_ep_params_t ep;
        memset(&ep, 0, sizeof ep);
        ep.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLER |
                        UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
        ep.conn_request = req;
        ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
        ep.err_handler.cb = conn_err_cb;
        ep.err_handler.arg = c;
        ucs_status_t s = ucp_ep_create(S->w, &ep, &c->ep);
        if (s != UCS_OK) {
            FT_LOG(FT_LOG_WARN, "serve: accepting %s failed: %s", c->peer, ucs_status_string(s));
            free(c);
            continue;
        }
        c->next = S->conns;
        S->conns = c;
        S->nconns++;
        S->total_conns++;
        FT_LOG(FT_LOG_INFO, "serve: conn %llu from %s", (unsigned long long)c->id, c->peer);
    }
    S->npending_conn = 0;
}

/* Close dead connections; free them once nothing refers to them. */
static void reap_conns(server *S, int force_all)
{
    for (conn **pp = &S->conns; *pp;) {
        conn *c = *pp;
        if (force_all) c->dead = 1;
        if (c->dead && !c->closed) {
            ucp_request_param_t p;
            memset(&p, 0, sizeof p);
            p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
            p.flags = UCP_EP_CLOSE_FLAG_FORCE;
            c->close_req = ucp_ep_close_nbx(c->ep, &p);
            if (UCS_PTR_IS_ERR(c->close_req)) c->close_req = NULL;
            c->closed = 1;
            S->nconns--;
        }
        if (c->closed && c->close_req &&
            ucp_request_check_status(c->close_req) != UCS_INPROGRESS) {
            ucp_request_free(c->close_req);
            c->close_req = NULL;
        }
        if (c->closed && !c->close_req && c->refs == 0) {
            *pp = c->next;
            free(c);
            continue;
        }
        pp = &c->next;
    }
}

/* ------------------------------------------------------------------ run */

void ft_node_default_params(ft_node_params *p)
{
    memset(p, 0, sizeof *p);
    p->listen = "127.0.0.1:13337";
    p->max_connections = 256;
}

static void cleanup(server *S)
{
    if (S->w) {
        reap_conns(S, 1);
        double dl = ft_now() + 3.0;
        while (S->conns && ft_now() < dl) {
            ucp_worker_progress(S->w);
            reap_conns(S, 0);
        }
    }
    if (S->listener) ucp_listener_destroy(S->listener);
    for (unsigned i = 0; i < BUCKETS; i++) {
        entry *e = S->tab[i];
        while (e) {
            entry *n = e->hnext;
            if (!e->resident) {
                char path[4200];
                spill_path(S, e, path, sizeof path);
                unlink(path);
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
    if (S->memh) ucp_mem_unmap(S->ctx, S->memh);
    if (S->pool) munmap(S->pool, S->cap);
    if (S->w) ucp_worker_destroy(S->w);
    if (S->ctx) ucp_cleanup(S->ctx);
    memset(S->token, 0, sizeof S->token);
    free(S);
}

ft_status ft_node_run(const ft_node_params *params)
{
    ft_node_params p;
    if (params) p = *params; else ft_node_default_params(&p);
    if (!p.listen) p.listen = "127.0.0.1:13337";
    if (!p.max_connections) p.max_connections = 256;
    if (p.capacity == 0) return ft_set_error(FT_ERR_INVALID_ARG, "capacity must be > 0");
    if (p.spill_dir && p.spill_capacity == 0)
        return ft_set_error(FT_ERR_INVALID_ARG, "--spill-dir needs --spill-capacity");
    server *S = calloc(1, sizeof *S);
    if (!S) return ft_set_error(FT_ERR_NOMEM, "server");
    S->p = p;
    S->efd = -1;
    ft_status st = FT_OK;
    struct sockaddr_storage addr;
    socklen_t alen;
    if ((st = ft_net_resolve(p.listen, 1, &addr, &alen)) != FT_OK) goto out;
    if (p.token_file) {
        if ((st = ft_net_read_token(p.token_file, S->token, sizeof S->token, &S->token_len)) != FT_OK)
            goto out;
        S->has_token = 1;
    }
    if (p.spill_dir) {
        int dfd = open(p.spill_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd < 0) {
            st = ft_set_error(FT_ERR_IO, "spill dir %s: %s", p.spill_dir, strerror(errno));
            goto out;
        }
        /* spill files of an earlier run that died are stale: the pool
         * they belonged to is gone */
        DIR *d = fdopendir(dfd);
        struct dirent *de;
        unsigned stale = 0;
        while (d && (de = readdir(d))) {
            unsigned long long id;
            char tail[8];
            if (sscanf(de->d_name, "ftspill-%llu.%7s", &id, tail) == 2 && !strcmp(tail, "bin") &&
                unlinkat(dfd, de->d_name, 0) == 0)
                stale++;
        }
        if (d) closedir(d); else close(dfd);
        if (stale) FT_LOG(FT_LOG_INFO, "serve: removed %u stale spill files", stale);
    }

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

    /* A restarted node must be able to bind its port again while the old
     * connections sit in TIME_WAIT (the user's environment still wins). */
    setenv("UCX_TCP_CM_REUSEADDR", "y", 0);
    setenv("UCX_RDMA_CM_REUSEADDR", "y", 0);
    ucs_status_t s = ft_net_ucp_open("flextier-serve", &S->ctx, &S->w, &S->efd);
    if (s == UCS_OK) {
        /* register the whole pool once: registration is slow */
        ucp_mem_map_params_t mp;
        memset(&mp, 0, sizeof mp);
        mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
        mp.address = S->pool;
        mp.length = S->cap;
        double t0 = ft_now();
        s = ucp_mem_map(S->ctx, &mp, &S->memh);
        FT_LOG(FT_LOG_INFO, "serve: registered %llu-byte pool in %.1f ms",
               (unsigned long long)S->cap, (ft_now() - t0) * 1e3);
    }
    if (s == UCS_OK) {
        ucp_am_handler_param_t hp;
        memset(&hp, 0, sizeof hp);
        hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                        UCP_AM_HANDLER_PARAM_FIELD_ARG;
        hp.id = FT_AM_REQUEST;
        hp.cb = on_request;
        hp.arg = S;
        s = ucp_worker_set_am_recv_handler(S->w, &hp);
    }
    if (s != UCS_OK) {
        st = ft_set_error(FT_ERR_NET, "UCX init: %s", ucs_status_string(s));
        goto out;
    }
    ucp_listener_params_t lp;
    memset(&lp, 0, sizeof lp);
    lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
    lp.sockaddr.addr = (const struct sockaddr *)&addr;
    lp.sockaddr.addrlen = alen;
    lp.conn_handler.cb = conn_req_cb;
    lp.conn_handler.arg = S;
    s = ucp_listener_create(S->w, &lp, &S->listener);
    if (s != UCS_OK) {
        S->listener = NULL;
        st = ft_set_error(FT_ERR_NET, "cannot listen on %s: %s", p.listen, ucs_status_string(s));
        goto out;
    }
    char bound[128];
    snprintf(bound, sizeof bound, "%s", p.listen);
    ucp_listener_attr_t la;
    la.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
    if (ucp_listener_query(S->listener, &la) == UCS_OK) {
        char host[INET6_ADDRSTRLEN] = "?";
        int port = 0;
        if (la.sockaddr.ss_family == AF_INET) {
            struct sockaddr_in *sin = (struct sockaddr_in *)&la.sockaddr;
            inet_ntop(AF_INET, &sin->sin_addr, host, sizeof host);
            port = ntohs(sin->sin_port);
            snprintf(bound, sizeof bound, "%s:%d", host, port);
        } else if (la.sockaddr.ss_family == AF_INET6) {
            struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&la.sockaddr;
            inet_ntop(AF_INET6, &s6->sin6_addr, host, sizeof host);
            port = ntohs(s6->sin6_port);
            snprintf(bound, sizeof bound, "[%s]:%d", host, port);
        }
    }
    FT_LOG(FT_LOG_INFO, "serve: listening on %s, pool %llu bytes%s%s", bound,
           (unsigned long long)S->cap, p.spill_dir ? ", spill to " : "",
           p.spill_dir ? p.spill_dir : "");
    if (p.on_ready) p.on_ready(p.arg, bound);

    while (!(p.stop && *p.stop)) {
        if (S->npending_conn) accept_conns(S);
        reap_conns(S, 0);
        if (ucp_worker_progress(S->w)) continue;
        if (S->npending_conn) continue;
        s = ucp_worker_arm(S->w);
        if (s == UCS_ERR_BUSY) continue;
        struct pollfd pfd = {S->efd, POLLIN, 0};
        poll(&pfd, 1, 100);
    }
    FT_LOG(FT_LOG_INFO, "serve: shutting down (%llu tensors, %llu bytes in, %llu bytes out)",
           (unsigned long long)S->tensors, (unsigned long long)S->bytes_in,
           (unsigned long long)S->bytes_out);
out:
    cleanup(S);
    return st;
}
