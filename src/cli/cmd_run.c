/* flextier run | bench run: the inference engine's commands (gen-model: gen_model.c). */
#include "cli.h"
#include "offload_opts.h"
#include "cuda_opts.h"
#include "pipe_opts.h"
#include "flextier/engine.h"
#include "flextier/model.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>

static int opt_is(const char *a, const char *name) { return !strcmp(a, name); }

static double peak_rss_bytes(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_maxrss * 1024.0;
}

/* ------------------------------------------------------------ bench run */

static const char BENCH_USAGE[] =
    "usage: flextier bench run --model DIR --batch B --prompt-len P --gen-len G\n"
    "         [--threads N] [--seed N] [--json] [--device cpu|cuda] [offloading options]\n"
    "FlexGen's benchmark shape: B random prompts of P tokens, G new tokens each (greedy,\n"
    "EOS ignored). Reports prefill and decode tokens/s and peak RSS vs weight bytes;\n"
    "with --policy, the offloading metrics too.\n";

static void load_progress(void *user, uint64_t done, uint64_t total);

/* bench run --pipeline: the same workload over a pipeline of stages; this
 * process is the last stage (the driver), or in MPI mode any rank. */
static int bench_pipeline(ft_cli_pipe *pp, ft_cli_offload *off, const char *dir, long batch, long plen, long glen,
                          long threads, long seed, int json, int strict_flags)
{
    ft_load_params lp;
    ft_load_params_default(&lp);
    lp.config_flags = (unsigned)strict_flags;
    ft_status st = ft_cli_engine_formats(off, 0, &lp);
    if (st) return ft_cli_usage_error(BENCH_USAGE, "%s", ft_last_error());
    int M = pp->mode == FT_PIPE_MPI ? 0 : ft_cli_pipe_micro(pp, (size_t)batch);
    ft_pipe_stage_params base;
    /* a micro-batch's prompt is one forward call: ceil(batch / M) prompts */
    int mrows = (int)(((batch + (M ? M : 1) - 1) / (M ? M : 1)) * plen);
    if (pp->mode == FT_PIPE_MPI) mrows = (int)(batch * plen);   /* the ring's size is known later */
    if ((st = ft_cli_pipe_base(pp, dir, off, &lp, (int)batch, (int)(plen + glen), mrows, (unsigned)threads, &base)))
        return ft_cli_fail("pipeline", st);
    double t0 = ft_now();
    int worker_done = 0;
    st = ft_cli_pipe_start(pp, &base, &off->p, &worker_done);
    if (worker_done) return st ? ft_cli_fail("pipeline stage", st) : FT_EXIT_OK;
    int rc = FT_EXIT_ERR;
    int32_t *prompts = NULL, *outs = NULL;
    const int32_t **ppr = NULL;
    int32_t **op = NULL;
    size_t *pl = NULL, *no = NULL;
    if (st) { ft_cli_fail("pipeline", st); goto done; }
    double load_s = ft_now() - t0;
    M = ft_cli_pipe_micro(pp, (size_t)batch);
    ft_model_config mcfg = *ft_pipe_stage_config(pp->stage);   /* the stage goes at finish */
    const ft_model_config *cfg = &mcfg;
    prompts = malloc((size_t)(batch * plen) * sizeof *prompts);
    outs = malloc((size_t)(batch * glen) * sizeof *outs);
    ppr = malloc((size_t)batch * sizeof *ppr);
    op = malloc((size_t)batch * sizeof *op);
    pl = malloc((size_t)batch * sizeof *pl);
    no = malloc((size_t)batch * sizeof *no);
    if (!prompts || !outs || !ppr || !op || !pl || !no) { ft_cli_fail("bench", FT_ERR_NOMEM); goto done; }
    uint64_t rng = (uint64_t)seed;
    for (long i = 0; i < batch * plen; i++) prompts[i] = (int32_t)(ft_rand_u64(&rng) % (uint64_t)cfg->vocab);
    for (long j = 0; j < batch; j++) {
        ppr[j] = prompts + j * plen;
        op[j] = outs + j * glen;
        pl[j] = (size_t)plen;
    }
    ft_gen_params gp = {.max_new_tokens = (size_t)glen, .ignore_eos = 1};
    ft_pipe_gen_opts po = {.micro_batches = M, .timeout_ms = 600000};
    ft_pipe_gen_stats gs;
    if ((st = ft_pipe_generate(pp->stage, pp->link, (size_t)batch, ppr, pl, &gp, &po, op, no, &gs))) {
        ft_cli_fail("pipeline generate", st);
        goto done;
    }
    rc = FT_EXIT_OK;
    double pre_tps = gs.gen.prefill_s > 0 ? (double)gs.gen.prefill_tokens / gs.gen.prefill_s : 0;
    double dec_tps = gs.gen.decode_s > 0 ? (double)gs.gen.decode_tokens / gs.gen.decode_s : 0;
    double e2e = (double)(batch * glen) / gs.wall_s;
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double rss = (double)ru.ru_maxrss * 1024.0;
    ft_cli_pipe_finish(pp);   /* MPI: gathers every stage's peak RSS */
    if (json) {
        printf("{\"model\":\"%s\",\"arch\":\"%s\",\"batch\":%ld,\"prompt_len\":%ld,\"gen_len\":%ld,"
               "\"threads\":%ld,\"load_s\":%.3f,\"prefill_s\":%.4f,\"decode_s\":%.4f,\"prefill_tok_s\":%.1f,"
               "\"decode_tok_s\":%.2f,\"throughput_tok_s\":%.2f,\"peak_rss_bytes\":%.0f,\"pipeline\":{"
               "\"stages\":%d,\"micro_batches\":%d,\"transport\":\"%s\",\"layers\":[",
               dir, cfg->model_type, batch, plen, glen, threads, load_s, gs.gen.prefill_s, gs.gen.decode_s, pre_tps,
               dec_tps, e2e, rss, pp->n_stages, M, pp->transport);
        for (int i = 0; i <= pp->n_stages; i++) printf("%s%d", i ? "," : "", pp->bounds[i]);
        printf("],\"stage_peak_rss_bytes\":[");
        for (int i = 0; i < pp->n_stages; i++)
            printf("%s%.0f", i ? "," : "", pp->mode == FT_PIPE_MPI ? pp->rss[i] : i == pp->n_stages - 1 ? rss : 0);
        printf("]}}\n");
    } else {
        char b[32];
        ft_cli_fmt_bytes(rss, b, sizeof b);
        printf("model %s (%s, %d layers, hidden %d), batch %ld, prompt %ld, gen %ld, %ld threads per stage\n", dir,
               cfg->model_type, cfg->n_layers, cfg->hidden, batch, plen, glen, threads);
        ft_cli_pipe_describe(pp, M, stdout);
        printf("  load       %8.3f s\n", load_s);
        printf("  prefill    %8.3f s  %10.1f tok/s (until every micro-batch has its first token)\n", gs.gen.prefill_s,
               pre_tps);
        printf("  decode     %8.3f s  %10.2f tok/s\n", gs.gen.decode_s, dec_tps);
        printf("  throughput %8.2f generated tok/s (prefill + decode)\n", e2e);
        printf("  memory     peak RSS of this stage %s", b);
        if (pp->mode == FT_PIPE_MPI)
            for (int i = 0; i < pp->n_stages; i++) printf("%s%.1f MiB", i ? ", " : " (every stage: ", pp->rss[i] / 1048576.0);
        printf("%s\n", pp->mode == FT_PIPE_MPI ? ")" : "");
    }
done:
    if (rc != FT_EXIT_OK) ft_cli_pipe_finish(pp);
    free(prompts); free(outs); free(ppr); free(op); free(pl); free(no);
    return rc;
}

