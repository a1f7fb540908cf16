/* tokenizer.json: BPE tokenizers as Hugging Face `tokenizers` runs them.
 *
 * Encode pipeline (same order as HF): invalid UTF-8 -> U+FFFD; split on
 * non-normalized added tokens; normalize each remaining segment; split on
 * normalized added tokens; pre-tokenize each segment into pieces; BPE each
 * piece; post-processor template (add_special).
 *
 * BPE merges use a binary heap keyed (rank, position) over a linked list of
 * symbols, so a word of n characters costs O(n log n), not O(n^2).
 *
 * Decode: each id maps to a byte string; byte-level models concatenate the
 * bytes of all tokens and convert with the lossy UTF-8 rule of Rust's
 * String::from_utf8_lossy (one U+FFFD per maximal invalid subpart); the
 * sentencepiece chain (Replace, ByteFallback, Fuse, Strip) groups
 * consecutive <0xNN> tokens and turns an invalid group into one U+FFFD per
 * byte, as HF's ByteFallback decoder does. */
#define _GNU_SOURCE
#include "model_internal.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <errno.h>
#include <json-c/json.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#define TK_JSON_DEPTH 64
#define TK_MAX_ID (16 * 1024 * 1024)
#define TK_MAX_FILE ((size_t)1 << 30)

/* --------------------------------------------------------------- utf-8 */

/* Classify the sequence at s[0..n): 1 = valid char, *adv its length;
 * 0 = invalid, *adv = length of the maximal subpart to replace by one
 * U+FFFD; -1 = a valid but incomplete prefix running to the end. */
static int utf8_check(const uint8_t *s, size_t n, size_t *adv)
{
    uint8_t c = s[0];
    if (c < 0x80) { *adv = 1; return 1; }
    size_t need;
    uint8_t lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) need = 1;
    else if (c == 0xE0) { need = 2; lo = 0xA0; }
    else if (c >= 0xE1 && c <= 0xEC) need = 2;
    else if (c == 0xED) { need = 2; hi = 0x9F; }
    else if (c >= 0xEE && c <= 0xEF) need = 2;
    else if (c == 0xF0) { need = 3; lo = 0x90; }
    else if (c >= 0xF1 && c <= 0xF3) need = 3;
    else if (c == 0xF4) { need = 3; hi = 0x8F; }
    else { *adv = 1; return 0; }
    for (size_t k = 1; k <= need; k++) {
        if (k >= n) { *adv = n; return -1; }
        uint8_t b = s[k];
        if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) { *adv = k; return 0; }
    }
    *adv = need + 1;
    return 1;
}

/* One code point from the n >= 1 bytes at s; a truncated or malformed
 * sequence is one byte decoding to U+FFFD (never reads past s + n). */
static uint32_t utf8_decode1(const uint8_t *s, size_t n, size_t *len)
{
    size_t k;
    if (utf8_check(s, n, &k) != 1) { *len = 1; return 0xFFFD; }
    uint8_t c = s[0];
    if (c < 0x80) { *len = 1; return c; }
    if (c < 0xE0) { *len = 2; return ((uint32_t)(c & 0x1F) << 6) | (s[1] & 0x3F); }
    if (c < 0xF0) { *len = 3; return ((uint32_t)(c & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F); }
    *len = 4;
    return ((uint32_t)(c & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) | ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
}

static size_t utf8_encode1(uint32_t cp, char *o)
{
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) { o[0] = (char)(0xC0 | (cp >> 6)); o[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12)); o[1] = (char)(0x80 | ((cp >> 6) & 0x3F)); o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18)); o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* ----------------------------------------------------- growable buffer */

typedef struct { char *p; size_t n, cap; int oom; } sbuf;

static int sb_reserve(sbuf *b, size_t extra)
{
    if (b->oom) return 0;
    if (b->n + extra + 1 <= b->cap) return 1;
    size_t nc = b->cap ? b->cap : 64;
    while (nc < b->n + extra + 1) nc *= 2;
    char *np = realloc(b->p, nc);
    if (!np) { b->oom = 1; return 0; }
    b->p = np;
    b->cap = nc;
    return 1;
}

static void sb_put(sbuf *b, const void *s, size_t n)
{
    if (!sb_reserve(b, n)) return;
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static void sb_fffd(sbuf *b) { sb_put(b, "\xEF\xBF\xBD", 3); }

/* Append s with invalid UTF-8 replaced (maximal subparts). */
static void sb_put_lossy(sbuf *b, const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        size_t adv;
        int r = utf8_check(s + i, n - i, &adv);
        if (r == 1) sb_put(b, s + i, adv);
        else sb_fffd(b);
        i += adv;
    }
}

/* ------------------------------------------------------------ hash maps */

/* string -> int32 (open addressing; keys borrowed). */
typedef struct { const char *k; uint32_t klen; int32_t v; } smap_slot;
typedef struct { smap_slot *s; size_t cap, n; } smap;

static int smap_init(smap *m, size_t n)
{
    size_t cap = 16;
    while (cap < n * 2 + 16) cap *= 2;
    m->s = calloc(cap, sizeof *m->s);
    m->cap = cap;
    m->n = 0;
    return m->s != NULL;
}

static int32_t smap_get(const smap *m, const char *k, size_t klen)
{
    if (!m->cap) return -1;
    size_t i = (size_t)ft_xxh3(k, klen) & (m->cap - 1);
    for (;;) {
        const smap_slot *e = &m->s[i];
        if (!e->k) return -1;
        if (e->klen == klen && !memcmp(e->k, k, klen)) return e->v;
        i = (i + 1) & (m->cap - 1);
    }
}

/* 1 inserted, 0 duplicate (existing value kept), -1 full */
static int smap_put(smap *m, const char *k, size_t klen, int32_t v)
{
    if ((m->n + 1) * 2 > m->cap) return -1;
    size_t i = (size_t)ft_xxh3(k, klen) & (m->cap - 1);
    for (;;) {
        smap_slot *e = &m->s[i];
        if (!e->k) { e->k = k; e->klen = (uint32_t)klen; e->v = v; m->n++; return 1; }
        if (e->klen == klen && !memcmp(e->k, k, klen)) return 0;
        i = (i + 1) & (m->cap - 1);
    }
}

/* (left id, right id) -> (rank, merged id) */
typedef struct { uint64_t k; uint32_t rank; int32_t id; } pmap_slot;
typedef struct { pmap_slot *s; size_t cap; } pmap;
#define PMAP_EMPTY UINT64_MAX

static int pmap_init(pmap *m, size_t n)
{
    size_t cap = 16;
    while (cap < n * 2 + 16) cap *= 2;
    m->s = malloc(cap * sizeof *m->s);
    if (!m->s) return 0;
    for (size_t i = 0; i < cap; i++) m->s[i].k = PMAP_EMPTY;
    m->cap = cap;
    return 1;
}

static inline size_t pmap_hash(uint64_t k) { k *= 0x9E3779B97F4A7C15ull; return (size_t)(k ^ (k >> 29)); }

static const pmap_slot *pmap_get(const pmap *m, int32_t a, int32_t b)
{
    if (!m->cap) return NULL;
    uint64_t k = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    size_t i = pmap_hash(k) & (m->cap - 1);
    for (;;) {
        const pmap_slot *e = &m->s[i];
        if (e->k == PMAP_EMPTY) return NULL;
        if (e->k == k) return e;
        i = (i + 1) & (m->cap - 1);
    }
}

static void pmap_put(pmap *m, int32_t a, int32_t b, uint32_t rank, int32_t id)
{
    uint64_t k = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    size_t i = pmap_hash(k) & (m->cap - 1);
    for (;;) {
        pmap_slot *e = &m->s[i];
        if (e->k == PMAP_EMPTY) { e->k = k; e->rank = rank; e->id = id; return; }
        if (e->k == k) return;   /* first (lowest rank) wins, as in HF */
        i = (i + 1) & (m->cap - 1);
    }
}

/* ------------------------------------------------------------ structure */

enum { NORM_PREPEND, NORM_REPLACE, NORM_NFC, NORM_NFD, NORM_NFKC, NORM_NFKD };
typedef struct { int kind; char *a; size_t alen; char *b; size_t blen; } norm_op;

enum { PRE_BYTELEVEL, PRE_SPLIT, PRE_METASPACE };
enum { BEH_ISOLATED, BEH_REMOVED, BEH_MERGED_PREV, BEH_MERGED_NEXT, BEH_CONTIGUOUS };
enum { PREPEND_ALWAYS, PREPEND_FIRST, PREPEND_NEVER };
typedef struct {
    int kind;
    int add_prefix_space, use_regex;     /* ByteLevel */
    pcre2_code *re;                      /* Split / ByteLevel regex */
    int behavior, invert;                /* Split */
    char repl[8]; size_t repl_len;       /* Metaspace */
    int prepend, split;
} pre_op;

typedef struct {
    char *s; size_t len; int32_t id;
    char *m; size_t mlen;                /* what is matched: s, or s normalized (normalized: true) */
    int special, single_word, lstrip, rstrip, normalized;
} added_tok;

enum { DEC_NONE, DEC_BYTELEVEL, DEC_CHAIN };

struct ft_tokenizer {
    char *name;
    int32_t nid;                 /* max id + 1 */
    char **id_str;               /* token string per id (NULL: no token); borrowed from
                                    vstr or an added token (added content wins) */
    char **vstr;                 /* owned model-vocab strings per id (smap keys) */
    uint32_t *id_len;
    uint8_t *id_special;
    smap vocab;                  /* model vocab */
    added_tok *added;
    size_t nadded;
    uint8_t added_first[2][256];  /* [normalized][first byte]: some added token starts so */
    pmap merges;
    int byte_fallback, fuse_unk, ignore_merges;
    int32_t unk_id;
    int32_t byte_id[256];        /* <0xNN> tokens, -1 if absent */
    char bl_chars[256][3];       /* ByteLevel byte -> UTF-8 of mapped char */
    uint8_t bl_len[256];
    norm_op *norm; size_t nnorm;
    pre_op *pre; size_t npre;
    int32_t *pp_pre, *pp_post; size_t npp_pre, npp_post;
    /* decoder */
    int dec_mode;
    norm_op *dec_repl; size_t ndec_repl;   /* Replace ops, in order */
    int dec_bytefallback;
    int dec_strip_start; uint32_t dec_strip_char;
    int dec_ms; char dec_ms_repl[8]; size_t dec_ms_repl_len;   /* Metaspace decoder */
    char **dec_str; uint32_t *dec_len;     /* per id, after Replace (or ByteLevel bytes) */
    int16_t *dec_byte;                     /* ByteFallback byte value or -1 */
};

/* ----------------------------------------------------------- ByteLevel */

static void bytelevel_table(ft_tokenizer *t)
{
    int n = 0;
    for (int b = 0; b < 256; b++) {
        uint32_t cp;
        if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) cp = (uint32_t)b;
        else cp = 256 + (uint32_t)n++;
        t->bl_len[b] = (uint8_t)utf8_encode1(cp, t->bl_chars[b]);
    }
}

/* reverse: code point -> byte, -1 if not a mapped char */
static int bytelevel_rev(uint32_t cp)
{
    static int16_t rev[324];
    static int init;
    if (!__atomic_load_n(&init, __ATOMIC_ACQUIRE)) {
        int16_t tmp[324];
        for (int i = 0; i < 324; i++) tmp[i] = -1;
        int n = 0;
        for (int b = 0; b < 256; b++) {
            if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) tmp[b] = (int16_t)b;
            else tmp[256 + n++] = (int16_t)b;
        }
        memcpy(rev, tmp, sizeof rev);
        __atomic_store_n(&init, 1, __ATOMIC_RELEASE);
    }
    return cp < 324 ? rev[cp] : -1;
}

