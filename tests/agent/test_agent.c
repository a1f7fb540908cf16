/* The codec agent: `flextier serve` + `flextier agent` started by the test
 * (FT_BIN), the agent:// client in this process. Results through the
 * agent must equal in-process encoding frame for frame. */
#include "ft_test.h"
#include <sys/stat.h>
#include "flextier/agent.h"
#include "flextier/codec.h"
#include "flextier/store.h"
#include "net/agent_msg.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agent/agent_util.h"
#include "support/synth.h"

static ft_status open_store(const char *uri, const char *token_file, unsigned depth, int timeout_ms,
                            ft_store **out)
{
    ft_store_params p;
    ft_store_default_params(&p);
    p.token_file = token_file;
    p.timeout_ms = timeout_ms ? timeout_ms : 20000;
    if (depth) p.queue_depth = depth;
    return ft_store_open(uri, &p, out);
}

/* LLM-like weights in dt (seeded): the library's one generator
 * (support/synth.h), rows of 1024. */
static void *weights(ft_dtype dt, uint64_t n, uint64_t seed) { return ft_test_weights(dt, n, 1024, seed); }

/* Mode 0600 and at least 16 bytes, as the memory node requires. */
static void write_token(const char *path, const char *tok)
{
    FILE *f = fopen(path, "w");
    if (f) { fputs(tok, f); fclose(f); }
    chmod(path, 0600);
}

typedef struct { const char *name; ft_codec_id codec, entropy; int32_t gdim; } codec_case;
static const codec_case g_codecs[] = {
    {"raw", FT_CODEC_RAW, FT_CODEC_ZSTD, -1},   {"lz4", FT_CODEC_LZ4, FT_CODEC_ZSTD, -1},
    {"zstd", FT_CODEC_ZSTD, FT_CODEC_ZSTD, -1}, {"deflate", FT_CODEC_DEFLATE, FT_CODEC_ZSTD, -1},
    {"bp", FT_CODEC_BYTEPLANE, FT_CODEC_ZSTD, -1}, {"bp-lz4", FT_CODEC_BYTEPLANE, FT_CODEC_LZ4, -1},
    {"bp-deflate", FT_CODEC_BYTEPLANE, FT_CODEC_DEFLATE, -1}, {"q8", FT_CODEC_Q8, FT_CODEC_ZSTD, -1},
    {"q4", FT_CODEC_Q4, FT_CODEC_ZSTD, -1},    {"q4-dim0", FT_CODEC_Q4, FT_CODEC_ZSTD, 0},
};

/* Every codec: the agent stores exactly the frame in-process encoding
 * makes; reads through it (stored dtype, f32, into a buffer, allocated)
 * equal in-process decoding bit for bit (lossless: the source). */
