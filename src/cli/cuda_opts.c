/* `--device cuda`: the CUDA context instead of the CPU one for `flextier
 * run` and `flextier bench run`. Offloading with the GPU uses the same
 * flags as on the CPU, restricted to what the CUDA path implements:
 *   (no --policy)                          weights resident in device memory (bf16)
 *   --policy w=0,100 [--compress-weights none|q8|q4|bp]
 *                                          weights in pinned host memory, streamed
 *                                          over PCIe layer by layer (raw bf16 or
 *                                          compressed, decoded on the GPU) */
#include "cuda_opts.h"
#include "cli.h"

#include <string.h>

const char ft_cli_cuda_usage[] =
    "GPU:\n"
    "  --device cpu|cuda      compute device (default cpu). cuda: weights in device memory as\n"
    "                         bf16, cuBLAS GEMMs; with --policy w=0,100 the weights stay in\n"
    "                         pinned host memory and stream over PCIe layer by layer\n"
    "                         (--compress-weights q4|q8|bp: compressed, decoded on the GPU)\n";

int ft_cli_cuda_arg(ft_cli_cuda *g, int argc, char **argv, int *i)
{
    if (strcmp(argv[*i], "--device")) return 0;
    if (*i + 1 >= argc) {
        fprintf(stderr, "flextier: --device needs a value (cpu or cuda)\n");
        return -1;
    }
    const char *v = argv[++*i];
    if (!strcmp(v, "cpu")) g->on = 0;
    else if (!strcmp(v, "cuda")) g->on = 1;
    else {
        fprintf(stderr, "flextier: --device must be cpu or cuda, not '%s'\n", v);
        return -1;
    }
    return 1;
}

ft_status ft_cli_cuda_check(ft_cli_cuda *g, const ft_cli_offload *off)
{
    char why[512];
    ft_status st = ft_cuda_available(why, sizeof why);
    if (st) return ft_set_error(st, "--device cuda: %s", why);
    g->codec = FT_CODEC_RAW;
    if (off->enabled) {
        const ft_policy *p = &off->p.policy;
        if (off->auto_policy)
            return ft_set_error(FT_ERR_UNSUPPORTED, "--device cuda: --policy auto is not implemented for the GPU; "
                                "use w=100 (weights on the GPU) or w=0,100 (streamed from host memory)");
        if (p->w_pct[FT_TIER_DEVICE] == 100) g->stream = 0;
        else if (p->w_pct[FT_TIER_HOST] == 100) g->stream = 1;
        else
            return ft_set_error(FT_ERR_UNSUPPORTED, "--device cuda: weights must be all on the device (w=100) or "
                                "all in host memory (w=0,100); disk and remote tiers and split placements "
                                "are not implemented for the GPU");
        if (p->c_pct[FT_TIER_DEVICE] != 100)
            return ft_set_error(FT_ERR_UNSUPPORTED, "--device cuda: the KV cache must be on the device (c=100)");
        if (off->p.device_budget)
            return ft_set_error(FT_ERR_UNSUPPORTED, "--device cuda: --device-mem is not implemented for the GPU");
        g->codec = p->compress_weights;
        if (g->codec != FT_CODEC_RAW && !g->stream)
            return ft_set_error(FT_ERR_INVALID_ARG, "--device cuda: --compress-weights needs the weights in "
                                "host memory (--policy w=0,100)");
    } else if (off->codec_given || off->cache_codec_given || off->p.policy.n_remotes || off->p.policy.disk_uri[0]) {
        return ft_set_error(FT_ERR_INVALID_ARG, "--remote/--disk-dir/--compress-weights/--compress-cache need --policy");
    }
    return ft_cuda_device_info_get(0, &g->info);
}

ft_status ft_cli_cuda_create(ft_cli_cuda *g, const ft_model *m, int max_batch, int max_seq, int max_rows,
                             int all_logits, unsigned threads)
{
    ft_status st;
    ft_cuda_ctx_params cp;
    memset(&cp, 0, sizeof cp);
    cp.max_batch = max_batch;
    cp.max_seq = max_seq;
    cp.max_rows = max_rows;
    cp.all_logits = all_logits;
    if (g->stream) {
        ft_cuda_host_weights_params hp = {g->codec, 0, -1, threads};
        double t0 = ft_now();
        if ((st = ft_cuda_host_weights_create(m, &hp, &g->hw))) return st;
        fprintf(stderr, "host weights: %s, %.1f MiB pinned, packed in %.2f s\n", ft_codec_name(g->codec),
                (double)ft_cuda_host_weights_bytes(g->hw) / 1048576.0, ft_now() - t0);
        cp.stream_weights = 1;
        cp.hook = ft_cuda_host_weights_hook;
        cp.hook_user = g->hw;
    }
    return ft_cuda_ctx_create(m, &cp, &g->c);
}

static const char *placement(const ft_cli_cuda *g)
{
    if (!g->stream) return "resident";
    switch (g->codec) {
    case FT_CODEC_Q4: return "host-q4";
    case FT_CODEC_Q8: return "host-q8";
    case FT_CODEC_BYTEPLANE: return "host-bp";
    default: return "host-raw";
    }
}

void ft_cli_cuda_report(const ft_cli_cuda *g, FILE *f)
{
    ft_cuda_stats s;
    ft_cuda_ctx_get_stats(g->c, &s);
    fprintf(f, "  device     %s (cc %d.%d), weights %s: device %.1f MiB (bf16)", g->info.name, g->info.cc_major,
            g->info.cc_minor, placement(g), (double)(s.weight_bytes + s.slot_bytes) / 1048576.0);
    if (g->stream)
        fprintf(f, ", host %.1f MiB pinned, %.1f MiB copied over PCIe in %llu layer loads",
                (double)ft_cuda_host_weights_bytes(g->hw) / 1048576.0, (double)s.h2d_weight_bytes / 1048576.0,
                (unsigned long long)s.layers_streamed);
    fprintf(f, ", KV cache %.1f MiB\n", (double)s.kv_bytes / 1048576.0);
    if (g->stream && s.forward_s > 0)
        fprintf(f, "  streaming  compute waited %.3f s for weights in %.3f s of forward calls (%.0f%% of the time "
                "copies were hidden behind compute)\n", s.stall_s, s.forward_s,
                100.0 * (1.0 - (s.stall_s < s.forward_s ? s.stall_s / s.forward_s : 1.0)));
}

void ft_cli_cuda_report_json(const ft_cli_cuda *g, FILE *f)
{
    ft_cuda_stats s;
    ft_cuda_ctx_get_stats(g->c, &s);
    fprintf(f, ",\"gpu\":\"%s\",\"weights\":\"%s\",\"device_weight_bytes\":%llu,\"host_weight_bytes\":%llu,"
            "\"h2d_weight_bytes\":%llu,\"layers_streamed\":%llu,\"device_kv_bytes\":%llu,"
            "\"stall_s\":%.4f,\"forward_s\":%.4f",
            g->info.name, placement(g), (unsigned long long)(s.weight_bytes + s.slot_bytes),
            (unsigned long long)ft_cuda_host_weights_bytes(g->hw), (unsigned long long)s.h2d_weight_bytes,
            (unsigned long long)s.layers_streamed, (unsigned long long)s.kv_bytes, s.stall_s, s.forward_s);
}

void ft_cli_cuda_free(ft_cli_cuda *g)
{
    ft_cuda_ctx_free(g->c);
    ft_cuda_host_weights_free(g->hw);
    g->c = NULL;
    g->hw = NULL;
}
