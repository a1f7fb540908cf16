/* Mixtral and OLMoE: the Llama attention (OLMoE with q/k RMSNorm over the
 * whole projections) and a sparse mixture of experts in every layer.
 * Mixtral: block_sparse_moe.gate, experts.<e>.w1 (gate), w3 (up), w2
 * (down); OLMoE: mlp.gate, mlp.experts.<e>.{gate,up,down}_proj. */
#include "engine_internal.h"

#include <stdio.h>

static int attn_name(const ft_model_config *c, int slot, const char **s)
{
    static const char *const names[LW_COUNT] = {
        [LW_NORM1_W] = "input_layernorm.weight",
        [LW_Q] = "self_attn.q_proj.weight", [LW_QB] = "self_attn.q_proj.bias",
        [LW_K] = "self_attn.k_proj.weight", [LW_KB] = "self_attn.k_proj.bias",
        [LW_V] = "self_attn.v_proj.weight", [LW_VB] = "self_attn.v_proj.bias",
        [LW_O] = "self_attn.o_proj.weight", [LW_OB] = "self_attn.o_proj.bias",
        [LW_NORM2_W] = "post_attention_layernorm.weight",
        [LW_QNORM] = "self_attn.q_norm.weight", [LW_KNORM] = "self_attn.k_norm.weight",
    };
    *s = slot < LW_COUNT ? names[slot] : NULL;
    if (!*s) return 0;
    if ((slot == LW_QB || slot == LW_KB || slot == LW_VB || slot == LW_OB) && !c->attention_bias) return 0;
    if ((slot == LW_QNORM || slot == LW_KNORM) && !c->qk_norm) return 0;
    return 1;
}

static int mixtral_layer(const ft_model_config *c, int layer, int slot, char *b, size_t n)
{
    const char *s;
    if (slot >= LW_COUNT) {
        static const char *const ex[3] = {"w1", "w3", "w2"};
        if (!c->n_experts || !c->layer_moe[layer]) return 0;
        snprintf(b, n, "model.layers.%d.block_sparse_moe.experts.%d.%s.weight", layer, (slot - LW_COUNT) / 3,
                 ex[(slot - LW_COUNT) % 3]);
        return 1;
    }
    if (slot == LW_ROUTER) {
        snprintf(b, n, "model.layers.%d.block_sparse_moe.gate.weight", layer);
        return 1;
    }
    if (!attn_name(c, slot, &s)) return 0;
    snprintf(b, n, "model.layers.%d.%s", layer, s);
    return 1;
}

static int olmoe_layer(const ft_model_config *c, int layer, int slot, char *b, size_t n)
{
    const char *s;
    if (slot >= LW_COUNT) {
        static const char *const ex[3] = {"gate_proj", "up_proj", "down_proj"};
        if (!c->n_experts || !c->layer_moe[layer]) return 0;
        snprintf(b, n, "model.layers.%d.mlp.experts.%d.%s.weight", layer, (slot - LW_COUNT) / 3,
                 ex[(slot - LW_COUNT) % 3]);
        return 1;
    }
    if (slot == LW_ROUTER) {
        snprintf(b, n, "model.layers.%d.mlp.gate.weight", layer);
        return 1;
    }
    if (!attn_name(c, slot, &s)) return 0;
    snprintf(b, n, "model.layers.%d.%s", layer, s);
    return 1;
}

static int moe_global(const ft_model_config *c, int slot, char *b, size_t n)
{
    return ft_arch_llama.global_name(c, slot, b, n);
}

const ft_arch ft_arch_mixtral = {
    .id = FT_ARCH_MIXTRAL, .name = "mixtral",
    .norm = FT_NORM_RMS, .pos = FT_POS_ROPE, .ffn = FT_FFN_SWIGLU, .pos_offset = 0,
    .global_name = moe_global, .layer_name = mixtral_layer,
    .alt_from = "model.", .alt_to = "",
};

const ft_arch ft_arch_olmoe = {
    .id = FT_ARCH_OLMOE, .name = "olmoe",
    .norm = FT_NORM_RMS, .pos = FT_POS_ROPE, .ffn = FT_FFN_SWIGLU, .pos_offset = 0,
    .global_name = moe_global, .layer_name = olmoe_layer,
    .alt_from = "model.", .alt_to = "",
};
