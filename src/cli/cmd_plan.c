/* flextier plan: measure the machine, then choose an offloading policy
 * with the cost model (include/flextier/offload.h). */
#include "cli.h"
#include "flextier/offload.h"
#include "flextier/engine.h"
#include "flextier/store.h"
#include "flextier/model.h"
#include "session_opts.h"

#include <fcntl.h>
#include <getopt.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char plan_usage[] =
    "usage: flextier plan --model DIR --device-mem SIZE [--host-mem SIZE] [--disk-dir DIR]\n"
    "                     [--disk-mem SIZE] [--remote URI[,..]] [--remote-mem SIZE]\n"
    "                     [--batch N] [--fixed-batch] [--prompt-len N] [--gen-len N]\n"
    "                     [--link-bw remote=RATE,disk=RATE,host=RATE] [--codecs none,bp,q8,q4]\n"
    "                     [--cache-codecs none,q8,q4] [--policy SPEC] [--threads N] [--json]\n"
    "                     [--weights-dtype auto|f32|bf16|f16] [--memory SIZE] [--allow-lossy]\n"
    "                     [--recalibrate] [--expert-hit RATE]\n"
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
    "core of the agent's instead of this machine's cores.\n"
    "Lossless unless asked: the codecs searched are none and bp for the weights and\n"
    "none for the cache; --allow-lossy adds q8 and q4 (or name them with --codecs /\n"
    "--cache-codecs). --memory SIZE bounds the device and host tiers together (the\n"
    "whole process, as run --memory: what the process, embeddings and scratch leave).\n"
    "The machine's measurements are cached per model shape (~/.cache/flextier/calib;\n"
    "FLEXTIER_CALIB_CACHE=DIR or 0): --recalibrate measures again.\n"
    "--expert-hit RATE (0 < RATE <= 1; a mixture of experts): the expert cache's hit rate\n"
    "a run measured (run --offload-stats; bench run --json \"experts\".\"hit_rate\") instead\n"
    "of the uniform-routing estimate (cache / streamed experts), which repeated routing beats.\n";

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
    if (end == buf || *end || !(d > 0) || !isfinite(d)) return ft_set_error(FT_ERR_INVALID_ARG, "bad rate '%s' (e.g. 1gbit, 125M)", s);
    *out = d * mul / (bits ? 8.0 : 1.0);
    return FT_OK;
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
        {"memory", required_argument, 0, 'M'}, {"allow-lossy", no_argument, 0, 'L'},
        {"recalibrate", no_argument, 0, 'X'}, {"expert-hit", required_argument, 0, 'E'},
        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    const char *model = NULL, *links = NULL, *codecs = NULL, *given_policy = NULL;
    const char *cache_codecs = NULL;
    uint64_t memory = 0;
    int lossy = 0, recal = 0;
    double expert_hit = 0;
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
        case 'M': st = ft_cli_parse_size(optarg, &memory); break;
        case 'L': lossy = 1; break;
        case 'X': recal = 1; break;
        case 'E': {
            char *end = NULL;
            expert_hit = strtod(optarg, &end);
            if (!end || end == optarg || *end || !(expert_hit > 0 && expert_hit <= 1))
                return ft_cli_usage_error(plan_usage, "--expert-hit: expected a rate in (0, 1], got '%s'", optarg);
            break;
        }
        case 'h': fputs(plan_usage, stdout); return FT_EXIT_OK;
        default: return ft_cli_usage_error(plan_usage, "unknown or incomplete option '%s'", argv[optind - 1]);
        }
        if (st) return ft_cli_usage_error(plan_usage, "%s", ft_last_error());
    }
    if (!model || (!have_dev && !memory))
        return ft_cli_usage_error(plan_usage, "plan needs --model and --device-mem or --memory");
    if (optind != argc) return ft_cli_usage_error(plan_usage, "unexpected argument '%s'", argv[optind]);
    if (!codecs) codecs = lossy ? "none,bp,q8,q4" : "none,bp";
    if (!cache_codecs) cache_codecs = lossy ? "none,q8,q4" : "none";
    unsigned wmask = 0, cmask = 0;
    if (parse_codec_list(codecs, 0, &wmask))
        return ft_cli_usage_error(plan_usage, "--codecs: '%s': each is none, bp, q8 or q4", codecs);
    if (parse_codec_list(cache_codecs, 1, &cmask))
        return ft_cli_usage_error(plan_usage, "--cache-codecs: '%s': each is none, q8 or q4", cache_codecs);
    ft_cost_inputs in;
    memset(&in, 0, sizeof in);
    ft_status st = ft_cost_inputs_load(model, weights, &in);
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
    ft_calibrate_params calp;
    ft_calibrate_default_params(&calp);
    calp.base = &base;
    calp.device_mem = dev;
    calp.batch = (uint32_t)batch;
    calp.prompt_len = (uint32_t)plen;
    calp.gen_len = (uint32_t)glen;
    calp.threads = (unsigned)threads;
    ft_cli_warn_threads(threads);
    calp.codecs = wmask | cmask;
    calp.given_bw = given;
    calp.recalibrate = recal;
    /* Under --memory the embeddings and then the LM head are placed like
     * layers, as `run --memory` places them: in memory while the budget
     * holds them, else read from the checkpoint (levels 0, 1, 2). */
    static const unsigned levels[3] = {0, FT_STREAM_EMBED, FT_STREAM_EMBED | FT_STREAM_LM_HEAD};
    uint64_t caps[3] = {0, 0, 0}, head_bytes[3] = {0, 0, 0}, emb = 0, head = 0, need_min = 0;
    int lv0 = -1;
    if (memory) {
        for (int lv = 2; lv >= 0; lv--) {
            /* the whole process, as `run --memory` counts it */
            ft_load_params lp;
            ft_load_params_default(&lp);
            lp.weights = weights;
            lp.external_layers = FT_LOAD_LAYOUT_ONLY;
            lp.stream_globals = levels[lv];
            lp.stream_drop_cache = 1;   /* a binding budget: a head read past the page cache
                                           counts its second chunk buffer */
            ft_model *lm = NULL;
            if ((st = ft_model_load(model, &lp, &lm))) return ft_cli_fail(model, st);
            const ft_model_config *cfg = ft_model_get_config(lm);
            ft_model_global_split(lm, &emb, &head);
            ft_ctx_params cp = {0};
            cp.max_batch = (int)batch;
            cp.max_seq = (int)(plen + glen + 1);
            cp.max_rows = (int)(batch * plen);
            cp.external_kv = 1;
            cp.kv_dtype = FT_F32;
            cp.threads = (unsigned)threads;
            uint64_t kvb = 0, scratch = 0, need0;
            st = ft_ctx_estimate(lm, &cp, &kvb, &scratch);
            need0 = ft_process_rss() + ft_model_global_bytes(lm) + scratch + (12ull << 20) +
                    3ull * (uint64_t)batch * (uint64_t)cfg->vocab * sizeof(float);
            ft_model_free(lm);
            if (st) return ft_cli_fail("plan", st);
            if (lv == 2) need_min = need0;
            head_bytes[lv] = (levels[lv] & FT_STREAM_LM_HEAD) ? (head ? head : emb) : 0;
            if (need0 >= memory) continue;
            caps[lv] = memory - need0;
            lv0 = lv;
        }
        if (lv0 < 0)
            return ft_cli_fail("plan", ft_set_error(FT_ERR_NO_SPACE, "--memory %.1f MiB: the process and scratch "
                                                    "alone need %.1f MiB (with the embeddings and LM head read from "
                                                    "the checkpoint)", (double)memory / 1048576.0,
                                                    (double)need_min / 1048576.0));
        in.proc_cap = caps[lv0];
        calp.memory = in.proc_cap;
        calp.drop_cache = 1;
    }
    if (!json) fprintf(stderr, "plan: measuring compute, memory, codecs and links...\n");
    if ((st = ft_calibrate(model, &calp, &in))) return ft_cli_fail("plan", st);
    if (!host) in.cap[FT_TIER_HOST] = 0;
    in.expert_hit_rate = expert_hit;
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
    } else if (!memory) {
        if ((st = ft_plan(&in, &base, (uint32_t)batch, fixed, wmask, cmask, FT_CACHE_TIERS, &best, &e)))
            return ft_cli_fail("plan", st);
    } else {
        /* the level with the best prediction (ties: more in memory); none
         * beyond one that holds every weight in memory */
        int chosen = -1;
        for (int lv = lv0; lv < 3; lv++) {
            if (!caps[lv]) continue;
            ft_policy cand;
            ft_cost_estimate ce;
            in.proc_cap = caps[lv];
            in.head_stream_bytes = head_bytes[lv];
            st = ft_plan(&in, &base, (uint32_t)batch, fixed, wmask, cmask, FT_CACHE_TIERS, &cand, &ce);
            if (st == FT_ERR_NO_SPACE) continue;
            if (st) return ft_cli_fail("plan", st);
            if (chosen < 0 || ce.decode_tps > e.decode_tps) { best = cand; e = ce; chosen = lv; }
            if (cand.w_pct[FT_TIER_DISK] == 0 && cand.w_pct[FT_TIER_REMOTE] == 0) break;
        }
        if (chosen < 0) return ft_cli_fail("plan", ft_set_error(FT_ERR_NO_SPACE, "no policy fits --memory %.1f MiB "
                                                                "(the embeddings and LM head read from the checkpoint "
                                                                "included)", (double)memory / 1048576.0));
        in.proc_cap = caps[chosen];
        in.head_stream_bytes = head_bytes[chosen];
        lv0 = chosen;
    }
    char pol[256];
    ft_policy_format(&best, pol, sizeof pol);
    /* the same policy on an idle machine (a thread's share of a core 1):
     * what does not move with the other processes' load */
    double idle_tps = e.decode_tps;
    if (in.cpu_share > 0 && (in.cpu_share < 1 || in.handoff_s > 0)) {
        ft_cost_inputs *idle = malloc(sizeof *idle);
        if (idle) {
            ft_cost_estimate ie;
            *idle = in;
            ft_cost_rescale_cpu(idle, in.cpu_share);
            idle->handoff_s = 0;   /* microseconds when nothing else runs */
            ft_cost_predict(idle, &best, &ie);
            idle_tps = ie.decode_tps;
            free(idle);
        }
    }
    double load1 = 0;
    {
        FILE *lf = fopen("/proc/loadavg", "re");
        if (lf) {
            if (fscanf(lf, "%lf", &load1) != 1) load1 = 0;
            fclose(lf);
        }
    }
    if (json) {
        printf("{\"policy\": \"%s\", \"decode_tps\": %.4f, \"prefill_tps\": %.4f, \"bottleneck\": \"%s\", "
               "\"t_layer_s\": %.6g, \"flops\": %.4g, \"mem_bw\": %.4g, \"bw\": {\"host\": %.4g, \"disk\": %.4g, "
               "\"remote\": %.4g}, \"device_bytes\": %llu",
               pol, e.decode_tps, e.prefill_tps, e.bottleneck, e.t_layer_decode, in.flops, in.mem_bw,
               in.bw[1], in.bw[2], in.bw[3], (unsigned long long)e.mem[0]);
        printf(", \"cpu_share\": %.3f, \"decode_tps_idle\": %.4f, \"load1\": %.2f, \"calibration_cached\": %d",
               in.cpu_share, idle_tps, load1, in.calibration_cached);
        /* the KV cache's per-request costs measured and what they add per
         * layer and decode step */
        printf(", \"kv_request_s\": {\"remote\": %.4g, \"disk_read\": %.4g, \"disk_write\": %.4g}, "
               "\"t_kv_req_s\": {\"disk\": %.4g, \"remote\": %.4g}",
               in.remote_req_s, in.disk_read_req_s, in.disk_write_req_s, e.t_kv_req[FT_TIER_DISK],
               e.t_kv_req[FT_TIER_REMOTE]);
        /* fetches on this machine's cores, measured with the compute threads busy */
        printf(", \"fetch_busy\": {");
        for (int t = FT_TIER_DISK; t <= FT_TIER_REMOTE; t++) {
            const ft_cost_fetch_busy *fb = &in.fetch_busy[t];
            printf("%s\"%s\": {\"bw_busy\": %.4g, \"check_free_s_per_byte\": %.4g, \"check_busy_s_per_byte\": %.4g, "
                   "\"kv_request_busy_s\": %.4g}", t == FT_TIER_DISK ? "" : ", ", ft_tier_name((ft_tier)t), fb->bw_busy,
                   fb->check_free, fb->check_busy, fb->req_busy);
        }
        printf("}");
        if (in.n_experts)   /* the expert model's terms (per sparse layer and decode step) */
            printf(", \"t_compute_s\": %.6g, \"t_fixed_s\": %.6g, \"expert_hit\": %.4f, "
                   "\"expert_fetch_bytes_per_layer_step\": %.6g, \"expert_cache_bytes\": %.6g",
                   e.t_compute,
                   e.decode_tps > 0 ? (double)best.gpu_batch_size * best.num_gpu_batches / e.decode_tps -
                                          in.n_layers * e.t_layer_decode : 0.0,
                   e.expert_hit, e.expert_fetch_bytes, e.expert_cache_mem);
        printf("}\n");
        return FT_EXIT_OK;
    }
    char b1[32];
    printf("machine:  %.1f GFLOP/s GEMM, %.1f GB/s memory", in.flops / 1e9, in.mem_bw / 1e9);
    if (base.disk_uri[0]) printf(", disk %.2f GB/s", in.bw[FT_TIER_DISK] / 1e9);
    if (base.n_remotes) printf(", remote %.3f GB/s x %u", in.bw[FT_TIER_REMOTE] / 1e9, base.n_remotes);
    printf("\ncodecs:   ");
    /* the size ratio against the model's format: byte-plane's measured
     * entropy ratio; q8/q4's from the layer's tensors as kept */
    uint64_t lraw = 0;
    for (uint32_t k = 0; k < in.n_tensors; k++) lraw += in.tensor_bytes[FT_CODEC_RAW][k];
    for (int k = 0; k < FT_CODEC_COUNT; k++)
        if (in.ratio[k] > 0) {
            double r = in.ratio[k];
            if (k == FT_CODEC_Q8 || k == FT_CODEC_Q4) {
                uint64_t lq = 0;
                for (uint32_t j = 0; j < in.n_tensors; j++) lq += in.tensor_bytes[k][j];
                if (lq) r = (double)lraw / (double)lq;
            }
            printf("%s %.2fx %.2f GB/s  ", k == FT_CODEC_RAW ? "none" : ft_codec_name((ft_codec_id)k), r,
                   in.decode_bw[k] / 1e9);
        }
    if (in.calibration_cached)
        printf("(calibration cached; --recalibrate to measure again)");
    {
        double lb = 0;
        for (uint32_t k = 0; k < in.n_tensors; k++) lb += (double)in.tensor_bytes[best.compress_weights][k];
        ft_cli_fmt_bytes(lb, b1, sizeof b1);
    }
    printf("\nmodel:    %u layers of %s%s (%s)\npolicy:   %s\n", in.n_layers, b1, in.n_experts ? " + experts" : "",
           best.compress_weights == FT_CODEC_Q8 ? "q8" : best.compress_weights == FT_CODEC_Q4 ? "q4"
                                                : ft_wfmt_name(in.weights_fmt), pol);
    printf("predicted: decode %.2f tok/s, prefill %.1f tok/s (bottleneck: %s)\n", e.decode_tps, e.prefill_tps,
           e.bottleneck);
    printf("load:     a thread gets %.2f of a core now (1-min load %.2f); on an idle machine: decode %.2f tok/s\n",
           in.cpu_share, load1, idle_tps);
    if (in.n_experts) {   /* the dense part above; the experts (issue 23) */
        char b2[32], b3[32];
        ft_cli_fmt_bytes((double)in.expert_bytes[best.compress_weights], b1, sizeof b1);
        ft_cli_fmt_bytes(e.expert_fetch_bytes, b2, sizeof b2);
        ft_cli_fmt_bytes(e.expert_cache_mem, b3, sizeof b3);
        printf("experts:  %u per sparse layer of %s, %u per token; expert cache %s, hit rate %.0f%% "
               "(%s); %s of experts fetched per layer per decode step\n", in.n_experts, b1,
               in.experts_used, b3, 100.0 * e.expert_hit, expert_hit > 0 ? "--expert-hit" : "uniform routing", b2);
    }
    for (int k = 0; k < FT_TIER_COUNT; k++) {
        ft_cli_fmt_bytes((double)e.mem[k], b1, sizeof b1);
        if (e.mem[k]) printf("  %-7s %s\n", ft_tier_name((ft_tier)k), b1);
    }
    if (memory && !given_policy) {   /* where the embeddings and the LM head go */
        char b2[32];
        ft_cli_fmt_bytes((double)emb, b1, sizeof b1);
        ft_cli_fmt_bytes((double)head, b2, sizeof b2);
        int se = (levels[lv0] & FT_STREAM_EMBED) != 0, sh = (levels[lv0] & FT_STREAM_LM_HEAD) != 0;
        if (head)
            printf("globals:  embeddings %s %s, LM head %s %s\n", b1,
                   se ? "read from the checkpoint (rows of the tokens)" : "in memory", b2,
                   sh ? "streamed from the checkpoint per step" : "in memory");
        else
            printf("globals:  embeddings = LM head (tied) %s %s\n", b1,
                   se ? "streamed from the checkpoint" : "in memory");
    }
    if (in.proc_cap) {
        ft_cli_fmt_bytes((double)e.mem_process, b1, sizeof b1);
        char b2[32];
        ft_cli_fmt_bytes((double)in.proc_cap, b2, sizeof b2);
        printf("  process %s of the %s --memory leaves for the tiers\n", b1, b2);
    }
    return FT_EXIT_OK;
}
