/* The CPUs a process may use (src/core/cpus.c): the cgroup CPU quota
 * reader on fake /proc and cgroup trees (v1 as on the CI machines, v1 with
 * combined controllers, v2, a container's view, ancestors' limits, no
 * limit, malformed files), ft_usable_cpus against the affinity mask, and
 * the thread default under `taskset -c 0` end to end (flextier run). */
#define _GNU_SOURCE
#include "ft_test.h"
#include "support/cli_run.h"
#include "core/cpus.h"

#include <math.h>
#include <sched.h>
#include <stdarg.h>
#include <sys/stat.h>
#include <unistd.h>

static char root[256];

/* Write root/rel (creating its directories) with printf-formatted text. */
static int put(const char *rel, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int put(const char *rel, const char *fmt, ...)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    for (char *p = path + strlen(root) + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            mkdir(path, 0755);
            *p = '/';
        }
    FILE *f = fopen(path, "w");
    if (!f) return 0;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(f, fmt, ap);
    va_end(ap);
    return fclose(f) == 0;
}

static void fresh(void)
{
    if (root[0]) ft_sh("rm -rf %s", root);
    snprintf(root, sizeof root, "/tmp/ft_cpus_%d", (int)getpid());
    mkdir(root, 0755);
}

/* This machine's layout: every v1 controller mounted on its own directory. */
static const char V1_MOUNTS[] =
    "20 19 0:17 / /sys/fs/cgroup rw - tmpfs tmpfs rw,mode=755\n"
    "21 20 0:18 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
    "22 20 0:19 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct\n"
    "23 20 0:20 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n";

TEST(cgroup_v1_quota_and_ancestors)
{
    fresh();
    REQUIRE(put("proc/self/mountinfo", "%s", V1_MOUNTS));
    REQUIRE(put("proc/self/cgroup", "4:memory:/m\n2:cpuacct:/\n1:cpu:/job/step\n0::/\n"));
    /* no files at all: no limit */
    CHECK(ft_cgroup_cpu_limit_at(root) == 0);
    REQUIRE(put("sys/fs/cgroup/cpu/cpu.cfs_quota_us", "-1\n") && put("sys/fs/cgroup/cpu/cpu.cfs_period_us", "100000\n"));
    REQUIRE(put("sys/fs/cgroup/cpu/job/cpu.cfs_quota_us", "-1\n") && put("sys/fs/cgroup/cpu/job/cpu.cfs_period_us", "100000\n"));
    REQUIRE(put("sys/fs/cgroup/cpu/job/step/cpu.cfs_quota_us", "-1\n") &&
            put("sys/fs/cgroup/cpu/job/step/cpu.cfs_period_us", "100000\n"));
    CHECK(ft_cgroup_cpu_limit_at(root) == 0);
    /* the leaf's quota */
    REQUIRE(put("sys/fs/cgroup/cpu/job/step/cpu.cfs_quota_us", "150000\n"));
    CHECK_MSG(fabs(ft_cgroup_cpu_limit_at(root) - 1.5) < 1e-9, "%g", ft_cgroup_cpu_limit_at(root));
    /* a smaller one on an ancestor wins */
    REQUIRE(put("sys/fs/cgroup/cpu/job/cpu.cfs_quota_us", "50000\n") && put("sys/fs/cgroup/cpu/job/cpu.cfs_period_us", "100000\n"));
    CHECK_MSG(fabs(ft_cgroup_cpu_limit_at(root) - 0.5) < 1e-9, "%g", ft_cgroup_cpu_limit_at(root));
    /* the mount point's own limit counts too */
    REQUIRE(put("sys/fs/cgroup/cpu/cpu.cfs_quota_us", "25000\n"));
    CHECK_MSG(fabs(ft_cgroup_cpu_limit_at(root) - 0.25) < 1e-9, "%g", ft_cgroup_cpu_limit_at(root));
    /* a period of 0 or garbage is no limit, not a crash or a division by 0 */
    REQUIRE(put("sys/fs/cgroup/cpu/cpu.cfs_period_us", "0\n") && put("sys/fs/cgroup/cpu/job/cpu.cfs_period_us", "x\n"));
    CHECK_MSG(fabs(ft_cgroup_cpu_limit_at(root) - 1.5) < 1e-9, "%g", ft_cgroup_cpu_limit_at(root));
}

