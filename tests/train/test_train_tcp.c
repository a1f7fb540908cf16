/* flextier finetune --data-parallel tcp (src/train/comm_tcp.c,
 * src/cli/train_dp.c) on the tiny Llama fixture, ranks as processes over
 * loopback: N = 1, 2, 3 give the one-process losses and adapter bytes; a
 * token works, a wrong token is refused; a rank killed or stopped mid-run
 * makes the others stop with an error naming it within the deadline;
 * ranks started with other options refuse each other; bad options are
 * usage errors; a hand-made hostile rank's frames (huge, foreign, of the
 * wrong length, a flood) fail the run with a protocol error, no more. */
#include "ft_test.h"
#include "support/cli_run.h"
#include "support/fixture.h"
#include "flextier/train.h"
#include "net/door.h"
#include "net/msg.h"
#include "net/net.h"
#include "train/comm_tcp.h"

#include <pthread.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define DP_ARGS "--steps 3 --seq-len 16 --batch 1 --grad-accum 6 --warmup 1 --lr 1e-2 --threads 1 --eval-frac 0.2"
#define LOSSES "grep -o 'step [0-9/]* loss [0-9.]*\\|held-out after.*'"

static char model[1024];
static const char *tmp;

static void setup(void)
{
    if (tmp) return;
    tmp = ft_test_tmpdir("train_tcp");
    ft_fixture_dir("models", "llama-tiny", model, sizeof model);
    char path[1200];
    snprintf(path, sizeof path, "%s/data.txt", tmp);
    FILE *f = fopen(path, "w");
    for (int i = 0; f && i < 40; i++)
        fprintf(f, "The quick brown fox jumps over the lazy dog. Hello world %d, hello again.\n", i);
    if (f) fclose(f);
    /* two tokens, private files */
    CHECK(ft_sh("cd %s && umask 077 && echo 0123456789abcdef0123456789abcdef > tok && "
                "echo fedcba9876543210fedcba9876543210 > tok2", tmp) == 0);
    /* the reference: one process, no data parallelism */
    CHECK(ft_sh("cd %s && %s finetune --model %s --data data.txt --out one " DP_ARGS " | " LOSSES " > one.txt",
                tmp, ft_test_bin(), model) == 0);
    CHECK(ft_file_has(tmp, "one.txt", "step 3/3 loss"));
}

/* n free loopback ports as "127.0.0.1:P,..." (bound together, then closed) */
static void free_ports(int n, char *out, size_t cap)
{
    int fds[8];
    size_t o = 0;
    out[0] = 0;
    for (int i = 0; i < n && i < 8; i++) {
        struct sockaddr_in a;
        memset(&a, 0, sizeof a);
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        socklen_t l = sizeof a;
        fds[i] = socket(AF_INET, SOCK_STREAM, 0);
        CHECK(fds[i] >= 0 && bind(fds[i], (struct sockaddr *)&a, sizeof a) == 0 &&
              getsockname(fds[i], (struct sockaddr *)&a, &l) == 0);
        o += (size_t)snprintf(out + o, cap - o, "%s127.0.0.1:%d", i ? "," : "", ntohs(a.sin_port));
    }
    for (int i = 0; i < n && i < 8; i++) close(fds[i]);
}


/* Start ranks 0..n-1 of `finetune ... extra` in the background, each
 * writing tag<k>.out / tag<k>.err and its exit status to tag<k>.rc; the
 * shell waits for all (under `timeout`, so that a hang fails the test). */
static int run_ranks(int n, const char *tag, const char *peers, const char *extra, int limit_s)
{
    char cmd[4096];
    size_t o = (size_t)snprintf(cmd, sizeof cmd, "cd %s && timeout %d bash -c '", tmp, limit_s);
    for (int k = 0; k < n; k++)
        o += (size_t)snprintf(cmd + o, sizeof cmd - o,
                              "(%s finetune --model %s --data data.txt --out %s%d " DP_ARGS " --data-parallel tcp "
                              "--dp-rank %d --dp-peers %s %s > %s%d.out 2> %s%d.err; echo $? > %s%d.rc) & ",
                              ft_test_bin(), model, tag, k, k, peers, extra, tag, k, tag, k, tag, k);
    snprintf(cmd + o, sizeof cmd - o, "wait'");
    return ft_sh("%s", cmd);
}

