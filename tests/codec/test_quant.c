/* q8/q4 group quantization: round trips with an element-wise error bound,
 * sizes, parameters, rejection of bad input, SIMD == scalar, corruption. */
#include "ft_test.h"
#include "support/synth.h"
#include "flextier/codec.h"
#include "codec/codec_internal.h"
#include "codec/quant_kern.h"

#include <math.h>

static size_t esz(ft_dtype dt) { return ft_dtype_bits(dt) / 8; }

typedef struct {
    uint32_t ndim;
    int64_t shape[4];
    int32_t gdim;
    uint32_t G;
} qcase;

/* Element-wise bound documented in docs/codec-quant.md. */
static double qbound(double x, double step, ft_dtype odt)
{
    double r = odt == FT_F32 ? 0.0 : odt == FT_BF16 ? ldexp(1, -8) : ldexp(1, -11);
    return step * (0.5 + ldexp(1, -14)) + (fabs(x) + step) * (ldexp(1, -23) + r) + ldexp(1, -24);
}

/* Encode, check sizes and parameters against the original, decode to odt
 * with ctx_dec and check every element. Returns the frame (caller frees). */
static uint8_t *run_case(ft_codec_ctx *ctx_enc, ft_codec_ctx *ctx_dec, ft_codec_id codec,
                         ft_dtype idt, ft_dtype odt, const qcase *qc, uint32_t chunk,
                         size_t *fs_out, int *ok)
{
    *ok = 0;
    ft_codec_params p;
    ft_codec_default_params(&p);
    p.codec = codec;
    p.group_size = qc->G;
    p.group_dim = qc->gdim;
    p.chunk_size = chunk;
    ft_tensor t;
    CHECK_OK(ft_tensor_init(&t, idt, qc->ndim, qc->shape, NULL));
    uint64_t n;
    ft_tensor_numel(&t, &n);
    t.data = ft_test_mixed(idt, n, n * 7 + qc->G * 131 + (uint64_t)idt);
    size_t bound = ft_encode_bound(&p, idt, qc->ndim, qc->shape), fs = 0;
    CHECK(bound > 0);
    uint8_t *frame = ft_malloc_aligned(bound + 64, 64);
    ft_status st = ft_encode(ctx_enc, &p, &t, frame, bound, &fs);
    CHECK_OK(st);
    uint8_t *out = ft_malloc_aligned(n * 4 + 64, 64);
    int good = st == FT_OK;
    ft_frame_info fi;
    if (good) {
        CHECK_OK(ft_frame_parse(frame, fs, &fi));
        good = fi.frame_size == fs;
    }
    if (good) {
        /* Geometry, computed here independently of the library. */
        int gd = qc->ndim ? (qc->gdim < 0 ? qc->gdim + (int)qc->ndim : qc->gdim) : 0;
        uint64_t outer = 1, D = 1, inner = 1;
        for (int i = 0; i < (int)qc->ndim; i++) {
            if (i < gd) outer *= (uint64_t)qc->shape[i];
            else if (i == gd) D = (uint64_t)qc->shape[i];
            else inner *= (uint64_t)qc->shape[i];
        }
        uint64_t G = qc->G, ng = (D + G - 1) / G;
        unsigned bits = codec == FT_CODEC_Q8 ? 8 : 4, B = (1u << bits) - 1;
        /* Size: 4 bytes per group + packed values per chunk. */
        uint64_t payload = 0, total_groups = n ? outer * ng * inner : 0, covered = 0;
        for (uint32_t c = 0; c < fi.n_chunks; c++) {
            ft_chunk_info ci;
            CHECK_OK(ft_frame_chunk(frame, fs, &fi, c, &ci));
            payload += ci.enc_size;
            CHECK(ci.elem_offset == covered);
            covered += ci.elem_count;
            uint64_t packed = bits == 8 ? ci.elem_count : (ci.elem_count + 1) / 2;
            /* groups in the chunk: its slabs times inner */
            uint64_t slabs = ci.elem_count / inner, gs = 0;
            (void)slabs;
            for (uint64_t e = ci.elem_offset; e < ci.elem_offset + ci.elem_count;) {
                uint64_t g = (e / inner) % D / G;
                uint64_t glen = D - g * G < G ? D - g * G : G;
                gs += inner;
                e += glen * inner;
            }
            CHECK(ci.enc_size == 4 * gs + packed);
        }
        CHECK(covered == n);
        uint64_t packed_min = bits == 8 ? n : (n + 1) / 2;
        CHECK(payload >= 4 * total_groups + packed_min && payload <= 4 * total_groups + packed_min + fi.n_chunks);
        CHECK(fs == fi.header_size + payload);

        ft_tensor d = {0};
        d.dtype = odt;
        d.data = out;
        st = ft_decode(ctx_dec, frame, fs, &d, n * esz(odt));
        CHECK_OK(st);
        good = st == FT_OK && d.ndim == qc->ndim && !memcmp(d.shape, qc->shape, qc->ndim * 8);
        CHECK(good);
        /* Per element: the stored parameters of its group bound the group
         * (min16 <= min, min16 + B*step16 >= max) and the error. */
        size_t bad = 0, badp = 0;
        for (uint32_t c = 0; good && c < fi.n_chunks; c++) {
            ft_chunk_info ci;
            ft_frame_chunk(frame, fs, &fi, c, &ci);
            uint64_t s0 = (ci.elem_offset / (D * inner)) * ng + (ci.elem_offset / inner) % D / G;
            const uint8_t *hdr = frame + ci.enc_offset;
            for (uint64_t e = ci.elem_offset; e < ci.elem_offset + ci.elem_count; e++) {
                uint64_t o = e / (D * inner), dd = (e / inner) % D, i = e % inner;
                uint64_t gi = (o * ng + dd / G - s0) * inner + i;
                const uint8_t *hp = hdr + 4 * gi;
                double mn = ft_f16_to_f32_1((uint16_t)(hp[0] | hp[1] << 8));
                double step = ft_f16_to_f32_1((uint16_t)(hp[2] | hp[3] << 8));
                double x = ft_test_load_f(idt, t.data, e), y = ft_test_load_f(odt, out, e);
                if (!(step >= 0 && mn <= x && mn + B * step >= x)) badp++;
                if (!(fabs(x - y) <= qbound(x, step, odt))) {
                    if (bad++ < 3)
                        fprintf(stderr, "  elem %llu: x=%.9g y=%.9g step=%g min=%g\n",
                                (unsigned long long)e, x, y, step, mn);
                }
            }
        }
        CHECK_MSG(bad == 0 && badp == 0, "%s %s->%s shape[%u]=%lld.. gdim %d G %u: %zu errors, %zu params",
                  ft_codec_name(codec), ft_dtype_name(idt), ft_dtype_name(odt), qc->ndim,
                  (long long)(qc->ndim ? qc->shape[0] : 0), qc->gdim, qc->G, bad, badp);
        *ok = good && !bad && !badp;
    }
    ft_free_aligned(out);
    ft_free_aligned(t.data);
    *fs_out = fs;
    return frame;
}

