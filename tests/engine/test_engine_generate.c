/* Generation on an in-memory random model: batching must not change
 * results, sampling is reproducible by seed, stop conditions and the
 * per-layer hook work. */
#include "ft_test.h"
#include "flextier/engine.h"
#include "engine/wkernels.h"

#include <math.h>

static ft_model *random_model_eos(ft_arch_id arch, uint64_t seed, int32_t eos)
{
    ft_model_config c;
    memset(&c, 0, sizeof c);
    c.arch = arch;
    c.hidden = 48; c.n_layers = 3; c.n_heads = 6; c.head_dim = 8; c.ffn = 72; c.vocab = 97;
    c.max_pos = 64; c.norm_eps = 1e-5f; c.word_embed_proj_dim = 48;
    c.bos_id = 1; c.eos_ids[0] = eos; c.n_eos = 1; c.pad_id = -1;
    if (arch == FT_ARCH_OPT) {
        c.n_kv_heads = 6; c.do_layer_norm_before = 1; c.enable_bias = 1; c.ln_affine = 1;
        c.final_norm = 1; c.tie_word_embeddings = 1;
    } else {
        c.n_kv_heads = 2; c.rope_theta = 10000;
    }
    ft_model *m = NULL;
    if (ft_model_create(&c, &m)) return NULL;
    for (size_t i = 0; i < ft_model_tensor_count(m); i++) {
        const char *name;
        ft_tensor t;
        if (ft_model_tensor(m, i, &name, &t)) { ft_model_free(m); return NULL; }
        uint64_t n;
        ft_tensor_numel(&t, &n);
        float *d = t.data;
        int isnorm = strstr(name, "norm") && strstr(name, "weight");
        for (uint64_t k = 0; k < n; k++) {
            float r = (float)(ft_test_rand(&seed) >> 40) / (float)(1 << 24) * 2 - 1;
            d[k] = isnorm ? 1 + 0.2f * r : 0.3f * r;
        }
    }
    return m;
}

static ft_model *random_model(ft_arch_id arch, uint64_t seed)
{
    return random_model_eos(arch, seed, 2);
}

static void batch_equals_single(ft_arch_id arch)
{
    ft_model *m = random_model(arch, 7);
    REQUIRE(m);
    ft_ctx_params cp = {.max_batch = 4, .max_seq = 40, .threads = 2};
    ft_ctx *c = NULL;
    CHECK_OK(ft_ctx_create(m, &cp, &c));
    REQUIRE(c);
    int32_t p0[] = {5, 9, 14, 3, 3, 60}, p1[] = {7}, p2[] = {11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21};
    const int32_t *ps[] = {p0, p1, p2};
    size_t pl[] = {6, 1, 11};
    int32_t o[3][16] = {{0}}, s[16] = {0};
    int32_t *outs[] = {o[0], o[1], o[2]};
    size_t no[3], ns;
    ft_gen_params gp = {.max_new_tokens = 12, .ignore_eos = 1};
    ft_gen_stats st;
    CHECK_OK(ft_generate(c, 3, ps, pl, &gp, outs, no, &st));
    CHECK(st.prefill_tokens == 18 && st.decode_tokens == 3 * 11);
    for (int j = 0; j < 3; j++) {
        int32_t *so[] = {s};
        CHECK_OK(ft_generate(c, 1, &ps[j], &pl[j], &gp, so, &ns, NULL));
        CHECK(ns == 12 && no[j] == 12);
        CHECK_MSG(!memcmp(s, o[j], sizeof(int32_t) * 12), "arch %d prompt %d: batched != single", arch, j);
    }
    /* top_k = 1 sampling equals greedy; same seed reproduces; other seed differs somewhere */
    gp.sampling.temperature = 0.8f;
    gp.sampling.top_k = 1;
    gp.sampling.seed = 3;
    int32_t t[3][16] = {{0}};
    int32_t *touts[] = {t[0], t[1], t[2]};
    CHECK_OK(ft_generate(c, 3, ps, pl, &gp, touts, no, NULL));
    CHECK(!memcmp(t, o, sizeof t));
    gp.sampling.top_k = 0;
    gp.sampling.top_p = 0.95f;
    gp.sampling.temperature = 1.5f;
    gp.sampling.repetition_penalty = 1.3f;
    int32_t a[3][16] = {{0}}, b[3][16] = {{0}};
    int32_t *aouts[] = {a[0], a[1], a[2]}, *bouts[] = {b[0], b[1], b[2]};
    CHECK_OK(ft_generate(c, 3, ps, pl, &gp, aouts, no, NULL));
    CHECK_OK(ft_generate(c, 3, ps, pl, &gp, bouts, no, NULL));
    CHECK(!memcmp(a, b, sizeof a));
    gp.sampling.seed = 4;
    CHECK_OK(ft_generate(c, 3, ps, pl, &gp, bouts, no, NULL));
    CHECK(memcmp(a, b, sizeof a) != 0);
    ft_ctx_free(c);
    ft_model_free(m);
}

