/* The offloading scheduler: layer weights streamed through the tiers of a
 * policy with a prefetching I/O thread and two slot buffers. */
#include "flextier/offload.h"
#include "flextier/model.h"
#include "engine/engine_internal.h"
#include "offload_internal.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SLOTS LW_COUNT

typedef struct {
    int present;
    ft_tier tier;
    ft_store *store;                  /* per layer: see keys/stores below */
    size_t pack;                      /* floats into its packed block: the
                                         layer's resident block (device
                                         tier) or a streaming slot (others) */
    size_t numel;
    uint64_t src_bytes;               /* bytes in the checkpoint dtype    */
} slot_info;

struct ft_offload {
    ft_model *m;
    int n_layers;
    ft_offload_params p;
    size_t dev_stride, stream_stride; /* floats of the packed blocks */
    slot_info slot[MAX_SLOTS];
    int n_streamed;                   /* slots not on the device */
    /* stores */
    ft_store *host, *disk, *remote[FT_MAX_REMOTES];
    /* per (layer, slot): key and store of streamed tensors; resident data */
    char (*keys)[96];
    ft_store **stores;
    uint64_t *wire;                   /* encoded bytes per (layer, slot) */
    float *resident;                  /* n_layers x dev_stride */
    float *slots[2];                  /* streaming buffers, one layer each */
    int slot_layer[2];                /* layer held by slots[k], -1 none  */
    /* I/O thread */
    pthread_t io;
    int io_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int want_layer, want_buf;         /* job: -1 none */
    int busy_layer, busy_buf;         /* being fetched, -1 none */
    int err_layer;                    /* fetch that failed, -1 none */
    ft_status err_status;
    char err_msg[256];
    int stop;
    ft_offload_stats st;
};

void ft_offload_default_params(ft_offload_params *p)
{
    memset(p, 0, sizeof *p);
    ft_policy_default(&p->policy);
    p->group_size = FT_DEFAULT_GROUP_SIZE;
    p->group_dim = -1;
}

static ft_status open_store(const char *uri, const ft_offload_params *p, ft_store **out)
{
    ft_store_params sp;
    ft_store_default_params(&sp);
    sp.token_file = p->token_file;
    sp.codec_threads = 1;   /* the store's workers decode; compute keeps the rest */
    sp.queue_depth = 8;     /* a layer's tensors are read at once */
    ft_status st = ft_store_open(uri, &sp, out);
    if (st) return ft_set_error(st, "offload: cannot open %s: %s", uri, ft_last_error());
    return FT_OK;
}

static ft_status ck_get(const ft_model *m, const ft_checkpoint *ck, const char *name, ft_tensor *t)
{
    char used[160];
    return ft_model_find_tensor(ck, m->arch, name, t, used, sizeof used);
}

static ft_codec_params weight_codec(const ft_offload *o, int ndim)
{
    ft_codec_params cp;
    ft_codec_default_params(&cp);
    cp.codec = o->p.policy.compress_weights;
    cp.entropy = FT_CODEC_ZSTD;
    cp.group_size = o->p.group_size ? o->p.group_size : FT_DEFAULT_GROUP_SIZE;
    cp.group_dim = o->p.group_dim;
    /* As FlexGen: 1-D tensors (norms, biases) are never quantized. */
    if (ndim < 2 && ft_codec_is_lossy(cp.codec)) cp.codec = FT_CODEC_RAW;
    return cp;
}

