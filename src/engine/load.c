/* Loading a Hugging Face model directory: config + safetensors checkpoint
 * (through model.h), every tensor checked for presence and exact shape and
 * stored once in the format it is computed in (f32/bf16/f16, or q8/q4
 * quantized here), the checkpoint's pages dropped behind. */
#define _GNU_SOURCE   /* O_DIRECT */
#include "engine_internal.h"
#include "flextier/model.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* The checkpoint's pages are read once: drop them after conversion so that
 * peak RSS stays near the f32 weights instead of weights + file. The
 * mapping stays valid (pages would be re-read from the file). */
static void drop_pages(const void *p, size_t n)
{
    long ps = sysconf(_SC_PAGESIZE);
    if (ps <= 0) return;
    uintptr_t a = ((uintptr_t)p + (uintptr_t)ps - 1) & ~((uintptr_t)ps - 1);
    uintptr_t e = ((uintptr_t)p + n) & ~((uintptr_t)ps - 1);
    if (e > a) (void)madvise((void *)a, e - a, MADV_DONTNEED);
}

ft_status ft_model_find_tensor(const ft_checkpoint *ck, const ft_arch *a, const char *name,
                               ft_tensor *t, char *used, size_t nused)
{
    ft_status st = ft_checkpoint_get(ck, name, t);
    snprintf(used, nused, "%s", name);
    if (st != FT_ERR_NOT_FOUND || !a->alt_from) return st;
    size_t n = strlen(a->alt_from);
    if (strncmp(name, a->alt_from, n)) return st;
    char alt[160];
    snprintf(alt, sizeof alt, "%s%s", a->alt_to, name + n);
    ft_status st2 = ft_checkpoint_get(ck, alt, t);
    if (st2 == FT_ERR_NOT_FOUND) {
        return ft_set_error(FT_ERR_NOT_FOUND, "checkpoint has no tensor \"%s\" (nor \"%s\")", name, alt);
    }
    if (!st2) snprintf(used, nused, "%s", alt);
    return st2;
}

ft_status ft_model_entry_tensor(const ft_checkpoint *ck, const ft_arch *a, const ft_model_tensor_entry *e,
                                ft_tensor *t, char *used, size_t nused)
{
    if (!e->sliced) return ft_model_find_tensor(ck, a, e->name, t, used, nused);
    const ft_src_slice *sl = &e->src;
    ft_tensor s;
    ft_status st = ft_model_find_tensor(ck, a, sl->name, &s, used, nused);
    if (st) return st;
    int three = sl->expert >= 0;
    int64_t cols = e->shape[1];
    int ok = (int)s.ndim == (three ? 3 : 2);
    if (ok && three) ok = s.shape[0] == sl->n_experts && s.shape[1] == sl->rows && s.shape[2] == cols;
    else if (ok) ok = s.shape[0] == sl->rows && s.shape[1] == cols;
    if (!ok) {
        char got[96];
        ft_shape_format(s.ndim, s.shape, got, sizeof got);
        if (three)
            return ft_set_error(FT_ERR_CORRUPT, "tensor \"%s\" has shape %s, config implies [%d, %d, %lld]", used,
                                got, sl->n_experts, sl->rows, (long long)cols);
        return ft_set_error(FT_ERR_CORRUPT, "tensor \"%s\" has shape %s, config implies [%d, %lld]", used, got,
                            sl->rows, (long long)cols);
    }
    size_t esz = (size_t)ft_dtype_nbytes(s.dtype, 1);
    size_t row = (size_t)(three ? sl->expert : 0) * (size_t)sl->rows + (size_t)sl->row0;
    *t = s;
    t->ndim = 2;
    t->shape[0] = e->shape[0];
    t->shape[1] = cols;
    t->data = (uint8_t *)s.data + row * (size_t)cols * esz;
    return FT_OK;
}

/* The checkpoint's own format: the dtype of layer 0's first matrix. */
static ft_status checkpoint_format(const ft_checkpoint *ck, const ft_model_config *cfg, ft_wfmt *out)
{
    const ft_arch *a = ft_arch_get(cfg->arch);
    char name[128], used[160];
    for (int s = 0; a && s < LW_COUNT; s++) {
        if (!ft_slot_is_matrix(s) || !a->layer_name(cfg, 0, s, name, sizeof name)) continue;
        ft_tensor t;
        ft_src_slice sl;
        if (a->layer_src && a->layer_src(cfg, 0, s, &sl)) snprintf(name, sizeof name, "%s", sl.name);
        ft_status st = ft_model_find_tensor(ck, a, name, &t, used, sizeof used);
        if (st) return st;
        switch (t.dtype) {
        case FT_F32: *out = FT_WF_F32; return FT_OK;
        case FT_BF16: *out = FT_WF_BF16; return FT_OK;
        case FT_F16: *out = FT_WF_F16; return FT_OK;
        default:
            return ft_set_error(FT_ERR_UNSUPPORTED, "tensor \"%s\" has dtype %s (need f32/f16/bf16)", used,
                                ft_dtype_name(t.dtype));
        }
    }
    *out = FT_WF_F32;
    return FT_OK;
}

