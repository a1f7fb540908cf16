/* The pipeline (flextier/pipe.h): on every fixture model, 2 and 3 stages
 * (threads over the in-process ring, and `flextier worker` processes over
 * UCX on loopback) give logits bit-identical to the single-process engine
 * computing the same micro-batches; the messages' and the stage
 * parameters' parsers refuse what they must. */
#include "ft_test.h"
#include "flextier/pipe.h"
#include "flextier/session.h"
#include "pipe/pipe_msg.h"

#include <dirent.h>
#include <fcntl.h>
#include <json-c/json.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAXP 8
#define STEPS 5

typedef struct {
    int np;
    int32_t prompt[MAXP][64];
    size_t plen[MAXP];
    const int32_t *pp[MAXP];
} prompts;

static int load_prompts(const char *dir, prompts *f)
{
    char path[600];
    memset(f, 0, sizeof *f);
    snprintf(path, sizeof path, "%s/fixtures.json", dir);
    json_object *root = json_object_from_file(path), *pr;
    if (!root) return 0;
    if (!json_object_object_get_ex(root, "prompts", &pr)) { json_object_put(root); return 0; }
    f->np = (int)json_object_array_length(pr);
    if (f->np > MAXP) f->np = MAXP;
    for (int i = 0; i < f->np; i++) {
        json_object *p = json_object_array_get_idx(pr, i);
        f->plen[i] = json_object_array_length(p);
        if (f->plen[i] > 64) f->plen[i] = 64;
        for (size_t k = 0; k < f->plen[i]; k++) f->prompt[i][k] = json_object_get_int(json_object_array_get_idx(p, k));
        f->pp[i] = f->prompt[i];
    }
    json_object_put(root);
    return f->np > 0;
}

static size_t maxp(const prompts *f)
{
    size_t m = 0;
    for (int i = 0; i < f->np; i++) m = f->plen[i] > m ? f->plen[i] : m;
    return m;
}

/* The single-process engine computing the micro-batches of M groups (the
 * pipeline's split: sequences [np*g/M, np*(g+1)/M)), greedy, as one
 * forward call per group and step: logits [step][seq][vocab], tokens
 * [seq][step]. */
static float *reference(const char *dir, const prompts *f, int M, int32_t *tokens, ft_status *st)
{
    ft_load_params lp;
    ft_load_params_default(&lp);
    ft_model *m = NULL;
    if ((*st = ft_model_load(dir, &lp, &m))) return NULL;
    size_t V = (size_t)ft_model_get_config(m)->vocab, np = (size_t)f->np;
    ft_ctx_params cp = {.max_batch = f->np, .max_seq = (int)maxp(f) + STEPS + 1, .threads = 1, .kv_dtype = FT_BF16};
    ft_ctx *c = NULL;
    float *all = calloc((STEPS + 1) * np * V, sizeof(float)), *lg = calloc(np * V, sizeof(float));
    ft_sampler *smp = NULL;
    if ((*st = ft_ctx_create(m, &cp, &c)) || (*st = ft_sampler_create((int)V, &smp))) goto out;
    for (int g = 0; g < M && !*st; g++) {
        size_t a = np * (size_t)g / (size_t)M, b = np * (size_t)(g + 1) / (size_t)M;
        int slots[MAXP];
        const int32_t *tp[MAXP];
        size_t nt[MAXP];
        for (size_t j = a; j < b; j++) { slots[j - a] = (int)j; tp[j - a] = f->pp[j]; nt[j - a] = f->plen[j]; }
        for (int s = 0; s <= STEPS && !*st; s++) {
            if ((*st = ft_ctx_forward(c, b - a, slots, tp, nt, lg, 0))) break;
            for (size_t j = a; j < b; j++) {
                float *row = all + ((size_t)s * np + j) * V;
                memcpy(row, lg + (j - a) * V, V * sizeof(float));
                float tmp[4096];
                memcpy(tmp, row, V * sizeof(float));
                ft_sampling sp = {0};
                uint64_t rng = 0;
                tokens[j * (STEPS + 1) + (size_t)s] = ft_sampler_sample(smp, &sp, tmp, NULL, 0, &rng);
                tp[j - a] = &tokens[j * (STEPS + 1) + (size_t)s];
                nt[j - a] = 1;
            }
        }
    }
out:
    ft_sampler_free(smp);
    ft_ctx_free(c);
    ft_model_free(m);
    free(lg);
    return all;
}

