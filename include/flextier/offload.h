/*
 * flextier/offload.h - FlexGen-style offloading policy across N tiers, and
 * the cost model / planner that chooses one.
 *
 * A policy says, for weights, KV cache and activations, what share lives
 * on each tier (device, host, disk, remote), the GPU batch size and number
 * of GPU batches (one block = gpu_batch_size * num_gpu_batches sequences),
 * and the compression of weights and cache. On a CPU-only machine the
 * compute device is the CPU and "device" memory is a working-set budget in
 * DRAM: device-tier weights are kept decoded, ready for compute; host-tier
 * weights are kept encoded in DRAM and decoded on use; disk and remote
 * tiers are `file:` and `ucx://` stores.
 *
 * Everything here is plain data and pure functions: thread-safe.
 */
#ifndef FLEXTIER_OFFLOAD_H
#define FLEXTIER_OFFLOAD_H

#include "flextier/codec.h"
#include "flextier/engine.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ft_tier {
    FT_TIER_DEVICE = 0, FT_TIER_HOST = 1, FT_TIER_DISK = 2, FT_TIER_REMOTE = 3,
    FT_TIER_COUNT = 4
} ft_tier;

FT_API const char *ft_tier_name(ft_tier t);   /* "device", "host", "disk", "remote" */

#define FT_MAX_REMOTES 8
#define FT_URI_MAX 256

typedef struct ft_policy {
    /* Percentages per tier, each triple summing to 100. */
    float w_pct[FT_TIER_COUNT];   /* weights                          */
    float c_pct[FT_TIER_COUNT];   /* KV cache (split by sequence)     */
    float a_pct[FT_TIER_COUNT];   /* activations: must be 100 on one tier */
    uint32_t gpu_batch_size;      /* sequences per GPU batch, >= 1    */
    uint32_t num_gpu_batches;     /* GPU batches per block, >= 1      */
    ft_codec_id compress_weights; /* RAW, BYTEPLANE, Q8 or Q4          */
    ft_codec_id compress_cache;   /* RAW, Q8 or Q4                     */
    uint32_t n_remotes;           /* remote memory nodes (ucx://HOST:PORT) */
    char remotes[FT_MAX_REMOTES][FT_URI_MAX];
    char disk_uri[FT_URI_MAX];    /* file:DIR for the disk tier        */
    uint32_t replicas;            /* copies of every remote tensor on
                                     distinct memory nodes (rep=N; 0 or 1:
                                     one). With 2 or more a node that fails
                                     costs a retry on a replica, and the
                                     node is filled again when it is back */
} ft_policy;

/* Default: everything on the device, batch 1, no compression. */
FT_API void ft_policy_default(ft_policy *p);

/* Parse a compact policy, space- or semicolon-separated key=value items:
 *   w=D,H,S,R   c=D,H,S,R   a=D,H,S,R   (percentages; 2 or 3 values are
 *                                        accepted, the rest default to 0)
 *   gbs=N  ngb=N  cw=none|bp|q8|q4  cc=none|q8|q4
 *   remote=ucx://a:7000,ucx://b:7000   disk=file:/path   rep=N (replicas)
 * Items not given keep their current value in *p (so callers can apply CLI
 * flags on top of a default). FT_ERR_INVALID_ARG with a message naming the
 * item on any error; *p is unchanged then. */
FT_API ft_status ft_policy_parse(const char *spec, ft_policy *p);

/* Check sums, ranges, and that tiers used have their store (remote needs
 * remotes, disk needs disk_uri). */
FT_API ft_status ft_policy_validate(const ft_policy *p);

/* "w=0,20,30,50 c=100,0,0,0 a=100,0,0,0 gbs=8 ngb=4 cw=q4 cc=none" */
FT_API void ft_policy_format(const ft_policy *p, char *buf, size_t n);

/* FlexGen's weight placement within one layer: tensor i (bytes[i]) goes to
 * the tier whose cumulative percentage range holds the midpoint of the
 * tensor's cumulative byte range, tiers ordered device, host, disk, remote.
 * out[i] receives the tier. */
FT_API void ft_policy_place(const ft_policy *p, const uint64_t *bytes, size_t n, ft_tier *out);

/* ---------------------------------------------------------- cost model */

/* What the cost model needs to know about the model, the run and the
 * machine. Bandwidths in bytes/s, compute in flop/s. */
#define FT_COST_MAX_TENSORS 32

