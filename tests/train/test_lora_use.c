/* LoRA adapters at inference (engine ft_lora, session lora, train's PEFT
 * reader; docs/training.md "Adapters at inference"): several adapters with
 * scales give transformers + peft's logits (tests/data/lora/multi,
 * scripts/fixtures/gen_lora_multi_fixtures.py) on llama and OPT; the
 * engine's forward with an adapter equals the trainer's forward on f32,
 * bf16, q8 and q4 weights; weights streamed from a disk tier, batching
 * and the server's slot calls give the same logits as one sequence in
 * memory; bad adapters are refused. */
#include "ft_test.h"
#include "support/cli_run.h"
#include "support/fixture.h"
#include "flextier/engine.h"
#include "flextier/model.h"
#include "flextier/session.h"
#include "flextier/train.h"
#include "flextier/chat.h"

#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static char multi[1024];

static json_object *multi_case(json_object **root, const char *name)
{
    char path[1200];
    ft_fixture_dir("lora", "multi", multi, sizeof multi);
    snprintf(path, sizeof path, "%s/multi.json", multi);
    *root = json_object_from_file(path);
    if (!*root) return NULL;
    json_object *cases = json_object_object_get(*root, "cases");
    return cases ? json_object_object_get(cases, name) : NULL;
}

static ft_session *open_with(const char *model, const ft_session_lora *ls, size_t n, int weights, const char *policy)
{
    char dir[1024];
    ft_fixture_dir("models", model, dir, sizeof dir);
    ft_session_params p;
    ft_session_default_params(&p);
    p.kv_dtype = FT_F32;
    p.threads = 2;
    p.weights = weights;
    p.lora = ls;
    p.n_lora = n;
    if (policy) {
        p.offload = FT_OFFLOAD_POLICY;
        if (ft_policy_parse(policy, &p.policy)) return NULL;
    }
    ft_session *s = NULL;
    ft_status st = ft_session_open(dir, &p, &s);
    if (st) fprintf(stderr, "session: %s\n", ft_last_error());
    return st ? NULL : s;
}

static ft_status last_logits(ft_session *s, const int32_t *ids, size_t n, float *out)
{
    int slot = 0;
    ft_session_reset(s);
    return ft_session_forward(s, 1, &slot, &ids, &n, out, 0);
}

static double maxdiff(const float *a, const float *b, int n)
{
    double d = 0;
    for (int i = 0; i < n; i++) d = fmax(d, fabs((double)a[i] - (double)b[i]));
    return d;
}

