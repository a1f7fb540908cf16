/* The CLI's engine, device and offloading options (shared by `flextier
 * run`, `bench run` and `perplexity`): they fill an ft_session_params
 * (include/flextier/session.h), the library does the rest; and the
 * end-of-run metrics (bytes per tier, I/O wait, overlap efficiency, the
 * GPU's counters), printed from the session's. */
#include "cli.h"
#include "session_opts.h"

#include <math.h>
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
    "  --memory SIZE|unlimited  the whole process's memory (weights, cache, scratch, embeddings,\n"
    "                         tokenizer, planning, the disk tier's page cache); default\n"
    "                         FLEXTIER_MEMORY, else the cgroup's limit or the available memory\n"
    "                         minus max(64M, 1/16); auto plans within it, a policy that cannot\n"
    "                         fit is refused before loading\n"
    "  --allow-lossy          auto may choose q8/q4 weights or cache (default: lossless only)\n"
    "  --recalibrate          auto, --predict: measure this machine again (not the calibration cache)\n"
    "  --predict              a given --policy: calibrate as auto does and print the cost model's\n"
    "                         predicted decode tok/s beside the measured one (--json: predicted_tok_s)\n"
    "  --device-mem SIZE      the device's budget (GPU; on a CPU: the working set of decoded\n"
    "                         weights and the device share of the cache)\n"
    "  --token-file FILE      shared secret for the memory nodes\n"
    "  --decode-threads N     threads checking and decoding streamed weights (default: every core)\n"
    "  --replicas N           every remote tensor on N of the nodes: a node that fails costs\n"
    "                         a retry on a replica, and is filled again when it is back\n"
    "  --failover-timeout MS  with replicas: give up on a node whose link moved nothing for\n"
    "                         this long (default 1000; a killed node is noticed at once)\n"
    "  --offload-stats        print bytes per tier, I/O wait and overlap efficiency (and for a\n"
    "                         mixture of experts per layer expert hits, misses, bytes, prefetch)\n"
    "  --expert-cache SIZE    mixture of experts: the cache of streamed experts (default: one\n"
    "                         layer's experts)\n"
    "  --expert-evict lru|lfu which cached expert makes room (default lru)\n"
    "  --expert-prefetch      read the next layer's predicted experts ahead (off by default:\n"
    "                         measured, it trades cache hits for overlap; docs/offload.md)\n";

const char ft_cli_engine_usage[] =
    "formats:\n"
    "  --weights-dtype F      what the matrices are kept and computed in: auto (the\n"
    "                         checkpoint's dtype, default), f32, bf16, f16, q8, q4\n"
    "                         (q8/q4: group-quantized at load; embeddings and the LM head\n"
    "                         stay bf16)\n"
    "  --kv-dtype D           the KV cache in memory: bf16 (default), f16, f32\n"
    "  --strict               a config.json key or tokenizer field flextier does not know is an\n"
    "                         error (default: a warning naming it)\n"
    "adapters:\n"
    "  --lora DIR[:SCALE]     a PEFT LoRA adapter directory applied unmerged in every forward\n"
    "                         (y = W x + SCALE * alpha/r * B A x; SCALE default 1); repeat\n"
    "                         for several, added in order. Any weight format and offloading\n"
    "                         policy; not with --device cuda or --pipeline\n";

ft_status ft_cli_parse_lora(const char *v, char *dir, size_t cap, float *scale)
{
    const char *c = strrchr(v, ':');
    size_t n = strlen(v);
    *scale = 1.0f;
    if (c && c[1]) {
        char *end;
        double d = strtod(c + 1, &end);
        if (!*end) {
            if (!isfinite(d) || fabs(d) > 1e6)
                return ft_set_error(FT_ERR_INVALID_ARG, "'%s': the scale after ':' must be a finite number", v);
            *scale = (float)d;
            n = (size_t)(c - v);
        }
    }
    if (n == 0) return ft_set_error(FT_ERR_INVALID_ARG, "'%s': expected DIR[:SCALE]", v);
    if (n >= cap) return ft_set_error(FT_ERR_INVALID_ARG, "'%s': path too long", v);
    memcpy(dir, v, n);
    dir[n] = 0;
    return FT_OK;
}

