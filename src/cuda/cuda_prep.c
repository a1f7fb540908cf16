/* Host-side halves of the GPU codec (validation, the CPU entropy stage of
 * byte planes) and the GEMM mapping: plain C, in every build. */
#include "cuda_prep.h"
#include "codec/byteplane.h"

#include <string.h>

static ft_status corrupt_chunk(uint32_t c, const char *why)
{
    return ft_set_error(FT_ERR_CORRUPT, "frame chunk %u: %s", c, why);
}

ft_status ft_cuda_prep_quant(const uint8_t *frame, const ft_frame_info *fi, int trusted, ftk_qgeom *g)
{
    if (fi->codec != FT_CODEC_Q8 && fi->codec != FT_CODEC_Q4)
        return ft_set_error(FT_ERR_INTERNAL, "prep_quant: codec %s", ft_codec_name(fi->codec));
    ft_layout L;
    ft_status st = ft_layout_compute(fi, &L);
    if (st) return st;
    const int bits = fi->codec == FT_CODEC_Q8 ? 8 : 4;
    uint64_t pos = fi->header_size;
    for (uint32_t c = 0; c < fi->n_chunks; c++) {
        uint32_t enc, flags;
        uint64_t hash, off, cnt;
        ft_frame_entry(frame, fi, c, &enc, &flags, &hash);
        ft_layout_chunk(&L, c, &off, &cnt);
        if (flags || enc != ft_quant_chunk_size(fi, &L, off, cnt))   /* ft_frame_parse checked it too */
            return corrupt_chunk(c, "payload size does not match its layout");
        if (!trusted && ft_xxh3(frame + pos, enc) != hash) return corrupt_chunk(c, "checksum mismatch");
        if (bits == 4 && (cnt & 1) && (frame[pos + enc - 1] >> 4)) return corrupt_chunk(c, "q4 pad nibble not zero");
        pos += enc;
    }
    if (pos != fi->frame_size) return ft_set_error(FT_ERR_CORRUPT, "frame: chunk sizes do not add up");
    memset(g, 0, sizeof *g);
    g->numel = L.numel;
    g->outer = L.outer;
    g->D = L.D;
    g->inner = L.inner;
    g->G = L.G;
    g->ngroups = L.ngroups;
    g->spc = L.slabs_per_chunk;
    g->n_chunks = fi->n_chunks;
    g->bits = bits;
    g->header_size = fi->header_size;
    return FT_OK;
}

ft_status ft_cuda_prep_raw(const uint8_t *frame, const ft_frame_info *fi, int trusted)
{
    ft_layout L;
    ft_status st = ft_layout_compute(fi, &L);
    if (st) return st;
    uint64_t pos = fi->header_size;
    for (uint32_t c = 0; c < fi->n_chunks; c++) {
        uint32_t enc, flags;
        uint64_t hash, off, cnt;
        ft_frame_entry(frame, fi, c, &enc, &flags, &hash);
        ft_layout_chunk(&L, c, &off, &cnt);
        if (!(flags & FT_CHUNK_STORED) || enc != cnt * L.esize || off * L.esize != pos - fi->header_size)
            return corrupt_chunk(c, "raw chunk not stored in place");
        if (!trusted && ft_xxh3(frame + pos, enc) != hash) return corrupt_chunk(c, "checksum mismatch");
        pos += enc;
    }
    if (pos != fi->frame_size) return ft_set_error(FT_ERR_CORRUPT, "frame: chunk sizes do not add up");
    return FT_OK;
}

enum { BP_RAW = 0, BP_ENTROPY = 1, BP_CONST = 2 };

/* One chunk's planes (docs/codec-byteplane.md), validated as
 * ft_bp_decode_chunk does. */
