/*
 * flextier/codec.h - self-describing encoded-tensor frames.
 *
 * A frame holds one tensor: a fixed little-endian header (magic "FTTF",
 * version, codec and parameters, dtype, shape, sizes), a chunk table, a
 * header checksum, then the chunks' payloads. Chunks (default 256 KiB of
 * raw bytes) are encoded and decoded independently, in parallel on the
 * context's thread pool, and can be streamed one at a time. The exact byte
 * layout is specified in docs/frame-format.md.
 *
 * Codecs:
 *   raw        copy (+ checksum)
 *   lz4        liblz4 block per chunk
 *   zstd       libzstd frame per chunk (level)
 *   deflate    libdeflate; each chunk is a raw DEFLATE stream (RFC 1951)
 *              that zlib's inflate (windowBits -15) or a BlueField DPU's
 *              decompress engine can decode
 *   byteplane  float byte-plane grouping for f32/f16/bf16: exponent bytes
 *              separated from sign+mantissa, each plane entropy-coded with
 *              `entropy` (zstd, lz4 or deflate) or stored if it does not
 *              shrink. Lossless.
 *   q8, q4     FlexGen group-wise asymmetric quantization of f32/f16/bf16:
 *              per group of group_size elements along group_dim an fp16
 *              min (rounded down) and step (rounded up), x ~ q*step + min
 *              with q in 0..2^bits-1; q4 packs two values per byte (4.5
 *              bits per value with group 64). Lossy: |x - decode(x)| <=
 *              step/2 plus f32/output-dtype rounding terms (the exact bound
 *              and layout: docs/codec-quant.md). Encoding a NaN/Inf fails
 *              with FT_ERR_INVALID_ARG; a group whose min or step does not
 *              fit fp16 (|min| or step > 65504) with FT_ERR_UNSUPPORTED.
 *
 * Thread-safety: an ft_codec_ctx is used by one thread at a time (it owns
 * the pool and the per-worker workspaces). Frames and params are plain
 * data. Different contexts may be used concurrently.
 *
 * Untrusted input: ft_frame_parse and every decoder validate everything;
 * a truncated, bit-flipped or hostile frame yields FT_ERR_CORRUPT (or
 * FT_ERR_UNSUPPORTED for a newer version) and never reads or writes out
 * of bounds. Memory use is bounded by the caller-visible sizes.
 */
#ifndef FLEXTIER_CODEC_H
#define FLEXTIER_CODEC_H

#include "flextier/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ft_codec_id {
    FT_CODEC_RAW = 0, FT_CODEC_LZ4 = 1, FT_CODEC_ZSTD = 2,
    FT_CODEC_DEFLATE = 3, FT_CODEC_BYTEPLANE = 4,
    FT_CODEC_Q8 = 5, FT_CODEC_Q4 = 6,
    FT_CODEC_COUNT = 7
} ft_codec_id;

FT_API const char *ft_codec_name(ft_codec_id c);        /* "zstd"; "?" if invalid */
/* Parse a codec name: raw|none, lz4, zstd, deflate, byteplane|bp, q8, q4.
 * "bp-lz4", "byteplane-deflate" etc. also set the entropy stage. */
FT_API ft_status ft_codec_parse(const char *s, ft_codec_id *codec,
                                ft_codec_id *entropy);
FT_API int ft_codec_is_lossy(ft_codec_id c);

#define FT_DEFAULT_CHUNK_SIZE (256u * 1024u)
#define FT_MIN_CHUNK_SIZE     (4u * 1024u)
#define FT_MAX_CHUNK_SIZE     (64u * 1024u * 1024u)
#define FT_DEFAULT_GROUP_SIZE 64u

typedef struct ft_codec_params {
    ft_codec_id codec;      /* default FT_CODEC_ZSTD                       */
    int         level;      /* zstd/deflate level; 0 = codec default        */
    ft_codec_id entropy;    /* byteplane stage: ZSTD (default), LZ4, DEFLATE */
    uint32_t    chunk_size; /* raw bytes per chunk, FT_MIN..FT_MAX_CHUNK   */
    uint32_t    group_size; /* q8/q4 elements per group, 1..65536, default 64 */
    int32_t     group_dim;  /* q8/q4 dimension; negative counts from the end
                               (default -1: last, contiguous groups; FlexGen
                               uses 0 for weights and head_dim for KV) */
} ft_codec_params;

FT_API void ft_codec_default_params(ft_codec_params *p);

/* ---------------------------------------------------------------- frames */

#define FT_FRAME_MAGIC   0x46545446u  /* "FTTF" little endian */
#define FT_FRAME_VERSION 1u

