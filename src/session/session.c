/* The session (include/flextier/session.h): one object that opens a model
 * directory with a device, formats and a policy, plans the policy when
 * asked, places the weights on their tiers, sizes the compute context on
 * demand, generates (tokens or text), and keeps the metrics. Everything a
 * front end used to assemble itself (the CLI, the Python binding) is
 * here, in one place. */
#include "flextier/session.h"
#include "flextier/cuda.h"
#include "flextier/pipe.h"
#include "flextier/train.h"

#include <errno.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

struct ft_session {
    char dir[4096];
    ft_session_params p;
    ft_model *m;
    ft_tokenizer *tok;
    ft_status tok_status;         /* why there is no tokenizer            */
    char tok_error[256];
    ft_policy policy;             /* in force                             */
    double predicted_tps;
    ft_cost_inputs *pin;          /* what the prediction was made from    */
    ft_policy ppol;               /* the policy predicted (the run's batch) */
    int offloaded;                /* a policy: layers on the tiers        */
    ft_offload *wo;
    ft_kv_offload *kvo;
    ft_offload_params op;         /* what the scheduler was created with  */
    /* the compute context: CPU or CUDA */
    ft_ctx *c;
    ft_cuda_ctx *g;
    ft_cuda_host_weights *hw;
    int cuda_stream;              /* CUDA: weights streamed from host      */
    int cuda_sched;               /* CUDA: streamed by the offloading
                                     scheduler from its tiers              */
    ft_cuda_layer_source lsrc;    /* the scheduler as the GPU's weight hook */
    ft_codec_id cuda_codec;
    ft_ctx_params cp;             /* the current context's shape           */
    /* metrics: counters when decoding began */
    int marked;
    ft_offload_stats wmark;
    ft_kv_offload_stats kvmark;
    ft_token_cb user_cb;
    void *user_cb_user;
    /* a pipeline's driver (ft_session_open_pipeline): the stage owns the
     * model and its scheduler (m, wo borrowed), generation goes around
     * the ring */
    ft_pipe_stage *pipe;
    ft_pipe_link *link;
    int micro_batches;
    ft_pipe_gen_stats pipe_stats; /* the last generation's               */
    ft_session_memory mem;        /* the budget and what was counted      */
    ft_lora *lora;                /* adapters applied in every forward     */
    char tmp_disk[FT_URI_MAX - 8]; /* a private disk tier to remove, or "" */
};

void ft_session_default_params(ft_session_params *p)
{
    memset(p, 0, sizeof *p);
    p->weights = FT_WEIGHTS_AS_STORED;
    p->kv_dtype = -1;
    ft_policy_default(&p->policy);
}

static int is_q(int f) { return f == FT_WF_Q8 || f == FT_WF_Q4; }

static double mib(uint64_t b) { return (double)b / 1048576.0; }

/* "512M", "1.5G", "1073741824" (binary units, as the CLI's sizes). */
static int parse_size(const char *v, uint64_t *out)
{
    char *end;
    errno = 0;
    double d = strtod(v, &end);
    if (end == v || errno || d < 0) return -1;
    double mul = 1;
    switch (*end) {
    case 'k': case 'K': mul = 1024.0; end++; break;
    case 'm': case 'M': mul = 1048576.0; end++; break;
    case 'g': case 'G': mul = 1073741824.0; end++; break;
    case 't': case 'T': mul = 1099511627776.0; end++; break;
    default: break;
    }
    if (*end == 'i') end++;
    if (*end == 'B' || *end == 'b') end++;
    if (*end || d * mul >= 1.8e19 || d * mul < 1) return -1;
    *out = (uint64_t)(d * mul);
    return 0;
}

/* The budget: the caller's, FLEXTIER_MEMORY, or the default. */
static ft_status resolve_budget(ft_session *s)
{
    ft_session_memory *m = &s->mem;
    const char *env = getenv("FLEXTIER_MEMORY");
    uint64_t v = s->p.memory;
    if (v == FT_MEMORY_UNLIMITED) {
        snprintf(m->source, sizeof m->source, "unlimited");
        return FT_OK;
    }
    if (v) {
        snprintf(m->source, sizeof m->source, "--memory");
    } else if (env && *env) {
        if (!strcmp(env, "unlimited") || !strcmp(env, "none")) {
            snprintf(m->source, sizeof m->source, "unlimited");
            return FT_OK;
        }
        if (parse_size(env, &v))
            return ft_set_error(FT_ERR_INVALID_ARG, "FLEXTIER_MEMORY='%s': expected a size (512M, 1.5G) or "
                                "'unlimited'", env);
        snprintf(m->source, sizeof m->source, "FLEXTIER_MEMORY");
    }
    if (v) {
        m->budget = m->limit = v;
        m->binding = 1;
        return FT_OK;
    }
    ft_memory_info mi;
    ft_status st = ft_memory_default_budget(&mi);
    if (st) return st;
    m->budget = mi.budget;
    m->limit = mi.limit;
    m->headroom = mi.headroom;
    m->binding = mi.cgroup_version != 0 && mi.limit == mi.cgroup_limit;
    snprintf(m->source, sizeof m->source, "%s", mi.source);
    return FT_OK;
}

/* Bytes no estimate sees below this (the C library's arenas, the
 * generation loop's logits and sampler, thread stacks touched). */
static uint64_t slack_bytes(const ft_model_config *cfg, uint32_t batch)
{
    return (12ull << 20) + 3ull * batch * (uint64_t)cfg->vocab * sizeof(float);
}

/* A private disk tier for AUTO under a budget when none was given:
 * $FLEXTIER_DISK_DIR, $TMPDIR or /var/tmp, never a tmpfs (its files are
 * memory, charged to this process's cgroup). */
static ft_status make_tmp_disk(ft_session *s)
{
    const char *cands[3] = {getenv("FLEXTIER_DISK_DIR"), getenv("TMPDIR"), "/var/tmp"};
    for (int i = 0; i < 3; i++) {
        const char *d = cands[i];
        if (!d || !*d) continue;
        struct statfs fs;
        if (statfs(d, &fs) != 0) continue;
        if ((unsigned long)fs.f_type == 0x01021994ul) {   /* TMPFS_MAGIC */
            FT_LOG(FT_LOG_WARN, "memory budget: %s is a tmpfs (memory): not used for the disk tier", d);
            continue;
        }
        char path[sizeof s->tmp_disk];
        snprintf(path, sizeof path, "%s/flextier-disk-XXXXXX", d);
        if (!mkdtemp(path)) continue;
        snprintf(s->tmp_disk, sizeof s->tmp_disk, "%s", path);
        return FT_OK;
    }
    return ft_set_error(FT_ERR_IO, "no directory for a private disk tier (FLEXTIER_DISK_DIR, TMPDIR, /var/tmp; "
                        "not a tmpfs): give --disk-dir");
}

static void remove_tmp_disk(ft_session *s)
{
    if (!s->tmp_disk[0]) return;
    /* the file: store keeps its frames flat in the directory */
    DIR *d = opendir(s->tmp_disk);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d)))
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) (void)unlinkat(dirfd(d), e->d_name, 0);
        closedir(d);
    }
    if (rmdir(s->tmp_disk))
        FT_LOG(FT_LOG_WARN, "could not remove the private disk tier %s: %s", s->tmp_disk, strerror(errno));
    s->tmp_disk[0] = '\0';
}

static int cache_offloaded(const ft_session *s)
{
    return s->offloaded && s->policy.c_pct[FT_TIER_DEVICE] < 100;
}

/* The matrices' format: the caller's, or the q8/q4 a policy keeps them in. */
static ft_status resolve_weights(ft_session *s, const ft_policy *pol, int offload, int *weights)
{
    const ft_session_params *p = &s->p;
    ft_codec_id cw = pol->compress_weights;
    int w = p->weights;
    if (p->device == FT_DEVICE_CUDA && !s->cuda_sched) {
        /* the CUDA backend packs its device formats from an f32 model */
        if (w != FT_WEIGHTS_AS_STORED && w != FT_WF_F32)
            return ft_set_error(FT_ERR_UNSUPPORTED, "weights %s: the CUDA backend converts the weights itself "
                                "(leave the weight format automatic)", ft_wfmt_name((ft_wfmt)w));
        *weights = FT_WF_F32;
        return FT_OK;
    }
    if (offload && (cw == FT_CODEC_Q8 || cw == FT_CODEC_Q4)) {
        int q = cw == FT_CODEC_Q8 ? FT_WF_Q8 : FT_WF_Q4;
        if (w != FT_WEIGHTS_AS_STORED && w != q)
            return ft_set_error(FT_ERR_INVALID_ARG, "weight compression %s keeps the matrices as %s: it conflicts "
                                "with weights %s", ft_codec_name(cw), ft_wfmt_name((ft_wfmt)q),
                                ft_wfmt_name((ft_wfmt)w));
        w = q;
    } else if (offload && cw == FT_CODEC_BYTEPLANE && is_q(w)) {
        return ft_set_error(FT_ERR_INVALID_ARG, "lossless (byte-plane) weight compression of %s weights: use "
                            "weight compression %s or none", ft_wfmt_name((ft_wfmt)w), ft_wfmt_name((ft_wfmt)w));
    }
    *weights = w;
    return FT_OK;
}

