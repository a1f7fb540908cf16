/* Mixtral and OLMoE: the Llama attention (OLMoE with q/k RMSNorm over the
 * whole projections) and a sparse mixture of experts in every layer.
 * Mixtral: block_sparse_moe.gate, experts.<e>.w1 (gate), w3 (up), w2
 * (down); OLMoE: mlp.gate, mlp.experts.<e>.{gate,up,down}_proj. */
#include "engine_internal.h"

#include <stdio.h>

/* The router and the experts live under block ("block_sparse_moe" or
 * "mlp"); ex names an expert's gate, up and down projections. */
static int moe_layer(const ft_model_config *c, int layer, int slot, const char *block, const char *const ex[3],
                     char *b, size_t n)
{
    static const char *const names[LW_COUNT] = {
        [LW_NORM2_W] = "post_attention_layernorm.weight",
    };
    if (slot >= LW_COUNT) return ft_hf_expert_name(c, layer, slot, block, ex, b, n);
    if (slot == LW_ROUTER) {
        snprintf(b, n, "model.layers.%d.%s.gate.weight", layer, block);
        return 1;
    }
    const char *s = ft_hf_attn_name(c, slot);
    if (!s) s = names[slot];
    if (!s) return 0;
    snprintf(b, n, "model.layers.%d.%s", layer, s);
    return 1;
}

static int mixtral_layer(const ft_model_config *c, int layer, int slot, char *b, size_t n)
{
    static const char *const ex[3] = {"w1", "w3", "w2"};
    return moe_layer(c, layer, slot, "block_sparse_moe", ex, b, n);
}

static int olmoe_layer(const ft_model_config *c, int layer, int slot, char *b, size_t n)
{
    static const char *const ex[3] = {"gate_proj", "up_proj", "down_proj"};
    return moe_layer(c, layer, slot, "mlp", ex, b, n);
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
