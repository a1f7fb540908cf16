/* Offloading on every fixture model (tests/data/models: OPT pre/post-LN and
 * project_in/out, Llama with GQA, tied embeddings, llama3 and yarn RoPE,
 * bf16, Mistral, Qwen2, sliding windows; Qwen3, Phi-3, Gemma 2/3, Mixtral, Qwen3-MoE, OLMoE): the fixture
 * prompts as one batch, prefill then greedy
 * decoding, with weights and KV cache streamed through host and disk.
 *
 * Lossless placements (f32 cache rows, byte-plane weights) must give
 * logits bit-identical to the in-memory engine at every step. With q4
 * the documented tolerance (docs/offload.md) is checked on the relative
 * RMS error of all logits (||got - ref|| / ||ref||): at most 0.15 with a
 * q4 cache, 0.45 with q4 weights (mixtures of experts: 0.3 and 0.6, since
 * a flipped route is a discontinuous change). These tiny models have uniformly random
 * weights in 16- to 64-wide layers, q4's worst case; both runs are fed the
 * in-memory run's greedy tokens, so the steps stay comparable. */
#include "ft_test.h"
#include "support/fixture.h"
#include "flextier/offload.h"
#include "support/offload_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define MAXP FT_FIXTURE_MAXP
#define STEPS 6

typedef ft_fixture prompts;   /* the prompts of a fixture (support/fixture.h) */

/* Prefill, then STEPS decode steps. Without a scheduler (the in-memory
 * reference) the greedy tokens are picked and written to feed; with one,
 * feed's tokens are used. With kvp the KV cache is offloaded. Returns the last-position logits
 * of every call: (1 + STEPS) x np x vocab floats. */
static float *run(ft_model *m, ft_offload *o, const prompts *f, const ft_policy *kvp, int32_t *feed,
                  ft_status *st)
{
    const ft_model_config *cfg = ft_model_get_config(m);
    size_t V = (size_t)cfg->vocab, np = (size_t)f->np, maxp = 0;
    for (int i = 0; i < f->np; i++) maxp = f->plen[i] > maxp ? f->plen[i] : maxp;
    ft_ctx_params cp = {.max_batch = f->np, .max_seq = (int)maxp + STEPS + 1, .threads = 1};
    ft_ctx *c = NULL;
    ft_kv_offload *kv = NULL;
    float *all = calloc((1 + STEPS) * np * V, sizeof(float));
    if ((*st = offload_ctx(m, cp, o, kvp, 0, 0, &c, &kv))) goto out;
    int slots[MAXP];
    const int32_t *tp[MAXP];
    size_t nt[MAXP];
    for (int i = 0; i < f->np; i++) { slots[i] = i; tp[i] = f->prompt[i]; nt[i] = f->plen[i]; }
    if ((*st = ft_ctx_forward(c, np, slots, tp, nt, all, 0))) goto out;
    for (int s = 1; s <= STEPS; s++) {
        int32_t *tok = feed + (size_t)(s - 1) * np;
        const float *prev = all + (size_t)(s - 1) * np * V;
        for (size_t i = 0; i < np; i++) {
            if (!o) {   /* the reference run picks the greedy tokens */
                const float *row = prev + i * V;
                int32_t best = 0;
                for (size_t v = 1; v < V; v++) if (row[v] > row[best]) best = (int32_t)v;
                tok[i] = best;
            }
            tp[i] = &tok[i];
            nt[i] = 1;
        }
        if ((*st = ft_ctx_forward(c, np, slots, tp, nt, all + (size_t)s * np * V, 0))) goto out;
    }
    if (kv) *st = ft_kv_offload_sync(kv);
out:
    ft_kv_offload_free(kv);
    ft_ctx_free(c);
    return all;
}

