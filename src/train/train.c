/* LoRA fine-tuning (flextier/train.h, docs/training.md) of every family
 * the engine runs: forward with per-layer checkpoints,
 * backward by recomputing each layer, AdamW, data-parallel steps. Frozen
 * weights are computed on as stored (the engine's stored-format products
 * forward, ft_tr_matT backward). */
#include "train/train_internal.h"

#include "engine/graph.h"
#include "engine/moe.h"
#include "engine/kernels.h"
#include "engine/wkernels.h"
#include "engine/gemm_bf16.h"
#include "flextier/store.h"

#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define TRY(x) do { ft_status st_ = (x); if (st_) return st_; } while (0)
#define NT 7

static const char *const tname[NT] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
/* every PEFT name by its bit (FT_LORA_*): the llama names, then OPT's
 * out_proj, fc1, fc2 (its o_proj, up_proj, down_proj slots) */
#define NB_NAMES 14
static const char *const bitname[NB_NAMES] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                              "down_proj", "out_proj", "fc1", "fc2", "qkv_proj", "gate_up_proj",
                                              "experts.gate_up_proj", "experts.down_proj"};
static const char *const opt_tname[NT] = {"q_proj", "k_proj", "v_proj", "out_proj", NULL, "fc1", "fc2"};
static const int tslot[NT] = {LW_Q, LW_K, LW_V, LW_O, LW_GATE, LW_UP, LW_DOWN};
static const int tbias[NT] = {LW_QB, LW_KB, LW_VB, LW_OB, LW_GATE_B, LW_UP_B, LW_DOWN_B};
enum { TQ, TK, TV, TO, TG, TU, TD };

/* one adapted projection; phi3's fused qkv_proj / gate_up_proj are one
 * LoRA whose B is sliced by rows: the k/v (up) parts share the q (gate)
 * part's A (shared = 1) and use the next rows of its B (fused_out rows).
 * The experts of an MoE layer (ne = the number of experts): the gate
 * slot holds PEFT's LoRA on the fused parameter gate_up_proj
 * [E, 2F, H], the down slot on down_proj [E, H, F], in PEFT's layout:
 * A [E * r][in] (expert e's rows e r .. e r + r - 1), B [out][E * r]
 * (expert e's column j at j E + e); out = 2F (fused_out) for gate_up. */
typedef struct lmod { int on, in, out, shared, fused_out, ne; size_t a, b; } lmod;

/* rows of a frozen matrix transposed per task (W^T dy) */
enum { WT_B = 16 };

struct ft_trainer {
    const ft_model *m;
    const uint8_t *mask;     /* the current call's label mask (NULL: all) */
    ft_model_config cfg;
    ft_model_blocks blk;     /* norm, positions, FFN of the architecture   */
    int is_opt, is_phi3;
    int post;                /* OPT post-LN (do_layer_norm_before false)   */
    int fnorm;               /* a final norm exists                        */
    int E;                   /* word_embed_proj_dim (OPT project_in/out)   */
    float *pin, *hp, *dhp;   /* R x E: embeddings before project_in; the
                                LM head's input after project_out; its grad */
    ft_train_params p;
    float scale;
    lmod *mods;              /* [layer][NT] */
    float *w, *g, *m1, *m2;  /* params, grads, Adam moments */
    size_t np;
    float *gu;               /* per micro-batch gradients (the fold)       */
    double *gul;             /* and their mean losses                      */
    size_t gu_units;
    int step;
    /* workspaces for cap_rows rows of sequences of cap_T */
    int cap_rows, cap_T, cap_nb;
    float *xs;               /* (L+1) x R x H layer inputs */
    float *h1, *q, *k, *v, *att, *x2, *h2, *gt, *up, *mm, *tmp, *P;
    float *qr, *kr;          /* q, k before their norms (qk_norm)          */
    float *ao, *fo, *dsw;    /* attention / FFN outputs before gemma's sandwich norms */
    float *lcosT, *lsinT;    /* gemma3: the sliding layers' RoPE (rope_local_theta) */
    float *nw;               /* (1 + w) norm weights (gemma)                */
    /* mixture of experts (frozen): routes and one expert's rows at a time */
    float *mprob, *mwt, *mgwt, *mx, *mg, *mu, *mmx, *my, *mdy, *mdm, *mdg, *mdu, *mdx, *mdw, *mdl;
    /* LoRA on the experts: A x of gate_up and down (rows x r), B x of one
     * expert (rows x max(2F, H)), its B gathered (max(2F, H) x r), B^T,
     * dB, dt (rows x r) */
    float *mtg, *mtd, *meu, *meb, *mebt, *megb, *medt;
    int *midx, *mstart, *mgrow;
    float *tl[NT], *dt;
    float *dx, *dx2, *dh, *dq, *dk, *dv, *datt, *dgt, *dup, *dmm;
    float *cosT, *sinT;
    float *lchunk, *ltgt;
    float *lall;             /* every chunk's logits (R x V in chunk blocks),
                                kept from pass 1 for pass 2 when small */
    double *lmax, *lsum;
    void *ws;
    size_t ws_cap;
    void *wt;                /* one matrix transposed (bf16/f16 or f32)    */
    float *tmp2;             /* R x wide                                   */
    float *bt, *gbt;         /* rank x widest output: B^T, dB^T            */
    size_t wt_cap;           /* bytes */
    float *row;              /* WT_B rows of scratch per worker (row_len floats) */
    float *tls;              /* s * tl of a LoRA backward (rows x rank)        */
    size_t row_len, row_max; /* row_max: the widest row                         */
    float *dmk, *dxd;        /* lora_dropout: R x wide factors, masked input */
    int dropping;            /* inside a training micro-batch with dropout  */
    uint64_t drop_key;       /* its (seed, step, micro-batch) key           */
    ft_pool *pool;
    unsigned nthreads;
    /* the layer being computed: the model's, or the layer function's */
    const ft_layer_weights *lw;
    ft_layer_weights lbuf;
    int cur_layer;
    /* saved activations (p.act_uri) */
    ft_store *act;
    ft_codec_params act_cp;
    char act_prefix[96];
    int act_layers;          /* layers with saved activations (keys to delete) */
    uint64_t act_base;       /* the store's bytes in use when opened */
    /* mem: with raw frames: the values kept by the trainer itself, one
     * buffer per (layer, activation), reused from step to step (no store:
     * no frame, no allocation per write) */
    int saving;              /* act or keep */
    float **keep;
    size_t *keep_cap;
    ft_train_act_stats act_st;
};

/* the activations a layer's backward reads, saved or recomputed (the
 * routes of a mixture of experts are recomputed from h2: the router's
 * product, cheap beside the experts) */
enum { A_H1, A_Q, A_K, A_V, A_ATT, A_P, A_X2, A_H2, A_GT, A_UP, A_MM, A_QR, A_KR, A_AO, A_FO, A_TL0,
       A_N = A_TL0 + NT };

unsigned ft_lora_target_bit(const char *name)
{
    for (int i = 0; name && i < NB_NAMES; i++)
        if (!strcmp(name, bitname[i])) return 1u << i;
    return 0;
}

ft_status ft_lora_parse_targets(const char *list, unsigned *mask)
{
    if (!list || !mask) return ft_set_error(FT_ERR_INVALID_ARG, "lora targets: NULL argument");
    if (!strcmp(list, "all")) {
        *mask = FT_LORA_ALL;
        return FT_OK;
    }
    unsigned m = 0;
    const char *s = list;
    while (*s) {
        const char *e = strchr(s, ',');
        size_t n = e ? (size_t)(e - s) : strlen(s);
        char name[32];
        if (n == 0 || n >= sizeof name)
            return ft_set_error(FT_ERR_INVALID_ARG, "lora targets: bad entry in '%s' (PEFT names: q_proj k_proj "
                                "v_proj o_proj gate_proj up_proj down_proj; OPT: out_proj fc1 fc2; phi3: qkv_proj "
                                "gate_up_proj; or all)", list);
        memcpy(name, s, n);
        name[n] = 0;
        unsigned b = ft_lora_target_bit(name);
        if (!b)
            return ft_set_error(FT_ERR_INVALID_ARG, "lora targets: unknown module '%s' (PEFT names: q_proj k_proj "
                                "v_proj o_proj gate_proj up_proj down_proj; OPT: out_proj fc1 fc2; phi3: qkv_proj "
                                "gate_up_proj; or all)", name);
        m |= b;
        s += n;
        if (*s == ',') s++;
    }
    if (!m) return ft_set_error(FT_ERR_INVALID_ARG, "lora targets: empty list");
    *mask = m;
    return FT_OK;
}

void ft_train_params_default(ft_train_params *p)
{
    memset(p, 0, sizeof *p);
    p->rank = 8;
    p->alpha = 16.0f;
    p->targets = FT_LORA_ALL;
    p->lr = 2e-4f;
    p->beta1 = 0.9f;
    p->beta2 = 0.999f;
    p->eps = 1e-8f;
    p->weight_decay = 0.01f;
    p->clip = 1.0f;
    p->total_steps = 1;
    p->schedule = FT_SCHED_COSINE;
    p->grad_accum = 1;
    p->vocab_chunk = 4096;
}

static ft_status check_params(const ft_train_params *p)
{
    if (p->rank < 1 || p->rank > 4096) return ft_set_error(FT_ERR_INVALID_ARG, "train: rank %d outside [1, 4096]", p->rank);
    if (!(p->alpha > 0.0f) || !isfinite(p->alpha))
        return ft_set_error(FT_ERR_INVALID_ARG, "train: alpha must be a positive number");
    if (!(p->dropout >= 0.0f && p->dropout < 1.0f))
        return ft_set_error(FT_ERR_INVALID_ARG, "train: lora dropout %g outside [0, 1)", (double)p->dropout);
    if (!p->targets || (p->targets & ~(unsigned)FT_LORA_ANY))
        return ft_set_error(FT_ERR_INVALID_ARG, "train: no (or unknown) target modules");
    if (!(p->lr > 0.0f) || !isfinite(p->lr)) return ft_set_error(FT_ERR_INVALID_ARG, "train: lr must be > 0");
    if (!(p->beta1 >= 0.0f && p->beta1 < 1.0f) || !(p->beta2 >= 0.0f && p->beta2 < 1.0f))
        return ft_set_error(FT_ERR_INVALID_ARG, "train: AdamW betas must be in [0, 1)");
    if (!(p->eps > 0.0f) || !isfinite(p->eps)) return ft_set_error(FT_ERR_INVALID_ARG, "train: eps must be > 0");
    if (!(p->weight_decay >= 0.0f) || !isfinite(p->weight_decay))
        return ft_set_error(FT_ERR_INVALID_ARG, "train: weight decay must be >= 0");
    if (!(p->clip >= 0.0f) || !isfinite(p->clip)) return ft_set_error(FT_ERR_INVALID_ARG, "train: clip must be >= 0");
    if (p->total_steps < 1) return ft_set_error(FT_ERR_INVALID_ARG, "train: total steps must be >= 1");
    if (p->warmup < 0 || p->warmup > p->total_steps)
        return ft_set_error(FT_ERR_INVALID_ARG, "train: warmup %d outside [0, steps = %d]", p->warmup, p->total_steps);
    if (p->schedule < FT_SCHED_COSINE || p->schedule > FT_SCHED_CONSTANT)
        return ft_set_error(FT_ERR_INVALID_ARG, "train: unknown lr schedule");
    if (p->grad_accum < 1 || p->grad_accum > 65536)
        return ft_set_error(FT_ERR_INVALID_ARG, "train: grad_accum %d outside [1, 65536]", p->grad_accum);
    if (p->vocab_chunk < 1) return ft_set_error(FT_ERR_INVALID_ARG, "train: vocab_chunk must be >= 1");
    return FT_OK;
}

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static const ft_layer_weights *lw_of(const ft_trainer *t, int l)
{
    (void)l;
    return t->lw;
}
static const ft_wmat *wmat(const ft_layer_weights *w, int slot)
{
    return ft_layer_weights_mat((ft_layer_weights *)(uintptr_t)w, slot);
}
static const float *wvec(const ft_layer_weights *w, int slot)
{
    return slot < 0 ? NULL : *ft_layer_weights_vec((ft_layer_weights *)(uintptr_t)w, slot);
}

/* 1 if layer l has no module i: OPT's gate, an MoE layer's MLP (experts) */
static int no_mod(const ft_model_config *c, int l, int i)
{
    return (c->arch == FT_ARCH_OPT && i == TG) || (c->n_experts && c->layer_moe[l] && i >= TG);
}

/* module i's (in, out) from the configuration (layers not in memory) */
static void mod_shape(const ft_model_config *c, int i, int *in, int *out)
{
    int H = c->hidden, qw = c->n_heads * c->head_dim, kw = c->n_kv_heads * c->head_dim, I = c->ffn;
    switch (i) {
    case TQ: *in = H; *out = qw; break;
    case TK: case TV: *in = H; *out = kw; break;
    case TO: *in = qw; *out = H; break;
    case TG: case TU: *in = H; *out = I; break;
    default: *in = I; *out = H; break;
    }
}

/* make layer l's weights current (the layer function's, or the model's);
 * next: the layer asked for after it (-1: none), to be read ahead */
static ft_status use_layer(ft_trainer *t, int l, int next)
{
    t->cur_layer = l;
    if (!t->p.layer_fn) {
        t->lw = ft_model_layer(t->m, l);
        return FT_OK;
    }
    if (next == l) next = -1;
    memset(&t->lbuf, 0, sizeof t->lbuf);
    TRY(t->p.layer_fn(t->p.layer_user, l, next, &t->lbuf));
    for (int i = 0; i < NT; i++) {
        if (no_mod(&t->cfg, l, i)) continue;
        const lmod *md = &t->mods[(size_t)l * NT + (size_t)i];
        const ft_wmat *W = wmat(&t->lbuf, tslot[i]);
        if (!ft_wmat_present(W) || W->rows != md->out || W->cols != md->in)
            return ft_set_error(FT_ERR_CORRUPT, "train: layer %d's %s from the layer function is %s (%d x %d, want "
                                "%d x %d)", l, tname[i], ft_wmat_present(W) ? "misshapen" : "missing", W->rows,
                                W->cols, md->out, md->in);
    }
    t->lw = &t->lbuf;
    return FT_OK;
}

