/*
 * _flextier: the CPython extension under the `flextier` package.
 *
 * This module is deliberately small and mechanical: it moves bytes between
 * Python buffers and the C library with the GIL released. Everything that
 * is about Python types (NumPy/PyTorch/ml_dtypes dtypes, DLPack, the
 * exception classes) lives in flextier/__init__.py, which calls these
 * functions with objects that already export a plain buffer.
 *
 * Zero copy: encode reads the caller's buffer in place and encodes straight
 * into a bytes object sized by ft_encode_bound (then shrunk in place with
 * _PyBytes_Resize, which for large blocks is realloc/mremap, not a copy);
 * decode writes straight into the caller's (or a freshly made NumPy)
 * buffer.
 *
 * Threads: an ft_codec_ctx is single-threaded, so every OS thread that
 * calls in gets its own context (pthread key, freed when the thread
 * exits). A context created before fork() is abandoned in the child (its
 * pool threads do not exist there) and a new one is made on first use.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "flextier/codec.h"
#include "flextier/core.h"

/* Callable(status:int, detail:str) -> exception instance, registered by
 * flextier/__init__.py so that the class hierarchy is defined in Python. */
static PyObject *g_err_factory;

/* ------------------------------------------------------------- errors */

static PyObject *new_none(void)
{
    Py_INCREF(Py_None);
    return Py_None;
}

static PyObject *raise_ft(ft_status st, const char *detail)
{
    if (!detail) detail = "";
    PyObject *msg = PyUnicode_DecodeUTF8(detail, (Py_ssize_t)strlen(detail), "replace");
    if (!msg) return NULL;
    if (!g_err_factory) {
        PyErr_Format(PyExc_RuntimeError, "flextier error %d (%s): %U", (int)st,
                     ft_status_str(st), msg);
        Py_DECREF(msg);
        return NULL;
    }
    PyObject *exc = PyObject_CallFunction(g_err_factory, "iO", (int)st, msg);
    Py_DECREF(msg);
    if (!exc) return NULL;
    PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
    Py_DECREF(exc);
    return NULL;
}

/* Raise for a status returned by the library on this thread: the detail is
 * the thread's ft_last_error() (may be "" when the error was detected on a
 * pool worker thread; the Python side then uses the status text). */
static PyObject *raise_last(ft_status st) { return raise_ft(st, ft_last_error()); }

static PyObject *raise_fmt(ft_status st, const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return raise_ft(st, buf);
}

static PyObject *py_set_error_factory(PyObject *self, PyObject *fn)
{
    (void)self;
    if (!PyCallable_Check(fn)) {
        PyErr_SetString(PyExc_TypeError, "error factory must be callable");
        return NULL;
    }
    Py_INCREF(fn);
    Py_XSETREF(g_err_factory, fn);
    Py_RETURN_NONE;
}

/* ----------------------------------------------------- per-thread ctx */

typedef struct {
    ft_codec_ctx *ctx;
    unsigned threads;      /* what it was created with (resolved, > 0) */
    unsigned long gen;     /* fork generation it belongs to */
} tls_slot;

static pthread_key_t g_key;
static volatile unsigned long g_fork_gen;

static void after_fork_child(void) { g_fork_gen++; }

static void tls_free(void *p)
{
    tls_slot *s = p;
    if (!s) return;
    if (s->gen == g_fork_gen) ft_codec_ctx_free(s->ctx);
    free(s);
}

/* The calling thread's context with `threads` workers (0 = library
 * default). Called without the GIL. */
