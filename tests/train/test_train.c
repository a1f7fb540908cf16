/* The train layer (src/train, docs/training.md): every op's backward
 * against finite differences, the transposed stored-format product
 * against its scalar reference, whole-model LoRA gradients against
 * finite differences (every family), LoRA runs against PyTorch + PEFT
 * (tests/data/lora/NAME, scripts/fixtures/gen_lora_fixtures.py), and
 * data-parallel steps (ranks as threads) against one process. */
#include "ft_test.h"
#include "support/fixture.h"
#include "flextier/engine.h"
#include "flextier/model.h"
#include "flextier/train.h"
#include "train/train_internal.h"
#include "engine/kernels.h"
#include "engine/graph.h"
#include "engine/gemm_bf16.h"
#include "engine/wkernels.h"

#include <json-c/json.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static uint64_t seed = 12345;
static float frand(void) { return (float)((double)(ft_test_rand(&seed) >> 11) * 0x1p-53 * 2.0 - 1.0); }
static void fill(float *x, size_t n, float s) { for (size_t i = 0; i < n; i++) x[i] = frand() * s; }
static double dotd(const float *a, const float *b, size_t n)
{
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += (double)a[i] * (double)b[i];
    return s;
}
/* analytic vs central difference: |a - fd| <= tol (1 + |fd|) */
static int close_fd(double an, double fd, double tol) { return fabs(an - fd) <= tol * (1.0 + fabs(fd)); }

static ft_model *load(const char *name, int weights)
{
    char dir[1024];
    ft_fixture_dir("models", name, dir, sizeof dir);
    ft_load_params p;
    ft_load_params_default(&p);
    p.weights = weights;
    ft_model *m = NULL;
    if (ft_model_load(dir, &p, &m)) {
        fprintf(stderr, "load %s: %s\n", dir, ft_last_error());
        return NULL;
    }
    return m;
}

static ft_status count_text(void *user, const char *text, size_t len)
{
    (void)text;
    *(size_t *)user += len;
    return FT_OK;
}

/* JSONL data: documents are handed out whole; a "text" holding a \u0000
 * escape is refused (the tokenizer would stop at it), as are NUL bytes,
 * non-objects and missing "text" (found by fuzz_train_jsonl). */
TEST(jsonl_reader_refuses_nul_and_bad_lines)
{
    size_t n = 0;
    const char ok[] = "{\"text\": \"hello\"}\n\n{\"text\": \"w\\u00e9rld\"}\n";
    CHECK_OK(ft_train_jsonl_each(ok, sizeof ok - 1, "t", count_text, &n));
    CHECK(n == 5 + 6);
    const char nul[] = "{\"text\": \"hello\"}\n{\"text\": \"w\\u0000e9rld\"}\n";
    CHECK(ft_train_jsonl_each(nul, sizeof nul - 1, "t", count_text, &n) == FT_ERR_CORRUPT);
    CHECK(strstr(ft_last_error(), "line 2") && strstr(ft_last_error(), "NUL"));
    const char arr[] = "[1, 2]\n";
    CHECK(ft_train_jsonl_each(arr, sizeof arr - 1, "t", count_text, &n) == FT_ERR_CORRUPT);
    const char num[] = "{\"text\": 3}\n";
    CHECK(ft_train_jsonl_each(num, sizeof num - 1, "t", count_text, &n) == FT_ERR_CORRUPT);
}

TEST(rmsnorm_bwd_fd)
{
    enum { N = 24 };
    float x[N], w[N], dy[N], dx[N] = {0}, y[N], xp[N];
    fill(x, N, 1.0f);
    fill(w, N, 1.0f);
    fill(dy, N, 1.0f);
    ft_tr_rmsnorm_bwd(dx, x, w, dy, N, 1e-5f);
    for (int i = 0; i < N; i++) {
        double f[2];
        for (int s = 0; s < 2; s++) {
            memcpy(xp, x, sizeof x);
            xp[i] += s ? -1e-3f : 1e-3f;
            float ss = 0.0f;
            for (int j = 0; j < N; j++) ss += xp[j] * xp[j];
            float r = 1.0f / sqrtf(ss / N + 1e-5f);
            for (int j = 0; j < N; j++) y[j] = xp[j] * r * w[j];
            f[s] = dotd(dy, y, N);
        }
        double fd = (f[0] - f[1]) / (double)((x[i] + 1e-3f) - (x[i] - 1e-3f));
        CHECK_MSG(close_fd(dx[i], fd, 2e-3), "i %d: %g vs %g", i, (double)dx[i], fd);
    }
}

/* LayerNorm (OPT), with and without affine weights, against the engine's forward */
TEST(layernorm_bwd_fd)
{
    enum { N = 24 };
    float x[N], w[N], b[N], dy[N], y[N], xp[N];
    fill(x, N, 1.0f);
    fill(w, N, 1.0f);
    fill(b, N, 1.0f);
    fill(dy, N, 1.0f);
    for (int affine = 0; affine < 2; affine++) {
        float dx[N] = {0};
        const float *wp = affine ? w : NULL;
        ft_tr_layernorm_bwd(dx, x, wp, dy, N, 1e-5f);
        for (int i = 0; i < N; i++) {
            double f[2];
            for (int s = 0; s < 2; s++) {
                memcpy(xp, x, sizeof x);
                xp[i] += s ? -1e-3f : 1e-3f;
                ft_k_layernorm_ref(y, xp, wp, affine ? b : NULL, N, 1e-5f);
                f[s] = dotd(dy, y, N);
            }
            double fd = (f[0] - f[1]) / (double)((x[i] + 1e-3f) - (x[i] - 1e-3f));
            CHECK_MSG(close_fd(dx[i], fd, 2e-3), "affine %d i %d: %g vs %g", affine, i, (double)dx[i], fd);
        }
    }
}

TEST(rope_bwd_is_inverse_rotation)
{
    enum { NH = 3, HD = 8 };
    float c[HD / 2], s[HD / 2], x[NH * HD], y[NH * HD], dy[NH * HD], dx[NH * HD];
    for (int i = 0; i < HD / 2; i++) {
        float a = 0.7f * (float)(i + 1);
        c[i] = cosf(a) * 1.3f;   /* scaled tables (yarn) too */
        s[i] = sinf(a) * 1.3f;
    }
    fill(x, NH * HD, 1.0f);
    fill(dy, NH * HD, 1.0f);
    /* linear: <dy, rope(x)> = <rope_bwd(dy), x> */
    memcpy(y, x, sizeof x);
    for (int h = 0; h < NH; h++)
        for (int i = 0; i < HD / 2; i++) {
            float a = x[h * HD + i], b = x[h * HD + i + HD / 2];
            y[h * HD + i] = a * c[i] - b * s[i];
            y[h * HD + i + HD / 2] = b * c[i] + a * s[i];
        }
    memcpy(dx, dy, sizeof dy);
    ft_tr_rope_bwd(dx, NH, HD, c, s);
    CHECK(fabs(dotd(dy, y, NH * HD) - dotd(dx, x, NH * HD)) < 1e-5);
}

TEST(silu_mul_bwd_fd)
{
    enum { N = 32 };
    float g[N], u[N], dy[N], dg[N], du[N];
    fill(g, N, 4.0f);
    fill(u, N, 2.0f);
    fill(dy, N, 1.0f);
    ft_tr_silu_mul_bwd(dg, du, g, u, dy, N);
    for (int i = 0; i < N; i++) {
        double h = 1e-4, G = g[i];
        double fp = (G + h) / (1 + exp(-(G + h))) * u[i], fm = (G - h) / (1 + exp(-(G - h))) * u[i];
        CHECK_MSG(close_fd(dg[i], dy[i] * (fp - fm) / (2 * h), 1e-4), "dg %d", i);
        CHECK(close_fd(du[i], dy[i] * G / (1 + exp(-G)), 1e-5));
    }
}

static float g_scale, g_cap;   /* 0: 1/sqrt(hd), no cap (ft_tr_attn_fwd) */

static double attn_obj(const float *q, const float *k, const float *v, const float *dout, int T, int nh, int nkv,
                       int hd, int win, float *out, float *P)
{
    if (g_scale != 0) ft_tr_attn_fwd_g(out, P, q, k, v, T, nh, nkv, hd, win, 0, nkv, g_scale, g_cap);
    else ft_tr_attn_fwd(out, P, q, k, v, T, nh, nkv, hd, win);
    return dotd(dout, out, (size_t)T * (size_t)nh * (size_t)hd);
}

static void attn_fd(int win)
{
    enum { T = 6, NH = 4, NKV = 2, HD = 4 };
    float q[T * NH * HD], k[T * NKV * HD], v[T * NKV * HD], dout[T * NH * HD], out[T * NH * HD], P[NH * T * T];
    float dq[T * NH * HD] = {0}, dk[T * NKV * HD] = {0}, dv[T * NKV * HD] = {0};
    fill(q, sizeof q / 4, 1.0f);
    fill(k, sizeof k / 4, 1.0f);
    fill(v, sizeof v / 4, 1.0f);
    fill(dout, sizeof dout / 4, 1.0f);
    attn_obj(q, k, v, dout, T, NH, NKV, HD, win, out, P);
    if (g_scale != 0) ft_tr_attn_bwd_g(dq, dk, dv, dout, P, q, k, v, T, NH, NKV, HD, win, 0, NKV, g_scale, g_cap);
    else ft_tr_attn_bwd(dq, dk, dv, dout, P, q, k, v, T, NH, NKV, HD, win);
    float *xs[3] = {q, k, v}, *gs[3] = {dq, dk, dv};
    size_t ns[3] = {sizeof q / 4, sizeof k / 4, sizeof v / 4};
    for (int a = 0; a < 3; a++)
        for (size_t i = 0; i < ns[a]; i++) {
            float x0 = xs[a][i], h = 1e-2f;
            xs[a][i] = x0 + h;
            double fp = attn_obj(q, k, v, dout, T, NH, NKV, HD, win, out, P);
            xs[a][i] = x0 - h;
            double fm = attn_obj(q, k, v, dout, T, NH, NKV, HD, win, out, P);
            xs[a][i] = x0;
            double fd = (fp - fm) / (double)((x0 + h) - (x0 - h));
            CHECK_MSG(close_fd(gs[a][i], fd, 2e-3), "win %d tensor %d i %zu: %g vs %g", win, a, i, (double)gs[a][i], fd);
        }
}

