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
#include <time.h>
#include <stdlib.h>
#include <string.h>

#include "flextier/codec.h"
#include "flextier/core.h"
#include "flextier/store.h"
#include "flextier/session.h"
#include "flextier/chat.h"
#include "flextier/train.h"

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

/* Codec params from the Python arguments (raises and returns -1 on error). */
static int make_params(const char *codec, int level, Py_ssize_t group_size, int group_dim,
                       Py_ssize_t chunk_size, ft_codec_params *p)
{
    if (ulong_arg(group_size, 0, 65536, "group_size") ||
        ulong_arg(chunk_size, 0, UINT32_MAX, "chunk_size"))
        return -1;
    ft_codec_default_params(p);
    ft_clear_error();
    ft_status st = ft_codec_parse(codec, &p->codec, &p->entropy);
    if (st) {
        raise_last(st);
        return -1;
    }
    p->level = level;
    p->group_size = (uint32_t)group_size;
    p->group_dim = group_dim;
    if (chunk_size) p->chunk_size = (uint32_t)chunk_size;
    return 0;
}

/* Describe buffer v (dtype from its format or `want_dt`) as a tensor. */
static int buffer_tensor(const Py_buffer *v, int want_dt, ft_tensor *t)
{
    ft_dtype dt;
    int64_t shape[FT_MAX_DIMS];
    if (buffer_dtype(v, want_dt, 0, &dt)) return -1;
    if (v->ndim > FT_MAX_DIMS) {
        raise_fmt(FT_ERR_INVALID_ARG, "%d dimensions; FlexTier tensors have at most %d",
                  v->ndim, FT_MAX_DIMS);
        return -1;
    }
    for (int i = 0; i < v->ndim; i++) shape[i] = (int64_t)v->shape[i];
    ft_status st = ft_tensor_init(t, dt, (uint32_t)v->ndim, shape, v->buf);
    if (st) {
        raise_last(st);
        return -1;
    }
    return 0;
}

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
    if (ulong_arg(threads, 0, MAX_THREADS, "threads")) return NULL;

    ft_codec_params p;
    ft_status st;
    if (make_params(codec, level, group_size, group_dim, chunk_size, &p)) return NULL;

    Py_buffer v;
    if (get_buffer(obj, &v, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT, "data")) return NULL;
    PyObject *out = NULL;
    ft_tensor t;
    if (buffer_tensor(&v, want_dt, &t)) goto done;

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

/* -------------------------------------------------------------- store */

/*
 * _Store wraps an ft_store (thread-safe in C). Python-side rules on top:
 *  - every call marks the store busy while it runs without the GIL, and
 *    close() refuses (BusyError) while another thread is inside a call,
 *    since ft_store_close must not race with other calls;
 *  - async requests hold a reference to their _Store and are kept on a
 *    list; close() first waits for and frees every request (an
 *    ft_request must be freed before its store), keeping their outcomes.
 */

typedef struct RequestObject RequestObject;

typedef struct {
    PyObject_HEAD
    ft_store *s;
    Py_ssize_t busy;          /* threads inside a call (GIL released) */
    int closing;              /* close() in progress: no new calls */
    RequestObject *reqs;      /* live requests (doubly linked) */
} StoreObject;

/* A block from ft_malloc_aligned exporting a writable buffer: the zero-copy
 * owner behind arrays returned by read_tensor (numpy keeps it as .base). */
typedef struct {
    PyObject_HEAD
    void *p;
    Py_ssize_t n;
    Py_ssize_t exports;
} OwnedBufferObject;

static PyTypeObject OwnedBufferType;

static PyObject *owned_new(void *p, size_t n)
{
    OwnedBufferObject *o = PyObject_New(OwnedBufferObject, &OwnedBufferType);
    if (!o) {
        ft_free_aligned(p);
        return NULL;
    }
    o->p = p;
    o->n = (Py_ssize_t)n;
    o->exports = 0;
    return (PyObject *)o;
}

static void owned_dealloc(OwnedBufferObject *o)
{
    ft_free_aligned(o->p);
    PyObject_Free(o);
}

static int owned_getbuffer(OwnedBufferObject *o, Py_buffer *v, int flags)
{
    if (PyBuffer_FillInfo(v, (PyObject *)o, o->p, o->n, 0, flags) < 0) return -1;
    o->exports++;
    return 0;
}

static void owned_releasebuffer(OwnedBufferObject *o, Py_buffer *v)
{
    (void)v;
    o->exports--;
}

static PyBufferProcs owned_as_buffer = {(getbufferproc)owned_getbuffer,
                                        (releasebufferproc)owned_releasebuffer};

static PyTypeObject OwnedBufferType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "flextier._flextier.OwnedBuffer",
    .tp_basicsize = sizeof(OwnedBufferObject),
    .tp_dealloc = (destructor)owned_dealloc,
    .tp_as_buffer = &owned_as_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Memory allocated by the C library, exported as a writable buffer.",
};

/* (owner, dtype_code, shape) for a tensor the library allocated. Takes
 * ownership of t->data. */
static PyObject *owned_result(ft_tensor *t)
{
    uint64_t nbytes = 0;
    ft_status st = ft_tensor_nbytes(t, &nbytes);
    if (st) {
        ft_free_aligned(t->data);
        return raise_last(st);
    }
    PyObject *owner = owned_new(t->data, (size_t)nbytes);
    t->data = NULL;
    if (!owner) return NULL;
    PyObject *shape = shape_tuple(t->ndim, t->shape);
    if (!shape) {
        Py_DECREF(owner);
        return NULL;
    }
    return Py_BuildValue("(NiN)", owner, (int)t->dtype, shape);
}

struct RequestObject {
    PyObject_HEAD
    StoreObject *store;       /* strong ref */
    RequestObject *prev, *next;
    ft_request *req;          /* NULL once reaped */
    Py_ssize_t waiters;       /* threads inside ft_request_wait */
    int is_read, alloc;
    int has_view;
    Py_buffer view;           /* write: the source; read: the destination */
    ft_tensor t;              /* write: source descriptor; read: dst */
    size_t cap;
    ft_status status;         /* final status once reaped */
    char detail[256];
    int taken;                /* alloc read: the buffer was handed out */
};

static PyTypeObject RequestType;

static void req_link(StoreObject *so, RequestObject *r)
{
    r->prev = NULL;
    r->next = so->reqs;
    if (so->reqs) so->reqs->prev = r;
    so->reqs = r;
}

static void req_unlink(RequestObject *r)
{
    StoreObject *so = r->store;
    if (r->prev) r->prev->next = r->next;
    else if (so && so->reqs == r) so->reqs = r->next;
    if (r->next) r->next->prev = r->prev;
    r->prev = r->next = NULL;
}

/* Request lifecycle. All of it runs with the GIL held except the blocking
 * ft_request_wait calls, which count themselves in r->waiters. A finished
 * request is finalized (outcome copied, ft_request freed, Python buffer
 * released) by whoever sees it done while no other thread is inside
 * ft_request_wait on it; freeing a finished request does not block, so
 * finalizing is atomic under the GIL. */

/* Wait up to slice_ms (< 0: forever) with the GIL released. */
static ft_status req_wait_slice(RequestObject *r, int slice_ms)
{
    ft_request *q = r->req;
    ft_status st;
    r->waiters++;
    Py_BEGIN_ALLOW_THREADS
    st = ft_request_wait(q, slice_ms);
    Py_END_ALLOW_THREADS
    r->waiters--;
    return st;
}

/* If the request finished and nobody else waits on it: keep its outcome,
 * free it, release the buffer, unlink it. Returns 1 once finalized. */
static int req_finalize(RequestObject *r)
{
    if (!r->req) return 1;
    if (r->waiters) return 0;
    ft_status st = ft_request_test(r->req);
    if (st == FT_INPROGRESS) return 0;
    r->status = st;
    snprintf(r->detail, sizeof r->detail, "%s", st < 0 ? ft_last_error() : "");
    ft_request_free(r->req);              /* finished: does not block */
    r->req = NULL;
    if (r->has_view) {
        PyBuffer_Release(&r->view);
        r->has_view = 0;
    }
    if (st != FT_OK && r->alloc && r->t.data) {
        ft_free_aligned(r->t.data);
        r->t.data = NULL;
    }
    req_unlink(r);
    return 1;
}

/* Wait for the request and finalize it (close, dealloc). */
static void req_reap(RequestObject *r)
{
    while (!req_finalize(r)) req_wait_slice(r, 100);
}

static void req_dealloc(RequestObject *r)
{
    req_reap(r);
    if (r->has_view) PyBuffer_Release(&r->view);
    if (r->alloc && !r->taken) ft_free_aligned(r->t.data);
    Py_XDECREF(r->store);
    PyObject_Free(r);
}

/* done() -> bool: finished (successfully or not)? Never raises for the
 * request's own outcome. */
static PyObject *req_done(RequestObject *r, PyObject *unused)
{
    (void)unused;
    if (!r->req) Py_RETURN_TRUE;
    ft_status st = ft_request_test(r->req);
    return PyBool_FromLong(st != FT_INPROGRESS);
}

