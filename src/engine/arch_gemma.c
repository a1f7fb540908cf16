/* Gemma 2 and Gemma 3 (text): four norms per layer (input, after
 * attention, before and after the FFN: "sandwich"), RMSNorm weights as
 * (1 + w), GeGLU, scaled embeddings, a tied head; gemma3 adds per-head
 * q/k norms. The math flags are the config's (config.c, graph.c). */
#include "engine_internal.h"

#include <stdio.h>

static int gemma_layer(const ft_model_config *c, int layer, int slot, char *b, size_t n)
{
    static const char *const names[LW_COUNT] = {
        [LW_NORM1_W] = "input_layernorm.weight",
        [LW_Q] = "self_attn.q_proj.weight", [LW_QB] = "self_attn.q_proj.bias",
        [LW_K] = "self_attn.k_proj.weight", [LW_KB] = "self_attn.k_proj.bias",
        [LW_V] = "self_attn.v_proj.weight", [LW_VB] = "self_attn.v_proj.bias",
        [LW_O] = "self_attn.o_proj.weight", [LW_OB] = "self_attn.o_proj.bias",
        [LW_QNORM] = "self_attn.q_norm.weight", [LW_KNORM] = "self_attn.k_norm.weight",
        [LW_POST_ATTN_NORM] = "post_attention_layernorm.weight",
        [LW_NORM2_W] = "pre_feedforward_layernorm.weight",
        [LW_POST_FFN_NORM] = "post_feedforward_layernorm.weight",
        [LW_GATE] = "mlp.gate_proj.weight", [LW_UP] = "mlp.up_proj.weight",
        [LW_DOWN] = "mlp.down_proj.weight",
    };
    if (slot >= LW_COUNT || !names[slot]) return 0;
    if ((slot == LW_QB || slot == LW_KB || slot == LW_VB || slot == LW_OB) && !c->attention_bias) return 0;
    if ((slot == LW_QNORM || slot == LW_KNORM) && !c->qk_norm) return 0;
    snprintf(b, n, "model.layers.%d.%s", layer, names[slot]);
    return 1;
}

static int gemma_global(const ft_model_config *c, int slot, char *b, size_t n)
{
    return ft_arch_llama.global_name(c, slot, b, n);
}

const ft_arch ft_arch_gemma2 = {
    .id = FT_ARCH_GEMMA2, .name = "gemma2",
    .norm = FT_NORM_RMS, .pos = FT_POS_ROPE, .ffn = FT_FFN_SWIGLU, .pos_offset = 0,
    .global_name = gemma_global, .layer_name = gemma_layer,
    .alt_from = "model.", .alt_to = "",
};
