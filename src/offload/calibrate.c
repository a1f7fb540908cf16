/* Measuring what the cost model needs (include/flextier/offload.h):
 * memory bandwidth, the engine's own times per compute format on
 * zero-weight copies of the model (FlexGen fits its constants from real
 * runs the same way), what making a fetched frame usable costs per weight
 * codec, and the read bandwidth of the disk tier and of a memory node. */
#define _GNU_SOURCE   /* sync_file_range, as the KV cache's disk tier writes */
#include "flextier/offload.h"
#include "flextier/model.h"
#include "flextier/store.h"

#include <dirent.h>
#include <fcntl.h>
#if defined(__x86_64__) || (defined(__i386__) && defined(__SSE2__))
#include <emmintrin.h>
#endif
#include <stdint.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
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

/* The calling thread's CPU time: what calibration times. A step timed in
 * wall-clock seconds on a machine shared with other processes measures
 * their load as much as the engine (five plans of one policy under load
 * 11 predicted 14.0-29.5 tok/s); its CPU time is the work, which the plan
 * divides by the share of a core a thread gets when it is made
 * (measure_cpu_share, ft_cost_rescale_cpu). The engine's multi-threaded
 * steps use the process's CPU time over the threads (eng_now), read
 * exactly (ft_calib_clock). */
static double cpu_now(void)
{
    struct timespec t;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t)) return ft_now();
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static double proc_cpu_now(void)
{
    struct timespec t;
    if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t)) return ft_now();
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* The process's CPU time, read exactly over its threads
 * (ft_calib_clock, offload.h). The process clock (CLOCK_PROCESS_CPUTIME_ID)
 * counts a thread running on another core only as of that core's last
 * scheduler tick (or the thread's last sleep): a 1.25 ms layer of the
 * h1024 Llama's q4 copy at batch 16 on two threads read 0.62, 0.85, 1.08,
 * 1.24, 0.62 ms of CPU over the threads in successive steps, a sawtooth
 * of the worker's ticks, whose median was the caller's half alone: the
 * plan's q4 layers came at 0.78 ms where the run spends 1.3, and the
 * in-memory q4 rows were predicted 1.4-2x too fast. A thread's own clock
 * read from another thread is exact (Linux brings a running thread's
 * runtime up to date when it is read). */
void ft_calib_clock_init(ft_calib_clock *c)
{
    if (!c) return;
    c->n = 0;
#if defined(__linux__)
    DIR *d = opendir("/proc/self/task");
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        char *end;
        long tid = strtol(e->d_name, &end, 10);
        if (*end || tid <= 0 || tid > 0x3fffffff) continue;
        if (c->n == FT_CALIB_CLOCK_MAX) { c->n = 0; break; }
        /* the kernel's thread CPU clock id: ~tid << 3 | PERTHREAD (4) | SCHED (2) */
        unsigned u = (~(unsigned)tid << 3) | 6u;
        c->id[c->n++] = (int)u;
    }
    closedir(d);
#endif
}

double ft_calib_clock_now(const ft_calib_clock *c)
{
    if (!c || c->n < 1) return proc_cpu_now();
    double s = 0;
    for (int i = 0; i < c->n; i++) {
        struct timespec t;
        if (clock_gettime((clockid_t)c->id[i], &t) == 0) s += (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
    }
    return s;
}

/* Write [p, p + n) back and drop it from every cache level (clflush; on
 * AArch64 dc civac), then fence: the next read comes from DRAM. 0 where
 * this build has no such instruction (nothing done). */
int ft_calib_flush(const void *p, size_t n)
{
#if defined(__x86_64__) || (defined(__i386__) && defined(__SSE2__)) || defined(__aarch64__)
    if (!p || !n) return 1;
    const char *c = (const char *)((uintptr_t)p & ~(uintptr_t)63), *e = (const char *)p + n;
#if defined(__aarch64__)
    for (; c < e; c += 64) __asm__ volatile("dc civac, %0" : : "r"(c) : "memory");
    __asm__ volatile("dsb ish" : : : "memory");
#else
    for (; c < e; c += 64) _mm_clflush(c);
    _mm_mfence();
#endif
    return 1;
#else
    (void)p;
    (void)n;
    return 0;
#endif
}

/* One thread's share of a streaming read: memchr for a byte the buffer does not hold reads every byte at the C
 * library's vector speed (a plain summing loop, not vectorized at -O2,
 * ran at 23 GB/s from the L2: no faster than DRAM). */
typedef struct { const uint8_t *p; size_t n; uint64_t sum; } rd_arg;

static void *rd_main(void *arg)
{
    rd_arg *a = arg;
    const void *q = memchr(a->p, 0xab, a->n);
    a->sum = q ? 1 : 2;
    return NULL;
}

/* DRAM read bandwidth on `threads` threads (the weights a decode step
 * streams): a 64 MiB buffer (under a memory bound a quarter of it, at
 * least 8 MiB) flushed from the caches before each read, split among the
 * threads; the best of 9 reads after one unmeasured, by the wall clock
 * from the threads' start to the last one's end. Not the threads' CPU
 * time: under load they take turns, and each alone reads faster (two
 * threads' CPU times said 34-74 GB/s at load 5). Without a cache flush
 * the buffer's size alone keeps it out of the cache where the budget
 * allows. Before (issue 20) this was a memcpy of two 32 MiB buffers
 * under a 160 MiB budget, partly in the 32 MiB L3: 42 GB/s where a read
 * of DRAM gives 25 (one thread) to 33 (two). */
static double measure_mem_bw(uint64_t memory, unsigned threads)
{
    enum { MAXT = 64, REPS = 9 };
    size_t n = 64u << 20;
    while (memory && n > (8u << 20) && (uint64_t)n > memory / 4) n /= 2;
    if (threads < 1) threads = 1;
    if (threads > MAXT) threads = MAXT;
    uint8_t *a = ft_malloc_aligned(n, 64);
    if (!a) return 10e9;
    memset(a, 1, n);
    size_t per = n / threads / 64 * 64;
    double best = 0;
    volatile uint64_t sink = 0;
    for (int r = -1; r < REPS; r++) {
        ft_calib_flush(a, n);
        pthread_t th[MAXT];
        rd_arg ra[MAXT];
        unsigned started = 0;
        for (unsigned i = 0; i < threads; i++) {
            ra[i].p = a + i * per;
            ra[i].n = per;
        }
        double t0 = ft_now();
        for (unsigned i = 1; i < threads; i++)
            if (pthread_create(&th[i], NULL, rd_main, &ra[i]) == 0) started = i;
            else break;
        rd_main(&ra[0]);
        sink += ra[0].sum;
        for (unsigned i = 1; i <= started; i++) {
            pthread_join(th[i], NULL);
            sink += ra[i].sum;
        }
        double t = ft_now() - t0, bw = t > 0 ? (double)(per * (started + 1)) / t : 0;
        if (r >= 0 && bw > best) best = bw;
    }
    (void)sink;
    ft_free_aligned(a);
    return best > 0 ? best : 10e9;
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
        double tm[5];
        for (int r = -1; r < 5; r++) {   /* r = -1: warm-up */
            double t0 = cpu_now();
            if (c == FT_CODEC_BYTEPLANE) ft_decode(ctx, f, fs, &d, n * 2);
            else ft_frame_verify(ctx, f, fs, NULL);
            if (r >= 0) tm[r] = cpu_now() - t0;
        }
        /* as computed on: bf16 for none/bp, the frame for q8/q4 */
        double used = c == FT_CODEC_Q8 || c == FT_CODEC_Q4 ? (double)fs : (double)(n * 2);
        in->ratio[c] = c == FT_CODEC_BYTEPLANE ? (double)(n * 2) / (double)fs : 1.0;
        in->decode_bw[c] = used / median(tm, 5);
        ft_free_aligned(f);
    }
done:
    ft_codec_ctx_free(ctx);
    ft_free_aligned(w);
    ft_free_aligned(out);
}

/* Read bandwidth of a store: write then read a 16 MiB raw tensor. */
static double measure_store_bw(const char *uri, int drop_cache)
{
    ft_store *s = NULL;
    ft_store_params sp;
    ft_store_default_params(&sp);
    sp.codec_threads = 1;
    /* under a memory budget the disk tier is read from the disk itself,
     * not from the page cache: measure that */
    sp.drop_cache = drop_cache;
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
            double tm[5];
            for (int r = 0; r < 5; r++) {
                ft_tensor d = {0};
                d.dtype = FT_U8;
                d.data = buf;
                double t0 = ft_now();
                ft_read_tensor_into(s, "flextier-plan-probe", &d, n);
                tm[r] = ft_now() - t0;
            }
            bw = (double)n / median(tm, 5);
            ft_delete_tensor(s, "flextier-plan-probe");
        }
        ft_free_aligned(buf);
    }
    ft_store_close(s);
    return bw;
}

/* The share of a core each of n threads gets now: n threads spin for 60
 * ms and compare their CPU time with the wall time (1: an idle machine;
 * 0.4 under a load that leaves 40%); the median of 3. Calibration times
 * CPU time (cpu_now), the work; the plan divides it by this share. */
typedef struct { double share; } spin_arg;

static void *spin_main(void *arg)
{
    spin_arg *a = arg;
    struct timespec c0, c1;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
    double t0 = ft_now(), t;
    volatile uint64_t x = 0;
    do {
        for (int i = 0; i < 20000; i++) x += (uint64_t)i * 2654435761u;
        t = ft_now();
    } while (t - t0 < 0.06);
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
    double cpu = (double)(c1.tv_sec - c0.tv_sec) + 1e-9 * (double)(c1.tv_nsec - c0.tv_nsec);
    a->share = cpu / (t - t0);
    return NULL;
}

static double measure_cpu_share(unsigned n)
{
    enum { MAXT = 64 };
    if (n < 1) n = 1;
    if (n > MAXT) n = MAXT;
    double v[3];
    for (int r = 0; r < 3; r++) {
        pthread_t th[MAXT];
        spin_arg a[MAXT];
        unsigned started = 0;
        for (unsigned i = 1; i < n; i++)
            if (pthread_create(&th[i], NULL, spin_main, &a[i]) == 0) started = i;
            else break;
        spin_main(&a[0]);
        double sum = a[0].share;
        for (unsigned i = 1; i <= started; i++) {
            pthread_join(th[i], NULL);
            sum += a[i].share;
        }
        v[r] = sum / (double)(started + 1);
    }
    double m = median(v, 3);
    return m > 0.02 ? (m < 1.0 ? m : 1.0) : 0.02;
}

double ft_cpu_share(unsigned threads) { return measure_cpu_share(threads); }

/* The hand-off latency: two threads pass a token back and forth through a
 * mutex and condition variables as the scheduler's compute and I/O
 * threads do; half the median round trip, over at least 8 and until 0.15
 * s (at most 64). */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int turn, stop;
} pingpong;

