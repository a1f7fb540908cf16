/* Gemma 2 and Gemma 3 (text): four norms per layer (input, after
 * attention, before and after the FFN: "sandwich"), RMSNorm weights as
 * (1 + w), GeGLU, scaled embeddings, a tied head; gemma3 adds per-head
 * q/k norms. The math flags are the config's (config.c, graph.c). */
#include "engine_internal.h"

#include <stdio.h>

static int gemma_layer(const ft_model_config *c, int layer, int slot, char *b, size_t n)
{
    static const char *const names[LW_COUNT] = {
        [LW_POST_ATTN_NORM] = "post_attention_layernorm.weight",
        [LW_NORM2_W] = "pre_feedforward_layernorm.weight",
        [LW_POST_FFN_NORM] = "post_feedforward_layernorm.weight",
        [LW_GATE] = "mlp.gate_proj.weight", [LW_UP] = "mlp.up_proj.weight",
        [LW_DOWN] = "mlp.down_proj.weight",
    };
    if (slot >= LW_COUNT) return 0;
    const char *s = ft_hf_attn_name(c, slot);
    if (!s) s = names[slot];
    if (!s) return 0;
    snprintf(b, n, "model.layers.%d.%s", layer, s);
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
