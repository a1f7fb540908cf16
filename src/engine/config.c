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

/* ------------------------------------------------------- key accounting */

/* Keys any architecture may carry that do not change the forward pass:
 * bookkeeping, training-only settings (dropout is off at inference), and
 * legacy generation defaults, which flextier takes from
 * generation_config.json and the command line only. */
static const char *const HARMLESS[] = {
    "architectures", "model_type", "transformers_version", "torch_dtype", "dtype", "_name_or_path",
    "_commit_hash", "_attn_implementation_autoset", "use_cache", "initializer_range", "init_std",
    "attention_dropout", "dropout", "activation_dropout", "hidden_dropout", "layerdrop",
    "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id",
    "output_attentions", "output_hidden_states", "return_dict", "torchscript", "use_return_dict",
    "is_encoder_decoder", "is_decoder", "add_cross_attention", "tie_encoder_decoder",
    "chunk_size_feed_forward", "pruned_heads", "problem_type", "id2label", "label2id", "num_labels",
    "finetuning_task", "task_specific_params", "tokenizer_class", "prefix", "use_bfloat16",
    "tf_legacy_loss", "cross_attention_hidden_size", "pretraining_tp",
    /* legacy generation defaults */
    "max_length", "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups",
    "diversity_penalty", "temperature", "top_k", "top_p", "typical_p", "repetition_penalty",
    "length_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "bad_words_ids",
    "num_return_sequences", "output_scores", "return_dict_in_generate", "forced_bos_token_id",
    "forced_eos_token_id", "remove_invalid_values", "exponential_decay_length_penalty",
    "suppress_tokens", "begin_suppress_tokens", NULL};

static const char *const KEYS_OPT[] = {
    "hidden_size", "num_hidden_layers", "num_attention_heads", "ffn_dim", "vocab_size",
    "max_position_embeddings", "word_embed_proj_dim", "do_layer_norm_before", "enable_bias",
    "layer_norm_elementwise_affine", "tie_word_embeddings", "activation_function",
    "_remove_final_layer_norm", NULL};

static const char *const KEYS_LLAMA[] = {
    "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
    "intermediate_size", "vocab_size", "max_position_embeddings", "rms_norm_eps", "rope_theta",
    "rope_scaling", "rope_parameters", "tie_word_embeddings", "attention_bias", "mlp_bias",
    "hidden_act", "head_dim", "partial_rotary_factor", "original_max_position_embeddings", NULL};

/* Mistral and Qwen2 add only these to Llama's. */
static const char *const KEYS_MISTRAL[] = {"sliding_window", "layer_types", NULL};
static const char *const KEYS_QWEN2[] = {"sliding_window", "use_sliding_window", "max_window_layers",
                                         "layer_types", NULL};

static const char *const KEYS_QWEN3_MOE[] = {
    "sliding_window", "use_sliding_window", "max_window_layers", "layer_types", "decoder_sparse_step",
    "moe_intermediate_size", "num_experts_per_tok", "num_experts", "num_local_experts", "norm_topk_prob",
    "output_router_logits", "router_aux_loss_coef", "mlp_only_layers", NULL};
static const char *const KEYS_QWEN2_MOE[] = {
    "sliding_window", "use_sliding_window", "max_window_layers", "layer_types", "decoder_sparse_step",
    "moe_intermediate_size", "shared_expert_intermediate_size", "num_experts_per_tok", "num_experts",
    "norm_topk_prob", "output_router_logits", "router_aux_loss_coef", "mlp_only_layers", "qkv_bias", NULL};
/* router_jitter_noise: applied only in training */
static const char *const KEYS_MIXTRAL[] = {"sliding_window", "layer_types", "num_local_experts", "num_experts_per_tok",
                                           "output_router_logits", "router_aux_loss_coef", "router_jitter_noise",
                                           NULL};
static const char *const KEYS_OLMOE[] = {"num_experts", "num_experts_per_tok", "norm_topk_prob", "output_router_logits",
                                         "router_aux_loss_coef", "clip_qkv", NULL};
static const char *const KEYS_PHI3[] = {"sliding_window", "resid_pdrop", "embd_pdrop", NULL};
/* cache_implementation: how generate() allocates its cache */
static const char *const KEYS_GEMMA[] = {"hidden_activation", "query_pre_attn_scalar", "sliding_window", "layer_types",
                                         "final_logit_softcapping", "attn_logit_softcapping",
                                         "use_bidirectional_attention", "sliding_window_pattern", "_sliding_window_pattern",
                                         "rope_local_base_freq", "cache_implementation", NULL};

/* Keys of rope_scaling / rope_parameters, by rope type. */
static const char *const ROPE_COMMON[] = {"rope_type", "type", "rope_theta", "partial_rotary_factor", NULL};
static const char *const ROPE_FACTOR[] = {"factor", NULL};
static const char *const ROPE_LLAMA3[] = {"factor", "low_freq_factor", "high_freq_factor",
                                          "original_max_position_embeddings", NULL};
static const char *const ROPE_YARN[] = {"factor", "attention_factor", "beta_fast", "beta_slow", "mscale",
                                        "mscale_all_dim", "original_max_position_embeddings", "truncate",
                                        NULL};

static int in_list(const char *const *l, const char *k)
{
    for (; l && *l; l++)
        if (!strcmp(*l, k)) return 1;
    return 0;
}

static int strict_env(void)
{
    const char *e = getenv("FLEXTIER_STRICT");
    return e && *e && strcmp(e, "0");
}

/* Every key of o must be in one of the lists; an unknown one is a
 * warning, or an error when strict. `field` prefixes nested keys. */
static ft_status check_keys(json_object *o, const char *what, const char *field, unsigned flags,
                            const char *const *a, const char *const *b, const char *const *c)
{
    int strict = (flags & FT_CONFIG_STRICT) || strict_env();
    json_object_object_foreach(o, key, val) {
        (void)val;
        if (in_list(a, key) || in_list(b, key) || in_list(c, key)) continue;
        if (strict)
            return ft_set_error(FT_ERR_UNSUPPORTED, "%s: field \"%s%s%.64s\" is not known to flextier "
                                "(strict: it may change the model's math)", what, field ? field : "",
                                field ? "." : "", key);
        FT_LOG(FT_LOG_WARN, "%s: field \"%s%s%.64s\" is not known to flextier and is ignored; "
               "if it changes the model's math the output is wrong (--strict refuses it)",
               what, field ? field : "", field ? "." : "", key);
    }
    return FT_OK;
}