static void *pong_main(void *arg)
{
    pingpong *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (p->turn != 1 && !p->stop) pthread_cond_wait(&p->cv, &p->mu);
        if (p->stop) break;
        p->turn = 0;
        pthread_cond_broadcast(&p->cv);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

static double measure_handoff(void)
{
    pingpong p;
    memset(&p, 0, sizeof p);
    if (pthread_mutex_init(&p.mu, NULL)) return 0;
    if (pthread_cond_init(&p.cv, NULL)) { pthread_mutex_destroy(&p.mu); return 0; }
    pthread_t th;
    double v[64], h = 0;
    int n = 0;
    if (pthread_create(&th, NULL, pong_main, &p) == 0) {
        double start = ft_now();
        for (int r = -1; r < 64; r++) {   /* r = -1: warm-up */
            if (r >= 8 && ft_now() - start > 0.15) break;
            double t0 = ft_now();
            pthread_mutex_lock(&p.mu);
            p.turn = 1;
            pthread_cond_broadcast(&p.cv);
            while (p.turn != 0) pthread_cond_wait(&p.cv, &p.mu);
            pthread_mutex_unlock(&p.mu);
            if (r >= 0) v[n++] = ft_now() - t0;
        }
        pthread_mutex_lock(&p.mu);
        p.stop = 1;
        pthread_cond_broadcast(&p.cv);
        pthread_mutex_unlock(&p.mu);
        pthread_join(th, NULL);
        h = n ? median(v, (size_t)n) / 2 : 0;
    }
    pthread_cond_destroy(&p.cv);
    pthread_mutex_destroy(&p.mu);
    return h;
}

/* How fast a streamed LM head comes from the checkpoint file, read as
 * the engine reads it (src/engine/gstream.c): 4 MiB chunks with pread, the
 * next one asked for with WILLNEED, each dropped from the page cache after
 * use; the head (the largest tensor named lm_head, else embed_tokens /
 * wte: a tied head) dropped first, so the reads are cold. Up to 32 MiB per
 * pass, the median of 3 passes. 0: no such tensor, or it failed. */
static double measure_head_bw(const char *dir)
{
    ft_checkpoint *ck = NULL;
    if (ft_checkpoint_open(dir, &ck)) return 0;
    const char *best = NULL;
    size_t bsz = 0;
    for (int pass = 0; pass < 2 && !best; pass++)
        for (size_t i = 0; i < ft_checkpoint_count(ck); i++) {
            const char *nm = ft_checkpoint_name(ck, i);
            int match = pass == 0 ? strstr(nm, "lm_head") != NULL
                                  : strstr(nm, "embed_tokens") != NULL || strstr(nm, "wte") != NULL;
            ft_tensor t;
            if (!match || ft_checkpoint_get(ck, nm, &t)) continue;
            uint64_t ne = 0;
            if (ft_tensor_numel(&t, &ne)) continue;
            size_t sz = (size_t)ne * (ft_dtype_bits(t.dtype) / 8);
            if (sz > bsz) { bsz = sz; best = nm; }
        }
    double bw = 0;
    const char *path = NULL;
    uint64_t off = 0;
    ft_tensor t;
    int fd = -1;
    char *buf = NULL;
    enum { CHUNK = 4 << 20 };
    if (!best || ft_checkpoint_get(ck, best, &t) || ft_checkpoint_locate(ck, t.data, &path, &off)) goto done;
    fd = open(path, O_RDONLY | O_CLOEXEC);
    buf = malloc(CHUNK);
    if (fd < 0 || !buf) goto done;
    size_t span = bsz < (32u << 20) ? bsz : (32u << 20);
    double tm[3];
    int ok = 1;
    for (int r = 0; r < 3 && ok; r++) {
        (void)posix_fadvise(fd, (off_t)off, (off_t)span, POSIX_FADV_DONTNEED);
        double t0 = ft_now();
        for (size_t done = 0; done < span && ok;) {
            size_t n = span - done < CHUNK ? span - done : CHUNK;
            if (done + n < span)
                (void)posix_fadvise(fd, (off_t)(off + done + n), (off_t)CHUNK, POSIX_FADV_WILLNEED);
            ssize_t got = pread(fd, buf, n, (off_t)(off + done));
            if (got <= 0) ok = 0;
            else {
                (void)posix_fadvise(fd, (off_t)(off + done), (off_t)got, POSIX_FADV_DONTNEED);
                done += (size_t)got;
            }
        }
        tm[r] = ft_now() - t0;
    }
    if (ok) bw = (double)span / median(tm, 3);
done:
    free(buf);
    if (fd >= 0) close(fd);
    ft_checkpoint_close(ck);
    return bw;
}

/* The last-level cache's size (0 if unknown): the kernel's (sysfs), else
 * the C library's; the smaller where both are known. On this project's VM
 * glibc's sysconf reported 320 MiB (from cpuid) for a 32 MiB L3, so no
 * model under 640 MiB was evicted between timed steps or probe rounds, and
 * a 21 MiB layer read back through the page cache at 17.6 GB/s. */
static uint64_t llc_bytes(void)
{
    long v = 0;
#ifdef _SC_LEVEL3_CACHE_SIZE
    v = sysconf(_SC_LEVEL3_CACHE_SIZE);
#endif
    uint64_t k = 0;
    FILE *f = fopen("/sys/devices/system/cpu/cpu0/cache/index3/size", "re");
    if (f) {
        char b[64] = "";
        if (fgets(b, sizeof b, f)) {
            char *e = NULL;
            k = strtoull(b, &e, 10);
            if (e && (*e == 'K' || *e == 'k')) k <<= 10;
            else if (e && (*e == 'M' || *e == 'm')) k <<= 20;
        }
        fclose(f);
    }
    if (k && v > 0) return k < (uint64_t)v ? k : (uint64_t)v;
    return k ? k : v > 0 ? (uint64_t)v : 0;
}

/* Layer-begin times of one forward call (the engine's layer hook): a
 * layer's time is read between two hooks inside one step, not as the
 * difference of two runs of different copies (which the load's noise
 * swamped: five calibrations fitted 7.5-17.8 ms, once 0). */
typedef struct { double t[2], div; ft_calib_clock pc; } hook_ts;

/* The engine's clock (see time_engine): the process's CPU time over the
 * threads computing (div > 1; read exactly, ft_calib_clock), else the calling
 * thread's. */
static double eng_now(const ft_calib_clock *pc, double div)
{
    return div > 1 ? ft_calib_clock_now(pc) / div : cpu_now();
}

static ft_status ts_hook(void *user, int layer, ft_layer_weights *w)
{
    (void)w;
    hook_ts *h = user;
    if (layer >= 0 && layer < 2) h->t[layer] = eng_now(&h->pc, h->div);
    return FT_OK;
}

/* One timed copy of the model's config: n_layers (1 or 2) layers, `vocab`
 * tokens (weights zero: the arithmetic costs the same), in format fmt,
 * created in that format (q8/q4: from a bf16 copy), so calibration holds
 * at most two layers and a small vocabulary. Times: prefill of plen
 * tokens per sequence at `batch`, then decode steps at `batch` and at 1,
 * interleaved, after one unmeasured warm-up step of each, at least 9 of
 * each and until 0.4 s were spent (at most 41): the medians of the
 * step's total and (2 layers) of layer 0's time, between the hooks.
 * When the real model's step (its layers and LM head) is larger than the
 * last-level cache `llc`, the copy's weights are flushed from the caches
 * before each timed step (flush_model; `ev`, a buffer larger than the
 * cache, where no flush instruction exists), so that they come from DRAM
 * as they do in the run. */
typedef struct {
    double pre, pre_layer;      /* prefill: total, layer 0 (2 layers)      */
    double decb, decb_layer;    /* decode at batch: total, layer 0         */
    double dec1, dec1_layer;    /* at batch 1                              */
    double layer_bytes;         /* one layer's weights, as computed on     */
    double head_bytes;          /* the LM head's at the model's vocabulary */
    int cold;                   /* timed with the weights flushed          */
} engine_times;

typedef struct { uint8_t *p; size_t n; } evict_buf;

/* A buffer of twice the last-level cache, written before a timed round
 * so that what the round reads comes from DRAM: only where the budget
 * leaves room for it (a quarter of memory; 0: no budget). {NULL, 0}: none. */
static evict_buf evict_alloc(uint64_t llc, uint64_t memory)
{
    evict_buf e = {NULL, 0};
    if (llc && (!memory || 2 * llc <= memory / 4) && (e.p = ft_malloc_aligned((size_t)(2 * llc), 64)))
        e.n = (size_t)(2 * llc);
    return e;
}

static void evict_write(const evict_buf *e, int r)
{
    if (e && e->p) memset(e->p, r & 0xff, e->n);
}

/* The layer probes' buffer: for a model whose layers exceed twice the
 * cache (the run reads every layer once per step from DRAM). */
static evict_buf probe_evict(const ft_cost_inputs *in, uint64_t memory)
{
    evict_buf none = {NULL, 0};
    uint64_t llc = llc_bytes(), lb = 0;
    for (uint32_t k = 0; k < in->n_tensors; k++) lb += in->tensor_bytes[in->probe_codec][k];
    return llc && (uint64_t)in->n_layers * lb > 2 * llc ? evict_alloc(llc, memory) : none;
}

/* Bytes of chunk c of a q8/q4 matrix: its rows' (min, step) pairs, then
 * their values (the layout ft_wmat_row_f32 reads). */
static size_t qchunk_bytes(const ft_wmat *w, int c)
{
    size_t cols = (size_t)w->cols, gpr = w->group > 0 ? cols / (size_t)w->group : 0;
    int nr = w->rows - c * w->rows_per_chunk;
    if (nr > w->rows_per_chunk) nr = w->rows_per_chunk;
    if (nr < 0) nr = 0;
    return (size_t)nr * (4 * gpr + (w->fmt == FT_WF_Q8 ? cols : (cols + 1) / 2));
}

/* Flush the timed copy's own weights from the caches (its plain tensors
 * through ft_model_tensor, its q8/q4 matrices chunk by chunk): the next
 * step reads them from DRAM, as the run of a model larger than the
 * last-level cache does, without a buffer of the cache's size (which a
 * memory budget may not leave: under 160 MiB none was written, and the
 * copies ran from the L3 at 2.1-2.4x the run's speed). 0: no flush
 * instruction in this build. */
static int flush_model(ft_model *m)
{
    size_t nt = ft_model_tensor_count(m);
    for (size_t i = 0; i < nt; i++) {
        ft_tensor v;
        uint64_t nb = 0;
        if (ft_model_tensor(m, i, NULL, &v) == FT_OK && v.data && ft_tensor_nbytes(&v, &nb) == FT_OK)
            if (!ft_calib_flush(v.data, (size_t)nb)) return 0;
    }
    ft_clear_error();
    const ft_model_config *cfg = ft_model_get_config(m);
    for (int l = 0; l < cfg->n_layers; l++) {
        ft_layer_weights *w = (ft_layer_weights *)ft_model_layer(m, l);
        for (int s = 0; w; s++) {
            ft_wmat *x = ft_layer_weights_mat(w, s);
            if (!x && s >= FT_LAYER_SLOTS) break;
            if (!x || (x->fmt != FT_WF_Q8 && x->fmt != FT_WF_Q4) || !x->chunk || x->rows_per_chunk < 1) continue;
            int nch = (x->rows + x->rows_per_chunk - 1) / x->rows_per_chunk;
            for (int c = 0; c < nch; c++)
                if (x->chunk[c] && !ft_calib_flush(x->chunk[c], qchunk_bytes(x, c))) return 0;
        }
    }
    return 1;
}

/* Before a timed step: the copy's weights out of the caches (cold), or,
 * without a flush instruction, a buffer larger than the cache written. */
static void evict_cache(ft_model *m, int cold, const evict_buf *e, int r)
{
    if (!cold) return;
    if (flush_model(m)) return;
    evict_write(e, r);
}

static ft_status time_engine(const ft_model_config *base, int nl, int vocab, uint32_t batch, uint32_t plen,
                             unsigned threads, ft_wfmt fmt, uint64_t llc, const evict_buf *ev, engine_times *out)
{
    ft_model_config cfg = *base;
    cfg.n_layers = nl;
    cfg.vocab = vocab;
    ft_model *m = NULL;
    ft_ctx *c = NULL;
    int q = fmt == FT_WF_Q8 || fmt == FT_WF_Q4;
    memset(out, 0, sizeof *out);
    ft_status st = ft_model_create_fmt(&cfg, 0, q ? FT_WF_BF16 : fmt, &m);
    if (st) return st;
    if (q) {
        ft_model *qm = NULL;
        st = ft_model_convert(m, (int)fmt, &qm);
        ft_model_free(m);
        if (st) return st;
        m = qm;
    }
    /* What a decode step of the real model streams: its layers, and its
     * LM head (or the tied embeddings) at the full vocabulary; larger than
     * the last-level cache (32 MiB when unknown), the copy is timed cold */
    {
        uint64_t emb = 0, head = 0;
        ft_model_global_split(m, &emb, &head);
        if (!head) head = emb;
        out->layer_bytes = (double)ft_model_layer_bytes(m);
        out->head_bytes = vocab > 0 ? (double)head * (double)base->vocab / (double)vocab : 0;
        double step = (double)base->n_layers * out->layer_bytes + out->head_bytes;
        out->cold = step > (double)(llc ? llc : 32u << 20);
    }
    int cold = out->cold;
    enum { MINREPS = 9, MAXREPS = 41 };
    ft_ctx_params cp = {0};
    cp.max_batch = (int)batch;
    cp.max_seq = (int)plen + 2 * (MAXREPS + 1) + 2;
    cp.max_rows = (int)(batch * plen);
    cp.threads = threads;
    cp.kv_dtype = FT_BF16;
    if ((st = ft_ctx_create(m, &cp, &c))) { ft_model_free(m); return st; }
    /* Several compute threads: the calling thread's CPU time is its share
     * of the work, which moves with whether the pool's workers got a core
     * (they take items from one counter): three --recalibrate plans of
     * the h2048 Llama's q4 layer at 2 threads timed 0.65, 0.95 and 1.29
     * ms. The process's CPU time over the threads is the work's, however
     * it was split: 0.55, 0.86 and 0.62 ms, interleaved with those (the
     * rest moves with the other processes' memory traffic, which a CPU
     * share does not see). */
    double div = threads ? (double)threads : (double)ft_default_threads();
    hook_ts h = {{0, 0}, div, {0, {0}}};
    ft_calib_clock_init(&h.pc);   /* the compute pool's threads exist now */
    ft_ctx_set_layer_hook(c, ts_hook, &h);
    int32_t *toks = calloc((size_t)batch * plen, sizeof *toks);
    int *slots = calloc(batch, sizeof *slots);
    const int32_t **tp = calloc(batch, sizeof *tp);
    size_t *nt = calloc(batch, sizeof *nt);
    double *tb = calloc(MAXREPS, sizeof *tb), *t1 = calloc(MAXREPS, sizeof *t1);
    double *lb = calloc(MAXREPS, sizeof *lb), *l1 = calloc(MAXREPS, sizeof *l1);
    if (!toks || !slots || !tp || !nt || !tb || !t1 || !lb || !l1) st = FT_ERR_NOMEM;
    for (uint32_t j = 0; st == FT_OK && j < batch; j++) {
        slots[j] = (int)j;
        tp[j] = toks + (size_t)j * plen;
        nt[j] = plen;
    }
    evict_cache(m, cold, ev, 1);
    double t0 = eng_now(&h.pc, div);
    if (st == FT_OK) st = ft_ctx_forward(c, batch, slots, tp, nt, NULL, 0);
    out->pre = eng_now(&h.pc, div) - t0;
    out->pre_layer = nl >= 2 ? h.t[1] - h.t[0] : 0;
    int n = 0;
    double start = ft_now();
    for (int r = -1; r < MAXREPS && st == FT_OK; r++) {   /* r = -1: warm-up */
        if (r >= MINREPS && ft_now() - start > 0.4) break;
        for (uint32_t j = 0; j < batch; j++) nt[j] = 1;
        evict_cache(m, cold, ev, r);
        t0 = eng_now(&h.pc, div);
        st = ft_ctx_forward(c, batch, slots, tp, nt, NULL, 0);
        double a = eng_now(&h.pc, div) - t0, la = h.t[1] - h.t[0];
        if (st) break;
        evict_cache(m, cold, ev, r);
        t0 = eng_now(&h.pc, div);
        st = ft_ctx_forward(c, 1, slots, tp, nt, NULL, 0);
        double b = eng_now(&h.pc, div) - t0, lb1 = h.t[1] - h.t[0];
        if (r >= 0 && st == FT_OK) {
            tb[n] = a;
            t1[n] = b;
            lb[n] = la;
            l1[n] = lb1;
            n++;
        }
    }
    if (st == FT_OK && n > 0) {
        out->decb = median(tb, (size_t)n);
        out->dec1 = median(t1, (size_t)n);
        if (nl >= 2) {
            out->decb_layer = median(lb, (size_t)n);
            out->dec1_layer = median(l1, (size_t)n);
        }
    }
    free(toks); free(slots); free(tp); free(nt);
    free(tb); free(t1); free(lb); free(l1);
    ft_ctx_free(c);
    ft_model_free(m);
    return st;
}

void ft_cost_timing_fit(const double layer[2], const double total2[2], const double totalv2[2], double k,
                        ft_cost_timing *t)
{
    for (int j = 0; j < 2; j++) {
        double l = layer[j] > 0 ? layer[j] : 0;
        double f1 = total2[j] - 2.0 * l;                 /* fixed part at V1 */
        double fv2 = totalv2[j] > 0 ? totalv2[j] - l : f1; /* one layer at V2 */
        double f = f1 + k * (fv2 - f1);
        t->layer_decode_s[j] = l;
        t->fixed_decode_s[j] = f > 0 ? f : 0;
    }
}

void ft_cost_timing_fit_head(const double layer[2], const double head_layer[2], const double total2[2],
                             const double totalv2[2], double k, double span, ft_cost_timing *t)
{
    double tv[2] = {totalv2[0], totalv2[1]};
    if (k > 8 && span > 0)
        for (int j = 0; j < 2; j++) {
            double l = layer[j] > 0 ? layer[j] : 0, f1 = total2[j] - 2.0 * l;
            double h = head_layer ? (head_layer[j] > 0 ? head_layer[j] : 0) : l;
            if (h > 0) tv[j] = f1 + l + h * span;   /* V2 - V1 rows at the head format's cost per parameter */
        }
    ft_cost_timing_fit(layer, total2, tv, k, t);
}

/* Time the engine itself on copies of the model's config (FlexGen fits
 * its cost model from real runs the same way): per-layer and fixed
 * (embedding, head) times of a decode step at batch 1 and `batch`, and
 * of prefill per prompt token. A 2-layer copy at a small vocabulary (V1)
 * gives a layer's time (between the layer hooks) and the fixed part at
 * V1; one layer at V2 = min(vocab, 8192) gives the fixed part at V2, and
 * the fixed part is extrapolated linearly to the model's vocabulary:
 * calibration never holds the model's embeddings. */
static ft_status measure_engine(const char *dir, uint32_t batch, uint32_t plen, unsigned threads,
                                ft_wfmt fmt, uint64_t memory, uint64_t layer_params, uint64_t llc, double read_bw,
                                const evict_buf *ev, const ft_cost_timing *head_fmt,
                                ft_cost_timing *tmg)
{
    ft_model_config cfg;
    ft_status st = ft_model_config_load(dir, &cfg);
    if (st) return st;
    if (plen > 256) plen = 256;
    int V = cfg.vocab, V1 = V < 1024 ? V : 1024, V2 = V < 8192 ? V : 8192;
    /* under a memory bound the second vocabulary's embeddings and head
     * (f32 while converting: 16 bytes per entry) take at most a quarter */
    int edim = cfg.hidden > cfg.word_embed_proj_dim ? cfg.hidden : cfg.word_embed_proj_dim;
    while (memory && V2 > 2 * V1 && (uint64_t)V2 * (uint64_t)edim * 16 > memory / 4) V2 /= 2;
    engine_times b, c2;   /* (2 layers, V1), (1 layer, V2) */
    if ((st = time_engine(&cfg, 2, V1, batch, plen, threads, fmt, llc, ev, &b))) return st;
    memset(&c2, 0, sizeof c2);
    if (V2 > V1 && (st = time_engine(&cfg, 1, V2, batch, plen, threads, fmt, llc, ev, &c2))) return st;
    double k = V2 > V1 ? (double)(V - V1) / (double)(V2 - V1) : 0;
    ft_cost_timing *in = tmg;
    memset(in, 0, sizeof *in);
    in->batch[0] = 1;
    in->batch[1] = batch > 1 ? batch : 2;
    double layer[2] = {b.dec1_layer, b.decb_layer}, tot[2] = {b.dec1, b.decb}, totv[2] = {c2.dec1, c2.decb};
    /* Extrapolated more than 8x past the span measured (a memory bound
     * keeps V2 at 2048 or 4096 for a vocabulary of 32000: k = 30 or 10),
     * the difference of the two copies' fixed parts, a few hundred us
     * measured apart, swings the head's cost by its noise times k: three
     * --recalibrate plans of the 8-layer h2048 Llama under 448 MiB fitted
     * 7.6, 0 and 0.7 ms. The head is a matrix read by the layers'
     * kernels: its rows cost what a layer's parameters cost per parameter
     * (edim per row), at each batch, in the head's format: the layers'
     * own, or bf16 beside q8/q4 layers (head_fmt: a layer's times in that
     * format; the q4 layers' cost per parameter put the h1024 Llama's
     * bf16 head at batch 16 at 2.7 ms where it takes 6-7). */
    double span = layer_params ? (double)edim * (double)(V2 - V1) / (double)layer_params : 0;
    ft_cost_timing_fit_head(layer, head_fmt ? head_fmt->layer_decode_s : NULL, tot, totv, k, span, in);
    /* streamed from DRAM, a step reads every weight once: no faster than
     * the bytes at the read bandwidth (the extrapolated head, past the
     * largest vocabulary timed, is the least certain part) */
    if (b.cold) ft_cost_timing_floor(in, b.layer_bytes, b.head_bytes, read_bw);
    double ntok = (double)batch * plen;
    double pl = b.pre_layer > 0 ? b.pre_layer : 0, pf1 = b.pre - 2.0 * pl;
    double pf = V2 > V1 && c2.pre > 0 ? pf1 + k * ((c2.pre - pl) - pf1) : pf1;
    in->layer_prefill_s_per_token = pl / ntok;
    in->fixed_prefill_s_per_token = pf > 0 ? pf / ntok : 0;
    FT_LOG(FT_LOG_INFO, "plan: engine (%s%s): layer %.3f/%.3f ms, fixed %.3f/%.3f ms (batch 1/%u)",
           ft_wfmt_name(fmt), b.cold ? ", weights from DRAM" : ", weights in cache", 1e3 * in->layer_decode_s[0],
           1e3 * in->layer_decode_s[1], 1e3 * in->fixed_decode_s[0], 1e3 * in->fixed_decode_s[1], in->batch[1]);
    return FT_OK;
}

void ft_cost_timing_floor(ft_cost_timing *t, double layer_bytes, double fixed_bytes, double read_bw)
{
    if (!t || !(read_bw > 0) || !isfinite(read_bw)) return;
    double lf = layer_bytes > 0 ? layer_bytes / read_bw : 0, ff = fixed_bytes > 0 ? fixed_bytes / read_bw : 0;
    for (int j = 0; j < 2; j++) {
        if (t->layer_decode_s[j] < lf) t->layer_decode_s[j] = lf;
        if (t->fixed_decode_s[j] < ff) t->fixed_decode_s[j] = ff;
    }
}

void ft_cost_rescale_cpu(ft_cost_inputs *in, double k)
{
    if (!(k > 0) || !isfinite(k) || k == 1.0) return;
    for (int c = 0; c < FT_CODEC_COUNT; c++) {
        ft_cost_timing *t = &in->timing[c];
        for (int j = 0; j < 2; j++) {
            t->layer_decode_s[j] *= k;
            t->fixed_decode_s[j] *= k;
        }
        t->layer_prefill_s_per_token *= k;
        t->fixed_prefill_s_per_token *= k;
        in->decode_bw[c] /= k;
    }
    in->flops /= k;
    in->mem_bw /= k;
    in->bw[FT_TIER_HOST] /= k;
    in->disk_cpu_per_byte *= k;
}


/* ------------------------------------------------ the calibration cache */

/* What calibration measured about this machine for one model shape,
 * cached per (machine, model shape, run shape) so that repeated plans
 * agree and cost nothing: $XDG_CACHE_HOME/flextier/calib (or
 * ~/.cache/flextier/calib), one file per key. The file is only trusted
 * when its size, magic, key and checksum match and every value is a
 * finite non-negative number; anything else is measured again. */
#define CALIB_MAGIC 0x344249434c544654ull   /* "FTLCIB4" */
#define CALIB_HIST 5
/* One calibration's measurements. */
typedef struct calib_ent {
    double mem_bw, flops, host_bw, disk_bw;
    double share;                                   /* cpu_share_calibrated */
    double ratio[FT_CODEC_COUNT], decode_bw[FT_CODEC_COUNT];
    double timing[FT_CODEC_COUNT][2 + 2 + 2 + 2];   /* batch[2], layer[2], fixed[2], prefill[2] */
} calib_ent;
/* The last n (<= CALIB_HIST) calibrations of a key, oldest first: a plan
 * uses one made while memory read as fast as now (calib_pick). */
typedef struct calib_rec {
    uint64_t magic, key, n;
    double head_bw;                                 /* 0: not measured      */
    calib_ent e[CALIB_HIST];
    uint64_t sum;
} calib_rec;

static int calib_dir(const ft_calibrate_params *cp, char *out, size_t n)
{
    if (cp->cache_dir) {
        if (!*cp->cache_dir) return -1;
        snprintf(out, n, "%s", cp->cache_dir);
        return 0;
    }
    const char *e = getenv("FLEXTIER_CALIB_CACHE");
    if (e && (!strcmp(e, "0") || !strcmp(e, "off"))) return -1;
    if (e && *e == '/') { snprintf(out, n, "%s", e); return 0; }
    const char *x = getenv("XDG_CACHE_HOME"), *h = getenv("HOME");
    if (x && *x == '/') snprintf(out, n, "%s/flextier/calib", x);
    else if (h && *h == '/') snprintf(out, n, "%s/.cache/flextier/calib", h);
    else return -1;
    return 0;
}

static void mkdirs(const char *path)
{
    char b[4096];
    snprintf(b, sizeof b, "%s", path);
    for (char *p = b + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            (void)mkdir(b, 0755);
            *p = '/';
        }
    (void)mkdir(b, 0755);
}

/* The key: the machine (CPU model, cores, SIMD use), this build, the
 * model's config.json (its shape), the weights' format, the run planned
 * for (batch, prompt length, threads) and the codecs measured, and the
 * disk tier's device. */
static uint64_t calib_key(const char *dir, const ft_calibrate_params *cp, const ft_cost_inputs *in, unsigned threads,
                          unsigned dthreads, uint32_t batch, uint32_t plen)
{
    char b[1024], cpu[256] = "?";
    FILE *f = fopen("/proc/cpuinfo", "re");
    if (f) {
        char line[512];
        while (fgets(line, sizeof line, f))
            if (!strncmp(line, "model name", 10)) {
                const char *c = strchr(line, ':');
                c = c ? c + 1 : line;
                size_t k = strlen(c) < sizeof cpu - 1 ? strlen(c) : sizeof cpu - 1;
                memcpy(cpu, c, k);
                cpu[k] = '\0';
                break;
            }
        fclose(f);
    }
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    snprintf(b, sizeof b, "calib9|%s|%ld|%d|%s|%d|%u|%u|%u|%u|%x", cpu, ncpu, ft_simd_enabled(),
             ft_version_string(), (int)in->weights_fmt, threads, dthreads, batch, plen, cp->codecs);
    uint64_t h = ft_xxh3(b, strlen(b));
    char cfgp[4096];
    snprintf(cfgp, sizeof cfgp, "%s/config.json", dir);
    f = fopen(cfgp, "rb");
    if (f) {
        char buf[65536];
        size_t n = fread(buf, 1, sizeof buf, f);
        fclose(f);
        h ^= ft_xxh3_seed(buf, n, h);
    }
    return h;
}

/* The disk tier's bandwidth is cached apart from the engine's times (a
 * plan with a memory node and one with a disk share the latter), keyed by
 * the disk directory's device (its nearest existing ancestor's: the store
 * makes the directory) and whether reads pass the page cache. */
#define CALIB_DISK_MAGIC 0x344b534944544654ull   /* "FTDISK4" */
#define DISK_HIST 5
typedef struct calib_disk_rec {
    uint64_t magic, key;
    /* the last n (<= DISK_HIST) measurements, oldest first: bandwidth, the
     * KV cache's read and write per request, the reads' CPU per byte */
    uint64_t n;
    double bw[DISK_HIST], rd[DISK_HIST], wr[DISK_HIST], cpb[DISK_HIST];
    uint64_t sum;
} calib_disk_rec;

static double median_of(const double *v, uint64_t n)
{
    double t[DISK_HIST];
    memcpy(t, v, (size_t)n * sizeof *t);
    return median(t, (size_t)n);
}

static uint64_t disk_key(const ft_calibrate_params *cp, const ft_cost_inputs *in)
{
    unsigned long long dev = 0;
    if (cp->base->disk_uri[0]) {
        const char *d = strncmp(cp->base->disk_uri, "file:", 5) ? cp->base->disk_uri : cp->base->disk_uri + 5;
        /* the directory may not exist yet (the store makes it): the
         * device of its nearest existing ancestor */
        char path[FT_URI_MAX];
        snprintf(path, sizeof path, "%s", d);
        struct stat sb;
        for (;;) {
            if (stat(path, &sb) == 0) { dev = (unsigned long long)sb.st_dev; break; }
            char *sl = strrchr(path, '/');
            if (!sl) { if (stat(".", &sb) == 0) dev = (unsigned long long)sb.st_dev; break; }
            if (sl == path) { sl[1] = '\0'; if (stat(path, &sb) == 0) dev = (unsigned long long)sb.st_dev; break; }
            *sl = '\0';
        }
    }
    char b[256];
    /* the probe's frame sizes (q8/q4 ones read a quarter of the bytes per
     * request: another rate) are part of the key */
    /* and whether the store reads past the page cache (O_DIRECT) */
    ft_store_params sp;
    ft_store_default_params(&sp);
    snprintf(b, sizeof b, "disk11|%s|%llu|%d|%llu|%llu|%d|%d", ft_version_string(), dev, cp->drop_cache,
             (unsigned long long)in->tensor_bytes[FT_CODEC_RAW][0] ^ ((unsigned long long)in->n_tensors << 56),
             (unsigned long long)in->kv_bytes_per_token, (int)in->probe_codec, sp.direct_io);
    return ft_xxh3(b, strlen(b));
}

/* Read a record of exactly size bytes from path: 1, or 0 if the file is
 * missing, shorter or longer. */
static int record_load(const char *path, void *rec, size_t size)
{
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    size_t n = fread(rec, 1, size, f);
    int extra = fgetc(f) != EOF;
    fclose(f);
    return n == size && !extra;
}

/* A valid record's history into *r (0: none, or not valid). */
static int disk_load_rec(const char *path, uint64_t key, calib_disk_rec *r)
{
    if (!record_load(path, r, sizeof *r) || r->magic != CALIB_DISK_MAGIC || r->key != key ||
        r->sum != ft_xxh3(r, offsetof(calib_disk_rec, sum)) || r->n < 1 || r->n > DISK_HIST)
        return 0;
    for (uint64_t i = 0; i < r->n; i++)
        if (!isfinite(r->bw[i]) || r->bw[i] <= 0 || r->bw[i] > 1e15 || !isfinite(r->rd[i]) || r->rd[i] < 0 ||
            r->rd[i] > 10 || !isfinite(r->wr[i]) || r->wr[i] < 0 || r->wr[i] > 10 || !isfinite(r->cpb[i]) ||
            r->cpb[i] < 0 || r->cpb[i] > 1e-3)
            return 0;
    return 1;
}

/* What the plan uses: the median of the history of each. */
static void disk_use(const calib_disk_rec *r, double *bw, double *rd, double *wr, double *cpb)
{
    *bw = median_of(r->bw, r->n);
    *rd = median_of(r->rd, r->n);
    *wr = median_of(r->wr, r->n);
    *cpb = median_of(r->cpb, r->n);
}

static int disk_load(const char *path, uint64_t key, double *bw, double *rd, double *wr, double *cpb)
{
    calib_disk_rec r;
    if (!disk_load_rec(path, key, &r)) return 0;
    disk_use(&r, bw, rd, wr, cpb);
    return 1;
}

/* Write one record to path atomically (a temporary file renamed over it),
 * creating dir first; a cache write that fails leaves no file behind. */
static void record_save(const char *dir, const char *path, const void *rec, size_t size)
{
    mkdirs(dir);
    char tmp[4300];
    snprintf(tmp, sizeof tmp, "%s.%ld.tmp", path, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f) return;
    int ok = fwrite(rec, size, 1, f) == 1;
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path)) remove(tmp);
}

