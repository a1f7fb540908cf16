/* Synthetic BPE tokenizers of an exact vocabulary size for `flextier
 * gen-model` (see cli.h).
 *
 * Why synthetic: a random-weight checkpoint needs a tokenizer whose vocab
 * equals config.json's vocab_size, or tools that check the two (llama.cpp's
 * convert_hf_to_gguf.py) reject it. No corpus is involved; the merges are
 * enumerated so that every merge's two parts and result are in the vocab
 * (which Hugging Face `tokenizers` requires) and no string appears twice:
 *
 *   ids: the special tokens, then the 256 byte tokens, then (Llama only)
 *   the 95-character alphabet as single-character tokens, then merges
 *   "t c" of a token t and an alphabet character c, in increasing order of
 *   a cost: each character's is 16 x -log2 of its frequency in English, a
 *   merged token's the sum of its parts' (a min-heap over each token's next
 *   extension; ties by token age, then character). Tokens are shaped like
 *   the pieces pre-tokenizers cut: a run of word boundaries, optionally
 *   followed by letters only, digits only or punctuation only. A generated
 *   string that is already a token ("<s>") is skipped.
 *
 * The alphabet is the word boundary ("▁" for Llama, "Ġ" = the space byte
 * for OPT) and the 94 printable ASCII characters, so the likely strings of
 * English come first ("▁t", "▁the" long before "zq"). Any text round-trips: Llama-style falls back to
 * <0xNN> byte tokens (and "▁" itself is always a token), OPT-style covers
 * all 256 bytes. */
#include "cli.h"

#include <json-c/json.h>
#include <stdlib.h>
#include <string.h>

#define GT_ALPHA_MAX 96

/* UTF-8 of code point cp into b (cp < 0x800 here: GPT-2's byte alphabet
 * stays below U+0144); returns the length. */
static size_t utf8_put(uint32_t cp, char *b)
{
    if (cp < 0x80) { b[0] = (char)cp; return 1; }
    b[0] = (char)(0xC0 | (cp >> 6));
    b[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
}

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes map to themselves, the
 * other 68 to U+0100.. in byte order. */
static uint32_t gpt2_byte_cp(unsigned b)
{
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) return b;
    uint32_t n = 0;
    for (unsigned x = 0; x < b; x++)
        if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255))) n++;
    return 256 + n;
}

/* The alphabet and each character's cost: 16 x -log2 of its frequency in
 * English text (space 18%, e 10%, ..., z 0.07%; capitals 4% of their
 * lowercase, digits 0.2%, punctuation 0.03-1%), sorted by cost. A token's
 * cost is the sum of its characters', so merges come in the order of their
 * probability under a unigram model of English. Integers, so the order is
 * the same on every machine. */
static const struct { char c; uint16_t cost; } gt_chars[] = {
    {' ', 40}, {'e', 53}, {'t', 60}, {'a', 63}, {'o', 64}, {'i', 66}, {'n', 66}, {'s', 68}, {'h', 69},
    {'r', 69}, {'d', 77}, {'l', 79}, {'c', 87}, {'u', 87}, {'m', 90}, {'w', 91}, {'f', 93}, {'g', 95},
    {'y', 95}, {'p', 97}, {'b', 102}, {'v', 111}, {'k', 118}, {'x', 150}, {'j', 159}, {'q', 159},
    {'z', 168}, {'E', 127}, {'T', 134}, {'A', 137}, {'O', 138}, {'I', 140}, {'N', 140}, {'S', 142},
    {'H', 143}, {'R', 143}, {'D', 152}, {'L', 153}, {'C', 162}, {'U', 162}, {'M', 165}, {'W', 165},
    {'F', 168}, {'G', 171}, {'Y', 171}, {'P', 171}, {'B', 175}, {'V', 187}, {'K', 197}, {'X', 213},
    {'J', 213}, {'Q', 213}, {'Z', 213}, {'0', 143}, {'1', 143}, {'2', 143}, {'3', 143}, {'4', 143},
    {'5', 143}, {'6', 143}, {'7', 143}, {'8', 143}, {'9', 143}, {'!', 187}, {'"', 134}, {'#', 187},
    {'$', 187}, {'%', 187}, {'&', 187}, {'\'', 134}, {'(', 187}, {')', 187}, {'*', 187}, {'+', 187},
    {',', 106}, {'-', 143}, {'.', 106}, {'/', 187}, {':', 187}, {';', 187}, {'<', 187}, {'=', 187},
    {'>', 187}, {'?', 187}, {'@', 187}, {'[', 187}, {'\\', 187}, {']', 187}, {'^', 187}, {'_', 187},
    {'`', 187}, {'{', 187}, {'|', 187}, {'}', 187}, {'~', 187},
};

