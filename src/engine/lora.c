/* LoRA adapters applied in the forward pass, unmerged (engine.h, ft_lora):
 * a set of (layer, projection slot, rank, scale, A, B) entries, indexed
 * per layer and slot in the order they were added. The CPU backend's
 * linear op (forward.c) adds each entry's scale * B (A x) after W x + b;
 * its mixture of experts the entries of expert slots (LW_EXPERT(e, k))
 * after each expert's gate, up and down products. */
#include "engine_internal.h"
#include "lora.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* the projections the graph runs through the backend's linear op */
static const int lora_slots[] = {LW_Q, LW_K, LW_V, LW_O, LW_GATE, LW_UP, LW_DOWN};
#define N_LORA_SLOTS ((int)(sizeof lora_slots / sizeof lora_slots[0]))

ft_status ft_lora_create(const ft_model *m, ft_lora **out)
{
    if (!m || !out) return ft_set_error(FT_ERR_INVALID_ARG, "lora: NULL argument");
    ft_lora *l = calloc(1, sizeof *l);
    int nl = m->cfg.n_layers, ns = LW_COUNT + 3 * m->cfg.n_experts;
    if (l) l->head = malloc((size_t)nl * (size_t)ns * sizeof *l->head);
    if (!l || !l->head) {
        if (l) free(l);
        return ft_set_error(FT_ERR_NOMEM, "lora: allocation");
    }
    for (size_t i = 0; i < (size_t)nl * (size_t)ns; i++) l->head[i] = -1;
    l->m = m;
    l->nslots = ns;
    *out = l;
    return FT_OK;
}

void ft_lora_free(ft_lora *l)
{
    if (!l) return;
    for (size_t i = 0; i < l->n; i++) {
        free(l->e[i].A);
        free(l->e[i].B);
    }
    free(l->e);
    free(l->head);
    free(l);
}

/* "model.layers.3.self_attn.q_proj" -> layer 3, LW_Q, through the
 * architecture's tensor names (module + ".weight" must be one of them);
 * an expert's own projection (transformers 4's per-expert modules,
 * "model.layers.3.block_sparse_moe.experts.5.w1") -> its expert slot */
static int find_module(const ft_model *m, const char *module, int *layer, int *slot)
{
    const char *p = strstr(module, "layers.");
    if (!p) return 0;
    char *end;
    long L = strtol(p + 7, &end, 10);
    if (end == p + 7 || L < 0 || L >= m->cfg.n_layers) return 0;
    char want[512], name[512];
    if ((size_t)snprintf(want, sizeof want, "%s.weight", module) >= sizeof want) return 0;
    for (int i = 0; i < N_LORA_SLOTS; i++) {
        if (!m->arch->layer_name(&m->cfg, (int)L, lora_slots[i], name, sizeof name)) continue;
        int hit = !strcmp(name, want);
        /* a checkpoint under the architecture's alternative prefix */
        if (!hit && m->arch->alt_from && !strncmp(name, m->arch->alt_from, strlen(m->arch->alt_from))) {
            char alt[512];
            snprintf(alt, sizeof alt, "%s%s", m->arch->alt_to, name + strlen(m->arch->alt_from));
            hit = !strcmp(alt, want);
        }
        if (hit) {
            *layer = (int)L;
            *slot = lora_slots[i];
            return 1;
        }
    }
    for (int s = LW_COUNT; m->cfg.n_experts && m->cfg.layer_moe[L] && s < LW_COUNT + 3 * m->cfg.n_experts; s++)
        if (m->arch->layer_name(&m->cfg, (int)L, s, name, sizeof name) && !strcmp(name, want)) {
            *layer = (int)L;
            *slot = s;
            return 1;
        }
    return 0;
}

