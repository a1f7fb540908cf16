/* The GPU codec's math without a GPU: the per-element functions the
 * kernels run (src/cuda/kern_math.h) and the host halves of the GPU decode
 * (src/cuda/cuda_prep.c), executed here on the CPU element by element and
 * compared bit for bit with the CPU codec. Also the cuBLAS GEMM parameter
 * mapping (through cblas in column-major mode, which has cuBLAS's
 * semantics) and the argmax reduction rule. Runs in every build; what it
 * cannot check (launches, shared memory, streams, cuBLAS itself) is left
 * to the GPU tests. */
#include "cuda_test_util.h"
#include "cuda/cuda_prep.h"
#include "flextier/engine.h"

#include <cblas.h>

static ft_codec_ctx *cc(void)
{
    static ft_codec_ctx *c;
    if (!c) ft_codec_ctx_create(2, &c);
    return c;
}

static int same_f32_bits(float a, float b) { return !memcmp(&a, &b, 4); }

TEST(hm_convert_bit_exact)
{
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        if (!same_f32_bits(km_bf16_to_f32((uint16_t)h), ft_bf16_to_f32_1((uint16_t)h))) bad++;
        if (!same_f32_bits(km_f16_to_f32((uint16_t)h), ft_f16_to_f32_1((uint16_t)h))) bad++;
        /* every half/bf16 value as f32, converted back both ways */
        float f = ft_f16_to_f32_1((uint16_t)h), g = ft_bf16_to_f32_1((uint16_t)h);
        if (km_f32_to_f16(f) != ft_f32_to_f16_1(f) || km_f32_to_bf16(f) != ft_f32_to_bf16_1(f)) bad++;
        if (km_f32_to_f16(g) != ft_f32_to_f16_1(g) || km_f32_to_bf16(g) != ft_f32_to_bf16_1(g)) bad++;
    }
    static const uint32_t special[] = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u,
                                       0x7f800001u, 0xffbfffffu, 0x00000001u, 0x807fffffu, 0x477ff000u,
                                       0x477fefffu, 0x38800000u, 0x387fffffu, 0x33000000u, 0x33000001u,
                                       0x32ffffffu, 0x3f808000u, 0x3f818000u, 0x7f7fffffu, 0xc77fe000u};
    uint64_t s = 42;
    for (int i = 0; i < 2000000; i++) {
        uint32_t u = i < (int)(sizeof special / 4) ? special[i] : (uint32_t)ft_test_rand(&s);
        float f;
        memcpy(&f, &u, 4);
        if (km_f32_to_f16(f) != ft_f32_to_f16_1(f) || km_f32_to_bf16(f) != ft_f32_to_bf16_1(f)) bad++;
    }
    CHECK_MSG(bad == 0, "%d conversions differ", bad);
}

/* For each q8/q4 case, input dtype and output dtype: prep (host checks and
 * geometry), the chunk table and every element through kern_math equal
 * ft_decode byte for byte. */