ft_status ft_cli_parse_weights(const char *s, int *out)
{
    static const char *const names[] = {"f32", "bf16", "f16", "q8", "q4"};
    if (!strcmp(s, "auto")) { *out = FT_WEIGHTS_AS_STORED; return FT_OK; }
    for (int f = 0; f < 5; f++)
        if (!strcmp(s, names[f])) { *out = f; return FT_OK; }
    return ft_set_error(FT_ERR_INVALID_ARG, "'%s': expected auto, f32, bf16, f16, q8 or q4", s);
}

const char ft_cli_cuda_usage[] =
    "GPU:\n"
    "  --device cpu|cuda      compute device (default cpu). cuda: weights in device memory as\n"
    "                         bf16, cuBLAS GEMMs; with --policy w=0,100 the weights stay in\n"
    "                         pinned host memory and stream over PCIe layer by layer\n"
    "                         (--compress-weights q4|q8|bp: compressed, decoded on the GPU);\n"
    "                         with disk or remote tiers (e.g. w=0,0,100 --disk-dir D) the\n"
    "                         offloading scheduler streams them to the GPU as to the CPU\n";

static double mib(uint64_t b) { return (double)b / 1048576.0; }

static int take(int argc, char **argv, int *i, const char **val)
{
    if (*i + 1 >= argc) {
        fprintf(stderr, "flextier: %s needs a value\n", argv[*i]);
        return -1;
    }
    *val = argv[++*i];
    return 1;
}

void ft_cli_session_init(ft_cli_session *o)
{
    memset(o, 0, sizeof *o);
    ft_session_default_params(&o->sp);
}

