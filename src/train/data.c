/* Training data: JSONL documents (one {"text": ...} or {"messages": [...]}
 * object per line), and chat conversations rendered with the model's chat
 * template into token ids and a label mask (loss on assistant turns only). */
#include "train/train_internal.h"

#include "flextier/chat.h"
#include "flextier/model.h"

#include <errno.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* a chat line's "messages": a non-empty array of objects, each with a
 * string "role"; at least one "assistant" */
static int good_messages(json_object *m)
{
    if (!json_object_is_type(m, json_type_array) || json_object_array_length(m) == 0) return 0;
    int asst = 0;
    for (size_t i = 0; i < json_object_array_length(m); i++) {
        json_object *e = json_object_array_get_idx(m, i), *r;
        if (!json_object_is_type(e, json_type_object) || !json_object_object_get_ex(e, "role", &r) ||
            !json_object_is_type(r, json_type_string))
            return 0;
        asst |= !strcmp(json_object_get_string(r), "assistant");
    }
    return asst;
}

ft_status ft_train_jsonl_each(const char *data, size_t len, const char *what, ft_train_text_fn fn, void *user)
{
    return ft_train_jsonl_each_ex(data, len, what, fn, NULL, user);
}

ft_status ft_train_jsonl_each_ex(const char *data, size_t len, const char *what, ft_train_text_fn fn,
                                 ft_train_chat_fn chat, void *user)
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
        if (!bad && json_object_object_get_ex(o, "messages", &v) && !json_object_object_get_ex(o, "text", NULL)) {
            if (!chat) {
                json_object_put(o);
                return ft_set_error(FT_ERR_UNSUPPORTED, "data: %s line %zu: chat \"messages\" need a chat template "
                                    "(this reader takes {\"text\": ...} only)", what, line);
            }
            if (!good_messages(v)) {
                json_object_put(o);
                return ft_set_error(FT_ERR_CORRUPT, "data: %s line %zu: \"messages\" must be a non-empty list of "
                                    "objects with a string \"role\", one of them \"assistant\"", what, line);
            }
            const char *js = json_object_to_json_string_ext(v, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE);
            ft_status st = js ? chat(user, js, line) : ft_set_error(FT_ERR_NOMEM, "data: out of memory");
            json_object_put(o);
            if (st) return st;
            docs++;
            continue;
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

/* ------------------------------------------------------------- chat */

/* the first k messages of m as a JSON array string (malloc'd) */
static char *prefix_json(json_object *m, size_t k)
{
    json_object *a = json_object_new_array();
    if (!a) return NULL;
    for (size_t i = 0; i < k; i++) json_object_array_add(a, json_object_get(json_object_array_get_idx(m, i)));
    const char *s = json_object_to_json_string_ext(a, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE);
    char *r = s ? strdup(s) : NULL;
    json_object_put(a);
    return r;
}

static ft_status render(const ft_chat_template *tpl, json_object *m, size_t k, int gen, char **out)
{
    char *js = prefix_json(m, k);
    if (!js) return ft_set_error(FT_ERR_NOMEM, "chat data: out of memory");
    ft_status st = ft_chat_template_apply(tpl, js, gen, NULL, out);
    free(js);
    return st;
}

typedef struct tokbuf { int32_t *ids; uint8_t *mask; size_t n, cap; } tokbuf;

static ft_status push(tokbuf *b, const ft_tokenizer *tok, const char *text, size_t len, uint8_t label)
{
    if (!len) return FT_OK;
    int32_t *ids = NULL;
    size_t k = 0;
    ft_status st = ft_tokenizer_encode(tok, text, len, 0, &ids, &k);
    if (st) return st;
    if (b->n + k > b->cap) {
        size_t c = b->cap ? b->cap : 256;
        while (c < b->n + k) c *= 2;
        int32_t *ni = realloc(b->ids, c * sizeof *ni);
        if (ni) b->ids = ni;
        uint8_t *nm = ni ? realloc(b->mask, c) : NULL;
        if (nm) b->mask = nm;
        if (!ni || !nm) {
            free(ids);
            return ft_set_error(FT_ERR_NOMEM, "chat data: out of memory");
        }
        b->cap = c;
    }
    memcpy(b->ids + b->n, ids, k * sizeof(int32_t));
    memset(b->mask + b->n, label, k);
    b->n += k;
    free(ids);
    return FT_OK;
}

ft_status ft_train_chat_tokens(const ft_chat_template *tpl, const ft_tokenizer *tok, const char *messages_json,
                               int32_t **ids, uint8_t **mask, size_t *n)
{
    if (!tpl || !tok || !messages_json || !ids || !mask || !n)
        return ft_set_error(FT_ERR_INVALID_ARG, "ft_train_chat_tokens: NULL argument");
    json_object *m = json_tokener_parse(messages_json);
    if (!m || !good_messages(m)) {
        if (m) json_object_put(m);
        return ft_set_error(FT_ERR_CORRUPT, "chat data: messages must be a non-empty list of objects with a string "
                            "\"role\", one of them \"assistant\"");
    }
    size_t nm = json_object_array_length(m), at = 0;
    char *full = NULL, *p = NULL, *q = NULL;
    tokbuf b = {0};
    ft_status st = render(tpl, m, nm, 0, &full);
    size_t fl = full ? strlen(full) : 0;
    for (size_t i = 0; i < nm && !st; i++) {
        json_object *r = json_object_object_get(json_object_array_get_idx(m, i), "role");
        if (strcmp(json_object_get_string(r), "assistant")) continue;
        /* the assistant turn is what rendering messages[:i + 1] adds to
         * messages[:i] with the generation prompt */
        if ((st = render(tpl, m, i, 1, &p)) || (st = render(tpl, m, i + 1, 0, &q))) break;
        size_t a = strlen(p), e = strlen(q);
        if (a < at || a > e || e > fl || memcmp(p, full, a) || memcmp(q, full, e)) {
            st = ft_set_error(FT_ERR_UNSUPPORTED, "chat data: the chat template does not render the conversation "
                              "prefix by prefix (message %zu, assistant: its rendering with the messages before it "
                              "is not the start of the whole conversation's), so its turns cannot be told apart",
                              i + 1);
            break;
        }
        if (!(st = push(&b, tok, full + at, a - at, 0))) st = push(&b, tok, full + a, e - a, 1);
        at = e;
        free(p);
        free(q);
        p = q = NULL;
    }
    if (!st) st = push(&b, tok, full + at, fl - at, 0);
    free(p);
    free(q);
    free(full);
    json_object_put(m);
    if (st) {
        free(b.ids);
        free(b.mask);
        return st;
    }
    *ids = b.ids;
    *mask = b.mask;
    *n = b.n;
    return FT_OK;
}

/* ------------------------------------------------- a data file's tokens */

static ft_status slurp_file(const char *path, size_t max, char **out, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return ft_set_error(FT_ERR_NOT_FOUND, "data: cannot open %s: %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    ft_status st = FT_OK;
    char *b = malloc(cap + 1);
    while (b) {
        n += fread(b + n, 1, cap - n, f);
        if (n < cap) break;
        if (cap >= max) {
            st = ft_set_error(FT_ERR_INVALID_ARG, "data: %s is larger than %zu bytes", path, max);
            break;
        }
        char *nb = realloc(b, 2 * cap + 1);
        if (!nb) break;
        b = nb;
        cap *= 2;
    }
    if (!st && (!b || n == cap)) st = ft_set_error(FT_ERR_NOMEM, "data: out of memory reading %s", path);
    if (!st && ferror(f)) st = ft_set_error(FT_ERR_IO, "data: reading %s failed", path);
    fclose(f);
    if (st) {
        free(b);
        return st;
    }
    b[n] = 0;
    *out = b;
    *len = n;
    return FT_OK;
}

static ft_status append(ft_train_data *d, size_t *cap, const int32_t *ids, const uint8_t *mask, size_t k)
{
    if (d->n + k > *cap) {
        size_t c = (*cap ? *cap * 2 : 4096);
        while (c < d->n + k) c *= 2;
        int32_t *p = realloc(d->ids, c * sizeof(int32_t));
        if (p) d->ids = p;
        uint8_t *q = p ? realloc(d->mask, c) : NULL;
        if (q) d->mask = q;
        if (!p || !q) return ft_set_error(FT_ERR_NOMEM, "data: out of memory");
        *cap = c;
    }
    memcpy(d->ids + d->n, ids, k * sizeof(int32_t));
    if (mask) memcpy(d->mask + d->n, mask, k);
    else memset(d->mask + d->n, 1, k);
    for (size_t i = 0; i < k; i++) d->labels += d->mask[d->n + i] != 0;
    d->n += k;
    return FT_OK;
}

typedef struct jl_ctx {
    const ft_tokenizer *tok;
    ft_train_data *d;
    size_t cap;
    int32_t eos;
    const char *model_dir, *template_file, *path;
    ft_chat_template *tpl;
} jl_ctx;

static ft_status jl_doc(void *user, const char *text, size_t len)
{
    jl_ctx *c = user;
    int32_t *ids = NULL;
    size_t k = 0;
    ft_status st = ft_tokenizer_encode(c->tok, text, len, 1, &ids, &k);
    if (!st) st = append(c->d, &c->cap, ids, NULL, k);
    if (!st && c->eos >= 0) st = append(c->d, &c->cap, &c->eos, NULL, 1);
    free(ids);
    return st;
}

/* a chat line: rendered with the template (loaded at the first one), the
 * assistant turns in the loss */
static ft_status jl_chat(void *user, const char *messages, size_t line)
{
    jl_ctx *c = user;
    ft_status st;
    if (!c->tpl) {
        if (c->template_file) {
            size_t n = 0;
            char *src = NULL;
            if ((st = slurp_file(c->template_file, (size_t)1 << 24, &src, &n))) return st;
            st = ft_chat_template_load_string(src, NULL, NULL, &c->tpl);
            free(src);
        } else {
            if (!c->model_dir)
                return ft_set_error(FT_ERR_INVALID_ARG, "data: %s line %zu has chat \"messages\": give a chat template",
                                    c->path, line);
            st = ft_chat_template_load_dir(c->model_dir, &c->tpl);
            if (st == FT_ERR_NOT_FOUND)
                return ft_set_error(st, "data: %s line %zu has chat \"messages\" and the model has no chat template "
                                    "(give one with --chat-template FILE)", c->path, line);
        }
        if (st) return st;
    }
    int32_t *ids = NULL;
    uint8_t *mask = NULL;
    size_t k = 0;
    st = ft_train_chat_tokens(c->tpl, c->tok, messages, &ids, &mask, &k);
    if (st) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", ft_last_error());
        return ft_set_error(st, "data: %s line %zu: %s", c->path, line, msg);
    }
    st = append(c->d, &c->cap, ids, mask, k);
    c->d->chat = 1;
    free(ids);
    free(mask);
    return st;
}

void ft_train_data_free(ft_train_data *d)
{
    if (!d) return;
    free(d->ids);
    free(d->mask);
    memset(d, 0, sizeof *d);
}

ft_status ft_train_data_load(const char *path, const ft_tokenizer *tok, const ft_model_config *cfg,
                             const char *model_dir, const char *chat_template_file, ft_train_data *out)
{
    if (!path || !tok || !cfg || !out) return ft_set_error(FT_ERR_INVALID_ARG, "ft_train_data_load: NULL argument");
    memset(out, 0, sizeof *out);
    size_t rawn = 0, pl = strlen(path);
    char *raw = NULL;
    ft_status st = slurp_file(path, (size_t)1 << 40, &raw, &rawn);
    if (st) return st;
    ft_train_data all;
    memset(&all, 0, sizeof all);
    int32_t *ids = NULL;
    size_t k = 0;
    jl_ctx c = {tok, &all, 0, -1, model_dir, chat_template_file, path, NULL};
    if (memchr(raw, 0, rawn)) {
        st = ft_set_error(FT_ERR_CORRUPT, "data: %s holds NUL bytes (not text)", path);
        goto done;
    }
    if (!(pl > 6 && !strcmp(path + pl - 6, ".jsonl"))) {
        if ((st = ft_tokenizer_encode(tok, raw, rawn, 1, &ids, &k))) goto done;
        if ((st = append(&all, &c.cap, ids, NULL, k))) goto done;
    } else {
        c.eos = cfg->n_eos > 0 ? cfg->eos_ids[0] : -1;
        if ((st = ft_train_jsonl_each_ex(raw, rawn, path, jl_doc, jl_chat, &c))) goto done;
    }
    for (size_t i = 0; i < all.n; i++)
        if (all.ids[i] < 0 || all.ids[i] >= cfg->vocab) {
            st = ft_set_error(FT_ERR_CORRUPT, "data: token id %d is outside the model's vocab_size %d",
                              (int)all.ids[i], cfg->vocab);
            goto done;
        }
    *out = all;
    memset(&all, 0, sizeof all);
done:
    ft_chat_template_free(c.tpl);
    free(ids);
    ft_train_data_free(&all);
    free(raw);
    return st;
}
