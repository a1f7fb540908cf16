/* Streamed embeddings and LM head (ft_load_params.stream_globals): the
 * rows of the tokens read from the checkpoint file, the head computed
 * chunk by chunk against chunks read from it, give logits bit-identical
 * to the resident model's on every fixture model (tied heads included),
 * in the lossless formats (as stored, f32, bf16) and with q8 layers
 * (the head stays bf16 there), one and two threads, chunks that do not
 * divide the vocabulary, a prefill of mixed lengths, decode steps and
 * all-row logits. Read past the page cache (stream_direct_io): the same
 * logits, nothing of the head left in the page cache, rows at any file
 * offset read exactly (the blocks around them). */
#define _GNU_SOURCE   /* O_DIRECT */
#include "ft_test.h"
#include "pagecache.h"
#include "engine/engine_internal.h"
#include "flextier/engine.h"
#include "flextier/model.h"
#include "support/fixture.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>


/* Every fixture model directory (sorted), sliding-window ones included. */
static const char (*models)[256];
static size_t n_models;

static void list_models(void)
{
    if (!models) models = ft_fixture_models(&n_models);
}

static void model_dir(const char *name, char *out, size_t n)
{
    const char *data = getenv("FT_TEST_DATA");
    snprintf(out, n, "%s/models/%s", data ? data : "tests/data", name);
}

static const int32_t P0[] = {1, 15, 27, 99, 4, 200, 13};
static const int32_t P1[] = {3, 8, 250};

/* A prefill of two sequences with every row's logits, then 4 decode
 * steps with the last row's: the logits concatenated. */
static float *run(ft_model *m, unsigned threads, size_t *n_out, ft_status *st)
{
    const ft_model_config *cfg = ft_model_get_config(m);
    int V = cfg->vocab;
    ft_ctx_params cp = {0};
    cp.max_batch = 2; cp.max_seq = 24; cp.threads = threads; cp.all_logits = 1; cp.kv_dtype = FT_F32;
    ft_ctx *c = NULL;
    if ((*st = ft_ctx_create(m, &cp, &c))) return NULL;
    size_t rows = 10 + 4 * 2;
    float *all = calloc(rows * (size_t)V, sizeof(float));
    const int32_t *toks[2] = {P0, P1};
    size_t ntok[2] = {7, 3};
    int slots[2] = {0, 1};
    *st = ft_ctx_forward(c, 2, slots, toks, ntok, all, 1);
    for (int step = 0; step < 4 && !*st; step++) {
        int32_t a = (int32_t)((step * 37 + 5) % V), b = (int32_t)((step * 91 + 2) % V);
        const int32_t *t1[2] = {&a, &b};
        size_t one[2] = {1, 1};
        *st = ft_ctx_forward(c, 2, slots, t1, one, all + (size_t)(10 + 2 * step) * V, 0);
    }
    ft_ctx_free(c);
    *n_out = rows * (size_t)V;
    return all;
}

static void check_model(const char *name, int weights)
{
    char dir[600];
    model_dir(name, dir, sizeof dir);
    ft_load_params lp;
    ft_load_params_default(&lp);
    lp.weights = weights;
    ft_model *ref = NULL;
    ft_status st = ft_model_load(dir, &lp, &ref);
    CHECK_MSG(st == FT_OK, "%s: %s", name, ft_last_error());
    if (st) return;
    static const unsigned modes[] = {FT_STREAM_EMBED, FT_STREAM_LM_HEAD, FT_STREAM_EMBED | FT_STREAM_LM_HEAD};
    static const int chunks[] = {0, 96, 24};
    for (unsigned th = 1; th <= 2; th++) {
        size_t n0 = 0, n1 = 0;
        float *want = run(ref, th, &n0, &st);
        CHECK_MSG(st == FT_OK, "%s: %s", name, ft_last_error());
        for (size_t k = 0; want && k < 3; k++) {
            ft_load_params sp = lp;
            sp.stream_globals = modes[k];
            sp.stream_chunk_rows = chunks[k];
            sp.stream_drop_cache = (int)(k & 1);
            ft_model *m = NULL;
            st = ft_model_load(dir, &sp, &m);
            CHECK_MSG(st == FT_OK, "%s: %s", name, ft_last_error());
            if (st) continue;
            CHECK(ft_model_streamed(m) == modes[k]);
            uint64_t emb = 0, head = 0;
            ft_model_global_split(m, &emb, &head);
            CHECK(emb > 0);
            /* what is held shrinks by what is streamed (a tied head is
             * the embedding: either flag streams it) */
            CHECK(ft_model_global_bytes(m) < ft_model_global_bytes(ref));
            float *got = run(m, th, &n1, &st);
            CHECK_MSG(st == FT_OK, "%s: %s", name, ft_last_error());
            CHECK_MSG(got && n1 == n0 && !memcmp(got, want, n0 * sizeof(float)),
                      "%s weights %d threads %u stream %u chunk %d: logits differ from the resident model's", name,
                      weights, th, modes[k], chunks[k]);
            CHECK(ft_model_stream_bytes_read(m) > 0);
            free(got);
            ft_model_free(m);
        }
        free(want);
    }
    ft_model_free(ref);
}