/* A new measurement joins the history (the oldest leaves past
 * DISK_HIST); *bw, *rd, *wr become the history's medians. */
static void disk_save(const char *dir, const char *path, uint64_t key, double *bw, double *rd, double *wr,
                      double *cpb)
{
    calib_disk_rec r;
    if (!disk_load_rec(path, key, &r)) {
        memset(&r, 0, sizeof r);
        r.magic = CALIB_DISK_MAGIC;
        r.key = key;
    }
    if (r.n == DISK_HIST) {
        memmove(r.bw, r.bw + 1, (DISK_HIST - 1) * sizeof *r.bw);
        memmove(r.rd, r.rd + 1, (DISK_HIST - 1) * sizeof *r.rd);
        memmove(r.wr, r.wr + 1, (DISK_HIST - 1) * sizeof *r.wr);
        memmove(r.cpb, r.cpb + 1, (DISK_HIST - 1) * sizeof *r.cpb);
        r.n--;
    }
    r.bw[r.n] = *bw;
    r.rd[r.n] = *rd;
    r.wr[r.n] = *wr;
    r.cpb[r.n] = *cpb;
    r.n++;
    disk_use(&r, bw, rd, wr, cpb);
    r.sum = ft_xxh3(&r, offsetof(calib_disk_rec, sum));
    record_save(dir, path, &r, sizeof r);
}

