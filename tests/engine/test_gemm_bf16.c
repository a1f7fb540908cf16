/* The bf16 GEMMs (src/engine/gemm_bf16.h): the SIMD kernel against its
 * scalar _ref twin, the _ref against exact (double) math on the rounded
 * operands, on odd sizes (rows not a multiple of 6, K odd and across
 * FT_GB_KC chunks, output ranges not on 64-boundaries), accumulating and
 * not, with and without a bias; output splits give the same bits.
 *
 * Bounds (u = 2^-24, S = sum_k |a_k b_k| in double):
 *  - _ref vs exact: the _ref rounds once per product-add (K of them),
 *    once per chunk into C and once for the bias:
 *      |d| <= (K + K/KC + 2) u S + u |C0| + u |bias|  (C0: the accumulated value)
 *    taken as (K + 2 K/KC + 4) u (S + |C0| + |bias|).
 *  - SIMD vs _ref: each within that of the exact value: twice the bound.
 *    How often they are bit-identical is printed. */
#include "ft_test.h"
#include "engine/gemm_bf16.h"
#include "flextier/core.h"

#include <math.h>

static uint64_t seed = 11;
static float frand(void) { return (float)(ft_test_rand(&seed) >> 40) / (float)(1 << 24) * 2.0f - 1.0f; }

typedef struct {
    int rows, K, N, n0, n1, nn, bias, acc;
} gcase;

/* max |d| / bound over the outputs; counts identical outputs */
static double run_case(const gcase *g, size_t *same, size_t *total)
{
    const int lda = ft_gb_lda(g->K);
    /* W: nt N x K (ldw K + 3), nn K x N (ldw N + 5) */
    const int ldw = g->nn ? g->N + 5 : g->K + 3;
    const size_t wn = g->nn ? (size_t)g->K * (size_t)ldw : (size_t)g->N * (size_t)ldw;
    uint16_t *W = malloc(wn * 2), *A = malloc((size_t)g->rows * (size_t)lda * 2);
    float *x = malloc((size_t)g->rows * (size_t)g->K * 4 + 4), *b = malloc((size_t)g->N * 4);
    const int ldc = g->N + 7;
    float *c0 = malloc((size_t)g->rows * (size_t)ldc * 4), *c1 = malloc((size_t)g->rows * (size_t)ldc * 4),
          *c2 = malloc((size_t)g->rows * (size_t)ldc * 4);
    if (!W || !A || !x || !b || !c0 || !c1 || !c2) {
        CHECK(0);
        free(W), free(A), free(x), free(b), free(c0), free(c1), free(c2);
        return 2.0;
    }
    for (size_t i = 0; i < wn; i++) W[i] = ft_f32_to_bf16_1(frand() * (i % 13 == 0 ? 4.0f : 1.0f));
    for (size_t i = 0; i < (size_t)g->rows * (size_t)g->K; i++) x[i] = frand() * (i % 7 == 0 ? 16.0f : 1.0f);
    for (int i = 0; i < g->N; i++) b[i] = frand();
    ft_gb_round(A, lda, x, g->K, g->rows, g->K);
    for (int r = 0; r < g->rows; r++) {
        for (int k = 0; k < g->K; k++)
            CHECK(A[(size_t)r * lda + k] == ft_f32_to_bf16_1(x[(size_t)r * g->K + k]));
        for (int k = g->K; k < lda; k++) CHECK(A[(size_t)r * lda + k] == 0);
    }
    for (size_t i = 0; i < (size_t)g->rows * (size_t)ldc; i++) c0[i] = c1[i] = c2[i] = frand() * 3.0f;
    const float *bias = g->bias ? b : NULL;
    if (g->nn) {
        ft_gb_nn_ref(c0, ldc, A, lda, g->rows, W, ldw, g->K, g->n0, g->n1, bias, g->acc);
        ft_gb_nn(c1, ldc, A, lda, g->rows, W, ldw, g->K, g->n0, g->n1, bias, g->acc);
        /* the same range in two pieces split at an odd place */
        int mid = g->n0 + (g->n1 - g->n0) / 3;
        ft_gb_nn(c2, ldc, A, lda, g->rows, W, ldw, g->K, g->n0, mid, bias, g->acc);
        ft_gb_nn(c2, ldc, A, lda, g->rows, W, ldw, g->K, mid, g->n1, bias, g->acc);
    } else {
        ft_gb_nt_ref(c0, ldc, A, lda, g->rows, W, ldw, g->K, g->n0, g->n1, bias, g->acc);
        ft_gb_nt(c1, ldc, A, lda, g->rows, W, ldw, g->K, g->n0, g->n1, bias, g->acc);
        int mid = g->n0 + (g->n1 - g->n0) / 3;
        ft_gb_nt(c2, ldc, A, lda, g->rows, W, ldw, g->K, g->n0, mid, bias, g->acc);
        ft_gb_nt(c2, ldc, A, lda, g->rows, W, ldw, g->K, mid, g->n1, bias, g->acc);
    }
    double worst = 0.0;
    const double u = ldexp(1.0, -24);
    for (int r = 0; r < g->rows; r++)
        for (int n = 0; n < ldc; n++) {
            size_t i = (size_t)r * ldc + (size_t)n;
            if (n < g->n0 || n >= g->n1) {   /* outside the range: untouched */
                CHECK(c0[i] == c1[i] && c1[i] == c2[i]);
                continue;
            }
            CHECK_MSG(memcmp(&c1[i], &c2[i], 4) == 0, "split changed bits at (%d, %d)", r, n);
            /* exact, in double, from the initial C (c0 before: regenerate it) */
            double s = 0.0, sa = 0.0;
            for (int k = 0; k < g->K; k++) {
                double av = ft_bf16_to_f32_1(A[(size_t)r * lda + k]);
                double bv = ft_bf16_to_f32_1(g->nn ? W[(size_t)k * ldw + n] : W[(size_t)n * ldw + k]);
                s += av * bv;
                sa += fabs(av * bv);
            }
            (void)s;
            double slack = (g->K + 2.0 * g->K / FT_GB_KC + 4.0) * u;
            double bound = 2.0 * slack * (sa + 3.0 + (bias ? fabs(b[n]) : 0.0)) + 1e-30;
            double d = fabs((double)c0[i] - (double)c1[i]);
            if (d / bound > worst) worst = d / bound;
            (*total)++;
            if (memcmp(&c0[i], &c1[i], 4) == 0) (*same)++;
        }
    free(W), free(A), free(x), free(b), free(c0), free(c1), free(c2);
    return worst;
}

