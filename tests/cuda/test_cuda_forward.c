/* The CUDA forward pass against the CPU engine and transformers.
 *
 * Tolerances (docs/cuda.md, "Tolerances"):
 *  - f32 weights (f32 cuBLAS GEMMs, no TF32): every logit of the eight
 *    fixture models within 1e-3 absolute of transformers (the CPU engine:
 *    1e-4, measured 4.8e-6; the GPU sums in a different order), greedy
 *    continuations identical to transformers', and within 1e-3 relative of
 *    the CPU engine on larger synthetic models (long contexts, GQA,
 *    head_dim 128, OPT positions).
 *  - bf16 weights (the default): the reference is the CPU engine on the
 *    same model with every matrix rounded to bf16 (exactly what the GPU
 *    holds); the remaining difference is the bf16 rounding of GEMM inputs
 *    (2^-9 relative per element), so each row of logits must be within
 *    6e-2 * max(1, max |row|) (the CPU emulation of FT_CUDA=FAKE, which
 *    rounds GEMM inputs the same way, measured up to 2.1e-2 on the
 *    fixtures); greedy tokens must be identical at every
 *    step where the CPU's top-2 margin exceeds twice that bound.
 *  - streamed weights == resident weights: raw and byteplane (lossless)
 *    against the resident context on the same model; q8/q4 against the
 *    resident context on a model holding the CPU-dequantized weights
 *    (the GPU dequantizes bit for bit as the CPU): logits within 1e-5
 *    relative (identical unless cuBLAS picks a different algorithm;
 *    reported).
 * Skipped (exit 77) without a device. */
#include "cuda_test_util.h"
#include "support/fixture.h"
#include "flextier/engine.h"

CUDA_TEST_REQUIRE_DEVICE

#define MAXP FT_FIXTURE_MAXP

/* ------------------------------------------------------------ helpers */

/* max over rows of max|a - b| / max(1, max|b|) */
static float row_rel_err(const float *a, const float *b, size_t rows, size_t V)
{
    float worst = 0;
    for (size_t r = 0; r < rows; r++) {
        float mx = 1.0f;
        for (size_t i = 0; i < V; i++) mx = fmaxf(mx, fabsf(b[r * V + i]));
        float e = ft_max_abs_diff(a + r * V, b + r * V, V) / mx;
        if (!(e <= worst)) worst = e;
    }
    return worst;
}

static int argmax_row(const float *x, int V, float *margin)
{
    int b = 0;
    for (int v = 1; v < V; v++) if (x[v] > x[b]) b = v;
    float second = -INFINITY;
    for (int v = 0; v < V; v++) if (v != b && x[v] > second) second = x[v];
    if (margin) *margin = x[b] - second;
    return b;
}

/* Round every matrix (2-D tensor) of the model to bf16 in place: what the
 * GPU holds in its default mode. Vectors stay f32 there too. layers_only:
 * just the layers' matrices (what raw host weights hold as bf16). */
static void round_some_bf16(ft_model *m, int layers_only)
{
    for (size_t i = 0; i < ft_model_tensor_count(m); i++) {
        const char *name;
        ft_tensor t;
        uint64_t n;
        if (ft_model_tensor(m, i, &name, &t) || t.ndim != 2 || !t.data) continue;
        if (layers_only && !strstr(name, "layers.")) continue;
        ft_tensor_numel(&t, &n);
        float *p = t.data;
        for (uint64_t k = 0; k < n; k++) p[k] = ft_bf16_to_f32_1(ft_f32_to_bf16_1(p[k]));
    }
}

static void round_matrices_bf16(ft_model *m) { round_some_bf16(m, 0); }

/* A random model from a config.json text: matrices N(0, std), norm
 * weights 1 +- 0.2, other vectors +- 0.1 (every term matters). */
static ft_model *make_model(const char *json, uint64_t seed, float std)
{
    ft_model_config cfg;
    ft_model *m = NULL;
    if (ft_model_config_parse(json, strlen(json), "test config", &cfg) || ft_model_create(&cfg, &m)) {
        fprintf(stderr, "  make_model: %s\n", ft_last_error());
        return NULL;
    }
    uint64_t s = seed;
    for (size_t i = 0; i < ft_model_tensor_count(m); i++) {
        const char *name;
        ft_tensor t;
        uint64_t n;
        ft_model_tensor(m, i, &name, &t);
        ft_tensor_numel(&t, &n);
        float *p = t.data;
        int normw = strstr(name, "norm") && strstr(name, ".weight");
        for (uint64_t k = 0; k < n; k++)
            p[k] = t.ndim == 2 ? (float)(std * ft_rand_gauss(&s))
                   : normw     ? 1.0f + 0.2f * ut_uniform(&s)
                               : 0.1f * ut_uniform(&s);
    }
    return m;
}

static const char LLAMA5[] =
    "{\"model_type\":\"llama\",\"hidden_size\":128,\"intermediate_size\":256,\"num_hidden_layers\":5,"
    "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"vocab_size\":500,\"max_position_embeddings\":512,"
    "\"rms_norm_eps\":1e-5,\"rope_theta\":10000.0,\"hidden_act\":\"silu\",\"tie_word_embeddings\":false,"
    "\"bos_token_id\":1,\"eos_token_id\":2}";