TEST(bit_identical_on_every_fixture)
{
    list_models();
    REQUIRE(n_models > 0 && n_models <= FT_FIXTURE_MAX_MODELS);
    for (size_t i = 0; i < n_models; i++) {
        check_model(models[i], FT_WEIGHTS_AS_STORED);
        check_model(models[i], FT_WF_BF16);
    }
}

TEST(other_formats_tied_and_untied)
{
    /* f32, and q8 layers (the embeddings and head stay bf16) */
    check_model("llama-tiny", FT_WF_F32);
    check_model("llama-tiny-tied-rope3", FT_WF_F32);
    check_model("llama-tiny", FT_WF_Q8);
    check_model("qwen2-tiny", FT_WF_Q8);
}

TEST(streamed_refusals)
{
    char dir[600];
    model_dir("llama-tiny", dir, sizeof dir);
    ft_load_params lp;
    ft_load_params_default(&lp);
    lp.stream_globals = FT_STREAM_EMBED | FT_STREAM_LM_HEAD;
    ft_model *m = NULL;
    REQUIRE(ft_model_load(dir, &lp, &m) == FT_OK);
    /* no plain view of a matrix that is not in memory, no conversion */
    const char *name;
    ft_tensor v;
    int refused = 0;
    for (size_t i = 0; i < ft_model_tensor_count(m); i++) {
        ft_model_tensor(m, i, &name, NULL);
        if (!strcmp(name, "model.embed_tokens.weight") || !strcmp(name, "lm_head.weight"))
            refused += ft_model_tensor(m, i, &name, &v) == FT_ERR_UNSUPPORTED;
    }
    CHECK(refused == 2);
    ft_model *cv = NULL;
    CHECK(ft_model_convert(m, FT_WF_F32, &cv) != FT_OK);
    ft_model_free(m);
}


/* 1: path is on a tmpfs, 0: not, -1: no such path */
static int on_tmpfs(const char *path)
{
    struct statfs sf;
    if (statfs(path, &sf) != 0) return -1;
    return sf.f_type == 0x01021994 /* TMPFS_MAGIC */;
}

/* The logits with the streamed globals read past the page cache are the
 * ones read through it and the resident model's (chunks of 4 MiB and of
 * 24 rows; with and without dropping the pages; tied and untied heads,
 * f32 and bf16 checkpoints, a bf16 compute format from f32 rows). */