static void load_progress(void *user, uint64_t done, uint64_t total)
{
    (void)user;
    if (total < (256u << 20)) return;     /* only for long loads */
    fprintf(stderr, "\rloading weights: %5.1f%%", 100.0 * (double)done / (double)total);
    if (done >= total) fputc('\n', stderr);
}

int ft_bench_run(int argc, char **argv)
{
    const char *dir = NULL;
    long batch = 1, plen = 0, glen = 0, threads = 0, seed = 1;
    int json = 0;
    ft_cli_offload off;
    ft_cli_offload_init(&off);
    off.stats = 1;
    ft_cli_cuda gpu = {0};
    ft_cli_pipe pipe;
    ft_cli_pipe_init(&pipe);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (opt_is(a, "-h") || opt_is(a, "--help")) {
            fputs(BENCH_USAGE, stdout);
            fputs(ft_cli_engine_usage, stdout);
            fputs(ft_cli_offload_usage, stdout);
            ft_cli_pipe_print_usage(stdout);
            fputs(ft_cli_cuda_usage, stdout);
            return FT_EXIT_OK;
        }
        int r = ft_cli_offload_arg(&off, argc, argv, &i);
        if (!r) r = ft_cli_cuda_arg(&gpu, argc, argv, &i);
        if (!r) r = ft_cli_pipe_arg(&pipe, argc, argv, &i);
        if (r < 0) return FT_EXIT_USAGE;
        if (r) continue;
        if (opt_is(a, "--json")) { json = 1; continue; }
        if (i + 1 >= argc) return ft_cli_usage_error(BENCH_USAGE, "option %s needs a value", a);
        const char *v = argv[++i];
        long *dst = NULL, lo = 1, hi = 1 << 20;
        if (opt_is(a, "--model")) dir = v;
        else if (opt_is(a, "--batch")) { dst = &batch; hi = 65536; }
        else if (opt_is(a, "--prompt-len")) dst = &plen;
        else if (opt_is(a, "--gen-len")) dst = &glen;
        else if (opt_is(a, "--threads")) { dst = &threads; hi = 1024; }
        else if (opt_is(a, "--seed")) { dst = &seed; lo = 0; hi = 0x7fffffffL; }
        else return ft_cli_usage_error(BENCH_USAGE, "unknown option %s", a);
        if (dst && ft_cli_parse_int(v, lo, hi, dst))
            return ft_cli_usage_error(BENCH_USAGE, "bad value for %s: %s", a, v);
    }
    if (!dir || !plen || !glen)
        return ft_cli_usage_error(BENCH_USAGE, "--model, --prompt-len and --gen-len are required");
    if (pipe.mode) {
        if (gpu.on) return ft_cli_usage_error(BENCH_USAGE, "--pipeline runs on the CPU (no --device cuda)");
        off.threads = (unsigned)threads;
        return bench_pipeline(&pipe, &off, dir, batch, plen, glen, threads, seed, json, 0);
    }
    if (pipe.trusted || pipe.micro || pipe.n_counts || pipe.token_file)
        return ft_cli_usage_error(BENCH_USAGE, "pipeline options need --pipeline");
    ft_model *m = NULL;
    ft_ctx *c = NULL;
    int32_t *prompts = NULL, *outs = NULL;
    const int32_t **pp = NULL;
    int32_t **op = NULL;
    size_t *pl = NULL, *no = NULL;
    int rc = FT_EXIT_ERR;
    ft_load_params lp;
    ft_load_params_default(&lp);
    lp.progress = load_progress;
    double t0 = ft_now();
    off.threads = (unsigned)threads;
    ft_status st = ft_cli_engine_formats(&off, gpu.on, &lp);
    if (st) return ft_cli_usage_error(BENCH_USAGE, "%s", ft_last_error());
    if (gpu.on) {
        if ((st = ft_cli_cuda_check(&gpu, &off))) return ft_cli_fail("bench", st);
        st = ft_model_load(dir, &lp, &m);
    } else {
        st = ft_cli_offload_load(&off, dir, &lp, (uint32_t)batch, (uint32_t)plen, (uint32_t)glen, &m);
    }
    if (st) return ft_cli_fail(dir, st);
    double load_s = ft_now() - t0;
    const ft_model_config *cfg = ft_model_get_config(m);
    ft_ctx_params cp = {.max_batch = (int)batch, .max_seq = (int)(plen + glen),
                        .max_rows = (int)(batch * plen), .threads = (unsigned)threads};
    if (gpu.on) {
        if ((st = ft_cli_cuda_create(&gpu, m, cp.max_batch, cp.max_seq, cp.max_rows, 0, cp.threads))) {
            ft_cli_fail("CUDA context", st);
            goto done;
        }
    } else {
        ft_cli_offload_ctx_params(&off, &cp);
        if ((st = ft_ctx_create(m, &cp, &c))) { ft_cli_fail("context", st); goto done; }
        if ((st = ft_cli_offload_attach(&off, m, c, &cp))) { ft_cli_fail("KV cache offloading", st); goto done; }
    }
    prompts = malloc((size_t)(batch * plen) * sizeof *prompts);
    outs = malloc((size_t)(batch * glen) * sizeof *outs);
    pp = malloc((size_t)batch * sizeof *pp);
    op = malloc((size_t)batch * sizeof *op);
    pl = malloc((size_t)batch * sizeof *pl);
    no = malloc((size_t)batch * sizeof *no);
    if (!prompts || !outs || !pp || !op || !pl || !no) { ft_cli_fail("bench", FT_ERR_NOMEM); goto done; }
    uint64_t rng = (uint64_t)seed;
    for (long i = 0; i < batch * plen; i++) prompts[i] = (int32_t)(ft_rand_u64(&rng) % (uint64_t)cfg->vocab);
    for (long j = 0; j < batch; j++) {
        pp[j] = prompts + j * plen;
        op[j] = outs + j * glen;
        pl[j] = (size_t)plen;
    }
    ft_gen_params gp = {.max_new_tokens = (size_t)glen, .ignore_eos = 1, .on_token = ft_cli_offload_on_token,
                        .user = &off};
    ft_gen_stats gs;
    st = gpu.on ? ft_cuda_generate(gpu.c, (size_t)batch, pp, pl, &gp, op, no, &gs)
                : ft_generate(c, (size_t)batch, pp, pl, &gp, op, no, &gs);
    if (st) { ft_cli_fail("generate", st); goto done; }
    double pre_tps = gs.prefill_s > 0 ? (double)gs.prefill_tokens / gs.prefill_s : 0;
    double dec_tps = gs.decode_s > 0 ? (double)gs.decode_tokens / gs.decode_s : 0;
    double gen_total = (double)(batch * glen);
    double e2e = gen_total / (gs.prefill_s + gs.decode_s);
    double rss = peak_rss_bytes(), wbytes = (double)ft_model_weight_bytes(m);
    double kvb = gpu.on ? 0 : (double)ft_ctx_kv_bytes(c);
    unsigned nthreads = threads ? (unsigned)threads : ft_default_threads();
    if (json) {
        printf("{\"model\":\"%s\",\"arch\":\"%s\",\"batch\":%ld,\"prompt_len\":%ld,\"gen_len\":%ld,"
               "\"threads\":%u,\"load_s\":%.3f,\"prefill_s\":%.4f,\"decode_s\":%.4f,"
               "\"prefill_tok_s\":%.1f,\"decode_tok_s\":%.2f,\"throughput_tok_s\":%.2f,"
               "\"prefill_cpu_s\":%.4f,\"decode_cpu_s\":%.4f,\"decode_tok_per_cpu_s\":%.2f,"
               "\"weight_bytes\":%.0f,\"weights_format\":\"%s\",\"kv_bytes\":%.0f,\"kv_dtype\":\"%s\","
               "\"peak_rss_bytes\":%.0f,\"device\":\"%s\"",
               dir, cfg->model_type, batch, plen, glen, nthreads, load_s, gs.prefill_s, gs.decode_s,
               pre_tps, dec_tps, e2e, gs.prefill_cpu_s, gs.decode_cpu_s,
               gs.decode_cpu_s > 0 ? (double)gs.decode_tokens / gs.decode_cpu_s : 0, wbytes,
               ft_wfmt_name(ft_model_weights_format(m)), kvb, ft_dtype_name(cp.kv_dtype), rss,
               gpu.on ? "cuda" : "cpu");
        if (gpu.on) ft_cli_cuda_report_json(&gpu, stdout);
        if (off.enabled) {
            printf(",\"offload\":");
            ft_cli_offload_report_json(&off, gs.prefill_s, gs.decode_s, stdout);
        }
        printf("}\n");
    } else {
        char b1[32], b2[32], b3[32];
        ft_cli_fmt_bytes(wbytes, b1, sizeof b1);
        ft_cli_fmt_bytes(kvb, b2, sizeof b2);
        ft_cli_fmt_bytes(rss, b3, sizeof b3);
        printf("model %s (%s, %d layers, hidden %d), batch %ld, prompt %ld, gen %ld, %u threads\n",
               dir, cfg->model_type, cfg->n_layers, cfg->hidden, batch, plen, glen, nthreads);
        printf("  load       %8.3f s\n", load_s);
        printf("  prefill    %8.3f s  %10.1f tok/s\n", gs.prefill_s, pre_tps);
        printf("  decode     %8.3f s  %10.2f tok/s  (CPU %.3f s: %.2f tok per CPU-s)\n", gs.decode_s,
               dec_tps, gs.decode_cpu_s, gs.decode_cpu_s > 0 ? (double)gs.decode_tokens / gs.decode_cpu_s : 0);
        printf("  throughput %8.2f generated tok/s (prefill + decode)\n", e2e);
        if (gpu.on) {
            ft_cli_cuda_report(&gpu, stdout);
        } else {
            printf("  memory     weights %s (%s), KV cache %s (%s), peak RSS %s (%.2fx weights + KV cache)\n",
                   b1, ft_wfmt_name(ft_model_weights_format(m)), b2, ft_dtype_name(cp.kv_dtype), b3,
                   rss / (wbytes + kvb));
            ft_cli_offload_report(&off, gs.prefill_s, gs.decode_s, stdout);
        }
    }
    rc = FT_EXIT_OK;
