/* Model weights in memory, in the format they are computed in: one block
 * for the model-wide tensors and one contiguous block per layer (so a
 * layer can be swapped as a unit by the offloading scheduler), plus the
 * name table used by the loader and the writer.
 *
 * Plain formats (f32, bf16, f16) are row-major arrays. q8/q4 matrices are
 * kept as whole codec frames whose chunks hold whole rows, so the kernels
 * read a frame's payload in place: the same layout a frame streamed from
 * a disk or a memory node has (docs/engine.md, "Weights as stored"). */
#include "engine_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

const ft_arch *ft_arch_get(ft_arch_id id)
{
    switch (id) {
    case FT_ARCH_OPT: return &ft_arch_opt;
    case FT_ARCH_LLAMA: return &ft_arch_llama;
    case FT_ARCH_QWEN2: return &ft_arch_qwen2;
    case FT_ARCH_QWEN3: return &ft_arch_qwen3;
    case FT_ARCH_PHI3: return &ft_arch_phi3;
    case FT_ARCH_GEMMA2: return &ft_arch_gemma2;
    case FT_ARCH_MIXTRAL: return &ft_arch_mixtral;
    case FT_ARCH_OLMOE: return &ft_arch_olmoe;
    }
    return NULL;
}

static const size_t lw_off[LW_COUNT] = {
    offsetof(ft_layer_weights, norm1_w), offsetof(ft_layer_weights, norm1_b),
    offsetof(ft_layer_weights, wq), offsetof(ft_layer_weights, bq),
    offsetof(ft_layer_weights, wk), offsetof(ft_layer_weights, bk),
    offsetof(ft_layer_weights, wv), offsetof(ft_layer_weights, bv),
    offsetof(ft_layer_weights, wo), offsetof(ft_layer_weights, bo),
    offsetof(ft_layer_weights, norm2_w), offsetof(ft_layer_weights, norm2_b),
    offsetof(ft_layer_weights, w_gate), offsetof(ft_layer_weights, b_gate),
    offsetof(ft_layer_weights, w_up), offsetof(ft_layer_weights, b_up),
    offsetof(ft_layer_weights, w_down), offsetof(ft_layer_weights, b_down),
    offsetof(ft_layer_weights, q_norm), offsetof(ft_layer_weights, k_norm),
    offsetof(ft_layer_weights, post_attn_norm), offsetof(ft_layer_weights, post_ffn_norm),
    offsetof(ft_layer_weights, w_router), offsetof(ft_layer_weights, w_shared_gate),
};

int ft_slot_is_matrix(int slot)
{
    switch (slot) {
    case LW_Q: case LW_K: case LW_V: case LW_O: case LW_GATE: case LW_UP: case LW_DOWN: case LW_ROUTER:
    case LW_SHARED_GATE: return 1;
    default: return slot >= LW_COUNT;
    }
}

ft_wmat *ft_layer_mat(ft_layer_weights *w, int slot)
{
    if (slot >= LW_COUNT)
        return w->experts && slot - LW_COUNT < 3 * w->n_experts ? &w->experts[slot - LW_COUNT] : NULL;
    return ft_slot_is_matrix(slot) ? (ft_wmat *)(void *)((char *)w + lw_off[slot]) : NULL;
}

const float **ft_layer_vec(ft_layer_weights *w, int slot)
{
    return ft_slot_is_matrix(slot) ? NULL : (const float **)(void *)((char *)w + lw_off[slot]);
}

int ft_layer_nslots(const ft_model_config *c, int layer)
{
    return LW_COUNT + (c->n_experts && c->layer_moe[layer] ? 3 * c->n_experts : 0);
}

int ft_global_shape(const ft_model_config *c, const ft_arch *a, int slot, int64_t s[2])
{
    switch (slot) {
    case GW_TOK_EMB: case GW_LM_HEAD: s[0] = c->vocab; s[1] = c->word_embed_proj_dim; return 2;
    case GW_POS_EMB: s[0] = (int64_t)c->max_pos + a->pos_offset; s[1] = c->hidden; return 2;
    case GW_PROJ_IN: s[0] = c->hidden; s[1] = c->word_embed_proj_dim; return 2;
    case GW_PROJ_OUT: s[0] = c->word_embed_proj_dim; s[1] = c->hidden; return 2;
    default: s[0] = c->hidden; return 1;
    }
}