ft_status ft_trainer_create(const ft_model *m, const ft_train_params *p, ft_trainer **out)
{
    if (!m || !p || !out) return ft_set_error(FT_ERR_INVALID_ARG, "ft_trainer_create: NULL argument");
    TRY(check_params(p));
    const ft_model_config *c = ft_model_get_config(m);
    if (c->arch != FT_ARCH_LLAMA && c->arch != FT_ARCH_QWEN2 && c->arch != FT_ARCH_QWEN3 && c->arch != FT_ARCH_OPT &&
        c->arch != FT_ARCH_PHI3 && c->arch != FT_ARCH_GEMMA2 && c->arch != FT_ARCH_MIXTRAL &&
        c->arch != FT_ARCH_OLMOE)
        return ft_set_error(FT_ERR_UNSUPPORTED, "train: model type '%s' is not implemented for training",
                            c->model_type);
    if (c->n_experts > 256)
        return ft_set_error(FT_ERR_UNSUPPORTED, "train: %d experts (at most 256 are implemented)", c->n_experts);
    const int is_opt = c->arch == FT_ARCH_OPT, is_phi3 = c->arch == FT_ARCH_PHI3;
    if (ft_wmat_present(ft_model_global(m, GW_PROJ_IN)) != ft_wmat_present(ft_model_global(m, GW_PROJ_OUT)))
        return ft_set_error(FT_ERR_UNSUPPORTED, "train: project_in without project_out (or the reverse)");
    /* the modules to adapt, by slot: PEFT's names differ between the families */
    unsigned on = 0, want = p->targets;
    if (is_opt) {
        if (want == FT_LORA_ALL) want = FT_LORA_Q | FT_LORA_K | FT_LORA_V | FT_LORA_OUT | FT_LORA_FC1 | FT_LORA_FC2;
        unsigned bad = want & (FT_LORA_O | FT_LORA_GATE | FT_LORA_UP | FT_LORA_DOWN | FT_LORA_EXP_GATE_UP |
                               FT_LORA_EXP_DOWN);
        for (int i = 0; bad && i < NB_NAMES; i++)
            if (bad & (1u << i))
                return ft_set_error(FT_ERR_INVALID_ARG, "train: OPT has no module %s (its PEFT names: q_proj k_proj "
                                    "v_proj out_proj fc1 fc2)", bitname[i]);
        on = (want & (FT_LORA_Q | FT_LORA_K | FT_LORA_V)) | (want & FT_LORA_OUT ? 1u << TO : 0) |
             (want & FT_LORA_FC1 ? 1u << TU : 0) | (want & FT_LORA_FC2 ? 1u << TD : 0);
    } else if (is_phi3) {
        if (want == FT_LORA_ALL) want = FT_LORA_QKV | FT_LORA_O | FT_LORA_GATE_UP | FT_LORA_DOWN;
        unsigned bad = want & ~(unsigned)(FT_LORA_QKV | FT_LORA_O | FT_LORA_GATE_UP | FT_LORA_DOWN);
        for (int i = 0; bad && i < NB_NAMES; i++)
            if (bad & (1u << i))
                return ft_set_error(FT_ERR_INVALID_ARG, "train: phi3 has no module %s (its fused projections' PEFT "
                                    "names: qkv_proj o_proj gate_up_proj down_proj)", bitname[i]);
        on = (want & FT_LORA_QKV ? 7u : 0) | (want & FT_LORA_O) | (want & FT_LORA_GATE_UP ? 3u << TG : 0) |
             (want & FT_LORA_DOWN);
    } else if (c->n_experts) {
        /* the attention projections, and the experts as transformers 5 keeps them (one fused parameter
         * gate_up_proj [E, 2F, H] and down_proj [E, H, F] per layer) and PEFT adapts them
         * (target_parameters); the router stays frozen, dense layers' MLPs too */
        if (c->shared_expert)
            return ft_set_error(FT_ERR_UNSUPPORTED, "train: %s's shared expert (shared_expert, shared_expert_gate) "
                                "is not implemented for training", c->model_type);
        if (want == FT_LORA_ALL)
            want = FT_LORA_Q | FT_LORA_K | FT_LORA_V | FT_LORA_O | FT_LORA_EXP_GATE_UP | FT_LORA_EXP_DOWN;
        if (want & FT_LORA_GATE_UP) want = (want & ~(unsigned)FT_LORA_GATE_UP) | FT_LORA_EXP_GATE_UP;
        if (want & FT_LORA_DOWN) want = (want & ~(unsigned)FT_LORA_DOWN) | FT_LORA_EXP_DOWN;
        unsigned bad = want & ~(unsigned)(FT_LORA_Q | FT_LORA_K | FT_LORA_V | FT_LORA_O | FT_LORA_EXP_GATE_UP |
                                          FT_LORA_EXP_DOWN);
        for (int i = 0; bad && i < NB_NAMES; i++)
            if (bad & (1u << i))
                return ft_set_error(i == 4 || i == 5 ? FT_ERR_UNSUPPORTED : FT_ERR_INVALID_ARG,
                                    "train: %s on the mixture-of-experts model '%s': %s; targets: q_proj k_proj "
                                    "v_proj o_proj, the experts' gate_up_proj down_proj (PEFT's target_parameters), "
                                    "or all", bitname[i], c->model_type,
                                    i == 4 || i == 5 ? "transformers 5 keeps the experts' gate and up projections as "
                                    "one fused parameter, gate_up_proj (separate gate/up adapters per expert, "
                                    "transformers 4's form, are not implemented)" : "no such module");
        if ((want & (FT_LORA_EXP_GATE_UP | FT_LORA_EXP_DOWN)) && p->dropout > 0.0f)
            return ft_set_error(FT_ERR_UNSUPPORTED, "train: lora dropout with LoRA on the experts (PEFT's "
                                "target_parameters have no dropout: its ParamWrapper refuses lora_dropout != 0); with dropout, "
                                "target the attention only: q_proj,k_proj,v_proj,o_proj");
        on = (want & (FT_LORA_Q | FT_LORA_K | FT_LORA_V | FT_LORA_O)) | (want & FT_LORA_EXP_GATE_UP ? 1u << TG : 0) |
             (want & FT_LORA_EXP_DOWN ? 1u << TD : 0);
    } else {
        unsigned bad = want & (FT_LORA_OUT | FT_LORA_FC1 | FT_LORA_FC2 | FT_LORA_QKV | FT_LORA_GATE_UP |
                               FT_LORA_EXP_GATE_UP | FT_LORA_EXP_DOWN);
        for (int i = 0; bad && i < NB_NAMES; i++)
            if (bad & (1u << i))
                return ft_set_error(FT_ERR_INVALID_ARG, "train: %s is %s module name; this %s model's are q_proj "
                                    "k_proj v_proj o_proj gate_proj up_proj down_proj", bitname[i],
                                    i >= 12 ? "a mixture-of-experts" : i >= 10 ? "a phi3" : "an OPT", c->model_type);
        on = want;
    }
    int ext = !ft_model_layers_loaded(m);
    if (ext && !p->layer_fn)
        return ft_set_error(FT_ERR_INVALID_ARG, "train: the model's layers are not in memory and no layer function "
                            "(ft_train_params.layer_fn, e.g. ft_offload_fetch) supplies them");
    if (ft_model_streamed(m))
        return ft_set_error(FT_ERR_UNSUPPORTED, "train: the model's %s read from the checkpoint file on demand "
                            "(ft_load_params.stream_globals): not implemented for training; keep them in memory "
                            "(the layers can be streamed)", ft_model_streamed(m) & FT_STREAM_LM_HEAD ?
                            "embeddings and LM head are" : "embeddings are");
    for (int l = 0; l < c->n_layers && !ext; l++)
        for (int i = 0; i < NT; i++)
            if (!no_mod(c, l, i) && !ft_wmat_present(wmat(ft_model_layer(m, l), tslot[i])))
                return ft_set_error(FT_ERR_UNSUPPORTED, "train: layer %d has no %s", l, tname[i]);
    if (p->act_codec != 0 && p->act_codec != FT_CODEC_BYTEPLANE && p->act_codec != FT_CODEC_RAW &&
        p->act_codec != FT_CODEC_Q8)
        return ft_set_error(FT_ERR_INVALID_ARG, "train: saved activations' codec %d: byte-plane (lossless), raw or q8",
                            p->act_codec);
    size_t np = 0;
    ft_trainer *t = calloc(1, sizeof *t);
    if (!t) return ft_set_error(FT_ERR_NOMEM, "train: out of memory");
    t->m = m;
    t->cfg = *c;
    t->is_opt = is_opt;
    t->post = is_opt && !c->do_layer_norm_before;
    t->fnorm = ft_model_global(m, GW_FINAL_NORM_W)->data || (is_opt && c->final_norm);
    t->E = ft_wmat_present(ft_model_global(m, GW_PROJ_IN)) ? c->word_embed_proj_dim : c->hidden;
    t->is_phi3 = is_phi3;
    ft_model_get_blocks(m, &t->blk);
    if (ft_pool_create(p->threads, &t->pool)) {
        free(t);
        return ft_set_error(FT_ERR_NOMEM, "train: cannot start %u threads", p->threads);
    }
    t->nthreads = ft_pool_size(t->pool);
    t->p = *p;
    t->p.targets = want;   /* "all" as the family's names */
    t->scale = p->alpha / (float)p->rank;
    t->mods = calloc((size_t)c->n_layers * NT, sizeof *t->mods);
    if (!t->mods) goto nomem;
    for (int l = 0; l < c->n_layers; l++)
        for (int i = 0; i < NT; i++) {
            lmod *md = &t->mods[(size_t)l * NT + (size_t)i];
            if (is_opt && i == TG) continue;
            if (c->n_experts && c->layer_moe[l] && i >= TG) {   /* the experts' fused parameters */
                if (i == TU) continue;
                const size_t E = (size_t)c->n_experts;
                md->ne = c->n_experts;
                md->in = i == TG ? c->hidden : c->moe_ffn;
                md->out = i == TG ? c->moe_ffn : c->hidden;
                md->fused_out = i == TG ? 2 * c->moe_ffn : 0;
                if (!(on & (1u << i))) continue;
                md->on = 1;
                md->a = np;
                np += E * (size_t)p->rank * (size_t)md->in;
                md->b = np;
                np += (size_t)(md->fused_out ? md->fused_out : md->out) * E * (size_t)p->rank;
                continue;
            }
            mod_shape(c, i, &md->in, &md->out);
            if (!ext) {
                const ft_wmat *W = wmat(ft_model_layer(m, l), tslot[i]);
                md->in = W->cols;
                md->out = W->rows;
            }
            /* a dense layer of an MoE model: PEFT's target_parameters adapt the experts only */
            if (!(on & (1u << i)) || (c->n_experts && i >= TG)) continue;
            md->on = 1;
            if (is_phi3 && (i == TK || i == TV || i == TU)) {   /* later rows of the fused B */
                const lmod *prev = md - 1;
                md->shared = 1;
                md->a = prev->a;
                md->b = prev->b + (size_t)prev->out * (size_t)p->rank;
                continue;
            }
            if (is_phi3 && (i == TQ || i == TG)) {
                if (i == TQ) {   /* q, then k's and v's rows (k: the next module, not yet filled in) */
                    int kin, kout;
                    mod_shape(c, TK, &kin, &kout);
                    if (!ext) kout = wmat(ft_model_layer(m, l), tslot[TK])->rows;
                    md->fused_out = md->out + 2 * kout;
                } else {
                    md->fused_out = 2 * md->out;
                }
                md->a = np;
                np += (size_t)p->rank * (size_t)md->in;
                md->b = np;
                np += (size_t)md->fused_out * (size_t)p->rank;
                continue;
            }
            md->a = np;
            np += (size_t)p->rank * (size_t)md->in;
            md->b = np;
            np += (size_t)md->out * (size_t)p->rank;
        }
    t->np = np;
    t->w = calloc(np, sizeof(float));
    t->g = calloc(np, sizeof(float));
    t->m1 = calloc(np, sizeof(float));
    t->m2 = calloc(np, sizeof(float));
    if (!t->w || !t->g || !t->m1 || !t->m2) goto nomem;
    /* PEFT: A kaiming_uniform_(a = sqrt(5)) = U(-1/sqrt(in), 1/sqrt(in)); B = 0 */
    uint64_t s = p->seed;
    for (int l = 0; l < c->n_layers; l++)
        for (int i = 0; i < NT; i++) {
            lmod *md = &t->mods[(size_t)l * NT + (size_t)i];
            if (!md->on || md->shared) continue;
            float bound = 1.0f / sqrtf((float)md->in);
            for (size_t j = 0; j < (size_t)(md->ne ? md->ne : 1) * (size_t)p->rank * (size_t)md->in; j++) {
                float u = (float)(splitmix(&s) >> 40) * (1.0f / 16777216.0f);
                t->w[md->a + j] = (2.0f * u - 1.0f) * bound;
            }
        }
    if (p->act_uri && !strcmp(p->act_uri, "mem:") && p->act_codec == FT_CODEC_RAW) {
        t->keep = calloc((size_t)c->n_layers * A_N, sizeof *t->keep);
        t->keep_cap = calloc((size_t)c->n_layers * A_N, sizeof *t->keep_cap);
        if (!t->keep || !t->keep_cap) goto nomem;
        t->saving = 1;
    } else if (p->act_uri) {
        t->saving = 1;
        ft_store_params sp;
        ft_store_default_params(&sp);
        sp.token_file = p->act_token_file;
        ft_status st = ft_store_open(p->act_uri, &sp, &t->act);
        if (st) {
            ft_trainer_free(t);
            return st;
        }
        ft_store_stats ss;
        if (ft_store_stats_get(t->act, &ss) == FT_OK) t->act_base = ss.used;
        ft_codec_default_params(&t->act_cp);
        t->act_cp.codec = p->act_codec ? (ft_codec_id)p->act_codec : FT_CODEC_BYTEPLANE;
        /* keys of their own: processes (data-parallel ranks, machines)
         * may share a directory or a memory node */
        static unsigned long serial;
        char host[32] = "";
        if (gethostname(host, sizeof host - 1)) host[0] = 0;
        for (char *h = host; *h; h++)
            if (!((*h >= 'a' && *h <= 'z') || (*h >= 'A' && *h <= 'Z') || (*h >= '0' && *h <= '9') || *h == '-'))
                *h = '_';
        snprintf(t->act_prefix, sizeof t->act_prefix, "ftact/%s-%ld-%lu", host, (long)getpid(),
                 __atomic_add_fetch(&serial, 1, __ATOMIC_RELAXED));
    }
    *out = t;
    return FT_OK;
nomem:
    ft_trainer_free(t);
    return ft_set_error(FT_ERR_NOMEM, "train: out of memory for %zu adapter parameters", np);
}

static void free_ws(ft_trainer *t)
{
    float **f[] = {&t->xs, &t->h1, &t->q, &t->k, &t->v, &t->att, &t->x2, &t->h2, &t->gt, &t->up, &t->mm, &t->tmp,
                   &t->P, &t->dt, &t->dx, &t->dx2, &t->dh, &t->dq, &t->dk, &t->dv, &t->datt, &t->dgt, &t->dup,
                   &t->dmm, &t->cosT, &t->sinT, &t->lchunk, &t->ltgt, &t->lall, &t->row, &t->tmp2, &t->bt, &t->gbt, &t->qr, &t->kr, &t->ao, &t->fo, &t->dsw, &t->lcosT, &t->lsinT, &t->nw, &t->pin, &t->hp, &t->dhp,
                   &t->mprob, &t->mwt, &t->mgwt, &t->mx, &t->mg, &t->mu, &t->mmx, &t->my, &t->mdy, &t->mdm,
                   &t->mdg, &t->mdu, &t->mdx, &t->mdw, &t->mdl, &t->dmk, &t->dxd, &t->mtg, &t->mtd, &t->meu,
                   &t->meb, &t->mebt, &t->megb, &t->medt, &t->tls};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        free(*f[i]);
        *f[i] = NULL;
    }
    for (int i = 0; i < NT; i++) {
        free(t->tl[i]);
        t->tl[i] = NULL;
    }
    free(t->lmax);
    free(t->lsum);
    t->lmax = t->lsum = NULL;
    free(t->midx);
    free(t->mstart);
    free(t->mgrow);
    t->midx = t->mstart = t->mgrow = NULL;
    t->cap_rows = t->cap_T = t->cap_nb = 0;
}

static void act_key(const ft_trainer *t, int l, int a, char *key, size_t n)
{
    snprintf(key, n, "%s/%d/%d", t->act_prefix, l, a);
}

void ft_trainer_free(ft_trainer *t)
{
    if (!t) return;
    if (t->act) {   /* a file: directory or a memory node outlives us: leave nothing */
        char key[160];
        for (int l = 0; l < t->act_layers; l++)
            for (int a = 0; a < A_N; a++) {
                act_key(t, l, a, key, sizeof key);
                (void)ft_delete_tensor(t->act, key);
            }
        ft_store_close(t->act);
        ft_clear_error();
    }
    for (size_t k = 0; t->keep && k < (size_t)t->cfg.n_layers * A_N; k++) free(t->keep[k]);
    free(t->keep);
    free(t->keep_cap);
    free_ws(t);
    ft_pool_free(t->pool);
    free(t->wt);
    free(t->ws);
    free(t->mods);
    free(t->gu);
    free(t->gul);
    free(t->w);
    free(t->g);
    free(t->m1);
    free(t->m2);
    free(t);
}

float *ft_trainer_param_data(ft_trainer *t, size_t *n) { *n = t->np; return t->w; }
float *ft_trainer_grad_data(ft_trainer *t, size_t *n) { *n = t->np; return t->g; }
int ft_trainer_steps(const ft_trainer *t) { return t ? t->step : 0; }
size_t ft_trainer_param_count(const ft_trainer *t) { return t ? t->np : 0; }

static float *fz(size_t n) { return calloc(n ? n : 1, sizeof(float)); }

/* The cross-entropy's pass 2 reuses pass 1's logits instead of computing
 * them again when all of them take at most 64 MiB (short sequences: the
 * LM head's product once less per micro-batch) and no soft-cap rewrote
 * them; the values are the same either way. */
static int keep_logits(const ft_model_config *c, int nb, int T)
{
    return c->final_softcap == 0.0f && (uint64_t)nb * (uint64_t)T * (uint64_t)c->vocab * 4u <= (64u << 20);
}