TEST(attention_bwd_fd_gqa) { attn_fd(0); }
TEST(attention_bwd_fd_window) { attn_fd(3); }
/* gemma2: another score scale, soft-capped scores (a cap the scores reach) */
TEST(attention_bwd_fd_softcap)
{
    g_scale = 0.8f;
    g_cap = 1.5f;
    attn_fd(0);
    attn_fd(3);
    g_scale = g_cap = 0.0f;
}

TEST(gelu_mul_bwd_fd)
{
    enum { N = 32 };
    float g[N], u[N], dy[N], dg[N], du[N];
    fill(g, N, 4.0f);
    fill(u, N, 2.0f);
    fill(dy, N, 1.0f);
    ft_tr_gelu_mul_bwd(dg, du, g, u, dy, N);
    for (int i = 0; i < N; i++) {
        double h = 1e-4, G = g[i], k0 = 0.7978845608028654, k1 = 0.044715;
#define GEL(x) (0.5 * (x) * (1.0 + tanh(k0 * ((x) + k1 * (x) * (x) * (x)))))
        double fp = GEL(G + h) * u[i], fm = GEL(G - h) * u[i];
        CHECK_MSG(close_fd(dg[i], dy[i] * (fp - fm) / (2 * h), 1e-4), "dg %d", i);
        CHECK(close_fd(du[i], dy[i] * GEL(G), 1e-5));
#undef GEL
    }
}

/* W^T dy on stored weights (f32, bf16, q8, q4) vs the scalar reference,
 * and the adjoint identity <dy, W x> = <W^T dy, x> on the forward product */
/* the 16-bit tile transpose (SIMD where the CPU has it) against its
 * scalar twin, whole tiles and edges, in larger strided matrices */
TEST(transpose16_matches_ref)
{
    enum { RS = 40, CS = 37 };
    uint16_t src[RS * CS], a[CS * RS], b[CS * RS];
    uint64_t s = 7;
    for (int i = 0; i < RS * CS; i++) src[i] = (uint16_t)(ft_test_rand(&s) >> 48);
    static const int nm[][2] = {{16, 16}, {16, 5}, {3, 16}, {1, 1}, {15, 16}};
    for (size_t k = 0; k < sizeof nm / sizeof nm[0]; k++)
        for (int off = 0; off < 3; off++) {
            memset(a, 0xAB, sizeof a);
            memset(b, 0xAB, sizeof b);
            const uint16_t *sp = src + (size_t)off * CS + (size_t)off;
            ft_tr_transpose16(a + off, RS, sp, CS, nm[k][0], nm[k][1]);
            ft_tr_transpose16_ref(b + off, RS, sp, CS, nm[k][0], nm[k][1]);
            CHECK_MSG(memcmp(a, b, sizeof a) == 0, "%d x %d at %d", nm[k][0], nm[k][1], off);
            for (int c = 0; c < nm[k][1]; c++)
                for (int o = 0; o < nm[k][0]; o++) CHECK(b[off + c * RS + o] == sp[o * CS + c]);
        }
}

/* the adapters' f32 products (ft_tr_acc): SIMD against the _ref twin
 * bit for bit (both one fma chain per output in k order), odd sizes and
 * column ranges, both P layouts, and against per-k axpys */
TEST(tr_acc_matches_ref)
{
    static const int sz[][5] = {{1, 1, 1, 0, 1}, {16, 37, 130, 3, 130}, {7, 16, 64, 0, 64}, {13, 5, 200, 64, 199}};
    for (size_t c = 0; c < sizeof sz / sizeof sz[0]; c++)
        for (int lay = 0; lay < 2; lay++) {
            const int M = sz[c][0], K = sz[c][1], N = sz[c][2], n0 = sz[c][3], n1 = sz[c][4], ldc = N + 3, ldq = N + 1;
            const int psm = lay ? 1 : K, psk = lay ? M : 1;
            float *P = malloc(sizeof(float) * (size_t)M * K), *Q = malloc(sizeof(float) * (size_t)K * ldq);
            float *c0 = malloc(sizeof(float) * (size_t)M * ldc), *c1 = malloc(sizeof(float) * (size_t)M * ldc);
            float *c2 = malloc(sizeof(float) * (size_t)M * ldc);
            REQUIRE(P && Q && c0 && c1 && c2);
            fill(P, (size_t)M * K, 1.0f);
            fill(Q, (size_t)K * ldq, 1.0f);
            fill(c0, (size_t)M * ldc, 1.0f);
            memcpy(c1, c0, sizeof(float) * (size_t)M * ldc);
            memcpy(c2, c0, sizeof(float) * (size_t)M * ldc);
            ft_tr_acc_ref(c0, ldc, P, psm, psk, M, K, Q, ldq, n0, n1);
            ft_tr_acc(c1, ldc, P, psm, psk, M, K, Q, ldq, n0, n1);
            CHECK_MSG(memcmp(c0, c1, sizeof(float) * (size_t)M * ldc) == 0, "case %zu layout %d", c, lay);
            /* the axpys it replaces (fma per element on this machine's kernel, n0 = 0 cases) */
            if (n0 == 0 && n1 == N) {
                const ft_kernels *kk = ft_k_get();
                for (int m = 0; m < M; m++)
                    for (int k = 0; k < K; k++)
                        kk->axpy(c2 + (size_t)m * ldc, P[(size_t)m * psm + (size_t)k * psk], Q + (size_t)k * ldq, N);
                float d = ft_max_abs_diff(c1, c2, (size_t)M * ldc);
                CHECK_MSG(d < 1e-5f, "case %zu layout %d: vs axpys %g", c, lay, (double)d);
            }
            free(P), free(Q), free(c0), free(c1), free(c2);
        }
}

/* the adapters' narrow products (ft_tr_dots): SIMD against the _ref
 * within f32 reassociation, K not a multiple of 16, rows split anywhere
 * giving the same bits */
TEST(tr_dots_matches_ref)
{
    static const int sz[][3] = {{1, 1, 1}, {13, 16, 2048}, {7, 5, 37}, {20, 3, 100}};
    for (size_t c = 0; c < sizeof sz / sizeof sz[0]; c++) {
        const int M = sz[c][0], N = sz[c][1], K = sz[c][2], ldp = K + 2, ldq = K + 1, ldc = N + 3;
        float *P = malloc(sizeof(float) * (size_t)M * ldp), *Q = malloc(sizeof(float) * (size_t)N * ldq);
        float *c0 = calloc((size_t)M * ldc, sizeof(float)), *c1 = calloc((size_t)M * ldc, sizeof(float)),
              *c2 = calloc((size_t)M * ldc, sizeof(float));
        REQUIRE(P && Q && c0 && c1 && c2);
        fill(P, (size_t)M * ldp, 1.0f);
        fill(Q, (size_t)N * ldq, 1.0f);
        ft_tr_dots_ref(c0, ldc, P, ldp, 0, M, Q, ldq, N, K);
        ft_tr_dots(c1, ldc, P, ldp, 0, M, Q, ldq, N, K);
        ft_tr_dots(c2, ldc, P, ldp, 0, M / 3, Q, ldq, N, K);
        ft_tr_dots(c2, ldc, P, ldp, M / 3, M, Q, ldq, N, K);
        CHECK_MSG(memcmp(c1, c2, sizeof(float) * (size_t)M * ldc) == 0, "case %zu: a row split changed bits", c);
        for (int m = 0; m < M; m++)
            for (int n = 0; n < N; n++) {
                double sa = 0.0;
                for (int k = 0; k < K; k++) sa += fabs((double)P[(size_t)m * ldp + k] * Q[(size_t)n * ldq + k]);
                double d = fabs((double)c0[(size_t)m * ldc + n] - c1[(size_t)m * ldc + n]);
                CHECK_MSG(d <= 2.0 * (K + 16) * ldexp(1.0, -24) * sa, "case %zu (%d, %d): %g", c, m, n, d);
            }
        free(P), free(Q), free(c0), free(c1), free(c2);
    }
}