/* Engine times measured with one compute format (seconds): per layer and
 * fixed per step (embedding, final norm, LM head), for a decode step at
 * batch batch[k] (k = 0, 1; linear in between), and per prompt token for
 * prefill. batch[1] == 0: not measured. */
typedef struct ft_cost_timing {
    uint32_t batch[2];
    double layer_decode_s[2], fixed_decode_s[2];
    double layer_prefill_s_per_token, fixed_prefill_s_per_token;
} ft_cost_timing;

/* A fetch measured while compute_threads threads keep the cores busy, as
 * the run's compute does while the next layer is fetched (the node's
 * process, the store's workers and the checking pool then wait for a
 * core): bw_busy, the layer reads' bytes/s; check_free and check_busy,
 * seconds per byte of checking the frames as they arrive (just written by
 * another thread or process: slower than decode_bw's warm frames) on
 * decode_threads threads with the cores free and busy; req_busy, a memory
 * node's KV cache chunk request beyond its bytes, busy (as remote_req_s
 * with the cores free; 0: not measured). */
typedef struct ft_cost_fetch_busy {
    double bw_busy, check_free, check_busy, req_busy;
} ft_cost_fetch_busy;

typedef struct ft_cost_inputs {
    /* model */
    uint32_t n_layers;
    uint64_t layer_params;         /* parameters per layer (matrices)     */
    ft_wfmt weights_fmt;           /* what none/bp policies compute on (the
                                      model's format)                      */
    uint64_t kv_bytes_per_token;   /* per layer per sequence, uncompressed (K+V) */
    uint32_t kv_group;             /* q8/q4 cache group along head_dim (0 = 64) */
    uint32_t hidden;
    /* run */
    uint32_t prompt_len, gen_len;
    /* machine */
    double flops;                  /* sustained GEMM flop/s of the device  */
    double mem_bw;                 /* device memory bandwidth (weights read per step) */
    double bw[FT_TIER_COUNT];      /* tier -> device link; bw[DEVICE] unused */
    uint32_t n_remotes;            /* remote links add up (one per node)  */
    uint32_t remote_local;         /* the nodes run on this machine: their
                                      transfers are memory copies by the I/O
                                      workers, added to decoding (not a link
                                      running beside the CPU)              */
    uint32_t agent_cores;          /* the remote tier goes through a codec
                                      agent (agent://, docs/agent.md) with
                                      this many cores of its own: decoding
                                      the remote weights is charged to them,
                                      not to this machine's cores (0: none) */
    uint64_t cap[FT_TIER_COUNT];   /* capacity per tier, bytes            */
    /* Per weight codec (ft_codec_id): ratio = bytes as computed on / bytes
     * stored on a tier (byte-plane's entropy ratio; 1 for none, q8, q4,
     * whose frames are computed on in place; 0 = not available), and
     * decode_bw = bytes/s (as computed on) of making a fetched frame
     * usable on one core: decoding byte-plane, verifying the checksums of
     * raw/q8/q4 frames read from disk or a memory node. Host-tier raw and
     * q8/q4 frames are used in place at no cost. */
    double ratio[FT_CODEC_COUNT];
    double decode_bw[FT_CODEC_COUNT];
    /* CPU-only machines: compute and the I/O workers (copying, decoding)
     * share `cores` cores; compute runs compute_threads of them, decoding
     * decode_threads (the scheduler's ft_offload_params.decode_threads).
     * 0 = 1. */
    uint32_t cores, compute_threads, decode_threads;
    /* One layer's tensors in placement order, as the scheduler keeps them
     * under each weight codec: bytes as computed on (q8/q4: the frame of a
     * matrix; none/bp: the array in weights_fmt; norms and biases f32),
     * filled by ft_cost_inputs_from_model. Placement is then computed
     * exactly as the scheduler does it (whole tensors, ft_policy_place).
     * n_tensors == 0: the layer is layer_params values of the codec's
     * format, split by the percentages literally. */
    uint32_t n_tensors;
    uint64_t tensor_bytes[FT_CODEC_COUNT][FT_COST_MAX_TENSORS];
    /* Measured engine times per weight codec (with its compute format);
     * a codec without them uses codec none's, else the analytic model. */
    ft_cost_timing timing[FT_CODEC_COUNT];
    /* Mixtures of experts (n_experts 0: dense). The tensors above are a
     * sparse layer's dense part (attention, norms, router); its
     * n_experts experts of expert_bytes[codec] each (three matrices) are
     * placed after them one by one, as the scheduler places them.
     * experts_used per token are computed (layer_params counts those
     * only); a step of B rows selects an expert with probability
     * 1 - (1 - experts_used / n_experts)^B (uniform routing, the random
     * routers' case; a skewed router needs fewer). Streamed experts are
     * found in a cache of expert_cache experts (0: one layer's) with the
     * hit rate of uniform use, expert_cache / streamed experts, unless
     * expert_hit_rate (in (0, 1]) gives the rate a run measured
     * (--offload-stats, bench run --json "experts"): routing that repeats
     * hits far more than uniform use. */
    uint32_t n_experts, experts_used;
    uint64_t expert_bytes[FT_CODEC_COUNT];
    uint64_t expert_cache;
    double expert_hit_rate;
    /* A memory budget for the whole process (CPU-only machines, where the
     * device and host tiers are both this process's memory): the device
     * and host tiers together, plus the page cache a disk read holds, must
     * fit in proc_cap bytes (what the budget leaves after the globals,
     * scratch and the process itself; 0: no such bound). */
    uint64_t proc_cap;
    int disk_direct;               /* the disk tier is read past the page
                                      cache (a memory budget): its reads
                                      wait on the device beside the CPU
                                      instead of copying on the cores      */
    int calibration_cached;        /* ft_calibrate took the machine's part
                                      from its cache                       */
    /* An LM head streamed from the checkpoint file (a memory budget too
     * small for it, ft_load_params.stream_globals): these bytes are read
     * per decode step (and per prefill block) from disk at bw[DISK] (the
     * memory bandwidth when no disk was measured), after the layers.
     * Streamed embeddings cost a row per token: not counted. */
    uint64_t head_stream_bytes;
    /* The share of a core each compute thread got (CPU time / wall time of
     * spinning threads, 1 on an idle machine): cpu_share_calibrated when
     * the engine and codecs were timed, cpu_share when this plan was made
     * (ft_calibrate measures it every time; a cached calibration is
     * rescaled by their ratio, ft_cost_rescale_cpu). 0: not measured. */
    double cpu_share, cpu_share_calibrated;
    /* The time a sleeping thread takes to run again once woken (mutex and
     * condition variable, as the scheduler hands a layer over), measured
     * at each plan: under another process's load it is a time slice, on
     * an idle machine microseconds. A streamed layer whose I/O is the
     * longer side adds it once (0: none). */
    double handoff_s;
    ft_codec_id probe_codec;       /* whose frame sizes the disk and link
                                      probes read (ft_calibrate)           */
    double head_bw;                /* bytes/s of a streamed LM head read
                                      from the checkpoint file in chunks,
                                      past the page cache (ft_calibrate
                                      under a budget; 0: bw[DISK] is used) */
    /* Per-request costs of the KV cache's small transfers (seconds), which
     * a bandwidth measured on whole layers does not show (issue 20: the
     * KV cache on a loopback node ran 2-3x slower than its bytes at the
     * link's rate). remote_req_s: one chunk read or put of a memory node
     * (kv_chunk_tokens tokens of K and V, read 32 at once as the
     * offloader reads a layer's chunks) beyond its bytes at bw[REMOTE];
     * measured with the link at every plan. disk_read_req_s: one read of
     * a sequence's rows from the disk tier's cache file (cold under a
     * budget), disk_write_req_s: one write of a step's new row (synced to
     * the disk under a budget, as the offloader writes it); measured and
     * cached with the disk's bandwidth. Per layer and decode step the
     * model adds, per off-device sequence, its chunk reads (node) or two
     * reads and two writes (K and V, disk). 0: none. */
    double remote_req_s, disk_read_req_s, disk_write_req_s;
    uint32_t kv_chunk_tokens;      /* a memory node's KV chunk (0: 64)    */
    /* The disk tier read past the page cache (disk_direct) is still read
     * through it: the kernel copies each page to the slot and drops it, on
     * the reading threads' cores. CPU seconds per byte read, measured with
     * the disk's bandwidth (the process's CPU time of the probe's reads)
     * and rescaled like the engine's times (0: bytes / bw[HOST], a copy). */
    double disk_cpu_per_byte;
    /* Fetches that need this machine's cores (a memory node on this
     * machine, remote_local; the disk tier through the page cache, not
     * disk_direct), per tier (ft_calibrate, by the wall clock at every
     * plan; zeros: not measured, bw[] and decode_bw[] throughout). */
    ft_cost_fetch_busy fetch_busy[FT_TIER_COUNT];
} ft_cost_inputs;

