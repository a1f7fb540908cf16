/* The server's scheduler: one thread owns the session and runs continuous
 * batching over its slots (include/flextier/server.h). Each step is one
 * ft_session_forward: a token for every request that is decoding, then
 * prompt chunks of the requests being prefilled, up to step_tokens rows.
 * Requests are admitted from a bounded queue whenever a slot is free, and
 * leave as soon as they finish (EOS, a stop string, max_tokens, the end of
 * the slot, or their client going away).
 *
 * Prefix cache: a slot's cached tokens stay after its request is done.
 * Each slot keeps the chained hashes of its complete 16-token blocks
 * (hash k covers tokens [0, 16 (k + 1))); a new prompt's chain is compared
 * with every slot's to find the longest shared run of blocks, which is
 * then verified and extended token by token. The request takes that slot
 * (truncated to the shared prefix) when it is idle, or a free slot into
 * which the prefix is copied when the best match is busy, and prefills
 * only what follows. At least one prompt token is always computed (its
 * logits give the first new token). */
#include "server_internal.h"
#include "flextier/store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define XXH_INLINE_ALL   /* header-only: the hash of the prefix blocks */
#include <xxhash.h>

#define BLOCK 16
#define MIN_COPY 16   /* a shorter shared prefix is not worth copying */
#define MIN_SPILL 64  /* a shorter prefix is not worth keeping in the store */

/* A prefix kept in the prefix store: its tokens (whole blocks) and their
 * chained block hashes, under key. */
typedef struct {
    char key[64];
    int32_t *toks;
    uint64_t *bh;
    int ntoks;
    uint64_t lru;
} pfx_entry;

typedef struct {
    srv_req *req;          /* NULL: idle (its cache kept for reuse)      */
    int32_t *toks;         /* the tokens whose KV the slot holds         */
    int ntoks;
    uint64_t *bh;          /* chained hashes of complete blocks          */
    uint64_t lru;
} slot_t;

struct srv_sched {
    ft_session *s;
    const ft_tokenizer *tok;
    const ft_model_config *cfg;
    int nslots, max_seq, chunk, step_rows, qmax, prefix;
    slot_t *slots;
    ft_sampler *sampler;
    float *logits;
    int *b_slot;
    const int32_t **b_tok;
    size_t *b_n;
    srv_req **b_req;
    int32_t *b_one;        /* per batch row: a decode step's token       */
    uint64_t clock;
    pthread_t th;
    int started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop;
    srv_req *qhead, *qtail;
    unsigned qlen;
    unsigned inflight;     /* queued + in slots                         */
    int stats_dirty;       /* steps ran since the last stats snapshot   */
    srv_metrics m;         /* under mu                                  */
    /* the prefix store (NULL: none) */
    ft_store *pstore;
    pfx_entry *pe;
    int npe, maxpe;
    ft_dtype kvdt;
    size_t row_bytes;
    uint8_t *pbuf;
    size_t pbuf_cap;
    double tps_t0;
    uint64_t tps_n0;
};

srv_req *srv_req_new(void)
{
    srv_req *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    atomic_init(&r->refs, 1);
    atomic_init(&r->cancel, 0);
    r->slot = -1;
    r->pending = -1;
    return r;
}

void srv_req_unref(srv_req *r)
{
    if (!r || atomic_fetch_sub(&r->refs, 1) != 1) return;
    free(r->prompt);
    for (size_t i = 0; i < r->nstop; i++) free(r->stop[i]);
    free(r->gen);
    ft_detok_free(r->dt);
    free(r->text);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r);
}

int srv_ctx_len(const srv_sched *q) { return q->max_seq; }

/* ------------------------------------------------------- prefix cache */

static uint64_t block_hash(uint64_t prev, const int32_t *t)
{
    return XXH3_64bits_withSeed(t, BLOCK * sizeof *t, prev);
}

static void slot_set_len(slot_t *sl, int len) { sl->ntoks = len; }

static void slot_append(slot_t *sl, const int32_t *t, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        sl->toks[sl->ntoks++] = t[i];
        if (sl->ntoks % BLOCK == 0) {
            int k = sl->ntoks / BLOCK - 1;
            sl->bh[k] = block_hash(k ? sl->bh[k - 1] : 0, sl->toks + (size_t)k * BLOCK);
        }
    }
}