static ft_status get_ctx(unsigned threads, ft_codec_ctx **out)
{
    unsigned want = threads ? threads : ft_default_threads();
    if (want == 0) want = 1;
    tls_slot *s = pthread_getspecific(g_key);
    if (!s) {
        if (!(s = calloc(1, sizeof *s)))
            return ft_set_error(FT_ERR_NOMEM, "cannot allocate codec context slot");
        s->gen = g_fork_gen;
        if (pthread_setspecific(g_key, s)) {
            free(s);
            return ft_set_error(FT_ERR_NOMEM, "pthread_setspecific failed");
        }
    }
    if (s->gen != g_fork_gen) {        /* inherited over fork(): abandon it */
        s->ctx = NULL;
        s->gen = g_fork_gen;
    }
    if (s->ctx && s->threads == want) {
        *out = s->ctx;
        return FT_OK;
    }
    ft_codec_ctx_free(s->ctx);
    s->ctx = NULL;
    ft_status st = ft_codec_ctx_create(want, &s->ctx);
    if (st) {
        s->ctx = NULL;
        return st;
    }
    s->threads = want;
    *out = s->ctx;
    return FT_OK;
}

/* ------------------------------------------------------------ buffers */

/* Map a buffer's struct-module format and item size to an ft_dtype. */
static int dtype_from_buffer(const Py_buffer *v, ft_dtype *out)
{
    const char *f = v->format ? v->format : "B";
    char order = '@';
    if (*f == '@' || *f == '=' || *f == '<' || *f == '>' || *f == '!') order = *f++;
    int big = order == '>' || order == '!';
    if (f[0] == '\0' || f[1] != '\0') goto bad;
    if (big && v->itemsize != 1) goto bad;
    switch (f[0]) {
    case 'f': if (v->itemsize == 4) { *out = FT_F32; return 0; } break;
    case 'e': if (v->itemsize == 2) { *out = FT_F16; return 0; } break;
    case 'b': if (v->itemsize == 1) { *out = FT_I8;  return 0; } break;
    case 'B': if (v->itemsize == 1) { *out = FT_U8;  return 0; } break;
    case 'i': case 'l': case 'q':
        if (v->itemsize == 4) { *out = FT_I32; return 0; }
        break;
    default: break;
    }
bad:
    raise_fmt(FT_ERR_UNSUPPORTED,
              "unsupported element type (buffer format '%s', itemsize %zd); FlexTier "
              "handles float32, float16, bfloat16, int8, uint8 and int32",
              v->format ? v->format : "B", v->itemsize);
    return -1;
}

/* Resolve the dtype of buffer v: `want` >= 0 overrides the format (the
 * Python layer passes BF16 for a uint16/int16 view of a bfloat16 array).
 * A plain byte buffer (format 'B', 'b' or 'c') may hold any dtype: its
 * total size is what gets checked (decode only: allow_raw). */
static int buffer_dtype(const Py_buffer *v, int want, int allow_raw, ft_dtype *out)
{
    if (want < 0) return dtype_from_buffer(v, out);
    if (want >= FT_DTYPE_COUNT || ft_dtype_bits((ft_dtype)want) < 8) {
        raise_fmt(FT_ERR_INVALID_ARG, "invalid dtype code %d", want);
        return -1;
    }
    const char *f = v->format ? v->format : "B";
    if (*f == '@' || *f == '=' || *f == '<') f++;
    int raw_bytes = allow_raw && v->itemsize == 1 && (!strcmp(f, "B") || !strcmp(f, "b") || !strcmp(f, "c"));
    if (!raw_bytes && (Py_ssize_t)ft_dtype_bits((ft_dtype)want) != v->itemsize * 8) {
        raise_fmt(FT_ERR_INVALID_ARG, "dtype %s does not match the buffer's %zd-byte items",
                  ft_dtype_name((ft_dtype)want), v->itemsize);
        return -1;
    }
    *out = (ft_dtype)want;
    return 0;
}

/* PyObject_GetBuffer with BufferError/TypeError turned into FlexTier
 * InvalidArgument errors carrying the reason. */
