/* A model's layer tensors packed into pinned host memory for weight
 * streaming (ft_cuda_host_weights_*): the "weights on the host tier"
 * placement, raw bf16 or compressed frames that the GPU decodes. */
#include "cuda_host.h"
#include "engine/graph.h"

#include <stdlib.h>
#include <string.h>

struct ft_cuda_host_weights {
    int n_layers;
    uint8_t *buf;                  /* pinned */
    uint64_t used;                 /* bytes of the encoded tensors */
    ft_cuda_wsrc (*src)[FT_CUDA_LAYER_TENSORS];
};

static size_t pad64(size_t n) { return (n + 63) & ~(size_t)63; }

/* The CPU engine's q8/q4 group for rows of `cols` (ft_wmat_group_for), or
 * the codec's default where none divides them. */
static uint32_t engine_group(int64_t cols)
{
    int g = ft_wmat_group_for((int)cols);
    return g ? (uint32_t)g : FT_DEFAULT_GROUP_SIZE;
}

ft_status ft_cuda_host_weights_create(const ft_model *m, const ft_cuda_host_weights_params *p,
                                      ft_cuda_host_weights **out)
{
    if (!m || !p || !out) return ft_set_error(FT_ERR_INVALID_ARG, "cuda host weights: NULL argument");
    if (p->codec != FT_CODEC_RAW && p->codec != FT_CODEC_Q8 && p->codec != FT_CODEC_Q4 &&
        p->codec != FT_CODEC_BYTEPLANE)
        return ft_set_error(FT_ERR_INVALID_ARG, "cuda host weights: codec %s (raw, q8, q4 or byteplane)",
                            ft_codec_name(p->codec));
    if (!ft_model_layers_loaded(m)) return ft_set_error(FT_ERR_INVALID_ARG, "cuda host weights: the model's layers are not loaded");
    if (ft_model_format_requested(m) != FT_WF_F32)
        return ft_set_error(FT_ERR_UNSUPPORTED, "cuda host weights: the model is kept as %s (an f32 model is "
                            "packed)", ft_wfmt_name(ft_model_format_requested(m)));
    ft_status st = ft_cuda_available(NULL, 0);   /* pinned memory needs a CUDA driver */
    if (st) return st;
    const ft_model_config *cfg = ft_model_get_config(m);
    ft_codec_params cp;
    ft_codec_default_params(&cp);
    cp.codec = p->codec;
    if (p->codec == FT_CODEC_Q8 || p->codec == FT_CODEC_Q4) {
        cp.group_size = p->group_size ? p->group_size : FT_DEFAULT_GROUP_SIZE;
        cp.group_dim = p->group_dim;
    }
    /* q8/q4 by default in the CPU engine's groups (ft_wmat_group_for: 64,
     * or 32 where 64 does not divide the rows), so q4 means the same
     * weights on either device and on every path to the GPU */
    const int auto_group = (p->codec == FT_CODEC_Q8 || p->codec == FT_CODEC_Q4) && !p->group_size &&
                           p->group_dim == -1;
    ft_cuda_host_weights *hw = calloc(1, sizeof *hw);
    if (!hw) return ft_set_error(FT_ERR_NOMEM, "cuda host weights: allocation");
    hw->n_layers = cfg->n_layers;
    hw->src = calloc((size_t)cfg->n_layers, sizeof *hw->src);
    ft_codec_ctx *cc = NULL;
    uint16_t *tmp = NULL;
    size_t tmp_cap = 0;
    if (!hw->src) { st = ft_set_error(FT_ERR_NOMEM, "cuda host weights: allocation"); goto fail; }
    if ((st = ft_codec_ctx_create(p->threads, &cc))) goto fail;

    /* Pass 1: worst-case bytes of every tensor (its frame bound). */
    size_t cap[LW_COUNT] = {0}, total = 0;
    int nd[LW_COUNT] = {0};
    int64_t shape[LW_COUNT][2];
    for (int s = 0; s < LW_COUNT; s++) {
        if (!ft_model_layer_has(m, s)) continue;
        nd[s] = ft_layer_shape(cfg, s, shape[s]);
        uint64_t n = nd[s] == 1 ? (uint64_t)shape[s][0] : (uint64_t)(shape[s][0] * shape[s][1]);
        if (nd[s] == 2 && auto_group) cp.group_size = engine_group(shape[s][1]);
        if (nd[s] == 1) cap[s] = (size_t)n * 4;
        else if (p->codec == FT_CODEC_RAW) cap[s] = (size_t)n * 2;
        else cap[s] = ft_encode_bound(&cp, p->codec == FT_CODEC_BYTEPLANE ? FT_BF16 : FT_F32, 2,
                                      (const int64_t *)shape[s]);
        if (!cap[s]) { st = ft_set_error(FT_ERR_INVALID_ARG, "cuda host weights: bad codec parameters"); goto fail; }
        total += pad64(cap[s]);
    }
    total *= (size_t)cfg->n_layers;
    if ((st = ft_cuda_host_alloc(total, (void **)&hw->buf))) goto fail;

    /* Pass 2: encode. */
    size_t pos = 0;
    for (int l = 0; l < cfg->n_layers; l++)
        for (int s = 0; s < LW_COUNT; s++) {
            if (!cap[s]) continue;
            const float *w = ft_layer_f32(ft_model_layer(m, l), s);
            uint64_t n = nd[s] == 1 ? (uint64_t)shape[s][0] : (uint64_t)(shape[s][0] * shape[s][1]);
            uint8_t *dst = hw->buf + pos;
            ft_cuda_wsrc *o = &hw->src[l][s];
            size_t bytes = 0;
            if (nd[s] == 1 || p->codec == FT_CODEC_RAW) {
                ft_dtype dt = nd[s] == 1 ? FT_F32 : FT_BF16;
                if ((st = ft_convert(dst, dt, w, FT_F32, (size_t)n))) goto fail;
                *o = (ft_cuda_wsrc){FT_CUDA_WSRC_RAW, dt, dst, (size_t)ft_dtype_nbytes(dt, n), 0, NULL};
            } else {
                ft_tensor t;
                if (p->codec == FT_CODEC_BYTEPLANE) {
                    /* lossless over the bf16 values the GPU computes with */
                    if (tmp_cap < n) {
                        free(tmp);
                        if (!(tmp = malloc((size_t)n * 2))) {
                            st = ft_set_error(FT_ERR_NOMEM, "cuda host weights: allocation");
                            goto fail;
                        }
                        tmp_cap = (size_t)n;
                    }
                    ft_convert(tmp, FT_BF16, w, FT_F32, (size_t)n);
                    st = ft_tensor_init(&t, FT_BF16, 2, shape[s], tmp);
                } else {
                    st = ft_tensor_init(&t, FT_F32, 2, shape[s], (void *)w);
                }
                if (auto_group) cp.group_size = engine_group(shape[s][1]);
                if (!st) st = ft_encode(cc, &cp, &t, dst, cap[s], &bytes);
                if (st) goto fail;
                *o = (ft_cuda_wsrc){FT_CUDA_WSRC_FRAME, FT_F32, dst, bytes, 1, NULL};
            }
            hw->used += o->bytes;
            pos += pad64(cap[s]);
        }
    free(tmp);
    ft_codec_ctx_free(cc);
    *out = hw;
    return FT_OK;
fail:
    free(tmp);
    ft_codec_ctx_free(cc);
    ft_cuda_host_weights_free(hw);
    return st;
}