ft_status ft_model_checkpoint_tensor(const ft_model *m, const ft_checkpoint *ck, size_t i, ft_tensor *t)
{
    if (!m || !ck || !t || i >= m->n_tensors) return ft_set_error(FT_ERR_INVALID_ARG, "model: tensor %zu", i);
    char used[160];
    return ft_model_entry_tensor(ck, m->arch, &m->tensors[i], t, used, sizeof used);
}

/* A streamed global: its rows stay in the checkpoint file, read with
 * pread (the tied head shares the embedding's), past the page cache with
 * stream_direct_io (a second descriptor, O_DIRECT; none where the file
 * system refuses it). */
static ft_status open_stream(ft_model *m, const ft_checkpoint *ck, const ft_model_tensor_entry *e, const ft_tensor *t,
                             const ft_load_params *lp, int layout_only, const char *used)
{
    if (e->ndim != 2 || e->fmt == FT_WF_Q8 || e->fmt == FT_WF_Q4)
        return ft_set_error(FT_ERR_UNSUPPORTED, "load: %s: only plain 2-D matrices are streamed", used);
    const char *path = NULL;
    uint64_t off = 0;
    ft_status st = ft_checkpoint_locate(ck, t->data, &path, &off);
    if (st) return st;
    ft_gstream *g = calloc(1, sizeof *g);
    if (!g) return ft_set_error(FT_ERR_NOMEM, "load: %s", used);
    g->dfd = -1;
    g->fd = layout_only ? -1 : open(path, O_RDONLY | O_CLOEXEC);
    if (g->fd < 0 && !layout_only) {
        st = ft_set_error(FT_ERR_IO, "load: %s (streamed %s): %s", path, used, strerror(errno));
        free(g);
        return st;
    }
    int direct = lp->stream_direct_io > 0 || (lp->stream_direct_io < 0 && lp->stream_drop_cache);
    if (direct && !layout_only) {
        g->dfd = open(path, O_RDONLY | O_CLOEXEC | O_DIRECT);
        if (g->dfd < 0)
            FT_LOG(FT_LOG_DEBUG, "load: streamed %s: %s refuses O_DIRECT (%s): read through the page cache", used,
                   path, strerror(errno));
    }
    /* a layout-only model counts the reader's second chunk buffer the
     * load would have (unless the file system then refuses O_DIRECT) */
    g->direct = direct && (layout_only || g->dfd >= 0);
    g->off = off;
    g->src = t->dtype;
    g->fmt = e->fmt;
    g->rows = (int)e->shape[0];
    g->cols = (int)e->shape[1];
    g->drop_cache = lp->stream_drop_cache;
    g->chunk_rows = lp->stream_chunk_rows > 0 && lp->stream_chunk_rows < (1 << 24) ? lp->stream_chunk_rows : 0;
    char nm[128];
    int tied = !m->arch->global_name(&m->cfg, GW_LM_HEAD, nm, sizeof nm);
    if (e->slot == GW_TOK_EMB) {
        m->gs_emb = g;
        if (tied) m->gs_head = g;
    } else {
        m->gs_head = g;
    }
    return FT_OK;
}

