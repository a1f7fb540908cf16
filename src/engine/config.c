/* config.json / generation_config.json parsing (json-c). Every field is
 * checked for type and range; errors name the file and the field. */
#include "engine_internal.h"

#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Limits well beyond any released model, small enough that derived sizes
 * cannot overflow (hidden * vocab * 4 etc. stay far below 2^63). */
#define LIM_HIDDEN   (1 << 16)
#define LIM_LAYERS   1024
#define LIM_HEADS    1024
#define LIM_HEAD_DIM 1024
#define LIM_FFN      (1 << 20)
#define LIM_VOCAB    (1 << 22)
#define LIM_POS      (1 << 22)

static json_object *parse_json(const char *json, size_t len, const char *what,
                               ft_status *st)
{
    if (len > (64u << 20) || len > (size_t)INT32_MAX) {
        *st = ft_set_error(FT_ERR_CORRUPT, "%s: file too large for a config", what);
        return NULL;
    }
    json_tokener *tok = json_tokener_new_ex(64);
    if (!tok) { *st = ft_set_error(FT_ERR_NOMEM, "%s: json tokener", what); return NULL; }
    json_object *root = json_tokener_parse_ex(tok, json, (int)len);
    enum json_tokener_error jerr = json_tokener_get_error(tok);
    size_t off = json_tokener_get_parse_end(tok);
    json_tokener_free(tok);
    if (!root || jerr != json_tokener_success) {
        if (root) json_object_put(root);
        *st = ft_set_error(FT_ERR_CORRUPT, "%s: not valid JSON (%s at byte %zu)", what,
                           json_tokener_error_desc(jerr), off);
        return NULL;
    }
    for (size_t i = off; i < len; i++)
        if (!strchr(" \t\r\n", json[i]) && json[i] != 0) {
            json_object_put(root);
            *st = ft_set_error(FT_ERR_CORRUPT, "%s: trailing bytes after the JSON object", what);
            return NULL;
        }
    if (!json_object_is_type(root, json_type_object)) {
        json_object_put(root);
        *st = ft_set_error(FT_ERR_CORRUPT, "%s: top level is not a JSON object", what);
        return NULL;
    }
    *st = FT_OK;
    return root;
}

/* Field getters: *present = 0 when missing or null. */
static ft_status get_int(json_object *o, const char *key, const char *what,
                         int64_t lo, int64_t hi, int64_t *out, int *present)
{
    json_object *v;
    *present = 0;
    if (!json_object_object_get_ex(o, key, &v) || !v) return FT_OK;
    if (json_object_is_type(v, json_type_double)) {
        double d = json_object_get_double(v);
        if (d != floor(d) || !(d >= (double)lo && d <= (double)hi))
            return ft_set_error(FT_ERR_CORRUPT, "%s: field \"%s\" must be an integer in [%lld, %lld]",
                                what, key, (long long)lo, (long long)hi);
        *out = (int64_t)d;
        *present = 1;
        return FT_OK;
    }
    if (!json_object_is_type(v, json_type_int))
        return ft_set_error(FT_ERR_CORRUPT, "%s: field \"%s\" must be an integer", what, key);
    errno = 0;
    int64_t x = json_object_get_int64(v);
    if (x < lo || x > hi || (errno && (x == INT64_MAX || x == INT64_MIN)))
        return ft_set_error(FT_ERR_CORRUPT, "%s: field \"%s\" = %lld out of range [%lld, %lld]",
                            what, key, (long long)x, (long long)lo, (long long)hi);
    *out = x;
    *present = 1;
    return FT_OK;
}

static ft_status req_int(json_object *o, const char *key, const char *what,
                         int64_t lo, int64_t hi, int *out)
{
    int64_t x;
    int present;
    ft_status st = get_int(o, key, what, lo, hi, &x, &present);
    if (st) return st;
    if (!present)
        return ft_set_error(FT_ERR_CORRUPT, "%s: missing field \"%s\"", what, key);
    *out = (int)x;
    return FT_OK;
}

static ft_status opt_int(json_object *o, const char *key, const char *what,
                         int64_t lo, int64_t hi, int dflt, int *out)
{
    int64_t x;
    int present;
    ft_status st = get_int(o, key, what, lo, hi, &x, &present);
    if (st) return st;
    *out = present ? (int)x : dflt;
    return FT_OK;
}

