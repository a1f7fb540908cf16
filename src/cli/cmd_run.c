/* flextier run | bench run: the inference engine's commands (gen-model: gen_model.c). */
#include "cli.h"
#include "session_opts.h"
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
    "         [--threads N] [--seed N] [--warmup N] [--json] [--device cpu|cuda] [offloading options]\n"
    "FlexGen's benchmark shape: B random prompts of P tokens, G new tokens each (greedy,\n"
    "EOS ignored). Reports prefill and decode tokens/s and peak RSS vs weight bytes;\n"
    "with --policy, the offloading metrics too.\n"
    "  --warmup N   N untimed runs of the same prompts with 2 new tokens first (default:\n"
    "               1 with --device cuda, where the first calls load the kernels and\n"
    "               pick the GEMM algorithms; 0 on the CPU)\n";

int ft_bench_run(int argc, char **argv)
{
    const char *dir = NULL;
    long batch = 1, plen = 0, glen = 0, threads = 0, seed = 1, warmup = -1;
    int json = 0;
    ft_cli_session o;
    ft_cli_session_init(&o);
    o.stats = 1;
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
        int r = ft_cli_session_arg(&o, argc, argv, &i);
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
        else if (opt_is(a, "--warmup")) { dst = &warmup; lo = 0; hi = 100; }
        else return ft_cli_usage_error(BENCH_USAGE, "unknown option %s", a);
        if (dst && ft_cli_parse_int(v, lo, hi, dst))
            return ft_cli_usage_error(BENCH_USAGE, "bad value for %s: %s", a, v);
    }
    if (!dir || !plen || !glen)
        return ft_cli_usage_error(BENCH_USAGE, "--model, --prompt-len and --gen-len are required");
    if (ft_cli_pipe_stray(&pipe)) return ft_cli_usage_error(BENCH_USAGE, "pipeline options need --pipeline");
    ft_session *s = NULL;
    int32_t *prompts = NULL, *outs = NULL;
    const int32_t **pp = NULL;
    int32_t **op = NULL;
    size_t *pl = NULL, *no = NULL;
    int rc = FT_EXIT_ERR;
    double t0 = ft_now();
    o.sp.threads = (unsigned)threads;
    ft_cli_warn_threads(threads);
    o.sp.max_seq = (uint32_t)(plen + glen);
    ft_status st;
    int micro = 0;
    if (pipe.mode) {
        /* the stages are sized for a micro-batch's prompts in one call */
        int worker_done = 0;
        if ((st = ft_cli_pipe_open(&pipe, &o, dir, (size_t)batch, (size_t)(batch * plen), (size_t)plen,
                                   (size_t)glen, &micro, &worker_done, &s)))
            return worker_done ? ft_cli_fail("pipeline stage", st) : ft_cli_fail("pipeline", st);
        if (worker_done) return FT_EXIT_OK;   /* an MPI rank that ran a stage */
    } else if ((st = ft_cli_session_open(&o, dir, (uint32_t)batch, (uint32_t)plen, (uint32_t)glen, &s))) {
        return ft_cli_fail(dir, st);
    }
    double load_s = ft_now() - t0;
    const ft_model_config *cfg = ft_session_config(s);
    int gpu = o.sp.device == FT_DEVICE_CUDA;
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
    if (warmup < 0) warmup = gpu && !pipe.mode ? 1 : 0;
    for (long w = 0; w < warmup; w++) {
        ft_gen_params wp = {.max_new_tokens = glen < 2 ? (size_t)glen : 2, .ignore_eos = 1};
        ft_gen_stats ws;
        if ((st = ft_session_generate(s, (size_t)batch, pp, pl, &wp, op, no, &ws))) {
            ft_cli_fail("warm-up", st);
            goto done;
        }
    }
    ft_gen_params gp = {.max_new_tokens = (size_t)glen, .ignore_eos = 1};
    ft_gen_stats gs;
    /* a prediction (auto, --predict) also at the load this run met: the
     * share of a core a thread got just before and after it */
    double pred_plan = 0, pred_run = 0, share_run = 0;
    ft_session_policy(s, &pred_plan);
    if ((st = ft_session_generate(s, (size_t)batch, pp, pl, &gp, op, no, &gs))) { ft_cli_fail("generate", st); goto done; }
    if (pred_plan > 0 && !gpu && gs.decode_s > 0) {
        /* the share of a core the compute thread got in decode: its CPU
         * time over that plus the time it waited for a core while runnable
         * (schedstat); else over the time it was not waiting for the tiers,
         * which counted its own blocking reads (the O_DIRECT embedding rows
         * of a budget run: a share of 0.25 on a machine at load 2) as load */
        ft_session_stats ps;
        ft_session_get_stats(s, &ps);
        double wait = (ps.has_weights ? ps.weights.wait_s - ps.weights_at_decode.wait_s : 0) +
                      (ps.has_kv ? ps.kv.wait_s - ps.kv_at_decode.wait_s : 0);
        double busy = gs.decode_s - wait;
        if (gs.decode_thread_runq_s >= 0 && gs.decode_thread_cpu_s > 0)
            share_run = fmin(1.0, fmax(0.02, gs.decode_thread_cpu_s / (gs.decode_thread_cpu_s + gs.decode_thread_runq_s)));
        else if (busy > 0.05 * gs.decode_s) share_run = fmin(1.0, fmax(0.02, gs.decode_thread_cpu_s / busy));
        if (share_run > 0 && ft_session_predict_at(s, share_run, &pred_run)) pred_run = 0;
    }
    if (pipe.mode) ft_cli_pipe_end(&pipe);   /* the workers finish; MPI: every stage's peak RSS */
    ft_session_stats ss;
    ft_session_get_stats(s, &ss);
    double pre_tps = gs.prefill_s > 0 ? (double)gs.prefill_tokens / gs.prefill_s : 0;
    double dec_tps = gs.decode_s > 0 ? (double)gs.decode_tokens / gs.decode_s : 0;
    double gen_total = (double)(batch * glen);
    double e2e = gen_total / (gs.prefill_s + gs.decode_s);
    double rss = peak_rss_bytes(), wbytes = (double)ss.weight_bytes, kvb = (double)ss.kv_bytes;
    const char *wfmt = ft_wfmt_name(ft_model_weights_format(ft_session_model(s)));
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
               gs.decode_cpu_s > 0 ? (double)gs.decode_tokens / gs.decode_cpu_s : 0, wbytes, wfmt, kvb,
               ft_dtype_name(ss.kv_dtype), rss, gpu ? "cuda" : "cpu");
        if (pred_run > 0) printf(",\"predicted_run_tok_s\":%.3f,\"cpu_share_run\":%.3f", pred_run, share_run);
        if (gpu) ft_cli_cuda_report_json(s, stdout);
        if (pipe.mode) ft_cli_pipe_report_json(&pipe, micro, rss, stdout);
        if (o.enabled) {
            printf(",\"offload\":");
            ft_cli_session_report_json(&o, s, gs.prefill_s, gs.decode_s, stdout);
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
        if (pred_run > 0)
            printf("  predicted  %8.2f tok/s decode when planned, %.2f at this run's load (a thread got %.2f of a "
                   "core): predicted / measured %.2f\n", pred_plan, pred_run, share_run, pred_run / dec_tps);
        if (gpu) {
            ft_cli_cuda_report(s, stdout);
        } else if (pipe.mode) {
            ft_cli_pipe_describe(&pipe, micro, stdout);
            printf("  memory     peak RSS of this stage (the last) %s", b3);
            if (pipe.mode == FT_PIPE_MPI)
                for (int i = 0; i < pipe.n_stages; i++)
                    printf("%s%.1f MiB", i ? ", " : "; every stage: ", pipe.rss[i] / 1048576.0);
            printf("\n");
            ft_cli_session_report(&o, s, gs.prefill_s, gs.decode_s, stdout);
        } else {
            printf("  memory     weights %s (%s), KV cache %s (%s), peak RSS %s (%.2fx weights + KV cache)\n",
                   b1, wfmt, b2, ft_dtype_name(ss.kv_dtype), b3, rss / (wbytes + kvb));
            ft_cli_session_report(&o, s, gs.prefill_s, gs.decode_s, stdout);
        }
    }
    rc = FT_EXIT_OK;
