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
        [LW_NORM1_W] = "input_layernorm.weight",
        [LW_Q] = "self_attn.q_proj.weight", [LW_QB] = "self_attn.q_proj.bias",
        [LW_K] = "self_attn.k_proj.weight", [LW_KB] = "self_attn.k_proj.bias",
        [LW_V] = "self_attn.v_proj.weight", [LW_VB] = "self_attn.v_proj.bias",
        [LW_O] = "self_attn.o_proj.weight", [LW_OB] = "self_attn.o_proj.bias",
        [LW_QNORM] = "self_attn.q_norm.weight", [LW_KNORM] = "self_attn.k_norm.weight",
        [LW_NORM2_W] = "post_attention_layernorm.weight",
        [LW_GATE] = "mlp.gate_proj.weight", [LW_UP] = "mlp.up_proj.weight",
        [LW_DOWN] = "mlp.down_proj.weight", [LW_ROUTER] = "mlp.gate.weight",
    };
    int moe = c->n_experts && c->layer_moe[layer];
    if (slot >= LW_COUNT) {
        static const char *const ex[3] = {"gate_proj", "up_proj", "down_proj"};
        if (!moe) return 0;
        int e = (slot - LW_COUNT) / 3, k = (slot - LW_COUNT) % 3;
        snprintf(b, n, "model.layers.%d.mlp.experts.%d.%s.weight", layer, e, ex[k]);
        return 1;
    }
    const char *s = names[slot];
    if (!s) return 0;
    if ((slot == LW_QB || slot == LW_KB || slot == LW_VB || slot == LW_OB) && !c->attention_bias) return 0;
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