/* Content-addressed key: hash of the source bytes, dtype, shape + codec. */
static void make_key(const ft_tensor *src, uint64_t nbytes, const ft_codec_params *cp, char *key, size_t n)
{
    uint64_t seed = ((uint64_t)src->dtype << 56) ^ ((uint64_t)src->ndim << 48);
    for (uint32_t i = 0; i < src->ndim; i++) seed = seed * 1000003u ^ (uint64_t)src->shape[i];
    uint64_t h = ft_xxh3_seed(src->data, (size_t)nbytes, seed);
    if (ft_codec_is_lossy(cp->codec))
        snprintf(key, n, "w-%016llx-%s-g%u-d%d", (unsigned long long)h, ft_codec_name(cp->codec),
                 cp->group_size, cp->group_dim);
    else if (cp->codec == FT_CODEC_BYTEPLANE)
        snprintf(key, n, "w-%016llx-bp-%s", (unsigned long long)h, ft_codec_name(cp->entropy));
    else
        snprintf(key, n, "w-%016llx-%s", (unsigned long long)h, ft_codec_name(cp->codec));
}

/* ------------------------------------------------------------ I/O thread */

/* Fetch every streamed tensor of a layer at once (asynchronous reads, so
 * the link never idles between tensors and tensors on different memory
 * nodes move in parallel), decoded to f32 straight into buf. */
static ft_status fetch_layer(ft_offload *o, int layer, float *buf, uint64_t *logical, uint64_t *wire)
{
    ft_request *req[MAX_SLOTS] = {0};
    ft_tensor dst[MAX_SLOTS];
    ft_status st = FT_OK;
    for (int s = 0; s < MAX_SLOTS && st == FT_OK; s++) {
        slot_info *si = &o->slot[s];
        if (!si->present || si->tier == FT_TIER_DEVICE) continue;
        size_t idx = (size_t)layer * MAX_SLOTS + (size_t)s;
        memset(&dst[s], 0, sizeof dst[s]);
        dst[s].dtype = FT_F32;
        dst[s].data = buf + si->pack;
        st = ft_read_tensor_async(o->stores[idx], o->keys[idx], &dst[s], si->numel * sizeof(float), &req[s]);
        if (st) st = ft_set_error(st, "layer %d: reading %s from the %s tier: %s", layer, o->keys[idx],
                                  ft_tier_name(si->tier), ft_last_error());
    }
    for (int s = 0; s < MAX_SLOTS; s++) {
        if (!req[s]) continue;
        slot_info *si = &o->slot[s];
        size_t idx = (size_t)layer * MAX_SLOTS + (size_t)s;
        ft_status r = ft_request_wait(req[s], -1);
        if (r && st == FT_OK)
            st = ft_set_error(r, "layer %d: reading %s from the %s tier: %s", layer, o->keys[idx],
                              ft_tier_name(si->tier), ft_last_error());
        ft_request_free(req[s]);
        uint64_t ne;
        if (r == FT_OK && st == FT_OK && (ft_tensor_numel(&dst[s], &ne) || ne != si->numel))
            st = ft_set_error(FT_ERR_CORRUPT, "layer %d: %s has the wrong shape", layer, o->keys[idx]);
        if (r == FT_OK) {
            logical[si->tier] += si->src_bytes;
            wire[si->tier] += o->wire[idx];
        }
    }
    return st;
}

static void *io_main(void *arg)
{
    ft_offload *o = arg;
    pthread_mutex_lock(&o->mu);
    for (;;) {
        while (!o->stop && o->want_layer < 0) pthread_cond_wait(&o->cv, &o->mu);
        if (o->stop) break;
        int layer = o->want_layer, b = o->want_buf;
        o->want_layer = -1;
        o->busy_layer = layer;
        o->busy_buf = b;
        pthread_mutex_unlock(&o->mu);
        uint64_t logical[FT_TIER_COUNT] = {0}, wire[FT_TIER_COUNT] = {0};
        double t0 = ft_now();
        ft_clear_error();
        ft_status st = fetch_layer(o, layer, o->slots[b], logical, wire);
        double dt = ft_now() - t0;
        pthread_mutex_lock(&o->mu);
        for (int t = 0; t < FT_TIER_COUNT; t++) {
            o->st.logical_bytes[t] += logical[t];
            o->st.wire_bytes[t] += wire[t];
        }
        o->st.io_busy_s += dt;
        o->st.layers_fetched++;
        o->busy_layer = -1;
        if (st == FT_OK) {
            o->slot_layer[b] = layer;
        } else {
            o->err_layer = layer;
            o->err_status = st;
            snprintf(o->err_msg, sizeof o->err_msg, "%s", ft_last_error());
        }
        pthread_cond_broadcast(&o->cv);
    }
    pthread_mutex_unlock(&o->mu);
    return NULL;
}

