/* The offloading scheduler: layer weights streamed through the tiers of a
 * policy with a prefetching I/O thread and two slot buffers, in the
 * format the engine computes on (docs/offload.md).
 *
 * Every layer tensor has a compute format (the model's: f32/bf16/f16, or
 * q8/q4 frames) and a stored frame on its tier:
 *   - device: the tensor as computed on, resident (a q8/q4 frame or the
 *     plain array); its view is fixed.
 *   - host: the frame kept in this process's memory. q8/q4 and raw
 *     frames are computed on in place (no copy, no decode); byte-plane
 *     frames are decoded into a slot buffer on every use.
 *   - disk / remote: the frame is read into a slot buffer, its chunk
 *     checksums verified, then computed on in place (q8/q4, raw) or
 *     decoded next to it (byte-plane).
 * The I/O thread verifies and decodes on a codec context of
 * decode_threads threads. */
#include "flextier/offload.h"
#include "flextier/model.h"
#include "offload_internal.h"
#include "replica.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Slots per layer: the fixed ones and, for a mixture of experts, 3 per
 * expert (o->ns of them; a dense layer of an MoE model lacks the expert
 * slots: o->lpres says which (layer, slot) exist). */
#define MAX_PIECES FT_MAX_REMOTES
#define LW_ROUTER_SLOT FT_LAYER_SLOT_ROUTER   /* ft_layer_weights.w_router */
/* A remote frame is striped over the memory nodes in pieces of at least
 * this many bytes (smaller tensors go whole to one node). */
#define PIECE_MIN (64u << 10)
/* Streamed frames from this size on are placed for O_DIRECT reads
 * (ft_offload_params.direct_min 0), at this alignment. */
#define DIO_MIN ((uint64_t)1 << 20)
#define DIO_ALIGN 4096u

/* How a tensor of a slot reaches the compute. */
enum { USE_RESIDENT = 0,   /* device tier                                   */
       USE_HOST_INPLACE,   /* host frame computed on in place               */
       USE_FETCH,          /* read (disk/remote) or decode (host byte-plane) */
       USE_EXPERT,         /* an expert's matrix read on demand into the expert cache */
};

typedef struct {
    int present, matrix;
    ft_tier tier;
    int use;
    ft_wfmt fmt;                      /* compute format                   */
    ft_dtype pdt;                     /* plain formats: element dtype     */
    ft_codec_id codec;                /* stored frame's codec             */
    int rows, cols;                   /* matrix; vectors: 1 x n           */
    size_t numel;
    uint64_t compute_bytes;           /* the tensor as computed on        */
    uint64_t src_bytes;               /* in the checkpoint dtype          */
    uint64_t frame_cap;               /* largest stored frame (streamed)  */
    uint32_t n_chunks;                /* q8/q4 frames                     */
    size_t res_off;                   /* device tier: offset in a resident block */
    size_t frame_off, dec_off;        /* fetched: offsets in a slot buffer */
    size_t tab_off;                   /* q8/q4: its chunk pointers in a layer's table */
    int np;                           /* remote tier: pieces its frame is striped in */
} slot_info;

/* One read of the remote tier in flight: piece k of (layer, slot). */
typedef struct {
    ft_request *req;
    int node;
    size_t got;
    ft_tensor dst;
    int retry;
} remote_read;

/* The reads of one tensor into a buffer: from disk (req, got bytes) or
 * the remote tier (pieces rr[0, started)); started 1 for a disk read. */
typedef struct {
    ft_request *req;
    size_t got;
    int started;
    remote_read rr[MAX_PIECES];
} tensor_read;

/* A slot buffer's reads (the I/O thread's): a layer's, from fetch_issue
 * until fetch_complete. */
typedef struct {
    tensor_read *rd;                  /* [ns] */
    int layer;                        /* the layer issued, -1 none         */
    ft_status st;                     /* how issuing it went               */
    char err[256];                    /* and its message                   */
} fetch_buf;

/* An entry of the expert cache: one expert's streamed matrices. */
enum { X_FREE = 0, X_LOADING, X_READY };
typedef struct {
    int layer, e, state, pinned, prefetched;
    uint64_t tick;
    uint32_t freq;
    tensor_read rd[3];
    ft_wmat view[3];
} x_entry;

struct ft_offload {
    ft_model *m;
    int n_layers;
    int lb, le;                       /* the layers held: [lb, le)        */
    ft_offload_params p;
    size_t res_stride;                /* bytes of a layer's resident block */
    size_t slot_stride;               /* bytes of one slot buffer          */
    int ns;                           /* slots per layer                   */
    slot_info *slot;                  /* [ns]: the layout (from the first layer holding each slot) */
    uint8_t *lpres;                   /* [n_layers][ns]: the tensor exists */
    int n_experts;
    ft_wmat *fexp, *sexp[2], *hexp;   /* experts' views: fixed [n_layers][3E], slot buffers, the hook's */
    fetch_buf fb[2];                  /* the reads issued into each slot buffer */
    int n_fetched;                    /* slots fetched per layer           */
    /* experts streamed one by one (USE_EXPERT slots) */
    int xmode;
    size_t xstride;                   /* one cache entry: its frames (+ byte-plane decoded) */
    uint32_t xchunks;                 /* chunk pointers per entry          */
    int xcap;
    x_entry *xe;
    int *xmap;                        /* [n_layers][E]: entry or -1        */
    uint8_t *xbuf;
    const uint8_t **xchunk_tab;
    uint64_t xtick;
    int xcur;                         /* the layer of the current call     */
    int xsparse;                      /* sparse layers held: calls per step */
    ft_codec_ctx *x_cc;               /* the compute thread's verify / decode */
    ft_layer_weights xtw;             /* binding scratch (experts: xscr)   */
    ft_wmat *xscr;
    float *xrouter, *xlog;            /* prediction: router rows, logits   */
    size_t xlog_cap;
    int *xpred, *xnpred;              /* [n_layers][E], [n_layers]         */
    ft_expert_stats *xst;             /* [n_layers]                        */
    /* stores */
    ft_store *disk, *remote[FT_MAX_REMOTES];
    int agent_remote;                 /* the remotes are codec agents (agent://) */
    int n_remote, replicas;
    ft_rset *rset;                    /* failover and re-replication      */
    /* per (layer, slot) */
    char (*keys)[112];
    ft_store **stores;
    uint64_t *wire;                   /* stored frame bytes               */
    uint8_t **host;                   /* host tier: the frame in DRAM      */
    uint8_t *resident;                /* n_layers x res_stride             */
    ft_layer_weights *fixed;          /* per layer: resident + host in-place views */
    const uint8_t **fixed_chunks;     /* their chunk pointers              */
    uint8_t *slots[2];                /* streaming buffers, one layer each */
    ft_layer_weights slot_w[2];       /* views of what slots[k] holds      */
    const uint8_t **slot_chunks[2];
    int slot_layer[2];                /* layer held by slots[k], -1 none  */
    ft_codec_ctx *io_cc;              /* verify / decode                   */
    /* I/O thread */
    pthread_t io;
    int io_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int want_layer, want_buf;         /* job: -1 none */
    int busy_layer, busy_buf;         /* being fetched, -1 none */
    int err_layer;                    /* fetch that failed, -1 none */
    ft_status err_status;
    char err_msg[256];
    int stop;
    ft_offload_stats st;
};

void ft_offload_default_params(ft_offload_params *p)
{
    memset(p, 0, sizeof *p);
    ft_policy_default(&p->policy);
    p->group_size = FT_DEFAULT_GROUP_SIZE;
    p->group_dim = -1;
    p->decode_threads = 1;
    p->failover_ms = 1000;
}

static ft_status open_store(const char *uri, const ft_offload_params *p, int failover, ft_store **out)
{
    ft_store_params sp;
    ft_store_default_params(&sp);
    sp.token_file = p->token_file;
    sp.codec_threads = 1;
    sp.queue_depth = FT_SCHED_READERS;   /* a layer's tensors are read at once */
    sp.drop_cache = p->drop_cache;
    /* with replicas a node whose link went silent is given up on after
     * failover_ms without a byte moving (then a replica serves) */
    if (failover) sp.timeout_ms = p->failover_ms > 0 ? (int)p->failover_ms : 1000;
    ft_status st = ft_store_open(uri, &sp, out);
    if (st) return ft_set_error(st, "offload: cannot open %s: %s", uri, ft_last_error());
    return FT_OK;
}


static int is_q(ft_wfmt f) { return f == FT_WF_Q8 || f == FT_WF_Q4; }

/* The stored frame's codec params for a slot's tensor, given the source
 * dtype it is encoded from (q8/q4 encode from the source; plain formats
 * from the tensor already converted to the compute dtype). */
static ft_status slot_codec(const ft_offload *o, const slot_info *si, ft_dtype src_dt, ft_codec_params *cp)
{
    if (is_q(si->fmt))
        return ft_wmat_codec_params(si->fmt == FT_WF_Q8 ? 8 : 4, src_dt, si->rows, si->cols, cp);
    ft_codec_default_params(cp);
    cp->codec = si->codec;
    cp->entropy = FT_CODEC_ZSTD;
    (void)o;
    return FT_OK;
}

/* Content-addressed key: hash of the source bytes, dtype and shape, plus
 * what the frame holds (format, codec, chunking). */
static void make_key(const ft_tensor *src, uint64_t nbytes, const slot_info *si, const ft_codec_params *cp,
                     char *key, size_t n)
{
    uint64_t seed = ((uint64_t)src->dtype << 56) ^ ((uint64_t)src->ndim << 48);
    for (uint32_t i = 0; i < src->ndim; i++) seed = seed * 1000003u ^ (uint64_t)src->shape[i];
    uint64_t h = ft_xxh3_seed(src->data, (size_t)nbytes, seed);
    if (is_q(si->fmt))
        snprintf(key, n, "w-%016llx-%s-g%u-c%u", (unsigned long long)h, ft_codec_name(cp->codec),
                 cp->group_size, cp->chunk_size);
    else if (cp->codec == FT_CODEC_BYTEPLANE)
        snprintf(key, n, "w-%016llx-bp-%s-%s", (unsigned long long)h, ft_codec_name(cp->entropy),
                 ft_dtype_name(si->pdt));
    else
        snprintf(key, n, "w-%016llx-%s-%s", (unsigned long long)h, ft_codec_name(cp->codec),
                 ft_dtype_name(si->pdt));
}

/* ------------------------------------------------------- tensor views */

/* The data of a raw frame (chunks stored and contiguous) of the expected
 * dtype and size. */
static ft_status raw_payload(const uint8_t *frame, size_t size, ft_dtype dt, size_t numel, const void **out)
{
    ft_frame_info fi;
    ft_status st = ft_frame_parse(frame, size, &fi);
    if (st) return st;
    if (fi.codec != FT_CODEC_RAW || fi.dtype != dt || fi.numel != numel || fi.frame_size != size ||
        fi.frame_size - fi.header_size != ft_dtype_nbytes(dt, numel))
        return ft_set_error(FT_ERR_CORRUPT, "weight frame: not a raw %s tensor of %zu elements",
                            ft_dtype_name(dt), numel);
    *out = frame + fi.header_size;
    return FT_OK;
}

/* Point slot s of w at a tensor: `data` is the plain array, or the q8/q4
 * frame of `size` bytes (chunk pointers into `chunks`). */
static ft_status bind_view(const slot_info *si, int s, ft_layer_weights *w, const uint8_t *data, size_t size,
                           const uint8_t **chunks)
{
    if (!si->matrix) {
        *ft_layer_weights_vec(w, s) = (const float *)(const void *)data;
        return FT_OK;
    }
    ft_wmat *wm = ft_layer_weights_mat(w, s);
    if (is_q(si->fmt)) {
        ft_status st = ft_wmat_from_frame(data, size, wm, chunks, si->n_chunks);
        if (st) return st;
        if (wm->fmt != si->fmt || wm->rows != si->rows || wm->cols != si->cols)
            return ft_set_error(FT_ERR_CORRUPT, "weight frame: %s %d x %d where %s %d x %d was stored",
                                ft_wfmt_name(wm->fmt), wm->rows, wm->cols, ft_wfmt_name(si->fmt), si->rows, si->cols);
        return FT_OK;
    }
    memset(wm, 0, sizeof *wm);
    wm->fmt = si->fmt;
    wm->rows = si->rows;
    wm->cols = si->cols;
    wm->data = data;
    return FT_OK;
}

