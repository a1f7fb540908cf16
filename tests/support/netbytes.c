/* Test support: see netbytes.h. Apart from the tests because the
 * kernel's struct tcp_info (linux/tcp.h, with the byte counts) and the C
 * library's (netinet/tcp.h, without) cannot share a file. */
#include "netbytes.h"

#include <linux/tcp.h>
#include <netinet/in.h>
#include <stddef.h>
#include <string.h>
#include <sys/socket.h>

uint64_t ft_test_tcp_received(int port)
{
    uint64_t n = 0;
    for (int fd = 0; fd < 4096; fd++) {
        struct sockaddr_storage a;
        socklen_t al = sizeof a;
        if (getpeername(fd, (struct sockaddr *)&a, &al) != 0) continue;
        int p = a.ss_family == AF_INET ? ntohs(((struct sockaddr_in *)&a)->sin_port)
              : a.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&a)->sin6_port) : -1;
        if (p != port) continue;
        struct tcp_info ti;
        socklen_t tl = sizeof ti;
        memset(&ti, 0, sizeof ti);
        if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &tl) != 0) continue;
        if (tl < offsetof(struct tcp_info, tcpi_bytes_received) + sizeof ti.tcpi_bytes_received) return UINT64_MAX;
        n += ti.tcpi_bytes_received;
    }
    return n;
}
