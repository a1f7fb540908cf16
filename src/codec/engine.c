/* Codec context and the chunk-parallel encode/decode engine. */
#include "codec_internal.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

struct ft_codec_ctx {
    ft_pool *pool;
    unsigned nthreads;
    ft_worker_ws *ws;            /* one per worker */
    /* per-chunk arrays, grown once and reused */
    uint32_t cap_chunks;
    uint32_t *enc_size, *flags;
    uint64_t *hash, *slot;
    ft_status *status;
    uint8_t *scratch;            /* encode staging when dst is small */
    size_t scratch_cap;
    /* The detail of the first failing chunk: set on a worker thread, it is
     * re-set on the caller's thread (ft_last_error is per thread). */
    pthread_mutex_t err_mu;
    uint64_t err_chunk;
    char err_msg[512];
};

static void note_chunk_error(ft_codec_ctx *c, size_t i)
{
    pthread_mutex_lock(&c->err_mu);
    if (i < c->err_chunk) {
        c->err_chunk = i;
        snprintf(c->err_msg, sizeof c->err_msg, "%s", ft_last_error());
    }
    pthread_mutex_unlock(&c->err_mu);
}

static void reset_chunk_error(ft_codec_ctx *c)
{
    c->err_chunk = UINT64_MAX;
    c->err_msg[0] = '\0';
}

/* Return the first failing chunk's status with its message, or FT_OK. */
static ft_status first_chunk_error(ft_codec_ctx *c, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        if (c->status[i]) {
            if (c->err_chunk == i && c->err_msg[0]) return ft_set_error(c->status[i], "%s", c->err_msg);
            return c->status[i];
        }
    return FT_OK;
}

static const char *codec_names[FT_CODEC_COUNT] = {
    "raw", "lz4", "zstd", "deflate", "byteplane", "q8", "q4"};

const char *ft_codec_name(ft_codec_id c)
{
    return (unsigned)c < FT_CODEC_COUNT ? codec_names[c] : "?";
}

int ft_codec_is_lossy(ft_codec_id c) { return c == FT_CODEC_Q8 || c == FT_CODEC_Q4; }

ft_status ft_codec_parse(const char *s, ft_codec_id *codec, ft_codec_id *entropy)
{
    if (!s || !codec) return FT_ERR_INVALID_ARG;
    ft_codec_id ent = FT_CODEC_ZSTD;
    const char *dash = strchr(s, '-');
    size_t base = dash ? (size_t)(dash - s) : strlen(s);
    if (!strcasecmp(s, "none")) { *codec = FT_CODEC_RAW; if (entropy) *entropy = ent; return FT_OK; }
    if ((base == 2 && !strncasecmp(s, "bp", 2)) || (base == 9 && !strncasecmp(s, "byteplane", 9))) {
        if (dash) {
            const char *e = dash + 1;
            if (!strcasecmp(e, "zstd")) ent = FT_CODEC_ZSTD;
            else if (!strcasecmp(e, "lz4")) ent = FT_CODEC_LZ4;
            else if (!strcasecmp(e, "deflate")) ent = FT_CODEC_DEFLATE;
            else return ft_set_error(FT_ERR_INVALID_ARG,
                                     "unknown byteplane entropy stage '%s' (zstd, lz4, deflate)", e);
        }
        *codec = FT_CODEC_BYTEPLANE;
        if (entropy) *entropy = ent;
        return FT_OK;
    }
    for (int i = 0; i < FT_CODEC_COUNT; i++)
        if (!strcasecmp(s, codec_names[i])) {
            *codec = (ft_codec_id)i;
            if (entropy) *entropy = ent;
            return FT_OK;
        }
    return ft_set_error(FT_ERR_INVALID_ARG,
                        "unknown codec '%s' (raw, lz4, zstd, deflate, byteplane[-zstd|-lz4|-deflate], q8, q4)", s);
}

void ft_codec_default_params(ft_codec_params *p)
{
    memset(p, 0, sizeof *p);
    p->codec = FT_CODEC_ZSTD;
    p->level = 0;
    p->entropy = FT_CODEC_ZSTD;
    p->chunk_size = FT_DEFAULT_CHUNK_SIZE;
    p->group_size = FT_DEFAULT_GROUP_SIZE;
    p->group_dim = -1;
}