TEST(direct_io_identical)
{
    static const struct { const char *name; int weights; } cases[] = {
        {"llama-tiny", FT_WEIGHTS_AS_STORED}, {"llama-tiny-bf16", FT_WEIGHTS_AS_STORED},
        {"llama-tiny-tied-rope3", FT_WEIGHTS_AS_STORED}, {"qwen2-tiny", FT_WF_BF16}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char dir[600];
        model_dir(cases[c].name, dir, sizeof dir);
        ft_load_params lp;
        ft_load_params_default(&lp);
        lp.weights = cases[c].weights;
        ft_model *ref = NULL;
        ft_status st = ft_model_load(dir, &lp, &ref);
        CHECK_MSG(st == FT_OK, "%s: %s", cases[c].name, ft_last_error());
        if (st) continue;
        size_t n0 = 0, n1 = 0;
        float *want = run(ref, 2, &n0, &st);
        CHECK_MSG(st == FT_OK && want, "%s: %s", cases[c].name, ft_last_error());
        for (int k = 0; want && k < 8; k++) {
            ft_load_params sp = lp;
            sp.stream_globals = FT_STREAM_EMBED | FT_STREAM_LM_HEAD;
            sp.stream_chunk_rows = k & 1 ? 24 : 0;
            sp.stream_drop_cache = (k >> 1) & 1;
            sp.stream_direct_io = (k >> 2) & 1;
            ft_model *m = NULL;
            st = ft_model_load(dir, &sp, &m);
            CHECK_MSG(st == FT_OK, "%s: %s", cases[c].name, ft_last_error());
            if (st) continue;
            float *got = run(m, 2, &n1, &st);
            CHECK_MSG(st == FT_OK, "%s: %s", cases[c].name, ft_last_error());
            CHECK_MSG(got && n1 == n0 && !memcmp(got, want, n0 * sizeof(float)),
                      "%s: direct %d drop %d chunk %d: logits differ from the resident model's", cases[c].name,
                      sp.stream_direct_io, sp.stream_drop_cache, sp.stream_chunk_rows);
            CHECK(ft_model_stream_bytes_read(m) > 0);
            free(got);
            ft_model_free(m);
        }
        free(want);
        ft_model_free(ref);
    }
}

static int copy_file(const char *from, const char *to)
{
    FILE *a = fopen(from, "rb"), *b = a ? fopen(to, "wb") : NULL;
    int ok = a && b;
    char buf[65536];
    size_t n;
    while (ok && (n = fread(buf, 1, sizeof buf, a)) > 0) ok = fwrite(buf, 1, n, b) == n;
    if (a) fclose(a);
    if (b && fclose(b)) ok = 0;
    return ok;
}

/* After a step with the head read past the page cache none of the head's
 * pages are cached; read through it (pages kept) they are, so the check
 * can fail. On a disk only (a tmpfs file is its pages). */
TEST(direct_io_page_cache)
{
    /* a private copy: no other test reads it meanwhile */
    char src[600], from[700], dir[] = "/var/tmp/ft_test_stream_XXXXXX", path[700];
    model_dir("llama-tiny-bf16", src, sizeof src);
    REQUIRE(mkdtemp(dir));
    static const char *files[] = {"config.json", "model.safetensors"};
    for (int i = 0; i < 2; i++) {
        snprintf(from, sizeof from, "%s/%s", src, files[i]);
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        REQUIRE(copy_file(from, path));
    }
    int tmpfs = on_tmpfs(path);
    REQUIRE(tmpfs >= 0);
    if (tmpfs) printf("  %s is on a tmpfs: not checked\n", path);
    /* the head's byte range in the file */
    ft_checkpoint *ck = NULL;
    REQUIRE(ft_checkpoint_open(dir, &ck) == FT_OK);
    ft_tensor t;
    const char *file = NULL;
    uint64_t off = 0;
    REQUIRE(ft_checkpoint_get(ck, "lm_head.weight", &t) == FT_OK);
    REQUIRE(ft_checkpoint_locate(ck, t.data, &file, &off) == FT_OK);
    uint64_t len = (uint64_t)t.shape[0] * (uint64_t)t.shape[1] * 2;
    ft_checkpoint_close(ck);
    for (int direct = 1; direct >= 0; direct--) {
        ft_load_params lp;
        ft_load_params_default(&lp);
        lp.stream_globals = FT_STREAM_LM_HEAD;
        lp.stream_direct_io = direct;
        lp.stream_drop_cache = 0;   /* buffered reads keep their pages */
        ft_model *m = NULL;
        REQUIRE(ft_model_load(dir, &lp, &m) == FT_OK);
        const ft_model_config *cfg = ft_model_get_config(m);
        ft_ctx_params cp = {0};
        cp.max_batch = 1; cp.max_seq = 8; cp.threads = 1; cp.kv_dtype = FT_F32;
        ft_ctx *c = NULL;
        REQUIRE(ft_ctx_create(m, &cp, &c) == FT_OK);
        float *logits = calloc((size_t)cfg->vocab, sizeof(float));
        REQUIRE(logits);
        ft_test_evict(path);
        long before = ft_test_cached_pages(path, off, len);
        const int32_t *toks[1] = {P0};
        size_t ntok[1] = {7};
        int slot = 0;
        CHECK_OK(ft_ctx_forward(c, 1, &slot, toks, ntok, logits, 0));
        long after = ft_test_cached_pages(path, off, len);
        if (!tmpfs && before == 0) {
            if (direct) CHECK_MSG(after == 0, "direct: %ld pages of the head left in the page cache", after);
            else CHECK_MSG(after > 0 && after != -1, "buffered: the head's pages were not cached (%ld)",
                           after);
        } else if (!tmpfs) {
            printf("  could not evict %s (%ld pages): direct %d not checked\n", path, before, direct);
        }
        free(logits);
        ft_ctx_free(c);
        ft_model_free(m);
    }
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        unlink(path);
    }
    rmdir(dir);
}

