/* CLI helpers: errors, files, sizes. */
#include "cli.h"

#include <errno.h>
#include <signal.h>
#include <math.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int ft_cli_fail(const char *what, ft_status st)
{
    const char *d = ft_last_error();
    if (d && *d) fprintf(stderr, "flextier: %s: %s (%s)\n", what, ft_status_str(st), d);
    else fprintf(stderr, "flextier: %s: %s\n", what, ft_status_str(st));
    return FT_EXIT_ERR;
}

int ft_cli_usage_error(const char *usage, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "flextier: ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n%s", usage);
    return FT_EXIT_USAGE;
}

ft_status ft_cli_read_file(const char *path, uint8_t **data, size_t *size)
{
    int fd = strcmp(path, "-") ? open(path, O_RDONLY | O_CLOEXEC) : dup(0);
    if (fd < 0) return ft_set_error(errno == ENOENT ? FT_ERR_NOT_FOUND : FT_ERR_IO,
                                    "%s: %s", path, strerror(errno));
    struct stat sb;
    size_t cap = 1 << 20, n = 0;
    if (fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode)) cap = (size_t)sb.st_size + 1;
    if (fstat(fd, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        close(fd);
        return ft_set_error(FT_ERR_IO, "%s: is a directory", path);
    }
    uint8_t *buf = ft_malloc_aligned(cap, 64);
    if (!buf) { close(fd); return ft_set_error(FT_ERR_NOMEM, "%s: cannot allocate %zu bytes", path, cap); }
    for (;;) {
        if (n == cap) {
            size_t ncap = cap * 2;
            uint8_t *nb = ft_malloc_aligned(ncap, 64);
            if (!nb) { ft_free_aligned(buf); close(fd); return FT_ERR_NOMEM; }
            memcpy(nb, buf, n);
            ft_free_aligned(buf);
            buf = nb;
            cap = ncap;
        }
        ssize_t r = read(fd, buf + n, cap - n);
        if (r < 0) {
            if (errno == EINTR) continue;
            ft_status st = ft_set_error(FT_ERR_IO, "%s: %s", path, strerror(errno));
            ft_free_aligned(buf);
            close(fd);
            return st;
        }
        if (r == 0) break;
        n += (size_t)r;
    }
    close(fd);
    *data = buf;
    *size = n;
    return FT_OK;
}

static ft_status write_all(int fd, const void *data, size_t size, const char *path)
{
    const uint8_t *p = data;
    while (size) {
        ssize_t w = write(fd, p, size > (1u << 30) ? (1u << 30) : size);
        if (w < 0) {
            if (errno == EINTR) continue;
            return ft_set_error(FT_ERR_IO, "%s: %s", path, strerror(errno));
        }
        p += w;
        size -= (size_t)w;
    }
    return FT_OK;
}

ft_status ft_cli_write_file(const char *path, const void *data, size_t size)
{
    if (!strcmp(path, "-")) {
        ft_status st = write_all(1, data, size, "stdout");
        return st;
    }
    size_t len = strlen(path);
    char *tmp = malloc(len + 16);
    if (!tmp) return FT_ERR_NOMEM;
    snprintf(tmp, len + 16, "%s.tmpXXXXXX", path);
    int fd = mkstemp(tmp);
    if (fd < 0) {
        ft_status st = ft_set_error(FT_ERR_IO, "%s: %s", path, strerror(errno));
        free(tmp);
        return st;
    }
    fchmod(fd, 0644);
    ft_status st = write_all(fd, data, size, path);
    if (st == FT_OK && fsync(fd) != 0) st = ft_set_error(FT_ERR_IO, "%s: fsync: %s", path, strerror(errno));
    if (close(fd) != 0 && st == FT_OK) st = ft_set_error(FT_ERR_IO, "%s: close: %s", path, strerror(errno));
    if (st == FT_OK && rename(tmp, path) != 0)
        st = ft_set_error(FT_ERR_IO, "%s: rename: %s", path, strerror(errno));
    if (st != FT_OK) unlink(tmp);
    free(tmp);
    return st;
}

ft_status ft_cli_parse_size(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    if (!s || !*s || *s == '-') return ft_set_error(FT_ERR_INVALID_ARG, "bad size '%s'", s ? s : "");
    double v = strtod(s, &end);
    /* finite and not negative only: nan, inf and -0x1p3 are no sizes */
    if (errno || end == s || !(v >= 0) || !isfinite(v))
        return ft_set_error(FT_ERR_INVALID_ARG, "bad size '%s' (a finite number of bytes, e.g. 64M, 1G, 4096)", s);
    double mul = 1;
    switch (*end) {
    case 'k': case 'K': mul = 1024.0; end++; break;
    case 'm': case 'M': mul = 1024.0 * 1024; end++; break;
    case 'g': case 'G': mul = 1024.0 * 1024 * 1024; end++; break;
    case 't': case 'T': mul = 1024.0 * 1024 * 1024 * 1024; end++; break;
    default: break;
    }
    if (*end == 'i' || *end == 'I') end++;
    if (*end == 'b' || *end == 'B') end++;
    if (*end) return ft_set_error(FT_ERR_INVALID_ARG, "bad size '%s' (e.g. 64M, 1G, 4096)", s);
    double r = v * mul;
    if (!(r <= 9.0e18)) return ft_set_error(FT_ERR_INVALID_ARG, "size '%s' too large", s);
    *out = (uint64_t)r;
    return FT_OK;
}