TEST(cgroup_v1_combined_controllers_and_container_view)
{
    fresh();
    /* cpu and cpuacct co-mounted, the process in a container whose cgroup
     * is the mount's root (the path in /proc/self/cgroup starts with it) */
    REQUIRE(put("proc/self/mountinfo",
                "30 25 0:26 /docker/abc /sys/fs/cgroup/cpu,cpuacct ro,nosuid - cgroup cgroup rw,cpuacct,cpu\n"));
    REQUIRE(put("proc/self/cgroup", "3:cpuacct,cpu:/docker/abc\n"));
    REQUIRE(put("sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", "200000\n") &&
            put("sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us", "100000\n"));
    CHECK_MSG(fabs(ft_cgroup_cpu_limit_at(root) - 2.0) < 1e-9, "%g", ft_cgroup_cpu_limit_at(root));
    /* a cgroup path not visible under the mount: the mount's root is read */
    REQUIRE(put("proc/self/cgroup", "3:cpuacct,cpu:/elsewhere/x\n"));
    CHECK_MSG(fabs(ft_cgroup_cpu_limit_at(root) - 2.0) < 1e-9, "%g", ft_cgroup_cpu_limit_at(root));
}

TEST(cgroup_v2_cpu_max)
{
    fresh();
    /* v1 hierarchies without the cpu controller, and the unified one */
    REQUIRE(put("proc/self/mountinfo",
                "40 30 0:30 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
                "41 30 0:31 / /sys/fs/cgroup/unified\\040x rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"));
    REQUIRE(put("proc/self/cgroup", "4:memory:/\n0::/user.slice/run-1.scope\n"));
    REQUIRE(put("sys/fs/cgroup/unified x/user.slice/run-1.scope/cpu.max", "max 100000\n"));
    CHECK(ft_cgroup_cpu_limit_at(root) == 0);
    REQUIRE(put("sys/fs/cgroup/unified x/user.slice/cpu.max", "300000 100000\n"));
    CHECK_MSG(fabs(ft_cgroup_cpu_limit_at(root) - 3.0) < 1e-9, "%g", ft_cgroup_cpu_limit_at(root));
    REQUIRE(put("sys/fs/cgroup/unified x/user.slice/run-1.scope/cpu.max", "125000 250000\n"));
    CHECK_MSG(fabs(ft_cgroup_cpu_limit_at(root) - 0.5) < 1e-9, "%g", ft_cgroup_cpu_limit_at(root));
    /* a file with nothing to parse */
    REQUIRE(put("sys/fs/cgroup/unified x/user.slice/run-1.scope/cpu.max", "\n"));
    CHECK_MSG(fabs(ft_cgroup_cpu_limit_at(root) - 3.0) < 1e-9, "%g", ft_cgroup_cpu_limit_at(root));
}

TEST(cgroup_malformed_or_missing)
{
    fresh();
    CHECK(ft_cgroup_cpu_limit_at(root) == 0);   /* no /proc at all */
    REQUIRE(put("proc/self/mountinfo", "garbage\n\n1 2 3\n- - -\n1 2 3 4 5 6 - cgroup\n"));
    REQUIRE(put("proc/self/cgroup", "nonsense\n::\n1:cpu:relative\n"));
    CHECK(ft_cgroup_cpu_limit_at(root) == 0);
    CHECK(ft_cgroup_cpu_limit_at("/nonexistent/dir") == 0);
    ft_sh("rm -rf %s", root);
}

