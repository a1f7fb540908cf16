/* safetensors: writer/reader round trip, sharded index directories, and
 * hand-crafted bad files that must each fail with a clear error. */
#include "ft_test.h"
#include "flextier/model.h"
#include "model/model_internal.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmpdir[256];

static void rm_tmpdir(void)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
}

static const char *tdir(void)
{
    if (!tmpdir[0]) {
        snprintf(tmpdir, sizeof tmpdir, "/tmp/ft_st_XXXXXX");
        if (!mkdtemp(tmpdir)) { perror("mkdtemp"); exit(1); }
        atexit(rm_tmpdir);
    }
    return tmpdir;
}

static char *tpath(const char *name)
{
    static char buf[8][512];
    static int k;
    char *p = buf[k++ & 7];
    snprintf(p, 512, "%s/%s", tdir(), name);
    return p;
}

static void write_bytes(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f) { perror(path); exit(1); }
    if (n) fwrite(p, 1, n, f);
    fclose(f);
}

/* A file from a header string and data bytes; hlen_override != 0 writes
 * that length instead of the real one. */
static void write_st(const char *path, const char *hdr, const void *data, size_t dn, uint64_t hlen_override)
{
    size_t hl = strlen(hdr);
    uint64_t L = hlen_override ? hlen_override : hl;
    uint8_t *buf = malloc(8 + hl + dn + 1);
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)(L >> (8 * i));
    memcpy(buf + 8, hdr, hl);
    if (dn) memcpy(buf + 8 + hl, data, dn);
    write_bytes(path, buf, 8 + hl + dn);
    free(buf);
}

TEST(round_trip)
{
    float a[6] = {1, 2, 3, 4, 5, 6};
    uint16_t b[4] = {0x3c00, 0x4000, 0x4200, 0x4400};
    uint16_t c[3] = {0x3f80, 0x4000, 0x4040};
    int8_t d[5] = {-1, 2, -3, 4, -5};
    int32_t e[1] = {123456};
    ft_named_tensor ts[5];
    memset(ts, 0, sizeof ts);
    int64_t s23[2] = {2, 3}, s4[1] = {4}, s3[1] = {3}, s5[1] = {5};
    ts[0].name = "z.weight"; CHECK_OK(ft_tensor_init(&ts[0].tensor, FT_F32, 2, s23, a));
    ts[1].name = "h"; CHECK_OK(ft_tensor_init(&ts[1].tensor, FT_F16, 1, s4, b));
    ts[2].name = "bf"; CHECK_OK(ft_tensor_init(&ts[2].tensor, FT_BF16, 1, s3, c));
    ts[3].name = "i8"; CHECK_OK(ft_tensor_init(&ts[3].tensor, FT_I8, 1, s5, d));
    ts[4].name = "scalar"; CHECK_OK(ft_tensor_init(&ts[4].tensor, FT_I32, 0, NULL, e));
    const char *meta[] = {"format", "pt", "note", "hello \"world\"", NULL};
    const char *p = tpath("rt.safetensors");
    CHECK_OK(ft_safetensors_write(p, ts, 5, meta));

    ft_checkpoint *ck = NULL;
    CHECK_OK(ft_checkpoint_open(p, &ck));
    REQUIRE(ck);
    CHECK(ft_checkpoint_count(ck) == 5);
    CHECK(!strcmp(ft_checkpoint_name(ck, 0), "bf"));   /* sorted */
    CHECK(ft_checkpoint_name(ck, 5) == NULL);
    CHECK(!strcmp(ft_checkpoint_metadata(ck, "format"), "pt"));
    CHECK(!strcmp(ft_checkpoint_metadata(ck, "note"), "hello \"world\""));
    CHECK(ft_checkpoint_metadata(ck, "nope") == NULL);
    for (int i = 0; i < 5; i++) {
        ft_tensor t;
        CHECK_OK(ft_checkpoint_get(ck, ts[i].name, &t));
        CHECK(t.dtype == ts[i].tensor.dtype);
        CHECK(t.ndim == ts[i].tensor.ndim);
        for (uint32_t k = 0; k < t.ndim; k++) CHECK(t.shape[k] == ts[i].tensor.shape[k]);
        uint64_t nb;
        CHECK_OK(ft_tensor_nbytes(&t, &nb));
        CHECK(!memcmp(t.data, ts[i].tensor.data, nb));
        /* written larger-element-first: data aligned to its element size */
        CHECK(((uintptr_t)t.data % (ft_dtype_bits(t.dtype) / 8)) == 0);
    }
    ft_tensor t;
    CHECK(ft_checkpoint_get(ck, "missing", &t) == FT_ERR_NOT_FOUND);
    CHECK(!strcmp(ft_checkpoint_dtype_str(ck, "h"), "F16"));
    ft_checkpoint_close(ck);

    /* the same file opened as a directory's model.safetensors */
    char dir[512];
    snprintf(dir, sizeof dir, "%s/rtdir", tdir());
    mkdir(dir, 0755);
    char p2[600];
    snprintf(p2, sizeof p2, "%s/model.safetensors", dir);
    CHECK(rename(p, p2) == 0);
    CHECK_OK(ft_checkpoint_open(dir, &ck));
    CHECK(ft_checkpoint_count(ck) == 5);
    ft_checkpoint_close(ck);
    ft_checkpoint_close(NULL);

    /* writer rejects bad input and leaves nothing behind */
    ts[1].name = "z.weight";
    CHECK(ft_safetensors_write(tpath("dup.safetensors"), ts, 2, NULL) == FT_ERR_INVALID_ARG);
    CHECK(access(tpath("dup.safetensors"), F_OK) != 0);
    ts[1].name = "h";
    ts[1].tensor.dtype = FT_Q4;
    CHECK(ft_safetensors_write(tpath("q4.safetensors"), ts, 2, NULL) == FT_ERR_UNSUPPORTED);
    /* empty checkpoint */
    CHECK_OK(ft_safetensors_write(tpath("empty.safetensors"), NULL, 0, NULL));
    CHECK_OK(ft_checkpoint_open(tpath("empty.safetensors"), &ck));
    CHECK(ft_checkpoint_count(ck) == 0);
    ft_checkpoint_close(ck);
}

