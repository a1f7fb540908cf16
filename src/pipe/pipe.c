/* The pipeline's two loops: a worker stage (receive, compute its layers,
 * pass on) and the driver (the last stage: compute, sample, feed the next
 * tokens of each micro-batch back to stage 0). docs/pipeline.md. */
#include "pipe_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void ft_pipe_link_close(ft_pipe_link *l)
{
    if (l && l->ops && l->ops->close) l->ops->close(l);
}

static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Number and send a message built in buf. */
static ft_status send_msg(ft_pipe_stage *s, ft_pipe_link *link, uint8_t *buf, size_t len)
{
    uint64_t seq = ++s->sent;
    for (int i = 0; i < 8; i++) buf[16 + i] = (uint8_t)(seq >> (8 * i));
    ft_status st = link->ops->send(link, buf, len);
    if (st) return ft_set_error(st, "stage %d: sending to stage %d: %s", s->p.stage,
                                (s->p.stage + 1) % s->p.n_stages, ft_last_error());
    return FT_OK;
}

static ft_status send_error(ft_pipe_stage *s, ft_pipe_link *link, const char *text)
{
    size_t n = ft_pipe_msg_error(s->out, s->cap, s->p.job, text);
    return send_msg(s, link, s->out, n);
}

/* Receive and check the next message from the previous stage. */
static ft_status recv_msg(ft_pipe_stage *s, ft_pipe_link *link, int timeout_ms, ft_pipe_msg *m)
{
    size_t len = 0;
    int prev = (s->p.stage + s->p.n_stages - 1) % s->p.n_stages;
    ft_status st = link->ops->recv(link, s->in, s->cap, &len, timeout_ms);
    if (st) return ft_set_error(st, "stage %d: receiving from stage %d: %s", s->p.stage, prev, ft_last_error());
    if ((st = ft_pipe_msg_parse(s->in, len, &s->lim, m)))
        return ft_set_error(st, "stage %d: from stage %d: %s", s->p.stage, prev, ft_last_error());
    if (m->job != s->p.job)
        return ft_set_error(FT_ERR_PROTOCOL, "stage %d: a message of run %016llx in run %016llx", s->p.stage,
                            (unsigned long long)m->job, (unsigned long long)s->p.job);
    if (m->seq != s->received + 1)
        return ft_set_error(FT_ERR_PROTOCOL, "stage %d: message %llu from stage %d after %llu", s->p.stage,
                            (unsigned long long)m->seq, prev, (unsigned long long)s->received);
    s->received = m->seq;
    return FT_OK;
}

ft_status ft_pipe_worker_run(ft_pipe_stage *s, ft_pipe_link *link)
{
    if (!s || !link) return ft_set_error(FT_ERR_INVALID_ARG, "worker: NULL argument");
    if (s->p.stage == s->p.n_stages - 1)
        return ft_set_error(FT_ERR_INVALID_ARG, "worker: stage %d is the last one (the driver's)", s->p.stage);
    const int H = ft_model_get_config(s->m)->hidden;
    for (;;) {
        ft_pipe_msg m;
        ft_status st = recv_msg(s, link, -1, &m);
        if (st) {
            char text[FT_PIPE_ERR_MAX + 1];
            snprintf(text, sizeof text, "%s", ft_last_error());
            send_error(s, link, text);   /* best effort: the driver learns why */
            return ft_set_error(st, "%s", text);
        }
        if (m.type == FT_PM_END || m.type == FT_PM_ERROR) {
            memcpy(s->out, s->in, FT_PIPE_HDR + m.data_len);
            if ((st = send_msg(s, link, s->out, FT_PIPE_HDR + m.data_len))) return st;
            if (m.type == FT_PM_END) return FT_OK;
            continue;
        }
        int want = s->p.stage == 0 ? FT_PM_STEP : FT_PM_HIDDEN;
        if (m.type != want) {
            char text[128];
            snprintf(text, sizeof text, "stage %d: got a %s message", s->p.stage,
                     m.type == FT_PM_STEP ? "token" : "hidden-state");
            if ((st = send_error(s, link, text))) return st;
            continue;
        }
        ft_pipe_stage_unpack(s, &m);
        if (m.flags & FT_PM_RESET)
            for (uint32_t i = 0; i < m.n_seq; i++) ft_ctx_reset(s->ctx, s->slots[i]);
        size_t dlen = (size_t)m.rows * (size_t)H * sizeof(float);
        size_t off = ft_pipe_msg_begin(s->out, FT_PM_HIDDEN, s->p.job, 0, m.mb, m.flags, m.n_seq, s->slots, s->ntok,
                                       m.rows, dlen);
        st = ft_ctx_forward_layers(s->ctx, m.n_seq, s->slots, s->p.stage == 0 ? s->tokp : NULL, s->ntok,
                                   s->p.stage == 0 ? NULL : (const float *)(const void *)m.data, s->p.l0, s->p.l1,
                                   (float *)(void *)(s->out + off), NULL, 0);
        if (st) {
            char text[FT_PIPE_ERR_MAX + 1];
            snprintf(text, sizeof text, "stage %d (layers %d-%d): %s", s->p.stage, s->p.l0, s->p.l1 - 1,
                     ft_last_error());
            if ((st = send_error(s, link, text))) return st;
            continue;
        }
        if ((st = send_msg(s, link, s->out, off + dlen))) return st;
    }
}