static int get_buffer(PyObject *obj, Py_buffer *v, int flags, const char *what)
{
    if (PyObject_GetBuffer(obj, v, flags) == 0) return 0;
    if (PyErr_ExceptionMatches(PyExc_BufferError) || PyErr_ExceptionMatches(PyExc_TypeError)) {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyObject *s = value ? PyObject_Str(value) : NULL;
        const char *reason = s ? PyUnicode_AsUTF8(s) : NULL;
        if (!reason) PyErr_Clear();
        raise_fmt(FT_ERR_INVALID_ARG, "%s must be a %sC-contiguous buffer (%s): %s", what,
                  (flags & PyBUF_WRITABLE) ? "writable " : "", Py_TYPE(obj)->tp_name,
                  reason ? reason : "no buffer interface");
        Py_XDECREF(s);
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
    }
    return -1;
}

static int ulong_arg(Py_ssize_t v, Py_ssize_t lo, Py_ssize_t hi, const char *name)
{
    if (v < lo || v > hi) {
        raise_fmt(FT_ERR_INVALID_ARG, "%s=%zd out of range [%zd, %zd]", name, v, lo, hi);
        return -1;
    }
    return 0;
}

#define MAX_THREADS 1024

/* ------------------------------------------------------------- encode */

static PyObject *py_encode(PyObject *self, PyObject *args, PyObject *kw)
{
    (void)self;
    static char *kwlist[] = {"data", "dtype", "codec", "level", "group_size", "group_dim",
                             "chunk_size", "threads", NULL};
    PyObject *obj;
    int want_dt = -1, level = 0, group_dim = -1;
    const char *codec = "zstd";
    Py_ssize_t group_size = FT_DEFAULT_GROUP_SIZE, chunk_size = 0, threads = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|isininn:encode", kwlist, &obj, &want_dt,
                                     &codec, &level, &group_size, &group_dim, &chunk_size,
                                     &threads))
        return NULL;
    if (ulong_arg(group_size, 0, 65536, "group_size") ||
        ulong_arg(chunk_size, 0, UINT32_MAX, "chunk_size") ||
        ulong_arg(threads, 0, MAX_THREADS, "threads"))
        return NULL;

    ft_codec_params p;
    ft_codec_default_params(&p);
    ft_clear_error();
    ft_status st = ft_codec_parse(codec, &p.codec, &p.entropy);
    if (st) return raise_last(st);
    p.level = level;
    p.group_size = (uint32_t)group_size;
    p.group_dim = group_dim;
    if (chunk_size) p.chunk_size = (uint32_t)chunk_size;

    Py_buffer v;
    if (get_buffer(obj, &v, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT, "data")) return NULL;
    PyObject *out = NULL;
    ft_tensor t;
    int64_t shape[FT_MAX_DIMS];
    if (buffer_dtype(&v, want_dt, 0, &t.dtype)) goto done;
    if (v.ndim > FT_MAX_DIMS) {
        raise_fmt(FT_ERR_INVALID_ARG, "%d dimensions; FlexTier tensors have at most %d",
                  v.ndim, FT_MAX_DIMS);
        goto done;
    }
    for (int i = 0; i < v.ndim; i++) shape[i] = (int64_t)v.shape[i];
    if ((st = ft_tensor_init(&t, t.dtype, (uint32_t)v.ndim, shape, v.buf))) {
        raise_last(st);
        goto done;
    }

    size_t bound = ft_encode_bound(&p, t.dtype, t.ndim, t.shape);
    size_t n = 0;
    if (bound == 0 || bound > (size_t)PY_SSIZE_T_MAX) {
        /* Invalid params or shape: let ft_encode report the precise status
         * (it validates before touching any buffer). */
        ft_codec_ctx *ctx = NULL;
        Py_BEGIN_ALLOW_THREADS
        ft_clear_error();
        st = get_ctx((unsigned)threads, &ctx);
        if (st == FT_OK) st = ft_encode(ctx, &p, &t, NULL, 0, &n);
        Py_END_ALLOW_THREADS
        if (st == FT_OK || st == FT_ERR_BUFFER_SMALL) st = FT_ERR_INVALID_ARG;
        raise_last(st);
        goto done;
    }
    out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)bound);
    if (!out) goto done;
    char *dst = PyBytes_AS_STRING(out);
    Py_BEGIN_ALLOW_THREADS
    ft_codec_ctx *ctx = NULL;
    ft_clear_error();
    st = get_ctx((unsigned)threads, &ctx);
    if (st == FT_OK) st = ft_encode(ctx, &p, &t, dst, bound, &n);
    Py_END_ALLOW_THREADS
    if (st) {
        Py_CLEAR(out);
        raise_last(st);
        goto done;
    }
    if ((size_t)PyBytes_GET_SIZE(out) != n && _PyBytes_Resize(&out, (Py_ssize_t)n) < 0)
        out = NULL;   /* _PyBytes_Resize freed it and set MemoryError */