/* Per-chunk flag bits (ft_chunk_info.flags). */
#define FT_CHUNK_STORED 0x1u   /* payload is the raw bytes (did not shrink) */

typedef struct ft_chunk_info {
    uint64_t raw_offset;   /* byte offset of the chunk in the decoded tensor
                              (in the frame dtype)                          */
    uint32_t raw_size;     /* decoded bytes in the frame dtype               */
    uint32_t enc_size;     /* payload bytes                                  */
    uint64_t enc_offset;   /* payload offset from the start of the frame     */
    uint64_t hash;         /* XXH3-64 of raw chunk (lossless) or payload     */
    uint64_t elem_offset;  /* first element of the chunk                    */
    uint64_t elem_count;   /* elements in the chunk                         */
    uint32_t flags;
} ft_chunk_info;

/* A parsed, fully validated frame header (no pointers into the frame). */
typedef struct ft_frame_info {
    uint32_t    version;
    ft_codec_id codec;
    ft_codec_id entropy;
    int         level;
    ft_dtype    dtype;          /* dtype of the original tensor */
    uint32_t    ndim;
    int64_t     shape[FT_MAX_DIMS];
    uint32_t    chunk_size;
    uint32_t    group_size;
    int32_t     group_dim;      /* normalized to 0..ndim-1 for q8/q4 */
    uint32_t    n_chunks;
    uint64_t    numel;
    uint64_t    raw_size;       /* bytes of the tensor in `dtype` */
    uint64_t    frame_size;     /* total bytes of the frame */
    uint64_t    header_size;    /* bytes before the first payload */
    uint64_t    checksum;       /* XXH3-64 over the chunk hashes */
} ft_frame_info;

/* Minimum bytes needed to learn a frame's header_size. */
#define FT_FRAME_FIXED_HEADER 64u

/* Parse and validate a frame header and chunk table. `size` may be just
 * the header (>= header_size) when streaming: payload bounds are then
 * checked against info->frame_size, which the caller must supply in full
 * before decoding. Returns FT_ERR_CORRUPT with a detail on any mismatch,
 * FT_ERR_BUFFER_SMALL if size < header (info->header_size is then set when
 * at least FT_FRAME_FIXED_HEADER bytes were given). */
FT_API ft_status ft_frame_parse(const void *frame, size_t size, ft_frame_info *info);
/* Chunk i of a parsed frame (i < info->n_chunks). */
FT_API ft_status ft_frame_chunk(const void *frame, size_t size,
                                const ft_frame_info *info, uint32_t i,
                                ft_chunk_info *out);

/* --------------------------------------------------------------- context */

typedef struct ft_codec_ctx ft_codec_ctx;

/* nthreads: 0 = ft_default_threads() (FLEXTIER_THREADS, else the usable CPUs). */
FT_API ft_status ft_codec_ctx_create(unsigned nthreads, ft_codec_ctx **out);
FT_API void      ft_codec_ctx_free(ft_codec_ctx *ctx);
FT_API unsigned  ft_codec_ctx_threads(const ft_codec_ctx *ctx);
/* How long the context's threads spin for the next job before they sleep
 * (ft_pool_set_spin_us; 0: sleep at once; FLEXTIER_SPIN_US wins). */
FT_API void      ft_codec_ctx_set_spin_us(ft_codec_ctx *ctx, unsigned us);

/* Worst-case frame size for a tensor of this dtype/shape with these
 * params; 0 if the params or shape are invalid. */
FT_API size_t ft_encode_bound(const ft_codec_params *p, ft_dtype dt,
                              uint32_t ndim, const int64_t *shape);

/* Encode `src` into dst[0..cap). *out_size = frame bytes. If cap is below
 * ft_encode_bound the context encodes into its scratch first and returns
 * FT_ERR_BUFFER_SMALL if the result does not fit. q8/q4 require a float
 * dtype; byteplane falls back to plain entropy coding of a non-float
 * dtype. */
FT_API ft_status ft_encode(ft_codec_ctx *ctx, const ft_codec_params *p,
                           const ft_tensor *src, void *dst, size_t cap,
                           size_t *out_size);

/* Streaming encode: a frame produced a run of chunks at a time, its
 * header last (the header holds every chunk's size and checksum). The
 * memory node's pipelined writes send each run while the next is being
 * encoded. The encoder borrows ctx (and src's data) until it is freed.
 *
 * For the raw codec the payloads are the tensor's own bytes: encode only
 * hashes them and returns a pointer into src->data (no copy); every other
 * codec writes into the caller's dst. Each chunk is hashed once, while its
 * bytes are in cache. */
typedef struct ft_encoder ft_encoder;

FT_API ft_status ft_encoder_begin(ft_codec_ctx *ctx, const ft_codec_params *p,
                                  const ft_tensor *src, ft_encoder **out);