/* ---------------------------------------------------------------- driver */

static int is_eos(const ft_model_config *cfg, int32_t t)
{
    for (int i = 0; i < cfg->n_eos; i++) if (cfg->eos_ids[i] == t) return 1;
    return 0;
}

typedef struct {
    int *seq;      /* its sequences still generating (global indices) */
    int n;
    int first;     /* the prompt step is next */
} mb_state;

typedef struct {
    ft_pipe_stage *s;
    ft_pipe_link *link;
    size_t n;
    const int32_t *const *prompts;
    const size_t *plen;
    const ft_gen_params *gp;
    int32_t *const *out;
    size_t *n_out;
    int32_t *hist;
    size_t hist_cap, *hlen;
    uint64_t *rng;
    mb_state *mb;
    int *fifo, fifo_n, fifo_head;    /* one stage: micro-batches waiting */
} drv;

/* The current step of micro-batch m into the stage's arrays. */
static void mb_args(drv *d, int m, size_t *rows)
{
    ft_pipe_stage *s = d->s;
    mb_state *b = &d->mb[m];
    *rows = 0;
    for (int i = 0; i < b->n; i++) {
        int j = b->seq[i];
        s->slots[i] = j;
        if (b->first) {
            s->ntok[i] = d->plen[j];
            s->tokp[i] = d->prompts[j];
        } else {
            s->ntok[i] = 1;
            s->tokp[i] = d->hist + (size_t)j * d->hist_cap + d->hlen[j] - 1;
        }
        *rows += s->ntok[i];
    }
}

/* Send micro-batch m's next step around the ring (one stage: queue it). */
static ft_status send_step(drv *d, int m)
{
    ft_pipe_stage *s = d->s;
    if (s->p.n_stages == 1) {
        d->fifo[(d->fifo_head + d->fifo_n++) % (int)s->p.max_batch] = m;
        return FT_OK;
    }
    size_t rows;
    mb_args(d, m, &rows);
    size_t off = ft_pipe_msg_begin(s->out, FT_PM_STEP, s->p.job, 0, (uint32_t)m, d->mb[m].first ? FT_PM_RESET : 0,
                                   (uint32_t)d->mb[m].n, s->slots, s->ntok, (uint32_t)rows, rows * 4);
    for (int i = 0, r = 0; i < d->mb[m].n; i++)
        for (size_t k = 0; k < s->ntok[i]; k++, r++) {
            uint32_t t = (uint32_t)s->tokp[i][k];
            for (int q = 0; q < 4; q++) s->out[off + 4 * (size_t)r + (size_t)q] = (uint8_t)(t >> (8 * q));
        }
    return send_msg(s, d->link, s->out, off + rows * 4);
}