static const qcase cases[] = {
    {1, {0}, -1, 64}, {1, {1}, -1, 64}, {0, {0}, 0, 64}, {1, {1001}, -1, 64},
    {2, {0, 5}, 0, 7}, {2, {37, 129}, -1, 64}, {2, {37, 129}, -1, 7}, {2, {37, 129}, -1, 1},
    {2, {37, 129}, -1, 128}, {2, {37, 129}, -1, 500}, {2, {37, 129}, 0, 64}, {2, {37, 129}, 0, 7},
    {2, {129, 37}, 0, 1}, {3, {5, 33, 17}, 1, 7}, {3, {5, 33, 17}, 1, 64}, {3, {5, 33, 17}, 1, 1},
    {3, {3, 70, 600}, 1, 64}, {3, {2, 3, 1111}, 2, 128}, {2, {300, 40}, 0, 64},
};

TEST(quant_roundtrip_matrix)
{
    ft_codec_ctx *c1, *c3;
    CHECK_OK(ft_codec_ctx_create(1, &c1));
    CHECK_OK(ft_codec_ctx_create(3, &c3));
    static const ft_dtype dts[] = {FT_F32, FT_F16, FT_BF16};
    static const ft_codec_id codecs[] = {FT_CODEC_Q8, FT_CODEC_Q4};
    int failures = 0;
    for (size_t ci = 0; ci < 2; ci++)
        for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
            for (size_t a = 0; a < 3; a++)
                for (size_t b = 0; b < 3; b++) {
                    uint32_t chunk = (k + a + b) % 2 ? 4096 : FT_DEFAULT_CHUNK_SIZE;
                    size_t f1, f3;
                    int ok1, ok3;
                    uint8_t *fr1 = run_case(c1, c3, codecs[ci], dts[a], dts[b], &cases[k], chunk, &f1, &ok1);
                    uint8_t *fr3 = run_case(c3, c1, codecs[ci], dts[a], dts[b], &cases[k], chunk, &f3, &ok3);
                    /* thread count does not change the bytes */
                    CHECK(f1 == f3 && !memcmp(fr1, fr3, f1));
                    if (!ok1 || !ok3) failures++;
                    ft_free_aligned(fr1);
                    ft_free_aligned(fr3);
                }
    CHECK(failures == 0);
    ft_codec_ctx_free(c1);
    ft_codec_ctx_free(c3);
}