/* Queue layer into buffer b (caller holds mu; the I/O thread is idle or
 * busy with another buffer). */
static void request(ft_offload *o, int layer, int b)
{
    o->want_layer = layer;
    o->want_buf = b;
    o->slot_layer[b] = -1;
    pthread_cond_broadcast(&o->cv);
}

static int pending(const ft_offload *o, int layer)
{
    return o->want_layer == layer || o->busy_layer == layer;
}

ft_status ft_offload_hook(void *arg, int layer, ft_layer_weights *w)
{
    ft_offload *o = arg;
    if (!o || layer < 0 || layer >= o->n_layers) return FT_ERR_INVALID_ARG;
    float *base = NULL;
    if (o->n_streamed) {
        double t0 = ft_now();
        pthread_mutex_lock(&o->mu);
        int b = -1;
        for (;;) {
            for (int k = 0; k < 2; k++) if (o->slot_layer[k] == layer) b = k;
            if (b >= 0) break;
            if (o->err_layer == layer) {
                ft_status st = o->err_status;
                char msg[256];
                snprintf(msg, sizeof msg, "%s", o->err_msg);
                o->err_layer = -1;
                pthread_mutex_unlock(&o->mu);
                return ft_set_error(st, "%s", msg);
            }
            if (!pending(o, layer) && o->want_layer < 0 && o->busy_layer < 0) {
                /* Not prefetched (first layer of a run): any buffer is
                 * free, since the previous layer has been computed. */
                int nb = o->slot_layer[0] < 0 ? 0 : o->slot_layer[1] < 0 ? 1 : (layer & 1);
                request(o, layer, nb);
            }
            pthread_cond_wait(&o->cv, &o->mu);
        }
        /* Prefetch the next layer (wrapping to 0 for the next step) into
         * the other buffer, whose layer has been computed. */
        int next = (layer + 1) % o->n_layers;
        if (next != layer && o->slot_layer[1 - b] != next && !pending(o, next) && o->want_layer < 0 &&
            !(o->busy_layer >= 0 && o->busy_buf == 1 - b))
            request(o, next, 1 - b);
        o->st.wait_s += ft_now() - t0;
        pthread_mutex_unlock(&o->mu);
        base = o->slots[b];
    }
    float *res = o->resident + (size_t)layer * o->dev_stride;
    for (int s = 0; s < MAX_SLOTS; s++) {
        slot_info *si = &o->slot[s];
        if (!si->present) continue;
        *ft_layer_slot(w, s) = (si->tier == FT_TIER_DEVICE ? res : base) + si->pack;
    }
    return FT_OK;
}

/* ---------------------------------------------------------------- setup */

static ft_store *tier_store(ft_offload *o, ft_tier t, int layer, int slot)
{
    switch (t) {
    case FT_TIER_HOST: return o->host;
    case FT_TIER_DISK: return o->disk;
    case FT_TIER_REMOTE: return o->remote[(size_t)(layer + slot) % o->p.policy.n_remotes];
    default: return NULL;
    }
}

