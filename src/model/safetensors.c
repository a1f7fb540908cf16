/* safetensors reader (mmap, fully validated) and atomic writer.
 *
 * Format: u64 little-endian header length N, N bytes of JSON header
 * {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]},
 *  "__metadata__": {"k": "v"}}, then the data section; offsets are relative
 * to the data section start (8 + N).
 *
 * json-c caveats handled here: it silently keeps the last of duplicate
 * object keys (we count the keys in the raw text to catch duplicates), it
 * clamps out-of-range integers (any clamped value fails our range checks)
 * and parses "1.0" as a double (rejected: offsets and dims must be exact
 * integers), and it stops at an embedded NUL (rejected up front). */
#include "model_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define ST_JSON_DEPTH 16
/* Per-dimension sanity bound; totals are checked against the file size. */
#define ST_MAX_DIM ((int64_t)1 << 48)

typedef struct {
    const char *name;
    unsigned esize;
    int supported;
    ft_dtype dt;
} st_dtype_info;

static const st_dtype_info st_dtypes[] = {
    {"F32", 4, 1, FT_F32},  {"F16", 2, 1, FT_F16},   {"BF16", 2, 1, FT_BF16},
    {"I8", 1, 1, FT_I8},    {"U8", 1, 1, FT_U8},     {"I32", 4, 1, FT_I32},
    {"F64", 8, 0, FT_F32},  {"I64", 8, 0, FT_F32},   {"I16", 2, 0, FT_F32},
    {"U16", 2, 0, FT_F32},  {"U32", 4, 0, FT_F32},   {"U64", 8, 0, FT_F32},
    {"BOOL", 1, 0, FT_F32}, {"F8_E4M3", 1, 0, FT_F32}, {"F8_E5M2", 1, 0, FT_F32},
    {"F8_E8M0", 1, 0, FT_F32},
};
#define ST_NDTYPES (sizeof st_dtypes / sizeof st_dtypes[0])

typedef struct {
    char *path;             /* for messages */
    const uint8_t *base;
    size_t size;
    int mapped;
    uint64_t data_off;      /* 8 + header length */
    json_object *meta;      /* "__metadata__" object or NULL (owned ref) */
} st_file;

typedef struct {
    char *name;
    const st_dtype_info *dt;
    uint32_t ndim;
    int64_t shape[FT_MAX_DIMS];
    uint64_t begin, end;
    uint32_t file;
} st_entry;

struct ft_checkpoint {
    st_file *files;
    size_t nfiles, files_cap;
    st_entry *e;
    size_t n, cap;
};

/* ------------------------------------------------------------ helpers */

static const st_dtype_info *st_dtype_find(const char *s)
{
    for (size_t i = 0; i < ST_NDTYPES; i++)
        if (!strcmp(st_dtypes[i].name, s)) return &st_dtypes[i];
    return NULL;
}

static const st_dtype_info *st_dtype_of(ft_dtype dt)
{
    for (size_t i = 0; i < ST_NDTYPES; i++)
        if (st_dtypes[i].supported && st_dtypes[i].dt == dt) return &st_dtypes[i];
    return NULL;
}

/* An exact non-negative JSON integer <= max. */
static int json_uint(json_object *o, int64_t max, int64_t *out)
{
    if (!o || json_object_get_type(o) != json_type_int) return 0;
    errno = 0;
    int64_t v = json_object_get_int64(o);
    if (v < 0 || v > max) return 0;
    /* values above INT64_MAX are clamped to INT64_MAX by json-c; > max */
    *out = v;
    return 1;
}

/* Skip one JSON value in already-validated text; returns the index after
 * it. Only strings and nesting matter. */
static size_t skip_ws(const char *s, size_t i, size_t n)
{
    while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) i++;
    return i;
}

static size_t skip_string(const char *s, size_t i, size_t n)
{
    /* s[i] == '"' */
    for (i++; i < n; i++) {
        if (s[i] == '\\') i++;
        else if (s[i] == '"') return i + 1;
    }
    return n;
}

static size_t skip_value(const char *s, size_t i, size_t n)
{
    int depth = 0;
    for (; i < n; ) {
        char c = s[i];
        if (c == '"') { i = skip_string(s, i, n); if (!depth) return i; continue; }
        if (c == '{' || c == '[') depth++;
        else if (c == '}' || c == ']') {
            if (!depth) return i;
            if (--depth == 0) return i + 1;
        } else if (!depth && (c == ',')) return i;
        i++;
    }
    return n;
}

/* Count the keys of the top-level object (text validated by json-c). If a
 * key occurs twice, *dup gets its unescaped name (malloc'd). */