done:
    free(prompts); free(outs); free(pp); free(op); free(pl); free(no);
    ft_session_close(s);
    if (pipe.mode) ft_cli_pipe_finish(&pipe);
    return rc;
}
/* ------------------------------------------------------------------ run */

static const char RUN_USAGE[] =
    "usage: flextier run --model DIR (--prompt TEXT | --prompt-file FILE) [--max-new-tokens N]\n"
    "         [--temperature T] [--top-k K] [--top-p P] [--repetition-penalty R] [--seed S]\n"
    "         [--stop STR] [--ignore-eos] [--threads N] [--dump-logits FILE] [--device cpu|cuda]\n"
    "         [--strict] [offloading options]\n"
    "         [--lora DIR[:SCALE] ...] [--prompt-ids ID,ID,...] [--ids]\n"
    "Generates from a Hugging Face model directory (config.json, *.safetensors,\n"
    "tokenizer.json or vocab.json + merges.txt). One --prompt streams its text; a --prompt-file\n"
    "holds one prompt per\n"
    "line, run as one batch, printed per prompt. Sampling defaults come from the model's\n"
    "generation_config.json; --temperature 0 is greedy. --dump-logits writes the f32\n"
    "logits of every prompt position (prompts in order, vocab floats per row).\n"
    "Prefill and decode tokens/s go to stderr at the end. --strict: a config.json /\n"
    "generation_config.json key or tokenizer field flextier does not know is an error\n"
    "(default: a warning naming it). --lora applies PEFT LoRA adapters (see adapters below).\n"
    "--prompt-ids takes one prompt as token ids; --ids prints the new token ids instead of\n"
    "text (both: to compare with transformers on the same ids).\n";

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

