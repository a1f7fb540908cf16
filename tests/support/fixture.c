/* Test support: the fixture loader (fixture.h), shared by the engine, CUDA
 * and offloading tests. Reads untrusted-ish files (the fixtures are
 * generated, but a hand edit must fail cleanly, not overflow the arrays). */
#include "fixture.h"

#include <dirent.h>
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ft_fixture_dir(const char *set, const char *name, char *dir, size_t n)
{
    const char *data = getenv("FT_TEST_DATA");
    snprintf(dir, n, "%s/%s/%s", data ? data : "tests/data", set, name);
}

static int cmp_name(const void *a, const void *b) { return strcmp(a, b); }

const char (*ft_fixture_models(size_t *n))[256]
{
    static char models[FT_FIXTURE_MAX_MODELS + 1][256];
    static size_t count;
    if (!count) {
        char dir[512];
        const char *data = getenv("FT_TEST_DATA");
        snprintf(dir, sizeof dir, "%s/models", data ? data : "tests/data");
        DIR *d = opendir(dir);
        struct dirent *e;
        while (d && (e = readdir(d)) && count <= FT_FIXTURE_MAX_MODELS)
            if (e->d_name[0] != '.') snprintf(models[count++], sizeof models[0], "%s", e->d_name);
        if (d) closedir(d);
        qsort(models, count, sizeof models[0], cmp_name);
    }
    *n = count;   /* FT_FIXTURE_MAX_MODELS + 1: too many (the caller checks) */
    return (const char (*)[256])models;
}

/* Array `a` of ints into out[0..cap): 0 if it is not an array or longer. */
static int int_array(json_object *a, int32_t *out, size_t cap, size_t *len)
{
    if (!a || !json_object_is_type(a, json_type_array)) return 0;
    size_t n = json_object_array_length(a);
    if (n > cap) return 0;
    for (size_t k = 0; k < n; k++) out[k] = json_object_get_int(json_object_array_get_idx(a, k));
    *len = n;
    return 1;
}

static int fail(const char *path, const char *what)
{
    fprintf(stderr, "  fixture %s: %s\n", path, what);
    return 0;
}

int ft_fixture_load(const char *dir, ft_fixture *f)
{
    char path[1100];
    memset(f, 0, sizeof *f);
    snprintf(path, sizeof path, "%s/fixtures.json", dir);
    json_object *root = json_object_from_file(path);
    if (!root) return fail(path, "missing or not JSON");
    int ok = 0;
    json_object *pr, *gr, *tx, *as;
    if (!json_object_object_get_ex(root, "prompts", &pr) || !json_object_object_get_ex(root, "greedy", &gr) ||
        !json_object_is_type(pr, json_type_array) || !json_object_is_type(gr, json_type_array)) {
        fail(path, "no \"prompts\" / \"greedy\" arrays");
        goto done;
    }
    size_t np = json_object_array_length(pr);
    if (np > FT_FIXTURE_MAXP || json_object_array_length(gr) != np) {
        fail(path, "more prompts than FT_FIXTURE_MAXP, or greedy of another length");
        goto done;
    }
    f->np = (int)np;
    for (size_t i = 0; i < np; i++)
        if (!int_array(json_object_array_get_idx(pr, i), f->prompt[i], FT_FIXTURE_MAXTOK, &f->plen[i]) ||
            !int_array(json_object_array_get_idx(gr, i), f->greedy[i], FT_FIXTURE_MAXGEN, &f->glen[i])) {
            fail(path, "a prompt or continuation is not an array within the limits");
            goto done;
        }
    if (json_object_object_get_ex(root, "texts", &tx)) {
        size_t nt = json_object_is_type(tx, json_type_array) ? json_object_array_length(tx) : SIZE_MAX;
        if (nt > FT_FIXTURE_MAXP) { fail(path, "\"texts\" not an array of at most MAXP"); goto done; }
        f->ntexts = (int)nt;
        for (size_t i = 0; i < nt; i++) {
            const char *s = json_object_get_string(json_object_array_get_idx(tx, i));
            if (!s || strlen(s) >= sizeof f->texts[i]) { fail(path, "a text is missing or too long"); goto done; }
            memcpy(f->texts[i], s, strlen(s) + 1);
        }
        f->add_special = json_object_object_get_ex(root, "add_special_tokens", &as) && json_object_get_boolean(as);
    }
    snprintf(path, sizeof path, "%s/logits.bin", dir);
    FILE *fp = fopen(path, "rb");
    if (!fp) { fail(path, "missing"); goto done; }
    long n = -1;
    if (fseek(fp, 0, SEEK_END) == 0) n = ftell(fp);
    if (n <= 0 || n % 4 || fseek(fp, 0, SEEK_SET) != 0 || !(f->logits = malloc((size_t)n))) {
        fclose(fp);
        fail(path, "empty, not whole f32s, or cannot be read");
        goto done;
    }
    f->nlogits = (size_t)n / 4;
    ok = fread(f->logits, 1, (size_t)n, fp) == (size_t)n;
    fclose(fp);
    if (!ok) fail(path, "short read");
done:
    json_object_put(root);
    if (!ok) ft_fixture_free(f);
    return ok;
}

void ft_fixture_free(ft_fixture *f)
{
    if (!f) return;
    free(f->logits);
    f->logits = NULL;
    f->nlogits = 0;
}

float ft_max_abs_diff(const float *a, const float *b, size_t n)
{
    float m = 0;
    for (size_t i = 0; i < n; i++) {
        float d = fabsf(a[i] - b[i]);
        if (!(d <= m)) m = d;   /* NaN propagates */
    }
    return m;
}