/* The shared prefix of cached tokens (ntoks, with their block hashes bh)
 * and a prompt whose block hashes are ph (np complete blocks). */
static int shared_prefix_of(const int32_t *toks, const uint64_t *bh, int ntoks, const int32_t *p, size_t plen,
                            const uint64_t *ph, size_t np)
{
    size_t nb = (size_t)ntoks / BLOCK, k = 0;
    while (k < nb && k < np && bh[k] == ph[k]) k++;
    size_t L = 0;
    /* verify (a hash collision must not hand out another prompt's cache) */
    while (L < k * BLOCK && toks[L] == p[L]) L++;
    if (L == k * BLOCK)
        while (L < (size_t)ntoks && L < plen && toks[L] == p[L]) L++;
    return (int)L;
}

static int shared_prefix(const slot_t *sl, const int32_t *p, size_t plen, const uint64_t *ph, size_t np)
{
    return shared_prefix_of(sl->toks, sl->bh, sl->ntoks, p, plen, ph, np);
}

/* ------------------------------------------------------- prefix store */

static size_t pfx_bytes(const srv_sched *q, int rows)
{
    return 2 * (size_t)q->cfg->n_layers * (size_t)rows * q->row_bytes;
}

static void pfx_drop(srv_sched *q, int i)
{
    ft_delete_tensor(q->pstore, q->pe[i].key);
    ft_clear_error();
    free(q->pe[i].toks);
    free(q->pe[i].bh);
    q->pe[i] = q->pe[--q->npe];
}

/* Keep slot i's cached prefix (whole blocks) in the store before the slot
 * is reused, unless it is short or already kept. */
static void pfx_spill(srv_sched *q, int i, int keep)
{
    slot_t *sl = &q->slots[i];
    int len = sl->ntoks / BLOCK * BLOCK;
    if (!q->pstore || len < MIN_SPILL || len <= keep) return;
    uint64_t h = sl->bh[len / BLOCK - 1];
    for (int e = 0; e < q->npe; e++)
        if (q->pe[e].ntoks >= len && q->pe[e].bh[len / BLOCK - 1] == h &&
            !memcmp(q->pe[e].toks, sl->toks, (size_t)len * sizeof *sl->toks)) {
            q->pe[e].lru = ++q->clock;   /* already kept (or a longer one) */
            return;
        }
    if (q->npe == q->maxpe) {
        int old = 0;
        for (int e = 1; e < q->npe; e++)
            if (q->pe[e].lru < q->pe[old].lru) old = e;
        pfx_drop(q, old);
    }
    pfx_entry *pe = &q->pe[q->npe];
    memset(pe, 0, sizeof *pe);
    snprintf(pe->key, sizeof pe->key, "ftpfx-%016llx-%d", (unsigned long long)h, len);
    pe->toks = malloc((size_t)len * sizeof *pe->toks);
    pe->bh = malloc((size_t)(len / BLOCK) * sizeof *pe->bh);
    ft_tensor t;
    int64_t shape[3] = {2 * (int64_t)q->cfg->n_layers, len, (int64_t)(q->row_bytes / (ft_dtype_bits(q->kvdt) / 8))};
    ft_status st = !pe->toks || !pe->bh ? ft_set_error(FT_ERR_NOMEM, "allocation")
                 : ft_session_slot_kv_rows(q->s, i, len, q->pbuf, q->pbuf_cap, 0, len);
    if (!st) st = ft_tensor_init(&t, q->kvdt, 3, shape, q->pbuf);
    if (!st) st = ft_write_tensor(q->pstore, pe->key, &t, NULL);
    if (st) {
        ft_log(FT_LOG_WARN, "server: keeping a prefix of %d tokens in the prefix store failed: %s", len,
               ft_last_error());
        ft_clear_error();
        free(pe->toks);
        free(pe->bh);
        return;
    }
    memcpy(pe->toks, sl->toks, (size_t)len * sizeof *pe->toks);
    memcpy(pe->bh, sl->bh, (size_t)(len / BLOCK) * sizeof *pe->bh);
    pe->ntoks = len;
    pe->lru = ++q->clock;
    q->npe++;
    pthread_mutex_lock(&q->mu);
    q->m.store_spills++;
    q->m.store_spilled_tokens += (uint64_t)len;
    pthread_mutex_unlock(&q->mu);
}