static ft_status ensure(ft_trainer *t, int nb, int T)
{
    int R = nb * T;
    if (R <= t->cap_rows && T == t->cap_T && nb <= t->cap_nb) return FT_OK;
    free_ws(t);
    const ft_model_config *c = &t->cfg;
    size_t H = (size_t)c->hidden, qw = (size_t)c->n_heads * (size_t)c->head_dim,
           kw = (size_t)c->n_kv_heads * (size_t)c->head_dim, I = (size_t)c->ffn, r = (size_t)R;
    size_t wide = H > qw ? H : qw;
    if (I > wide) wide = I;
    const size_t E = (size_t)c->n_experts, K = (size_t)c->n_experts_used, F = (size_t)c->moe_ffn;
    if (F > wide) wide = F;
    if (E > wide) wide = E;
    size_t vc = (size_t)t->p.vocab_chunk < (size_t)c->vocab ? (size_t)t->p.vocab_chunk : (size_t)c->vocab;
    size_t half = (size_t)c->head_dim / 2;
    t->xs = fz(((size_t)c->n_layers + 1) * r * H);
    t->h1 = fz(r * H); t->q = fz(r * qw); t->k = fz(r * kw); t->v = fz(r * kw); t->att = fz(r * qw);
    /* what only some architectures use (ft_trainer_memory counts the same) */
    const size_t nq = c->qk_norm ? r : 0, ns = t->post || c->sandwich_norm ? r : 0,
                 ne = ft_wmat_present(ft_model_global(t->m, GW_PROJ_IN)) ? r * (size_t)t->E : 0;
    t->qr = fz(nq * qw); t->kr = fz(nq * kw);
    t->ao = fz(ns * H); t->fo = fz(ns * H); t->dsw = fz(ns * H);
    t->pin = fz(ne); t->hp = fz(ne); t->dhp = fz(ne);
    t->nw = fz(wide + kw);
    if (c->rope_local_theta != 0) {
        t->lcosT = fz((size_t)T * half);
        t->lsinT = fz((size_t)T * half);
    }
    t->x2 = fz(r * H); t->h2 = fz(r * H); t->gt = fz(r * I); t->up = fz(r * I); t->mm = fz(r * I);
    t->tmp = fz(r * wide);
    t->tmp2 = fz(r * wide);
    t->bt = fz((size_t)t->p.rank * wide);
    t->gbt = fz((size_t)t->p.rank * wide);
    t->P = fz((size_t)nb * (size_t)c->n_heads * (size_t)T * (size_t)T);
    for (int i = 0; i < NT; i++) t->tl[i] = fz(r * (size_t)t->p.rank);
    t->dt = fz(r * (size_t)t->p.rank);
    t->tls = fz(r * (size_t)t->p.rank);
    t->dx = fz(r * H); t->dx2 = fz(r * H); t->dh = fz(r * H); t->dq = fz(r * qw); t->dk = fz(r * kw);
    t->dv = fz(r * kw); t->datt = fz(r * qw); t->dgt = fz(r * I); t->dup = fz(r * I); t->dmm = fz(r * I);
    t->cosT = fz((size_t)T * half); t->sinT = fz((size_t)T * half);
    t->lchunk = fz(r * (vc + 64));   /* q8/q4 heads round the chunk to whole frame chunks */
    if (keep_logits(c, nb, T)) t->lall = fz(r * (size_t)c->vocab);   /* NULL: recomputed (no error) */
    t->ltgt = fz(r);
    t->lmax = calloc(r, sizeof(double));
    t->lsum = calloc(r, sizeof(double));
    size_t maxc = H > I ? H : I;
    if (qw > maxc) maxc = qw;
    if (F > maxc) maxc = F;
    if (E) {
        t->mprob = fz(r * E); t->mdl = fz(r * E);
        t->mwt = fz(r * K); t->mgwt = fz(r * K); t->mdw = fz(r * K);
        t->mx = fz(r * H); t->my = fz(r * H); t->mdy = fz(r * H); t->mdx = fz(r * H);
        t->mg = fz(r * F); t->mu = fz(r * F); t->mmx = fz(r * F); t->mdm = fz(r * F); t->mdg = fz(r * F);
        t->mdu = fz(r * F);
        const size_t ow = 2 * F > H ? 2 * F : H, rk = (size_t)t->p.rank;
        t->mtg = fz(r * rk); t->mtd = fz(r * rk); t->medt = fz(r * rk);
        t->meu = fz(r * ow); t->meb = fz(ow * rk); t->mebt = fz(ow * rk); t->megb = fz(ow * rk);
        t->midx = calloc(r * K, sizeof(int));
        t->mgrow = calloc(r * K, sizeof(int));
        t->mstart = calloc(E + 1, sizeof(int));
        if (!t->mprob || !t->mdl || !t->mwt || !t->mgwt || !t->mdw || !t->mx || !t->my || !t->mdy || !t->mdx ||
            !t->mg || !t->mu || !t->mmx || !t->mdm || !t->mdg || !t->mdu || !t->midx || !t->mgrow || !t->mstart ||
            !t->mtg || !t->mtd || !t->medt || !t->meu || !t->meb || !t->mebt || !t->megb) {
            free_ws(t);
            return ft_set_error(FT_ERR_NOMEM, "train: out of memory for the experts' activations");
        }
    }
    t->row_max = maxc;
    t->row_len = maxc * WT_B;
    t->row = fz(t->row_len * t->nthreads);
    if (t->p.dropout > 0.0f) {
        t->dmk = fz(r * maxc);
        t->dxd = fz(r * maxc);
        if (!t->dmk || !t->dxd) {
            free_ws(t);
            return ft_set_error(FT_ERR_NOMEM, "train: out of memory for the dropout masks of %d x %d tokens", nb, T);
        }
    }
    int ok = t->xs && t->h1 && t->q && t->k && t->v && t->att && t->x2 && t->h2 && t->gt && t->up && t->mm &&
             t->tmp && t->P && t->dt && t->tls && t->dx && t->dx2 && t->dh && t->dq && t->dk && t->dv && t->datt && t->dgt &&
             t->dup && t->dmm && t->tmp2 && t->bt && t->gbt && t->cosT && t->sinT && t->lchunk && t->ltgt && t->lmax && t->lsum && t->row &&
             t->qr && t->kr && t->ao && t->fo && t->dsw && t->nw && t->pin && t->hp && t->dhp &&
             (c->rope_local_theta == 0 || (t->lcosT && t->lsinT));
    for (int i = 0; i < NT; i++) ok = ok && t->tl[i];
    if (!ok) {
        free_ws(t);
        return ft_set_error(FT_ERR_NOMEM, "train: out of memory for the activations of %d x %d tokens", nb, T);
    }
    if (t->blk.pos == FT_POS_ROPE) ft_rope_tables(c, (size_t)T, t->cosT, t->sinT);
    if (c->rope_local_theta != 0) {   /* as the engine: the default RoPE with the local base */
        ft_model_config lc = *c;
        lc.rope_theta = c->rope_local_theta;
        lc.rope_type = FT_ROPE_DEFAULT;
        lc.rope_attention_factor = 1.0f;
        ft_rope_tables(&lc, (size_t)T, t->lcosT, t->lsinT);
    }
    t->cap_rows = R;
    t->cap_T = T;
    t->cap_nb = nb;
    return FT_OK;
}

uint64_t ft_trainer_memory(const ft_model_config *c, const ft_train_params *p, int nb, int T)
{
    if (!c || !p || nb < 1 || T < 1) return 0;
    /* what ft_trainer_create and ensure() allocate */
    uint64_t H = (uint64_t)c->hidden, qw = (uint64_t)c->n_heads * (uint64_t)c->head_dim,
             kw = (uint64_t)c->n_kv_heads * (uint64_t)c->head_dim, I = (uint64_t)c->ffn, r = (uint64_t)nb * (uint64_t)T,
             rk = (uint64_t)p->rank, L = (uint64_t)c->n_layers, E = (uint64_t)c->n_experts,
             K = (uint64_t)c->n_experts_used, F = (uint64_t)c->moe_ffn, half = (uint64_t)c->head_dim / 2;
    uint64_t wide = H > qw ? H : qw;
    if (I > wide) wide = I;
    if (F > wide) wide = F;
    if (E > wide) wide = E;
    uint64_t vc = (uint64_t)p->vocab_chunk < (uint64_t)c->vocab ? (uint64_t)p->vocab_chunk : (uint64_t)c->vocab;
    /* the adapters on the modules targeted (by any family's names; "all":
     * every module, an upper bound): weights, gradients, two moments, and
     * with gradient accumulation one micro-batch's gradient (a rank k > 0
     * of a data-parallel step holds one per micro-batch it computes: not
     * counted here) */
    unsigned tg = p->targets == FT_LORA_ALL ? 127u : p->targets & 127u;
    if (p->targets & FT_LORA_OUT) tg |= 1u << TO;
    if (p->targets & FT_LORA_FC1) tg |= 1u << TU;
    if (p->targets & FT_LORA_FC2) tg |= 1u << TD;
    if (p->targets & FT_LORA_QKV) tg |= 7u;
    if (p->targets & FT_LORA_GATE_UP) tg |= 3u << TG;
    uint64_t np = 0;
    for (int i = 0; i < NT; i++) {
        if (!(tg & (1u << i))) continue;
        int in, out;
        mod_shape(c, i, &in, &out);
        np += rk * (uint64_t)(in + out);
    }
    np *= L;
    /* the experts' adapters (PEFT's target_parameters) on each sparse layer */
    uint64_t nsparse = 0;
    for (int l = 0; E && l < c->n_layers; l++) nsparse += c->layer_moe[l] ? 1 : 0;
    if (E && (p->targets == FT_LORA_ALL || (p->targets & (FT_LORA_GATE_UP | FT_LORA_EXP_GATE_UP))))
        np += nsparse * E * rk * (H + 2 * F);
    if (E && (p->targets == FT_LORA_ALL || (p->targets & (FT_LORA_DOWN | FT_LORA_EXP_DOWN))))
        np += nsparse * E * rk * (F + H);
    uint64_t f = (p->grad_accum > 1 ? 5 : 4) * np;
    /* the layers' inputs, one layer's activations and gradients */
    const int post = c->arch == FT_ARCH_OPT && !c->do_layer_norm_before;
    const uint64_t nq = c->qk_norm ? r : 0, ns = post || c->sandwich_norm ? r : 0,
                   ne = c->word_embed_proj_dim > 0 && (uint64_t)c->word_embed_proj_dim != H
                            ? r * (uint64_t)c->word_embed_proj_dim : 0;
    f += (L + 1) * r * H;
    f += r * (6 * H + 5 * qw + 4 * kw + 6 * I + 2 * wide) + nq * (qw + kw) + 3 * ns * H + 3 * ne;
    f += 2 * rk * wide + wide + kw;
    f += (uint64_t)nb * (uint64_t)c->n_heads * (uint64_t)T * (uint64_t)T;
    f += (NT + 1) * r * rk + 4 * (uint64_t)T * half + r * (vc + 64) + 5 * r;
    if (keep_logits(c, nb, T)) f += r * (uint64_t)c->vocab;
    if (E) {
        const uint64_t ow = 2 * F > H ? 2 * F : H;
        f += r * (2 * E + 6 * K + 4 * H + 6 * F) + E + 1;
        f += 3 * r * rk + r * ow + 3 * ow * rk;   /* the experts' adapters: A x, B x, B_e, B_e^T, dB_e */
    }
    uint64_t maxc = H > I ? H : I;
    if (qw > maxc) maxc = qw;
    if (F > maxc) maxc = F;
    f += maxc * WT_B * (p->threads ? p->threads : ft_default_threads());
    if (p->dropout > 0.0f) f += 2 * r * maxc;   /* lora_dropout's factors and masked input */
    /* one matrix transposed (f32 at most: an LM-head chunk or the widest
     * layer matrix) */
    uint64_t wt = vc * H > I * H ? vc * H : I * H;
    if (qw * H > wt) wt = qw * H;
    f += wt;
    /* the products' workspace (q8/q4 activations, at most the f32 input) */
    f += r * wide;
    return f * sizeof(float);
}

typedef struct prod_job {
    float *y;
    int ldy;
    const ft_wk_act *a;
    const ft_wmat *W;
    int o0, o1;
    const float *b;
    int per;
} prod_job;

static void prod_task(void *arg, size_t i, unsigned worker)
{
    (void)worker;
    const prod_job *j = arg;
    int a = j->o0 + (int)i * j->per, e = a + j->per < j->o1 ? a + j->per : j->o1;
    ft_wk_product(j->y, j->ldy, j->a, j->W, a, e, j->b);
}

/* t->ws of at least need bytes */
static ft_status want_ws(ft_trainer *t, size_t need)
{
    if (need <= t->ws_cap) return FT_OK;
    free(t->ws);
    size_t n = (need + 63) / 64 * 64;
    t->ws = aligned_alloc(64, n);
    t->ws_cap = t->ws ? n : 0;
    if (!t->ws) return ft_set_error(FT_ERR_NOMEM, "train: out of memory for a product's workspace");
    return FT_OK;
}

/* With bf16 activations (FLEXTIER_BF16_ACTIVATIONS) on bf16 weights, the
 * products of at least GB_ROWS rows run on the bf16 GEMMs
 * (engine/gemm_bf16.h: the same operands as the engine's FT_WK_X_B16, x or
 * dy rounded to bf16, in a GEMM's order of sums) where the CPU has
 * AVX512_BF16; elsewhere the engine's products. */
enum { GB_ROWS = 16 };

static int gb_on = -1;   /* -1: FLEXTIER_TRAIN_GEMM not read yet ("0": off) */

int ft_tr_gemm(void)
{
    int v = __atomic_load_n(&gb_on, __ATOMIC_RELAXED);
    if (v < 0) {
        const char *e = getenv("FLEXTIER_TRAIN_GEMM");
        v = !(e && strcmp(e, "0") == 0);
        __atomic_store_n(&gb_on, v, __ATOMIC_RELAXED);
    }
    return v;
}

void ft_tr_set_gemm(int on) { __atomic_store_n(&gb_on, on ? 1 : 0, __ATOMIC_RELAXED); }

static int use_gb(const ft_wmat *W, int rows)
{
    return W->fmt == FT_WF_BF16 && rows >= GB_ROWS && ft_wk_bf16_activations() && ft_gb_simd() && ft_tr_gemm();
}

typedef struct gb_job {
    int nn;
    float *c;
    int ldc;
    const uint16_t *a;
    int lda, rows;
    const ft_wmat *W;
    int n0, n1, per;
    const float *b;
} gb_job;

static void gb_task(void *arg, size_t i, unsigned worker)
{
    (void)worker;
    const gb_job *j = arg;
    int a = j->n0 + (int)i * j->per, e = a + j->per < j->n1 ? a + j->per : j->n1;
    if (j->nn) ft_gb_nn(j->c, j->ldc, j->a, j->lda, j->rows, j->W->data, j->W->cols, j->W->rows, a, e, NULL, 1);
    else ft_gb_nt(j->c, j->ldc, j->a, j->lda, j->rows, j->W->data, j->W->cols, j->W->cols, a, e, j->b, 0);
}

/* nt: c (ldc) = x W^T (+ b) for outputs [n0, n1); nn: c (ldc) += x W
 * (x: rows x W->rows, outputs all W->cols) */
static ft_status gb_prod(ft_trainer *t, int nn, float *c, int ldc, const float *x, int ldx, int rows, const ft_wmat *W,
                         int n0, int n1, const float *b)
{
    const int K = nn ? W->rows : W->cols, lda = ft_gb_lda(K);
    TRY(want_ws(t, (size_t)rows * (size_t)lda * sizeof(uint16_t)));
    ft_gb_round(t->ws, lda, x, ldx, rows, K);
    /* outputs split over the threads in blocks of 64 (the kernel's): each
     * output's sums are the same whatever the split */
    size_t n = (size_t)(n1 - n0), per = (n + (size_t)t->nthreads * 4 - 1) / ((size_t)t->nthreads * 4);
    per = (per + 63) / 64 * 64;
    gb_job j = {nn, c, ldc, t->ws, lda, rows, W, n0, n1, (int)per, b};
    ft_pool_run(n > per ? t->pool : NULL, (n + per - 1) / per, gb_task, &j);
    return FT_OK;
}

/* y (ldy) = x W^T (+ b) for output rows [o0, o1), on W as stored */
static ft_status prod(ft_trainer *t, float *y, int ldy, const float *x, int rows, const ft_wmat *W, int o0, int o1,
                      const float *b)
{
    if (use_gb(W, rows)) return gb_prod(t, 0, y, ldy, x, W->cols, rows, W, o0, o1, b);
    size_t need = ft_wk_ws_size(W, rows);
    TRY(want_ws(t, need));
    ft_wk_act a;
    TRY(ft_wk_prep(&a, need ? t->ws : NULL, need ? t->ws_cap : 0, W, x, rows));
    /* output rows split over the threads: any split computes the same values */
    prod_job j = {y, ldy, &a, W, o0, o1, b, 0};
    size_t n = (size_t)(o1 - o0), per = (n + (size_t)t->nthreads * 4 - 1) / ((size_t)t->nthreads * 4);
    if (per < 16) per = 16;
    j.per = (int)per;
    ft_pool_run(n > per ? t->pool : NULL, (n + per - 1) / per, prod_task, &j);
    return FT_OK;
}

typedef struct matT_job {
    float *dx;
    int ldx;
    const float *dy;
    int ldy, rows;
    const ft_wmat *W;
    int o0, o1;
    float *row;
    size_t row_len;
} matT_job;

static void matT_task(void *arg, size_t i, unsigned worker)
{
    const matT_job *j = arg;
    int r0 = (int)i * 32, n = j->rows - r0 < 32 ? j->rows - r0 : 32;
    ft_tr_matT(j->dx + (size_t)r0 * (size_t)j->ldx, j->ldx, j->dy + (size_t)r0 * (size_t)j->ldy, j->ldy, n, j->W,
               j->o0, j->o1, j->row + (size_t)worker * j->row_len);
}

/* ft_tr_matT over blocks of 32 rows in parallel (each row's sums in the same order) */
static void matT_axpy(ft_trainer *t, float *dx, int ldx, const float *dy, int ldy, int rows, const ft_wmat *W, int o0,
                      int o1)
{
    matT_job j = {dx, ldx, dy, ldy, rows, W, o0, o1, t->row, t->row_len};
    size_t nb = (size_t)(rows + 31) / 32;
    ft_pool_run(nb > 1 ? t->pool : NULL, nb, matT_task, &j);
}

typedef struct wt_job { const ft_wmat *W; void *wt; float *row; size_t row_len; } wt_job;

/* 16-bit matrices: rows of W per task, so that each task writes whole
 * 64-byte lines of W^T (two 16 x 16 tiles side by side; half lines,
 * finished by another task later, were read for ownership twice) */
enum { WT_H = 32 };

/* rows [i WT_B, i WT_B + WT_B) of W into columns of W^T, in tiles of
 * WT_B x WT_B (each W^T row gets WT_B contiguous values per task) */