int ft_cli_session_arg(ft_cli_session *o, int argc, char **argv, int *i)
{
    const char *a = argv[*i], *v = NULL;
    char spec[FT_URI_MAX * FT_MAX_REMOTES + 16];
    int r;
    if (!strcmp(a, "--policy")) {
        if ((r = take(argc, argv, i, &v)) < 0) return r;
        o->enabled = 1;
        if (!strcmp(v, "auto")) { o->auto_policy = 1; return 1; }
        if (ft_policy_parse(v, &o->sp.policy)) goto bad;
        o->have_policy = 1;
        return 1;
    }
    if (!strcmp(a, "--remote")) {
        if ((r = take(argc, argv, i, &v)) < 0) return r;
        snprintf(spec, sizeof spec, "remote=%s", v);
        if (ft_policy_parse(spec, &o->sp.policy)) goto bad;
        return 1;
    }
    if (!strcmp(a, "--disk-dir")) {
        if ((r = take(argc, argv, i, &v)) < 0) return r;
        snprintf(spec, sizeof spec, "disk=file:%s", v);
        if (ft_policy_parse(spec, &o->sp.policy)) goto bad;
        return 1;
    }
    if (!strcmp(a, "--compress-weights")) {
        if ((r = take(argc, argv, i, &v)) < 0) return r;
        snprintf(spec, sizeof spec, "cw=%s", v);
        if (ft_policy_parse(spec, &o->sp.policy)) goto bad;
        o->codec_given = 1;
        return 1;
    }
    if (!strcmp(a, "--compress-cache")) {
        if ((r = take(argc, argv, i, &v)) < 0) return r;
        snprintf(spec, sizeof spec, "cc=%s", v);
        if (ft_policy_parse(spec, &o->sp.policy)) goto bad;
        o->cache_codec_given = 1;
        return 1;
    }
    if (!strcmp(a, "--device-mem")) {
        if ((r = take(argc, argv, i, &v)) < 0) return r;
        if (ft_cli_parse_size(v, &o->sp.device_mem)) goto bad;
        return 1;
    }
    if (!strcmp(a, "--memory")) {
        if ((r = take(argc, argv, i, &v)) < 0) return r;
        if (!strcmp(v, "unlimited") || !strcmp(v, "none")) o->sp.memory = FT_MEMORY_UNLIMITED;
        else if (ft_cli_parse_size(v, &o->sp.memory) || !o->sp.memory) {
            ft_set_error(FT_ERR_INVALID_ARG, "'%s': expected a size (512M, 1.5G) or 'unlimited'", v);
            goto bad;
        }
        o->memory_given = 1;
        return 1;
    }
    if (!strcmp(a, "--allow-lossy")) { o->sp.allow_lossy = 1; return 1; }
    if (!strcmp(a, "--recalibrate")) { o->sp.recalibrate = 1; return 1; }
    if (!strcmp(a, "--predict")) { o->sp.predict = 1; return 1; }
    if (!strcmp(a, "--token-file")) {
        if ((r = take(argc, argv, i, &v)) < 0) return r;
        o->sp.token_file = v;
        return 1;
    }
    if (!strcmp(a, "--offload-stats")) { o->stats = 1; return 1; }
    if (!strcmp(a, "--expert-cache")) {
        if ((r = take(argc, argv, i, &v)) < 0) return r;
        if (ft_cli_parse_size(v, &o->sp.expert_cache_bytes)) goto bad;
        return 1;
    }
    if (!strcmp(a, "--expert-evict")) {
        if ((r = take(argc, argv, i, &v)) < 0) return r;
        if (!strcmp(v, "lru")) o->sp.expert_evict = FT_EXPERT_LRU;
        else if (!strcmp(v, "lfu")) o->sp.expert_evict = FT_EXPERT_LFU;
        else { ft_set_error(FT_ERR_INVALID_ARG, "'%s': expected lru or lfu", v); goto bad; }
        return 1;
    }
    if (!strcmp(a, "--expert-prefetch")) { o->sp.expert_prefetch = 1; return 1; }
    if (!strcmp(a, "--replicas")) {
        if ((r = take(argc, argv, i, &v)) < 0) return r;
        snprintf(spec, sizeof spec, "rep=%s", v);
        if (ft_policy_parse(spec, &o->sp.policy)) goto bad;
        return 1;
    }
    if (!strcmp(a, "--failover-timeout")) {
        long ms;
        if ((r = take(argc, argv, i, &v)) < 0) return r;
        if (ft_cli_parse_int(v, 10, 3600000, &ms)) goto bad;
        o->sp.failover_ms = (unsigned)ms;
        return 1;
    }
    if (!strcmp(a, "--weights-dtype")) {
        if ((r = take(argc, argv, i, &v)) < 0) return r;
        if (ft_cli_parse_weights(v, &o->sp.weights)) goto bad;
        o->weights_given = 1;
        return 1;
    }
    if (!strcmp(a, "--kv-dtype")) {
        if ((r = take(argc, argv, i, &v)) < 0) return r;
        if (!strcmp(v, "f32")) o->sp.kv_dtype = FT_F32;
        else if (!strcmp(v, "bf16")) o->sp.kv_dtype = FT_BF16;
        else if (!strcmp(v, "f16")) o->sp.kv_dtype = FT_F16;
        else { ft_set_error(FT_ERR_INVALID_ARG, "'%s': expected bf16, f16 or f32", v); goto bad; }
        return 1;
    }
    if (!strcmp(a, "--strict")) { o->sp.strict = 1; return 1; }
    if (!strcmp(a, "--lora")) {
        if ((r = take(argc, argv, i, &v)) < 0) return r;
        size_t k = o->sp.n_lora;
        if (k == FT_CLI_MAX_LORA) {
            ft_set_error(FT_ERR_INVALID_ARG, "at most %d adapters", FT_CLI_MAX_LORA);
            goto bad;
        }
        if (ft_cli_parse_lora(v, o->lora_dir[k], sizeof o->lora_dir[k], &o->lora[k].scale)) goto bad;
        o->lora[k].dir = o->lora_dir[k];
        o->sp.lora = o->lora;
        o->sp.n_lora = k + 1;
        return 1;
    }
    if (!strcmp(a, "--device")) {
        if ((r = take(argc, argv, i, &v)) < 0) return r;
        if (!strcmp(v, "cpu")) o->sp.device = FT_DEVICE_CPU;
        else if (!strcmp(v, "cuda")) o->sp.device = FT_DEVICE_CUDA;
        else { ft_set_error(FT_ERR_INVALID_ARG, "must be cpu or cuda, not '%s'", v); goto bad; }
        return 1;
    }
    if (!strcmp(a, "--decode-threads")) {
        long n;
        if ((r = take(argc, argv, i, &v)) < 0) return r;
        if (ft_cli_parse_int(v, 1, 1024, &n)) goto bad;
        o->sp.decode_threads = (unsigned)n;
        return 1;
    }
    return 0;
bad:
    fprintf(stderr, "flextier: %s: %s\n", a, ft_last_error());
    return -1;
}

