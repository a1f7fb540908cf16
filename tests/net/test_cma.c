/* Cross-memory attach bound to the kernel's word (net/cma.h, issue 21):
 * the attacks on the node's and the agent's shared-memory path, against
 * the code both use. A client is a forked process that presents its
 * session's nonce on the door's Unix socket; the server side is this
 * process (or a child that runs as another user).
 *
 * The tests that need a second user and a setuid-root helper run only as
 * root (they make a copy of cma_victim setuid-root in a private
 * directory, and use the unprivileged uid of `nobody` as the other user);
 * they say so and pass without checking anything otherwise. */
#define _GNU_SOURCE
#include "ft_test.h"
#include "flextier/store.h"
#include "net/cma.h"
#include "net/raw_client.h"
#include "support/netbytes.h"
#include "support/server_util.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <pwd.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <stddef.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

static const char pattern[] = "client buffer: verified process";

typedef struct client {
    pid_t    pid;
    int      cmd, out;       /* pipes: commands in, answers out */
    uint64_t addr;           /* its buffer */
    int      presented;      /* ft_cma_present succeeded */
} client;

static char victim[PATH_MAX];   /* setuid-root copy of cma_victim ("" if none) */
static char victim_dir[64];
static uid_t other_uid = 65534;
static gid_t other_gid = 65534;

static int read_full(int fd, void *buf, size_t n)
{
    size_t k = 0;
    while (k < n) {
        ssize_t r = read(fd, (char *)buf + k, n - k);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        k += (size_t)r;
    }
    return 0;
}

static int become(uid_t uid, gid_t gid)
{
    if (setgroups(0, NULL) != 0 && errno != EPERM) return -1;
    if (setresgid(gid, gid, gid) != 0 || setresuid(uid, uid, uid) != 0) return -1;
    /* a change of user makes a process non-dumpable; an ordinary user's
     * process (a login's) is dumpable */
    return prctl(PR_SET_DUMPABLE, 1, 0, 0, 0) == 0 ? 0 : -1;
}

/* Fork a client (as uid/gid when as_other) that presents offer (its own
 * nonce when nonce_override) and then obeys: 'e' exec the victim (stdout
 * = the answer pipe), 'd' make itself non-dumpable, 'x' exit. */
static int client_start(client *c, const uint8_t offer[FT_CMA_OFFER_SIZE], int as_other,
                        const uint8_t *nonce_override)
{
    int cp[2], op[2];
    memset(c, 0, sizeof *c);
    if (pipe(cp) != 0 || pipe(op) != 0) return -1;
    c->pid = fork();
    if (c->pid < 0) return -1;
    if (c->pid == 0) {
        close(cp[1]);
        close(op[0]);
        static char buf[64];
        memcpy(buf, pattern, sizeof pattern);
        if (as_other && become(other_uid, other_gid) != 0) _exit(3);
        uint8_t o[FT_CMA_OFFER_SIZE];
        memcpy(o, offer, sizeof o);
        if (nonce_override) memcpy(o, nonce_override, FT_CMA_NONCE);
        int fd = -1;
        uint8_t ok = ft_cma_present(o, &fd) == FT_OK;
        uint64_t a = (uint64_t)(uintptr_t)buf;
        if (write(op[1], &ok, 1) != 1 || write(op[1], &a, 8) != 8) _exit(4);
        char cmd;
        while (read(cp[0], &cmd, 1) == 1) {
            if (cmd == 'e') {
                dup2(op[1], 1);
                execl(victim, victim, (char *)NULL);
                _exit(127);
            }
            if (cmd == 'd') {
                ok = prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0;
                if (write(op[1], &ok, 1) != 1) _exit(5);
            }
            if (cmd == 'u') {   /* another user's now, no exec */
                ok = become(other_uid, other_gid) == 0;
                if (write(op[1], &ok, 1) != 1) _exit(6);
            }
            if (cmd == 'x') break;
        }
        _exit(0);
    }
    close(cp[0]);
    close(op[1]);
    c->cmd = cp[1];
    c->out = op[0];
    uint8_t ok = 0;
    if (read_full(c->out, &ok, 1) != 0 || read_full(c->out, &c->addr, 8) != 0) return -1;
    c->presented = ok;
    return 0;
}

