#include "ft_test.h"
#include "flextier/core.h"
#include "core/convert_simd.h"

#include <math.h>
#include <stdatomic.h>

static uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

TEST(status_strings)
{
    CHECK(!strcmp(ft_status_str(FT_OK), "success"));
    CHECK(!strcmp(ft_status_str(FT_ERR_CORRUPT), "corrupt data"));
    CHECK(strlen(ft_status_str((ft_status)-999)) > 0);
    CHECK(ft_set_error(FT_ERR_IO, "file %s", "x") == FT_ERR_IO);
    CHECK(!strcmp(ft_last_error(), "file x"));
    /* adding context to the previous detail (aliased argument) */
    ft_set_error(FT_ERR_IO, "outer: %s", ft_last_error());
    CHECK(!strcmp(ft_last_error(), "outer: file x"));
}

TEST(dtype_and_shape)
{
    ft_dtype d;
    CHECK_OK(ft_dtype_parse("bfloat16", &d)); CHECK(d == FT_BF16);
    CHECK_OK(ft_dtype_parse("f32", &d)); CHECK(d == FT_F32);
    CHECK(ft_dtype_parse("f64", &d) == FT_ERR_INVALID_ARG);
    CHECK(ft_dtype_nbytes(FT_Q4, 3) == 2);
    CHECK(ft_dtype_nbytes(FT_BF16, 3) == 6);
    uint32_t nd; int64_t sh[FT_MAX_DIMS];
    CHECK_OK(ft_shape_parse("4096,11008", &nd, sh));
    CHECK(nd == 2 && sh[0] == 4096 && sh[1] == 11008);
    CHECK_OK(ft_shape_parse("2x3x4", &nd, sh)); CHECK(nd == 3 && sh[2] == 4);
    CHECK_OK(ft_shape_parse("", &nd, sh)); CHECK(nd == 0);
    CHECK(ft_shape_parse("1,2,3,4,5,6,7,8,9", &nd, sh) == FT_ERR_INVALID_ARG);
    CHECK(ft_shape_parse("-1", &nd, sh) == FT_ERR_INVALID_ARG);
    CHECK(ft_shape_parse("4,", &nd, sh) == FT_ERR_INVALID_ARG);
    CHECK(ft_shape_parse("99999999999,99999999999", &nd, sh) == FT_ERR_INVALID_ARG);
    ft_tensor t;
    int64_t s2[2] = {3, 5};
    CHECK_OK(ft_tensor_init(&t, FT_F16, 2, s2, NULL));
    uint64_t nb; CHECK_OK(ft_tensor_nbytes(&t, &nb)); CHECK(nb == 30);
    char buf[64]; ft_shape_format(2, s2, buf, sizeof buf); CHECK(!strcmp(buf, "[3, 5]"));
}

/* The f32->f16 reference agrees with the hardware F16C conversion, an
 * independent oracle, on special values and random bit patterns. */
TEST(f16_ref_matches_hardware)
{
    if (!ft_cpu()->f16c || !ft_cpu()->avx2) { printf("  (no F16C: skipped)\n"); return; }
    enum { N = 1 << 20 };
    float *src = malloc(N * sizeof(float));
    uint16_t *a = malloc(N * 2), *b = malloc(N * 2);
    uint64_t s = 42;
    static const uint32_t special[] = {0, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u,
        0x7f800001u, 0xffc12345u, 0x477fefffu, 0x477ff000u, 0x47800000u, 0x38800000u,
        0x387fffffu, 0x33000000u, 0x33000001u, 0x337fffffu, 0x3f800000u, 0x00000001u};
    for (size_t i = 0; i < N; i++) {
        uint32_t u = (uint32_t)ft_test_rand(&s);
        if (i % 4 == 1) u = (u & 0x87ffffffu) | 0x30000000u;  /* f16 range-ish */
        if (i < sizeof special / 4) u = special[i];
        src[i] = u2f(u);
    }
    ft_f32_to_f16_ref(a, src, N);
    size_t k = ft_f32_to_f16_f16c(b, src, N);
    CHECK(k == N);
    size_t bad = 0;
    for (size_t i = 0; i < N; i++) if (a[i] != b[i] && bad++ < 5)
        fprintf(stderr, "  f32 %08x: ref %04x hw %04x\n", f2u(src[i]), a[i], b[i]);
    CHECK(bad == 0);
    free(src); free(a); free(b);
}

