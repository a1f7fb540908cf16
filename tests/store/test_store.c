/* mem: and file: stores: round trips with every codec, async, overwrite
 * during read, corrupt files, key escaping, URIs. */
#include "support/store_checks.h"
#include "store/store_internal.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmpdir[256];

static const char *mkdir_tmp(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/ft_test_store_XXXXXX");
    return mkdtemp(tmpdir);
}

static void rm_rf(const char *dir)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", dir);
}

TEST(mem_roundtrips)
{
    ft_store *s = NULL;
    CHECK_OK(ft_store_open("mem:", NULL, &s));
    REQUIRE(s);
    tw_codec_roundtrips(s, "m");
    ft_store_stats st;
    CHECK_OK(ft_store_stats_get(s, &st));
    CHECK(st.tensors >= 3 && st.used > 0);
    ft_store_close(s);
}

TEST(file_roundtrips)
{
    const char *d = mkdir_tmp();
    REQUIRE(d);
    char uri[300];
    snprintf(uri, sizeof uri, "file:%s/sub", d);   /* created on open */
    ft_store *s = NULL;
    CHECK_OK(ft_store_open(uri, NULL, &s));
    REQUIRE(s);
    tw_codec_roundtrips(s, "f");
    /* keys with '/' and '%' escape into one flat directory, and list back */
    int64_t shape[1] = {8};
    uint16_t v[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    ft_tensor t;
    ft_tensor_init(&t, FT_BF16, 1, shape, v);
    CHECK_OK(ft_write_tensor(s, "../etc/%passwd", &t, NULL));
    char path[400];
    snprintf(path, sizeof path, "%s/sub/%%2E%%2E%%2Fetc%%2F%%25passwd.ftf", d);
    CHECK(access(path, F_OK) == 0);
    char **keys = NULL;
    size_t n = 0, found = 0;
    CHECK_OK(ft_list_tensors(s, &keys, &n));
    for (size_t i = 0; i < n; i++) found += !strcmp(keys[i], "../etc/%passwd");
    ft_list_free(keys, n);
    CHECK(found == 1);
    ft_store_close(s);
    /* a second store on the same directory sees the data */
    CHECK_OK(ft_store_open(uri, NULL, &s));
    ft_tensor out;
    CHECK_OK(ft_read_tensor(s, "../etc/%passwd", -1, &out));
    CHECK(out.ndim == 1 && out.shape[0] == 8 && !memcmp(out.data, v, 16));
    ft_free_aligned(out.data);
    ft_store_close(s);
    rm_rf(d);
}

TEST(file_corrupt_rejected)
{
    const char *d = mkdir_tmp();
    REQUIRE(d);
    char uri[300], path[400];
    snprintf(uri, sizeof uri, "file:%s", d);
    ft_store *s = NULL;
    CHECK_OK(ft_store_open(uri, NULL, &s));
    REQUIRE(s);
    const uint64_t n = 50000;
    void *src = tw_make(FT_BF16, n, 3);
    int64_t shape[1] = {(int64_t)n};
    ft_tensor t;
    ft_tensor_init(&t, FT_BF16, 1, shape, src);
    ft_codec_params p;
    ft_codec_default_params(&p);
    p.codec = FT_CODEC_ZSTD;
    const char *names[3] = {"flip", "trunc", "junk"};
    for (int k = 0; k < 3; k++) CHECK_OK(ft_write_tensor(s, names[k], &t, &p));
    /* flip a payload byte */
    snprintf(path, sizeof path, "%s/flip.ftf", d);
    int fd = open(path, O_RDWR);
    REQUIRE(fd >= 0);
    struct stat sb;
    fstat(fd, &sb);
    unsigned char b;
    CHECK(pread(fd, &b, 1, sb.st_size - 100) == 1);
    b ^= 0x40;
    CHECK(pwrite(fd, &b, 1, sb.st_size - 100) == 1);
    close(fd);
    /* truncate */
    snprintf(path, sizeof path, "%s/trunc.ftf", d);
    CHECK(truncate(path, sb.st_size / 2) == 0);
    /* replace with garbage */
    snprintf(path, sizeof path, "%s/junk.ftf", d);
    fd = open(path, O_WRONLY | O_TRUNC);
    CHECK(fd >= 0 && write(fd, "not a frame at all, just some bytes .......................", 60) == 60);
    close(fd);
    for (int k = 0; k < 3; k++) {
        ft_tensor out = {0};
        ft_status st = ft_read_tensor(s, names[k], -1, &out);
        CHECK_MSG(st == FT_ERR_CORRUPT, "%s: %s", names[k], ft_status_str(st));
        void *fr = NULL;
        size_t fs = 0;
        if (k) CHECK(ft_store_get_frame(s, names[k], &fr, &fs) == FT_ERR_CORRUPT);
        ft_free_aligned(fr);
    }
    ft_tensor_stat ts;
    CHECK(ft_stat_tensor(s, "trunc", &ts) == FT_ERR_CORRUPT);
    CHECK(ft_stat_tensor(s, "junk", &ts) == FT_ERR_CORRUPT);
    /* frame-level put refuses a bad frame */
    CHECK(ft_store_put_frame(s, "bad", "garbage garbage garbage garbage garbage garbage garbage garbage garbage", 70) ==
          FT_ERR_CORRUPT);
    /* no temp files are left behind */
    char **keys = NULL;
    size_t nk = 0;
    CHECK_OK(ft_list_tensors(s, &keys, &nk));
    CHECK(nk == 3);
    ft_list_free(keys, nk);
    ft_free_aligned(src);
    ft_store_close(s);
    rm_rf(d);
}

TEST(async_many_outstanding)
{
    ft_store_params p;
    ft_store_default_params(&p);
    p.queue_depth = 8;
    ft_store *s = NULL;
    CHECK_OK(ft_store_open("mem:", &p, &s));
    REQUIRE(s);
    tw_async(s, "as", 64, 20000);
    ft_store_close(s);
    const char *d = mkdir_tmp();
    REQUIRE(d);
    char uri[300];
    snprintf(uri, sizeof uri, "file:%s", d);
    CHECK_OK(ft_store_open(uri, &p, &s));
    REQUIRE(s);
    tw_async(s, "as", 24, 20000);
    ft_store_close(s);
    rm_rf(d);
}

TEST(overwrite_during_read)
{
    ft_store *s = NULL;
    CHECK_OK(ft_store_open("mem:", NULL, &s));
    REQUIRE(s);
    tw_overwrite_during_read(s, s, "o");
    ft_store_close(s);
}

TEST(bad_uris_and_args)
{
    ft_store *s = NULL;
    CHECK(ft_store_open("bogus:", NULL, &s) == FT_ERR_INVALID_ARG && !s);
    CHECK(ft_store_open("file:", NULL, &s) == FT_ERR_INVALID_ARG);
    CHECK(ft_store_open("ucx://nohostport", NULL, &s) == FT_ERR_INVALID_ARG);
    CHECK(ft_store_open("file:/proc/definitely/not/here", NULL, &s) == FT_ERR_IO);
    CHECK(ft_key_validate("ok/key-1.x") == FT_OK);
    CHECK(ft_key_validate("\x7f") == FT_ERR_INVALID_ARG);
    char esc[64], back[64];
    CHECK_OK(ft_key_escape(".a/b%", esc, sizeof esc));
    CHECK(!strcmp(esc, "%2Ea%2Fb%25"));
    CHECK_OK(ft_key_unescape(esc, strlen(esc), back, sizeof back));
    CHECK(!strcmp(back, ".a/b%"));
    CHECK(ft_key_unescape("%4", 2, back, sizeof back) == FT_ERR_INVALID_ARG);
    CHECK(ft_key_unescape("a.b", 3, back, sizeof back) == FT_ERR_INVALID_ARG);
    ft_store_close(NULL);
    ft_request_free(NULL);
}
