/* Byte-plane codec: SIMD kernels vs scalar, round trips over dtypes x
 * entropy stages x shapes x threads with special values, ratio on
 * Gaussian weights, the chunk sub-format's validation, bit flips. */
#include "ft_test.h"
#include "support/synth.h"
#include "flextier/codec.h"
#include "codec/codec_internal.h"
#include "codec/byteplane.h"

#include <math.h>
#include <zstd.h>

static const ft_dtype float_dts[] = {FT_BF16, FT_F16, FT_F32};
static const ft_codec_id stages[] = {FT_CODEC_ZSTD, FT_CODEC_LZ4, FT_CODEC_DEFLATE};

/* Test data kinds. */
enum { K_GAUSS, K_SPECIAL, K_EQUAL, K_RANDOM, K_BF16_IN_F32, K_COUNT };

static void *make_data(ft_dtype dt, uint64_t n, int kind, uint64_t seed)
{
    size_t es = ft_dtype_bits(dt) / 8;
    if (kind == K_GAUSS) return ft_test_weights(dt, n, 4096, seed);
    uint8_t *p = ft_malloc_aligned(n * es + 64, 64);
    uint64_t s = seed;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t r = ft_test_rand(&s);
        uint32_t v32 = 0;
        uint16_t v16 = 0;
        switch (kind) {
        case K_SPECIAL: {
            /* NaN payloads (quiet and signalling, both signs), +-Inf,
             * +-0, subnormals, the largest/smallest normals, mixed with
             * ordinary values */
            static const uint32_t f32s[] = {0x7fc00001u, 0xffa5a5a5u, 0x7f800001u, 0x7f800000u,
                                            0xff800000u, 0x00000000u, 0x80000000u, 0x00000001u,
                                            0x807fffffu, 0x00400000u, 0x7f7fffffu, 0x00800000u,
                                            0x3f800000u, 0xbc23d70au};
            static const uint16_t b16s[] = {0x7fc1, 0xffa5, 0x7f81, 0x7f80, 0xff80, 0x0000, 0x8000,
                                            0x0001, 0x807f, 0x0040, 0x7f7f, 0x0080, 0x3f80, 0xbc24};
            static const uint16_t h16s[] = {0x7e01, 0xfd55, 0x7c01, 0x7c00, 0xfc00, 0x0000, 0x8000,
                                            0x0001, 0x83ff, 0x0200, 0x7bff, 0x0400, 0x3c00, 0xa51f};
            unsigned k = (unsigned)(r % 20);
            if (k >= 14) { v32 = (uint32_t)(r >> 20); v16 = (uint16_t)(r >> 40); }
            else { v32 = f32s[k]; v16 = dt == FT_BF16 ? b16s[k] : h16s[k]; }
            break;
        }
        case K_EQUAL: v32 = 0xbc23d70au; v16 = 0xbc24; break;
        case K_RANDOM: v32 = (uint32_t)r; v16 = (uint16_t)r; break;
        case K_BF16_IN_F32: {   /* f32 upcast of bf16: the low planes are zero */
            v16 = (uint16_t)(0x3c00 + (r % 0x600));
            v32 = (uint32_t)v16 << 16;
            break;
        }
        }
        if (es == 4) memcpy(p + 4 * i, &v32, 4);
        else memcpy(p + 2 * i, &v16, 2);
    }
    return p;
}