/* A stored frame (in DRAM, verified or trusted) made usable for compute:
 * in place, or decoded to `dec` (byte-plane). */
static ft_status use_frame_cc(ft_codec_ctx *cc, const slot_info *si, int s, ft_layer_weights *w,
                              const uint8_t *frame, size_t size, uint8_t *dec, const uint8_t **chunks)
{
    if (si->codec == FT_CODEC_BYTEPLANE) {
        ft_tensor t;
        memset(&t, 0, sizeof t);
        t.dtype = si->pdt;
        t.data = dec;
        ft_status st = ft_decode(cc, frame, size, &t, (size_t)si->compute_bytes);
        if (st) return st;
        uint64_t ne = 0;
        if (ft_tensor_numel(&t, &ne) || ne != si->numel)
            return ft_set_error(FT_ERR_CORRUPT, "weight frame: %llu elements, expected %zu",
                                (unsigned long long)ne, si->numel);
        return bind_view(si, s, w, dec, (size_t)si->compute_bytes, chunks);
    }
    if (is_q(si->fmt)) return bind_view(si, s, w, frame, size, chunks);
    const void *p = NULL;
    ft_status st = raw_payload(frame, size, si->pdt, si->numel, &p);
    return st ? st : bind_view(si, s, w, p, (size_t)si->compute_bytes, chunks);
}

static ft_status use_frame(ft_offload *o, const slot_info *si, int s, ft_layer_weights *w, const uint8_t *frame,
                           size_t size, uint8_t *dec, const uint8_t **chunks)
{
    return use_frame_cc(o->io_cc, si, s, w, frame, size, dec, chunks);
}

/* ------------------------------------------------------------ I/O thread */

/* A byte-plane tensor behind a codec agent: the agent decodes it (that is
 * what it is for), so it is read as a tensor straight into the slot's
 * decode area. */
static int agent_decodes(const ft_offload *o, const slot_info *si)
{
    return o->agent_remote && si->tier == FT_TIER_REMOTE && si->codec == FT_CODEC_BYTEPLANE;
}

/* ------------------------------------------------- the remote tier */

/* Node of replica j of an object placed at base (replica.h's rule). */
static int rnode(const ft_offload *o, uint32_t base, int j)
{
    return (int)((base + (uint32_t)j) % (uint32_t)o->n_remote);
}

/* Piece k of np of a frame of `size` bytes: [off, off + len). */
static void piece_span(uint64_t size, int np, int k, uint64_t *off, uint64_t *len)
{
    uint64_t a = size * (uint64_t)k / (uint64_t)np, e = size * (uint64_t)(k + 1) / (uint64_t)np;
    *off = a;
    *len = e - a;
}

static void piece_key(const char *key, int k, int np, char *out, size_t n)
{
    if (np == 1) snprintf(out, n, "%s", key);
    else snprintf(out, n, "%s.p%dof%d", key, k, np);
}

/* How many pieces a remote tensor's frame is striped in: one per node so
 * that N links carry a layer together (each node serves 1/N of every
 * tensor), unless the pieces would be small; whole frames through codec
 * agents (they decode byte-plane frames themselves). */
static int n_pieces(const ft_offload *o, const slot_info *si)
{
    if (si->tier != FT_TIER_REMOTE || o->agent_remote || o->n_remote < 2) return 1;
    uint64_t min = o->p.stripe_min ? o->p.stripe_min : PIECE_MIN;
    int np = o->n_remote;
    while (np > 1 && si->compute_bytes / (uint64_t)np < min) np--;
    return np;
}


/* Start reading piece k of (layer, s) into buffer buf from the first live
 * replica (not `avoid`). */
static ft_status issue_remote(ft_offload *o, int layer, int s, int k, uint8_t *buf, remote_read *rr, int avoid)
{
    const slot_info *si = &o->slot[s];
    size_t idx = (size_t)layer * (size_t)o->ns + (size_t)s;
    uint32_t base = (uint32_t)(layer + s + k);
    int node = o->rset ? ft_rset_pick(o->rset, base, avoid) : rnode(o, base, 0);
    if (node < 0)
        return ft_set_error(FT_ERR_NET, "layer %d: no live memory node holds a replica of %s", layer, o->keys[idx]);
    rr->node = node;
    rr->req = NULL;
    memset(&rr->dst, 0, sizeof rr->dst);
    ft_store *store = o->remote[node];
    if (si->np == 1 && agent_decodes(o, si)) {
        rr->dst.dtype = si->pdt;
        rr->dst.data = buf + si->dec_off;
        return ft_read_tensor_async(store, o->keys[idx], &rr->dst, (size_t)si->compute_bytes, &rr->req);
    }
    if (si->np == 1)
        return ft_read_frame_async(store, o->keys[idx], buf + si->frame_off, (size_t)si->frame_cap, &rr->got,
                                   &rr->req);
    /* a piece: stored as a raw byte tensor, read in place into its part of
     * the frame (the frame's own chunk checksums are verified below) */
    uint64_t off, len;
    char pk[160];
    piece_span(o->wire[idx], si->np, k, &off, &len);
    piece_key(o->keys[idx], k, si->np, pk, sizeof pk);
    rr->dst.dtype = FT_U8;
    rr->dst.data = buf + si->frame_off + off;
    rr->got = (size_t)len;
    return ft_read_tensor_async(store, pk, &rr->dst, (size_t)len, &rr->req);
}

/* Wait for a remote read; check a piece's size. */
static ft_status finish_remote(ft_offload *o, const slot_info *si, remote_read *rr)
{
    ft_status r = ft_request_wait(rr->req, -1);
    ft_request_free(rr->req);
    rr->req = NULL;
    if (r == FT_OK && si->np > 1) {
        uint64_t ne = 0;
        if (ft_tensor_numel(&rr->dst, &ne) || ne != rr->got)
            r = ft_set_error(FT_ERR_CORRUPT, "a piece of %zu bytes arrived as %llu", rr->got, (unsigned long long)ne);
    }
    (void)o;
    return r;
}

/* Start every read of a layer's fetched tensors into buffer b: from disk
 * and memory nodes all at once (asynchronous, so the link never idles
 * between tensors and nodes move in parallel; a remote frame comes in
 * pieces from every node). fetch_complete waits for them. */
static ft_status fetch_issue(ft_offload *o, int layer, int b)
{
    fetch_buf *fb = &o->fb[b];
    const uint8_t *lp = o->lpres + (size_t)layer * (size_t)o->ns;
    uint8_t *buf = o->slots[b];
    ft_status st = FT_OK;
    memset(fb->rd, 0, (size_t)o->ns * sizeof *fb->rd);
    for (int s = 0; s < o->ns && st == FT_OK; s++) {
        slot_info *si = &o->slot[s];
        tensor_read *rd = &fb->rd[s];
        if (!si->present || !lp[s] || si->use != USE_FETCH || si->tier == FT_TIER_HOST) continue;
        size_t idx = (size_t)layer * (size_t)o->ns + (size_t)s;
        if (si->tier == FT_TIER_REMOTE) {
            for (int k = 0; k < si->np && st == FT_OK; k++) {
                st = issue_remote(o, layer, s, k, buf, &rd->rr[k], -1);
                if (st == FT_OK) rd->started = k + 1;
            }
        } else {
            st = ft_read_frame_async(o->disk, o->keys[idx], buf + si->frame_off, (size_t)si->frame_cap, &rd->got,
                                     &rd->req);
            if (st == FT_OK) rd->started = 1;
        }
        if (st) st = ft_set_error(st, "layer %d: reading %s from the %s tier: %s", layer, o->keys[idx],
                                  ft_tier_name(si->tier), ft_last_error());
    }
    fb->layer = layer;
    fb->st = st;
    if (st) snprintf(fb->err, sizeof fb->err, "%s", ft_last_error());
    return st;
}

/* Wait for (and free) every read still issued into buffer b. */
static void fetch_drain(ft_offload *o, int b)
{
    fetch_buf *fb = &o->fb[b];
    if (fb->layer < 0) return;
    for (int s = 0; s < o->ns; s++) {
        tensor_read *rd = &fb->rd[s];
        ft_request_free(rd->req);
        rd->req = NULL;
        for (int k = 0; k < MAX_PIECES; k++) {
            ft_request_free(rd->rr[k].req);
            rd->rr[k].req = NULL;
        }
    }
    fb->layer = -1;
}

/* Have all disk reads into buffer b from slot `from` on arrived? */
static int reads_done(ft_offload *o, int b, int from)
{
    for (int s = from; s < o->ns; s++)
        if (o->fb[b].rd[s].req && ft_request_test(o->fb[b].rd[s].req) == FT_INPROGRESS) return 0;
    return 1;
}

/* Once buffer b's reads are all in: issue the next queued layer's reads
 * into the other buffer (its tensors were computed: the caller queued it),
 * so the disk and links stay busy while b's last frames are verified or
 * decoded. */
static void issue_ahead(ft_offload *o, int b)
{
    pthread_mutex_lock(&o->mu);
    int layer = o->want_layer, nb = o->want_buf;
    pthread_mutex_unlock(&o->mu);
    if (layer < 0 || nb == b || o->fb[nb].layer >= 0) return;
    (void)fetch_issue(o, layer, nb);
}

/* Make every fetched tensor of a layer present in buffer b, its reads
 * issued (fetch_issue): wait for them, then verify or decode each on the
 * I/O codec context as it arrives. A remote read that fails on a node
 * with replicas elsewhere is issued again there (all such reads at once),
 * and the node is left to the repair thread. When every read has arrived,
 * the next queued layer's reads are issued (issue_ahead) before the last
 * frames are verified or decoded. */
