/* Offloading options shared by `flextier run` and `flextier bench run`:
 * policy, tiers, compression, device budget; loading the model with
 * external layers, the scheduler as the layer hook, and the end-of-run
 * metrics (bytes per tier, I/O wait, overlap efficiency). */
#include "cli.h"
#include "offload_opts.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char ft_cli_offload_usage[] =
    "offloading (weights streamed through tiers while computing):\n"
    "  --policy SPEC|auto     e.g. 'w=0,20,30,50 c=0,100' (weights, KV cache: device,host,\n"
    "                         disk,remote %%); auto: plan it\n"
    "  --remote URI[,URI..]   memory nodes (ucx://HOST:PORT, or agent://HOST:PORT[/NODE]\n"
    "                         through a codec agent) for the remote tier\n"
    "  --disk-dir DIR         directory for the disk tier\n"
    "  --compress-weights C   none, bp (lossless), q8, q4 (FlexGen group-wise)\n"
    "  --compress-cache C     none, q8, q4: the offloaded KV cache, per token along head_dim\n"
    "  --device-mem SIZE      budget for decoded weights and the device share of the cache\n"
    "  --token-file FILE      shared secret for the memory nodes\n"
    "  --replicas N           every remote tensor on N of the nodes: a node that fails costs\n"
    "                         a retry on a replica, and is filled again when it is back\n"
    "  --failover-timeout MS  with replicas: give up on a node whose link moved nothing for\n"
    "                         this long (default 1000; a killed node is noticed at once)\n"
    "  --offload-stats        print bytes per tier, I/O wait and overlap efficiency\n";

const char ft_cli_engine_usage[] =
    "formats:\n"
    "  --weights-dtype F      what the matrices are kept and computed in: auto (the\n"
    "                         checkpoint's dtype, default), f32, bf16, f16, q8, q4\n"
    "                         (q8/q4: group-quantized at load; embeddings and the LM head\n"
    "                         stay bf16)\n"
    "  --kv-dtype D           the KV cache in memory: bf16 (default), f16, f32\n";

ft_status ft_cli_parse_weights(const char *s, int *out)
{
    static const char *const names[] = {"f32", "bf16", "f16", "q8", "q4"};
    if (!strcmp(s, "auto")) { *out = FT_WEIGHTS_AS_STORED; return FT_OK; }
    for (int f = 0; f < 5; f++)
        if (!strcmp(s, names[f])) { *out = f; return FT_OK; }
    return ft_set_error(FT_ERR_INVALID_ARG, "'%s': expected auto, f32, bf16, f16, q8 or q4", s);
}

static int take(int argc, char **argv, int *i, const char **val)
{
    if (*i + 1 >= argc) {
        fprintf(stderr, "flextier: %s needs a value\n", argv[*i]);
        return -1;
    }
    *val = argv[++*i];
    return 1;
}

void ft_cli_offload_init(ft_cli_offload *o)
{
    memset(o, 0, sizeof *o);
    ft_offload_default_params(&o->p);
    o->weights = FT_WEIGHTS_AS_STORED;
    o->kv_dtype = -1;
    /* streamed frames are verified/decoded on every core (compute waits
     * for them only when the I/O is the bottleneck) */
    o->p.decode_threads = ft_default_threads();
}

