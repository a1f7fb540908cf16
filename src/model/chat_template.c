/* Chat templates of model directories (flextier/chat.h) over the Jinja
 * interpreter in jinja.c: where transformers finds the template, the
 * special tokens it binds, the message normalisation of its
 * apply_chat_template, and the time strftime_now() formats. */
#define _GNU_SOURCE
#include "flextier/chat.h"
#include "model/jinja.h"

#include <errno.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#define CT_MAX_FILE ((size_t)64 << 20)
#define CT_JSON_DEPTH 128

/* transformers' SPECIAL_TOKENS_ATTRIBUTES: what special_tokens_map binds */
static const char *const special_names[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                            "pad_token", "cls_token", "mask_token"};
#define NSPECIAL (sizeof special_names / sizeof special_names[0])

struct ft_chat_template {
    ft_jinja *dflt;       /* "default" (or the only template)  */
    ft_jinja *tool_use;   /* "tool_use" when the model has one */
    char *special[NSPECIAL];
};

static ft_status read_file(const char *path, char **out, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (errno == ENOENT) return FT_ERR_NOT_FOUND;
        return ft_set_error(FT_ERR_IO, "%s: %s", path, strerror(errno));
    }
    struct stat sb;
    if (fstat(fileno(f), &sb) || !S_ISREG(sb.st_mode) || (size_t)sb.st_size > CT_MAX_FILE) {
        fclose(f);
        return ft_set_error(FT_ERR_IO, "%s: not a regular file of at most %zu MiB", path, CT_MAX_FILE >> 20);
    }
    char *b = malloc((size_t)sb.st_size + 1);
    if (!b) { fclose(f); return ft_set_error(FT_ERR_NOMEM, "out of memory"); }
    size_t n = fread(b, 1, (size_t)sb.st_size, f);
    int err = ferror(f);
    fclose(f);
    if (err) { free(b); return ft_set_error(FT_ERR_IO, "%s: read error", path); }
    b[n] = 0;
    *out = b;
    *len = n;
    return FT_OK;
}

static ft_status parse_json(const char *what, const char *text, size_t len, json_object **out)
{
    json_tokener *tok = json_tokener_new_ex(CT_JSON_DEPTH);
    if (!tok) return ft_set_error(FT_ERR_NOMEM, "out of memory");
    json_tokener_set_flags(tok, JSON_TOKENER_STRICT | JSON_TOKENER_VALIDATE_UTF8);
    if (len > 0x7fffffff) { json_tokener_free(tok); return ft_set_error(FT_ERR_INVALID_ARG, "%s: too large", what); }
    json_object *o = json_tokener_parse_ex(tok, text, (int)len);
    enum json_tokener_error e = json_tokener_get_error(tok);
    size_t end = json_tokener_get_parse_end(tok);
    json_tokener_free(tok);
    if (!o || e != json_tokener_success) {
        json_object_put(o);
        if (e == json_tokener_continue) return ft_set_error(FT_ERR_INVALID_ARG, "%s: JSON is incomplete", what);
        return ft_set_error(FT_ERR_INVALID_ARG, "%s: bad JSON: %s at byte %zu", what, json_tokener_error_desc(e), end);
    }
    for (; end < len; end++)
        if (!strchr(" \t\r\n", text[end])) {
            json_object_put(o);
            return ft_set_error(FT_ERR_INVALID_ARG, "%s: trailing data after the JSON value at byte %zu", what, end);
        }
    *out = o;
    return FT_OK;
}

/* a special token: a string or an AddedToken object {"content": ...} */
static ft_status token_str(json_object *cfg, const char *key, char **out)
{
    json_object *v;
    *out = NULL;
    if (!json_object_object_get_ex(cfg, key, &v) || !v) return FT_OK;
    if (json_object_is_type(v, json_type_object)) {
        json_object *cv;
        if (!json_object_object_get_ex(v, "content", &cv) || !json_object_is_type(cv, json_type_string))
            return ft_set_error(FT_ERR_CORRUPT, "tokenizer_config.json: %s has no string \"content\"", key);
        v = cv;
    }
    if (!json_object_is_type(v, json_type_string))
        return ft_set_error(FT_ERR_CORRUPT, "tokenizer_config.json: %s is not a string", key);
    if (!(*out = strdup(json_object_get_string(v)))) return ft_set_error(FT_ERR_NOMEM, "out of memory");
    return FT_OK;
}

