/* Qwen3 and Qwen3-MoE: the Llama graph with an RMSNorm of each head of q
 * and k (q_norm, k_norm, over head_dim) before RoPE; optional biases on
 * q/k/v/o (attention_bias). Qwen3-MoE's sparse layers (decoder_sparse_step,
 * mlp_only_layers) replace the MLP by a router (mlp.gate) over experts
 * mlp.experts.<e>.{gate,up,down}_proj. */
#include "engine_internal.h"

#include <stdio.h>

static int qwen3_layer(const ft_model_config *c, int layer, int slot, char *b, size_t n)
{
    static const char *const names[LW_COUNT] = {
        [LW_NORM2_W] = "post_attention_layernorm.weight",
        [LW_GATE] = "mlp.gate_proj.weight", [LW_UP] = "mlp.up_proj.weight",
        [LW_DOWN] = "mlp.down_proj.weight", [LW_ROUTER] = "mlp.gate.weight",
    };
    int moe = c->n_experts && c->layer_moe[layer];
    if (slot >= LW_COUNT) {
        static const char *const ex[3] = {"gate_proj", "up_proj", "down_proj"};
        return ft_hf_expert_name(c, layer, slot, "mlp", ex, b, n);
    }
    const char *s = ft_hf_attn_name(c, slot);
    if (!s) s = names[slot];
    if (!s) return 0;
    if ((slot == LW_GATE || slot == LW_UP || slot == LW_DOWN) && moe) return 0;
    if (slot == LW_ROUTER && !moe) return 0;
    snprintf(b, n, "model.layers.%d.%s", layer, s);
    return 1;
}

static int qwen3_global(const ft_model_config *c, int slot, char *b, size_t n)
{
    return ft_arch_llama.global_name(c, slot, b, n);
}

const ft_arch ft_arch_qwen3 = {
    .id = FT_ARCH_QWEN3, .name = "qwen3",
    .norm = FT_NORM_RMS, .pos = FT_POS_ROPE, .ffn = FT_FFN_SWIGLU, .pos_offset = 0,
    .global_name = qwen3_global, .layer_name = qwen3_layer,
    .alt_from = "model.", .alt_to = "",
};
