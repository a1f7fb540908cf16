/* The engine's CLI end to end: gen-model writes a checkpoint the loader
 * reads back, run generates from it (single prompt and a batch file),
 * --dump-logits equals the library's forward pass, bad use exits 2. */
#include "ft_test.h"
#include "support/cli_run.h"
#include "flextier/engine.h"
#include "flextier/model.h"

#include <math.h>
#include <sys/wait.h>
#include <unistd.h>

static char tmpdir[256];

TEST(gen_model_and_run)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/ft_engine_cli_%d", (int)getpid());
    CHECK(ft_sh("rm -rf %s && mkdir -p %s", tmpdir, tmpdir) == 0);
    CHECK(ft_sh("%s gen-model --arch llama --out %s/m --hidden 64 --layers 2 --heads 4 --kv-heads 2 "
             "--ffn 96 --dtype f32 --seed 3 > /dev/null", ft_test_bin(), tmpdir) == 0);
    char dir[512];
    snprintf(dir, sizeof dir, "%s/m", tmpdir);
    ft_model *m = NULL;
    CHECK_OK(ft_model_load(dir, NULL, &m));
    REQUIRE(m);
    const ft_model_config *cfg = ft_model_get_config(m);
    CHECK(cfg->arch == FT_ARCH_LLAMA && cfg->hidden == 64 && cfg->n_kv_heads == 2 && cfg->vocab == 320);

    /* single prompt, greedy: exit 0, prompt echoed, stats on stderr */
    CHECK(ft_sh("%s run --model %s --prompt 'Hello world' --max-new-tokens 8 --temperature 0 "
             "> %s/out.txt 2> %s/err.txt", ft_test_bin(), dir, tmpdir, tmpdir) == 0);
    char p[600];
    snprintf(p, sizeof p, "%s/out.txt", tmpdir);
    char *out = ft_slurp(p, NULL);
    CHECK(out && !strncmp(out, "Hello world", 11));
    free(out);
    snprintf(p, sizeof p, "%s/err.txt", tmpdir);
    char *err = ft_slurp(p, NULL);
    CHECK(err && strstr(err, "prefill:") && strstr(err, "tok/s"));
    free(err);

    /* batch from a file, and --dump-logits against the library */
    CHECK(ft_sh("printf 'The quick brown fox\\n\\nHello\\nBatch is the point\\n' > %s/prompts.txt", tmpdir) == 0);
    CHECK(ft_sh("%s run --model %s --prompt-file %s/prompts.txt --max-new-tokens 4 --seed 5 "
             "--kv-dtype f32 --weights-dtype f32 --dump-logits %s/lg.bin > %s/out2.txt 2>/dev/null", ft_test_bin(), dir, tmpdir, tmpdir, tmpdir) == 0);
    snprintf(p, sizeof p, "%s/out2.txt", tmpdir);
    out = ft_slurp(p, NULL);
    CHECK(out && strstr(out, "=== prompt 1 ===\nThe quick brown fox") && strstr(out, "=== prompt 3 ===\nBatch"));
    CHECK(out && !strstr(out, "=== prompt 4 ==="));
    free(out);

    char tpath[600];
    snprintf(tpath, sizeof tpath, "%s/tokenizer.json", dir);
    ft_tokenizer *tok = NULL;
    CHECK_OK(ft_tokenizer_load(tpath, &tok));
    REQUIRE(tok);
    const char *texts[] = {"The quick brown fox", "Hello", "Batch is the point"};
    int32_t *ids[3];
    size_t n[3], rows = 0;
    for (int i = 0; i < 3; i++) {
        CHECK_OK(ft_tokenizer_encode(tok, texts[i], strlen(texts[i]), 1, &ids[i], &n[i]));
        rows += n[i];
    }
    ft_ctx_params cp = {.max_batch = 3, .max_seq = 64, .max_rows = (int)rows, .all_logits = 1, .threads = 1};
    ft_ctx *c = NULL;
    CHECK_OK(ft_ctx_create(m, &cp, &c));
    REQUIRE(c);
    float *lg = malloc(rows * 320 * sizeof(float));
    int slots[] = {0, 1, 2};
    CHECK_OK(ft_ctx_forward(c, 3, slots, (const int32_t *const *)ids, n, lg, 1));
    snprintf(p, sizeof p, "%s/lg.bin", tmpdir);
    size_t sz = 0;
    char *dumped = ft_slurp(p, &sz);
    CHECK(dumped && sz == rows * 320 * sizeof(float));
    if (dumped && sz == rows * 320 * sizeof(float)) {
        float md = 0;
        for (size_t i = 0; i < rows * 320; i++) {
            float d = fabsf(lg[i] - ((float *)(void *)dumped)[i]);
            if (!(d <= md)) md = d;
        }
        CHECK_MSG(md <= 1e-5f, "dump-logits differs by %g", md);
    }
    free(dumped);
    free(lg);
    for (int i = 0; i < 3; i++) free(ids[i]);
    ft_ctx_free(c);
    ft_tokenizer_free(tok);
    ft_model_free(m);

    /* stop string: generation ends before it and it is not printed */
    CHECK(ft_sh("%s run --model %s --prompt 'ab' --max-new-tokens 30 --temperature 0 --ignore-eos "
             "> %s/full.txt 2>/dev/null", ft_test_bin(), dir, tmpdir) == 0);
    snprintf(p, sizeof p, "%s/full.txt", tmpdir);
    char *full = ft_slurp(p, NULL);
    if (full && strlen(full) > 6) {
        /* use a 2-byte piece of the greedy continuation as the stop string */
        char stop[3] = {full[4], full[5], 0};
        if (stop[0] != '\'' && stop[1] != '\'' && stop[0] && stop[1] && (unsigned char)stop[0] < 128 &&
            (unsigned char)stop[1] < 128 && stop[0] != '\n' && stop[1] != '\n') {
            CHECK(ft_sh("%s run --model %s --prompt 'ab' --max-new-tokens 30 --temperature 0 --ignore-eos "
                     "--stop '%s' > %s/stopped.txt 2>/dev/null", ft_test_bin(), dir, stop, tmpdir) == 0);
            snprintf(p, sizeof p, "%s/stopped.txt", tmpdir);
            char *s = ft_slurp(p, NULL);
            const char *first = strstr(full, stop);
            CHECK(s && first && strlen(s) == (size_t)(first - full) + 1 /* newline */);
            CHECK(s && !strstr(s, stop));
            free(s);
        }
    }
    free(full);

    /* usage errors exit 2, runtime errors 1 */
    CHECK(ft_sh("%s run --prompt x 2>/dev/null", ft_test_bin()) == 2);
    CHECK(ft_sh("%s run --model %s --prompt x --prompt-file y 2>/dev/null", ft_test_bin(), dir) == 2);
    CHECK(ft_sh("%s run --model %s --prompt x --top-p 2 2>/dev/null", ft_test_bin(), dir) == 2);
    CHECK(ft_sh("%s gen-model --arch gpt2 --out %s/x 2>/dev/null", ft_test_bin(), tmpdir) == 2);
    CHECK(ft_sh("%s run --model %s/nonexistent --prompt x 2>/dev/null", ft_test_bin(), tmpdir) == 1);
    CHECK(ft_sh("%s run --model %s --prompt x --max-new-tokens 5000 2>/dev/null", ft_test_bin(), dir) == 1);
    ft_sh("rm -rf %s", tmpdir);
}