/* ft_gstream_read past the page cache: rows of a matrix at offsets in a
 * file around the 4 KiB block (odd ones too), the matrix ending the file
 * mid-block, read in every span, equal to the bytes written (as the
 * compute dtype, and from bf16 through the raw buffer); an unaligned
 * buffer is read through the page cache (its pages then cached: the
 * direct reads' are not). */
TEST(gstream_direct_offsets)
{
    char d[] = "/var/tmp/ft_test_gstream_XXXXXX", path[128];
    REQUIRE(mkdtemp(d));
    snprintf(path, sizeof path, "%s/m.bin", d);
    enum { ROWS = 300, COLS = 40 };
    static const uint64_t offs[] = {0, 1, 4, 2144, 4092, 4095, 4096, 8190};
    const size_t slack = FT_GSTREAM_SLACK;
    uint8_t *dst = ft_malloc_aligned((size_t)ROWS * COLS * 4 + slack + 64, FT_GSTREAM_ALIGN);
    uint8_t *raw = ft_malloc_aligned((size_t)ROWS * COLS * 4 + slack + 64, FT_GSTREAM_ALIGN);
    float *want = malloc((size_t)ROWS * COLS * 4);
    REQUIRE(dst && raw && want);
    int tmpfs = on_tmpfs(d);
    REQUIRE(tmpfs >= 0);
    for (int bf = 0; bf <= 1; bf++)
        for (size_t oi = 0; oi < sizeof offs / sizeof offs[0]; oi++) {
            /* the file: offs[oi] bytes of 0x5A, then the matrix */
            size_t eb = bf ? 2 : 4, mb = (size_t)ROWS * COLS * eb;
            uint8_t *fb = malloc(offs[oi] + mb);
            REQUIRE(fb);
            memset(fb, 0x5A, offs[oi]);
            for (size_t i = 0; i < (size_t)ROWS * COLS; i++) {
                float v = (float)((int)(i * 2654435761u % 2001) - 1000) / 64.0f;
                if (bf) {
                    uint32_t u;
                    memcpy(&u, &v, 4);
                    uint16_t h = (uint16_t)(u >> 16);
                    memcpy(fb + offs[oi] + 2 * i, &h, 2);
                    u = (uint32_t)h << 16;
                    memcpy(&want[i], &u, 4);
                } else {
                    memcpy(fb + offs[oi] + 4 * i, &v, 4);
                    want[i] = v;
                }
            }
            FILE *f = fopen(path, "wb");
            REQUIRE(f);
            REQUIRE(fwrite(fb, 1, offs[oi] + mb, f) == offs[oi] + mb);
            fclose(f);
            free(fb);
            ft_gstream g = {0};
            g.fd = open(path, O_RDONLY);
            g.dfd = open(path, O_RDONLY | O_DIRECT);
            REQUIRE(g.fd >= 0 && g.dfd >= 0);
            g.off = offs[oi];
            g.src = bf ? FT_BF16 : FT_F32;
            g.fmt = FT_WF_F32;
            g.rows = ROWS;
            g.cols = COLS;
            ft_test_evict(path);
            static const int r0s[] = {0, 1, 17, 150, 299};
            for (size_t ri = 0; ri < sizeof r0s / sizeof r0s[0]; ri++) {
                const int ns[] = {1, 24, ROWS - r0s[ri]};
                for (int ni = 0; ni < 3; ni++) {
                    int r0 = r0s[ri], n = ns[ni];
                    if (r0 + n > ROWS) continue;
                    memset(dst, 0xEE, (size_t)n * COLS * 4 + slack);
                    CHECK_OK(ft_gstream_read(&g, r0, n, dst, raw));
                    CHECK_MSG(!memcmp(dst, want + (size_t)r0 * COLS, (size_t)n * COLS * 4),
                              "bf16 %d offset %llu rows [%d, %d): wrong bytes", bf, (unsigned long long)offs[oi],
                              r0, r0 + n);
                }
            }
            CHECK(!g.direct_refused);
            long pages = ft_test_cached_pages(path, 0, offs[oi] + mb);
            if (!tmpfs) CHECK_MSG(pages == 0, "direct reads left %ld pages cached", pages);
            /* not aligned: buffered, the same bytes */
            uint8_t *odd = bf ? raw + 64 : dst + 64;
            float *out = (float *)(void *)(dst + 64);
            CHECK_OK(ft_gstream_read(&g, 5, 30, out, odd));
            CHECK(!memcmp(out, want + 5 * COLS, 30 * COLS * 4));
            pages = ft_test_cached_pages(path, 0, offs[oi] + mb);
            if (!tmpfs) CHECK_MSG(pages > 0 && pages != -1, "the buffered read cached nothing");
            CHECK(g.bytes_read > 0);
            /* past the end */
            CHECK(ft_gstream_read(&g, ROWS - 1, 2, dst, raw) == FT_ERR_INVALID_ARG);
            close(g.fd);
            close(g.dfd);
        }
    unlink(path);
    rmdir(d);
    ft_free_aligned(dst);
    ft_free_aligned(raw);
    free(want);
}

