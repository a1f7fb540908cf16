/* FlexGen-style cost model and a grid-search planner.
 *
 * Per layer and decode step, one block (ngb GPU batches of gbs sequences)
 * is computed while the next layer's weights and the next batch's cache
 * stream in. The step time of a layer is the maximum of the busy times of
 * the resources that work in parallel: the compute device (ngb batches of
 * matrix products and attention, plus decoding of compressed tensors where
 * the device's cores do it), and every link (host, disk, each remote node)
 * carrying its share of weights (once per block) and cache (per batch),
 * and a codec agent's cores when the remote tier goes through one.
 * FlexGen's LP has the same structure; a 10% grid over placements finds
 * its optimum within the grid step. */
#include "flextier/offload.h"
#include "offload_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Stored bytes of a frame per byte computed on: byte-plane's ratio; 1 for
 * frames computed on in place. */
static double stored_per_byte(const ft_cost_inputs *in, ft_codec_id c)
{
    if (c != FT_CODEC_BYTEPLANE) return 1.0;
    double r = in->ratio[c];
    return r > 0 ? 1.0 / r : 1.0;
}

/* The KV cache is stored as f32 rows or q8/q4 groups of kv_group values
 * along head_dim, each with 4 bytes of fp16 min and step (ft_qrow_*). */
static double cache_ratio(const ft_cost_inputs *in, ft_codec_id c)
{
    double g = in->kv_group ? in->kv_group : 64;
    if (c == FT_CODEC_Q4) return 32.0 / (4.0 + 32.0 / g);
    if (c == FT_CODEC_Q8) return 32.0 / (8.0 + 32.0 / g);
    return 1.0;
}

static double codec_decode_bw(const ft_cost_inputs *in, ft_codec_id c)
{
    double d = in->decode_bw[c];
    return d > 0 ? d : INFINITY;
}

/* Bytes per parameter as computed on, when no per-tensor sizes are given. */
static double bytes_per_param(const ft_cost_inputs *in, ft_codec_id c)
{
    ft_wfmt f = c == FT_CODEC_Q8 ? FT_WF_Q8 : c == FT_CODEC_Q4 ? FT_WF_Q4 : in->weights_fmt;
    switch (f) {
    case FT_WF_Q8: return 1.0 + 4.0 / 64;
    case FT_WF_Q4: return 0.5 + 4.0 / 64;
    case FT_WF_BF16: case FT_WF_F16: return 2.0;
    default: return 4.0;
    }
}

/* Linear in the batch between the two measured points (clamped at 0). */
static double interp(const ft_cost_timing *tm, const double *t, double b)
{
    double b0 = tm->batch[0], b1 = tm->batch[1];
    if (b1 <= b0) return t[1];
    double v = t[0] + (t[1] - t[0]) * (b - b0) / (b1 - b0);
    return v > 0 ? v : 0;
}

/* A mixture of experts' layer (issue 23): the dense tensors then every
 * expert placed one by one as the scheduler does (ft_policy_place); what
 * the tiers hold (Cst) and what a decode step of B rows reads (C): the
 * dense part, and of the experts those selected (probability
 * 1 - (1 - k/E)^B each, uniform routing), streamed ones found in the
 * expert cache with probability `hit`. */