TEST(quant_q4_size_ratio)
{
    /* bf16, group 64 along the last dim: 36 bytes per 64 values. */
    int64_t shape[2] = {256, 4096};
    ft_codec_params p;
    ft_codec_default_params(&p);
    p.codec = FT_CODEC_Q4;
    size_t bound = ft_encode_bound(&p, FT_BF16, 2, shape);
    uint64_t n = 256 * 4096;
    ft_tensor t;
    ft_tensor_init(&t, FT_BF16, 2, shape, ft_test_mixed(FT_BF16, n, 5));
    uint8_t *frame = ft_malloc_aligned(bound, 64);
    ft_codec_ctx *ctx;
    CHECK_OK(ft_codec_ctx_create(1, &ctx));
    size_t fs = 0;
    CHECK_OK(ft_encode(ctx, &p, &t, frame, bound, &fs));
    ft_frame_info fi;
    CHECK_OK(ft_frame_parse(frame, fs, &fi));
    CHECK(fs - fi.header_size == n / 64 * 36);
    double ratio = (double)(n * 2) / (double)fs;
    CHECK_MSG(ratio >= 3.55, "ratio %.4f", ratio);
    /* q8: 68 bytes per 64 */
    p.codec = FT_CODEC_Q8;
    bound = ft_encode_bound(&p, FT_BF16, 2, shape);
    ft_free_aligned(frame);
    frame = ft_malloc_aligned(bound, 64);
    CHECK_OK(ft_encode(ctx, &p, &t, frame, bound, &fs));
    CHECK_OK(ft_frame_parse(frame, fs, &fi));
    CHECK(fs - fi.header_size == n / 64 * 68);
    ft_free_aligned(frame);
    ft_free_aligned(t.data);
    ft_codec_ctx_free(ctx);
}

TEST(quant_params)
{
    uint16_t h, s;
    /* exact fp16 constant: step 0, decodes exactly */
    CHECK_OK(ft_qparams(3.0f, 3.0f, 15, &h, &s));
    CHECK(ft_f16_to_f32_1(h) == 3.0f && s == 0);
    CHECK_OK(ft_qparams(-0.0f, 0.0f, 15, &h, &s));
    CHECK(h == 0 && s == 0);
    /* min rounds down, step up, and cover the range */
    uint64_t seed = 99;
    for (int it = 0; it < 20000; it++) {
        float a = ldexpf((float)(ft_test_rand(&seed) >> 40) / (float)(1 << 24) - 0.5f,
                         (int)(ft_test_rand(&seed) % 30) - 20);
        float b = a + ldexpf((float)(ft_test_rand(&seed) >> 40) / (float)(1 << 24),
                             (int)(ft_test_rand(&seed) % 30) - 25);
        if (it % 7 == 0) b = a;
        unsigned B = it % 2 ? 15 : 255;
        CHECK_OK(ft_qparams(a, b, B, &h, &s));
        double m16 = ft_f16_to_f32_1(h), s16 = ft_f16_to_f32_1(s);
        CHECK(m16 <= a && m16 + B * s16 >= b && s16 >= 0);
        /* tight: the next fp16 min up exceeds a, the previous step fails */
        if (h != 0 && h != 0x8000) {
            uint16_t up = (h & 0x8000) ? (uint16_t)(h - 1) : (uint16_t)(h + 1);
            CHECK(ft_f16_to_f32_1(up) > a);
        }
        if (s > 0) CHECK(m16 + B * (double)ft_f16_to_f32_1((uint16_t)(s - 1)) < b);
    }
    CHECK(ft_qparams(-70000.0f, 0.0f, 15, &h, &s) == FT_ERR_UNSUPPORTED);
    CHECK(ft_qparams(0.0f, 65504.0f * 16, 15, &h, &s) == FT_ERR_UNSUPPORTED);
    CHECK_OK(ft_qparams(-65504.0f, 65504.0f, 15, &h, &s));
}

static ft_status encode_vals(ft_codec_id codec, const float *v, size_t n, int32_t gdim,
                             uint8_t **frame, size_t *fs)
{
    ft_codec_ctx *ctx;
    ft_status st = ft_codec_ctx_create(1, &ctx);
    if (st) return st;
    ft_codec_params p;
    ft_codec_default_params(&p);
    p.codec = codec;
    p.group_dim = gdim;
    int64_t shape[2] = {(int64_t)(n / 4), 4};
    ft_tensor t;
    ft_tensor_init(&t, FT_F32, 2, shape, (void *)v);
    size_t bound = ft_encode_bound(&p, FT_F32, 2, shape);
    *frame = ft_malloc_aligned(bound + 64, 64);
    st = ft_encode(ctx, &p, &t, *frame, bound, fs);
    ft_codec_ctx_free(ctx);
    return st;
}