/* ft_safetensors_write_stream: bytes from the fill callback, in file order,
 * in pieces of at most FT_ST_FILL_MAX; the file equals what
 * ft_safetensors_write makes from the same bytes; a failing fill leaves
 * nothing behind. */
typedef struct {
    size_t calls, last_i;
    uint64_t next_off;
    int order_ok, fail_at;
} fill_log;

static uint8_t pattern(size_t i, uint64_t off) { return (uint8_t)(off * 131 + off / 251 + i * 17); }

static ft_status fill_pattern(void *user, size_t i, uint64_t offset, void *buf, size_t len)
{
    fill_log *l = user;
    if (l->fail_at && (int)l->calls + 1 == l->fail_at) return ft_set_error(FT_ERR_IO, "fill failed on purpose");
    if (l->calls && i == l->last_i) { if (offset != l->next_off) l->order_ok = 0; }
    else if (offset != 0 || (l->calls && i < l->last_i)) l->order_ok = 0;
    if (len == 0 || len > FT_ST_FILL_MAX || offset % FT_ST_FILL_MAX) l->order_ok = 0;
    for (size_t k = 0; k < len; k++) ((uint8_t *)buf)[k] = pattern(i, offset + k);
    l->calls++;
    l->last_i = i;
    l->next_off = offset + len;
    return FT_OK;
}