static int rank_rc(const char *tag, int k)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/%s%d.rc", tmp, tag, k);
    char *s = ft_slurp(path, NULL);
    int rc = s ? atoi(s) : -1;
    free(s);
    return rc;
}

TEST(tcp_equals_one_process)
{
    setup();
    for (int n = 1; n <= 3; n++) {
        char peers[256], tag[16];
        free_ports(n, peers, sizeof peers);
        snprintf(tag, sizeof tag, "n%d_", n);
        CHECK_MSG(run_ranks(n, tag, peers, "--dp-timeout 20", 120) == 0, "%d ranks: the shell failed", n);
        for (int k = 0; k < n; k++) CHECK_MSG(rank_rc(tag, k) == 0, "%d ranks: rank %d failed", n, k);
        CHECK_MSG(ft_sh("cd %s && " LOSSES " %s0.out | cmp -s - one.txt", tmp, tag) == 0, "%d ranks: other losses", n);
        CHECK_MSG(ft_sh("cmp -s %s/one/adapter_model.safetensors %s/%s0/adapter_model.safetensors", tmp, tmp, tag) == 0,
                  "%d ranks: another adapter", n);
        if (n > 1) {
            char f[32];
            snprintf(f, sizeof f, "%s0.out", tag);
            CHECK(ft_file_has(tmp, f, "processes (TCP)"));
        }
    }
}

TEST(tcp_token)
{
    setup();
    char peers[256];
    /* the same token: joins, same result */
    free_ports(2, peers, sizeof peers);
    CHECK(run_ranks(2, "tk", peers, "--dp-token-file tok --dp-timeout 20", 120) == 0);
    CHECK(rank_rc("tk", 0) == 0 && rank_rc("tk", 1) == 0);
    CHECK(ft_sh("cmp -s %s/one/adapter_model.safetensors %s/tk0/adapter_model.safetensors", tmp, tmp) == 0);
    /* rank 1 with another token: refused by rank 0's door; rank 0 gives up
     * after its deadline */
    free_ports(2, peers, sizeof peers);
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "cd %s && timeout 60 bash -c '(%s finetune --model %s --data data.txt --out wt0 " DP_ARGS
             " --data-parallel tcp --dp-rank 0 --dp-peers %s --dp-token-file tok --dp-timeout 4 > wt0.out 2> wt0.err;"
             " echo $? > wt0.rc) & (%s finetune --model %s --data data.txt --out wt1 " DP_ARGS
             " --data-parallel tcp --dp-rank 1 --dp-peers %s --dp-token-file tok2 --dp-timeout 4 > wt1.out 2> wt1.err;"
             " echo $? > wt1.rc) & wait'", tmp, ft_test_bin(), model, peers, ft_test_bin(), model, peers);
    CHECK(ft_sh("%s", cmd) == 0);
    CHECK(rank_rc("wt", 0) == 1 && rank_rc("wt", 1) == 1);
    CHECK(ft_file_has(tmp, "wt1.err", "refused"));
    CHECK(ft_file_has(tmp, "wt0.err", "rank 1 did not join within 4 s"));
    CHECK(ft_sh("test ! -e %s/wt0/adapter_model.safetensors", tmp) == 0);
    /* a token against no token: the handshake is mutual */
    free_ports(2, peers, sizeof peers);
    snprintf(cmd, sizeof cmd,
             "cd %s && timeout 60 bash -c '(%s finetune --model %s --data data.txt --out nt0 " DP_ARGS
             " --data-parallel tcp --dp-rank 0 --dp-peers %s --dp-timeout 4 > nt0.out 2> nt0.err;"
             " echo $? > nt0.rc) & (%s finetune --model %s --data data.txt --out nt1 " DP_ARGS
             " --data-parallel tcp --dp-rank 1 --dp-peers %s --dp-token-file tok --dp-timeout 4 > nt1.out 2> nt1.err;"
             " echo $? > nt1.rc) & wait'", tmp, ft_test_bin(), model, peers, ft_test_bin(), model, peers);
    CHECK(ft_sh("%s", cmd) == 0);
    CHECK(rank_rc("nt", 0) == 1 && rank_rc("nt", 1) == 1);
}

