/* Measuring what the cost model needs (include/flextier/offload.h):
 * memory bandwidth, the engine's own times per compute format on
 * zero-weight copies of the model (FlexGen fits its constants from real
 * runs the same way), what making a fetched frame usable costs per weight
 * codec, and the read bandwidth of the disk tier and of a memory node. */
#include "flextier/offload.h"
#include "flextier/model.h"
#include "flextier/store.h"

#include <math.h>
#include <stddef.h>
#include <sys/stat.h>
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

/* Streaming copy bandwidth (read + write), warm: 64 MiB buffers (well
 * above the last-level cache, small beside a memory budget), the median
 * of 5 copies after one unmeasured. */
static double measure_mem_bw(uint64_t memory)
{
    size_t n = 64u << 20;
    /* under a memory bound: a quarter of it each, at least 8 MiB */
    while (memory && n > (8u << 20) && 2 * (uint64_t)n > memory / 2) n /= 2;
    char *a = ft_malloc_aligned(n, 64), *b = ft_malloc_aligned(n, 64);
    if (!a || !b) { ft_free_aligned(a); ft_free_aligned(b); return 10e9; }
    memset(a, 1, n);
    memset(b, 2, n);
    memcpy(b, a, n);
    double t[5];
    for (int r = 0; r < 5; r++) {
        double t0 = ft_now();
        memcpy(b, a, n);
        t[r] = ft_now() - t0;
    }
    ft_free_aligned(a); ft_free_aligned(b);
    return 2.0 * (double)n / median(t, 5);   /* read + write */
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

/* One timed copy of the model's config: n_layers layers, `vocab` tokens
 * (weights zero: the arithmetic costs the same), in format fmt, created
 * in that format (q8/q4: from a bf16 copy), so calibration holds at most
 * two layers and a small vocabulary. Times: prefill of plen tokens per
 * sequence at `batch`, and the medians of 7 decode steps at `batch` and
 * at 1, after one unmeasured warm-up step of each. */
typedef struct { double pre, decb, dec1; } engine_times;

static ft_status time_engine(const ft_model_config *base, int nl, int vocab, uint32_t batch, uint32_t plen,
                             unsigned threads, ft_wfmt fmt, engine_times *out)
{
    ft_model_config cfg = *base;
    cfg.n_layers = nl;
    cfg.vocab = vocab;
    ft_model *m = NULL;
    ft_ctx *c = NULL;
    int q = fmt == FT_WF_Q8 || fmt == FT_WF_Q4;
    ft_status st = ft_model_create_fmt(&cfg, 0, q ? FT_WF_BF16 : fmt, &m);
    if (st) return st;
    if (q) {
        ft_model *qm = NULL;
        st = ft_model_convert(m, (int)fmt, &qm);
        ft_model_free(m);
        if (st) return st;
        m = qm;
    }
    enum { REPS = 7 };
    ft_ctx_params cp = {0};
    cp.max_batch = (int)batch;
    cp.max_seq = (int)plen + 2 * (REPS + 1) + 2;
    cp.max_rows = (int)(batch * plen);
    cp.threads = threads;
    cp.kv_dtype = FT_BF16;
    if ((st = ft_ctx_create(m, &cp, &c))) { ft_model_free(m); return st; }
    int32_t *toks = calloc((size_t)batch * plen, sizeof *toks);
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
    out->pre = ft_now() - t0;
    double tb[REPS], t1[REPS];
    for (int r = -1; r < REPS && st == FT_OK; r++) {   /* r = -1: warm-up */
        for (uint32_t j = 0; j < batch; j++) nt[j] = 1;
        t0 = ft_now();
        st = ft_ctx_forward(c, batch, slots, tp, nt, NULL, 0);
        double a = ft_now() - t0;
        t0 = ft_now();
        if (st == FT_OK) st = ft_ctx_forward(c, 1, slots, tp, nt, NULL, 0);
        if (r >= 0) {
            tb[r] = a;
            t1[r] = ft_now() - t0;
        }
    }
    if (st == FT_OK) {
        out->decb = median(tb, REPS);
        out->dec1 = median(t1, REPS);
    }
    free(toks); free(slots); free(tp); free(nt);
    ft_ctx_free(c);
    ft_model_free(m);
    return st;
}

/* Time the engine itself on 1- and 2-layer copies of the model's config
 * (FlexGen fits its cost model from real runs the same way): per-layer
 * and fixed (embedding, head) times of a decode step at batch 1 and
 * `batch`, and of prefill per prompt token. The layer times come from
 * a small vocabulary (V1); the fixed times, which grow with the
 * vocabulary (the LM head), from one layer at V1 and at V2 = min(vocab,
 * 8192), extrapolated linearly to the model's vocabulary: calibration
 * never holds the model's embeddings. */
static ft_status measure_engine(const char *dir, uint32_t batch, uint32_t plen, unsigned threads,
                                ft_wfmt fmt, uint64_t memory, ft_cost_timing *tmg)
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
    engine_times a, b, c2;   /* (1 layer, V1), (2 layers, V1), (1 layer, V2) */
    if ((st = time_engine(&cfg, 1, V1, batch, plen, threads, fmt, &a))) return st;
    if ((st = time_engine(&cfg, 2, V1, batch, plen, threads, fmt, &b))) return st;
    if (V2 > V1) {
        if ((st = time_engine(&cfg, 1, V2, batch, plen, threads, fmt, &c2))) return st;
    } else {
        c2 = a;
    }
    /* the fixed part at vocabulary V: linear through (V1, a) and (V2, c2) */
    double k = V2 > V1 ? (double)(V - V1) / (double)(V2 - V1) : 0;
    ft_cost_timing *in = tmg;
    memset(in, 0, sizeof *in);
    in->batch[0] = 1;
    in->batch[1] = batch > 1 ? batch : 2;
    in->layer_decode_s[0] = b.dec1 - a.dec1;
    in->layer_decode_s[1] = b.decb - a.decb;
    double f1 = a.dec1 - in->layer_decode_s[0], fb = a.decb - in->layer_decode_s[1];
    in->fixed_decode_s[0] = f1 + k * (c2.dec1 - a.dec1);
    in->fixed_decode_s[1] = fb + k * (c2.decb - a.decb);
    double ntok = (double)batch * plen;
    in->layer_prefill_s_per_token = (b.pre - a.pre) / ntok;
    in->fixed_prefill_s_per_token = ((a.pre - (b.pre - a.pre)) + k * (c2.pre - a.pre)) / ntok;
    for (int j = 0; j < 2; j++) {   /* noise can make a difference negative */
        if (in->layer_decode_s[j] < 0) in->layer_decode_s[j] = 0;
        if (in->fixed_decode_s[j] < 0) in->fixed_decode_s[j] = 0;
    }
    if (in->layer_prefill_s_per_token < 0) in->layer_prefill_s_per_token = 0;
    if (in->fixed_prefill_s_per_token < 0) in->fixed_prefill_s_per_token = 0;
    return FT_OK;
}