static void calib_pack(calib_ent *r, const ft_cost_inputs *in)
{
    r->mem_bw = in->mem_bw;
    r->flops = in->flops;
    r->host_bw = in->bw[FT_TIER_HOST];
    r->disk_bw = in->bw[FT_TIER_DISK];
    r->share = in->cpu_share_calibrated;
    for (int c = 0; c < FT_CODEC_COUNT; c++) {
        const ft_cost_timing *t = &in->timing[c];
        r->ratio[c] = in->ratio[c];
        r->decode_bw[c] = in->decode_bw[c];
        double v[8] = {t->batch[0], t->batch[1], t->layer_decode_s[0], t->layer_decode_s[1], t->fixed_decode_s[0],
                       t->fixed_decode_s[1], t->layer_prefill_s_per_token, t->fixed_prefill_s_per_token};
        memcpy(r->timing[c], v, sizeof v);
    }
}

static void calib_unpack(const calib_ent *r, ft_cost_inputs *in)
{
    in->mem_bw = r->mem_bw;
    in->flops = r->flops;
    in->bw[FT_TIER_HOST] = r->host_bw;
    in->bw[FT_TIER_DISK] = r->disk_bw;
    in->cpu_share_calibrated = r->share;
    for (int c = 0; c < FT_CODEC_COUNT; c++) {
        ft_cost_timing *t = &in->timing[c];
        const double *v = r->timing[c];
        in->ratio[c] = r->ratio[c];
        in->decode_bw[c] = r->decode_bw[c];
        t->batch[0] = (uint32_t)v[0];
        t->batch[1] = (uint32_t)v[1];
        t->layer_decode_s[0] = v[2];
        t->layer_decode_s[1] = v[3];
        t->fixed_decode_s[0] = v[4];
        t->fixed_decode_s[1] = v[5];
        t->layer_prefill_s_per_token = v[6];
        t->fixed_prefill_s_per_token = v[7];
    }
}