static ft_status compile(const char *what, const char *src, size_t len, ft_jinja **out)
{
    ft_status st = ft_jinja_parse(src, len, out);
    if (st != FT_OK) ft_set_error(st, "%s: %s", what, ft_last_error());
    return st;
}

FT_API void ft_chat_template_free(ft_chat_template *t)
{
    if (!t) return;
    ft_jinja_free(t->dflt);
    ft_jinja_free(t->tool_use);
    for (size_t i = 0; i < NSPECIAL; i++) free(t->special[i]);
    free(t);
}

/* chat_template value: string or [{name, template}] */
static ft_status load_template_value(ft_chat_template *t, const char *what, json_object *ct)
{
    if (json_object_is_type(ct, json_type_string))
        return compile(what, json_object_get_string(ct), (size_t)json_object_get_string_len(ct), &t->dflt);
    if (!json_object_is_type(ct, json_type_array))
        return ft_set_error(FT_ERR_CORRUPT, "%s: chat_template is neither a string nor a list of named templates", what);
    size_t n = json_object_array_length(ct);
    for (size_t i = 0; i < n; i++) {
        json_object *e = json_object_array_get_idx(ct, i), *name, *src;
        if (!json_object_is_type(e, json_type_object) || !json_object_object_get_ex(e, "name", &name) ||
            !json_object_object_get_ex(e, "template", &src) || !json_object_is_type(name, json_type_string) ||
            !json_object_is_type(src, json_type_string))
            return ft_set_error(FT_ERR_CORRUPT, "%s: chat_template[%zu] is not {\"name\": str, \"template\": str}", what, i);
        const char *nm = json_object_get_string(name);
        ft_jinja **slot = !strcmp(nm, "default") ? &t->dflt : !strcmp(nm, "tool_use") ? &t->tool_use : NULL;
        if (!slot || *slot) continue;
        char w[600];
        snprintf(w, sizeof w, "%s (template '%s')", what, nm);
        ft_status st = compile(w, json_object_get_string(src), (size_t)json_object_get_string_len(src), slot);
        if (st != FT_OK) return st;
    }
    if (!t->dflt)
        return ft_set_error(FT_ERR_UNSUPPORTED, "%s: the model has several chat templates and none named \"default\"", what);
    return FT_OK;
}

