/* Phi-3: the Llama graph with fused projections in the checkpoint:
 * self_attn.qkv_proj holds q, k and v one after the other (rows), and
 * mlp.gate_up_proj gate then up. The engine keeps them as separate
 * matrices, each a slice of rows of the fused tensor (ft_src_slice). */
#include "engine_internal.h"

#include <stdio.h>

static int phi3_layer(const ft_model_config *c, int layer, int slot, char *b, size_t n)
{
    static const char *const names[LW_COUNT] = {
        [LW_NORM1_W] = "input_layernorm.weight",
        [LW_Q] = "self_attn.qkv_proj.weight:q", [LW_K] = "self_attn.qkv_proj.weight:k",
        [LW_V] = "self_attn.qkv_proj.weight:v", [LW_O] = "self_attn.o_proj.weight",
        [LW_NORM2_W] = "post_attention_layernorm.weight",
        [LW_GATE] = "mlp.gate_up_proj.weight:gate", [LW_UP] = "mlp.gate_up_proj.weight:up",
        [LW_DOWN] = "mlp.down_proj.weight",
    };
    (void)c;
    if (slot >= LW_COUNT || !names[slot]) return 0;
    snprintf(b, n, "model.layers.%d.%s", layer, names[slot]);
    return 1;
}

static int phi3_src(const ft_model_config *c, int layer, int slot, ft_src_slice *s)
{
    int q = c->n_heads * c->head_dim, kv = c->n_kv_heads * c->head_dim;
    s->expert = -1;
    s->n_experts = 0;
    switch (slot) {
    case LW_Q: case LW_K: case LW_V:
        snprintf(s->name, sizeof s->name, "model.layers.%d.self_attn.qkv_proj.weight", layer);
        s->rows = q + 2 * kv;
        s->row0 = slot == LW_Q ? 0 : slot == LW_K ? q : q + kv;
        return 1;
    case LW_GATE: case LW_UP:
        snprintf(s->name, sizeof s->name, "model.layers.%d.mlp.gate_up_proj.weight", layer);
        s->rows = 2 * c->ffn;
        s->row0 = slot == LW_GATE ? 0 : c->ffn;
        return 1;
    default:
        return 0;
    }
}

static int phi3_global(const ft_model_config *c, int slot, char *b, size_t n)
{
    return ft_arch_llama.global_name(c, slot, b, n);
}

const ft_arch ft_arch_phi3 = {
    .id = FT_ARCH_PHI3, .name = "phi3",
    .norm = FT_NORM_RMS, .pos = FT_POS_ROPE, .ffn = FT_FFN_SWIGLU, .pos_offset = 0,
    .global_name = phi3_global, .layer_name = phi3_layer, .layer_src = phi3_src,
    .alt_from = "model.", .alt_to = "",
};
