/* mem: and file: stores: round trips with every codec, async, overwrite
 * during read, corrupt files, key escaping, URIs. */
#include "support/store_checks.h"
#include "support/pagecache.h"
#include "store/store_internal.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
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

/* A raw u8 frame whose size is `target` bytes (its header included):
 * the payload is target minus the header, found by encoding. */
static void *raw_frame(ft_codec_ctx *cc, size_t target, uint8_t seed, size_t *size)
{
    ft_codec_params p;
    ft_codec_default_params(&p);
    p.codec = FT_CODEC_RAW;
    size_t n = target;
    for (int tries = 0; tries < 4; tries++) {
        int64_t shape[1] = {(int64_t)n};
        size_t cap = ft_encode_bound(&p, FT_U8, 1, shape);
        uint8_t *d = malloc(n), *f = ft_malloc_aligned(cap, 64);
        if (!d || !f) { free(d); ft_free_aligned(f); return NULL; }
        for (size_t i = 0; i < n; i++) d[i] = (uint8_t)(i * 131 + seed + (i >> 12));
        ft_tensor t;
        ft_tensor_init(&t, FT_U8, 1, shape, d);
        size_t fs = 0;
        ft_status st = ft_encode(cc, &p, &t, f, cap, &fs);
        free(d);
        if (st != FT_OK) { ft_free_aligned(f); return NULL; }
        if (fs == target) { *size = fs; return f; }
        ft_free_aligned(f);
        if (fs - n >= target) return NULL;   /* smaller than a header */
        n = target - (fs - n);
    }
    return NULL;
}

/* Frames of every size around the 4 KiB block read back exactly through
 * O_DIRECT (direct_io=1), into the store's buffers and the caller's
 * (aligned with and without room for the last block, unaligned: buffered),
 * on dir (a disk, or a tmpfs whichever way it takes O_DIRECT). */
static void direct_roundtrips(const char *dir)
{
    static const size_t sizes[] = {0 /* the smallest frame */, 4095, 4096, 4097, 8192, 3 * 4096 + 1,
                                   (1u << 20) + 17, (5u << 20) + 4096};
    enum { NS = sizeof sizes / sizeof sizes[0] };
    char uri[300], path[400];
    snprintf(uri, sizeof uri, "file:%s", dir);
    ft_store_params p;
    ft_store_default_params(&p);
    p.direct_io = 1;
    ft_store *s = NULL;
    CHECK_OK(ft_store_open(uri, &p, &s));
    REQUIRE(s);
    ft_codec_ctx *cc = NULL;
    CHECK_OK(ft_codec_ctx_create(1, &cc));
    void *fr[NS] = {0};
    size_t fsz[NS] = {0};
    char key[NS][32];
    for (int i = 0; i < NS; i++) {
        size_t want = sizes[i] ? sizes[i] : 1;
        fr[i] = raw_frame(cc, want, (uint8_t)i, &fsz[i]);
        if (!fr[i] && !sizes[i]) {   /* the smallest: a 1-byte tensor's frame */
            ft_codec_params cp;
            ft_codec_default_params(&cp);
            cp.codec = FT_CODEC_RAW;
            int64_t shape[1] = {1};
            size_t cap = ft_encode_bound(&cp, FT_U8, 1, shape);
            uint8_t one = 42;
            ft_tensor t;
            ft_tensor_init(&t, FT_U8, 1, shape, &one);
            fr[i] = ft_malloc_aligned(cap, 64);
            if (fr[i] && ft_encode(cc, &cp, &t, fr[i], cap, &fsz[i])) { ft_free_aligned(fr[i]); fr[i] = NULL; }
        }
        REQUIRE(fr[i]);
        CHECK_MSG(!sizes[i] || fsz[i] == sizes[i], "frame of %zu bytes, wanted %zu", fsz[i], sizes[i]);
        snprintf(key[i], sizeof key[i], "d%zu", sizes[i]);
        CHECK_OK(ft_store_put_frame(s, key[i], fr[i], fsz[i]));
    }
    size_t big = (6u << 20) + 2 * 4096;
    uint8_t *buf = ft_malloc_aligned(big + 4096, 4096);
    REQUIRE(buf);
    for (int i = 0; i < NS; i++) {
        size_t n = fsz[i], up = (n + 4095) & ~(size_t)4095;
        /* the store's buffer */
        void *got = NULL;
        size_t gs = 0;
        CHECK_OK(ft_store_get_frame(s, key[i], &got, &gs));
        CHECK_MSG(gs == n && got && !memcmp(got, fr[i], n), "%s: get_frame", key[i]);
        ft_free_aligned(got);
        /* the caller's: exact room, room for the last block, unaligned */
        const struct { size_t off, cap; } ways[3] = {{0, n}, {0, up}, {1, n}};
        for (int w = 0; w < 3; w++) {
            memset(buf, 0xEE, big + 4096);
            ft_request *r = NULL;
            size_t sz = 0;
            CHECK_OK(ft_read_frame_async(s, key[i], buf + ways[w].off, ways[w].cap, &sz, &r));
            CHECK_OK(ft_request_wait(r, -1));
            ft_request_free(r);
            CHECK_MSG(sz == n && !memcmp(buf + ways[w].off, fr[i], n), "%s: read way %d", key[i], w);
            /* nothing written past the room given */
            CHECK_MSG(buf[ways[w].off + ways[w].cap] == 0xEE, "%s: way %d wrote past its room", key[i], w);
        }
        /* too small a buffer */
        if (n > 1) {
            ft_request *r = NULL;
            size_t sz = 0;
            CHECK_OK(ft_read_frame_async(s, key[i], buf, n - 1, &sz, &r));
            CHECK(ft_request_wait(r, -1) == FT_ERR_BUFFER_SMALL);
            ft_request_free(r);
        }
        /* decoded, and stat */
        ft_tensor out;
        CHECK_OK(ft_read_tensor(s, key[i], -1, &out));
        ft_free_aligned(out.data);
        ft_tensor_stat ts;
        CHECK_OK(ft_stat_tensor(s, key[i], &ts));
        CHECK(ts.stored_bytes == n);
    }
    /* truncated at a block boundary, inside a block, and grown: corrupt */
    int last = NS - 1;
    snprintf(path, sizeof path, "%s/%s.ftf", dir, key[last]);
    const off_t cuts[3] = {(off_t)(fsz[last] - 4096), (off_t)(fsz[last] - 1), (off_t)(fsz[last] + 5000)};
    for (int c = 0; c < 3; c++) {
        CHECK_OK(ft_store_put_frame(s, key[last], fr[last], fsz[last]));
        CHECK(truncate(path, cuts[c]) == 0);
        ft_request *r = NULL;
        size_t sz = 0;
        CHECK_OK(ft_read_frame_async(s, key[last], buf, big, &sz, &r));
        ft_status st = ft_request_wait(r, -1);
        ft_request_free(r);
        CHECK_MSG(st == FT_ERR_CORRUPT, "cut %d: %s", c, ft_status_str(st));
        ft_tensor out = {0};
        CHECK(ft_read_tensor(s, key[last], -1, &out) == FT_ERR_CORRUPT);
        ft_tensor_stat ts;
        CHECK(ft_stat_tensor(s, key[last], &ts) == FT_ERR_CORRUPT);
    }
    for (int i = 0; i < NS; i++) ft_free_aligned(fr[i]);
    ft_free_aligned(buf);
    ft_codec_ctx_free(cc);
    ft_store_close(s);
}