ft_status ft_offload_create(ft_model *m, const char *model_dir, const ft_offload_params *p,
                            ft_offload **out)
{
    if (!m || !model_dir || !p || !out) return FT_ERR_INVALID_ARG;
    ft_status st = ft_policy_validate(&p->policy);
    if (st) return st;
    if (p->policy.a_pct[FT_TIER_DEVICE] != 100.0f)
        return ft_set_error(FT_ERR_UNSUPPORTED, "offload: activations must stay on the device (a=100,0,0,0): "
                            "the engine keeps each step's hidden states in its working set");
    ft_offload *o = calloc(1, sizeof *o);
    if (!o) return FT_ERR_NOMEM;
    o->m = m;
    o->p = *p;
    o->n_layers = m->cfg.n_layers;
    o->slot_layer[0] = o->slot_layer[1] = -1;
    o->want_layer = o->busy_layer = o->err_layer = -1;
    pthread_mutex_init(&o->mu, NULL);
    pthread_cond_init(&o->cv, NULL);
    ft_checkpoint *ck = NULL;
    void *tmp = NULL;
    size_t tmp_cap = 0;

    /* Layout of one layer (same for all layers) and the source sizes. */
    uint64_t bytes[MAX_SLOTS];
    int slot_ids[MAX_SLOTS], n = 0;
    if ((st = ft_checkpoint_open(model_dir, &ck))) goto fail;
    for (size_t i = 0; i < m->n_tensors; i++) {
        ft_model_tensor_entry *e = &m->tensors[i];
        if (e->layer != 0) continue;
        ft_tensor src;
        if ((st = ck_get(m, ck, e->name, &src))) {
            st = ft_set_error(st, "offload: %s: %s", e->name, ft_last_error());
            goto fail;
        }
        slot_info *si = &o->slot[e->slot];
        si->present = 1;
        si->numel = (size_t)(e->ndim == 1 ? e->shape[0] : e->shape[0] * e->shape[1]);
        si->src_bytes = ft_dtype_nbytes(src.dtype, si->numel);
        bytes[n] = si->src_bytes;
        slot_ids[n++] = e->slot;
    }
    ft_tier tiers[MAX_SLOTS];
    ft_policy_place(&p->policy, bytes, (size_t)n, tiers);
    for (int k = 0; k < n; k++) {
        o->slot[slot_ids[k]].tier = tiers[k];
        if (tiers[k] != FT_TIER_DEVICE) o->n_streamed++;
    }
    /* Memory: each layer's device-tier tensors packed in a resident block,
     * the streamed ones packed in each of two slots (64-byte aligned). */
    for (int s = 0; s < MAX_SLOTS; s++) {
        slot_info *si = &o->slot[s];
        if (!si->present) continue;
        size_t *stride = si->tier == FT_TIER_DEVICE ? &o->dev_stride : &o->stream_stride;
        si->pack = *stride;
        *stride += (si->numel + 15) & ~(size_t)15;
    }
    o->st.resident_bytes = (uint64_t)o->dev_stride * 4 * (uint64_t)o->n_layers;
    o->st.slot_bytes = 2ull * o->stream_stride * 4;
    if (p->device_budget && o->st.resident_bytes + o->st.slot_bytes > p->device_budget) {
        st = ft_set_error(FT_ERR_NO_SPACE,
                          "offload: the policy needs %.1f MiB of device memory for weights "
                          "(%.1f resident + %.1f for two streaming slots), budget %.1f MiB",
                          (double)(o->st.resident_bytes + o->st.slot_bytes) / 1048576.0,
                          (double)o->st.resident_bytes / 1048576.0, (double)o->st.slot_bytes / 1048576.0,
                          (double)p->device_budget / 1048576.0);
        goto fail;
    }
    if (o->dev_stride) {
        o->resident = ft_malloc_aligned(o->dev_stride * 4 * (size_t)o->n_layers, 64);
        if (!o->resident) { st = ft_set_error(FT_ERR_NOMEM, "offload: resident weights"); goto fail; }
    }
    if (o->n_streamed) {
        for (int k = 0; k < 2; k++) {
            o->slots[k] = ft_malloc_aligned(o->stream_stride * 4, 64);
            if (!o->slots[k]) { st = ft_set_error(FT_ERR_NOMEM, "offload: slot buffers"); goto fail; }
        }
        if (p->policy.w_pct[FT_TIER_HOST] > 0 && (st = open_store("mem:", p, &o->host))) goto fail;
        if (p->policy.w_pct[FT_TIER_DISK] > 0 && (st = open_store(p->policy.disk_uri, p, &o->disk))) goto fail;
        if (p->policy.w_pct[FT_TIER_REMOTE] > 0)
            for (uint32_t r = 0; r < p->policy.n_remotes; r++)
                if ((st = open_store(p->policy.remotes[r], p, &o->remote[r]))) goto fail;
    }
    size_t nkeys = (size_t)o->n_layers * MAX_SLOTS;
    o->keys = calloc(nkeys, sizeof *o->keys);
    o->stores = calloc(nkeys, sizeof *o->stores);
    o->wire = calloc(nkeys, sizeof *o->wire);
    if (!o->keys || !o->stores || !o->wire) { st = FT_ERR_NOMEM; goto fail; }

    /* Place every layer tensor: load device ones, upload the rest unless
     * the store already holds the same encoding. */
    uint64_t total = 0, done = 0;
    for (int s = 0; s < MAX_SLOTS; s++) if (o->slot[s].present) total += o->slot[s].src_bytes * (uint64_t)o->n_layers;
    for (size_t i = 0; i < m->n_tensors; i++) {
        ft_model_tensor_entry *e = &m->tensors[i];
        if (e->layer < 0) continue;
        slot_info *si = &o->slot[e->slot];
        ft_tensor src;
        if ((st = ck_get(m, ck, e->name, &src))) {
            st = ft_set_error(st, "offload: %s: %s", e->name, ft_last_error());
            goto fail;
        }
        uint64_t nb = ft_dtype_nbytes(src.dtype, si->numel);
        if (tmp_cap < nb) {
            ft_free_aligned(tmp);
            tmp = ft_malloc_aligned((size_t)nb, 64);
            tmp_cap = tmp ? (size_t)nb : 0;
            if (!tmp) { st = FT_ERR_NOMEM; goto fail; }
        }
        memcpy(tmp, src.data, (size_t)nb);   /* the mapping may be unaligned */
        src.data = tmp;
        if (si->tier == FT_TIER_DEVICE) {
            float *dst = o->resident + (size_t)e->layer * o->dev_stride + si->pack;
            if ((st = ft_convert(dst, FT_F32, tmp, src.dtype, si->numel))) goto fail;
        } else {
            size_t idx = (size_t)e->layer * MAX_SLOTS + (size_t)e->slot;
            ft_codec_params cp = weight_codec(o, e->ndim);
            make_key(&src, nb, &cp, o->keys[idx], sizeof o->keys[idx]);
            o->stores[idx] = tier_store(o, si->tier, e->layer, e->slot);
            ft_tensor_stat ts;
            st = ft_stat_tensor(o->stores[idx], o->keys[idx], &ts);
            if (st == FT_OK) {
                o->st.reused_bytes += nb;
            } else if (st == FT_ERR_NOT_FOUND) {
                if ((st = ft_write_tensor(o->stores[idx], o->keys[idx], &src, &cp))) {
                    st = ft_set_error(st, "offload: writing %s to the %s tier: %s", e->name,
                                      ft_tier_name(si->tier), ft_last_error());
                    goto fail;
                }
                if ((st = ft_stat_tensor(o->stores[idx], o->keys[idx], &ts))) goto fail;
                o->st.uploaded_bytes += nb;
            } else {
                st = ft_set_error(st, "offload: stat %s on the %s tier: %s", e->name, ft_tier_name(si->tier),
                                  ft_last_error());
                goto fail;
            }
            o->wire[idx] = ts.stored_bytes;
        }
        done += nb;
        if (p->progress) p->progress(p->user, done, total);
    }
    ft_free_aligned(tmp);
    tmp = NULL;
    ft_checkpoint_close(ck);
    ck = NULL;
    if (o->n_streamed) {
        if (pthread_create(&o->io, NULL, io_main, o)) { st = ft_set_error(FT_ERR_NOMEM, "offload: I/O thread"); goto fail; }
        o->io_started = 1;
    } else {
        /* Nothing streams: point the layers at the resident weights now. */
        for (int l = 0; l < o->n_layers; l++) ft_offload_hook(o, l, &m->layers[l]);
    }
    *out = o;
    return FT_OK;
fail:
    ft_free_aligned(tmp);
    ft_checkpoint_close(ck);
    ft_offload_free(o);
    return st;
}

