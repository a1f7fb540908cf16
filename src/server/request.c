/* The server's requests (server_internal.h): the body of a completion or
 * chat completion, checked field by field before anything reaches the
 * scheduler. Every field's type and range is checked (an error names the
 * field, as OpenAI's "param"); the prompt is tokenized (chat: the messages
 * rendered with the chat template, whose special tokens it writes itself).
 * Fields that would change the output and are not implemented
 * (logprobs, echo, penalties other than 0, a response_format other than
 * text, non-text message parts) are refused, never ignored. A fuzz target
 * (fuzz/fuzz_server_request.c) runs it on arbitrary bytes. */
#include "server_internal.h"
#include "flextier/chat.h"

#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


void srv_gen_free(srv_gen *g)
{
    for (size_t i = 0; i < g->nstop; i++) free(g->stop[i]);
    free(g->prompt);
}

/* A numeric field in [lo, hi] (absent: *out unchanged, 0). -1: answered. */
static int get_num(json_object *o, const char *key, double lo, double hi, int integer, double *out, char *err,
                   size_t nerr)
{
    json_object *v;
    if (!json_object_object_get_ex(o, key, &v) || json_object_is_type(v, json_type_null)) return 0;
    json_type t = json_object_get_type(v);
    if (t != json_type_int && t != json_type_double) {
        snprintf(err, nerr, "'%s' must be a number", key);
        return -1;
    }
    double d = json_object_get_double(v);
    if (integer && t != json_type_int && trunc(d) != d) {   /* no cast: out of range it is undefined */
        snprintf(err, nerr, "'%s' must be an integer", key);
        return -1;
    }
    if (!(d >= lo && d <= hi)) {
        snprintf(err, nerr, "'%s' is %g: it must be between %g and %g", key, d, lo, hi);
        return -1;
    }
    *out = d;
    return 1;
}

static int get_bool(json_object *o, const char *key, int *out, char *err, size_t nerr)
{
    json_object *v;
    if (!json_object_object_get_ex(o, key, &v) || json_object_is_type(v, json_type_null)) return 0;
    if (!json_object_is_type(v, json_type_boolean)) {
        snprintf(err, nerr, "'%s' must be true or false", key);
        return -1;
    }
    *out = json_object_get_boolean(v);
    return 1;
}