static int calib_ent_valid(const calib_ent *e)
{
    const double *d = &e->mem_bw;
    for (size_t i = 0; i < sizeof *e / sizeof(double); i++)
        if (!isfinite(d[i]) || d[i] < 0 || d[i] > 1e18) return 0;
    return e->mem_bw > 0 && e->flops > 0 && e->share > 0 && e->share <= 1;
}

static int calib_valid(const calib_rec *r, uint64_t key)
{
    if (r->magic != CALIB_MAGIC || r->key != key) return 0;
    if (r->sum != ft_xxh3(r, offsetof(calib_rec, sum))) return 0;
    if (r->n < 1 || r->n > CALIB_HIST || !isfinite(r->head_bw) || r->head_bw < 0 || r->head_bw > 1e18) return 0;
    for (uint64_t i = 0; i < r->n; i++)
        if (!calib_ent_valid(&r->e[i])) return 0;
    return 1;
}

/* A valid history into *r (0: none, or not valid). */
static int calib_load(const char *path, uint64_t key, calib_rec *r)
{
    return record_load(path, r, sizeof *r) && calib_valid(r, key);
}

/* How far apart two rates are, as a factor >= 1. */
static double spread(double a, double b)
{
    return a > b ? a / b : b / a;
}

/* Within this factor of each other two memory read rates are the same
 * state of the machine. */
#define CALIB_SAME_MEM 1.25

/* The calibration a plan uses: the one whose memory read rate is nearest
 * `now` (the rate a quick read measured for this plan) is the anchor;
 * -1 if even it is not within CALIB_SAME_MEM of `now`. Of those within
 * CALIB_SAME_MEM of the anchor (all of them when `now` is 0), the one of
 * median rate; of an even count's two middle ones, the one nearer `now`
 * (0: the slower). This VM's
 * host lends DRAM bandwidth in periods of minutes: five calibrations in a
 * row read 72.2, 71.1, 70.4, 44.0, 42.6 GB/s and the runs after each went
 * at 127, 129, 103, 101, 99 tok/s (the h2048 Llama's q4 layers, batch 1),
 * so a calibration from the other period predicts 1.4x off, and the
 * median of them all lags a change by three calibrations. The set was
 * once those within CALIB_SAME_MEM of `now` itself: with calibrations at
 * 31.8, 36.1, 36.3, 38.0 and 38.6 GB/s, quick reads of 30-40 took three
 * different ones, and three cached plans in a row spread 19% (10.8-12.9
 * tok/s); around the anchor all five are one state, and the plan keeps
 * 36.3. */
static int calib_pick(const calib_rec *r, double now)
{
    unsigned idx[CALIB_HIST], n = 0;
    if (r->n < 1) return -1;
    int k = 0;   /* the anchor */
    for (int i = 1; i < (int)r->n; i++)
        if (now > 0 && spread(r->e[i].mem_bw, now) < spread(r->e[k].mem_bw, now)) k = i;
    if (now > 0 && spread(r->e[k].mem_bw, now) > CALIB_SAME_MEM) return -1;
    for (unsigned i = 0; i < (unsigned)r->n; i++)
        if (!(now > 0) || spread(r->e[i].mem_bw, r->e[k].mem_bw) <= CALIB_SAME_MEM) idx[n++] = i;
    for (unsigned i = 1; i < n; i++)
        for (unsigned j = i; j > 0 && r->e[idx[j]].mem_bw < r->e[idx[j - 1]].mem_bw; j--) {
            unsigned t = idx[j];
            idx[j] = idx[j - 1];
            idx[j - 1] = t;
        }
    if (n % 2) return (int)idx[n / 2];
    unsigned lo = idx[n / 2 - 1], hi = idx[n / 2];
    if (!(now > 0)) return (int)lo;
    return (int)(spread(r->e[hi].mem_bw, now) < spread(r->e[lo].mem_bw, now) ? hi : lo);
}

static void calib_store(const char *dir, const char *path, calib_rec *r)
{
    r->sum = ft_xxh3(r, offsetof(calib_rec, sum));
    record_save(dir, path, r, sizeof *r);
}

/* A new calibration joins the key's history (the oldest leaves past
 * CALIB_HIST), which is saved; *in becomes the calibration calib_pick
 * takes from it (`now`: the memory read rate measured before, 0: none).
 * The history restarts where the file is missing or not valid, and
 * without a cache directory (dir NULL) is the new one alone. */
static void calib_append(const char *dir, const char *path, uint64_t key, double now, ft_cost_inputs *in)
{
    calib_rec r;
    if (!dir || !calib_load(path, key, &r)) {
        memset(&r, 0, sizeof r);
        r.magic = CALIB_MAGIC;
        r.key = key;
    }
    if (r.n == CALIB_HIST) {
        memmove(r.e, r.e + 1, (CALIB_HIST - 1) * sizeof *r.e);
        r.n--;
    }
    calib_pack(&r.e[r.n++], in);
    r.head_bw = in->head_bw;
    /* the calibrations like this one (or like the quick read that asked
     * for it); this one alone where the quick read matched none */
    int k = calib_pick(&r, now > 0 ? now : in->mem_bw);
    if (k >= 0 && k != (int)r.n - 1) {
        FT_LOG(FT_LOG_INFO, "plan: memory read %.1f GB/s in this calibration; the plan takes the median of the "
               "%s like it (%.1f GB/s)", in->mem_bw / 1e9, r.n > 1 ? "last calibrations" : "calibration",
               r.e[k].mem_bw / 1e9);
        calib_unpack(&r.e[k], in);
    }
    if (dir) calib_store(dir, path, &r);
}

/* The LM head's read rate measured after the history was saved: kept
 * with it (for every calibration of the key). */
static void calib_set_head(const char *dir, const char *path, uint64_t key, double head_bw)
{
    calib_rec r;
    if (!calib_load(path, key, &r)) return;
    r.head_bw = head_bw;
    calib_store(dir, path, &r);
}

/* Read bandwidth of the disk tier as the scheduler reads it: one layer's
 * tensors (their sizes as the model keeps them: the frame size sets the
 * device's request size; 4 MiB probes measured a quarter of what the
 * scheduler then read from the same disk) written as frames, then read
 * all at once (asynchronously, queue depth 8, as sched.c opens its
 * stores), past the page cache under a budget; the median of 5 after one
 * unmeasured. Within a memory bound the layer is cut to fit a quarter.
 * Each frame is read into room for its whole frame (ft_encode_bound: the
 * header grows 16 bytes per 256 KiB chunk; a fixed 4 KiB of room failed
 * every read of a tensor over 62.5 MiB, and the disk then measured 0 B/s:
 * a 7.4 GiB model's 86 MiB FFN matrices planned at 0.00 tok/s). A failure
 * is an error with the store's reason, never a bandwidth of 0.
 * cpu_time: time the reads by this process's CPU time instead of the
 * wall clock: reads that are memory copies (the page cache, a memory
 * node on this machine) are CPU work, rescaled by the plan's CPU share
 * like the engine's times. */
/* One round of a probe: the n frames read at once, as the scheduler
 * reads a layer's, and waited for. */
static ft_status read_frames(ft_store *s, char (*key)[64], uint8_t *buf, const size_t *off, const size_t *cap,
                             size_t *got, int n)
{
    ft_request *req[FT_COST_MAX_TENSORS] = {0};
    ft_status st = FT_OK;
    if (n > FT_COST_MAX_TENSORS) return ft_set_error(FT_ERR_INVALID_ARG, "plan: %d probe frames", n);
    for (int i = 0; !st && i < n; i++) st = ft_read_frame_async(s, key[i], buf + off[i], cap[i], &got[i], &req[i]);
    for (int i = 0; i < n; i++) {
        if (req[i]) {
            ft_status w = ft_request_wait(req[i], -1);
            if (!st) st = w;
        }
        ft_request_free(req[i]);
    }
    return st;
}

/* A probe's frames as the scheduler reads a layer's: the layer's tensors
 * at the probe codec's sizes (norms under 64 KiB left out), each in room
 * of its frame bound rounded up to `align`, while they fit a quarter of a
 * memory bound; none (no sizes, or none fits): 8 frames of 4 MiB. Their
 * count, or -1 (error set) for a tensor with no frame size. */
static int probe_frames(const ft_cost_inputs *in, uint64_t memory, size_t align, size_t *sz, size_t *off,
                        size_t *cap, size_t *total)
{
    ft_codec_params cp;
    ft_codec_default_params(&cp);
    cp.codec = FT_CODEC_RAW;
    int n = 0;
    *total = 0;
    for (uint32_t k = 0; k < in->n_tensors && n < FT_COST_MAX_TENSORS; k++) {
        size_t b = (size_t)in->tensor_bytes[in->probe_codec][k];
        if (b < (64u << 10)) continue;   /* norms: noise */
        int64_t shape[1] = {(int64_t)b};
        size_t fb = ft_encode_bound(&cp, FT_U8, 1, shape);
        if (!fb) {
            ft_set_error(FT_ERR_INVALID_ARG, "plan: a layer tensor of %zu bytes has no frame size", b);
            return -1;
        }
        fb = (fb + align - 1) & ~(align - 1);
        if (memory && *total + fb > memory / 4) break;
        off[n] = *total;
        cap[n] = fb;
        sz[n++] = b;
        *total += fb;
    }
    if (!n) {
        int64_t shape[1] = {4 << 20};
        size_t fb = (ft_encode_bound(&cp, FT_U8, 1, shape) + align - 1) & ~(align - 1);
        for (n = 0; n < 8; n++) { off[n] = *total; sz[n] = 4u << 20; cap[n] = fb; *total += fb; }
    }
    return n;
}