static void wt_task(void *arg, size_t i, unsigned worker)
{
    const wt_job *j = arg;
    const ft_wmat *W = j->W;
    const size_t R = (size_t)W->rows, C = (size_t)W->cols;
    if (W->fmt == FT_WF_BF16 || W->fmt == FT_WF_F16) {   /* 16-bit: transposed as stored */
        const size_t h0 = i * WT_H, h1 = R - h0 < WT_H ? R : h0 + WT_H;
        for (size_t c0 = 0; c0 < C; c0 += WT_B)
            for (size_t o0 = h0; o0 < h1; o0 += WT_B)
                ft_tr_transpose16((uint16_t *)j->wt + c0 * R + o0, R, (const uint16_t *)W->data + o0 * C + c0, C,
                                  (int)(h1 - o0 < WT_B ? h1 - o0 : WT_B), (int)(C - c0 < WT_B ? C - c0 : WT_B));
        return;
    }
    const size_t o0 = i * WT_B, n = R - o0 < WT_B ? R - o0 : WT_B;
    const float *src;
    if (W->fmt == FT_WF_F32) {
        src = (const float *)W->data + o0 * C;
    } else {   /* q8/q4: dequantized as ft_wmat_row_f32 does, WT_B rows at a time */
        float *row = j->row + (size_t)worker * j->row_len;
        for (size_t o = 0; o < n; o++) ft_wmat_row_f32(W, (int)(o0 + o), row + o * C);
        src = row;
    }
    float *dst = (float *)j->wt + o0;
    for (size_t c0 = 0; c0 < C; c0 += WT_B) {
        size_t c1 = c0 + WT_B < C ? c0 + WT_B : C;
        for (size_t c = c0; c < c1; c++)
            for (size_t o = 0; o < n; o++) dst[c * R + o] = src[o * C + c];
    }
}

/* dx (R x W->cols) += dy (R x W->rows) W: W transposed, then the
 * forward's product on W^T: bf16/f16 weights stay in their format (the
 * engine's bf16/f16 kernels, exact products, f32 sums), f32 as it is,
 * q8/q4 dequantized to f32 (ft_wmat_row_f32; their groups run along the
 * input dimension, which the transpose turns). Memory: one matrix at a
 * time. */
ft_status ft_tr_matT_fast(ft_trainer *t, float *dx, const float *dy, int R, const ft_wmat *W)
{
    int half = W->fmt == FT_WF_BF16 || W->fmt == FT_WF_F16;
    size_t need = (size_t)W->rows * (size_t)W->cols * (half ? 2 : 4);
    if (need > t->wt_cap) {
        free(t->wt);
        t->wt = aligned_alloc(64, (need + 63) / 64 * 64);
        t->wt_cap = t->wt ? need : 0;
        if (!t->wt) return ft_set_error(FT_ERR_NOMEM, "train: out of memory for a transposed matrix");
    }
    wt_job wj = {W, t->wt, t->row, t->row_len};
    const size_t per = half ? WT_H : WT_B;
    ft_pool_run(t->pool, ((size_t)W->rows + per - 1) / per, wt_task, &wj);
    ft_wmat M = {half ? W->fmt : FT_WF_F32, W->cols, W->rows, t->wt, 0, 0, NULL};
    float *y = t->tmp2;
    ft_status st = prod(t, y, W->cols, dy, R, &M, 0, W->cols, NULL);
    if (st) return st;
    for (size_t k = 0; k < (size_t)R * (size_t)W->cols; k++) dx[k] += y[k];
    return FT_OK;
}

static ft_status matT(ft_trainer *t, float *dx, int ldx, const float *dy, int ldy, int rows, const ft_wmat *W, int o0,
                      int o1)
{
    if (o0 == 0 && o1 == W->rows && use_gb(W, rows))   /* dx += dy W on W as stored */
        return gb_prod(t, 1, dx, ldx, dy, ldy, rows, W, 0, W->cols, NULL);
    /* the fast path needs whole, contiguous operands and room in tmp2 */
    if (o0 == 0 && o1 == W->rows && ldx == W->cols && ldy == W->rows && rows <= t->cap_rows &&
        (size_t)W->cols <= t->row_max)
        return ft_tr_matT_fast(t, dx, dy, rows, W);
    matT_axpy(t, dx, ldx, dy, ldy, rows, W, o0, o1);
    return FT_OK;
}

/* lora_dropout as PEFT applies it: the adapter sees dropout(x), x times
 * a mask of 0 (probability p) and 1 / (1 - p), computed as torch's
 * nn.Dropout in training; the base product sees x. The masks come from a
 * counter-based hash, not a generator's stream, so the backward pass (and
 * its recompute) makes the forward's mask again, and a mask depends only
 * on (seed, optimizer step, micro-batch of the step, layer, module,
 * row b * T + position, column): the same for any number of threads or
 * data-parallel processes, and made again in Python by
 * scripts/fixtures/gen_lora_fixtures.py --dropout (docs/training.md).
 * A module's id is its slot (q k v o gate up down = 0..6; OPT's out_proj,
 * fc1, fc2 = 3, 5, 6); phi3's fused qkv_proj / gate_up_proj have one mask,
 * q's and gate's. */
#define DROP_GOLD 0x9E3779B97F4A7C15ull
static uint64_t drop_mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

uint64_t ft_tr_dropout_key(uint64_t seed, int step, int micro_batch)
{
    return drop_mix(drop_mix(seed + DROP_GOLD * (1u + (uint64_t)step)) + DROP_GOLD * (1u + (uint64_t)micro_batch));
}

void ft_tr_dropout_mask(uint64_t key, int layer, int module, float p, int rows, int cols, float *mk)
{
    const uint64_t k = drop_mix(key + DROP_GOLD * (1u + (uint64_t)layer * NT + (uint64_t)module));
    const uint64_t thr = (uint64_t)((double)p * 16777216.0);
    const float keep = 1.0f / (1.0f - p);
    const size_t n = (size_t)rows * (size_t)cols;
    for (size_t e = 0; e < n; e++) mk[e] = (drop_mix(k + DROP_GOLD * (1u + (uint64_t)e)) >> 40) < thr ? 0.0f : keep;
}

/* x masked for module i of layer l into t->dxd (the factors in t->dmk) */
static const float *dropped_input(ft_trainer *t, int l, int i, const float *x, int R, int in)
{
    const lmod *md = &t->mods[(size_t)l * NT + (size_t)i];
    int id = !md->shared ? i : (i == TK || i == TV) ? TQ : TG;
    ft_tr_dropout_mask(t->drop_key, l, id, t->p.dropout, R, in, t->dmk);
    const size_t n = (size_t)R * (size_t)in;
    for (size_t e = 0; e < n; e++) t->dxd[e] = x[e] * t->dmk[e];
    return t->dxd;
}

static void lora_fwd_prods(ft_trainer *t, const float *A, const float *B, const float *x, int n, int in, int out,
                           float *tl, float *bt, float *u);

/* y = W x (+ b) + s B (A x) for layer l's module i; saves A x in tl[i] */
static ft_status lin_fwd(ft_trainer *t, int l, int i, const float *x, int R, float *y)
{
    const ft_layer_weights *lw = lw_of(t, l);
    const ft_wmat *W = wmat(lw, tslot[i]);
    TRY(prod(t, y, W->rows, x, R, W, 0, W->rows, wvec(lw, tbias[i])));
    const lmod *md = &t->mods[(size_t)l * NT + (size_t)i];
    if (!md->on) return FT_OK;
    const int in = md->in, out = md->out;
    if (t->dropping) x = dropped_input(t, l, i, x, R, in);
    float *u = t->tmp2;
    lora_fwd_prods(t, t->w + md->a, t->w + md->b, x, R, in, out, t->tl[i], t->bt, u);
    for (size_t k = 0; k < (size_t)R * (size_t)out; k++) y[k] += u[k] * t->scale;
    return FT_OK;
}

/* The half of a LoRA backward that adapters of every kind share, on n
 * rows with the forward's tl = x A^T (n x rk) and the output's gradient
 * dy (n x out), B out x rk: dt = s dy B (n x rk; B^T into bt as a matrix
 * of its own) and gbt = s tl^T dy (rk x out: dB transposed, summed along
 * out). */
typedef struct acc_job {
    float *C;
    int ldc;
    const float *P;
    int psm, psk, M, K;
    const float *Q;
    int ldq, N, per;
} acc_job;

static void acc_task(void *arg, size_t i, unsigned worker)
{
    (void)worker;
    const acc_job *j = arg;
    int a = (int)i * j->per, e = a + j->per < j->N ? a + j->per : j->N;
    ft_tr_acc(j->C, j->ldc, j->P, j->psm, j->psk, j->M, j->K, j->Q, j->ldq, a, e);
}

/* ft_tr_acc over columns [0, N), split over the threads in blocks of 64 */
static void acc_par(ft_trainer *t, float *C, int ldc, const float *P, int psm, int psk, int M, int K, const float *Q,
                    int ldq, int N)
{
    size_t per = ((size_t)N + (size_t)t->nthreads * 2 - 1) / ((size_t)t->nthreads * 2);
    per = (per + 63) / 64 * 64;
    acc_job j = {C, ldc, P, psm, psk, M, K, Q, ldq, N, (int)per};
    size_t nt = ((size_t)N + per - 1) / per;
    ft_pool_run(nt > 1 ? t->pool : NULL, nt, acc_task, &j);
}

typedef struct dots_job {
    float *C;
    int ldc;
    const float *P;
    int ldp, M;
    const float *Q;
    int ldq, N, K, per;
} dots_job;

static void dots_task(void *arg, size_t i, unsigned worker)
{
    (void)worker;
    const dots_job *j = arg;
    int a = (int)i * j->per, e = a + j->per < j->M ? a + j->per : j->M;
    ft_tr_dots(j->C, j->ldc, j->P, j->ldp, a, e, j->Q, j->ldq, j->N, j->K);
}

/* ft_tr_dots over rows [0, M), split over the threads in blocks of 6 */
static void dots_par(ft_trainer *t, float *C, int ldc, const float *P, int ldp, int M, const float *Q, int ldq, int N,
                     int K)
{
    size_t per = ((size_t)M + (size_t)t->nthreads * 2 - 1) / ((size_t)t->nthreads * 2);
    per = (per + 5) / 6 * 6;
    dots_job j = {C, ldc, P, ldp, M, Q, ldq, N, K, (int)per};
    size_t nt = ((size_t)M + per - 1) / per;
    ft_pool_run(nt > 1 ? t->pool : NULL, nt, dots_task, &j);
}

/* a LoRA's two forward products on n rows: tl = x A^T (A rk x in), then
 * u = tl B^T (B out x rk; B^T into bt, rk x out) */
static void lora_fwd_prods(ft_trainer *t, const float *A, const float *B, const float *x, int n, int in, int out,
                           float *tl, float *bt, float *u)
{
    const int rk = t->p.rank;
    dots_par(t, tl, rk, x, in, n, A, in, rk, in);
    for (int o = 0; o < out; o++)
        for (int j = 0; j < rk; j++) bt[(size_t)j * (size_t)out + (size_t)o] = B[(size_t)o * (size_t)rk + (size_t)j];
    memset(u, 0, (size_t)n * (size_t)out * sizeof(float));
    acc_par(t, u, out, tl, rk, 1, n, rk, bt, out, out);
}

static ft_status lora_bwd_dt(ft_trainer *t, const float *B, const float *tl, const float *dy, int n, int out,
                             float *dt, float *bt, float *gbt)
{
    const int rk = t->p.rank;
    const float s = t->scale;
    for (int o = 0; o < out; o++)
        for (int j = 0; j < rk; j++) bt[(size_t)j * (size_t)out + (size_t)o] = B[(size_t)o * (size_t)rk + (size_t)j];
    dots_par(t, dt, rk, dy, out, n, bt, out, rk, out);
    for (size_t k = 0; k < (size_t)n * (size_t)rk; k++) dt[k] *= s;
    /* gbt[j] += (s tl[r][j]) dy[r] for r in order (an axpy per r) */
    memset(gbt, 0, (size_t)rk * (size_t)out * sizeof(float));
    for (size_t k = 0; k < (size_t)n * (size_t)rk; k++) t->tls[k] = s * tl[k];
    acc_par(t, gbt, out, t->tls, 1, rk, rk, n, dy, out, out);
    return FT_OK;
}

/* dA += dt^T x, dx += dt A (A rk x in): per output the axpys' order (r
 * for dA, j for dx) */
static void lora_bwd_ax(ft_trainer *t, float *gA, float *dx, const float *A, const float *x, const float *dt, int n,
                        int rk, int in)
{
    acc_par(t, gA, in, dt, 1, rk, rk, n, x, in, in);
    acc_par(t, dx, in, dt, rk, 1, n, rk, A, in, in);
}

/* dx += W^T dy + A^T dt, and the adapter's gradients (x, tl[i] from the forward) */
static ft_status lin_bwd(ft_trainer *t, int l, int i, const float *x, const float *dy, int R, float *dx)
{
    const ft_wmat *W = wmat(lw_of(t, l), tslot[i]);
    TRY(matT(t, dx, W->cols, dy, W->rows, R, W, 0, W->rows));
    const lmod *md = &t->mods[(size_t)l * NT + (size_t)i];
    if (!md->on) return FT_OK;
    const int rk = t->p.rank, in = md->in, out = md->out;
    const float *A = t->w + md->a, *B = t->w + md->b, *tl = t->tl[i];
    float *gA = t->g + md->a, *gB = t->g + md->b, *dt = t->dt, *gbt = t->gbt;
    const ft_kernels *kk = ft_k_get();
    TRY(lora_bwd_dt(t, B, tl, dy, R, out, dt, t->bt, gbt));
    for (int o = 0; o < out; o++)
        for (int j = 0; j < rk; j++) gB[(size_t)o * (size_t)rk + (size_t)j] += gbt[(size_t)j * (size_t)out + (size_t)o];
    if (!t->dropping) {
        lora_bwd_ax(t, gA, dx, A, x, dt, R, rk, in);
        return FT_OK;
    }
    /* with dropout x is the masked input and dx gets the mask times dt A
     * (the mask is the forward's, made again) */
    x = dropped_input(t, l, i, x, R, in);
    for (int r = 0; r < R; r++) {
        const float *xr = x + (size_t)r * (size_t)in, *dtr = dt + (size_t)r * (size_t)rk;
        float *dxr = dx + (size_t)r * (size_t)in;
        for (int j = 0; j < rk; j++) kk->axpy(gA + (size_t)j * (size_t)in, dtr[j], xr, in);
        float *u = t->row;   /* dt A for this row, then through the mask */
        memset(u, 0, (size_t)in * sizeof(float));
        for (int j = 0; j < rk; j++) kk->axpy(u, dtr[j], A + (size_t)j * (size_t)in, in);
        const float *mk = t->dmk + (size_t)r * (size_t)in;
        for (int c = 0; c < in; c++) dxr[c] += mk[c] * u[c];
    }
    return FT_OK;
}

/* attention over (sequence, kv head) tasks: disjoint outputs */
typedef struct attn_job { ft_trainer *t; int nb, T, win; float scale, cap; } attn_job;

static attn_job attn_of(ft_trainer *t, int l, int nb, int T)
{
    const ft_model_config *c = &t->cfg;
    attn_job j = {t, nb, T, ft_model_config_layer_window(c, l),
                  c->attn_scale != 0 ? c->attn_scale : 1.0f / sqrtf((float)c->head_dim), c->attn_softcap};
    return j;
}

/* the RoPE tables of layer l (gemma3's sliding layers: the local ones) */
static void rope_tabs(const ft_trainer *t, int l, const float **cs, const float **sn)
{
    int local = t->lcosT && t->cfg.layer_sliding[l];
    *cs = local ? t->lcosT : t->cosT;
    *sn = local ? t->lsinT : t->sinT;
}

static void attn_fwd_task(void *arg, size_t i, unsigned worker)
{
    (void)worker;
    const attn_job *j = arg;
    const ft_trainer *t = j->t;
    const ft_model_config *c = &t->cfg;
    int b = (int)(i / (size_t)c->n_kv_heads), g = (int)(i % (size_t)c->n_kv_heads), T = j->T;
    size_t qw = (size_t)c->n_heads * (size_t)c->head_dim, kw = (size_t)c->n_kv_heads * (size_t)c->head_dim;
    size_t r0 = (size_t)b * (size_t)T;
    ft_tr_attn_fwd_g(t->att + r0 * qw, t->P + (size_t)b * (size_t)c->n_heads * (size_t)T * (size_t)T, t->q + r0 * qw,
                     t->k + r0 * kw, t->v + r0 * kw, T, c->n_heads, c->n_kv_heads, c->head_dim, j->win, g, g + 1, j->scale, j->cap);
}

static void attn_bwd_task(void *arg, size_t i, unsigned worker)
{
    (void)worker;
    const attn_job *j = arg;
    const ft_trainer *t = j->t;
    const ft_model_config *c = &t->cfg;
    int b = (int)(i / (size_t)c->n_kv_heads), g = (int)(i % (size_t)c->n_kv_heads), T = j->T;
    size_t qw = (size_t)c->n_heads * (size_t)c->head_dim, kw = (size_t)c->n_kv_heads * (size_t)c->head_dim;
    size_t r0 = (size_t)b * (size_t)T;
    ft_tr_attn_bwd_g(t->dq + r0 * qw, t->dk + r0 * kw, t->dv + r0 * kw, t->datt + r0 * qw,
                     t->P + (size_t)b * (size_t)c->n_heads * (size_t)T * (size_t)T, t->q + r0 * qw, t->k + r0 * kw,
                     t->v + r0 * kw, T, c->n_heads, c->n_kv_heads, c->head_dim, j->win, g, g + 1, j->scale, j->cap);
}

/* the architecture's norm (RMSNorm, or LayerNorm with a bias) over R rows
 * of hidden, and its backward (dx += ...) */