static ft_status roundtrip(ft_codec_ctx *ctx, const ft_codec_params *p, ft_dtype dt, uint32_t ndim,
                           const int64_t *shape, int kind, size_t *fsize)
{
    ft_tensor t;
    ft_status st = ft_tensor_init(&t, dt, ndim, shape, NULL);
    if (st) return st;
    uint64_t n, nb;
    ft_tensor_numel(&t, &n);
    ft_tensor_nbytes(&t, &nb);
    t.data = make_data(dt, n, kind, n * 131 + (uint64_t)kind * 7 + (uint64_t)dt);
    size_t bound = ft_encode_bound(p, dt, ndim, shape);
    uint8_t *frame = ft_malloc_aligned(bound + 1, 64);
    if (bound == 0 || !frame) st = ft_set_error(FT_ERR_INTERNAL, "bound");
    else st = ft_encode(ctx, p, &t, frame, bound, fsize);
    if (st == FT_OK) {
        ft_frame_info fi;
        st = ft_frame_parse(frame, *fsize, &fi);
        if (st == FT_OK && (fi.codec != FT_CODEC_BYTEPLANE || fi.entropy != p->entropy))
            st = ft_set_error(FT_ERR_INTERNAL, "frame codec %d entropy %d", fi.codec, fi.entropy);
    }
    if (st == FT_OK) {
        ft_tensor d = {0};
        d.dtype = dt;
        d.data = ft_malloc_aligned(nb + 64, 64);
        st = ft_decode(ctx, frame, *fsize, &d, nb);
        if (st == FT_OK) {
            if (nb && memcmp(d.data, t.data, nb)) st = ft_set_error(FT_ERR_INTERNAL, "mismatch");
            if (d.ndim != ndim || (ndim && memcmp(d.shape, shape, ndim * 8)))
                st = ft_set_error(FT_ERR_INTERNAL, "shape");
        }
        ft_free_aligned(d.data);
    }
    ft_free_aligned(frame);
    ft_free_aligned(t.data);
    return st;
}

/* SIMD split/merge equal the scalar references, all dtypes and tails. */
TEST(split_merge_simd_vs_ref)
{
    static const size_t sizes[] = {0, 1, 7, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 127, 128, 129, 191, 1000, 10007};
    uint64_t s = 99;
    for (size_t d = 0; d < 3; d++) {
        ft_dtype dt = float_dts[d];
        size_t es = ft_dtype_bits(dt) / 8;
        unsigned np = ft_bp_nplanes(dt);
        CHECK(np == (es == 4 ? 4u : 2u));
        for (size_t z = 0; z < sizeof sizes / sizeof sizes[0]; z++) {
            size_t n = sizes[z];
            uint8_t *src = malloc(n * es + 1), *back = malloc(n * es + 1);
            uint8_t *ref = malloc(4 * n + 4), *got = malloc(4 * n + 4);
            for (size_t i = 0; i < n * es; i++) src[i] = (uint8_t)ft_test_rand(&s);
            uint8_t *R[4], *G[4];
            for (unsigned k = 0; k < 4; k++) { R[k] = ref + k * n; G[k] = got + k * n; }
            ft_bp_split_ref(dt, src, n, R);
            /* scalar round trip restores every bit */
            ft_bp_merge_ref(dt, (const uint8_t *const *)R, n, back);
            CHECK_MSG(!memcmp(back, src, n * es), "%s n=%zu ref merge", ft_dtype_name(dt), n);
            size_t (*splits[4])(ft_dtype, const void *, size_t, uint8_t *const *) = {
                ft_bp_split_avx512, ft_bp_split_avx2, ft_bp_split_neon, NULL};
            size_t (*merges[4])(ft_dtype, const uint8_t *const *, size_t, void *) = {
                ft_bp_merge_avx512, ft_bp_merge_avx2, ft_bp_merge_neon, NULL};
            for (int v = 0; v < 4; v++) {
                memset(got, 0xAA, 4 * n + 4);
                memset(back, 0x55, n * es + 1);
                if (splits[v]) {
                    size_t done = splits[v](dt, src, n, G);
                    CHECK(done <= n);
                    ft_bp_split_ref(dt, src + done * es, n - done,
                                    (uint8_t *const[]){G[0] + done, G[1] + done, G[2] + done, G[3] + done});
                    done = merges[v](dt, (const uint8_t *const *)R, n, back);
                    CHECK(done <= n);
                    ft_bp_merge_ref(dt, (const uint8_t *const[]){R[0] + done, R[1] + done, R[2] + done,
                                                                  R[3] + done},
                                    n - done, back + done * es);
                } else {
                    ft_bp_split(dt, src, n, G);
                    ft_bp_merge(dt, (const uint8_t *const *)R, n, back);
                }
                CHECK_MSG(!memcmp(got, ref, np * n), "%s n=%zu split variant %d", ft_dtype_name(dt), n, v);
                CHECK_MSG(!memcmp(back, src, n * es), "%s n=%zu merge variant %d", ft_dtype_name(dt), n, v);
            }
            free(src); free(back); free(ref); free(got);
        }
    }
    /* the exponent plane is the exponent */
    uint16_t b = 0xC2F7;   /* bf16: sign 1, exponent 0x85, mantissa 0x77 */
    uint8_t e, sm, *P2[2] = {&e, &sm};
    ft_bp_split_ref(FT_BF16, &b, 1, P2);
    CHECK(e == 0x85 && sm == 0xF7);
    uint32_t f = 0xC2F71234u;
    uint8_t q[4], *P4[4] = {q, q + 1, q + 2, q + 3};
    ft_bp_split_ref(FT_F32, &f, 1, P4);
    CHECK(q[0] == 0x85 && q[1] == 0xF7 && q[2] == 0x12 && q[3] == 0x34);
}