static void client_stop(client *c)
{
    if (c->pid > 0) {
        kill(c->pid, SIGKILL);
        waitpid(c->pid, NULL, 0);
    }
    if (c->cmd > 0) close(c->cmd);
    if (c->out > 0) close(c->out);
    c->pid = 0;
}

static int client_cmd(client *c, char cmd) { return write(c->cmd, &cmd, 1) == 1 ? 0 : -1; }

/* Have the client exec the victim; *addr = where its secret is. */
static int client_exec_victim(client *c, uint64_t *addr)
{
    char line[32];
    size_t n = 0;
    if (client_cmd(c, 'e') != 0) return -1;
    while (n < sizeof line - 1) {
        ssize_t r = read(c->out, line + n, 1);
        if (r != 1) return -1;
        if (line[n] == '\n') break;
        n++;
    }
    line[n] = 0;
    *addr = strtoull(line, NULL, 16);
    return *addr ? 0 : -1;
}

/* A door, an offer and a verified client (same user as this process). */
static int open_verified(ft_cma_door **d, client *c, ft_cma_peer *p)
{
    uint8_t nonce[FT_CMA_NONCE], offer[FT_CMA_OFFER_SIZE];
    ft_cma_peer_init(p);
    if (ft_cma_door_open(d) != FT_OK) return -1;
    if (ft_cma_door_offer(*d, nonce, offer) != FT_OK) return -2;
    if (client_start(c, offer, 0, NULL) != 0 || !c->presented) return -3;
    ft_status st = ft_cma_door_claim(*d, nonce, 2.0, p);
    if (st == FT_ERR_UNSUPPORTED) return -5;
    if (st != FT_OK) return -4;
    return 0;
}

/* SO_PEERPIDFD needs Linux 6.5; say so rather than fail elsewhere. */
static int supported(void)
{
    ft_cma_door *d = NULL;
    client c;
    ft_cma_peer p;
    int r = open_verified(&d, &c, &p);
    client_stop(&c);
    ft_cma_peer_close(&p);
    ft_cma_door_close(d);
    if (r == -5) {
        fprintf(stderr, "  SKIP: %s\n", ft_last_error());
        return 0;
    }
    return 1;
}

static int need_root(const char *what)
{
    if (geteuid() == 0 && victim[0]) return 1;
    fprintf(stderr, "  SKIP %s: needs root (a second user and a setuid-root helper)\n", what);
    return 0;
}

TEST(cma_verified_client_copies)
{
    if (!supported()) return;
    ft_cma_door *d = NULL;
    client c;
    ft_cma_peer p;
    REQUIRE(open_verified(&d, &c, &p) == 0);
    CHECK(p.pid == c.pid);
    char got[sizeof pattern];
    CHECK_OK(ft_cma_read(NULL, &p, got, c.addr, sizeof got));
    CHECK(memcmp(got, pattern, sizeof got) == 0);
    const char w[] = "written by the server";
    CHECK_OK(ft_cma_write(NULL, &p, w, c.addr, sizeof w));
    CHECK_OK(ft_cma_read(NULL, &p, got, c.addr, sizeof w));
    CHECK(memcmp(got, w, sizeof w) == 0);
    /* an unmapped address fails as a copy, not as an identity change */
    CHECK(ft_cma_read(NULL, &p, got, 4096, 8) == FT_ERR_NET);
    CHECK_OK(ft_cma_read(NULL, &p, got, c.addr, 8));
    client_stop(&c);
    ft_cma_peer_close(&p);
    ft_cma_door_close(d);
}