/* A file system that refuses O_DIRECT (ramfs: EINVAL at open; this
 * kernel's tmpfs takes it): the streamed globals read through the page
 * cache, the logits unchanged. Needs the right to mount (root): skipped
 * without it. */
TEST(direct_io_refused)
{
    char mnt[] = "/tmp/ft_test_ramfs_XXXXXX";
    REQUIRE(mkdtemp(mnt));
    if (mount("none", mnt, "ramfs", 0, NULL) != 0) {
        printf("  cannot mount a ramfs (%s): skipped\n", strerror(errno));
        rmdir(mnt);
        return;
    }
    char dir[600], from[700], to[700];
    model_dir("llama-tiny-bf16", dir, sizeof dir);
    static const char *files[] = {"config.json", "model.safetensors"};
    int ok = 1;
    for (int i = 0; i < 2; i++) {
        snprintf(from, sizeof from, "%s/%s", dir, files[i]);
        snprintf(to, sizeof to, "%s/%s", mnt, files[i]);
        ok = ok && copy_file(from, to);
    }
    snprintf(to, sizeof to, "%s/model.safetensors", mnt);
    int probe = open(to, O_RDONLY | O_DIRECT);
    CHECK_MSG(ok && probe < 0 && errno == EINVAL, "the ramfs copy: copied %d, O_DIRECT open %d", ok, probe);
    if (probe >= 0) close(probe);
    float *want = NULL;
    size_t n0 = 0, n1 = 0;
    for (int direct = 0; ok && direct <= 1; direct++) {
        ft_load_params lp;
        ft_load_params_default(&lp);
        lp.stream_globals = FT_STREAM_EMBED | FT_STREAM_LM_HEAD;
        lp.stream_direct_io = direct;
        lp.stream_drop_cache = 1;
        ft_model *m = NULL;
        ft_status st = ft_model_load(mnt, &lp, &m);
        CHECK_MSG(st == FT_OK, "direct %d: %s", direct, ft_last_error());
        if (st) break;
        float *got = run(m, 1, direct ? &n1 : &n0, &st);
        CHECK_MSG(st == FT_OK && got, "direct %d: %s", direct, ft_last_error());
        if (!direct) want = got;
        else CHECK_MSG(got && want && n1 == n0 && !memcmp(got, want, n0 * sizeof(float)), "logits differ");
        if (direct) free(got);
        ft_model_free(m);
    }
    free(want);
    for (int i = 0; i < 2; i++) {
        snprintf(to, sizeof to, "%s/%s", mnt, files[i]);
        unlink(to);
    }
    CHECK(umount2(mnt, MNT_DETACH) == 0);
    rmdir(mnt);
}