TEST(quant_constant_groups)
{
    static const float consts[] = {0.0f, 3.0f, -7.5f, 0.1f, 1e-7f, -65504.0f, 1234.567f};
    for (size_t c = 0; c < sizeof consts / sizeof consts[0]; c++)
        for (int codec = FT_CODEC_Q8; codec <= FT_CODEC_Q4; codec++) {
            float v[256];
            for (int i = 0; i < 256; i++) v[i] = consts[c];
            uint8_t *frame;
            size_t fs;
            CHECK_OK(encode_vals((ft_codec_id)codec, v, 256, -1, &frame, &fs));
            ft_codec_ctx *ctx;
            ft_codec_ctx_create(1, &ctx);
            ft_tensor d = {0};
            float out[256];
            d.dtype = FT_F32;
            d.data = out;
            CHECK_OK(ft_decode(ctx, frame, fs, &d, sizeof out));
            float h = ft_f16_to_f32_1(ft_f32_to_f16_1(consts[c]));
            int exact = h == consts[c];
            for (int i = 0; i < 256; i++) {
                if (exact) CHECK(out[i] == consts[c]);
                else CHECK(fabs(out[i] - consts[c]) <= qbound(consts[c], fabs(consts[c]) * 1e-3 + 1e-7, FT_F32));
            }
            ft_codec_ctx_free(ctx);
            ft_free_aligned(frame);
        }
}

/* Empty tensors whose dims after group_dim hold a zero (empty slabs):
 * bound, encode and decode without dividing by zero. */
TEST(quant_empty_slabs)
{
    ft_codec_ctx *ctx;
    CHECK_OK(ft_codec_ctx_create(1, &ctx));
    static const int64_t shapes[][3] = {{4, 0, 3}, {0, 0, 0}, {5, 7, 0}};
    for (int c = 0; c < 3; c++)
        for (int q = FT_CODEC_Q8; q <= FT_CODEC_Q4; q++) {
            ft_codec_params p;
            ft_codec_default_params(&p);
            p.codec = (ft_codec_id)q;
            p.group_dim = 0;
            size_t bound = ft_encode_bound(&p, FT_BF16, 3, shapes[c]);
            CHECK(bound > 0);
            uint8_t *f = ft_malloc_aligned(bound + 64, 64);
            uint16_t dummy = 0;
            ft_tensor t;
            ft_tensor_init(&t, FT_BF16, 3, shapes[c], &dummy);
            size_t fs = 0;
            CHECK_OK(ft_encode(ctx, &p, &t, f, bound, &fs));
            ft_tensor d = {0};
            d.dtype = FT_F32;
            d.data = &dummy;
            CHECK_OK(ft_decode(ctx, f, fs, &d, 0));
            CHECK(d.ndim == 3 && d.shape[1] == shapes[c][1]);
            ft_free_aligned(f);
        }
    ft_codec_ctx_free(ctx);
}

TEST(quant_rejects_nonfinite_and_range)
{
    float v[200];
    for (int i = 0; i < 200; i++) v[i] = (float)i * 0.01f;
    uint8_t *frame;
    size_t fs;
    static const float bads[] = {NAN, INFINITY, -INFINITY};
    for (int b = 0; b < 3; b++)
        for (int gdim = -1; gdim <= 0; gdim++)
            for (int codec = FT_CODEC_Q8; codec <= FT_CODEC_Q4; codec++) {
                v[123] = bads[b];
                CHECK(encode_vals((ft_codec_id)codec, v, 200, gdim, &frame, &fs) == FT_ERR_INVALID_ARG);
                CHECK_MSG(strstr(ft_last_error(), "element 123") != NULL, "%s", ft_last_error());
                ft_free_aligned(frame);
            }
    v[123] = 1.0f;
    v[50] = 1e6f;   /* (max - min)/15 > 65504 */
    CHECK(encode_vals(FT_CODEC_Q4, v, 200, -1, &frame, &fs) == FT_ERR_UNSUPPORTED);
    CHECK(strstr(ft_last_error(), "fp16") != NULL);
    ft_free_aligned(frame);
    v[50] = -70000.0f;   /* min beyond fp16 */
    CHECK(encode_vals(FT_CODEC_Q8, v, 200, 0, &frame, &fs) == FT_ERR_UNSUPPORTED);
    ft_free_aligned(frame);
    v[50] = 1e6f;   /* q8: 1e6/255 = 3922: fine */
    CHECK_OK(encode_vals(FT_CODEC_Q8, v, 200, -1, &frame, &fs));
    ft_free_aligned(frame);
}

/* ------------------------------------------------ SIMD == scalar reference */