static ft_status opt_num(json_object *o, const char *key, const char *what,
                         double lo, double hi, double dflt, float *out)
{
    json_object *v;
    if (!json_object_object_get_ex(o, key, &v) || !v) { *out = (float)dflt; return FT_OK; }
    if (!json_object_is_type(v, json_type_double) && !json_object_is_type(v, json_type_int))
        return ft_set_error(FT_ERR_CORRUPT, "%s: field \"%s\" must be a number", what, key);
    double d = json_object_get_double(v);
    if (!(d >= lo && d <= hi))
        return ft_set_error(FT_ERR_CORRUPT, "%s: field \"%s\" = %g out of range [%g, %g]",
                            what, key, d, lo, hi);
    *out = (float)d;
    return FT_OK;
}

static ft_status opt_bool(json_object *o, const char *key, const char *what,
                          int dflt, int *out)
{
    json_object *v;
    if (!json_object_object_get_ex(o, key, &v) || !v) { *out = dflt; return FT_OK; }
    if (!json_object_is_type(v, json_type_boolean))
        return ft_set_error(FT_ERR_CORRUPT, "%s: field \"%s\" must be true or false", what, key);
    *out = json_object_get_boolean(v) ? 1 : 0;
    return FT_OK;
}

static ft_status opt_str(json_object *o, const char *key, const char *what,
                         const char **out)
{
    json_object *v;
    *out = NULL;
    if (!json_object_object_get_ex(o, key, &v) || !v) return FT_OK;
    if (!json_object_is_type(v, json_type_string))
        return ft_set_error(FT_ERR_CORRUPT, "%s: field \"%s\" must be a string", what, key);
    *out = json_object_get_string(v);
    return FT_OK;
}

/* bos/pad: an id or null; eos: an id, a list of ids, or null. */
static ft_status token_ids(json_object *o, const char *what, ft_model_config *c)
{
    ft_status st;
    int64_t x;
    int present;
    if ((st = get_int(o, "bos_token_id", what, 0, LIM_VOCAB - 1, &x, &present))) return st;
    if (present) c->bos_id = (int32_t)x;
    if ((st = get_int(o, "pad_token_id", what, 0, LIM_VOCAB - 1, &x, &present))) return st;
    if (present) c->pad_id = (int32_t)x;
    json_object *v;
    if (!json_object_object_get_ex(o, "eos_token_id", &v) || !v) return FT_OK;
    if (json_object_is_type(v, json_type_array)) {
        size_t n = json_object_array_length(v);
        if (n > FT_MAX_EOS)
            return ft_set_error(FT_ERR_UNSUPPORTED, "%s: field \"eos_token_id\" lists %zu ids (max %d)",
                                what, n, FT_MAX_EOS);
        int32_t ids[FT_MAX_EOS];
        for (size_t i = 0; i < n; i++) {
            json_object *e = json_object_array_get_idx(v, i);
            if (!e || !json_object_is_type(e, json_type_int))
                return ft_set_error(FT_ERR_CORRUPT, "%s: field \"eos_token_id\"[%zu] must be an integer",
                                    what, i);
            int64_t id = json_object_get_int64(e);
            if (id < 0 || id >= LIM_VOCAB)
                return ft_set_error(FT_ERR_CORRUPT, "%s: field \"eos_token_id\"[%zu] out of range",
                                    what, i);
            ids[i] = (int32_t)id;
        }
        memcpy(c->eos_ids, ids, n * sizeof ids[0]);
        c->n_eos = (int)n;
        return FT_OK;
    }
    if ((st = get_int(o, "eos_token_id", what, 0, LIM_VOCAB - 1, &x, &present))) return st;
    if (present) { c->eos_ids[0] = (int32_t)x; c->n_eos = 1; }
    return FT_OK;
}