/* A fault at read time, on the descriptor O_DIRECT opened fine: the
 * direct reads' pread (ft_gstream.dpread) passes the first `after`
 * calls to pread, then fails with `err` (EINVAL: the file system refuses
 * this direct read; anything else: a read error). It notes whether the
 * failing call ran off the test's thread (the context's reader). */
static struct {
    int after, err, calls, failed, off_main;
    pthread_t main;
} fault;

static ssize_t fault_pread(int fd, void *buf, size_t n, off_t off)
{
    int k = __atomic_fetch_add(&fault.calls, 1, __ATOMIC_SEQ_CST);
    if (k < fault.after) return pread(fd, buf, n, off);
    __atomic_fetch_add(&fault.failed, 1, __ATOMIC_SEQ_CST);
    if (!pthread_equal(pthread_self(), fault.main)) __atomic_store_n(&fault.off_main, 1, __ATOMIC_SEQ_CST);
    errno = fault.err;
    return -1;
}

static void fault_arm(int after, int err)
{
    fault.after = after;
    fault.err = err;
    fault.calls = fault.failed = fault.off_main = 0;
    fault.main = pthread_self();
}

static ft_model *load_streamed(const char *dir, unsigned stream, int direct, int chunk)
{
    ft_load_params lp;
    ft_load_params_default(&lp);
    lp.stream_globals = stream;
    lp.stream_direct_io = direct;
    lp.stream_drop_cache = 1;
    lp.stream_chunk_rows = chunk;
    ft_model *m = NULL;
    ft_status st = ft_model_load(dir, &lp, &m);
    CHECK_MSG(st == FT_OK, "%s: %s", dir, ft_last_error());
    return st ? NULL : m;
}

/* O_DIRECT refused at read time (the open took it): that read and all
 * after it go through the page cache, direct_refused is set, no direct
 * read is tried again, each byte counted once, the logits those of the
 * page-cache reads. The refusal comes on the reader thread's first chunk
 * of the head (read while the layers compute), on one of its later
 * chunks (read while the pool computes the one before) in a prefill and
 * in a decode step, and on an embedding row read on the caller's thread
 * (untied: the head's reads stay direct; tied: the head is that matrix). */
