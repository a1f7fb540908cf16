/* LoRA adapters in PEFT's format: adapter_config.json +
 * adapter_model.safetensors (f32 lora_A / lora_B per module, PEFT's key
 * names), written for peft.PeftModel.from_pretrained and read back. */
#include "train/train_internal.h"

#include "flextier/model.h"

#include <errno.h>
#include <math.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define TRY(x) do { ft_status st_ = (x); if (st_) return st_; } while (0)

ft_status ft_trainer_save_adapter(const ft_trainer *t, const char *dir, const char *base_model)
{
    if (!t || !dir) return ft_set_error(FT_ERR_INVALID_ARG, "ft_trainer_save_adapter: NULL argument");
    if (mkdir(dir, 0777) && errno != EEXIST)
        return ft_set_error(FT_ERR_IO, "adapter: cannot create %s: %s", dir, strerror(errno));
    const ft_train_params *p = ft_tr_params(t);
    size_t nm = ft_tr_n_mods(t), n = 0;
    ft_named_tensor *nt = calloc(2 * nm + 1, sizeof *nt);
    char (*names)[160] = calloc(2 * nm + 1, sizeof *names);
    char path[4096];
    ft_status st = FT_OK;
    FILE *f = NULL;
    if (!nt || !names) {
        st = ft_set_error(FT_ERR_NOMEM, "adapter: out of memory");
        goto cleanup;
    }
    for (size_t k = 0; k < nm; k++) {
        float *A, *B;
        int64_t as[2], bs[2];
        if (!ft_tr_mod(t, k, names[n], names[n + 1], sizeof names[0], &A, &B, as, bs)) continue;
        nt[n].name = names[n];
        if ((st = ft_tensor_init(&nt[n].tensor, FT_F32, 2, as, A))) goto cleanup;
        nt[n + 1].name = names[n + 1];
        if ((st = ft_tensor_init(&nt[n + 1].tensor, FT_F32, 2, bs, B))) goto cleanup;
        n += 2;
    }
    if ((size_t)snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir) >= sizeof path) {
        st = ft_set_error(FT_ERR_INVALID_ARG, "adapter: path too long");
        goto cleanup;
    }
    static const char *const meta[] = {"format", "pt", NULL};
    if ((st = ft_safetensors_write(path, nt, n, meta))) goto cleanup;
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    f = fopen(path, "w");
    if (!f) {
        st = ft_set_error(FT_ERR_IO, "adapter: cannot write %s: %s", path, strerror(errno));
        goto cleanup;
    }
    json_object *o = json_object_new_object();
    json_object_object_add(o, "peft_type", json_object_new_string("LORA"));
    json_object_object_add(o, "task_type", json_object_new_string("CAUSAL_LM"));
    json_object_object_add(o, "base_model_name_or_path", base_model ? json_object_new_string(base_model) : NULL);
    json_object_object_add(o, "r", json_object_new_int(p->rank));
    json_object_object_add(o, "lora_alpha", json_object_new_double((double)p->alpha));
    char dbuf[32];   /* 0.1, not the float's 0.10000000149 */
    snprintf(dbuf, sizeof dbuf, "%.7g", (double)p->dropout);
    json_object_object_add(o, "lora_dropout", json_object_new_double(strtod(dbuf, NULL)));
    /* modules by name; the experts' fused parameters as PEFT's target_parameters */
    json_object *tm = json_object_new_array(), *tp = json_object_new_array();
    for (int i = 0; ft_tr_target_name(i); i++)
        if (p->targets & (1u << i)) {
            const char *tn = ft_tr_target_name(i);
            if (!strncmp(tn, "experts.", 8)) json_object_array_add(tp, json_object_new_string(tn + 8));
            else json_object_array_add(tm, json_object_new_string(tn));
        }
    if (json_object_array_length(tm)) json_object_object_add(o, "target_modules", tm);
    else {
        json_object_put(tm);
        json_object_object_add(o, "target_modules", NULL);
    }
    json_object_object_add(o, "target_parameters", tp);
    json_object_object_add(o, "bias", json_object_new_string("none"));
    json_object_object_add(o, "fan_in_fan_out", json_object_new_boolean(0));
    json_object_object_add(o, "inference_mode", json_object_new_boolean(1));
    json_object_object_add(o, "init_lora_weights", json_object_new_boolean(1));
    json_object_object_add(o, "use_rslora", json_object_new_boolean(0));
    json_object_object_add(o, "use_dora", json_object_new_boolean(0));
    json_object_object_add(o, "modules_to_save", NULL);
    json_object_object_add(o, "layers_to_transform", NULL);
    json_object_object_add(o, "rank_pattern", json_object_new_object());
    json_object_object_add(o, "alpha_pattern", json_object_new_object());
    const char *js = json_object_to_json_string_ext(o, JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_NOSLASHESCAPE);
    int bad = fputs(js, f) < 0 || fputc('\n', f) == EOF;
    json_object_put(o);
    if (fclose(f) || bad) st = ft_set_error(FT_ERR_IO, "adapter: writing %s failed", path);
    f = NULL;
