/* Internal to src/net: the node's shared-memory data path for clients on
 * its own host (docs/protocol.md, "Data paths").
 *
 * The node copies between its pool and an authenticated client's buffers
 * with process_vm_readv/process_vm_writev (cross-memory attach): one copy,
 * done by the node, so the client's core is free to hash and decode while
 * the node moves the next piece. Only the node ever touches the other
 * side's memory; the pool is never exposed. The kernel checks the access
 * like ptrace (same user); the node additionally checks, with what the
 * kernel reports, that the process it will copy to/from is the one that
 * holds the other end of the authenticated TCP connection and runs as the
 * node's user, so that a client cannot point the node at another process.
 * It holds a pidfd on that process and stops using it once it exits.
 *
 * UCX 1.13's shared-memory transports are not used: they cannot detect a
 * dead peer (no PEER error mode), and without it an endpoint cannot be
 * force-closed, so a client that died mid-transfer would pin the node's
 * blocks and leases for good. */
#ifndef FT_NET_CMA_H
#define FT_NET_CMA_H
#include "flextier/core.h"

#include <sys/socket.h>
#include <sys/types.h>

#define FT_CMA_COOKIE 32u

/* The inode of the socket on this host (this network namespace) whose
 * local address is `peer` and remote address is `local`: the other end of
 * one of our TCP connections, when it is on this host. 0 if none. */
uint64_t ft_cma_peer_inode(const struct sockaddr_storage *peer, const struct sockaddr_storage *local);

/* Check that process pid holds socket `inode`, runs as this process's
 * user, and has cookie at addr (read with process_vm_readv). On success
 * *pidfd refers to the process. FT_ERR_AUTH / FT_ERR_UNSUPPORTED with a
 * detail otherwise. */
ft_status ft_cma_verify(pid_t pid, uint64_t inode, uint64_t addr, const uint8_t *cookie, int *pidfd);

/* 1 while the process behind pidfd is alive. */
int ft_cma_alive(int pidfd);

/* Copy n bytes: from the process's addr into local (read), or from local
 * to the process's addr (write); large copies in parts on pool's threads
 * (NULL: this thread). FT_ERR_NET with errno's text on failure. */
ft_status ft_cma_read(ft_pool *pool, pid_t pid, void *local, uint64_t addr, size_t n);
ft_status ft_cma_write(ft_pool *pool, pid_t pid, const void *local, uint64_t addr, size_t n);

/* Client side: let process node_pid read and write this process's memory
 * where Yama restricts ptrace (ptrace_scope 1: PR_SET_PTRACER; one node
 * per process). FT_ERR_UNSUPPORTED when that is not possible. */
ft_status ft_cma_allow(pid_t node_pid);
#endif
