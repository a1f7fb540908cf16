/* The memory node: `flextier serve` started by the test (FT_BIN) on
 * 127.0.0.1 with a free port, and the ucx:// client in this process. */
#include "support/store_checks.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "support/cli_run.h"
#include "support/server_util.h"


static ft_status open_client(const srv_t *s, const char *token_file, unsigned depth,
                             ft_store **out)
{
    ft_store_params p;
    ft_store_default_params(&p);
    p.token_file = token_file;
    p.timeout_ms = 8000;
    if (depth) p.queue_depth = depth;
    return ft_store_open(s->uri, &p, out);
}

static void fill(void *p, size_t n, uint64_t seed)
{
    uint64_t *q = p;
    for (size_t i = 0; i < n / 8; i++) q[i] = ft_test_rand(&seed);
}

static int wait_used(ft_store *s, uint64_t want, double secs)
{
    double dl = ft_now() + secs;
    ft_store_stats st;
    do {
        if (ft_store_stats_get(s, &st) == FT_OK && st.used == want) return 1;
        usleep(50000);
    } while (ft_now() < dl);
    return 0;
}

TEST(net_roundtrips_list_delete_stat)
{
    unsetenv("FLEXTIER_TOKEN_FILE");
    srv_t srv;
    const char *args[] = {"--capacity", "256M", NULL};
    int up_ = srv_start(&srv, "127.0.0.1:0", args);   /* REQUIRE evaluates twice */
    REQUIRE(up_ == 0);
    ft_store *s = NULL, *s2 = NULL;
    CHECK_OK(open_client(&srv, NULL, 8, &s));
    CHECK_OK(open_client(&srv, NULL, 0, &s2));
    if (s && s2) {
        tw_codec_roundtrips(s, "u");
        tw_async(s, "ua", 48, 60000);
        tw_overwrite_during_read(s, s2, "uo");
        ft_store_stats st;
        CHECK_OK(ft_store_stats_get(s, &st));
        CHECK(st.capacity >= 256u << 20 && st.connections == 2 && st.tensors >= 48);
        CHECK(st.bytes_in > 0 && st.bytes_out > 0 && st.puts > 48 && st.gets > 48);
        /* delete everything: the pool is empty again (no leaked blocks) */
        char **keys = NULL;
        size_t n = 0;
        CHECK_OK(ft_list_tensors(s, &keys, &n));
        CHECK(n == st.tensors);
        for (size_t i = 0; i < n; i++) CHECK_OK(ft_delete_tensor(s, keys[i]));
        ft_list_free(keys, n);
        CHECK(wait_used(s, 0, 5));
    }
    ft_store_close(s);
    ft_store_close(s2);
    CHECK(srv_stop(&srv) == 0);   /* clean shutdown on SIGTERM */
}

typedef struct { const srv_t *srv; int id; int errors; } cc_arg;
static void *client_thread(void *arg)
{
    cc_arg *a = arg;
    ft_store *s = NULL;
    if (open_client(a->srv, NULL, 2, &s) != FT_OK) { a->errors++; return NULL; }
    const uint64_t n = 128 * 1024;
    uint16_t *src = ft_malloc_aligned(n * 2, 64), *dst = ft_malloc_aligned(n * 2, 64);
    int64_t shape[1] = {(int64_t)n};
    ft_codec_params p;
    ft_codec_default_params(&p);
    p.codec = a->id % 2 ? FT_CODEC_ZSTD : FT_CODEC_RAW;
    for (int i = 0; i < 12; i++) {
        char key[32];
        snprintf(key, sizeof key, "c%d/%d", a->id, i);
        fill(src, n * 2, (uint64_t)(a->id * 100 + i));
        ft_tensor t;
        ft_tensor_init(&t, FT_BF16, 1, shape, src);
        if (ft_write_tensor(s, key, &t, &p) != FT_OK) { a->errors++; continue; }
        ft_tensor d = {.dtype = FT_BF16, .data = dst};
        if (ft_read_tensor_into(s, key, &d, n * 2) != FT_OK || memcmp(src, dst, n * 2)) a->errors++;
    }
    ft_free_aligned(src);
    ft_free_aligned(dst);
    ft_store_close(s);
    return NULL;
}

/* Frames larger than one read range take the pipelined path (ranges in
 * flight, chunks decoded as they arrive); overwrites during such reads
 * restart them, never mix versions. */
