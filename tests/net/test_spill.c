/* The memory node's spill tier and configuration under hostile
 * conditions (issue 21): a full spill file system, names planted in the
 * spill directory, token files that are FIFOs, devices or links, sizes
 * that are no numbers. The full file system needs root (a small tmpfs
 * mounted by the test); that case says so and passes otherwise. */
#include "ft_test.h"
#include "flextier/store.h"
#include "net/auth.h"
#include "support/cli_run.h"
#include "support/server_util.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

enum { N = 5, E = 150000 };   /* 5 x 300 KB = 1.5 MB > the 1 MB pool */
static uint16_t src[8][E], dst[E];

static void fill(void *p, size_t n, uint64_t seed)
{
    uint64_t *q = p;
    for (size_t i = 0; i < n / 8; i++) q[i] = ft_test_rand(&seed);
}

static ft_status open_client(const srv_t *s, ft_store **out)
{
    ft_store_params p;
    ft_store_default_params(&p);
    p.timeout_ms = 8000;
    return ft_store_open(s->uri, &p, out);
}

static int write_n(ft_store *s, int n)
{
    int64_t shape[1] = {E};
    int ok = 0;
    for (int i = 0; i < n; i++) {
        fill(src[i], sizeof src[i], 500 + (uint64_t)i);
        char key[16];
        snprintf(key, sizeof key, "t%d", i);
        ft_tensor t;
        ft_tensor_init(&t, FT_BF16, 1, shape, src[i]);
        ft_status st = ft_write_tensor(s, key, &t, NULL);
        CHECK_MSG(st == FT_OK, "write %s: %s", key, ft_last_error());
        ok += st == FT_OK;
    }
    return ok;
}

/* Every tensor read back intact, twice round (each read may reload). */
static int read_all(ft_store *s, int n)
{
    int good = 0;
    for (int round = 0; round < 2; round++)
        for (int i = 0; i < n; i++) {
            char key[16];
            snprintf(key, sizeof key, "t%d", i);
            ft_tensor d = {.dtype = FT_BF16, .data = dst};
            ft_status st = ft_read_tensor_into(s, key, &d, sizeof dst);
            CHECK_MSG(st == FT_OK, "read %s (round %d): %s", key, round, ft_last_error());
            CHECK_MSG(st != FT_OK || !memcmp(dst, src[i], sizeof dst), "%s differs", key);
            good += st == FT_OK && !memcmp(dst, src[i], sizeof dst);
        }
    return good;
}

/* Directories, a FIFO and a file planted under the spill files' names:
 * spilling goes on under other names. */
TEST(spill_planted_names)
{
    const char *dir = ft_test_tmpdir("spill_planted");
    REQUIRE(chmod(dir, 0700) == 0);
    srv_t srv;
    const char *args[] = {"--capacity", "1M", "--spill-dir", dir, "--spill-capacity", "8M", NULL};
    int up_ = srv_start(&srv, "127.0.0.1:0", args);
    REQUIRE(up_ == 0);
    char p[512];
    for (int i = 1; i <= 40; i++) {   /* a run of names, more than one try's worth */
        snprintf(p, sizeof p, "%s/ftspill-%d.bin", dir, i);
        if (i == 4) CHECK(mkfifo(p, 0600) == 0);
        else if (i == 7) CHECK(ft_sh("echo planted > %s", p) == 0);
        else CHECK(mkdir(p, 0700) == 0);
    }
    snprintf(p, sizeof p, "%s/ftspill-5.bin/keep", dir);   /* not even empty */
    CHECK(ft_sh("touch %s", p) == 0);
    ft_store *s = NULL;
    CHECK_OK(open_client(&srv, &s));
    if (s) {
        CHECK(write_n(s, 8) == 8);
        ft_store_stats st;
        CHECK_OK(ft_store_stats_get(s, &st));
        CHECK_MSG(st.spilled_tensors >= 5, "%llu spilled", (unsigned long long)st.spilled_tensors);
        CHECK(read_all(s, 8) == 16);
    }
    ft_store_close(s);
    CHECK(srv_stop(&srv) == 0);
}

/* The spill file system filled by another process: every stored tensor
 * stays readable (read from its spill file when it cannot come back into
 * the pool), over TCP and the shared-memory path. */
