/* The engine against transformers: per-position logits and greedy
 * continuations recorded by scripts/fixtures/gen_model_fixtures.py for tiny
 * random OPT and Llama checkpoints (tests/data/models/). All prompts run as
 * one batch of mixed lengths.
 *
 * Tolerances: 1e-4 absolute on logits for every model. The bf16 checkpoint
 * is compared with transformers computing in f32 on the same bf16-rounded
 * weights (the engine converts bf16 -> f32 exactly at load), so the same
 * bound applies; greedy tokens must be identical. */
#include "ft_test.h"
#include "flextier/engine.h"

#include <json-c/json.h>
#include <math.h>

#define MAXP 8

typedef struct {
    int np;
    int32_t prompt[MAXP][64];
    size_t plen[MAXP];
    int32_t greedy[MAXP][32];
    size_t glen[MAXP];
    float *logits;
    size_t nlogits;
} fixture;

static int load_fixture(const char *dir, fixture *f)
{
    char path[512];
    memset(f, 0, sizeof *f);
    snprintf(path, sizeof path, "%s/fixtures.json", dir);
    json_object *root = json_object_from_file(path);
    if (!root) return 0;
    json_object *pr, *gr;
    if (!json_object_object_get_ex(root, "prompts", &pr) || !json_object_object_get_ex(root, "greedy", &gr)) {
        json_object_put(root);
        return 0;
    }
    f->np = (int)json_object_array_length(pr);
    for (int i = 0; i < f->np && i < MAXP; i++) {
        json_object *p = json_object_array_get_idx(pr, i), *g = json_object_array_get_idx(gr, i);
        f->plen[i] = json_object_array_length(p);
        for (size_t k = 0; k < f->plen[i]; k++) f->prompt[i][k] = json_object_get_int(json_object_array_get_idx(p, k));
        f->glen[i] = json_object_array_length(g);
        for (size_t k = 0; k < f->glen[i]; k++) f->greedy[i][k] = json_object_get_int(json_object_array_get_idx(g, k));
    }
    json_object_put(root);
    snprintf(path, sizeof path, "%s/logits.bin", dir);
    FILE *fp = fopen(path, "rb");
    if (!fp) return 0;
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    f->logits = malloc((size_t)n);
    f->nlogits = (size_t)n / 4;
    size_t r = fread(f->logits, 1, (size_t)n, fp);
    fclose(fp);
    return r == (size_t)n;
}

static float max_abs_diff(const float *a, const float *b, size_t n)
{
    float m = 0;
    for (size_t i = 0; i < n; i++) {
        float d = fabsf(a[i] - b[i]);
        if (!(d <= m)) m = d;   /* NaN propagates */
    }
    return m;
}