/* gemma's RMSNorm weights act as (1 + w): into t->nw (n <= its size) */
static const float *nweights(ft_trainer *t, const float *w, int n)
{
    if (!t->cfg.norm_plus_one || !w) return w;
    for (int i = 0; i < n; i++) t->nw[i] = 1.0f + w[i];
    return t->nw;
}

/* per-row and element-wise work split over the threads: every row or
 * element is computed as alone, so the split changes no value */
typedef struct ew_job {
    ft_trainer *t;
    int kind;   /* EW_* */
    float *o0, *o1;
    const float *i0, *i1, *i2, *w, *b;
    size_t n, per;
} ew_job;

enum { EW_NORM_FWD, EW_NORM_BWD, EW_SILU_BWD, EW_GELU_BWD, EW_GATE };

static void ffn_gate(const ft_model_config *c, float *m, const float *g, const float *u, size_t n);

static void ew_task(void *arg, size_t i, unsigned worker)
{
    (void)worker;
    const ew_job *j = arg;
    ft_trainer *t = j->t;
    const size_t a = i * j->per, e = a + j->per < j->n ? a + j->per : j->n;
    const int H = t->cfg.hidden;
    const ft_kernels *k = ft_k_get();
    switch (j->kind) {
    case EW_NORM_FWD:
        for (size_t r = a; r < e; r++) {
            const size_t o = r * (size_t)H;
            if (t->blk.norm == FT_NORM_RMS) k->rmsnorm(j->o0 + o, j->i0 + o, j->w, H, t->cfg.norm_eps);
            else k->layernorm(j->o0 + o, j->i0 + o, j->w, j->b, H, t->cfg.norm_eps);
        }
        break;
    case EW_NORM_BWD:
        for (size_t r = a; r < e; r++) {
            const size_t o = r * (size_t)H;
            if (t->blk.norm == FT_NORM_RMS) ft_tr_rmsnorm_bwd(j->o0 + o, j->i0 + o, j->w, j->i1 + o, H, t->cfg.norm_eps);
            else ft_tr_layernorm_bwd(j->o0 + o, j->i0 + o, j->w, j->i1 + o, H, t->cfg.norm_eps);
        }
        break;
    case EW_SILU_BWD: ft_tr_silu_mul_bwd(j->o0 + a, j->o1 + a, j->i0 + a, j->i1 + a, j->i2 + a, (int)(e - a)); break;
    case EW_GELU_BWD: ft_tr_gelu_mul_bwd(j->o0 + a, j->o1 + a, j->i0 + a, j->i1 + a, j->i2 + a, (int)(e - a)); break;
    default: ffn_gate(&t->cfg, j->o0 + a, j->i0 + a, j->i1 + a, e - a); break;
    }
}

/* n rows or elements, in pieces of at least `min` */
static void ew_run(ft_trainer *t, ew_job *j, size_t min)
{
    j->t = t;
    size_t per = (j->n + (size_t)t->nthreads * 2 - 1) / ((size_t)t->nthreads * 2);
    j->per = per < min ? min : per;
    size_t nt = (j->n + j->per - 1) / j->per;
    ft_pool_run(nt > 1 ? t->pool : NULL, nt, ew_task, j);
}

static void norm_fwd(ft_trainer *t, float *out, const float *in, int R, const float *w, const float *b)
{
    ew_job j = {0};
    j.kind = EW_NORM_FWD;
    j.o0 = out;
    j.i0 = in;
    j.w = nweights(t, w, t->cfg.hidden);
    j.b = b;
    j.n = (size_t)R;
    ew_run(t, &j, 4);
}

static void norm_bwd(ft_trainer *t, float *dx, const float *x, int R, const float *w, const float *dy)
{
    ew_job j = {0};
    j.kind = EW_NORM_BWD;
    j.o0 = dx;
    j.i0 = x;
    j.i1 = dy;
    j.w = nweights(t, w, t->cfg.hidden);
    j.n = (size_t)R;
    ew_run(t, &j, 4);
}

/* the gated FFN's backward (SwiGLU or GeGLU) over n elements */
static void gate_bwd(ft_trainer *t, float *dg, float *du, const float *g, const float *u, const float *dy, size_t n)
{
    ew_job j = {0};
    j.kind = t->cfg.act == FT_ACT_GELU_TANH ? EW_GELU_BWD : EW_SILU_BWD;
    j.o0 = dg;
    j.o1 = du;
    j.i0 = g;
    j.i1 = u;
    j.i2 = dy;
    j.n = n;
    ew_run(t, &j, 4096);
}

/* m = act(g) * u over n elements */
static void gate_fwd(ft_trainer *t, float *m, const float *g, const float *u, size_t n)
{
    ew_job j = {0};
    j.kind = EW_GATE;
    j.o0 = m;
    j.i0 = g;
    j.i1 = u;
    j.n = n;
    ew_run(t, &j, 4096);
}

static const float *gvec(const ft_trainer *t, int slot)
{
    const ft_wmat *g = ft_model_global(t->m, slot);
    return g ? (const float *)g->data : NULL;
}

/* RMSNorm of q and k (qk_norm 1: each head over head_dim, qwen3; 2: the
 * whole projection, olmoe), before RoPE; the inputs kept in qr, kr */
static void qk_norm_fwd(ft_trainer *t, const ft_layer_weights *lw, int R)
{
    const ft_model_config *c = &t->cfg;
    const ft_kernels *k = ft_k_get();
    const size_t qw = (size_t)c->n_heads * (size_t)c->head_dim, kw = (size_t)c->n_kv_heads * (size_t)c->head_dim;
    const int nq = c->qk_norm == 1 ? c->head_dim : (int)qw, nk = c->qk_norm == 1 ? c->head_dim : (int)kw;
    memcpy(t->qr, t->q, (size_t)R * qw * sizeof(float));
    memcpy(t->kr, t->k, (size_t)R * kw * sizeof(float));
    const float *w = nweights(t, wvec(lw, LW_QNORM), nq);
    for (size_t i = 0; i < (size_t)R * qw; i += (size_t)nq) k->rmsnorm(t->q + i, t->qr + i, w, nq, c->norm_eps);
    w = nweights(t, wvec(lw, LW_KNORM), nk);
    for (size_t i = 0; i < (size_t)R * kw; i += (size_t)nk) k->rmsnorm(t->k + i, t->kr + i, w, nk, c->norm_eps);
}

/* dq, dk (after the norms) -> before them */
static void qk_norm_bwd(ft_trainer *t, const ft_layer_weights *lw, int R)
{
    const ft_model_config *c = &t->cfg;
    const size_t qw = (size_t)c->n_heads * (size_t)c->head_dim, kw = (size_t)c->n_kv_heads * (size_t)c->head_dim;
    const int nq = c->qk_norm == 1 ? c->head_dim : (int)qw, nk = c->qk_norm == 1 ? c->head_dim : (int)kw;
    float *d = t->tmp;   /* R x wide floats, free here */
    memset(d, 0, (size_t)R * qw * sizeof(float));
    const float *w = nweights(t, wvec(lw, LW_QNORM), nq);
    for (size_t i = 0; i < (size_t)R * qw; i += (size_t)nq)
        ft_tr_rmsnorm_bwd(d + i, t->qr + i, w, t->dq + i, nq, c->norm_eps);
    memcpy(t->dq, d, (size_t)R * qw * sizeof(float));
    memset(d, 0, (size_t)R * kw * sizeof(float));
    w = nweights(t, wvec(lw, LW_KNORM), nk);
    for (size_t i = 0; i < (size_t)R * kw; i += (size_t)nk)
        ft_tr_rmsnorm_bwd(d + i, t->kr + i, w, t->dk + i, nk, c->norm_eps);
    memcpy(t->dk, d, (size_t)R * kw * sizeof(float));
}

static int moe_layer(const ft_trainer *t, int l) { return t->cfg.n_experts && t->cfg.layer_moe[l]; }

/* expert e's B of the expert LoRA md (PEFT's B [out][E r], expert e's
 * column j at j E + e) into t->meb as an [out][r] matrix */
static void exp_gather_b(ft_trainer *t, const lmod *md, int e)
{
    const int rk = t->p.rank, E = md->ne, out = md->fused_out ? md->fused_out : md->out;
    const float *B = t->w + md->b;
    for (int o = 0; o < out; o++)
        for (int j = 0; j < rk; j++)
            t->meb[(size_t)o * (size_t)rk + (size_t)j] = B[(size_t)o * (size_t)E * (size_t)rk + (size_t)j * (size_t)E + (size_t)e];
}

/* expert e's LoRA md on its n rows x: tl = x A_e^T (n x r), t->meu =
 * tl B_e^T (n x out, unscaled) */
static ft_status exp_lora_fwd(ft_trainer *t, const lmod *md, int e, const float *x, int n, float *tl)
{
    const int rk = t->p.rank, in = md->in, out = md->fused_out ? md->fused_out : md->out;
    exp_gather_b(t, md, e);
    lora_fwd_prods(t, t->w + md->a + (size_t)e * (size_t)rk * (size_t)in, t->meb, x, n, in, out, tl, t->mebt, t->meu);
    return FT_OK;
}

/* the backward of expert e's LoRA md on its n rows: x its input, tl the
 * forward's x A_e^T, dy (n x out) the output's gradient: A_e's and B_e's
 * gradients (B_e's scattered to PEFT's columns), dx += s dy B_e A_e */
static ft_status exp_lora_bwd(ft_trainer *t, const lmod *md, int e, const float *x, const float *tl, const float *dy,
                              int n, float *dx)
{
    const int rk = t->p.rank, in = md->in, E = md->ne, out = md->fused_out ? md->fused_out : md->out;
    const size_t ao = (size_t)e * (size_t)rk * (size_t)in;
    const float *A = t->w + md->a + ao;
    float *gA = t->g + md->a + ao, *gB = t->g + md->b, *dt = t->medt, *gb = t->megb;
    exp_gather_b(t, md, e);
    TRY(lora_bwd_dt(t, t->meb, tl, dy, n, out, dt, t->mebt, gb));
    /* dB_e^T into B's columns j E + e */
    for (int o = 0; o < out; o++)
        for (int j = 0; j < rk; j++)
            gB[(size_t)o * (size_t)E * (size_t)rk + (size_t)j * (size_t)E + (size_t)e] += gb[(size_t)j * (size_t)out + (size_t)o];
    lora_bwd_ax(t, gA, dx, A, x, dt, n, rk, in);
    return FT_OK;
}

/* expert e of layer l's SwiGLU on its n gathered rows (t->mx): t->mg, mu,
 * mm, my; with LoRA on the experts (PEFT's target_parameters: W_e + s B_e
 * A_e) gate and up get rows [0, F) and [F, 2F) of the fused gate_up
 * adapter's s B_e (A_e x) (A_e x kept in mtg), my the down adapter's (mtd) */
static ft_status expert_fwd(ft_trainer *t, const ft_layer_weights *lw, int l, int e, int n)
{
    const ft_model_config *c = &t->cfg;
    const ft_wmat *g = &lw->experts[3 * e + LW_EXP_GATE], *u = &lw->experts[3 * e + LW_EXP_UP],
                  *d = &lw->experts[3 * e + LW_EXP_DOWN];
    const int F = c->moe_ffn, H = c->hidden;
    const lmod *mgu = &t->mods[(size_t)l * NT + TG], *mdn = &t->mods[(size_t)l * NT + TD];
    const float s = t->scale;
    if (!ft_wmat_present(g) || !ft_wmat_present(u) || !ft_wmat_present(d))
        return ft_set_error(FT_ERR_UNSUPPORTED, "train: expert %d is not in memory", e);
    TRY(prod(t, t->mg, F, t->mx, n, g, 0, F, NULL));
    TRY(prod(t, t->mu, F, t->mx, n, u, 0, F, NULL));
    if (mgu->on) {
        TRY(exp_lora_fwd(t, mgu, e, t->mx, n, t->mtg));
        for (int i = 0; i < n; i++) {
            const float *v = t->meu + (size_t)i * 2 * (size_t)F;
            float *gr = t->mg + (size_t)i * (size_t)F, *ur = t->mu + (size_t)i * (size_t)F;
            for (int f = 0; f < F; f++) {
                gr[f] += v[f] * s;
                ur[f] += v[F + f] * s;
            }
        }
    }
    for (size_t i = 0; i < (size_t)n * (size_t)F; i++) t->mmx[i] = t->mg[i] / (1.0f + expf(-t->mg[i])) * t->mu[i];
    TRY(prod(t, t->my, H, t->mmx, n, d, 0, H, NULL));
    if (mdn->on) {
        TRY(exp_lora_fwd(t, mdn, e, t->mmx, n, t->mtd));
        for (size_t i = 0; i < (size_t)n * (size_t)H; i++) t->my[i] += t->meu[i] * s;
    }
    return FT_OK;
}

/* the experts the routes select made present, when the layer's supplier
 * streams them on demand (ft_layer_weights.fetch_experts) */
static ft_status moe_fetch(ft_trainer *t, const ft_layer_weights *lw, int l, const float *in, int R)
{
    if (!lw->fetch_experts) return FT_OK;
    const int E = t->cfg.n_experts;
    int ex[256], nu = 0;
    for (int e = 0; e < E; e++)
        if (t->mstart[e + 1] > t->mstart[e]) ex[nu++] = e;
    ft_layer_weights *w = (ft_layer_weights *)(uintptr_t)lw;
    return lw->fetch_experts(lw->fetch_user, l, ex, nu, in, R, w);
}

/* the router on in: probabilities, the top-k routes grouped by expert */
static ft_status moe_route(ft_trainer *t, const ft_layer_weights *lw, const float *in, int R)
{
    const ft_model_config *c = &t->cfg;
    const int E = c->n_experts, K = c->n_experts_used;
    if (lw->n_experts != E || !lw->experts || !ft_wmat_present(&lw->w_router))
        return ft_set_error(FT_ERR_UNSUPPORTED, "train: a layer's experts are not in memory");
    TRY(prod(t, t->mprob, E, in, R, &lw->w_router, 0, E, NULL));
    ft_moe_route(t->mprob, R, E, K, c->moe_norm_topk, t->midx, t->mwt);   /* mprob: the probabilities */
    ft_moe_group(t->midx, t->mwt, R, E, K, t->mstart, t->mgrow, t->mgwt);
    return FT_OK;
}

/* out (R x H) = the mixture of experts of in (router softmax, top-k,
 * optionally renormalised, as the engine: ft_moe_route); the routes are
 * kept for the backward */
static ft_status moe_fwd(ft_trainer *t, int l, const ft_layer_weights *lw, const float *in, int R, float *out)
{
    const ft_model_config *c = &t->cfg;
    const int H = c->hidden, E = c->n_experts;
    TRY(moe_route(t, lw, in, R));
    TRY(moe_fetch(t, lw, t->cur_layer, in, R));
    memset(out, 0, (size_t)R * (size_t)H * sizeof(float));
    for (int e = 0; e < E; e++) {
        int a = t->mstart[e], n = t->mstart[e + 1] - a;
        if (!n) continue;
        for (int i = 0; i < n; i++)
            memcpy(t->mx + (size_t)i * H, in + (size_t)t->mgrow[a + i] * H, (size_t)H * sizeof(float));
        TRY(expert_fwd(t, lw, l, e, n));
        for (int i = 0; i < n; i++) {
            float w = t->mgwt[a + i], *o = out + (size_t)t->mgrow[a + i] * H;
            const float *y = t->my + (size_t)i * H;
            for (int h = 0; h < H; h++) o[h] += y[h] * w;
        }
    }
    return FT_OK;
}

/* din += d/d in of dot(dy, moe(in)): through each selected expert (frozen)
 * and through the router's weights (softmax, top-k, renormalisation);
 * the routes are moe_fwd's of the same input */