/* The CUDA path's placements: every weight on the GPU; every weight in
 * pinned host memory streamed over PCIe (the backend's own copy); or the
 * weights on the host, disk and memory-node tiers streamed by the same
 * scheduler as on the CPU (ft_cuda_layer_source). The cache on the GPU. */
static ft_status check_cuda(ft_session *s)
{
    char why[512];
    ft_status st = ft_cuda_available(why, sizeof why);
    if (st) return ft_set_error(st, "CUDA device: %s", why);
    const ft_policy *p = &s->policy;
    s->cuda_codec = FT_CODEC_RAW;
    if (s->p.offload == FT_OFFLOAD_NONE) return FT_OK;
    if (s->p.offload == FT_OFFLOAD_AUTO)
        return ft_set_error(FT_ERR_UNSUPPORTED, "CUDA device: automatic policies (--policy auto) are not implemented for the GPU; "
                            "use w=100 (weights on the GPU) or w=0,100 (streamed from host memory)");
    if (p->w_pct[FT_TIER_DEVICE] == 100) s->cuda_stream = 0;
    else if (p->w_pct[FT_TIER_HOST] == 100) s->cuda_stream = 1;
    else if (p->w_pct[FT_TIER_DEVICE] == 0) s->cuda_stream = s->cuda_sched = 1;
    else
        return ft_set_error(FT_ERR_UNSUPPORTED, "CUDA device: weights split between the GPU and other tiers are "
                            "not implemented (w=100: all on the GPU; w=0,...: all streamed from the host, "
                            "disk and remote tiers)");
    if (p->c_pct[FT_TIER_DEVICE] != 100)
        return ft_set_error(FT_ERR_UNSUPPORTED, "CUDA device: the KV cache must be on the device (c=100)");
    if (s->p.device_mem)
        return ft_set_error(FT_ERR_UNSUPPORTED, "CUDA device: a device memory budget is not implemented for the GPU");
    s->cuda_codec = p->compress_weights;
    if (s->cuda_codec != FT_CODEC_RAW && !s->cuda_stream)
        return ft_set_error(FT_ERR_INVALID_ARG, "CUDA device: weight compression needs the weights in host "
                            "memory (w=0,100)");
    return FT_OK;
}

typedef struct { ft_session *s; const char *stage; } prog_ctx;

static void load_progress(void *user, uint64_t done, uint64_t total)
{
    prog_ctx *pc = user;
    pc->s->p.progress(pc->s->p.user, pc->stage, done, total);
}

/* The context the session will create first: what ensure_ctx sizes. */
static void first_ctx(const ft_session *s, const ft_model_config *cfg, int external_kv, ft_ctx_params *cp)
{
    memset(cp, 0, sizeof *cp);
    uint32_t b = s->p.max_batch ? s->p.max_batch : 1;
    size_t dflt = cfg->max_pos < 2048 ? (size_t)cfg->max_pos : 2048;
    size_t q = s->p.max_seq ? s->p.max_seq : dflt;
    /* under a binding budget (explicit, or the cgroup's) a run of known
     * length gets a context of that length (a longer call rebuilds it,
     * checked again) */
    if (!s->p.max_seq && s->mem.binding && s->p.plan_prompt_len && s->p.plan_gen_len)
        q = (size_t)s->p.plan_prompt_len + s->p.plan_gen_len + 1;
    if (q > (size_t)cfg->max_pos) q = (size_t)cfg->max_pos;
    size_t rows = (size_t)b * (s->p.plan_prompt_len ? s->p.plan_prompt_len : 1);
    if (rows < b) rows = b;
    cp->max_batch = (int)b;
    cp->max_seq = (int)q;
    cp->max_rows = (int)rows;
    cp->threads = s->p.threads;
    cp->external_kv = external_kv;
    cp->kv_dtype = external_kv ? FT_F32 : s->p.kv_dtype >= 0 ? (ft_dtype)s->p.kv_dtype : FT_BF16;
}

/* What does not depend on the placement of the layers: the process as it
 * is (binary, libraries, tokenizer), the globals (embeddings, LM head),
 * the context's scratch, the slack; and the layers as held in memory.
 * From a layout-only model: nothing is loaded. */
static ft_status count_fixed(ft_session *s, int weights, ft_model **layout)
{
    ft_load_params lp;
    ft_load_params_default(&lp);
    lp.weights = weights;
    lp.external_layers = FT_LOAD_LAYOUT_ONLY;
    lp.stream_globals = s->mem.streamed;
    lp.stream_drop_cache = s->mem.binding;   /* as the load: a head read past the page cache
                                                counts its second chunk buffer */
    if (s->p.strict) lp.config_flags = FT_CONFIG_STRICT;
    ft_model *lm = NULL;
    ft_status st = ft_model_load(s->dir, &lp, &lm);
    if (st) return st;
    const ft_model_config *cfg = ft_model_get_config(lm);
    ft_session_memory *m = &s->mem;
    ft_model_global_split(lm, &m->embed, &m->head);
    /* the process as its cgroup sees it when it is in a limited one (the
     * page cache of the executable and libraries counts there). Where the
     * cgroup's limit is the budget (or below it), the kernel reclaims the
     * inactive page cache before it fails an allocation: the working set
     * counts (charge less inactive_file). The whole charge counted the
     * checkpoint and library pages calibration and loading had read: 27
     * MiB of a 160 MiB budget on the h1024 model, which then planned 70%
     * of its q4 layers on disk (30 tok/s) where in memory they fit (255).
     * Under a looser cgroup nothing reclaims them: the whole charge. */
    uint64_t rss = ft_process_rss(), cgu = ft_cgroup_memory_usage(), lim = ft_cgroup_memory_limit(NULL);
    if (cgu && lim && lim <= m->budget) cgu = ft_cgroup_memory_working_set();
    m->process = cgu > rss ? cgu : rss;
    m->globals = ft_model_global_bytes(lm);
    m->layers = ft_model_layer_bytes(lm) * (uint64_t)cfg->n_layers;
    ft_ctx_params cp;
    first_ctx(s, cfg, s->p.offload != FT_OFFLOAD_NONE, &cp);
    uint64_t kv = 0, scratch = 0;
    if ((st = ft_ctx_estimate(lm, &cp, &kv, &scratch))) { ft_model_free(lm); return st; }
    if (s->p.work_bytes) {   /* a trainer's working memory, no context */
        kv = 0;
        scratch = s->p.work_bytes;
    }
    m->scratch = scratch + slack_bytes(cfg, (uint32_t)cp.max_batch);
    m->tiers = s->p.offload == FT_OFFLOAD_NONE ? m->layers + kv : 0;
    *layout = lm;
    return FT_OK;
}

static uint64_t fixed_total(const ft_session_memory *m) { return m->process + m->globals + m->scratch; }

/* The refusal, with the numbers. */
static ft_status no_space(const ft_session *s, const char *what, const char *hint)
{
    const ft_session_memory *m = &s->mem;
    /* where the cgroup's charge made the process: say what it holds (a
     * model just copied in a cgroup looser than the budget counts there,
     * and "this process 600 MiB" sent a user looking for a leak) */
    char cg[200] = "";
    uint64_t rss = ft_process_rss();
    if (m->process > rss + (16u << 20))
        snprintf(cg, sizeof cg, ", of which %.1f MiB is page cache charged to its cgroup (files read or written in it "
                 "before: a cgroup whose limit is the budget reclaims it)", mib(m->process - rss));
    return ft_set_error(FT_ERR_NO_SPACE, "memory budget %.1f MiB (%s) cannot hold %s: %.1f MiB = this process "
                        "%.1f MiB (binary, libraries, tokenizer%s) + embeddings and LM head in memory %.1f MiB + "
                        "scratch and activations %.1f MiB + %s %.1f MiB%s%s",
                        mib(m->budget), m->source, what, mib(m->need), mib(m->process), cg, mib(m->globals),
                        mib(m->scratch), s->p.offload == FT_OFFLOAD_NONE ? "weights and KV cache" :
                        "layer weights, slots and KV cache in memory", mib(m->tiers), hint ? "; " : "",
                        hint ? hint : "");
}

/* The cost model's inputs for the check of a given policy: the run's
 * lengths as the first context has them. */
static void run_lengths(const ft_session *s, const ft_model_config *cfg, ft_cost_inputs *in)
{
    ft_ctx_params cp;
    first_ctx(s, cfg, 1, &cp);
    uint32_t pl = s->p.plan_prompt_len ? s->p.plan_prompt_len : 1;
    in->prompt_len = pl;
    in->gen_len = (uint32_t)cp.max_seq > pl ? (uint32_t)cp.max_seq - pl : 1;
}

/* What the budget may leave in the checkpoint file, in order: nothing,
 * the embeddings (a row per token read: nearly free), then the LM head
 * too (its bytes read per step, like a streamed layer's). */
static const unsigned stream_levels[3] = {0, FT_STREAM_EMBED, FT_STREAM_EMBED | FT_STREAM_LM_HEAD};

/* The levels this session may use: a trainer (work_bytes) reads the
 * embeddings and the LM head from memory (flextier/train.h). */
static int stream_levels_n(const ft_session *s) { return s->p.work_bytes ? 1 : 3; }

/* The LM head's bytes read per step when streamed (the embedding matrix
 * when tied). */
static uint64_t head_stream_bytes(const ft_session_memory *m)
{
    if (!(m->streamed & FT_STREAM_LM_HEAD)) return 0;
    return m->head ? m->head : m->embed;
}

