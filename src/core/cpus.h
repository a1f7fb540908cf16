/* Internal to core: the CPUs a process may use (cpus.c). The public
 * answer is ft_usable_cpus() (flextier/core.h); this reader takes a root
 * directory so that a test can point it at a fake /proc and cgroup tree. */
#ifndef FT_CORE_CPUS_H
#define FT_CORE_CPUS_H

/* The CPU bandwidth limit, in CPUs (quota / period; 1.5 = one and a half
 * CPUs), of the cgroup the process belongs to, the smallest along its
 * ancestors up to the hierarchy's mount point; 0 when no limit is set or
 * the files cannot be read. Reads <root>/proc/self/cgroup (which cgroup),
 * <root>/proc/self/mountinfo (where its hierarchy is mounted), then
 * <root><mount point><path>/cpu.max (cgroup v2: "QUOTA PERIOD" or "max
 * PERIOD") or cpu.cfs_quota_us and cpu.cfs_period_us (v1, the hierarchy
 * with the cpu controller; quota -1: none). root "" is the real system. */
double ft_cgroup_cpu_limit_at(const char *root);

/* CPUs in the affinity mask of the calling thread (sched_getaffinity);
 * 0 if it cannot be read. */
unsigned ft_affinity_cpus(void);

/* affinity CPUs (0 counts as 1) capped by a quota of `quota` CPUs (0:
 * none) rounded up, at least 1: what ft_usable_cpus returns. */
unsigned ft_cpus_limit(unsigned affinity, double quota);

#endif
