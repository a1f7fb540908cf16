/* The front door of the codec agent and the pipeline worker (issue 21):
 * every attack tried against them, as an automated test. The processes
 * are started with FT_BIN (the sanitizer build runs them under ASan);
 * raw TCP and UCT clients in this process. Each test checks that the
 * attack is refused, that the process is alive and serving a legitimate
 * client, and, where data is involved, that nothing changed. */
#define _GNU_SOURCE   /* memmem */
#include "ft_test.h"
#include "flextier/store.h"
#include "support/cli_run.h"
#include "support/procs.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "net/agent_msg.h"
#include "net/attack_util.h"
#include "net/net.h"
#include "net/raw_client.h"

static const char TOKEN[] = "door-test-token-0123456789abcdef";

static int make_token(char *buf, size_t n, const char *content, mode_t mode)
{
    return make_token_file(buf, n, "ft_door_tok", content, mode);
}

static int alive(const ft_proc *p) { return p->pid > 0 && waitpid(p->pid, NULL, WNOHANG) == 0; }

static int start_node(ft_proc *node, const char *tok, int trusted)
{
    const char *a[10] = {"--listen", "127.0.0.1:0", "--capacity", "64M"};
    int n = 4;
    if (tok) { a[n++] = "--token-file"; a[n++] = tok; }
    if (trusted) a[n++] = "--trusted-network";
    a[n] = NULL;
    return ft_proc_start(node, "serve", a);
}

/* An agent in front of node, its clients' token tok, the node's ntok. */
static int start_agent(ft_proc *agent, const ft_proc *node, const char *tok, const char *ntok, int trusted)
{
    static char uri[80];
    snprintf(uri, sizeof uri, "ucx://%s", node->hostport);
    const char *a[14] = {"--listen", "127.0.0.1:0", "--node", uri, "--threads", "2"};
    int n = 6;
    if (tok) { a[n++] = "--token-file"; a[n++] = tok; }
    if (ntok) { a[n++] = "--node-token-file"; a[n++] = ntok; }
    if (trusted) a[n++] = "--trusted-network";
    a[n] = NULL;
    return ft_proc_start(agent, "agent", a);
}

static int start_worker(ft_proc *w, const char *tok)
{
    const char *a[6] = {"--listen", "127.0.0.1:0"};
    int n = 2;
    if (tok) { a[n++] = "--token-file"; a[n++] = tok; }
    a[n] = NULL;
    return ft_proc_start(w, "worker", a);
}

static ft_status open_agent(const ft_proc *agent, const char *tok, ft_store **out)
{
    ft_store_params p;
    ft_store_default_params(&p);
    p.token_file = tok;
    p.timeout_ms = 8000;
    return ft_store_open(agent->uri, &p, out);
}

/* A legitimate client writes through the agent and reads back. */
static int agent_serves(const ft_proc *agent, const char *tok, const char *key)
{
    ft_store *s = NULL;
    if (open_agent(agent, tok, &s) != FT_OK) return 0;
    float v[256], back[256];
    for (int i = 0; i < 256; i++) v[i] = (float)i * 0.5f;
    int64_t sh[1] = {256};
    ft_tensor t;
    ft_tensor_init(&t, FT_F32, 1, sh, v);
    ft_tensor o;
    ft_tensor_init(&o, FT_F32, 1, sh, back);
    int ok = ft_write_tensor(s, key, &t, NULL) == FT_OK &&
             ft_read_tensor_into(s, key, &o, sizeof back) == FT_OK && !memcmp(v, back, sizeof v);
    ft_store_close(s);
    return ok;
}

/* `flextier CMD ARGS` run for at most 3 s: exit status (124: still
 * running, i.e. it started), stdout+stderr into out. */
