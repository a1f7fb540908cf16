/* flextier plan: measure the machine, then choose an offloading policy
 * with the cost model (include/flextier/offload.h). */
#include "cli.h"
#include "flextier/offload.h"
#include "flextier/engine.h"
#include "flextier/store.h"
#include "flextier/model.h"
#include "offload_opts.h"

#include <cblas.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char plan_usage[] =
    "usage: flextier plan --model DIR --device-mem SIZE [--host-mem SIZE] [--disk-dir DIR]\n"
    "                     [--disk-mem SIZE] [--remote URI[,..]] [--remote-mem SIZE]\n"
    "                     [--batch N] [--fixed-batch] [--prompt-len N] [--gen-len N]\n"
    "                     [--link-bw remote=RATE,disk=RATE,host=RATE] [--codecs none,bp,q8,q4]\n"
    "                     [--cache-codecs none,q8,q4] [--policy SPEC] [--threads N] [--json]\n"
    "                     [--weights-dtype auto|f32|bf16|f16]\n"
    "\n"
    "Measures compute (GEMM flop/s), memory bandwidth, codec ratio and decode speed\n"
    "(on synthetic weights) and, when a memory node is given, its link; then searches\n"
    "placements of the weights over device/host/disk/remote (10% steps), batch\n"
    "configurations, weight codecs, and KV cache placements (device/host/disk, 25%\n"
    "steps) and codecs with the FlexGen-style cost model, and prints\n"
    "the policy with the highest predicted decode throughput. RATE: e.g. 1gbit,\n"
    "125M (bytes/s), 10gbit; a given rate replaces the measurement. The device\n"
    "memory is the budget for decoded weights, cache and activations. With --policy\n"
    "SPEC the given policy is evaluated (predicted throughput) instead of searched.\n"
    "--remote takes memory nodes (ucx://HOST:PORT) or a codec agent in front of them\n"
    "(agent://HOST:PORT[/NODE]): decoding the remote weights is then charged to one\n"
    "core of the agent's instead of this machine's cores.\n";

/* "1gbit", "10Gbit", "125M" (bytes/s), "1.5G" */
static ft_status parse_rate(const char *s, double *out)
{
    char buf[64];
    snprintf(buf, sizeof buf, "%s", s);
    size_t n = strlen(buf);
    int bits = 0;
    if (n > 3 && !strcasecmp(buf + n - 3, "bit")) { bits = 1; buf[n - 3] = '\0'; }
    /* decimal units for rates: 1gbit = 1e9 bits/s */
    char *end;
    double d = strtod(buf, &end);
    double mul = 1;
    switch (*end) {
    case 'k': case 'K': mul = 1e3; end++; break;
    case 'm': case 'M': mul = 1e6; end++; break;
    case 'g': case 'G': mul = 1e9; end++; break;
    default: break;
    }
    if (end == buf || *end || d <= 0) return ft_set_error(FT_ERR_INVALID_ARG, "bad rate '%s' (e.g. 1gbit, 125M)", s);
    *out = d * mul / (bits ? 8.0 : 1.0);
    return FT_OK;
}

static double measure_flops(int hidden, unsigned threads)
{
    (void)threads;   /* OpenBLAS uses its own thread count */
    int m = 256, k = hidden < 256 ? 256 : hidden, n = k;
    float *a = ft_malloc_aligned((size_t)m * k * 4, 64), *b = ft_malloc_aligned((size_t)k * n * 4, 64),
          *c = ft_malloc_aligned((size_t)m * n * 4, 64);
    if (!a || !b || !c) { ft_free_aligned(a); ft_free_aligned(b); ft_free_aligned(c); return 1e10; }
    for (size_t i = 0; i < (size_t)m * k; i++) a[i] = (float)(i % 7) * 0.1f;
    for (size_t i = 0; i < (size_t)k * n; i++) b[i] = (float)(i % 5) * 0.1f;
    double t[5];
    for (int r = 0; r < 5; r++) {
        double t0 = ft_now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, a, k, b, k, 0.0f, c, n);
        t[r] = ft_now() - t0;
    }
    ft_free_aligned(a); ft_free_aligned(b); ft_free_aligned(c);
    return 2.0 * m * n * k / ft_cli_median(t, 5);
}