/* A rank killed (SIGKILL) or stopped (SIGSTOP) mid-run: the others stop
 * with an error naming it, within the deadline (3 s) plus a margin. */
static void lose_a_rank(const char *sig, const char *tag, const char *want)
{
    char peers[256];
    free_ports(3, peers, sizeof peers);
    char cmd[4096];
    size_t o = (size_t)snprintf(cmd, sizeof cmd, "cd %s || exit 1; ", tmp);
    for (int k = 0; k < 3; k++)
        o += (size_t)snprintf(cmd + o, sizeof cmd - o,
                              "(%s finetune --model %s --data data.txt --out %s%d --steps 1000000 --seq-len 16 "
                              "--batch 1 --grad-accum 3 --threads 1 --eval-frac 0 --data-parallel tcp --dp-rank %d "
                              "--dp-peers %s --dp-timeout 3 > %s%d.out 2> %s%d.err & echo $! > %s%d.pid; wait $!; "
                              "echo $? > %s%d.rc) & ",
                              ft_test_bin(), model, tag, k, k, peers, tag, k, tag, k, tag, k, tag, k);
    /* when rank 0 has taken 5 steps, signal rank 1 and time the others */
    snprintf(cmd + o, sizeof cmd - o,
             "for i in $(seq 300); do grep -q 'step 5/' %s0.out 2>/dev/null && break; sleep 0.1; done; "
             "grep -q 'step 5/' %s0.out && kill -%s $(cat %s1.pid) && t0=$(date +%%s.%%N) && "
             "for i in $(seq 200); do [ -s %s0.rc ] && [ -s %s2.rc ] && break; sleep 0.1; done; "
             "t1=$(date +%%s.%%N); kill -9 $(cat %s0.pid %s1.pid %s2.pid) 2>/dev/null; kill -CONT $(cat %s1.pid) "
             "2>/dev/null; wait; awk \"BEGIN {print $t1 - $t0}\" > %selapsed",
             tag, tag, sig, tag, tag, tag, tag, tag, tag, tag, tag);
    CHECK(ft_sh("%s", cmd) == 0);
    CHECK_MSG(rank_rc(tag, 0) == 1 && rank_rc(tag, 2) == 1, "%s: ranks 0 and 2 exited %d and %d", sig,
              rank_rc(tag, 0), rank_rc(tag, 2));
    char f[64];
    snprintf(f, sizeof f, "%s0.err", tag);
    CHECK(ft_file_has(tmp, f, want));
    snprintf(f, sizeof f, "%s2.err", tag);
    CHECK(ft_file_has(tmp, f, "rank 1"));
    char path[1200];
    snprintf(path, sizeof path, "%s/%selapsed", tmp, tag);
    char *s = ft_slurp(path, NULL);
    double el = s ? atof(s) : 99;
    free(s);
    printf("  %s: the others stopped %.2f s after the signal\n", sig, el);
    CHECK_MSG(el < 10.0, "%s: %.2f s", sig, el);
}

TEST(tcp_rank_killed)
{
    setup();
    lose_a_rank("KILL", "kl", "rank 1 (");
}

TEST(tcp_rank_stopped)
{
    setup();
    lose_a_rank("STOP", "st", "sent nothing for 3 s");
}

