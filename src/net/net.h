/* Internal to src/net: what the client and the memory node share. */
#ifndef FT_NET_NET_H
#define FT_NET_NET_H
#include "flextier/core.h"

#include <sys/socket.h>
#include <ucp/api/ucp.h>

/* "host:port" or "[v6]:port" -> a socket address (passive: for bind). */
ft_status ft_net_resolve(const char *hostport, int passive,
                         struct sockaddr_storage *addr, socklen_t *alen);
/* The shared secret from a file (trailing newlines and spaces dropped). */
ft_status ft_net_read_token(const char *path, char *buf, size_t cap, size_t *len);
/* A UCP context with active messages and wakeup, one single-threaded
 * worker (the caller serializes its use) and the worker's event fd. On
 * error whatever was created is left in *ctx / *w for the caller to
 * destroy. */
ucs_status_t ft_net_ucp_open(const char *name, ucp_context_h *ctx, ucp_worker_h *w, int *efd);
#endif
