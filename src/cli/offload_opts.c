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
    "  --policy SPEC|auto     e.g. 'w=0,20,30,50' (device,host,disk,remote %%); auto: plan it\n"
    "  --remote URI[,URI..]   memory nodes (ucx://HOST:PORT) for the remote tier\n"
    "  --disk-dir DIR         directory for the disk tier\n"
    "  --compress-weights C   none, bp (lossless), q8, q4 (FlexGen group-wise)\n"
    "  --device-mem SIZE      budget for decoded weights (and, for auto, cache)\n"
    "  --token-file FILE      shared secret for the memory nodes\n"
    "  --offload-stats        print bytes per tier, I/O wait and overlap efficiency\n";

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
        if (strcmp(v, "none")) {
            fprintf(stderr, "flextier: --compress-cache: KV cache offloading is not implemented yet "
                            "(the cache stays on the device, uncompressed)\n");
            return -1;
        }
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
        if (o->p.policy.n_remotes || o->p.policy.disk_uri[0] || o->codec_given)
            return ft_set_error(FT_ERR_INVALID_ARG, "--remote/--disk-dir/--compress-weights need --policy");
        return ft_model_load(dir, lp, out);
    }
    ft_status st;
    if (o->auto_policy) {
        ft_cost_inputs in;
        memset(&in, 0, sizeof in);
        if ((st = ft_cli_cost_model_inputs(dir, &in))) return st;
        if ((st = ft_cli_plan_measure(dir, &in, &o->p.policy, o->p.device_budget, batch ? batch : 1, prompt_len,
                                      gen_len, o->threads)))
            return st;
        ft_policy best;
        ft_cost_estimate e;
        unsigned codecs = o->codec_given ? 1u << o->p.policy.compress_weights
                                         : (1u << FT_CODEC_RAW) | (1u << FT_CODEC_BYTEPLANE) | (1u << FT_CODEC_Q4);
        if ((st = ft_plan(&in, &o->p.policy, batch ? batch : 1, 1, codecs, 0, 1u << FT_TIER_DEVICE, &best, &e)))
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

void ft_cli_offload_attach(ft_cli_offload *o, ft_ctx *c)
{
    if (o->o) {
        ft_ctx_set_layer_hook(c, ft_offload_hook, o->o);
        ft_offload_reset_stats(o->o);
    }
}

void ft_cli_offload_report(const ft_cli_offload *o, double wall_s, FILE *f)
{
    if (!o->o || !o->stats) return;
    ft_offload_stats s;
    ft_offload_get_stats(o->o, &s);
    fprintf(f, "offload: resident %.1f MiB, slots %.1f MiB; first start uploaded %.1f MiB, reused %.1f MiB\n",
            (double)s.resident_bytes / 1048576.0, (double)s.slot_bytes / 1048576.0,
            (double)s.uploaded_bytes / 1048576.0, (double)s.reused_bytes / 1048576.0);
    for (int t = FT_TIER_HOST; t < FT_TIER_COUNT; t++)
        if (s.logical_bytes[t])
            fprintf(f, "offload: %-6s read %.1f MiB of tensors as %.1f MiB (%.2fx)\n", ft_tier_name((ft_tier)t),
                    (double)s.logical_bytes[t] / 1048576.0, (double)s.wire_bytes[t] / 1048576.0,
                    s.wire_bytes[t] ? (double)s.logical_bytes[t] / (double)s.wire_bytes[t] : 0.0);
    double compute = wall_s - s.wait_s;
    double roof = compute > s.io_busy_s ? compute : s.io_busy_s;
    fprintf(f, "offload: %llu layer fetches, I/O busy %.3f s, compute waited %.3f s of %.3f s; "
               "overlap efficiency %.0f%% (slowest resource busy %.3f s)\n",
            (unsigned long long)s.layers_fetched, s.io_busy_s, s.wait_s, wall_s,
            wall_s > 0 ? 100.0 * roof / wall_s : 0.0, roof);
}

void ft_cli_offload_free(ft_cli_offload *o)
{
    ft_offload_free(o->o);
    o->o = NULL;
}