static const char GPT2_REGEX[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* ------------------------------------------------------------- freeing */

static void free_norm(norm_op *o, size_t n)
{
    for (size_t i = 0; i < n; i++) { free(o[i].a); free(o[i].b); }
    free(o);
}

void ft_tokenizer_free(ft_tokenizer *t)
{
    if (!t) return;
    if (t->vstr) for (int32_t i = 0; i < t->nid; i++) free(t->vstr[i]);
    free(t->vstr);
    if (t->dec_str) for (int32_t i = 0; i < t->nid; i++) free(t->dec_str[i]);
    free(t->id_str); free(t->id_len); free(t->id_special);
    free(t->dec_str); free(t->dec_len); free(t->dec_byte);
    free(t->vocab.s);
    for (size_t i = 0; i < t->nadded; i++) {
        if (t->added[i].m != t->added[i].s) free(t->added[i].m);
        free(t->added[i].s);
    }
    free(t->added);
    free(t->merges.s);
    free_norm(t->norm, t->nnorm);
    free_norm(t->dec_repl, t->ndec_repl);
    for (size_t i = 0; i < t->npre; i++) pcre2_code_free(t->pre[i].re);
    free(t->pre);
    free(t->pp_pre); free(t->pp_post);
    free(t->name);
    free(t);
}

/* ------------------------------------------------------------- loading */

#define FAIL(st_, ...) do { st = ft_set_error(st_, __VA_ARGS__); goto out; } while (0)

static const char *jstr(json_object *o, const char *key)
{
    json_object *v;
    if (!o || !json_object_object_get_ex(o, key, &v) || !json_object_is_type(v, json_type_string)) return NULL;
    return json_object_get_string(v);
}

static int jbool(json_object *o, const char *key, int dflt)
{
    json_object *v;
    if (!o || !json_object_object_get_ex(o, key, &v) || !v) return dflt;
    if (json_object_is_type(v, json_type_boolean)) return json_object_get_boolean(v);
    return dflt;
}

static int jnull_or_absent(json_object *o, const char *key)
{
    json_object *v;
    return !o || !json_object_object_get_ex(o, key, &v) || v == NULL;
}

/* a JSON string value as a heap copy with its length (may contain NUL) */
static char *jdup(json_object *v, size_t *len)
{
    size_t n = (size_t)json_object_get_string_len(v);
    char *s = malloc(n + 1);
    if (!s) return NULL;
    memcpy(s, json_object_get_string(v), n);
    s[n] = 0;
    *len = n;
    return s;
}

/* Every field of a component must be one the loader implements: an
 * unknown one is a warning naming it, an error with FLEXTIER_STRICT=1
 * (`flextier run --strict`, the test suite). */
static _Thread_local int tls_strict;   /* ft_tokenizer_load_dir_ex(FT_TOKENIZER_STRICT) */

static ft_status check_fields(json_object *n, const char *fn, const char *what, const char *const *keys)
{
    const char *e = getenv("FLEXTIER_STRICT");
    int strict = tls_strict || (e && *e && strcmp(e, "0"));
    json_object_object_foreach(n, k, v) {
        (void)v;
        int ok = !strcmp(k, "type");
        for (const char *const *p = keys; !ok && p && *p; p++) ok = !strcmp(*p, k);
        if (ok) continue;
        if (strict)
            return ft_set_error(FT_ERR_UNSUPPORTED, "%s: %s: field '%.64s' is not known to flextier (strict)",
                                fn, what, k);
        FT_LOG(FT_LOG_WARN, "%s: %s: field '%.64s' is not known to flextier and is ignored", fn, what, k);
    }
    return FT_OK;
}

static int valid_utf8(const char *s, size_t n)
{
    size_t i = 0, adv;
    while (i < n) {
        if (utf8_check((const uint8_t *)s + i, n - i, &adv) != 1) return 0;
        i += adv;
    }
    return 1;
}

static ft_status set_id(ft_tokenizer *t, int32_t id, const char *s, size_t len, const char *fn)
{
    /* vocab strings only: the smap keys point at them, so never freed
     * before the tokenizer (added tokens borrow their own content) */
    t->vstr[id] = malloc(len + 1);
    if (!t->vstr[id]) return ft_set_error(FT_ERR_NOMEM, "out of memory");
    memcpy(t->vstr[id], s, len);
    t->vstr[id][len] = 0;
    t->id_str[id] = t->vstr[id];
    t->id_len[id] = (uint32_t)len;
    (void)fn;
    return FT_OK;
}

static ft_status compile_regex(const char *pat, size_t len, int literal, pcre2_code **out, const char *fn,
                               const char *field)
{
    int err;
    PCRE2_SIZE off;
    uint32_t opts = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);   /* UCP is invalid with LITERAL */
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, len, opts, &err, &off, NULL);
    if (!re) {
        char msg[160];
        pcre2_get_error_message(err, (PCRE2_UCHAR *)msg, sizeof msg);
        return ft_set_error(FT_ERR_UNSUPPORTED, "%s: %s: regex does not compile at offset %zu: %s", fn, field,
                            (size_t)off, msg);
    }
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);   /* falls back to the interpreter */
    *out = re;
    return FT_OK;
}

static ft_status load_normalizer(ft_tokenizer *t, json_object *n, const char *fn, size_t *cap)
{
    if (!n) return FT_OK;
    const char *type = jstr(n, "type");
    if (!type) return ft_set_error(FT_ERR_CORRUPT, "%s: normalizer: missing 'type'", fn);
    if (!strcmp(type, "Sequence")) {
        json_object *arr;
        if (!json_object_object_get_ex(n, "normalizers", &arr) || !json_object_is_type(arr, json_type_array))
            return ft_set_error(FT_ERR_CORRUPT, "%s: normalizer Sequence: missing 'normalizers'", fn);
        for (size_t i = 0; i < json_object_array_length(arr); i++) {
            ft_status st = load_normalizer(t, json_object_array_get_idx(arr, i), fn, cap);
            if (st) return st;
        }
        return FT_OK;
    }
    if (t->nnorm == *cap) {
        *cap = *cap ? *cap * 2 : 4;
        norm_op *nn = realloc(t->norm, *cap * sizeof *nn);
        if (!nn) return ft_set_error(FT_ERR_NOMEM, "out of memory");
        t->norm = nn;
    }
    norm_op *o = &t->norm[t->nnorm++];   /* counted now: freed on any error below */
    memset(o, 0, sizeof *o);
    if (!strcmp(type, "Prepend")) {
        json_object *v;
        if (!json_object_object_get_ex(n, "prepend", &v) || !json_object_is_type(v, json_type_string))
            return ft_set_error(FT_ERR_CORRUPT, "%s: normalizer Prepend: missing 'prepend'", fn);
        o->kind = NORM_PREPEND;
        if (!(o->a = jdup(v, &o->alen))) return ft_set_error(FT_ERR_NOMEM, "out of memory");
        static const char *const k[] = {"prepend", NULL};
        ft_status st = check_fields(n, fn, "normalizer Prepend", k);
        if (st) return st;
    } else if (!strcmp(type, "Replace")) {
        json_object *p, *c, *ps;
        if (!json_object_object_get_ex(n, "pattern", &p) || !json_object_object_get_ex(n, "content", &c) ||
            !json_object_is_type(c, json_type_string))
            return ft_set_error(FT_ERR_CORRUPT, "%s: normalizer Replace: missing 'pattern' or 'content'", fn);
        if (!json_object_object_get_ex(p, "String", &ps) || !json_object_is_type(ps, json_type_string) ||
            !json_object_get_string_len(ps))
            return ft_set_error(FT_ERR_UNSUPPORTED, "%s: normalizer Replace: only non-empty String patterns are supported", fn);
        o->kind = NORM_REPLACE;
        if (!(o->a = jdup(ps, &o->alen)) || !(o->b = jdup(c, &o->blen)))
            return ft_set_error(FT_ERR_NOMEM, "out of memory");
        static const char *const k[] = {"pattern", "content", NULL};
        ft_status st = check_fields(n, fn, "normalizer Replace", k);
        if (st) return st;
    } else if (!strcmp(type, "NFC") || !strcmp(type, "NFD") || !strcmp(type, "NFKC") || !strcmp(type, "NFKD")) {
        /* Unicode normalization forms by libutf8proc, as HF's unicode-normalization */
        o->kind = !strcmp(type, "NFC") ? NORM_NFC : !strcmp(type, "NFD") ? NORM_NFD
                  : !strcmp(type, "NFKC") ? NORM_NFKC : NORM_NFKD;
        ft_status st = check_fields(n, fn, "normalizer", NULL);
        if (st) return st;
    } else {
        return ft_set_error(FT_ERR_UNSUPPORTED, "%s: normalizer type %s is not supported", fn, type);
    }
    return FT_OK;
}

/* SplitDelimiterBehavior by name, -1 if unknown */
static int behavior_of(const char *b)
{
    if (!strcmp(b, "Isolated")) return BEH_ISOLATED;
    if (!strcmp(b, "Removed")) return BEH_REMOVED;
    if (!strcmp(b, "MergedWithPrevious")) return BEH_MERGED_PREV;
    if (!strcmp(b, "MergedWithNext")) return BEH_MERGED_NEXT;
    if (!strcmp(b, "Contiguous")) return BEH_CONTIGUOUS;
    return -1;
}

static ft_status add_pre(ft_tokenizer *t, size_t *cap, pre_op **o)
{
    if (t->npre == *cap) {
        *cap = *cap ? *cap * 2 : 4;
        pre_op *np = realloc(t->pre, *cap * sizeof *np);
        if (!np) return ft_set_error(FT_ERR_NOMEM, "out of memory");
        t->pre = np;
    }
    *o = &t->pre[t->npre++];
    memset(*o, 0, sizeof **o);
    return FT_OK;
}