TEST(spill_fs_full_keeps_tensors_readable)
{
    if (geteuid() != 0) {
        fprintf(stderr, "  SKIP: needs root (mounts a small tmpfs as the spill file system)\n");
        return;
    }
    const char *dir = ft_test_tmpdir("spill_full");
    if (mount("ftspill", dir, "tmpfs", MS_NOSUID | MS_NODEV, "size=4m,mode=0700") != 0) {
        fprintf(stderr, "  SKIP: cannot mount a tmpfs: %s\n", strerror(errno));
        return;
    }
    const char *modes[] = {"tcp", "cma"};
    for (int m = 0; m < 2; m++) {
        srv_t srv;
        const char *args[] = {"--capacity", "1M", "--spill-dir", dir, "--spill-capacity", "3M", NULL};
        int up_ = srv_start(&srv, "127.0.0.1:0", args);
        if (up_ != 0) { CHECK(up_ == 0); break; }
        setenv("FLEXTIER_TRANSPORT", modes[m], 1);
        ft_store *s = NULL;
        CHECK_OK(open_client(&srv, &s));
        unsetenv("FLEXTIER_TRANSPORT");
        char filler[512];
        snprintf(filler, sizeof filler, "%s/filler", dir);
        if (s) {
            CHECK(write_n(s, N) == N);
            ft_store_stats st;
            CHECK_OK(ft_store_stats_get(s, &st));
            CHECK_MSG(st.spilled_tensors >= 1, "%llu spilled", (unsigned long long)st.spilled_tensors);
            /* another process fills the file system */
            int fd = open(filler, O_WRONLY | O_CREAT | O_TRUNC, 0600);
            CHECK(fd >= 0);
            static char junk[65536];
            memset(junk, 0x5a, sizeof junk);
            while (fd >= 0 && write(fd, junk, sizeof junk) > 0) {}
            if (fd >= 0) close(fd);
            CHECK_MSG(read_all(s, N) == 2 * N, "over %s", modes[m]);
        }
        ft_store_close(s);
        CHECK(srv_stop(&srv) == 0);
        unlink(filler);
    }
    CHECK(umount(dir) == 0);
}

/* A FIFO, a device or a link as token file: refused at once (a FIFO
 * must not hang the open). */
TEST(token_file_must_be_a_regular_file)
{
    const char *dir = ft_test_tmpdir("tokfile");
    char fifo[512], link[512], real[512];
    snprintf(fifo, sizeof fifo, "%s/fifo", dir);
    snprintf(real, sizeof real, "%s/real", dir);
    snprintf(link, sizeof link, "%s/link", dir);
    REQUIRE(mkfifo(fifo, 0600) == 0);
    FILE *f = fopen(real, "w");
    REQUIRE(f != NULL);
    fputs("0123456789abcdef0123456789abcdef\n", f);
    fclose(f);
    REQUIRE(chmod(real, 0600) == 0 && symlink(real, link) == 0);
    uint8_t tok[FT_TOKEN_MAX];
    size_t n = 0;
    alarm(10);   /* a hang fails the test, it does not stall it */
    CHECK(ft_net_read_token(fifo, FT_TOKEN_MIN, tok, sizeof tok, &n) == FT_ERR_INVALID_ARG);
    CHECK_MSG(strstr(ft_last_error(), "regular") != NULL, "%s", ft_last_error());
    CHECK(ft_net_read_token("/dev/zero", FT_TOKEN_MIN, tok, sizeof tok, &n) != FT_OK);
    CHECK(ft_net_read_token(link, FT_TOKEN_MIN, tok, sizeof tok, &n) == FT_ERR_INVALID_ARG);
    CHECK_MSG(strstr(ft_last_error(), "link") != NULL, "%s", ft_last_error());
    CHECK_OK(ft_net_read_token(real, FT_TOKEN_MIN, tok, sizeof tok, &n));
    CHECK(n == 32);
    /* and `serve` with the FIFO says so and exits */
    CHECK(ft_sh("%s serve --listen 127.0.0.1:0 --capacity 1M --token-file %s 2>%s/err", ft_test_bin(), fifo, dir) != 0);
    CHECK(ft_file_has(dir, "err", "regular"));
    alarm(0);
}

/* Sizes are finite numbers of bytes. */
TEST(capacity_must_be_finite)
{
    const char *dir = ft_test_tmpdir("capacity");
    const char *bad[] = {"nan", "NaN", "inf", "-inf", "infinity", "-1", "1e400", " -5"};
    alarm(30);
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        int rc = ft_sh("%s serve --listen 127.0.0.1:0 --capacity '%s' 2>%s/err", ft_test_bin(), bad[i], dir);
        CHECK_MSG(rc != 0, "--capacity '%s' accepted", bad[i]);
        CHECK(ft_file_has(dir, "err", "bad size"));
        rc = ft_sh("%s serve --listen 127.0.0.1:0 --capacity 1M --spill-dir %s --spill-capacity '%s' 2>%s/err",
                   ft_test_bin(), dir, bad[i], dir);
        CHECK_MSG(rc != 0, "--spill-capacity '%s' accepted", bad[i]);
    }
    alarm(0);
}