TEST(roundtrips)
{
    static const int64_t shapes[][3] = {{0, 0, 0}, {1, 1, 1}, {1, 1, 3}, {3, 5, 7},
                                        {1, 1, 10007}, {7, 333, 641}};
    static const uint32_t ndims[] = {1, 1, 3, 3, 1, 2};
    for (unsigned th = 1; th <= 3; th += 2) {
        ft_codec_ctx *ctx;
        CHECK_OK(ft_codec_ctx_create(th, &ctx));
        for (size_t e = 0; e < 3; e++)
            for (size_t d = 0; d < 3; d++)
                for (size_t s = 0; s < 6; s++)
                    for (int kind = 0; kind < K_COUNT; kind++) {
                        if (kind == K_BF16_IN_F32 && float_dts[d] != FT_F32) continue;
                        /* the large shape only for a few kinds: keep it quick */
                        if (s == 5 && kind != K_GAUSS && kind != K_SPECIAL) continue;
                        ft_codec_params p;
                        ft_codec_default_params(&p);
                        p.codec = FT_CODEC_BYTEPLANE;
                        p.entropy = stages[e];
                        /* small chunks so the odd sizes span several
                         * chunks; 1 MiB chunks: multi-block zstd planes */
                        p.chunk_size = s == 4 ? 4096 : (s == 5 && th == 3) ? (1u << 20)
                                                                            : FT_DEFAULT_CHUNK_SIZE;
                        const int64_t *sh = shapes[s] + (3 - ndims[s]);
                        size_t fs;
                        ft_status st = roundtrip(ctx, &p, float_dts[d], ndims[s], sh, kind, &fs);
                        CHECK_MSG(st == FT_OK, "bp-%s %s shape#%zu kind %d threads %u: %s %s",
                                  ft_codec_name(stages[e]), ft_dtype_name(float_dts[d]), s, kind, th,
                                  ft_status_str(st), ft_last_error());
                    }
        ft_codec_ctx_free(ctx);
    }
}

/* A byteplane frame decodes to another float dtype (conversion). */
TEST(decode_converts)
{
    ft_codec_ctx *ctx;
    CHECK_OK(ft_codec_ctx_create(2, &ctx));
    int64_t shape[2] = {50, 1000};
    ft_tensor t;
    ft_tensor_init(&t, FT_BF16, 2, shape, ft_test_weights(FT_BF16, 50000, 1000, 8));
    ft_codec_params p;
    ft_codec_default_params(&p);
    p.codec = FT_CODEC_BYTEPLANE;
    size_t bound = ft_encode_bound(&p, FT_BF16, 2, shape), fs;
    uint8_t *frame = malloc(bound);
    CHECK_OK(ft_encode(ctx, &p, &t, frame, bound, &fs));
    ft_tensor d;
    CHECK_OK(ft_decode_alloc(ctx, frame, fs, FT_F32, &d));
    CHECK(d.dtype == FT_F32 && d.ndim == 2 && d.shape[0] == 50 && d.shape[1] == 1000);
    int bad = 0;
    for (int i = 0; i < 50000; i++)
        bad += ((float *)d.data)[i] != ft_bf16_to_f32_1(((uint16_t *)t.data)[i]);
    CHECK(bad == 0);
    ft_free_aligned(d.data);
    free(frame);
    ft_free_aligned(t.data);
    ft_codec_ctx_free(ctx);
}