static ft_status load_pretok(ft_tokenizer *t, json_object *n, const char *fn, size_t *cap)
{
    if (!n) return FT_OK;
    const char *type = jstr(n, "type");
    ft_status st;
    pre_op *o;
    if (!type) return ft_set_error(FT_ERR_CORRUPT, "%s: pre_tokenizer: missing 'type'", fn);
    if (!strcmp(type, "Sequence")) {
        json_object *arr;
        if (!json_object_object_get_ex(n, "pretokenizers", &arr) || !json_object_is_type(arr, json_type_array))
            return ft_set_error(FT_ERR_CORRUPT, "%s: pre_tokenizer Sequence: missing 'pretokenizers'", fn);
        for (size_t i = 0; i < json_object_array_length(arr); i++)
            if ((st = load_pretok(t, json_object_array_get_idx(arr, i), fn, cap))) return st;
        return FT_OK;
    }
    if (!strcmp(type, "ByteLevel")) {
        static const char *const k[] = {"add_prefix_space", "trim_offsets", "use_regex", NULL};
        if ((st = check_fields(n, fn, "pre_tokenizer ByteLevel", k))) return st;
        if ((st = add_pre(t, cap, &o))) return st;
        o->kind = PRE_BYTELEVEL;
        o->add_prefix_space = jbool(n, "add_prefix_space", 1);
        o->use_regex = jbool(n, "use_regex", 1);
        if (o->use_regex)
            return compile_regex(GPT2_REGEX, sizeof GPT2_REGEX - 1, 0, &o->re, fn, "pre_tokenizer ByteLevel");
        return FT_OK;
    }
    if (!strcmp(type, "Split")) {
        json_object *p, *v;
        const char *beh = jstr(n, "behavior");
        if (!json_object_object_get_ex(n, "pattern", &p) || !json_object_is_type(p, json_type_object) || !beh)
            return ft_set_error(FT_ERR_CORRUPT, "%s: pre_tokenizer Split: missing 'pattern' or 'behavior'", fn);
        int literal;
        if (json_object_object_get_ex(p, "Regex", &v) && json_object_is_type(v, json_type_string)) literal = 0;
        else if (json_object_object_get_ex(p, "String", &v) && json_object_is_type(v, json_type_string)) literal = 1;
        else return ft_set_error(FT_ERR_CORRUPT, "%s: pre_tokenizer Split: pattern is neither Regex nor String", fn);
        int b = behavior_of(beh);
        if (b < 0) return ft_set_error(FT_ERR_UNSUPPORTED, "%s: pre_tokenizer Split: behavior %s is not supported", fn, beh);
        static const char *const k[] = {"pattern", "behavior", "invert", NULL};
        if ((st = check_fields(n, fn, "pre_tokenizer Split", k))) return st;
        if (!json_object_get_string_len(v))
            return ft_set_error(FT_ERR_UNSUPPORTED, "%s: pre_tokenizer Split: empty pattern", fn);
        if ((st = add_pre(t, cap, &o))) return st;
        o->kind = PRE_SPLIT;
        o->behavior = b;
        o->invert = jbool(n, "invert", 0);
        return compile_regex(json_object_get_string(v), (size_t)json_object_get_string_len(v), literal, &o->re, fn,
                             "pre_tokenizer Split pattern");
    }
    if (!strcmp(type, "Metaspace")) {
        const char *r = jstr(n, "replacement");
        const char *ps = jstr(n, "prepend_scheme");
        if (!r || !*r || strlen(r) > 4 || !valid_utf8(r, strlen(r)))
            return ft_set_error(FT_ERR_CORRUPT, "%s: pre_tokenizer Metaspace: bad 'replacement'", fn);
        static const char *const k[] = {"replacement", "prepend_scheme", "split", "add_prefix_space", "str_rep", NULL};
        if ((st = check_fields(n, fn, "pre_tokenizer Metaspace", k))) return st;
        if ((st = add_pre(t, cap, &o))) return st;
        o->kind = PRE_METASPACE;
        o->repl_len = strlen(r);
        memcpy(o->repl, r, o->repl_len);
        if (ps) {
            if (!strcmp(ps, "always")) o->prepend = PREPEND_ALWAYS;
            else if (!strcmp(ps, "first")) o->prepend = PREPEND_FIRST;
            else if (!strcmp(ps, "never")) o->prepend = PREPEND_NEVER;
            else return ft_set_error(FT_ERR_UNSUPPORTED, "%s: pre_tokenizer Metaspace: prepend_scheme %s", fn, ps);
        } else {
            o->prepend = jbool(n, "add_prefix_space", 1) ? PREPEND_ALWAYS : PREPEND_NEVER;
        }
        o->split = jbool(n, "split", 1);
        return FT_OK;
    }
    if (!strcmp(type, "Digits")) {
        /* HF: split on char::is_numeric (\p{N}), each digit alone or runs of them */
        static const char *const k[] = {"individual_digits", NULL};
        if ((st = check_fields(n, fn, "pre_tokenizer Digits", k))) return st;
        int ind = jbool(n, "individual_digits", 0);
        if ((st = add_pre(t, cap, &o))) return st;
        o->kind = PRE_SPLIT;
        o->behavior = ind ? BEH_ISOLATED : BEH_CONTIGUOUS;
        return compile_regex("\\p{N}", 5, 0, &o->re, fn, "pre_tokenizer Digits");
    }
    if (!strcmp(type, "Punctuation")) {
        /* HF: char::is_ascii_punctuation or a Unicode P* category */
        static const char *const k[] = {"behavior", NULL};
        if ((st = check_fields(n, fn, "pre_tokenizer Punctuation", k))) return st;
        const char *beh = jstr(n, "behavior");
        int b = beh ? behavior_of(beh) : BEH_ISOLATED;
        if (b < 0)
            return ft_set_error(FT_ERR_UNSUPPORTED, "%s: pre_tokenizer Punctuation: behavior %s is not supported", fn, beh);
        if ((st = add_pre(t, cap, &o))) return st;
        o->kind = PRE_SPLIT;
        o->behavior = b;
        static const char PUNCT[] = "[\\p{P}\\x{21}-\\x{2F}\\x{3A}-\\x{40}\\x{5B}-\\x{60}\\x{7B}-\\x{7E}]";
        return compile_regex(PUNCT, sizeof PUNCT - 1, 0, &o->re, fn, "pre_tokenizer Punctuation");
    }
    return ft_set_error(FT_ERR_UNSUPPORTED, "%s: pre_tokenizer type %s is not supported", fn, type);
}

/* id of a special token named in a post-processor ("</s>" or ["</s>", 2]) */
static int32_t pp_token_id(const ft_tokenizer *t, json_object *v)
{
    if (json_object_is_type(v, json_type_array) && json_object_array_length(v) == 2) {
        json_object *id = json_object_array_get_idx(v, 1);
        if (!json_object_is_type(id, json_type_int)) return -1;
        int64_t x = json_object_get_int64(id);
        return x >= 0 && x < t->nid ? (int32_t)x : -1;
    }
    return -1;
}

static ft_status pp_push(int32_t **arr, size_t *n, int32_t id)
{
    int32_t *na = realloc(*arr, (*n + 1) * sizeof *na);
    if (!na) return ft_set_error(FT_ERR_NOMEM, "out of memory");
    na[(*n)++] = id;
    *arr = na;
    return FT_OK;
}

static ft_status load_postproc(ft_tokenizer *t, json_object *n, const char *fn, int *have)
{
    if (!n) return FT_OK;
    const char *type = jstr(n, "type");
    ft_status st;
    if (!type) return ft_set_error(FT_ERR_CORRUPT, "%s: post_processor: missing 'type'", fn);
    if (!strcmp(type, "Sequence")) {
        json_object *arr;
        if (!json_object_object_get_ex(n, "processors", &arr) || !json_object_is_type(arr, json_type_array))
            return ft_set_error(FT_ERR_CORRUPT, "%s: post_processor Sequence: missing 'processors'", fn);
        for (size_t i = 0; i < json_object_array_length(arr); i++)
            if ((st = load_postproc(t, json_object_array_get_idx(arr, i), fn, have))) return st;
        return FT_OK;
    }
    if (!strcmp(type, "ByteLevel")) {   /* offsets only */
        static const char *const k[] = {"add_prefix_space", "trim_offsets", "use_regex", NULL};
        return check_fields(n, fn, "post_processor ByteLevel", k);
    }
    if (*have) return ft_set_error(FT_ERR_UNSUPPORTED, "%s: post_processor: more than one template", fn);
    if (!strcmp(type, "RobertaProcessing") || !strcmp(type, "BertProcessing")) {
        static const char *const rk[] = {"sep", "cls", "trim_offsets", "add_prefix_space", NULL};
        if ((st = check_fields(n, fn, "post_processor", rk))) return st;
        json_object *cls, *sep;
        int32_t c = -1, s = -1;
        if (json_object_object_get_ex(n, "cls", &cls)) c = pp_token_id(t, cls);
        if (json_object_object_get_ex(n, "sep", &sep)) s = pp_token_id(t, sep);
        if (c < 0 || s < 0) return ft_set_error(FT_ERR_CORRUPT, "%s: post_processor %s: bad 'cls' or 'sep'", fn, type);
        if ((st = pp_push(&t->pp_pre, &t->npp_pre, c)) || (st = pp_push(&t->pp_post, &t->npp_post, s))) return st;
        *have = 1;
        return FT_OK;
    }
    if (!strcmp(type, "TemplateProcessing")) {
        static const char *const tk[] = {"single", "pair", "special_tokens", NULL};
        if ((st = check_fields(n, fn, "post_processor TemplateProcessing", tk))) return st;
        json_object *single, *specials;
        if (!json_object_object_get_ex(n, "single", &single) || !json_object_is_type(single, json_type_array) ||
            !json_object_object_get_ex(n, "special_tokens", &specials) || !json_object_is_type(specials, json_type_object))
            return ft_set_error(FT_ERR_CORRUPT, "%s: post_processor TemplateProcessing: missing 'single' or 'special_tokens'", fn);
        int seen_a = 0;
        for (size_t i = 0; i < json_object_array_length(single); i++) {
            json_object *it = json_object_array_get_idx(single, i), *sp, *sq;
            if (json_object_object_get_ex(it, "Sequence", &sq)) {
                if (seen_a) return ft_set_error(FT_ERR_UNSUPPORTED, "%s: post_processor: $A twice in 'single'", fn);
                seen_a = 1;
            } else if (json_object_object_get_ex(it, "SpecialToken", &sp)) {
                const char *name = jstr(sp, "id");
                json_object *ent, *ids;
                if (!name || !json_object_object_get_ex(specials, name, &ent) ||
                    !json_object_object_get_ex(ent, "ids", &ids) || !json_object_is_type(ids, json_type_array))
                    return ft_set_error(FT_ERR_CORRUPT, "%s: post_processor: special token '%s' not in special_tokens", fn,
                                        name ? name : "?");
                for (size_t k = 0; k < json_object_array_length(ids); k++) {
                    json_object *x = json_object_array_get_idx(ids, k);
                    int64_t v = json_object_is_type(x, json_type_int) ? json_object_get_int64(x) : -1;
                    if (v < 0 || v >= t->nid)
                        return ft_set_error(FT_ERR_CORRUPT, "%s: post_processor: special token '%s' has a bad id", fn, name);
                    if ((st = pp_push(seen_a ? &t->pp_post : &t->pp_pre, seen_a ? &t->npp_post : &t->npp_pre, (int32_t)v)))
                        return st;
                }
            } else {
                return ft_set_error(FT_ERR_CORRUPT, "%s: post_processor: bad template item %zu", fn, i);
            }
        }
        if (!seen_a) return ft_set_error(FT_ERR_CORRUPT, "%s: post_processor: 'single' lacks $A", fn);
        *have = 1;
        return FT_OK;
    }
    return ft_set_error(FT_ERR_UNSUPPORTED, "%s: post_processor type %s is not supported", fn, type);
}

static ft_status load_decoder(ft_tokenizer *t, json_object *n, const char *fn, size_t *cap)
{
    if (!n) return FT_OK;
    const char *type = jstr(n, "type");
    ft_status st;
    if (!type) return ft_set_error(FT_ERR_CORRUPT, "%s: decoder: missing 'type'", fn);
    if (!strcmp(type, "Sequence")) {
        json_object *arr;
        if (!json_object_object_get_ex(n, "decoders", &arr) || !json_object_is_type(arr, json_type_array))
            return ft_set_error(FT_ERR_CORRUPT, "%s: decoder Sequence: missing 'decoders'", fn);
        for (size_t i = 0; i < json_object_array_length(arr); i++)
            if ((st = load_decoder(t, json_object_array_get_idx(arr, i), fn, cap))) return st;
        return FT_OK;
    }
    if (!strcmp(type, "ByteLevel")) {
        static const char *const k[] = {"add_prefix_space", "trim_offsets", "use_regex", NULL};
        if ((st = check_fields(n, fn, "decoder ByteLevel", k))) return st;
        if (t->dec_mode == DEC_CHAIN)
            return ft_set_error(FT_ERR_UNSUPPORTED, "%s: decoder ByteLevel combined with other decoders", fn);
        t->dec_mode = DEC_BYTELEVEL;
        return FT_OK;
    }
    if (t->dec_mode == DEC_BYTELEVEL)
        return ft_set_error(FT_ERR_UNSUPPORTED, "%s: decoder %s combined with ByteLevel", fn, type);
    t->dec_mode = DEC_CHAIN;
    if (!strcmp(type, "Fuse")) return check_fields(n, fn, "decoder Fuse", NULL);   /* all chains end fused */
    if (!strcmp(type, "ByteFallback")) { t->dec_bytefallback = 1; return check_fields(n, fn, "decoder ByteFallback", NULL); }
    if (!strcmp(type, "Strip")) {
        static const char *const k[] = {"content", "start", "stop", NULL};
        if ((st = check_fields(n, fn, "decoder Strip", k))) return st;
        const char *c = jstr(n, "content");
        json_object *s, *e;
        if (!c || !json_object_object_get_ex(n, "start", &s) || !json_object_object_get_ex(n, "stop", &e))
            return ft_set_error(FT_ERR_CORRUPT, "%s: decoder Strip: missing fields", fn);
        size_t cl;
        if (!*c || !valid_utf8(c, strlen(c)) || (utf8_decode1((const uint8_t *)c, strlen(c), &cl), cl != strlen(c)))
            return ft_set_error(FT_ERR_CORRUPT, "%s: decoder Strip: content must be one character", fn);
        if (json_object_get_int64(e) != 0)
            return ft_set_error(FT_ERR_UNSUPPORTED, "%s: decoder Strip: stop > 0 is not supported", fn);
        int64_t sv = json_object_get_int64(s);
        if (sv < 0 || sv > 1000) return ft_set_error(FT_ERR_CORRUPT, "%s: decoder Strip: bad start", fn);
        t->dec_strip_start = (int)sv;
        t->dec_strip_char = utf8_decode1((const uint8_t *)c, strlen(c), &cl);
        return FT_OK;
    }
    if (!strcmp(type, "Replace") || !strcmp(type, "Metaspace")) {
        static const char *const kr[] = {"pattern", "content", NULL};
        static const char *const km[] = {"replacement", "prepend_scheme", "split", "add_prefix_space", "str_rep", NULL};
        if ((st = check_fields(n, fn, !strcmp(type, "Replace") ? "decoder Replace" : "decoder Metaspace",
                               !strcmp(type, "Replace") ? kr : km)))
            return st;
        if (t->ndec_repl == *cap) {
            *cap = *cap ? *cap * 2 : 4;
            norm_op *nn = realloc(t->dec_repl, *cap * sizeof *nn);
            if (!nn) return ft_set_error(FT_ERR_NOMEM, "out of memory");
            t->dec_repl = nn;
        }
        norm_op *o = &t->dec_repl[t->ndec_repl];
        memset(o, 0, sizeof *o);
        if (!strcmp(type, "Replace")) {
            json_object *p, *c, *ps;
            if (!json_object_object_get_ex(n, "pattern", &p) || !json_object_object_get_ex(n, "content", &c) ||
                !json_object_is_type(c, json_type_string))
                return ft_set_error(FT_ERR_CORRUPT, "%s: decoder Replace: missing 'pattern' or 'content'", fn);
            if (!json_object_object_get_ex(p, "String", &ps) || !json_object_is_type(ps, json_type_string) ||
                !json_object_get_string_len(ps))
                return ft_set_error(FT_ERR_UNSUPPORTED, "%s: decoder Replace: only String patterns are supported", fn);
            if (!(o->a = jdup(ps, &o->alen)) || !(o->b = jdup(c, &o->blen)))
                return ft_set_error(FT_ERR_NOMEM, "out of memory");
            o->kind = NORM_REPLACE;
            t->ndec_repl++;
            return FT_OK;
        }
        const char *r = jstr(n, "replacement"), *ps = jstr(n, "prepend_scheme");
        if (!r || !*r || strlen(r) > 4)
            return ft_set_error(FT_ERR_CORRUPT, "%s: decoder Metaspace: bad 'replacement'", fn);
        t->dec_ms = ps ? strcmp(ps, "never") != 0 : jbool(n, "add_prefix_space", 1);
        t->dec_ms += 1;   /* 1: replace only, 2: also drop in the first token */
        t->dec_ms_repl_len = strlen(r);
        memcpy(t->dec_ms_repl, r, t->dec_ms_repl_len);
        return FT_OK;
    }
    return ft_set_error(FT_ERR_UNSUPPORTED, "%s: decoder type %s is not supported", fn, type);
}