/* the case's adapters, with PEFT's logits and greedy tokens */
static void check_case(const char *name)
{
    json_object *root = NULL, *c = multi_case(&root, name);
    REQUIRE(c);
    json_object *ads = json_object_object_get(c, "adapters"), *pr = json_object_object_get(c, "prompt"),
                *lg = json_object_object_get(c, "last_logits"), *gr = json_object_object_get(c, "greedy");
    const char *model = strrchr(json_object_get_string(json_object_object_get(c, "model")), '/') + 1;
    ft_session_lora ls[4];
    char dirs[4][1200];
    size_t na = json_object_array_length(ads);
    REQUIRE(na <= 4);
    for (size_t i = 0; i < na; i++) {
        json_object *a = json_object_array_get_idx(ads, i);
        snprintf(dirs[i], sizeof dirs[i], "%s/%s", multi, json_object_get_string(json_object_object_get(a, "dir")));
        ls[i].dir = dirs[i];
        ls[i].scale = (float)json_object_get_double(json_object_object_get(a, "scale"));
    }
    ft_session *s = open_with(model, ls, na, FT_WEIGHTS_AS_STORED, NULL);
    REQUIRE(s);
    int V = ft_session_config(s)->vocab;
    REQUIRE((int)json_object_array_length(lg) == V);
    size_t np = json_object_array_length(pr), ng = json_object_array_length(gr);
    int32_t ids[64];
    for (size_t i = 0; i < np; i++) ids[i] = json_object_get_int(json_object_array_get_idx(pr, i));
    float *got = malloc((size_t)V * 4), *want = malloc((size_t)V * 4), *base = malloc((size_t)V * 4);
    REQUIRE(got && want && base);
    for (int v = 0; v < V; v++) want[v] = (float)json_object_get_double(json_object_array_get_idx(lg, v));
    CHECK_OK(last_logits(s, ids, np, got));
    double d = maxdiff(got, want, V);
    CHECK_MSG(d < 1e-4, "%s: logits differ from transformers + peft by %g", name, d);
    /* greedy tokens as peft's */
    int32_t out[64];
    size_t nout = 0;
    const int32_t *pp = ids;
    ft_gen_params gp;
    memset(&gp, 0, sizeof gp);
    gp.max_new_tokens = ng;
    gp.ignore_eos = 1;
    int32_t *op = out;
    CHECK_OK(ft_session_generate(s, 1, &pp, &np, &gp, &op, &nout, NULL));
    CHECK(nout == ng);
    for (size_t i = 0; i < ng && i < nout; i++)
        CHECK_MSG(out[i] == json_object_get_int(json_object_array_get_idx(gr, i)), "%s: token %zu: %d", name, i,
                  (int)out[i]);
    /* without the adapters the logits are other ones (the test can fail) */
    ft_session *b = open_with(model, NULL, 0, FT_WEIGHTS_AS_STORED, NULL);
    REQUIRE(b);
    CHECK_OK(last_logits(b, ids, np, base));
    CHECK(maxdiff(base, want, V) > 1e-2);
    ft_session_close(b);
    ft_session_close(s);
    free(got); free(want); free(base);
    json_object_put(root);
}

TEST(two_adapters_with_scales_match_peft) { check_case("llama-ab"); }
TEST(one_adapter_matches_peft) { check_case("llama-a"); }
TEST(opt_adapter_matches_peft) { check_case("opt-a"); }

/* LoRA on the experts (PEFT's target_parameters on transformers 5's fused
 * gate_up_proj / down_proj; tests/data/lora/NAME-experts): the engine's
 * logits are transformers + peft's; the same adapter written in
 * transformers 4's per-expert form (mixtral's experts.E.w1 / w3 / w2, the
 * others' experts.E.gate_proj / up_proj / down_proj modules) gives the same
 * logits bit for bit */