static void roundtrip_all(const char *agent_uri, const char *node_uri, const char *tag)
{
    ft_store *a = NULL, *d = NULL;
    CHECK_OK(open_store(agent_uri, NULL, 4, 0, &a));
    CHECK_OK(open_store(node_uri, NULL, 4, 0, &d));
    ft_codec_ctx *cc = NULL;
    CHECK_OK(ft_codec_ctx_create(1, &cc));
    if (!a || !d || !cc) goto out;
    static const ft_dtype dts[] = {FT_BF16, FT_F32, FT_F16};
    for (size_t ci = 0; ci < sizeof g_codecs / sizeof g_codecs[0]; ci++)
        for (size_t di = 0; di < 3; di++) {
            const codec_case *k = &g_codecs[ci];
            ft_dtype dt = dts[di];
            int64_t shape[2] = {97, 515 + (int64_t)ci};   /* odd sizes: partial chunks and groups */
            uint64_t n = (uint64_t)shape[0] * (uint64_t)shape[1];
            size_t nb = (size_t)ft_dtype_nbytes(dt, n);
            ft_tensor t;
            ft_tensor_init(&t, dt, 2, shape, weights(dt, n, ci * 7 + di));
            ft_codec_params cp;
            ft_codec_default_params(&cp);
            cp.codec = k->codec;
            cp.entropy = k->entropy;
            cp.group_dim = k->gdim;
            cp.chunk_size = 16384;
            char key[64];
            snprintf(key, sizeof key, "%s/%s/%s", tag, k->name, ft_dtype_name(dt));
            CHECK_OK(ft_write_tensor(a, key, &t, &cp));
            /* the frame on the node == the frame encoded here */
            size_t bound = ft_encode_bound(&cp, dt, 2, shape), fs = 0, gs = 0;
            uint8_t *frame = ft_malloc_aligned(bound, 64);
            CHECK_OK(ft_encode(cc, &cp, &t, frame, bound, &fs));
            void *got = NULL;
            CHECK_OK(ft_store_get_frame(d, key, &got, &gs));
            CHECK_MSG(got && gs == fs && !memcmp(got, frame, fs), "%s %s: frame through the agent differs",
                      k->name, ft_dtype_name(dt));
            /* reads through the agent == local decoding */
            for (int od = -1; od <= FT_BF16; od++) {
                ft_tensor ref = {0}, r = {0};
                CHECK_OK(ft_decode_alloc(cc, frame, fs, od, &ref));
                uint64_t rb = 0;
                ft_tensor_nbytes(&ref, &rb);
                CHECK_OK(ft_read_tensor(a, key, od, &r));
                CHECK_MSG(r.data && r.dtype == ref.dtype && r.ndim == 2 && r.shape[0] == shape[0] &&
                              r.shape[1] == shape[1] && !memcmp(r.data, ref.data, rb),
                          "%s %s -> %d: read through the agent differs", k->name, ft_dtype_name(dt), od);
                if (od == -1 && !ft_codec_is_lossy(k->codec))
                    CHECK_MSG(r.data && !memcmp(r.data, t.data, nb), "%s: lossless read != source", k->name);
                /* into a caller buffer, asynchronously */
                ft_tensor into = {0};
                into.dtype = ref.dtype;
                into.data = ft_malloc_aligned(rb + 64, 64);
                memset(into.data, 0xee, rb + 64);
                ft_request *rq = NULL;
                CHECK_OK(ft_read_tensor_async(a, key, &into, rb + 64, &rq));
                CHECK_OK(ft_request_wait(rq, -1));
                ft_request_free(rq);
                CHECK(!memcmp(into.data, ref.data, rb) && ((uint8_t *)into.data)[rb] == 0xee);
                /* a buffer one byte short is refused, nothing written past it */
                if (rb) CHECK(ft_read_tensor_into(a, key, &into, rb - 1) == FT_ERR_BUFFER_SMALL);
                ft_free_aligned(into.data);
                ft_free_aligned(ref.data);
                ft_free_aligned(r.data);
            }
            ft_tensor_stat ts;
            CHECK_OK(ft_stat_tensor(a, key, &ts));
            CHECK(ts.codec == k->codec && ts.stored_bytes == fs && ts.raw_bytes == nb);
            ft_free_aligned(got);
            ft_free_aligned(frame);
            ft_free_aligned(t.data);
        }
    /* frame-level calls, list, delete, stats, a scalar and an empty tensor */
    {
        float one = 1.5f;
        ft_tensor sc = {FT_F32, 0, {0}, &one};
        CHECK_OK(ft_write_tensor(a, "scalar", &sc, NULL));
        ft_tensor r = {0};
        CHECK_OK(ft_read_tensor(a, "scalar", -1, &r));
        CHECK(r.data && r.ndim == 0 && *(float *)r.data == 1.5f);
        ft_free_aligned(r.data);
        int64_t z[2] = {0, 8};
        ft_tensor e;
        ft_tensor_init(&e, FT_BF16, 2, z, &one);   /* no bytes, but not NULL (store rule) */
        CHECK_OK(ft_write_tensor(a, "empty", &e, NULL));
        memset(&r, 0, sizeof r);
        CHECK_OK(ft_read_tensor(a, "empty", -1, &r));
        CHECK(r.ndim == 2 && r.shape[0] == 0 && r.shape[1] == 8);
        ft_free_aligned(r.data);
        void *f = NULL;
        size_t fsz = 0;
        CHECK_OK(ft_store_get_frame(a, "scalar", &f, &fsz));
        if (f) CHECK_OK(ft_store_put_frame(a, "scalar-copy", f, fsz));
        ft_free_aligned(f);
        memset(&r, 0, sizeof r);
        CHECK_OK(ft_read_tensor(d, "scalar-copy", -1, &r));
        CHECK(r.data && *(float *)r.data == 1.5f);
        ft_free_aligned(r.data);
        char **keys = NULL;
        size_t nk = 0;
        CHECK_OK(ft_list_tensors(a, &keys, &nk));
        CHECK(nk >= 3);
        ft_list_free(keys, nk);
        CHECK_OK(ft_delete_tensor(a, "scalar-copy"));
        CHECK(ft_delete_tensor(a, "scalar-copy") == FT_ERR_NOT_FOUND);
        memset(&r, 0, sizeof r);
        CHECK(ft_read_tensor(a, "scalar-copy", -1, &r) == FT_ERR_NOT_FOUND);
        ft_store_stats st;
        CHECK_OK(ft_store_stats_get(a, &st));
        CHECK(st.capacity >= (1ull << 30) && st.tensors >= 3);
        CHECK(ft_write_tensor(a, "bad key", &sc, NULL) == FT_ERR_INVALID_ARG);
    }
out:
    ft_codec_ctx_free(cc);
    ft_store_close(a);
    ft_store_close(d);
}