/* Replace all non-overlapping occurrences of a with b. */
static void replace_all(sbuf *o, const char *s, size_t n, const char *a, size_t alen, const char *b, size_t blen)
{
    size_t i = 0;
    while (i < n) {
        const char *p = alen <= n - i ? memmem(s + i, n - i, a, alen) : NULL;
        if (!p) { sb_put(o, s + i, n - i); break; }
        sb_put(o, s + i, (size_t)(p - (s + i)));
        sb_put(o, b, blen);
        i = (size_t)(p - s) + alen;
    }
}

static ft_status build_decoder_tables(ft_tokenizer *t)
{
    t->dec_str = calloc((size_t)t->nid, sizeof *t->dec_str);
    t->dec_len = calloc((size_t)t->nid, sizeof *t->dec_len);
    t->dec_byte = malloc((size_t)t->nid * sizeof *t->dec_byte);
    if (!t->dec_str || !t->dec_len || !t->dec_byte) return ft_set_error(FT_ERR_NOMEM, "out of memory");
    sbuf a = {0}, b = {0};
    for (int32_t id = 0; id < t->nid; id++) {
        t->dec_byte[id] = -1;
        const char *s = t->id_str[id];
        if (!s) continue;
        size_t n = t->id_len[id];
        a.n = 0;
        if (t->dec_mode == DEC_BYTELEVEL) {
            /* every char mapped -> bytes; else the token's own UTF-8 */
            size_t i = 0;
            int ok = 1;
            while (i < n) {
                size_t l;
                uint32_t cp = utf8_decode1((const uint8_t *)s + i, n - i, &l);
                int by = bytelevel_rev(cp);
                if (by < 0) { ok = 0; break; }
                uint8_t c = (uint8_t)by;
                sb_put(&a, &c, 1);
                i += l;
            }
            if (!ok) { a.n = 0; sb_put(&a, s, n); }
        } else {
            sb_put(&a, s, n);
            for (size_t k = 0; k < t->ndec_repl; k++) {
                b.n = 0;
                replace_all(&b, a.p ? a.p : "", a.n, t->dec_repl[k].a, t->dec_repl[k].alen, t->dec_repl[k].b,
                            t->dec_repl[k].blen);
                sbuf tmp = a; a = b; b = tmp;
            }
            if (t->dec_bytefallback && a.n == 6 && !memcmp(a.p, "<0x", 3) && a.p[5] == '>') {
                unsigned v;
                char hex[3] = {a.p[3], a.p[4], 0};
                char *end;
                v = (unsigned)strtoul(hex, &end, 16);
                if (end == hex + 2 && (hex[0] < 'a' || hex[0] > 'f') && (hex[1] < 'a' || hex[1] > 'f'))
                    t->dec_byte[id] = (int16_t)v;
            }
        }
        if (a.oom || b.oom) { free(a.p); free(b.p); return ft_set_error(FT_ERR_NOMEM, "out of memory"); }
        t->dec_str[id] = malloc(a.n + 1);
        if (!t->dec_str[id]) { free(a.p); free(b.p); return ft_set_error(FT_ERR_NOMEM, "out of memory"); }
        if (a.n) memcpy(t->dec_str[id], a.p, a.n);
        t->dec_str[id][a.n] = 0;
        t->dec_len[id] = (uint32_t)a.n;
    }
    free(a.p);
    free(b.p);
    return FT_OK;
}

static ft_status get_id(json_object *v, int64_t *out)
{
    if (!v || !json_object_is_type(v, json_type_int)) return FT_ERR_CORRUPT;
    int64_t x = json_object_get_int64(v);
    if (x < 0 || x >= TK_MAX_ID) return FT_ERR_CORRUPT;
    *out = x;
    return FT_OK;
}

static ft_status load_model(ft_tokenizer *t, json_object *model, json_object *added, const char *fn)
{
    ft_status st = FT_OK;
    json_object *vocab, *merges;
    const char *type = jstr(model, "type");
    if (type && strcmp(type, "BPE"))
        return ft_set_error(FT_ERR_UNSUPPORTED, "%s: model type %s is not supported (only BPE)", fn, type);
    if (!json_object_object_get_ex(model, "vocab", &vocab) || !json_object_is_type(vocab, json_type_object))
        return ft_set_error(FT_ERR_CORRUPT, "%s: model.vocab missing or not an object", fn);
    if (!json_object_object_get_ex(model, "merges", &merges) || !json_object_is_type(merges, json_type_array))
        return ft_set_error(FT_ERR_CORRUPT, "%s: model.merges missing or not an array", fn);
    if (!jnull_or_absent(model, "continuing_subword_prefix") || !jnull_or_absent(model, "end_of_word_suffix")) {
        const char *a = jstr(model, "continuing_subword_prefix"), *b = jstr(model, "end_of_word_suffix");
        if ((a && *a) || (b && *b))
            return ft_set_error(FT_ERR_UNSUPPORTED, "%s: model: continuing_subword_prefix / end_of_word_suffix not supported", fn);
    }
    json_object *dr;
    if (json_object_object_get_ex(model, "dropout", &dr) && dr &&
        (json_object_is_type(dr, json_type_double) || json_object_is_type(dr, json_type_int)) &&
        json_object_get_double(dr) > 0)
        return ft_set_error(FT_ERR_UNSUPPORTED, "%s: model: BPE dropout is not supported", fn);
    static const char *const mk[] = {"dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix",
                                     "fuse_unk", "byte_fallback", "ignore_merges", "vocab", "merges", NULL};
    if ((st = check_fields(model, fn, "model", mk))) return st;
    t->byte_fallback = jbool(model, "byte_fallback", 0);
    t->fuse_unk = jbool(model, "fuse_unk", 0);
    t->ignore_merges = jbool(model, "ignore_merges", 0);

    /* id range */
    int64_t maxid = -1;
    json_object_object_foreach(vocab, k0, v0) {
        int64_t id = 0;
        if (get_id(v0, &id)) return ft_set_error(FT_ERR_CORRUPT, "%s: model.vocab['%s']: bad id", fn, k0);
        if (id > maxid) maxid = id;
    }
    size_t nadd = added ? json_object_array_length(added) : 0;
    for (size_t i = 0; i < nadd; i++) {
        json_object *a = json_object_array_get_idx(added, i), *idv;
        int64_t id = 0;
        if (!json_object_is_type(a, json_type_object) || !json_object_object_get_ex(a, "id", &idv) || get_id(idv, &id))
            return ft_set_error(FT_ERR_CORRUPT, "%s: added_tokens[%zu]: bad id", fn, i);
        if (id > maxid) maxid = id;
    }
    t->nid = (int32_t)(maxid + 1);
    size_t nid = (size_t)t->nid ? (size_t)t->nid : 1;
    t->id_str = calloc(nid, sizeof *t->id_str);
    t->vstr = calloc(nid, sizeof *t->vstr);
    t->id_len = calloc(nid, sizeof *t->id_len);
    t->id_special = calloc(nid, 1);
    if (!t->id_str || !t->vstr || !t->id_len || !t->id_special || !smap_init(&t->vocab, (size_t)json_object_object_length(vocab)))
        return ft_set_error(FT_ERR_NOMEM, "out of memory");
    json_object_object_foreach(vocab, k, v) {
        int64_t id = 0;
        get_id(v, &id);
        size_t kl = strlen(k);   /* json-c keys are C strings */
        if (t->id_str[id])
            return ft_set_error(FT_ERR_CORRUPT, "%s: model.vocab: id %lld used twice ('%s')", fn, (long long)id, k);
        if ((st = set_id(t, (int32_t)id, k, kl, fn))) return st;
        if (smap_put(&t->vocab, t->id_str[id], kl, (int32_t)id) != 1)
            return ft_set_error(FT_ERR_CORRUPT, "%s: model.vocab: duplicate token '%s'", fn, k);
    }
    /* unk / byte fallback */
    t->unk_id = -1;
    const char *unk = jstr(model, "unk_token");
    if (unk) {
        t->unk_id = smap_get(&t->vocab, unk, strlen(unk));
        if (t->unk_id < 0) return ft_set_error(FT_ERR_CORRUPT, "%s: model.unk_token '%s' not in vocab", fn, unk);
    }
    for (int b = 0; b < 256; b++) {
        char nm[8];
        snprintf(nm, sizeof nm, "<0x%02X>", b);
        t->byte_id[b] = smap_get(&t->vocab, nm, 6);
    }
    /* merges */
    size_t nm = json_object_array_length(merges);
    if (!pmap_init(&t->merges, nm)) return ft_set_error(FT_ERR_NOMEM, "out of memory");
    sbuf cat = {0};
    for (size_t r = 0; r < nm; r++) {
        json_object *m = json_object_array_get_idx(merges, r);
        const char *a, *b;
        size_t al, bl;
        if (json_object_is_type(m, json_type_string)) {
            a = json_object_get_string(m);
            const char *sp = strchr(a, ' ');
            if (!sp || strchr(sp + 1, ' ')) { free(cat.p); return ft_set_error(FT_ERR_CORRUPT, "%s: model.merges[%zu]: not 'a b'", fn, r); }
            al = (size_t)(sp - a);
            b = sp + 1;
            bl = strlen(b);
        } else if (json_object_is_type(m, json_type_array) && json_object_array_length(m) == 2 &&
                   json_object_is_type(json_object_array_get_idx(m, 0), json_type_string) &&
                   json_object_is_type(json_object_array_get_idx(m, 1), json_type_string)) {
            a = json_object_get_string(json_object_array_get_idx(m, 0));
            al = (size_t)json_object_get_string_len(json_object_array_get_idx(m, 0));
            b = json_object_get_string(json_object_array_get_idx(m, 1));
            bl = (size_t)json_object_get_string_len(json_object_array_get_idx(m, 1));
        } else {
            free(cat.p);
            return ft_set_error(FT_ERR_CORRUPT, "%s: model.merges[%zu]: not a pair", fn, r);
        }
        int32_t ia = smap_get(&t->vocab, a, al), ib = smap_get(&t->vocab, b, bl);
        cat.n = 0;
        sb_put(&cat, a, al);
        sb_put(&cat, b, bl);
        if (cat.oom) { free(cat.p); return ft_set_error(FT_ERR_NOMEM, "out of memory"); }
        int32_t ic = smap_get(&t->vocab, cat.p, cat.n);
        if (ia < 0 || ib < 0 || ic < 0) {
            free(cat.p);
            return ft_set_error(FT_ERR_CORRUPT, "%s: model.merges[%zu]: token not in vocab", fn, r);
        }
        pmap_put(&t->merges, ia, ib, (uint32_t)r, ic);
    }
    free(cat.p);
    /* added tokens */
    if (nadd) {
        t->added = calloc(nadd, sizeof *t->added);
        if (!t->added) return ft_set_error(FT_ERR_NOMEM, "out of memory");
    }
    for (size_t i = 0; i < nadd; i++) {
        json_object *a = json_object_array_get_idx(added, i), *cv, *idv;
        int64_t id = 0;
        json_object_object_get_ex(a, "id", &idv);
        get_id(idv, &id);
        if (!json_object_object_get_ex(a, "content", &cv) || !json_object_is_type(cv, json_type_string) ||
            !json_object_get_string_len(cv))
            return ft_set_error(FT_ERR_CORRUPT, "%s: added_tokens[%zu]: missing 'content'", fn, i);
        added_tok *at = &t->added[t->nadded];
        if (!(at->s = jdup(cv, &at->len))) return ft_set_error(FT_ERR_NOMEM, "out of memory");
        t->nadded++;
        if (!valid_utf8(at->s, at->len))
            return ft_set_error(FT_ERR_CORRUPT, "%s: added_tokens[%zu]: content is not UTF-8", fn, i);
        at->id = (int32_t)id;
        at->special = jbool(a, "special", 0);
        at->single_word = jbool(a, "single_word", 0);
        at->lstrip = jbool(a, "lstrip", 0);
        at->rstrip = jbool(a, "rstrip", 0);
        at->normalized = jbool(a, "normalized", !at->special);
        t->id_str[id] = at->s;
        t->id_len[id] = (uint32_t)at->len;
        t->id_special[id] = (uint8_t)at->special;
        at->m = at->s;
        at->mlen = at->len;
    }
    return FT_OK;
}