TEST(matT_stored_formats)
{
    static const int fmts[] = {FT_WF_F32, FT_WF_BF16, FT_WF_Q8, FT_WF_Q4};
    for (size_t f = 0; f < 4; f++) {
        ft_model *m = load("llama-tiny", fmts[f]);
        REQUIRE(m);
        const ft_wmat *W = ft_layer_weights_mat((ft_layer_weights *)(uintptr_t)ft_model_layer(m, 1), 2 /* LW_K */);
        CHECK(W->fmt == (ft_wfmt)fmts[f]);
        enum { R = 3 };
        float *dy = malloc(sizeof(float) * R * (size_t)W->rows), *a = calloc((size_t)R * (size_t)W->cols, 4),
              *b = calloc((size_t)R * (size_t)W->cols, 4), *row = malloc(4 * (size_t)W->cols);
        fill(dy, (size_t)R * (size_t)W->rows, 1.0f);
        ft_tr_matT(a, W->cols, dy, W->rows, R, W, 0, W->rows, row);
        ft_tr_matT_ref(b, W->cols, dy, W->rows, R, W, 0, W->rows, row);
        float d = ft_max_abs_diff(a, b, (size_t)R * (size_t)W->cols);
        CHECK_MSG(d < 1e-5f, "%s: matT vs ref %g", ft_wfmt_name(W->fmt), (double)d);
        /* the trainer's path: transposed f32 copy + the engine's product */
        {
            ft_train_params tp;
            ft_train_params_default(&tp);
            ft_trainer *t = NULL;
            CHECK_OK(ft_trainer_create(m, &tp, &t));
            REQUIRE(t);
            int32_t tk[R] = {1, 2, 3};
            double ls;
            int64_t cnt;
            CHECK_OK(ft_trainer_eval(t, tk, 1, R, &ls, &cnt));   /* sizes the scratch for R rows */
            float *c = calloc((size_t)R * (size_t)W->cols, 4);
            CHECK_OK(ft_tr_matT_fast(t, c, dy, R, W));
            d = ft_max_abs_diff(c, b, (size_t)R * (size_t)W->cols);
            CHECK_MSG(d < 1e-5f, "%s: matT_fast vs ref %g", ft_wfmt_name(W->fmt), (double)d);
            free(c);
            ft_trainer_free(t);
        }
        /* adjoint: y_r[o] = sum_i row_o[i] x_r[i] with dequantized rows */
        float *x = malloc(4 * (size_t)R * (size_t)W->cols);
        fill(x, (size_t)R * (size_t)W->cols, 1.0f);
        double lhs = 0.0;
        for (int o = 0; o < W->rows; o++) {
            ft_wmat_row_f32(W, o, row);
            for (int r = 0; r < R; r++) lhs += dy[r * W->rows + o] * dotd(row, x + (size_t)r * W->cols, (size_t)W->cols);
        }
        double rhs = dotd(a, x, (size_t)R * (size_t)W->cols);
        CHECK_MSG(fabs(lhs - rhs) < 1e-4 * (1 + fabs(lhs)), "%s adjoint %g vs %g", ft_wfmt_name(W->fmt), lhs, rhs);
        free(dy); free(a); free(b); free(row); free(x);
        ft_model_free(m);
    }
}

/* d mean-loss / d (every LoRA parameter we probe) vs central differences */
static void model_fd_h(const char *name, int T, int fmt, float h0)
{
    seed = 12345;   /* the same draws whatever ran before */
    for (const char *c = name; *c; c++) seed = seed * 131 + (uint64_t)(unsigned char)*c;
    ft_model *m = load(name, fmt);
    REQUIRE(m);
    ft_train_params p;
    ft_train_params_default(&p);
    p.rank = 2;
    p.alpha = 4.0f;
    p.vocab_chunk = 100;   /* several chunks, a short last one */
    ft_trainer *t = NULL;
    CHECK_OK(ft_trainer_create(m, &p, &t));
    REQUIRE(t);
    size_t n;
    float *w = ft_trainer_param_data(t, &n), *g = ft_trainer_grad_data(t, &n);
    fill(w, n, 0.3f);
    const int nb = 2, V = ft_model_get_config(m)->vocab;
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)(nb * T));
    for (int i = 0; i < nb * T; i++) tok[i] = (int32_t)(ft_test_rand(&seed) % (uint64_t)V);
    double ls;
    int64_t cnt;
    memset(g, 0, n * sizeof(float));
    CHECK_OK(ft_trainer_loss_grad(t, tok, nb, T, 1.0, &ls, &cnt));
    CHECK(cnt == nb * (T - 1));
    float *an = malloc(n * sizeof(float));
    memcpy(an, g, n * sizeof(float));
    int bad = 0, probes = 0;
    for (size_t i = 0; i < n; i += n / 37 + 1) {
        double fd = 0.0;
        /* a step across a ReLU kink (OPT) misleads: a quarter step then */
        for (int tries = 0; tries < 2; tries++) {
            float x0 = w[i], h = tries ? h0 / 4 : h0;
            double fp, fm;
            w[i] = x0 + h;
            CHECK_OK(ft_trainer_loss_grad(t, tok, nb, T, 0.0, &fp, &cnt));
            w[i] = x0 - h;
            CHECK_OK(ft_trainer_loss_grad(t, tok, nb, T, 0.0, &fm, &cnt));
            w[i] = x0;
            fd = (fp - fm) / (double)cnt / (double)((x0 + h) - (x0 - h));
            if (fabs(an[i] - fd) <= 5e-4 + 2e-2 * fabs(fd)) break;
        }
        probes++;
        if (fabs(an[i] - fd) > 5e-4 + 2e-2 * fabs(fd)) {
            bad++;
            fprintf(stderr, "  %s param %zu: analytic %.6g fd %.6g\n", name, i, (double)an[i], fd);
        }
    }
    CHECK_MSG(bad == 0, "%s: %d of %d probes off", name, bad, probes);
    free(an);
    free(tok);
    ft_trainer_free(t);
    ft_model_free(m);
}

static void model_fd_fmt(const char *name, int T, int fmt) { model_fd_h(name, T, fmt, 1e-2f); }
static void model_fd(const char *name, int T) { model_fd_fmt(name, T, FT_WF_F32); }

TEST(model_grad_fd_llama) { model_fd("llama-tiny", 7); }
/* bf16 weights: the forward is exact f32 math on the widened weights */
TEST(model_grad_fd_llama_bf16) { model_fd_fmt("llama-tiny", 7, FT_WF_BF16); }

/* q8/q4 base weights (QLoRA-style): the loss on a fixed batch goes down */
TEST(train_on_quantized_weights)
{
    static const int fmts[] = {FT_WF_Q8, FT_WF_Q4};
    for (int f = 0; f < 2; f++) {
        ft_model *m = load("llama-tiny", fmts[f]);
        REQUIRE(m);
        ft_train_params p;
        ft_train_params_default(&p);
        p.lr = 1e-2f;
        p.total_steps = 8;
        p.schedule = FT_SCHED_CONSTANT;
        ft_trainer *t = NULL;
        CHECK_OK(ft_trainer_create(m, &p, &t));
        REQUIRE(t);
        int32_t tok[2 * 12];
        for (int i = 0; i < 24; i++) tok[i] = (int32_t)((i * 53 + 7) % 320);
        double first = 0, loss = 0;
        for (int s = 0; s < 8; s++) {
            CHECK_OK(ft_trainer_step(t, tok, 2, 12, &loss, NULL));
            if (s == 0) first = loss;
        }
        CHECK_MSG(loss < first - 0.1, "%s: loss %g -> %g", ft_wfmt_name(ft_model_weights_format(m)), first, loss);
        ft_trainer_free(t);
        ft_model_free(m);
    }
}
TEST(model_grad_fd_qwen2_bias) { model_fd("qwen2-tiny", 6); }
TEST(model_grad_fd_mistral_window) { model_fd("mistral-sw", 9); }
/* q/k RMSNorm per head before RoPE */
TEST(model_grad_fd_qwen3_qk_norm) { model_fd("qwen3-tiny", 7); }
TEST(model_grad_fd_qwen3_window) { model_fd("qwen3-sw", 9); }
/* OPT: LayerNorm with biases, biases on every projection, ReLU, learned positions */
/* phi3: one LoRA on each fused projection (qkv_proj, gate_up_proj) */
TEST(model_grad_fd_phi3_fused) { model_fd("phi3-tiny", 7); }
/* gemma2: (1 + w) norms, sandwich norms, GeGLU, scaled embeddings, score
 * scale, attention and final soft-capping, alternating windows; gemma3:
 * q/k norms and a local RoPE base on the sliding layers */
TEST(model_grad_fd_gemma2) { model_fd("gemma2-tiny", 8); }
TEST(model_grad_fd_gemma3) { model_fd_h("gemma3-tiny", 8, FT_WF_F32, 2e-3f); }   /* large curvature: a smaller step */
/* mixture of experts (frozen, LoRA on attention): through the experts and the router */
TEST(model_grad_fd_mixtral) { model_fd_h("mixtral-tiny", 7, FT_WF_F32, 2e-3f); }
TEST(model_grad_fd_qwen3_moe) { model_fd_h("qwen3moe-tiny", 7, FT_WF_F32, 2e-3f); }
TEST(model_grad_fd_olmoe) { model_fd_h("olmoe-tiny", 7, FT_WF_F32, 2e-3f); }
/* OPT-350m's shapes: post-LN layers; project_in/out */
TEST(model_grad_fd_opt_postln) { model_fd_h("opt-tiny-postln", 7, FT_WF_F32, 2e-3f); }
TEST(model_grad_fd_opt_proj) { model_fd_h("opt-tiny-proj", 7, FT_WF_F32, 2e-3f); }
TEST(model_grad_fd_opt) { model_fd_h("opt-tiny", 7, FT_WF_F32, 2e-3f); }   /* ReLU kinks: a smaller step */

/* ------------------------------------------------ against PyTorch + PEFT */

static json_object *run_json(const char *name, char *dir, size_t n)
{
    ft_fixture_dir("lora", name, dir, n);
    char path[1200];
    snprintf(path, sizeof path, "%s/run.json", dir);
    return json_object_from_file(path);
}
static double jd(json_object *o, const char *k) { return json_object_get_double(json_object_object_get(o, k)); }
static int ji(json_object *o, const char *k) { return json_object_get_int(json_object_object_get(o, k)); }