/* one entry (A rank x in, B out x rank, copied) at (layer, slot) */
static ft_status add_entry(ft_lora *l, const char *module, int layer, int slot, int rank, int in, int out,
                           float scale, const float *A, const float *B)
{
    size_t na = (size_t)rank * (size_t)in, nb = (size_t)out * (size_t)rank;
    for (size_t i = 0; i < na; i++)
        if (!isfinite(A[i])) return ft_set_error(FT_ERR_INVALID_ARG, "lora: %s: lora_A holds a non-finite value", module);
    for (size_t i = 0; i < nb; i++)
        if (!isfinite(B[i])) return ft_set_error(FT_ERR_INVALID_ARG, "lora: %s: lora_B holds a non-finite value", module);
    if (l->n == l->cap) {
        size_t nc = l->cap ? 2 * l->cap : 16;
        ft_lora_entry *ne = realloc(l->e, nc * sizeof *ne);
        if (!ne) return ft_set_error(FT_ERR_NOMEM, "lora: allocation");
        l->e = ne;
        l->cap = nc;
    }
    ft_lora_entry *e = &l->e[l->n];
    memset(e, 0, sizeof *e);
    e->A = malloc(na * sizeof(float));
    e->B = malloc(nb * sizeof(float));
    if (!e->A || !e->B) {
        free(e->A);
        free(e->B);
        return ft_set_error(FT_ERR_NOMEM, "lora: %s: %zu floats", module, na + nb);
    }
    memcpy(e->A, A, na * sizeof(float));
    memcpy(e->B, B, nb * sizeof(float));
    e->layer = layer;
    e->slot = slot;
    e->rank = rank;
    e->in = in;
    e->out = out;
    e->scale = scale;
    e->next = -1;
    /* append to the (layer, slot) chain: the order of addition */
    int *pp = &l->head[(size_t)layer * (size_t)l->nslots + (size_t)slot];
    while (*pp >= 0) pp = &l->e[*pp].next;
    *pp = (int)l->n;
    l->n++;
    l->bytes += (uint64_t)(na + nb) * sizeof(float);
    if (rank > l->max_rank) l->max_rank = rank;
    if (out > l->max_out) l->max_out = out;
    if (in > l->max_in) l->max_in = in;
    return FT_OK;
}

/* A module's (layer, slot) and shape (out x in), or a refusal naming it */
static ft_status module_at(const ft_lora *l, const char *module, int *layer, int *slot, int *out, int *in)
{
    *layer = *slot = -1;
    if (!find_module(l->m, module, layer, slot))
        return ft_set_error(FT_ERR_UNSUPPORTED, "lora: %s is not a projection of this %s model that adapters can "
                            "change (its own q/k/v/o or MLP matrix, or an expert's; fused and router projections are not "
                            "implemented)", module, l->m->cfg.model_type);
    int64_t sh[2];
    ft_layer_shape(&l->m->cfg, *slot, sh);
    *out = (int)sh[0];
    *in = (int)sh[1];
    return FT_OK;
}

ft_status ft_lora_add(ft_lora *l, const char *module, int rank, float scale, const float *A, const float *B)
{
    if (!l || !module || !A || !B) return ft_set_error(FT_ERR_INVALID_ARG, "lora: NULL argument");
    if (rank < 1 || rank > 65536) return ft_set_error(FT_ERR_INVALID_ARG, "lora: %s: rank %d", module, rank);
    if (!isfinite(scale)) return ft_set_error(FT_ERR_INVALID_ARG, "lora: %s: scale is not finite", module);
    int layer, slot, out, in;
    ft_status st = module_at(l, module, &layer, &slot, &out, &in);
    if (st) return st;
    return add_entry(l, module, layer, slot, rank, in, out, scale, A, B);
}

