/* Data-parallel ranks over TCP: an ft_train_comm between processes and
 * machines without MPI (flextier/train.h, ft_train_tcp_open; the frames:
 * comm_tcp.h; docs/training.md "Over TCP").
 *
 * Every pair of ranks shares one TCP connection, opened by the higher
 * rank through the lower one's front door (src/net/door.h: the memory
 * node's mutual HMAC handshake, its deadlines, cap and back-off). Sends
 * are written by the calling thread; one thread per process reads every
 * connection into per-peer queues (length-checked frames, comm_tcp.h),
 * sends a PING on connections it has written nothing to for a while, and
 * watches the peers: a peer that is silent for the timeout, whose
 * connection ends without BYE, that sends ERR or breaks the framing fails
 * the communicator; the failure goes to every other peer as ERR, so each
 * rank's next send or recv returns an error naming the rank at fault. */
#define _GNU_SOURCE
#include "flextier/train.h"
#include "train/comm_tcp.h"
#include "net/auth.h"
#include "net/door.h"
#include "net/msg.h"
#include "net/net.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define DP_MAX_RANKS 256
#define DP_RXBUF (256u << 10)

/* ---------------------------------------------------------------- frames */

void ft_dp_hdr_encode(uint8_t h[FT_DP_HDR], unsigned type, uint64_t len)
{
    ft_put_le32(h, FT_DP_MAGIC);
    ft_put_le16(h + 4, (uint16_t)type);
    ft_put_le16(h + 6, 0);
    ft_put_le64(h + 8, len);
}

ft_status ft_dp_hdr_parse(const uint8_t h[FT_DP_HDR], uint64_t max_msg, unsigned *type, uint64_t *len)
{
    uint32_t magic = ft_get_le32(h);
    unsigned t = ft_get_le16(h + 4);
    uint64_t n = ft_get_le64(h + 8);
    if (magic != FT_DP_MAGIC || ft_get_le16(h + 6))
        return ft_set_error(FT_ERR_PROTOCOL, "not a data-parallel frame (magic %08x)", (unsigned)magic);
    int ok;
    switch (t) {
    case FT_DP_HELLO: ok = n == FT_DP_HELLO_LEN; break;
    case FT_DP_DATA: ok = n <= max_msg; break;
    case FT_DP_PING:
    case FT_DP_BYE: ok = n == 0; break;
    case FT_DP_ERR: ok = n <= FT_DP_MAX_TEXT; break;
    default: return ft_set_error(FT_ERR_PROTOCOL, "a data-parallel frame of unknown type %u", t);
    }
    if (!ok)
        return ft_set_error(FT_ERR_PROTOCOL, "a data-parallel frame of type %u with %llu bytes (at most %llu)", t,
                            (unsigned long long)n, (unsigned long long)(t == FT_DP_DATA ? max_msg : FT_DP_MAX_TEXT));
    *type = t;
    *len = n;
    return FT_OK;
}

void ft_dp_hello_encode(uint8_t b[FT_DP_HELLO_LEN], const ft_dp_hello *h)
{
    ft_put_le32(b, h->version);
    ft_put_le32(b + 4, h->rank);
    ft_put_le32(b + 8, h->size);
    ft_put_le32(b + 12, 0);
    ft_put_le64(b + 16, h->job);
    ft_put_le64(b + 24, h->max_msg);
}

ft_status ft_dp_hello_parse(const uint8_t *b, size_t n, ft_dp_hello *out)
{
    if (n != FT_DP_HELLO_LEN) return ft_set_error(FT_ERR_PROTOCOL, "a data-parallel HELLO of %zu bytes", n);
    ft_dp_hello h;
    h.version = ft_get_le32(b);
    h.rank = ft_get_le32(b + 4);
    h.size = ft_get_le32(b + 8);
    h.job = ft_get_le64(b + 16);
    h.max_msg = ft_get_le64(b + 24);
    if (h.version != FT_DP_VERSION)
        return ft_set_error(FT_ERR_PROTOCOL, "data-parallel protocol version %u (this one speaks %u)", h.version,
                            FT_DP_VERSION);
    if (ft_get_le32(b + 12) || !h.size || h.size > DP_MAX_RANKS || h.rank >= h.size)
        return ft_set_error(FT_ERR_PROTOCOL, "a data-parallel HELLO with rank %u of %u", h.rank, h.size);
    *out = h;
    return FT_OK;
}

/* -------------------------------------------------------- the receiving side */

void ft_dp_rx_init(ft_dp_rx *rx, uint64_t max_msg, uint64_t max_queued)
{
    memset(rx, 0, sizeof *rx);
    rx->max_msg = max_msg;
    rx->max_queued = max_queued;
}