/* The alphabet as token strings (each <= 4 bytes + NUL) in increasing cost
 * (stable); the word boundary is "▁" (Llama) or "Ġ" (GPT-2's space). */
static size_t make_alphabet(int llama, char alpha[GT_ALPHA_MAX][8], uint32_t cost[GT_ALPHA_MAX])
{
    size_t n = sizeof gt_chars / sizeof *gt_chars, ord[GT_ALPHA_MAX];
    for (size_t i = 0; i < n; i++) {
        size_t j = i;
        while (j && gt_chars[ord[j - 1]].cost > gt_chars[i].cost) { ord[j] = ord[j - 1]; j--; }
        ord[j] = i;
    }
    for (size_t k = 0; k < n; k++) {
        char c = gt_chars[ord[k]].c;
        cost[k] = gt_chars[ord[k]].cost;
        if (c != ' ') { alpha[k][0] = c; alpha[k][1] = 0; }
        else if (llama) snprintf(alpha[k], 8, "\xE2\x96\x81");    /* U+2581 */
        else alpha[k][utf8_put(gpt2_byte_cp(' '), alpha[k])] = 0;   /* U+0120 */
    }
    return n;   /* 95 */
}

static json_object *added_token(int id, const char *content)
{
    json_object *o = json_object_new_object();
    json_object_object_add(o, "id", json_object_new_int(id));
    json_object_object_add(o, "content", json_object_new_string(content));
    json_object_object_add(o, "single_word", json_object_new_boolean(0));
    json_object_object_add(o, "lstrip", json_object_new_boolean(0));
    json_object_object_add(o, "rstrip", json_object_new_boolean(0));
    json_object_object_add(o, "normalized", json_object_new_boolean(0));
    json_object_object_add(o, "special", json_object_new_boolean(1));
    return o;
}

static json_object *typed(const char *type)
{
    json_object *o = json_object_new_object();
    json_object_object_add(o, "type", json_object_new_string(type));
    return o;
}

static json_object *string_pattern(const char *s)
{
    json_object *o = json_object_new_object();
    json_object_object_add(o, "String", json_object_new_string(s));
    return o;
}

/* TemplateProcessing that prepends one special token to each sequence. */
static json_object *template_bos(const char *bos, int bos_id, int pair_sep)
{
    json_object *pp = typed("TemplateProcessing");
    json_object *single = json_object_new_array(), *pair = json_object_new_array();
    for (int k = 0; k < 2; k++) {
        json_object *arr = k ? pair : single;
        int nseq = k ? 2 : 1;
        for (int s = 0; s < nseq; s++) {
            if (s == 0 || pair_sep) {
                json_object *st = json_object_new_object(), *in = json_object_new_object();
                json_object_object_add(in, "id", json_object_new_string(bos));
                json_object_object_add(in, "type_id", json_object_new_int(0));
                json_object_object_add(st, "SpecialToken", in);
                json_object_array_add(arr, st);
            }
            json_object *sq = json_object_new_object(), *in = json_object_new_object();
            json_object_object_add(in, "id", json_object_new_string(s ? "B" : "A"));
            json_object_object_add(in, "type_id", json_object_new_int(s && !pair_sep ? 1 : 0));
            json_object_object_add(sq, "Sequence", in);
            json_object_array_add(arr, sq);
        }
    }
    json_object_object_add(pp, "single", single);
    json_object_object_add(pp, "pair", pair);
    json_object *sp = json_object_new_object(), *e = json_object_new_object();
    json_object *ids = json_object_new_array(), *toks = json_object_new_array();
    json_object_array_add(ids, json_object_new_int(bos_id));
    json_object_array_add(toks, json_object_new_string(bos));
    json_object_object_add(e, "id", json_object_new_string(bos));
    json_object_object_add(e, "ids", ids);
    json_object_object_add(e, "tokens", toks);
    json_object_object_add(sp, bos, e);
    json_object_object_add(pp, "special_tokens", sp);
    return pp;
}