TEST(hm_quant_frames_bit_exact)
{
    int ncase = 0, nfast = 0;
    for (ut_qframe q = {0}; ut_qframe_next(cc(), &q);) {
        if (!q.f) continue;
        const uint8_t *f = q.f;
        size_t fs = q.fs;
        uint64_t n = q.n;
        ft_frame_info fi;
        ftk_qgeom g;
        if (ft_frame_parse(f, fs, &fi) != FT_OK || ft_cuda_prep_quant(f, &fi, 0, &g) != FT_OK) {
            CHECK_MSG(0, "case %zu: parse/prep failed: %s", q.ci, ft_last_error());
            continue;
        }
        uint64_t *table = calloc(fi.n_chunks + 1, sizeof *table);
        km_q_table(&g, table);
        for (uint32_t c = 0; c < fi.n_chunks; c++) {
            ft_chunk_info info;
            CHECK_OK(ft_frame_chunk(f, fs, &fi, c, &info));
            CHECK_MSG(table[c] == info.enc_offset, "case %zu chunk %u: table %llu vs %llu", q.ci, c,
                      (unsigned long long)table[c], (unsigned long long)info.enc_offset);
        }
        for (int o = 0; o < 3; o++) {
            const ft_dtype odt = ut_qf_odts[o];
            size_t ob = (size_t)ft_dtype_nbytes(odt, n);
            uint8_t *want = ft_malloc_aligned(ob + 64, 64), *got = ft_malloc_aligned(ob + 64, 64);
            ft_tensor d = {.dtype = odt, .data = want};
            CHECK_OK(ft_decode(cc(), f, fs, &d, ob + 64));
            for (uint64_t e = 0; e < n; e++) km_store(odt, got, e, km_q_dequant(&g, f, table, e));
            char what[96];
            ut_qframe_what(&q, odt, what, sizeof what);
            CHECK(ut_same_bits(got, want, ob, what));
            if (km_q_fast8_ok(&g)) {   /* the kernel's 8-at-a-time path, same bits */
                memset(got, 0xAB, ob);
                for (uint32_t t8 = 0; t8 < n / 8; t8++) {
                    float v[8];
                    km_q_dequant8(&g, f, t8, v);
                    for (int j = 0; j < 8; j++) km_store(odt, got, 8 * (uint64_t)t8 + (uint64_t)j, v[j]);
                }
                char what8[112];
                snprintf(what8, sizeof what8, "%s (8 at a time)", what);
                CHECK(ut_same_bits(got, want, ob, what8));
                nfast++;
            }
            ft_free_aligned(want);
            ft_free_aligned(got);
            ncase++;
        }
        free(table);
    }
    printf("  %d q8/q4 decodes compared, %d of them also 8 at a time\n", ncase, nfast);
    CHECK(nfast > 0);
}

/* Byte-plane frames: the host stage (entropy decode into the planes
 * layout) plus the kernels' regrouping equal ft_decode, for every dtype,
 * entropy stage, data kind (coded, stored, constant planes) and output. */
TEST(hm_byteplane_frames_bit_exact)
{
    static const ft_dtype dts[] = {FT_F32, FT_F16, FT_BF16}, odts[] = {FT_F32, FT_BF16, FT_F16};
    static const ft_codec_id ents[] = {FT_CODEC_ZSTD, FT_CODEC_LZ4, FT_CODEC_DEFLATE};
    static const int64_t sizes[] = {1, 333, 5000, 70001};
    ft_worker_ws ws;
    memset(&ws, 0, sizeof ws);
    int ncase = 0;
    for (int a = 0; a < 3; a++)
        for (int e = 0; e < 3; e++)
            for (int kind = 0; kind < 4; kind++)
                for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
                    if (kind == 2 && dts[a] != FT_F32) continue;
                    ft_tensor t;
                    uint64_t n = (uint64_t)sizes[si];
                    CHECK_OK(ft_tensor_init(&t, dts[a], 1, &sizes[si], NULL));
                    t.data = ut_make_bp_data(dts[a], n, kind, 77 * si + 7 * (uint64_t)kind + (uint64_t)a);
                    size_t fs = 0;
                    uint8_t *f = ut_encode(cc(), FT_CODEC_BYTEPLANE, ents[e], 0, -1, 4096, &t, &fs);
                    CHECK(f != NULL);
                    ft_frame_info fi;
                    uint64_t E = 0;
                    uint8_t *planes = ft_malloc_aligned(n * 4 + 64, 64);
                    if (f && ft_frame_parse(f, fs, &fi) == FT_OK &&
                        ft_cuda_prep_byteplane(&ws, f, &fi, 0, planes, &E) == FT_OK) {
                        for (int o = 0; o < 3; o++) {
                            size_t ob = (size_t)ft_dtype_nbytes(odts[o], n);
                            uint8_t *want = ft_malloc_aligned(ob + 64, 64), *got = ft_malloc_aligned(ob + 64, 64);
                            ft_tensor d = {.dtype = odts[o], .data = want};
                            CHECK_OK(ft_decode(cc(), f, fs, &d, ob + 64));
                            for (uint64_t k = 0; k < n; k++)
                                km_bp_store(dts[a], odts[o], got, k, km_bp_bits(dts[a], planes, n, E, k));
                            char what[96];
                            snprintf(what, sizeof what, "bp-%s %s kind %d n %llu -> %s", ft_codec_name(ents[e]),
                                     ft_dtype_name(dts[a]), kind, (unsigned long long)n, ft_dtype_name(odts[o]));
                            CHECK(ut_same_bits(got, want, ob, what));
                            ft_free_aligned(want);
                            ft_free_aligned(got);
                            ncase++;
                        }
                    } else {
                        CHECK_MSG(0, "bp case failed: %s", ft_last_error());
                    }
                    ft_free_aligned(planes);
                    ft_free_aligned(f);
                    ft_free_aligned(t.data);
                }
    ft_ws_release(&ws);
    printf("  %d byteplane decodes compared\n", ncase);
}