TEST(direct_io_refused_at_read)
{
    /* llama-tiny-bf16: 320 rows, chunks of 24: 14 direct reads per step
     * (prefill: calls 0-13); tied, both streamed: 10 rows of the prefill
     * on this thread and its chunk 0 on the reader, then chunks 1, 2.. */
    static const struct { const char *name; unsigned stream; int emb, after, reader; } cases[] = {
        {"llama-tiny-bf16", FT_STREAM_LM_HEAD, 0, 0, 1},
        {"llama-tiny-bf16", FT_STREAM_LM_HEAD, 0, 5, 1},
        {"llama-tiny-bf16", FT_STREAM_LM_HEAD, 0, 20, 1},
        {"llama-tiny-bf16", FT_STREAM_EMBED | FT_STREAM_LM_HEAD, 1, 0, 0},
        {"llama-tiny-tied-rope3", FT_STREAM_EMBED, 1, 12, 1},
        {"llama-tiny-tied-rope3", FT_STREAM_EMBED, 1, 0, -1},     /* a row and chunk 0 at once */
        {"llama-tiny", FT_STREAM_LM_HEAD, 0, 3, 1},   /* f32 rows: read straight into the compute buffer */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char dir[600];
        model_dir(cases[i].name, dir, sizeof dir);
        ft_model *mb = load_streamed(dir, cases[i].stream, 0, 24);
        ft_model *md = load_streamed(dir, cases[i].stream, 1, 24);
        if (!mb || !md) { ft_model_free(mb); ft_model_free(md); continue; }
        ft_gstream *g = cases[i].emb ? md->gs_emb : md->gs_head;
        /* the fixtures are on a file system that takes O_DIRECT */
        REQUIRE(g && g->dfd >= 0 && g->direct && md->gs_head->direct);
        size_t n0 = 0, n1 = 0;
        ft_status st;
        float *want = run(mb, 2, &n0, &st);
        CHECK_MSG(st == FT_OK && want, "%s buffered: %s", cases[i].name, ft_last_error());
        uint64_t want_bytes = ft_model_stream_bytes_read(mb);
        fault_arm(cases[i].after, EINVAL);
        g->dpread = fault_pread;
        float *got = run(md, 2, &n1, &st);
        CHECK_MSG(st == FT_OK && got, "%s refused after %d: %s", cases[i].name, cases[i].after, ft_last_error());
        CHECK_MSG(got && want && n1 == n0 && !memcmp(got, want, n0 * sizeof(float)),
                  "%s refused after %d direct reads: logits differ from the page-cache reads'", cases[i].name,
                  cases[i].after);
        /* one refusal, no direct read after it; where the two threads
         * read at once (tied, refused at once) both may be refused
         * before either sets the flag */
        int most = cases[i].reader < 0 ? 2 : 1;
        CHECK_MSG(fault.failed >= 1 && fault.failed <= most && fault.calls == cases[i].after + fault.failed,
                  "%s: %d direct reads tried, %d refused (want %d + the refused, at most %d): a refused direct "
                  "read is tried again", cases[i].name, fault.calls, fault.failed, cases[i].after, most);
        CHECK(__atomic_load_n(&g->direct_refused, __ATOMIC_RELAXED) == 1);
        if (md->gs_head != g) CHECK(!md->gs_head->direct_refused);
        CHECK_MSG(ft_model_stream_bytes_read(md) == want_bytes, "%s: %llu bytes counted, the page-cache reads %llu",
                  cases[i].name, (unsigned long long)ft_model_stream_bytes_read(md),
                  (unsigned long long)want_bytes);
        if (cases[i].reader >= 0)
            CHECK_MSG(fault.off_main == cases[i].reader, "%s after %d: the refusal came %s the reader thread",
                      cases[i].name, cases[i].after, fault.off_main ? "on" : "off");
        free(got);
        free(want);
        ft_model_free(md);
        ft_model_free(mb);
    }
}

/* A read error (not a refusal) on the reader thread comes back from the
 * forward call with its message, whichever chunk it hits (the first one,
 * read while the layers compute, or a later one); nothing hangs or leaks
 * (ASan), and the context computes again once the reads work. */