done:
    free(prompts); free(outs); free(pp); free(op); free(pl); free(no);
    ft_ctx_free(c);
    ft_cli_cuda_free(&gpu);
    ft_cli_offload_free(&off);
    ft_model_free(m);
    return rc;
}
/* ------------------------------------------------------------------ run */

static const char RUN_USAGE[] =
    "usage: flextier run --model DIR (--prompt TEXT | --prompt-file FILE) [--max-new-tokens N]\n"
    "         [--temperature T] [--top-k K] [--top-p P] [--repetition-penalty R] [--seed S]\n"
    "         [--stop STR] [--ignore-eos] [--threads N] [--dump-logits FILE] [--device cpu|cuda]\n"
    "         [--strict] [offloading options]\n"
    "Generates from a Hugging Face model directory (config.json, *.safetensors,\n"
    "tokenizer.json or vocab.json + merges.txt). One --prompt streams its text; a --prompt-file\n"
    "holds one prompt per\n"
    "line, run as one batch, printed per prompt. Sampling defaults come from the model's\n"
    "generation_config.json; --temperature 0 is greedy. --dump-logits writes the f32\n"
    "logits of every prompt position (prompts in order, vocab floats per row).\n"
    "Prefill and decode tokens/s go to stderr at the end. --strict: a config.json /\n"
    "generation_config.json key or tokenizer field flextier does not know is an error\n"
    "(default: a warning naming it).\n";