ft_status ft_dp_rx_feed(ft_dp_rx *rx, const uint8_t *p, size_t n)
{
    while (n) {
        if (rx->bye || rx->err)
            return ft_set_error(FT_ERR_PROTOCOL, "bytes after the end of the stream (%s)", rx->bye ? "BYE" : "ERR");
        if (!rx->type) {   /* a header */
            size_t k = FT_DP_HDR - rx->hhave < n ? FT_DP_HDR - rx->hhave : n;
            memcpy(rx->hdr + rx->hhave, p, k);
            rx->hhave += k;
            p += k;
            n -= k;
            if (rx->hhave < FT_DP_HDR) break;
            rx->hhave = 0;
            unsigned t;
            uint64_t len;
            ft_status st = ft_dp_hdr_parse(rx->hdr, rx->max_msg, &t, &len);
            if (st) return st;
            if (t == FT_DP_HELLO) return ft_set_error(FT_ERR_PROTOCOL, "a second HELLO");
            if (t == FT_DP_DATA) {
                if (len > rx->max_queued - rx->queued)
                    return ft_set_error(FT_ERR_PROTOCOL, "a message of %llu bytes beyond %llu bytes not yet taken "
                                        "(at most %llu)", (unsigned long long)len, (unsigned long long)rx->queued,
                                        (unsigned long long)rx->max_queued);
                rx->cur = malloc(sizeof *rx->cur + (size_t)len);
                if (!rx->cur) return ft_set_error(FT_ERR_NOMEM, "a message of %llu bytes", (unsigned long long)len);
                rx->cur->next = NULL;
                rx->cur->len = (size_t)len;
                rx->queued += len;   /* counted from its header on */
            }
            rx->type = t;
            rx->len = len;
            rx->have = 0;
        } else {
            size_t k = rx->len - rx->have < n ? (size_t)(rx->len - rx->have) : n;
            if (rx->type == FT_DP_DATA) memcpy(rx->cur->data + rx->have, p, k);
            else memcpy(rx->text + rx->have, p, k);   /* ERR: <= 200 bytes (checked) */
            rx->have += k;
            p += k;
            n -= k;
        }
        if (rx->type && rx->have == rx->len) {   /* a complete frame */
            switch (rx->type) {
            case FT_DP_DATA:
                if (rx->tail) rx->tail->next = rx->cur;
                else rx->head = rx->cur;
                rx->tail = rx->cur;
                rx->cur = NULL;
                break;
            case FT_DP_PING: rx->pings++; break;
            case FT_DP_BYE: rx->bye = 1; break;
            case FT_DP_ERR:
                for (size_t i = 0; i < rx->len; i++)
                    rx->why[i] = rx->text[i] >= 0x20 && rx->text[i] < 0x7f ? (char)rx->text[i] : '?';
                rx->why[rx->len] = 0;
                rx->err = 1;
                break;
            }
            rx->type = 0;
        }
    }
    return FT_OK;
}

ft_dp_msg *ft_dp_rx_pop(ft_dp_rx *rx)
{
    ft_dp_msg *m = rx->head;
    if (!m) return NULL;
    rx->head = m->next;
    if (!rx->head) rx->tail = NULL;
    rx->queued -= m->len;
    m->next = NULL;
    return m;
}

void ft_dp_rx_free(ft_dp_rx *rx)
{
    for (ft_dp_msg *m = rx->head, *n; m; m = n) {
        n = m->next;
        free(m);
    }
    free(rx->cur);
    rx->head = rx->tail = rx->cur = NULL;
    rx->queued = 0;
}

/* ------------------------------------------------------------- the ranks */

typedef struct dp_peer {
    int fd;                       /* -1: this rank, or none */
    char name[300];               /* "rank 2 (10.0.0.2:7000)" */
    pthread_mutex_t wl;           /* writing on fd */
    uint8_t pend[FT_DP_HDR];      /* a PING partly written (under wl) */
    size_t pend_len, pend_off;
    double last_tx;               /* (under wl) */
    int broken;                   /* a frame was left half-written (under wl) */
    /* under the comm's lock */
    ft_dp_rx rx;
    double last_rx;
    int eof;                      /* the stream ended (EOF, reset, or we stopped reading) */
    int wr_shut;                  /* we shut our side down */
} dp_peer;

typedef struct dp_comm {
    ft_train_comm pub;
    int rank, size;
    double timeout_s, hb_s;
    dp_peer *p;
    pthread_t io;
    int io_started, stop, wake[2];
    pthread_mutex_t lock;
    pthread_cond_t cv;
    ft_status fail;               /* the first failure (under lock; read atomically too) */
    char why[512];
    int told;                     /* the failure was sent to the peers */
    int closing;
} dp_comm;

static int failed(dp_comm *c) { return __atomic_load_n(&c->fail, __ATOMIC_ACQUIRE) != FT_OK; }

