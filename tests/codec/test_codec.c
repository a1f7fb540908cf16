/* Lossless codecs and the frame: round trips, zlib interop, corruption. */
#include "ft_test.h"
#include "support/synth.h"
#include "flextier/codec.h"
#include "codec/codec_internal.h"

#include <math.h>
#include <zlib.h>

static ft_status roundtrip(ft_codec_ctx *ctx, const ft_codec_params *p, ft_dtype dt,
                           uint32_t ndim, const int64_t *shape, size_t *fsize)
{
    ft_tensor t;
    ft_status st = ft_tensor_init(&t, dt, ndim, shape, NULL);
    if (st) return st;
    uint64_t n, nb;
    ft_tensor_numel(&t, &n);
    ft_tensor_nbytes(&t, &nb);
    t.data = ft_test_weights(dt, n, 1024, n * 31 + (uint64_t)dt);
    size_t bound = ft_encode_bound(p, dt, ndim, shape);
    uint8_t *frame = ft_malloc_aligned(bound + 1, 64);
    st = ft_encode(ctx, p, &t, frame, bound, fsize);
    if (st == FT_OK) {
        ft_tensor d = {0};
        d.dtype = dt;
        d.data = ft_malloc_aligned(nb + 64, 64);
        st = ft_decode(ctx, frame, *fsize, &d, nb);
        if (st == FT_OK) {
            if (memcmp(d.data, t.data, nb)) st = ft_set_error(FT_ERR_INTERNAL, "mismatch");
            if (d.ndim != ndim || (ndim && memcmp(d.shape, shape, ndim * 8))) st = ft_set_error(FT_ERR_INTERNAL, "shape");
        }
        ft_free_aligned(d.data);
    }
    ft_free_aligned(frame);
    ft_free_aligned(t.data);
    return st;
}

TEST(lossless_roundtrips)
{
    static const ft_codec_id codecs[] = {FT_CODEC_RAW, FT_CODEC_LZ4, FT_CODEC_ZSTD, FT_CODEC_DEFLATE};
    static const ft_dtype dts[] = {FT_F32, FT_F16, FT_BF16, FT_I8, FT_U8, FT_I32};
    static const int64_t shapes[][3] = {{0, 0, 0}, {1, 1, 1}, {1, 1, 7}, {3, 5, 7},
                                        {1, 1, 65537}, {2, 1000, 333}};
    static const uint32_t ndims[] = {1, 1, 3, 3, 1, 3};
    for (unsigned th = 1; th <= 3; th += 2) {
        ft_codec_ctx *ctx;
        CHECK_OK(ft_codec_ctx_create(th, &ctx));
        for (size_t c = 0; c < 4; c++)
            for (size_t d = 0; d < 6; d++)
                for (size_t s = 0; s < 6; s++) {
                    ft_codec_params p;
                    ft_codec_default_params(&p);
                    p.codec = codecs[c];
                    p.chunk_size = s == 5 ? 4096 : FT_DEFAULT_CHUNK_SIZE;
                    const int64_t *sh = shapes[s] + (3 - ndims[s]);
                    size_t fs;
                    ft_status st = roundtrip(ctx, &p, dts[d], ndims[s], sh, &fs);
                    CHECK_MSG(st == FT_OK, "%s %s shape#%zu threads %u: %s %s", ft_codec_name(codecs[c]),
                              ft_dtype_name(dts[d]), s, th, ft_status_str(st), ft_last_error());
                }
        ft_codec_ctx_free(ctx);
    }
}

/* ft_codec_ctx_set_spin_us reaches the context's threads: after a frame
 * they spin that long (CPU time grows while the caller sleeps), with 0
 * they sleep at once (the offloader's I/O workers beside compute). */
TEST(codec_ctx_spin_setting)
{
    if (getenv("FLEXTIER_SPIN_US")) {   /* it decides for every pool */
        printf("  (skipped: FLEXTIER_SPIN_US is set)\n");
        return;
    }
    ft_codec_ctx *ctx;
    CHECK_OK(ft_codec_ctx_create(2, &ctx));
    ft_codec_params p;
    ft_codec_default_params(&p);
    p.chunk_size = 64 << 10;   /* several chunks: both threads work */
    int64_t shape[1] = {1 << 20};
    size_t fs;
    ft_codec_ctx_set_spin_us(ctx, 400000);
    CHECK_OK(roundtrip(ctx, &p, FT_BF16, 1, shape, &fs));
    double c0 = ft_test_cpu_s();
    ft_test_nap_ms(100);
    double spun = ft_test_cpu_s() - c0;
    ft_codec_ctx_set_spin_us(ctx, 0);
    CHECK_OK(roundtrip(ctx, &p, FT_BF16, 1, shape, &fs));
    ft_test_nap_ms(20);
    c0 = ft_test_cpu_s();
    ft_test_nap_ms(100);
    double slept = ft_test_cpu_s() - c0;
    CHECK_MSG(spun > 0.02, "spinning 400 ms: %.1f ms of CPU in 100", 1e3 * spun);
    CHECK_MSG(slept < 0.01, "no spin: %.1f ms of CPU in 100", 1e3 * slept);
    ft_codec_ctx_set_spin_us(NULL, 0);
    ft_codec_ctx_free(ctx);
}

