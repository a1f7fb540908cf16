/* Frames into device memory: the host validates and runs the CPU stages,
 * the GPU expands (docs/cuda.md, "The codec on the GPU").
 *
 *   q8/q4      host: header (ft_frame_parse), chunk hashes unless trusted,
 *              q4 pad nibbles; copy the whole frame as is; GPU: chunk
 *              table, then dequantize every element into the output dtype.
 *   raw        host: hashes unless trusted; copy the payload; GPU: convert.
 *   byteplane  host: per chunk, validate the payload header and decode each
 *              plane's entropy stage into pinned staging (stored chunks are
 *              split into planes); copy the planes; GPU: regroup + convert.
 *   lz4/zstd/deflate: host ft_decode (hashes checked) into pinned staging;
 *              copy; GPU: convert. */
#include "cuda_host.h"
#include "cuda_prep.h"

#include <stdlib.h>
#include <string.h>

ft_status ft_cuda_dec_ws_init(ft_cuda_dec_ws *w)
{
    memset(w, 0, sizeof *w);
    FT_CU(cudaEventCreateWithFlags(&w->h_done, cudaEventDisableTiming), "cudaEventCreate");
    return FT_OK;
}

ft_status ft_cuda_dec_pipeline(ft_cuda_dec_ws *w)
{
    if (w->pipe) return FT_OK;
    FT_CU(cudaStreamCreateWithFlags(&w->ks, cudaStreamNonBlocking), "cudaStreamCreate (decode)");
    for (int b = 0; b < 2; b++) {
        FT_CU(cudaEventCreateWithFlags(&w->p_copied[b], cudaEventDisableTiming), "cudaEventCreate");
        FT_CU(cudaEventCreateWithFlags(&w->p_done[b], cudaEventDisableTiming), "cudaEventCreate");
    }
    FT_CU(cudaEventCreateWithFlags(&w->p_join, cudaEventDisableTiming), "cudaEventCreate");
    w->pipe = 1;
    return FT_OK;
}

ft_status ft_cuda_dec_join(ft_cuda_dec_ws *w, cudaStream_t s)
{
    if (!w->pipe || !w->p_pending) return FT_OK;
    FT_CU(cudaEventRecord(w->p_join, w->ks), "cudaEventRecord");
    FT_CU(cudaStreamWaitEvent(s, w->p_join, 0), "cudaStreamWaitEvent");
    w->p_pending = 0;
    return FT_OK;
}

void ft_cuda_dec_ws_release(ft_cuda_dec_ws *w)
{
    if (!w) return;
    if (w->ks) (void)cudaStreamSynchronize(w->ks);
    for (int b = 0; b < 2; b++) {
        if (w->p_stage[b]) (void)cudaFree(w->p_stage[b]);
        if (w->p_table[b]) (void)cudaFree(w->p_table[b]);
        if (w->p_copied[b]) (void)cudaEventDestroy(w->p_copied[b]);
        if (w->p_done[b]) (void)cudaEventDestroy(w->p_done[b]);
    }
    if (w->p_join) (void)cudaEventDestroy(w->p_join);
    if (w->ks) (void)cudaStreamDestroy(w->ks);
    if (w->h_used) (void)cudaEventSynchronize(w->h_done);
    if (w->h_done) (void)cudaEventDestroy(w->h_done);
    if (w->d_stage) (void)cudaFree(w->d_stage);
    if (w->d_table) (void)cudaFree(w->d_table);
    if (w->h_stage) (void)cudaFreeHost(w->h_stage);
    ft_codec_ctx_free(w->cpu);
    ft_ws_release(&w->ws);
    memset(w, 0, sizeof *w);
}

/* Grow a device buffer used by work on `s` (synchronized first: the old
 * buffer may still be read). 25% headroom avoids regrowing by a byte. */
static ft_status grow_device(void **p, size_t *cap, size_t need, cudaStream_t s, const char *what)
{
    if (*cap >= need) return FT_OK;
    FT_CU(cudaStreamSynchronize(s), what);
    if (*p) (void)cudaFree(*p);
    *p = NULL;
    *cap = 0;
    size_t n = need + need / 4 + 4096;
    FT_CU(cudaMalloc(p, n), what);
    *cap = n;
    return FT_OK;
}

/* The pinned staging, free to write (the previous copy out of it done)
 * and at least `need` bytes. */
