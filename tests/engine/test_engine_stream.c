/* Streamed embeddings and LM head (ft_load_params.stream_globals): the
 * rows of the tokens read from the checkpoint file, the head computed
 * chunk by chunk against chunks read from it, give logits bit-identical
 * to the resident model's on every fixture model (tied heads included),
 * in the lossless formats (as stored, f32, bf16) and with q8 layers
 * (the head stays bf16 there), one and two threads, chunks that do not
 * divide the vocabulary, a prefill of mixed lengths, decode steps and
 * all-row logits. */
#include "ft_test.h"
#include "flextier/engine.h"
#include "support/fixture.h"


/* Every fixture model directory (sorted), sliding-window ones included. */
static const char (*models)[256];
static size_t n_models;

static void list_models(void)
{
    if (!models) models = ft_fixture_models(&n_models);
}

static void model_dir(const char *name, char *out, size_t n)
{
    const char *data = getenv("FT_TEST_DATA");
    snprintf(out, n, "%s/models/%s", data ? data : "tests/data", name);
}

static const int32_t P0[] = {1, 15, 27, 99, 4, 200, 13};
static const int32_t P1[] = {3, 8, 250};

/* A prefill of two sequences with every row's logits, then 4 decode
 * steps with the last row's: the logits concatenated. */
static float *run(ft_model *m, unsigned threads, size_t *n_out, ft_status *st)
{
    const ft_model_config *cfg = ft_model_get_config(m);
    int V = cfg->vocab;
    ft_ctx_params cp = {0};
    cp.max_batch = 2; cp.max_seq = 24; cp.threads = threads; cp.all_logits = 1; cp.kv_dtype = FT_F32;
    ft_ctx *c = NULL;
    if ((*st = ft_ctx_create(m, &cp, &c))) return NULL;
    size_t rows = 10 + 4 * 2;
    float *all = calloc(rows * (size_t)V, sizeof(float));
    const int32_t *toks[2] = {P0, P1};
    size_t ntok[2] = {7, 3};
    int slots[2] = {0, 1};
    *st = ft_ctx_forward(c, 2, slots, toks, ntok, all, 1);
    for (int step = 0; step < 4 && !*st; step++) {
        int32_t a = (int32_t)((step * 37 + 5) % V), b = (int32_t)((step * 91 + 2) % V);
        const int32_t *t1[2] = {&a, &b};
        size_t one[2] = {1, 1};
        *st = ft_ctx_forward(c, 2, slots, t1, one, all + (size_t)(10 + 2 * step) * V, 0);
    }
    ft_ctx_free(c);
    *n_out = rows * (size_t)V;
    return all;
}

static void check_model(const char *name, int weights)
{
    char dir[600];
    model_dir(name, dir, sizeof dir);
    ft_load_params lp;
    ft_load_params_default(&lp);
    lp.weights = weights;
    ft_model *ref = NULL;
    ft_status st = ft_model_load(dir, &lp, &ref);
    CHECK_MSG(st == FT_OK, "%s: %s", name, ft_last_error());
    if (st) return;
    static const unsigned modes[] = {FT_STREAM_EMBED, FT_STREAM_LM_HEAD, FT_STREAM_EMBED | FT_STREAM_LM_HEAD};
    static const int chunks[] = {0, 96, 24};
    for (unsigned th = 1; th <= 2; th++) {
        size_t n0 = 0, n1 = 0;
        float *want = run(ref, th, &n0, &st);
        CHECK_MSG(st == FT_OK, "%s: %s", name, ft_last_error());
        for (size_t k = 0; want && k < 3; k++) {
            ft_load_params sp = lp;
            sp.stream_globals = modes[k];
            sp.stream_chunk_rows = chunks[k];
            sp.stream_drop_cache = (int)(k & 1);
            ft_model *m = NULL;
            st = ft_model_load(dir, &sp, &m);
            CHECK_MSG(st == FT_OK, "%s: %s", name, ft_last_error());
            if (st) continue;
            CHECK(ft_model_streamed(m) == modes[k]);
            uint64_t emb = 0, head = 0;
            ft_model_global_split(m, &emb, &head);
            CHECK(emb > 0);
            /* what is held shrinks by what is streamed (a tied head is
             * the embedding: either flag streams it) */
            CHECK(ft_model_global_bytes(m) < ft_model_global_bytes(ref));
            float *got = run(m, th, &n1, &st);
            CHECK_MSG(st == FT_OK, "%s: %s", name, ft_last_error());
            CHECK_MSG(got && n1 == n0 && !memcmp(got, want, n0 * sizeof(float)),
                      "%s weights %d threads %u stream %u chunk %d: logits differ from the resident model's", name,
                      weights, th, modes[k], chunks[k]);
            CHECK(ft_model_stream_bytes_read(m) > 0);
            free(got);
            ft_model_free(m);
        }
        free(want);
    }
    ft_model_free(ref);
}

TEST(bit_identical_on_every_fixture)
{
    list_models();
    REQUIRE(n_models > 0 && n_models <= FT_FIXTURE_MAX_MODELS);
    for (size_t i = 0; i < n_models; i++) {
        check_model(models[i], FT_WEIGHTS_AS_STORED);
        check_model(models[i], FT_WF_BF16);
    }
}

TEST(other_formats_tied_and_untied)
{
    /* f32, and q8 layers (the embeddings and head stay bf16) */
    check_model("llama-tiny", FT_WF_F32);
    check_model("llama-tiny-tied-rope3", FT_WF_F32);
    check_model("llama-tiny", FT_WF_Q8);
    check_model("qwen2-tiny", FT_WF_Q8);
}

TEST(streamed_refusals)
{
    char dir[600];
    model_dir("llama-tiny", dir, sizeof dir);
    ft_load_params lp;
    ft_load_params_default(&lp);
    lp.stream_globals = FT_STREAM_EMBED | FT_STREAM_LM_HEAD;
    ft_model *m = NULL;
    REQUIRE(ft_model_load(dir, &lp, &m) == FT_OK);
    /* no plain view of a matrix that is not in memory, no conversion */
    const char *name;
    ft_tensor v;
    int refused = 0;
    for (size_t i = 0; i < ft_model_tensor_count(m); i++) {
        ft_model_tensor(m, i, &name, NULL);
        if (!strcmp(name, "model.embed_tokens.weight") || !strcmp(name, "lm_head.weight"))
            refused += ft_model_tensor(m, i, &name, &v) == FT_ERR_UNSUPPORTED;
    }
    CHECK(refused == 2);
    ft_model *cv = NULL;
    CHECK(ft_model_convert(m, FT_WF_F32, &cv) != FT_OK);
    ft_model_free(m);
}