ft_status ft_cli_engine_formats(ft_cli_offload *o, int cuda, ft_load_params *lp)
{
    ft_codec_id cw = o->p.policy.compress_weights;
    int cwq = o->enabled && (cw == FT_CODEC_Q8 || cw == FT_CODEC_Q4);
    if (cuda) {
        /* the CUDA backend packs its own device formats from f32 weights */
        if (o->weights_given && o->weights != FT_WF_F32)
            return ft_set_error(FT_ERR_UNSUPPORTED, "--weights-dtype %s: the CUDA backend converts the "
                                "weights itself (leave --weights-dtype out)", ft_wfmt_name((ft_wfmt)o->weights));
        lp->weights = FT_WF_F32;
        return FT_OK;
    }
    if (cwq) {
        int q = cw == FT_CODEC_Q8 ? FT_WF_Q8 : FT_WF_Q4;
        if (o->weights_given && o->weights != q && o->weights != FT_WEIGHTS_AS_STORED)
            return ft_set_error(FT_ERR_INVALID_ARG, "--compress-weights %s keeps the matrices as %s: it conflicts "
                                "with --weights-dtype %s", ft_codec_name(cw), ft_wfmt_name((ft_wfmt)q),
                                ft_wfmt_name((ft_wfmt)o->weights));
        o->weights = q;
    } else if (o->enabled && cw == FT_CODEC_BYTEPLANE &&
               (o->weights == FT_WF_Q8 || o->weights == FT_WF_Q4)) {
        return ft_set_error(FT_ERR_INVALID_ARG, "--compress-weights bp (lossless) of %s weights: use "
                            "--compress-weights %s or none", ft_wfmt_name((ft_wfmt)o->weights),
                            ft_wfmt_name((ft_wfmt)o->weights));
    }
    lp->weights = o->weights;
    return FT_OK;
}

int ft_cli_offload_arg(ft_cli_offload *o, int argc, char **argv, int *i)
{
    const char *a = argv[*i], *v = NULL;
    char spec[FT_URI_MAX * FT_MAX_REMOTES + 16];
    int r;
    if (!strcmp(a, "--policy")) {
        if ((r = take(argc, argv, i, &v)) < 0) return r;
        o->enabled = 1;
        if (!strcmp(v, "auto")) { o->auto_policy = 1; return 1; }
        if (ft_policy_parse(v, &o->p.policy)) goto bad;
        o->have_policy = 1;
        return 1;
    }
    if (!strcmp(a, "--remote")) {
        if ((r = take(argc, argv, i, &v)) < 0) return r;
        snprintf(spec, sizeof spec, "remote=%s", v);
        if (ft_policy_parse(spec, &o->p.policy)) goto bad;
        return 1;
    }
    if (!strcmp(a, "--disk-dir")) {
        if ((r = take(argc, argv, i, &v)) < 0) return r;
        snprintf(spec, sizeof spec, "disk=file:%s", v);
        if (ft_policy_parse(spec, &o->p.policy)) goto bad;
        return 1;
    }
    if (!strcmp(a, "--compress-weights")) {
        if ((r = take(argc, argv, i, &v)) < 0) return r;
        snprintf(spec, sizeof spec, "cw=%s", v);
        if (ft_policy_parse(spec, &o->p.policy)) goto bad;
        o->codec_given = 1;
        return 1;
    }
    if (!strcmp(a, "--compress-cache")) {
        if ((r = take(argc, argv, i, &v)) < 0) return r;
        snprintf(spec, sizeof spec, "cc=%s", v);
        if (ft_policy_parse(spec, &o->p.policy)) goto bad;
        o->cache_codec_given = 1;
        return 1;
    }
    if (!strcmp(a, "--device-mem")) {
        if ((r = take(argc, argv, i, &v)) < 0) return r;
        if (ft_cli_parse_size(v, &o->p.device_budget)) goto bad;
        return 1;
    }
    if (!strcmp(a, "--token-file")) {
        if ((r = take(argc, argv, i, &v)) < 0) return r;
        o->p.token_file = v;
        return 1;
    }
    if (!strcmp(a, "--offload-stats")) { o->stats = 1; return 1; }
    if (!strcmp(a, "--replicas")) {
        if ((r = take(argc, argv, i, &v)) < 0) return r;
        snprintf(spec, sizeof spec, "rep=%s", v);
        if (ft_policy_parse(spec, &o->p.policy)) goto bad;
        return 1;
    }
    if (!strcmp(a, "--failover-timeout")) {
        long ms;
        if ((r = take(argc, argv, i, &v)) < 0) return r;
        if (ft_cli_parse_int(v, 10, 3600000, &ms)) goto bad;
        o->p.failover_ms = (unsigned)ms;
        return 1;
    }
    if (!strcmp(a, "--weights-dtype")) {
        if ((r = take(argc, argv, i, &v)) < 0) return r;
        if (ft_cli_parse_weights(v, &o->weights)) goto bad;
        o->weights_given = 1;
        return 1;
    }
    if (!strcmp(a, "--kv-dtype")) {
        if ((r = take(argc, argv, i, &v)) < 0) return r;
        if (!strcmp(v, "f32")) o->kv_dtype = FT_F32;
        else if (!strcmp(v, "bf16")) o->kv_dtype = FT_BF16;
        else if (!strcmp(v, "f16")) o->kv_dtype = FT_F16;
        else { ft_set_error(FT_ERR_INVALID_ARG, "'%s': expected bf16, f16 or f32", v); goto bad; }
        return 1;
    }
    return 0;
bad:
    fprintf(stderr, "flextier: %s: %s\n", a, ft_last_error());
    return -1;
}

