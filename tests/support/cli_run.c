/* Test support: the CLI runner (cli_run.h). One copy of what the CLI and
 * engine tests each used to carry. */
#include "cli_run.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

const char *ft_test_bin(void)
{
    const char *b = getenv("FT_BIN");
    return b ? b : "./flextier";
}

int ft_sh(const char *fmt, ...)
{
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    int len = vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    if (len < 0 || (size_t)len >= sizeof cmd) {
        fprintf(stderr, "  ft_sh: command of %d bytes does not fit\n", len);
        return -1;
    }
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

char *ft_slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *b = NULL;
    long sz = -1;
    if (fseek(f, 0, SEEK_END) == 0) sz = ftell(f);
    if (sz >= 0 && fseek(f, 0, SEEK_SET) == 0) b = malloc((size_t)sz + 1);
    if (b) {
        size_t r = fread(b, 1, (size_t)sz, f);
        b[r] = 0;
        if (n) *n = r;
    }
    fclose(f);
    return b;
}

int ft_file_has(const char *dir, const char *name, const char *needle)
{
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    char *s = ft_slurp(p, NULL);
    int ok = s && strstr(s, needle);
    if (!ok) fprintf(stderr, "  %s lacks \"%s\": %s\n", name, needle, s ? s : "(missing)");
    free(s);
    return ok;
}

static char g_tmpdirs[8][256];
static int g_ntmpdirs;

static void rm_tmpdirs(void)
{
    for (int i = 0; i < g_ntmpdirs; i++) ft_sh("rm -rf '%s'", g_tmpdirs[i]);
}

const char *ft_test_tmpdir(const char *tag)
{
    if (g_ntmpdirs == 8) { fprintf(stderr, "ft_test_tmpdir: more than 8\n"); exit(1); }
    char *d = g_tmpdirs[g_ntmpdirs];
    snprintf(d, sizeof g_tmpdirs[0], "/tmp/ft_%s_XXXXXX", tag);
    if (!mkdtemp(d)) { perror("mkdtemp"); exit(1); }
    if (g_ntmpdirs++ == 0) atexit(rm_tmpdirs);
    return d;
}
