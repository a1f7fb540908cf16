/* Test support: bytes this process received on TCP connections, for the
 * tests that check a data path does not use the connection. */
#ifndef FT_SUPPORT_NETBYTES_H
#define FT_SUPPORT_NETBYTES_H
#include <stdint.h>

/* Bytes received on this process's open TCP connections to port (on any
 * address), by the kernel's count per socket (TCP_INFO
 * tcpi_bytes_received, Linux 4.1); UINT64_MAX where the kernel does not
 * say. */
uint64_t ft_test_tcp_received(int port);
#endif