/* head_dim 128, one KV head, llama3 rope scaling, biases */
static const char LLAMA_HD128[] =
    "{\"model_type\":\"llama\",\"hidden_size\":256,\"intermediate_size\":384,\"num_hidden_layers\":3,"
    "\"num_attention_heads\":2,\"num_key_value_heads\":1,\"vocab_size\":700,\"max_position_embeddings\":1024,"
    "\"rms_norm_eps\":1e-6,\"rope_theta\":500000.0,\"hidden_act\":\"silu\",\"tie_word_embeddings\":true,"
    "\"attention_bias\":true,\"mlp_bias\":true,"
    "\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8.0,\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,"
    "\"original_max_position_embeddings\":128},\"bos_token_id\":1,\"eos_token_id\":2}";
static const char OPT3[] =
    "{\"model_type\":\"opt\",\"hidden_size\":96,\"ffn_dim\":200,\"num_hidden_layers\":3,\"num_attention_heads\":4,"
    "\"vocab_size\":400,\"max_position_embeddings\":512,\"word_embed_proj_dim\":96,\"do_layer_norm_before\":true,"
    "\"activation_function\":\"relu\",\"enable_bias\":true,\"layer_norm_elementwise_affine\":true,"
    "\"tie_word_embeddings\":true,\"bos_token_id\":2,\"eos_token_id\":2,\"pad_token_id\":1}";

static ft_cuda_ctx *gpu(const ft_model *m, int B, int S, int R, int all, int f32, ft_cuda_weight_hook hook, void *user)
{
    ft_cuda_ctx_params p;
    memset(&p, 0, sizeof p);
    p.max_batch = B;
    p.max_seq = S;
    p.max_rows = R;
    p.all_logits = all;
    p.f32_weights = f32;
    p.stream_weights = hook != NULL;
    p.hook = hook;
    p.hook_user = user;
    ft_cuda_ctx *c = NULL;
    if (ft_cuda_ctx_create(m, &p, &c)) fprintf(stderr, "  ft_cuda_ctx_create: %s\n", ft_last_error());
    return c;
}

static ft_ctx *cpu(const ft_model *m, int B, int S, int R, int all)
{
    ft_ctx_params p = {.max_batch = B, .max_seq = S, .max_rows = R, .all_logits = all, .threads = 2};
    ft_ctx *c = NULL;
    if (ft_ctx_create(m, &p, &c)) fprintf(stderr, "  ft_ctx_create: %s\n", ft_last_error());
    return c;
}

/* ------------------------------------------- fixtures, f32 and bf16 */

static const char *const FIXTURES[] = {"opt-tiny", "opt-tiny-proj", "opt-tiny-postln", "llama-tiny",
                                       "llama-tiny-tied-rope3", "llama-tiny-bf16", "mistral-tiny", "qwen2-tiny"};

/* f32 weights: the GPU against transformers' own logits and greedy tokens,
 * and a chunked prefill in another slot order. */
static void fixture_f32(const char *name)
{
    char dir[512];
    ft_fixture_dir("models", name, dir, sizeof dir);
    ft_fixture f;
    int loaded = ft_fixture_load(dir, &f);
    REQUIRE(loaded);
    ft_model *m = NULL;
    CHECK_OK(ft_model_load(dir, NULL, &m));
    REQUIRE(m);
    int V = ft_model_get_config(m)->vocab;
    size_t rows = 0;
    for (int i = 0; i < f.np; i++) rows += f.plen[i];
    REQUIRE(rows * (size_t)V == f.nlogits);
    ft_cuda_ctx *c = gpu(m, f.np, 64, (int)rows, 1, 1, NULL, NULL);
    REQUIRE(c);
    float *lg = malloc(rows * (size_t)V * sizeof(float));
    int slots[MAXP];
    const int32_t *tp[MAXP];
    size_t nt[MAXP];
    for (int i = 0; i < f.np; i++) { slots[i] = i; tp[i] = f.prompt[i]; nt[i] = f.plen[i]; }
    CHECK_OK(ft_cuda_ctx_forward(c, (size_t)f.np, slots, tp, nt, lg, 1));
    float d = ft_max_abs_diff(lg, f.logits, rows * (size_t)V);
    CHECK_MSG(d <= 1e-3f, "%s f32: prefill logits max |diff| vs transformers = %g", name, d);
    printf("  %s f32: max |logit diff| vs transformers %.3g\n", name, d);
    /* greedy decode as a batch, the device argmax */
    int32_t cur[MAXP], gen[MAXP][32];
    size_t off = 0;
    for (int i = 0; i < f.np; i++) {
        off += f.plen[i];
        cur[i] = gen[i][0] = argmax_row(lg + (off - 1) * (size_t)V, V, NULL);
    }
    size_t steps = f.glen[0];
    for (size_t s = 1; s < steps; s++) {
        for (int i = 0; i < f.np; i++) { tp[i] = &cur[i]; nt[i] = 1; }
        int32_t next[MAXP];
        CHECK_OK(ft_cuda_ctx_forward_greedy(c, (size_t)f.np, slots, tp, nt, next));
        for (int i = 0; i < f.np; i++) cur[i] = gen[i][s] = next[i];
    }
    for (int i = 0; i < f.np; i++)
        CHECK_MSG(!memcmp(gen[i], f.greedy[i], steps * sizeof(int32_t)), "%s f32: greedy continuation of prompt %d "
                  "differs from transformers'", name, i);
    /* chunked prefill in reversed slots == the same last-position logits */
    for (int i = 0; i < f.np; i++) ft_cuda_ctx_reset(c, i);
    int rs[MAXP], s2[MAXP], idx[MAXP], n2 = 0;
    for (int i = 0; i < f.np; i++) {
        rs[i] = f.np - 1 - i;
        tp[i] = f.prompt[i];
        nt[i] = f.plen[i] > 1 ? f.plen[i] / 2 : f.plen[i];
    }
    CHECK_OK(ft_cuda_ctx_forward(c, (size_t)f.np, rs, tp, nt, NULL, 0));
    for (int i = 0; i < f.np; i++) {
        if (nt[i] == f.plen[i]) continue;
        s2[n2] = rs[i];
        idx[n2] = i;
        tp[n2] = f.prompt[i] + nt[i];
        nt[n2] = f.plen[i] - nt[i];
        n2++;
    }
    CHECK_OK(ft_cuda_ctx_forward(c, (size_t)n2, s2, tp, nt, lg, 0));
    for (int k = 0; k < n2; k++) {
        size_t o = 0;
        for (int q = 0; q <= idx[k]; q++) o += f.plen[q];
        float dd = ft_max_abs_diff(lg + (size_t)k * V, f.logits + (o - 1) * (size_t)V, (size_t)V);
        CHECK_MSG(dd <= 1e-3f, "%s f32: chunked prefill, prompt %d: max |diff| %g", name, idx[k], dd);
    }
    free(lg);
    ft_fixture_free(&f);
    ft_cuda_ctx_free(c);
    ft_model_free(m);
}