/* wait(timeout=None): block (GIL released, interruptible) until the
 * request finished; raise its error, or RequestTimeoutError if still
 * running after `timeout` seconds. For an allocating read, returns
 * (owner, dtype, shape) the first time, else None. */
static PyObject *req_wait(RequestObject *r, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"timeout", NULL};
    PyObject *tobj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|O:wait", kwlist, &tobj)) return NULL;
    double timeout = -1;
    if (tobj != Py_None) {
        timeout = PyFloat_AsDouble(tobj);
        if (timeout == -1 && PyErr_Occurred()) return NULL;
        if (timeout < 0) timeout = 0;
    }
    double deadline = timeout >= 0 ? ft_now() + timeout : 0;
    ft_status st = FT_INPROGRESS;
    while (r->req) {
        st = ft_request_test(r->req);
        if (st != FT_INPROGRESS) {
            if (!req_finalize(r)) {
                /* Another thread is inside ft_request_wait on it and will
                 * finalize; report the outcome from here. */
                r->status = st;
                snprintf(r->detail, sizeof r->detail, "%s", st < 0 ? ft_last_error() : "");
            }
            break;
        }
        int slice = 100;
        if (timeout >= 0) {
            double left = deadline - ft_now();
            if (left <= 0)
                return raise_fmt(FT_ERR_TIMEOUT, "request still running after %.3f s", timeout);
            if (left < 0.1) slice = (int)(left * 1000) + 1;
        }
        req_wait_slice(r, slice);
        if (PyErr_CheckSignals() < 0) return NULL;
    }
    if (r->status != FT_OK) return raise_ft(r->status, r->detail);
    if (r->alloc && !r->taken) {
        r->taken = 1;
        ft_tensor t = r->t;
        r->t.data = NULL;
        return owned_result(&t);
    }
    Py_RETURN_NONE;
}

/* Result shape/dtype of a finished read into out: (dtype, shape). */
static PyObject *req_out_info(RequestObject *r, PyObject *unused)
{
    (void)unused;
    return Py_BuildValue("(iN)", (int)r->t.dtype, shape_tuple(r->t.ndim, r->t.shape));
}

static PyMethodDef req_methods[] = {
    {"done", (PyCFunction)req_done, METH_NOARGS, "done() -> bool"},
    {"wait", (PyCFunction)(void (*)(void))req_wait, METH_VARARGS | METH_KEYWORDS,
     "wait(timeout=None): wait for completion; raise the request's error"},
    {"out_info", (PyCFunction)req_out_info, METH_NOARGS,
     "out_info() -> (dtype, shape) of a finished read into out"},
    {NULL, NULL, 0, NULL}};

static PyTypeObject RequestType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "flextier._flextier.Request",
    .tp_basicsize = sizeof(RequestObject),
    .tp_dealloc = (destructor)req_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_methods = req_methods,
    .tp_doc = "An asynchronous store request (see flextier.Request).",
};

static int store_check(StoreObject *so)
{
    if (so->s && !so->closing) return 0;
    raise_fmt(FT_ERR_INVALID_ARG, so->s ? "the store is closing" : "the store is closed");
    return -1;
}

static int store_init(StoreObject *so, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"uri", "token_file", "queue_depth", "codec_threads",
                             "timeout_ms", NULL};
    const char *uri, *token_file = NULL;
    Py_ssize_t depth = 4, cthreads = 0, timeout_ms = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "s|znnn:Store", kwlist, &uri, &token_file, &depth,
                                     &cthreads, &timeout_ms))
        return -1;
    if (so->s) {
        PyErr_SetString(PyExc_RuntimeError, "Store already open");
        return -1;
    }
    if (ulong_arg(depth, 1, 64, "queue_depth") || ulong_arg(cthreads, 0, MAX_THREADS, "codec_threads") ||
        ulong_arg(timeout_ms, 0, INT32_MAX, "timeout_ms"))
        return -1;
    ft_store_params p;
    ft_store_default_params(&p);
    p.token_file = token_file;
    p.queue_depth = (unsigned)depth;
    p.codec_threads = (unsigned)cthreads;
    if (timeout_ms) p.timeout_ms = (int)timeout_ms;
    ft_status st;
    ft_store *s = NULL;
    Py_BEGIN_ALLOW_THREADS
    ft_clear_error();
    st = ft_store_open(uri, &p, &s);
    Py_END_ALLOW_THREADS
    if (st) {
        raise_last(st);
        return -1;
    }
    so->s = s;
    return 0;
}

/* close(): refuse new calls, wait for requests and for calls other
 * threads are making, then close the C store (which must not race with
 * any other call on it). Idempotent. */
static PyObject *store_close(StoreObject *so, PyObject *unused)
{
    (void)unused;
    if (!so->s || so->closing) Py_RETURN_NONE;
    so->closing = 1;
    Py_INCREF(so);
    while (so->reqs || so->busy) {
        if (so->reqs) {
            RequestObject *r = so->reqs;
            Py_INCREF(r);
            req_reap(r);                  /* unlinks it */
            Py_DECREF(r);
        } else {
            Py_BEGIN_ALLOW_THREADS
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
            Py_END_ALLOW_THREADS
        }
    }
    ft_store *s = so->s;
    so->s = NULL;
    Py_BEGIN_ALLOW_THREADS
    ft_store_close(s);
    Py_END_ALLOW_THREADS
    Py_DECREF(so);
    Py_RETURN_NONE;
}

static void store_dealloc(StoreObject *so)
{
    /* No live request can exist here: each holds a reference. */
    if (so->s) {
        ft_store *s = so->s;
        so->s = NULL;
        Py_BEGIN_ALLOW_THREADS
        ft_store_close(s);
        Py_END_ALLOW_THREADS
    }
    Py_TYPE(so)->tp_free((PyObject *)so);
}

#define STORE_CALL(so, stmt)        \
    do {                            \
        (so)->busy++;               \
        Py_BEGIN_ALLOW_THREADS      \
        ft_clear_error();           \
        stmt;                       \
        Py_END_ALLOW_THREADS        \
        (so)->busy--;               \
    } while (0)

/* Shared argument parsing of write / write_async. */
typedef struct {
    const char *key;
    PyObject *data;
    int dtype, level, group_dim;
    const char *codec;
    Py_ssize_t group_size, chunk_size;
} write_args;

static int parse_write(PyObject *args, PyObject *kw, const char *fmt, write_args *a,
                       ft_codec_params *p, int *use_p)
{
    static char *kwlist[] = {"key", "data", "dtype", "codec", "level", "group_size",
                             "group_dim", "chunk_size", NULL};
    a->dtype = -1;
    a->codec = NULL;
    a->level = 0;
    a->group_dim = -1;
    a->group_size = FT_DEFAULT_GROUP_SIZE;
    a->chunk_size = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, fmt, kwlist, &a->key, &a->data, &a->dtype,
                                     &a->codec, &a->level, &a->group_size, &a->group_dim,
                                     &a->chunk_size))
        return -1;
    *use_p = a->codec != NULL;
    if (*use_p && make_params(a->codec, a->level, a->group_size, a->group_dim, a->chunk_size, p))
        return -1;
    return 0;
}

static PyObject *store_write(StoreObject *so, PyObject *args, PyObject *kw)
{
    write_args a;
    ft_codec_params p;
    int use_p;
    if (parse_write(args, kw, "sO|izinin:write", &a, &p, &use_p)) return NULL;
    if (store_check(so)) return NULL;
    Py_buffer v;
    if (get_buffer(a.data, &v, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT, "data")) return NULL;
    ft_tensor t;
    PyObject *ret = NULL;
    if (buffer_tensor(&v, a.dtype, &t) == 0) {
        ft_status st;
        STORE_CALL(so, st = ft_write_tensor(so->s, a.key, &t, use_p ? &p : NULL));
        ret = st ? raise_last(st) : new_none();
    }
    PyBuffer_Release(&v);
    return ret;
}

static PyObject *store_read(StoreObject *so, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"key", "dtype", NULL};
    const char *key;
    int dtype = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "s|i:read", kwlist, &key, &dtype)) return NULL;
    if (store_check(so)) return NULL;
    ft_tensor t;
    memset(&t, 0, sizeof t);
    ft_status st;
    STORE_CALL(so, st = ft_read_tensor(so->s, key, dtype, &t));
    if (st) return raise_last(st);
    return owned_result(&t);
}

/* read_into(key, out, dtype=-1) -> shape: decode into out (at least the
 * tensor's size; the Python layer checks the exact size). */
static PyObject *store_read_into(StoreObject *so, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"key", "out", "dtype", NULL};
    const char *key;
    PyObject *oobj;
    int dtype = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "sO|i:read_into", kwlist, &key, &oobj, &dtype))
        return NULL;
    if (store_check(so)) return NULL;
    Py_buffer o;
    if (get_buffer(oobj, &o, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE, "out"))
        return NULL;
    PyObject *ret = NULL;
    ft_tensor t;
    memset(&t, 0, sizeof t);
    if (buffer_dtype(&o, dtype, 1, &t.dtype) == 0) {
        t.data = o.buf;
        ft_status st;
        if (o.len == 0) {           /* the C API wants a non-NULL buffer */
            static char dummy[64];
            t.data = dummy;
        }
        STORE_CALL(so, st = ft_read_tensor_into(so->s, key, &t, (size_t)o.len));
        if (st) raise_last(st);
        else ret = Py_BuildValue("(iN)", (int)t.dtype, shape_tuple(t.ndim, t.shape));
    }
    PyBuffer_Release(&o);
    return ret;
}