static int moe_place(const ft_cost_inputs *in, const ft_policy *p, double B, double *C, double *Cst,
                     ft_cost_estimate *out)
{
    const ft_codec_id cw = p->compress_weights;
    size_t n = in->n_tensors + in->n_experts;
    uint64_t *bytes = malloc(n * sizeof *bytes);
    ft_tier *tiers = malloc(n * sizeof *tiers);
    if (!bytes || !tiers) { free(bytes); free(tiers); return 0; }
    for (uint32_t i = 0; i < in->n_tensors; i++) bytes[i] = in->tensor_bytes[cw][i];
    for (uint32_t e = 0; e < in->n_experts; e++) bytes[in->n_tensors + e] = in->expert_bytes[cw];
    ft_policy_place(p, bytes, n, tiers);
    double xn[FT_TIER_COUNT] = {0};
    for (size_t i = 0; i < n; i++) {
        Cst[tiers[i]] += (double)bytes[i];
        if (i < in->n_tensors) C[tiers[i]] += (double)bytes[i];
        else xn[tiers[i]] += 1;
    }
    free(bytes);
    free(tiers);
    const double E = in->n_experts, k = in->experts_used, eb = (double)in->expert_bytes[cw];
    double act = 1.0 - pow(1.0 - (k < E ? k : E) / E, B);
    /* streamed: everything but the device tier and host frames used in
     * place (host byte-plane frames are decoded into the cache) */
    int bp = cw == FT_CODEC_BYTEPLANE;
    double streamed = xn[FT_TIER_DISK] + xn[FT_TIER_REMOTE] + (bp ? xn[FT_TIER_HOST] : 0);
    double entries = in->expert_cache ? (double)in->expert_cache : E;
    double hit = streamed > 0 ? fmin(1.0, entries / (in->n_layers * streamed)) : 1.0;
    if (streamed > 0 && in->expert_hit_rate > 0) hit = fmin(1.0, in->expert_hit_rate);   /* measured */
    double fetch = 0;
    for (int t = 0; t < FT_TIER_COUNT; t++) {
        int fetched = t == FT_TIER_DISK || t == FT_TIER_REMOTE || (bp && t == FT_TIER_HOST);
        double x = xn[t] * eb * act * (fetched ? 1.0 - hit : 1.0);
        C[t] += x;
        if (fetched) fetch += x;
    }
    out->expert_hit = streamed > 0 ? hit : 0;
    out->expert_fetch_bytes = fetch;
    out->expert_cache_mem = streamed > 0 ? fmin(entries, in->n_layers * streamed) * eb : 0;
    return 1;
}

/* When the cores are shared fairly: every runnable thread gets the same
 * share of a core, min(1, cores / runnable threads), as Linux's scheduler
 * gives threads of equal weight. Returns when the last group is done. */
double ft_cost_fair_share(double cores, const ft_fs_group *g, int n)
{
    enum { MAXG = 8 };
    double rem[MAXG], t = 0;
    int done[MAXG];
    if (n > MAXG) n = MAXG;
    for (int i = 0; i < n; i++) {
        rem[i] = g[i].work > 0 && isfinite(g[i].work) ? g[i].work : 0;
        done[i] = !(rem[i] > 0) || !(g[i].threads > 0);
    }
    for (int step = 0; step < 2 * MAXG; step++) {   /* a group ends per step */
        double nrun = 0, dt = INFINITY;
        int run[MAXG];
        for (int i = 0; i < n; i++) {
            run[i] = !done[i] && (g[i].after < 0 || g[i].after >= n || done[g[i].after]);
            if (run[i]) nrun += g[i].threads;
        }
        if (nrun <= 0) break;
        double share = fmin(1.0, cores / nrun);
        for (int i = 0; i < n; i++)
            if (run[i]) dt = fmin(dt, rem[i] / share);
        for (int i = 0; i < n; i++)
            if (run[i] && (rem[i] -= dt * share) <= 1e-9 * dt) done[i] = 1;
        t += dt;
    }
    return t;
}