/* Explicit entropy levels go through the ordinary entropy stage. */
TEST(levels)
{
    ft_codec_ctx *ctx;
    CHECK_OK(ft_codec_ctx_create(2, &ctx));
    static const int zl[] = {-5, 1, 3, 9}, dl[] = {1, 6, 12}, ll[] = {-8, 1};
    int64_t shape[1] = {70001};
    for (int d = 0; d < 3; d++) {
        for (size_t i = 0; i < 4 + 3 + 2; i++) {
            ft_codec_params p;
            ft_codec_default_params(&p);
            p.codec = FT_CODEC_BYTEPLANE;
            if (i < 4) { p.entropy = FT_CODEC_ZSTD; p.level = zl[i]; }
            else if (i < 7) { p.entropy = FT_CODEC_DEFLATE; p.level = dl[i - 4]; }
            else { p.entropy = FT_CODEC_LZ4; p.level = ll[i - 7]; }
            size_t fs;
            ft_status st = roundtrip(ctx, &p, float_dts[d], 1, shape, K_GAUSS, &fs);
            CHECK_MSG(st == FT_OK, "%s level %d: %s", ft_codec_name(p.entropy), p.level, ft_last_error());
        }
    }
    ft_codec_ctx_free(ctx);
}

static double ratio_of(ft_codec_ctx *ctx, ft_dtype dt, ft_codec_id ent, uint64_t n, const void *data)
{
    int64_t shape[2] = {(int64_t)(n / 4096), 4096};
    ft_tensor t;
    ft_tensor_init(&t, dt, 2, shape, (void *)data);
    ft_codec_params p;
    ft_codec_default_params(&p);
    p.codec = FT_CODEC_BYTEPLANE;
    p.entropy = ent;
    size_t bound = ft_encode_bound(&p, dt, 2, shape), fs = 0;
    uint8_t *frame = ft_malloc_aligned(bound, 64);
    ft_status st = ft_encode(ctx, &p, &t, frame, bound, &fs);
    double r = 0;
    if (st == FT_OK) {
        ft_tensor d = {0};
        d.dtype = dt;
        size_t nb = (size_t)ft_dtype_nbytes(dt, n);
        d.data = ft_malloc_aligned(nb, 64);
        if (ft_decode(ctx, frame, fs, &d, nb) == FT_OK && !memcmp(d.data, data, nb))
            r = (double)nb / (double)fs;
        ft_free_aligned(d.data);
    }
    ft_free_aligned(frame);
    return r;
}

/* The exponent plane is entropy-coded: bf16 Gaussian weights reach the
 * ZipNN ratio (~1.5x) with the zstd stage, and the other stages and
 * dtypes beat plain coding. */
TEST(ratio_gaussian)
{
    ft_codec_ctx *ctx;
    CHECK_OK(ft_codec_ctx_create(2, &ctx));
    uint64_t n = 1u << 20;
    void *w = ft_test_weights(FT_BF16, n, 4096, 12345);
    double r = ratio_of(ctx, FT_BF16, FT_CODEC_ZSTD, n, w);
    CHECK_MSG(r >= 1.45, "bf16 bp-zstd ratio %.4f < 1.45", r);
    double rd = ratio_of(ctx, FT_BF16, FT_CODEC_DEFLATE, n, w);
    CHECK_MSG(rd >= 1.38, "bf16 bp-deflate ratio %.4f", rd);
    double rl = ratio_of(ctx, FT_BF16, FT_CODEC_LZ4, n, w);
    CHECK_MSG(rl >= 1.15, "bf16 bp-lz4 ratio %.4f", rl);
    ft_free_aligned(w);
    w = ft_test_weights(FT_F16, n, 4096, 12345);
    r = ratio_of(ctx, FT_F16, FT_CODEC_ZSTD, n, w);
    CHECK_MSG(r >= 1.15, "f16 bp-zstd ratio %.4f", r);
    ft_free_aligned(w);
    w = ft_test_weights(FT_F32, n, 4096, 12345);
    r = ratio_of(ctx, FT_F32, FT_CODEC_ZSTD, n, w);
    CHECK_MSG(r >= 1.17, "f32 bp-zstd ratio %.4f", r);
    ft_free_aligned(w);
    ft_codec_ctx_free(ctx);
}