/* A single prompt streams its text to stdout as it is generated. */
static int stream_text(void *user, size_t seq, const char *text, size_t len)
{
    (void)user;
    (void)seq;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return 0;
}

/* --ids / --prompt-ids: the prompts as token ids (given, or encoded with
 * the tokenizer's special tokens), one line of new ids per prompt. */
static ft_status run_ids(ft_session *s, const char *const *lines, size_t np, int given, const ft_gen_params *gp)
{
    int32_t **ids = calloc(np, sizeof *ids), **out = calloc(np, sizeof *out);
    size_t *len = calloc(np, sizeof *len), *nout = calloc(np, sizeof *nout);
    ft_status st = ids && out && len && nout ? FT_OK : ft_set_error(FT_ERR_NOMEM, "run: allocation");
    int vocab = ft_session_config(s)->vocab;
    for (size_t j = 0; j < np && !st; j++) {
        if (given) {
            const char *q = lines[j];
            size_t cap = strlen(q) / 2 + 1;
            if (!(ids[j] = malloc(cap * sizeof(int32_t)))) st = ft_set_error(FT_ERR_NOMEM, "run: allocation");
            while (!st && *q && len[j] < cap) {
                char *e;
                long id = strtol(q, &e, 10);
                if (e == q || id < 0 || id >= vocab || (*e && *e != ','))
                    st = ft_set_error(FT_ERR_INVALID_ARG, "--prompt-ids: '%s': expected ids in [0, %d) separated by "
                                      "commas", lines[j], vocab);
                else ids[j][len[j]++] = (int32_t)id;
                q = *e ? e + 1 : e;
            }
        } else {
            st = ft_tokenizer_encode(ft_session_tokenizer(s), lines[j], strlen(lines[j]), 1, &ids[j], &len[j]);
        }
        if (!st && !len[j]) st = ft_set_error(FT_ERR_INVALID_ARG, "prompt %zu has no tokens", j + 1);
        if (!st && !(out[j] = malloc((gp->max_new_tokens + 1) * sizeof(int32_t))))
            st = ft_set_error(FT_ERR_NOMEM, "run: allocation");
    }
    ft_gen_stats gs;
    if (!st) st = ft_session_generate(s, np, (const int32_t *const *)ids, len, gp, out, nout, &gs);
    for (size_t j = 0; j < np && !st; j++) {
        for (size_t i = 0; i < nout[j]; i++) printf("%s%d", i ? " " : "", (int)out[j][i]);
        printf("\n");
    }
    for (size_t j = 0; j < np; j++) {
        if (ids) free(ids[j]);
        if (out) free(out[j]);
    }
    free(ids); free(out); free(len); free(nout);
    return st;
}