cleanup:
    free(nt);
    free(names);
    return st;
}

static char *slurp(const char *path, size_t max, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *b = malloc(max + 1);
    size_t n = b ? fread(b, 1, max + 1, f) : 0;
    fclose(f);
    if (!b || n > max) {
        free(b);
        return NULL;
    }
    b[n] = 0;
    *len = n;
    return b;
}

/* the config's value of key is JSON null / absent, false, or an empty object */
static int is_off(json_object *o, const char *key)
{
    json_object *v;
    if (!json_object_object_get_ex(o, key, &v) || !v) return 1;
    if (json_object_is_type(v, json_type_boolean)) return !json_object_get_boolean(v);
    if (json_object_is_type(v, json_type_object)) return json_object_object_length(v) == 0;
    if (json_object_is_type(v, json_type_array)) return json_object_array_length(v) == 0;   /* PEFT's [] */
    return 0;
}

/* Check dir's adapter_config.json against p (fill == 0) or fill p's
 * rank, alpha and targets from it (fill == 1); fill == 2 (inference and
 * merging): rank and alpha only, target_modules any list of names or a
 * string (the adapter's tensors say which modules it changes). */
static ft_status check_config(ft_train_params *p, int fill, const char *dir)
{
    char path[4096];
    if ((size_t)snprintf(path, sizeof path, "%s/adapter_config.json", dir) >= sizeof path)
        return ft_set_error(FT_ERR_INVALID_ARG, "adapter: path too long");
    size_t len;
    char *js = slurp(path, 1 << 20, &len);
    if (!js) return ft_set_error(FT_ERR_NOT_FOUND, "adapter: cannot read %s (not a PEFT adapter directory?)", path);
    json_tokener *tk = json_tokener_new();
    json_object *o = tk ? json_tokener_parse_ex(tk, js, (int)len) : NULL;
    int perr = !tk || json_tokener_get_error(tk) != json_tokener_success;
    if (tk) json_tokener_free(tk);
    free(js);
    ft_status st = FT_OK;
    json_object *v;
    if (perr || !o || !json_object_is_type(o, json_type_object)) {
        st = ft_set_error(FT_ERR_CORRUPT, "adapter: %s is not a JSON object", path);
        goto done;
    }
    if (!json_object_object_get_ex(o, "peft_type", &v) || !json_object_is_type(v, json_type_string) ||
        strcmp(json_object_get_string(v), "LORA")) {
        st = ft_set_error(FT_ERR_UNSUPPORTED, "adapter: %s: peft_type is not LORA", path);
        goto done;
    }
    if (!json_object_object_get_ex(o, "r", &v) || !json_object_is_type(v, json_type_int) ||
        json_object_get_int(v) < 1 || json_object_get_int(v) > 4096) {
        st = ft_set_error(FT_ERR_CORRUPT, "adapter: %s: r must be an integer in [1, 4096]", path);
        goto done;
    }
    if (fill) p->rank = json_object_get_int(v);
    if (json_object_get_int(v) != p->rank) {
        st = ft_set_error(FT_ERR_INVALID_ARG, "adapter: %s: r differs from the trainer's %d", path, p->rank);
        goto done;
    }
    if (!json_object_object_get_ex(o, "lora_alpha", &v) ||
        !(json_object_is_type(v, json_type_int) || json_object_is_type(v, json_type_double)) ||
        !(json_object_get_double(v) > 0.0) || !isfinite(json_object_get_double(v))) {
        st = ft_set_error(FT_ERR_CORRUPT, "adapter: %s: lora_alpha must be a positive number", path);
        goto done;
    }
    if (fill) p->alpha = (float)json_object_get_double(v);
    if ((float)json_object_get_double(v) != p->alpha) {
        st = ft_set_error(FT_ERR_INVALID_ARG, "adapter: %s: lora_alpha differs from the trainer's %g", path,
                          (double)p->alpha);
        goto done;
    }
    static const char *const off[] = {"use_rslora", "use_dora", "fan_in_fan_out", "modules_to_save",
                                      "layers_to_transform", "rank_pattern", "alpha_pattern", "layer_replication",
                                      "trainable_token_indices", "lora_bias", "use_qalora"};
    for (size_t i = 0; i < sizeof off / sizeof off[0]; i++)
        if (!is_off(o, off[i])) {
            st = ft_set_error(FT_ERR_UNSUPPORTED, "adapter: %s: %s is set (not implemented)", path, off[i]);
            goto done;
        }
    if (json_object_object_get_ex(o, "bias", &v) && v &&
        (!json_object_is_type(v, json_type_string) || strcmp(json_object_get_string(v), "none"))) {
        st = ft_set_error(FT_ERR_UNSUPPORTED, "adapter: %s: bias other than \"none\" is not implemented", path);
        goto done;
    }
    unsigned mask = 0;
    /* target_parameters (PEFT's LoRA on parameters): the MoE experts' fused
     * gate_up_proj and down_proj, named by the parameter or a path ending in it */
    json_object *tpv = NULL;
    if (json_object_object_get_ex(o, "target_parameters", &tpv) && tpv) {
        if (!json_object_is_type(tpv, json_type_array)) {
            st = ft_set_error(FT_ERR_CORRUPT, "adapter: %s: target_parameters must be a list of names", path);
            goto done;
        }
        for (size_t i = 0; i < json_object_array_length(tpv); i++) {
            json_object *e = json_object_array_get_idx(tpv, i);
            const char *nm = json_object_is_type(e, json_type_string) ? json_object_get_string(e) : NULL;
            const char *dot = nm ? strrchr(nm, '.') : NULL, *last = dot ? dot + 1 : nm;
            unsigned b = !last ? 0 : !strcmp(last, "gate_up_proj") ? FT_LORA_EXP_GATE_UP
                       : !strcmp(last, "down_proj") ? FT_LORA_EXP_DOWN : 0;
            if (!b) {
                st = ft_set_error(FT_ERR_UNSUPPORTED, "adapter: %s: target parameter %s is not implemented (the "
                                  "MoE experts' gate_up_proj and down_proj are)", path, json_object_to_json_string(e));
                goto done;
            }
            mask |= b;
        }
    }
    if (fill == 2) {
        p->targets = mask;   /* the experts' parameters adapted (their tensors' names tell which is which only with shapes) */
        if (json_object_object_get_ex(o, "target_modules", &v) && v && !json_object_is_type(v, json_type_array) &&
            !json_object_is_type(v, json_type_string))
            st = ft_set_error(FT_ERR_CORRUPT, "adapter: %s: target_modules must be a list of names or a string", path);
        goto done;
    }
    if (!json_object_object_get_ex(o, "target_modules", &v) || !v) v = NULL;
    if (v && !json_object_is_type(v, json_type_array)) {
        st = ft_set_error(FT_ERR_UNSUPPORTED, "adapter: %s: target_modules must be a list of module names", path);
        goto done;
    }
    if ((!v || json_object_array_length(v) == 0) && !mask) {
        st = ft_set_error(FT_ERR_INVALID_ARG, "adapter: %s: target_modules is empty (no module to adapt)", path);
        goto done;
    }
    for (size_t i = 0; v && i < json_object_array_length(v); i++) {
        json_object *e = json_object_array_get_idx(v, i);
        unsigned b = json_object_is_type(e, json_type_string) ? ft_lora_target_bit(json_object_get_string(e)) : 0;
        if (!b || (b & (FT_LORA_EXP_GATE_UP | FT_LORA_EXP_DOWN))) {   /* the experts are target_parameters */
            st = ft_set_error(FT_ERR_UNSUPPORTED, "adapter: %s: target module %s is not implemented", path,
                              json_object_to_json_string(e));
            goto done;
        }
        mask |= b;
    }
    if (fill) p->targets = mask;
    if (mask != p->targets)
        st = ft_set_error(FT_ERR_INVALID_ARG, "adapter: %s: target_modules%s differ from the trainer's%s", path,
                          mask & (FT_LORA_EXP_GATE_UP | FT_LORA_EXP_DOWN) ? " / target_parameters" : "",
                          (mask & (FT_LORA_GATE | FT_LORA_UP | FT_LORA_DOWN)) &&
                          (p->targets & (FT_LORA_EXP_GATE_UP | FT_LORA_EXP_DOWN))
                              ? " (on a mixture-of-experts model the experts are transformers 5's fused parameters, "
                                "PEFT's target_parameters gate_up_proj / down_proj; per-expert modules of "
                                "transformers 4 are not implemented)" : "");
done:
    if (o) json_object_put(o);
    return st;
}