static ft_trainer *peft_trainer(ft_model *m, json_object *run, const char *dir)
{
    ft_train_params p;
    ft_train_params_default(&p);
    p.rank = ji(run, "rank");
    p.alpha = (float)jd(run, "alpha");
    p.lr = (float)jd(run, "lr");
    p.warmup = ji(run, "warmup");
    p.total_steps = ji(run, "steps");
    p.weight_decay = (float)jd(run, "weight_decay");
    p.beta1 = (float)jd(run, "beta1");
    p.beta2 = (float)jd(run, "beta2");
    p.eps = (float)jd(run, "eps");
    p.clip = (float)jd(run, "clip");
    p.grad_accum = ji(run, "grad_accum");
    p.dropout = (float)jd(run, "dropout");   /* absent: 0 */
    p.vocab_chunk = 128;
    /* the run's modules: target_modules, and target_parameters (the MoE experts) */
    char list[512] = "";
    const char *keys[2] = {"targets", "target_parameters"};
    for (int k = 0; k < 2; k++) {
        json_object *a = json_object_object_get(run, keys[k]);
        for (size_t i = 0; a && i < json_object_array_length(a); i++) {
            size_t n = strlen(list);
            snprintf(list + n, sizeof list - n, "%s%s%s", n ? "," : "", k ? "experts." : "",
                     json_object_get_string(json_object_array_get_idx(a, i)));
        }
    }
    if (list[0] && ft_lora_parse_targets(list, &p.targets)) return NULL;
    ft_trainer *t = NULL;
    if (ft_trainer_create(m, &p, &t)) return NULL;
    if (dir && ft_trainer_load_adapter(t, dir)) {
        fprintf(stderr, "load adapter %s: %s\n", dir, ft_last_error());
        ft_trainer_free(t);
        return NULL;
    }
    return t;
}

/* the run recorded in tests/data/lora/<fixture> on tests/data/models/<name> */
static void peft_match_run(const char *fixture, const char *name)
{
    char dir[1024], sub[1200];
    json_object *run = run_json(fixture, dir, sizeof dir);
    REQUIRE(run);
    ft_model *m = load(name, FT_WF_F32);
    REQUIRE(m);
    snprintf(sub, sizeof sub, "%s/init", dir);
    ft_trainer *t = peft_trainer(m, run, sub);
    REQUIRE(t);
    const int steps = ji(run, "steps"), A = ji(run, "grad_accum"), nb = ji(run, "batch"), T = ji(run, "seq");
    json_object *batches = json_object_object_get(run, "batches"), *losses = json_object_object_get(run, "losses"),
                *norms = json_object_object_get(run, "grad_norms"), *lrs = json_object_object_get(run, "lrs");
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)(A * nb * T));
    double worst = 0.0;
    for (int s = 0; s < steps; s++) {
        for (int a = 0; a < A; a++)
            for (int b = 0; b < nb; b++)
                for (int i = 0; i < T; i++)
                    tok[(a * nb + b) * T + i] = json_object_get_int(json_object_array_get_idx(
                        json_object_array_get_idx(json_object_array_get_idx(batches, (size_t)(s * A + a)), (size_t)b),
                        (size_t)i));
        double want_lr = json_object_get_double(json_object_array_get_idx(lrs, (size_t)s));
        CHECK_MSG(fabs(ft_trainer_lr_at(t, s) - want_lr) <= 1e-9 * (1 + want_lr), "lr step %d", s);
        double loss, gn;
        CHECK_OK(ft_trainer_step(t, tok, nb, T, &loss, &gn));
        double want = json_object_get_double(json_object_array_get_idx(losses, (size_t)s));
        double wn = json_object_get_double(json_object_array_get_idx(norms, (size_t)s));
        double rel = fabs(loss - want) / want;
        if (rel > worst) worst = rel;
        printf("  step %d loss %.7f (torch %.7f, rel %.2e) grad norm %.6f (torch %.6f)\n", s + 1, loss, want, rel,
               gn, wn);
        CHECK_MSG(rel <= 1e-4, "step %d loss %.8g vs %.8g", s + 1, loss, want);
        CHECK_MSG(fabs(gn - wn) <= 1e-3 * wn, "step %d grad norm %.8g vs %.8g", s + 1, gn, wn);
    }
    /* the final adapter vs PEFT's */
    snprintf(sub, sizeof sub, "%s/final", dir);
    ft_trainer *ref = peft_trainer(m, run, sub);
    REQUIRE(ref);
    size_t n;
    float *a = ft_trainer_param_data(t, &n), *b = ft_trainer_param_data(ref, &n);
    float d = ft_max_abs_diff(a, b, n);
    printf("  final adapter: max |flextier - peft| = %.3g over %zu parameters (worst loss rel %.2e)\n", (double)d, n,
           worst);
    CHECK_MSG(d <= 2e-5f, "final adapter differs by %g", (double)d);

    /* the saved adapter reads back bit for bit; PEFT's final adapter gives
     * transformers + peft's last-position logits and greedy tokens */
    char tmp[] = "/tmp/ft_lora_XXXXXX";
    REQUIRE(mkdtemp(tmp));
    CHECK_OK(ft_trainer_save_adapter(t, tmp, name));
    ft_trainer *back = peft_trainer(m, run, tmp);
    REQUIRE(back);
    float *c = ft_trainer_param_data(back, &n);
    CHECK(memcmp(a, c, n * sizeof(float)) == 0);
    char path[1300];
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", tmp);
    unlink(path);
    snprintf(path, sizeof path, "%s/adapter_config.json", tmp);
    unlink(path);
    rmdir(tmp);

    json_object *prompt = json_object_object_get(run, "prompt"), *greedy = json_object_object_get(run, "greedy"),
                *ll = json_object_object_get(run, "last_logits");
    int np = (int)json_object_array_length(prompt), ng = (int)json_object_array_length(greedy);
    int V = ft_model_get_config(m)->vocab;
    int32_t seq[64];
    for (int i = 0; i < np; i++) seq[i] = json_object_get_int(json_object_array_get_idx(prompt, (size_t)i));
    float *lg = malloc(sizeof(float) * (size_t)V);
    for (int g = 0; g < ng; g++) {
        CHECK_OK(ft_trainer_last_logits(ref, seq, np + g, lg));
        if (g == 0) {
            float md = 0.0f;
            for (int v = 0; v < V; v++) {
                float e = fabsf(lg[v] - (float)json_object_get_double(json_object_array_get_idx(ll, (size_t)v)));
                if (e > md) md = e;
            }
            CHECK_MSG(md < 1e-4f, "last logits differ by %g", (double)md);
        }
        int best = 0;
        for (int v = 1; v < V; v++) if (lg[v] > lg[best]) best = v;
        CHECK_MSG(best == json_object_get_int(json_object_array_get_idx(greedy, (size_t)g)), "greedy token %d", g);
        seq[np + g] = best;
    }
    free(lg);
    free(tok);
    ft_trainer_free(back);
    ft_trainer_free(ref);
    ft_trainer_free(t);
    ft_model_free(m);
    json_object_put(run);
}

static void peft_match(const char *name) { peft_match_run(name, name); }

TEST(lora_run_matches_peft) { peft_match("llama-tiny"); }
/* lora_dropout 0.25: PEFT's dropout modules given the trainer's masks
 * (gen_lora_fixtures.py --dropout); phi3: one mask for a fused module */
TEST(lora_run_matches_peft_dropout) { peft_match_run("llama-tiny-dropout", "llama-tiny"); }
TEST(lora_run_matches_peft_dropout_phi3) { peft_match_run("phi3-tiny-dropout", "phi3-tiny"); }
/* qwen3: q/k norms per head; tied embeddings */
TEST(lora_run_matches_peft_qwen3) { peft_match("qwen3-tiny"); }
/* OPT: q_proj k_proj v_proj out_proj fc1 fc2, LayerNorm, ReLU, learned positions */
TEST(lora_run_matches_peft_opt) { peft_match("opt-tiny"); }
TEST(lora_run_matches_peft_opt_postln) { peft_match("opt-tiny-postln"); }
TEST(lora_run_matches_peft_opt_proj) { peft_match("opt-tiny-proj"); }
/* phi3: qkv_proj o_proj gate_up_proj down_proj */
TEST(lora_run_matches_peft_phi3) { peft_match("phi3-tiny"); }
TEST(lora_run_matches_peft_gemma2) { peft_match("gemma2-tiny"); }
TEST(lora_run_matches_peft_gemma3) { peft_match("gemma3-tiny"); }
/* mixture of experts: LoRA on q/k/v/o through the frozen router and experts */
TEST(lora_run_matches_peft_mixtral) { peft_match("mixtral-tiny"); }
TEST(lora_run_matches_peft_qwen3_moe) { peft_match("qwen3moe-tiny"); }
TEST(lora_run_matches_peft_olmoe) { peft_match("olmoe-tiny"); }
/* LoRA on the experts too: PEFT's target_parameters gate_up_proj, down_proj */
TEST(lora_run_matches_peft_mixtral_experts) { peft_match_run("mixtral-tiny-experts", "mixtral-tiny"); }
TEST(lora_run_matches_peft_qwen3_moe_experts) { peft_match_run("qwen3moe-tiny-experts", "qwen3moe-tiny"); }
TEST(lora_run_matches_peft_olmoe_experts) { peft_match_run("olmoe-tiny-experts", "olmoe-tiny"); }

/* cached greedy decoding equals recomputing the whole sequence per token */
static void generate_vs_recompute(const char *name, int fmt)
{
    ft_model *m = load(name, fmt);
    REQUIRE(m);
    ft_train_params p;
    ft_train_params_default(&p);
    p.rank = 3;
    ft_trainer *t = NULL;
    CHECK_OK(ft_trainer_create(m, &p, &t));
    REQUIRE(t);
    size_t n = 0;
    float *w = ft_trainer_param_data(t, &n);
    fill(w, n, 0.2f);
    int32_t seq[32] = {1, 20, 30, 40, 50, 60, 70};
    int32_t out[12];
    CHECK_OK(ft_trainer_generate(t, seq, 7, 12, out));
    int V = ft_model_get_config(m)->vocab;
    float *lg = malloc(sizeof(float) * (size_t)V);
    for (int g = 0; g < 12; g++) {
        CHECK_OK(ft_trainer_last_logits(t, seq, 7 + g, lg));
        int best = 0;
        for (int v = 1; v < V; v++) if (lg[v] > lg[best]) best = v;
        CHECK_MSG(best == out[g], "%s token %d: cached %d, recomputed %d", name, g, (int)out[g], best);
        seq[7 + g] = best;
    }
    free(lg);
    ft_trainer_free(t);
    ft_model_free(m);
}