/* The fields shared by both endpoints. 0 ok, else the error in err (param). */
static int parse_common(const srv_limits *L, json_object *o, srv_gen *g, char *err, size_t nerr, const char **param)
{
    double d;
    int r, b;
    json_object *v;
    if (json_object_object_get_ex(o, "model", &v) && !json_object_is_type(v, json_type_string) &&
        !json_object_is_type(v, json_type_null)) {
        *param = "model";
        snprintf(err, nerr, "'model' must be a string");
        return -1;
    }
#define NUM(key, lo, hi, integer)                                                  \
    (*param = key, r = get_num(o, key, lo, hi, integer, &d, err, nerr), r < 0)
    g->max_tokens = -1;
    if (NUM("max_tokens", 1, (double)L->max_tokens, 1)) return -1;
    if (r) g->max_tokens = (long long)d;
    if (NUM("max_completion_tokens", 1, (double)L->max_tokens, 1)) return -1;
    if (r) g->max_tokens = (long long)d;
    if (NUM("temperature", 0, 2, 0)) return -1;
    if (r) g->samp.temperature = (float)d;
    if (NUM("top_p", 0, 1, 0)) return -1;
    if (r) g->samp.top_p = (float)d;
    if (NUM("top_k", 0, 1e9, 1)) return -1;
    if (r) g->samp.top_k = (int)d;
    if (NUM("repetition_penalty", 0.01, 100, 0)) return -1;
    if (r) g->samp.repetition_penalty = (float)d;
    if (NUM("seed", -9.3e18, 9.3e18, 1)) return -1;
    if (r) {
        json_object_object_get_ex(o, "seed", &v);
        g->samp.seed = (uint64_t)json_object_get_int64(v);
        g->have_seed = 1;
    }
    g->n = 1;
    if (NUM("n", 1, (double)L->max_n, 1)) return -1;
    if (r) g->n = (int)d;
    for (const char *const *k = (const char *const[]){"presence_penalty", "frequency_penalty", NULL}; *k; k++) {
        if (NUM(*k, -2, 2, 0)) return -1;
        if (r && d != 0) {
            snprintf(err, nerr, "'%s' is not implemented (use repetition_penalty)", *k);
            return -1;
        }
    }
#undef NUM
    *param = "stream";
    if (get_bool(o, "stream", &g->stream, err, nerr) < 0) return -1;
    *param = "logprobs";
    b = 0;
    if (get_bool(o, "logprobs", &b, err, nerr) < 0) return -1;
    if (b || (json_object_object_get_ex(o, "logprobs", &v) && json_object_is_type(v, json_type_int) &&
              json_object_get_int(v) > 0)) {
        snprintf(err, nerr, "logprobs are not implemented");
        return -1;
    }
    *param = "echo";
    b = 0;
    if (get_bool(o, "echo", &b, err, nerr) < 0) return -1;
    if (b) {
        snprintf(err, nerr, "'echo' is not implemented");
        return -1;
    }
    *param = "ignore_eos";
    if (get_bool(o, "ignore_eos", &g->ignore_eos, err, nerr) < 0) return -1;
    *param = "stream_options";
    if (json_object_object_get_ex(o, "stream_options", &v) && !json_object_is_type(v, json_type_null)) {
        if (!json_object_is_type(v, json_type_object)) {
            snprintf(err, nerr, "'stream_options' must be an object");
            return -1;
        }
        if (get_bool(v, "include_usage", &g->include_usage, err, nerr) < 0) return -1;
    }
    *param = "response_format";
    if (json_object_object_get_ex(o, "response_format", &v) && !json_object_is_type(v, json_type_null)) {
        json_object *t;
        if (!json_object_is_type(v, json_type_object) || !json_object_object_get_ex(v, "type", &t) ||
            !json_object_is_type(t, json_type_string) || strcmp(json_object_get_string(t), "text")) {
            snprintf(err, nerr, "'response_format' other than {\"type\": \"text\"} is not implemented");
            return -1;
        }
    }
    *param = "stop";
    if (json_object_object_get_ex(o, "stop", &v) && !json_object_is_type(v, json_type_null)) {
        json_object *one[1] = {v};
        size_t n = 1;
        if (json_object_is_type(v, json_type_array)) n = json_object_array_length(v);
        else if (!json_object_is_type(v, json_type_string)) {
            snprintf(err, nerr, "'stop' must be a string or a list of strings");
            return -1;
        }
        if (n > SRV_MAX_STOP) {
            snprintf(err, nerr, "'stop' has %zu strings (at most %d)", n, SRV_MAX_STOP);
            return -1;
        }
        for (size_t i = 0; i < n; i++) {
            json_object *e = json_object_is_type(v, json_type_array) ? json_object_array_get_idx(v, i) : one[0];
            if (!json_object_is_type(e, json_type_string)) {
                snprintf(err, nerr, "'stop' must be a string or a list of strings");
                return -1;
            }
            size_t len = (size_t)json_object_get_string_len(e);
            if (!len) continue;
            if (len > 256 || memchr(json_object_get_string(e), 0, len)) {
                snprintf(err, nerr, "a stop string is longer than 256 bytes or holds a NUL");
                return -1;
            }
            if (!(g->stop[g->nstop] = strdup(json_object_get_string(e)))) {
                snprintf(err, nerr, "allocation");
                return -1;
            }
            g->nstop++;
        }
    }
    return 0;
}

static int encode(const srv_limits *L, const char *text, size_t len, int add_special, srv_gen *g, char *err, size_t nerr)
{
    if (ft_tokenizer_encode(L->tok, text, len, add_special, &g->prompt, &g->plen)) {
        snprintf(err, nerr, "the prompt cannot be tokenized: %s", ft_last_error());
        return -1;
    }
    return 0;
}

/* /v1/completions: prompt is a string, a list of one string, or a list of
 * token ids. */
