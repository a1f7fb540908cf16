/* The engine computing on weights as stored (bf16, f16, q8, q4) and on a
 * bf16/f16 KV cache, against the exact f32 engine on every fixture model
 * (every directory of tests/data/models/, the transformers checkpoints
 * of test_engine_fixtures.c, sliding-window ones included).
 *
 * Measure: relative RMS of the logits, rms(got - f32) / rms(f32), over
 * every position of the three prompts (one batch of mixed lengths) and 9
 * decode steps fed the f32 run's greedy tokens (so that the cache, rings
 * of windowed layers included, is read back); and the greedy
 * continuation (10 tokens per prompt). Bounds (about twice the
 * largest value measured over the fixtures, which have random weights of
 * std 0.15, larger than trained models'):
 *   bf16 / f16 weights (f32 activations in decode, exact products):
 *       the checkpoints are f32, so this is the rounding of every weight:
 *       bf16 <= 0.02, f16 <= 0.004; greedy tokens identical for bf16
 *       weights on the bf16 checkpoint (exact conversion) and the cache in
 *       bf16 too.
 *   q8 weights <= 0.05, q4 weights <= 0.6 (gemma3-tiny measures 0.44; group 32/64 along rows,
 *       activations quantized to int8 per group),
 *   bf16 KV cache (f32 weights) <= 0.01, f16 KV <= 0.002.
 * Mixture-of-experts models (mixtral, qwen3_moe, olmoe) have their own
 * bounds: a perturbation that flips the router's choice in a near tie
 * sends that row through another expert, a discontinuous change no
 * rounding bound covers; measured on the fixtures (random routers, so
 * near ties are common): bf16 0.039, f16 0.038, q8 0.087, q4 0.44, bf16
 * KV 0.071, f16 KV 4.3e-4; bounds about twice that: 0.08, 0.08, 0.18,
 * 0.9, 0.15, 0.002.
 * The measured values are printed. */
#include "ft_test.h"
#include "flextier/engine.h"
#include "support/fixture.h"

#include <math.h>


/* Every fixture model directory (sorted), sliding-window ones included. */
static const char (*models)[256];
static size_t n_models;

static void list_models(void)
{
    if (!models) models = ft_fixture_models(&n_models);
}

/* Fixed prompts (token ids below every fixture's vocab of >= 256). */
static const int32_t P0[] = {1, 15, 27, 99, 4, 200, 13};
static const int32_t P1[] = {3, 8, 250};
static const int32_t P2[] = {17, 5, 5, 61, 77, 120, 7, 9, 31, 44, 2, 100};
static const int32_t *const prompts[3] = {P0, P1, P2};
static const size_t plens[3] = {7, 3, 12};
#define GEN 10

typedef struct {
    float *logits;      /* every prompt position, then each decode step's 3 rows */
    size_t n;
    int32_t greedy[3][GEN];
} result;

/* forced: the tokens fed at decode steps (teacher forcing with another
 * run's greedy tokens, so that every step's logits compare); NULL: the
 * run's own greedy tokens. */
static int run(const char *name, int weights, ft_dtype kv, int32_t (*forced)[GEN], result *r, ft_wfmt *fmt_out)
{
    char dir[512];
    const char *data = getenv("FT_TEST_DATA");
    snprintf(dir, sizeof dir, "%s/models/%s", data ? data : "tests/data", name);
    ft_load_params lp = {0};
    lp.weights = weights;
    ft_model *m = NULL;
    ft_status st = ft_model_load(dir, &lp, &m);
    if (st) { fprintf(stderr, "  %s: load: %s\n", name, ft_last_error()); return 0; }
    if (fmt_out) *fmt_out = ft_model_weights_format(m);
    int V = ft_model_get_config(m)->vocab;
    size_t rows = plens[0] + plens[1] + plens[2];
    int32_t pr[3][12];
    for (int i = 0; i < 3; i++)
        for (size_t k = 0; k < plens[i]; k++) pr[i][k] = prompts[i][k] % V;
    ft_ctx_params cp = {.max_batch = 3, .max_seq = 32, .max_rows = (int)rows, .all_logits = 1, .threads = 2,
                        .kv_dtype = kv};
    ft_ctx *c = NULL;
    if ((st = ft_ctx_create(m, &cp, &c))) { ft_model_free(m); return 0; }
    r->n = (rows + 3 * (GEN - 1)) * (size_t)V;
    r->logits = malloc(r->n * sizeof(float));
    float *lg = malloc(rows * (size_t)V * sizeof(float));
    int slots[3] = {0, 1, 2};
    const int32_t *tp[3] = {pr[0], pr[1], pr[2]};
    size_t nt[3] = {plens[0], plens[1], plens[2]};
    st = ft_ctx_forward(c, 3, slots, tp, nt, r->logits, 1);
    int32_t cur[3];
    for (int i = 0; i < 3 && !st; i++) {
        size_t off = 0;
        for (int k = 0; k <= i; k++) off += plens[k];
        const float *row = r->logits + (off - 1) * (size_t)V;
        int32_t best = 0;
        for (int v = 1; v < V; v++) if (row[v] > row[best]) best = v;
        cur[i] = r->greedy[i][0] = best;
    }
    for (int s = 1; s < GEN && !st; s++) {
        for (int i = 0; i < 3; i++) {
            if (forced) cur[i] = forced[i][s - 1];
            tp[i] = &cur[i];
            nt[i] = 1;
        }
        st = ft_ctx_forward(c, 3, slots, tp, nt, lg, 0);
        if (!st) memcpy(r->logits + (rows + 3 * (size_t)(s - 1)) * (size_t)V, lg, 3 * (size_t)V * sizeof(float));
        for (int i = 0; i < 3 && !st; i++) {
            const float *row = lg + (size_t)i * V;
            int32_t best = 0;
            for (int v = 1; v < V; v++) if (row[v] > row[best]) best = v;
            cur[i] = r->greedy[i][s] = best;
        }
    }
    free(lg);
    ft_ctx_free(c);
    ft_model_free(m);
    if (st) { fprintf(stderr, "  %s: forward: %s\n", name, ft_last_error()); free(r->logits); return 0; }
    return 1;
}