/* bf16 weights against the CPU engine on the bf16-rounded model. */
static void fixture_bf16(const char *name)
{
    char dir[512];
    ft_fixture_dir("models", name, dir, sizeof dir);
    ft_fixture f;
    int loaded = ft_fixture_load(dir, &f);
    REQUIRE(loaded);
    ft_model *m = NULL, *mr = NULL;
    CHECK_OK(ft_model_load(dir, NULL, &m));
    CHECK_OK(ft_model_load(dir, NULL, &mr));
    REQUIRE(m && mr);
    round_matrices_bf16(mr);
    int V = ft_model_get_config(m)->vocab;
    size_t rows = 0;
    for (int i = 0; i < f.np; i++) rows += f.plen[i];
    ft_cuda_ctx *g = gpu(m, f.np, 64, (int)rows, 1, 0, NULL, NULL);
    ft_ctx *c = cpu(mr, f.np, 64, (int)rows, 1);
    REQUIRE(g && c);
    float *lg = malloc(rows * (size_t)V * 4), *lc = malloc(rows * (size_t)V * 4);
    int slots[MAXP];
    const int32_t *tp[MAXP];
    size_t nt[MAXP];
    for (int i = 0; i < f.np; i++) { slots[i] = i; tp[i] = f.prompt[i]; nt[i] = f.plen[i]; }
    CHECK_OK(ft_cuda_ctx_forward(g, (size_t)f.np, slots, tp, nt, lg, 1));
    CHECK_OK(ft_ctx_forward(c, (size_t)f.np, slots, tp, nt, lc, 1));
    const float tol = 6e-2f;
    float e = row_rel_err(lg, lc, rows, (size_t)V);
    CHECK_MSG(e <= tol, "%s bf16: prefill logits row-relative error %g > %g", name, e, tol);
    /* greedy, step by step, both engines fed the CPU's token; compared
     * where the CPU's margin is clear */
    int32_t cur[MAXP];
    int compared = 0, skipped = 0;
    size_t off = 0;
    for (int i = 0; i < f.np; i++) {
        off += f.plen[i];
        float mx = 1.0f, margin;
        for (int v = 0; v < V; v++) mx = fmaxf(mx, fabsf(lc[(off - 1) * V + v]));
        int a = argmax_row(lc + (off - 1) * (size_t)V, V, &margin), b = argmax_row(lg + (off - 1) * (size_t)V, V, NULL);
        if (margin > 2 * tol * mx) { CHECK_MSG(a == b, "%s bf16: first token of prompt %d: %d vs %d", name, i, b, a); compared++; }
        else skipped++;
        cur[i] = a;
    }
    for (int s = 1; s < 10; s++) {
        for (int i = 0; i < f.np; i++) { tp[i] = &cur[i]; nt[i] = 1; }
        CHECK_OK(ft_cuda_ctx_forward(g, (size_t)f.np, slots, tp, nt, lg, 0));
        CHECK_OK(ft_ctx_forward(c, (size_t)f.np, slots, tp, nt, lc, 0));
        float es = row_rel_err(lg, lc, (size_t)f.np, (size_t)V);
        CHECK_MSG(es <= tol, "%s bf16: decode step %d row-relative error %g", name, s, es);
        for (int i = 0; i < f.np; i++) {
            float mx = 1.0f, margin;
            for (int v = 0; v < V; v++) mx = fmaxf(mx, fabsf(lc[(size_t)i * V + v]));
            int a = argmax_row(lc + (size_t)i * V, V, &margin), b = argmax_row(lg + (size_t)i * V, V, NULL);
            if (margin > 2 * tol * mx) { CHECK_MSG(a == b, "%s bf16: step %d prompt %d: %d vs %d", name, s, i, b, a); compared++; }
            else skipped++;
            cur[i] = a;
        }
    }
    printf("  %s bf16: row-relative error %.3g; greedy tokens compared %d, margin too small %d\n", name, e,
           compared, skipped);
    CHECK_MSG(compared > 0, "%s bf16: no greedy step had a clear margin", name);
    free(lg);
    free(lc);
    ft_fixture_free(&f);
    ft_cuda_ctx_free(g);
    ft_ctx_free(c);
    ft_model_free(m);
    ft_model_free(mr);
}