static uint8_t read_modes(const void *payload) { return *(const uint8_t *)payload; }

/* The encoder picks the plane modes the data calls for. */
TEST(plane_modes)
{
    ft_worker_ws ws;
    memset(&ws, 0, sizeof ws);
    ft_frame_info fi;
    memset(&fi, 0, sizeof fi);
    fi.codec = FT_CODEC_BYTEPLANE;
    fi.entropy = FT_CODEC_ZSTD;
    size_t n = 16384, out = 0;
    uint8_t *dst = malloc(4 * n + 64), *back = malloc(4 * n);
    /* bf16 weights: exponent coded, sign|mantissa raw */
    fi.dtype = FT_BF16;
    void *w = ft_test_weights(FT_BF16, n, 4096, 5);
    CHECK_OK(ft_bp_encode_chunk(&ws, &fi, w, 2 * n, dst, ft_bp_bound(&fi, 2 * n), &out));
    CHECK(read_modes(dst) == (1 | 0 << 2));
    CHECK(out < 2 * n * 70 / 100);
    CHECK_OK(ft_bp_decode_chunk(&ws, &fi, dst, out, back, 2 * n));
    CHECK(!memcmp(back, w, 2 * n));
    ft_free_aligned(w);
    /* f32 upcast of bf16: the two low planes are constant */
    fi.dtype = FT_F32;
    w = make_data(FT_F32, n, K_BF16_IN_F32, 3);
    CHECK_OK(ft_bp_encode_chunk(&ws, &fi, w, 4 * n, dst, ft_bp_bound(&fi, 4 * n), &out));
    CHECK((read_modes(dst) >> 4) == (2 | 2 << 2));
    CHECK_OK(ft_bp_decode_chunk(&ws, &fi, dst, out, back, 4 * n));
    CHECK(!memcmp(back, w, 4 * n));
    ft_free_aligned(w);
    /* random bits: every plane raw */
    w = make_data(FT_F32, n, K_RANDOM, 3);
    CHECK_OK(ft_bp_encode_chunk(&ws, &fi, w, 4 * n, dst, ft_bp_bound(&fi, 4 * n), &out));
    CHECK(read_modes(dst) == 0 && out == 1 + 4 * n);
    CHECK_OK(ft_bp_decode_chunk(&ws, &fi, dst, out, back, 4 * n));
    CHECK(!memcmp(back, w, 4 * n));
    /* a too-small output buffer is reported, not overrun */
    CHECK(ft_bp_encode_chunk(&ws, &fi, w, 4 * n, dst, 4 * n, &out) == FT_ERR_BUFFER_SMALL);
    ft_free_aligned(w);
    free(dst);
    free(back);
    ft_ws_release(&ws);
}

