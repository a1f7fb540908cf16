/* The process's memory: the limit it runs under (its memory cgroup, v2 or
 * v1, else the memory the machine has available), the default budget
 * derived from it, and the resident set (include/flextier/core.h). */
#include "flextier/core.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A whole small file (a /proc or /sys entry) into buf, NUL-terminated. */
static int read_small(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "re");
    if (!f) return -1;
    size_t n = fread(buf, 1, cap - 1, f);
    fclose(f);
    buf[n] = '\0';
    return 0;
}

/* A limit file's value: a decimal byte count; "max" (v2) or a value at or
 * above 2^62 (v1's "unlimited", PAGE_COUNTER_MAX pages) is no limit. */
static uint64_t parse_limit(const char *s)
{
    while (*s == ' ' || *s == '\t') s++;
    if (!strncmp(s, "max", 3)) return 0;
    if (*s < '0' || *s > '9') return 0;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || (*end && *end != '\n')) return 0;
    if (v >= (1ull << 62)) return 0;
    return (uint64_t)v;
}

/* The smallest limit of a cgroup directory and its ancestors up to the
 * mount point `root` (a child may be unlimited under a limited parent). */
static uint64_t walk_limits(const char *root, const char *rel, const char *file)
{
    char path[4096], buf[64];
    uint64_t best = 0;
    char cur[2048];
    snprintf(cur, sizeof cur, "%s", rel);
    for (;;) {
        size_t n = strlen(cur);
        while (n > 1 && cur[n - 1] == '/') cur[--n] = '\0';
        snprintf(path, sizeof path, "%s%s/%s", root, strcmp(cur, "/") ? cur : "", file);
        if (read_small(path, buf, sizeof buf) == 0) {
            uint64_t v = parse_limit(buf);
            if (v && (!best || v < best)) best = v;
        }
        char *slash = strrchr(cur, '/');
        if (!slash || slash == cur) {
            if (strcmp(cur, "/") == 0 || cur[0] == '\0') break;
            snprintf(cur, sizeof cur, "/");
            continue;
        }
        *slash = '\0';
    }
    return best;
}

/* One line of /proc/self/cgroup, "hierarchy-ID:controller-list:path":
 * split it in place (line keeps the "ID:" prefix); 0 if malformed or the
 * path is not absolute. */
static int cgroup_line(char *line, const char **ctrls, const char **path)
{
    char *c1 = strchr(line, ':');
    if (!c1) return 0;
    char *c2 = strchr(c1 + 1, ':');
    if (!c2) return 0;
    *c2 = '\0';
    *ctrls = c1 + 1;
    *path = c2 + 1;
    return **path == '/';
}

