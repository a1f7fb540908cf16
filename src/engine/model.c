/* Model weights in memory: one f32 buffer for the model-wide tensors and
 * one contiguous block per layer (so a layer can be swapped as a unit by
 * the offloading scheduler), plus the name table used by the loader and
 * the writer. */
#include "engine_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const ft_arch *ft_arch_get(ft_arch_id id)
{
    switch (id) {
    case FT_ARCH_OPT: return &ft_arch_opt;
    case FT_ARCH_LLAMA: return &ft_arch_llama;
    case FT_ARCH_QWEN2: return &ft_arch_qwen2;
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
};

const float **ft_layer_slot(ft_layer_weights *w, int slot)
{
    return (const float **)(void *)((char *)w + lw_off[slot]);
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
    default: s[0] = c->hidden; return 1;   /* norms, o bias, down bias */
    }
}

static size_t numel(int ndim, const int64_t *s) { return ndim == 1 ? (size_t)s[0] : (size_t)(s[0] * s[1]); }
/* Keep every tensor 64-byte aligned inside its buffer. */
static size_t pad16(size_t n) { return (n + 15) & ~(size_t)15; }

ft_status ft_model_create(const ft_model_config *cfg, ft_model **out)
{
    return ft_model_create_ex(cfg, 0, out);
}

ft_status ft_model_create_ex(const ft_model_config *cfg, int external_layers, ft_model **out)
{
    if (!cfg || !out) return ft_set_error(FT_ERR_INVALID_ARG, "model: NULL argument");
    const ft_arch *a = ft_arch_get(cfg->arch);
    if (!a) return ft_set_error(FT_ERR_UNSUPPORTED, "model: unknown architecture %d", (int)cfg->arch);
    if (cfg->n_layers < 1 || cfg->hidden < 1 || cfg->vocab < 1 || cfg->head_dim < 1)
        return ft_set_error(FT_ERR_INVALID_ARG, "model: config not filled in");
    ft_model *m = calloc(1, sizeof *m);
    if (!m) return ft_set_error(FT_ERR_NOMEM, "model: allocation");
    m->cfg = *cfg;
    m->arch = a;
    char name[128];
    int64_t shp[2];
    size_t gfl = 0, lfl = 0, n_glob_t = 0, n_layer_t = 0;
    for (int s = 0; s < GW_COUNT; s++)
        if (a->global_name(cfg, s, name, sizeof name)) {
            gfl += pad16(numel(ft_global_shape(cfg, a, s, shp), shp));
            n_glob_t++;
        }
    for (int s = 0; s < LW_COUNT; s++)
        if (a->layer_name(cfg, 0, s, name, sizeof name)) {
            lfl += pad16(numel(ft_layer_shape(cfg, s, shp), shp));
            n_layer_t++;
        }
    m->n_tensors = n_glob_t + n_layer_t * (size_t)cfg->n_layers;
    m->layer_floats = lfl;
    m->tensors = calloc(m->n_tensors, sizeof *m->tensors);
    m->layers = calloc((size_t)cfg->n_layers, sizeof *m->layers);
    m->gbuf = ft_malloc_aligned(gfl * sizeof(float), 64);
    if (!external_layers) m->lbuf = ft_malloc_aligned(lfl * (size_t)cfg->n_layers * sizeof(float), 64);
    if (!m->tensors || !m->layers || !m->gbuf || (!m->lbuf && !external_layers)) {
        ft_model_free(m);
        return ft_set_error(FT_ERR_NOMEM, "model: %.1f MiB of weights",
                            (double)(gfl + lfl * (size_t)cfg->n_layers) * 4 / 1048576.0);
    }
    memset(m->gbuf, 0, gfl * sizeof(float));
    if (m->lbuf) memset(m->lbuf, 0, lfl * (size_t)cfg->n_layers * sizeof(float));
    m->weight_bytes = (uint64_t)(gfl + lfl * (size_t)cfg->n_layers) * sizeof(float);
    size_t ti = 0, off = 0;
    for (int s = 0; s < GW_COUNT; s++) {
        if (!a->global_name(cfg, s, name, sizeof name)) continue;
        ft_model_tensor_entry *e = &m->tensors[ti++];
        snprintf(e->name, sizeof e->name, "%s", name);
        e->layer = -1;
        e->slot = s;
        e->ndim = ft_global_shape(cfg, a, s, e->shape);
        e->data = m->gbuf + off;
        m->g[s] = e->data;
        off += pad16(numel(e->ndim, e->shape));
    }
    if (!m->g[GW_LM_HEAD]) m->g[GW_LM_HEAD] = m->g[GW_TOK_EMB];   /* tied */
    for (int l = 0; l < cfg->n_layers; l++) {
        float *base = m->lbuf ? m->lbuf + (size_t)l * lfl : NULL;
        off = 0;
        for (int s = 0; s < LW_COUNT; s++) {
            if (!a->layer_name(cfg, l, s, name, sizeof name)) continue;
            ft_model_tensor_entry *e = &m->tensors[ti++];
            snprintf(e->name, sizeof e->name, "%s", name);
            e->layer = l;
            e->slot = s;
            e->ndim = ft_layer_shape(cfg, s, e->shape);
            e->offset = off;
            e->data = base ? base + off : NULL;
            *ft_layer_slot(&m->layers[l], s) = e->data;
            off += pad16(numel(e->ndim, e->shape));
        }
    }
    *out = m;
    return FT_OK;
}

void ft_model_free(ft_model *m)
{
    if (!m) return;
    ft_free_aligned(m->gbuf);
    ft_free_aligned(m->lbuf);
    free(m->tensors);
    free(m->layers);
    free(m);
}

const ft_model_config *ft_model_get_config(const ft_model *m) { return m ? &m->cfg : NULL; }
uint64_t ft_model_weight_bytes(const ft_model *m) { return m ? m->weight_bytes : 0; }
size_t ft_model_tensor_count(const ft_model *m) { return m ? m->n_tensors : 0; }
uint64_t ft_model_layer_bytes(const ft_model *m) { return m ? (uint64_t)m->layer_floats * 4 : 0; }

ft_layer_weights *ft_model_layer(ft_model *m, int i)
{
    if (!m || i < 0 || i >= m->cfg.n_layers) return NULL;
    return &m->layers[i];
}

ft_status ft_model_tensor(ft_model *m, size_t i, const char **name, ft_tensor *view)
{
    if (!m || i >= m->n_tensors) return ft_set_error(FT_ERR_NOT_FOUND, "model: tensor %zu", i);
    ft_model_tensor_entry *e = &m->tensors[i];
    if (name) *name = e->name;
    if (view) return ft_tensor_init(view, FT_F32, (uint32_t)e->ndim, e->shape, e->data);
    return FT_OK;
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