/* Bring L tokens of entry e into slot i. */
static int pfx_restore(srv_sched *q, int e, int i, int L)
{
    pfx_entry *pe = &q->pe[e];
    ft_tensor t;
    memset(&t, 0, sizeof t);
    t.dtype = q->kvdt;
    t.data = q->pbuf;
    ft_status st = ft_read_tensor_into(q->pstore, pe->key, &t, q->pbuf_cap);
    if (!st && (t.ndim != 3 || t.shape[1] != pe->ntoks || t.shape[0] != 2 * (int64_t)q->cfg->n_layers))
        st = ft_set_error(FT_ERR_CORRUPT, "prefix store: %s has the wrong shape", pe->key);
    if (!st) st = ft_session_slot_kv_rows(q->s, i, L, q->pbuf, q->pbuf_cap, 1, pe->ntoks);
    if (st) {
        ft_log(FT_LOG_WARN, "server: bringing a prefix back from the prefix store failed: %s", ft_last_error());
        ft_clear_error();
        pfx_drop(q, e);
        return -1;
    }
    slot_t *sl = &q->slots[i];
    memcpy(sl->toks, pe->toks, (size_t)L * sizeof *sl->toks);
    memcpy(sl->bh, pe->bh, (size_t)(L / BLOCK) * sizeof *sl->bh);
    sl->ntoks = L;
    pe->lru = ++q->clock;
    pthread_mutex_lock(&q->mu);
    q->m.store_restores++;
    q->m.store_restored_tokens += (uint64_t)L;
    pthread_mutex_unlock(&q->mu);
    return 0;
}

static void sl_assign(srv_sched *q, srv_req *r, int target, int L)
{
    q->slots[target].req = r;
    r->slot = target;
    r->fed = (size_t)L;
    pthread_mutex_lock(&r->mu);
    r->cached = (size_t)L;
    pthread_mutex_unlock(&r->mu);
}

/* Choose r's slot (a free one exists) and reuse what its cache can: the
 * longest shared prefix in an idle slot (kept there), in a busy slot
 * (copied), or in the prefix store (brought back). */
static void assign(srv_sched *q, srv_req *r)
{
    size_t np = r->plen / BLOCK;
    uint64_t *ph = NULL;
    int idle_best = -1, idle_L = -1, busy_best = -1, busy_L = 0, victim = -1;
    if (q->prefix && np && (ph = malloc(np * sizeof *ph)))
        for (size_t k = 0; k < np; k++) ph[k] = block_hash(k ? ph[k - 1] : 0, r->prompt + k * BLOCK);
    for (int i = 0; i < q->nslots; i++) {
        slot_t *sl = &q->slots[i];
        int L = q->prefix ? shared_prefix(sl, r->prompt, r->plen, ph, ph ? np : 0) : 0;
        if ((size_t)L >= r->plen) L = (int)r->plen - 1;   /* compute one token at least */
        if (sl->req) {
            if (L > busy_L) { busy_L = L; busy_best = i; }
            continue;
        }
        if (L > idle_L) { idle_L = L; idle_best = i; }
        /* the victim for a copy: an empty slot, else the least recently used */
        if (victim < 0 || (q->slots[victim].ntoks && (!sl->ntoks || sl->lru < q->slots[victim].lru))) victim = i;
    }
    /* the prefix store: a longer match than any slot has */
    int store_best = -1, store_L = 0;
    for (int e = 0; q->pstore && e < q->npe; e++) {
        int L = shared_prefix_of(q->pe[e].toks, q->pe[e].bh, q->pe[e].ntoks, r->prompt, r->plen, ph, ph ? np : 0);
        if ((size_t)L >= r->plen) L = (int)r->plen - 1;
        if (L > store_L) { store_L = L; store_best = e; }
    }
    free(ph);
    int target = idle_best, L = idle_L > 0 ? idle_L : 0;
    if (L == 0) target = victim;
    if (store_best >= 0 && store_L >= MIN_COPY && store_L > L + MIN_COPY && store_L > busy_L) {
        int dst = victim;
        pfx_spill(q, dst, 0);
        if (pfx_restore(q, store_best, dst, store_L) == 0) {
            sl_assign(q, r, dst, store_L);
            return;
        }
        ft_session_slot_reset(q->s, dst);
        slot_set_len(&q->slots[dst], 0);
    }
    if (busy_best >= 0 && busy_L >= MIN_COPY && busy_L > L) {
        /* into the victim, keeping the best idle match when another slot is free */
        int dst = victim;
        if (dst == idle_best && idle_L > 0)
            for (int i = 0; i < q->nslots; i++)
                if (!q->slots[i].req && i != idle_best) { dst = i; break; }
        pfx_spill(q, dst, 0);
        if (ft_session_slot_copy(q->s, busy_best, dst, busy_L) == FT_OK) {
            slot_t *d = &q->slots[dst], *sr = &q->slots[busy_best];
            memcpy(d->toks, sr->toks, (size_t)busy_L * sizeof *d->toks);
            memcpy(d->bh, sr->bh, (size_t)(busy_L / BLOCK) * sizeof *d->bh);
            slot_set_len(d, busy_L);
            target = dst;
            L = busy_L;
        }
        ft_clear_error();
    }
    slot_t *sl = &q->slots[target];
    if (L != sl->ntoks) {
        pfx_spill(q, target, L);
        if (ft_session_slot_truncate(q->s, target, L) != FT_OK) {
            ft_session_slot_reset(q->s, target);
            L = 0;
        }
        ft_clear_error();
        slot_set_len(sl, L);
    }
    sl_assign(q, r, target, L);
}