void ft_offload_free(ft_offload *o)
{
    if (!o) return;
    if (o->io_started) ft_io_thread_stop(&o->mu, &o->cv, &o->stop, o->io);
    ft_store_close(o->host);
    ft_store_close(o->disk);
    for (int r = 0; r < FT_MAX_REMOTES; r++) ft_store_close(o->remote[r]);
    free(o->keys);
    free(o->stores);
    free(o->wire);
    ft_free_aligned(o->resident);
    ft_free_aligned(o->slots[0]);
    ft_free_aligned(o->slots[1]);
    pthread_mutex_destroy(&o->mu);
    pthread_cond_destroy(&o->cv);
    free(o);
}

void ft_offload_get_stats(const ft_offload *o, ft_offload_stats *out)
{
    ft_offload *mo = (ft_offload *)o;
    pthread_mutex_lock(&mo->mu);
    *out = o->st;
    pthread_mutex_unlock(&mo->mu);
}

void ft_offload_reset_stats(ft_offload *o)
{
    pthread_mutex_lock(&o->mu);
    uint64_t up = o->st.uploaded_bytes, re = o->st.reused_bytes, res = o->st.resident_bytes, sl = o->st.slot_bytes;
    memset(&o->st, 0, sizeof o->st);
    o->st.uploaded_bytes = up;
    o->st.reused_bytes = re;
    o->st.resident_bytes = res;
    o->st.slot_bytes = sl;
    pthread_mutex_unlock(&o->mu);
}