static void experts_case(const char *model, const char *const ex[4])
{
    char fx[1024], dir[1200], path[1300];
    snprintf(path, sizeof path, "%s-experts", model);
    ft_fixture_dir("lora", path, fx, sizeof fx);
    snprintf(path, sizeof path, "%s/run.json", fx);
    json_object *run = json_object_from_file(path);
    REQUIRE(run);
    snprintf(dir, sizeof dir, "%s/final", fx);
    ft_session_lora ls = {dir, 1.0f};
    ft_session *s = open_with(model, &ls, 1, FT_WEIGHTS_AS_STORED, NULL);
    REQUIRE(s);
    const ft_model_config *c = ft_session_config(s);
    const int V = c->vocab, E = c->n_experts, H = c->hidden, F = c->moe_ffn, NL = c->n_layers;
    json_object *pr = json_object_object_get(run, "prompt"), *lg = json_object_object_get(run, "last_logits");
    size_t np = json_object_array_length(pr);
    int32_t ids[64];
    for (size_t i = 0; i < np; i++) ids[i] = json_object_get_int(json_object_array_get_idx(pr, i));
    float *got = malloc((size_t)V * 4), *want = malloc((size_t)V * 4), *v4 = malloc((size_t)V * 4);
    REQUIRE(got && want && v4);
    for (int v = 0; v < V; v++) want[v] = (float)json_object_get_double(json_object_array_get_idx(lg, v));
    CHECK_OK(last_logits(s, ids, np, got));
    double d = maxdiff(got, want, V);
    printf("  %s: experts adapter, max |flextier - transformers + peft| = %.3g\n", model, d);
    CHECK_MSG(d < 1e-4, "%s: logits differ from transformers + peft by %g", model, d);
    ft_session_close(s);
    /* the per-expert form: A_e = rows e r.. of A, B_e = columns j E + e of B (gate_up: gate rows, up rows) */
    ft_peft_adapter *a = NULL;
    CHECK_OK(ft_peft_adapter_read(dir, &a));
    REQUIRE(a);
    const int r = a->rank;
    size_t cap = a->n + 3 * (size_t)E * (size_t)NL, n = 0;
    ft_named_tensor *nt = calloc(2 * cap, sizeof *nt);
    char (*names)[400] = calloc(2 * cap, sizeof *names);
    float **bufs = calloc(2 * cap, sizeof *bufs);
    REQUIRE(nt && names && bufs);
    int n_exp = 0;
    for (size_t i = 0; i < a->n; i++) {
        const ft_peft_module *md = &a->mods[i];
        if (!md->experts) {   /* the attention modules as they are */
            int64_t as[2] = {r, md->in}, bs[2] = {md->out, r};
            snprintf(names[n], sizeof names[n], "base_model.model.%s.lora_A.weight", md->module);
            snprintf(names[n + 1], sizeof names[n + 1], "base_model.model.%s.lora_B.weight", md->module);
            nt[n].name = names[n];
            nt[n + 1].name = names[n + 1];
            CHECK_OK(ft_tensor_init(&nt[n].tensor, FT_F32, 2, as, md->A));
            CHECK_OK(ft_tensor_init(&nt[n + 1].tensor, FT_F32, 2, bs, md->B));
            n += 2;
            continue;
        }
        n_exp++;
        int L = atoi(strstr(md->module, "layers.") + 7), gu = md->out == 2 * F && md->in == H;
        for (int e = 0; e < E; e++)
            for (int part = 0; part < (gu ? 2 : 1); part++) {
                const int rows = gu ? F : md->out, k = gu ? part : 2;
                int64_t as[2] = {r, md->in}, bs[2] = {rows, r};
                float *B = malloc((size_t)rows * (size_t)r * 4);
                REQUIRE(B);
                for (int o = 0; o < rows; o++)
                    for (int j = 0; j < r; j++)
                        B[(size_t)o * (size_t)r + (size_t)j] =
                            md->B[(size_t)(part * F + o) * (size_t)E * (size_t)r + (size_t)j * (size_t)E + (size_t)e];
                bufs[n + 1] = B;
                snprintf(names[n], sizeof names[n], "base_model.model.model.layers.%d.%s.experts.%d.%s.lora_A.weight",
                         L, ex[3], e, ex[k]);
                snprintf(names[n + 1], sizeof names[n + 1],
                         "base_model.model.model.layers.%d.%s.experts.%d.%s.lora_B.weight", L, ex[3], e, ex[k]);
                nt[n].name = names[n];
                nt[n + 1].name = names[n + 1];
                CHECK_OK(ft_tensor_init(&nt[n].tensor, FT_F32, 2, as, md->A + (size_t)e * (size_t)r * (size_t)md->in));
                CHECK_OK(ft_tensor_init(&nt[n + 1].tensor, FT_F32, 2, bs, B));
                n += 2;
            }
    }
    CHECK(n_exp == 2 * NL - (strstr(model, "qwen3moe") ? 2 : 0));   /* gate_up and down per MoE layer */
    const char *tmp = ft_test_tmpdir("lora_experts4");
    char odir[1200];
    snprintf(odir, sizeof odir, "%s/%s-v4", tmp, model);
    mkdir(odir, 0777);
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", odir);
    CHECK_OK(ft_safetensors_write(path, nt, n, NULL));
    snprintf(path, sizeof path, "%s/adapter_config.json", odir);
    FILE *f = fopen(path, "w");
    REQUIRE(f);
    fprintf(f, "{\"peft_type\": \"LORA\", \"r\": %d, \"lora_alpha\": %g, \"target_modules\": [\"q_proj\", "
            "\"k_proj\", \"v_proj\", \"o_proj\", \"%s\", \"%s\", \"%s\"]}\n", r, (double)a->alpha, ex[0], ex[1], ex[2]);
    fclose(f);
    ft_session_lora l4 = {odir, 1.0f};
    ft_session *s4 = open_with(model, &l4, 1, FT_WEIGHTS_AS_STORED, NULL);
    REQUIRE(s4);
    CHECK_OK(last_logits(s4, ids, np, v4));
    CHECK_MSG(memcmp(v4, got, (size_t)V * 4) == 0, "%s: the per-expert form differs by %g", model, maxdiff(v4, got, V));
    ft_session_close(s4);
    for (size_t i = 0; i < 2 * cap; i++) free(bufs[i]);
    free(bufs);
    free(names);
    free(nt);
    ft_peft_adapter_free(a);
    free(got); free(want); free(v4);
    json_object_put(run);
}