void ft_cli_fmt_bytes(double b, char *buf, size_t n)
{
    static const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (b >= 1024 && i < 4) { b /= 1024; i++; }
    snprintf(buf, n, i ? "%.1f %s" : "%.0f %s", b, u[i]);
}

int ft_cli_tensor_opt(int c, const char *arg, const ft_cli_tensor_args *a)
{
    long v;
    uint64_t sz;
    switch (c) {
    case 'c':
        if (!a->cp) return 0;
        if (ft_codec_parse(arg, &a->cp->codec, &a->cp->entropy)) return -1;
        if (a->have_codec) *a->have_codec = 1;
        return 1;
    case 'l':
        if (!a->cp) return 0;
        if (ft_cli_parse_int(arg, -100, 22, &v)) { ft_set_error(FT_ERR_INVALID_ARG, "--level: %s", ft_last_error()); return -1; }
        a->cp->level = (int)v;
        return 1;
    case 'g':
        if (!a->cp) return 0;
        if (ft_cli_parse_int(arg, 1, 65536, &v)) { ft_set_error(FT_ERR_INVALID_ARG, "--group-size: %s", ft_last_error()); return -1; }
        a->cp->group_size = (uint32_t)v;
        return 1;
    case 'G':
        if (!a->cp) return 0;
        if (ft_cli_parse_int(arg, -FT_MAX_DIMS, FT_MAX_DIMS - 1, &v)) {
            ft_set_error(FT_ERR_INVALID_ARG, "--group-dim: %s", ft_last_error());
            return -1;
        }
        a->cp->group_dim = (int32_t)v;
        return 1;
    case 'k':
        if (!a->cp) return 0;
        if (ft_cli_parse_size(arg, &sz) || sz < FT_MIN_CHUNK_SIZE || sz > FT_MAX_CHUNK_SIZE) {
            ft_set_error(FT_ERR_INVALID_ARG, "--chunk-size must be within 4K..64M");
            return -1;
        }
        a->cp->chunk_size = (uint32_t)sz;
        return 1;
    case 'd':
        if (!a->dtype) return 0;
        if (ft_dtype_parse(arg, a->dtype)) return -1;
        if (a->have_dtype) *a->have_dtype = 1;
        return 1;
    case 's':
        if (!a->shape) return 0;
        if (ft_shape_parse(arg, a->ndim, a->shape)) { ft_set_error(FT_ERR_INVALID_ARG, "--shape: %s", ft_last_error()); return -1; }
        if (a->have_shape) *a->have_shape = 1;
        return 1;
    default:
        return 0;
    }
}

ft_status ft_cli_parse_int(const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return ft_set_error(FT_ERR_INVALID_ARG, "'%s' is not an integer in [%ld, %ld]", s, lo, hi);
    *out = v;
    return FT_OK;
}

#include "flextier/model.h"

ft_status ft_cli_load_st_tensor(const char *path, const char *name, ft_tensor *out)
{
    ft_checkpoint *ck = NULL;
    ft_status st = ft_checkpoint_open(path, &ck);
    if (st) return st;
    ft_tensor v;
    if ((st = ft_checkpoint_get(ck, name, &v))) {
        if (st == FT_ERR_NOT_FOUND) {
            char some[256] = "";
            size_t off = 0, n = ft_checkpoint_count(ck);
            for (size_t i = 0; i < n && i < 5 && off < sizeof some; i++)
                off += (size_t)snprintf(some + off, sizeof some - off, "%s%s", i ? ", " : "", ft_checkpoint_name(ck, i));
            st = ft_set_error(FT_ERR_NOT_FOUND, "%s: no tensor '%s' (%zu tensors, e.g. %s%s)", path, name, n, some,
                              n > 5 ? ", ..." : "");
        }
        ft_checkpoint_close(ck);
        return st;
    }
    uint64_t nb;
    ft_tensor_nbytes(&v, &nb);
    /* Copy: the mapping is read-only and need not be aligned. */
    void *copy = ft_malloc_aligned(nb ? (size_t)nb : 64, 64);
    if (!copy) { ft_checkpoint_close(ck); return FT_ERR_NOMEM; }
    if (nb) memcpy(copy, v.data, (size_t)nb);
    ft_checkpoint_close(ck);
    v.data = copy;
    *out = v;
    return FT_OK;
}

void ft_cli_warn_threads(long threads)
{
    unsigned usable = ft_usable_cpus();
    if (threads > 0 && (unsigned long)threads > usable)
        fprintf(stderr, "flextier: warning: --threads %ld is more than the %u CPU%s this process may use "
                        "(affinity and cgroup CPU quota): the threads will share CPUs\n",
                threads, usable, usable == 1 ? "" : "s");
}

static volatile int daemon_stop;
static void on_stop_signal(int sig) { (void)sig; daemon_stop = 1; }

volatile int *ft_cli_daemon_start(void)
{
    if (ft_log_get_level() < FT_LOG_INFO) ft_log_set_level(FT_LOG_INFO);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    return &daemon_stop;
}

void ft_cli_print_listening(void *arg, const char *bound)
{
    printf("%s: listening on %s\n", (const char *)arg, bound);
    fflush(stdout);
}