uint64_t ft_cgroup_memory_limit(int *version)
{
    char buf[8192];
    if (version) *version = 0;
    if (read_small("/proc/self/cgroup", buf, sizeof buf)) return 0;
    uint64_t v1 = 0, v2 = 0;
    char *save = NULL;
    for (char *line = strtok_r(buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        const char *ctrls, *path;
        if (!cgroup_line(line, &ctrls, &path)) continue;
        if (!*ctrls && !strncmp(line, "0:", 2)) {
            v2 = walk_limits("/sys/fs/cgroup", path, "memory.max");
        } else {
            /* v1: "memory" in the comma-separated controller list */
            char cl[256];
            snprintf(cl, sizeof cl, "%s", ctrls);
            char *s2 = NULL;
            for (char *t = strtok_r(cl, ",", &s2); t; t = strtok_r(NULL, ",", &s2))
                if (!strcmp(t, "memory")) v1 = walk_limits("/sys/fs/cgroup/memory", path, "memory.limit_in_bytes");
        }
    }
    if (v2 && (!v1 || v2 <= v1)) {
        if (version) *version = 2;
        return v2;
    }
    if (v1 && version) *version = 1;
    return v1;
}

/* A "Key:   123 kB" line of /proc/meminfo. */
static uint64_t meminfo(const char *key)
{
    char buf[8192];
    if (read_small("/proc/meminfo", buf, sizeof buf)) return 0;
    size_t k = strlen(key);
    for (char *p = buf; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
        if (!strncmp(p, key, k) && p[k] == ':') {
            unsigned long long v = strtoull(p + k + 1, NULL, 10);
            return (uint64_t)v * 1024;
        }
    }
    return 0;
}

uint64_t ft_memory_headroom(uint64_t limit)
{
    uint64_t h = limit / 16;
    return h < FT_MEMORY_HEADROOM_MIN ? FT_MEMORY_HEADROOM_MIN : h;
}

ft_status ft_memory_default_budget(ft_memory_info *out)
{
    if (!out) return FT_ERR_INVALID_ARG;
    memset(out, 0, sizeof *out);
    int ver = 0;
    uint64_t cg = ft_cgroup_memory_limit(&ver);
    uint64_t avail = meminfo("MemAvailable");
    out->cgroup_version = ver;
    out->cgroup_limit = cg;
    out->available = avail;
    /* a cgroup limit above what the machine has is no real bound */
    if (cg && (!avail || cg <= avail + ft_process_rss())) {
        out->limit = cg;
        out->source = ver == 2 ? "cgroup v2 memory.max" : "cgroup v1 memory.limit_in_bytes";
    } else if (avail) {
        /* what this process already holds is not in MemAvailable */
        out->limit = avail + ft_process_rss();
        out->source = "MemAvailable";
    } else {
        return ft_set_error(FT_ERR_UNSUPPORTED, "memory: no cgroup limit and no MemAvailable in /proc/meminfo: "
                            "give the budget (--memory SIZE)");
    }
    out->headroom = ft_memory_headroom(out->limit);
    out->budget = out->limit > out->headroom ? out->limit - out->headroom : 0;
    return FT_OK;
}

uint64_t ft_process_rss(void)
{
    char buf[256];
    if (read_small("/proc/self/statm", buf, sizeof buf)) return 0;
    unsigned long long size = 0, res = 0;
    if (sscanf(buf, "%llu %llu", &size, &res) != 2) return 0;
    long ps = sysconf(_SC_PAGESIZE);
    return (uint64_t)res * (uint64_t)(ps > 0 ? ps : 4096);
}

/* This process's own memory cgroup directory (v2 preferred), or -1. */
static int own_cgroup(char *dir, size_t n, int *version)
{
    char buf[8192];
    if (read_small("/proc/self/cgroup", buf, sizeof buf)) return -1;
    char *save = NULL;
    int found = -1;
    for (char *line = strtok_r(buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        const char *ctrls, *path;
        if (!cgroup_line(line, &ctrls, &path)) continue;
        char probe[4096];
        if (!*ctrls && !strncmp(line, "0:", 2)) {
            snprintf(probe, sizeof probe, "/sys/fs/cgroup%s/memory.max", strcmp(path, "/") ? path : "");
            if (access(probe, R_OK) == 0) {
                snprintf(dir, n, "/sys/fs/cgroup%s", strcmp(path, "/") ? path : "");
                *version = 2;
                return 0;
            }
        } else if (strstr(ctrls, "memory")) {
            snprintf(probe, sizeof probe, "/sys/fs/cgroup/memory%s/memory.limit_in_bytes", strcmp(path, "/") ? path : "");
            if (access(probe, R_OK) == 0) {
                snprintf(dir, n, "/sys/fs/cgroup/memory%s", strcmp(path, "/") ? path : "");
                *version = 1;
                found = 0;
            }
        }
    }
    return found;
}

uint64_t ft_cgroup_memory_usage(void)
{
    char dir[4096], path[4200], buf[64];
    int ver = 0;
    if (own_cgroup(dir, sizeof dir, &ver)) return 0;
    snprintf(path, sizeof path, "%s/%s", dir, ver == 2 ? "memory.max" : "memory.limit_in_bytes");
    if (read_small(path, buf, sizeof buf) || !parse_limit(buf)) return 0;   /* its own limit only */
    snprintf(path, sizeof path, "%s/%s", dir, ver == 2 ? "memory.current" : "memory.usage_in_bytes");
    if (read_small(path, buf, sizeof buf)) return 0;
    return parse_limit(buf);
}

/* memory.stat's line `name` in buf (v2 names; v1 prefixes "total_" and
 * names the dirty and writeback lines without "file_"); 0 where absent. */
static uint64_t stat_line(const char *buf, int ver, const char *name)
{
    char key[64];
    if (ver == 1 && !strncmp(name, "file_", 5)) name += 5;
    snprintf(key, sizeof key, "%s%s ", ver == 1 ? "total_" : "", name);
    size_t kl = strlen(key);
    for (const char *l = buf; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
        if (!strncmp(l, key, kl)) return strtoull(l + kl, NULL, 10);
    return 0;
}

/* The cgroup's usage less the memory.stat lines in minus, plus those in
 * plus (one read of the file); the usage where it cannot be read, 0 as
 * ft_cgroup_memory_usage. */
static uint64_t cgroup_usage_adjusted(const char *const *minus, size_t nm, const char *const *plus, size_t np)
{
    uint64_t use = ft_cgroup_memory_usage();
    char dir[4096], path[4200], buf[16384];
    int ver = 0;
    if (!use || own_cgroup(dir, sizeof dir, &ver)) return use;
    snprintf(path, sizeof path, "%s/memory.stat", dir);
    if (read_small(path, buf, sizeof buf)) return use;
    uint64_t m = 0, p = 0;
    for (size_t k = 0; k < nm; k++) m += stat_line(buf, ver, minus[k]);
    for (size_t k = 0; k < np; k++) p += stat_line(buf, ver, plus[k]);
    return (m < use ? use - m : 0) + p;
}

uint64_t ft_cgroup_memory_working_set(void)
{
    static const char *const minus[] = {"inactive_file"};
    return cgroup_usage_adjusted(minus, 1, NULL, 0);
}

uint64_t ft_cgroup_memory_unreclaimable(void)
{
    static const char *const minus[] = {"active_file", "inactive_file"};
    static const char *const plus[] = {"file_dirty", "file_writeback"};
    return cgroup_usage_adjusted(minus, 2, plus, 2);
}