TEST(fwd_fixtures_f32_vs_transformers)
{
    for (size_t i = 0; i < sizeof FIXTURES / sizeof FIXTURES[0]; i++) fixture_f32(FIXTURES[i]);
}

TEST(fwd_fixtures_bf16_vs_cpu)
{
    for (size_t i = 0; i < sizeof FIXTURES / sizeof FIXTURES[0]; i++) fixture_bf16(FIXTURES[i]);
}

/* --------------------------------------- synthetic models vs the CPU */

/* Prompts of the given lengths as one batch (all-row logits), then
 * `steps` decode steps of the whole batch fed the CPU's greedy tokens.
 * Returns the worst row-relative error of the GPU against the CPU. */
static float run_vs_cpu(ft_cuda_ctx *g, ft_ctx *c, int V, int np, const size_t *plen, int steps, uint64_t seed)
{
    size_t rows = 0;
    for (int i = 0; i < np; i++) rows += plen[i];
    int32_t *toks = malloc(rows * sizeof(int32_t));
    uint64_t s = seed;
    for (size_t k = 0; k < rows; k++) toks[k] = (int32_t)(ft_test_rand(&s) % (uint64_t)V);
    int slots[MAXP];
    const int32_t *tp[MAXP];
    size_t nt[MAXP], o = 0;
    for (int i = 0; i < np; i++) {
        slots[i] = np - 1 - i;
        tp[i] = toks + o;
        nt[i] = plen[i];
        o += plen[i];
        ft_cuda_ctx_reset(g, i);
        ft_ctx_reset(c, i);
    }
    float *lg = malloc(rows * (size_t)V * 4), *lc = malloc(rows * (size_t)V * 4), worst = 0;
    ft_status a = ft_cuda_ctx_forward(g, (size_t)np, slots, tp, nt, lg, 1);
    ft_status b = ft_ctx_forward(c, (size_t)np, slots, tp, nt, lc, 1);
    CHECK_OK(a);
    CHECK_OK(b);
    if (!a && !b) worst = row_rel_err(lg, lc, rows, (size_t)V);
    int32_t cur[MAXP];
    o = 0;
    for (int i = 0; i < np; i++) {
        o += plen[i];
        cur[i] = argmax_row(lc + (o - 1) * (size_t)V, V, NULL);
    }
    for (int st = 0; st < steps && !a && !b; st++) {
        for (int i = 0; i < np; i++) { tp[i] = &cur[i]; nt[i] = 1; }
        a = ft_cuda_ctx_forward(g, (size_t)np, slots, tp, nt, lg, 0);
        b = ft_ctx_forward(c, (size_t)np, slots, tp, nt, lc, 0);
        CHECK_OK(a);
        CHECK_OK(b);
        float e = row_rel_err(lg, lc, (size_t)np, (size_t)V);
        if (!(e <= worst)) worst = e;
        for (int i = 0; i < np; i++) cur[i] = argmax_row(lc + (size_t)i * V, V, NULL);
    }
    for (int i = 0; i < np; i++) CHECK(ft_cuda_ctx_seq_len(g, slots[i]) == ft_ctx_seq_len(c, slots[i]));
    free(toks);
    free(lg);
    free(lc);
    return worst;
}

/* f32 weights: long contexts (several 128-position attention tiles),
 * head_dim 128 with one KV head, llama3 RoPE, biases, tied head; OPT's
 * learned positions, ReLU and biases; GQA 4:2 over 5 layers. */
TEST(fwd_synthetic_f32_vs_cpu)
{
    static const struct { const char *json, *name; } models[] = {
        {LLAMA_HD128, "llama hd128"}, {OPT3, "opt"}, {LLAMA5, "llama 5 layers"}};
    for (int mi = 0; mi < 3; mi++) {
        ft_model *m = make_model(models[mi].json, 11 + (uint64_t)mi, 0.05f);
        REQUIRE(m);
        int V = ft_model_get_config(m)->vocab;
        size_t plen[3] = {150, 290, 1};
        ft_cuda_ctx *g = gpu(m, 3, 300, 441, 1, 1, NULL, NULL);
        ft_ctx *c = cpu(m, 3, 300, 441, 1);
        REQUIRE(g && c);
        float e = run_vs_cpu(g, c, V, 3, plen, 6, 5);
        CHECK_MSG(e <= 1e-3f, "%s f32: row-relative error %g vs the CPU", models[mi].name, e);
        printf("  %s f32: row-relative error vs the CPU %.3g\n", models[mi].name, e);
        /* the KV caches agree */
        float *k1 = malloc(300 * 4096 * 4), *k2;
        int len = 0, kvd = 0;
        CHECK_OK(ft_cuda_ctx_kv(g, 1, 1, k1, NULL, &len, &kvd));
        float *kc = NULL;
        int clen = 0, ckvd = 0;
        CHECK_OK(ft_ctx_kv(c, 1, 1, &kc, NULL, &clen, &ckvd));
        k2 = kc;
        CHECK(len == clen && kvd == ckvd && len == 296);
        if (len == clen && kvd == ckvd) {
            float ke = row_rel_err(k1, k2, 1, (size_t)len * (size_t)kvd);
            CHECK_MSG(ke <= 1e-4f, "%s: KV cache relative error %g", models[mi].name, ke);
        }
        free(k1);
        ft_cuda_ctx_free(g);
        ft_ctx_free(c);
        ft_model_free(m);
    }
}

/* bf16 weights on the synthetic models: the default mode against the CPU
 * on the bf16-rounded model. */