TEST(batch_equals_single_llama) { batch_equals_single(FT_ARCH_LLAMA); }
TEST(batch_equals_single_opt) { batch_equals_single(FT_ARCH_OPT); }

static int stop_after3(void *u, size_t seq, int32_t tok) { (void)tok; int *cnt = u; return ++cnt[seq] >= 3; }

TEST(stops)
{
    ft_model *m = random_model_eos(FT_ARCH_LLAMA, 9, 0);
    REQUIRE(m);
    ft_ctx_params cp = {.max_batch = 2, .max_seq = 32, .threads = 1};
    ft_ctx *c = NULL;
    CHECK_OK(ft_ctx_create(m, &cp, &c));
    REQUIRE(c);
    int32_t p[] = {4, 5, 6}, o[2][32];
    const int32_t *ps[] = {p, p};
    size_t pl[] = {3, 3}, no[2];
    int32_t *outs[] = {o[0], o[1]};
    int cnt[2] = {0, 0};
    ft_gen_params gp = {.max_new_tokens = 20, .ignore_eos = 1, .on_token = stop_after3, .user = cnt};
    CHECK_OK(ft_generate(c, 2, ps, pl, &gp, outs, no, NULL));
    CHECK(no[0] == 3 && no[1] == 3);
    /* the prompt + new tokens must fit the context */
    gp.max_new_tokens = 31;
    gp.on_token = NULL;
    CHECK(ft_generate(c, 2, ps, pl, &gp, outs, no, NULL) == FT_ERR_NO_SPACE);
    /* EOS: with the final norm weight zeroed every logit is 0, so greedy
     * picks token 0, which this model's config names as EOS. */
    gp.max_new_tokens = 5;
    gp.ignore_eos = 0;
    for (size_t i = 0; i < ft_model_tensor_count(m); i++) {
        const char *name; ft_tensor t;
        CHECK_OK(ft_model_tensor(m, i, &name, &t));
        if (!strcmp(name, "model.norm.weight")) memset(t.data, 0, 48 * sizeof(float));
    }
    CHECK_OK(ft_generate(c, 2, ps, pl, &gp, outs, no, NULL));
    CHECK(no[0] == 1 && no[1] == 1 && o[0][0] == 0 && o[1][0] == 0);
    gp.ignore_eos = 1;
    CHECK_OK(ft_generate(c, 2, ps, pl, &gp, outs, no, NULL));
    CHECK(no[0] == 5 && no[1] == 5);
    ft_ctx_free(c);
    ft_model_free(m);
}

typedef struct { int calls[8]; int order_ok; int last; } hook_state;
static ft_status hook(void *u, int layer, ft_layer_weights *w)
{
    hook_state *h = u;
    if (layer != (h->last + 1) % 3) h->order_ok = 0;
    h->last = layer;
    h->calls[layer]++;
    return ft_wmat_present(&w->wq) ? FT_OK : FT_ERR_INTERNAL;
}
static ft_status failing_hook(void *u, int layer, ft_layer_weights *w)
{
    (void)u; (void)w;
    return layer == 1 ? ft_set_error(FT_ERR_IO, "layer 1 unavailable") : FT_OK;
}

