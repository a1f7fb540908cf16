/* Cross-memory attach for clients on the node's host (cma.h). */
#define _GNU_SOURCE   /* process_vm_readv/writev */
#include "cma.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

/* /proc/net/tcp* addresses: IPv4 as one host-order u32 in hex, IPv6 as
 * four; ports in hex. */
static void v4_hex(const struct sockaddr_in *s, char *out, size_t n)
{
    snprintf(out, n, "%08X:%04X", (unsigned)s->sin_addr.s_addr, (unsigned)ntohs(s->sin_port));
}

static void v6_hex(const struct sockaddr_in6 *s, char *out, size_t n)
{
    uint32_t w[4];
    memcpy(w, &s->sin6_addr, 16);
    snprintf(out, n, "%08X%08X%08X%08X:%04X", (unsigned)w[0], (unsigned)w[1], (unsigned)w[2],
             (unsigned)w[3], (unsigned)ntohs(s->sin6_port));
}

uint64_t ft_cma_peer_inode(const struct sockaddr_storage *peer, const struct sockaddr_storage *local)
{
    if (peer->ss_family != local->ss_family) return 0;
    char want_l[64], want_r[64];
    const char *file;
    if (peer->ss_family == AF_INET) {
        v4_hex((const struct sockaddr_in *)peer, want_l, sizeof want_l);
        v4_hex((const struct sockaddr_in *)local, want_r, sizeof want_r);
        file = "/proc/net/tcp";
    } else if (peer->ss_family == AF_INET6) {
        v6_hex((const struct sockaddr_in6 *)peer, want_l, sizeof want_l);
        v6_hex((const struct sockaddr_in6 *)local, want_r, sizeof want_r);
        file = "/proc/net/tcp6";
    } else {
        return 0;
    }
    FILE *f = fopen(file, "re");
    if (!f) return 0;
    char line[512];
    uint64_t inode = 0;
    while (!inode && fgets(line, sizeof line, f)) {
        char l[64], r[64];
        unsigned long long ino = 0;
        /* sl local rem st tx:rx tr:when retrnsmt uid timeout inode */
        if (sscanf(line, " %*s %63s %63s %*s %*s %*s %*s %*s %*s %llu", l, r, &ino) == 3 &&
            !strcmp(l, want_l) && !strcmp(r, want_r))
            inode = ino;
    }
    fclose(f);
    return inode;
}

/* Real and effective uid of pid, from /proc/pid/status. */
static int proc_uids(pid_t pid, unsigned *ruid, unsigned *euid)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "re");
    if (!f) return -1;
    int ok = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "Uid: %u %u", ruid, euid) == 2) {
            ok = 0;
            break;
        }
    fclose(f);
    return ok;
}