TEST(quota_caps_affinity)
{
    CHECK(ft_cpus_limit(4, 0) == 4);        /* no quota */
    CHECK(ft_cpus_limit(4, 1.5) == 2);      /* rounded up */
    CHECK(ft_cpus_limit(4, 2.0) == 2);      /* exact */
    CHECK(ft_cpus_limit(4, 0.25) == 1);     /* at least one */
    CHECK(ft_cpus_limit(2, 8.0) == 2);      /* affinity is the smaller */
    CHECK(ft_cpus_limit(0, 0) == 1);
    CHECK(ft_cpus_limit(64, 63.5) == 64 && ft_cpus_limit(64, 62.5) == 63);
}

TEST(usable_cpus_follow_affinity)
{
    unsigned aff = ft_affinity_cpus();
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    CHECK(aff >= 1 && (long)aff <= online);
    unsigned u = ft_usable_cpus();
    CHECK(u >= 1 && u <= aff);
    double q = ft_cgroup_cpu_limit_at("");
    printf("  affinity %u CPUs, cgroup quota %s%.2f, usable %u, default threads %u\n", aff, q > 0 ? "" : "none ",
           q, u, ft_default_threads());
    CHECK(u == ft_cpus_limit(aff, q));
    /* pinned to one CPU, this thread's answer is 1 */
    cpu_set_t old, one;
    REQUIRE(sched_getaffinity(0, sizeof old, &old) == 0);
    CPU_ZERO(&one);
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &old)) {
            CPU_SET(c, &one);
            break;
        }
    REQUIRE(sched_setaffinity(0, sizeof one, &one) == 0);
    CHECK(ft_affinity_cpus() == 1 && ft_usable_cpus() == 1);
    if (!getenv("FLEXTIER_THREADS")) CHECK(ft_default_threads() == 1);
    REQUIRE(sched_setaffinity(0, sizeof old, &old) == 0);
    CHECK(ft_affinity_cpus() == aff);
}

/* `taskset -c 0 flextier run` decodes with one compute thread, says so,
 * and an explicit --threads 2 is kept with a warning. */
TEST(taskset_run_picks_one_thread)
{
    if (ft_sh("command -v taskset > /dev/null") != 0) {
        printf("  taskset not found: skipped\n");
        return;
    }
    char dir[256];
    snprintf(dir, sizeof dir, "/tmp/ft_cpus_run_%d", (int)getpid());
    REQUIRE(ft_sh("rm -rf %s && mkdir -p %s && %s gen-model --arch llama --out %s/m --hidden 64 --layers 2 --heads 4 --kv-heads 2 "
                  "--ffn 96 --seed 3 > /dev/null", dir, dir, ft_test_bin(), dir) == 0);
    CHECK(ft_sh("env -u FLEXTIER_THREADS taskset -c 0 %s run --model %s/m --prompt hi --max-new-tokens 4 --temperature 0 "
                "> /dev/null 2> %s/e1", ft_test_bin(), dir, dir) == 0);
    CHECK(ft_file_has(dir, "e1", "; 1 compute thread\n"));
    CHECK(!ft_file_has(dir, "e1", "warning"));
    CHECK(ft_sh("env -u FLEXTIER_THREADS taskset -c 0 %s run --model %s/m --prompt hi --max-new-tokens 4 --temperature 0 "
                "--threads 2 > /dev/null 2> %s/e2", ft_test_bin(), dir, dir) == 0);
    CHECK(ft_file_has(dir, "e2", "; 2 compute threads"));
    CHECK(ft_file_has(dir, "e2", "warning: --threads 2 is more than the 1 CPU this process may use"));
    /* bench run reports its threads in the JSON */
    CHECK(ft_sh("env -u FLEXTIER_THREADS taskset -c 0 %s bench run --model %s/m --prompt-len 4 --gen-len 2 --json "
                "> %s/b.json 2> /dev/null", ft_test_bin(), dir, dir) == 0);
    CHECK(ft_file_has(dir, "b.json", "\"threads\":1,"));
    ft_sh("rm -rf %s", dir);
}