TEST(tcp_errors)
{
    setup();
    char peers[256];
    free_ports(2, peers, sizeof peers);
    const char *b = ft_test_bin();
#define FT_RUN "%s finetune --model %s --data %s/data.txt --out %s/e " DP_ARGS
    /* usage errors: exit 2 */
    CHECK(ft_sh(FT_RUN " --data-parallel tcp > %s/e1 2>&1", b, model, tmp, tmp, tmp) == 2);
    CHECK(ft_file_has(tmp, "e1", "needs --dp-rank K and --dp-peers"));
    CHECK(ft_sh(FT_RUN " --data-parallel tcp --dp-rank 2 --dp-peers %s > %s/e2 2>&1", b, model, tmp, tmp, peers, tmp) == 2);
    CHECK(ft_file_has(tmp, "e2", "--dp-rank 2: --dp-peers names 2 ranks"));
    CHECK(ft_sh(FT_RUN " --dp-rank 0 --dp-peers %s > %s/e3 2>&1", b, model, tmp, tmp, peers, tmp) == 2);
    CHECK(ft_file_has(tmp, "e3", "belong to --data-parallel tcp"));
    CHECK(ft_sh(FT_RUN " --data-parallel tcp --dp-rank 0 --dp-peers %s --grad-accum 1 > %s/e4 2>&1", b, model, tmp,
                tmp, peers, tmp) == 2);
    CHECK(ft_file_has(tmp, "e4", "--grad-accum 1 < 2 processes"));
    CHECK(ft_sh(FT_RUN " --data-parallel udp > %s/e5 2>&1", b, model, tmp, tmp, tmp) == 2);
    CHECK(ft_file_has(tmp, "e5", "only mpi (under mpirun -n N) and tcp"));
    CHECK(ft_sh(FT_RUN " --data-parallel tcp --dp-rank x --dp-peers %s > %s/e6 2>&1", b, model, tmp, tmp, peers, tmp) == 2);
    CHECK(ft_sh(FT_RUN " --data-parallel tcp --dp-rank 0 --dp-peers 127.0.0.1:1,, > %s/e7 2>&1", b, model, tmp, tmp,
                tmp) == 2);
    CHECK(ft_file_has(tmp, "e7", "an empty entry"));
    CHECK(ft_sh(FT_RUN " --data-parallel tcp --dp-rank 0 --dp-peers %s --dp-timeout 0 > %s/e8 2>&1", b, model, tmp,
                tmp, peers, tmp) == 2);
    /* configuration errors: exit 1, before anything listens */
    CHECK(ft_sh(FT_RUN " --data-parallel tcp --dp-rank 0 --dp-peers 10.1.2.3:7000,127.0.0.1:7001 > %s/e9 2>&1", b,
                model, tmp, tmp, tmp) == 1);
    CHECK(ft_file_has(tmp, "e9", "is not a loopback address"));
    CHECK(ft_sh(FT_RUN " --data-parallel tcp --dp-rank 0 --dp-peers 127.0.0.1:0,127.0.0.1:7001 > %s/e10 2>&1", b,
                model, tmp, tmp, tmp) == 1);
    CHECK(ft_file_has(tmp, "e10", "port 0"));
    CHECK(ft_sh(FT_RUN " --data-parallel tcp --dp-rank 0 --dp-peers 127.0.0.1:7001,127.0.0.1:7001 > %s/e11 2>&1", b,
                model, tmp, tmp, tmp) == 1);
    CHECK(ft_file_has(tmp, "e11", "the same address"));
    CHECK(ft_sh(FT_RUN " --data-parallel tcp --dp-rank 0 --dp-peers nohost,127.0.0.1:7001 > %s/e12 2>&1", b, model,
                tmp, tmp, tmp) == 1);
    CHECK(ft_sh(FT_RUN " --data-parallel tcp --dp-rank 0 --dp-peers %s --dp-token-file %s/nonexistent > %s/e13 2>&1",
                b, model, tmp, tmp, peers, tmp, tmp) == 1);
    /* ranks with other options (another seed) refuse each other */
    CHECK(ft_sh("cd %s && timeout 60 bash -c '(%s finetune --model %s --data data.txt --out sd0 " DP_ARGS
                " --data-parallel tcp --dp-rank 0 --dp-peers %s --dp-timeout 10 > sd0.out 2> sd0.err; echo $? > sd0.rc) &"
                " (%s finetune --model %s --data data.txt --out sd1 " DP_ARGS " --seed 7 --data-parallel tcp --dp-rank 1"
                " --dp-peers %s --dp-timeout 10 > sd1.out 2> sd1.err; echo $? > sd1.rc) & wait'",
                tmp, b, model, peers, b, model, peers) == 0);
    CHECK(rank_rc("sd", 0) == 1 && rank_rc("sd", 1) == 1);
    CHECK(ft_file_has(tmp, "sd0.err", "runs another job"));
    CHECK(ft_file_has(tmp, "sd1.err", "runs another job"));
}