static RequestObject *req_new(StoreObject *so)
{
    RequestObject *r = PyObject_New(RequestObject, &RequestType);
    if (!r) return NULL;
    Py_INCREF(so);
    r->store = so;
    r->prev = r->next = NULL;
    r->req = NULL;
    r->waiters = 0;
    r->is_read = r->alloc = r->has_view = r->taken = 0;
    memset(&r->t, 0, sizeof r->t);
    r->cap = 0;
    r->status = FT_OK;
    r->detail[0] = '\0';
    return r;
}

static PyObject *req_submitted(RequestObject *r, ft_status st, ft_request *q)
{
    if (st) {
        r->status = st;
        raise_last(st);
        Py_DECREF(r);            /* releases the view, frees nothing else */
        return NULL;
    }
    r->req = q;
    req_link(r->store, r);
    return (PyObject *)r;
}

static PyObject *store_write_async(StoreObject *so, PyObject *args, PyObject *kw)
{
    write_args a;
    ft_codec_params p;
    int use_p;
    if (parse_write(args, kw, "sO|izinin:write_async", &a, &p, &use_p)) return NULL;
    if (store_check(so)) return NULL;
    RequestObject *r = req_new(so);
    if (!r) return NULL;
    if (get_buffer(a.data, &r->view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT, "data")) {
        Py_DECREF(r);
        return NULL;
    }
    r->has_view = 1;
    if (buffer_tensor(&r->view, a.dtype, &r->t)) {
        Py_DECREF(r);
        return NULL;
    }
    ft_status st;
    ft_request *q = NULL;
    STORE_CALL(so, st = ft_write_tensor_async(so->s, a.key, &r->t, use_p ? &p : NULL, &q));
    return req_submitted(r, st, q);
}

static PyObject *store_read_async(StoreObject *so, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"key", "out", "dtype", NULL};
    const char *key;
    PyObject *oobj = Py_None;
    int dtype = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "s|Oi:read_async", kwlist, &key, &oobj, &dtype))
        return NULL;
    if (store_check(so)) return NULL;
    RequestObject *r = req_new(so);
    if (!r) return NULL;
    r->is_read = 1;
    if (oobj == Py_None) {
        r->alloc = 1;               /* the request allocates, stored dtype */
    } else {
        if (get_buffer(oobj, &r->view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE,
                       "out")) {
            Py_DECREF(r);
            return NULL;
        }
        r->has_view = 1;
        if (buffer_dtype(&r->view, dtype, 1, &r->t.dtype)) {
            Py_DECREF(r);
            return NULL;
        }
        r->t.data = r->view.buf;
        r->cap = (size_t)r->view.len;
        if (r->cap == 0) {
            static char dummy[64];
            r->t.data = dummy;
        }
    }
    ft_status st;
    ft_request *q = NULL;
    STORE_CALL(so, st = ft_read_tensor_async(so->s, key, &r->t, r->cap, &q));
    return req_submitted(r, st, q);
}

static PyObject *store_delete(StoreObject *so, PyObject *args)
{
    const char *key;
    if (!PyArg_ParseTuple(args, "s:delete", &key) || store_check(so)) return NULL;
    ft_status st;
    STORE_CALL(so, st = ft_delete_tensor(so->s, key));
    return st ? raise_last(st) : new_none();
}

static PyObject *store_stat(StoreObject *so, PyObject *args)
{
    const char *key;
    if (!PyArg_ParseTuple(args, "s:stat", &key) || store_check(so)) return NULL;
    ft_tensor_stat ts;
    ft_status st;
    STORE_CALL(so, st = ft_stat_tensor(so->s, key, &ts));
    if (st) return raise_last(st);
    return Py_BuildValue("{s:i,s:N,s:s,s:s,s:i,s:K,s:K}",
                         "dtype_code", (int)ts.dtype,
                         "shape", shape_tuple(ts.ndim, ts.shape),
                         "codec", ft_codec_name(ts.codec),
                         "entropy", ts.codec == FT_CODEC_BYTEPLANE ? ft_codec_name(ts.entropy) : "",
                         "level", ts.level,
                         "raw_bytes", (unsigned long long)ts.raw_bytes,
                         "stored_bytes", (unsigned long long)ts.stored_bytes);
}

static PyObject *store_list(StoreObject *so, PyObject *unused)
{
    (void)unused;
    if (store_check(so)) return NULL;
    char **keys = NULL;
    size_t n = 0;
    ft_status st;
    STORE_CALL(so, st = ft_list_tensors(so->s, &keys, &n));
    if (st) return raise_last(st);
    PyObject *l = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; l && i < n; i++) {
        PyObject *k = PyUnicode_DecodeASCII(keys[i], (Py_ssize_t)strlen(keys[i]), "replace");
        if (!k) {
            Py_CLEAR(l);
            break;
        }
        PyList_SET_ITEM(l, (Py_ssize_t)i, k);
    }
    ft_list_free(keys, n);
    return l;
}

static PyObject *store_stats(StoreObject *so, PyObject *unused)
{
    (void)unused;
    if (store_check(so)) return NULL;
    ft_store_stats x;
    ft_status st;
    STORE_CALL(so, st = ft_store_stats_get(so->s, &x));
    if (st) return raise_last(st);
    return Py_BuildValue("{s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K}",
                         "capacity", (unsigned long long)x.capacity,
                         "used", (unsigned long long)x.used,
                         "tensors", (unsigned long long)x.tensors,
                         "connections", (unsigned long long)x.connections,
                         "total_connections", (unsigned long long)x.total_connections,
                         "bytes_in", (unsigned long long)x.bytes_in,
                         "bytes_out", (unsigned long long)x.bytes_out,
                         "spill_capacity", (unsigned long long)x.spill_capacity,
                         "spill_used", (unsigned long long)x.spill_used,
                         "spilled_tensors", (unsigned long long)x.spilled_tensors,
                         "puts", (unsigned long long)x.puts,
                         "gets", (unsigned long long)x.gets);
}

static PyObject *store_put_frame(StoreObject *so, PyObject *args)
{
    const char *key;
    Py_buffer f;
    if (!PyArg_ParseTuple(args, "sy*:put_frame", &key, &f)) return NULL;
    ft_status st = FT_OK;
    if (!store_check(so)) STORE_CALL(so, st = ft_store_put_frame(so->s, key, f.buf, (size_t)f.len));
    PyBuffer_Release(&f);
    if (PyErr_Occurred()) return NULL;
    return st ? raise_last(st) : new_none();
}

static PyObject *store_get_frame(StoreObject *so, PyObject *args)
{
    const char *key;
    if (!PyArg_ParseTuple(args, "s:get_frame", &key) || store_check(so)) return NULL;
    void *p = NULL;
    size_t n = 0;
    ft_status st;
    STORE_CALL(so, st = ft_store_get_frame(so->s, key, &p, &n));
    if (st) return raise_last(st);
    PyObject *owner = owned_new(p, n);
    if (!owner) return NULL;
    PyObject *mv = PyMemoryView_FromObject(owner);
    Py_DECREF(owner);
    return mv;
}

static PyObject *store_closed(StoreObject *so, void *unused)
{
    (void)unused;
    return PyBool_FromLong(so->s == NULL);
}