static void upload_progress(void *user, uint64_t done, uint64_t total)
{
    double *last = user;
    double now = ft_now();
    int tty = isatty(2);
    /* On a terminal redraw a progress line; elsewhere (logs) print once. */
    if (done < total && (!tty || now - *last < 0.5)) return;
    *last = now;
    fprintf(stderr, "%splacing weights in tiers: %3.0f%% (%.1f / %.1f MiB)", tty ? "\r" : "",
            total ? 100.0 * (double)done / (double)total : 100.0, (double)done / 1048576.0, (double)total / 1048576.0);
    if (done >= total) fputc('\n', stderr);
}

ft_status ft_cli_offload_load(ft_cli_offload *o, const char *dir, ft_load_params *lp, uint32_t batch,
                              uint32_t prompt_len, uint32_t gen_len, ft_model **out)
{
    if (!o->enabled) {
        /* Tier options without a policy are a mistake worth reporting. */
        if (o->p.policy.n_remotes || o->p.policy.disk_uri[0] || o->codec_given || o->cache_codec_given)
            return ft_set_error(FT_ERR_INVALID_ARG,
                                "--remote/--disk-dir/--compress-weights/--compress-cache need --policy");
        return ft_model_load(dir, lp, out);
    }
    ft_status st;
    if (o->auto_policy) {
        ft_cost_inputs in;
        memset(&in, 0, sizeof in);
        if ((st = ft_cli_cost_model_inputs(dir, lp->weights, &in))) return st;
        if ((st = ft_cli_plan_measure(dir, &in, &o->p.policy, o->p.device_budget, batch ? batch : 1, prompt_len,
                                      gen_len, o->threads)))
            return st;
        ft_policy best;
        ft_cost_estimate e;
        unsigned codecs = o->codec_given ? 1u << o->p.policy.compress_weights
                                         : (1u << FT_CODEC_RAW) | (1u << FT_CODEC_BYTEPLANE) | (1u << FT_CODEC_Q4);
        unsigned ccodecs = o->cache_codec_given ? 1u << o->p.policy.compress_cache
                                                : (1u << FT_CODEC_RAW) | (1u << FT_CODEC_Q4);
        if ((st = ft_plan(&in, &o->p.policy, batch ? batch : 1, 1, codecs, ccodecs, FT_CACHE_TIERS, &best, &e)))
            return st;
        o->p.policy = best;
        o->predicted_tps = e.decode_tps;
    }
    char pol[256];
    ft_policy_format(&o->p.policy, pol, sizeof pol);
    fprintf(stderr, "offload policy: %s", pol);
    if (o->auto_policy) fprintf(stderr, " (planned: %.2f tok/s predicted)", o->predicted_tps);
    fputc('\n', stderr);
    ft_load_params elp = *lp;
    elp.external_layers = 1;
    ft_model *m = NULL;
    if ((st = ft_model_load(dir, &elp, &m))) return st;
    double last = 0;
    o->p.progress = upload_progress;
    o->p.user = &last;
    if ((st = ft_offload_create(m, dir, &o->p, &o->o))) {
        ft_model_free(m);
        return st;
    }
    *out = m;
    return FT_OK;
}

static int cache_offloaded(const ft_cli_offload *o)
{
    return o->enabled && o->p.policy.c_pct[FT_TIER_DEVICE] < 100;
}

