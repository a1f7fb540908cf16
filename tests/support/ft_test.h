/* Minimal test harness: TEST(name) { CHECK(...); } and a main that runs
 * every test, prints per-failure locations and "N passed, N failed". */
#ifndef FT_TEST_H
#define FT_TEST_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>

typedef void (*ft_test_fn)(void);
struct ft_test_entry { const char *name; ft_test_fn fn; };
#define FT_MAX_TESTS 256
static struct ft_test_entry ft_tests[FT_MAX_TESTS];
static int ft_ntests, ft_cur_failed, ft_checks;

#define TEST(name)                                                        \
    static void name(void);                                               \
    __attribute__((constructor)) static void reg_##name(void) {           \
        if (ft_ntests < FT_MAX_TESTS)                                     \
            ft_tests[ft_ntests++] = (struct ft_test_entry){#name, name};  \
    }                                                                     \
    static void name(void)

#define CHECK(cond) do { ft_checks++; if (!(cond)) { ft_cur_failed++;      \
    fprintf(stderr, "  FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond); } } while (0)
#define CHECK_MSG(cond, ...) do { ft_checks++; if (!(cond)) { ft_cur_failed++; \
    fprintf(stderr, "  FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);        \
    fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } } while (0)
#define CHECK_OK(expr) do { ft_status st_ = (expr); ft_checks++;           \
    if (st_ != FT_OK) { ft_cur_failed++; fprintf(stderr,                    \
    "  FAIL %s:%d: %s -> %s (%s)\n", __FILE__, __LINE__, #expr,              \
    ft_status_str(st_), ft_last_error()); } } while (0)
/* Evaluates cond once (it may have side effects, e.g. start a server). */
#define REQUIRE(cond) do { int ok_ = !!(cond); ft_checks++;                 \
    if (!ok_) { ft_cur_failed++; fprintf(stderr, "  FAIL %s:%d: %s\n",    \
    __FILE__, __LINE__, #cond); return; } } while (0)

/* Deterministic PRNG for tests (splitmix64, from core.h). */
#include "flextier/core.h"
static inline uint64_t ft_test_rand(uint64_t *s) { return ft_rand_u64(s); }

/* The process's CPU time (all threads), seconds; a sleep of ms
 * milliseconds (resumed after a signal). */
#include <time.h>
static inline double ft_test_cpu_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}
static inline void ft_test_nap_ms(long ms)
{
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&t, &t) != 0) {}
}

/* Arguments: NAME runs the tests whose name contains NAME; -NAME skips
 * them (the aarch64 build under qemu skips a few exhaustive,
 * architecture-independent ones: tests/codec/CMakeLists.txt). */
static int ft_test_selected(const char *name, int argc, char **argv)
{
    int any_pos = 0, hit = 0;
    for (int a = 1; a < argc; a++) {
        if (argv[a][0] == '-') {
            if (strstr(name, argv[a] + 1)) return 0;
        } else {
            any_pos = 1;
            if (strstr(name, argv[a])) hit = 1;
        }
    }
    return !any_pos || hit;
}

int main(int argc, char **argv)
{
    int passed = 0, failed = 0;
    /* line by line: a test killed by ctest's timeout still shows how far
     * it got (a pipe would hold the lines in a buffer that dies with it) */
    setvbuf(stdout, NULL, _IOLBF, 0);
    for (int i = 0; i < ft_ntests; i++) {
        if (!ft_test_selected(ft_tests[i].name, argc, argv)) continue;
        ft_cur_failed = 0;
        ft_tests[i].fn();
        if (ft_cur_failed) { failed++; printf("FAIL %s\n", ft_tests[i].name); }
        else { passed++; printf("ok   %s\n", ft_tests[i].name); }
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
#endif