typedef struct ft_cost_estimate {
    double prefill_tps, decode_tps;  /* tokens/s, all sequences            */
    double t_layer_decode;           /* seconds per layer per decode step  */
    double t_compute, t_decode, t_link[FT_TIER_COUNT]; /* components of it */
    uint64_t mem[FT_TIER_COUNT];     /* peak bytes per tier                */
    uint64_t mem_process;            /* device + host tiers + the page cache
                                        of one layer's disk reads (what
                                        proc_cap bounds)                   */
    int feasible;                    /* fits every capacity                */
    const char *bottleneck;          /* "compute", "decode", "disk", ...   */
    /* mixtures of experts: the cache hit rate assumed and the expert
     * bytes (as computed on) fetched per layer per decode step */
    double expert_hit, expert_fetch_bytes, expert_cache_mem;
    /* of t_link: the KV cache's per-request costs per layer and decode
     * step (ft_cost_inputs.remote_req_s, disk_*_req_s) */
    double t_kv_req[FT_TIER_COUNT];
} ft_cost_estimate;

/* What calibration measured on the CPU, taken under another load: every
 * CPU term (the engine's times, the codecs' speeds, the memory bandwidth,
 * the flop/s and the disk reads' CPU per byte) made k times slower (k = the calibration's cpu_share /
 * the plan's). The links (the disk tier, memory nodes) are not: read
 * past the page cache the disk is a device; through it, and a memory
 * node's link, are measured at every plan, under its load. k <= 0,
 * non-finite or 1: unchanged. */