TEST(layer_hook)
{
    ft_model *m = random_model(FT_ARCH_OPT, 11);
    REQUIRE(m);
    ft_ctx_params cp = {.max_batch = 2, .max_seq = 16, .threads = 1};
    ft_ctx *c = NULL;
    CHECK_OK(ft_ctx_create(m, &cp, &c));
    REQUIRE(c);
    hook_state h = {.order_ok = 1, .last = 2};
    ft_ctx_set_layer_hook(c, hook, &h);
    int slots[] = {0, 1};
    int32_t a[] = {1, 2, 3}, b[] = {4};
    const int32_t *tp[] = {a, b};
    size_t nt[] = {3, 1};
    float lg[2 * 97];
    CHECK_OK(ft_ctx_forward(c, 2, slots, tp, nt, lg, 0));
    CHECK(h.order_ok && h.calls[0] == 1 && h.calls[1] == 1 && h.calls[2] == 1);
    CHECK(ft_ctx_seq_len(c, 0) == 3 && ft_ctx_seq_len(c, 1) == 1);
    float *k, *v;
    int len, kvd;
    CHECK_OK(ft_ctx_kv(c, 2, 0, &k, &v, &len, &kvd));
    CHECK(len == 3 && kvd == 48 && k != v);
    ft_ctx_set_layer_hook(c, failing_hook, NULL);
    CHECK(ft_ctx_forward(c, 2, slots, tp, nt, lg, 0) == FT_ERR_IO);
    CHECK(ft_ctx_seq_len(c, 0) == 3);   /* unchanged on error */
    /* bad input */
    int32_t bad[] = {97};
    const int32_t *bp[] = {bad};
    ft_ctx_set_layer_hook(c, NULL, NULL);
    CHECK(ft_ctx_forward(c, 1, slots, bp, nt + 1, lg, 0) == FT_ERR_INVALID_ARG);
    int dup[] = {0, 0};
    CHECK(ft_ctx_forward(c, 2, dup, tp, nt, lg, 0) == FT_ERR_INVALID_ARG);
    ft_ctx_free(c);
    ft_model_free(m);
}

/* Sliding-window layers keep a ring of the window's rows: the cache is
 * that much smaller, ft_ctx_kv refuses such a layer, a failure after a
 * ring advanced resets the sequences of the call (their overwritten rows
 * are gone), and the sequence then runs again from scratch to the same
 * logits. */
TEST(sliding_window_ring)
{
    char dir[512];
    const char *data = getenv("FT_TEST_DATA");
    snprintf(dir, sizeof dir, "%s/models/mistral-sw", data ? data : "tests/data");
    ft_model *m = NULL;
    CHECK_OK(ft_model_load(dir, NULL, &m));
    REQUIRE(m);
    const ft_model_config *cfg = ft_model_get_config(m);
    REQUIRE(cfg->sliding_window == 5 && cfg->n_layers == 2);
    ft_ctx_params cp = {.max_batch = 2, .max_seq = 40, .threads = 1};
    ft_ctx *c = NULL;
    CHECK_OK(ft_ctx_create(m, &cp, &c));
    REQUIRE(c);
    int kvdim = cfg->n_kv_heads * cfg->head_dim;
    CHECK(ft_ctx_kv_bytes(c) == (uint64_t)cfg->n_layers * 2 * 2 * 5 * (uint64_t)kvdim * 4);
    CHECK(ft_ctx_kv(c, 0, 0, NULL, NULL, NULL, NULL) == FT_ERR_UNSUPPORTED);
    int32_t toks[30];
    for (int i = 0; i < 30; i++) toks[i] = 3 + (i * 37) % 300;
    int slot = 0;
    const int32_t *tp[] = {toks};
    size_t nt[] = {30};
    float ref[320], got[320];
    CHECK_OK(ft_ctx_forward(c, 1, &slot, tp, nt, ref, 0));
    /* the same 30 tokens 7 + 1 + 1 + 21 at a time: the ring wraps across calls */
    ft_ctx_reset(c, 0);
    size_t parts[] = {7, 1, 1, 21};
    for (int k = 0, off = 0; k < 4; off += (int)parts[k], k++) {
        const int32_t *pp[] = {toks + off};
        CHECK_OK(ft_ctx_forward(c, 1, &slot, pp, &parts[k], got, 0));
    }
    float d = 0;
    for (int v = 0; v < 320; v++) d = fmaxf(d, fabsf(got[v] - ref[v]));
    CHECK_MSG(d < 1e-5f, "chunked ring logits differ by %g", d);
    /* layer 1 fails after layer 0's ring advanced: the sequence is reset */
    ft_ctx_set_layer_hook(c, failing_hook, NULL);
    size_t one = 1;
    const int32_t *p1[] = {toks};
    CHECK(ft_ctx_forward(c, 1, &slot, p1, &one, got, 0) == FT_ERR_IO);
    CHECK(ft_ctx_seq_len(c, 0) == 0);
    ft_ctx_set_layer_hook(c, NULL, NULL);
    CHECK_OK(ft_ctx_forward(c, 1, &slot, tp, nt, got, 0));
    CHECK(!memcmp(got, ref, sizeof ref));
    ft_ctx_free(c);
    ft_model_free(m);
}