static ft_status layer_bw(const char *uri, int drop_cache, uint64_t memory, const ft_cost_inputs *in, int cpu_time,
                          double *out_bw, double *out_cpb)
{
    enum { N = FT_COST_MAX_TENSORS };
    size_t sz[N], off[N], cap[N], total = 0;
    ft_codec_params cp;
    ft_codec_default_params(&cp);
    cp.codec = FT_CODEC_RAW;
    *out_bw = 0;
    /* 4 KiB-aligned as sched.c's slots: O_DIRECT under a budget */
    int n = probe_frames(in, memory, 4096, sz, off, cap, &total);
    if (n < 0) return FT_ERR_INVALID_ARG;
    ft_store *s = NULL;
    ft_store_params sp;
    ft_store_default_params(&sp);
    sp.codec_threads = 1;
    sp.queue_depth = 8;
    sp.drop_cache = drop_cache;
    ft_status st = ft_store_open(uri, &sp, &s);
    if (st) return ft_set_error(st, "plan: cannot open the tier %s (disk or memory node) to measure it: %s", uri, ft_last_error());
    uint8_t *buf = ft_malloc_aligned(total, 4096);
    enum { RMIN = 5, RMAX = 15 };
    double tm[RMAX], tc[RMAX];
    int nr = 0;
    char key[N][64];
    int written = 0;
    uint64_t bytes = 0;
    if (!buf) st = ft_set_error(FT_ERR_NOMEM, "plan: no memory for the disk probe (%zu bytes)", total);
    for (int i = 0; !st && i < n; i++) {
        snprintf(key[i], sizeof key[i], "flextier-plan-probe-%d", i);
        memset(buf + off[i], 7 + i, sz[i]);
        int64_t shape[1] = {(int64_t)sz[i]};
        ft_tensor t;
        ft_tensor_init(&t, FT_U8, 1, shape, buf + off[i]);
        st = ft_write_tensor(s, key[i], &t, &cp);
        if (st) st = ft_set_error(st, "plan: cannot write the disk probe to %s: %s", uri, ft_last_error());
        else written = i + 1;
        bytes += sz[i];
    }
    /* Through the page cache a layer's frames read 5 times in a row stay
     * in the last-level cache (a 21 MiB layer read at 14.8 GB/s, and the
     * disk row then ran at 0.36x the prediction); the run reads every
     * layer once per step from DRAM: a model larger than twice the cache
     * gets a buffer of twice the cache written before each round. */
    evict_buf ev = {NULL, 0};
    if (!drop_cache) ev = probe_evict(in, memory);
    /* at least 5 rounds and 0.4 s (at most 15): a loopback node's one
     * layer came at 0.9-3.2 GB/s in plans 10 s apart */
    ft_calib_clock pc = {0, {0}};
    double start = ft_now();
    for (int r = -1; !st && r < RMAX; r++) {
        if (r >= RMIN && ft_now() - start > 0.4) break;
        size_t got[N];
        evict_write(&ev, r);
        if (r == 0) ft_calib_clock_init(&pc);   /* the store's workers start with the first read */
        double c0 = ft_calib_clock_now(&pc), t0 = cpu_time ? c0 : ft_now();
        st = read_frames(s, key, buf, off, cap, got, n);
        double c1 = ft_calib_clock_now(&pc), t1 = cpu_time ? c1 : ft_now();
        if (st) st = ft_set_error(st, "plan: cannot read the disk probe from %s: %s", uri, ft_last_error());
        if (r >= 0) {
            tm[r] = t1 - t0;
            tc[r] = c1 - c0;
            nr = r + 1;
        }
    }
    if (!st && nr) {
        double t = median(tm, (size_t)nr);
        *out_bw = t > 0 ? (double)bytes / t : 1e15;
        /* the CPU the reads cost this process (the store's threads: the
         * kernel's copy out of the page cache and its page work) */
        if (out_cpb) *out_cpb = bytes ? median(tc, (size_t)nr) / (double)bytes : 0;
    }
    for (int i = 0; i < written; i++) ft_delete_tensor(s, key[i]);
    ft_free_aligned(ev.p);
    ft_free_aligned(buf);
    ft_store_close(s);
    return st;
}

ft_status ft_calibrate_disk_bw(const char *uri, int drop_cache, uint64_t memory, const ft_cost_inputs *in,
                               double *out_bw)
{
    return layer_bw(uri, drop_cache, memory, in, 0, out_bw, NULL);
}

/* a memory node's rate as layer_bw measures it; 0 when it could not (the
 * caller then tries one tensor) */
static double measure_layer_bw(const char *uri, int drop_cache, uint64_t memory, const ft_cost_inputs *in,
                               int cpu_time)
{
    double bw = 0;
    return layer_bw(uri, drop_cache, memory, in, cpu_time, &bw, NULL) ? 0 : bw;
}

/* Threads that keep cores busy while a probe runs, as the run's compute
 * threads do while the I/O thread fetches the next layer: a tight loop
 * until stopped. */
typedef struct {
    pthread_t th[64];
    unsigned n;
    _Atomic int stop;
} busy_set;

static void *busy_main(void *arg)
{
    busy_set *b = arg;
    volatile uint64_t x = 0;
    while (!atomic_load_explicit(&b->stop, memory_order_relaxed))
        for (int i = 0; i < 20000; i++) x += (uint64_t)i * 2654435761u;
    return NULL;
}

static void busy_start(busy_set *b, unsigned n)
{
    atomic_store(&b->stop, 0);
    b->n = 0;
    if (n > 64) n = 64;
    while (b->n < n && pthread_create(&b->th[b->n], NULL, busy_main, b) == 0) b->n++;
}

static void busy_stop(busy_set *b)
{
    atomic_store(&b->stop, 1);
    for (unsigned i = 0; i < b->n; i++) pthread_join(b->th[i], NULL);
    b->n = 0;
}

/* A fetch that needs this machine's cores (a memory node on this
 * machine, the disk tier through the page cache), timed as the scheduler
 * fetches a layer: its tensors' frames (the probe codec's sizes, within a
 * quarter of a memory bound) read at once (queue depth 8, as sched.c
 * opens its stores), then each frame's checksums verified on a codec
 * context of `vthreads` threads, as fetch_layer does on its decode
 * threads; once with the cores free, once while `busy` threads keep cores
 * busy as the run's compute threads do while the I/O thread fetches the
 * next layer. The checks read frames just written by another thread or
 * process, which no warm repeat shows: in the run of a loopback q4 row (2
 * vCPUs, 1 compute thread) a 6.6 MB layer's reads took 2.2-3.4 ms, as the
 * probe's, and its checks 1.5 ms where the codec probe's warm frames took
 * 0.15. By the wall clock, the medians of at least 9 rounds and 0.4 s
 * each way (at most 25: with 5 and 0.25 s a q4 layer's busy checks came
 * at 21-266 ps per byte in plans minutes apart). Zeros when it could not
 * be measured. */
static void measure_fetch_busy(const char *uri, uint64_t memory, const ft_cost_inputs *in, unsigned busy,
                               unsigned vthreads, ft_cost_fetch_busy *out)
{
    enum { N = FT_COST_MAX_TENSORS, RMIN = 9, RMAX = 25 };
    size_t sz[N], off[N], cap[N], got[N], total = 0;
    int written = 0;
    char key[N][64];
    memset(out, 0, sizeof *out);
    ft_codec_params cp;
    ft_codec_default_params(&cp);
    cp.codec = FT_CODEC_RAW;
    /* as layer_bw's, 8 frames of 4 MiB where no tensor fits (the link was
     * just measured with as many: the probe adds nothing to the peak;
     * under 160 MiB a loopback node's rows had no busy fetch, and plans
     * minutes apart put the link at 1.8-3.4 GB/s where the run's layers
     * came at 2.25) */
    int n = probe_frames(in, memory, 64, sz, off, cap, &total);
    if (n < 0) return;
    ft_store *s = NULL;
    ft_store_params sp;
    ft_store_default_params(&sp);
    sp.codec_threads = 1;
    sp.queue_depth = 8;
    if (ft_store_open(uri, &sp, &s)) {
        FT_LOG(FT_LOG_INFO, "plan: the fetch probe cannot open %s: %s", uri, ft_last_error());
        return;
    }
    ft_codec_ctx *cc = NULL;
    uint8_t *buf = ft_malloc_aligned(total, 64);
    double tr[2][RMAX], tv[2][RMAX];
    int nr[2] = {0, 0};
    uint64_t bytes = 0;
    ft_status st = buf && ft_codec_ctx_create(vthreads ? vthreads : 1, &cc) == FT_OK ? FT_OK : FT_ERR_NOMEM;
    for (int i = 0; !st && i < n; i++) {
        snprintf(key[i], sizeof key[i], "flextier-plan-fetch-%ld-%d", (long)getpid(), i);
        memset(buf + off[i], 11 + i, sz[i]);
        int64_t shape[1] = {(int64_t)sz[i]};
        ft_tensor t;
        ft_tensor_init(&t, FT_U8, 1, shape, buf + off[i]);
        if (!(st = ft_write_tensor(s, key[i], &t, &cp))) written = i + 1;
        bytes += sz[i];
    }
    /* as layer_bw: the run reads every layer once per step from DRAM, so
     * a model larger than twice the last-level cache gets a buffer of
     * twice the cache written before each round (without it the page
     * cache's busy fetch of a 23.6 MB layer read at 19 GB/s, the run's at
     * 4.9 ms a layer) */
    evict_buf ev = probe_evict(in, memory);
    for (int phase = 0; phase < 2 && !st; phase++) {   /* 0: the cores free, 1: busy */
        busy_set bs;
        if (phase == 1) busy_start(&bs, busy);
        double start = ft_now();
        for (int r = -1; !st && r < RMAX; r++) {
            if (r >= RMIN && ft_now() - start > 0.4) break;
            evict_write(&ev, r);
            double t0 = ft_now();
            st = read_frames(s, key, buf, off, cap, got, n);
            double t1 = ft_now();
            for (int i = 0; !st && i < n; i++) st = ft_frame_verify(cc, buf + off[i], got[i], NULL);
            if (r < 0 || st) continue;
            tr[phase][nr[phase]] = t1 - t0;
            tv[phase][nr[phase]++] = ft_now() - t1;
        }
        if (phase == 1) busy_stop(&bs);
    }
    if (st)
        FT_LOG(FT_LOG_INFO, "plan: the fetch probe of %s could not be measured (%s); its link rate stands", uri,
               ft_last_error());
    if (!st && nr[0] && nr[1] && bytes) {
        double r1 = median(tr[1], (size_t)nr[1]);
        out->bw_busy = r1 > 0 ? (double)bytes / r1 : 0;
        out->check_free = median(tv[0], (size_t)nr[0]) / (double)bytes;
        out->check_busy = median(tv[1], (size_t)nr[1]) / (double)bytes;
    }
    for (int i = 0; i < written; i++) ft_delete_tensor(s, key[i]);
    ft_free_aligned(ev.p);
    ft_codec_ctx_free(cc);
    ft_free_aligned(buf);
    ft_store_close(s);
}

/* n frames of cb bytes put on the node at uri, then read all at once as
 * the offloader reads a layer's chunks (queue depth 16, kvcache.c's): the
 * median of 5 rounds after one unmeasured, by the wall clock, per frame.
 * 0 when it cannot be measured. */
