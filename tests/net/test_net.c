/* The memory node: `flextier serve` started by the test (FT_BIN) on
 * 127.0.0.1 with a free port, and the ucx:// client in this process. */
#include "store/store_common.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "net/server_util.h"

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
    REQUIRE(srv_start(&srv, "127.0.0.1:0", args) == 0);
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

TEST(net_concurrent_clients)
{
    srv_t srv;
    const char *args[] = {"--capacity", "128M", NULL};
    REQUIRE(srv_start(&srv, "127.0.0.1:0", args) == 0);
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
    REQUIRE(srv_start(&srv, "127.0.0.1:0", args) == 0);
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
    REQUIRE(srv_start(&srv, "127.0.0.1:0", args) == 0);
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
    REQUIRE(mkdtemp(dir));
    srv_t srv;
    const char *args[] = {"--capacity", "1M", "--spill-dir", dir, "--spill-capacity", "8M", NULL};
    REQUIRE(srv_start(&srv, "127.0.0.1:0", args) == 0);
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
    REQUIRE(srv_start(&srv, "127.0.0.1:0", args) == 0);
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
    REQUIRE(srv_start(&srv, "127.0.0.1:0", args) == 0);
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
            execl(getenv("FT_BIN"), "flextier", "put", srv.uri, "victim", path, "--dtype", "u8",
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
    srv_t none = {0, 1, "ucx://127.0.0.1:1"};
    ft_store *s = NULL;
    double t0 = ft_now();
    ft_status st = open_client(&none, NULL, 0, &s);
    CHECK(st == FT_ERR_NET || st == FT_ERR_TIMEOUT);
    CHECK(!s && ft_now() - t0 < 10.0);
}

#include "net/msg.h"

TEST(msg_parse_rules)
{
    uint8_t h[FT_MSG_MAX_HDR];
    ft_msg m;
    size_t n = ft_msg_encode(h, FT_OP_PUT, 42, 0, "k/1", 3, 1000, 0xabc, 0);
    CHECK(n == FT_MSG_HDR_SIZE + 3);
    CHECK_OK(ft_msg_parse(h, n, 1000, 0, 1 << 20, &m));
    CHECK(m.opcode == FT_OP_PUT && m.req_id == 42 && m.key_len == 3 && !memcmp(m.key, "k/1", 3) &&
          m.data_len == 1000 && m.aux == 0xabc);
    CHECK(ft_msg_parse(h, n, 999, 0, 1 << 20, &m) == FT_ERR_PROTOCOL);     /* length mismatch */
    CHECK(ft_msg_parse(h, n, 1000, 0, 999, &m) == FT_ERR_PROTOCOL);       /* over the limit */
    CHECK(ft_msg_parse(h, n - 1, 1000, 0, 1 << 20, &m) == FT_ERR_PROTOCOL); /* truncated key */
    CHECK(ft_msg_parse(h, n, 1000, 1, 1 << 20, &m) == FT_ERR_PROTOCOL);   /* not a reply */
    h[4] = 2;
    CHECK(ft_msg_parse(h, n, 1000, 0, 1 << 20, &m) == FT_ERR_UNSUPPORTED); /* version */
    n = ft_msg_encode(h, FT_OP_GET, 1, 0, NULL, 0, 0, 0, 0);
    CHECK(ft_msg_parse(h, n, 0, 0, 1 << 20, &m) == FT_ERR_PROTOCOL);      /* GET needs a key */
    n = ft_msg_encode(h, 99, 1, 0, NULL, 0, 0, 0, 0);
    CHECK(ft_msg_parse(h, n, 0, 0, 1 << 20, &m) == FT_ERR_PROTOCOL);      /* opcode */
    n = ft_msg_encode(h, FT_OP_HELLO, 1, 0, NULL, 0, 5000, 0, 0);
    CHECK(ft_msg_parse(h, n, 5000, 0, 1 << 20, &m) == FT_ERR_PROTOCOL);   /* token too long */
    n = ft_msg_encode(h, FT_OP_GET | FT_OP_REPLY, 9, FT_ERR_NOT_FOUND, NULL, 0, 0, 0, 0);
    CHECK_OK(ft_msg_parse(h, n, 0, 1, 0, &m));
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
