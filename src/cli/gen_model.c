/* flextier gen-model: a random-weight Llama/OPT checkpoint with the Hugging
 * Face file layout, for benchmarks, tests and peers (llama.cpp converts it).
 *
 * Memory: nothing the size of a tensor is held. The tensors are listed from
 * the config (names and shapes as transformers saves them; the engine's
 * loader checks every one, tests load what this writes), and their values
 * are generated block by block inside ft_safetensors_write_stream's fill
 * callback, in parallel on a thread pool. Each block of GM_BLOCK values has
 * its own PRNG stream seeded from (seed, tensor, block), so the file is the
 * same for every thread count. Peak RSS is the writer's buffer, the
 * per-thread scratch and the tokenizer, whatever the model size. */
#include "cli.h"
#include "flextier/engine.h"
#include "flextier/model.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define GM_BLOCK 65536   /* values per PRNG stream */

typedef enum { GM_GAUSS, GM_ONES, GM_ZEROS } gm_kind;

typedef struct {
    char name[160];
    uint32_t ndim;
    int64_t shape[2];
    gm_kind kind;
    int64_t hot_rows;       /* a router: its first hot_rows rows scaled by hot_scale */
    float hot_scale;
} gm_tensor;

typedef struct {
    const gm_tensor *t;
    ft_dtype dt;
    uint64_t seed;
    ft_pool *pool;
    float *scratch;         /* GM_BLOCK floats per worker */
    /* the current fill() call */
    size_t ti;
    uint64_t e0, e1;        /* element range wanted */
    uint64_t b0;            /* first block */
    void *buf;
} gm_gen;

static const char GEN_USAGE[] =
    "usage: flextier gen-model --arch llama|opt|qwen3|qwen3_moe|mixtral --out DIR [--hidden N]\n"
    "         [--layers N] [--heads N] [--kv-heads N] [--head-dim N] [--ffn N] [--vocab N]\n"
    "         [--max-pos N] [--seed N] [--dtype bf16|f32] [--threads N]\n"
    "         [--experts N] [--experts-per-tok K] [--moe-ffn N] [--router-skew S]\n"
    "Writes a random-weight checkpoint with the Hugging Face file layout: config.json,\n"
    "generation_config.json, model.safetensors (streamed: memory stays small whatever the\n"
    "size) and a synthetic BPE tokenizer.json with exactly --vocab tokens (Llama: byte\n"
    "fallback, as Llama 2; OPT: byte-level, as GPT-2), plus tokenizer_config.json.\n"
    "Weights: N(0, 0.02), norm weights 1, biases 0; deterministic in --seed for any --threads.\n"
    "Defaults: llama: hidden 288, 6 layers, 6 heads (6 KV), ffn 768; opt: hidden 256,\n"
    "4 layers, 4 heads, ffn 1024; vocab 320, max-pos 1024, bf16, threads: all CPUs.\n"
    "qwen3 / qwen3_moe / mixtral are Llama-shaped (the same defaults; qwen3: q/k norms, head-dim\n"
    "hidden/heads unless given); qwen3_moe and mixtral: --experts (default 8) experts of\n"
    "--moe-ffn (qwen3_moe, default ffn/4; mixtral: ffn), --experts-per-tok (default 2) per\n"
    "token, renormalised. --router-skew S scales the router rows of the first eighth of the\n"
    "experts by S (> 1: those experts win more often: a skewed routing, as trained models\n"
    "have; 1: uniform, random routers' case).\n";

static int opt_is(const char *a, const char *name) { return !strcmp(a, name); }

static void add_t(gm_tensor *v, size_t *n, gm_kind kind, int64_t d0, int64_t d1, const char *fmt, int layer,
                  const char *suffix)
{
    gm_tensor *t = &v[(*n)++];
    if (layer >= 0) snprintf(t->name, sizeof t->name, fmt, layer, suffix);
    else snprintf(t->name, sizeof t->name, "%s", fmt);
    t->kind = kind;
    t->ndim = d1 ? 2 : 1;
    t->shape[0] = d0;
    t->shape[1] = d1;
}

/* The checkpoint's tensors, in the order transformers lists them. */
enum { GM_OPT = 0, GM_LLAMA, GM_QWEN3, GM_QWEN3_MOE, GM_MIXTRAL };

