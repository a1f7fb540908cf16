/* The batched, layer-major forward pass.
 *
 * All new tokens of all sequences in a call are stacked into one matrix of
 * `rows` rows, so each linear layer is one sgemm over the batch (prefill:
 * every prompt token of every sequence; decode: one row per sequence).
 * Attention is per (sequence, head) on the thread pool, against that
 * sequence's KV cache. Nothing here allocates: every buffer is sized in
 * ft_ctx_create. */
#include "engine_internal.h"
#include "kernels.h"
#include "wkernels.h"
#include "graph.h"
#include "moe.h"
#include "lora.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct ft_ctx {
    const ft_model *m;
    ft_ctx_params p;
    ft_pool *pool;
    unsigned threads;
    int qdim, kvdim, edim;          /* edim = max(hidden, word_embed_proj_dim) */
    uint8_t *kv;                    /* per layer at kv_off[l]: [k|v][slot][kv_rows[l]][kvdim] of kv_dtype */
    size_t kv_esize;                /* bytes per cached element (4 or 2) */
    size_t *kv_off;                 /* per layer: offset of its block in kv (elements) */
    int *kv_rows;                   /* per layer: rows per slot, max_seq or its window (ring) */
    int *win;                       /* per layer: attention window, 0 = full */
    size_t kv_floats;
    int ring_dirty;                 /* a ring was advanced in the current forward */
    int *seq_len;
    float *rope_cos, *rope_sin;     /* [max_seq][head_dim/2] */
    float *lrope_cos, *lrope_sin;   /* gemma3: the sliding layers' table (rope_local_theta) */
    float *normw;                   /* (1 + w) of the current norm (norm_plus_one) */
    /* MoE scratch: router logits [R][E], routes [R][k], groups, the
     * gathered rows of one expert and its output [R][hidden] */
    float *moe_logits, *moe_wt, *moe_gwt, *moe_x, *moe_y, *moe_in;
    int *moe_idx, *moe_start, *moe_grow;
    float *x, *xb, *q, *k, *v, *att, *h1, *h2, *sel, *sel2, *scores;
    int *row_seq, *row_pos, *row0;
    int32_t *row_tok;               /* the call's token per row */
    uint64_t scratch_bytes;
    ft_layer_hook hook;
    void *hook_user;
    ft_kv_hooks kvh;
    float **kk, **vv;               /* external KV: per sequence, the hooks' f32 K/V */
    const void **ck, **cv;          /* per sequence of the call: this layer's K/V (kv_dtype) */
    void *wkws;                     /* prepared activations of one product (wkernels) */
    void *gs_dst, *gs_raw;          /* streamed embeddings / LM head: one chunk of rows in
                                       the compute format, and as read (checkpoint dtype) */
    void *gs_dst2, *gs_raw2;        /* a head read past the page cache: the second chunk,
                                       filled by gs_rd while the pool computes the first */
    ft_gs_reader *gs_rd;            /* its reader thread (NULL: none) */
    size_t wkws_size;
    float *kvt;                     /* per worker: a window's K and V rows widened to f32 */
    int *past;                      /* per sequence: cached tokens before the call */
    /* per-call state read by pool tasks */
    int layer;
    size_t n;
    const int *slots;
    const size_t *ntok;
    int rows;
    ft_layer_weights lw;            /* the current layer's weights (hook-filled copy) */
    const ft_kv_step *step;         /* external KV: the call's sequences */
    float *out_logits;              /* the caller's logits (FT_GB_LOGITS) */
    const ft_lora *lora;            /* adapters (ft_ctx_set_lora), NULL: none */
    float *lora_t, *lora_u;         /* [max_rows][max rank], [max_rows][max out] */
    size_t lora_bytes;              /* their bytes (in scratch_bytes) */
};

static float *falloc(ft_ctx *c, size_t n)
{
    c->scratch_bytes += n * sizeof(float);
    float *p = ft_malloc_aligned((n ? n : 1) * sizeof(float), 64);
    return p;
}

/* RoPE inverse frequencies, in f32 as transformers computes them
 * (modeling_rope_utils.py: every tensor op in f32, the scalars of the
 * yarn correction range in double as Python computes them). */
void ft_rope_inv_freq(const ft_model_config *cfg, float *inv, int half)
{
    int dim = cfg->head_dim;
    for (int i = 0; i < half; i++)
        inv[i] = 1.0f / powf(cfg->rope_theta, (float)(2 * i) / (float)dim);
    switch (cfg->rope_type) {
    case FT_ROPE_LINEAR:
        for (int i = 0; i < half; i++) inv[i] = inv[i] / cfg->rope_factor;
        return;
    case FT_ROPE_DYNAMIC:
        /* base * (factor * seq_len / max_pos - (factor - 1)) ** (dim / (dim - 2))
         * with seq_len = max(positions + 1, max_pos): the base is unchanged
         * while contexts stay within max_position_embeddings, as they do here */
        return;
    case FT_ROPE_LLAMA3: {
        float factor = cfg->rope_factor, lo = cfg->rope_low_freq_factor, hi = cfg->rope_high_freq_factor;
        float old = (float)cfg->rope_orig_max_pos;
        float low_wl = old / lo, high_wl = old / hi;
        for (int i = 0; i < half; i++) {
            float wl = 2.0f * (float)M_PI / inv[i];
            float f = wl > low_wl ? inv[i] / factor : inv[i];
            float smooth = (old / wl - lo) / (hi - lo);
            float smoothed = (1.0f - smooth) * f / factor + smooth * f;
            int medium = !(wl < high_wl) && !(wl > low_wl);
            inv[i] = medium ? smoothed : f;
        }
        return;
    }
    case FT_ROPE_YARN: {
        double base = cfg->rope_theta, orig = cfg->rope_orig_max_pos;
        /* find_correction_dim / find_correction_range */
        double lo = (dim * log(orig / (cfg->rope_beta_fast * 2 * M_PI))) / (2 * log(base));
        double hi = (dim * log(orig / (cfg->rope_beta_slow * 2 * M_PI))) / (2 * log(base));
        if (cfg->rope_truncate) { lo = floor(lo); hi = ceil(hi); }
        if (lo < 0) lo = 0;
        if (hi > dim - 1) hi = dim - 1;
        if (lo == hi) hi += 0.001;
        float factor = cfg->rope_factor;
        for (int i = 0; i < half; i++) {
            float pf = powf(cfg->rope_theta, (float)(2 * i) / (float)dim);
            float extra = 1.0f / pf, interp = 1.0f / (factor * pf);
            float ramp = ((float)i - (float)lo) / (float)(hi - lo);
            ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
            float ef = 1.0f - ramp;
            inv[i] = interp * (1.0f - ef) + extra * ef;
        }
        return;
    }
    default:
        return;
    }
}

/* cos/sin tables [npos][head_dim/2], scaled by yarn's attention factor as
 * transformers scales them (1 for the other types). */
void ft_rope_tables(const ft_model_config *cfg, size_t npos, float *cs, float *sn)
{
    int half = cfg->head_dim / 2;
    float inv[LIM_HALF_HEAD], af = cfg->rope_attention_factor;
    ft_rope_inv_freq(cfg, inv, half);
    for (size_t pos = 0; pos < npos; pos++)
        for (int i = 0; i < half; i++) {
            float f = (float)pos * inv[i];
            cs[pos * half + i] = cosf(f) * af;
            sn[pos * half + i] = sinf(f) * af;
        }
}

/* Sliding windows. A layer whose window W is shorter than the context
 * keeps, in a context that holds its own KV cache, a ring of W rows per
 * sequence: position p lives in row p % W. Attention of a row at position
 * p covers positions [attn_start, p]: the part before the call's first new
 * position from the ring, the rest from this call's K/V rows; the ring is
 * written after attention. With external_kv (the offloader) the layer
 * keeps full rows and attention is only masked to the window. */
static int attn_start(int window, int pos) { return window > 0 && pos >= window ? pos - window + 1 : 0; }
static int ring_row(int rows, int pos) { return pos % rows; }

int ft_config_min_window(const ft_model_config *cfg)
{
    int w = 0;
    for (int l = 0; l < cfg->n_layers; l++) {
        int x = ft_model_config_layer_window(cfg, l);
        if (x && (!w || x < w)) w = x;
    }
    return w;
}

/* The product workspace: the largest any matrix of the model needs at
 * max_rows rows, in any format it may be computed in (an offloading
 * scheduler may hand q8/q4 views of a plain model's layers). One function
 * for ft_ctx_create and ft_ctx_estimate. */
static size_t ctx_ws_need(const ft_model_config *cfg, int qdim, int kvdim, int rows)
{
    int dims[][2] = {{qdim, cfg->hidden}, {kvdim, cfg->hidden}, {cfg->hidden, qdim},
                     {cfg->ffn, cfg->hidden}, {cfg->hidden, cfg->ffn}, {cfg->hidden, cfg->word_embed_proj_dim},
                     {cfg->word_embed_proj_dim, cfg->hidden}, {cfg->vocab, cfg->word_embed_proj_dim},
                     {cfg->n_experts ? cfg->n_experts : 1, cfg->hidden},
                     {cfg->moe_ffn ? cfg->moe_ffn : 1, cfg->hidden}, {cfg->hidden, cfg->moe_ffn ? cfg->moe_ffn : 1},
                     {1, cfg->hidden}};
    size_t need = 0;
    for (size_t d = 0; d < sizeof dims / sizeof dims[0]; d++)
        for (int f = FT_WF_F32; f <= FT_WF_Q4; f++) {
            ft_wmat w = {.fmt = (ft_wfmt)f, .rows = dims[d][0], .cols = dims[d][1],
                         .group = ft_wmat_group_for(dims[d][1]), .rows_per_chunk = 1};
            if ((f == FT_WF_Q8 || f == FT_WF_Q4) && !w.group) continue;
            size_t z = ft_wk_ws_size(&w, rows);
            if (z > need) need = z;
        }
    return need;
}