static ft_status parse_opt(json_object *o, const char *what, ft_model_config *c)
{
    ft_status st;
    const char *act;
    if ((st = req_int(o, "hidden_size", what, 1, LIM_HIDDEN, &c->hidden)) ||
        (st = req_int(o, "num_hidden_layers", what, 1, LIM_LAYERS, &c->n_layers)) ||
        (st = req_int(o, "num_attention_heads", what, 1, LIM_HEADS, &c->n_heads)) ||
        (st = req_int(o, "ffn_dim", what, 1, LIM_FFN, &c->ffn)) ||
        (st = req_int(o, "vocab_size", what, 1, LIM_VOCAB, &c->vocab)) ||
        (st = req_int(o, "max_position_embeddings", what, 1, LIM_POS, &c->max_pos)) ||
        (st = opt_int(o, "word_embed_proj_dim", what, 1, LIM_HIDDEN, c->hidden,
                      &c->word_embed_proj_dim)) ||
        (st = opt_bool(o, "do_layer_norm_before", what, 1, &c->do_layer_norm_before)) ||
        (st = opt_bool(o, "enable_bias", what, 1, &c->enable_bias)) ||
        (st = opt_bool(o, "layer_norm_elementwise_affine", what, 1, &c->ln_affine)) ||
        (st = opt_bool(o, "tie_word_embeddings", what, 1, &c->tie_word_embeddings)) ||
        (st = opt_str(o, "activation_function", what, &act)))
        return st;
    if (act && strcmp(act, "relu"))
        return ft_set_error(FT_ERR_UNSUPPORTED, "%s: field \"activation_function\" = \"%s\" "
                            "(only \"relu\" is supported for OPT)", what, act);
    int remove_final;
    if ((st = opt_bool(o, "_remove_final_layer_norm", what, 0, &remove_final))) return st;
    c->final_norm = c->do_layer_norm_before && !remove_final;
    c->n_kv_heads = c->n_heads;
    if (c->hidden % c->n_heads)
        return ft_set_error(FT_ERR_CORRUPT, "%s: field \"num_attention_heads\" = %d does not divide "
                            "hidden_size = %d", what, c->n_heads, c->hidden);
    c->head_dim = c->hidden / c->n_heads;
    c->norm_eps = 1e-5f;
    c->bos_id = 2; c->pad_id = 1; c->eos_ids[0] = 2; c->n_eos = 1;   /* OPT's defaults */
    return FT_OK;
}

static ft_status parse_rope_scaling(json_object *o, const char *what, ft_model_config *c)
{
    json_object *rs;
    if (!json_object_object_get_ex(o, "rope_scaling", &rs) || !rs) return FT_OK;
    if (!json_object_is_type(rs, json_type_object))
        return ft_set_error(FT_ERR_CORRUPT, "%s: field \"rope_scaling\" must be an object or null", what);
    const char *type;
    ft_status st = opt_str(rs, "rope_type", what, &type);
    if (st) return st;
    if (!type && (st = opt_str(rs, "type", what, &type))) return st;
    if (!type)
        return ft_set_error(FT_ERR_CORRUPT, "%s: field \"rope_scaling.rope_type\" missing", what);
    if (!strcmp(type, "default")) return FT_OK;
    if (strcmp(type, "llama3"))
        return ft_set_error(FT_ERR_UNSUPPORTED, "%s: field \"rope_scaling.rope_type\" = \"%s\" "
                            "(supported: default, llama3)", what, type);
    c->rope_llama3 = 1;
    char w2[600];
    snprintf(w2, sizeof w2, "%s (rope_scaling)", what);
    what = w2;
    if ((st = opt_num(rs, "factor", what, 1e-3, 1e6, 0, &c->rope_factor)) ||
        (st = opt_num(rs, "low_freq_factor", what, 1e-6, 1e6, 0, &c->rope_low_freq_factor)) ||
        (st = opt_num(rs, "high_freq_factor", what, 1e-6, 1e6, 0, &c->rope_high_freq_factor)) ||
        (st = req_int(rs, "original_max_position_embeddings", what, 1, LIM_POS,
                      &c->rope_orig_max_pos)))
        return st;
    if (c->rope_factor == 0 || c->rope_low_freq_factor == 0 || c->rope_high_freq_factor == 0)
        return ft_set_error(FT_ERR_CORRUPT, "%s: field \"rope_scaling\" needs factor, "
                            "low_freq_factor and high_freq_factor", what);
    if (!(c->rope_high_freq_factor > c->rope_low_freq_factor))
        return ft_set_error(FT_ERR_CORRUPT, "%s: field \"rope_scaling.high_freq_factor\" must "
                            "exceed low_freq_factor", what);
    return FT_OK;
}