void ft_cli_offload_ctx_params(const ft_cli_offload *o, ft_ctx_params *cp)
{
    cp->external_kv = cache_offloaded(o);
    /* the in-memory cache in bf16 by default; an offloaded one exchanges f32 rows */
    cp->kv_dtype = cp->external_kv ? FT_F32 : o->kv_dtype >= 0 ? (ft_dtype)o->kv_dtype : FT_BF16;
}

ft_status ft_cli_offload_attach(ft_cli_offload *o, const ft_model *m, ft_ctx *c, const ft_ctx_params *cp)
{
    if (o->o) {
        ft_ctx_set_layer_hook(c, ft_offload_hook, o->o);
        ft_offload_reset_stats(o->o);
    }
    if (!cache_offloaded(o)) return FT_OK;
    if (o->kv_dtype >= 0 && o->kv_dtype != FT_F32)
        return ft_set_error(FT_ERR_INVALID_ARG, "--kv-dtype %s: the policy offloads the KV cache, which is "
                            "stored as --compress-cache says (none: f32 rows)", ft_dtype_name((ft_dtype)o->kv_dtype));
    ft_kv_offload_params kp;
    ft_kv_offload_default_params(&kp);
    kp.policy = o->p.policy;
    kp.max_batch = cp->max_batch;
    kp.max_seq = cp->max_seq;
    kp.token_file = o->p.token_file;
    kp.failover_ms = o->p.failover_ms;
    if (o->p.device_budget) {   /* what the weights left of the budget */
        ft_offload_stats s;
        memset(&s, 0, sizeof s);
        if (o->o) ft_offload_get_stats(o->o, &s);
        uint64_t used = s.resident_bytes + s.slot_bytes;
        kp.device_budget = used < o->p.device_budget ? o->p.device_budget - used : 1;
    }
    ft_status st = ft_kv_offload_create(m, &kp, &o->kv);
    if (st) return st;
    ft_kv_hooks h;
    ft_kv_offload_hooks(o->kv, &h);
    ft_ctx_set_kv_hooks(c, &h);
    return FT_OK;
}

void ft_cli_offload_mark(ft_cli_offload *o)
{
    if (o->marked) return;
    if (o->o) ft_offload_get_stats(o->o, &o->mark_w);
    if (o->kv) ft_kv_offload_get_stats(o->kv, &o->mark_kv);
    o->marked = 1;
}

int ft_cli_offload_on_token(void *user, size_t seq, int32_t token)
{
    (void)seq;
    (void)token;
    ft_cli_offload_mark(user);
    return 0;
}

/* Three resources run side by side: compute (wall time minus the time it
 * waited on either I/O thread), the weight I/O thread and the cache I/O
 * thread. The roofline is the busiest one; efficiency = roofline / wall. */
typedef struct { double compute_s, roof_s, eff, wall_s; } phase_eff;

static phase_eff efficiency(double wall_s, double w_io, double w_wait, double kv_io, double kv_wait)
{
    phase_eff e = {wall_s - w_wait - kv_wait, 0, 0, wall_s};
    e.roof_s = e.compute_s;
    if (w_io > e.roof_s) e.roof_s = w_io;
    if (kv_io > e.roof_s) e.roof_s = kv_io;
    e.eff = wall_s > 0 ? e.roof_s / wall_s : 0;
    /* An I/O job's time is counted when it ends: the one running when
     * decoding began lands in the decode phase, which can tip the ratio
     * a little over 1. */
    if (e.eff > 1) e.eff = 1;
    return e;
}

/* Everything the reports print. */
typedef struct {
    ft_offload_stats w;
    ft_kv_offload_stats kv;
    phase_eff all, prefill, decode;   /* prefill/decode: when marked */
} report_data;

static void gather(const ft_cli_offload *o, double prefill_s, double decode_s, report_data *d)
{
    memset(d, 0, sizeof *d);
    if (o->o) ft_offload_get_stats(o->o, &d->w);
    if (o->kv) ft_kv_offload_get_stats(o->kv, &d->kv);
    d->all = efficiency(prefill_s + decode_s, d->w.io_busy_s, d->w.wait_s, d->kv.io_busy_s, d->kv.wait_s);
    if (o->marked) {
        const ft_offload_stats *a = &o->mark_w;
        const ft_kv_offload_stats *b = &o->mark_kv;
        d->prefill = efficiency(prefill_s, a->io_busy_s, a->wait_s, b->io_busy_s, b->wait_s);
        d->decode = efficiency(decode_s, d->w.io_busy_s - a->io_busy_s, d->w.wait_s - a->wait_s,
                               d->kv.io_busy_s - b->io_busy_s, d->kv.wait_s - b->wait_s);
    }
}

