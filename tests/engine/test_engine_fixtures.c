/* The engine against transformers: per-position logits and greedy
 * continuations recorded by scripts/fixtures/gen_model_fixtures.py for tiny
 * random OPT, Llama, Mistral and Qwen2 checkpoints saved by transformers
 * 4.46 (tests/data/models/) and by transformers 5 (tests/data/models-tf5/,
 * the rope_parameters / layer_types config layout), and Qwen3, Qwen3-MoE,
 * Mixtral, OLMoE, Phi-3, Gemma 2 and Gemma 3 (text) ones (issue 23; the
 * 4.x set of those by transformers 4.57.6, as 4.46 has no qwen3/gemma3). Every directory of
 * both sets is checked, loaded strictly (every config key known). All
 * prompts run as one batch of mixed lengths. Fixtures whose prompts are
 * text (fixtures.json "texts") also check that the model directory's
 * tokenizer (ft_tokenizer_load_dir: tokenizer.json or vocab.json +
 * merges.txt) gives transformers' ids.
 *
 * Tolerances: 1e-4 absolute on logits for every model. The bf16 checkpoint
 * is compared with transformers computing in f32 on the same bf16-rounded
 * weights (the engine converts bf16 -> f32 exactly at load), so the same
 * bound applies; greedy tokens must be identical. */
#include "ft_test.h"
#include "support/fixture.h"
#include "flextier/engine.h"
#include "flextier/model.h"

#include <dirent.h>
#include <json-c/json.h>
#include <math.h>

#define MAXP FT_FIXTURE_MAXP

static float check_model_dir(const char *set, const char *name, float tol)
{
    char dir[512];
    ft_fixture_dir(set, name, dir, sizeof dir);
    ft_fixture f;
    int loaded = ft_fixture_load(dir, &f);   /* REQUIRE evaluates twice */
    CHECK_MSG(loaded, "%s: fixture files", dir);
    if (!loaded) return INFINITY;
    /* text prompts: the directory's tokenizer gives transformers' ids */
    if (f.ntexts) {
        ft_tokenizer *tk = NULL;
        CHECK_OK(ft_tokenizer_load_dir(dir, &tk));
        for (int i = 0; tk && i < f.ntexts; i++) {
            int32_t *ids = NULL;
            size_t n = 0;
            CHECK_OK(ft_tokenizer_encode(tk, f.texts[i], strlen(f.texts[i]), f.add_special, &ids, &n));
            CHECK_MSG(ids && n == f.plen[i] && !memcmp(ids, f.prompt[i], n * sizeof *ids),
                      "%s/%s: text %d '%s' tokenizes differently (%zu ids, transformers %zu)", set, name, i,
                      f.texts[i], n, f.plen[i]);
            free(ids);
        }
        ft_tokenizer_free(tk);
    }
    ft_model *m = NULL;
    ft_load_params lp = {.config_flags = FT_CONFIG_STRICT};
    CHECK_OK(ft_model_load(dir, &lp, &m));
    if (!m) { ft_fixture_free(&f); return INFINITY; }
    const ft_model_config *cfg = ft_model_get_config(m);
    int V = cfg->vocab;
    size_t rows = 0;
    for (int i = 0; i < f.np; i++) rows += f.plen[i];
    CHECK_MSG(rows * (size_t)V == f.nlogits, "%s/%s: logits.bin size", set, name);
    if (rows * (size_t)V != f.nlogits) { ft_fixture_free(&f); ft_model_free(m); return INFINITY; }

    ft_ctx_params cp = {.max_batch = f.np, .max_seq = 64, .max_rows = (int)rows, .all_logits = 1, .threads = 2};
    ft_ctx *c = NULL;
    CHECK_OK(ft_ctx_create(m, &cp, &c));
    if (!c) { ft_fixture_free(&f); ft_model_free(m); return INFINITY; }
    float *lg = malloc(rows * (size_t)V * sizeof(float));
    int slots[MAXP];
    const int32_t *tp[MAXP];
    size_t nt[MAXP];
    for (int i = 0; i < f.np; i++) { slots[i] = i; tp[i] = f.prompt[i]; nt[i] = f.plen[i]; }

    /* 1. whole batch, mixed lengths, logits of every position */
    CHECK_OK(ft_ctx_forward(c, (size_t)f.np, slots, tp, nt, lg, 1));
    float d = ft_max_abs_diff(lg, f.logits, rows * (size_t)V);
    CHECK_MSG(d <= tol, "%s/%s: prefill logits max |diff| = %g > %g", set, name, d, tol);

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
                  "%s/%s: greedy continuation of prompt %d differs", set, name, i);

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
        float dd = ft_max_abs_diff(lg + (size_t)k * V, f.logits + (off - 1) * (size_t)V, (size_t)V);
        CHECK_MSG(dd <= tol, "%s/%s: chunked prefill, prompt %d: max |diff| %g", set, name, i, dd);
        if (dd > d) d = dd;
    }
    free(lg);
    ft_fixture_free(&f);
    ft_ctx_free(c);
    ft_model_free(m);
    return d;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Every fixture directory of a set; returns how many were checked. */