int ft_layer_shape(const ft_model_config *c, int slot, int64_t s[2])
{
    int64_t q = (int64_t)c->n_heads * c->head_dim, kv = (int64_t)c->n_kv_heads * c->head_dim;
    switch (slot) {
    case LW_Q: s[0] = q; s[1] = c->hidden; return 2;
    case LW_QB: s[0] = q; return 1;
    case LW_K: case LW_V: s[0] = kv; s[1] = c->hidden; return 2;
    case LW_KB: case LW_VB: s[0] = kv; return 1;
    case LW_O: s[0] = c->hidden; s[1] = q; return 2;
    case LW_GATE: case LW_UP: s[0] = c->ffn; s[1] = c->hidden; return 2;
    case LW_GATE_B: case LW_UP_B: s[0] = c->ffn; return 1;
    case LW_DOWN: s[0] = c->hidden; s[1] = c->ffn; return 2;
    case LW_QNORM: s[0] = c->qk_norm == 2 ? q : c->head_dim; return 1;
    case LW_KNORM: s[0] = c->qk_norm == 2 ? kv : c->head_dim; return 1;
    case LW_ROUTER: s[0] = c->n_experts; s[1] = c->hidden; return 2;
    case LW_SHARED_GATE: s[0] = 1; s[1] = c->hidden; return 2;
    default:
        if (slot >= LW_COUNT) {
            int k = (slot - LW_COUNT) % 3;
            s[0] = k == LW_EXP_DOWN ? c->hidden : c->moe_ffn;
            s[1] = k == LW_EXP_DOWN ? c->moe_ffn : c->hidden;
            return 2;
        }
        s[0] = c->hidden; return 1;   /* norms, o bias, down bias */
    }
}

/* ------------------------------------------------------ stored formats */

static int is_q(ft_wfmt f) { return f == FT_WF_Q8 || f == FT_WF_Q4; }
static int qbits(ft_wfmt f) { return f == FT_WF_Q8 ? 8 : 4; }

static ft_dtype plain_dtype(ft_wfmt f)
{
    return f == FT_WF_BF16 ? FT_BF16 : f == FT_WF_F16 ? FT_F16 : FT_F32;
}

int ft_wmat_group_for(int cols)
{
    if (cols > 0 && cols % 64 == 0) return 64;
    if (cols > 0 && cols % 32 == 0) return 32;
    return 0;
}

uint64_t ft_wmat_bytes(ft_wfmt f, int rows, int cols, int group)
{
    uint64_t n = (uint64_t)rows * (uint64_t)cols;
    switch (f) {
    case FT_WF_F32: return 4 * n;
    case FT_WF_BF16: case FT_WF_F16: return 2 * n;
    case FT_WF_Q8: case FT_WF_Q4:
        if (group <= 0) return 0;
        return 4 * (uint64_t)rows * (uint64_t)(cols / group) + (f == FT_WF_Q8 ? n : (n + 1) / 2);
    }
    return 0;
}

/* About 128K elements per chunk (256 KiB of bf16), whole rows, and at
 * least the codec's minimum chunk in every source dtype. */
static int rows_per_chunk(int rows, int cols)
{
    int64_t rpc = (128 * 1024) / (cols > 0 ? cols : 1);
    int64_t min_rpc = (FT_MIN_CHUNK_SIZE + (int64_t)cols * 2 - 1) / ((int64_t)cols * 2);
    if (rpc < min_rpc) rpc = min_rpc;
    if (rpc < 1) rpc = 1;
    if (rpc > rows) rpc = rows;
    return (int)rpc;
}

ft_status ft_wmat_codec_params(int bits, ft_dtype dtype, int rows, int cols, ft_codec_params *out)
{
    int g = ft_wmat_group_for(cols);
    if ((bits != 8 && bits != 4) || rows < 1 || !g || !ft_dtype_is_float(dtype))
        return ft_set_error(FT_ERR_UNSUPPORTED, "q%d matrix of %d x %d (%s): no group size divides %d "
                            "columns", bits, rows, cols, ft_dtype_name(dtype), cols);
    ft_codec_params cp;
    ft_codec_default_params(&cp);
    cp.codec = bits == 8 ? FT_CODEC_Q8 : FT_CODEC_Q4;
    cp.group_size = (uint32_t)g;
    cp.group_dim = -1;
    uint64_t cs = (uint64_t)rows_per_chunk(rows, cols) * (uint64_t)cols * ft_dtype_nbytes(dtype, 1);
    if (cs < FT_MIN_CHUNK_SIZE) cs = FT_MIN_CHUNK_SIZE;   /* a single chunk holds every row */
    if (cs > FT_MAX_CHUNK_SIZE)
        return ft_set_error(FT_ERR_UNSUPPORTED, "q%d matrix with rows of %d x %s: a row exceeds the "
                            "largest frame chunk", bits, cols, ft_dtype_name(dtype));
    cp.chunk_size = (uint32_t)cs;
    *out = cp;
    return FT_OK;
}