void ft_cuda_host_weights_free(ft_cuda_host_weights *hw)
{
    if (!hw) return;
    ft_cuda_host_free(hw->buf);
    free(hw->src);
    free(hw);
}

uint64_t ft_cuda_host_weights_bytes(const ft_cuda_host_weights *hw) { return hw ? hw->used : 0; }

ft_status ft_cuda_host_weights_hook(void *user, int layer, ft_cuda_wsrc *src)
{
    ft_cuda_host_weights *hw = user;
    if (!hw || !src || layer < 0 || layer >= hw->n_layers)
        return ft_set_error(FT_ERR_INVALID_ARG, "cuda host weights: layer %d out of range", layer);
    memcpy(src, hw->src[layer], sizeof hw->src[layer]);
    return FT_OK;
}

/* The engine's hook fills a whole ft_layer_weights (the scheduler starts
 * from its resident and host views and points the streamed slots at its
 * buffers); each present tensor becomes a source: matrices as they are
 * computed on, vectors as f32 of the layer's shape. */
ft_status ft_cuda_layer_source_hook(void *source, int layer, ft_cuda_wsrc *src)
{
    ft_cuda_layer_source *ls = source;
    if (!ls || !ls->hook || !ls->model || !src)
        return ft_set_error(FT_ERR_INVALID_ARG, "cuda layer source: hook, user and model are required");
    const ft_model_config *cfg = ft_model_get_config(ls->model);
    if (layer < 0 || layer >= cfg->n_layers)
        return ft_set_error(FT_ERR_INVALID_ARG, "cuda layer source: layer %d out of range", layer);
    memset(&ls->w, 0, sizeof ls->w);
    ft_status st = ls->hook(ls->user, layer, &ls->w);
    if (st) return st;
    for (int s = 0; s < FT_LAYER_SLOTS && s < FT_CUDA_LAYER_TENSORS; s++) {
        ft_cuda_wsrc *o = &src[s];
        memset(o, 0, sizeof *o);
        if (ft_layer_slot_is_matrix(s)) {
            const ft_wmat *m = ft_layer_weights_mat(&ls->w, s);
            if (!m->data && !m->chunk) continue;   /* absent */
            o->kind = FT_CUDA_WSRC_WMAT;
            o->wmat = m;
            continue;
        }
        const float *v = *ft_layer_weights_vec(&ls->w, s);
        if (!v) continue;
        int64_t shape[2];
        if (ft_layer_shape(cfg, s, shape) != 1)
            return ft_set_error(FT_ERR_INTERNAL, "cuda layer source: slot %d is not a vector", s);
        *o = (ft_cuda_wsrc){FT_CUDA_WSRC_RAW, FT_F32, v, (size_t)shape[0] * sizeof(float), 1, NULL};
    }
    return FT_OK;
}