static double measure_mem_bw(void)
{
    size_t n = 128u << 20;
    char *a = ft_malloc_aligned(n, 64), *b = ft_malloc_aligned(n, 64);
    if (!a || !b) { ft_free_aligned(a); ft_free_aligned(b); return 10e9; }
    memset(a, 1, n);
    memset(b, 2, n);
    double t[3];
    for (int r = 0; r < 3; r++) {
        double t0 = ft_now();
        memcpy(b, a, n);
        t[r] = ft_now() - t0;
    }
    ft_free_aligned(a); ft_free_aligned(b);
    return 2.0 * (double)n / ft_cli_median(t, 3);   /* read + write */
}

/* Per weight codec, what the scheduler pays to use a fetched frame on
 * one core (bytes as computed on per second): byte-plane decoding to the
 * weights' dtype, checksum verification of raw and q8/q4 frames (computed
 * on in place); and byte-plane's ratio. */
static void measure_codecs(ft_cost_inputs *in, unsigned mask)
{
    int64_t shape[2] = {1024, 4096};
    size_t n = 1024 * 4096;
    uint16_t *w = ft_malloc_aligned(n * 2, 64);
    uint16_t *out = ft_malloc_aligned(n * 2, 64);
    ft_codec_ctx *ctx = NULL;
    if (!w || !out || ft_codec_ctx_create(1, &ctx)) goto done;
    ft_cli_synth_weights(FT_BF16, n, 4096, 77, w);
    ft_tensor t;
    ft_tensor_init(&t, FT_BF16, 2, shape, w);
    for (int c = 0; c < FT_CODEC_COUNT; c++) {
        if (!(mask & (1u << c))) continue;
        ft_codec_params p;
        ft_codec_default_params(&p);
        p.codec = (ft_codec_id)c;
        if ((c == FT_CODEC_Q8 || c == FT_CODEC_Q4) &&
            ft_wmat_codec_params(c == FT_CODEC_Q8 ? 8 : 4, FT_BF16, 1024, 4096, &p))
            continue;
        size_t bound = ft_encode_bound(&p, FT_BF16, 2, shape), fs;
        uint8_t *f = ft_malloc_aligned(bound, 64);
        if (!f || ft_encode(ctx, &p, &t, f, bound, &fs)) { ft_free_aligned(f); continue; }
        ft_tensor d = {0};
        d.dtype = FT_BF16;
        d.data = out;
        double tm[3];
        for (int r = 0; r < 3; r++) {
            double t0 = ft_now();
            if (c == FT_CODEC_BYTEPLANE) ft_decode(ctx, f, fs, &d, n * 2);
            else ft_frame_verify(ctx, f, fs, NULL);
            tm[r] = ft_now() - t0;
        }
        /* as computed on: bf16 for none/bp, the frame for q8/q4 */
        double used = c == FT_CODEC_Q8 || c == FT_CODEC_Q4 ? (double)fs : (double)(n * 2);
        in->ratio[c] = c == FT_CODEC_BYTEPLANE ? (double)(n * 2) / (double)fs : 1.0;
        in->decode_bw[c] = used / ft_cli_median(tm, 3);
        ft_free_aligned(f);
    }
done:
    ft_codec_ctx_free(ctx);
    ft_free_aligned(w);
    ft_free_aligned(out);
}