static int check_set(const char *set)
{
    char path[512];
    const char *data = getenv("FT_TEST_DATA");
    snprintf(path, sizeof path, "%s/%s", data ? data : "tests/data", set);
    DIR *dp = opendir(path);
    CHECK_MSG(dp != NULL, "%s: cannot open", path);
    if (!dp) return 0;
    char *names[64];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(dp)) && n < 64)
        if (e->d_name[0] != '.') names[n++] = strdup(e->d_name);
    closedir(dp);
    qsort(names, (size_t)n, sizeof *names, cmp_str);
    for (int i = 0; i < n; i++) {
        float d = check_model_dir(set, names[i], 1e-4f);
        printf("  %-14s %-24s max |logit diff| = %.3g\n", set, names[i], d);
        free(names[i]);
    }
    return n;
}

TEST(transformers_4_46) { CHECK(check_set("models") >= 27); }
TEST(transformers_5) { CHECK(check_set("models-tf5") >= 28); }

TEST(bad_dirs)
{
    ft_model *m = NULL;
    CHECK(ft_model_load("/nonexistent-dir", NULL, &m) == FT_ERR_NOT_FOUND);
    CHECK(m == NULL);
    CHECK(strstr(ft_last_error(), "config.json") != NULL);
}

/* Checkpoint variants written from opt-tiny's tensors: names without the
 * "model." prefix (as the original facebook/opt checkpoints have) load and
 * give the same logits; a missing tensor and a wrong shape are errors that
 * name the tensor. */
#include "flextier/model.h"
#include <unistd.h>

static int copy_file(const char *from, const char *to)
{
    FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
    int ok = a && b;
    char buf[4096];
    size_t n;
    while (ok && (n = fread(buf, 1, sizeof buf, a)) > 0) ok = fwrite(buf, 1, n, b) == n;
    if (a) fclose(a);
    if (b) fclose(b);
    return ok;
}

static ft_status write_variant(const char *src, const char *dst, int mode)
{
    /* mode 0: strip "model." prefix; 1: drop fc1.bias of layer 1; 2: wrong shape */
    char p1[640], p2[640];
    snprintf(p1, sizeof p1, "%s/config.json", src);
    snprintf(p2, sizeof p2, "%s/config.json", dst);
    if (!copy_file(p1, p2)) return FT_ERR_IO;
    ft_checkpoint *ck = NULL;
    ft_status st = ft_checkpoint_open(src, &ck);
    if (st) return st;
    size_t n = ft_checkpoint_count(ck), k = 0;
    ft_named_tensor *t = calloc(n, sizeof *t);
    char (*names)[128] = calloc(n, sizeof *names);
    for (size_t i = 0; i < n && !st; i++) {
        const char *name = ft_checkpoint_name(ck, i);
        if (mode == 1 && !strcmp(name, "model.decoder.layers.1.fc1.bias")) continue;
        snprintf(names[k], sizeof names[k], "%s", mode == 0 && !strncmp(name, "model.", 6) ? name + 6 : name);
        t[k].name = names[k];
        st = ft_checkpoint_get(ck, name, &t[k].tensor);
        if (mode == 2 && !strcmp(name, "model.decoder.layers.0.fc2.weight")) t[k].tensor.shape[1] /= 2;
        k++;
    }
    snprintf(p2, sizeof p2, "%s/model.safetensors", dst);
    if (!st) st = ft_safetensors_write(p2, t, k, NULL);
    free(t);
    free(names);
    ft_checkpoint_close(ck);
    return st;
}

TEST(checkpoint_variants)
{
    char src[512], dst[512];
    const char *data = getenv("FT_TEST_DATA");
    snprintf(src, sizeof src, "%s/models/opt-tiny", data ? data : "tests/data");
    snprintf(dst, sizeof dst, "/tmp/ft_engine_ckvar_%d", (int)getpid());
    char cmd[600];
    snprintf(cmd, sizeof cmd, "mkdir -p %s", dst);
    REQUIRE(system(cmd) == 0);

    ft_model *a = NULL, *b = NULL;
    CHECK_OK(write_variant(src, dst, 0));
    CHECK_OK(ft_model_load(src, NULL, &a));
    CHECK_OK(ft_model_load(dst, NULL, &b));
    if (a && b) {
        ft_ctx_params cp = {.max_batch = 1, .max_seq = 8, .threads = 1};
        ft_ctx *ca = NULL, *cb = NULL;
        CHECK_OK(ft_ctx_create(a, &cp, &ca));
        CHECK_OK(ft_ctx_create(b, &cp, &cb));
        int32_t toks[] = {5, 6, 7, 8};
        const int32_t *tp[] = {toks};
        size_t nt[] = {4};
        int slot[] = {0};
        float la[320], lb[320];
        CHECK_OK(ft_ctx_forward(ca, 1, slot, tp, nt, la, 0));
        CHECK_OK(ft_ctx_forward(cb, 1, slot, tp, nt, lb, 0));
        CHECK(!memcmp(la, lb, sizeof la));
        ft_ctx_free(ca);
        ft_ctx_free(cb);
    }
    ft_model_free(a);
    ft_model_free(b);

    ft_model *m = NULL;
    CHECK_OK(write_variant(src, dst, 1));
    CHECK(ft_model_load(dst, NULL, &m) == FT_ERR_NOT_FOUND && m == NULL);
    CHECK_MSG(strstr(ft_last_error(), "layers.1.fc1.bias") != NULL, "%s", ft_last_error());
    CHECK_OK(write_variant(src, dst, 2));
    CHECK(ft_model_load(dst, NULL, &m) == FT_ERR_CORRUPT && m == NULL);
    CHECK_MSG(strstr(ft_last_error(), "layers.0.fc2.weight") && strstr(ft_last_error(), "shape"), "%s",
              ft_last_error());
    snprintf(cmd, sizeof cmd, "rm -rf %s", dst);
    CHECK(system(cmd) == 0);
}

