/* `flextier perplexity`: how well a model predicts a text, the way users
 * judge a quantized model (llama.cpp's llama-perplexity). The text is
 * tokenized once and cut into non-overlapping windows of --ctx tokens;
 * every window starts from an empty cache (with BOS when the tokenizer
 * adds one) and scores each token from the second on:
 *     ppl = exp(mean over scored tokens of -log p(token | its window so far)).
 * Windows run --batch at a time through one forward call each (their
 * logits are all wanted), or with --step N through calls of N tokens, so
 * that later tokens attend to the cache as stored (a whole-window call
 * attends to its own fresh rows: a q8/q4 or offloaded cache is only read
 * by later calls). The same formats and offloading options as
 * `flextier run` apply, so weights and KV cache formats (q8/q4 cache:
 * --policy c=0,100 --compress-cache q4) are compared on the same text. */
#include "cli.h"
#include "session_opts.h"
#include "flextier/model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char PPL_USAGE[] =
    "usage: flextier perplexity --model DIR --text FILE [--ctx N] [--batch B] [--step N]\n"
    "         [--max-windows N] [--threads N] [--json] [formats] [offloading options]\n"
    "Perplexity of the model on a text: non-overlapping windows of --ctx tokens (default\n"
    "512, at most the model's context), each token after a window's first one scored.\n"
    "Prints the perplexity with its standard error (from the per-token losses).\n"
    "--step N feeds each window N tokens per forward call (default: the whole window in\n"
    "one call), so that the KV cache is read as stored: use it to judge cache formats\n"
    "(--kv-dtype, or --policy c=0,100 --compress-cache q8|q4).\n";

/* log-softmax of one row at `tok` (in double, stable) */
static double nll(const float *row, int V, int32_t tok)
{
    float mx = row[0];
    for (int v = 1; v < V; v++) if (row[v] > mx) mx = row[v];
    double s = 0;
    for (int v = 0; v < V; v++) s += exp((double)row[v] - mx);
    return log(s) + mx - (double)row[tok];
}