/* Read bandwidth of a store: write then read a 16 MiB raw tensor. */
static double measure_store_bw(const char *uri)
{
    ft_store *s = NULL;
    ft_store_params sp;
    ft_store_default_params(&sp);
    sp.codec_threads = 1;
    if (ft_store_open(uri, &sp, &s)) return 0;
    size_t n = 16u << 20;
    int64_t shape[1] = {(int64_t)n};
    uint8_t *buf = ft_malloc_aligned(n, 64);
    double bw = 0;
    if (buf) {
        memset(buf, 7, n);
        ft_tensor t;
        ft_tensor_init(&t, FT_U8, 1, shape, buf);
        ft_codec_params cp;
        ft_codec_default_params(&cp);
        cp.codec = FT_CODEC_RAW;
        if (ft_write_tensor(s, "flextier-plan-probe", &t, &cp) == FT_OK) {
            double tm[3];
            for (int r = 0; r < 3; r++) {
                ft_tensor d = {0};
                d.dtype = FT_U8;
                d.data = buf;
                double t0 = ft_now();
                ft_read_tensor_into(s, "flextier-plan-probe", &d, n);
                tm[r] = ft_now() - t0;
            }
            bw = (double)n / ft_cli_median(tm, 3);
            ft_delete_tensor(s, "flextier-plan-probe");
        }
        ft_free_aligned(buf);
    }
    ft_store_close(s);
    return bw;
}

/* Time the engine itself on 1- and 2-layer copies of the model's config
 * (weights zero: the arithmetic costs the same): per-layer and fixed
 * (embedding, head) times of a decode step at batch 1 and `batch`, and of
 * prefill per prompt token. FlexGen fits its cost model from real runs the
 * same way. */
static ft_status measure_engine(const char *dir, uint32_t batch, uint32_t plen, unsigned threads,
                                ft_wfmt fmt, ft_cost_timing *tmg)
{
    ft_model_config cfg;
    ft_status st = ft_model_config_load(dir, &cfg);
    if (st) return st;
    if (plen > 256) plen = 256;
    double pre[3] = {0}, dec1[3] = {0}, decb[3] = {0};
    for (int nl = 1; nl <= 2; nl++) {
        cfg.n_layers = nl;
        ft_model *m = NULL;
        ft_ctx *c = NULL;
        int32_t *toks = NULL;
        if ((st = ft_model_create(&cfg, &m))) return st;
        if (fmt != FT_WF_F32) {   /* the format computed on sets the speed */
            ft_model *q = NULL;
            st = ft_model_convert(m, (int)fmt, &q);
            ft_model_free(m);
            if (st) return st;
            m = q;
        }
        ft_ctx_params cp = {0};
        cp.max_batch = (int)batch;
        cp.max_seq = (int)plen + 16;   /* 5 reps x (batch + single) decode steps */
        cp.max_rows = (int)(batch * plen);
        cp.threads = threads;
        if ((st = ft_ctx_create(m, &cp, &c))) { ft_model_free(m); return st; }
        toks = calloc((size_t)batch * plen, sizeof *toks);
        int *slots = calloc(batch, sizeof *slots);
        const int32_t **tp = calloc(batch, sizeof *tp);
        size_t *nt = calloc(batch, sizeof *nt);
        if (!toks || !slots || !tp || !nt) st = FT_ERR_NOMEM;
        for (uint32_t j = 0; st == FT_OK && j < batch; j++) {
            slots[j] = (int)j;
            tp[j] = toks + (size_t)j * plen;
            nt[j] = plen;
        }
        double t0 = ft_now();
        if (st == FT_OK) st = ft_ctx_forward(c, batch, slots, tp, nt, NULL, 0);
        pre[nl] = ft_now() - t0;
        double tb[5], t1[5];
        for (int r = 0; r < 5 && st == FT_OK; r++) {
            for (uint32_t j = 0; j < batch; j++) nt[j] = 1;
            t0 = ft_now();
            st = ft_ctx_forward(c, batch, slots, tp, nt, NULL, 0);
            tb[r] = ft_now() - t0;
            t0 = ft_now();
            if (st == FT_OK) st = ft_ctx_forward(c, 1, slots, tp, nt, NULL, 0);
            t1[r] = ft_now() - t0;
        }
        if (st == FT_OK) {
            decb[nl] = ft_cli_median(tb, 5);
            dec1[nl] = ft_cli_median(t1, 5);
        }
        free(toks); free(slots); free(tp); free(nt);
        ft_ctx_free(c);
        ft_model_free(m);
        if (st) return st;
    }
    ft_cost_timing *in = tmg;
    memset(in, 0, sizeof *in);
    in->batch[0] = 1;
    in->batch[1] = batch > 1 ? batch : 2;
    in->layer_decode_s[0] = dec1[2] - dec1[1];
    in->layer_decode_s[1] = decb[2] - decb[1];
    in->fixed_decode_s[0] = dec1[1] - in->layer_decode_s[0];
    in->fixed_decode_s[1] = decb[1] - in->layer_decode_s[1];
    double ntok = (double)batch * plen;
    in->layer_prefill_s_per_token = (pre[2] - pre[1]) / ntok;
    in->fixed_prefill_s_per_token = (pre[1] - (pre[2] - pre[1])) / ntok;
    for (int k = 0; k < 2; k++) {   /* noise can make a difference negative */
        if (in->layer_decode_s[k] < 0) in->layer_decode_s[k] = 0;
        if (in->fixed_decode_s[k] < 0) in->fixed_decode_s[k] = 0;
    }
    if (in->layer_prefill_s_per_token < 0) in->layer_prefill_s_per_token = 0;
    if (in->fixed_prefill_s_per_token < 0) in->fixed_prefill_s_per_token = 0;
    return FT_OK;
}