ft_status ft_wmat_from_frame(const void *frame, size_t size, ft_wmat *w, const uint8_t **ptrs,
                             uint32_t max_chunks)
{
    ft_frame_info fi;
    ft_status st = ft_frame_parse(frame, size, &fi);
    if (st) return st;
    if (fi.frame_size != size)
        return ft_set_error(FT_ERR_CORRUPT, "weight frame: %zu bytes, header says %llu", size,
                            (unsigned long long)fi.frame_size);
    if ((fi.codec != FT_CODEC_Q8 && fi.codec != FT_CODEC_Q4) || fi.ndim != 2 || fi.group_dim != 1 ||
        !ft_dtype_is_float(fi.dtype))
        return ft_set_error(FT_ERR_UNSUPPORTED, "weight frame: %s, %u dims, group_dim %d: only q8/q4 "
                            "matrices grouped along rows are computed on in place",
                            ft_codec_name(fi.codec), fi.ndim, (int)fi.group_dim);
    int64_t rows = fi.shape[0], cols = fi.shape[1], G = fi.group_size;
    if (rows < 1 || cols < 1 || rows > INT32_MAX || cols > INT32_MAX || cols % G ||
        (fi.codec == FT_CODEC_Q4 && cols % 2))
        return ft_set_error(FT_ERR_UNSUPPORTED, "weight frame: %lld x %lld in groups of %lld: rows are "
                            "not whole groups", (long long)rows, (long long)cols, (long long)G);
    uint64_t slab = (uint64_t)G * ft_dtype_nbytes(fi.dtype, 1);
    uint64_t spc = slab >= fi.chunk_size ? 1 : fi.chunk_size / slab;
    uint64_t gpr = (uint64_t)(cols / G);
    if (spc % gpr)
        return ft_set_error(FT_ERR_UNSUPPORTED, "weight frame: chunks of %llu groups split rows of %llu groups",
                            (unsigned long long)spc, (unsigned long long)gpr);
    uint64_t rpc = spc / gpr;
    uint64_t nch = ((uint64_t)rows + rpc - 1) / rpc;
    if (nch != fi.n_chunks || nch > max_chunks)
        return ft_set_error(nch != fi.n_chunks ? FT_ERR_CORRUPT : FT_ERR_BUFFER_SMALL,
                            "weight frame: %u chunks (expected %llu, room for %u)", fi.n_chunks,
                            (unsigned long long)nch, max_chunks);
    for (uint32_t i = 0; i < fi.n_chunks; i++) {
        ft_chunk_info ci;
        if ((st = ft_frame_chunk(frame, size, &fi, i, &ci))) return st;
        uint64_t r0 = (uint64_t)i * rpc, nr = (uint64_t)rows - r0 < rpc ? (uint64_t)rows - r0 : rpc;
        if (ci.flags || ci.elem_offset != r0 * (uint64_t)cols || ci.elem_count != nr * (uint64_t)cols)
            return ft_set_error(FT_ERR_CORRUPT, "weight frame: chunk %u does not hold rows %llu..%llu", i,
                                (unsigned long long)r0, (unsigned long long)(r0 + nr));
        ptrs[i] = (const uint8_t *)frame + ci.enc_offset;
    }
    memset(w, 0, sizeof *w);
    w->fmt = fi.codec == FT_CODEC_Q8 ? FT_WF_Q8 : FT_WF_Q4;
    w->rows = (int)rows;
    w->cols = (int)cols;
    w->group = (int)G;
    w->rows_per_chunk = (int)rpc;
    w->chunk = ptrs;
    return FT_OK;
}

void ft_wmat_row_f32(const ft_wmat *w, int r, float *dst)
{
    size_t cols = (size_t)w->cols;
    switch (w->fmt) {
    case FT_WF_F32: memcpy(dst, (const float *)w->data + (size_t)r * cols, cols * sizeof(float)); return;
    case FT_WF_BF16: ft_bf16_to_f32(dst, (const uint16_t *)w->data + (size_t)r * cols, cols); return;
    case FT_WF_F16: ft_f16_to_f32(dst, (const uint16_t *)w->data + (size_t)r * cols, cols); return;
    case FT_WF_Q8: case FT_WF_Q4: {
        int c = r / w->rows_per_chunk, lr = r % w->rows_per_chunk;
        int n_c = w->rows - c * w->rows_per_chunk;
        if (n_c > w->rows_per_chunk) n_c = w->rows_per_chunk;
        size_t gpr = cols / (size_t)w->group;
        const uint8_t *base = w->chunk[c];
        const uint8_t *prm = base + 4 * (size_t)lr * gpr;
        const uint8_t *val = base + 4 * (size_t)n_c * gpr +
                             (size_t)lr * (w->fmt == FT_WF_Q8 ? cols : cols / 2);
        for (size_t g = 0; g < gpr; g++) {
            uint16_t h[2];
            memcpy(h, prm + 4 * g, 4);
            float mn = ft_f16_to_f32_1(h[0]), step = ft_f16_to_f32_1(h[1]);
            for (size_t i = g * (size_t)w->group; i < (g + 1) * (size_t)w->group; i++) {
                unsigned q = w->fmt == FT_WF_Q8 ? val[i] : (val[i / 2] >> (4 * (i & 1))) & 15u;
                dst[i] = (float)q * step + mn;
            }
        }
        return;
    }
    }
}

