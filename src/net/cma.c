/* Cross-memory attach for clients on the server's host (cma.h). */
#define _GNU_SOURCE   /* process_vm_readv/writev */
#include "cma.h"

#include "auth.h"   /* ft_net_random */

#include <arpa/inet.h>
#include <openssl/crypto.h>
#include <stddef.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <time.h>
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

/* ------------------------------------------------------------- the peer */

#ifndef SO_PEERPIDFD
#if defined(__x86_64__) || defined(__i386__) || defined(__aarch64__) || defined(__arm__) || \
    defined(__riscv) || defined(__loongarch__) || defined(__s390__)
#define SO_PEERPIDFD 77   /* asm-generic/socket.h, Linux 6.5 */
#endif
#endif

void ft_cma_peer_init(ft_cma_peer *p)
{
    memset(p, 0, sizeof *p);
    p->pidfd = p->procfd = p->memfd = -1;
}

void ft_cma_peer_close(ft_cma_peer *p)
{
    if (p->pidfd >= 0) close(p->pidfd);
    if (p->procfd >= 0) close(p->procfd);
    if (p->memfd >= 0) close(p->memfd);
    ft_cma_peer_init(p);
}

static int pidfd_alive(int pidfd)
{
    struct pollfd q = {pidfd, POLLIN, 0};
    return poll(&q, 1, 0) == 0;   /* readable once the process exits */
}

/* The uids the kernel holds for the process behind pidfd: PIDFD_GET_INFO
 * (Linux 6.13; extensible by size, so the first version's layout is
 * asked for). 1 done, 0 not available, -1 the process is gone. */
struct ft_pidfd_info {
    uint64_t mask, cgroupid;
    uint32_t pid, tgid, ppid, ruid, rgid, euid, egid, suid, sgid, fsuid, fsgid;
    uint32_t spare0;
};
#define FT_PIDFD_GET_INFO _IOWR(0xFF, 11, struct ft_pidfd_info)
#define FT_PIDFD_INFO_CREDS 2u

static int pidfd_uids(int pidfd, unsigned long id[4])
{
    struct ft_pidfd_info in;
    memset(&in, 0, sizeof in);
    in.mask = FT_PIDFD_INFO_CREDS;
    if (ioctl(pidfd, FT_PIDFD_GET_INFO, &in) != 0) return errno == ESRCH ? -1 : 0;
    if (!(in.mask & FT_PIDFD_INFO_CREDS)) return 0;
    id[0] = in.ruid;
    id[1] = in.euid;
    id[2] = in.suid;
    id[3] = in.fsuid;
    return 1;
}

/* The same from /proc/<pid>/status, read through the process's own
 * directory (kernels before 6.13). */
static int status_uids(const ft_cma_peer *p, unsigned long id[4])
{
    int fd = openat(p->procfd, "status", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    char buf[4096];
    size_t n = 0;
    ssize_t r;
    while (n < sizeof buf - 1 && (r = read(fd, buf + n, sizeof buf - 1 - n)) != 0) {
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) break;
        n += (size_t)r;
    }
    close(fd);
    buf[n] = 0;
    const char *u = strstr(buf, "\nUid:");
    return u && sscanf(u + 5, "%lu %lu %lu %lu", &id[0], &id[1], &id[2], &id[3]) == 4 ? 1 : -1;
}

/* All four uids the server's; dumpable: the kernel makes a non-dumpable
 * process's /proc files root's (proc(5)), and a lookup refreshes that. */
