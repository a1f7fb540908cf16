/* LoRA adapters merged into a Hugging Face checkpoint (train.h,
 * ft_lora_merge_checkpoint): W' = W + sum_k s_k B_k A_k in f32, each
 * adapter after the one before (PEFT's merge_and_unload adds
 * delta = B A * scaling per adapter), written as one model.safetensors
 * with the streaming writer (one tensor held at a time), and the
 * directory's other files (config, tokenizer, generation config, chat
 * template) copied. */
#include "train/train_internal.h"

#include "flextier/model.h"

#include <dirent.h>
#include <errno.h>
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct merge_ctx {
    const ft_checkpoint *ck;
    const char *const *names;   /* per output tensor: the source tensor */
    ft_dtype *out_dt;
    ft_peft_adapter *const *ads;
    const float *scales;
    size_t n_ads;
    uint8_t *buf;               /* the current tensor's output bytes */
    size_t buf_i;
    int have;
    size_t *used;               /* per adapter: modules merged */
    size_t *eoff;               /* per adapter: its modules' first index in eused / ekind */
    size_t *eused;              /* per module: expert matrices merged into (target_parameters) */
    int *ekind;                 /* per module: 1 gate_up, 2 down (found from the matrices' shapes) */
} merge_ctx;

/* "model.layers.L.<block>.experts.E.<proj>.weight" (a checkpoint's
 * per-expert matrix: mixtral's w1 w3 w2, the others' gate_proj up_proj
 * down_proj) -> layer, expert, kind (LW_EXP_GATE/UP/DOWN order: 0 gate,
 * 1 up, 2 down); 0 if it is not one */
static int expert_tensor(const char *name, int *layer, int *expert, int *kind)
{
    const char *p = strstr(name, "layers.");
    if (!p) return 0;
    char *end;
    long L = strtol(p + 7, &end, 10);
    if (end == p + 7 || L < 0 || L > 1000000 || *end != '.') return 0;
    const char *q = strstr(end, ".experts.");
    if (!q) return 0;
    long e = strtol(q + 9, &end, 10);
    if (end == q + 9 || e < 0 || e > 1000000 || *end != '.') return 0;
    static const char *const pr[6] = {".w1.weight", ".w3.weight", ".w2.weight", ".gate_proj.weight", ".up_proj.weight",
                                      ".down_proj.weight"};
    for (int k = 0; k < 6; k++)
        if (!strcmp(end, pr[k])) {
            *layer = (int)L;
            *expert = (int)e;
            *kind = k % 3;
            return 1;
        }
    return 0;
}

/* the layer of an experts module "model.layers.L.mlp.experts"; -1 */
static int experts_layer(const char *module)
{
    const char *p = strstr(module, "layers.");
    if (!p) return -1;
    char *end;
    long L = strtol(p + 7, &end, 10);
    return end == p + 7 || L < 0 || L > 1000000 || strcmp(end, ".mlp.experts") ? -1 : (int)L;
}

static int is_float(ft_dtype d) { return d == FT_F32 || d == FT_BF16 || d == FT_F16; }