FT_API void ft_cost_rescale_cpu(ft_cost_inputs *in, double k);

/* The share of a core each of `threads` threads gets now (CPU time /
 * wall time of spinning threads, 60 ms, median of 3; 1 on an idle
 * machine). */
FT_API double ft_cpu_share(unsigned threads);

/* The engine's decode times from what calibration timed, per batch point
 * j (0: batch 1, 1: the run's): layer[j], a layer's time between the
 * engine's layer hooks in a 2-layer copy; total2[j], that copy's whole
 * step; totalv2[j], a 1-layer copy's step at the second vocabulary V2 (0:
 * none); k = (V - V1) / (V2 - V1) extrapolates the fixed part (embedding,
 * final norm, LM head) linearly in the vocabulary. Sets layer_decode_s
 * and fixed_decode_s (clamped at 0). */
FT_API void ft_cost_timing_fit(const double layer[2], const double total2[2], const double totalv2[2], double k,
                               ft_cost_timing *t);
/* As ft_cost_timing_fit, but extrapolated more than 8x past the span
 * measured (k > 8: a memory bound keeps V2 at 2048 or 4096 for a
 * vocabulary of 32000) the head's rows cost what a layer's parameters cost
 * per parameter in the head's format: span = edim x (V2 - V1) / a layer's
 * parameters, times head_layer[j] (a layer's time in the head's format:
 * bf16 beside q8/q4 layers) or, head_layer NULL, layer[j] (the head in
 * the layers' format), instead of the difference of two noisy totals
 * times k (three --recalibrate plans of the 8-layer h2048 Llama under
 * 448 MiB fitted 7.6, 0 and 0.7 ms). span 0: ft_cost_timing_fit. */
FT_API void ft_cost_timing_fit_head(const double layer[2], const double head_layer[2], const double total2[2],
                                    const double totalv2[2], double k, double span, ft_cost_timing *t);

/* A decode step streamed from DRAM reads each weight once: raise each
 * batch point's layer time to layer_bytes / read_bw and its fixed part to
 * fixed_bytes (the LM head at the model's vocabulary) / read_bw.
 * Calibration applies it where the model is larger than the last-level
 * cache. read_bw <= 0 or non-finite: unchanged. */
FT_API void ft_cost_timing_floor(ft_cost_timing *t, double layer_bytes, double fixed_bytes, double read_bw);

/* Write [p, p + n) back to memory and drop it from every cache level (the
 * next read comes from DRAM): what calibration does to its timed copies'
 * weights between steps. 1 (p NULL or n 0: whether this build can), 0
 * where it has no cache-flush instruction (nothing done). */
FT_API int ft_calib_flush(const void *p, size_t n);