ft_status ft_lora_add_experts(ft_lora *l, const char *module, int rank, int n_experts, int in, int out, float scale,
                              const float *A, const float *B)
{
    if (!l || !module || !A || !B) return ft_set_error(FT_ERR_INVALID_ARG, "lora: NULL argument");
    const ft_model_config *c = &l->m->cfg;
    const char *p = strstr(module, "layers.");
    char *end = NULL;
    long L = p ? strtol(p + 7, &end, 10) : -1;
    char want[512];
    if (!p || end == p + 7 || L < 0 || L >= c->n_layers)
        return ft_set_error(FT_ERR_UNSUPPORTED, "lora: %s is not the experts of a layer of this %s model", module,
                            c->model_type);
    snprintf(want, sizeof want, "model.layers.%ld.mlp.experts", L);
    if (strcmp(module, want) && strcmp(module, want + 6))
        return ft_set_error(FT_ERR_UNSUPPORTED, "lora: %s: LoRA on parameters (target_parameters) is implemented for "
                            "the experts of a mixture of experts only (model.layers.L.mlp.experts)", module);
    if (!c->n_experts || !c->layer_moe[L])
        return ft_set_error(FT_ERR_UNSUPPORTED, "lora: %s: layer %ld of this %s model has no experts", module, L,
                            c->model_type);
    if (c->shared_expert)
        return ft_set_error(FT_ERR_UNSUPPORTED, "lora: %s: expert adapters on %s (shared expert) are not implemented",
                            module, c->model_type);
    if (rank < 1 || rank > 65536 || n_experts != c->n_experts)
        return ft_set_error(FT_ERR_INVALID_ARG, "lora: %s: %d experts of rank %d (the model has %d experts)", module,
                            n_experts, rank, c->n_experts);
    if (!isfinite(scale)) return ft_set_error(FT_ERR_INVALID_ARG, "lora: %s: scale is not finite", module);
    /* transformers 5's gate_up_proj [E, 2F, H] or down_proj [E, H, F], told by the shapes */
    const int H = c->hidden, F = c->moe_ffn, E = n_experts;
    int gu = in == H && out == 2 * F, dn = in == F && out == H;
    if (gu == dn)
        return ft_set_error(FT_ERR_INVALID_ARG, "lora: %s: lora_B x lora_A per expert is [%d, %d]: neither the "
                            "experts' gate_up_proj [%d, %d] nor down_proj [%d, %d] (an adapter of another model?)",
                            module, out, in, 2 * F, H, H, F);
    float *Be = malloc((size_t)out * (size_t)rank * sizeof(float));
    if (!Be) return ft_set_error(FT_ERR_NOMEM, "lora: %s: allocation", module);
    ft_status st = FT_OK;
    for (int e = 0; e < E && !st; e++) {
        /* PEFT's layout: expert e's A rows e r .. e r + r - 1, its B column j at j E + e */
        const float *Ae = A + (size_t)e * (size_t)rank * (size_t)in;
        for (int o = 0; o < out; o++)
            for (int j = 0; j < rank; j++)
                Be[(size_t)o * (size_t)rank + (size_t)j] = B[(size_t)o * (size_t)E * (size_t)rank + (size_t)j * (size_t)E + (size_t)e];
        if (dn) {
            st = add_entry(l, module, (int)L, LW_EXPERT(e, LW_EXP_DOWN), rank, in, out, scale, Ae, Be);
        } else {   /* gate rows [0, F), up rows [F, 2F) of the fused B, the same A */
            st = add_entry(l, module, (int)L, LW_EXPERT(e, LW_EXP_GATE), rank, in, F, scale, Ae, Be);
            if (!st)
                st = add_entry(l, module, (int)L, LW_EXPERT(e, LW_EXP_UP), rank, in, F, scale, Ae,
                               Be + (size_t)F * (size_t)rank);
        }
    }
    free(Be);
    return st;
}

size_t ft_lora_count(const ft_lora *l) { return l ? l->n : 0; }
uint64_t ft_lora_bytes(const ft_lora *l) { return l ? l->bytes : 0; }

ft_status ft_lora_module_shape(const ft_lora *l, const char *module, int *out, int *in)
{
    if (!l || !module || !out || !in) return ft_set_error(FT_ERR_INVALID_ARG, "lora: NULL argument");
    int layer, slot;
    return module_at(l, module, &layer, &slot, out, in);
}