static json_object *byte_level(int add_prefix_space)
{
    json_object *o = typed("ByteLevel");
    json_object_object_add(o, "add_prefix_space", json_object_new_boolean(add_prefix_space));
    json_object_object_add(o, "trim_offsets", json_object_new_boolean(1));
    json_object_object_add(o, "use_regex", json_object_new_boolean(1));
    return o;
}

/* llama: <unk> <s> </s>, 256 <0xNN>, and "▁" (without it the word
 * boundary would decode as bytes, not as a space); opt: 4 specials + 256 */
long ft_cli_gen_tokenizer_min_vocab(int llama) { return llama ? 3 + 256 + 1 : 4 + 256; }

/* cls: what a token is made of, which decides what may extend it */
enum { GT_BOUNDARY, GT_LETTER, GT_DIGIT, GT_PUNCT };
typedef struct { char *s; uint32_t score; int cls; } gt_tok;
/* a candidate merge: token tok extended by alphabet character ch */
typedef struct { uint32_t score, tok; uint8_t ch; } gt_cand;
typedef struct { gt_cand *v; size_t n, cap; } gt_heap;

static int cand_less(gt_cand a, gt_cand b)
{
    if (a.score != b.score) return a.score < b.score;
    if (a.tok != b.tok) return a.tok < b.tok;
    return a.ch < b.ch;
}