/* The CPU time of this process's threads, read exactly: what calibration
 * times multi-threaded steps and probes by. The process clock counts a
 * thread running on another core only as of that core's last scheduler
 * tick; this sums each thread's own clock, which is current when read.
 * ft_calib_clock_init lists the threads that exist then (make it after
 * the threads to be timed are started; a thread that ends stops counting);
 * ft_calib_clock_now returns seconds. Where the threads cannot be listed
 * (no /proc, more than FT_CALIB_CLOCK_MAX) the process clock. */
#define FT_CALIB_CLOCK_MAX 64
typedef struct ft_calib_clock { int n; int id[FT_CALIB_CLOCK_MAX]; } ft_calib_clock;
FT_API void ft_calib_clock_init(ft_calib_clock *c);
FT_API double ft_calib_clock_now(const ft_calib_clock *c);

/* Predict throughput of a policy (FlexGen's per-layer max of compute and
 * link times, with weights moved once per block and cache per batch). */
FT_API void ft_cost_predict(const ft_cost_inputs *in, const ft_policy *p, ft_cost_estimate *out);

/* Search placements (weights in 10% steps, cache in 25% steps over the
 * tiers in cache_tiers, a bit mask of 1u << ft_tier; 0 = device only; the
 * cache offloader supports all four: FT_CACHE_TIERS),
 * batch configurations with gbs*ngb <= max_batch (or == max_batch when
 * fixed_batch) and the allowed weight/cache codecs (bit masks of
 * 1u << ft_codec_id; 0 = RAW only) for the feasible policy with the
 * highest predicted decode throughput. `base` provides remotes/disk_uri;
 * tiers without a store are not used. FT_ERR_NO_SPACE if nothing fits. */
/* The tiers the KV cache offloader supports, for ft_plan's cache_tiers. */
#define FT_CACHE_TIERS ((1u << FT_TIER_DEVICE) | (1u << FT_TIER_HOST) | (1u << FT_TIER_DISK) | (1u << FT_TIER_REMOTE))
FT_API ft_status ft_plan(const ft_cost_inputs *in, const ft_policy *base, uint32_t max_batch,
                         int fixed_batch, unsigned weight_codecs, unsigned cache_codecs,
                         unsigned cache_tiers, ft_policy *best, ft_cost_estimate *est);


/* ----------------------------------------------------------- calibration */

/* Fill the model part of cost inputs from a model directory (config and
 * checkpoint; no layer is loaded), for matrices kept in `weights` (an
 * ft_wfmt or FT_WEIGHTS_AS_STORED). */
FT_API ft_status ft_cost_inputs_load(const char *dir, int weights, ft_cost_inputs *in);

typedef struct ft_calibrate_params {
    const ft_policy *base;      /* remotes and disk directory to measure   */
    uint64_t device_mem;        /* the device budget (0: unlimited)        */
    uint32_t batch, prompt_len, gen_len;   /* the run planned for          */
    unsigned threads;           /* compute threads (0: default)            */
    unsigned decode_threads;    /* the scheduler's (0: every core)         */
    unsigned codecs;            /* weight codecs to measure (1u << id)     */
    const double *given_bw;     /* [FT_TIER_COUNT]: > 0 replaces a link's
                                   measurement (NULL: measure all)         */
    /* The calibration cache: what was measured about this machine for a
     * model shape and run shape is kept in cache_dir (NULL: the default,
     * $XDG_CACHE_HOME/flextier/calib or ~/.cache/flextier/calib, or
     * FLEXTIER_CALIB_CACHE=DIR, =0 for none; "": none) and reused, so
     * repeated plans agree; a changed CPU, core count, build, config.json,
     * weight format, batch, prompt length, thread count or codec list is
     * another key. Each key keeps its last 5 calibrations; a plan uses
     * one made while memory read as fast as a quick read says it does now
     * (else measures again). recalibrate: measure again. Memory nodes'
     * links are measured every time. */
    const char *cache_dir;
    int recalibrate;
    int drop_cache;             /* the disk tier is read past the page cache
                                   (a memory budget): measure it that way */
    double cpu_share;           /* > 0: the share of a core a thread gets
                                   now, instead of measuring it, and no
                                   hand-off latency (tests; a caller that
                                   knows its CPU quota)                   */
    uint64_t memory;            /* bytes calibration may hold beside the
                                   process (0: no bound): the bandwidth
                                   probe's buffers and the timed copies'
                                   vocabulary shrink to fit it            */
    double mem_bw_now;          /* cached calibrations are checked against
                                   a quick read of memory (measured again
                                   where none is within 25% of it): > 0
                                   gives that read's rate (tests), < 0
                                   skips the check, 0 measures it         */
} ft_calibrate_params;