void ft_cost_predict(const ft_cost_inputs *in, const ft_policy *p, ft_cost_estimate *out)
{
    memset(out, 0, sizeof *out);
    const double L = in->n_layers;
    const double gbs = p->gpu_batch_size, ngb = p->num_gpu_batches, B = gbs * ngb;
    const double P = (double)in->layer_params;
    const double s_avg = in->prompt_len + 0.5 * in->gen_len;
    const double s_max = (double)in->prompt_len + in->gen_len;
    const double kv = (double)in->kv_bytes_per_token;
    const ft_codec_id cw = p->compress_weights;
    const int bp = cw == FT_CODEC_BYTEPLANE;
    const double spb = stored_per_byte(in, cw), rc = cache_ratio(in, p->compress_cache);
    const double dw = codec_decode_bw(in, cw), dc = codec_decode_bw(in, p->compress_cache);
    /* Per tier: bytes of one layer as computed on (C) and as stored (S). */
    double C[FT_TIER_COUNT] = {0}, c[FT_TIER_COUNT], Cst[FT_TIER_COUNT] = {0};
    for (int t = 0; t < FT_TIER_COUNT; t++) c[t] = p->c_pct[t] / 100.0;
    int moe = in->n_experts && in->n_tensors && in->n_tensors <= FT_COST_MAX_TENSORS;
    if (moe && moe_place(in, p, B, C, Cst, out)) {
        /* C: what a decode step reads; Cst: what the tiers hold */
    } else if (in->n_tensors && in->n_tensors <= FT_COST_MAX_TENSORS) {
        /* Whole tensors, placed as the scheduler places them. */
        uint64_t bytes[FT_COST_MAX_TENSORS];
        ft_tier tiers[FT_COST_MAX_TENSORS];
        for (uint32_t i = 0; i < in->n_tensors; i++) bytes[i] = in->tensor_bytes[cw][i];
        ft_policy_place(p, bytes, in->n_tensors, tiers);
        for (uint32_t i = 0; i < in->n_tensors; i++) C[tiers[i]] += (double)bytes[i];
    } else {
        for (int t = 0; t < FT_TIER_COUNT; t++) C[t] = P * bytes_per_param(in, cw) * p->w_pct[t] / 100.0;
    }
    if (!moe) memcpy(Cst, C, sizeof C);
    double Ctot = 0, S[FT_TIER_COUNT];
    for (int t = 0; t < FT_TIER_COUNT; t++) { S[t] = C[t] * spb; Ctot += C[t]; }

    /* Compute of one GPU batch of one layer, one decode token: reading the
     * weights as stored (memory bound at small batch) or the flops, plus
     * attention over the cache. */
    double t_mm = fmax(Ctot / in->mem_bw, 2.0 * P * gbs / in->flops);
    double t_attn = fmax(gbs * s_avg * kv / in->mem_bw, 4.0 * gbs * s_avg * in->hidden / in->flops);
    double t_comp = ngb * (t_mm + t_attn), t_fixed = 0;
    const ft_cost_timing *tm = in->timing[cw].batch[1] > 0 ? &in->timing[cw]
                             : in->timing[FT_CODEC_RAW].batch[1] > 0 ? &in->timing[FT_CODEC_RAW] : NULL;
    if (tm) {
        /* The engine computes the whole block as one batch. */
        t_comp = interp(tm, tm->layer_decode_s, B);
        t_fixed = interp(tm, tm->fixed_decode_s, B);
    }
    /* Making fetched weights usable, once per block: byte-plane frames are
     * decoded (from the host tier too); raw and q8/q4 frames read from
     * disk or a memory node are verified; host-tier raw/q8/q4 frames are
     * used in place. The off-device cache is decoded per batch. These run
     * on decode_threads I/O workers. A codec agent decodes the remote
     * byte-plane weights on its own cores, beside compute and the links
     * (raw and q8/q4 frames pass through it and are verified here). The
     * KV cache rows are quantized on this machine either way. */
    double dth = in->decode_threads ? in->decode_threads : 1;
    double agent_dec = in->agent_cores && bp ? C[FT_TIER_REMOTE] : 0;
    double fetched = C[FT_TIER_DISK] + C[FT_TIER_REMOTE] + (bp ? C[FT_TIER_HOST] : 0) - agent_dec;
    double t_dec = fetched / dw / dth + B * s_avg * kv * (1.0 - c[FT_TIER_DEVICE]) / dc;
    double t_agent = in->agent_cores ? agent_dec / dw / in->agent_cores : 0;
    /* Links: weights once per block, cache read per step (plus the new
     * token's K/V written back). Remote traffic spreads over the nodes.
     * The host tier's weights are not copied (used or decoded in place). */
    double link[FT_TIER_COUNT] = {0}, lbytes[FT_TIER_COUNT] = {0};
    for (int t = FT_TIER_HOST; t < FT_TIER_COUNT; t++) {
        double bw = in->bw[t] * (t == FT_TIER_REMOTE && in->n_remotes > 1 ? in->n_remotes : 1);
        double bytes = (t == FT_TIER_HOST ? 0 : S[t]) + B * (s_avg + 1.0) * kv * c[t] / rc;
        lbytes[t] = bytes;
        link[t] = bytes > 0 ? (bw > 0 ? bytes / bw : INFINITY) : 0;
    }
    /* The KV cache's requests, per layer and decode step, beyond their
     * bytes: a memory node serves each off-device sequence's full chunks
     * one request each (the filling chunk's rows stay in host memory) and
     * takes one put per chunk filled; the disk tier's cache file is read
     * (K and V rows) and the step's new row written (K and V) per
     * sequence, synced to the disk under a budget. Measured: a 0.2-0.7 ms
     * synced write made the disk rows of a batch of 16 2.3x slower than
     * their bytes; 32 chunk reads of a loopback node 1 ms each under load. */
    double chunk = in->kv_chunk_tokens ? in->kv_chunk_tokens : 64;
    double kvreq[FT_TIER_COUNT] = {0};
    kvreq[FT_TIER_REMOTE] = B * c[FT_TIER_REMOTE] * (floor(s_avg / chunk) + 1.0 / chunk) * in->remote_req_s;
    kvreq[FT_TIER_DISK] = B * c[FT_TIER_DISK] * 2.0 * (in->disk_read_req_s + in->disk_write_req_s);
    for (int t = FT_TIER_DISK; t < FT_TIER_COUNT; t++)
        if (kvreq[t] > 0 && isfinite(kvreq[t])) link[t] += kvreq[t];
    /* Host and disk "links" are the CPU copying bytes, in the same I/O
     * workers that then decode them: those add up. A network link moves
     * data beside the CPU. */
    double t_io = t_dec + link[FT_TIER_HOST] + (in->disk_direct ? 0 : link[FT_TIER_DISK]);
    /* Read past the page cache, the disk's bytes still cross it: the
     * reads are buffered (the pages dropped after use), so the kernel
     * copies them to the slot in the reading threads, on the cores: the
     * CPU per byte the disk probe cost (disk_cpu_per_byte, at the plan's
     * CPU share), else a memory copy (bw[HOST]). Measured: the small
     * Llama's disk rows under 160 MiB used 3.0 CPU-s in a 5 s decode with
     * the disk 30% idle, 1.3-1.4x slower than predicted without it. */
    double t_dcopy = 0;
    if (in->disk_direct && lbytes[FT_TIER_DISK] > 0)
        t_dcopy = in->disk_cpu_per_byte > 0 ? lbytes[FT_TIER_DISK] * in->disk_cpu_per_byte
                : in->bw[FT_TIER_HOST] > 0 ? lbytes[FT_TIER_DISK] / in->bw[FT_TIER_HOST] : 0;
    /* core-seconds, on the store's reading threads as decoding is on its
     * workers (t_io is per worker: t_io x dth are the core-seconds) */
    t_io += t_dcopy / dth;
    /* Memory nodes on this machine (loopback): the "link" is memory copies
     * by the I/O workers (and the node's process), so it adds up with
     * decoding like the host and disk tiers. Measured: predicting it as a
     * separate link over-estimated the loopback row by 1.3-1.8x. */
    if (in->remote_local) t_io += link[FT_TIER_REMOTE];
    /* CPU time is shared: compute needs its threads for t_comp; the I/O
     * workers run on whatever cores are free (all of them while compute
     * waits), so the step is at least the total core-seconds over the
     * cores. */
    double cores = in->cores ? in->cores : 1, cthreads = in->compute_threads ? in->compute_threads : 1;
    if (cthreads > cores) cthreads = cores;
    /* A node on this machine copies on more than one core: on the
     * shared-memory path its pool splits each range over the machine's
     * cores (net/cma.c), on TCP the kernel copies in the node's sender
     * and in our receiving thread; the link probe's rate (cores free) is
     * two cores' work, counted here (more where the node's pool has more
     * cores, but then memory bandwidth bounds the copy, not the cores:
     * not counted). Measured on 2 vCPUs: the 1.12B Llama's node
     * rows at batch 1 ran at 0.65-0.80 of the prediction that charged the
     * link as one core's time (7 GB per step of the ~8 GB model: 1.38
     * predicted, 1.08 run). */
    double node_extra = in->remote_local ? link[FT_TIER_REMOTE] * (fmin(cores, 2.0) - 1.0) : 0;
    double busy = fmax(fmax(t_comp, t_io / cores), (t_comp * cthreads + t_io * dth + node_extra) / cores);
    /* The disk tier through the page cache: the kernel's copies run in the
     * store's reading threads (a layer's tensors at once, sched.c's queue
     * depth), then the checks on the I/O workers, beside the compute
     * threads, and the scheduler shares the cores among them all: compute
     * does not keep its core while the copies run (the bound above). Measured
     * on 2 vCPUs, 1 compute thread, a 23.6 MB bf16 layer: the compute
     * thread got 0.73-0.82 of its core in the run and a layer took 3.3-3.6
     * ms where compute alone takes 2.2 and the bound said 2.8; shared fairly,
     * 3.0-3.1 and a share of 0.72. */
    if (!in->disk_direct && lbytes[FT_TIER_DISK] > 0 && in->disk_cpu_per_byte > 0) {
        double readers = in->n_tensors < FT_SCHED_READERS ? (in->n_tensors ? in->n_tensors : 1) : FT_SCHED_READERS;
        ft_fs_group g[3] = {
            {cthreads, t_comp, -1},
            {readers, lbytes[FT_TIER_DISK] * in->disk_cpu_per_byte / readers, -1},
            {dth, t_dec + link[FT_TIER_HOST], 1},
        };
        busy = fmax(busy, ft_cost_fair_share(cores, g, 3));
    }
    /* A fetch on this machine's cores (a local node; the disk tier through
     * the page cache): its reads and the checks (or decoding) of its
     * frames, the checks of one layer beside the reads of the next (a
     * local node's transfers run on the client's single UCX worker; since
     * the next layer's reads are issued before the last frames are
     * checked, the loopback row took 7.5 ms a 23.6 MB layer where reads
     * then checks, 8.1 + 2.0 ms, predicted it at 0.71-0.73x). While compute
     * runs, the node's process, the store's workers and the checking pool
     * wait for a core: the fetch takes the time measured with the compute
     * threads busy (fetch_busy), raw and q8/q4 frames checked as they
     * arrive, at the rate measured on fresh frames (byte-plane frames are
     * decoded at decode_bw: scaling that by how much slower the checks
     * of fresh frames ran with the cores busy predicted the loopback bp
     * row at 0.51x; the CPU budget above charges decoding). Measured on
     * 2 vCPUs, 1 compute thread, load 1.1: a loopback node's q4 layer
     * (6.6 MB) took 6.2 ms a fetch in the run, 2.8 ms with the cores free
     * and warm frames (the model before), 6.8 ms busy; bf16 (23.6 MB)
     * 10.7 ms, 10.7 busy; the page cache's bf16 layer 3.9 ms, 3.5 busy.
     * That the fetch speeds up when compute waits for it (the rest of it
     * at the free rate) predicted the q4 row 1.4x too fast: the other
     * processes' load takes the core compute leaves. */
    double fetch_s[FT_TIER_COUNT] = {0};
    for (int t = FT_TIER_DISK; t <= FT_TIER_REMOTE; t++) {
        int local = t == FT_TIER_REMOTE ? (int)in->remote_local : !in->disk_direct;
        const ft_cost_fetch_busy *fb = &in->fetch_busy[t];
        double cb = t == FT_TIER_REMOTE ? C[t] - agent_dec : C[t];
        if (!local || (t == FT_TIER_DISK && !(fb->bw_busy > 0)) || !(lbytes[t] > 0 || cb > 0)) continue;
        double warm = cb / dw / dth, cfree = warm, cbusy = warm;
        if (!bp && fb->check_free > 0) cfree = cb * fb->check_free;
        if (!bp && fb->check_busy > 0) cbusy = cb * fb->check_busy;
        double req = isfinite(kvreq[t]) ? kvreq[t] : 0, req_b = req;
        if (t == FT_TIER_REMOTE && fb->req_busy > 0 && in->remote_req_s > 0)
            req_b = fmax(req, req * fb->req_busy / in->remote_req_s);
        /* the reads of the next layer are issued as soon as this layer's
         * have arrived, before its frames are checked (sched.c
         * fetch_issue): in a stream of layers the checks of one overlap
         * the reads of the next, and a layer takes the longer of the two */
        double free_s = fmax(link[t], cfree);
        double busy_s = fmax(fb->bw_busy > 0 && lbytes[t] > 0 ? lbytes[t] / fb->bw_busy + req_b : link[t], cbusy);
        fetch_s[t] = isfinite(busy_s) ? fmax(free_s, busy_s) : free_s;
        busy = fmax(busy, fetch_s[t]);
    }
    double T = fmax(busy, t_agent);
    out->bottleneck = t_io > t_comp ? (link[FT_TIER_DISK] > t_dec ? "disk" : link[FT_TIER_HOST] > t_dec ? "host" : "decode")
                                    : "compute";
    if (in->remote_local && t_io > t_comp && link[FT_TIER_REMOTE] > t_dec) out->bottleneck = "remote";
    if (t_agent >= busy && t_agent > 0) out->bottleneck = "agent";
    if (!in->remote_local && link[FT_TIER_REMOTE] > T) { T = link[FT_TIER_REMOTE]; out->bottleneck = "remote"; }
    /* Read past the page cache (a memory budget), the disk is a device
     * working beside the CPU (the I/O thread waits, it does not copy):
     * measured on the 1.12B Llama under 1.5 GiB, adding it to the cores'
     * work predicted 0.58 tok/s for 0.83 measured. */
    if (in->disk_direct && link[FT_TIER_DISK] > T) { T = link[FT_TIER_DISK]; out->bottleneck = "disk"; }
    /* Hand-offs: a streamed layer (weights fetched, or the cache off the
     * device) passes between the compute thread and the I/O thread once
     * per layer; where the I/O side is the longer, the compute thread
     * sleeps for it and must be scheduled again when it is ready, and the
     * I/O thread waits for the next request the same way: one wake-up on
     * the critical path per layer (measured: 3.6-5.9 ms per layer with a
     * loopback node at load 8.5 on 2 cores, 10-50 us on an idle one). */
    int streams = fetched > 0 || link[FT_TIER_HOST] > 0 || link[FT_TIER_DISK] > 0 || link[FT_TIER_REMOTE] > 0 ||
                  c[FT_TIER_DEVICE] < 1.0;
    if (streams && in->handoff_s > 0) {
        double io_side = fmax(t_io, fmax(in->disk_direct ? link[FT_TIER_DISK] : 0, link[FT_TIER_REMOTE]));
        io_side = fmax(io_side, fmax(fetch_s[FT_TIER_DISK], fetch_s[FT_TIER_REMOTE]));
        io_side = fmax(io_side, t_agent);
        T = fmax(T, io_side + in->handoff_s);
    }
    out->t_layer_decode = T;
    out->t_compute = t_comp;
    out->t_decode = t_dec;
    memcpy(out->t_link, link, sizeof link);
    memcpy(out->t_kv_req, kvreq, sizeof kvreq);
    /* a streamed LM head: read once per step after the layers (its next
     * chunk read ahead while one is computed: the read is the cost) */
    /* read from the checkpoint file: its measured rate (head_bw), else the
     * disk tier's; the memory bandwidth only when neither was measured
     * (it predicted a streamed head 9.8x too fast with a memory node and
     * no disk tier) */
    double hbw = in->head_bw > 0 ? in->head_bw : in->bw[FT_TIER_DISK] > 0 ? in->bw[FT_TIER_DISK] : in->mem_bw;
    double t_head = in->head_stream_bytes && hbw > 0 ? (double)in->head_stream_bytes / hbw : 0;
    out->decode_tps = T > 0 ? B / (L * T + t_fixed + t_head) : 0;
    FT_LOG(FT_LOG_DEBUG, "cost: per layer compute %.3f ms, io %.3f ms x %.0f workers, links host %.3f disk %.3f "
           "remote %.3f ms, fetch beside compute disk %.3f remote %.3f ms, CPU-bound %.3f ms, layer %.3f ms; "
           "fixed %.3f ms, head %.3f ms", 1e3 * t_comp, 1e3 * t_io, dth, 1e3 * link[FT_TIER_HOST],
           1e3 * link[FT_TIER_DISK], 1e3 * link[FT_TIER_REMOTE], 1e3 * fetch_s[FT_TIER_DISK],
           1e3 * fetch_s[FT_TIER_REMOTE], 1e3 * busy, 1e3 * T, 1e3 * t_fixed, 1e3 * t_head);

    /* Prefill: all prompt tokens of the block per layer, weights once. */
    double t_pre_comp = ngb * fmax(Ctot / in->mem_bw, 2.0 * P * gbs * in->prompt_len / in->flops)
                      + ngb * 4.0 * gbs * in->prompt_len * in->prompt_len * in->hidden / in->flops;
    double t_pre_fixed = 0;
    if (tm) {
        t_pre_comp = tm->layer_prefill_s_per_token * B * in->prompt_len;
        t_pre_fixed = tm->fixed_prefill_s_per_token * B * in->prompt_len;
    }
    double t_pre_io = fetched / dw / dth;
    if (in->remote_local && in->bw[FT_TIER_REMOTE] > 0) t_pre_io += S[FT_TIER_REMOTE] / in->bw[FT_TIER_REMOTE];
    double t_pre = fmax(fmax(t_pre_comp, t_pre_io / cores), (t_pre_comp * cthreads + t_pre_io * dth) / cores);
    t_pre = fmax(t_pre, t_agent);
    for (int t = FT_TIER_DISK; t < FT_TIER_COUNT; t++) {
        double bw = in->bw[t] * (t == FT_TIER_REMOTE && in->n_remotes > 1 ? in->n_remotes : 1);
        double bytes = S[t] + B * in->prompt_len * kv * c[t] / rc;
        if (bytes > 0) t_pre = fmax(t_pre, bw > 0 ? bytes / bw : INFINITY);
    }
    out->prefill_tps = t_pre > 0 ? B * in->prompt_len / (L * t_pre + t_pre_fixed + t_head) : 0;

    /* Memory: device-tier weights as computed on, and two slot buffers
     * holding the fetched ones: the frame read from disk or a memory node
     * (S), plus the decoded tensor for byte-plane (C); host-tier frames
     * are used where they are. Then the device share of the cache and the
     * activations; other tiers hold the stored bytes. */
    double slot = S[FT_TIER_DISK] + S[FT_TIER_REMOTE] + (bp ? C[FT_TIER_HOST] + C[FT_TIER_DISK] + C[FT_TIER_REMOTE] : 0);
    double xcache = moe ? out->expert_cache_mem : 0;   /* the expert cache (beside the slots) */
    double cache_total = L * B * s_max * kv;
    /* The off-device cache passes through two staging buffers of one layer
     * (f32) on the device. */
    double staging = 2.0 * B * (1.0 - c[0]) * s_max * kv;
    out->mem[FT_TIER_DEVICE] = (uint64_t)(L * Cst[FT_TIER_DEVICE] + 2.0 * slot + xcache + cache_total * c[0] +
                                          staging + 2.0 * gbs * in->prompt_len * in->hidden * 4.0 * 4.0);
    for (int t = FT_TIER_HOST; t < FT_TIER_COUNT; t++)
        out->mem[t] = (uint64_t)(L * Cst[t] * spb + cache_total * c[t] / rc);
    /* The process: both tiers live in it; a disk read passes through the
     * page cache (dropped after use under a budget: at most the two
     * layers in flight, the one being read and the one being dropped). */
    out->mem_process = out->mem[FT_TIER_DEVICE] + out->mem[FT_TIER_HOST] + (uint64_t)(2.0 * S[FT_TIER_DISK]);
    out->feasible = 1;
    for (int t = 0; t < FT_TIER_COUNT; t++)
        if (out->mem[t] > in->cap[t]) out->feasible = 0;
    if (in->proc_cap && out->mem_process > in->proc_cap) out->feasible = 0;
}

