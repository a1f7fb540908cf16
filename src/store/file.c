/* file:DIR backend - one frame file per tensor ("<escaped key>.ftf").
 * Writes go to a hidden temp file that is fsynced and renamed over the
 * old one, so readers see the old or the new frame. Reads validate the
 * frame header and size (and decoding verifies every chunk hash), so a
 * corrupt or truncated file is reported as FT_ERR_CORRUPT, never served. */
#define _GNU_SOURCE   /* O_DIRECT */
#include "store_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define FILE_SUFFIX ".ftf"
#define NAME_CAP 240
/* O_DIRECT: buffer, offset and length alignment (the logical block size
 * of any common device divides it); the largest single read */
#define DIO_ALIGN ((size_t)FT_BUF_ALIGN)
#define DIO_MAX ((size_t)1 << 30)

typedef struct file_backend {
    ft_store_backend base;
    char            *dir;
    int              dirfd;
    atomic_ulong     seq;
    int              drop_cache;   /* ft_store_params.drop_cache */
    int              direct;       /* reads with O_DIRECT (ft_store_params.direct_io) */
    atomic_int       direct_refused;   /* this file system refused it: buffered from now on */
} file_backend;

/* With drop_cache: the file's pages leave the page cache once read or
 * written (and synced), so the disk tier charges no memory to this
 * process's cgroup beyond the frame being moved. */