/* ------------------------------------------------ the calibration cache */

/* What calibration measured about this machine for one model shape,
 * cached per (machine, model shape, run shape) so that repeated plans
 * agree and cost nothing: $XDG_CACHE_HOME/flextier/calib (or
 * ~/.cache/flextier/calib), one file per key. The file is only trusted
 * when its size, magic, key and checksum match and every value is a
 * finite non-negative number; anything else is measured again. */
#define CALIB_MAGIC 0x314249434c544654ull   /* "FTLCIB1" */
typedef struct calib_rec {
    uint64_t magic, key;
    double mem_bw, flops, host_bw, disk_bw;
    double ratio[FT_CODEC_COUNT], decode_bw[FT_CODEC_COUNT];
    double timing[FT_CODEC_COUNT][2 + 2 + 2 + 2];   /* batch[2], layer[2], fixed[2], prefill[2] */
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
    snprintf(b, sizeof b, "calib3|%s|%ld|%d|%s|%d|%u|%u|%u|%u|%x", cpu, ncpu, ft_simd_enabled(),
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
#define CALIB_DISK_MAGIC 0x314b534944544654ull   /* "FTDISK1" */
typedef struct calib_disk_rec { uint64_t magic, key; double bw; uint64_t sum; } calib_disk_rec;

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
    snprintf(b, sizeof b, "disk5|%s|%llu|%d|%llu", ft_version_string(), dev, cp->drop_cache,
             (unsigned long long)in->tensor_bytes[FT_CODEC_RAW][0] ^ ((unsigned long long)in->n_tensors << 56));
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

static int disk_load(const char *path, uint64_t key, double *bw)
{
    calib_disk_rec r;
    if (!record_load(path, &r, sizeof r) || r.magic != CALIB_DISK_MAGIC || r.key != key ||
        r.sum != ft_xxh3(&r, offsetof(calib_disk_rec, sum)) || !isfinite(r.bw) || r.bw <= 0 || r.bw > 1e15)
        return 0;
    *bw = r.bw;
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

static void disk_save(const char *dir, const char *path, uint64_t key, double bw)
{
    calib_disk_rec r;
    memset(&r, 0, sizeof r);
    r.magic = CALIB_DISK_MAGIC;
    r.key = key;
    r.bw = bw;
    r.sum = ft_xxh3(&r, offsetof(calib_disk_rec, sum));
    record_save(dir, path, &r, sizeof r);
}

static void calib_pack(calib_rec *r, const ft_cost_inputs *in)
{
    r->mem_bw = in->mem_bw;
    r->flops = in->flops;
    r->host_bw = in->bw[FT_TIER_HOST];
    r->disk_bw = in->bw[FT_TIER_DISK];
    for (int c = 0; c < FT_CODEC_COUNT; c++) {
        const ft_cost_timing *t = &in->timing[c];
        r->ratio[c] = in->ratio[c];
        r->decode_bw[c] = in->decode_bw[c];
        double v[8] = {t->batch[0], t->batch[1], t->layer_decode_s[0], t->layer_decode_s[1], t->fixed_decode_s[0],
                       t->fixed_decode_s[1], t->layer_prefill_s_per_token, t->fixed_prefill_s_per_token};
        memcpy(r->timing[c], v, sizeof v);
    }
}

static void calib_unpack(const calib_rec *r, ft_cost_inputs *in)
{
    in->mem_bw = r->mem_bw;
    in->flops = r->flops;
    in->bw[FT_TIER_HOST] = r->host_bw;
    in->bw[FT_TIER_DISK] = r->disk_bw;
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

static int calib_valid(const calib_rec *r, uint64_t key)
{
    if (r->magic != CALIB_MAGIC || r->key != key) return 0;
    if (r->sum != ft_xxh3(r, offsetof(calib_rec, sum))) return 0;
    const double *d = &r->mem_bw;
    size_t nd = (offsetof(calib_rec, sum) - offsetof(calib_rec, mem_bw)) / sizeof(double);
    for (size_t i = 0; i < nd; i++)
        if (!isfinite(d[i]) || d[i] < 0 || d[i] > 1e18) return 0;
    return r->mem_bw > 0 && r->flops > 0;
}

static int calib_load(const char *path, uint64_t key, ft_cost_inputs *in)
{
    calib_rec r;
    if (!record_load(path, &r, sizeof r) || !calib_valid(&r, key)) return 0;
    calib_unpack(&r, in);
    return 1;
}

static void calib_save(const char *dir, const char *path, uint64_t key, const ft_cost_inputs *in)
{
    calib_rec r;
    memset(&r, 0, sizeof r);
    r.magic = CALIB_MAGIC;
    r.key = key;
    calib_pack(&r, in);
    r.sum = ft_xxh3(&r, offsetof(calib_rec, sum));
    record_save(dir, path, &r, sizeof r);
}

/* Read bandwidth of the disk tier as the scheduler reads it: one layer's
 * tensors (their sizes as the model keeps them: the frame size sets the
 * device's request size; 4 MiB probes measured a quarter of what the
 * scheduler then read from the same disk) written as frames, then read
 * all at once (asynchronously, queue depth 8, as sched.c opens its
 * stores), past the page cache under a budget; the median of 3 after one
 * unmeasured. Within a memory bound the layer is cut to fit a quarter.
 * Each frame is read into room for its whole frame (ft_encode_bound: the
 * header grows 16 bytes per 256 KiB chunk; a fixed 4 KiB of room failed
 * every read of a tensor over 62.5 MiB, and the disk then measured 0 B/s:
 * a 7.4 GiB model's 86 MiB FFN matrices planned at 0.00 tok/s). A failure
 * is an error with the store's reason, never a bandwidth of 0. */
ft_status ft_calibrate_disk_bw(const char *uri, int drop_cache, uint64_t memory, const ft_cost_inputs *in,
                               double *out_bw)
{
    enum { N = FT_COST_MAX_TENSORS };
    size_t sz[N], off[N], cap[N], total = 0;
    int n = 0;
    ft_codec_params cp;
    ft_codec_default_params(&cp);
    cp.codec = FT_CODEC_RAW;
    *out_bw = 0;
    for (uint32_t k = 0; k < in->n_tensors && n < N; k++) {
        size_t b = (size_t)in->tensor_bytes[FT_CODEC_RAW][k];
        if (b < (64u << 10)) continue;   /* norms: noise */
        int64_t shape[1] = {(int64_t)b};
        size_t fb = ft_encode_bound(&cp, FT_U8, 1, shape);
        if (!fb) return ft_set_error(FT_ERR_INVALID_ARG, "plan: a layer tensor of %zu bytes has no frame size", b);
        fb = (fb + 63) & ~(size_t)63;
        if (memory && total + fb > memory / 4) break;
        off[n] = total;
        cap[n] = fb;
        sz[n++] = b;
        total += fb;
    }
    if (!n) {   /* no layer sizes (or none fit): 8 frames of 4 MiB */
        int64_t shape[1] = {4 << 20};
        size_t fb = (ft_encode_bound(&cp, FT_U8, 1, shape) + 63) & ~(size_t)63;
        for (n = 0; n < 8; n++) { off[n] = total; sz[n] = 4u << 20; cap[n] = fb; total += fb; }
    }
    ft_store *s = NULL;
    ft_store_params sp;
    ft_store_default_params(&sp);
    sp.codec_threads = 1;
    sp.queue_depth = 8;
    sp.drop_cache = drop_cache;
    ft_status st = ft_store_open(uri, &sp, &s);
    if (st) return ft_set_error(st, "plan: cannot open the disk tier %s to measure it: %s", uri, ft_last_error());
    uint8_t *buf = ft_malloc_aligned(total, 64);
    double tm[3];
    char key[N][48];
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
    for (int r = -1; !st && r < 3; r++) {
        ft_request *req[N] = {0};
        size_t got[N];
        double t0 = ft_now();
        for (int i = 0; !st && i < n; i++)
            st = ft_read_frame_async(s, key[i], buf + off[i], cap[i], &got[i], &req[i]);
        for (int i = 0; i < n; i++) {
            if (req[i]) {
                ft_status w = ft_request_wait(req[i], -1);
                if (!st) st = w;
            }
            ft_request_free(req[i]);
        }
        if (st) st = ft_set_error(st, "plan: cannot read the disk probe from %s: %s", uri, ft_last_error());
        if (r >= 0) tm[r] = ft_now() - t0;
    }
    if (!st) {
        double t = median(tm, 3);
        *out_bw = t > 0 ? (double)bytes / t : 1e15;
    }
    for (int i = 0; i < written; i++) ft_delete_tensor(s, key[i]);
    ft_free_aligned(buf);
    ft_store_close(s);
    return st;
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
    if (use_cache) {
        key = calib_key(dir, cp, in, in->compute_threads, in->decode_threads, batch, plen);
        snprintf(cpath, sizeof cpath, "%s/%016llx.bin", cdir, (unsigned long long)key);
        if (!cp->recalibrate) cached = calib_load(cpath, key, in);
    }
    in->calibration_cached = cached;
    in->disk_direct = cp->drop_cache;
    if (cached) {
        FT_LOG(FT_LOG_INFO, "plan: calibration of this machine and model shape from %s", cpath);
    } else {
        FT_LOG(FT_LOG_INFO, "plan: measuring memory, the engine and the codecs");
        in->mem_bw = measure_mem_bw(cp->memory);
        /* The engine's speed with each compute format the codecs imply:
         * none/bp compute on the weights' format, q8/q4 on their own. */
        unsigned wm = codec_mask | (1u << FT_CODEC_RAW);
        ft_status st = FT_OK;
        for (int c = 0; c < FT_CODEC_COUNT && st == FT_OK; c++) {
            if (!(wm & (1u << c)) || c == FT_CODEC_BYTEPLANE) continue;
            if (c != FT_CODEC_RAW && c != FT_CODEC_Q8 && c != FT_CODEC_Q4) continue;
            ft_wfmt f = c == FT_CODEC_Q8 ? FT_WF_Q8 : c == FT_CODEC_Q4 ? FT_WF_Q4 : in->weights_fmt;
            st = measure_engine(dir, batch, plen, threads, f, cp->memory, &in->timing[c]);
        }
        if (st) return st;
        in->timing[FT_CODEC_BYTEPLANE] = in->timing[FT_CODEC_RAW];
        /* sustained flop/s for the analytic fallback: the engine's own prefill */
        double tp = in->timing[FT_CODEC_RAW].layer_prefill_s_per_token;
        in->flops = tp > 0 ? 2.0 * (double)in->layer_params / tp : 1e10;
        in->bw[FT_TIER_HOST] = in->mem_bw / 2;
        measure_codecs(in, codec_mask | (1u << FT_CODEC_RAW));
        if (use_cache) calib_save(cdir, cpath, key, in);
    }
    in->bw[FT_TIER_DISK] = 0;
    if (base->disk_uri[0]) {
        char dpath[4200];
        uint64_t dk = disk_key(cp, in);
        int dcached = 0;
        if (use_cache) {
            snprintf(dpath, sizeof dpath, "%s/disk-%016llx.bin", cdir, (unsigned long long)dk);
            if (!cp->recalibrate) dcached = disk_load(dpath, dk, &in->bw[FT_TIER_DISK]);
        }
        if (!dcached) {
            ft_status dst = ft_calibrate_disk_bw(base->disk_uri, cp->drop_cache, cp->memory, in, &in->bw[FT_TIER_DISK]);
            if (dst) return dst;
            if (use_cache && in->bw[FT_TIER_DISK] > 0) disk_save(cdir, dpath, dk, in->bw[FT_TIER_DISK]);
        }
        in->calibration_cached = in->calibration_cached && dcached;
    }
    if (given && given[FT_TIER_HOST] > 0) in->bw[FT_TIER_HOST] = given[FT_TIER_HOST];
    if (base->disk_uri[0] && given && given[FT_TIER_DISK] > 0) in->bw[FT_TIER_DISK] = given[FT_TIER_DISK];
    if (base->n_remotes) {
        if (given && given[FT_TIER_REMOTE] > 0) in->bw[FT_TIER_REMOTE] = given[FT_TIER_REMOTE];
        else {
            FT_LOG(FT_LOG_INFO, "plan: measuring the link to %s", base->remotes[0]);
            in->bw[FT_TIER_REMOTE] = measure_store_bw(base->remotes[0], 0);
            if (in->bw[FT_TIER_REMOTE] <= 0)
                return ft_set_error(FT_ERR_NET, "cannot measure the link to %s", base->remotes[0]);
        }
    }
    return FT_OK;
}