static void normalize(const ft_tokenizer *t, const char *s, size_t n, sbuf *o, sbuf *tmp);

/* HF matches added tokens with normalized: true against the normalized
 * text, with their content normalized by the same normalizer
 * (AddedVocabulary::refresh_added_tokens); the others against the raw
 * text as they are. Runs before the decoder tables are built. */
static ft_status added_match_strings(ft_tokenizer *t)
{
    sbuf o = {0}, tmp = {0};
    ft_status st = FT_OK;
    for (size_t i = 0; i < t->nadded && !st; i++) {
        added_tok *a = &t->added[i];
        if (a->normalized && t->nnorm) {
            normalize(t, a->s, a->len, &o, &tmp);
            if (o.oom || tmp.oom || !(a->m = malloc(o.n + 1))) {
                a->m = a->s;
                st = ft_set_error(FT_ERR_NOMEM, "out of memory");
                break;
            }
            memcpy(a->m, o.p ? o.p : "", o.n);
            a->m[o.n] = 0;
            a->mlen = o.n;
            /* tokenizers >= 0.21 also decode such a token as its normalized
             * content, and skip_special_tokens then no longer recognizes it
             * as special unless normalization left it unchanged */
            t->id_str[a->id] = a->m;
            t->id_len[a->id] = (uint32_t)a->mlen;
            if (a->mlen != a->len || memcmp(a->m, a->s, a->len)) t->id_special[a->id] = 0;
        }
        if (a->mlen) t->added_first[a->normalized ? 1 : 0][(uint8_t)a->m[0]] = 1;
    }
    free(o.p);
    free(tmp.p);
    return st;
}

ft_status ft_tokenizer_load_memory(const char *json, size_t len, const char *name, ft_tokenizer **out)
{
    if (!json || !out) return ft_set_error(FT_ERR_INVALID_ARG, "ft_tokenizer_load_memory: NULL argument");
    const char *fn = name ? name : "<memory>";
    ft_status st = FT_OK;
    json_tokener *tok = NULL;
    json_object *root = NULL;
    ft_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return ft_set_error(FT_ERR_NOMEM, "out of memory");
    if (!(t->name = strdup(fn))) FAIL(FT_ERR_NOMEM, "out of memory");
    if (len > INT32_MAX) FAIL(FT_ERR_CORRUPT, "%s: too large", fn);
    if (memchr(json, 0, len)) FAIL(FT_ERR_CORRUPT, "%s: contains a NUL byte", fn);
    /* JSON is UTF-8 (RFC 8259) and Hugging Face tokenizers refuses other
     * bytes: a vocab or decoder string with invalid UTF-8 would put it
     * into decoded text. */
    for (size_t i = 0, adv = 0; i < len; i += adv)
        if (utf8_check((const uint8_t *)json + i, len - i, &adv) != 1)
            FAIL(FT_ERR_CORRUPT, "%s: invalid UTF-8 at byte %zu", fn, i);
    if (!(tok = json_tokener_new_ex(TK_JSON_DEPTH))) FAIL(FT_ERR_NOMEM, "out of memory");
    json_tokener_set_flags(tok, JSON_TOKENER_STRICT | JSON_TOKENER_VALIDATE_UTF8);
    root = json_tokener_parse_ex(tok, json, (int)len);
    if (json_tokener_get_error(tok) == json_tokener_continue) FAIL(FT_ERR_CORRUPT, "%s: JSON is incomplete", fn);
    if (!root || json_tokener_get_error(tok) != json_tokener_success)
        FAIL(FT_ERR_CORRUPT, "%s: bad JSON: %s at byte %zu", fn, json_tokener_error_desc(json_tokener_get_error(tok)),
             json_tokener_get_parse_end(tok));
    if (!json_object_is_type(root, json_type_object)) FAIL(FT_ERR_CORRUPT, "%s: not a JSON object", fn);
    json_object *model, *added = NULL, *x;
    if (!json_object_object_get_ex(root, "model", &model) || !json_object_is_type(model, json_type_object))
        FAIL(FT_ERR_CORRUPT, "%s: missing 'model' object", fn);
    if (json_object_object_get_ex(root, "added_tokens", &added) && added &&
        !json_object_is_type(added, json_type_array))
        FAIL(FT_ERR_CORRUPT, "%s: 'added_tokens' is not an array", fn);
    static const char *const top[] = {"version", "truncation", "padding", "added_tokens", "normalizer",
                                      "pre_tokenizer", "model", "post_processor", "decoder", NULL};
    if ((st = check_fields(root, fn, "tokenizer", top))) goto out;
    /* encode() truncates and pads a single sequence too (post_process) */
    if (json_object_object_get_ex(root, "truncation", &x) && x)
        FAIL(FT_ERR_UNSUPPORTED, "%s: 'truncation' is set (truncating encodings is not supported; set it to null)", fn);
    if (json_object_object_get_ex(root, "padding", &x) && x) {
        json_object *ps, *pm;
        int longest = json_object_object_get_ex(x, "strategy", &ps) && json_object_is_type(ps, json_type_string) &&
                      !strcmp(json_object_get_string(ps), "BatchLongest");
        int multiple = json_object_object_get_ex(x, "pad_to_multiple_of", &pm) && pm;
        if (!longest || multiple)
            FAIL(FT_ERR_UNSUPPORTED, "%s: 'padding' pads single sequences (only BatchLongest without "
                 "pad_to_multiple_of is supported; set it to null)", fn);
    }
    if ((st = load_model(t, model, added, fn))) goto out;
    bytelevel_table(t);
    size_t cap = 0;
    if (json_object_object_get_ex(root, "normalizer", &x) && (st = load_normalizer(t, x, fn, &cap))) goto out;
    cap = 0;
    if (json_object_object_get_ex(root, "pre_tokenizer", &x) && (st = load_pretok(t, x, fn, &cap))) goto out;
    int have = 0;
    if (json_object_object_get_ex(root, "post_processor", &x) && (st = load_postproc(t, x, fn, &have))) goto out;
    cap = 0;
    if (json_object_object_get_ex(root, "decoder", &x) && (st = load_decoder(t, x, fn, &cap))) goto out;
    if ((st = added_match_strings(t))) goto out;
    if ((st = build_decoder_tables(t))) goto out;
out:
    json_object_put(root);
    if (tok) json_tokener_free(tok);   /* json-c 0.16 crashes on NULL */
    if (st) { ft_tokenizer_free(t); return st; }
    *out = t;
    return FT_OK;
}

ft_status ft_tokenizer_load(const char *path, ft_tokenizer **out)
{
    if (!path || !out) return ft_set_error(FT_ERR_INVALID_ARG, "ft_tokenizer_load: NULL argument");
    FILE *f = fopen(path, "rb");
    if (!f) return ft_set_error(errno == ENOENT ? FT_ERR_NOT_FOUND : FT_ERR_IO, "%s: %s", path, strerror(errno));
    sbuf b = {0};
    char chunk[65536];
    size_t r;
    while ((r = fread(chunk, 1, sizeof chunk, f)) > 0) {
        sb_put(&b, chunk, r);
        if (b.oom || b.n > TK_MAX_FILE) break;
    }
    int err = ferror(f);
    fclose(f);
    ft_status st;
    if (b.oom) st = ft_set_error(FT_ERR_NOMEM, "%s: out of memory", path);
    else if (b.n > TK_MAX_FILE) st = ft_set_error(FT_ERR_CORRUPT, "%s: larger than 1 GiB", path);
    else if (err) st = ft_set_error(FT_ERR_IO, "%s: read error", path);
    else st = ft_tokenizer_load_memory(b.p ? b.p : "", b.n, path, out);
    free(b.p);
    return st;
}

/* -------------------------------------------------------------- queries */

size_t ft_tokenizer_vocab_size(const ft_tokenizer *t) { return t ? (size_t)t->nid : 0; }

int32_t ft_tokenizer_token_id(const ft_tokenizer *t, const char *token)
{
    if (!t || !token) return -1;
    size_t n = strlen(token);
    for (size_t i = 0; i < t->nadded; i++)
        if (t->added[i].len == n && !memcmp(t->added[i].s, token, n)) return t->added[i].id;
    return smap_get(&t->vocab, token, n);
}

const char *ft_tokenizer_token_str(const ft_tokenizer *t, int32_t id)
{
    return t && id >= 0 && id < t->nid ? t->id_str[id] : NULL;
}

int ft_tokenizer_is_special(const ft_tokenizer *t, int32_t id)
{
    return t && id >= 0 && id < t->nid && t->id_special[id];
}

/* --------------------------------------------------------------- encode */

typedef struct { int32_t *p; size_t n, cap; int oom; } ivec;

static void iv_push(ivec *v, int32_t x)
{
    if (v->oom) return;
    if (v->n == v->cap) {
        size_t nc = v->cap ? v->cap * 2 : 64;
        int32_t *np = realloc(v->p, nc * sizeof *np);
        if (!np) { v->oom = 1; return; }
        v->p = np;
        v->cap = nc;
    }
    v->p[v->n++] = x;
}

/* A piece of text during pre-tokenization: [off, off+len) of a buffer;
 * first: starts at original offset 0 (Metaspace prepend_scheme first). */
typedef struct { size_t off, len; int first; } piece;
typedef struct { piece *p; size_t n, cap; int oom; } pvec;