static PyMethodDef store_methods[] = {
    {"write", (PyCFunction)(void (*)(void))store_write, METH_VARARGS | METH_KEYWORDS, NULL},
    {"read", (PyCFunction)(void (*)(void))store_read, METH_VARARGS | METH_KEYWORDS, NULL},
    {"read_into", (PyCFunction)(void (*)(void))store_read_into, METH_VARARGS | METH_KEYWORDS, NULL},
    {"write_async", (PyCFunction)(void (*)(void))store_write_async, METH_VARARGS | METH_KEYWORDS, NULL},
    {"read_async", (PyCFunction)(void (*)(void))store_read_async, METH_VARARGS | METH_KEYWORDS, NULL},
    {"delete", (PyCFunction)store_delete, METH_VARARGS, NULL},
    {"stat", (PyCFunction)store_stat, METH_VARARGS, NULL},
    {"list", (PyCFunction)store_list, METH_NOARGS, NULL},
    {"stats", (PyCFunction)store_stats, METH_NOARGS, NULL},
    {"put_frame", (PyCFunction)store_put_frame, METH_VARARGS, NULL},
    {"get_frame", (PyCFunction)store_get_frame, METH_VARARGS, NULL},
    {"close", (PyCFunction)store_close, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef store_getset[] = {
    {"closed", (getter)store_closed, NULL, "True once closed", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject StoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "flextier._flextier.Store",
    .tp_basicsize = sizeof(StoreObject),
    .tp_dealloc = (destructor)store_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_methods = store_methods,
    .tp_getset = store_getset,
    .tp_init = (initproc)store_init,
    .tp_new = PyType_GenericNew,
    .tp_doc = "Low-level tensor store (see flextier.Store).",
};

/* ----------------------------------------------------------- session */

/* A model session (include/flextier/session.h): the C object is used by
 * one thread at a time; `busy` refuses a second caller (BusyError). The
 * GIL is released while generating; the on_text callback takes it back
 * for each piece of text. */
typedef struct {
    PyObject_HEAD
    ft_session *s;
    int busy;
    ft_chat_template *tmpl;   /* the model's chat template (NULL: none or broken) */
    ft_status tmpl_status;
    char tmpl_error[512];
    PyObject *lora_seq;       /* the lora list while the session opens */
} SessionObject;

static int session_init(SessionObject *so, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"model_dir", "device", "weights", "kv_dtype", "threads", "policy", "device_mem",
                             "token_file", "max_batch", "max_seq", "strict", "decode_threads", "memory",
                             "allow_lossy", "recalibrate", "lora", NULL};
    const char *dir, *device = "cpu", *weights = "auto", *kv = NULL, *policy = NULL, *token = NULL;
    PyObject *lora = Py_None;
    unsigned long threads = 0, maxb = 0, maxs = 0, dthreads = 0;
    unsigned long long devmem = 0, memory = 0;
    int strict = 0, lossy = 0, recal = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "s|sszkzKzkkpkKppO:Session", kwlist, &dir, &device, &weights, &kv,
                                     &threads, &policy, &devmem, &token, &maxb, &maxs, &strict, &dthreads,
                                     &memory, &lossy, &recal, &lora))
        return -1;
    if (so->s) {
        PyErr_SetString(PyExc_RuntimeError, "Session already open");
        return -1;
    }
    if (ulong_arg(threads, 0, MAX_THREADS, "threads") || ulong_arg(dthreads, 0, MAX_THREADS, "decode_threads") ||
        ulong_arg(maxb, 0, 65536, "max_batch") || ulong_arg(maxs, 0, 1u << 24, "max_seq"))
        return -1;
    ft_session_params p;
    ft_session_default_params(&p);
    if (!strcmp(device, "cpu")) p.device = FT_DEVICE_CPU;
    else if (!strcmp(device, "cuda")) p.device = FT_DEVICE_CUDA;
    else { raise_fmt(FT_ERR_INVALID_ARG, "device must be 'cpu' or 'cuda', not '%s'", device); return -1; }
    static const char *const wn[] = {"f32", "bf16", "f16", "q8", "q4"};
    if (!strcmp(weights, "auto")) p.weights = FT_WEIGHTS_AS_STORED;
    else {
        p.weights = -2;
        for (int f = 0; f < 5; f++) if (!strcmp(weights, wn[f])) p.weights = f;
        if (p.weights == -2) {
            raise_fmt(FT_ERR_INVALID_ARG, "weights must be auto, f32, bf16, f16, q8 or q4, not '%s'", weights);
            return -1;
        }
    }
    if (kv) {
        if (!strcmp(kv, "f32")) p.kv_dtype = FT_F32;
        else if (!strcmp(kv, "bf16")) p.kv_dtype = FT_BF16;
        else if (!strcmp(kv, "f16")) p.kv_dtype = FT_F16;
        else { raise_fmt(FT_ERR_INVALID_ARG, "kv_dtype must be f32, bf16 or f16, not '%s'", kv); return -1; }
    }
    p.threads = (unsigned)threads;
    p.decode_threads = (unsigned)dthreads;
    p.max_batch = (uint32_t)maxb;
    p.max_seq = (uint32_t)maxs;
    p.strict = strict;
    p.device_mem = devmem;
    p.memory = memory;
    p.allow_lossy = lossy;
    p.recalibrate = recal;
    p.token_file = token;
    if (policy) {
        /* "auto", or a policy spec with its remotes/disk items */
        const char *spec = policy;
        if (!strncmp(policy, "auto", 4) && (policy[4] == 0 || policy[4] == ' ' || policy[4] == ';')) {
            p.offload = FT_OFFLOAD_AUTO;
            spec = policy + 4;
        } else {
            p.offload = FT_OFFLOAD_POLICY;
        }
        if (*spec && ft_policy_parse(spec, &p.policy)) { raise_last(FT_ERR_INVALID_ARG); return -1; }
    }
    /* lora: a list of (directory, scale) pairs (flextier.Session normalizes) */
    ft_session_lora ls[16];
    if (lora != Py_None) {
        PyObject *seq = PySequence_Fast(lora, "lora must be a list of (directory, scale) pairs");
        if (!seq) return -1;
        Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
        if (n > 16) {
            Py_DECREF(seq);
            raise_fmt(FT_ERR_INVALID_ARG, "at most 16 adapters, not %zd", n);
            return -1;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *it = PySequence_Fast_GET_ITEM(seq, i);
            const char *d = NULL;
            double sc = 1.0;
            if (!PyTuple_Check(it) || !PyArg_ParseTuple(it, "sd", &d, &sc)) {
                Py_DECREF(seq);
                if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "lora: (directory, scale) pairs");
                return -1;
            }
            ls[i].dir = d;     /* valid while seq (and lora) live: through the open below */
            ls[i].scale = (float)sc;
        }
        p.lora = ls;
        p.n_lora = (size_t)n;
        so->lora_seq = seq;   /* released after the open */
    }
    ft_status st;
    ft_session *s = NULL;
    Py_BEGIN_ALLOW_THREADS
    ft_clear_error();
    st = ft_session_open(dir, &p, &s);
    Py_END_ALLOW_THREADS
    Py_CLEAR(so->lora_seq);
    if (st) { raise_last(st); return -1; }
    so->s = s;
    /* the chat template: its absence or a parse error is reported by chat() */
    Py_BEGIN_ALLOW_THREADS
    so->tmpl_status = ft_chat_template_load_dir(dir, &so->tmpl);
    if (so->tmpl_status) snprintf(so->tmpl_error, sizeof so->tmpl_error, "%s", ft_last_error());
    ft_clear_error();
    Py_END_ALLOW_THREADS
    return 0;
}

static void session_dealloc(SessionObject *so)
{
    ft_chat_template_free(so->tmpl);
    so->tmpl = NULL;
    if (so->s) {
        ft_session *s = so->s;
        so->s = NULL;
        Py_BEGIN_ALLOW_THREADS
        ft_session_close(s);
        Py_END_ALLOW_THREADS
    }
    Py_TYPE(so)->tp_free((PyObject *)so);
}

static int session_usable(SessionObject *so)
{
    if (!so->s) { raise_fmt(FT_ERR_INVALID_ARG, "the session is closed"); return 0; }
    if (so->busy) { raise_fmt(FT_ERR_BUSY, "the session is in use by another call"); return 0; }
    return 1;
}