TEST(direct_io_reader_error)
{
    char dir[600];
    model_dir("llama-tiny-bf16", dir, sizeof dir);
    ft_model *m = load_streamed(dir, FT_STREAM_LM_HEAD, 1, 24);
    ft_model *ref = load_streamed(dir, 0, 0, 0);
    REQUIRE(m && ref && m->gs_head->dfd >= 0);
    const int V = ft_model_get_config(m)->vocab;
    ft_ctx_params cp = {0};
    cp.max_batch = 1; cp.max_seq = 16; cp.threads = 2; cp.kv_dtype = FT_F32;
    float *logits = calloc((size_t)V, sizeof(float)), *want = calloc((size_t)V, sizeof(float));
    REQUIRE(logits && want);
    const int32_t *toks[1] = {P0};
    size_t ntok[1] = {7};
    int slot = 0;
    ft_ctx *rc = NULL;
    REQUIRE(ft_ctx_create(ref, &cp, &rc) == FT_OK);
    CHECK_OK(ft_ctx_forward(rc, 1, &slot, toks, ntok, want, 0));
    ft_ctx_free(rc);
    static const int afters[] = {0, 1, 7, 13};   /* 14 chunks of 24 of 320 rows */
    for (size_t k = 0; k < sizeof afters / sizeof afters[0]; k++) {
        ft_ctx *c = NULL;
        REQUIRE(ft_ctx_create(m, &cp, &c) == FT_OK);
        fault_arm(afters[k], EIO);
        m->gs_head->dpread = fault_pread;
        ft_clear_error();
        ft_status st = ft_ctx_forward(c, 1, &slot, toks, ntok, logits, 0);
        CHECK_MSG(st == FT_ERR_IO, "read error after %d chunks: status %d", afters[k], st);
        CHECK_MSG(strstr(ft_last_error(), "streamed matrix: direct read") &&
                  strstr(ft_last_error(), strerror(EIO)), "after %d: the message is \"%s\"", afters[k],
                  ft_last_error());
        CHECK(fault.off_main && fault.failed == 1 && !m->gs_head->direct_refused);
        /* the reads work again: the same context computes the logits */
        m->gs_head->dpread = NULL;
        ft_ctx_reset(c, 0);
        CHECK_OK(ft_ctx_forward(c, 1, &slot, toks, ntok, logits, 0));
        CHECK(!memcmp(logits, want, (size_t)V * sizeof(float)));
        /* an error, then the context freed with nothing more called */
        fault_arm(afters[k], EIO);
        m->gs_head->dpread = fault_pread;
        ft_ctx_reset(c, 0);
        CHECK(ft_ctx_forward(c, 1, &slot, toks, ntok, logits, 0) == FT_ERR_IO);
        ft_ctx_free(c);
        m->gs_head->dpread = NULL;
    }
    free(logits);
    free(want);
    ft_model_free(ref);
    ft_model_free(m);
}

/* A head read past the page cache has a second chunk buffer: counted in
 * the context's scratch, by ft_ctx_estimate as by ft_ctx_create, and by
 * the estimate from a layout-only model (what a memory budget is checked
 * against before loading); a head read through the page cache has none. */
TEST(direct_io_second_buffer_counted)
{
    char dir[600];
    model_dir("llama-tiny-bf16", dir, sizeof dir);
    ft_ctx_params cp = {0};
    cp.max_batch = 2; cp.max_seq = 24; cp.threads = 2; cp.kv_dtype = FT_F32;
    uint64_t scratch[2] = {0, 0};
    for (int direct = 0; direct <= 1; direct++) {
        ft_model *m = load_streamed(dir, FT_STREAM_LM_HEAD, direct, 0);
        REQUIRE(m);
        ft_ctx *c = NULL;
        REQUIRE(ft_ctx_create(m, &cp, &c) == FT_OK);
        uint64_t kv = 0, est = 0, lest = 0;
        CHECK_OK(ft_ctx_estimate(m, &cp, &kv, &est));
        scratch[direct] = ft_ctx_scratch_bytes(c);
        CHECK_MSG(est == scratch[direct], "direct %d: estimate %llu, allocated %llu", direct,
                  (unsigned long long)est, (unsigned long long)scratch[direct]);
        ft_ctx_free(c);
        ft_model_free(m);
        ft_load_params lp;
        ft_load_params_default(&lp);
        lp.stream_globals = FT_STREAM_LM_HEAD;
        lp.stream_direct_io = direct;
        lp.external_layers = FT_LOAD_LAYOUT_ONLY;
        ft_model *lm = NULL;
        REQUIRE(ft_model_load(dir, &lp, &lm) == FT_OK);
        CHECK_OK(ft_ctx_estimate(lm, &cp, &kv, &lest));
        CHECK_MSG(lest == est, "direct %d: layout-only estimate %llu, loaded %llu", direct,
                  (unsigned long long)lest, (unsigned long long)est);
        ft_model_free(lm);
    }
    /* the head is 320 rows of 64 bf16 (one chunk): the second chunk
     * buffer is 320 x 64 x 2 bytes + the slack */
    CHECK_MSG(scratch[1] == scratch[0] + 320 * 64 * 2 + FT_GSTREAM_SLACK, "scratch %llu direct, %llu buffered",
              (unsigned long long)scratch[1], (unsigned long long)scratch[0]);
}
