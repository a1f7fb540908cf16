/* The token embeddings and the LM head read on demand from the
 * checkpoint file (ft_load_params.stream_globals): pread of whole rows,
 * converted to the compute format as a resident load converts them. With
 * stream_direct_io past the page cache (O_DIRECT: the checkpoint's tensor
 * offsets are not block-aligned, so the blocks covering the rows are read
 * and the rows moved to the buffer's start); else buffered, the pages
 * dropped behind the reads when asked (a memory cgroup charges the page
 * cache to the reader). */
#define _GNU_SOURCE
#include "engine_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

static ft_dtype plain(ft_wfmt f) { return f == FT_WF_BF16 ? FT_BF16 : f == FT_WF_F16 ? FT_F16 : FT_F32; }

int ft_gstream_chunk_rows(const ft_gstream *g)
{
    if (g->chunk_rows > 0) {
        int r = (g->chunk_rows + 23) / 24 * 24;
        return r >= g->rows ? g->rows : r;
    }
    size_t row = (size_t)ft_dtype_nbytes(plain(g->fmt), (size_t)g->cols);
    size_t src = (size_t)ft_dtype_nbytes(g->src, (size_t)g->cols);
    if (src > row) row = src;
    size_t r = (4u << 20) / (row ? row : 1);
    r = r / 96 * 96;
    if (r < 96) r = 96;
    return r >= (size_t)g->rows ? g->rows : (int)r;
}

static void drop(const ft_gstream *g, uint64_t off, uint64_t len)
{
    if (g->drop_cache) (void)posix_fadvise(g->fd, (off_t)off, (off_t)len, POSIX_FADV_DONTNEED);
}

static int direct(const ft_gstream *g)
{
    return g->dfd >= 0 && !__atomic_load_n(&g->direct_refused, __ATOMIC_RELAXED);
}

void ft_gstream_prefetch(const ft_gstream *g, int r0, int n)
{
    if (r0 < 0 || n <= 0 || r0 >= g->rows || direct(g)) return;
    if (r0 + n > g->rows) n = g->rows - r0;
    size_t rb = (size_t)ft_dtype_nbytes(g->src, (size_t)g->cols);
    (void)posix_fadvise(g->fd, (off_t)(g->off + (uint64_t)r0 * rb), (off_t)((uint64_t)n * rb), POSIX_FADV_WILLNEED);
}

/* Bytes [off, off + len) into buf (FT_GSTREAM_ALIGN-aligned, room for len
 * + FT_GSTREAM_SLACK) past the page cache: the aligned blocks that cover
 * them in one read, the bytes then moved to buf's start. FT_ERR_UNSUPPORTED
 * where the file system refuses (EINVAL), nothing set. */
static ft_status read_direct(const ft_gstream *g, uint64_t off, size_t len, uint8_t *buf)
{
    const uint64_t a0 = off & ~(uint64_t)(FT_GSTREAM_ALIGN - 1);
    const size_t lead = (size_t)(off - a0), need = lead + len;
    const size_t span = (need + FT_GSTREAM_ALIGN - 1) & ~(size_t)(FT_GSTREAM_ALIGN - 1);
    size_t got = 0;
    while (got < need) {
        ssize_t k = pread(g->dfd, buf + got, span - got, (off_t)(a0 + got));
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && errno == EINVAL) return FT_ERR_UNSUPPORTED;
        /* short only at the end of the file: past it, nothing more */
        if (k <= 0 || (got + (size_t)k < need && (((size_t)k) & (FT_GSTREAM_ALIGN - 1))))
            return ft_set_error(FT_ERR_IO, "streamed matrix: direct read of %zu bytes at %llu: %s", span - got,
                                (unsigned long long)(a0 + got), k < 0 ? strerror(errno) : "end of file");
        got += (size_t)k;
    }
    if (lead) memmove(buf, buf + lead, len);
    return FT_OK;
}

static ft_status read_buffered(const ft_gstream *g, uint64_t off, size_t len, uint8_t *buf)
{
    size_t got = 0;
    while (got < len) {
        ssize_t k = pread(g->fd, buf + got, len - got, (off_t)(off + got));
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0)
            return ft_set_error(FT_ERR_IO, "streamed matrix: read of %zu bytes at %llu: %s", len - got,
                                (unsigned long long)(off + got), k < 0 ? strerror(errno) : "end of file");
        got += (size_t)k;
    }
    drop(g, off, len);
    return FT_OK;
}

ft_status ft_gstream_read(ft_gstream *g, int r0, int n, void *dst, void *raw)
{
    if (r0 < 0 || n < 0 || r0 + n > g->rows)
        return ft_set_error(FT_ERR_INVALID_ARG, "streamed matrix: rows [%d, %d) of %d", r0, r0 + n, g->rows);
    size_t rb = (size_t)ft_dtype_nbytes(g->src, (size_t)g->cols);
    size_t len = (size_t)n * rb;
    if (!len) return FT_OK;
    uint64_t off = g->off + (uint64_t)r0 * rb;
    ft_dtype dd = plain(g->fmt);
    uint8_t *buf = dd == g->src ? dst : raw;
    ft_status st = FT_ERR_UNSUPPORTED;
    if (direct(g) && ((uintptr_t)buf & (FT_GSTREAM_ALIGN - 1)) == 0) {
        st = read_direct(g, off, len, buf);
        if (st == FT_ERR_UNSUPPORTED && !__atomic_exchange_n(&g->direct_refused, 1, __ATOMIC_RELAXED))
            FT_LOG(FT_LOG_DEBUG, "streamed matrix: the file system refuses O_DIRECT reads: read through the page "
                   "cache from now on");
    }
    if (st == FT_ERR_UNSUPPORTED) st = read_buffered(g, off, len, buf);
    if (st) return st;
    __atomic_fetch_add(&g->bytes_read, (uint64_t)len, __ATOMIC_RELAXED);
    if (buf != dst) return ft_convert(dst, dd, buf, g->src, (size_t)n * (size_t)g->cols);
    return FT_OK;
}
