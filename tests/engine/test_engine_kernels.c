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

TEST(matmul_rows)
{
    static float x[9 * 173], W[11 * 173], y1[9 * 16], y2[9 * 16], b[11];
    static const int ins[] = {1, 15, 16, 17, 64, 173};
    for (int k = 0; k < 6; k++) {
        int in = ins[k];
        for (int rows = 1; rows <= 9; rows += 4) {
            for (int nout = 1; nout <= 11; nout += 5) {
                fill(x, rows * in, 1); fill(W, nout * in, 1); fill(b, nout, 1);
                for (int wb = 0; wb < 2; wb++) {
                    ft_k_matmul_rows_ref(y1, 16, x, rows, W, nout, in, wb ? b : NULL);
                    ft_k_matmul_rows(y2, 16, x, rows, W, nout, in, wb ? b : NULL);
                    int ok = 1;
                    for (int r = 0; r < rows; r++)
                        ok &= close_rel(y2 + r * 16, y1 + r * 16, nout, 1e-5f * sqrtf((float)in));
                    CHECK_MSG(ok, "matmul_rows in=%d rows=%d nout=%d", in, rows, nout);
                }
            }
        }
    }
}

/* x transposed, 8..32 rows: the SIMD kernel equals the scalar twin bit for
 * bit, both are close to matmul_rows, and a row's result does not depend on
 * the number of rows. */
TEST(matmul_xt)
{
    static float x[32 * 300], W[29 * 300], xt[300 * 32] __attribute__((aligned(64))), b[29];
    static float y1[32 * 32], y2[32 * 32], y3[32 * 32];
    static const int ins[] = {1, 17, 64, 300};
    const ft_kernels *kn = ft_k_get();
    for (int k = 0; k < 4; k++) {
        int in = ins[k];
        for (int rows = 8; rows <= 32; rows += 3) {
            for (int nout = 1; nout <= 29; nout += 7) {
                fill(x, rows * in, 1); fill(W, nout * in, 1); fill(b, nout, 1);
                int ldx = rows <= 16 ? 16 : 32;
                ft_k_transpose_rows(xt, ldx, x, rows, in);
                for (int wb = 0; wb < 2; wb++) {
                    ft_k_matmul_xt_ref(y1, 32, xt, ldx, rows, W, nout, in, wb ? b : NULL);
                    ft_k_matmul_rows_ref(y3, 32, x, rows, W, nout, in, wb ? b : NULL);
                    int same = 1, ok = 1;
                    if (kn->matmul_xt) {
                        kn->matmul_xt(y2, 32, xt, ldx, rows, W, nout, in, wb ? b : NULL);
                        for (int r = 0; r < rows; r++) same &= !memcmp(y1 + r * 32, y2 + r * 32, nout * sizeof(float));
                    }
                    for (int r = 0; r < rows; r++) ok &= close_rel(y1 + r * 32, y3 + r * 32, nout, 1e-5f * sqrtf((float)in));
                    CHECK_MSG(same && ok, "matmul_xt in=%d rows=%d nout=%d bias=%d: simd==ref %d, close %d", in, rows,
                              nout, wb, same, ok);
                }
                /* the first 8 rows alone give the same bits */
                ft_k_transpose_rows(xt, 16, x, 8, in);
                ft_k_matmul_xt_ref(y3, 32, xt, 16, 8, W, nout, in, NULL);
                ft_k_transpose_rows(xt, ldx, x, rows, in);
                ft_k_matmul_xt_ref(y2, 32, xt, ldx, rows, W, nout, in, NULL);
                int same8 = 1;
                for (int r = 0; r < 8; r++) same8 &= !memcmp(y3 + r * 32, y2 + r * 32, nout * sizeof(float));
                CHECK_MSG(same8, "matmul_xt in=%d rows=%d nout=%d: rows depend on the row count", in, rows, nout);
            }
        }
    }
}

TEST(attend)
{
    static float q[200], K[70 * 300], V[70 * 300], o1[200], o2[200], s1[70], s2[70];
    static const int hds[] = {8, 16, 48, 64, 100, 128, 160};
    static const int nps[] = {1, 3, 4, 5, 17, 70};
    for (int a = 0; a < 7; a++)
        for (int b = 0; b < 6; b++) {
            int hd = hds[a], np = nps[b], ld = 300;
            fill(q, hd, 1); fill(K, np * ld, 1); fill(V, np * ld, 1);
            ft_k_attend_ref(o1, q, K, V, ld, np, hd, 0.3f, s1);
            ft_k_attend(o2, q, K, V, ld, np, hd, 0.3f, s2);
            CHECK_MSG(close_rel(o2, o1, hd, 1e-5f), "attend hd=%d npos=%d", hd, np);
            CHECK_MSG(close_rel(s2, s1, np, 1e-5f), "attend probs hd=%d npos=%d", hd, np);
        }
}