static ft_status check_creds(const ft_cma_peer *p)
{
    unsigned long id[4];
    int r = pidfd_uids(p->pidfd, id);
    if (r == 0) r = status_uids(p, id);
    if (r < 0) return ft_set_error(FT_ERR_AUTH, "process %d is gone", (int)p->pid);
    for (int i = 0; i < 4; i++)
        if (id[i] != (unsigned long)p->uid)
            return ft_set_error(FT_ERR_AUTH,
                                "process %d runs as uids %lu/%lu/%lu/%lu (real/effective/saved/fs), "
                                "not as this server's user %lu",
                                (int)p->pid, id[0], id[1], id[2], id[3], (unsigned long)p->uid);
    struct stat sb;
    if (fstatat(p->procfd, "environ", &sb, AT_SYMLINK_NOFOLLOW) != 0)
        return ft_set_error(FT_ERR_AUTH, "process %d is gone", (int)p->pid);
    if (sb.st_uid != p->uid)
        return ft_set_error(FT_ERR_AUTH, "process %d is not dumpable", (int)p->pid);
    return FT_OK;
}

/* Still the address space opened at verification? Reading the old
 * /proc/<pid>/mem returns nothing once the process has exec'd (or exited);
 * an unmapped address in the same one is an error instead (EIO). */
static ft_status check_mm(const ft_cma_peer *p, uint64_t addr)
{
    if (!addr || addr > (uint64_t)INT64_MAX) return FT_OK;
    uint8_t b;
    ssize_t r;
    do r = pread(p->memfd, &b, 1, (off_t)addr);
    while (r < 0 && errno == EINTR);
    if (r == 0)
        return ft_set_error(FT_ERR_AUTH, "process %d has exec'd or exited since it was verified",
                            (int)p->pid);
    return FT_OK;
}

ft_status ft_cma_check(const ft_cma_peer *p, uint64_t addr)
{
    if (p->pidfd < 0) return ft_set_error(FT_ERR_AUTH, "no verified client process");
    /* the address-space check also fails for a process that exited (its
     * mm is gone), so the pidfd is polled only without an address */
    if (!addr && !pidfd_alive(p->pidfd))
        return ft_set_error(FT_ERR_AUTH, "client process %d exited", (int)p->pid);
    ft_status st = check_mm(p, addr);
    if (st == FT_OK) st = check_creds(p);
    return st;
}

/* The pid of the process behind pidfd, in our pid namespace. */
static pid_t pidfd_pid(int pidfd)
{
    char path[64], line[128];
    snprintf(path, sizeof path, "/proc/self/fdinfo/%d", pidfd);
    FILE *f = fopen(path, "re");
    if (!f) return -1;
    long pid = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "Pid: %ld", &pid) == 1) break;
    fclose(f);
    return pid > 0 && pid <= INT32_MAX ? (pid_t)pid : -1;
}

ft_status ft_cma_peer_from_socket(int fd, ft_cma_peer *out)
{
    ft_cma_peer p;
    ft_cma_peer_init(&p);
    p.uid = geteuid();
    struct ucred cr;
    socklen_t cl = sizeof cr;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &cl) != 0)
        return ft_set_error(FT_ERR_AUTH, "SO_PEERCRED: %s", strerror(errno));
    if (cr.uid != p.uid)
        return ft_set_error(FT_ERR_AUTH, "the client runs as uid %u, this server as %u",
                            (unsigned)cr.uid, (unsigned)p.uid);
#ifdef SO_PEERPIDFD
    cl = sizeof p.pidfd;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERPIDFD, &p.pidfd, &cl) != 0) {
        int e = errno;
        p.pidfd = -1;
        if (e == ENOPROTOOPT)
            return ft_set_error(FT_ERR_UNSUPPORTED, "this kernel has no SO_PEERPIDFD (Linux 6.5 or later needed)");
        return ft_set_error(FT_ERR_AUTH, "SO_PEERPIDFD: %s", strerror(e));
    }
#else
    return ft_set_error(FT_ERR_UNSUPPORTED, "SO_PEERPIDFD unknown on this architecture");