/* ---------------------------------------------------------- requests */

static void req_finish(srv_sched *q, srv_req *r, int how, const char *err)
{
    if (r->slot >= 0) {
        slot_t *sl = &q->slots[r->slot];
        sl->req = NULL;
        sl->lru = ++q->clock;
        if (how == SRV_FINISH_ERROR || !q->prefix) {
            ft_session_slot_reset(q->s, r->slot);
            slot_set_len(sl, 0);
        }
        r->slot = -1;
    }
    /* the request leaves the count before its client is told: a client
     * that sends again as soon as it has its answer must find the room
     * (test_queue_full saw a 429 in that window) */
    pthread_mutex_lock(&q->mu);
    q->inflight--;
    switch (how) {
    case SRV_FINISH_STOP: q->m.finished_stop++; break;
    case SRV_FINISH_LENGTH: q->m.finished_length++; break;
    case SRV_FINISH_CANCEL: q->m.cancelled++; break;
    default: q->m.errors++; break;
    }
    pthread_mutex_unlock(&q->mu);
    pthread_mutex_lock(&r->mu);
    r->finish = how;
    if (err) snprintf(r->error, sizeof r->error, "%s", err);
    r->shown = r->tlen;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    srv_req_unref(r);
}

static int text_add(srv_req *r, const char *b, size_t n)
{
    if (r->tlen + n + 1 > r->tcap) {
        size_t nc = (r->tcap + n + 1) * 2;
        char *t = realloc(r->text, nc);
        if (!t) return -1;
        r->text = t;
        r->tcap = nc;
    }
    memcpy(r->text + r->tlen, b, n);
    r->tlen += n;
    r->text[r->tlen] = 0;
    return 0;
}

/* New text from the detokenizer: cut at the first stop string, settle
 * what can no longer be the start of one. 1: a stop string matched. */
static int text_settle(srv_req *r, const char *b, size_t n, int final)
{
    int stopped = 0;
    pthread_mutex_lock(&r->mu);
    size_t from = r->tlen > r->stop_hold ? r->tlen - r->stop_hold : 0;   /* a match may begin here */
    if (text_add(r, b, n)) {
        pthread_mutex_unlock(&r->mu);
        return -1;
    }
    size_t cut = r->tlen;
    for (size_t i = 0; i < r->nstop; i++) {
        char *p = strstr(r->text + from, r->stop[i]);
        if (p && (size_t)(p - r->text) < cut) cut = (size_t)(p - r->text);
    }
    if (cut < r->tlen) {
        r->tlen = cut;
        r->text[cut] = 0;
        stopped = 1;
    }
    size_t upto = (stopped || final) ? r->tlen : (r->tlen > r->stop_hold ? r->tlen - r->stop_hold : 0);
    if (upto > r->shown) {
        r->shown = upto;
        pthread_cond_broadcast(&r->cv);
    }
    pthread_mutex_unlock(&r->mu);
    return stopped;
}