typedef struct {
    const ft_tokenizer *tok;
    ft_detok **dt;
    char **text;            /* generated text per sequence */
    size_t *len, *cap, *shown;
    const char *stop;
    int stream;             /* single prompt: print as we go */
    ft_status err;
    ft_cli_offload *off;    /* marked when decoding begins */
} run_state;

static int text_append(run_state *s, size_t j, const char *b, size_t n)
{
    if (s->len[j] + n + 1 > s->cap[j]) {
        size_t nc = (s->cap[j] + n + 1) * 2;
        char *t = realloc(s->text[j], nc);
        if (!t) return -1;
        s->text[j] = t;
        s->cap[j] = nc;
    }
    memcpy(s->text[j] + s->len[j], b, n);
    s->len[j] += n;
    s->text[j][s->len[j]] = 0;
    return 0;
}

/* Returns 1 when the stop string appeared (text is cut before it). */
static int text_check(run_state *s, size_t j, int final)
{
    int stopped = 0;
    if (!s->text[j]) return 0;          /* nothing decoded yet */
    if (s->stop && *s->stop) {
        char *p = strstr(s->text[j], s->stop);
        if (p) {
            s->len[j] = (size_t)(p - s->text[j]);
            *p = 0;
            stopped = 1;
        }
    }
    if (s->stream) {
        size_t hold = (!stopped && !final && s->stop && *s->stop) ? strlen(s->stop) - 1 : 0;
        size_t upto = s->len[j] > hold ? s->len[j] - hold : 0;
        if (upto > s->shown[j]) {
            fwrite(s->text[j] + s->shown[j], 1, upto - s->shown[j], stdout);
            fflush(stdout);
            s->shown[j] = upto;
        }
    }
    return stopped;
}

