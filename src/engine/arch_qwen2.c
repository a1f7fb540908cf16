/* Qwen2: the Llama graph with biases on q/k/v (none on o_proj or the MLP).
 * Everything but the tensor names is Llama's; this file is the whole
 * architecture. Qwen2-MoE (Qwen1.5-MoE, Qwen2-57B-A14B): the same
 * attention (q/k/v biases unless qkv_bias is false); its sparse layers
 * (decoder_sparse_step, mlp_only_layers) have a router (mlp.gate), experts
 * mlp.experts.<e>.{gate,up,down}_proj and a shared expert
 * mlp.shared_expert.{gate,up,down}_proj, kept in the dense MLP's slots,
 * gated by mlp.shared_expert_gate. */
#include "engine_internal.h"

#include <stdio.h>

static int qwen2_global(const ft_model_config *c, int slot, char *b, size_t n)
{
    return ft_arch_llama.global_name(c, slot, b, n);
}

static int qwen2_layer(const ft_model_config *c, int layer, int slot, char *b, size_t n)
{
    static const char *const names[LW_COUNT] = {
        [LW_NORM1_W] = "input_layernorm.weight",
        [LW_Q] = "self_attn.q_proj.weight", [LW_QB] = "self_attn.q_proj.bias",
        [LW_K] = "self_attn.k_proj.weight", [LW_KB] = "self_attn.k_proj.bias",
        [LW_V] = "self_attn.v_proj.weight", [LW_VB] = "self_attn.v_proj.bias",
        [LW_O] = "self_attn.o_proj.weight",
        [LW_NORM2_W] = "post_attention_layernorm.weight",
        [LW_GATE] = "mlp.gate_proj.weight", [LW_UP] = "mlp.up_proj.weight",
        [LW_DOWN] = "mlp.down_proj.weight",
    };
    static const char *const shared[3] = {"mlp.shared_expert.gate_proj.weight", "mlp.shared_expert.up_proj.weight",
                                          "mlp.shared_expert.down_proj.weight"};
    int moe = c->n_experts && c->layer_moe[layer];
    if (slot >= LW_COUNT) {
        static const char *const ex[3] = {"gate_proj", "up_proj", "down_proj"};
        return ft_hf_expert_name(c, layer, slot, "mlp", ex, b, n);
    }
    const char *s = names[slot];
    if (moe && slot == LW_ROUTER) s = "mlp.gate.weight";
    if (moe && c->shared_expert && slot == LW_SHARED_GATE) s = "mlp.shared_expert_gate.weight";
    if (moe && (slot == LW_GATE || slot == LW_UP || slot == LW_DOWN))
        s = c->shared_expert ? shared[slot == LW_GATE ? 0 : slot == LW_UP ? 1 : 2] : NULL;
    if ((slot == LW_QB || slot == LW_KB || slot == LW_VB) && c->no_qkv_bias) s = NULL;
    if (!s) return 0;
    snprintf(b, n, "model.layers.%d.%s", layer, s);
    return 1;
}

const ft_arch ft_arch_qwen2 = {
    .id = FT_ARCH_QWEN2, .name = "qwen2",
    .norm = FT_NORM_RMS, .pos = FT_POS_ROPE, .ffn = FT_FFN_SWIGLU, .pos_offset = 0,
    .global_name = qwen2_global, .layer_name = qwen2_layer,
    .alt_from = "model.", .alt_to = "",
};