static ft_status moe_bwd(ft_trainer *t, int l, const ft_layer_weights *lw, const float *in, const float *dy, int R,
                         float *din)
{
    TRY(moe_fetch(t, lw, t->cur_layer, in, R));   /* (again: saved activations skip moe_fwd) */
    const ft_model_config *c = &t->cfg;
    const int H = c->hidden, E = c->n_experts, K = c->n_experts_used, F = c->moe_ffn;
    const lmod *mgu = &t->mods[(size_t)l * NT + TG], *mdn = &t->mods[(size_t)l * NT + TD];
    /* d weight of each route (r, j): dot(dy_r, y_e(r)), found expert by expert */
    for (int e = 0; e < E; e++) {
        int a = t->mstart[e], n = t->mstart[e + 1] - a;
        if (!n) continue;
        for (int i = 0; i < n; i++)
            memcpy(t->mx + (size_t)i * H, in + (size_t)t->mgrow[a + i] * H, (size_t)H * sizeof(float));
        TRY(expert_fwd(t, lw, l, e, n));
        for (int i = 0; i < n; i++) {
            int r = t->mgrow[a + i];
            const float *dyr = dy + (size_t)r * H, *y = t->my + (size_t)i * H;
            float dw = 0.0f;
            for (int h = 0; h < H; h++) dw += dyr[h] * y[h];
            for (int j = 0; j < K; j++)
                if (t->midx[(size_t)r * K + j] == e) t->mdw[(size_t)r * K + j] = dw;
            float w = t->mgwt[a + i];
            for (int h = 0; h < H; h++) t->mdy[(size_t)i * H + h] = dyr[h] * w;
        }
        /* the expert's x-gradient: dm = dY Wd, SwiGLU, dX = dg Wg + du Wu */
        memset(t->mdm, 0, (size_t)n * (size_t)F * sizeof(float));
        TRY(matT(t, t->mdm, F, t->mdy, H, n, &lw->experts[3 * e + LW_EXP_DOWN], 0, H));
        if (mdn->on) TRY(exp_lora_bwd(t, mdn, e, t->mmx, t->mtd, t->mdy, n, t->mdm));
        ft_tr_silu_mul_bwd(t->mdg, t->mdu, t->mg, t->mu, t->mdm, n * F);
        memset(t->mdx, 0, (size_t)n * (size_t)H * sizeof(float));
        TRY(matT(t, t->mdx, H, t->mdg, F, n, &lw->experts[3 * e + LW_EXP_GATE], 0, F));
        TRY(matT(t, t->mdx, H, t->mdu, F, n, &lw->experts[3 * e + LW_EXP_UP], 0, F));
        if (mgu->on) {   /* the fused adapter's output gradient: [dg | du] */
            float *dgu = t->meu;
            for (int i = 0; i < n; i++) {
                memcpy(dgu + (size_t)i * 2 * (size_t)F, t->mdg + (size_t)i * (size_t)F, (size_t)F * sizeof(float));
                memcpy(dgu + (size_t)i * 2 * (size_t)F + F, t->mdu + (size_t)i * (size_t)F, (size_t)F * sizeof(float));
            }
            TRY(exp_lora_bwd(t, mgu, e, t->mx, t->mtg, dgu, n, t->mdx));
        }
        for (int i = 0; i < n; i++) {
            float *d = din + (size_t)t->mgrow[a + i] * H;
            const float *s = t->mdx + (size_t)i * H;
            for (int h = 0; h < H; h++) d[h] += s[h];
        }
    }
    /* the router: w_j = p_j (/ S, S = the selected p's sum), p = softmax(logits) */
    for (int r = 0; r < R; r++) {
        const float *p = t->mprob + (size_t)r * E, *dw = t->mdw + (size_t)r * K, *w = t->mwt + (size_t)r * K;
        const int *ix = t->midx + (size_t)r * K;
        float *dl = t->mdl + (size_t)r * E, dp[256];
        for (int e = 0; e < E; e++) dp[e] = 0.0f;
        if (c->moe_norm_topk) {
            float S = 0.0f, sw = 0.0f;
            for (int j = 0; j < K; j++) {
                S += p[ix[j]];
                sw += dw[j] * w[j];
            }
            for (int j = 0; j < K; j++) dp[ix[j]] = (dw[j] - sw) / S;
        } else {
            for (int j = 0; j < K; j++) dp[ix[j]] = dw[j];
        }
        float sp = 0.0f;
        for (int e = 0; e < E; e++) sp += p[e] * dp[e];
        for (int e = 0; e < E; e++) dl[e] = p[e] * (dp[e] - sp);
    }
    return matT(t, din, H, t->mdl, E, R, &lw->w_router, 0, E);
}