ft_status ft_codec_ctx_create(unsigned nthreads, ft_codec_ctx **out)
{
    if (!out) return FT_ERR_INVALID_ARG;
    ft_codec_ctx *c = calloc(1, sizeof *c);
    if (!c) return FT_ERR_NOMEM;
    pthread_mutex_init(&c->err_mu, NULL);
    ft_status st = ft_pool_create(nthreads, &c->pool);
    if (st) { free(c); return st; }
    c->nthreads = ft_pool_size(c->pool);
    c->ws = calloc(c->nthreads, sizeof *c->ws);
    if (!c->ws) { ft_codec_ctx_free(c); return FT_ERR_NOMEM; }
    *out = c;
    return FT_OK;
}

void ft_codec_ctx_free(ft_codec_ctx *c)
{
    if (!c) return;
    ft_pool_free(c->pool);
    if (c->ws)
        for (unsigned i = 0; i < c->nthreads; i++) ft_ws_release(&c->ws[i]);
    free(c->ws);
    free(c->enc_size); free(c->flags); free(c->hash); free(c->slot); free(c->status);
    ft_free_aligned(c->scratch);
    pthread_mutex_destroy(&c->err_mu);
    free(c);
}

unsigned ft_codec_ctx_threads(const ft_codec_ctx *c) { return c ? c->nthreads : 0; }

void ft_codec_ctx_set_spin_us(ft_codec_ctx *c, unsigned us)
{
    if (c) ft_pool_set_spin_us(c->pool, us);
}

static ft_status ctx_reserve(ft_codec_ctx *c, uint32_t n)
{
    if (n <= c->cap_chunks) return FT_OK;
    uint32_t want = n < 64 ? 64 : n;
    void *a = realloc(c->enc_size, want * sizeof(uint32_t));
    if (!a) return FT_ERR_NOMEM;
    c->enc_size = a;
    if (!(a = realloc(c->flags, want * sizeof(uint32_t)))) return FT_ERR_NOMEM;
    c->flags = a;
    if (!(a = realloc(c->hash, want * sizeof(uint64_t)))) return FT_ERR_NOMEM;
    c->hash = a;
    if (!(a = realloc(c->slot, (want + 1) * sizeof(uint64_t)))) return FT_ERR_NOMEM;
    c->slot = a;
    if (!(a = realloc(c->status, want * sizeof(ft_status)))) return FT_ERR_NOMEM;
    c->status = a;
    c->cap_chunks = want;
    return FT_OK;
}

/* Fill a frame description from params + tensor metadata. */
static ft_status frame_from_params(const ft_codec_params *p, ft_dtype dt, uint32_t ndim,
                                   const int64_t *shape, ft_frame_info *fi, ft_layout *L)
{
    memset(fi, 0, sizeof *fi);
    if ((unsigned)p->codec >= FT_CODEC_COUNT)
        return ft_set_error(FT_ERR_INVALID_ARG, "unknown codec id %d", (int)p->codec);
    if (ft_dtype_bits(dt) < 8)
        return ft_set_error(FT_ERR_UNSUPPORTED, "cannot encode a tensor of dtype %s",
                            ft_dtype_name(dt));
    if (p->level < -100 || p->level > 22)
        return ft_set_error(FT_ERR_INVALID_ARG, "level %d outside [-100, 22]", p->level);
    fi->codec = p->codec;
    fi->level = p->level;
    fi->dtype = dt;
    fi->ndim = ndim;
    if (ndim > FT_MAX_DIMS) return ft_set_error(FT_ERR_INVALID_ARG, "too many dims");
    if (ndim) memcpy(fi->shape, shape, ndim * sizeof *shape);
    fi->chunk_size = p->chunk_size ? p->chunk_size : FT_DEFAULT_CHUNK_SIZE;
    if (fi->codec == FT_CODEC_BYTEPLANE) {
        if (p->entropy != FT_CODEC_ZSTD && p->entropy != FT_CODEC_LZ4 && p->entropy != FT_CODEC_DEFLATE)
            return ft_set_error(FT_ERR_INVALID_ARG, "byteplane entropy stage must be zstd, lz4 or deflate");
        if (ft_dtype_is_float(dt)) fi->entropy = p->entropy;
        else fi->codec = p->entropy;   /* no planes to split: plain coding */
    }
    if (fi->codec == FT_CODEC_DEFLATE && (p->level < 0 || p->level > 12))
        return ft_set_error(FT_ERR_INVALID_ARG, "deflate level %d outside 0..12", p->level);
    if (ft_codec_is_lossy(fi->codec)) {
        fi->group_size = p->group_size ? p->group_size : FT_DEFAULT_GROUP_SIZE;
        int32_t gd = p->group_dim;
        if (ndim == 0) gd = 0;
        else {
            if (gd < 0) gd += (int32_t)ndim;
            if (gd < 0 || gd >= (int32_t)ndim)
                return ft_set_error(FT_ERR_INVALID_ARG, "group dim %d out of range for %u dims",
                                    p->group_dim, ndim);
        }
        fi->group_dim = gd;
    }
    ft_status st = ft_layout_compute(fi, L);
    if (st) return st;
    fi->n_chunks = L->n_chunks;
    fi->numel = L->numel;
    fi->raw_size = L->numel * L->esize;
    fi->header_size = ft_frame_header_size(ndim, L->n_chunks);
    return FT_OK;
}