TEST(generate_cached_equals_recompute)
{
    generate_vs_recompute("llama-tiny", FT_WF_F32);
    generate_vs_recompute("mistral-sw", FT_WF_F32);   /* window 5 < 19 positions */
    generate_vs_recompute("qwen2-tiny", FT_WF_BF16);
    generate_vs_recompute("qwen3-sw", FT_WF_F32);     /* q/k norms, window 4 */
    generate_vs_recompute("opt-tiny", FT_WF_F32);     /* learned positions */
    generate_vs_recompute("opt-tiny-postln", FT_WF_F32);
    generate_vs_recompute("opt-tiny-proj", FT_WF_F32);
    generate_vs_recompute("phi3-sw", FT_WF_F32);      /* fused projections, a window */
    generate_vs_recompute("gemma2-tiny", FT_WF_F32);  /* soft-capping, sandwich norms */
    generate_vs_recompute("gemma3-tiny", FT_WF_F32);  /* local RoPE */
    generate_vs_recompute("mixtral-tiny", FT_WF_F32); /* experts */
}

TEST(seed_reproducible_and_init)
{
    ft_model *m = load("llama-tiny", FT_WF_F32);
    REQUIRE(m);
    ft_train_params p;
    ft_train_params_default(&p);
    p.seed = 9;
    p.total_steps = 2;
    p.lr = 1e-2f;
    ft_trainer *a = NULL, *b = NULL;
    CHECK_OK(ft_trainer_create(m, &p, &a));
    CHECK_OK(ft_trainer_create(m, &p, &b));
    REQUIRE(a && b);
    size_t n;
    float *wa = ft_trainer_param_data(a, &n), *wb = ft_trainer_param_data(b, &n);
    /* A uniform in +-1/sqrt(64) (q_proj's in = 64), B zero */
    CHECK(wa[0] != 0.0f && fabsf(wa[0]) <= 0.125f);
    int32_t tok[2 * 8];
    for (int i = 0; i < 16; i++) tok[i] = (int32_t)(i * 37 % 320);
    double la, lb;
    for (int s = 0; s < 2; s++) {
        CHECK_OK(ft_trainer_step(a, tok, 2, 8, &la, NULL));
        CHECK_OK(ft_trainer_step(b, tok, 2, 8, &lb, NULL));
        CHECK(la == lb);
    }
    CHECK(memcmp(wa, wb, n * sizeof(float)) == 0);
    ft_trainer_free(a);
    ft_trainer_free(b);
    ft_model_free(m);
}

/* threads split products, transposed products and attention heads; every
 * value is computed in the same order whatever the split */
static void threads_same(const char *name, int fmt)
{
    ft_model *m = load(name, fmt);
    REQUIRE(m);
    ft_train_params p;
    ft_train_params_default(&p);
    p.total_steps = 3;
    p.lr = 1e-2f;
    p.vocab_chunk = 96;
    ft_trainer *t[3] = {NULL, NULL, NULL};
    unsigned th[3] = {1, 2, 5};
    int32_t tok[3 * 40];
    for (int i = 0; i < 120; i++) tok[i] = (int32_t)((i * 101 + 3) % 320);
    for (int k = 0; k < 3; k++) {
        p.threads = th[k];
        CHECK_OK(ft_trainer_create(m, &p, &t[k]));
        REQUIRE(t[k]);
        for (int s = 0; s < 3; s++) CHECK_OK(ft_trainer_step(t[k], tok, 3, 40, NULL, NULL));
    }
    size_t n;
    float *a = ft_trainer_param_data(t[0], &n);
    for (int k = 1; k < 3; k++) {
        CHECK_MSG(memcmp(a, ft_trainer_param_data(t[k], &n), n * sizeof(float)) == 0, "%u threads differ", th[k]);
        ft_trainer_free(t[k]);
    }
    ft_trainer_free(t[0]);
    ft_model_free(m);
}

/* bf16 activations (FLEXTIER_BF16_ACTIVATIONS) on bf16 weights: the
 * trainer's bf16 GEMMs (engine/gemm_bf16.h, where the CPU has AVX512_BF16)
 * compute the same products as the engine's FT_WK_X_B16 path in another
 * order of sums: the loss and gradients agree closely (a last-bit
 * difference in an f32 sum can move a value's bf16 rounding, 2^-8
 * relative, before the next product: measured 7e-6 of the loss and 1.3e-3
 * of the largest gradient on this model); and they do not depend on the
 * thread count either. */
TEST(bf16_activations_gemm_matches_engine)
{
    int was = ft_wk_bf16_activations(), gw = ft_tr_gemm();
    ft_wk_set_bf16_activations(1);
    ft_model *m = load("llama-tiny", FT_WF_BF16);
    REQUIRE(m);
    ft_train_params p;
    ft_train_params_default(&p);
    p.rank = 4;
    p.vocab_chunk = 96;
    const int nb = 2, T = 40, V = ft_model_get_config(m)->vocab;
    int32_t tok[2 * 40];
    for (int i = 0; i < nb * T; i++) tok[i] = (int32_t)((i * 67 + 5) % V);
    double loss[2];
    float *g[2] = {NULL, NULL};
    size_t n = 0;
    for (int k = 0; k < 2; k++) {
        ft_tr_set_gemm(k == 0);
        ft_trainer *t = NULL;
        CHECK_OK(ft_trainer_create(m, &p, &t));
        REQUIRE(t);
        float *w = ft_trainer_param_data(t, &n), *gr = ft_trainer_grad_data(t, &n);
        seed = 99;
        fill(w, n, 0.3f);
        memset(gr, 0, n * sizeof(float));
        int64_t cnt;
        CHECK_OK(ft_trainer_loss_grad(t, tok, nb, T, 1.0, &loss[k], &cnt));
        g[k] = malloc(n * sizeof(float));
        REQUIRE(g[k]);
        memcpy(g[k], gr, n * sizeof(float));
        ft_trainer_free(t);
    }
    double gmax = 0.0, dmax = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (fabs(g[1][i]) > gmax) gmax = fabs(g[1][i]);
        if (fabs(g[0][i] - g[1][i]) > dmax) dmax = fabs(g[0][i] - g[1][i]);
    }
    printf("bf16 activations, %s vs the engine's products: loss %.9g vs %.9g, max |dg| %.3g of max |g| %.3g\n",
           ft_gb_simd() ? "gemm_bf16" : "(no AVX512_BF16: the engine's both times)", loss[0], loss[1], dmax, gmax);
    CHECK(fabs(loss[0] - loss[1]) <= 1e-4 * fabs(loss[1]));
    CHECK(gmax > 0.0 && dmax <= 1e-2 * gmax);
    free(g[0]), free(g[1]);
    ft_model_free(m);
    ft_tr_set_gemm(1);
    threads_same("llama-tiny", FT_WF_BF16);
    ft_tr_set_gemm(gw);
    ft_wk_set_bf16_activations(was);
}

TEST(threads_do_not_change_results)
{
    threads_same("llama-tiny", FT_WF_BF16);
    threads_same("mixtral-tiny", FT_WF_F32);   /* the experts' adapters too ("all") */
}

/* ------------------------------------------------ data-parallel steps */

/* An in-process communicator: one byte FIFO per ordered pair of ranks,
 * each rank a thread with its own trainer over the shared model. */
enum { DPN = 4 };
typedef struct fifo { unsigned char *b; size_t len, cap; } fifo;
typedef struct dpnet {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    fifo f[DPN][DPN];   /* [from][to] */
} dpnet;
typedef struct dprank {
    dpnet *net;
    int rank, size, steps, nb, T, A;
    ft_trainer *t;
    const int32_t *tok;
    double loss[8];
    ft_status st;
} dprank;

static ft_status dp_send_fn(void *user, int to, const void *buf, size_t len)
{
    dprank *r = user;
    fifo *f = &r->net->f[r->rank][to];
    pthread_mutex_lock(&r->net->mu);
    if (f->len + len > f->cap) {
        size_t c = f->cap ? f->cap : 256;
        while (c < f->len + len) c *= 2;
        unsigned char *p = realloc(f->b, c);
        if (!p) {
            pthread_mutex_unlock(&r->net->mu);
            return FT_ERR_NOMEM;
        }
        f->b = p;
        f->cap = c;
    }
    memcpy(f->b + f->len, buf, len);
    f->len += len;
    pthread_cond_broadcast(&r->net->cv);
    pthread_mutex_unlock(&r->net->mu);
    return FT_OK;
}

static ft_status dp_recv_fn(void *user, int from, void *buf, size_t len)
{
    dprank *r = user;
    fifo *f = &r->net->f[from][r->rank];
    pthread_mutex_lock(&r->net->mu);
    while (f->len < len) pthread_cond_wait(&r->net->cv, &r->net->mu);
    memcpy(buf, f->b, len);
    memmove(f->b, f->b + len, f->len - len);
    f->len -= len;
    pthread_mutex_unlock(&r->net->mu);
    return FT_OK;
}

static void *dp_main(void *arg)
{
    dprank *r = arg;
    ft_train_comm c = {r->rank, r->size, r, dp_send_fn, dp_recv_fn};
    size_t per = (size_t)r->A * (size_t)r->nb * (size_t)r->T;
    for (int s = 0; s < r->steps && !r->st; s++)
        r->st = ft_trainer_step_dp(r->t, &c, r->tok + (size_t)s * per, r->nb, r->T, &r->loss[s], NULL);
    return NULL;
}

