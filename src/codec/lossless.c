/* Entropy stages shared by the lossless codecs and the byte-plane codec. */
#include "codec_internal.h"

#include <limits.h>
#include <string.h>
#include <lz4.h>
#define ZSTD_STATIC_LINKING_ONLY  /* ZSTD_c_literalCompressionMode */
#include <zstd.h>
#include <libdeflate.h>

uint8_t *ft_ws_scratch(ft_worker_ws *ws, int k, size_t n)
{
    if (ws->scratch_cap[k] >= n) return ws->scratch[k];
    ft_free_aligned(ws->scratch[k]);
    ws->scratch[k] = ft_malloc_aligned(n ? n : 64, 64);
    ws->scratch_cap[k] = ws->scratch[k] ? n : 0;
    return ws->scratch[k];
}

size_t ft_entropy_bound(ft_codec_id c, size_t n)
{
    switch (c) {
    case FT_CODEC_LZ4: return n > LZ4_MAX_INPUT_SIZE ? 0 : (size_t)LZ4_compressBound((int)n);
    case FT_CODEC_ZSTD: return ZSTD_compressBound(n);
    /* libdeflate_deflate_compress_bound(NULL, n) is the any-level bound. */
    case FT_CODEC_DEFLATE: return libdeflate_deflate_compress_bound(NULL, n);
    default: return n;
    }
}

/* zstd level mapping: levels >= 1 are zstd's; level 0 = default 1.
 * Negative levels are zstd's fast modes. `mode` 0 = ordinary compression
 * at `level`; mode 1 = literal-only blocks for ft_zstd_literals_encode
 * (level 1 entropy settings with Huffman literal compression forced on).
 * ws->zc_level/zc_mode record what zc is set up for, so a worker that
 * alternates between the two pays a parameter reset only on a switch. */
static ft_status zstd_cctx(ft_worker_ws *ws, int level, int mode)
{
    if (!ws->zc) {
        ws->zc = ZSTD_createCCtx();
        if (!ws->zc) return FT_ERR_NOMEM;
        ws->zc_level = INT_MIN;
    }
    if (ws->zc_level != level || ws->zc_mode != mode) {
        ZSTD_CCtx_reset(ws->zc, ZSTD_reset_session_and_parameters);
        ZSTD_CCtx_setParameter(ws->zc, ZSTD_c_compressionLevel, level);
        ZSTD_CCtx_setParameter(ws->zc, ZSTD_c_checksumFlag, 0);
        ZSTD_CCtx_setParameter(ws->zc, ZSTD_c_contentSizeFlag, 0);
        if (mode == 1) {
            ZSTD_CCtx_setParameter(ws->zc, ZSTD_c_literalCompressionMode, ZSTD_ps_enable);
            ZSTD_CCtx_setParameter(ws->zc, ZSTD_c_blockDelimiters, ZSTD_sf_noBlockDelimiters);
        }
        ws->zc_level = level;
        ws->zc_mode = mode;
    }
    return FT_OK;
}

/* A standard zstd frame whose blocks hold only literals: no match search
 * at all, so zstd acts as a (4-stream Huffman) order-0 entropy coder.
 * ZSTD_compressSequences with an empty sequence list treats the whole
 * input as literals and cuts it into 128 KiB blocks; each block is
 * Huffman-coded, or stored/RLE when that is smaller. Decoded by any zstd
 * decoder (ft_entropy_decode). Used by the byte-plane codec for planes
 * whose redundancy is in their byte histogram (the exponent plane). */
ft_status ft_zstd_literals_encode(ft_worker_ws *ws, const void *src, size_t n,
                                  void *dst, size_t cap, size_t *out)
{
    ft_status st = zstd_cctx(ws, 1, 1);
    if (st) return st;
    ZSTD_Sequence none = {0, 0, 0, 0};
    size_t r = ZSTD_compressSequences(ws->zc, dst, cap, &none, 0, src, n);
    if (ZSTD_isError(r))
        return ft_set_error(FT_ERR_BUFFER_SMALL, "zstd: %s", ZSTD_getErrorName(r));
    *out = r;
    return FT_OK;
}

