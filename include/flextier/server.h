/*
 * flextier/server.h - an OpenAI-compatible HTTP server over a session
 * (docs/server.md): POST /v1/chat/completions, POST /v1/completions,
 * GET /v1/models, GET /health, GET /metrics, streaming (server-sent
 * events) and not, on libmicrohttpd.
 *
 * One scheduler thread owns the session. It runs continuous batching:
 * every step is one ft_session_forward over the requests in their slots,
 * each at its own position: one token for each request that is decoding
 * and a chunk of the prompt for each that is being prefilled; requests
 * join at the next step and leave when done (their slot is free at once).
 * With weights streamed through the tiers, each layer fetched serves
 * every request in flight.
 *
 * Prefix cache: a slot keeps its tokens' KV cache after its request is
 * done; a new request starts in the slot whose cached tokens share the
 * longest prefix with its prompt (found through hashes of 16-token blocks
 * of the token prefix, verified token by token), or has that prefix
 * copied from a busy slot, and prefills only the rest. A second turn of a
 * conversation or a shared system prompt costs no prefill for the shared
 * part. The cache lives in the slots (device memory, or the KV tiers of
 * an offloaded cache); with prefix_store, prefixes leaving their slot
 * are kept in a store (host memory, disk, a memory node) and brought back.
 *
 * Security: loopback by default; an API key (Bearer) compared in constant
 * time, required for any other address unless `insecure`; limits on the
 * body, prompt, max_tokens, connections and the queue; idle timeouts.
 */
#ifndef FLEXTIER_SERVER_H
#define FLEXTIER_SERVER_H

#include "flextier/core.h"
#include "flextier/session.h"

#ifdef __cplusplus
extern "C" {
#endif

struct ft_chat_template;

typedef struct ft_server_params {
    const char *host;             /* address to listen on (default 127.0.0.1) */
    unsigned port;                /* 0: any free port (ft_server_port)      */
    const char *api_key;          /* NULL: no key                           */
    int insecure;                 /* 1: allow a non-loopback host without a key */
    const char *model_name;       /* /v1/models id (default: the directory's name) */
    /* the chat template (NULL: chat endpoints answer 400); borrowed */
    const struct ft_chat_template *chat_template;
    unsigned slots;               /* sequences in one batch (default 4)     */
    unsigned ctx;                 /* positions per slot: prompt + generated
                                     (default min(2048, max_position_embeddings)) */
    unsigned prefill_chunk;       /* prompt tokens per step per request (default 512) */
    unsigned step_tokens;         /* tokens per step over all requests
                                     (default slots + prefill_chunk)       */
    unsigned queue;               /* requests waiting for a slot (default 64):
                                     beyond that, 429                      */
    unsigned max_connections;     /* default 64                             */
    size_t max_body;              /* request body bytes (default 1 MiB)     */
    unsigned max_tokens;          /* largest max_tokens allowed (default ctx) */
    unsigned default_max_tokens;  /* when a request gives none (default 256,
                                     capped by the room left in the slot)  */
    unsigned max_n;               /* largest n (default: slots)             */
    unsigned timeout_s;           /* an idle connection is closed (default 60) */
    int no_prefix_cache;          /* 1: every request prefills its whole prompt */
    /* The prefix cache's second level (NULL: none): a store URI (mem:,
     * file:DIR, ucx://HOST:PORT of a memory node; flextier/store.h). The
     * KV rows of a prefix (whole 16-token blocks, 64 tokens at least) whose
     * slot is about to be reused go there, in the cache's dtype, and come
     * back into a slot for a later request that shares more of it than any
     * slot does. prefix_store_entries bounds the prefixes kept (default
     * 256; the least recently used is deleted). CPU contexts with an
     * in-memory KV cache only. */
    const char *prefix_store;
    unsigned prefix_store_entries;
    const char *prefix_store_token_file;   /* ucx:// stores */
    /* log lines (one request per line; NULL: silent) */
    void (*log)(void *user, const char *line);
    void *log_user;
} ft_server_params;

FT_API void ft_server_default_params(ft_server_params *p);

typedef struct ft_server ft_server;

/* Start serving session s (borrowed: it must outlive the server, and no
 * one else may use it meanwhile). Errors: FT_ERR_INVALID_ARG (a bad
 * parameter; a non-loopback host without an API key and not insecure),
 * FT_ERR_IO (the address cannot be bound), the session's errors sizing
 * the context for slots x ctx. */
FT_API ft_status ft_server_start(ft_session *s, const ft_server_params *p, ft_server **out);
/* The port listened on (the one chosen when params.port was 0). */
FT_API unsigned ft_server_port(const ft_server *srv);
/* Stop accepting, end the requests in flight (their clients see the
 * connection close), join the threads, free. NULL ok. */
FT_API void ft_server_stop(ft_server *srv);

#ifdef __cplusplus
}
#endif
#endif