TEST(context_limit)
{
    ft_model *m = random_model(FT_ARCH_OPT, 1);
    REQUIRE(m);
    ft_ctx_params cp = {.max_batch = 1, .max_seq = 65};
    ft_ctx *c = NULL;
    CHECK(ft_ctx_create(m, &cp, &c) == FT_ERR_INVALID_ARG);
    CHECK(strstr(ft_last_error(), "max_position_embeddings") != NULL);
    ft_model_free(m);
}

/* bf16 weights with bf16 activations (opt-in: FLEXTIER_BF16_ACTIVATIONS=1)
 * are batch-invariant: each sequence's logits have the same bits whether
 * its prompt is prefilled beside two others (41 rows in the products) or
 * alone, whole or after a prefix (the server's prefix cache), and in
 * decode steps shared with the others or alone. */
static void bf16_batch_invariant(ft_arch_id arch)
{
    int was = ft_wk_bf16_activations();
    ft_wk_set_bf16_activations(1);
    ft_model *m32 = random_model(arch, 11), *m = NULL;
    REQUIRE(m32);
    CHECK_OK(ft_model_convert(m32, FT_WF_BF16, &m));
    REQUIRE(m);
    CHECK(ft_model_weights_format(m) == FT_WF_BF16);
    ft_ctx_params cp = {.max_batch = 3, .max_seq = 48, .threads = 2};
    ft_ctx *c = NULL;
    CHECK_OK(ft_ctx_create(m, &cp, &c));
    REQUIRE(c);
    enum { V = 97, STEPS = 3 };
    int32_t p[3][30];
    size_t pl[3] = {9, 2, 30};
    uint64_t seed = 3;
    for (int j = 0; j < 3; j++)
        for (size_t i = 0; i < pl[j]; i++) p[j][i] = (int32_t)(ft_test_rand(&seed) % V);
    static const int32_t dec[STEPS][3] = {{5, 6, 7}, {40, 41, 42}, {90, 3, 17}};
    float all[STEPS + 1][3][V], one[V];
    int slots[3] = {0, 1, 2};
    const int32_t *tp[3] = {p[0], p[1], p[2]};
    CHECK_OK(ft_ctx_forward(c, 3, slots, tp, pl, &all[0][0][0], 0));
    for (int s = 0; s < STEPS; s++) {
        const int32_t *dp[3] = {&dec[s][0], &dec[s][1], &dec[s][2]};
        size_t n1[3] = {1, 1, 1};
        CHECK_OK(ft_ctx_forward(c, 3, slots, dp, n1, &all[s + 1][0][0], 0));
    }
    for (int j = 0; j < 3; j++) {
        /* alone, whole prompt, then the same decode steps alone */
        ft_ctx_reset(c, j);
        CHECK_OK(ft_ctx_forward(c, 1, &slots[j], &tp[j], &pl[j], one, 0));
        CHECK_MSG(!memcmp(one, all[0][j], sizeof one), "arch %d seq %d: prompt alone differs", arch, j);
        for (int s = 0; s < STEPS; s++) {
            const int32_t *dp = &dec[s][j];
            size_t n1 = 1;
            CHECK_OK(ft_ctx_forward(c, 1, &slots[j], &dp, &n1, one, 0));
            CHECK_MSG(!memcmp(one, all[s + 1][j], sizeof one), "arch %d seq %d: step %d alone differs", arch, j, s);
        }
        /* after a prefix (its first half), as from the prefix cache */
        if (pl[j] > 1) {
            ft_ctx_reset(c, j);
            size_t h = pl[j] / 2, rest = pl[j] - h;
            const int32_t *t2 = p[j] + h;
            CHECK_OK(ft_ctx_forward(c, 1, &slots[j], &tp[j], &h, one, 0));
            CHECK_OK(ft_ctx_forward(c, 1, &slots[j], &t2, &rest, one, 0));
            CHECK_MSG(!memcmp(one, all[0][j], sizeof one), "arch %d seq %d: prompt after a prefix differs", arch, j);
        }
    }
    ft_ctx_free(c);
    ft_model_free(m);
    ft_model_free(m32);
    ft_wk_set_bf16_activations(was);
}

