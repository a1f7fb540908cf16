/* Internal to src/net: cross-memory attach (process_vm_readv/writev) for
 * clients on the server's own host, shared by the memory node and the
 * codec agent (docs/protocol.md, "Data paths" and "Trust model").
 *
 * The server copies between its memory and an authenticated client's
 * buffers with process_vm_readv/process_vm_writev: one copy, done by the
 * server, so the client's core is free while the server moves the next
 * piece. Only the server ever touches the other side's memory.
 *
 * Who the client is, is the kernel's word, never the client's:
 *
 *  1. Over its authenticated TCP session (or agent session) the client
 *     asks for the path and gets a fresh random nonce and the name of the
 *     server's Unix-domain socket (an abstract name, itself random):
 *     ft_cma_door_offer.
 *  2. The client connects to that socket and writes the nonce
 *     (ft_cma_present). The kernel records who connected: the server takes
 *     a pidfd of that process (SO_PEERPIDFD) and its credentials
 *     (SO_PEERCRED), never a pid the client names.
 *  3. The client confirms over its session; the server takes the Unix
 *     connection that presented this session's nonce (ft_cma_door_claim),
 *     so a Unix connection is good for the one session that was offered
 *     the nonce and nothing else, and opens the process: a pidfd, its
 *     /proc directory (bound to that process: a reused pid is another
 *     directory) and its /proc/PID/mem (bound to its address space: after
 *     an exec, reads of the old one return nothing).
 *
 * Before EVERY copy (ft_cma_check, called by ft_cma_read/ft_cma_write) the
 * server checks that the process is alive (pidfd), has not exec'd (its
 * address space is still the one opened at step 3), that its real,
 * effective, saved and file-system user ids all equal the server's
 * effective uid, and that it is dumpable (the kernel makes /proc/PID files
 * of a non-dumpable process root's; undetectable when the server itself
 * runs as root). A process that fails any check is refused for good. A
 * server running as root therefore serves only root clients by this path.
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

#define FT_CMA_NONCE       32u   /* bytes of the session's nonce            */
#define FT_CMA_NAME        48u   /* bytes for the socket's abstract name    */
#define FT_CMA_OFFER_SIZE  (FT_CMA_NONCE + FT_CMA_NAME)   /* offer payload  */

/* The inode of the socket on this host (this network namespace) whose
 * local address is `peer` and remote address is `local`: the other end of
 * one of our TCP connections, when it is on this host. 0 if none. Only a
 * hint (FT_NODE_LOCAL): it decides nothing about access. */
uint64_t ft_cma_peer_inode(const struct sockaddr_storage *peer, const struct sockaddr_storage *local);

/* A verified client process. */
typedef struct ft_cma_peer {
    pid_t pid;
    int   pidfd;    /* -1: none (the path is not open) */
    int   procfd;   /* /proc/<pid>, O_PATH                 */
    int   memfd;    /* /proc/<pid>/mem: its address space  */
    uid_t uid;      /* what all its uids must be           */
} ft_cma_peer;

void ft_cma_peer_init(ft_cma_peer *p);          /* closed */
void ft_cma_peer_close(ft_cma_peer *p);         /* back to closed */
static inline int ft_cma_peer_open(const ft_cma_peer *p) { return p->pidfd >= 0; }

/* The checks made before every copy (see above); addr: an address of the
 * copy, where the address-space check reads one byte (0: skip that
 * check). FT_ERR_AUTH with what failed. */
ft_status ft_cma_check(const ft_cma_peer *p, uint64_t addr);

/* Copy n bytes: from the process's addr into local (read), or from local
 * to the process's addr (write), after ft_cma_check (and checking again
 * after the copy); large copies in parts on pool's threads (NULL: this
 * thread). FT_ERR_AUTH when a check fails, FT_ERR_NET with errno's text
 * when the copy fails. */
ft_status ft_cma_read(ft_pool *pool, const ft_cma_peer *p, void *local, uint64_t addr, size_t n);
ft_status ft_cma_write(ft_pool *pool, const ft_cma_peer *p, const void *local, uint64_t addr, size_t n);

/* ---------------------------------------------------------- server side */

typedef struct ft_cma_door ft_cma_door;

/* Listen on a fresh Unix-domain socket with a random abstract name (this
 * network namespace). FT_ERR_UNSUPPORTED where that is impossible. */
ft_status ft_cma_door_open(ft_cma_door **out);
void ft_cma_door_close(ft_cma_door *d);

/* Step 1: a fresh nonce for one session (the caller keeps it) and the
 * offer to send that session's client: nonce, then the socket's name,
 * NUL-padded. */
ft_status ft_cma_door_offer(ft_cma_door *d, uint8_t nonce[FT_CMA_NONCE],
                            uint8_t offer[FT_CMA_OFFER_SIZE]);

/* Step 3: the Unix connection that presented nonce (waiting at most
 * wait_s for it: the client wrote it before it confirmed, so it is
 * normally there already), the process behind it verified and opened
 * into *peer. Connections that presented other nonces are kept a few
 * seconds for their own sessions; at most 64 are held. */
ft_status ft_cma_door_claim(ft_cma_door *d, const uint8_t nonce[FT_CMA_NONCE], double wait_s,
                            ft_cma_peer *peer);

/* Verify and open the process that connected Unix socket fd (the checks
 * of ft_cma_check against this process's effective uid). Used by claim;
 * exposed for tests. */
ft_status ft_cma_peer_from_socket(int fd, ft_cma_peer *peer);

/* ---------------------------------------------------------- client side */

/* The socket name an offer carries: "flextier-cma-" then printable
 * bytes, NUL-padded to FT_CMA_NAME. FT_ERR_PROTOCOL otherwise (name ""). */
ft_status ft_cma_offer_name(const uint8_t offer[FT_CMA_OFFER_SIZE], char name[FT_CMA_NAME + 1]);

/* Step 2: connect to the socket named in offer and present its nonce;
 * *fd stays open until the server has confirmed (then close it).
 * FT_ERR_PROTOCOL for an offer that names no flextier socket. */
ft_status ft_cma_present(const uint8_t offer[FT_CMA_OFFER_SIZE], int *fd);

/* Let process server_pid read and write this process's memory where Yama
 * restricts ptrace (ptrace_scope 1: PR_SET_PTRACER; one server per
 * process). FT_ERR_UNSUPPORTED when that is not possible. */
ft_status ft_cma_allow(pid_t server_pid);
#endif