TEST(file_direct_io)
{
    const char *d = mkdir_tmp();
    REQUIRE(d);
    direct_roundtrips(d);
    rm_rf(d);
    /* tmpfs: O_DIRECT refused (older kernels: EINVAL, read buffered) or
     * taken (6.6 on): the same bytes either way */
    char shm[64];
    snprintf(shm, sizeof shm, "/dev/shm/ft_test_store_XXXXXX");
    if (mkdtemp(shm)) {
        direct_roundtrips(shm);
        rm_rf(shm);
    }
}

/* O_DIRECT reads leave nothing in the page cache (a cgroup's charge);
 * buffered ones without drop_cache do (so the check can fail), and with
 * drop_cache drop it after. On a disk only: a tmpfs file is its pages. */
TEST(file_direct_io_page_cache)
{
    const char *d = mkdir_tmp();
    REQUIRE(d);
    struct statfs sf;
    if (statfs(d, &sf) != 0 || sf.f_type == 0x01021994 /* TMPFS_MAGIC */) {
        printf("  %s is a tmpfs: skipped\n", d);
        rm_rf(d);
        return;
    }
    char uri[300], path[400];
    snprintf(uri, sizeof uri, "file:%s", d);
    ft_codec_ctx *cc = NULL;
    CHECK_OK(ft_codec_ctx_create(1, &cc));
    size_t fs = 0;
    void *fr = raw_frame(cc, (3u << 20) + 100, 9, &fs);
    REQUIRE(fr);
    snprintf(path, sizeof path, "%s/pc.ftf", d);
    uint8_t *buf = ft_malloc_aligned(4u << 20, 4096);
    REQUIRE(buf);
    /* direct_io 1, 0 (cache kept), 0 with drop_cache, default with drop_cache */
    const struct { int direct, drop; int cached; } cases[4] = {{1, 0, 0}, {0, 0, 1}, {0, 1, 0}, {-1, 1, 0}};
    for (int c = 0; c < 4; c++) {
        ft_store_params p;
        ft_store_default_params(&p);
        p.direct_io = cases[c].direct;
        p.drop_cache = cases[c].drop;
        ft_store *s = NULL;
        CHECK_OK(ft_store_open(uri, &p, &s));
        REQUIRE(s);
        CHECK_OK(ft_store_put_frame(s, "pc", fr, fs));
        ft_test_evict(path);   /* written and synced: clean pages, dropped */
        long before = ft_test_cached_pages(path, 0, UINT64_MAX);
        ft_request *r = NULL;
        size_t sz = 0;
        CHECK_OK(ft_read_frame_async(s, "pc", buf, 4u << 20, &sz, &r));
        CHECK_OK(ft_request_wait(r, -1));
        ft_request_free(r);
        CHECK(sz == fs && !memcmp(buf, fr, fs));
        long after = ft_test_cached_pages(path, 0, UINT64_MAX);
        if (before == 0) {
            if (cases[c].cached) CHECK_MSG(after > 0, "case %d: buffered read cached nothing", c);
            else CHECK_MSG(after == 0, "case %d: %ld pages left in the page cache", c, after);
        } else {
            printf("  could not evict %s (%ld pages): case %d not checked\n", path, before, c);
        }
        ft_store_close(s);
    }
    ft_free_aligned(fr);
    ft_free_aligned(buf);
    ft_codec_ctx_free(cc);
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
