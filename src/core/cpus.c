/* The CPUs this process may use: its affinity mask (taskset, cpusets,
 * numactl) and its cgroup's CPU bandwidth quota (docker --cpus, Kubernetes
 * CPU limits, systemd CPUQuota=). Thread defaults follow the smaller: more
 * compute threads than usable CPUs only makes them wait for each other at
 * every barrier of a decode step. */
#define _GNU_SOURCE
#include "core/cpus.h"
#include "flextier/core.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

unsigned ft_affinity_cpus(void)
{
    /* the mask may be larger than cpu_set_t's 1024 CPUs: grow until the
     * kernel accepts the size */
    for (size_t ncpu = 1024; ncpu <= (1u << 20); ncpu *= 4) {
        cpu_set_t *set = CPU_ALLOC(ncpu);
        if (!set) return 0;
        size_t sz = CPU_ALLOC_SIZE(ncpu);
        CPU_ZERO_S(sz, set);
        if (sched_getaffinity(0, sz, set) == 0) {
            int n = CPU_COUNT_S(sz, set);
            CPU_FREE(set);
            return n > 0 ? (unsigned)n : 0;
        }
        int e = errno;
        CPU_FREE(set);
        if (e != EINVAL) return 0;
    }
    return 0;
}

/* Read a small text file whole (NUL-terminated); 0 on success. */
static int read_small(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "re");
    if (!f) return -1;
    size_t n = fread(buf, 1, cap - 1, f);
    fclose(f);
    buf[n] = 0;
    return 0;
}

/* Undo mountinfo's octal escapes (\040 for a space, ...) in place. */
static void unescape(char *s)
{
    char *o = s;
    for (; *s; s++) {
        if (s[0] == '\\' && s[1] >= '0' && s[1] <= '3' && s[2] >= '0' && s[2] <= '7' && s[3] >= '0' &&
            s[3] <= '7') {
            *o++ = (char)((s[1] - '0') * 64 + (s[2] - '0') * 8 + (s[3] - '0'));
            s += 3;
        } else {
            *o++ = *s;
        }
    }
    *o = 0;
}

/* Is `tok` one of the comma-separated items of `list`? */
static int has_item(const char *list, const char *tok)
{
    size_t n = strlen(tok);
    for (const char *p = list; *p;) {
        const char *c = strchr(p, ',');
        size_t len = c ? (size_t)(c - p) : strlen(p);
        if (len == n && !strncmp(p, tok, n)) return 1;
        if (!c) break;
        p = c + 1;
    }
    return 0;
}

/* The cgroup path of the process in hierarchy v2 (v1 = 0) or in the v1
 * hierarchy whose controllers include "cpu" (v1 = 1). */
static int cgroup_path(const char *root, int v1, char *out, size_t cap)
{
    char path[PATH_MAX], line[4096];
    snprintf(path, sizeof path, "%s/proc/self/cgroup", root);
    FILE *f = fopen(path, "re");
    if (!f) return -1;
    int found = -1;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2) continue;
        *c1 = *c2 = 0;
        const char *ctrls = c1 + 1, *p = c2 + 1;
        int match = v1 ? has_item(ctrls, "cpu") : (!strcmp(line, "0") && !*ctrls);
        if (match && *p == '/' && strlen(p) < cap) {
            snprintf(out, cap, "%s", p);
            found = 0;
            break;
        }
    }
    fclose(f);
    return found;
}

/* The mount of the cgroup hierarchy: v1 with the cpu controller (v1 = 1)
 * or v2 (v1 = 0): its root within the hierarchy and its mount point. */