static size_t list_tensors(const ft_model_config *c, int arch, float skew, gm_tensor *v)
{
    size_t n = 0;
    int64_t h = c->hidden, q = (int64_t)c->n_heads * c->head_dim, kv = (int64_t)c->n_kv_heads * c->head_dim;
    if (arch != GM_OPT) {
        static const char L[] = "model.layers.%d.%s";
        add_t(v, &n, GM_GAUSS, c->vocab, h, "model.embed_tokens.weight", -1, NULL);
        for (int l = 0; l < c->n_layers; l++) {
            add_t(v, &n, GM_ONES, h, 0, L, l, "input_layernorm.weight");
            add_t(v, &n, GM_GAUSS, q, h, L, l, "self_attn.q_proj.weight");
            add_t(v, &n, GM_GAUSS, kv, h, L, l, "self_attn.k_proj.weight");
            add_t(v, &n, GM_GAUSS, kv, h, L, l, "self_attn.v_proj.weight");
            add_t(v, &n, GM_GAUSS, h, q, L, l, "self_attn.o_proj.weight");
            if (c->qk_norm) {
                add_t(v, &n, GM_ONES, c->head_dim, 0, L, l, "self_attn.q_norm.weight");
                add_t(v, &n, GM_ONES, c->head_dim, 0, L, l, "self_attn.k_norm.weight");
            }
            add_t(v, &n, GM_ONES, h, 0, L, l, "post_attention_layernorm.weight");
            if (c->n_experts && c->layer_moe[l]) {
                int mx = arch == GM_MIXTRAL;
                char nm[64];
                snprintf(nm, sizeof nm, "%s.gate.weight", mx ? "block_sparse_moe" : "mlp");
                add_t(v, &n, GM_GAUSS, c->n_experts, h, L, l, nm);
                v[n - 1].hot_rows = skew != 1.0f ? (c->n_experts + 7) / 8 : 0;
                v[n - 1].hot_scale = skew;
                for (int e = 0; e < c->n_experts; e++) {
                    static const char *const qn[3] = {"gate_proj", "up_proj", "down_proj"}, *const mn[3] = {"w1", "w3", "w2"};
                    for (int k = 0; k < 3; k++) {
                        snprintf(nm, sizeof nm, "%s.experts.%d.%s.weight", mx ? "block_sparse_moe" : "mlp", e,
                                 mx ? mn[k] : qn[k]);
                        add_t(v, &n, GM_GAUSS, k == 2 ? h : c->moe_ffn, k == 2 ? c->moe_ffn : h, L, l, nm);
                    }
                }
            } else {
                add_t(v, &n, GM_GAUSS, c->ffn, h, L, l, "mlp.gate_proj.weight");
                add_t(v, &n, GM_GAUSS, c->ffn, h, L, l, "mlp.up_proj.weight");
                add_t(v, &n, GM_GAUSS, h, c->ffn, L, l, "mlp.down_proj.weight");
            }
        }
        add_t(v, &n, GM_ONES, h, 0, "model.norm.weight", -1, NULL);
        add_t(v, &n, GM_GAUSS, c->vocab, h, "lm_head.weight", -1, NULL);
    } else {       /* pre-LN OPT with biases, lm_head tied to the embedding */
        static const char L[] = "model.decoder.layers.%d.%s";
        add_t(v, &n, GM_GAUSS, c->vocab, h, "model.decoder.embed_tokens.weight", -1, NULL);
        add_t(v, &n, GM_GAUSS, (int64_t)c->max_pos + 2, h, "model.decoder.embed_positions.weight", -1, NULL);
        add_t(v, &n, GM_ONES, h, 0, "model.decoder.final_layer_norm.weight", -1, NULL);
        add_t(v, &n, GM_ZEROS, h, 0, "model.decoder.final_layer_norm.bias", -1, NULL);
        for (int l = 0; l < c->n_layers; l++) {
            add_t(v, &n, GM_ONES, h, 0, L, l, "self_attn_layer_norm.weight");
            add_t(v, &n, GM_ZEROS, h, 0, L, l, "self_attn_layer_norm.bias");
            static const char *const proj[] = {"q_proj", "k_proj", "v_proj", "out_proj"};
            for (int p = 0; p < 4; p++) {
                char w[64], b[64];
                snprintf(w, sizeof w, "self_attn.%s.weight", proj[p]);
                snprintf(b, sizeof b, "self_attn.%s.bias", proj[p]);
                add_t(v, &n, GM_GAUSS, h, h, L, l, w);
                add_t(v, &n, GM_ZEROS, h, 0, L, l, b);
            }
            add_t(v, &n, GM_ONES, h, 0, L, l, "final_layer_norm.weight");
            add_t(v, &n, GM_ZEROS, h, 0, L, l, "final_layer_norm.bias");
            add_t(v, &n, GM_GAUSS, c->ffn, h, L, l, "fc1.weight");
            add_t(v, &n, GM_ZEROS, c->ffn, 0, L, l, "fc1.bias");
            add_t(v, &n, GM_GAUSS, h, c->ffn, L, l, "fc2.weight");
            add_t(v, &n, GM_ZEROS, h, 0, L, l, "fc2.bias");
        }
    }
    return n;
}