TEST(f16_to_f32_exhaustive)
{
    float ref[65536], simd[65536];
    uint16_t h[65536];
    for (int i = 0; i < 65536; i++) h[i] = (uint16_t)i;
    ft_f16_to_f32_ref(ref, h, 65536);
    ft_f16_to_f32(simd, h, 65536);
    int bad = 0;
    for (int i = 0; i < 65536; i++) {
        if (f2u(ref[i]) != f2u(simd[i])) bad++;
        /* round trip f16 -> f32 -> f16 is exact (NaNs stay NaNs, quiet) */
        uint16_t back = ft_f32_to_f16_1(ref[i]);
        int nan = (h[i] & 0x7c00) == 0x7c00 && (h[i] & 0x3ff);
        if (nan ? ((back & 0x7e00) != 0x7e00) : back != h[i]) bad++;
    }
    CHECK(bad == 0);
    CHECK(ft_f16_to_f32_1(0x3c00) == 1.0f);
    CHECK(ft_f16_to_f32_1(0x0001) == 5.9604644775390625e-8f);
    CHECK(isinf(ft_f16_to_f32_1(0xfc00)) && ft_f16_to_f32_1(0xfc00) < 0);
}

TEST(bf16_rounding)
{
    CHECK(ft_f32_to_bf16_1(1.0f) == 0x3f80);
    CHECK(ft_f32_to_bf16_1(u2f(0x3f808000u)) == 0x3f80);   /* tie to even (down) */
    CHECK(ft_f32_to_bf16_1(u2f(0x3f818000u)) == 0x3f82);   /* tie to even (up) */
    CHECK(ft_f32_to_bf16_1(u2f(0x3f808001u)) == 0x3f81);
    CHECK(ft_f32_to_bf16_1(u2f(0x7f7fffffu)) == 0x7f80);   /* overflow to inf */
    CHECK(ft_f32_to_bf16_1(u2f(0x7f800000u)) == 0x7f80);
    CHECK(ft_f32_to_bf16_1(u2f(0x7f800001u)) == 0x7fc0);   /* sNaN -> qNaN */
    CHECK(ft_f32_to_bf16_1(u2f(0x00000001u)) == 0x0000);   /* subnormal rounds */
    CHECK(ft_f32_to_bf16_1(u2f(0x00018000u)) == 0x0002);   /* subnormal kept */
    CHECK(ft_bf16_to_f32_1(0x4049) == u2f(0x40490000u));
}

TEST(bf16_simd_matches_ref)
{
    enum { N = (1 << 18) + 13 };
    float *src = malloc(N * 4), *fa = malloc(N * 4), *fb = malloc(N * 4);
    uint16_t *a = malloc(N * 2), *b = malloc(N * 2);
    uint64_t s = 7;
    for (size_t i = 0; i < N; i++) src[i] = u2f((uint32_t)ft_test_rand(&s));
    src[0] = u2f(0x7f800001u); src[1] = u2f(0x00018000u); src[2] = u2f(0x3f808000u);
    ft_f32_to_bf16_ref(a, src, N);
    int bad = 0;
    if (ft_cpu()->avx512f && ft_cpu()->avx512bw) {
        size_t k = ft_f32_to_bf16_avx512(b, src, N);
        for (size_t i = 0; i < k; i++) bad += a[i] != b[i];
        CHECK(k > N - 16);
    }
    if (ft_cpu()->avx2) {
        size_t k = ft_f32_to_bf16_avx2(b, src, N);
        for (size_t i = 0; i < k; i++) bad += a[i] != b[i];
        ft_bf16_to_f32_ref(fa, a, N);
        k = ft_bf16_to_f32_avx2(fb, a, N);
        for (size_t i = 0; i < k; i++) bad += f2u(fa[i]) != f2u(fb[i]);
    }
    ft_f32_to_bf16(b, src, N);   /* dispatcher, incl. tail */
    for (size_t i = 0; i < N; i++) bad += a[i] != b[i];
    CHECK(bad == 0);
    free(src); free(fa); free(fb); free(a); free(b);
}