TEST(agent_roundtrips_every_codec)
{
    unsetenv("FLEXTIER_TOKEN_FILE");
    unsetenv("FLEXTIER_AGENT_NO_CMA");
    proc_t node, agent;
    int up_ = start_node(&node, NULL);
    REQUIRE(up_ == 0);
    /* UCX RMA over TCP (no RDMA here) only on a network named trusted */
    const char *aa[] = {"--trusted-network", NULL};
    up_ = start_agent(&agent, &node, aa);
    REQUIRE(up_ == 0);
    char au[200], nu[200];
    snprintf(au, sizeof au, "agent://%s", agent.hostport);
    snprintf(nu, sizeof nu, "ucx://%s", node.hostport);
    roundtrip_all(au, nu, "cma");
    /* the UCX RMA path (what a DPU uses) */
    setenv("FLEXTIER_AGENT_NO_CMA", "1", 1);
    snprintf(au, sizeof au, "agent://%s/%s", agent.hostport, node.hostport);   /* node named */
    roundtrip_all(au, nu, "rma");
    unsetenv("FLEXTIER_AGENT_NO_CMA");
    proc_stop(&agent, 0);
    proc_stop(&node, 0);
}

TEST(agent_tokens)
{
    unsetenv("FLEXTIER_TOKEN_FILE");
    char dir[] = "/tmp/ft-agent-tok-XXXXXX";
    REQUIRE(mkdtemp(dir) != NULL);
    char nt[96], at[96], bad[96];
    snprintf(nt, sizeof nt, "%s/node", dir);
    snprintf(at, sizeof at, "%s/agent", dir);
    snprintf(bad, sizeof bad, "%s/bad", dir);
    write_token(nt, "node-secret-0123456789\n");
    write_token(at, "agent-secret-0123456789\n");
    write_token(bad, "agent-secret-012345678X\n");
    proc_t node, agent;
    const char *na[] = {"--token-file", nt, NULL};
    int up_ = start_node(&node, na);
    REQUIRE(up_ == 0);
    /* the agent authenticates to the node with its own token */
    /* --trusted-network: under qemu-user (make test-aarch64) cross-memory
     * attach cannot reach the emulated client, UCX RMA over TCP can */
    const char *aa[] = {"--token-file", at, "--node-token-file", nt, "--trusted-network", NULL};
    up_ = start_agent(&agent, &node, aa);
    REQUIRE(up_ == 0);
    char au[200];
    snprintf(au, sizeof au, "agent://%s", agent.hostport);
    ft_store *s = NULL;
    CHECK(open_store(au, NULL, 0, 0, &s) == FT_ERR_AUTH);
    CHECK(open_store(au, bad, 0, 0, &s) == FT_ERR_AUTH);
    CHECK(open_store(au, nt, 0, 0, &s) == FT_ERR_AUTH);   /* the node's token is not the agent's */
    CHECK_OK(open_store(au, at, 0, 0, &s));
    if (s) {
        float v[4] = {1, 2, 3, 4};
        int64_t sh[1] = {4};
        ft_tensor t;
        ft_tensor_init(&t, FT_F32, 1, sh, v);
        CHECK_OK(ft_write_tensor(s, "k", &t, NULL));
        ft_store_close(s);
    }
    /* a memory node the agent does not serve */
    snprintf(au, sizeof au, "agent://%s/127.0.0.1:1", agent.hostport);
    s = NULL;
    CHECK(open_store(au, at, 0, 0, &s) == FT_ERR_INVALID_ARG);
    proc_stop(&agent, 0);
    /* an agent whose node token is wrong does not start */
    proc_t a2;
    const char *ab[] = {"--node-token-file", at, NULL};
    CHECK(start_agent(&a2, &node, ab) != 0);
    proc_stop(&node, 0);
    unlink(nt); unlink(at); unlink(bad);
    rmdir(dir);
}