TEST(hm_raw_frames)
{
    int64_t shape[2] = {33, 1000};
    ft_tensor t;
    CHECK_OK(ft_tensor_init(&t, FT_BF16, 2, shape, NULL));
    t.data = ft_test_mixed(FT_BF16, 33000, 5);
    size_t fs = 0;
    uint8_t *f = ut_encode(cc(), FT_CODEC_RAW, 0, 0, -1, 4096, &t, &fs);
    ft_frame_info fi;
    REQUIRE(f && ft_frame_parse(f, fs, &fi) == FT_OK);
    CHECK_OK(ft_cuda_prep_raw(f, &fi, 0));
    CHECK(!memcmp(f + fi.header_size, t.data, 66000));
    f[fi.header_size + 5000] ^= 1;
    CHECK(ft_cuda_prep_raw(f, &fi, 0) == FT_ERR_CORRUPT);
    CHECK_OK(ft_cuda_prep_raw(f, &fi, 1));   /* trusted: hashes skipped */
    ft_free_aligned(f);
    ft_free_aligned(t.data);
}

TEST(hm_corrupt_frames_rejected)
{
    /* q4, 33 elements: one chunk with an odd count (pad nibble) */
    int64_t shape[2] = {1, 33};
    ft_tensor t;
    CHECK_OK(ft_tensor_init(&t, FT_F32, 2, shape, NULL));
    t.data = ft_test_mixed(FT_F32, 33, 9);
    size_t fs = 0;
    uint8_t *f = ut_encode(cc(), FT_CODEC_Q4, 0, 64, -1, 0, &t, &fs);
    ft_frame_info fi;
    ftk_qgeom g;
    REQUIRE(f && ft_frame_parse(f, fs, &fi) == FT_OK);
    CHECK_OK(ft_cuda_prep_quant(f, &fi, 0, &g));
    CHECK(g.numel == 33 && g.bits == 4 && g.n_chunks == 1);
    f[fi.header_size + 6] ^= 0x10;                         /* a payload bit */
    CHECK(ft_cuda_prep_quant(f, &fi, 0, &g) == FT_ERR_CORRUPT);
    CHECK_MSG(strstr(ft_last_error(), "checksum"), "%s", ft_last_error());
    f[fi.header_size + 6] ^= 0x10;
    f[fs - 1] |= 0x30;                                     /* the pad nibble */
    CHECK(ft_cuda_prep_quant(f, &fi, 1, &g) == FT_ERR_CORRUPT);
    CHECK_MSG(strstr(ft_last_error(), "pad nibble"), "%s", ft_last_error());
    ft_free_aligned(f);
    ft_free_aligned(t.data);

    /* byteplane: a bad mode byte */
    int64_t n = 5000;
    CHECK_OK(ft_tensor_init(&t, FT_BF16, 1, &n, NULL));
    t.data = ut_make_bp_data(FT_BF16, 5000, 0, 3);
    f = ut_encode(cc(), FT_CODEC_BYTEPLANE, FT_CODEC_ZSTD, 0, -1, 4096, &t, &fs);
    REQUIRE(f && ft_frame_parse(f, fs, &fi) == FT_OK);
    uint8_t *planes = ft_malloc_aligned(10000 + 64, 64);
    uint64_t E;
    ft_worker_ws ws;
    memset(&ws, 0, sizeof ws);
    CHECK_OK(ft_cuda_prep_byteplane(&ws, f, &fi, 0, planes, &E));
    ft_chunk_info ch;
    CHECK_OK(ft_frame_chunk(f, fs, &fi, 0, &ch));
    if (!(ch.flags & FT_CHUNK_STORED)) {
        f[ch.enc_offset] = 0xff;                            /* modes: plane mode 3 */
        CHECK(ft_cuda_prep_byteplane(&ws, f, &fi, 1, planes, &E) == FT_ERR_CORRUPT);
    }
    ft_ws_release(&ws);
    ft_free_aligned(planes);
    ft_free_aligned(f);
    ft_free_aligned(t.data);
}