/* ------------------------------------------------------------------ RoPE */

static int jnum(json_object *o, const char *key, double *out)
{
    json_object *v;
    if (!o || !json_object_object_get_ex(o, key, &v) || !v) return 0;
    if (!json_object_is_type(v, json_type_double) && !json_object_is_type(v, json_type_int)) return -1;
    *out = json_object_get_double(v);
    return 1;
}

/* The same key in the 4.x and the 5.x layout must agree. */
static ft_status same_value(json_object *a, json_object *b, const char *key, const char *what,
                            const char *fa, const char *fb)
{
    json_object *va, *vb;
    if (!a || !b || !json_object_object_get_ex(a, key, &va) || !json_object_object_get_ex(b, key, &vb) ||
        !va || !vb)
        return FT_OK;
    int eq;
    if ((json_object_is_type(va, json_type_double) || json_object_is_type(va, json_type_int)) &&
        (json_object_is_type(vb, json_type_double) || json_object_is_type(vb, json_type_int)))
        eq = json_object_get_double(va) == json_object_get_double(vb);
    else
        eq = json_object_equal(va, vb);
    if (!eq)
        return ft_set_error(FT_ERR_CORRUPT, "%s: field \"%s%s\" = %.40s contradicts \"%s.%s\" = %.40s "
                            "(both config layouts given with different values)", what, fa, key,
                            json_object_to_json_string(va), fb, key, json_object_to_json_string(vb));
    return FT_OK;
}

static ft_status rope_num(json_object *rp, const char *field, const char *key, const char *what,
                          double lo, double hi, int required, double dflt, double *out)
{
    double d;
    int r = jnum(rp, key, &d);
    if (r < 0) return ft_set_error(FT_ERR_CORRUPT, "%s: field \"%s.%s\" must be a number", what, field, key);
    if (!r) {
        if (required) return ft_set_error(FT_ERR_CORRUPT, "%s: field \"%s.%s\" missing", what, field, key);
        *out = dflt;
        return FT_OK;
    }
    if (!(d >= lo && d <= hi))
        return ft_set_error(FT_ERR_CORRUPT, "%s: field \"%s.%s\" = %g out of range [%g, %g]", what, field,
                            key, d, lo, hi);
    *out = d;
    return FT_OK;
}

static double yarn_mscale(double scale, double m) { return scale <= 1 ? 1.0 : 0.1 * m * log(scale) + 1.0; }

/* RoPE from either layout: transformers 5 writes rope_parameters (with
 * rope_theta inside), 4.x the top-level rope_theta and rope_scaling.
 * Semantics are transformers 5's (modeling_rope_utils.py), which agree
 * with 4.46 wherever 4.46 reads the field. */