/* Bytes of one chunk of streamed matrix g in the compute format, or
 * (raw) as read: 0 when they agree (read straight into the compute
 * buffer). For a layout-only model (planning) the chunk is sized from
 * the shapes as ft_gstream_chunk_rows would. */
static size_t gs_chunk_bytes(const ft_gstream *g, int raw)
{
    ft_dtype fd = g->fmt == FT_WF_BF16 ? FT_BF16 : g->fmt == FT_WF_F16 ? FT_F16 : FT_F32;
    if (raw && g->src == fd) return 0;
    return (size_t)ft_gstream_chunk_rows(g) * (size_t)ft_dtype_nbytes(raw ? g->src : fd, (size_t)g->cols);
}

/* Bytes of one chunk buffer for the streamed globals (a chunk of the
 * head; an embedding row fits in it), with room for a direct read's
 * blocks either side (FT_GSTREAM_SLACK; the buffers are 4 KiB-aligned). */
static size_t gs_buf_bytes(const ft_model *m, int raw)
{
    size_t z = 0;
    const ft_gstream *gs[2] = {m->gs_emb, m->gs_head};
    for (int i = 0; i < 2; i++) {
        size_t b = gs[i] ? gs_chunk_bytes(gs[i], raw) : 0;
        if (b > z) z = b;
    }
    return z ? z + FT_GSTREAM_SLACK : 0;
}

/* The second chunk buffer of a head read past the page cache (the
 * reader fills one while the pool computes the other): a head chunk with
 * the same slack; 0 for a head read through the page cache (the kernel
 * reads it ahead) or none. */
static size_t gs_ahead_bytes(const ft_model *m, int raw)
{
    if (!m->gs_head || !m->gs_head->direct) return 0;
    size_t z = gs_chunk_bytes(m->gs_head, raw);
    return z ? z + FT_GSTREAM_SLACK : 0;
}

ft_status ft_ctx_create(const ft_model *m, const ft_ctx_params *p, ft_ctx **out)
{
    if (!m || !p || !out) return ft_set_error(FT_ERR_INVALID_ARG, "ctx: NULL argument");
    const ft_model_config *cfg = &m->cfg;
    if (p->max_batch < 1 || p->max_batch > 65536 || p->max_seq < 1)
        return ft_set_error(FT_ERR_INVALID_ARG, "ctx: max_batch %d / max_seq %d out of range",
                            p->max_batch, p->max_seq);
    if (p->max_seq > cfg->max_pos)
        return ft_set_error(FT_ERR_INVALID_ARG, "ctx: context of %d tokens exceeds the model's "
                            "max_position_embeddings = %d", p->max_seq, cfg->max_pos);
    if (p->kv_dtype != FT_F32 && p->kv_dtype != FT_BF16 && p->kv_dtype != FT_F16)
        return ft_set_error(FT_ERR_INVALID_ARG, "ctx: KV cache dtype %s (f32, bf16 or f16)",
                            ft_dtype_name(p->kv_dtype));
    if (p->external_kv && p->kv_dtype != FT_F32)
        return ft_set_error(FT_ERR_INVALID_ARG, "ctx: an external (offloaded) KV cache exchanges f32 rows; "
                            "kv_dtype must be f32");
    ft_ctx *c = calloc(1, sizeof *c);
    if (!c) return ft_set_error(FT_ERR_NOMEM, "ctx: allocation");
    c->m = m;
    c->p = *p;
    if (c->p.max_rows <= 0) {
        int64_t r = (int64_t)p->max_batch * p->max_seq;
        c->p.max_rows = r > (1 << 24) ? (1 << 24) : (int)r;
    }
    c->threads = p->threads ? p->threads : ft_default_threads();
    c->qdim = cfg->n_heads * cfg->head_dim;
    c->kvdim = cfg->n_kv_heads * cfg->head_dim;
    c->edim = cfg->hidden > cfg->word_embed_proj_dim ? cfg->hidden : cfg->word_embed_proj_dim;
    size_t R = (size_t)c->p.max_rows, B = (size_t)p->max_batch, S = (size_t)p->max_seq;
    c->kv_off = calloc((size_t)cfg->n_layers, sizeof *c->kv_off);
    c->kv_rows = calloc((size_t)cfg->n_layers, sizeof *c->kv_rows);
    c->win = calloc((size_t)cfg->n_layers, sizeof *c->win);
    if (!c->kv_off || !c->kv_rows || !c->win) {
        free(c->kv_off); free(c->kv_rows); free(c->win); free(c);
        return ft_set_error(FT_ERR_NOMEM, "ctx: allocation");
    }
    size_t kvn = 0;
    for (int l = 0; l < cfg->n_layers; l++) {
        c->win[l] = ft_model_config_layer_window(cfg, l);
        c->kv_rows[l] = c->win[l] && c->win[l] < p->max_seq && !p->external_kv ? c->win[l] : p->max_seq;
        c->kv_off[l] = kvn;
        if (!p->external_kv) kvn += 2 * B * (size_t)c->kv_rows[l] * (size_t)c->kvdim;
    }
    c->kv_floats = kvn;
    ft_status st = ft_pool_create(c->threads, &c->pool);
    if (st) { free(c->kv_off); free(c->kv_rows); free(c->win); free(c); return st; }
    c->kv_esize = (size_t)ft_dtype_nbytes(p->kv_dtype, 1);
    c->kv = kvn ? ft_malloc_aligned(kvn * c->kv_esize, 64) : NULL;
    c->seq_len = calloc(B, sizeof(int));
    c->kk = calloc(B, sizeof(float *));
    c->vv = calloc(B, sizeof(float *));
    c->past = calloc(B, sizeof(int));
    c->ck = calloc(B, sizeof(void *));
    c->cv = calloc(B, sizeof(void *));
    size_t selrows = c->p.all_logits ? R : B;
    c->x = falloc(c, R * (size_t)c->edim);
    c->xb = falloc(c, R * (size_t)c->edim);
    c->q = falloc(c, R * (size_t)c->qdim);
    c->k = falloc(c, R * (size_t)c->kvdim);
    c->v = falloc(c, R * (size_t)c->kvdim);
    c->att = falloc(c, R * (size_t)c->qdim);
    size_t fw = (size_t)(cfg->moe_ffn > cfg->ffn ? cfg->moe_ffn : cfg->ffn);
    c->h1 = falloc(c, R * fw);
    c->h2 = falloc(c, R * fw);
    c->normw = falloc(c, (size_t)cfg->hidden + (size_t)c->qdim + (size_t)c->kvdim);
    if (cfg->n_experts) {
        size_t E = (size_t)cfg->n_experts, K = (size_t)cfg->n_experts_used;
        c->moe_logits = falloc(c, R * E);
        c->moe_wt = falloc(c, R * K);
        c->moe_gwt = falloc(c, R * K);
        c->moe_x = falloc(c, R * (size_t)cfg->hidden);
        c->moe_y = falloc(c, R * (size_t)cfg->hidden);
        c->moe_in = falloc(c, R * (size_t)cfg->hidden);
        c->moe_idx = calloc(R * K, sizeof(int));
        c->moe_grow = calloc(R * K, sizeof(int));
        c->moe_start = calloc(E + 1, sizeof(int));
    }
    c->sel = falloc(c, selrows * (size_t)c->edim);
    c->sel2 = falloc(c, selrows * (size_t)c->edim);
    c->scores = falloc(c, (size_t)c->threads * S);
    /* The product workspace: the largest any matrix of the model needs at
     * max_rows rows, in any format it may be computed in (an offloading
     * scheduler may hand q8/q4 views of a plain model's layers). */
    {
        size_t need = ctx_ws_need(cfg, c->qdim, c->kvdim, c->p.max_rows);
        c->wkws_size = need;
        c->scratch_bytes += need;
        c->wkws = ft_malloc_aligned(need ? need : 64, 64);
    }
    /* streamed embeddings / LM head: one chunk of rows, twice (compute
     * format, as read); a head read past the page cache a second chunk */
    if (m->gs_emb || m->gs_head) {
        size_t z = gs_buf_bytes(m, 0), zr = gs_buf_bytes(m, 1);
        size_t z2 = gs_ahead_bytes(m, 0), zr2 = gs_ahead_bytes(m, 1);
        c->gs_dst = ft_malloc_aligned(z, FT_GSTREAM_ALIGN);
        c->gs_raw = zr ? ft_malloc_aligned(zr, FT_GSTREAM_ALIGN) : NULL;
        c->gs_dst2 = z2 ? ft_malloc_aligned(z2, FT_GSTREAM_ALIGN) : NULL;
        c->gs_raw2 = zr2 ? ft_malloc_aligned(zr2, FT_GSTREAM_ALIGN) : NULL;
        c->scratch_bytes += z + zr + z2 + zr2;
    }
    /* a windowed layer over a bf16/f16 cache: the window's rows of one KV
     * head widened to f32 per worker */
    if (c->kv_esize != 4 && (ft_config_min_window(cfg) || cfg->attn_softcap != 0))
        c->kvt = falloc(c, (size_t)c->threads * 2 * S * (size_t)cfg->head_dim);
    c->row_seq = calloc(R, sizeof(int));
    c->row_tok = calloc(R, sizeof(int32_t));
    c->row_pos = calloc(R, sizeof(int));
    c->row0 = calloc(B + 1, sizeof(int));
    if (m->arch->pos == FT_POS_ROPE) {
        int half = cfg->head_dim / 2;
        c->rope_cos = falloc(c, S * (size_t)half);
        c->rope_sin = falloc(c, S * (size_t)half);
        if (c->rope_cos && c->rope_sin) ft_rope_tables(cfg, S, c->rope_cos, c->rope_sin);
        if (cfg->rope_local_theta != 0) {
            ft_model_config lc = *cfg;   /* the local RoPE: default, its own base */
            lc.rope_theta = cfg->rope_local_theta;
            lc.rope_type = FT_ROPE_DEFAULT;
            lc.rope_attention_factor = 1.0f;
            c->lrope_cos = falloc(c, S * (size_t)half);
            c->lrope_sin = falloc(c, S * (size_t)half);
            if (c->lrope_cos && c->lrope_sin) ft_rope_tables(&lc, S, c->lrope_cos, c->lrope_sin);
        }
    }
    if ((kvn && !c->kv) || !c->seq_len || ((m->gs_emb || m->gs_head) && (!c->gs_dst || (!c->gs_raw && gs_buf_bytes(m, 1)))) ||
        (!c->gs_dst2 && gs_ahead_bytes(m, 0)) || (!c->gs_raw2 && gs_ahead_bytes(m, 1)) || !c->kk || !c->vv || !c->past || !c->ck || !c->cv || !c->wkws ||
        (c->kv_esize != 4 && (ft_config_min_window(cfg) || cfg->attn_softcap != 0) && !c->kvt) || !c->x || !c->xb ||
        !c->normw || (cfg->rope_local_theta != 0 && (!c->lrope_cos || !c->lrope_sin)) ||
        (cfg->n_experts && (!c->moe_logits || !c->moe_wt || !c->moe_gwt || !c->moe_x || !c->moe_y || !c->moe_in || !c->moe_idx ||
                            !c->moe_grow || !c->moe_start)) ||
        !c->q || !c->k || !c->v || !c->att ||
        !c->h1 || !c->h2 || !c->sel || !c->sel2 || !c->scores || !c->row_seq || !c->row_tok || !c->row_pos ||
        !c->row0 || (m->arch->pos == FT_POS_ROPE && (!c->rope_cos || !c->rope_sin))) {
        ft_ctx_free(c);
        return ft_set_error(FT_ERR_NOMEM, "ctx: KV cache %.1f MiB + scratch %.1f MiB",
                            (double)kvn * (double)c->kv_esize / 1048576.0, (double)c->scratch_bytes / 1048576.0);
    }
    if (c->gs_dst2 && (st = ft_gs_reader_create(&c->gs_rd))) {
        ft_ctx_free(c);
        return st;
    }
    *out = c;
    return FT_OK;
}

