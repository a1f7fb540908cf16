/* The CUDA compute context: ft_ctx's forward pass (src/engine/forward.c)
 * on one GPU.
 *
 * Same shape as the CPU engine: all new tokens of all sequences of a call
 * are stacked into one `rows x hidden` matrix, every linear layer is one
 * cuBLAS GEMM over it (bf16 weights x bf16 activations, f32 accumulation
 * and output; or all f32), attention runs per (row, head) against that
 * row's sequence's cache, and the pass is layer-major. Activations stay in
 * f32 in device memory; only GEMM inputs are rounded to bf16.
 *
 * Streams: compute (`cs`, cuBLAS runs on it) and load (`ls`). With
 * streamed weights the layers live in two device slots; layer i+1's
 * copy and GPU decode are enqueued on `ls` before layer i's compute is
 * enqueued on `cs`:
 *
 *   ls: wait ev_free[(i+1)%2]; copy + decode layer i+1; record ev_loaded[(i+1)%2]
 *   cs: wait ev_loaded[i%2]; compute layer i; record ev_free[i%2]
 *
 * so the copy of layer i+1 overlaps the compute of layer i, and a slot is
 * rewritten only after the layer that used it has finished (FlexGen's
 * double buffering, one layer ahead). The host runs ahead of the GPU; it
 * waits only at the end of the call (logits) or when the decoder's pinned
 * staging is still being copied from (byteplane and CPU-decoded frames). */
#include "cuda_host.h"
#include "cuda_prep.h"
#include "engine/graph.h"

#include <cublas_v2.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define ALIGN 256u
#define UPLOAD_CHUNK ((uint64_t)16 << 20)         /* f32 values per upload step */
#define BLAS_WORKSPACE ((size_t)32 << 20)

struct ft_cuda_ctx {
    const ft_model *m;
    ft_cuda_ctx_params p;
    int H, E, F, V, qdim, kvdim, edim, hd;
    ft_dtype wdt;                  /* matrices: FT_BF16 or FT_F32 */
    cudaStream_t cs, ls;
    cublasHandle_t blas;
    void *blas_ws;
    /* model-wide tensors (device); lm_head may alias tok_emb */
    void *g[GW_COUNT];
    ft_dtype gdt[GW_COUNT];
    void *gbuf;
    /* layer tensors: resident: n_layers blocks; streamed: 2 slots */
    uint8_t *lbuf;
    size_t lbytes;                 /* bytes of one block */
    size_t loff[LW_COUNT];         /* SIZE_MAX: the architecture has no such tensor */
    ft_dtype ldt[LW_COUNT];
    uint64_t lnumel[LW_COUNT];
    int lndim[LW_COUNT];
    int64_t lshape[LW_COUNT][2];
    ft_cuda_dec_ws dec;
    cudaEvent_t ev_loaded[2], ev_free[2];
    cudaEvent_t *stall0, *stall1;  /* per layer, on the compute stream: the end of
                                      the layer before (or the call's start) and
                                      the end of the wait for this layer's
                                      weights, so the gap holds every idle moment
                                      between layers (timing) */
    cudaEvent_t *copy0, *copy1;    /* per layer, on the load stream around its
                                      copies and decode (timing) */
    /* KV cache and per-slot lengths */
    float *kv;
    int *seq_len;
    /* activations */
    float *x, *xb, *q, *k, *v, *att, *h1, *h2, *sel, *sel2, *logits;
    void *xin;                     /* GEMM input in bf16 */
    float *rope_cos, *rope_sin;
    int32_t *d_tokens, *d_next;
    int *d_row_slot, *d_row_pos, *d_sel;
    /* pinned host mirrors of the per-call arrays */
    int32_t *h_tokens, *h_next;
    int *h_row_slot, *h_row_pos, *h_sel;
    uint64_t weight_bytes, kv_bytes, scratch_bytes;
    uint64_t h2d_weight_bytes, layers_streamed;
    double hook_s, stall_s, copy_s, forward_s;
    /* the forward call in progress (graph ops) */
    int call_n;
    int pos_offset, swiglu;        /* the architecture's blocks */
    struct { const void *t[LW_COUNT]; } cur;   /* the current layer's device tensors (a dev_layer) */
};

static ft_status blas_status(cublasStatus_t s, const char *what)
{
    if (s == CUBLAS_STATUS_SUCCESS) return FT_OK;
    return ft_set_error(s == CUBLAS_STATUS_ALLOC_FAILED ? FT_ERR_NOMEM : FT_ERR_INTERNAL, "%s: %s: %s",
                        what, cublasGetStatusName(s), cublasGetStatusString(s));
}

static size_t align_up(size_t n) { return (n + ALIGN - 1) & ~(size_t)(ALIGN - 1); }

/* cudaMalloc that records what it allocated. */
static ft_status dalloc(ft_cuda_ctx *c, void **p, size_t bytes, uint64_t *acct, const char *what)
{
    FT_CU(cudaMalloc(p, bytes ? bytes : 1), what);
    if (acct) *acct += bytes;
    return FT_OK;
}

/* Upload n f32 values from the model (pageable host memory) to dst as dt,
 * in steps through the decoder's device staging. */
static ft_status upload(ft_cuda_ctx *c, void *dst, ft_dtype dt, const void *src, ft_dtype src_dt, uint64_t n)
{
    size_t es = ft_dtype_bits(dt) / 8, ses = ft_dtype_bits(src_dt) / 8;
    for (uint64_t i = 0; i < n; i += UPLOAD_CHUNK) {
        uint64_t k = n - i < UPLOAD_CHUNK ? n - i : UPLOAD_CHUNK;
        ft_status st = ft_cuda_dec_raw_async(&c->dec, (const uint8_t *)src + i * ses, src_dt, k, dt,
                                             (uint8_t *)dst + i * es, c->cs, NULL);
        if (st) return st;
    }
    return FT_OK;
}

static ft_status upload_f32(ft_cuda_ctx *c, void *dst, ft_dtype dt, const float *src, uint64_t n)
{
    return upload(c, dst, dt, src, FT_F32, n);
}

