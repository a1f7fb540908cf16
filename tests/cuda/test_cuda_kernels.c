/* Every compute kernel of the CUDA forward pass (src/cuda/forward.cu)
 * against its CPU reference (src/engine/kernels.c ft_k_*_ref and the
 * loops of forward.c), on odd sizes, with explicit tolerances:
 *   exact (bit for bit): embedding gather (f32 and bf16 tables), learned
 *     positions, KV append, gather rows, ReLU, bias and residual adds,
 *     argmax;
 *   |d| <= 2e-6 * (1 + |ref|): RoPE (only an fma contraction differs);
 *   |d| <= 1e-5 * (1 + |ref|): RMSNorm, LayerNorm (tree vs sequential
 *     sums), SiLU*up (device expf within 2 ulp);
 *   |d| <= 2e-5 * (1 + max|ref|) per row: attention (online softmax over
 *     tiles of 128 positions vs the CPU's normalize-first softmax).
 * Skipped (exit 77) without a device. */
#include "cuda_test_util.h"
#include "cuda/cuda_internal.h"
#include "engine/kernels.h"

CUDA_TEST_REQUIRE_DEVICE

static void *dev_copy(const void *h, size_t bytes)
{
    void *d = NULL;
    if (ft_cuda_malloc(bytes, &d) != FT_OK) return NULL;
    if (h && ft_cuda_copy_to_device(d, h, bytes) != FT_OK) { ft_cuda_free(d); return NULL; }
    return d;
}

static int sync_ok(cudaError_t launch, const char *what)
{
    if (ft_cuda_status(launch, what) != FT_OK) { fprintf(stderr, "  %s\n", ft_last_error()); return 0; }
    if (ft_cuda_status(cudaDeviceSynchronize(), what) != FT_OK) { fprintf(stderr, "  %s\n", ft_last_error()); return 0; }
    return 1;
}

static float *rand_f(size_t n, uint64_t seed, float scale)
{
    float *p = malloc(n * sizeof(float) + 16);
    uint64_t s = seed;
    for (size_t i = 0; i < n; i++) p[i] = ut_uniform(&s) * scale;
    return p;
}

/* max over i of |a - b| / (1 + |b|) */
static float rel_err(const float *a, const float *b, size_t n)
{
    float m = 0;
    for (size_t i = 0; i < n; i++) {
        float d = fabsf(a[i] - b[i]) / (1.0f + fabsf(b[i]));
        if (!(d <= m)) m = d;      /* NaN propagates */
    }
    return m;
}

static const int row_sizes[] = {1, 7, 64, 100, 288, 1000, 4096};
#define NSIZES (int)(sizeof row_sizes / sizeof row_sizes[0])

TEST(k_rmsnorm)
{
    for (int si = 0; si < NSIZES; si++)
        for (int wmode = 0; wmode < 2; wmode++)
            for (int inplace = 0; inplace < 2; inplace++) {
                int n = row_sizes[si], rows = 5;
                float *x = rand_f((size_t)rows * n, (uint64_t)n, 3.0f), *w = rand_f((size_t)n, 7, 1.5f);
                float *want = malloc((size_t)rows * n * 4), *got = malloc((size_t)rows * n * 4);
                for (int r = 0; r < rows; r++)
                    ft_k_rmsnorm_ref(want + (size_t)r * n, x + (size_t)r * n, wmode ? w : NULL, n, 1e-5f);
                float *dx = dev_copy(x, (size_t)rows * n * 4), *dw = dev_copy(w, (size_t)n * 4);
                float *dout = inplace ? dx : dev_copy(NULL, (size_t)rows * n * 4);
                CHECK(sync_ok(ftk_rmsnorm(dout, dx, wmode ? dw : NULL, rows, n, 1e-5f, 0), "rmsnorm"));
                CHECK_OK(ft_cuda_copy_to_host(got, dout, (size_t)rows * n * 4));
                float e = rel_err(got, want, (size_t)rows * n);
                CHECK_MSG(e <= 1e-5f, "rmsnorm n %d w %d inplace %d: rel err %g", n, wmode, inplace, e);
                ft_cuda_free(dx);
                ft_cuda_free(dw);
                if (!inplace) ft_cuda_free(dout);
                free(x); free(w); free(want); free(got);
            }
}

