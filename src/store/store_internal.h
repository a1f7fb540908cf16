/* Internal: the backend interface behind ft_store. Backends move whole
 * frames; the generic layer (store.c) does the codec work. */
#ifndef FT_STORE_INTERNAL_H
#define FT_STORE_INTERNAL_H
#include "flextier/store.h"

/* A growable, reusable buffer. What the store allocates is 4 KiB
 * aligned, its capacity a multiple of 4 KiB (at least 4 KiB): the file
 * backend reads into it with O_DIRECT. */
#define FT_BUF_ALIGN 4096u
typedef struct ft_buf {
    uint8_t *p;
    size_t   cap;
    int      fixed;   /* the caller's memory: never reallocated or freed;
                         reserving more than cap is FT_ERR_BUFFER_SMALL */
} ft_buf;
ft_status ft_buf_reserve(ft_buf *b, size_t n);   /* keeps no contents */
void      ft_buf_free(ft_buf *b);

typedef struct ft_store_backend ft_store_backend;
typedef struct ft_store_ops {
    /* frame already validated by the caller (ft_frame_parse, size match) */
    ft_status (*put)(ft_store_backend *b, const char *key, const void *frame,
                     size_t size);
    /* copy of the frame into out (grown as needed), *size = frame bytes */
    ft_status (*get)(ft_store_backend *b, const char *key, ft_buf *out,
                     size_t *size);
    ft_status (*del)(ft_store_backend *b, const char *key);
    /* info parsed from the frame header; info->frame_size = stored bytes */
    ft_status (*stat)(ft_store_backend *b, const char *key, ft_frame_info *info);
    ft_status (*list)(ft_store_backend *b, char ***keys, size_t *n);
    ft_status (*stats)(ft_store_backend *b, ft_store_stats *out);
    void      (*close)(ft_store_backend *b);
    /* Optional (NULL: get + ft_decode): fetch and decode in one go, e.g.
     * decoding chunks while later parts of the frame are still in flight.
     * alloc: allocate dst->data in dtype alloc_dtype (< 0: stored dtype);
     * else decode into dst->data (cap bytes) as dst->dtype. scratch is a
     * reusable frame buffer. */
    ft_status (*read)(ft_store_backend *b, const char *key, ft_codec_ctx *cc,
                      ft_buf *scratch, ft_tensor *dst, size_t cap, int alloc,
                      int alloc_dtype);
    /* Optional (NULL: ft_encode + put): encode and store in one go, e.g.
     * sending each run of chunks while the next is being encoded (ucx://),
     * or the backend doing the encoding elsewhere (agent://: the codec
     * agent encodes; cc and scratch unused). scratch is a reusable buffer;
     * cp is never NULL; the key is validated. */
    ft_status (*write)(ft_store_backend *b, const char *key, ft_codec_ctx *cc,
                       ft_buf *scratch, const ft_tensor *t, const ft_codec_params *cp);
} ft_store_ops;

struct ft_store_backend {
    const ft_store_ops *ops;
};

/* URI schemes. Each backend file defines the scheme it serves (its open
 * function gets the URI after the prefix); backends.c lists them in
 * ft_store_schemes, which ft_store_open searches. store.c names no
 * backend: the ucx:// and agent:// clients depend on net's message layer
 * (src/net), and only this table links them in, so nothing in the store's
 * generic layer - and nothing in net - depends on the other direction. */
typedef struct ft_store_scheme {
    const char *prefix;   /* "ucx://": the URI starts with it              */
    const char *alias;    /* a whole URI meaning prefix alone ("mem"), or NULL */
    const char *usage;    /* "ucx://HOST:PORT", for the unknown-URI error   */
    ft_status (*open)(const char *spec, const ft_store_params *p, ft_store_backend **out);
} ft_store_scheme;

extern const ft_store_scheme ft_store_scheme_mem;    /* mem.c: mem:                       */
extern const ft_store_scheme ft_store_scheme_file;   /* file.c: file:DIR                  */
/* ucx_client.c: ucx://HOST:PORT, a client of the memory node (src/net) */
extern const ft_store_scheme ft_store_scheme_ucx;
/* agent_client.c: agent://HOST:PORT[/NODE], a client of the codec agent
 * over net/agent_msg.h */
extern const ft_store_scheme ft_store_scheme_agent;
/* backends.c: the schemes above, NULL-terminated */
extern const ft_store_scheme *const ft_store_schemes[];
/* The scheme of uri and (*spec) what follows its prefix; NULL if none. */
const ft_store_scheme *ft_store_scheme_find(const char *uri, const char **spec);

/* Key escaping for file names: [A-Za-z0-9_-] kept, everything else %XX,
 * a leading '.' escaped too. FT_ERR_INVALID_ARG if it does not fit. */
ft_status ft_key_escape(const char *key, char *out, size_t cap);
ft_status ft_key_unescape(const char *name, size_t len, char *out, size_t cap);

/* Lists under construction (mem:, file:): core/keylist.h. */
#include "core/keylist.h"
#endif
