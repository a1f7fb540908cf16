/* Internal to src/net: what the client and the memory node share. */
#ifndef FT_NET_NET_H
#define FT_NET_NET_H
#include "flextier/core.h"

#include <sys/socket.h>
#include <ucp/api/ucp.h>

/* "host:port" or "[v6]:port" -> a socket address (passive: for bind). The
 * port must be a decimal number 0..65535 (no service names: 99999 is an
 * error, not another port). */
FT_API ft_status ft_net_resolve(const char *hostport, int passive,
                         struct sockaddr_storage *addr, socklen_t *alen);
/* 127.0.0.0/8, ::1 or ::ffff:127.x */
FT_API int ft_net_is_loopback(const struct sockaddr_storage *a);
/* 0.0.0.0 or :: */
int ft_net_is_any(const struct sockaddr_storage *a);
/* "1.2.3.4:5" / "[::1]:5" */
FT_API void ft_net_addr_str(const struct sockaddr_storage *a, char *buf, size_t n);

/* How a UCP context may reach its peers (docs/protocol.md, "Trust model").
 * UCX's TCP transport executes any peer's RMA PUT to any address it names
 * and listens on every interface, so it is left out unless the operator
 * names the network trusted. Shared-memory transports are always left
 * out: UCX 1.13 cannot detect a dead peer over them, so their endpoints
 * cannot be force-closed; the node's own cross-memory path (cma.h) serves
 * clients on its host. What is left is RDMA (and TCP when trusted). */
typedef struct ft_net_ucx_opts {
    int         allow_tcp;     /* UCX may use its TCP transport */
    const char *net_devices;   /* UCX_NET_DEVICES to apply (NULL: the environment's) */
    const char *rndv_scheme;   /* UCX_RNDV_SCHEME unless the environment sets one */
    int         no_rcache;     /* registrations end with ucp_mem_unmap (the node) */
    uint64_t    features;      /* UCP features (0: active messages + wakeup) */
    const char *user_tls;      /* the transports asked for (NULL: UCX_TLS of the
                                  environment); the policy filters them too */
} ft_net_ucx_opts;

/* The UCX_TLS value the policy allows, from the user's UCX_TLS (NULL:
 * unset). Writes "" when nothing is left. */
void ft_net_ucx_tls(const char *user_tls, int allow_tcp, char *out, size_t n);

/* A UCP context with active messages and wakeup, one single-threaded
 * worker (the caller serializes its use) and the worker's event fd, under
 * the policy above. UCS_ERR_UNSUPPORTED when the policy leaves no
 * transport that reaches other hosts (no RDMA device, TCP not allowed). On error whatever was created is left in *ctx / *w for the
 * caller to destroy. One call per rail: a multi-rail client calls it once
 * per network interface (opts->net_devices). */
FT_API ucs_status_t ft_net_ucp_open(const char *name, const ft_net_ucx_opts *opts, ucp_context_h *ctx,
                             ucp_worker_h *w, int *efd);

/* Is addr (len bytes, from a peer) a UCP worker address that UCX 1.13's
 * ucp_address_unpack can walk without reading past its end or asserting?
 * Checks the header version (v1 or v2: UCX asserts on any other), then
 * walks every field the unpacker reads (uuid, client id, worker name,
 * each device's md index, length, paths, system device and address, each
 * interface's transport checksum, attributes, length and address) within
 * len bytes, with UCX's own limits (128 interfaces, md index < 64, no
 * endpoint addresses in a worker address, finite v1 attributes), and
 * requires the walk to end exactly at len. Non-unified mode, the address flags of
 * ucp_worker_get_address (docs/protocol.md, "UCX addresses"). FT_OK or
 * FT_ERR_PROTOCOL with what is wrong. Fuzzed: fuzz/fuzz_ucx_addr.c. */
FT_API ft_status ft_net_ucx_addr_check(const void *addr, size_t len);

/* An endpoint to the worker at addr (len bytes from a peer: checked with
 * ft_net_ucx_addr_check first, UCS_ERR_INVALID_ADDR when malformed),
 * error mode PEER (a dead peer fails its operations; the endpoint can be
 * force-closed). */
FT_API ucs_status_t ft_net_ucp_connect(ucp_worker_h w, const void *addr, size_t len,
                                       ucp_err_handler_cb_t cb, void *arg, ucp_ep_h *ep);

/* The UCX_NET_DEVICES value for the interface that owns address a: the
 * interface itself plus the RDMA ports behind it (RoCE / IPoIB), e.g.
 * "eth2,mlx5_0:1". For a wildcard address: "" (all devices). FT_OK and ""
 * also when no interface holds the address (UCX then picks). */
FT_API ft_status ft_net_devices_for(const struct sockaddr_storage *a, char *out, size_t n);
/* The UCX devices a listening process may use on the --listen interface:
 * ft_net_devices_for's list, without the netdev itself (UCX's TCP) unless
 * trusted_network; "" when none (or on error). */
FT_API void ft_net_listen_devices(const struct sockaddr_storage *a, int trusted_network, char *out, size_t n);

/* Non-blocking, close-on-exec TCP socket connected to addr within
 * timeout_ms; TCP_NODELAY and keepalive set. */
FT_API ft_status ft_net_tcp_connect(const struct sockaddr_storage *addr, socklen_t alen, int timeout_ms,
                             const char *what, int *fd);
#endif