static ft_status check_budget_at(ft_session *s, int weights);

/* NONE and POLICY on the CPU: refuse before loading what cannot fit, after
 * leaving the embeddings, then the LM head, in the checkpoint file. */
static ft_status check_budget(ft_session *s, int weights)
{
    ft_status st = FT_OK;
    for (int lv = 0; lv < stream_levels_n(s); lv++) {
        s->mem.streamed = stream_levels[lv];
        st = check_budget_at(s, weights);
        if (st != FT_ERR_NO_SPACE) return st;
    }
    return st;
}

static ft_status check_budget_at(ft_session *s, int weights)
{
    ft_model *lm = NULL;
    ft_status st = count_fixed(s, weights, &lm);
    if (st) return st;
    ft_session_memory *m = &s->mem;
    const ft_model_config *cfg = ft_model_get_config(lm);
    if (s->p.offload == FT_OFFLOAD_POLICY) {
        ft_cost_inputs in;
        memset(&in, 0, sizeof in);
        if ((st = ft_cost_inputs_from_model(lm, &in))) { ft_model_free(lm); return st; }
        run_lengths(s, cfg, &in);
        ft_policy pol = s->policy;
        if (!pol.gpu_batch_size) pol.gpu_batch_size = s->p.max_batch ? s->p.max_batch : 1;
        if (!pol.num_gpu_batches) pol.num_gpu_batches = 1;
        /* an expert cache larger than one layer's (--expert-cache) is
         * memory too */
        if (in.n_experts && s->p.expert_cache_bytes && in.expert_bytes[pol.compress_weights])
            in.expert_cache = s->p.expert_cache_bytes / in.expert_bytes[pol.compress_weights];
        ft_cost_estimate e;
        ft_cost_predict(&in, &pol, &e);
        m->tiers = e.mem_process;
    }
    m->need = fixed_total(m) + m->tiers;
    ft_model_free(lm);
    if (m->need > m->budget)
        return no_space(s, s->p.offload == FT_OFFLOAD_NONE ? "the model in memory" : "this policy",
                        s->p.offload == FT_OFFLOAD_NONE
                            ? "offload it: --policy auto (with --disk-dir DIR or memory nodes), or a larger --memory"
                            : "put more of the weights or cache on disk or memory nodes, or plan with --policy auto");
    return FT_OK;
}

/* --device cuda: what this process holds in host memory for the GPU,
 * refused before loading when the budget cannot hold it. The KV cache and
 * the activations live on the GPU (device_mem's); here: the model as the
 * backend packs it (f32 layers and globals, kept for a larger context
 * later), the pinned copy it streams from (w=0,100: raw bf16, or the
 * q8/q4 frames), or, with the scheduler (w=0,...), the layers' host-tier
 * share in their stored format. */
static ft_status check_budget_cuda(ft_session *s, int weights)
{
    ft_model *lm = NULL;
    ft_status st = count_fixed(s, weights, &lm);
    if (st) return st;
    ft_session_memory *m = &s->mem;
    const ft_model_config *cfg = ft_model_get_config(lm);
    m->scratch = slack_bytes(cfg, s->p.max_batch ? s->p.max_batch : 1);
    ft_model_free(lm);
    uint64_t pinned = 0;
    if (s->cuda_sched) {
        m->tiers = m->layers / 100 * s->policy.w_pct[FT_TIER_HOST];
    } else {
        if (s->cuda_stream) {   /* bits per f32 value of the layers: 16 raw, 8.5 q8, 4.5 q4 (groups of 64) */
            double bits = s->cuda_codec == FT_CODEC_Q8 ? 8.5 : s->cuda_codec == FT_CODEC_Q4 ? 4.5 : 16.0;
            pinned = (uint64_t)((double)m->layers * bits / 32.0);
        }
        m->tiers = m->layers + pinned;
    }
    m->need = fixed_total(m) + m->tiers;
    if (m->need <= m->budget) return FT_OK;
    return ft_set_error(FT_ERR_NO_SPACE, "memory budget %.1f MiB (%s) cannot hold what --device cuda keeps in "
                        "host memory: %.1f MiB = this process %.1f MiB + embeddings and LM head %.1f MiB + %s "
                        "%.1f MiB + slack %.1f MiB; %s", mib(m->budget), m->source, mib(m->need), mib(m->process),
                        mib(m->globals),
                        s->cuda_sched ? "the layers' host-tier share" :
                        s->cuda_stream ? "the f32 model and its pinned copy for streaming" : "the f32 model it uploads",
                        mib(m->tiers), mib(m->scratch),
                        s->cuda_sched && s->policy.w_pct[FT_TIER_HOST] == 0 ? "a larger --memory"
                        : s->cuda_sched ? "put more of the weights on disk or memory nodes (--policy w=0,0,100 --disk-dir "
                                          "DIR), or a larger --memory"
                                      : "stream the weights from disk instead (--policy w=0,0,100 --disk-dir DIR), or a "
                                        "larger --memory");
}

static void keep_inputs(ft_session *s, const ft_cost_inputs *in, const ft_policy *p);

/* Under a budget: per level of streamed globals (stream_levels), what
 * the budget leaves the tiers after this process as measured now, the
 * globals and the scratch (cap[lv]; 0: the fixed part does not fit).
 * Returns the first level that fits (the most in memory), -1 if none. */
static int budget_caps(ft_session *s, int weights, int nlv, uint64_t cap[3], ft_status *st)
{
    int lv0 = -1;
    *st = FT_OK;
    for (int lv = nlv - 1; lv >= 0; lv--) {
        ft_model *lm = NULL;
        cap[lv] = 0;
        s->mem.streamed = stream_levels[lv];
        if ((*st = count_fixed(s, weights, &lm))) return -1;
        ft_model_free(lm);
        uint64_t fixed = fixed_total(&s->mem);
        /* a margin for what the estimates do not see (allocator
         * rounding and arenas, thread stacks, pages the cgroup charges
         * late): 2% of the budget, at least 4 MiB. Without it a budget
         * equal to the model's size planned every weight into memory
         * and the context's 3.3 MiB then did not fit beside 311.8 MiB
         * held (cli_memory). */
        uint64_t slack = s->mem.budget / 50 > (4u << 20) ? s->mem.budget / 50 : (4u << 20);
        if (fixed >= s->mem.budget) continue;
        cap[lv] = s->mem.budget - fixed > slack ? s->mem.budget - fixed - slack : 1;
        lv0 = lv;
    }
    return lv0;
}

/* The refusal when no level's fixed part fits the budget (budget_caps
 * returned -1), with the numbers of the smallest: everything streamed
 * that can be. */
static ft_status fixed_part_refused(ft_session *s, int weights, int nlv, const char *what)
{
    ft_model *lm = NULL;
    s->mem.streamed = stream_levels[nlv - 1];
    ft_status st = count_fixed(s, weights, &lm);
    if (st) return st;
    ft_model_free(lm);
    s->mem.need = fixed_total(&s->mem);
    return no_space(s, what, "give a larger --memory");
}

/* The calibration both plan() and predict_given() run: the session's
 * cache, threads and run shape, for `batch` sequences and these codecs. */
static void calib_params(const ft_session *s, uint32_t batch, unsigned codecs, ft_calibrate_params *cp)
{
    const ft_session_params *p = &s->p;
    ft_calibrate_default_params(cp);
    cp->base = &s->policy;
    cp->device_mem = p->device_mem;
    cp->batch = batch;
    cp->prompt_len = p->plan_prompt_len ? p->plan_prompt_len : 128;
    cp->gen_len = p->plan_gen_len ? p->plan_gen_len : 32;
    cp->threads = p->threads;
    cp->decode_threads = p->decode_threads;
    cp->codecs = codecs;
    cp->recalibrate = p->recalibrate;
    cp->drop_cache = s->mem.binding;
}