/* tensor i's bytes (converted, merged) into m->buf */
static ft_status build(merge_ctx *m, size_t i)
{
    ft_tensor x;
    ft_status st = ft_checkpoint_get(m->ck, m->names[i], &x);
    if (st) return st;
    size_t n = 1;
    for (uint32_t d = 0; d < x.ndim; d++) n *= (size_t)x.shape[d];
    free(m->buf);
    m->buf = NULL;
    m->have = 0;
    if (!is_float(x.dtype)) {   /* not a float tensor: as it is */
        size_t b = n * (ft_dtype_bits(x.dtype) / 8);
        if (!(m->buf = malloc(b ? b : 1))) return ft_set_error(FT_ERR_NOMEM, "merge: %s", m->names[i]);
        memcpy(m->buf, x.data, b);
        m->buf_i = i;
        m->have = 1;
        return FT_OK;
    }
    float *w = malloc((n ? n : 1) * sizeof(float));
    if (!w) return ft_set_error(FT_ERR_NOMEM, "merge: %s: %zu floats", m->names[i], n);
    if ((st = ft_convert(w, FT_F32, x.data, x.dtype, n))) {
        free(w);
        return st;
    }
    size_t nl = strlen(m->names[i]);
    int xl = -1, xe = -1, xk = -1, is_exp = x.ndim == 2 && expert_tensor(m->names[i], &xl, &xe, &xk);
    for (size_t k = 0; k < m->n_ads; k++) {
        const ft_peft_adapter *a = m->ads[k];
        for (size_t j = 0; j < a->n; j++) {
            const ft_peft_module *md = &a->mods[j];
            if (md->experts) {
                /* LoRA on the fused expert parameter (transformers 5): expert xe's
                 * A rows, its B columns j E + e; gate_up's gate rows [0, F), up [F, 2F) */
                const int rows = (int)x.shape[0], cols = (int)x.shape[1], E = md->experts, rk = md->rank;
                if (!is_exp || xl != experts_layer(md->module) || xe >= E) continue;
                int gu = xk != 2 && md->out == 2 * rows && md->in == cols, dn = xk == 2 && md->out == rows &&
                                                                                  md->in == cols;
                if (!gu && !dn) continue;
                const int o0 = xk == 1 ? rows : 0;
                const float s = a->scale * m->scales[k], *Ae = md->A + (size_t)xe * (size_t)rk * (size_t)md->in;
                for (int o = 0; o < rows; o++) {
                    float *wr = w + (size_t)o * (size_t)cols;
                    for (int r = 0; r < rk; r++) {
                        float b = md->B[(size_t)(o0 + o) * (size_t)E * (size_t)rk + (size_t)r * (size_t)E + (size_t)xe];
                        const float *ar = Ae + (size_t)r * (size_t)cols;
                        for (int c = 0; c < cols; c++) wr[c] += b * ar[c] * s;
                    }
                }
                m->eused[m->eoff[k] + j]++;
                m->ekind[m->eoff[k] + j] = gu ? 1 : 2;
                continue;
            }
            size_t ml = strlen(md->module);
            if (nl != ml + 7 || strncmp(m->names[i], md->module, ml) || strcmp(m->names[i] + ml, ".weight")) continue;
            if (x.ndim != 2 || x.shape[0] != md->out || x.shape[1] != md->in) {
                free(w);
                return ft_set_error(FT_ERR_INVALID_ARG, "merge: %s is [%lld, %lld], the adapter's B A is [%d, %d] "
                                    "(an adapter of another model?)", m->names[i], (long long)x.shape[0],
                                    x.ndim > 1 ? (long long)x.shape[1] : 0LL, md->out, md->in);
            }
            /* delta = (B A) * scaling, then W += delta (PEFT's order) */
            const float s = a->scale * m->scales[k];
            float *row = malloc((size_t)md->in * sizeof(float));
            if (!row) {
                free(w);
                return ft_set_error(FT_ERR_NOMEM, "merge: row");
            }
            for (int o = 0; o < md->out; o++) {
                memset(row, 0, (size_t)md->in * sizeof(float));
                for (int r = 0; r < md->rank; r++) {
                    float b = md->B[(size_t)o * (size_t)md->rank + (size_t)r];
                    const float *ar = md->A + (size_t)r * (size_t)md->in;
                    for (int c = 0; c < md->in; c++) row[c] += b * ar[c];
                }
                float *wr = w + (size_t)o * (size_t)md->in;
                for (int c = 0; c < md->in; c++) wr[c] += row[c] * s;
            }
            free(row);
            m->used[k]++;
        }
    }
    size_t b = n * (ft_dtype_bits(m->out_dt[i]) / 8);
    m->buf = malloc(b ? b : 1);
    if (!m->buf) {
        free(w);
        return ft_set_error(FT_ERR_NOMEM, "merge: %s", m->names[i]);
    }
    st = ft_convert(m->buf, m->out_dt[i], w, FT_F32, n);
    free(w);
    if (st) return st;
    m->buf_i = i;
    m->have = 1;
    return FT_OK;
}

static ft_status fill(void *user, size_t i, uint64_t offset, void *buf, size_t len)
{
    merge_ctx *m = user;
    if (!m->have || m->buf_i != i) {
        ft_status st = build(m, i);
        if (st) return st;
    }
    memcpy(buf, m->buf + offset, len);
    return FT_OK;
}