static ft_status host_stage(ft_cuda_dec_ws *w, size_t need)
{
    if (w->h_used) {
        FT_CU(cudaEventSynchronize(w->h_done), "pinned staging (cudaEventSynchronize)");
        w->h_used = 0;
    }
    if (w->h_cap >= need) return FT_OK;
    if (w->h_stage) (void)cudaFreeHost(w->h_stage);
    w->h_stage = NULL;
    w->h_cap = 0;
    size_t n = need + need / 4 + 4096;
    FT_CU(cudaHostAlloc((void **)&w->h_stage, n, cudaHostAllocDefault), "pinned staging (cudaHostAlloc)");
    w->h_cap = n;
    return FT_OK;
}

static ft_status host_stage_copied(ft_cuda_dec_ws *w, cudaStream_t s)
{
    FT_CU(cudaEventRecord(w->h_done, s), "cudaEventRecord");
    w->h_used = 1;
    return FT_OK;
}

static int is_float(ft_dtype d) { return d == FT_F32 || d == FT_F16 || d == FT_BF16; }

ft_status ft_cuda_dec_raw_async(ft_cuda_dec_ws *w, const void *src, ft_dtype src_dt, uint64_t n,
                                ft_dtype out_dt, void *dst, cudaStream_t s, uint64_t *h2d)
{
    if (!is_float(src_dt) || !is_float(out_dt))
        return ft_set_error(FT_ERR_UNSUPPORTED, "cuda: cannot convert %s to %s", ft_dtype_name(src_dt),
                            ft_dtype_name(out_dt));
    size_t bytes = (size_t)ft_dtype_nbytes(src_dt, n);
    if (!bytes) return FT_OK;
    if (h2d) *h2d += bytes;
    if (src_dt == out_dt) {
        FT_CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s), "cudaMemcpyAsync (weights)");
        return FT_OK;
    }
    ft_status st = grow_device((void **)&w->d_stage, &w->d_cap, bytes, s, "device staging (cudaMalloc)");
    if (st) return st;
    FT_CU(cudaMemcpyAsync(w->d_stage, src, bytes, cudaMemcpyHostToDevice, s), "cudaMemcpyAsync (staging)");
    FT_CU(ftk_convert(dst, (int)out_dt, w->d_stage, (int)src_dt, n, s), "convert kernel");
    return FT_OK;
}

/* The device staging of one q8/q4 tensor's compressed bytes and its chunk
 * table: the workspace's own (everything on `s`), or in a pipelined
 * workspace the next of its two buffers, once the kernel that last read it
 * is done. */
typedef struct { uint8_t *stage; uint64_t *table; int buf; } q_stage;

static ft_status q_stage_get(ft_cuda_dec_ws *w, size_t bytes, uint32_t n_chunks, cudaStream_t s, q_stage *q)
{
    ft_status st;
    size_t tbytes = (size_t)n_chunks * sizeof(uint64_t);
    if (!w->pipe) {
        if ((st = grow_device((void **)&w->d_stage, &w->d_cap, bytes, s, "device staging (cudaMalloc)"))) return st;
        size_t tcap_bytes = w->table_cap * sizeof(uint64_t);
        st = grow_device((void **)&w->d_table, &tcap_bytes, tbytes, s, "chunk table (cudaMalloc)");
        w->table_cap = tcap_bytes / sizeof(uint64_t);
        if (st) return st;
        *q = (q_stage){w->d_stage, w->d_table, -1};
        return FT_OK;
    }
    const int b = w->p_next;
    w->p_next ^= 1;
    if (w->p_cap[b] < bytes || w->p_tcap[b] * sizeof(uint64_t) < tbytes) {
        /* the kernels and copies that may still use the old buffer */
        FT_CU(cudaStreamSynchronize(w->ks), "device staging (cudaStreamSynchronize)");
        if ((st = grow_device((void **)&w->p_stage[b], &w->p_cap[b], bytes, s, "device staging (cudaMalloc)"))) return st;
        size_t tcap_bytes = w->p_tcap[b] * sizeof(uint64_t);
        st = grow_device((void **)&w->p_table[b], &tcap_bytes, tbytes, s, "chunk table (cudaMalloc)");
        w->p_tcap[b] = tcap_bytes / sizeof(uint64_t);
        if (st) return st;
    }
    if (w->p_used[b]) FT_CU(cudaStreamWaitEvent(s, w->p_done[b], 0), "cudaStreamWaitEvent");
    *q = (q_stage){w->p_stage[b], w->p_table[b], b};
    return FT_OK;
}