/* under c->lock: the first failure wins */
static void fail_locked(dp_comm *c, ft_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void fail_locked(dp_comm *c, ft_status st, const char *fmt, ...)
{
    if (c->fail) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->why, sizeof c->why, fmt, ap);
    va_end(ap);
    __atomic_store_n(&c->fail, st, __ATOMIC_RELEASE);
    FT_LOG(FT_LOG_INFO, "data-parallel: rank %d: %s", c->rank, c->why);
    pthread_cond_broadcast(&c->cv);
}

static ft_status fail_status(dp_comm *c)
{
    return ft_set_error(c->fail, "data-parallel: rank %d: %s", c->rank, c->why);
}

/* All of n bytes out on a non-blocking socket; gives up when the
 * communicator fails or nothing moves for the timeout. Under p->wl. */
static ft_status write_all(dp_comm *c, dp_peer *p, const void *buf, size_t n, int check_fail, double limit_s)
{
    const uint8_t *b = buf;
    double moved = ft_now();
    while (n) {
        ssize_t r = send(p->fd, b, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (r > 0) {
            b += r;
            n -= (size_t)r;
            moved = ft_now();
            continue;
        }
        if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            return ft_set_error(FT_ERR_NET, "%s: the connection closed (%s)", p->name, strerror(errno));
        if (check_fail && failed(c)) return fail_status(c);
        if (ft_now() - moved > limit_s)
            return ft_set_error(FT_ERR_TIMEOUT, "%s took no data for %.0f s (stopped, or the link is cut)", p->name,
                                limit_s);
        struct pollfd pf = {p->fd, POLLOUT, 0};
        poll(&pf, 1, 100);
    }
    return FT_OK;
}

/* Finish a partly written PING before anything else goes out (under wl). */
static ft_status flush_pend(dp_comm *c, dp_peer *p, int check_fail, double limit_s)
{
    if (p->pend_off == p->pend_len) return FT_OK;
    ft_status st = write_all(c, p, p->pend + p->pend_off, p->pend_len - p->pend_off, check_fail, limit_s);
    if (st) {
        p->broken = 1;
        return st;
    }
    p->pend_off = p->pend_len = 0;
    return FT_OK;
}

static ft_status dp_send(void *user, int to, const void *buf, size_t len)
{
    dp_comm *c = user;
    if (to < 0 || to >= c->size || to == c->rank)
        return ft_set_error(FT_ERR_INVALID_ARG, "data-parallel: send to rank %d (this is %d of %d)", to, c->rank,
                            c->size);
    dp_peer *p = &c->p[to];
    pthread_mutex_lock(&c->lock);
    ft_status st = c->fail ? fail_status(c) : FT_OK;
    if (!st && (p->rx.bye || p->eof))
        st = ft_set_error(FT_ERR_NET, "data-parallel: %s has ended the run", p->name);
    pthread_mutex_unlock(&c->lock);
    if (st) return st;
    pthread_mutex_lock(&p->wl);
    if (p->broken || p->wr_shut) st = ft_set_error(FT_ERR_NET, "data-parallel: %s: the connection is closed", p->name);
    if (!st) st = flush_pend(c, p, 1, c->timeout_s);
    if (!st) {
        uint8_t h[FT_DP_HDR];
        ft_dp_hdr_encode(h, FT_DP_DATA, len);
        st = write_all(c, p, h, sizeof h, 1, c->timeout_s);
        if (!st && len) st = write_all(c, p, buf, len, 1, c->timeout_s);
        if (st) p->broken = 1;
        p->last_tx = ft_now();
    }
    pthread_mutex_unlock(&p->wl);
    if (st && !failed(c)) {   /* this rank saw it first: tell the others */
        char why[400];
        snprintf(why, sizeof why, "%s", ft_last_error());
        pthread_mutex_lock(&c->lock);
        fail_locked(c, st, "%s", why);
        pthread_mutex_unlock(&c->lock);
        ssize_t r = write(c->wake[1], "f", 1);
        (void)r;
        return fail_status(c);
    }
    return st;
}

static ft_status dp_recv(void *user, int from, void *buf, size_t len)
{
    dp_comm *c = user;
    if (from < 0 || from >= c->size || from == c->rank)
        return ft_set_error(FT_ERR_INVALID_ARG, "data-parallel: receive from rank %d (this is %d of %d)", from,
                            c->rank, c->size);
    dp_peer *p = &c->p[from];
    ft_status st = FT_OK;
    ft_dp_msg *m = NULL;
    pthread_mutex_lock(&c->lock);
    for (;;) {
        if ((m = ft_dp_rx_pop(&p->rx))) break;
        if (c->fail) { st = fail_status(c); break; }
        if (p->rx.bye || p->eof) {
            st = ft_set_error(FT_ERR_NET, "data-parallel: %s has ended the run", p->name);
            break;
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 200000000L;
        if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
        pthread_cond_timedwait(&c->cv, &c->lock, &ts);
    }
    pthread_mutex_unlock(&c->lock);
    if (st) return st;
    if (m->len != len) {
        st = ft_set_error(FT_ERR_PROTOCOL, "data-parallel: %s sent %zu bytes where %zu were expected (another "
                          "version, or other options?)", p->name, m->len, len);
        pthread_mutex_lock(&c->lock);
        fail_locked(c, st, "%s sent %zu bytes where %zu were expected", p->name, m->len, len);
        pthread_mutex_unlock(&c->lock);
        free(m);
        return fail_status(c);
    }
    memcpy(buf, m->data, len);
    free(m);
    return FT_OK;
}

/* One frame (header + up to 200 bytes) with a short deadline: ERR and BYE
 * at the end (under wl). */
static void send_final(dp_comm *c, dp_peer *p, unsigned type, const char *text)
{
    if (p->fd < 0 || p->broken || p->wr_shut) return;
    size_t n = text ? strlen(text) : 0;
    if (n > FT_DP_MAX_TEXT) n = FT_DP_MAX_TEXT;
    uint8_t f[FT_DP_HDR + FT_DP_MAX_TEXT];
    ft_dp_hdr_encode(f, type, n);
    if (n) memcpy(f + FT_DP_HDR, text, n);
    double lim = c->timeout_s < 2.0 ? c->timeout_s : 2.0;
    if (flush_pend(c, p, 0, lim) == FT_OK) (void)write_all(c, p, f, FT_DP_HDR + n, 0, lim);
    shutdown(p->fd, SHUT_WR);
    p->wr_shut = 1;
}

/* The failure to every peer that can still hear it (ERR, then our side
 * closed). Not under c->lock. */
static void tell_peers(dp_comm *c)
{
    char text[600];   /* (send_final keeps the first 200 bytes) */
    pthread_mutex_lock(&c->lock);
    int todo = c->fail && !c->told;
    c->told |= todo;
    snprintf(text, sizeof text, "rank %d: %s", c->rank, c->why);
    pthread_mutex_unlock(&c->lock);
    if (!todo) return;
    for (int r = 0; r < c->size; r++) {
        if (r == c->rank) continue;
        pthread_mutex_lock(&c->p[r].wl);
        send_final(c, &c->p[r], FT_DP_ERR, text);
        pthread_mutex_unlock(&c->p[r].wl);
    }
}

/* Read what fd has (up to a bound per turn, so that one fast peer does not
 * starve the others); feed the peer's machine. */
static void read_peer(dp_comm *c, int r, uint8_t *buf)
{
    dp_peer *p = &c->p[r];
    for (size_t total = 0; total < (8u << 20);) {
        ssize_t n = recv(p->fd, buf, DP_RXBUF, MSG_DONTWAIT);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
        pthread_mutex_lock(&c->lock);
        if (n <= 0) {
            p->eof = 1;
            if (!p->rx.bye && !p->rx.err && !c->closing)
                fail_locked(c, FT_ERR_NET, "%s: the connection closed before the run ended (%s: the process was "
                            "killed or failed, see its output)", p->name, n == 0 ? "end of stream" : strerror(errno));
            pthread_cond_broadcast(&c->cv);
            pthread_mutex_unlock(&c->lock);
            return;
        }
        total += (size_t)n;
        p->last_rx = ft_now();
        int was_bye = p->rx.bye;
        ft_status st = ft_dp_rx_feed(&p->rx, buf, (size_t)n);
        if (st) {
            char why[300];
            snprintf(why, sizeof why, "%s", ft_last_error());
            p->eof = 1;   /* read no more of it */
            fail_locked(c, st, "%s: %s", p->name, why);
        } else if (p->rx.err) {
            fail_locked(c, FT_ERR_NET, "%s failed: %s", p->name, p->rx.why);
        }
        int bye = p->rx.bye && !was_bye;
        pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&c->lock);
        if (st) return;
        if (bye) {   /* the peer needs nothing more from us: our side ends too (its close waits for it) */
            pthread_mutex_lock(&p->wl);
            if (!p->wr_shut && p->fd >= 0) {
                (void)flush_pend(c, p, 0, c->timeout_s < 2.0 ? c->timeout_s : 2.0);
                shutdown(p->fd, SHUT_WR);
                p->wr_shut = 1;
            }
            pthread_mutex_unlock(&p->wl);
        }
    }
}

static void ping_peer(dp_comm *c, dp_peer *p, double now)
{
    if (pthread_mutex_trylock(&p->wl)) return;   /* a send is under way: its bytes say enough */
    if (!p->broken && !p->wr_shut) {
        if (p->pend_off == p->pend_len && now - p->last_tx >= c->hb_s) {
            ft_dp_hdr_encode(p->pend, FT_DP_PING, 0);
            p->pend_len = FT_DP_HDR;
            p->pend_off = 0;
            p->last_tx = now;
        }
        while (p->pend_off < p->pend_len) {
            ssize_t r = send(p->fd, p->pend + p->pend_off, p->pend_len - p->pend_off, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (r <= 0) break;   /* full (the next turn tries again) or closed (the reader sees it) */
            p->pend_off += (size_t)r;
        }
        if (p->pend_off == p->pend_len) p->pend_off = p->pend_len = 0;
    }
    pthread_mutex_unlock(&p->wl);
}

static void *io_main(void *arg)
{
    dp_comm *c = arg;
    uint8_t *buf = malloc(DP_RXBUF);
    struct pollfd *pf = calloc((size_t)c->size + 1, sizeof *pf);
    int *who = calloc((size_t)c->size + 1, sizeof *who);
    if (!buf || !pf || !who) {
        pthread_mutex_lock(&c->lock);
        fail_locked(c, FT_ERR_NOMEM, "no memory for the reader");
        pthread_mutex_unlock(&c->lock);
        free(buf);
        free(pf);
        free(who);
        return NULL;
    }
    while (!__atomic_load_n(&c->stop, __ATOMIC_ACQUIRE)) {
        int n = 0;
        pf[n].fd = c->wake[0];
        pf[n].events = POLLIN;
        who[n++] = -1;
        pthread_mutex_lock(&c->lock);
        for (int r = 0; r < c->size; r++)
            if (r != c->rank && c->p[r].fd >= 0 && !c->p[r].eof) {
                pf[n].fd = c->p[r].fd;
                pf[n].events = POLLIN;
                who[n++] = r;
            }
        pthread_mutex_unlock(&c->lock);
        int ms = (int)(c->hb_s * 1000 / 2);
        if (poll(pf, (nfds_t)n, ms < 10 ? 10 : ms) < 0 && errno != EINTR) break;
        if (pf[0].revents & POLLIN) {
            char d[64];
            while (read(c->wake[0], d, sizeof d) > 0) {}
        }
        for (int i = 1; i < n; i++)
            if (pf[i].revents) read_peer(c, who[i], buf);
        double now = ft_now();
        pthread_mutex_lock(&c->lock);
        for (int r = 0; r < c->size; r++) {
            dp_peer *p = &c->p[r];
            if (r == c->rank || p->fd < 0 || p->eof || p->rx.bye || c->closing) continue;
            if (now - p->last_rx > c->timeout_s)
                fail_locked(c, FT_ERR_TIMEOUT, "%s sent nothing for %.0f s (stopped, or the link is cut)", p->name,
                            c->timeout_s);
        }
        int tell = c->fail && !c->told;
        pthread_mutex_unlock(&c->lock);
        if (tell) tell_peers(c);
        else
            for (int r = 0; r < c->size; r++)
                if (r != c->rank && c->p[r].fd >= 0) ping_peer(c, &c->p[r], now);
    }
    free(buf);
    free(pf);
    free(who);
    return NULL;
}

/* ------------------------------------------------------------- startup */

static ft_status read_frame(int fd, unsigned want, uint8_t *body, size_t cap, size_t *n, double dl, const char *who)
{
    uint8_t h[FT_DP_HDR];
    unsigned t;
    uint64_t len;
    ft_status st = ft_net_io_full(fd, 0, h, sizeof h, dl, who);
    if (!st) st = ft_dp_hdr_parse(h, cap, &t, &len);
    if (!st && t != want && t != FT_DP_ERR)
        st = ft_set_error(FT_ERR_PROTOCOL, "%s: a frame of type %u where %u was expected", who, t, want);
    if (!st && len > cap) st = ft_set_error(FT_ERR_PROTOCOL, "%s: a frame of %llu bytes", who, (unsigned long long)len);
    if (!st && len) st = ft_net_io_full(fd, 0, body, (size_t)len, dl, who);
    if (st) return ft_set_error(st, "%s", ft_last_error());
    if (t == FT_DP_ERR) {
        char text[FT_DP_MAX_TEXT + 1];
        for (size_t i = 0; i < len; i++) text[i] = body[i] >= 0x20 && body[i] < 0x7f ? (char)body[i] : '?';
        text[len] = 0;
        return ft_set_error(FT_ERR_INVALID_ARG, "%s refused this rank: %s", who, text);
    }
    *n = (size_t)len;
    return FT_OK;
}

static ft_status send_frame(int fd, unsigned type, const void *body, size_t n, double dl, const char *who)
{
    uint8_t f[FT_DP_HDR + FT_DP_HELLO_LEN + FT_DP_MAX_TEXT];
    if (n > sizeof f - FT_DP_HDR) n = sizeof f - FT_DP_HDR;
    ft_dp_hdr_encode(f, type, n);
    if (n) memcpy(f + FT_DP_HDR, body, n);
    return ft_net_io_full(fd, 1, f, FT_DP_HDR + n, dl, who);
}

/* A peer's HELLO against ours: the text of what differs, or NULL. */
static const char *hello_differs(const ft_dp_hello *mine, const ft_dp_hello *h, char *why, size_t n)
{
    if (h->size != mine->size)
        snprintf(why, n, "rank %u was started with %u ranks, rank %u with %u", h->rank, h->size, mine->rank,
                 mine->size);
    else if (h->job != mine->job || h->max_msg != mine->max_msg)
        snprintf(why, n, "rank %u runs another job than rank %u (other options or data: start every rank with the "
                 "same options and data)", h->rank, mine->rank);
    else
        return NULL;
    return why;
}

static void peer_name(dp_comm *c, int r, const char *addr)
{
    snprintf(c->p[r].name, sizeof c->p[r].name, "rank %d (%s)", r, addr);
}

/* The connections to the ranks below this one: connect (retrying while
 * the peer is not listening yet), the door's handshake, HELLO both ways. */
static ft_status join_lower(dp_comm *c, const ft_train_tcp_params *pp, const uint8_t *tok, size_t tlen,
                            const ft_dp_hello *mine, double dl)
{
    uint8_t hb[FT_DP_HELLO_LEN + FT_DP_MAX_TEXT];
    for (int j = 0; j < c->rank; j++) {
        dp_peer *p = &c->p[j];
        struct sockaddr_storage sa;
        socklen_t sl;
        ft_status st = ft_net_resolve(pp->peers[j], 0, &sa, &sl);
        if (st) return ft_set_error(st, "data-parallel: %s: %s", p->name, ft_last_error());
        for (;;) {
            int left = (int)((dl - ft_now()) * 1000);
            if (left <= 0)
                return ft_set_error(FT_ERR_TIMEOUT, "data-parallel: %s did not answer within %.0f s (not started, "
                                    "or another address?)", p->name, c->timeout_s);
            st = ft_net_tcp_connect(&sa, sl, left < 2000 ? left : 2000, p->name, &p->fd);
            if (!st) break;
            struct timespec ts = {0, 100000000L};
            nanosleep(&ts, NULL);
        }
        st = ft_door_client_auth(p->fd, tok, tlen, 0, dl, p->name, NULL, 0, NULL, NULL, NULL);
        if (st) return ft_set_error(st, "data-parallel: %s", ft_last_error());
        uint8_t b[FT_DP_HELLO_LEN];
        ft_dp_hello_encode(b, mine);
        size_t n = 0;
        ft_dp_hello h;
        if ((st = send_frame(p->fd, FT_DP_HELLO, b, sizeof b, dl, p->name)) ||
            (st = read_frame(p->fd, FT_DP_HELLO, hb, sizeof hb, &n, dl, p->name)) ||
            (st = ft_dp_hello_parse(hb, n, &h)))
            return ft_set_error(st, "data-parallel: %s", ft_last_error());
        char why[300];
        if (h.rank != (uint32_t)j)
            return ft_set_error(FT_ERR_INVALID_ARG, "data-parallel: %s says it is rank %u (two ranks given the same "
                                "address?)", p->name, h.rank);
        if (hello_differs(mine, &h, why, sizeof why)) return ft_set_error(FT_ERR_INVALID_ARG, "data-parallel: %s", why);
    }
    return FT_OK;
}

/* The connections from the ranks above this one, through the door. */
static ft_status join_upper(dp_comm *c, ft_door *door, const ft_dp_hello *mine, double dl)
{
    uint8_t hb[FT_DP_HELLO_LEN + FT_DP_MAX_TEXT];
    int need = c->size - 1 - c->rank;
    while (need > 0) {
        ft_door_conn dc;
        if (!ft_door_take(door, &dc)) {
            int left = (int)((dl - ft_now()) * 1000);
            if (left <= 0) {
                char miss[200] = "";
                size_t o = 0;
                for (int r = c->rank + 1; r < c->size && o < sizeof miss - 8; r++)
                    if (c->p[r].fd < 0) o += (size_t)snprintf(miss + o, sizeof miss - o, "%s%d", o ? ", " : "", r);
                return ft_set_error(FT_ERR_TIMEOUT, "data-parallel: rank %s did not join within %.0f s (not started, "
                                    "another token, or another address?)", miss, c->timeout_s);
            }
            struct pollfd pf = {ft_door_fd(door), POLLIN, 0};
            poll(&pf, 1, left < 200 ? left : 200);
            continue;
        }
        char who[300];
        snprintf(who, sizeof who, "a rank from %s", dc.peer);
        size_t n = 0;
        ft_dp_hello h;
        ft_status st = read_frame(dc.fd, FT_DP_HELLO, hb, sizeof hb, &n, ft_now() + 10 < dl ? ft_now() + 10 : dl, who);
        if (!st) st = ft_dp_hello_parse(hb, n, &h);
        if (st) {   /* not one of ours after all: it does not count */
            FT_LOG(FT_LOG_WARN, "data-parallel: rank %d: %s", c->rank, ft_last_error());
            close(dc.fd);
            continue;
        }
        char why[300];
        const char *bad = hello_differs(mine, &h, why, sizeof why);
        if (!bad && (h.rank <= (uint32_t)c->rank || c->p[h.rank].fd >= 0)) {
            snprintf(why, sizeof why, "%s says it is rank %u, which %s", dc.peer, h.rank,
                     h.rank <= (uint32_t)c->rank ? "does not connect to this rank (a lower one)" : "already joined");
            bad = why;
        }
        if (bad) {
            send_frame(dc.fd, FT_DP_ERR, bad, strlen(bad), ft_now() + 2, who);
            close(dc.fd);
            return ft_set_error(FT_ERR_INVALID_ARG, "data-parallel: %s", bad);
        }
        uint8_t b[FT_DP_HELLO_LEN];
        ft_dp_hello_encode(b, mine);
        if ((st = send_frame(dc.fd, FT_DP_HELLO, b, sizeof b, dl, who))) {
            close(dc.fd);
            return ft_set_error(st, "data-parallel: %s", ft_last_error());
        }
        c->p[h.rank].fd = dc.fd;
        need--;
    }
    return FT_OK;
}

static void comm_free(dp_comm *c)
{
    if (!c) return;
    if (c->io_started) {
        __atomic_store_n(&c->stop, 1, __ATOMIC_RELEASE);
        ssize_t r = write(c->wake[1], "x", 1);
        (void)r;
        pthread_join(c->io, NULL);
    }
    for (int r = 0; c->p && r < c->size; r++) {
        if (c->p[r].fd >= 0) close(c->p[r].fd);
        ft_dp_rx_free(&c->p[r].rx);
        pthread_mutex_destroy(&c->p[r].wl);
    }
    free(c->p);
    if (c->wake[0] >= 0) close(c->wake[0]);
    if (c->wake[1] >= 0) close(c->wake[1]);
    pthread_mutex_destroy(&c->lock);
    pthread_cond_destroy(&c->cv);
    free(c);
}

ft_status ft_train_tcp_open(const ft_train_tcp_params *pp, ft_train_comm **out)
{
    if (!pp || !out || !pp->peers || pp->size < 1 || pp->size > DP_MAX_RANKS || pp->rank < 0 || pp->rank >= pp->size)
        return ft_set_error(FT_ERR_INVALID_ARG, "data-parallel: rank %d of %d (1..%d ranks)", pp ? pp->rank : -1,
                            pp ? pp->size : 0, DP_MAX_RANKS);
    *out = NULL;
    dp_comm *c = calloc(1, sizeof *c);
    if (!c) return FT_ERR_NOMEM;
    c->wake[0] = c->wake[1] = -1;
    pthread_mutex_init(&c->lock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_cond_init(&c->cv, &ca);
    pthread_condattr_destroy(&ca);
    c->rank = pp->rank;
    c->size = pp->size;
    c->timeout_s = (pp->timeout_ms > 0 ? pp->timeout_ms : 60000) / 1000.0;
    c->hb_s = c->timeout_s / 4 < 1.0 ? c->timeout_s / 4 : 1.0;
    uint64_t max_msg = pp->max_msg ? pp->max_msg : (1ull << 30);
    uint8_t tok[FT_TOKEN_MAX];
    size_t tlen = 0;
    ft_door *door = NULL;
    ft_status st = FT_OK;
    if (!(c->p = calloc((size_t)c->size, sizeof *c->p))) { st = FT_ERR_NOMEM; goto fail; }
    for (int r = 0; r < c->size; r++) {
        c->p[r].fd = -1;
        pthread_mutex_init(&c->p[r].wl, NULL);
        /* what a peer may have sent and we not taken yet: a message beyond
         * the one being read is a protocol error (ft_trainer_step_dp has at
         * most a header and a gradient in flight per pair) */
        ft_dp_rx_init(&c->p[r].rx, max_msg, 2 * max_msg + 4096);
    }
    if (pipe2(c->wake, O_CLOEXEC | O_NONBLOCK)) { st = ft_set_error(FT_ERR_IO, "data-parallel: pipe"); goto fail; }
    /* the addresses: well formed, a port, distinct; loopback unless a token or insecure */
    if (pp->token_file && (st = ft_net_read_token(pp->token_file, FT_TOKEN_MIN, tok, sizeof tok, &tlen)))
        goto fail;
    for (int r = 0; r < c->size; r++) {
        struct sockaddr_storage sa;
        socklen_t sl;
        const char *a = pp->peers[r];
        if (!a || (st = ft_net_resolve(a, r == c->rank, &sa, &sl))) {
            st = ft_set_error(FT_ERR_INVALID_ARG, "data-parallel: rank %d's address %s: %s", r, a ? a : "(none)",
                              a ? ft_last_error() : "missing");
            goto fail;
        }
        if ((sa.ss_family == AF_INET ? ((struct sockaddr_in *)&sa)->sin_port
                                     : ((struct sockaddr_in6 *)&sa)->sin6_port) == 0) {
            st = ft_set_error(FT_ERR_INVALID_ARG, "data-parallel: rank %d's address %s: port 0 (the others must know "
                              "the port)", r, a);
            goto fail;
        }
        for (int q = 0; q < r; q++)
            if (!strcmp(pp->peers[q], a)) {
                st = ft_set_error(FT_ERR_INVALID_ARG, "data-parallel: ranks %d and %d have the same address %s", q, r, a);
                goto fail;
            }
        if (!tlen && !pp->insecure && !ft_net_is_loopback(&sa)) {
            st = ft_set_error(FT_ERR_INVALID_ARG, "data-parallel: rank %d's address %s is not a loopback address: "
                              "without a token anyone who reaches it could join the run (a token file, or insecure)",
                              r, a);
            goto fail;
        }
        peer_name(c, r, a);
    }
    ft_dp_hello mine = {FT_DP_VERSION, (uint32_t)c->rank, (uint32_t)c->size, pp->job, max_msg};
    double dl = ft_now() + c->timeout_s;
    if (c->size > 1) {
        if (c->rank < c->size - 1) {   /* only ranks with ranks above them listen */
            ft_door_params dp;
            memset(&dp, 0, sizeof dp);
            dp.what = "data-parallel";
            dp.listen = pp->peers[c->rank];
            dp.token_file = pp->token_file;
            dp.insecure = pp->insecure;
            if ((st = ft_door_open(&dp, &door))) goto fail;
        }
        if ((st = join_lower(c, pp, tlen ? tok : NULL, tlen, &mine, dl))) goto fail;
        if (door && (st = join_upper(c, door, &mine, dl))) goto fail;
    }
    ft_door_close(door);   /* nothing listens any more */
    door = NULL;
    double now = ft_now();
    for (int r = 0; r < c->size; r++) c->p[r].last_rx = c->p[r].last_tx = now;
    if (c->size > 1) {
        if (pthread_create(&c->io, NULL, io_main, c)) {
            st = ft_set_error(FT_ERR_INTERNAL, "data-parallel: cannot start the reader thread");
            goto fail;
        }
        c->io_started = 1;
    }
    memset(tok, 0, sizeof tok);
    c->pub.rank = c->rank;
    c->pub.size = c->size;
    c->pub.user = c;
    c->pub.send = dp_send;
    c->pub.recv = dp_recv;
    *out = &c->pub;
    return FT_OK;
fail:
    memset(tok, 0, sizeof tok);
    {
        char why[512];
        snprintf(why, sizeof why, "%s", ft_last_error());
        ft_door_close(door);
        /* the ranks already joined learn why this one stops */
        for (int r = 0; c->p && r < c->size; r++)
            if (c->p[r].fd >= 0) send_frame(c->p[r].fd, FT_DP_ERR, why, strlen(why), ft_now() + 1, c->p[r].name);
        comm_free(c);
        return ft_set_error(st, "%s", why);
    }
}

void ft_train_tcp_close(ft_train_comm *pub, ft_status why)
{
    if (!pub) return;
    dp_comm *c = (dp_comm *)pub;
    if (c->io_started) {
        if (why != FT_OK) {
            char text[400];
            snprintf(text, sizeof text, "%s", ft_last_error());
            pthread_mutex_lock(&c->lock);
            fail_locked(c, why, "%s", text);
            pthread_mutex_unlock(&c->lock);
            tell_peers(c);
        } else if (!failed(c)) {
            /* BYE to each, then wait until every peer has ended its side
             * (it does so on reading our BYE, after what we sent before it):
             * closing with unread bytes would reset the connection and could
             * lose our last message on its way */
            pthread_mutex_lock(&c->lock);
            c->closing = 1;
            pthread_mutex_unlock(&c->lock);
            for (int r = 0; r < c->size; r++) {
                if (r == c->rank) continue;
                pthread_mutex_lock(&c->p[r].wl);
                send_final(c, &c->p[r], FT_DP_BYE, NULL);
                pthread_mutex_unlock(&c->p[r].wl);
            }
            double dl = ft_now() + 5.0;
            pthread_mutex_lock(&c->lock);
            for (;;) {
                int open = 0;
                for (int r = 0; r < c->size; r++) open += r != c->rank && c->p[r].fd >= 0 && !c->p[r].eof;
                if (!open || ft_now() > dl) break;
                struct timespec ts;
                clock_gettime(CLOCK_REALTIME, &ts);
                ts.tv_nsec += 50000000L;
                if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
                pthread_cond_timedwait(&c->cv, &c->lock, &ts);
            }
            pthread_mutex_unlock(&c->lock);
        }
    }
    comm_free(c);
}
