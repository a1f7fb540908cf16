/* The front door of every listening FlexTier process (door.h). */
#define _GNU_SOURCE   /* accept4 */
#include "door.h"
#include "auth.h"
#include "msg.h"
#include "net.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#define STALL_GRACE 1.0           /* s: under pressure, a connection whose last message is
                                     this old may be dropped ... */
#define SILENT_GRACE 0.25         /* ... and one that sent nothing at all this long */
#define ADDR_SLOTS 4096u
#define FAILS_BEFORE_BACKOFF 3u
#define MAX_BACKOFF 60.0
#define FAIL_MEMORY 300.0         /* s: older failures are forgiven */
#define OK_MEMORY 3600.0          /* s: an address with a success this recent is never refused */
#define ACCEPTS_PER_TURN 256u
#define MAX_HELD 64u              /* failed connections held back at once */

typedef struct addr_slot {
    uint8_t  key[16];
    int      used;
    unsigned fails;
    double   last, backoff_until, last_ok;
} addr_slot;

typedef struct dconn {
    ft_door_conn  c;
    ft_hs_server  hs;
    double        t_accept, t_msg;    /* accepted; last complete message */
    int           msgs;               /* complete messages so far */
    uint8_t       rx[FT_MSG_MAX_HDR + FT_MSG_PROOF];   /* header, key, payload */
    size_t        rx_have, rx_need;   /* header, then header + payload */
    ft_msg        m;
    uint8_t      *tx;                 /* reply being sent */
    size_t        tx_len, tx_off;
    int           then;               /* after tx: 0 read on, 1 close, 2 hand off */
    double        hold_until;         /* > 0: a failed connection held back (back-off) */
    int           dead;               /* closed; freed by sweep (pointers to it may be in use) */
    struct dconn *next;
} dconn;

struct ft_door {
    ft_door_params  p;
    char            what[32];
    char            bound[96];
    struct sockaddr_storage addr;
    int             lfd, efd, wake[2];
    uint8_t         token[FT_TOKEN_MAX];
    size_t          token_len;
    double          auth_s;
    pthread_t       thread;
    int             started;
    int             stop;             /* atomic */
    /* door thread only */
    dconn          *conns;
    unsigned        nconns, nheld;    /* unauthenticated; held back after failing */
    addr_slot      *addrs;
    uint64_t        next_id;
    /* shared (lock) */
    pthread_mutex_t lock;
    dconn          *ready_head, *ready_tail;
    uint64_t        refused, failed;
};

/* ------------------------------------------------------ address back-off */

static void addr_key(const struct sockaddr_storage *a, uint8_t key[16])
{
    memset(key, 0, 16);
    if (a->ss_family == AF_INET) {
        key[10] = key[11] = 0xff;
        memcpy(key + 12, &((const struct sockaddr_in *)a)->sin_addr, 4);
    } else if (a->ss_family == AF_INET6) {
        const struct sockaddr_in6 *s = (const struct sockaddr_in6 *)a;
        if (IN6_IS_ADDR_V4MAPPED(&s->sin6_addr)) memcpy(key, &s->sin6_addr, 16);
        else memcpy(key, &s->sin6_addr, 8);   /* a /64: one host's range */
    }
}

static addr_slot *addr_find(ft_door *d, const struct sockaddr_storage *a, int create)
{
    uint8_t key[16];
    addr_key(a, key);
    unsigned h = (unsigned)(ft_xxh3(key, 16) % ADDR_SLOTS);
    addr_slot *victim = NULL;
    for (unsigned i = 0; i < 16; i++) {
        addr_slot *s = &d->addrs[(h + i) % ADDR_SLOTS];
        if (s->used && !memcmp(s->key, key, 16)) return s;
        double age = s->last > s->last_ok ? s->last : s->last_ok;
        double vage = victim ? (victim->last > victim->last_ok ? victim->last : victim->last_ok) : 0;
        if (!victim || !s->used || (victim->used && age < vage)) victim = s;
    }
    if (!create) return NULL;
    memset(victim, 0, sizeof *victim);
    memcpy(victim->key, key, 16);
    victim->used = 1;
    return victim;
}