TEST(convert_any)
{
    float f[5] = {1.5f, -2.25f, 65504.0f, 1e-8f, 3.14159f}, back[5];
    uint16_t h[5], bf[5], h2[5];
    CHECK_OK(ft_convert(h, FT_F16, f, FT_F32, 5));
    CHECK_OK(ft_convert(bf, FT_BF16, h, FT_F16, 5));
    CHECK_OK(ft_convert(h2, FT_F16, bf, FT_BF16, 5));
    CHECK_OK(ft_convert(back, FT_F32, bf, FT_BF16, 5));
    CHECK(back[0] == 1.5f && back[1] == -2.25f);
    CHECK(ft_convert(h, FT_I8, f, FT_F32, 5) == FT_ERR_UNSUPPORTED);
}

static void pool_fn(void *arg, size_t i, unsigned w)
{
    atomic_ullong *sum = arg;
    atomic_fetch_add(sum, (unsigned long long)i + 1);
    (void)w;
}

TEST(thread_pool)
{
    for (unsigned n = 1; n <= 4; n++) {
        ft_pool *p;
        CHECK_OK(ft_pool_create(n, &p));
        CHECK(ft_pool_size(p) == n);
        for (int rep = 0; rep < 50; rep++) {
            atomic_ullong sum = 0;
            ft_pool_run(p, 1000, pool_fn, &sum);
            CHECK(sum == 500500ull);
        }
        ft_pool_free(p);
    }
    ft_pool_free(NULL);
}

/* ft_pool_set_spin_us: after a job the worker spins that long for the
 * next one (its CPU time grows while the caller sleeps), 0: it sleeps at
 * once (a memory node's copiers: a spinning worker takes a core from the
 * client beside it). FLEXTIER_SPIN_US, when set, wins over the call. */
TEST(pool_spin_setting)
{
    const char *env = getenv("FLEXTIER_SPIN_US");
    char saved[32] = "";
    if (env) snprintf(saved, sizeof saved, "%s", env);
    unsetenv("FLEXTIER_SPIN_US");
    ft_pool *p;
    CHECK_OK(ft_pool_create(2, &p));
    atomic_ullong sum = 0;
    ft_pool_set_spin_us(p, 400000);
    ft_pool_run(p, 100, pool_fn, &sum);
    double c0 = ft_test_cpu_s();
    ft_test_nap_ms(100);
    double spun = ft_test_cpu_s() - c0;
    ft_pool_set_spin_us(p, 0);
    ft_pool_run(p, 100, pool_fn, &sum);   /* the worker's wait after this job: no spin */
    ft_test_nap_ms(20);
    c0 = ft_test_cpu_s();
    ft_test_nap_ms(100);
    double slept = ft_test_cpu_s() - c0;
    CHECK(sum == 2 * 5050ull);
    CHECK_MSG(spun > 0.02, "spinning 400 ms: %.1f ms of CPU in 100", 1e3 * spun);
    CHECK_MSG(slept < 0.01, "no spin: %.1f ms of CPU in 100", 1e3 * slept);
    ft_pool_set_spin_us(NULL, 0);
    ft_pool_free(p);
    /* FLEXTIER_SPIN_US=0: asking for 400 ms of spin changes nothing */
    setenv("FLEXTIER_SPIN_US", "0", 1);
    CHECK_OK(ft_pool_create(2, &p));
    ft_pool_set_spin_us(p, 400000);
    ft_pool_run(p, 100, pool_fn, &sum);
    ft_test_nap_ms(20);
    c0 = ft_test_cpu_s();
    ft_test_nap_ms(100);
    double pinned = ft_test_cpu_s() - c0;
    CHECK_MSG(pinned < 0.01, "FLEXTIER_SPIN_US=0: %.1f ms of CPU in 100", 1e3 * pinned);
    ft_pool_free(p);
    if (env) setenv("FLEXTIER_SPIN_US", saved, 1);
    else unsetenv("FLEXTIER_SPIN_US");
}

TEST(aligned_allocation)
{
    void *p = ft_malloc_aligned(100, 64);
    CHECK(p && ((uintptr_t)p & 63) == 0);
    ft_free_aligned(p);
    CHECK(ft_malloc_aligned(0, 64) == NULL);
    CHECK(ft_malloc_aligned(10, 3) == NULL);
    ft_free_aligned(NULL);
}