/* After the copies into q->stage on `s`: the chunk table (only where the
 * kernel reads one) and the dequantize kernel, on `s`, or on the
 * workspace's kernel stream once the copies are done. */
static ft_status q_stage_decode(ft_cuda_dec_ws *w, const q_stage *q, const ftk_qgeom *g, ft_dtype out_dt, void *dst,
                                cudaStream_t s)
{
    cudaStream_t k = s;
    if (q->buf >= 0) {
        FT_CU(cudaEventRecord(w->p_copied[q->buf], s), "cudaEventRecord");
        FT_CU(cudaStreamWaitEvent(w->ks, w->p_copied[q->buf], 0), "cudaStreamWaitEvent");
        k = w->ks;
    }
    if (!ftk_q_fast(g, dst)) FT_CU(ftk_q_table(g, q->table, k), "chunk table kernel");
    FT_CU(ftk_q_dequant(g, q->stage, q->table, (int)out_dt, dst, k), "dequantize kernel");
    if (q->buf >= 0) {
        FT_CU(cudaEventRecord(w->p_done[q->buf], w->ks), "cudaEventRecord");
        w->p_used[q->buf] = 1;
        w->p_pending = 1;
    }
    return FT_OK;
}

/* q8/q4: checks on the host, then the frame's bytes to the device as they
 * are and the two kernels. */
static ft_status dec_quant(ft_cuda_dec_ws *w, const uint8_t *frame, const ft_frame_info *fi, int trusted,
                           ft_dtype out_dt, void *dst, cudaStream_t s, uint64_t *h2d)
{
    ftk_qgeom g;
    ft_status st = ft_cuda_prep_quant(frame, fi, trusted, &g);
    if (st || g.numel == 0) return st;
    q_stage qs;
    if ((st = q_stage_get(w, (size_t)fi->frame_size, fi->n_chunks, s, &qs))) return st;
    FT_CU(cudaMemcpyAsync(qs.stage, frame, (size_t)fi->frame_size, cudaMemcpyHostToDevice, s),
          "cudaMemcpyAsync (frame)");
    if (h2d) *h2d += fi->frame_size;
    return q_stage_decode(w, &qs, &g, out_dt, dst, s);
}

static ft_status dec_raw(ft_cuda_dec_ws *w, const uint8_t *frame, const ft_frame_info *fi, int trusted,
                         ft_dtype out_dt, void *dst, cudaStream_t s, uint64_t *h2d)
{
    ft_status st = ft_cuda_prep_raw(frame, fi, trusted);
    if (st) return st;
    return ft_cuda_dec_raw_async(w, frame + fi->header_size, fi->dtype, fi->numel, out_dt, dst, s, h2d);
}

/* byteplane: the entropy stage on the CPU into the pinned staging, the
 * planes to the device, regrouped there. */
static ft_status dec_byteplane(ft_cuda_dec_ws *w, const uint8_t *frame, const ft_frame_info *fi, int trusted,
                               ft_dtype out_dt, void *dst, cudaStream_t s, uint64_t *h2d)
{
    size_t raw = (size_t)fi->raw_size;
    if (raw == 0) return FT_OK;
    uint64_t E = 0;
    ft_status st = host_stage(w, raw);
    if (!st) st = ft_cuda_prep_byteplane(&w->ws, frame, fi, trusted, w->h_stage, &E);
    if (!st) st = grow_device((void **)&w->d_stage, &w->d_cap, raw, s, "device staging (cudaMalloc)");
    if (st) return st;
    FT_CU(cudaMemcpyAsync(w->d_stage, w->h_stage, raw, cudaMemcpyHostToDevice, s), "cudaMemcpyAsync (planes)");
    if ((st = host_stage_copied(w, s))) return st;
    if (h2d) *h2d += raw;
    FT_CU(ftk_bp_merge((int)fi->dtype, w->d_stage, fi->numel, E, (int)out_dt, dst, s), "byte-plane merge kernel");
    return FT_OK;
}

/* lz4/zstd/deflate: all on the CPU (ft_decode checks every hash), the
 * values copied and converted on the GPU. */