TEST(scalar_tensor)
{
    ft_codec_ctx *ctx;
    CHECK_OK(ft_codec_ctx_create(1, &ctx));
    ft_codec_params p;
    ft_codec_default_params(&p);
    size_t fs;
    CHECK_OK(roundtrip(ctx, &p, FT_F32, 0, NULL, &fs));
    ft_codec_ctx_free(ctx);
}

/* Each deflate chunk is a raw DEFLATE stream zlib can inflate. */
TEST(deflate_chunks_inflate_with_zlib)
{
    ft_codec_ctx *ctx;
    CHECK_OK(ft_codec_ctx_create(2, &ctx));
    for (int level = 1; level <= 12; level += 5) {
        int64_t shape[1] = {300000};
        ft_tensor t;
        ft_tensor_init(&t, FT_BF16, 1, shape, ft_test_weights(FT_BF16, 300000, 1024, 5));
        ft_codec_params p;
        ft_codec_default_params(&p);
        p.codec = FT_CODEC_DEFLATE;
        p.level = level;
        size_t bound = ft_encode_bound(&p, FT_BF16, 1, shape), fs;
        uint8_t *frame = malloc(bound);
        CHECK_OK(ft_encode(ctx, &p, &t, frame, bound, &fs));
        ft_frame_info fi;
        CHECK_OK(ft_frame_parse(frame, fs, &fi));
        CHECK(fi.n_chunks == 3);
        int deflated = 0;
        for (uint32_t i = 0; i < fi.n_chunks; i++) {
            ft_chunk_info c;
            CHECK_OK(ft_frame_chunk(frame, fs, &fi, i, &c));
            uint8_t *out = malloc(c.raw_size);
            if (c.flags & FT_CHUNK_STORED) {
                memcpy(out, frame + c.enc_offset, c.raw_size);
            } else {
                deflated++;
                z_stream z = {0};
                CHECK(inflateInit2(&z, -15) == Z_OK);
                z.next_in = frame + c.enc_offset;
                z.avail_in = c.enc_size;
                z.next_out = out;
                z.avail_out = c.raw_size;
                CHECK(inflate(&z, Z_FINISH) == Z_STREAM_END);
                CHECK(z.total_out == c.raw_size);
                inflateEnd(&z);
            }
            CHECK(!memcmp(out, (uint8_t *)t.data + c.raw_offset, c.raw_size));
            free(out);
        }
        CHECK(deflated > 0);
        free(frame);
        ft_free_aligned(t.data);
    }
    ft_codec_ctx_free(ctx);
}

/* Decoding to another float dtype converts (lossless frame). */
TEST(decode_converts)
{
    ft_codec_ctx *ctx;
    CHECK_OK(ft_codec_ctx_create(2, &ctx));
    int64_t shape[2] = {100, 1000};
    ft_tensor t;
    ft_tensor_init(&t, FT_BF16, 2, shape, ft_test_weights(FT_BF16, 100000, 1024, 9));
    ft_codec_params p;
    ft_codec_default_params(&p);
    size_t bound = ft_encode_bound(&p, FT_BF16, 2, shape), fs;
    uint8_t *frame = malloc(bound);
    CHECK_OK(ft_encode(ctx, &p, &t, frame, bound, &fs));
    ft_tensor d;
    CHECK_OK(ft_decode_alloc(ctx, frame, fs, FT_F32, &d));
    CHECK(d.dtype == FT_F32 && d.ndim == 2 && d.shape[1] == 1000);
    int bad = 0;
    for (int i = 0; i < 100000; i++)
        bad += ((float *)d.data)[i] != ft_bf16_to_f32_1(((uint16_t *)t.data)[i]);
    CHECK(bad == 0);
    ft_free_aligned(d.data);
    ft_tensor small = {0};
    small.dtype = FT_BF16;
    uint8_t tiny[16];
    small.data = tiny;
    CHECK(ft_decode(ctx, frame, fs, &small, sizeof tiny) == FT_ERR_BUFFER_SMALL);
    small.dtype = FT_I8;
    CHECK(ft_decode(ctx, frame, fs, &small, sizeof tiny) == FT_ERR_UNSUPPORTED);
    /* encoding into a too-small buffer fails cleanly */
    size_t fs2;
    CHECK(ft_encode(ctx, &p, &t, frame, 100, &fs2) == FT_ERR_BUFFER_SMALL);
    free(frame);
    ft_free_aligned(t.data);
    ft_codec_ctx_free(ctx);
}