void ft_ctx_free(ft_ctx *c)
{
    if (!c) return;
    ft_gs_reader_free(c->gs_rd);   /* stops a read in flight */
    ft_pool_free(c->pool);
    ft_free_aligned(c->kv);
    free(c->kv_off); free(c->kv_rows); free(c->win);
    free(c->seq_len);
    free(c->kk); free(c->vv); free(c->past); free(c->ck); free(c->cv);
    ft_free_aligned(c->wkws); ft_free_aligned(c->kvt);
    ft_free_aligned(c->gs_dst); ft_free_aligned(c->gs_raw);
    ft_free_aligned(c->gs_dst2); ft_free_aligned(c->gs_raw2);
    ft_free_aligned(c->rope_cos); ft_free_aligned(c->rope_sin);
    ft_free_aligned(c->lrope_cos); ft_free_aligned(c->lrope_sin); ft_free_aligned(c->normw);
    ft_free_aligned(c->moe_logits); ft_free_aligned(c->moe_wt); ft_free_aligned(c->moe_gwt);
    ft_free_aligned(c->moe_x); ft_free_aligned(c->moe_y); ft_free_aligned(c->moe_in);
    free(c->moe_idx); free(c->moe_grow); free(c->moe_start);
    ft_free_aligned(c->x); ft_free_aligned(c->xb); ft_free_aligned(c->q);
    ft_free_aligned(c->k); ft_free_aligned(c->v); ft_free_aligned(c->att);
    ft_free_aligned(c->h1); ft_free_aligned(c->h2); ft_free_aligned(c->sel);
    ft_free_aligned(c->sel2); ft_free_aligned(c->scores);
    free(c->row_seq); free(c->row_tok); free(c->row_pos); free(c->row0);
    ft_free_aligned(c->lora_t); ft_free_aligned(c->lora_u);
    free(c);
}

ft_status ft_ctx_set_lora(ft_ctx *c, const ft_lora *l)
{
    if (!c) return ft_set_error(FT_ERR_INVALID_ARG, "ctx_set_lora: NULL context");
    if (l && l->m != c->m) return ft_set_error(FT_ERR_INVALID_ARG, "ctx_set_lora: the adapters are of another model");
    ft_free_aligned(c->lora_t);
    ft_free_aligned(c->lora_u);
    c->lora_t = c->lora_u = NULL;
    c->lora = NULL;
    c->scratch_bytes -= c->lora_bytes;
    c->lora_bytes = 0;
    if (!l || !l->n) return FT_OK;
    size_t R = (size_t)c->p.max_rows;
    /* the products' workspace: A (rank x in) and B (out x rank) as f32 */
    size_t ws = c->wkws_size;
    for (size_t i = 0; i < l->n; i++) {
        const ft_lora_entry *e = &l->e[i];
        ft_wmat A = {FT_WF_F32, e->rank, e->in, e->A, 0, 0, NULL}, B = {FT_WF_F32, e->out, e->rank, e->B, 0, 0, NULL};
        size_t a = ft_wk_ws_size(&A, (int)R), b = ft_wk_ws_size(&B, (int)R);
        if (a > ws) ws = a;
        if (b > ws) ws = b;
    }
    if (ws > c->wkws_size) {
        void *nw = ft_malloc_aligned(ws, 64);
        if (!nw) return ft_set_error(FT_ERR_NOMEM, "ctx_set_lora: workspace of %zu bytes", ws);
        ft_free_aligned(c->wkws);
        c->scratch_bytes += ws - c->wkws_size;
        c->wkws = nw;
        c->wkws_size = ws;
    }
    c->lora_t = ft_malloc_aligned(R * (size_t)l->max_rank * sizeof(float), 64);
    c->lora_u = ft_malloc_aligned(R * (size_t)l->max_out * sizeof(float), 64);
    if (!c->lora_t || !c->lora_u) {
        ft_free_aligned(c->lora_t);
        ft_free_aligned(c->lora_u);
        c->lora_t = c->lora_u = NULL;
        return ft_set_error(FT_ERR_NOMEM, "ctx_set_lora: scratch for %zu rows", R);
    }
    c->lora_bytes = R * ((size_t)l->max_rank + (size_t)l->max_out) * sizeof(float);
    c->scratch_bytes += c->lora_bytes;
    c->lora = l;
    return FT_OK;
}

void ft_ctx_set_layer_hook(ft_ctx *c, ft_layer_hook hook, void *user)
{
    if (!c) return;
    c->hook = hook;
    c->hook_user = user;
}

void ft_ctx_set_kv_hooks(ft_ctx *c, const ft_kv_hooks *h)
{
    if (!c) return;
    if (h) c->kvh = *h;
    else memset(&c->kvh, 0, sizeof c->kvh);
}

uint64_t ft_ctx_kv_bytes(const ft_ctx *c)
{
    if (!c || c->p.external_kv) return 0;
    return (uint64_t)c->kv_floats * c->kv_esize;
}
uint64_t ft_ctx_scratch_bytes(const ft_ctx *c) { return c ? c->scratch_bytes : 0; }

/* What ft_ctx_create would allocate, without allocating: the same sizes
 * as there (test_engine checks they agree). */
ft_status ft_ctx_estimate(const ft_model *m, const ft_ctx_params *p, uint64_t *kv_bytes, uint64_t *scratch_bytes)
{
    if (!m || !p) return ft_set_error(FT_ERR_INVALID_ARG, "ctx: NULL argument");
    const ft_model_config *cfg = &m->cfg;
    if (p->max_batch < 1 || p->max_seq < 1) return ft_set_error(FT_ERR_INVALID_ARG, "ctx: empty shape");
    size_t B = (size_t)p->max_batch, S = (size_t)p->max_seq, R = (size_t)p->max_rows;
    if (p->max_rows <= 0) {
        int64_t r = (int64_t)p->max_batch * p->max_seq;
        R = r > (1 << 24) ? (1 << 24) : (size_t)r;
    }
    size_t threads = p->threads ? p->threads : ft_default_threads();
    size_t qdim = (size_t)cfg->n_heads * (size_t)cfg->head_dim, kvdim = (size_t)cfg->n_kv_heads * (size_t)cfg->head_dim;
    size_t edim = (size_t)(cfg->hidden > cfg->word_embed_proj_dim ? cfg->hidden : cfg->word_embed_proj_dim);
    uint64_t kvn = 0;
    for (int l = 0; l < cfg->n_layers; l++) {
        int w = ft_model_config_layer_window(cfg, l);
        size_t rows = w && w < p->max_seq && !p->external_kv ? (size_t)w : S;
        if (!p->external_kv) kvn += 2 * B * rows * kvdim;
    }
    size_t esz = (size_t)ft_dtype_nbytes(p->kv_dtype, 1);
    size_t selrows = p->all_logits ? R : B;
    /* the same buffers as ft_ctx_create, in floats */
    size_t fw = (size_t)(cfg->moe_ffn > cfg->ffn ? cfg->moe_ffn : cfg->ffn);
    uint64_t f = R * edim * 2 + R * qdim * 2 + R * kvdim * 2 + R * fw * 2 + selrows * edim * 2 + threads * S +
                 (size_t)cfg->hidden + qdim + kvdim;
    if (cfg->n_experts) {
        size_t E = (size_t)cfg->n_experts, K = (size_t)cfg->n_experts_used;
        f += R * E + 2 * R * K + 3 * R * (size_t)cfg->hidden;
    }
    if (esz != 4 && (ft_config_min_window(cfg) || cfg->attn_softcap != 0)) f += threads * 2 * S * (size_t)cfg->head_dim;
    if (m->arch->pos == FT_POS_ROPE) {
        f += 2 * S * (size_t)(cfg->head_dim / 2);
        if (cfg->rope_local_theta != 0) f += 2 * S * (size_t)(cfg->head_dim / 2);
    }
    uint64_t scratch = f * sizeof(float);
    scratch += ctx_ws_need(cfg, (int)qdim, (int)kvdim, (int)R);
    scratch += (uint64_t)gs_buf_bytes(m, 0) + gs_buf_bytes(m, 1) + gs_ahead_bytes(m, 0) + gs_ahead_bytes(m, 1);
    if (kv_bytes) *kv_bytes = kvn * esz;
    if (scratch_bytes) *scratch_bytes = scratch;
    return FT_OK;
}

