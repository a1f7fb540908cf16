/* The CUDA backend as a plugin (src/cuda/cuda_loader.c, docs/cuda.md "The
 * plugin"), in every build:
 *   - a process maps no CUDA library until it asks for CUDA; then, in a
 *     build with the backend, libflextier-cuda.so is mapped (through
 *     dlopen: also over the FT_CUDA=FAKE emulation);
 *   - `flextier --version`, `--help` and a CPU run load no CUDA library
 *     (LD_DEBUG=files) and run under `ulimit -v 700000`;
 *   - `--device cuda` loads the plugin and says why it cannot run (no GPU:
 *     "no NVIDIA GPU or driver found"; no backend: "this build has no CUDA
 *     backend");
 *   - FLEXTIER_CUDA_PLUGIN: a missing file, a library that is not the
 *     plugin, a copy of the plugin, and a plugin of another build (its
 *     build id patched) each get their answer. */
#define _GNU_SOURCE
#include "ft_test.h"
#include "support/cli_run.h"
#include "flextier/cuda.h"

#include <ctype.h>
#include <link.h>
#include <unistd.h>

static const char *tmp;
static char model[512];

/* (procfs files have no size: read line by line) */
static int maps_has(const char *needle)
{
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) return 0;
    char line[4096];
    int has = 0;
    while (!has && fgets(line, sizeof line, f)) has = strstr(line, needle) != NULL;
    fclose(f);
    return has;
}

static int have_model(void)
{
    if (model[0]) return 1;
    tmp = ft_test_tmpdir("cuda_plugin");
    snprintf(model, sizeof model, "%s/m", tmp);
    return ft_sh("%s gen-model --arch llama --out %s --hidden 64 --layers 2 --heads 4 --kv-heads 2 --ffn 96 "
                 "--seed 5 > /dev/null", ft_test_bin(), model) == 0;
}

/* Runs first (tests run in the order they are defined): nothing before it
 * has called the CUDA API. */
TEST(process_maps_cuda_only_when_asked)
{
    CHECK(!maps_has("libcudart") && !maps_has("libcublas") && !maps_has("libflextier-cuda"));
    char why[1024];
    ft_status st = ft_cuda_available(why, sizeof why);
    printf("  ft_cuda_available: %s: %s\n", ft_status_str(st), why);
    if (ft_cuda_built()) {
        CHECK_MSG(maps_has("/libflextier-cuda.so"), "the plugin is not mapped after ft_cuda_available");
    } else {
        CHECK(st == FT_ERR_UNSUPPORTED && strstr(why, "this build has no CUDA backend") == why);
        CHECK(!maps_has("libflextier-cuda"));
    }
    if (st != FT_OK && ft_cuda_built())
        CHECK_MSG(strstr(why, "no NVIDIA GPU or driver found") == why || strstr(why, "no usable CUDA device") == why,
                  "%s", why);
    /* the answer is the same the second time (loaded once) */
    char why2[1024];
    CHECK(ft_cuda_available(why2, sizeof why2) == st && !strcmp(why, why2));
}

/* LD_DEBUG=files lists every library the dynamic loader opens. */
TEST(cli_cpu_loads_no_cuda_library)
{
    REQUIRE(have_model());
    static const char *const runs[] = {"--version", "--help", "run --model %s --prompt hi --max-new-tokens 4 --temperature 0"};
    for (int i = 0; i < 3; i++) {
        char args[1024];
        snprintf(args, sizeof args, runs[i], model);
        CHECK_MSG(ft_sh("env -u FLEXTIER_CUDA_PLUGIN LD_DEBUG=files %s %s > /dev/null 2> %s/ld%d", ft_test_bin(), args,
                        tmp, i) == 0, "%s", args);
        char name[16];
        snprintf(name, sizeof name, "ld%d", i);
        CHECK(ft_file_has(tmp, name, "file="));   /* LD_DEBUG works: the check below can see */
        CHECK_MSG(ft_sh("grep -E 'file=.*(libcudart|libcublas|libflextier-cuda|libcuda\\.)' %s/%s", tmp, name) == 1,
                  "%s loads a CUDA library", args);
    }
    /* the positive control: --device cuda does open the plugin */
    if (ft_cuda_built()) {
        CHECK(ft_sh("env -u FLEXTIER_CUDA_PLUGIN LD_DEBUG=files %s run --model %s --prompt hi --max-new-tokens 2 "
                    "--temperature 0 --device cuda > /dev/null 2> %s/ldc", ft_test_bin(), model, tmp) <= 1);
        CHECK(ft_sh("grep -q 'file=.*libflextier-cuda.so' %s/ldc", tmp) == 0);
    }
#ifndef __SANITIZE_ADDRESS__   /* ASan reserves terabytes of address space */
    for (int i = 0; i < 3; i++) {
        char args[1024];
        snprintf(args, sizeof args, runs[i], model);
        CHECK_MSG(ft_sh("ulimit -v 700000 && %s %s > /dev/null 2>&1", ft_test_bin(), args) == 0,
                  "%s under ulimit -v 700000", args);
    }
#endif
}