ft_status ft_model_load(const char *dir, const ft_load_params *params, ft_model **out)
{
    if (!dir || !out) return ft_set_error(FT_ERR_INVALID_ARG, "load: NULL argument");
    ft_model_config cfg;
    ft_status st = ft_model_config_load_ex(dir, params ? params->config_flags : 0, &cfg);
    if (st) return st;
    ft_checkpoint *ck = NULL;
    ft_model *m = NULL;
    ft_codec_ctx *cc = NULL;
    void *tmp = NULL;
    size_t tmp_cap = 0;
    if ((st = ft_checkpoint_open(dir, &ck))) return st;
    int external = params ? params->external_layers : 0;   /* 0, 1 or FT_LOAD_LAYOUT_ONLY */
    ft_wfmt want = FT_WF_F32;
    if (params && params->weights == FT_WEIGHTS_AS_STORED) {
        if ((st = checkpoint_format(ck, &cfg, &want))) goto fail;
    } else if (params) {
        if (params->weights < FT_WF_F32 || params->weights > FT_WF_Q4) {
            st = ft_set_error(FT_ERR_INVALID_ARG, "load: weight format %d", params->weights);
            goto fail;
        }
        want = (ft_wfmt)params->weights;
    }
    if ((st = ft_model_create_stream(&cfg, external, want, params ? params->stream_globals : 0, &m))) goto fail;
    uint64_t done = 0, total = m->weight_bytes;
    double last = ft_now();
    for (size_t i = 0; i < m->n_tensors; i++) {
        ft_model_tensor_entry *e = &m->tensors[i];
        ft_tensor t;
        char used[160];
        if ((st = ft_model_entry_tensor(ck, m->arch, e, &t, used, sizeof used))) {
            if (st == FT_ERR_NOT_FOUND)
                st = ft_set_error(FT_ERR_NOT_FOUND, "%s: checkpoint has no tensor \"%s\" needed by "
                                  "this %s config", dir, e->name, cfg.model_type);
            goto fail;
        }
        int ok = (int)t.ndim == e->ndim;
        for (int d = 0; ok && d < e->ndim; d++) ok = t.shape[d] == e->shape[d];
        if (!ok) {
            char got[96], expect[96];
            ft_shape_format(t.ndim, t.shape, got, sizeof got);
            ft_shape_format((uint32_t)e->ndim, e->shape, expect, sizeof expect);
            st = ft_set_error(FT_ERR_CORRUPT, "%s: tensor \"%s\" has shape %s, config implies %s",
                              dir, used, got, expect);
            goto fail;
        }
        if (t.dtype != FT_F32 && t.dtype != FT_F16 && t.dtype != FT_BF16) {
            st = ft_set_error(FT_ERR_UNSUPPORTED, "%s: tensor \"%s\" has dtype %s (need f32/f16/bf16)",
                              dir, used, ft_dtype_name(t.dtype));
            goto fail;
        }
        size_t n = e->ndim == 1 ? (size_t)e->shape[0] : (size_t)(e->shape[0] * e->shape[1]);
        if (e->streamed) {   /* layout only: described, no file opened */
            if ((st = open_stream(m, ck, e, &t, params, external == FT_LOAD_LAYOUT_ONLY, used))) goto fail;
            continue;
        }
        if (!e->data) continue;   /* external layer tensor: checked only */
        size_t esz = (size_t)ft_dtype_nbytes(t.dtype, 1);
        if (e->fmt == FT_WF_Q8 || e->fmt == FT_WF_Q4) {
            /* quantized whole (one layer matrix): from an aligned copy, as
             * the mapping may be unaligned for the dtype */
            if (!cc && (st = ft_codec_ctx_create(0, &cc))) goto fail;
            ft_tensor q = t;
            if ((uintptr_t)t.data % esz) {   /* misaligned for its dtype: copy */
                if (tmp_cap < n * esz) {
                    ft_free_aligned(tmp);
                    tmp_cap = 0;
                    if (!(tmp = ft_malloc_aligned(n * esz, 64))) { st = ft_set_error(FT_ERR_NOMEM, "load: %s", used); goto fail; }
                    tmp_cap = n * esz;
                }
                memcpy(tmp, t.data, n * esz);
                q.data = tmp;
            }
            st = ft_model_store(m, e, &q, cc);
            drop_pages(t.data, n * esz);
            if (st) goto fail;
        } else {
            /* in 1M-element chunks, dropping the file pages behind us; the
             * view may be unaligned: ft_convert/memcpy handle any alignment */
            ft_dtype dd = e->fmt == FT_WF_BF16 ? FT_BF16 : e->fmt == FT_WF_F16 ? FT_F16 : FT_F32;
            size_t dsz = (size_t)ft_dtype_nbytes(dd, 1);
            for (size_t k = 0; k < n; k += (1u << 20)) {
                size_t cnt = n - k < (1u << 20) ? n - k : (1u << 20);
                const char *srcp = (const char *)t.data + k * esz;
                if ((st = ft_convert(e->data + k * dsz, dd, srcp, t.dtype, cnt))) goto fail;
                drop_pages(srcp, cnt * esz);
            }
            if ((st = ft_model_bind(m, e))) goto fail;
        }
        done += e->bytes;
        if (params && params->progress && ft_now() - last > 0.5) {
            params->progress(params->user, done, total);
            last = ft_now();
        }
    }
    ft_free_aligned(tmp);
    tmp = NULL;
    ft_codec_ctx_free(cc);
    cc = NULL;
    if (params && params->progress) params->progress(params->user, total, total);
    ft_checkpoint_close(ck);
    *out = m;
    return FT_OK;
fail:
    ft_free_aligned(tmp);
    ft_codec_ctx_free(cc);
    ft_model_free(m);
    ft_checkpoint_close(ck);
    return st;
}
