/* A Jinja2 subset interpreter for Hugging Face chat templates.
 *
 * Renders as transformers does: jinja2's ImmutableSandboxedEnvironment with
 * trim_blocks=True, lstrip_blocks=True, the loopcontrols extension and the
 * "generation" tag, transformers' tojson (json.dumps with ensure_ascii=False),
 * raise_exception, strftime_now, dict and namespace. Values follow Python:
 * truthiness, str()/repr() formatting, int/float arithmetic, comparisons.
 *
 * Structure: a lexer (jinja2's rules: whitespace control, comments, raw,
 * newline normalisation, one trailing newline dropped) produces tokens; a
 * recursive descent parser builds an AST in the template's arena; the
 * renderer walks it with the values in a per-render arena. Errors unwind by
 * longjmp to the entry point (all memory is in arenas, nothing leaks);
 * every message names the template line. Bounds: parse nesting, render
 * depth (calls, expressions, blocks), evaluation steps, output and memory.
 */
#define _GNU_SOURCE
#include "model/jinja.h"

#include <errno.h>
#include <json-c/json.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

#include "model/jinja_case.h"

/* ================================================================ arena */

typedef struct ablk {
    struct ablk *next;
    size_t used, cap;
    max_align_t data[];
} ablk;

typedef struct arena {
    ablk *head;
    size_t total, limit;
} arena;