TEST(bf16_activations_batch_invariant_llama) { bf16_batch_invariant(FT_ARCH_LLAMA); }
TEST(bf16_activations_batch_invariant_opt) { bf16_batch_invariant(FT_ARCH_OPT); }

/* More than 32 rows take the sgemm path, fewer the small-batch kernel:
 * a 2 x 30 token prefill in one call equals the same prompts fed 5 tokens
 * at a time. */
TEST(large_prefill_matches_chunked)
{
    for (int arch = FT_ARCH_OPT; arch <= FT_ARCH_LLAMA; arch++) {
        ft_model *m = random_model((ft_arch_id)arch, 21);
        REQUIRE(m);
        ft_ctx_params cp = {.max_batch = 2, .max_seq = 40, .threads = 2};
        ft_ctx *c = NULL;
        CHECK_OK(ft_ctx_create(m, &cp, &c));
        REQUIRE(c);
        int32_t p[2][30];
        uint64_t s = 5;
        for (int j = 0; j < 2; j++)
            for (int i = 0; i < 30; i++) p[j][i] = (int32_t)(ft_test_rand(&s) % 97);
        int slots[] = {0, 1};
        const int32_t *tp[] = {p[0], p[1]};
        size_t nt[] = {30, 30};
        float a[2 * 97], b[2 * 97];
        CHECK_OK(ft_ctx_forward(c, 2, slots, tp, nt, a, 0));
        ft_ctx_reset(c, 0);
        ft_ctx_reset(c, 1);
        for (int k = 0; k < 30; k += 5) {
            const int32_t *cp2[] = {p[0] + k, p[1] + k};
            size_t n5[] = {5, 5};
            CHECK_OK(ft_ctx_forward(c, 2, slots, cp2, n5, b, 0));
        }
        float md = 0;
        for (int i = 0; i < 2 * 97; i++) md = fabsf(a[i] - b[i]) > md ? fabsf(a[i] - b[i]) : md;
        CHECK_MSG(md < 1e-4f, "arch %d: one-shot vs chunked prefill differ by %g", arch, md);
        ft_ctx_free(c);
        ft_model_free(m);
    }
}

