/* Llama: RMSNorm, RoPE (HF rotate_half, rope_theta, Llama 3 scaling),
 * SwiGLU FFN, grouped-query attention, tied or untied lm_head, optional
 * attention/MLP biases. */
#include "engine_internal.h"

#include <stdio.h>

static int llama_global(const ft_model_config *c, int slot, char *b, size_t n)
{
    const char *s = NULL;
    switch (slot) {
    case GW_TOK_EMB: s = "model.embed_tokens.weight"; break;
    case GW_FINAL_NORM_W: s = "model.norm.weight"; break;
    case GW_LM_HEAD: if (!c->tie_word_embeddings) s = "lm_head.weight"; break;
    }
    if (!s) return 0;
    snprintf(b, n, "%s", s);
    return 1;
}

const char *ft_hf_attn_name(const ft_model_config *c, int slot)
{
    static const char *const names[LW_COUNT] = {
        [LW_NORM1_W] = "input_layernorm.weight",
        [LW_Q] = "self_attn.q_proj.weight", [LW_QB] = "self_attn.q_proj.bias",
        [LW_K] = "self_attn.k_proj.weight", [LW_KB] = "self_attn.k_proj.bias",
        [LW_V] = "self_attn.v_proj.weight", [LW_VB] = "self_attn.v_proj.bias",
        [LW_O] = "self_attn.o_proj.weight", [LW_OB] = "self_attn.o_proj.bias",
        [LW_QNORM] = "self_attn.q_norm.weight", [LW_KNORM] = "self_attn.k_norm.weight",
    };
    if (slot < 0 || slot >= LW_COUNT) return NULL;
    if ((slot == LW_QB || slot == LW_KB || slot == LW_VB || slot == LW_OB) && !c->attention_bias) return NULL;
    if ((slot == LW_QNORM || slot == LW_KNORM) && !c->qk_norm) return NULL;
    return names[slot];
}

int ft_hf_expert_name(const ft_model_config *c, int layer, int slot, const char *block,
                      const char *const ex[3], char *b, size_t n)
{
    if (!c->n_experts || !c->layer_moe[layer]) return 0;
    snprintf(b, n, "model.layers.%d.%s.experts.%d.%s.weight", layer, block, (slot - LW_COUNT) / 3,
             ex[(slot - LW_COUNT) % 3]);
    return 1;
}

static int llama_layer(const ft_model_config *c, int layer, int slot, char *b, size_t n)
{
    static const char *const names[LW_COUNT] = {
        [LW_NORM2_W] = "post_attention_layernorm.weight",
        [LW_GATE] = "mlp.gate_proj.weight", [LW_GATE_B] = "mlp.gate_proj.bias",
        [LW_UP] = "mlp.up_proj.weight", [LW_UP_B] = "mlp.up_proj.bias",
        [LW_DOWN] = "mlp.down_proj.weight", [LW_DOWN_B] = "mlp.down_proj.bias",
    };
    const char *s = ft_hf_attn_name(c, slot);
    if (!s && slot < LW_COUNT) s = names[slot];
    if (!s) return 0;
    if ((slot == LW_GATE_B || slot == LW_UP_B || slot == LW_DOWN_B) && !c->mlp_bias) return 0;
    snprintf(b, n, "model.layers.%d.%s", layer, s);
    return 1;
}

const ft_arch ft_arch_llama = {
    .id = FT_ARCH_LLAMA, .name = "llama",
    .norm = FT_NORM_RMS, .pos = FT_POS_ROPE, .ffn = FT_FFN_SWIGLU, .pos_offset = 0,
    .global_name = llama_global, .layer_name = llama_layer,
    .alt_from = "model.", .alt_to = "",
};