static int run_for(const char *cmd, const char *args, char *out, size_t n)
{
    char path[] = "/tmp/ft_door_outXXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) return -1;
    close(fd);
    char line[2048];
    snprintf(line, sizeof line, "timeout -k 10 -s TERM 3 '%s' %s %s >'%s' 2>&1", ft_test_bin(), cmd, args, path);
    int st = system(line);
    FILE *f = fopen(path, "r");
    size_t got = f ? fread(out, 1, n - 1, f) : 0;
    if (f) fclose(f);
    out[got] = 0;
    unlink(path);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* ------------------------------------------------------ UCX RMA PUT */

/* Attack (critical): the agent's UCX TCP transport listened on every
 * interface and executed a peer's RMA PUT to any address before login (a
 * peer overwrote the agent's token in memory; a PUT to 0x10 crashed it).
 * Now the agent and the worker listen on exactly their port, the front
 * door, which closes a UCT peer at its first bytes. */
TEST(door_no_ucx_listener_before_login)
{
    char tok[64];
    REQUIRE(make_token(tok, sizeof tok, TOKEN, 0600) == 0);
    ft_proc node, agent, worker;
    int up = start_node(&node, NULL, 0);
    REQUIRE(up == 0);
    up = start_agent(&agent, &node, tok, NULL, 0);
    REQUIRE(up == 0);
    up = start_worker(&worker, tok);
    REQUIRE(up == 0);
    REQUIRE(agent_serves(&agent, tok, "before"));
    const ft_proc *procs[2] = {&agent, &worker};
    const char *names[2] = {"agent", "worker"};
    for (int k = 0; k < 2; k++) {
        char ls[16][64], want[64];
        int n = listening_sockets(procs[k]->pid, ls, 16);
        snprintf(want, sizeof want, "127.0.0.1:%d", procs[k]->port);
        printf("     %s: %d listening socket(s), first %s\n", names[k], n, n ? ls[0] : "-");
        CHECK_MSG(n == 1 && !strcmp(ls[0], want), "%s: %d listening sockets", names[k], n);
        /* the PUTs of the attack, through every port it listens on */
        static uint8_t junk[4096];
        memset(junk, 0x5a, sizeof junk);
        for (int i = 0; i < n; i++) {
            int port = atoi(strrchr(ls[i], ':') + 1);
            uct_tcp_put(port, 0x10, "x", 1);
            uct_tcp_put(port, 0x400000, junk, sizeof junk);
        }
        CHECK_MSG(alive(procs[k]), "%s died", names[k]);
    }
    CHECK(agent_serves(&agent, tok, "after"));
    CHECK(ft_proc_stop(&worker, 0) == 0);
    CHECK(ft_proc_stop(&agent, 0) == 0);
    CHECK(ft_proc_stop(&node, 0) == 0);
    unlink(tok);
}

/* ------------------------------------------------- pre-auth denial */

typedef struct {
    int *fds;
    int n;
    volatile int stop;
} trickle_arg;

/* One byte of a HELLO header every 150 ms on each connection: never
 * quiet, never done. */
static void *trickle_main(void *arg)
{
    trickle_arg *t = arg;
    uint8_t h[FT_MSG_HDR_SIZE];
    ft_msg m;
    memset(&m, 0, sizeof m);
    m.opcode = FT_OP_HELLO;
    m.data_len = FT_MSG_NONCE;
    ft_msg_encode(h, &m);
    for (unsigned k = 0; !t->stop && k < FT_MSG_HDR_SIZE; k++) {
        for (int i = 0; i < t->n; i++)
            if (t->fds[i] >= 0) send(t->fds[i], h + k, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
        usleep(150000);
    }
    return NULL;
}

/* Attack: four silent connections made every pipeline run fail (the
 * worker handshook one at a time, 5 s each); 600 trickling connections
 * from distinct loopback addresses made a client of the node time out at
 * 30 s. Now the handshakes run concurrently, silent connections go first
 * under pressure, trickling ones after 1 s without a complete message:
 * the worker, the agent and the node, one front door. */
TEST(door_silent_and_trickling_connections)
{
    char tok[64];
    REQUIRE(make_token(tok, sizeof tok, TOKEN, 0600) == 0);
    ft_proc node, agent, worker;
    int up = start_node(&node, NULL, 0);
    REQUIRE(up == 0);
    up = start_agent(&agent, &node, tok, NULL, 0);
    REQUIRE(up == 0);
    up = start_worker(&worker, tok);
    REQUIRE(up == 0);
    const ft_proc *procs[3] = {&worker, &agent, &node};
    const char *names[3] = {"worker", "agent", "node"};
    enum { SILENT = 100, TRICKLE = 600 };
    for (int k = 0; k < 3; k++) {
        int silent[SILENT], tr[TRICKLE];
        for (int i = 0; i < SILENT; i++) silent[i] = raw_connect(procs[k]->port, "127.0.0.2");
        for (int i = 0; i < TRICKLE; i++) {
            char src[32];
            snprintf(src, sizeof src, "127.0.%d.%d", 10 + i / 200, 1 + i % 200);
            tr[i] = raw_connect(procs[k]->port, src);
        }
        trickle_arg ta = {tr, TRICKLE, 0};
        pthread_t th;
        pthread_create(&th, NULL, trickle_main, &ta);
        usleep(300000);
        double t0 = ft_now();
        int ok;
        if (k == 0) {   /* a driver's handshake with the worker */
            int fd = raw_connect(procs[k]->port, NULL);
            ok = fd >= 0 && raw_handshake(fd, TOKEN, NULL, NULL) == FT_OK;
            if (fd >= 0) close(fd);
        } else if (k == 1) {
            ok = agent_serves(&agent, tok, "behind");
        } else {   /* the node's own clients (it runs without a token here) */
            ft_store_params sp;
            ft_store_default_params(&sp);
            sp.timeout_ms = 8000;
            ft_store *s = NULL;
            ok = ft_store_open(node.uri, &sp, &s) == FT_OK;
            ft_store_close(s);
        }
        double dt = ft_now() - t0;
        printf("     %s: a real client behind %d silent and %d trickling connections: %s after %.2f s\n",
               names[k], SILENT, TRICKLE, ok ? "in" : "NOT in", dt);
        CHECK(ok);
        CHECK_MSG(dt < 8.0, "%.2f s", dt);   /* was a 30 s timeout */
        ta.stop = 1;
        pthread_join(th, NULL);
        for (int i = 0; i < SILENT; i++) if (silent[i] >= 0) close(silent[i]);
        for (int i = 0; i < TRICKLE; i++) if (tr[i] >= 0) close(tr[i]);
        CHECK(alive(procs[k]));
    }
    /* a driver that authenticates while another driver holds the worker
     * is told so at once (not queued behind the whole run); once the
     * first closes, the next gets in */
    int a = raw_connect(worker.port, NULL), b = raw_connect(worker.port, NULL);
    CHECK(raw_handshake(a, TOKEN, NULL, NULL) == FT_OK);
    usleep(200000);   /* the worker takes it */
    CHECK(raw_handshake(b, TOKEN, NULL, NULL) == FT_ERR_BUSY);
    close(b);
    close(a);
    int in = 0;
    for (int i = 0; i < 40 && !in; i++) {
        int c = raw_connect(worker.port, NULL);
        in = raw_handshake(c, TOKEN, NULL, NULL) == FT_OK;
        close(c);
        if (!in) usleep(100000);
    }
    CHECK(in);
    CHECK(ft_proc_stop(&worker, 0) == 0);
    CHECK(ft_proc_stop(&agent, 0) == 0);
    CHECK(ft_proc_stop(&node, 0) == 0);
    unlink(tok);
}

/* Attack: one wrong proof per back-off period from 127.0.0.1 locked out
 * 12 of 12 legitimate local clients, and they stayed locked out after the
 * attacker stopped. Now a loopback address (or one a client authenticated
 * from) is never refused: the guesser's own connections are held back. */
TEST(door_wrong_proofs_do_not_lock_out_the_address)
{
    char tok[64];
    REQUIRE(make_token(tok, sizeof tok, TOKEN, 0600) == 0);
    ft_proc node, agent;
    int up = start_node(&node, NULL, 0);
    REQUIRE(up == 0);
    up = start_agent(&agent, &node, tok, NULL, 0);
    REQUIRE(up == 0);
    /* the attacker first, before any real client: 8 wrong proofs */
    uint8_t guess[FT_MSG_PROOF];
    memset(guess, 0x42, sizeof guess);
    int fds[8], answered = 0;
    for (int i = 0; i < 8; i++) {
        fds[i] = raw_connect(agent.port, NULL);
        uint8_t nc[FT_MSG_NONCE] = {(uint8_t)i}, buf[256];
        ft_msg m;
        raw_send(fds[i], FT_OP_HELLO, 1, NULL, nc, sizeof nc, 0, 0, 0);
        if (raw_recv(fds[i], &m, buf, sizeof buf, 3000) != 0) continue;
        raw_send(fds[i], FT_OP_AUTH, 2, NULL, guess, sizeof guess, 0, 0, 0);
        if (raw_recv(fds[i], &m, buf, sizeof buf, 200) == 0 && m.status == FT_ERR_AUTH) answered++;
    }
    printf("     8 wrong proofs from 127.0.0.1: %d answered at once, the rest held back\n", answered);
    CHECK(answered == 2);
    double t0 = ft_now();
    int in = 0;
    for (int i = 0; i < 12; i++) in += agent_serves(&agent, tok, "local");
    printf("     12 real clients of 127.0.0.1 meanwhile: %d in, %.2f s\n", in, ft_now() - t0);
    CHECK(in == 12);
    for (int i = 0; i < 8; i++) if (fds[i] >= 0) close(fds[i]);
    CHECK(alive(&agent));
    CHECK(ft_proc_stop(&agent, 0) == 0);
    CHECK(ft_proc_stop(&node, 0) == 0);
    unlink(tok);
}

/* --------------------------------------------- UCX worker addresses */

static void random_bytes(uint8_t *b, size_t n, uint64_t seed)
{
    for (size_t i = 0; i < n; i++) b[i] = (uint8_t)ft_test_rand(&seed);
}

/* Real worker addresses pass the check, every truncation and the bytes
 * after the end fail it, random bytes fail it and never reach
 * ucp_ep_create (which asserted on them). */
TEST(ucx_address_check)
{
    ucp_context_h ctx = NULL;
    ucp_worker_h w = NULL;
    int efd = -1;
    ft_net_ucx_opts o = {1, NULL, NULL, 0, 0, "tcp"};
    ucs_status_t s = ft_net_ucp_open("test-door", &o, &ctx, &w, &efd);
    REQUIRE(s == UCS_OK);
    ucp_address_t *a = NULL;
    size_t n = 0;
    REQUIRE(ucp_worker_get_address(w, &a, &n) == UCS_OK);
    CHECK_OK(ft_net_ucx_addr_check(a, n));
    uint8_t *copy = malloc(n + 1);
    memcpy(copy, a, n);
    int trunc_ok = 0;
    for (size_t k = 0; k < n; k++) trunc_ok += ft_net_ucx_addr_check(copy, k) == FT_OK;
    CHECK_MSG(trunc_ok == 0, "%d truncations of a %zu-byte address accepted", trunc_ok, n);
    copy[n] = 0;
    CHECK(ft_net_ucx_addr_check(copy, n + 1) == FT_ERR_PROTOCOL);
    /* our own address: an endpoint to it works */
    ucp_ep_h ep = NULL;
    CHECK(ft_net_ucp_connect(w, a, n, NULL, NULL, &ep) == UCS_OK);
    if (ep) {
        ucp_request_param_t p;
        memset(&p, 0, sizeof p);
        p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
        p.flags = UCP_EP_CLOSE_FLAG_FORCE;
        ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &p);
        while (r && !UCS_PTR_IS_ERR(r) && ucp_request_check_status(r) == UCS_INPROGRESS) ucp_worker_progress(w);
        if (r && !UCS_PTR_IS_ERR(r)) ucp_request_free(r);
    }
    /* random bytes, and random bit flips of the real address */
    static uint8_t rnd[300];
    int accepted = 0, flip_ok = 0;
    for (uint64_t seed = 1; seed <= 20000; seed++) {
        random_bytes(rnd, sizeof rnd, seed);
        if (ft_net_ucx_addr_check(rnd, sizeof rnd) == FT_OK) {
            accepted++;
            continue;
        }
        if (seed <= 200) {   /* refused before UCX sees it */
            ucp_ep_h e2 = NULL;
            CHECK(ft_net_ucp_connect(w, rnd, sizeof rnd, NULL, NULL, &e2) == UCS_ERR_INVALID_ADDR && !e2);
        }
        memcpy(copy, a, n);
        uint64_t x = seed;
        copy[ft_test_rand(&x) % n] ^= (uint8_t)(1u << (ft_test_rand(&x) % 8));
        flip_ok += ft_net_ucx_addr_check(copy, n) == FT_OK;
    }
    printf("     %zu-byte address (version %u): 20000 random 300-byte buffers, %d accepted; "
           "%d of 20000 one-bit flips still well-formed\n", n, ((uint8_t *)a)[0] & 15u, accepted, flip_ok);
    CHECK(accepted == 0);
    free(copy);
    ucp_worker_release_address(w, a);
    ucp_worker_destroy(w);
    ucp_cleanup(ctx);
    /* every transport UCX has here (shared memory too) and the worker
     * name (UCX_ADDRESS_DEBUG_INFO), in both formats */
    for (int v = 0; v < 2; v++) {
        if (v) setenv("UCX_ADDRESS_VERSION", "v2", 1);
        setenv("UCX_ADDRESS_DEBUG_INFO", "y", 1);
        ucp_config_t *cfg = NULL;
        ucp_context_h c2 = NULL;
        ucp_worker_h w2 = NULL;
        int ok = ucp_config_read(NULL, NULL, &cfg) == UCS_OK && ucp_config_modify(cfg, "TLS", "all") == UCS_OK;
        ucp_params_t up;
        memset(&up, 0, sizeof up);
        up.field_mask = UCP_PARAM_FIELD_FEATURES;
        up.features = UCP_FEATURE_AM | UCP_FEATURE_RMA;
        ok = ok && ucp_init(&up, cfg, &c2) == UCS_OK;
        if (cfg) ucp_config_release(cfg);
        ucp_worker_params_t wp;
        memset(&wp, 0, sizeof wp);
        ok = ok && ucp_worker_create(c2, &wp, &w2) == UCS_OK;
        ucp_address_t *a2 = NULL;
        size_t n2 = 0;
        ok = ok && ucp_worker_get_address(w2, &a2, &n2) == UCS_OK;
        unsetenv("UCX_ADDRESS_VERSION");
        unsetenv("UCX_ADDRESS_DEBUG_INFO");
        CHECK(ok);
        if (ok) {
            printf("     all transports, worker name, format %d: %zu bytes\n", v + 1, n2);
            CHECK_OK(ft_net_ucx_addr_check(a2, n2));
            ucp_worker_release_address(w2, a2);
        }
        if (w2) ucp_worker_destroy(w2);
        if (c2) ucp_cleanup(c2);
    }
    /* UCX's address format 2 (UCX_ADDRESS_VERSION=v2) passes too */
    setenv("UCX_ADDRESS_VERSION", "v2", 1);
    ctx = NULL;
    w = NULL;
    s = ft_net_ucp_open("test-door-v2", &o, &ctx, &w, &efd);
    unsetenv("UCX_ADDRESS_VERSION");
    REQUIRE(s == UCS_OK);
    REQUIRE(ucp_worker_get_address(w, &a, &n) == UCS_OK);
    printf("     format 2: a %zu-byte address, version byte %u\n", n, ((uint8_t *)a)[0] & 15u);
    CHECK((((uint8_t *)a)[0] & 15u) == 1);
    CHECK_OK(ft_net_ucx_addr_check(a, n));
    CHECK(ft_net_ucx_addr_check(a, n - 1) == FT_ERR_PROTOCOL);
    ucp_worker_release_address(w, a);
    ucp_worker_destroy(w);
    ucp_cleanup(ctx);
}

/* Attack: 300 random bytes where a UCX worker address is expected abort
 * the agent (any peer, if it has no token), the worker and a
 * --trusted-network node (UCX assertion). Now a protocol error that
 * closes that connection only. (The worker takes addresses only after a
 * job built its stage; its path is ft_net_ucp_connect, checked above.) */
TEST(door_random_bytes_as_ucx_address)
{
    char tok[64];
    REQUIRE(make_token(tok, sizeof tok, TOKEN, 0600) == 0);
    ft_proc node, agent;
    int up = start_node(&node, tok, 1);
    REQUIRE(up == 0);
    up = start_agent(&agent, &node, tok, tok, 1);
    REQUIRE(up == 0);
    static uint8_t rnd[300];
    random_bytes(rnd, sizeof rnd, 21);
    REQUIRE(ft_net_ucx_addr_check(rnd, sizeof rnd) != FT_OK);
    /* the agent: HELLO with the bytes as the client's worker address */
    int fd = raw_connect(agent.port, NULL);
    CHECK(raw_handshake(fd, TOKEN, NULL, NULL) == FT_OK);
    uint8_t body[FT_AMSG_MAX_HELLO], h[FT_AMSG_MAX_HDR];
    size_t bl = ft_amsg_hello_encode(body, sizeof body, "", rnd, sizeof rnd);
    size_t hl = ft_amsg_encode(h, FT_AOP_HELLO, 1, 0, NULL, 0, bl, 0, 0, 0);
    CHECK(raw_write(fd, h, hl) == 0 && raw_write(fd, body, bl) == 0);
    CHECK(raw_closed(fd, 3000));
    close(fd);
    CHECK(alive(&agent));
    setenv("FLEXTIER_AGENT_NO_CMA", "1", 1);   /* the UCX RMA path still works for others */
    CHECK(agent_serves(&agent, tok, "rma"));
    unsetenv("FLEXTIER_AGENT_NO_CMA");
    /* the node: UCXB with the bytes */
    fd = raw_connect(node.port, NULL);
    CHECK(raw_handshake(fd, TOKEN, NULL, NULL) == FT_OK);
    CHECK(raw_send(fd, FT_OP_UCXB, 5, NULL, rnd, sizeof rnd, 0, 0, 0) == 0);
    CHECK(raw_closed(fd, 3000));
    close(fd);
    CHECK(alive(&node));
    CHECK(agent_serves(&agent, tok, "after"));   /* the agent's own node session too */
    CHECK(ft_proc_stop(&agent, 0) == 0);
    CHECK(ft_proc_stop(&node, 0) == 0);
    unlink(tok);
}

/* ------------------------------------------------------ configuration */

/* Attack (high): the agent accepted token files that are world-readable,
 * one byte long or owned by another user. The agent, the worker and the
 * node check them with one function (ft_net_read_token). */
TEST(door_token_files_checked)
{
    ft_proc node;
    int up = start_node(&node, NULL, 0);
    REQUIRE(up == 0);
    char open_[64], shortf[64], dir[] = "/tmp/ft_door_dirXXXXXX", other[64];
    REQUIRE(make_token(open_, sizeof open_, TOKEN, 0644) == 0);
    REQUIRE(make_token(shortf, sizeof shortf, "x", 0600) == 0);
    REQUIRE(make_token(other, sizeof other, TOKEN, 0600) == 0);
    REQUIRE(mkdtemp(dir) != NULL);
    int root = geteuid() == 0;
    if (root) CHECK(chown(other, 65534, 65534) == 0);
    else printf("     (not root: the other-user case is skipped)\n");
    struct { const char *file, *want; } cases[4] = {
        {open_, "group or others"}, {shortf, "at least 16"}, {dir, "not a regular file"},
        {other, "another user"}};
    for (int k = 0; k < 3; k++) {
        for (int i = 0; i < (root ? 4 : 3); i++) {
            char args[512], out[4096];
            if (k == 0)
                snprintf(args, sizeof args, "--listen 127.0.0.1:0 --node %s --token-file %s", node.uri, cases[i].file);
            else if (k == 1)
                snprintf(args, sizeof args, "--listen 127.0.0.1:0 --token-file %s", cases[i].file);
            else
                snprintf(args, sizeof args, "--listen 127.0.0.1:0 --capacity 16M --token-file %s", cases[i].file);
            const char *cmd = k == 0 ? "agent" : k == 1 ? "worker" : "serve";
            int rc = run_for(cmd, args, out, sizeof out);
            int ok = rc != 0 && rc != 124 && strstr(out, cases[i].want) && !strstr(out, "listening on");
            CHECK_MSG(ok, "%s with %s: rc %d, '%s'", cmd, cases[i].want, rc, out);
        }
    }
    /* the client side: the agent:// client refuses a loose token file too */
    ft_proc agent;
    char tok[64];
    REQUIRE(make_token(tok, sizeof tok, TOKEN, 0600) == 0);
    up = start_agent(&agent, &node, tok, NULL, 0);
    REQUIRE(up == 0);
    ft_store *s = NULL;
    CHECK(open_agent(&agent, open_, &s) == FT_ERR_INVALID_ARG);
    CHECK(open_agent(&agent, tok, &s) == FT_OK);
    ft_store_close(s);
    CHECK(ft_proc_stop(&agent, 0) == 0);
    CHECK(ft_proc_stop(&node, 0) == 0);
    unlink(open_); unlink(shortf); unlink(other); unlink(tok);
    rmdir(dir);
}

/* Attack (high): the agent started on 0.0.0.0 without a token. Protected
 * mode now holds for the agent and the worker as for the node. */
TEST(door_protected_mode)
{
    ft_proc node;
    int up = start_node(&node, NULL, 0);
    REQUIRE(up == 0);
    char args[512], out[4096];
    snprintf(args, sizeof args, "--listen 0.0.0.0:0 --node %s", node.uri);
    int rc = run_for("agent", args, out, sizeof out);
    CHECK_MSG(rc != 0 && rc != 124 && strstr(out, "without a token"), "agent: rc %d '%s'", rc, out);
    rc = run_for("worker", "--listen 0.0.0.0:0", out, sizeof out);
    CHECK_MSG(rc != 0 && rc != 124 && strstr(out, "without a token"), "worker: rc %d '%s'", rc, out);
    snprintf(args, sizeof args, "--listen 0.0.0.0:0 --insecure --node %s", node.uri);
    rc = run_for("agent", args, out, sizeof out);
    CHECK_MSG(rc == 124 && strstr(out, "listening on 0.0.0.0:"), "agent --insecure: rc %d '%s'", rc, out);
    CHECK(ft_proc_stop(&node, 0) == 0);
}

/* Attack (high): agent clients sent the agent token over the socket in
 * clear. A fake agent records what a client sends: the HELLO of the
 * challenge-response, never the token. */
typedef struct { int lfd; uint8_t got[8192]; size_t n; } fake_agent;

static void *fake_agent_main(void *arg)
{
    fake_agent *f = arg;
    int fd = accept(f->lfd, NULL, NULL);
    if (fd < 0) return NULL;
    /* answer HELLO as a node with a token would, then read what comes */
    uint8_t h[FT_MSG_HDR_SIZE], nc[FT_MSG_NONCE];
    if (raw_read(fd, h, sizeof h, 3000) == 0 && raw_read(fd, nc, sizeof nc, 3000) == 0) {
        memcpy(f->got, h, sizeof h);
        memcpy(f->got + sizeof h, nc, sizeof nc);
        f->n = sizeof h + sizeof nc;
        uint8_t rh[FT_MSG_HDR_SIZE], ns[FT_MSG_NONCE];
        memset(ns, 7, sizeof ns);
        ft_msg m;
        memset(&m, 0, sizeof m);
        m.opcode = FT_OP_HELLO | FT_OP_REPLY;
        m.req_id = ft_get_le64(h + 8);
        m.data_len = sizeof ns;
        m.arg = FT_NODE_TOKEN;
        ft_msg_encode(rh, &m);
        raw_write(fd, rh, sizeof rh);
        raw_write(fd, ns, sizeof ns);
        double dl = ft_now() + 2;
        while (f->n < sizeof f->got && ft_now() < dl) {
            struct pollfd p = {fd, POLLIN, 0};
            if (poll(&p, 1, 100) <= 0) continue;
            ssize_t r = recv(fd, f->got + f->n, sizeof f->got - f->n, 0);
            if (r <= 0) break;
            f->n += (size_t)r;
        }
    }
    close(fd);
    return NULL;
}

TEST(door_agent_client_never_sends_the_token)
{
    char tok[64];
    REQUIRE(make_token(tok, sizeof tok, TOKEN, 0600) == 0);
    fake_agent f;
    memset(&f, 0, sizeof f);
    f.lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(0x7f000001);
    REQUIRE(bind(f.lfd, (struct sockaddr *)&a, sizeof a) == 0 && listen(f.lfd, 4) == 0);
    socklen_t al = sizeof a;
    getsockname(f.lfd, (struct sockaddr *)&a, &al);
    pthread_t th;
    pthread_create(&th, NULL, fake_agent_main, &f);
    char uri[64];
    snprintf(uri, sizeof uri, "agent://127.0.0.1:%d", ntohs(a.sin_port));
    ft_store_params p;
    ft_store_default_params(&p);
    p.token_file = tok;
    p.timeout_ms = 3000;
    ft_store *s = NULL;
    ft_status st = ft_store_open(uri, &p, &s);
    pthread_join(th, NULL);
    close(f.lfd);
    printf("     the client sent %zu bytes to a fake agent and gave up: %s\n", f.n, ft_status_str(st));
    CHECK(st != FT_OK);
    CHECK(f.n >= FT_MSG_HDR_SIZE && ft_get_le32(f.got) == FT_MSG_MAGIC);
    CHECK(!memmem(f.got, f.n, TOKEN, strlen(TOKEN)));
    CHECK(!memmem(f.got, f.n, TOKEN, 8));
    unlink(tok);
}