/* A copy of a fixture directory with one file edited by sed; run on it
 * must fail with exit 1 and ONE line on stderr naming `file` and `field`. */
static void bad_model(const char *set, const char *name, const char *file, const char *sed, const char *flags,
                      const char *field)
{
    const char *data = getenv("FT_TEST_DATA");
    char d[512], err[600];
    snprintf(d, sizeof d, "%s/bad-%s", tmpdir, name);
    snprintf(err, sizeof err, "%s/bad-%s.err", tmpdir, name);
    CHECK(ft_sh("rm -rf %s && cp -r %s/%s/%s %s && sed -i %s %s/%s", d, data ? data : "tests/data", set, name, d, sed, d,
             file) == 0);
    int rc = ft_sh("%s run --model %s --prompt 'Hello' --max-new-tokens 2 %s > /dev/null 2> %s", ft_test_bin(), d, flags, err);
    size_t n = 0;
    char *e = ft_slurp(err, &n);
    CHECK_MSG(rc == 1, "%s (%s): exit %d", name, sed, rc);
    int lines = 0;
    for (size_t i = 0; e && i < n; i++) lines += e[i] == '\n';
    CHECK_MSG(e && lines == 1 && strstr(e, file) && strstr(e, field), "%s (%s): stderr '%s' should be one line "
              "naming %s and %s", name, sed, e ? e : "", file, field);
    free(e);
}

TEST(refuse_never_guess)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/ft_engine_cli_bad_%d", (int)getpid());
    CHECK(ft_sh("rm -rf %s && mkdir -p %s", tmpdir, tmpdir) == 0);
    /* an unknown rope type */
    bad_model("models", "llama-rope-linear", "config.json", "'s/\"rope_type\": \"linear\"/\"rope_type\": \"longrope\"/'",
              "", "rope_scaling.rope_type");
    /* both layouts, contradicting */
    bad_model("models-tf5", "llama-tiny", "config.json", "'1a \"rope_theta\": 500000.0,'", "", "rope_theta");
    /* a window larger than the context */
    bad_model("models", "mistral-sw", "config.json", "'s/\"sliding_window\": 5/\"sliding_window\": 100000/'", "",
              "sliding_window");
    /* a tokenizer component flextier does not implement */
    bad_model("models", "qwen2-nfc", "tokenizer.json", "'s/\"type\": \"NFC\"/\"type\": \"Lowercase\"/'", "",
              "normalizer");
    /* an unknown config key: a warning, an error with --strict */
    bad_model("models", "llama-tiny", "config.json", "'1a \"use_qk_norm\": true,'", "--strict", "use_qk_norm");
    char d[512];
    snprintf(d, sizeof d, "%s/bad-llama-tiny", tmpdir);
    CHECK(ft_sh("env -u FLEXTIER_STRICT %s run --model %s --prompt Hello --max-new-tokens 2 > /dev/null 2> %s/warn.txt",
             ft_test_bin(), d, tmpdir) == 0);
    char w[600];
    snprintf(w, sizeof w, "%s/warn.txt", tmpdir);
    char *e = ft_slurp(w, NULL);
    CHECK(e && strstr(e, "use_qk_norm") && strstr(e, "warn"));
    free(e);
    /* Hub-style OPT files (vocab.json + merges.txt) run from the command line */
    const char *data = getenv("FT_TEST_DATA");
    CHECK(ft_sh("%s run --model %s/models/opt-tiny-hubtok --prompt 'Hello world!' --max-new-tokens 3 --temperature 0 "
             "--strict > /dev/null 2>&1", ft_test_bin(), data ? data : "tests/data") == 0);
    ft_sh("rm -rf %s", tmpdir);
}