/* ------------------------------------------------- a hostile rank, by hand */

typedef struct {
    char p0[128], p1[128];
    uint64_t job;
    int delay_ms;             /* before the first receive */
    ft_status open_st, recv_st, recv2_st;
    char why[512];
    uint8_t got[24];
} rank0_run;

/* rank 0 of 2 (max_msg 64, timeout 3 s): open, then two receives of 24 bytes */
static void *rank0(void *arg)
{
    rank0_run *r = arg;
    const char *peers[2] = {r->p0, r->p1};
    ft_train_tcp_params p;
    memset(&p, 0, sizeof p);
    p.rank = 0;
    p.size = 2;
    p.peers = peers;
    p.timeout_ms = 3000;
    p.job = r->job;
    p.max_msg = 64;
    ft_train_comm *c = NULL;
    r->recv_st = r->recv2_st = FT_ERR_INTERNAL;
    if ((r->open_st = ft_train_tcp_open(&p, &c))) {
        snprintf(r->why, sizeof r->why, "%s", ft_last_error());
        return NULL;
    }
    usleep((useconds_t)r->delay_ms * 1000);
    r->recv_st = c->recv(c->user, 1, r->got, sizeof r->got);
    if (!r->recv_st) r->recv2_st = c->recv(c->user, 1, r->got, sizeof r->got);
    snprintf(r->why, sizeof r->why, "%s", ft_last_error());
    ft_train_tcp_close(c, FT_OK);
    return NULL;
}

/* Join rank 0 as rank 1 (door handshake without a token, then HELLO with
 * this job): the connected socket, or -1. */
static int join_as_rank1(rank0_run *r, uint64_t job)
{
    struct sockaddr_storage sa;
    socklen_t sl;
    if (ft_net_resolve(r->p0, 0, &sa, &sl)) return -1;
    int fd = -1;
    for (int i = 0; i < 100 && ft_net_tcp_connect(&sa, sl, 1000, "rank 0", &fd); i++) usleep(20000);
    if (fd < 0) return -1;
    if (ft_door_client_auth(fd, NULL, 0, 0, ft_now() + 5, "rank 0", NULL, 0, NULL, NULL, NULL)) goto bad;
    uint8_t f[FT_DP_HDR + FT_DP_HELLO_LEN];
    ft_dp_hello h = {FT_DP_VERSION, 1, 2, job, 64};
    ft_dp_hdr_encode(f, FT_DP_HELLO, FT_DP_HELLO_LEN);
    ft_dp_hello_encode(f + FT_DP_HDR, &h);
    if (ft_net_io_full(fd, 1, f, sizeof f, ft_now() + 5, "rank 0")) goto bad;
    return fd;
bad:
    close(fd);
    return -1;
}

/* What rank 0 sends back after failing: its HELLO, then ERR naming why. */
static int reads_err(int fd, const char *want)
{
    uint8_t b[4096];
    size_t have = 0;
    double dl = ft_now() + 5;
    while (ft_now() < dl && have < sizeof b) {
        ssize_t n = recv(fd, b + have, sizeof b - have, MSG_DONTWAIT);
        if (n > 0) have += (size_t)n;
        else if (n == 0) break;
        else usleep(10000);
    }
    ft_dp_rx rx;
    ft_dp_rx_init(&rx, 64, 1024);
    int ok = have > FT_DP_HDR + FT_DP_HELLO_LEN &&
             ft_dp_rx_feed(&rx, b + FT_DP_HDR + FT_DP_HELLO_LEN, have - FT_DP_HDR - FT_DP_HELLO_LEN) == FT_OK &&
             rx.err && strstr(rx.why, want);
    if (!ok) fprintf(stderr, "  rank 0 sent %zu bytes; ERR %d: %s\n", have, rx.err, rx.why);
    ft_dp_rx_free(&rx);
    return ok;
}

