#define _GNU_SOURCE
#include "pagecache.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

long ft_test_cached_pages(const char *path, uint64_t off, uint64_t len)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0) return -1;
    struct stat sb;
    long n = -1;
    if (fstat(fd, &sb) == 0 && sb.st_size == 0) n = 0;
    else if (fstat(fd, &sb) == 0) {
        size_t ps = (size_t)sysconf(_SC_PAGESIZE), np = ((size_t)sb.st_size + ps - 1) / ps;
        uint64_t end = len > UINT64_MAX - off ? UINT64_MAX : off + len;
        void *m = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_SHARED, fd, 0);
        unsigned char *v = malloc(np);
        if (m != MAP_FAILED && v && mincore(m, (size_t)sb.st_size, v) == 0) {
            n = 0;
            for (size_t i = (size_t)(off / ps); i < np && (uint64_t)i * ps < end; i++) n += v[i] & 1;
        }
        if (m != MAP_FAILED) munmap(m, (size_t)sb.st_size);
        free(v);
    }
    close(fd);
    return n;
}

void ft_test_evict(const char *path)
{
    int fd = open(path, O_RDONLY);
    if (fd >= 0) {
        (void)fdatasync(fd);
        (void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        close(fd);
    }
}

/* fn on each file of dir: the sum of what it returns, -1 if any did */
static long each_file(const char *dir, long (*fn)(const char *path))
{
    DIR *d = opendir(dir);
    if (!d) return -1;
    long n = 0;
    struct dirent *de;
    while (n >= 0 && (de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        long k = fn(path);
        n = k < 0 ? -1 : n + k;
    }
    closedir(d);
    return n;
}

static long cached_whole(const char *path) { return ft_test_cached_pages(path, 0, UINT64_MAX); }

static long evict_one(const char *path)
{
    if (access(path, R_OK) != 0) return -1;
    ft_test_evict(path);
    return 0;
}

long ft_test_dir_cached_pages(const char *dir) { return each_file(dir, cached_whole); }
int ft_test_dir_evict(const char *dir) { return each_file(dir, evict_one) < 0 ? -1 : 0; }