static int cgroup_mount(const char *root, int v1, char *mroot, char *mpoint, size_t cap)
{
    char path[PATH_MAX], line[4096];
    snprintf(path, sizeof path, "%s/proc/self/mountinfo", root);
    FILE *f = fopen(path, "re");
    if (!f) return -1;
    int found = -1;
    while (found && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        /* ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTIONS */
        char *fld[6] = {0}, *save = NULL, *tok = strtok_r(line, " ", &save);
        int i = 0;
        for (; tok && i < 6; i++, tok = strtok_r(NULL, " ", &save)) fld[i] = tok;
        if (i < 6) continue;
        while (tok && strcmp(tok, "-")) tok = strtok_r(NULL, " ", &save);
        char *fstype = tok ? strtok_r(NULL, " ", &save) : NULL;
        char *source = fstype ? strtok_r(NULL, " ", &save) : NULL;
        char *super = source ? strtok_r(NULL, " ", &save) : NULL;
        if (!super) continue;
        int match = v1 ? !strcmp(fstype, "cgroup") && has_item(super, "cpu") : !strcmp(fstype, "cgroup2");
        if (!match || strlen(fld[3]) >= cap || strlen(fld[4]) >= cap) continue;
        snprintf(mroot, cap, "%s", fld[3]);
        snprintf(mpoint, cap, "%s", fld[4]);
        unescape(mroot);
        unescape(mpoint);
        found = 0;
    }
    fclose(f);
    return found;
}

/* The limit set in one cgroup directory, in CPUs; 0: none. */
static double dir_limit(const char *dir, int v1)
{
    char path[PATH_MAX + 32], buf[128];
    if (!v1) {
        snprintf(path, sizeof path, "%s/cpu.max", dir);
        if (read_small(path, buf, sizeof buf)) return 0;
        if (!strncmp(buf, "max", 3)) return 0;
        char *end;
        long long quota = strtoll(buf, &end, 10);
        if (end == buf) return 0;
        long long period = strtoll(end, &end, 10);
        return quota > 0 && period > 0 ? (double)quota / (double)period : 0;
    }
    snprintf(path, sizeof path, "%s/cpu.cfs_quota_us", dir);
    if (read_small(path, buf, sizeof buf)) return 0;
    long long quota = strtoll(buf, NULL, 10);
    snprintf(path, sizeof path, "%s/cpu.cfs_period_us", dir);
    if (quota <= 0 || read_small(path, buf, sizeof buf)) return 0;
    long long period = strtoll(buf, NULL, 10);
    return period > 0 ? (double)quota / (double)period : 0;
}

double ft_cgroup_cpu_limit_at(const char *root)
{
    if (!root) root = "";
    char cg[PATH_MAX / 2], mroot[PATH_MAX / 4], mpoint[PATH_MAX / 4];
    /* v1's cpu controller when it is mounted (v1 or hybrid systems), else v2 */
    int v1 = 1;
    if (cgroup_mount(root, 1, mroot, mpoint, sizeof mroot) || cgroup_path(root, 1, cg, sizeof cg)) {
        v1 = 0;
        if (cgroup_mount(root, 0, mroot, mpoint, sizeof mroot) || cgroup_path(root, 0, cg, sizeof cg)) return 0;
    }
    /* the path relative to the mount: a container sees its own cgroup as
     * the mount's root */
    const char *rel = cg;
    size_t rl = strlen(mroot);
    if (strcmp(mroot, "/") && !strncmp(cg, mroot, rl) && (cg[rl] == '/' || !cg[rl])) rel = cg + rl;
    char base[PATH_MAX], dir[PATH_MAX];
    snprintf(base, sizeof base, "%s%s", root, mpoint);
    if (snprintf(dir, sizeof dir, "%s%s", base, strcmp(rel, "/") ? rel : "") >= (int)sizeof dir) return 0;
    if (access(dir, F_OK)) snprintf(dir, sizeof dir, "%s", base);   /* not visible here: the mount's root */
    double best = 0;
    size_t bl = strlen(base);
    for (;;) {
        double l = dir_limit(dir, v1);
        if (l > 0 && (best == 0 || l < best)) best = l;
        char *slash = strrchr(dir, '/');
        if (strlen(dir) <= bl || !slash || (size_t)(slash - dir) < bl) break;
        *slash = 0;
    }
    return best;
}

unsigned ft_cpus_limit(unsigned affinity, double quota)
{
    unsigned n = affinity ? affinity : 1;
    if (quota > 0) {
        double c = ceil(quota - 1e-9);   /* 1.5 CPUs of time: 2 threads; 0.5: 1 */
        if (c < 1) c = 1;
        if (c < (double)n) n = (unsigned)c;
    }
    return n;
}

unsigned ft_usable_cpus(void)
{
    unsigned n = ft_affinity_cpus();
    if (!n) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        n = c > 0 ? (unsigned)c : 1;
    }
    return ft_cpus_limit(n, ft_cgroup_cpu_limit_at(""));
}
