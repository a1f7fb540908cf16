/* Test support: the store checks run against every backend (mem:, file:,
 * ucx://): test cases (CHECK/REQUIRE), so a header included by
 * tests/store and tests/net. Data from support/synth.h. */
#ifndef FT_SUPPORT_STORE_CHECKS_H
#define FT_SUPPORT_STORE_CHECKS_H
#include "ft_test.h"
#include "flextier/store.h"
#include "support/synth.h"

#include <math.h>
#include <pthread.h>
#include <string.h>

/* Weight-like data as dt (rows of 1000, like the tensors below). */
static void *tw_make(ft_dtype dt, uint64_t n, uint64_t seed) { return ft_test_weights(dt, n, 1000, seed); }

static float tw_get(const void *p, ft_dtype dt, uint64_t i) { return ft_test_load_f(dt, p, (size_t)i); }

static const ft_codec_id tw_codecs[] = {FT_CODEC_RAW, FT_CODEC_LZ4, FT_CODEC_ZSTD,
                                        FT_CODEC_DEFLATE, FT_CODEC_BYTEPLANE, FT_CODEC_Q8,
                                        FT_CODEC_Q4};

/* Is this codec implemented in this build? (byteplane/q8/q4 land from
 * other branches; until then ft_encode says FT_ERR_UNSUPPORTED.) */
static int tw_codec_available(ft_codec_id c)
{
    if (c <= FT_CODEC_DEFLATE) return 1;
    ft_codec_ctx *ctx = NULL;
    if (ft_codec_ctx_create(1, &ctx) != FT_OK) return 0;
    int64_t shape[1] = {4096};
    void *d = tw_make(FT_BF16, 4096, 1);
    ft_tensor t;
    ft_tensor_init(&t, FT_BF16, 1, shape, d);
    ft_codec_params p;
    ft_codec_default_params(&p);
    p.codec = c;
    size_t cap = ft_encode_bound(&p, FT_BF16, 1, shape), n = 0;
    void *buf = cap ? ft_malloc_aligned(cap, 64) : NULL;
    ft_status st = buf ? ft_encode(ctx, &p, &t, buf, cap, &n) : FT_ERR_UNSUPPORTED;
    ft_free_aligned(buf);
    ft_free_aligned(d);
    ft_codec_ctx_free(ctx);
    return st == FT_OK;
}

/* Write and read back a bf16 [rows, cols] tensor with every codec; also
 * read into a caller buffer as f32, stat it and list it. */