static void check_model(const char *name, float tol)
{
    char dir[512];
    const char *data = getenv("FT_TEST_DATA");
    snprintf(dir, sizeof dir, "%s/models/%s", data ? data : "tests/data", name);
    fixture f;
    REQUIRE(load_fixture(dir, &f));
    ft_model *m = NULL;
    CHECK_OK(ft_model_load(dir, NULL, &m));
    REQUIRE(m);
    const ft_model_config *cfg = ft_model_get_config(m);
    int V = cfg->vocab;
    size_t rows = 0;
    for (int i = 0; i < f.np; i++) rows += f.plen[i];
    REQUIRE(rows * (size_t)V == f.nlogits);

    ft_ctx_params cp = {.max_batch = f.np, .max_seq = 64, .max_rows = (int)rows, .all_logits = 1, .threads = 2};
    ft_ctx *c = NULL;
    CHECK_OK(ft_ctx_create(m, &cp, &c));
    REQUIRE(c);
    float *lg = malloc(rows * (size_t)V * sizeof(float));
    int slots[MAXP];
    const int32_t *tp[MAXP];
    size_t nt[MAXP];
    for (int i = 0; i < f.np; i++) { slots[i] = i; tp[i] = f.prompt[i]; nt[i] = f.plen[i]; }

    /* 1. whole batch, mixed lengths, logits of every position */
    CHECK_OK(ft_ctx_forward(c, (size_t)f.np, slots, tp, nt, lg, 1));
    float d = max_abs_diff(lg, f.logits, rows * (size_t)V);
    CHECK_MSG(d <= tol, "%s: prefill logits max |diff| = %g > %g", name, d, tol);
    printf("  %s: prefill max |logit diff| = %.3g\n", name, d);

    /* 2. greedy decode of the batch, one row per sequence per step */
    int32_t cur[MAXP], gen[MAXP][32];
    for (int i = 0; i < f.np; i++) {
        const float *row = lg + 0;
        size_t off = 0;
        for (int k = 0; k <= i; k++) off += f.plen[k];
        row = lg + (off - 1) * (size_t)V;
        int32_t best = 0;
        for (int v = 1; v < V; v++) if (row[v] > row[best]) best = v;
        cur[i] = best;
        gen[i][0] = best;
    }
    size_t steps = f.glen[0];
    for (size_t s = 1; s < steps; s++) {
        for (int i = 0; i < f.np; i++) { tp[i] = &cur[i]; nt[i] = 1; }
        CHECK_OK(ft_ctx_forward(c, (size_t)f.np, slots, tp, nt, lg, 0));
        for (int i = 0; i < f.np; i++) {
            const float *row = lg + (size_t)i * V;
            int32_t best = 0;
            for (int v = 1; v < V; v++) if (row[v] > row[best]) best = v;
            cur[i] = best;
            gen[i][s] = best;
        }
    }
    for (int i = 0; i < f.np; i++)
        CHECK_MSG(!memcmp(gen[i], f.greedy[i], steps * sizeof(int32_t)),
                  "%s: greedy continuation of prompt %d differs", name, i);

    /* 3. the cache continues correctly: prompts fed in two chunks, in a
     * different slot order, give the same last-position logits */
    for (int i = 0; i < f.np; i++) ft_ctx_reset(c, i);
    int rs[MAXP];
    for (int i = 0; i < f.np; i++) {
        rs[i] = f.np - 1 - i;
        tp[i] = f.prompt[i];
        nt[i] = f.plen[i] > 1 ? f.plen[i] / 2 : f.plen[i];
    }
    CHECK_OK(ft_ctx_forward(c, (size_t)f.np, rs, tp, nt, NULL, 0));
    int n2 = 0;
    int s2[MAXP], idx[MAXP];
    for (int i = 0; i < f.np; i++) {
        if (nt[i] == f.plen[i]) continue;
        s2[n2] = rs[i];
        idx[n2] = i;
        tp[n2] = f.prompt[i] + nt[i];
        nt[n2] = f.plen[i] - nt[i];
        n2++;
    }
    CHECK_OK(ft_ctx_forward(c, (size_t)n2, s2, tp, nt, lg, 0));
    for (int k = 0; k < n2; k++) {
        int i = idx[k];
        size_t off = 0;
        for (int q = 0; q <= i; q++) off += f.plen[q];
        float dd = max_abs_diff(lg + (size_t)k * V, f.logits + (off - 1) * (size_t)V, (size_t)V);
        CHECK_MSG(dd <= tol, "%s: chunked prefill, prompt %d: max |diff| %g", name, i, dd);
    }
    free(lg);
    free(f.logits);
    ft_ctx_free(c);
    ft_model_free(m);
}

TEST(opt_tiny) { check_model("opt-tiny", 1e-4f); }
TEST(opt_tiny_proj) { check_model("opt-tiny-proj", 1e-4f); }
TEST(opt_tiny_postln) { check_model("opt-tiny-postln", 1e-4f); }
TEST(llama_tiny) { check_model("llama-tiny", 1e-4f); }
TEST(llama_tiny_tied_rope3) { check_model("llama-tiny-tied-rope3", 1e-4f); }
TEST(llama_tiny_bf16) { check_model("llama-tiny-bf16", 1e-4f); }

TEST(bad_dirs)
{
    ft_model *m = NULL;
    CHECK(ft_model_load("/nonexistent-dir", NULL, &m) == FT_ERR_NOT_FOUND);
    CHECK(m == NULL);
    CHECK(strstr(ft_last_error(), "config.json") != NULL);
}