static ft_status dec_cpu(ft_cuda_dec_ws *w, const uint8_t *frame, const ft_frame_info *fi,
                         ft_dtype out_dt, void *dst, cudaStream_t s, uint64_t *h2d)
{
    size_t raw = (size_t)fi->raw_size;
    ft_status st;
    if (!w->cpu && (st = ft_codec_ctx_create(0, &w->cpu))) return st;
    if ((st = host_stage(w, raw))) return st;
    ft_tensor t;
    memset(&t, 0, sizeof t);
    t.dtype = fi->dtype;
    t.data = w->h_stage;
    if ((st = ft_decode(w->cpu, frame, (size_t)fi->frame_size, &t, w->h_cap))) return st;
    if ((st = ft_cuda_dec_raw_async(w, w->h_stage, fi->dtype, fi->numel, out_dt, dst, s, h2d))) return st;
    return host_stage_copied(w, s);
}

ft_status ft_cuda_dec_frame_async(ft_cuda_dec_ws *w, const uint8_t *frame, const ft_frame_info *fi,
                                  int trusted, ft_dtype out_dt, void *dst, cudaStream_t s, uint64_t *h2d)
{
    if (!is_float(fi->dtype))
        return ft_set_error(FT_ERR_UNSUPPORTED, "cuda: frames of %s cannot be decoded on the GPU "
                            "(float dtypes only)", ft_dtype_name(fi->dtype));
    if (!is_float(out_dt))
        return ft_set_error(FT_ERR_UNSUPPORTED, "cuda: cannot decode to %s", ft_dtype_name(out_dt));
    switch (fi->codec) {
    case FT_CODEC_Q8: case FT_CODEC_Q4:
        return dec_quant(w, frame, fi, trusted, out_dt, dst, s, h2d);
    case FT_CODEC_RAW:
        return dec_raw(w, frame, fi, trusted, out_dt, dst, s, h2d);
    case FT_CODEC_BYTEPLANE:
        return dec_byteplane(w, frame, fi, trusted, out_dt, dst, s, h2d);
    case FT_CODEC_LZ4: case FT_CODEC_ZSTD: case FT_CODEC_DEFLATE:
        return dec_cpu(w, frame, fi, out_dt, dst, s, h2d);
    default:
        return ft_set_error(FT_ERR_CORRUPT, "frame: unknown codec %d", (int)fi->codec);
    }
}

ft_status ft_cuda_dec_wmat_async(ft_cuda_dec_ws *w, const ft_wmat *m, ft_dtype out_dt, void *dst, cudaStream_t s,
                                 uint64_t *h2d)
{
    if (m->rows < 1 || m->cols < 1) return ft_set_error(FT_ERR_INVALID_ARG, "cuda: a %d x %d matrix", m->rows, m->cols);
    const uint64_t numel = (uint64_t)m->rows * (uint64_t)m->cols;
    switch (m->fmt) {
    case FT_WF_F32: return ft_cuda_dec_raw_async(w, m->data, FT_F32, numel, out_dt, dst, s, h2d);
    case FT_WF_BF16: return ft_cuda_dec_raw_async(w, m->data, FT_BF16, numel, out_dt, dst, s, h2d);
    case FT_WF_F16: return ft_cuda_dec_raw_async(w, m->data, FT_F16, numel, out_dt, dst, s, h2d);
    case FT_WF_Q8: case FT_WF_Q4: break;
    default: return ft_set_error(FT_ERR_UNSUPPORTED, "cuda: matrix format %d", (int)m->fmt);
    }
    if (!is_float(out_dt)) return ft_set_error(FT_ERR_UNSUPPORTED, "cuda: cannot decode to %s", ft_dtype_name(out_dt));
    if (!m->chunk || m->group < 1 || m->cols % m->group || m->rows_per_chunk < 1 ||
        (m->fmt == FT_WF_Q4 && m->cols % 2))
        return ft_set_error(FT_ERR_INVALID_ARG, "cuda: a %s matrix of %d x %d in groups of %d, %d rows per chunk",
                            ft_wfmt_name(m->fmt), m->rows, m->cols, m->group, m->rows_per_chunk);
    /* the frame kernels' geometry of a (rows, cols) tensor grouped along
     * its rows, with no header: chunk c's payload at the sum of those
     * before it */
    ftk_qgeom g;
    memset(&g, 0, sizeof g);
    g.numel = numel;
    g.outer = (uint64_t)m->rows;
    g.D = (uint64_t)m->cols;
    g.inner = 1;
    g.G = (uint64_t)m->group;
    g.ngroups = g.D / g.G;
    g.spc = (uint64_t)m->rows_per_chunk * g.ngroups;
    g.n_chunks = (uint32_t)(((uint64_t)m->rows + (uint64_t)m->rows_per_chunk - 1) / (uint64_t)m->rows_per_chunk);
    g.bits = m->fmt == FT_WF_Q8 ? 8 : 4;
    uint64_t total = 0;
    for (uint32_t c = 0; c < g.n_chunks; c++) {
        if (!m->chunk[c]) return ft_set_error(FT_ERR_INVALID_ARG, "cuda: %s matrix chunk %u is NULL", ft_wfmt_name(m->fmt), c);
        total += km_q_chunk_bytes(&g, c);
    }
    q_stage qs;
    ft_status st = q_stage_get(w, (size_t)total, g.n_chunks, s, &qs);
    if (st) return st;
    uint64_t pos = 0;
    for (uint32_t c = 0; c < g.n_chunks;) {
        const uint8_t *run = m->chunk[c];
        uint64_t len = km_q_chunk_bytes(&g, c);
        uint32_t e = c + 1;
        while (e < g.n_chunks && m->chunk[e] == run + len) len += km_q_chunk_bytes(&g, e++);
        FT_CU(cudaMemcpyAsync(qs.stage + pos, run, (size_t)len, cudaMemcpyHostToDevice, s), "cudaMemcpyAsync (chunks)");
        pos += len;
        c = e;
    }
    if (h2d) *h2d += total;
    return q_stage_decode(w, &qs, &g, out_dt, dst, s);
}