static ft_status parse_rope(json_object *o, const char *what, unsigned flags, ft_model_config *c)
{
    json_object *rs = NULL, *rp = NULL;
    ft_status st;
    if (json_object_object_get_ex(o, "rope_scaling", &rs) && rs && !json_object_is_type(rs, json_type_object))
        return ft_set_error(FT_ERR_CORRUPT, "%s: field \"rope_scaling\" must be an object or null", what);
    if (json_object_object_get_ex(o, "rope_parameters", &rp) && rp && !json_object_is_type(rp, json_type_object))
        return ft_set_error(FT_ERR_CORRUPT, "%s: field \"rope_parameters\" must be an object or null", what);
    if (rp) {
        json_object *x;
        if (((json_object_object_get_ex(rp, "full_attention", &x) && json_object_is_type(x, json_type_object)) ||
             (json_object_object_get_ex(rp, "sliding_attention", &x) && json_object_is_type(x, json_type_object))))
            return ft_set_error(FT_ERR_UNSUPPORTED, "%s: field \"rope_parameters\" is given per layer type "
                                "(not supported for %s)", what, c->model_type);
        /* contradictions between the layouts */
        json_object *top = o;
        if ((st = same_value(top, rp, "rope_theta", what, "", "rope_parameters"))) return st;
        if ((st = same_value(top, rp, "partial_rotary_factor", what, "", "rope_parameters"))) return st;
        if (rs) {
            const char *ta = NULL, *tb = NULL;
            json_object *v;
            if (json_object_object_get_ex(rs, "rope_type", &v) || json_object_object_get_ex(rs, "type", &v))
                ta = json_object_is_type(v, json_type_string) ? json_object_get_string(v) : NULL;
            if (json_object_object_get_ex(rp, "rope_type", &v) || json_object_object_get_ex(rp, "type", &v))
                tb = json_object_is_type(v, json_type_string) ? json_object_get_string(v) : NULL;
            if (strcmp(ta ? ta : "default", tb ? tb : "default"))
                return ft_set_error(FT_ERR_CORRUPT, "%s: field \"rope_scaling.rope_type\" = \"%.32s\" contradicts "
                                    "\"rope_parameters.rope_type\" = \"%.32s\"", what, ta ? ta : "default",
                                    tb ? tb : "default");
            json_object_object_foreach(rs, k, val) {
                (void)val;
                if (!strcmp(k, "rope_type") || !strcmp(k, "type")) continue;
                if ((st = same_value(rs, rp, k, what, "rope_scaling.", "rope_parameters"))) return st;
            }
        }
    }
    json_object *src = rp ? rp : rs;   /* the scaling parameters */
    const char *field = rp ? "rope_parameters" : "rope_scaling";
    /* theta */
    double theta = 10000.0, d;
    int r = jnum(o, "rope_theta", &d);
    if (r < 0) return ft_set_error(FT_ERR_CORRUPT, "%s: field \"rope_theta\" must be a number", what);
    if (r) theta = d;
    if (rp && (r = jnum(rp, "rope_theta", &d)) != 0) {
        if (r < 0) return ft_set_error(FT_ERR_CORRUPT, "%s: field \"rope_parameters.rope_theta\" must be a number", what);
        theta = d;
    }
    if (!(theta > 1 && theta <= 1e12))
        return ft_set_error(FT_ERR_CORRUPT, "%s: field \"%s\" = %g out of range (1, 1e12]", what,
                            rp ? "rope_parameters.rope_theta" : "rope_theta", theta);
    c->rope_theta = (float)theta;
    /* partial rotary embeddings change which dimensions rotate */
    double prf = 1.0;
    if ((r = jnum(o, "partial_rotary_factor", &d)) != 0) prf = r < 0 ? -1 : d;
    if (src && (r = jnum(src, "partial_rotary_factor", &d)) != 0) prf = r < 0 ? -1 : d;
    if (prf != 1.0)
        return ft_set_error(FT_ERR_UNSUPPORTED, "%s: field \"partial_rotary_factor\" = %g (only 1 is "
                            "supported)", what, prf);
    c->rope_type = FT_ROPE_DEFAULT;
    c->rope_attention_factor = 1.0f;
    if (!src) return FT_OK;
    const char *type = NULL;
    if ((st = opt_str(src, "rope_type", what, &type))) return st;
    if (!type && (st = opt_str(src, "type", what, &type))) return st;
    if (!type) {
        if (!rp) return ft_set_error(FT_ERR_CORRUPT, "%s: field \"rope_scaling.rope_type\" missing", what);
        type = "default";
    }
    const char *const *keys;
    if (!strcmp(type, "default")) { c->rope_type = FT_ROPE_DEFAULT; keys = NULL; }
    else if (!strcmp(type, "linear")) { c->rope_type = FT_ROPE_LINEAR; keys = ROPE_FACTOR; }
    else if (!strcmp(type, "dynamic")) { c->rope_type = FT_ROPE_DYNAMIC; keys = ROPE_FACTOR; }
    else if (!strcmp(type, "llama3")) { c->rope_type = FT_ROPE_LLAMA3; keys = ROPE_LLAMA3; }
    else if (!strcmp(type, "yarn")) { c->rope_type = FT_ROPE_YARN; keys = ROPE_YARN; }
    else if (!strcmp(type, "longrope") || !strcmp(type, "su"))
        return ft_set_error(FT_ERR_UNSUPPORTED, "%s: field \"%s.rope_type\" = \"%s\": LongRoPE (Phi-3 128k) "
                            "is not implemented (its short/long factor switch at original_max_position_embeddings "
                            "is not supported); the 4k-context checkpoints work", what, field, type);
    else
        return ft_set_error(FT_ERR_UNSUPPORTED, "%s: field \"%s.rope_type\" = \"%.64s\" (supported: default, "
                            "linear, dynamic, llama3, yarn)", what, field, type);
    if ((st = check_keys(src, what, field, flags, ROPE_COMMON, keys, NULL))) return st;
    if (c->rope_type == FT_ROPE_DEFAULT) return FT_OK;
    /* original_max_position_embeddings: a top-level value wins in
     * transformers 5; it must not contradict the one in the rope object */
    double orig = c->max_pos;
    int have_orig = 0;
    if ((r = jnum(o, "original_max_position_embeddings", &d)) != 0) {
        if (r < 0 || d != floor(d) || d < 1 || d > LIM_POS)
            return ft_set_error(FT_ERR_CORRUPT, "%s: field \"original_max_position_embeddings\" must be an "
                                "integer in [1, %d]", what, LIM_POS);
        orig = d;
        have_orig = 1;
    }
    double od;
    if ((r = jnum(src, "original_max_position_embeddings", &od)) != 0) {
        if (r < 0 || od != floor(od) || od < 1 || od > LIM_POS)
            return ft_set_error(FT_ERR_CORRUPT, "%s: field \"%s.original_max_position_embeddings\" must be an "
                                "integer in [1, %d]", what, field, LIM_POS);
        if (have_orig && od != orig)
            return ft_set_error(FT_ERR_CORRUPT, "%s: field \"original_max_position_embeddings\" = %g "
                                "contradicts \"%s.original_max_position_embeddings\" = %g", what, orig, field, od);
        orig = od;
        have_orig = 1;
    }
    double factor = 0;
    int need_factor = c->rope_type != FT_ROPE_YARN;
    if ((st = rope_num(src, field, "factor", what, 1e-3, 1e6, need_factor, 0, &factor))) return st;
    if (c->rope_type == FT_ROPE_LINEAR || c->rope_type == FT_ROPE_DYNAMIC) {
        c->rope_factor = (float)factor;
        return FT_OK;
    }
    c->rope_orig_max_pos = (int)orig;
    if (c->rope_type == FT_ROPE_LLAMA3) {
        double lo, hi;
        if ((st = rope_num(src, field, "low_freq_factor", what, 1e-6, 1e6, 1, 0, &lo)) ||
            (st = rope_num(src, field, "high_freq_factor", what, 1e-6, 1e6, 1, 0, &hi)))
            return st;
        if (!(hi > lo))
            return ft_set_error(FT_ERR_CORRUPT, "%s: field \"%s.high_freq_factor\" must exceed "
                                "low_freq_factor", what, field);
        c->rope_factor = (float)factor;
        c->rope_low_freq_factor = (float)lo;
        c->rope_high_freq_factor = (float)hi;
        return FT_OK;
    }
    /* yarn */
    if (factor == 0) {
        if (!have_orig)
            return ft_set_error(FT_ERR_CORRUPT, "%s: field \"%s.factor\" missing (and no "
                                "original_max_position_embeddings to derive it from)", what, field);
        factor = (double)c->max_pos / orig;
    }
    double af, ms, msa, bf, bs;
    int has_af = jnum(src, "attention_factor", &af);
    if ((st = rope_num(src, field, "attention_factor", what, 1e-6, 1e6, 0, 0, &af)) ||
        (st = rope_num(src, field, "mscale", what, 0, 1e6, 0, 0, &ms)) ||
        (st = rope_num(src, field, "mscale_all_dim", what, 0, 1e6, 0, 0, &msa)) ||
        (st = rope_num(src, field, "beta_fast", what, 0, 1e6, 0, 0, &bf)) ||
        (st = rope_num(src, field, "beta_slow", what, 0, 1e6, 0, 0, &bs)) ||
        (st = opt_bool(src, "truncate", what, 1, &c->rope_truncate)))
        return st;
    if (!has_af) af = (ms != 0 && msa != 0) ? yarn_mscale(factor, ms) / yarn_mscale(factor, msa)
                                            : yarn_mscale(factor, 1);
    c->rope_factor = (float)factor;
    c->rope_attention_factor = (float)af;
    c->rope_beta_fast = (float)(bf != 0 ? bf : 32);   /* `or 32`: 0 means the default too */
    c->rope_beta_slow = (float)(bs != 0 ? bs : 1);
    return FT_OK;
}