TEST(net_large_pipelined_reads)
{
    srv_t srv;
    const char *args[] = {"--capacity", "512M", NULL};
    int up_ = srv_start(&srv, "127.0.0.1:0", args);   /* REQUIRE evaluates twice */
    REQUIRE(up_ == 0);
    ft_store *s = NULL, *s2 = NULL;
    CHECK_OK(open_client(&srv, NULL, 4, &s));
    CHECK_OK(open_client(&srv, NULL, 0, &s2));
    if (s && s2) {
        const uint64_t n = 5u << 20;   /* 10 MiB of bf16 */
        int64_t shape[2] = {5 << 10, 1024};
        void *src = tw_make(FT_BF16, n, 21);
        float *f32 = ft_malloc_aligned(n * 4, 64);
        for (size_t ci = 0; ci < sizeof tw_codecs / sizeof tw_codecs[0]; ci++) {
            ft_codec_id c = tw_codecs[ci];
            if (!tw_codec_available(c)) continue;
            ft_codec_params p;
            ft_codec_default_params(&p);
            p.codec = c;
            ft_tensor t, out;
            ft_tensor_init(&t, FT_BF16, 2, shape, src);
            CHECK_OK(ft_write_tensor(s, "L", &t, &p));
            CHECK_OK(ft_read_tensor(s, "L", -1, &out));
            CHECK(out.dtype == FT_BF16 && out.ndim == 2 && out.shape[0] == shape[0]);
            if (!ft_codec_is_lossy(c))
                CHECK_MSG(!memcmp(out.data, src, n * 2), "%s", ft_codec_name(c));
            ft_free_aligned(out.data);
            ft_tensor d = {.dtype = FT_F32, .data = f32};
            CHECK_OK(ft_read_tensor_into(s, "L", &d, n * 4));
            if (!ft_codec_is_lossy(c))
                CHECK(f32[n - 7] == tw_get(src, FT_BF16, n - 7) && f32[3] == tw_get(src, FT_BF16, 3));
            CHECK(ft_read_tensor_into(s, "L", &d, n * 4 - 4) == FT_ERR_BUFFER_SMALL);
        }
        ft_free_aligned(src);
        ft_free_aligned(f32);
        tw_overwrite_during_read_n(s, s2, "big", 6u << 20, 8);   /* 12 MiB */
        tw_async(s, "la", 6, 3u << 20);                            /* 6 MiB each */
    }
    ft_store_close(s);
    ft_store_close(s2);
    CHECK(srv_stop(&srv) == 0);
}