/* Addresses whose clients the back-off must not lock out: loopback (every
 * local user shares it) and any address a client authenticated from
 * within the last hour (a NAT, a shared host). Their failing connections
 * are held back instead (hold_for). */
static int addr_exempt(const addr_slot *s, const struct sockaddr_storage *a, double now)
{
    return ft_net_is_loopback(a) || now - s->last_ok < OK_MEMORY;
}

/* Count a failure; the back-off (s) its connection is to be held for when
 * the address is exempt from refusal (0: none). */
static double addr_failed(ft_door *d, dconn *k, const char *why)
{
    double now = ft_now();
    if (d->p.no_backoff) return 0;
    addr_slot *s = addr_find(d, &k->c.sa, 1);
    if (now - s->last > FAIL_MEMORY) s->fails = 0;
    s->fails++;
    s->last = now;
    pthread_mutex_lock(&d->lock);
    d->failed++;
    pthread_mutex_unlock(&d->lock);
    if (s->fails < FAILS_BEFORE_BACKOFF) {
        FT_LOG(FT_LOG_WARN, "%s: conn %llu (%s): %s", d->what, (unsigned long long)k->c.id, k->c.peer,
               why);
        return 0;
    }
    unsigned e = s->fails - FAILS_BEFORE_BACKOFF;
    double b = e >= 6 ? MAX_BACKOFF : (double)(1u << e);
    if (addr_exempt(s, &k->c.sa, now)) {
        FT_LOG(FT_LOG_WARN, "%s: conn %llu (%s): %s; %u failures from this address: holding this "
               "connection back for %.0f s (clients of the address are not refused)", d->what,
               (unsigned long long)k->c.id, k->c.peer, why, s->fails, b);
        return b;
    }
    s->backoff_until = now + b;
    FT_LOG(FT_LOG_WARN, "%s: conn %llu (%s): %s; %u failures from this address, none authenticated: "
           "refusing it for %.0f s", d->what, (unsigned long long)k->c.id, k->c.peer, why, s->fails, b);
    return 0;
}

static void addr_succeeded(ft_door *d, dconn *k)
{
    addr_slot *s = addr_find(d, &k->c.sa, 1);
    /* the failures stay counted (they are forgiven after 5 quiet minutes):
     * a guesser among real clients keeps being held back */
    s->backoff_until = 0;
    s->last_ok = ft_now();
}

/* ------------------------------------------------------------ connections */

/* Close a connection; its memory is freed by sweep, at the end of the
 * door's turn (the turn may still hold a pointer to it). */
static void conn_drop(ft_door *d, dconn *k)
{
    if (k->dead) return;
    k->dead = 1;
    if (k->hold_until > 0) d->nheld--; else d->nconns--;
    if (k->c.fd >= 0) close(k->c.fd);
    k->c.fd = -1;
}

static void sweep(ft_door *d)
{
    for (dconn **pp = &d->conns; *pp;) {
        dconn *k = *pp;
        if (!k->dead) {
            pp = &k->next;
            continue;
        }
        *pp = k->next;
        free(k->tx);
        memset(&k->hs, 0, sizeof k->hs);
        free(k);
    }
}

/* Queue a reply: header (+ payload). then: what happens once it is out. */
static int conn_reply(dconn *k, uint16_t op, ft_status st, uint64_t aux, uint64_t arg,
                      const void *p1, size_t n1, const void *p2, size_t n2, int then)
{
    ft_msg m;
    memset(&m, 0, sizeof m);
    m.opcode = (uint16_t)(op | FT_OP_REPLY);
    m.req_id = k->m.req_id;
    m.status = st;
    m.data_len = n1 + n2;
    m.aux = aux;
    m.arg = arg;
    k->tx = malloc(FT_MSG_HDR_SIZE + n1 + n2);
    if (!k->tx) return -1;
    size_t h = ft_msg_encode(k->tx, &m);
    if (n1) memcpy(k->tx + h, p1, n1);
    if (n2) memcpy(k->tx + h + n1, p2, n2);
    k->tx_len = h + n1 + n2;
    k->tx_off = 0;
    k->then = then;
    return 0;
}