/* ------------------------------------------------------- sliding windows */

/* Which layers a window applies to: WIN_ALL (Mistral, Mixtral, Phi-3):
 * sliding_window (int or null) on every layer; WIN_QWEN (Qwen2/3): only
 * with use_sliding_window, on the layers layer_types marks
 * "sliding_attention" (transformers 5 saves it) or else on layers >=
 * max_window_layers; WIN_GEMMA: layer_types, or else every layer but
 * each `pattern`-th (gemma2: 2, gemma3: sliding_window_pattern, 6).
 * dflt_sw: the class default of an absent sliding_window (0: none). */
enum { WIN_ALL = 0, WIN_QWEN = 1, WIN_GEMMA = 2 };

static ft_status parse_windows(json_object *o, const char *what, ft_model_config *c, int mode, int dflt_sw,
                               int pattern)
{
    ft_status st;
    int64_t sw = 0;
    int present = 0, use = 1;
    int qwen = mode == WIN_QWEN;
    json_object *swv;
    if ((st = get_int(o, "sliding_window", what, 1, LIM_POS, &sw, &present))) return st;
    if (!json_object_object_get_ex(o, "sliding_window", &swv) && dflt_sw) { sw = dflt_sw; present = 1; }
    if (qwen && (st = opt_bool(o, "use_sliding_window", what, 0, &use))) return st;
    int W = present && use ? (int)sw : 0;
    int mwl = 0;
    if (qwen && (st = opt_int(o, "max_window_layers", what, 0, LIM_LAYERS, 28, &mwl))) return st;
    if (mode == WIN_GEMMA && ((st = opt_int(o, "_sliding_window_pattern", what, 1, LIM_LAYERS, pattern, &pattern)) ||
                              (st = opt_int(o, "sliding_window_pattern", what, 1, LIM_LAYERS, pattern, &pattern))))
        return st;
    json_object *lt;
    int have_lt = json_object_object_get_ex(o, "layer_types", &lt) && lt;
    if (have_lt) {
        if (!json_object_is_type(lt, json_type_array) || (int)json_object_array_length(lt) != c->n_layers)
            return ft_set_error(FT_ERR_CORRUPT, "%s: field \"layer_types\" must list %d layer types", what,
                                c->n_layers);
        for (int l = 0; l < c->n_layers; l++) {
            json_object *e = json_object_array_get_idx(lt, (size_t)l);
            const char *s = e && json_object_is_type(e, json_type_string) ? json_object_get_string(e) : "";
            int sl;
            if (!strcmp(s, "sliding_attention")) sl = 1;
            else if (!strcmp(s, "full_attention")) sl = 0;
            else
                return ft_set_error(FT_ERR_UNSUPPORTED, "%s: field \"layer_types\"[%d] = \"%.32s\" (supported: "
                                    "full_attention, sliding_attention)", what, l, s);
            if (sl && !W)
                return ft_set_error(FT_ERR_CORRUPT, "%s: field \"layer_types\"[%d] is sliding_attention but "
                                    "no sliding window is in effect", what, l);
            /* Mistral's modeling code ignores layer_types: a window is on every layer */
            if (mode == WIN_ALL && sl != (W != 0))
                return ft_set_error(FT_ERR_UNSUPPORTED, "%s: field \"layer_types\"[%d] = \"%s\": %s "
                                    "applies sliding_window to every layer", what, l, s, c->model_type);
            c->layer_sliding[l] = (unsigned char)sl;
        }
    } else if (W && mode == WIN_GEMMA) {
        for (int l = 0; l < c->n_layers; l++) c->layer_sliding[l] = (unsigned char)(((l + 1) % pattern) != 0);
    } else if (W) {
        for (int l = qwen ? mwl : 0; l < c->n_layers; l++) c->layer_sliding[l] = 1;
    }
    if (W > c->max_pos)
        return ft_set_error(FT_ERR_CORRUPT, "%s: field \"sliding_window\" = %d exceeds "
                            "max_position_embeddings = %d (a window larger than the context)", what, W,
                            c->max_pos);
    c->sliding_window = W;
    for (int l = 0; W && l < c->n_layers; l++)
        if (c->layer_sliding[l]) return FT_OK;
    c->sliding_window = 0;   /* no layer uses it */
    return FT_OK;
}

int ft_model_config_layer_window(const ft_model_config *cfg, int layer)
{
    if (!cfg || layer < 0 || layer >= cfg->n_layers || layer >= FT_MAX_LAYERS) return 0;
    return cfg->layer_sliding[layer] ? cfg->sliding_window : 0;
}