TEST(cma_nonce_bound_to_session)
{
    if (!supported()) return;
    ft_cma_door *d = NULL;
    REQUIRE(ft_cma_door_open(&d) == FT_OK);
    uint8_t na[FT_CMA_NONCE], oa[FT_CMA_OFFER_SIZE], nb[FT_CMA_NONCE], ob[FT_CMA_OFFER_SIZE];
    CHECK_OK(ft_cma_door_offer(d, na, oa));
    CHECK_OK(ft_cma_door_offer(d, nb, ob));
    CHECK(memcmp(na, nb, FT_CMA_NONCE) != 0);
    /* a process presenting session B's nonce is not session A's */
    client c;
    REQUIRE(client_start(&c, ob, 0, NULL) == 0 && c.presented);
    ft_cma_peer p;
    ft_cma_peer_init(&p);
    CHECK(ft_cma_door_claim(d, na, 0.2, &p) == FT_ERR_AUTH);
    CHECK(!ft_cma_peer_open(&p));
    /* ... and still B's, once */
    CHECK_OK(ft_cma_door_claim(d, nb, 2.0, &p));
    CHECK(p.pid == c.pid);
    ft_cma_peer_close(&p);
    CHECK(ft_cma_door_claim(d, nb, 0.2, &p) == FT_ERR_AUTH);
    client_stop(&c);
    /* a guessed nonce is nobody's */
    uint8_t guess[FT_CMA_NONCE];
    memset(guess, 0x5a, sizeof guess);
    REQUIRE(client_start(&c, oa, 0, guess) == 0);
    CHECK(ft_cma_door_claim(d, na, 0.2, &p) == FT_ERR_AUTH);
    client_stop(&c);
    /* an offer that names something else is refused by the client */
    uint8_t bad[FT_CMA_OFFER_SIZE];
    memcpy(bad, oa, sizeof bad);
    memcpy(bad + FT_CMA_NONCE, "/tmp/x", 7);
    int fd = -1;
    CHECK(ft_cma_present(bad, &fd) == FT_ERR_PROTOCOL);
    ft_cma_door_close(d);
}

/* Anyone in the network namespace can connect to the door: a flood of
 * silent connections costs a client its shared-memory path at worst (it
 * falls back), never a hang, and the door works again afterwards. */
TEST(cma_door_flood_does_not_hang)
{
    if (!supported()) return;
    ft_cma_door *d = NULL;
    REQUIRE(ft_cma_door_open(&d) == FT_OK);
    uint8_t n[FT_CMA_NONCE], o[FT_CMA_OFFER_SIZE];
    CHECK_OK(ft_cma_door_offer(d, n, o));
    struct sockaddr_un a;
    memset(&a, 0, sizeof a);
    a.sun_family = AF_UNIX;
    size_t nl = strnlen((const char *)o + FT_CMA_NONCE, FT_CMA_NAME);
    memcpy(a.sun_path + 1, o + FT_CMA_NONCE, nl);
    socklen_t al = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + nl);
    int flood[300], nf = 0;
    for (int i = 0; i < 300; i++) {
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0);
        if (fd < 0) break;
        if (connect(fd, (struct sockaddr *)&a, al) != 0 && errno != EAGAIN && errno != EINPROGRESS) {
            close(fd);
            continue;
        }
        flood[nf++] = fd;
    }
    double t0 = ft_now();
    client c;
    REQUIRE(client_start(&c, o, 0, NULL) == 0);
    ft_cma_peer p;
    ft_cma_peer_init(&p);
    ft_status st = ft_cma_door_claim(d, n, 0.5, &p);
    CHECK_MSG(ft_now() - t0 < 10, "%.1f s", ft_now() - t0);
    CHECK(st == FT_OK || st == FT_ERR_AUTH);
    ft_cma_peer_close(&p);
    client_stop(&c);
    for (int i = 0; i < nf; i++) close(flood[i]);
    /* afterwards the door serves again */
    client c2;
    ft_cma_peer_init(&p);
    CHECK_OK(ft_cma_door_offer(d, n, o));
    REQUIRE(client_start(&c2, o, 0, NULL) == 0 && c2.presented);
    CHECK_OK(ft_cma_door_claim(d, n, 2.0, &p));
    ft_cma_peer_close(&p);
    client_stop(&c2);
    ft_cma_door_close(d);
}