static int on_token(void *user, size_t j, int32_t tok)
{
    run_state *s = user;
    if (s->off) ft_cli_offload_mark(s->off);
    char buf[256];
    size_t w = 0;
    ft_status st = ft_detok_push(s->dt[j], tok, buf, sizeof buf, &w);
    if (st) { s->err = st; return 1; }
    if (w && text_append(s, j, buf, w)) { s->err = FT_ERR_NOMEM; return 1; }
    return text_check(s, j, 0);
}

static ft_status split_lines(char *data, size_t size, char ***lines, size_t *n)
{
    size_t cnt = 0, cap = 16;
    char **v = malloc(cap * sizeof *v);
    if (!v) return FT_ERR_NOMEM;
    char *p = data, *end = data + size;
    while (p < end) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        char *e = nl ? nl : end;
        if (e > p && e[-1] == '\r') e[-1] = 0;
        *e = 0;
        if (*p) {
            if (cnt == cap) {
                char **nv = realloc(v, 2 * cap * sizeof *v);
                if (!nv) { free(v); return FT_ERR_NOMEM; }
                v = nv;
                cap *= 2;
            }
            v[cnt++] = p;
        }
        p = nl ? nl + 1 : end;
    }
    *lines = v;
    *n = cnt;
    return FT_OK;
}

