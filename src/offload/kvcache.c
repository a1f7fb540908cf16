/* KV cache offloading: each sequence slot's cache lives on one tier (the
 * policy's c= shares, split by sequence as FlexGen splits it by batch),
 * encoded row by row (f32 rows, or q8/q4 groups along head_dim), and is
 * lent to the engine one layer at a time through the context's KV hooks.
 *
 * Device-tier slots keep every layer's cache resident (f32). For the other
 * slots an I/O thread works through a FIFO of jobs: FETCH decodes a layer's
 * cached rows into one of two staging buffers, STORE encodes the rows a
 * step appended and writes them to the tier. While layer l is computed the
 * thread writes back layer l-1's new rows and then fetches layer l+1 into
 * the other buffer; after the last layer it fetches layer 0 for the next
 * step (the same sequences, one token longer), so in steady decoding the
 * compute never waits for the cache unless the link is the bottleneck.
 * The FIFO order is what makes reusing a buffer safe: a buffer's write-back
 * is always queued before the next fetch into it.
 *
 * Host tier: encoded rows in DRAM. Disk tier: one file in the disk
 * directory (deleted on close), rows at fixed offsets, pread/pwrite.
 * Remote tier (memory nodes, the remote slots spread round robin): rows in
 * chunks of chunk_tokens tokens (default 64; K and V rows of a chunk in one tensor), put
 * once when the chunk's last row is written; the rows of the chunk being
 * filled stay encoded in host memory (the tail), so every row crosses
 * the link once and a fetch reads whole chunks, all in flight at once.
 * With replicas (policy rep=R) a chunk goes to R nodes (replica.h's rule,
 * placed at the slot's index among the remote slots); a fetch that fails
 * on one is issued again on the next, and a node that comes back gets the
 * chunks it missed from the others. */
#define _GNU_SOURCE   /* sync_file_range */
#include "flextier/offload.h"
#include "offload_internal.h"
#include "replica.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

enum { JOB_FETCH = 1, JOB_STORE = 2 };
#define JOBQ 4

typedef struct {
    int type, layer, buf, n;
    int *slot, *a, *b;      /* sequence slot; FETCH: rows [0, a); STORE: rows [a, a + b) */
    uint64_t id;
} kv_job;

struct ft_kv_offload {
    ft_kv_offload_params p;
    int n_layers, kvdim, bits;    /* bits 0: f32 rows */
    uint32_t group;
    size_t rec;                   /* bytes of one encoded row (K or V) */
    size_t row_f32;               /* kvdim floats */
    ft_tier *tier;                /* per slot */
    int *sidx;                    /* per slot: index among its tier's slots, or
                                     among the streamed slots for staging */
    int *tidx;                    /* per slot: index among its tier's slots */
    int n_tier[FT_TIER_COUNT];
    int n_streamed;
    float *resident;              /* [layer][dev slot][k|v][max_seq][kvdim] */
    float *staging[2];            /* [streamed slot][k|v][max_seq][kvdim] */
    uint8_t *host;                /* [layer][host slot][k|v][max_seq][rec] */
    int fd;                       /* disk tier file, -1 none */
    char path[FT_URI_MAX + 64];
    uint8_t *scratch;             /* I/O thread: max_seq * rec */
    /* remote tier */
    ft_store *remote[FT_MAX_REMOTES];
    uint8_t *tail;                /* [layer][remote slot][k|v][o->chunk][rec] */
    uint8_t *rbuf;                /* I/O thread: chunks in flight, n_remote * max_seq * 2 * rec */
    int *chunks_put;              /* [layer][remote slot]: highest chunk put + 1 */
    uint64_t session;             /* key prefix: this offloader's own chunks */
    int chunk;                    /* tokens per remote chunk */
    int n_remote, replicas;       /* memory nodes; copies of each chunk */
    ft_rset *rset;                /* replicas > 1: failover, re-replication */
    uint64_t io_put, io_read;     /* I/O thread's chunk counts for the current job */
    uint64_t io_retries;          /* ... and reads issued again on a replica */
    /* buffer tags (compute thread, under mu): layer and rows per streamed
     * slot that the buffer holds once job tag_job[b] is done */
    int tag_layer[2];
    int *tag_rows[2];
    uint64_t tag_job[2];
    int cur;                      /* buffer lent to the layer being computed */
    /* queue */
    pthread_t io;
    int io_started, stop;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    kv_job q[JOBQ];
    uint64_t next_id, done_id;
    unsigned q_head, q_len;
    ft_status err;
    char err_msg[256];
    ft_kv_offload_stats st;
};

void ft_kv_offload_default_params(ft_kv_offload_params *p)
{
    memset(p, 0, sizeof *p);
    ft_policy_default(&p->policy);
    p->group_size = FT_DEFAULT_GROUP_SIZE;
}

static float *res_ptr(const ft_kv_offload *o, int layer, int slot, int which)
{
    size_t S = (size_t)o->p.max_seq, nd = (size_t)o->n_tier[FT_TIER_DEVICE];
    return o->resident + ((((size_t)layer * nd + (size_t)o->tidx[slot]) * 2 + (size_t)which) * S) * o->row_f32;
}

static float *stage_ptr(const ft_kv_offload *o, int b, int si, int which)
{
    return o->staging[b] + (((size_t)si * 2 + (size_t)which) * (size_t)o->p.max_seq) * o->row_f32;
}

/* Offset (bytes) of row 0 of (layer, tier index, which) in the host array
 * or the disk file. */