FT_API ft_status ft_chat_template_load_dir(const char *dir, ft_chat_template **out)
{
    if (!dir || !out) return ft_set_error(FT_ERR_INVALID_ARG, "ft_chat_template_load_dir: NULL argument");
    ft_status st = FT_OK;
    char path[4096];
    char *text = NULL;
    size_t len = 0;
    json_object *cfg = NULL, *ctj = NULL;
    ft_chat_template *t = calloc(1, sizeof *t);
    if (!t) return ft_set_error(FT_ERR_NOMEM, "out of memory");

    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    st = read_file(path, &text, &len);
    if (st == FT_OK) {
        st = parse_json(path, text, len, &cfg);
        free(text);
        text = NULL;
        if (st != FT_OK) goto cleanup;
        if (!json_object_is_type(cfg, json_type_object)) {
            st = ft_set_error(FT_ERR_CORRUPT, "%s: not a JSON object", path);
            goto cleanup;
        }
        for (size_t i = 0; i < NSPECIAL; i++)
            if ((st = token_str(cfg, special_names[i], &t->special[i])) != FT_OK) goto cleanup;
    } else if (st != FT_ERR_NOT_FOUND) goto cleanup;

    /* chat_template.jinja (transformers saves it there since 4.49 and prefers it) */
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    st = read_file(path, &text, &len);
    if (st == FT_OK) {
        st = compile(path, text, len, &t->dflt);
        if (st != FT_OK) goto cleanup;
        /* named templates beside it: additional_chat_templates/tool_use.jinja */
        free(text);
        text = NULL;
        snprintf(path, sizeof path, "%s/additional_chat_templates/tool_use.jinja", dir);
        st = read_file(path, &text, &len);
        if (st == FT_OK) st = compile(path, text, len, &t->tool_use);
        else if (st == FT_ERR_NOT_FOUND) st = FT_OK;
        goto cleanup;
    }
    if (st != FT_ERR_NOT_FOUND) goto cleanup;
    json_object *ct;
    if (cfg && json_object_object_get_ex(cfg, "chat_template", &ct) && ct && !json_object_is_type(ct, json_type_null)) {
        snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
        st = load_template_value(t, path, ct);
        goto cleanup;
    }
    /* processors' chat_template.json {"chat_template": ...} */
    snprintf(path, sizeof path, "%s/chat_template.json", dir);
    st = read_file(path, &text, &len);
    if (st == FT_OK) {
        st = parse_json(path, text, len, &ctj);
        if (st != FT_OK) goto cleanup;
        if (!json_object_is_type(ctj, json_type_object) || !json_object_object_get_ex(ctj, "chat_template", &ct)) {
            st = ft_set_error(FT_ERR_CORRUPT, "%s: no \"chat_template\" member", path);
            goto cleanup;
        }
        st = load_template_value(t, path, ct);
        goto cleanup;
    }
    if (st == FT_ERR_NOT_FOUND)
        st = ft_set_error(FT_ERR_NOT_FOUND, "%s: the model has no chat template (no chat_template in "
                                            "tokenizer_config.json, no chat_template.jinja)", dir);
cleanup:
    free(text);
    json_object_put(cfg);
    json_object_put(ctj);
    if (st != FT_OK) { ft_chat_template_free(t); return st; }
    *out = t;
    return FT_OK;
}

static ft_status dup_opt(const char *s, char **out)
{
    *out = NULL;
    if (s && !(*out = strdup(s))) return ft_set_error(FT_ERR_NOMEM, "out of memory");
    return FT_OK;
}

FT_API ft_status ft_chat_template_load_string(const char *source, const char *bos, const char *eos,
                                              ft_chat_template **out)
{
    if (!source || !out) return ft_set_error(FT_ERR_INVALID_ARG, "ft_chat_template_load_string: NULL argument");
    ft_chat_template *t = calloc(1, sizeof *t);
    if (!t) return ft_set_error(FT_ERR_NOMEM, "out of memory");
    ft_status st = compile("chat template", source, strlen(source), &t->dflt);
    if (st == FT_OK) st = dup_opt(bos, &t->special[0]);
    if (st == FT_OK) st = dup_opt(eos, &t->special[1]);
    if (st != FT_OK) { ft_chat_template_free(t); return st; }
    *out = t;
    return FT_OK;
}

/* SOURCE_DATE_EPOCH when set (reproducible builds), else the clock */
static int64_t template_now(void)
{
    const char *e = getenv("SOURCE_DATE_EPOCH");
    if (e && *e) {
        char *end;
        errno = 0;
        long long v = strtoll(e, &end, 10);
        if (!errno && !*end) return v;
    }
    return (int64_t)time(NULL);
}

static ft_status render(const ft_chat_template *t, const ft_jinja *tpl, json_object *vars, char **out, size_t *len)
{
    (void)t;
    char *text = NULL;
    size_t n = 0;
    ft_status st = ft_jinja_render(tpl, vars, template_now(), NULL, &text, &n);
    if (st != FT_OK) return st;
    *out = text;
    if (len) *len = n;
    return FT_OK;
}

FT_API ft_status ft_chat_template_render_json(const ft_chat_template *t, const char *vars_json, char **out_text,
                                              size_t *out_len)
{
    if (!t || !vars_json || !out_text) return ft_set_error(FT_ERR_INVALID_ARG, "ft_chat_template_render_json: NULL argument");
    json_object *vars = NULL;
    ft_status st = parse_json("template variables", vars_json, strlen(vars_json), &vars);
    if (st != FT_OK) return st;
    if (!json_object_is_type(vars, json_type_object)) {
        json_object_put(vars);
        return ft_set_error(FT_ERR_INVALID_ARG, "template variables: not a JSON object");
    }
    json_object *tools;
    const ft_jinja *tpl = t->dflt;
    if (t->tool_use && json_object_object_get_ex(vars, "tools", &tools) && tools) tpl = t->tool_use;
    st = render(t, tpl, vars, out_text, out_len);
    json_object_put(vars);
    return st;
}