FT_API void ft_calibrate_default_params(ft_calibrate_params *p);

/* Measure this machine and the policy's tiers into *in (whose model part
 * ft_cost_inputs_load filled, and whose cap[] the caller may preset for
 * host/disk/remote): memory bandwidth, the engine's per-layer and fixed
 * times at batch 1 and `batch` and per prefill token with each compute
 * format the codecs imply (on zero-weight 1- and 2-layer copies of the
 * model), each codec's ratio and the cost of making a fetched frame
 * usable, the disk tier's and the first memory node's read bandwidth.
 * Takes seconds; logs at FT_LOG_INFO. FT_ERR_NET when a memory node
 * cannot be measured. */
FT_API ft_status ft_calibrate(const char *dir, const ft_calibrate_params *p, ft_cost_inputs *in);

/* The disk tier's read bandwidth (bytes/s) as ft_calibrate measures it:
 * one layer's tensors of *in (tensor_bytes, raw) written as raw frames to
 * the store at uri and read back at once, queue depth 8, past the page
 * cache with drop_cache; within `memory` (0: unbounded) the probe holds a
 * quarter of it. An error (with the store's reason) when the store cannot
 * be opened, written or read; *bw is then 0. */
FT_API ft_status ft_calibrate_disk_bw(const char *uri, int drop_cache, uint64_t memory, const ft_cost_inputs *in,
                                      double *bw);

/* ------------------------------------------------------------- scheduler */

#include "flextier/engine.h"
#include "flextier/store.h"

/* Streams a model's layer weights through the tiers of a policy. Created
 * over a model loaded with external layers (ft_load_params.external_layers)
 * and installed as the context's layer hook: before layer i is computed it
 * waits for layer i's streamed tensors (decoded to f32 into one of two slot
 * buffers), points the layer at them and starts fetching layer i+1 on an
 * I/O thread, so transfer and decoding overlap the computation. Device-tier
 * tensors stay resident. */
typedef struct ft_offload ft_offload;

typedef struct ft_offload_params {
    ft_policy policy;
    uint32_t group_size;     /* q8/q4 weights: default 64                    */
    int32_t  group_dim;      /* default -1 (the input dim of (out, in) weights) */
    uint64_t device_budget;  /* bytes of decoded weights + slots allowed;
                                0 = no limit. FT_ERR_NO_SPACE if exceeded.   */
    const char *token_file;  /* for ucx:// remotes (or FLEXTIER_TOKEN_FILE)  */
    unsigned decode_threads; /* threads verifying and decoding streamed
                                frames (byte-plane decoding, checksums);
                                default 1; the planner chooses            */
    /* progress of the first upload: done/total bytes of source tensors */
    void (*progress)(void *user, uint64_t done, uint64_t total);
    void *user;
    /* A pipeline stage (flextier/pipe.h) holds only layers [layer_begin,
     * layer_end) (0, 0: all): only those are placed, uploaded and served
     * by the hook, which prefetches layer_begin after the last one. */
    int layer_begin, layer_end;
    /* With policy.replicas > 1: a memory node whose connection has moved
     * no byte for this long while a request waits is given up on and its
     * replicas serve (default 1000 ms; a killed node is noticed at once) */
    unsigned failover_ms;
    /* With several memory nodes a remote tensor's frame is striped over
     * all of them in equal pieces, so that N links carry each layer
     * together, when the pieces are at least this big (0: 64 KiB;
     * smaller tensors go whole to one node, the nodes taken in turn). */
    uint32_t stripe_min;
    /* Mixtures of experts (docs/offload.md, "Experts"): the experts the
     * policy does not keep resident are fetched one by one once a layer's
     * router has chosen them, into a cache of expert_cache_bytes (0: what
     * device_budget leaves after the resident weights and slots, or
     * without a budget room for one layer's experts, the least that works
     * and never less; FT_ERR_NO_SPACE if the budget cannot hold it). Eviction
     * by expert_evict (FT_EXPERT_LRU or FT_EXPERT_LFU: least recently /
     * least often used, counts halved now and then); with
     * expert_prefetch, the next layer's router applied to this layer's
     * input predicts the experts to read ahead (off by default: measured,
     * it costs more cache hits than it brings when routing repeats). */
    uint64_t expert_cache_bytes;
    int expert_evict;
    int expert_prefetch;
    /* Under a memory budget: the disk tier's frame files and the
     * checkpoint's pages leave the page cache once read or written (a
     * cgroup charges the page cache to the process). */
    int drop_cache;
    /* Streamed frames (a layer's tensors in the slot buffers, an expert's
     * matrices in the expert cache) of at least this many bytes are
     * placed at 4 KiB with room for their last block, so that the disk
     * tier reads them past the page cache (O_DIRECT, with the store's
     * direct_io); smaller ones, where the padding would count, are read
     * through it (0: 1 MiB). */
    uint64_t direct_min;
} ft_offload_params;