static ft_status plan(ft_session *s, int weights)
{
    const ft_session_params *p = &s->p;
    ft_cost_inputs in;
    memset(&in, 0, sizeof in);
    if (p->progress) p->progress(p->user, "plan", 0, 0);
    ft_status st = ft_cost_inputs_load(s->dir, weights, &in);
    if (st) return st;
    /* Lossless unless asked: q8/q4 weights or cache only when the caller
     * allows lossy formats or names one (codec masks, the policy's cw= /
     * cc=, q8/q4 weights). */
    ft_codec_id bcw = s->policy.compress_weights, bcc = s->policy.compress_cache;
    unsigned codecs = p->weight_codecs;
    if (!codecs) {
        if (bcw != FT_CODEC_RAW) codecs = 1u << bcw;
        else if (is_q(p->weights))   /* weights already q8/q4: raw frames of them, or the same codec */
            codecs = (1u << FT_CODEC_RAW) | (1u << (p->weights == FT_WF_Q8 ? FT_CODEC_Q8 : FT_CODEC_Q4));
        else
            codecs = (1u << FT_CODEC_RAW) | (1u << FT_CODEC_BYTEPLANE) | (p->allow_lossy ? 1u << FT_CODEC_Q4 : 0);
    }
    unsigned ccodecs = p->cache_codecs ? p->cache_codecs
                     : bcc != FT_CODEC_RAW ? 1u << bcc
                     : (1u << FT_CODEC_RAW) | (p->allow_lossy ? 1u << FT_CODEC_Q4 : 0);
    /* Under a memory budget: the device and host tiers share what the
     * budget leaves after the process, the globals and the scratch, and
     * the disk tier is what does not fit. The embeddings and then the LM
     * head are placed like layers: in memory while it holds them, else
     * read from the checkpoint file (stream_levels). */
    int budgeted = s->mem.budget && p->device == FT_DEVICE_CPU;
    uint64_t cap[3] = {0, 0, 0};
    int lv0 = 0, nlv = budgeted ? stream_levels_n(s) : 1;
    if (budgeted) {
        lv0 = budget_caps(s, weights, nlv, cap, &st);
        if (st) return st;
        if (lv0 < 0)
            return fixed_part_refused(s, weights, nlv, nlv == 3 ? "the model's fixed part (with the embeddings "
                                      "and LM head read from the checkpoint)" : "the model's fixed part (a "
                                      "trainer's working memory; the embeddings and LM head in memory)");
        in.proc_cap = cap[lv0];
        if (!s->policy.disk_uri[0] && !s->policy.n_remotes) {
            if ((st = make_tmp_disk(s))) return st;
            snprintf(s->policy.disk_uri, sizeof s->policy.disk_uri, "file:%s", s->tmp_disk);
        }
    }
    ft_calibrate_params cp;
    calib_params(s, p->max_batch ? p->max_batch : 1, codecs | ccodecs, &cp);
    cp.memory = in.proc_cap;
    if ((st = ft_calibrate(s->dir, &cp, &in))) return st;
    if (budgeted) {
        /* Calibration's buffers are freed but glibc keeps them in its
         * arenas, where they count in this process's RSS (20.8 -> 47 MiB
         * after a --recalibrate of a small model, which then ran 20 MiB
         * over a 160 MiB budget): hand them back, and plan with what the
         * process holds now. */
#ifdef __GLIBC__
        malloc_trim(0);
#endif
        int lv1 = budget_caps(s, weights, nlv, cap, &st);
        if (st) return st;
        if (lv1 < 0) return fixed_part_refused(s, weights, nlv, "the model's fixed part after calibration");
        if (lv1 > lv0) lv0 = lv1;
    }
    ft_policy best;
    ft_cost_estimate e;
    int chosen = -1;
    for (int lv = lv0; lv < nlv; lv++) {
        if (budgeted && !cap[lv]) continue;
        ft_policy cand;
        ft_cost_estimate ce;
        s->mem.streamed = stream_levels[lv];
        if (budgeted) {
            in.proc_cap = cap[lv];
            in.head_stream_bytes = head_stream_bytes(&s->mem);
        }
        st = ft_plan(&in, &s->policy, cp.batch, 1, codecs, ccodecs, FT_CACHE_TIERS, &cand, &ce);
        if (st == FT_ERR_NO_SPACE && budgeted) continue;
        if (st) return st;
        /* a later level only for a better prediction (ties: more in memory) */
        if (chosen < 0 || ce.decode_tps > e.decode_tps) {
            best = cand;
            e = ce;
            chosen = lv;
        }
        /* every weight in memory: nothing to gain by streaming more */
        if (cand.w_pct[FT_TIER_DISK] == 0 && cand.w_pct[FT_TIER_REMOTE] == 0) break;
    }
    if (chosen < 0) {
        /* the smallest working set: everything streamed from the disk tier */
        ft_policy minp = s->policy;
        memset(minp.w_pct, 0, sizeof minp.w_pct);
        memset(minp.c_pct, 0, sizeof minp.c_pct);
        memset(minp.a_pct, 0, sizeof minp.a_pct);
        minp.a_pct[FT_TIER_DEVICE] = 100;
        int far = s->policy.disk_uri[0] ? FT_TIER_DISK : FT_TIER_REMOTE;
        minp.w_pct[far] = minp.c_pct[far] = 100;
        minp.gpu_batch_size = cp.batch;
        minp.num_gpu_batches = 1;
        minp.compress_weights = minp.compress_cache = FT_CODEC_RAW;
        s->mem.streamed = stream_levels[nlv - 1];
        ft_model *lm = NULL;
        if ((st = count_fixed(s, weights, &lm))) return st;
        ft_model_free(lm);
        ft_cost_predict(&in, &minp, &e);
        s->mem.tiers = e.mem_process;
        s->mem.need = fixed_total(&s->mem) + s->mem.tiers;
        return no_space(s, "the minimum working set (every layer and the KV cache streamed: two layer slots and "
                        "the cache's staging; the embeddings and LM head read from the checkpoint)",
                        "give a larger --memory");
    }
    s->mem.streamed = stream_levels[chosen];
    if (budgeted) {   /* the fixed part of the level chosen */
        ft_model *lm = NULL;
        if ((st = count_fixed(s, weights, &lm))) return st;
        ft_model_free(lm);
        in.proc_cap = cap[chosen];
    }
    s->policy = best;
    s->predicted_tps = e.decode_tps;
    in.head_stream_bytes = budgeted ? head_stream_bytes(&s->mem) : 0;
    keep_inputs(s, &in, &best);
    if (in.proc_cap) {
        s->mem.tiers = e.mem_process;
        s->mem.need = fixed_total(&s->mem) + s->mem.tiers;
    }
    /* the private disk tier is kept only if the plan uses it */
    if (s->tmp_disk[0] && best.w_pct[FT_TIER_DISK] == 0 && best.c_pct[FT_TIER_DISK] == 0) {
        remove_tmp_disk(s);
        s->policy.disk_uri[0] = '\0';
    }
    return FT_OK;
}

/* Keep what a prediction was made from (ft_session_predict_at). */
static void keep_inputs(ft_session *s, const ft_cost_inputs *in, const ft_policy *p)
{
    if (!s->pin) s->pin = malloc(sizeof *s->pin);
    if (!s->pin) return;   /* only the re-prediction is lost */
    *s->pin = *in;
    s->ppol = *p;
}

/* POLICY with `predict`: calibrate as plan() does (the same cache, the
 * same run shape) and predict the given policy's decode tok/s, with the
 * embeddings and LM head where check_budget left them. */
static ft_status predict_given(ft_session *s, int weights)
{
    const ft_session_params *p = &s->p;
    ft_cost_inputs in;
    memset(&in, 0, sizeof in);
    if (p->progress) p->progress(p->user, "plan", 0, 0);
    ft_status st = ft_cost_inputs_load(s->dir, weights, &in);
    if (st) return st;
    /* the engine computes the run's whole batch at once on the CPU */
    ft_policy pol = s->policy;
    uint32_t batch = p->max_batch ? p->max_batch : 1;
    if (!pol.gpu_batch_size || !pol.num_gpu_batches || pol.gpu_batch_size * pol.num_gpu_batches != batch) {
        pol.gpu_batch_size = batch;
        pol.num_gpu_batches = 1;
    }
    ft_calibrate_params cp;
    calib_params(s, pol.gpu_batch_size * pol.num_gpu_batches,
                 (1u << pol.compress_weights) | (1u << pol.compress_cache), &cp);
    /* calibration's own buffers within what the budget leaves */
    if (s->mem.budget && s->mem.budget != FT_MEMORY_UNLIMITED)
        cp.memory = s->mem.budget > s->mem.need + (16u << 20) ? s->mem.budget - s->mem.need : 16u << 20;
    if ((st = ft_calibrate(s->dir, &cp, &in))) return st;
    in.head_stream_bytes = head_stream_bytes(&s->mem);
    if (in.n_experts && p->expert_cache_bytes && in.expert_bytes[pol.compress_weights])
        in.expert_cache = p->expert_cache_bytes / in.expert_bytes[pol.compress_weights];
    ft_cost_estimate e;
    ft_cost_predict(&in, &pol, &e);
    s->predicted_tps = e.decode_tps;
    keep_inputs(s, &in, &pol);
    return FT_OK;
}

ft_status ft_session_predict_at(const ft_session *s, double cpu_share, double *tps)
{
    if (!s || !tps) return ft_set_error(FT_ERR_INVALID_ARG, "session: NULL argument");
    if (!s->pin) return ft_set_error(FT_ERR_INVALID_ARG, "session: no prediction was made (--policy auto, or predict)");
    if (!(cpu_share > 0 && cpu_share <= 1)) return ft_set_error(FT_ERR_INVALID_ARG, "session: CPU share %g", cpu_share);
    ft_cost_inputs *in = malloc(sizeof *in);
    if (!in) return ft_set_error(FT_ERR_NOMEM, "session: allocation");
    *in = *s->pin;
    if (in->cpu_share > 0) {
        ft_cost_rescale_cpu(in, in->cpu_share / cpu_share);
        in->handoff_s *= in->cpu_share / cpu_share;   /* a time slice of the others' as well */
    }
    in->cpu_share = cpu_share;
    ft_cost_estimate e;
    ft_cost_predict(in, &s->ppol, &e);
    free(in);
    *tps = e.decode_tps;
    return FT_OK;
}

/* The adapters into one engine set, in order (each PEFT directory's
 * modules with its alpha / r times the user's scale). */
static ft_status load_adapters(ft_session *s, const ft_session_lora *ls, size_t n)
{
    ft_status st = ft_lora_create(s->m, &s->lora);
    for (size_t i = 0; i < n && !st; i++) {
        ft_peft_adapter *a = NULL;
        if (!ls[i].dir) return ft_set_error(FT_ERR_INVALID_ARG, "session: adapter %zu has no directory", i + 1);
        st = ft_peft_adapter_read(ls[i].dir, &a);
        if (!st) st = ft_peft_adapter_apply(a, ls[i].scale, s->lora);
        ft_peft_adapter_free(a);
        if (st) {
            char msg[512];
            snprintf(msg, sizeof msg, "%s", ft_last_error());
            return ft_set_error(st, "adapter %s: %s", ls[i].dir, msg);
        }
    }
    return st;
}