TEST(device_cuda_says_why)
{
    REQUIRE(have_model());
    char why[1024];
    if (ft_cuda_available(why, sizeof why) == FT_OK) {
        printf("  a CUDA device can be used (%s): the answers without one are exercised elsewhere\n", why);
        return;
    }
    int rc = ft_sh("env -u FLEXTIER_CUDA_PLUGIN %s run --model %s --prompt hi --device cuda > /dev/null 2> %s/e",
                   ft_test_bin(), model, tmp);
    CHECK(rc == 1);
    CHECK(ft_file_has(tmp, "e", ft_cuda_built() ? "CUDA device: no " : "CUDA device: this build has no CUDA backend"));
    if (ft_cuda_built()) CHECK(!ft_sh("grep -qE 'NVIDIA GPU or driver found|no usable CUDA device' %s/e", tmp));
    /* without a GPU, not the runtime's misleading "driver version is insufficient" */
    if (!ft_sh("grep -q 'no NVIDIA GPU or driver found' %s/e", tmp)) CHECK(ft_sh("grep -q insufficient %s/e", tmp) == 1);
}

/* The first shared library of this process that is not the plugin (a
 * real ELF object that has no plugin entry point). */
static int other_lib(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    const char *n = info->dlpi_name;
    if (n && n[0] == '/' && strstr(n, ".so") && !strstr(n, "flextier-cuda") && !strstr(n, "ld-linux")) {
        snprintf(arg, 512, "%s", n);
        return 1;
    }
    return 0;
}

TEST(plugin_override_and_refusals)
{
    REQUIRE(have_model());
    const char *run = "run --model %s --prompt hi --max-new-tokens 2 --temperature 0 --device cuda";
    char args[1024];
    snprintf(args, sizeof args, run, model);
    CHECK(ft_sh("FLEXTIER_CUDA_PLUGIN=/nonexistent/x.so %s %s > /dev/null 2> %s/o1", ft_test_bin(), args, tmp) == 1);
    CHECK(ft_file_has(tmp, "o1", "FLEXTIER_CUDA_PLUGIN=/nonexistent/x.so: no such file"));
    char lib[512] = "";
    dl_iterate_phdr(other_lib, lib);
    REQUIRE(lib[0]);
    CHECK(ft_sh("FLEXTIER_CUDA_PLUGIN=%s %s %s > /dev/null 2> %s/o2", lib, ft_test_bin(), args, tmp) == 1);
    CHECK(ft_file_has(tmp, "o2", "is not a FlexTier CUDA backend plugin"));
    if (!ft_cuda_built()) return;

    /* the plugin the program finds beside itself, copied elsewhere */
    char plugin[600];
    snprintf(plugin, sizeof plugin, "%s", ft_test_bin());
    char *slash = strrchr(plugin, '/');
    REQUIRE(slash);
    snprintf(slash + 1, sizeof plugin - (size_t)(slash + 1 - plugin), "libflextier-cuda.so");
    REQUIRE(access(plugin, R_OK) == 0);
    CHECK(ft_sh("cp %s %s/copy.so", plugin, tmp) == 0);
    int rc_default = ft_sh("env -u FLEXTIER_CUDA_PLUGIN %s %s > %s/d.out 2> %s/d.err", ft_test_bin(), args, tmp, tmp);
    int rc_copy = ft_sh("FLEXTIER_CUDA_PLUGIN=%s/copy.so LD_DEBUG=files %s %s > %s/c.out 2> %s/c.err", tmp, ft_test_bin(),
                        args, tmp, tmp);
    CHECK(rc_default == rc_copy);
    CHECK(ft_sh("cmp -s %s/d.out %s/c.out", tmp, tmp) == 0);
    CHECK(ft_sh("grep -q 'file=%s/copy.so' %s/c.err", tmp, tmp) == 0);

    /* the same plugin with another build id: refused before it is used */
    size_t n = 0;
    char *bytes = ft_slurp(plugin, &n);
    REQUIRE(bytes);
    const char *prefix = FT_VERSION_STRING "-";
    size_t pl = strlen(prefix);
    int patched = 0;
    for (char *p = bytes; p && p + pl + 16 <= bytes + n; p = memmem(p + 1, (size_t)(bytes + n - p - 1), prefix, pl)) {
        if (memcmp(p, prefix, pl)) continue;
        int hex = 1;
        for (size_t k = 0; k < 16; k++) hex &= isxdigit((unsigned char)p[pl + k]) != 0;
        if (!hex || p[pl + 16]) continue;
        p[pl] = p[pl] == '0' ? '1' : '0';
        patched++;
    }
    CHECK(patched == 1);
    char other[600];
    snprintf(other, sizeof other, "%s/other.so", tmp);
    FILE *f = fopen(other, "wb");
    REQUIRE(f);
    CHECK(fwrite(bytes, 1, n, f) == n);
    fclose(f);
    free(bytes);
    CHECK(ft_sh("FLEXTIER_CUDA_PLUGIN=%s %s %s > /dev/null 2> %s/o3", other, ft_test_bin(), args, tmp) == 1);
    CHECK(ft_file_has(tmp, "o3", "is from another build of FlexTier"));
}