static int set_str(json_object *o, const char *k, const char *v)
{
    if (!v) return 0;
    json_object *s = json_object_new_string(v);
    return !s || json_object_object_add(o, k, s);
}

FT_API ft_status ft_chat_template_apply(const ft_chat_template *t, const char *messages_json, int add_generation_prompt,
                                        const char *extra_json, char **out_text)
{
    if (!t || !messages_json || !out_text) return ft_set_error(FT_ERR_INVALID_ARG, "ft_chat_template_apply: NULL argument");
    json_object *msgs = NULL, *extra = NULL, *vars = NULL, *norm = NULL;
    ft_status st = parse_json("messages", messages_json, strlen(messages_json), &msgs);
    if (st != FT_OK) return st;
    if (!json_object_is_type(msgs, json_type_array)) {
        st = ft_set_error(FT_ERR_INVALID_ARG, "messages: not a JSON array");
        goto cleanup;
    }
    if (extra_json) {
        if ((st = parse_json("extra variables", extra_json, strlen(extra_json), &extra)) != FT_OK) goto cleanup;
        if (!json_object_is_type(extra, json_type_object)) {
            st = ft_set_error(FT_ERR_INVALID_ARG, "extra variables: not a JSON object");
            goto cleanup;
        }
    }
    /* transformers: drop None-valued keys; alias the reasoning fields */
    if (!(norm = json_object_new_array())) goto nomem;
    size_t n = json_object_array_length(msgs);
    for (size_t i = 0; i < n; i++) {
        json_object *m = json_object_array_get_idx(msgs, i);
        if (!json_object_is_type(m, json_type_object)) {
            st = ft_set_error(FT_ERR_INVALID_ARG, "messages[%zu]: chat messages must be JSON objects", i);
            goto cleanup;
        }
        json_object *reasoning = NULL;
        static const char *const rf[] = {"reasoning_content", "thinking", "reasoning"};
        for (int k = 0; k < 3 && !reasoning; k++) {
            json_object *v;
            if (json_object_object_get_ex(m, rf[k], &v) && v) reasoning = v;
        }
        json_object *nm = json_object_new_object();
        if (!nm || json_object_array_add(norm, nm)) { json_object_put(nm); goto nomem; }
        if (reasoning && json_object_object_add(nm, "thinking", json_object_get(reasoning))) goto nomem;
        json_object_object_foreach(m, k, v) {
            if (!v) continue;
            if (json_object_object_add(nm, k, json_object_get(v))) goto nomem;
        }
        if (reasoning && json_object_object_add(nm, "reasoning_content", json_object_get(reasoning))) goto nomem;
    }
    if (!(vars = json_object_new_object())) goto nomem;
    if (json_object_object_add(vars, "messages", json_object_get(norm)) ||
        json_object_object_add(vars, "tools", NULL) || json_object_object_add(vars, "documents", NULL) ||
        json_object_object_add(vars, "add_generation_prompt", json_object_new_boolean(add_generation_prompt != 0)))
        goto nomem;
    for (size_t i = 0; i < NSPECIAL; i++)
        if (set_str(vars, special_names[i], t->special[i])) goto nomem;
    if (extra) {
        json_object_object_foreach(extra, k, v) {
            if (json_object_object_add(vars, k, json_object_get(v))) goto nomem;
        }
    }
    json_object *tools;
    const ft_jinja *tpl = t->dflt;
    if (t->tool_use && json_object_object_get_ex(vars, "tools", &tools) && tools) tpl = t->tool_use;
    st = render(t, tpl, vars, out_text, NULL);
    goto cleanup;
nomem:
    st = ft_set_error(FT_ERR_NOMEM, "out of memory");
cleanup:
    json_object_put(msgs);
    json_object_put(extra);
    json_object_put(vars);
    json_object_put(norm);
    return st;
}