static ft_status heap_push(gt_heap *h, gt_cand c)
{
    if (h->n == h->cap) {
        size_t nc = h->cap ? h->cap * 2 : 1024;
        gt_cand *v = realloc(h->v, nc * sizeof *v);
        if (!v) return ft_set_error(FT_ERR_NOMEM, "gen-model: tokenizer: out of memory");
        h->v = v;
        h->cap = nc;
    }
    size_t i = h->n++;
    while (i && cand_less(c, h->v[(i - 1) / 2])) {
        h->v[i] = h->v[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h->v[i] = c;
    return FT_OK;
}

static gt_cand heap_pop(gt_heap *h)
{
    gt_cand top = h->v[0], last = h->v[--h->n];
    size_t i = 0;
    for (;;) {
        size_t k = 2 * i + 1;
        if (k >= h->n) break;
        if (k + 1 < h->n && cand_less(h->v[k + 1], h->v[k])) k++;
        if (!cand_less(h->v[k], last)) break;
        h->v[i] = h->v[k];
        i = k;
    }
    if (h->n) h->v[i] = last;
    return top;
}

/* Append a token (takes ownership of s; NULL s = out of memory). */
static ft_status tok_add(gt_tok **v, size_t *n, size_t *cap, char *s, uint32_t score, int cls)
{
    if (!s) return ft_set_error(FT_ERR_NOMEM, "gen-model: tokenizer: out of memory");
    if (*n == *cap) {
        size_t nc = *cap ? *cap * 2 : 1024;
        gt_tok *g = realloc(*v, nc * sizeof *g);
        if (!g) { free(s); return ft_set_error(FT_ERR_NOMEM, "gen-model: tokenizer: out of memory"); }
        *v = g;
        *cap = nc;
    }
    (*v)[(*n)++] = (gt_tok){s, score, cls};
    return FT_OK;
}

ft_status ft_cli_gen_tokenizer(int llama, long vocab, char **json, size_t *len)
{
    if (!json || !len) return ft_set_error(FT_ERR_INVALID_ARG, "gen-model: NULL argument");
    if (vocab < ft_cli_gen_tokenizer_min_vocab(llama) || vocab > (1L << 24))
        return ft_set_error(FT_ERR_INVALID_ARG, "gen-model: a %s tokenizer needs a vocab of %ld to %ld tokens, not %ld",
                            llama ? "llama" : "opt", ft_cli_gen_tokenizer_min_vocab(llama), 1L << 24, vocab);
    ft_status st = FT_OK;
    char alpha[GT_ALPHA_MAX][8];
    uint32_t cost[GT_ALPHA_MAX];
    size_t na = make_alphabet(llama, alpha, cost);
    int acls[GT_ALPHA_MAX];
    for (size_t a = 0; a < na; a++) {
        unsigned char c0 = (unsigned char)alpha[a][0];
        acls[a] = c0 >= 0x80 ? GT_BOUNDARY : ((c0 | 0x20) >= 'a' && (c0 | 0x20) <= 'z') ? GT_LETTER
                  : (c0 >= '0' && c0 <= '9') ? GT_DIGIT : GT_PUNCT;
    }
    /* every token merges may extend: string, score, next character to try */
    gt_tok *toks = NULL;
    size_t ntoks = 0, captoks = 0;
    gt_heap h = {0};
    char *out = NULL;
    json_object *root = json_object_new_object();
    json_object *model = json_object_new_object();
    json_object *vj = json_object_new_object();
    json_object *merges = json_object_new_array();
    json_object *added = json_object_new_array();
    if (!root || !model || !vj || !merges || !added) {
        st = ft_set_error(FT_ERR_NOMEM, "gen-model: tokenizer: out of memory");
        goto out;
    }
    json_object_object_add(root, "version", json_object_new_string("1.0"));
    json_object_object_add(root, "truncation", NULL);
    json_object_object_add(root, "padding", NULL);
    json_object_object_add(root, "added_tokens", json_object_get(added));   /* root and we hold it */

    static const char *const llama_sp[] = {"<unk>", "<s>", "</s>"};
    static const char *const opt_sp[] = {"<s>", "<pad>", "</s>", "<unk>"};
    const char *const *sp = llama ? llama_sp : opt_sp;
    int nsp = llama ? 3 : 4;
    long id = 0;
    for (int i = 0; i < nsp; i++) {
        json_object_array_add(added, added_token((int)id, sp[i]));
        json_object_object_add(vj, sp[i], json_object_new_int((int)id++));
    }
    for (unsigned b = 0; b < 256; b++) {
        char t[8];
        if (llama) snprintf(t, sizeof t, "<0x%02X>", b);
        else t[utf8_put(gpt2_byte_cp(b), t)] = 0;
        json_object_object_add(vj, t, json_object_new_int((int)id++));
    }
    /* the alphabet (already present as byte tokens for OPT); a tiny vocab
     * may cut it short, and then there is no room for merges either */
    for (size_t a = 0; a < na; a++) {
        if (!json_object_object_get_ex(vj, alpha[a], NULL)) {
            if (id >= vocab) break;
            json_object_object_add(vj, alpha[a], json_object_new_int((int)id++));
        }
        if ((st = tok_add(&toks, &ntoks, &captoks, strdup(alpha[a]), cost[a], acls[a])) ||
            (st = heap_push(&h, (gt_cand){cost[a] + cost[0], (uint32_t)(ntoks - 1), 0})))
            goto out;
    }
    while (id < vocab && h.n) {
        gt_cand c = heap_pop(&h);
        gt_tok *t = &toks[c.tok];
        size_t lp = strlen(t->s), la = strlen(alpha[c.ch]);
        if ((size_t)c.ch + 1 < na &&
            (st = heap_push(&h, (gt_cand){t->score + cost[c.ch + 1], c.tok, (uint8_t)(c.ch + 1)})))
            goto out;
        /* tokens look like words as the pre-tokenizers cut them: an optional
         * run of boundaries, then letters, digits or punctuation, not mixed */
        int cls = t->cls == GT_BOUNDARY ? acls[c.ch] : t->cls;
        if ((acls[c.ch] == GT_BOUNDARY && t->cls != GT_BOUNDARY) || acls[c.ch] != cls) continue;
        char *ns = malloc(lp + la + 1), m[512];
        if (!ns) { st = ft_set_error(FT_ERR_NOMEM, "gen-model: tokenizer: out of memory"); goto out; }
        memcpy(ns, t->s, lp);
        memcpy(ns + lp, alpha[c.ch], la + 1);
        if (json_object_object_get_ex(vj, ns, NULL)) { free(ns); continue; }
        json_object_object_add(vj, ns, json_object_new_int((int)id++));
        if (lp + la + 2 <= sizeof m) snprintf(m, sizeof m, "%s %s", t->s, alpha[c.ch]);
        else { free(ns); st = ft_set_error(FT_ERR_INVALID_ARG, "gen-model: tokenizer: token too long"); goto out; }
        json_object_array_add(merges, json_object_new_string(m));
        uint32_t sc = c.score;
        if ((st = tok_add(&toks, &ntoks, &captoks, ns, sc, cls)) ||
            (st = heap_push(&h, (gt_cand){sc + cost[0], (uint32_t)(ntoks - 1), 0})))
            goto out;
    }

    if (llama) {   /* Llama 2 / sentencepiece-style BPE with byte fallback */
        json_object *norm = typed("Sequence"), *ns = json_object_new_array();
        json_object *pre = typed("Prepend"), *rep = typed("Replace");
        json_object_object_add(pre, "prepend", json_object_new_string("\xE2\x96\x81"));
        json_object_object_add(rep, "pattern", string_pattern(" "));
        json_object_object_add(rep, "content", json_object_new_string("\xE2\x96\x81"));
        json_object_array_add(ns, pre);
        json_object_array_add(ns, rep);
        json_object_object_add(norm, "normalizers", ns);
        json_object_object_add(root, "normalizer", norm);
        json_object_object_add(root, "pre_tokenizer", NULL);
        json_object_object_add(root, "post_processor", template_bos("<s>", 1, 0));
        json_object *dec = typed("Sequence"), *ds = json_object_new_array();
        json_object *drep = typed("Replace"), *strip = typed("Strip");
        json_object_object_add(drep, "pattern", string_pattern("\xE2\x96\x81"));
        json_object_object_add(drep, "content", json_object_new_string(" "));
        json_object_object_add(strip, "content", json_object_new_string(" "));
        json_object_object_add(strip, "start", json_object_new_int(1));
        json_object_object_add(strip, "stop", json_object_new_int(0));
        json_object_array_add(ds, drep);
        json_object_array_add(ds, typed("ByteFallback"));
        json_object_array_add(ds, typed("Fuse"));
        json_object_array_add(ds, strip);
        json_object_object_add(dec, "decoders", ds);
        json_object_object_add(root, "decoder", dec);
    } else {       /* GPT-2 / OPT byte-level BPE */
        json_object_object_add(root, "normalizer", NULL);
        json_object_object_add(root, "pre_tokenizer", byte_level(0));
        json_object_object_add(root, "post_processor", template_bos("</s>", 2, 1));
        json_object_object_add(root, "decoder", byte_level(1));
    }
    json_object_object_add(model, "type", json_object_new_string("BPE"));
    json_object_object_add(model, "dropout", NULL);
    json_object_object_add(model, "unk_token", llama ? json_object_new_string("<unk>") : NULL);
    json_object_object_add(model, "continuing_subword_prefix", NULL);
    json_object_object_add(model, "end_of_word_suffix", NULL);
    json_object_object_add(model, "fuse_unk", json_object_new_boolean(llama));
    json_object_object_add(model, "byte_fallback", json_object_new_boolean(llama));
    json_object_object_add(model, "ignore_merges", json_object_new_boolean(0));
    json_object_object_add(model, "vocab", vj);
    json_object_object_add(model, "merges", merges);
    json_object_object_add(root, "model", model);
    model = vj = merges = NULL;   /* owned by root now */

    const char *s = json_object_to_json_string_ext(root, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE);
    size_t n = s ? strlen(s) : 0;
    if (!s || !(out = malloc(n + 2))) { st = ft_set_error(FT_ERR_NOMEM, "gen-model: tokenizer: out of memory"); goto out; }
    memcpy(out, s, n);
    out[n++] = '\n';
    out[n] = 0;
    *json = out;
    *len = n;
    out = NULL;
out:
    for (size_t k = 0; k < ntoks; k++) free(toks[k].s);
    free(toks);
    free(h.v);
    free(out);
    json_object_put(model);
    json_object_put(vj);
    json_object_put(merges);
    json_object_put(added);
    json_object_put(root);
    return st;
}