/* A failed handshake: answer (generic detail) and close; from an exempt
 * address over its failure threshold, only after holding the connection
 * back (it leaves the unauthenticated slots meanwhile). */
static void fail(ft_door *d, dconn *k, ft_status st, const char *detail, const char *why)
{
    double hold = addr_failed(d, k, why);
    uint16_t op = k->m.opcode ? k->m.opcode : FT_OP_HELLO;
    if (conn_reply(k, op, st, 0, 0, detail, strlen(detail), NULL, 0, 1) != 0) {
        conn_drop(d, k);
        return;
    }
    if (hold <= 0) return;
    if (d->nheld >= MAX_HELD) {   /* too many held: the oldest held goes now */
        dconn *v = NULL;
        for (dconn *q = d->conns; q; q = q->next)
            if (!q->dead && q->hold_until > 0 && (!v || q->t_accept < v->t_accept)) v = q;
        if (v) conn_drop(d, v);
    }
    d->nconns--;
    d->nheld++;
    k->hold_until = ft_now() + hold;
}

/* A whole message is in rx: step the handshake. Returns 0 if k was freed. */
static int conn_step(ft_door *d, dconn *k)
{
    k->t_msg = ft_now();
    k->msgs++;
    ft_hs_reply r;
    ft_status st = ft_hs_server_step(&k->hs, &k->m, k->rx + FT_MSG_HDR_SIZE, &r);
    k->rx_have = 0;
    k->rx_need = FT_MSG_HDR_SIZE;
    if (st != FT_OK) {
        fail(d, k, st, r.detail,
             st == FT_ERR_AUTH && k->m.opcode == FT_OP_AUTH ? "authentication failed"
                                                            : "protocol error before authenticating");
        return 1;
    }
    if (k->hs.state != FT_HS_DONE)   /* HELLO: the challenge */
        return conn_reply(k, FT_OP_HELLO, FT_OK, 0, r.arg, r.payload, r.len, NULL, 0, 0) == 0
                   ? 1 : (conn_drop(d, k), 0);
    k->c.client_flags = k->hs.client_flags;
    uint8_t *extra = d->p.max_extra ? malloc(d->p.max_extra) : NULL;
    size_t elen = 0;
    uint64_t aux = 0, flags = 0;
    const char *detail = "refused";
    st = FT_OK;
    if (d->p.max_extra && !extra) st = FT_ERR_NOMEM, detail = "out of memory";
    if (st == FT_OK && d->p.admit)
        st = d->p.admit(d->p.arg, &k->c, extra, d->p.max_extra, &elen, &aux, &flags, &detail);
    addr_succeeded(d, k);   /* it proved the token, admitted or not */
    if (st != FT_OK) {
        FT_LOG(FT_LOG_WARN, "%s: conn %llu (%s): %s", d->what, (unsigned long long)k->c.id, k->c.peer,
               detail);
        int rc = conn_reply(k, FT_OP_AUTH, st, 0, 0, detail, strlen(detail), NULL, 0, 1);
        free(extra);
        if (rc != 0) { conn_drop(d, k); return 0; }
        return 1;
    }
    if (elen > d->p.max_extra) elen = d->p.max_extra;
    k->c.aux = aux;
    k->c.flags = flags | r.arg;
    int rc = conn_reply(k, FT_OP_AUTH, FT_OK, aux, k->c.flags, r.payload, r.len, extra, elen, 2);
    free(extra);
    if (rc != 0) { conn_drop(d, k); return 0; }
    return 1;
}