static size_t frame_bound(const ft_frame_info *fi, const ft_layout *L, uint64_t *slot)
{
    size_t total = fi->header_size;
    for (uint32_t i = 0; i < L->n_chunks; i++) {
        uint64_t off, cnt;
        ft_layout_chunk(L, i, &off, &cnt);
        if (slot) slot[i] = total;
        size_t b = ft_chunk_bound(fi, L, off, cnt);
        if (b == 0 && cnt) return 0;
        total += b;
    }
    if (slot) slot[L->n_chunks] = total;
    return total;
}

size_t ft_encode_bound(const ft_codec_params *p, ft_dtype dt, uint32_t ndim, const int64_t *shape)
{
    ft_frame_info fi;
    ft_layout L;
    if (!p || frame_from_params(p, dt, ndim, shape, &fi, &L)) return 0;
    return frame_bound(&fi, &L, NULL);
}

/* Lossless chunk hash: XXH3 of the payload seeded with XXH3 of the raw
 * bytes, so it checks both the decoder's output and every payload bit
 * (some bits of a zstd or deflate stream do not change what it decodes
 * to, yet a flipped bit must still be reported). */
static uint64_t lossless_hash(const void *raw, size_t n, const void *payload, size_t m,
                              uint32_t flags)
{
    /* A stored payload is the raw bytes: one pass covers both. */
    if (flags & FT_CHUNK_STORED) return ft_xxh3(raw, n);
    return ft_xxh3_seed(payload, m, ft_xxh3(raw, n));
}

typedef struct {
    ft_codec_ctx *ctx;
    const ft_frame_info *fi;
    const ft_layout *L;
    const uint8_t *src;
    uint8_t *base;
} enc_job;

/* Encode chunk i of the tensor at src into dst (cap bytes): payload
 * size, flags and hash out. The raw codec stores the raw bytes. */
static ft_status encode_chunk(ft_worker_ws *ws, const ft_frame_info *fi, const ft_layout *L,
                              uint32_t i, const uint8_t *tensor, uint8_t *dst, size_t cap,
                              uint32_t *enc_size, uint32_t *flags, uint64_t *hash)
{
    uint64_t off, cnt;
    ft_layout_chunk(L, i, &off, &cnt);
    const uint8_t *src = tensor + off * L->esize;
    size_t raw = (size_t)(cnt * L->esize);
    size_t out = 0;
    ft_status st = FT_OK;
    *flags = 0;
    switch (fi->codec) {
    case FT_CODEC_Q8: case FT_CODEC_Q4:
        st = ft_quant_encode_chunk(fi, L, off, cnt, src, dst, cap, &out);
        if (st == FT_OK) *hash = ft_xxh3(dst, out);
        break;
    default:
        if (fi->codec == FT_CODEC_RAW) st = FT_ERR_BUFFER_SMALL;   /* store */
        else if (fi->codec == FT_CODEC_BYTEPLANE)
            st = ft_bp_encode_chunk(ws, fi, src, raw, dst, cap, &out);
        else
            st = ft_entropy_encode(ws, fi->codec, fi->level, src, raw, dst, cap, &out);
        if (st == FT_ERR_BUFFER_SMALL || (st == FT_OK && out >= raw)) {
            /* Incompressible: store the raw bytes (bound >= raw). */
            memcpy(dst, src, raw);
            out = raw;
            *flags = FT_CHUNK_STORED;
            st = FT_OK;
        }
        if (st == FT_OK) *hash = lossless_hash(src, raw, dst, out, *flags);
    }
    *enc_size = (uint32_t)out;
    return st;
}