enum { FT_EXPERT_LRU = 0, FT_EXPERT_LFU = 1 };

/* Per layer of a mixture of experts, since creation (or the last reset). */
typedef struct ft_expert_stats {
    uint64_t needed;          /* experts selected (the union of each call's rows) */
    uint64_t resident;        /* of those, kept resident by the policy          */
    uint64_t hits, misses;    /* of the streamed ones: in the cache, or read then */
    uint64_t prefetch_hits;   /* of the hits: brought by the prefetcher         */
    uint64_t bytes;           /* bytes read (stored frames) for this layer's experts */
    uint64_t predicted;       /* experts the prefetcher predicted for this layer */
    uint64_t predicted_used;  /* of those, selected                             */
} ft_expert_stats;

FT_API void ft_offload_default_params(ft_offload_params *p);

/* Per-tier traffic and timing since creation (or the last reset). */
typedef struct ft_offload_stats {
    uint64_t logical_bytes[FT_TIER_COUNT];  /* tensor bytes (as computed on) fetched */
    uint64_t wire_bytes[FT_TIER_COUNT];     /* encoded bytes read               */
    uint64_t uploaded_bytes, reused_bytes;  /* first-use upload vs found in store */
    uint64_t resident_bytes;                /* device-tier weights, as computed on */
    uint64_t slot_bytes;                    /* the two streaming slot buffers   */
    uint64_t host_bytes;                    /* host-tier frames in this process */
    double io_busy_s;        /* I/O thread time fetching + decoding          */
    double wait_s;           /* compute thread time waiting for weights      */
    uint64_t layers_fetched;
    /* replicas (policy.replicas > 1): reads issued again on a replica,
     * memory nodes given up on, nodes filled again once back and the
     * bytes copied to them (since creation) */
    uint64_t retries, failovers, repairs, repaired_bytes;
    double failover_fetch_s; /* the longest layer fetch that retried reads */
    double degraded_fetch_s; /* fetches that began with a node down (and  */
    uint64_t degraded_fetches;/* retried nothing): time, count            */
    uint64_t expert_cache_bytes;  /* the expert cache (ft_offload_expert_stats) */
    /* the fetched tensors' bytes in the checkpoint's dtype: source / wire
     * is the compression a user sees (q4 of a bf16 model: about 3.6x),
     * where logical / wire is only the link codec's (1.00x for q4 frames,
     * which are computed on as they are) */
    uint64_t source_bytes[FT_TIER_COUNT];
} ft_offload_stats;

/* model_dir: the checkpoint the model was loaded from (source of the
 * tensors to upload). Opens the tier stores, places every layer tensor
 * (FlexGen's midpoint rule), loads device-tier tensors, and uploads the
 * others to their tiers unless an identical encoding is already there
 * (keys are content hashes of the source tensor and the codec). */
FT_API ft_status ft_offload_create(ft_model *m, const char *model_dir, const ft_offload_params *p,
                                   ft_offload **out);
FT_API void ft_offload_free(ft_offload *o);
/* The hook to install with ft_ctx_set_layer_hook(ctx, ft_offload_hook, o). */
FT_API ft_status ft_offload_hook(void *o, int layer, ft_layer_weights *w);
/* The hook with the direction of travel given: layer `layer`'s weights
 * into *w (waiting for its streamed tensors), then layer `next` read ahead
 * into the other slot buffer (-1: nothing). ft_offload_hook is this with
 * next = layer + 1 (wrapping to the first layer held); a backward pass
 * walking the layers down gives layer - 1 (the training loop,
 * docs/training.md). *w stays valid until the next call. */