typedef struct {
    float *all;
    size_t np, V;
    int bad;
} logit_sink;

static void on_logits(void *user, size_t seq, size_t step, const float *logits)
{
    logit_sink *k = user;
    if (seq >= k->np || step > STEPS) { k->bad++; return; }
    memcpy(k->all + (step * k->np + seq) * k->V, logits, k->V * sizeof(float));
}

static ft_pipe_stage_params stage_params(const char *dir, const prompts *f, int S, int M, int i, const int *bounds)
{
    ft_pipe_stage_params p;
    ft_pipe_stage_default(&p);
    snprintf(p.model_dir, sizeof p.model_dir, "%s", dir);
    p.stage = i;
    p.n_stages = S;
    p.l0 = bounds[i];
    p.l1 = bounds[i + 1];
    p.max_batch = f->np;
    p.max_seq = (int)maxp(f) + STEPS + 1;
    p.max_rows = (int)maxp(f) * ((f->np + M - 1) / M);
    p.threads = 1;
    p.kv_dtype = FT_BF16;
    p.job = 0x1234;
    return p;
}

typedef struct {
    ft_pipe_stage_params p;
    ft_pipe_link *link;
    ft_status st;
    char err[512];   /* the stage's error message (errors are per thread) */
} thr_arg;

static void *stage_thread(void *arg)
{
    thr_arg *a = arg;
    ft_pipe_stage *s = NULL;
    a->st = ft_pipe_stage_create(&a->p, NULL, &s);
    if (!a->st) a->st = ft_pipe_worker_run(s, a->link);
    if (a->st) snprintf(a->err, sizeof a->err, "%s", ft_last_error());
    ft_pipe_stage_free(s);
    ft_pipe_link_close(a->link);
    return NULL;
}

/* The driver's part: generate, collect the logits, end the run. */
static float *drive(ft_pipe_stage *drv, ft_pipe_link *link, const prompts *f, int M, int32_t *tokens, ft_status *st)
{
    size_t V = (size_t)ft_pipe_stage_config(drv)->vocab, np = (size_t)f->np;
    logit_sink k = {calloc((STEPS + 1) * np * V, sizeof(float)), np, V, 0};
    int32_t *outp[MAXP];
    size_t n_out[MAXP];
    for (size_t j = 0; j < np; j++) outp[j] = tokens + j * (STEPS + 1);
    ft_gen_params gp = {.max_new_tokens = STEPS + 1, .ignore_eos = 1};
    ft_pipe_gen_opts po = {.micro_batches = M, .timeout_ms = 60000, .on_logits = on_logits, .user = &k};
    ft_pipe_gen_stats gs;
    *st = ft_pipe_generate(drv, link, np, f->pp, f->plen, &gp, &po, outp, n_out, &gs);
    if (!*st && k.bad) *st = ft_set_error(FT_ERR_INTERNAL, "logits of unexpected steps");
    if (!*st && gs.micro_batches != M) *st = ft_set_error(FT_ERR_INTERNAL, "%d micro-batches", gs.micro_batches);
    ft_status e = ft_pipe_end(drv, link, 30000);
    if (!*st) *st = e;
    return k.all;
}