/* KV rows: the two kernels' per-group and per-byte functions produce
 * ft_qrow_encode's bytes; decoding gives ft_qrow_decode's values. */
TEST(hm_qrow_bit_exact)
{
    static const struct { size_t n; uint32_t g; } shapes[] = {{64, 64}, {128, 64}, {96, 32}, {15, 3},
                                                             {21, 7}, {8, 1}, {256, 128}, {9, 9}};
    int ncase = 0;
    for (int bits = 4; bits <= 8; bits += 4)
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
            for (int kind = 0; kind < 4; kind++) {
                size_t n = shapes[si].n, ng = n / shapes[si].g, rb = ft_qrow_bytes(bits, n, shapes[si].g);
                float *x = ft_test_mixed(FT_F32, n, 31 * si + (uint64_t)kind + 1000 * (uint64_t)bits);
                if (kind == 1) for (size_t i = 0; i < n; i++) x[i] *= 1e-6f;          /* subnormal steps */
                if (kind == 2) for (size_t i = 0; i < n; i++) x[i] = x[i] * 900.0f;   /* large ranges */
                if (kind == 3) for (size_t i = 0; i < n; i++) x[i] = 3.25f;            /* constant */
                uint8_t *want = malloc(rb), *got = malloc(rb);
                float *par = malloc(2 * ng * sizeof(float));
                ft_status st = ft_qrow_encode(bits, x, n, shapes[si].g, want);
                int ok = 1;
                for (size_t j = 0; j < ng; j++) {
                    uint16_t h = 0, s = 0;
                    int r = km_qrow_group(bits, x + j * shapes[si].g, shapes[si].g, &h, &s, &par[2 * j], &par[2 * j + 1]);
                    if (r) ok = 0;
                    got[4 * j] = (uint8_t)h;
                    got[4 * j + 1] = (uint8_t)(h >> 8);
                    got[4 * j + 2] = (uint8_t)s;
                    got[4 * j + 3] = (uint8_t)(s >> 8);
                }
                CHECK_MSG(ok == (st == FT_OK), "bits %d n %zu kind %d: status %d", bits, n, kind, (int)st);
                if (ok && st == FT_OK) {
                    size_t nb = bits == 8 ? n : (n + 1) / 2;
                    for (size_t b = 0; b < nb; b++) got[4 * ng + b] = km_qrow_byte(bits, x, n, shapes[si].g, par, b);
                    char what[64];
                    snprintf(what, sizeof what, "qrow%d n %zu g %u kind %d", bits, n, shapes[si].g, kind);
                    CHECK(ut_same_bits(got, want, rb, what));
                    float *dw = malloc(n * 4), *dg = malloc(n * 4);
                    ft_qrow_decode(bits, want, n, shapes[si].g, dw);
                    for (size_t k = 0; k < n; k++) dg[k] = km_qrow_value(bits, want, n, shapes[si].g, k);
                    CHECK(ut_same_bits(dg, dw, n * 4, what));
                    free(dw);
                    free(dg);
                    ncase++;
                }
                free(want);
                free(got);
                free(par);
                ft_free_aligned(x);
            }
    printf("  %d rows compared\n", ncase);
    /* failures: a NaN (code 1, the CPU's FT_ERR_INVALID_ARG) and a range
     * fp16 cannot hold (code 2, FT_ERR_UNSUPPORTED) */
    float x[8] = {1, 2, 3, NAN, 5, 6, 7, 8}, y[8] = {-70000.0f, 1, 2, 3, 4, 5, 6, 7};
    uint16_t h, s;
    float a, b;
    uint8_t buf[64];
    CHECK(km_qrow_group(4, x, 8, &h, &s, &a, &b) == 1 && ft_qrow_encode(4, x, 8, 8, buf) == FT_ERR_INVALID_ARG);
    CHECK(km_qrow_group(8, y, 8, &h, &s, &a, &b) == 2 && ft_qrow_encode(8, y, 8, 8, buf) == FT_ERR_UNSUPPORTED);
}