/* Fill the model part of the cost inputs from DIR's config + checkpoint,
 * for matrices kept in `weights` (an ft_wfmt or FT_WEIGHTS_AS_STORED). */
ft_status ft_cli_cost_model_inputs(const char *dir, int weights, ft_cost_inputs *in)
{
    ft_load_params lp;
    ft_load_params_default(&lp);
    lp.external_layers = 1;
    lp.weights = weights;
    ft_model *m = NULL;
    ft_status st = ft_model_load(dir, &lp, &m);
    if (st) return st;
    st = ft_cost_inputs_from_model(m, in);
    ft_model_free(m);
    return st;
}

/* ucx://127.x.x.x:P, ucx://localhost:P, ucx://[::1]:P: a node on this machine. */
static int uri_is_loopback(const char *uri)
{
    const char *h = strncmp(uri, "ucx://", 6) ? uri : uri + 6;
    return !strncmp(h, "127.", 4) || !strncmp(h, "localhost:", 10) || !strncmp(h, "[::1]:", 6);
}

static ft_status measure(const char *dir, ft_cost_inputs *in, const ft_policy *base, uint64_t device_mem,
                         uint32_t batch, uint32_t plen, uint32_t glen, unsigned threads, const double *given,
                         unsigned codec_mask, int quiet)
{
    in->prompt_len = plen;
    in->gen_len = glen;
    in->cap[FT_TIER_DEVICE] = device_mem ? device_mem : UINT64_MAX;
    if (!in->cap[FT_TIER_HOST]) in->cap[FT_TIER_HOST] = UINT64_MAX;
    in->cap[FT_TIER_DISK] = base->disk_uri[0] ? (in->cap[FT_TIER_DISK] ? in->cap[FT_TIER_DISK] : UINT64_MAX) : 0;
    in->cap[FT_TIER_REMOTE] = base->n_remotes ? (in->cap[FT_TIER_REMOTE] ? in->cap[FT_TIER_REMOTE] : UINT64_MAX) : 0;
    in->n_remotes = base->n_remotes;
    in->remote_local = base->n_remotes > 0;
    for (uint32_t r = 0; r < base->n_remotes; r++)
        if (!uri_is_loopback(base->remotes[r])) in->remote_local = 0;
    /* agent://: a codec agent decodes the remote tier on its own cores
     * (one unless --agent-cores says otherwise) */
    if (base->n_remotes && !strncmp(base->remotes[0], "agent://", 8) && !in->agent_cores) in->agent_cores = 1;
    if (!quiet) fprintf(stderr, "plan: measuring compute, memory and codecs...\n");
    in->flops = measure_flops((int)in->hidden, 0);
    in->mem_bw = measure_mem_bw();
    /* The engine's speed with each compute format the codecs imply:
     * none/bp compute on the weights' format, q8/q4 on their own. */
    unsigned wm = codec_mask | (1u << FT_CODEC_RAW);
    ft_status st = FT_OK;
    for (int c = 0; c < FT_CODEC_COUNT && st == FT_OK; c++) {
        if (!(wm & (1u << c)) || c == FT_CODEC_BYTEPLANE) continue;
        if (c != FT_CODEC_RAW && c != FT_CODEC_Q8 && c != FT_CODEC_Q4) continue;
        ft_wfmt f = c == FT_CODEC_Q8 ? FT_WF_Q8 : c == FT_CODEC_Q4 ? FT_WF_Q4 : in->weights_fmt;
        st = measure_engine(dir, batch ? batch : 1, plen, threads, f, &in->timing[c]);
    }
    if (st) return st;
    in->timing[FT_CODEC_BYTEPLANE] = in->timing[FT_CODEC_RAW];
    in->bw[FT_TIER_HOST] = given && given[FT_TIER_HOST] > 0 ? given[FT_TIER_HOST] : in->mem_bw / 2;
    measure_codecs(in, codec_mask | (1u << FT_CODEC_RAW));
    /* Compute and the I/O workers share the cores. */
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    in->cores = ncpu > 0 ? (uint32_t)ncpu : 1;
    in->compute_threads = threads ? threads : ft_default_threads();
    in->decode_threads = ft_default_threads();   /* what `flextier run` gives the scheduler */
    if (base->disk_uri[0])
        in->bw[FT_TIER_DISK] = given && given[FT_TIER_DISK] > 0 ? given[FT_TIER_DISK] : measure_store_bw(base->disk_uri);
    if (base->n_remotes) {
        if (given && given[FT_TIER_REMOTE] > 0) in->bw[FT_TIER_REMOTE] = given[FT_TIER_REMOTE];
        else {
            if (!quiet) fprintf(stderr, "plan: measuring the link to %s...\n", base->remotes[0]);
            in->bw[FT_TIER_REMOTE] = measure_store_bw(base->remotes[0]);
            if (in->bw[FT_TIER_REMOTE] <= 0)
                return ft_set_error(FT_ERR_NET, "cannot measure the link to %s", base->remotes[0]);
        }
    }
    return FT_OK;
}