static double mib(uint64_t b) { return (double)b / 1048576.0; }

void ft_cli_offload_report(const ft_cli_offload *o, double prefill_s, double decode_s, FILE *f)
{
    if ((!o->o && !o->kv) || !o->stats) return;
    report_data d;
    gather(o, prefill_s, decode_s, &d);
    const ft_offload_stats *s = &d.w;
    if (o->o) {
        fprintf(f, "offload: resident %.1f MiB, slots %.1f MiB; first start uploaded %.1f MiB, reused %.1f MiB\n",
                mib(s->resident_bytes), mib(s->slot_bytes), mib(s->uploaded_bytes), mib(s->reused_bytes));
        for (int t = FT_TIER_HOST; t < FT_TIER_COUNT; t++)
            if (s->logical_bytes[t])
                fprintf(f, "offload: %-6s read %.1f MiB of tensors as %.1f MiB (%.2fx)\n", ft_tier_name((ft_tier)t),
                        mib(s->logical_bytes[t]), mib(s->wire_bytes[t]),
                        s->wire_bytes[t] ? (double)s->logical_bytes[t] / (double)s->wire_bytes[t] : 0.0);
        if (o->p.policy.replicas > 1)
            fprintf(f, "offload: %u replicas: %llu nodes failed over, %llu reads retried on a replica, %llu nodes "
                       "filled again (%.1f MiB)\n", o->p.policy.replicas, (unsigned long long)s->failovers,
                    (unsigned long long)s->retries, (unsigned long long)s->repairs, mib(s->repaired_bytes));
    }
    if (o->kv) {
        const ft_kv_offload_stats *k = &d.kv;
        fprintf(f, "offload: KV cache resident %.1f MiB, staging %.1f MiB, %llu fetches (%llu prefetched), "
                   "I/O busy %.3f s, compute waited %.3f s\n",
                mib(k->resident_bytes), mib(k->staging_bytes), (unsigned long long)k->fetches,
                (unsigned long long)k->prefetch_hits, k->io_busy_s, k->wait_s);
        for (int t = FT_TIER_HOST; t < FT_TIER_COUNT; t++)
            if (k->tier_bytes[t] || k->written_logical[t])   /* remote: full chunks only */
                fprintf(f, "offload: KV cache %-6s holds %.1f MiB; read %.1f MiB as %.1f MiB, wrote %.1f MiB as "
                           "%.1f MiB (%.2fx)\n", ft_tier_name((ft_tier)t), mib(k->tier_bytes[t]),
                        mib(k->read_logical[t]), mib(k->read_stored[t]), mib(k->written_logical[t]),
                        mib(k->written_stored[t]),
                        k->written_stored[t] ? (double)k->written_logical[t] / (double)k->written_stored[t] : 0.0);
    }
    /* The decode phase first: the benchmark tables report decode tok/s. */
    if (o->marked)
        fprintf(f, "offload: decode: I/O busy %.3f s, compute waited %.3f s of %.3f s; overlap efficiency %.0f%% "
                   "(slowest resource busy %.3f s); prefill: %.0f%% of %.3f s\n",
                d.w.io_busy_s - o->mark_w.io_busy_s + d.kv.io_busy_s - o->mark_kv.io_busy_s,
                d.w.wait_s - o->mark_w.wait_s + d.kv.wait_s - o->mark_kv.wait_s, decode_s, 100.0 * d.decode.eff,
                d.decode.roof_s, 100.0 * d.prefill.eff, prefill_s);
    fprintf(f, "offload: whole run: %llu layer fetches, I/O busy %.3f s, compute waited %.3f s of %.3f s; "
               "overlap efficiency %.0f%% (slowest resource busy %.3f s)\n",
            (unsigned long long)s->layers_fetched, s->io_busy_s + d.kv.io_busy_s, s->wait_s + d.kv.wait_s,
            d.all.wall_s, 100.0 * d.all.eff, d.all.roof_s);
}