/* A model-wide tensor as the model keeps it: f32, or a bf16/f16 matrix
 * (embeddings and LM head of a model kept as stored or quantized). */
static ft_status upload_global(ft_cuda_ctx *c, void *dst, ft_dtype dt, const ft_wmat *w, uint64_t n)
{
    switch (w->fmt) {
    case FT_WF_F32: return upload(c, dst, dt, w->data, FT_F32, n);
    case FT_WF_BF16: return upload(c, dst, dt, w->data, FT_BF16, n);
    case FT_WF_F16: return upload(c, dst, dt, w->data, FT_F16, n);
    default:
        return ft_set_error(FT_ERR_UNSUPPORTED, "cuda ctx: a model-wide %s tensor (embeddings and the LM head are "
                            "kept in f32, bf16 or f16)", ft_wfmt_name(w->fmt));
    }
}

static uint64_t numel2(int ndim, const int64_t *s) { return ndim == 1 ? (uint64_t)s[0] : (uint64_t)(s[0] * s[1]); }

ft_status ft_cuda_ctx_create(const ft_model *m, const ft_cuda_ctx_params *p, ft_cuda_ctx **out)
{
    if (!m || !p || !out) return ft_set_error(FT_ERR_INVALID_ARG, "cuda ctx: NULL argument");
    const ft_model_config *cfg = ft_model_get_config(m);
    if (p->max_batch < 1 || p->max_batch > 65536 || p->max_seq < 1)
        return ft_set_error(FT_ERR_INVALID_ARG, "cuda ctx: max_batch %d / max_seq %d out of range",
                            p->max_batch, p->max_seq);
    if (p->max_seq > cfg->max_pos)
        return ft_set_error(FT_ERR_INVALID_ARG, "cuda ctx: context of %d tokens exceeds the model's "
                            "max_position_embeddings = %d", p->max_seq, cfg->max_pos);
    if (ft_model_streamed(m))
        return ft_set_error(FT_ERR_UNSUPPORTED, "cuda ctx: the model's embeddings or LM head are streamed from "
                            "the checkpoint (a memory budget too small to hold them), which the CUDA backend "
                            "does not implement: load them in memory (a larger --memory)");
    /* what the backend lacks first (names every missing operation), then
     * the window past which it would compute wrongly */
    if (ft_model_features(m)) {
        char fb[192];
        return ft_set_error(FT_ERR_UNSUPPORTED, "cuda ctx: %s needs %s, which the CUDA backend does not "
                            "implement yet (the CPU engine has it)", cfg->model_type,
                            ft_model_features_name(ft_model_features(m), fb, sizeof fb));
    }
    if (ft_config_min_window(cfg) > 0 && p->max_seq > ft_config_min_window(cfg))
        return ft_set_error(FT_ERR_INVALID_ARG, "cuda ctx: context of %d tokens exceeds the model's "
                            "sliding_window = %d (windowed attention is not implemented on CUDA; "
                            "the CPU engine has it)", p->max_seq, ft_config_min_window(cfg));
    if (p->stream_weights && !p->hook)
        return ft_set_error(FT_ERR_INVALID_ARG, "cuda ctx: stream_weights needs a weight hook");
    if (!p->stream_weights && !ft_model_layers_loaded(m))
        return ft_set_error(FT_ERR_INVALID_ARG, "cuda ctx: the model's layers are not loaded "
                            "(external layers need stream_weights and a weight hook)");
    /* resident layers are packed from an f32 model; streamed ones come in
     * whatever format the hook gives (and model-wide tensors as kept) */
    if (!p->stream_weights && ft_model_format_requested(m) != FT_WF_F32)
        return ft_set_error(FT_ERR_UNSUPPORTED, "cuda ctx: the model is kept as %s; the CUDA backend packs "
                            "resident weights from an f32 model (load it with weights f32)",
                            ft_wfmt_name(ft_model_format_requested(m)));
    ft_status st = ft_cuda_require(p->device);
    if (st) return st;

    ft_cuda_ctx *c = calloc(1, sizeof *c);
    if (!c) return ft_set_error(FT_ERR_NOMEM, "cuda ctx: allocation");
    c->m = m;
    c->p = *p;
    if (c->p.max_rows <= 0) {
        int64_t r = (int64_t)p->max_batch * p->max_seq;
        c->p.max_rows = r > (1 << 24) ? (1 << 24) : (int)r;
    }
    c->H = cfg->hidden;
    c->E = cfg->word_embed_proj_dim;
    c->F = cfg->ffn;
    c->V = cfg->vocab;
    c->hd = cfg->head_dim;
    c->qdim = cfg->n_heads * cfg->head_dim;
    c->kvdim = cfg->n_kv_heads * cfg->head_dim;
    c->edim = c->H > c->E ? c->H : c->E;
    c->wdt = p->f32_weights ? FT_F32 : FT_BF16;
    const size_t R = (size_t)c->p.max_rows, B = (size_t)p->max_batch, S = (size_t)p->max_seq;
    const size_t selrows = p->all_logits ? R : B;
    ft_model_blocks blk;
    ft_model_get_blocks(m, &blk);
    c->pos_offset = blk.pos_offset;
    c->swiglu = blk.ffn == FT_FFN_SWIGLU;

    if ((st = ft_cuda_dec_ws_init(&c->dec))) goto fail;
    if ((st = ft_cuda_status(cudaStreamCreateWithFlags(&c->cs, cudaStreamNonBlocking), "cudaStreamCreate")) ||
        (st = ft_cuda_status(cudaStreamCreateWithFlags(&c->ls, cudaStreamNonBlocking), "cudaStreamCreate")))
        goto fail;
    for (int i = 0; i < 2; i++)
        if ((st = ft_cuda_status(cudaEventCreateWithFlags(&c->ev_loaded[i], cudaEventDisableTiming), "cudaEventCreate")) ||
            (st = ft_cuda_status(cudaEventCreateWithFlags(&c->ev_free[i], cudaEventDisableTiming), "cudaEventCreate")))
            goto fail;
    if (p->stream_weights) {
        c->stall0 = calloc((size_t)cfg->n_layers, sizeof(cudaEvent_t));
        c->stall1 = calloc((size_t)cfg->n_layers, sizeof(cudaEvent_t));
        c->copy0 = calloc((size_t)cfg->n_layers, sizeof(cudaEvent_t));
        c->copy1 = calloc((size_t)cfg->n_layers, sizeof(cudaEvent_t));
        if (!c->stall0 || !c->stall1 || !c->copy0 || !c->copy1) {
            st = ft_set_error(FT_ERR_NOMEM, "cuda ctx: allocation");
            goto fail;
        }
        for (int l = 0; l < cfg->n_layers; l++)
            if ((st = ft_cuda_status(cudaEventCreateWithFlags(&c->stall0[l], cudaEventDefault), "cudaEventCreate")) ||
                (st = ft_cuda_status(cudaEventCreateWithFlags(&c->stall1[l], cudaEventDefault), "cudaEventCreate")) ||
                (st = ft_cuda_status(cudaEventCreateWithFlags(&c->copy0[l], cudaEventDefault), "cudaEventCreate")) ||
                (st = ft_cuda_status(cudaEventCreateWithFlags(&c->copy1[l], cudaEventDefault), "cudaEventCreate")))
                goto fail;
    }
    if ((st = blas_status(cublasCreate(&c->blas), "cublasCreate")) ||
        (st = blas_status(cublasSetStream(c->blas, c->cs), "cublasSetStream")) ||
        (st = blas_status(cublasSetMathMode(c->blas, CUBLAS_DEFAULT_MATH), "cublasSetMathMode")) ||
        (st = dalloc(c, &c->blas_ws, BLAS_WORKSPACE, &c->scratch_bytes, "cuBLAS workspace (cudaMalloc)")) ||
        (st = blas_status(cublasSetWorkspace(c->blas, c->blas_ws, BLAS_WORKSPACE), "cublasSetWorkspace")))
        goto fail;

    /* model-wide tensors: matrices in the weight dtype, vectors in f32 */
    {
        size_t off[GW_COUNT], total = 0;
        for (int s = 0; s < GW_COUNT; s++) {
            off[s] = SIZE_MAX;
            if (!ft_model_global(m, s)->data || (s == GW_LM_HEAD && ft_model_global(m, s)->data == ft_model_global(m, GW_TOK_EMB)->data)) continue;
            int64_t shp[2];
            int nd = ft_model_global_shape(m, s, shp);
            c->gdt[s] = nd == 2 ? c->wdt : FT_F32;
            off[s] = total;
            total += align_up((size_t)ft_dtype_nbytes(c->gdt[s], numel2(nd, shp)));
        }
        if ((st = dalloc(c, &c->gbuf, total, &c->weight_bytes, "model-wide weights (cudaMalloc)"))) goto fail;
        for (int s = 0; s < GW_COUNT; s++) {
            if (off[s] == SIZE_MAX) continue;
            int64_t shp[2];
            int nd = ft_model_global_shape(m, s, shp);
            c->g[s] = (uint8_t *)c->gbuf + off[s];
            if ((st = upload_global(c, c->g[s], c->gdt[s], ft_model_global(m, s), numel2(nd, shp)))) goto fail;
        }
        if (ft_model_global(m, GW_LM_HEAD)->data && ft_model_global(m, GW_LM_HEAD)->data == ft_model_global(m, GW_TOK_EMB)->data) {
            c->g[GW_LM_HEAD] = c->g[GW_TOK_EMB];
            c->gdt[GW_LM_HEAD] = c->gdt[GW_TOK_EMB];
        }
    }

    /* layer block layout */
    c->lbytes = 0;
    for (int s = 0; s < LW_COUNT; s++) {
        c->loff[s] = SIZE_MAX;
        if (!ft_model_layer_has(m, s)) continue;
        c->lndim[s] = ft_layer_shape(cfg, s, c->lshape[s]);
        c->lnumel[s] = numel2(c->lndim[s], c->lshape[s]);
        c->ldt[s] = c->lndim[s] == 2 ? c->wdt : FT_F32;
        c->loff[s] = c->lbytes;
        c->lbytes += align_up((size_t)ft_dtype_nbytes(c->ldt[s], c->lnumel[s]));
    }
    {
        size_t blocks = p->stream_weights ? 2 : (size_t)cfg->n_layers;
        if ((st = dalloc(c, (void **)&c->lbuf, c->lbytes * blocks, &c->weight_bytes, "layer weights (cudaMalloc)")))
            goto fail;
        if (!p->stream_weights)
            for (int l = 0; l < cfg->n_layers; l++)
                for (int s = 0; s < LW_COUNT; s++) {
                    if (c->loff[s] == SIZE_MAX) continue;
                    const float *src = ft_layer_f32(ft_model_layer(m, l), s);
                    if (!src) {
                        st = ft_set_error(FT_ERR_INVALID_ARG, "cuda ctx: layer %d tensor %d is not loaded", l, s);
                        goto fail;
                    }
                    if ((st = upload_f32(c, c->lbuf + (size_t)l * c->lbytes + c->loff[s], c->ldt[s], src,
                                         c->lnumel[s])))
                        goto fail;
                }
    }
    /* The upload staging is not needed any more: start streaming with an
     * empty decoder (it grows to the largest frame). */
    if ((st = ft_cuda_status(cudaStreamSynchronize(c->cs), "weight upload"))) goto fail;
    ft_cuda_dec_ws_release(&c->dec);
    if ((st = ft_cuda_dec_ws_init(&c->dec))) goto fail;
    /* streamed q8/q4 layers: copies and decode kernels overlap */
    if (c->p.stream_weights && (st = ft_cuda_dec_pipeline(&c->dec))) goto fail;

    /* KV cache */
    c->kv_bytes = (uint64_t)cfg->n_layers * 2 * B * S * (uint64_t)c->kvdim * sizeof(float);
    if ((st = dalloc(c, (void **)&c->kv, (size_t)c->kv_bytes, NULL, "KV cache (cudaMalloc)"))) goto fail;
    c->seq_len = calloc(B, sizeof(int));
    if (!c->seq_len) { st = ft_set_error(FT_ERR_NOMEM, "cuda ctx: allocation"); goto fail; }

    /* activations */
    {
        size_t gin = (size_t)c->edim;
        if ((size_t)c->qdim > gin) gin = (size_t)c->qdim;
        if ((size_t)c->F > gin) gin = (size_t)c->F;
        struct { void **p; size_t bytes; } bufs[] = {
            {(void **)&c->x, R * c->edim * 4}, {(void **)&c->xb, R * c->edim * 4},
            {(void **)&c->q, R * c->qdim * 4}, {(void **)&c->k, R * c->kvdim * 4},
            {(void **)&c->v, R * c->kvdim * 4}, {(void **)&c->att, R * c->qdim * 4},
            {(void **)&c->h1, R * c->F * 4}, {(void **)&c->h2, R * c->F * 4},
            {(void **)&c->sel, selrows * c->edim * 4}, {(void **)&c->sel2, selrows * c->edim * 4},
            {(void **)&c->logits, selrows * c->V * 4}, {&c->xin, R * gin * 2},
            {(void **)&c->d_tokens, R * 4}, {(void **)&c->d_row_slot, R * 4},
            {(void **)&c->d_row_pos, R * 4}, {(void **)&c->d_sel, B * 4}, {(void **)&c->d_next, B * 4},
        };
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
            if ((st = dalloc(c, bufs[i].p, bufs[i].bytes, &c->scratch_bytes, "activations (cudaMalloc)"))) goto fail;
        struct { void **p; size_t bytes; } hbufs[] = {
            {(void **)&c->h_tokens, R * 4}, {(void **)&c->h_row_slot, R * 4},
            {(void **)&c->h_row_pos, R * 4}, {(void **)&c->h_sel, B * 4}, {(void **)&c->h_next, B * 4},
        };
        for (size_t i = 0; i < sizeof hbufs / sizeof hbufs[0]; i++)
            if ((st = ft_cuda_status(cudaHostAlloc(hbufs[i].p, hbufs[i].bytes, cudaHostAllocDefault),
                                     "cudaHostAlloc (per-call arrays)")))
                goto fail;
    }
    if (blk.pos == FT_POS_ROPE) {
        int half = cfg->head_dim / 2;
        float *hc = malloc(S * (size_t)half * sizeof(float)), *hs = malloc(S * (size_t)half * sizeof(float));
        if (!hc || !hs) {
            free(hc);
            free(hs);
            st = ft_set_error(FT_ERR_NOMEM, "cuda ctx: RoPE tables");
            goto fail;
        }
        ft_rope_tables(cfg, S, hc, hs);
        size_t tb = S * (size_t)half * sizeof(float);
        st = dalloc(c, (void **)&c->rope_cos, tb, &c->scratch_bytes, "RoPE tables (cudaMalloc)");
        if (!st) st = dalloc(c, (void **)&c->rope_sin, tb, &c->scratch_bytes, "RoPE tables (cudaMalloc)");
        if (!st) st = ft_cuda_copy_to_device(c->rope_cos, hc, tb);
        if (!st) st = ft_cuda_copy_to_device(c->rope_sin, hs, tb);
        free(hc);
        free(hs);
        if (st) goto fail;
    }
    *out = c;
    return FT_OK;
fail:
    if (st == FT_ERR_NOMEM) {
        char why[512];
        snprintf(why, sizeof why, "%s", ft_last_error());
        st = ft_set_error(FT_ERR_NOMEM, "%s (weights %.1f MiB, KV cache %.1f MiB, activations %.1f MiB)",
                          why, (double)c->weight_bytes / 1048576.0, (double)c->kv_bytes / 1048576.0,
                          (double)c->scratch_bytes / 1048576.0);
    }
    ft_cuda_ctx_free(c);
    return st;
}