ft_wfmt ft_tensor_format(const ft_model_config *c, int is_global, int slot, int ndim,
                         const int64_t *shape, ft_wfmt want, int *group)
{
    (void)c;
    *group = 0;
    if (ndim < 2) return FT_WF_F32;
    int lookup_or_head = is_global && (slot == GW_TOK_EMB || slot == GW_POS_EMB || slot == GW_LM_HEAD);
    if (!is_q(want)) return want;
    if (lookup_or_head) return FT_WF_BF16;
    int g = ft_wmat_group_for((int)shape[1]);
    if (!g) return FT_WF_BF16;
    *group = g;
    return want;
}

/* ----------------------------------------------------------- the model */

static size_t numel(int ndim, const int64_t *s) { return ndim == 1 ? (size_t)s[0] : (size_t)(s[0] * s[1]); }
static size_t pad64(uint64_t n) { return (size_t)((n + 63) & ~(uint64_t)63); }

/* Bytes reserved for an entry: exact for plain formats, the frame bound
 * for q8/q4 (frames of every float source dtype have the same size). */
static ft_status entry_layout(ft_model_tensor_entry *e)
{
    size_t n = numel(e->ndim, e->shape);
    if (!is_q(e->fmt)) {
        e->bytes = ft_dtype_nbytes(plain_dtype(e->fmt), n);
        return FT_OK;
    }
    ft_codec_params cp;
    ft_status st = ft_wmat_codec_params(qbits(e->fmt), FT_F32, (int)e->shape[0], (int)e->shape[1], &cp);
    if (st) return st;
    e->bytes = ft_encode_bound(&cp, FT_F32, 2, e->shape);
    int rpc = rows_per_chunk((int)e->shape[0], (int)e->shape[1]);
    e->rows_per_chunk = rpc;
    e->n_chunks = (uint32_t)((e->shape[0] + rpc - 1) / rpc);
    return e->bytes ? FT_OK : ft_set_error(FT_ERR_INTERNAL, "model: no frame bound for %s", e->name);
}

int ft_model_entry_streamed(const ft_model *m, const ft_model_tensor_entry *e)
{
    char nm[128];
    if (e->layer >= 0 || !m->stream) return 0;
    int tied = !m->arch->global_name(&m->cfg, GW_LM_HEAD, nm, sizeof nm);
    if (e->slot == GW_TOK_EMB) return (m->stream & FT_STREAM_EMBED) || (tied && (m->stream & FT_STREAM_LM_HEAD));
    return e->slot == GW_LM_HEAD && (m->stream & FT_STREAM_LM_HEAD);
}