static void json_tiers(FILE *f, const char *name, const uint64_t *v)
{
    fprintf(f, "\"%s\":{", name);
    for (int t = FT_TIER_HOST; t < FT_TIER_COUNT; t++)
        fprintf(f, "%s\"%s\":%llu", t > FT_TIER_HOST ? "," : "", ft_tier_name((ft_tier)t), (unsigned long long)v[t]);
    fputc('}', f);
}

void ft_cli_offload_report_json(const ft_cli_offload *o, double prefill_s, double decode_s, FILE *f)
{
    report_data d;
    gather(o, prefill_s, decode_s, &d);
    char pol[256];
    ft_policy_format(&o->p.policy, pol, sizeof pol);
    fprintf(f, "{\"policy\":\"%s\",", pol);
    if (o->predicted_tps > 0) fprintf(f, "\"predicted_tok_s\":%.3f,", o->predicted_tps);
    fprintf(f, "\"weights\":{\"resident_bytes\":%llu,\"slot_bytes\":%llu,\"uploaded_bytes\":%llu,"
               "\"reused_bytes\":%llu,\"layer_fetches\":%llu,\"io_busy_s\":%.4f,\"wait_s\":%.4f,",
            (unsigned long long)d.w.resident_bytes, (unsigned long long)d.w.slot_bytes,
            (unsigned long long)d.w.uploaded_bytes, (unsigned long long)d.w.reused_bytes,
            (unsigned long long)d.w.layers_fetched, d.w.io_busy_s, d.w.wait_s);
    fprintf(f, "\"replicas\":%u,\"failovers\":%llu,\"retries\":%llu,\"repairs\":%llu,\"repaired_bytes\":%llu,"
               "\"failover_fetch_s\":%.4f,\"degraded_fetch_s\":%.4f,\"degraded_fetches\":%llu,",
            o->p.policy.replicas ? o->p.policy.replicas : 1, (unsigned long long)d.w.failovers,
            (unsigned long long)d.w.retries, (unsigned long long)d.w.repairs, (unsigned long long)d.w.repaired_bytes,
            d.w.failover_fetch_s, d.w.degraded_fetch_s, (unsigned long long)d.w.degraded_fetches);
    json_tiers(f, "read_logical_bytes", d.w.logical_bytes);
    fputc(',', f);
    json_tiers(f, "read_wire_bytes", d.w.wire_bytes);
    fprintf(f, "},\"kv_cache\":{\"resident_bytes\":%llu,\"staging_bytes\":%llu,\"fetches\":%llu,"
               "\"prefetch_hits\":%llu,\"io_busy_s\":%.4f,\"wait_s\":%.4f,",
            (unsigned long long)d.kv.resident_bytes, (unsigned long long)d.kv.staging_bytes,
            (unsigned long long)d.kv.fetches, (unsigned long long)d.kv.prefetch_hits, d.kv.io_busy_s, d.kv.wait_s);
    json_tiers(f, "tier_bytes", d.kv.tier_bytes);
    fputc(',', f);
    json_tiers(f, "read_logical_bytes", d.kv.read_logical);
    fputc(',', f);
    json_tiers(f, "read_stored_bytes", d.kv.read_stored);
    fputc(',', f);
    json_tiers(f, "written_logical_bytes", d.kv.written_logical);
    fputc(',', f);
    json_tiers(f, "written_stored_bytes", d.kv.written_stored);
    fprintf(f, "},\"compute_s\":%.4f,\"roofline_s\":%.4f,\"overlap_efficiency\":%.4f", d.all.compute_s,
            d.all.roof_s, d.all.eff);
    if (o->marked)
        fprintf(f, ",\"prefill_overlap_efficiency\":%.4f,\"decode_overlap_efficiency\":%.4f", d.prefill.eff,
                d.decode.eff);
    fputc('}', f);
}

void ft_cli_offload_free(ft_cli_offload *o)
{
    ft_kv_offload_free(o->kv);
    o->kv = NULL;
    ft_offload_free(o->o);
    o->o = NULL;
}