#include <xxhash.h>
/* The run-time dispatched XXH3 equals libxxhash's on all sizes/seeds. */
TEST(xxh3_matches_library)
{
    uint8_t *buf = malloc(1 << 20);
    uint64_t s = 99;
    for (size_t i = 0; i < (1 << 20); i++) buf[i] = (uint8_t)ft_test_rand(&s);
    int bad = 0;
    for (size_t n = 0; n < 300; n++) bad += ft_xxh3(buf + n % 7, n) != XXH3_64bits(buf + n % 7, n);
    for (size_t n = 300; n < (1 << 20); n = n * 3 + 17) {
        bad += ft_xxh3(buf, n) != XXH3_64bits(buf, n);
        bad += ft_xxh3_seed(buf, n, n * 77) != XXH3_64bits_withSeed(buf, n, n * 77);
    }
    CHECK(bad == 0);
    free(buf);
}

/* The run-time version is the headers' (this test links the library it was
 * compiled with), and the string is the numbers. */
TEST(version)
{
    CHECK(ft_version_number() == FT_VERSION_NUMBER);
    CHECK(!strcmp(ft_version_string(), FT_VERSION_STRING));
    char want[32];
    snprintf(want, sizeof want, "%d.%d.%d", FT_VERSION_MAJOR, FT_VERSION_MINOR, FT_VERSION_PATCH);
    CHECK(!strcmp(FT_VERSION_STRING, want));
    CHECK(FT_VERSION_NUMBER == FT_VERSION_MAJOR * 10000 + FT_VERSION_MINOR * 100 + FT_VERSION_PATCH);
}

/* The synthetic-weights generator: deterministic in the seed, the same
 * values in every float dtype (up to the dtype's rounding), rows with
 * their own scale around sigma 0.02, bad arguments refused. */
TEST(synth_weights)
{
    enum { N = 64 * 1024, ROW = 1024 };
    float *a = ft_malloc_aligned(N * 4, 64), *b = ft_malloc_aligned(N * 4, 64);
    uint16_t *h = ft_malloc_aligned(N * 2, 64);
    REQUIRE(a && b && h);
    CHECK_OK(ft_synth_weights(FT_F32, N, ROW, 5, a));
    CHECK_OK(ft_synth_weights(FT_F32, N, ROW, 5, b));
    CHECK(!memcmp(a, b, N * 4));
    CHECK_OK(ft_synth_weights(FT_F32, N, ROW, 6, b));
    CHECK(memcmp(a, b, N * 4) != 0);
    CHECK_OK(ft_synth_weights(FT_BF16, N, ROW, 5, h));
    int same = 1;
    for (size_t i = 0; i < N; i++) same &= h[i] == ft_f32_to_bf16_1(a[i]);
    CHECK(same);
    /* per-row standard deviations: each row has its own, all near 0.02
     * (exp(0.25 N(0,1)) stays within [0.3, 3.3] over 64 rows) */
    double lo = 1, hi = 0, mean_sd = 0;
    for (size_t r = 0; r < N / ROW; r++) {
        double ss = 0;
        for (size_t i = 0; i < ROW; i++) ss += (double)a[r * ROW + i] * a[r * ROW + i];
        double sd = sqrt(ss / ROW);
        lo = sd < lo ? sd : lo;
        hi = sd > hi ? sd : hi;
        mean_sd += sd / (N / ROW);
    }
    CHECK_MSG(lo > 0.006 && hi < 0.066 && hi / lo > 1.3, "row sd %g..%g", lo, hi);
    CHECK_MSG(mean_sd > 0.015 && mean_sd < 0.027, "mean row sd %g", mean_sd);
    CHECK(ft_synth_weights(FT_I32, N, ROW, 5, a) == FT_ERR_INVALID_ARG);
    CHECK(ft_synth_weights(FT_F32, N, 0, 5, a) == FT_ERR_INVALID_ARG);
    CHECK(ft_synth_weights(FT_F32, N, ROW, 5, NULL) == FT_ERR_INVALID_ARG);
    CHECK_OK(ft_synth_weights(FT_F32, 0, ROW, 5, NULL));
    ft_free_aligned(a);
    ft_free_aligned(b);
    ft_free_aligned(h);
}