/* Enumerate percentage vectors over the usable tiers in `step` increments. */
typedef struct { float v[FT_TIER_COUNT]; } pct;

static size_t enum_pcts(const int *usable, int step, pct *out, size_t cap)
{
    size_t n = 0;
    /* Most on the device first, so that ties keep data close. */
    for (int a = 100; a >= 0; a -= step)
        for (int b = 100 - a; b >= 0; b -= step)
            for (int c = 100 - a - b; c >= 0; c -= step) {
                int d = 100 - a - b - c;
                int v[4] = {a, b, c, d};
                int ok = 1;
                for (int t = 0; t < FT_TIER_COUNT; t++) if (v[t] && !usable[t]) ok = 0;
                if (!ok || n == cap) continue;
                for (int t = 0; t < FT_TIER_COUNT; t++) out[n].v[t] = (float)v[t];
                n++;
            }
    return n;
}

ft_status ft_plan(const ft_cost_inputs *in, const ft_policy *base, uint32_t max_batch, int fixed_batch,
                  unsigned weight_codecs, unsigned cache_codecs, unsigned cache_tiers, ft_policy *best,
                  ft_cost_estimate *est)
{
    if (!in || !base || !best || max_batch < 1 || in->n_layers == 0) return FT_ERR_INVALID_ARG;
    int usable[FT_TIER_COUNT] = {1, in->cap[FT_TIER_HOST] > 0, base->disk_uri[0] && in->cap[FT_TIER_DISK] > 0,
                                 base->n_remotes > 0 && in->cap[FT_TIER_REMOTE] > 0};
    pct wv[300], cv[300];
    int cache_usable[FT_TIER_COUNT];
    if (!cache_tiers) cache_tiers = 1u << FT_TIER_DEVICE;
    for (int t = 0; t < FT_TIER_COUNT; t++) cache_usable[t] = usable[t] && (cache_tiers & (1u << t));
    size_t nw = enum_pcts(usable, 10, wv, 300), nc = enum_pcts(cache_usable, 25, cv, 300);
    if (!weight_codecs) weight_codecs = 1u << FT_CODEC_RAW;
    if (!cache_codecs) cache_codecs = 1u << FT_CODEC_RAW;
    ft_policy cand = *base, top;
    ft_cost_estimate e, top_e;
    double best_tps = -1;
    memset(&top_e, 0, sizeof top_e);
    for (uint32_t gbs = 1; gbs <= max_batch; gbs *= 2)
        for (uint32_t ngb = 1; gbs * ngb <= max_batch; ngb *= 2) {
            if (fixed_batch && gbs * ngb != max_batch) continue;
            for (int cw = 0; cw < FT_CODEC_COUNT; cw++) {
                if (!(weight_codecs & (1u << cw))) continue;
                for (int cc = 0; cc < FT_CODEC_COUNT; cc++) {
                    if (!(cache_codecs & (1u << cc))) continue;
                    for (size_t i = 0; i < nw; i++)
                        for (size_t j = 0; j < nc; j++) {
                            memcpy(cand.w_pct, wv[i].v, sizeof cand.w_pct);
                            memcpy(cand.c_pct, cv[j].v, sizeof cand.c_pct);
                            memset(cand.a_pct, 0, sizeof cand.a_pct);
                            cand.a_pct[FT_TIER_DEVICE] = 100;
                            cand.gpu_batch_size = gbs;
                            cand.num_gpu_batches = ngb;
                            cand.compress_weights = (ft_codec_id)cw;
                            cand.compress_cache = (ft_codec_id)cc;
                            ft_cost_predict(in, &cand, &e);
                            /* Ties go to the earlier candidate: fewer
                             * off-device bytes, smaller batch, no codec. */
                            if (e.feasible && e.decode_tps > best_tps * (1.0 + 1e-9)) {
                                best_tps = e.decode_tps;
                                top = cand;
                                top_e = e;
                            }
                        }
                }
            }
        }
    if (best_tps < 0) {
        if (in->proc_cap)
            return ft_set_error(FT_ERR_NO_SPACE, "no policy fits the memory of the tiers: the memory budget leaves "
                                "%.1f MiB for weights, cache and staging%s", (double)in->proc_cap / 1048576.0,
                                usable[FT_TIER_DISK] || usable[FT_TIER_REMOTE] ? ""
                                                                              : " and there is no disk tier or memory node");
        return ft_set_error(FT_ERR_NO_SPACE, "no policy fits the memory of the tiers");
    }
    *best = top;
    if (est) *est = top_e;
    return FT_OK;
}