TEST(cma_killed_client_refused)
{
    if (!supported()) return;
    ft_cma_door *d = NULL;
    client c;
    ft_cma_peer p;
    REQUIRE(open_verified(&d, &c, &p) == 0);
    uint64_t addr = c.addr;
    pid_t pid = c.pid;
    client_stop(&c);
    /* new processes (one may get the pid back, on a busy system) */
    pid_t kids[8];
    for (int i = 0; i < 8; i++)
        if ((kids[i] = fork()) == 0) { pause(); _exit(0); }
    char got[8];
    CHECK(ft_cma_read(NULL, &p, got, addr, sizeof got) == FT_ERR_AUTH);
    CHECK(ft_cma_write(NULL, &p, got, addr, sizeof got) == FT_ERR_AUTH);
    CHECK(p.pid == pid);
    for (int i = 0; i < 8; i++)
        if (kids[i] > 0) { kill(kids[i], SIGKILL); waitpid(kids[i], NULL, 0); }
    ft_cma_peer_close(&p);
    ft_cma_door_close(d);
}

/* The victim's secret through the kernel alone (what the server could
 * do without its checks). */
static int kernel_read(pid_t pid, uint64_t addr, char *out, size_t n)
{
    struct iovec l = {out, n}, r = {(void *)(uintptr_t)addr, n};
    return process_vm_readv(pid, &l, 1, &r, 1, 0) == (ssize_t)n ? 0 : -1;
}

TEST(cma_exec_of_setuid_helper_refused_root_server)
{
    if (!supported() || !need_root("exec of a setuid helper (root server)")) return;
    /* server and client root: the kernel lets root read anything, so the
     * checks alone must refuse the new program */
    ft_cma_door *d = NULL;
    client c;
    ft_cma_peer p;
    REQUIRE(open_verified(&d, &c, &p) == 0);
    char got[64];
    CHECK_OK(ft_cma_read(NULL, &p, got, c.addr, 8));
    uint64_t sa = 0;
    REQUIRE(client_exec_victim(&c, &sa) == 0);
    CHECK(ft_cma_read(NULL, &p, got, sa, 16) == FT_ERR_AUTH);
    CHECK_MSG(strstr(ft_last_error(), "exec") != NULL, "%s", ft_last_error());
    const char evil[] = "overwritten";
    CHECK(ft_cma_write(NULL, &p, evil, sa, sizeof evil) == FT_ERR_AUTH);
    /* control: the kernel alone would have allowed it, and nothing was
     * written */
    CHECK(kernel_read(c.pid, sa, got, 16) == 0);
    CHECK(memcmp(got, "root-only secret", 16) == 0);
    client_stop(&c);
    ft_cma_peer_close(&p);
    ft_cma_door_close(d);
}

/* Run fn as the other user in a child; its exit code (0 = passed). */
static int as_other_user(int (*fn)(void))
{
    pid_t k = fork();
    if (k == 0) {
        if (become(other_uid, other_gid) != 0) _exit(90);
        _exit(fn());
    }
    int ws = 0;
    waitpid(k, &ws, 0);
    return WIFEXITED(ws) ? WEXITSTATUS(ws) : 99;
}

/* As an ordinary user: the verified client execs the setuid-root helper. */
static int user_server_exec(void)
{
    ft_cma_door *d = NULL;
    client c;
    ft_cma_peer p;
    int r = 0;
    char got[16];
    uint64_t sa = 0;
    if (open_verified(&d, &c, &p) != 0) r = 10;
    else if (ft_cma_read(NULL, &p, got, c.addr, 8) != FT_OK) r = 11;
    else if (client_exec_victim(&c, &sa) != 0) r = 12;
    else if (ft_cma_read(NULL, &p, got, sa, 16) != FT_ERR_AUTH) r = 13;
    else if (ft_cma_write(NULL, &p, "x", sa, 1) != FT_ERR_AUTH) r = 14;
    client_stop(&c);
    ft_cma_peer_close(&p);
    ft_cma_door_close(d);
    return r;
}

TEST(cma_exec_of_setuid_helper_refused_user_server)
{
    if (!supported() || !need_root("exec of a setuid helper (user server)")) return;
    int r = as_other_user(user_server_exec);
    CHECK_MSG(r == 0, "step %d", r);
}