/* One block of N(0, 0.02) values: Box-Muller, both outputs of each pair. */
static void gauss_block(uint64_t state, float *out, size_t n)
{
    for (size_t k = 0; k < n; k += 2) {
        double u1 = ((double)(ft_rand_u64(&state) >> 11) + 1.0) / 9007199254740993.0;   /* (0, 1] */
        double u2 = (double)(ft_rand_u64(&state) >> 11) / 9007199254740992.0;
        double r = 0.02 * sqrt(-2.0 * log(u1)), a = 6.283185307179586 * u2;
        out[k] = (float)(r * cos(a));
        if (k + 1 < n) out[k + 1] = (float)(r * sin(a));
    }
}

static void gen_block(void *arg, size_t j, unsigned worker)
{
    gm_gen *g = arg;
    const gm_tensor *t = &g->t[g->ti];
    uint64_t b = g->b0 + j, s = b * GM_BLOCK, e = s + GM_BLOCK;
    uint64_t ne = (uint64_t)t->shape[0] * (uint64_t)(t->ndim == 2 ? t->shape[1] : 1);
    if (e > ne) e = ne;
    uint64_t lo = s > g->e0 ? s : g->e0, hi = e < g->e1 ? e : g->e1;
    float *f = g->scratch + (size_t)worker * GM_BLOCK;
    /* the stream of block b of tensor ti: splitmix64 of a mix of the three */
    uint64_t st = g->seed * 0x9e3779b97f4a7c15ull ^ (g->ti + 1) * 0xd1b54a32d192ed03ull ^ (b + 1) * 0x8cb92ba72f3d8dd7ull;
    (void)ft_rand_u64(&st);
    gauss_block(st, f, (size_t)(e - s));
    if (t->hot_rows && t->ndim == 2) {   /* a skewed router: its hot rows scaled */
        uint64_t cols = (uint64_t)t->shape[1];
        for (uint64_t x = lo; x < hi; x++)
            if ((int64_t)(x / cols) < t->hot_rows) f[x - s] *= t->hot_scale;
    }
    ft_convert((uint8_t *)g->buf + ft_dtype_nbytes(g->dt, lo - g->e0), g->dt, f + (lo - s), FT_F32, (size_t)(hi - lo));
}

static ft_status fill(void *user, size_t i, uint64_t offset, void *buf, size_t len)
{
    gm_gen *g = user;
    const gm_tensor *t = &g->t[i];
    size_t es = ft_dtype_bits(g->dt) / 8;   /* f32 or bf16 */
    if (t->kind != GM_GAUSS) {
        float one = t->kind == GM_ONES ? 1.0f : 0.0f;
        for (size_t k = 0; k < len / es; k++) ft_convert((uint8_t *)buf + k * es, g->dt, &one, FT_F32, 1);
        return FT_OK;
    }
    g->ti = i;
    g->e0 = offset / es;
    g->e1 = g->e0 + len / es;
    g->b0 = g->e0 / GM_BLOCK;
    g->buf = buf;
    ft_pool_run(g->pool, (size_t)((g->e1 + GM_BLOCK - 1) / GM_BLOCK - g->b0), gen_block, g);
    return FT_OK;
}