TEST(experts_adapters_match_peft)
{
    static const char *const mx[4] = {"w1", "w3", "w2", "block_sparse_moe"};
    static const char *const qw[4] = {"gate_proj", "up_proj", "down_proj", "mlp"};
    experts_case("mixtral-tiny", mx);
    experts_case("qwen3moe-tiny", qw);
    experts_case("olmoe-tiny", qw);
}

/* the engine's forward with an adapter = the trainer's forward, per format */
TEST(formats_match_trainer)
{
    char lora[1024], path[1200];
    ft_fixture_dir("lora", "llama-tiny", lora, sizeof lora);
    snprintf(path, sizeof path, "%s/final", lora);
    const int32_t ids[] = {1, 17, 42, 99, 5, 230, 64, 12};
    const int fmts[] = {FT_WF_F32, FT_WF_BF16, FT_WF_Q8, FT_WF_Q4};
    for (int f = 0; f < 4; f++) {
        ft_session_lora ls = {path, 1.0f};
        ft_session *s = open_with("llama-tiny", &ls, 1, fmts[f], NULL);
        REQUIRE(s);
        const ft_model *m = ft_session_model(s);
        int V = ft_session_config(s)->vocab;
        ft_train_params tp;
        ft_train_params_default(&tp);
        CHECK_OK(ft_lora_read_config(path, &tp));
        tp.threads = 2;
        ft_trainer *t = NULL;
        REQUIRE(ft_trainer_create(m, &tp, &t) == FT_OK);
        CHECK_OK(ft_trainer_load_adapter(t, path));
        float *a = malloc((size_t)V * 4), *b = malloc((size_t)V * 4);
        REQUIRE(a && b);
        CHECK_OK(ft_trainer_last_logits(t, ids, 8, a));
        CHECK_OK(last_logits(s, ids, 8, b));
        double d = maxdiff(a, b, V);
        CHECK_MSG(d < 2e-4, "format %d: engine vs trainer logits differ by %g", fmts[f], d);
        ft_trainer_free(t);
        ft_session_close(s);
        free(a);
        free(b);
    }
}

/* streamed from a disk tier, batched with another sequence, in slot calls
 * of several rows: the same logits as one sequence in memory */