static ft_status model_create(const ft_model_config *cfg, int external_layers, ft_wfmt want, unsigned stream,
                              ft_model **out)
{
    if (!cfg || !out) return ft_set_error(FT_ERR_INVALID_ARG, "model: NULL argument");
    const ft_arch *a = ft_arch_get(cfg->arch);
    if (!a) return ft_set_error(FT_ERR_UNSUPPORTED, "model: unknown architecture %d", (int)cfg->arch);
    if (cfg->n_layers < 1 || cfg->hidden < 1 || cfg->vocab < 1 || cfg->head_dim < 1)
        return ft_set_error(FT_ERR_INVALID_ARG, "model: config not filled in");
    if ((int)want < FT_WF_F32 || want > FT_WF_Q4)
        return ft_set_error(FT_ERR_INVALID_ARG, "model: weight format %d", (int)want);
    ft_model *m = calloc(1, sizeof *m);
    if (!m) return ft_set_error(FT_ERR_NOMEM, "model: allocation");
    m->cfg = *cfg;
    m->arch = a;
    m->wfmt = want;
    m->stream = stream & (FT_STREAM_EMBED | FT_STREAM_LM_HEAD);
    char name[128];
    size_t n_glob_t = 0, n_layer_t = 0;
    for (int s = 0; s < GW_COUNT; s++) n_glob_t += (size_t)a->global_name(cfg, s, name, sizeof name);
    for (int l = 0; l < cfg->n_layers; l++)
        for (int s = 0; s < ft_layer_nslots(cfg, l); s++)
            n_layer_t += (size_t)a->layer_name(cfg, l, s, name, sizeof name);
    m->n_tensors = n_glob_t + n_layer_t;
    m->tensors = calloc(m->n_tensors, sizeof *m->tensors);
    m->layers = calloc((size_t)cfg->n_layers, sizeof *m->layers);
    ft_status st = FT_OK;
    if (!m->tensors || !m->layers) { st = ft_set_error(FT_ERR_NOMEM, "model: allocation"); goto fail; }
    if (cfg->n_experts) {
        m->expert_tab = calloc((size_t)cfg->n_layers * 3 * (size_t)cfg->n_experts, sizeof *m->expert_tab);
        if (!m->expert_tab) { st = ft_set_error(FT_ERR_NOMEM, "model: allocation"); goto fail; }
        for (int l = 0; l < cfg->n_layers; l++)
            if (cfg->layer_moe[l]) {
                m->layers[l].n_experts = cfg->n_experts;
                m->layers[l].experts = m->expert_tab + (size_t)l * 3 * (size_t)cfg->n_experts;
            }
    }

    /* Entries and their offsets: globals, then layer 0's (all layers share
     * one layout). */
    size_t ti = 0, nchunks = 0;
    for (int s = 0; s < GW_COUNT; s++) {
        if (!a->global_name(cfg, s, name, sizeof name)) continue;
        ft_model_tensor_entry *e = &m->tensors[ti++];
        snprintf(e->name, sizeof e->name, "%s", name);
        e->layer = -1;
        e->slot = s;
        e->ndim = ft_global_shape(cfg, a, s, e->shape);
        e->fmt = ft_tensor_format(cfg, 1, s, e->ndim, e->shape, want, &e->group);
        if ((st = entry_layout(e))) goto fail;
        /* streamed: no storage here (the checkpoint's file is its tier) */
        if ((e->streamed = ft_model_entry_streamed(m, e))) continue;
        e->offset = m->global_bytes;
        m->global_bytes += pad64(e->bytes);
        nchunks += e->n_chunks;
    }
    for (int l = 0; l < cfg->n_layers; l++) {
        size_t off = 0;
        for (int s = 0; s < ft_layer_nslots(cfg, l); s++) {
            if (!a->layer_name(cfg, l, s, name, sizeof name)) continue;
            ft_model_tensor_entry *e = &m->tensors[ti++];
            snprintf(e->name, sizeof e->name, "%s", name);
            e->sliced = a->layer_src ? a->layer_src(cfg, l, s, &e->src) : 0;
            e->layer = l;
            e->slot = s;
            e->ndim = ft_layer_shape(cfg, s, e->shape);
            e->fmt = ft_tensor_format(cfg, 0, s, e->ndim, e->shape, want, &e->group);
            if ((st = entry_layout(e))) goto fail;
            e->offset = off;
            off += pad64(e->bytes);
            nchunks += e->n_chunks;
        }
        /* dense and sparse layers of one MoE model differ: every layer
         * gets the largest layout's room */
        if (off > m->layer_bytes) m->layer_bytes = off;
    }
    /* FT_LOAD_LAYOUT_ONLY: sizes and layout, no storage at all */
    int layout_only = external_layers == FT_LOAD_LAYOUT_ONLY;
    if (!layout_only) m->gbuf = ft_malloc_aligned(m->global_bytes ? m->global_bytes : 64, 64);
    if (!external_layers) m->lbuf = ft_malloc_aligned(m->layer_bytes * (size_t)cfg->n_layers, 64);
    m->chunk_tab = calloc(nchunks ? nchunks : 1, sizeof *m->chunk_tab);
    if ((!m->gbuf && !layout_only) || (!m->lbuf && !external_layers) || !m->chunk_tab) {
        st = ft_set_error(FT_ERR_NOMEM, "model: %.1f MiB of weights",
                          (double)(m->global_bytes + m->layer_bytes * (size_t)cfg->n_layers) / 1048576.0);
        goto fail;
    }
    if (m->gbuf) memset(m->gbuf, 0, m->global_bytes);
    if (m->lbuf) memset(m->lbuf, 0, m->layer_bytes * (size_t)cfg->n_layers);
    m->weight_bytes = 0;
    size_t ci = 0;
    for (size_t i = 0; i < m->n_tensors; i++) {
        ft_model_tensor_entry *e = &m->tensors[i];
        uint8_t *base = e->streamed ? NULL : e->layer < 0 ? m->gbuf
                      : m->lbuf ? m->lbuf + (size_t)e->layer * m->layer_bytes : NULL;
        e->data = base ? base + e->offset : NULL;
        e->chunks = e->n_chunks && !e->streamed ? m->chunk_tab + ci : NULL;
        if (!e->streamed) ci += e->n_chunks;
        m->weight_bytes += is_q(e->fmt) ? ft_wmat_bytes(e->fmt, (int)e->shape[0], (int)e->shape[1], e->group)
                                       : e->bytes;
        /* plain entries are usable at once (zero); q8/q4 ones once stored */
        if (e->data && !is_q(e->fmt) && (st = ft_model_bind(m, e))) goto fail;
    }
    *out = m;
    return FT_OK;
fail:
    ft_model_free(m);
    return st;
}

ft_status ft_model_create(const ft_model_config *cfg, ft_model **out)
{
    return model_create(cfg, 0, FT_WF_F32, 0, out);
}