int ft_cli_session_cmd_arg(ft_cli_session *o, const char *usage, int argc, char **argv, int *i)
{
    const char *a = argv[*i];
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
        fputs(usage, stdout);
        fputs(ft_cli_engine_usage, stdout);
        fputs(ft_cli_offload_usage, stdout);
        fputs(ft_cli_cuda_usage, stdout);
        return FT_CLI_HELP;
    }
    return ft_cli_session_arg(o, argc, argv, i);
}

ft_status ft_cli_load_template_file(const char *file, const char *bos, const char *eos, ft_chat_template **out)
{
    uint8_t *d = NULL;
    size_t n = 0;
    ft_status st;
    if ((st = ft_cli_read_file(file, &d, &n))) {
        ft_cli_fail("--chat-template", st);
        return st;
    }
    char *src = strndup((const char *)d, n);
    ft_free_aligned(d);
    st = src ? ft_chat_template_load_string(src, bos, eos, out) : ft_set_error(FT_ERR_NOMEM, "allocation");
    free(src);
    if (st) ft_cli_fail(file, st);
    return st;
}

static void progress(void *user, const char *stage, uint64_t done, uint64_t total)
{
    double *last = user;
    double now = ft_now();
    int tty = isatty(2);
    if (!strcmp(stage, "plan")) {
        fprintf(stderr, "plan: measuring compute, memory, codecs and links...\n");
        return;
    }
    if (!strcmp(stage, "load") && total < (256u << 20)) return;   /* only long loads */
    /* On a terminal redraw a progress line; elsewhere (logs) print once. */
    if (done < total && (!tty || now - *last < 0.5)) return;
    *last = now;
    fprintf(stderr, "%s%s: %3.0f%% (%.1f / %.1f MiB)", tty ? "\r" : "",
            !strcmp(stage, "place") ? "placing weights in tiers" : "loading weights",
            total ? 100.0 * (double)done / (double)total : 100.0, (double)done / 1048576.0, (double)total / 1048576.0);
    if (done >= total) fputc('\n', stderr);
}