/* SwiGLU silu(g) u, or gemma's GeGLU gelu_tanh(g) u (as the engine computes them) */
static void ffn_gate(const ft_model_config *c, float *m, const float *g, const float *u, size_t n)
{
    if (c->act == FT_ACT_GELU_TANH) {
        const float k0 = 0.7978845608028654f, k1 = 0.044715f;
        for (size_t i = 0; i < n; i++) {
            float x = g[i];
            m[i] = 0.5f * x * (1.0f + tanhf(k0 * (x + k1 * x * x * x))) * u[i];
        }
    } else {
        for (size_t i = 0; i < n; i++) m[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    }
}

/* Layer l's saved activations: written to the store (write) after its
 * forward, or read back into the workspace for its backward (what
 * layer_bwd reads: the architecture's buffers only; an MoE layer's routes
 * recomputed from h2). */
static ft_status act_io(ft_trainer *t, int l, int nb, int T, int write)
{
    const ft_model_config *c = &t->cfg;
    const size_t R = (size_t)nb * (size_t)T, H = (size_t)c->hidden, I = (size_t)c->ffn;
    const size_t qw = (size_t)c->n_heads * (size_t)c->head_dim, kw = (size_t)c->n_kv_heads * (size_t)c->head_dim;
    const int moe = moe_layer(t, l), glu = t->blk.ffn == FT_FFN_SWIGLU;
    const int keep_ao = t->post || c->sandwich_norm, keep_fo = t->post || c->sandwich_norm;
    float *buf[A_N] = {t->h1, t->q, t->k, t->v, t->att, t->P, t->x2, t->h2, glu && !moe ? t->gt : NULL,
                       moe ? NULL : t->up, moe ? NULL : t->mm, c->qk_norm ? t->qr : NULL, c->qk_norm ? t->kr : NULL,
                       keep_ao ? t->ao : NULL, keep_fo ? t->fo : NULL};
    size_t len[A_N] = {R * H, R * qw, R * kw, R * kw, R * qw, (size_t)nb * (size_t)c->n_heads * (size_t)T * (size_t)T,
                       R * H, R * H, R * I, R * I, R * I, R * qw, R * kw, R * H, R * H};
    for (int i = 0; i < NT; i++) {
        /* (the experts' adapters keep no A x: moe_bwd recomputes each expert) */
        buf[A_TL0 + i] = t->mods[(size_t)l * NT + (size_t)i].on && !t->mods[(size_t)l * NT + (size_t)i].ne ? t->tl[i]
                                                                                                            : NULL;
        len[A_TL0 + i] = R * (size_t)t->p.rank;
    }
    double t0 = ft_now();
    for (int a = 0; a < A_N && t->keep; a++) {   /* kept by the trainer: copies */
        if (!buf[a]) continue;
        size_t k = (size_t)l * A_N + (size_t)a;
        if (write) {
            if (t->keep_cap[k] < len[a]) {
                free(t->keep[k]);
                t->keep[k] = malloc(len[a] * sizeof(float));
                t->keep_cap[k] = t->keep[k] ? len[a] : 0;
                if (!t->keep[k])
                    return ft_set_error(FT_ERR_NOMEM, "train: out of memory for layer %d's saved activations", l);
            }
            memcpy(t->keep[k], buf[a], len[a] * sizeof(float));
            t->act_st.raw_bytes += len[a] * sizeof(float);
        } else {
            if (t->keep_cap[k] < len[a])
                return ft_set_error(FT_ERR_INVALID_ARG, "train: layer %d's activations were not saved", l);
            memcpy(buf[a], t->keep[k], len[a] * sizeof(float));
        }
    }
    for (int a = 0; a < A_N && !t->keep; a++) {
        if (!buf[a]) continue;
        char key[160];
        act_key(t, l, a, key, sizeof key);
        ft_tensor x;
        int64_t n = (int64_t)len[a];
        TRY(ft_tensor_init(&x, FT_F32, 1, &n, buf[a]));
        if (write) {
            ft_status st = ft_write_tensor(t->act, key, &x, &t->act_cp);
            if (st) return ft_set_error(st, "train: saving layer %d's activations to %s: %s", l, t->p.act_uri,
                                        ft_last_error());
            t->act_st.raw_bytes += len[a] * sizeof(float);
        } else {
            ft_status st = ft_read_tensor_into(t->act, key, &x, len[a] * sizeof(float));
            if (!st && (x.ndim != 1 || x.shape[0] != n))
                st = ft_set_error(FT_ERR_CORRUPT, "%s holds %lld values, not %lld", key, (long long)x.shape[0],
                                  (long long)n);
            if (st) return ft_set_error(st, "train: reading layer %d's activations back from %s: %s", l,
                                        t->p.act_uri, ft_last_error());
        }
    }
    if (write) {
        t->act_st.write_s += ft_now() - t0;
        if (l + 1 > t->act_layers) t->act_layers = l + 1;
        if (l == t->cfg.n_layers - 1 && t->keep) {
            t->act_st.stored_bytes = 0;
            for (size_t k = 0; k < (size_t)t->cfg.n_layers * A_N; k++) t->act_st.stored_bytes += t->keep_cap[k] * 4;
        } else if (l == t->cfg.n_layers - 1) {
            ft_store_stats ss;
            if (ft_store_stats_get(t->act, &ss) == FT_OK)   /* beside what the store held before (weights) */
                t->act_st.stored_bytes = ss.used > t->act_base ? ss.used - t->act_base : 0;
        }
    } else {
        t->act_st.read_s += ft_now() - t0;
        if (moe) TRY(moe_route(t, t->lw, t->h2, (int)R));
    }
    return FT_OK;
}

void ft_trainer_act_stats(const ft_trainer *t, ft_train_act_stats *out)
{
    memset(out, 0, sizeof *out);
    if (t) *out = t->act_st;
}

/* layer l's forward from xs[l] into xs[l + 1], keeping its activations
 * (and saving them to the activation store: save) */
static ft_status layer_fwd(ft_trainer *t, int l, int nb, int T, int save)
{
    const ft_model_config *c = &t->cfg;
    const ft_kernels *k = ft_k_get();
    const int R = nb * T, H = c->hidden, hd = c->head_dim, half = hd / 2;
    const size_t qw = (size_t)c->n_heads * (size_t)hd, kw = (size_t)c->n_kv_heads * (size_t)hd;
    const ft_layer_weights *lw = lw_of(t, l);
    const float *x = t->xs + (size_t)l * (size_t)R * (size_t)H;
    float *xo = t->xs + (size_t)(l + 1) * (size_t)R * (size_t)H;
    if (t->post) memcpy(t->h1, x, (size_t)R * (size_t)H * sizeof(float));   /* OPT post-LN: no input norm */
    else norm_fwd(t, t->h1, x, R, wvec(lw, LW_NORM1_W), wvec(lw, LW_NORM1_B));
    TRY(lin_fwd(t, l, TQ, t->h1, R, t->q));
    TRY(lin_fwd(t, l, TK, t->h1, R, t->k));
    TRY(lin_fwd(t, l, TV, t->h1, R, t->v));
    if (c->qk_norm) qk_norm_fwd(t, lw, R);
    const float *cs, *sn;
    rope_tabs(t, l, &cs, &sn);
    for (int r = 0; r < R && t->blk.pos == FT_POS_ROPE; r++) {
        size_t pos = (size_t)(r % T) * (size_t)half;
        k->rope(t->q + (size_t)r * qw, c->n_heads, hd, cs + pos, sn + pos);
        k->rope(t->k + (size_t)r * kw, c->n_kv_heads, hd, cs + pos, sn + pos);
    }
    attn_job aj = attn_of(t, l, nb, T);
    ft_pool_run(t->pool, (size_t)nb * (size_t)c->n_kv_heads, attn_fwd_task, &aj);
    TRY(lin_fwd(t, l, TO, t->att, R, t->tmp));
    if (c->sandwich_norm) {   /* gemma: a norm on the block's output before the residual add */
        memcpy(t->ao, t->tmp, (size_t)R * (size_t)H * sizeof(float));
        norm_fwd(t, t->tmp, t->ao, R, wvec(lw, LW_POST_ATTN_NORM), NULL);
    }
    for (size_t i = 0; i < (size_t)R * (size_t)H; i++) t->x2[i] = x[i] + t->tmp[i];
    if (t->post) {   /* x2 = LN1(x + attn): the sum kept in ao; the FFN's input is x2 */
        memcpy(t->ao, t->x2, (size_t)R * (size_t)H * sizeof(float));
        norm_fwd(t, t->x2, t->ao, R, wvec(lw, LW_NORM1_W), wvec(lw, LW_NORM1_B));
        memcpy(t->h2, t->x2, (size_t)R * (size_t)H * sizeof(float));
    } else {
        norm_fwd(t, t->h2, t->x2, R, wvec(lw, LW_NORM2_W), wvec(lw, LW_NORM2_B));
    }
    size_t ni = (size_t)R * (size_t)c->ffn;
    if (moe_layer(t, l)) {
        TRY(moe_fwd(t, l, lw, t->h2, R, t->tmp));
    } else if (t->blk.ffn == FT_FFN_SWIGLU) {
        TRY(lin_fwd(t, l, TG, t->h2, R, t->gt));
        TRY(lin_fwd(t, l, TU, t->h2, R, t->up));
        gate_fwd(t, t->mm, t->gt, t->up, ni);
    } else {   /* OPT: relu(fc1) */
        TRY(lin_fwd(t, l, TU, t->h2, R, t->up));
        for (size_t i = 0; i < ni; i++) t->mm[i] = t->up[i] > 0.0f ? t->up[i] : 0.0f;
    }
    if (!moe_layer(t, l)) TRY(lin_fwd(t, l, TD, t->mm, R, t->tmp));
    if (c->sandwich_norm) {
        memcpy(t->fo, t->tmp, (size_t)R * (size_t)H * sizeof(float));
        norm_fwd(t, t->tmp, t->fo, R, wvec(lw, LW_POST_FFN_NORM), NULL);
    }
    for (size_t i = 0; i < (size_t)R * (size_t)H; i++) xo[i] = t->x2[i] + t->tmp[i];
    if (t->post) {   /* out = LN2(x2 + ffn): the sum kept in fo */
        memcpy(t->fo, xo, (size_t)R * (size_t)H * sizeof(float));
        norm_fwd(t, xo, t->fo, R, wvec(lw, LW_NORM2_W), wvec(lw, LW_NORM2_B));
    }
    if (save) TRY(act_io(t, l, nb, T, 1));
    return FT_OK;
}

/* t->dx holds d loss / d xs[l + 1]; leaves d loss / d xs[l] there */
static ft_status layer_bwd(ft_trainer *t, int l, int nb, int T)
{
    const ft_model_config *c = &t->cfg;
    const int R = nb * T, H = c->hidden, hd = c->head_dim, half = hd / 2;
    const size_t qw = (size_t)c->n_heads * (size_t)hd, kw = (size_t)c->n_kv_heads * (size_t)hd;
    const size_t RH = (size_t)R * (size_t)H, RI = (size_t)R * (size_t)c->ffn;
    const ft_layer_weights *lw = lw_of(t, l);
    const float *x = t->xs + (size_t)l * RH;
    if (t->post) {   /* through LN2 to the sum x2 + ffn */
        memset(t->dsw, 0, RH * sizeof(float));
        norm_bwd(t, t->dsw, t->fo, R, wvec(lw, LW_NORM2_W), t->dx);
        memcpy(t->dx, t->dsw, RH * sizeof(float));
    }
    memcpy(t->dx2, t->dx, RH * sizeof(float));
    memset(t->dmm, 0, RI * sizeof(float));
    const float *dyo = t->dx;
    if (c->sandwich_norm) {
        memset(t->dsw, 0, RH * sizeof(float));
        norm_bwd(t, t->dsw, t->fo, R, wvec(lw, LW_POST_FFN_NORM), t->dx);
        dyo = t->dsw;
    }
    memset(t->dh, 0, RH * sizeof(float));
    if (moe_layer(t, l)) {
        TRY(moe_bwd(t, l, lw, t->h2, dyo, R, t->dh));
    } else {
    TRY(lin_bwd(t, l, TD, t->mm, dyo, R, t->dmm));
    if (t->blk.ffn == FT_FFN_SWIGLU) {
        gate_bwd(t, t->dgt, t->dup, t->gt, t->up, t->dmm, RI);
        TRY(lin_bwd(t, l, TG, t->h2, t->dgt, R, t->dh));
    } else {
        for (size_t i = 0; i < RI; i++) t->dup[i] = t->up[i] > 0.0f ? t->dmm[i] : 0.0f;
    }
    TRY(lin_bwd(t, l, TU, t->h2, t->dup, R, t->dh));
    }
    if (t->post) {   /* the FFN read x2 itself; then through LN1 to x + attn */
        for (size_t i = 0; i < RH; i++) t->dx2[i] += t->dh[i];
        memset(t->dsw, 0, RH * sizeof(float));
        norm_bwd(t, t->dsw, t->ao, R, wvec(lw, LW_NORM1_W), t->dx2);
        memcpy(t->dx2, t->dsw, RH * sizeof(float));
    } else {
        norm_bwd(t, t->dx2, t->x2, R, wvec(lw, LW_NORM2_W), t->dh);
    }
    memset(t->datt, 0, (size_t)R * qw * sizeof(float));
    dyo = t->dx2;
    if (c->sandwich_norm) {
        memset(t->dsw, 0, RH * sizeof(float));
        norm_bwd(t, t->dsw, t->ao, R, wvec(lw, LW_POST_ATTN_NORM), t->dx2);
        dyo = t->dsw;
    }
    TRY(lin_bwd(t, l, TO, t->att, dyo, R, t->datt));
    memset(t->dq, 0, (size_t)R * qw * sizeof(float));
    memset(t->dk, 0, (size_t)R * kw * sizeof(float));
    memset(t->dv, 0, (size_t)R * kw * sizeof(float));
    attn_job aj = attn_of(t, l, nb, T);
    ft_pool_run(t->pool, (size_t)nb * (size_t)c->n_kv_heads, attn_bwd_task, &aj);
    const float *cs, *sn;
    rope_tabs(t, l, &cs, &sn);
    for (int r = 0; r < R && t->blk.pos == FT_POS_ROPE; r++) {
        size_t pos = (size_t)(r % T) * (size_t)half;
        ft_tr_rope_bwd(t->dq + (size_t)r * qw, c->n_heads, hd, cs + pos, sn + pos);
        ft_tr_rope_bwd(t->dk + (size_t)r * kw, c->n_kv_heads, hd, cs + pos, sn + pos);
    }
    if (c->qk_norm) qk_norm_bwd(t, lw, R);
    memset(t->dh, 0, RH * sizeof(float));
    TRY(lin_bwd(t, l, TQ, t->h1, t->dq, R, t->dh));
    TRY(lin_bwd(t, l, TK, t->h1, t->dk, R, t->dh));
    TRY(lin_bwd(t, l, TV, t->h1, t->dv, R, t->dh));
    memcpy(t->dx, t->dx2, RH * sizeof(float));
    if (t->post)
        for (size_t i = 0; i < RH; i++) t->dx[i] += t->dh[i];
    else
        norm_bwd(t, t->dx, x, R, wvec(lw, LW_NORM1_W), t->dh);
    return FT_OK;
}

/* rows [v0, v0 + n) of W as a matrix of its own (q8/q4: v0 on a chunk) */
static void wview(const ft_wmat *W, int v0, int n, ft_wmat *o)
{
    *o = *W;
    o->rows = n;
    if (W->fmt == FT_WF_F32) o->data = (const float *)W->data + (size_t)v0 * (size_t)W->cols;
    else if (W->fmt == FT_WF_BF16 || W->fmt == FT_WF_F16)
        o->data = (const uint16_t *)W->data + (size_t)v0 * (size_t)W->cols;
    else o->chunk = W->chunk + v0 / W->rows_per_chunk;
}

static int vchunk(const ft_trainer *t, const ft_wmat *W)
{
    int vc = t->p.vocab_chunk < W->rows ? t->p.vocab_chunk : W->rows;
    if (W->fmt == FT_WF_Q8 || W->fmt == FT_WF_Q4) {
        int rpc = W->rows_per_chunk;
        vc = vc < rpc ? rpc : vc / rpc * rpc;
        if (vc > W->rows) vc = W->rows;
    }
    return vc;
}

/* gemma2's final logit soft-capping: cap tanh(z / cap), as the engine */
static void softcap(const ft_model_config *c, float *z, size_t n)
{
    const float cap = c->final_softcap;
    if (cap == 0.0f) return;
    for (size_t i = 0; i < n; i++) z[i] = tanhf(z[i] / cap) * cap;
}

static ft_status check_tokens(const ft_trainer *t, const int32_t *tokens, int nb, int T, int min_T)
{
    if (!tokens || nb < 1 || T < min_T)
        return ft_set_error(FT_ERR_INVALID_ARG, "train: need tokens, batch >= 1 and seq >= %d (got %d x %d)", min_T,
                            nb, T);
    if (T > t->cfg.max_pos)
        return ft_set_error(FT_ERR_INVALID_ARG, "train: seq %d > the model's max_position_embeddings %d", T,
                            t->cfg.max_pos);
    if ((int64_t)nb * T > (1 << 24)) return ft_set_error(FT_ERR_INVALID_ARG, "train: batch x seq too large");
    for (size_t i = 0; i < (size_t)nb * (size_t)T; i++)
        if (tokens[i] < 0 || tokens[i] >= t->cfg.vocab)
            return ft_set_error(FT_ERR_INVALID_ARG, "train: token id %d outside the vocabulary of %d", (int)tokens[i],
                                t->cfg.vocab);
    return FT_OK;
}

/* embeddings and every layer: xs[0..L]; bwd: a backward pass follows
 * (it starts at the last layer, then reads the one below) */
static ft_status forward(ft_trainer *t, const int32_t *tokens, int nb, int T, int bwd)
{
    const ft_model_config *c = &t->cfg;
    TRY(ensure(t, nb, T));
    const ft_wmat *E = ft_model_global(t->m, GW_TOK_EMB), *Pin = ft_model_global(t->m, GW_PROJ_IN);
    if (ft_wmat_present(Pin)) {   /* OPT-350m: word_embed_proj_dim-wide embeddings, project_in */
        for (int r = 0; r < nb * T; r++) ft_wmat_row_f32(E, tokens[r], t->pin + (size_t)r * (size_t)t->E);
        TRY(prod(t, t->xs, c->hidden, t->pin, nb * T, Pin, 0, c->hidden, NULL));
    } else {
        for (int r = 0; r < nb * T; r++) ft_wmat_row_f32(E, tokens[r], t->xs + (size_t)r * (size_t)c->hidden);
    }
    if (c->embed_scale != 0)   /* gemma: sqrt(hidden) */
        for (size_t i = 0; i < (size_t)nb * (size_t)T * (size_t)c->hidden; i++) t->xs[i] *= c->embed_scale;
    if (t->blk.pos == FT_POS_LEARNED) {   /* OPT: position r % T + offset */
        const ft_wmat *P = ft_model_global(t->m, GW_POS_EMB);
        float *pe = t->h1;
        for (int r = 0; r < nb * T; r++) {
            ft_wmat_row_f32(P, r % T + t->blk.pos_offset, pe);
            float *x = t->xs + (size_t)r * (size_t)c->hidden;
            for (int i = 0; i < c->hidden; i++) x[i] += pe[i];
        }
    }
    const int L = c->n_layers;
    for (int l = 0; l < L; l++) {
        TRY(use_layer(t, l, l + 1 < L ? l + 1 : bwd ? L - 2 : 0));
        TRY(layer_fwd(t, l, nb, T, bwd && t->saving));
    }
    return FT_OK;
}

/* position r predicts token r + 1 of its sequence: not the last one, and
 * (with a mask) only where that token is a label */
static int skip_row(const ft_trainer *t, int r, int T)
{
    return r % T == T - 1 || (t->mask && !t->mask[r + 1]);
}

ft_status ft_trainer_loss_grad(ft_trainer *t, const int32_t *tokens, int nb, int T, double grad_scale,
                               double *loss_sum, int64_t *n_out)
{
    if (!t) return ft_set_error(FT_ERR_INVALID_ARG, "train: NULL trainer");
    TRY(check_tokens(t, tokens, nb, T, 2));
    const ft_model_config *c = &t->cfg;
    const int R = nb * T, H = c->hidden, L = c->n_layers;
    TRY(forward(t, tokens, nb, T, grad_scale != 0.0));
    const float *fw = gvec(t, GW_FINAL_NORM_W), *fb = gvec(t, GW_FINAL_NORM_B);
    const float *xl = t->xs + (size_t)L * (size_t)R * (size_t)H;
    float *hf = t->h1;   /* the final norm's output (h1 is free between layers) */
    if (t->fnorm) norm_fwd(t, hf, xl, R, fw, fb);
    else memcpy(hf, xl, (size_t)R * (size_t)H * sizeof(float));
    const ft_wmat *Pout = ft_model_global(t->m, GW_PROJ_OUT);
    const int proj = ft_wmat_present(Pout), HE = proj ? t->E : H;
    const float *hin = hf;   /* the LM head's input */
    if (proj) {
        TRY(prod(t, t->hp, t->E, hf, R, Pout, 0, t->E, NULL));
        hin = t->hp;
    }
    const ft_wmat *W = ft_model_global(t->m, GW_LM_HEAD);
    const int V = W->rows, vc = vchunk(t, W);
    for (int r = 0; r < R; r++) {
        t->lmax[r] = -INFINITY;
        t->lsum[r] = 0.0;
    }
    /* pass 1: log-sum-exp and the target's logit per row, chunk by chunk */
    for (int v0 = 0; v0 < V; v0 += vc) {
        int n = V - v0 < vc ? V - v0 : vc;
        ft_wmat sub;
        wview(W, v0, n, &sub);
        float *lc = t->lall ? t->lall + (size_t)R * (size_t)v0 : t->lchunk;
        TRY(prod(t, lc, n, hin, R, &sub, 0, n, NULL));
        softcap(c, lc, (size_t)R * (size_t)n);
        for (int r = 0; r < R; r++) {
            if (skip_row(t, r, T)) continue;
            const float *lr = lc + (size_t)r * (size_t)n;
            double mx = t->lmax[r];
            for (int j = 0; j < n; j++) if (lr[j] > mx) mx = lr[j];
            double s = t->lsum[r] * exp(t->lmax[r] - mx);
            for (int j = 0; j < n; j++) s += exp((double)lr[j] - mx);
            t->lmax[r] = mx;
            t->lsum[r] = s;
            int tg = tokens[r + 1];
            if (tg >= v0 && tg < v0 + n) t->ltgt[r] = lr[tg - v0];
        }
    }
    double sum = 0.0;
    int64_t cnt = 0;
    for (int r = 0; r < R; r++) {
        if (skip_row(t, r, T)) continue;
        t->lmax[r] += log(t->lsum[r]);   /* now the log-sum-exp */
        sum += t->lmax[r] - (double)t->ltgt[r];
        cnt++;
    }
    if (!isfinite(sum)) return ft_set_error(FT_ERR_INVALID_ARG, "train: the loss is not finite (diverged?)");
    *loss_sum = sum;
    *n_out = cnt;
    if (grad_scale == 0.0 || cnt == 0) return FT_OK;   /* nothing counted: no gradient */

    /* pass 2: d loss / d logits = (softmax - onehot) * grad_scale / cnt */
    const double gs = grad_scale / (double)cnt;
    float *dhf = t->dh, *dhin = proj ? t->dhp : dhf;
    memset(dhf, 0, (size_t)R * (size_t)H * sizeof(float));
    memset(dhin, 0, (size_t)R * (size_t)HE * sizeof(float));
    for (int v0 = 0; v0 < V; v0 += vc) {
        int n = V - v0 < vc ? V - v0 : vc;
        ft_wmat sub;
        wview(W, v0, n, &sub);
        float *lc = t->lall ? t->lall + (size_t)R * (size_t)v0 : t->lchunk;
        if (!t->lall) TRY(prod(t, lc, n, hin, R, &sub, 0, n, NULL));
        for (int r = 0; r < R; r++) {
            float *lr = lc + (size_t)r * (size_t)n;
            if (skip_row(t, r, T)) {
                memset(lr, 0, (size_t)n * sizeof(float));
                continue;
            }
            const float cap = c->final_softcap;
            int tg = tokens[r + 1];
            if (cap == 0.0f) {
                for (int j = 0; j < n; j++) lr[j] = (float)(exp((double)lr[j] - t->lmax[r]) * gs);
                if (tg >= v0 && tg < v0 + n) lr[tg - v0] -= (float)gs;
            } else {   /* through the cap: d/dz cap tanh(z / cap) = 1 - tanh^2 */
                for (int j = 0; j < n; j++) {
                    float th = tanhf(lr[j] / cap);
                    double d = exp((double)(th * cap) - t->lmax[r]) * gs - (v0 + j == tg ? gs : 0.0);
                    lr[j] = (float)(d * (double)(1.0f - th * th));
                }
            }
        }
        TRY(matT(t, dhin, HE, lc, n, R, &sub, 0, n));
    }
    if (proj) TRY(matT(t, dhf, H, t->dhp, t->E, R, Pout, 0, t->E));
    memset(t->dx, 0, (size_t)R * (size_t)H * sizeof(float));
    if (t->fnorm) norm_bwd(t, t->dx, xl, R, fw, dhf);
    else memcpy(t->dx, dhf, (size_t)R * (size_t)H * sizeof(float));
    /* the layers in reverse, each recomputed from its saved input (or its
     * activations read back from the store); the next step's forward
     * starts at layer 0, then 1 */
    for (int l = L - 1; l >= 0; l--) {
        TRY(use_layer(t, l, l > 0 ? l - 1 : L > 1 ? 1 : -1));
        if (t->saving) TRY(act_io(t, l, nb, T, 0));
        else TRY(layer_fwd(t, l, nb, T, 0));
        TRY(layer_bwd(t, l, nb, T));
    }
    return FT_OK;
}

double ft_trainer_lr_at(const ft_trainer *t, int s)
{
    const ft_train_params *p = &t->p;
    double base = p->lr;
    if (s < p->warmup) return base * (double)s / (double)(p->warmup > 1 ? p->warmup : 1);
    int rest = p->total_steps - p->warmup;
    double prog = (double)(s - p->warmup) / (double)(rest > 1 ? rest : 1);
    switch (p->schedule) {
    case FT_SCHED_COSINE: {
        double f = 0.5 * (1.0 + cos(3.14159265358979323846 * 0.5 * 2.0 * prog));
        return base * (f > 0.0 ? f : 0.0);
    }
    case FT_SCHED_LINEAR: {
        double f = (double)(p->total_steps - s) / (double)(rest > 1 ? rest : 1);
        return base * (f > 0.0 ? f : 0.0);
    }
    default:
        return base;
    }
}

/* the gradient of micro-batch tok alone into dst (zeroed first): its
 * mean loss into *l */
static ft_status unit_grad(ft_trainer *t, int a, const int32_t *tok, const uint8_t *mask, int nb, int T,
                           float *dst, double *l)
{
    float *keep = t->g;
    double s = 0.0;
    int64_t n = 0;
    memset(dst, 0, t->np * sizeof(float));
    t->g = dst;
    t->mask = mask;
    t->dropping = t->p.dropout > 0.0f;
    t->drop_key = ft_tr_dropout_key(t->p.seed, t->step, a);
    ft_status st = ft_trainer_loss_grad(t, tok, nb, T, 1.0 / t->p.grad_accum, &s, &n);
    t->dropping = 0;
    t->mask = NULL;
    t->g = keep;
    *l = st ? 0.0 : n ? s / (double)n : NAN;   /* NAN: no labelled position (fold_loss skips it) */
    return st;
}

static ft_status want_units(ft_trainer *t, size_t units)
{
    if (units <= t->gu_units) return FT_OK;
    free(t->gu);
    free(t->gul);
    t->gu = malloc(units * t->np * sizeof(float));
    t->gul = malloc(units * sizeof(double));
    t->gu_units = t->gu && t->gul ? units : 0;
    if (!t->gu_units) return ft_set_error(FT_ERR_NOMEM, "train: out of memory for %zu micro-batch gradients", units);
    return FT_OK;
}

/* What travels along the chain of ranks with the running sums. */
typedef struct dp_head { double loss; int32_t status, failed_rank, counted, pad; } dp_head;

static ft_status dp_send(const ft_train_comm *c, int to, const dp_head *h, const float *g, size_t np)
{
    TRY(c->send(c->user, to, h, sizeof *h));
    return c->send(c->user, to, g, np * sizeof(float));
}

static ft_status dp_recv(const ft_train_comm *c, int from, dp_head *h, float *g, size_t np)
{
    TRY(c->recv(c->user, from, h, sizeof *h));
    return c->recv(c->user, from, g, np * sizeof(float));
}

ft_status ft_trainer_step(ft_trainer *t, const int32_t *tokens, int nb, int T, double *loss, double *grad_norm)
{
    return ft_trainer_step_dp_masked(t, NULL, tokens, NULL, nb, T, loss, grad_norm);
}

ft_status ft_trainer_step_masked(ft_trainer *t, const int32_t *tokens, const uint8_t *mask, int nb, int T,
                                 double *loss, double *grad_norm)
{
    return ft_trainer_step_dp_masked(t, NULL, tokens, mask, nb, T, loss, grad_norm);
}

ft_status ft_trainer_step_dp(ft_trainer *t, const ft_train_comm *comm, const int32_t *tokens, int nb, int T,
                             double *loss, double *grad_norm)
{
    return ft_trainer_step_dp_masked(t, comm, tokens, NULL, nb, T, loss, grad_norm);
}

/* A micro-batch's loss as unit_grad reports it: NAN when none of its
 * positions has a label (it adds nothing to the step's mean loss). */
static void fold_loss(dp_head *h, double l)
{
    if (isnan(l)) return;
    h->loss += l;
    h->counted++;
}

ft_status ft_trainer_step_dp_masked(ft_trainer *t, const ft_train_comm *comm, const int32_t *tokens,
                                    const uint8_t *mask, int nb, int T, double *loss, double *grad_norm)
{
    if (!t || !tokens) return ft_set_error(FT_ERR_INVALID_ARG, "ft_trainer_step: NULL argument");
    const int A = t->p.grad_accum, N = comm ? comm->size : 1, me = comm ? comm->rank : 0;
    if (comm && (!comm->send || !comm->recv || N < 1 || me < 0 || me >= N))
        return ft_set_error(FT_ERR_INVALID_ARG, "train: data-parallel: bad communicator (rank %d of %d)", me, N);
    if (A < N)
        return ft_set_error(FT_ERR_INVALID_ARG, "train: data-parallel: %d micro-batches per step (grad_accum) for %d "
                            "processes: each process needs at least one", A, N);
    /* The step's gradient is the left fold S = ((g_0 + g_1) + g_2) + ...
     * of the micro-batches' gradients (each computed from zero), the loss
     * likewise: rank k computes micro-batches [a0, a1), receives the sum
     * so far from rank k - 1, continues the fold and passes it on; the
     * last rank sends the total to every rank. The additions are the same
     * whatever N, so the result is bit for bit that of one process. */
    const int a0 = (int)((int64_t)me * A / N), a1 = (int)((int64_t)(me + 1) * A / N);
    const size_t np = t->np, mb = (size_t)nb * (size_t)T;
    ft_status st = FT_OK;
    dp_head h = {0.0, 0, -1, 0, 0};
    if (me == 0) {
        /* the first micro-batch's gradient goes into t->g, the next ones'
         * through gu (an error still goes down the chain: no rank is left
         * waiting) */
        st = a1 - a0 > 1 ? want_units(t, 1) : FT_OK;
        for (int a = a0; a < a1 && !st; a++) {
            double l;
            const uint8_t *mk = mask ? mask + (size_t)a * mb : NULL;
            if (a == 0) st = unit_grad(t, a, tokens, mk, nb, T, t->g, &l);
            else if (!(st = unit_grad(t, a, tokens + (size_t)a * mb, mk, nb, T, t->gu, &l)))
                for (size_t i = 0; i < np; i++) t->g[i] += t->gu[i];
            if (!st) fold_loss(&h, l);
        }
    } else {
        st = want_units(t, (size_t)(a1 - a0));
        for (int a = a0; a < a1 && !st; a++)
            st = unit_grad(t, a, tokens + (size_t)a * mb, mask ? mask + (size_t)a * mb : NULL, nb, T,
                           t->gu + (size_t)(a - a0) * np, &t->gul[a - a0]);
        ft_status rs = dp_recv(comm, me - 1, &h, t->g, np);
        if (rs) return rs;
        if (!h.status && !st)
            for (int a = a0; a < a1; a++) {
                const float *gu = t->gu + (size_t)(a - a0) * np;
                for (size_t i = 0; i < np; i++) t->g[i] += gu[i];
                fold_loss(&h, t->gul[a - a0]);
            }
    }
    if (st && !h.status) {
        h.status = (int32_t)st;
        h.failed_rank = me;
    }
    if (N > 1) {
        if (me < N - 1) {
            TRY(dp_send(comm, me + 1, &h, t->g, np));
            TRY(dp_recv(comm, N - 1, &h, t->g, np));
        } else {
            for (int r = 0; r < N - 1; r++) TRY(dp_send(comm, r, &h, t->g, np));
        }
    }
    if (st) return st;   /* this rank's own error (its message) */
    if (h.status > 0 || h.failed_rank < -1 || h.failed_rank >= N || h.counted < 0 || h.counted > A)
        return ft_set_error(FT_ERR_PROTOCOL, "train: data-parallel: a malformed header (status %d, rank %d)",
                            (int)h.status, (int)h.failed_rank);
    if (h.status)
        return ft_set_error((ft_status)h.status, "train: data-parallel: rank %d failed in its micro-batches (%s; its "
                            "message is on its stderr)", (int)h.failed_rank, ft_status_str((ft_status)h.status));
    if (!h.counted)
        return ft_set_error(FT_ERR_INVALID_ARG, "train: no position of this step's sequences has a label (every "
                            "token masked)");
    const double tot = h.loss;
    const int counted = h.counted;
    /* torch.nn.utils.clip_grad_norm_: coef = max_norm / (norm + 1e-6), clamped to 1 */
    double ss = 0.0;
    for (size_t i = 0; i < t->np; i++) ss += (double)t->g[i] * (double)t->g[i];
    double norm = sqrt(ss);
    if (!isfinite(norm)) return ft_set_error(FT_ERR_INVALID_ARG, "train: the gradient is not finite (diverged?)");
    if (t->p.clip > 0.0f) {
        float coef = (float)((double)t->p.clip / (norm + 1e-6));
        if (coef < 1.0f)
            for (size_t i = 0; i < t->np; i++) t->g[i] *= coef;
    }
    /* torch.optim.AdamW (single-tensor): p *= 1 - lr wd; m = lerp(m, g, 1 - b1);
     * v = b2 v + (1 - b2) g^2; p -= lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps) */
    const ft_train_params *p = &t->p;
    double lr = ft_trainer_lr_at(t, t->step);
    int stp = ++t->step;
    double bc1 = 1.0 - pow((double)p->beta1, stp), bc2 = 1.0 - pow((double)p->beta2, stp);
    float decay = (float)(1.0 - lr * (double)p->weight_decay);
    float w1 = (float)(1.0 - (double)p->beta1), b2 = p->beta2, w2 = (float)(1.0 - (double)p->beta2);
    float step_size = (float)(lr / bc1), bc2s = (float)sqrt(bc2);
    for (size_t i = 0; i < t->np; i++) {
        float g = t->g[i];
        t->w[i] *= decay;
        t->m1[i] += (g - t->m1[i]) * w1;
        t->m2[i] = t->m2[i] * b2 + w2 * g * g;
        float den = sqrtf(t->m2[i]) / bc2s + p->eps;
        t->w[i] -= step_size * (t->m1[i] / den);
    }
    if (loss) *loss = tot / counted;
    if (grad_norm) *grad_norm = norm;
    return FT_OK;
}

ft_status ft_trainer_eval(ft_trainer *t, const int32_t *tokens, int nb, int T, double *loss_sum, int64_t *n)
{
    return ft_trainer_eval_masked(t, tokens, NULL, nb, T, loss_sum, n);
}

ft_status ft_trainer_eval_masked(ft_trainer *t, const int32_t *tokens, const uint8_t *mask, int nb, int T,
                                 double *loss_sum, int64_t *n)
{
    if (!t || !loss_sum || !n) return ft_set_error(FT_ERR_INVALID_ARG, "ft_trainer_eval: NULL argument");
    t->mask = mask;
    ft_status st = ft_trainer_loss_grad(t, tokens, nb, T, 0.0, loss_sum, n);
    t->mask = NULL;
    return st;
}

/* the final norm, project_out and the LM head (soft-capped) of one row */
static ft_status head_row(ft_trainer *t, const float *x, float *hf, float *logits)
{
    const ft_model_config *c = &t->cfg;
    if (t->fnorm) norm_fwd(t, hf, x, 1, gvec(t, GW_FINAL_NORM_W), gvec(t, GW_FINAL_NORM_B));
    else memcpy(hf, x, (size_t)c->hidden * sizeof(float));
    const ft_wmat *Pout = ft_model_global(t->m, GW_PROJ_OUT), *W = ft_model_global(t->m, GW_LM_HEAD);
    const float *in = hf;
    if (ft_wmat_present(Pout)) {
        TRY(prod(t, t->hp, t->E, hf, 1, Pout, 0, t->E, NULL));
        in = t->hp;
    }
    TRY(prod(t, logits, W->rows, in, 1, W, 0, W->rows, NULL));
    softcap(c, logits, (size_t)W->rows);
    return FT_OK;
}

ft_status ft_trainer_last_logits(ft_trainer *t, const int32_t *tokens, int n, float *logits)
{
    if (!t || !logits) return ft_set_error(FT_ERR_INVALID_ARG, "ft_trainer_last_logits: NULL argument");
    TRY(check_tokens(t, tokens, 1, n, 1));
    const ft_model_config *c = &t->cfg;
    TRY(forward(t, tokens, 1, n, 0));
    const float *xl = t->xs + ((size_t)c->n_layers * (size_t)n + (size_t)n - 1) * (size_t)c->hidden;
    return head_row(t, xl, t->h1, logits);
}

/* ------------------------------------------------ PEFT adapter files */

size_t ft_tr_n_mods(const ft_trainer *t) { return (size_t)t->cfg.n_layers * NT; }

int ft_tr_mod(const ft_trainer *t, size_t k, char *a_name, char *b_name, size_t cap, float **A, float **B,
              int64_t ashape[2], int64_t bshape[2])
{
    const lmod *md = &t->mods[k];
    if (!md->on || md->shared) return 0;
    int l = (int)(k / NT), i = (int)(k % NT);
    if (t->is_opt) {   /* model.decoder.layers.L.self_attn.q_proj, ...layers.L.fc1 */
        const char *blk = i <= TO ? "self_attn." : "";
        snprintf(a_name, cap, "base_model.model.model.decoder.layers.%d.%s%s.lora_A.weight", l, blk, opt_tname[i]);
        snprintf(b_name, cap, "base_model.model.model.decoder.layers.%d.%s%s.lora_B.weight", l, blk, opt_tname[i]);
    } else if (md->ne) {
        /* PEFT's ParamWrapper on mlp.experts: with both parameters adapted the
         * down_proj wrapper wraps the gate_up_proj one (its keys under base_layer) */
        const char *nest = i == TG && t->mods[k - TG + TD].on ? "base_layer." : "";
        snprintf(a_name, cap, "base_model.model.model.layers.%d.mlp.experts.%slora_A.weight", l, nest);
        snprintf(b_name, cap, "base_model.model.model.layers.%d.mlp.experts.%slora_B.weight", l, nest);
    } else {
        const char *blk = i <= TO ? "self_attn" : "mlp";
        const char *nm = md->fused_out ? (i == TQ ? "qkv_proj" : "gate_up_proj") : tname[i];
        snprintf(a_name, cap, "base_model.model.model.layers.%d.%s.%s.lora_A.weight", l, blk, nm);
        snprintf(b_name, cap, "base_model.model.model.layers.%d.%s.%s.lora_B.weight", l, blk, nm);
    }
    *A = t->w + md->a;
    *B = t->w + md->b;
    ashape[0] = (int64_t)t->p.rank * (md->ne ? md->ne : 1);
    ashape[1] = md->in;
    bshape[0] = md->fused_out ? md->fused_out : md->out;
    bshape[1] = (int64_t)t->p.rank * (md->ne ? md->ne : 1);
    return 1;
}

const ft_train_params *ft_tr_params(const ft_trainer *t) { return &t->p; }
const char *ft_tr_target_name(int i) { return i >= 0 && i < NB_NAMES ? bitname[i] : NULL; }

void ft_tr_state(ft_trainer *t, float **w, float **m1, float **m2, int *step)
{
    *w = t->w;
    *m1 = t->m1;
    *m2 = t->m2;
    *step = t->step;
}

void ft_tr_set_step(ft_trainer *t, int step) { t->step = step; }

/* ------------------------------------------------ greedy decoding */

/* one row at position pos through layer l, K/V appended to the caches */
static ft_status layer_step(ft_trainer *t, int l, int pos, float *x, float *kc, float *vc, float *sc)
{
    const ft_model_config *c = &t->cfg;
    const ft_kernels *k = ft_k_get();
    const int H = c->hidden, hd = c->head_dim, half = hd / 2, rep = c->n_heads / c->n_kv_heads;
    const size_t kw = (size_t)c->n_kv_heads * (size_t)hd;
    const ft_layer_weights *lw = lw_of(t, l);
    if (t->post) memcpy(t->h1, x, (size_t)H * sizeof(float));
    else norm_fwd(t, t->h1, x, 1, wvec(lw, LW_NORM1_W), wvec(lw, LW_NORM1_B));
    TRY(lin_fwd(t, l, TQ, t->h1, 1, t->q));
    TRY(lin_fwd(t, l, TK, t->h1, 1, t->k));
    TRY(lin_fwd(t, l, TV, t->h1, 1, t->v));
    if (c->qk_norm) qk_norm_fwd(t, lw, 1);
    size_t po = (size_t)pos * (size_t)half;
    if (t->blk.pos == FT_POS_ROPE) {
        const float *cs, *sn;
        rope_tabs(t, l, &cs, &sn);
        k->rope(t->q, c->n_heads, hd, cs + po, sn + po);
        k->rope(t->k, c->n_kv_heads, hd, cs + po, sn + po);
    }
    memcpy(kc + (size_t)pos * kw, t->k, kw * sizeof(float));
    memcpy(vc + (size_t)pos * kw, t->v, kw * sizeof(float));
    int win = ft_model_config_layer_window(c, l), j0 = win > 0 && pos - win + 1 > 0 ? pos - win + 1 : 0;
    const attn_job aj = attn_of(t, l, 1, 1);
    const float scale = aj.scale, cap = aj.cap;
    for (int h = 0; h < c->n_heads; h++) {
        size_t go = (size_t)(h / rep) * (size_t)hd;
        const float *qh = t->q + (size_t)h * (size_t)hd;
        float mx = -INFINITY, sum = 0.0f;
        for (int j = j0; j <= pos; j++) {
            sc[j] = k->dot(qh, kc + (size_t)j * kw + go, hd) * scale;
            if (cap != 0.0f) sc[j] = tanhf(sc[j] / cap) * cap;
            if (sc[j] > mx) mx = sc[j];
        }
        for (int j = j0; j <= pos; j++) {
            sc[j] = expf(sc[j] - mx);
            sum += sc[j];
        }
        float *oh = t->att + (size_t)h * (size_t)hd;
        memset(oh, 0, (size_t)hd * sizeof(float));
        for (int j = j0; j <= pos; j++) k->axpy(oh, sc[j] / sum, vc + (size_t)j * kw + go, hd);
    }
    TRY(lin_fwd(t, l, TO, t->att, 1, t->tmp));
    if (c->sandwich_norm) {
        memcpy(t->ao, t->tmp, (size_t)H * sizeof(float));
        norm_fwd(t, t->tmp, t->ao, 1, wvec(lw, LW_POST_ATTN_NORM), NULL);
    }
    for (int i = 0; i < H; i++) t->x2[i] = x[i] + t->tmp[i];
    if (t->post) {
        memcpy(t->ao, t->x2, (size_t)H * sizeof(float));
        norm_fwd(t, t->x2, t->ao, 1, wvec(lw, LW_NORM1_W), wvec(lw, LW_NORM1_B));
        memcpy(t->h2, t->x2, (size_t)H * sizeof(float));
    } else {
        norm_fwd(t, t->h2, t->x2, 1, wvec(lw, LW_NORM2_W), wvec(lw, LW_NORM2_B));
    }
    if (moe_layer(t, l)) {
        TRY(moe_fwd(t, l, lw, t->h2, 1, t->tmp));
    } else if (t->blk.ffn == FT_FFN_SWIGLU) {
        TRY(lin_fwd(t, l, TG, t->h2, 1, t->gt));
        TRY(lin_fwd(t, l, TU, t->h2, 1, t->up));
        ffn_gate(c, t->mm, t->gt, t->up, (size_t)c->ffn);
    } else {
        TRY(lin_fwd(t, l, TU, t->h2, 1, t->up));
        for (int i = 0; i < c->ffn; i++) t->mm[i] = t->up[i] > 0.0f ? t->up[i] : 0.0f;
    }
    if (!moe_layer(t, l)) TRY(lin_fwd(t, l, TD, t->mm, 1, t->tmp));
    if (c->sandwich_norm) {
        memcpy(t->fo, t->tmp, (size_t)H * sizeof(float));
        norm_fwd(t, t->tmp, t->fo, 1, wvec(lw, LW_POST_FFN_NORM), NULL);
    }
    for (int i = 0; i < H; i++) x[i] = t->x2[i] + t->tmp[i];
    if (t->post) {
        memcpy(t->fo, x, (size_t)H * sizeof(float));
        norm_fwd(t, x, t->fo, 1, wvec(lw, LW_NORM2_W), wvec(lw, LW_NORM2_B));
    }
    return FT_OK;
}

ft_status ft_trainer_generate(ft_trainer *t, const int32_t *prompt, int n, int max_new, int32_t *out)
{
    if (!t || !out || max_new < 0) return ft_set_error(FT_ERR_INVALID_ARG, "ft_trainer_generate: bad argument");
    TRY(check_tokens(t, prompt, 1, n, 1));
    const ft_model_config *c = &t->cfg;
    if ((int64_t)n + max_new > c->max_pos)
        return ft_set_error(FT_ERR_INVALID_ARG, "generate: %d + %d tokens exceed the context of %d", n, max_new,
                            c->max_pos);
    const int total = n + max_new, H = c->hidden;
    if (total == 0 || max_new == 0) return FT_OK;
    TRY(ensure(t, 1, total));
    const size_t kw = (size_t)c->n_kv_heads * (size_t)c->head_dim, per = (size_t)total * kw;
    float *cache = malloc(2 * (size_t)c->n_layers * per * sizeof(float)), *sc = malloc((size_t)total * sizeof(float));
    float *x = malloc((size_t)H * sizeof(float)), *hf = malloc((size_t)H * sizeof(float));
    float *lg = malloc((size_t)c->vocab * sizeof(float));
    ft_status st = FT_OK;
    if (!cache || !sc || !x || !hf || !lg) {
        st = ft_set_error(FT_ERR_NOMEM, "generate: out of memory for the cache of %d tokens", total);
        goto done;
    }
    const ft_wmat *E = ft_model_global(t->m, GW_TOK_EMB), *Pin = ft_model_global(t->m, GW_PROJ_IN);
    int32_t tok = prompt[0];
    for (int pos = 0; pos < total - 1; pos++) {
        if (ft_wmat_present(Pin)) {
            ft_wmat_row_f32(E, tok, t->pin);
            if ((st = prod(t, x, H, t->pin, 1, Pin, 0, H, NULL))) goto done;
        } else {
            ft_wmat_row_f32(E, tok, x);
        }
        if (c->embed_scale != 0)
            for (int i = 0; i < H; i++) x[i] *= c->embed_scale;
        if (t->blk.pos == FT_POS_LEARNED) {
            ft_wmat_row_f32(ft_model_global(t->m, GW_POS_EMB), pos + t->blk.pos_offset, hf);
            for (int i = 0; i < H; i++) x[i] += hf[i];
        }
        for (int l = 0; l < c->n_layers && !st; l++) {
            st = use_layer(t, l, l + 1 < c->n_layers ? l + 1 : 0);
            if (!st)
                st = layer_step(t, l, pos, x, cache + (size_t)(2 * l) * per, cache + (size_t)(2 * l + 1) * per, sc);
        }
        if (st) goto done;
        if (pos + 1 < n) {
            tok = prompt[pos + 1];
            continue;
        }
        if ((st = head_row(t, x, hf, lg))) goto done;
        int best = 0;
        for (int v = 1; v < c->vocab; v++) if (lg[v] > lg[best]) best = v;
        out[pos + 1 - n] = best;
        tok = best;
    }
done:
    free(cache);
    free(sc);
    free(x);
    free(hf);
    free(lg);
    return st;
}
