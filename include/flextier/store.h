/*
 * flextier/store.h - write_tensor / read_tensor over a tiered tensor store.
 *
 * A store is opened from a URI:
 *   mem:                this process's memory (a hash table of frames)
 *   file:DIR            one file per tensor in DIR (local SSD tier)
 *   ucx://HOST:PORT     a memory node (`flextier serve`): a TCP connection
 *                       that authenticates (mutual HMAC challenge), then
 *                       data over it, over shared memory (same host and
 *                       user), or over UCX (RDMA; TCP only on a network the
 *                       node's operator named trusted). FLEXTIER_TRANSPORT=
 *                       auto|tcp|cma|ucx forces one (docs/protocol.md)
 *   agent://HOST:PORT[/NODE]  a memory node through a codec agent
 *                       (`flextier agent`, flextier/agent.h): the agent
 *                       encodes and decodes, this process does no codec
 *                       work; same frames and results
 *
 * Every tensor is stored as a self-describing frame (flextier/codec.h):
 * the writer encodes with the caller's codec params (NULL = raw), the
 * reader decodes; metadata (dtype, shape, codec) travels inside the frame.
 * For ucx:// the encoded frame is what crosses the wire, so compression
 * reduces the bytes on the link.
 *
 * Keys: 1..FT_KEY_MAX bytes of printable ASCII without space (0x21..0x7e).
 * '/' is allowed (the file: backend escapes it). Anything else is
 * FT_ERR_INVALID_ARG.
 *
 * Outcomes (beyond FT_ERR_INVALID_ARG for bad arguments):
 *   FT_ERR_NOT_FOUND   no tensor under that key
 *   FT_ERR_CORRUPT     the stored frame failed validation (file: never
 *                      serves a corrupt file; the memory node validates a
 *                      frame's header, which carries every chunk's XXH3,
 *                      before it becomes visible, and every reader checks
 *                      every chunk against it)
 *   FT_ERR_NO_SPACE    the memory node's pool (and spill tier) is full
 *   FT_ERR_AUTH        wrong or missing token, or a node that cannot prove
 *                      it knows the token
 *   FT_ERR_NET         the peer died or the connection broke; the next
 *                      call reconnects
 *   FT_ERR_TIMEOUT     no answer within params.timeout_ms (and nothing
 *                      moving on the connection for as long)
 *   FT_ERR_PROTOCOL    the peer sent something malformed / other version
 *   FT_ERR_IO          file system error (errno in ft_last_error())
 *
 * Thread-safety: an ft_store may be used from any number of threads at
 * once; every function below is thread-safe. Synchronous calls made
 * concurrently from several threads share one codec context and are
 * serialized on it (use the async calls for parallel transfers). Writes
 * to one key are atomic: a reader sees the old or the new tensor, never a
 * mix, and a read in progress keeps the bytes it started with (a lease).
 * ft_store_close must not race with other calls on the same store.
 */
#ifndef FLEXTIER_STORE_H
#define FLEXTIER_STORE_H

#include "flextier/core.h"
#include "flextier/codec.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FT_KEY_MAX 255u

typedef struct ft_store ft_store;

typedef struct ft_store_params {
    const char *token_file;   /* ucx://: file holding the shared secret
                                 (private to its owner: no group/other
                                 permission bits); NULL: FLEXTIER_TOKEN_FILE
                                 from the environment, or no token */
    unsigned    queue_depth;  /* async requests executed concurrently
                                 (worker threads), 1..64, default 4 */
    unsigned    codec_threads;/* threads of the synchronous codec context
                                 (0 = ft_default_threads()) */
    int         timeout_ms;   /* per operation, default 30000 (also
                                 FLEXTIER_TIMEOUT_MS); an operation whose
                                 transfer is still progressing is not cut
                                 off, it times out once it is past this and
                                 the connection was idle this long */
    int         drop_cache;   /* file: drop each frame file's pages from the
                                 page cache once read or written (synced):
                                 under a memory budget the disk tier then
                                 holds no memory (default 0: the kernel
                                 keeps what it likes)                      */
    int         direct_io;    /* file: read frame files past the page cache
                                 (O_DIRECT) into 4 KiB-aligned buffers; an
                                 unaligned buffer or a file system that
                                 refuses it reads through the page cache.
                                 1 on, 0 off, -1 (the default) with
                                 drop_cache. FLEXTIER_DIRECT_IO=0|1 in the
                                 environment sets the default            */
} ft_store_params;