TEST(offload_and_batching)
{
    json_object *root = NULL, *c = multi_case(&root, "llama-ab");
    REQUIRE(c);
    char a[1200], b[1200], pol[1400];
    snprintf(a, sizeof a, "%s/llama-a", multi);
    snprintf(b, sizeof b, "%s/llama-b", multi);
    ft_session_lora ls[2] = {{a, 0.7f}, {b, 1.5f}};
    const int32_t p0[] = {1, 17, 42, 99, 5, 230, 64, 12, 7}, p1[] = {3, 8, 250, 11};
    ft_session *s = open_with("llama-tiny", ls, 2, FT_WEIGHTS_AS_STORED, NULL);
    REQUIRE(s);
    int V = ft_session_config(s)->vocab;
    float *ref = malloc((size_t)V * 4), *ref1 = malloc((size_t)V * 4), *got = malloc((size_t)V * 8);
    REQUIRE(ref && ref1 && got);
    CHECK_OK(last_logits(s, p0, 9, ref));
    CHECK_OK(last_logits(s, p1, 4, ref1));
    /* a batch of two sequences in one call */
    ft_session_reset(s);
    int slots[2] = {0, 1};
    const int32_t *tk[2] = {p0, p1};
    size_t nt[2] = {9, 4};
    CHECK_OK(ft_session_forward(s, 2, slots, tk, nt, got, 0));
    CHECK(maxdiff(got, ref, V) < 1e-5);
    CHECK(maxdiff(got + V, ref1, V) < 1e-5);
    /* slot 0 in two chunks while slot 1 decodes (continuous batching) */
    ft_session_reset(s);
    size_t n5 = 5, n4 = 4, n1 = 1;
    int s0 = 0;
    const int32_t *h0 = p0, *h1 = p1;
    CHECK_OK(ft_session_forward(s, 1, &s0, &h0, &n5, got, 0));
    int s1 = 1;
    CHECK_OK(ft_session_forward(s, 1, &s1, &h1, &n4, got, 0));
    const int32_t *t0 = p0 + 5, *t1 = p0;   /* slot 1 gets one more token */
    const int32_t *mix[2] = {t0, t1};
    size_t nmix[2] = {n4, n1};
    CHECK_OK(ft_session_forward(s, 2, slots, mix, nmix, got, 0));
    CHECK_MSG(maxdiff(got, ref, V) < 1e-5, "chunked slot 0 differs by %g", maxdiff(got, ref, V));
    ft_session_close(s);
    /* weights streamed from a disk tier */
    snprintf(pol, sizeof pol, "w=0,0,100 disk=file:%s", ft_test_tmpdir("lora_disk"));
    s = open_with("llama-tiny", ls, 2, FT_WEIGHTS_AS_STORED, pol);
    REQUIRE(s);
    CHECK_OK(last_logits(s, p0, 9, got));
    CHECK_MSG(maxdiff(got, ref, V) < 1e-5, "offloaded differs by %g", maxdiff(got, ref, V));
    ft_session_close(s);
    free(ref); free(ref1); free(got);
    json_object_put(root);
}

TEST(bad_adapters_refused)
{
    char dir[1024], path[1200];
    ft_fixture_dir("lora", "multi", dir, sizeof dir);
    /* an OPT adapter on a llama model: its modules are not the model's */
    snprintf(path, sizeof path, "%s/opt-a", dir);
    ft_session_lora ls = {path, 1.0f};
    CHECK(open_with("llama-tiny", &ls, 1, FT_WEIGHTS_AS_STORED, NULL) == NULL);
    CHECK(strstr(ft_last_error(), "opt-a") != NULL);
    /* a llama adapter on qwen2-tiny (other shapes) */
    snprintf(path, sizeof path, "%s/llama-a", dir);
    ft_session *s = open_with("qwen2-tiny", &ls, 1, FT_WEIGHTS_AS_STORED, NULL);
    if (s) ft_session_close(s);
    CHECK(s == NULL);
    /* a directory without an adapter */
    ls.dir = dir;
    CHECK(open_with("llama-tiny", &ls, 1, FT_WEIGHTS_AS_STORED, NULL) == NULL);
    CHECK(strstr(ft_last_error(), "adapter_config.json") != NULL);
    /* the engine refuses what is not a projection, and bad values */
    char mdir[1024];
    ft_fixture_dir("models", "llama-tiny", mdir, sizeof mdir);
    ft_model *m = NULL;
    REQUIRE(ft_model_load(mdir, NULL, &m) == FT_OK);
    ft_lora *l = NULL;
    REQUIRE(ft_lora_create(m, &l) == FT_OK);
    float A[4 * 1024] = {0}, B[4 * 1024] = {0};
    CHECK(ft_lora_add(l, "model.layers.0.input_layernorm", 1, 1.0f, A, B) == FT_ERR_UNSUPPORTED);
    CHECK(ft_lora_add(l, "model.layers.99.self_attn.q_proj", 1, 1.0f, A, B) == FT_ERR_UNSUPPORTED);
    CHECK(ft_lora_add(l, "model.layers.0.self_attn.q_proj", 0, 1.0f, A, B) == FT_ERR_INVALID_ARG);
    CHECK(ft_lora_add(l, "model.layers.0.self_attn.q_proj", 1, NAN, A, B) == FT_ERR_INVALID_ARG);
    A[0] = INFINITY;
    CHECK(ft_lora_add(l, "model.layers.0.self_attn.q_proj", 1, 1.0f, A, B) == FT_ERR_INVALID_ARG);
    A[0] = 0;
    CHECK_OK(ft_lora_add(l, "model.layers.0.self_attn.q_proj", 1, 1.0f, A, B));
    CHECK(ft_lora_count(l) == 1);
    ft_lora_free(l);
    ft_model_free(m);
}