static ft_status fetch_complete(ft_offload *o, int layer, int b, uint64_t *logical, uint64_t *wire, uint64_t *source,
                                uint64_t *retries)
{
    const int NS = o->ns;
    fetch_buf *fb = &o->fb[b];
    const uint8_t *lp = o->lpres + (size_t)layer * (size_t)NS;
    uint8_t *buf = o->slots[b];
    ft_status st = fb->st;
    if (st) ft_set_error(st, "%s", fb->err);
    int ahead = 0;
    /* Remote reads: wait for all; reissue the failed ones on replicas, all
     * at once, until each has succeeded or no replica is left. */
    for (int round = 0;; round++) {
        int again = 0;
        for (int s = 0; s < NS; s++) {
            slot_info *si = &o->slot[s];
            if (!si->present || !lp[s] || si->use != USE_FETCH || si->tier != FT_TIER_REMOTE) continue;
            size_t idx = (size_t)layer * (size_t)o->ns + (size_t)s;
            tensor_read *rd = &fb->rd[s];
            for (int k = 0; k < rd->started; k++) {
                remote_read *q = &rd->rr[k];
                q->retry = 0;
                if (!q->req) continue;
                if (st) {   /* failed already: only wait (the first error's message stays) */
                    ft_request_free(q->req);
                    q->req = NULL;
                    continue;
                }
                ft_status r = finish_remote(o, si, q);
                if (r == FT_OK) continue;
                if (st == FT_OK && round < o->replicas && ft_rset_failed(o->rset, q->node, r)) {
                    q->retry = 1;
                    again = 1;
                    continue;
                }
                if (st == FT_OK)
                    st = ft_set_error(r, "layer %d: reading %s from the %s tier: %s", layer, o->keys[idx],
                                      ft_tier_name(si->tier), ft_last_error());
            }
        }
        if (!again) break;
        for (int s = 0; s < NS; s++)
            for (int k = 0; k < fb->rd[s].started; k++) {
                remote_read *q = &fb->rd[s].rr[k];
                if (!q->retry) continue;
                ft_status r = st ? st : issue_remote(o, layer, s, k, buf, q, q->node);
                if (r == FT_OK) {
                    (*retries)++;
                } else if (st == FT_OK) {
                    st = ft_set_error(r, "layer %d: %s", layer, ft_last_error());
                }
            }
    }
    /* the remote reads are in: the disk's too (or none)? */
    if (!st && reads_done(o, b, 0)) {
        issue_ahead(o, b);
        ahead = 1;
    }
    for (int s = 0; s < NS; s++) {
        slot_info *si = &o->slot[s];
        if (!si->present || !lp[s] || si->use != USE_FETCH) continue;
        size_t idx = (size_t)layer * (size_t)o->ns + (size_t)s;
        tensor_read *rd = &fb->rd[s];
        const uint8_t *frame;
        size_t size;
        if (si->tier == FT_TIER_HOST) {
            frame = o->host[idx];
            size = (size_t)o->wire[idx];
        } else if (si->tier == FT_TIER_REMOTE) {
            if (st || rd->started < si->np) continue;
            if (si->np == 1 && agent_decodes(o, si)) {   /* decoded (and checked) by the agent */
                uint64_t ne = 0;
                ft_status r;
                if (ft_tensor_numel(&rd->rr[0].dst, &ne) || ne != si->numel)
                    st = ft_set_error(FT_ERR_CORRUPT, "layer %d: %s has the wrong shape", layer, o->keys[idx]);
                else if ((r = bind_view(si, s, &o->slot_w[b], buf + si->dec_off, (size_t)si->compute_bytes,
                                        o->slot_chunks[b] + si->tab_off)))
                    st = r;
                logical[si->tier] += si->compute_bytes;
                wire[si->tier] += o->wire[idx];
                continue;
            }
            frame = buf + si->frame_off;
            size = si->np == 1 ? rd->rr[0].got : (size_t)o->wire[idx];
        } else {
            if (!rd->req) continue;   /* not started: an earlier submit failed */
            if (st) {   /* failed already: only wait (the first error's message stays) */
                ft_request_free(rd->req);
                rd->req = NULL;
                continue;
            }
            if (!ahead && reads_done(o, b, s)) {
                issue_ahead(o, b);
                ahead = 1;
            }
            ft_status r = ft_request_wait(rd->req, -1);
            ft_request_free(rd->req);
            rd->req = NULL;
            if (r) {
                if (st == FT_OK)
                    st = ft_set_error(r, "layer %d: reading %s from the %s tier: %s", layer, o->keys[idx],
                                      ft_tier_name(si->tier), ft_last_error());
                continue;
            }
            frame = buf + si->frame_off;
            size = rd->got;
        }
        if (st) continue;
        ft_status r;
        /* in-place use trusts nothing it has not checked */
        if (si->tier != FT_TIER_HOST && si->codec != FT_CODEC_BYTEPLANE &&
            (r = ft_frame_verify(o->io_cc, frame, size, NULL))) {
            st = ft_set_error(r, "layer %d: %s from the %s tier: %s", layer, o->keys[idx], ft_tier_name(si->tier),
                              ft_last_error());
            continue;
        }
        r = use_frame(o, si, s, &o->slot_w[b], frame, size, buf + si->dec_off, o->slot_chunks[b] + si->tab_off);
        if (r) {
            st = ft_set_error(r, "layer %d: %s (%s tier): %s", layer, o->keys[idx], ft_tier_name(si->tier),
                              ft_last_error());
            continue;
        }
        logical[si->tier] += si->compute_bytes;
        source[si->tier] += si->src_bytes;
        wire[si->tier] += size;
    }
    fetch_drain(o, b);
    return st;
}

static void *io_main(void *arg)
{
    ft_offload *o = arg;
    pthread_mutex_lock(&o->mu);
    for (;;) {
        while (!o->stop && o->want_layer < 0) pthread_cond_wait(&o->cv, &o->mu);
        if (o->stop) break;
        int layer = o->want_layer, b = o->want_buf;
        o->want_layer = -1;
        o->busy_layer = layer;
        o->busy_buf = b;
        pthread_mutex_unlock(&o->mu);
        uint64_t logical[FT_TIER_COUNT] = {0}, wire[FT_TIER_COUNT] = {0}, source[FT_TIER_COUNT] = {0}, retries = 0;
        int degraded = o->rset && ft_rset_up_count(o->rset) < o->n_remote;   /* a node is down already */
        double t0 = ft_now();
        ft_clear_error();
        if (o->fb[b].layer != layer) {   /* not issued ahead */
            fetch_drain(o, b);
            (void)fetch_issue(o, layer, b);
        }
        ft_status st = fetch_complete(o, layer, b, logical, wire, source, &retries);
        double dt = ft_now() - t0;
        pthread_mutex_lock(&o->mu);
        for (int t = 0; t < FT_TIER_COUNT; t++) {
            o->st.logical_bytes[t] += logical[t];
            o->st.wire_bytes[t] += wire[t];
            o->st.source_bytes[t] += source[t];
        }
        o->st.io_busy_s += dt;
        o->st.layers_fetched++;
        o->st.retries += retries;
        if (retries && dt > o->st.failover_fetch_s) o->st.failover_fetch_s = dt;
        if (degraded && !retries) {
            o->st.degraded_fetch_s += dt;
            o->st.degraded_fetches++;
        }
        o->busy_layer = -1;
        if (st == FT_OK) {
            o->slot_layer[b] = layer;
        } else {
            o->err_layer = layer;
            o->err_status = st;
            snprintf(o->err_msg, sizeof o->err_msg, "%s", ft_last_error());
        }
        pthread_cond_broadcast(&o->cv);
    }
    pthread_mutex_unlock(&o->mu);
    /* a layer issued ahead that no one will take */
    fetch_drain(o, 0);
    fetch_drain(o, 1);
    return NULL;
}

/* Queue layer into buffer b (caller holds mu; the I/O thread is idle or
 * busy with another buffer). */
static void request(ft_offload *o, int layer, int b)
{
    o->want_layer = layer;
    o->want_buf = b;
    o->slot_layer[b] = -1;
    pthread_cond_broadcast(&o->cv);
}

static int pending(const ft_offload *o, int layer)
{
    return o->want_layer == layer || o->busy_layer == layer;
}

static ft_status x_fetch(void *user, int layer, const int *ex, int n, const float *x, int rows, ft_layer_weights *w);

ft_status ft_offload_hook(void *arg, int layer, ft_layer_weights *w)
{
    ft_offload *o = arg;
    if (!o || layer < 0 || layer >= o->n_layers) return FT_ERR_INVALID_ARG;
    /* the engine walks the layers upwards, then starts the next step */
    return ft_offload_fetch(o, layer, layer + 1 < o->le ? layer + 1 : o->lb, w);
}

ft_status ft_offload_fetch(void *arg, int layer, int next, ft_layer_weights *w)
{
    ft_offload *o = arg;
    if (!o || !w || layer < 0 || layer >= o->n_layers)
        return ft_set_error(FT_ERR_INVALID_ARG, "offload: fetch of layer %d: bad argument", layer);
    if (next >= 0 && (next < o->lb || next >= o->le))
        return ft_set_error(FT_ERR_INVALID_ARG, "offload: read-ahead of layer %d outside the layers held [%d, %d)",
                            next, o->lb, o->le);
    if (layer < o->lb || layer >= o->le)
        return ft_set_error(FT_ERR_INVALID_ARG, "offload: layer %d asked of a scheduler that holds layers [%d, %d)",
                            layer, o->lb, o->le);
    *w = o->fixed[layer];
    if (w->experts) {   /* the hook's own copy: streamed views never go into the fixed table */
        memcpy(o->hexp, w->experts, (size_t)w->n_experts * 3 * sizeof *o->hexp);
        w->experts = o->hexp;
        if (o->xmode) {
            w->fetch_experts = x_fetch;
            w->fetch_user = o;
        }
    }
    if (!o->n_fetched) return FT_OK;
    double t0 = ft_now();
    pthread_mutex_lock(&o->mu);
    int b = -1;
    for (;;) {
        for (int k = 0; k < 2; k++) if (o->slot_layer[k] == layer) b = k;
        if (b >= 0) break;
        if (o->err_layer == layer) {
            ft_status st = o->err_status;
            char msg[256];
            snprintf(msg, sizeof msg, "%s", o->err_msg);
            o->err_layer = -1;
            pthread_mutex_unlock(&o->mu);
            return ft_set_error(st, "%s", msg);
        }
        if (!pending(o, layer) && o->want_layer < 0 && o->busy_layer < 0) {
            /* Not prefetched (first layer of a run): any buffer is free,
             * since the previous layer has been computed. */
            int nb = o->slot_layer[0] < 0 ? 0 : o->slot_layer[1] < 0 ? 1 : (layer & 1);
            request(o, layer, nb);
        }
        /* Being fetched: queue the next layer into the other buffer now
         * (its layer has been computed), so that the I/O thread goes on
         * to it - and issues its reads once this layer's are in - without
         * waiting for this thread to wake up. */
        if (o->busy_layer == layer && next >= 0 && next != layer && o->want_layer < 0 &&
            o->slot_layer[1 - o->busy_buf] != next)
            request(o, next, 1 - o->busy_buf);
        pthread_cond_wait(&o->cv, &o->mu);
    }
    /* Prefetch the next layer (the caller's direction of travel: the
     * engine's next layer, wrapping to the first one for the next step;
     * a backward pass's layer below) into the other buffer, whose layer
     * has been computed. */
    if (next >= 0 && next != layer && o->slot_layer[1 - b] != next && !pending(o, next) && o->want_layer < 0 &&
        !(o->busy_layer >= 0 && o->busy_buf == 1 - b))
        request(o, next, 1 - b);
    o->st.wait_s += ft_now() - t0;
    pthread_mutex_unlock(&o->mu);
    const uint8_t *lp = o->lpres + (size_t)layer * (size_t)o->ns;
    for (int s = 0; s < o->ns; s++) {
        const slot_info *si = &o->slot[s];
        if (!si->present || !lp[s] || si->use != USE_FETCH) continue;
        if (si->matrix) *ft_layer_weights_mat(w, s) = *ft_layer_weights_mat(&o->slot_w[b], s);
        else *ft_layer_weights_vec(w, s) = *ft_layer_weights_vec(&o->slot_w[b], s);
    }
    return FT_OK;
}

/* ---------------------------------------------------------------- setup */


/* The checkpoint's pages are read once: drop them (the mapping stays
 * valid), so loading holds one tensor's source at a time. */
static void drop_pages(const void *p, size_t n, const ft_checkpoint *ck)
{
    long ps = sysconf(_SC_PAGESIZE);
    if (ps <= 0) return;
    uintptr_t a = ((uintptr_t)p + (uintptr_t)ps - 1) & ~((uintptr_t)ps - 1);
    uintptr_t e = ((uintptr_t)p + n) & ~((uintptr_t)ps - 1);
    if (e <= a) return;
    (void)madvise((void *)a, e - a, MADV_DONTNEED);
    /* under a memory budget (drop_cache) the file's pages (and what was
     * read ahead) leave the page cache too: a cgroup charges them to this
     * process */
    if (ck) ft_checkpoint_drop_cache(ck);
}

/* n rounded up to a multiple of align (a power of two) */
static size_t pad_to(uint64_t n, uint64_t align) { return (size_t)((n + align - 1) & ~(align - 1)); }

/* The smallest streamed frame placed for O_DIRECT reads. */
static uint64_t dio_min(const ft_offload *o) { return o->p.direct_min ? o->p.direct_min : DIO_MIN; }

/* Place one remote tensor: every piece of its frame (one, or one per
 * node: piece_span) on `replicas` nodes, each replica written unless that
 * node already holds it (content-addressed keys). */