TEST(k_layernorm)
{
    for (int si = 0; si < NSIZES; si++)
        for (int wmode = 0; wmode < 3; wmode++)   /* no affine, weight only, weight + bias */
            for (int inplace = 0; inplace < 2; inplace++) {
                int n = row_sizes[si], rows = 4;
                float *x = rand_f((size_t)rows * n, (uint64_t)n + 3, 2.0f);
                for (int i = 0; i < rows * n; i++) x[i] += 0.75f;      /* a mean to remove */
                float *w = rand_f((size_t)n, 9, 1.5f), *b = rand_f((size_t)n, 10, 0.5f);
                const float *hw = wmode >= 1 ? w : NULL, *hb = wmode == 2 ? b : NULL;
                float *want = malloc((size_t)rows * n * 4), *got = malloc((size_t)rows * n * 4);
                for (int r = 0; r < rows; r++)
                    ft_k_layernorm_ref(want + (size_t)r * n, x + (size_t)r * n, hw, hb, n, 1e-5f);
                float *dx = dev_copy(x, (size_t)rows * n * 4), *dw = dev_copy(w, (size_t)n * 4);
                float *db = dev_copy(b, (size_t)n * 4);
                float *dout = inplace ? dx : dev_copy(NULL, (size_t)rows * n * 4);
                CHECK(sync_ok(ftk_layernorm(dout, dx, hw ? dw : NULL, hb ? db : NULL, rows, n, 1e-5f, 0), "layernorm"));
                CHECK_OK(ft_cuda_copy_to_host(got, dout, (size_t)rows * n * 4));
                float e = rel_err(got, want, (size_t)rows * n);
                CHECK_MSG(e <= 1e-5f, "layernorm n %d mode %d inplace %d: rel err %g", n, wmode, inplace, e);
                ft_cuda_free(dx); ft_cuda_free(dw); ft_cuda_free(db);
                if (!inplace) ft_cuda_free(dout);
                free(x); free(w); free(b); free(want); free(got);
            }
}

TEST(k_rope)
{
    static const int hds[] = {2, 16, 64, 80, 128};
    for (int hi = 0; hi < 5; hi++) {
        int hd = hds[hi], half = hd / 2, nh = 6, rows = 9, S = 50, ld = nh * hd + 8;   /* padded stride */
        float *x = rand_f((size_t)rows * ld, (uint64_t)hd, 2.0f);
        float *cs = rand_f((size_t)S * half, 1, 1.0f), *sn = rand_f((size_t)S * half, 2, 1.0f);
        int pos[9] = {0, 1, 49, 7, 7, 20, 33, 2, 48};
        float *want = malloc((size_t)rows * ld * 4), *got = malloc((size_t)rows * ld * 4);
        memcpy(want, x, (size_t)rows * ld * 4);
        for (int r = 0; r < rows; r++)
            ft_k_rope_ref(want + (size_t)r * ld, nh, hd, cs + (size_t)pos[r] * half, sn + (size_t)pos[r] * half);
        float *dx = dev_copy(x, (size_t)rows * ld * 4), *dc = dev_copy(cs, (size_t)S * half * 4);
        float *ds = dev_copy(sn, (size_t)S * half * 4);
        int *dp = dev_copy(pos, sizeof pos);
        CHECK(sync_ok(ftk_rope(dx, rows, ld, nh, hd, dp, dc, ds, 0), "rope"));
        CHECK_OK(ft_cuda_copy_to_host(got, dx, (size_t)rows * ld * 4));
        float e = rel_err(got, want, (size_t)rows * ld);
        CHECK_MSG(e <= 2e-6f, "rope hd %d: rel err %g", hd, e);
        ft_cuda_free(dx); ft_cuda_free(dc); ft_cuda_free(ds); ft_cuda_free(dp);
        free(x); free(cs); free(sn); free(want); free(got);
    }
}

/* Attention with GQA over caches of several slots, rows at positions from
 * 0 to past several 128-position tiles; compared per (row, head) with
 * ft_k_attend_ref over the same cache slice. Also checks the KV append
 * kernel (exact) that writes the rows of the call into the caches. */
