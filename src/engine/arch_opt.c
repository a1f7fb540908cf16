/* OPT (FlexGen's family): learned positions with offset 2, LayerNorm
 * before (or, OPT-350m, after) each block, ReLU FFN, biases, optional
 * project_in/out when word_embed_proj_dim != hidden_size, tied lm_head. */
#include "engine_internal.h"

#include <stdio.h>

static int opt_global(const ft_model_config *c, int slot, char *b, size_t n)
{
    const char *s = NULL;
    switch (slot) {
    case GW_TOK_EMB: s = "model.decoder.embed_tokens.weight"; break;
    case GW_POS_EMB: s = "model.decoder.embed_positions.weight"; break;
    case GW_PROJ_IN: if (c->word_embed_proj_dim != c->hidden) s = "model.decoder.project_in.weight"; break;
    case GW_PROJ_OUT: if (c->word_embed_proj_dim != c->hidden) s = "model.decoder.project_out.weight"; break;
    case GW_FINAL_NORM_W: if (c->final_norm && c->ln_affine) s = "model.decoder.final_layer_norm.weight"; break;
    case GW_FINAL_NORM_B: if (c->final_norm && c->ln_affine) s = "model.decoder.final_layer_norm.bias"; break;
    case GW_LM_HEAD: if (!c->tie_word_embeddings) s = "lm_head.weight"; break;
    }
    if (!s) return 0;
    snprintf(b, n, "%s", s);
    return 1;
}

static int opt_layer(const ft_model_config *c, int layer, int slot, char *b, size_t n)
{
    static const char *const names[LW_COUNT] = {
        [LW_NORM1_W] = "self_attn_layer_norm.weight", [LW_NORM1_B] = "self_attn_layer_norm.bias",
        [LW_Q] = "self_attn.q_proj.weight", [LW_QB] = "self_attn.q_proj.bias",
        [LW_K] = "self_attn.k_proj.weight", [LW_KB] = "self_attn.k_proj.bias",
        [LW_V] = "self_attn.v_proj.weight", [LW_VB] = "self_attn.v_proj.bias",
        [LW_O] = "self_attn.out_proj.weight", [LW_OB] = "self_attn.out_proj.bias",
        [LW_NORM2_W] = "final_layer_norm.weight", [LW_NORM2_B] = "final_layer_norm.bias",
        [LW_UP] = "fc1.weight", [LW_UP_B] = "fc1.bias",
        [LW_DOWN] = "fc2.weight", [LW_DOWN_B] = "fc2.bias",
    };
    const char *s = names[slot];
    if (!s) return 0;
    int is_norm = slot == LW_NORM1_W || slot == LW_NORM1_B || slot == LW_NORM2_W || slot == LW_NORM2_B;
    int is_bias = slot == LW_QB || slot == LW_KB || slot == LW_VB || slot == LW_OB ||
                  slot == LW_UP_B || slot == LW_DOWN_B;
    if (is_norm && !c->ln_affine) return 0;
    if (is_bias && !c->enable_bias) return 0;
    snprintf(b, n, "model.decoder.layers.%d.%s", layer, s);
    return 1;
}

const ft_arch ft_arch_opt = {
    .id = FT_ARCH_OPT, .name = "opt",
    .norm = FT_NORM_LAYER, .pos = FT_POS_LEARNED, .ffn = FT_FFN_RELU, .pos_offset = 2,
    .global_name = opt_global, .layer_name = opt_layer,
    .alt_from = "model.decoder.", .alt_to = "decoder.",
};