static void encode_task(void *arg, size_t i, unsigned worker)
{
    enc_job *j = arg;
    ft_codec_ctx *c = j->ctx;
    ft_status st = encode_chunk(&c->ws[worker], j->fi, j->L, (uint32_t)i, j->src,
                                j->base + c->slot[i], c->slot[i + 1] - c->slot[i],
                                &c->enc_size[i], &c->flags[i], &c->hash[i]);
    c->status[i] = st;
    if (st) note_chunk_error(c, i);
}

ft_status ft_encode(ft_codec_ctx *c, const ft_codec_params *p, const ft_tensor *src,
                    void *dst, size_t cap, size_t *out_size)
{
    if (!c || !p || !src || !out_size || (!dst && cap))
        return ft_set_error(FT_ERR_INVALID_ARG, "ft_encode: NULL argument");
    ft_frame_info fi;
    ft_layout L;
    ft_status st = frame_from_params(p, src->dtype, src->ndim, src->shape, &fi, &L);
    if (st) return st;
    if (L.numel && !src->data) return ft_set_error(FT_ERR_INVALID_ARG, "tensor has no data");
    if ((st = ctx_reserve(c, L.n_chunks + 1))) return st;
    size_t bound = frame_bound(&fi, &L, c->slot);
    if (bound == 0) return ft_set_error(FT_ERR_INVALID_ARG, "tensor too large for codec");
    uint8_t *base = dst;
    if (cap < bound) {
        if (c->scratch_cap < bound) {
            ft_free_aligned(c->scratch);
            c->scratch = ft_malloc_aligned(bound, 64);
            c->scratch_cap = c->scratch ? bound : 0;
            if (!c->scratch) return FT_ERR_NOMEM;
        }
        base = c->scratch;
    }
    enc_job job = {c, &fi, &L, src->data, base};
    reset_chunk_error(c);
    ft_pool_run(c->pool, L.n_chunks, encode_task, &job);
    if ((st = first_chunk_error(c, L.n_chunks))) return st;
    /* Compact the payloads (each final offset <= its slot). */
    uint64_t pos = fi.header_size;
    for (uint32_t i = 0; i < L.n_chunks; i++) {
        if (pos != c->slot[i]) memmove(base + pos, base + c->slot[i], c->enc_size[i]);
        pos += c->enc_size[i];
    }
    if ((st = ft_frame_write_header(&fi, c->enc_size, c->flags, c->hash, base, bound)))
        return st;
    if (base != dst) {
        if (fi.frame_size > cap)
            return ft_set_error(FT_ERR_BUFFER_SMALL, "frame needs %llu bytes, buffer has %zu",
                                (unsigned long long)fi.frame_size, cap);
        memcpy(dst, base, fi.frame_size);
    }
    *out_size = (size_t)fi.frame_size;
    return FT_OK;
}

/* ------------------------------------------------------ streaming encode */

struct ft_encoder {
    ft_codec_ctx  *ctx;
    ft_frame_info  fi;
    ft_layout      L;
    const uint8_t *src;
    uint32_t       next;           /* first chunk not encoded yet */
    int            zero_copy;      /* raw: payloads are the tensor's bytes */
    size_t         bound;
    uint32_t      *enc_size, *flags;
    uint64_t      *hash;
};