/* Segmented attention (sliding-window rings): split anywhere, it equals
 * attention over the contiguous positions; dispatched == _ref. */
TEST(attend_segs)
{
    static float q[128], K[70 * 130], V[70 * 130], o1[128], o2[128], o3[128], s1[70], s2[70], s3[70];
    static const int hds[] = {8, 64, 100, 128};
    static const int nps[] = {1, 2, 5, 17, 70};
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 5; b++) {
            int hd = hds[a], np = nps[b], ld = 130;
            fill(q, hd, 1); fill(K, np * ld, 1); fill(V, np * ld, 1);
            ft_k_attend_ref(o1, q, K, V, ld, np, hd, 0.3f, s1);
            for (int cut1 = 0; cut1 <= np; cut1 += (np > 6 ? 5 : 1))
                for (int cut2 = cut1; cut2 <= np; cut2 += (np > 6 ? 7 : 1)) {
                    ft_attn_seg seg[3] = {{K, V, cut1},
                                          {K + (size_t)cut1 * ld, V + (size_t)cut1 * ld, cut2 - cut1},
                                          {K + (size_t)cut2 * ld, V + (size_t)cut2 * ld, np - cut2}};
                    ft_k_attend_segs_ref(o2, q, seg, 3, ld, hd, 0.3f, s2);
                    ft_k_attend_segs(o3, q, seg, 3, ld, hd, 0.3f, s3);
                    CHECK_MSG(!memcmp(o2, o1, hd * sizeof(float)), "attend_segs_ref hd=%d np=%d cuts %d %d", hd,
                              np, cut1, cut2);
                    CHECK_MSG(close_rel(o3, o1, hd, 1e-5f), "attend_segs hd=%d np=%d cuts %d %d", hd, np, cut1, cut2);
                }
        }
}

/* The AVX2 tier directly (the dispatcher picks AVX-512 where it exists). */
#include "engine/kernels_simd.h"
TEST(avx2_tier)
{
    const ft_cpu_features *f = ft_cpu();
    if (!(f->avx2 && f->fma)) { printf("  (no AVX2: skipped)\n"); return; }
    float x[1000], y[1000], w[1000], b[1000], o1[1000], o2[1000];
    for (int s = 0; s < NS; s++) {
        int n = sizes[s];
        fill(x, n, 3); fill(y, n, 1); fill(w, n, 1); fill(b, n, 1);
        float r = ft_k_dot_ref(x, y, n), v = ft_k_dot_avx2(x, y, n);
        CHECK_MSG(fabsf(r - v) <= 1e-5f * (1 + fabsf(r)) * sqrtf((float)n), "dot_avx2 n=%d", n);
        memcpy(o1, y, sizeof(float) * (size_t)n); memcpy(o2, y, sizeof(float) * (size_t)n);
        ft_k_axpy_ref(o1, 0.5f, x, n); ft_k_axpy_avx2(o2, 0.5f, x, n);
        CHECK_MSG(close_rel(o2, o1, n, 1e-6f), "axpy_avx2 n=%d", n);
        ft_k_rmsnorm_ref(o1, x, w, n, 1e-5f); ft_k_rmsnorm_avx2(o2, x, w, n, 1e-5f);
        CHECK_MSG(close_rel(o2, o1, n, 1e-5f), "rmsnorm_avx2 n=%d", n);
        ft_k_layernorm_ref(o1, x, w, b, n, 1e-5f); ft_k_layernorm_avx2(o2, x, w, b, n, 1e-5f);
        CHECK_MSG(close_rel(o2, o1, n, 1e-4f), "layernorm_avx2 n=%d", n);
        memcpy(o1, x, sizeof(float) * (size_t)n); memcpy(o2, x, sizeof(float) * (size_t)n);
        ft_k_softmax_ref(o1, n); ft_k_softmax_avx2(o2, n);
        CHECK_MSG(close_rel(o2, o1, n, 2e-6f), "softmax_avx2 n=%d", n);
        memcpy(o1, x, sizeof(float) * (size_t)n); memcpy(o2, x, sizeof(float) * (size_t)n);
        ft_k_silu_mul_ref(o1, y, n); ft_k_silu_mul_avx2(o2, y, n);
        CHECK_MSG(close_rel(o2, o1, n, 2e-6f), "silu_mul_avx2 n=%d", n);
    }
    float c[32], sn[32];
    for (int i = 0; i < 32; i++) { c[i] = cosf((float)i); sn[i] = sinf((float)i); }
    fill(x, 4 * 64, 2);
    memcpy(o1, x, sizeof(float) * 256); memcpy(o2, x, sizeof(float) * 256);
    ft_k_rope_ref(o1, 4, 64, c, sn); ft_k_rope_avx2(o2, 4, 64, c, sn);
    CHECK(close_rel(o2, o1, 256, 1e-6f));
}