int ft_cmd_gen_model(int argc, char **argv)
{
    const char *arch = NULL, *outdir = NULL, *dtype = "bf16";
    long hidden = 0, layers = 0, heads = 0, kv = 0, ffn = 0, vocab = 320, maxpos = 1024, seed = 1, threads = 0;
    long head_dim = 0, experts = 8, topk = 2, moe_ffn = 0;
    const char *skew_s = "1";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (opt_is(a, "-h") || opt_is(a, "--help")) { fputs(GEN_USAGE, stdout); return FT_EXIT_OK; }
        if (i + 1 >= argc) return ft_cli_usage_error(GEN_USAGE, "option %s needs a value", a);
        const char *v = argv[++i];
        long *dst = NULL;
        long lo = 1, hi = 1 << 20;
        if (opt_is(a, "--arch")) arch = v;
        else if (opt_is(a, "--out")) outdir = v;
        else if (opt_is(a, "--dtype")) dtype = v;
        else if (opt_is(a, "--hidden")) dst = &hidden;
        else if (opt_is(a, "--layers")) { dst = &layers; hi = 1024; }
        else if (opt_is(a, "--heads")) { dst = &heads; hi = 1024; }
        else if (opt_is(a, "--kv-heads")) { dst = &kv; hi = 1024; }
        else if (opt_is(a, "--ffn")) dst = &ffn;
        else if (opt_is(a, "--vocab")) { dst = &vocab; hi = 1 << 22; }
        else if (opt_is(a, "--max-pos")) { dst = &maxpos; hi = 1 << 20; }
        else if (opt_is(a, "--seed")) { dst = &seed; lo = 0; hi = 0x7fffffffL; }
        else if (opt_is(a, "--threads")) { dst = &threads; hi = 1024; }
        else if (opt_is(a, "--head-dim")) { dst = &head_dim; lo = 2; hi = 1024; }
        else if (opt_is(a, "--experts")) { dst = &experts; hi = FT_MAX_EXPERTS; }
        else if (opt_is(a, "--experts-per-tok")) { dst = &topk; hi = FT_MAX_EXPERTS; }
        else if (opt_is(a, "--moe-ffn")) dst = &moe_ffn;
        else if (opt_is(a, "--router-skew")) skew_s = v;
        else return ft_cli_usage_error(GEN_USAGE, "unknown option %s", a);
        if (dst && ft_cli_parse_int(v, lo, hi, dst))
            return ft_cli_usage_error(GEN_USAGE, "bad value for %s: %s", a, v);
    }
    if (!arch || !outdir) return ft_cli_usage_error(GEN_USAGE, "--arch and --out are required");
    int gm = opt_is(arch, "opt") ? GM_OPT : opt_is(arch, "llama") ? GM_LLAMA : opt_is(arch, "qwen3") ? GM_QWEN3
           : opt_is(arch, "qwen3_moe") ? GM_QWEN3_MOE : opt_is(arch, "mixtral") ? GM_MIXTRAL : -1;
    if (gm < 0)
        return ft_cli_usage_error(GEN_USAGE, "--arch must be llama, opt, qwen3, qwen3_moe or mixtral, not %s", arch);
    int is_llama = gm != GM_OPT;
    char *end = NULL;
    double skew = strtod(skew_s, &end);
    if (!end || *end || !(skew > 0 && skew <= 1000))
        return ft_cli_usage_error(GEN_USAGE, "bad value for --router-skew: %s (a factor in (0, 1000])", skew_s);
    if (topk > experts)
        return ft_cli_usage_error(GEN_USAGE, "--experts-per-tok %ld exceeds --experts %ld", topk, experts);
    ft_dtype dt;
    if (opt_is(dtype, "bf16")) dt = FT_BF16;
    else if (opt_is(dtype, "f32")) dt = FT_F32;
    else return ft_cli_usage_error(GEN_USAGE, "--dtype must be bf16 or f32");
    if (vocab < ft_cli_gen_tokenizer_min_vocab(is_llama))
        return ft_cli_usage_error(GEN_USAGE, "--vocab must be at least %ld for %s (%s)",
                                  ft_cli_gen_tokenizer_min_vocab(is_llama), arch,
                                  is_llama ? "3 special tokens, 256 byte tokens and \"\xe2\x96\x81\"" : "4 special tokens and 256 byte tokens");
    if (!hidden) hidden = is_llama ? 288 : 256;
    if (!layers) layers = is_llama ? 6 : 4;
    if (!heads) heads = is_llama ? 6 : 4;
    if (!kv) kv = heads;
    if (!ffn) ffn = is_llama ? 768 : 4 * hidden;
    if (!moe_ffn) moe_ffn = gm == GM_QWEN3_MOE ? (ffn / 4 > 0 ? ffn / 4 : 1) : ffn;
    if (!head_dim) head_dim = hidden / heads;

    char cfgjson[2048], genjson[256], tokcfg[512], extra[512] = "";
    const char *dts = dt == FT_BF16 ? "bfloat16" : "float32";
    static const char *const archname[] = {"OPTForCausalLM", "LlamaForCausalLM", "Qwen3ForCausalLM",
                                           "Qwen3MoeForCausalLM", "MixtralForCausalLM"};
    static const char *const mtype[] = {"opt", "llama", "qwen3", "qwen3_moe", "mixtral"};
    if (gm == GM_QWEN3 || gm == GM_QWEN3_MOE)
        snprintf(extra, sizeof extra, "  \"head_dim\": %ld,\n  \"attention_bias\": false,\n", head_dim);
    if (gm == GM_QWEN3_MOE)
        snprintf(extra + strlen(extra), sizeof extra - strlen(extra),
                 "  \"num_experts\": %ld,\n  \"num_experts_per_tok\": %ld,\n  \"moe_intermediate_size\": %ld,\n"
                 "  \"norm_topk_prob\": true,\n  \"decoder_sparse_step\": 1,\n  \"mlp_only_layers\": [],\n",
                 experts, topk, moe_ffn);
    if (gm == GM_MIXTRAL)
        snprintf(extra, sizeof extra, "  \"num_local_experts\": %ld,\n  \"num_experts_per_tok\": %ld,\n", experts, topk);
    if (is_llama) {
        snprintf(cfgjson, sizeof cfgjson,
                 "{\n  \"architectures\": [\"%s\"],\n  \"model_type\": \"%s\",\n%s"
                 "  \"hidden_size\": %ld,\n  \"intermediate_size\": %ld,\n  \"num_hidden_layers\": %ld,\n"
                 "  \"num_attention_heads\": %ld,\n  \"num_key_value_heads\": %ld,\n  \"vocab_size\": %ld,\n"
                 "  \"max_position_embeddings\": %ld,\n  \"rms_norm_eps\": 1e-05,\n  \"rope_theta\": 10000.0,\n"
                 "  \"hidden_act\": \"silu\",\n  \"tie_word_embeddings\": false,\n  \"bos_token_id\": 1,\n"
                 "  \"eos_token_id\": 2,\n  \"torch_dtype\": \"%s\"\n}\n",
                 archname[gm], mtype[gm], extra, hidden, ffn, layers, heads, kv, vocab, maxpos, dts);
        snprintf(genjson, sizeof genjson, "{\n  \"bos_token_id\": 1,\n  \"eos_token_id\": 2\n}\n");
        snprintf(tokcfg, sizeof tokcfg,
                 "{\n  \"tokenizer_class\": \"LlamaTokenizer\",\n  \"add_bos_token\": true,\n"
                 "  \"add_eos_token\": false,\n  \"bos_token\": \"<s>\",\n  \"eos_token\": \"</s>\",\n"
                 "  \"unk_token\": \"<unk>\",\n  \"model_max_length\": %ld\n}\n", maxpos);
    } else {
        snprintf(cfgjson, sizeof cfgjson,
                 "{\n  \"architectures\": [\"OPTForCausalLM\"],\n  \"model_type\": \"opt\",\n"
                 "  \"hidden_size\": %ld,\n  \"ffn_dim\": %ld,\n  \"num_hidden_layers\": %ld,\n"
                 "  \"num_attention_heads\": %ld,\n  \"vocab_size\": %ld,\n  \"max_position_embeddings\": %ld,\n"
                 "  \"word_embed_proj_dim\": %ld,\n  \"do_layer_norm_before\": true,\n"
                 "  \"activation_function\": \"relu\",\n  \"enable_bias\": true,\n"
                 "  \"layer_norm_elementwise_affine\": true,\n  \"tie_word_embeddings\": true,\n"
                 "  \"bos_token_id\": 2,\n  \"eos_token_id\": 2,\n  \"pad_token_id\": 1,\n"
                 "  \"torch_dtype\": \"%s\"\n}\n",
                 hidden, ffn, layers, heads, vocab, maxpos, hidden, dts);
        snprintf(genjson, sizeof genjson,
                 "{\n  \"bos_token_id\": 2,\n  \"eos_token_id\": 2,\n  \"pad_token_id\": 1\n}\n");
        snprintf(tokcfg, sizeof tokcfg,
                 "{\n  \"tokenizer_class\": \"GPT2Tokenizer\",\n  \"add_bos_token\": true,\n"
                 "  \"bos_token\": \"</s>\",\n  \"eos_token\": \"</s>\",\n  \"unk_token\": \"<unk>\",\n"
                 "  \"pad_token\": \"<pad>\",\n  \"model_max_length\": %ld\n}\n", maxpos);
    }
    /* the engine's own checks on the shape (heads divide hidden, ...) */
    ft_model_config cfg;
    ft_status st = ft_model_config_parse(cfgjson, strlen(cfgjson), "generated config", &cfg);
    if (st) return ft_cli_fail("gen-model", st);
    if (mkdir(outdir, 0755) && errno != EEXIST) {
        fprintf(stderr, "flextier: gen-model: cannot create %s: %s\n", outdir, strerror(errno));
        return FT_EXIT_ERR;
    }
    int rc = FT_EXIT_ERR;
    char *tokjson = NULL;
    size_t toklen = 0;
    gm_gen g = {.dt = dt, .seed = (uint64_t)seed};
    size_t maxn = 4 + (size_t)layers * (20 + 3 * (size_t)cfg.n_experts + 1);
    gm_tensor *tl = calloc(maxn, sizeof *tl);
    ft_named_tensor *nt = calloc(maxn, sizeof *nt);
    if (!tl || !nt) { ft_cli_fail("gen-model", FT_ERR_NOMEM); goto done; }
    size_t n = list_tensors(&cfg, gm, (float)skew, tl);
    uint64_t bytes = 0;
    for (size_t i = 0; i < n; i++) {
        nt[i].name = tl[i].name;
        if ((st = ft_tensor_init(&nt[i].tensor, dt, tl[i].ndim, tl[i].shape, NULL))) {
            ft_cli_fail("gen-model", st);
            goto done;
        }
        uint64_t b;
        if ((st = ft_tensor_nbytes(&nt[i].tensor, &b))) { ft_cli_fail("gen-model", st); goto done; }
        bytes += b;
    }
    if ((st = ft_pool_create((unsigned)threads, &g.pool))) { ft_cli_fail("gen-model", st); goto done; }
    g.t = tl;
    g.scratch = malloc((size_t)ft_pool_size(g.pool) * GM_BLOCK * sizeof(float));
    if (!g.scratch) { ft_cli_fail("gen-model", FT_ERR_NOMEM); goto done; }

    char path[4096];
    static const char *const meta[] = {"format", "pt", NULL};
    snprintf(path, sizeof path, "%s/model.safetensors", outdir);
    if ((st = ft_safetensors_write_stream(path, nt, n, meta, fill, &g))) { ft_cli_fail(path, st); goto done; }
    snprintf(path, sizeof path, "%s/config.json", outdir);
    if ((st = ft_cli_write_file(path, cfgjson, strlen(cfgjson)))) { ft_cli_fail(path, st); goto done; }
    snprintf(path, sizeof path, "%s/generation_config.json", outdir);
    if ((st = ft_cli_write_file(path, genjson, strlen(genjson)))) { ft_cli_fail(path, st); goto done; }
    if ((st = ft_cli_gen_tokenizer(is_llama, vocab, &tokjson, &toklen))) { ft_cli_fail("gen-model", st); goto done; }
    snprintf(path, sizeof path, "%s/tokenizer.json", outdir);
    if ((st = ft_cli_write_file(path, tokjson, toklen))) { ft_cli_fail(path, st); goto done; }
    snprintf(path, sizeof path, "%s/tokenizer_config.json", outdir);
    if ((st = ft_cli_write_file(path, tokcfg, strlen(tokcfg)))) { ft_cli_fail(path, st); goto done; }
    char wb[32];
    ft_cli_fmt_bytes((double)bytes, wb, sizeof wb);
    printf("wrote %s: %s, hidden %d, %d layers, %d heads (%d KV), ffn %d, vocab %d, %s weights (%s)",
           outdir, cfg.model_type, cfg.hidden, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.ffn,
           cfg.vocab, dtype, wb);
    if (cfg.n_experts)
        printf(", %d experts of %d (%d per token), router skew %g", cfg.n_experts, cfg.moe_ffn, cfg.n_experts_used,
               skew);
    printf("\n");
    rc = FT_EXIT_OK;
done:
    free(tokjson);
    free(g.scratch);
    ft_pool_free(g.pool);
    free(nt);
    free(tl);
    return rc;
}