ft_status ft_session_open(const char *model_dir, const ft_session_params *params, ft_session **out)
{
    if (!model_dir || !out) return ft_set_error(FT_ERR_INVALID_ARG, "session: NULL argument");
    ft_session_params defaults;
    if (!params) {
        ft_session_default_params(&defaults);
        params = &defaults;
    }
    if (params->device != FT_DEVICE_CPU && params->device != FT_DEVICE_CUDA)
        return ft_set_error(FT_ERR_INVALID_ARG, "session: device %d", (int)params->device);
    if (params->kv_dtype != -1 && params->kv_dtype != FT_F32 && params->kv_dtype != FT_BF16 &&
        params->kv_dtype != FT_F16)
        return ft_set_error(FT_ERR_INVALID_ARG, "session: KV cache dtype %d (f32, bf16 or f16)", params->kv_dtype);
    if ((unsigned)params->offload > FT_OFFLOAD_AUTO)
        return ft_set_error(FT_ERR_INVALID_ARG, "session: offload mode %d", (int)params->offload);
    if (strlen(model_dir) >= sizeof ((ft_session *)0)->dir)
        return ft_set_error(FT_ERR_INVALID_ARG, "session: model directory path too long");
    ft_session *s = calloc(1, sizeof *s);
    if (!s) return ft_set_error(FT_ERR_NOMEM, "session: allocation");
    snprintf(s->dir, sizeof s->dir, "%s", model_dir);
    s->p = *params;
    s->policy = params->policy;
    ft_status st = FT_OK;
    int weights = FT_WEIGHTS_AS_STORED;
    prog_ctx pc_load = {s, "load"}, pc_place = {s, "place"};

    if (s->p.offload == FT_OFFLOAD_NONE &&
        (s->policy.n_remotes || s->policy.disk_uri[0] || s->policy.compress_weights != FT_CODEC_RAW ||
         s->policy.compress_cache != FT_CODEC_RAW)) {
        st = ft_set_error(FT_ERR_INVALID_ARG, "session: memory nodes, a disk tier or compression given "
                          "without an offloading policy");
        goto fail;
    }
    if (s->p.offload == FT_OFFLOAD_POLICY && (st = ft_policy_validate(&s->policy))) goto fail;
    s->p.lora = NULL;   /* read below from params; the caller's array is not kept */
    if (params->n_lora && !params->lora) {
        st = ft_set_error(FT_ERR_INVALID_ARG, "session: %zu adapters but no list", params->n_lora);
        goto fail;
    }
    if (params->n_lora && s->p.device == FT_DEVICE_CUDA) {
        st = ft_set_error(FT_ERR_UNSUPPORTED, "session: LoRA adapters are applied by the CPU backend only (the CUDA "
                          "backend has no adapter op: merge them with `flextier export --merge-lora` and run the "
                          "merged model)");
        goto fail;
    }
    if (s->p.device == FT_DEVICE_CUDA && (st = check_cuda(s))) goto fail;
    /* the memory budget of this process (the GPU's own memory is
     * device_mem's) */
    if ((st = resolve_budget(s))) goto fail;
    /* The tokenizer first: its memory is part of the process the budget
     * counts. It is optional for token-level use (benchmarks on random
     * ids); a broken one is an error now, a missing one when text is
     * asked for. */
    s->tok_status = ft_tokenizer_load_dir_ex(s->dir, s->p.strict ? FT_TOKENIZER_STRICT : 0, &s->tok);
    if (s->tok_status == FT_ERR_NOT_FOUND) {
        snprintf(s->tok_error, sizeof s->tok_error, "%s", ft_last_error());
    } else if (s->tok_status) {
        st = s->tok_status;
        goto fail;
    }
    /* the format decides what the planner measures; a planned q8/q4 policy
     * re-resolves it below */
    if ((st = resolve_weights(s, &s->policy, s->p.offload == FT_OFFLOAD_POLICY, &weights))) goto fail;
    if (s->p.offload == FT_OFFLOAD_AUTO) {
        if ((st = plan(s, weights))) goto fail;
        if ((st = resolve_weights(s, &s->policy, 1, &weights))) goto fail;
    } else if (s->mem.budget && s->p.device == FT_DEVICE_CPU && (st = check_budget(s, weights))) {
        goto fail;
    } else if (s->mem.budget && s->p.device == FT_DEVICE_CUDA && (st = check_budget_cuda(s, weights))) {
        goto fail;
    }
    if (s->p.offload == FT_OFFLOAD_POLICY && s->p.predict && s->p.device == FT_DEVICE_CPU &&
        (st = predict_given(s, weights)))
        goto fail;

    ft_load_params lp;
    ft_load_params_default(&lp);
    lp.weights = weights;
    lp.stream_globals = s->mem.streamed;
    lp.stream_drop_cache = s->mem.binding;
    if (s->p.strict) lp.config_flags = FT_CONFIG_STRICT;
    if (s->p.progress) {
        lp.progress = load_progress;
        lp.user = &pc_load;
    }
    /* the CUDA path with every weight on the GPU or in host memory streams
     * from its own pinned copy: it loads in memory */
    s->offloaded = s->p.offload != FT_OFFLOAD_NONE && (s->p.device == FT_DEVICE_CPU || s->cuda_sched);
    if (s->offloaded) {
        lp.external_layers = 1;
        if ((st = ft_model_load(s->dir, &lp, &s->m))) goto fail;
        ft_offload_default_params(&s->op);
        s->op.policy = s->policy;
        s->op.device_budget = s->p.device_mem;
        s->op.drop_cache = s->mem.binding;
        s->op.token_file = s->p.token_file;
        s->op.decode_threads = s->p.decode_threads ? s->p.decode_threads : ft_default_threads();
        if (s->p.failover_ms) s->op.failover_ms = s->p.failover_ms;
        s->op.expert_cache_bytes = s->p.expert_cache_bytes;
        s->op.expert_evict = s->p.expert_evict;
        s->op.expert_prefetch = s->p.expert_prefetch;
        if (s->p.progress) {
            s->op.progress = load_progress;
            s->op.user = &pc_place;
        }
        if ((st = ft_offload_create(s->m, s->dir, &s->op, &s->wo))) goto fail;
        s->op.progress = NULL;
        s->op.user = NULL;
    } else {
        if ((st = ft_model_load(s->dir, &lp, &s->m))) goto fail;
    }
    if (params->n_lora && (st = load_adapters(s, params->lora, params->n_lora))) goto fail;
    if (s->lora) {   /* counted as model-wide tensors (the budget was checked before they were read) */
        s->mem.globals += ft_lora_bytes(s->lora);
        s->mem.need += ft_lora_bytes(s->lora);
    }
    ft_clear_error();
    *out = s;
    return FT_OK;
fail:
    ft_session_close(s);
    return st;
}

ft_status ft_session_open_pipeline(const char *model_dir, const ft_session_params *params, ft_pipe_stage *driver,
                                   ft_pipe_link *link, int micro_batches, ft_session **out)
{
    if (!model_dir || !driver || !out) return ft_set_error(FT_ERR_INVALID_ARG, "session: NULL argument");
    if (strlen(model_dir) >= sizeof ((ft_session *)0)->dir)
        return ft_set_error(FT_ERR_INVALID_ARG, "session: model directory path too long");
    ft_session_params defaults;
    if (!params) {
        ft_session_default_params(&defaults);
        params = &defaults;
    }
    if (params->device != FT_DEVICE_CPU)
        return ft_set_error(FT_ERR_UNSUPPORTED, "session: a pipeline's stages compute on the CPU");
    if (params->offload == FT_OFFLOAD_AUTO)
        return ft_set_error(FT_ERR_UNSUPPORTED, "session: automatic policies are not planned for pipeline stages: "
                            "give each stage's policy");
    if (micro_batches < 0) return ft_set_error(FT_ERR_INVALID_ARG, "session: %d micro-batches", micro_batches);
    if (params->n_lora)
        return ft_set_error(FT_ERR_UNSUPPORTED, "session: LoRA adapters are not implemented over a pipeline (the "
                            "stages hold the layers: merge them with `flextier export --merge-lora`)");
    ft_session *s = calloc(1, sizeof *s);
    if (!s) return ft_set_error(FT_ERR_NOMEM, "session: allocation");
    snprintf(s->dir, sizeof s->dir, "%s", model_dir);
    s->p = *params;
    s->pipe = driver;
    s->link = link;
    s->micro_batches = micro_batches;
    s->m = ft_pipe_stage_model(driver);
    s->wo = ft_pipe_stage_offload(driver);
    s->offloaded = s->wo != NULL;
    s->policy = params->policy;
    if (!s->offloaded) ft_policy_default(&s->policy);
    s->tok_status = ft_tokenizer_load_dir_ex(s->dir, s->p.strict ? FT_TOKENIZER_STRICT : 0, &s->tok);
    if (s->tok_status == FT_ERR_NOT_FOUND) {
        snprintf(s->tok_error, sizeof s->tok_error, "%s", ft_last_error());
    } else if (s->tok_status) {
        ft_status st = s->tok_status;
        ft_session_close(s);
        return st;
    }
    ft_clear_error();
    *out = s;
    return FT_OK;
}