static void pv_push(pvec *v, size_t off, size_t len, int first)
{
    if (v->oom || !len) return;
    if (v->n == v->cap) {
        size_t nc = v->cap ? v->cap * 2 : 32;
        piece *np = realloc(v->p, nc * sizeof *np);
        if (!np) { v->oom = 1; return; }
        v->p = np;
        v->cap = nc;
    }
    v->p[v->n++] = (piece){off, len, first};
}

typedef struct {
    const ft_tokenizer *t;
    pcre2_match_data *md;
    /* BPE scratch */
    int32_t *sid; int32_t *sprev, *snext; size_t scap;
    struct hent { uint32_t rank; uint32_t pos; } *heap; size_t hcap;
    sbuf tmp;
    int oom;
    ft_status err;
} enc_ctx;

static int ec_reserve(enc_ctx *c, size_t n)
{
    if (n <= c->scap) return 1;
    size_t nc = c->scap ? c->scap : 64;
    while (nc < n) nc *= 2;
    int32_t *a = realloc(c->sid, nc * sizeof *a);
    if (a) c->sid = a;
    int32_t *b = realloc(c->sprev, nc * sizeof *b);
    if (b) c->sprev = b;
    int32_t *d = realloc(c->snext, nc * sizeof *d);
    if (d) c->snext = d;
    struct hent *h = realloc(c->heap, nc * sizeof *h);
    if (h) c->heap = h;
    if (!a || !b || !d || !h) { c->oom = 1; return 0; }
    c->scap = nc;
    c->hcap = nc;
    return 1;
}

static inline int hless(struct hent a, struct hent b) { return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos); }