static void compare_kernels(const ft_qkern *S, const ft_qkern *R)
{
    enum { N = 300 };
    uint64_t seed = 7;
    uint8_t packed[N], pk_s[N], pk_r[N], hdr[4 * N];
    float mn[N], st[N], inv[N], xf[N];
    uint16_t xh[N], xb[N];
    uint8_t out_s[N * 4], out_r[N * 4];
    for (int it = 0; it < 600; it++) {
        int fin = 1;
        for (int i = 0; i < N; i++) {
            packed[i] = (uint8_t)ft_test_rand(&seed);
            uint16_t hm = (uint16_t)ft_test_rand(&seed), hs = (uint16_t)ft_test_rand(&seed);
            if (it % 3) {  /* mostly sane parameters */
                hm = ft_f32_to_f16_1(((float)(ft_test_rand(&seed) % 2001) - 1000.0f) * 1e-3f);
                hs = ft_f32_to_f16_1((float)(ft_test_rand(&seed) % 1000) * 1e-4f);
                if (it % 5 == 0) hs = (uint16_t)(ft_test_rand(&seed) % 64);  /* subnormal steps */
                if (it % 7 == 0) hm = (uint16_t)(ft_test_rand(&seed) % 8 | (i % 2 ? 0x8000 : 0));
            }
            hdr[4 * i] = (uint8_t)hm; hdr[4 * i + 1] = (uint8_t)(hm >> 8);
            hdr[4 * i + 2] = (uint8_t)hs; hdr[4 * i + 3] = (uint8_t)(hs >> 8);
            mn[i] = ft_f16_to_f32_1(hm);
            st[i] = ft_f16_to_f32_1(hs);
            fin &= isfinite(mn[i]) && isfinite(st[i]);
            inv[i] = st[i] > 0 && isfinite(st[i]) ? 1.0f / st[i] : 0.0f;
            float m = isfinite(mn[i]) ? mn[i] : (float)(i % 3);
            xf[i] = m + (float)(ft_test_rand(&seed) % 4000) * 0.01f * (st[i] > 0 && isfinite(st[i]) ? st[i] : 1.0f) - 0.5f * (isfinite(st[i]) ? st[i] : 0.0f);
            if (!isfinite(xf[i])) xf[i] = 0.0f;
            xh[i] = ft_f32_to_f16_1(xf[i]);
            xb[i] = ft_f32_to_bf16_1(xf[i]);
        }
        size_t n = ft_test_rand(&seed) % 200;
        uint64_t k = ft_test_rand(&seed) % 64;
        int bits = it % 2 ? 4 : 8;
        for (int o = 0; o < 3; o++) {
            ft_dtype odt = o == 0 ? FT_F32 : o == 1 ? FT_BF16 : FT_F16;
            memset(out_s, 0xcd, sizeof out_s);
            memset(out_r, 0xcd, sizeof out_r);
            S->dec_bcast(bits, odt, packed, k, n, mn[0], st[0], out_s);
            R->dec_bcast(bits, odt, packed, k, n, mn[0], st[0], out_r);
            CHECK_MSG(!memcmp(out_s, out_r, sizeof out_s), "%s dec_bcast q%d %s n=%zu k=%llu", S->name,
                      bits, ft_dtype_name(odt), n, (unsigned long long)k);
            S->dec_vec(bits, odt, packed, k, n, mn, st, fin, out_s);
            R->dec_vec(bits, odt, packed, k, n, mn, st, fin, out_r);
            CHECK_MSG(!memcmp(out_s, out_r, sizeof out_s), "%s dec_vec q%d %s n=%zu k=%llu", S->name,
                      bits, ft_dtype_name(odt), n, (unsigned long long)k);
            S->dec_vec(bits, odt, packed, k, n, mn, st, 0, out_s);
            CHECK(!memcmp(out_s, out_r, sizeof out_s));
            size_t g = 1 + ft_test_rand(&seed) % (it % 4 ? 70 : 5);
            if (it % 8 == 0) g = 64;
            size_t ng = (N - 64) / g < 4 ? (N - 64) / g : 4;   /* k + ng*g <= N values */
            S->dec_groups(bits, odt, hdr, packed, k, ng, g, out_s);
            R->dec_groups(bits, odt, hdr, packed, k, ng, g, out_r);
            CHECK_MSG(!memcmp(out_s, out_r, sizeof out_s), "%s dec_groups q%d %s g=%zu k=%llu",
                      S->name, bits, ft_dtype_name(odt), g, (unsigned long long)k);
        }
        for (int a = 0; a < 3; a++) {
            ft_dtype idt = a == 0 ? FT_F32 : a == 1 ? FT_BF16 : FT_F16;
            const void *x = a == 0 ? (const void *)xf : a == 1 ? (const void *)xb : (const void *)xh;
            float m1 = INFINITY, M1 = -INFINITY, m2 = INFINITY, M2 = -INFINITY;
            int r1 = S->minmax(idt, x, n, &m1, &M1), r2 = R->minmax(idt, x, n, &m2, &M2);
            CHECK(r1 == r2 && (r1 || (m1 == m2 && M1 == M2)));
            if (a != 2) CHECK(r1 == 0);   /* f16 may overflow to Inf */
            float vm1[N], vM1[N], vm2[N], vM2[N];
            for (int i = 0; i < N; i++) { vm1[i] = vm2[i] = xf[N - 1 - i]; vM1[i] = vM2[i] = xf[N - 1 - i] + 1.0f; }
            r1 = S->minmax_vec(idt, x, n, vm1, vM1);
            r2 = R->minmax_vec(idt, x, n, vm2, vM2);
            CHECK(r1 == r2 && (r1 || (!memcmp(vm1, vm2, sizeof vm1) && !memcmp(vM1, vM2, sizeof vM1))));
            memset(pk_s, 0x5a, sizeof pk_s);
            memset(pk_r, 0x5a, sizeof pk_r);
            float m0 = isfinite(mn[0]) ? mn[0] : 0.0f;
            S->enc_bcast(bits, idt, x, n, m0, inv[0], pk_s, k);
            R->enc_bcast(bits, idt, x, n, m0, inv[0], pk_r, k);
            CHECK_MSG(!memcmp(pk_s, pk_r, sizeof pk_s), "%s enc_bcast q%d %s n=%zu k=%llu", S->name,
                      bits, ft_dtype_name(idt), n, (unsigned long long)k);
            if (fin) {
                S->enc_vec(bits, idt, x, n, mn, inv, pk_s, k);
                R->enc_vec(bits, idt, x, n, mn, inv, pk_r, k);
                CHECK_MSG(!memcmp(pk_s, pk_r, sizeof pk_s), "%s enc_vec q%d %s n=%zu k=%llu", S->name,
                          bits, ft_dtype_name(idt), n, (unsigned long long)k);
            }
        }
    }
    /* non-finite detection agrees, wherever the bad value is */
    for (int pos = 0; pos < 40; pos++) {
        float x[40];
        for (int i = 0; i < 40; i++) x[i] = (float)i;
        x[pos] = pos % 2 ? NAN : -INFINITY;
        float a = INFINITY, b = -INFINITY, va[40], vb[40];
        for (int i = 0; i < 40; i++) { va[i] = INFINITY; vb[i] = -INFINITY; }
        CHECK(S->minmax(FT_F32, x, 40, &a, &b) != 0);
        CHECK(S->minmax_vec(FT_F32, x, 40, va, vb) != 0);
        CHECK(R->minmax(FT_F32, x, 40, &a, &b) != 0);
    }
}

