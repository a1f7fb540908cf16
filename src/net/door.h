/* Internal to src/net and its users: the front door of every listening
 * FlexTier process (the memory node's, the codec agent's and the
 * pipeline worker's; docs/protocol.md, "Trust model").
 *
 * One TCP socket on the --listen address, nothing else listening. Every
 * connection must pass the node's mutual HMAC challenge-response (auth.c:
 * HELLO, AUTH over the node's message header; the token never crosses the
 * wire) before its owner sees a byte of it. The door runs on its own
 * thread and handles the unauthenticated connections concurrently (up to
 * max_unauth at a time, each within auth_timeout_ms), so silent or
 * trickling peers hold no one else up:
 *
 *   - a connection reads nothing but HELLO and AUTH, each a fixed small
 *     size; anything else gets a generic error and the connection closes
 *     (one guess per connection);
 *   - when every unauthenticated slot is taken and others wait in the
 *     kernel's accept queue, the connection whose last complete message
 *     (or accept) is oldest, if at least 1 s old, is dropped: a real
 *     client sends HELLO at once and AUTH one round trip later, so a
 *     newcomer gets in behind any number of silent or trickling ones;
 *   - failures (wrong proof, protocol error, deadline, dropped) are
 *     counted per address (IPv4 /32, IPv6 /64); from the third within 5
 *     minutes an address is refused at accept for 1 s, 2, 4 ... 60 s --
 *     unless it is a loopback address or a client authenticated from it
 *     within the last hour: then the failing connection is held back
 *     that long before its answer (out of the unauthenticated slots, at
 *     most 64 held), and the address stays open, so an attacker that
 *     shares an address with real clients (127.0.0.1, a NAT) cannot lock
 *     them out;
 *   - token files are checked (ft_net_read_token: a private regular file
 *     of this user, >= 16 bytes); without a token the door listens only
 *     on loopback unless `insecure` (protected mode).
 *
 * A connection that authenticated is handed to the owner (ft_door_take)
 * with its socket non-blocking and nothing read past AUTH. The owner
 * decides at AUTH time (admit) what the AUTH reply carries after the
 * proof, or refuses (a connection limit). */
#ifndef FT_NET_DOOR_H
#define FT_NET_DOOR_H
#include "flextier/core.h"

#include <sys/socket.h>

typedef struct ft_door ft_door;

typedef struct ft_door_conn {
    int      fd;            /* non-blocking, close-on-exec, TCP_NODELAY */
    uint64_t id;
    struct sockaddr_storage sa;
    char     peer[64];      /* "ip:port" */
    uint64_t client_flags;  /* AUTH's arg (FT_CLIENT_*) */
    uint64_t aux, flags;    /* what admit put in the AUTH reply */
    uint64_t tag;           /* admit's own note for the owner */
} ft_door_conn;

/* Called on the door's thread when c proved it knows the token, before
 * the AUTH reply: *extra (cap bytes) is what follows the proof (*len),
 * *aux and *flags the reply's aux and arg (FT_NODE_TOKEN is added by the
 * door). Return FT_OK to admit, or a status with *detail (a static text)
 * to refuse (the connection is closed; it counts as no failure). */
typedef ft_status (*ft_door_admit_fn)(void *arg, ft_door_conn *c, uint8_t *extra, size_t cap,
                                      size_t *len, uint64_t *aux, uint64_t *flags,
                                      const char **detail);

typedef struct ft_door_params {
    const char      *what;            /* log prefix: "serve", "agent", "worker" */
    const char      *listen;          /* HOST:PORT (port 0: any free port) */
    const char      *token_file;      /* NULL: no token */
    int              insecure;        /* allow a non-loopback listen without a token */
    unsigned         max_unauth;      /* 0: 64 */
    int              auth_timeout_ms; /* 0: 5000 */
    size_t           max_extra;       /* admit's room after the proof (0: none) */
    int              no_backoff;      /* fuzzing: count no failures, hold nothing */
    ft_door_admit_fn admit;           /* NULL: admit everyone who authenticates */
    void            *arg;
} ft_door_params;

/* Check the configuration (listen address, token file, protected mode),
 * bind, listen and start the door's thread. FT_ERR_INVALID_ARG for a
 * configuration error, FT_ERR_NET when the address cannot be bound. */
FT_API ft_status ft_door_open(const ft_door_params *p, ft_door **out);
/* The address bound ("ip:port") and as a socket address. */
FT_API const char *ft_door_bound(const ft_door *d);
FT_API const struct sockaddr_storage *ft_door_addr(const ft_door *d);
FT_API int ft_door_has_token(const ft_door *d);
/* An eventfd that is readable while authenticated connections wait to be
 * taken. */
FT_API int ft_door_fd(const ft_door *d);
/* Take the next authenticated connection: 1 and *c filled (the caller
 * owns c->fd), 0 when none waits. */
FT_API int ft_door_take(ft_door *d, ft_door_conn *c);
/* Connections refused at accept (back-off) and failed handshakes. */
FT_API void ft_door_stats(ft_door *d, uint64_t *refused, uint64_t *failed);
/* Stop the thread, close the listening socket and every connection not
 * taken. NULL is fine. */
FT_API void ft_door_close(ft_door *d);

/* The client's side of the door, blocking on fd (non-blocking socket,
 * poll) until deadline (ft_now() seconds): HELLO, AUTH with client_flags,
 * the peer's proof checked (auth.h). What follows the proof in the AUTH
 * reply is copied to extra (up to cap bytes, *elen; NULL/0: none
 * accepted); the reply's arg and aux to *flags and *aux (may be NULL).
 * Errors name `what`. */
FT_API ft_status ft_door_client_auth(int fd, const uint8_t *token, size_t token_len,
                                     uint64_t client_flags, double deadline, const char *what,
                                     uint8_t *extra, size_t cap, size_t *elen, uint64_t *flags,
                                     uint64_t *aux);

/* All of n bytes out (out != 0) or in on a non-blocking socket by
 * deadline. FT_ERR_NET (closed), FT_ERR_TIMEOUT. */
FT_API ft_status ft_net_io_full(int fd, int out, void *buf, size_t n, double deadline,
                                const char *what);

/* Protected mode, for processes that check before they open their door:
 * FT_ERR_INVALID_ARG unless a is loopback, or a token is given, or
 * insecure. */
FT_API ft_status ft_door_check_listen(const char *what, const char *listen,
                                      const struct sockaddr_storage *a, int has_token,
                                      int insecure);
#endif