void ft_cuda_ctx_free(ft_cuda_ctx *c)
{
    if (!c) return;
    (void)cudaSetDevice(c->p.device);
    if (c->ls) (void)cudaStreamSynchronize(c->ls);
    if (c->cs) (void)cudaStreamSynchronize(c->cs);
    ft_cuda_dec_ws_release(&c->dec);
    if (c->blas) cublasDestroy(c->blas);
    void *dev[] = {c->blas_ws, c->gbuf, c->lbuf, c->kv, c->x, c->xb, c->q, c->k, c->v, c->att, c->h1, c->h2,
                   c->sel, c->sel2, c->logits, c->xin, c->rope_cos, c->rope_sin, c->d_tokens, c->d_next,
                   c->d_row_slot, c->d_row_pos, c->d_sel};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        if (dev[i]) (void)cudaFree(dev[i]);
    void *host[] = {c->h_tokens, c->h_next, c->h_row_slot, c->h_row_pos, c->h_sel};
    for (size_t i = 0; i < sizeof host / sizeof host[0]; i++)
        if (host[i]) (void)cudaFreeHost(host[i]);
    for (int i = 0; i < 2; i++) {
        if (c->ev_loaded[i]) (void)cudaEventDestroy(c->ev_loaded[i]);
        if (c->ev_free[i]) (void)cudaEventDestroy(c->ev_free[i]);
    }
    for (int l = 0; l < ft_model_get_config(c->m)->n_layers; l++) {
        if (c->stall0 && c->stall0[l]) (void)cudaEventDestroy(c->stall0[l]);
        if (c->stall1 && c->stall1[l]) (void)cudaEventDestroy(c->stall1[l]);
        if (c->copy0 && c->copy0[l]) (void)cudaEventDestroy(c->copy0[l]);
        if (c->copy1 && c->copy1[l]) (void)cudaEventDestroy(c->copy1[l]);
    }
    free(c->stall0);
    free(c->stall1);
    free(c->copy0);
    free(c->copy1);
    if (c->cs) (void)cudaStreamDestroy(c->cs);
    if (c->ls) (void)cudaStreamDestroy(c->ls);
    free(c->seq_len);
    free(c);
}