ft_status ft_cost_inputs_from_model(const ft_model *m, ft_cost_inputs *in)
{
    if (!m || !in) return FT_ERR_INVALID_ARG;
    in->n_layers = (uint32_t)m->cfg.n_layers;
    in->hidden = (uint32_t)m->cfg.hidden;
    in->kv_bytes_per_token = 2ull * (uint64_t)m->cfg.n_kv_heads * (uint64_t)m->cfg.head_dim * 4;
    in->kv_group = (uint32_t)m->cfg.head_dim % FT_DEFAULT_GROUP_SIZE ? (uint32_t)m->cfg.head_dim : FT_DEFAULT_GROUP_SIZE;
    in->compute_bytes_per_param = 4;
    in->layer_params = 0;
    in->n_tensors = 0;
    /* the scheduler's order: layer 0's entries as the model lists them */
    for (size_t i = 0; i < m->n_tensors; i++) {
        const ft_model_tensor_entry *e = &m->tensors[i];
        if (e->layer != 0) continue;
        uint64_t n = e->ndim == 1 ? (uint64_t)e->shape[0] : (uint64_t)(e->shape[0] * e->shape[1]);
        if (in->n_tensors == FT_COST_MAX_TENSORS) return ft_set_error(FT_ERR_INTERNAL, "too many tensors per layer");
        in->tensor_numel[in->n_tensors++] = n;
        in->layer_params += n;
    }
    return FT_OK;
}

ft_tier ft_offload_tier_of(const ft_offload *o, int slot)
{
    return slot >= 0 && slot < MAX_SLOTS ? o->slot[slot].tier : FT_TIER_DEVICE;
}