ft_status ft_entropy_encode(ft_worker_ws *ws, ft_codec_id c, int level,
                            const void *src, size_t n, void *dst, size_t cap,
                            size_t *out)
{
    switch (c) {
    case FT_CODEC_LZ4: {
        if (n > LZ4_MAX_INPUT_SIZE || cap > INT_MAX) return FT_ERR_INVALID_ARG;
        if (!ws->lz4_state && !(ws->lz4_state = ft_malloc_aligned((size_t)LZ4_sizeofState(), 64)))
            return FT_ERR_NOMEM;
        int accel = level < 0 ? -level : 1;
        int r = LZ4_compress_fast_extState(ws->lz4_state, src, dst, (int)n, (int)cap, accel);
        if (r <= 0) return FT_ERR_BUFFER_SMALL;
        *out = (size_t)r;
        return FT_OK;
    }
    case FT_CODEC_ZSTD: {
        ft_status st = zstd_cctx(ws, level ? level : 1, 0);
        if (st) return st;
        size_t r = ZSTD_compress2(ws->zc, dst, cap, src, n);
        if (ZSTD_isError(r))
            return ft_set_error(FT_ERR_BUFFER_SMALL, "zstd: %s", ZSTD_getErrorName(r));
        *out = r;
        return FT_OK;
    }
    case FT_CODEC_DEFLATE: {
        int lv = level ? level : 1;
        if (lv < 0 || lv >= FT_DEFLATE_LEVELS)
            return ft_set_error(FT_ERR_INVALID_ARG, "deflate level %d outside 0..12", level);
        if (!ws->dc[lv] && !(ws->dc[lv] = libdeflate_alloc_compressor(lv))) return FT_ERR_NOMEM;
        size_t r = libdeflate_deflate_compress(ws->dc[lv], src, n, dst, cap);
        if (r == 0) return FT_ERR_BUFFER_SMALL;
        *out = r;
        return FT_OK;
    }
    default:
        return ft_set_error(FT_ERR_INVALID_ARG, "not an entropy codec: %s", ft_codec_name(c));
    }
}

ft_status ft_entropy_decode(ft_worker_ws *ws, ft_codec_id c, const void *src,
                            size_t n, void *dst, size_t raw)
{
    switch (c) {
    case FT_CODEC_LZ4: {
        if (n > INT_MAX || raw > INT_MAX) return FT_ERR_CORRUPT;
        int r = LZ4_decompress_safe(src, dst, (int)n, (int)raw);
        if (r < 0 || (size_t)r != raw)
            return ft_set_error(FT_ERR_CORRUPT, "lz4 chunk does not decode to %zu bytes", raw);
        return FT_OK;
    }
    case FT_CODEC_ZSTD: {
        if (!ws->zd && !(ws->zd = ZSTD_createDCtx())) return FT_ERR_NOMEM;
        size_t r = ZSTD_decompressDCtx(ws->zd, dst, raw, src, n);
        if (ZSTD_isError(r) || r != raw)
            return ft_set_error(FT_ERR_CORRUPT, "zstd chunk: %s",
                                ZSTD_isError(r) ? ZSTD_getErrorName(r) : "wrong decoded size");
        return FT_OK;
    }
    case FT_CODEC_DEFLATE: {
        if (!ws->dd && !(ws->dd = libdeflate_alloc_decompressor())) return FT_ERR_NOMEM;
        /* NULL actual size: libdeflate requires exactly `raw` bytes. */
        enum libdeflate_result r = libdeflate_deflate_decompress(ws->dd, src, n, dst, raw, NULL);
        if (r != LIBDEFLATE_SUCCESS)
            return ft_set_error(FT_ERR_CORRUPT, "deflate chunk does not decode to %zu bytes", raw);
        return FT_OK;
    }
    default:
        return FT_ERR_CORRUPT;
    }
}

void ft_ws_release(ft_worker_ws *ws)
{
    ZSTD_freeCCtx(ws->zc);
    ZSTD_freeDCtx(ws->zd);
    for (int i = 0; i < FT_DEFLATE_LEVELS; i++) libdeflate_free_compressor(ws->dc[i]);
    libdeflate_free_decompressor(ws->dd);
    ft_free_aligned(ws->lz4_state);
    ft_free_aligned(ws->huf);
    ft_free_aligned(ws->scratch[0]);
    ft_free_aligned(ws->scratch[1]);
    memset(ws, 0, sizeof *ws);
}