static size_t count_top_keys(const char *s, size_t n, char **dup)
{
    size_t cnt = 0, i = skip_ws(s, 0, n);
    if (i >= n || s[i] != '{') return 0;
    i++;
    /* keys collected only if asked (second pass) */
    char **keys = NULL;
    size_t nk = 0, capk = 0;
    for (;;) {
        i = skip_ws(s, i, n);
        if (i >= n || s[i] != '"') break;
        size_t ks = i;
        i = skip_string(s, i, n);
        cnt++;
        if (dup) {
            char *tmp = strndup(s + ks, i - ks);
            json_object *ko = tmp ? json_tokener_parse(tmp) : NULL;
            free(tmp);
            if (ko && json_object_is_type(ko, json_type_string)) {
                const char *kv = json_object_get_string(ko);
                for (size_t k = 0; k < nk && !*dup; k++)
                    if (!strcmp(keys[k], kv)) *dup = strdup(kv);
                if (nk == capk) {
                    capk = capk ? capk * 2 : 16;
                    char **nkp = realloc(keys, capk * sizeof *keys);
                    if (!nkp) { json_object_put(ko); break; }
                    keys = nkp;
                }
                keys[nk] = strdup(kv);
                if (keys[nk]) nk++;
            }
            json_object_put(ko);
        }
        i = skip_ws(s, i, n);
        if (i >= n || s[i] != ':') break;
        i = skip_value(s, skip_ws(s, i + 1, n), n);
        i = skip_ws(s, i, n);
        if (i >= n || s[i] != ',') break;
        i++;
    }
    for (size_t k = 0; k < nk; k++) free(keys[k]);
    free(keys);
    return cnt;
}

static int cmp_name(const void *a, const void *b)
{
    return strcmp(((const st_entry *)a)->name, ((const st_entry *)b)->name);
}

typedef struct { uint64_t begin, end; const char *name; } st_range;