const ft_model *ft_ctx_model(const ft_ctx *c) { return c->m; }
int ft_ctx_max_seq(const ft_ctx *c) { return c->p.max_seq; }
int ft_ctx_max_batch(const ft_ctx *c) { return c->p.max_batch; }

void ft_ctx_reset(ft_ctx *c, int slot)
{
    if (c && slot >= 0 && slot < c->p.max_batch) c->seq_len[slot] = 0;
}

int ft_ctx_seq_len(const ft_ctx *c, int slot)
{
    return (c && slot >= 0 && slot < c->p.max_batch) ? c->seq_len[slot] : 0;
}

static void *kv_ptr(const ft_ctx *c, int layer, int which, int slot)
{
    size_t S = (size_t)c->kv_rows[layer], B = (size_t)c->p.max_batch;
    return c->kv + (c->kv_off[layer] + (((size_t)which * B + (size_t)slot) * S) * (size_t)c->kvdim) * c->kv_esize;
}

/* A layer whose cache here is a ring of its window's rows. */
static int is_ring(const ft_ctx *c, int layer) { return c->kv_rows[layer] < c->p.max_seq; }

/* A ring layer still holds positions [0, len) when it never wrapped. */
static int rings_hold(const ft_ctx *c, int len)
{
    for (int l = 0; l < c->m->cfg.n_layers; l++)
        if (is_ring(c, l) && len > c->kv_rows[l]) return 0;
    return 1;
}

ft_status ft_ctx_truncate(ft_ctx *c, int slot, int len)
{
    if (!c || slot < 0 || slot >= c->p.max_batch)
        return ft_set_error(FT_ERR_INVALID_ARG, "ctx: slot %d out of range", slot);
    if (len < 0 || len > c->seq_len[slot])
        return ft_set_error(FT_ERR_INVALID_ARG, "ctx: truncate slot %d of %d tokens to %d", slot,
                            c->seq_len[slot], len);
    if (len < c->seq_len[slot] && len > 0 && !c->p.external_kv && !rings_hold(c, c->seq_len[slot]))
        return ft_set_error(FT_ERR_UNSUPPORTED, "ctx: slot %d's sliding-window ring has wrapped: its first "
                            "%d positions are gone", slot, len);
    c->seq_len[slot] = len;
    return FT_OK;
}

ft_status ft_ctx_kv_rows(ft_ctx *c, int slot, int len, void *buf, size_t cap, int import, int rows_in_buf)
{
    if (!c || slot < 0 || slot >= c->p.max_batch)
        return ft_set_error(FT_ERR_INVALID_ARG, "ctx: slot %d out of range", slot);
    if (c->p.external_kv)
        return ft_set_error(FT_ERR_UNSUPPORTED, "ctx: the KV cache is external (offloaded)");
    if (rows_in_buf < len || len < 0 || len > c->p.max_seq || (!import && len > c->seq_len[slot]))
        return ft_set_error(FT_ERR_INVALID_ARG, "ctx: %d KV rows of slot %d (it holds %d; the buffer %d)", len, slot,
                            c->seq_len[slot], rows_in_buf);
    if (!rings_hold(c, import ? len : c->seq_len[slot]))
        return ft_set_error(FT_ERR_UNSUPPORTED, "ctx: slot %d's sliding-window ring cannot hold positions "
                            "0..%d", slot, len);
    size_t row = (size_t)c->kvdim * c->kv_esize, L = (size_t)c->m->cfg.n_layers;
    if (cap < 2 * L * (size_t)rows_in_buf * row)
        return ft_set_error(FT_ERR_BUFFER_SMALL, "ctx: %zu bytes for %d KV rows of %zu layers", cap, rows_in_buf,
                            (size_t)L);
    uint8_t *b = buf;
    for (size_t l = 0; l < L; l++)
        for (int w = 0; w < 2; w++) {
            uint8_t *p = b + ((l * 2 + (size_t)w) * (size_t)rows_in_buf) * row;
            if (import) memcpy(kv_ptr(c, (int)l, w, slot), p, (size_t)len * row);
            else memcpy(p, kv_ptr(c, (int)l, w, slot), (size_t)len * row);
        }
    if (import) c->seq_len[slot] = len;
    return FT_OK;
}

ft_dtype ft_ctx_kv_dtype(const ft_ctx *c) { return c->p.kv_dtype; }

ft_status ft_ctx_copy_prefix(ft_ctx *c, int src, int dst, int len)
{
    if (!c || src < 0 || src >= c->p.max_batch || dst < 0 || dst >= c->p.max_batch)
        return ft_set_error(FT_ERR_INVALID_ARG, "ctx: slot %d / %d out of range", src, dst);
    if (len < 0 || len > c->seq_len[src])
        return ft_set_error(FT_ERR_INVALID_ARG, "ctx: copy %d tokens of slot %d, which holds %d", len, src,
                            c->seq_len[src]);
    if (c->p.external_kv)
        return ft_set_error(FT_ERR_UNSUPPORTED, "ctx: the KV cache is external (offloaded): copying a slot "
                            "is the offloader's");
    if (!rings_hold(c, c->seq_len[src]))
        return ft_set_error(FT_ERR_UNSUPPORTED, "ctx: slot %d's sliding-window ring has wrapped: its first "
                            "%d positions are gone", src, len);
    if (src == dst) return ft_ctx_truncate(c, dst, len);
    size_t row = (size_t)c->kvdim * c->kv_esize;
    for (int l = 0; l < c->m->cfg.n_layers; l++)
        for (int w = 0; w < 2; w++)
            memcpy(kv_ptr(c, l, w, dst), kv_ptr(c, l, w, src), (size_t)len * row);
    c->seq_len[dst] = len;
    return FT_OK;
}

ft_status ft_ctx_kv(ft_ctx *c, int layer, int slot, float **k, float **v, int *len, int *kv_dim)
{
    if (!c || layer < 0 || layer >= c->m->cfg.n_layers || slot < 0 || slot >= c->p.max_batch)
        return ft_set_error(FT_ERR_INVALID_ARG, "ctx: layer %d / slot %d out of range", layer, slot);
    if (c->p.external_kv)
        return ft_set_error(FT_ERR_UNSUPPORTED, "ctx: the KV cache is external (offloaded)");
    if (is_ring(c, layer))
        return ft_set_error(FT_ERR_UNSUPPORTED, "ctx: layer %d keeps a ring of its sliding window's %d "
                            "rows, not every position", layer, c->kv_rows[layer]);
    if (c->p.kv_dtype != FT_F32)
        return ft_set_error(FT_ERR_UNSUPPORTED, "ctx: the KV cache is %s (ft_ctx_kv gives f32 caches)",
                            ft_dtype_name(c->p.kv_dtype));
    if (k) *k = kv_ptr(c, layer, 0, slot);
    if (v) *v = kv_ptr(c, layer, 1, slot);
    if (len) *len = c->seq_len[slot];
    if (kv_dim) *kv_dim = c->kvdim;
    return FT_OK;
}

/* ------------------------------------------------------------- helpers */

/* Every product goes through the stored-format kernels (wkernels.h): the
 * activations are prepared once (transposed, or quantized per group for
 * q8/q4) into the context's workspace, then output rows are split over
 * the pool in chunks of whole kernel blocks (24 outputs). The kernel
 * chooses its form from the format and the row count only (decode: 1-32
 * rows; prefill: panels; bf16 with FLEXTIER_BF16_ACTIVATIONS: one
 * batch-invariant form at every row count), so any split gives the same
 * values. */
typedef struct { float *y; const ft_wk_act *a; const ft_wmat *W; const float *b; int chunk; } wk_job;

static void wk_task(void *arg, size_t i, unsigned worker)
{
    (void)worker;
    const wk_job *j = arg;
    int o0 = (int)i * j->chunk, o1 = o0 + j->chunk;
    if (o1 > j->W->rows) o1 = j->W->rows;
    ft_wk_product(j->y, j->W->rows, j->a, j->W, o0, o1, j->b);
}

/* y[rows, out] = x[rows, in] W[out, in]^T + b, with in = W->cols, out = W->rows */
static ft_status linear_ctx(ft_ctx *c, float *y, const float *x, int rows, const ft_wmat *W, const float *b)
{
    ft_wk_act a;
    ft_status st = ft_wk_prep(&a, c->wkws, c->wkws_size, W, x, rows);
    if (st) return st;
    int out = W->rows;
    int tasks = c->threads == 1 ? 1 : (int)c->threads * 4;
    int chunk = (out + tasks - 1) / tasks;
    chunk = (chunk + 23) / 24 * 24;
    wk_job j = {y, &a, W, b, chunk};
    size_t n = (size_t)((out + chunk - 1) / chunk);
    ft_pool_run(n > 1 ? c->pool : NULL, n, wk_task, &j);
    return FT_OK;
}
#define linear(...) do { ft_status st_ = linear_ctx(c, __VA_ARGS__); if (st_) return st_; } while (0)