int ft_cmd_run(int argc, char **argv)
{
    const char *dir = NULL, *prompt = NULL, *pfile = NULL, *stop = NULL, *dump = NULL, *pids = NULL;
    int print_ids = 0;
    long max_new = 64, top_k = -1, threads = 0, seed = 0;
    double temp = -1, top_p = -1, rep = -1;
    int ignore_eos = 0, have_seed = 0;
    ft_cli_session o;
    ft_cli_session_init(&o);
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
        int r = ft_cli_session_arg(&o, argc, argv, &i);
        if (!r) r = ft_cli_pipe_arg(&pipe, argc, argv, &i);
        if (r < 0) return FT_EXIT_USAGE;
        if (r) continue;
        if (opt_is(a, "--ignore-eos")) { ignore_eos = 1; continue; }
        if (opt_is(a, "--ids")) { print_ids = 1; continue; }
        if (i + 1 >= argc) return ft_cli_usage_error(RUN_USAGE, "option %s needs a value", a);
        const char *v = argv[++i];
        char *endp = NULL;
        if (opt_is(a, "--model")) dir = v;
        else if (opt_is(a, "--prompt")) prompt = v;
        else if (opt_is(a, "--prompt-file")) pfile = v;
        else if (opt_is(a, "--prompt-ids")) pids = v;
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
    if (!!prompt + !!pfile + !!pids != 1)
        return ft_cli_usage_error(RUN_USAGE, "give exactly one of --prompt, --prompt-file and --prompt-ids");
    if ((pids || print_ids) && (pipe.mode || dump || stop))
        return ft_cli_usage_error(RUN_USAGE, "--prompt-ids / --ids go without --pipeline, --dump-logits and --stop");
    if (pids) print_ids = 1;
    if (pipe.mode && dump)
        return ft_cli_usage_error(RUN_USAGE, "--pipeline has no --dump-logits (the driver holds the last layers only)");
    if (ft_cli_pipe_stray(&pipe)) return ft_cli_usage_error(RUN_USAGE, "pipeline options need --pipeline");

    int rc = FT_EXIT_ERR;
    ft_status st;
    ft_session *s = NULL;
    uint8_t *fdata = NULL;
    size_t fsize = 0, np = 0;
    char **lines = NULL, **texts = NULL;
    if (o.sp.strict) setenv("FLEXTIER_STRICT", "1", 1);   /* as the test suite: for every tokenizer loaded */
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
        lines[0] = (char *)(prompt ? prompt : pids);
        np = 1;
    }
    o.sp.threads = (unsigned)threads;
    ft_cli_warn_threads(threads);
    int micro = 0;
    if (pipe.mode) {
        /* the stages are sized for the prompts as the session will encode them */
        size_t maxp = 0, sum = 0;
        if ((st = ft_cli_pipe_prompt_tokens(dir, o.sp.strict, (const char *const *)lines, np, &maxp, &sum))) {
            ft_cli_fail("tokenizer", st);
            goto done;
        }
        int worker_done = 0;
        st = ft_cli_pipe_open(&pipe, &o, dir, np, sum, maxp, (size_t)max_new, &micro, &worker_done, &s);
        if (worker_done) {   /* an MPI rank that ran a stage (and finalized MPI) */
            rc = st ? ft_cli_fail("pipeline stage", st) : FT_EXIT_OK;
            pipe.mode = FT_PIPE_OFF;
            goto done;
        }
        if (st) { ft_cli_fail("pipeline", st); goto done; }
    } else {
        size_t longest = 0;   /* prompt length estimate for --policy auto */
        for (size_t j = 0; j < np; j++) if (strlen(lines[j]) > longest) longest = strlen(lines[j]);
        if ((st = ft_cli_session_open(&o, dir, (uint32_t)np, (uint32_t)(longest / 3 + 1), (uint32_t)max_new, &s))) {
            ft_cli_fail(dir, st);
            goto done;
        }
    }
    if (!pids && !ft_session_tokenizer(s)) {
        ft_status ts = ft_session_generate_text(s, 1, (const char *const *)lines, &(ft_text_params){0}, NULL, NULL);
        ft_cli_fail("tokenizer", ts);
        goto done;
    }
    const ft_model_config *cfg = ft_session_config(s);

    if (dump) {
        /* the f32 logits of every prompt position */
        const ft_tokenizer *tok = ft_session_tokenizer(s);
        int32_t **ids = calloc(np, sizeof *ids);
        size_t *plen = calloc(np, sizeof *plen), sum = 0;
        int *slots = calloc(np, sizeof *slots);
        float *lg = NULL;
        st = ids && plen && slots ? FT_OK : ft_set_error(FT_ERR_NOMEM, "dump-logits");
        for (size_t j = 0; j < np && !st; j++) {
            st = ft_tokenizer_encode(tok, lines[j], strlen(lines[j]), 1, &ids[j], &plen[j]);
            slots[j] = (int)j;
            sum += plen[j];
            if (!st && !plen[j]) st = ft_set_error(FT_ERR_INVALID_ARG, "prompt %zu encodes to no tokens", j + 1);
        }
        if (!st && !(lg = malloc(sum * (size_t)cfg->vocab * sizeof(float)))) st = ft_set_error(FT_ERR_NOMEM, "logits");
        if (!st) st = ft_session_forward(s, np, slots, (const int32_t *const *)ids, plen, lg, 1);
        if (!st) st = ft_cli_write_file(dump, lg, sum * (size_t)cfg->vocab * sizeof(float));
        for (size_t j = 0; ids && j < np; j++) free(ids[j]);
        free(ids); free(plen); free(slots); free(lg);
        ft_session_reset(s);
        if (st) { ft_cli_fail("dump-logits", st); goto done; }
    }

    ft_text_params tp;
    memset(&tp, 0, sizeof tp);
    tp.gen.max_new_tokens = (size_t)max_new;
    tp.gen.ignore_eos = ignore_eos;
    /* defaults from generation_config.json, then the flags */
    ft_session_default_sampling(s, &tp.gen.sampling);
    if (temp >= 0) tp.gen.sampling.temperature = (float)temp;
    if (top_k >= 0) tp.gen.sampling.top_k = (int)top_k;
    if (top_p >= 0) tp.gen.sampling.top_p = (float)top_p;
    if (rep >= 0) tp.gen.sampling.repetition_penalty = (float)rep;
    tp.gen.sampling.seed = have_seed ? (uint64_t)seed : (uint64_t)(ft_now() * 1e6);
    tp.stop = stop;
    if (print_ids) {
        if ((st = run_ids(s, (const char *const *)lines, np, pids != NULL, &tp.gen))) {
            ft_cli_fail("generate", st);
            goto done;
        }
        rc = FT_EXIT_OK;
        goto done;
    }
    int stream = np == 1;
    if (stream) {
        /* a prompt that cannot be tokenized fails before it is echoed */
        int32_t *ids = NULL;
        size_t nids = 0;
        st = ft_tokenizer_encode(ft_session_tokenizer(s), lines[0], strlen(lines[0]), 1, &ids, &nids);
        free(ids);
        if (st) { ft_cli_fail("encode", st); goto done; }
        tp.on_text = stream_text;
        fputs(lines[0], stdout);
        fflush(stdout);
    }
    texts = calloc(np, sizeof *texts);
    if (!texts) { ft_cli_fail("run", FT_ERR_NOMEM); goto done; }
    ft_gen_stats gs;
    st = ft_session_generate_text(s, np, (const char *const *)lines, &tp, texts, &gs);
    if (st) { if (stream) putchar('\n'); ft_cli_fail("generate", st); goto done; }
    if (stream) putchar('\n');
    else
        for (size_t j = 0; j < np; j++) printf("=== prompt %zu ===\n%s%s\n", j + 1, lines[j], texts[j]);
    fflush(stdout);
    unsigned nthreads = threads ? (unsigned)threads : ft_default_threads();
    fprintf(stderr, "prefill: %zu tokens in %.3f s (%.1f tok/s); decode: %zu tokens in %.3f s "
            "(%.1f tok/s); %zu sequences, %zu tokens generated; %u compute thread%s\n",
            gs.prefill_tokens, gs.prefill_s, gs.prefill_s > 0 ? (double)gs.prefill_tokens / gs.prefill_s : 0,
            gs.decode_tokens, gs.decode_s, gs.decode_s > 0 ? (double)gs.decode_tokens / gs.decode_s : 0,
            np, (max_new > 0 ? np : 0) + gs.decode_tokens, nthreads, nthreads == 1 ? "" : "s");
    if (o.sp.device == FT_DEVICE_CUDA) ft_cli_cuda_report(s, stderr);
    else ft_cli_session_report(&o, s, gs.prefill_s, gs.decode_s, stderr);
    if (pipe.mode) ft_cli_pipe_describe(&pipe, micro, stderr);
    rc = FT_EXIT_OK;
done:
    for (size_t j = 0; texts && j < np; j++) free(texts[j]);
    free(texts);
    free(lines);
    free(fdata);
    ft_session_close(s);
    if (pipe.mode) ft_cli_pipe_finish(&pipe);
    return rc;
}