ft_status ft_model_create_ex(const ft_model_config *cfg, int external_layers, ft_model **out)
{
    return model_create(cfg, external_layers, FT_WF_F32, 0, out);
}

ft_status ft_model_create_fmt(const ft_model_config *cfg, int external_layers, ft_wfmt want, ft_model **out)
{
    return model_create(cfg, external_layers, want, 0, out);
}

ft_status ft_model_create_stream(const ft_model_config *cfg, int external_layers, ft_wfmt want, unsigned stream,
                                 ft_model **out)
{
    return model_create(cfg, external_layers, want, stream, out);
}

ft_status ft_model_bind(ft_model *m, ft_model_tensor_entry *e)
{
    ft_wmat w;
    memset(&w, 0, sizeof w);
    if (e->ndim == 2) {
        if (is_q(e->fmt)) {
            ft_status st = ft_wmat_from_frame(e->data, (size_t)e->frame_size, &w, e->chunks, e->n_chunks);
            if (st) return ft_set_error(st, "model: %s: %s", e->name, ft_last_error());
        } else {
            w.fmt = e->fmt;
            w.rows = (int)e->shape[0];
            w.cols = (int)e->shape[1];
            w.data = e->data;
        }
    } else {
        w.fmt = FT_WF_F32;
        w.rows = 1;
        w.cols = (int)e->shape[0];
        w.data = e->data;
    }
    if (e->layer < 0) {
        char nm[128];
        m->g[e->slot] = w;
        /* a tied head shares the embedding (it has no entry of its own) */
        if (e->slot == GW_TOK_EMB && !m->arch->global_name(&m->cfg, GW_LM_HEAD, nm, sizeof nm))
            m->g[GW_LM_HEAD] = w;
        return FT_OK;
    }
    ft_layer_weights *lw = &m->layers[e->layer];
    if (ft_slot_is_matrix(e->slot)) *ft_layer_mat(lw, e->slot) = w;
    else *ft_layer_vec(lw, e->slot) = (const float *)e->data;
    return FT_OK;
}

ft_status ft_model_store(ft_model *m, ft_model_tensor_entry *e, const ft_tensor *src, ft_codec_ctx *cc)
{
    size_t n = numel(e->ndim, e->shape);
    if (!e->data) return ft_set_error(FT_ERR_INVALID_ARG, "model: %s has no storage (external layer)", e->name);
    if (!is_q(e->fmt)) {
        ft_status st = ft_convert(e->data, plain_dtype(e->fmt), src->data, src->dtype, n);
        return st ? st : ft_model_bind(m, e);
    }
    ft_codec_params cp;
    ft_status st = ft_wmat_codec_params(qbits(e->fmt), src->dtype, (int)e->shape[0], (int)e->shape[1], &cp);
    if (st) return st;
    ft_tensor t = *src;
    t.ndim = 2;
    t.shape[0] = e->shape[0];
    t.shape[1] = e->shape[1];
    size_t fsz = 0;
    if ((st = ft_encode(cc, &cp, &t, e->data, (size_t)e->bytes, &fsz)))
        return ft_set_error(st, "model: quantizing %s to %s: %s", e->name, ft_wfmt_name(e->fmt), ft_last_error());
    e->frame_size = fsz;
    return ft_model_bind(m, e);
}

ft_status ft_model_convert(const ft_model *src, int weights, ft_model **out)
{
    if (!src || !out) return ft_set_error(FT_ERR_INVALID_ARG, "model convert: NULL argument");
    if (!src->lbuf) return ft_set_error(FT_ERR_INVALID_ARG, "model convert: the source's layers are external");
    ft_wfmt want = weights == FT_WEIGHTS_AS_STORED ? src->wfmt : (ft_wfmt)weights;
    ft_model *m = NULL;
    ft_codec_ctx *cc = NULL;
    float *tmp = NULL;
    if (src->stream)
        return ft_set_error(FT_ERR_UNSUPPORTED, "model convert: the source's embeddings or LM head are streamed");
    ft_status st = model_create(&src->cfg, 0, want, 0, &m);
    if (st) return st;
    if ((st = ft_codec_ctx_create(1, &cc))) goto fail;
    for (size_t i = 0; i < m->n_tensors; i++) {
        const ft_model_tensor_entry *se = &src->tensors[i];
        ft_model_tensor_entry *e = &m->tensors[i];
        size_t rows = e->ndim == 2 ? (size_t)e->shape[0] : 1, cols = e->ndim == 2 ? (size_t)e->shape[1] : (size_t)e->shape[0];
        ft_free_aligned(tmp);
        if (!(tmp = ft_malloc_aligned(rows * cols * sizeof(float), 64))) { st = FT_ERR_NOMEM; goto fail; }
        const ft_wmat *sw;
        ft_wmat vec = {.fmt = FT_WF_F32, .rows = 1, .cols = (int)cols, .data = se->data};
        if (se->ndim == 2) sw = se->layer < 0 ? &src->g[se->slot]
                                             : ft_layer_mat(&src->layers[se->layer], se->slot);
        else sw = &vec;
        for (size_t r = 0; r < rows; r++) ft_wmat_row_f32(sw, (int)r, tmp + r * cols);
        ft_tensor t;
        int64_t shp[2] = {e->shape[0], e->shape[1]};
        if ((st = ft_tensor_init(&t, FT_F32, (uint32_t)e->ndim, shp, tmp))) goto fail;
        if ((st = ft_model_store(m, e, &t, cc))) goto fail;
    }
    ft_free_aligned(tmp);
    ft_codec_ctx_free(cc);
    *out = m;
    return FT_OK;
fail:
    ft_free_aligned(tmp);
    ft_codec_ctx_free(cc);
    ft_model_free(m);
    return st;
}