ft_status ft_encoder_begin(ft_codec_ctx *c, const ft_codec_params *p, const ft_tensor *src,
                           ft_encoder **out)
{
    if (!c || !p || !src || !out) return ft_set_error(FT_ERR_INVALID_ARG, "ft_encoder_begin: NULL argument");
    ft_encoder *e = calloc(1, sizeof *e);
    if (!e) return ft_set_error(FT_ERR_NOMEM, "encoder");
    ft_status st = frame_from_params(p, src->dtype, src->ndim, src->shape, &e->fi, &e->L);
    if (st == FT_OK && e->L.numel && !src->data)
        st = ft_set_error(FT_ERR_INVALID_ARG, "tensor has no data");
    if (st == FT_OK && (e->bound = frame_bound(&e->fi, &e->L, NULL)) == 0)
        st = ft_set_error(FT_ERR_INVALID_ARG, "tensor too large for codec");
    uint32_t n = e->L.n_chunks ? e->L.n_chunks : 1;
    if (st == FT_OK) {
        e->enc_size = calloc(n, sizeof *e->enc_size);
        e->flags = calloc(n, sizeof *e->flags);
        e->hash = calloc(n, sizeof *e->hash);
        if (!e->enc_size || !e->flags || !e->hash) st = ft_set_error(FT_ERR_NOMEM, "encoder");
    }
    if (st != FT_OK) {
        ft_encoder_free(e);
        return st;
    }
    e->ctx = c;
    e->src = src->data;
    e->zero_copy = e->fi.codec == FT_CODEC_RAW;
    *out = e;
    return FT_OK;
}

void ft_encoder_info(const ft_encoder *e, uint32_t *n_chunks, size_t *header_size, size_t *bound,
                     int *zero_copy)
{
    if (n_chunks) *n_chunks = e->L.n_chunks;
    if (header_size) *header_size = (size_t)e->fi.header_size;
    if (bound) *bound = e->bound;
    if (zero_copy) *zero_copy = e->zero_copy;
}

size_t ft_encoder_raw_bytes(const ft_encoder *e, uint32_t first, uint32_t count)
{
    size_t n = 0;
    for (uint32_t i = first; i < first + count && i < e->L.n_chunks; i++) {
        uint64_t off, cnt;
        ft_layout_chunk(&e->L, i, &off, &cnt);
        n += (size_t)(cnt * e->L.esize);
    }
    return n;
}

size_t ft_encoder_run_bound(const ft_encoder *e, uint32_t first, uint32_t count)
{
    size_t n = 0;
    for (uint32_t i = first; i < first + count && i < e->L.n_chunks; i++) {
        uint64_t off, cnt;
        ft_layout_chunk(&e->L, i, &off, &cnt);
        n += ft_chunk_bound(&e->fi, &e->L, off, cnt);
    }
    return n;
}

typedef struct {
    ft_encoder *e;
    uint32_t first;
    uint8_t *base;
} run_job;

static void run_task(void *arg, size_t k, unsigned worker)
{
    run_job *j = arg;
    ft_encoder *e = j->e;
    ft_codec_ctx *c = e->ctx;
    uint32_t i = j->first + (uint32_t)k;
    ft_status st;
    if (e->zero_copy) {
        /* the payload is the tensor's bytes: hash them, nothing to copy */
        uint64_t off, cnt;
        ft_layout_chunk(&e->L, i, &off, &cnt);
        size_t raw = (size_t)(cnt * e->L.esize);
        e->hash[i] = ft_xxh3(e->src + off * e->L.esize, raw);
        e->flags[i] = FT_CHUNK_STORED;
        e->enc_size[i] = (uint32_t)raw;
        st = FT_OK;
    } else {
        st = encode_chunk(&c->ws[worker], &e->fi, &e->L, i, e->src, j->base + c->slot[k],
                          c->slot[k + 1] - c->slot[k], &e->enc_size[i], &e->flags[i], &e->hash[i]);
    }
    c->status[k] = st;
    if (st) note_chunk_error(c, k);
}

