/* libFuzzer target: the front door of the memory node, the codec agent
 * and the pipeline worker (src/net/door.c), whole: a real door on
 * 127.0.0.1 in this process, fed each input as the byte stream of one
 * unauthenticated connection (then end of stream), its answers read back
 * until it closes. This is the agent's and the worker's handshake as a
 * peer reaches it (the state machine inside is fuzzed alone by
 * fuzz_hello.c).
 * Input: byte 0: bit 0 whether the door has a token; the rest the stream.
 * Invariants: no crash or out-of-bounds access (ASan); the door closes
 * the connection within its deadline; every answer is a well-formed reply
 * header; with a token nobody is handed to the owner (a valid proof
 * cannot be produced without the token); at most two answers (HELLO,
 * AUTH). Back-off is off (no_backoff) so that inputs do not wait for each
 * other. */
#include "net/door.h"
#include "net/msg.h"
#include "net/net.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

static ft_door *doors[2];

static ft_door *door(int with_token)
{
    if (doors[with_token]) return doors[with_token];
    ft_door_params p;
    memset(&p, 0, sizeof p);
    p.what = "fuzz";
    p.listen = "127.0.0.1:0";
    p.auth_timeout_ms = 2000;
    p.no_backoff = 1;
    static char path[64];
    if (with_token) {
        snprintf(path, sizeof path, "/tmp/ft_fuzz_door_tokXXXXXX");
        int fd = mkstemp(path);
        if (fd < 0) abort();
        const char tok[] = "fuzz-door-token-0123456789abcdef";
        if (write(fd, tok, sizeof tok - 1) != (ssize_t)(sizeof tok - 1)) abort();
        close(fd);
        chmod(path, 0600);
        p.token_file = path;
    }
    ft_log_set_level(FT_LOG_ERROR);
    if (ft_door_open(&p, &doors[with_token]) != FT_OK) abort();
    if (with_token) unlink(path);
    return doors[with_token];
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    const int with_token = data[0] & 1;
    ft_door *d = door(with_token);
    struct sockaddr_storage a;
    socklen_t al;
    if (ft_net_resolve(ft_door_bound(d), 0, &a, &al) != FT_OK) abort();
    int fd = -1;
    if (ft_net_tcp_connect(&a, al, 2000, "fuzz", &fd) != FT_OK) return 0;
    /* the stream, then end of stream (the door may close earlier) */
    size_t off = 1;
    while (off < size) {
        ssize_t w = send(fd, data + off, size - off, MSG_NOSIGNAL);
        if (w <= 0) break;
        off += (size_t)w;
    }
    shutdown(fd, SHUT_WR);
    /* its answers until it closes */
    uint8_t buf[65536];
    size_t have = 0;
    double dl = ft_now() + 4.0;
    int closed = 0;
    ft_door_conn c;
    while (!closed && ft_now() < dl) {
        while (ft_door_take(d, &c)) {   /* the owner: closes what it is handed */
            if (with_token) abort();     /* authenticated without the token */
            close(c.fd);
        }
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 100) <= 0) continue;
        ssize_t r = recv(fd, buf + have, sizeof buf - have, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) closed = 1;
        else if ((have += (size_t)r) == sizeof buf) abort();   /* far more than two answers */
    }
    close(fd);
    if (!closed) abort();   /* the deadline (2 s) was not kept */
    int answers = 0;
    for (size_t p = 0; p + FT_MSG_HDR_SIZE <= have; answers++) {
        ft_msg m;
        if (ft_msg_parse(buf + p, FT_MSG_HDR_SIZE, 1, FT_MSG_MAX_ADDR, &m) != FT_OK) abort();
        p += FT_MSG_HDR_SIZE + (size_t)m.data_len;
    }
    if (answers > 2) abort();
    while (ft_door_take(d, &c)) {
        if (with_token) abort();   /* authenticated without the token */
        close(c.fd);
    }
    return 0;
}