void ft_cuda_ctx_reset(ft_cuda_ctx *c, int slot)
{
    if (c && slot >= 0 && slot < c->p.max_batch) c->seq_len[slot] = 0;
}

int ft_cuda_ctx_seq_len(const ft_cuda_ctx *c, int slot)
{
    return (c && slot >= 0 && slot < c->p.max_batch) ? c->seq_len[slot] : 0;
}

/* [layer][k|v][slot][max_seq][kvdim] */
static float *kv_layer(const ft_cuda_ctx *c, int layer, int which)
{
    size_t S = (size_t)c->p.max_seq, B = (size_t)c->p.max_batch;
    return c->kv + (((size_t)layer * 2 + (size_t)which) * B) * S * (size_t)c->kvdim;
}

ft_status ft_cuda_ctx_kv(ft_cuda_ctx *c, int layer, int slot, float *k, float *v, int *len, int *kv_dim)
{
    if (!c || layer < 0 || layer >= ft_model_get_config(c->m)->n_layers || slot < 0 || slot >= c->p.max_batch)
        return ft_set_error(FT_ERR_INVALID_ARG, "cuda ctx: layer %d / slot %d out of range", layer, slot);
    FT_CU(cudaSetDevice(c->p.device), "cudaSetDevice");
    size_t bytes = (size_t)c->seq_len[slot] * (size_t)c->kvdim * sizeof(float);
    size_t off = (size_t)slot * (size_t)c->p.max_seq * (size_t)c->kvdim;
    if (k && bytes) FT_CU(cudaMemcpy(k, kv_layer(c, layer, 0) + off, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy (KV)");
    if (v && bytes) FT_CU(cudaMemcpy(v, kv_layer(c, layer, 1) + off, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy (KV)");
    if (len) *len = c->seq_len[slot];
    if (kv_dim) *kv_dim = c->kvdim;
    return FT_OK;
}

void ft_cuda_ctx_get_stats(const ft_cuda_ctx *c, ft_cuda_stats *out)
{
    if (!out) return;
    memset(out, 0, sizeof *out);
    if (!c) return;
    out->weight_bytes = c->p.stream_weights ? c->weight_bytes - 2 * (uint64_t)c->lbytes : c->weight_bytes;
    out->slot_bytes = c->p.stream_weights ? 2 * (uint64_t)c->lbytes : 0;
    out->kv_bytes = c->kv_bytes;
    out->scratch_bytes = c->scratch_bytes;
    out->h2d_weight_bytes = c->h2d_weight_bytes;
    out->layers_streamed = c->layers_streamed;
    out->hook_s = c->hook_s;
    out->stall_s = c->stall_s;
    out->copy_s = c->copy_s;
    out->forward_s = c->forward_s;
}

/* ------------------------------------------------------------ the pass */

/* Device pointers of one layer's tensors (NULL where absent). */
typedef struct { const void *t[LW_COUNT]; } dev_layer;

static void layer_ptrs(const ft_cuda_ctx *c, const uint8_t *block, dev_layer *w)
{
    for (int s = 0; s < LW_COUNT; s++) w->t[s] = c->loff[s] == SIZE_MAX ? NULL : block + c->loff[s];
}

/* The GEMM input: x itself (f32 weights) or x rounded to bf16 in xin. */
static ft_status gemm_input(ft_cuda_ctx *c, const float *x, uint64_t n, const void **out)
{
    if (c->wdt == FT_F32) { *out = x; return FT_OK; }
    FT_CU(ftk_convert(c->xin, FT_BF16, x, FT_F32, n, c->cs), "convert kernel (GEMM input)");
    *out = c->xin;
    return FT_OK;
}

/* y[rows, out] = x[rows, in] W[out, in]^T (+ b), through the column-major
 * mapping of ft_cuda_gemm_dims_for (cuda_prep.h; checked against cblas by
 * the host test). */
static ft_status gemm(ft_cuda_ctx *c, float *y, const void *x, int rows, int in, const void *W, int out,
                      const float *b)
{
    const float alpha = 1.0f, beta = 0.0f;
    cudaDataType t = c->wdt == FT_BF16 ? CUDA_R_16BF : CUDA_R_32F;
    ft_cuda_gemm_dims d;
    ft_cuda_gemm_dims_for(rows, in, out, &d);
    ft_status st = blas_status(cublasGemmEx(c->blas, d.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                                            d.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, d.m, d.n, d.k, &alpha, W, t,
                                            d.lda, x, t, d.ldb, &beta, y, CUDA_R_32F, d.ldc, CUBLAS_COMPUTE_32F,
                                            CUBLAS_GEMM_DEFAULT),
                               "cublasGemmEx");
    if (st) return st;
    if (b) FT_CU(ftk_add_bias(y, b, rows, out, c->cs), "bias kernel");
    return FT_OK;
}

static ft_status norm(ft_cuda_ctx *c, float *out, const float *in, int rows, const void *w, const void *b)
{
    const ft_model_config *cfg = ft_model_get_config(c->m);
    ft_model_blocks blk;
    ft_model_get_blocks(c->m, &blk);
    if (blk.norm == FT_NORM_RMS)
        FT_CU(ftk_rmsnorm(out, in, w, rows, c->H, cfg->norm_eps, c->cs), "RMSNorm kernel");
    else
        FT_CU(ftk_layernorm(out, in, w, b, rows, c->H, cfg->norm_eps, c->cs), "LayerNorm kernel");
    return FT_OK;
}

_Static_assert(FT_CUDA_LAYER_TENSORS == LW_COUNT, "the weight hook fills one source per layer slot");

#define TRY(x) do { ft_status st_ = (x); if (st_) return st_; } while (0)

/* Enqueue layer `l`'s weights into slot l % 2 on the load stream. */
static ft_status load_layer(ft_cuda_ctx *c, int l)
{
    const int slot = l & 1;
    ft_cuda_wsrc src[FT_CUDA_LAYER_TENSORS];
    memset(src, 0, sizeof src);
    double t0 = ft_now();
    /* the previous layer's copies are done before the hook may reuse its
     * host buffers (ft_cuda_weight_hook's contract); that layer computes
     * next, so they normally are */
    if (l > 0) FT_CU(cudaEventSynchronize(c->ev_loaded[(l - 1) & 1]), "cudaEventSynchronize (weights)");
    ft_status st = c->p.hook(c->p.hook_user, l, src);
    if (st) return st;
    FT_CU(cudaStreamWaitEvent(c->ls, c->ev_free[slot], 0), "cudaStreamWaitEvent");
    FT_CU(cudaEventRecord(c->copy0[l], c->ls), "cudaEventRecord");
    uint8_t *block = c->lbuf + (size_t)slot * c->lbytes;
    for (int s = 0; s < LW_COUNT; s++) {
        const ft_cuda_wsrc *w = &src[s];
        if (c->loff[s] == SIZE_MAX) {
            if (w->kind != FT_CUDA_WSRC_ABSENT)
                return ft_set_error(FT_ERR_INVALID_ARG, "weight hook: layer %d tensor %d does not exist in "
                                    "this model", l, s);
            continue;
        }
        void *dst = block + c->loff[s];
        if (w->kind == FT_CUDA_WSRC_RAW) {
            if (!w->data || w->bytes != ft_dtype_nbytes(w->dtype, c->lnumel[s]) || !ft_dtype_is_float(w->dtype))
                return ft_set_error(FT_ERR_INVALID_ARG, "weight hook: layer %d tensor %d: %zu bytes of %s, "
                                    "expected %llu values", l, s, w->bytes, ft_dtype_name(w->dtype),
                                    (unsigned long long)c->lnumel[s]);
            st = ft_cuda_dec_raw_async(&c->dec, w->data, w->dtype, c->lnumel[s], c->ldt[s], dst, c->ls,
                                       &c->h2d_weight_bytes);
        } else if (w->kind == FT_CUDA_WSRC_FRAME) {
            ft_frame_info fi;
            if (!w->data) return ft_set_error(FT_ERR_INVALID_ARG, "weight hook: layer %d tensor %d: NULL", l, s);
            st = ft_frame_parse(w->data, w->bytes, &fi);
            if (st == FT_ERR_BUFFER_SMALL || (!st && fi.frame_size > w->bytes))
                st = ft_set_error(FT_ERR_CORRUPT, "weight hook: layer %d tensor %d: truncated frame", l, s);
            if (st) return st;
            int same = (int)fi.ndim == c->lndim[s];
            for (int d = 0; same && d < c->lndim[s]; d++) same = fi.shape[d] == c->lshape[s][d];
            if (!same)
                return ft_set_error(FT_ERR_INVALID_ARG, "weight hook: layer %d tensor %d: frame shape does "
                                    "not match the model", l, s);
            st = ft_cuda_dec_frame_async(&c->dec, w->data, &fi, w->trusted, c->ldt[s], dst, c->ls,
                                         &c->h2d_weight_bytes);
        } else if (w->kind == FT_CUDA_WSRC_WMAT) {
            const ft_wmat *m = w->wmat;
            if (!m || c->lndim[s] != 2 || m->rows != c->lshape[s][0] || m->cols != c->lshape[s][1])
                return ft_set_error(FT_ERR_INVALID_ARG, "weight hook: layer %d tensor %d: a matrix of another "
                                    "shape", l, s);
            st = ft_cuda_dec_wmat_async(&c->dec, m, c->ldt[s], dst, c->ls, &c->h2d_weight_bytes);
        } else {
            return ft_set_error(FT_ERR_INVALID_ARG, "weight hook: layer %d tensor %d missing", l, s);
        }
        if (st) return st;
    }
    TRY(ft_cuda_dec_join(&c->dec, c->ls));   /* the decode kernels of the layer's q8/q4 tensors */
    FT_CU(cudaEventRecord(c->copy1[l], c->ls), "cudaEventRecord");
    FT_CU(cudaEventRecord(c->ev_loaded[slot], c->ls), "cudaEventRecord");
    c->layers_streamed++;
    c->hook_s += ft_now() - t0;
    return FT_OK;
}

/* ------------------------------------------- the CUDA backend ops */

/* The forward pass is the engine's (src/engine/graph.c); these are its
 * operations on the GPU: buffers in device memory, matrices in the
 * context's weight dtype (bf16 with f32 accumulation, or f32) through
 * cuBLAS, the rest in this backend's kernels. */

static float *gbuf(ft_cuda_ctx *c, ft_gbuf id)
{
    switch (id) {
    case FT_GB_X: return c->x;
    case FT_GB_XB: return c->xb;
    case FT_GB_Q: return c->q;
    case FT_GB_K: return c->k;
    case FT_GB_V: return c->v;
    case FT_GB_ATT: return c->att;
    case FT_GB_H1: return c->h1;
    case FT_GB_H2: return c->h2;
    case FT_GB_SEL: return c->sel;
    case FT_GB_SEL2: return c->sel2;
    case FT_GB_LOGITS: return c->logits;
    default: return NULL;
    }
}

/* A tensor by (layer handle, slot): the layer's device block, or the
 * model-wide tensors; NULL when absent (or slot < 0). */
static const void *gten(const ft_cuda_ctx *c, const void *w, int slot)
{
    if (slot < 0) return NULL;
    return w ? ((const dev_layer *)w)->t[slot] : c->g[slot];
}

static void gshape(const ft_cuda_ctx *c, const void *w, int slot, int64_t shp[2])
{
    if (w) {
        shp[0] = c->lshape[slot][0];
        shp[1] = c->lshape[slot][1];
    } else {
        ft_model_global_shape(c->m, slot, shp);
    }
}

static ft_status cu_embed(void *b, ft_gbuf out, int rows)
{
    ft_cuda_ctx *c = b;
    FT_CU(ftk_embed(gbuf(c, out), c->g[GW_TOK_EMB], (int)c->gdt[GW_TOK_EMB], c->d_tokens, rows, c->E, c->cs),
          "embedding kernel");
    return FT_OK;
}

static ft_status cu_add_positions(void *b, int rows)
{
    ft_cuda_ctx *c = b;
    FT_CU(ftk_add_pos(c->x, c->g[GW_POS_EMB], (int)c->gdt[GW_POS_EMB], c->d_row_pos, c->pos_offset, rows,
                      c->H, c->cs),
          "position kernel");
    return FT_OK;
}

/* Streaming: layer l + 1 is loaded on the load stream while l computes;
 * the compute stream waits for l's slot (timed by the stall events). */
static ft_status cu_layer_begin(void *b, int l, const void **w)
{
    ft_cuda_ctx *c = b;
    if (c->p.stream_weights) {
        if (l == 0) {
            FT_CU(cudaEventRecord(c->stall0[0], c->cs), "cudaEventRecord");
            TRY(load_layer(c, 0));
        }
        /* (stall0[l] for l > 0 was recorded at the end of layer l - 1,
         * before the host waited for this layer's copies in load_layer) */
        if (l + 1 < ft_model_get_config(c->m)->n_layers) TRY(load_layer(c, l + 1));
        FT_CU(cudaStreamWaitEvent(c->cs, c->ev_loaded[l & 1], 0), "cudaStreamWaitEvent");
        FT_CU(cudaEventRecord(c->stall1[l], c->cs), "cudaEventRecord");
        layer_ptrs(c, c->lbuf + (size_t)(l & 1) * c->lbytes, (dev_layer *)(void *)&c->cur);
    } else {
        layer_ptrs(c, c->lbuf + (size_t)l * c->lbytes, (dev_layer *)(void *)&c->cur);
    }
    *w = &c->cur;
    return FT_OK;
}

static ft_status cu_layer_end(void *b, int l)
{
    ft_cuda_ctx *c = b;
    if (c->p.stream_weights) {
        FT_CU(cudaEventRecord(c->ev_free[l & 1], c->cs), "cudaEventRecord");
        if (l + 1 < ft_model_get_config(c->m)->n_layers)
            FT_CU(cudaEventRecord(c->stall0[l + 1], c->cs), "cudaEventRecord");
    }
    return FT_OK;
}

static ft_status cu_norm(void *b, ft_gbuf out, ft_gbuf in, int rows, const void *w, int sw, int sb)
{
    ft_cuda_ctx *c = b;
    return norm(c, gbuf(c, out), gbuf(c, in), rows, gten(c, w, sw), gten(c, w, sb));
}

static ft_status cu_linear(void *b, ft_gbuf y, ft_gbuf x, int rows, const void *w, int slot, int sb)
{
    ft_cuda_ctx *c = b;
    int64_t shp[2];
    gshape(c, w, slot, shp);
    const void *gin;
    TRY(gemm_input(c, gbuf(c, x), (uint64_t)rows * (uint64_t)shp[1], &gin));
    return gemm(c, gbuf(c, y), gin, rows, (int)shp[1], gten(c, w, slot), (int)shp[0], gten(c, w, sb));
}

static ft_status cu_rope(void *b, int rows)
{
    ft_cuda_ctx *c = b;
    const ft_model_config *cfg = ft_model_get_config(c->m);
    FT_CU(ftk_rope(c->q, rows, c->qdim, cfg->n_heads, c->hd, c->d_row_pos, c->rope_cos, c->rope_sin, c->cs),
          "RoPE kernel");
    FT_CU(ftk_rope(c->k, rows, c->kvdim, cfg->n_kv_heads, c->hd, c->d_row_pos, c->rope_cos, c->rope_sin, c->cs),
          "RoPE kernel");
    return FT_OK;
}

static ft_status cu_attention(void *b, int l, int rows)
{
    ft_cuda_ctx *c = b;
    const ft_model_config *cfg = ft_model_get_config(c->m);
    float *kc = kv_layer(c, l, 0), *vc = kv_layer(c, l, 1);
    FT_CU(ftk_kv_append(kc, vc, c->k, c->v, c->d_row_slot, c->d_row_pos, rows, c->kvdim, c->p.max_seq, c->cs),
          "KV append kernel");
    FT_CU(ftk_attention(c->att, c->q, kc, vc, c->d_row_slot, c->d_row_pos, rows, cfg->n_heads, cfg->n_kv_heads,
                        c->hd, c->p.max_seq, 1.0f / sqrtf((float)c->hd), c->cs),
          "attention kernel");
    return FT_OK;
}

static ft_status cu_ffn_act(void *b, int rows)
{
    ft_cuda_ctx *c = b;
    if (c->swiglu)
        FT_CU(ftk_silu_mul(c->h1, c->h2, (uint64_t)rows * c->F, c->cs), "SiLU kernel");
    else
        FT_CU(ftk_relu(c->h1, (uint64_t)rows * c->F, c->cs), "ReLU kernel");
    return FT_OK;
}

static ft_status cu_add(void *b, ft_gbuf y, ft_gbuf x, int rows)
{
    ft_cuda_ctx *c = b;
    FT_CU(ftk_add(gbuf(c, y), gbuf(c, x), (uint64_t)rows * c->H, c->cs), "residual kernel");
    return FT_OK;
}

static ft_status cu_gather_last(void *b, ft_gbuf out, ft_gbuf in, int n)
{
    ft_cuda_ctx *c = b;
    FT_CU(ftk_gather_rows(gbuf(c, out), gbuf(c, in), c->d_sel, n, c->H, c->cs), "gather kernel");
    return FT_OK;
}

static const ft_backend_ops cuda_ops = {
    cu_embed, cu_add_positions, cu_layer_begin, cu_layer_end, cu_norm, cu_linear,
    cu_rope, cu_attention, cu_ffn_act, cu_add, cu_gather_last,
    NULL, NULL, NULL, NULL,   /* qk_norm, scale, softcap, moe: models needing them are refused at create */
};

/* Validation as ft_ctx_forward (the engine's checks). */
static ft_status check_call(const ft_cuda_ctx *c, size_t n, const int *slots, const int32_t *const *tokens,
                            const size_t *ntok, int all_rows, size_t *rows_out)
{
    if (!c) return ft_set_error(FT_ERR_INVALID_ARG, "forward: NULL context");
    ft_call_limits lim = {c->V, c->p.max_batch, c->p.max_seq, c->p.max_rows, c->p.all_logits, c->seq_len};
    return ft_graph_check_call(&lim, n, slots, tokens, ntok, all_rows, rows_out);
}

/* Everything up to the last layer, enqueued; then the rows that want
 * logits through the final norm, project_out and the LM head into
 * c->logits (nsel rows). want: 0 none, 1 last row per sequence, 2 all. */
static ft_status run(ft_cuda_ctx *c, size_t n, const int *slots, const int32_t *const *tokens,
                     const size_t *ntok, int rows, int want, int *nsel_out)
{
    const ft_model *m = c->m;
    int r = 0;
    for (size_t j = 0; j < n; j++) {
        for (size_t i = 0; i < ntok[j]; i++, r++) {
            c->h_tokens[r] = tokens[j][i];
            c->h_row_slot[r] = slots[j];
            c->h_row_pos[r] = c->seq_len[slots[j]] + (int)i;
        }
        c->h_sel[j] = r - 1;                      /* last row of sequence j */
    }
    FT_CU(cudaMemcpyAsync(c->d_tokens, c->h_tokens, (size_t)rows * 4, cudaMemcpyHostToDevice, c->cs), "cudaMemcpyAsync");
    FT_CU(cudaMemcpyAsync(c->d_row_slot, c->h_row_slot, (size_t)rows * 4, cudaMemcpyHostToDevice, c->cs), "cudaMemcpyAsync");
    FT_CU(cudaMemcpyAsync(c->d_row_pos, c->h_row_pos, (size_t)rows * 4, cudaMemcpyHostToDevice, c->cs), "cudaMemcpyAsync");
    FT_CU(cudaMemcpyAsync(c->d_sel, c->h_sel, n * 4, cudaMemcpyHostToDevice, c->cs), "cudaMemcpyAsync");

    c->call_n = (int)n;
    int failed = -1;
    return ft_graph_forward(&cuda_ops, c, m, rows, (int)n, want, nsel_out, &failed);
}

/* After an error: let enqueued work finish (it may read the hook's host
 * memory) before returning to the caller. */
static void drain(ft_cuda_ctx *c)
{
    (void)cudaStreamSynchronize(c->ls);
    if (c->dec.ks) (void)cudaStreamSynchronize(c->dec.ks);
    (void)cudaStreamSynchronize(c->cs);
    (void)cudaGetLastError();
}

static ft_status finish(ft_cuda_ctx *c, size_t n, const int *slots, const size_t *ntok, double t0)
{
    ft_status st = ft_cuda_status(cudaStreamSynchronize(c->cs), "forward (cudaStreamSynchronize)");
    if (!st) st = ft_cuda_status(cudaStreamSynchronize(c->ls), "forward (weight loads)");
    if (st) { drain(c); return st; }
    for (size_t j = 0; j < n; j++) c->seq_len[slots[j]] += (int)ntok[j];
    /* how long the compute stream waited for each layer's weights */
    for (int l = 0; c->p.stream_weights && l < ft_model_get_config(c->m)->n_layers; l++) {
        float ms = 0;
        if (cudaEventElapsedTime(&ms, c->stall0[l], c->stall1[l]) == cudaSuccess) c->stall_s += ms * 1e-3;
        else (void)cudaGetLastError();
        if (cudaEventElapsedTime(&ms, c->copy0[l], c->copy1[l]) == cudaSuccess) c->copy_s += ms * 1e-3;
        else (void)cudaGetLastError();
    }
    c->forward_s += ft_now() - t0;
    return FT_OK;
}

ft_status ft_cuda_ctx_forward(ft_cuda_ctx *c, size_t n, const int *slots, const int32_t *const *tokens,
                              const size_t *ntok, float *logits, int all_rows)
{
    size_t rows;
    ft_status st = check_call(c, n, slots, tokens, ntok, all_rows, &rows);
    if (st) return st;
    FT_CU(cudaSetDevice(c->p.device), "cudaSetDevice");
    double t0 = ft_now();
    int nsel = 0;
    st = run(c, n, slots, tokens, ntok, (int)rows, logits ? (all_rows ? 2 : 1) : 0, &nsel);
    if (!st && logits && nsel)
        st = ft_cuda_status(cudaMemcpyAsync(logits, c->logits, (size_t)nsel * (size_t)c->V * sizeof(float),
                                            cudaMemcpyDeviceToHost, c->cs),
                            "cudaMemcpyAsync (logits)");
    if (st) { drain(c); return st; }
    return finish(c, n, slots, ntok, t0);
}

ft_status ft_cuda_ctx_forward_greedy(ft_cuda_ctx *c, size_t n, const int *slots, const int32_t *const *tokens,
                                     const size_t *ntok, int32_t *next)
{
    size_t rows;
    ft_status st = check_call(c, n, slots, tokens, ntok, 0, &rows);
    if (st) return st;
    if (!next) return ft_set_error(FT_ERR_INVALID_ARG, "forward: NULL output");
    FT_CU(cudaSetDevice(c->p.device), "cudaSetDevice");
    double t0 = ft_now();
    int nsel = 0;
    st = run(c, n, slots, tokens, ntok, (int)rows, 1, &nsel);
    if (!st) st = ft_cuda_status(ftk_argmax(c->d_next, c->logits, nsel, c->V, c->cs), "argmax kernel");
    if (!st)
        st = ft_cuda_status(cudaMemcpyAsync(c->h_next, c->d_next, (size_t)nsel * sizeof(int32_t),
                                            cudaMemcpyDeviceToHost, c->cs),
                            "cudaMemcpyAsync (tokens)");
    if (st) { drain(c); return st; }
    if ((st = finish(c, n, slots, ntok, t0))) return st;
    memcpy(next, c->h_next, n * sizeof(int32_t));
    return FT_OK;
}

/* ------------------------------------------------------------ generate */

/* What ft_cuda_ctx_forward_ops needs besides the forward functions (the
 * loader builds the ops, and ft_cuda_generate runs the one generation
 * loop over them: src/cuda/cuda_loader.c). */
void ft_cuda_ctx_shape(const ft_cuda_ctx *c, const ft_model **m, int *max_batch, int *max_seq)
{
    *m = c->m;
    *max_batch = c->p.max_batch;
    *max_seq = c->p.max_seq;
}