/* a merged checkpoint (ft_lora_merge_checkpoint, `flextier export
 * --merge-lora`) gives the logits of the adapters applied unmerged, and
 * peft's; bf16 output within bf16's rounding; a wrong adapter writes
 * nothing */
static void merged_logits(const char *dir, const int32_t *ids, size_t n, float *out)
{
    ft_session_params p;
    ft_session_default_params(&p);
    p.kv_dtype = FT_F32;
    p.threads = 2;
    ft_session *s = NULL;
    ft_status st = ft_session_open(dir, &p, &s);
    CHECK_MSG(st == FT_OK, "open %s: %s", dir, ft_last_error());
    if (st) return;
    CHECK_OK(last_logits(s, ids, n, out));
    ft_session_close(s);
}

TEST(merge_equals_unmerged)
{
    json_object *root = NULL, *c = multi_case(&root, "llama-ab");
    REQUIRE(c);
    char a[1200], b[1200], mdir[1024], out[1200], outb[1200], bad[1200], o[1200];
    snprintf(a, sizeof a, "%s/llama-a", multi);
    snprintf(b, sizeof b, "%s/llama-b", multi);
    snprintf(o, sizeof o, "%s/opt-a", multi);
    ft_fixture_dir("models", "llama-tiny", mdir, sizeof mdir);
    const char *tmp = ft_test_tmpdir("lora_merge");
    snprintf(out, sizeof out, "%s/m32", tmp);
    snprintf(outb, sizeof outb, "%s/mbf16", tmp);
    snprintf(bad, sizeof bad, "%s/bad", tmp);
    const char *ads[2] = {a, b};
    const float sc[2] = {0.7f, 1.5f};
    CHECK_OK(ft_lora_merge_checkpoint(mdir, ads, sc, 2, out, FT_F32));
    CHECK_OK(ft_lora_merge_checkpoint(mdir, ads, sc, 2, outb, FT_BF16));
    json_object *pr = json_object_object_get(c, "prompt"), *lg = json_object_object_get(c, "last_logits");
    int32_t ids[64];
    size_t np = json_object_array_length(pr);
    for (size_t i = 0; i < np; i++) ids[i] = json_object_get_int(json_object_array_get_idx(pr, i));
    int V = (int)json_object_array_length(lg);
    float *want = malloc((size_t)V * 4), *got = malloc((size_t)V * 4), *unm = malloc((size_t)V * 4);
    REQUIRE(want && got && unm);
    for (int v = 0; v < V; v++) want[v] = (float)json_object_get_double(json_object_array_get_idx(lg, v));
    ft_session_lora ls[2] = {{a, 0.7f}, {b, 1.5f}};
    ft_session *s = open_with("llama-tiny", ls, 2, FT_WEIGHTS_AS_STORED, NULL);
    REQUIRE(s);
    CHECK_OK(last_logits(s, ids, np, unm));
    ft_session_close(s);
    merged_logits(out, ids, np, got);
    CHECK_MSG(maxdiff(got, unm, V) < 1e-4, "merged vs unmerged: %g", maxdiff(got, unm, V));
    CHECK_MSG(maxdiff(got, want, V) < 1e-4, "merged vs peft: %g", maxdiff(got, want, V));
    merged_logits(outb, ids, np, got);
    CHECK_MSG(maxdiff(got, want, V) < 0.1, "bf16 merged vs peft: %g", maxdiff(got, want, V));
    CHECK(ft_file_has(outb, "config.json", "bfloat16"));
    CHECK(ft_file_has(out, "tokenizer.json", "\"model\""));
    /* an OPT adapter does not merge into llama: nothing written */
    const char *oa[1] = {o};
    const float one = 1.0f;
    CHECK(ft_lora_merge_checkpoint(mdir, oa, &one, 1, bad, -1) == FT_ERR_INVALID_ARG);
    CHECK(strstr(ft_last_error(), "no weight") != NULL);
    CHECK(ft_sh("test -e %s/model.safetensors", bad) != 0);
    CHECK(ft_lora_merge_checkpoint(mdir, ads, sc, 2, mdir, -1) == FT_ERR_INVALID_ARG);
    free(want); free(got); free(unm);
    json_object_put(root);
}