static void check_model(const char *name)
{
    char dir[512], disk[600];
    ft_fixture_dir("models", name, dir, sizeof dir);
    snprintf(disk, sizeof disk, "/tmp/ft-offload-fx-%d", (int)getpid());
    prompts f;
    int ok = ft_fixture_load(dir, &f) && f.np > 0;
    ft_fixture_free(&f);   /* the prompts only: no logits needed */
    REQUIRE(ok);
    ft_model *ref_m = NULL;
    CHECK_OK(ft_model_load(dir, NULL, &ref_m));
    REQUIRE(ref_m);
    size_t V = (size_t)ft_model_get_config(ref_m)->vocab, n = (1 + STEPS) * (size_t)f.np * V;
    int32_t feed[STEPS * MAXP];
    ft_status st;
    float *ref = run(ref_m, NULL, &f, NULL, feed, &st);
    CHECK_OK(st);
    double scale = 0;
    for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs((double)ref[i]));

    static const char *const specs[] = {"w=0,50,50 c=0,50,50 cw=bp", "w=0,100 c=0,0,100 cc=q4",
                                        "w=0,100 c=0,0,100 cw=q4", "w=0,100 c=0,0,100 cw=q4 cc=q4"};
    static const double tol_dense[] = {0, 0.15, 0.45, 0.45};   /* relative RMS; 0: bit-identical */
    /* a mixture of experts: a q4 error that flips a near-tie route sends
     * the row through another expert (qwen3moe-tiny measures 0.21 with a
     * q4 cache, 0.36 with q4 weights) */
    static const double tol_moe[] = {0, 0.3, 0.6, 0.6};
    const double *tol = ft_model_get_config(ref_m)->n_experts ? tol_moe : tol_dense;
    for (int k = 0; k < 4; k++) {
        ft_offload_params p;
        ft_offload_default_params(&p);
        char full[800];
        snprintf(full, sizeof full, "%s disk=file:%s", specs[k], disk);
        CHECK_OK(ft_policy_parse(full, &p.policy));
        ft_load_params lp = {0};
        lp.external_layers = 1;
        ft_model *m = NULL;
        CHECK_OK(ft_model_load(dir, &lp, &m));
        ft_offload *o = NULL;
        st = ft_offload_create(m, dir, &p, &o);
        CHECK_MSG(st == FT_OK, "%s %s: %s", name, specs[k], ft_last_error());
        if (st == FT_OK) {
            float *got = run(m, o, &f, &p.policy, feed, &st);
            CHECK_MSG(st == FT_OK, "%s %s: %s", name, specs[k], ft_last_error());
            double maxd = 0, se = 0, sr = 0;
            size_t diff = 0;
            for (size_t i = 0; got && i < n; i++) {
                double d = fabs((double)got[i] - (double)ref[i]);
                maxd = d > maxd ? d : maxd;
                diff += got[i] != ref[i];
                se += d * d;
                sr += (double)ref[i] * ref[i];
            }
            double rel = sr > 0 ? sqrt(se / sr) : 0;
            if (tol[k] == 0) CHECK_MSG(diff == 0, "%s %s: %zu logits differ (max %g)", name, specs[k], diff, maxd);
            else CHECK_MSG(rel <= tol[k], "%s %s: relative RMS error %.3f > %.2f", name, specs[k], rel, tol[k]);
            printf("  %-22s %-32s max |logit diff| %.3g (%.1f%% of the logit scale %.3g), relative RMS %.3f\n",
                   name, specs[k], maxd, 100 * maxd / scale, scale, rel);
            free(got);
            ft_offload_free(o);
        }
        ft_model_free(m);
    }
    free(ref);
    ft_model_free(ref_m);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf %s", disk);
    if (system(cmd) != 0) printf("  (could not remove %s)\n", disk);
}

TEST(llama_tiny) { check_model("llama-tiny"); }
TEST(llama_tiny_bf16) { check_model("llama-tiny-bf16"); }
TEST(llama_tiny_tied_rope3) { check_model("llama-tiny-tied-rope3"); }
TEST(mistral_tiny) { check_model("mistral-tiny"); }
TEST(qwen2_tiny) { check_model("qwen2-tiny"); }
TEST(opt_tiny) { check_model("opt-tiny"); }
TEST(opt_tiny_postln) { check_model("opt-tiny-postln"); }
TEST(opt_tiny_proj) { check_model("opt-tiny-proj"); }
/* sliding windows shorter than the prompts: the offloaded cache keeps full
 * rows and masks attention to the window, the in-memory one keeps a ring */
TEST(mistral_sw) { check_model("mistral-sw"); }
TEST(qwen2_sw) { check_model("qwen2-sw"); }
TEST(llama_rope_yarn) { check_model("llama-rope-yarn"); }
/* issue 23's families: q/k norms, fused projections, gemma's norms and
 * soft-capping, and mixtures of experts (every expert a slot of its own,
 * placed, streamed and verified like any layer tensor; a dense layer of
 * qwen3moe-tiny (mlp_only_layers) has no expert slots) */
TEST(qwen3_tiny) { check_model("qwen3-tiny"); }
TEST(phi3_tiny) { check_model("phi3-tiny"); }
TEST(gemma2_tiny) { check_model("gemma2-tiny"); }
TEST(gemma3_tiny) { check_model("gemma3-tiny"); }
TEST(mixtral_tiny) { check_model("mixtral-tiny"); }
TEST(qwen3moe_tiny) { check_model("qwen3moe-tiny"); }
TEST(olmoe_tiny) { check_model("olmoe-tiny"); }
TEST(qwen2moe_shared) { check_model("qwen2moe-shared"); }
