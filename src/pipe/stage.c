/* A pipeline stage: the part of a model one process computes, its
 * parameters and their text form (flextier/pipe.h). */
#include "flextier/pipe.h"
#include "pipe_internal.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ft_pipe_stage_default(ft_pipe_stage_params *p)
{
    memset(p, 0, sizeof *p);
    p->n_stages = 1;
    p->max_batch = 1;
    p->max_seq = 1;
    p->weights = FT_WEIGHTS_AS_STORED;
    p->kv_dtype = FT_BF16;
}

void ft_pipe_split_layers(int n_layers, int n_stages, int *bounds)
{
    bounds[0] = 0;
    for (int i = 0; i < n_stages; i++)
        bounds[i + 1] = bounds[i] + n_layers / n_stages + (i < n_layers % n_stages);
}

/* ------------------------------------------------------------ text form */

ft_status ft_pipe_stage_format(const ft_pipe_stage_params *p, char *buf, size_t cap, size_t *len)
{
    int n = snprintf(buf, cap,
                     "model=%s\nstage=%d\nstages=%d\nlayers=%d,%d\nbatch=%d\nseq=%d\nrows=%d\nthreads=%u\n"
                     "weights=%d\nkv=%d\nflags=%u\njob=%016llx\npolicy=%s\n",
                     p->model_dir, p->stage, p->n_stages, p->l0, p->l1, p->max_batch, p->max_seq, p->max_rows,
                     p->threads, p->weights, p->kv_dtype, p->config_flags, (unsigned long long)p->job, p->policy);
    if (n < 0 || (size_t)n >= cap) return ft_set_error(FT_ERR_BUFFER_SMALL, "stage parameters: %d bytes", n);
    *len = (size_t)n;
    return FT_OK;
}

#define BADP(...) ft_set_error(FT_ERR_PROTOCOL, "stage parameters: " __VA_ARGS__)

static int parse_i64(const char *v, long long lo, long long hi, long long *out)
{
    if (!*v) return -1;
    char *e;
    long long x = strtoll(v, &e, 10);
    if (*e || x < lo || x > hi || (v[0] != '-' && !isdigit((unsigned char)v[0]))) return -1;
    *out = x;
    return 0;
}