TEST(quant_simd_equals_ref)
{
    const ft_qkern *R = ft_qkern_list(0);
    REQUIRE(R == ft_qkern_ref());
    int n = 0;
    for (int i = 1; ft_qkern_list(i); i++, n++) compare_kernels(ft_qkern_list(i), R);
    printf("  compared %d SIMD kernel tables with the scalar ones\n", n);
}

/* Whole frames: every kernel table produces the same frame bytes and the
 * same decoded bytes as the scalar one; streaming ft_decode_chunk equals
 * ft_decode. */
TEST(quant_tables_same_frames)
{
    ft_codec_ctx *ctx;
    CHECK_OK(ft_codec_ctx_create(1, &ctx));
    static const qcase fc[] = {
        {2, {37, 129}, -1, 64}, {2, {37, 129}, -1, 7}, {2, {37, 129}, 0, 64},
        {3, {5, 33, 17}, 1, 7}, {3, {3, 70, 600}, 1, 64}, {2, {16, 4096}, -1, 64},
        {2, {64, 1000}, 0, 64}, {1, {1001}, -1, 1},
    };
    static const ft_dtype dts[] = {FT_F32, FT_F16, FT_BF16};
    for (size_t c = 0; c < sizeof fc / sizeof fc[0]; c++)
        for (int codec = FT_CODEC_Q8; codec <= FT_CODEC_Q4; codec++)
            for (int a = 0; a < 3; a++) {
                ft_codec_params p;
                ft_codec_default_params(&p);
                p.codec = (ft_codec_id)codec;
                p.group_size = fc[c].G;
                p.group_dim = fc[c].gdim;
                p.chunk_size = 4096 * (1 + (uint32_t)(c % 3));
                ft_tensor t;
                ft_tensor_init(&t, dts[a], fc[c].ndim, fc[c].shape, NULL);
                uint64_t n;
                ft_tensor_numel(&t, &n);
                t.data = ft_test_mixed(dts[a], n, c * 3 + (uint64_t)a);
                size_t bound = ft_encode_bound(&p, dts[a], fc[c].ndim, fc[c].shape);
                uint8_t *ref = ft_malloc_aligned(bound, 64), *fr = ft_malloc_aligned(bound, 64);
                uint8_t *dref = ft_malloc_aligned(n * 4 * 3, 64), *dd = ft_malloc_aligned(n * 4 * 3, 64);
                size_t fs_ref = 0, fs = 0;
                memset(dref, 0, n * 4 * 3);
                memset(dd, 0, n * 4 * 3);
                for (int ki = 0; ft_qkern_list(ki); ki++) {
                    ft_qkern_override(ft_qkern_list(ki));
                    uint8_t *f = ki ? fr : ref, *d = ki ? dd : dref;
                    size_t *pfs = ki ? &fs : &fs_ref;
                    CHECK_OK(ft_encode(ctx, &p, &t, f, bound, pfs));
                    for (int o = 0; o < 3; o++) {
                        ft_tensor out = {0};
                        out.dtype = dts[o];
                        out.data = d + o * n * 4;
                        CHECK_OK(ft_decode(ctx, f, *pfs, &out, n * 4));
                    }
                    if (ki) {
                        CHECK_MSG(fs == fs_ref && !memcmp(fr, ref, fs), "%s: frame differs (case %zu)",
                                  ft_qkern_list(ki)->name, c);
                        CHECK_MSG(!memcmp(dd, dref, n * 4 * 3), "%s: decode differs (case %zu)",
                                  ft_qkern_list(ki)->name, c);
                    }
                }
                ft_qkern_override(NULL);
                /* streaming: chunk by chunk into bf16 */
                ft_frame_info fi;
                CHECK_OK(ft_frame_parse(ref, fs_ref, &fi));
                uint16_t *sb = ft_malloc_aligned(n * 2 + 64, 64);
                for (uint32_t i = 0; i < fi.n_chunks; i++) {
                    ft_chunk_info ci;
                    CHECK_OK(ft_frame_chunk(ref, fs_ref, &fi, i, &ci));
                    CHECK_OK(ft_decode_chunk(ctx, &fi, &ci, ref + ci.enc_offset, FT_BF16,
                                             sb + ci.elem_offset, ci.elem_count * 2, 0));
                    /* a chunk descriptor that is not slab-aligned is refused */
                    ft_chunk_info bad = ci;
                    bad.elem_offset += 1;
                    CHECK(ft_decode_chunk(ctx, &fi, &bad, ref + ci.enc_offset, FT_BF16, sb,
                                          ci.elem_count * 2, 0) != FT_OK);
                }
                CHECK(!memcmp(sb, dref + 2 * n * 4, n * 2));
                ft_free_aligned(sb);
                ft_free_aligned(ref);
                ft_free_aligned(fr);
                ft_free_aligned(dref);
                ft_free_aligned(dd);
                ft_free_aligned(t.data);
            }
    ft_codec_ctx_free(ctx);
}