/* the data-parallel tests' trainer settings: A micro-batches per step */
static void dp_params(ft_train_params *p, int A)
{
    ft_train_params_default(p);
    p->rank = 2;
    p->lr = 1e-2f;
    p->grad_accum = A;
    p->total_steps = 3;
    p->threads = 1;
    p->seed = 5;
}

static ft_trainer *dp_trainer(ft_model *m, int A)
{
    ft_train_params p;
    dp_params(&p, A);
    ft_trainer *t = NULL;
    if (ft_trainer_create(m, &p, &t)) return NULL;
    size_t n;
    float *w = ft_trainer_param_data(t, &n);
    uint64_t s = 99;
    for (size_t i = 0; i < n; i++) w[i] = (float)((double)(ft_test_rand(&s) >> 11) * 0x1p-53 - 0.5) * 0.2f;
    return t;
}

/* 1, 2, 3 and 4 processes (4 uneven over 6 micro-batches) give the losses
 * and the adapter of ft_trainer_step bit for bit */
TEST(data_parallel_equals_one_process)
{
    ft_model *m = load("llama-tiny", FT_WF_F32);
    REQUIRE(m);
    enum { A = 6, NB = 1, T = 9, STEPS = 3 };
    int32_t tok[STEPS * A * NB * T];
    for (size_t i = 0; i < sizeof tok / sizeof tok[0]; i++) tok[i] = (int32_t)(ft_test_rand(&seed) % 320u);
    ft_trainer *ref = dp_trainer(m, A);
    REQUIRE(ref);
    double want[STEPS];
    for (int s = 0; s < STEPS; s++) CHECK_OK(ft_trainer_step(ref, tok + s * A * NB * T, NB, T, &want[s], NULL));
    size_t n;
    const float *wref = ft_trainer_param_data(ref, &n);
    for (int N = 1; N <= DPN; N++) {
        dpnet net;
        memset(&net, 0, sizeof net);
        pthread_mutex_init(&net.mu, NULL);
        pthread_cond_init(&net.cv, NULL);
        dprank r[DPN];
        pthread_t th[DPN];
        for (int k = 0; k < N; k++) {
            r[k] = (dprank){&net, k, N, STEPS, NB, T, A, dp_trainer(m, A), tok, {0}, FT_OK};
            REQUIRE(r[k].t);
        }
        for (int k = 0; k < N; k++) REQUIRE(pthread_create(&th[k], NULL, dp_main, &r[k]) == 0);
        for (int k = 0; k < N; k++) pthread_join(th[k], NULL);
        for (int k = 0; k < N; k++) {
            CHECK_MSG(r[k].st == FT_OK, "N=%d rank %d: %s", N, k, ft_last_error());
            for (int s = 0; s < STEPS; s++)
                CHECK_MSG(r[k].loss[s] == want[s], "N=%d rank %d step %d: loss %.17g vs %.17g", N, k, s,
                          r[k].loss[s], want[s]);
            size_t nk;
            const float *wk = ft_trainer_param_data(r[k].t, &nk);
            CHECK_MSG(nk == n && memcmp(wk, wref, n * sizeof(float)) == 0, "N=%d rank %d: adapter differs", N, k);
            ft_trainer_free(r[k].t);
        }
        for (int a = 0; a < DPN; a++)
            for (int b = 0; b < DPN; b++) {
                CHECK(net.f[a][b].len == 0);   /* every message consumed */
                free(net.f[a][b].b);
            }
        pthread_mutex_destroy(&net.mu);
        pthread_cond_destroy(&net.cv);
    }
    printf("  data-parallel: N = 1..%d, losses %.6f %.6f %.6f equal bit for bit\n", DPN, want[0], want[1], want[2]);
    /* more processes than micro-batches is refused */
    ft_train_comm c = {0, A + 1, NULL, dp_send_fn, dp_recv_fn};
    double l;
    CHECK(ft_trainer_step_dp(ref, &c, tok, NB, T, &l, NULL) == FT_ERR_INVALID_ARG &&
          strstr(ft_last_error(), "at least one"));
    ft_trainer_free(ref);
    ft_model_free(m);
}

/* a rank whose micro-batch fails: every rank returns an error, none hangs */
TEST(data_parallel_failure_reaches_every_rank)
{
    ft_model *m = load("llama-tiny", FT_WF_F32);
    REQUIRE(m);
    enum { A = 2, NB = 1, T = 5 };
    int32_t tok[A * NB * T];
    for (int i = 0; i < A * NB * T; i++) tok[i] = i + 1;
    tok[A * NB * T - 1] = 100000;   /* rank 1's micro-batch: outside the vocabulary */
    dpnet net;
    memset(&net, 0, sizeof net);
    pthread_mutex_init(&net.mu, NULL);
    pthread_cond_init(&net.cv, NULL);
    dprank r[2];
    pthread_t th[2];
    for (int k = 0; k < 2; k++) {
        r[k] = (dprank){&net, k, 2, 1, NB, T, A, dp_trainer(m, A), tok, {0}, FT_OK};
        REQUIRE(r[k].t);
    }
    for (int k = 0; k < 2; k++) REQUIRE(pthread_create(&th[k], NULL, dp_main, &r[k]) == 0);
    for (int k = 0; k < 2; k++) pthread_join(th[k], NULL);
    CHECK(r[0].st == FT_ERR_INVALID_ARG && r[1].st == FT_ERR_INVALID_ARG);
    for (int k = 0; k < 2; k++) ft_trainer_free(r[k].t);
    for (int a = 0; a < DPN; a++)
        for (int b = 0; b < DPN; b++) free(net.f[a][b].b);
    pthread_mutex_destroy(&net.mu);
    pthread_cond_destroy(&net.cv);
    ft_model_free(m);
}

/* The layer function: the forward asks for 0..L-1, each call naming the
 * next layer (the last one the layer below it: the backward follows); the
 * backward asks for L-1..0 naming the layer below (0: layer 1, where the
 * next step's forward goes after 0); the weights it gives are used. */
typedef struct walk { const ft_model *m; int n, layer[64], next[64], bad; } walk;

static ft_status walk_fn(void *user, int layer, int next, ft_layer_weights *w)
{
    walk *k = user;
    if (k->n < 64) {
        k->layer[k->n] = layer;
        k->next[k->n] = next;
    }
    k->n++;
    *w = *ft_model_layer(k->m, layer);
    if (k->bad) ft_layer_weights_mat(w, LW_V)->rows--;
    return FT_OK;
}

TEST(layer_fn_walks_both_ways)
{
    ft_model *m = load("llama-tiny", FT_WF_BF16);
    REQUIRE(m);
    REQUIRE(ft_model_get_config(m)->n_layers == 2);
    ft_train_params p;
    ft_train_params_default(&p);
    p.total_steps = 2;
    p.lr = 1e-2f;
    int32_t tok[2 * 12];
    for (int i = 0; i < 24; i++) tok[i] = (int32_t)((i * 53 + 1) % 320);
    walk k = {m, 0, {0}, {0}, 0};
    p.layer_fn = walk_fn;
    p.layer_user = &k;
    ft_trainer *a = NULL, *b = NULL;
    CHECK_OK(ft_trainer_create(m, &p, &a));
    p.layer_fn = NULL;
    CHECK_OK(ft_trainer_create(m, &p, &b));
    REQUIRE(a && b);
    double la, lb;
    for (int s = 0; s < 2; s++) {
        CHECK_OK(ft_trainer_step(a, tok, 2, 12, &la, NULL));
        CHECK_OK(ft_trainer_step(b, tok, 2, 12, &lb, NULL));
        CHECK(la == lb);
    }
    static const int want_l[] = {0, 1, 1, 0}, want_n[] = {1, 0, 0, 1};
    CHECK(k.n == 8);
    for (int i = 0; i < 8 && i < k.n; i++)
        CHECK_MSG(k.layer[i] == want_l[i % 4] && k.next[i] == want_n[i % 4], "call %d: layer %d next %d", i,
                  k.layer[i], k.next[i]);
    /* a forward without backward (eval) wraps to layer 0 */
    k.n = 0;
    double ls;
    int64_t cnt;
    CHECK_OK(ft_trainer_eval(a, tok, 2, 12, &ls, &cnt));
    CHECK(k.n == 2 && k.next[0] == 1 && k.next[1] == 0);
    size_t n;
    const float *wa = ft_trainer_param_data(a, &n), *wb = ft_trainer_param_data(b, &n);
    CHECK(memcmp(wa, wb, n * sizeof(float)) == 0);
    /* a layer function giving a misshapen matrix is caught */
    k.bad = 1;
    CHECK(ft_trainer_step(a, tok, 2, 12, &la, NULL) == FT_ERR_CORRUPT && strstr(ft_last_error(), "v_proj"));
    ft_trainer_free(a);
    ft_trainer_free(b);
    ft_model_free(m);
}

/* saved activations in a mem: store: lossless codecs give recompute's
 * steps bit for bit; q8 is close; a store that cannot open is an error */
