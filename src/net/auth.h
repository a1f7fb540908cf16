/* Internal to src/net: the memory node's authentication (docs/protocol.md,
 * "Handshake").
 *
 * Mutual challenge-response over a shared token, with HMAC-SHA256 from
 * libcrypto (OpenSSL): the client sends a fresh nonce Nc (HELLO), the node
 * answers with a fresh nonce Ns; the client proves it knows the token with
 * HMAC(token, "FTv2 client" || Nc || Ns) (AUTH); only then does the node
 * prove it too, HMAC(token, "FTv2 server" || Nc || Ns), and the client
 * checks it. The token never crosses the wire, a recorded exchange cannot
 * be replayed (both nonces are fresh), and nobody learns a proof for
 * nonces of their choosing without knowing the token.
 *
 * The handshake is kept apart from the sockets as two small state
 * machines over parsed messages, so that the node's pre-authentication
 * path can be fuzzed whole (fuzz/fuzz_hello.c). */
#ifndef FT_NET_AUTH_H
#define FT_NET_AUTH_H
#include "msg.h"

#define FT_TOKEN_MIN  16u     /* bytes a node's token must have at least */
#define FT_TOKEN_MAX  4096u

/* Read a token file: a regular file owned by this user (or root) that
 * neither group nor others may access (like ssh's private keys);
 * trailing newlines and spaces dropped; min_len..FT_TOKEN_MAX bytes. */
FT_API ft_status ft_net_read_token(const char *path, size_t min_len, uint8_t *buf, size_t cap,
                            size_t *len);

/* n bytes from the system's CSPRNG (OpenSSL RAND_bytes). */
ft_status ft_net_random(void *buf, size_t n);

/* HMAC-SHA256(token, label || nc || ns); server selects the label. */
void ft_auth_proof(const uint8_t *token, size_t token_len, int server,
                   const uint8_t nc[FT_MSG_NONCE], const uint8_t ns[FT_MSG_NONCE],
                   uint8_t out[FT_MSG_PROOF]);

/* ------------------------------------------------------------ node side */

typedef enum { FT_HS_HELLO, FT_HS_AUTH, FT_HS_DONE, FT_HS_FAILED } ft_hs_state;

typedef struct ft_hs_server {
    ft_hs_state    state;
    const uint8_t *token;        /* NULL: the node runs without a token */
    size_t         token_len;
    uint8_t        nc[FT_MSG_NONCE], ns[FT_MSG_NONCE];
    int            fixed_ns;     /* tests/fuzzing: ns given, not drawn */
    uint64_t       client_flags; /* AUTH's arg */
} ft_hs_server;

/* What to answer. status != FT_OK: send, then close the connection (and
 * count a failure against the peer's address). detail is a fixed, generic
 * text: nothing about the node is revealed before authentication. */
typedef struct ft_hs_reply {
    ft_status   status;
    uint64_t    arg;                      /* flags */
    uint8_t     payload[FT_MSG_PROOF];    /* nonce (HELLO) or proof (AUTH) */
    size_t      len;
    const char *detail;
} ft_hs_reply;

/* ns: NULL to draw the node's nonce at HELLO (normal use). */
FT_API void ft_hs_server_init(ft_hs_server *hs, const uint8_t *token, size_t token_len,
                       const uint8_t *ns);
/* Process one request of an unauthenticated connection (already parsed
 * with ft_msg_parse; payload holds its m->data_len bytes). Any opcode but
 * the next expected step fails the handshake. Returns r->status. */
FT_API ft_status ft_hs_server_step(ft_hs_server *hs, const ft_msg *m, const uint8_t *payload,
                            ft_hs_reply *r);

/* ---------------------------------------------------------- client side */

typedef struct ft_hs_client {
    const uint8_t *token;        /* NULL: the client has no token */
    size_t         token_len;
    uint8_t        nc[FT_MSG_NONCE], ns[FT_MSG_NONCE];
    uint64_t       node_flags;
} ft_hs_client;

/* Start: draws Nc (HELLO's payload is hs->nc). */
FT_API ft_status ft_hs_client_init(ft_hs_client *hs, const uint8_t *token, size_t token_len);
/* The HELLO reply (header already parsed): the client's proof to send in
 * AUTH (*plen = 0 without a token). FT_ERR_AUTH with a clear detail when
 * the two sides disagree about having a token (mutual authentication: a
 * client with a token refuses a node that cannot prove it). */
FT_API ft_status ft_hs_client_challenge(ft_hs_client *hs, const ft_msg *reply, const uint8_t *payload,
                                 uint8_t proof[FT_MSG_PROOF], size_t *plen);
/* The AUTH reply: checks the node's proof; *rest_off = where what follows
 * the proof (the node's UCX address, if any) starts in payload. */
FT_API ft_status ft_hs_client_finish(ft_hs_client *hs, const ft_msg *reply, const uint8_t *payload,
                              size_t *rest_off);
#endif