#endif
    ft_status st = FT_OK;
    char path[64];
    p.pid = pidfd_pid(p.pidfd);
    if (p.pid <= 0) {
        st = ft_set_error(FT_ERR_AUTH, "the client process exited or is in another pid namespace");
        goto cleanup;
    }
    snprintf(path, sizeof path, "/proc/%d", (int)p.pid);
    p.procfd = open(path, O_PATH | O_DIRECTORY | O_CLOEXEC);
    /* opened while the pidfd's process is alive: the directory is its */
    if (p.procfd < 0 || !pidfd_alive(p.pidfd)) {
        st = ft_set_error(FT_ERR_AUTH, "the client process exited");
        goto cleanup;
    }
    p.memfd = openat(p.procfd, "mem", O_RDONLY | O_CLOEXEC);
    if (p.memfd < 0) {
        st = ft_set_error(FT_ERR_AUTH, "process %d: its memory: %s", (int)p.pid, strerror(errno));
        goto cleanup;
    }
    st = ft_cma_check(&p, 0);
cleanup:
    if (st != FT_OK) {
        ft_cma_peer_close(&p);
        return st;
    }
    *out = p;
    return FT_OK;
}

/* ------------------------------------------------------------- the door */

#define DOOR_PENDING 64u
#define DOOR_KEEP_S  5.0   /* a presented nonce waits this long for its claim */

typedef struct {
    int     fd;
    uint8_t got[FT_CMA_NONCE];
    size_t  have;
    double  t;
} door_conn;

struct ft_cma_door {
    int             lfd;
    char            name[FT_CMA_NAME];
    door_conn       pend[DOOR_PENDING];
    unsigned        npend;
    pthread_mutex_t mu;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static socklen_t abstract_addr(const char *name, struct sockaddr_un *a)
{
    memset(a, 0, sizeof *a);
    a->sun_family = AF_UNIX;
    size_t n = strlen(name);
    memcpy(a->sun_path + 1, name, n);   /* sun_path[0] = 0: abstract */
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
}

ft_status ft_cma_door_open(ft_cma_door **out)
{
    /* The copies themselves must work here: qemu-user (the aarch64 tests)
     * answers process_vm_readv with ENOSYS, and a door opened anyway made
     * every agent write fail instead of taking the RMA path. One read of
     * our own memory decides. */
    {
        uint64_t src = 0x5a5a5a5a5a5a5a5aull, dst = 0;
        struct iovec li = {&dst, sizeof dst}, ri = {&src, sizeof src};
        if (process_vm_readv(getpid(), &li, 1, &ri, 1, 0) != (ssize_t)sizeof dst || dst != src)
            return ft_set_error(FT_ERR_UNSUPPORTED, "cross-memory attach unavailable here (process_vm_readv: %s)",
                                strerror(errno ? errno : EIO));
    }
    ft_cma_door *d = calloc(1, sizeof *d);
    if (!d) return ft_set_error(FT_ERR_NOMEM, "cross-memory door");
    uint8_t r[16];
    ft_status st = ft_net_random(r, sizeof r);
    if (st != FT_OK) { free(d); return st; }
    int k = snprintf(d->name, sizeof d->name, "flextier-cma-");
    for (unsigned i = 0; i < sizeof r; i++) k += snprintf(d->name + k, sizeof d->name - (size_t)k, "%02x", r[i]);
    d->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    struct sockaddr_un a;
    socklen_t al = abstract_addr(d->name, &a);
    if (d->lfd < 0 || bind(d->lfd, (struct sockaddr *)&a, al) != 0 || listen(d->lfd, 64) != 0) {
        st = ft_set_error(FT_ERR_UNSUPPORTED, "Unix socket for cross-memory attach: %s", strerror(errno));
        if (d->lfd >= 0) close(d->lfd);
        free(d);
        return st;
    }
    pthread_mutex_init(&d->mu, NULL);
    *out = d;
    return FT_OK;
}

void ft_cma_door_close(ft_cma_door *d)
{
    if (!d) return;
    for (unsigned i = 0; i < d->npend; i++) close(d->pend[i].fd);
    close(d->lfd);
    pthread_mutex_destroy(&d->mu);
    free(d);
}

ft_status ft_cma_door_offer(ft_cma_door *d, uint8_t nonce[FT_CMA_NONCE], uint8_t offer[FT_CMA_OFFER_SIZE])
{
    ft_status st = ft_net_random(nonce, FT_CMA_NONCE);
    if (st != FT_OK) return st;
    memcpy(offer, nonce, FT_CMA_NONCE);
    memset(offer + FT_CMA_NONCE, 0, FT_CMA_NAME);
    memcpy(offer + FT_CMA_NONCE, d->name, strlen(d->name));
    return FT_OK;
}

static void door_drop(ft_cma_door *d, unsigned i)
{
    close(d->pend[i].fd);
    d->pend[i] = d->pend[--d->npend];
}

/* Accept what is queued, read what has arrived; -1 or the index of the
 * connection that presented nonce. */
static int door_scan(ft_cma_door *d, const uint8_t nonce[FT_CMA_NONCE])
{
    double now = now_s();
    for (;;) {
        int fd = accept4(d->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) break;
        if (d->npend == DOOR_PENDING) {   /* the oldest makes room */
            unsigned old = 0;
            for (unsigned i = 1; i < d->npend; i++)
                if (d->pend[i].t < d->pend[old].t) old = i;
            door_drop(d, old);
        }
        door_conn *c = &d->pend[d->npend++];
        memset(c, 0, sizeof *c);
        c->fd = fd;
        c->t = now;
    }
    for (unsigned i = 0; i < d->npend;) {
        door_conn *c = &d->pend[i];
        while (c->have < FT_CMA_NONCE) {
            ssize_t r = read(c->fd, c->got + c->have, FT_CMA_NONCE - c->have);
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) {
                if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) c->t = -1e9;   /* closed */
                break;
            }
            c->have += (size_t)r;
        }
        if (c->have == FT_CMA_NONCE && CRYPTO_memcmp(c->got, nonce, FT_CMA_NONCE) == 0) return (int)i;
        if (now - c->t > DOOR_KEEP_S) { door_drop(d, i); continue; }
        i++;
    }
    return -1;
}