static void hpush(struct hent *h, size_t *n, struct hent e)
{
    size_t i = (*n)++;
    while (i) {
        size_t p = (i - 1) / 2;
        if (!hless(e, h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = e;
}

static struct hent hpop(struct hent *h, size_t *n)
{
    struct hent top = h[0], e = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        struct hent best = e;
        if (l < *n && hless(h[l], best)) { m = l; best = h[l]; }
        if (r < *n && hless(h[r], best)) { m = r; }
        if (m == i) break;
        h[i] = h[m];
        i = m;
    }
    if (*n) h[i] = e;
    return top;
}

/* BPE one pre-tokenized piece (valid UTF-8) into ids. */
static void bpe_piece(enc_ctx *c, const char *s, size_t n, ivec *out)
{
    const ft_tokenizer *t = c->t;
    if (t->ignore_merges) {
        int32_t id = smap_get(&t->vocab, s, n);
        if (id >= 0) { iv_push(out, id); return; }
    }
    /* at most 4 symbols per byte (byte fallback) is bounded by n */
    if (!ec_reserve(c, n + 1)) return;
    size_t ns = 0;
    int pending_unk = 0;
    for (size_t i = 0; i < n;) {
        size_t l;
        if (utf8_check((const uint8_t *)s + i, n - i, &l) != 1) l = 1;   /* cannot happen after sanitizing */
        int32_t id = smap_get(&t->vocab, s + i, l);
        if (id >= 0) {
            c->sid[ns++] = id;
            pending_unk = 0;
        } else {
            int done = 0;
            if (t->byte_fallback) {
                int all = 1;
                for (size_t k = 0; k < l; k++) all &= t->byte_id[(uint8_t)s[i + k]] >= 0;
                if (all) {
                    for (size_t k = 0; k < l; k++) c->sid[ns++] = t->byte_id[(uint8_t)s[i + k]];
                    pending_unk = 0;
                    done = 1;
                }
            }
            if (!done && t->unk_id >= 0) {
                if (!(t->fuse_unk && pending_unk)) c->sid[ns++] = t->unk_id;
                pending_unk = 1;
            }
        }
        i += l;
    }
    for (size_t i = 0; i < ns; i++) {
        c->sprev[i] = (int32_t)i - 1;
        c->snext[i] = i + 1 < ns ? (int32_t)(i + 1) : -1;
    }
    size_t hn = 0;
    for (size_t i = 0; i + 1 < ns; i++) {
        const pmap_slot *m = pmap_get(&t->merges, c->sid[i], c->sid[i + 1]);
        if (m) hpush(c->heap, &hn, (struct hent){m->rank, (uint32_t)i});
    }
    while (hn) {
        struct hent e = hpop(c->heap, &hn);
        int32_t i = (int32_t)e.pos, j = c->snext[i];
        if (c->sid[i] < 0 || j < 0) continue;
        const pmap_slot *m = pmap_get(&t->merges, c->sid[i], c->sid[j]);
        if (!m || m->rank != e.rank) continue;   /* stale */
        c->sid[i] = m->id;
        c->sid[j] = -1;
        c->snext[i] = c->snext[j];
        if (c->snext[j] >= 0) c->sprev[c->snext[j]] = i;
        int32_t p = c->sprev[i], q = c->snext[i];
        if (p >= 0) {
            const pmap_slot *mp = pmap_get(&t->merges, c->sid[p], c->sid[i]);
            if (mp) hpush(c->heap, &hn, (struct hent){mp->rank, (uint32_t)p});
        }
        if (q >= 0) {
            const pmap_slot *mq = pmap_get(&t->merges, c->sid[i], c->sid[q]);
            if (mq) hpush(c->heap, &hn, (struct hent){mq->rank, (uint32_t)i});
        }
    }
    for (int32_t i = ns ? 0 : -1; i >= 0; i = c->snext[i]) iv_push(out, c->sid[i]);
}

/* Split s[0..n) (at offset `base` of its buffer) on the matches of re, as
 * HF's NormalizedString::split does: the text becomes alternating gap and
 * match pieces (Regex::find_matches), `invert` swaps which are matches,
 * and the behavior folds them (Isolated, Removed, MergedWithPrevious,
 * MergedWithNext, Contiguous: the same folds as tokenizers'
 * SplitDelimiterBehavior). Empty matches are skipped. */
static int regex_split(enc_ctx *c, pcre2_code *re, const char *s, size_t n, size_t base, int first, int behavior,
                       int invert, pvec *out)
{
    pvec seg = {0};        /* pieces; .first holds is_match */
    size_t pos = 0, last = 0;
    while (pos <= n) {
        int rc = pcre2_match(re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, c->md, NULL);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT || rc == PCRE2_ERROR_MATCHLIMIT || rc == PCRE2_ERROR_DEPTHLIMIT)
            rc = pcre2_match(re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, c->md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc == PCRE2_ERROR_MATCHLIMIT || rc == PCRE2_ERROR_DEPTHLIMIT || rc == PCRE2_ERROR_HEAPLIMIT) {
            /* catastrophic backtracking of the model's own pattern on this
             * input: the input cannot be split as the tokenizer says */
            c->err = ft_set_error(FT_ERR_UNSUPPORTED,
                                  "the tokenizer's split pattern (tokenizer.json) backtracks without "
                                  "end on this text (PCRE2 %s limit at byte %zu): the text cannot be "
                                  "tokenized; shorten or change it, or fix the pattern",
                                  rc == PCRE2_ERROR_MATCHLIMIT ? "match" : rc == PCRE2_ERROR_DEPTHLIMIT ? "depth" : "heap",
                                  base + pos);
            free(seg.p);
            return 0;
        }
        if (rc < 0) {
            PCRE2_UCHAR why[120];
            if (pcre2_get_error_message(rc, why, sizeof why) < 0) snprintf((char *)why, sizeof why, "code %d", rc);
            c->err = ft_set_error(FT_ERR_CORRUPT, "the tokenizer's split pattern failed on this text: %s", (char *)why);
            free(seg.p);
            return 0;
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(c->md);
        size_t ms = ov[0], me = ov[1];
        if (me == ms) {   /* empty match: step one char and keep searching */
            if (ms >= n) break;
            size_t l;
            if (utf8_check((const uint8_t *)s + ms, n - ms, &l) != 1) l = 1;
            pos = ms + l;
            continue;
        }
        pv_push(&seg, last, ms - last, invert);
        pv_push(&seg, ms, me - ms, !invert);
        last = pos = me;
    }
    pv_push(&seg, last, n - last, invert);
    if (seg.oom) { c->oom = 1; free(seg.p); return 0; }
    /* fold into acc (offsets relative to s) */
    pvec acc = {0};
    int prev = 0;
    if (behavior == BEH_MERGED_NEXT) {
        for (size_t k = seg.n; k-- > 0;) {
            piece p = seg.p[k];
            if (p.first && !prev && acc.n) {
                acc.p[acc.n - 1].len += p.len;
                acc.p[acc.n - 1].off = p.off;
            } else {
                pv_push(&acc, p.off, p.len, 0);
            }
            prev = p.first;
        }
        for (size_t a = 0, b = acc.n ? acc.n - 1 : 0; a < b; a++, b--) {
            piece x = acc.p[a]; acc.p[a] = acc.p[b]; acc.p[b] = x;
        }
    } else {
        for (size_t k = 0; k < seg.n; k++) {
            piece p = seg.p[k];
            int merge = 0;
            if (behavior == BEH_REMOVED && p.first) continue;
            if (behavior == BEH_MERGED_PREV) merge = p.first && !prev;
            else if (behavior == BEH_CONTIGUOUS) merge = p.first == prev;
            if (merge && acc.n) acc.p[acc.n - 1].len += p.len;
            else pv_push(&acc, p.off, p.len, 0);
            prev = p.first;
        }
    }
    for (size_t k = 0; k < acc.n; k++) pv_push(out, base + acc.p[k].off, acc.p[k].len, first && acc.p[k].off == 0);
    if (acc.oom) c->oom = 1;
    free(seg.p);
    free(acc.p);
    return !c->oom;
}

/* One Unicode normalization form of valid UTF-8 s into o (libutf8proc). */
static void unicode_normalize(int kind, const char *s, size_t n, sbuf *o)
{
    int opt = UTF8PROC_STABLE | (kind == NORM_NFC || kind == NORM_NFKC ? UTF8PROC_COMPOSE : UTF8PROC_DECOMPOSE) |
              (kind == NORM_NFKC || kind == NORM_NFKD ? UTF8PROC_COMPAT : 0);
    utf8proc_uint8_t *dst = NULL;
    o->n = 0;
    if (!n) { sb_put(o, "", 0); return; }
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &dst, (utf8proc_option_t)opt);
    if (r < 0) {   /* only UTF8PROC_ERROR_NOMEM is possible on sanitized input */
        o->oom = 1;
        return;
    }
    sb_put(o, dst, (size_t)r);
    free(dst);
}

/* Normalize s into o (operations on valid UTF-8). */
static void normalize(const ft_tokenizer *t, const char *s, size_t n, sbuf *o, sbuf *tmp)
{
    o->n = 0;
    sb_put(o, s, n);
    for (size_t k = 0; k < t->nnorm; k++) {
        const norm_op *op = &t->norm[k];
        if (op->kind == NORM_PREPEND) {
            if (!o->n) continue;
            tmp->n = 0;
            sb_put(tmp, op->a, op->alen);
            sb_put(tmp, o->p, o->n);
        } else if (op->kind == NORM_REPLACE) {
            tmp->n = 0;
            replace_all(tmp, o->p ? o->p : "", o->n, op->a, op->alen, op->b, op->blen);
        } else {
            unicode_normalize(op->kind, o->p ? o->p : "", o->n, tmp);
        }
        sbuf x = *o; *o = *tmp; *tmp = x;
    }
}

/* Pre-tokenize text (one normalized segment) and BPE each piece. */
static void encode_segment(enc_ctx *c, const char *s, size_t n, int first, ivec *out)
{
    const ft_tokenizer *t = c->t;
    sbuf cur = {0}, nxt = {0};
    pvec pv = {0}, pv2 = {0};
    sb_put(&cur, s, n);
    pv_push(&pv, 0, n, first);
    for (size_t k = 0; k < t->npre && !c->err; k++) {
        const pre_op *op = &t->pre[k];
        nxt.n = 0;
        pv2.n = 0;
        for (size_t i = 0; i < pv.n && !c->err; i++) {
            const char *ps = cur.p + pv.p[i].off;
            size_t pl = pv.p[i].len;
            int pf = pv.p[i].first;
            size_t base = nxt.n;
            if (op->kind == PRE_BYTELEVEL) {
                sbuf w = {0};
                if (op->add_prefix_space && ps[0] != ' ') sb_put(&w, " ", 1);
                sb_put(&w, ps, pl);
                if (w.oom) { c->oom = 1; free(w.p); break; }
                pvec sub = {0};
                if (op->use_regex) {
                    if (!regex_split(c, op->re, w.p, w.n, 0, pf, BEH_ISOLATED, 0, &sub)) { free(w.p); free(sub.p); break; }
                } else {
                    pv_push(&sub, 0, w.n, pf);
                }
                for (size_t q = 0; q < sub.n; q++) {
                    size_t start = nxt.n;
                    for (size_t z = 0; z < sub.p[q].len; z++) {
                        uint8_t by = (uint8_t)w.p[sub.p[q].off + z];
                        sb_put(&nxt, t->bl_chars[by], t->bl_len[by]);
                    }
                    pv_push(&pv2, start, nxt.n - start, sub.p[q].first);
                }
                if (sub.oom) c->oom = 1;
                free(sub.p);
                free(w.p);
            } else if (op->kind == PRE_SPLIT) {
                sb_put(&nxt, ps, pl);
                if (nxt.oom) break;
                if (!regex_split(c, op->re, nxt.p + base, pl, base, pf, op->behavior, op->invert, &pv2)) break;
            } else {   /* Metaspace */
                sbuf w = {0};
                int has = pl >= op->repl_len && !memcmp(ps, op->repl, op->repl_len);
                /* replace ' ' first, then check the prefix, as HF does */
                replace_all(&w, ps, pl, " ", 1, op->repl, op->repl_len);
                has = w.n >= op->repl_len && !memcmp(w.p, op->repl, op->repl_len);
                if (!has && (op->prepend == PREPEND_ALWAYS || (op->prepend == PREPEND_FIRST && pf)))
                    sb_put(&nxt, op->repl, op->repl_len);
                sb_put(&nxt, w.p ? w.p : "", w.n);
                free(w.p);
                if (nxt.oom) break;
                size_t len = nxt.n - base;
                if (!op->split) { pv_push(&pv2, base, len, pf); continue; }
                /* split before every replacement char (MergedWithNext) */
                size_t st0 = 0;
                for (size_t z = 1; z + op->repl_len <= len; z++)
                    if (!memcmp(nxt.p + base + z, op->repl, op->repl_len)) {
                        pv_push(&pv2, base + st0, z - st0, pf && st0 == 0);
                        st0 = z;
                    }
                pv_push(&pv2, base + st0, len - st0, pf && st0 == 0);
            }
        }
        if (nxt.oom || pv2.oom) c->oom = 1;
        sbuf x = cur; cur = nxt; nxt = x;
        pvec y = pv; pv = pv2; pv2 = y;
        if (c->oom) break;
    }
    for (size_t i = 0; i < pv.n && !c->oom && !c->err; i++) bpe_piece(c, cur.p + pv.p[i].off, pv.p[i].len, out);
    if (cur.oom || pv.oom) c->oom = 1;
    free(cur.p); free(nxt.p); free(pv.p); free(pv2.p);
}

static int is_ws(const char *s, size_t n, size_t *l)
{
    size_t k;
    if (utf8_check((const uint8_t *)s, n, &k) != 1) { *l = 1; return 0; }
    *l = k;
    uint32_t cp = utf8_decode1((const uint8_t *)s, n, &k);
    return (cp >= 9 && cp <= 13) || cp == 32 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
           cp == 0x3000;
}

static int is_word_byte_at_end(const char *s, size_t n)   /* last char of s[0..n) */
{
    if (!n) return 0;
    size_t i = n - 1;
    while (i > 0 && ((uint8_t)s[i] & 0xC0) == 0x80) i--;
    uint8_t c = (uint8_t)s[i];
    return c >= 0x80 || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

static int is_word_byte_at_start(const char *s, size_t n)
{
    if (!n) return 0;
    uint8_t c = (uint8_t)s[0];
    return c >= 0x80 || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

typedef void (*seg_fn)(enc_ctx *c, const char *s, size_t n, int first, ivec *out, void *arg);

/* Split s on added tokens with normalized == want_norm (leftmost-longest);
 * text between matches goes to fn, matches become ids. */
static void split_added(enc_ctx *c, const char *s, size_t n, int first, int want_norm, ivec *out, seg_fn fn,
                        void *arg)
{
    const ft_tokenizer *t = c->t;
    size_t seg = 0, i = 0;
    const uint8_t *firsts = t->added_first[want_norm ? 1 : 0];
    while (i < n) {
        const added_tok *best = NULL;
        if (!firsts[(uint8_t)s[i]]) { i++; continue; }   /* byte steps stay on char starts: s[i] lead bytes only match leads */
        for (size_t k = 0; k < t->nadded; k++) {
            const added_tok *a = &t->added[k];
            if (a->normalized != want_norm || !a->mlen || a->mlen > n - i || (best && a->mlen <= best->mlen)) continue;
            if (memcmp(s + i, a->m, a->mlen)) continue;
            if (a->single_word && (is_word_byte_at_end(s, i) || is_word_byte_at_start(s + i + a->mlen, n - i - a->mlen)))
                continue;
            best = a;
        }
        if (!best) {
            size_t l;
            if (utf8_check((const uint8_t *)s + i, n - i, &l) != 1) l = 1;
            i += l;
            continue;
        }
        size_t ms = i, me = i + best->mlen;
        if (best->lstrip) {
            while (ms > seg) {
                size_t k = ms - 1, l;
                while (k > seg && ((uint8_t)s[k] & 0xC0) == 0x80) k--;
                if (!is_ws(s + k, n - k, &l)) break;
                ms = k;
            }
        }
        if (best->rstrip) {
            size_t l;
            while (me < n && is_ws(s + me, n - me, &l)) me += l;
        }
        if (ms > seg) fn(c, s + seg, ms - seg, first && seg == 0, out, arg);
        iv_push(out, best->id);
        seg = i = me;
    }
    if (n > seg) fn(c, s + seg, n - seg, first && seg == 0, out, arg);
}

static void seg_normalized(enc_ctx *c, const char *s, size_t n, int first, ivec *out, void *arg)
{
    (void)arg;
    encode_segment(c, s, n, first, out);
}

static void seg_raw(enc_ctx *c, const char *s, size_t n, int first, ivec *out, void *arg)
{
    (void)arg;
    sbuf norm = {0}, tmp = {0};
    normalize(c->t, s, n, &norm, &tmp);
    if (norm.oom || tmp.oom) c->oom = 1;
    else if (norm.n) split_added(c, norm.p, norm.n, first, 1, out, seg_normalized, NULL);
    free(norm.p);
    free(tmp.p);
}

ft_status ft_tokenizer_encode(const ft_tokenizer *t, const char *text, size_t len, int add_special, int32_t **ids,
                              size_t *n)
{
    if (!t || (!text && len) || !ids || !n) return ft_set_error(FT_ERR_INVALID_ARG, "ft_tokenizer_encode: NULL argument");
    enc_ctx c;
    memset(&c, 0, sizeof c);
    c.t = t;
    sbuf clean = {0};
    ivec out = {0};
    sb_put_lossy(&clean, (const uint8_t *)(text ? text : ""), len);
    c.md = pcre2_match_data_create(2, NULL);
    if (!c.md) c.oom = 1;
    if (add_special)
        for (size_t i = 0; i < t->npp_pre; i++) iv_push(&out, t->pp_pre[i]);
    if (!clean.oom && !c.oom && clean.n) split_added(&c, clean.p, clean.n, 1, 0, &out, seg_raw, NULL);
    if (add_special)
        for (size_t i = 0; i < t->npp_post; i++) iv_push(&out, t->pp_post[i]);
    ft_status st = c.err;
    if (!st && (c.oom || clean.oom || out.oom)) st = ft_set_error(FT_ERR_NOMEM, "out of memory");
    pcre2_match_data_free(c.md);
    free(c.sid); free(c.sprev); free(c.snext); free(c.heap); free(c.tmp.p);
    free(clean.p);
    if (st) { free(out.p); return st; }
    if (!out.p) {
        out.p = malloc(sizeof(int32_t));
        if (!out.p) return ft_set_error(FT_ERR_NOMEM, "out of memory");
    }
    *ids = out.p;
    *n = out.n;
    return FT_OK;
}

/* --------------------------------------------------------------- decode */

struct ft_detok {
    const ft_tokenizer *t;
    int skip_special;
    size_t ntok;          /* tokens passed to the decoder so far */
    sbuf pend;            /* raw bytes not yet resolved (ByteLevel) / byte group (chain) */
    sbuf outq;            /* resolved UTF-8 not yet handed out */
    int strip_left;       /* Strip decoder: leading chars still to strip */
};

static void dt_reset(ft_detok *d)
{
    d->ntok = 0;
    d->pend.n = 0;
    d->outq.n = 0;
    d->strip_left = d->t->dec_strip_start;
}

/* Append resolved UTF-8 to the output queue, applying Strip(start). */
static void dt_emit(ft_detok *d, const char *s, size_t n)
{
    const ft_tokenizer *t = d->t;
    size_t i = 0;
    while (d->strip_left > 0 && i < n) {
        size_t l;
        uint32_t cp = utf8_decode1((const uint8_t *)s + i, n - i, &l);
        if (cp != t->dec_strip_char) { d->strip_left = 0; break; }
        d->strip_left--;
        i += l;
    }
    sb_put(&d->outq, s + i, n - i);
}

/* Resolve a complete byte-fallback group: valid UTF-8 as is, else one
 * U+FFFD per byte (HF ByteFallback). */
static void dt_flush_group(ft_detok *d)
{
    if (!d->pend.n) return;
    if (valid_utf8(d->pend.p, d->pend.n)) dt_emit(d, d->pend.p, d->pend.n);
    else
        for (size_t k = 0; k < d->pend.n; k++) dt_emit(d, "\xEF\xBF\xBD", 3);
    d->pend.n = 0;
}

/* ByteLevel / none: emit the complete characters of pend, keep an
 * incomplete tail (final: replace it). */
static void dt_drain_bytes(ft_detok *d, int final)
{
    size_t i = 0;
    const uint8_t *p = (const uint8_t *)d->pend.p;
    while (i < d->pend.n) {
        size_t adv;
        int r = utf8_check(p + i, d->pend.n - i, &adv);
        if (r == 1) dt_emit(d, (const char *)p + i, adv);
        else if (r == 0) dt_emit(d, "\xEF\xBF\xBD", 3);
        else if (final) dt_emit(d, "\xEF\xBF\xBD", 3);
        else break;
        i += adv;
    }
    if (i && d->pend.n > i) memmove(d->pend.p, d->pend.p + i, d->pend.n - i);
    d->pend.n -= i;
}

static void dt_feed(ft_detok *d, int32_t id)
{
    const ft_tokenizer *t = d->t;
    if (id < 0 || id >= t->nid || !t->id_str[id]) return;   /* HF skips unknown ids */
    if (d->skip_special && t->id_special[id]) return;
    int first = d->ntok++ == 0;
    const char *s = t->dec_str[id];
    size_t n = t->dec_len[id];
    if (t->dec_mode == DEC_BYTELEVEL || t->dec_mode == DEC_NONE) {
        if (t->dec_mode == DEC_NONE && !first) sb_put(&d->pend, " ", 1);
        sb_put(&d->pend, s, n);
        dt_drain_bytes(d, 0);
        return;
    }
    if (t->dec_byte[id] >= 0) {
        uint8_t b = (uint8_t)t->dec_byte[id];
        sb_put(&d->pend, &b, 1);
        return;
    }
    dt_flush_group(d);
    if (t->dec_ms) {   /* Metaspace decoder: repl -> ' ', dropped in the first token */
        sbuf w = {0};
        if (first && t->dec_ms == 2) replace_all(&w, s, n, t->dec_ms_repl, t->dec_ms_repl_len, "", 0);
        else replace_all(&w, s, n, t->dec_ms_repl, t->dec_ms_repl_len, " ", 1);
        if (w.oom) d->outq.oom = 1;
        else dt_emit(d, w.p ? w.p : "", w.n);
        free(w.p);
        return;
    }
    dt_emit(d, s, n);
}

static void dt_finish(ft_detok *d)
{
    if (d->t->dec_mode == DEC_CHAIN) dt_flush_group(d);
    else dt_drain_bytes(d, 1);
}

ft_status ft_tokenizer_decode(const ft_tokenizer *t, const int32_t *ids, size_t n, int skip_special, char **text,
                              size_t *len)
{
    if (!t || (!ids && n) || !text || !len) return ft_set_error(FT_ERR_INVALID_ARG, "ft_tokenizer_decode: NULL argument");
    ft_detok d;
    memset(&d, 0, sizeof d);
    d.t = t;
    d.skip_special = skip_special;
    dt_reset(&d);
    for (size_t i = 0; i < n; i++) dt_feed(&d, ids[i]);
    dt_finish(&d);
    sb_put(&d.outq, "", 0);
    free(d.pend.p);
    if (d.outq.oom || d.pend.oom) { free(d.outq.p); return ft_set_error(FT_ERR_NOMEM, "out of memory"); }
    *text = d.outq.p;
    *len = d.outq.n;
    return FT_OK;
}

ft_status ft_detok_create(const ft_tokenizer *t, int skip_special, ft_detok **out)
{
    if (!t || !out) return ft_set_error(FT_ERR_INVALID_ARG, "ft_detok_create: NULL argument");
    ft_detok *d = calloc(1, sizeof *d);
    if (!d) return ft_set_error(FT_ERR_NOMEM, "out of memory");
    d->t = t;
    d->skip_special = skip_special;
    dt_reset(d);
    *out = d;
    return FT_OK;
}

/* Hand out up to cap bytes of whole characters from the queue. */
static size_t dt_take(ft_detok *d, char *buf, size_t cap)
{
    size_t k = d->outq.n < cap ? d->outq.n : cap;
    if (k < d->outq.n)   /* do not split a character */
        while (k > 0 && ((uint8_t)d->outq.p[k] & 0xC0) == 0x80) k--;
    if (k) memcpy(buf, d->outq.p, k);
    if (k && d->outq.n > k) memmove(d->outq.p, d->outq.p + k, d->outq.n - k);
    d->outq.n -= k;
    return k;
}

ft_status ft_detok_push(ft_detok *d, int32_t id, char *buf, size_t cap, size_t *written)
{
    if (!d || (!buf && cap) || !written) return ft_set_error(FT_ERR_INVALID_ARG, "ft_detok_push: NULL argument");
    dt_feed(d, id);
    if (d->outq.oom || d->pend.oom) return ft_set_error(FT_ERR_NOMEM, "out of memory");
    *written = dt_take(d, buf, cap);
    return FT_OK;
}

ft_status ft_detok_flush(ft_detok *d, char *buf, size_t cap, size_t *written)
{
    if (!d || (!buf && cap) || !written) return ft_set_error(FT_ERR_INVALID_ARG, "ft_detok_flush: NULL argument");
    dt_finish(d);
    if (d->outq.oom || d->pend.oom) return ft_set_error(FT_ERR_NOMEM, "out of memory");
    *written = dt_take(d, buf, cap);
    if (d->outq.n) return FT_ERR_BUFFER_SMALL;
    dt_reset(d);
    return FT_OK;
}

void ft_detok_free(ft_detok *d)
{
    if (!d) return;
    free(d->pend.p);
    free(d->outq.p);
    free(d);
}

/* ------------------------------------------- vocab.json + merges.txt dirs */

static int file_exists(const char *p)
{
    FILE *f = fopen(p, "rb");
    if (!f) return 0;
    fclose(f);
    return 1;
}

/* "content" of a token given as a string or an AddedToken object */
static const char *tok_content(json_object *v)
{
    if (!v) return NULL;
    if (json_object_is_type(v, json_type_string)) return json_object_get_string(v);
    return jstr(v, "content");
}

static json_object *added_entry(int64_t id, const char *content, int special)
{
    json_object *a = json_object_new_object();
    json_object_object_add(a, "id", json_object_new_int64(id));
    json_object_object_add(a, "content", json_object_new_string(content));
    json_object_object_add(a, "single_word", json_object_new_boolean(0));
    json_object_object_add(a, "lstrip", json_object_new_boolean(0));
    json_object_object_add(a, "rstrip", json_object_new_boolean(0));
    json_object_object_add(a, "normalized", json_object_new_boolean(0));
    json_object_object_add(a, "special", json_object_new_boolean(special));
    return a;
}

/* Build the tokenizer.json equivalent of GPT2Tokenizer's files. */
static ft_status load_gpt2_files(const char *dir, ft_tokenizer **out)
{
    char path[4096];
    ft_status st = FT_OK;
    json_object *vocab = NULL, *cfg = NULL, *root = NULL;
    FILE *mf = NULL;
    char *line = NULL;
    size_t lcap = 0;
    snprintf(path, sizeof path, "%s/vocab.json", dir);
    vocab = json_object_from_file(path);
    if (!vocab || !json_object_is_type(vocab, json_type_object))
        FAIL(FT_ERR_CORRUPT, "%s: not a JSON object of token -> id", path);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    if (file_exists(path)) {
        cfg = json_object_from_file(path);
        if (!cfg || !json_object_is_type(cfg, json_type_object)) FAIL(FT_ERR_CORRUPT, "%s: bad JSON", path);
    }
    root = json_object_new_object();
    json_object *model = json_object_new_object(), *merges = json_object_new_array();
    json_object_object_add(root, "model", model);
    json_object_object_add(model, "type", json_object_new_string("BPE"));
    json_object_object_add(model, "vocab", json_object_get(vocab));
    json_object_object_add(model, "merges", merges);
    snprintf(path, sizeof path, "%s/merges.txt", dir);
    if (!(mf = fopen(path, "rb"))) FAIL(errno == ENOENT ? FT_ERR_NOT_FOUND : FT_ERR_IO, "%s: %s", path, strerror(errno));
    ssize_t r;
    size_t lineno = 0;
    while ((r = getline(&line, &lcap, mf)) >= 0) {
        lineno++;
        while (r > 0 && (line[r - 1] == '\n' || line[r - 1] == '\r')) line[--r] = 0;
        if (lineno == 1 && !strncmp(line, "#version", 8)) continue;
        if (!r) continue;
        if ((size_t)r != strlen(line) || !valid_utf8(line, (size_t)r))
            FAIL(FT_ERR_CORRUPT, "%s: line %zu: not UTF-8 text", path, lineno);
        json_object_array_add(merges, json_object_new_string(line));
    }
    json_object *pre = json_object_new_object();
    json_object_object_add(pre, "type", json_object_new_string("ByteLevel"));
    json_object_object_add(pre, "add_prefix_space", json_object_new_boolean(0));
    json_object_object_add(pre, "use_regex", json_object_new_boolean(1));
    json_object_object_add(root, "pre_tokenizer", pre);
    json_object *dec = json_object_new_object();
    json_object_object_add(dec, "type", json_object_new_string("ByteLevel"));
    json_object_object_add(root, "decoder", dec);
    /* special tokens: added_tokens_decoder, then bos/eos/unk/pad */
    json_object *added = json_object_new_array();
    json_object_object_add(root, "added_tokens", added);
    json_object *atd;
    if (cfg && json_object_object_get_ex(cfg, "added_tokens_decoder", &atd) && json_object_is_type(atd, json_type_object)) {
        json_object_object_foreach(atd, ks, v) {
            char *end;
            errno = 0;
            long long id = strtoll(ks, &end, 10);
            const char *c = tok_content(v);
            if (*end || errno || id < 0 || id >= TK_MAX_ID || !c || !*c)
                FAIL(FT_ERR_CORRUPT, "%s/tokenizer_config.json: added_tokens_decoder['%s'] is invalid", dir, ks);
            json_object_array_add(added, added_entry(id, c, jbool(v, "special", 1)));
        }
    }
    static const char *const names[] = {"bos_token", "eos_token", "unk_token", "pad_token"};
    for (int k = 0; k < 4 && cfg; k++) {
        json_object *v, *idv;
        const char *c = json_object_object_get_ex(cfg, names[k], &v) ? tok_content(v) : NULL;
        if (!c || !*c) continue;
        if (!json_object_object_get_ex(vocab, c, &idv) || !json_object_is_type(idv, json_type_int)) continue;
        int dup = 0;
        for (size_t i = 0; i < json_object_array_length(added); i++)
            dup |= !strcmp(jstr(json_object_array_get_idx(added, i), "content"), c);
        if (!dup) json_object_array_add(added, added_entry(json_object_get_int64(idv), c, 1));
    }
    if (cfg && jbool(cfg, "add_bos_token", 0)) {
        json_object *v, *idv = NULL;
        const char *bos = json_object_object_get_ex(cfg, "bos_token", &v) ? tok_content(v) : NULL;
        int64_t id = -1;
        if (bos && json_object_object_get_ex(vocab, bos, &idv) && json_object_is_type(idv, json_type_int))
            id = json_object_get_int64(idv);
        for (size_t i = 0; bos && id < 0 && i < json_object_array_length(added); i++) {
            json_object *a = json_object_array_get_idx(added, i), *x;
            if (!strcmp(jstr(a, "content"), bos) && json_object_object_get_ex(a, "id", &x)) id = json_object_get_int64(x);
        }
        if (id < 0) FAIL(FT_ERR_CORRUPT, "%s/tokenizer_config.json: add_bos_token but bos_token is not in the vocab", dir);
        json_object *pp = json_object_new_object(), *single = json_object_new_array(), *sp = json_object_new_object(),
                    *spi = json_object_new_object(), *sq = json_object_new_object(), *sqi = json_object_new_object(),
                    *stoks = json_object_new_object(), *ent = json_object_new_object(), *ids = json_object_new_array();
        json_object_object_add(pp, "type", json_object_new_string("TemplateProcessing"));
        json_object_object_add(spi, "id", json_object_new_string(bos));
        json_object_object_add(sp, "SpecialToken", spi);
        json_object_object_add(sqi, "id", json_object_new_string("A"));
        json_object_object_add(sq, "Sequence", sqi);
        json_object_array_add(single, sp);
        json_object_array_add(single, sq);
        json_object_object_add(pp, "single", single);
        json_object_array_add(ids, json_object_new_int64(id));
        json_object_object_add(ent, "ids", ids);
        json_object_object_add(stoks, bos, ent);
        json_object_object_add(pp, "special_tokens", stoks);
        json_object_object_add(root, "post_processor", pp);
    }
    {
        const char *js = json_object_to_json_string_ext(root, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE);
        snprintf(path, sizeof path, "%s/vocab.json", dir);
        st = ft_tokenizer_load_memory(js, strlen(js), path, out);
    }
out:
    free(line);
    if (mf) fclose(mf);
    json_object_put(root);
    json_object_put(vocab);
    json_object_put(cfg);
    return st;
}

ft_status ft_tokenizer_load_dir_ex(const char *dir, unsigned flags, ft_tokenizer **out)
{
    int saved = tls_strict;
    tls_strict = (flags & FT_TOKENIZER_STRICT) != 0;
    ft_status st = ft_tokenizer_load_dir(dir, out);
    tls_strict = saved;
    return st;
}

ft_status ft_tokenizer_load_dir(const char *dir, ft_tokenizer **out)
{
    if (!dir || !out) return ft_set_error(FT_ERR_INVALID_ARG, "ft_tokenizer_load_dir: NULL argument");
    char path[4096];
    if (strlen(dir) > 4000) return ft_set_error(FT_ERR_INVALID_ARG, "%s: path too long", dir);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if (file_exists(path)) return ft_tokenizer_load(path, out);
    snprintf(path, sizeof path, "%s/vocab.json", dir);
    char p2[4096];
    snprintf(p2, sizeof p2, "%s/merges.txt", dir);
    if (file_exists(path) && file_exists(p2)) return load_gpt2_files(dir, out);
    return ft_set_error(FT_ERR_NOT_FOUND, "%s: no tokenizer.json (or vocab.json + merges.txt)", dir);
}
