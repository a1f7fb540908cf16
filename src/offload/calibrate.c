/* Measuring what the cost model needs (include/flextier/offload.h):
 * memory bandwidth, the engine's own times per compute format on
 * zero-weight copies of the model (FlexGen fits its constants from real
 * runs the same way), what making a fetched frame usable costs per weight
 * codec, and the read bandwidth of the disk tier and of a memory node. */
#include "flextier/offload.h"
#include "flextier/model.h"
#include "flextier/store.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int cmp_dbl(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, size_t n)
{
    qsort(v, n, sizeof *v, cmp_dbl);
    return n ? v[n / 2] : 0;
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
    return 2.0 * (double)n / median(t, 3);   /* read + write */
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
    ft_synth_weights(FT_BF16, n, 4096, 77, w);
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
        in->decode_bw[c] = used / median(tm, 3);
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
            bw = (double)n / median(tm, 3);
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
            decb[nl] = median(tb, 5);
            dec1[nl] = median(t1, 5);
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

ft_status ft_cost_inputs_load(const char *dir, int weights, ft_cost_inputs *in)
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

void ft_calibrate_default_params(ft_calibrate_params *p)
{
    memset(p, 0, sizeof *p);
    p->batch = 1;
    p->prompt_len = 128;
    p->gen_len = 32;
    p->codecs = (1u << FT_CODEC_BYTEPLANE) | (1u << FT_CODEC_Q8) | (1u << FT_CODEC_Q4);
}

ft_status ft_calibrate(const char *dir, const ft_calibrate_params *cp, ft_cost_inputs *in)
{
    if (!dir || !cp || !cp->base || !in) return ft_set_error(FT_ERR_INVALID_ARG, "calibrate: NULL argument");
    const ft_policy *base = cp->base;
    const double *given = cp->given_bw;
    uint32_t batch = cp->batch ? cp->batch : 1, plen = cp->prompt_len ? cp->prompt_len : 1;
    unsigned threads = cp->threads, codec_mask = cp->codecs;
    in->prompt_len = plen;
    in->gen_len = cp->gen_len;
    in->cap[FT_TIER_DEVICE] = cp->device_mem ? cp->device_mem : UINT64_MAX;
    if (!in->cap[FT_TIER_HOST]) in->cap[FT_TIER_HOST] = UINT64_MAX;
    in->cap[FT_TIER_DISK] = base->disk_uri[0] ? (in->cap[FT_TIER_DISK] ? in->cap[FT_TIER_DISK] : UINT64_MAX) : 0;
    in->cap[FT_TIER_REMOTE] = base->n_remotes ? (in->cap[FT_TIER_REMOTE] ? in->cap[FT_TIER_REMOTE] : UINT64_MAX) : 0;
    in->n_remotes = base->n_remotes;
    in->remote_local = base->n_remotes > 0;
    for (uint32_t r = 0; r < base->n_remotes; r++)
        if (!uri_is_loopback(base->remotes[r])) in->remote_local = 0;
    /* a codec agent decodes on its own core (the planner charges it there) */
    in->agent_cores = base->n_remotes && !strncmp(base->remotes[0], "agent://", 8) ? 1 : 0;
    FT_LOG(FT_LOG_INFO, "plan: measuring memory, the engine and the codecs");
    in->mem_bw = measure_mem_bw();
    /* The engine's speed with each compute format the codecs imply:
     * none/bp compute on the weights' format, q8/q4 on their own. */
    unsigned wm = codec_mask | (1u << FT_CODEC_RAW);
    ft_status st = FT_OK;
    for (int c = 0; c < FT_CODEC_COUNT && st == FT_OK; c++) {
        if (!(wm & (1u << c)) || c == FT_CODEC_BYTEPLANE) continue;
        if (c != FT_CODEC_RAW && c != FT_CODEC_Q8 && c != FT_CODEC_Q4) continue;
        ft_wfmt f = c == FT_CODEC_Q8 ? FT_WF_Q8 : c == FT_CODEC_Q4 ? FT_WF_Q4 : in->weights_fmt;
        st = measure_engine(dir, batch, plen, threads, f, &in->timing[c]);
    }
    if (st) return st;
    in->timing[FT_CODEC_BYTEPLANE] = in->timing[FT_CODEC_RAW];
    /* sustained flop/s for the analytic fallback: the engine's own prefill */
    double tp = in->timing[FT_CODEC_RAW].layer_prefill_s_per_token;
    in->flops = tp > 0 ? 2.0 * (double)in->layer_params / tp : 1e10;
    in->bw[FT_TIER_HOST] = given && given[FT_TIER_HOST] > 0 ? given[FT_TIER_HOST] : in->mem_bw / 2;
    measure_codecs(in, codec_mask | (1u << FT_CODEC_RAW));
    /* Compute and the I/O workers share the cores. */
    in->cores = ft_usable_cpus();   /* affinity and cgroup CPU quota */
    in->compute_threads = threads ? threads : ft_default_threads();
    in->decode_threads = cp->decode_threads ? cp->decode_threads : ft_default_threads();
    if (base->disk_uri[0])
        in->bw[FT_TIER_DISK] = given && given[FT_TIER_DISK] > 0 ? given[FT_TIER_DISK] : measure_store_bw(base->disk_uri);
    if (base->n_remotes) {
        if (given && given[FT_TIER_REMOTE] > 0) in->bw[FT_TIER_REMOTE] = given[FT_TIER_REMOTE];
        else {
            FT_LOG(FT_LOG_INFO, "plan: measuring the link to %s", base->remotes[0]);
            in->bw[FT_TIER_REMOTE] = measure_store_bw(base->remotes[0]);
            if (in->bw[FT_TIER_REMOTE] <= 0)
                return ft_set_error(FT_ERR_NET, "cannot measure the link to %s", base->remotes[0]);
        }
    }
    return FT_OK;
}