/* The column-major GEMM parameters give y = x W^T (checked with cblas,
 * whose column-major interface has cuBLAS's semantics). */
TEST(hm_gemm_mapping)
{
    static const int dims[][3] = {{1, 5, 3}, {7, 16, 9}, {33, 64, 70}, {2, 1, 1}};
    uint64_t s = 7;
    for (size_t t = 0; t < sizeof dims / sizeof dims[0]; t++) {
        int rows = dims[t][0], in = dims[t][1], out = dims[t][2];
        float *x = malloc((size_t)rows * in * 4), *W = malloc((size_t)out * in * 4);
        float *want = malloc((size_t)rows * out * 4), *got = malloc((size_t)rows * out * 4);
        for (int i = 0; i < rows * in; i++) x[i] = ut_uniform(&s);
        for (int i = 0; i < out * in; i++) W[i] = ut_uniform(&s);
        for (int r = 0; r < rows; r++)
            for (int o = 0; o < out; o++) {
                double acc = 0;
                for (int i = 0; i < in; i++) acc += (double)x[r * in + i] * W[o * in + i];
                want[r * out + o] = (float)acc;
            }
        ft_cuda_gemm_dims d;
        ft_cuda_gemm_dims_for(rows, in, out, &d);
        cblas_sgemm(CblasColMajor, d.trans_a ? CblasTrans : CblasNoTrans, d.trans_b ? CblasTrans : CblasNoTrans,
                    d.m, d.n, d.k, 1.0f, W, d.lda, x, d.ldb, 0.0f, got, d.ldc);
        float md = 0;
        for (int i = 0; i < rows * out; i++) md = fmaxf(md, fabsf(got[i] - want[i]));
        CHECK_MSG(md < 1e-4f, "gemm %dx%dx%d: max diff %g", rows, in, out, md);
        free(x); free(W); free(want); free(got);
    }
}

/* The argmax kernel's reduction (per-thread strided scans, then a tree
 * over 256 partials) with km_argmax_better gives the sampler's greedy
 * choice: first index of the largest value, NaN never wins. */
static int emulate_argmax(const float *x, int V)
{
    float sv[256];
    int si[256];
    for (int t = 0; t < 256; t++) {
        float bv = -INFINITY;
        int bi = 0x7fffffff;
        for (int i = t; i < V; i += 256)
            if (km_argmax_better(x[i], i, bv, bi)) { bv = x[i]; bi = i; }
        sv[t] = bv;
        si[t] = bi;
    }
    for (int stride = 128; stride > 0; stride >>= 1)
        for (int t = 0; t < stride; t++)
            if (km_argmax_better(sv[t + stride], si[t + stride], sv[t], si[t])) {
                sv[t] = sv[t + stride];
                si[t] = si[t + stride];
            }
    return si[0] == 0x7fffffff ? 0 : si[0];
}

TEST(hm_argmax_rule)
{
    const int V = 1000;
    float *x = malloc(V * sizeof(float)), *y = malloc(V * sizeof(float));
    ft_sampler *smp = NULL;
    CHECK_OK(ft_sampler_create(V, &smp));
    REQUIRE(smp);
    ft_sampling sp = {0};
    uint64_t s = 3, rng = 1;
    for (int t = 0; t < 200; t++) {
        for (int i = 0; i < V; i++) x[i] = (float)(ft_test_rand(&s) % 7);   /* many ties */
        if (t % 3 == 0) for (int i = 0; i < V; i += 5) x[i] = NAN;
        if (t % 7 == 0) for (int i = 0; i < V; i++) x[i] = -INFINITY;
        if (t % 11 == 0) for (int i = 0; i < V; i++) x[i] = NAN;
        if (t % 13 == 0) x[V - 1] = 100.0f;
        memcpy(y, x, V * sizeof(float));
        int want = ft_sampler_sample(smp, &sp, y, NULL, 0, &rng);
        CHECK_MSG(emulate_argmax(x, V) == want, "row %d: %d vs %d", t, emulate_argmax(x, V), want);
    }
    ft_sampler_free(smp);
    free(x);
    free(y);
}