ft_status ft_cli_plan_measure(const char *dir, ft_cost_inputs *in, const ft_policy *base, uint64_t device_mem,
                              uint32_t batch, uint32_t prompt_len, uint32_t gen_len, unsigned threads)
{
    return measure(dir, in, base, device_mem, batch, prompt_len, gen_len, threads, NULL,
                   (1u << FT_CODEC_BYTEPLANE) | (1u << FT_CODEC_Q8) | (1u << FT_CODEC_Q4), 0);
}

/* "none,bp,q4" -> a mask of 1u << ft_codec_id; cache lists allow none/q8/q4. */
static int parse_codec_list(const char *spec, int cache, unsigned *mask)
{
    char *list = strdup(spec), *save = NULL;
    if (!list) return -1;
    *mask = 0;
    for (char *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        ft_codec_id id, e;
        if (ft_codec_parse(t, &id, &e) ||
            (id != FT_CODEC_RAW && id != FT_CODEC_Q8 && id != FT_CODEC_Q4 && (cache || id != FT_CODEC_BYTEPLANE))) {
            free(list);
            return -1;
        }
        *mask |= 1u << id;
    }
    free(list);
    return *mask ? 0 : -1;
}

int ft_cmd_plan(int argc, char **argv)
{
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'}, {"device-mem", required_argument, 0, 'D'},
        {"host-mem", required_argument, 0, 'H'}, {"disk-dir", required_argument, 0, 'd'},
        {"disk-mem", required_argument, 0, 'K'}, {"remote", required_argument, 0, 'r'},
        {"remote-mem", required_argument, 0, 'R'}, {"batch", required_argument, 0, 'b'},
        {"fixed-batch", no_argument, 0, 'f'}, {"prompt-len", required_argument, 0, 'p'},
        {"gen-len", required_argument, 0, 'g'}, {"link-bw", required_argument, 0, 'l'},
        {"codecs", required_argument, 0, 'c'}, {"threads", required_argument, 0, 'T'},
        {"json", no_argument, 0, 'j'}, {"policy", required_argument, 0, 'P'},
        {"cache-codecs", required_argument, 0, 'C'}, {"weights-dtype", required_argument, 0, 'W'},
        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    const char *model = NULL, *links = NULL, *codecs = "none,bp,q8,q4", *given_policy = NULL;
    const char *cache_codecs = "none,q8,q4";
    uint64_t dev = 0, host = UINT64_MAX, disk = UINT64_MAX, remote = UINT64_MAX;
    long batch = 1, plen = 128, glen = 32, threads = 0;
    int fixed = 0, json = 0, have_dev = 0, weights = FT_WEIGHTS_AS_STORED;
    ft_policy base;
    ft_policy_default(&base);
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "m:T:h", opts, NULL)) != -1) {
        ft_status st = FT_OK;
        switch (c) {
        case 'm': model = optarg; break;
        case 'D': st = ft_cli_parse_size(optarg, &dev); have_dev = 1; break;
        case 'H': st = ft_cli_parse_size(optarg, &host); break;
        case 'K': st = ft_cli_parse_size(optarg, &disk); break;
        case 'R': st = ft_cli_parse_size(optarg, &remote); break;
        case 'd': {
            char spec[FT_URI_MAX + 8];
            snprintf(spec, sizeof spec, "disk=file:%s", optarg);
            st = ft_policy_parse(spec, &base);
            break;
        }
        case 'r': {
            char *spec = malloc(strlen(optarg) + 8);
            if (!spec) return ft_cli_fail("plan", FT_ERR_NOMEM);
            sprintf(spec, "remote=%s", optarg);
            st = ft_policy_parse(spec, &base);
            free(spec);
            break;
        }
        case 'b': st = ft_cli_parse_int(optarg, 1, 4096, &batch); break;
        case 'f': fixed = 1; break;
        case 'p': st = ft_cli_parse_int(optarg, 1, 1 << 20, &plen); break;
        case 'g': st = ft_cli_parse_int(optarg, 1, 1 << 20, &glen); break;
        case 'l': links = optarg; break;
        case 'c': codecs = optarg; break;
        case 'C': cache_codecs = optarg; break;
        case 'T': st = ft_cli_parse_int(optarg, 0, 1024, &threads); break;
        case 'j': json = 1; break;
        case 'P': given_policy = optarg; break;
        case 'W': st = ft_cli_parse_weights(optarg, &weights); break;
        case 'h': fputs(plan_usage, stdout); return FT_EXIT_OK;
        default: return ft_cli_usage_error(plan_usage, "unknown or incomplete option '%s'", argv[optind - 1]);
        }
        if (st) return ft_cli_usage_error(plan_usage, "%s", ft_last_error());
    }
    if (!model || !have_dev) return ft_cli_usage_error(plan_usage, "plan needs --model and --device-mem");
    if (optind != argc) return ft_cli_usage_error(plan_usage, "unexpected argument '%s'", argv[optind]);
    unsigned wmask = 0, cmask = 0;
    if (parse_codec_list(codecs, 0, &wmask))
        return ft_cli_usage_error(plan_usage, "--codecs: '%s': each is none, bp, q8 or q4", codecs);
    if (parse_codec_list(cache_codecs, 1, &cmask))
        return ft_cli_usage_error(plan_usage, "--cache-codecs: '%s': each is none, q8 or q4", cache_codecs);
    ft_cost_inputs in;
    memset(&in, 0, sizeof in);
    ft_status st = ft_cli_cost_model_inputs(model, weights, &in);
    if (st) return ft_cli_fail(model, st);
    double given[FT_TIER_COUNT] = {0};
    if (links) {
        char *list = strdup(links), *save = NULL;
        for (char *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            char *eq = strchr(t, '=');
            int tier = -1;
            if (eq) {
                *eq = '\0';
                for (int k = 1; k < FT_TIER_COUNT; k++) if (!strcmp(t, ft_tier_name((ft_tier)k))) tier = k;
            }
            if (tier < 0 || parse_rate(eq + 1, &given[tier])) {
                free(list);
                return ft_cli_usage_error(plan_usage, "--link-bw: expected host|disk|remote=RATE");
            }
        }
        free(list);
    }
    in.cap[FT_TIER_HOST] = host;
    in.cap[FT_TIER_DISK] = disk;
    in.cap[FT_TIER_REMOTE] = remote;
    if ((st = measure(model, &in, &base, dev, (uint32_t)batch, (uint32_t)plen, (uint32_t)glen, (unsigned)threads,
                      given, wmask | cmask, json)))
        return ft_cli_fail("plan", st);
    if (!host) in.cap[FT_TIER_HOST] = 0;
    ft_policy best;
    ft_cost_estimate e;
    if (given_policy) {
        best = base;
        best.gpu_batch_size = (uint32_t)batch;
        best.num_gpu_batches = 1;
        if ((st = ft_policy_parse(given_policy, &best)) || (st = ft_policy_validate(&best)))
            return ft_cli_usage_error(plan_usage, "--policy: %s", ft_last_error());
        ft_cost_predict(&in, &best, &e);
        if (!e.feasible && !json) fprintf(stderr, "plan: warning: the policy exceeds a tier's memory\n");
    } else if ((st = ft_plan(&in, &base, (uint32_t)batch, fixed, wmask, cmask, FT_CACHE_TIERS, &best, &e))) {
        return ft_cli_fail("plan", st);
    }
    char pol[256];
    ft_policy_format(&best, pol, sizeof pol);
    if (json) {
        printf("{\"policy\": \"%s\", \"decode_tps\": %.4f, \"prefill_tps\": %.4f, \"bottleneck\": \"%s\", "
               "\"t_layer_s\": %.6g, \"flops\": %.4g, \"mem_bw\": %.4g, \"bw\": {\"host\": %.4g, \"disk\": %.4g, "
               "\"remote\": %.4g}, \"device_bytes\": %llu}\n",
               pol, e.decode_tps, e.prefill_tps, e.bottleneck, e.t_layer_decode, in.flops, in.mem_bw,
               in.bw[1], in.bw[2], in.bw[3], (unsigned long long)e.mem[0]);
        return FT_EXIT_OK;
    }
    char b1[32];
    printf("machine:  %.1f GFLOP/s GEMM, %.1f GB/s memory", in.flops / 1e9, in.mem_bw / 1e9);
    if (base.disk_uri[0]) printf(", disk %.2f GB/s", in.bw[FT_TIER_DISK] / 1e9);
    if (base.n_remotes) printf(", remote %.3f GB/s x %u", in.bw[FT_TIER_REMOTE] / 1e9, base.n_remotes);
    printf("\ncodecs:   ");
    for (int k = 0; k < FT_CODEC_COUNT; k++)
        if (in.ratio[k] > 0)
            printf("%s %.2fx %.2f GB/s  ", k == FT_CODEC_RAW ? "none" : ft_codec_name((ft_codec_id)k), in.ratio[k],
                   in.decode_bw[k] / 1e9);
    {
        double lb = 0;
        for (uint32_t k = 0; k < in.n_tensors; k++) lb += (double)in.tensor_bytes[best.compress_weights][k];
        ft_cli_fmt_bytes(lb, b1, sizeof b1);
    }
    printf("\nmodel:    %u layers of %s (%s)\npolicy:   %s\n", in.n_layers, b1,
           best.compress_weights == FT_CODEC_Q8 ? "q8" : best.compress_weights == FT_CODEC_Q4 ? "q4"
                                                : ft_wfmt_name(in.weights_fmt), pol);
    printf("predicted: decode %.2f tok/s, prefill %.1f tok/s (bottleneck: %s)\n", e.decode_tps, e.prefill_tps,
           e.bottleneck);
    for (int k = 0; k < FT_TIER_COUNT; k++) {
        ft_cli_fmt_bytes((double)e.mem[k], b1, sizeof b1);
        if (e.mem[k]) printf("  %-7s %s\n", ft_tier_name((ft_tier)k), b1);
    }
    return FT_EXIT_OK;
}
