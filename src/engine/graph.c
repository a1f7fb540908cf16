/* The model's computation, written once over a backend's operations
 * (graph.h): the CPU and CUDA contexts run exactly this. */
#include "engine_internal.h"

#include <stdio.h>

#define TRY(x) do { ft_status st_ = (x); if (st_) return st_; } while (0)

/* One transformer layer: attention block and feed-forward block, pre- or
 * post-norm (OPT's do_layer_norm_before; the RMSNorm families always
 * pre-norm), with gemma's sandwich norms around each block's output, q/k
 * norms before RoPE, and a mixture of experts in place of the FFN on a
 * sparse layer. */
static ft_status layer(const ft_backend_ops *o, void *b, const ft_model *m, const void *w, int l, int rows)
{
    const ft_model_config *cfg = &m->cfg;
    const ft_arch *a = m->arch;
    const int pre = a->norm == FT_NORM_RMS || cfg->do_layer_norm_before;

    ft_gbuf in = FT_GB_X;
    if (pre) {
        TRY(o->norm(b, FT_GB_XB, FT_GB_X, rows, w, LW_NORM1_W, LW_NORM1_B));
        in = FT_GB_XB;
    }
    TRY(o->linear(b, FT_GB_Q, in, rows, w, LW_Q, LW_QB));
    TRY(o->linear(b, FT_GB_K, in, rows, w, LW_K, LW_KB));
    TRY(o->linear(b, FT_GB_V, in, rows, w, LW_V, LW_VB));
    if (cfg->qk_norm) TRY(o->qk_norm(b, rows, w));
    if (a->pos == FT_POS_ROPE) TRY(o->rope(b, rows));
    TRY(o->attention(b, l, rows));
    TRY(o->linear(b, FT_GB_XB, FT_GB_ATT, rows, w, LW_O, LW_OB));
    if (cfg->sandwich_norm) TRY(o->norm(b, FT_GB_XB, FT_GB_XB, rows, w, LW_POST_ATTN_NORM, -1));
    TRY(o->add(b, FT_GB_X, FT_GB_XB, rows));
    if (!pre) TRY(o->norm(b, FT_GB_X, FT_GB_X, rows, w, LW_NORM1_W, LW_NORM1_B));

    in = FT_GB_X;
    if (pre) {
        TRY(o->norm(b, FT_GB_XB, FT_GB_X, rows, w, LW_NORM2_W, LW_NORM2_B));
        in = FT_GB_XB;
    }
    if (cfg->n_experts && cfg->layer_moe[l]) {
        TRY(o->moe(b, FT_GB_XB, in, rows, w));
    } else {
        if (a->ffn == FT_FFN_SWIGLU) {
            TRY(o->linear(b, FT_GB_H1, in, rows, w, LW_GATE, LW_GATE_B));
            TRY(o->linear(b, FT_GB_H2, in, rows, w, LW_UP, LW_UP_B));
        } else {
            TRY(o->linear(b, FT_GB_H1, in, rows, w, LW_UP, LW_UP_B));
        }
        TRY(o->ffn_act(b, rows));
        TRY(o->linear(b, FT_GB_XB, FT_GB_H1, rows, w, LW_DOWN, LW_DOWN_B));
    }
    if (cfg->sandwich_norm) TRY(o->norm(b, FT_GB_XB, FT_GB_XB, rows, w, LW_POST_FFN_NORM, -1));
    TRY(o->add(b, FT_GB_X, FT_GB_XB, rows));
    if (!pre) TRY(o->norm(b, FT_GB_X, FT_GB_X, rows, w, LW_NORM2_W, LW_NORM2_B));
    return FT_OK;
}