ft_status ft_trainer_load_adapter(ft_trainer *t, const char *dir)
{
    if (!t || !dir) return ft_set_error(FT_ERR_INVALID_ARG, "ft_trainer_load_adapter: NULL argument");
    ft_train_params p = *ft_tr_params(t);
    TRY(check_config(&p, 0, dir));
    char path[4096];
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    ft_checkpoint *ck = NULL;
    TRY(ft_checkpoint_open(path, &ck));
    ft_status st = FT_OK;
    size_t nm = ft_tr_n_mods(t), found = 0;
    for (size_t k = 0; k < nm && !st; k++) {
        char an[160], bn[160];
        float *P[2];
        int64_t sh[2][2];
        if (!ft_tr_mod(t, k, an, bn, sizeof an, &P[0], &P[1], sh[0], sh[1])) continue;
        const char *nms[2] = {an, bn};
        /* the experts' adapters: PEFT nests the wrappers of one module's
         * parameters (the inner one's keys under base_layer.) in an order of its
         * own; the other name is taken when this one is missing or of another shape */
        char alt[2][160];
        const char *bl = strstr(an, "experts.base_layer.");
        if (strstr(an, ".mlp.experts.")) {
            int here = 1, there = 1;   /* A and B both of the module's shapes (H = F: B tells) */
            for (int j = 0; j < 2; j++) {
                const char *kn = nms[j], *at = bl ? strstr(kn, "base_layer.") : strstr(kn, "experts.") + 8;
                size_t pre = (size_t)(at - kn);
                snprintf(alt[j], sizeof alt[j], "%.*s%s%s", (int)pre, kn, bl ? "" : "base_layer.", bl ? at + 11 : at);
                ft_tensor x;
                here = here && !ft_checkpoint_get(ck, kn, &x) && x.ndim == 2 && x.shape[0] == sh[j][0] &&
                       x.shape[1] == sh[j][1];
                there = there && !ft_checkpoint_get(ck, alt[j], &x) && x.ndim == 2 && x.shape[0] == sh[j][0] &&
                        x.shape[1] == sh[j][1];
            }
            if (!here && there) {
                nms[0] = alt[0];
                nms[1] = alt[1];
            }
        }
        for (int j = 0; j < 2 && !st; j++) {
            ft_tensor x;
            st = ft_checkpoint_get(ck, nms[j], &x);
            if (st) {
                st = ft_set_error(FT_ERR_CORRUPT, "adapter: %s has no tensor %s", path, nms[j]);
                break;
            }
            if (x.dtype != FT_F32 || x.ndim != 2 || x.shape[0] != sh[j][0] || x.shape[1] != sh[j][1]) {
                st = ft_set_error(FT_ERR_CORRUPT, "adapter: %s: %s is not f32 [%lld, %lld]", path, nms[j],
                                  (long long)sh[j][0], (long long)sh[j][1]);
                break;
            }
            memcpy(P[j], x.data, (size_t)sh[j][0] * (size_t)sh[j][1] * sizeof(float));
            found++;
        }
    }
    if (!st && found != ft_checkpoint_count(ck))
        st = ft_set_error(FT_ERR_UNSUPPORTED, "adapter: %s has %zu tensors, %zu of them LoRA A/B of this model's "
                          "targets (other adapted modules are not implemented)", path, ft_checkpoint_count(ck), found);
    ft_checkpoint_close(ck);
    return st;
}