static ft_status place_remote(ft_offload *o, slot_info *si, size_t idx, const ft_tensor_layout *e,
                              const ft_tensor *t, const ft_codec_params *cp, ft_codec_ctx *cc, uint64_t nb)
{
    int np = si->np, missing = 0;
    uint64_t size = 0, plen[MAX_PIECES] = {0};
    uint8_t have[MAX_PIECES][FT_MAX_REMOTES];
    char pk[160];
    ft_status st;
    o->stores[idx] = o->remote[rnode(o, (uint32_t)(e->layer + e->slot), 0)];
    for (int k = 0; k < np; k++) {
        piece_key(o->keys[idx], k, np, pk, sizeof pk);
        for (int j = 0; j < o->replicas; j++) {
            int node = rnode(o, (uint32_t)(e->layer + e->slot + k), j);
            ft_tensor_stat ts;
            st = ft_stat_tensor(o->remote[node], pk, &ts);
            have[k][j] = st == FT_OK;
            if (st == FT_OK) {
                uint64_t n = np == 1 ? ts.stored_bytes : ts.raw_bytes;
                if (plen[k] && plen[k] != n)
                    return ft_set_error(FT_ERR_CORRUPT, "offload: %s has %llu bytes on %s, %llu elsewhere", pk,
                                        (unsigned long long)n, o->p.policy.remotes[node], (unsigned long long)plen[k]);
                plen[k] = n;
            } else if (st == FT_ERR_NOT_FOUND) {
                missing = 1;
            } else {
                return ft_set_error(st, "offload: stat %s on %s: %s", pk, o->p.policy.remotes[node], ft_last_error());
            }
        }
    }
    if (!missing) {
        for (int k = 0; k < np; k++) size += plen[k];
        o->wire[idx] = size;
        o->st.reused_bytes += nb;
        return FT_OK;
    }
    uint8_t *f = NULL;
    if (np > 1) {   /* the frame itself, to be cut into pieces */
        size_t bound = ft_encode_bound(cp, t->dtype, t->ndim, t->shape), fs = 0;
        if (!(f = ft_malloc_aligned(bound ? bound : 64, 64))) return ft_set_error(FT_ERR_NOMEM, "offload: %s", e->name);
        if ((st = ft_encode(cc, cp, t, f, bound, &fs))) { ft_free_aligned(f); return st; }
        size = fs;
    }
    for (int k = 0; k < np; k++) {
        piece_key(o->keys[idx], k, np, pk, sizeof pk);
        for (int j = 0; j < o->replicas; j++) {
            if (have[k][j]) continue;
            ft_store *store = o->remote[rnode(o, (uint32_t)(e->layer + e->slot + k), j)];
            if (np == 1) {
                st = ft_write_tensor(store, pk, t, cp);
            } else {
                uint64_t off, len;
                piece_span(size, np, k, &off, &len);
                ft_tensor u;
                memset(&u, 0, sizeof u);
                u.dtype = FT_U8;
                u.ndim = 1;
                u.shape[0] = (int64_t)len;
                u.data = f + off;
                st = ft_write_tensor(store, pk, &u, NULL);
            }
            if (st) {
                ft_free_aligned(f);
                return ft_set_error(st, "offload: writing %s to the remote tier: %s", e->name, ft_last_error());
            }
        }
    }
    ft_free_aligned(f);
    if (np == 1) {
        ft_tensor_stat ts;
        if ((st = ft_stat_tensor(o->stores[idx], o->keys[idx], &ts))) return st;
        size = ts.stored_bytes;
    }
    o->wire[idx] = size;
    o->st.uploaded_bytes += nb;
    return FT_OK;
}

/* The keys the repair of `node` has to check (replica.h): every piece
 * one of whose replicas that node holds. */
static ft_status repair_keys(void *user, int node, ft_rset_visit visit, void *vctx)
{
    ft_offload *o = user;
    char pk[160];
    for (int l = o->lb; l < o->le; l++)
        for (int s = 0; s < o->ns; s++) {
            const slot_info *si = &o->slot[s];
            if (!si->present || !o->lpres[(size_t)l * (size_t)o->ns + (size_t)s] || si->tier != FT_TIER_REMOTE) continue;
            size_t idx = (size_t)l * (size_t)o->ns + (size_t)s;
            for (int k = 0; k < si->np; k++)
                for (int j = 0; j < o->replicas; j++) {
                    uint32_t base = (uint32_t)(l + s + k);
                    if (rnode(o, base, j) != node) continue;
                    piece_key(o->keys[idx], k, si->np, pk, sizeof pk);
                    ft_status st = visit(vctx, pk, base);
                    if (st) return st;
                }
        }
    return FT_OK;
}

/* Place one streamed layer tensor (source `src`, in an aligned buffer):
 * encoded into host memory, or into its store. */
static ft_status place_tensor(ft_offload *o, const ft_tensor_layout *e, ft_tensor *src, void **conv,
                              size_t *conv_cap, ft_codec_ctx *cc)
{
    slot_info *si = &o->slot[e->slot];
    size_t idx = (size_t)e->layer * (size_t)o->ns + (size_t)e->slot;
    ft_status st;
    /* plain formats are stored (and keyed) in their compute dtype */
    ft_tensor t = *src;
    if (!is_q(si->fmt) && src->dtype != si->pdt) {
        size_t need = (size_t)ft_dtype_nbytes(si->pdt, si->numel);
        if (*conv_cap < need) {
            ft_free_aligned(*conv);
            *conv_cap = 0;
            if (!(*conv = ft_malloc_aligned(need, 64))) return ft_set_error(FT_ERR_NOMEM, "offload: %s", e->name);
            *conv_cap = need;
        }
        if ((st = ft_convert(*conv, si->pdt, src->data, src->dtype, si->numel))) return st;
        t.dtype = si->pdt;
        t.data = *conv;
    }
    ft_codec_params cp;
    if ((st = slot_codec(o, si, t.dtype, &cp))) return st;
    uint64_t nb = ft_dtype_nbytes(t.dtype, si->numel);
    make_key(&t, nb, si, &cp, o->keys[idx], sizeof o->keys[idx]);
    if (si->tier == FT_TIER_HOST) {
        size_t bound = ft_encode_bound(&cp, t.dtype, t.ndim, t.shape), size = 0;
        uint8_t *f = ft_malloc_aligned(bound ? bound : 64, 64);
        if (!f) return ft_set_error(FT_ERR_NOMEM, "offload: host copy of %s", e->name);
        if ((st = ft_encode(cc, &cp, &t, f, bound, &size))) { ft_free_aligned(f); return st; }
        /* keep the frame at its size, not the bound (a byte-plane frame is
         * a third smaller, and the bound's tail may be resident) */
        if (size + 4096 < bound) {
            uint8_t *g = ft_malloc_aligned(size, 64);
            if (g) {
                memcpy(g, f, size);
                ft_free_aligned(f);
                f = g;
            }
        }
        o->host[idx] = f;
        o->wire[idx] = size;
        o->st.host_bytes += size;
        o->st.uploaded_bytes += nb;
        return FT_OK;
    }
    if (si->tier == FT_TIER_REMOTE) return place_remote(o, si, idx, e, &t, &cp, cc, nb);
    o->stores[idx] = o->disk;
    ft_tensor_stat ts;
    st = ft_stat_tensor(o->stores[idx], o->keys[idx], &ts);
    if (st == FT_OK) {
        o->st.reused_bytes += nb;
    } else if (st == FT_ERR_NOT_FOUND) {
        if ((st = ft_write_tensor(o->stores[idx], o->keys[idx], &t, &cp)))
            return ft_set_error(st, "offload: writing %s to the %s tier: %s", e->name, ft_tier_name(si->tier),
                                ft_last_error());
        if ((st = ft_stat_tensor(o->stores[idx], o->keys[idx], &ts))) return st;
        o->st.uploaded_bytes += nb;
    } else {
        return ft_set_error(st, "offload: stat %s on the %s tier: %s", e->name, ft_tier_name(si->tier),
                            ft_last_error());
    }
    o->wire[idx] = ts.stored_bytes;
    return FT_OK;
}

static ft_status x_setup(ft_offload *o);
static void x_drain(ft_offload *o);