ft_status ft_encoder_encode(ft_encoder *e, uint32_t first, uint32_t count, void *dst, size_t cap,
                            const void **payload, size_t *size)
{
    if (!e || !payload || !size || first != e->next || count == 0 ||
        count > e->L.n_chunks - first)
        return ft_set_error(FT_ERR_INVALID_ARG, "ft_encoder_encode: chunks %u+%u out of order",
                            first, count);
    ft_codec_ctx *c = e->ctx;
    ft_status st = ctx_reserve(c, count + 1);
    if (st) return st;
    /* each chunk encodes into its worst-case slot, then the run is compacted */
    size_t pos = 0;
    for (uint32_t k = 0; k < count; k++) {
        uint64_t off, cnt;
        ft_layout_chunk(&e->L, first + k, &off, &cnt);
        c->slot[k] = pos;
        pos += e->zero_copy ? 0 : ft_chunk_bound(&e->fi, &e->L, off, cnt);
    }
    c->slot[count] = pos;
    if (!e->zero_copy && (!dst || cap < pos))
        return ft_set_error(FT_ERR_BUFFER_SMALL, "encoder run needs %zu bytes, buffer has %zu", pos, cap);
    run_job job = {e, first, dst};
    reset_chunk_error(c);
    ft_pool_run(c->pool, count, run_task, &job);
    if ((st = first_chunk_error(c, count))) return st;
    size_t total = 0;
    for (uint32_t k = 0; k < count; k++) {
        uint32_t i = first + k;
        if (!e->zero_copy && total != c->slot[k])
            memmove((uint8_t *)dst + total, (uint8_t *)dst + c->slot[k], e->enc_size[i]);
        total += e->enc_size[i];
    }
    if (e->zero_copy) {
        uint64_t off, cnt;
        ft_layout_chunk(&e->L, first, &off, &cnt);
        *payload = e->src + off * e->L.esize;
    } else {
        *payload = dst;
    }
    *size = total;
    e->next = first + count;
    return FT_OK;
}

ft_status ft_encoder_header(ft_encoder *e, void *dst, size_t cap, uint64_t *frame_size)
{
    if (!e || !dst || !frame_size) return FT_ERR_INVALID_ARG;
    if (e->next != e->L.n_chunks)
        return ft_set_error(FT_ERR_INVALID_ARG, "encoder: %u of %u chunks encoded", e->next,
                            e->L.n_chunks);
    ft_status st = ft_frame_write_header(&e->fi, e->enc_size, e->flags, e->hash, dst, cap);
    if (st) return st;
    *frame_size = e->fi.frame_size;
    return FT_OK;
}

void ft_encoder_free(ft_encoder *e)
{
    if (!e) return;
    free(e->enc_size);
    free(e->flags);
    free(e->hash);
    free(e);
}

static ft_status check_out_dtype(const ft_frame_info *fi, ft_dtype out)
{
    if (out == fi->dtype) return FT_OK;
    if (ft_dtype_is_float(out) && ft_dtype_is_float(fi->dtype)) return FT_OK;
    return ft_set_error(FT_ERR_UNSUPPORTED, "cannot decode a %s frame to %s",
                        ft_dtype_name(fi->dtype), ft_dtype_name(out));
}

ft_status ft_decode_chunk(ft_codec_ctx *c, const ft_frame_info *fi, const ft_chunk_info *ch,
                          const void *payload, ft_dtype out_dt, void *out, size_t out_cap,
                          unsigned worker)
{
    if (!c || !fi || !ch || (!payload && ch->enc_size) || worker >= c->nthreads)
        return FT_ERR_INVALID_ARG;
    ft_status st = check_out_dtype(fi, out_dt);
    if (st) return st;
    ft_layout L;
    if ((st = ft_layout_compute(fi, &L))) return st;
    if (ch->elem_count * L.esize != ch->raw_size ||
        ch->enc_size > ft_chunk_bound(fi, &L, ch->elem_offset, ch->elem_count))
        return ft_set_error(FT_ERR_CORRUPT, "chunk descriptor inconsistent with frame");
    size_t out_bytes = (size_t)ft_dtype_nbytes(out_dt, ch->elem_count);
    if (out_cap < out_bytes) return FT_ERR_BUFFER_SMALL;
    ft_worker_ws *ws = &c->ws[worker];
    if (ft_codec_is_lossy(fi->codec)) {
        if (ft_xxh3(payload, ch->enc_size) != ch->hash)
            return ft_set_error(FT_ERR_CORRUPT, "chunk at element %llu: checksum mismatch",
                                (unsigned long long)ch->elem_offset);
        return ft_quant_decode_chunk(fi, &L, ch->elem_offset, ch->elem_count, payload,
                                     ch->enc_size, out_dt, out);
    }
    size_t raw = ch->raw_size;
    uint8_t *target = out;
    if (out_dt != fi->dtype && !(target = ft_ws_scratch(ws, 1, raw))) return FT_ERR_NOMEM;
    if (ch->flags & FT_CHUNK_STORED) {
        if (ch->enc_size != raw) return ft_set_error(FT_ERR_CORRUPT, "stored chunk size");
        memcpy(target, payload, raw);
    } else if (fi->codec == FT_CODEC_BYTEPLANE) {
        st = ft_bp_decode_chunk(ws, fi, payload, ch->enc_size, target, raw);
    } else if (fi->codec == FT_CODEC_RAW) {
        st = ft_set_error(FT_ERR_CORRUPT, "raw chunk not marked stored");
    } else {
        st = ft_entropy_decode(ws, fi->codec, payload, ch->enc_size, target, raw);
    }
    if (st) return st;
    if (lossless_hash(target, raw, payload, ch->enc_size, ch->flags) != ch->hash)
        return ft_set_error(FT_ERR_CORRUPT, "chunk at element %llu: checksum mismatch",
                            (unsigned long long)ch->elem_offset);
    if (target != out) return ft_convert(out, out_dt, target, fi->dtype, (size_t)ch->elem_count);
    return FT_OK;
}