static void free_ctx(ft_session *s)
{
    ft_kv_offload_free(s->kvo);
    s->kvo = NULL;
    ft_ctx_free(s->c);
    s->c = NULL;
    ft_cuda_ctx_free(s->g);
    s->g = NULL;
    memset(&s->cp, 0, sizeof s->cp);
}

void ft_session_close(ft_session *s)
{
    if (!s) return;
    free_ctx(s);
    ft_lora_free(s->lora);
    ft_cuda_host_weights_free(s->hw);
    if (!s->pipe) {   /* a pipeline stage's model and scheduler are the stage's */
        ft_offload_free(s->wo);
        ft_model_free(s->m);
    }
    ft_tokenizer_free(s->tok);
    remove_tmp_disk(s);
    free(s->pin);
    free(s);
}

void ft_session_get_memory(const ft_session *s, ft_session_memory *out)
{
    memset(out, 0, sizeof *out);
    if (!s) return;
    *out = s->mem;
    snprintf(out->disk_dir, sizeof out->disk_dir, "%s", s->tmp_disk);
}

const ft_model_config *ft_session_config(const ft_session *s) { return s ? ft_model_get_config(s->m) : NULL; }
const ft_model *ft_session_model(const ft_session *s) { return s ? s->m : NULL; }
const ft_tokenizer *ft_session_tokenizer(const ft_session *s) { return s ? s->tok : NULL; }

const ft_policy *ft_session_policy(const ft_session *s, double *predicted_tps)
{
    if (!s) return NULL;
    if (predicted_tps) *predicted_tps = s->predicted_tps;
    return &s->policy;
}

void ft_session_default_sampling(const ft_session *s, ft_sampling *out)
{
    memset(out, 0, sizeof *out);
    const ft_model_config *cfg = ft_model_get_config(s->m);
    if (cfg->gen_do_sample) {
        out->temperature = cfg->gen_temperature > 0 ? cfg->gen_temperature : 1.0f;
        out->top_k = cfg->gen_top_k;
        out->top_p = cfg->gen_top_p;
    }
    out->repetition_penalty = cfg->gen_repetition_penalty;
}

/* A context of at least this shape (rebuilt when a call needs more: the
 * sequences' caches are lost then). */
static ft_status ensure_ctx(ft_session *s, size_t batch, size_t seq, size_t rows, int all_logits)
{
    const ft_model_config *cfg = ft_model_get_config(s->m);
    if ((s->c || s->g) && (size_t)s->cp.max_batch >= batch && (size_t)s->cp.max_seq >= seq &&
        (size_t)s->cp.max_rows >= rows && (s->cp.all_logits || !all_logits))
        return FT_OK;
    ft_ctx_params cp = s->cp;
    size_t b = batch, q = seq;
    if (!s->c && !s->g) {   /* first: at least what the session was opened for */
        ft_ctx_params fc;
        first_ctx(s, cfg, 0, &fc);
        if ((size_t)fc.max_batch > b) b = (size_t)fc.max_batch;
        if ((size_t)fc.max_seq > q) q = (size_t)fc.max_seq;
    }
    if ((size_t)cp.max_batch > b) b = (size_t)cp.max_batch;
    if ((size_t)cp.max_seq > q) q = (size_t)cp.max_seq;
    if (q > (size_t)cfg->max_pos) {
        if (seq > (size_t)cfg->max_pos)
            return ft_set_error(FT_ERR_NO_SPACE, "%zu positions exceed the model's context (max_position_embeddings "
                                "= %d in %s/config.json)", seq, cfg->max_pos, s->dir);
        q = (size_t)cfg->max_pos;
    }
    if (b > 65536) return ft_set_error(FT_ERR_INVALID_ARG, "%zu sequences in one batch (at most 65536)", b);
    size_t r = rows > (size_t)cp.max_rows ? rows : (size_t)cp.max_rows;
    if (r < b) r = b;
    if (r > (1u << 24)) return ft_set_error(FT_ERR_INVALID_ARG, "%zu tokens in one call (at most 16M)", r);
    free_ctx(s);
    memset(&cp, 0, sizeof cp);
    cp.max_batch = (int)b;
    cp.max_seq = (int)q;
    cp.max_rows = (int)r;
    cp.all_logits = all_logits || s->cp.all_logits;
    cp.threads = s->p.threads;
    cp.external_kv = cache_offloaded(s);
    if (cp.external_kv && s->p.kv_dtype >= 0 && s->p.kv_dtype != FT_F32)
        return ft_set_error(FT_ERR_INVALID_ARG, "KV cache dtype %s: the policy offloads the KV cache, which is "
                            "stored as its cache compression says (none: f32 rows)",
                            ft_dtype_name((ft_dtype)s->p.kv_dtype));
    cp.kv_dtype = cp.external_kv ? FT_F32 : s->p.kv_dtype >= 0 ? (ft_dtype)s->p.kv_dtype : FT_BF16;
    ft_status st;
    if (s->mem.budget && s->p.device == FT_DEVICE_CPU) {
        /* the process now, plus this context and the KV offloader's share
         * of the cache (what it will hold in memory). Placement's freed
         * buffers go back first (glibc keeps them in its arenas, in the
         * RSS). Under a cgroup whose limit is the budget the kernel
         * reclaims clean page cache before it fails an allocation: what
         * it cannot reclaim counts (under make test's load the check
         * once counted 122 MiB held of a 128.5 MiB budget, where quiet
         * runs hold 87 and the run fits: RSS or active page cache, the
         * message did not say; FLEXTIER_LOG=debug now does); under a
         * looser one, the working set, as at open. */
#ifdef __GLIBC__
        malloc_trim(0);
#endif
        uint64_t lim = ft_cgroup_memory_limit(NULL);
        int at_limit = lim && lim <= s->mem.budget;
        uint64_t kv = 0, scratch = 0, rss = ft_process_rss();
        uint64_t cgu = at_limit ? ft_cgroup_memory_unreclaimable() : ft_cgroup_memory_working_set();
        uint64_t now = cgu > rss ? cgu : rss;
        FT_LOG(FT_LOG_DEBUG, "memory: before the context: resident %.1f MiB, cgroup %.1f MiB (%s)", mib(rss),
               mib(cgu), at_limit ? "less its clean page cache" : "less its inactive page cache");
        if ((st = ft_ctx_estimate(s->m, &cp, &kv, &scratch))) return st;
        uint64_t cache = 0;
        if (cp.external_kv) {
            const ft_model_config *c = ft_model_get_config(s->m);
            double row = 2.0 * c->n_kv_heads * c->head_dim * 4.0, stored = row;
            if (s->policy.compress_cache == FT_CODEC_Q8) stored = row / 4.0 * (1.0 + 4.0 / 64);
            if (s->policy.compress_cache == FT_CODEC_Q4) stored = row / 8.0 * (1.0 + 8.0 / 64);
            double inmem = (s->policy.c_pct[FT_TIER_DEVICE] * row + s->policy.c_pct[FT_TIER_HOST] * stored) / 100.0;
            cache = (uint64_t)(inmem * (double)c->n_layers * (double)b * (double)q +
                               2.0 * (double)b * (100.0 - s->policy.c_pct[FT_TIER_DEVICE]) / 100.0 * (double)q * row);
        }
        /* what is still to come: the logits, the sampler (the rest of the
         * slack counted at open is in `now` by now) */
        uint64_t need = now + kv + scratch + cache + (4ull << 20) + 3ull * b * (uint64_t)cfg->vocab * sizeof(float);
        if (need > s->mem.budget)
            return ft_set_error(FT_ERR_NO_SPACE, "memory budget %.1f MiB (%s): a context for %zu sequences of %zu "
                                "positions needs KV cache %.1f MiB + scratch %.1f MiB + offloaded cache in memory "
                                "%.1f MiB beside the %.1f MiB this process holds (resident %.1f, its cgroup %.1f)",
                                mib(s->mem.budget), s->mem.source, b, q, mib(kv), mib(scratch), mib(cache), mib(now),
                                mib(rss), mib(cgu));
    }
    if (s->p.device == FT_DEVICE_CUDA) {
        ft_cuda_ctx_params gp;
        memset(&gp, 0, sizeof gp);
        gp.max_batch = cp.max_batch;
        gp.max_seq = cp.max_seq;
        gp.max_rows = cp.max_rows;
        gp.all_logits = cp.all_logits;
        if (s->cuda_sched) {
            s->lsrc.hook = ft_offload_hook;
            s->lsrc.user = s->wo;
            s->lsrc.model = s->m;
            gp.stream_weights = 1;
            gp.hook = ft_cuda_layer_source_hook;
            gp.hook_user = &s->lsrc;
            ft_offload_reset_stats(s->wo);
        } else if (s->cuda_stream) {
            if (!s->hw) {
                ft_cuda_host_weights_params hp = {s->cuda_codec, 0, -1, s->p.threads};
                if ((st = ft_cuda_host_weights_create(s->m, &hp, &s->hw))) return st;
            }
            gp.stream_weights = 1;
            gp.hook = ft_cuda_host_weights_hook;
            gp.hook_user = s->hw;
        }
        if ((st = ft_cuda_ctx_create(s->m, &gp, &s->g))) return st;
        s->cp = cp;
        return FT_OK;
    }
    if ((st = ft_ctx_create(s->m, &cp, &s->c))) return st;
    if (s->lora && (st = ft_ctx_set_lora(s->c, s->lora))) {
        ft_ctx_free(s->c);
        s->c = NULL;
        return st;
    }
    if (s->wo) {
        ft_ctx_set_layer_hook(s->c, ft_offload_hook, s->wo);
        ft_offload_reset_stats(s->wo);
    }
    if (cp.external_kv) {
        ft_kv_offload_params kp;
        ft_kv_offload_default_params(&kp);
        kp.policy = s->policy;
        kp.max_batch = cp.max_batch;
        kp.max_seq = cp.max_seq;
        kp.token_file = s->p.token_file;
        kp.failover_ms = s->p.failover_ms;
        kp.drop_cache = s->mem.binding;
        if (s->p.device_mem) {   /* what the weights left of the budget */
            ft_offload_stats w;
            memset(&w, 0, sizeof w);
            if (s->wo) ft_offload_get_stats(s->wo, &w);
            uint64_t used = w.resident_bytes + w.slot_bytes;
            kp.device_budget = used < s->p.device_mem ? s->p.device_mem - used : 1;
        }
        if ((st = ft_kv_offload_create(s->m, &kp, &s->kvo))) {
            ft_ctx_free(s->c);
            s->c = NULL;
            return st;
        }
        ft_kv_hooks h;
        ft_kv_offload_hooks(s->kvo, &h);
        ft_ctx_set_kv_hooks(s->c, &h);
    }
    s->cp = cp;
    return FT_OK;
}