static ft_status parse_llama(json_object *o, const char *what, unsigned flags, ft_model_config *c)
{
    ft_status st;
    const char *act;
    /* the class defaults of transformers' configs where a key is absent */
    const char *mt = c->model_type;
    int mistral = !strcmp(mt, "mistral") || !strcmp(mt, "mixtral"), qwen = c->arch == FT_ARCH_QWEN2;
    int qwen3 = c->arch == FT_ARCH_QWEN3, gemma = c->arch == FT_ARCH_GEMMA2;
    int dflt_kv = mistral ? 8 : qwen ? (strcmp(mt, "qwen2_moe") ? 32 : 16) : qwen3 ? (strcmp(mt, "qwen3") ? 4 : 32) : gemma ? 4 : 0;
    int dflt_pos = mistral ? 4096 * 32 : qwen || qwen3 ? 32768 : gemma ? (strcmp(mt, "gemma2") ? 131072 : 8192)
                 : c->arch == FT_ARCH_OLMOE ? 4096 : c->arch == FT_ARCH_PHI3 ? 4096 : 2048;
    double dflt_eps = qwen3 || gemma ? 1e-6 : c->arch == FT_ARCH_PHI3 || c->arch == FT_ARCH_OLMOE ? 1e-5 : 1e-6;
    int dflt_hd = gemma ? 256 : !strcmp(mt, "qwen3") ? 128 : 0;
    if ((st = req_int(o, "hidden_size", what, 1, LIM_HIDDEN, &c->hidden)) ||
        (st = req_int(o, "num_hidden_layers", what, 1, LIM_LAYERS, &c->n_layers)) ||
        (st = req_int(o, "num_attention_heads", what, 1, LIM_HEADS, &c->n_heads)) ||
        (st = opt_int(o, "num_key_value_heads", what, 1, LIM_HEADS, dflt_kv ? dflt_kv : c->n_heads,
                      &c->n_kv_heads)) ||
        (st = req_int(o, "intermediate_size", what, 1, LIM_FFN, &c->ffn)) ||
        (st = req_int(o, "vocab_size", what, 1, LIM_VOCAB, &c->vocab)) ||
        (st = opt_int(o, "max_position_embeddings", what, 1, LIM_POS, dflt_pos, &c->max_pos)) ||
        (st = opt_num(o, "rms_norm_eps", what, 0, 1, dflt_eps, &c->norm_eps)) ||
        (st = opt_bool(o, "tie_word_embeddings", what, gemma, &c->tie_word_embeddings)) ||
        (st = opt_bool(o, "attention_bias", what, 0, &c->attention_bias)) ||
        (st = opt_bool(o, "mlp_bias", what, 0, &c->mlp_bias)) ||
        (st = opt_str(o, "hidden_act", what, &act)))
        return st;
    if (gemma) {
        /* gemma's MLP reads hidden_activation (4.x configs also carry a
         * hidden_act it ignores) */
        const char *ha;
        if ((st = opt_str(o, "hidden_activation", what, &ha))) return st;
        if (ha && strcmp(ha, "gelu_pytorch_tanh"))
            return ft_set_error(FT_ERR_UNSUPPORTED, "%s: field \"hidden_activation\" = \"%s\" (only "
                                "\"gelu_pytorch_tanh\")", what, ha);
        c->act = FT_ACT_GELU_TANH;
    } else if (act && strcmp(act, "silu")) {
        return ft_set_error(FT_ERR_UNSUPPORTED, "%s: field \"hidden_act\" = \"%s\" (only \"silu\")",
                            what, act);
    }
    if (c->n_heads % c->n_kv_heads)
        return ft_set_error(FT_ERR_CORRUPT, "%s: field \"num_key_value_heads\" = %d does not divide "
                            "num_attention_heads = %d", what, c->n_kv_heads, c->n_heads);
    json_object *hd;
    if (json_object_object_get_ex(o, "head_dim", &hd) && hd) {
        if ((st = req_int(o, "head_dim", what, 2, LIM_HEAD_DIM, &c->head_dim))) return st;
    } else if (dflt_hd) {
        c->head_dim = dflt_hd;
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
    if (gemma) { c->bos_id = 2; c->eos_ids[0] = 1; c->pad_id = 0; }
    if (!strcmp(mt, "gemma3_text")) return FT_OK;   /* parse_gemma reads its per-layer-type RoPE */
    return parse_rope(o, what, flags, c);
}

/* An integer list (null: empty) of layer indices. */
static ft_status layer_list(json_object *o, const char *key, const char *what, int n_layers, unsigned char *mark)
{
    json_object *v;
    if (!json_object_object_get_ex(o, key, &v) || !v) return FT_OK;
    if (!json_object_is_type(v, json_type_array))
        return ft_set_error(FT_ERR_CORRUPT, "%s: field \"%s\" must be a list of layer indices", what, key);
    for (size_t i = 0; i < json_object_array_length(v); i++) {
        json_object *e = json_object_array_get_idx(v, i);
        int64_t x = e && json_object_is_type(e, json_type_int) ? json_object_get_int64(e) : -1;
        if (x < 0 || x >= n_layers)
            return ft_set_error(FT_ERR_CORRUPT, "%s: field \"%s\"[%zu] is not a layer index (0..%d)", what, key, i,
                                n_layers - 1);
        mark[x] = 1;
    }
    return FT_OK;
}

/* The mixture of experts of mixtral, qwen3_moe, qwen2_moe and olmoe. */
static ft_status parse_moe(json_object *o, const char *what, ft_model_config *c)
{
    ft_status st;
    int mixtral = c->arch == FT_ARCH_MIXTRAL, q2 = c->arch == FT_ARCH_QWEN2;
    int q3 = c->arch == FT_ARCH_QWEN3 || q2;   /* sparse steps, dense layers, moe_intermediate_size */
    int ne = 0, ne2 = 0, present2 = 0;
    /* qwen3_moe: num_experts (4.x) or num_local_experts (5.x) */
    if ((st = opt_int(o, mixtral ? "num_local_experts" : "num_experts", what, 0, FT_MAX_EXPERTS,
                      mixtral ? 8 : q2 ? 60 : q3 ? 128 : 64, &ne)))
        return st;
    if (q2) q3 = 2;
    if (q3 == 1) {
        json_object *v;
        present2 = json_object_object_get_ex(o, "num_local_experts", &v) && v;
        if ((st = opt_int(o, "num_local_experts", what, 0, FT_MAX_EXPERTS, 0, &ne2))) return st;
        json_object *v1;
        int present1 = json_object_object_get_ex(o, "num_experts", &v1) && v1;
        if (present1 && present2 && ne != ne2)
            return ft_set_error(FT_ERR_CORRUPT, "%s: field \"num_experts\" = %d contradicts \"num_local_experts\" "
                                "= %d", what, ne, ne2);
        if (present2) ne = ne2;
    }
    int k = 0;
    if ((st = opt_int(o, "num_experts_per_tok", what, 1, FT_MAX_EXPERTS, mixtral ? 2 : q2 ? 4 : 8, &k))) return st;
    c->moe_norm_topk = 1;
    if (!mixtral && (st = opt_bool(o, "norm_topk_prob", what, 0, &c->moe_norm_topk))) return st;
    c->moe_ffn = c->ffn;
    if (q3 && (st = opt_int(o, "moe_intermediate_size", what, 1, LIM_FFN, q2 ? 1408 : 768, &c->moe_ffn))) return st;
    if (ne == 0) {
        if (!q3) return ft_set_error(FT_ERR_CORRUPT, "%s: a %s model with 0 experts", what, c->model_type);
        return FT_OK;   /* qwen3_moe without experts: every layer dense */
    }
    if (k > ne)
        return ft_set_error(FT_ERR_CORRUPT, "%s: field \"num_experts_per_tok\" = %d exceeds the %d experts", what,
                            k, ne);
    c->n_experts = ne;
    c->n_experts_used = k;
    int step = 1;
    unsigned char dense[FT_MAX_LAYERS] = {0};
    if (q3) {
        if ((st = opt_int(o, "decoder_sparse_step", what, 1, LIM_LAYERS, 1, &step)) ||
            (st = layer_list(o, "mlp_only_layers", what, c->n_layers, dense)))
            return st;
    }
    int any = 0;
    for (int l = 0; l < c->n_layers; l++) {
        c->layer_moe[l] = (unsigned char)(!dense[l] && (l + 1) % step == 0);
        any |= c->layer_moe[l];
    }
    if (!any) c->n_experts = c->n_experts_used = 0;   /* every layer dense */
    return FT_OK;
}

/* Qwen2-MoE: the shared expert of every sparse layer (in the dense MLP's
 * slots: one width per slot, so dense layers must have the same), q/k/v
 * biases per qkv_bias, no sliding windows. */
static ft_status parse_qwen2_moe(json_object *o, const char *what, ft_model_config *c)
{
    ft_status st;
    int usw = 0, qkv_bias = 1, shared = 0;
    if ((st = opt_bool(o, "use_sliding_window", what, 0, &usw))) return st;
    if (usw)
        return ft_set_error(FT_ERR_UNSUPPORTED, "%s: field \"use_sliding_window\" = true (transformers 4.x and 5.x "
                            "window different layers of qwen2_moe; flextier refuses rather than guess)", what);
    json_object *lt;
    if (json_object_object_get_ex(o, "layer_types", &lt) && lt) {
        if (!json_object_is_type(lt, json_type_array))
            return ft_set_error(FT_ERR_CORRUPT, "%s: field \"layer_types\" is not an array", what);
        for (size_t i = 0; i < json_object_array_length(lt); i++) {
            const char *t = json_object_get_string(json_object_array_get_idx(lt, i));
            if (!t || strcmp(t, "full_attention"))
                return ft_set_error(FT_ERR_UNSUPPORTED, "%s: field \"layer_types\"[%zu] = \"%.32s\" (qwen2_moe: "
                                    "only \"full_attention\")", what, i, t ? t : "?");
        }
    }
    if ((st = opt_bool(o, "qkv_bias", what, 1, &qkv_bias))) return st;
    c->no_qkv_bias = !qkv_bias;
    if ((st = parse_moe(o, what, c))) return st;
    if ((st = opt_int(o, "shared_expert_intermediate_size", what, 1, LIM_FFN, 5632, &shared))) return st;
    if (!c->n_experts) return FT_OK;   /* every layer dense: no shared expert */
    for (int l = 0; l < c->n_layers; l++)
        if (!c->layer_moe[l] && shared != c->ffn)
            return ft_set_error(FT_ERR_UNSUPPORTED, "%s: dense layer %d (intermediate_size %d) beside sparse layers "
                                "whose shared expert is %d wide: flextier keeps both in one slot and needs them "
                                "equal", what, l, c->ffn, shared);
    c->ffn = shared;   /* every layer sparse: intermediate_size is unused */
    c->shared_expert = 1;
    return FT_OK;
}

/* Gemma 2 and Gemma 3 (text): soft-capping, query_pre_attn_scalar,
 * alternating windows, and gemma3's per-layer-type RoPE. */
static ft_status parse_gemma(json_object *o, const char *what, unsigned flags, ft_model_config *c)
{
    ft_status st;
    int g3 = !strcmp(c->model_type, "gemma3_text");
    int bidi = 0;
    float qpas, fcap, acap;
    if ((st = opt_bool(o, "use_bidirectional_attention", what, 0, &bidi))) return st;
    if (bidi)
        return ft_set_error(FT_ERR_UNSUPPORTED, "%s: field \"use_bidirectional_attention\" = true (an encoder "
                            "for embeddings, not a causal language model)", what);
    if ((st = opt_num(o, "query_pre_attn_scalar", what, 1e-6, 1e9, 256, &qpas)) ||
        (st = opt_num(o, "final_logit_softcapping", what, 1e-6, 1e9, g3 ? 0 : 30.0, &fcap)) ||
        (st = opt_num(o, "attn_logit_softcapping", what, 1e-6, 1e9, g3 ? 0 : 50.0, &acap)))
        return st;
    json_object *v;
    /* null is "no capping" (opt_num treats null as absent: the class default) */
    if (json_object_object_get_ex(o, "final_logit_softcapping", &v) && !v) fcap = 0;
    if (json_object_object_get_ex(o, "attn_logit_softcapping", &v) && !v) acap = 0;
    c->final_softcap = fcap;
    c->attn_softcap = acap;
    c->attn_scale = (float)pow((double)qpas, -0.5);
    c->embed_scale = (float)sqrt((double)c->hidden);
    c->norm_plus_one = 1;
    c->sandwich_norm = 1;
    if (g3) c->qk_norm = 1;
    if ((st = parse_windows(o, what, c, WIN_GEMMA, 4096, g3 ? 6 : 2))) return st;
    if (!g3) return FT_OK;
    /* RoPE: global (full-attention layers) and local (sliding layers) */
    json_object *rp = NULL, *full = NULL, *slide = NULL;
    if (json_object_object_get_ex(o, "rope_parameters", &rp) && rp && json_object_is_type(rp, json_type_object) &&
        (json_object_object_get_ex(rp, "full_attention", &full) | json_object_object_get_ex(rp, "sliding_attention", &slide))) {
        json_object_object_foreach(rp, key, val) {
            (void)val;
            if (strcmp(key, "full_attention") && strcmp(key, "sliding_attention"))
                return ft_set_error(FT_ERR_UNSUPPORTED, "%s: field \"rope_parameters.%.32s\" (per layer type: "
                                    "full_attention, sliding_attention)", what, key);
        }
        if (!full || !slide || !json_object_is_type(full, json_type_object) ||
            !json_object_is_type(slide, json_type_object))
            return ft_set_error(FT_ERR_CORRUPT, "%s: field \"rope_parameters\" must give objects for both "
                                "full_attention and sliding_attention", what);
        /* the global RoPE: parse_rope on a copy whose rope_parameters is full_attention's */
        json_object *tmp = NULL;
        if (json_object_deep_copy(o, &tmp, NULL) || !tmp)
            return ft_set_error(FT_ERR_NOMEM, "%s: copying the config", what);
        json_object *fc = NULL;
        if (json_object_deep_copy(full, &fc, NULL) || !fc) {
            json_object_put(tmp);
            return ft_set_error(FT_ERR_NOMEM, "%s: copying the config", what);
        }
        json_object_object_add(tmp, "rope_parameters", fc);
        st = parse_rope(tmp, what, flags, c);
        json_object_put(tmp);
        if (st) return st;
        const char *type = NULL;
        double th;
        if ((st = opt_str(slide, "rope_type", what, &type))) return st;
        if (type && strcmp(type, "default"))
            return ft_set_error(FT_ERR_UNSUPPORTED, "%s: field \"rope_parameters.sliding_attention.rope_type\" = "
                                "\"%.32s\" (the local RoPE must be default)", what, type);
        if ((st = check_keys(slide, what, "rope_parameters.sliding_attention", flags, ROPE_COMMON, NULL, NULL)))
            return st;
        int r = jnum(slide, "rope_theta", &th);
        if (r < 0 || (r && !(th > 1 && th <= 1e12)))
            return ft_set_error(FT_ERR_CORRUPT, "%s: field \"rope_parameters.sliding_attention.rope_theta\" must "
                                "be a number in (1, 1e12]", what);
        c->rope_local_theta = r ? (float)th : 10000.0f;
        if (jnum(slide, "partial_rotary_factor", &th) && th != 1.0)
            return ft_set_error(FT_ERR_UNSUPPORTED, "%s: field \"rope_parameters.sliding_attention."
                                "partial_rotary_factor\" = %g (only 1)", what, th);
        return FT_OK;
    }
    /* 4.x: rope_theta (default 1e6) + rope_scaling for the global layers, rope_local_base_freq */
    json_object *rt;
    int have_theta = json_object_object_get_ex(o, "rope_theta", &rt) && rt;
    if (!have_theta && !rp) {
        json_object *tmp = NULL;
        if (json_object_deep_copy(o, &tmp, NULL) || !tmp)
            return ft_set_error(FT_ERR_NOMEM, "%s: copying the config", what);
        json_object_object_add(tmp, "rope_theta", json_object_new_double(1000000.0));
        st = parse_rope(tmp, what, flags, c);
        json_object_put(tmp);
    } else {
        st = parse_rope(o, what, flags, c);
    }
    if (st) return st;
    float lt;
    if ((st = opt_num(o, "rope_local_base_freq", what, 1.000001, 1e12, 10000.0, &lt))) return st;
    c->rope_local_theta = lt;
    return FT_OK;
}

ft_status ft_model_config_parse(const char *json, size_t len, const char *what,
                                ft_model_config *out)
{
    return ft_model_config_parse_ex(json, len, what, 0, out);
}

ft_status ft_model_config_parse_ex(const char *json, size_t len, const char *what,
                                   unsigned flags, ft_model_config *out)
{
    if (!json || !out) return ft_set_error(FT_ERR_INVALID_ARG, "config: NULL argument");
    if (!what) what = "config.json";
    ft_status st;
    json_object *root = parse_json(json, len, what, &st);
    if (!root) return st;
    ft_model_config c;
    memset(&c, 0, sizeof c);
    c.bos_id = c.pad_id = -1;
    c.rope_attention_factor = 1.0f;
    const char *mt;
    json_object *qc;
    if ((st = opt_str(root, "model_type", what, &mt))) goto done;
    if (!mt) { st = ft_set_error(FT_ERR_CORRUPT, "%s: missing field \"model_type\"", what); goto done; }
    snprintf(c.model_type, sizeof c.model_type, "%s", mt);
    if (json_object_object_get_ex(root, "quantization_config", &qc) && qc) {
        st = ft_set_error(FT_ERR_UNSUPPORTED, "%s: field \"quantization_config\": quantized checkpoints "
                          "(GPTQ, AWQ, bitsandbytes, ...) are not supported", what);
        goto done;
    }
    if (!strcmp(mt, "opt")) {
        c.arch = FT_ARCH_OPT;
        st = parse_opt(root, what, &c);
        if (!st) st = check_keys(root, what, NULL, flags, HARMLESS, KEYS_OPT, NULL);
    } else if (!strcmp(mt, "llama") || !strcmp(mt, "mistral") || !strcmp(mt, "qwen2")) {
        c.arch = !strcmp(mt, "qwen2") ? FT_ARCH_QWEN2 : FT_ARCH_LLAMA;
        const char *const *extra = !strcmp(mt, "mistral") ? KEYS_MISTRAL : c.arch == FT_ARCH_QWEN2 ? KEYS_QWEN2 : NULL;
        st = parse_llama(root, what, flags, &c);
        if (!st && extra) st = parse_windows(root, what, &c, c.arch == FT_ARCH_QWEN2 ? WIN_QWEN : WIN_ALL, 4096, 0);
        if (!st) st = check_keys(root, what, NULL, flags, HARMLESS, KEYS_LLAMA, extra);
    } else if (!strcmp(mt, "qwen3")) {
        c.arch = FT_ARCH_QWEN3;
        c.qk_norm = 1;
        st = parse_llama(root, what, flags, &c);
        if (!st) st = parse_windows(root, what, &c, WIN_QWEN, 4096, 0);
        if (!st) st = check_keys(root, what, NULL, flags, HARMLESS, KEYS_LLAMA, KEYS_QWEN2);
    } else if (!strcmp(mt, "qwen3_moe")) {
        c.arch = FT_ARCH_QWEN3;
        c.qk_norm = 1;
        int usw = 0;
        st = parse_llama(root, what, flags, &c);
        if (!st) st = opt_bool(root, "use_sliding_window", what, 0, &usw);
        if (!st && usw)
            st = ft_set_error(FT_ERR_UNSUPPORTED, "%s: field \"use_sliding_window\" = true (transformers' eager "
                              "and sdpa qwen3_moe attention ignore it; flextier refuses rather than guess)", what);
        if (!st) st = parse_moe(root, what, &c);
        if (!st) st = check_keys(root, what, NULL, flags, HARMLESS, KEYS_LLAMA, KEYS_QWEN3_MOE);
    } else if (!strcmp(mt, "qwen2_moe")) {
        c.arch = FT_ARCH_QWEN2;
        st = parse_llama(root, what, flags, &c);
        if (!st) st = parse_qwen2_moe(root, what, &c);
        if (!st) st = check_keys(root, what, NULL, flags, HARMLESS, KEYS_LLAMA, KEYS_QWEN2_MOE);
    } else if (!strncmp(mt, "deepseek_v", 10) || !strcmp(mt, "deepseek")) {
        st = ft_set_error(FT_ERR_UNSUPPORTED, "%s: model_type \"%.32s\" is not supported: DeepSeek's multi-head "
                          "latent attention (MLA: compressed q/kv projections, decoupled RoPE) and its group-limited "
                          "sigmoid routing with e_score_correction_bias are not implemented (shared experts alone are: "
                          "qwen2_moe)", what, mt);
    } else if (!strcmp(mt, "mixtral")) {
        c.arch = FT_ARCH_MIXTRAL;
        st = parse_llama(root, what, flags, &c);
        if (!st) st = parse_windows(root, what, &c, WIN_ALL, 0, 0);
        if (!st) st = parse_moe(root, what, &c);
        if (!st) st = check_keys(root, what, NULL, flags, HARMLESS, KEYS_LLAMA, KEYS_MIXTRAL);
    } else if (!strcmp(mt, "olmoe")) {
        c.arch = FT_ARCH_OLMOE;
        c.qk_norm = 2;
        json_object *cq;
        st = parse_llama(root, what, flags, &c);
        if (!st && json_object_object_get_ex(root, "clip_qkv", &cq) && cq)
            st = ft_set_error(FT_ERR_UNSUPPORTED, "%s: field \"clip_qkv\" = %.32s (clamping q/k/v is not "
                              "implemented; only null)", what, json_object_to_json_string(cq));
        if (!st) st = parse_moe(root, what, &c);
        if (!st) st = check_keys(root, what, NULL, flags, HARMLESS, KEYS_LLAMA, KEYS_OLMOE);
    } else if (!strcmp(mt, "phi3")) {
        c.arch = FT_ARCH_PHI3;
        st = parse_llama(root, what, flags, &c);
        /* Phi3Config turns rope_type "yarn" and "su" into "longrope" */
        if (!st && c.rope_type == FT_ROPE_YARN)
            st = ft_set_error(FT_ERR_UNSUPPORTED, "%s: rope_type \"yarn\" means longrope for phi3 (transformers "
                              "converts it), which is not implemented", what);
        if (!st) st = parse_windows(root, what, &c, WIN_ALL, 0, 0);
        if (!st) st = check_keys(root, what, NULL, flags, HARMLESS, KEYS_LLAMA, KEYS_PHI3);
    } else if (!strcmp(mt, "gemma2") || !strcmp(mt, "gemma3_text")) {
        c.arch = FT_ARCH_GEMMA2;
        st = parse_llama(root, what, flags, &c);
        if (!st) st = parse_gemma(root, what, flags, &c);
        if (!st) st = check_keys(root, what, NULL, flags, HARMLESS, KEYS_LLAMA, KEYS_GEMMA);
    } else {
        st = ft_set_error(FT_ERR_UNSUPPORTED, "%s: model_type \"%.64s\" is not supported (supported: opt, llama, "
                          "mistral, qwen2, qwen2_moe, qwen3, qwen3_moe, mixtral, olmoe, phi3, gemma2, gemma3_text)", what, mt);
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
        double per_layer = 4.0 * c.hidden * (double)c.head_dim * c.n_heads + 3.0 * c.hidden * (double)c.ffn +
                           (double)c.n_experts * (3.0 * c.hidden * (double)c.moe_ffn + c.hidden);
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

/* generation_config.json: what ft_generate / `flextier run` read, and
 * keys that do not change what is generated (bookkeeping; max_length,
 * since flextier's budget is --max-new-tokens). */
static const char *const GEN_KEYS[] = {
    "bos_token_id", "eos_token_id", "pad_token_id", "do_sample", "temperature", "top_p",
    "repetition_penalty", "top_k", "max_new_tokens", "transformers_version", "_from_model_config",
    "use_cache", "max_length", "output_attentions", "output_hidden_states", "output_scores",
    "return_dict_in_generate", NULL};

ft_status ft_model_config_parse_generation(const char *json, size_t len,
                                           const char *what, ft_model_config *cfg)
{
    return ft_model_config_parse_generation_ex(json, len, what, 0, cfg);
}

ft_status ft_model_config_parse_generation_ex(const char *json, size_t len, const char *what,
                                              unsigned flags, ft_model_config *cfg)
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
        (st = opt_int(root, "max_new_tokens", what, 0, LIM_POS, 0, &c.gen_max_new_tokens)) ||
        (st = check_keys(root, what, NULL, flags, GEN_KEYS, NULL, NULL)))
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
    return ft_model_config_load_ex(dir, 0, out);
}

ft_status ft_model_config_load_ex(const char *dir, unsigned flags, ft_model_config *out)
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
    st = ft_model_config_parse_ex(buf, len, path, flags, &c);
    free(buf);
    if (st) return st;
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    st = read_small_file(path, &buf, &len);
    if (st == FT_ERR_NOT_FOUND) {
        ft_clear_error();
    } else if (st) {
        return st;
    } else {
        st = ft_model_config_parse_generation_ex(buf, len, path, flags, &c);
        free(buf);
        if (st) return st;
    }
    *out = c;
    return FT_OK;
}