typedef struct jctx jctx;
static _Noreturn void jfail(jctx *c, int line, ft_status st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void arena_free(arena *a)
{
    ablk *b = a->head;
    while (b) {
        ablk *n = b->next;
        free(b);
        b = n;
    }
    a->head = NULL;
    a->total = 0;
}

/* ============================================================ values */

enum {
    JV_UNDEF, JV_NONE, JV_BOOL, JV_INT, JV_FLOAT, JV_STR, JV_LIST, JV_DICT,
    JV_NS, JV_MACRO, JV_BUILTIN, JV_METHOD, JV_LOOP
};

typedef struct jv jv;
typedef struct jvec { jv **v; size_t n, cap; } jvec;
typedef struct jdict { jv **k; jv **v; size_t n, cap; } jdict;

struct jmacro;
struct jloop;

struct jv {
    unsigned char t;
    unsigned char flag;       /* STR: markup; LIST: an LK_ kind; UNDEF: 1 = unsafe */
    unsigned char used;       /* LK_GEN: consumed */
    unsigned short depth;     /* LIST/DICT/NS: nesting (bounded: every walk over a value recurses) */
    union {
        int b;
        int64_t i;
        double f;
        struct { const char *p; size_t n; } s;
        jvec *l;
        jdict *d;
        struct jmacro *m;
        int bi;
        struct { jv *self; const char *name; } me;
        struct jloop *loop;
        const char *hint;     /* UNDEF: the message used when it is misused */
    } u;
};

/* kinds of JV_LIST: Python list, tuple, an iterator (generator filters, reversed()),
 * dict views */
enum { LK_LIST = 0, LK_TUPLE, LK_GEN, LK_ITEMS, LK_KEYS, LK_VALUES };

static jv V_NONE = {JV_NONE, 0, 0, 0, {0}};
static jv V_TRUE = {JV_BOOL, 0, 0, 0, {.b = 1}};
static jv V_FALSE = {JV_BOOL, 0, 0, 0, {.b = 0}};
static jv V_EMPTY = {JV_STR, 0, 0, 0, {.s = {"", 0}}};

#define MAX_VALUE_DEPTH 150

/* ================================================================ AST */

enum {
    E_CONST, E_NAME, E_LIST, E_TUPLE, E_DICT, E_GETATTR, E_GETITEM, E_SLICE, E_CALL,
    E_FILTER, E_TEST, E_NOT, E_NEG, E_POS, E_BIN, E_AND, E_OR, E_CMP, E_CONCAT, E_COND
};

enum { OP_ADD = 1, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW,
       OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE, OP_IN, OP_NOTIN };

typedef struct node node;
typedef struct nvec { node **v; size_t n, cap; } nvec;

typedef struct callargs {
    nvec args;
    const char **kwnames;
    nvec kwvals;
    node *dyn_args, *dyn_kwargs;
} callargs;

struct node {
    int kind;
    int line;
    int op;
    const char *name;        /* NAME, GETATTR attr, FILTER/TEST name, macro name */
    jv *val;                 /* CONST */
    node *a, *b, *c;         /* operands; SLICE: a[b:c:d] with d in 'd' */
    node *d;
    nvec items;              /* LIST/TUPLE/CONCAT items, DICT keys, CMP operands */
    nvec items2;             /* DICT values */
    int *ops;                /* CMP operators */
    callargs *ca;            /* CALL/FILTER/TEST */
};

enum {
    S_DATA, S_PRINT, S_IF, S_FOR, S_SET, S_SETBLOCK, S_MACRO, S_CALLBLOCK, S_FILTERBLOCK,
    S_BREAK, S_CONTINUE, S_WITH, S_SCOPE
};

typedef struct stmt stmt;
typedef struct svec { stmt **v; size_t n, cap; } svec;

typedef struct target {
    int kind;                /* 0 name, 1 tuple, 2 namespace attribute */
    const char *name, *attr;
    struct target **sub;
    size_t nsub;
    int line;
} target;

typedef struct macrodef {
    const char *name;
    const char **params;
    node **defaults;          /* NULL entries: no default */
    size_t nparams;
    svec body;
    int uses_caller, uses_varargs, uses_kwargs;
} macrodef;

struct stmt {
    int kind;
    int line;
    const char *data;        /* DATA */
    size_t len;
    node *expr;              /* PRINT, IF cond, FOR iter, SET value, CALLBLOCK call */
    node *filt;              /* FOR filter; SETBLOCK/FILTERBLOCK filter chain (E_FILTER with a NULL base) */
    target *tgt;             /* FOR, SET, SETBLOCK */
    svec body, orelse;
    int recursive;
    macrodef *macro;         /* MACRO, CALLBLOCK (the caller) */
    target **wtargets;       /* WITH */
    node **wvals;
    size_t nwith;
};

struct ft_jinja {
    arena a;
    svec body;
};

/* ================================================================ context */

typedef struct frame {
    struct frame *parent;
    jdict vars;
} frame;

typedef struct sbuf { char *p; size_t n, cap; } sbuf;

typedef struct jmacro {
    macrodef *def;
    frame *closure;
    jv *caller;              /* for the caller of a call block: NULL */
} jmacro;

typedef struct jloop {
    jvec *items;
    size_t index0;
    int depth;
    const stmt *st;          /* recursive loops */
    frame *fr;
    jv *last_changed;
    int have_changed;
} jloop;

struct jctx {
    jmp_buf jb;
    ft_status st;
    char msg[1024];
    arena *a;                /* where values / AST nodes go */
    /* lexer/parser */
    const char *src;
    size_t srclen;
    struct tok *toks;
    size_t ntok, tcap, tpos;
    unsigned pdepth;
    /* render */
    sbuf *out;
    jdict *globals;          /* the render's variables */
    size_t max_output;
    uint64_t steps, max_steps;
    unsigned depth, max_depth;
    int line;                /* the line being rendered */
    int64_t now;
    int brk;                 /* 1 break, 2 continue pending */
};

static _Noreturn void jfail(jctx *c, int line, ft_status st, const char *fmt, ...)
{
    char m[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    if (line > 0)
        snprintf(c->msg, sizeof c->msg, "%s (chat template line %d)", m, line);
    else
        snprintf(c->msg, sizeof c->msg, "%s", m);
    c->st = st;
    longjmp(c->jb, 1);
}

#define FAIL(...) jfail(c, c->line, FT_ERR_INVALID_ARG, __VA_ARGS__)
#define UNSUP(...) jfail(c, c->line, FT_ERR_UNSUPPORTED, __VA_ARGS__)

static void *jalloc(jctx *c, size_t n)
{
    arena *a = c->a;
    n = (n + 15) & ~(size_t)15;
    if (n == 0) n = 16;
    if (!a->head || a->head->cap - a->head->used < n) {
        size_t cap = n > 65536 ? n : 65536;
        if (a->limit && a->total + cap > a->limit)
            jfail(c, c->line, FT_ERR_NOMEM, "template render exceeds its memory limit (%zu MiB)",
                  a->limit >> 20);
        ablk *b = malloc(sizeof *b + cap);
        if (!b) jfail(c, c->line, FT_ERR_NOMEM, "out of memory");
        b->cap = cap;
        b->used = 0;
        a->total += cap;
        if (a->head && n > 65536) {        /* big block: keep the current one open */
            b->next = a->head->next;
            a->head->next = b;
            b->used = n;
            return (char *)b->data;
        }
        b->next = a->head;
        a->head = b;
    }
    void *p = (char *)a->head->data + a->head->used;
    a->head->used += n;
    return p;
}

static void *jzalloc(jctx *c, size_t n)
{
    void *p = jalloc(c, n);
    memset(p, 0, n);
    return p;
}

static char *jstrndup(jctx *c, const char *s, size_t n)
{
    char *p = jalloc(c, n + 1);
    memcpy(p, s, n);
    p[n] = 0;
    return p;
}

#define VEC_PUSH(c, vec, x)                                                            \
    do {                                                                               \
        if ((vec)->n == (vec)->cap) {                                                  \
            size_t nc_ = (vec)->cap ? (vec)->cap * 2 : 4;                              \
            void *nv_ = jalloc((c), nc_ * sizeof *(vec)->v);                           \
            if ((vec)->n) memcpy(nv_, (vec)->v, (vec)->n * sizeof *(vec)->v);          \
            (vec)->v = nv_;                                                            \
            (vec)->cap = nc_;                                                          \
        }                                                                              \
        (vec)->v[(vec)->n++] = (x);                                                    \
    } while (0)

/* --------------------------------------------------------- string buffer */

static void sb_grow(jctx *c, sbuf *b, size_t add)
{
    if (b->n + add + 1 <= b->cap) return;
    if (b == c->out && c->max_output && b->n + add > c->max_output)
        jfail(c, c->line, FT_ERR_NOMEM, "template output exceeds its limit (%zu bytes)", c->max_output);
    if (b->n + add > ((size_t)1 << 31))
        jfail(c, c->line, FT_ERR_NOMEM, "template string exceeds 2 GiB");
    size_t nc = b->cap ? b->cap * 2 : 64;
    while (nc < b->n + add + 1) nc *= 2;
    char *np = jalloc(c, nc);
    if (b->n) memcpy(np, b->p, b->n);
    b->p = np;
    b->cap = nc;
}

static void sb_add(jctx *c, sbuf *b, const char *s, size_t n)
{
    if (!n) return;
    sb_grow(c, b, n);
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static void sb_adds(jctx *c, sbuf *b, const char *s) { sb_add(c, b, s, strlen(s)); }
static void sb_addc(jctx *c, sbuf *b, char ch) { sb_add(c, b, &ch, 1); }

static void sb_printf(jctx *c, sbuf *b, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void sb_printf(jctx *c, sbuf *b, const char *fmt, ...)
{
    char tmp[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof tmp) { sb_add(c, b, tmp, (size_t)n); return; }
    sb_grow(c, b, (size_t)n);
    va_start(ap, fmt);
    vsnprintf(b->p + b->n, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->n += (size_t)n;
}

/* --------------------------------------------------------- constructors */

static jv *mk(jctx *c, int t)
{
    jv *v = jzalloc(c, sizeof *v);
    v->t = (unsigned char)t;
    return v;
}

static jv *mk_int(jctx *c, int64_t i) { jv *v = mk(c, JV_INT); v->u.i = i; return v; }
static jv *mk_float(jctx *c, double f) { jv *v = mk(c, JV_FLOAT); v->u.f = f; return v; }
static jv *mk_bool(int b) { return b ? &V_TRUE : &V_FALSE; }

static jv *mk_strn(jctx *c, const char *s, size_t n)
{
    if (!n) return &V_EMPTY;
    jv *v = mk(c, JV_STR);
    v->u.s.p = jstrndup(c, s, n);
    v->u.s.n = n;
    return v;
}

static jv *mk_str(jctx *c, const char *s) { return mk_strn(c, s, strlen(s)); }

/* a string that owns the buffer (no copy) */
static jv *mk_str_sb(jctx *c, sbuf *b)
{
    if (!b->n) return &V_EMPTY;
    jv *v = mk(c, JV_STR);
    v->u.s.p = b->p;
    v->u.s.n = b->n;
    return v;
}

static jv *mk_undef(jctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static jv *mk_undef(jctx *c, const char *fmt, ...)
{
    char m[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    jv *v = mk(c, JV_UNDEF);
    v->u.hint = jstrndup(c, m, strlen(m));
    return v;
}

static jv *mk_list(jctx *c, int tuple)
{
    jv *v = mk(c, JV_LIST);
    v->u.l = jzalloc(c, sizeof *v->u.l);
    v->flag = (unsigned char)tuple;
    return v;
}

static jv *mk_dict(jctx *c, int t)
{
    jv *v = mk(c, t);
    v->u.d = jzalloc(c, sizeof *v->u.d);
    return v;
}

static void nest(jctx *c, jv *container, const jv *x)
{
    if ((x->t == JV_LIST || x->t == JV_DICT || x->t == JV_NS) && x->depth + 1 > container->depth) {
        if (x->depth + 1 > MAX_VALUE_DEPTH) jfail(c, c->line, FT_ERR_UNSUPPORTED, "value nested too deeply (limit %d)", MAX_VALUE_DEPTH);
        container->depth = (unsigned short)(x->depth + 1);
    }
}

static void list_push(jctx *c, jv *l, jv *x)
{
    nest(c, l, x);
    VEC_PUSH(c, l->u.l, x);
}

static jv *mk_tuple2(jctx *c, jv *a, jv *b)
{
    jv *t = mk_list(c, 1);
    list_push(c, t, a);
    list_push(c, t, b);
    return t;
}

static const char *type_name(const jv *v)
{
    switch (v->t) {
    case JV_UNDEF: return "Undefined";
    case JV_NONE: return "NoneType";
    case JV_BOOL: return "bool";
    case JV_INT: return "int";
    case JV_FLOAT: return "float";
    case JV_STR: return "str";
    case JV_LIST: {
        static const char *const k[] = {"list", "tuple", "generator", "dict_items", "dict_keys", "dict_values"};
        return k[v->flag];
    }
    case JV_DICT: return "dict";
    case JV_NS: return "Namespace";
    case JV_MACRO: return "Macro";
    case JV_BUILTIN: return "function";
    case JV_METHOD: return "builtin_function_or_method";
    case JV_LOOP: return "LoopContext";
    }
    return "object";
}

/* jinja2's object_type_repr */
static const char *obj_type_repr(const jv *v)
{
    switch (v->t) {
    case JV_NONE: return "None";
    case JV_BOOL: return "bool object";
    case JV_INT: return "int object";
    case JV_FLOAT: return "float object";
    case JV_STR: return "str object";
    case JV_LIST: {
        static const char *const k[] = {"list object", "tuple object", "generator object", "dict_items object",
                                        "dict_keys object", "dict_values object"};
        return k[v->flag];
    }
    case JV_DICT: return "dict object";
    case JV_NS: return "jinja2.utils.Namespace object";
    default: return "object";
    }
}

static _Noreturn void undef_fail(jctx *c, const jv *v)
{
    jfail(c, c->line, FT_ERR_INVALID_ARG, "%s", v->u.hint ? v->u.hint : "undefined value");
}

/* ---------------------------------------------------------- dicts */

static int jv_eq(const jv *a, const jv *b);

static jv *dict_get(const jdict *d, const jv *k)
{
    for (size_t i = 0; i < d->n; i++)
        if (jv_eq(d->k[i], k)) return d->v[i];
    return NULL;
}

static jv *dict_gets(const jdict *d, const char *k)
{
    size_t n = strlen(k);
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i]->t == JV_STR && d->k[i]->u.s.n == n && !memcmp(d->k[i]->u.s.p, k, n)) return d->v[i];
    return NULL;
}

static void dict_set(jctx *c, jdict *d, jv *k, jv *v)
{
    for (size_t i = 0; i < d->n; i++)
        if (jv_eq(d->k[i], k)) { d->v[i] = v; return; }
    if (d->n == d->cap) {
        size_t nc = d->cap ? d->cap * 2 : 4;
        jv **nk = jalloc(c, nc * sizeof *nk), **nv = jalloc(c, nc * sizeof *nv);
        if (d->n) { memcpy(nk, d->k, d->n * sizeof *nk); memcpy(nv, d->v, d->n * sizeof *nv); }
        d->k = nk;
        d->v = nv;
        d->cap = nc;
    }
    d->k[d->n] = k;
    d->v[d->n] = v;
    d->n++;
}

static void dict_sets(jctx *c, jdict *d, const char *k, jv *v) { dict_set(c, d, mk_str(c, k), v); }

static void nest(jctx *c, jv *container, const jv *x);

/* into a dict or namespace value (tracks nesting) */
static void dv_set(jctx *c, jv *d, jv *k, jv *v)
{
    nest(c, d, k);
    nest(c, d, v);
    dict_set(c, d->u.d, k, v);
}

/* ================================================================ UTF-8 */

static size_t u8_dec(const char *s, size_t n, int32_t *cp)
{
    utf8proc_int32_t ch;
    utf8proc_ssize_t l = utf8proc_iterate((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &ch);
    if (l <= 0) { *cp = (unsigned char)s[0]; return 1; }   /* invalid byte: itself */
    *cp = ch;
    return (size_t)l;
}

static size_t u8_enc(int32_t cp, char *out)
{
    utf8proc_ssize_t l = utf8proc_encode_char(cp, (utf8proc_uint8_t *)out);
    return l > 0 ? (size_t)l : 0;
}

static size_t u8_len(const char *s, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        int32_t cp;
        i += u8_dec(s + i, n - i, &cp);
        k++;
    }
    return k;
}

/* byte offset of code point index ci (clamped to n) */
static size_t u8_off(const char *s, size_t n, size_t ci)
{
    size_t i = 0;
    while (ci > 0 && i < n) {
        int32_t cp;
        i += u8_dec(s + i, n - i, &cp);
        ci--;
    }
    return i;
}

/* Python's str.isspace() */
static int py_space(int32_t cp)
{
    if (cp < 0x80) return cp == ' ' || (cp >= 9 && cp <= 13) || (cp >= 0x1c && cp <= 0x1f);
    if (cp == 0x85 || cp == 0xa0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 ||
        cp == 0x2029 || cp == 0x202f || cp == 0x205f || cp == 0x3000)
        return 1;
    return 0;
}

/* Python str.splitlines() separators; *len the separator length in bytes */
static int py_linebreak(const char *s, size_t n, size_t *len)
{
    unsigned char ch = (unsigned char)s[0];
    if (ch == '\r') { *len = (n > 1 && s[1] == '\n') ? 2 : 1; return 1; }
    if (ch == '\n' || ch == 0x0b || ch == 0x0c || ch == 0x1c || ch == 0x1d || ch == 0x1e) { *len = 1; return 1; }
    if (ch == 0xc2 && n > 1 && (unsigned char)s[1] == 0x85) { *len = 2; return 1; }
    if (ch == 0xe2 && n > 2 && (unsigned char)s[1] == 0x80 &&
        ((unsigned char)s[2] == 0xa8 || (unsigned char)s[2] == 0xa9)) { *len = 3; return 1; }
    return 0;
}

static int32_t cp_upper(int32_t cp) { return utf8proc_toupper(cp); }
static int32_t cp_lower(int32_t cp) { return utf8proc_tolower(cp); }
static int32_t cp_title(int32_t cp) { return utf8proc_totitle(cp); }

static int cp_is_cased_upper(int32_t cp) { return utf8proc_isupper(cp); }
static int cp_is_cased_lower(int32_t cp) { return utf8proc_islower(cp); }
static int cp_is_alpha(int32_t cp)
{
    utf8proc_category_t k = utf8proc_category(cp);
    return k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO;
}
static int cp_is_digit(int32_t cp) { return utf8proc_category(cp) == UTF8PROC_CATEGORY_ND; }

static int cp_cased(int32_t cp)
{
    return cp_is_cased_upper(cp) || cp_is_cased_lower(cp) || utf8proc_category(cp) == UTF8PROC_CATEGORY_LT;
}

/* Append the case mapping of cp (mode 0 upper, 1 lower, 2 title) as Python
 * does: the full (SpecialCasing) mapping where it is several characters. */
static void add_case(jctx *c, sbuf *b, int32_t cp, int mode)
{
    size_t lo = 0, hi = sizeof jinja_special_case / sizeof jinja_special_case[0];
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (jinja_special_case[mid].cp < cp) lo = mid + 1;
        else hi = mid;
    }
    if (lo < sizeof jinja_special_case / sizeof jinja_special_case[0] && jinja_special_case[lo].cp == cp) {
        const char *m = mode == 0 ? jinja_special_case[lo].upper : mode == 1 ? jinja_special_case[lo].lower
                                                                            : jinja_special_case[lo].title;
        if (m) { sb_add(c, b, m, strlen(m)); return; }
    }
    int32_t o = mode == 0 ? cp_upper(cp) : mode == 1 ? cp_lower(cp) : cp_title(cp);
    char e[4];
    sb_add(c, b, e, u8_enc(o, e));
}

/* lower-casing of U+03A3 at the end of a word is final sigma (Python does this) */
static int final_sigma(const char *s, size_t n, size_t at, size_t len)
{
    int before = 0, after = 0;
    if (at > 0) {
        size_t st = at - 1;
        while (st > 0 && ((unsigned char)s[st] & 0xc0) == 0x80) st--;
        int32_t cp;
        u8_dec(s + st, at - st, &cp);
        before = cp_cased(cp);
    }
    if (at + len < n) {
        int32_t cp;
        u8_dec(s + at + len, n - at - len, &cp);
        after = cp_cased(cp);
    }
    return before && !after;
}

/* str.upper/lower/capitalize/title/swapcase: mode 0 upper, 1 lower, 2 capitalize, 3 title, 4 swapcase */
static jv *str_case(jctx *c, const jv *s, int mode)
{
    sbuf b = {0};
    int prev_cased = 0, first = 1;
    const char *p = s->u.s.p;
    size_t n = s->u.s.n;
    for (size_t i = 0; i < n;) {
        int32_t cp;
        size_t l = u8_dec(p + i, n - i, &cp);
        int m;
        switch (mode) {
        case 0: m = 0; break;
        case 1: m = 1; break;
        case 2: m = first ? 2 : 1; break;
        case 3: m = prev_cased ? 1 : 2; prev_cased = cp_cased(cp); break;
        default: m = cp_is_cased_upper(cp) ? 1 : cp_is_cased_lower(cp) ? 0 : -1; break;
        }
        first = 0;
        if (m == 1 && cp == 0x3a3 && final_sigma(p, n, i, l)) sb_adds(c, &b, "\xcf\x82");
        else if (m < 0) sb_add(c, &b, p + i, l);
        else add_case(c, &b, cp, m);
        i += l;
    }
    jv *r = mk_str_sb(c, &b);
    if (s->flag && r->u.s.n) r->flag = 1;   /* Markup's methods return Markup */
    return r;
}

/* ============================================================ formatting */

/* Python's repr(float) */
static void fmt_float(jctx *c, sbuf *b, double f, int json)
{
    if (isnan(f)) { sb_adds(c, b, json ? "NaN" : "nan"); return; }
    if (isinf(f)) { sb_adds(c, b, f > 0 ? (json ? "Infinity" : "inf") : (json ? "-Infinity" : "-inf")); return; }
    char buf[64];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*e", prec - 1, f);
        if (strtod(buf, NULL) == f) break;
    }
    if (prec > 17) prec = 17;
    snprintf(buf, sizeof buf, "%.*e", prec - 1, f);
    /* buf: [-]d.ddde[+-]XX */
    char digits[32];
    size_t nd = 0;
    const char *p = buf;
    int neg = 0;
    if (*p == '-') { neg = 1; p++; }
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9') digits[nd++] = *p;
    int ex = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    if (neg) sb_addc(c, b, '-');
    if (ex >= -4 && ex < 16) {
        if (ex < 0) {
            sb_adds(c, b, "0.");
            for (int i = 0; i < -ex - 1; i++) sb_addc(c, b, '0');
            sb_add(c, b, digits, nd);
        } else {
            size_t ip = (size_t)ex + 1;
            for (size_t i = 0; i < ip; i++) sb_addc(c, b, i < nd ? digits[i] : '0');
            sb_addc(c, b, '.');
            if (nd > ip) sb_add(c, b, digits + ip, nd - ip);
            else sb_addc(c, b, '0');
        }
    } else {
        sb_addc(c, b, digits[0]);
        if (nd > 1) { sb_addc(c, b, '.'); sb_add(c, b, digits + 1, nd - 1); }
        sb_printf(c, b, "e%c%02d", ex < 0 ? '-' : '+', ex < 0 ? -ex : ex);
    }
}

static int cp_printable(int32_t cp)
{
    if (cp == ' ') return 1;
    if (cp < 0x20 || cp == 0x7f) return 0;
    if (cp < 0x7f) return 1;
    switch (utf8proc_category(cp)) {
    case UTF8PROC_CATEGORY_CC: case UTF8PROC_CATEGORY_CF: case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO: case UTF8PROC_CATEGORY_CN: case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP: case UTF8PROC_CATEGORY_ZS:
        return 0;
    default:
        return 1;
    }
}

static void repr_str(jctx *c, sbuf *b, const char *s, size_t n)
{
    int sq = memchr(s, '\'', n) != NULL, dq = memchr(s, '"', n) != NULL;
    char q = (sq && !dq) ? '"' : '\'';
    sb_addc(c, b, q);
    for (size_t i = 0; i < n;) {
        int32_t cp;
        size_t l = u8_dec(s + i, n - i, &cp);
        if (cp == q || cp == '\\') { sb_addc(c, b, '\\'); sb_addc(c, b, (char)cp); }
        else if (cp == '\n') sb_adds(c, b, "\\n");
        else if (cp == '\r') sb_adds(c, b, "\\r");
        else if (cp == '\t') sb_adds(c, b, "\\t");
        else if (!cp_printable(cp)) {
            if (cp < 0x100) sb_printf(c, b, "\\x%02x", (unsigned)cp);
            else if (cp < 0x10000) sb_printf(c, b, "\\u%04x", (unsigned)cp);
            else sb_printf(c, b, "\\U%08x", (unsigned)cp);
        } else sb_add(c, b, s + i, l);
        i += l;
    }
    sb_addc(c, b, q);
}

static void fmt_val(jctx *c, sbuf *b, const jv *v, int repr, unsigned depth);

static void fmt_dict_body(jctx *c, sbuf *b, const jdict *d, unsigned depth)
{
    sb_addc(c, b, '{');
    for (size_t i = 0; i < d->n; i++) {
        if (i) sb_adds(c, b, ", ");
        fmt_val(c, b, d->k[i], 1, depth + 1);
        sb_adds(c, b, ": ");
        fmt_val(c, b, d->v[i], 1, depth + 1);
    }
    sb_addc(c, b, '}');
}

/* str(v) (repr = 0) or repr(v) */
static void fmt_val(jctx *c, sbuf *b, const jv *v, int repr, unsigned depth)
{
    if (depth > 200) FAIL("value nested too deeply to print");
    switch (v->t) {
    case JV_UNDEF:
        if (repr) sb_adds(c, b, "Undefined");
        return;
    case JV_NONE: sb_adds(c, b, "None"); return;
    case JV_BOOL: sb_adds(c, b, v->u.b ? "True" : "False"); return;
    case JV_INT: sb_printf(c, b, "%lld", (long long)v->u.i); return;
    case JV_FLOAT: fmt_float(c, b, v->u.f, 0); return;
    case JV_STR:
        if (repr) {
            if (v->flag) sb_adds(c, b, "Markup(");
            repr_str(c, b, v->u.s.p, v->u.s.n);
            if (v->flag) sb_adds(c, b, ")");
        } else sb_add(c, b, v->u.s.p, v->u.s.n);
        return;
    case JV_LIST: {
        int tup = v->flag == LK_TUPLE;
        if (v->flag == LK_GEN) UNSUP("printing an iterator is not supported (jinja2 prints its memory address)");
        if (v->flag > LK_GEN) { sb_adds(c, b, type_name(v)); sb_addc(c, b, '('); }
        sb_addc(c, b, tup ? '(' : '[');
        for (size_t i = 0; i < v->u.l->n; i++) {
            if (i) sb_adds(c, b, ", ");
            fmt_val(c, b, v->u.l->v[i], 1, depth + 1);
        }
        if (tup && v->u.l->n == 1) sb_addc(c, b, ',');
        sb_addc(c, b, tup ? ')' : ']');
        if (v->flag > LK_GEN) sb_addc(c, b, ')');
        return;
    }
    case JV_DICT: fmt_dict_body(c, b, v->u.d, depth); return;
    case JV_NS:
        sb_adds(c, b, "<Namespace ");
        fmt_dict_body(c, b, v->u.d, depth);
        sb_addc(c, b, '>');
        return;
    case JV_MACRO:
        sb_adds(c, b, "<Macro ");
        repr_str(c, b, v->u.m->def->name, strlen(v->u.m->def->name));
        sb_addc(c, b, '>');
        return;
    case JV_LOOP:
        sb_printf(c, b, "<LoopContext %zu/%zu>", v->u.loop->index0 + 1, v->u.loop->items->n);
        return;
    default:
        UNSUP("printing a %s is not supported (Python prints its memory address)", type_name(v));
    }
}

static jv *to_str(jctx *c, jv *v)
{
    if (v->t == JV_STR) return v;
    sbuf b = {0};
    fmt_val(c, &b, v, 0, 0);
    return mk_str_sb(c, &b);
}

/* json.dumps(ensure_ascii, indent, separators, sort_keys) */
typedef struct jsonopt {
    int ensure_ascii, sort_keys;
    const char *indent;       /* NULL: none */
    const char *item_sep, *key_sep;
} jsonopt;

static void json_str(jctx *c, sbuf *b, const char *s, size_t n, int ascii)
{
    sb_addc(c, b, '"');
    for (size_t i = 0; i < n;) {
        int32_t cp;
        size_t l = u8_dec(s + i, n - i, &cp);
        switch (cp) {
        case '"': sb_adds(c, b, "\\\""); break;
        case '\\': sb_adds(c, b, "\\\\"); break;
        case '\n': sb_adds(c, b, "\\n"); break;
        case '\r': sb_adds(c, b, "\\r"); break;
        case '\t': sb_adds(c, b, "\\t"); break;
        case '\b': sb_adds(c, b, "\\b"); break;
        case '\f': sb_adds(c, b, "\\f"); break;
        default:
            if (cp < 0x20) sb_printf(c, b, "\\u%04x", (unsigned)cp);
            else if (ascii && cp > 0x7e) {
                if (cp >= 0x10000) {
                    unsigned v = (unsigned)cp - 0x10000;
                    sb_printf(c, b, "\\u%04x\\u%04x", 0xd800 + (v >> 10), 0xdc00 + (v & 0x3ff));
                } else sb_printf(c, b, "\\u%04x", (unsigned)cp);
            } else sb_add(c, b, s + i, l);
        }
        i += l;
    }
    sb_addc(c, b, '"');
}

static void json_nl(jctx *c, sbuf *b, const jsonopt *o, unsigned level)
{
    sb_addc(c, b, '\n');
    for (unsigned i = 0; i < level; i++) sb_adds(c, b, o->indent);
}

static int jv_cmp(jctx *c, const jv *a, const jv *b);

static void json_key(jctx *c, sbuf *b, const jv *k, const jsonopt *o)
{
    switch (k->t) {
    case JV_STR: json_str(c, b, k->u.s.p, k->u.s.n, o->ensure_ascii); return;
    case JV_INT: sb_printf(c, b, "\"%lld\"", (long long)k->u.i); return;
    case JV_FLOAT: sb_addc(c, b, '"'); fmt_float(c, b, k->u.f, 1); sb_addc(c, b, '"'); return;
    case JV_BOOL: sb_adds(c, b, k->u.b ? "\"true\"" : "\"false\""); return;
    case JV_NONE: sb_adds(c, b, "\"null\""); return;
    default: FAIL("keys must be str, int, float, bool or None, not %s", type_name(k));
    }
}

static void json_val(jctx *c, sbuf *b, const jv *v, const jsonopt *o, unsigned level)
{
    if (level > 200) FAIL("value nested too deeply for tojson");
    switch (v->t) {
    case JV_NONE: sb_adds(c, b, "null"); return;
    case JV_BOOL: sb_adds(c, b, v->u.b ? "true" : "false"); return;
    case JV_INT: sb_printf(c, b, "%lld", (long long)v->u.i); return;
    case JV_FLOAT: fmt_float(c, b, v->u.f, 1); return;
    case JV_STR: json_str(c, b, v->u.s.p, v->u.s.n, o->ensure_ascii); return;
    case JV_LIST: {
        const jvec *l = v->u.l;
        if (v->flag > LK_TUPLE) FAIL("Object of type %s is not JSON serializable", type_name(v));
        if (!l->n) { sb_adds(c, b, "[]"); return; }
        sb_addc(c, b, '[');
        for (size_t i = 0; i < l->n; i++) {
            if (i) sb_adds(c, b, o->item_sep);
            if (o->indent) json_nl(c, b, o, level + 1);
            json_val(c, b, l->v[i], o, level + 1);
        }
        if (o->indent) json_nl(c, b, o, level);
        sb_addc(c, b, ']');
        return;
    }
    case JV_DICT: {
        const jdict *d = v->u.d;
        if (!d->n) { sb_adds(c, b, "{}"); return; }
        size_t *ord = jalloc(c, d->n * sizeof *ord);
        for (size_t i = 0; i < d->n; i++) ord[i] = i;
        if (o->sort_keys)   /* insertion sort: stable, keys compared as Python does */
            for (size_t i = 1; i < d->n; i++)
                for (size_t j = i; j > 0 && jv_cmp(c, d->k[ord[j - 1]], d->k[ord[j]]) > 0; j--) {
                    size_t t = ord[j]; ord[j] = ord[j - 1]; ord[j - 1] = t;
                }
        sb_addc(c, b, '{');
        for (size_t i = 0; i < d->n; i++) {
            if (i) sb_adds(c, b, o->item_sep);
            if (o->indent) json_nl(c, b, o, level + 1);
            json_key(c, b, d->k[ord[i]], o);
            sb_adds(c, b, o->key_sep);
            json_val(c, b, d->v[ord[i]], o, level + 1);
        }
        if (o->indent) json_nl(c, b, o, level);
        sb_addc(c, b, '}');
        return;
    }
    default:
        FAIL("Object of type %s is not JSON serializable", type_name(v));
    }
}

/* ================================================================ lexer */

enum { T_EOF, T_DATA, T_VBEGIN, T_VEND, T_BBEGIN, T_BEND, T_NAME, T_STR, T_INT, T_FLOAT, T_OP };
enum { TO_FLOORDIV = 256, TO_POW, TO_EQ, TO_NE, TO_GE, TO_LE };

typedef struct tok {
    int t;
    int op;
    const char *s;       /* NAME/DATA: into the normalized source; STR: decoded (arena) */
    size_t n;
    int64_t i;
    double f;
    int line;
} tok;

static void tok_push(jctx *c, tok t)
{
    if (c->ntok == c->tcap) {
        size_t nc = c->tcap ? c->tcap * 2 : 256;
        tok *nt = jalloc(c, nc * sizeof *nt);
        if (c->ntok) memcpy(nt, c->toks, c->ntok * sizeof *nt);
        c->toks = nt;
        c->tcap = nc;
    }
    c->toks[c->ntok++] = t;
}

static int re_space(unsigned char ch) { return ch == ' ' || (ch >= 9 && ch <= 13) || (ch >= 0x1c && ch <= 0x1f); }

/* Python's str.rstrip() length (unicode whitespace) */
static size_t py_rstrip_len(const char *s, size_t n)
{
    while (n > 0) {
        size_t st = n - 1;
        while (st > 0 && ((unsigned char)s[st] & 0xc0) == 0x80) st--;
        int32_t cp;
        u8_dec(s + st, n - st, &cp);
        if (!py_space(cp)) break;
        n = st;
    }
    return n;
}

static size_t py_lstrip_off(const char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        int32_t cp;
        size_t l = u8_dec(s + i, n - i, &cp);
        if (!py_space(cp)) break;
        i += l;
    }
    return i;
}

static int count_nl(const char *s, size_t n)
{
    int k = 0;
    for (size_t i = 0; i < n; i++) k += s[i] == '\n';
    return k;
}

/* Emit the text before a tag with jinja2's strip rules. sign: '-', '+' or 0. */
static void lex_text(jctx *c, const char *s, size_t n, int sign, int lstrip, int line_starting, int line)
{
    if (sign == '-') n = py_rstrip_len(s, n);
    else if (sign != '+' && lstrip) {
        size_t l_pos = n;
        while (l_pos > 0 && s[l_pos - 1] != '\n') l_pos--;
        if ((l_pos > 0 || line_starting) && n > l_pos) {
            size_t k = l_pos + py_lstrip_off(s + l_pos, n - l_pos);
            if (k == n) n = l_pos;
        }
    }
    if (n) tok_push(c, (tok){.t = T_DATA, .s = s, .n = n, .line = line});
}

static int hexval(char ch)
{
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    return -1;
}

/* Decode a string literal body as Python's unicode-escape codec does. */
static void lex_string(jctx *c, const char *s, size_t n, tok *t)
{
    sbuf b = {0};
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '\\' || i + 1 >= n) { sb_addc(c, &b, s[i]); continue; }
        char e = s[++i];
        int32_t cp = -1;
        switch (e) {
        case '\n': continue;
        case '\\': cp = '\\'; break;
        case '\'': cp = '\''; break;
        case '"': cp = '"'; break;
        case 'a': cp = 7; break;
        case 'b': cp = 8; break;
        case 'f': cp = 12; break;
        case 'n': cp = 10; break;
        case 'r': cp = 13; break;
        case 't': cp = 9; break;
        case 'v': cp = 11; break;
        case 'x': case 'u': case 'U': {
            int nd = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            cp = 0;
            for (int k = 0; k < nd; k++) {
                int h = i + 1 + (size_t)k < n ? hexval(s[i + 1 + k]) : -1;
                if (h < 0) jfail(c, t->line, FT_ERR_CORRUPT, "truncated \\%c escape in a string literal", e);
                cp = cp * 16 + h;
            }
            i += (size_t)nd;
            if (cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
                jfail(c, t->line, FT_ERR_UNSUPPORTED, "string literal escape \\%c names no character", e);
            break;
        }
        case 'N':
            jfail(c, t->line, FT_ERR_UNSUPPORTED, "\\N{...} escapes in string literals are not supported");
        default:
            if (e >= '0' && e <= '7') {
                cp = e - '0';
                for (int k = 0; k < 2 && i + 1 < n && s[i + 1] >= '0' && s[i + 1] <= '7'; k++) cp = cp * 8 + (s[++i] - '0');
            } else {
                sb_addc(c, &b, '\\');
                sb_addc(c, &b, e);
                continue;
            }
        }
        char u[4];
        sb_add(c, &b, u, u8_enc(cp, u));
    }
    t->s = b.p ? b.p : "";
    t->n = b.n;
}

static int is_name0(unsigned char ch) { return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_'; }
static int is_name1(unsigned char ch) { return is_name0(ch) || (ch >= '0' && ch <= '9'); }
static int is_dig(unsigned char ch) { return ch >= '0' && ch <= '9'; }

/* digits with single underscores between: returns the end */
static size_t lex_digits(const char *s, size_t i, size_t n)
{
    if (i >= n || !is_dig((unsigned char)s[i])) return i;
    i++;
    while (i < n) {
        if (is_dig((unsigned char)s[i])) i++;
        else if (s[i] == '_' && i + 1 < n && is_dig((unsigned char)s[i + 1])) i += 2;
        else break;
    }
    return i;
}

/* Tokens inside {{ }} or {% %}; returns the position after the end tag. */
static size_t lex_tag(jctx *c, size_t pos, int var, int *line, int *line_starting)
{
    const char *s = c->src;
    size_t n = c->srclen;
    int bal = 0;
    char stack[256];
    for (;;) {
        if (pos >= n) jfail(c, *line, FT_ERR_CORRUPT, "unexpected end of template inside a %s tag", var ? "{{ }}" : "{% %}");
        if (bal == 0) {
            const char *end = var ? "}}" : "%}";
            if ((s[pos] == '-' || s[pos] == '+') && pos + 2 < n + 0 && pos + 3 <= n && !memcmp(s + pos + 1, end, 2)) {
                int minus = s[pos] == '-';
                pos += 3;
                tok_push(c, (tok){.t = var ? T_VEND : T_BEND, .line = *line});
                if (minus) {
                    size_t k = py_lstrip_off(s + pos, n - pos);
                    *line += count_nl(s + pos, k);
                    pos += k;
                }
                *line_starting = pos > 0 && s[pos - 1] == '\n';
                return pos;
            }
            if (pos + 2 <= n && !memcmp(s + pos, end, 2)) {
                pos += 2;
                tok_push(c, (tok){.t = var ? T_VEND : T_BEND, .line = *line});
                if (!var && pos < n && s[pos] == '\n') { pos++; (*line)++; }
                *line_starting = s[pos - 1] == '\n';
                return pos;
            }
        }
        unsigned char ch = (unsigned char)s[pos];
        if (re_space(ch)) { if (ch == '\n') (*line)++; pos++; continue; }
        if (ch >= 0x80) {   /* Python's \s is Unicode whitespace */
            int32_t cp;
            size_t l = u8_dec(s + pos, n - pos, &cp);
            if (py_space(cp)) { pos += l; continue; }
        }
        tok t = {.line = *line};
        if (is_dig(ch)) {
            size_t e = lex_digits(s, pos, n);
            size_t fe = e;
            int isf = 0;
            if (fe < n && s[fe] == '.' && fe + 1 < n && is_dig((unsigned char)s[fe + 1])) { fe = lex_digits(s, fe + 1, n); isf = 1; }
            if (fe < n && (s[fe] == 'e' || s[fe] == 'E')) {
                size_t k = fe + 1;
                if (k < n && (s[k] == '+' || s[k] == '-')) k++;
                size_t ke = lex_digits(s, k, n);
                if (ke > k) { fe = ke; isf = 1; }
            }
            char num[128];
            size_t m = 0;
            for (size_t k = pos; k < (isf ? fe : e) && m < sizeof num - 1; k++)
                if (s[k] != '_') num[m++] = s[k];
            num[m] = 0;
            if (isf) { t.t = T_FLOAT; t.f = strtod(num, NULL); pos = fe; }
            else {
                if (m > 1 && num[0] == '0' && (num[1] == 'x' || num[1] == 'X' || num[1] == 'b' || num[1] == 'o'))
                    jfail(c, *line, FT_ERR_UNSUPPORTED, "hex/octal/binary integer literals are not supported");
                if (m > 18) jfail(c, *line, FT_ERR_UNSUPPORTED, "integer literal too large");
                t.t = T_INT;
                t.i = strtoll(num, NULL, 10);
                pos = e;
            }
            tok_push(c, t);
            continue;
        }
        if (is_name0(ch)) {
            size_t e = pos + 1;
            while (e < n && is_name1((unsigned char)s[e])) e++;
            t.t = T_NAME;
            t.s = s + pos;
            t.n = e - pos;
            tok_push(c, t);
            pos = e;
            continue;
        }
        if (ch == '\'' || ch == '"') {
            size_t e = pos + 1;
            while (e < n && s[e] != (char)ch) {
                if (s[e] == '\\' && e + 1 < n) e++;
                e++;
            }
            if (e >= n) jfail(c, *line, FT_ERR_CORRUPT, "unterminated string literal");
            t.t = T_STR;
            lex_string(c, s + pos + 1, e - pos - 1, &t);
            *line += count_nl(s + pos, e - pos);
            tok_push(c, t);
            pos = e + 1;
            continue;
        }
        t.t = T_OP;
        if (pos + 1 < n) {
            char d = s[pos + 1];
            int two = 0;
            if (ch == '/' && d == '/') two = TO_FLOORDIV;
            else if (ch == '*' && d == '*') two = TO_POW;
            else if (ch == '=' && d == '=') two = TO_EQ;
            else if (ch == '!' && d == '=') two = TO_NE;
            else if (ch == '>' && d == '=') two = TO_GE;
            else if (ch == '<' && d == '=') two = TO_LE;
            if (two) { t.op = two; tok_push(c, t); pos += 2; continue; }
        }
        if (!strchr("+-/*%~[](){}><=.:|,;", ch) || !ch)
            jfail(c, *line, FT_ERR_CORRUPT, "unexpected character '%c' in a tag", ch >= 0x20 && ch < 0x7f ? ch : '?');
        if (ch == '(' || ch == '[' || ch == '{') {
            if (bal >= (int)sizeof stack) jfail(c, *line, FT_ERR_UNSUPPORTED, "brackets nested too deeply");
            stack[bal++] = (char)ch;
        } else if (ch == ')' || ch == ']' || ch == '}') {
            char want = ch == ')' ? '(' : ch == ']' ? '[' : '{';
            if (bal == 0) jfail(c, *line, FT_ERR_CORRUPT, "unexpected '%c'", ch);
            if (stack[bal - 1] != want) jfail(c, *line, FT_ERR_CORRUPT, "unexpected '%c', expected the match of '%c'", ch, stack[bal - 1]);
            bal--;
        }
        t.op = ch;
        tok_push(c, t);
        pos++;
    }
}

/* {%[-+]? raw [-+]?%} at pos? *end: after it, *trail: strip following whitespace */
static int match_word_tag(const char *s, size_t n, size_t pos, const char *word, size_t *end, int *lsign, int *rminus)
{
    if (pos + 2 > n || s[pos] != '{' || s[pos + 1] != '%') return 0;
    size_t i = pos + 2;
    *lsign = 0;
    if (i < n && (s[i] == '-' || s[i] == '+')) *lsign = s[i++];
    while (i < n && re_space((unsigned char)s[i])) i++;
    size_t wl = strlen(word);
    if (i + wl > n || memcmp(s + i, word, wl)) return 0;
    i += wl;
    if (i < n && is_name1((unsigned char)s[i])) return 0;
    while (i < n && re_space((unsigned char)s[i])) i++;
    *rminus = 0;
    if (i < n && (s[i] == '-' || s[i] == '+')) { *rminus = s[i] == '-' ? 1 : 2; i++; }
    if (i + 2 > n || s[i] != '%' || s[i + 1] != '}') return 0;
    *end = i + 2;
    return 1;
}

static void lex(jctx *c)
{
    const char *s = c->src;
    size_t n = c->srclen, pos = 0;
    int line = 1, line_starting = 1;
    while (pos < n) {
        size_t k = pos;
        for (; k + 1 < n; k++)
            if (s[k] == '{' && (s[k + 1] == '{' || s[k + 1] == '%' || s[k + 1] == '#')) break;
        if (k + 1 >= n) {
            tok_push(c, (tok){.t = T_DATA, .s = s + pos, .n = n - pos, .line = line});
            break;
        }
        char kind = s[k + 1];
        int sign = (k + 2 < n && (s[k + 2] == '-' || s[k + 2] == '+')) ? s[k + 2] : 0;
        lex_text(c, s + pos, k - pos, sign, kind != '{', line_starting, line);
        line += count_nl(s + pos, k - pos);
        size_t end;
        int lsign, rm;
        if (kind == '%' && match_word_tag(s, n, k, "raw", &end, &lsign, &rm)) {
            int rawline = line;
            pos = end;
            if (rm == 1) pos += py_lstrip_off(s + pos, n - pos);
            line += count_nl(s + k, pos - k);
            size_t q = pos;
            for (;; q++) {
                if (q + 1 >= n) jfail(c, rawline, FT_ERR_CORRUPT, "missing end of raw directive");
                if (match_word_tag(s, n, q, "endraw", &end, &lsign, &rm)) break;
            }
            lex_text(c, s + pos, q - pos, lsign, 1, 0, line);
            line += count_nl(s + pos, end - pos);
            pos = end;
            if (rm == 1) { size_t w = py_lstrip_off(s + pos, n - pos); line += count_nl(s + pos, w); pos += w; }
            else if (rm == 0 && pos < n && s[pos] == '\n') { pos++; line++; }
            line_starting = s[pos - 1] == '\n';
            continue;
        }
        if (kind == '#') {
            size_t q = k + 2 + (sign ? 1 : 0);
            while (q + 1 < n && !(s[q] == '#' && s[q + 1] == '}')) q++;
            if (q + 1 >= n) jfail(c, line, FT_ERR_CORRUPT, "missing end of comment tag");
            size_t body = k + 2 + (sign ? 1 : 0);
            int minus = q > body && s[q - 1] == '-', plus = q > body && s[q - 1] == '+';
            size_t e = q + 2;
            if (minus) e += py_lstrip_off(s + e, n - e);
            else if (!plus && e < n && s[e] == '\n') e++;
            line += count_nl(s + k, e - k);
            pos = e;
            line_starting = s[pos - 1] == '\n';
            continue;
        }
        tok_push(c, (tok){.t = kind == '{' ? T_VBEGIN : T_BBEGIN, .line = line});
        pos = lex_tag(c, k + 2 + (sign ? 1 : 0), kind == '{', &line, &line_starting);
    }
    tok_push(c, (tok){.t = T_EOF, .line = line});
}

/* ================================================================ parser */

static const char *const known_filters[] = {
    "abs", "attr", "batch", "capitalize", "center", "count", "d", "default", "dictsort", "e", "escape",
    "filesizeformat", "first", "float", "forceescape", "format", "groupby", "indent", "int", "join", "last",
    "length", "list", "lower", "items", "map", "min", "max", "pprint", "random", "reject", "rejectattr",
    "replace", "reverse", "round", "safe", "select", "selectattr", "slice", "sort", "string", "striptags",
    "sum", "title", "trim", "truncate", "unique", "upper", "urlencode", "urlize", "wordcount", "wordwrap",
    "xmlattr", "tojson", NULL};
static const char *const known_tests[] = {
    "odd", "even", "divisibleby", "defined", "undefined", "filter", "test", "none", "boolean", "false", "true",
    "integer", "float", "lower", "upper", "string", "mapping", "number", "sequence", "iterable", "callable",
    "sameas", "escaped", "in", "==", "eq", "equalto", "!=", "ne", ">", "gt", "greaterthan", "ge", ">=", "<",
    "lt", "lessthan", "<=", "le", NULL};

static int in_list(const char *const *l, const char *s)
{
    for (; *l; l++)
        if (!strcmp(*l, s)) return 1;
    return 0;
}

static tok *cur(jctx *c) { return &c->toks[c->tpos]; }
static tok *peek(jctx *c, size_t k) { size_t i = c->tpos + k; return &c->toks[i < c->ntok ? i : c->ntok - 1]; }
static void adv(jctx *c) { if (c->tpos + 1 < c->ntok) c->tpos++; }
static int tok_is_name(const tok *t, const char *w) { return t->t == T_NAME && t->n == strlen(w) && !memcmp(t->s, w, t->n); }
static int tok_is_op(const tok *t, int op) { return t->t == T_OP && t->op == op; }

static const char *tok_desc(jctx *c, const tok *t)
{
    static const char *names[] = {"end of template", "template data", "'{{'", "'}}'", "'{%'", "'%}'"};
    if (t->t <= T_BEND) return names[t->t];
    if (t->t == T_NAME) return jstrndup(c, t->s, t->n);
    if (t->t == T_STR) return "string";
    if (t->t == T_INT || t->t == T_FLOAT) return "number";
    switch (t->op) {
    case TO_FLOORDIV: return "'//'";
    case TO_POW: return "'**'";
    case TO_EQ: return "'=='";
    case TO_NE: return "'!='";
    case TO_GE: return "'>='";
    case TO_LE: return "'<='";
    }
    char *p = jalloc(c, 4);
    p[0] = '\''; p[1] = (char)t->op; p[2] = '\''; p[3] = 0;
    return p;
}

static _Noreturn void perr(jctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static _Noreturn void perr(jctx *c, const char *fmt, ...)
{
    char m[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    jfail(c, cur(c)->line, FT_ERR_CORRUPT, "template syntax error: %s", m);
}

static void expect_op(jctx *c, int op)
{
    if (!tok_is_op(cur(c), op)) {
        char want[8] = {'\'', (char)op, '\'', 0};
        perr(c, "expected %s, got %s", want, tok_desc(c, cur(c)));
    }
    adv(c);
}

static const char *expect_name(jctx *c)
{
    tok *t = cur(c);
    if (t->t != T_NAME) perr(c, "expected a name, got %s", tok_desc(c, t));
    adv(c);
    return jstrndup(c, t->s, t->n);
}

static node *mknode(jctx *c, int kind, int line)
{
    node *n = jzalloc(c, sizeof *n);
    n->kind = kind;
    n->line = line;
    return n;
}

static node *parse_expr(jctx *c, int with_condexpr);
static node *parse_tuple(jctx *c, int simplified, int with_condexpr, const char *extra_end, int explicit_parens);
static node *parse_unary(jctx *c, int with_filter);
static node *parse_primary(jctx *c);
static node *parse_postfix(jctx *c, node *n);
static node *parse_filter_expr(jctx *c, node *n);

static void enter(jctx *c)
{
    if (++c->pdepth > 200) perr(c, "expression nested too deeply");
}

static callargs *parse_call_args(jctx *c)
{
    callargs *ca = jzalloc(c, sizeof *ca);
    size_t nkw = 0, kwcap = 0;
    expect_op(c, '(');
    int first = 1;
    while (!tok_is_op(cur(c), ')')) {
        if (!first) {
            expect_op(c, ',');
            if (tok_is_op(cur(c), ')')) break;
        }
        first = 0;
        if (tok_is_op(cur(c), '*')) {
            adv(c);
            ca->dyn_args = parse_expr(c, 1);
        } else if (tok_is_op(cur(c), TO_POW)) {
            adv(c);
            ca->dyn_kwargs = parse_expr(c, 1);
        } else if (cur(c)->t == T_NAME && tok_is_op(peek(c, 1), '=')) {
            const char *k = expect_name(c);
            adv(c);
            if (nkw == kwcap) {
                size_t nc = kwcap ? kwcap * 2 : 4;
                const char **nk = jalloc(c, nc * sizeof *nk);
                if (nkw) memcpy(nk, ca->kwnames, nkw * sizeof *nk);
                ca->kwnames = nk;
                kwcap = nc;
            }
            ca->kwnames[nkw++] = k;
            VEC_PUSH(c, &ca->kwvals, parse_expr(c, 1));
        } else {
            if (ca->kwvals.n) perr(c, "positional argument follows keyword argument");
            VEC_PUSH(c, &ca->args, parse_expr(c, 1));
        }
    }
    adv(c);
    return ca;
}

static node *parse_expr(jctx *c, int with_condexpr);

static node *parse_or(jctx *c);

static node *parse_condexpr(jctx *c)
{
    node *e1 = parse_or(c);
    while (tok_is_name(cur(c), "if")) {
        int line = cur(c)->line;
        adv(c);
        node *e2 = parse_or(c);
        node *e3 = NULL;
        if (tok_is_name(cur(c), "else")) { adv(c); e3 = parse_condexpr(c); }
        node *n = mknode(c, E_COND, line);
        n->a = e2; n->b = e1; n->c = e3;
        e1 = n;
    }
    return e1;
}

static node *parse_expr(jctx *c, int with_condexpr)
{
    enter(c);
    node *n = with_condexpr ? parse_condexpr(c) : parse_or(c);
    c->pdepth--;
    return n;
}

static node *parse_not(jctx *c);
static node *parse_and(jctx *c)
{
    node *l = parse_not(c);
    while (tok_is_name(cur(c), "and")) {
        int line = cur(c)->line;
        adv(c);
        node *n = mknode(c, E_AND, line);
        n->a = l; n->b = parse_not(c);
        l = n;
    }
    return l;
}

static node *parse_or(jctx *c)
{
    node *l = parse_and(c);
    while (tok_is_name(cur(c), "or")) {
        int line = cur(c)->line;
        adv(c);
        node *n = mknode(c, E_OR, line);
        n->a = l; n->b = parse_and(c);
        l = n;
    }
    return l;
}

static node *parse_compare(jctx *c);
static node *parse_not(jctx *c)
{
    if (tok_is_name(cur(c), "not")) {
        int line = cur(c)->line;
        adv(c);
        enter(c);
        node *n = mknode(c, E_NOT, line);
        n->a = parse_not(c);
        c->pdepth--;
        return n;
    }
    return parse_compare(c);
}

static node *parse_math1(jctx *c);
static node *parse_compare(jctx *c)
{
    int line = cur(c)->line;
    node *e = parse_math1(c);
    node *cmp = NULL;
    size_t cap = 0;
    for (;;) {
        tok *t = cur(c);
        int op = 0;
        if (t->t == T_OP) {
            switch (t->op) {
            case TO_EQ: op = OP_EQ; break;
            case TO_NE: op = OP_NE; break;
            case '<': op = OP_LT; break;
            case TO_LE: op = OP_LE; break;
            case '>': op = OP_GT; break;
            case TO_GE: op = OP_GE; break;
            }
            if (op) adv(c);
        } else if (tok_is_name(t, "in")) { op = OP_IN; adv(c); }
        else if (tok_is_name(t, "not") && tok_is_name(peek(c, 1), "in")) { op = OP_NOTIN; adv(c); adv(c); }
        if (!op) break;
        if (!cmp) {
            cmp = mknode(c, E_CMP, line);
            VEC_PUSH(c, &cmp->items, e);
        }
        if (cmp->items.n - 1 == cap) {
            size_t nc = cap ? cap * 2 : 4;
            int *no = jalloc(c, nc * sizeof *no);
            if (cap) memcpy(no, cmp->ops, cap * sizeof *no);
            cmp->ops = no;
            cap = nc;
        }
        cmp->ops[cmp->items.n - 1] = op;
        VEC_PUSH(c, &cmp->items, parse_math1(c));
    }
    return cmp ? cmp : e;
}

static node *parse_concat(jctx *c);
static node *binop(jctx *c, int op, node *l, node *r, int line)
{
    node *n = mknode(c, E_BIN, line);
    n->op = op; n->a = l; n->b = r;
    return n;
}

static node *parse_math1(jctx *c)
{
    node *l = parse_concat(c);
    while (tok_is_op(cur(c), '+') || tok_is_op(cur(c), '-')) {
        int op = cur(c)->op == '+' ? OP_ADD : OP_SUB, line = cur(c)->line;
        adv(c);
        l = binop(c, op, l, parse_concat(c), line);
    }
    return l;
}

static node *parse_math2(jctx *c);
static node *parse_concat(jctx *c)
{
    int line = cur(c)->line;
    node *first = parse_math2(c);
    if (!tok_is_op(cur(c), '~')) return first;
    node *n = mknode(c, E_CONCAT, line);
    VEC_PUSH(c, &n->items, first);
    while (tok_is_op(cur(c), '~')) {
        adv(c);
        VEC_PUSH(c, &n->items, parse_math2(c));
    }
    return n;
}

static node *parse_pow(jctx *c);
static node *parse_math2(jctx *c)
{
    node *l = parse_pow(c);
    for (;;) {
        tok *t = cur(c);
        int op = tok_is_op(t, '*') ? OP_MUL : tok_is_op(t, '/') ? OP_DIV : tok_is_op(t, TO_FLOORDIV) ? OP_FLOORDIV
                 : tok_is_op(t, '%') ? OP_MOD : 0;
        if (!op) break;
        int line = t->line;
        adv(c);
        l = binop(c, op, l, parse_pow(c), line);
    }
    return l;
}

static node *parse_pow(jctx *c)
{
    node *l = parse_unary(c, 1);
    while (tok_is_op(cur(c), TO_POW)) {
        int line = cur(c)->line;
        adv(c);
        l = binop(c, OP_POW, l, parse_unary(c, 1), line);
    }
    return l;
}

static node *parse_unary(jctx *c, int with_filter)
{
    enter(c);
    tok *t = cur(c);
    node *n;
    if (tok_is_op(t, '-') || tok_is_op(t, '+')) {
        adv(c);
        n = mknode(c, t->op == '-' ? E_NEG : E_POS, t->line);
        n->a = parse_unary(c, 0);
    } else {
        n = parse_primary(c);
    }
    n = parse_postfix(c, n);
    if (with_filter) n = parse_filter_expr(c, n);
    c->pdepth--;
    return n;
}

static node *parse_primary(jctx *c)
{
    tok *t = cur(c);
    node *n;
    if (t->t == T_NAME) {
        adv(c);
        if (tok_is_name(t, "true") || tok_is_name(t, "True")) { n = mknode(c, E_CONST, t->line); n->val = &V_TRUE; }
        else if (tok_is_name(t, "false") || tok_is_name(t, "False")) { n = mknode(c, E_CONST, t->line); n->val = &V_FALSE; }
        else if (tok_is_name(t, "none") || tok_is_name(t, "None")) { n = mknode(c, E_CONST, t->line); n->val = &V_NONE; }
        else { n = mknode(c, E_NAME, t->line); n->name = jstrndup(c, t->s, t->n); }
        return n;
    }
    if (t->t == T_STR) {
        sbuf b = {0};
        int line = t->line;
        while (cur(c)->t == T_STR) { sb_add(c, &b, cur(c)->s, cur(c)->n); adv(c); }
        n = mknode(c, E_CONST, line);
        n->val = mk_str_sb(c, &b);
        return n;
    }
    if (t->t == T_INT || t->t == T_FLOAT) {
        adv(c);
        n = mknode(c, E_CONST, t->line);
        n->val = t->t == T_INT ? mk_int(c, t->i) : mk_float(c, t->f);
        return n;
    }
    if (tok_is_op(t, '(')) {
        adv(c);
        n = parse_tuple(c, 0, 1, NULL, 1);
        expect_op(c, ')');
        return n;
    }
    if (tok_is_op(t, '[')) {
        adv(c);
        n = mknode(c, E_LIST, t->line);
        while (!tok_is_op(cur(c), ']')) {
            if (n->items.n) expect_op(c, ',');
            if (tok_is_op(cur(c), ']')) break;
            VEC_PUSH(c, &n->items, parse_expr(c, 1));
        }
        adv(c);
        return n;
    }
    if (tok_is_op(t, '{')) {
        adv(c);
        n = mknode(c, E_DICT, t->line);
        while (!tok_is_op(cur(c), '}')) {
            if (n->items.n) expect_op(c, ',');
            if (tok_is_op(cur(c), '}')) break;
            VEC_PUSH(c, &n->items, parse_expr(c, 1));
            expect_op(c, ':');
            VEC_PUSH(c, &n->items2, parse_expr(c, 1));
        }
        adv(c);
        return n;
    }
    perr(c, "unexpected %s", tok_desc(c, t));
}

/* tuple or single expression; extra_end: a name that ends it */
static node *parse_tuple(jctx *c, int simplified, int with_condexpr, const char *extra_end, int explicit_parens)
{
    int line = cur(c)->line;
    node *tup = mknode(c, E_TUPLE, line);
    int is_tuple = 0;
    for (;;) {
        if (tup->items.n) expect_op(c, ',');
        tok *t = cur(c);
        if (t->t == T_VEND || t->t == T_BEND || t->t == T_EOF || tok_is_op(t, ')') || tok_is_op(t, ']') ||
            (extra_end && tok_is_name(t, extra_end)))
            break;
        node *e = simplified ? parse_primary(c) : parse_expr(c, with_condexpr);
        VEC_PUSH(c, &tup->items, e);
        if (tok_is_op(cur(c), ',')) is_tuple = 1;
        else break;
    }
    if (!is_tuple) {
        if (tup->items.n) return tup->items.v[0];
        if (!explicit_parens) perr(c, "expected an expression, got %s", tok_desc(c, cur(c)));
    }
    return tup;
}

static node *parse_subscribed(jctx *c)
{
    node *args[3] = {NULL, NULL, NULL};
    int line = cur(c)->line;
    if (tok_is_op(cur(c), ':')) {
        adv(c);
    } else {
        node *e = parse_expr(c, 1);
        if (!tok_is_op(cur(c), ':')) return e;
        adv(c);
        args[0] = e;
    }
    if (!tok_is_op(cur(c), ']') && !tok_is_op(cur(c), ',') && !tok_is_op(cur(c), ':')) args[1] = parse_expr(c, 1);
    if (tok_is_op(cur(c), ':')) {
        adv(c);
        if (!tok_is_op(cur(c), ']') && !tok_is_op(cur(c), ',')) args[2] = parse_expr(c, 1);
    }
    node *s = mknode(c, E_SLICE, line);
    s->b = args[0]; s->c = args[1]; s->d = args[2];
    return s;
}

static node *parse_postfix(jctx *c, node *n)
{
    for (;;) {
        tok *t = cur(c);
        if (tok_is_op(t, '.')) {
            adv(c);
            tok *a = cur(c);
            if (a->t == T_NAME) {
                adv(c);
                node *g = mknode(c, E_GETATTR, t->line);
                g->a = n;
                g->name = jstrndup(c, a->s, a->n);
                n = g;
            } else if (a->t == T_INT) {
                adv(c);
                node *g = mknode(c, E_GETITEM, t->line);
                g->a = n;
                g->b = mknode(c, E_CONST, t->line);
                g->b->val = mk_int(c, a->i);
                n = g;
            } else perr(c, "expected a name or number after '.'");
        } else if (tok_is_op(t, '[')) {
            adv(c);
            node *sub = parse_subscribed(c);
            if (tok_is_op(cur(c), ',')) {
                node *tup = mknode(c, E_TUPLE, t->line);
                VEC_PUSH(c, &tup->items, sub);
                while (tok_is_op(cur(c), ',')) {
                    adv(c);
                    if (tok_is_op(cur(c), ']')) break;
                    VEC_PUSH(c, &tup->items, parse_subscribed(c));
                }
                for (size_t i = 0; i < tup->items.n; i++)
                    if (tup->items.v[i]->kind == E_SLICE)
                        jfail(c, t->line, FT_ERR_UNSUPPORTED, "slices inside a tuple subscript are not supported");
                sub = tup;
            }
            expect_op(c, ']');
            if (sub->kind == E_SLICE) { sub->a = n; n = sub; }
            else {
                node *g = mknode(c, E_GETITEM, t->line);
                g->a = n;
                g->b = sub;
                n = g;
            }
        } else if (tok_is_op(t, '(')) {
            node *call = mknode(c, E_CALL, t->line);
            call->a = n;
            call->ca = parse_call_args(c);
            n = call;
        } else break;
    }
    return n;
}

static const char *parse_dotted_name(jctx *c)
{
    const char *name = expect_name(c);
    while (tok_is_op(cur(c), '.')) {
        adv(c);
        const char *more = expect_name(c);
        char *j = jalloc(c, strlen(name) + strlen(more) + 2);
        sprintf(j, "%s.%s", name, more);
        name = j;
    }
    return name;
}

static node *parse_filter(jctx *c, node *base, int start_inline)
{
    while (tok_is_op(cur(c), '|') || start_inline) {
        if (!start_inline) adv(c);
        start_inline = 0;
        int line = cur(c)->line;
        const char *name = parse_dotted_name(c);
        node *f = mknode(c, E_FILTER, line);
        f->op = !in_list(known_filters, name);   /* checked by check_names */
        f->name = name;
        f->a = base;
        f->ca = tok_is_op(cur(c), '(') ? parse_call_args(c) : jzalloc(c, sizeof(callargs));
        base = f;
    }
    return base;
}

static node *parse_test(jctx *c, node *n)
{
    int line = cur(c)->line;
    adv(c);   /* is */
    int negated = 0;
    if (tok_is_name(cur(c), "not")) { adv(c); negated = 1; }
    const char *name = parse_dotted_name(c);
    node *t = mknode(c, E_TEST, line);
    t->op = !in_list(known_tests, name);   /* checked by check_names */
    t->name = name;
    t->a = n;
    tok *k = cur(c);
    if (tok_is_op(k, '(')) t->ca = parse_call_args(c);
    else {
        t->ca = jzalloc(c, sizeof(callargs));
        if ((k->t == T_NAME || k->t == T_STR || k->t == T_INT || k->t == T_FLOAT || tok_is_op(k, '[') ||
             tok_is_op(k, '{')) &&
            !tok_is_name(k, "else") && !tok_is_name(k, "or") && !tok_is_name(k, "and")) {
            if (tok_is_name(k, "is")) perr(c, "you cannot chain multiple tests with is");
            node *arg = parse_postfix(c, parse_primary(c));
            VEC_PUSH(c, &t->ca->args, arg);
        }
    }
    if (negated) {
        node *nn = mknode(c, E_NOT, line);
        nn->a = t;
        return nn;
    }
    return t;
}

static node *parse_filter_expr(jctx *c, node *n)
{
    for (;;) {
        if (tok_is_op(cur(c), '|')) n = parse_filter(c, n, 0);
        else if (tok_is_name(cur(c), "is")) n = parse_test(c, n);
        else if (tok_is_op(cur(c), '(')) {
            node *call = mknode(c, E_CALL, cur(c)->line);
            call->a = n;
            call->ca = parse_call_args(c);
            n = call;
        } else break;
    }
    return n;
}

/* ---------------------------------------------------------- statements */

static void parse_body(jctx *c, svec *body, const char *const *ends);

static target *parse_target(jctx *c, int with_tuple, int with_ns, const char *extra_end)
{
    int line = cur(c)->line;
    target *t;
    if (with_ns && cur(c)->t == T_NAME && tok_is_op(peek(c, 1), '.') && peek(c, 2)->t == T_NAME) {
        t = jzalloc(c, sizeof *t);
        t->kind = 2;
        t->name = expect_name(c);
        adv(c);
        t->attr = expect_name(c);
        t->line = line;
        return t;
    }
    /* names, possibly a tuple, possibly parenthesised */
    target **subs = NULL;
    size_t n = 0, cap = 0;
    int is_tuple = 0;
    for (;;) {
        if (n) expect_op(c, ',');
        tok *k = cur(c);
        if (n && (k->t == T_BEND || tok_is_op(k, ')') || (extra_end && tok_is_name(k, extra_end))))
            break;
        target *s;
        if (tok_is_op(k, '(')) {
            adv(c);
            s = parse_target(c, 1, 0, NULL);
            expect_op(c, ')');
        } else {
            s = jzalloc(c, sizeof *s);
            s->kind = 0;
            s->line = k->line;
            s->name = expect_name(c);
            if (!strcmp(s->name, "true") || !strcmp(s->name, "false") || !strcmp(s->name, "none") ||
                !strcmp(s->name, "True") || !strcmp(s->name, "False") || !strcmp(s->name, "None"))
                perr(c, "can't assign to '%s'", s->name);
        }
        if (n == cap) {
            size_t nc = cap ? cap * 2 : 4;
            target **ns = jalloc(c, nc * sizeof *ns);
            if (n) memcpy(ns, subs, n * sizeof *ns);
            subs = ns;
            cap = nc;
        }
        subs[n++] = s;
        if (!with_tuple) break;
        if (tok_is_op(cur(c), ',')) is_tuple = 1;
        else break;
    }
    if (!is_tuple) return subs[0];
    t = jzalloc(c, sizeof *t);
    t->kind = 1;
    t->sub = subs;
    t->nsub = n;
    t->line = line;
    return t;
}

static void expect_bend(jctx *c)
{
    if (cur(c)->t != T_BEND) perr(c, "expected end of statement block, got %s", tok_desc(c, cur(c)));
    adv(c);
}

static stmt *mkstmt(jctx *c, int kind, int line)
{
    stmt *s = jzalloc(c, sizeof *s);
    s->kind = kind;
    s->line = line;
    return s;
}

/* After parse_body stopped at {% NAME: consume the name (already checked) */
static const char *end_tag(jctx *c)
{
    tok *t = cur(c);
    adv(c);
    return jstrndup(c, t->s, t->n);
}

static void parse_macro_sig(jctx *c, macrodef *m)
{
    expect_op(c, '(');
    size_t cap = 0;
    while (!tok_is_op(cur(c), ')')) {
        if (m->nparams) expect_op(c, ',');
        if (tok_is_op(cur(c), ')')) break;
        const char *p = expect_name(c);
        node *def = NULL;
        if (tok_is_op(cur(c), '=')) { adv(c); def = parse_expr(c, 1); }
        else if (m->nparams && m->defaults[m->nparams - 1]) perr(c, "non-default argument follows default argument");
        if (m->nparams == cap) {
            size_t nc = cap ? cap * 2 : 4;
            const char **np = jalloc(c, nc * sizeof *np);
            node **nd = jalloc(c, nc * sizeof *nd);
            if (cap) { memcpy(np, m->params, cap * sizeof *np); memcpy(nd, m->defaults, cap * sizeof *nd); }
            m->params = np;
            m->defaults = nd;
            cap = nc;
        }
        m->params[m->nparams] = p;
        m->defaults[m->nparams] = def;
        m->nparams++;
    }
    adv(c);
}

/* does the body mention NAME (caller, varargs, kwargs)? approximate: any NAME token between the bounds */
static int mentions(jctx *c, size_t from, size_t to, const char *name)
{
    for (size_t i = from; i < to && i < c->ntok; i++)
        if (tok_is_name(&c->toks[i], name)) return 1;
    return 0;
}

static stmt *parse_stmt(jctx *c)
{
    tok *t = cur(c);
    int line = t->line;
    if (t->t != T_NAME) perr(c, "tag name expected");
    static const char *const e_for[] = {"endfor", "else", NULL}, *const e_endfor[] = {"endfor", NULL};
    static const char *const e_if[] = {"elif", "else", "endif", NULL}, *const e_endif[] = {"endif", NULL};
    static const char *const e_set[] = {"endset", NULL}, *const e_macro[] = {"endmacro", NULL};
    static const char *const e_call[] = {"endcall", NULL}, *const e_filter[] = {"endfilter", NULL};
    static const char *const e_gen[] = {"endgeneration", NULL}, *const e_with[] = {"endwith", NULL};
    if (tok_is_name(t, "for")) {
        adv(c);
        stmt *s = mkstmt(c, S_FOR, line);
        s->tgt = parse_target(c, 1, 0, "in");
        if (!tok_is_name(cur(c), "in")) perr(c, "expected 'in'");
        adv(c);
        s->expr = parse_tuple(c, 0, 0, "recursive", 0);
        if (tok_is_name(cur(c), "if")) { adv(c); s->filt = parse_expr(c, 1); }
        if (tok_is_name(cur(c), "recursive")) { adv(c); s->recursive = 1; }
        expect_bend(c);
        parse_body(c, &s->body, e_for);
        if (!strcmp(end_tag(c), "else")) {
            expect_bend(c);
            parse_body(c, &s->orelse, e_endfor);
            end_tag(c);
        }
        expect_bend(c);
        return s;
    }
    if (tok_is_name(t, "if")) {
        adv(c);
        stmt *s = mkstmt(c, S_IF, line), *top = s;
        s->expr = parse_tuple(c, 0, 1, NULL, 0);
        expect_bend(c);
        for (;;) {
            parse_body(c, &s->body, e_if);
            int eline = cur(c)->line;
            const char *e = end_tag(c);
            if (!strcmp(e, "elif")) {
                stmt *n = mkstmt(c, S_IF, eline);
                n->expr = parse_tuple(c, 0, 1, NULL, 0);
                expect_bend(c);
                VEC_PUSH(c, &s->orelse, n);
                s = n;
                continue;
            }
            if (!strcmp(e, "else")) {
                expect_bend(c);
                parse_body(c, &s->orelse, e_endif);
                end_tag(c);
            }
            break;
        }
        expect_bend(c);
        return top;
    }
    if (tok_is_name(t, "set")) {
        adv(c);
        target *tg = parse_target(c, 1, 1, NULL);
        if (tok_is_op(cur(c), '=')) {
            adv(c);
            stmt *s = mkstmt(c, S_SET, line);
            s->tgt = tg;
            s->expr = parse_tuple(c, 0, 1, NULL, 0);
            expect_bend(c);
            return s;
        }
        stmt *s = mkstmt(c, S_SETBLOCK, line);
        s->tgt = tg;
        if (tok_is_op(cur(c), '|')) s->filt = parse_filter(c, NULL, 0);
        expect_bend(c);
        parse_body(c, &s->body, e_set);
        end_tag(c);
        expect_bend(c);
        return s;
    }
    if (tok_is_name(t, "macro")) {
        adv(c);
        stmt *s = mkstmt(c, S_MACRO, line);
        macrodef *m = jzalloc(c, sizeof *m);
        m->name = expect_name(c);
        parse_macro_sig(c, m);
        expect_bend(c);
        size_t from = c->tpos;
        parse_body(c, &m->body, e_macro);
        m->uses_caller = mentions(c, from, c->tpos, "caller");
        m->uses_varargs = mentions(c, from, c->tpos, "varargs");
        m->uses_kwargs = mentions(c, from, c->tpos, "kwargs");
        end_tag(c);
        if (cur(c)->t == T_NAME) adv(c);   /* {% endmacro name %} */
        expect_bend(c);
        s->macro = m;
        return s;
    }
    if (tok_is_name(t, "call")) {
        adv(c);
        stmt *s = mkstmt(c, S_CALLBLOCK, line);
        macrodef *m = jzalloc(c, sizeof *m);
        m->name = "caller";
        if (tok_is_op(cur(c), '(')) parse_macro_sig(c, m);
        s->expr = parse_expr(c, 1);
        if (s->expr->kind != E_CALL) perr(c, "expected a call");
        expect_bend(c);
        parse_body(c, &m->body, e_call);
        end_tag(c);
        expect_bend(c);
        s->macro = m;
        return s;
    }
    if (tok_is_name(t, "filter")) {
        adv(c);
        stmt *s = mkstmt(c, S_FILTERBLOCK, line);
        s->filt = parse_filter(c, NULL, 1);
        expect_bend(c);
        parse_body(c, &s->body, e_filter);
        end_tag(c);
        expect_bend(c);
        return s;
    }
    if (tok_is_name(t, "generation")) {   /* transformers' AssistantTracker: renders its body */
        adv(c);
        stmt *s = mkstmt(c, S_SCOPE, line);
        expect_bend(c);
        parse_body(c, &s->body, e_gen);
        end_tag(c);
        expect_bend(c);
        return s;
    }
    if (tok_is_name(t, "with")) {
        adv(c);
        stmt *s = mkstmt(c, S_WITH, line);
        size_t cap = 0;
        while (cur(c)->t != T_BEND) {
            if (s->nwith) expect_op(c, ',');
            target *tg = parse_target(c, 0, 0, NULL);
            expect_op(c, '=');
            node *v = parse_expr(c, 1);
            if (s->nwith == cap) {
                size_t nc = cap ? cap * 2 : 4;
                target **nt = jalloc(c, nc * sizeof *nt);
                node **nv = jalloc(c, nc * sizeof *nv);
                if (cap) { memcpy(nt, s->wtargets, cap * sizeof *nt); memcpy(nv, s->wvals, cap * sizeof *nv); }
                s->wtargets = nt;
                s->wvals = nv;
                cap = nc;
            }
            s->wtargets[s->nwith] = tg;
            s->wvals[s->nwith] = v;
            s->nwith++;
        }
        expect_bend(c);
        parse_body(c, &s->body, e_with);
        end_tag(c);
        expect_bend(c);
        return s;
    }
    if (tok_is_name(t, "break") || tok_is_name(t, "continue")) {
        adv(c);
        expect_bend(c);
        return mkstmt(c, tok_is_name(t, "break") ? S_BREAK : S_CONTINUE, line);
    }
    const char *name = jstrndup(c, t->s, t->n);
    if (!strcmp(name, "include") || !strcmp(name, "extends") || !strcmp(name, "import") || !strcmp(name, "from") ||
        !strcmp(name, "block") || !strcmp(name, "autoescape"))
        jfail(c, line, FT_ERR_UNSUPPORTED, "the '%s' tag is not supported in chat templates", name);
    jfail(c, line, FT_ERR_CORRUPT, "template syntax error: encountered unknown tag '%s'", name);
}

static void parse_body(jctx *c, svec *body, const char *const *ends)
{
    if (++c->pdepth > 200) perr(c, "blocks nested too deeply");
    for (;;) {
        tok *t = cur(c);
        if (t->t == T_EOF) {
            if (ends) {
                char want[200] = "";
                for (const char *const *e = ends; *e; e++) {
                    strncat(want, e == ends ? "'" : " or '", sizeof want - strlen(want) - 1);
                    strncat(want, *e, sizeof want - strlen(want) - 1);
                    strncat(want, "'", sizeof want - strlen(want) - 1);
                }
                perr(c, "unexpected end of template, expected %s", want);
            }
            break;
        }
        if (t->t == T_DATA) {
            stmt *s = mkstmt(c, S_DATA, t->line);
            s->data = t->s;
            s->len = t->n;
            VEC_PUSH(c, body, s);
            adv(c);
            continue;
        }
        if (t->t == T_VBEGIN) {
            adv(c);
            stmt *s = mkstmt(c, S_PRINT, t->line);
            s->expr = parse_tuple(c, 0, 1, NULL, 0);
            if (cur(c)->t != T_VEND) perr(c, "expected '}}', got %s", tok_desc(c, cur(c)));
            adv(c);
            VEC_PUSH(c, body, s);
            continue;
        }
        if (t->t == T_BBEGIN) {
            adv(c);
            tok *k = cur(c);
            if (ends && k->t == T_NAME) {
                for (const char *const *e = ends; *e; e++)
                    if (tok_is_name(k, *e)) { c->pdepth--; return; }
            }
            if (k->t == T_NAME && k->n > 3 && !memcmp(k->s, "end", 3))
                perr(c, "unexpected '%s'", tok_desc(c, k));
            if (k->t == T_NAME && (tok_is_name(k, "else") || tok_is_name(k, "elif")))
                perr(c, "unexpected '%s'", tok_desc(c, k));
            VEC_PUSH(c, body, parse_stmt(c));
            continue;
        }
        perr(c, "unexpected %s", tok_desc(c, t));
    }
    c->pdepth--;
}

/* jinja2 refuses an unknown filter or test when it compiles the template,
 * except inside an if statement or an if expression (a "soft frame"),
 * where the error is raised only if the filter runs. */
static void check_expr(jctx *c, node *n, int soft)
{
    if (!n) return;
    if (n->kind == E_COND) soft = 1;
    if ((n->kind == E_FILTER || n->kind == E_TEST) && n->op && !soft)
        jfail(c, n->line, FT_ERR_CORRUPT, "template error: no %s named '%s'", n->kind == E_FILTER ? "filter" : "test",
              n->name);
    check_expr(c, n->a, soft);
    check_expr(c, n->b, soft);
    check_expr(c, n->c, soft);
    check_expr(c, n->d, soft);
    for (size_t i = 0; i < n->items.n; i++) check_expr(c, n->items.v[i], soft);
    for (size_t i = 0; i < n->items2.n; i++) check_expr(c, n->items2.v[i], soft);
    if (n->ca) {
        for (size_t i = 0; i < n->ca->args.n; i++) check_expr(c, n->ca->args.v[i], soft);
        for (size_t i = 0; i < n->ca->kwvals.n; i++) check_expr(c, n->ca->kwvals.v[i], soft);
        check_expr(c, n->ca->dyn_args, soft);
        check_expr(c, n->ca->dyn_kwargs, soft);
    }
}

static void check_body(jctx *c, const svec *b, int soft);

static void check_macro(jctx *c, const macrodef *m, int soft)
{
    for (size_t i = 0; i < m->nparams; i++) check_expr(c, m->defaults[i], soft);
    check_body(c, &m->body, 0);
}

static void check_body(jctx *c, const svec *b, int soft)
{
    for (size_t i = 0; i < b->n; i++) {
        const stmt *s = b->v[i];
        switch (s->kind) {
        case S_PRINT: case S_SET: check_expr(c, s->expr, soft); break;
        case S_IF: check_expr(c, s->expr, 1); check_body(c, &s->body, 1); check_body(c, &s->orelse, 1); break;
        case S_FOR:
            check_expr(c, s->expr, soft);
            check_expr(c, s->filt, 0);
            check_body(c, &s->body, 0);
            check_body(c, &s->orelse, 0);
            break;
        case S_SETBLOCK: case S_FILTERBLOCK: check_expr(c, s->filt, 0); check_body(c, &s->body, 0); break;
        case S_MACRO: check_macro(c, s->macro, soft); break;
        case S_CALLBLOCK: check_expr(c, s->expr, soft); check_macro(c, s->macro, soft); break;
        case S_WITH:
            for (size_t k = 0; k < s->nwith; k++) check_expr(c, s->wvals[k], soft);
            check_body(c, &s->body, 0);
            break;
        case S_SCOPE: check_body(c, &s->body, 0); break;
        default: break;
        }
    }
}

/* ============================================================ semantics */

static void step(jctx *c)
{
    if (++c->steps > c->max_steps)
        jfail(c, c->line, FT_ERR_NOMEM, "template render exceeds its step limit (%llu): a loop that does not end?",
              (unsigned long long)c->max_steps);
}

static int truthy(const jv *v)
{
    switch (v->t) {
    case JV_UNDEF: case JV_NONE: return 0;
    case JV_BOOL: return v->u.b;
    case JV_INT: return v->u.i != 0;
    case JV_FLOAT: return v->u.f != 0.0;
    case JV_STR: return v->u.s.n != 0;
    case JV_LIST: return v->flag == LK_GEN || v->u.l->n != 0;
    case JV_DICT: return v->u.d->n != 0;
    default: return 1;
    }
}

static int is_num(const jv *v) { return v->t == JV_INT || v->t == JV_FLOAT || v->t == JV_BOOL; }
static double num_f(const jv *v) { return v->t == JV_FLOAT ? v->u.f : v->t == JV_INT ? (double)v->u.i : v->u.b; }
static int64_t num_i(const jv *v) { return v->t == JV_INT ? v->u.i : v->u.b; }

static int jv_eq(const jv *a, const jv *b)
{
    if (is_num(a) && is_num(b)) {
        if (a->t == JV_FLOAT || b->t == JV_FLOAT) return num_f(a) == num_f(b);
        return num_i(a) == num_i(b);
    }
    if (a->t != b->t) return 0;
    switch (a->t) {
    case JV_UNDEF: case JV_NONE: return 1;
    case JV_STR: return a->u.s.n == b->u.s.n && !memcmp(a->u.s.p, b->u.s.p, a->u.s.n);
    case JV_LIST:
        if (a->flag == LK_GEN || b->flag == LK_GEN) return a == b;
        if (a->flag != b->flag || a->u.l->n != b->u.l->n) return 0;
        for (size_t i = 0; i < a->u.l->n; i++)
            if (!jv_eq(a->u.l->v[i], b->u.l->v[i])) return 0;
        return 1;
    case JV_DICT: case JV_NS:
        if (a->t == JV_NS) return a->u.d == b->u.d;
        if (a->u.d->n != b->u.d->n) return 0;
        for (size_t i = 0; i < a->u.d->n; i++) {
            jv *o = dict_get(b->u.d, a->u.d->k[i]);
            if (!o || !jv_eq(a->u.d->v[i], o)) return 0;
        }
        return 1;
    case JV_MACRO: return a->u.m == b->u.m;
    case JV_BUILTIN: return a->u.bi == b->u.bi;
    case JV_LOOP: return a->u.loop == b->u.loop;
    default: return a == b;
    }
}

/* Python ordering; raises TypeError for unorderable types */
static int jv_cmp(jctx *c, const jv *a, const jv *b)
{
    if (a->t == JV_UNDEF) undef_fail(c, a);
    if (b->t == JV_UNDEF) undef_fail(c, b);
    if (is_num(a) && is_num(b)) {
        if (a->t == JV_FLOAT || b->t == JV_FLOAT) {
            double x = num_f(a), y = num_f(b);
            return x < y ? -1 : x > y ? 1 : 0;
        }
        int64_t x = num_i(a), y = num_i(b);
        return x < y ? -1 : x > y ? 1 : 0;
    }
    if (a->t == JV_STR && b->t == JV_STR) {
        size_t m = a->u.s.n < b->u.s.n ? a->u.s.n : b->u.s.n;
        int r = memcmp(a->u.s.p, b->u.s.p, m);
        if (r) return r < 0 ? -1 : 1;
        return a->u.s.n < b->u.s.n ? -1 : a->u.s.n > b->u.s.n ? 1 : 0;
    }
    if (a->t == JV_LIST && b->t == JV_LIST && a->flag == b->flag && a->flag <= LK_TUPLE) {
        size_t m = a->u.l->n < b->u.l->n ? a->u.l->n : b->u.l->n;
        for (size_t i = 0; i < m; i++) {
            if (jv_eq(a->u.l->v[i], b->u.l->v[i])) continue;
            return jv_cmp(c, a->u.l->v[i], b->u.l->v[i]);
        }
        return a->u.l->n < b->u.l->n ? -1 : a->u.l->n > b->u.l->n ? 1 : 0;
    }
    FAIL("'<' not supported between instances of '%s' and '%s'", type_name(a), type_name(b));
}

/* iterate: list of items (dict: keys, str: characters) */
static jvec *iter_items(jctx *c, jv *v)
{
    switch (v->t) {
    case JV_UNDEF: return jzalloc(c, sizeof(jvec));
    case JV_LIST:
        if (v->flag == LK_GEN) {
            if (v->used) return jzalloc(c, sizeof(jvec));
            v->used = 1;
        }
        return v->u.l;
    case JV_DICT: {
        jvec *l = jzalloc(c, sizeof *l);
        for (size_t i = 0; i < v->u.d->n; i++) VEC_PUSH(c, l, v->u.d->k[i]);
        return l;
    }
    case JV_STR: {
        jvec *l = jzalloc(c, sizeof *l);
        for (size_t i = 0; i < v->u.s.n;) {
            int32_t cp;
            size_t k = u8_dec(v->u.s.p + i, v->u.s.n - i, &cp);
            VEC_PUSH(c, l, mk_strn(c, v->u.s.p + i, k));
            i += k;
            step(c);
        }
        return l;
    }
    default:
        FAIL("'%s' object is not iterable", type_name(v));
    }
}

static jv *as_list(jctx *c, jv *v)
{
    jv *l = mk_list(c, 0);
    jvec *it = iter_items(c, v);
    for (size_t i = 0; i < it->n; i++) list_push(c, l, it->v[i]);
    return l;
}

static int jv_contains(jctx *c, jv *hay, jv *needle)
{
    switch (hay->t) {
    case JV_STR:
        if (needle->t != JV_STR) FAIL("'in <string>' requires string as left operand, not %s", type_name(needle));
        return needle->u.s.n == 0 || memmem(hay->u.s.p, hay->u.s.n, needle->u.s.p, needle->u.s.n) != NULL;
    case JV_LIST:
        for (size_t i = 0; i < hay->u.l->n; i++) if (jv_eq(hay->u.l->v[i], needle)) return 1;
        return 0;
    case JV_DICT: return dict_get(hay->u.d, needle) != NULL;
    case JV_UNDEF: return 0;
    default: FAIL("argument of type '%s' is not iterable", type_name(hay));
    }
}

static size_t jv_len(jctx *c, jv *v)
{
    switch (v->t) {
    case JV_STR: return u8_len(v->u.s.p, v->u.s.n);
    case JV_LIST:
        if (v->flag == LK_GEN) FAIL("object of type 'generator' has no len()");
        return v->u.l->n;
    case JV_DICT: return v->u.d->n;
    case JV_UNDEF: return 0;
    default: FAIL("object of type '%s' has no len()", type_name(v));
    }
}

static jv *markup_escape(jctx *c, jv *v)
{
    if (v->t == JV_STR && v->flag) return v;
    jv *s = to_str(c, v);
    sbuf b = {0};
    for (size_t i = 0; i < s->u.s.n; i++) {
        char ch = s->u.s.p[i];
        switch (ch) {
        case '&': sb_adds(c, &b, "&amp;"); break;
        case '<': sb_adds(c, &b, "&lt;"); break;
        case '>': sb_adds(c, &b, "&gt;"); break;
        case '\'': sb_adds(c, &b, "&#39;"); break;
        case '"': sb_adds(c, &b, "&#34;"); break;
        default: sb_addc(c, &b, ch);
        }
    }
    jv *r = mk(c, JV_STR);
    r->u.s.p = b.p ? b.p : "";
    r->u.s.n = b.n;
    r->flag = 1;
    return r;
}

static jv *str_concat(jctx *c, jv *a, jv *b, int markup)
{
    sbuf s = {0};
    sb_add(c, &s, a->u.s.p, a->u.s.n);
    sb_add(c, &s, b->u.s.p, b->u.s.n);
    jv *r = mk(c, JV_STR);
    r->u.s.p = s.p ? s.p : "";
    r->u.s.n = s.n;
    r->flag = (unsigned char)markup;
    return r;
}

static jv *str_percent(jctx *c, jv *s, jv *args);

static int64_t py_floordiv(int64_t a, int64_t b)
{
    int64_t q = a / b;
    if ((a % b != 0) && ((a < 0) != (b < 0))) q--;
    return q;
}

static jv *arith(jctx *c, int op, jv *a, jv *b)
{
    if (a->t == JV_UNDEF) undef_fail(c, a);
    if (b->t == JV_UNDEF) undef_fail(c, b);
    static const char *const sym[] = {"", "+", "-", "*", "/", "//", "%", "**"};
    if (op == OP_ADD) {
        if (a->t == JV_STR && b->t == JV_STR) {
            if (a->flag || b->flag) return str_concat(c, markup_escape(c, a), markup_escape(c, b), 1);
            return str_concat(c, a, b, 0);
        }
        if (a->t == JV_LIST && b->t == JV_LIST && a->flag == b->flag && a->flag <= LK_TUPLE) {
            jv *r = mk_list(c, a->flag);
            for (size_t i = 0; i < a->u.l->n; i++) { list_push(c, r, a->u.l->v[i]); step(c); }
            for (size_t i = 0; i < b->u.l->n; i++) { list_push(c, r, b->u.l->v[i]); step(c); }
            return r;
        }
    }
    if (op == OP_MUL && a->t == JV_LIST && a->flag > LK_TUPLE) FAIL("unsupported operand type(s) for *: '%s' and '%s'", type_name(a), type_name(b));
    if (op == OP_MUL && ((a->t == JV_STR || a->t == JV_LIST) && (b->t == JV_INT || b->t == JV_BOOL))) {
        int64_t k = num_i(b);
        jv *r;
        if (a->t == JV_STR) {
            sbuf s = {0};
            for (int64_t i = 0; i < k; i++) { sb_add(c, &s, a->u.s.p, a->u.s.n); step(c); }
            r = mk_str_sb(c, &s);
        } else {
            r = mk_list(c, a->flag);
            for (int64_t i = 0; i < k; i++) {
                for (size_t j = 0; j < a->u.l->n; j++) list_push(c, r, a->u.l->v[j]);
                step(c);
            }
        }
        return r;
    }
    if (op == OP_MUL && ((b->t == JV_STR || b->t == JV_LIST) && (a->t == JV_INT || a->t == JV_BOOL)))
        return arith(c, op, b, a);
    if (op == OP_MOD && a->t == JV_STR) return str_percent(c, a, b);
    if (!is_num(a) || !is_num(b))
        FAIL("unsupported operand type(s) for %s: '%s' and '%s'", sym[op], type_name(a), type_name(b));
    int fl = a->t == JV_FLOAT || b->t == JV_FLOAT;
    if (op == OP_DIV) {
        double y = num_f(b);
        if (y == 0) FAIL("division by zero");
        return mk_float(c, num_f(a) / y);
    }
    if (fl) {
        double x = num_f(a), y = num_f(b), r;
        switch (op) {
        case OP_ADD: r = x + y; break;
        case OP_SUB: r = x - y; break;
        case OP_MUL: r = x * y; break;
        case OP_FLOORDIV: case OP_MOD: {   /* CPython's _float_div_mod */
            if (y == 0) FAIL(op == OP_MOD ? "float modulo" : "float floor division by zero");
            double mod = fmod(x, y), div = (x - mod) / y;
            if (mod != 0) {
                if ((y < 0) != (mod < 0)) { mod += y; div -= 1.0; }
            } else mod = copysign(0.0, y);
            double fd;
            if (div != 0) {
                fd = floor(div);
                if (div - fd > 0.5) fd += 1.0;
            } else fd = copysign(0.0, x / y);
            r = op == OP_MOD ? mod : fd;
            break;
        }
        default: r = pow(x, y); break;
        }
        return mk_float(c, r);
    }
    int64_t x = num_i(a), y = num_i(b), r;
    switch (op) {
    case OP_ADD: if (__builtin_add_overflow(x, y, &r)) goto ovf; break;
    case OP_SUB: if (__builtin_sub_overflow(x, y, &r)) goto ovf; break;
    case OP_MUL: if (__builtin_mul_overflow(x, y, &r)) goto ovf; break;
    case OP_FLOORDIV:
        if (y == 0) FAIL("integer division or modulo by zero");
        if (x == INT64_MIN && y == -1) goto ovf;
        r = py_floordiv(x, y);
        break;
    case OP_MOD:
        if (y == 0) FAIL("integer division or modulo by zero");
        if (y == -1) { r = 0; break; }
        r = x % y;
        if (r != 0 && ((r < 0) != (y < 0))) r += y;
        break;
    default:
        if (y < 0) return mk_float(c, pow((double)x, (double)y));
        r = 1;
        for (int64_t i = 0; i < y; i++) {
            if (__builtin_mul_overflow(r, x, &r)) goto ovf;
            if (r == 0 || r == 1) break;
            step(c);
        }
        break;
    }
    return mk_int(c, r);
ovf:
    UNSUP("integer arithmetic beyond 64 bits is not supported");
}

/* ------------------------------------------------------ attribute access */

static const char *const str_methods[] = {
    "capitalize", "casefold", "center", "count", "encode", "endswith", "expandtabs", "find", "format", "format_map",
    "index", "isalnum", "isalpha", "isascii", "isdecimal", "isdigit", "isidentifier", "islower", "isnumeric",
    "isprintable", "isspace", "istitle", "isupper", "join", "ljust", "lower", "lstrip", "maketrans", "partition",
    "removeprefix", "removesuffix", "replace", "rfind", "rindex", "rjust", "rpartition", "rsplit", "rstrip", "split",
    "splitlines", "startswith", "strip", "swapcase", "title", "translate", "upper", "zfill", NULL};
static const char *const dict_methods[] = {"copy", "fromkeys", "get", "items", "keys", "values", NULL};
static const char *const dict_mutators[] = {"clear", "pop", "popitem", "setdefault", "update", NULL};
static const char *const list_methods[] = {"copy", "count", "index", NULL};
static const char *const list_mutators[] = {"append", "clear", "extend", "insert", "pop", "remove", "reverse", "sort", NULL};

static jv *mk_method(jctx *c, jv *self, const char *name)
{
    jv *m = mk(c, JV_METHOD);
    m->u.me.self = self;
    m->u.me.name = name;
    return m;
}

static jv *unsafe_undef(jctx *c, jv *obj, const char *name)
{
    jv *u = mk_undef(c, "access to attribute '%s' of '%s' object is unsafe.", name, type_name(obj));
    u->flag = 1;
    return u;
}

static jv *loop_attr(jctx *c, struct jloop *l, const char *name);

/* environment.getattr of the sandbox: Python attribute first, then item */
static jv *get_attr(jctx *c, jv *obj, const char *name)
{
    if (obj->t == JV_UNDEF) undef_fail(c, obj);
    if (name[0] == '_') {
        /* dunder attributes exist on every object; the sandbox refuses them */
        if (obj->t == JV_DICT) { jv *v = dict_gets(obj->u.d, name); if (v) return v; }
        if (obj->t == JV_NS) { jv *v = dict_gets(obj->u.d, name); if (v) return v; }
        return unsafe_undef(c, obj, name);
    }
    switch (obj->t) {
    case JV_STR:
        if (in_list(str_methods, name)) return mk_method(c, obj, name);
        break;
    case JV_DICT:
        if (in_list(dict_methods, name)) return mk_method(c, obj, name);
        if (in_list(dict_mutators, name)) return unsafe_undef(c, obj, name);
        {
            jv *v = dict_gets(obj->u.d, name);
            if (v) return v;
        }
        break;
    case JV_LIST:
        if (obj->flag == LK_LIST || (obj->flag == LK_TUPLE && strcmp(name, "copy"))) {
            if (in_list(list_methods, name)) return mk_method(c, obj, name);
            if (obj->flag == LK_LIST && in_list(list_mutators, name)) return unsafe_undef(c, obj, name);
        }
        break;
    case JV_NS: {
        jv *v = dict_gets(obj->u.d, name);
        if (v) return v;
        break;
    }
    case JV_LOOP: return loop_attr(c, obj->u.loop, name);
    case JV_MACRO:
        if (!strcmp(name, "name")) return mk_str(c, obj->u.m->def->name);
        break;
    default: break;
    }
    return mk_undef(c, "'%s' has no attribute '%s'", obj_type_repr(obj), name);
}

static jv *get_item(jctx *c, jv *obj, jv *key)
{
    if (obj->t == JV_UNDEF) undef_fail(c, obj);
    switch (obj->t) {
    case JV_DICT: {
        jv *v = dict_get(obj->u.d, key);
        if (v) return v;
        break;
    }
    case JV_LIST: case JV_STR:
        if ((key->t == JV_INT || key->t == JV_BOOL) && !(obj->t == JV_LIST && obj->flag > LK_TUPLE)) {
            int64_t i = num_i(key);
            if (obj->t == JV_LIST) {
                int64_t n = (int64_t)obj->u.l->n;
                if (i < 0) i += n;
                if (i >= 0 && i < n) return obj->u.l->v[i];
            } else {
                int64_t n = (int64_t)u8_len(obj->u.s.p, obj->u.s.n);
                if (i < 0) i += n;
                if (i >= 0 && i < n) {
                    size_t o = u8_off(obj->u.s.p, obj->u.s.n, (size_t)i);
                    int32_t cp;
                    return mk_strn(c, obj->u.s.p + o, u8_dec(obj->u.s.p + o, obj->u.s.n - o, &cp));
                }
            }
            return mk_undef(c, "%s has no element %lld", obj_type_repr(obj), (long long)num_i(key));
        }
        break;
    case JV_LOOP: case JV_NS: break;
    default: break;
    }
    if (key->t == JV_STR) {
        const char *name = jstrndup(c, key->u.s.p, key->u.s.n);
        jv *v = get_attr(c, obj, name);
        return v;
    }
    sbuf b = {0};
    fmt_val(c, &b, key, 1, 0);
    return mk_undef(c, "%s has no element %s", obj_type_repr(obj), b.p ? b.p : "");
}

static int64_t slice_idx(jctx *c, jv *v, int64_t n, int64_t def, int step_neg)
{
    if (!v || v->t == JV_NONE) return def;
    if (v->t != JV_INT && v->t != JV_BOOL) FAIL("slice indices must be integers or None");
    int64_t i = num_i(v);
    if (i < 0) { i += n; if (i < 0) i = step_neg ? -1 : 0; }
    else if (i >= n) i = step_neg ? n - 1 : n;
    return i;
}

static jv *do_slice(jctx *c, jv *obj, jv *start, jv *stop, jv *stepv)
{
    if (obj->t == JV_UNDEF) undef_fail(c, obj);
    int64_t st = 1;
    if (stepv && stepv->t != JV_NONE) {
        if (stepv->t != JV_INT) FAIL("slice indices must be integers or None");
        st = stepv->u.i;
        if (st == 0) FAIL("slice step cannot be zero");
    }
    jvec *items;
    if (obj->t == JV_STR) items = iter_items(c, obj);
    else if (obj->t == JV_LIST) items = obj->u.l;
    else return mk_undef(c, "%s is not subscriptable", obj_type_repr(obj));
    int64_t n = (int64_t)items->n;
    int64_t a = slice_idx(c, start, n, st > 0 ? 0 : n - 1, st < 0);
    int64_t b = slice_idx(c, stop, n, st > 0 ? n : -1, st < 0);
    jv *r = mk_list(c, obj->t == JV_LIST ? obj->flag : 0);
    if (obj->t == JV_LIST && obj->flag > LK_TUPLE) return mk_undef(c, "%s is not subscriptable", obj_type_repr(obj));
    if (st > 0) for (int64_t i = a; i < b; i += st) list_push(c, r, items->v[i]);
    else for (int64_t i = a; i > b; i += st) list_push(c, r, items->v[i]);
    if (obj->t == JV_STR) {
        sbuf s = {0};
        for (size_t i = 0; i < r->u.l->n; i++) sb_add(c, &s, r->u.l->v[i]->u.s.p, r->u.l->v[i]->u.s.n);
        return mk_str_sb(c, &s);
    }
    return r;
}

/* ================================================================ calls */

enum { BI_RANGE = 1, BI_DICT, BI_NAMESPACE, BI_RAISE, BI_STRFTIME, BI_CYCLER, BI_JOINER, BI_LIPSUM };

typedef struct eargs {
    jv **pos;
    size_t npos;
    const char **kwn;
    jv **kwv;
    size_t nkw;
} eargs;

static jv *arg(const eargs *a, size_t i, const char *name, jv *def)
{
    if (i < a->npos) return a->pos[i];
    if (name)
        for (size_t k = 0; k < a->nkw; k++)
            if (!strcmp(a->kwn[k], name)) return a->kwv[k];
    return def;
}

static void check_args(jctx *c, const eargs *a, const char *what, size_t maxpos, const char *const *kw)
{
    if (a->npos > maxpos) FAIL("%s takes at most %zu positional argument(s) (%zu given)", what, maxpos, a->npos);
    for (size_t k = 0; k < a->nkw; k++) {
        int ok = 0;
        for (const char *const *p = kw; p && *p; p++) if (!strcmp(*p, a->kwn[k])) ok = 1;
        if (!ok) FAIL("%s got an unexpected keyword argument '%s'", what, a->kwn[k]);
    }
}

static jv *eval(jctx *c, frame *fr, node *n);
static void exec_body(jctx *c, frame *fr, const svec *body);

static frame *new_frame(jctx *c, frame *parent)
{
    frame *f = jzalloc(c, sizeof *f);
    f->parent = parent;
    return f;
}

static jv *lookup(jctx *c, frame *fr, const char *name)
{
    for (frame *f = fr; f; f = f->parent) {
        jv *v = dict_gets(&f->vars, name);
        if (v) return v;
    }
    jv *v = dict_gets(c->globals, name);
    if (v) return v;
    static const struct { const char *n; int id; } bis[] = {
        {"range", BI_RANGE}, {"dict", BI_DICT}, {"namespace", BI_NAMESPACE}, {"raise_exception", BI_RAISE},
        {"strftime_now", BI_STRFTIME}, {"cycler", BI_CYCLER}, {"joiner", BI_JOINER}, {"lipsum", BI_LIPSUM}};
    for (size_t i = 0; i < sizeof bis / sizeof bis[0]; i++)
        if (!strcmp(bis[i].n, name)) {
            jv *b = mk(c, JV_BUILTIN);
            b->u.bi = bis[i].id;
            return b;
        }
    return mk_undef(c, "'%s' is undefined", name);
}

static void enter_depth(jctx *c)
{
    if (++c->depth > c->max_depth)
        jfail(c, c->line, FT_ERR_NOMEM, "template render nested too deeply (limit %u): infinite recursion?", c->max_depth);
}

/* render body into a new string (caller's output restored) */
static jv *capture(jctx *c, frame *fr, const svec *body)
{
    sbuf *saved = c->out, b = {0};
    c->out = &b;
    exec_body(c, fr, body);
    c->out = saved;
    return mk_str_sb(c, &b);
}

static jv *call_macro(jctx *c, jmacro *m, const eargs *a, jv *caller)
{
    macrodef *d = m->def;
    enter_depth(c);
    int line = c->line;
    frame *f = new_frame(c, m->closure);
    size_t used_kw = 0;
    for (size_t i = 0; i < d->nparams; i++) {
        jv *v = NULL;
        if (i < a->npos) v = a->pos[i];
        else {
            for (size_t k = 0; k < a->nkw; k++)
                if (!strcmp(a->kwn[k], d->params[i])) { v = a->kwv[k]; used_kw++; }
            if (!v && d->defaults[i]) v = eval(c, f, d->defaults[i]);
            if (!v) v = mk_undef(c, "parameter '%s' was not provided", d->params[i]);
        }
        dict_sets(c, &f->vars, d->params[i], v);
    }
    if (a->npos > d->nparams) {
        if (!d->uses_varargs) FAIL("macro '%s' takes not more than %zu argument(s)", d->name, d->nparams);
    }
    if (d->uses_varargs) {
        jv *va = mk_list(c, 1);
        for (size_t i = d->nparams; i < a->npos; i++) list_push(c, va, a->pos[i]);
        dict_sets(c, &f->vars, "varargs", va);
    }
    jv *kw = mk_dict(c, JV_DICT);
    for (size_t k = 0; k < a->nkw; k++) {
        int is_param = 0;
        for (size_t i = 0; i < d->nparams; i++) if (!strcmp(a->kwn[k], d->params[i])) is_param = 1;
        if (is_param) continue;
        if (!strcmp(a->kwn[k], "caller") && d->uses_caller) { caller = a->kwv[k]; continue; }
        if (!d->uses_kwargs) FAIL("macro '%s' takes no keyword argument '%s'", d->name, a->kwn[k]);
        dv_set(c, kw, mk_str(c, a->kwn[k]), a->kwv[k]);
    }
    if (d->uses_kwargs) dict_sets(c, &f->vars, "kwargs", kw);
    if (d->uses_caller && !dict_gets(&f->vars, "caller"))
        dict_sets(c, &f->vars, "caller", caller ? caller : mk_undef(c, "No caller defined"));
    int brk = c->brk;
    jv *r = capture(c, f, &d->body);
    c->brk = brk;
    c->line = line;
    c->depth--;
    return r;
}

/* ------------------------------------------------------------ str utils */

static int cp_in(int32_t cp, const jv *chars)
{
    for (size_t i = 0; i < chars->u.s.n;) {
        int32_t x;
        i += u8_dec(chars->u.s.p + i, chars->u.s.n - i, &x);
        if (x == cp) return 1;
    }
    return 0;
}

/* strip: which 1 left, 2 right, 3 both; chars NULL/none: whitespace */
static jv *str_strip(jctx *c, jv *s, jv *chars, int which)
{
    if (chars && chars->t != JV_NONE && chars->t != JV_STR) FAIL("strip arg must be None or str");
    if (chars && chars->t == JV_NONE) chars = NULL;
    const char *p = s->u.s.p;
    size_t a = 0, b = s->u.s.n;
    if (which & 1)
        while (a < b) {
            int32_t cp;
            size_t l = u8_dec(p + a, b - a, &cp);
            if (chars ? !cp_in(cp, chars) : !py_space(cp)) break;
            a += l;
        }
    if (which & 2)
        while (b > a) {
            size_t st = b - 1;
            while (st > a && ((unsigned char)p[st] & 0xc0) == 0x80) st--;
            int32_t cp;
            u8_dec(p + st, b - st, &cp);
            if (chars ? !cp_in(cp, chars) : !py_space(cp)) break;
            b = st;
        }
    if (a == 0 && b == s->u.s.n) return s;
    jv *r = mk_strn(c, p + a, b - a);
    if (s->flag && r->u.s.n) { r = mk_strn(c, r->u.s.p, r->u.s.n); r->flag = 1; }   /* Markup stays Markup */
    return r;
}

static jv *str_split(jctx *c, jv *s, jv *sep, jv *maxv, int right)
{
    int64_t maxsplit = -1;
    if (maxv && maxv->t != JV_NONE) {
        if (maxv->t != JV_INT) FAIL("maxsplit must be an integer");
        maxsplit = maxv->u.i;
    }
    if (sep && sep->t == JV_NONE) sep = NULL;
    if (sep && sep->t != JV_STR) FAIL("must be str or None, not %s", type_name(sep));
    if (sep && sep->u.s.n == 0) FAIL("empty separator");
    jv *r = mk_list(c, 0);
    const char *p = s->u.s.p;
    size_t n = s->u.s.n;
    jvec parts = {0};
    if (!right) {
        size_t i = 0;
        int64_t k = 0;
        if (!sep) {
            for (;;) {
                while (i < n) { int32_t cp; size_t l = u8_dec(p + i, n - i, &cp); if (!py_space(cp)) break; i += l; }
                if (i >= n) break;
                if (maxsplit >= 0 && k >= maxsplit) {
                    size_t e = n;   /* rest, with its trailing whitespace */
                    VEC_PUSH(c, &parts, mk_strn(c, p + i, e - i));
                    break;
                }
                size_t st = i;
                while (i < n) { int32_t cp; size_t l = u8_dec(p + i, n - i, &cp); if (py_space(cp)) break; i += l; }
                VEC_PUSH(c, &parts, mk_strn(c, p + st, i - st));
                k++;
                step(c);
            }
        } else {
            for (;;) {
                const char *f = (maxsplit < 0 || k < maxsplit) ? memmem(p + i, n - i, sep->u.s.p, sep->u.s.n) : NULL;
                if (!f) { VEC_PUSH(c, &parts, mk_strn(c, p + i, n - i)); break; }
                VEC_PUSH(c, &parts, mk_strn(c, p + i, (size_t)(f - (p + i))));
                i = (size_t)(f - p) + sep->u.s.n;
                k++;
                step(c);
            }
        }
        for (size_t j = 0; j < parts.n; j++) list_push(c, r, parts.v[j]);
        return r;
    }
    /* rsplit */
    size_t e = n;
    int64_t k = 0;
    if (!sep) {
        for (;;) {
            while (e > 0) {
                size_t st = e - 1;
                while (st > 0 && ((unsigned char)p[st] & 0xc0) == 0x80) st--;
                int32_t cp; u8_dec(p + st, e - st, &cp);
                if (!py_space(cp)) break;
                e = st;
            }
            if (e == 0) break;
            if (maxsplit >= 0 && k >= maxsplit) { VEC_PUSH(c, &parts, mk_strn(c, p, e)); break; }
            size_t b = e;
            while (b > 0) {
                size_t st = b - 1;
                while (st > 0 && ((unsigned char)p[st] & 0xc0) == 0x80) st--;
                int32_t cp; u8_dec(p + st, b - st, &cp);
                if (py_space(cp)) break;
                b = st;
            }
            VEC_PUSH(c, &parts, mk_strn(c, p + b, e - b));
            e = b;
            k++;
            step(c);
        }
    } else {
        for (;;) {
            const char *f = NULL;
            if (maxsplit < 0 || k < maxsplit)
                for (size_t q = e; q >= sep->u.s.n; q--)
                    if (!memcmp(p + q - sep->u.s.n, sep->u.s.p, sep->u.s.n)) { f = p + q - sep->u.s.n; break; }
            if (!f) { VEC_PUSH(c, &parts, mk_strn(c, p, e)); break; }
            size_t fo = (size_t)(f - p);
            VEC_PUSH(c, &parts, mk_strn(c, p + fo + sep->u.s.n, e - fo - sep->u.s.n));
            e = fo;
            k++;
            step(c);
        }
    }
    for (size_t j = parts.n; j > 0; j--) list_push(c, r, parts.v[j - 1]);
    return r;
}

static jv *str_replace(jctx *c, jv *s, jv *old, jv *new_, int64_t count)
{
    if (old->t != JV_STR || new_->t != JV_STR) FAIL("replace() arguments must be str");
    sbuf b = {0};
    const char *p = s->u.s.p;
    size_t n = s->u.s.n, i = 0;
    int64_t k = 0;
    if (old->u.s.n == 0) {
        while (count < 0 || k < count) {
            sb_add(c, &b, new_->u.s.p, new_->u.s.n);
            k++;
            if (i >= n) break;
            int32_t cp;
            size_t l = u8_dec(p + i, n - i, &cp);
            sb_add(c, &b, p + i, l);
            i += l;
            step(c);
        }
        sb_add(c, &b, p + i, n - i);
        return mk_str_sb(c, &b);
    }
    for (;;) {
        const char *f = (count < 0 || k < count) ? memmem(p + i, n - i, old->u.s.p, old->u.s.n) : NULL;
        if (!f) break;
        sb_add(c, &b, p + i, (size_t)(f - (p + i)));
        sb_add(c, &b, new_->u.s.p, new_->u.s.n);
        i = (size_t)(f - p) + old->u.s.n;
        k++;
        step(c);
    }
    sb_add(c, &b, p + i, n - i);
    return mk_str_sb(c, &b);
}

static int str_affix(jctx *c, jv *s, jv *x, int end)
{
    if (x->t == JV_LIST && x->flag == LK_TUPLE) {
        for (size_t i = 0; i < x->u.l->n; i++) if (str_affix(c, s, x->u.l->v[i], end)) return 1;
        return 0;
    }
    if (x->t != JV_STR) FAIL("%s first arg must be str or a tuple of str, not %s", end ? "endswith" : "startswith", type_name(x));
    if (x->u.s.n > s->u.s.n) return 0;
    return !memcmp(s->u.s.p + (end ? s->u.s.n - x->u.s.n : 0), x->u.s.p, x->u.s.n);
}

/* Python's format-spec mini-language: [[fill]align][sign][#][0][width][,|_][.precision][type] for
 * str (s), int (d x X o b c, none), float (f F e E g G %), bool as int when a numeric type is given.
 * A float with no type and a precision, "n", and nested {} specs are refused. */
static void fmt_spec(jctx *c, sbuf *b, jv *v, const char *sp, size_t n)
{
    int32_t fill = ' ';
    char align = 0, sign = '-', type = 0, group = 0;
    int alt = 0, zero = 0;
    long width = -1, prec = -1;
    size_t i = 0;
    if (n == 0) { fmt_val(c, b, v, 0, 0); return; }   /* format(x, '') is str(x) */
    if (memchr(sp, '{', n)) UNSUP("nested replacement fields in format specs are not supported");
    {
        int32_t cp;
        size_t l = n ? u8_dec(sp, n, &cp) : 0;
        if (l && l < n && strchr("<>^=", sp[l])) { fill = cp; align = sp[l]; i = l + 1; }
        else if (n && strchr("<>^=", sp[0])) { align = sp[0]; i = 1; }
    }
    if (i < n && strchr("+- ", sp[i])) sign = sp[i++];
    if (i < n && sp[i] == '#') { alt = 1; i++; }
    if (i < n && sp[i] == '0') { zero = 1; i++; }
    if (i < n && is_dig((unsigned char)sp[i])) { width = 0; while (i < n && is_dig((unsigned char)sp[i]) && width < 100000) width = width * 10 + (sp[i++] - '0'); }
    if (i < n && (sp[i] == ',' || sp[i] == '_')) group = sp[i++];
    if (i < n && sp[i] == '.') { i++; prec = 0; if (i >= n || !is_dig((unsigned char)sp[i])) FAIL("Format specifier missing precision"); while (i < n && is_dig((unsigned char)sp[i]) && prec < 100000) prec = prec * 10 + (sp[i++] - '0'); }
    if (i < n) type = sp[i++];
    if (i < n) FAIL("Invalid format specifier '%.*s'", (int)n, sp);
    if (width > 10000 || prec > 10000) FAIL("format width or precision too large");
    if (zero && !align) { align = '='; fill = '0'; }
    sbuf body = {0};
    const char *prefix = "";
    int numeric = 0, neg = 0;
    if (v->t == JV_STR || (type == 's') || (!type && (v->t == JV_NONE || v->t == JV_LIST || v->t == JV_DICT))) {
        if ((type && type != 's') || (type == 's' && v->t != JV_STR))
            FAIL("Unknown format code '%c' for object of type '%s'", type, type_name(v));
        if (v->t != JV_STR && (n > 0)) {
            if (v->t != JV_STR && v->t != JV_BOOL && !is_num(v)) FAIL("unsupported format string passed to %s.__format__", type_name(v));
        }
        if (sign != '-' || alt || group) FAIL("Sign, alternate form or grouping not allowed in string format specifier");
        if (align == '=') FAIL("'=' alignment not allowed in string format specifier");
        jv *sv = to_str(c, v);
        size_t keep = sv->u.s.n;
        if (prec >= 0) keep = u8_off(sv->u.s.p, sv->u.s.n, (size_t)prec);
        sb_add(c, &body, sv->u.s.p, keep);
        if (!align) align = '<';
    } else if (is_num(v) && (v->t != JV_FLOAT || (type && strchr("dxXobc", type) == NULL) || !type)) {
        numeric = 1;
        if (!align) align = '>';
        int isint = v->t != JV_FLOAT && (!type || strchr("dxXobcn", type));
        if (isint) {   /* bool formats as int under a non-empty spec */
            if (prec >= 0) FAIL("Precision not allowed in integer format specifier");
            int64_t iv = num_i(v);
            uint64_t u = iv < 0 ? (uint64_t)0 - (uint64_t)iv : (uint64_t)iv;
            neg = iv < 0;
            char digs[80];
            int base = type == 'x' || type == 'X' ? 16 : type == 'o' ? 8 : type == 'b' ? 2 : 10;
            if (type == 'c') {
                char e[4];
                if (iv < 0 || iv > 0x10ffff) FAIL("%%c arg not in range(0x110000)");
                sb_add(c, &body, e, u8_enc((int32_t)iv, e));
                neg = 0;
            } else if (type == 'n') UNSUP("the 'n' format type is not supported");
            else {
                size_t k = 0;
                do { int d = (int)(u % (uint64_t)base); digs[k++] = (char)(d < 10 ? '0' + d : (type == 'X' ? 'A' : 'a') + d - 10); u /= (uint64_t)base; } while (u);
                int gsize = group ? (base == 10 ? 3 : 4) : 0;
                if (group == ',' && base != 10) FAIL("Cannot specify ',' with '%c'.", type);
                for (size_t j = 0; j < k; j++) {
                    sb_addc(c, &body, digs[k - 1 - j]);
                    size_t rest = k - 1 - j;
                    if (gsize && rest && rest % (size_t)gsize == 0) sb_addc(c, &body, group);
                }
                if (alt) prefix = base == 16 ? (type == 'X' ? "0X" : "0x") : base == 8 ? "0o" : base == 2 ? "0b" : "";
            }
        } else {
            if (!type) UNSUP("a float format spec without a type is not supported");
            if (group) UNSUP("digit grouping of floats is not supported");
            double f = num_f(v);
            int pct = type == '%';
            if (pct) f *= 100.0;
            neg = signbit(f) && !isnan(f);
            char spec[32], tmp[12000];
            char t = pct ? 'f' : type;
            if (!strchr("fFeEgG", t)) FAIL("Unknown format code '%c' for object of type 'float'", type);
            snprintf(spec, sizeof spec, "%%%s.%ld%c", alt ? "#" : "", prec >= 0 ? prec : 6, t);
            snprintf(tmp, sizeof tmp, spec, fabs(f));
            sb_adds(c, &body, tmp);
            if (pct) sb_addc(c, &body, '%');
        }
    } else {
        FAIL("Unknown format code '%c' for object of type '%s'", type ? type : '?', type_name(v));
    }
    /* sign + prefix + body, padded */
    sbuf head = {0};
    if (numeric) {
        if (neg) sb_addc(c, &head, '-');
        else if (sign == '+') sb_addc(c, &head, '+');
        else if (sign == ' ') sb_addc(c, &head, ' ');
        sb_adds(c, &head, prefix);
    }
    size_t len = u8_len(head.p ? head.p : "", head.n) + u8_len(body.p ? body.p : "", body.n);
    size_t pad = width > 0 && (size_t)width > len ? (size_t)width - len : 0, left = 0;
    switch (align) {
    case '<': left = 0; break;
    case '^': left = pad / 2; break;
    default: left = pad; break;
    }
    char fe[4];
    size_t fl = u8_enc(fill, fe);
    if (align == '=') {
        sb_add(c, b, head.p, head.n);
        for (size_t k = 0; k < pad; k++) sb_add(c, b, fe, fl);
        sb_add(c, b, body.p, body.n);
        return;
    }
    for (size_t k = 0; k < left; k++) sb_add(c, b, fe, fl);
    sb_add(c, b, head.p, head.n);
    sb_add(c, b, body.p, body.n);
    for (size_t k = left; k < pad; k++) sb_add(c, b, fe, fl);
}

/* str.format (the sandbox's formatter): {} {0} {name}, !r/!s, format specs */
static jv *str_format(jctx *c, jv *s, const eargs *a)
{
    sbuf b = {0};
    const char *p = s->u.s.p;
    size_t n = s->u.s.n, auto_i = 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i] == '{' && i + 1 < n && p[i + 1] == '{') { sb_addc(c, &b, '{'); i++; continue; }
        if (p[i] == '}' && i + 1 < n && p[i + 1] == '}') { sb_addc(c, &b, '}'); i++; continue; }
        if (p[i] == '}') FAIL("Single '}' encountered in format string");
        if (p[i] != '{') { sb_addc(c, &b, p[i]); continue; }
        size_t e = i + 1;
        while (e < n && p[e] != '}') e++;
        if (e >= n) FAIL("Single '{' encountered in format string");
        const char *f = p + i + 1;
        size_t fl = e - i - 1;
        char conv = 0;
        const char *bang = memchr(f, '!', fl), *colon = memchr(f, ':', fl);
        const char *spec = NULL;
        size_t specl = 0;
        if (colon && (!bang || colon < bang)) { spec = colon + 1; specl = fl - (size_t)(colon + 1 - f); fl = (size_t)(colon - f); bang = memchr(f, '!', fl); }
        else if (colon) { spec = colon + 1; specl = fl - (size_t)(colon + 1 - f); fl = (size_t)(colon - f); }
        if (bang) { if (bang + 2 != f + fl) FAIL("bad conversion in format string"); conv = bang[1]; fl = (size_t)(bang - f); }
        size_t nl = 0;
        while (nl < fl && f[nl] != '.' && f[nl] != '[') nl++;
        jv *v;
        if (nl == 0) v = arg(a, auto_i++, NULL, NULL);
        else if (f[0] >= '0' && f[0] <= '9') v = arg(a, (size_t)strtoul(f, NULL, 10), NULL, NULL);
        else v = arg(a, (size_t)-1, jstrndup(c, f, nl), NULL);
        if (!v) FAIL("str.format: missing argument for '{%.*s}'", (int)fl, f);
        if (nl < fl) UNSUP("attribute or index lookups in str.format fields are not supported");
        if (conv == 'r' || conv == 's') {
            sbuf t = {0};
            fmt_val(c, &t, v, conv == 'r', 0);
            v = mk_str_sb(c, &t);
        } else if (conv) FAIL("unknown conversion specifier %c", conv);
        if (spec) fmt_spec(c, &b, v, spec, specl);
        else fmt_val(c, &b, v, 0, 0);
        i = e;
    }
    return mk_str_sb(c, &b);
}

/* "fmt" % args: Python's printf-style formatting (%s %r %a %d %i %u %f %F %e %E %g %G %x %X %o %c with
 * flags, width and precision; no %(name)s mappings) */
static jv *str_percent(jctx *c, jv *s, jv *args)
{
    sbuf b = {0};
    size_t ai = 0;
    jvec *av = NULL;
    jv *single = args;
    int used_single = 0;
    if (args->t == JV_LIST && args->flag == LK_TUPLE) { av = args->u.l; single = NULL; }
    const char *p = s->u.s.p;
    size_t n = s->u.s.n;
    for (size_t i = 0; i < n; i++) {
        if (p[i] != '%') { sb_addc(c, &b, p[i]); continue; }
        char flags[8];
        size_t nf = 0;
        int width = -1, prec = -1;
        i++;
        if (i < n && p[i] == '(') UNSUP("%%(name) mappings in printf-style formatting are not supported");
        while (i < n && strchr("-+ #0", p[i]) && nf < sizeof flags - 1) flags[nf++] = p[i++];
        flags[nf] = 0;
        if (i < n && p[i] == '*') UNSUP("'*' widths in printf-style formatting are not supported");
        if (i < n && is_dig((unsigned char)p[i])) { width = 0; while (i < n && is_dig((unsigned char)p[i]) && width < 100000) width = width * 10 + (p[i++] - '0'); }
        if (i < n && p[i] == '.') { i++; prec = 0; while (i < n && is_dig((unsigned char)p[i]) && prec < 100000) prec = prec * 10 + (p[i++] - '0'); }
        while (i < n && (p[i] == 'h' || p[i] == 'l' || p[i] == 'L')) i++;
        if (i >= n) FAIL("incomplete format");
        char f = p[i];
        if (f == '%') { sb_addc(c, &b, '%'); continue; }
        if (width > 10000 || prec > 10000) FAIL("printf-style width or precision too large");
        jv *v;
        if (av) { if (ai >= av->n) FAIL("not enough arguments for format string"); v = av->v[ai++]; }
        else { if (used_single) FAIL("not enough arguments for format string"); v = single; used_single = 1; }
        if (f == 's' || f == 'r' || f == 'a') {
            sbuf t = {0};
            fmt_val(c, &t, v, f != 's', 0);
            size_t len = u8_len(t.p ? t.p : "", t.n), keep = t.n;
            if (prec >= 0 && (size_t)prec < len) { keep = u8_off(t.p, t.n, (size_t)prec); len = (size_t)prec; }
            int left = strchr(flags, '-') != NULL;
            size_t pad = width > 0 && (size_t)width > len ? (size_t)width - len : 0;
            if (!left) for (size_t k = 0; k < pad; k++) sb_addc(c, &b, ' ');
            sb_add(c, &b, t.p, keep);
            if (left) for (size_t k = 0; k < pad; k++) sb_addc(c, &b, ' ');
            continue;
        }
        char spec[64];
        int sl = snprintf(spec, sizeof spec, "%%%s", flags);
        if (width >= 0) sl += snprintf(spec + sl, sizeof spec - (size_t)sl, "%d", width);
        if (prec >= 0) sl += snprintf(spec + sl, sizeof spec - (size_t)sl, ".%d", prec);
        if (!is_num(v)) FAIL("%%%c format: a real number is required, not %s", f, type_name(v));
        if (strchr("diu", f)) {
            double fv = num_f(v);
            if (v->t == JV_FLOAT && (!isfinite(fv) || fabs(fv) > 9e18)) UNSUP("%%d of a float beyond 64 bits");
            snprintf(spec + sl, sizeof spec - (size_t)sl, "lld");
            sb_printf(c, &b, spec, (long long)(v->t == JV_FLOAT ? (int64_t)fv : num_i(v)));
        } else if (strchr("xXo", f)) {
            if (v->t == JV_FLOAT) FAIL("%%%c format: an integer is required, not float", f);
            int64_t iv = num_i(v);
            if (strchr(flags, '#')) UNSUP("the '#' flag of %%%c is not supported", f);
            snprintf(spec + sl, sizeof spec - (size_t)sl, "ll%c", f);
            if (iv < 0) {
                sb_addc(c, &b, '-');
                sb_printf(c, &b, spec, (unsigned long long)(iv == INT64_MIN ? (uint64_t)INT64_MAX + 1 : (uint64_t)-iv));
            } else sb_printf(c, &b, spec, (unsigned long long)iv);
        } else if (strchr("fFeEgG", f)) {
            snprintf(spec + sl, sizeof spec - (size_t)sl, "%c", f);
            sb_printf(c, &b, spec, num_f(v));
        } else if (f == 'c') {
            if (v->t == JV_FLOAT) FAIL("%%c requires int or char");
            char e[4];
            int64_t cp = num_i(v);
            if (cp < 0 || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) FAIL("%%c arg not in range(0x110000)");
            sb_add(c, &b, e, u8_enc((int32_t)cp, e));
        } else FAIL("unsupported format character '%c'", f);
    }
    if ((av && ai < av->n) || (!av && !used_single && args->t != JV_DICT))
        FAIL("not all arguments converted during string formatting");
    return mk_str_sb(c, &b);
}

static jv *call_value(jctx *c, jv *f, const eargs *a);
static int run_test(jctx *c, frame *fr, const char *name, jv *v, const eargs *a);
static jv *run_filter(jctx *c, frame *fr, const char *name, jv *v, const eargs *a);

static jv *dict_items_list(jctx *c, jv *d)
{
    jv *r = mk_list(c, 0);
    for (size_t i = 0; i < d->u.d->n; i++) list_push(c, r, mk_tuple2(c, d->u.d->k[i], d->u.d->v[i]));
    return r;
}

static jv *call_method(jctx *c, jv *self, const char *name, const eargs *a)
{
    if (self->t == JV_STR) {
        jv *s = self;
        if (!strcmp(name, "strip")) return str_strip(c, s, arg(a, 0, NULL, NULL), 3);
        if (!strcmp(name, "lstrip")) return str_strip(c, s, arg(a, 0, NULL, NULL), 1);
        if (!strcmp(name, "rstrip")) return str_strip(c, s, arg(a, 0, NULL, NULL), 2);
        if (!strcmp(name, "split")) return str_split(c, s, arg(a, 0, "sep", NULL), arg(a, 1, "maxsplit", NULL), 0);
        if (!strcmp(name, "rsplit")) return str_split(c, s, arg(a, 0, "sep", NULL), arg(a, 1, "maxsplit", NULL), 1);
        if (!strcmp(name, "startswith") || !strcmp(name, "endswith")) {
            jv *x = arg(a, 0, NULL, NULL);
            if (!x) FAIL("%s() takes at least 1 argument (0 given)", name);
            if (a->npos > 1) UNSUP("start/end arguments of %s are not supported", name);
            return mk_bool(str_affix(c, s, x, name[0] == 'e'));
        }
        if (!strcmp(name, "upper")) return str_case(c, s, 0);
        if (!strcmp(name, "lower") || !strcmp(name, "casefold")) return str_case(c, s, 1);
        if (!strcmp(name, "capitalize")) return str_case(c, s, 2);
        if (!strcmp(name, "title")) return str_case(c, s, 3);
        if (!strcmp(name, "swapcase")) return str_case(c, s, 4);
        if (!strcmp(name, "replace")) {
            jv *o = arg(a, 0, NULL, NULL), *nw = arg(a, 1, NULL, NULL), *cnt = arg(a, 2, "count", NULL);
            if (!o || !nw) FAIL("replace expected at least 2 arguments");
            return str_replace(c, s, o, nw, cnt && cnt->t == JV_INT ? cnt->u.i : -1);
        }
        if (!strcmp(name, "find") || !strcmp(name, "rfind") || !strcmp(name, "index") || !strcmp(name, "rindex") ||
            !strcmp(name, "count")) {
            jv *x = arg(a, 0, NULL, NULL);
            if (!x || x->t != JV_STR) FAIL("%s() argument must be str", name);
            if (a->npos > 1) UNSUP("start/end arguments of %s are not supported", name);
            if (!strcmp(name, "count")) {
                if (!x->u.s.n) return mk_int(c, (int64_t)u8_len(s->u.s.p, s->u.s.n) + 1);
                int64_t k = 0;
                for (size_t i = 0; i + x->u.s.n <= s->u.s.n;) {
                    const char *f = memmem(s->u.s.p + i, s->u.s.n - i, x->u.s.p, x->u.s.n);
                    if (!f) break;
                    k++;
                    i = (size_t)(f - s->u.s.p) + x->u.s.n;
                }
                return mk_int(c, k);
            }
            const char *f = NULL;
            if (name[0] == 'r') {
                for (size_t q = s->u.s.n + 1; q-- > x->u.s.n;)
                    if (!memcmp(s->u.s.p + q - x->u.s.n, x->u.s.p, x->u.s.n)) { f = s->u.s.p + q - x->u.s.n; break; }
            } else f = x->u.s.n ? memmem(s->u.s.p, s->u.s.n, x->u.s.p, x->u.s.n) : s->u.s.p;
            if (!f) {
                if (strstr(name, "index")) FAIL("substring not found");
                return mk_int(c, -1);
            }
            return mk_int(c, (int64_t)u8_len(s->u.s.p, (size_t)(f - s->u.s.p)));
        }
        if (!strcmp(name, "format")) return str_format(c, s, a);
        if (!strcmp(name, "join")) {
            jv *it = arg(a, 0, NULL, NULL);
            if (!it) FAIL("join() takes exactly one argument");
            jvec *l = iter_items(c, it);
            sbuf b = {0};
            for (size_t i = 0; i < l->n; i++) {
                if (l->v[i]->t != JV_STR) FAIL("sequence item %zu: expected str instance, %s found", i, type_name(l->v[i]));
                if (i) sb_add(c, &b, s->u.s.p, s->u.s.n);
                sb_add(c, &b, l->v[i]->u.s.p, l->v[i]->u.s.n);
            }
            return mk_str_sb(c, &b);
        }
        if (!strcmp(name, "removeprefix") || !strcmp(name, "removesuffix")) {
            jv *x = arg(a, 0, NULL, NULL);
            if (!x || x->t != JV_STR) FAIL("%s() argument must be str", name);
            if (!str_affix(c, s, x, name[6] == 's')) return s;
            return name[6] == 's' ? mk_strn(c, s->u.s.p, s->u.s.n - x->u.s.n)
                                  : mk_strn(c, s->u.s.p + x->u.s.n, s->u.s.n - x->u.s.n);
        }
        if (!strcmp(name, "splitlines")) {
            jv *keep = arg(a, 0, "keepends", &V_FALSE);
            jv *r = mk_list(c, 0);
            size_t i = 0, st = 0, n = s->u.s.n;
            while (i < n) {
                size_t l;
                if (py_linebreak(s->u.s.p + i, n - i, &l)) {
                    list_push(c, r, mk_strn(c, s->u.s.p + st, i - st + (truthy(keep) ? l : 0)));
                    i += l;
                    st = i;
                } else i++;
            }
            if (st < n) list_push(c, r, mk_strn(c, s->u.s.p + st, n - st));
            return r;
        }
        if (!strncmp(name, "is", 2)) {
            int all = 1, any = 0, cased = 0, upper = 0, lower = 0;
            for (size_t i = 0; i < s->u.s.n;) {
                int32_t cp;
                i += u8_dec(s->u.s.p + i, s->u.s.n - i, &cp);
                any = 1;
                int ok;
                if (!strcmp(name, "isdigit") || !strcmp(name, "isdecimal") || !strcmp(name, "isnumeric")) ok = cp_is_digit(cp);
                else if (!strcmp(name, "isalpha")) ok = cp_is_alpha(cp);
                else if (!strcmp(name, "isalnum")) ok = cp_is_alpha(cp) || cp_is_digit(cp);
                else if (!strcmp(name, "isspace")) ok = py_space(cp);
                else if (!strcmp(name, "isascii")) ok = cp < 0x80;
                else if (!strcmp(name, "islower") || !strcmp(name, "isupper")) {
                    ok = 1;
                    if (cp_is_cased_upper(cp)) { cased = 1; upper = 1; }
                    if (cp_is_cased_lower(cp)) { cased = 1; lower = 1; }
                } else UNSUP("str.%s is not supported", name);
                if (!ok) all = 0;
            }
            if (!strcmp(name, "islower")) return mk_bool(cased && !upper);
            if (!strcmp(name, "isupper")) return mk_bool(cased && !lower);
            if (!strcmp(name, "isascii")) return mk_bool(all);
            return mk_bool(any && all);
        }
        if (!strcmp(name, "center") || !strcmp(name, "ljust") || !strcmp(name, "rjust") || !strcmp(name, "zfill")) {
            jv *w = arg(a, 0, NULL, NULL);
            if (!w || w->t != JV_INT) FAIL("%s() needs an integer width", name);
            jv *fill = arg(a, 1, NULL, NULL);
            if (fill && (fill->t != JV_STR || u8_len(fill->u.s.p, fill->u.s.n) != 1))
                FAIL("the fill character must be exactly one character long");
            size_t len = u8_len(s->u.s.p, s->u.s.n);
            if (w->u.i <= (int64_t)len) return s;
            if (w->u.i > 1 << 20) FAIL("width too large");
            size_t pad = (size_t)w->u.i - len, left;
            if (!strcmp(name, "ljust")) left = 0;
            else if (!strcmp(name, "rjust") || !strcmp(name, "zfill")) left = pad;
            else left = pad / 2 + (pad & (size_t)w->u.i & 1);
            const char *fc = fill ? fill->u.s.p : name[0] == 'z' ? "0" : " ";
            size_t fcl = fill ? fill->u.s.n : 1;
            sbuf b = {0};
            for (size_t i = 0; i < left; i++) sb_add(c, &b, fc, fcl);
            sb_add(c, &b, s->u.s.p, s->u.s.n);
            for (size_t i = left; i < pad; i++) sb_add(c, &b, fc, fcl);
            return mk_str_sb(c, &b);
        }
        if (!strcmp(name, "partition") || !strcmp(name, "rpartition")) {
            jv *x = arg(a, 0, NULL, NULL);
            if (!x || x->t != JV_STR || !x->u.s.n) FAIL("%s() needs a non-empty str separator", name);
            jv *parts = str_split(c, s, x, mk_int(c, 1), name[0] == 'r');
            jv *r = mk_list(c, 1);
            if (parts->u.l->n == 2) {
                list_push(c, r, parts->u.l->v[0]); list_push(c, r, x); list_push(c, r, parts->u.l->v[1]);
            } else if (name[0] == 'r') {
                list_push(c, r, &V_EMPTY); list_push(c, r, &V_EMPTY); list_push(c, r, s);
            } else {
                list_push(c, r, s); list_push(c, r, &V_EMPTY); list_push(c, r, &V_EMPTY);
            }
            return r;
        }
        UNSUP("str.%s() is not supported", name);
    }
    if (self->t == JV_DICT) {
        if (!strcmp(name, "get")) {
            jv *k = arg(a, 0, NULL, NULL);
            if (!k) FAIL("get expected at least 1 argument, got 0");
            jv *v = dict_get(self->u.d, k);
            return v ? v : arg(a, 1, NULL, &V_NONE);
        }
        if (!strcmp(name, "items")) { jv *r = dict_items_list(c, self); r->flag = LK_ITEMS; return r; }
        if (!strcmp(name, "keys")) { jv *r = as_list(c, self); r->flag = LK_KEYS; return r; }
        if (!strcmp(name, "values")) {
            jv *r = mk_list(c, LK_VALUES);
            for (size_t i = 0; i < self->u.d->n; i++) list_push(c, r, self->u.d->v[i]);
            return r;
        }
        if (!strcmp(name, "copy")) {
            jv *r = mk_dict(c, JV_DICT);
            for (size_t i = 0; i < self->u.d->n; i++) dv_set(c, r, self->u.d->k[i], self->u.d->v[i]);
            return r;
        }
        UNSUP("dict.%s() is not supported", name);
    }
    if (self->t == JV_LIST) {
        if (!strcmp(name, "copy")) return as_list(c, self);
        jv *x = arg(a, 0, NULL, NULL);
        if (!x) FAIL("%s() takes exactly one argument (0 given)", name);
        int64_t k = 0;
        for (size_t i = 0; i < self->u.l->n; i++)
            if (jv_eq(self->u.l->v[i], x)) {
                if (!strcmp(name, "index")) return mk_int(c, (int64_t)i);
                k++;
            }
        if (!strcmp(name, "index")) FAIL("value is not in list");
        return mk_int(c, k);
    }
    if (self->t == JV_LOOP) {
        jloop *l = self->u.loop;
        if (!strcmp(name, "cycle")) {
            if (!a->npos) FAIL("no items for cycling given");
            return a->pos[l->index0 % a->npos];
        }
        if (!strcmp(name, "changed")) {
            jv *v = mk_list(c, 1);
            for (size_t i = 0; i < a->npos; i++) list_push(c, v, a->pos[i]);
            if (!l->have_changed || !jv_eq(l->last_changed, v)) {
                l->last_changed = v;
                l->have_changed = 1;
                return &V_TRUE;
            }
            return &V_FALSE;
        }
    }
    UNSUP("method %s of %s is not supported", name, type_name(self));
}

static jv *loop_attr(jctx *c, jloop *l, const char *name)
{
    size_t n = l->items->n, i = l->index0;
    if (!strcmp(name, "index")) return mk_int(c, (int64_t)i + 1);
    if (!strcmp(name, "index0")) return mk_int(c, (int64_t)i);
    if (!strcmp(name, "revindex")) return mk_int(c, (int64_t)(n - i));
    if (!strcmp(name, "revindex0")) return mk_int(c, (int64_t)(n - i - 1));
    if (!strcmp(name, "first")) return mk_bool(i == 0);
    if (!strcmp(name, "last")) return mk_bool(i + 1 == n);
    if (!strcmp(name, "length")) return mk_int(c, (int64_t)n);
    if (!strcmp(name, "depth")) return mk_int(c, l->depth);
    if (!strcmp(name, "depth0")) return mk_int(c, l->depth - 1);
    if (!strcmp(name, "previtem")) return i > 0 ? l->items->v[i - 1] : mk_undef(c, "there is no previous item");
    if (!strcmp(name, "nextitem")) return i + 1 < n ? l->items->v[i + 1] : mk_undef(c, "there is no next item");
    jv *self = mk(c, JV_LOOP);
    self->u.loop = l;
    if (!strcmp(name, "cycle") || !strcmp(name, "changed")) return mk_method(c, self, name);
    return mk_undef(c, "'LoopContext' has no attribute '%s'", name);
}

static int tm_now(jctx *c, struct tm *tm)
{
    time_t t = (time_t)c->now;
    return localtime_r(&t, tm) != NULL;
}

static void exec_for(jctx *c, frame *fr, const stmt *s, jv *iterable, int depth);

static jv *call_value(jctx *c, jv *f, const eargs *a)
{
    switch (f->t) {
    case JV_MACRO: return call_macro(c, f->u.m, a, NULL);
    case JV_METHOD: return call_method(c, f->u.me.self, f->u.me.name, a);
    case JV_UNDEF:
        if (f->flag) jfail(c, c->line, FT_ERR_INVALID_ARG, "SecurityError: %s", f->u.hint);
        undef_fail(c, f);
    case JV_LOOP: {
        jloop *l = f->u.loop;
        if (!l->st || !l->st->recursive) FAIL("Tried to call non recursive loop. Maybe you forgot the 'recursive' modifier.");
        if (a->npos != 1) FAIL("loop() takes exactly one argument");
        sbuf *saved = c->out, b = {0};
        c->out = &b;
        enter_depth(c);
        exec_for(c, l->fr, l->st, a->pos[0], l->depth + 1);
        c->depth--;
        c->out = saved;
        return mk_str_sb(c, &b);
    }
    case JV_BUILTIN:
        switch (f->u.bi) {
        case BI_RANGE: {
            check_args(c, a, "range", 3, NULL);
            if (!a->npos) FAIL("range expected at least 1 argument, got 0");
            int64_t v[3] = {0, 0, 1};
            for (size_t i = 0; i < a->npos; i++) {
                if (a->pos[i]->t != JV_INT && a->pos[i]->t != JV_BOOL)
                    FAIL("'%s' object cannot be interpreted as an integer", type_name(a->pos[i]));
                v[i] = num_i(a->pos[i]);
            }
            int64_t start = a->npos == 1 ? 0 : v[0], stop = a->npos == 1 ? v[0] : v[1], stp = a->npos == 3 ? v[2] : 1;
            if (stp == 0) FAIL("range() arg 3 must not be zero");
            int64_t cnt = stp > 0 ? (stop > start ? (stop - start + stp - 1) / stp : 0)
                                  : (start > stop ? (start - stop - stp - 1) / -stp : 0);
            if (cnt > 100000) FAIL("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
            jv *r = mk_list(c, 0);
            for (int64_t i = 0; i < cnt; i++) list_push(c, r, mk_int(c, start + i * stp));
            return r;
        }
        case BI_DICT: case BI_NAMESPACE: {
            jv *d = mk_dict(c, f->u.bi == BI_DICT ? JV_DICT : JV_NS);
            if (a->npos > 1) FAIL("%s expected at most 1 argument, got %zu", f->u.bi == BI_DICT ? "dict" : "namespace", a->npos);
            if (a->npos == 1) {
                jv *src = a->pos[0];
                if (src->t == JV_DICT || src->t == JV_NS) {
                    for (size_t i = 0; i < src->u.d->n; i++) dv_set(c, d, src->u.d->k[i], src->u.d->v[i]);
                } else {
                    jvec *it = iter_items(c, src);
                    for (size_t i = 0; i < it->n; i++) {
                        jv *p = it->v[i];
                        jvec *pi = iter_items(c, p);
                        if (pi->n != 2) FAIL("dictionary update sequence element #%zu has length %zu; 2 is required", i, pi->n);
                        dv_set(c, d, pi->v[0], pi->v[1]);
                    }
                }
            }
            for (size_t k = 0; k < a->nkw; k++) dv_set(c, d, mk_str(c, a->kwn[k]), a->kwv[k]);
            if (f->u.bi == BI_NAMESPACE)
                for (size_t i = 0; i < d->u.d->n; i++)
                    if (d->u.d->k[i]->t == JV_STR && d->u.d->k[i]->u.s.n && d->u.d->k[i]->u.s.p[0] == '_')
                        FAIL("SecurityError: Chat templates cannot store underscore-prefixed attributes on a namespace, "
                             "but got '%.*s'. Please rename the attribute.", (int)d->u.d->k[i]->u.s.n, d->u.d->k[i]->u.s.p);
            return d;
        }
        case BI_RAISE: {
            jv *m = arg(a, 0, "message", NULL);
            if (!m) FAIL("raise_exception() missing 1 required positional argument: 'message'");
            sbuf b = {0};
            fmt_val(c, &b, m, 0, 0);
            jfail(c, c->line, FT_ERR_INVALID_ARG, "%s", b.p ? b.p : "");
        }
        case BI_STRFTIME: {
            jv *fm = arg(a, 0, "format", NULL);
            if (!fm || fm->t != JV_STR) FAIL("strftime_now() argument must be str");
            struct tm tm;
            if (!tm_now(c, &tm)) FAIL("strftime_now: cannot convert the time");
            const char *fs = jstrndup(c, fm->u.s.p, fm->u.s.n);
            size_t cap = 256 + fm->u.s.n * 16;
            char *buf = jalloc(c, cap);
            size_t k = fm->u.s.n ? strftime(buf, cap, fs, &tm) : 0;
            return mk_strn(c, buf, k);
        }
        default:
            UNSUP("cycler(), joiner() and lipsum() are not supported");
        }
    default:
        FAIL("'%s' object is not callable", type_name(f));
    }
}

/* ================================================================ tests */

static int run_test(jctx *c, frame *fr, const char *name, jv *v, const eargs *a)
{
    (void)fr;
    if (!in_list(known_tests, name)) FAIL("No test named '%s' found.", name);
    jv *x = arg(a, 0, NULL, NULL);
    if (!strcmp(name, "defined")) return v->t != JV_UNDEF;
    if (!strcmp(name, "undefined")) return v->t == JV_UNDEF;
    if (!strcmp(name, "none")) return v->t == JV_NONE;
    if (!strcmp(name, "boolean")) return v->t == JV_BOOL;
    if (!strcmp(name, "true")) return v->t == JV_BOOL && v->u.b;
    if (!strcmp(name, "false")) return v->t == JV_BOOL && !v->u.b;
    if (!strcmp(name, "integer")) return v->t == JV_INT;
    if (!strcmp(name, "float")) return v->t == JV_FLOAT;
    if (!strcmp(name, "number")) return is_num(v);
    if (!strcmp(name, "string")) return v->t == JV_STR;
    if (!strcmp(name, "mapping")) return v->t == JV_DICT;
    if (!strcmp(name, "iterable")) return v->t == JV_STR || v->t == JV_LIST || v->t == JV_DICT || v->t == JV_UNDEF;
    if (!strcmp(name, "sequence"))
        return v->t == JV_STR || (v->t == JV_LIST && v->flag <= LK_TUPLE) || v->t == JV_DICT || v->t == JV_UNDEF;
    if (!strcmp(name, "callable"))
        return v->t == JV_MACRO || v->t == JV_BUILTIN || v->t == JV_METHOD || (v->t == JV_LOOP && 0);
    if (!strcmp(name, "escaped")) return v->t == JV_STR && v->flag;
    if (!strcmp(name, "sameas")) {
        if (!x) FAIL("test sameas needs an argument");
        if (v->t != x->t) return 0;
        if (v->t == JV_NONE || v->t == JV_BOOL) return v->t == JV_NONE || v->u.b == x->u.b;
        if (v->t == JV_INT) return v->u.i == x->u.i && v->u.i >= -5 && v->u.i <= 256;
        return v == x;
    }
    if (!strcmp(name, "lower") || !strcmp(name, "upper")) {
        if (v->t != JV_STR) v = to_str(c, v);
        eargs none = {0};
        return truthy(call_method(c, v, name[0] == 'l' ? "islower" : "isupper", &none));
    }
    if (!strcmp(name, "odd") || !strcmp(name, "even") || !strcmp(name, "divisibleby")) {
        if (v->t == JV_UNDEF) undef_fail(c, v);
        if (!strcmp(name, "divisibleby")) {
            if (!x) FAIL("test divisibleby needs an argument");
            jv *r = arith(c, OP_MOD, v, x);
            return !truthy(r);
        }
        if (v->t != JV_INT && v->t != JV_BOOL) FAIL("test %s needs an integer, not %s", name, type_name(v));
        return (num_i(v) % 2 != 0) == (name[0] == 'o');
    }
    if (!x) FAIL("test '%s' needs an argument", name);
    if (!strcmp(name, "in")) return jv_contains(c, x, v);
    if (!strcmp(name, "==") || !strcmp(name, "eq") || !strcmp(name, "equalto")) return jv_eq(v, x);
    if (!strcmp(name, "!=") || !strcmp(name, "ne")) return !jv_eq(v, x);
    if (!strcmp(name, "<") || !strcmp(name, "lt") || !strcmp(name, "lessthan")) return jv_cmp(c, v, x) < 0;
    if (!strcmp(name, "<=") || !strcmp(name, "le")) return jv_cmp(c, v, x) <= 0;
    if (!strcmp(name, ">") || !strcmp(name, "gt") || !strcmp(name, "greaterthan")) return jv_cmp(c, v, x) > 0;
    if (!strcmp(name, ">=") || !strcmp(name, "ge")) return jv_cmp(c, v, x) >= 0;
    UNSUP("the '%s' test is not supported", name);
}

/* ============================================================== filters */

/* environment.getitem over a dotted path (jinja2's make_attrgetter) */
static jv *attr_path(jctx *c, jv *v, jv *attr)
{
    if (attr->t == JV_INT) return get_item(c, v, attr);
    if (attr->t != JV_STR) FAIL("attribute must be a string or an integer");
    const char *p = attr->u.s.p, *end = p + attr->u.s.n;
    while (p <= end) {
        const char *dot = memchr(p, '.', (size_t)(end - p));
        if (!dot) dot = end;
        size_t l = (size_t)(dot - p);
        int digits = l > 0;
        for (size_t i = 0; i < l; i++) if (!is_dig((unsigned char)p[i])) digits = 0;
        jv *key = digits ? mk_int(c, strtoll(jstrndup(c, p, l), NULL, 10)) : mk_strn(c, p, l);
        if (v->t == JV_UNDEF) undef_fail(c, v);
        v = get_item(c, v, key);
        p = dot + 1;
    }
    return v;
}

static jv *sort_key(jctx *c, jv *v, int case_sensitive)
{
    if (!case_sensitive && v->t == JV_STR) return str_case(c, v, 1);
    return v;
}

/* stable merge-free insertion sort of idx by keys (n small in templates; bounded by steps) */
static void sort_idx(jctx *c, size_t *idx, jv **keys, size_t n, int reverse)
{
    for (size_t i = 1; i < n; i++)
        for (size_t j = i; j > 0; j--) {
            int r = jv_cmp(c, keys[idx[j - 1]], keys[idx[j]]);
            step(c);
            if (reverse ? r >= 0 : r <= 0) break;
            size_t t = idx[j]; idx[j] = idx[j - 1]; idx[j - 1] = t;
        }
}

static jv *select_common(jctx *c, frame *fr, jv *v, const eargs *a, int attr_mode, int keep)
{
    if (!truthy(v)) return mk_list(c, LK_GEN);   /* jinja2: "if value:" before iterating */
    jvec *it = iter_items(c, v);
    size_t off = attr_mode ? 1 : 0;
    jv *attr = attr_mode ? arg(a, 0, NULL, NULL) : NULL;
    if (attr_mode && !attr) FAIL("selectattr/rejectattr need an attribute name");
    jv *tn = arg(a, off, NULL, NULL);
    eargs ta = {0};
    if (a->npos > off + 1) { ta.pos = a->pos + off + 1; ta.npos = a->npos - off - 1; }
    if (tn && tn->t != JV_STR) FAIL("the test name must be a string");
    const char *tname = tn ? jstrndup(c, tn->u.s.p, tn->u.s.n) : NULL;
    if (tname && !in_list(known_tests, tname)) FAIL("No test named '%s'", tname);
    jv *r = mk_list(c, LK_GEN);
    for (size_t i = 0; i < it->n; i++) {
        jv *x = attr_mode ? attr_path(c, it->v[i], attr) : it->v[i];
        int ok = tname ? run_test(c, fr, tname, x, &ta) : truthy(x);
        if (ok == keep) list_push(c, r, it->v[i]);
        step(c);
    }
    return r;
}

static jv *f_indent(jctx *c, jv *s, const eargs *a)
{
    jv *w = arg(a, 0, "width", NULL), *first = arg(a, 1, "first", &V_FALSE), *blank = arg(a, 2, "blank", &V_FALSE);
    const char *ind = "    ";
    size_t il = 4;
    sbuf ib = {0};
    if (w && w->t == JV_STR) { ind = w->u.s.p; il = w->u.s.n; }
    else if (w) {
        if (w->t != JV_INT || w->u.i < 0 || w->u.i > 4096) FAIL("indent width must be a small non-negative integer");
        for (int64_t i = 0; i < w->u.i; i++) sb_addc(c, &ib, ' ');
        ind = ib.p ? ib.p : "";
        il = ib.n;
    }
    s = to_str(c, s);
    /* s += "\n"; lines = s.splitlines() */
    jv *lines;
    {
        jv *s2 = str_concat(c, s, mk_str(c, "\n"), 0);
        eargs none = {0};
        lines = call_method(c, s2, "splitlines", &none);
    }
    jvec *L = lines->u.l;
    sbuf b = {0};
    if (truthy(first)) sb_add(c, &b, ind, il);
    for (size_t i = 0; i < L->n; i++) {
        if (i) {
            sb_addc(c, &b, '\n');
            if (truthy(blank) || L->v[i]->u.s.n) sb_add(c, &b, ind, il);
        }
        sb_add(c, &b, L->v[i]->u.s.p, L->v[i]->u.s.n);
    }
    return mk_str_sb(c, &b);
}

static jv *f_tojson(jctx *c, jv *v, const eargs *a)
{
    static const char *const kw[] = {"ensure_ascii", "indent", "separators", "sort_keys", NULL};
    check_args(c, a, "tojson", 4, kw);
    jsonopt o = {0};
    o.ensure_ascii = truthy(arg(a, 0, "ensure_ascii", &V_FALSE));
    jv *ind = arg(a, 1, "indent", &V_NONE), *sep = arg(a, 2, "separators", &V_NONE);
    o.sort_keys = truthy(arg(a, 3, "sort_keys", &V_FALSE));
    if (ind->t == JV_INT || ind->t == JV_BOOL) {
        int64_t k = num_i(ind);
        if (k > 256) FAIL("tojson indent too large");
        char *sp = jalloc(c, (size_t)(k > 0 ? k : 0) + 1);
        int64_t i;
        for (i = 0; i < k; i++) sp[i] = ' ';
        sp[i > 0 ? i : 0] = 0;
        o.indent = sp;
    } else if (ind->t == JV_STR) o.indent = jstrndup(c, ind->u.s.p, ind->u.s.n);
    else if (ind->t != JV_NONE) FAIL("tojson indent must be an integer, a string or None");
    o.item_sep = o.indent ? "," : ", ";
    o.key_sep = ": ";
    if (sep->t != JV_NONE) {
        if (sep->t != JV_LIST || sep->u.l->n != 2 || sep->u.l->v[0]->t != JV_STR || sep->u.l->v[1]->t != JV_STR)
            FAIL("tojson separators must be a pair of strings");
        o.item_sep = jstrndup(c, sep->u.l->v[0]->u.s.p, sep->u.l->v[0]->u.s.n);
        o.key_sep = jstrndup(c, sep->u.l->v[1]->u.s.p, sep->u.l->v[1]->u.s.n);
    }
    sbuf b = {0};
    json_val(c, &b, v, &o, 0);
    return mk_str_sb(c, &b);
}

/* Python int(str) / float(str) */
static int parse_pyint(const char *s, size_t n, int64_t *out)
{
    char buf[64];
    size_t m = 0, i = 0;
    while (i < n && re_space((unsigned char)s[i])) i++;
    while (n > i && re_space((unsigned char)s[n - 1])) n--;
    if (i < n && (s[i] == '+' || s[i] == '-')) buf[m++] = s[i++];
    size_t digits = 0;
    for (; i < n; i++) {
        if (is_dig((unsigned char)s[i])) { if (m >= 20) return 0; buf[m++] = s[i]; digits++; }
        else if (s[i] == '_' && digits && i + 1 < n && is_dig((unsigned char)s[i + 1])) continue;
        else return 0;
    }
    if (!digits) return 0;
    buf[m] = 0;
    errno = 0;
    long long v = strtoll(buf, NULL, 10);
    if (errno) return 0;
    *out = v;
    return 1;
}

static int parse_pyfloat(const char *s, size_t n, double *out)
{
    char buf[128];
    size_t i = 0, m = 0;
    while (i < n && re_space((unsigned char)s[i])) i++;
    while (n > i && re_space((unsigned char)s[n - 1])) n--;
    if (n - i == 0 || n - i >= sizeof buf) return 0;
    for (; i < n; i++) {
        if (s[i] == '_') continue;
        if (!strchr("0123456789+-.eEinfatyINFATY", s[i])) return 0;
        buf[m++] = s[i];
    }
    buf[m] = 0;
    if (strpbrk(buf, "xXpP")) return 0;
    char *end;
    double v = strtod(buf, &end);
    if (*end) return 0;
    *out = v;
    return 1;
}

static jv *run_filter(jctx *c, frame *fr, const char *name, jv *v, const eargs *a)
{
    if (!in_list(known_filters, name)) FAIL("No filter named '%s' found.", name);
    if (!strcmp(name, "tojson")) return f_tojson(c, v, a);
    if (!strcmp(name, "length") || !strcmp(name, "count")) return mk_int(c, (int64_t)jv_len(c, v));
    if (!strcmp(name, "default") || !strcmp(name, "d")) {
        jv *dv = arg(a, 0, "default_value", &V_EMPTY), *bo = arg(a, 1, "boolean", &V_FALSE);
        if (v->t == JV_UNDEF || (truthy(bo) && !truthy(v))) return dv;
        return v;
    }
    if (!strcmp(name, "safe")) {
        jv *s = to_str(c, v);
        jv *r = mk(c, JV_STR);
        *r = *s;
        r->flag = 1;
        return r;
    }
    if (!strcmp(name, "string")) return to_str(c, v);
    if (!strcmp(name, "trim")) return str_strip(c, to_str(c, v), arg(a, 0, "chars", NULL), 3);
    if (!strcmp(name, "upper")) return str_case(c, to_str(c, v), 0);
    if (!strcmp(name, "lower")) return str_case(c, to_str(c, v), 1);
    if (!strcmp(name, "capitalize")) return str_case(c, to_str(c, v), 2);
    if (!strcmp(name, "title")) {
        /* jinja2: words split by [-\s({\[<]+; each item[0].upper() + item[1:].lower() */
        jv *s = to_str(c, v);
        sbuf b = {0};
        int at_start = 1;
        for (size_t i = 0; i < s->u.s.n;) {
            int32_t cp;
            size_t l = u8_dec(s->u.s.p + i, s->u.s.n - i, &cp);
            int delim = py_space(cp) || cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<';
            if (delim) sb_add(c, &b, s->u.s.p + i, l);
            else if (!at_start && cp == 0x3a3 && final_sigma(s->u.s.p, s->u.s.n, i, l)) sb_adds(c, &b, "\xcf\x82");
            else add_case(c, &b, cp, at_start ? 0 : 1);
            at_start = delim;
            i += l;
        }
        return mk_str_sb(c, &b);
    }
    if (!strcmp(name, "replace")) {
        jv *o = arg(a, 0, "old", NULL), *nw = arg(a, 1, "new", NULL), *cnt = arg(a, 2, "count", &V_NONE);
        if (!o || !nw) FAIL("replace filter needs old and new");
        return str_replace(c, to_str(c, v), to_str(c, o), to_str(c, nw), cnt->t == JV_INT ? cnt->u.i : -1);
    }
    if (!strcmp(name, "join")) {
        jv *d = arg(a, 0, "d", &V_EMPTY), *attr = arg(a, 1, "attribute", NULL);
        jvec *it = iter_items(c, v);
        d = to_str(c, d);
        sbuf b = {0};
        for (size_t i = 0; i < it->n; i++) {
            if (i) sb_add(c, &b, d->u.s.p, d->u.s.n);
            jv *x = attr ? attr_path(c, it->v[i], attr) : it->v[i];
            fmt_val(c, &b, x, 0, 0);
        }
        return mk_str_sb(c, &b);
    }
    if (!strcmp(name, "first") || !strcmp(name, "last")) {
        if (name[0] == 'l' && v->t == JV_LIST && v->flag == LK_GEN) FAIL("'generator' object is not reversible");
        jvec *it = iter_items(c, v);
        if (!it->n) return mk_undef(c, "No %s item, sequence was empty.", name);
        return name[0] == 'f' ? it->v[0] : it->v[it->n - 1];
    }
    if (!strcmp(name, "list")) return as_list(c, v);
    if (!strcmp(name, "items")) {
        if (v->t == JV_UNDEF) return mk_list(c, 0);
        if (v->t != JV_DICT) FAIL("Can only get item pairs from a mapping.");
        jv *r = dict_items_list(c, v);
        r->flag = LK_GEN;
        return r;
    }
    if (!strcmp(name, "map")) {
        jv *r = mk_list(c, LK_GEN);
        if (!truthy(v)) return r;
        jvec *it = iter_items(c, v);
        jv *attr = arg(a, (size_t)-1, "attribute", NULL);
        if (attr) {
            jv *def = arg(a, (size_t)-1, "default", NULL);
            for (size_t i = 0; i < it->n; i++) {
                jv *x = attr_path(c, it->v[i], attr);
                if (x->t == JV_UNDEF && def) x = def;
                list_push(c, r, x);
            }
            return r;
        }
        jv *fn = arg(a, 0, NULL, NULL);
        if (!fn || fn->t != JV_STR) FAIL("map requires a filter argument");
        const char *fname = jstrndup(c, fn->u.s.p, fn->u.s.n);
        if (!in_list(known_filters, fname)) FAIL("No filter named '%s'", fname);
        eargs fa = *a;
        fa.pos++;
        fa.npos--;
        for (size_t i = 0; i < it->n; i++) list_push(c, r, run_filter(c, fr, fname, it->v[i], &fa));
        return r;
    }
    if (!strcmp(name, "select")) return select_common(c, fr, v, a, 0, 1);
    if (!strcmp(name, "reject")) return select_common(c, fr, v, a, 0, 0);
    if (!strcmp(name, "selectattr")) return select_common(c, fr, v, a, 1, 1);
    if (!strcmp(name, "rejectattr")) return select_common(c, fr, v, a, 1, 0);
    if (!strcmp(name, "reverse")) {
        if (v->t == JV_STR) {
            jvec *it = iter_items(c, v);
            sbuf b = {0};
            for (size_t i = it->n; i > 0; i--) sb_add(c, &b, it->v[i - 1]->u.s.p, it->v[i - 1]->u.s.n);
            return mk_str_sb(c, &b);
        }
        int gen = v->t == JV_LIST && v->flag == LK_GEN;
        jvec *it = iter_items(c, v);
        jv *r = mk_list(c, gen ? LK_LIST : LK_GEN);   /* reversed(seq), or a list of an iterator */
        for (size_t i = it->n; i > 0; i--) list_push(c, r, it->v[i - 1]);
        return r;
    }
    if (!strcmp(name, "sort") || !strcmp(name, "unique") || !strcmp(name, "min") || !strcmp(name, "max") ||
        !strcmp(name, "dictsort")) {
        int dsort = !strcmp(name, "dictsort");
        jvec *it;
        if (dsort) {
            if (v->t != JV_DICT) FAIL("dictsort needs a mapping");
            it = dict_items_list(c, v)->u.l;
        } else it = iter_items(c, v);
        size_t pi = 0;
        jv *rev = &V_FALSE, *cs, *attr = NULL, *by = NULL;
        if (!strcmp(name, "sort")) rev = arg(a, pi++, "reverse", &V_FALSE);
        cs = arg(a, pi++, "case_sensitive", &V_FALSE);
        if (dsort) { by = arg(a, pi++, "by", NULL); rev = arg(a, pi++, "reverse", &V_FALSE); }
        else attr = arg(a, pi++, "attribute", NULL);
        jv **keys = jalloc(c, (it->n + 1) * sizeof *keys);
        size_t *idx = jalloc(c, (it->n + 1) * sizeof *idx);
        for (size_t i = 0; i < it->n; i++) {
            jv *x = it->v[i];
            if (dsort) {
                int pos = 0;
                if (by && by->t == JV_STR && by->u.s.n == 5 && !memcmp(by->u.s.p, "value", 5)) pos = 1;
                else if (by && !(by->t == JV_STR && by->u.s.n == 3 && !memcmp(by->u.s.p, "key", 3)))
                    FAIL("You can only sort by either \"key\" or \"value\"");
                x = x->u.l->v[pos];
            } else if (attr) x = attr_path(c, x, attr);
            keys[i] = sort_key(c, x, truthy(cs));
            idx[i] = i;
        }
        if (!strcmp(name, "unique")) {
            jv *r = mk_list(c, LK_GEN);
            for (size_t i = 0; i < it->n; i++) {
                int seen = 0;
                for (size_t j = 0; j < i && !seen; j++) seen = jv_eq(keys[j], keys[i]);
                step(c);
                if (!seen) list_push(c, r, it->v[i]);
            }
            return r;
        }
        if (!strcmp(name, "min") || !strcmp(name, "max")) {
            if (!it->n) return mk_undef(c, "No aggregated item, sequence was empty.");
            size_t best = 0;
            for (size_t i = 1; i < it->n; i++) {
                int r = jv_cmp(c, keys[i], keys[best]);
                if (name[1] == 'i' ? r < 0 : r > 0) best = i;
            }
            return it->v[best];
        }
        sort_idx(c, idx, keys, it->n, truthy(rev));
        jv *r = mk_list(c, 0);
        for (size_t i = 0; i < it->n; i++) list_push(c, r, it->v[idx[i]]);
        return r;
    }
    if (!strcmp(name, "int")) {
        jv *def = arg(a, 0, "default", NULL), *base = arg(a, 1, "base", NULL);
        if (base && !(base->t == JV_INT && base->u.i == 10)) UNSUP("int filter: only base 10 is supported");
        if (!def) def = mk_int(c, 0);
        if (v->t == JV_INT) return v;
        if (v->t == JV_BOOL) return mk_int(c, v->u.b);
        if (v->t == JV_FLOAT) {
            if (!isfinite(v->u.f) || fabs(v->u.f) > 9e18) return def;
            return mk_int(c, (int64_t)v->u.f);
        }
        if (v->t == JV_STR) {
            int64_t i;
            double f;
            if (parse_pyint(v->u.s.p, v->u.s.n, &i)) return mk_int(c, i);
            if (parse_pyfloat(v->u.s.p, v->u.s.n, &f) && isfinite(f) && fabs(f) < 9e18) return mk_int(c, (int64_t)f);
        }
        return def;
    }
    if (!strcmp(name, "float")) {
        jv *def = arg(a, 0, "default", NULL);
        if (!def) def = mk_float(c, 0.0);
        if (is_num(v)) return mk_float(c, num_f(v));
        double f;
        if (v->t == JV_STR && parse_pyfloat(v->u.s.p, v->u.s.n, &f)) return mk_float(c, f);
        return def;
    }
    if (!strcmp(name, "abs")) {
        if (v->t == JV_INT) { if (v->u.i == INT64_MIN) UNSUP("integer beyond 64 bits"); return mk_int(c, v->u.i < 0 ? -v->u.i : v->u.i); }
        if (v->t == JV_BOOL) return mk_int(c, v->u.b);
        if (v->t == JV_FLOAT) return mk_float(c, fabs(v->u.f));
        FAIL("bad operand type for abs(): '%s'", type_name(v));
    }
    if (!strcmp(name, "round")) {
        jv *pr = arg(a, 0, "precision", NULL), *me = arg(a, 1, "method", NULL);
        int64_t p = pr && pr->t == JV_INT ? pr->u.i : 0;
        if (p < -300 || p > 300) FAIL("round precision out of range");
        const char *method = me && me->t == JV_STR ? jstrndup(c, me->u.s.p, me->u.s.n) : "common";
        if (!is_num(v)) FAIL("type %s doesn't define __round__ method", type_name(v));
        if (strcmp(method, "common") && strcmp(method, "ceil") && strcmp(method, "floor"))
            FAIL("method must be common, ceil or floor");
        if (!strcmp(method, "common")) {
            if (v->t != JV_FLOAT) {
                if (p >= 0) return mk_int(c, num_i(v));
                UNSUP("round of an integer to a negative precision");
            }
            if (p < 0 || !isfinite(v->u.f)) UNSUP("round to a negative precision");
            char buf[400];
            snprintf(buf, sizeof buf, "%.*f", (int)p, v->u.f);
            return mk_float(c, strtod(buf, NULL));
        }
        double m = pow(10.0, (double)p), x = num_f(v) * m;
        return mk_float(c, (method[0] == 'c' ? ceil(x) : floor(x)) / m);
    }
    if (!strcmp(name, "indent")) return f_indent(c, v, a);
    if (!strcmp(name, "wordcount")) {
        jv *s = to_str(c, v);
        int64_t k = 0;
        int in = 0;
        for (size_t i = 0; i < s->u.s.n;) {
            int32_t cp;
            i += u8_dec(s->u.s.p + i, s->u.s.n - i, &cp);
            int w = cp == '_' || cp_is_alpha(cp) || cp_is_digit(cp) ||
                    utf8proc_category(cp) == UTF8PROC_CATEGORY_NL || utf8proc_category(cp) == UTF8PROC_CATEGORY_NO ||
                    utf8proc_category(cp) == UTF8PROC_CATEGORY_MN || utf8proc_category(cp) == UTF8PROC_CATEGORY_MC;
            if (w && !in) k++;
            in = w;
        }
        return mk_int(c, k);
    }
    if (!strcmp(name, "center")) {
        jv *w = arg(a, 0, "width", NULL);
        eargs ca = {0};
        jv *wv = w ? w : mk_int(c, 80);
        ca.pos = &wv;
        ca.npos = 1;
        return call_method(c, to_str(c, v), "center", &ca);
    }
    if (!strcmp(name, "e") || !strcmp(name, "escape") || !strcmp(name, "forceescape")) {
        if (!strcmp(name, "forceescape") && v->t == JV_STR && v->flag) { jv *s = mk(c, JV_STR); *s = *v; s->flag = 0; v = s; }
        return markup_escape(c, v);
    }
    if (!strcmp(name, "attr")) {
        jv *n = arg(a, 0, "name", NULL);
        if (!n || n->t != JV_STR) FAIL("attr filter needs an attribute name");
        const char *an = jstrndup(c, n->u.s.p, n->u.s.n);
        if (v->t == JV_DICT && !in_list(dict_methods, an) && !in_list(dict_mutators, an) && an[0] != '_')
            return mk_undef(c, "'%s' has no attribute '%s'", obj_type_repr(v), an);   /* getattr only, no item */
        return get_attr(c, v, an);
    }
    if (!strcmp(name, "batch")) {
        jv *cnt = arg(a, 0, "linecount", NULL), *fill = arg(a, 1, "fill_with", NULL);
        if (!cnt || cnt->t != JV_INT || cnt->u.i <= 0) FAIL("batch needs a positive count");
        jvec *it = iter_items(c, v);
        jv *r = mk_list(c, LK_GEN), *cur_ = NULL;
        for (size_t i = 0; i < it->n; i++) {
            if (!cur_ || (int64_t)cur_->u.l->n == cnt->u.i) { cur_ = mk_list(c, 0); list_push(c, r, cur_); }
            list_push(c, cur_, it->v[i]);
        }
        if (cur_ && fill && fill->t != JV_NONE)
            while ((int64_t)cur_->u.l->n < cnt->u.i) list_push(c, cur_, fill);
        return r;
    }
    if (!strcmp(name, "sum")) {
        jv *attr = arg(a, 0, "attribute", NULL), *acc = arg(a, 1, "start", NULL);
        if (!acc) acc = mk_int(c, 0);
        jvec *it = iter_items(c, v);
        for (size_t i = 0; i < it->n; i++) acc = arith(c, OP_ADD, acc, attr ? attr_path(c, it->v[i], attr) : it->v[i]);
        return acc;
    }
    if (!strcmp(name, "format")) {
        jv *s = to_str(c, v);
        jv *t = mk_list(c, 1);
        for (size_t i = 0; i < a->npos; i++) list_push(c, t, a->pos[i]);
        if (a->nkw) UNSUP("keyword arguments of the format filter are not supported");
        return str_percent(c, s, t);
    }
    UNSUP("the '%s' filter is not supported", name);
}

/* ================================================================ eval */

static eargs eval_args(jctx *c, frame *fr, const callargs *ca, jv *extra_caller)
{
    eargs a = {0};
    size_t np = ca->args.n, nk = ca->kwvals.n;
    jvec dyn = {0};
    if (ca->dyn_args) {
        jv *d = eval(c, fr, ca->dyn_args);
        jvec *it = iter_items(c, d);
        for (size_t i = 0; i < it->n; i++) VEC_PUSH(c, &dyn, it->v[i]);
    }
    jv *dk = ca->dyn_kwargs ? eval(c, fr, ca->dyn_kwargs) : NULL;
    if (dk && dk->t != JV_DICT) FAIL("argument after ** must be a mapping, not %s", type_name(dk));
    size_t ndk = dk ? dk->u.d->n : 0;
    a.pos = jalloc(c, (np + dyn.n + 1) * sizeof *a.pos);
    for (size_t i = 0; i < np; i++) a.pos[a.npos++] = eval(c, fr, ca->args.v[i]);
    for (size_t i = 0; i < dyn.n; i++) a.pos[a.npos++] = dyn.v[i];
    a.kwn = jalloc(c, (nk + ndk + 2) * sizeof *a.kwn);
    a.kwv = jalloc(c, (nk + ndk + 2) * sizeof *a.kwv);
    for (size_t i = 0; i < nk; i++) {
        a.kwn[a.nkw] = ca->kwnames[i];
        a.kwv[a.nkw++] = eval(c, fr, ca->kwvals.v[i]);
    }
    for (size_t i = 0; i < ndk; i++) {
        jv *k = dk->u.d->k[i];
        if (k->t != JV_STR) FAIL("keywords must be strings");
        a.kwn[a.nkw] = jstrndup(c, k->u.s.p, k->u.s.n);
        a.kwv[a.nkw++] = dk->u.d->v[i];
    }
    if (extra_caller) {
        a.kwn[a.nkw] = "caller";
        a.kwv[a.nkw++] = extra_caller;
    }
    return a;
}

static jv *eval_call(jctx *c, frame *fr, node *n, jv *caller)
{
    jv *f = eval(c, fr, n->a);
    eargs a = eval_args(c, fr, n->ca, caller);
    c->line = n->line;
    if (caller && f->t == JV_MACRO) {
        a.nkw--;   /* passed separately */
        return call_macro(c, f->u.m, &a, caller);
    }
    return call_value(c, f, &a);
}

static jv *apply_filter(jctx *c, frame *fr, node *f, jv *v)
{
    if (f->a) v = apply_filter(c, fr, f->a, v);
    eargs a = eval_args(c, fr, f->ca, NULL);
    c->line = f->line;
    return run_filter(c, fr, f->name, v, &a);
}

static jv *eval(jctx *c, frame *fr, node *n)
{
    step(c);
    enter_depth(c);
    c->line = n->line;
    jv *r;
    switch (n->kind) {
    case E_CONST: r = n->val; break;
    case E_NAME: r = lookup(c, fr, n->name); break;
    case E_LIST: case E_TUPLE:
        r = mk_list(c, n->kind == E_TUPLE);
        for (size_t i = 0; i < n->items.n; i++) list_push(c, r, eval(c, fr, n->items.v[i]));
        break;
    case E_DICT:
        r = mk_dict(c, JV_DICT);
        for (size_t i = 0; i < n->items.n; i++) {
            jv *k = eval(c, fr, n->items.v[i]);
            if (k->t == JV_LIST && k->flag != LK_TUPLE) FAIL("unhashable type: '%s'", type_name(k));
            if (k->t == JV_DICT) FAIL("unhashable type: 'dict'");
            dv_set(c, r, k, eval(c, fr, n->items2.v[i]));
        }
        break;
    case E_GETATTR: {
        jv *o = eval(c, fr, n->a);
        c->line = n->line;
        r = get_attr(c, o, n->name);
        break;
    }
    case E_GETITEM: {
        jv *o = eval(c, fr, n->a);
        jv *k = eval(c, fr, n->b);
        c->line = n->line;
        r = get_item(c, o, k);
        break;
    }
    case E_SLICE: {
        jv *o = eval(c, fr, n->a);
        jv *a = n->b ? eval(c, fr, n->b) : NULL, *b = n->c ? eval(c, fr, n->c) : NULL, *s = n->d ? eval(c, fr, n->d) : NULL;
        c->line = n->line;
        r = do_slice(c, o, a, b, s);
        break;
    }
    case E_CALL: r = eval_call(c, fr, n, NULL); break;
    case E_FILTER: {
        jv *v = eval(c, fr, n->a);
        eargs a = eval_args(c, fr, n->ca, NULL);
        c->line = n->line;
        r = run_filter(c, fr, n->name, v, &a);
        break;
    }
    case E_TEST: {
        jv *v = eval(c, fr, n->a);
        eargs a = eval_args(c, fr, n->ca, NULL);
        c->line = n->line;
        r = mk_bool(run_test(c, fr, n->name, v, &a));
        break;
    }
    case E_NOT: r = mk_bool(!truthy(eval(c, fr, n->a))); break;
    case E_NEG: case E_POS: {
        jv *v = eval(c, fr, n->a);
        c->line = n->line;
        if (v->t == JV_UNDEF) undef_fail(c, v);
        if (!is_num(v)) FAIL("bad operand type for unary %c: '%s'", n->kind == E_NEG ? '-' : '+', type_name(v));
        if (n->kind == E_POS) r = v->t == JV_BOOL ? mk_int(c, v->u.b) : v;
        else if (v->t == JV_FLOAT) r = mk_float(c, -v->u.f);
        else {
            if (num_i(v) == INT64_MIN) UNSUP("integer arithmetic beyond 64 bits is not supported");
            r = mk_int(c, -num_i(v));
        }
        break;
    }
    case E_BIN: {
        jv *a = eval(c, fr, n->a), *b = eval(c, fr, n->b);
        c->line = n->line;
        r = arith(c, n->op, a, b);
        break;
    }
    case E_AND: { jv *a = eval(c, fr, n->a); r = truthy(a) ? eval(c, fr, n->b) : a; break; }
    case E_OR: { jv *a = eval(c, fr, n->a); r = truthy(a) ? a : eval(c, fr, n->b); break; }
    case E_CMP: {
        jv *l = eval(c, fr, n->items.v[0]);
        r = &V_TRUE;
        for (size_t i = 1; i < n->items.n; i++) {
            jv *rv = eval(c, fr, n->items.v[i]);
            c->line = n->line;
            int ok;
            switch (n->ops[i - 1]) {
            case OP_EQ: ok = jv_eq(l, rv); break;
            case OP_NE: ok = !jv_eq(l, rv); break;
            case OP_LT: ok = jv_cmp(c, l, rv) < 0; break;
            case OP_LE: ok = jv_cmp(c, l, rv) <= 0; break;
            case OP_GT: ok = jv_cmp(c, l, rv) > 0; break;
            case OP_GE: ok = jv_cmp(c, l, rv) >= 0; break;
            case OP_IN: ok = jv_contains(c, rv, l); break;
            default: ok = !jv_contains(c, rv, l); break;
            }
            if (!ok) { r = &V_FALSE; break; }
            l = rv;
        }
        break;
    }
    case E_CONCAT: {
        sbuf b = {0};
        for (size_t i = 0; i < n->items.n; i++) fmt_val(c, &b, eval(c, fr, n->items.v[i]), 0, 0);
        r = mk_str_sb(c, &b);
        break;
    }
    case E_COND:
        if (truthy(eval(c, fr, n->a))) r = eval(c, fr, n->b);
        else if (n->c) r = eval(c, fr, n->c);
        else r = mk_undef(c, "the inline if-expression on line %d evaluated to false and no else section was defined.", n->line);
        break;
    default:
        jfail(c, n->line, FT_ERR_INTERNAL, "bad expression node %d", n->kind);
    }
    c->depth--;
    return r;
}

/* ============================================================== statements */

static void assign(jctx *c, frame *fr, const target *t, jv *v)
{
    if (t->kind == 0) { dict_sets(c, &fr->vars, t->name, v); return; }
    if (t->kind == 2) {
        jv *ns = lookup(c, fr, t->name);
        c->line = t->line;
        if (ns->t != JV_NS) FAIL("cannot assign attribute on non-namespace object");
        if (t->attr[0] == '_')
            FAIL("SecurityError: Chat templates cannot store underscore-prefixed attributes on a namespace, but got '%s'. "
                 "Please rename the attribute.", t->attr);
        dv_set(c, ns, mk_str(c, t->attr), v);
        return;
    }
    jvec *it = iter_items(c, v);
    c->line = t->line;
    if (it->n != t->nsub)
        FAIL(it->n > t->nsub ? "too many values to unpack (expected %zu)" : "not enough values to unpack (expected %zu, got %zu)",
             t->nsub, it->n);
    for (size_t i = 0; i < t->nsub; i++) assign(c, fr, t->sub[i], it->v[i]);
}

static void exec_for(jctx *c, frame *fr, const stmt *s, jv *iterable, int depth)
{
    jvec *items = iter_items(c, iterable);
    if (s->filt) {
        jvec *f = jzalloc(c, sizeof *f);
        for (size_t i = 0; i < items->n; i++) {
            frame *tf = new_frame(c, fr);
            assign(c, tf, s->tgt, items->v[i]);
            if (truthy(eval(c, tf, s->filt))) VEC_PUSH(c, f, items->v[i]);
        }
        items = f;
    }
    int completed = 0;   /* jinja2 runs else when no iteration finished its body (break/continue skip it) */
    jloop *l = jzalloc(c, sizeof *l);
    l->items = items;
    l->depth = depth;
    l->st = s;
    l->fr = fr;
    jv *lv = mk(c, JV_LOOP);
    lv->u.loop = l;
    for (size_t i = 0; i < items->n; i++) {
        step(c);
        l->index0 = i;
        frame *f = new_frame(c, fr);
        dict_sets(c, &f->vars, "loop", lv);
        assign(c, f, s->tgt, items->v[i]);
        exec_body(c, f, &s->body);
        if (!c->brk) completed = 1;
        if (c->brk == 1) { c->brk = 0; break; }
        c->brk = 0;
    }
    if (!completed && s->orelse.n) exec_body(c, new_frame(c, fr), &s->orelse);
}

static void exec_stmt(jctx *c, frame *fr, const stmt *s)
{
    step(c);
    c->line = s->line;
    switch (s->kind) {
    case S_DATA: sb_add(c, c->out, s->data, s->len); return;
    case S_PRINT: {
        jv *v = eval(c, fr, s->expr);
        fmt_val(c, c->out, v, 0, 0);
        return;
    }
    case S_IF:
        if (truthy(eval(c, fr, s->expr))) exec_body(c, fr, &s->body);
        else exec_body(c, fr, &s->orelse);
        return;
    case S_FOR: {
        jv *it = eval(c, fr, s->expr);
        c->line = s->line;
        enter_depth(c);
        exec_for(c, fr, s, it, 1);
        c->depth--;
        return;
    }
    case S_SET: assign(c, fr, s->tgt, eval(c, fr, s->expr)); return;
    case S_SETBLOCK: {
        enter_depth(c);
        jv *v = capture(c, new_frame(c, fr), &s->body);
        if (s->filt) v = apply_filter(c, fr, s->filt, v);
        c->depth--;
        assign(c, fr, s->tgt, v);
        return;
    }
    case S_MACRO: {
        jv *m = mk(c, JV_MACRO);
        m->u.m = jzalloc(c, sizeof *m->u.m);
        m->u.m->def = s->macro;
        m->u.m->closure = fr;
        dict_sets(c, &fr->vars, s->macro->name, m);
        return;
    }
    case S_CALLBLOCK: {
        jv *caller = mk(c, JV_MACRO);
        caller->u.m = jzalloc(c, sizeof *caller->u.m);
        caller->u.m->def = s->macro;
        caller->u.m->closure = fr;
        jv *r = eval_call(c, fr, s->expr, caller);
        fmt_val(c, c->out, r, 0, 0);
        return;
    }
    case S_FILTERBLOCK: {
        enter_depth(c);
        jv *v = capture(c, new_frame(c, fr), &s->body);
        v = apply_filter(c, fr, s->filt, v);
        c->depth--;
        fmt_val(c, c->out, v, 0, 0);
        return;
    }
    case S_BREAK: c->brk = 1; return;
    case S_CONTINUE: c->brk = 2; return;
    case S_WITH: {
        frame *f = new_frame(c, fr);
        for (size_t i = 0; i < s->nwith; i++) assign(c, f, s->wtargets[i], eval(c, fr, s->wvals[i]));
        enter_depth(c);
        exec_body(c, f, &s->body);
        c->depth--;
        return;
    }
    case S_SCOPE: {
        enter_depth(c);
        jv *v = capture(c, new_frame(c, fr), &s->body);
        c->depth--;
        sb_add(c, c->out, v->u.s.p, v->u.s.n);
        return;
    }
    }
}

static void exec_body(jctx *c, frame *fr, const svec *body)
{
    enter_depth(c);
    for (size_t i = 0; i < body->n && !c->brk; i++) exec_stmt(c, fr, body->v[i]);
    c->depth--;
}

/* ================================================================ JSON in */

static jv *from_json(jctx *c, struct json_object *o, unsigned depth)
{
    if (depth > 128) jfail(c, 0, FT_ERR_INVALID_ARG, "template variables nested too deeply");
    switch (json_object_get_type(o)) {
    case json_type_null: return &V_NONE;
    case json_type_boolean: return mk_bool(json_object_get_boolean(o));
    case json_type_int: return mk_int(c, json_object_get_int64(o));
    case json_type_double: return mk_float(c, json_object_get_double(o));
    case json_type_string: return mk_strn(c, json_object_get_string(o), (size_t)json_object_get_string_len(o));
    case json_type_array: {
        jv *l = mk_list(c, 0);
        size_t n = json_object_array_length(o);
        for (size_t i = 0; i < n; i++) list_push(c, l, from_json(c, json_object_array_get_idx(o, i), depth + 1));
        return l;
    }
    case json_type_object: {
        jv *d = mk_dict(c, JV_DICT);
        json_object_object_foreach(o, k, v) dv_set(c, d, mk_str(c, k), from_json(c, v, depth + 1));
        return d;
    }
    }
    return &V_NONE;
}

/* ================================================================ entry */

static char *normalize_newlines(const char *src, size_t len, size_t *out_len)
{
    char *d = malloc(len + 1);
    if (!d) return NULL;
    size_t n = 0;
    for (size_t i = 0; i < len;) {   /* jinja2 3.x: only \r\n, \r and \n are line breaks */
        if (src[i] == '\r') { d[n++] = '\n'; i += (i + 1 < len && src[i + 1] == '\n') ? 2 : 1; }
        else d[n++] = src[i++];
    }
    if (n && d[n - 1] == '\n') n--;   /* keep_trailing_newline=False */
    d[n] = 0;
    *out_len = n;
    return d;
}

FT_API ft_status ft_jinja_parse(const char *src, size_t len, ft_jinja **out)
{
    if (!src || !out) return ft_set_error(FT_ERR_INVALID_ARG, "jinja: NULL argument");
    ft_jinja *t = calloc(1, sizeof *t);
    if (!t) return ft_set_error(FT_ERR_NOMEM, "out of memory");
    jctx *c = calloc(1, sizeof *c);
    if (!c) { free(t); return ft_set_error(FT_ERR_NOMEM, "out of memory"); }
    t->a.limit = (size_t)1 << 30;
    c->a = &t->a;
    size_t nlen0 = 0;
    char *volatile norm = normalize_newlines(src, len, &nlen0);
    volatile size_t nlen = nlen0;
    if (!norm) { free(c); free(t); return ft_set_error(FT_ERR_NOMEM, "out of memory"); }
    if (setjmp(c->jb)) {
        ft_status st = c->st;
        ft_set_error(st, "%s", c->msg);
        free(norm);
        arena_free(&t->a);
        free(t);
        free(c);
        return st;
    }
    for (size_t i = 0; i < nlen;) {
        utf8proc_int32_t ch;
        utf8proc_ssize_t l = utf8proc_iterate((const utf8proc_uint8_t *)norm + i, (utf8proc_ssize_t)(nlen - i), &ch);
        if (l <= 0) {
            int line = 1;
            for (size_t k = 0; k < i; k++) line += norm[k] == '\n';
            jfail(c, line, FT_ERR_CORRUPT, "the template is not valid UTF-8 (byte %zu)", i);
        }
        i += (size_t)l;
    }
    /* keep the normalized source in the arena: DATA tokens point into it */
    c->src = jstrndup(c, norm, nlen);
    c->srclen = nlen;
    free(norm);
    norm = NULL;
    lex(c);
    parse_body(c, &t->body, NULL);
    check_body(c, &t->body, 0);
    free(c);
    *out = t;
    return FT_OK;
}

FT_API void ft_jinja_free(ft_jinja *t)
{
    if (!t) return;
    arena_free(&t->a);
    free(t);
}

FT_API ft_status ft_jinja_render(const ft_jinja *t, struct json_object *vars, int64_t now, const ft_jinja_limits *lim,
                                 char **out, size_t *out_len)
{
    if (!t || !out) return ft_set_error(FT_ERR_INVALID_ARG, "jinja: NULL argument");
    if (vars && !json_object_is_type(vars, json_type_object))
        return ft_set_error(FT_ERR_INVALID_ARG, "chat template variables must be a JSON object");
    jctx *c = calloc(1, sizeof *c);
    arena *a = calloc(1, sizeof *a);
    if (!c || !a) { free(c); free(a); return ft_set_error(FT_ERR_NOMEM, "out of memory"); }
    a->limit = lim && lim->max_memory ? lim->max_memory : (size_t)256 << 20;
    c->a = a;
    c->max_output = lim && lim->max_output ? lim->max_output : (size_t)16 << 20;
    c->max_steps = lim && lim->max_steps ? lim->max_steps : 20000000;
    c->max_depth = lim && lim->max_depth ? lim->max_depth : 200;
    c->now = now;
    if (setjmp(c->jb)) {
        ft_status st = c->st;
        ft_set_error(st, "%s", c->msg);
        arena_free(a);
        free(a);
        free(c);
        return st;
    }
    jdict *g = jzalloc(c, sizeof *g);
    c->globals = g;
    if (vars) {
        json_object_object_foreach(vars, k, v) dict_sets(c, g, k, from_json(c, v, 0));
    }
    sbuf *o = jzalloc(c, sizeof *o);
    c->out = o;
    frame *root = new_frame(c, NULL);
    exec_body(c, root, &t->body);
    char *res = malloc(o->n + 1);
    if (!res) jfail(c, 0, FT_ERR_NOMEM, "out of memory");
    if (o->n) memcpy(res, o->p, o->n);
    res[o->n] = 0;
    if (out_len) *out_len = o->n;
    *out = res;
    arena_free(a);
    free(a);
    free(c);
    return FT_OK;
}