static void gstream_close(ft_gstream *g)
{
    if (!g) return;
    if (g->fd >= 0) close(g->fd);
    if (g->dfd >= 0) close(g->dfd);
    free(g);
}

void ft_model_free(ft_model *m)
{
    if (!m) return;
    if (m->gs_head != m->gs_emb) gstream_close(m->gs_head);
    gstream_close(m->gs_emb);
    ft_free_aligned(m->gbuf);
    ft_free_aligned(m->lbuf);
    free(m->chunk_tab);
    free(m->expert_tab);
    free(m->tensors);
    free(m->layers);
    free(m);
}

const ft_model_config *ft_model_get_config(const ft_model *m) { return m ? &m->cfg : NULL; }
uint64_t ft_model_weight_bytes(const ft_model *m) { return m ? m->weight_bytes : 0; }
size_t ft_model_tensor_count(const ft_model *m) { return m ? m->n_tensors : 0; }
uint64_t ft_model_layer_bytes(const ft_model *m) { return m ? (uint64_t)m->layer_bytes : 0; }
uint64_t ft_model_global_bytes(const ft_model *m) { return m ? (uint64_t)m->global_bytes : 0; }

void ft_model_global_split(const ft_model *m, uint64_t *embed, uint64_t *head)
{
    uint64_t e = 0, h = 0;
    for (size_t i = 0; m && i < m->n_tensors; i++) {
        const ft_model_tensor_entry *t = &m->tensors[i];
        if (t->layer >= 0) continue;
        if (t->slot == GW_TOK_EMB) e = pad64(t->bytes);
        if (t->slot == GW_LM_HEAD) h = pad64(t->bytes);
    }
    if (embed) *embed = e;
    if (head) *head = h;
}

unsigned ft_model_streamed(const ft_model *m) { return m ? m->stream : 0; }

uint64_t ft_model_stream_bytes_read(const ft_model *m)
{
    if (!m) return 0;
    uint64_t n = m->gs_emb ? __atomic_load_n(&m->gs_emb->bytes_read, __ATOMIC_RELAXED) : 0;
    if (m->gs_head && m->gs_head != m->gs_emb) n += __atomic_load_n(&m->gs_head->bytes_read, __ATOMIC_RELAXED);
    return n;
}

ft_wfmt ft_model_weights_format(const ft_model *m)
{
    uint64_t by[FT_WF_Q4 + 1] = {0};
    for (size_t i = 0; m && i < m->n_tensors; i++) {
        const ft_model_tensor_entry *e = &m->tensors[i];
        if (e->layer == 0 && e->ndim == 2) by[e->fmt] += (uint64_t)(e->shape[0] * e->shape[1]);
    }
    ft_wfmt best = m ? m->wfmt : FT_WF_F32;
    for (int f = 0; f <= FT_WF_Q4; f++) if (by[f] > by[best]) best = (ft_wfmt)f;
    return best;
}

const ft_layer_weights *ft_model_layer(const ft_model *m, int i)
{
    if (!m || i < 0 || i >= m->cfg.n_layers) return NULL;
    return &m->layers[i];
}

ft_status ft_model_tensor(ft_model *m, size_t i, const char **name, ft_tensor *view)
{
    if (!m || i >= m->n_tensors) return ft_set_error(FT_ERR_NOT_FOUND, "model: tensor %zu", i);
    ft_model_tensor_entry *e = &m->tensors[i];
    if (name) *name = e->name;
    if (!view) return FT_OK;
    if (e->streamed)
        return ft_set_error(FT_ERR_UNSUPPORTED, "model: %s is streamed from the checkpoint (not in memory)", e->name);
    if (is_q(e->fmt))
        return ft_set_error(FT_ERR_UNSUPPORTED, "model: %s is stored %s (no plain view)", e->name,
                            ft_wfmt_name(e->fmt));
    return ft_tensor_init(view, plain_dtype(e->fmt), (uint32_t)e->ndim, e->shape, e->data);
}