ft_status ft_session_forward(ft_session *s, size_t n, const int *slots, const int32_t *const *tokens,
                             const size_t *ntok, float *logits, int all_rows)
{
    if (!s || !slots || !tokens || !ntok || !n) return ft_set_error(FT_ERR_INVALID_ARG, "forward: NULL argument");
    if (s->pipe)
        return ft_set_error(FT_ERR_UNSUPPORTED, "forward: a pipeline's driver holds the last stage only (logits of "
                            "every position are not implemented over a pipeline; generate instead)");
    size_t rows = 0, seq = 0;
    int maxslot = 0;
    for (size_t j = 0; j < n; j++) {
        rows += ntok[j];
        if (slots[j] > maxslot) maxslot = slots[j];
        /* a context that holds these slots keeps their caches */
        size_t have = s->c ? (size_t)ft_ctx_seq_len(s->c, slots[j]) : 0;
        if (have + ntok[j] > seq) seq = have + ntok[j];
    }
    if (maxslot < 0) return ft_set_error(FT_ERR_INVALID_ARG, "forward: negative slot");
    ft_status st = ensure_ctx(s, (size_t)maxslot + 1, seq, rows, all_rows);
    if (st) return st;
    return s->g ? ft_cuda_ctx_forward(s->g, n, slots, tokens, ntok, logits, all_rows)
                : ft_ctx_forward(s->c, n, slots, tokens, ntok, logits, all_rows);
}

void ft_session_reset(ft_session *s)
{
    if (!s) return;
    for (int j = 0; j < s->cp.max_batch; j++) {
        if (s->c) ft_ctx_reset(s->c, j);
        if (s->g) ft_cuda_ctx_reset(s->g, j);
    }
}

ft_status ft_session_reserve(ft_session *s, size_t batch, size_t seq, size_t rows)
{
    if (!s || !batch || !seq) return ft_set_error(FT_ERR_INVALID_ARG, "reserve: NULL session or an empty shape");
    if (s->pipe) return ft_set_error(FT_ERR_UNSUPPORTED, "reserve: a pipeline's stages were sized when the ring was built");
    return ensure_ctx(s, batch, seq, rows ? rows : batch + seq, 0);
}

void ft_session_capacity(const ft_session *s, int *batch, int *seq, int *rows)
{
    if (batch) *batch = s && (s->c || s->g) ? s->cp.max_batch : 0;
    if (seq) *seq = s && (s->c || s->g) ? s->cp.max_seq : 0;
    if (rows) *rows = s && (s->c || s->g) ? s->cp.max_rows : 0;
}

int ft_session_slot_len(const ft_session *s, int slot)
{
    if (!s) return 0;
    return s->g ? ft_cuda_ctx_seq_len(s->g, slot) : s->c ? ft_ctx_seq_len(s->c, slot) : 0;
}

void ft_session_slot_reset(ft_session *s, int slot)
{
    if (!s) return;
    if (s->c) ft_ctx_reset(s->c, slot);
    if (s->g) ft_cuda_ctx_reset(s->g, slot);
}

static ft_status check_slot(const ft_session *s, int slot)
{
    if (!s) return ft_set_error(FT_ERR_INVALID_ARG, "slot: NULL session");
    if (!s->c && !s->g) return ft_set_error(FT_ERR_INVALID_ARG, "slot %d: no context yet (ft_session_reserve)", slot);
    if (slot < 0 || slot >= s->cp.max_batch)
        return ft_set_error(FT_ERR_INVALID_ARG, "slot %d out of range (%d slots)", slot, s->cp.max_batch);
    return FT_OK;
}

ft_status ft_session_slot_truncate(ft_session *s, int slot, int len)
{
    ft_status st = check_slot(s, slot);
    if (st) return st;
    if (s->g) {
        int have = ft_cuda_ctx_seq_len(s->g, slot);
        if (len == 0) { ft_cuda_ctx_reset(s->g, slot); return FT_OK; }
        if (len == have) return FT_OK;
        return ft_set_error(FT_ERR_UNSUPPORTED, "slot %d: truncating a GPU context's cache is not implemented", slot);
    }
    return ft_ctx_truncate(s->c, slot, len);
}

ft_status ft_session_slot_copy(ft_session *s, int src, int dst, int len)
{
    ft_status st = check_slot(s, src);
    if (!st) st = check_slot(s, dst);
    if (st) return st;
    if (s->g) return ft_set_error(FT_ERR_UNSUPPORTED, "slot copy: not implemented for a GPU context");
    return ft_ctx_copy_prefix(s->c, src, dst, len);
}

ft_status ft_session_slot_kv_layout(const ft_session *s, ft_dtype *dtype, size_t *row_bytes)
{
    if (!s || (!s->c && !s->g)) return ft_set_error(FT_ERR_INVALID_ARG, "slot KV: no context yet");
    if (s->g || s->cp.external_kv)
        return ft_set_error(FT_ERR_UNSUPPORTED, "slot KV rows: only an in-memory CPU cache gives them");
    const ft_model_config *cfg = ft_model_get_config(s->m);
    ft_dtype dt = ft_ctx_kv_dtype(s->c);
    if (dtype) *dtype = dt;
    if (row_bytes) *row_bytes = (size_t)cfg->n_kv_heads * (size_t)cfg->head_dim * (ft_dtype_bits(dt) / 8);
    return FT_OK;
}

ft_status ft_session_slot_kv_rows(ft_session *s, int slot, int len, void *buf, size_t cap, int import,
                                  int rows_in_buf)
{
    ft_status st = check_slot(s, slot);
    if (st) return st;
    if (s->g) return ft_set_error(FT_ERR_UNSUPPORTED, "slot KV rows: not implemented for a GPU context");
    return ft_ctx_kv_rows(s->c, slot, len, buf, cap, import, rows_in_buf);
}

static void mark(ft_session *s)
{
    if (s->marked) return;
    if (s->wo) ft_offload_get_stats(s->wo, &s->wmark);
    if (s->kvo) ft_kv_offload_get_stats(s->kvo, &s->kvmark);
    s->marked = 1;
}

/* The first generated token marks the start of decoding. */
static int mark_cb(void *user, size_t seq, int32_t token)
{
    ft_session *s = user;
    mark(s);
    return s->user_cb ? s->user_cb(s->user_cb_user, seq, token) : 0;
}

ft_status ft_session_generate(ft_session *s, size_t n, const int32_t *const *prompts, const size_t *prompt_len,
                              const ft_gen_params *gp, int32_t *const *out, size_t *n_out, ft_gen_stats *stats)
{
    if (!s || !prompts || !prompt_len || !gp || !out || !n_out || !n)
        return ft_set_error(FT_ERR_INVALID_ARG, "generate: NULL argument or no prompt");
    size_t seq = 0, rows = 0;
    for (size_t j = 0; j < n; j++) {
        if (prompt_len[j] + gp->max_new_tokens > seq) seq = prompt_len[j] + gp->max_new_tokens;
        rows += prompt_len[j];
    }
    /* a pipeline's stages were sized when the ring was built */
    ft_status st = s->pipe ? FT_OK : ensure_ctx(s, n, seq, rows, 0);
    if (st) return st;
    ft_gen_params g = *gp;
    s->user_cb = gp->on_token;
    s->user_cb_user = gp->user;
    g.on_token = mark_cb;
    g.user = s;
    s->marked = 0;
    ft_gen_stats local;
    if (s->pipe) {
        ft_pipe_gen_opts po;
        memset(&po, 0, sizeof po);
        po.micro_batches = s->micro_batches;
        po.timeout_ms = 600000;   /* per message: a stage that hangs ends the run */
        ft_pipe_gen_stats ps;
        st = ft_pipe_generate(s->pipe, s->link, n, prompts, prompt_len, &g, &po, out, n_out, &ps);
        if (!st) {
            if (stats) *stats = ps.gen;
            s->pipe_stats = ps;
        }
        mark(s);
        return st;
    }
    st = s->g ? ft_cuda_generate(s->g, n, prompts, prompt_len, &g, out, n_out, stats ? stats : &local)
              : ft_generate(s->c, n, prompts, prompt_len, &g, out, n_out, stats ? stats : &local);
    mark(s);   /* a run without a decode step */
    return st;
}