FT_API void ft_store_default_params(ft_store_params *p);

/* Validate a key (see above). */
FT_API ft_status ft_key_validate(const char *key);

/* Open a store. params may be NULL (defaults). For file:DIR the directory
 * is created if missing. For ucx:// this connects and authenticates. */
FT_API ft_status ft_store_open(const char *uri, const ft_store_params *params,
                               ft_store **out);
/* Close; waits for outstanding async requests. NULL ok. */
FT_API void ft_store_close(ft_store *s);

/* Encode `t` with `cp` (NULL = raw) and store it under `key`, replacing
 * any previous tensor atomically. */
FT_API ft_status ft_write_tensor(ft_store *s, const char *key, const ft_tensor *t,
                                 const ft_codec_params *cp);

/* Read into a new buffer (free out->data with ft_free_aligned).
 * out_dtype: -1 = the stored dtype; or f32/bf16/f16 for a float tensor
 * (values converted / dequantized). */
FT_API ft_status ft_read_tensor(ft_store *s, const char *key, int out_dtype,
                                ft_tensor *out);

/* Read into the caller's buffer: dst->dtype selects the output dtype (the
 * stored one, or f32/bf16/f16 for float tensors), dst->data holds `cap`
 * bytes; dst's shape is set from the stored tensor.
 * FT_ERR_BUFFER_SMALL if cap is too small. */
FT_API ft_status ft_read_tensor_into(ft_store *s, const char *key, ft_tensor *dst,
                                     size_t cap);

FT_API ft_status ft_delete_tensor(ft_store *s, const char *key);

typedef struct ft_tensor_stat {
    ft_dtype    dtype;
    uint32_t    ndim;
    int64_t     shape[FT_MAX_DIMS];
    ft_codec_id codec;
    ft_codec_id entropy;
    int         level;
    uint64_t    raw_bytes;     /* tensor bytes in dtype          */
    uint64_t    stored_bytes;  /* frame bytes (what is on wire)  */
} ft_tensor_stat;

FT_API ft_status ft_stat_tensor(ft_store *s, const char *key, ft_tensor_stat *out);

/* All keys (unordered). *keys is an array of *n strings; free with
 * ft_list_free. */
FT_API ft_status ft_list_tensors(ft_store *s, char ***keys, size_t *n);
FT_API void ft_list_free(char **keys, size_t n);

typedef struct ft_store_stats {
    uint64_t capacity;        /* bytes (mem:/file:: 0 = unbounded)    */
    uint64_t used;            /* stored frame bytes in memory/dir     */
    uint64_t tensors;         /* committed tensors (all tiers)        */
    uint64_t connections;     /* memory node: open connections        */
    uint64_t total_connections;
    uint64_t bytes_in;        /* memory node: PUT payload bytes       */
    uint64_t bytes_out;       /* memory node: GET payload bytes       */
    uint64_t spill_capacity;
    uint64_t spill_used;
    uint64_t spilled_tensors;
    uint64_t puts, gets;
} ft_store_stats;

FT_API ft_status ft_store_stats_get(ft_store *s, ft_store_stats *out);

/* Frame-level access (no codec work): put an already encoded frame
 * (validated with ft_frame_parse first) / get a copy of the stored frame
 * (free *frame with ft_free_aligned). */
FT_API ft_status ft_store_put_frame(ft_store *s, const char *key, const void *frame,
                                    size_t size);
FT_API ft_status ft_store_get_frame(ft_store *s, const char *key, void **frame,
                                    size_t *size);

/* ------------------------------------------------------------------ async */

/* Up to params.queue_depth requests execute at once (encode/decode and
 * transfer overlap across requests); more are queued. A request must be
 * freed with ft_request_free (which waits for it if still running).
 * The tensor descriptors and data buffers passed in must stay valid and
 * untouched until the request completes; key and codec params are
 * copied. */