TEST(fwd_synthetic_bf16_vs_cpu)
{
    static const char *const js[] = {LLAMA_HD128, OPT3, LLAMA5};
    for (int mi = 0; mi < 3; mi++) {
        ft_model *m = make_model(js[mi], 21 + (uint64_t)mi, 0.05f), *mr = make_model(js[mi], 21 + (uint64_t)mi, 0.05f);
        REQUIRE(m && mr);
        round_matrices_bf16(mr);
        int V = ft_model_get_config(m)->vocab;
        size_t plen[4] = {40, 7, 200, 1};
        ft_cuda_ctx *g = gpu(m, 4, 256, 248, 1, 0, NULL, NULL);
        ft_ctx *c = cpu(mr, 4, 256, 248, 1);
        REQUIRE(g && c);
        float e = run_vs_cpu(g, c, V, 4, plen, 8, 9);
        CHECK_MSG(e <= 6e-2f, "model %d bf16: row-relative error %g vs the CPU", mi, e);
        printf("  synthetic model %d bf16: row-relative error vs the CPU %.3g\n", mi, e);
        ft_cuda_ctx_free(g);
        ft_ctx_free(c);
        ft_model_free(m);
        ft_model_free(mr);
    }
}

/* ------------------------------------ streamed == resident weights */

/* Run a fixed workload (3 prompts as one batch, then 6 decode steps on
 * all, then 2 on a subset) and collect all logits. */
static float *workload(ft_cuda_ctx *g, int V, size_t *n_out)
{
    static const size_t plen[3] = {9, 30, 2};
    size_t total = (41 + 3 * 6 + 2 * 2) * (size_t)V;
    float *all = malloc(total * 4), *p = all;
    int32_t toks[41];
    uint64_t s = 99;
    for (int k = 0; k < 41; k++) toks[k] = (int32_t)(ft_test_rand(&s) % (uint64_t)V);
    int slots[3] = {2, 0, 1};
    const int32_t *tp[3] = {toks, toks + 9, toks + 39};
    size_t nt[3] = {plen[0], plen[1], plen[2]};
    for (int i = 0; i < 3; i++) ft_cuda_ctx_reset(g, i);
    if (ft_cuda_ctx_forward(g, 3, slots, tp, nt, p, 1)) goto fail;
    p += 41 * (size_t)V;
    int32_t cur[3];
    for (int st = 0; st < 8; st++) {          /* fixed tokens: no dependence on the outputs */
        size_t n = st < 6 ? 3 : 2;
        for (int i = 0; i < 3; i++) {
            cur[i] = (int32_t)((st * 37 + i * 11 + 3) % V);
            tp[i] = &cur[i];
            nt[i] = 1;
        }
        if (ft_cuda_ctx_forward(g, n, slots, tp, nt, p, 0)) goto fail;
        p += n * (size_t)V;
    }
    *n_out = (size_t)(p - all);
    return all;
fail:
    fprintf(stderr, "  workload: %s\n", ft_last_error());
    free(all);
    return NULL;
}

/* A copy of m whose layer matrices went through the codec on the CPU
 * (encode as ft_cuda_host_weights does, decode to f32). */
static ft_model *model_through_codec(const char *json, uint64_t seed, ft_codec_id codec)
{
    ft_model *m = make_model(json, seed, 0.05f);
    if (!m) return NULL;
    ft_codec_ctx *cc = NULL;
    ft_codec_ctx_create(2, &cc);
    ft_codec_params p;
    ft_codec_default_params(&p);
    p.codec = codec;
    p.group_size = 64;
    p.group_dim = -1;
    for (size_t i = 0; i < ft_model_tensor_count(m); i++) {
        const char *name;
        ft_tensor t;
        ft_model_tensor(m, i, &name, &t);
        if (t.ndim != 2 || !strstr(name, "layers.")) continue;
        size_t bound = ft_encode_bound(&p, FT_F32, 2, t.shape), fs = 0;
        uint8_t *f = ft_malloc_aligned(bound, 64);
        uint64_t n;
        ft_tensor_numel(&t, &n);
        ft_tensor d = {.dtype = FT_F32, .data = t.data};
        if (ft_encode(cc, &p, &t, f, bound, &fs) || ft_decode(cc, f, fs, &d, n * 4))
            fprintf(stderr, "  codec round trip: %s\n", ft_last_error());
        ft_free_aligned(f);
    }
    ft_codec_ctx_free(cc);
    return m;
}