/* Row-parallel loops on the pool, in chunks. */
typedef void (*rows_fn)(ft_ctx *c, int r0, int r1, const void *a);
typedef struct { ft_ctx *c; rows_fn fn; const void *a; int rows, chunk; } rows_job;

static void rows_task(void *arg, size_t i, unsigned worker)
{
    (void)worker;
    rows_job *j = arg;
    int r0 = (int)i * j->chunk, r1 = r0 + j->chunk;
    if (r1 > j->rows) r1 = j->rows;
    j->fn(j->c, r0, r1, j->a);
}

static void par_rows(ft_ctx *c, int rows, rows_fn fn, const void *a)
{
    if (rows <= 4 || c->threads == 1) { fn(c, 0, rows, a); return; }
    int chunk = (rows + (int)c->threads * 4 - 1) / ((int)c->threads * 4);
    if (chunk < 1) chunk = 1;
    rows_job j = {c, fn, a, rows, chunk};
    ft_pool_run(c->pool, (size_t)((rows + chunk - 1) / chunk), rows_task, &j);
}

typedef struct { float *out; const float *in; const float *w, *b; int dim; } norm_args;

/* gemma: the norm's weights as (1 + w), in f32 as transformers adds them */
static const float *norm_weights(ft_ctx *c, const float *w, int dim)
{
    if (!c->m->cfg.norm_plus_one || !w) return w;
    for (int i = 0; i < dim; i++) c->normw[i] = 1.0f + w[i];
    return c->normw;
}

static void norm_rows(ft_ctx *c, int r0, int r1, const void *arg)
{
    const norm_args *a = arg;
    float eps = c->m->cfg.norm_eps;
    for (int r = r0; r < r1; r++) {
        float *o = a->out + (size_t)r * a->dim;
        const float *x = a->in + (size_t)r * a->dim;
        if (c->m->arch->norm == FT_NORM_RMS) ft_k_rmsnorm(o, x, a->w, a->dim, eps);
        else ft_k_layernorm(o, x, a->w, a->b, a->dim, eps);
    }
}

static void norm(ft_ctx *c, float *out, const float *in, int rows, int dim, const float *w, const float *b)
{
    norm_args a = {out, in, norm_weights(c, w, dim), b, dim};
    par_rows(c, rows, norm_rows, &a);
}

static void rope_rows(ft_ctx *c, int r0, int r1, const void *arg)
{
    (void)arg;
    const ft_model_config *cfg = &c->m->cfg;
    int half = cfg->head_dim / 2;
    int local = c->lrope_cos && cfg->layer_sliding[c->layer];
    const float *tc = local ? c->lrope_cos : c->rope_cos, *ts = local ? c->lrope_sin : c->rope_sin;
    for (int r = r0; r < r1; r++) {
        const float *cs = tc + (size_t)c->row_pos[r] * half;
        const float *sn = ts + (size_t)c->row_pos[r] * half;
        ft_k_rope(c->q + (size_t)r * c->qdim, cfg->n_heads, cfg->head_dim, cs, sn);
        ft_k_rope(c->k + (size_t)r * c->kvdim, cfg->n_kv_heads, cfg->head_dim, cs, sn);
    }
}

/* Rows [a, a + n) of one KV head of a bf16/f16 cache (row stride ld
 * elements) widened to f32 at dst (row stride hd). */
static void widen_rows(float *dst, const uint16_t *src, int a, int n, int ld, int hd, ft_dtype dt)
{
    for (int p = 0; p < n; p++) {
        const uint16_t *r = src + (size_t)(a + p) * ld;
        if (dt == FT_BF16) ft_bf16_to_f32(dst + (size_t)p * hd, r, (size_t)hd);
        else ft_f16_to_f32(dst + (size_t)p * hd, r, (size_t)hd);
    }
}

/* attend_segs with gemma2's soft-capping of the scores:
 * cap * tanh(score * scale / cap) before the softmax, as transformers'
 * eager attention computes it. */
static void attend_segs_capped(float *out, const float *q, const ft_attn_seg *seg, int nseg, int ld, int hd,
                               float scale, float cap, float *sc)
{
    const ft_kernels *kn = ft_k_get();
    int np = 0;
    for (int s = 0; s < nseg; s++)
        for (int p = 0; p < seg[s].n; p++) {
            float x = kn->dot(q, seg[s].k + (size_t)p * ld, hd) * scale;
            sc[np++] = tanhf(x / cap) * cap;
        }
    kn->softmax(sc, np);
    for (int i = 0; i < hd; i++) out[i] = 0;
    np = 0;
    for (int s = 0; s < nseg; s++)
        for (int p = 0; p < seg[s].n; p++) kn->axpy(out, sc[np++], seg[s].v + (size_t)p * ld, hd);
}

static void attend_segs_any(const ft_ctx *c, float *out, const float *q, const ft_attn_seg *seg, int nseg, int ld,
                            int hd, float scale, float *sc)
{
    float cap = c->m->cfg.attn_softcap;
    if (cap != 0) attend_segs_capped(out, q, seg, nseg, ld, hd, scale, cap, sc);
    else ft_k_get()->attend_segs(out, q, seg, nseg, ld, hd, scale, sc);
}

/* Attention for one (sequence, head): causal over the cache, within the
 * layer's window. */
static void attn_task(void *arg, size_t t, unsigned worker)
{
    ft_ctx *c = arg;
    const ft_model_config *cfg = &c->m->cfg;
    size_t j = t / (size_t)cfg->n_heads;
    int h = (int)(t % (size_t)cfg->n_heads);
    int hd = cfg->head_dim;
    int kvh = h / (cfg->n_heads / cfg->n_kv_heads);
    const int half = c->p.kv_dtype != FT_F32;
    size_t koff = (size_t)kvh * hd * c->kv_esize;
    const void *K = (const uint8_t *)c->ck[j] + koff;
    const void *V = (const uint8_t *)c->cv[j] + koff;
    float *sc = c->scores + (size_t)worker * (size_t)c->p.max_seq;
    const ft_kernels *kn = ft_k_get();   /* resolve the dispatch once per task */
    float scale = cfg->attn_scale != 0 ? cfg->attn_scale : 1.0f / sqrtf((float)hd);
    int capped = cfg->attn_softcap != 0;
    int r0 = c->row0[j], W = c->win[c->layer], R = c->kv_rows[c->layer], ring = is_ring(c, c->layer);
    int pos0 = c->past[j];
    for (size_t i = 0; i < c->ntok[j]; i++) {
        int r = r0 + (int)i, pos = c->row_pos[r];
        int s = attn_start(W, pos);
        const float *q = c->q + (size_t)r * c->qdim + (size_t)h * hd;
        float *o = c->att + (size_t)r * c->qdim + (size_t)h * hd;
        if (!ring && !W && !capped) {
            if (!half) kn->attend(o, q, K, V, c->kvdim, pos + 1, hd, scale, sc);
            else ft_wk_attend_h(o, q, K, V, c->kvdim, pos + 1, hd, scale, sc, c->p.kv_dtype == FT_F16);
            continue;
        }
        /* Windowed: segments of f32 rows. A bf16/f16 cache's rows of this
         * head are widened into the worker's scratch first (ld = hd). */
        const float *Kf = K, *Vf = V;
        int ld = c->kvdim;
        float *kt = NULL, *vt = NULL;
        if (half) {
            kt = c->kvt + (size_t)worker * 2 * (size_t)c->p.max_seq * (size_t)hd;
            vt = kt + (size_t)c->p.max_seq * (size_t)hd;
            Kf = kt;
            Vf = vt;
            ld = hd;
        }
        if (!ring) {   /* full rows (external_kv, or a window >= the context): masked to the window;
                          attend_segs, so that the sums are the ring's bit for bit */
            if (half) {
                widen_rows(kt + (size_t)s * hd, K, s, pos - s + 1, c->kvdim, hd, c->p.kv_dtype);
                widen_rows(vt + (size_t)s * hd, V, s, pos - s + 1, c->kvdim, hd, c->p.kv_dtype);
            }
            ft_attn_seg one = {Kf + (size_t)s * ld, Vf + (size_t)s * ld, pos - s + 1};
            attend_segs_any(c, o, q, &one, 1, ld, hd, scale, sc);
            continue;
        }
        /* ring: positions [s, pos0) from the ring (it may wrap), [max(s, pos0), pos] from this call's rows */
        int cs = s > pos0 ? s : pos0;
        size_t cr = (size_t)(r0 + (cs - pos0)) * c->kvdim + (size_t)kvh * hd;
        if (half) {
            /* one f32 run: the ring's rows widened in position order, then the call's rows */
            int n = s < pos0 ? pos0 - s : 0;
            if (n) {
                int a = ring_row(R, s), n1 = a + n <= R ? n : R - a;
                widen_rows(kt, K, a, n1, c->kvdim, hd, c->p.kv_dtype);
                widen_rows(vt, V, a, n1, c->kvdim, hd, c->p.kv_dtype);
                widen_rows(kt + (size_t)n1 * hd, K, 0, n - n1, c->kvdim, hd, c->p.kv_dtype);
                widen_rows(vt + (size_t)n1 * hd, V, 0, n - n1, c->kvdim, hd, c->p.kv_dtype);
            }
            for (int p = 0; p < pos - cs + 1; p++) {
                memcpy(kt + (size_t)(n + p) * hd, c->k + cr + (size_t)p * c->kvdim, (size_t)hd * sizeof(float));
                memcpy(vt + (size_t)(n + p) * hd, c->v + cr + (size_t)p * c->kvdim, (size_t)hd * sizeof(float));
            }
            ft_attn_seg all = {kt, vt, n + pos - cs + 1};
            attend_segs_any(c, o, q, &all, 1, hd, hd, scale, sc);
            continue;
        }
        ft_attn_seg seg[3];
        int nseg = 0;
        if (s < pos0) {
            int a = ring_row(R, s), n = pos0 - s;
            int n1 = a + n <= R ? n : R - a;
            seg[nseg++] = (ft_attn_seg){Kf + (size_t)a * ld, Vf + (size_t)a * ld, n1};
            if (n1 < n) seg[nseg++] = (ft_attn_seg){Kf, Vf, n - n1};
        }
        seg[nseg++] = (ft_attn_seg){c->k + cr, c->v + cr, pos - cs + 1};
        attend_segs_any(c, o, q, seg, nseg, c->kvdim, hd, scale, sc);
    }
}

