/* Frame header: layout, writer and validating parser (docs/frame-format.md). */
#include "codec_internal.h"

#include <assert.h>
#include <stdio.h>
#include <string.h>

/* Fixed header field offsets (little endian). */
enum {
    OFF_MAGIC = 0, OFF_VERSION = 4, OFF_FLAGS = 6, OFF_CODEC = 8,
    OFF_ENTROPY = 9, OFF_LEVEL = 10, OFF_DTYPE = 11, OFF_NDIM = 12,
    OFF_RSV1 = 13, OFF_CHUNK = 16, OFF_GSIZE = 20, OFF_GDIM = 24,
    OFF_NCHUNKS = 28, OFF_RAW = 32, OFF_FRAME = 40, OFF_CSUM = 48,
    OFF_HSIZE = 56, OFF_RSV2 = 60, OFF_SHAPE = 64
};
#define CHUNK_ENTRY 16u
static_assert(FT_FRAME_FIXED_HEADER == OFF_SHAPE, "fixed header is 64 bytes");

static inline void w16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static inline void w32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static inline void w64(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static inline uint16_t r16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline uint32_t r32(const uint8_t *p) { uint32_t v = 0; for (int i = 3; i >= 0; i--) v = (v << 8) | p[i]; return v; }
static inline uint64_t r64(const uint8_t *p) { uint64_t v = 0; for (int i = 7; i >= 0; i--) v = (v << 8) | p[i]; return v; }

static ft_status corrupt(const char *what)
{
    return ft_set_error(FT_ERR_CORRUPT, "invalid frame: %s", what);
}

/* XXH3-64 of the chunk hashes laid out as little-endian u64s. */
static ft_status hash_list(const uint64_t *h, uint32_t n, uint64_t *out)
{
    uint8_t stackbuf[8 * 256] = {0};
    uint8_t *b = n <= 256 ? stackbuf : ft_malloc_aligned(8u * n, 64);
    if (!b && n) return FT_ERR_NOMEM;
    for (uint32_t i = 0; i < n; i++) w64(b + 8 * i, h[i]);
    *out = ft_xxh3(b, 8u * n);
    if (b != stackbuf) ft_free_aligned(b);
    return FT_OK;
}

size_t ft_frame_header_size(uint32_t ndim, uint32_t n_chunks)
{
    return OFF_SHAPE + 8u * ndim + (size_t)CHUNK_ENTRY * n_chunks + 8u;
}

ft_status ft_layout_compute(const ft_frame_info *fi, ft_layout *L)
{
    memset(L, 0, sizeof *L);
    ft_status st = ft_shape_numel(fi->ndim, fi->shape, &L->numel);
    if (st) return st;
    unsigned bits = ft_dtype_bits(fi->dtype);
    if (bits < 8) return ft_set_error(FT_ERR_UNSUPPORTED, "dtype %s cannot be framed",
                                      ft_dtype_name(fi->dtype));
    L->esize = bits / 8;
    if (fi->chunk_size < FT_MIN_CHUNK_SIZE || fi->chunk_size > FT_MAX_CHUNK_SIZE)
        return ft_set_error(FT_ERR_INVALID_ARG, "chunk size %u outside [%u, %u]",
                            fi->chunk_size, FT_MIN_CHUNK_SIZE, FT_MAX_CHUNK_SIZE);
    uint64_t nch;
    if (fi->codec == FT_CODEC_Q8 || fi->codec == FT_CODEC_Q4) {
        if (!ft_dtype_is_float(fi->dtype))
            return ft_set_error(FT_ERR_UNSUPPORTED, "%s needs a float tensor, not %s",
                                ft_codec_name(fi->codec), ft_dtype_name(fi->dtype));
        if (fi->group_size < 1 || fi->group_size > 65536)
            return ft_set_error(FT_ERR_INVALID_ARG, "group size %u outside [1, 65536]",
                                fi->group_size);
        if (fi->ndim == 0) {
            L->outer = 1; L->D = 1; L->inner = 1;
        } else {
            if (fi->group_dim < 0 || (uint32_t)fi->group_dim >= fi->ndim)
                return ft_set_error(FT_ERR_INVALID_ARG, "group dim %d out of range for %u dims",
                                    fi->group_dim, fi->ndim);
            L->outer = 1; L->inner = 1;
            for (int i = 0; i < fi->group_dim; i++) L->outer *= (uint64_t)fi->shape[i];
            L->D = (uint64_t)fi->shape[fi->group_dim];
            for (uint32_t i = (uint32_t)fi->group_dim + 1; i < fi->ndim; i++)
                L->inner *= (uint64_t)fi->shape[i];
        }
        L->G = fi->group_size;
        L->ngroups = L->numel ? (L->D + L->G - 1) / L->G : 0;
        uint64_t slab_bytes = L->G * L->inner * L->esize;
        if (L->numel && slab_bytes > (UINT64_C(1) << 30))
            return ft_set_error(FT_ERR_UNSUPPORTED,
                                "one group slab (%llu bytes) exceeds 1 GiB: use a smaller "
                                "group size or a later group dim", (unsigned long long)slab_bytes);
        /* an empty tensor whose dims after group_dim hold a 0 has empty
         * slabs (found by fuzz_agent_msg: q4, group_dim 0, shape [4, 0]) */
        L->slabs_per_chunk = slab_bytes == 0 || slab_bytes >= fi->chunk_size ? 1 : fi->chunk_size / slab_bytes;
        nch = L->numel ? (L->outer * L->ngroups + L->slabs_per_chunk - 1) / L->slabs_per_chunk : 0;
    } else {
        L->elems_per_chunk = fi->chunk_size / L->esize;
        nch = (L->numel + L->elems_per_chunk - 1) / L->elems_per_chunk;
    }
    if (nch > (UINT32_MAX - 64) / CHUNK_ENTRY)
        return ft_set_error(FT_ERR_INVALID_ARG, "too many chunks");
    L->n_chunks = (uint32_t)nch;
    return FT_OK;
}

void ft_layout_chunk(const ft_layout *L, uint32_t i, uint64_t *off, uint64_t *cnt)
{
    if (L->G == 0) {
        uint64_t o = (uint64_t)i * L->elems_per_chunk;
        uint64_t e = o + L->elems_per_chunk;
        *off = o;
        *cnt = (e > L->numel ? L->numel : e) - o;
        return;
    }
    uint64_t s0 = (uint64_t)i * L->slabs_per_chunk, s1 = s0 + L->slabs_per_chunk;
    uint64_t total = L->outer * L->ngroups;
    if (s1 > total) s1 = total;
    /* element offset of slab s: o*D*inner + g*G*inner */
    uint64_t o0 = s0 / L->ngroups, g0 = s0 % L->ngroups;
    uint64_t o1 = s1 / L->ngroups, g1 = s1 % L->ngroups;
    uint64_t e0 = (o0 * L->D + g0 * L->G) * L->inner;
    uint64_t e1 = (o1 * L->D + g1 * L->G) * L->inner;
    *off = e0;
    *cnt = e1 - e0;
}

size_t ft_chunk_bound(const ft_frame_info *fi, const ft_layout *L, uint64_t off, uint64_t cnt)
{
    size_t raw = (size_t)(cnt * L->esize);
    switch (fi->codec) {
    case FT_CODEC_RAW: return raw;
    case FT_CODEC_BYTEPLANE: return ft_bp_bound(fi, raw);
    case FT_CODEC_Q8: case FT_CODEC_Q4: return ft_quant_chunk_size(fi, L, off, cnt);
    default: {
        size_t b = ft_entropy_bound(fi->codec, raw);
        return b > raw ? b : raw;
    }
    }
}

ft_status ft_frame_write_header(ft_frame_info *fi, const uint32_t *enc_sizes,
                                const uint32_t *flags, const uint64_t *hashes,
                                void *dst, size_t cap)
{
    size_t hs = ft_frame_header_size(fi->ndim, fi->n_chunks);
    if (cap < hs) return FT_ERR_BUFFER_SMALL;
    uint8_t *p = dst;
    memset(p, 0, OFF_SHAPE);
    w32(p + OFF_MAGIC, FT_FRAME_MAGIC);
    w16(p + OFF_VERSION, FT_FRAME_VERSION);
    p[OFF_CODEC] = (uint8_t)fi->codec;
    p[OFF_ENTROPY] = (uint8_t)fi->entropy;
    p[OFF_LEVEL] = (uint8_t)(int8_t)fi->level;
    p[OFF_DTYPE] = (uint8_t)fi->dtype;
    p[OFF_NDIM] = (uint8_t)fi->ndim;
    w32(p + OFF_CHUNK, fi->chunk_size);
    w32(p + OFF_GSIZE, fi->group_size);
    w32(p + OFF_GDIM, (uint32_t)fi->group_dim);
    w32(p + OFF_NCHUNKS, fi->n_chunks);
    w64(p + OFF_RAW, fi->raw_size);
    uint64_t total = hs;
    uint8_t *t = p + OFF_SHAPE + 8 * fi->ndim;
    for (uint32_t i = 0; i < fi->ndim; i++) w64(p + OFF_SHAPE + 8 * i, (uint64_t)fi->shape[i]);
    for (uint32_t i = 0; i < fi->n_chunks; i++) {
        w32(t + CHUNK_ENTRY * i, enc_sizes[i]);
        w32(t + CHUNK_ENTRY * i + 4, flags[i]);
        w64(t + CHUNK_ENTRY * i + 8, hashes[i]);
        total += enc_sizes[i];
    }
    /* The frame checksum hashes the little-endian chunk hashes, so it can
     * be computed per chunk in parallel and verified while streaming. */
    uint64_t csum;
    ft_status st = hash_list(hashes, fi->n_chunks, &csum);
    if (st) return st;
    w64(p + OFF_FRAME, total);
    w64(p + OFF_CSUM, csum);
    w32(p + OFF_HSIZE, (uint32_t)hs);
    w64(p + hs - 8, ft_xxh3(p, hs - 8));
    fi->checksum = csum;
    fi->frame_size = total;
    fi->header_size = hs;
    fi->version = FT_FRAME_VERSION;
    return FT_OK;
}

ft_status ft_frame_parse(const void *frame, size_t size, ft_frame_info *info)
{
    const uint8_t *p = frame;
    if (!frame || !info) return FT_ERR_INVALID_ARG;
    if (size < OFF_SHAPE) {
        if (size >= 4 && r32(p) != FT_FRAME_MAGIC) return corrupt("bad magic");
        return ft_set_error(FT_ERR_BUFFER_SMALL, "frame shorter than its fixed header");
    }
    if (r32(p + OFF_MAGIC) != FT_FRAME_MAGIC) return corrupt("bad magic (not a FlexTier frame)");
    uint32_t version = r16(p + OFF_VERSION);
    if (version != FT_FRAME_VERSION)
        return ft_set_error(version > FT_FRAME_VERSION ? FT_ERR_UNSUPPORTED : FT_ERR_CORRUPT,
                            "frame version %u (this build reads %u)", version, FT_FRAME_VERSION);
    uint32_t ndim = p[OFF_NDIM];
    uint32_t nch = r32(p + OFF_NCHUNKS);
    uint64_t hs = r32(p + OFF_HSIZE);
    if (ndim > FT_MAX_DIMS) return corrupt("too many dimensions");
    if (nch > (UINT32_MAX - 64) / CHUNK_ENTRY) return corrupt("chunk count");
    if (hs != ft_frame_header_size(ndim, nch)) return corrupt("header size");
    ft_frame_info fi;
    memset(&fi, 0, sizeof fi);
    fi.header_size = hs;
    if (size < hs) {
        *info = fi;   /* header_size tells the caller how much to fetch */
        return ft_set_error(FT_ERR_BUFFER_SMALL, "need %llu header bytes", (unsigned long long)hs);
    }
    if (ft_xxh3(p, hs - 8) != r64(p + hs - 8)) return corrupt("header checksum mismatch");
    if (r16(p + OFF_FLAGS) || p[OFF_RSV1] || p[OFF_RSV1 + 1] || p[OFF_RSV1 + 2] || r32(p + OFF_RSV2))
        return corrupt("reserved fields set");
    fi.version = version;
    fi.codec = (ft_codec_id)p[OFF_CODEC];
    fi.entropy = (ft_codec_id)p[OFF_ENTROPY];
    fi.level = (int8_t)p[OFF_LEVEL];
    fi.dtype = (ft_dtype)p[OFF_DTYPE];
    fi.ndim = ndim;
    fi.chunk_size = r32(p + OFF_CHUNK);
    fi.group_size = r32(p + OFF_GSIZE);
    fi.group_dim = (int32_t)r32(p + OFF_GDIM);
    fi.n_chunks = nch;
    fi.raw_size = r64(p + OFF_RAW);
    fi.frame_size = r64(p + OFF_FRAME);
    fi.checksum = r64(p + OFF_CSUM);
    if ((unsigned)fi.codec >= FT_CODEC_COUNT) return corrupt("unknown codec");
    if (fi.codec == FT_CODEC_BYTEPLANE && fi.entropy != FT_CODEC_ZSTD &&
        fi.entropy != FT_CODEC_LZ4 && fi.entropy != FT_CODEC_DEFLATE)
        return corrupt("unknown entropy stage");
    if (fi.codec != FT_CODEC_BYTEPLANE && fi.entropy != FT_CODEC_RAW)
        return corrupt("entropy stage set for a non-byteplane codec");
    if ((unsigned)fi.dtype >= FT_DTYPE_COUNT || ft_dtype_bits(fi.dtype) < 8)
        return corrupt("bad dtype");
    int quant = fi.codec == FT_CODEC_Q8 || fi.codec == FT_CODEC_Q4;
    if (!quant && (fi.group_size || fi.group_dim)) return corrupt("group fields set");
    for (uint32_t i = 0; i < ndim; i++) {
        uint64_t d = r64(p + OFF_SHAPE + 8 * i);
        if (d > (uint64_t)INT64_MAX) return corrupt("negative dimension");
        fi.shape[i] = (int64_t)d;
    }
    ft_layout L;
    ft_clear_error();
    if (ft_layout_compute(&fi, &L) != FT_OK) {
        char why[256];
        snprintf(why, sizeof why, "%s", ft_last_error());
        return corrupt(why);
    }
    fi.numel = L.numel;
    if (fi.raw_size != L.numel * L.esize) return corrupt("raw size does not match shape");
    if (L.n_chunks != nch) return corrupt("chunk count does not match shape");
    /* Chunk table: every payload within its bound, total = frame size. */
    const uint8_t *t = p + OFF_SHAPE + 8 * ndim;
    uint64_t total = hs;
    uint8_t hbuf[8 * 256];
    uint8_t *hashes = nch <= 256 ? hbuf : ft_malloc_aligned(8u * nch, 64);
    if (!hashes && nch) return FT_ERR_NOMEM;
    ft_status st = FT_OK;
    for (uint32_t i = 0; i < nch; i++) {
        uint32_t enc = r32(t + CHUNK_ENTRY * i), fl = r32(t + CHUNK_ENTRY * i + 4);
        uint64_t off, cnt;
        ft_layout_chunk(&L, i, &off, &cnt);
        uint64_t raw = cnt * L.esize;
        if (fl & ~FT_CHUNK_STORED) { st = corrupt("unknown chunk flags"); break; }
        if (fl & FT_CHUNK_STORED) {
            if (quant || enc != raw) { st = corrupt("stored chunk size"); break; }
        } else if (enc > ft_chunk_bound(&fi, &L, off, cnt) ||
                   (quant && enc != ft_quant_chunk_size(&fi, &L, off, cnt)) ||
                   (fi.codec == FT_CODEC_RAW)) {
            st = corrupt("chunk size out of bounds");
            break;
        }
        total += enc;
        memcpy(hashes + 8 * i, t + CHUNK_ENTRY * i + 8, 8);
    }
    if (st == FT_OK && total != fi.frame_size) st = corrupt("chunk sizes do not add up to the frame size");
    if (st == FT_OK && ft_xxh3(hashes, 8u * nch) != fi.checksum) st = corrupt("checksum of chunk hashes");
    if (hashes != hbuf) ft_free_aligned(hashes);
    if (st) return st;
    *info = fi;
    return FT_OK;
}

ft_status ft_frame_chunk(const void *frame, size_t size, const ft_frame_info *fi,
                         uint32_t i, ft_chunk_info *out)
{
    if (!frame || !fi || !out || i >= fi->n_chunks || size < fi->header_size)
        return FT_ERR_INVALID_ARG;
    const uint8_t *t = (const uint8_t *)frame + OFF_SHAPE + 8 * fi->ndim;
    ft_layout L;
    ft_status st = ft_layout_compute(fi, &L);
    if (st) return st;
    uint64_t enc_off = fi->header_size;
    for (uint32_t k = 0; k < i; k++) enc_off += r32(t + CHUNK_ENTRY * k);
    ft_chunk_info c;
    ft_layout_chunk(&L, i, &c.elem_offset, &c.elem_count);
    c.raw_offset = c.elem_offset * L.esize;
    c.raw_size = (uint32_t)(c.elem_count * L.esize);
    c.enc_size = r32(t + CHUNK_ENTRY * i);
    c.flags = r32(t + CHUNK_ENTRY * i + 4);
    c.hash = r64(t + CHUNK_ENTRY * i + 8);
    c.enc_offset = enc_off;
    *out = c;
    return FT_OK;
}

void ft_frame_entry(const void *frame, const ft_frame_info *fi, uint32_t i,
                    uint32_t *enc, uint32_t *flags, uint64_t *hash)
{
    const uint8_t *t = (const uint8_t *)frame + OFF_SHAPE + 8 * fi->ndim + CHUNK_ENTRY * i;
    *enc = r32(t);
    *flags = r32(t + 4);
    *hash = r64(t + 8);
}