/* Hostile chunk payloads are rejected with FT_ERR_CORRUPT. */
TEST(hostile_payloads)
{
    ft_worker_ws ws;
    memset(&ws, 0, sizeof ws);
    ft_frame_info fi;
    memset(&fi, 0, sizeof fi);
    fi.codec = FT_CODEC_BYTEPLANE;
    fi.entropy = FT_CODEC_ZSTD;
    fi.dtype = FT_BF16;
    size_t n = 4096;
    uint8_t *back = malloc(2 * n), *pl = malloc(4 * n + 64);
    memset(pl, 0, 4 * n + 64);
    /* a valid all-raw payload decodes */
    pl[0] = 0;
    CHECK_OK(ft_bp_decode_chunk(&ws, &fi, pl, 1 + 2 * n, back, 2 * n));
    /* ... but not with a byte missing, a byte extra or a partial element */
    CHECK(ft_bp_decode_chunk(&ws, &fi, pl, 2 * n, back, 2 * n) == FT_ERR_CORRUPT);
    CHECK(ft_bp_decode_chunk(&ws, &fi, pl, 2 + 2 * n, back, 2 * n) == FT_ERR_CORRUPT);
    CHECK(ft_bp_decode_chunk(&ws, &fi, pl, 1 + 2 * n, back, 2 * n - 1) == FT_ERR_CORRUPT);
    CHECK(ft_bp_decode_chunk(&ws, &fi, pl, 0, back, 2 * n) == FT_ERR_CORRUPT);
    /* constant planes: 3 bytes */
    pl[0] = 2 | 2 << 2; pl[1] = 0x3f; pl[2] = 0x80;
    CHECK_OK(ft_bp_decode_chunk(&ws, &fi, pl, 3, back, 2 * n));
    CHECK(((uint16_t *)back)[n - 1] == 0x9f80);
    /* mode 3, unused mode bits */
    pl[0] = 3;
    CHECK(ft_bp_decode_chunk(&ws, &fi, pl, 3, back, 2 * n) == FT_ERR_CORRUPT);
    pl[0] = 2 | 2 << 2 | 1 << 4;
    CHECK(ft_bp_decode_chunk(&ws, &fi, pl, 3, back, 2 * n) == FT_ERR_CORRUPT);
    /* coded sizes: zero, >= n, overrunning, not decoding to n */
    static const uint32_t bad_sizes[] = {0, 4096, 4097, 0xFFFFFFFFu, 100, 4095};
    for (size_t i = 0; i < 6; i++) {
        pl[0] = 1 | 2 << 2;
        memcpy(pl + 1, &bad_sizes[i], 4);
        memset(pl + 5, 0xA5, 200);
        size_t len = i == 4 ? 5 + 100 + 1 : i == 5 ? 5 + 100 + 1 : 5 + 200;
        CHECK_MSG(ft_bp_decode_chunk(&ws, &fi, pl, len, back, 2 * n) == FT_ERR_CORRUPT, "size #%zu", i);
    }
    /* garbage in every entropy stage */
    for (int e = 0; e < 3; e++) {
        fi.entropy = stages[e];
        uint32_t sz = 100;
        pl[0] = 1 | 2 << 2;
        memcpy(pl + 1, &sz, 4);
        for (int k = 0; k < 100; k++) pl[5 + k] = (uint8_t)(k * 37 + 11);
        pl[105] = 0;
        CHECK(ft_bp_decode_chunk(&ws, &fi, pl, 106, back, 2 * n) == FT_ERR_CORRUPT);
    }
    /* a non-float frame dtype */
    fi.dtype = FT_I32;
    pl[0] = 0;
    CHECK(ft_bp_decode_chunk(&ws, &fi, pl, 1 + 2 * n, back, 2 * n) == FT_ERR_CORRUPT);
    free(back);
    free(pl);
    ft_ws_release(&ws);
}

/* Bytes drawn from a skewed distribution over `alpha` symbols: symbol k
 * with weight ~ q^k (q < 1: the shape of an exponent plane), or uniform. */
static void skewed_bytes(uint8_t *p, size_t n, unsigned alpha, double q, uint8_t base, uint64_t *s)
{
    for (size_t i = 0; i < n; i++) {
        unsigned k = 0;
        if (q <= 0) k = (unsigned)(ft_test_rand(s) % alpha);
        else
            while (k + 1 < alpha && (double)(ft_test_rand(s) >> 11) / 9007199254740992.0 > 1 - q) k++;
        p[i] = (uint8_t)(base + k);
    }
}