ft_status ft_cma_door_claim(ft_cma_door *d, const uint8_t nonce[FT_CMA_NONCE], double wait_s,
                            ft_cma_peer *peer)
{
    double deadline = now_s() + wait_s;
    pthread_mutex_lock(&d->mu);
    int i;
    while ((i = door_scan(d, nonce)) < 0) {
        double left = deadline - now_s();
        if (left <= 0) break;
        struct pollfd q[1 + DOOR_PENDING];
        unsigned n = 0;
        q[n++] = (struct pollfd){d->lfd, POLLIN, 0};
        for (unsigned k = 0; k < d->npend; k++)
            if (d->pend[k].have < FT_CMA_NONCE) q[n++] = (struct pollfd){d->pend[k].fd, POLLIN, 0};
        int ms = (int)(left * 1000) + 1;
        if (poll(q, n, ms > 10 ? 10 : ms) < 0 && errno != EINTR) break;
    }
    ft_status st;
    if (i < 0) {
        st = ft_set_error(FT_ERR_AUTH, "no local process presented this session's nonce");
    } else {
        int fd = d->pend[i].fd;
        d->pend[i].fd = -1;
        d->pend[i] = d->pend[--d->npend];
        st = ft_cma_peer_from_socket(fd, peer);
        /* one status byte back: the client can tell refusal from loss */
        uint8_t ok = st == FT_OK;
        ssize_t w = write(fd, &ok, 1);
        (void)w;
        close(fd);
    }
    pthread_mutex_unlock(&d->mu);
    return st;
}

/* ---------------------------------------------------------- client side */