/* Every single-bit flip and every truncation of a frame is rejected. */
TEST(corruption_rejected)
{
    ft_codec_ctx *ctx;
    CHECK_OK(ft_codec_ctx_create(1, &ctx));
    static const ft_codec_id codecs[] = {FT_CODEC_RAW, FT_CODEC_LZ4, FT_CODEC_ZSTD, FT_CODEC_DEFLATE};
    for (size_t c = 0; c < 4; c++) {
        int64_t shape[2] = {3, 2500};
        ft_tensor t;
        ft_tensor_init(&t, FT_BF16, 2, shape, ft_test_weights(FT_BF16, 7500, 1024, 3));
        ft_codec_params p;
        ft_codec_default_params(&p);
        p.codec = codecs[c];
        p.chunk_size = 4096;
        size_t bound = ft_encode_bound(&p, FT_BF16, 2, shape), fs;
        uint8_t *frame = malloc(bound);
        CHECK_OK(ft_encode(ctx, &p, &t, frame, bound, &fs));
        uint8_t *out = malloc(15000);
        ft_tensor d = {0};
        d.dtype = FT_BF16;
        d.data = out;
        CHECK_OK(ft_decode(ctx, frame, fs, &d, 15000));
        size_t accepted = 0;
        for (size_t bit = 0; bit < fs * 8; bit++) {
            frame[bit / 8] ^= (uint8_t)(1u << (bit % 8));
            ft_status st = ft_decode(ctx, frame, fs, &d, 15000);
            if (st == FT_OK) accepted++;
            else CHECK(st == FT_ERR_CORRUPT || st == FT_ERR_UNSUPPORTED);
            frame[bit / 8] ^= (uint8_t)(1u << (bit % 8));
        }
        CHECK_MSG(accepted == 0, "%s: %zu bit flips accepted", ft_codec_name(codecs[c]), accepted);
        for (size_t len = 0; len < fs; len += (len < 200 ? 1 : 97)) {
            uint8_t *cut = malloc(len ? len : 1);
            memcpy(cut, frame, len);
            CHECK(ft_decode(ctx, cut, len, &d, 15000) == FT_ERR_CORRUPT);
            free(cut);
        }
        free(out);
        free(frame);
        ft_free_aligned(t.data);
    }
    ft_codec_ctx_free(ctx);
}

TEST(bad_params)
{
    ft_codec_params p;
    ft_codec_default_params(&p);
    int64_t shape[1] = {10};
    p.chunk_size = 100;
    CHECK(ft_encode_bound(&p, FT_F32, 1, shape) == 0);
    ft_codec_default_params(&p);
    p.codec = FT_CODEC_DEFLATE;
    p.level = 13;
    CHECK(ft_encode_bound(&p, FT_F32, 1, shape) == 0);
    ft_codec_default_params(&p);
    p.codec = FT_CODEC_Q4;
    CHECK(ft_encode_bound(&p, FT_I32, 1, shape) == 0);
    p.group_dim = 3;
    CHECK(ft_encode_bound(&p, FT_F32, 1, shape) == 0);
    ft_codec_id c, e;
    CHECK_OK(ft_codec_parse("bp-lz4", &c, &e)); CHECK(c == FT_CODEC_BYTEPLANE && e == FT_CODEC_LZ4);
    CHECK_OK(ft_codec_parse("q4", &c, &e)); CHECK(c == FT_CODEC_Q4);
    CHECK(ft_codec_parse("bp-gzip", &c, &e) == FT_ERR_INVALID_ARG);
    CHECK(ft_codec_parse("snappy", &c, &e) == FT_ERR_INVALID_ARG);
}

/* An error in a worker thread reaches the caller with its message. */
TEST(worker_error_message_reaches_caller)
{
    ft_codec_ctx *ctx;
    CHECK_OK(ft_codec_ctx_create(3, &ctx));
    int64_t shape[1] = {300000};
    float *x = calloc(300000, sizeof(float));
    x[250000] = NAN;
    ft_tensor t;
    ft_tensor_init(&t, FT_F32, 1, shape, x);
    ft_codec_params p;
    ft_codec_default_params(&p);
    p.codec = FT_CODEC_Q4;
    p.chunk_size = 4096;
    size_t bound = ft_encode_bound(&p, FT_F32, 1, shape), fs;
    uint8_t *frame = malloc(bound);
    ft_clear_error();
    CHECK(ft_encode(ctx, &p, &t, frame, bound, &fs) == FT_ERR_INVALID_ARG);
    CHECK_MSG(strstr(ft_last_error(), "250000") != NULL, "message: '%s'", ft_last_error());
    free(frame);
    free(x);
    ft_codec_ctx_free(ctx);
}