unsigned ft_model_features(const ft_model *m)
{
    const ft_model_config *c = &m->cfg;
    unsigned f = 0;
    if (c->qk_norm) f |= FT_FEAT_QK_NORM;
    if (c->norm_plus_one) f |= FT_FEAT_NORM_PLUS_ONE;
    if (c->sandwich_norm) f |= FT_FEAT_SANDWICH;
    if (c->act == FT_ACT_GELU_TANH) f |= FT_FEAT_GELU;
    if (c->embed_scale != 0) f |= FT_FEAT_EMBED_SCALE;
    if (c->attn_scale != 0) f |= FT_FEAT_ATTN_SCALE;
    if (c->attn_softcap != 0 || c->final_softcap != 0) f |= FT_FEAT_SOFTCAP;
    if (c->rope_local_theta != 0) f |= FT_FEAT_LOCAL_ROPE;
    if (c->n_experts) f |= FT_FEAT_MOE;
    return f;
}

const char *ft_model_features_name(unsigned f, char *buf, size_t n)
{
    static const char *const names[] = {"q/k norms", "(1 + w) RMSNorm", "sandwich norms", "GeGLU",
                                        "scaled embeddings", "query_pre_attn_scalar", "soft-capping",
                                        "local RoPE base", "mixture of experts"};
    size_t k = 0;
    if (n) buf[0] = 0;
    for (unsigned i = 0; i < sizeof names / sizeof names[0]; i++)
        if (f & (1u << i)) {
            int r = snprintf(buf + k, n > k ? n - k : 0, "%s%s", k ? ", " : "", names[i]);
            if (r > 0) k += (size_t)r;
            if (k >= n) break;
        }
    return buf;
}

ft_status ft_graph_forward(const ft_backend_ops *o, void *b, const ft_model *m, int rows, int n, int want,
                           int *nsel, int *failed_layer)
{
    return ft_graph_forward_layers(o, b, m, rows, n, 0, m->cfg.n_layers, want, nsel, failed_layer);
}

ft_status ft_graph_forward_layers(const ft_backend_ops *o, void *b, const ft_model *m, int rows, int n, int l0,
                                  int l1, int want, int *nsel, int *failed_layer)
{
    const ft_model_config *cfg = &m->cfg;
    *failed_layer = -1;
    *nsel = 0;
    if (l0 < 0 || l1 > cfg->n_layers || l0 > l1 || (want && l1 != cfg->n_layers))
        return ft_set_error(FT_ERR_INVALID_ARG, "forward: layers [%d, %d) of %d%s", l0, l1, cfg->n_layers,
                            want && l1 != cfg->n_layers ? " cannot give logits" : "");
    {
        unsigned f = ft_model_features(m);
        if (((f & FT_FEAT_QK_NORM) && !o->qk_norm) || ((f & FT_FEAT_EMBED_SCALE) && !o->scale) ||
            (cfg->final_softcap != 0 && !o->softcap) || ((f & FT_FEAT_MOE) && !o->moe)) {
            char nb[160];
            return ft_set_error(FT_ERR_UNSUPPORTED, "forward: this backend cannot compute %s (%s)",
                                cfg->model_type, ft_model_features_name(f, nb, sizeof nb));
        }
    }
    /* embeddings (+ project_in, + learned positions): the first stage's */
    if (l0 == 0) {
        int proj_in = ft_wmat_present(&m->g[GW_PROJ_IN]);
        TRY(o->embed(b, proj_in ? FT_GB_XB : FT_GB_X, rows));
        if (cfg->embed_scale != 0) TRY(o->scale(b, FT_GB_X, rows, cfg->embed_scale));
        if (proj_in) TRY(o->linear(b, FT_GB_X, FT_GB_XB, rows, NULL, GW_PROJ_IN, -1));
        if (m->arch->pos == FT_POS_LEARNED) TRY(o->add_positions(b, rows));
    }

    for (int l = l0; l < l1; l++) {
        const void *w = NULL;
        ft_status st = o->layer_begin(b, l, &w);
        if (!st) st = layer(o, b, m, w, l, rows);
        if (!st) st = o->layer_end(b, l);
        if (st) {
            *failed_layer = l;
            return st;
        }
    }
    if (!want) return FT_OK;

    /* final norm, project_out, LM head on the rows that want logits */
    ft_gbuf src = FT_GB_X;
    int k = rows;
    if (want == 1) {
        TRY(o->gather_last(b, FT_GB_SEL, FT_GB_X, n));
        src = FT_GB_SEL;
        k = n;
    }
    /* OPT's final LayerNorm exists with pre-norm (without affine weights
     * when layer_norm_elementwise_affine is false) */
    if (m->g[GW_FINAL_NORM_W].data || (cfg->arch == FT_ARCH_OPT && cfg->final_norm)) {
        TRY(o->norm(b, FT_GB_SEL2, src, k, NULL, GW_FINAL_NORM_W, GW_FINAL_NORM_B));
        src = FT_GB_SEL2;
    }
    if (ft_wmat_present(&m->g[GW_PROJ_OUT])) {
        ft_gbuf dst = src == FT_GB_SEL ? FT_GB_SEL2 : FT_GB_SEL;
        TRY(o->linear(b, dst, src, k, NULL, GW_PROJ_OUT, -1));
        src = dst;
    }
    TRY(o->linear(b, FT_GB_LOGITS, src, k, NULL, GW_LM_HEAD, -1));
    if (cfg->final_softcap != 0) TRY(o->softcap(b, FT_GB_LOGITS, k, cfg->final_softcap));
    *nsel = k;
    return FT_OK;
}