/* The demo model (demo/kjv-llama, trained by scripts/demo/train_demo_model.py)
 * against transformers (scripts/demo/reference_demo_model.py): the prompt's
 * ids through the model directory's tokenizer, the last position's logits
 * within 1e-4, and the greedy continuation and its text identical. */
TEST(demo_model)
{
    const char *dirs = getenv("FT_DEMO_MODEL");
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "%s", dirs ? dirs : "demo/kjv-llama");
    snprintf(path, sizeof path, "%s/reference.json", dir);
    json_object *root = json_object_from_file(path);
    CHECK_MSG(root != NULL, "%s: missing", path);
    if (!root) return;
    json_object *jp, *jids, *jl, *jg, *jt;
    REQUIRE(json_object_object_get_ex(root, "prompt", &jp) && json_object_object_get_ex(root, "ids", &jids) &&
            json_object_object_get_ex(root, "last_logits", &jl) && json_object_object_get_ex(root, "greedy", &jg) &&
            json_object_object_get_ex(root, "greedy_text", &jt));
    ft_tokenizer *tk = NULL;
    CHECK_OK(ft_tokenizer_load_dir(dir, &tk));
    ft_model *m = NULL;
    ft_load_params lp = {.config_flags = FT_CONFIG_STRICT};
    CHECK_OK(ft_model_load(dir, &lp, &m));
    if (!tk || !m) { ft_tokenizer_free(tk); ft_model_free(m); json_object_put(root); return; }
    const char *prompt = json_object_get_string(jp);
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK_OK(ft_tokenizer_encode(tk, prompt, strlen(prompt), 1, &ids, &n));
    size_t nref = json_object_array_length(jids);
    int same = ids && n == nref;
    for (size_t i = 0; same && i < n; i++) same = ids[i] == json_object_get_int(json_object_array_get_idx(jids, i));
    CHECK_MSG(same, "demo prompt tokenizes differently");
    int V = ft_model_get_config(m)->vocab;
    REQUIRE((int)json_object_array_length(jl) == V);
    size_t steps = json_object_array_length(jg);
    ft_ctx_params cp = {.max_batch = 1, .max_seq = (int)(n + steps + 1), .threads = 2};
    ft_ctx *c = NULL;
    CHECK_OK(ft_ctx_create(m, &cp, &c));
    float *lg = malloc((size_t)V * sizeof(float));
    int32_t gen[64];
    int slot = 0;
    if (c && same && lg && steps <= 64) {
        const int32_t *tp[] = {ids};
        size_t nt[] = {n};
        CHECK_OK(ft_ctx_forward(c, 1, &slot, tp, nt, lg, 0));
        float d = 0;
        for (int v = 0; v < V; v++) {
            float e = fabsf(lg[v] - (float)json_object_get_double(json_object_array_get_idx(jl, (size_t)v)));
            if (!(e <= d)) d = e;
        }
        /* the reference is rounded to 1e-6 in the JSON */
        CHECK_MSG(d <= 1e-4f, "demo model: last-position logits max |diff| %g", d);
        printf("  demo/kjv-llama: max |logit diff| = %.3g\n", d);
        for (size_t s = 0; s < steps; s++) {
            int32_t best = 0;
            for (int v = 1; v < V; v++) if (lg[v] > lg[best]) best = v;
            gen[s] = best;
            if (s + 1 == steps) break;
            const int32_t *t1[] = {&gen[s]};
            size_t one = 1;
            CHECK_OK(ft_ctx_forward(c, 1, &slot, t1, &one, lg, 0));
        }
        int gsame = 1;
        for (size_t s = 0; s < steps; s++) gsame &= gen[s] == json_object_get_int(json_object_array_get_idx(jg, s));
        CHECK_MSG(gsame, "demo model: greedy continuation differs");
        char *txt = NULL;
        size_t tl = 0;
        CHECK_OK(ft_tokenizer_decode(tk, gen, steps, 0, &txt, &tl));
        CHECK_MSG(txt && !strcmp(txt, json_object_get_string(jt)), "demo model: text '%s' != '%s'", txt ? txt : "",
                  json_object_get_string(jt));
        free(txt);
    }
    free(lg);
    free(ids);
    ft_ctx_free(c);
    ft_model_free(m);
    ft_tokenizer_free(tk);
    json_object_put(root);
}