static double rel_rms(const float *a, const float *ref, size_t n)
{
    double se = 0, sr = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)ref[i];
        se += d * d;
        sr += (double)ref[i] * ref[i];
    }
    return sr > 0 ? sqrt(se / sr) : sqrt(se);
}

static int is_moe(const char *name)
{
    char dir[512];
    const char *data = getenv("FT_TEST_DATA");
    snprintf(dir, sizeof dir, "%s/models/%s", data ? data : "tests/data", name);
    ft_model_config c;
    return ft_model_config_load(dir, &c) == FT_OK && c.n_experts > 0;
}

static void check_format(int weights, ft_dtype kv, double dense_bound, double moe_bound, int greedy_same)
{
    double worst = 0;
    list_models();
    REQUIRE(n_models >= 8 && n_models <= FT_FIXTURE_MAX_MODELS);
    for (size_t k = 0; k < n_models; k++) {
        result ref, got;
        int ok_ref = run(models[k], FT_WF_F32, FT_F32, NULL, &ref, NULL);
        REQUIRE(ok_ref);
        ft_wfmt f = FT_WF_F32;
        int ok = run(models[k], weights, kv, ref.greedy, &got, &f);
        CHECK_MSG(ok, "%s", models[k]);
        if (!ok) { free(ref.logits); continue; }
        double e = rel_rms(got.logits, ref.logits, ref.n);
        double bound = is_moe(models[k]) ? moe_bound : dense_bound;
        if (e > worst) worst = e;
        printf("  %-22s weights %-4s kv %-4s: logits relative RMS %.2e\n", models[k], ft_wfmt_name(f),
               ft_dtype_name(kv), e);
        CHECK_MSG(e <= bound, "%s: relative RMS %g > %g", models[k], e, bound);
        if (greedy_same) {
            result own;
            if (run(models[k], weights, kv, NULL, &own, NULL)) {
                CHECK_MSG(!memcmp(own.greedy, ref.greedy, sizeof ref.greedy), "%s: greedy tokens differ", models[k]);
                free(own.logits);
            }
        }
        free(ref.logits);
        free(got.logits);
    }
    printf("  worst relative RMS %.2e (bounds %.2e dense, %.2e MoE)\n", worst, dense_bound, moe_bound);
}

TEST(weights_bf16) { check_format(FT_WF_BF16, FT_F32, 0.02, 0.08, 0); }
TEST(weights_f16) { check_format(FT_WF_F16, FT_F32, 0.004, 0.08, 0); }
TEST(weights_q8) { check_format(FT_WF_Q8, FT_F32, 0.05, 0.18, 0); }
TEST(weights_q4) { check_format(FT_WF_Q4, FT_F32, 0.6, 0.9, 0); }
TEST(kv_bf16) { check_format(FT_WF_F32, FT_BF16, 0.01, 0.15, 0); }
TEST(kv_f16) { check_format(FT_WF_F32, FT_F16, 0.002, 0.002, 0); }

/* The bf16 checkpoint kept as stored: bf16 weights are exactly the f32
 * engine's weights, so only the order of summation differs (and the bf16
 * cache's rounding): the greedy continuation is the same. */