ft_status ft_offload_create(ft_model *m, const char *model_dir, const ft_offload_params *p,
                            ft_offload **out)
{
    if (!m || !model_dir || !p || !out) return FT_ERR_INVALID_ARG;
    ft_status st = ft_policy_validate(&p->policy);
    if (st) return st;
    if (p->policy.a_pct[FT_TIER_DEVICE] != 100.0f)
        return ft_set_error(FT_ERR_UNSUPPORTED, "offload: activations must stay on the device (a=100,0,0,0): "
                            "the engine keeps each step's hidden states in its working set");
    ft_codec_id cw = p->policy.compress_weights;
    if (cw != FT_CODEC_RAW && cw != FT_CODEC_BYTEPLANE && cw != FT_CODEC_Q8 && cw != FT_CODEC_Q4)
        return ft_set_error(FT_ERR_UNSUPPORTED, "offload: weight compression %s (none, bp, q8 or q4)",
                            ft_codec_name(cw));
    ft_offload *o = calloc(1, sizeof *o);
    if (!o) return FT_ERR_NOMEM;
    o->m = m;
    o->p = *p;
    if (!o->p.decode_threads) o->p.decode_threads = 1;
    o->n_layers = ft_model_get_config(m)->n_layers;
    o->lb = p->layer_begin;
    o->le = p->layer_end ? p->layer_end : o->n_layers;
    o->slot_layer[0] = o->slot_layer[1] = -1;
    o->want_layer = o->busy_layer = o->err_layer = -1;
    o->fb[0].layer = o->fb[1].layer = -1;
    pthread_mutex_init(&o->mu, NULL);
    pthread_cond_init(&o->cv, NULL);
    o->n_remote = (int)p->policy.n_remotes;
    o->replicas = p->policy.replicas > 1 ? (int)p->policy.replicas : 1;
    /* a policy's remotes are all memory nodes or all codec agents */
    o->agent_remote = p->policy.n_remotes && !strncmp(p->policy.remotes[0], "agent://", 8);
    ft_checkpoint *ck = NULL;
    ft_codec_ctx *cc = NULL;
    void *tmp = NULL, *conv = NULL;
    size_t tmp_cap = 0, conv_cap = 0;
    uint64_t *bytes = NULL;
    int *slot_ids = NULL, n = 0;
    ft_tier *tiers = NULL;
    if (o->lb < 0 || o->le > o->n_layers || o->lb >= o->le) {
        st = ft_set_error(FT_ERR_INVALID_ARG, "offload: layers [%d, %d) of a model of %d", o->lb, o->le, o->n_layers);
        goto fail;
    }
    {
        const ft_model_config *mc = ft_model_get_config(m);
        o->n_experts = mc->n_experts;
        o->ns = FT_LAYER_SLOTS + 3 * mc->n_experts;
        size_t NS = (size_t)o->ns, E3 = 3 * (size_t)mc->n_experts;
        o->slot = calloc(NS, sizeof *o->slot);
        o->lpres = calloc((size_t)o->n_layers * NS, 1);
        int fok = 1;
        for (int k = 0; k < 2; k++) {
            o->fb[k].rd = calloc(NS, sizeof *o->fb[k].rd);
            fok = fok && o->fb[k].rd;
        }
        bytes = calloc(NS, sizeof *bytes);
        slot_ids = calloc(NS, sizeof *slot_ids);
        tiers = calloc(NS, sizeof *tiers);
        if (E3) {
            o->fexp = calloc((size_t)o->n_layers * E3, sizeof *o->fexp);
            o->sexp[0] = calloc(E3, sizeof *o->sexp[0]);
            o->sexp[1] = calloc(E3, sizeof *o->sexp[1]);
            o->hexp = calloc(E3, sizeof *o->hexp);
        }
        if (!o->slot || !o->lpres || !fok || !bytes || !slot_ids ||
            !tiers || (E3 && (!o->fexp || !o->sexp[0] || !o->sexp[1] || !o->hexp))) {
            st = ft_set_error(FT_ERR_NOMEM, "offload: tables");
            goto fail;
        }
    }

    /* Layout of a layer (the union over layers: a dense layer of an MoE
     * model lacks the expert slots): compute formats, sizes and tiers,
     * placed by the bytes they take as computed on. */
    if ((st = ft_checkpoint_open(model_dir, &ck))) goto fail;
    for (size_t i = 0; i < ft_model_tensor_count(m); i++) {
        ft_tensor_layout lay, *e = &lay;
        ft_model_tensor_layout(m, i, e);
        if (e->layer < 0) continue;
        if (e->slot >= o->ns) {
            st = ft_set_error(FT_ERR_INTERNAL, "offload: %s: slot %d of %d", e->name, e->slot, o->ns);
            goto fail;
        }
        o->lpres[(size_t)e->layer * (size_t)o->ns + (size_t)e->slot] = 1;
        if (o->slot[e->slot].present) continue;
        ft_tensor src;
        if ((st = ft_model_checkpoint_tensor(m, ck, i, &src))) {
            st = ft_set_error(st, "offload: %s: %s", e->name, ft_last_error());
            goto fail;
        }
        slot_info *si = &o->slot[e->slot];
        si->present = 1;
        si->matrix = ft_layer_slot_is_matrix(e->slot);
        si->fmt = e->fmt;
        /* a q8/q4 policy keeps the layer matrices quantized everywhere
         * (resident ones too): they are computed on as stored */
        if ((cw == FT_CODEC_Q8 || cw == FT_CODEC_Q4) && si->matrix && !is_q(si->fmt)) {
            int g;
            ft_wfmt want = cw == FT_CODEC_Q8 ? FT_WF_Q8 : FT_WF_Q4;
            si->fmt = ft_model_format_for(m, i, want, &g);
            if (!is_q(si->fmt)) si->fmt = e->fmt;   /* no group divides it: stays as loaded */
        }
        si->pdt = e->fmt == FT_WF_BF16 ? FT_BF16 : e->fmt == FT_WF_F16 ? FT_F16 : FT_F32;
        si->rows = e->ndim == 2 ? (int)e->shape[0] : 1;
        si->cols = e->ndim == 2 ? (int)e->shape[1] : (int)e->shape[0];
        si->numel = (size_t)si->rows * (size_t)si->cols;
        si->n_chunks = e->n_chunks;
        si->src_bytes = ft_dtype_nbytes(src.dtype, si->numel);
        /* q8/q4 weights are their own frames; other tensors travel raw or
         * byte-plane coded (a q8/q4 policy leaves them raw) */
        if (is_q(si->fmt)) {
            if (cw != FT_CODEC_RAW && !(cw == FT_CODEC_Q8 && si->fmt == FT_WF_Q8) &&
                !(cw == FT_CODEC_Q4 && si->fmt == FT_WF_Q4)) {
                st = ft_set_error(FT_ERR_INVALID_ARG, "offload: weights kept as %s cannot be stored %s "
                                  "(use --compress-weights %s or none)", ft_wfmt_name(si->fmt), ft_codec_name(cw),
                                  ft_wfmt_name(si->fmt));
                goto fail;
            }
            si->codec = si->fmt == FT_WF_Q8 ? FT_CODEC_Q8 : FT_CODEC_Q4;
            ft_codec_params qp;
            if ((st = ft_wmat_codec_params(si->fmt == FT_WF_Q8 ? 8 : 4, FT_F32, si->rows, si->cols, &qp))) goto fail;
            si->compute_bytes = ft_encode_bound(&qp, FT_F32, 2, e->shape);   /* the frame */
            uint64_t spc = qp.chunk_size / ((uint64_t)qp.group_size * 4), gpr = (uint64_t)si->cols / qp.group_size;
            uint64_t rpc = spc / gpr ? spc / gpr : 1;
            si->n_chunks = (uint32_t)(((uint64_t)si->rows + rpc - 1) / rpc);
        } else {
            si->codec = cw == FT_CODEC_BYTEPLANE ? FT_CODEC_BYTEPLANE : FT_CODEC_RAW;
            si->compute_bytes = ft_dtype_nbytes(si->pdt, si->numel);
        }
        bytes[n] = si->compute_bytes;
        slot_ids[n++] = e->slot;
    }
    ft_policy_place(&p->policy, bytes, (size_t)n, tiers);
    for (int k = 0; k < n; k++) {
        slot_info *si = &o->slot[slot_ids[k]];
        si->tier = tiers[k];
        si->use = si->tier == FT_TIER_DEVICE ? USE_RESIDENT
                : si->tier == FT_TIER_HOST && si->codec != FT_CODEC_BYTEPLANE ? USE_HOST_INPLACE : USE_FETCH;
        si->np = n_pieces(o, si);
    }
    /* Experts not resident are streamed one by one once routed (their
     * router then stays resident: it predicts the next layer's experts);
     * everything else with its layer. */
    if (o->n_experts) {
        for (int s = FT_LAYER_SLOTS; s < o->ns; s++)
            if (o->slot[s].present && o->slot[s].use == USE_FETCH) {
                o->slot[s].use = USE_EXPERT;
                o->xmode = 1;
            }
        slot_info *rs = &o->slot[LW_ROUTER_SLOT];
        if (o->xmode && rs->present && rs->use != USE_RESIDENT) {
            rs->tier = FT_TIER_DEVICE;
            rs->use = USE_RESIDENT;
            rs->np = 1;
        }
    }
    for (int s = 0; s < o->ns; s++)
        if (o->slot[s].present && o->slot[s].use == USE_FETCH) o->n_fetched++;
    /* Resident block layout; chunk-pointer tables. */
    size_t nkeys = (size_t)o->n_layers * (size_t)o->ns, chunk_per_layer = 0;
    for (int s = 0; s < o->ns; s++) {
        slot_info *si = &o->slot[s];
        if (!si->present) continue;
        if (si->use == USE_RESIDENT) {
            si->res_off = o->res_stride;
            o->res_stride += pad_to(si->compute_bytes, 64);
        }
        si->tab_off = chunk_per_layer;
        chunk_per_layer += si->n_chunks;
    }
    o->keys = calloc(nkeys, sizeof *o->keys);
    o->stores = calloc(nkeys, sizeof *o->stores);
    o->wire = calloc(nkeys, sizeof *o->wire);
    o->host = calloc(nkeys, sizeof *o->host);
    o->fixed = calloc((size_t)o->n_layers, sizeof *o->fixed);
    o->fixed_chunks = calloc((size_t)o->n_layers * chunk_per_layer + 1, sizeof *o->fixed_chunks);
    for (int k = 0; k < 2; k++) o->slot_chunks[k] = calloc(chunk_per_layer + 1, sizeof *o->slot_chunks[k]);
    if (!o->keys || !o->stores || !o->wire || !o->host || !o->fixed || !o->fixed_chunks || !o->slot_chunks[0] ||
        !o->slot_chunks[1]) {
        st = ft_set_error(FT_ERR_NOMEM, "offload: tables");
        goto fail;
    }
    if (o->n_experts) {   /* the experts' views of sparse layers and of the slot buffers */
        const ft_model_config *mc = ft_model_get_config(m);
        for (int l = 0; l < o->n_layers; l++)
            if (mc->layer_moe[l]) {
                o->fixed[l].n_experts = o->n_experts;
                o->fixed[l].experts = o->fexp + (size_t)l * 3 * (size_t)o->n_experts;
            }
        for (int k = 0; k < 2; k++) {
            o->slot_w[k].n_experts = o->n_experts;
            o->slot_w[k].experts = o->sexp[k];
        }
    }
    o->st.resident_bytes = (uint64_t)o->res_stride * (uint64_t)(o->le - o->lb);
    if (p->device_budget && o->st.resident_bytes > p->device_budget) {
        st = ft_set_error(FT_ERR_NO_SPACE,
                          "offload: the policy keeps %.1f MiB of weights on the device, budget %.1f MiB",
                          (double)o->st.resident_bytes / 1048576.0, (double)p->device_budget / 1048576.0);
        goto fail;
    }
    if (o->res_stride) {
        o->resident = ft_malloc_aligned(o->res_stride * (size_t)(o->le - o->lb), 64);
        if (!o->resident) { st = ft_set_error(FT_ERR_NOMEM, "offload: resident weights"); goto fail; }
    }
    if (p->policy.w_pct[FT_TIER_DISK] > 0 && (st = open_store(p->policy.disk_uri, p, 0, &o->disk))) goto fail;
    if (p->policy.w_pct[FT_TIER_REMOTE] > 0)
        for (uint32_t r = 0; r < p->policy.n_remotes; r++)
            if ((st = open_store(p->policy.remotes[r], p, o->replicas > 1, &o->remote[r]))) goto fail;
    if ((st = ft_codec_ctx_create(0, &cc))) goto fail;

    /* Place every layer tensor, one at a time from the checkpoint (so
     * loading holds one source tensor): resident ones converted or
     * quantized into their block, host ones encoded in memory, the rest
     * uploaded unless the store already holds the same encoding. The
     * chunk tables are bound per layer: fixed_chunks[layer][...]. */
    uint64_t total = 0, done = 0;
    for (int l = o->lb; l < o->le; l++)
        for (int s = 0; s < o->ns; s++)
            if (o->lpres[(size_t)l * (size_t)o->ns + (size_t)s]) total += o->slot[s].src_bytes;
    for (size_t i = 0; i < ft_model_tensor_count(m); i++) {
        ft_tensor_layout lay, *e = &lay;
        ft_model_tensor_layout(m, i, e);
        if (e->layer < o->lb || e->layer >= o->le) continue;   /* globals; another stage's layers */
        slot_info *si = &o->slot[e->slot];
        ft_tensor src;
        if ((st = ft_model_checkpoint_tensor(m, ck, i, &src))) {
            st = ft_set_error(st, "offload: %s: %s", e->name, ft_last_error());
            goto fail;
        }
        uint64_t nb = ft_dtype_nbytes(src.dtype, si->numel);
        if (tmp_cap < nb) {
            ft_free_aligned(tmp);
            tmp_cap = 0;
            if (!(tmp = ft_malloc_aligned((size_t)nb, 64))) { st = FT_ERR_NOMEM; goto fail; }
            tmp_cap = (size_t)nb;
        }
        memcpy(tmp, src.data, (size_t)nb);   /* the mapping may be unaligned */
        drop_pages(src.data, (size_t)nb, p->drop_cache ? ck : NULL);
        src.data = tmp;
        /* the chunk table of this (layer, slot) for fixed views */
        const uint8_t **tab = o->fixed_chunks + (size_t)e->layer * chunk_per_layer + si->tab_off;
        if (si->use == USE_RESIDENT) {
            uint8_t *dst = o->resident + (size_t)(e->layer - o->lb) * o->res_stride + si->res_off;
            ft_tensor t = src;
            ft_codec_params cp;
            size_t size = (size_t)si->compute_bytes;
            if (is_q(si->fmt)) {
                if (!(st = slot_codec(o, si, src.dtype, &cp))) st = ft_encode(cc, &cp, &t, dst, size, &size);
            } else {
                st = ft_convert(dst, si->pdt, src.data, src.dtype, si->numel);
            }
            if (!st) st = bind_view(si, e->slot, &o->fixed[e->layer], dst, size, tab);
        } else {
            st = place_tensor(o, e, &src, &conv, &conv_cap, cc);
            if (!st && si->use == USE_HOST_INPLACE) {
                size_t idx = (size_t)e->layer * (size_t)o->ns + (size_t)e->slot;
                ft_codec_ctx *save = o->io_cc;
                o->io_cc = cc;
                st = use_frame(o, si, e->slot, &o->fixed[e->layer], o->host[idx], (size_t)o->wire[idx], NULL, tab);
                o->io_cc = save;
            }
        }
        if (st) {
            st = ft_set_error(st, "offload: %s: %s", e->name, ft_last_error());
            goto fail;
        }
        done += si->src_bytes;
        if (p->progress) p->progress(p->user, done, total);
    }
    ft_free_aligned(tmp);
    tmp = NULL;
    ft_free_aligned(conv);
    conv = NULL;
    ft_codec_ctx_free(cc);
    cc = NULL;
    ft_checkpoint_close(ck);
    ck = NULL;

    /* Slot buffers: per fetched tensor its largest frame (disk/remote)
     * and, for byte-plane, the decoded tensor. */
    if (o->n_fetched) {
        for (int s = 0; s < o->ns; s++) {
            slot_info *si = &o->slot[s];
            if (!si->present || si->use != USE_FETCH) continue;
            uint64_t cap = 0;
            for (int l = o->lb; l < o->le; l++) {
                uint64_t w = o->wire[(size_t)l * (size_t)o->ns + (size_t)s];
                if (w > cap) cap = w;
            }
            /* frames of 1 MiB and more at 4 KiB with room for their last
             * block: the disk tier reads them past the page cache
             * (O_DIRECT) in place; smaller ones (the padding would count)
             * are read through it (file.c) */
            si->frame_cap = si->tier == FT_TIER_HOST || agent_decodes(o, si) ? 0 : cap;
            int dio = si->frame_cap && si->frame_cap >= dio_min(o);
            if (dio) si->frame_cap = pad_to(si->frame_cap, DIO_ALIGN);
            si->frame_off = dio ? pad_to(o->slot_stride, DIO_ALIGN) : o->slot_stride;
            o->slot_stride = si->frame_off + pad_to(si->frame_cap, 64);
            si->dec_off = o->slot_stride;
            if (si->codec == FT_CODEC_BYTEPLANE) o->slot_stride += pad_to(si->compute_bytes, 64);
        }
        o->st.slot_bytes = 2ull * o->slot_stride;
        if (p->device_budget && o->st.resident_bytes + o->st.slot_bytes > p->device_budget) {
            st = ft_set_error(FT_ERR_NO_SPACE,
                              "offload: the policy needs %.1f MiB of device memory for weights "
                              "(%.1f resident + %.1f for two streaming slots), budget %.1f MiB",
                              (double)(o->st.resident_bytes + o->st.slot_bytes) / 1048576.0,
                              (double)o->st.resident_bytes / 1048576.0, (double)o->st.slot_bytes / 1048576.0,
                              (double)p->device_budget / 1048576.0);
            goto fail;
        }
        for (int k = 0; k < 2; k++) {
            o->slots[k] = ft_malloc_aligned(o->slot_stride ? o->slot_stride : 64, DIO_ALIGN);
            if (!o->slots[k]) { st = ft_set_error(FT_ERR_NOMEM, "offload: slot buffers"); goto fail; }
        }
        if ((st = ft_codec_ctx_create(o->p.decode_threads, &o->io_cc))) goto fail;
        /* The I/O workers check or decode a frame as it arrives, one every
         * fraction of a millisecond to milliseconds: spinning for the next
         * one takes the cores compute runs on (FLEXTIER_SPIN_US overrides). */
        ft_codec_ctx_set_spin_us(o->io_cc, 0);
        if (pthread_create(&o->io, NULL, io_main, o)) { st = ft_set_error(FT_ERR_NOMEM, "offload: I/O thread"); goto fail; }
        o->io_started = 1;
    }
    if (o->xmode && (st = x_setup(o))) goto fail;
    if (o->replicas > 1 && p->policy.w_pct[FT_TIER_REMOTE] > 0) {
        const char *names[FT_MAX_REMOTES];
        for (int r = 0; r < o->n_remote; r++) names[r] = p->policy.remotes[r];
        ft_rset_params rp = {.n = o->n_remote, .replicas = o->replicas, .stores = o->remote, .names = names,
                             .each = repair_keys, .user = o, .what = "offload (weights)"};
        if ((st = ft_rset_create(&rp, &o->rset))) goto fail;
    }
    free(bytes);
    free(slot_ids);
    free(tiers);
    *out = o;
    return FT_OK;
fail:
    free(bytes);
    free(slot_ids);
    free(tiers);
    ft_free_aligned(tmp);
    ft_free_aligned(conv);
    ft_codec_ctx_free(cc);
    ft_checkpoint_close(ck);
    ft_offload_free(o);
    return st;
}

