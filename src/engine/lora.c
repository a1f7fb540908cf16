/* LoRA adapters applied in the forward pass, unmerged (engine.h, ft_lora):
 * a set of (layer, projection slot, rank, scale, A, B) entries, indexed
 * per layer and slot in the order they were added. The CPU backend's
 * linear op (forward.c) adds each entry's scale * B (A x) after W x + b. */
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
    int nl = m->cfg.n_layers;
    if (l) l->head = malloc((size_t)nl * LW_COUNT * sizeof *l->head);
    if (!l || !l->head) {
        if (l) free(l);
        return ft_set_error(FT_ERR_NOMEM, "lora: allocation");
    }
    for (size_t i = 0; i < (size_t)nl * LW_COUNT; i++) l->head[i] = -1;
    l->m = m;
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
 * architecture's tensor names (module + ".weight" must be one of them) */
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
    return 0;
}

ft_status ft_lora_add(ft_lora *l, const char *module, int rank, float scale, const float *A, const float *B)
{
    if (!l || !module || !A || !B) return ft_set_error(FT_ERR_INVALID_ARG, "lora: NULL argument");
    if (rank < 1 || rank > 65536) return ft_set_error(FT_ERR_INVALID_ARG, "lora: %s: rank %d", module, rank);
    if (!isfinite(scale)) return ft_set_error(FT_ERR_INVALID_ARG, "lora: %s: scale is not finite", module);
    int layer = -1, slot = -1;
    if (!find_module(l->m, module, &layer, &slot))
        return ft_set_error(FT_ERR_UNSUPPORTED, "lora: %s is not a projection of this %s model that adapters can "
                            "change (its own q/k/v/o or MLP matrix; fused, expert and router projections are not "
                            "implemented)", module, l->m->cfg.model_type);
    int64_t sh[2];
    ft_layer_shape(&l->m->cfg, slot, sh);
    int out = (int)sh[0], in = (int)sh[1];
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
    int *pp = &l->head[(size_t)layer * LW_COUNT + (size_t)slot];
    while (*pp >= 0) pp = &l->e[*pp].next;
    *pp = (int)l->n;
    l->n++;
    l->bytes += (uint64_t)(na + nb) * sizeof(float);
    if (rank > l->max_rank) l->max_rank = rank;
    if (out > l->max_out) l->max_out = out;
    if (in > l->max_in) l->max_in = in;
    return FT_OK;
}

size_t ft_lora_count(const ft_lora *l) { return l ? l->n : 0; }
uint64_t ft_lora_bytes(const ft_lora *l) { return l ? l->bytes : 0; }

ft_status ft_lora_module_shape(const ft_lora *l, const char *module, int *out, int *in)
{
    if (!l || !module || !out || !in) return ft_set_error(FT_ERR_INVALID_ARG, "lora: NULL argument");
    int layer, slot;
    if (!find_module(l->m, module, &layer, &slot))
        return ft_set_error(FT_ERR_UNSUPPORTED, "lora: %s is not a projection of this %s model that adapters can "
                            "change (its own q/k/v/o or MLP matrix; fused, expert and router projections are not "
                            "implemented)", module, l->m->cfg.model_type);
    int64_t sh[2];
    ft_layer_shape(&l->m->cfg, slot, sh);
    *out = (int)sh[0];
    *in = (int)sh[1];
    return FT_OK;
}