static void tw_codec_roundtrips(ft_store *s, const char *prefix)
{
    const int64_t shape[2] = {96, 1000};
    const uint64_t n = 96000;
    void *src = tw_make(FT_BF16, n, 7);
    float *f32 = ft_malloc_aligned(n * 4, 64);
    REQUIRE(src && f32);
    float lo = 1e9f, hi = -1e9f;
    for (uint64_t i = 0; i < n; i++) {
        float v = tw_get(src, FT_BF16, i);
        if (v < lo) lo = v;
        if (v > hi) hi = v;
    }
    for (size_t ci = 0; ci < sizeof tw_codecs / sizeof tw_codecs[0]; ci++) {
        ft_codec_id c = tw_codecs[ci];
        if (!tw_codec_available(c)) {
            printf("     (codec %s not in this build: skipped)\n", ft_codec_name(c));
            continue;
        }
        char key[64];
        snprintf(key, sizeof key, "%s/w.%s", prefix, ft_codec_name(c));
        ft_codec_params p;
        ft_codec_default_params(&p);
        p.codec = c;
        p.chunk_size = 64 * 1024;   /* several chunks */
        ft_tensor t;
        CHECK_OK(ft_tensor_init(&t, FT_BF16, 2, shape, src));
        CHECK_OK(ft_write_tensor(s, key, &t, &p));
        ft_tensor out;
        ft_status st = ft_read_tensor(s, key, -1, &out);
        CHECK_OK(st);
        if (st != FT_OK) continue;
        CHECK(out.dtype == FT_BF16 && out.ndim == 2 && out.shape[0] == 96 && out.shape[1] == 1000);
        if (!ft_codec_is_lossy(c)) {
            CHECK_MSG(!memcmp(out.data, src, n * 2), "codec %s", ft_codec_name(c));
        } else {
            float bound = (hi - lo) / (c == FT_CODEC_Q4 ? 15.0f : 255.0f) + 1e-3f;
            float worst = 0;
            for (uint64_t i = 0; i < n; i++) {
                float e = fabsf(tw_get(out.data, FT_BF16, i) - tw_get(src, FT_BF16, i));
                if (e > worst) worst = e;
            }
            CHECK_MSG(worst <= bound, "codec %s error %g > %g", ft_codec_name(c), worst, bound);
        }
        ft_free_aligned(out.data);
        /* into a caller buffer, converted to f32 */
        ft_tensor d = {.dtype = FT_F32, .data = f32};
        CHECK_OK(ft_read_tensor_into(s, key, &d, n * 4));
        if (!ft_codec_is_lossy(c))
            CHECK(d.shape[0] == 96 && f32[12345] == tw_get(src, FT_BF16, 12345) &&
                  f32[n - 1] == tw_get(src, FT_BF16, n - 1));
        /* too small a buffer */
        ft_tensor d2 = {.dtype = FT_F32, .data = f32};
        CHECK(ft_read_tensor_into(s, key, &d2, n * 2) == FT_ERR_BUFFER_SMALL);
        ft_tensor_stat ts;
        CHECK_OK(ft_stat_tensor(s, key, &ts));
        CHECK(ts.dtype == FT_BF16 && ts.ndim == 2 && ts.codec == c && ts.raw_bytes == n * 2);
        CHECK(ts.stored_bytes > 0);
        if (c == FT_CODEC_ZSTD || c == FT_CODEC_Q4 || c == FT_CODEC_Q8 || c == FT_CODEC_BYTEPLANE)
            CHECK_MSG(ts.stored_bytes < n * 2, "%s did not compress", ft_codec_name(c));
    }
    /* list contains our keys; delete removes them */
    char **keys = NULL;
    size_t nk = 0;
    CHECK_OK(ft_list_tensors(s, &keys, &nk));
    size_t mine = 0;
    for (size_t i = 0; i < nk; i++)
        if (!strncmp(keys[i], prefix, strlen(prefix)) && keys[i][strlen(prefix)] == '/') mine++;
    ft_list_free(keys, nk);
    CHECK(mine >= 4);
    char key[64];
    snprintf(key, sizeof key, "%s/w.raw", prefix);
    CHECK_OK(ft_delete_tensor(s, key));
    ft_tensor out;
    CHECK(ft_read_tensor(s, key, -1, &out) == FT_ERR_NOT_FOUND);
    CHECK(ft_delete_tensor(s, key) == FT_ERR_NOT_FOUND);
    ft_tensor_stat ts;
    CHECK(ft_stat_tensor(s, key, &ts) == FT_ERR_NOT_FOUND);
    /* bad keys */
    ft_tensor t;
    CHECK_OK(ft_tensor_init(&t, FT_BF16, 2, shape, src));
    char longkey[300];
    memset(longkey, 'k', sizeof longkey - 1);
    longkey[sizeof longkey - 1] = 0;
    CHECK(ft_write_tensor(s, longkey, &t, NULL) == FT_ERR_INVALID_ARG);
    CHECK(ft_write_tensor(s, "", &t, NULL) == FT_ERR_INVALID_ARG);
    CHECK(ft_write_tensor(s, "a b", &t, NULL) == FT_ERR_INVALID_ARG);
    CHECK(ft_write_tensor(s, "tab\there", &t, NULL) == FT_ERR_INVALID_ARG);
    longkey[FT_KEY_MAX] = 0;   /* exactly the limit */
    ft_status st = ft_write_tensor(s, longkey, &t, NULL);
    CHECK(st == FT_OK || st == FT_ERR_INVALID_ARG);   /* file: may refuse long escaped names */
    if (st == FT_OK) CHECK_OK(ft_delete_tensor(s, longkey));
    ft_free_aligned(src);
    ft_free_aligned(f32);
}