TEST(fwd_streamed_equals_resident)
{
    static const struct { ft_codec_id codec; const char *name; } codecs[] = {
        {FT_CODEC_RAW, "raw bf16"}, {FT_CODEC_BYTEPLANE, "byteplane"}, {FT_CODEC_Q8, "q8"}, {FT_CODEC_Q4, "q4"}};
    static const char *const js[] = {LLAMA5, OPT3};
    for (int mi = 0; mi < 2; mi++)
        for (int ci = 0; ci < 4; ci++)
            for (int f32 = 0; f32 < 2; f32++) {
                int lossy = codecs[ci].codec == FT_CODEC_Q8 || codecs[ci].codec == FT_CODEC_Q4;
                ft_model *m = make_model(js[mi], 31 + (uint64_t)mi, 0.05f);
                /* the reference model: the same weights as the GPU will hold */
                ft_model *ref = lossy ? model_through_codec(js[mi], 31 + (uint64_t)mi, codecs[ci].codec)
                                      : make_model(js[mi], 31 + (uint64_t)mi, 0.05f);
                REQUIRE(m && ref);
                if (f32 && !lossy) round_some_bf16(ref, 1);   /* raw/bp host weights are bf16 */
                ft_cuda_host_weights_params hp = {codecs[ci].codec, 64, -1, 2};
                ft_cuda_host_weights *hw = NULL;
                CHECK_OK(ft_cuda_host_weights_create(m, &hp, &hw));
                REQUIRE(hw);
                int V = ft_model_get_config(m)->vocab;
                ft_cuda_ctx *gs = gpu(m, 3, 64, 41, 1, f32, ft_cuda_host_weights_hook, hw);
                ft_cuda_ctx *gr = gpu(ref, 3, 64, 41, 1, f32, NULL, NULL);
                REQUIRE(gs && gr);
                size_t ns = 0, nr = 0;
                float *ls = workload(gs, V, &ns), *lr = workload(gr, V, &nr);
                CHECK(ls && lr && ns == nr);
                if (ls && lr && ns == nr) {
                    float e = row_rel_err(ls, lr, ns / (size_t)V, (size_t)V);
                    CHECK_MSG(e <= 1e-5f, "model %d %s f32 %d: streamed vs resident error %g", mi, codecs[ci].name,
                              f32, e);
                    printf("  model %d, %s, %s weights: streamed vs resident %s (max rel %.3g)\n", mi,
                           codecs[ci].name, f32 ? "f32" : "bf16", memcmp(ls, lr, ns * 4) ? "close" : "bit-identical", e);
                }
                ft_cuda_stats st;
                ft_cuda_ctx_get_stats(gs, &st);
                int L = ft_model_get_config(m)->n_layers;
                CHECK(st.layers_streamed == (uint64_t)L * 9);   /* 9 forwards */
                CHECK(st.h2d_weight_bytes > 0 && st.slot_bytes > 0);
                CHECK(st.forward_s > 0 && st.stall_s >= 0 && st.stall_s <= st.forward_s);
#ifndef FT_TEST_CUDA_FAKE
                CHECK(st.copy_s > 0);
#endif
                CHECK(st.copy_s >= 0 && st.copy_s <= st.forward_s);
                if (codecs[ci].codec == FT_CODEC_Q4)
                    CHECK_MSG(st.h2d_weight_bytes * 3 < (uint64_t)ft_model_layer_bytes(m) * (uint64_t)L * 9,
                              "q4: %llu bytes copied", (unsigned long long)st.h2d_weight_bytes);
                free(ls);
                free(lr);
                ft_cuda_ctx_free(gs);
                ft_cuda_ctx_free(gr);
                ft_cuda_host_weights_free(hw);
                ft_model_free(m);
                ft_model_free(ref);
            }
}

/* ------------------------------------------------------- error paths */

typedef struct {
    ft_cuda_host_weights *hw;
    int fail_layer;       /* return FT_ERR_IO at this layer */
    int bad_size_layer;   /* hand out a wrong size at this layer */
    int calls;
} hook_ctl;

static ft_status test_hook(void *user, int layer, ft_cuda_wsrc *src)
{
    hook_ctl *h = user;
    h->calls++;
    if (layer == h->fail_layer) return ft_set_error(FT_ERR_IO, "test hook: layer %d unavailable", layer);
    ft_status st = ft_cuda_host_weights_hook(h->hw, layer, src);
    if (!st && layer == h->bad_size_layer) src[2].bytes -= 2;   /* wq */
    return st;
}

