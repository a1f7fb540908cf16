/* flextier gen-model: the tokenizer has exactly --vocab tokens, loads in
 * FlexTier and round-trips text; the checkpoint loads in the engine; the
 * weights are deterministic in the seed whatever the thread count and have
 * the stated distribution; and a checkpoint is written in bounded memory
 * (the child's peak RSS from wait4's rusage, far below the file's size). */
#include "ft_test.h"
#include "support/cli_run.h"
#include "flextier/engine.h"
#include "flextier/model.h"

#include <math.h>
#include <stdarg.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *tdir(void)
{
    static const char *d;
    if (!d) d = ft_test_tmpdir("genmodel");   /* removed at exit */
    return d;
}

/* Texts that must survive encode -> decode unchanged (valid UTF-8). */
static const char *const texts[] = {
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "  leading spaces, trailing spaces  ",
    " one leading space",
    "tabs\tand\nnewlines\n\n",
    "digits 0123456789 and symbols !\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~",
    "a < b > c, s/x/y/, \\0x41",
    "caf\xc3\xa9 na\xc3\xafve \xc4\xa0 \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e \xf0\x9f\x98\x80 \xce\xa9",
    "x",
};

static void check_model(const char *arch, long vocab, const char *extra)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%s-%ld", tdir(), arch, vocab);
    CHECK_MSG(ft_sh("%s gen-model --arch %s --out %s --hidden 64 --layers 2 --heads 4 --ffn 96 --vocab %ld %s "
                 "> /dev/null", ft_test_bin(), arch, dir, vocab, extra) == 0, "gen-model %s --vocab %ld", arch, vocab);
    ft_tokenizer *tok = NULL;
    CHECK_OK(ft_tokenizer_load_dir(dir, &tok));
    if (!tok) return;
    CHECK_MSG(ft_tokenizer_vocab_size(tok) == (size_t)vocab, "%s: vocab %zu, asked %ld", arch,
              ft_tokenizer_vocab_size(tok), vocab);
    /* every id has a token, and a token string maps back to its id */
    int holes = 0, back = 0;
    for (long i = 0; i < vocab; i++) {
        const char *s = ft_tokenizer_token_str(tok, (int32_t)i);
        if (!s) holes++;
        else if (ft_tokenizer_token_id(tok, s) != (int32_t)i) back++;
    }
    CHECK_MSG(!holes && !back, "%s %ld: %d ids without a token, %d not mapping back", arch, vocab, holes, back);
    CHECK(ft_tokenizer_token_str(tok, (int32_t)vocab) == NULL);
    size_t total_chars = 0, total_tokens = 0;
    for (size_t k = 0; k < sizeof texts / sizeof *texts; k++) {
        int32_t *ids = NULL;
        size_t n = 0;
        CHECK_OK(ft_tokenizer_encode(tok, texts[k], strlen(texts[k]), 1, &ids, &n));
        int in_range = 1;
        for (size_t i = 0; i < n; i++) in_range &= ids[i] >= 0 && ids[i] < vocab;
        CHECK(in_range);
        /* BOS first (Llama <s> = 1, OPT </s> = 2) */
        CHECK(n >= 2 && ids[0] == (strcmp(arch, "llama") ? 2 : 1));
        char *dec = NULL;
        size_t dl = 0;
        CHECK_OK(ft_tokenizer_decode(tok, ids, n, 1, &dec, &dl));
        CHECK_MSG(dec && dl == strlen(texts[k]) && !memcmp(dec, texts[k], dl), "%s %ld: '%s' decodes to '%s'", arch,
                  vocab, texts[k], dec ? dec : "(null)");
        if (k == 1) { total_chars += strlen(texts[k]); total_tokens += n - 1; }
        free(dec);
        free(ids);
    }
    /* with room for merges, English text takes fewer tokens than bytes
     * (about 2 bytes per token at 32000: the merges follow a unigram model) */
    if (vocab >= 4096)
        CHECK_MSG(total_tokens * 3 < total_chars * 2, "%zu tokens for %zu chars", total_tokens, total_chars);
    ft_tokenizer_free(tok);
    /* the engine loads the checkpoint, with the same vocab */
    ft_model *m = NULL;
    CHECK_OK(ft_model_load(dir, NULL, &m));
    if (m) CHECK(ft_model_get_config(m)->vocab == (int)vocab);
    ft_model_free(m);
}

/* Peak RSS in bytes of `flextier ARGS...` run in a forked child (wait4's
 * rusage). ASan builds: a small quarantine, or freed blocks count as held. */