static int is_eos(const srv_sched *q, int32_t t)
{
    for (int i = 0; i < q->cfg->n_eos; i++)
        if (q->cfg->eos_ids[i] == t) return 1;
    return 0;
}

/* A new token for r: 1 when r is finished (and handed back). */
static int on_token(srv_sched *q, srv_req *r, int32_t t)
{
    if (!r->ngen) {
        pthread_mutex_lock(&r->mu);
        r->ttft_s = ft_now() - r->t_submit;
        pthread_mutex_unlock(&r->mu);
    }
    r->gen[r->ngen++] = t;
    pthread_mutex_lock(&q->mu);
    q->m.generated_tokens++;
    pthread_mutex_unlock(&q->mu);
    char buf[512];
    size_t w = 0;
    if (!r->ignore_eos && is_eos(q, t)) {
        if (!ft_detok_flush(r->dt, buf, sizeof buf, &w) && w) text_settle(r, buf, w, 1);
        else text_settle(r, "", 0, 1);
        req_finish(q, r, SRV_FINISH_STOP, NULL);
        return 1;
    }
    pthread_mutex_lock(&r->mu);
    r->completion_tokens++;
    pthread_mutex_unlock(&r->mu);
    ft_status st = ft_detok_push(r->dt, t, buf, sizeof buf, &w);
    int stopped = st ? -1 : text_settle(r, buf, w, 0);
    if (stopped < 0) {
        req_finish(q, r, SRV_FINISH_ERROR, "detokenizing the output failed");
        return 1;
    }
    if (stopped) {
        req_finish(q, r, SRV_FINISH_STOP, NULL);
        return 1;
    }
    slot_t *sl = &q->slots[r->slot];
    if (r->ngen >= r->max_tokens || sl->ntoks >= q->max_seq) {
        w = 0;
        if (!ft_detok_flush(r->dt, buf, sizeof buf, &w) && w) stopped = text_settle(r, buf, w, 1);
        else text_settle(r, "", 0, 1);
        req_finish(q, r, stopped ? SRV_FINISH_STOP : SRV_FINISH_LENGTH, NULL);
        return 1;
    }
    r->pending = t;
    return 0;
}

ft_status srv_submit(srv_sched *q, srv_req *r)
{
    if (!r->plen) return ft_set_error(FT_ERR_INVALID_ARG, "the prompt is empty");
    if (r->plen + 1 > (size_t)q->max_seq)
        return ft_set_error(FT_ERR_INVALID_ARG, "the prompt has %zu tokens; the context holds %d", r->plen,
                            q->max_seq);
    for (size_t i = 0; i < r->plen; i++)
        if (r->prompt[i] < 0 || r->prompt[i] >= q->cfg->vocab)
            return ft_set_error(FT_ERR_INVALID_ARG, "token id %d is outside the vocabulary (%d)", (int)r->prompt[i],
                                q->cfg->vocab);
    if (!(r->gen = malloc((r->max_tokens + 1) * sizeof *r->gen)))
        return ft_set_error(FT_ERR_NOMEM, "request: allocation");
    ft_status st = ft_detok_create(q->tok, 1, &r->dt);
    if (st) return st;
    size_t hold = 0;
    for (size_t i = 0; i < r->nstop; i++)
        if (strlen(r->stop[i]) > hold) hold = strlen(r->stop[i]);
    r->stop_hold = hold ? hold - 1 : 0;
    r->rng = r->samp.seed ^ 0x9e3779b97f4a7c15ull;   /* as ft_generate seeds its first sequence */
    r->t_submit = ft_now();
    pthread_mutex_lock(&q->mu);
    if (q->stop) {
        pthread_mutex_unlock(&q->mu);
        return ft_set_error(FT_ERR_CANCELED, "the server is stopping");
    }
    if (q->inflight >= (unsigned)q->nslots + (unsigned)q->qmax) {
        q->m.rejected++;
        pthread_mutex_unlock(&q->mu);
        return ft_set_error(FT_ERR_BUSY, "every slot is busy and the queue is full (%d slots, %d waiting)",
                            q->nslots, q->qmax);
    }
    q->inflight++;
    atomic_fetch_add(&r->refs, 1);
    r->next = NULL;
    if (q->qtail) q->qtail->next = r;
    else q->qhead = r;
    q->qtail = r;
    q->qlen++;
    q->m.requests++;
    q->m.prompt_tokens += r->plen;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
    return FT_OK;
}

