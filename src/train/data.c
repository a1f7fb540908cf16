/* Training data: JSONL documents (one {"text": ...} object per line). */
#include "train/train_internal.h"

#include <json-c/json.h>
#include <string.h>

ft_status ft_train_jsonl_each(const char *data, size_t len, const char *what, ft_train_text_fn fn, void *user)
{
    if ((!data && len) || !fn) return ft_set_error(FT_ERR_INVALID_ARG, "ft_train_jsonl_each: NULL argument");
    if (!what) what = "data";
    if (len > (size_t)1 << 40) return ft_set_error(FT_ERR_INVALID_ARG, "data: %s is too large", what);
    if (len && memchr(data, 0, len)) return ft_set_error(FT_ERR_CORRUPT, "data: %s holds NUL bytes (not text)", what);
    size_t line = 0, docs = 0;
    const char *p = data, *end = data + len;
    while (p < end) {
        const char *e = memchr(p, '\n', (size_t)(end - p));
        size_t n = e ? (size_t)(e - p) : (size_t)(end - p);
        const char *q = p;
        p += n + (e ? 1 : 0);
        line++;
        size_t blank = 0;
        while (blank < n && (q[blank] == ' ' || q[blank] == '\t' || q[blank] == '\r')) blank++;
        if (blank == n) continue;
        if (n > (size_t)1 << 30) return ft_set_error(FT_ERR_CORRUPT, "data: %s line %zu is longer than 1 GiB", what, line);
        json_tokener *tk = json_tokener_new();
        if (!tk) return ft_set_error(FT_ERR_NOMEM, "data: out of memory");
        json_object *o = json_tokener_parse_ex(tk, q, (int)n);
        int bad = json_tokener_get_error(tk) != json_tokener_success || !o || !json_object_is_type(o, json_type_object) ||
                  json_tokener_get_parse_end(tk) != n;
        json_tokener_free(tk);
        json_object *v = NULL;
        if (!bad && json_object_object_get_ex(o, "messages", &v) && !json_object_object_get_ex(o, "text", &v)) {
            json_object_put(o);
            return ft_set_error(FT_ERR_UNSUPPORTED, "data: %s line %zu: chat \"messages\" are not implemented (needs "
                                "the model's chat template); use {\"text\": ...}", what, line);
        }
        if (bad || !json_object_object_get_ex(o, "text", &v) || !json_object_is_type(v, json_type_string)) {
            if (o) json_object_put(o);
            return ft_set_error(FT_ERR_CORRUPT, "data: %s line %zu: expected a JSON object with a string \"text\"",
                                what, line);
        }
        const char *txt = json_object_get_string(v);
        size_t tl = (size_t)json_object_get_string_len(v);
        if (memchr(txt, 0, tl)) {   /* a \u0000 escape: the text would end early for the tokenizer */
            json_object_put(o);
            return ft_set_error(FT_ERR_CORRUPT, "data: %s line %zu: \"text\" holds a NUL character (\\u0000)", what,
                                line);
        }
        ft_status st = fn(user, txt, tl);
        json_object_put(o);
        if (st) return st;
        docs++;
    }
    if (!docs) return ft_set_error(FT_ERR_CORRUPT, "data: %s has no JSONL documents", what);
    return FT_OK;
}