ft_status ft_pipe_generate(ft_pipe_stage *s, ft_pipe_link *link, size_t n, const int32_t *const *prompts,
                           const size_t *prompt_len, const ft_gen_params *gp, const ft_pipe_gen_opts *po,
                           int32_t *const *out, size_t *n_out, ft_pipe_gen_stats *stats)
{
    if (!s || !prompts || !prompt_len || !gp || !out || !n_out || n == 0)
        return ft_set_error(FT_ERR_INVALID_ARG, "pipeline generate: NULL argument or empty batch");
    const int S = s->p.n_stages;
    if (s->p.stage != S - 1) return ft_set_error(FT_ERR_INVALID_ARG, "pipeline generate: not the last stage");
    if (S > 1 && !link) return ft_set_error(FT_ERR_INVALID_ARG, "pipeline generate: %d stages and no link", S);
    const ft_model_config *cfg = ft_model_get_config(s->m);
    if (n > (size_t)s->p.max_batch)
        return ft_set_error(FT_ERR_INVALID_ARG, "pipeline generate: %zu prompts > max_batch %d", n, s->p.max_batch);
    size_t maxlen = 0;
    for (size_t j = 0; j < n; j++) {
        if (prompt_len[j] == 0) return ft_set_error(FT_ERR_INVALID_ARG, "pipeline generate: prompt %zu is empty", j);
        if (prompt_len[j] + (gp->max_new_tokens ? gp->max_new_tokens - 1 : 0) > (size_t)s->p.max_seq)
            return ft_set_error(FT_ERR_NO_SPACE, "pipeline generate: prompt %zu has %zu tokens; with %zu new "
                                "tokens it exceeds the context of %d", j, prompt_len[j], gp->max_new_tokens,
                                s->p.max_seq);
        if (prompt_len[j] > maxlen) maxlen = prompt_len[j];
    }
    int M = po && po->micro_batches > 0 ? po->micro_batches : S;
    if (M > (int)n) M = (int)n;
    /* every micro-batch's prompt must fit one forward call's rows */
    for (int m = 0; m < M; m++) {
        size_t rows = 0;
        for (size_t j = n * (size_t)m / (size_t)M; j < n * (size_t)(m + 1) / (size_t)M; j++) rows += prompt_len[j];
        if (rows > (size_t)s->p.max_rows)
            return ft_set_error(FT_ERR_INVALID_ARG, "pipeline generate: micro-batch %d has %zu prompt tokens, the "
                                "stages were made for %d", m, rows, s->p.max_rows);
    }
    int timeout = po && po->timeout_ms > 0 ? po->timeout_ms : -1;
    drv d;
    memset(&d, 0, sizeof d);
    d.s = s;
    d.link = link;
    d.n = n;
    d.prompts = prompts;
    d.plen = prompt_len;
    d.gp = gp;
    d.out = out;
    d.n_out = n_out;
    d.hist_cap = maxlen + gp->max_new_tokens + 1;
    d.hist = malloc(n * d.hist_cap * sizeof(int32_t));
    d.hlen = calloc(n, sizeof *d.hlen);
    d.rng = malloc(n * sizeof *d.rng);
    d.mb = calloc((size_t)M, sizeof *d.mb);
    d.fifo = calloc((size_t)s->p.max_batch, sizeof *d.fifo);
    int *seqbuf = malloc(n * sizeof *seqbuf);
    float *logits = malloc((size_t)s->p.max_batch * (size_t)cfg->vocab * sizeof(float));
    ft_sampler *smp = NULL;
    ft_status st = ft_sampler_create(cfg->vocab, &smp);
    if (!st && (!d.hist || !d.hlen || !d.rng || !d.mb || !d.fifo || !seqbuf || !logits))
        st = ft_set_error(FT_ERR_NOMEM, "pipeline generate: buffers");
    ft_pipe_gen_stats gs;
    memset(&gs, 0, sizeof gs);
    gs.micro_batches = M;
    gs.gen.decode_thread_runq_s = -1;   /* not measured across the stages */
    if (st) goto done;
    for (size_t j = 0; j < n; j++) {
        memcpy(d.hist + j * d.hist_cap, prompts[j], prompt_len[j] * sizeof(int32_t));
        d.hlen[j] = prompt_len[j];
        n_out[j] = 0;
        d.rng[j] = gp->sampling.seed ^ (0x9e3779b97f4a7c15ull * (j + 1));   /* as ft_generate */
        gs.gen.prefill_tokens += prompt_len[j];
    }
    if (gp->max_new_tokens == 0) goto done;
    for (int m = 0; m < M; m++) {
        size_t a = n * (size_t)m / (size_t)M, b = n * (size_t)(m + 1) / (size_t)M;
        d.mb[m].seq = seqbuf + a;
        d.mb[m].n = (int)(b - a);
        d.mb[m].first = 1;
        for (size_t j = a; j < b; j++) d.mb[m].seq[j - a] = (int)j;
    }
    double t0 = ft_now(), c0 = cpu_now(), t_pre = 0, c_pre = 0;
    for (int m = 0; m < M && !st; m++) st = send_step(&d, m);
    int inflight = M, prefilled = 0;
    const int L = cfg->n_layers;
    while (!st && inflight > 0) {
        int m;
        const float *hidden = NULL;
        size_t rows;
        if (S == 1) {
            m = d.fifo[d.fifo_head];
            d.fifo_head = (d.fifo_head + 1) % s->p.max_batch;
            d.fifo_n--;
            mb_args(&d, m, &rows);
        } else {
            ft_pipe_msg msg;
            if ((st = recv_msg(s, link, timeout, &msg))) break;
            gs.messages++;
            if (msg.type == FT_PM_ERROR) {
                st = ft_set_error(FT_ERR_NET, "a pipeline stage failed: %.*s", (int)msg.data_len, (const char *)msg.data);
                break;
            }
            if (msg.type != FT_PM_HIDDEN || msg.mb >= (uint32_t)M || (int)msg.n_seq != d.mb[msg.mb].n ||
                (d.mb[msg.mb].first != ((msg.flags & FT_PM_RESET) != 0))) {
                st = ft_set_error(FT_ERR_PROTOCOL, "pipeline: an unexpected message (type %u, micro-batch %u, %u "
                                  "sequences)", msg.type, msg.mb, msg.n_seq);
                break;
            }
            m = (int)msg.mb;
            mb_args(&d, m, &rows);
            for (uint32_t i = 0; i < msg.n_seq && !st; i++) {
                int slot;
                size_t nt;
                ft_pipe_msg_seq(&msg, i, &slot, &nt);
                if (slot != s->slots[i] || nt != s->ntok[i])
                    st = ft_set_error(FT_ERR_PROTOCOL, "pipeline: micro-batch %d came back with other sequences", m);
            }
            if (st) break;
            hidden = (const float *)(const void *)msg.data;
        }
        mb_state *b = &d.mb[m];
        if (b->first)
            for (int i = 0; i < b->n; i++) ft_ctx_reset(s->ctx, s->slots[i]);
        st = ft_ctx_forward_layers(s->ctx, (size_t)b->n, s->slots, S == 1 ? s->tokp : NULL, s->ntok, hidden,
                                   s->p.l0, L, NULL, logits, 0);
        if (st) {
            st = ft_set_error(st, "stage %d (layers %d-%d): %s", s->p.stage, s->p.l0, L - 1, ft_last_error());
            break;
        }
        if (!b->first) gs.gen.decode_tokens += (size_t)b->n;
        int was_first = b->first, nact = 0;
        b->first = 0;
        for (int i = 0; i < b->n; i++) {
            int j = b->seq[i];
            float *row = logits + (size_t)i * (size_t)cfg->vocab;
            if (po && po->on_logits) po->on_logits(po->user, (size_t)j, n_out[j], row);
            ft_sampling sp = gp->sampling;
            int32_t tok = ft_sampler_sample(smp, &sp, row, d.hist + (size_t)j * d.hist_cap, d.hlen[j], &d.rng[j]);
            out[j][n_out[j]++] = tok;
            d.hist[(size_t)j * d.hist_cap + d.hlen[j]++] = tok;
            int stop = (!gp->ignore_eos && is_eos(cfg, tok)) || n_out[j] >= gp->max_new_tokens;
            if (gp->on_token && gp->on_token(gp->user, (size_t)j, tok)) stop = 1;
            if (!stop) b->seq[nact++] = j;
        }
        b->n = nact;
        (void)rows;
        if (was_first && ++prefilled == M) {
            t_pre = ft_now();
            c_pre = cpu_now();
            gs.gen.prefill_s = t_pre - t0;
            gs.gen.prefill_cpu_s = c_pre - c0;
        }
        if (nact) st = send_step(&d, m);
        else inflight--;
    }
    if (!st) {
        double t1 = ft_now();
        if (prefilled < M) { t_pre = t1; c_pre = cpu_now(); gs.gen.prefill_s = t1 - t0; }
        gs.gen.decode_s = t1 - t_pre;
        gs.gen.decode_cpu_s = cpu_now() - c_pre;
        gs.wall_s = t1 - t0;
    }
done:
    if (!st && stats) *stats = gs;
    ft_sampler_free(smp);
    free(d.hist);
    free(d.hlen);
    free(d.rng);
    free(d.mb);
    free(d.fifo);
    free(seqbuf);
    free(logits);
    return st;
}

ft_status ft_pipe_end(ft_pipe_stage *s, ft_pipe_link *link, int timeout_ms)
{
    if (!s) return FT_ERR_INVALID_ARG;
    if (s->p.n_stages == 1 || !link) return FT_OK;
    size_t off = ft_pipe_msg_begin(s->out, FT_PM_END, s->p.job, 0, 0, 0, 0, NULL, NULL, 0, 0);
    ft_status st = send_msg(s, link, s->out, off);
    double dl = ft_now() + (timeout_ms > 0 ? timeout_ms : 30000) / 1000.0;
    while (!st) {
        int left = (int)((dl - ft_now()) * 1000);
        if (left <= 0) return ft_set_error(FT_ERR_TIMEOUT, "pipeline: the workers did not finish within %d ms", timeout_ms);
        ft_pipe_msg m;
        if ((st = recv_msg(s, link, left, &m))) break;
        if (m.type == FT_PM_END) return FT_OK;   /* every worker has passed it on */
    }
    return st;
}