static int cmp_range(const void *a, const void *b)
{
    const st_range *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

/* ------------------------------------------------------ header parsing */

static ft_status add_entry(ft_checkpoint *ck, st_entry *e)
{
    if (ck->n == ck->cap) {
        size_t nc = ck->cap ? ck->cap * 2 : 64;
        st_entry *ne = realloc(ck->e, nc * sizeof *ne);
        if (!ne) return ft_set_error(FT_ERR_NOMEM, "out of memory");
        ck->e = ne;
        ck->cap = nc;
    }
    ck->e[ck->n++] = *e;
    return FT_OK;
}

static ft_status parse_tensor(const char *fn, const char *name, json_object *v,
                              uint64_t data_size, uint32_t fidx, st_entry *e)
{
    memset(e, 0, sizeof *e);
    if (!json_object_is_type(v, json_type_object))
        return ft_set_error(FT_ERR_CORRUPT, "%s: tensor '%s': entry is not an object", fn, name);
    json_object *jd, *js, *jo;
    if (!json_object_object_get_ex(v, "dtype", &jd) || !json_object_is_type(jd, json_type_string))
        return ft_set_error(FT_ERR_CORRUPT, "%s: tensor '%s': missing or non-string 'dtype'", fn, name);
    if (!json_object_object_get_ex(v, "shape", &js) || !json_object_is_type(js, json_type_array))
        return ft_set_error(FT_ERR_CORRUPT, "%s: tensor '%s': missing or non-array 'shape'", fn, name);
    if (!json_object_object_get_ex(v, "data_offsets", &jo) || !json_object_is_type(jo, json_type_array))
        return ft_set_error(FT_ERR_CORRUPT, "%s: tensor '%s': missing or non-array 'data_offsets'", fn, name);
    const char *ds = json_object_get_string(jd);
    e->dt = st_dtype_find(ds);
    if (!e->dt)
        return ft_set_error(FT_ERR_UNSUPPORTED, "%s: tensor '%s': unknown dtype '%.32s'", fn, name, ds);
    size_t nd = json_object_array_length(js);
    if (nd > FT_MAX_DIMS)
        return ft_set_error(FT_ERR_UNSUPPORTED, "%s: tensor '%s': %zu dims (max %d)", fn, name, nd, FT_MAX_DIMS);
    e->ndim = (uint32_t)nd;
    uint64_t numel = 1;
    for (size_t d = 0; d < nd; d++) {
        int64_t x;
        if (!json_uint(json_object_array_get_idx(js, d), ST_MAX_DIM, &x))
            return ft_set_error(FT_ERR_CORRUPT, "%s: tensor '%s': shape[%zu] is not an integer in [0, 2^48]", fn, name, d);
        e->shape[d] = x;
        if (x && numel > UINT64_MAX / (uint64_t)x)
            return ft_set_error(FT_ERR_CORRUPT, "%s: tensor '%s': shape overflows", fn, name);
        numel *= (uint64_t)x;
    }
    if (json_object_array_length(jo) != 2)
        return ft_set_error(FT_ERR_CORRUPT, "%s: tensor '%s': data_offsets must have 2 entries", fn, name);
    int64_t b, en;
    if (!json_uint(json_object_array_get_idx(jo, 0), INT64_MAX - 1, &b) ||
        !json_uint(json_object_array_get_idx(jo, 1), INT64_MAX - 1, &en))
        return ft_set_error(FT_ERR_CORRUPT, "%s: tensor '%s': data_offsets are not non-negative integers", fn, name);
    if (b > en)
        return ft_set_error(FT_ERR_CORRUPT, "%s: tensor '%s': data_offsets begin %lld > end %lld", fn, name,
                            (long long)b, (long long)en);
    if ((uint64_t)en > data_size)
        return ft_set_error(FT_ERR_CORRUPT, "%s: tensor '%s': data_offsets end %lld is past the end of the data section (%llu bytes)",
                            fn, name, (long long)en, (unsigned long long)data_size);
    if (numel > UINT64_MAX / e->dt->esize || numel * e->dt->esize != (uint64_t)(en - b))
        return ft_set_error(FT_ERR_CORRUPT, "%s: tensor '%s': shape x %s size != data_offsets range (%lld bytes)",
                            fn, name, e->dt->name, (long long)(en - b));
    e->begin = (uint64_t)b;
    e->end = (uint64_t)en;
    e->file = fidx;
    return FT_OK;
}

/* Parse the file ck->files[fidx] (already mapped) and append its entries. */
static ft_status parse_file(ft_checkpoint *ck, uint32_t fidx)
{
    st_file *f = &ck->files[fidx];
    const char *fn = f->path;
    ft_status st = FT_OK;
    json_tokener *tok = NULL;
    json_object *root = NULL;
    st_range *ranges = NULL;
    size_t first = ck->n;

    if (f->size < 8)
        return ft_set_error(FT_ERR_CORRUPT, "%s: truncated: %zu bytes, a safetensors file starts with an 8-byte header length",
                            fn, f->size);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | f->base[i];
    if (hlen > FT_ST_MAX_HEADER)
        return ft_set_error(FT_ERR_CORRUPT, "%s: header length %llu exceeds the 100 MB limit", fn, (unsigned long long)hlen);
    if (hlen > f->size - 8)
        return ft_set_error(FT_ERR_CORRUPT, "%s: header length %llu points past the end of the file (%zu bytes): truncated?",
                            fn, (unsigned long long)hlen, f->size);
    const char *hdr = (const char *)f->base + 8;
    if (hlen < 2 || hdr[0] != '{')
        return ft_set_error(FT_ERR_CORRUPT, "%s: header is not a JSON object (must start with '{')", fn);
    if (memchr(hdr, 0, hlen))
        return ft_set_error(FT_ERR_CORRUPT, "%s: header contains a NUL byte", fn);
    f->data_off = 8 + hlen;
    uint64_t data_size = f->size - f->data_off;

    tok = json_tokener_new_ex(ST_JSON_DEPTH);
    if (!tok) return ft_set_error(FT_ERR_NOMEM, "out of memory");
    json_tokener_set_flags(tok, JSON_TOKENER_STRICT | JSON_TOKENER_ALLOW_TRAILING_CHARS);
    root = json_tokener_parse_ex(tok, hdr, (int)hlen);
    enum json_tokener_error jerr = json_tokener_get_error(tok);
    if (jerr == json_tokener_continue) {
        st = ft_set_error(FT_ERR_CORRUPT, "%s: header JSON is incomplete (truncated header?)", fn);
        goto out;
    }
    if (jerr != json_tokener_success || !root) {
        st = ft_set_error(FT_ERR_CORRUPT, "%s: bad JSON header: %s at byte %zu", fn,
                          json_tokener_error_desc(jerr), json_tokener_get_parse_end(tok));
        goto out;
    }
    for (size_t i = json_tokener_get_parse_end(tok); i < hlen; i++) {
        char c = hdr[i];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') {
            st = ft_set_error(FT_ERR_CORRUPT, "%s: bad JSON header: trailing bytes after the object at byte %zu", fn, i);
            goto out;
        }
    }
    if (!json_object_is_type(root, json_type_object)) {
        st = ft_set_error(FT_ERR_CORRUPT, "%s: header is not a JSON object", fn);
        goto out;
    }
    size_t nkeys = (size_t)json_object_object_length(root);
    if (count_top_keys(hdr, hlen, NULL) != nkeys) {
        char *dup = NULL;
        count_top_keys(hdr, hlen, &dup);
        st = ft_set_error(FT_ERR_CORRUPT, "%s: duplicate tensor name '%s' in header", fn, dup ? dup : "?");
        free(dup);
        goto out;
    }
    json_object_object_foreach(root, key, val) {
        if (!strcmp(key, "__metadata__")) {
            if (!json_object_is_type(val, json_type_object)) {
                st = ft_set_error(FT_ERR_CORRUPT, "%s: __metadata__ is not an object", fn);
                goto out;
            }
            json_object_object_foreach(val, mk, mv) {
                if (!json_object_is_type(mv, json_type_string)) {
                    st = ft_set_error(FT_ERR_CORRUPT, "%s: __metadata__ '%s' is not a string", fn, mk);
                    goto out;
                }
            }
            f->meta = json_object_get(val);
            continue;
        }
        if (!*key) {
            st = ft_set_error(FT_ERR_CORRUPT, "%s: empty tensor name", fn);
            goto out;
        }
        st_entry e;
        st = parse_tensor(fn, key, val, data_size, fidx, &e);
        if (st) goto out;
        e.name = strdup(key);
        if (!e.name) { st = ft_set_error(FT_ERR_NOMEM, "out of memory"); goto out; }
        st = add_entry(ck, &e);
        if (st) { free(e.name); goto out; }
    }
    /* ranges non-overlapping (empty tensors occupy nothing) */
    size_t nr = 0, cnt = ck->n - first;
    ranges = malloc((cnt ? cnt : 1) * sizeof *ranges);
    if (!ranges) { st = ft_set_error(FT_ERR_NOMEM, "out of memory"); goto out; }
    for (size_t i = first; i < ck->n; i++)
        if (ck->e[i].end > ck->e[i].begin)
            ranges[nr++] = (st_range){ck->e[i].begin, ck->e[i].end, ck->e[i].name};
    qsort(ranges, nr, sizeof *ranges, cmp_range);
    for (size_t i = 1; i < nr; i++)
        if (ranges[i].begin < ranges[i - 1].end) {
            st = ft_set_error(FT_ERR_CORRUPT, "%s: tensors '%s' and '%s' overlap (bytes %llu..%llu and %llu..%llu)", fn,
                              ranges[i - 1].name, ranges[i].name,
                              (unsigned long long)ranges[i - 1].begin, (unsigned long long)ranges[i - 1].end,
                              (unsigned long long)ranges[i].begin, (unsigned long long)ranges[i].end);
            goto out;
        }
out:
    free(ranges);
    json_object_put(root);
    if (tok) json_tokener_free(tok);   /* json-c 0.16 crashes on NULL */
    return st;
}