static PyObject *session_close(SessionObject *so, PyObject *unused)
{
    (void)unused;
    if (!so->s) Py_RETURN_NONE;
    if (so->busy) return raise_fmt(FT_ERR_BUSY, "the session is in use by another call");
    ft_session *s = so->s;
    so->s = NULL;
    Py_BEGIN_ALLOW_THREADS
    ft_session_close(s);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

typedef struct {
    PyObject *cb;        /* callable(seq, text) -> bool (stop) or None */
    int failed;          /* the callback raised, or Ctrl-C: the exception is kept */
    PyObject *exc_type, *exc_val, *exc_tb;
    PyObject *cancel;    /* an object whose is_set() true stops every sequence, or None */
} text_cb_state;

/* Every new token: a pending signal (Ctrl-C in the main thread raises
 * KeyboardInterrupt there) or a set cancel event stops every sequence at
 * once, so the session is free again for the next call. */
static int session_token_cb(void *user, size_t seq, int32_t token)
{
    text_cb_state *t = user;
    (void)seq; (void)token;
    if (t->failed) return 1;
    PyGILState_STATE g = PyGILState_Ensure();
    if (PyErr_CheckSignals() < 0) {
        t->failed = 1;
        PyErr_Fetch(&t->exc_type, &t->exc_val, &t->exc_tb);
    } else if (t->cancel && t->cancel != Py_None) {
        PyObject *r = PyObject_CallMethod(t->cancel, "is_set", NULL);
        if (!r) {
            t->failed = 1;
            PyErr_Fetch(&t->exc_type, &t->exc_val, &t->exc_tb);
        } else {
            if (PyObject_IsTrue(r) > 0) t->failed = 2;   /* stopped on request: no exception */
            Py_DECREF(r);
        }
    }
    PyGILState_Release(g);
    return t->failed != 0;
}

static int session_text_cb(void *user, size_t seq, const char *text, size_t len)
{
    text_cb_state *t = user;
    if (t->failed) return 1;
    PyGILState_STATE g = PyGILState_Ensure();
    int stop = 0;
    PyObject *str = PyUnicode_DecodeUTF8(text, (Py_ssize_t)len, "replace");
    PyObject *r = str ? PyObject_CallFunction(t->cb, "nO", (Py_ssize_t)seq, str) : NULL;
    Py_XDECREF(str);
    if (!r) {
        t->failed = 1;
        PyErr_Fetch(&t->exc_type, &t->exc_val, &t->exc_tb);
        stop = 1;
    } else {
        stop = PyObject_IsTrue(r) > 0;
        Py_DECREF(r);
    }
    PyGILState_Release(g);
    return stop;
}

/* Sampling keyword arguments shared by generate and generate_ids. */
typedef struct {
    Py_ssize_t max_new;
    double temperature, top_p, rep;
    long top_k;
    unsigned long long seed;
    int ignore_eos, have_seed;
    PyObject *seed_obj;
} gen_kw;

static int gen_params(SessionObject *so, const gen_kw *k, ft_gen_params *g)
{
    memset(g, 0, sizeof *g);
    if (k->max_new < 0 || k->max_new > (1 << 20)) {
        raise_fmt(FT_ERR_INVALID_ARG, "max_new_tokens must be in 0..%d", 1 << 20);
        return -1;
    }
    g->max_new_tokens = (size_t)k->max_new;
    g->ignore_eos = k->ignore_eos;
    ft_session_default_sampling(so->s, &g->sampling);
    if (k->temperature >= 0) g->sampling.temperature = (float)k->temperature;
    if (k->top_k >= 0) g->sampling.top_k = (int)k->top_k;
    if (k->top_p >= 0) g->sampling.top_p = (float)k->top_p;
    if (k->rep >= 0) g->sampling.repetition_penalty = (float)k->rep;
    if (k->top_p > 1) { raise_fmt(FT_ERR_INVALID_ARG, "top_p must be in 0..1"); return -1; }
    g->sampling.seed = k->have_seed ? k->seed : (uint64_t)(ft_now() * 1e6);
    return 0;
}

static PyObject *stats_dict(const ft_gen_stats *gs)
{
    return Py_BuildValue("{s:n,s:n,s:d,s:d,s:d,s:d}", "prefill_tokens", (Py_ssize_t)gs->prefill_tokens,
                         "decode_tokens", (Py_ssize_t)gs->decode_tokens, "prefill_s", gs->prefill_s, "decode_s",
                         gs->decode_s, "prefill_cpu_s", gs->prefill_cpu_s, "decode_cpu_s", gs->decode_cpu_s);
}

/* generate(prompts: list[str], max_new_tokens=64, temperature=-1, top_k=-1,
 * top_p=-1, repetition_penalty=-1, seed=None, stop=None, ignore_eos=False,
 * on_text=None) -> (list[str], stats dict). Negative sampling values: the
 * model's generation_config.json. */
static PyObject *session_generate(SessionObject *so, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"prompts", "max_new_tokens", "temperature", "top_k", "top_p", "repetition_penalty",
                             "seed", "stop", "ignore_eos", "on_text", "cancel", "no_special", NULL};
    PyObject *prompts, *on_text = Py_None, *seed = Py_None, *stop = Py_None, *cancel = Py_None;
    int no_special = 0;
    gen_kw k = {64, -1, -1, -1, -1, 0, 0, 0, NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|ndlddOOpOOp:generate", kwlist, &prompts, &k.max_new,
                                     &k.temperature, &k.top_k, &k.top_p, &k.rep, &seed, &stop, &k.ignore_eos,
                                     &on_text, &cancel, &no_special))
        return NULL;
    if (!session_usable(so)) return NULL;
    /* stop: None, a str, or a list of str */
    const char *stops[64];
    size_t n_stops = 0;
    PyObject *stop_seq = NULL;
    if (PyUnicode_Check(stop)) {
        if (!(stops[0] = PyUnicode_AsUTF8(stop))) return NULL;
        n_stops = 1;
    } else if (stop != Py_None) {
        if (!(stop_seq = PySequence_Fast(stop, "stop must be a str or a list of str"))) return NULL;
        Py_ssize_t ns = PySequence_Fast_GET_SIZE(stop_seq);
        if (ns > 64) {
            Py_DECREF(stop_seq);
            return raise_fmt(FT_ERR_INVALID_ARG, "stop: at most 64 strings, not %zd", ns);
        }
        for (Py_ssize_t i = 0; i < ns; i++) {
            PyObject *o = PySequence_Fast_GET_ITEM(stop_seq, i);
            if (!PyUnicode_Check(o)) {
                Py_DECREF(stop_seq);
                PyErr_SetString(PyExc_TypeError, "stop must be a str or a list of str");
                return NULL;
            }
            if (!(stops[n_stops++] = PyUnicode_AsUTF8(o))) {
                Py_DECREF(stop_seq);
                return NULL;
            }
        }
    }
    if (seed != Py_None) {
        k.seed = PyLong_AsUnsignedLongLongMask(seed);
        if (PyErr_Occurred()) return NULL;
        k.have_seed = 1;
    }
    if (on_text != Py_None && !PyCallable_Check(on_text)) {
        Py_XDECREF(stop_seq);
        PyErr_SetString(PyExc_TypeError, "on_text must be callable");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(prompts, "prompts must be a list of str");
    if (!seq) {
        Py_XDECREF(stop_seq);
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n < 1 || n > 65536) {
        Py_DECREF(seq);
        Py_XDECREF(stop_seq);
        return raise_fmt(FT_ERR_INVALID_ARG, "generate: 1..65536 prompts, not %zd", n);
    }
    const char **cp = calloc((size_t)n, sizeof *cp);
    char **out = calloc((size_t)n, sizeof *out);
    PyObject *res = NULL;
    if (!cp || !out) { PyErr_NoMemory(); goto done; }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *o = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyUnicode_Check(o)) { PyErr_SetString(PyExc_TypeError, "prompts must be str"); goto done; }
        if (!(cp[i] = PyUnicode_AsUTF8(o))) goto done;
    }
    ft_text_params tp;
    memset(&tp, 0, sizeof tp);
    if (gen_params(so, &k, &tp.gen)) goto done;
    tp.stops = stops;
    tp.n_stops = n_stops;
    tp.no_special = no_special;
    text_cb_state cbs = {on_text, 0, NULL, NULL, NULL, cancel};
    if (on_text != Py_None) tp.on_text = session_text_cb;
    tp.user = &cbs;
    tp.gen.on_token = session_token_cb;
    tp.gen.user = &cbs;
    ft_gen_stats gs;
    ft_status st;
    so->busy = 1;
    Py_BEGIN_ALLOW_THREADS
    ft_clear_error();
    st = ft_session_generate_text(so->s, (size_t)n, cp, &tp, out, &gs);
    Py_END_ALLOW_THREADS
    so->busy = 0;
    if (cbs.failed == 1) {
        PyErr_Restore(cbs.exc_type, cbs.exc_val, cbs.exc_tb);
        goto done;
    }
    if (st) { raise_last(st); goto done; }
    PyObject *texts = PyList_New(n);
    if (!texts) goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *t = PyUnicode_DecodeUTF8(out[i], (Py_ssize_t)strlen(out[i]), "replace");
        if (!t) { Py_DECREF(texts); goto done; }
        PyList_SET_ITEM(texts, i, t);
    }
    PyObject *stats = stats_dict(&gs);
    if (!stats) { Py_DECREF(texts); goto done; }
    res = Py_BuildValue("(NN)", texts, stats);
done:
    for (Py_ssize_t i = 0; out && i < n; i++) free(out[i]);
    free(out);
    free(cp);
    Py_DECREF(seq);
    Py_XDECREF(stop_seq);
    return res;
}

/* generate_ids(prompts: list[list[int]], ...same keywords but stop/on_text)
 * -> (list[list[int]], stats dict) */
