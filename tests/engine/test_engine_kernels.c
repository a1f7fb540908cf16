/* SIMD kernels against their scalar _ref twins, on odd sizes (tails). */
#include "ft_test.h"
#include "engine/kernels.h"
#include "flextier/core.h"

#include <math.h>

static uint64_t seed = 42;
static void fill(float *x, int n, float scale)
{
    for (int i = 0; i < n; i++)
        x[i] = scale * ((float)(ft_test_rand(&seed) >> 40) / (float)(1 << 24) * 2.0f - 1.0f);
}

static int close_rel(const float *a, const float *b, int n, float tol)
{
    for (int i = 0; i < n; i++) {
        float d = fabsf(a[i] - b[i]), s = fabsf(b[i]) > 1 ? fabsf(b[i]) : 1;
        if (!(d <= tol * s)) { fprintf(stderr, "  at %d: %.9g vs %.9g\n", i, a[i], b[i]); return 0; }
    }
    return 1;
}

static const int sizes[] = {1, 3, 7, 8, 15, 16, 17, 31, 33, 64, 100, 128, 173, 1000};
#define NS (int)(sizeof sizes / sizeof sizes[0])

TEST(dispatch_reports)
{
    const char *impl = ft_k_impl();
    printf("  kernels: %s\n", impl);
    CHECK(!strcmp(impl, "scalar") || !strcmp(impl, "avx2") || !strcmp(impl, "avx512"));
}

TEST(dot_axpy)
{
    float a[1000], b[1000], y1[1000], y2[1000];
    for (int s = 0; s < NS; s++) {
        int n = sizes[s];
        fill(a, n, 1); fill(b, n, 1);
        float r = ft_k_dot_ref(a, b, n), x = ft_k_dot(a, b, n);
        CHECK_MSG(fabsf(r - x) <= 1e-5f * (1 + fabsf(r)) * sqrtf((float)n), "dot n=%d %g vs %g", n, x, r);
        fill(y1, n, 1);
        memcpy(y2, y1, sizeof(float) * (size_t)n);
        ft_k_axpy_ref(y1, 0.37f, a, n);
        ft_k_axpy(y2, 0.37f, a, n);
        CHECK_MSG(close_rel(y2, y1, n, 1e-6f), "axpy n=%d", n);
    }
}

TEST(norms)
{
    float x[1000], w[1000], b[1000], o1[1000], o2[1000];
    for (int s = 0; s < NS; s++) {
        int n = sizes[s];
        fill(x, n, 3); fill(w, n, 1); fill(b, n, 1);
        ft_k_rmsnorm_ref(o1, x, w, n, 1e-5f);
        ft_k_rmsnorm(o2, x, w, n, 1e-5f);
        CHECK_MSG(close_rel(o2, o1, n, 1e-5f), "rmsnorm n=%d", n);
        ft_k_layernorm_ref(o1, x, w, b, n, 1e-5f);
        ft_k_layernorm(o2, x, w, b, n, 1e-5f);
        CHECK_MSG(close_rel(o2, o1, n, 1e-4f), "layernorm n=%d", n);
        ft_k_layernorm_ref(o1, x, NULL, NULL, n, 1e-5f);
        ft_k_layernorm(o2, x, NULL, NULL, n, 1e-5f);
        CHECK_MSG(close_rel(o2, o1, n, 1e-4f), "layernorm (no affine) n=%d", n);
    }
    /* the reference itself: unit RMS after rmsnorm with w = 1 */
    for (int i = 0; i < 64; i++) w[i] = 1;
    fill(x, 64, 5);
    ft_k_rmsnorm_ref(o1, x, w, 64, 0);
    float ss = 0;
    for (int i = 0; i < 64; i++) ss += o1[i] * o1[i];
    CHECK(fabsf(ss / 64 - 1) < 1e-5f);
}

TEST(softmax_silu)
{
    float x[1000], y[1000], u[1000];
    for (int s = 0; s < NS; s++) {
        int n = sizes[s];
        fill(x, n, 20);
        memcpy(y, x, sizeof(float) * (size_t)n);
        ft_k_softmax_ref(x, n);
        ft_k_softmax(y, n);
        CHECK_MSG(close_rel(y, x, n, 2e-6f), "softmax n=%d", n);
        float sum = 0;
        for (int i = 0; i < n; i++) sum += y[i];
        CHECK(fabsf(sum - 1) < 1e-5f);
        fill(x, n, 30); fill(u, n, 2);
        memcpy(y, x, sizeof(float) * (size_t)n);
        ft_k_silu_mul_ref(x, u, n);
        ft_k_silu_mul(y, u, n);
        CHECK_MSG(close_rel(y, x, n, 2e-6f), "silu_mul n=%d", n);
    }
    float big[3] = {1000, -1000, 0};
    ft_k_softmax(big, 3);
    CHECK(fabsf(big[0] - 1) < 1e-6f && big[1] == 0);
}

TEST(rope)
{
    float x[4 * 128], y[4 * 128], c[64], sn[64];
    static const int hds[] = {2, 6, 16, 32, 64, 128};
    for (int k = 0; k < 6; k++) {
        int hd = hds[k];
        fill(x, 4 * hd, 2);
        for (int i = 0; i < hd / 2; i++) { c[i] = cosf(0.3f * (float)i); sn[i] = sinf(0.3f * (float)i); }
        memcpy(y, x, sizeof(float) * 4 * (size_t)hd);
        ft_k_rope_ref(x, 4, hd, c, sn);
        ft_k_rope(y, 4, hd, c, sn);
        CHECK_MSG(close_rel(y, x, 4 * hd, 1e-6f), "rope hd=%d", hd);
    }
    /* rotation preserves the norm of each (i, i + hd/2) pair */
    float v[4] = {1, 2, 3, 4}, cc[2] = {cosf(1), cosf(2)}, ss[2] = {sinf(1), sinf(2)};
    ft_k_rope_ref(v, 1, 4, cc, ss);
    CHECK(fabsf(v[0] * v[0] + v[2] * v[2] - 10) < 1e-5f);
    CHECK(fabsf(v[1] * v[1] + v[3] * v[3] - 20) < 1e-5f);
}