/* As an ordinary user: the verified client turns itself non-dumpable. */
static int user_server_dumpable(void)
{
    ft_cma_door *d = NULL;
    client c;
    ft_cma_peer p;
    int r = 0;
    char got[16];
    uint8_t ok = 0;
    if (open_verified(&d, &c, &p) != 0) r = 20;
    else if (ft_cma_read(NULL, &p, got, c.addr, 8) != FT_OK) r = 21;
    else if (client_cmd(&c, 'd') != 0 || read_full(c.out, &ok, 1) != 0 || !ok) r = 22;
    else if (ft_cma_read(NULL, &p, got, c.addr, 8) != FT_ERR_AUTH) r = 23;
    else if (!strstr(ft_last_error(), "dumpable")) r = 24;
    client_stop(&c);
    ft_cma_peer_close(&p);
    ft_cma_door_close(d);
    return r;
}

TEST(cma_non_dumpable_client_refused)
{
    if (!supported()) return;
    int r;
    if (geteuid() != 0) r = user_server_dumpable();   /* this user is ordinary */
    else if (need_root("non-dumpable client")) r = as_other_user(user_server_dumpable);
    else return;
    CHECK_MSG(r == 0, "step %d", r);
}

TEST(cma_other_uid_refused)
{
    if (!supported() || !need_root("client of another user")) return;
    /* server root, client another user: refused at the door */
    ft_cma_door *d = NULL;
    REQUIRE(ft_cma_door_open(&d) == FT_OK);
    uint8_t n[FT_CMA_NONCE], o[FT_CMA_OFFER_SIZE];
    CHECK_OK(ft_cma_door_offer(d, n, o));
    client c;
    REQUIRE(client_start(&c, o, 1, NULL) == 0 && c.presented);
    ft_cma_peer p;
    ft_cma_peer_init(&p);
    CHECK(ft_cma_door_claim(d, n, 2.0, &p) == FT_ERR_AUTH);
    CHECK_MSG(strstr(ft_last_error(), "uid") != NULL, "%s", ft_last_error());
    CHECK(!ft_cma_peer_open(&p));
    client_stop(&c);
    ft_cma_door_close(d);

    /* a verified client that becomes another user (no exec): refused on
     * the next copy, though the kernel lets this root server copy */
    REQUIRE(open_verified(&d, &c, &p) == 0);
    char got[8];
    CHECK_OK(ft_cma_read(NULL, &p, got, c.addr, 8));
    uint8_t ok = 0;
    REQUIRE(client_cmd(&c, 'u') == 0 && read_full(c.out, &ok, 1) == 0 && ok);
    CHECK(ft_cma_read(NULL, &p, got, c.addr, 8) == FT_ERR_AUTH);
    CHECK_MSG(strstr(ft_last_error(), "uids") != NULL, "%s", ft_last_error());
    CHECK(kernel_read(c.pid, c.addr, got, 8) == 0);   /* control */
    client_stop(&c);
    ft_cma_peer_close(&p);
    ft_cma_door_close(d);

    /* server an ordinary user, client root: refused at the door */
    int sp[2], cp_[2];
    REQUIRE(pipe(sp) == 0 && pipe(cp_) == 0);
    pid_t srv = fork();
    if (srv == 0) {
        ft_cma_door *sd = NULL;
        uint8_t sn[FT_CMA_NONCE], so[FT_CMA_OFFER_SIZE];
        if (ft_cma_door_open(&sd) != FT_OK || ft_cma_door_offer(sd, sn, so) != FT_OK) _exit(30);
        if (become(other_uid, other_gid) != 0) _exit(31);
        if (write(sp[1], so, sizeof so) != (ssize_t)sizeof so) _exit(32);
        char go;
        if (read_full(cp_[0], &go, 1) != 0) _exit(33);
        ft_cma_peer sp_;
        ft_cma_peer_init(&sp_);
        ft_status st = ft_cma_door_claim(sd, sn, 2.0, &sp_);
        _exit(st == FT_ERR_AUTH && strstr(ft_last_error(), "uid") ? 0 : 34);
    }
    uint8_t so[FT_CMA_OFFER_SIZE];
    REQUIRE(read_full(sp[0], so, sizeof so) == 0);
    REQUIRE(client_start(&c, so, 0, NULL) == 0 && c.presented);
    CHECK(write(cp_[1], "g", 1) == 1);
    int ws = 0;
    waitpid(srv, &ws, 0);
    CHECK_MSG(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "server step %d", WIFEXITED(ws) ? WEXITSTATUS(ws) : -1);
    client_stop(&c);
    close(sp[0]); close(sp[1]); close(cp_[0]); close(cp_[1]);
}