static PyObject *session_generate_ids(SessionObject *so, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"prompts", "max_new_tokens", "temperature", "top_k", "top_p", "repetition_penalty",
                             "seed", "ignore_eos", NULL};
    PyObject *prompts, *seed = Py_None;
    gen_kw k = {64, -1, -1, -1, -1, 0, 0, 0, NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|ndlddOp:generate_ids", kwlist, &prompts, &k.max_new,
                                     &k.temperature, &k.top_k, &k.top_p, &k.rep, &seed, &k.ignore_eos))
        return NULL;
    if (!session_usable(so)) return NULL;
    if (seed != Py_None) {
        k.seed = PyLong_AsUnsignedLongLongMask(seed);
        if (PyErr_Occurred()) return NULL;
        k.have_seed = 1;
    }
    PyObject *seq = PySequence_Fast(prompts, "prompts must be a list of lists of int");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    int32_t **ids = calloc(n > 0 ? (size_t)n : 1, sizeof *ids), **outs = calloc(n > 0 ? (size_t)n : 1, sizeof *outs);
    size_t *plen = calloc(n > 0 ? (size_t)n : 1, sizeof *plen), *nout = calloc(n > 0 ? (size_t)n : 1, sizeof *nout);
    PyObject *res = NULL;
    if (n < 1 || n > 65536) { raise_fmt(FT_ERR_INVALID_ARG, "generate_ids: 1..65536 prompts, not %zd", n); goto done; }
    if (!ids || !outs || !plen || !nout) { PyErr_NoMemory(); goto done; }
    ft_gen_params g;
    if (gen_params(so, &k, &g)) goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *pi = PySequence_Fast(PySequence_Fast_GET_ITEM(seq, i), "each prompt must be a list of int");
        if (!pi) goto done;
        Py_ssize_t m = PySequence_Fast_GET_SIZE(pi);
        ids[i] = malloc((size_t)(m > 0 ? m : 1) * sizeof(int32_t));
        outs[i] = malloc((g.max_new_tokens + 1) * sizeof(int32_t));
        if (!ids[i] || !outs[i]) { Py_DECREF(pi); PyErr_NoMemory(); goto done; }
        for (Py_ssize_t j = 0; j < m; j++) {
            long v = PyLong_AsLong(PySequence_Fast_GET_ITEM(pi, j));
            if (v == -1 && PyErr_Occurred()) { Py_DECREF(pi); goto done; }
            if (v < 0 || v > INT32_MAX) { Py_DECREF(pi); raise_fmt(FT_ERR_INVALID_ARG, "token id %ld", v); goto done; }
            ids[i][j] = (int32_t)v;
        }
        plen[i] = (size_t)m;
        Py_DECREF(pi);
        if (!m) { raise_fmt(FT_ERR_INVALID_ARG, "prompt %zd is empty", i); goto done; }
    }
    ft_gen_stats gs;
    ft_status st;
    so->busy = 1;
    Py_BEGIN_ALLOW_THREADS
    ft_clear_error();
    st = ft_session_generate(so->s, (size_t)n, (const int32_t *const *)ids, plen, &g, outs, nout, &gs);
    Py_END_ALLOW_THREADS
    so->busy = 0;
    if (st) { raise_last(st); goto done; }
    PyObject *lists = PyList_New(n);
    if (!lists) goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *l = PyList_New((Py_ssize_t)nout[i]);
        if (!l) { Py_DECREF(lists); goto done; }
        for (size_t j = 0; j < nout[i]; j++) PyList_SET_ITEM(l, (Py_ssize_t)j, PyLong_FromLong(outs[i][j]));
        PyList_SET_ITEM(lists, i, l);
    }
    PyObject *stats = stats_dict(&gs);
    if (!stats) { Py_DECREF(lists); goto done; }
    res = Py_BuildValue("(NN)", lists, stats);
done:
    for (Py_ssize_t i = 0; i < n; i++) {
        if (ids) free(ids[i]);
        if (outs) free(outs[i]);
    }
    free(ids); free(outs); free(plen); free(nout);
    Py_DECREF(seq);
    return res;
}

/* tokenize(text, add_special=True) -> list[int]: the model's tokenizer
 * (add_special: its special tokens, as Hugging Face's add_special_tokens). */
static PyObject *session_tokenize(SessionObject *so, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"text", "add_special", NULL};
    const char *text;
    Py_ssize_t len;
    int add = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "s#|p:tokenize", kwlist, &text, &len, &add)) return NULL;
    if (!so->s) return raise_fmt(FT_ERR_INVALID_ARG, "the session is closed");
    const ft_tokenizer *t = ft_session_tokenizer(so->s);
    if (!t) return raise_fmt(FT_ERR_NOT_FOUND, "the model has no tokenizer");
    int32_t *ids = NULL;
    size_t n = 0;
    ft_status st;
    Py_BEGIN_ALLOW_THREADS
    ft_clear_error();
    st = ft_tokenizer_encode(t, text, (size_t)len, add, &ids, &n);
    Py_END_ALLOW_THREADS
    if (st) return raise_last(st);
    PyObject *l = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; l && i < n; i++) {
        PyObject *v = PyLong_FromLong(ids[i]);
        if (!v) { Py_CLEAR(l); break; }
        PyList_SET_ITEM(l, (Py_ssize_t)i, v);
    }
    free(ids);
    return l;
}

/* detokenize(ids, skip_special=True) -> str (Hugging Face's decode). */
static PyObject *session_detokenize(SessionObject *so, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"ids", "skip_special", NULL};
    PyObject *ids;
    int skip = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|p:detokenize", kwlist, &ids, &skip)) return NULL;
    if (!so->s) return raise_fmt(FT_ERR_INVALID_ARG, "the session is closed");
    const ft_tokenizer *t = ft_session_tokenizer(so->s);
    if (!t) return raise_fmt(FT_ERR_NOT_FOUND, "the model has no tokenizer");
    PyObject *seq = PySequence_Fast(ids, "ids must be a list of int");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    int32_t *v = malloc((size_t)(n > 0 ? n : 1) * sizeof *v);
    if (!v) { Py_DECREF(seq); return PyErr_NoMemory(); }
    for (Py_ssize_t i = 0; i < n; i++) {
        long x = PyLong_AsLong(PySequence_Fast_GET_ITEM(seq, i));
        if (x == -1 && PyErr_Occurred()) { free(v); Py_DECREF(seq); return NULL; }
        if (x < 0 || x > INT32_MAX) { free(v); Py_DECREF(seq); return raise_fmt(FT_ERR_INVALID_ARG, "token id %ld", x); }
        v[i] = (int32_t)x;
    }
    Py_DECREF(seq);
    char *text = NULL;
    size_t len = 0;
    ft_status st;
    Py_BEGIN_ALLOW_THREADS
    ft_clear_error();
    st = ft_tokenizer_decode(t, v, (size_t)n, skip, &text, &len);
    Py_END_ALLOW_THREADS
    free(v);
    if (st) return raise_last(st);
    PyObject *r = PyUnicode_DecodeUTF8(text, (Py_ssize_t)len, "replace");
    free(text);
    return r;
}

/* apply_chat_template(messages_json, add_generation_prompt=True,
 * extra_json=None, template=None) -> str: the conversation rendered with
 * the model's chat template, or with `template` (Jinja source; the
 * model's BOS/EOS tokens bound). */
static PyObject *session_apply_chat_template(SessionObject *so, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"messages_json", "add_generation_prompt", "extra_json", "template", NULL};
    const char *msgs, *extra = NULL, *src = NULL;
    int addgen = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "s|pzz:apply_chat_template", kwlist, &msgs, &addgen, &extra, &src))
        return NULL;
    if (!so->s) return raise_fmt(FT_ERR_INVALID_ARG, "the session is closed");
    ft_chat_template *own = NULL;
    const ft_chat_template *t = so->tmpl;
    ft_status st = FT_OK;
    char *text = NULL;
    if (src) {
        const ft_model_config *cfg = ft_session_config(so->s);
        const ft_tokenizer *tok = ft_session_tokenizer(so->s);
        const char *bos = tok && cfg->bos_id >= 0 ? ft_tokenizer_token_str(tok, cfg->bos_id) : NULL;
        const char *eos = tok && cfg->n_eos ? ft_tokenizer_token_str(tok, cfg->eos_ids[0]) : NULL;
        Py_BEGIN_ALLOW_THREADS
        ft_clear_error();
        st = ft_chat_template_load_string(src, bos, eos, &own);
        Py_END_ALLOW_THREADS
        if (st) return raise_last(st);
        t = own;
    } else if (!t) {
        if (so->tmpl_status == FT_ERR_NOT_FOUND)
            return raise_fmt(FT_ERR_NOT_FOUND, "the model has no chat template (tokenizer_config.json chat_template "
                             "or chat_template.jinja): pass chat_template=JINJA_SOURCE");
        return raise_fmt(so->tmpl_status, "the model's chat template: %s", so->tmpl_error);
    }
    Py_BEGIN_ALLOW_THREADS
    ft_clear_error();
    st = ft_chat_template_apply(t, msgs, addgen, extra, &text);
    Py_END_ALLOW_THREADS
    ft_chat_template_free(own);
    if (st) return raise_last(st);
    PyObject *r = PyUnicode_DecodeUTF8(text, (Py_ssize_t)strlen(text), "replace");
    free(text);
    return r;
}

/* info() -> dict: the model, the formats and the policy in force. */
static PyObject *session_info(SessionObject *so, PyObject *unused)
{
    (void)unused;
    if (!so->s) return raise_fmt(FT_ERR_INVALID_ARG, "the session is closed");
    const ft_model_config *c = ft_session_config(so->s);
    double predicted = 0;
    char pol[256];
    ft_policy_format(ft_session_policy(so->s, &predicted), pol, sizeof pol);
    ft_session_stats ss;
    ft_session_get_stats(so->s, &ss);
    ft_session_memory mem;
    ft_session_get_memory(so->s, &mem);
    return Py_BuildValue("{s:s,s:i,s:i,s:i,s:i,s:s,s:K,s:s,s:d,s:O,s:K,s:K,s:s}", "model_type", c->model_type,
                         "hidden", c->hidden, "layers", c->n_layers, "vocab", c->vocab, "max_position_embeddings",
                         c->max_pos, "weights_format", ft_wfmt_name(ft_model_weights_format(ft_session_model(so->s))),
                         "weight_bytes", (unsigned long long)ss.weight_bytes, "policy", pol, "predicted_tok_s",
                         predicted, "has_tokenizer", ft_session_tokenizer(so->s) ? Py_True : Py_False,
                         "memory_budget", (unsigned long long)mem.budget, "memory_estimate",
                         (unsigned long long)mem.need, "memory_source", mem.source);
}