typedef struct {
    ft_store *s;
    int id;
    int errors;
} client_arg;

static void *client_main(void *arg)
{
    client_arg *c = arg;
    ft_store *s = c->s;
    if (!s) { c->errors++; return NULL; }
    int64_t sh[2] = {64, 1000 + c->id};
    uint64_t n = (uint64_t)sh[0] * (uint64_t)sh[1];
    ft_tensor t;
    ft_tensor_init(&t, FT_BF16, 2, sh, weights(FT_BF16, n, (uint64_t)c->id));
    ft_codec_params cp;
    ft_codec_default_params(&cp);
    cp.codec = c->id % 2 ? FT_CODEC_BYTEPLANE : FT_CODEC_ZSTD;
    for (int i = 0; i < 6; i++) {
        char key[48];
        snprintf(key, sizeof key, "many/%d/%d", c->id, i);
        /* async writes and reads, several in flight per client */
        ft_request *w = NULL, *r = NULL;
        ft_tensor back = {0};
        if (ft_write_tensor_async(s, key, &t, &cp, &w) != FT_OK || ft_request_wait(w, -1) != FT_OK) c->errors++;
        ft_request_free(w);
        if (ft_read_tensor_async(s, key, &back, 0, &r) != FT_OK || ft_request_wait(r, -1) != FT_OK) c->errors++;
        ft_request_free(r);
        if (!back.data || memcmp(back.data, t.data, n * 2)) c->errors++;
        ft_free_aligned(back.data);
    }
    ft_free_aligned(t.data);
    ft_store_close(s);
    c->s = NULL;
    return NULL;
}

TEST(agent_many_clients)
{
    unsetenv("FLEXTIER_TOKEN_FILE");
    proc_t node, agent;
    int up_ = start_node(&node, NULL);
    REQUIRE(up_ == 0);
    const char *aa[] = {"--max-staging", "1M", "--trusted-network", NULL};   /* clients queue for staging */
    up_ = start_agent(&agent, &node, aa);
    REQUIRE(up_ == 0);
    char au[200];
    snprintf(au, sizeof au, "agent://%s", agent.hostport);
    enum { NC = 8 };
    pthread_t th[NC];
    client_arg args[NC];
    for (int i = 0; i < NC; i++) {
        args[i] = (client_arg){NULL, i, 0};
        if (i == NC - 1) setenv("FLEXTIER_AGENT_NO_CMA", "1", 1);   /* mixed data paths */
        CHECK_OK(open_store(au, NULL, 4, 0, &args[i].s));
    }
    unsetenv("FLEXTIER_AGENT_NO_CMA");
    for (int i = 0; i < NC; i++) pthread_create(&th[i], NULL, client_main, &args[i]);
    int errors = 0;
    for (int i = 0; i < NC; i++) {
        pthread_join(th[i], NULL);
        errors += args[i].errors;
    }
    CHECK_MSG(errors == 0, "%d errors across %d concurrent clients", errors, NC);
    proc_stop(&agent, 0);
    proc_stop(&node, 0);
}