/* the _ref against exact math: the initial C is known here */
TEST(ref_vs_exact)
{
    const int rows = 5, K = 613, N = 37, lda = ft_gb_lda(K);
    uint16_t *W = malloc((size_t)N * K * 2), *A = malloc((size_t)rows * lda * 2);
    float *x = malloc((size_t)rows * K * 4), *c = malloc((size_t)rows * N * 4), *b = malloc((size_t)N * 4);
    REQUIRE(W && A && x && c && b);
    for (int nn = 0; nn < 2; nn++)
        for (int acc = 0; acc < 2; acc++) {
            for (size_t i = 0; i < (size_t)N * K; i++) W[i] = ft_f32_to_bf16_1(frand());
            for (size_t i = 0; i < (size_t)rows * K; i++) x[i] = frand() * 2.0f;
            for (int i = 0; i < N; i++) b[i] = frand();
            ft_gb_round(A, lda, x, K, rows, K);
            for (size_t i = 0; i < (size_t)rows * N; i++) c[i] = 0.5f;
            /* nn: W as K x N (ldw N) */
            if (nn) ft_gb_nn_ref(c, N, A, lda, rows, W, N, K, 0, N, b, acc);
            else ft_gb_nt_ref(c, N, A, lda, rows, W, K, K, 0, N, b, acc);
            const double u = ldexp(1.0, -24);
            for (int r = 0; r < rows; r++)
                for (int n = 0; n < N; n++) {
                    double s = acc ? 0.5 : 0.0, sa = acc ? 0.5 : 0.0;
                    for (int k = 0; k < K; k++) {
                        double p = (double)ft_bf16_to_f32_1(A[(size_t)r * lda + k]) *
                                   ft_bf16_to_f32_1(nn ? W[(size_t)k * N + n] : W[(size_t)n * K + k]);
                        s += p;
                        sa += fabs(p);
                    }
                    s += b[n];
                    sa += fabs(b[n]);
                    double bound = (K + 2.0 * K / FT_GB_KC + 4.0) * u * sa;
                    CHECK_MSG(fabs(c[(size_t)r * N + n] - s) <= bound, "nn %d acc %d (%d, %d): %g vs %g", nn, acc, r,
                              n, c[(size_t)r * N + n], s);
                }
        }
    free(W), free(A), free(x), free(c), free(b);
}

TEST(simd_vs_ref)
{
    static const gcase cases[] = {
        {1, 1, 1, 0, 1, 0, 0, 0},         {7, 33, 70, 0, 70, 0, 1, 0},      {6, 64, 64, 0, 64, 1, 0, 1},
        {13, 257, 131, 5, 130, 0, 1, 1},  {13, 257, 131, 5, 130, 1, 1, 0},  {32, 512, 128, 0, 128, 0, 0, 0},
        {32, 512, 128, 0, 128, 1, 0, 1},  {25, 600, 200, 64, 193, 0, 1, 0}, {25, 601, 200, 3, 200, 1, 0, 1},
        {128, 300, 96, 0, 96, 0, 0, 1},   {128, 300, 96, 17, 96, 1, 1, 1},  {2, 5, 9, 0, 9, 1, 0, 0},
        {11, 48, 17, 16, 17, 0, 0, 0},    {40, 1030, 66, 1, 66, 1, 0, 0},
    };
    size_t same = 0, total = 0;
    double worst = 0.0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        double w = run_case(&cases[i], &same, &total);
        CHECK_MSG(w <= 1.0, "case %zu: |simd - ref| %.3g of the bound", i, w);
        if (w > worst) worst = w;
    }
    printf("gemm_bf16 %s: %zu of %zu outputs bit-identical to the _ref, worst difference %.3g of the bound\n",
           ft_gb_simd() ? "avx512bf16" : "(scalar: the _ref itself)", same, total, worst);
    if (!ft_gb_simd()) CHECK(same == total);
}