TEST(stream_writer)
{
    /* 2 tensors, the first > 2 pieces: 5 Mi f32 = 20 MiB */
    int64_t s0[2] = {5 * 1024, 1024}, s1[1] = {7};
    ft_named_tensor ts[2];
    memset(ts, 0, sizeof ts);
    ts[0].name = "big";
    CHECK_OK(ft_tensor_init(&ts[0].tensor, FT_F32, 2, s0, NULL));
    ts[1].name = "small";
    CHECK_OK(ft_tensor_init(&ts[1].tensor, FT_BF16, 1, s1, NULL));
    fill_log l = {.order_ok = 1};
    const char *meta[] = {"format", "pt", NULL};
    CHECK_OK(ft_safetensors_write_stream(tpath("stream.safetensors"), ts, 2, meta, fill_pattern, &l));
    CHECK(l.order_ok);
    CHECK(l.calls == 3 + 1);
    /* the same bytes through the in-memory writer give the same file */
    size_t n0 = (size_t)(s0[0] * s0[1]) * 4, n1 = 7 * 2;
    uint8_t *b0 = malloc(n0), *b1 = malloc(n1);
    REQUIRE(b0 && b1);
    for (size_t k = 0; k < n0; k++) b0[k] = pattern(0, k);
    for (size_t k = 0; k < n1; k++) b1[k] = pattern(1, k);
    ts[0].tensor.data = b0;
    ts[1].tensor.data = b1;
    CHECK_OK(ft_safetensors_write(tpath("mem.safetensors"), ts, 2, meta));
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "cmp -s '%s' '%s'", tpath("stream.safetensors"), tpath("mem.safetensors"));
    CHECK(system(cmd) == 0);
    ft_checkpoint *ck = NULL;
    CHECK_OK(ft_checkpoint_open(tpath("stream.safetensors"), &ck));
    ft_tensor t;
    CHECK_OK(ft_checkpoint_get(ck, "big", &t));
    CHECK(t.data && !memcmp(t.data, b0, n0));
    ft_checkpoint_close(ck);
    free(b0);
    free(b1);
    /* a failing fill aborts with its status and leaves no file */
    ts[0].tensor.data = ts[1].tensor.data = NULL;
    fill_log f = {.order_ok = 1, .fail_at = 2};
    CHECK(ft_safetensors_write_stream(tpath("fail.safetensors"), ts, 2, NULL, fill_pattern, &f) == FT_ERR_IO);
    CHECK(access(tpath("fail.safetensors"), F_OK) != 0);
    snprintf(cmd, sizeof cmd, "ls '%s' | grep -q tmp", tdir());
    CHECK(system(cmd) != 0);
    CHECK(ft_safetensors_write_stream(tpath("nofill.safetensors"), ts, 2, NULL, NULL, NULL) == FT_ERR_INVALID_ARG);
}

TEST(sharded)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/sharded", tdir());
    mkdir(dir, 0755);
    float a[4] = {1, 2, 3, 4}, b[2] = {5, 6};
    int64_t s4[1] = {4}, s2[1] = {2};
    ft_named_tensor t1 = {"layer.0.w", {0}}, t2 = {"layer.1.w", {0}};
    CHECK_OK(ft_tensor_init(&t1.tensor, FT_F32, 1, s4, a));
    CHECK_OK(ft_tensor_init(&t2.tensor, FT_F32, 1, s2, b));
    char p[700];
    snprintf(p, sizeof p, "%s/model-00001-of-00002.safetensors", dir);
    CHECK_OK(ft_safetensors_write(p, &t1, 1, NULL));
    snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", dir);
    CHECK_OK(ft_safetensors_write(p, &t2, 1, NULL));
    const char *idx = "{\"metadata\": {\"total_size\": 24}, \"weight_map\": {"
                      "\"layer.0.w\": \"model-00001-of-00002.safetensors\","
                      "\"layer.1.w\": \"model-00002-of-00002.safetensors\"}}";
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    write_bytes(p, idx, strlen(idx));
    ft_checkpoint *ck = NULL;
    CHECK_OK(ft_checkpoint_open(dir, &ck));
    REQUIRE(ck);
    CHECK(ft_checkpoint_count(ck) == 2);
    ft_tensor t;
    CHECK_OK(ft_checkpoint_get(ck, "layer.1.w", &t));
    CHECK(t.shape[0] == 2 && ((float *)t.data)[1] == 6);
    CHECK_OK(ft_checkpoint_get(ck, "layer.0.w", &t));
    CHECK(t.shape[0] == 4 && ((float *)t.data)[3] == 4);
    ft_checkpoint_close(ck);
    /* the index path itself */
    CHECK_OK(ft_checkpoint_open(p, &ck));
    ft_checkpoint_close(ck);

    /* index naming a tensor in the wrong shard */
    const char *bad = "{\"weight_map\": {\"layer.0.w\": \"model-00002-of-00002.safetensors\","
                      "\"layer.1.w\": \"model-00002-of-00002.safetensors\"}}";
    write_bytes(p, bad, strlen(bad));
    ck = NULL;
    CHECK(ft_checkpoint_open(dir, &ck) == FT_ERR_CORRUPT && !ck);
    CHECK(strstr(ft_last_error(), "layer.0.w") != NULL);
    /* path traversal in a shard name */
    bad = "{\"weight_map\": {\"layer.0.w\": \"../x.safetensors\"}}";
    write_bytes(p, bad, strlen(bad));
    CHECK(ft_checkpoint_open(dir, &ck) == FT_ERR_CORRUPT);
    /* missing shard */
    bad = "{\"weight_map\": {\"layer.0.w\": \"nope.safetensors\"}}";
    write_bytes(p, bad, strlen(bad));
    CHECK(ft_checkpoint_open(dir, &ck) == FT_ERR_NOT_FOUND);
    CHECK(strstr(ft_last_error(), "nope.safetensors") != NULL);
    /* the same tensor in two shards */
    snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", dir);
    t1.name = "layer.0.w";
    CHECK_OK(ft_safetensors_write(p, &t1, 1, NULL));
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    bad = "{\"weight_map\": {\"layer.0.w\": \"model-00001-of-00002.safetensors\","
          "\"x\": \"model-00002-of-00002.safetensors\"}}";
    write_bytes(p, bad, strlen(bad));
    CHECK(ft_checkpoint_open(dir, &ck) == FT_ERR_CORRUPT);
    CHECK(strstr(ft_last_error(), "duplicate tensor 'layer.0.w'") != NULL);
    /* no checkpoint at all */
    snprintf(p, sizeof p, "%s/emptydir", tdir());
    mkdir(p, 0755);
    CHECK(ft_checkpoint_open(p, &ck) == FT_ERR_NOT_FOUND);
    CHECK(ft_checkpoint_open(tpath("does-not-exist"), &ck) == FT_ERR_NOT_FOUND);
}