TEST(k_kv_append_and_attention)
{
    static const struct { int nh, nkv, hd; } shapes[] = {{4, 2, 16}, {8, 2, 64}, {2, 1, 128}, {6, 6, 80}, {1, 1, 1024}};
    for (int si = 0; si < 5; si++) {
        const int nh = shapes[si].nh, nkv = shapes[si].nkv, hd = shapes[si].hd;
        const int B = 3, S = 300, kvdim = nkv * hd, qdim = nh * hd;
        /* caches start random (positions < past are "cached"); rows of the
         * call: slot 2 gets 5 new rows at 290..294, slot 0 one row at 0,
         * slot 1 three rows at 127..129 (a tile boundary) */
        const int rows = 9;
        int rslot[9] = {2, 2, 2, 2, 2, 0, 1, 1, 1}, rpos[9] = {290, 291, 292, 293, 294, 0, 127, 128, 129};
        size_t cn = (size_t)B * S * kvdim;
        float *kc = rand_f(cn, 100 + (uint64_t)si, 1.0f), *vc = rand_f(cn, 200 + (uint64_t)si, 1.0f);
        float *k = rand_f((size_t)rows * kvdim, 300, 1.0f), *v = rand_f((size_t)rows * kvdim, 400, 1.0f);
        float *q = rand_f((size_t)rows * qdim, 500, 1.0f);
        float *dkc = dev_copy(kc, cn * 4), *dvc = dev_copy(vc, cn * 4);
        float *dk = dev_copy(k, (size_t)rows * kvdim * 4), *dv = dev_copy(v, (size_t)rows * kvdim * 4);
        float *dq = dev_copy(q, (size_t)rows * qdim * 4), *dout = dev_copy(NULL, (size_t)rows * qdim * 4);
        int *ds = dev_copy(rslot, sizeof rslot), *dp = dev_copy(rpos, sizeof rpos);
        CHECK(sync_ok(ftk_kv_append(dkc, dvc, dk, dv, ds, dp, rows, kvdim, S, 0), "kv append"));
        for (int r = 0; r < rows; r++) {   /* the CPU's append */
            memcpy(kc + ((size_t)rslot[r] * S + (size_t)rpos[r]) * kvdim, k + (size_t)r * kvdim, (size_t)kvdim * 4);
            memcpy(vc + ((size_t)rslot[r] * S + (size_t)rpos[r]) * kvdim, v + (size_t)r * kvdim, (size_t)kvdim * 4);
        }
        float *back = malloc(cn * 4);
        CHECK_OK(ft_cuda_copy_to_host(back, dkc, cn * 4));
        CHECK_MSG(!memcmp(back, kc, cn * 4), "kv append (K) shape %d", si);
        CHECK_OK(ft_cuda_copy_to_host(back, dvc, cn * 4));
        CHECK_MSG(!memcmp(back, vc, cn * 4), "kv append (V) shape %d", si);
        float scale = 1.0f / sqrtf((float)hd);
        CHECK(sync_ok(ftk_attention(dout, dq, dkc, dvc, ds, dp, rows, nh, nkv, hd, S, scale, 0), "attention"));
        float *got = malloc((size_t)rows * qdim * 4), *want = malloc((size_t)rows * qdim * 4), *sc = malloc(S * 4);
        CHECK_OK(ft_cuda_copy_to_host(got, dout, (size_t)rows * qdim * 4));
        float worst = 0;
        for (int r = 0; r < rows; r++)
            for (int h = 0; h < nh; h++) {
                int kvh = h / (nh / nkv);
                const float *K = kc + (size_t)rslot[r] * S * kvdim + (size_t)kvh * hd;
                const float *V = vc + (size_t)rslot[r] * S * kvdim + (size_t)kvh * hd;
                float *o = want + (size_t)r * qdim + (size_t)h * hd;
                ft_k_attend_ref(o, q + (size_t)r * qdim + (size_t)h * hd, K, V, kvdim, rpos[r] + 1, hd, scale, sc);
                float mx = 0, md = 0;
                for (int i = 0; i < hd; i++) {
                    mx = fmaxf(mx, fabsf(o[i]));
                    float d = fabsf(got[(size_t)r * qdim + (size_t)h * hd + i] - o[i]);
                    if (!(d <= md)) md = d;
                }
                float e = md / (1.0f + mx);
                if (!(e <= worst)) worst = e;
            }
        CHECK_MSG(worst <= 2e-5f, "attention nh %d nkv %d hd %d: rel err %g", nh, nkv, hd, worst);
        printf("  attention nh %d nkv %d hd %d: max rel err %.3g\n", nh, nkv, hd, worst);
        ft_cuda_free(dkc); ft_cuda_free(dvc); ft_cuda_free(dk); ft_cuda_free(dv); ft_cuda_free(dq);
        ft_cuda_free(dout); ft_cuda_free(ds); ft_cuda_free(dp);
        free(kc); free(vc); free(k); free(v); free(q); free(back); free(got); free(want); free(sc);
    }
}