static ft_status parse_llama(json_object *o, const char *what, ft_model_config *c)
{
    ft_status st;
    const char *act;
    if ((st = req_int(o, "hidden_size", what, 1, LIM_HIDDEN, &c->hidden)) ||
        (st = req_int(o, "num_hidden_layers", what, 1, LIM_LAYERS, &c->n_layers)) ||
        (st = req_int(o, "num_attention_heads", what, 1, LIM_HEADS, &c->n_heads)) ||
        (st = opt_int(o, "num_key_value_heads", what, 1, LIM_HEADS, c->n_heads, &c->n_kv_heads)) ||
        (st = req_int(o, "intermediate_size", what, 1, LIM_FFN, &c->ffn)) ||
        (st = req_int(o, "vocab_size", what, 1, LIM_VOCAB, &c->vocab)) ||
        (st = opt_int(o, "max_position_embeddings", what, 1, LIM_POS, 2048, &c->max_pos)) ||
        (st = opt_num(o, "rms_norm_eps", what, 0, 1, 1e-6, &c->norm_eps)) ||
        (st = opt_num(o, "rope_theta", what, 1, 1e12, 10000.0, &c->rope_theta)) ||
        (st = opt_bool(o, "tie_word_embeddings", what, 0, &c->tie_word_embeddings)) ||
        (st = opt_bool(o, "attention_bias", what, 0, &c->attention_bias)) ||
        (st = opt_bool(o, "mlp_bias", what, 0, &c->mlp_bias)) ||
        (st = opt_str(o, "hidden_act", what, &act)))
        return st;
    if (act && strcmp(act, "silu"))
        return ft_set_error(FT_ERR_UNSUPPORTED, "%s: field \"hidden_act\" = \"%s\" (only \"silu\")",
                            what, act);
    if (c->n_heads % c->n_kv_heads)
        return ft_set_error(FT_ERR_CORRUPT, "%s: field \"num_key_value_heads\" = %d does not divide "
                            "num_attention_heads = %d", what, c->n_kv_heads, c->n_heads);
    json_object *hd;
    if (json_object_object_get_ex(o, "head_dim", &hd) && hd) {
        if ((st = req_int(o, "head_dim", what, 2, LIM_HEAD_DIM, &c->head_dim))) return st;
    } else {
        if (c->hidden % c->n_heads)
            return ft_set_error(FT_ERR_CORRUPT, "%s: field \"num_attention_heads\" = %d does not "
                                "divide hidden_size = %d", what, c->n_heads, c->hidden);
        c->head_dim = c->hidden / c->n_heads;
    }
    if (c->head_dim % 2 || c->head_dim > LIM_HEAD_DIM)
        return ft_set_error(FT_ERR_CORRUPT, "%s: field \"head_dim\" = %d must be even and <= %d",
                            what, c->head_dim, LIM_HEAD_DIM);
    if ((int64_t)c->head_dim * c->n_heads > LIM_HIDDEN * 4)
        return ft_set_error(FT_ERR_CORRUPT, "%s: head_dim x num_attention_heads too large", what);
    c->word_embed_proj_dim = c->hidden;
    c->bos_id = 1; c->eos_ids[0] = 2; c->n_eos = 1;   /* Llama 2's defaults */
    return parse_rope_scaling(o, what, c);
}

ft_status ft_model_config_parse(const char *json, size_t len, const char *what,
                                ft_model_config *out)
{
    if (!json || !out) return ft_set_error(FT_ERR_INVALID_ARG, "config: NULL argument");
    if (!what) what = "config.json";
    ft_status st;
    json_object *root = parse_json(json, len, what, &st);
    if (!root) return st;
    ft_model_config c;
    memset(&c, 0, sizeof c);
    c.bos_id = c.pad_id = -1;
    const char *mt;
    if ((st = opt_str(root, "model_type", what, &mt))) goto done;
    if (!mt) { st = ft_set_error(FT_ERR_CORRUPT, "%s: missing field \"model_type\"", what); goto done; }
    snprintf(c.model_type, sizeof c.model_type, "%s", mt);
    if (!strcmp(mt, "opt")) {
        c.arch = FT_ARCH_OPT;
        st = parse_opt(root, what, &c);
    } else if (!strcmp(mt, "llama")) {
        c.arch = FT_ARCH_LLAMA;
        st = parse_llama(root, what, &c);
    } else {
        st = ft_set_error(FT_ERR_UNSUPPORTED, "%s: model_type \"%.64s\" is not supported "
                          "(supported: opt, llama)", what, mt);
    }
    if (st) goto done;
    if ((st = token_ids(root, what, &c))) goto done;
    if (c.bos_id >= c.vocab || c.pad_id >= c.vocab) {
        st = ft_set_error(FT_ERR_CORRUPT, "%s: bos/pad token id beyond vocab_size %d", what, c.vocab);
        goto done;
    }
    for (int i = 0; i < c.n_eos; i++)
        if (c.eos_ids[i] >= c.vocab) {
            st = ft_set_error(FT_ERR_CORRUPT, "%s: field \"eos_token_id\" = %d beyond vocab_size %d",
                              what, (int)c.eos_ids[i], c.vocab);
            goto done;
        }
    /* Total parameter count must stay addressable (<= 2^40 floats). */
    {
        double per_layer = 4.0 * c.hidden * (double)c.head_dim * c.n_heads + 3.0 * c.hidden * (double)c.ffn;
        double total = per_layer * c.n_layers + 2.0 * c.vocab * (double)c.hidden
                       + (double)c.max_pos * c.hidden;
        if (total > 1099511627776.0) {
            st = ft_set_error(FT_ERR_CORRUPT, "%s: sizes imply %.3g parameters: absurd", what, total);
            goto done;
        }
    }
    *out = c;
done:
    json_object_put(root);
    return st;
}