/* The q4 nibble write contract: runs written in any order give the same
 * bytes (used for inner > 1 column blocks). */
TEST(quant_q4_runs_any_order)
{
    const ft_qkern *K = ft_qkern_best();
    float x[100], mn[100], inv[100];
    for (int i = 0; i < 100; i++) { x[i] = (float)(i % 16); mn[i] = 0.0f; inv[i] = 1.0f; }
    uint8_t a[50], b[50];
    memset(a, 0, 50);
    memset(b, 0xff, 50);
    K->enc_vec(4, FT_F32, x, 100, mn, inv, a, 0);
    K->enc_vec(4, FT_F32, x + 61, 39, mn, inv, b, 61);
    K->enc_vec(4, FT_F32, x + 17, 44, mn, inv, b, 17);
    K->enc_vec(4, FT_F32, x, 17, mn, inv, b, 0);
    CHECK(!memcmp(a, b, 50));
    for (int i = 0; i < 100; i++) CHECK(((a[i / 2] >> (4 * (i % 2))) & 15) == i % 16);
}

TEST(quant_corruption_rejected)
{
    ft_codec_ctx *ctx;
    CHECK_OK(ft_codec_ctx_create(1, &ctx));
    for (int gdim = -1; gdim <= 0; gdim++) {
        int64_t shape[2] = {9, 77};
        ft_tensor t;
        ft_tensor_init(&t, FT_BF16, 2, shape, ft_test_mixed(FT_BF16, 9 * 77, 3));
        ft_codec_params p;
        ft_codec_default_params(&p);
        p.codec = FT_CODEC_Q4;
        p.group_size = 16;
        p.group_dim = gdim;
        p.chunk_size = 4096;
        size_t bound = ft_encode_bound(&p, FT_BF16, 2, shape), fs;
        uint8_t *frame = malloc(bound);
        CHECK_OK(ft_encode(ctx, &p, &t, frame, bound, &fs));
        uint8_t out[9 * 77 * 4];
        ft_tensor d = {0};
        d.dtype = FT_F32;
        d.data = out;
        CHECK_OK(ft_decode(ctx, frame, fs, &d, sizeof out));
        size_t accepted = 0;
        for (size_t bit = 0; bit < fs * 8; bit++) {
            frame[bit / 8] ^= (uint8_t)(1u << (bit % 8));
            ft_status st = ft_decode(ctx, frame, fs, &d, sizeof out);
            if (st == FT_OK) accepted++;
            else CHECK(st == FT_ERR_CORRUPT || st == FT_ERR_UNSUPPORTED);
            frame[bit / 8] ^= (uint8_t)(1u << (bit % 8));
        }
        CHECK_MSG(accepted == 0, "%zu bit flips accepted", accepted);
        for (size_t len = 0; len < fs; len += (len < 100 ? 1 : 37)) {
            uint8_t *cut = malloc(len ? len : 1);
            memcpy(cut, frame, len);
            CHECK(ft_decode(ctx, cut, len, &d, sizeof out) == FT_ERR_CORRUPT);
            free(cut);
        }
        free(frame);
        ft_free_aligned(t.data);
    }
    ft_codec_ctx_free(ctx);
}

/* Hostile but hash-consistent payload: NaN/Inf parameters decode to
 * NaN/Inf (no UB), a wrong size or a set pad nibble is rejected. */