static PyMethodDef session_methods[] = {
    {"generate", (PyCFunction)(void (*)(void))session_generate, METH_VARARGS | METH_KEYWORDS, NULL},
    {"generate_ids", (PyCFunction)(void (*)(void))session_generate_ids, METH_VARARGS | METH_KEYWORDS, NULL},
    {"apply_chat_template", (PyCFunction)(void (*)(void))session_apply_chat_template, METH_VARARGS | METH_KEYWORDS,
     NULL},
    {"tokenize", (PyCFunction)(void (*)(void))session_tokenize, METH_VARARGS | METH_KEYWORDS, NULL},
    {"detokenize", (PyCFunction)(void (*)(void))session_detokenize, METH_VARARGS | METH_KEYWORDS, NULL},
    {"info", (PyCFunction)session_info, METH_NOARGS, NULL},
    {"close", (PyCFunction)session_close, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL}};

static PyTypeObject SessionType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "flextier._flextier.Session",
    .tp_basicsize = sizeof(SessionObject),
    .tp_dealloc = (destructor)session_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_methods = session_methods,
    .tp_init = (initproc)session_init,
    .tp_new = PyType_GenericNew,
    .tp_doc = "Low-level model session (see flextier.Session).",
};

/* ------------------------------------------------------------ trainer */

/* _flextier.Trainer: the train layer (include/flextier/train.h) over a
 * model loaded in memory: what flextier.finetune drives (the data file
 * reader, steps with a label mask, held-out loss, PEFT adapters). One
 * thread at a time; the GIL is released while computing. */
typedef struct {
    PyObject_HEAD
    ft_model *m;
    ft_tokenizer *tok;
    ft_trainer *t;
    char dir[4096];
    int busy, accum;
} TrainerObject;

static int trainer_init(TrainerObject *to, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"model_dir", "weights", "rank", "alpha", "targets", "lr", "weight_decay", "clip",
                             "warmup", "total_steps", "schedule", "grad_accum", "seed", "threads", "dropout", NULL};
    const char *dir, *weights = "auto", *targets = "all", *sched = "cosine";
    int rank = 8, warmup = 0, total = 1, accum = 1;
    double alpha = 16, lr = 1e-3, wd = 0.01, clip = 1.0, dropout = 0.0;
    unsigned long long seed = 0;
    unsigned long threads = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "s|sidsdddiisiKkd:Trainer", kwlist, &dir, &weights, &rank, &alpha,
                                     &targets, &lr, &wd, &clip, &warmup, &total, &sched, &accum, &seed, &threads,
                                     &dropout))
        return -1;
    if (to->t) {
        PyErr_SetString(PyExc_RuntimeError, "Trainer already created");
        return -1;
    }
    if (ulong_arg((Py_ssize_t)threads, 0, MAX_THREADS, "threads")) return -1;
    ft_train_params tp;
    ft_train_params_default(&tp);
    if (ft_lora_parse_targets(targets, &tp.targets)) { raise_last(FT_ERR_INVALID_ARG); return -1; }
    if (!strcmp(sched, "cosine")) tp.schedule = FT_SCHED_COSINE;
    else if (!strcmp(sched, "linear")) tp.schedule = FT_SCHED_LINEAR;
    else if (!strcmp(sched, "constant")) tp.schedule = FT_SCHED_CONSTANT;
    else { raise_fmt(FT_ERR_INVALID_ARG, "schedule must be cosine, linear or constant, not '%s'", sched); return -1; }
    tp.rank = rank;
    tp.alpha = (float)alpha;
    tp.lr = (float)lr;
    tp.weight_decay = (float)wd;
    tp.clip = (float)clip;
    tp.warmup = warmup;
    tp.total_steps = total;
    tp.grad_accum = accum;
    tp.seed = (uint64_t)seed;
    tp.threads = (unsigned)threads;
    tp.dropout = (float)dropout;
    ft_load_params lp;
    ft_load_params_default(&lp);
    static const char *const wn[] = {"f32", "bf16", "f16", "q8", "q4"};
    if (!strcmp(weights, "auto")) lp.weights = FT_WEIGHTS_AS_STORED;
    else {
        lp.weights = -2;
        for (int f = 0; f < 5; f++) if (!strcmp(weights, wn[f])) lp.weights = f;
        if (lp.weights == -2) {
            raise_fmt(FT_ERR_INVALID_ARG, "weights must be auto, f32, bf16, f16, q8 or q4, not '%s'", weights);
            return -1;
        }
    }
    if (strlen(dir) >= sizeof to->dir) { raise_fmt(FT_ERR_INVALID_ARG, "model_dir too long"); return -1; }
    snprintf(to->dir, sizeof to->dir, "%s", dir);
    ft_status st;
    Py_BEGIN_ALLOW_THREADS
    ft_clear_error();
    st = ft_model_load(dir, &lp, &to->m);
    if (!st) st = ft_tokenizer_load_dir(dir, &to->tok);
    if (!st) st = ft_trainer_create(to->m, &tp, &to->t);
    Py_END_ALLOW_THREADS
    if (st) { raise_last(st); return -1; }
    to->accum = accum;
    return 0;
}

static void trainer_dealloc(TrainerObject *to)
{
    ft_trainer_free(to->t);
    ft_tokenizer_free(to->tok);
    ft_model_free(to->m);
    to->t = NULL;
    to->tok = NULL;
    to->m = NULL;
    Py_TYPE(to)->tp_free((PyObject *)to);
}

static int trainer_usable(TrainerObject *to)
{
    if (!to->t) { raise_fmt(FT_ERR_INVALID_ARG, "the trainer is not created"); return 0; }
    if (to->busy) { raise_fmt(FT_ERR_BUSY, "the trainer is in use by another call"); return 0; }
    return 1;
}

/* tokens: a C-contiguous buffer of batch * seq int32 (x grad_accum for a
 * step); mask: None or as many uint8 */
static int get_ids(PyObject *o, Py_buffer *v, size_t n, const char *what, size_t esize)
{
    if (PyObject_GetBuffer(o, v, PyBUF_C_CONTIGUOUS) < 0) return -1;
    if ((size_t)v->len != n * esize) {
        raise_fmt(FT_ERR_INVALID_ARG, "%s: %zd bytes, expected %zu values of %zu bytes", what, v->len, n, esize);
        PyBuffer_Release(v);
        return -1;
    }
    return 0;
}

static PyObject *trainer_run(TrainerObject *to, PyObject *args, PyObject *kw, int step)
{
    static char *kwlist[] = {"tokens", "batch", "seq", "mask", NULL};
    PyObject *tobj, *mobj = Py_None;
    int batch, seq;
    if (!PyArg_ParseTupleAndKeywords(args, kw, step ? "Oii|O:step" : "Oii|O:eval", kwlist, &tobj, &batch, &seq,
                                     &mobj))
        return NULL;
    if (!trainer_usable(to)) return NULL;
    if (batch < 1 || seq < 2 || (int64_t)batch * seq > (1 << 24))
        return raise_fmt(FT_ERR_INVALID_ARG, "batch %d x seq %d", batch, seq);
    size_t n = (size_t)batch * (size_t)seq * (step ? (size_t)to->accum : 1);
    Py_buffer tv, mv;
    if (get_ids(tobj, &tv, n, "tokens", 4)) return NULL;
    if (mobj != Py_None && get_ids(mobj, &mv, n, "mask", 1)) {
        PyBuffer_Release(&tv);
        return NULL;
    }
    const uint8_t *mask = mobj != Py_None ? mv.buf : NULL;
    double a = 0, b = 0;
    int64_t cnt = 0;
    ft_status st;
    to->busy = 1;
    Py_BEGIN_ALLOW_THREADS
    ft_clear_error();
    if (step) st = ft_trainer_step_masked(to->t, tv.buf, mask, batch, seq, &a, &b);
    else st = ft_trainer_eval_masked(to->t, tv.buf, mask, batch, seq, &a, &cnt);
    Py_END_ALLOW_THREADS
    to->busy = 0;
    PyBuffer_Release(&tv);
    if (mobj != Py_None) PyBuffer_Release(&mv);
    if (st) return raise_last(st);
    return step ? Py_BuildValue("(dd)", a, b) : Py_BuildValue("(dL)", a, (long long)cnt);
}

/* step(tokens, batch, seq, mask=None) -> (loss, grad_norm) */
static PyObject *trainer_step(TrainerObject *to, PyObject *args, PyObject *kw) { return trainer_run(to, args, kw, 1); }
/* eval(tokens, batch, seq, mask=None) -> (loss_sum, n_tokens) */
static PyObject *trainer_eval(TrainerObject *to, PyObject *args, PyObject *kw) { return trainer_run(to, args, kw, 0); }

/* load_data(path, chat_template=None) -> (ids bytes (int32), mask bytes
 * (uint8) or None, labels): ft_train_data_load */