static int holds_socket(pid_t pid, uint64_t inode)
{
    char dir[64], want[64];
    snprintf(dir, sizeof dir, "/proc/%d/fd", (int)pid);
    snprintf(want, sizeof want, "socket:[%llu]", (unsigned long long)inode);
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *de;
    int found = 0;
    while (!found && (de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        char link[320], target[128];
        snprintf(link, sizeof link, "%s/%s", dir, de->d_name);
        ssize_t n = readlink(link, target, sizeof target - 1);
        if (n > 0) {
            target[n] = 0;
            found = !strcmp(target, want);
        }
    }
    closedir(d);
    return found;
}

ft_status ft_cma_verify(pid_t pid, uint64_t inode, uint64_t addr, const uint8_t *cookie, int *pidfd)
{
    if (pid <= 0 || inode == 0)
        return ft_set_error(FT_ERR_UNSUPPORTED, "not a process on this host");
    int fd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (fd < 0) return ft_set_error(FT_ERR_UNSUPPORTED, "process %d: %s", (int)pid, strerror(errno));
    unsigned ruid = 0, euid = 0;
    ft_status st = FT_OK;
    if (proc_uids(pid, &ruid, &euid) != 0)
        st = ft_set_error(FT_ERR_UNSUPPORTED, "process %d is not visible", (int)pid);
    else if (ruid != geteuid() || euid != geteuid())
        st = ft_set_error(FT_ERR_UNSUPPORTED, "process %d runs as another user", (int)pid);
    else if (!holds_socket(pid, inode))
        st = ft_set_error(FT_ERR_AUTH, "process %d does not hold this connection", (int)pid);
    if (st == FT_OK) {
        uint8_t got[FT_CMA_COOKIE];
        st = ft_cma_read(NULL, pid, got, addr, sizeof got);
        if (st == FT_OK && memcmp(got, cookie, sizeof got))
            st = ft_set_error(FT_ERR_AUTH, "process %d: probe does not match", (int)pid);
    }
    /* the pidfd pins the identity: checked before every copy */
    if (st == FT_OK && !ft_cma_alive(fd)) st = ft_set_error(FT_ERR_NET, "process %d exited", (int)pid);
    if (st != FT_OK) {
        close(fd);
        return st;
    }
    *pidfd = fd;
    return FT_OK;
}

int ft_cma_alive(int pidfd)
{
    struct pollfd p = {pidfd, POLLIN, 0};
    return poll(&p, 1, 0) == 0;   /* readable once the process exits */
}

static ft_status cma_io(pid_t pid, int write, void *local, uint64_t addr, size_t n)
{
    size_t done = 0;
    while (done < n) {
        struct iovec l = {(uint8_t *)local + done, n - done};
        struct iovec r = {(void *)(uintptr_t)(addr + done), n - done};
        ssize_t k = write ? process_vm_writev(pid, &l, 1, &r, 1, 0)
                          : process_vm_readv(pid, &l, 1, &r, 1, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0)
            return ft_set_error(FT_ERR_NET, "%s of %zu bytes at 0x%llx in process %d: %s",
                                write ? "write" : "read", n - done,
                                (unsigned long long)(addr + done), (int)pid,
                                k < 0 ? strerror(errno) : "nothing moved");
        done += (size_t)k;
    }
    return FT_OK;
}

/* Large copies are split over the pool's threads: one core's copy does not
 * fill the memory bandwidth, and the client's core mostly waits for it. */
#define CMA_PART (1u << 20)

typedef struct {
    pid_t pid;
    int write;
    uint8_t *local;
    uint64_t addr;
    size_t n, part;
    ft_status st[64];
    char why[256];
    pthread_mutex_t mu;
} cma_job;

static void cma_task(void *arg, size_t i, unsigned worker)
{
    cma_job *j = arg;
    (void)worker;
    size_t off = i * j->part, len = j->n - off < j->part ? j->n - off : j->part;
    ft_status st = cma_io(j->pid, j->write, j->local + off, j->addr + off, len);
    j->st[i] = st;
    if (st != FT_OK) {
        pthread_mutex_lock(&j->mu);
        snprintf(j->why, sizeof j->why, "%s", ft_last_error());
        pthread_mutex_unlock(&j->mu);
    }
}

static ft_status cma_copy(ft_pool *pool, pid_t pid, int write, void *local, uint64_t addr, size_t n)
{
    unsigned th = ft_pool_size(pool);
    if (!pool || th < 2 || n < 2 * CMA_PART) return cma_io(pid, write, local, addr, n);
    cma_job j;
    memset(&j, 0, sizeof j);
    j.pid = pid;
    j.write = write;
    j.local = local;
    j.addr = addr;
    j.n = n;
    size_t parts = th * 2;   /* a few per thread: uneven progress balances */
    if (parts > 64) parts = 64;
    j.part = (n + parts - 1) / parts;
    if (j.part < CMA_PART) j.part = CMA_PART;
    parts = (n + j.part - 1) / j.part;
    pthread_mutex_init(&j.mu, NULL);
    ft_pool_run(pool, parts, cma_task, &j);
    pthread_mutex_destroy(&j.mu);
    for (size_t i = 0; i < parts; i++)
        if (j.st[i] != FT_OK) return ft_set_error(j.st[i], "%s", j.why);
    return FT_OK;
}

ft_status ft_cma_read(ft_pool *pool, pid_t pid, void *local, uint64_t addr, size_t n)
{
    return cma_copy(pool, pid, 0, local, addr, n);
}

ft_status ft_cma_write(ft_pool *pool, pid_t pid, const void *local, uint64_t addr, size_t n)
{
    return cma_copy(pool, pid, 1, (void *)local, addr, n);
}

ft_status ft_cma_allow(pid_t node_pid)
{
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    static pid_t allowed;
    int scope = 0;
    FILE *f = fopen("/proc/sys/kernel/yama/ptrace_scope", "re");
    if (f) {
        if (fscanf(f, "%d", &scope) != 1) scope = 0;
        fclose(f);
    }
    if (scope == 0) return FT_OK;   /* same user suffices */
    if (scope >= 2) return ft_set_error(FT_ERR_UNSUPPORTED, "Yama ptrace_scope %d forbids it", scope);
    pthread_mutex_lock(&mu);
    ft_status st = FT_OK;
    if (allowed && allowed != node_pid)
        st = ft_set_error(FT_ERR_UNSUPPORTED, "Yama admits one node per process (node %d has it)",
                          (int)allowed);
    else if (prctl(PR_SET_PTRACER, (unsigned long)node_pid, 0, 0, 0) != 0)
        st = ft_set_error(FT_ERR_UNSUPPORTED, "PR_SET_PTRACER: %s", strerror(errno));
    else
        allowed = node_pid;
    pthread_mutex_unlock(&mu);
    return st;
}