ft_status ft_lora_read_config(const char *dir, ft_train_params *p)
{
    if (!dir || !p) return ft_set_error(FT_ERR_INVALID_ARG, "ft_lora_read_config: NULL argument");
    return check_config(p, 1, dir);
}

/* ------------------------------------------------ optimizer state */

#define STATE_FORMAT "flextier-lora-state-1"

ft_status ft_trainer_save_state(const ft_trainer *t, const char *path)
{
    if (!t || !path) return ft_set_error(FT_ERR_INVALID_ARG, "ft_trainer_save_state: NULL argument");
    size_t n = ft_trainer_param_count(t);
    float *w, *m1, *m2;
    int step;
    ft_tr_state((ft_trainer *)(uintptr_t)t, &w, &m1, &m2, &step);
    const ft_train_params *p = ft_tr_params(t);
    int64_t shape[1] = {(int64_t)n};
    ft_named_tensor nt[3] = {{"params", {0}}, {"exp_avg", {0}}, {"exp_avg_sq", {0}}};
    float *d[3] = {w, m1, m2};
    for (int i = 0; i < 3; i++) TRY(ft_tensor_init(&nt[i].tensor, FT_F32, 1, shape, d[i]));
    char st[32], rk[32], tg[32], al[48];
    snprintf(st, sizeof st, "%d", step);
    snprintf(rk, sizeof rk, "%d", p->rank);
    snprintf(tg, sizeof tg, "%u", p->targets);
    snprintf(al, sizeof al, "%.9g", (double)p->alpha);
    const char *meta[] = {"format", STATE_FORMAT, "step", st, "rank", rk, "targets", tg, "alpha", al, NULL};
    return ft_safetensors_write(path, nt, 3, meta);
}