void ft_offload_free(ft_offload *o)
{
    if (!o) return;
    if (o->io_started) ft_io_thread_stop(&o->mu, &o->cv, &o->stop, o->io);
    x_drain(o);
    ft_rset_free(o->rset);
    ft_store_close(o->disk);
    for (int r = 0; r < FT_MAX_REMOTES; r++) ft_store_close(o->remote[r]);
    if (o->host)
        for (size_t i = 0; i < (size_t)o->n_layers * (size_t)o->ns; i++) ft_free_aligned(o->host[i]);
    free(o->host);
    free(o->keys);
    free(o->stores);
    free(o->wire);
    free(o->fixed);
    free(o->fixed_chunks);
    free(o->slot_chunks[0]);
    free(o->slot_chunks[1]);
    free(o->slot);
    free(o->lpres);
    free(o->fexp);
    free(o->sexp[0]);
    free(o->sexp[1]);
    free(o->hexp);
    for (int k = 0; k < 2; k++) free(o->fb[k].rd);
    free(o->xe);
    free(o->xmap);
    ft_free_aligned(o->xbuf);
    free(o->xchunk_tab);
    ft_codec_ctx_free(o->x_cc);
    free(o->xscr);
    ft_free_aligned(o->xrouter);
    ft_free_aligned(o->xlog);
    free(o->xpred);
    free(o->xnpred);
    free(o->xst);
    ft_codec_ctx_free(o->io_cc);
    ft_free_aligned(o->resident);
    ft_free_aligned(o->slots[0]);
    ft_free_aligned(o->slots[1]);
    pthread_mutex_destroy(&o->mu);
    pthread_cond_destroy(&o->cv);
    free(o);
}

void ft_offload_get_stats(const ft_offload *o, ft_offload_stats *out)
{
    ft_offload *mo = (ft_offload *)o;
    pthread_mutex_lock(&mo->mu);
    *out = o->st;
    pthread_mutex_unlock(&mo->mu);
    ft_rset_stats rs;
    ft_rset_get_stats(o->rset, &rs);
    out->failovers = rs.failovers;
    out->repairs = rs.repairs;
    out->repaired_bytes = rs.repaired_bytes;
}

void ft_offload_reset_stats(ft_offload *o)
{
    pthread_mutex_lock(&o->mu);
    ft_offload_stats keep = o->st;
    memset(&o->st, 0, sizeof o->st);
    o->st.uploaded_bytes = keep.uploaded_bytes;
    o->st.reused_bytes = keep.reused_bytes;
    o->st.resident_bytes = keep.resident_bytes;
    o->st.slot_bytes = keep.slot_bytes;
    o->st.host_bytes = keep.host_bytes;
    if (o->xst) memset(o->xst, 0, (size_t)o->n_layers * sizeof *o->xst);
    pthread_mutex_unlock(&o->mu);
}

/* Bytes of an entry as the scheduler keeps it under weight codec cw. */
static uint64_t kept_bytes(const ft_model *m, size_t i, const ft_tensor_layout *e, ft_codec_id cw)
{
    ft_wfmt f = e->fmt;
    if ((cw == FT_CODEC_Q8 || cw == FT_CODEC_Q4) && ft_layer_slot_is_matrix(e->slot) && !is_q(f)) {
        int g;
        ft_wfmt q = ft_model_format_for(m, i, cw == FT_CODEC_Q8 ? FT_WF_Q8 : FT_WF_Q4, &g);
        if (is_q(q)) f = q;
    }
    if (is_q(f)) {
        ft_codec_params qp;
        if (ft_wmat_codec_params(f == FT_WF_Q8 ? 8 : 4, FT_F32, (int)e->shape[0], (int)e->shape[1], &qp)) return 0;
        return ft_encode_bound(&qp, FT_F32, 2, e->shape);
    }
    uint64_t n = e->ndim == 1 ? (uint64_t)e->shape[0] : (uint64_t)(e->shape[0] * e->shape[1]);
    return n * (f == FT_WF_F32 ? 4 : 2);
}

ft_status ft_cost_inputs_from_model(const ft_model *m, ft_cost_inputs *in)
{
    if (!m || !in) return FT_ERR_INVALID_ARG;
    const ft_model_config *cfg = ft_model_get_config(m);
    in->n_layers = (uint32_t)cfg->n_layers;
    in->hidden = (uint32_t)cfg->hidden;
    in->kv_bytes_per_token = 2ull * (uint64_t)cfg->n_kv_heads * (uint64_t)cfg->head_dim * 4;
    in->kv_group = (uint32_t)cfg->head_dim % FT_DEFAULT_GROUP_SIZE ? (uint32_t)cfg->head_dim : FT_DEFAULT_GROUP_SIZE;
    in->weights_fmt = ft_model_format_requested(m);
    in->layer_params = 0;
    in->n_tensors = 0;
    in->n_experts = (uint32_t)cfg->n_experts;
    in->experts_used = (uint32_t)cfg->n_experts_used;
    in->expert_cache = 0;
    memset(in->expert_bytes, 0, sizeof in->expert_bytes);
    /* the scheduler's order: a layer's entries as the model lists them
     * (of a mixture of experts, the first sparse layer; its experts summed
     * per expert, all alike) */
    int lay0 = 0;
    for (int l = 0; cfg->n_experts && l < cfg->n_layers; l++)
        if (cfg->layer_moe[l]) { lay0 = l; break; }
    uint64_t expert_params = 0;
    for (size_t i = 0; i < ft_model_tensor_count(m); i++) {
        ft_tensor_layout lay, *e = &lay;
        ft_model_tensor_layout(m, i, e);
        if (e->layer != lay0) continue;
        uint64_t n = e->ndim == 1 ? (uint64_t)e->shape[0] : (uint64_t)(e->shape[0] * e->shape[1]);
        if (e->slot >= FT_LAYER_SLOTS) {
            if (e->slot < FT_EXPERT_SLOT(1, 0)) {   /* expert 0 stands for all */
                for (int c = 0; c < FT_CODEC_COUNT; c++) in->expert_bytes[c] += kept_bytes(m, i, e, (ft_codec_id)c);
                expert_params += n;
            }
            continue;
        }
        if (in->n_tensors == FT_COST_MAX_TENSORS) return ft_set_error(FT_ERR_INTERNAL, "too many tensors per layer");
        for (int c = 0; c < FT_CODEC_COUNT; c++)
            in->tensor_bytes[c][in->n_tensors] = kept_bytes(m, i, e, (ft_codec_id)c);
        in->n_tensors++;
        in->layer_params += n;
    }
    in->layer_params += expert_params * (uint64_t)cfg->n_experts_used;
    return FT_OK;
}

ft_tier ft_offload_tier_of(const ft_offload *o, int slot)
{
    return slot >= 0 && slot < o->ns ? o->slot[slot].tier : FT_TIER_DEVICE;
}

/* ------------------------------------------------------------- experts
 *
 * A mixture of experts whose policy leaves experts off the device: each
 * such expert matrix is a USE_EXPERT slot, read only when a layer's router
 * selects its expert. An expert's streamed matrices go together into one
 * entry of the expert cache (xcap entries of xstride bytes; the frames at
 * the slots' frame_off, byte-plane decodes at dec_off, the same layout for
 * every expert), found by (layer, expert) in xmap. The engine calls
 * x_fetch (ft_layer_weights.fetch_experts) with the union of the experts
 * the call's rows chose: hits are used in place, misses read at once (all
 * reads of the call issued together, then verified), and the next
 * layer's router applied to this layer's MoE input predicts the experts to
 * read ahead, asynchronously, into free entries or ones the last step did
 * not use. Eviction: LRU (last use) or LFU (use counts, halved
 * every xcap calls). The entries of the current call are pinned, every hit
 * before any miss is placed. */