/* ------------------------------------------------------------ opening */

static ft_status ck_new(ft_checkpoint **out)
{
    ft_checkpoint *ck = calloc(1, sizeof *ck);
    if (!ck) return ft_set_error(FT_ERR_NOMEM, "out of memory");
    *out = ck;
    return FT_OK;
}

static ft_status ck_add_file(ft_checkpoint *ck, const char *path, uint32_t *idx)
{
    if (ck->nfiles == ck->files_cap) {
        size_t nc = ck->files_cap ? ck->files_cap * 2 : 4;
        st_file *nf = realloc(ck->files, nc * sizeof *nf);
        if (!nf) return ft_set_error(FT_ERR_NOMEM, "out of memory");
        ck->files = nf;
        ck->files_cap = nc;
    }
    st_file *f = &ck->files[ck->nfiles];
    memset(f, 0, sizeof *f);
    f->path = strdup(path);
    if (!f->path) return ft_set_error(FT_ERR_NOMEM, "out of memory");
    *idx = (uint32_t)ck->nfiles++;
    return FT_OK;
}

static ft_status map_file(st_file *f)
{
    int fd = open(f->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return ft_set_error(errno == ENOENT ? FT_ERR_NOT_FOUND : FT_ERR_IO, "%s: %s", f->path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        ft_status st = ft_set_error(FT_ERR_IO, "%s: stat: %s", f->path, strerror(errno));
        close(fd);
        return st;
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return ft_set_error(FT_ERR_IO, "%s: not a regular file", f->path);
    }
    f->size = (size_t)sb.st_size;
    if (f->size == 0) {   /* mmap of 0 bytes fails; parse reports truncation */
        close(fd);
        f->base = (const uint8_t *)"";
        return FT_OK;
    }
    void *p = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return ft_set_error(FT_ERR_IO, "%s: mmap: %s", f->path, strerror(errno));
    f->base = p;
    f->mapped = 1;
    return FT_OK;
}

/* Sort by name and reject duplicates (across shards). */
static ft_status ck_finish(ft_checkpoint *ck)
{
    if (ck->n) qsort(ck->e, ck->n, sizeof *ck->e, cmp_name);
    for (size_t i = 1; i < ck->n; i++)
        if (!strcmp(ck->e[i].name, ck->e[i - 1].name))
            return ft_set_error(FT_ERR_CORRUPT, "duplicate tensor '%s' in %s and %s", ck->e[i].name,
                                ck->files[ck->e[i - 1].file].path, ck->files[ck->e[i].file].path);
    return FT_OK;
}

void ft_checkpoint_close(ft_checkpoint *ck)
{
    if (!ck) return;
    for (size_t i = 0; i < ck->nfiles; i++) {
        if (ck->files[i].mapped) munmap((void *)ck->files[i].base, ck->files[i].size);
        json_object_put(ck->files[i].meta);
        free(ck->files[i].path);
    }
    for (size_t i = 0; i < ck->n; i++) free(ck->e[i].name);
    free(ck->files);
    free(ck->e);
    free(ck);
}

void ft_checkpoint_drop_cache(const ft_checkpoint *ck)
{
    if (!ck) return;
    for (size_t i = 0; i < ck->nfiles; i++) {
        if (!ck->files[i].mapped || !ck->files[i].path) continue;
        int fd = open(ck->files[i].path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) continue;
        (void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        close(fd);
    }
}

ft_status ft_checkpoint_open_memory(const void *buf, size_t size, const char *name, ft_checkpoint **out)
{
    if (!buf || !out) return ft_set_error(FT_ERR_INVALID_ARG, "ft_checkpoint_open_memory: NULL argument");
    ft_checkpoint *ck = NULL;
    uint32_t idx;
    ft_status st = ck_new(&ck);
    if (st) return st;
    if ((st = ck_add_file(ck, name ? name : "<memory>", &idx))) goto fail;
    ck->files[idx].base = buf;
    ck->files[idx].size = size;
    if ((st = parse_file(ck, idx))) goto fail;
    if ((st = ck_finish(ck))) goto fail;
    *out = ck;
    return FT_OK;
fail:
    ft_checkpoint_close(ck);
    return st;
}

static ft_status open_single(ft_checkpoint *ck, const char *path)
{
    uint32_t idx;
    ft_status st = ck_add_file(ck, path, &idx);
    if (st) return st;
    if ((st = map_file(&ck->files[idx]))) return st;
    return parse_file(ck, idx);
}

static ft_status read_small_file(const char *path, size_t limit, char **data, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return ft_set_error(errno == ENOENT ? FT_ERR_NOT_FOUND : FT_ERR_IO, "%s: %s", path, strerror(errno));
    char *buf = NULL;
    size_t n = 0, cap = 0;
    ft_status st = FT_OK;
    for (;;) {
        if (n + 65536 + 1 > cap) {
            cap = cap ? cap * 2 : 131072;
            char *nb = realloc(buf, cap);
            if (!nb) { st = ft_set_error(FT_ERR_NOMEM, "out of memory"); goto out; }
            buf = nb;
        }
        size_t r = fread(buf + n, 1, 65536, f);
        n += r;
        if (n > limit) { st = ft_set_error(FT_ERR_CORRUPT, "%s: file larger than %zu bytes", path, limit); goto out; }
        if (r < 65536) {
            if (ferror(f)) st = ft_set_error(FT_ERR_IO, "%s: read error", path);
            break;
        }
    }
out:
    fclose(f);
    if (st) { free(buf); return st; }
    buf[n] = 0;
    *data = buf;
    *len = n;
    return FT_OK;
}

static int shard_name_ok(const char *s)
{
    if (!*s || !strcmp(s, ".") || !strcmp(s, "..")) return 0;
    return !strchr(s, '/') && !strchr(s, '\\');
}

static ft_status find_entry(const ft_checkpoint *ck, const char *name, const st_entry **e);

static ft_status open_index(ft_checkpoint *ck, const char *index_path, const char *dir)
{
    char *text = NULL;
    size_t len = 0;
    json_tokener *tok = NULL;
    json_object *root = NULL;
    char **shards = NULL;
    size_t nshards = 0;
    ft_status st = read_small_file(index_path, FT_ST_MAX_HEADER, &text, &len);
    if (st) return st;
    if (memchr(text, 0, len)) { st = ft_set_error(FT_ERR_CORRUPT, "%s: contains a NUL byte", index_path); goto out; }
    tok = json_tokener_new_ex(ST_JSON_DEPTH);
    if (!tok) { st = ft_set_error(FT_ERR_NOMEM, "out of memory"); goto out; }
    root = json_tokener_parse_ex(tok, text, (int)len);
    if (!root || json_tokener_get_error(tok) != json_tokener_success) {
        st = ft_set_error(FT_ERR_CORRUPT, "%s: bad JSON: %s", index_path,
                          json_tokener_error_desc(json_tokener_get_error(tok)));
        goto out;
    }
    json_object *wm;
    if (!json_object_is_type(root, json_type_object) || !json_object_object_get_ex(root, "weight_map", &wm) ||
        !json_object_is_type(wm, json_type_object)) {
        st = ft_set_error(FT_ERR_CORRUPT, "%s: missing 'weight_map' object", index_path);
        goto out;
    }
    size_t nw = (size_t)json_object_object_length(wm);
    shards = calloc(nw ? nw : 1, sizeof *shards);
    if (!shards) { st = ft_set_error(FT_ERR_NOMEM, "out of memory"); goto out; }
    json_object_object_foreach(wm, tn, sv) {
        if (!json_object_is_type(sv, json_type_string) || !shard_name_ok(json_object_get_string(sv))) {
            st = ft_set_error(FT_ERR_CORRUPT, "%s: weight_map['%s'] is not a plain shard file name", index_path, tn);
            goto out;
        }
        const char *s = json_object_get_string(sv);
        size_t k = 0;
        while (k < nshards && strcmp(shards[k], s)) k++;
        if (k == nshards) shards[nshards++] = (char *)s;   /* borrowed from root */
    }
    if (!nshards) { st = ft_set_error(FT_ERR_CORRUPT, "%s: weight_map is empty", index_path); goto out; }
    for (size_t k = 0; k < nshards; k++) {
        size_t pl = strlen(dir) + strlen(shards[k]) + 2;
        char *p = malloc(pl);
        if (!p) { st = ft_set_error(FT_ERR_NOMEM, "out of memory"); goto out; }
        snprintf(p, pl, "%s/%s", dir, shards[k]);
        st = open_single(ck, p);
        free(p);
        if (st) goto out;
    }
    if ((st = ck_finish(ck))) goto out;
    {
        json_object_object_foreach(wm, tn2, sv2) {
            const st_entry *e;
            if (find_entry(ck, tn2, &e) != FT_OK) {
                st = ft_set_error(FT_ERR_CORRUPT, "%s: tensor '%s' is mapped to %s but not in it", index_path, tn2,
                                  json_object_get_string(sv2));
                goto out;
            }
            const char *fp = ck->files[e->file].path, *sn = json_object_get_string(sv2);
            size_t fl = strlen(fp), sl = strlen(sn);
            if (fl < sl + 1 || strcmp(fp + fl - sl, sn) || fp[fl - sl - 1] != '/') {
                st = ft_set_error(FT_ERR_CORRUPT, "%s: tensor '%s' is mapped to %s but found in %s", index_path, tn2,
                                  sn, fp);
                goto out;
            }
        }
    }
out:
    free(shards);
    json_object_put(root);
    if (tok) json_tokener_free(tok);   /* json-c 0.16 crashes on NULL */
    free(text);
    return st;
}

static int ends_with(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

static int is_file(const char *p)
{
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

ft_status ft_checkpoint_open(const char *path, ft_checkpoint **out)
{
    if (!path || !out) return ft_set_error(FT_ERR_INVALID_ARG, "ft_checkpoint_open: NULL argument");
    struct stat sb;
    if (stat(path, &sb) != 0)
        return ft_set_error(errno == ENOENT ? FT_ERR_NOT_FOUND : FT_ERR_IO, "%s: %s", path, strerror(errno));
    ft_checkpoint *ck = NULL;
    ft_status st = ck_new(&ck);
    if (st) return st;
    char *buf = NULL;
    if (S_ISDIR(sb.st_mode)) {
        size_t pl = strlen(path) + 64;
        buf = malloc(pl);
        if (!buf) { st = ft_set_error(FT_ERR_NOMEM, "out of memory"); goto fail; }
        snprintf(buf, pl, "%s/model.safetensors.index.json", path);
        if (is_file(buf)) {
            st = open_index(ck, buf, path);
        } else {
            snprintf(buf, pl, "%s/model.safetensors", path);
            if (!is_file(buf)) {
                st = ft_set_error(FT_ERR_NOT_FOUND, "%s: no model.safetensors or model.safetensors.index.json", path);
                goto fail;
            }
            if (!(st = open_single(ck, buf))) st = ck_finish(ck);
        }
    } else if (ends_with(path, ".index.json")) {
        buf = strdup(path);
        if (!buf) { st = ft_set_error(FT_ERR_NOMEM, "out of memory"); goto fail; }
        char *slash = strrchr(buf, '/');
        if (slash) *slash = 0;
        st = open_index(ck, path, slash ? buf : ".");
    } else {
        if (!(st = open_single(ck, path))) st = ck_finish(ck);
    }
    if (st) goto fail;
    free(buf);
    *out = ck;
    return FT_OK;
fail:
    free(buf);
    ft_checkpoint_close(ck);
    return st;
}

/* ------------------------------------------------------------ queries */

size_t ft_checkpoint_count(const ft_checkpoint *ck) { return ck ? ck->n : 0; }

const char *ft_checkpoint_name(const ft_checkpoint *ck, size_t i)
{
    return ck && i < ck->n ? ck->e[i].name : NULL;
}

static ft_status find_entry(const ft_checkpoint *ck, const char *name, const st_entry **e)
{
    size_t lo = 0, hi = ck->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(ck->e[mid].name, name);
        if (!c) { *e = &ck->e[mid]; return FT_OK; }
        if (c < 0) lo = mid + 1; else hi = mid;
    }
    return FT_ERR_NOT_FOUND;
}

ft_status ft_checkpoint_get(const ft_checkpoint *ck, const char *name, ft_tensor *out)
{
    if (!ck || !name || !out) return ft_set_error(FT_ERR_INVALID_ARG, "ft_checkpoint_get: NULL argument");
    const st_entry *e;
    if (find_entry(ck, name, &e) != FT_OK)
        return ft_set_error(FT_ERR_NOT_FOUND, "tensor '%s' not in checkpoint", name);
    const st_file *f = &ck->files[e->file];
    if (!e->dt->supported)
        return ft_set_error(FT_ERR_UNSUPPORTED, "%s: tensor '%s' has dtype %s, which FlexTier does not support",
                            f->path, name, e->dt->name);
    ft_tensor t;
    memset(&t, 0, sizeof t);
    t.dtype = e->dt->dt;
    t.ndim = e->ndim;
    for (uint32_t d = 0; d < e->ndim; d++) t.shape[d] = e->shape[d];
    t.data = (void *)(f->base + f->data_off + e->begin);
    *out = t;
    return FT_OK;
}

ft_status ft_checkpoint_locate(const ft_checkpoint *ck, const void *p, const char **path, uint64_t *offset)
{
    if (!ck || !p || !path || !offset) return ft_set_error(FT_ERR_INVALID_ARG, "ft_checkpoint_locate: NULL argument");
    uintptr_t a = (uintptr_t)p;
    for (size_t i = 0; i < ck->nfiles; i++) {
        const st_file *f = &ck->files[i];
        if (!f->mapped || a < (uintptr_t)f->base || a >= (uintptr_t)f->base + f->size) continue;
        *path = f->path;
        *offset = (uint64_t)(a - (uintptr_t)f->base);
        return FT_OK;
    }
    return ft_set_error(FT_ERR_NOT_FOUND, "checkpoint: the pointer is in none of its files");
}

const char *ft_checkpoint_dtype_str(const ft_checkpoint *ck, const char *name)
{
    const st_entry *e;
    if (!ck || !name || find_entry(ck, name, &e) != FT_OK) return NULL;
    return e->dt->name;
}

const char *ft_checkpoint_metadata(const ft_checkpoint *ck, const char *key)
{
    if (!ck || !key) return NULL;
    for (size_t i = 0; i < ck->nfiles; i++) {
        json_object *v;
        if (ck->files[i].meta && json_object_object_get_ex(ck->files[i].meta, key, &v))
            return json_object_get_string(v);
    }
    return NULL;
}

/* ------------------------------------------------------------- writer */

static ft_status write_all(int fd, const void *p, size_t n, const char *path)
{
    const uint8_t *b = p;
    while (n) {
        ssize_t w = write(fd, b, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return ft_set_error(FT_ERR_IO, "%s: write: %s", path, strerror(errno));
        }
        b += w;
        n -= (size_t)w;
    }
    return FT_OK;
}

typedef struct { size_t idx; unsigned esize; } wr_order;

static int cmp_order(const void *a, const void *b)
{
    const wr_order *x = a, *y = b;
    if (x->esize != y->esize) return x->esize > y->esize ? -1 : 1;   /* larger first: keeps alignment */
    return x->idx < y->idx ? -1 : x->idx > y->idx;
}

/* The one writer behind ft_safetensors_write (fill == NULL: the bytes are
 * tensor.data) and ft_safetensors_write_stream (fill produces them into a
 * bounded buffer, so nothing the size of a tensor is ever held). */
static ft_status st_write(const char *path, const ft_named_tensor *tensors, size_t n,
                          const char *const *meta_kv, ft_st_fill_fn fill, void *user)
{
    if (!path || (n && !tensors)) return ft_set_error(FT_ERR_INVALID_ARG, "ft_safetensors_write: NULL argument");
    ft_status st = FT_OK;
    json_object *root = NULL;
    wr_order *ord = NULL;
    char *tmp = NULL;
    uint8_t *fbuf = NULL;
    int fd = -1;
    uint64_t *sizes = calloc(n ? n : 1, sizeof *sizes);
    ord = calloc(n ? n : 1, sizeof *ord);
    root = json_object_new_object();
    if (!sizes || !ord || !root) { st = ft_set_error(FT_ERR_NOMEM, "out of memory"); goto out; }
    for (size_t i = 0; i < n; i++) {
        const ft_named_tensor *t = &tensors[i];
        if (!t->name || !*t->name || !strcmp(t->name, "__metadata__")) {
            st = ft_set_error(FT_ERR_INVALID_ARG, "%s: tensor %zu: invalid name", path, i);
            goto out;
        }
        for (size_t j = 0; j < i; j++)
            if (!strcmp(tensors[j].name, t->name)) {
                st = ft_set_error(FT_ERR_INVALID_ARG, "%s: duplicate tensor name '%s'", path, t->name);
                goto out;
            }
        const st_dtype_info *di = st_dtype_of(t->tensor.dtype);
        if (!di) {
            st = ft_set_error(FT_ERR_UNSUPPORTED, "%s: tensor '%s': dtype %s cannot be stored in safetensors", path,
                              t->name, ft_dtype_name(t->tensor.dtype));
            goto out;
        }
        if ((st = ft_tensor_nbytes(&t->tensor, &sizes[i]))) goto out;
        if (sizes[i] && !t->tensor.data && !fill) {
            st = ft_set_error(FT_ERR_INVALID_ARG, "%s: tensor '%s': NULL data", path, t->name);
            goto out;
        }
        ord[i] = (wr_order){i, di->esize};
    }
    qsort(ord, n, sizeof *ord, cmp_order);
    if (meta_kv && meta_kv[0]) {
        json_object *m = json_object_new_object();
        if (!m) { st = ft_set_error(FT_ERR_NOMEM, "out of memory"); goto out; }
        json_object_object_add(root, "__metadata__", m);
        for (size_t k = 0; meta_kv[k]; k += 2) {
            if (!meta_kv[k + 1]) {
                st = ft_set_error(FT_ERR_INVALID_ARG, "%s: metadata key '%s' has no value", path, meta_kv[k]);
                goto out;
            }
            json_object_object_add(m, meta_kv[k], json_object_new_string(meta_kv[k + 1]));
        }
    }
    uint64_t off = 0;
    for (size_t k = 0; k < n; k++) {
        const ft_named_tensor *t = &tensors[ord[k].idx];
        json_object *e = json_object_new_object(), *sh = json_object_new_array(), *of = json_object_new_array();
        if (!e || !sh || !of) {
            json_object_put(e); json_object_put(sh); json_object_put(of);
            st = ft_set_error(FT_ERR_NOMEM, "out of memory");
            goto out;
        }
        json_object_object_add(e, "dtype", json_object_new_string(st_dtype_of(t->tensor.dtype)->name));
        for (uint32_t d = 0; d < t->tensor.ndim; d++) json_object_array_add(sh, json_object_new_int64(t->tensor.shape[d]));
        json_object_object_add(e, "shape", sh);
        json_object_array_add(of, json_object_new_int64((int64_t)off));
        off += sizes[ord[k].idx];
        json_object_array_add(of, json_object_new_int64((int64_t)off));
        json_object_object_add(e, "data_offsets", of);
        json_object_object_add(root, t->name, e);
    }
    const char *js = json_object_to_json_string_ext(root, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE);
    size_t jl = strlen(js), padded = (jl + 7) & ~(size_t)7;
    if (padded > FT_ST_MAX_HEADER) { st = ft_set_error(FT_ERR_INVALID_ARG, "%s: header too large", path); goto out; }

    size_t len = strlen(path);
    tmp = malloc(len + 16);
    if (!tmp) { st = ft_set_error(FT_ERR_NOMEM, "out of memory"); goto out; }
    snprintf(tmp, len + 16, "%s.tmpXXXXXX", path);
    fd = mkstemp(tmp);
    if (fd < 0) {
        st = ft_set_error(FT_ERR_IO, "%s: %s", path, strerror(errno));
        free(tmp);
        tmp = NULL;
        goto out;
    }
    fchmod(fd, 0644);
    if (fill && !(fbuf = malloc(FT_ST_FILL_MAX))) { st = ft_set_error(FT_ERR_NOMEM, "out of memory"); goto out; }
    uint8_t lenb[8];
    for (int i = 0; i < 8; i++) lenb[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    static const char spaces[8] = "        ";
    if ((st = write_all(fd, lenb, 8, path)) || (st = write_all(fd, js, jl, path)) ||
        (st = write_all(fd, spaces, padded - jl, path)))
        goto out;
    for (size_t k = 0; k < n; k++) {
        size_t i = ord[k].idx;
        if (!fill) {
            if ((st = write_all(fd, tensors[i].tensor.data, (size_t)sizes[i], path))) goto out;
            continue;
        }
        for (uint64_t o = 0; o < sizes[i]; o += FT_ST_FILL_MAX) {
            size_t piece = sizes[i] - o < FT_ST_FILL_MAX ? (size_t)(sizes[i] - o) : FT_ST_FILL_MAX;
            if ((st = fill(user, i, o, fbuf, piece))) goto out;
            if ((st = write_all(fd, fbuf, piece, path))) goto out;
        }
    }
    if (fsync(fd) != 0) { st = ft_set_error(FT_ERR_IO, "%s: fsync: %s", path, strerror(errno)); goto out; }
    if (close(fd) != 0) { fd = -1; st = ft_set_error(FT_ERR_IO, "%s: close: %s", path, strerror(errno)); goto out; }
    fd = -1;
    if (rename(tmp, path) != 0) { st = ft_set_error(FT_ERR_IO, "%s: rename: %s", path, strerror(errno)); goto out; }
out:
    if (fd >= 0) close(fd);
    if (tmp) {
        if (st) unlink(tmp);
        free(tmp);
    }
    json_object_put(root);
    free(fbuf);
    free(ord);
    free(sizes);
    return st;
}

ft_status ft_safetensors_write(const char *path, const ft_named_tensor *tensors, size_t n,
                               const char *const *meta_kv)
{
    return st_write(path, tensors, n, meta_kv, NULL, NULL);
}

ft_status ft_safetensors_write_stream(const char *path, const ft_named_tensor *tensors, size_t n,
                                      const char *const *meta_kv, ft_st_fill_fn fill, void *user)
{
    if (!fill) return ft_set_error(FT_ERR_INVALID_ARG, "ft_safetensors_write_stream: NULL fill callback");
    return st_write(path, tensors, n, meta_kv, fill, user);
}