/* The sampler's filters on a known distribution: p = .1 .2 .3 .4. */
TEST(sampler_filters)
{
    ft_sampler *s = NULL;
    CHECK_OK(ft_sampler_create(4, &s));
    REQUIRE(s);
    int counts[4] = {0, 0, 0, 0};
    uint64_t rng = 99;
    ft_sampling p = {.temperature = 1.0f, .top_p = 0.65f};
    for (int i = 0; i < 4000; i++) {
        float lg[4] = {logf(1), logf(2), logf(3), logf(4)};
        int32_t t = ft_sampler_sample(s, &p, lg, NULL, 0, &rng);
        REQUIRE(t >= 0 && t < 4);
        counts[t]++;
    }
    /* top-p 0.65 keeps {.4, .3}: renormalized 4/7 and 3/7 */
    CHECK(counts[0] == 0 && counts[1] == 0);
    CHECK_MSG(fabs(counts[3] / 4000.0 - 4.0 / 7) < 0.03, "top-p frequencies %d %d", counts[2], counts[3]);
    /* no filter: all four, roughly in proportion */
    memset(counts, 0, sizeof counts);
    p.top_p = 0;
    for (int i = 0; i < 4000; i++) {
        float lg[4] = {logf(1), logf(2), logf(3), logf(4)};
        counts[ft_sampler_sample(s, &p, lg, NULL, 0, &rng)]++;
    }
    for (int k = 0; k < 4; k++) CHECK_MSG(fabs(counts[k] / 4000.0 - (k + 1) / 10.0) < 0.03, "token %d: %d", k, counts[k]);
    /* top-k 2 then temperature -> only the two largest */
    p.top_k = 2;
    p.temperature = 0.5f;
    memset(counts, 0, sizeof counts);
    for (int i = 0; i < 2000; i++) {
        float lg[4] = {logf(1), logf(2), logf(3), logf(4)};
        counts[ft_sampler_sample(s, &p, lg, NULL, 0, &rng)]++;
    }
    CHECK(counts[0] == 0 && counts[1] == 0 && counts[2] > 0 && counts[3] > counts[2]);
    /* repetition penalty (HF): positive logits divided, negative multiplied */
    ft_sampling g = {.temperature = 0, .repetition_penalty = 2.0f};
    float lg[4] = {-1.0f, 3.0f, 2.0f, 0.5f};
    int32_t hist[] = {1, 1, 0};
    CHECK(ft_sampler_sample(s, &g, lg, hist, 3, &rng) == 2);
    CHECK(lg[1] == 1.5f && lg[0] == -2.0f && lg[2] == 2.0f);
    ft_sampler_free(s);
}

/* ft_ctx_estimate says what ft_ctx_create allocates (memory budgets rely
 * on it), for both architectures, in-memory and external caches, kv
 * dtypes, all-logits contexts; and a layout-only model holds nothing. */
TEST(ctx_estimate_equals_allocation)
{
    for (int a = 0; a < 2; a++) {
        ft_model *m = random_model(a ? FT_ARCH_OPT : FT_ARCH_LLAMA, 3);
        REQUIRE(m);
        ft_ctx_params shapes[] = {
            {.max_batch = 1, .max_seq = 16, .threads = 1},
            {.max_batch = 4, .max_seq = 40, .max_rows = 64, .threads = 2, .kv_dtype = FT_BF16},
            {.max_batch = 3, .max_seq = 33, .threads = 3, .all_logits = 1, .kv_dtype = FT_F16},
            {.max_batch = 2, .max_seq = 64, .max_rows = 9, .threads = 2, .external_kv = 1},
        };
        for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
            ft_ctx *c = NULL;
            uint64_t kv = 0, scratch = 0;
            CHECK_OK(ft_ctx_estimate(m, &shapes[k], &kv, &scratch));
            CHECK_OK(ft_ctx_create(m, &shapes[k], &c));
            REQUIRE(c);
            CHECK_MSG(kv == ft_ctx_kv_bytes(c) && scratch == ft_ctx_scratch_bytes(c),
                      "arch %d shape %zu: estimate kv %llu scratch %llu, allocated %llu %llu", a, k,
                      (unsigned long long)kv, (unsigned long long)scratch, (unsigned long long)ft_ctx_kv_bytes(c),
                      (unsigned long long)ft_ctx_scratch_bytes(c));
            ft_ctx_free(c);
        }
        ft_model_free(m);
    }
}