static double child_maxrss(char *const argv[])
{
    fflush(stdout);   /* or the child flushes our buffered lines again */
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        if (!freopen("/dev/null", "w", stdout)) _exit(127);
        const char *ao = getenv("ASAN_OPTIONS");
        char opts[1024];
        snprintf(opts, sizeof opts, "%s%squarantine_size_mb=8", ao ? ao : "", ao && *ao ? ":" : "");
        setenv("ASAN_OPTIONS", opts, 1);
        execv(ft_test_bin(), argv);
        _exit(127);
    }
    int status = 0;
    struct rusage ru;
    if (wait4(pid, &status, 0, &ru) != pid) return -1;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return -1;
    return (double)ru.ru_maxrss * 1024.0;
}

/* First in the file, so first to run: a forked child's ru_maxrss includes
 * the parent's resident pages it inherited before exec, so the parent must
 * still be small (an ASan test process grows with every test). */
TEST(bounded_memory)
{
    struct rusage self;
    getrusage(RUSAGE_SELF, &self);
    /* 115M parameters, a 221 MB bf16 file; before streaming, gen-model held
     * the f32 model plus its bf16 copy (~3x the file) */
    char dir[512];
    snprintf(dir, sizeof dir, "%s/big", tdir());
    /* the binary's own footprint, whatever it links: with the CUDA backend
     * built in, loading cuBLAS alone maps ~220 MB resident before main() */
    char *const base_argv[] = {(char *)ft_test_bin(), "version", NULL};
    double base = child_maxrss(base_argv);
    REQUIRE(base > 0);
    char *const argv[] = {(char *)ft_test_bin(), "gen-model", "--arch", "llama", "--out", dir, "--hidden", "1024",
                          "--layers", "4", "--heads", "16", "--kv-heads", "4", "--ffn", "2816", "--vocab",
                          "32000", NULL};
    double peak = child_maxrss(argv);
    CHECK(peak > 0);
    char p[600];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    struct stat sb;
    REQUIRE(stat(p, &sb) == 0);
    double rss = peak - base, file = (double)sb.st_size;
    printf("  gen-model: %.1f MB file, peak RSS %.1f MB over the binary's own %.1f MB (%.3fx); this test's own "
           "%.1f MB\n", file / 1e6, rss / 1e6, base / 1e6, rss / file, (double)self.ru_maxrss * 1024.0 / 1e6);
    CHECK(file > 220e6);
    /* the writer's 8 MiB buffer, 64K floats of scratch per thread, the
     * tokenizer's JSON tree: ~37 MB, 0.17x the file (release and ASan
     * alike, with the small quarantine). Holding the weights even once
     * would be >= 1x; before streaming it was ~3x. */
    CHECK_MSG(rss < 0.35 * file, "peak RSS %.1f MB for a %.1f MB file", rss / 1e6, file / 1e6);
    ft_model_config cfg;
    CHECK_OK(ft_model_config_load(dir, &cfg));
    CHECK(cfg.vocab == 32000 && cfg.n_layers == 4);
    ft_checkpoint *ck = NULL;
    CHECK_OK(ft_checkpoint_open(dir, &ck));
    CHECK(ck && ft_checkpoint_count(ck) == 3 + 4 * 9);
    ft_checkpoint_close(ck);
}

TEST(tokenizer_matches_vocab)
{
    check_model("llama", 260, "");      /* the minimum: specials + bytes + "\xe2\x96\x81" */
    check_model("llama", 320, "");
    check_model("llama", 1000, "");
    check_model("llama", 32000, "");
    check_model("opt", 260, "");
    check_model("opt", 5000, "");
    check_model("opt", 50272, "");
    /* too small for the byte tokens: a usage error naming the minimum */
    CHECK(ft_sh("%s gen-model --arch llama --out %s/x --vocab 259 2> %s/err.txt", ft_test_bin(), tdir(), tdir()) == 2);
    CHECK(ft_sh("grep -q 'at least 260' %s/err.txt", tdir()) == 0);
    CHECK(ft_sh("%s gen-model --arch opt --out %s/x --vocab 259 2>/dev/null", ft_test_bin(), tdir()) == 2);
}