TEST(k_elementwise)
{
    const size_t n = 100003;
    float *g = rand_f(n, 1, 8.0f), *u = rand_f(n, 2, 3.0f);
    float *dg = dev_copy(g, n * 4), *du = dev_copy(u, n * 4);
    float *want = malloc(n * 4), *got = malloc(n * 4);
    /* SiLU * up */
    memcpy(want, g, n * 4);
    ft_k_silu_mul_ref(want, u, (int)n);
    CHECK(sync_ok(ftk_silu_mul(dg, du, n, 0), "silu"));
    CHECK_OK(ft_cuda_copy_to_host(got, dg, n * 4));
    float e = rel_err(got, want, n);
    CHECK_MSG(e <= 1e-5f, "silu_mul: rel err %g", e);
    /* ReLU, exact */
    CHECK_OK(ft_cuda_copy_to_device(dg, g, n * 4));
    for (size_t i = 0; i < n; i++) want[i] = g[i] > 0 ? g[i] : 0;
    CHECK(sync_ok(ftk_relu(dg, n, 0), "relu"));
    CHECK_OK(ft_cuda_copy_to_host(got, dg, n * 4));
    CHECK(!memcmp(got, want, n * 4));
    /* residual add, exact */
    CHECK_OK(ft_cuda_copy_to_device(dg, g, n * 4));
    for (size_t i = 0; i < n; i++) want[i] = g[i] + u[i];
    CHECK(sync_ok(ftk_add(dg, du, n, 0), "add"));
    CHECK_OK(ft_cuda_copy_to_host(got, dg, n * 4));
    CHECK(!memcmp(got, want, n * 4));
    /* bias over rows of 1009 (n = 99 * 1009 + 112: use 99 rows), exact */
    int rows = 99, cols = 1009;
    CHECK_OK(ft_cuda_copy_to_device(dg, g, (size_t)rows * cols * 4));
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) want[r * cols + c] = g[r * cols + c] + u[c];
    CHECK(sync_ok(ftk_add_bias(dg, du, rows, cols, 0), "bias"));
    CHECK_OK(ft_cuda_copy_to_host(got, dg, (size_t)rows * cols * 4));
    CHECK(!memcmp(got, want, (size_t)rows * cols * 4));
    ft_cuda_free(dg); ft_cuda_free(du);
    free(g); free(u); free(want); free(got);
}

/* Embedding rows from f32 and bf16 tables, learned positions with offset
 * 2, gather of rows: exact. */