typedef struct {
    ft_codec_ctx *ctx;
    const ft_frame_info *fi;
    const uint8_t *frame;
    ft_dtype out_dt;
    uint8_t *out;
} dec_job;

static void decode_task(void *arg, size_t i, unsigned worker)
{
    dec_job *j = arg;
    ft_codec_ctx *c = j->ctx;
    ft_chunk_info ch;
    ft_layout L;
    ft_status st = ft_layout_compute(j->fi, &L);
    if (st == FT_OK) {
        ft_layout_chunk(&L, (uint32_t)i, &ch.elem_offset, &ch.elem_count);
        ch.raw_offset = ch.elem_offset * L.esize;
        ch.raw_size = (uint32_t)(ch.elem_count * L.esize);
        ch.enc_offset = c->slot[i];
        ch.enc_size = c->enc_size[i];
        ch.flags = c->flags[i];
        ch.hash = c->hash[i];
        size_t out_off = (size_t)ft_dtype_nbytes(j->out_dt, ch.elem_offset);
        st = ft_decode_chunk(c, j->fi, &ch, j->frame + ch.enc_offset, j->out_dt,
                             j->out + out_off, (size_t)ft_dtype_nbytes(j->out_dt, ch.elem_count),
                             worker);
    }
    c->status[i] = st;
    if (st) note_chunk_error(c, i);
}

ft_status ft_decode(ft_codec_ctx *c, const void *frame, size_t size, ft_tensor *dst, size_t cap)
{
    if (!c || !frame || !dst) return ft_set_error(FT_ERR_INVALID_ARG, "ft_decode: NULL argument");
    ft_frame_info fi;
    ft_status st = ft_frame_parse(frame, size, &fi);
    if (st == FT_ERR_BUFFER_SMALL) return ft_set_error(FT_ERR_CORRUPT, "truncated frame header");
    if (st) return st;
    if (fi.frame_size > size)
        return ft_set_error(FT_ERR_CORRUPT, "truncated frame: %zu of %llu bytes", size,
                            (unsigned long long)fi.frame_size);
    if ((st = check_out_dtype(&fi, dst->dtype))) return st;
    uint64_t need = ft_dtype_nbytes(dst->dtype, fi.numel);
    if (need > cap)
        return ft_set_error(FT_ERR_BUFFER_SMALL, "decoded tensor needs %llu bytes, buffer has %zu",
                            (unsigned long long)need, cap);
    if (need && !dst->data) return FT_ERR_INVALID_ARG;
    if ((st = ctx_reserve(c, fi.n_chunks + 1))) return st;
    uint64_t pos = fi.header_size;
    for (uint32_t i = 0; i < fi.n_chunks; i++) {
        c->slot[i] = pos;
        ft_frame_entry(frame, &fi, i, &c->enc_size[i], &c->flags[i], &c->hash[i]);
        pos += c->enc_size[i];
    }
    dec_job job = {c, &fi, frame, dst->dtype, dst->data};
    reset_chunk_error(c);
    ft_pool_run(c->pool, fi.n_chunks, decode_task, &job);
    if ((st = first_chunk_error(c, fi.n_chunks))) return st;
    dst->ndim = fi.ndim;
    memset(dst->shape, 0, sizeof dst->shape);
    if (fi.ndim) memcpy(dst->shape, fi.shape, fi.ndim * sizeof fi.shape[0]);
    return FT_OK;
}