TEST(net_concurrent_clients)
{
    srv_t srv;
    const char *args[] = {"--capacity", "128M", NULL};
    int up_ = srv_start(&srv, "127.0.0.1:0", args);   /* REQUIRE evaluates twice */
    REQUIRE(up_ == 0);
    pthread_t th[4];
    cc_arg a[4];
    for (int i = 0; i < 4; i++) {
        a[i] = (cc_arg){&srv, i, 0};
        pthread_create(&th[i], NULL, client_thread, &a[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        CHECK_MSG(a[i].errors == 0, "client %d: %d errors", i, a[i].errors);
    }
    ft_store *s = NULL;
    CHECK_OK(open_client(&srv, NULL, 0, &s));
    char **keys = NULL;
    size_t n = 0;
    if (s) CHECK_OK(ft_list_tensors(s, &keys, &n));
    CHECK(n == 48);
    ft_list_free(keys, n);
    ft_store_close(s);
    CHECK(srv_stop(&srv) == 0);
}

TEST(net_auth)
{
    char good[] = "/tmp/ft_test_tokenXXXXXX", bad[] = "/tmp/ft_test_badtokXXXXXX";
    int fd = mkstemp(good), fd2 = mkstemp(bad);
    REQUIRE(fd >= 0 && fd2 >= 0);
    CHECK(write(fd, "s3cret-token-0123456789\n", 24) == 24);
    CHECK(write(fd2, "s3cret-token-0123456788\n", 24) == 24);
    close(fd);
    close(fd2);
    srv_t srv;
    const char *args[] = {"--capacity", "16M", "--token-file", good, NULL};
    int up_ = srv_start(&srv, "127.0.0.1:0", args);   /* REQUIRE evaluates twice */
    REQUIRE(up_ == 0);
    ft_store *s = NULL;
    unsetenv("FLEXTIER_TOKEN_FILE");
    CHECK(open_client(&srv, NULL, 0, &s) == FT_ERR_AUTH && !s);        /* missing */
    CHECK(open_client(&srv, bad, 0, &s) == FT_ERR_AUTH && !s);         /* wrong   */
    CHECK(open_client(&srv, "/nonexistent/token", 0, &s) == FT_ERR_IO);
    setenv("FLEXTIER_TOKEN_FILE", good, 1);                            /* env var */
    CHECK_OK(open_client(&srv, NULL, 0, &s));
    unsetenv("FLEXTIER_TOKEN_FILE");
    if (s) {
        int64_t shape[1] = {1024};
        uint16_t v[1024];
        fill(v, sizeof v, 5);
        ft_tensor t, out;
        ft_tensor_init(&t, FT_BF16, 1, shape, v);
        CHECK_OK(ft_write_tensor(s, "secret", &t, NULL));
        CHECK_OK(ft_read_tensor(s, "secret", -1, &out));
        CHECK(!memcmp(out.data, v, sizeof v));
        ft_free_aligned(out.data);
    }
    ft_store_close(s);
    CHECK(srv_stop(&srv) == 0);
    unlink(good);
    unlink(bad);
}

TEST(net_capacity_exhausted)
{
    srv_t srv;
    const char *args[] = {"--capacity", "1M", NULL};
    int up_ = srv_start(&srv, "127.0.0.1:0", args);   /* REQUIRE evaluates twice */
    REQUIRE(up_ == 0);
    ft_store *s = NULL;
    CHECK_OK(open_client(&srv, NULL, 0, &s));
    if (s) {
        static uint16_t big[1 << 20];   /* 2 MiB */
        fill(big, sizeof big, 9);
        int64_t shape[1] = {1 << 20};
        ft_tensor t;
        ft_tensor_init(&t, FT_BF16, 1, shape, big);
        CHECK(ft_write_tensor(s, "big", &t, NULL) == FT_ERR_NO_SPACE);
        shape[0] = 200000;   /* 400 KB */
        ft_tensor_init(&t, FT_BF16, 1, shape, big);
        CHECK_OK(ft_write_tensor(s, "a", &t, NULL));
        CHECK_OK(ft_write_tensor(s, "b", &t, NULL));
        CHECK(ft_write_tensor(s, "c", &t, NULL) == FT_ERR_NO_SPACE);
        /* an overwrite needs room for the new copy before the old goes */
        CHECK_OK(ft_delete_tensor(s, "a"));
        CHECK_OK(ft_write_tensor(s, "c", &t, NULL));
        ft_tensor out;
        CHECK_OK(ft_read_tensor(s, "b", -1, &out));
        CHECK(out.shape[0] == 200000 && !memcmp(out.data, big, 400000));
        ft_free_aligned(out.data);
        CHECK(ft_read_tensor(s, "a", -1, &out) == FT_ERR_NOT_FOUND);
    }
    ft_store_close(s);
    CHECK(srv_stop(&srv) == 0);
}

TEST(net_spill_and_reload)
{
    char dir[] = "/tmp/ft_test_spillXXXXXX";
    char *made = mkdtemp(dir);
    REQUIRE(made);
    char stale[64];
    snprintf(stale, sizeof stale, "%s/ftspill-3.bin", dir);   /* left by a crashed node */
    FILE *sf = fopen(stale, "w");
    if (sf) { fputs("stale", sf); fclose(sf); }
    srv_t srv;
    const char *args[] = {"--capacity", "1M", "--spill-dir", dir, "--spill-capacity", "8M", NULL};
    int up_ = srv_start(&srv, "127.0.0.1:0", args);   /* REQUIRE evaluates twice */
    REQUIRE(up_ == 0);
    ft_store *s = NULL;
    CHECK_OK(open_client(&srv, NULL, 0, &s));
    if (s) {
        enum { N = 8, E = 150000 };   /* 8 x 300 KB = 2.4 MB > 1 MB pool */
        static uint16_t src[N][E], dst[E];
        int64_t shape[1] = {E};
        for (int i = 0; i < N; i++) {
            fill(src[i], sizeof src[i], 77 + (uint64_t)i);
            char key[16];
            snprintf(key, sizeof key, "s%d", i);
            ft_tensor t;
            ft_tensor_init(&t, FT_BF16, 1, shape, src[i]);
            CHECK_OK(ft_write_tensor(s, key, &t, NULL));
        }
        ft_store_stats st;
        CHECK_OK(ft_store_stats_get(s, &st));
        CHECK(st.tensors == N && st.spilled_tensors >= 5 && st.spill_used > 0 && st.used <= st.capacity);
        ft_tensor_stat ts;
        CHECK_OK(ft_stat_tensor(s, "s0", &ts));        /* header of a spilled one */
        CHECK(ts.raw_bytes == 2 * E);
        /* s1 (entry 2, spilled early) gets corrupted on disk: its GET says
         * so and drops it; nothing else is affected */
        char sp[96];
        snprintf(sp, sizeof sp, "%s/ftspill-2.bin", dir);
        int sfd = open(sp, O_RDWR);
        CHECK(sfd >= 0);
        if (sfd >= 0) {
            unsigned char b = 0;
            CHECK(pread(sfd, &b, 1, 100000) == 1);
            b ^= 1;
            CHECK(pwrite(sfd, &b, 1, 100000) == 1);
            close(sfd);
        }
        {
            ft_tensor d = {.dtype = FT_BF16, .data = dst};
            CHECK(ft_read_tensor_into(s, "s1", &d, sizeof dst) == FT_ERR_CORRUPT);
            CHECK(ft_read_tensor_into(s, "s1", &d, sizeof dst) == FT_ERR_NOT_FOUND);
            ft_tensor_init(&d, FT_BF16, 1, shape, src[1]);
            CHECK_OK(ft_write_tensor(s, "s1", &d, NULL));   /* written again */
        }
        for (int round = 0; round < 2; round++)
            for (int i = 0; i < N; i++) {
                char key[16];
                snprintf(key, sizeof key, "s%d", i);
                ft_tensor d = {.dtype = FT_BF16, .data = dst};
                CHECK_OK(ft_read_tensor_into(s, key, &d, sizeof dst));
                CHECK_MSG(!memcmp(dst, src[i], sizeof dst), "tensor %d after reload", i);
            }
        CHECK_OK(ft_delete_tensor(s, "s0"));
        CHECK_OK(ft_delete_tensor(s, "s7"));
        CHECK_OK(ft_store_stats_get(s, &st));
        CHECK(st.tensors == N - 2);
        /* spill capacity is bounded too */
        static uint16_t big[4 << 20];   /* 8 MiB > pool, fits neither */
        int64_t bs[1] = {4 << 20};
        ft_tensor t;
        ft_tensor_init(&t, FT_BF16, 1, bs, big);
        CHECK(ft_write_tensor(s, "huge", &t, NULL) == FT_ERR_NO_SPACE);
    }
    ft_store_close(s);
    CHECK(srv_stop(&srv) == 0);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rmdir %s", dir);   /* the server removed its spill files */
    CHECK(system(cmd) == 0);
}

typedef struct { ft_store *s; size_t n; volatile int stop; ft_status err; double err_at; int reads; } rd_arg;
static void *reader(void *arg)
{
    rd_arg *a = arg;
    void *buf = ft_malloc_aligned(a->n, 64);
    while (!a->stop) {
        ft_tensor d = {.dtype = FT_BF16, .data = buf};
        ft_status st = ft_read_tensor_into(a->s, "big", &d, a->n);
        if (st != FT_OK) { a->err = st; a->err_at = ft_now(); break; }
        a->reads++;
    }
    ft_free_aligned(buf);
    return NULL;
}

TEST(net_server_killed_then_restarted)
{
    srv_t srv;
    const char *args[] = {"--capacity", "256M", NULL};
    int up_ = srv_start(&srv, "127.0.0.1:0", args);   /* REQUIRE evaluates twice */
    REQUIRE(up_ == 0);
    ft_store *s = NULL;
    CHECK_OK(open_client(&srv, NULL, 0, &s));
    REQUIRE(s);
    const size_t n = 48u << 20;
    uint16_t *big = ft_malloc_aligned(n, 64);
    fill(big, n, 3);
    int64_t shape[1] = {(int64_t)(n / 2)};
    ft_tensor t;
    ft_tensor_init(&t, FT_BF16, 1, shape, big);
    CHECK_OK(ft_write_tensor(s, "big", &t, NULL));
    rd_arg a = {s, n, 0, FT_OK, 0, 0};
    pthread_t th;
    pthread_create(&th, NULL, reader, &a);
    usleep(300000);
    double killed = ft_now();
    kill(srv.pid, SIGKILL);
    waitpid(srv.pid, NULL, 0);
    ft_proc_forget(srv.pid);
    for (int i = 0; i < 150 && a.err == FT_OK; i++) usleep(100000);
    a.stop = 1;
    pthread_join(th, NULL);
    CHECK_MSG(a.err == FT_ERR_NET || a.err == FT_ERR_TIMEOUT, "reader got %s after %d reads",
              ft_status_str(a.err), a.reads);
    CHECK_MSG(a.err_at - killed < 10.0, "error after %.1f s", a.err_at - killed);
    printf("     reads before kill: %d, error %.2f s after SIGKILL\n", a.reads, a.err_at - killed);
    /* calls fail fast while it is down */
    ft_tensor out;
    double t0 = ft_now();
    CHECK(ft_read_tensor(s, "big", -1, &out) != FT_OK);
    CHECK(ft_now() - t0 < 10.0);
    /* restart on the same port: the same store reconnects */
    char listen[64];
    snprintf(listen, sizeof listen, "127.0.0.1:%d", srv.port);
    srv_t srv2;
    int up = -1;
    for (int i = 0; i < 20 && up != 0; i++) {
        up = srv_start(&srv2, listen, args);
        if (up) usleep(250000);
    }
    CHECK(up == 0);
    if (up == 0) {
        CHECK(ft_read_tensor(s, "big", -1, &out) == FT_ERR_NOT_FOUND);   /* memory is gone */
        CHECK_OK(ft_write_tensor(s, "big", &t, NULL));
        CHECK_OK(ft_read_tensor(s, "big", -1, &out));
        CHECK(out.shape[0] == shape[0] && !memcmp(out.data, big, n));
        ft_free_aligned(out.data);
        ft_store_close(s);
        s = NULL;
        CHECK(srv_stop(&srv2) == 0);
    }
    ft_store_close(s);
    ft_free_aligned(big);
}

TEST(net_client_killed_mid_write)
{
    srv_t srv;
    const char *args[] = {"--capacity", "512M", NULL};
    int up_ = srv_start(&srv, "127.0.0.1:0", args);   /* REQUIRE evaluates twice */
    REQUIRE(up_ == 0);
    const size_t n = 64u << 20;
    uint8_t *data = ft_malloc_aligned(n, 64);
    fill(data, n, 11);
    char path[] = "/tmp/ft_test_victimXXXXXX";
    int fd = mkstemp(path);
    REQUIRE(fd >= 0);
    CHECK(write(fd, data, n) == (ssize_t)n);
    close(fd);
    ft_store *s = NULL;
    CHECK_OK(open_client(&srv, NULL, 0, &s));
    REQUIRE(s);
    const int delays_ms[] = {40, 90, 150, 250};
    int complete = 0, absent = 0;
    for (int k = 0; k < 4; k++) {
        pid_t pid = fork();
        if (pid == 0) {
            int null = open("/dev/null", O_WRONLY);
            if (null >= 0) { dup2(null, 1); dup2(null, 2); }
            execl(ft_test_bin(), "flextier", "put", srv.uri, "victim", path, "--dtype", "u8",
                  (char *)NULL);
            _exit(127);
        }
        usleep((useconds_t)delays_ms[k] * 1000);
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        /* the key is absent or complete, never partial */
        ft_tensor out;
        ft_status st = ft_read_tensor(s, "victim", -1, &out);
        CHECK_MSG(st == FT_OK || st == FT_ERR_NOT_FOUND, "%s", ft_status_str(st));
        if (st == FT_OK) {
            CHECK(out.shape[0] == (int64_t)n && !memcmp(out.data, data, n));
            ft_free_aligned(out.data);
            complete++;
            CHECK_OK(ft_delete_tensor(s, "victim"));
        } else {
            absent++;
        }
    }
    printf("     killed writers: %d left a complete tensor, %d none\n", complete, absent);
    /* the server keeps serving and frees the aborted transfers' blocks */
    int64_t shape[1] = {4096};
    ft_tensor t, out;
    ft_tensor_init(&t, FT_U8, 1, shape, data);
    CHECK_OK(ft_write_tensor(s, "after", &t, NULL));
    CHECK_OK(ft_read_tensor(s, "after", -1, &out));
    CHECK(!memcmp(out.data, data, 4096));
    ft_free_aligned(out.data);
    CHECK_OK(ft_delete_tensor(s, "after"));
    CHECK(wait_used(s, 0, 8));
    ft_store_close(s);
    CHECK(srv_stop(&srv) == 0);
    unlink(path);
    ft_free_aligned(data);
}

TEST(net_connect_refused)
{
    /* nothing listens on this port: an error within the timeout, no hang */
    srv_t none = {.pid = 0, .port = 1, .uri = "ucx://127.0.0.1:1"};
    ft_store *s = NULL;
    double t0 = ft_now();
    ft_status st = open_client(&none, NULL, 0, &s);
    CHECK(st == FT_ERR_NET || st == FT_ERR_TIMEOUT);
    CHECK(!s && ft_now() - t0 < 10.0);
}

#include "net/raw_client.h"

static size_t enc(uint8_t *h, uint16_t op, uint64_t id, int32_t status, const char *key,
                  uint64_t dlen, uint64_t aux, uint64_t arg, uint64_t xid)
{
    ft_msg m;
    memset(&m, 0, sizeof m);
    m.opcode = op;
    m.req_id = id;
    m.status = status;
    m.key = key;
    m.key_len = key ? (uint32_t)strlen(key) : 0;
    m.data_len = dlen;
    m.aux = aux;
    m.arg = arg;
    m.xid = xid;
    return ft_msg_encode(h, &m);
}

TEST(msg_parse_rules)
{
    uint8_t h[FT_MSG_MAX_HDR];
    ft_msg m;
    size_t n = enc(h, FT_OP_PUT, 42, 0, "k/1", 1000, 0xabc, 7, 0);
    CHECK(n == FT_MSG_HDR_SIZE + 3);
    CHECK_OK(ft_msg_parse(h, n, 0, 1 << 20, &m));
    CHECK(m.opcode == FT_OP_PUT && m.req_id == 42 && m.key_len == 3 && !memcmp(m.key, "k/1", 3) &&
          m.data_len == 1000 && m.aux == 0xabc && m.arg == 7);
    size_t hl = 0;
    CHECK_OK(ft_msg_header_len(h, &hl));
    CHECK(hl == n);
    CHECK(ft_msg_parse(h, n, 0, 999, &m) == FT_ERR_NO_SPACE);         /* over the limit */
    CHECK(ft_msg_parse(h, n - 1, 0, 1 << 20, &m) == FT_ERR_PROTOCOL); /* truncated key */
    CHECK(ft_msg_parse(h, n, 1, 1 << 20, &m) == FT_ERR_PROTOCOL);     /* not a reply */
    h[4] = 1;
    CHECK(ft_msg_parse(h, n, 0, 1 << 20, &m) == FT_ERR_UNSUPPORTED);  /* protocol 1 */
    CHECK(ft_msg_header_len(h, &hl) == FT_ERR_UNSUPPORTED);
    n = enc(h, FT_OP_GET, 1, 0, NULL, 0, 0, 0, 0);
    CHECK(ft_msg_parse(h, n, 0, 1 << 20, &m) == FT_ERR_PROTOCOL);     /* GET needs a key */
    n = enc(h, 99, 1, 0, NULL, 0, 0, 0, 0);
    CHECK(ft_msg_parse(h, n, 0, 1 << 20, &m) == FT_ERR_PROTOCOL);     /* opcode */
    n = enc(h, FT_OP_HELLO, 1, 0, NULL, 5000, 0, 0, 0);
    CHECK(ft_msg_parse(h, n, 0, 1 << 20, &m) == FT_ERR_PROTOCOL);     /* HELLO is 32 bytes */
    n = enc(h, FT_OP_HELLO, 1, 0, NULL, FT_MSG_NONCE, 0, 0, 0);
    CHECK_OK(ft_msg_parse(h, n, 0, 1 << 20, &m));
    n = enc(h, FT_OP_AUTH, 1, 0, NULL, 31, 0, 0, 0);
    CHECK(ft_msg_parse(h, n, 0, 1 << 20, &m) == FT_ERR_PROTOCOL);     /* proof size */
    n = enc(h, FT_OP_PUTD, 1, 0, NULL, 100, 0, 0, 0);
    CHECK(ft_msg_parse(h, n, 0, 1 << 20, &m) == FT_ERR_PROTOCOL);     /* no transfer id */
    n = enc(h, FT_OP_PUTD, 1, 0, NULL, 100, 0, (1 << 20) - 50, 9);
    CHECK(ft_msg_parse(h, n, 0, 1 << 20, &m) == FT_ERR_NO_SPACE);     /* beyond the pool */
    n = enc(h, FT_OP_PUTD, 1, 0, NULL, 0, 0, 64, 9);
    CHECK(ft_msg_parse(h, n, 0, 1 << 20, &m) == FT_ERR_PROTOCOL);     /* empty */
    n = enc(h, FT_OP_PUTD, 1, 0, NULL, 100, 0, 4096, 9);
    CHECK_OK(ft_msg_parse(h, n, 0, 1 << 20, &m));
    n = enc(h, FT_OP_GET, 1, 0, "k", 0, 0, 0, 5);
    CHECK(ft_msg_parse(h, n, 0, 1 << 20, &m) == FT_ERR_PROTOCOL);     /* stray transfer id */
    n = enc(h, FT_OP_PUTB, 1, 0, "k", 0, 100, 50, 3);
    CHECK(ft_msg_parse(h, n, 0, 1 << 20, &m) == FT_ERR_PROTOCOL);     /* header > frame */
    n = enc(h, FT_OP_GET | FT_OP_REPLY, 9, FT_ERR_NOT_FOUND, NULL, 0, 0, 0, 0);
    CHECK_OK(ft_msg_parse(h, n, 1, 0, &m));
    CHECK(m.status == FT_ERR_NOT_FOUND && m.req_id == 9);
    uint8_t list[] = {2, 0, 0, 0, 1, 0, 'a', 2, 0, 'b', 'c'};
    char **keys = NULL;
    size_t nk = 0;
    CHECK_OK(ft_msg_list_parse(list, sizeof list, &keys, &nk));
    CHECK(nk == 2 && !strcmp(keys[0], "a") && !strcmp(keys[1], "bc"));
    ft_list_free(keys, nk);
    CHECK(ft_msg_list_parse(list, sizeof list - 1, &keys, &nk) == FT_ERR_PROTOCOL);
    list[0] = 3;
    CHECK(ft_msg_list_parse(list, sizeof list, &keys, &nk) == FT_ERR_PROTOCOL);
}

/* A raw client sends malformed requests: each gets an error reply on the
 * side that caused it (a stream whose framing is lost is closed), and the
 * node keeps serving others. */
TEST(net_malformed_messages)
{
    srv_t srv;
    const char *args[] = {"--capacity", "16M", NULL};
    int up_ = srv_start(&srv, "127.0.0.1:0", args);   /* REQUIRE evaluates twice */
    REQUIRE(up_ == 0);
    ft_msg m;
    uint8_t buf[512];
    /* GET before authenticating: refused, and the connection closed */
    int fd = raw_connect(srv.port, NULL);
    REQUIRE(fd >= 0);
    CHECK(raw_send(fd, FT_OP_GET, 11, "k", NULL, 0, 0, 0, 0) == 0);
    CHECK(raw_recv(fd, &m, buf, sizeof buf, 5000) == 0 && m.req_id == 11 && m.status == FT_ERR_AUTH);
    CHECK(raw_closed(fd, 3000));
    close(fd);
    /* another protocol version */
    fd = raw_connect(srv.port, NULL);
    uint8_t h[FT_MSG_MAX_HDR];
    size_t n = enc(h, FT_OP_HELLO, 12, 0, NULL, 0, 0, 0, 0);
    h[4] = 1;
    CHECK(raw_write(fd, h, n) == 0);
    CHECK(raw_recv(fd, &m, buf, sizeof buf, 5000) == 0 && m.req_id == 12 &&
          m.status == FT_ERR_UNSUPPORTED);
    CHECK(raw_closed(fd, 3000));
    close(fd);
    /* authenticated, then garbage */
    struct { const char *what; uint16_t op; const char *key; uint64_t dlen, aux, arg, xid; int keylen_override;
             ft_status want; int closes; } cases[] = {
        {"key_len beyond the limit", FT_OP_GET, "k", 0, 0, 0, 0, 300, FT_ERR_PROTOCOL, 1},
        {"not a frame", FT_OP_PUT, "k", 64, 0, 0, 0, -1, FT_ERR_CORRUPT, 0},
        {"nothing stored", FT_OP_GET, "k", 0, 0, 0, 0, -1, FT_ERR_NOT_FOUND, 0},
        {"unknown transfer", FT_OP_PUTD, NULL, 100, 0, 4096, 77, -1, FT_ERR_PROTOCOL, 0},
        {"frame above capacity", FT_OP_PUT, "k", 1ull << 30, 0, 0, 0, -1, FT_ERR_NO_SPACE, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fd = raw_connect(srv.port, NULL);
        REQUIRE(fd >= 0);
        CHECK_MSG(raw_handshake(fd, NULL, NULL, NULL) == FT_OK, "%s", cases[i].what);
        n = enc(h, cases[i].op, 100 + i, 0, cases[i].key, cases[i].dlen, cases[i].aux, cases[i].arg,
                cases[i].xid);
        if (cases[i].keylen_override >= 0) ft_put_le32(h + 20, (uint32_t)cases[i].keylen_override);
        CHECK(raw_write(fd, h, n) == 0);
        if (cases[i].dlen && cases[i].dlen < 4096) {
            uint8_t junk[4096];
            memset(junk, 'x', sizeof junk);
            CHECK(raw_write(fd, junk, (size_t)cases[i].dlen) == 0);
        }
        CHECK_MSG(raw_recv(fd, &m, buf, sizeof buf, 5000) == 0 && m.req_id == 100 + i &&
                  m.status == cases[i].want, "%s: status %d", cases[i].what, m.status);
        if (cases[i].closes) CHECK_MSG(raw_closed(fd, 3000), "%s", cases[i].what);
        close(fd);
    }
    /* the node still serves a normal client */
    ft_store *st = NULL;
    CHECK_OK(open_client(&srv, NULL, 0, &st));
    if (st) {
        uint16_t v[256];
        fill(v, sizeof v, 1);
        int64_t shape[1] = {256};
        ft_tensor t, out;
        ft_tensor_init(&t, FT_BF16, 1, shape, v);
        CHECK_OK(ft_write_tensor(st, "k", &t, NULL));
        CHECK_OK(ft_read_tensor(st, "k", -1, &out));
        CHECK(!memcmp(out.data, v, sizeof v));
        ft_free_aligned(out.data);
    }
    ft_store_close(st);
    CHECK(srv_stop(&srv) == 0);
}

/* The CLI against a live node: put/get/ls/stat/rm, exit codes 0/1/2. */
static int run_cli(const char *fmt, const char *a, const char *b, const char *c2)
{
    char cmd[1024];
    char tail[700];
    snprintf(tail, sizeof tail, fmt, a, b, c2);
    snprintf(cmd, sizeof cmd, "'%s' %s", ft_test_bin(), tail);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

TEST(net_cli_commands)
{
    srv_t srv;
    const char *args[] = {"--capacity", "64M", NULL};
    int up_ = srv_start(&srv, "127.0.0.1:0", args);
    REQUIRE(up_ == 0);
    char dir[] = "/tmp/ft_test_cliXXXXXX";
    char *made = mkdtemp(dir);
    REQUIRE(made);
    char in[128], out[128], lst[128];
    snprintf(in, sizeof in, "%s/in.bin", dir);
    snprintf(out, sizeof out, "%s/out.bin", dir);
    snprintf(lst, sizeof lst, "%s/ls.txt", dir);
    static uint16_t v[300000];
    fill(v, sizeof v, 99);
    FILE *f = fopen(in, "wb");
    REQUIRE(f);
    fwrite(v, 1, sizeof v, f);
    fclose(f);
    CHECK(run_cli("put %s cli/w %s --dtype bf16 --shape 600,500 -c zstd 2>/dev/null", srv.uri, in, "") == 0);
    CHECK(run_cli("get %s cli/w %s%s", srv.uri, out, "") == 0);
    f = fopen(out, "rb");
    static uint16_t back[300001];     /* one more: a longer file is caught */
    size_t n = f ? fread(back, 1, sizeof back, f) : 0;
    if (f) fclose(f);
    CHECK(n == sizeof v && !memcmp(back, v, sizeof v));
    CHECK(run_cli("ls %s > %s%s", srv.uri, lst, "") == 0);
    f = fopen(lst, "r");
    char line[64] = "";
    if (f) { if (!fgets(line, sizeof line, f)) line[0] = 0; fclose(f); }
    CHECK(!strcmp(line, "cli/w\n"));
    CHECK(run_cli("stat %s cli/w --json > %s%s", srv.uri, lst, "") == 0);
    f = fopen(lst, "r");
    char js[512] = "";
    if (f) { if (!fgets(js, sizeof js, f)) js[0] = 0; fclose(f); }
    CHECK(strstr(js, "\"codec\":\"zstd\"") && strstr(js, "\"shape\":\"[600, 500]\"") &&
          strstr(js, "\"raw_bytes\":600000"));
    CHECK(run_cli("stat %s --json > %s%s", srv.uri, lst, "") == 0);
    CHECK(run_cli("rm %s cli/w%s%s", srv.uri, "", "") == 0);
    CHECK(run_cli("get %s cli/w %s 2>/dev/null%s", srv.uri, out, "") == 1);   /* not found */
    CHECK(run_cli("rm %s cli/w 2>/dev/null%s%s", srv.uri, "", "") == 1);
    CHECK(run_cli("put %s k %s 2>/dev/null", srv.uri, in, "") == 2);          /* no --dtype */
    CHECK(run_cli("get %s 2>/dev/null%s%s", srv.uri, "", "") == 2);           /* too few args */
    CHECK(run_cli("serve --bogus 2>/dev/null%s%s%s", "", "", "") == 2);
    CHECK(run_cli("ls ucx://127.0.0.1:1 2>/dev/null%s%s%s", "", "", "") == 1); /* refused */
    CHECK(srv_stop(&srv) == 0);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
}