ft_status ft_model_config_parse_generation(const char *json, size_t len,
                                           const char *what, ft_model_config *cfg)
{
    if (!json || !cfg) return ft_set_error(FT_ERR_INVALID_ARG, "generation config: NULL argument");
    if (!what) what = "generation_config.json";
    ft_status st;
    json_object *root = parse_json(json, len, what, &st);
    if (!root) return st;
    ft_model_config c = *cfg;
    if ((st = token_ids(root, what, &c)) ||
        (st = opt_bool(root, "do_sample", what, 0, &c.gen_do_sample)) ||
        (st = opt_num(root, "temperature", what, 0, 1e6, 0, &c.gen_temperature)) ||
        (st = opt_num(root, "top_p", what, 0, 1, 0, &c.gen_top_p)) ||
        (st = opt_num(root, "repetition_penalty", what, 0, 1e6, 0, &c.gen_repetition_penalty)) ||
        (st = opt_int(root, "top_k", what, 0, LIM_VOCAB, 0, &c.gen_top_k)) ||
        (st = opt_int(root, "max_new_tokens", what, 0, LIM_POS, 0, &c.gen_max_new_tokens)))
        goto done;
    for (int i = 0; i < c.n_eos; i++)
        if (c.eos_ids[i] >= c.vocab) {
            st = ft_set_error(FT_ERR_CORRUPT, "%s: field \"eos_token_id\" beyond vocab_size", what);
            goto done;
        }
    if (c.bos_id >= c.vocab || c.pad_id >= c.vocab) {
        st = ft_set_error(FT_ERR_CORRUPT, "%s: bos/pad token id beyond vocab_size", what);
        goto done;
    }
    *cfg = c;
done:
    json_object_put(root);
    return st;
}

static ft_status read_small_file(const char *path, char **buf, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (errno == ENOENT) return ft_set_error(FT_ERR_NOT_FOUND, "%s: no such file", path);
        return ft_set_error(FT_ERR_IO, "%s: %s", path, strerror(errno));
    }
    size_t cap = 4096, n = 0;
    char *b = malloc(cap);
    ft_status st = FT_OK;
    while (b) {
        size_t r = fread(b + n, 1, cap - n, f);
        n += r;
        if (n < cap) break;
        if (cap >= (64u << 20)) { st = ft_set_error(FT_ERR_CORRUPT, "%s: too large", path); break; }
        char *nb = realloc(b, cap * 2);
        if (!nb) { free(b); b = NULL; break; }
        b = nb;
        cap *= 2;
    }
    if (!b) st = ft_set_error(FT_ERR_NOMEM, "%s: reading", path);
    else if (ferror(f)) st = ft_set_error(FT_ERR_IO, "%s: read error", path);
    fclose(f);
    if (st) { free(b); return st; }
    *buf = b;
    *len = n;
    return FT_OK;
}

ft_status ft_model_config_load(const char *dir, ft_model_config *out)
{
    if (!dir || !out) return ft_set_error(FT_ERR_INVALID_ARG, "config: NULL argument");
    char path[4096];
    char *buf = NULL;
    size_t len = 0;
    ft_model_config c;
    if (snprintf(path, sizeof path, "%s/config.json", dir) >= (int)sizeof path)
        return ft_set_error(FT_ERR_INVALID_ARG, "config: path too long");
    ft_status st = read_small_file(path, &buf, &len);
    if (st) return st;
    st = ft_model_config_parse(buf, len, path, &c);
    free(buf);
    if (st) return st;
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    st = read_small_file(path, &buf, &len);
    if (st == FT_ERR_NOT_FOUND) {
        ft_clear_error();
    } else if (st) {
        return st;
    } else {
        st = ft_model_config_parse_generation(buf, len, path, &c);
        free(buf);
        if (st) return st;
    }
    *out = c;
    return FT_OK;
}