static int meta_is(const ft_checkpoint *ck, const char *key, const char *want)
{
    const char *v = ft_checkpoint_metadata(ck, key);
    return v && !strcmp(v, want);
}

ft_status ft_trainer_load_state(ft_trainer *t, const char *path)
{
    if (!t || !path) return ft_set_error(FT_ERR_INVALID_ARG, "ft_trainer_load_state: NULL argument");
    ft_checkpoint *ck = NULL;
    TRY(ft_checkpoint_open(path, &ck));
    ft_status st = FT_OK;
    const ft_train_params *p = ft_tr_params(t);
    char rk[32], tg[32], al[48];
    snprintf(rk, sizeof rk, "%d", p->rank);
    snprintf(tg, sizeof tg, "%u", p->targets);
    snprintf(al, sizeof al, "%.9g", (double)p->alpha);
    const char *sv = ft_checkpoint_metadata(ck, "step");
    char *end = NULL;
    long step = sv ? strtol(sv, &end, 10) : -1;
    size_t n = ft_trainer_param_count(t);
    float *d[3];
    int cur;
    ft_tr_state(t, &d[0], &d[1], &d[2], &cur);
    if (!meta_is(ck, "format", STATE_FORMAT)) {
        st = ft_set_error(FT_ERR_CORRUPT, "train state: %s is not a flextier LoRA state file", path);
        goto done;
    }
    if (!meta_is(ck, "rank", rk) || !meta_is(ck, "targets", tg) || !meta_is(ck, "alpha", al)) {
        st = ft_set_error(FT_ERR_INVALID_ARG, "train state: %s was written with another rank, alpha or targets", path);
        goto done;
    }
    if (!sv || !end || *end || step < 0 || step > p->total_steps) {
        st = ft_set_error(FT_ERR_CORRUPT, "train state: %s: step '%s' is not in [0, %d]", path, sv ? sv : "(none)",
                          p->total_steps);
        goto done;
    }
    static const char *const names[3] = {"params", "exp_avg", "exp_avg_sq"};
    for (int i = 0; i < 3; i++) {
        ft_tensor x;
        if (ft_checkpoint_get(ck, names[i], &x) || x.dtype != FT_F32 || x.ndim != 1 || x.shape[0] != (int64_t)n) {
            st = ft_set_error(FT_ERR_CORRUPT, "train state: %s: %s missing or not f32 [%zu]", path, names[i], n);
            goto done;
        }
    }
    for (int i = 0; i < 3; i++) {
        ft_tensor x;
        ft_checkpoint_get(ck, names[i], &x);
        memcpy(d[i], x.data, n * sizeof(float));
    }
    ft_tr_set_step(t, (int)step);
done:
    ft_checkpoint_close(ck);
    return st;
}