ft_status ft_cma_offer_name(const uint8_t offer[FT_CMA_OFFER_SIZE], char name[FT_CMA_NAME + 1])
{
    static const char prefix[] = "flextier-cma-";
    memcpy(name, offer + FT_CMA_NONCE, FT_CMA_NAME);
    name[FT_CMA_NAME] = 0;
    size_t n = strlen(name);
    int ok = n >= sizeof prefix && !strncmp(name, prefix, sizeof prefix - 1);
    for (size_t i = 0; ok && i < n; i++) ok = name[i] >= 0x21 && name[i] <= 0x7e;
    for (size_t i = n; ok && i < FT_CMA_NAME; i++) ok = offer[FT_CMA_NONCE + i] == 0;   /* NUL-padded */
    if (!ok) {
        name[0] = 0;
        return ft_set_error(FT_ERR_PROTOCOL, "the server's offer names no cross-memory socket");
    }
    return FT_OK;
}

ft_status ft_cma_present(const uint8_t offer[FT_CMA_OFFER_SIZE], int *out)
{
    char name[FT_CMA_NAME + 1];
    ft_status st0 = ft_cma_offer_name(offer, name);
    if (st0 != FT_OK) return st0;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return ft_set_error(FT_ERR_NET, "Unix socket: %s", strerror(errno));
    /* a server's accept queue filled by someone else must not hang us in
     * connect() (it bounds the write too) */
    struct timeval tv = {2, 0};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    struct sockaddr_un a;
    socklen_t al = abstract_addr(name, &a);
    ft_status st = FT_OK;
    struct ucred cr;
    socklen_t cl = sizeof cr;
    if (connect(fd, (struct sockaddr *)&a, al) != 0) {
        st = ft_set_error(FT_ERR_UNSUPPORTED, "cannot reach the server's Unix socket (another "
                          "network namespace?): %s", strerror(errno));
    } else if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &cl) != 0) {
        st = ft_set_error(FT_ERR_NET, "SO_PEERCRED: %s", strerror(errno));
    } else {
        /* the server the kernel names may reach us (Yama) */
        st = ft_cma_allow(cr.pid);
    }
    if (st == FT_OK) {
        size_t done = 0;
        while (st == FT_OK && done < FT_CMA_NONCE) {
            ssize_t r = write(fd, offer + done, FT_CMA_NONCE - done);
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) st = ft_set_error(FT_ERR_NET, "Unix socket: %s", r < 0 ? strerror(errno) : "closed");
            else done += (size_t)r;
        }
    }
    if (st != FT_OK) {
        close(fd);
        return st;
    }
    *out = fd;
    return FT_OK;
}

/* ------------------------------------------------------------ copying */

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

/* Checks before, and after: a process that exec'd during the copy must
 * not have what was read from it kept, nor have the server go on. */
static ft_status checked_copy(ft_pool *pool, const ft_cma_peer *p, int write, void *local,
                              uint64_t addr, size_t n)
{
    ft_status st = ft_cma_check(p, addr);
    /* process_vm_* names a pid: should the client die and its pid go to
     * another process between the check and the copy, a read is caught
     * by the check after it (and discarded); a write reaches the other
     * process only if the kernel lets this server ptrace it, and since a
     * client must run as the server's user, the client could have reached
     * that process itself (through /proc/PID/mem, which binds a copy to an
     * address space, writes were measured 3x slower: not worth it). */
    if (st == FT_OK) st = cma_copy(pool, p->pid, write, local, addr, n);
    /* an exec during the copy (the uids and dumpable change only with a
     * new program or by the process itself, which the next copy sees) */
    if (st == FT_OK && check_mm(p, addr) != FT_OK)
        st = ft_set_error(FT_ERR_AUTH, "process %d exec'd or exited during the copy", (int)p->pid);
    return st;
}

ft_status ft_cma_read(ft_pool *pool, const ft_cma_peer *p, void *local, uint64_t addr, size_t n)
{
    return checked_copy(pool, p, 0, local, addr, n);
}

ft_status ft_cma_write(ft_pool *pool, const ft_cma_peer *p, const void *local, uint64_t addr, size_t n)
{
    return checked_copy(pool, p, 1, (void *)local, addr, n);
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