static int x_streamed(const ft_offload *o, int e)
{
    for (int k = 0; k < 3; k++)
        if (o->slot[FT_LAYER_SLOTS + 3 * e + k].use == USE_EXPERT) return 1;
    return 0;
}

static ft_status x_setup(ft_offload *o)
{
    const ft_model_config *mc = ft_model_get_config(o->m);
    const int E = o->n_experts;
    /* one entry's layout, the same for every expert: per matrix k its
     * largest frame over every streamed expert and layer, and for
     * byte-plane the decoded matrix */
    size_t off[3], doff[3], tab[3];
    uint64_t cap[3] = {0, 0, 0};
    uint32_t nch[3] = {0, 0, 0};
    for (int s = FT_LAYER_SLOTS; s < o->ns; s++) {
        const slot_info *si = &o->slot[s];
        int k = (s - FT_LAYER_SLOTS) % 3;
        if (si->use != USE_EXPERT) continue;
        for (int l = o->lb; l < o->le; l++) {
            uint64_t w = o->wire[(size_t)l * (size_t)o->ns + (size_t)s];
            if (w > cap[k]) cap[k] = w;
        }
        if (si->n_chunks > nch[k]) nch[k] = si->n_chunks;
    }
    size_t stride = 0, ch = 0;
    uint64_t dec[3] = {0, 0, 0};
    for (int s = FT_LAYER_SLOTS; s < o->ns; s++) {
        const slot_info *si = &o->slot[s];
        int k = (s - FT_LAYER_SLOTS) % 3;
        if (si->use == USE_EXPERT && si->codec == FT_CODEC_BYTEPLANE && si->compute_bytes > dec[k])
            dec[k] = si->compute_bytes;
    }
    /* a matrix's frames of dio_min and more at 4 KiB of an entry (every
     * entry then at 4 KiB) with room for their last block: the disk tier
     * reads them past the page cache in place, as a layer's */
    int dio = 0;
    for (int k = 0; k < 3; k++) {
        if (cap[k] && cap[k] >= dio_min(o)) {
            cap[k] = pad_to(cap[k], DIO_ALIGN);
            stride = pad_to(stride, DIO_ALIGN);
            dio = 1;
        }
        off[k] = stride;
        stride += pad_to(cap[k], 64);
        doff[k] = stride;
        stride += pad_to(dec[k], 64);
        tab[k] = ch;
        ch += nch[k];
    }
    if (dio) stride = pad_to(stride, DIO_ALIGN);
    for (int s = FT_LAYER_SLOTS; s < o->ns; s++) {
        slot_info *si = &o->slot[s];
        int k = (s - FT_LAYER_SLOTS) % 3;
        if (si->use != USE_EXPERT) continue;
        si->frame_cap = si->tier == FT_TIER_HOST || agent_decodes(o, si) ? 0 : cap[k];
        si->frame_off = off[k];
        si->dec_off = agent_decodes(o, si) ? off[k] : doff[k];
        si->tab_off = tab[k];
        if (agent_decodes(o, si) && si->compute_bytes > cap[k])
            return ft_set_error(FT_ERR_INTERNAL, "offload: expert entry too small for a decoded matrix");
    }
    o->xstride = stride ? stride : 64;
    o->xchunks = (uint32_t)ch;
    /* entries: the budget's worth, at least one layer's experts, at most
     * every streamed expert held */
    int need = E, most = 0;
    for (int l = o->lb; l < o->le; l++) most += mc->layer_moe[l] ? E : 0;
    uint64_t want = o->p.expert_cache_bytes ? o->p.expert_cache_bytes / o->xstride : (uint64_t)need;
    /* no size given but a device budget: what the budget leaves */
    uint64_t used = o->st.resident_bytes + o->st.slot_bytes;
    if (!o->p.expert_cache_bytes && o->p.device_budget && o->p.device_budget > used)
        want = (o->p.device_budget - used) / o->xstride;
    if (want < (uint64_t)need) want = (uint64_t)need;
    if (want > (uint64_t)most) want = (uint64_t)most;
    if (o->p.device_budget && used + want * o->xstride > o->p.device_budget)
        return ft_set_error(FT_ERR_NO_SPACE, "offload: the policy needs %.1f MiB of device memory for weights "
                            "(%.1f resident + %.1f streaming slots + an expert cache of %llu experts, %.1f MiB: one "
                            "layer's at least), budget %.1f MiB", (double)(used + want * o->xstride) / 1048576.0,
                            (double)o->st.resident_bytes / 1048576.0, (double)o->st.slot_bytes / 1048576.0,
                            (unsigned long long)want, (double)(want * o->xstride) / 1048576.0,
                            (double)o->p.device_budget / 1048576.0);
    o->xcap = (int)want;
    for (int l = o->lb; l < o->le; l++) o->xsparse += mc->layer_moe[l] ? 1 : 0;
    o->xe = calloc((size_t)o->xcap, sizeof *o->xe);
    o->xmap = malloc((size_t)o->n_layers * (size_t)E * sizeof *o->xmap);
    o->xbuf = ft_malloc_aligned((size_t)o->xcap * o->xstride, dio ? DIO_ALIGN : 64);
    o->xchunk_tab = calloc((size_t)o->xcap * (ch ? ch : 1), sizeof *o->xchunk_tab);
    o->xscr = calloc(3 * (size_t)E, sizeof *o->xscr);
    o->xrouter = ft_malloc_aligned((size_t)E * (size_t)mc->hidden * sizeof(float), 64);
    o->xpred = calloc((size_t)o->n_layers * (size_t)E, sizeof *o->xpred);
    o->xnpred = calloc((size_t)o->n_layers, sizeof *o->xnpred);
    o->xst = calloc((size_t)o->n_layers, sizeof *o->xst);
    if (!o->xe || !o->xmap || !o->xbuf || !o->xchunk_tab || !o->xscr || !o->xrouter || !o->xpred || !o->xnpred ||
        !o->xst)
        return ft_set_error(FT_ERR_NOMEM, "offload: an expert cache of %d entries of %zu bytes", o->xcap, o->xstride);
    for (size_t i = 0; i < (size_t)o->n_layers * (size_t)E; i++) o->xmap[i] = -1;
    o->xtw.n_experts = E;
    o->xtw.experts = o->xscr;
    o->st.expert_cache_bytes = (uint64_t)o->xcap * o->xstride;
    return ft_codec_ctx_create(o->p.decode_threads, &o->x_cc);
}

/* Start reading piece q of (layer, s) into buf as fetch_issue does, and,
 * with replicas, on the next live replica when the node refuses at once
 * (*retries counts the reissues). */
static ft_status x_issue_piece(ft_offload *o, int layer, int s, int q, uint8_t *buf, remote_read *rr,
                               uint64_t *retries)
{
    rr->node = -1;
    ft_status st = issue_remote(o, layer, s, q, buf, rr, -1);
    for (int round = 1; st && rr->node >= 0 && round < o->replicas && ft_rset_failed(o->rset, rr->node, st);
         round++) {
        int failed = rr->node;
        ft_request_free(rr->req);
        rr->req = NULL;
        rr->node = -1;
        st = issue_remote(o, layer, s, q, buf, rr, failed);
        if (!st) (*retries)++;
    }
    return st;
}

/* Wait for piece q of (layer, s); with replicas, a read that failed on its
 * node is issued again on the next live replica (the node is marked down
 * for the repair thread, as for a layer's reads) until it succeeds or no
 * replica is left. */
static ft_status x_finish_piece(ft_offload *o, int layer, int s, int q, uint8_t *buf, remote_read *rr,
                                uint64_t *retries)
{
    const slot_info *si = &o->slot[s];
    ft_status r = finish_remote(o, si, rr);
    for (int round = 1; r && round < o->replicas && ft_rset_failed(o->rset, rr->node, r); round++) {
        ft_status ri = x_issue_piece(o, layer, s, q, buf, rr, retries);
        if (ri) return ri;
        (*retries)++;
        r = finish_remote(o, si, rr);
    }
    return r;
}

/* Start reading the streamed matrices of expert e of `layer` into entry id. */
static ft_status x_issue(ft_offload *o, int id, int layer, int e)
{
    x_entry *xe = &o->xe[id];
    uint8_t *buf = o->xbuf + (size_t)id * o->xstride;
    xe->layer = layer;
    xe->e = e;
    xe->state = X_LOADING;
    o->xmap[(size_t)layer * (size_t)o->n_experts + (size_t)e] = id;
    ft_status st = FT_OK;
    uint64_t retries = 0;
    for (int k = 0; k < 3 && !st; k++) {
        int s = FT_LAYER_SLOTS + 3 * e + k;
        const slot_info *si = &o->slot[s];
        size_t idx = (size_t)layer * (size_t)o->ns + (size_t)s;
        tensor_read *rd = &xe->rd[k];
        rd->req = NULL;
        rd->started = 0;
        if (si->use != USE_EXPERT || si->tier == FT_TIER_HOST) continue;
        if (si->tier == FT_TIER_REMOTE) {
            for (int q = 0; q < si->np && !st; q++) {
                st = x_issue_piece(o, layer, s, q, buf, &rd->rr[q], &retries);
                if (!st) rd->started = q + 1;
            }
        } else {
            st = ft_read_frame_async(o->disk, o->keys[idx], buf + si->frame_off, (size_t)si->frame_cap, &rd->got,
                                     &rd->req);
            if (!st) rd->started = 1;
        }
        if (st)
            st = ft_set_error(st, "layer %d expert %d: reading %s from the %s tier: %s", layer, e, o->keys[idx],
                              ft_tier_name(si->tier), ft_last_error());
    }
    if (retries) {
        pthread_mutex_lock(&o->mu);
        o->st.retries += retries;
        pthread_mutex_unlock(&o->mu);
    }
    return st;
}

/* Wait for entry id's reads, verify, decode, bind its views; *bytes: the
 * stored bytes read. On error the entry is freed. */
static ft_status x_finish(ft_offload *o, int id, uint64_t *bytes)
{
    x_entry *xe = &o->xe[id];
    uint8_t *buf = o->xbuf + (size_t)id * o->xstride;
    const int layer = xe->layer, e = xe->e;
    ft_status st = FT_OK;
    uint64_t logical[FT_TIER_COUNT] = {0}, wire[FT_TIER_COUNT] = {0}, retries = 0;
    *bytes = 0;
    for (int k = 0; k < 3; k++) {
        int s = FT_LAYER_SLOTS + 3 * e + k;
        const slot_info *si = &o->slot[s];
        size_t idx = (size_t)layer * (size_t)o->ns + (size_t)s;
        if (si->use != USE_EXPERT) continue;
        tensor_read *rd = &xe->rd[k];
        const uint8_t *frame = NULL;
        size_t size = 0;
        ft_status r = FT_OK;
        const uint8_t **tab = o->xchunk_tab + (size_t)id * o->xchunks + si->tab_off;
        if (si->tier == FT_TIER_HOST) {
            frame = o->host[idx];
            size = (size_t)o->wire[idx];
        } else if (si->tier == FT_TIER_REMOTE) {
            for (int q = 0; q < rd->started; q++) {
                ft_status rq = x_finish_piece(o, layer, s, q, buf, &rd->rr[q], &retries);
                if (!r) r = rq;
            }
            if (!r && rd->started < si->np) r = ft_set_error(FT_ERR_IO, "not every piece was requested");
            if (!r && si->np == 1 && agent_decodes(o, si)) {
                uint64_t ne = 0;
                if (ft_tensor_numel(&rd->rr[0].dst, &ne) || ne != si->numel)
                    r = ft_set_error(FT_ERR_CORRUPT, "%s has the wrong shape", o->keys[idx]);
                else r = bind_view(si, s, &o->xtw, buf + si->dec_off, (size_t)si->compute_bytes, tab);
                if (!r) {
                    xe->view[k] = o->xscr[3 * e + k];
                    logical[si->tier] += si->compute_bytes;
                    wire[si->tier] += o->wire[idx];
                    *bytes += o->wire[idx];
                    continue;
                }
            }
            frame = buf + si->frame_off;
            size = si->np == 1 ? rd->rr[0].got : (size_t)o->wire[idx];
        } else {
            if (rd->req) {
                r = ft_request_wait(rd->req, -1);
                ft_request_free(rd->req);
                rd->req = NULL;
            } else {
                r = ft_set_error(FT_ERR_IO, "not requested");
            }
            frame = buf + si->frame_off;
            size = rd->got;
        }
        if (!r && si->tier != FT_TIER_HOST && si->codec != FT_CODEC_BYTEPLANE)
            r = ft_frame_verify(o->x_cc, frame, size, NULL);
        if (!r) r = use_frame_cc(o->x_cc, si, s, &o->xtw, frame, size, buf + si->dec_off, tab);
        if (r) {
            if (!st)
                st = ft_set_error(r, "layer %d expert %d: %s (%s tier): %s", layer, e, o->keys[idx],
                                  ft_tier_name(si->tier), ft_last_error());
            continue;
        }
        xe->view[k] = o->xscr[3 * e + k];
        logical[si->tier] += si->compute_bytes;
        wire[si->tier] += size;
        *bytes += size;
    }
    pthread_mutex_lock(&o->mu);
    for (int t = 0; t < FT_TIER_COUNT; t++) {
        o->st.logical_bytes[t] += logical[t];
        o->st.wire_bytes[t] += wire[t];
    }
    o->st.retries += retries;
    pthread_mutex_unlock(&o->mu);
    if (st) {
        o->xmap[(size_t)layer * (size_t)o->n_experts + (size_t)e] = -1;
        xe->state = X_FREE;
        xe->pinned = xe->prefetched = 0;
        return st;
    }
    xe->state = X_READY;
    return FT_OK;
}