/* Expect open to fail with st and the message to contain want (and the
 * file name). */
static void expect_bad(const char *fname, ft_status want_st, const char *want)
{
    ft_checkpoint *ck = NULL;
    ft_status st = ft_checkpoint_open(tpath(fname), &ck);
    CHECK_MSG(st == want_st, "%s: got %s (%s)", fname, ft_status_str(st), ft_last_error());
    CHECK(ck == NULL);
    CHECK_MSG(strstr(ft_last_error(), want) != NULL, "%s: message '%s' lacks '%s'", fname, ft_last_error(), want);
    CHECK_MSG(strstr(ft_last_error(), fname) != NULL, "message '%s' lacks the file name", ft_last_error());
    ft_checkpoint_close(ck);
}

TEST(bad_files)
{
    uint8_t data[64];
    for (int i = 0; i < 64; i++) data[i] = (uint8_t)i;
    const char *ok = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}";
    write_st(tpath("ok.safetensors"), ok, data, 16, 0);
    ft_checkpoint *ck;
    CHECK_OK(ft_checkpoint_open(tpath("ok.safetensors"), &ck));
    ft_checkpoint_close(ck);

    write_bytes(tpath("tiny.safetensors"), "abc", 3);
    expect_bad("tiny.safetensors", FT_ERR_CORRUPT, "truncated");
    write_bytes(tpath("zero.safetensors"), "", 0);
    expect_bad("zero.safetensors", FT_ERR_CORRUPT, "truncated");
    write_st(tpath("hlen_past.safetensors"), ok, data, 16, 1000);
    expect_bad("hlen_past.safetensors", FT_ERR_CORRUPT, "past the end");
    write_st(tpath("hlen_huge.safetensors"), ok, data, 16, (uint64_t)1 << 62);
    expect_bad("hlen_huge.safetensors", FT_ERR_CORRUPT, "100 MB");
    /* data truncated: offsets now past the end */
    write_st(tpath("data_trunc.safetensors"), ok, data, 10, 0);
    expect_bad("data_trunc.safetensors", FT_ERR_CORRUPT, "past the end of the data section");
    write_st(tpath("off_past.safetensors"),
             "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[60,76]}}", data, 64, 0);
    expect_bad("off_past.safetensors", FT_ERR_CORRUPT, "'a'");
    write_st(tpath("overlap.safetensors"),
             "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
             "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", data, 16, 0);
    expect_bad("overlap.safetensors", FT_ERR_CORRUPT, "overlap");
    write_st(tpath("shape.safetensors"),
             "{\"a\":{\"dtype\":\"F32\",\"shape\":[3,2],\"data_offsets\":[0,16]}}", data, 16, 0);
    expect_bad("shape.safetensors", FT_ERR_CORRUPT, "shape x F32");
    write_st(tpath("json.safetensors"), "{\"a\":{\"dtype\":\"F32\",", data, 16, 0);
    expect_bad("json.safetensors", FT_ERR_CORRUPT, "JSON");
    write_st(tpath("json2.safetensors"), "{\"a\" 1}", data, 16, 0);
    expect_bad("json2.safetensors", FT_ERR_CORRUPT, "JSON");
    write_st(tpath("notobj.safetensors"), "[1,2]", data, 16, 0);
    expect_bad("notobj.safetensors", FT_ERR_CORRUPT, "not a JSON object");
    write_st(tpath("trail.safetensors"), "{}  x", data, 0, 0);
    expect_bad("trail.safetensors", FT_ERR_CORRUPT, "trailing");
    write_st(tpath("dtype.safetensors"),
             "{\"a\":{\"dtype\":\"F12\",\"shape\":[4],\"data_offsets\":[0,16]}}", data, 16, 0);
    expect_bad("dtype.safetensors", FT_ERR_UNSUPPORTED, "unknown dtype 'F12'");
    write_st(tpath("dup.safetensors"),
             "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
             "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", data, 16, 0);
    expect_bad("dup.safetensors", FT_ERR_CORRUPT, "duplicate tensor name 'a'");
    write_st(tpath("dup_esc.safetensors"),
             "{\"ab\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
             "\"a\\u0062\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", data, 16, 0);
    expect_bad("dup_esc.safetensors", FT_ERR_CORRUPT, "duplicate tensor name 'ab'");
    write_st(tpath("float_off.safetensors"),
             "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0.0,16]}}", data, 16, 0);
    expect_bad("float_off.safetensors", FT_ERR_CORRUPT, "data_offsets");
    write_st(tpath("neg_off.safetensors"),
             "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[-16,0]}}", data, 16, 0);
    expect_bad("neg_off.safetensors", FT_ERR_CORRUPT, "data_offsets");
    write_st(tpath("big_off.safetensors"),
             "{\"a\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[99999999999999999999999,99999999999999999999999]}}",
             data, 16, 0);
    expect_bad("big_off.safetensors", FT_ERR_CORRUPT, "'a'");
    write_st(tpath("neg_dim.safetensors"),
             "{\"a\":{\"dtype\":\"F32\",\"shape\":[-1,-4],\"data_offsets\":[0,16]}}", data, 16, 0);
    expect_bad("neg_dim.safetensors", FT_ERR_CORRUPT, "shape[0]");
    write_st(tpath("ovf_dim.safetensors"),
             "{\"a\":{\"dtype\":\"F32\",\"shape\":[281474976710656,281474976710656],\"data_offsets\":[0,16]}}",
             data, 16, 0);
    expect_bad("ovf_dim.safetensors", FT_ERR_CORRUPT, "'a'");
    write_st(tpath("nodtype.safetensors"), "{\"a\":{\"shape\":[4],\"data_offsets\":[0,16]}}", data, 16, 0);
    expect_bad("nodtype.safetensors", FT_ERR_CORRUPT, "dtype");
    write_st(tpath("manydims.safetensors"),
             "{\"a\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", data, 16, 0);
    expect_bad("manydims.safetensors", FT_ERR_UNSUPPORTED, "dims");
    write_st(tpath("meta.safetensors"), "{\"__metadata__\":{\"a\":1}}", data, 0, 0);
    expect_bad("meta.safetensors", FT_ERR_CORRUPT, "__metadata__");
    const char deep[] = "{\"a\":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}";
    write_st(tpath("deep.safetensors"), deep, data, 0, 0);
    expect_bad("deep.safetensors", FT_ERR_CORRUPT, "JSON");
    uint8_t nul[] = {'{', '}', 0, ' '};
    uint8_t buf[12] = {4, 0, 0, 0, 0, 0, 0, 0};
    memcpy(buf + 8, nul, 4);
    write_bytes(tpath("nul.safetensors"), buf, 12);
    expect_bad("nul.safetensors", FT_ERR_CORRUPT, "NUL");

    /* valid file with an F64 tensor: opens, get says unsupported */
    write_st(tpath("f64.safetensors"),
             "{\"d\":{\"dtype\":\"F64\",\"shape\":[2],\"data_offsets\":[0,16]},"
             "\"e\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[16,16]}}  ", data, 16, 0);
    CHECK_OK(ft_checkpoint_open(tpath("f64.safetensors"), &ck));
    ft_tensor t;
    CHECK(ft_checkpoint_get(ck, "d", &t) == FT_ERR_UNSUPPORTED);
    CHECK(strstr(ft_last_error(), "F64") != NULL);
    CHECK_OK(ft_checkpoint_get(ck, "e", &t));
    CHECK(t.shape[0] == 0);
    ft_checkpoint_close(ck);

    /* odd offsets are legal: data may be unaligned */
    write_st(tpath("odd.safetensors"),
             "{\"a\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]},"
             "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[3,11]}}", data, 11, 0);
    CHECK_OK(ft_checkpoint_open(tpath("odd.safetensors"), &ck));
    CHECK_OK(ft_checkpoint_get(ck, "b", &t));
    CHECK(!memcmp(t.data, data + 3, 8));
    ft_checkpoint_close(ck);
}