typedef struct ft_request ft_request;

FT_API ft_status ft_write_tensor_async(ft_store *s, const char *key,
                                       const ft_tensor *t, const ft_codec_params *cp,
                                       ft_request **req);
/* Read into dst (as ft_read_tensor_into). If dst->data is NULL the
 * request allocates the buffer in the stored dtype (dst->data is set on
 * success, free it with ft_free_aligned). */
FT_API ft_status ft_read_tensor_async(ft_store *s, const char *key, ft_tensor *dst,
                                      size_t cap, ft_request **req);

/* Read the stored frame itself (no decoding) into the caller's buffer of
 * cap bytes; *size receives the frame's bytes when the request completes.
 * FT_ERR_BUFFER_SMALL if the frame does not fit. The memory node and the
 * file tier check the frame before serving it; a caller computing on the
 * payload in place verifies its chunk checksums (ft_frame_verify). */
FT_API ft_status ft_read_frame_async(ft_store *s, const char *key, void *buf,
                                     size_t cap, size_t *size, ft_request **req);

/* FT_INPROGRESS while running, else the final status. */
FT_API ft_status ft_request_test(ft_request *r);
/* Wait up to timeout_ms (< 0: forever); FT_ERR_TIMEOUT if still running
 * (the request keeps running), else the final status. */
FT_API ft_status ft_request_wait(ft_request *r, int timeout_ms);
/* Waits for completion, then frees. NULL ok. */
FT_API void ft_request_free(ft_request *r);


/* ------------------------------------------------------------ memory node */

/* `flextier serve`: the memory node (src/net/server.c, docs/protocol.md).
 * One pool of `capacity` bytes holds the frames; with a spill directory,
 * least-recently-used tensors move to files there when the pool is full
 * (and come back on GET). Single-threaded event loop. The node is
 * volatile: a restart loses every tensor (spill files are a cache of the
 * pool, removed at start and at exit). Clients connect over TCP to
 * `listen`, authenticate (mutual HMAC challenge-response over the token),
 * then move data over that connection or over UCX (shared memory, RDMA;
 * TCP only with trusted_network). */
typedef struct ft_node_params {
    const char *listen;          /* "HOST:PORT" (default "127.0.0.1:13337";
                                    port 0 = any free port)               */
    uint64_t    capacity;        /* pool bytes (required, > 0; above the
                                    machine's memory only with overcommit) */
    const char *spill_dir;       /* NULL: no spill tier. Must be a directory
                                    of this user with mode 0700           */
    uint64_t    spill_capacity;  /* bytes of spill files allowed          */
    const char *token_file;      /* NULL: no authentication (then listen
                                    must be a loopback address, unless
                                    insecure). Mode 0600, >= 16 bytes      */
    unsigned    max_connections; /* authenticated connections, default 256 */
    /* Polled about every 100 ms; the loop exits cleanly once it is set
     * (e.g. from a SIGTERM handler). */
    volatile int *stop;
    /* Called once listening, with the bound "HOST:PORT". */
    void (*on_ready)(void *arg, const char *bound);
    void *arg;
    /* --- trust boundary (docs/protocol.md, "Trust model") --- */
    int         insecure;        /* allow a non-loopback listen address
                                    without a token                        */
    int         trusted_network; /* let UCX use its TCP transport (it
                                    trusts every peer that can reach it)  */
    int         overcommit;      /* allow capacity above physical memory,
                                    spill capacity above the file system  */
    unsigned    max_unauth;      /* connections still authenticating at
                                    once (default 64)                      */
    int         auth_timeout_ms; /* handshake deadline (default 5000)     */
    int         lease_timeout_ms;/* a reply the client does not take in
                                    this long (plus 1 s per 50 MB) closes
                                    its connection (default 30000)         */
} ft_node_params;

FT_API void ft_node_default_params(ft_node_params *p);
/* Run the memory node until *stop becomes nonzero. Returns FT_OK on a
 * clean shutdown, or the error that prevented it from starting. */
FT_API ft_status ft_node_run(const ft_node_params *p);

#ifdef __cplusplus
}
#endif
#endif