/* ------------------------------------------------------- chat data */

/* conversations rendered with a tiny template: the ids and label mask
 * transformers gives (tests/data/lora/chat, gen_lora_chat_fixtures.py),
 * and the masked loss of peft's init adapter; the JSONL reader hands the
 * messages over; templates that do not render prefix by prefix and bad
 * messages are refused */
TEST(chat_tokens_and_masked_loss_match_transformers)
{
    char cdir[1024], path[1200], mdir[1024], lora[1024];
    ft_fixture_dir("lora", "chat", cdir, sizeof cdir);
    ft_fixture_dir("models", "llama-tiny", mdir, sizeof mdir);
    ft_fixture_dir("lora", "llama-tiny", lora, sizeof lora);
    snprintf(path, sizeof path, "%s/chat.json", cdir);
    json_object *root = json_object_from_file(path);
    REQUIRE(root);
    const char *src = json_object_get_string(json_object_object_get(root, "template"));
    ft_chat_template *tpl = NULL;
    REQUIRE(ft_chat_template_load_string(src, NULL, NULL, &tpl) == FT_OK);
    ft_tokenizer *tok = NULL;
    REQUIRE(ft_tokenizer_load_dir(mdir, &tok) == FT_OK);
    ft_model *m = NULL;
    REQUIRE(ft_model_load(mdir, NULL, &m) == FT_OK);
    snprintf(path, sizeof path, "%s/init", lora);
    ft_train_params tp;
    ft_train_params_default(&tp);
    CHECK_OK(ft_lora_read_config(path, &tp));
    tp.total_steps = 1;
    ft_trainer *t = NULL;
    REQUIRE(ft_trainer_create(m, &tp, &t) == FT_OK);
    CHECK_OK(ft_trainer_load_adapter(t, path));
    json_object *cases = json_object_object_get(root, "cases");
    for (size_t c = 0; c < json_object_array_length(cases); c++) {
        json_object *k = json_object_array_get_idx(cases, c);
        const char *msgs = json_object_to_json_string_ext(json_object_object_get(k, "messages"), JSON_C_TO_STRING_PLAIN);
        json_object *wi = json_object_object_get(k, "ids"), *wm = json_object_object_get(k, "mask");
        int32_t *ids = NULL;
        uint8_t *mask = NULL;
        size_t n = 0;
        CHECK_OK(ft_train_chat_tokens(tpl, tok, msgs, &ids, &mask, &n));
        CHECK_MSG(n == json_object_array_length(wi), "case %zu: %zu tokens, transformers %zu", c, n,
                  json_object_array_length(wi));
        int same = n == json_object_array_length(wi);
        for (size_t i = 0; same && i < n; i++)
            same = ids[i] == json_object_get_int(json_object_array_get_idx(wi, i)) &&
                   mask[i] == json_object_get_int(json_object_array_get_idx(wm, i));
        CHECK_MSG(same, "case %zu: ids or mask differ from transformers'", c);
        double s = 0;
        int64_t cnt = 0;
        CHECK_OK(ft_trainer_eval_masked(t, ids, mask, 1, (int)n, &s, &cnt));
        double want = json_object_get_double(json_object_object_get(k, "loss"));
        CHECK_MSG(cnt > 0 && fabs(s / (double)cnt - want) <= 1e-5 * want, "case %zu: masked loss %.7f, "
                  "transformers %.7f", c, cnt ? s / (double)cnt : 0.0, want);
        /* without the mask the loss is another one */
        double s2 = 0;
        int64_t cnt2 = 0;
        CHECK_OK(ft_trainer_eval_masked(t, ids, NULL, 1, (int)n, &s2, &cnt2));
        CHECK(cnt2 == (int64_t)n - 1 && cnt2 > cnt && fabs(s2 / (double)cnt2 - want) > 1e-3);
        /* a step on it trains (a finite loss, the adapter moves) */
        if (c == 0) {
            double loss = 0, gn = 0;
            CHECK_OK(ft_trainer_step_masked(t, ids, mask, 1, (int)n, &loss, &gn));
            CHECK(fabs(loss - want) <= 1e-5 * want && gn > 0);
            memset(mask, 0, n);
            CHECK(ft_trainer_step_masked(t, ids, mask, 1, (int)n, &loss, &gn) == FT_ERR_INVALID_ARG);
            ft_trainer_free(t);
            t = NULL;
            REQUIRE(ft_trainer_create(m, &tp, &t) == FT_OK);
            CHECK_OK(ft_trainer_load_adapter(t, path));
        }
        free(ids);
        free(mask);
    }
    /* refusals */
    int32_t *ids = NULL;
    uint8_t *mask = NULL;
    size_t n = 0;
    CHECK(ft_train_chat_tokens(tpl, tok, "[{\"role\": \"user\", \"content\": \"hi\"}]", &ids, &mask, &n) ==
          FT_ERR_CORRUPT);   /* no assistant turn */
    CHECK(ft_train_chat_tokens(tpl, tok, "{\"role\": \"user\"}", &ids, &mask, &n) == FT_ERR_CORRUPT);
    CHECK(ft_train_chat_tokens(tpl, tok, "[{\"content\": 1}]", &ids, &mask, &n) == FT_ERR_CORRUPT);
    ft_chat_template *rev = NULL;   /* renders the messages newest first: not prefix by prefix */
    REQUIRE(ft_chat_template_load_string("{% for m in messages|reverse %}{{ m['content'] }};{% endfor %}", NULL, NULL,
                                         &rev) == FT_OK);
    CHECK(ft_train_chat_tokens(rev, tok, "[{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\", "
                               "\"content\": \"b\"}]", &ids, &mask, &n) == FT_ERR_UNSUPPORTED);
    CHECK(strstr(ft_last_error(), "prefix by prefix") != NULL);
    ft_chat_template_free(rev);
    ft_trainer_free(t);
    ft_model_free(m);
    ft_tokenizer_free(tok);
    ft_chat_template_free(tpl);
    json_object_put(root);
}