/* Fast literal-frame decoder (zstd_lit.c) against libzstd: on every frame
 * ft_zstd_literals_encode writes it must decode (not defer) to the same
 * bytes; frames with sequences (ordinary zstd levels), wrong sizes, bit
 * flips and truncations it defers or, where it accepts, libzstd accepts
 * with the same output. */
TEST(zstd_lit_vs_libzstd)
{
    ft_worker_ws ws;
    memset(&ws, 0, sizeof ws);
    static const size_t sizes[] = {64, 100, 1000, 1023, 1024, 4095, 20000, 65536, 131072, 131073,
                                   200000, 262144, 300001};
    static const struct { unsigned alpha; double q; uint8_t base; } dists[] = {
        {2, 0.5, 0}, {3, 0.3, 120}, {12, 0.45, 116}, {40, 0.6, 80}, {128, 0.9, 0}, {200, 0.97, 40},
        {256, 0.99, 0}, {256, 0, 0}, {16, 0.2, 250 - 15}, {60, 0, 3}};
    size_t ndist = sizeof dists / sizeof dists[0];
    uint64_t seed = 5;
    size_t fast = 0, deferred_ok = 0;
    for (size_t z = 0; z < sizeof sizes / sizeof sizes[0]; z++)
        for (size_t k = 0; k < ndist; k++) {
            size_t n = sizes[z];
            if (n > 70000 && k % 3) continue;   /* keep it quick */
            uint8_t *src = malloc(n), *got = malloc(n + 1), *ref = malloc(n + 1);
            size_t cap = ZSTD_compressBound(n) + 64, fs = 0;
            uint8_t *f = malloc(cap);
            skewed_bytes(src, n, dists[k].alpha, dists[k].q, dists[k].base, &seed);
            /* half the inputs: an exponent plane of synthetic bf16 weights */
            if (k == 0 && n % 2 == 0) {
                uint16_t *w = ft_test_weights(FT_BF16, n, 4096, seed);
                for (size_t i = 0; i < n; i++) src[i] = (uint8_t)(w[i] >> 7);
                ft_free_aligned(w);
            }
            CHECK_OK(ft_zstd_literals_encode(&ws, src, n, f, cap, &fs));
            CHECK(ZSTD_decompress(ref, n, f, fs) == n && !memcmp(ref, src, n));
            memset(got, 0xEE, n + 1);
            ft_status st = ft_zstd_lit_decode(&ws, f, fs, got, n);
            CHECK_MSG(st == FT_OK, "n=%zu dist %zu: literal frame not decoded (%d)", n, k, (int)st);
            CHECK_MSG(!memcmp(got, src, n) && got[n] == 0xEE, "n=%zu dist %zu: wrong bytes", n, k);
            fast += st == FT_OK;
            /* wrong expected size */
            CHECK(ft_zstd_lit_decode(&ws, f, fs, got, n - 1) != FT_OK);
            /* ordinary zstd (sequences) and the fast levels: decoded the
             * same or left to libzstd */
            static const int levels[] = {-5, 1, 3};
            for (int l = 0; l < 3; l++) {
                size_t r = ZSTD_compress(f, cap, src, n, levels[l]);
                CHECK(!ZSTD_isError(r));
                st = ft_zstd_lit_decode(&ws, f, r, got, n);
                if (st == FT_OK) CHECK_MSG(!memcmp(got, src, n), "n=%zu level %d", n, levels[l]);
                else { CHECK(st == FT_ERR_UNSUPPORTED); deferred_ok++; }
            }
            free(src); free(got); free(ref); free(f);
        }
    CHECK(fast > 50 && deferred_ok > 0);
    /* bit flips and truncations of small literal frames: what the fast
     * decoder accepts, libzstd accepts with the same bytes */
    for (size_t k = 0; k < ndist; k += 2) {
        size_t n = 700 + 300 * k;
        uint8_t *src = malloc(n), *got = malloc(n), *ref = malloc(n), f[4096];
        size_t fs = 0;
        skewed_bytes(src, n, dists[k].alpha, dists[k].q, dists[k].base, &seed);
        CHECK_OK(ft_zstd_literals_encode(&ws, src, n, f, sizeof f, &fs));
        size_t accepted = 0, diverged = 0;
        for (size_t bit = 0; bit < fs * 8; bit++) {
            f[bit / 8] ^= (uint8_t)(1u << (bit % 8));
            if (ft_zstd_lit_decode(&ws, f, fs, got, n) == FT_OK) {
                accepted++;
                size_t r = ZSTD_decompress(ref, n, f, fs);
                if (ZSTD_isError(r) || r != n || memcmp(ref, got, n)) diverged++;
            }
            f[bit / 8] ^= (uint8_t)(1u << (bit % 8));
        }
        CHECK_MSG(diverged == 0, "dist %zu: %zu of %zu accepted flips differ from libzstd", k, diverged, accepted);
        for (size_t len = 0; len < fs; len++) CHECK(ft_zstd_lit_decode(&ws, f, len, got, n) != FT_OK);
        free(src); free(got); free(ref);
    }
    ft_ws_release(&ws);
}