int ft_cmd_perplexity(int argc, char **argv)
{
    const char *dir = NULL, *text = NULL;
    long ctx = 512, batch = 1, threads = 0, max_windows = 0, step = 0;
    int json = 0;
    ft_cli_session off;
    ft_cli_session_init(&off);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(PPL_USAGE, stdout);
            fputs(ft_cli_engine_usage, stdout);
            fputs(ft_cli_offload_usage, stdout);
            return FT_EXIT_OK;
        }
        int r = ft_cli_session_arg(&off, argc, argv, &i);
        if (r < 0) return FT_EXIT_USAGE;
        if (r) continue;
        if (!strcmp(a, "--json")) { json = 1; continue; }
        if (i + 1 >= argc) return ft_cli_usage_error(PPL_USAGE, "option %s needs a value", a);
        const char *v = argv[++i];
        long *dst = NULL, lo = 1, hi = 1 << 20;
        if (!strcmp(a, "--model")) dir = v;
        else if (!strcmp(a, "--text")) text = v;
        else if (!strcmp(a, "--ctx")) { dst = &ctx; lo = 2; }
        else if (!strcmp(a, "--batch")) { dst = &batch; hi = 4096; }
        else if (!strcmp(a, "--threads")) { dst = &threads; hi = 1024; }
        else if (!strcmp(a, "--max-windows")) { dst = &max_windows; lo = 0; }
        else if (!strcmp(a, "--step")) { dst = &step; }
        else return ft_cli_usage_error(PPL_USAGE, "unknown option %s", a);
        if (dst && ft_cli_parse_int(v, lo, hi, dst)) return ft_cli_usage_error(PPL_USAGE, "bad value for %s: %s", a, v);
    }
    if (!dir || !text) return ft_cli_usage_error(PPL_USAGE, "--model and --text are required");

    int rc = FT_EXIT_ERR;
    ft_status st;
    ft_session *s = NULL;
    uint8_t *raw = NULL;
    size_t rawn = 0, ntok = 0;
    int32_t *ids = NULL, *win = NULL;
    float *lg = NULL, *lgs = NULL;
    double *losses = NULL;
    if ((st = ft_cli_read_file(text, &raw, &rawn))) return ft_cli_fail(text, st);
    off.sp.threads = (unsigned)threads;
    ft_cli_warn_threads(threads);
    off.sp.max_seq = (uint32_t)ctx;
    if ((st = ft_cli_session_open(&off, dir, (uint32_t)batch, (uint32_t)ctx, 1, &s))) { ft_cli_fail(dir, st); goto done; }
    const ft_tokenizer *tok = ft_session_tokenizer(s);
    if (!tok) {
        ft_cli_fail(dir, ft_set_error(FT_ERR_NOT_FOUND, "%s: no tokenizer.json (or vocab.json + merges.txt)", dir));
        goto done;
    }
    /* the tokenizer's BOS is added per window below */
    if ((st = ft_tokenizer_encode(tok, (const char *)raw, rawn, 0, &ids, &ntok))) { ft_cli_fail("encode", st); goto done; }
    const ft_model_config *cfg = ft_session_config(s);
    int bos = cfg->bos_id;
    int with_bos = bos >= 0 && bos < cfg->vocab;
    if (ctx > cfg->max_pos) ctx = cfg->max_pos;
    long body = ctx - with_bos;          /* text tokens per window */
    if (body < 2) { fprintf(stderr, "flextier: perplexity: --ctx %ld is too short\n", ctx); goto done; }
    size_t nwin = ntok / (size_t)body;
    if (max_windows && nwin > (size_t)max_windows) nwin = (size_t)max_windows;
    if (nwin == 0) {
        fprintf(stderr, "flextier: perplexity: %s has %zu tokens, fewer than one window of %ld\n", text, ntok, body);
        goto done;
    }
    if ((size_t)batch > nwin) batch = (long)nwin;
    for (size_t i = 0; i < ntok; i++)
        if (ids[i] < 0 || ids[i] >= cfg->vocab) {
            fprintf(stderr, "flextier: perplexity: token id %d is outside the model's vocab_size %d\n", (int)ids[i],
                    cfg->vocab);
            goto done;
        }
    if (step <= 0 || step > ctx) step = ctx;
    lg = malloc((size_t)batch * (size_t)ctx * (size_t)cfg->vocab * sizeof(float));
    if (step < ctx && !(lgs = malloc((size_t)batch * (size_t)step * (size_t)cfg->vocab * sizeof(float)))) {
        ft_cli_fail("perplexity", FT_ERR_NOMEM);
        goto done;
    }
    win = malloc((size_t)batch * (size_t)ctx * sizeof(int32_t));
    losses = malloc(nwin * (size_t)body * sizeof(double));
    if (!lg || !win || !losses) { ft_cli_fail("perplexity", FT_ERR_NOMEM); goto done; }

    size_t scored = 0;
    double t0 = ft_now();
    int tty = isatty(2);
    for (size_t w0 = 0; w0 < nwin; w0 += (size_t)batch) {
        size_t nb = nwin - w0 < (size_t)batch ? nwin - w0 : (size_t)batch;
        int slots[4096];
        const int32_t *tp[4096];
        size_t nt[4096];
        for (size_t j = 0; j < nb; j++) {
            int32_t *t = win + j * (size_t)ctx;
            if (with_bos) t[0] = bos;
            memcpy(t + with_bos, ids + (w0 + j) * (size_t)body, (size_t)body * sizeof(int32_t));
            slots[j] = (int)j;
        }
        ft_session_reset(s);
        /* calls of `step` tokens per window: call c's rows are sequence-major */
        for (long p0 = 0; p0 < ctx; p0 += step) {
            size_t n = (size_t)(ctx - p0 < step ? ctx - p0 : step);
            for (size_t j = 0; j < nb; j++) {
                tp[j] = win + j * (size_t)ctx + (size_t)p0;
                nt[j] = n;
            }
            float *out = step < ctx ? lgs : lg;
            if ((st = ft_session_forward(s, nb, slots, tp, nt, out, 1))) { ft_cli_fail("forward", st); goto done; }
            if (out == lgs)
                for (size_t j = 0; j < nb; j++)
                    memcpy(lg + (j * (size_t)ctx + (size_t)p0) * (size_t)cfg->vocab,
                           lgs + j * n * (size_t)cfg->vocab, n * (size_t)cfg->vocab * sizeof(float));
        }
        for (size_t j = 0; j < nb; j++) {
            const int32_t *t = win + j * (size_t)ctx;
            /* position p predicts t[p+1]; score the text's tokens from its second on */
            for (long p = with_bos; p + 1 < ctx; p++)
                losses[scored++] = nll(lg + (j * (size_t)ctx + (size_t)p) * (size_t)cfg->vocab, cfg->vocab, t[p + 1]);
        }
        if (!json && (tty || w0 + nb == nwin)) {
            double sum = 0;
            for (size_t k = 0; k < scored; k++) sum += losses[k];
            fprintf(stderr, "%swindow %zu/%zu: perplexity so far %.4f", tty ? "\r" : "", w0 + nb, nwin,
                    exp(sum / (double)scored));
            if (w0 + nb == nwin) fputc('\n', stderr);
        }
    }
    double el = ft_now() - t0, mean = 0, var = 0;
    ft_session_stats ss;
    ft_session_get_stats(s, &ss);
    for (size_t k = 0; k < scored; k++) mean += losses[k];
    mean /= (double)scored;
    for (size_t k = 0; k < scored; k++) var += (losses[k] - mean) * (losses[k] - mean);
    var /= (double)(scored > 1 ? scored - 1 : 1);
    double ppl = exp(mean), se = ppl * sqrt(var / (double)scored);   /* delta method */
    if (json) {
        printf("{\"model\":\"%s\",\"text\":\"%s\",\"weights_format\":\"%s\",\"kv_dtype\":\"%s\",\"ctx\":%ld,"
               "\"windows\":%zu,\"tokens_scored\":%zu,\"perplexity\":%.6f,\"stderr\":%.6f,\"mean_nll\":%.6f,"
               "\"seconds\":%.3f",
               dir, text, ft_wfmt_name(ft_model_weights_format(ft_session_model(s))), ft_dtype_name(ss.kv_dtype), ctx, nwin,
               scored, ppl,
               se, mean, el);
        if (off.enabled) {
            char pol[256];
            ft_policy_format(ft_session_policy(s, NULL), pol, sizeof pol);
            printf(",\"policy\":\"%s\"", pol);
        }
        printf("}\n");
    } else {
        printf("perplexity %.4f +/- %.4f over %zu tokens (%zu windows of %ld; weights %s, KV cache %s%s%s), %.1f s\n",
               ppl, se, scored, nwin, ctx, ft_wfmt_name(ft_model_weights_format(ft_session_model(s))),
               ft_dtype_name(ss.kv_dtype), ss.has_kv ? ", offloaded cache " : "",
               ss.has_kv ? ft_codec_name(ft_session_policy(s, NULL)->compress_cache) : "", el);
    }
    rc = FT_EXIT_OK;
done:
    ft_free_aligned(raw);
    free(ids);
    free(win);
    free(lg);
    free(lgs);
    free(losses);
    ft_session_close(s);
    return rc;
}