/* ---------------------------------------------- through the memory node */

/* GETRV of key's first n bytes into addr (in the verified process). */
static ft_status node_getrv(int fd, const char *key, uint64_t addr, uint64_t n)
{
    uint8_t b[FT_MSG_GETRV_SIZE];
    memset(b, 0, sizeof b);
    ft_put_le64(b + 16, n);
    ft_put_le64(b + 24, addr);
    ft_put_le64(b + 32, n);
    ft_msg m;
    uint8_t r[FT_MSG_MAX_DETAIL];
    if (raw_send(fd, FT_OP_GETRV, 9, key, b, sizeof b, 0, 0, 0) || raw_recv(fd, &m, r, sizeof r, 5000))
        return FT_ERR_NET;
    return (ft_status)m.status;
}

static ft_status node_cmab(int fd, uint64_t step, uint8_t *offer)
{
    ft_msg m;
    uint8_t r[FT_MSG_MAX_DETAIL];
    if (raw_send(fd, FT_OP_CMAB, 3, NULL, NULL, 0, 0, step, 0) || raw_recv(fd, &m, r, sizeof r, 5000))
        return FT_ERR_NET;
    if (m.status == FT_OK && offer) {
        if (m.data_len != FT_CMA_OFFER_SIZE) return FT_ERR_PROTOCOL;
        memcpy(offer, r, FT_CMA_OFFER_SIZE);
    }
    return (ft_status)m.status;
}

/* The attacks through `flextier serve` with a raw client: the old form
 * (a pid the client names), a process presenting another session's
 * nonce, then a verified process that exits (and, as root, one that
 * execs the setuid helper): the node's next copy is refused. */
TEST(cma_node_end_to_end)
{
    if (!supported()) return;
    srv_t srv;
    const char *args[] = {"--capacity", "64M", NULL};
    int up_ = srv_start(&srv, "127.0.0.1:0", args);
    REQUIRE(up_ == 0);
    /* a tensor to read */
    ft_store *s = NULL;
    ft_store_params sp;
    ft_store_default_params(&sp);
    setenv("FLEXTIER_TRANSPORT", "tcp", 1);
    CHECK_OK(ft_store_open(srv.uri, &sp, &s));
    unsetenv("FLEXTIER_TRANSPORT");
    static uint8_t data[4096];
    for (size_t i = 0; i < sizeof data; i++) data[i] = (uint8_t)(i * 13 + 5);
    int64_t shape[1] = {sizeof data};
    ft_tensor t;
    ft_tensor_init(&t, FT_U8, 1, shape, data);
    CHECK_OK(ft_write_tensor(s, "k", &t, NULL));
    ft_store_close(s);

    int fd = raw_connect(srv.port, NULL);
    REQUIRE(fd >= 0);
    REQUIRE(raw_handshake(fd, NULL, NULL, NULL) == FT_OK);
    /* protocol 2's CMAB: a pid and a probe address the client names */
    uint8_t probe[48] = {0};
    ft_msg m;
    uint8_t r[FT_MSG_MAX_DETAIL];
    CHECK(raw_send(fd, FT_OP_CMAB, 4, NULL, probe, sizeof probe, 0, (uint64_t)getpid(), 0) == 0);
    int rr = raw_recv(fd, &m, r, sizeof r, 5000);
    CHECK(rr != 0 || m.status != FT_OK);
    close(fd);
    /* another session's nonce: refused; a second offer on the connection
     * too */
    fd = raw_connect(srv.port, NULL);
    REQUIRE(fd >= 0 && raw_handshake(fd, NULL, NULL, NULL) == FT_OK);
    int fd2 = raw_connect(srv.port, NULL);
    REQUIRE(fd2 >= 0 && raw_handshake(fd2, NULL, NULL, NULL) == FT_OK);
    uint8_t o1[FT_CMA_OFFER_SIZE], o2[FT_CMA_OFFER_SIZE];
    CHECK_OK(node_cmab(fd, FT_CMAB_OFFER, o1));
    CHECK_OK(node_cmab(fd2, FT_CMAB_OFFER, o2));
    client c;
    REQUIRE(client_start(&c, o2, 0, NULL) == 0 && c.presented);
    CHECK(node_cmab(fd, FT_CMAB_CLAIM, NULL) == FT_ERR_AUTH);
    CHECK(node_cmab(fd, FT_CMAB_OFFER, o1) == FT_ERR_PROTOCOL);
    CHECK(node_getrv(fd, "k", c.addr, 64) != FT_OK);   /* no path: refused */
    close(fd);
    /* session 2 is the one: its process verified, copies work */
    CHECK_OK(node_cmab(fd2, FT_CMAB_CLAIM, NULL));
    CHECK_OK(node_getrv(fd2, "k", c.addr, 64));
    if (need_root("exec of a setuid helper through the node")) {
        uint64_t sa = 0;
        REQUIRE(client_exec_victim(&c, &sa) == 0);
        CHECK(node_getrv(fd2, "k", sa, 16) == FT_ERR_AUTH);
        char got[16];
        CHECK(kernel_read(c.pid, sa, got, 16) == 0 && memcmp(got, "root-only secret", 16) == 0);
    }
    /* the process exits: no copy reaches whatever has its pid next */
    client_stop(&c);
    pid_t kids[8];
    for (int i = 0; i < 8; i++)
        if ((kids[i] = fork()) == 0) { pause(); _exit(0); }
    CHECK(node_getrv(fd2, "k", c.addr, 64) == FT_ERR_AUTH);
    for (int i = 0; i < 8; i++)
        if (kids[i] > 0) { kill(kids[i], SIGKILL); waitpid(kids[i], NULL, 0); }
    close(fd2);
    CHECK(srv_stop(&srv) == 0);
}