ft_status ft_pipe_stage_parse(const char *text, size_t len, ft_pipe_stage_params *out)
{
    static const char *const keys[] = {"model", "stage", "stages", "layers", "batch", "seq", "rows",
                                       "threads", "weights", "kv", "flags", "job", "policy"};
    enum { NK = sizeof keys / sizeof keys[0] };
    int seen[NK] = {0};
    ft_pipe_stage_params p;
    ft_pipe_stage_default(&p);
    if (!text || len > 8192) return BADP("%zu bytes (at most 8192)", len);
    char line[FT_PIPE_PATH_MAX + 64];
    size_t pos = 0;
    while (pos < len) {
        const char *nl = memchr(text + pos, '\n', len - pos);
        if (!nl) return BADP("the last line has no newline");
        size_t l = (size_t)(nl - (text + pos));
        if (l >= sizeof line) return BADP("a line of %zu bytes", l);
        memcpy(line, text + pos, l);
        line[l] = 0;
        pos += l + 1;
        for (size_t i = 0; i < l; i++)
            if ((unsigned char)line[i] < 0x20 || (unsigned char)line[i] > 0x7e) return BADP("byte %zu of a line is not printable", i);
        char *eq = strchr(line, '=');
        if (!eq) return BADP("'%.40s' is not key=value", line);
        *eq = 0;
        const char *k = line, *v = eq + 1;
        int ki = -1;
        for (int i = 0; i < NK; i++) if (!strcmp(k, keys[i])) ki = i;
        if (ki < 0) return BADP("unknown key '%.40s'", k);
        if (seen[ki]++) return BADP("'%s' twice", k);
        long long x = 0, y = 0;
        switch (ki) {
        case 0:
            if (!*v || strlen(v) >= sizeof p.model_dir) return BADP("model: a path of 1..%d bytes", FT_PIPE_PATH_MAX - 1);
            snprintf(p.model_dir, sizeof p.model_dir, "%s", v);
            break;
        case 1: if (parse_i64(v, 0, FT_PIPE_MAX_STAGES - 1, &x)) return BADP("stage=%.20s", v); p.stage = (int)x; break;
        case 2: if (parse_i64(v, 1, FT_PIPE_MAX_STAGES, &x)) return BADP("stages=%.20s", v); p.n_stages = (int)x; break;
        case 3: {
            const char *c = strchr(v, ',');
            char a[32];
            if (!c || (size_t)(c - v) >= sizeof a) return BADP("layers=%.40s: expected L0,L1", v);
            memcpy(a, v, (size_t)(c - v));
            a[c - v] = 0;
            if (parse_i64(a, 0, FT_MAX_LAYERS, &x) || parse_i64(c + 1, 0, FT_MAX_LAYERS, &y) || x > y)
                return BADP("layers=%.40s: 0 <= L0 <= L1 <= %d", v, FT_MAX_LAYERS);
            p.l0 = (int)x;
            p.l1 = (int)y;
            break;
        }
        case 4: if (parse_i64(v, 1, 65536, &x)) return BADP("batch=%.20s", v); p.max_batch = (int)x; break;
        case 5: if (parse_i64(v, 1, 1 << 24, &x)) return BADP("seq=%.20s", v); p.max_seq = (int)x; break;
        case 6: if (parse_i64(v, 1, 1 << 24, &x)) return BADP("rows=%.20s", v); p.max_rows = (int)x; break;
        case 7: if (parse_i64(v, 0, 1024, &x)) return BADP("threads=%.20s", v); p.threads = (unsigned)x; break;
        case 8:
            if (parse_i64(v, FT_WEIGHTS_AS_STORED, FT_WF_Q4, &x)) return BADP("weights=%.20s", v);
            p.weights = (int)x;
            break;
        case 9:
            if (parse_i64(v, 0, 64, &x) || (x != FT_F32 && x != FT_BF16 && x != FT_F16)) return BADP("kv=%.20s", v);
            p.kv_dtype = (int)x;
            break;
        case 10: if (parse_i64(v, 0, FT_CONFIG_STRICT, &x)) return BADP("flags=%.20s", v); p.config_flags = (unsigned)x; break;
        case 11: {
            char *e;
            if (strlen(v) != 16) return BADP("job=%.20s: 16 hex digits", v);
            unsigned long long j = strtoull(v, &e, 16);
            if (*e) return BADP("job=%.20s: 16 hex digits", v);
            p.job = j;
            break;
        }
        case 12:
            if (strlen(v) >= sizeof p.policy) return BADP("policy of %zu bytes", strlen(v));
            snprintf(p.policy, sizeof p.policy, "%s", v);
            break;
        }
    }
    for (int i = 0; i < NK; i++)
        if (!seen[i]) return BADP("'%s' missing", keys[i]);
    if (p.stage >= p.n_stages) return BADP("stage %d of %d", p.stage, p.n_stages);
    if (p.max_rows < 1) return BADP("rows=0");
    *out = p;
    return FT_OK;
}

/* ----------------------------------------------------------------- stage */

