/* Test helper: a raw protocol-2 client over a plain TCP socket, for
 * talking to a memory node the way an attacker (or a buggy client) would:
 * any header, any payload, from any local source address, at any pace. */
#ifndef FT_TEST_RAW_CLIENT_H
#define FT_TEST_RAW_CLIENT_H
#include "net/auth.h"
#include "net/msg.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* Connect to 127.0.0.1:port from src_ip (NULL: any); -1 on failure. */
static inline int raw_connect(int port, const char *src_ip)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    if (src_ip) {
        struct sockaddr_in s = {.sin_family = AF_INET};
        inet_pton(AF_INET, src_ip, &s.sin_addr);
        if (bind(fd, (struct sockaddr *)&s, sizeof s) != 0) { close(fd); return -1; }
    }
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(0x7f000001);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) { close(fd); return -1; }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

static inline int raw_write(int fd, const void *buf, size_t n)
{
    const uint8_t *b = buf;
    while (n) {
        ssize_t w = send(fd, b, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        b += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Read exactly n bytes within ms; 0 ok, -1 closed/error, -2 timeout. */
static inline int raw_read(int fd, void *buf, size_t n, int ms)
{
    uint8_t *b = buf;
    double dl = ft_now() + ms / 1000.0;
    while (n) {
        int left = (int)((dl - ft_now()) * 1000);
        if (left <= 0) return -2;
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, left) <= 0) continue;
        ssize_t r = recv(fd, b, n, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        b += r;
        n -= (size_t)r;
    }
    return 0;
}

/* Send one request. */
static inline int raw_send(int fd, uint16_t op, uint64_t id, const char *key, const void *data,
                           size_t dlen, uint64_t aux, uint64_t arg, uint64_t xid)
{
    uint8_t h[FT_MSG_MAX_HDR];
    ft_msg m;
    memset(&m, 0, sizeof m);
    m.opcode = op;
    m.req_id = id;
    m.key = key;
    m.key_len = key ? (uint32_t)strlen(key) : 0;
    m.data_len = dlen;
    m.aux = aux;
    m.arg = arg;
    m.xid = xid;
    size_t n = ft_msg_encode(h, &m);
    if (raw_write(fd, h, n)) return -1;
    return dlen ? raw_write(fd, data, dlen) : 0;
}

/* Receive one reply: header into *m, payload (<= cap, else dropped) into
 * buf. 0 ok, -1 closed, -2 timeout, -3 malformed. */
static inline int raw_recv(int fd, ft_msg *m, uint8_t *buf, size_t cap, int ms)
{
    uint8_t h[FT_MSG_HDR_SIZE];
    int r = raw_read(fd, h, sizeof h, ms);
    if (r) return r;
    if (ft_msg_parse(h, sizeof h, 1, UINT64_MAX, m) != FT_OK) return -3;
    uint64_t left = m->data_len;
    while (left) {
        uint8_t sink[4096];
        size_t n = left > sizeof sink ? sizeof sink : (size_t)left;
        uint8_t *dst = (buf && m->data_len <= cap) ? buf + (m->data_len - left) : sink;
        if ((r = raw_read(fd, dst, n, ms))) return r;
        left -= n;
    }
    return 0;
}

/* 1 when the node closed the connection within ms (EOF/reset). */
static inline int raw_closed(int fd, int ms)
{
    uint8_t b[4096];
    double dl = ft_now() + ms / 1000.0;
    while (ft_now() < dl) {
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 50) <= 0) continue;
        ssize_t r = recv(fd, b, sizeof b, MSG_DONTWAIT);
        if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) return 1;
    }
    return 0;
}

/* The whole handshake (token NULL: none). Returns the AUTH reply status
 * (FT_OK: authenticated; *session set), or FT_ERR_NET if the connection
 * broke. proof_override: send these 32 bytes instead of the real proof. */
static inline ft_status raw_handshake(int fd, const char *token, const uint8_t *proof_override,
                                      uint64_t *session)
{
    uint8_t nc[FT_MSG_NONCE], buf[FT_MSG_PROOF + FT_MSG_MAX_ADDR];
    for (unsigned i = 0; i < sizeof nc; i++) nc[i] = (uint8_t)(i * 7 + 1);
    ft_msg m;
    if (raw_send(fd, FT_OP_HELLO, 1, NULL, nc, sizeof nc, 0, 0, 0)) return FT_ERR_NET;
    if (raw_recv(fd, &m, buf, sizeof buf, 5000)) return FT_ERR_NET;
    if (m.status != FT_OK) return (ft_status)m.status;
    uint8_t ns[FT_MSG_NONCE], proof[FT_MSG_PROOF];
    memcpy(ns, buf, sizeof ns);
    size_t plen = 0;
    if (proof_override) {
        memcpy(proof, proof_override, sizeof proof);
        plen = sizeof proof;
    } else if (token) {
        ft_auth_proof((const uint8_t *)token, strlen(token), 0, nc, ns, proof);
        plen = sizeof proof;
    }
    if (raw_send(fd, FT_OP_AUTH, 2, NULL, proof, plen, 0, 0, 0)) return FT_ERR_NET;
    if (raw_recv(fd, &m, buf, sizeof buf, 5000)) return FT_ERR_NET;
    if (m.status == FT_OK && session) *session = m.aux;
    return (ft_status)m.status;
}
#endif