static uint64_t tier_off(const ft_kv_offload *o, ft_tier t, int layer, int ti, int which)
{
    uint64_t n = (uint64_t)o->n_tier[t];
    return ((((uint64_t)layer * n + (uint64_t)ti) * 2 + (uint64_t)which) * (uint64_t)o->p.max_seq) * o->rec;
}

static ft_status io_full(int fd, void *buf, size_t n, uint64_t off, int wr, const char *path, int drop)
{
    uint8_t *p = buf;
    uint64_t off0 = off;
    size_t n0 = n;
    while (n) {
        ssize_t r = wr ? pwrite(fd, p, n, (off_t)off) : pread(fd, p, n, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0)
            return ft_set_error(FT_ERR_IO, "KV cache file %s: %s at offset %llu: %s", path, wr ? "write" : "read",
                                (unsigned long long)off, r < 0 ? strerror(errno) : "short read");
        p += r;
        n -= (size_t)r;
        off += (uint64_t)r;
    }
    /* Under a memory budget the cache file's pages must not stay in the
     * page cache (charged to this process's cgroup): rows written are
     * sent to the disk at once, rows read (clean) are dropped. */
    if (drop) {
        if (wr) (void)sync_file_range(fd, (off_t)off0, (off_t)n0,
                                      SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
        (void)posix_fadvise(fd, (off_t)off0, (off_t)n0, POSIX_FADV_DONTNEED);
    }
    return FT_OK;
}

/* Decode `rows` encoded rows into f32 rows. */
static void decode_rows(const ft_kv_offload *o, const uint8_t *src, int rows, float *dst)
{
    for (int r = 0; r < rows; r++)
        ft_qrow_decode(o->bits, src + (size_t)r * o->rec, (size_t)o->kvdim, o->group, dst + (size_t)r * o->row_f32);
}

static ft_status encode_rows(const ft_kv_offload *o, const float *src, int rows, uint8_t *dst)
{
    for (int r = 0; r < rows; r++) {
        ft_status st = ft_qrow_encode(o->bits, src + (size_t)r * o->row_f32, (size_t)o->kvdim, o->group,
                                      dst + (size_t)r * o->rec);
        if (st) return ft_set_error(st, "KV cache row %d: %s", r, ft_last_error());
    }
    return FT_OK;
}

/* Rows [r0, r0 + n) of (layer, slot, which): tier <-> f32 buffer `f`
 * (which holds row r0 at f). */
static ft_status move_rows(ft_kv_offload *o, int wr, int layer, int slot, int which, int r0, int n, float *f)
{
    ft_tier t = o->tier[slot];
    uint64_t off = tier_off(o, t, layer, o->tidx[slot], which) + (uint64_t)r0 * o->rec;
    size_t bytes = (size_t)n * o->rec;
    if (t == FT_TIER_HOST) {
        uint8_t *h = o->host + off;
        if (!o->bits) {
            if (wr) memcpy(h, f, bytes);
            else memcpy(f, h, bytes);
            return FT_OK;
        }
        if (wr) return encode_rows(o, f, n, h);
        decode_rows(o, h, n, f);
        return FT_OK;
    }
    /* disk */
    if (!o->bits) return io_full(o->fd, f, bytes, off, wr, o->path, o->p.drop_cache);
    ft_status st;
    if (wr) {
        if ((st = encode_rows(o, f, n, o->scratch))) return st;
        return io_full(o->fd, o->scratch, bytes, off, 1, o->path, o->p.drop_cache);
    }
    if ((st = io_full(o->fd, o->scratch, bytes, off, 0, o->path, o->p.drop_cache))) return st;
    decode_rows(o, o->scratch, n, f);
    return FT_OK;
}

/* ---------------------------------------------------------- remote tier */

static size_t chunk_bytes(const ft_kv_offload *o) { return 2 * o->chunk * o->rec; }

static void chunk_key(const ft_kv_offload *o, int layer, int slot, int chunk, char *key, size_t n)
{
    snprintf(key, n, "kvc-%016llx-l%d-s%d-c%d", (unsigned long long)o->session, layer, slot, chunk);
}

/* Node of replica j of a slot's chunks. */
static int slot_node_idx(const ft_kv_offload *o, int slot, int j)
{
    return (int)(((uint32_t)o->tidx[slot] + (uint32_t)j) % (uint32_t)o->n_remote);
}

static int *chunks_put_of(const ft_kv_offload *o, int layer, int slot)
{
    return &o->chunks_put[(size_t)layer * (size_t)o->n_tier[FT_TIER_REMOTE] + (size_t)o->tidx[slot]];
}

/* Row r (within its chunk: r % o->chunk) of (layer, slot, which) in the tail. */
static uint8_t *tail_row(const ft_kv_offload *o, int layer, int slot, int which, int r)
{
    size_t nr = (size_t)o->n_tier[FT_TIER_REMOTE];
    return o->tail + ((((size_t)layer * nr + (size_t)o->tidx[slot]) * 2 + (size_t)which) * o->chunk +
                      (size_t)(r % o->chunk)) * o->rec;
}

static void decode_into(const ft_kv_offload *o, const uint8_t *src, int rows, float *dst)
{
    if (o->bits) decode_rows(o, src, rows, dst);
    else memcpy(dst, src, (size_t)rows * o->rec);
}

/* Rows [0, n) of every sequence of a FETCH job on the remote tier: all
 * whole chunks requested at once, decoded as they arrive; the rest from
 * the tails. */
static ft_status remote_fetch(ft_kv_offload *o, const kv_job *j, uint64_t *rd)
{
    size_t nreq = 0, cap = 0;
    for (int i = 0; i < j->n; i++)
        if (o->tier[j->slot[i]] == FT_TIER_REMOTE) cap += (size_t)(j->a[i] / o->chunk);
    ft_request **req = cap ? calloc(cap, sizeof *req) : NULL;
    ft_tensor *dst = cap ? calloc(cap, sizeof *dst) : NULL;
    int *node = cap ? calloc(cap, sizeof *node) : NULL;
    if (cap && (!req || !dst || !node)) { free(req); free(dst); free(node); return FT_ERR_NOMEM; }
    ft_status st = FT_OK;
    size_t cb = chunk_bytes(o);
    for (int i = 0; i < j->n && st == FT_OK; i++) {
        int slot = j->slot[i];
        if (o->tier[slot] != FT_TIER_REMOTE) continue;
        for (int c = 0; c < j->a[i] / o->chunk && st == FT_OK; c++) {
            char key[96];
            chunk_key(o, j->layer, slot, c, key, sizeof key);
            dst[nreq].dtype = FT_U8;
            dst[nreq].data = o->rbuf + nreq * cb;
            node[nreq] = o->rset ? ft_rset_pick(o->rset, (uint32_t)o->tidx[slot], -1) : slot_node_idx(o, slot, 0);
            st = node[nreq] < 0 ? ft_set_error(FT_ERR_NET, "no live memory node holds %s", key)
                                : ft_read_tensor_async(o->remote[node[nreq]], key, &dst[nreq], cb, &req[nreq]);
            if (st) st = ft_set_error(st, "reading %s: %s", key, ft_last_error());
            else nreq++;
        }
    }
    o->io_read += nreq;
    size_t k = 0;
    for (int i = 0; i < j->n; i++) {
        int slot = j->slot[i], si = o->sidx[slot], n = j->a[i];
        if (o->tier[slot] != FT_TIER_REMOTE || n <= 0) continue;
        int full = n / o->chunk;
        for (int c = 0; c < full && k < nreq; c++, k++) {
            ft_status r = ft_request_wait(req[k], -1);
            /* a failed node: the same chunk from the next replica */
            for (int tries = 1; r != FT_OK && tries < o->replicas && ft_rset_failed(o->rset, node[k], r); tries++) {
                char key[96];
                chunk_key(o, j->layer, slot, c, key, sizeof key);
                ft_request_free(req[k]);
                req[k] = NULL;
                node[k] = ft_rset_pick(o->rset, (uint32_t)o->tidx[slot], node[k]);
                if (node[k] < 0) break;
                memset(&dst[k], 0, sizeof dst[k]);
                dst[k].dtype = FT_U8;
                dst[k].data = o->rbuf + k * cb;
                r = ft_read_tensor_async(o->remote[node[k]], key, &dst[k], cb, &req[k]);
                if (r == FT_OK) {
                    o->io_retries++;
                    r = ft_request_wait(req[k], -1);
                }
            }
            uint64_t ne = 0;
            if (r == FT_OK && (ft_tensor_numel(&dst[k], &ne) || ne != cb))
                r = ft_set_error(FT_ERR_CORRUPT, "a KV cache chunk of layer %d has %llu bytes, not %zu", j->layer,
                                 (unsigned long long)ne, cb);
            if (r && st == FT_OK) st = ft_set_error(r, "layer %d, slot %d, chunk %d: %s", j->layer, slot, c, ft_last_error());
            if (st) continue;
            const uint8_t *src = o->rbuf + k * cb;
            for (int w = 0; w < 2; w++)
                decode_into(o, src + (size_t)w * o->chunk * o->rec, o->chunk,
                            stage_ptr(o, j->buf, si, w) + (size_t)c * o->chunk * o->row_f32);
        }
        if (st) continue;
        for (int w = 0; w < 2; w++)
            for (int r = full * o->chunk; r < n; r++)
                decode_into(o, tail_row(o, j->layer, slot, w, r), 1, stage_ptr(o, j->buf, si, w) + (size_t)r * o->row_f32);
        rd[FT_TIER_REMOTE] += (uint64_t)n;
    }
    for (size_t q = 0; q < nreq; q++) ft_request_free(req[q]);
    free(req);
    free(dst);
    free(node);
    return st;
}

/* Rows [a, a + n) of one sequence: encoded into the tail; each chunk they
 * complete is put (all puts in flight at once, waited for here). */
static ft_status remote_store(ft_kv_offload *o, const kv_job *j, uint64_t *wr)
{
    size_t cb = chunk_bytes(o), nreq = 0, cap = 0, nbuf = 0;
    for (int i = 0; i < j->n; i++)
        if (o->tier[j->slot[i]] == FT_TIER_REMOTE) cap += (size_t)(j->b[i] / o->chunk + 1);
    size_t chunks_cap = cap;
    cap *= (size_t)o->replicas;
    ft_request **req = cap ? calloc(cap, sizeof *req) : NULL;
    ft_tensor *src = cap ? calloc(cap, sizeof *src) : NULL;
    int *node = cap ? calloc(cap, sizeof *node) : NULL, *chunk_of = cap ? calloc(cap, sizeof *chunk_of) : NULL;
    int *ok = chunks_cap ? calloc(chunks_cap, sizeof *ok) : NULL;
    if (cap && (!req || !src || !node || !chunk_of || !ok)) {
        free(req); free(src); free(node); free(chunk_of); free(ok);
        return FT_ERR_NOMEM;
    }
    ft_status st = FT_OK;
    for (int i = 0; i < j->n && st == FT_OK; i++) {
        int slot = j->slot[i], si = o->sidx[slot], a = j->a[i], n = j->b[i];
        if (o->tier[slot] != FT_TIER_REMOTE) continue;
        for (int r = a; r < a + n && st == FT_OK; r++) {
            for (int w = 0; w < 2 && st == FT_OK; w++) {
                const float *f = stage_ptr(o, j->buf, si, w) + (size_t)r * o->row_f32;
                uint8_t *t = tail_row(o, j->layer, slot, w, r);
                if (o->bits) st = encode_rows(o, f, 1, t);
                else memcpy(t, f, o->rec);
            }
            if (st || r % o->chunk != o->chunk - 1) continue;
            /* chunk complete: K rows then V rows, contiguous in the tail;
             * to every replica whose node takes writes */
            int c = r / o->chunk;
            uint8_t *buf = o->rbuf + nbuf * cb;
            memcpy(buf, tail_row(o, j->layer, slot, 0, 0), o->chunk * o->rec);
            memcpy(buf + o->chunk * o->rec, tail_row(o, j->layer, slot, 1, 0), o->chunk * o->rec);
            char key[96];
            chunk_key(o, j->layer, slot, c, key, sizeof key);
            for (int rj = 0; rj < o->replicas && st == FT_OK; rj++) {
                int nd = slot_node_idx(o, slot, rj);
                if (o->rset && !ft_rset_writable(o->rset, nd)) continue;
                src[nreq].dtype = FT_U8;
                src[nreq].ndim = 1;
                src[nreq].shape[0] = (int64_t)cb;
                src[nreq].data = buf;
                node[nreq] = nd;
                chunk_of[nreq] = (int)nbuf;
                st = ft_write_tensor_async(o->remote[nd], key, &src[nreq], NULL, &req[nreq]);
                if (st) st = ft_set_error(st, "writing %s: %s", key, ft_last_error());
                else nreq++;
            }
            nbuf++;
            pthread_mutex_lock(&o->mu);   /* the repair thread reads it */
            int *cp = chunks_put_of(o, j->layer, slot);
            if (*cp < c + 1) *cp = c + 1;
            pthread_mutex_unlock(&o->mu);
        }
        wr[FT_TIER_REMOTE] += (uint64_t)n;
    }
    o->io_put += nbuf;
    /* a chunk is stored once one replica has it; a node that failed is
     * left to the repair thread, which copies what it missed */
    ft_status first = FT_OK;
    for (size_t q = 0; q < nreq; q++) {
        ft_status r = ft_request_wait(req[q], -1);
        ft_request_free(req[q]);
        if (r == FT_OK) ok[chunk_of[q]] = 1;
        else if (!ft_rset_failed(o->rset, node[q], r) && first == FT_OK)
            first = ft_set_error(r, "writing a KV cache chunk of layer %d: %s", j->layer, ft_last_error());
    }
    for (size_t q = 0; q < nbuf && st == FT_OK && first == FT_OK; q++)
        if (!ok[q]) st = ft_set_error(FT_ERR_NET, "a KV cache chunk of layer %d reached no memory node", j->layer);
    if (st == FT_OK) st = first;
    free(req);
    free(src);
    free(node);
    free(chunk_of);
    free(ok);
    return st;
}

static ft_status run_job(ft_kv_offload *o, const kv_job *j, uint64_t *rd, uint64_t *wr)
{
    if (o->n_tier[FT_TIER_REMOTE]) {
        ft_status st = j->type == JOB_FETCH ? remote_fetch(o, j, rd) : remote_store(o, j, wr);
        if (st) return ft_set_error(st, "KV cache on the remote tier: %s", ft_last_error());
    }
    for (int i = 0; i < j->n; i++) {
        int slot = j->slot[i], si = o->sidx[slot];
        int r0 = j->type == JOB_FETCH ? 0 : j->a[i];
        int n = j->type == JOB_FETCH ? j->a[i] : j->b[i];
        if (n <= 0 || o->tier[slot] == FT_TIER_REMOTE) continue;
        for (int w = 0; w < 2; w++) {
            float *f = stage_ptr(o, j->buf, si, w) + (size_t)r0 * o->row_f32;
            ft_status st = move_rows(o, j->type == JOB_STORE, j->layer, slot, w, r0, n, f);
            if (st)
                return ft_set_error(st, "KV cache of layer %d, sequence slot %d (%s tier): %s", j->layer, slot,
                                    ft_tier_name(o->tier[slot]), ft_last_error());
        }
        rd[o->tier[slot]] += j->type == JOB_FETCH ? (uint64_t)n : 0;
        wr[o->tier[slot]] += j->type == JOB_STORE ? (uint64_t)n : 0;
    }
    return FT_OK;
}

static void *io_main(void *arg)
{
    ft_kv_offload *o = arg;
    pthread_mutex_lock(&o->mu);
    for (;;) {
        while (!o->stop && o->q_len == 0) pthread_cond_wait(&o->cv, &o->mu);
        if (o->stop) break;
        kv_job *j = &o->q[o->q_head];
        pthread_mutex_unlock(&o->mu);
        uint64_t rd[FT_TIER_COUNT] = {0}, wr[FT_TIER_COUNT] = {0};
        double t0 = ft_now();
        ft_clear_error();
        ft_status st = o->err ? FT_OK : run_job(o, j, rd, wr);
        double dt = ft_now() - t0;
        pthread_mutex_lock(&o->mu);
        uint64_t rows2 = 2ull * (uint64_t)o->row_f32 * 4;
        for (int t = 0; t < FT_TIER_COUNT; t++) {
            o->st.read_logical[t] += rd[t] * rows2;
            o->st.read_stored[t] += rd[t] * 2 * o->rec;
            o->st.written_logical[t] += wr[t] * rows2;
            o->st.written_stored[t] += wr[t] * 2 * o->rec;
        }
        o->st.io_busy_s += dt;
        o->st.chunks_put += o->io_put;
        o->st.chunks_read += o->io_read;
        o->st.retries += o->io_retries;
        o->io_put = o->io_read = o->io_retries = 0;
        if (j->type == JOB_FETCH) o->st.fetches++;
        if (st && !o->err) {
            o->err = st;
            snprintf(o->err_msg, sizeof o->err_msg, "%s", ft_last_error());
        }
        o->done_id = j->id;
        o->q_head = (o->q_head + 1) % JOBQ;
        o->q_len--;
        pthread_cond_broadcast(&o->cv);
    }
    pthread_mutex_unlock(&o->mu);
    return NULL;
}

/* Queue a job for the step's streamed sequences (caller holds mu). FETCH
 * reads rows [0, past + (next ? ntok : 0)); STORE writes [past, past+ntok). */
static uint64_t enqueue(ft_kv_offload *o, int type, int layer, int buf, const ft_kv_step *s, int next)
{
    while (o->q_len == JOBQ) pthread_cond_wait(&o->cv, &o->mu);
    kv_job *j = &o->q[(o->q_head + o->q_len) % JOBQ];
    j->type = type;
    j->layer = layer;
    j->buf = buf;
    j->n = 0;
    for (size_t i = 0; i < s->n; i++) {
        int slot = s->slots[i];
        if (o->tier[slot] == FT_TIER_DEVICE) continue;
        j->slot[j->n] = slot;
        j->a[j->n] = s->past[i] + (next ? (int)s->ntok[i] : 0);
        j->b[j->n] = (int)s->ntok[i];
        j->n++;
    }
    j->id = ++o->next_id;
    o->q_len++;
    pthread_cond_broadcast(&o->cv);
    return j->id;
}

/* Tag buffer b as holding `layer` with the step's rows (past, or past +
 * ntok for the next step), fetched by job id. */
static void tag(ft_kv_offload *o, int b, int layer, const ft_kv_step *s, int next, uint64_t id)
{
    o->tag_layer[b] = layer;
    o->tag_job[b] = id;
    for (int i = 0; i < o->n_streamed; i++) o->tag_rows[b][i] = -1;
    for (size_t i = 0; i < s->n; i++) {
        int slot = s->slots[i];
        if (o->tier[slot] != FT_TIER_DEVICE) o->tag_rows[b][o->sidx[slot]] = s->past[i] + (next ? (int)s->ntok[i] : 0);
    }
}

static int holds(const ft_kv_offload *o, int b, int layer, const ft_kv_step *s)
{
    if (o->tag_layer[b] != layer) return 0;
    for (size_t i = 0; i < s->n; i++) {
        int slot = s->slots[i];
        if (o->tier[slot] != FT_TIER_DEVICE && s->past[i] > 0 && o->tag_rows[b][o->sidx[slot]] != s->past[i])
            return 0;
    }
    return 1;
}

static ft_status wait_job(ft_kv_offload *o, uint64_t id)
{
    double t0 = ft_now();
    while (o->done_id < id && !o->err) pthread_cond_wait(&o->cv, &o->mu);
    o->st.wait_s += ft_now() - t0;
    if (o->err) return ft_set_error(o->err, "%s", o->err_msg);
    return FT_OK;
}

static ft_status check_step(const ft_kv_offload *o, const ft_kv_step *s)
{
    for (size_t i = 0; i < s->n; i++)
        if (s->slots[i] < 0 || s->slots[i] >= o->p.max_batch || s->past[i] < 0 ||
            (size_t)s->past[i] + s->ntok[i] > (size_t)o->p.max_seq)
            return ft_set_error(FT_ERR_INVALID_ARG, "KV offload: slot %d with %d + %zu tokens is outside "
                                "the %d x %d cache", s->slots[i], s->past[i], s->ntok[i], o->p.max_batch,
                                o->p.max_seq);
    return FT_OK;
}

static ft_status kv_load(void *arg, int layer, const ft_kv_step *s, float **k, float **v)
{
    ft_kv_offload *o = arg;
    if (layer < 0 || layer >= o->n_layers) return FT_ERR_INVALID_ARG;
    ft_status st = check_step(o, s);
    if (st) return st;
    int b = 0;
    if (o->n_streamed) {
        pthread_mutex_lock(&o->mu);
        b = holds(o, 0, layer, s) ? 0 : holds(o, 1, layer, s) ? 1 : -1;
        if (b < 0) {
            /* Not prefetched (first layer of a new batch, or the sequences
             * changed): fetch now. The other buffer is free: its layer was
             * computed and its write-back is ahead in the queue. */
            b = 1 - o->cur;
            tag(o, b, layer, s, 0, enqueue(o, JOB_FETCH, layer, b, s, 0));
        } else {
            o->st.prefetch_hits++;
        }
        st = wait_job(o, o->tag_job[b]);
        if (st == FT_OK) {
            o->cur = b;
            if (layer + 1 < o->n_layers) tag(o, 1 - b, layer + 1, s, 0, enqueue(o, JOB_FETCH, layer + 1, 1 - b, s, 0));
        }
        pthread_mutex_unlock(&o->mu);
        if (st) return st;
    }
    for (size_t i = 0; i < s->n; i++) {
        int slot = s->slots[i];
        if (o->tier[slot] == FT_TIER_DEVICE) {
            k[i] = res_ptr(o, layer, slot, 0);
            v[i] = res_ptr(o, layer, slot, 1);
        } else {
            k[i] = stage_ptr(o, b, o->sidx[slot], 0);
            v[i] = stage_ptr(o, b, o->sidx[slot], 1);
        }
    }
    return FT_OK;
}

static ft_status kv_store(void *arg, int layer, const ft_kv_step *s, float *const *k, float *const *v)
{
    ft_kv_offload *o = arg;
    (void)k;
    (void)v;
    if (!o->n_streamed) return FT_OK;
    pthread_mutex_lock(&o->mu);
    ft_status st = o->err ? ft_set_error(o->err, "%s", o->err_msg) : FT_OK;
    if (st == FT_OK) {
        enqueue(o, JOB_STORE, layer, o->cur, s, 0);
        /* The buffer's rows past `past` are the step's f32 rows, not what
         * the tier returns (q8/q4): never reuse it for the next step. */
        o->tag_layer[o->cur] = -1;
        if (layer == o->n_layers - 1)   /* the next step's layer 0, speculatively */
            tag(o, 1 - o->cur, 0, s, 1, enqueue(o, JOB_FETCH, 0, 1 - o->cur, s, 1));
    }
    pthread_mutex_unlock(&o->mu);
    return st;
}

void ft_kv_offload_hooks(ft_kv_offload *o, ft_kv_hooks *out)
{
    out->load = kv_load;
    out->store = kv_store;
    out->user = o;
}

/* The chunks node `node` should hold (replica.h): of every remote slot
 * one of whose replicas it is, every chunk put so far. */
static ft_status repair_chunks(void *user, int node, ft_rset_visit visit, void *vctx)
{
    ft_kv_offload *o = user;
    for (int l = 0; l < o->n_layers; l++)
        for (int s = 0; s < o->p.max_batch; s++) {
            if (o->tier[s] != FT_TIER_REMOTE) continue;
            int mine = 0;
            for (int j = 0; j < o->replicas; j++) mine |= slot_node_idx(o, s, j) == node;
            if (!mine) continue;
            pthread_mutex_lock(&o->mu);
            int n = *chunks_put_of(o, l, s);
            pthread_mutex_unlock(&o->mu);
            for (int c = 0; c < n; c++) {
                char key[96];
                chunk_key(o, l, s, c, key, sizeof key);
                ft_status st = visit(vctx, key, (uint32_t)o->tidx[s]);
                if (st) return st;
            }
        }
    return FT_OK;
}

ft_status ft_kv_offload_create(const ft_model *m, const ft_kv_offload_params *p, ft_kv_offload **out)
{
    if (!m || !p || !out) return FT_ERR_INVALID_ARG;
    const ft_policy *pol = &p->policy;
    ft_status st = ft_policy_validate(pol);
    if (st) return st;
    if (p->max_batch < 1 || p->max_seq < 1)
        return ft_set_error(FT_ERR_INVALID_ARG, "KV offload: %d sequences of %d tokens", p->max_batch, p->max_seq);
    ft_kv_offload *o = calloc(1, sizeof *o);
    if (!o) return FT_ERR_NOMEM;
    o->p = *p;
    o->fd = -1;
    o->n_layers = ft_model_get_config(m)->n_layers;
    o->kvdim = ft_model_get_config(m)->n_kv_heads * ft_model_get_config(m)->head_dim;
    o->row_f32 = (size_t)o->kvdim;
    o->chunk = p->chunk_tokens ? (int)p->chunk_tokens : 64;
    o->n_remote = (int)pol->n_remotes;
    o->replicas = pol->replicas > 1 ? (int)pol->replicas : 1;
    o->tag_layer[0] = o->tag_layer[1] = -1;
    pthread_mutex_init(&o->mu, NULL);
    pthread_cond_init(&o->cv, NULL);
    int B = p->max_batch;
    size_t S = (size_t)p->max_seq;

    ft_codec_id cc = pol->compress_cache;
    if (cc == FT_CODEC_Q4 || cc == FT_CODEC_Q8) {
        o->bits = cc == FT_CODEC_Q4 ? 4 : 8;
        /* groups along head_dim (FlexGen: 64); a head_dim that 64 does not
         * divide is one group per head */
        uint32_t g = p->group_size ? p->group_size : FT_DEFAULT_GROUP_SIZE;
        if ((uint32_t)ft_model_get_config(m)->head_dim % g) g = (uint32_t)ft_model_get_config(m)->head_dim;
        o->group = g;
        o->rec = ft_qrow_bytes(o->bits, o->row_f32, g);
    } else if (cc == FT_CODEC_RAW) {
        o->rec = o->row_f32 * 4;
    } else {
        st = ft_set_error(FT_ERR_INVALID_ARG, "KV offload: cache compression is none, q8 or q4");
        goto fail;
    }

    /* Place the slots: FlexGen's rule over equal-sized sequences. */
    o->tier = calloc((size_t)B, sizeof *o->tier);
    o->sidx = calloc((size_t)B, sizeof *o->sidx);
    o->tidx = calloc((size_t)B, sizeof *o->tidx);
    uint64_t *ones = calloc((size_t)B, sizeof *ones);
    if (!o->tier || !o->sidx || !o->tidx || !ones) { free(ones); st = FT_ERR_NOMEM; goto fail; }
    for (int i = 0; i < B; i++) ones[i] = 1;
    ft_policy cp = *pol;
    memcpy(cp.w_pct, pol->c_pct, sizeof cp.w_pct);
    ft_policy_place(&cp, ones, (size_t)B, o->tier);
    free(ones);
    for (int i = 0; i < B; i++) {
        o->tidx[i] = o->n_tier[o->tier[i]]++;
        o->sidx[i] = o->tier[i] == FT_TIER_DEVICE ? -1 : o->n_streamed++;
    }

    uint64_t row2 = 2 * (uint64_t)S * o->row_f32 * 4;   /* K + V of one (layer, slot), f32 */
    o->st.resident_bytes = (uint64_t)o->n_layers * (uint64_t)o->n_tier[FT_TIER_DEVICE] * row2;
    o->st.staging_bytes = o->n_streamed ? 2ull * (uint64_t)o->n_streamed * row2 : 0;
    for (int t = FT_TIER_HOST; t < FT_TIER_COUNT; t++)
        o->st.tier_bytes[t] = (uint64_t)o->n_layers * (uint64_t)o->n_tier[t] * 2 * (uint64_t)S * o->rec;
    /* the remote tier holds whole chunks (the tail is host memory) */
    o->st.tier_bytes[FT_TIER_REMOTE] = (uint64_t)o->n_layers * (uint64_t)o->n_tier[FT_TIER_REMOTE] *
                                       ((uint64_t)S / o->chunk) * chunk_bytes(o);
    if (p->device_budget && o->st.resident_bytes + o->st.staging_bytes > p->device_budget) {
        st = ft_set_error(FT_ERR_NO_SPACE, "KV offload: the cache policy needs %.1f MiB of device memory "
                          "(%.1f resident + %.1f for two staging buffers), %.1f MiB left in the budget",
                          (double)(o->st.resident_bytes + o->st.staging_bytes) / 1048576.0,
                          (double)o->st.resident_bytes / 1048576.0, (double)o->st.staging_bytes / 1048576.0,
                          (double)p->device_budget / 1048576.0);
        goto fail;
    }
    if (o->st.resident_bytes && !(o->resident = ft_malloc_aligned((size_t)o->st.resident_bytes, 64))) {
        st = ft_set_error(FT_ERR_NOMEM, "KV offload: %.1f MiB of resident cache",
                          (double)o->st.resident_bytes / 1048576.0);
        goto fail;
    }
    if (o->n_streamed) {
        for (int b = 0; b < 2; b++) {
            o->staging[b] = ft_malloc_aligned((size_t)o->st.staging_bytes / 2, 64);
            o->tag_rows[b] = calloc((size_t)o->n_streamed, sizeof(int));
            if (!o->staging[b] || !o->tag_rows[b]) {
                st = ft_set_error(FT_ERR_NOMEM, "KV offload: staging buffers");
                goto fail;
            }
        }
        for (int i = 0; i < JOBQ; i++) {
            o->q[i].slot = calloc((size_t)B, sizeof(int));
            o->q[i].a = calloc((size_t)B, sizeof(int));
            o->q[i].b = calloc((size_t)B, sizeof(int));
            if (!o->q[i].slot || !o->q[i].a || !o->q[i].b) { st = FT_ERR_NOMEM; goto fail; }
        }
    }
    if (o->n_tier[FT_TIER_HOST] && !(o->host = malloc((size_t)o->st.tier_bytes[FT_TIER_HOST]))) {
        st = ft_set_error(FT_ERR_NOMEM, "KV offload: %.1f MiB of host cache",
                          (double)o->st.tier_bytes[FT_TIER_HOST] / 1048576.0);
        goto fail;
    }
    if (o->n_tier[FT_TIER_DISK]) {
        const char *dir = pol->disk_uri;
        if (!strncmp(dir, "file:", 5)) dir += 5;
        if (mkdir(dir, 0755) != 0 && errno != EEXIST) {   /* as the file: store does */
            st = ft_set_error(FT_ERR_IO, "KV offload: cannot create %s: %s", dir, strerror(errno));
            goto fail;
        }
        snprintf(o->path, sizeof o->path, "%s/kv-cache-XXXXXX", dir);
        o->fd = mkstemp(o->path);
        if (o->fd < 0) {
            st = ft_set_error(FT_ERR_IO, "KV offload: cannot create a cache file in %s: %s", dir, strerror(errno));
            goto fail;
        }
        unlink(o->path);   /* gone when closed, even after a crash */
        if (ftruncate(o->fd, (off_t)o->st.tier_bytes[FT_TIER_DISK])) {
            st = ft_set_error(FT_ERR_IO, "KV offload: cache file of %.1f MiB in %s: %s",
                              (double)o->st.tier_bytes[FT_TIER_DISK] / 1048576.0, dir, strerror(errno));
            goto fail;
        }
        if (o->bits && !(o->scratch = malloc(S * o->rec))) { st = FT_ERR_NOMEM; goto fail; }
    }
    if (o->n_tier[FT_TIER_REMOTE]) {
        size_t nr = (size_t)o->n_tier[FT_TIER_REMOTE];
        o->tail = malloc((size_t)o->n_layers * nr * chunk_bytes(o));
        o->rbuf = malloc(nr * (S / o->chunk + 1) * chunk_bytes(o));
        o->chunks_put = calloc((size_t)o->n_layers * nr, sizeof(int));
        if (!o->tail || !o->rbuf || !o->chunks_put) { st = FT_ERR_NOMEM; goto fail; }
        uint64_t seed = (uint64_t)(ft_now() * 1e9) ^ ((uint64_t)time(NULL) << 20) ^ ((uint64_t)getpid() << 40) ^
                        (uint64_t)(uintptr_t)o;
        o->session = ft_rand_u64(&seed);
        ft_store_params sp;
        ft_store_default_params(&sp);
        sp.token_file = p->token_file;
        sp.codec_threads = 1;
        sp.queue_depth = 16;   /* small chunks: many in flight */
        /* with replicas a node whose link went silent is given up on */
        if (o->replicas > 1) sp.timeout_ms = p->failover_ms ? (int)p->failover_ms : 1000;
        for (uint32_t r = 0; r < pol->n_remotes && (o->replicas > 1 || r < (uint32_t)o->n_tier[FT_TIER_REMOTE]); r++)
            if ((st = ft_store_open(pol->remotes[r], &sp, &o->remote[r]))) {
                st = ft_set_error(st, "KV offload: cannot open %s: %s", pol->remotes[r], ft_last_error());
                goto fail;
            }
        if (o->replicas > 1) {
            const char *names[FT_MAX_REMOTES];
            for (int r = 0; r < o->n_remote; r++) names[r] = pol->remotes[r];
            ft_rset_params rp = {.n = o->n_remote, .replicas = o->replicas, .stores = o->remote, .names = names,
                                 .each = repair_chunks, .user = o, .what = "offload (KV cache)"};
            if ((st = ft_rset_create(&rp, &o->rset))) goto fail;
        }
    }
    if (o->n_streamed) {
        if (pthread_create(&o->io, NULL, io_main, o)) {
            st = ft_set_error(FT_ERR_NOMEM, "KV offload: I/O thread");
            goto fail;
        }
        o->io_started = 1;
    }
    *out = o;
    return FT_OK;
fail:
    ft_kv_offload_free(o);
    return st;
}

void ft_kv_offload_free(ft_kv_offload *o)
{
    if (!o) return;
    if (o->io_started) ft_io_thread_stop(&o->mu, &o->cv, &o->stop, o->io);
    ft_rset_free(o->rset);
    if (o->fd >= 0) close(o->fd);
    /* the remote chunks are this run's only: delete them (best effort),
     * from every replica of a node that is up */
    for (int l = 0; o->chunks_put && l < o->n_layers; l++)
        for (int s = 0; s < o->p.max_batch; s++) {
            if (o->tier[s] != FT_TIER_REMOTE) continue;
            int n = *chunks_put_of(o, l, s);
            for (int c = 0; c < n; c++) {
                char key[96];
                chunk_key(o, l, s, c, key, sizeof key);
                for (int j = 0; j < o->replicas; j++) {
                    int nd = slot_node_idx(o, s, j);
                    if (o->remote[nd]) ft_delete_tensor(o->remote[nd], key);
                }
            }
        }
    for (int r = 0; r < FT_MAX_REMOTES; r++) ft_store_close(o->remote[r]);
    free(o->tail);
    free(o->rbuf);
    free(o->chunks_put);
    for (int i = 0; i < JOBQ; i++) { free(o->q[i].slot); free(o->q[i].a); free(o->q[i].b); }
    for (int b = 0; b < 2; b++) { ft_free_aligned(o->staging[b]); free(o->tag_rows[b]); }
    ft_free_aligned(o->resident);
    free(o->host);
    free(o->scratch);
    free(o->tier);
    free(o->sidx);
    free(o->tidx);
    pthread_mutex_destroy(&o->mu);
    pthread_cond_destroy(&o->cv);
    free(o);
}

/* Wait until every queued job is done (write-backs included). */
ft_status ft_kv_offload_sync(ft_kv_offload *o)
{
    if (!o || !o->n_streamed) return FT_OK;
    pthread_mutex_lock(&o->mu);
    ft_status st = wait_job(o, o->next_id);
    pthread_mutex_unlock(&o->mu);
    return st;
}

void ft_kv_offload_get_stats(const ft_kv_offload *o, ft_kv_offload_stats *out)
{
    ft_kv_offload *mo = (ft_kv_offload *)o;
    pthread_mutex_lock(&mo->mu);
    *out = o->st;
    pthread_mutex_unlock(&mo->mu);
}

void ft_kv_offload_reset_stats(ft_kv_offload *o)
{
    pthread_mutex_lock(&o->mu);
    ft_kv_offload_stats keep = o->st;
    memset(&o->st, 0, sizeof o->st);
    o->st.resident_bytes = keep.resident_bytes;
    o->st.staging_bytes = keep.staging_bytes;
    memcpy(o->st.tier_bytes, keep.tier_bytes, sizeof keep.tier_bytes);
    pthread_mutex_unlock(&o->mu);
}

ft_tier ft_kv_offload_tier_of(const ft_kv_offload *o, int slot)
{
    return o && slot >= 0 && slot < o->p.max_batch ? o->tier[slot] : FT_TIER_DEVICE;
}