/* After a ring layer's attention: its new rows (the last R of them) go
 * into the ring. */
static void ring_write(ft_ctx *c, int l)
{
    int R = c->kv_rows[l];
    size_t row = (size_t)c->kvdim * c->kv_esize;
    for (size_t j = 0; j < c->n; j++) {
        int n = (int)c->ntok[j], r0 = c->row0[j], pos0 = c->past[j];
        for (int i = n > R ? n - R : 0; i < n; i++) {
            size_t dst = (size_t)ring_row(R, pos0 + i) * row, src = (size_t)(r0 + i) * c->kvdim;
            ft_convert((uint8_t *)c->ck[j] + dst, c->p.kv_dtype, c->k + src, FT_F32, (size_t)c->kvdim);
            ft_convert((uint8_t *)c->cv[j] + dst, c->p.kv_dtype, c->v + src, FT_F32, (size_t)c->kvdim);
        }
    }
    c->ring_dirty = 1;
}

/* g = gelu_pytorch_tanh(g) * u: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
static void gelu_tanh_mul(float *g, const float *u, size_t n)
{
    const float k0 = 0.7978845608028654f, k1 = 0.044715f;
    for (size_t i = 0; i < n; i++) {
        float x = g[i];
        g[i] = 0.5f * x * (1.0f + tanhf(k0 * (x + k1 * x * x * x))) * u[i];
    }
}

static void ffn_act_rows(ft_ctx *c, int r0, int r1, const void *arg)
{
    (void)arg;
    int f = c->m->cfg.ffn;
    if (c->m->cfg.act == FT_ACT_GELU_TANH) {
        gelu_tanh_mul(c->h1 + (size_t)r0 * f, c->h2 + (size_t)r0 * f, (size_t)(r1 - r0) * f);
    } else if (c->m->arch->ffn == FT_FFN_SWIGLU) {
        ft_k_silu_mul(c->h1 + (size_t)r0 * f, c->h2 + (size_t)r0 * f, (r1 - r0) * f);
    } else {
        float *h = c->h1 + (size_t)r0 * f;
        for (size_t i = 0, n = (size_t)(r1 - r0) * f; i < n; i++) h[i] = h[i] > 0 ? h[i] : 0;
    }
}

static void add_into(float *x, const float *y, size_t n)
{
    for (size_t i = 0; i < n; i++) x[i] += y[i];
}

/* ------------------------------------------------ the CPU backend ops */

static float *cbuf(ft_ctx *c, ft_gbuf id)
{
    switch (id) {
    case FT_GB_X: return c->x;
    case FT_GB_XB: return c->xb;
    case FT_GB_Q: return c->q;
    case FT_GB_K: return c->k;
    case FT_GB_V: return c->v;
    case FT_GB_ATT: return c->att;
    case FT_GB_H1: return c->h1;
    case FT_GB_H2: return c->h2;
    case FT_GB_SEL: return c->sel;
    case FT_GB_SEL2: return c->sel2;
    case FT_GB_LOGITS: return c->out_logits;
    default: return NULL;
    }
}

static const ft_wmat *cmat(ft_ctx *c, const void *w, int slot)
{
    return w ? ft_layer_mat((ft_layer_weights *)(uintptr_t)w, slot) : &c->m->g[slot];
}

static const float *cvec(ft_ctx *c, const void *w, int slot)
{
    if (slot < 0) return NULL;
    return w ? *ft_layer_vec((ft_layer_weights *)(uintptr_t)w, slot) : (const float *)c->m->g[slot].data;
}

static ft_status cpu_embed(void *b, ft_gbuf out, int rows)
{
    ft_ctx *c = b;
    int E = c->m->cfg.word_embed_proj_dim;
    float *o = cbuf(c, out);
    ft_gstream *g = c->m->gs_emb;
    if (!g) {
        for (int r = 0; r < rows; r++) ft_wmat_row_f32(&c->m->g[GW_TOK_EMB], c->row_tok[r], o + (size_t)r * E);
        return FT_OK;
    }
    /* streamed: the row of each token read from the file, in the compute
     * format, then widened as the resident matrix's row would be */
    ft_wmat row = {.fmt = g->fmt, .rows = 1, .cols = g->cols, .data = c->gs_dst};
    for (int r = 0; r < rows; r++) {
        ft_status st = ft_gstream_read(g, c->row_tok[r], 1, c->gs_dst, c->gs_raw);
        if (st) return st;
        ft_wmat_row_f32(&row, 0, o + (size_t)r * E);
    }
    return FT_OK;
}

/* The streamed LM head: chunk by chunk of vocabulary rows, each read from
 * the file (the next one read ahead while this one is computed: by the
 * kernel through the page cache, by the context's reader thread into the
 * other chunk buffer past it), its logits written in place into the
 * [rows][vocab] output by the same product kernels as the resident
 * matrix (each output is the same dot product: bit-identical logits). */
typedef struct { float *y; int ldy; const ft_wk_act *a; const ft_wmat *W; int chunk; } head_job;

static void head_task(void *arg, size_t i, unsigned worker)
{
    (void)worker;
    const head_job *j = arg;
    int o0 = (int)i * j->chunk, o1 = o0 + j->chunk;
    if (o1 > j->W->rows) o1 = j->W->rows;
    ft_wk_product(j->y, j->ldy, j->a, j->W, o0, o1, NULL);
}

/* Rows [r0, r0 + n) of the head's logits from the chunk in W.data. */
static void head_chunk(ft_ctx *c, float *y, int V, const ft_wk_act *a, ft_wmat *W, int r0, int n)
{
    W->rows = n;
    /* the resident product's split of the outputs, in multiples of 24
     * from the chunk's start (R is a multiple of 96) */
    int tasks = c->threads == 1 ? 1 : (int)c->threads * 4;
    int chunk = (n + tasks - 1) / tasks;
    chunk = (chunk + 23) / 24 * 24;
    head_job j = {y + r0, V, a, W, chunk};
    size_t nt = (size_t)((n + chunk - 1) / chunk);
    ft_pool_run(nt > 1 ? c->pool : NULL, nt, head_task, &j);
}

/* The head's chunks handed to the reader thread: chunk 0 (into the
 * second buffer; the first may hold an embedding row meanwhile) read
 * while the layers compute, the others as buffers are released. */
static void head_read_start(ft_ctx *c, ft_gstream *g)
{
    ft_gs_reader_start(c->gs_rd, g, ft_gstream_chunk_rows(g), c->gs_dst, c->gs_raw, c->gs_dst2, c->gs_raw2);
}

static ft_status head_streamed(ft_ctx *c, float *y, const float *x, int rows)
{
    ft_gstream *g = c->m->gs_head;
    int V = g->rows, R = ft_gstream_chunk_rows(g);
    /* past the page cache: the reader reads chunk i + 1 into one buffer
     * while the pool computes chunk i from the other (chunk 0 was handed
     * over before the layers); a refusal on the way falls back to a
     * buffered read on the reader, the calls after read as below */
    int ahead = c->gs_rd && (ft_gs_reader_active(c->gs_rd) || ft_gstream_direct_now(g));
    ft_wmat W = {.fmt = g->fmt, .rows = R, .cols = g->cols, .data = c->gs_dst};
    ft_wk_act a;
    ft_status st = ft_wk_prep(&a, c->wkws, c->wkws_size, &W, x, rows);
    if (st) {
        ft_gs_reader_stop(c->gs_rd);
        return st;
    }
    if (ahead) {
        void *dst[2] = {c->gs_dst, c->gs_dst2};
        if (!ft_gs_reader_active(c->gs_rd)) head_read_start(c, g);
        ft_gs_reader_release(c->gs_rd, 0);   /* the embeddings are done with it */
        for (int r0 = 0, k = 0; r0 < V; r0 += R, k++) {
            int n = V - r0 < R ? V - r0 : R, b = 0;
            if ((st = ft_gs_reader_get(c->gs_rd, k, &b))) {
                ft_gs_reader_stop(c->gs_rd);
                return st;
            }
            W.data = dst[b];
            head_chunk(c, y, V, &a, &W, r0, n);
            ft_gs_reader_release(c->gs_rd, b);
        }
        ft_gs_reader_stop(c->gs_rd);
        return FT_OK;
    }
    for (int r0 = 0; r0 < V; r0 += R) {
        int n = V - r0 < R ? V - r0 : R;
        if ((st = ft_gstream_read(g, r0, n, c->gs_dst, c->gs_raw))) return st;
        ft_gstream_prefetch(g, r0 + R, R);
        head_chunk(c, y, V, &a, &W, r0, n);
    }
    return FT_OK;
}