static void drop_file_cache(const file_backend *f, int fd)
{
    if (f->drop_cache) (void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
}

static ft_status name_of(const char *key, char *name)
{
    ft_status st = ft_key_escape(key, name, NAME_CAP - sizeof FILE_SUFFIX);
    if (st != FT_OK) return st;
    strcat(name, FILE_SUFFIX);
    return FT_OK;
}

static ft_status write_all(int fd, const void *p, size_t n)
{
    const uint8_t *b = p;
    while (n) {
        ssize_t w = write(fd, b, n > (1u << 30) ? (1u << 30) : n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return FT_ERR_IO;
        }
        b += w;
        n -= (size_t)w;
    }
    return FT_OK;
}

static ft_status file_put(ft_store_backend *b, const char *key, const void *frame, size_t size)
{
    file_backend *f = (file_backend *)b;
    char name[NAME_CAP], tmp[NAME_CAP + 64];
    ft_status st = name_of(key, name);
    if (st != FT_OK) return st;
    snprintf(tmp, sizeof tmp, ".tmp-%ld-%lu-%s", (long)getpid(),
             (unsigned long)atomic_fetch_add(&f->seq, 1), name);
    int fd = openat(f->dirfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) return ft_set_error(FT_ERR_IO, "%s/%s: %s", f->dir, tmp, strerror(errno));
    if (write_all(fd, frame, size) != FT_OK || fdatasync(fd) != 0) {
        int e = errno;
        close(fd);
        unlinkat(f->dirfd, tmp, 0);
        return ft_set_error(FT_ERR_IO, "%s/%s: %s", f->dir, tmp, strerror(e));
    }
    drop_file_cache(f, fd);
    if (close(fd) != 0 || renameat(f->dirfd, tmp, f->dirfd, name) != 0) {
        int e = errno;
        unlinkat(f->dirfd, tmp, 0);
        return ft_set_error(FT_ERR_IO, "%s/%s: %s", f->dir, name, strerror(e));
    }
    return FT_OK;
}

/* Read bytes [from, want) of fd into p + from (buffered: any alignment);
 * *n the end reached (want, or less at the end of the file). */
static ft_status pread_buffered(int fd, uint8_t *p, size_t from, size_t want, size_t *n)
{
    size_t k = from;
    while (k < want) {
        ssize_t r = pread(fd, p + k, want - k, (off_t)k);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return FT_ERR_IO;
        if (r == 0) break;
        k += (size_t)r;
    }
    *n = k;
    return FT_OK;
}

/* The same past the page cache: fd is O_DIRECT, p is DIO_ALIGN-aligned
 * with room for cap bytes. The whole blocks go straight into p; the last
 * partial block too when cap has room for the block, else through an
 * aligned bounce block. EINVAL (the file system refuses this direct read)
 * is FT_ERR_UNSUPPORTED with *n the bytes read so far (a multiple of
 * DIO_ALIGN): the caller goes on buffered from there. */
static ft_status pread_direct(int fd, uint8_t *p, size_t cap, size_t want, size_t *n)
{
    const size_t body = want & ~(size_t)(DIO_ALIGN - 1);
    size_t k = 0;
    *n = 0;
    while (k < body) {
        size_t len = body - k < DIO_MAX ? body - k : DIO_MAX;
        ssize_t r = pread(fd, p + k, len, (off_t)k);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return errno == EINVAL ? FT_ERR_UNSUPPORTED : FT_ERR_IO;
        if (r == 0) { *n = k; return FT_OK; }   /* the file ended early */
        k += (size_t)r;
        *n = k;
        if (k & (DIO_ALIGN - 1)) return FT_OK;   /* a partial block: its end */
    }
    if (want == body) return FT_OK;
    _Alignas(DIO_ALIGN) uint8_t bounce[DIO_ALIGN];
    uint8_t *dst = cap - body >= DIO_ALIGN ? p + body : bounce;
    ssize_t r;
    do r = pread(fd, dst, DIO_ALIGN, (off_t)body);
    while (r < 0 && errno == EINTR);
    if (r < 0) return errno == EINVAL ? FT_ERR_UNSUPPORTED : FT_ERR_IO;
    size_t t = (size_t)r < want - body ? (size_t)r : want - body;
    if (dst == bounce) memcpy(p + body, bounce, t);
    *n = body + t;
    return FT_OK;
}

/* fd read through the page cache from now on (O_DIRECT cleared). */
static ft_status clear_direct(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    return fl >= 0 && fcntl(fd, F_SETFL, fl & ~O_DIRECT) == 0 ? FT_OK : FT_ERR_IO;
}

/* Read the frame file of key into out (grown unless fixed): its first
 * min(size, limit) bytes, *got of them read, *file_size its size. With
 * direct_io and an aligned buffer past the page cache (nothing is
 * charged to the cgroup, nothing to drop), else buffered (the pages
 * dropped after with drop_cache). */
static ft_status read_file(file_backend *f, const char *key, ft_buf *out,
                           size_t limit, size_t *got, size_t *file_size)
{
    char name[NAME_CAP];
    ft_status st = name_of(key, name);
    if (st != FT_OK) return st;
    int direct = f->direct && !atomic_load(&f->direct_refused);
    int fd = openat(f->dirfd, name, O_RDONLY | O_CLOEXEC | (direct ? O_DIRECT : 0));
    if (fd < 0 && direct && errno == EINVAL) {   /* this file system has no O_DIRECT */
        atomic_store(&f->direct_refused, 1);
        direct = 0;
        fd = openat(f->dirfd, name, O_RDONLY | O_CLOEXEC);
    }
    if (fd < 0) {
        if (errno == ENOENT) return ft_set_error(FT_ERR_NOT_FOUND, "no tensor '%s'", key);
        return ft_set_error(FT_ERR_IO, "%s/%s: %s", f->dir, name, strerror(errno));
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        close(fd);
        return ft_set_error(FT_ERR_IO, "%s/%s: %s", f->dir, name, strerror(errno));
    }
    size_t fs = (size_t)sb.st_size, want = fs < limit ? fs : limit;
    /* a buffer of ours gets room for the last block too */
    size_t room = out->fixed ? want : (want + DIO_ALIGN - 1) & ~(size_t)(DIO_ALIGN - 1);
    st = ft_buf_reserve(out, room ? room : 1);
    size_t n = 0;
    if (st == FT_OK && direct && ((uintptr_t)out->p & (DIO_ALIGN - 1)) == 0) {
        st = pread_direct(fd, out->p, out->cap, want, &n);
        if (st == FT_ERR_UNSUPPORTED) {   /* refused: the rest buffered */
            atomic_store(&f->direct_refused, 1);
            st = clear_direct(fd);
            direct = 0;
            if (st == FT_OK) st = pread_buffered(fd, out->p, n, want, &n);
        }
    } else if (st == FT_OK) {
        if (direct) {   /* not aligned: through the page cache */
            st = clear_direct(fd);
            direct = 0;
        }
        if (st == FT_OK) st = pread_buffered(fd, out->p, 0, want, &n);
    }
    if (st == FT_ERR_IO) st = ft_set_error(FT_ERR_IO, "%s/%s: %s", f->dir, name, strerror(errno));
    if (!direct) drop_file_cache(f, fd);
    close(fd);
    if (st != FT_OK) return st;
    *got = n;
    *file_size = fs;
    return FT_OK;
}

static ft_status file_get(ft_store_backend *b, const char *key, ft_buf *out, size_t *size)
{
    file_backend *f = (file_backend *)b;
    size_t got = 0, fs = 0;
    ft_status st = read_file(f, key, out, SIZE_MAX, &got, &fs);
    if (st != FT_OK) return st;
    ft_frame_info fi;
    st = ft_frame_parse(out->p, got, &fi);
    if (st != FT_OK || fi.frame_size != got || got != fs)
        return ft_set_error(FT_ERR_CORRUPT, "%s: stored frame for '%s' is corrupt%s%s",
                            f->dir, key, st != FT_OK ? ": " : " (size mismatch)",
                            st != FT_OK ? ft_last_error() : "");
    *size = got;
    return FT_OK;
}

static ft_status file_stat(ft_store_backend *b, const char *key, ft_frame_info *info)
{
    file_backend *f = (file_backend *)b;
    ft_buf buf = {0};
    size_t got = 0, fs = 0;
    /* The header of any frame fits the first 64 KiB unless it has many
     * chunks; retry with the full header size when needed. */
    ft_status st = read_file(f, key, &buf, 64 * 1024, &got, &fs);
    ft_frame_info fi;
    if (st == FT_OK) {
        st = ft_frame_parse(buf.p, got, &fi);
        if (st == FT_ERR_BUFFER_SMALL && got >= FT_FRAME_FIXED_HEADER &&
            fi.header_size <= fs) {
            st = read_file(f, key, &buf, fi.header_size, &got, &fs);
            if (st == FT_OK) st = ft_frame_parse(buf.p, got, &fi);
        }
        if (st == FT_OK && fi.frame_size != fs) st = FT_ERR_CORRUPT;
        if (st != FT_OK && st != FT_ERR_NOT_FOUND && st != FT_ERR_IO)
            st = ft_set_error(FT_ERR_CORRUPT, "%s: stored frame for '%s' is corrupt", f->dir, key);
    }
    ft_buf_free(&buf);
    if (st == FT_OK) *info = fi;
    return st;
}

static ft_status file_del(ft_store_backend *b, const char *key)
{
    file_backend *f = (file_backend *)b;
    char name[NAME_CAP];
    ft_status st = name_of(key, name);
    if (st != FT_OK) return st;
    if (unlinkat(f->dirfd, name, 0) != 0) {
        if (errno == ENOENT) return ft_set_error(FT_ERR_NOT_FOUND, "no tensor '%s'", key);
        return ft_set_error(FT_ERR_IO, "%s/%s: %s", f->dir, name, strerror(errno));
    }
    return FT_OK;
}

typedef void (*dir_fn)(void *arg, const char *key, uint64_t size);

static ft_status walk(file_backend *f, dir_fn fn, void *arg)
{
    int fd = openat(f->dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        if (fd >= 0) close(fd);
        return ft_set_error(FT_ERR_IO, "%s: %s", f->dir, strerror(errno));
    }
    struct dirent *de;
    const size_t sl = strlen(FILE_SUFFIX);
    while ((de = readdir(d))) {
        size_t n = strlen(de->d_name);
        if (de->d_name[0] == '.' || n <= sl || strcmp(de->d_name + n - sl, FILE_SUFFIX)) continue;
        char key[FT_KEY_MAX + 1];
        if (ft_key_unescape(de->d_name, n - sl, key, sizeof key) != FT_OK) continue;
        struct stat sb;
        uint64_t size = fstatat(f->dirfd, de->d_name, &sb, 0) == 0 ? (uint64_t)sb.st_size : 0;
        fn(arg, key, size);
    }
    closedir(d);
    return FT_OK;
}

typedef struct { ft_keylist l; ft_status st; } list_acc;
static void list_cb(void *arg, const char *key, uint64_t size)
{
    list_acc *a = arg;
    (void)size;
    if (a->st == FT_OK) a->st = ft_keylist_add(&a->l, key, strlen(key));
}

static ft_status file_list(ft_store_backend *b, char ***keys, size_t *n)
{
    list_acc a = {{0}, FT_OK};
    ft_status st = walk((file_backend *)b, list_cb, &a);
    if (st == FT_OK) st = a.st;
    if (st != FT_OK) { ft_list_free(a.l.v, a.l.n); return st; }
    *keys = a.l.v;
    *n = a.l.n;
    return FT_OK;
}

static void stats_cb(void *arg, const char *key, uint64_t size)
{
    ft_store_stats *s = arg;
    (void)key;
    s->tensors++;
    s->used += size;
}

static ft_status file_stats(ft_store_backend *b, ft_store_stats *out)
{
    ft_store_stats s;
    memset(&s, 0, sizeof s);
    ft_status st = walk((file_backend *)b, stats_cb, &s);
    if (st == FT_OK) *out = s;
    return st;
}

static void file_close(ft_store_backend *b)
{
    file_backend *f = (file_backend *)b;
    close(f->dirfd);
    free(f->dir);
    free(f);
}

static const ft_store_ops file_ops = {file_put, file_get, file_del, file_stat,
                                      file_list, file_stats, file_close, NULL, NULL};

/* spec: DIR or //DIR (file:///abs/dir) */
static ft_status file_open(const char *spec, const ft_store_params *p, ft_store_backend **out)
{
    const char *dir = strncmp(spec, "//", 2) ? spec : spec + 2;
    if (!*dir) return ft_set_error(FT_ERR_INVALID_ARG, "file: URI needs a directory");
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return ft_set_error(FT_ERR_IO, "%s: %s", dir, strerror(errno));
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return ft_set_error(FT_ERR_IO, "%s: %s", dir, strerror(errno));
    file_backend *f = calloc(1, sizeof *f);
    char *d = f ? strdup(dir) : NULL;
    if (!d) {
        free(f);
        close(fd);
        return ft_set_error(FT_ERR_NOMEM, "file: store");
    }
    f->base.ops = &file_ops;
    f->dir = d;
    f->dirfd = fd;
    f->drop_cache = p && p->drop_cache;
    f->direct = p && (p->direct_io > 0 || (p->direct_io < 0 && p->drop_cache));
    atomic_init(&f->seq, 0);
    atomic_init(&f->direct_refused, 0);
    *out = &f->base;
    return FT_OK;
}

const ft_store_scheme ft_store_scheme_file = {"file:", NULL, "file:DIR", file_open};