TEST(saved_activations_lossless_bit_exact)
{
    ft_model *m = load("mistral-sw", FT_WF_F32);
    REQUIRE(m);
    ft_train_params p;
    ft_train_params_default(&p);
    p.total_steps = 3;
    p.lr = 1e-2f;
    int32_t tok[2 * 12];
    for (int i = 0; i < 24; i++) tok[i] = (int32_t)((i * 29 + 5) % 320);
    ft_trainer *r = NULL, *t[3] = {NULL, NULL, NULL};
    CHECK_OK(ft_trainer_create(m, &p, &r));
    const int codecs[3] = {FT_CODEC_BYTEPLANE, FT_CODEC_RAW, FT_CODEC_Q8};
    p.act_uri = "mem:";
    for (int c = 0; c < 3; c++) {
        p.act_codec = codecs[c];
        CHECK_OK(ft_trainer_create(m, &p, &t[c]));
    }
    REQUIRE(r && t[0] && t[1] && t[2]);
    for (int s = 0; s < 3; s++) {
        double lr_, l[3];
        CHECK_OK(ft_trainer_step(r, tok, 2, 12, &lr_, NULL));
        for (int c = 0; c < 3; c++) CHECK_OK(ft_trainer_step(t[c], tok, 2, 12, &l[c], NULL));
        CHECK(l[0] == lr_ && l[1] == lr_);
        CHECK(fabs(l[2] - lr_) < 1e-2 * fabs(lr_));
    }
    size_t n;
    const float *w = ft_trainer_param_data(r, &n), *w0 = ft_trainer_param_data(t[0], &n),
                *w1 = ft_trainer_param_data(t[1], &n), *w2 = ft_trainer_param_data(t[2], &n);
    CHECK(memcmp(w, w0, n * sizeof(float)) == 0);
    CHECK(memcmp(w, w1, n * sizeof(float)) == 0);
    CHECK(memcmp(w, w2, n * sizeof(float)) != 0);
    ft_train_act_stats as;
    ft_trainer_act_stats(t[2], &as);
    CHECK(as.raw_bytes > 0 && as.stored_bytes > 0 && as.stored_bytes * 3 < as.raw_bytes / 3);
    ft_trainer_free(r);
    for (int c = 0; c < 3; c++) ft_trainer_free(t[c]);
    ft_trainer *x = NULL;
    p.act_codec = FT_CODEC_Q4;
    CHECK(ft_trainer_create(m, &p, &x) == FT_ERR_INVALID_ARG);
    p.act_codec = 0;
    p.act_uri = "nosuch:thing";
    CHECK(ft_trainer_create(m, &p, &x) != FT_OK && !x);
    ft_model_free(m);
}

/* A layer function over the model's own layers that streams the experts
 * of MoE layers on demand as the offloading scheduler does: the weights it
 * gives hold no expert until fetch_experts names it. */
typedef struct xwalk {
    const ft_model *m;
    int calls, fetches, fetched, bad_fetch;
    ft_wmat ex[3 * 64];
} xwalk;

static ft_status xwalk_fetch(void *user, int layer, const int *experts, int n, const float *x, int rows,
                             ft_layer_weights *w)
{
    xwalk *k = user;
    (void)x;
    const ft_layer_weights *src = ft_model_layer(k->m, layer);
    k->fetches++;
    if (rows < 1 || n < 1 || w->experts != k->ex) k->bad_fetch = 1;
    for (int i = 0; i < n; i++) {
        if (experts[i] < 0 || experts[i] >= src->n_experts || (i && experts[i] <= experts[i - 1])) {
            k->bad_fetch = 1;
            continue;
        }
        for (int j = 0; j < 3; j++) k->ex[3 * experts[i] + j] = src->experts[3 * experts[i] + j];
        k->fetched++;
    }
    return FT_OK;
}

static ft_status xwalk_fn(void *user, int layer, int next, ft_layer_weights *w)
{
    xwalk *k = user;
    (void)next;
    k->calls++;
    *w = *ft_model_layer(k->m, layer);
    if (w->experts) {
        if (w->n_experts > 64) return FT_ERR_UNSUPPORTED;
        memset(k->ex, 0, sizeof k->ex);
        w->experts = k->ex;
        w->fetch_experts = xwalk_fetch;
        w->fetch_user = k;
    }
    return FT_OK;
}

/* Every architecture: layers from a layer function (experts fetched on
 * demand) and activations saved to a mem: store (byte-plane) give the
 * in-memory, recomputing trainer's losses and adapter bit for bit, over
 * masked steps with gradient accumulation; a forward-only eval too. */
TEST(every_arch_streamed_and_saved)
{
    static const char *const names[] = {"llama-tiny", "qwen2-tiny", "mistral-sw", "qwen3-tiny", "qwen3-sw",
                                        "phi3-tiny", "gemma2-tiny", "gemma3-tiny", "mixtral-tiny", "qwen3moe-tiny",
                                        "olmoe-tiny", "opt-tiny", "opt-tiny-postln", "opt-tiny-proj"};
    for (size_t a = 0; a < sizeof names / sizeof names[0]; a++) {
        ft_model *m = load(names[a], FT_WF_F32);
        REQUIRE(m);
        const ft_model_config *c = ft_model_get_config(m);
        enum { NB = 2, T = 10, A = 2, STEPS = 2 };
        int32_t tok[STEPS * A * NB * T];
        uint8_t mask[STEPS * A * NB * T];
        for (size_t i = 0; i < sizeof tok / sizeof tok[0]; i++) {
            tok[i] = (int32_t)(ft_test_rand(&seed) % (uint64_t)c->vocab);
            mask[i] = (uint8_t)(i % 7 != 3);
        }
        ft_train_params p;
        ft_train_params_default(&p);
        p.rank = 4;
        p.lr = 1e-2f;
        p.grad_accum = A;
        p.total_steps = STEPS;
        p.seed = 3;
        ft_trainer *r = NULL, *s = NULL, *kp = NULL;
        CHECK_OK(ft_trainer_create(m, &p, &r));
        p.act_uri = "mem:";   /* raw in memory: kept by the trainer, no store */
        p.act_codec = FT_CODEC_RAW;
        CHECK_OK(ft_trainer_create(m, &p, &kp));
        p.act_codec = 0;
        xwalk *k = calloc(1, sizeof *k);
        REQUIRE(k);
        k->m = m;
        p.layer_fn = xwalk_fn;
        p.layer_user = k;
        p.act_uri = "mem:";
        CHECK_OK(ft_trainer_create(m, &p, &s));
        REQUIRE(r && s && kp);
        for (int st = 0; st < STEPS; st++) {
            double lr_, ls, lk;
            const size_t o = (size_t)st * A * NB * T;
            CHECK_OK(ft_trainer_step_masked(r, tok + o, mask + o, NB, T, &lr_, NULL));
            CHECK_OK(ft_trainer_step_masked(s, tok + o, mask + o, NB, T, &ls, NULL));
            CHECK_OK(ft_trainer_step_masked(kp, tok + o, mask + o, NB, T, &lk, NULL));
            CHECK_MSG(lr_ == ls && lr_ == lk, "%s step %d: loss %.17g / %.17g vs %.17g", names[a], st, ls, lk, lr_);
        }
        size_t n, n2, n3;
        const float *w = ft_trainer_param_data(r, &n), *w2 = ft_trainer_param_data(s, &n2),
                    *w3 = ft_trainer_param_data(kp, &n3);
        CHECK_MSG(n == n2 && memcmp(w, w2, n * sizeof(float)) == 0, "%s: adapter differs", names[a]);
        CHECK_MSG(n == n3 && memcmp(w, w3, n * sizeof(float)) == 0, "%s: adapter (kept) differs", names[a]);
        ft_train_act_stats ks;
        ft_trainer_act_stats(kp, &ks);
        CHECK(ks.raw_bytes > 0 && ks.stored_bytes > 0);
        double e1, e2;
        int64_t c1, c2;
        CHECK_OK(ft_trainer_eval(r, tok, NB, T, &e1, &c1));
        CHECK_OK(ft_trainer_eval(s, tok, NB, T, &e2, &c2));
        CHECK(e1 == e2 && c1 == c2);
        /* forward + backward per micro-batch, and the eval's forward */
        CHECK_MSG(k->calls == (STEPS * A * 2 + 1) * c->n_layers, "%s: %d layer calls", names[a], k->calls);
        if (c->n_experts) CHECK_MSG(k->fetches > 0 && k->fetched > 0 && !k->bad_fetch, "%s: fetches", names[a]);
        ft_train_act_stats as;
        ft_trainer_act_stats(s, &as);
        CHECK(as.raw_bytes > 0 && as.stored_bytes > 0);
        printf("  %s: %d layer calls, %d expert fetches; losses equal bit for bit\n", names[a], k->calls, k->fetches);
        ft_trainer_free(r);
        ft_trainer_free(s);
        ft_trainer_free(kp);
        free(k);
        ft_model_free(m);
    }
}

/* data-parallel ranks that stream their layers and save activations give
 * the in-memory one-process run bit for bit */