ft_status ft_pipe_stage_create(const ft_pipe_stage_params *p, const ft_offload_params *off, ft_pipe_stage **out)
{
    if (!p || !out) return ft_set_error(FT_ERR_INVALID_ARG, "stage: NULL argument");
    if (p->n_stages < 1 || p->n_stages > FT_PIPE_MAX_STAGES || p->stage < 0 || p->stage >= p->n_stages)
        return ft_set_error(FT_ERR_INVALID_ARG, "stage %d of %d", p->stage, p->n_stages);
    ft_pipe_stage *s = calloc(1, sizeof *s);
    if (!s) return FT_ERR_NOMEM;
    s->p = *p;
    ft_status st;
    ft_load_params lp;
    ft_load_params_default(&lp);
    lp.external_layers = 1;
    lp.weights = p->weights;
    lp.config_flags = p->config_flags;
    if ((st = ft_model_load(p->model_dir, &lp, &s->m))) goto fail;
    const ft_model_config *cfg = ft_model_get_config(s->m);
    if (p->l0 < 0 || p->l1 > cfg->n_layers || p->l0 > p->l1 || (p->stage == 0) != (p->l0 == 0) ||
        (p->stage == 0 && p->l1 == 0) || (p->stage == p->n_stages - 1 && p->l1 != cfg->n_layers)) {
        st = ft_set_error(FT_ERR_INVALID_ARG, "stage %d of %d: layers [%d, %d) of a model of %d layers (stage 0 "
                          "starts at layer 0 and holds one at least, the last stage ends with the last layer)",
                          p->stage, p->n_stages, p->l0, p->l1, cfg->n_layers);
        goto fail;
    }
    ft_model_release_globals(s->m, p->l0 == 0, p->l1 == cfg->n_layers);
    ft_offload_params op;
    if (off) op = *off;
    else ft_offload_default_params(&op);
    if (p->policy[0] && (st = ft_policy_parse(p->policy, &op.policy))) goto fail;
    if (op.policy.c_pct[FT_TIER_DEVICE] != 100.0f) {
        st = ft_set_error(FT_ERR_UNSUPPORTED, "stage %d: a pipeline stage keeps its KV cache in memory (c=100); "
                          "it may offload its weights (w=)", p->stage);
        goto fail;
    }
    op.layer_begin = p->l0;
    op.layer_end = p->l1;
    op.progress = NULL;
    /* a stage without layers (the head alone) has nothing to schedule */
    if (p->l0 < p->l1 && (st = ft_offload_create(s->m, p->model_dir, &op, &s->off))) goto fail;
    ft_ctx_params cp;
    memset(&cp, 0, sizeof cp);
    cp.max_batch = p->max_batch;
    cp.max_seq = p->max_seq;
    cp.max_rows = p->max_rows;
    cp.threads = p->threads;
    cp.kv_dtype = (ft_dtype)p->kv_dtype;
    if ((st = ft_ctx_create(s->m, &cp, &s->ctx))) goto fail;
    if (s->off) ft_ctx_set_layer_hook(s->ctx, ft_offload_hook, s->off);
    s->lim.max_batch = (uint32_t)p->max_batch;
    s->lim.max_rows = (uint32_t)p->max_rows;
    s->lim.hidden = (uint32_t)cfg->hidden;
    s->lim.vocab = (uint32_t)cfg->vocab;
    s->cap = ft_pipe_msg_size(FT_PM_HIDDEN, (uint32_t)p->max_batch, (uint32_t)p->max_rows, (uint32_t)cfg->hidden, 0);
    size_t step = ft_pipe_msg_size(FT_PM_STEP, (uint32_t)p->max_batch, (uint32_t)p->max_rows, 0, 0);
    if (step > s->cap) s->cap = step;
    if (s->cap < FT_PIPE_HDR + FT_PIPE_ERR_MAX) s->cap = FT_PIPE_HDR + FT_PIPE_ERR_MAX;
    s->in = ft_malloc_aligned(s->cap, 64);
    s->out = ft_malloc_aligned(s->cap, 64);
    s->slots = calloc((size_t)p->max_batch, sizeof *s->slots);
    s->ntok = calloc((size_t)p->max_batch, sizeof *s->ntok);
    s->tokp = calloc((size_t)p->max_batch, sizeof *s->tokp);
    s->tok = calloc((size_t)p->max_rows, sizeof *s->tok);
    if (!s->in || !s->out || !s->slots || !s->ntok || !s->tokp || !s->tok) {
        st = ft_set_error(FT_ERR_NOMEM, "stage: message buffers");
        goto fail;
    }
    *out = s;
    return FT_OK;
fail:
    ft_pipe_stage_free(s);
    return st;
}

void ft_pipe_stage_free(ft_pipe_stage *s)
{
    if (!s) return;
    ft_ctx_free(s->ctx);
    ft_offload_free(s->off);
    ft_model_free(s->m);
    ft_free_aligned(s->in);
    ft_free_aligned(s->out);
    free(s->slots);
    free(s->ntok);
    free(s->tokp);
    free(s->tok);
    free(s);
}

const ft_model_config *ft_pipe_stage_config(const ft_pipe_stage *s) { return s ? ft_model_get_config(s->m) : NULL; }
ft_offload *ft_pipe_stage_offload(ft_pipe_stage *s) { return s ? s->off : NULL; }
ft_model *ft_pipe_stage_model(ft_pipe_stage *s) { return s ? s->m : NULL; }
const ft_pipe_stage_params *ft_pipe_stage_get_params(const ft_pipe_stage *s) { return s ? &s->p : NULL; }
uint64_t ft_pipe_stage_kv_bytes(const ft_pipe_stage *s) { return s ? ft_ctx_kv_bytes(s->ctx) : 0; }

/* Unpack a parsed STEP/HIDDEN message's sequences (and tokens) into the
 * stage's arrays. */
void ft_pipe_stage_unpack(ft_pipe_stage *s, const ft_pipe_msg *m)
{
    size_t r = 0;
    for (uint32_t i = 0; i < m->n_seq; i++) {
        ft_pipe_msg_seq(m, i, &s->slots[i], &s->ntok[i]);
        if (m->type == FT_PM_STEP) {
            s->tokp[i] = s->tok + r;
            memcpy(s->tok + r, m->data + 4 * r, s->ntok[i] * 4);
        }
        r += s->ntok[i];
    }
}