TEST(fwd_errors_leave_state_unchanged)
{
    ft_model *m = make_model(LLAMA5, 3, 0.05f);
    REQUIRE(m);
    ft_cuda_ctx *g = gpu(m, 2, 16, 20, 0, 0, NULL, NULL);
    REQUIRE(g);
    int32_t t5[5] = {1, 2, 3, 4, 5}, bad[2] = {1, 500};
    int s01[2] = {0, 1}, s00[2] = {0, 0}, s9[1] = {9};
    const int32_t *tp[2] = {t5, t5};
    size_t n5[2] = {5, 5}, n0[2] = {0, 5};
    float lg[2 * 500];
    CHECK_OK(ft_cuda_ctx_forward(g, 2, s01, tp, n5, lg, 0));
    CHECK(ft_cuda_ctx_seq_len(g, 0) == 5 && ft_cuda_ctx_seq_len(g, 1) == 5);
    CHECK(ft_cuda_ctx_forward(g, 1, s9, tp, n5, lg, 0) == FT_ERR_INVALID_ARG);
    CHECK(ft_cuda_ctx_forward(g, 2, s00, tp, n5, lg, 0) == FT_ERR_INVALID_ARG);
    CHECK(ft_cuda_ctx_forward(g, 2, s01, tp, n0, lg, 0) == FT_ERR_INVALID_ARG);
    const int32_t *tb[1] = {bad};
    size_t n2[1] = {2};
    CHECK(ft_cuda_ctx_forward(g, 1, s01, tb, n2, lg, 0) == FT_ERR_INVALID_ARG);
    size_t n11[2] = {11, 11};                       /* 5 + 11 = 16 fits, but 22 rows > max_rows 20 */
    const int32_t big[11] = {0};
    const int32_t *tbig[2] = {big, big};
    CHECK(ft_cuda_ctx_forward(g, 2, s01, tbig, n11, lg, 0) == FT_ERR_INVALID_ARG);
    size_t n12[1] = {12};                           /* 5 + 12 > max_seq 16 */
    const int32_t big12[12] = {0};
    const int32_t *t12[1] = {big12};
    CHECK(ft_cuda_ctx_forward(g, 1, s01, t12, n12, lg, 0) == FT_ERR_NO_SPACE);
    CHECK(ft_cuda_ctx_forward(g, 1, s01, tp, n5, lg, 1) == FT_ERR_INVALID_ARG);   /* all_rows without all_logits */
    CHECK(ft_cuda_ctx_seq_len(g, 0) == 5 && ft_cuda_ctx_seq_len(g, 1) == 5);
    ft_cuda_ctx_free(g);

    /* a failing weight hook aborts the forward; lengths unchanged; the next
     * forward works and matches the resident context */
    ft_cuda_host_weights_params hp = {FT_CODEC_Q4, 64, -1, 2};
    hook_ctl h = {NULL, 3, -1, 0};
    CHECK_OK(ft_cuda_host_weights_create(m, &hp, &h.hw));
    REQUIRE(h.hw);
    g = gpu(m, 2, 16, 20, 0, 0, test_hook, &h);
    REQUIRE(g);
    ft_status st = ft_cuda_ctx_forward(g, 2, s01, tp, n5, lg, 0);
    CHECK(st == FT_ERR_IO);
    CHECK_MSG(strstr(ft_last_error(), "layer 3"), "%s", ft_last_error());
    CHECK(ft_cuda_ctx_seq_len(g, 0) == 0 && ft_cuda_ctx_seq_len(g, 1) == 0);
    h.fail_layer = -1;
    h.bad_size_layer = 2;                          /* a truncated frame */
    CHECK(ft_cuda_ctx_forward(g, 2, s01, tp, n5, lg, 0) == FT_ERR_CORRUPT);
    CHECK(ft_cuda_ctx_seq_len(g, 0) == 0);
    h.bad_size_layer = -1;
    CHECK_OK(ft_cuda_ctx_forward(g, 2, s01, tp, n5, lg, 0));
    CHECK(ft_cuda_ctx_seq_len(g, 0) == 5);
    ft_cuda_ctx_free(g);
    ft_cuda_host_weights_free(h.hw);

    /* creation errors */
    ft_cuda_ctx_params p;
    memset(&p, 0, sizeof p);
    ft_cuda_ctx *c = NULL;
    p.max_batch = 1;
    p.max_seq = 513;                               /* > max_position_embeddings */
    CHECK(ft_cuda_ctx_create(m, &p, &c) == FT_ERR_INVALID_ARG && !c);
    p.max_seq = 16;
    p.stream_weights = 1;                          /* no hook */
    CHECK(ft_cuda_ctx_create(m, &p, &c) == FT_ERR_INVALID_ARG && !c);
    p.stream_weights = 0;
    p.device = 1000;
    CHECK(ft_cuda_ctx_create(m, &p, &c) == FT_ERR_INVALID_ARG && !c);
    ft_model *ext = NULL;
    CHECK_OK(ft_model_create_ex(ft_model_get_config(m), 1, &ext));
    p.device = 0;
    CHECK(ft_cuda_ctx_create(ext, &p, &c) == FT_ERR_INVALID_ARG && !c);   /* layers not loaded, not streamed */
    ft_model_free(ext);
    ft_model_free(m);
}

/* ------------------------------------------------------- generation */

typedef struct { size_t stop_seq; int count; } stop_ctl;

static int stop_after_3(void *user, size_t seq, int32_t tok)
{
    stop_ctl *s = user;
    (void)tok;
    if (seq != s->stop_seq) return 0;
    return ++s->count >= 3;
}