int ft_cmd_run(int argc, char **argv)
{
    const char *dir = NULL, *prompt = NULL, *pfile = NULL, *stop = NULL, *dump = NULL;
    long max_new = 64, top_k = -1, threads = 0, seed = 0;
    double temp = -1, top_p = -1, rep = -1;
    int ignore_eos = 0, have_seed = 0, strict = 0;
    ft_cli_offload off;
    ft_cli_offload_init(&off);
    ft_cli_cuda gpu = {0};
    ft_cli_pipe pipe;
    ft_cli_pipe_init(&pipe);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (opt_is(a, "-h") || opt_is(a, "--help")) {
            fputs(RUN_USAGE, stdout);
            fputs(ft_cli_engine_usage, stdout);
            fputs(ft_cli_offload_usage, stdout);
            ft_cli_pipe_print_usage(stdout);
            fputs(ft_cli_cuda_usage, stdout);
            return FT_EXIT_OK;
        }
        int r = ft_cli_offload_arg(&off, argc, argv, &i);
        if (!r) r = ft_cli_cuda_arg(&gpu, argc, argv, &i);
        if (!r) r = ft_cli_pipe_arg(&pipe, argc, argv, &i);
        if (r < 0) return FT_EXIT_USAGE;
        if (r) continue;
        if (opt_is(a, "--ignore-eos")) { ignore_eos = 1; continue; }
        if (opt_is(a, "--strict")) { strict = 1; continue; }
        if (i + 1 >= argc) return ft_cli_usage_error(RUN_USAGE, "option %s needs a value", a);
        const char *v = argv[++i];
        char *endp = NULL;
        if (opt_is(a, "--model")) dir = v;
        else if (opt_is(a, "--prompt")) prompt = v;
        else if (opt_is(a, "--prompt-file")) pfile = v;
        else if (opt_is(a, "--stop")) stop = v;
        else if (opt_is(a, "--dump-logits")) dump = v;
        else if (opt_is(a, "--max-new-tokens")) {
            if (ft_cli_parse_int(v, 0, 1 << 20, &max_new)) return ft_cli_usage_error(RUN_USAGE, "bad --max-new-tokens %s", v);
        } else if (opt_is(a, "--top-k")) {
            if (ft_cli_parse_int(v, 0, 1 << 22, &top_k)) return ft_cli_usage_error(RUN_USAGE, "bad --top-k %s", v);
        } else if (opt_is(a, "--threads")) {
            if (ft_cli_parse_int(v, 1, 1024, &threads)) return ft_cli_usage_error(RUN_USAGE, "bad --threads %s", v);
        } else if (opt_is(a, "--seed")) {
            if (ft_cli_parse_int(v, 0, 0x7fffffffL, &seed)) return ft_cli_usage_error(RUN_USAGE, "bad --seed %s", v);
            have_seed = 1;
        } else if (opt_is(a, "--temperature") || opt_is(a, "--top-p") || opt_is(a, "--repetition-penalty")) {
            double d = strtod(v, &endp);
            if (!*v || *endp || !(d >= 0 && d <= 1e6) || (opt_is(a, "--top-p") && d > 1))
                return ft_cli_usage_error(RUN_USAGE, "bad value for %s: %s", a, v);
            if (opt_is(a, "--temperature")) temp = d;
            else if (opt_is(a, "--top-p")) top_p = d;
            else rep = d;
        } else return ft_cli_usage_error(RUN_USAGE, "unknown option %s", a);
    }
    if (!dir) return ft_cli_usage_error(RUN_USAGE, "--model is required");
    if (!prompt == !pfile) return ft_cli_usage_error(RUN_USAGE, "give exactly one of --prompt and --prompt-file");
    if (pipe.mode && (gpu.on || dump))
        return ft_cli_usage_error(RUN_USAGE, "--pipeline runs on the CPU and has no --dump-logits");
    if (!pipe.mode && (pipe.trusted || pipe.micro || pipe.n_counts || pipe.token_file))
        return ft_cli_usage_error(RUN_USAGE, "pipeline options need --pipeline");
    ft_model_config pcfg;   /* --pipeline: the config only; the stages load the weights */

    int rc = FT_EXIT_ERR;
    ft_status st;
    ft_model *m = NULL;
    ft_tokenizer *tok = NULL;
    ft_ctx *c = NULL;
    uint8_t *fdata = NULL;
    size_t fsize = 0, np = 0;
    char **lines = NULL;
    int32_t **ids = NULL, **outs = NULL;
    size_t *plen = NULL, *nout = NULL;
    run_state rs = {0};

    if (gpu.on && (st = ft_cli_cuda_check(&gpu, &off))) return ft_cli_fail("run", st);
    if (pfile) {
        if ((st = ft_cli_read_file(pfile, &fdata, &fsize))) return ft_cli_fail(pfile, st);
        char *txt = malloc(fsize + 1);
        if (!txt) { ft_free_aligned(fdata); return ft_cli_fail("run", FT_ERR_NOMEM); }
        memcpy(txt, fdata, fsize);
        txt[fsize] = 0;
        ft_free_aligned(fdata);
        fdata = (uint8_t *)txt;
        if ((st = split_lines(txt, fsize, &lines, &np))) { ft_cli_fail("run", st); goto done; }
        if (!np) { fprintf(stderr, "flextier: run: %s has no prompts\n", pfile); goto done; }
    } else {
        lines = malloc(sizeof *lines);
        if (!lines) { ft_cli_fail("run", FT_ERR_NOMEM); goto done; }
        lines[0] = (char *)prompt;
        np = 1;
    }
    ft_load_params lp;
    ft_load_params_default(&lp);
    lp.progress = load_progress;
    if (strict) {   /* config keys and tokenizer fields flextier does not know are errors */
        lp.config_flags = FT_CONFIG_STRICT;
        setenv("FLEXTIER_STRICT", "1", 1);
    }
    off.threads = (unsigned)threads;
    if ((st = ft_cli_engine_formats(&off, gpu.on, &lp))) {
        ft_cli_usage_error(RUN_USAGE, "%s", ft_last_error());
        rc = FT_EXIT_USAGE;
        goto done;
    }
    {
        size_t longest = 0;   /* prompt length estimate for --policy auto */
        for (size_t j = 0; j < np; j++) if (strlen(lines[j]) > longest) longest = strlen(lines[j]);
        st = gpu.on ? ft_model_load(dir, &lp, &m)
           : pipe.mode ? ft_model_config_load_ex(dir, lp.config_flags, &pcfg)
                    : ft_cli_offload_load(&off, dir, &lp, (uint32_t)np, (uint32_t)(longest / 3 + 1), (uint32_t)max_new, &m);
        if (st) {
            ft_cli_fail(dir, st);
            goto done;
        }
    }
    const ft_model_config *cfg = pipe.mode ? &pcfg : ft_model_get_config(m);
    /* tokenizer.json, or vocab.json + merges.txt (GPT-2 / OPT on the Hub) */
    if ((st = ft_tokenizer_load_dir(dir, &tok))) { ft_cli_fail("tokenizer", st); goto done; }

    ids = calloc(np, sizeof *ids);
    outs = calloc(np, sizeof *outs);
    plen = calloc(np, sizeof *plen);
    nout = calloc(np, sizeof *nout);
    rs.dt = calloc(np, sizeof *rs.dt);
    rs.text = calloc(np, sizeof *rs.text);
    rs.len = calloc(np, sizeof(size_t));
    rs.cap = calloc(np, sizeof(size_t));
    rs.shown = calloc(np, sizeof(size_t));
    if (!ids || !outs || !plen || !nout || !rs.dt || !rs.text || !rs.len || !rs.cap || !rs.shown) {
        ft_cli_fail("run", FT_ERR_NOMEM);
        goto done;
    }
    size_t maxp = 0, sum = 0;
    for (size_t j = 0; j < np; j++) {
        if ((st = ft_tokenizer_encode(tok, lines[j], strlen(lines[j]), 1, &ids[j], &plen[j]))) {
            ft_cli_fail("encode", st);
            goto done;
        }
        if (plen[j] == 0) {
            fprintf(stderr, "flextier: run: prompt %zu encodes to no tokens\n", j + 1);
            goto done;
        }
        for (size_t k = 0; k < plen[j]; k++)
            if (ids[j][k] < 0 || ids[j][k] >= cfg->vocab) {
                fprintf(stderr, "flextier: run: tokenizer id %d is outside the model's vocab_size %d\n",
                        (int)ids[j][k], cfg->vocab);
                goto done;
            }
        if (plen[j] > maxp) maxp = plen[j];
        sum += plen[j];
        outs[j] = malloc(((size_t)max_new + 1) * sizeof(int32_t));
        if (!outs[j] || (st = ft_detok_create(tok, 1, &rs.dt[j]))) { ft_cli_fail("run", st ? st : FT_ERR_NOMEM); goto done; }
    }
    if (maxp + (size_t)max_new > (size_t)cfg->max_pos) {
        fprintf(stderr, "flextier: run: prompt of %zu tokens + %ld new tokens exceeds the model's "
                "context (max_position_embeddings = %d in %s/config.json)\n", maxp, max_new, cfg->max_pos, dir);
        goto done;
    }
    ft_ctx_params cp = {.max_batch = (int)np, .max_seq = (int)(maxp + (size_t)max_new),
                        .max_rows = (int)sum, .all_logits = dump != NULL, .threads = (unsigned)threads};
    int micro = 0;
    if (pipe.mode) {
        /* each micro-batch's prompts are one forward call of the stages */
        size_t mrows = sum;
        if (pipe.mode != FT_PIPE_MPI) {
            micro = ft_cli_pipe_micro(&pipe, np);
            mrows = 0;
            for (int mb = 0; mb < micro; mb++) {
                size_t r = 0;
                for (size_t j = np * (size_t)mb / (size_t)micro; j < np * (size_t)(mb + 1) / (size_t)micro; j++) r += plen[j];
                if (r > mrows) mrows = r;
            }
        }
        ft_pipe_stage_params base;
        int worker_done = 0;
        if ((st = ft_cli_pipe_base(&pipe, dir, &off, &lp, cp.max_batch, cp.max_seq, (int)mrows, (unsigned)threads, &base))) {
            ft_cli_fail("pipeline", st);
            goto done;
        }
        st = ft_cli_pipe_start(&pipe, &base, &off.p, &worker_done);
        if (worker_done) {
            rc = st ? ft_cli_fail("pipeline stage", st) : FT_EXIT_OK;
            pipe.mode = FT_PIPE_OFF;   /* nothing left to finish here */
            goto done;
        }
        if (st) { ft_cli_fail("pipeline", st); goto done; }
        micro = ft_cli_pipe_micro(&pipe, np);
    } else if (gpu.on) {
        if ((st = ft_cli_cuda_create(&gpu, m, cp.max_batch, cp.max_seq, cp.max_rows, cp.all_logits, cp.threads))) {
            ft_cli_fail("CUDA context", st);
            goto done;
        }
    } else {
        ft_cli_offload_ctx_params(&off, &cp);
        if ((st = ft_ctx_create(m, &cp, &c))) { ft_cli_fail("context", st); goto done; }
        if ((st = ft_cli_offload_attach(&off, m, c, &cp))) { ft_cli_fail("KV cache offloading", st); goto done; }
    }

    if (dump) {
        float *lg = malloc(sum * (size_t)cfg->vocab * sizeof(float));
        int *slots = malloc(np * sizeof(int));
        if (!lg || !slots) { free(lg); free(slots); ft_cli_fail("run", FT_ERR_NOMEM); goto done; }
        for (size_t j = 0; j < np; j++) slots[j] = (int)j;
        st = gpu.on ? ft_cuda_ctx_forward(gpu.c, np, slots, (const int32_t *const *)ids, plen, lg, 1)
                    : ft_ctx_forward(c, np, slots, (const int32_t *const *)ids, plen, lg, 1);
        if (!st) st = ft_cli_write_file(dump, lg, sum * (size_t)cfg->vocab * sizeof(float));
        free(lg);
        free(slots);
        if (st) { ft_cli_fail("dump-logits", st); goto done; }
    }

    ft_gen_params gp = {.max_new_tokens = (size_t)max_new, .ignore_eos = ignore_eos,
                        .on_token = on_token, .user = &rs};
    /* defaults from generation_config.json, then the flags */
    if (cfg->gen_do_sample) {
        gp.sampling.temperature = cfg->gen_temperature > 0 ? cfg->gen_temperature : 1.0f;
        gp.sampling.top_k = cfg->gen_top_k;
        gp.sampling.top_p = cfg->gen_top_p;
    }
    gp.sampling.repetition_penalty = cfg->gen_repetition_penalty;
    if (temp >= 0) gp.sampling.temperature = (float)temp;
    if (top_k >= 0) gp.sampling.top_k = (int)top_k;
    if (top_p >= 0) gp.sampling.top_p = (float)top_p;
    if (rep >= 0) gp.sampling.repetition_penalty = (float)rep;
    gp.sampling.seed = have_seed ? (uint64_t)seed : (uint64_t)(ft_now() * 1e6);
    rs.tok = tok;
    rs.off = &off;
    rs.stop = stop;
    rs.stream = np == 1;
    if (rs.stream) { fputs(lines[0], stdout); fflush(stdout); }
    ft_gen_stats gs;
    if (pipe.mode) {
        ft_pipe_gen_opts po = {.micro_batches = micro, .timeout_ms = 600000};
        ft_pipe_gen_stats ps;
        st = ft_pipe_generate(pipe.stage, pipe.link, np, (const int32_t *const *)ids, plen, &gp, &po, outs, nout, &ps);
        gs = ps.gen;
    } else {
        st = gpu.on ? ft_cuda_generate(gpu.c, np, (const int32_t *const *)ids, plen, &gp, outs, nout, &gs)
                    : ft_generate(c, np, (const int32_t *const *)ids, plen, &gp, outs, nout, &gs);
    }
    if (!st && rs.err) st = rs.err;
    if (st) { if (rs.stream) putchar('\n'); ft_cli_fail("generate", st); goto done; }
    for (size_t j = 0; j < np; j++) {
        char buf[256];
        size_t w = 0;
        if (!ft_detok_flush(rs.dt[j], buf, sizeof buf, &w) && w) text_append(&rs, j, buf, w);
        text_check(&rs, j, 1);
        if (!rs.stream)
            printf("=== prompt %zu ===\n%s%s\n", j + 1, lines[j], rs.text[j] ? rs.text[j] : "");
    }
    if (rs.stream) putchar('\n');
    fflush(stdout);
    size_t gen = 0;
    for (size_t j = 0; j < np; j++) gen += nout[j];
    fprintf(stderr, "prefill: %zu tokens in %.3f s (%.1f tok/s); decode: %zu tokens in %.3f s "
            "(%.1f tok/s); %zu sequences, %zu tokens generated\n",
            gs.prefill_tokens, gs.prefill_s, gs.prefill_s > 0 ? (double)gs.prefill_tokens / gs.prefill_s : 0,
            gs.decode_tokens, gs.decode_s, gs.decode_s > 0 ? (double)gs.decode_tokens / gs.decode_s : 0,
            np, gen);
    if (pipe.mode) ft_cli_pipe_describe(&pipe, micro, stderr);
    else if (gpu.on) ft_cli_cuda_report(&gpu, stderr);
    else ft_cli_offload_report(&off, gs.prefill_s, gs.decode_s, stderr);
    rc = FT_EXIT_OK;
done:
    if (pipe.mode) ft_cli_pipe_finish(&pipe);
    for (size_t j = 0; j < np; j++) {
        if (ids) free(ids[j]);
        if (outs) free(outs[j]);
        if (rs.dt) ft_detok_free(rs.dt[j]);
        if (rs.text) free(rs.text[j]);
    }
    free(ids); free(outs); free(plen); free(nout);
    free(rs.dt); free(rs.text); free(rs.len); free(rs.cap); free(rs.shown);
    free(lines);
    free(fdata);
    ft_ctx_free(c);
    ft_cli_cuda_free(&gpu);
    ft_tokenizer_free(tok);
    ft_cli_offload_free(&off);
    ft_model_free(m);
    return rc;
}