static ft_status cpu_add_positions(void *b, int rows)
{
    ft_ctx *c = b;
    int H = c->m->cfg.hidden;
    float *pe = c->sel2;   /* free until the logits */
    for (int r = 0; r < rows; r++) {
        ft_wmat_row_f32(&c->m->g[GW_POS_EMB], c->row_pos[r] + c->m->arch->pos_offset, pe);
        add_into(c->x + (size_t)r * H, pe, (size_t)H);
    }
    return FT_OK;
}

static ft_status cpu_layer_begin(void *b, int l, const void **w)
{
    ft_ctx *c = b;
    /* the model is not modified: a hook fills this layer's copy */
    c->lw = c->m->layers[l];
    if (c->hook) {
        ft_status st = c->hook(c->hook_user, l, &c->lw);
        if (st) return st;
    }
    if (c->p.external_kv) {
        ft_status st = c->kvh.load(c->kvh.user, l, c->step, c->kk, c->vv);
        if (st) return st;
        for (size_t j = 0; j < c->n; j++) {
            c->ck[j] = c->kk[j];
            c->cv[j] = c->vv[j];
        }
    } else {
        for (size_t j = 0; j < c->n; j++) {
            c->ck[j] = kv_ptr(c, l, 0, c->slots[j]);
            c->cv[j] = kv_ptr(c, l, 1, c->slots[j]);
        }
    }
    c->layer = l;
    *w = &c->lw;
    return FT_OK;
}

static ft_status cpu_layer_end(void *b, int l)
{
    ft_ctx *c = b;
    if (c->p.external_kv) return c->kvh.store(c->kvh.user, l, c->step, c->kk, c->vv);
    return FT_OK;
}

static ft_status cpu_norm(void *b, ft_gbuf out, ft_gbuf in, int rows, const void *w, int sw, int sb)
{
    ft_ctx *c = b;
    norm(c, cbuf(c, out), cbuf(c, in), rows, c->m->cfg.hidden, cvec(c, w, sw), cvec(c, w, sb));
    return FT_OK;
}

/* y += scale B (A x) for each adapter of (layer, slot), in the order they
 * were added: PEFT's result = result + lora_B(lora_A(x)) * scaling. The
 * products run on the f32 kernels (A and B viewed as f32 matrices). */
static ft_status apply_lora(ft_ctx *c, float *y, const float *x, int rows, int slot)
{
    for (int i = ft_lora_first(c->lora, c->layer, slot); i >= 0; i = c->lora->e[i].next) {
        const ft_lora_entry *e = &c->lora->e[i];
        ft_wmat A = {FT_WF_F32, e->rank, e->in, e->A, 0, 0, NULL}, B = {FT_WF_F32, e->out, e->rank, e->B, 0, 0, NULL};
        linear(c->lora_t, x, rows, &A, NULL);
        linear(c->lora_u, c->lora_t, rows, &B, NULL);
        const float s = e->scale, *u = c->lora_u;
        for (size_t k = 0; k < (size_t)rows * (size_t)e->out; k++) y[k] += u[k] * s;
    }
    return FT_OK;
}

static ft_status cpu_linear(void *b, ft_gbuf y, ft_gbuf x, int rows, const void *w, int slot, int sb)
{
    ft_ctx *c = b;
    if (!w && slot == GW_LM_HEAD && c->m->gs_head) return head_streamed(c, cbuf(c, y), cbuf(c, x), rows);
    ft_status st = linear_ctx(c, cbuf(c, y), cbuf(c, x), rows, cmat(c, w, slot), cvec(c, w, sb));
    if (!st && c->lora && w) st = apply_lora(c, cbuf(c, y), cbuf(c, x), rows, slot);
    return st;
}

static ft_status cpu_rope(void *b, int rows)
{
    par_rows(b, rows, rope_rows, NULL);
    return FT_OK;
}

static ft_status cpu_attention(void *b, int l, int rows)
{
    ft_ctx *c = b;
    (void)rows;
    int ring = is_ring(c, l);
    for (size_t j = 0; j < c->n && !ring; j++) {  /* append K/V to the caches */
        int r0 = c->row0[j], pos0 = c->row_pos[r0];
        size_t n = c->ntok[j] * (size_t)c->kvdim, at = (size_t)pos0 * c->kvdim * c->kv_esize;
        /* f32 -> f32 is a copy; to bf16/f16 each value is rounded once here */
        ft_convert((uint8_t *)c->ck[j] + at, c->p.kv_dtype, c->k + (size_t)r0 * c->kvdim, FT_F32, n);
        ft_convert((uint8_t *)c->cv[j] + at, c->p.kv_dtype, c->v + (size_t)r0 * c->kvdim, FT_F32, n);
    }
    ft_pool_run(c->threads == 1 ? NULL : c->pool, c->n * (size_t)c->m->cfg.n_heads, attn_task, c);
    if (ring) ring_write(c, l);
    return FT_OK;
}

static ft_status cpu_ffn_act(void *b, int rows)
{
    par_rows(b, rows, ffn_act_rows, NULL);
    return FT_OK;
}

static ft_status cpu_add(void *b, ft_gbuf y, ft_gbuf x, int rows)
{
    ft_ctx *c = b;
    add_into(cbuf(c, y), cbuf(c, x), (size_t)rows * (size_t)c->m->cfg.hidden);
    return FT_OK;
}

static ft_status cpu_gather_last(void *b, ft_gbuf out, ft_gbuf in, int n)
{
    ft_ctx *c = b;
    int H = c->m->cfg.hidden;
    float *o = cbuf(c, out);
    const float *x = cbuf(c, in);
    for (int j = 0; j < n; j++)
        memcpy(o + (size_t)j * H, x + (size_t)(c->row0[j + 1] - 1) * H, (size_t)H * sizeof(float));
    return FT_OK;
}

/* q/k norms: per head over head_dim (qk_norm 1) or over the whole
 * projection (2), RMSNorm with the layer's LW_QNORM / LW_KNORM */
static void qk_norm_rows(ft_ctx *c, int r0, int r1, const void *arg)
{
    const float *const *wv = arg;
    const ft_model_config *cfg = &c->m->cfg;
    int per_head = cfg->qk_norm == 1;
    for (int r = r0; r < r1; r++) {
        float *q = c->q + (size_t)r * c->qdim, *k = c->k + (size_t)r * c->kvdim;
        if (per_head) {
            for (int h = 0; h < cfg->n_heads; h++)
                ft_k_rmsnorm(q + (size_t)h * cfg->head_dim, q + (size_t)h * cfg->head_dim, wv[0], cfg->head_dim,
                             cfg->norm_eps);
            for (int h = 0; h < cfg->n_kv_heads; h++)
                ft_k_rmsnorm(k + (size_t)h * cfg->head_dim, k + (size_t)h * cfg->head_dim, wv[1], cfg->head_dim,
                             cfg->norm_eps);
        } else {
            ft_k_rmsnorm(q, q, wv[0], c->qdim, cfg->norm_eps);
            ft_k_rmsnorm(k, k, wv[1], c->kvdim, cfg->norm_eps);
        }
    }
}

static ft_status cpu_qk_norm(void *b, int rows, const void *w)
{
    ft_ctx *c = b;
    const ft_model_config *cfg = &c->m->cfg;
    ft_layer_weights *lw = (ft_layer_weights *)(uintptr_t)w;
    const float *qw = lw ? lw->q_norm : NULL, *kw = lw ? lw->k_norm : NULL;
    if (!qw || !kw) return ft_set_error(FT_ERR_INVALID_ARG, "forward: layer %d has no q/k norm weights", c->layer);
    int nq = cfg->qk_norm == 1 ? cfg->head_dim : c->qdim, nk = cfg->qk_norm == 1 ? cfg->head_dim : c->kvdim;
    /* (1 + w) copies side by side in normw (sized for the larger of q and hidden) */
    const float *wv[2] = {qw, kw};
    if (cfg->norm_plus_one) {   /* nq + nk <= qdim + kvdim: room in normw */
        for (int i = 0; i < nq; i++) c->normw[i] = 1.0f + qw[i];
        for (int i = 0; i < nk; i++) c->normw[nq + i] = 1.0f + kw[i];
        wv[0] = c->normw;
        wv[1] = c->normw + nq;
    }
    par_rows(c, rows, qk_norm_rows, wv);
    return FT_OK;
}

static ft_status cpu_scale(void *b, ft_gbuf buf, int rows, float f)
{
    ft_ctx *c = b;
    float *x = cbuf(c, buf);
    for (size_t i = 0, n = (size_t)rows * (size_t)c->m->cfg.hidden; i < n; i++) x[i] *= f;
    return FT_OK;
}

static ft_status cpu_softcap(void *b, ft_gbuf buf, int rows, float cap)
{
    ft_ctx *c = b;
    float *x = cbuf(c, buf);
    if (!x) return FT_OK;
    for (size_t i = 0, n = (size_t)rows * (size_t)c->m->cfg.vocab; i < n; i++) x[i] = tanhf(x[i] / cap) * cap;
    return FT_OK;
}

/* The mixture of experts of a sparse layer: router logits, top-k routes,
 * then expert by expert (in increasing index, as transformers adds them)
 * the rows routed to it gathered into one matrix, its SwiGLU FFN computed
 * on the stored-format kernels (each expert matrix read once for all its
 * rows), and the results added into out with the routing weights. */