/* n_chunks, header bytes, worst-case frame bytes; *zero_copy: payloads
 * point into the tensor. Any pointer may be NULL. */
FT_API void ft_encoder_info(const ft_encoder *e, uint32_t *n_chunks, size_t *header_size,
                            size_t *bound, int *zero_copy);
/* Raw bytes and worst-case payload bytes of chunks [first, first+count). */
FT_API size_t ft_encoder_raw_bytes(const ft_encoder *e, uint32_t first, uint32_t count);
FT_API size_t ft_encoder_run_bound(const ft_encoder *e, uint32_t first, uint32_t count);
/* Encode chunks [first, first+count) (in order: first must be the next
 * chunk not yet encoded) in parallel on ctx's threads; their payloads end
 * up back to back at *payload (dst, or the tensor for zero copy), *size
 * bytes. dst needs ft_encoder_run_bound bytes (unused for zero copy). */
FT_API ft_status ft_encoder_encode(ft_encoder *e, uint32_t first, uint32_t count, void *dst,
                                   size_t cap, const void **payload, size_t *size);
/* Once every chunk is encoded: the header (header_size bytes) into dst;
 * *frame_size = header + payloads. */
FT_API ft_status ft_encoder_header(ft_encoder *e, void *dst, size_t cap, uint64_t *frame_size);
FT_API void ft_encoder_free(ft_encoder *e);

/* Decode a whole frame into `dst`, a caller-provided tensor descriptor
 * whose data buffer must hold the decoded tensor. dst->dtype selects the
 * output: the frame dtype, or (for any float frame) f32/bf16/f16, in which
 * case values are converted (q8/q4 dequantize directly into it). dst's
 * shape is ignored on input and set to the frame's shape; dst->data's
 * capacity is `cap` bytes. The checksum is verified. */
FT_API ft_status ft_decode(ft_codec_ctx *ctx, const void *frame, size_t size,
                           ft_tensor *dst, size_t cap);

/* Verify a whole frame without decoding it, for code that uses the
 * payload in place (q8/q4 weights computed on as stored, raw frames):
 * the header, the chunk table and every chunk's checksum, chunks in
 * parallel on ctx's pool. A compressed lossless chunk (zstd, lz4,
 * deflate, byte-plane) has a checksum over its decoded bytes, so such a
 * frame gives FT_ERR_UNSUPPORTED (decode it). *info (may be NULL) is set
 * on success. */
FT_API ft_status ft_frame_verify(ft_codec_ctx *ctx, const void *frame, size_t size,
                                 ft_frame_info *info);

/* Decode into a newly allocated buffer (free with ft_free_aligned).
 * out_dtype: the frame's dtype if negative (-1). */
FT_API ft_status ft_decode_alloc(ft_codec_ctx *ctx, const void *frame, size_t size,
                                 int out_dtype, ft_tensor *out);

/* Decode only chunk i of a frame (streaming): payload points at the
 * chunk's enc_size bytes; out receives the chunk's elements converted to
 * out_dtype (out_cap bytes available). The chunk hash is verified. Uses
 * worker workspace `worker` of ctx (0 when called from one thread). */
FT_API ft_status ft_decode_chunk(ft_codec_ctx *ctx, const ft_frame_info *info,
                                 const ft_chunk_info *chunk, const void *payload,
                                 ft_dtype out_dtype, void *out, size_t out_cap,
                                 unsigned worker);

/* ------------------------------------------------------ row quantization */

/* The q8/q4 group math without a frame, for data that grows row by row
 * (the KV cache: each new token's K and V rows are quantized once, as
 * they are written, and never re-quantized). n contiguous f32 values in
 * groups of `group` (n % group == 0), groups along the row as FlexGen
 * groups the cache along head_dim. Layout: the groups' fp16 (min, step)
 * pairs (4 bytes each, little endian) then the packed codes, exactly as a
 * frame chunk of one row with group_dim -1 (docs/codec-quant.md), so the
 * error bound is the frame codec's. bits: 8 or 4. */
FT_API size_t ft_qrow_bytes(int bits, size_t n, uint32_t group);
/* FT_ERR_INVALID_ARG for bad sizes or a NaN/Inf value, FT_ERR_UNSUPPORTED
 * for a group whose range does not fit fp16. dst: ft_qrow_bytes bytes. */
FT_API ft_status ft_qrow_encode(int bits, const float *src, size_t n, uint32_t group, void *dst);
/* Decode what ft_qrow_encode wrote (trusted bytes: no validation). */
FT_API void ft_qrow_decode(int bits, const void *src, size_t n, uint32_t group, float *dst);

#ifdef __cplusplus
}
#endif
#endif