TEST(bf16_checkpoint_as_stored)
{
    result ref, got;
    int ok_ref = run("llama-tiny-bf16", FT_WF_F32, FT_F32, NULL, &ref, NULL);
    REQUIRE(ok_ref);
    ft_wfmt f = FT_WF_F32;
    int ok = run("llama-tiny-bf16", FT_WEIGHTS_AS_STORED, FT_BF16, NULL, &got, &f);
    REQUIRE(ok);
    CHECK(f == FT_WF_BF16);
    double e = rel_rms(got.logits, ref.logits, ref.n);
    printf("  llama-tiny-bf16 as stored (bf16 weights, bf16 cache): relative RMS %.2e\n", e);
    CHECK(e <= 0.01);
    CHECK(!memcmp(got.greedy, ref.greedy, sizeof ref.greedy));
    free(ref.logits);
    free(got.logits);
    /* a mixture of experts on its bf16 checkpoint, computed in bf16 with
     * the grouped expert products: the same routes, so within summation
     * order of the f32 engine (measured 5e-7) and the same tokens */
    ok_ref = run("qwen3moe-bf16", FT_WF_F32, FT_F32, NULL, &ref, NULL);
    REQUIRE(ok_ref);
    ok = run("qwen3moe-bf16", FT_WEIGHTS_AS_STORED, FT_F32, NULL, &got, &f);
    REQUIRE(ok);
    CHECK(f == FT_WF_BF16);
    e = rel_rms(got.logits, ref.logits, ref.n);
    printf("  qwen3moe-bf16 as stored (bf16 weights and experts): relative RMS %.2e\n", e);
    CHECK(e <= 1e-5);
    CHECK(!memcmp(got.greedy, ref.greedy, sizeof ref.greedy));
    free(ref.logits);
    free(got.logits);
}

/* Conversions between formats in memory: q4 of a model equals q4 of the
 * same model converted to bf16 first only up to bf16 rounding; the
 * stored bytes shrink as the formats say. */
TEST(convert_and_sizes)
{
    char dir[512];
    const char *data = getenv("FT_TEST_DATA");
    snprintf(dir, sizeof dir, "%s/models/llama-tiny", data ? data : "tests/data");
    ft_model *m = NULL, *b = NULL, *q = NULL;
    CHECK_OK(ft_model_load(dir, NULL, &m));
    REQUIRE(m);
    CHECK_OK(ft_model_convert(m, FT_WF_BF16, &b));
    CHECK_OK(ft_model_convert(m, FT_WF_Q4, &q));
    REQUIRE(b && q);
    uint64_t wf = ft_model_layer_bytes(m), wb = ft_model_layer_bytes(b), wq = ft_model_layer_bytes(q);
    printf("  llama-tiny layer bytes: f32 %llu, bf16 %llu, q4 %llu\n", (unsigned long long)wf,
           (unsigned long long)wb, (unsigned long long)wq);
    CHECK(wb < wf * 0.55 && wq < wb * 0.8);   /* ffn 172 has no group: down_proj stays bf16 */
    CHECK(ft_model_weights_format(q) == FT_WF_Q4 && ft_model_weights_format(b) == FT_WF_BF16);
    /* a q4 matrix has no plain view */
    ft_tensor v;
    const char *name = NULL;
    int unsupported = 0;
    for (size_t i = 0; i < ft_model_tensor_count(q); i++)
        if (ft_model_tensor(q, i, &name, &v) == FT_ERR_UNSUPPORTED) unsupported++;
    CHECK(unsupported > 0);
    ft_model_free(m);
    ft_model_free(b);
    ft_model_free(q);
}

TEST(bad_formats)
{
    char dir[512];
    const char *data = getenv("FT_TEST_DATA");
    snprintf(dir, sizeof dir, "%s/models/llama-tiny", data ? data : "tests/data");
    ft_load_params lp = {0};
    lp.weights = 9;
    ft_model *m = NULL;
    CHECK(ft_model_load(dir, &lp, &m) == FT_ERR_INVALID_ARG && !m);
    CHECK_OK(ft_model_load(dir, NULL, &m));
    REQUIRE(m);
    ft_ctx *c = NULL;
    ft_ctx_params cp = {.max_batch = 1, .max_seq = 8, .kv_dtype = FT_I8};
    CHECK(ft_ctx_create(m, &cp, &c) == FT_ERR_INVALID_ARG && !c);
    cp.kv_dtype = FT_BF16;
    cp.external_kv = 1;
    CHECK(ft_ctx_create(m, &cp, &c) == FT_ERR_INVALID_ARG && !c);
    cp.external_kv = 0;
    CHECK_OK(ft_ctx_create(m, &cp, &c));
    float *k = NULL;
    CHECK(ft_ctx_kv(c, 0, 0, &k, NULL, NULL, NULL) == FT_ERR_UNSUPPORTED);
    ft_ctx_free(c);
    ft_model_free(m);
}