/* S stages as threads over the in-process ring. */
static float *pipeline_local(const char *dir, const prompts *f, int S, int M, int32_t *tokens, ft_status *st)
{
    ft_model_config cfg;
    if ((*st = ft_model_config_load(dir, &cfg))) return NULL;
    int bounds[FT_PIPE_MAX_STAGES + 1];
    ft_pipe_split_layers(cfg.n_layers, S, bounds);
    ft_pipe_link *links[FT_PIPE_MAX_STAGES];
    if ((*st = ft_pipe_local_ring(S, links))) return NULL;
    thr_arg args[FT_PIPE_MAX_STAGES];
    pthread_t thr[FT_PIPE_MAX_STAGES];
    for (int i = 0; i < S - 1; i++) {
        args[i].p = stage_params(dir, f, S, M, i, bounds);
        args[i].link = links[i];
        args[i].st = FT_OK;
        args[i].err[0] = 0;
        pthread_create(&thr[i], NULL, stage_thread, &args[i]);
    }
    ft_pipe_stage_params dp = stage_params(dir, f, S, M, S - 1, bounds);
    ft_pipe_stage *drv = NULL;
    float *all = NULL;
    if (!(*st = ft_pipe_stage_create(&dp, NULL, &drv))) all = drive(drv, links[S - 1], f, M, tokens, st);
    ft_pipe_link_close(links[S - 1]);
    for (int i = 0; i < S - 1; i++) {
        pthread_join(thr[i], NULL);
        if (args[i].st && (!*st || *st == FT_ERR_NET))   /* a worker's own failure explains the driver's */
            *st = ft_set_error(args[i].st, "stage %d failed: %s", i, args[i].err);
    }
    ft_pipe_stage_free(drv);
    return all;
}

static int compare(const char *what, const float *a, const float *b, const int32_t *ta, const int32_t *tb,
                   const prompts *f, size_t V)
{
    size_t n = (STEPS + 1) * (size_t)f->np * V, diff = 0;
    for (size_t i = 0; i < n; i++) diff += a[i] != b[i];
    size_t td = 0;
    for (size_t i = 0; i < (size_t)f->np * (STEPS + 1); i++) td += ta[i] != tb[i];
    if (diff || td) fprintf(stderr, "  %s: %zu of %zu logits and %zu tokens differ\n", what, diff, n, td);
    return diff == 0 && td == 0;
}

static void check_fixture(const char *name)
{
    char dir[512];
    const char *data = getenv("FT_TEST_DATA");
    snprintf(dir, sizeof dir, "%s/models/%s", data ? data : "tests/data", name);
    prompts f;
    REQUIRE(load_prompts(dir, &f));
    ft_model_config cfg;
    CHECK_OK(ft_model_config_load(dir, &cfg));
    size_t V = (size_t)cfg.vocab;
    REQUIRE(V <= 4096);
    static const int cases[][2] = {{2, 1}, {2, 2}, {3, 3}, {3, 2}};   /* stages, micro-batches */
    int all_same = 1;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int S = cases[c][0], M = cases[c][1] < f.np ? cases[c][1] : f.np;
        int32_t tr[MAXP * (STEPS + 1)], tp[MAXP * (STEPS + 1)];
        ft_status st;
        float *ref = reference(dir, &f, M, tr, &st);
        CHECK_MSG(st == FT_OK, "%s: reference: %s", name, ft_last_error());
        float *got = pipeline_local(dir, &f, S, M, tp, &st);
        CHECK_MSG(st == FT_OK, "%s: %d stages: %s", name, S, ft_last_error());
        char what[320];
        snprintf(what, sizeof what, "%s, %d stages, %d micro-batches", name, S, M);
        int same = ref && got && st == FT_OK && compare(what, got, ref, tp, tr, &f, V);
        CHECK_MSG(same, "%s", what);
        all_same &= same;
        free(ref);
        free(got);
    }
    if (all_same) printf("  %-22s 2 and 3 stages (1-3 micro-batches): bit-identical to the engine\n", name);
}

TEST(fixtures_all)
{
    const char *data = getenv("FT_TEST_DATA");
    char path[512];
    snprintf(path, sizeof path, "%s/models", data ? data : "tests/data");
    DIR *d = opendir(path);
    REQUIRE(d);
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        check_fixture(e->d_name);
        n++;
    }
    closedir(d);
    CHECK(n >= 8);
}

/* ------------------------------------------------- workers over loopback */

typedef struct {
    pid_t pid;
    char addr[64];
} worker_t;