FT_API ft_status ft_offload_fetch(void *o, int layer, int next, ft_layer_weights *w);
FT_API void ft_offload_get_stats(const ft_offload *o, ft_offload_stats *out);
FT_API void ft_offload_reset_stats(ft_offload *o);
/* Fill the model part of cost inputs from a model (it may have external
 * layers): layers, parameters per layer, hidden size, KV bytes per token
 * (f32 cache), one layer's tensors in placement order. */
FT_API ft_status ft_cost_inputs_from_model(const ft_model *m, ft_cost_inputs *in);

/* Layer `layer`'s expert statistics (zeros for a dense layer or model). */
FT_API ft_status ft_offload_expert_stats(const ft_offload *o, int layer, ft_expert_stats *out);
/* The expert cache: entries and bytes (0 when no expert is streamed). */
FT_API void ft_offload_expert_cache(const ft_offload *o, int *entries, uint64_t *bytes);

/* Tier of tensor slot `slot` of every layer (as placed), for reporting. */
FT_API ft_tier ft_offload_tier_of(const ft_offload *o, int slot);

/* ------------------------------------------------------------ KV cache */

/* Offloads a context's KV cache (ft_ctx_params.external_kv) through the
 * tiers of a policy's c= shares, split by sequence slot (FlexGen's rule
 * over equal-sized sequences): device-tier slots keep their cache
 * resident; host-tier slots keep it encoded in DRAM; disk-tier slots in a
 * file in the policy's disk directory; remote-tier slots on the memory
 * nodes, in chunks of 64 tokens written once full (the chunk being filled
 * stays in host memory), deleted when the offloader is freed. Rows are stored as f32 (cc=none,
 * lossless: outputs bit-identical to the in-memory engine) or q8/q4 groups
 * along head_dim, each token's rows quantized once when written
 * (ft_qrow_encode). An I/O thread fetches the next layer's cache while a
 * layer is computed and writes the new rows back behind it. */
typedef struct ft_kv_offload ft_kv_offload;

typedef struct ft_kv_offload_params {
    ft_policy policy;         /* c_pct, compress_cache, disk_uri           */
    uint32_t group_size;      /* q8/q4 values per group along head_dim: 64 */
    int max_batch, max_seq;   /* the context's                             */
    uint64_t device_budget;   /* resident cache + staging; 0 = no limit    */
    const char *token_file;   /* for ucx:// remotes (or FLEXTIER_TOKEN_FILE) */
    uint32_t chunk_tokens;    /* remote tier: tokens per chunk (0 = 64)    */
    unsigned failover_ms;     /* policy.replicas > 1: as ft_offload_params (0 = 1000) */
    int drop_cache;           /* the disk tier's file leaves the page cache
                                 as it is read and written (a memory budget) */
} ft_kv_offload_params;

typedef struct ft_kv_offload_stats {
    uint64_t read_logical[FT_TIER_COUNT], read_stored[FT_TIER_COUNT];     /* f32 vs encoded bytes */
    uint64_t written_logical[FT_TIER_COUNT], written_stored[FT_TIER_COUNT];
    uint64_t resident_bytes, staging_bytes;   /* device memory              */
    uint64_t tier_bytes[FT_TIER_COUNT];       /* capacity held per tier      */
    double io_busy_s, wait_s;                 /* I/O thread busy; compute waited */
    uint64_t fetches, prefetch_hits;
    uint64_t chunks_put, chunks_read;         /* remote tier                 */
    uint64_t retries;                         /* chunk reads issued again on a replica */
} ft_kv_offload_stats;

FT_API void ft_kv_offload_default_params(ft_kv_offload_params *p);
/* FT_ERR_NO_SPACE if the device part exceeds device_budget; store errors
 * opening the disk file or the memory nodes. */
FT_API ft_status ft_kv_offload_create(const ft_model *m, const ft_kv_offload_params *p, ft_kv_offload **out);
FT_API void ft_kv_offload_free(ft_kv_offload *o);
/* The hooks to install with ft_ctx_set_kv_hooks. */
FT_API void ft_kv_offload_hooks(ft_kv_offload *o, ft_kv_hooks *out);
/* Wait for every queued fetch and write-back; returns a pending I/O error. */
FT_API ft_status ft_kv_offload_sync(ft_kv_offload *o);
FT_API void ft_kv_offload_get_stats(const ft_kv_offload *o, ft_kv_offload_stats *out);
FT_API void ft_kv_offload_reset_stats(ft_kv_offload *o);
FT_API ft_tier ft_kv_offload_tier_of(const ft_kv_offload *o, int slot);

#ifdef __cplusplus
}
#endif
#endif