ft_status ft_graph_check_call(const ft_call_limits *lim, size_t n, const int *slots, const int32_t *const *tokens,
                              const size_t *ntok, int all_rows, size_t *rows_out)
{
    return ft_graph_check_call_ex(lim, n, slots, tokens, ntok, all_rows, 1, rows_out);
}

ft_status ft_graph_check_call_ex(const ft_call_limits *lim, size_t n, const int *slots, const int32_t *const *tokens,
                                 const size_t *ntok, int all_rows, int need_tokens, size_t *rows_out)
{
    if (!slots || (need_tokens && !tokens) || !ntok || n == 0)
        return ft_set_error(FT_ERR_INVALID_ARG, "forward: NULL argument or empty batch");
    if (n > (size_t)lim->max_batch)
        return ft_set_error(FT_ERR_INVALID_ARG, "forward: %zu sequences > max_batch %d", n, lim->max_batch);
    if (all_rows && !lim->all_logits)
        return ft_set_error(FT_ERR_INVALID_ARG, "forward: all-row logits need ctx all_logits");
    size_t rows = 0;
    for (size_t j = 0; j < n; j++) {
        int s = slots[j];
        if (s < 0 || s >= lim->max_batch)
            return ft_set_error(FT_ERR_INVALID_ARG, "forward: slot %d out of range", s);
        for (size_t i = 0; i < j; i++)
            if (slots[i] == s) return ft_set_error(FT_ERR_INVALID_ARG, "forward: slot %d twice", s);
        if (ntok[j] == 0 || (need_tokens && !tokens[j]))
            return ft_set_error(FT_ERR_INVALID_ARG, "forward: sequence %zu has no tokens", j);
        if ((size_t)lim->seq_len[s] + ntok[j] > (size_t)lim->max_seq)
            return ft_set_error(FT_ERR_NO_SPACE, "forward: sequence %zu: %d cached + %zu new tokens "
                                "exceed the context of %d", j, lim->seq_len[s], ntok[j], lim->max_seq);
        for (size_t i = 0; need_tokens && i < ntok[j]; i++)
            if (tokens[j][i] < 0 || tokens[j][i] >= lim->vocab)
                return ft_set_error(FT_ERR_INVALID_ARG, "forward: token id %d outside vocab of %d",
                                    (int)tokens[j][i], lim->vocab);
        rows += ntok[j];
        if (rows > (size_t)lim->max_rows)
            return ft_set_error(FT_ERR_INVALID_ARG, "forward: more than max_rows = %d new tokens", lim->max_rows);
    }
    *rows_out = rows;
    return FT_OK;
}