ft_status ft_cli_session_open(ft_cli_session *o, const char *dir, uint32_t batch, uint32_t prompt_len,
                              uint32_t gen_len, ft_session **out)
{
    ft_session_params p = o->sp;
    if (!o->enabled) {
        /* tier options without a policy are a mistake worth reporting */
        if (p.policy.n_remotes || p.policy.disk_uri[0] || o->codec_given || o->cache_codec_given)
            return ft_set_error(FT_ERR_INVALID_ARG,
                                "--remote/--disk-dir/--compress-weights/--compress-cache need --policy");
        p.offload = FT_OFFLOAD_NONE;
    } else if (o->auto_policy) {
        p.offload = FT_OFFLOAD_AUTO;
        p.weight_codecs = o->codec_given ? 1u << p.policy.compress_weights : 0;
        p.cache_codecs = o->cache_codec_given ? 1u << p.policy.compress_cache : 0;
    } else {
        p.offload = FT_OFFLOAD_POLICY;
    }
    p.max_batch = batch ? batch : 1;
    p.plan_prompt_len = prompt_len;
    p.plan_gen_len = gen_len;
    if (o->strict) p.strict = 1;
    p.progress = progress;
    p.user = &o->last_progress;
    ft_status st = ft_session_open(dir, &p, out);
    if (st) return st;
    ft_session_memory mem;
    ft_session_get_memory(*out, &mem);
    if ((o->enabled || o->memory_given) && mem.budget) {
        fprintf(stderr, "memory: budget %.1f MiB (%s", mib(mem.budget), mem.source);
        if (mem.headroom) fprintf(stderr, " %.1f MiB minus %.1f MiB headroom", mib(mem.limit), mib(mem.headroom));
        fprintf(stderr, "), estimated %.1f MiB", mib(mem.need));
        if (mem.disk_dir[0]) fprintf(stderr, "; private disk tier %s", mem.disk_dir);
        fputc('\n', stderr);
        /* where the embeddings and the LM head went (placed like layers) */
        int se = (mem.streamed & FT_STREAM_EMBED) || (!mem.head && mem.streamed),
            sh = mem.head ? (mem.streamed & FT_STREAM_LM_HEAD) != 0 : se;
        if (mem.head)
            fprintf(stderr, "memory: embeddings %.1f MiB %s, LM head %.1f MiB %s\n", mib(mem.embed),
                    se ? "read from the checkpoint (rows of the tokens)" : "in memory", mib(mem.head),
                    sh ? "streamed from the checkpoint (chunks per step)" : "in memory");
        else
            fprintf(stderr, "memory: embeddings = LM head (tied) %.1f MiB %s\n", mib(mem.embed),
                    se ? "streamed from the checkpoint" : "in memory");
    }
    if (o->enabled) {
        char pol[256];
        double predicted = 0;
        const ft_policy *pp = ft_session_policy(*out, &predicted);
        ft_policy_format(pp, pol, sizeof pol);
        fprintf(stderr, "offload policy: %s", pol);
        if (o->auto_policy) fprintf(stderr, " (planned: %.2f tok/s predicted)", predicted);
        else if (predicted > 0) fprintf(stderr, " (cost model: %.2f tok/s predicted)", predicted);
        fputc('\n', stderr);
        /* the numerics, said before generating */
        const ft_model *m = ft_session_model(*out);
        ft_codec_id cw = pp->compress_weights, cc = pp->compress_cache;
        int lossy_w = cw == FT_CODEC_Q8 || cw == FT_CODEC_Q4, lossy_c = cc == FT_CODEC_Q8 || cc == FT_CODEC_Q4;
        int kv_off = pp->c_pct[FT_TIER_DEVICE] < 100;
        fprintf(stderr, "formats: weights %s (%s%s), KV cache %s (%s)\n", ft_wfmt_name(ft_model_weights_format(m)),
                cw == FT_CODEC_BYTEPLANE ? "byte-plane frames, " : "", lossy_w ? "lossy" : "lossless",
                !kv_off ? (p.kv_dtype == FT_F32 ? "f32" : p.kv_dtype == FT_F16 ? "f16" : "bf16")
                        : cc == FT_CODEC_Q8 ? "q8 rows" : cc == FT_CODEC_Q4 ? "q4 rows" : "f32 rows",
                lossy_c ? "lossy" : "lossless");
    }
    return FT_OK;
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
    int has_w, has_kv;
    ft_offload_stats w, mark_w;
    ft_kv_offload_stats kv, mark_kv;
    phase_eff all, prefill, decode;   /* prefill/decode: when marked */
} report_data;

static void gather(const ft_session *s, double prefill_s, double decode_s, report_data *d)
{
    memset(d, 0, sizeof *d);
    ft_session_stats ss;
    ft_session_get_stats(s, &ss);
    d->has_w = ss.has_weights;
    d->has_kv = ss.has_kv;
    d->w = ss.weights;
    d->kv = ss.kv;
    d->all = efficiency(prefill_s + decode_s, d->w.io_busy_s, d->w.wait_s, d->kv.io_busy_s, d->kv.wait_s);
    d->mark_w = ss.weights_at_decode;
    d->mark_kv = ss.kv_at_decode;
    {
        const ft_offload_stats *a = &ss.weights_at_decode;
        const ft_kv_offload_stats *b = &ss.kv_at_decode;
        d->prefill = efficiency(prefill_s, a->io_busy_s, a->wait_s, b->io_busy_s, b->wait_s);
        d->decode = efficiency(decode_s, d->w.io_busy_s - a->io_busy_s, d->w.wait_s - a->wait_s,
                               d->kv.io_busy_s - b->io_busy_s, d->kv.wait_s - b->wait_s);
    }
}