TEST(k_embed_positions_gather)
{
    const int V = 301, E = 97, rows = 11, P = 40;
    float *tab = rand_f((size_t)V * E, 3, 1.0f), *pe = rand_f((size_t)P * E, 4, 1.0f);
    uint16_t *tab16 = malloc((size_t)V * E * 2), *pe16 = malloc((size_t)P * E * 2);
    ft_convert(tab16, FT_BF16, tab, FT_F32, (size_t)V * E);
    ft_convert(pe16, FT_BF16, pe, FT_F32, (size_t)P * E);
    int32_t tok[11] = {0, 300, 5, 5, 17, 299, 1, 150, 42, 0, 7};
    int pos[11] = {0, 1, 2, 37, 3, 4, 5, 6, 7, 8, 9};
    float *want = malloc((size_t)rows * E * 4), *got = malloc((size_t)rows * E * 4);
    int32_t *dt = dev_copy(tok, sizeof tok);
    int *dp = dev_copy(pos, sizeof pos);
    float *dx = dev_copy(NULL, (size_t)rows * E * 4);
    for (int bf = 0; bf < 2; bf++) {
        void *dtab = bf ? dev_copy(tab16, (size_t)V * E * 2) : dev_copy(tab, (size_t)V * E * 4);
        void *dpe = bf ? dev_copy(pe16, (size_t)P * E * 2) : dev_copy(pe, (size_t)P * E * 4);
        for (int r = 0; r < rows; r++)
            for (int i = 0; i < E; i++) {
                float t = bf ? ft_bf16_to_f32_1(tab16[tok[r] * E + i]) : tab[tok[r] * E + i];
                float p = bf ? ft_bf16_to_f32_1(pe16[(pos[r] + 2) * E + i]) : pe[(pos[r] + 2) * E + i];
                want[r * E + i] = t + p;
            }
        CHECK(sync_ok(ftk_embed(dx, dtab, bf ? FT_BF16 : FT_F32, dt, rows, E, 0), "embed"));
        CHECK(sync_ok(ftk_add_pos(dx, dpe, bf ? FT_BF16 : FT_F32, dp, 2, rows, E, 0), "positions"));
        CHECK_OK(ft_cuda_copy_to_host(got, dx, (size_t)rows * E * 4));
        CHECK_MSG(!memcmp(got, want, (size_t)rows * E * 4), "embedding + positions (bf16 %d)", bf);
        ft_cuda_free(dtab);
        ft_cuda_free(dpe);
    }
    int idx[4] = {10, 0, 3, 3};
    int *di = dev_copy(idx, sizeof idx);
    float *dsel = dev_copy(NULL, 4 * (size_t)E * 4);
    CHECK(sync_ok(ftk_gather_rows(dsel, dx, di, 4, E, 0), "gather"));
    CHECK_OK(ft_cuda_copy_to_host(got, dsel, 4 * (size_t)E * 4));
    for (int j = 0; j < 4; j++) CHECK(!memcmp(got + j * E, want + idx[j] * E, (size_t)E * 4));
    ft_cuda_free(dt); ft_cuda_free(dp); ft_cuda_free(dx); ft_cuda_free(di); ft_cuda_free(dsel);
    free(tab); free(pe); free(tab16); free(pe16); free(want); free(got);
}

/* Device argmax == the sampler's greedy choice, ties and NaNs included. */
TEST(k_argmax)
{
    const int V = 32000, rows = 40;
    float *x = malloc((size_t)rows * V * 4), *y = malloc((size_t)V * 4);
    uint64_t s = 5;
    for (int r = 0; r < rows; r++)
        for (int i = 0; i < V; i++) {
            float v = (float)(ft_test_rand(&s) % 1000) * 0.01f;     /* ties */
            if (r % 4 == 1 && i % 3 == 0) v = NAN;
            if (r % 5 == 2) v = -INFINITY;
            if (r % 7 == 3) v = NAN;
            x[(size_t)r * V + i] = v;
        }
    x[(size_t)9 * V + V - 1] = 1e9f;
    x[(size_t)10 * V + 0] = 1e9f;
    float *dx = dev_copy(x, (size_t)rows * V * 4);
    int32_t *dout = dev_copy(NULL, rows * 4), got[40];
    CHECK(sync_ok(ftk_argmax(dout, dx, rows, V, 0), "argmax"));
    CHECK_OK(ft_cuda_copy_to_host(got, dout, sizeof got));
    ft_sampler *smp = NULL;
    CHECK_OK(ft_sampler_create(V, &smp));
    ft_sampling sp = {0};
    uint64_t rng = 1;
    for (int r = 0; smp && r < rows; r++) {
        memcpy(y, x + (size_t)r * V, (size_t)V * 4);
        int want = ft_sampler_sample(smp, &sp, y, NULL, 0, &rng);
        CHECK_MSG(got[r] == want, "row %d: %d vs %d", r, got[r], want);
    }
    ft_sampler_free(smp);
    ft_cuda_free(dx);
    ft_cuda_free(dout);
    free(x);
    free(y);
}

/* Launch errors are reported, not ignored: head_dim above the limit. */
TEST(k_attention_rejects_bad_shapes)
{
    CHECK(ftk_attention(NULL, NULL, NULL, NULL, NULL, NULL, 1, 2, 1, 2048, 8, 1.0f, 0) == cudaErrorInvalidValue);
    CHECK(ftk_attention(NULL, NULL, NULL, NULL, NULL, NULL, 1, 3, 2, 64, 8, 1.0f, 0) == cudaErrorInvalidValue);
}