static ft_status bp_planes(ft_worker_ws *ws, const ft_frame_info *fi, uint32_t c, const uint8_t *p, size_t n_in,
                           size_t n, uint8_t *const *planes)
{
    unsigned np = ft_bp_nplanes(fi->dtype);
    if (n_in < 1) return corrupt_chunk(c, "byteplane payload empty");
    unsigned modes = p[0], ne = 0;
    if (np < 4 && (modes >> (2 * np))) return corrupt_chunk(c, "byteplane: unused mode bits set");
    for (unsigned k = 0; k < np; k++) {
        unsigned m = (modes >> (2 * k)) & 3;
        if (m == 3) return corrupt_chunk(c, "byteplane: plane mode 3");
        if (m == BP_ENTROPY) ne++;
    }
    size_t pos = 1 + 4 * (size_t)ne;
    if (n_in < pos) return corrupt_chunk(c, "byteplane: header truncated");
    const uint8_t *sp[FT_BP_MAX_PLANES];
    size_t sl[FT_BP_MAX_PLANES];
    unsigned j = 0;
    for (unsigned k = 0; k < np; k++) {
        unsigned m = (modes >> (2 * k)) & 3;
        size_t len;
        if (m == BP_RAW) len = n;
        else if (m == BP_CONST) len = 1;
        else {
            const uint8_t *q = p + 1 + 4 * j++;
            len = (size_t)q[0] | (size_t)q[1] << 8 | (size_t)q[2] << 16 | (size_t)q[3] << 24;
            if (len == 0 || len >= n) return corrupt_chunk(c, "byteplane: coded plane size out of range");
        }
        if (len > n_in - pos) return corrupt_chunk(c, "byteplane: plane overruns the payload");
        sp[k] = p + pos;
        sl[k] = len;
        pos += len;
    }
    if (pos != n_in) return corrupt_chunk(c, "byteplane: trailing bytes");
    for (unsigned k = 0; k < np; k++) {
        unsigned m = (modes >> (2 * k)) & 3;
        if (m == BP_RAW) memcpy(planes[k], sp[k], n);
        else if (m == BP_CONST) memset(planes[k], sp[k][0], n);
        else {
            ft_status st = ft_entropy_decode(ws, fi->entropy, sp[k], sl[k], planes[k], n);
            if (st) return st;
        }
    }
    return FT_OK;
}

ft_status ft_cuda_prep_byteplane(ft_worker_ws *ws, const uint8_t *frame, const ft_frame_info *fi, int trusted,
                                 uint8_t *planes, uint64_t *chunk_elems)
{
    unsigned np = ft_bp_nplanes(fi->dtype);
    if (fi->codec != FT_CODEC_BYTEPLANE || np == 0)
        return ft_set_error(FT_ERR_CORRUPT, "byteplane frame of dtype %s", ft_dtype_name(fi->dtype));
    ft_layout L;
    ft_status st = ft_layout_compute(fi, &L);
    if (st) return st;
    uint64_t pos = fi->header_size;
    for (uint32_t c = 0; c < fi->n_chunks; c++) {
        uint32_t enc, flags;
        uint64_t hash, off, cnt;
        ft_frame_entry(frame, fi, c, &enc, &flags, &hash);
        ft_layout_chunk(&L, c, &off, &cnt);
        uint8_t *base = planes + off * np;      /* = c * E * np */
        uint8_t *pl[FT_BP_MAX_PLANES];
        for (unsigned k = 0; k < np; k++) pl[k] = base + (size_t)k * cnt;
        if (flags & FT_CHUNK_STORED) {
            if (enc != cnt * L.esize) return corrupt_chunk(c, "stored chunk size");
            if (!trusted && ft_xxh3(frame + pos, enc) != hash) return corrupt_chunk(c, "checksum mismatch");
            ft_bp_split(fi->dtype, frame + pos, (size_t)cnt, pl);
        } else if ((st = bp_planes(ws, fi, c, frame + pos, enc, (size_t)cnt, pl))) {
            return st;
        }
        pos += enc;
    }
    if (pos != fi->frame_size) return ft_set_error(FT_ERR_CORRUPT, "frame: chunk sizes do not add up");
    *chunk_elems = L.elems_per_chunk;
    return FT_OK;
}

void ft_cuda_gemm_dims_for(int rows, int in, int out, ft_cuda_gemm_dims *d)
{
    d->trans_a = 1;
    d->trans_b = 0;
    d->m = out;
    d->n = rows;
    d->k = in;
    d->lda = in;
    d->ldb = in;
    d->ldc = out;
}