TEST(deterministic_weights)
{
    const char *d = tdir();
    const char *shape = "--arch llama --hidden 128 --layers 2 --heads 4 --kv-heads 2 --ffn 320 --vocab 2000";
    CHECK(ft_sh("%s gen-model %s --out %s/t1 --threads 1 --seed 7 >/dev/null", ft_test_bin(), shape, d) == 0);
    CHECK(ft_sh("%s gen-model %s --out %s/t2 --threads 2 --seed 7 >/dev/null", ft_test_bin(), shape, d) == 0);
    CHECK(ft_sh("%s gen-model %s --out %s/t3 --threads 2 --seed 8 >/dev/null", ft_test_bin(), shape, d) == 0);
    CHECK(ft_sh("cmp -s %s/t1/model.safetensors %s/t2/model.safetensors", d, d) == 0);
    CHECK(ft_sh("cmp -s %s/t1/model.safetensors %s/t3/model.safetensors", d, d) != 0);
    CHECK(ft_sh("cmp -s %s/t1/tokenizer.json %s/t3/tokenizer.json", d, d) == 0);
    /* f32: N(0, 0.02) matrices, unit norms */
    CHECK(ft_sh("%s gen-model %s --out %s/f --dtype f32 >/dev/null", ft_test_bin(), shape, d) == 0);
    char p[512];
    snprintf(p, sizeof p, "%s/f", d);
    ft_checkpoint *ck = NULL;
    CHECK_OK(ft_checkpoint_open(p, &ck));
    REQUIRE(ck);
    ft_tensor t;
    CHECK_OK(ft_checkpoint_get(ck, "model.layers.1.mlp.down_proj.weight", &t));
    CHECK(t.dtype == FT_F32 && t.ndim == 2 && t.shape[0] == 128 && t.shape[1] == 320);
    const float *f = t.data;
    double s = 0, s2 = 0;
    size_t n = 128 * 320;
    for (size_t i = 0; i < n; i++) { s += f[i]; s2 += (double)f[i] * f[i]; }
    double mean = s / (double)n, sd = sqrt(s2 / (double)n - mean * mean);
    CHECK_MSG(fabs(mean) < 0.0005 && fabs(sd - 0.02) < 0.0005, "mean %g sd %g", mean, sd);
    CHECK_OK(ft_checkpoint_get(ck, "model.norm.weight", &t));
    int ones = 1;
    for (int i = 0; i < 128; i++) ones &= ((const float *)t.data)[i] == 1.0f;
    CHECK(ones);
    ft_checkpoint_close(ck);
}

/* The newer shapes (issue 23): qwen3 (q/k norms), qwen3_moe and mixtral
 * (experts, a skewed router) load strictly, with the shapes asked for, and
 * run; the skew scales the router's hot rows only. */
TEST(moe_and_qwen3_shapes)
{
    static const char *const archs[] = {"qwen3", "qwen3_moe", "mixtral"};
    for (int a = 0; a < 3; a++) {
        char dir[512];
        snprintf(dir, sizeof dir, "%s/%s-shape", tdir(), archs[a]);
        CHECK_MSG(ft_sh("%s gen-model --arch %s --out %s --hidden 64 --layers 2 --heads 4 --kv-heads 2 --ffn 128 "
                        "--experts 16 --experts-per-tok 4 --router-skew 5 --dtype f32 --threads 1 > /dev/null",
                        ft_test_bin(), archs[a], dir) == 0, "gen-model %s", archs[a]);
        ft_model *m = NULL;
        ft_load_params lp = {.config_flags = FT_CONFIG_STRICT};
        CHECK_OK(ft_model_load(dir, &lp, &m));
        if (!m) continue;
        const ft_model_config *c = ft_model_get_config(m);
        CHECK(c->hidden == 64 && c->n_layers == 2 && c->head_dim == 16);
        if (a == 0) CHECK(c->qk_norm == 1 && c->n_experts == 0);
        if (a == 1) CHECK(c->qk_norm == 1 && c->n_experts == 16 && c->n_experts_used == 4 && c->moe_ffn == 32);
        if (a == 2) CHECK(c->n_experts == 16 && c->moe_ffn == 128 && c->moe_norm_topk);
        if (a > 0) {   /* router rows 0-1 (the first eighth) scaled by 5: larger norms than the rest */
            const ft_layer_weights *w = ft_model_layer(m, 0);
            const float *r = w->w_router.data;
            double hot = 0, cold = 0;
            for (int i = 0; i < 64; i++) {
                hot += r[i] * r[i] + r[64 + i] * r[64 + i];
                cold += r[2 * 64 + i] * r[2 * 64 + i] + r[3 * 64 + i] * r[3 * 64 + i];
            }
            CHECK_MSG(hot > 9 * cold, "router skew: hot %g, cold %g", hot, cold);
        }
        ft_model_free(m);
        CHECK(ft_sh("%s run --model %s --prompt 'Hello' --max-new-tokens 3 --temperature 0 --threads 1 --strict "
                    "> /dev/null 2>&1", ft_test_bin(), dir) == 0);
    }
    CHECK(ft_sh("%s gen-model --arch gemma9 --out %s/x > /dev/null 2>&1", ft_test_bin(), tdir()) != 0);
    CHECK(ft_sh("%s gen-model --arch mixtral --experts 2 --experts-per-tok 3 --out %s/x > /dev/null 2>&1",
                ft_test_bin(), tdir()) != 0);
}
