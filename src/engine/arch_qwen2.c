/* Qwen2: the Llama graph with biases on q/k/v (none on o_proj or the MLP).
 * Everything but the tensor names is Llama's; this file is the whole
 * architecture. */
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
    (void)c;
    if (!names[slot]) return 0;
    snprintf(b, n, "model.layers.%d.%s", layer, names[slot]);
    return 1;
}

const ft_arch ft_arch_qwen2 = {
    .id = FT_ARCH_QWEN2, .name = "qwen2",
    .norm = FT_NORM_RMS, .pos = FT_POS_ROPE, .ffn = FT_FFN_SWIGLU, .pos_offset = 0,
    .global_name = qwen2_global, .layer_name = qwen2_layer,
    .alt_from = "model.", .alt_to = "",
};