static double time_node_frames(ft_store *s, size_t cb, int n)
{
    enum { NMAX = 32 };
    if (n > NMAX) n = NMAX;
    uint8_t *buf = ft_malloc_aligned((size_t)n * cb, 64);
    char key[NMAX][64];
    int written = 0;
    double tm[5], per = 0;
    ft_status st = buf ? FT_OK : FT_ERR_NOMEM;
    ft_codec_params cp;
    ft_codec_default_params(&cp);
    cp.codec = FT_CODEC_RAW;
    for (int i = 0; !st && i < n; i++) {
        snprintf(key[i], sizeof key[i], "flextier-plan-kvprobe-%ld-%zu-%d", (long)getpid(), cb, i);
        memset(buf + (size_t)i * cb, 3 + i, cb);
        int64_t shape[1] = {(int64_t)cb};
        ft_tensor t;
        ft_tensor_init(&t, FT_U8, 1, shape, buf + (size_t)i * cb);
        if (!(st = ft_write_tensor(s, key[i], &t, &cp))) written = i + 1;
    }
    for (int r = -1; !st && r < 5; r++) {
        ft_request *rq[NMAX] = {0};
        ft_tensor d[NMAX];
        double t0 = ft_now();
        for (int i = 0; !st && i < n; i++) {
            memset(&d[i], 0, sizeof d[i]);
            d[i].dtype = FT_U8;
            d[i].data = buf + (size_t)i * cb;
            st = ft_read_tensor_async(s, key[i], &d[i], cb, &rq[i]);
        }
        for (int i = 0; i < n; i++) {
            if (rq[i]) {
                ft_status w = ft_request_wait(rq[i], -1);
                if (!st) st = w;
            }
            ft_request_free(rq[i]);
        }
        if (r >= 0) tm[r] = ft_now() - t0;
    }
    if (!st) per = median(tm, 5) / n;
    for (int i = 0; i < written; i++) ft_delete_tensor(s, key[i]);
    ft_free_aligned(buf);
    return per > 0 && isfinite(per) ? per : 0;
}

/* The KV cache's requests on a memory node: what one chunk request costs
 * beyond its bytes at the layer probe's rate bw (which the model charges
 * them). Timed at two sizes, 32 frames each read at once: 4 KiB (the
 * request's own cost) and the f32 chunk of kv_chunk_tokens tokens of K
 * and V (64 x kv_bytes_per_token: 256 KiB for 8 KV heads of 64), whose
 * rate differs from a layer's large frames (measured on loopback at load
 * 8: 0.5 ms per 256 KiB chunk in the run, 45 us per 4 KiB request, the
 * layer at 2.5 GB/s). The cost: the chunk's time beyond its bytes at bw,
 * at least the small request's. 0 when it cannot be measured. */
static double measure_remote_req(const char *uri, uint64_t memory, const ft_cost_inputs *in, double bw)
{
    size_t chunk = in->kv_chunk_tokens ? in->kv_chunk_tokens : 64;
    size_t cb = chunk * (size_t)(in->kv_bytes_per_token ? in->kv_bytes_per_token : 4096);
    if (cb > (4u << 20)) cb = 4u << 20;
    int n = 32, ns = 32;
    while (memory && n > 4 && (uint64_t)n * cb > memory / 8) n /= 2;
    while (memory && ns > 4 && (uint64_t)ns * 4096 > memory / 8) ns /= 2;
    ft_store *s = NULL;
    ft_store_params sp;
    ft_store_default_params(&sp);
    sp.codec_threads = 1;
    sp.queue_depth = 16;
    if (ft_store_open(uri, &sp, &s)) return 0;
    double small = time_node_frames(s, 4096, ns);
    double big = time_node_frames(s, cb, n);
    ft_store_close(s);
    double req = big > 0 ? big - (bw > 0 ? (double)cb / bw : 0) : 0;
    return req > small ? req : small;
}

/* The KV cache's requests on the disk tier, as kvcache.c makes them in a
 * file of the disk directory: a write of one row (K or V, f32) at its own
 * offset, synced to the disk and dropped from the page cache under a
 * budget (drop), and a read of one row (cold under a budget: the page
 * dropped first); the medians of 24 of each after one unmeasured, by the
 * wall clock. Measured on this VM: 0.2-0.7 ms per synced write, 0.1-1.3
 * ms per cold read, a few us through the page cache. 1: measured. */