typedef struct {
    ft_store *s;
    ft_tensor *t;
    volatile int stop;
    ft_status last;
    double failed_at;
    int done;
} writer_arg;

static void *writer_main(void *arg)
{
    writer_arg *w = arg;
    ft_codec_params cp;
    ft_codec_default_params(&cp);
    cp.codec = FT_CODEC_BYTEPLANE;
    for (int i = 0; !w->stop; i++) {
        char key[32];
        snprintf(key, sizeof key, "big/%d", i % 2);
        ft_status st = ft_write_tensor(w->s, key, w->t, &cp);
        if (st != FT_OK) {
            w->last = st;
            w->failed_at = ft_now();
            break;
        }
        w->done++;
    }
    return NULL;
}

/* The agent dies (SIGKILL) while a client is writing through it: the
 * client gets an error in bounded time; what was committed before is
 * intact on the node; a half-sent tensor never appears. */
TEST(agent_killed_mid_transfer)
{
    unsetenv("FLEXTIER_TOKEN_FILE");
    proc_t node, agent;
    int up_ = start_node(&node, NULL);
    REQUIRE(up_ == 0);
    /* UCX RMA over TCP (no RDMA here) only on a network named trusted */
    const char *aa[] = {"--trusted-network", NULL};
    up_ = start_agent(&agent, &node, aa);
    REQUIRE(up_ == 0);
    char au[200], nu[200];
    snprintf(au, sizeof au, "agent://%s", agent.hostport);
    snprintf(nu, sizeof nu, "ucx://%s", node.hostport);
    ft_store *s = NULL, *d = NULL;
    CHECK_OK(open_store(au, NULL, 0, 5000, &s));
    CHECK_OK(open_store(nu, NULL, 0, 5000, &d));
    if (!s || !d) { ft_store_close(s); ft_store_close(d); return; }
    int64_t sh[2] = {2048, 4096};   /* 16 MiB bf16: long enough to be caught in flight */
    uint64_t n = (uint64_t)sh[0] * (uint64_t)sh[1];
    ft_tensor t;
    ft_tensor_init(&t, FT_BF16, 2, sh, weights(FT_BF16, n, 5));
    ft_codec_params cp;
    ft_codec_default_params(&cp);
    cp.codec = FT_CODEC_Q4;
    CHECK_OK(ft_write_tensor(s, "committed", &t, &cp));
    void *before = NULL;
    size_t bs = 0;
    CHECK_OK(ft_store_get_frame(d, "committed", &before, &bs));

    writer_arg w = {s, &t, 0, FT_OK, 0, 0};
    pthread_t th;
    pthread_create(&th, NULL, writer_main, &w);
    usleep(400000);
    double killed = ft_now();
    proc_stop(&agent, 1);
    pthread_join(th, NULL);
    w.stop = 1;
    CHECK_MSG(w.last == FT_ERR_NET || w.last == FT_ERR_TIMEOUT,
              "write through a killed agent: %s", ft_status_str(w.last));
    CHECK_MSG(w.failed_at - killed < 8.0, "client noticed the dead agent after %.1f s", w.failed_at - killed);

    /* committed data intact, byte for byte */
    void *after = NULL;
    size_t as = 0;
    CHECK_OK(ft_store_get_frame(d, "committed", &after, &as));
    CHECK(after && as == bs && !memcmp(after, before, bs));
    ft_free_aligned(after);
    /* every big/ key present is complete and decodes to the source */
    for (int i = 0; i < 2; i++) {
        char key[32];
        snprintf(key, sizeof key, "big/%d", i);
        ft_tensor r = {0};
        ft_status st = ft_read_tensor(d, key, -1, &r);
        CHECK(st == FT_OK || st == FT_ERR_NOT_FOUND);
        if (st == FT_OK) CHECK(r.data && !memcmp(r.data, t.data, n * 2));
        ft_free_aligned(r.data);
    }
    /* the store reconnects once an agent is back (same port not
     * guaranteed free: a new store on a new agent) */
    proc_t a2;
    up_ = start_agent(&a2, &node, aa);
    if (up_ == 0) {
        char au2[200];
        snprintf(au2, sizeof au2, "agent://%s", a2.hostport);
        ft_store *s2 = NULL;
        CHECK_OK(open_store(au2, NULL, 0, 5000, &s2));
        ft_tensor r = {0};
        if (s2) CHECK_OK(ft_read_tensor(s2, "committed", -1, &r));
        ft_free_aligned(r.data);
        ft_store_close(s2);
        proc_stop(&a2, 0);
    }
    ft_free_aligned(before);
    ft_free_aligned(t.data);
    ft_store_close(s);
    ft_store_close(d);
    proc_stop(&node, 0);
}