static ft_status count_text(void *u, const char *text, size_t len)
{
    (void)text;
    (void)len;
    ((int *)u)[0]++;
    return FT_OK;
}

static ft_status count_chat(void *u, const char *messages, size_t line)
{
    (void)line;
    ((int *)u)[1] += strstr(messages, "\"assistant\"") != NULL;
    return FT_OK;
}

TEST(jsonl_reader_with_chat)
{
    const char *d = "{\"text\": \"a\"}\n{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": "
                    "\"assistant\", \"content\": \"r\"}]}\n\n{\"text\": \"b\"}\n";
    int cnt[2] = {0, 0};
    CHECK_OK(ft_train_jsonl_each_ex(d, strlen(d), "t", count_text, count_chat, cnt));
    CHECK(cnt[0] == 2 && cnt[1] == 1);
    CHECK(ft_train_jsonl_each(d, strlen(d), "t", count_text, cnt) == FT_ERR_UNSUPPORTED);
    const char *bad = "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}]}\n";
    CHECK(ft_train_jsonl_each_ex(bad, strlen(bad), "t", count_text, count_chat, cnt) == FT_ERR_CORRUPT);
    CHECK(strstr(ft_last_error(), "line 1") != NULL);
    const char *bad2 = "{\"messages\": \"hi\"}\n";
    CHECK(ft_train_jsonl_each_ex(bad2, strlen(bad2), "t", count_text, count_chat, cnt) == FT_ERR_CORRUPT);
}