/* Many async writes then reads in flight (more than the queue depth). */
static void tw_async(ft_store *s, const char *prefix, int count, uint64_t elems)
{
    void **src = calloc((size_t)count, sizeof *src);
    ft_tensor *t = calloc((size_t)count, sizeof *t), *d = calloc((size_t)count, sizeof *d);
    ft_request **r = calloc((size_t)count, sizeof *r);
    REQUIRE(src && t && d && r);
    int64_t shape[1] = {(int64_t)elems};
    ft_codec_params p;
    ft_codec_default_params(&p);
    p.codec = FT_CODEC_LZ4;
    char key[64];
    for (int i = 0; i < count; i++) {
        src[i] = tw_make(FT_BF16, elems, 100 + (uint64_t)i);
        ft_tensor_init(&t[i], FT_BF16, 1, shape, src[i]);
        snprintf(key, sizeof key, "%s/a%d", prefix, i);
        CHECK_OK(ft_write_tensor_async(s, key, &t[i], i % 2 ? &p : NULL, &r[i]));
    }
    for (int i = 0; i < count; i++) {
        CHECK_OK(ft_request_wait(r[i], 30000));
        ft_request_free(r[i]);
    }
    for (int i = 0; i < count; i++) {
        d[i].dtype = FT_BF16;
        d[i].data = i % 3 ? ft_malloc_aligned(elems * 2, 64) : NULL;   /* some allocate */
        snprintf(key, sizeof key, "%s/a%d", prefix, i);
        CHECK_OK(ft_read_tensor_async(s, key, &d[i], elems * 2, &r[i]));
    }
    ft_request *missing = NULL;
    ft_tensor dm = {.dtype = FT_BF16, .data = NULL};
    snprintf(key, sizeof key, "%s/missing", prefix);
    CHECK_OK(ft_read_tensor_async(s, key, &dm, 0, &missing));
    int pending_seen = 0;
    for (int i = 0; i < count; i++) {
        if (ft_request_test(r[i]) == FT_INPROGRESS) pending_seen++;
        CHECK_OK(ft_request_wait(r[i], 30000));
        CHECK(ft_request_test(r[i]) == FT_OK);
        ft_request_free(r[i]);
        CHECK(d[i].data && d[i].shape[0] == (int64_t)elems && !memcmp(d[i].data, src[i], elems * 2));
        ft_free_aligned(d[i].data);
        ft_free_aligned(src[i]);
    }
    CHECK(ft_request_wait(missing, 30000) == FT_ERR_NOT_FOUND);
    ft_request_free(missing);
    (void)pending_seen;
    free(src); free(t); free(d); free(r);
}

/* Readers never see a mix of two versions while a writer overwrites. */
typedef struct { ft_store *s; const char *key; void *a, *b; uint64_t n; int iters; int bad, ok; } tw_ow;
static void *tw_overwriter(void *arg)
{
    tw_ow *o = arg;
    int64_t shape[1] = {(int64_t)o->n};
    for (int i = 0; i < o->iters; i++) {
        ft_tensor t;
        ft_tensor_init(&t, FT_BF16, 1, shape, i % 2 ? o->a : o->b);
        if (ft_write_tensor(o->s, o->key, &t, NULL) != FT_OK) o->bad++;
    }
    return NULL;
}

static void tw_overwrite_during_read_n(ft_store *s, ft_store *s2, const char *prefix,
                                       uint64_t n, int iters)
{
    tw_ow o = {s2, NULL, tw_make(FT_BF16, n, 1), tw_make(FT_BF16, n, 2), n, iters, 0, 0};
    char key[64];
    snprintf(key, sizeof key, "%s/ow", prefix);
    o.key = key;
    int64_t shape[1] = {(int64_t)n};
    ft_tensor t;
    ft_tensor_init(&t, FT_BF16, 1, shape, o.a);
    CHECK_OK(ft_write_tensor(s, key, &t, NULL));
    pthread_t th;
    pthread_create(&th, NULL, tw_overwriter, &o);
    void *buf = ft_malloc_aligned(n * 2, 64);
    int mixed = 0, reads = 0;
    for (int i = 0; i < iters; i++) {
        ft_tensor d = {.dtype = FT_BF16, .data = buf};
        ft_status st = ft_read_tensor_into(s, key, &d, n * 2);
        CHECK_OK(st);
        if (st != FT_OK) continue;
        reads++;
        if (memcmp(buf, o.a, n * 2) && memcmp(buf, o.b, n * 2)) mixed++;
    }
    pthread_join(th, NULL);
    CHECK(o.bad == 0);
    CHECK(reads == iters && mixed == 0);
    ft_free_aligned(buf);
    ft_free_aligned(o.a);
    ft_free_aligned(o.b);
}

static void tw_overwrite_during_read(ft_store *s, ft_store *s2, const char *prefix)
{
    tw_overwrite_during_read_n(s, s2, prefix, 1 << 20, 20);   /* 2 MiB */
}
#endif