static int parse_completion(const srv_limits *L, json_object *o, srv_gen *g, char *err, size_t nerr, const char **param)
{
    json_object *v;
    *param = "prompt";
    if (!json_object_object_get_ex(o, "prompt", &v)) {
        snprintf(err, nerr, "'prompt' is required");
        return -1;
    }
    if (json_object_is_type(v, json_type_array) && json_object_array_length(v) == 1 &&
        json_object_is_type(json_object_array_get_idx(v, 0), json_type_string))
        v = json_object_array_get_idx(v, 0);
    if (json_object_is_type(v, json_type_string))
        return encode(L, json_object_get_string(v), (size_t)json_object_get_string_len(v), 1, g, err, nerr);
    if (json_object_is_type(v, json_type_array)) {
        size_t n = json_object_array_length(v);
        if (!n || n > (size_t)L->ctx) {
            snprintf(err, nerr, "'prompt' has %zu tokens (1 to %d)", n, L->ctx);
            return -1;
        }
        if (!(g->prompt = malloc(n * sizeof *g->prompt))) {
            snprintf(err, nerr, "allocation");
            return -1;
        }
        for (size_t i = 0; i < n; i++) {
            json_object *e = json_object_array_get_idx(v, i);
            if (!json_object_is_type(e, json_type_int) || json_object_get_int64(e) < 0 ||
                json_object_get_int64(e) >= L->vocab) {
                snprintf(err, nerr, "'prompt' must be a string or a list of token ids in [0, %d) (several "
                         "prompts in one request are not implemented: send one request each)", L->vocab);
                return -1;
            }
            g->prompt[i] = (int32_t)json_object_get_int64(e);
        }
        g->plen = n;
        return 0;
    }
    snprintf(err, nerr, "'prompt' must be a string or a list of token ids");
    return -1;
}

/* /v1/chat/completions: messages (role + content: a string, null, or a
 * list of text parts) rendered with the chat template. */
static int parse_chat(const srv_limits *L, json_object *o, srv_gen *g, char *err, size_t nerr, const char **param,
                      int *code)
{
    json_object *v;
    *param = "messages";
    if (!json_object_object_get_ex(o, "messages", &v) || !json_object_is_type(v, json_type_array) ||
        !json_object_array_length(v)) {
        snprintf(err, nerr, "'messages' must be a non-empty list");
        return -1;
    }
    if (!L->tmpl) {
        snprintf(err, nerr, "the model has no chat template (tokenizer_config.json chat_template or "
                 "chat_template.jinja): start the server with --chat-template FILE, or use /v1/completions");
        return -1;
    }
    json_object *msgs = json_object_new_array();
    int rc = -1;
    for (size_t i = 0; i < json_object_array_length(v); i++) {
        json_object *m = json_object_array_get_idx(v, i), *role, *content;
        if (!json_object_is_type(m, json_type_object) || !json_object_object_get_ex(m, "role", &role) ||
            !json_object_is_type(role, json_type_string)) {
            snprintf(err, nerr, "messages[%zu] must be an object with a string 'role'", i);
            goto out;
        }
        json_object *nm = json_object_new_object();
        json_object_array_add(msgs, nm);
        json_object_object_foreach(m, key, val) {
            if (strcmp(key, "content")) json_object_object_add(nm, key, json_object_get(val));
        }
        if (json_object_object_get_ex(m, "content", &content) && json_object_is_type(content, json_type_array)) {
            /* text parts, joined */
            size_t cap = 1, len = 0;
            char *txt = calloc(1, 1);
            for (size_t k = 0; txt && k < json_object_array_length(content); k++) {
                json_object *part = json_object_array_get_idx(content, k), *type, *text;
                if (!json_object_is_type(part, json_type_object) || !json_object_object_get_ex(part, "type", &type) ||
                    !json_object_is_type(type, json_type_string) || strcmp(json_object_get_string(type), "text") ||
                    !json_object_object_get_ex(part, "text", &text) || !json_object_is_type(text, json_type_string)) {
                    snprintf(err, nerr, "messages[%zu].content[%zu]: only text parts ({\"type\": \"text\", "
                             "\"text\": ...}) are implemented", i, k);
                    free(txt);
                    goto out;
                }
                size_t tl = (size_t)json_object_get_string_len(text);
                if (len + tl + 1 > cap) {
                    cap = (len + tl + 1) * 2;
                    char *t2 = realloc(txt, cap);
                    if (!t2) { free(txt); txt = NULL; break; }
                    txt = t2;
                }
                memcpy(txt + len, json_object_get_string(text), tl);
                len += tl;
                txt[len] = 0;
            }
            if (!txt) {
                snprintf(err, nerr, "allocation");
                goto out;
            }
            json_object_object_add(nm, "content", json_object_new_string_len(txt, (int)len));
            free(txt);
        } else if (json_object_object_get_ex(m, "content", &content)) {
            if (!json_object_is_type(content, json_type_string) && !json_object_is_type(content, json_type_null)) {
                snprintf(err, nerr, "messages[%zu].content must be a string, null or a list of text parts", i);
                goto out;
            }
            json_object_object_add(nm, "content", json_object_get(content));
        }
    }
    /* tools and chat_template_kwargs reach the template */
    json_object *extra = json_object_new_object(), *t;
    if (json_object_object_get_ex(o, "tools", &t) && !json_object_is_type(t, json_type_null))
        json_object_object_add(extra, "tools", json_object_get(t));
    if (json_object_object_get_ex(o, "chat_template_kwargs", &t) && json_object_is_type(t, json_type_object)) {
        json_object_object_foreach(t, key, val) { json_object_object_add(extra, key, json_object_get(val)); }
    }
    char *text = NULL;
    ft_status st = ft_chat_template_apply(L->tmpl,
                                          json_object_to_json_string_ext(msgs, JSON_C_TO_STRING_PLAIN),
                                          1, json_object_to_json_string_ext(extra, JSON_C_TO_STRING_PLAIN), &text);
    json_object_put(extra);
    if (st) {
        snprintf(err, nerr, "the chat template refused the messages: %s", ft_last_error());
        *code = 400;
        goto out;
    }
    /* the template writes the special tokens itself (as transformers'
     * apply_chat_template, which tokenizes without adding them) */
    rc = encode(L, text, strlen(text), 0, g, err, nerr);
    free(text);
out:
    json_object_put(msgs);
    return rc;
}