void srv_cancel(srv_sched *q, srv_req *r)
{
    atomic_store(&r->cancel, 1);
    pthread_mutex_lock(&q->mu);
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

void srv_count_rejected(srv_sched *q)
{
    pthread_mutex_lock(&q->mu);
    q->m.rejected++;
    pthread_mutex_unlock(&q->mu);
}

void srv_get_metrics(srv_sched *q, srv_metrics *m)
{
    pthread_mutex_lock(&q->mu);
    *m = q->m;
    m->queued = q->qlen;
    pthread_mutex_unlock(&q->mu);
}

/* -------------------------------------------------------------- loop */

static int free_slot(const srv_sched *q)
{
    for (int i = 0; i < q->nslots; i++)
        if (!q->slots[i].req) return 1;
    return 0;
}

static void *loop(void *arg)
{
    srv_sched *q = arg;
    size_t vocab = (size_t)q->cfg->vocab;
    double last_snap = 0;
    for (;;) {
        /* admit */
        pthread_mutex_lock(&q->mu);
        for (;;) {
            int active = 0;
            for (int i = 0; i < q->nslots; i++) active += q->slots[i].req != NULL;
            if (q->stop) break;
            if (q->qhead && free_slot(q)) {
                srv_req *r = q->qhead;
                q->qhead = r->next;
                if (!q->qhead) q->qtail = NULL;
                q->qlen--;
                pthread_mutex_unlock(&q->mu);
                if (atomic_load(&r->cancel)) req_finish(q, r, SRV_FINISH_CANCEL, NULL);
                else {
                    assign(q, r);
                    pthread_mutex_lock(&q->mu);
                    q->m.cached_tokens += r->fed;
                    pthread_mutex_unlock(&q->mu);
                }
                pthread_mutex_lock(&q->mu);
                continue;
            }
            q->m.active = (unsigned)active;
            if (active) break;
            if (q->stats_dirty) {   /* idle: the metrics' snapshot up to date */
                q->stats_dirty = 0;
                pthread_mutex_unlock(&q->mu);
                ft_session_stats ss;
                ft_session_get_stats(q->s, &ss);
                pthread_mutex_lock(&q->mu);
                q->m.ss = ss;
                continue;
            }
            pthread_cond_wait(&q->cv, &q->mu);
        }
        /* requests waiting for a slot whose client left */
        for (srv_req **pp = &q->qhead; *pp;) {
            srv_req *r = *pp;
            if (atomic_load(&r->cancel)) {
                *pp = r->next;
                if (q->qtail == r) q->qtail = NULL;
                q->qlen--;
                pthread_mutex_unlock(&q->mu);
                req_finish(q, r, SRV_FINISH_CANCEL, NULL);
                pthread_mutex_lock(&q->mu);
            } else pp = &r->next;
        }
        if (!q->qtail)
            for (srv_req *r = q->qhead; r; r = r->next) q->qtail = r;
        int stopping = q->stop;
        pthread_mutex_unlock(&q->mu);
        if (stopping) break;

        /* the step: decode rows first, then prompt chunks */
        size_t n = 0, rows = 0;
        for (int i = 0; i < q->nslots; i++) {
            srv_req *r = q->slots[i].req;
            if (!r) continue;
            if (atomic_load(&r->cancel)) {
                req_finish(q, r, SRV_FINISH_CANCEL, NULL);
                continue;
            }
            if (r->fed < r->plen) continue;
            q->b_one[n] = r->pending;
            q->b_slot[n] = i;
            q->b_tok[n] = &q->b_one[n];
            q->b_n[n] = 1;
            q->b_req[n] = r;
            n++;
            rows++;
        }
        for (int i = 0; i < q->nslots && rows < (size_t)q->step_rows; i++) {
            srv_req *r = q->slots[i].req;
            if (!r || r->fed >= r->plen) continue;
            size_t k = r->plen - r->fed;
            if (k > (size_t)q->chunk) k = (size_t)q->chunk;
            if (k > (size_t)q->step_rows - rows) k = (size_t)q->step_rows - rows;
            q->b_slot[n] = i;
            q->b_tok[n] = r->prompt + r->fed;
            q->b_n[n] = k;
            q->b_req[n] = r;
            n++;
            rows += k;
        }
        if (!n) continue;
        double t0 = ft_now();
        ft_status st = ft_session_forward(q->s, n, q->b_slot, q->b_tok, q->b_n, q->logits, 0);
        double dt = ft_now() - t0;
        if (st) {
            char msg[256];
            snprintf(msg, sizeof msg, "the forward pass failed: %s (%s)", ft_status_str(st), ft_last_error());
            ft_log(FT_LOG_ERROR, "server: %s", msg);
            for (size_t j = 0; j < n; j++) req_finish(q, q->b_req[j], SRV_FINISH_ERROR, msg);
            continue;
        }
        for (size_t j = 0; j < n; j++) {
            srv_req *r = q->b_req[j];
            slot_t *sl = &q->slots[q->b_slot[j]];
            slot_append(sl, q->b_tok[j], q->b_n[j]);
            int decoding = r->fed >= r->plen;
            if (!decoding) {
                r->fed += q->b_n[j];
                if (r->fed < r->plen) continue;   /* more prompt to go */
            }
            float *lg = q->logits + j * vocab;
            int32_t t = ft_sampler_sample(q->sampler, &r->samp, lg, sl->toks, (size_t)sl->ntoks, &r->rng);
            on_token(q, r, t);
        }
        pthread_mutex_lock(&q->mu);
        q->m.steps++;
        q->m.forward_rows += rows;
        q->m.busy_s += dt;
        double now = ft_now();
        if (now - q->tps_t0 >= 2.0) {
            q->m.tps = (double)(q->m.generated_tokens - q->tps_n0) / (now - q->tps_t0);
            q->tps_t0 = now;
            q->tps_n0 = q->m.generated_tokens;
        }
        int snap = now - last_snap >= 0.5;
        q->stats_dirty = !snap;
        pthread_mutex_unlock(&q->mu);
        if (snap) {
            ft_session_stats ss;
            ft_session_get_stats(q->s, &ss);
            pthread_mutex_lock(&q->mu);
            q->m.ss = ss;
            pthread_mutex_unlock(&q->mu);
            last_snap = now;
        }
    }
    /* stopping: end everything in flight */
    for (int i = 0; i < q->nslots; i++)
        if (q->slots[i].req) req_finish(q, q->slots[i].req, SRV_FINISH_ERROR, "the server is stopping");
    pthread_mutex_lock(&q->mu);
    while (q->qhead) {
        srv_req *r = q->qhead;
        q->qhead = r->next;
        q->qlen--;
        pthread_mutex_unlock(&q->mu);
        req_finish(q, r, SRV_FINISH_ERROR, "the server is stopping");
        pthread_mutex_lock(&q->mu);
    }
    q->qtail = NULL;
    pthread_mutex_unlock(&q->mu);
    return NULL;
}

ft_status srv_sched_create(ft_session *s, const ft_server_params *p, srv_sched **out)
{
    srv_sched *q = calloc(1, sizeof *q);
    if (!q) return ft_set_error(FT_ERR_NOMEM, "server: allocation");
    ft_status st = FT_OK;
    q->s = s;
    q->cfg = ft_session_config(s);
    q->tok = ft_session_tokenizer(s);
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cv, NULL);
    if (!q->tok) {
        st = ft_set_error(FT_ERR_NOT_FOUND, "server: the model has no tokenizer");
        goto fail;
    }
    q->nslots = (int)p->slots;
    q->chunk = (int)p->prefill_chunk;
    q->step_rows = (int)p->step_tokens;
    q->qmax = (int)p->queue;
    q->prefix = !p->no_prefix_cache;
    if ((st = ft_session_reserve(s, p->slots, p->ctx, p->step_tokens))) goto fail;
    int b = 0, seq = 0;
    ft_session_capacity(s, &b, &seq, NULL);
    q->max_seq = (int)p->ctx < seq ? (int)p->ctx : seq;
    size_t vocab = (size_t)q->cfg->vocab, ns = (size_t)q->nslots;
    q->slots = calloc(ns, sizeof *q->slots);
    q->logits = malloc(ns * vocab * sizeof *q->logits);
    q->b_slot = calloc(ns, sizeof *q->b_slot);
    q->b_tok = calloc(ns, sizeof *q->b_tok);
    q->b_n = calloc(ns, sizeof *q->b_n);
    q->b_req = calloc(ns, sizeof *q->b_req);
    q->b_one = calloc(ns, sizeof *q->b_one);
    if (!q->slots || !q->logits || !q->b_slot || !q->b_tok || !q->b_n || !q->b_req || !q->b_one) {
        st = ft_set_error(FT_ERR_NOMEM, "server: allocation");
        goto fail;
    }
    for (int i = 0; i < q->nslots; i++) {
        q->slots[i].toks = malloc((size_t)q->max_seq * sizeof(int32_t));
        q->slots[i].bh = malloc(((size_t)q->max_seq / BLOCK + 1) * sizeof(uint64_t));
        if (!q->slots[i].toks || !q->slots[i].bh) {
            st = ft_set_error(FT_ERR_NOMEM, "server: allocation");
            goto fail;
        }
        ft_session_slot_reset(s, i);
    }
    if ((st = ft_sampler_create(q->cfg->vocab, &q->sampler))) goto fail;
    if (p->prefix_store && *p->prefix_store && q->prefix) {
        if ((st = ft_session_slot_kv_layout(s, &q->kvdt, &q->row_bytes))) {
            st = ft_set_error(st, "server: --prefix-store: %s", ft_last_error());
            goto fail;
        }
        ft_store_params spp;
        ft_store_default_params(&spp);
        spp.token_file = p->prefix_store_token_file;
        if ((st = ft_store_open(p->prefix_store, &spp, &q->pstore))) goto fail;
        q->maxpe = p->prefix_store_entries ? (int)p->prefix_store_entries : 256;
        q->pbuf_cap = pfx_bytes(q, q->max_seq);
        q->pe = calloc((size_t)q->maxpe, sizeof *q->pe);
        q->pbuf = malloc(q->pbuf_cap);
        if (!q->pe || !q->pbuf) {
            st = ft_set_error(FT_ERR_NOMEM, "server: allocation");
            goto fail;
        }
    }
    q->m.slots = (unsigned)q->nslots;
    q->tps_t0 = ft_now();
    ft_session_get_stats(s, &q->m.ss);
    if (pthread_create(&q->th, NULL, loop, q)) {
        st = ft_set_error(FT_ERR_NOMEM, "server: cannot start the scheduler thread");
        goto fail;
    }
    q->started = 1;
    *out = q;
    return FT_OK;
fail:
    srv_sched_free(q);
    return st;
}

void srv_sched_stop(srv_sched *q)
{
    if (!q || !q->started) return;
    pthread_mutex_lock(&q->mu);
    q->stop = 1;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
    pthread_join(q->th, NULL);
    q->started = 0;
}

void srv_sched_free(srv_sched *q)
{
    if (!q) return;
    srv_sched_stop(q);
    if (q->slots)
        for (int i = 0; i < q->nslots; i++) {
            free(q->slots[i].toks);
            free(q->slots[i].bh);
        }
    free(q->slots);
    free(q->logits);
    free(q->b_slot);
    free(q->b_tok);
    free(q->b_n);
    free(q->b_req);
    free(q->b_one);
    ft_sampler_free(q->sampler);
    while (q->pe && q->npe) pfx_drop(q, q->npe - 1);
    free(q->pe);
    free(q->pbuf);
    ft_store_close(q->pstore);
    pthread_mutex_destroy(&q->mu);
    pthread_cond_destroy(&q->cv);
    free(q);
}