static ft_status cpu_moe(void *b, ft_gbuf outb, ft_gbuf inb, int rows, const void *w)
{
    ft_ctx *c = b;
    const ft_model_config *cfg = &c->m->cfg;
    ft_layer_weights *lw = (ft_layer_weights *)(uintptr_t)w;
    const int H = cfg->hidden, E = cfg->n_experts, K = cfg->n_experts_used, F = cfg->moe_ffn;
    float *out = cbuf(c, outb);
    const float *in = cbuf(c, inb);
    if (out == in) {   /* the output overwrites the input: keep a copy */
        memcpy(c->moe_in, in, (size_t)rows * (size_t)H * sizeof(float));
        in = c->moe_in;
    }
    if (!lw || lw->n_experts != E || !lw->experts || !ft_wmat_present(&lw->w_router))
        return ft_set_error(FT_ERR_INVALID_ARG, "forward: layer %d has no experts", c->layer);
    ft_status st = linear_ctx(c, c->moe_logits, in, rows, &lw->w_router, NULL);
    if (st) return st;
    ft_moe_route(c->moe_logits, rows, E, K, cfg->moe_norm_topk, c->moe_idx, c->moe_wt);
    ft_moe_group(c->moe_idx, c->moe_wt, rows, E, K, c->moe_start, c->moe_grow, c->moe_gwt);
    if (lw->fetch_experts) {   /* the selected experts, streamed on demand */
        int nu = 0;
        for (int e = 0; e < E; e++)
            if (c->moe_start[e + 1] > c->moe_start[e]) c->moe_idx[nu++] = e;   /* routes are grouped: reuse */
        if ((st = lw->fetch_experts(lw->fetch_user, c->layer, c->moe_idx, nu, in, rows, lw))) return st;
    }
    memset(out, 0, (size_t)rows * (size_t)H * sizeof(float));
    for (int e = 0; e < E; e++) {
        int a = c->moe_start[e], n = c->moe_start[e + 1] - a;
        if (!n) continue;
        const ft_wmat *g = &lw->experts[3 * e + LW_EXP_GATE], *u = &lw->experts[3 * e + LW_EXP_UP],
                      *d = &lw->experts[3 * e + LW_EXP_DOWN];
        if (!ft_wmat_present(g) || !ft_wmat_present(u) || !ft_wmat_present(d))
            return ft_set_error(FT_ERR_INVALID_ARG, "forward: layer %d expert %d is not loaded", c->layer, e);
        for (int i = 0; i < n; i++)
            memcpy(c->moe_x + (size_t)i * H, in + (size_t)c->moe_grow[a + i] * H, (size_t)H * sizeof(float));
        if ((st = linear_ctx(c, c->h1, c->moe_x, n, g, NULL)) || (st = linear_ctx(c, c->h2, c->moe_x, n, u, NULL)))
            return st;
        if (c->lora && ((st = apply_lora(c, c->h1, c->moe_x, n, LW_EXPERT(e, LW_EXP_GATE))) ||
                        (st = apply_lora(c, c->h2, c->moe_x, n, LW_EXPERT(e, LW_EXP_UP)))))
            return st;   /* the experts' adapters (ft_lora_add_experts) */
        ft_k_silu_mul(c->h1, c->h2, n * F);
        if ((st = linear_ctx(c, c->moe_y, c->h1, n, d, NULL))) return st;
        if (c->lora && (st = apply_lora(c, c->moe_y, c->h1, n, LW_EXPERT(e, LW_EXP_DOWN)))) return st;
        for (int i = 0; i < n; i++) {
            float wt = c->moe_gwt[a + i];
            float *o = out + (size_t)c->moe_grow[a + i] * H;
            const float *y = c->moe_y + (size_t)i * H;
            for (int h = 0; h < H; h++) o[h] += y[h] * wt;
        }
    }
    if (cfg->shared_expert) {   /* qwen2_moe: + sigmoid(gate . x) * SwiGLU_shared(x), as transformers adds it */
        const ft_wmat *sg = &lw->w_gate, *su = &lw->w_up, *sd = &lw->w_down, *gg = &lw->w_shared_gate;
        if (!ft_wmat_present(sg) || !ft_wmat_present(su) || !ft_wmat_present(sd) || !ft_wmat_present(gg))
            return ft_set_error(FT_ERR_INVALID_ARG, "forward: layer %d has no shared expert", c->layer);
        if ((st = linear_ctx(c, c->h1, in, rows, sg, NULL)) || (st = linear_ctx(c, c->h2, in, rows, su, NULL)))
            return st;
        ft_k_silu_mul(c->h1, c->h2, rows * cfg->ffn);
        if ((st = linear_ctx(c, c->moe_y, c->h1, rows, sd, NULL)) ||
            (st = linear_ctx(c, c->moe_logits, in, rows, gg, NULL)))
            return st;
        for (int r = 0; r < rows; r++) {
            float g = 1.0f / (1.0f + expf(-c->moe_logits[r]));
            float *o = out + (size_t)r * H;
            const float *y = c->moe_y + (size_t)r * H;
            for (int h = 0; h < H; h++) o[h] += g * y[h];
        }
    }
    return FT_OK;
}

static const ft_backend_ops cpu_ops = {
    cpu_embed, cpu_add_positions, cpu_layer_begin, cpu_layer_end, cpu_norm, cpu_linear,
    cpu_rope, cpu_attention, cpu_ffn_act, cpu_add, cpu_gather_last,
    cpu_qk_norm, cpu_scale, cpu_softcap, cpu_moe,
};

/* An error after a ring layer advanced: its overwritten rows are gone, so
 * the sequences of the call are reset rather than left inconsistent. */
static ft_status fail_reset(ft_ctx *c, ft_status st)
{
    if (c->ring_dirty)
        for (size_t j = 0; j < c->n; j++) c->seq_len[c->slots[j]] = 0;
    return st;
}

ft_status ft_ctx_forward(ft_ctx *c, size_t n, const int *slots, const int32_t *const *tokens,
                         const size_t *ntok, float *logits, int all_rows)
{
    if (!c) return ft_set_error(FT_ERR_INVALID_ARG, "forward: NULL context");
    return ft_ctx_forward_layers(c, n, slots, tokens, ntok, NULL, 0, c->m->cfg.n_layers, NULL, logits, all_rows);
}

/* A pipeline stage's share (the whole model for ft_ctx_forward): the input
 * is tokens (l0 == 0) or the previous stage's hidden rows, put where the
 * embeddings would be; the output the hidden rows or the logits. */
ft_status ft_ctx_forward_layers(ft_ctx *c, size_t n, const int *slots, const int32_t *const *tokens,
                                const size_t *ntok, const float *hidden_in, int l0, int l1,
                                float *hidden_out, float *logits, int all_rows)
{
    if (!c) return ft_set_error(FT_ERR_INVALID_ARG, "forward: NULL context");
    const ft_model *m = c->m;
    const int L = m->cfg.n_layers, H = m->cfg.hidden;
    if (l0 < 0 || l1 > L || l0 > l1)
        return ft_set_error(FT_ERR_INVALID_ARG, "forward: layers [%d, %d) of %d", l0, l1, L);
    if (l0 > 0 && !hidden_in)
        return ft_set_error(FT_ERR_INVALID_ARG, "forward: layers from %d need the previous stage's hidden states", l0);
    if (l1 < L && !hidden_out)
        return ft_set_error(FT_ERR_INVALID_ARG, "forward: layers up to %d need a buffer for the hidden states", l1);
    if (c->p.external_kv && (!c->kvh.load || !c->kvh.store))
        return ft_set_error(FT_ERR_INVALID_ARG, "forward: the context's KV cache is external but no KV hooks are set");
    ft_call_limits lim = {m->cfg.vocab, c->p.max_batch, c->p.max_seq, c->p.max_rows, c->p.all_logits, c->seq_len};
    size_t rows = 0;
    ft_status cst = ft_graph_check_call_ex(&lim, n, slots, tokens, ntok, all_rows, l0 == 0, &rows);
    if (cst) return cst;
    c->n = n;
    c->slots = slots;
    c->ntok = ntok;
    c->rows = (int)rows;
    int r = 0;
    for (size_t j = 0; j < n; j++) {
        c->row0[j] = r;
        for (size_t i = 0; i < ntok[j]; i++, r++) {
            c->row_seq[r] = (int)j;
            c->row_pos[r] = c->seq_len[slots[j]] + (int)i;
            c->row_tok[r] = l0 == 0 ? tokens[j][i] : 0;
        }
    }
    c->row0[n] = r;
    for (size_t j = 0; j < n; j++) c->past[j] = c->seq_len[slots[j]];
    if (l0 > 0) memcpy(c->x, hidden_in, rows * (size_t)H * sizeof(float));
    ft_kv_step step = {n, slots, c->past, ntok};
    c->step = &step;
    c->out_logits = l1 == L && !hidden_out ? logits : NULL;
    c->ring_dirty = 0;
    int nsel = 0, failed = -1;
    int want = l1 == L && logits && !hidden_out ? (all_rows ? 2 : 1) : 0;
    /* a streamed LM head: its first chunk read while the layers compute,
     * by the reader past the page cache, else by the kernel (head_streamed
     * reads ahead the others) */
    if (want && m->gs_head) {
        if (c->gs_rd && ft_gstream_direct_now(m->gs_head) && !ft_gs_reader_active(c->gs_rd))
            head_read_start(c, m->gs_head);
        else
            ft_gstream_prefetch(m->gs_head, 0, ft_gstream_chunk_rows(m->gs_head));
    }
    ft_status st = ft_graph_forward_layers(&cpu_ops, c, m, (int)rows, (int)n, l0, l1, want, &nsel, &failed);
    /* the head not reached (an error before it): its read dropped */
    ft_gs_reader_stop(c->gs_rd);
    c->step = NULL;
    if (st) return fail_reset(c, st);
    for (size_t j = 0; j < n; j++) c->seq_len[slots[j]] += (int)ntok[j];
    if (hidden_out) memcpy(hidden_out, c->x, rows * (size_t)H * sizeof(float));
    return FT_OK;
}