int srv_parse_request(const srv_limits *L, int chat, const char *body, size_t len, srv_gen *g, char *err,
                      size_t nerr, const char **param)
{
    memset(g, 0, sizeof *g);
    *param = NULL;
    err[0] = 0;
    int code = 400;
    if (len > (size_t)INT32_MAX) {
        snprintf(err, nerr, "the body is too large");
        return 413;
    }
    json_tokener *tk = json_tokener_new_ex(64);
    if (!tk) {
        snprintf(err, nerr, "out of memory");
        return 500;
    }
    json_object *o = json_tokener_parse_ex(tk, body, (int)len);
    enum json_tokener_error je = json_tokener_get_error(tk);
    size_t used = json_tokener_get_parse_end(tk);
    json_tokener_free(tk);
    if (!o || je != json_tokener_success) {
        json_object_put(o);
        snprintf(err, nerr, "the body is not valid JSON: %s",
                 je == json_tokener_continue || je == json_tokener_success ? "it ends early"
                                                                           : json_tokener_error_desc(je));
        return 400;
    }
    for (; used < len; used++)
        if (!strchr(" \t\r\n", body[used]) || !body[used]) {
            json_object_put(o);
            snprintf(err, nerr, "the body is not valid JSON: text after the value");
            return 400;
        }
    if (!json_object_is_type(o, json_type_object)) {
        json_object_put(o);
        snprintf(err, nerr, "the body must be a JSON object");
        return 400;
    }
    int rc = parse_common(L, o, g, err, nerr, param);
    if (!rc) {
        rc = chat ? parse_chat(L, o, g, err, nerr, param, &code) : parse_completion(L, o, g, err, nerr, param);
    }
    json_object_put(o);
    if (!rc && !g->plen) {
        *param = chat ? "messages" : "prompt";
        snprintf(err, nerr, "the prompt is empty (no tokens)");
        rc = -1;
    }
    if (!rc && g->plen >= (size_t)L->ctx) {
        *param = chat ? "messages" : "prompt";
        snprintf(err, nerr, "the prompt has %zu tokens: this server's context holds %d (prompt + completion)",
                 g->plen, L->ctx);
        rc = -1;
    }
    if (!rc) {
        size_t room = (size_t)L->ctx - g->plen;
        if (g->max_tokens >= 0 && (size_t)g->max_tokens > room) {
            *param = "max_tokens";
            snprintf(err, nerr, "the prompt (%zu tokens) and max_tokens (%lld) exceed this server's context of %d",
                     g->plen, g->max_tokens, L->ctx);
            rc = -1;
        } else if (g->max_tokens < 0) {
            g->max_tokens = (long long)(L->default_max_tokens < room ? L->default_max_tokens : room);
        }
    }
    if (rc) {
        srv_gen_free(g);
        memset(g, 0, sizeof *g);
        return code;
    }
    return 0;
}