/* An entry to fill: a free one, else the least recently (LRU) or least
 * often (LFU) used ready entry nobody is using. A prefetch for layer
 * `for_layer` evicts only entries of other layers that the last whole
 * step (xsparse calls) did not use: a guess must not displace an expert in
 * use (measured: evicting any LRU entry for predictions 50% right cut a
 * 88% hit rate to 27%). With evict 0: free entries only. A miss (not a
 * prefetch) may also wait for an unused prefetch still loading. -1: none. */
static int x_alloc(ft_offload *o, int prefetch, int for_layer, int evict)
{
    int best = -1;
    for (int i = 0; i < o->xcap; i++) {
        const x_entry *xe = &o->xe[i];
        if (xe->state == X_FREE) return i;
        if (!evict || xe->state != X_READY || xe->pinned) continue;
        /* a prefetch evicts only what the last whole step did not use */
        if (prefetch && (xe->layer == for_layer || o->xtick - xe->tick <= (uint64_t)o->xsparse)) continue;
        if (best < 0) { best = i; continue; }
        const x_entry *b = &o->xe[best];
        int better = o->p.expert_evict == FT_EXPERT_LFU
                         ? (xe->freq < b->freq || (xe->freq == b->freq && xe->tick < b->tick))
                         : xe->tick < b->tick;
        if (better) best = i;
    }
    if (best < 0 && !prefetch)
        for (int i = 0; i < o->xcap && best < 0; i++)
            if (o->xe[i].state == X_LOADING && !o->xe[i].pinned) {
                uint64_t b;
                if (x_finish(o, i, &b) == FT_OK) best = i;
                else return i;   /* freed by the failure */
            }
    if (best >= 0) {
        x_entry *xe = &o->xe[best];
        o->xmap[(size_t)xe->layer * (size_t)o->n_experts + (size_t)xe->e] = -1;
        xe->state = X_FREE;
        xe->freq = 0;
        xe->prefetched = 0;
    }
    return best;
}

/* The next sparse layer's experts as its router would choose them for x
 * (this layer's MoE input): read ahead those not cached. */
static void x_predict(ft_offload *o, int layer, const float *x, int rows)
{
    const ft_model_config *mc = ft_model_get_config(o->m);
    const int E = o->n_experts, H = mc->hidden, K = mc->n_experts_used;
    int nl = layer + 1;   /* the next sparse layer this scheduler holds */
    while (nl < o->le && !mc->layer_moe[nl]) nl++;
    if (nl >= o->le || !x || rows < 1) return;
    const ft_wmat *R = &o->fixed[nl].w_router;
    if (!ft_wmat_present(R)) return;
    if (o->xlog_cap < (size_t)E) {
        ft_free_aligned(o->xlog);
        o->xlog_cap = 0;
        if (!(o->xlog = ft_malloc_aligned((size_t)E * sizeof(float), 64))) return;
        o->xlog_cap = (size_t)E;
    }
    for (int e = 0; e < E; e++) ft_wmat_row_f32(R, e, o->xrouter + (size_t)e * H);
    int *pred = o->xpred + (size_t)nl * (size_t)E, np = 0;
    uint8_t mark[FT_MAX_EXPERTS];
    memset(mark, 0, (size_t)E);
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * H;
        for (int e = 0; e < E; e++) {
            const float *w = o->xrouter + (size_t)e * H;
            float d = 0;
            for (int h = 0; h < H; h++) d += xr[h] * w[h];
            o->xlog[e] = d;
        }
        /* the k largest logits (softmax keeps the order) */
        for (int j = 0; j < K; j++) {
            int best = -1;
            for (int e = 0; e < E; e++)
                if (o->xlog[e] > -INFINITY && (best < 0 || o->xlog[e] > o->xlog[best])) best = e;
            if (best < 0) break;
            o->xlog[best] = -INFINITY;
            if (!mark[best]) { mark[best] = 1; pred[np++] = best; }
        }
    }
    o->xnpred[nl] = np;
    int evict = 1;
    for (int i = 0; i < np; i++) {
        int e = pred[i];
        if (!x_streamed(o, e) || o->xmap[(size_t)nl * (size_t)E + (size_t)e] >= 0) continue;
        int id = x_alloc(o, 1, nl, evict);
        if (id < 0) break;
        if (x_issue(o, id, nl, e)) {   /* a read that cannot start: leave it to the miss path */
            uint64_t b;
            (void)x_finish(o, id, &b);
            o->xmap[(size_t)nl * (size_t)E + (size_t)e] = -1;
            o->xe[id].state = X_FREE;
            ft_clear_error();
            continue;
        }
        o->xe[id].prefetched = 1;
        o->xe[id].tick = 0;   /* unused, a guess is the first to go */
    }
}

static ft_status x_fetch(void *user, int layer, const int *ex, int n, const float *x, int rows, ft_layer_weights *w)
{
    ft_offload *o = user;
    const int E = o->n_experts;
    if (!o->xmode || layer < o->lb || layer >= o->le || !w->experts || w->n_experts != E)
        return ft_set_error(FT_ERR_INVALID_ARG, "offload: experts of layer %d asked of the wrong scheduler", layer);
    ft_expert_stats ls;
    memset(&ls, 0, sizeof ls);
    double waited = 0;
    o->xtick++;
    o->xcur = layer;
    if (o->p.expert_evict == FT_EXPERT_LFU && o->xtick % (uint64_t)o->xcap == 0)
        for (int i = 0; i < o->xcap; i++) o->xe[i].freq >>= 1;
    for (int i = 0; i < o->xcap; i++) o->xe[i].pinned = 0;
    /* the prefetcher's accuracy for this layer */
    if (o->xnpred[layer]) {
        const int *pred = o->xpred + (size_t)layer * (size_t)E;
        ls.predicted = (uint64_t)o->xnpred[layer];
        for (int i = 0; i < o->xnpred[layer]; i++)
            for (int j = 0; j < n; j++) ls.predicted_used += pred[i] == ex[j];
        o->xnpred[layer] = 0;
    }
    ft_status st = FT_OK;
    /* resolve: every hit pinned first (a miss must not evict one), then
     * the misses issued, all at once */
    for (int j = 0; j < n; j++) {
        int e = ex[j];
        if (e < 0 || e >= E) return ft_set_error(FT_ERR_INVALID_ARG, "offload: expert %d of %d", e, E);
        ls.needed++;
        if (!x_streamed(o, e)) { ls.resident++; continue; }
        int id = o->xmap[(size_t)layer * (size_t)E + (size_t)e];
        if (id < 0) continue;
        x_entry *xe = &o->xe[id];
        ls.hits++;
        if (xe->prefetched) ls.prefetch_hits++;
        xe->prefetched = 0;
        xe->pinned = 1;
        xe->tick = o->xtick;
        xe->freq++;
    }
    for (int j = 0; j < n && !st; j++) {
        int e = ex[j];
        if (!x_streamed(o, e) || o->xmap[(size_t)layer * (size_t)E + (size_t)e] >= 0) continue;
        int id = x_alloc(o, 0, layer, 1);
        if (id < 0)
            return ft_set_error(FT_ERR_INTERNAL, "offload: the expert cache (%d entries) has no room", o->xcap);
        ls.misses++;
        st = x_issue(o, id, layer, e);
        o->xe[id].pinned = 1;
        o->xe[id].tick = o->xtick;
        o->xe[id].freq++;
    }
    /* finish the reads, bind the views */
    for (int j = 0; j < n; j++) {
        int e = ex[j];
        if (!x_streamed(o, e)) continue;
        int id = o->xmap[(size_t)layer * (size_t)E + (size_t)e];
        if (id < 0) continue;   /* its read could not start (st is set) */
        x_entry *xe = &o->xe[id];
        if (xe->state == X_LOADING) {
            double t0 = ft_now();
            uint64_t b = 0;
            ft_status r = x_finish(o, id, &b);
            waited += ft_now() - t0;
            ls.bytes += b;
            if (r) { if (!st) st = r; continue; }
        }
        for (int k = 0; k < 3; k++)
            if (o->slot[FT_LAYER_SLOTS + 3 * e + k].use == USE_EXPERT) w->experts[3 * e + k] = xe->view[k];
    }
    pthread_mutex_lock(&o->mu);
    ft_expert_stats *t = &o->xst[layer];
    t->needed += ls.needed;
    t->resident += ls.resident;
    t->hits += ls.hits;
    t->misses += ls.misses;
    t->prefetch_hits += ls.prefetch_hits;
    t->bytes += ls.bytes;
    t->predicted += ls.predicted;
    t->predicted_used += ls.predicted_used;
    o->st.wait_s += waited;
    pthread_mutex_unlock(&o->mu);
    if (st) return st;
    if (o->p.expert_prefetch) x_predict(o, layer, x, rows);
    return FT_OK;
}

/* Reads still in flight (prefetches) end before the stores close. */
static void x_drain(ft_offload *o)
{
    /* the caller's error message (a failed create) survives */
    char keep[512];
    snprintf(keep, sizeof keep, "%s", ft_last_error());
    int any = 0;
    for (int i = 0; o->xe && i < o->xcap; i++)
        if (o->xe[i].state == X_LOADING) {
            uint64_t b;
            (void)x_finish(o, i, &b);
            any = 1;
        }
    if (any) {
        if (keep[0]) (void)ft_set_error(FT_ERR_INTERNAL, "%s", keep);
        else ft_clear_error();
    }
}

ft_status ft_offload_expert_stats(const ft_offload *o, int layer, ft_expert_stats *out)
{
    if (!o || !out || layer < 0 || layer >= o->n_layers)
        return ft_set_error(FT_ERR_INVALID_ARG, "offload: expert stats of layer %d", layer);
    memset(out, 0, sizeof *out);
    if (!o->xst) return FT_OK;
    ft_offload *mo = (ft_offload *)(uintptr_t)o;
    pthread_mutex_lock(&mo->mu);
    *out = o->xst[layer];
    pthread_mutex_unlock(&mo->mu);
    return FT_OK;
}

void ft_offload_expert_cache(const ft_offload *o, int *entries, uint64_t *bytes)
{
    if (entries) *entries = o && o->xmode ? o->xcap : 0;
    if (bytes) *bytes = o && o->xmode ? (uint64_t)o->xcap * o->xstride : 0;
}