static int measure_disk_req(const char *uri, int drop, const ft_cost_inputs *in, double *rd, double *wr)
{
    enum { N = 24, STRIDE = 64 << 10 };
    *rd = *wr = 0;
    const char *d = strncmp(uri, "file:", 5) ? uri : uri + 5;
    char path[4200];
    mkdirs(d);
    snprintf(path, sizeof path, "%s/.flextier-kv-probe-%ld", d, (long)getpid());
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return 0;
    size_t row = in->kv_bytes_per_token ? (size_t)(in->kv_bytes_per_token / 2) : 2048;
    if (row < 64) row = 64;
    if (row > STRIDE) row = STRIDE;
    uint8_t *b = malloc(row);
    double tw[N], tr[N];
    int ok = b != NULL && ftruncate(fd, (off_t)(N + 1) * STRIDE) == 0;
    if (b) memset(b, 5, row);
    for (int i = -1; ok && i < N; i++) {   /* i = -1: warm-up */
        off_t off = (off_t)(i + 1) * STRIDE;
        double t0 = ft_now();
        ok = pwrite(fd, b, row, off) == (ssize_t)row;
        if (drop) {
            (void)sync_file_range(fd, off, (off_t)row,
                                  SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
            (void)posix_fadvise(fd, off, (off_t)row, POSIX_FADV_DONTNEED);
        }
        if (i >= 0) tw[i] = ft_now() - t0;
    }
    if (ok && drop) {
        (void)fdatasync(fd);
        (void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    }
    for (int i = -1; ok && i < N; i++) {
        off_t off = (off_t)(i + 1) * STRIDE;
        double t0 = ft_now();
        ok = pread(fd, b, row, off) == (ssize_t)row;
        if (drop) (void)posix_fadvise(fd, off, (off_t)row, POSIX_FADV_DONTNEED);
        if (i >= 0) tr[i] = ft_now() - t0;
    }
    close(fd);
    unlink(path);
    free(b);
    if (!ok) return 0;
    *wr = median(tw, N);
    *rd = median(tr, N);
    return 1;
}

ft_status ft_cost_inputs_load(const char *dir, int weights, ft_cost_inputs *in)
{
    ft_load_params lp;
    ft_load_params_default(&lp);
    lp.external_layers = FT_LOAD_LAYOUT_ONLY;   /* sizes only: nothing is loaded */
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
    /* Compute and the I/O workers share the cores. */
    in->cores = ft_usable_cpus();   /* affinity and cgroup CPU quota */
    in->compute_threads = threads ? threads : ft_default_threads();
    in->decode_threads = cp->decode_threads ? cp->decode_threads : ft_default_threads();
    char cdir[4096], cpath[4200];
    int cached = 0, use_cache = calib_dir(cp, cdir, sizeof cdir) == 0;
    uint64_t key = 0;
    double now = 0;   /* the memory read rate measured for this plan */
    if (use_cache) {
        key = calib_key(dir, cp, in, in->compute_threads, in->decode_threads, batch, plen);
        snprintf(cpath, sizeof cpath, "%s/%016llx.bin", cdir, (unsigned long long)key);
        calib_rec hist;
        if (!cp->recalibrate && calib_load(cpath, key, &hist)) {
            /* still this machine's speed? A quick read of memory (tens of
             * ms) against the cached calibrations': where none read within
             * 25% of it (this VM's host reads DRAM at 37-44 GB/s for
             * minutes, then 66-75), calibrated again */
            now = cp->mem_bw_now > 0 ? cp->mem_bw_now
                  : cp->mem_bw_now < 0 ? 0 : measure_mem_bw(cp->memory, in->compute_threads);
            int k = calib_pick(&hist, now);
            if (k < 0) {
                FT_LOG(FT_LOG_INFO, "plan: memory reads at %.1f GB/s now, unlike the %llu cached calibration(s) "
                       "(the last %.1f GB/s): measuring again", now / 1e9, (unsigned long long)hist.n,
                       hist.e[hist.n - 1].mem_bw / 1e9);
            } else {
                calib_unpack(&hist.e[k], in);
                in->head_bw = hist.head_bw;
                cached = 1;
            }
        }
    }
    in->calibration_cached = cached;
    in->disk_direct = cp->drop_cache;
    if (cached) {
        FT_LOG(FT_LOG_INFO, "plan: calibration of this machine and model shape from %s (memory read %.1f GB/s "
               "then, %.1f now)", cpath, in->mem_bw / 1e9, now / 1e9);
    } else {
        FT_LOG(FT_LOG_INFO, "plan: measuring memory, the engine and the codecs");
        in->mem_bw = measure_mem_bw(cp->memory, in->compute_threads);
        /* a model larger than the last-level cache is read from DRAM in
         * the run: the timed copies are too, flushed from the caches
         * before each step (time_engine). Only without a flush
         * instruction: a buffer of twice the cache written instead, where
         * the budget leaves room for it */
        evict_buf ev = {NULL, 0};
        uint64_t llc = llc_bytes();
        if (!ft_calib_flush(NULL, 0)) ev = evict_alloc(llc, cp->memory);
        FT_LOG(FT_LOG_INFO, "plan: memory read %.1f GB/s on %u threads (DRAM), last-level cache %llu MiB (calibration room %.0f MiB)",
               in->mem_bw / 1e9, in->compute_threads, (unsigned long long)(llc >> 20), (double)cp->memory / 1048576.0);
        /* The engine's speed with each compute format the codecs imply:
         * none/bp compute on the weights' format, q8/q4 on their own. */
        unsigned wm = codec_mask | (1u << FT_CODEC_RAW);
        ft_status st = FT_OK;
        ft_cost_timing hb;   /* a bf16 layer's times where the checkpoint is f32/f16 */
        memset(&hb, 0, sizeof hb);
        for (int c = 0; c < FT_CODEC_COUNT && st == FT_OK; c++) {
            if (!(wm & (1u << c)) || c == FT_CODEC_BYTEPLANE) continue;
            if (c != FT_CODEC_RAW && c != FT_CODEC_Q8 && c != FT_CODEC_Q4) continue;
            ft_wfmt f = c == FT_CODEC_Q8 ? FT_WF_Q8 : c == FT_CODEC_Q4 ? FT_WF_Q4 : in->weights_fmt;
            /* q8/q4 layers keep a bf16 LM head (ft_tensor_format): its
             * cost per parameter is a bf16 layer's (the checkpoint's
             * format, timed first, or timed here for an f32/f16 one) */
            const ft_cost_timing *hf = NULL;
            if (f == FT_WF_Q8 || f == FT_WF_Q4) {
                if (in->weights_fmt != FT_WF_BF16 && !(hb.layer_decode_s[1] > 0))
                    st = measure_engine(dir, batch, plen, threads, FT_WF_BF16, cp->memory, in->layer_params, llc,
                                        in->mem_bw, &ev, NULL, &hb);
                hf = in->weights_fmt == FT_WF_BF16 ? &in->timing[FT_CODEC_RAW] : &hb;
            }
            if (st == FT_OK)
                st = measure_engine(dir, batch, plen, threads, f, cp->memory, in->layer_params, llc, in->mem_bw,
                                    &ev, hf, &in->timing[c]);
        }
        ft_free_aligned(ev.p);
        if (st) return st;
        in->timing[FT_CODEC_BYTEPLANE] = in->timing[FT_CODEC_RAW];
        /* sustained flop/s for the analytic fallback: the engine's own prefill */
        double tp = in->timing[FT_CODEC_RAW].layer_prefill_s_per_token;
        in->flops = tp > 0 ? 2.0 * (double)in->layer_params / tp : 1e10;
        in->bw[FT_TIER_HOST] = in->mem_bw / 2;
        measure_codecs(in, codec_mask | (1u << FT_CODEC_RAW));
        in->cpu_share_calibrated = 1.0;   /* CPU time: the work, whatever the load */
        calib_append(use_cache ? cdir : NULL, cpath, key, now, in);
    }
    /* Under a budget the LM head may be streamed from the checkpoint:
     * its read rate, cached with the rest */
    if (cp->drop_cache && !(in->head_bw > 0)) {
        in->head_bw = measure_head_bw(dir);
        if (use_cache && in->head_bw > 0) {
            /* a read rate of the checkpoint's disk, as noisy as the disk
             * tier's: the median of its last 5 measurements (three
             * --recalibrate plans of the small Llama under 160 MiB, its
             * head streamed, predicted 4.1-5.5 tok/s on an idle machine) */
            char hpath[4300];
            uint64_t hk = key ^ 0x6865616462773031ull;   /* "headbw01" */
            double z0 = 0, z1 = 0, z2 = 0;
            snprintf(hpath, sizeof hpath, "%s/head-%016llx.bin", cdir, (unsigned long long)hk);
            disk_save(cdir, hpath, hk, &in->head_bw, &z0, &z1, &z2);
            calib_set_head(cdir, cpath, key, in->head_bw);
        }
    }
    /* the frames' sizes set the request sizes: q8/q4 ones when the
     * weights are only those (--compress-weights q4) */
    in->probe_codec = FT_CODEC_RAW;
    {
        unsigned wmask = codec_mask & ((1u << FT_CODEC_RAW) | (1u << FT_CODEC_BYTEPLANE) | (1u << FT_CODEC_Q8) |
                                       (1u << FT_CODEC_Q4));
        if (wmask == (1u << FT_CODEC_Q4) || wmask == ((1u << FT_CODEC_Q4) | (1u << FT_CODEC_RAW)))
            in->probe_codec = FT_CODEC_Q4;
        else if (wmask == (1u << FT_CODEC_Q8) || wmask == ((1u << FT_CODEC_Q8) | (1u << FT_CODEC_RAW)))
            in->probe_codec = FT_CODEC_Q8;
    }
    in->bw[FT_TIER_DISK] = 0;
    if (base->disk_uri[0]) {
        char dpath[4200];
        uint64_t dk = disk_key(cp, in);
        int dcached = 0;
        /* By the wall clock, past the page cache (a budget) or through it
         * (memory copies on several threads of the store: in CPU time,
         * rescaled by one thread's share, it predicted the disk row at
         * 0.55-0.69x). */
        /* Cached, so that plans in a row agree; a disk shared with other
         * tenants changes under them (0.2-0.4 GB/s in runs whose cached
         * probe had said more): FLEXTIER_CALIB_DISK=measure measures it at
         * every plan instead. */
        const char *dc = getenv("FLEXTIER_CALIB_DISK");
        int cache_disk = !(dc && !strcmp(dc, "measure"));
        if (use_cache && cache_disk) {
            snprintf(dpath, sizeof dpath, "%s/disk-%016llx.bin", cdir, (unsigned long long)dk);
            if (!cp->recalibrate)
                dcached = disk_load(dpath, dk, &in->bw[FT_TIER_DISK], &in->disk_read_req_s, &in->disk_write_req_s,
                                    &in->disk_cpu_per_byte);
        }
        if (!dcached) {
            ft_status dst = layer_bw(base->disk_uri, cp->drop_cache, cp->memory, in, 0, &in->bw[FT_TIER_DISK],
                                     &in->disk_cpu_per_byte);
            if (dst) return dst;
            /* the KV cache's small reads and (synced) writes */
            if (!measure_disk_req(base->disk_uri, cp->drop_cache, in, &in->disk_read_req_s, &in->disk_write_req_s))
                FT_LOG(FT_LOG_WARN, "plan: could not time the KV cache's requests on %s", base->disk_uri);
            FT_LOG(FT_LOG_INFO, "plan: disk %.3f GB/s (%.2f CPU-ns per byte), KV cache row read %.0f us, write %.0f us",
                   in->bw[FT_TIER_DISK] / 1e9, 1e9 * in->disk_cpu_per_byte, 1e6 * in->disk_read_req_s,
                   1e6 * in->disk_write_req_s);
            /* the disk is shared: one probe of a second varied 2.3x with
             * other tenants' I/O, and so did --recalibrate's plans; the
             * plan uses the median of this disk's last 5 probes */
            if (use_cache && cache_disk && in->bw[FT_TIER_DISK] > 0)
                disk_save(cdir, dpath, dk, &in->bw[FT_TIER_DISK], &in->disk_read_req_s, &in->disk_write_req_s,
                          &in->disk_cpu_per_byte);
        }
        if (cache_disk) in->calibration_cached = in->calibration_cached && dcached;
    }
    if (base->n_remotes && !(given && given[FT_TIER_REMOTE] > 0)) {
        /* a memory node: one layer's frames read at once, as the
         * scheduler reads them (a single 16 MiB tensor measured 6-7.6
         * GB/s on loopback where the run's layers came at 1.2), by the
         * wall clock: measured every time, under the plan's load (on this
         * machine the node's own process copies too, which this process's
         * CPU time does not see). A codec agent serves tensors: a 16 MiB
         * one. */
        FT_LOG(FT_LOG_INFO, "plan: measuring the link to %s", base->remotes[0]);
        in->bw[FT_TIER_REMOTE] = in->agent_cores ? measure_store_bw(base->remotes[0], 0)
                                                 : measure_layer_bw(base->remotes[0], 0, cp->memory, in, 0);
        /* a layer's frames at once failed (seen inside a memory cgroup of
         * 160 MiB): one tensor */
        if (in->bw[FT_TIER_REMOTE] <= 0 && !in->agent_cores) in->bw[FT_TIER_REMOTE] = measure_store_bw(base->remotes[0], 0);
        if (in->bw[FT_TIER_REMOTE] <= 0)
            return ft_set_error(FT_ERR_NET, "cannot measure the link to %s", base->remotes[0]);

        /* the KV cache's chunk requests (a codec agent serves weights) */
        if (!in->agent_cores) {
            in->remote_req_s = measure_remote_req(base->remotes[0], cp->memory, in, in->bw[FT_TIER_REMOTE]);
            FT_LOG(FT_LOG_INFO, "plan: memory node %.3f GB/s, %.0f us per KV cache chunk request",
                   in->bw[FT_TIER_REMOTE] / 1e9, 1e6 * in->remote_req_s);
        }
    }
    /* Fetches beside compute on this machine's cores (the disk tier
     * through the page cache, a memory node on this machine): measured
     * again with the compute threads busy and their frames checked as
     * they arrive, by the wall clock at every plan, as the link is */
    memset(in->fetch_busy, 0, sizeof in->fetch_busy);
    /* as many spinning threads as compute threads, but a core left over:
     * compute waits for the fetch part of each step, and with every core
     * spinning the probe starved the node (the h2048 Llama's loopback rows
     * under 448 MiB at 2 threads on 2 cores ran 1.6-1.8x faster than
     * predicted, and the plan took byte-plane weights that ran slower
     * than the raw ones it had chosen before) */
    unsigned spin = in->compute_threads;
    if (in->cores > 1 && spin > in->cores - 1) spin = in->cores - 1;
    for (int t = FT_TIER_DISK; t <= FT_TIER_REMOTE; t++) {
        const char *uri = t == FT_TIER_DISK ? base->disk_uri : base->n_remotes ? base->remotes[0] : "";
        if (!uri[0] || (given && given[t] > 0)) continue;
        if (t == FT_TIER_DISK ? cp->drop_cache : !in->remote_local || in->agent_cores) continue;
        ft_cost_fetch_busy *fb = &in->fetch_busy[t];
        /* the disk tier's: cached with the disk's rate, the median of its
         * last 5 measurements (plans in a row agree; --recalibrate adds
         * one); a local node's: measured every time, as its link */
        const char *dc = getenv("FLEXTIER_CALIB_DISK");
        int keep = t == FT_TIER_DISK && use_cache && !(dc && !strcmp(dc, "measure"));
        char fpath[4300];
        uint64_t fk = 0;
        if (keep) {
            /* per disk, frame sizes and the threads that compute and check */
            fk = disk_key(cp, in) ^ 0x6662757379303033ull ^   /* "fbusy003" */
                 ft_xxh3_seed(&spin, sizeof spin, in->decode_threads);
            snprintf(fpath, sizeof fpath, "%s/fbusy-%016llx.bin", cdir, (unsigned long long)fk);
            double unused = 0;
            if (!cp->recalibrate && disk_load(fpath, fk, &fb->bw_busy, &fb->check_free, &fb->check_busy, &unused))
                continue;
        }
        measure_fetch_busy(uri, cp->memory, in, spin, in->decode_threads, fb);
        if (t == FT_TIER_REMOTE && in->remote_req_s > 0) {
            /* the KV cache's chunk requests beside busy cores too */
            busy_set bs;
            busy_start(&bs, spin);
            fb->req_busy = measure_remote_req(uri, cp->memory, in, fb->bw_busy > 0 ? fb->bw_busy : in->bw[t]);
            busy_stop(&bs);
        }
        if (keep && fb->bw_busy > 0) {
            double unused = 0;
            disk_save(cdir, fpath, fk, &fb->bw_busy, &fb->check_free, &fb->check_busy, &unused);
        }
        FT_LOG(FT_LOG_INFO, "plan: %s fetched at %.3f GB/s while %u threads spin; checks of fresh frames %.1f "
               "ps/byte (cores free), %.1f (busy); KV cache chunk request %.0f us busy", ft_tier_name((ft_tier)t),
               fb->bw_busy / 1e9, spin, 1e12 * fb->check_free, 1e12 * fb->check_busy, 1e6 * fb->req_busy);
    }
    {   /* what the plan rests on (FLEXTIER_LOG=info): to find which probe moves between plans */
        const ft_cost_timing *tr = &in->timing[FT_CODEC_RAW], *tq = &in->timing[FT_CODEC_Q4];
        FT_LOG(FT_LOG_INFO, "plan: calibrated (CPU time): layer %.3f/%.3f ms (batch %u/%u), fixed %.3f/%.3f ms, "
               "q4 layer %.3f/%.3f ms, q4 fixed %.3f/%.3f ms, check %.2f GB/s, q4 check %.2f GB/s, "
               "bp decode %.2f GB/s, mem %.2f GB/s; head %.3f GB/s",
               1e3 * tr->layer_decode_s[0], 1e3 * tr->layer_decode_s[1], tr->batch[0], tr->batch[1],
               1e3 * tr->fixed_decode_s[0], 1e3 * tr->fixed_decode_s[1], 1e3 * tq->layer_decode_s[0],
               1e3 * tq->layer_decode_s[1], 1e3 * tq->fixed_decode_s[0], 1e3 * tq->fixed_decode_s[1],
               in->decode_bw[FT_CODEC_RAW] / 1e9, in->decode_bw[FT_CODEC_Q4] / 1e9,
               in->decode_bw[FT_CODEC_BYTEPLANE] / 1e9, in->mem_bw / 1e9, in->head_bw / 1e9);
    }
    /* the CPU terms at the share of a core a thread gets now */
    in->cpu_share = cp->cpu_share > 0 ? (cp->cpu_share < 1 ? cp->cpu_share : 1.0) : measure_cpu_share(in->compute_threads);
    in->handoff_s = cp->cpu_share > 0 ? 0 : measure_handoff();
    FT_LOG(FT_LOG_INFO, "plan: a thread's share of a core %.2f, hand-off %.3f ms", in->cpu_share, 1e3 * in->handoff_s);
    ft_cost_rescale_cpu(in, in->cpu_share_calibrated / in->cpu_share);
    if (given && given[FT_TIER_HOST] > 0) in->bw[FT_TIER_HOST] = given[FT_TIER_HOST];
    if (base->disk_uri[0] && given && given[FT_TIER_DISK] > 0) in->bw[FT_TIER_DISK] = given[FT_TIER_DISK];
    if (base->n_remotes && given && given[FT_TIER_REMOTE] > 0) in->bw[FT_TIER_REMOTE] = given[FT_TIER_REMOTE];
    return FT_OK;
}