static ft_status copy_file(const char *from, const char *to)
{
    FILE *a = fopen(from, "rb"), *b = a ? fopen(to, "wb") : NULL;
    ft_status st = FT_OK;
    if (!a || !b) st = ft_set_error(FT_ERR_IO, "merge: cannot copy %s to %s: %s", from, to, strerror(errno));
    char tmp[65536];
    size_t k;
    while (!st && (k = fread(tmp, 1, sizeof tmp, a)) > 0)
        if (fwrite(tmp, 1, k, b) != k) st = ft_set_error(FT_ERR_IO, "merge: writing %s failed", to);
    if (a) fclose(a);
    if (b && fclose(b) && !st) st = ft_set_error(FT_ERR_IO, "merge: writing %s failed", to);
    return st;
}

/* config.json with "torch_dtype" / "dtype" set to the output's */
static ft_status write_config(const char *from, const char *to, const char *dtype)
{
    json_object *o = json_object_from_file(from);
    if (!o || !json_object_is_type(o, json_type_object)) {
        if (o) json_object_put(o);
        return ft_set_error(FT_ERR_CORRUPT, "merge: %s is not a JSON object", from);
    }
    if (dtype) {
        json_object_object_add(o, "torch_dtype", json_object_new_string(dtype));
        json_object *v;
        if (json_object_object_get_ex(o, "dtype", &v)) json_object_object_add(o, "dtype", json_object_new_string(dtype));
    }
    int bad = json_object_to_file_ext(to, o, JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_NOSLASHESCAPE);
    json_object_put(o);
    return bad ? ft_set_error(FT_ERR_IO, "merge: cannot write %s", to) : FT_OK;
}