static void conn_read(ft_door *d, dconn *k)
{
    while (!k->tx) {
        ssize_t r = recv(k->c.fd, k->rx + k->rx_have, k->rx_need - k->rx_have, MSG_DONTWAIT);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        if (r <= 0) {
            addr_failed(d, k, r == 0 ? "closed before authenticating" : "connection error before authenticating");
            conn_drop(d, k);
            return;
        }
        k->rx_have += (size_t)r;
        if (k->rx_have >= 4 && ft_get_le32(k->rx) != FT_MSG_MAGIC) {
            /* not FlexTier (a protocol-1 client speaks UCX sockaddr) */
            memset(&k->m, 0, sizeof k->m);
            fail(d, k, FT_ERR_PROTOCOL, "protocol error", "not a FlexTier protocol-2 peer");
            return;
        }
        if (k->rx_have < k->rx_need) continue;
        if (k->rx_need == FT_MSG_HDR_SIZE) {
            size_t hlen = 0;
            ft_status st = ft_msg_header_len(k->rx, &hlen);
            memset(&k->m, 0, sizeof k->m);
            k->m.req_id = ft_get_le64(k->rx + 8);
            if (st == FT_ERR_UNSUPPORTED) {
                fail(d, k, FT_ERR_UNSUPPORTED, "protocol version 2 required", "another protocol version");
                return;
            }
            if (st != FT_OK) {
                fail(d, k, FT_ERR_PROTOCOL, "protocol error", "malformed header before authenticating");
                return;
            }
            k->rx_need = hlen;   /* the key (<= FT_KEY_MAX), if any */
            if (hlen > k->rx_have) continue;
        }
        if (k->rx_need == k->rx_have && !k->m.opcode) {
            /* the header (+ key) is in: HELLO and AUTH have no key and at
             * most a proof; of anything else no payload is read */
            ft_status st = ft_msg_parse(k->rx, k->rx_need, 0, FT_MSG_PROOF, &k->m);
            if (st != FT_OK) {
                fail(d, k, FT_ERR_PROTOCOL, "protocol error", "malformed header before authenticating");
                return;
            }
            if (k->m.opcode != FT_OP_HELLO && k->m.opcode != FT_OP_AUTH) {
                conn_step(d, k);   /* "authentication required", closes */
                return;
            }
            if (k->m.data_len > FT_MSG_PROOF) {
                fail(d, k, FT_ERR_PROTOCOL, "protocol error", "oversized handshake message");
                return;
            }
            k->rx_need = FT_MSG_HDR_SIZE + (size_t)k->m.data_len;
            if (k->rx_need > k->rx_have) continue;
        }
        if (!conn_step(d, k)) return;
        memset(&k->m, 0, sizeof k->m);
    }
}