/* ------------------------------------------------------------ public API */

struct ft_cuda_decoder {
    int device;
    cudaStream_t s;
    ft_cuda_dec_ws w;
};

ft_status ft_cuda_decoder_create(int device, ft_cuda_decoder **out)
{
    if (!out) return ft_set_error(FT_ERR_INVALID_ARG, "cuda decoder: NULL argument");
    ft_status st = ft_cuda_require(device);
    if (st) return st;
    ft_cuda_decoder *d = calloc(1, sizeof *d);
    if (!d) return ft_set_error(FT_ERR_NOMEM, "cuda decoder: allocation");
    d->device = device;
    if ((st = ft_cuda_dec_ws_init(&d->w)) ||
        (st = ft_cuda_status(cudaStreamCreateWithFlags(&d->s, cudaStreamNonBlocking), "cudaStreamCreate"))) {
        ft_cuda_decoder_free(d);
        return st;
    }
    *out = d;
    return FT_OK;
}

void ft_cuda_decoder_free(ft_cuda_decoder *d)
{
    if (!d) return;
    (void)cudaSetDevice(d->device);
    if (d->s) (void)cudaStreamSynchronize(d->s);
    ft_cuda_dec_ws_release(&d->w);
    if (d->s) (void)cudaStreamDestroy(d->s);
    free(d);
}

ft_status ft_cuda_decode_frame(ft_cuda_decoder *d, const void *frame, size_t size, ft_dtype out_dtype,
                               void *dst, size_t cap, ft_frame_info *info)
{
    if (!d || !frame) return ft_set_error(FT_ERR_INVALID_ARG, "cuda decode: NULL argument");
    ft_frame_info fi;
    ft_status st = ft_frame_parse(frame, size, &fi);
    if (st == FT_ERR_BUFFER_SMALL) return ft_set_error(FT_ERR_CORRUPT, "truncated frame header");
    if (st) return st;
    if (fi.frame_size > size)
        return ft_set_error(FT_ERR_CORRUPT, "truncated frame: %zu of %llu bytes", size,
                            (unsigned long long)fi.frame_size);
    if (!is_float(out_dtype))
        return ft_set_error(FT_ERR_UNSUPPORTED, "cuda: cannot decode to %s", ft_dtype_name(out_dtype));
    uint64_t need = ft_dtype_nbytes(out_dtype, fi.numel);
    if (need > cap)
        return ft_set_error(FT_ERR_BUFFER_SMALL, "decoded tensor needs %llu bytes, buffer has %zu",
                            (unsigned long long)need, cap);
    if (need && !dst) return ft_set_error(FT_ERR_INVALID_ARG, "cuda decode: NULL destination");
    FT_CU(cudaSetDevice(d->device), "cudaSetDevice");
    st = ft_cuda_dec_frame_async(&d->w, frame, &fi, 0, out_dtype, dst, d->s, NULL);
    /* Wait for whatever was enqueued, also after an error. */
    ft_status st2 = ft_cuda_status(cudaStreamSynchronize(d->s), "frame decode (cudaStreamSynchronize)");
    if (st) return st;
    if (st2) return st2;
    if (info) *info = fi;
    return FT_OK;
}