done:
    PyBuffer_Release(&v);
    return out;
}

/* ------------------------------------------------------------- decode */

static int parse_frame(const Py_buffer *f, ft_frame_info *fi, int allow_partial)
{
    ft_clear_error();
    ft_status st = ft_frame_parse(f->buf, (size_t)f->len, fi);
    if (st == FT_ERR_BUFFER_SMALL) {
        if (f->len < (Py_ssize_t)FT_FRAME_FIXED_HEADER)
            raise_fmt(FT_ERR_CORRUPT, "not a FlexTier frame: %zd bytes, shorter than the "
                      "%u-byte fixed header", f->len, FT_FRAME_FIXED_HEADER);
        else
            raise_fmt(FT_ERR_CORRUPT, "truncated frame: header needs %llu bytes, got %zd",
                      (unsigned long long)fi->header_size, f->len);
        return -1;
    }
    if (st) {
        raise_last(st);
        return -1;
    }
    if (!allow_partial && fi->frame_size > (uint64_t)f->len) {
        raise_fmt(FT_ERR_CORRUPT, "truncated frame: %zd of %llu bytes", f->len,
                  (unsigned long long)fi->frame_size);
        return -1;
    }
    return 0;
}

static PyObject *py_decode_into(PyObject *self, PyObject *args, PyObject *kw)
{
    (void)self;
    static char *kwlist[] = {"frame", "out", "dtype", "threads", NULL};
    PyObject *fobj, *oobj;
    int want_dt = -1;
    Py_ssize_t threads = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|in:decode_into", kwlist, &fobj, &oobj,
                                     &want_dt, &threads))
        return NULL;
    if (ulong_arg(threads, 0, MAX_THREADS, "threads")) return NULL;
    Py_buffer f, o;
    if (get_buffer(fobj, &f, PyBUF_C_CONTIGUOUS, "frame")) return NULL;
    if (get_buffer(oobj, &o, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE, "out")) {
        PyBuffer_Release(&f);
        return NULL;
    }
    PyObject *ret = NULL;
    ft_frame_info fi;
    ft_tensor t;
    memset(&t, 0, sizeof t);
    if (buffer_dtype(&o, want_dt, 1, &t.dtype)) goto done;
    if (parse_frame(&f, &fi, 0)) goto done;
    /* Any float frame decodes to any float dtype; otherwise dtypes must
     * match. ft_decode checks that too; checking here gives a clearer
     * message before the size check. */
    if (t.dtype != fi.dtype && !(ft_dtype_is_float(t.dtype) && ft_dtype_is_float(fi.dtype))) {
        raise_fmt(FT_ERR_INVALID_ARG, "cannot decode a %s frame into a %s buffer",
                  ft_dtype_name(fi.dtype), ft_dtype_name(t.dtype));
        goto done;
    }
    uint64_t need = ft_dtype_nbytes(t.dtype, fi.numel);
    if (need != (uint64_t)o.len) {
        char sh[128];
        ft_shape_format(fi.ndim, fi.shape, sh, sizeof sh);
        raise_fmt(FT_ERR_INVALID_ARG,
                  "out has %zd bytes; the frame's %s tensor of shape %s needs %llu", o.len,
                  ft_dtype_name(t.dtype), sh, (unsigned long long)need);
        goto done;
    }
    t.data = o.buf;
    ft_status st;
    Py_BEGIN_ALLOW_THREADS
    ft_codec_ctx *ctx = NULL;
    ft_clear_error();
    st = get_ctx((unsigned)threads, &ctx);
    if (st == FT_OK) st = ft_decode(ctx, f.buf, (size_t)f.len, &t, (size_t)o.len);
    Py_END_ALLOW_THREADS
    if (st) {
        raise_last(st);
        goto done;
    }
    ret = new_none();