TEST(data_parallel_streamed_and_saved)
{
    static const char *const names[] = {"llama-tiny", "olmoe-tiny"};
    for (size_t a = 0; a < 2; a++) {
        ft_model *m = load(names[a], FT_WF_F32);
        REQUIRE(m);
        enum { A = 3, NB = 1, T = 9, STEPS = 2, N = 2 };
        int32_t tok[STEPS * A * NB * T];
        for (size_t i = 0; i < sizeof tok / sizeof tok[0]; i++)
            tok[i] = (int32_t)(ft_test_rand(&seed) % (uint64_t)ft_model_get_config(m)->vocab);
        ft_trainer *ref = dp_trainer(m, A);
        REQUIRE(ref);
        double want[STEPS];
        for (int s = 0; s < STEPS; s++) CHECK_OK(ft_trainer_step(ref, tok + s * A * NB * T, NB, T, &want[s], NULL));
        size_t n;
        const float *wref = ft_trainer_param_data(ref, &n);
        dpnet net;
        memset(&net, 0, sizeof net);
        pthread_mutex_init(&net.mu, NULL);
        pthread_cond_init(&net.cv, NULL);
        dprank r[N];
        pthread_t th[N];
        xwalk *k = calloc(N, sizeof *k);
        REQUIRE(k);
        for (int j = 0; j < N; j++) {
            k[j].m = m;
            ft_train_params p;
            dp_params(&p, A);
            p.layer_fn = xwalk_fn;
            p.layer_user = &k[j];
            p.act_uri = "mem:";
            ft_trainer *t = NULL;
            CHECK_OK(ft_trainer_create(m, &p, &t));
            REQUIRE(t);
            size_t nn;
            float *w = ft_trainer_param_data(t, &nn);
            uint64_t sd = 99;   /* dp_trainer's adapter */
            for (size_t i = 0; i < nn; i++) w[i] = (float)((double)(ft_test_rand(&sd) >> 11) * 0x1p-53 - 0.5) * 0.2f;
            r[j] = (dprank){&net, j, N, STEPS, NB, T, A, t, tok, {0}, FT_OK};
        }
        for (int j = 0; j < N; j++) REQUIRE(pthread_create(&th[j], NULL, dp_main, &r[j]) == 0);
        for (int j = 0; j < N; j++) pthread_join(th[j], NULL);
        for (int j = 0; j < N; j++) {
            CHECK_MSG(r[j].st == FT_OK, "%s rank %d: %s", names[a], j, ft_last_error());
            for (int s = 0; s < STEPS; s++) CHECK(r[j].loss[s] == want[s]);
            size_t nk;
            const float *wk = ft_trainer_param_data(r[j].t, &nk);
            CHECK_MSG(nk == n && memcmp(wk, wref, n * sizeof(float)) == 0, "%s rank %d: adapter differs", names[a], j);
            CHECK(k[j].calls > 0);
            ft_trainer_free(r[j].t);
        }
        for (int x = 0; x < DPN; x++)
            for (int y = 0; y < DPN; y++) free(net.f[x][y].b);
        pthread_mutex_destroy(&net.mu);
        pthread_cond_destroy(&net.cv);
        free(k);
        ft_trainer_free(ref);
        ft_model_free(m);
    }
}

/* the embeddings or LM head read from the checkpoint on demand: refused */
TEST(streamed_globals_refused)
{
    char dir[1024];
    ft_fixture_dir("models", "llama-tiny", dir, sizeof dir);
    ft_load_params lp;
    ft_load_params_default(&lp);
    lp.stream_globals = FT_STREAM_EMBED | FT_STREAM_LM_HEAD;
    ft_model *m = NULL;
    CHECK_OK(ft_model_load(dir, &lp, &m));
    REQUIRE(m);
    ft_train_params p;
    ft_train_params_default(&p);
    ft_trainer *t = NULL;
    CHECK(ft_trainer_create(m, &p, &t) == FT_ERR_UNSUPPORTED && !t && strstr(ft_last_error(), "LM head"));
    ft_model_free(m);
}

TEST(refusals)
{
    unsigned mask0 = 0;
    ft_model *m = load("llama-tiny", FT_WF_F32), *opt = load("opt-tiny", FT_WF_F32);
    REQUIRE(m && opt);
    ft_train_params p;
    ft_train_params_default(&p);
    ft_trainer *t = NULL;
    /* architectures not implemented, by name */
    /* each family's PEFT names */
    p.targets = FT_LORA_Q | FT_LORA_O;
    CHECK(ft_trainer_create(opt, &p, &t) == FT_ERR_INVALID_ARG && strstr(ft_last_error(), "o_proj"));
    p.targets = FT_LORA_Q | FT_LORA_FC1;
    CHECK(ft_trainer_create(m, &p, &t) == FT_ERR_INVALID_ARG && strstr(ft_last_error(), "fc1"));
    p.targets = FT_LORA_QKV;
    CHECK(ft_trainer_create(m, &p, &t) == FT_ERR_INVALID_ARG && strstr(ft_last_error(), "qkv_proj"));
    ft_model *phi = load("phi3-tiny", FT_WF_F32);
    REQUIRE(phi);
    p.targets = FT_LORA_Q;
    CHECK(ft_trainer_create(phi, &p, &t) == FT_ERR_INVALID_ARG && strstr(ft_last_error(), "phi3 has no module q_proj"));
    ft_model_free(phi);
    p.targets = FT_LORA_ALL;
    /* MoE: the experts' gate and up are one fused parameter (transformers 5,
     * PEFT's target_parameters gate_up_proj); separate gate/up are refused */
    ft_model *moe = load("qwen3moe-tiny", FT_WF_F32);
    REQUIRE(moe);
    p.targets = FT_LORA_Q | FT_LORA_UP;
    CHECK(ft_trainer_create(moe, &p, &t) == FT_ERR_UNSUPPORTED && strstr(ft_last_error(), "gate_up_proj"));
    p.targets = FT_LORA_Q | FT_LORA_FC1;
    CHECK(ft_trainer_create(moe, &p, &t) == FT_ERR_INVALID_ARG && strstr(ft_last_error(), "fc1"));
    /* PEFT's ParamWrapper has no dropout */
    p.targets = FT_LORA_EXP_DOWN;
    p.dropout = 0.1f;
    CHECK(ft_trainer_create(moe, &p, &t) == FT_ERR_UNSUPPORTED && strstr(ft_last_error(), "dropout"));
    p.targets = FT_LORA_Q;   /* dropout on the attention of an MoE model is fine */
    CHECK_OK(ft_trainer_create(moe, &p, &t));
    ft_trainer_free(t);
    t = NULL;
    p.dropout = 0.0f;
    /* gate_up_proj / down_proj on an MoE model mean the experts' */
    p.targets = FT_LORA_GATE_UP | FT_LORA_DOWN;
    CHECK_OK(ft_trainer_create(moe, &p, &t));
    CHECK(ft_tr_params(t)->targets == (FT_LORA_EXP_GATE_UP | FT_LORA_EXP_DOWN));
    ft_trainer_free(t);
    t = NULL;
    /* an attention-only adapter is refused by an experts trainer (target_parameters differ) */
    char xd[1024], xs[1200];
    ft_fixture_dir("lora", "qwen3moe-tiny", xd, sizeof xd);
    snprintf(xs, sizeof xs, "%s/init", xd);
    p.rank = 4;
    p.alpha = 8.0f;
    p.targets = FT_LORA_ALL;
    CHECK_OK(ft_trainer_create(moe, &p, &t));
    CHECK(ft_trainer_load_adapter(t, xs) == FT_ERR_INVALID_ARG && strstr(ft_last_error(), "differ"));
    ft_trainer_free(t);
    t = NULL;
    p.rank = 8;
    p.alpha = 16.0f;
    ft_model_free(moe);
    /* the experts' names on a dense model; qwen2_moe's shared expert */
    p.targets = FT_LORA_EXP_GATE_UP;
    CHECK(ft_trainer_create(m, &p, &t) == FT_ERR_INVALID_ARG && strstr(ft_last_error(), "mixture-of-experts"));
    p.targets = FT_LORA_ALL;
    ft_model *q2 = load("qwen2moe-tiny", FT_WF_F32);
    REQUIRE(q2);
    CHECK(ft_trainer_create(q2, &p, &t) == FT_ERR_UNSUPPORTED && strstr(ft_last_error(), "shared expert"));
    ft_model_free(q2);
    CHECK_OK(ft_lora_parse_targets("experts.gate_up_proj,experts.down_proj", &mask0));
    CHECK(mask0 == (FT_LORA_EXP_GATE_UP | FT_LORA_EXP_DOWN));
    p.dropout = 1.0f;
    CHECK(ft_trainer_create(m, &p, &t) == FT_ERR_INVALID_ARG && strstr(ft_last_error(), "dropout"));
    p.dropout = -0.1f;
    CHECK(ft_trainer_create(m, &p, &t) == FT_ERR_INVALID_ARG && strstr(ft_last_error(), "dropout"));
    p.dropout = 0.0f;
    p.rank = 0;
    CHECK(ft_trainer_create(m, &p, &t) == FT_ERR_INVALID_ARG);
    p.rank = 8;
    p.lr = -1.0f;
    CHECK(ft_trainer_create(m, &p, &t) == FT_ERR_INVALID_ARG);
    p.lr = 1e-3f;
    p.warmup = 5;
    CHECK(ft_trainer_create(m, &p, &t) == FT_ERR_INVALID_ARG && strstr(ft_last_error(), "warmup"));
    p.warmup = 0;
    unsigned mask;
    CHECK(ft_lora_parse_targets("q_proj,fc3", &mask) == FT_ERR_INVALID_ARG && strstr(ft_last_error(), "fc3"));
    CHECK_OK(ft_lora_parse_targets("q_proj,fc1", &mask));
    CHECK(mask == (FT_LORA_Q | FT_LORA_FC1));
    CHECK_OK(ft_lora_parse_targets("q_proj,v_proj", &mask));
    CHECK(mask == (FT_LORA_Q | FT_LORA_V));
    CHECK_OK(ft_trainer_create(m, &p, &t));
    REQUIRE(t);
    int32_t tok[4] = {1, 2, 999, 3};
    double l;
    CHECK(ft_trainer_step(t, tok, 1, 4, &l, NULL) == FT_ERR_INVALID_ARG && strstr(ft_last_error(), "999"));
    CHECK(ft_trainer_step(t, tok, 1, 1, &l, NULL) == FT_ERR_INVALID_ARG);
    /* an adapter of another rank is refused */
    char dir[1024], sub[1200];
    ft_fixture_dir("lora", "llama-tiny", dir, sizeof dir);
    snprintf(sub, sizeof sub, "%s/init", dir);
    CHECK(ft_trainer_load_adapter(t, sub) == FT_ERR_INVALID_ARG && strstr(ft_last_error(), "r differs"));
    CHECK(ft_trainer_load_adapter(t, "/nonexistent") == FT_ERR_NOT_FOUND);
    ft_trainer_free(t);
    ft_model_free(m);
    ft_model_free(opt);
}