/* ------------------------------------- adapters for inference, merging */

#define KEY_PREFIX "base_model.model."

static int ends_with(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

/* a tensor as f32 rows x cols (any float dtype; unaligned data copied) */
static ft_status tensor_f32(const ft_checkpoint *ck, const char *path, const char *name, int rows, int cols,
                            float **out)
{
    ft_tensor x;
    ft_status st = ft_checkpoint_get(ck, name, &x);
    if (st) return ft_set_error(st == FT_ERR_NOT_FOUND ? FT_ERR_CORRUPT : st, "adapter: %s: %s is missing or of an "
                                "unsupported dtype", path, name);
    if ((x.dtype != FT_F32 && x.dtype != FT_BF16 && x.dtype != FT_F16) || x.ndim != 2 ||
        (rows >= 0 && x.shape[0] != rows) || (cols >= 0 && x.shape[1] != cols) || x.shape[0] < 1 ||
        x.shape[1] < 1 || x.shape[0] > (1 << 24) || x.shape[1] > (1 << 24))
        return ft_set_error(FT_ERR_CORRUPT, "adapter: %s: %s is not a float matrix of the expected shape "
                            "[%d, %d]", path, name, rows, cols);
    size_t n = (size_t)x.shape[0] * (size_t)x.shape[1];
    float *f = malloc(n * sizeof(float));
    if (!f) return ft_set_error(FT_ERR_NOMEM, "adapter: %s: %zu floats", name, n);
    if ((st = ft_convert(f, FT_F32, x.data, x.dtype, n))) {
        free(f);
        return st;
    }
    *out = f;
    return FT_OK;
}

void ft_peft_adapter_free(ft_peft_adapter *a)
{
    if (!a) return;
    for (size_t i = 0; i < a->n; i++) {
        free(a->mods[i].A);
        free(a->mods[i].B);
    }
    free(a->mods);
    free(a);
}

ft_status ft_peft_adapter_read(const char *dir, ft_peft_adapter **out)
{
    if (!dir || !out) return ft_set_error(FT_ERR_INVALID_ARG, "ft_peft_adapter_read: NULL argument");
    ft_train_params p;
    ft_train_params_default(&p);
    TRY(check_config(&p, 2, dir));
    char path[4096];
    if ((size_t)snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir) >= sizeof path)
        return ft_set_error(FT_ERR_INVALID_ARG, "adapter: path too long");
    ft_checkpoint *ck = NULL;
    ft_status st = ft_checkpoint_open(path, &ck);
    if (st) return st;
    ft_peft_adapter *a = calloc(1, sizeof *a);
    size_t nt = ft_checkpoint_count(ck);
    if (a) a->mods = calloc(nt ? nt : 1, sizeof *a->mods);
    if (!a || !a->mods) {
        st = ft_set_error(FT_ERR_NOMEM, "adapter: allocation");
        goto fail;
    }
    a->rank = p.rank;
    a->alpha = p.alpha;
    a->scale = p.alpha / (float)p.rank;
    for (size_t i = 0; i < nt; i++) {
        const char *name = ft_checkpoint_name(ck, i);
        size_t len = strlen(name);
        int is_a = ends_with(name, ".lora_A.weight"), is_b = ends_with(name, ".lora_B.weight");
        if ((!is_a && !is_b) || strncmp(name, KEY_PREFIX, strlen(KEY_PREFIX)) ||
            len - strlen(KEY_PREFIX) - strlen(".lora_A.weight") >= sizeof a->mods[0].module ||
            len <= strlen(KEY_PREFIX) + strlen(".lora_A.weight")) {
            st = ft_set_error(FT_ERR_UNSUPPORTED, "adapter: %s: tensor %s is not a LoRA A/B matrix of a module (%s"
                              "...lora_A.weight / lora_B.weight; other adapted parts are not implemented)", path,
                              name, KEY_PREFIX);
            goto fail;
        }
        if (is_b) {   /* each B must have its A */
            char an[600];
            snprintf(an, sizeof an, "%.*s.lora_A.weight", (int)(len - strlen(".lora_B.weight")), name);
            ft_tensor x;
            if (ft_checkpoint_get(ck, an, &x)) {
                st = ft_set_error(FT_ERR_CORRUPT, "adapter: %s: %s has no %s", path, name, an);
                goto fail;
            }
            continue;
        }
        ft_peft_module *md = &a->mods[a->n];
        size_t ml = len - strlen(KEY_PREFIX) - strlen(".lora_A.weight");
        memcpy(md->module, name + strlen(KEY_PREFIX), ml);
        md->module[ml] = 0;
        char bn[600];
        snprintf(bn, sizeof bn, "%.*s.lora_B.weight", (int)(len - strlen(".lora_A.weight")), name);
        /* PEFT's LoRA on the experts' fused parameters (target_parameters):
         * "<...>.mlp.experts" (or ".base_layer" under it: the wrapper of the other
         * parameter nests it), A [E r][in], B [out][E r] */
        int experts = 0;
        if (p.targets && (ends_with(md->module, ".experts") || ends_with(md->module, ".experts.base_layer"))) {
            experts = 1;
            if (ends_with(md->module, ".base_layer")) md->module[ml - strlen(".base_layer")] = 0;
        }
        if ((st = tensor_f32(ck, path, name, experts ? -1 : p.rank, -1, &md->A))) goto fail;
        a->n++;   /* owns A now */
        ft_tensor ta;
        ft_checkpoint_get(ck, name, &ta);
        if (experts && ta.shape[0] % p.rank) {
            st = ft_set_error(FT_ERR_CORRUPT, "adapter: %s: %s has %lld rows, not experts x r = %d", path, name,
                              (long long)ta.shape[0], p.rank);
            goto fail;
        }
        md->rank = p.rank;
        md->experts = experts ? (int)(ta.shape[0] / p.rank) : 0;
        md->in = (int)ta.shape[1];
        ft_tensor tb;
        if (ft_checkpoint_get(ck, bn, &tb)) {
            st = ft_set_error(FT_ERR_CORRUPT, "adapter: %s: %s has no %s", path, name, bn);
            goto fail;
        }
        if ((st = tensor_f32(ck, path, bn, -1, (int)ta.shape[0], &md->B))) goto fail;
        md->out = (int)tb.shape[0];
    }
    if (!a->n) {
        st = ft_set_error(FT_ERR_CORRUPT, "adapter: %s holds no LoRA matrices", path);
        goto fail;
    }
    ft_checkpoint_close(ck);
    *out = a;
    return FT_OK;
fail:
    ft_checkpoint_close(ck);
    ft_peft_adapter_free(a);
    return st;
}

ft_status ft_peft_adapter_apply(const ft_peft_adapter *a, float user_scale, ft_lora *l)
{
    if (!a || !l) return ft_set_error(FT_ERR_INVALID_ARG, "ft_peft_adapter_apply: NULL argument");
    if (!isfinite(user_scale)) return ft_set_error(FT_ERR_INVALID_ARG, "adapter: the scale is not finite");
    for (size_t i = 0; i < a->n; i++) {
        const ft_peft_module *md = &a->mods[i];
        if (md->experts) {
            TRY(ft_lora_add_experts(l, md->module, md->rank, md->experts, md->in, md->out, a->scale * user_scale,
                                    md->A, md->B));
            continue;
        }
        int out, in;
        TRY(ft_lora_module_shape(l, md->module, &out, &in));
        if (out != md->out || in != md->in)
            return ft_set_error(FT_ERR_INVALID_ARG, "adapter: %s: lora_B x lora_A is [%d, %d], the model's "
                                "projection is [%d, %d] (an adapter of another model?)", md->module, md->out, md->in,
                                out, in);
        TRY(ft_lora_add(l, md->module, md->rank, a->scale * user_scale, md->A, md->B));
    }
    return FT_OK;
}