TEST(quant_hostile_payload)
{
    int64_t shape[1] = {33};
    ft_frame_info fi;
    memset(&fi, 0, sizeof fi);
    fi.codec = FT_CODEC_Q4;
    fi.dtype = FT_F32;
    fi.ndim = 1;
    fi.shape[0] = 33;
    fi.chunk_size = 4096;
    fi.group_size = 64;
    fi.group_dim = 0;
    ft_layout L;
    CHECK_OK(ft_layout_compute(&fi, &L));
    (void)shape;
    size_t sz = ft_quant_chunk_size(&fi, &L, 0, 33);
    CHECK(sz == 4 + 17);
    uint8_t pay[21];
    memset(pay, 0x11, sizeof pay);
    pay[0] = 0x00; pay[1] = 0x7e;   /* min = NaN */
    pay[2] = 0x00; pay[3] = 0x7c;   /* step = +Inf */
    pay[20] = 0x01;                 /* pad nibble zero */
    float out[33];
    CHECK_OK(ft_quant_decode_chunk(&fi, &L, 0, 33, pay, sz, FT_F32, out));
    for (int i = 0; i < 33; i++) CHECK(isnan(out[i]));
    pay[0] = 0; pay[1] = 0;          /* min 0, step Inf: Inf or NaN (q = 0) */
    uint16_t ob[33];
    CHECK_OK(ft_quant_decode_chunk(&fi, &L, 0, 33, pay, sz, FT_BF16, ob));
    CHECK(ob[1] == 0x7f80);
    pay[20] = 0x11;
    CHECK(ft_quant_decode_chunk(&fi, &L, 0, 33, pay, sz, FT_F32, out) == FT_ERR_CORRUPT);
    pay[20] = 0x01;
    CHECK(ft_quant_decode_chunk(&fi, &L, 0, 33, pay, sz - 1, FT_F32, out) == FT_ERR_CORRUPT);
    CHECK(ft_quant_decode_chunk(&fi, &L, 1, 32, pay, sz, FT_F32, out) == FT_ERR_CORRUPT);
    CHECK(ft_quant_decode_chunk(&fi, &L, 0, 33, pay, sz, FT_I32, out) == FT_ERR_UNSUPPORTED);
}

/* Row quantization (the KV cache's): the same values as a frame of one row
 * with the same group, for q8 and q4 and several row lengths. */
TEST(quant_rows_equal_frames)
{
    ft_codec_ctx *cx;
    REQUIRE(ft_codec_ctx_create(1, &cx) == FT_OK);
    const size_t lens[] = {64, 128, 1024, 96, 7 * 32};
    const uint32_t groups[] = {64, 64, 64, 32, 32};
    for (int b = 0; b < 2; b++) {
        int bits = b ? 4 : 8;
        for (size_t t = 0; t < sizeof lens / sizeof lens[0]; t++) {
            size_t n = lens[t];
            uint32_t g = groups[t];
            float *x = ft_test_mixed(FT_F32, n, 77 + t);
            size_t rb = ft_qrow_bytes(bits, n, g);
            CHECK(rb == 4 * (n / g) + (bits == 8 ? n : n / 2));
            uint8_t *row = malloc(rb);
            float *y = malloc(n * 4), *z = malloc(n * 4);
            CHECK_OK(ft_qrow_encode(bits, x, n, g, row));
            ft_qrow_decode(bits, row, n, g, y);
            ft_codec_params p;
            ft_codec_default_params(&p);
            p.codec = bits == 8 ? FT_CODEC_Q8 : FT_CODEC_Q4;
            p.group_size = g;
            ft_tensor src = {FT_F32, 2, {1, (int64_t)n}, x};
            size_t cap = ft_encode_bound(&p, FT_F32, 2, src.shape), fsz;
            void *fr = malloc(cap);
            CHECK_OK(ft_encode(cx, &p, &src, fr, cap, &fsz));
            ft_tensor dst = {FT_F32, 0, {0}, z};
            CHECK_OK(ft_decode(cx, fr, fsz, &dst, n * 4));
            CHECK(memcmp(y, z, n * 4) == 0);
            free(fr); free(row); free(y); free(z);
            ft_free_aligned(x);
        }
    }
    float bad[64] = {0};
    uint8_t out[64 * 2];
    CHECK(ft_qrow_bytes(4, 65, 64) == 0);
    CHECK(ft_qrow_bytes(5, 64, 64) == 0);
    CHECK(ft_qrow_encode(4, bad, 65, 64, out) == FT_ERR_INVALID_ARG);
    bad[3] = NAN;
    CHECK(ft_qrow_encode(4, bad, 64, 64, out) == FT_ERR_INVALID_ARG);
    bad[3] = 1e6f;
    CHECK(ft_qrow_encode(4, bad, 64, 64, out) == FT_ERR_UNSUPPORTED);
    ft_codec_ctx_free(cx);
}