void ft_cli_session_report(const ft_cli_session *o, const ft_session *ses, double prefill_s, double decode_s, FILE *f)
{
    report_data d;
    gather(ses, prefill_s, decode_s, &d);
    if ((!d.has_w && !d.has_kv) || !o->stats) return;
    const ft_offload_stats *s = &d.w;
    if (d.has_w) {
        fprintf(f, "offload: resident %.1f MiB, slots %.1f MiB; first start uploaded %.1f MiB, reused %.1f MiB\n",
                mib(s->resident_bytes), mib(s->slot_bytes), mib(s->uploaded_bytes), mib(s->reused_bytes));
        for (int t = FT_TIER_HOST; t < FT_TIER_COUNT; t++)
            if (s->logical_bytes[t])   /* the ratio: the checkpoint's bytes over those moved */
                fprintf(f, "offload: %-6s read %.1f MiB of tensors (%.1f MiB in the checkpoint) as %.1f MiB "
                           "(%.2fx)\n", ft_tier_name((ft_tier)t), mib(s->logical_bytes[t]), mib(s->source_bytes[t]),
                        mib(s->wire_bytes[t]),
                        s->wire_bytes[t] ? (double)s->source_bytes[t] / (double)s->wire_bytes[t] : 0.0);
        const ft_offload *wo = ft_session_offload(ses);
        int entries = 0;
        uint64_t cbytes = 0;
        ft_offload_expert_cache(wo, &entries, &cbytes);
        const ft_model_config *mc = ft_session_config(ses);
        if (entries) {
            ft_expert_stats t;
            memset(&t, 0, sizeof t);
            fprintf(f, "offload: experts: cache of %d experts (%.1f MiB)\n", entries, mib(cbytes));
            for (int l = 0; l < mc->n_layers; l++) {
                ft_expert_stats e;
                if (ft_offload_expert_stats(wo, l, &e) || !e.needed) continue;
                uint64_t str = e.hits + e.misses;
                fprintf(f, "offload: experts layer %3d: needed %llu (resident %llu), hits %llu (%.0f%%, prefetched "
                           "%llu), misses %llu, read %.2f MiB, prefetch accuracy %.0f%% of %llu\n", l,
                        (unsigned long long)e.needed, (unsigned long long)e.resident, (unsigned long long)e.hits,
                        str ? 100.0 * (double)e.hits / (double)str : 0.0, (unsigned long long)e.prefetch_hits,
                        (unsigned long long)e.misses, mib(e.bytes),
                        e.predicted ? 100.0 * (double)e.predicted_used / (double)e.predicted : 0.0,
                        (unsigned long long)e.predicted);
                t.needed += e.needed; t.resident += e.resident; t.hits += e.hits; t.misses += e.misses;
                t.prefetch_hits += e.prefetch_hits; t.bytes += e.bytes; t.predicted += e.predicted;
                t.predicted_used += e.predicted_used;
            }
            uint64_t str = t.hits + t.misses;
            fprintf(f, "offload: experts all layers: needed %llu (resident %llu), hit rate %.1f%% (prefetched %llu), "
                       "misses %llu, read %.2f MiB, prefetch accuracy %.1f%%\n", (unsigned long long)t.needed,
                    (unsigned long long)t.resident, str ? 100.0 * (double)t.hits / (double)str : 0.0,
                    (unsigned long long)t.prefetch_hits, (unsigned long long)t.misses, mib(t.bytes),
                    t.predicted ? 100.0 * (double)t.predicted_used / (double)t.predicted : 0.0);
        }
        const ft_policy *pol = ft_session_policy(ses, NULL);
        if (pol->replicas > 1)
            fprintf(f, "offload: %u replicas: %llu nodes failed over, %llu reads retried on a replica, %llu nodes "
                       "filled again (%.1f MiB)\n", pol->replicas, (unsigned long long)s->failovers,
                    (unsigned long long)(s->retries + d.kv.retries), (unsigned long long)s->repairs,
                    mib(s->repaired_bytes));
    }
    if (d.has_kv) {
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
    fprintf(f, "offload: decode: I/O busy %.3f s, compute waited %.3f s of %.3f s; overlap efficiency %.0f%% "
                   "(slowest resource busy %.3f s); prefill: %.0f%% of %.3f s\n",
                d.w.io_busy_s - d.mark_w.io_busy_s + d.kv.io_busy_s - d.mark_kv.io_busy_s,
                d.w.wait_s - d.mark_w.wait_s + d.kv.wait_s - d.mark_kv.wait_s, decode_s, 100.0 * d.decode.eff,
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

void ft_cli_session_report_json(const ft_cli_session *o, const ft_session *s, double prefill_s, double decode_s, FILE *f)
{
    report_data d;
    gather(s, prefill_s, decode_s, &d);
    (void)o;
    char pol[256];
    double predicted = 0;
    ft_policy_format(ft_session_policy(s, &predicted), pol, sizeof pol);
    fprintf(f, "{\"policy\":\"%s\",", pol);
    if (predicted > 0) fprintf(f, "\"predicted_tok_s\":%.3f,", predicted);
    fprintf(f, "\"weights\":{\"resident_bytes\":%llu,\"slot_bytes\":%llu,\"uploaded_bytes\":%llu,"
               "\"reused_bytes\":%llu,\"layer_fetches\":%llu,\"io_busy_s\":%.4f,\"wait_s\":%.4f,",
            (unsigned long long)d.w.resident_bytes, (unsigned long long)d.w.slot_bytes,
            (unsigned long long)d.w.uploaded_bytes, (unsigned long long)d.w.reused_bytes,
            (unsigned long long)d.w.layers_fetched, d.w.io_busy_s, d.w.wait_s);
    const ft_policy *inforce = ft_session_policy(s, NULL);
    fprintf(f, "\"replicas\":%u,\"failovers\":%llu,\"retries\":%llu,\"repairs\":%llu,\"repaired_bytes\":%llu,"
               "\"failover_fetch_s\":%.4f,\"degraded_fetch_s\":%.4f,\"degraded_fetches\":%llu,",
            inforce->replicas ? inforce->replicas : 1, (unsigned long long)d.w.failovers, (unsigned long long)d.w.retries,
            (unsigned long long)d.w.repairs, (unsigned long long)d.w.repaired_bytes, d.w.failover_fetch_s,
            d.w.degraded_fetch_s, (unsigned long long)d.w.degraded_fetches);
    json_tiers(f, "read_logical_bytes", d.w.logical_bytes);
    fputc(',', f);
    json_tiers(f, "read_wire_bytes", d.w.wire_bytes);
    fputc(',', f);
    json_tiers(f, "read_source_bytes", d.w.source_bytes);
    fprintf(f, "},\"kv_cache\":{\"resident_bytes\":%llu,\"staging_bytes\":%llu,\"fetches\":%llu,"
               "\"prefetch_hits\":%llu,\"io_busy_s\":%.4f,\"wait_s\":%.4f,",
            (unsigned long long)d.kv.resident_bytes, (unsigned long long)d.kv.staging_bytes,
            (unsigned long long)d.kv.fetches, (unsigned long long)d.kv.prefetch_hits, d.kv.io_busy_s, d.kv.wait_s);
    fprintf(f, "\"retries\":%llu,", (unsigned long long)d.kv.retries);
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
    fprintf(f, ",\"prefill_overlap_efficiency\":%.4f,\"decode_overlap_efficiency\":%.4f", d.prefill.eff,
                d.decode.eff);
    /* the expert cache's totals over the layers (--offload-stats' last line) */
    const ft_offload *wo = ft_session_offload(s);
    int entries = 0;
    uint64_t cbytes = 0;
    ft_offload_expert_cache(wo, &entries, &cbytes);
    if (entries) {
        ft_expert_stats t;
        memset(&t, 0, sizeof t);
        for (int l = 0; l < ft_session_config(s)->n_layers; l++) {
            ft_expert_stats e;
            if (ft_offload_expert_stats(wo, l, &e)) continue;
            t.needed += e.needed; t.resident += e.resident; t.hits += e.hits; t.misses += e.misses;
            t.prefetch_hits += e.prefetch_hits; t.bytes += e.bytes; t.predicted += e.predicted;
            t.predicted_used += e.predicted_used;
        }
        uint64_t str = t.hits + t.misses;
        fprintf(f, ",\"experts\":{\"cache_entries\":%d,\"cache_bytes\":%llu,\"needed\":%llu,\"resident\":%llu,"
                   "\"hits\":%llu,\"misses\":%llu,\"prefetch_hits\":%llu,\"read_bytes\":%llu,\"hit_rate\":%.4f,"
                   "\"predicted\":%llu,\"predicted_used\":%llu}", entries, (unsigned long long)cbytes,
                (unsigned long long)t.needed, (unsigned long long)t.resident, (unsigned long long)t.hits,
                (unsigned long long)t.misses, (unsigned long long)t.prefetch_hits, (unsigned long long)t.bytes,
                str ? (double)t.hits / (double)str : 0.0, (unsigned long long)t.predicted,
                (unsigned long long)t.predicted_used);
    }
    fputc('}', f);
}

static const char *placement(const ft_session_stats *g)
{
    if (!g->cuda_stream) return "resident";
    if (g->cuda_sched) {
        switch (g->cuda_codec) {
        case FT_CODEC_Q4: return "tiers-q4";
        case FT_CODEC_Q8: return "tiers-q8";
        case FT_CODEC_BYTEPLANE: return "tiers-bp";
        default: return "tiers-raw";
        }
    }
    switch (g->cuda_codec) {
    case FT_CODEC_Q4: return "host-q4";
    case FT_CODEC_Q8: return "host-q8";
    case FT_CODEC_BYTEPLANE: return "host-bp";
    default: return "host-raw";
    }
}

void ft_cli_cuda_report(const ft_session *ses, FILE *f)
{
    ft_session_stats ss, *g = &ss;
    ft_session_get_stats(ses, &ss);
    ft_cuda_stats s = ss.cuda_stats;
    fprintf(f, "  device     %s (cc %d.%d), weights %s: device %.1f MiB (bf16)", g->device.name, g->device.cc_major,
            g->device.cc_minor, placement(g), (double)(s.weight_bytes + s.slot_bytes) / 1048576.0);
    if (g->cuda_sched)
        fprintf(f, ", streamed by the scheduler: %.1f MiB copied over PCIe in %llu layer loads",
                (double)s.h2d_weight_bytes / 1048576.0, (unsigned long long)s.layers_streamed);
    else if (g->cuda_stream)
        fprintf(f, ", host %.1f MiB pinned, %.1f MiB copied over PCIe in %llu layer loads",
                (double)g->host_weight_bytes / 1048576.0, (double)s.h2d_weight_bytes / 1048576.0,
                (unsigned long long)s.layers_streamed);
    fprintf(f, ", KV cache %.1f MiB\n", (double)s.kv_bytes / 1048576.0);
    if (g->cuda_stream && s.forward_s > 0) {
        /* overlap efficiency: the busier of the two streams (the copies, or
         * compute = the forward time it did not stand idle) over the wall
         * time; 100% when one of them never waited for the other */
        double compute = s.forward_s - (s.stall_s < s.forward_s ? s.stall_s : s.forward_s);
        double busy = s.copy_s > compute ? s.copy_s : compute;
        fprintf(f, "  streaming  %.3f s of forward calls: weight copies and decode busy %.3f s, compute idle "
                "%.3f s waiting for them (overlap efficiency %.0f%%)\n", s.forward_s, s.copy_s, s.stall_s,
                100.0 * (busy < s.forward_s ? busy / s.forward_s : 1.0));
    }
}

void ft_cli_cuda_report_json(const ft_session *ses, FILE *f)
{
    ft_session_stats ss, *g = &ss;
    ft_session_get_stats(ses, &ss);
    ft_cuda_stats s = ss.cuda_stats;
    fprintf(f, ",\"gpu\":\"%s\",\"weights\":\"%s\",\"device_weight_bytes\":%llu,\"host_weight_bytes\":%llu,"
            "\"h2d_weight_bytes\":%llu,\"layers_streamed\":%llu,\"device_kv_bytes\":%llu,"
            "\"stall_s\":%.4f,\"copy_s\":%.4f,\"forward_s\":%.4f",
            g->device.name, placement(g), (unsigned long long)(s.weight_bytes + s.slot_bytes),
            (unsigned long long)g->host_weight_bytes, (unsigned long long)s.h2d_weight_bytes,
            (unsigned long long)s.layers_streamed, (unsigned long long)s.kv_bytes, s.stall_s, s.copy_s,
            s.forward_s);
}

