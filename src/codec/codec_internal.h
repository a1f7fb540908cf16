/* Internal to the codec layer: per-worker workspaces, the chunk layout and
 * the chunk codec entry points. *
 * FT_API on a declaration here: called by a library above flextier-codec
 * (the CUDA backend, the engine's kernels), so libflextier-codec.so
 * exports it. Not public API: it may change with any release. */
#ifndef FT_CODEC_INTERNAL_H
#define FT_CODEC_INTERNAL_H

#include "flextier/codec.h"

struct ZSTD_CCtx_s;
struct ZSTD_DCtx_s;
struct libdeflate_compressor;
struct libdeflate_decompressor;
typedef struct ft_huf_table ft_huf_table;   /* zstd_lit.c */

#define FT_DEFLATE_LEVELS 13

/* One per pool worker; everything allocated lazily once and reused, so the
 * encode/decode fast path does not allocate after warm-up. */
typedef struct ft_worker_ws {
    struct ZSTD_CCtx_s *zc;
    struct ZSTD_DCtx_s *zd;
    int zc_level, zc_mode;                /* parameters zc is set up for */
    struct libdeflate_compressor *dc[FT_DEFLATE_LEVELS];
    struct libdeflate_decompressor *dd;
    void *lz4_state;
    ft_huf_table *huf;                    /* ft_zstd_lit_decode's table */
    uint8_t *scratch[2];                  /* general-purpose buffers */
    size_t scratch_cap[2];
} ft_worker_ws;

/* Grow scratch buffer k (0 or 1) of ws to at least n bytes. */
uint8_t *ft_ws_scratch(ft_worker_ws *ws, int k, size_t n);
FT_API void ft_ws_release(ft_worker_ws *ws);

/* Frame geometry shared by the writer and the parser. */
typedef struct ft_layout {
    uint64_t numel;
    uint32_t esize;          /* bytes per element of the frame dtype */
    uint32_t n_chunks;
    /* lossless: fixed elements per chunk */
    uint64_t elems_per_chunk;
    /* quantized: tensor viewed as [outer, D, inner], groups of G along D */
    uint64_t outer, D, inner, G, ngroups, slabs_per_chunk;
} ft_layout;

FT_API ft_status ft_layout_compute(const ft_frame_info *fi, ft_layout *L);
/* Elements [off, off+cnt) of chunk i. */
FT_API void ft_layout_chunk(const ft_layout *L, uint32_t i, uint64_t *off, uint64_t *cnt);
/* Upper bound of the payload of a chunk holding `cnt` elements. */
size_t ft_chunk_bound(const ft_frame_info *fi, const ft_layout *L, uint64_t off, uint64_t cnt);

/* Generic entropy coding of a byte range (lz4, zstd, deflate) used by the
 * lossless codecs and the byte-plane stage. decode requires the exact
 * decoded size. */
size_t ft_entropy_bound(ft_codec_id c, size_t n);
ft_status ft_entropy_encode(ft_worker_ws *ws, ft_codec_id c, int level,
                            const void *src, size_t n, void *dst, size_t cap,
                            size_t *out);
FT_API ft_status ft_entropy_decode(ft_worker_ws *ws, ft_codec_id c, const void *src,
                                   size_t n, void *dst, size_t raw);

/* zstd frame of literal-only blocks (Huffman coding, no match search):
 * see lossless.c. FT_ERR_BUFFER_SMALL if it does not fit in cap. */
ft_status ft_zstd_literals_encode(ft_worker_ws *ws, const void *src, size_t n,
                                  void *dst, size_t cap, size_t *out);

/* Fast decoder of the zstd frames ft_zstd_literals_encode writes (only
 * Huffman-literal, raw and RLE blocks): FT_OK when it decoded src into
 * exactly raw bytes with libzstd's checks; FT_ERR_UNSUPPORTED (no message)
 * for anything else, valid or not: then ft_entropy_decode (libzstd)
 * decides. See zstd_lit.c. */
ft_status ft_zstd_lit_decode(ft_worker_ws *ws, const void *src, size_t n, void *dst, size_t raw);

/* Byte-plane codec (byteplane.c). src holds n elements of fi->dtype. */
size_t ft_bp_bound(const ft_frame_info *fi, size_t raw_bytes);
ft_status ft_bp_encode_chunk(ft_worker_ws *ws, const ft_frame_info *fi,
                             const void *src, size_t raw_bytes,
                             void *dst, size_t cap, size_t *out);
ft_status ft_bp_decode_chunk(ft_worker_ws *ws, const ft_frame_info *fi,
                             const void *src, size_t n, void *dst,
                             size_t raw_bytes);

/* Group quantization (quant.c). A chunk is a run of whole slabs (one group
 * index g of one outer index o: elements [o][gG..min((g+1)G,D))[0..inner)),
 * so its elements are contiguous. Payload: per group (in slab order, then
 * inner order) fp16 min then fp16 scale, followed by the packed values in
 * element order (q4: two per byte, low nibble first, odd count padded). */
FT_API size_t ft_quant_chunk_size(const ft_frame_info *fi, const ft_layout *L,
                                  uint64_t off, uint64_t cnt);
ft_status ft_quant_encode_chunk(const ft_frame_info *fi, const ft_layout *L,
                                uint64_t off, uint64_t cnt, const void *src,
                                void *dst, size_t cap, size_t *out);
ft_status ft_quant_decode_chunk(const ft_frame_info *fi, const ft_layout *L,
                                uint64_t off, uint64_t cnt, const void *src,
                                size_t n, ft_dtype out_dt, void *dst);

/* Write the header + chunk table for `fi` into dst (cap >= header size);
 * enc_sizes/flags/hashes per chunk. Sets fi->checksum/frame_size. */
size_t ft_frame_header_size(uint32_t ndim, uint32_t n_chunks);
ft_status ft_frame_write_header(ft_frame_info *fi, const uint32_t *enc_sizes,
                                const uint32_t *flags, const uint64_t *hashes,
                                void *dst, size_t cap);

/* Table entry i of a parsed frame (no checks: i < fi->n_chunks). */
FT_API void ft_frame_entry(const void *frame, const ft_frame_info *fi, uint32_t i,
                           uint32_t *enc, uint32_t *flags, uint64_t *hash);

#endif