typedef struct {
    ft_codec_ctx *ctx;
    const ft_frame_info *fi;
    const uint8_t *frame;
} ver_job;

static void verify_task(void *arg, size_t i, unsigned worker)
{
    (void)worker;
    ver_job *j = arg;
    ft_codec_ctx *c = j->ctx;
    ft_status st = FT_OK;
    if (ft_xxh3(j->frame + c->slot[i], c->enc_size[i]) != c->hash[i])
        st = ft_set_error(FT_ERR_CORRUPT, "chunk %zu: checksum mismatch", i);
    c->status[i] = st;
    if (st) note_chunk_error(c, i);
}

ft_status ft_frame_verify(ft_codec_ctx *c, const void *frame, size_t size, ft_frame_info *info)
{
    if (!c || !frame) return ft_set_error(FT_ERR_INVALID_ARG, "ft_frame_verify: NULL argument");
    ft_frame_info fi;
    ft_status st = ft_frame_parse(frame, size, &fi);
    if (st == FT_ERR_BUFFER_SMALL) return ft_set_error(FT_ERR_CORRUPT, "truncated frame header");
    if (st) return st;
    if (fi.frame_size != size)
        return ft_set_error(FT_ERR_CORRUPT, "frame of %zu bytes, header says %llu", size,
                            (unsigned long long)fi.frame_size);
    if ((st = ctx_reserve(c, fi.n_chunks + 1))) return st;
    int lossy = ft_codec_is_lossy(fi.codec);
    uint64_t pos = fi.header_size;
    for (uint32_t i = 0; i < fi.n_chunks; i++) {
        c->slot[i] = pos;
        ft_frame_entry(frame, &fi, i, &c->enc_size[i], &c->flags[i], &c->hash[i]);
        if (!lossy && !(c->flags[i] & FT_CHUNK_STORED))
            return ft_set_error(FT_ERR_UNSUPPORTED, "frame (%s): chunk %u is compressed; its checksum "
                                "covers the decoded bytes (ft_decode verifies it)", ft_codec_name(fi.codec), i);
        pos += c->enc_size[i];
    }
    ver_job job = {c, &fi, frame};
    reset_chunk_error(c);
    ft_pool_run(c->pool, fi.n_chunks, verify_task, &job);
    if ((st = first_chunk_error(c, fi.n_chunks))) return st;
    if (info) *info = fi;
    return FT_OK;
}

ft_status ft_decode_alloc(ft_codec_ctx *c, const void *frame, size_t size, int out_dtype,
                          ft_tensor *out)
{
    if (!c || !frame || !out) return FT_ERR_INVALID_ARG;
    ft_frame_info fi;
    ft_status st = ft_frame_parse(frame, size, &fi);
    if (st == FT_ERR_BUFFER_SMALL) return ft_set_error(FT_ERR_CORRUPT, "truncated frame header");
    if (st) return st;
    ft_tensor t;
    memset(&t, 0, sizeof t);
    t.dtype = out_dtype < 0 ? fi.dtype : (ft_dtype)out_dtype;
    if ((unsigned)t.dtype >= FT_DTYPE_COUNT) return FT_ERR_INVALID_ARG;
    if ((st = check_out_dtype(&fi, t.dtype))) return st;
    size_t need = (size_t)ft_dtype_nbytes(t.dtype, fi.numel);
    t.data = ft_malloc_aligned(need ? need : 64, 64);
    if (!t.data) return ft_set_error(FT_ERR_NOMEM, "cannot allocate %zu bytes", need);
    if ((st = ft_decode(c, frame, size, &t, need))) {
        ft_free_aligned(t.data);
        return st;
    }
    *out = t;
    return FT_OK;
}