static void conn_write(ft_door *d, dconn *k)
{
    while (k->tx_off < k->tx_len) {
        ssize_t w = send(k->c.fd, k->tx + k->tx_off, k->tx_len - k->tx_off, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        if (w <= 0) {
            if (k->then != 1) addr_failed(d, k, "connection error before authenticating");
            conn_drop(d, k);
            return;
        }
        k->tx_off += (size_t)w;
    }
    free(k->tx);
    k->tx = NULL;
    if (k->then == 1) {
        conn_drop(d, k);
    } else if (k->then == 2) {
        /* authenticated: a copy to the owner; this one is swept */
        dconn *h = malloc(sizeof *h);
        if (!h) {
            conn_drop(d, k);
            return;
        }
        *h = *k;
        memset(&h->hs, 0, sizeof h->hs);
        h->tx = NULL;
        h->next = NULL;
        k->c.fd = -1;     /* the owner's now */
        conn_drop(d, k);
        k = h;
        /* (logged before the hand-off: the owner frees it once taken) */
        FT_LOG(FT_LOG_INFO, "%s: conn %llu (%s): authenticated%s", d->what, (unsigned long long)k->c.id,
               k->c.peer, d->token_len ? "" : " (no token)");
        /* queue and signal under the lock: ft_door_take resets the
         * eventfd under it only when the queue is empty, so no hand-off
         * is left without a signal */
        pthread_mutex_lock(&d->lock);
        if (d->ready_tail) d->ready_tail->next = k; else d->ready_head = k;
        d->ready_tail = k;
        uint64_t one = 1;
        ssize_t r = write(d->efd, &one, sizeof one);
        (void)r;
        pthread_mutex_unlock(&d->lock);
    }
}

/* Under pressure: drop the oldest connection that has had its grace. */
static int evict_oldest(ft_door *d)
{
    double now = ft_now();
    dconn *v = NULL;
    for (dconn *k = d->conns; k; k = k->next)
        if (!k->dead && k->hold_until <= 0 && !k->tx && now - k->t_msg >= (k->msgs ? STALL_GRACE : SILENT_GRACE) &&
            (!v || k->t_msg < v->t_msg))
            v = k;
    if (!v) return 0;
    (void)addr_failed(d, v, v->msgs ? "dropped: stalled in the handshake while others waited"
                                    : "dropped: silent while others waited");
    conn_drop(d, v);
    return 1;
}

static void accept_conns(ft_door *d)
{
    for (unsigned i = 0; i < ACCEPTS_PER_TURN; i++) {
        if (d->nconns >= d->p.max_unauth && !evict_oldest(d)) return;   /* stay in the backlog */
        struct sockaddr_storage sa;
        socklen_t sl = sizeof sa;
        int fd = accept4(d->lfd, (struct sockaddr *)&sa, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            if (errno == EMFILE || errno == ENFILE) FT_LOG(FT_LOG_ERROR, "%s: accept: %s", d->what, strerror(errno));
            return;
        }
        addr_slot *as = addr_find(d, &sa, 0);
        if (as && ft_now() < as->backoff_until && ft_now() - as->last_ok >= OK_MEMORY) {
            pthread_mutex_lock(&d->lock);
            d->refused++;
            pthread_mutex_unlock(&d->lock);
            close(fd);
            continue;
        }
        dconn *k = calloc(1, sizeof *k);
        if (!k) {
            close(fd);
            continue;
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
        k->c.fd = fd;
        k->c.sa = sa;
        k->c.id = ++d->next_id;
        ft_net_addr_str(&sa, k->c.peer, sizeof k->c.peer);
        k->t_accept = k->t_msg = ft_now();
        k->rx_need = FT_MSG_HDR_SIZE;
        ft_hs_server_init(&k->hs, d->token_len ? d->token : NULL, d->token_len, NULL);
        k->next = d->conns;
        d->conns = k;
        d->nconns++;
        FT_LOG(FT_LOG_DEBUG, "%s: conn %llu from %s", d->what, (unsigned long long)k->c.id, k->c.peer);
    }
}

static void check_deadlines(ft_door *d)
{
    double now = ft_now();
    for (dconn *k = d->conns, *next; k; k = next) {
        next = k->next;
        if (k->dead) continue;
        if (k->hold_until > 0) {
            if (now > k->hold_until + d->auth_s) conn_drop(d, k);   /* its answer is not taken */
            continue;
        }
        if (now - k->t_accept <= d->auth_s) continue;
        if (k->tx && k->then == 1) {   /* an error reply nobody takes */
            conn_drop(d, k);
            continue;
        }
        addr_failed(d, k, "no authentication within the deadline");
        conn_drop(d, k);
    }
}

static void *door_main(void *arg)
{
    ft_door *d = arg;
    struct pollfd *pf = calloc((size_t)d->p.max_unauth + MAX_HELD + 2, sizeof *pf);
    dconn **who = calloc((size_t)d->p.max_unauth + MAX_HELD + 2, sizeof *who);
    if (!pf || !who) {
        FT_LOG(FT_LOG_ERROR, "%s: the front door has no memory", d->what);
        free(pf);
        free(who);
        return NULL;
    }
    while (!__atomic_load_n(&d->stop, __ATOMIC_ACQUIRE)) {
        unsigned n = 0;
        pf[n].fd = d->wake[0];
        pf[n].events = POLLIN;
        who[n++] = NULL;
        pf[n].fd = d->lfd;
        pf[n].events = POLLIN;
        who[n++] = NULL;
        double now = ft_now();
        for (dconn *k = d->conns; k && n < d->p.max_unauth + MAX_HELD + 2; k = k->next) {
            if (k->dead || k->hold_until > now) continue;
            pf[n].fd = k->c.fd;
            pf[n].events = k->tx ? POLLOUT : POLLIN;
            who[n++] = k;
        }
        for (unsigned i = 0; i < n; i++) pf[i].revents = 0;
        int r = poll(pf, n, 200);
        if (r < 0 && errno != EINTR) break;
        for (unsigned i = 2; r > 0 && i < n; i++) {
            if (!pf[i].revents) continue;
            dconn *k = who[i];
            if (k->dead) continue;
            if (k->tx) conn_write(d, k);
            else conn_read(d, k);
        }
        if (r > 0 && (pf[1].revents & POLLIN)) accept_conns(d);
        check_deadlines(d);
        sweep(d);
    }
    free(pf);
    free(who);
    return NULL;
}

/* ------------------------------------------------------------------ API */

ft_status ft_net_io_full(int fd, int out, void *buf, size_t n, double dl, const char *what)
{
    uint8_t *b = buf;
    while (n) {
        ssize_t r = out ? send(fd, b, n, MSG_NOSIGNAL | MSG_DONTWAIT) : recv(fd, b, n, MSG_DONTWAIT);
        if (r > 0) {
            b += r;
            n -= (size_t)r;
            continue;
        }
        if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
            return ft_set_error(FT_ERR_NET, "%s: the connection closed (%s)", what,
                                r == 0 ? "end of stream" : strerror(errno));
        int left = (int)((dl - ft_now()) * 1000);
        if (left <= 0) return ft_set_error(FT_ERR_TIMEOUT, "%s: no progress before the deadline", what);
        struct pollfd p = {fd, (short)(out ? POLLOUT : POLLIN), 0};
        poll(&p, 1, left > 1000 ? 1000 : left);
    }
    return FT_OK;
}

/* One handshake reply: header + payload (<= cap, else a protocol error). */
static ft_status cl_recv(int fd, ft_msg *m, uint8_t *payload, size_t cap, double dl, const char *what)
{
    uint8_t h[FT_MSG_HDR_SIZE];
    ft_status st = ft_net_io_full(fd, 0, h, sizeof h, dl, what);
    size_t hl = 0;
    if (st == FT_OK && (st = ft_msg_header_len(h, &hl)) == FT_OK && hl != FT_MSG_HDR_SIZE)
        st = ft_set_error(FT_ERR_PROTOCOL, "a handshake reply with a key");
    if (st == FT_OK) st = ft_msg_parse(h, sizeof h, 1, cap, m);
    if (st == FT_OK && m->data_len > cap)
        st = ft_set_error(FT_ERR_PROTOCOL, "a handshake reply of %llu bytes", (unsigned long long)m->data_len);
    if (st == FT_OK && m->data_len) st = ft_net_io_full(fd, 0, payload, (size_t)m->data_len, dl, what);
    if (st != FT_OK) return ft_set_error(st, "%s: %s", what, ft_last_error());
    if (m->status != FT_OK) {
        char text[FT_MSG_MAX_DETAIL + 1];
        size_t k = m->data_len < FT_MSG_MAX_DETAIL ? (size_t)m->data_len : FT_MSG_MAX_DETAIL;
        for (size_t i = 0; i < k; i++) text[i] = payload[i] >= 0x20 && payload[i] < 0x7f ? (char)payload[i] : '?';
        text[k] = 0;
        return ft_set_error((ft_status)m->status, "%s: refused: %s", what, k ? text : ft_status_str((ft_status)m->status));
    }
    return FT_OK;
}

static ft_status cl_send(int fd, uint16_t op, uint64_t arg, const void *p, size_t n, double dl, const char *what)
{
    uint8_t h[FT_MSG_HDR_SIZE];
    ft_msg m;
    memset(&m, 0, sizeof m);
    m.opcode = op;
    m.req_id = op;
    m.data_len = n;
    m.arg = arg;
    ft_msg_encode(h, &m);
    ft_status st = ft_net_io_full(fd, 1, h, sizeof h, dl, what);
    if (st == FT_OK && n) st = ft_net_io_full(fd, 1, (void *)p, n, dl, what);
    return st;
}

ft_status ft_door_client_auth(int fd, const uint8_t *tok, size_t tlen, uint64_t client_flags, double dl,
                              const char *what, uint8_t *extra, size_t cap, size_t *elen, uint64_t *flags,
                              uint64_t *aux)
{
    ft_hs_client hs;
    uint8_t proof[FT_MSG_PROOF];
    size_t plen = 0, rest = 0, room = FT_MSG_PROOF + cap;
    if (room < FT_MSG_MAX_DETAIL) room = FT_MSG_MAX_DETAIL;
    uint8_t *buf = malloc(room);
    if (!buf) return ft_set_error(FT_ERR_NOMEM, "%s: handshake", what);
    ft_msg m;
    ft_status st = ft_hs_client_init(&hs, tlen ? tok : NULL, tlen);
    if (st == FT_OK) st = cl_send(fd, FT_OP_HELLO, 0, hs.nc, FT_MSG_NONCE, dl, what);
    if (st == FT_OK) st = cl_recv(fd, &m, buf, room < FT_MSG_MAX_DETAIL ? room : FT_MSG_MAX_DETAIL, dl, what);
    if (st == FT_OK && (st = ft_hs_client_challenge(&hs, &m, buf, proof, &plen)) != FT_OK)
        st = ft_set_error(st, "%s: %s", what, ft_last_error());
    if (st == FT_OK) st = cl_send(fd, FT_OP_AUTH, client_flags, proof, plen, dl, what);
    if (st == FT_OK) st = cl_recv(fd, &m, buf, room, dl, what);
    if (st == FT_OK && (st = ft_hs_client_finish(&hs, &m, buf, &rest)) != FT_OK)
        st = ft_set_error(st, "%s: %s", what, ft_last_error());
    if (st == FT_OK) {
        size_t n = (size_t)m.data_len - rest;
        if (n > cap) st = ft_set_error(FT_ERR_PROTOCOL, "%s: %zu bytes after the proof", what, n);
        else {
            if (n) memcpy(extra, buf + rest, n);
            if (elen) *elen = n;
            if (flags) *flags = m.arg;
            if (aux) *aux = m.aux;
        }
    }
    memset(&hs, 0, sizeof hs);
    memset(proof, 0, sizeof proof);
    free(buf);
    return st;
}

ft_status ft_door_check_listen(const char *what, const char *listen, const struct sockaddr_storage *a,
                               int has_token, int insecure)
{
    if (has_token || insecure || ft_net_is_loopback(a)) return FT_OK;
    return ft_set_error(FT_ERR_INVALID_ARG,
                        "%s: refusing %s without a token: anyone who can reach it could use it "
                        "(--token-file FILE, or --insecure)", what, listen);
}

ft_status ft_door_open(const ft_door_params *p, ft_door **out)
{
    *out = NULL;
    if (!p || !p->listen) return ft_set_error(FT_ERR_INVALID_ARG, "no listen address");
    ft_door *d = calloc(1, sizeof *d);
    if (!d) return ft_set_error(FT_ERR_NOMEM, "door");
    d->p = *p;
    d->lfd = d->efd = d->wake[0] = d->wake[1] = -1;
    pthread_mutex_init(&d->lock, NULL);
    snprintf(d->what, sizeof d->what, "%s", p->what ? p->what : "flextier");
    d->p.what = d->what;
    if (!d->p.max_unauth) d->p.max_unauth = 64;
    d->auth_s = (p->auth_timeout_ms > 0 ? p->auth_timeout_ms : 5000) / 1000.0;
    socklen_t alen = 0;
    ft_status st = ft_net_resolve(p->listen, 1, &d->addr, &alen);
    if (st == FT_OK && p->token_file)
        st = ft_net_read_token(p->token_file, FT_TOKEN_MIN, d->token, sizeof d->token, &d->token_len);
    if (st == FT_OK) st = ft_door_check_listen(d->what, p->listen, &d->addr, d->token_len > 0, p->insecure);
    if (st == FT_OK && !(d->addrs = calloc(ADDR_SLOTS, sizeof *d->addrs))) st = ft_set_error(FT_ERR_NOMEM, "door");
    if (st == FT_OK) {
        d->lfd = socket(d->addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (d->lfd < 0) st = ft_set_error(FT_ERR_NET, "%s: socket: %s", d->what, strerror(errno));
    }
    if (st == FT_OK) {
        int one = 1;
        setsockopt(d->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (d->addr.ss_family == AF_INET6) setsockopt(d->lfd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
        if (bind(d->lfd, (const struct sockaddr *)&d->addr, alen) != 0 || listen(d->lfd, SOMAXCONN) != 0)
            st = ft_set_error(FT_ERR_NET, "%s: cannot listen on %s: %s", d->what, p->listen, strerror(errno));
    }
    if (st == FT_OK) {
        struct sockaddr_storage b;
        socklen_t bl = sizeof b;
        if (getsockname(d->lfd, (struct sockaddr *)&b, &bl) == 0) {
            d->addr = b;
            ft_net_addr_str(&b, d->bound, sizeof d->bound);
        } else {
            snprintf(d->bound, sizeof d->bound, "%s", p->listen);
        }
        d->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        if (d->efd < 0 || pipe2(d->wake, O_CLOEXEC | O_NONBLOCK) != 0)
            st = ft_set_error(FT_ERR_IO, "%s: eventfd/pipe: %s", d->what, strerror(errno));
    }
    if (st == FT_OK) {
        if (pthread_create(&d->thread, NULL, door_main, d) != 0)
            st = ft_set_error(FT_ERR_INTERNAL, "%s: cannot start the front door's thread", d->what);
        else
            d->started = 1;
    }
    if (st != FT_OK) {
        char why[300];
        snprintf(why, sizeof why, "%s", ft_last_error());
        ft_door_close(d);
        return ft_set_error(st, "%s", why);
    }
    *out = d;
    return FT_OK;
}

const char *ft_door_bound(const ft_door *d) { return d->bound; }
const struct sockaddr_storage *ft_door_addr(const ft_door *d) { return &d->addr; }
int ft_door_has_token(const ft_door *d) { return d->token_len > 0; }
int ft_door_fd(const ft_door *d) { return d->efd; }

int ft_door_take(ft_door *d, ft_door_conn *c)
{
    pthread_mutex_lock(&d->lock);
    dconn *k = d->ready_head;
    if (k) {
        d->ready_head = k->next;
        if (!d->ready_head) d->ready_tail = NULL;
    } else {
        uint64_t v;   /* drained: the next hand-off signals again */
        ssize_t r = read(d->efd, &v, sizeof v);
        (void)r;
    }
    pthread_mutex_unlock(&d->lock);
    if (!k) return 0;
    *c = k->c;
    free(k);
    return 1;
}

void ft_door_stats(ft_door *d, uint64_t *refused, uint64_t *failed)
{
    pthread_mutex_lock(&d->lock);
    if (refused) *refused = d->refused;
    if (failed) *failed = d->failed;
    pthread_mutex_unlock(&d->lock);
}

void ft_door_close(ft_door *d)
{
    if (!d) return;
    if (d->started) {
        __atomic_store_n(&d->stop, 1, __ATOMIC_RELEASE);
        ssize_t r = write(d->wake[1], "x", 1);
        (void)r;
        pthread_join(d->thread, NULL);
    }
    for (dconn *k = d->conns; k; k = k->next) conn_drop(d, k);
    sweep(d);
    for (dconn *k = d->ready_head, *n; k; k = n) {
        n = k->next;
        close(k->c.fd);
        free(k);
    }
    if (d->lfd >= 0) close(d->lfd);
    if (d->efd >= 0) close(d->efd);
    if (d->wake[0] >= 0) close(d->wake[0]);
    if (d->wake[1] >= 0) close(d->wake[1]);
    free(d->addrs);
    memset(d->token, 0, sizeof d->token);
    pthread_mutex_destroy(&d->lock);
    free(d);
}