TEST(fwd_generate)
{
    ft_model *m = make_model(LLAMA5, 41, 0.08f);
    REQUIRE(m);
    int V = ft_model_get_config(m)->vocab;
    ft_cuda_ctx *g = gpu(m, 3, 64, 64, 0, 0, NULL, NULL);
    REQUIRE(g);
    int32_t p0[5] = {3, 4, 5, 6, 7}, p1[1] = {9}, p2[12] = {1, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144};
    const int32_t *pp[3] = {p0, p1, p2};
    size_t pl[3] = {5, 1, 12};
    int32_t o0[20], o1[20], o2[20];
    int32_t *op[3] = {o0, o1, o2};
    size_t no[3];
    ft_gen_params gp = {.max_new_tokens = 12, .ignore_eos = 1};
    ft_gen_stats gs;
    CHECK_OK(ft_cuda_generate(g, 3, pp, pl, &gp, op, no, &gs));
    CHECK(no[0] == 12 && no[1] == 12 && no[2] == 12);
    CHECK(gs.prefill_tokens == 18 && gs.decode_tokens == 33);
    /* the same by hand: forward + host argmax */
    int slots[3] = {0, 1, 2};
    float *lg = malloc(3 * (size_t)V * 4);
    for (int i = 0; i < 3; i++) ft_cuda_ctx_reset(g, i);
    CHECK_OK(ft_cuda_ctx_forward(g, 3, slots, pp, pl, lg, 0));
    int32_t cur[3], man[3][12];
    for (int s = 0; s < 12; s++) {
        for (int i = 0; i < 3; i++) cur[i] = man[i][s] = argmax_row(lg + (size_t)i * V, V, NULL);
        if (s == 11) break;
        const int32_t *tp[3] = {&cur[0], &cur[1], &cur[2]};
        size_t nt[3] = {1, 1, 1};
        CHECK_OK(ft_cuda_ctx_forward(g, 3, slots, tp, nt, lg, 0));
    }
    CHECK(!memcmp(man[0], o0, sizeof man[0]) && !memcmp(man[1], o1, sizeof man[1]) && !memcmp(man[2], o2, sizeof man[2]));
    /* sampling: ft_cuda_generate == ft_sampler_sample over the GPU's logits
     * with ft_generate's per-sequence seeds */
    gp.sampling.temperature = 0.9f;
    gp.sampling.top_k = 20;
    gp.sampling.seed = 7;
    CHECK_OK(ft_cuda_generate(g, 3, pp, pl, &gp, op, no, &gs));
    ft_sampler *smp = NULL;
    CHECK_OK(ft_sampler_create(V, &smp));
    uint64_t rng[3];
    int32_t hist[3][40];
    size_t hl[3];
    for (int i = 0; i < 3; i++) {
        ft_cuda_ctx_reset(g, i);
        rng[i] = 7 ^ (0x9e3779b97f4a7c15ull * (uint64_t)(i + 1));
        memcpy(hist[i], pp[i], pl[i] * 4);
        hl[i] = pl[i];
    }
    CHECK_OK(ft_cuda_ctx_forward(g, 3, slots, pp, pl, lg, 0));
    for (int s = 0; smp && s < 12; s++) {
        for (int i = 0; i < 3; i++) {
            cur[i] = ft_sampler_sample(smp, &gp.sampling, lg + (size_t)i * V, hist[i], hl[i], &rng[i]);
            hist[i][hl[i]++] = cur[i];
            man[i][s] = cur[i];
        }
        if (s == 11) break;
        const int32_t *tp[3] = {&cur[0], &cur[1], &cur[2]};
        size_t nt[3] = {1, 1, 1};
        CHECK_OK(ft_cuda_ctx_forward(g, 3, slots, tp, nt, lg, 0));
    }
    CHECK(!memcmp(man[0], o0, sizeof man[0]) && !memcmp(man[1], o1, sizeof man[1]) && !memcmp(man[2], o2, sizeof man[2]));
    /* a callback stops one sequence after 3 tokens */
    stop_ctl sc = {1, 0};
    gp.sampling.temperature = 0;
    gp.on_token = stop_after_3;
    gp.user = &sc;
    CHECK_OK(ft_cuda_generate(g, 3, pp, pl, &gp, op, no, &gs));
    CHECK(no[0] == 12 && no[1] == 3 && no[2] == 12);
    ft_sampler_free(smp);
    free(lg);
    ft_cuda_ctx_free(g);
    ft_model_free(m);
}

/* A decode batch equals each sequence decoded alone (bf16; GEMMs of other
 * shapes may sum in another order: 1e-3 relative). */
TEST(fwd_batch_equals_single)
{
    ft_model *m = make_model(LLAMA5, 51, 0.05f);
    REQUIRE(m);
    int V = ft_model_get_config(m)->vocab;
    ft_cuda_ctx *a = gpu(m, 4, 32, 32, 0, 0, NULL, NULL), *b = gpu(m, 4, 32, 32, 0, 0, NULL, NULL);
    REQUIRE(a && b);
    int32_t toks[4][6] = {{1, 2, 3, 4, 5, 6}, {7, 8, 9, 10, 11, 12}, {13, 14, 15, 16, 17, 18}, {19, 20, 21, 22, 23, 24}};
    int slots[4] = {0, 1, 2, 3};
    const int32_t *tp[4] = {toks[0], toks[1], toks[2], toks[3]};
    size_t nt[4] = {6, 3, 5, 1};
    float la[4 * 500], lb[500];
    CHECK_OK(ft_cuda_ctx_forward(a, 4, slots, tp, nt, la, 0));
    float worst = 0;
    for (int i = 0; i < 4; i++) {
        CHECK_OK(ft_cuda_ctx_forward(b, 1, &slots[i], &tp[i], &nt[i], lb, 0));
        float e = row_rel_err(la + (size_t)i * V, lb, 1, (size_t)V);
        if (!(e <= worst)) worst = e;
    }
    CHECK_MSG(worst <= 1e-3f, "batched vs single: %g", worst);
    ft_cuda_ctx_free(a);
    ft_cuda_ctx_free(b);
    ft_model_free(m);
}

/* Issue 23's families need operations the CUDA backend does not have (q/k
 * norms, gemma's norms and soft-capping, mixtures of experts): refused at
 * create with the list, never computed wrongly. */
TEST(fwd_refuses_new_families)
{
    static const char *const names[] = {"qwen3-tiny", "gemma2-tiny", "gemma3-tiny", "mixtral-tiny", "olmoe-tiny"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char dir[512];
        const char *data = getenv("FT_TEST_DATA");
        snprintf(dir, sizeof dir, "%s/models/%s", data ? data : "tests/data", names[i]);
        ft_model *m = NULL;
        CHECK_OK(ft_model_load(dir, NULL, &m));
        if (!m) continue;
        ft_cuda_ctx_params p;
        memset(&p, 0, sizeof p);
        p.max_batch = 1;
        p.max_seq = 16;
        p.f32_weights = 1;
        ft_cuda_ctx *c = NULL;
        CHECK(ft_cuda_ctx_create(m, &p, &c) == FT_ERR_UNSUPPORTED && !c);
        CHECK_MSG(strstr(ft_last_error(), "does not implement") != NULL, "%s: %s", names[i], ft_last_error());
        printf("  %-14s %s\n", names[i], ft_last_error());
        ft_cuda_ctx_free(c);
        ft_model_free(m);
    }
}