static PyObject *trainer_load_data(TrainerObject *to, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"path", "chat_template", NULL};
    const char *path, *tpl = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "s|z:load_data", kwlist, &path, &tpl)) return NULL;
    if (!trainer_usable(to)) return NULL;
    ft_train_data d;
    ft_status st;
    Py_BEGIN_ALLOW_THREADS
    ft_clear_error();
    st = ft_train_data_load(path, to->tok, ft_model_get_config(to->m), to->dir, tpl, &d);
    Py_END_ALLOW_THREADS
    if (st) return raise_last(st);
    PyObject *ids = PyBytes_FromStringAndSize((const char *)d.ids, (Py_ssize_t)(d.n * sizeof(int32_t)));
    PyObject *mask = d.chat ? PyBytes_FromStringAndSize((const char *)d.mask, (Py_ssize_t)d.n) : (Py_INCREF(Py_None), Py_None);
    size_t labels = d.labels;
    ft_train_data_free(&d);
    if (!ids || !mask) {
        Py_XDECREF(ids);
        Py_XDECREF(mask);
        return NULL;
    }
    return Py_BuildValue("(NNn)", ids, mask, (Py_ssize_t)labels);
}

static PyObject *trainer_path_call(TrainerObject *to, PyObject *args, int which)
{
    const char *path, *base = NULL;
    if (!PyArg_ParseTuple(args, which == 0 ? "s|z:save_adapter" : "s:load", &path, &base)) return NULL;
    if (!trainer_usable(to)) return NULL;
    ft_status st;
    Py_BEGIN_ALLOW_THREADS
    ft_clear_error();
    if (which == 0) st = ft_trainer_save_adapter(to->t, path, base ? base : to->dir);
    else if (which == 1) st = ft_trainer_load_adapter(to->t, path);
    else if (which == 2) st = ft_trainer_save_state(to->t, path);
    else st = ft_trainer_load_state(to->t, path);
    Py_END_ALLOW_THREADS
    if (st) return raise_last(st);
    Py_RETURN_NONE;
}

static PyObject *trainer_save_adapter(TrainerObject *to, PyObject *args) { return trainer_path_call(to, args, 0); }
static PyObject *trainer_load_adapter(TrainerObject *to, PyObject *args) { return trainer_path_call(to, args, 1); }
static PyObject *trainer_save_state(TrainerObject *to, PyObject *args) { return trainer_path_call(to, args, 2); }
static PyObject *trainer_load_state(TrainerObject *to, PyObject *args) { return trainer_path_call(to, args, 3); }

static PyObject *trainer_lr_at(TrainerObject *to, PyObject *args)
{
    int s;
    if (!PyArg_ParseTuple(args, "i:lr_at", &s)) return NULL;
    if (!to->t) return raise_fmt(FT_ERR_INVALID_ARG, "the trainer is not created");
    return PyFloat_FromDouble(ft_trainer_lr_at(to->t, s));
}

static PyObject *trainer_info(TrainerObject *to, PyObject *unused)
{
    (void)unused;
    if (!to->t) return raise_fmt(FT_ERR_INVALID_ARG, "the trainer is not created");
    const ft_model_config *c = ft_model_get_config(to->m);
    return Py_BuildValue("{s:s,s:s,s:i,s:i,s:i,s:n,s:i}", "model_type", c->model_type, "weights",
                         ft_wfmt_name(ft_model_weights_format(to->m)), "vocab", c->vocab, "max_pos", c->max_pos,
                         "steps", ft_trainer_steps(to->t), "params", (Py_ssize_t)ft_trainer_param_count(to->t),
                         "eos", c->n_eos > 0 ? (int)c->eos_ids[0] : -1);
}

static PyMethodDef trainer_methods[] = {
    {"step", (PyCFunction)(void (*)(void))trainer_step, METH_VARARGS | METH_KEYWORDS, NULL},
    {"eval", (PyCFunction)(void (*)(void))trainer_eval, METH_VARARGS | METH_KEYWORDS, NULL},
    {"load_data", (PyCFunction)(void (*)(void))trainer_load_data, METH_VARARGS | METH_KEYWORDS, NULL},
    {"save_adapter", (PyCFunction)trainer_save_adapter, METH_VARARGS, NULL},
    {"load_adapter", (PyCFunction)trainer_load_adapter, METH_VARARGS, NULL},
    {"save_state", (PyCFunction)trainer_save_state, METH_VARARGS, NULL},
    {"load_state", (PyCFunction)trainer_load_state, METH_VARARGS, NULL},
    {"lr_at", (PyCFunction)trainer_lr_at, METH_VARARGS, NULL},
    {"info", (PyCFunction)trainer_info, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL}};

static PyTypeObject TrainerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "flextier._flextier.Trainer",
    .tp_basicsize = sizeof(TrainerObject),
    .tp_dealloc = (destructor)trainer_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_methods = trainer_methods,
    .tp_init = (initproc)trainer_init,
    .tp_new = PyType_GenericNew,
    .tp_doc = "Low-level LoRA trainer (see flextier.finetune).",
};

/* ------------------------------------------------------- memory node */

static volatile int g_node_stop;

static void node_ready(void *arg, const char *bound)
{
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *r = PyObject_CallFunction((PyObject *)arg, "s", bound);
    if (!r) PyErr_WriteUnraisable((PyObject *)arg);
    Py_XDECREF(r);
    PyGILState_Release(g);
}

/* node_run(listen, capacity, spill_dir=None, spill_capacity=0,
 * token_file=None, max_connections=0, on_ready=None, insecure=False,
 * trusted_network=False, overcommit=False): run the memory node on this
 * thread (GIL released) until node_stop(). One per process. */
static PyObject *py_node_run(PyObject *self, PyObject *args, PyObject *kw)
{
    (void)self;
    static char *kwlist[] = {"listen", "capacity", "spill_dir", "spill_capacity", "token_file",
                             "max_connections", "on_ready", "insecure", "trusted_network",
                             "overcommit", NULL};
    const char *listen, *spill = NULL, *token = NULL;
    unsigned long long cap, spill_cap = 0;
    unsigned int maxc = 0;
    PyObject *ready = Py_None;
    int insecure = 0, trusted = 0, overcommit = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "sK|zKzIOppp:node_run", kwlist, &listen, &cap,
                                     &spill, &spill_cap, &token, &maxc, &ready, &insecure,
                                     &trusted, &overcommit))
        return NULL;
    ft_node_params p;
    ft_node_default_params(&p);
    p.listen = listen;
    p.capacity = cap;
    p.spill_dir = spill;
    p.spill_capacity = spill_cap;
    p.token_file = token;
    if (maxc) p.max_connections = maxc;
    p.insecure = insecure;
    p.trusted_network = trusted;
    p.overcommit = overcommit;
    g_node_stop = 0;
    p.stop = &g_node_stop;
    if (ready != Py_None) {
        p.on_ready = node_ready;
        p.arg = ready;
    }
    ft_status st;
    Py_BEGIN_ALLOW_THREADS
    ft_clear_error();
    st = ft_node_run(&p);
    Py_END_ALLOW_THREADS
    return st ? raise_last(st) : new_none();
}

static PyObject *py_node_stop(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    g_node_stop = 1;
    Py_RETURN_NONE;
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
    {"node_run", (PyCFunction)(void (*)(void))py_node_run, METH_VARARGS | METH_KEYWORDS,
     "node_run(listen, capacity, spill_dir=None, spill_capacity=0, token_file=None, "
     "max_connections=0, on_ready=None, insecure=False, trusted_network=False, "
     "overcommit=False): run a memory node until node_stop()."},
    {"node_stop", py_node_stop, METH_NOARGS, "node_stop(): ask node_run to return."},
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
    if (PyType_Ready(&OwnedBufferType) < 0 || PyType_Ready(&RequestType) < 0 ||
        PyType_Ready(&StoreType) < 0 || PyType_Ready(&SessionType) < 0 || PyType_Ready(&TrainerType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&moddef);
    if (!m) return NULL;
    Py_INCREF(&StoreType);
    if (PyModule_AddObject(m, "Store", (PyObject *)&StoreType) < 0) {
        Py_DECREF(&StoreType);
        goto fail;
    }
    Py_INCREF(&RequestType);
    if (PyModule_AddObject(m, "Request", (PyObject *)&RequestType) < 0) {
        Py_DECREF(&RequestType);
        goto fail;
    }
    Py_INCREF(&SessionType);
    if (PyModule_AddObject(m, "Session", (PyObject *)&SessionType) < 0) {
        Py_DECREF(&SessionType);
        goto fail;
    }
    Py_INCREF(&TrainerType);
    if (PyModule_AddObject(m, "Trainer", (PyObject *)&TrainerType) < 0) {
        Py_DECREF(&TrainerType);
        goto fail;
    }
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
        {"MAX_DIMS", FT_MAX_DIMS}, {"KEY_MAX", FT_KEY_MAX},
    };
    for (size_t i = 0; i < sizeof consts / sizeof consts[0]; i++)
        if (PyModule_AddIntConstant(m, consts[i].name, consts[i].v)) goto fail;
    if (PyModule_AddStringConstant(m, "LIB_VERSION", FT_VERSION_STRING)) goto fail;
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}