const char *ft_wfmt_name(ft_wfmt f)
{
    switch (f) {
    case FT_WF_F32: return "f32";
    case FT_WF_BF16: return "bf16";
    case FT_WF_F16: return "f16";
    case FT_WF_Q8: return "q8";
    case FT_WF_Q4: return "q4";
    }
    return "?";
}

void ft_load_params_default(ft_load_params *p)
{
    memset(p, 0, sizeof *p);
    p->weights = FT_WEIGHTS_AS_STORED;
    p->stream_direct_io = ft_direct_io_env();
}

/* ------------------------------------------------- public layer layout */

_Static_assert(FT_LAYER_SLOTS == LW_COUNT, "FT_LAYER_SLOTS is the number of ft_layer_weights fields");
_Static_assert(FT_LAYER_SLOT_ROUTER == LW_ROUTER && FT_LAYER_SLOT_SHARED_GATE == LW_SHARED_GATE,
               "the public router / shared-gate slot numbers");

int ft_layer_slot_is_matrix(int slot) { return slot >= 0 && ft_slot_is_matrix(slot); }

ft_wmat *ft_layer_weights_mat(ft_layer_weights *w, int slot)
{
    return w && slot >= 0 ? ft_layer_mat(w, slot) : NULL;
}

const float **ft_layer_weights_vec(ft_layer_weights *w, int slot)
{
    return w && slot >= 0 && slot < LW_COUNT ? ft_layer_vec(w, slot) : NULL;
}

ft_status ft_model_tensor_layout(const ft_model *m, size_t i, ft_tensor_layout *out)
{
    if (!m || !out || i >= m->n_tensors) return ft_set_error(FT_ERR_NOT_FOUND, "model: tensor %zu", i);
    const ft_model_tensor_entry *e = &m->tensors[i];
    memset(out, 0, sizeof *out);
    out->name = e->name;
    out->layer = e->layer;
    out->slot = e->slot;
    out->ndim = e->ndim;
    out->shape[0] = e->shape[0];
    out->shape[1] = e->ndim == 2 ? e->shape[1] : 0;
    out->fmt = e->fmt;
    out->group = e->group;
    out->n_chunks = e->n_chunks;
    return FT_OK;
}

ft_wfmt ft_model_format_for(const ft_model *m, size_t i, ft_wfmt want, int *group)
{
    int g = 0;
    if (!m || i >= m->n_tensors) { if (group) *group = 0; return FT_WF_F32; }
    const ft_model_tensor_entry *e = &m->tensors[i];
    ft_wfmt f = ft_tensor_format(&m->cfg, e->layer < 0, e->slot, e->ndim, e->shape, want, &g);
    if (group) *group = g;
    return f;
}

ft_wfmt ft_model_format_requested(const ft_model *m) { return m ? m->wfmt : FT_WF_F32; }

/* --------------------------------------------- the backend interface */

void ft_model_get_blocks(const ft_model *m, ft_model_blocks *out)
{
    out->norm = m->arch->norm;
    out->pos = m->arch->pos;
    out->ffn = m->arch->ffn;
    out->pos_offset = m->arch->pos_offset;
}

int ft_model_global_shape(const ft_model *m, int slot, int64_t shape[2])
{
    return ft_global_shape(&m->cfg, m->arch, slot, shape);
}

const ft_wmat *ft_model_global(const ft_model *m, int slot) { return &m->g[slot]; }

int ft_model_layer_has(const ft_model *m, int slot)
{
    char name[128];
    return m->arch->layer_name(&m->cfg, 0, slot, name, sizeof name);
}

int ft_model_layers_loaded(const ft_model *m) { return m->lbuf != NULL; }

/* The model-wide tensors each end of a pipeline reads. */
static int global_needed(const ft_model *m, int slot, int input_end, int output_end)
{
    switch (slot) {
    case GW_TOK_EMB: return input_end || (output_end && m->cfg.tie_word_embeddings);
    case GW_POS_EMB: case GW_PROJ_IN: return input_end;
    default: return output_end;
    }
}

uint64_t ft_model_release_globals(ft_model *m, int input_end, int output_end)
{
    long ps = sysconf(_SC_PAGESIZE);
    uint64_t dropped = 0;
    if (!m || ps <= 0) return 0;
    for (size_t i = 0; i < m->n_tensors; i++) {
        const ft_model_tensor_entry *e = &m->tensors[i];
        if (e->layer >= 0 || !e->data || global_needed(m, e->slot, input_end, output_end)) continue;
        /* whole pages inside the tensor only: a neighbour's bytes stay */
        uintptr_t a = ((uintptr_t)e->data + (uintptr_t)ps - 1) & ~((uintptr_t)ps - 1);
        uintptr_t z = ((uintptr_t)e->data + e->bytes) & ~((uintptr_t)ps - 1);
        if (z > a && madvise((void *)a, z - a, MADV_DONTNEED) == 0) dropped += z - a;
    }
    return dropped;
}
