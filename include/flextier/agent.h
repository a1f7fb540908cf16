/*
 * flextier/agent.h - the codec agent (`flextier agent`, docs/agent.md).
 *
 * A process between local clients and the memory nodes that does their
 * codec work, as a BlueField DPU's Arm cores would: a client opens the
 * store URI
 *
 *     agent://AGENT_HOST:PORT[/NODE_HOST:PORT]
 *
 * and uses ft_write_tensor / ft_read_tensor (and everything else in
 * flextier/store.h) unchanged. The client connects to the agent's TCP
 * port (the memory node's front door: mutual HMAC challenge-response) and
 * names the tensor's buffer; the agent reads the raw tensor out of it
 * (cross-memory attach on one machine; UCP RMA get from a DPU over RDMA,
 * or over TCP on a network named trusted), encodes it with the client's codec params and stores the frame on
 * the memory node; on reads it fetches the frame (pipelined ranges,
 * decoded chunk by chunk as they arrive, every chunk hash verified) and
 * writes the decoded tensor straight into the client's buffer (RMA put).
 * Frames are exactly those in-process encoding would write, so results
 * are identical (bit-identical for lossless codecs).
 *
 * The agent keeps a tensor only while transferring it (a staging buffer
 * per request in flight, bounded by max_staging). It reaches the memory
 * nodes through the public store API (ucx://, flextier/store.h) with its
 * own token; local clients authenticate to the agent with the agent's
 * token (their ft_store_params.token_file / FLEXTIER_TOKEN_FILE). NODE
 * must be one of the agent's configured memory nodes; without it the
 * first one is used.
 */
#ifndef FLEXTIER_AGENT_H
#define FLEXTIER_AGENT_H

#include "flextier/core.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FT_AGENT_MAX_NODES 16

typedef struct ft_agent_params {
    const char *listen;          /* "HOST:PORT" (default "127.0.0.1:13340";
                                    port 0 = any free port)                 */
    const char *nodes[FT_AGENT_MAX_NODES]; /* memory nodes, "ucx://HOST:PORT" */
    unsigned    n_nodes;         /* >= 1                                     */
    const char *token_file;      /* clients must present this token (NULL:
                                    no client authentication)                */
    const char *node_token_file; /* the agent's token for the memory nodes
                                    (NULL: FLEXTIER_TOKEN_FILE or none)      */
    unsigned    threads;         /* requests handled at once (worker threads,
                                    0 = 8): each encodes/decodes one tensor
                                    and waits for its memory-node transfer,
                                    so several keep the link busy; the cores
                                    they run on are the agent's (taskset) */
    uint64_t    max_staging;     /* bytes of tensors in flight (0 = 2 GiB);
                                    a request over it waits in a queue; a
                                    tensor larger than it is refused
                                    (FT_ERR_NO_SPACE)                       */
    unsigned    max_connections; /* default 256                              */
    int         timeout_ms;      /* upstream operations (0 = store default)  */
    const char *client_tls;      /* UCX transports toward the clients (NULL:
                                    the UCX_TLS of the environment), e.g.
                                    "rc,tcp" when UCX_TLS pins the upstream
                                    to one transport; filtered by the trust
                                    policy (no shared memory, TCP only with
                                    trusted_network)                        */
    int         trusted_network; /* UCX RMA toward clients may use TCP (on
                                    the --listen interface): only where
                                    every host is trusted (docs/protocol.md) */
    int         insecure;        /* allow a non-loopback listen without a
                                    token                                   */
    volatile int *stop;          /* polled ~every 100 ms; exit when set     */
    void (*on_ready)(void *arg, const char *bound);
    void *arg;
} ft_agent_params;

FT_API void ft_agent_default_params(ft_agent_params *p);
/* Run until *stop becomes nonzero. FT_OK on a clean shutdown, or the error
 * that prevented it from starting (a memory node that cannot be reached
 * at start is an error: it is opened once and reconnects by itself). */
FT_API ft_status ft_agent_run(const ft_agent_params *p);

#ifdef __cplusplus
}
#endif
#endif