TEST(every_truncation)
{
    /* every prefix of a valid file fails cleanly (or, at full size, opens) */
    float a[8] = {0};
    int64_t s[1] = {8};
    ft_named_tensor t = {"w", {0}};
    CHECK_OK(ft_tensor_init(&t.tensor, FT_F32, 1, s, a));
    const char *p = tpath("full.safetensors");
    CHECK_OK(ft_safetensors_write(p, &t, 1, NULL));
    FILE *f = fopen(p, "rb");
    REQUIRE(f);
    uint8_t buf[512];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    for (size_t k = 0; k <= n; k++) {
        ft_checkpoint *ck = NULL;
        ft_status st = ft_checkpoint_open_memory(buf, k, "mem", &ck);
        if (k == n) CHECK_OK(st);
        else CHECK_MSG(st == FT_ERR_CORRUPT && !ck, "prefix %zu: %s", k, ft_status_str(st));
        ft_checkpoint_close(ck);
    }
}

TEST(python_written_file)
{
    /* tests/model/data/py_written.safetensors was written by the Python
     * `safetensors` package (0.8.0, safetensors.numpy.save_file):
     *   a = np.arange(6, dtype=float32).reshape(2, 3), b = int8 [1, 2, 3],
     *   c = float16 [1.5, 2.5], d = float32 zeros (0, 4),
     *   metadata {"format": "np"}.
     * (Files from ft_safetensors_write were checked to load with it too.) */
    char p[1024];
    const char *root = getenv("FT_TEST_DATA");
    snprintf(p, sizeof p, "%s/../model/data/py_written.safetensors", root ? root : "tests/data");
    ft_checkpoint *ck = NULL;
    CHECK_OK(ft_checkpoint_open(p, &ck));
    REQUIRE(ck);
    CHECK(ft_checkpoint_count(ck) == 4);
    CHECK(!strcmp(ft_checkpoint_metadata(ck, "format"), "np"));
    ft_tensor t;
    CHECK_OK(ft_checkpoint_get(ck, "a", &t));
    CHECK(t.dtype == FT_F32 && t.ndim == 2 && t.shape[0] == 2 && t.shape[1] == 3);
    float a[6];
    memcpy(a, t.data, sizeof a);
    for (int i = 0; i < 6; i++) CHECK(a[i] == (float)i);
    CHECK_OK(ft_checkpoint_get(ck, "b", &t));
    CHECK(t.dtype == FT_I8 && t.shape[0] == 3 && ((int8_t *)t.data)[2] == 3);
    CHECK_OK(ft_checkpoint_get(ck, "c", &t));
    uint16_t h[2];
    memcpy(h, t.data, sizeof h);
    CHECK(t.dtype == FT_F16 && ft_f16_to_f32_1(h[0]) == 1.5f && ft_f16_to_f32_1(h[1]) == 2.5f);
    CHECK_OK(ft_checkpoint_get(ck, "d", &t));
    CHECK(t.ndim == 2 && t.shape[0] == 0 && t.shape[1] == 4);
    ft_checkpoint_close(ck);
}