TEST(agent_bad_uris)
{
    ft_store *s = NULL;
    CHECK(open_store("agent://", NULL, 0, 2000, &s) == FT_ERR_INVALID_ARG);
    CHECK(open_store("agent://nohostport", NULL, 0, 2000, &s) == FT_ERR_INVALID_ARG);
    CHECK(open_store("agent://127.0.0.1:1/notanode", NULL, 0, 2000, &s) == FT_ERR_INVALID_ARG);
    ft_status st = open_store("agent://127.0.0.1:1", NULL, 0, 2000, &s);
    CHECK(st == FT_ERR_NET || st == FT_ERR_TIMEOUT);
    ft_agent_params p;
    ft_agent_default_params(&p);
    CHECK(ft_agent_run(&p) == FT_ERR_INVALID_ARG);   /* no memory node */
    p.nodes[0] = "file:/tmp";
    p.n_nodes = 1;
    CHECK(ft_agent_run(&p) == FT_ERR_INVALID_ARG);
}

/* The wire messages: every rule of the parsers. */
TEST(agent_msg_rules)
{
    uint8_t h[FT_AMSG_MAX_HDR];
    ft_amsg m;
    size_t n = ft_amsg_encode(h, FT_AOP_WRITE, 7, 0, "k", 1, 10, 0x1000, 64, 0);
    CHECK_OK(ft_amsg_parse(h, n, 10, 0, 1 << 20, &m));
    CHECK(m.opcode == FT_AOP_WRITE && m.req_id == 7 && m.addr == 0x1000 && m.len == 64);
    CHECK(ft_amsg_parse(h, n, 11, 0, 1 << 20, &m) == FT_ERR_PROTOCOL);   /* length mismatch */
    CHECK(ft_amsg_parse(h, n, 10, 1, 1 << 20, &m) == FT_ERR_PROTOCOL);   /* not a reply */
    CHECK(ft_amsg_parse(h, n - 1, 10, 0, 1 << 20, &m) == FT_ERR_PROTOCOL);
    n = ft_amsg_encode(h, FT_AOP_WRITE, 7, 0, NULL, 0, 10, 0, 0, 0);
    CHECK(ft_amsg_parse(h, n, 10, 0, 1 << 20, &m) == FT_ERR_PROTOCOL);   /* missing key */
    n = ft_amsg_encode(h, FT_AOP_LIST, 7, 0, "k", 1, 0, 0, 0, 0);
    CHECK(ft_amsg_parse(h, n, 0, 0, 1 << 20, &m) == FT_ERR_PROTOCOL);    /* unexpected key */
    n = ft_amsg_encode(h, FT_AOP_DEL, 7, 0, "k", 1, 0, 5, 0, 0);
    CHECK(ft_amsg_parse(h, n, 0, 0, 1 << 20, &m) == FT_ERR_PROTOCOL);    /* buffer on DEL */
    n = ft_amsg_encode(h, FT_AOP_CMA, 7, 0, NULL, 0, 15, 0, 0, 0);
    CHECK(ft_amsg_parse(h, n, 15, 0, 1 << 20, &m) == FT_ERR_PROTOCOL);
    n = ft_amsg_encode(h, 11, 7, 0, NULL, 0, 0, 0, 0, 0);
    CHECK(ft_amsg_parse(h, n, 0, 0, 1 << 20, &m) == FT_ERR_PROTOCOL);    /* unknown op */
    n = ft_amsg_encode(h, FT_AOP_READ | FT_AOP_REPLY, 7, 1, NULL, 0, 0, 0, 0, 0);
    CHECK(ft_amsg_parse(h, n, 0, 1, 1 << 20, &m) == FT_ERR_PROTOCOL);    /* positive status */
    h[4] = 1;   /* protocol 1: UCX sockaddr, the token in clear */
    CHECK(ft_amsg_parse(h, n, 0, 1, 1 << 20, &m) == FT_ERR_UNSUPPORTED);

    uint8_t b[FT_AMSG_MAX_HELLO];
    ft_amsg_hello hh;
    size_t bl = ft_amsg_hello_encode(b, sizeof b, "10.0.0.1:7000", "WA", 2);
    CHECK_OK(ft_amsg_hello_parse(b, bl, &hh));
    CHECK(!strcmp(hh.node, "10.0.0.1:7000") && hh.waddr_len == 2);
    CHECK(ft_amsg_hello_parse(b, bl - 1, &hh) == FT_ERR_PROTOCOL);
    CHECK(ft_amsg_hello_parse(b, bl + 1, &hh) == FT_ERR_PROTOCOL);

    int64_t sh[2] = {3, 5};
    ft_tensor t, t2;
    ft_tensor_init(&t, FT_BF16, 2, sh, NULL);
    ft_codec_params cp, cp2;
    ft_codec_default_params(&cp);
    cp.codec = FT_CODEC_Q4;
    bl = ft_amsg_write_encode(b, sizeof b, &t, &cp, "RK", 2);
    const uint8_t *rk;
    size_t rkl;
    CHECK_OK(ft_amsg_write_parse(b, bl, &t2, &cp2, &rk, &rkl));
    CHECK(t2.dtype == FT_BF16 && t2.ndim == 2 && t2.shape[1] == 5 && cp2.codec == FT_CODEC_Q4 && rkl == 2);
    CHECK(ft_amsg_write_parse(b, bl - 1, &t2, &cp2, &rk, &rkl) == FT_ERR_PROTOCOL);
    b[0] = 99;   /* dtype */
    CHECK(ft_amsg_write_parse(b, bl, &t2, &cp2, &rk, &rkl) == FT_ERR_PROTOCOL);
    bl = ft_amsg_write_encode(b, sizeof b, &t, &cp, "RK", 2);
    b[8 + 8 * 3] = 1;   /* an unused dim set */
    CHECK(ft_amsg_write_parse(b, bl, &t2, &cp2, &rk, &rkl) == FT_ERR_PROTOCOL);
    int od;
    bl = ft_amsg_read_encode(b, sizeof b, -1, "RK", 2);
    CHECK_OK(ft_amsg_read_parse(b, bl, &od, &rk, &rkl));
    CHECK(od == -1 && rkl == 2);
    b[0] = 50;
    CHECK(ft_amsg_read_parse(b, bl, &od, &rk, &rkl) == FT_ERR_PROTOCOL);

    char *keys[] = {"a", "bb/c"};
    uint8_t *lb = NULL;
    size_t ll = 0;
    CHECK_OK(ft_amsg_list_encode(keys, 2, &lb, &ll));
    char **back = NULL;
    size_t nb = 0;
    CHECK_OK(ft_amsg_list_parse(lb, ll, &back, &nb));
    CHECK(nb == 2 && !strcmp(back[1], "bb/c"));
    ft_list_free(back, nb);
    CHECK(ft_amsg_list_parse(lb, ll - 1, &back, &nb) == FT_ERR_PROTOCOL);
    free(lb);
}