done:
    PyBuffer_Release(&o);
    PyBuffer_Release(&f);
    return ret;
}

/* --------------------------------------------------------- frame info */

static PyObject *shape_tuple(uint32_t ndim, const int64_t *shape)
{
    PyObject *t = PyTuple_New(ndim);
    if (!t) return NULL;
    for (uint32_t i = 0; i < ndim; i++) {
        PyObject *d = PyLong_FromLongLong((long long)shape[i]);
        if (!d) {
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SET_ITEM(t, i, d);
    }
    return t;
}

static PyObject *py_frame_info(PyObject *self, PyObject *args, PyObject *kw)
{
    (void)self;
    static char *kwlist[] = {"frame", "partial", NULL};
    PyObject *fobj;
    int partial = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|p:frame_info", kwlist, &fobj, &partial))
        return NULL;
    Py_buffer f;
    if (get_buffer(fobj, &f, PyBUF_C_CONTIGUOUS, "frame")) return NULL;
    ft_frame_info fi;
    PyObject *d = NULL;
    if (parse_frame(&f, &fi, partial)) goto done;
    PyObject *shape = shape_tuple(fi.ndim, fi.shape);
    if (!shape) goto done;
    int lossy = ft_codec_is_lossy(fi.codec);
    d = Py_BuildValue(
        "{s:I,s:s,s:s,s:i,s:s,s:i,s:N,s:I,s:N,s:N,s:I,s:K,s:K,s:K,s:K,s:K,s:O}",
        "version", (unsigned)fi.version,
        "codec", ft_codec_name(fi.codec),
        "entropy", fi.codec == FT_CODEC_BYTEPLANE ? ft_codec_name(fi.entropy) : "",
        "level", fi.level,
        "dtype", ft_dtype_name(fi.dtype),
        "dtype_code", (int)fi.dtype,
        "shape", shape,
        "chunk_size", (unsigned)fi.chunk_size,
        "group_size", lossy ? PyLong_FromUnsignedLong(fi.group_size) : new_none(),
        "group_dim", lossy ? PyLong_FromLong(fi.group_dim) : new_none(),
        "n_chunks", (unsigned)fi.n_chunks,
        "numel", (unsigned long long)fi.numel,
        "raw_size", (unsigned long long)fi.raw_size,
        "frame_size", (unsigned long long)fi.frame_size,
        "header_size", (unsigned long long)fi.header_size,
        "checksum", (unsigned long long)fi.checksum,
        "lossy", lossy ? Py_True : Py_False);
done:
    PyBuffer_Release(&f);
    return d;
}

/* --------------------------------------------------------------- misc */

static PyObject *py_status_str(PyObject *self, PyObject *arg)
{
    (void)self;
    long st = PyLong_AsLong(arg);
    if (st == -1 && PyErr_Occurred()) return NULL;
    return PyUnicode_FromString(ft_status_str((ft_status)st));
}

static PyObject *py_default_threads(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    return PyLong_FromUnsignedLong(ft_default_threads());
}

/* Threads of the calling thread's cached codec context (0 if none yet):
 * for tests of the per-thread cache. */
static PyObject *py_ctx_threads(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    tls_slot *s = pthread_getspecific(g_key);
    return PyLong_FromUnsignedLong(s && s->ctx && s->gen == g_fork_gen ? s->threads : 0);
}

static PyMethodDef methods[] = {
    {"encode", (PyCFunction)(void (*)(void))py_encode, METH_VARARGS | METH_KEYWORDS,
     "encode(data, dtype=-1, codec='zstd', level=0, group_size=64, group_dim=-1, "
     "chunk_size=0, threads=0) -> bytes\n\nEncode a C-contiguous buffer into a frame."},
    {"decode_into", (PyCFunction)(void (*)(void))py_decode_into, METH_VARARGS | METH_KEYWORDS,
     "decode_into(frame, out, dtype=-1, threads=0) -> None\n\nDecode a frame into a "
     "writable C-contiguous buffer of exactly the decoded size."},
    {"frame_info", (PyCFunction)(void (*)(void))py_frame_info, METH_VARARGS | METH_KEYWORDS,
     "frame_info(frame, partial=False) -> dict\n\nParse and validate a frame header."},
    {"status_str", py_status_str, METH_O, "status_str(status) -> str"},
    {"default_threads", py_default_threads, METH_NOARGS,
     "default_threads() -> int: FLEXTIER_THREADS or the number of online CPUs."},
    {"ctx_threads", py_ctx_threads, METH_NOARGS,
     "ctx_threads() -> int: workers of this thread's cached codec context (0 = none)."},
    {"_set_error_factory", py_set_error_factory, METH_O, NULL},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef moddef = {
    PyModuleDef_HEAD_INIT, "_flextier",
    "Low-level binding of the FlexTier C library (use the `flextier` package).", -1,
    methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__flextier(void)
{
    static int once;
    if (!once) {
        if (pthread_key_create(&g_key, tls_free)) {
            PyErr_SetString(PyExc_RuntimeError, "pthread_key_create failed");
            return NULL;
        }
        pthread_atfork(NULL, NULL, after_fork_child);
        once = 1;
    }
    PyObject *m = PyModule_Create(&moddef);
    if (!m) return NULL;
    static const struct { const char *name; long v; } consts[] = {
        {"DT_F32", FT_F32}, {"DT_F16", FT_F16}, {"DT_BF16", FT_BF16}, {"DT_I8", FT_I8},
        {"DT_U8", FT_U8}, {"DT_I32", FT_I32},
        {"OK", FT_OK}, {"ERR_INVALID_ARG", FT_ERR_INVALID_ARG}, {"ERR_NOMEM", FT_ERR_NOMEM},
        {"ERR_CORRUPT", FT_ERR_CORRUPT}, {"ERR_UNSUPPORTED", FT_ERR_UNSUPPORTED},
        {"ERR_IO", FT_ERR_IO}, {"ERR_NOT_FOUND", FT_ERR_NOT_FOUND},
        {"ERR_NO_SPACE", FT_ERR_NO_SPACE}, {"ERR_BUFFER_SMALL", FT_ERR_BUFFER_SMALL},
        {"ERR_AUTH", FT_ERR_AUTH}, {"ERR_NET", FT_ERR_NET}, {"ERR_TIMEOUT", FT_ERR_TIMEOUT},
        {"ERR_PROTOCOL", FT_ERR_PROTOCOL}, {"ERR_BUSY", FT_ERR_BUSY},
        {"ERR_EXISTS", FT_ERR_EXISTS}, {"ERR_CANCELED", FT_ERR_CANCELED},
        {"ERR_INTERNAL", FT_ERR_INTERNAL},
        {"DEFAULT_CHUNK_SIZE", FT_DEFAULT_CHUNK_SIZE}, {"MIN_CHUNK_SIZE", FT_MIN_CHUNK_SIZE},
        {"MAX_CHUNK_SIZE", FT_MAX_CHUNK_SIZE}, {"DEFAULT_GROUP_SIZE", FT_DEFAULT_GROUP_SIZE},
        {"MAX_DIMS", FT_MAX_DIMS},
    };
    for (size_t i = 0; i < sizeof consts / sizeof consts[0]; i++)
        if (PyModule_AddIntConstant(m, consts[i].name, consts[i].v)) goto fail;
    if (PyModule_AddStringConstant(m, "LIB_VERSION", FT_VERSION_STRING)) goto fail;
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}