/* Whole frames on the shared-memory path (the offloader's layer reads,
 * ft_read_frame_async, and ft_store_get_frame) come by reference: the
 * node writes them into the caller's memory in ranges, not on the TCP
 * connection. The same bytes as over TCP; a caller's buffer one byte
 * short is refused as on TCP. */
TEST(cma_frames_by_reference)
{
    if (!supported()) return;
    srv_t srv;
    const char *args[] = {"--capacity", "256M", NULL};
    int up_ = srv_start(&srv, "127.0.0.1:0", args);
    REQUIRE(up_ == 0);
    ft_store *tcp = NULL, *shm = NULL;
    ft_store_params sp;
    ft_store_default_params(&sp);
    setenv("FLEXTIER_TRANSPORT", "tcp", 1);
    CHECK_OK(ft_store_open(srv.uri, &sp, &tcp));
    unsetenv("FLEXTIER_TRANSPORT");
    /* 4 KiB (one range) and 40 MiB + 123 (three ranges, the last short) */
    const size_t sizes[2] = {4096, (40u << 20) + 123};
    const char *keys[2] = {"small", "big"};
    uint8_t *data = malloc(sizes[1]);
    REQUIRE(data);
    for (size_t i = 0; i < sizes[1]; i++) data[i] = (uint8_t)(i * 131 + (i >> 13));
    for (int k = 0; k < 2; k++) {
        int64_t shape[1] = {(int64_t)sizes[k]};
        ft_tensor t;
        ft_tensor_init(&t, FT_U8, 1, shape, data);
        CHECK_OK(ft_write_tensor(tcp, keys[k], &t, NULL));
    }
    void *ref[2] = {NULL, NULL};
    size_t rsz[2] = {0, 0};
    uint64_t t0 = ft_test_tcp_received(srv.port);
    if (t0 == UINT64_MAX) {
        fprintf(stderr, "  SKIP: the kernel does not count a TCP socket's bytes\n");
        goto out;
    }
    for (int k = 0; k < 2; k++) CHECK_OK(ft_store_get_frame(tcp, keys[k], &ref[k], &rsz[k]));
    /* the measure works: over TCP the frames crossed the connection */
    CHECK(ft_test_tcp_received(srv.port) - t0 >= rsz[0] + rsz[1]);
    REQUIRE(ref[0] && ref[1] && rsz[1] > sizes[1]);
    setenv("FLEXTIER_TRANSPORT", "cma", 1);
    CHECK_OK(ft_store_open(srv.uri, &sp, &shm));
    unsetenv("FLEXTIER_TRANSPORT");
    REQUIRE(shm);
    uint64_t c0 = ft_test_tcp_received(srv.port);
    for (int k = 0; k < 2; k++) {
        void *f = NULL;
        size_t n = 0;
        CHECK_OK(ft_store_get_frame(shm, keys[k], &f, &n));
        CHECK(n == rsz[k] && f && !memcmp(f, ref[k], n));
        ft_free_aligned(f);
        /* into a buffer of exactly the frame's size, and of more */
        for (size_t extra = 0; extra <= 4096; extra += 4096) {
            uint8_t *buf = ft_malloc_aligned(rsz[k] + extra, 64);
            REQUIRE(buf);
            ft_request *r = NULL;
            size_t got = 0;
            CHECK_OK(ft_read_frame_async(shm, keys[k], buf, rsz[k] + extra, &got, &r));
            CHECK_OK(ft_request_wait(r, 30000));
            ft_request_free(r);
            CHECK(got == rsz[k] && !memcmp(buf, ref[k], got));
            ft_free_aligned(buf);
        }
    }
    uint64_t moved = ft_test_tcp_received(srv.port) - c0;
    CHECK_MSG(moved < (1u << 20), "%llu bytes of %zu came on the TCP connection", (unsigned long long)moved,
              3 * (rsz[0] + rsz[1]));
    /* one byte short: refused, as over TCP */
    {
        uint8_t *buf = ft_malloc_aligned(rsz[1], 64);
        REQUIRE(buf);
        for (int path = 0; path < 2; path++) {
            ft_request *r = NULL;
            size_t got = 0;
            CHECK_OK(ft_read_frame_async(path ? shm : tcp, "big", buf, rsz[1] - 1, &got, &r));
            CHECK(ft_request_wait(r, 30000) == FT_ERR_BUFFER_SMALL);
            ft_request_free(r);
        }
        ft_free_aligned(buf);
    }
out:
    ft_free_aligned(ref[0]);
    ft_free_aligned(ref[1]);
    free(data);
    ft_store_close(shm);
    ft_store_close(tcp);
    CHECK(srv_stop(&srv) == 0);
}