/* ---------------------------------------------------------------- text */

typedef struct {
    ft_session *s;
    const ft_text_params *tp;
    ft_detok **dt;
    char **text;
    size_t *len, *cap, *shown;
    ft_status err;
} text_run;

static int text_append(text_run *r, size_t j, const char *b, size_t n)
{
    if (r->len[j] + n + 1 > r->cap[j]) {
        size_t nc = (r->cap[j] + n + 1) * 2;
        char *t = realloc(r->text[j], nc);
        if (!t) return -1;
        r->text[j] = t;
        r->cap[j] = nc;
    }
    memcpy(r->text[j] + r->len[j], b, n);
    r->len[j] += n;
    r->text[j][r->len[j]] = 0;
    return 0;
}

/* The i-th stop string of the call (0: `stop`, then `stops`), NULL/"": none. */
static const char *stop_str(const ft_text_params *tp, size_t i)
{
    return i == 0 ? tp->stop : tp->stops ? tp->stops[i - 1] : NULL;
}

/* Cut at the first stop string and hand on what is settled (text that
 * could still be the start of a stop string is held back). 1: stop. */
static int text_settle(text_run *r, size_t j, int final)
{
    const ft_text_params *tp = r->tp;
    int stopped = 0;
    size_t hold = 0;
    if (!r->text[j]) return 0;
    for (size_t i = 0; i <= tp->n_stops; i++) {
        const char *stop = stop_str(tp, i);
        if (!stop || !*stop) continue;
        char *p = strstr(r->text[j], stop);
        if (p && (size_t)(p - r->text[j]) < r->len[j]) {
            r->len[j] = (size_t)(p - r->text[j]);
            *p = 0;
            stopped = 1;
        }
        if (strlen(stop) - 1 > hold) hold = strlen(stop) - 1;
    }
    if (stopped || final) hold = 0;
    size_t upto = r->len[j] > hold ? r->len[j] - hold : 0;
    if (upto > r->shown[j]) {
        size_t from = r->shown[j];
        r->shown[j] = upto;
        if (r->tp->on_text && r->tp->on_text(r->tp->user, j, r->text[j] + from, upto - from)) stopped = 1;
    }
    return stopped;
}

static int text_token(void *user, size_t j, int32_t tok)
{
    text_run *r = user;
    if (r->tp->gen.on_token && r->tp->gen.on_token(r->tp->gen.user, j, tok)) return 1;
    char buf[256];
    size_t w = 0;
    ft_status st = ft_detok_push(r->dt[j], tok, buf, sizeof buf, &w);
    if (st) { r->err = st; return 1; }
    if (w && text_append(r, j, buf, w)) { r->err = ft_set_error(FT_ERR_NOMEM, "generated text"); return 1; }
    return text_settle(r, j, 0);
}

ft_status ft_session_generate_text(ft_session *s, size_t n, const char *const *prompts, const ft_text_params *tp,
                                   char **out_text, ft_gen_stats *stats)
{
    if (!s || !prompts || !tp || !n) return ft_set_error(FT_ERR_INVALID_ARG, "generate: NULL argument or no prompt");
    if (!s->tok)
        return ft_set_error(s->tok_status ? s->tok_status : FT_ERR_NOT_FOUND, "generate text: the model has no "
                            "tokenizer (%s)", s->tok_error[0] ? s->tok_error : "not loaded");
    const ft_model_config *cfg = ft_model_get_config(s->m);
    ft_status st = FT_OK;
    int32_t **ids = calloc(n, sizeof *ids), **outs = calloc(n, sizeof *outs);
    size_t *plen = calloc(n, sizeof *plen), *nout = calloc(n, sizeof *nout);
    text_run r = {s, tp, calloc(n, sizeof(ft_detok *)), calloc(n, sizeof(char *)), calloc(n, sizeof(size_t)),
                  calloc(n, sizeof(size_t)), calloc(n, sizeof(size_t)), FT_OK};
    if (!ids || !outs || !plen || !nout || !r.dt || !r.text || !r.len || !r.cap || !r.shown) {
        st = ft_set_error(FT_ERR_NOMEM, "generate: allocation");
        goto done;
    }
    for (size_t j = 0; j < n && st == FT_OK; j++) {
        if (!prompts[j]) { st = ft_set_error(FT_ERR_INVALID_ARG, "generate: prompt %zu is NULL", j); break; }
        if ((st = ft_tokenizer_encode(s->tok, prompts[j], strlen(prompts[j]), !tp->no_special, &ids[j], &plen[j])))
            break;
        if (!plen[j]) { st = ft_set_error(FT_ERR_INVALID_ARG, "generate: prompt %zu encodes to no tokens", j + 1); break; }
        for (size_t k = 0; k < plen[j]; k++)
            if (ids[j][k] < 0 || ids[j][k] >= cfg->vocab) {
                st = ft_set_error(FT_ERR_CORRUPT, "the tokenizer gives id %d, outside the model's vocab_size %d",
                                  (int)ids[j][k], cfg->vocab);
                break;
            }
        if (st) break;
        if (!(outs[j] = malloc((tp->gen.max_new_tokens + 1) * sizeof(int32_t))))
            st = ft_set_error(FT_ERR_NOMEM, "generate: allocation");
        else st = ft_detok_create(s->tok, 1, &r.dt[j]);
    }
    if (st) goto done;
    ft_gen_params g = tp->gen;
    g.on_token = text_token;
    g.user = &r;
    st = ft_session_generate(s, n, (const int32_t *const *)ids, plen, &g, outs, nout, stats);
    if (!st && r.err) st = r.err;
    if (st) goto done;
    for (size_t j = 0; j < n; j++) {
        char buf[256];
        size_t w = 0;
        if (!ft_detok_flush(r.dt[j], buf, sizeof buf, &w) && w && text_append(&r, j, buf, w)) {
            st = ft_set_error(FT_ERR_NOMEM, "generated text");
            goto done;
        }
        text_settle(&r, j, 1);
    }
    if (out_text)
        for (size_t j = 0; j < n; j++) {
            out_text[j] = r.text[j] ? r.text[j] : calloc(1, 1);
            r.text[j] = NULL;
            if (!out_text[j]) {
                for (size_t k = 0; k < j; k++) { free(out_text[k]); out_text[k] = NULL; }
                st = ft_set_error(FT_ERR_NOMEM, "generated text");
                goto done;
            }
        }
done:
    for (size_t j = 0; j < n; j++) {
        if (ids) free(ids[j]);
        if (outs) free(outs[j]);
        if (r.dt) ft_detok_free(r.dt[j]);
        if (r.text) free(r.text[j]);
    }
    free(ids); free(outs); free(plen); free(nout);
    free(r.dt); free(r.text); free(r.len); free(r.cap); free(r.shown);
    return st;
}

/* ------------------------------------------------------------- metrics */

const ft_offload *ft_session_offload(const ft_session *s)
{
    if (!s) return NULL;
    if (s->pipe) return ft_pipe_stage_offload(s->pipe);
    return s->wo;
}

void ft_session_get_stats(const ft_session *s, ft_session_stats *out)
{
    memset(out, 0, sizeof *out);
    if (!s) return;
    out->has_weights = s->wo != NULL;
    out->has_kv = s->kvo != NULL;
    if (s->wo) ft_offload_get_stats(s->wo, &out->weights);
    if (s->kvo) ft_kv_offload_get_stats(s->kvo, &out->kv);
    out->weights_at_decode = s->marked ? s->wmark : out->weights;
    out->kv_at_decode = s->marked ? s->kvmark : out->kv;
    out->weight_bytes = ft_model_weight_bytes(s->m);
    out->kv_bytes = s->c ? ft_ctx_kv_bytes(s->c) : 0;
    out->kv_dtype = s->cp.kv_dtype;
    if (s->pipe) {   /* the driver's stage: its layers' cache */
        out->kv_bytes = ft_pipe_stage_kv_bytes(s->pipe);
        out->kv_dtype = (ft_dtype)ft_pipe_stage_get_params(s->pipe)->kv_dtype;
        out->pipe_stages = ft_pipe_stage_get_params(s->pipe)->n_stages;
        out->pipe_micro_batches = s->pipe_stats.micro_batches;
        out->pipe_messages = s->pipe_stats.messages;
    }
    if (s->p.device == FT_DEVICE_CUDA) {
        out->cuda = 1;
        out->cuda_stream = s->cuda_stream;
        out->cuda_sched = s->cuda_sched;
        out->cuda_codec = s->cuda_codec;
        ft_cuda_device_info_get(0, &out->device);
        if (s->g) ft_cuda_ctx_get_stats(s->g, &out->cuda_stats);
        out->host_weight_bytes = ft_cuda_host_weights_bytes(s->hw);
    }
}

void ft_session_reset_stats(ft_session *s)
{
    if (!s) return;
    if (s->wo) ft_offload_reset_stats(s->wo);
    if (s->kvo) ft_kv_offload_reset_stats(s->kvo);
    s->marked = 0;
}
