/* dtypes, tensor descriptors, shapes. */
#include "flextier/core.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const struct { const char *name; unsigned bits; } dtypes[FT_DTYPE_COUNT] = {
    [FT_F32] = {"f32", 32}, [FT_F16] = {"f16", 16}, [FT_BF16] = {"bf16", 16},
    [FT_I8] = {"i8", 8},    [FT_U8] = {"u8", 8},    [FT_I32] = {"i32", 32},
    [FT_Q8] = {"q8", 8},    [FT_Q4] = {"q4", 4},
};

const char *ft_dtype_name(ft_dtype dt)
{
    return (unsigned)dt < FT_DTYPE_COUNT ? dtypes[dt].name : "?";
}

unsigned ft_dtype_bits(ft_dtype dt)
{
    return (unsigned)dt < FT_DTYPE_COUNT ? dtypes[dt].bits : 0;
}

int ft_dtype_is_float(ft_dtype dt)
{
    return dt == FT_F32 || dt == FT_F16 || dt == FT_BF16;
}

ft_status ft_dtype_parse(const char *s, ft_dtype *out)
{
    static const struct { const char *alias; ft_dtype dt; } aliases[] = {
        {"float32", FT_F32}, {"float", FT_F32}, {"F32", FT_F32},
        {"float16", FT_F16}, {"half", FT_F16}, {"F16", FT_F16},
        {"bfloat16", FT_BF16}, {"BF16", FT_BF16},
        {"int8", FT_I8}, {"uint8", FT_U8}, {"int32", FT_I32},
    };
    if (!s || !out) return FT_ERR_INVALID_ARG;
    for (int i = 0; i < FT_DTYPE_COUNT; i++)
        if (!strcasecmp(s, dtypes[i].name)) { *out = (ft_dtype)i; return FT_OK; }
    for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++)
        if (!strcasecmp(s, aliases[i].alias)) { *out = aliases[i].dt; return FT_OK; }
    return ft_set_error(FT_ERR_INVALID_ARG,
                        "unknown dtype '%s' (f32, f16, bf16, i8, u8, i32, q8, q4)", s);
}

uint64_t ft_dtype_nbytes(ft_dtype dt, uint64_t n)
{
    unsigned b = ft_dtype_bits(dt);
    if (b == 4) return n / 2 + (n & 1);
    return n * (b / 8);
}

ft_status ft_shape_numel(uint32_t ndim, const int64_t *shape, uint64_t *out)
{
    if (ndim > FT_MAX_DIMS || (ndim && !shape))
        return ft_set_error(FT_ERR_INVALID_ARG, "ndim %u exceeds %d", ndim, FT_MAX_DIMS);
    uint64_t n = 1;
    for (uint32_t i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return ft_set_error(FT_ERR_INVALID_ARG, "negative dimension %lld",
                                (long long)shape[i]);
        uint64_t d = (uint64_t)shape[i];
        /* Keep byte counts of 4-byte elements below 2^62. */
        if (d && n > (UINT64_C(1) << 60) / d)
            return ft_set_error(FT_ERR_INVALID_ARG, "tensor too large");
        n *= d;
    }
    *out = n;
    return FT_OK;
}

ft_status ft_tensor_init(ft_tensor *t, ft_dtype dt, uint32_t ndim,
                         const int64_t *shape, void *data)
{
    uint64_t n;
    if (!t || ft_dtype_bits(dt) == 0)
        return ft_set_error(FT_ERR_INVALID_ARG, "invalid tensor descriptor");
    ft_status st = ft_shape_numel(ndim, shape, &n);
    if (st) return st;
    memset(t, 0, sizeof *t);
    t->dtype = dt;
    t->ndim = ndim;
    if (ndim) memcpy(t->shape, shape, ndim * sizeof *shape);
    t->data = data;
    return FT_OK;
}

ft_status ft_tensor_numel(const ft_tensor *t, uint64_t *out)
{
    if (!t || !out) return FT_ERR_INVALID_ARG;
    return ft_shape_numel(t->ndim, t->shape, out);
}

ft_status ft_tensor_nbytes(const ft_tensor *t, uint64_t *out)
{
    uint64_t n;
    if (!t || !out || ft_dtype_bits(t->dtype) == 0) return FT_ERR_INVALID_ARG;
    ft_status st = ft_tensor_numel(t, &n);
    if (st) return st;
    *out = ft_dtype_nbytes(t->dtype, n);
    return FT_OK;
}

ft_status ft_shape_parse(const char *s, uint32_t *ndim, int64_t *shape)
{
    if (!s || !ndim || !shape) return FT_ERR_INVALID_ARG;
    uint32_t n = 0;
    if (*s == '\0' || !strcmp(s, "scalar")) { *ndim = 0; return FT_OK; }
    const char *p = s;
    for (;;) {
        if (n == FT_MAX_DIMS)
            return ft_set_error(FT_ERR_INVALID_ARG, "shape '%s' has more than %d dims",
                                s, FT_MAX_DIMS);
        if (*p < '0' || *p > '9')
            return ft_set_error(FT_ERR_INVALID_ARG, "bad shape '%s'", s);
        char *end;
        errno = 0;
        long long v = strtoll(p, &end, 10);
        if (errno || v < 0)
            return ft_set_error(FT_ERR_INVALID_ARG, "bad dimension in shape '%s'", s);
        shape[n++] = v;
        if (*end == '\0') break;
        if (*end != ',' && *end != 'x')
            return ft_set_error(FT_ERR_INVALID_ARG, "bad shape '%s'", s);
        p = end + 1;
    }
    uint64_t numel;
    ft_status st = ft_shape_numel(n, shape, &numel);
    if (st) return st;
    *ndim = n;
    return FT_OK;
}

void ft_shape_format(uint32_t ndim, const int64_t *shape, char *buf, size_t n)
{
    size_t off = 0;
    if (!n) return;
    buf[0] = '\0';
    off += (size_t)snprintf(buf, n, "[");
    for (uint32_t i = 0; i < ndim && off < n; i++)
        off += (size_t)snprintf(buf + off, n - off, i ? ", %lld" : "%lld",
                                (long long)shape[i]);
    if (off < n) snprintf(buf + off, n - off, "]");
}