static int worker_start(worker_t *w)
{
    const char *bin = getenv("FT_BIN");
    if (!bin) return -1;
    int fds[2];
    if (pipe(fds)) return -1;
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        dup2(fds[1], 1);
        if (!getenv("FT_TEST_VERBOSE")) {
            int null = open("/dev/null", O_WRONLY);
            if (null >= 0) dup2(null, 2);
        }
        close(fds[0]);
        execl(bin, bin, "worker", "--listen", "127.0.0.1:0", "--trusted-network", "--once", (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    char buf[256];
    size_t got = 0;
    double dl = ft_now() + 10;
    w->pid = pid;
    w->addr[0] = 0;
    while (ft_now() < dl && got < sizeof buf - 1) {
        struct pollfd p = {fds[0], POLLIN, 0};
        if (poll(&p, 1, 100) <= 0) continue;
        ssize_t r = read(fds[0], buf + got, sizeof buf - 1 - got);
        if (r <= 0) break;
        got += (size_t)r;
        buf[got] = 0;
        char *at = strstr(buf, "listening on "), *nl = at ? strchr(at, '\n') : NULL;
        if (at && nl) {
            *nl = 0;
            snprintf(w->addr, sizeof w->addr, "%s", at + strlen("listening on "));
            break;
        }
    }
    close(fds[0]);
    if (!w->addr[0]) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        return -1;
    }
    return 0;
}

static int worker_wait(worker_t *w)
{
    int status = 0;
    for (int i = 0; i < 500; i++) {
        if (waitpid(w->pid, &status, WNOHANG) == w->pid) return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        usleep(20000);
    }
    kill(w->pid, SIGKILL);
    waitpid(w->pid, NULL, 0);
    return -1;
}

static void check_workers(const char *name, int S, int M)
{
    char dir[512];
    const char *data = getenv("FT_TEST_DATA");
    snprintf(dir, sizeof dir, "%s/models/%s", data ? data : "tests/data", name);
    prompts f;
    REQUIRE(load_prompts(dir, &f));
    if (M > f.np) M = f.np;
    setenv("UCX_TLS", "tcp", 1);   /* UCX over TCP on loopback (workers: --trusted-network) */
    worker_t w[FT_PIPE_MAX_STAGES];
    const char *addrs[FT_PIPE_MAX_STAGES];
    int started = 0;
    for (int i = 0; i < S - 1; i++) {
        if (worker_start(&w[i]) != 0) break;
        addrs[i] = w[i].addr;
        started++;
    }
    REQUIRE(started == S - 1);
    ft_model_config cfg;
    CHECK_OK(ft_model_config_load(dir, &cfg));
    int bounds[FT_PIPE_MAX_STAGES + 1];
    ft_pipe_split_layers(cfg.n_layers, S, bounds);
    ft_pipe_stage_params sp[FT_PIPE_MAX_STAGES];
    for (int i = 0; i < S; i++) sp[i] = stage_params(dir, &f, S, M, i, bounds);
    ft_pipe_link *link = NULL;
    ft_pipe_remote *rem = NULL;
    ft_status st = ft_pipe_connect(addrs, S - 1, sp, NULL, 1, sp[0].job, &link, &rem);
    CHECK_MSG(st == FT_OK, "connect: %s", ft_last_error());
    ft_pipe_stage *drv = NULL;
    if (!st) CHECK_OK(st = ft_pipe_stage_create(&sp[S - 1], NULL, &drv));
    int32_t tr[MAXP * (STEPS + 1)], tp[MAXP * (STEPS + 1)];
    float *got = NULL, *ref = NULL;
    if (!st) {
        got = drive(drv, link, &f, M, tp, &st);
        CHECK_MSG(st == FT_OK, "%s over %d workers: %s", name, S - 1, ft_last_error());
    }
    ft_pipe_link_close(link);
    ft_pipe_disconnect(rem);
    for (int i = 0; i < S - 1; i++) CHECK_MSG(worker_wait(&w[i]) == 0, "worker %d did not end cleanly", i);
    ref = reference(dir, &f, M, tr, &st);
    CHECK_OK(st);
    char what[320];
    snprintf(what, sizeof what, "%s over %d worker processes, %d micro-batches", name, S - 1, M);
    int same = got && ref && compare(what, got, ref, tp, tr, &f, (size_t)cfg.vocab);
    CHECK_MSG(same, "%s", what);
    if (same) printf("  %s: bit-identical\n", what);
    free(got);
    free(ref);
    ft_pipe_stage_free(drv);
}

TEST(workers_two_stages) { check_workers("llama-tiny", 2, 2); }
TEST(workers_three_stages) { check_workers("opt-tiny", 3, 3); }

/* A driver that cannot prove the workers' token is refused; a worker that
 * dies mid-run ends the driver's wait with an error, not a hang. */
TEST(worker_refuses_and_dies)
{
    char dir[512];
    const char *data = getenv("FT_TEST_DATA");
    snprintf(dir, sizeof dir, "%s/models/llama-tiny", data ? data : "tests/data");
    prompts f;
    REQUIRE(load_prompts(dir, &f));
    setenv("UCX_TLS", "tcp", 1);
    worker_t w;
    REQUIRE(worker_start(&w) == 0);
    ft_model_config cfg;
    CHECK_OK(ft_model_config_load(dir, &cfg));
    int bounds[3];
    ft_pipe_split_layers(cfg.n_layers, 2, bounds);
    ft_pipe_stage_params sp[2] = {stage_params(dir, &f, 2, 2, 0, bounds), stage_params(dir, &f, 2, 2, 1, bounds)};
    /* a job whose stage is the last one: refused with the reason */
    ft_pipe_stage_params bad[2] = {sp[1], sp[1]};
    const char *addrs[1] = {w.addr};
    ft_pipe_link *link = NULL;
    ft_pipe_remote *rem = NULL;
    ft_status st = ft_pipe_connect(addrs, 1, bad, NULL, 1, 7, &link, &rem);
    CHECK(st != FT_OK);
    CHECK_MSG(strstr(ft_last_error(), "not the last") != NULL, "%s", ft_last_error());
    worker_wait(&w);
    /* a worker killed mid-run */
    REQUIRE(worker_start(&w) == 0);
    addrs[0] = w.addr;
    st = ft_pipe_connect(addrs, 1, sp, NULL, 1, sp[0].job, &link, &rem);
    CHECK_OK(st);
    ft_pipe_stage *drv = NULL;
    if (!st) CHECK_OK(st = ft_pipe_stage_create(&sp[1], NULL, &drv));
    if (!st) {
        kill(w.pid, SIGKILL);
        int32_t tok[MAXP * (STEPS + 1)];
        double t0 = ft_now();
        float *got = drive(drv, link, &f, 2, tok, &st);
        CHECK(st != FT_OK);
        CHECK(ft_now() - t0 < 30);
        printf("  worker killed: %s (%s)\n", ft_status_str(st), ft_last_error());
        free(got);
    }
    ft_pipe_stage_free(drv);
    ft_pipe_link_close(link);
    ft_pipe_disconnect(rem);
    worker_wait(&w);
}

/* ------------------------------------------------------------- parsers */

TEST(messages)
{
    ft_pipe_limits lim = {4, 16, 8, 100};
    uint8_t buf[1024];
    int slots[2] = {3, 1};
    size_t ntok[2] = {2, 1};
    size_t off = ft_pipe_msg_begin(buf, FT_PM_STEP, 9, 1, 0, FT_PM_RESET, 2, slots, ntok, 3, 12);
    for (int i = 0; i < 3; i++) { buf[off + 4 * i] = (uint8_t)(10 + i); buf[off + 4 * i + 1] = buf[off + 4 * i + 2] = buf[off + 4 * i + 3] = 0; }
    size_t len = off + 12;
    CHECK(len == ft_pipe_msg_size(FT_PM_STEP, 2, 3, 0, 0));
    ft_pipe_msg m;
    CHECK_OK(ft_pipe_msg_parse(buf, len, &lim, &m));
    CHECK(m.type == FT_PM_STEP && m.n_seq == 2 && m.rows == 3 && m.job == 9 && (m.flags & FT_PM_RESET));
    /* every single-byte change of the header or table is either still a
     * valid message or refused; never a crash (the fuzz target does more) */
    int refused = 0;
    for (size_t i = 0; i < len; i++) {
        uint8_t save = buf[i];
        buf[i] ^= 0x41;
        if (ft_pipe_msg_parse(buf, len, &lim, &m) != FT_OK) refused++;
        buf[i] = save;
    }
    CHECK(refused > 40);
    CHECK(ft_pipe_msg_parse(buf, len - 1, &lim, &m) == FT_ERR_PROTOCOL);
    /* a token outside the vocabulary, a slot out of range, a slot twice */
    buf[off] = 200;
    CHECK(ft_pipe_msg_parse(buf, len, &lim, &m) == FT_ERR_PROTOCOL);
    buf[off] = 10;
    int bad_slots[2] = {4, 1}, dup[2] = {1, 1};
    ft_pipe_msg_begin(buf, FT_PM_STEP, 9, 1, 0, 0, 2, bad_slots, ntok, 3, 12);
    CHECK(ft_pipe_msg_parse(buf, len, &lim, &m) == FT_ERR_PROTOCOL);
    ft_pipe_msg_begin(buf, FT_PM_STEP, 9, 1, 0, 0, 2, dup, ntok, 3, 12);
    CHECK(ft_pipe_msg_parse(buf, len, &lim, &m) == FT_ERR_PROTOCOL);
    CHECK(strstr(ft_last_error(), "twice") != NULL);
    /* hidden states: rows x hidden floats exactly */
    off = ft_pipe_msg_begin(buf, FT_PM_HIDDEN, 9, 2, 1, 0, 2, slots, ntok, 3, 3 * 8 * 4);
    CHECK_OK(ft_pipe_msg_parse(buf, off + 96, &lim, &m));
    CHECK(ft_pipe_msg_parse(buf, off + 92, &lim, &m) == FT_ERR_PROTOCOL);
    /* errors carry printable text */
    len = ft_pipe_msg_error(buf, sizeof buf, 9, "stage 1: out of memory\n");
    CHECK_OK(ft_pipe_msg_parse(buf, len, &lim, &m));
    CHECK(m.type == FT_PM_ERROR && m.data_len == 23 && m.data[22] == '?');
}

TEST(stage_params_text)
{
    ft_pipe_stage_params p, q;
    ft_pipe_stage_default(&p);
    snprintf(p.model_dir, sizeof p.model_dir, "/models/llama 7b");
    p.stage = 1; p.n_stages = 3; p.l0 = 4; p.l1 = 8; p.max_batch = 32; p.max_seq = 300; p.max_rows = 4096;
    p.threads = 2; p.job = 0xfedcba9876543210ull;
    snprintf(p.policy, sizeof p.policy, "w=0,100 cw=q4");
    char buf[4096];
    size_t n;
    CHECK_OK(ft_pipe_stage_format(&p, buf, sizeof buf, &n));
    CHECK_OK(ft_pipe_stage_parse(buf, n, &q));
    CHECK(!strcmp(p.model_dir, q.model_dir) && p.job == q.job && q.stage == 1 && q.n_stages == 3 && q.l0 == 4 &&
          q.l1 == 8 && q.max_batch == 32 && q.max_seq == 300 && q.max_rows == 4096 && q.threads == 2 &&
          q.weights == p.weights && q.kv_dtype == p.kv_dtype && !strcmp(q.policy, p.policy));
    static const char *const bad[] = {
        "model=/m\nstage=0\n",                                    /* keys missing */
        "model=/m\nmodel=/n\n",                                   /* twice */
        "colour=blue\n",                                          /* unknown */
        "model=/m\nstage=5\nstages=3\nlayers=0,2\nbatch=1\nseq=8\nrows=8\nthreads=1\nweights=0\nkv=0\nflags=0\n"
        "job=0000000000000001\npolicy=\n",                        /* stage >= stages */
        "model=/m\nstage=0\nstages=3\nlayers=3,2\nbatch=1\nseq=8\nrows=8\nthreads=1\nweights=0\nkv=0\nflags=0\n"
        "job=0000000000000001\npolicy=\n",                        /* layers backwards */
        "model=/m\nstage=0\nstages=3\nlayers=0,2\nbatch=1\nseq=8\nrows=8\nthreads=1\nweights=0\nkv=7\nflags=0\n"
        "job=0000000000000001\npolicy=\n",                        /* kv dtype */
        "model=/m\nstage=0\nstages=3\nlayers=0,2\nbatch=1\nseq=8\nrows=8\nthreads=1\nweights=0\nkv=0\nflags=0\n"
        "job=xyz\npolicy=\n",                                     /* job */
        "model=/m\nstage=0",                                      /* no newline */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK_MSG(ft_pipe_stage_parse(bad[i], strlen(bad[i]), &q) == FT_ERR_PROTOCOL, "case %zu accepted", i);
}

TEST(stage_errors)
{
    char dir[512];
    const char *data = getenv("FT_TEST_DATA");
    snprintf(dir, sizeof dir, "%s/models/llama-tiny", data ? data : "tests/data");
    prompts f;
    REQUIRE(load_prompts(dir, &f));
    int bounds[3] = {0, 1, 2};
    ft_pipe_stage_params p = stage_params(dir, &f, 2, 1, 0, bounds);
    ft_pipe_stage *s = NULL;
    p.l0 = 1;   /* stage 0 starts at layer 0 */
    p.l1 = 2;
    CHECK(ft_pipe_stage_create(&p, NULL, &s) == FT_ERR_INVALID_ARG);
    p.l0 = 0;
    p.l1 = 1;
    snprintf(p.policy, sizeof p.policy, "w=100,0 c=0,100");   /* the KV cache stays in memory */
    CHECK(ft_pipe_stage_create(&p, NULL, &s) == FT_ERR_UNSUPPORTED);
    /* a stage that offloads its own layers (host tier, byte-plane) */
    snprintf(p.policy, sizeof p.policy, "w=0,100 cw=bp");
    CHECK_OK(ft_pipe_stage_create(&p, NULL, &s));
    CHECK(s && ft_pipe_stage_offload(s) != NULL);
    ft_pipe_stage_free(s);
}

/* A stage that streams its layers (the host tier, byte-plane) still gives
 * the engine's logits: each stage may itself offload. */
TEST(stage_offloads_its_layers)
{
    char dir[512];
    const char *data = getenv("FT_TEST_DATA");
    snprintf(dir, sizeof dir, "%s/models/qwen2-tiny", data ? data : "tests/data");
    prompts f;
    REQUIRE(load_prompts(dir, &f));
    int S = 2, M = 2 < f.np ? 2 : f.np;
    ft_model_config cfg;
    CHECK_OK(ft_model_config_load(dir, &cfg));
    int bounds[3];
    ft_pipe_split_layers(cfg.n_layers, S, bounds);
    ft_pipe_link *links[2];
    CHECK_OK(ft_pipe_local_ring(S, links));
    thr_arg a = {stage_params(dir, &f, S, M, 0, bounds), links[0], FT_OK, ""};
    snprintf(a.p.policy, sizeof a.p.policy, "w=0,100 cw=bp");
    pthread_t t;
    pthread_create(&t, NULL, stage_thread, &a);
    ft_pipe_stage_params dp = stage_params(dir, &f, S, M, 1, bounds);
    snprintf(dp.policy, sizeof dp.policy, "w=0,100");
    ft_pipe_stage *drv = NULL;
    int32_t tp[MAXP * (STEPS + 1)], tr[MAXP * (STEPS + 1)];
    ft_status st;
    float *got = NULL;
    CHECK_OK(st = ft_pipe_stage_create(&dp, NULL, &drv));
    if (!st) got = drive(drv, links[1], &f, M, tp, &st);
    CHECK_OK(st);
    ft_pipe_link_close(links[1]);
    pthread_join(t, NULL);
    CHECK_OK(a.st);
    float *ref = reference(dir, &f, M, tr, &st);
    if (got && ref) CHECK(compare("offloading stages", got, ref, tp, tr, &f, (size_t)cfg.vocab));
    free(got);
    free(ref);
    ft_pipe_stage_free(drv);
}

/* A session over a pipeline's driver (ft_session_open_pipeline): text in,
 * text out, the same as a single-process session (one micro-batch: the
 * whole batch is one forward call in both). */
TEST(session_over_pipeline)
{
    char dir[512];
    const char *data = getenv("FT_TEST_DATA");
    snprintf(dir, sizeof dir, "%s/models/llama-tiny", data ? data : "tests/data");
    const char *texts[2] = {"Hello there", "The quick brown fox"};
    ft_text_params tp;
    memset(&tp, 0, sizeof tp);
    tp.gen.max_new_tokens = 8;
    tp.gen.ignore_eos = 1;   /* greedy: sampling zeroed */
    ft_session_params sp;
    ft_session_default_params(&sp);
    sp.threads = 1;
    sp.max_batch = 2;
    ft_session *ref = NULL;
    REQUIRE(ft_session_open(dir, &sp, &ref) == FT_OK);
    char *want[2] = {0}, *got[2] = {0};
    ft_gen_stats gs;
    CHECK_OK(ft_session_generate_text(ref, 2, texts, &tp, want, &gs));
    ft_session_close(ref);

    ft_model_config cfg;
    CHECK_OK(ft_model_config_load(dir, &cfg));
    int bounds[3];
    ft_pipe_split_layers(cfg.n_layers, 2, bounds);
    ft_pipe_link *links[2];
    REQUIRE(ft_pipe_local_ring(2, links) == FT_OK);
    thr_arg a;
    memset(&a, 0, sizeof a);
    ft_pipe_stage_params p0;
    ft_pipe_stage_default(&p0);
    snprintf(p0.model_dir, sizeof p0.model_dir, "%s", dir);
    p0.n_stages = 2;
    p0.max_batch = 2;
    p0.max_seq = 64;
    p0.max_rows = 64;
    p0.threads = 1;
    p0.kv_dtype = FT_BF16;
    p0.job = 7;
    ft_pipe_stage_params p1 = p0;
    p0.stage = 0, p0.l0 = bounds[0], p0.l1 = bounds[1];
    p1.stage = 1, p1.l0 = bounds[1], p1.l1 = bounds[2];
    a.p = p0;
    a.link = links[0];
    pthread_t t;
    REQUIRE(pthread_create(&t, NULL, stage_thread, &a) == 0);
    ft_pipe_stage *drv = NULL;
    ft_session *s = NULL;
    CHECK_OK(ft_pipe_stage_create(&p1, NULL, &drv));
    if (drv) CHECK_OK(ft_session_open_pipeline(dir, &sp, drv, links[1], 1, &s));
    if (s) {
        CHECK_OK(ft_session_generate_text(s, 2, texts, &tp, got, &gs));
        for (int j = 0; j < 2; j++)
            CHECK_MSG(want[j] && got[j] && !strcmp(want[j], got[j]), "prompt %d: '%s' vs '%s'", j,
                      got[j] ? got[j] : "(none)", want[j] ? want[j] : "(none)");
        ft_session_stats ss;
        ft_session_get_stats(s, &ss);
        CHECK(ss.pipe_stages == 2 && ss.pipe_micro_batches == 1 && ss.pipe_messages > 0 && ss.kv_bytes > 0);
        /* the driver has the last layers only: no logits of every position */
        int slot = 0;
        const int32_t tok = 1, *tp1 = &tok;
        size_t one = 1;
        float lg[8];
        CHECK(ft_session_forward(s, 1, &slot, &tp1, &one, lg, 1) == FT_ERR_UNSUPPORTED);
    }
    ft_session_close(s);
    if (drv) CHECK_OK(ft_pipe_end(drv, links[1], 30000));
    ft_pipe_link_close(links[1]);
    pthread_join(t, NULL);
    CHECK_MSG(a.st == FT_OK, "stage 0: %s", a.err);
    ft_pipe_stage_free(drv);
    for (int j = 0; j < 2; j++) { free(want[j]); free(got[j]); }
}