ft_status ft_lora_merge_checkpoint(const char *model_dir, const char *const *adapters, const float *scales,
                                   size_t n, const char *out_dir, int dtype)
{
    if (!model_dir || !out_dir || (n && (!adapters || !scales)))
        return ft_set_error(FT_ERR_INVALID_ARG, "ft_lora_merge_checkpoint: NULL argument");
    if (dtype != -1 && dtype != FT_F32 && dtype != FT_BF16 && dtype != FT_F16)
        return ft_set_error(FT_ERR_INVALID_ARG, "merge: the output dtype must be f32, bf16 or f16");
    struct stat sa, sb;
    if (stat(model_dir, &sa) == 0 && stat(out_dir, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino)
        return ft_set_error(FT_ERR_INVALID_ARG, "merge: the output directory is the model's");
    ft_status st = FT_OK;
    ft_checkpoint *ck = NULL;
    ft_peft_adapter **ads = calloc(n ? n : 1, sizeof *ads);
    size_t *used = calloc(n ? n : 1, sizeof *used), *eoff = calloc(n ? n : 1, sizeof *eoff), *eused = NULL;
    int *ekind = NULL;
    ft_named_tensor *nt = NULL;
    const char **names = NULL;
    ft_dtype *odt = NULL;
    merge_ctx mc;
    memset(&mc, 0, sizeof mc);
    DIR *d = NULL;
    char path[4096], to[4096];
    if (!ads || !used || !eoff) {
        st = ft_set_error(FT_ERR_NOMEM, "merge: allocation");
        goto done;
    }
    for (size_t k = 0; k < n; k++) {
        if (!isfinite(scales[k])) {
            st = ft_set_error(FT_ERR_INVALID_ARG, "merge: adapter %s: the scale is not finite", adapters[k]);
            goto done;
        }
        if ((st = ft_peft_adapter_read(adapters[k], &ads[k]))) goto done;
        if (k + 1 < n) eoff[k + 1] = eoff[k] + ads[k]->n;
    }
    size_t n_mods = n ? eoff[n - 1] + ads[n - 1]->n : 0;
    eused = calloc(n_mods ? n_mods : 1, sizeof *eused);
    ekind = calloc(n_mods ? n_mods : 1, sizeof *ekind);
    if (!eused || !ekind) {
        st = ft_set_error(FT_ERR_NOMEM, "merge: allocation");
        goto done;
    }
    if ((st = ft_checkpoint_open(model_dir, &ck))) goto done;
    size_t nt_n = ft_checkpoint_count(ck);
    nt = calloc(nt_n ? nt_n : 1, sizeof *nt);
    names = calloc(nt_n ? nt_n : 1, sizeof *names);
    odt = calloc(nt_n ? nt_n : 1, sizeof *odt);
    if (!nt || !names || !odt) {
        st = ft_set_error(FT_ERR_NOMEM, "merge: allocation");
        goto done;
    }
    for (size_t i = 0; i < nt_n; i++) {
        ft_tensor x;
        names[i] = ft_checkpoint_name(ck, i);
        if ((st = ft_checkpoint_get(ck, names[i], &x))) goto done;
        odt[i] = is_float(x.dtype) && dtype != -1 ? (ft_dtype)dtype : x.dtype;
        nt[i].name = names[i];
        if ((st = ft_tensor_init(&nt[i].tensor, odt[i], x.ndim, x.shape, NULL))) goto done;
    }
    if (mkdir(out_dir, 0777) && errno != EEXIST) {
        st = ft_set_error(FT_ERR_IO, "merge: cannot create %s: %s", out_dir, strerror(errno));
        goto done;
    }
    mc.ck = ck;
    mc.names = names;
    mc.out_dt = odt;
    mc.ads = ads;
    mc.scales = scales;
    mc.n_ads = n;
    mc.used = used;
    mc.eoff = eoff;
    mc.eused = eused;
    mc.ekind = ekind;
    if ((size_t)snprintf(path, sizeof path, "%s/model.safetensors", out_dir) >= sizeof path) {
        st = ft_set_error(FT_ERR_INVALID_ARG, "merge: path too long");
        goto done;
    }
    static const char *const meta[] = {"format", "pt", NULL};
    if ((st = ft_safetensors_write_stream(path, nt, nt_n, meta, fill, &mc))) goto done;
    for (size_t k = 0; k < n; k++) {
        size_t plain = 0, bad = 0;   /* expert modules: every expert's matrices (gate_up: gate and up) */
        for (size_t j = 0; j < ads[k]->n; j++) {
            const ft_peft_module *md = &ads[k]->mods[j];
            const size_t q = eoff[k] + j;
            if (!md->experts) plain++;
            else bad += !ekind[q] || eused[q] != (size_t)md->experts * (ekind[q] == 1 ? 2u : 1u);
        }
        if (used[k] != plain || bad) {
            st = ft_set_error(FT_ERR_INVALID_ARG, "merge: adapter %s: %zu of its %zu modules have no weight in %s "
                              "(an adapter of another model?)", adapters[k], plain - used[k] + bad, ads[k]->n,
                              model_dir);
            remove(path);
            goto done;
        }
    }
    /* the other files: config (dtype updated), tokenizer, generation config, ... */
    if (!(d = opendir(model_dir))) {
        st = ft_set_error(FT_ERR_IO, "merge: cannot list %s: %s", model_dir, strerror(errno));
        goto done;
    }
    struct dirent *e;
    while ((e = readdir(d))) {
        const char *f = e->d_name;
        size_t fl = strlen(f);
        /* weights (merged above, or in formats not read) are not copied */
        if (f[0] == '.' || (fl >= 12 && !strcmp(f + fl - 12, ".safetensors")) ||
            !strcmp(f, "model.safetensors.index.json") || (fl >= 4 && !strcmp(f + fl - 4, ".bin")) ||
            (fl >= 3 && !strcmp(f + fl - 3, ".pt")) || (fl >= 4 && !strcmp(f + fl - 4, ".pth")) ||
            (fl >= 5 && !strcmp(f + fl - 5, ".gguf")))
            continue;
        if ((size_t)snprintf(path, sizeof path, "%s/%s", model_dir, f) >= sizeof path ||
            (size_t)snprintf(to, sizeof to, "%s/%s", out_dir, f) >= sizeof to)
            continue;
        struct stat s;
        if (stat(path, &s) || !S_ISREG(s.st_mode)) continue;
        if (!strcmp(f, "config.json") && dtype != -1)   /* else copied byte for byte */
            st = write_config(path, to, dtype == -1 ? NULL : dtype == FT_F32 ? "float32" : dtype == FT_BF16 ? "bfloat16"
                                                                                  : "float16");
        else
            st = copy_file(path, to);
        if (st) goto done;
    }
done:
    if (d) closedir(d);
    free(mc.buf);
    ft_checkpoint_close(ck);
    for (size_t k = 0; ads && k < n; k++) ft_peft_adapter_free(ads[k]);
    free(ads);
    free(used);
    free(eoff);
    free(eused);
    free(ekind);
    free(nt);
    free(names);
    free(odt);
    return st;
}