static void hostile(const char *what, const uint8_t *bytes, size_t n, int first_ok, const char *want, int delay_ms)
{
    rank0_run r;
    memset(&r, 0, sizeof r);
    char ports[128];
    free_ports(2, ports, sizeof ports);
    char *comma = strchr(ports, ',');
    *comma = 0;
    snprintf(r.p0, sizeof r.p0, "%s", ports);
    snprintf(r.p1, sizeof r.p1, "%s", comma + 1);
    r.job = 42;
    r.delay_ms = delay_ms;
    pthread_t th;
    REQUIRE(pthread_create(&th, NULL, rank0, &r) == 0);
    int fd = join_as_rank1(&r, 42);
    CHECK_MSG(fd >= 0, "%s: cannot join", what);
    if (fd >= 0) CHECK(ft_net_io_full(fd, 1, (void *)bytes, n, ft_now() + 5, "rank 0") == FT_OK);
    pthread_join(th, NULL);
    CHECK_MSG(r.open_st == FT_OK, "%s: open: %s", what, r.why);
    ft_status st = first_ok ? r.recv2_st : r.recv_st;
    if (first_ok) CHECK_MSG(r.recv_st == FT_OK && r.got[5] == 5, "%s: the good message", what);
    CHECK_MSG(st == FT_ERR_PROTOCOL && strstr(r.why, want), "%s: %s (%s)", what, ft_status_str(st), r.why);
    if (fd >= 0) {
        CHECK_MSG(reads_err(fd, want), "%s: no ERR back", what);
        close(fd);
    }
}

TEST(tcp_hostile_rank)
{
    static uint8_t b[8192];
    /* a message far beyond max_msg: refused from its header, nothing allocated */
    ft_dp_hdr_encode(b, FT_DP_DATA, 1ull << 40);
    hostile("huge", b, FT_DP_HDR, 0, "at most 64", 0);
    /* another magic */
    memcpy(b, "GET / HTTP/1.1\r\n\r\n", 18);
    hostile("magic", b, 18, 0, "not a data-parallel frame", 0);
    /* a good message, then one of another length than expected */
    ft_dp_hdr_encode(b, FT_DP_DATA, 24);
    for (int i = 0; i < 24; i++) b[FT_DP_HDR + i] = (uint8_t)i;
    ft_dp_hdr_encode(b + FT_DP_HDR + 24, FT_DP_DATA, 16);
    memset(b + 2 * FT_DP_HDR + 24, 0, 16);
    hostile("length", b, 2 * FT_DP_HDR + 40, 1, "sent 16 bytes where 24 were expected", 0);
    /* more untaken than two maximal messages (plus 4 KiB) while rank 0 does
     * not receive: the ranks never have that much in flight */
    size_t o = 0;
    for (int k = 0; k < 80; k++) {
        ft_dp_hdr_encode(b + o, FT_DP_DATA, 64);
        memset(b + o + FT_DP_HDR, 0, 64);
        o += FT_DP_HDR + 64;
    }
    hostile("flood", b, o, 0, "not yet taken", 500);

    /* a HELLO with another job: rank 0 refuses to start and says why */
    rank0_run r;
    memset(&r, 0, sizeof r);
    char ports[128];
    free_ports(2, ports, sizeof ports);
    char *comma = strchr(ports, ',');
    *comma = 0;
    snprintf(r.p0, sizeof r.p0, "%s", ports);
    snprintf(r.p1, sizeof r.p1, "%s", comma + 1);
    r.job = 42;
    pthread_t th;
    REQUIRE(pthread_create(&th, NULL, rank0, &r) == 0);
    int fd = join_as_rank1(&r, 43);
    pthread_join(th, NULL);
    CHECK(fd >= 0);
    CHECK_MSG(r.open_st == FT_ERR_INVALID_ARG && strstr(r.why, "runs another job"), "job: %s", r.why);
    if (fd >= 0) {
        uint8_t f[FT_DP_HDR + FT_DP_MAX_TEXT];
        unsigned t = 0;
        uint64_t len = 0;
        CHECK(ft_net_io_full(fd, 0, f, FT_DP_HDR, ft_now() + 5, "rank 0") == FT_OK &&
              ft_dp_hdr_parse(f, 64, &t, &len) == FT_OK && t == FT_DP_ERR);
        close(fd);
    }
}