/* Every single-bit flip and every truncation of a byteplane frame is
 * rejected (pattern of test_codec's corruption_rejected). */
TEST(corruption_rejected)
{
    ft_codec_ctx *ctx;
    CHECK_OK(ft_codec_ctx_create(1, &ctx));
    for (size_t e = 0; e < 3; e++)
        for (int v = 0; v < 2; v++) {
            /* v 0: bf16 weights (coded + raw planes); v 1: f32 with
             * constant planes (upcast bf16) */
            ft_dtype dt = v ? FT_F32 : FT_BF16;
            int64_t shape[2] = {3, v ? 500 : 1500};
            uint64_t n = (uint64_t)(shape[0] * shape[1]);
            size_t nb = (size_t)ft_dtype_nbytes(dt, n);
            ft_tensor t;
            ft_tensor_init(&t, dt, 2, shape,
                           v ? make_data(dt, n, K_BF16_IN_F32, 4) : ft_test_weights(dt, n, 4096, 3));
            ft_codec_params p;
            ft_codec_default_params(&p);
            p.codec = FT_CODEC_BYTEPLANE;
            p.entropy = stages[e];
            p.chunk_size = 4096;
            size_t bound = ft_encode_bound(&p, dt, 2, shape), fs;
            uint8_t *frame = malloc(bound);
            CHECK_OK(ft_encode(ctx, &p, &t, frame, bound, &fs));
            CHECK_MSG(fs < nb, "bp-%s v%d: frame %zu not smaller than %zu", ft_codec_name(stages[e]), v,
                      fs, nb);
            uint8_t *out = malloc(nb);
            ft_tensor d = {0};
            d.dtype = dt;
            d.data = out;
            CHECK_OK(ft_decode(ctx, frame, fs, &d, nb));
            CHECK(!memcmp(out, t.data, nb));
            size_t accepted = 0;
            for (size_t bit = 0; bit < fs * 8; bit++) {
                frame[bit / 8] ^= (uint8_t)(1u << (bit % 8));
                ft_status st = ft_decode(ctx, frame, fs, &d, nb);
                if (st == FT_OK) accepted++;
                else CHECK(st == FT_ERR_CORRUPT || st == FT_ERR_UNSUPPORTED);
                frame[bit / 8] ^= (uint8_t)(1u << (bit % 8));
            }
            CHECK_MSG(accepted == 0, "bp-%s v%d: %zu bit flips accepted", ft_codec_name(stages[e]), v,
                      accepted);
            for (size_t len = 0; len < fs; len += (len < 200 ? 1 : 97)) {
                uint8_t *cut = malloc(len ? len : 1);
                memcpy(cut, frame, len);
                CHECK(ft_decode(ctx, cut, len, &d, nb) == FT_ERR_CORRUPT);
                free(cut);
            }
            free(out);
            free(frame);
            ft_free_aligned(t.data);
        }
    ft_codec_ctx_free(ctx);
}