/* Install the setuid-root helper (root only). */
static void setup_victim(void)
{
    struct passwd *pw = getpwnam("nobody");
    if (pw && pw->pw_uid != 0) {
        other_uid = pw->pw_uid;
        other_gid = pw->pw_gid;
    }
    if (geteuid() != 0) return;
    char self[PATH_MAX], src[PATH_MAX + 16];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return;
    self[n] = 0;
    char *slash = strrchr(self, '/');
    if (!slash) return;
    *slash = 0;
    snprintf(src, sizeof src, "%s/cma_victim", self);
    snprintf(victim_dir, sizeof victim_dir, "/tmp/ft-cma-XXXXXX");
    if (!mkdtemp(victim_dir)) return;
    chmod(victim_dir, 0755);
    char dst[PATH_MAX];
    snprintf(dst, sizeof dst, "%s/victim", victim_dir);
    int in = open(src, O_RDONLY), out = open(dst, O_WRONLY | O_CREAT | O_EXCL, 0700);
    char buf[65536];
    ssize_t r;
    int ok = in >= 0 && out >= 0;
    while (ok && (r = read(in, buf, sizeof buf)) > 0) ok = write(out, buf, (size_t)r) == r;
    if (in >= 0) close(in);
    if (out >= 0) close(out);
    if (ok && chown(dst, 0, 0) == 0 && chmod(dst, 04755) == 0) snprintf(victim, sizeof victim, "%s", dst);
    else fprintf(stderr, "  cannot install the setuid helper from %s\n", src);
}

__attribute__((constructor(200))) static void cma_setup(void) { setup_victim(); }

__attribute__((destructor)) static void cma_teardown(void)
{
    if (victim[0]) unlink(victim);
    if (victim_dir[0]) rmdir(victim_dir);
}
