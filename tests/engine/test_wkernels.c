/* Products on stored weights (src/engine/wkernels.h): every SIMD table
 * against the scalar reference on odd sizes, and the reference against
 * exact math on the dequantized weights.
 *
 * Bounds (u = 2^-24; S = sum_i |x_i w_i| over the operands actually
 * multiplied, computed in double; n = cols):
 *  - SIMD vs scalar: |d| <= 2 (n + 64) u S' + 2u |b|, S' = S for f32
 *    activations, S' = sum_i (|x_i| + xs/2)(|m| + 256 step) for q8/q4
 *    (the AVX2 q8 kernel folds 128 step into the min term). Both sums are
 *    f32 sums of at most n + 64 terms in different orders (a rigorous
 *    bound; the measured maximum is printed as a multiple of u S and is
 *    recorded in docs/engine.md).
 *  - scalar vs exact (double) on the dequantized weights:
 *      f32/bf16/f16 (any rows), q8/q4 with more than 32 rows (f32 x times
 *      the dequantized weights): (n + 2) u S + u |b|
 *      q8/q4: sum_g (xs_g / 2) sum_{i in g} |w_i| + (n + 64) u S'
 *             (x rounded to int8 steps of xs_g = max|x_g| / 127). */
#include "ft_test.h"
#include "engine/wkernels.h"
#include "engine/kernels.h"
#include "flextier/codec.h"
#include "flextier/core.h"

#include <math.h>

static uint64_t seed = 7;
static float frand(void) { return (float)(ft_test_rand(&seed) >> 40) / (float)(1 << 24) * 2.0f - 1.0f; }

/* A test matrix: the view, its storage and the dequantized f32 values. */
typedef struct {
    ft_wmat W;
    void *data;
    uint8_t **chunks;
    float *wd;        /* rows x cols, exactly what the format stores */
    float *mn, *st;   /* q: per (row, group) min and step as f32 */
} tmat;

static void put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }

static void tmat_make(tmat *t, ft_wfmt fmt, int rows, int cols, int group, int rpc)
{
    memset(t, 0, sizeof *t);
    t->W.fmt = fmt;
    t->W.rows = rows;
    t->W.cols = cols;
    size_t n = (size_t)rows * cols;
    t->wd = malloc(n * sizeof(float));
    if (fmt == FT_WF_F32 || fmt == FT_WF_BF16 || fmt == FT_WF_F16) {
        t->data = malloc(n * 4);
        for (size_t i = 0; i < n; i++) {
            float v = frand() * (i % 17 == 0 ? 8.0f : 1.0f);
            if (fmt == FT_WF_F32) { ((float *)t->data)[i] = v; t->wd[i] = v; }
            else if (fmt == FT_WF_BF16) {
                uint16_t h = ft_f32_to_bf16_1(v);
                ((uint16_t *)t->data)[i] = h;
                t->wd[i] = ft_bf16_to_f32_1(h);
            } else {
                uint16_t h = ft_f32_to_f16_1(v);
                ((uint16_t *)t->data)[i] = h;
                t->wd[i] = ft_f16_to_f32_1(h);
            }
        }
        t->W.data = t->data;
        return;
    }
    /* q8/q4: random parameters and codes in the chunk layout */
    int q4 = fmt == FT_WF_Q4, gpr = cols / group, nch = (rows + rpc - 1) / rpc;
    t->W.group = group;
    t->W.rows_per_chunk = rpc;
    t->chunks = calloc((size_t)nch, sizeof *t->chunks);
    t->mn = malloc((size_t)rows * gpr * sizeof(float));
    t->st = malloc((size_t)rows * gpr * sizeof(float));
    for (int c = 0; c < nch; c++) {
        int nc = rows - c * rpc < rpc ? rows - c * rpc : rpc;
        size_t cnt = (size_t)nc * cols, vb = q4 ? (cnt + 1) / 2 : cnt;
        size_t sz = 4 * (size_t)nc * gpr + vb;
        uint8_t *ch = malloc(sz);   /* exact size: ASan catches any over-read */
        memset(ch, 0, sz);
        uint8_t *vals = ch + 4 * (size_t)nc * gpr;
        for (int lr = 0; lr < nc; lr++) {
            int o = c * rpc + lr;
            for (int g = 0; g < gpr; g++) {
                uint16_t m16 = ft_f32_to_f16_1(-frand() * 0.5f - 0.25f);
                uint16_t s16 = ft_f32_to_f16_1((frand() + 1.5f) * (q4 ? 0.05f : 0.004f));
                put16(ch + 4 * ((size_t)lr * gpr + g), m16);
                put16(ch + 4 * ((size_t)lr * gpr + g) + 2, s16);
                float m = ft_f16_to_f32_1(m16), s = ft_f16_to_f32_1(s16);
                t->mn[(size_t)o * gpr + g] = m;
                t->st[(size_t)o * gpr + g] = s;
                for (int i = 0; i < group; i++) {
                    size_t k = (size_t)lr * cols + (size_t)g * group + i;
                    int q = (int)(ft_test_rand(&seed) >> 56);
                    if (q4) { q &= 15; vals[k / 2] |= (uint8_t)(q << ((k & 1) * 4)); }
                    else vals[k] = (uint8_t)q;
                    t->wd[(size_t)o * cols + (size_t)g * group + i] = (float)q * s + m;
                }
            }
        }
        t->chunks[c] = ch;
    }
    t->W.chunk = (const uint8_t *const *)t->chunks;
}

static void tmat_free(tmat *t)
{
    if (t->chunks) {
        int nch = (t->W.rows + t->W.rows_per_chunk - 1) / t->W.rows_per_chunk;
        for (int c = 0; c < nch; c++) free(t->chunks[c]);
        free(t->chunks);
    }
    free(t->data);
    free(t->wd);
    free(t->mn);
    free(t->st);
}

static void fill_x(float *x, int rows, int cols, int group)
{
    for (int r = 0; r < rows; r++)
        for (int i = 0; i < cols; i++) {
            float v = frand() * (i % 29 == 3 ? 20.0f : 1.0f);
            /* an all-zero group (q: scale 0) in row 1 */
            if (r == 1 && group && i < group) v = 0.0f;
            x[(size_t)r * cols + i] = v;
        }
}

static float bf16r(float v) { return ft_bf16_to_f32_1(ft_f32_to_bf16_1(v)); }

/* Per (r, o): the exact product (double), S (for the f32/bf16 modes), S'
 * and the activation-rounding bound for q. */
typedef struct { double exact, S, Sq, qerr, exact0, S0; } refv;

static refv ref_values(const tmat *t, const float *x, int r, int o, const float *b, int bf16x)
{
    const ft_wmat *W = &t->W;
    int cols = W->cols;
    refv v = {0, 0, 0, 0, 0, 0};
    const float *xr = x + (size_t)r * cols;
    const float *wr = t->wd + (size_t)o * cols;
    /* bf16x: the operand is x rounded to bf16 (bf16 weights, X_T); exact0
     * and S0 with x as given */
    for (int i = 0; i < cols; i++) {
        double xi = bf16x ? bf16r(xr[i]) : xr[i];
        v.exact += xi * wr[i];
        v.S += fabs(xi * wr[i]);
        v.exact0 += (double)xr[i] * wr[i];
        v.S0 += fabs((double)xr[i] * wr[i]);
    }
    if (b) v.exact0 += b[o];
    if (t->mn) {
        int G = W->group, gpr = cols / G;
        for (int g = 0; g < gpr; g++) {
            double amax = 0, sw = 0, sx = 0;
            for (int i = 0; i < G; i++) {
                amax = fmax(amax, fabs(xr[g * G + i]));
                sw += fabs(wr[g * G + i]);
            }
            double xs = amax / 127;
            for (int i = 0; i < G; i++) sx += fabs(xr[g * G + i]) + xs / 2;
            v.qerr += xs / 2 * sw;
            v.Sq += sx * (fabs(t->mn[(size_t)o * gpr + g]) + 256 * t->st[(size_t)o * gpr + g]);
        }
    }
    if (b) v.exact += b[o];
    return v;
}

static double worst_simd;   /* max |simd - ref| / (u S') seen */
static double worst_exact;  /* max |ref - exact| / bound seen */

/* One configuration: prepare x, run the reference over [o0, o1) and every
 * SIMD table over [o0, om) + [om, o1); compare. */
static void run_case(const tmat *t, int rows, int o0, int o1, int with_bias, const char *what)
{
    const ft_wmat *W = &t->W;
    int cols = W->cols, nout = W->rows;
    float *x = malloc((size_t)rows * cols * sizeof(float));
    fill_x(x, rows, cols, W->group);
    float *b = NULL;
    if (with_bias) {
        b = malloc((size_t)nout * sizeof(float));
        for (int o = 0; o < nout; o++) b[o] = frand() * 3;
    }
    size_t wsz = ft_wk_ws_size(W, rows);
    void *ws = wsz ? ft_malloc_aligned(wsz, 64) : NULL;
    ft_wk_act a;
    CHECK_OK(ft_wk_prep(&a, ws, wsz, W, x, rows));
    int ldy = nout + 3;
    size_t ny = (size_t)rows * ldy;
    float *yr = malloc(ny * sizeof(float)), *ys = malloc(ny * sizeof(float));
    for (size_t i = 0; i < ny; i++) yr[i] = NAN;
    ft_wk_list(0)->product(yr, ldy, &a, W, o0, o1, b);
    int bf16x = a.mode == FT_WK_X_B16, q = a.mode == FT_WK_X_Q8;
    const double u = 1.0 / (1 << 24);
    /* the reference against exact math */
    for (int r = 0; r < rows; r++)
        for (int o = o0; o < o1; o++) {
            refv v = ref_values(t, x, r, o, b, bf16x);
            double got = yr[(size_t)r * ldy + o];
            double bound = q ? v.qerr + (cols + 64) * u * v.Sq
                             : (cols + 2) * u * v.S;
            bound += u * (b ? fabs(b[o]) : 0) + 1e-30;
            double d = fabs(got - v.exact);
            if (d / bound > worst_exact) worst_exact = d / bound;
            CHECK_MSG(d <= bound, "%s rows %d: ref r %d o %d: %.9g vs exact %.9g (bound %.3g)", what,
                      rows, r, o, got, v.exact, bound);
            if (bf16x) {   /* against x as given: + the activation rounding, 2^-8 S */
                double b0 = bound + v.S0 / 256;
                CHECK_MSG(fabs(got - v.exact0) <= b0, "%s rows %d: ref r %d o %d: %.9g vs exact (x as given) "
                          "%.9g (bound %.3g)", what, rows, r, o, got, v.exact0, b0);
            }
        }
    for (int ti = 1; ft_wk_list(ti); ti++) {
        const ft_wk_table *T = ft_wk_list(ti);
        for (size_t i = 0; i < ny; i++) ys[i] = NAN;
        int om = o0 + (o1 - o0) / 3;
        T->product(ys, ldy, &a, W, o0, om, b);
        T->product(ys, ldy, &a, W, om, o1, b);
        for (int r = 0; r < rows; r++)
            for (int o = 0; o < ldy; o++) {
                float s = ys[(size_t)r * ldy + o], rf = yr[(size_t)r * ldy + o];
                if (o < o0 || o >= o1) {
                    CHECK_MSG(isnan(s), "%s %s rows %d: wrote outside [%d,%d) at r %d o %d", T->name,
                              what, rows, o0, o1, r, o);
                    continue;
                }
                refv v = ref_values(t, x, r, o, b, bf16x);
                double Sp = q ? v.Sq : v.S;
                double bound = 2 * (cols + 64) * u * Sp + 2 * u * (b ? fabs(b[o]) : 0) + 1e-30;
                double d = fabs((double)s - rf);
                if (Sp > 0 && d / (u * Sp) > worst_simd) worst_simd = d / (u * Sp);
                CHECK_MSG(d <= bound, "%s %s rows %d: r %d o %d: %.9g vs ref %.9g (bound %.3g)", T->name,
                          what, rows, r, o, s, rf, bound);
            }
    }
    ft_free_aligned(ws);
    free(x);
    free(b);
    free(yr);
    free(ys);
}

TEST(wk_tables)
{
    for (int i = 0; ft_wk_list(i); i++) printf("  table %d: %s\n", i, ft_wk_list(i)->name);
    CHECK(!strcmp(ft_wk_list(0)->name, "scalar"));
    CHECK(ft_wk_best() != NULL);
    const char *e = getenv("FLEXTIER_NO_SIMD");
    if (e && *e && strcmp(e, "0")) CHECK(ft_wk_list(1) == NULL);
}

TEST(wk_check_rejects)
{
    tmat t;
    tmat_make(&t, FT_WF_Q8, 5, 128, 64, 2);
    ft_wmat W = t.W;
    CHECK_OK(ft_wmat_check(&W, "t"));
    W.group = 48;
    CHECK(ft_wmat_check(&W, "t") == FT_ERR_INVALID_ARG);
    CHECK(strstr(ft_last_error(), "group 48"));
    W = t.W;
    W.rows_per_chunk = 0;
    CHECK(ft_wmat_check(&W, "t") == FT_ERR_INVALID_ARG);
    W = t.W;
    W.fmt = (ft_wfmt)9;
    CHECK(ft_wmat_check(&W, "t") == FT_ERR_INVALID_ARG);
    ft_wk_act a;
    float x[128] = {0};
    char buf[128] __attribute__((aligned(64)));
    CHECK(ft_wk_prep(&a, buf, sizeof buf, &t.W, x, 1) == FT_ERR_INVALID_ARG);   /* short workspace */
    CHECK(ft_wk_prep(&a, NULL, 0, &t.W, x, 0) == FT_ERR_INVALID_ARG);
    tmat_free(&t);
}

/* f32 / bf16 / f16: odd cols, every row count 1..33 and prefill sizes,
 * nonzero o0, bias and none. */
TEST(wk_float_formats)
{
    static const ft_wfmt fmts[] = {FT_WF_F32, FT_WF_BF16, FT_WF_F16};
    static const int shapes[][2] = {{37, 131}, {13, 16}, {9, 200}};
    worst_simd = worst_exact = 0;
    for (int f = 0; f < 3; f++)
        for (int s = 0; s < 3; s++) {
            tmat t;
            tmat_make(&t, fmts[f], shapes[s][0], shapes[s][1], 0, 0);
            char what[64];
            snprintf(what, sizeof what, "%s %dx%d", ft_wfmt_name(fmts[f]), shapes[s][0], shapes[s][1]);
            for (int rows = 1; rows <= 33; rows += s ? 4 : 1)
                run_case(&t, rows, rows % 3, t.W.rows - (rows % 2), rows & 1, what);
            run_case(&t, 40, 1, t.W.rows, 1, what);
            run_case(&t, 67, 0, t.W.rows, 0, what);
            tmat_free(&t);
        }
    printf("  worst SIMD/ref %.3g u S, worst ref/exact %.3g of the bound\n", worst_simd, worst_exact);
}

/* bf16 weights with FLEXTIER_BF16_ACTIVATIONS on: at every row count the
 * operand is x rounded to bf16 (vdpbf16ps where the avx512bf16 table is
 * chosen), checked against the rounded-x product and against x as given;
 * off (the default, wk_float_formats) every row count computes on x as
 * given. */
TEST(wk_bf16_activations)
{
    int was = ft_wk_bf16_activations();
    ft_wk_set_bf16_activations(1);
    static const int shapes[][2] = {{37, 131}, {13, 16}, {9, 200}, {64, 256}, {5, 31}};
    for (int s = 0; s < 5; s++) {
        tmat t;
        tmat_make(&t, FT_WF_BF16, shapes[s][0], shapes[s][1], 0, 0);
        char what[64];
        snprintf(what, sizeof what, "bf16 (rounded x) %dx%d", shapes[s][0], shapes[s][1]);
        for (int rows = 1; rows <= 40; rows += s ? 3 : 1) run_case(&t, rows, rows % 3, t.W.rows - (rows % 2), rows & 1, what);
        run_case(&t, 67, 0, t.W.rows, 0, what);
        tmat_free(&t);
    }
    ft_wk_set_bf16_activations(was);
}

/* Batch invariance of bf16 with bf16 activations: in every table, each
 * row of a product over N rows (split over two output ranges) has the
 * same bits as that row's product alone (another split), for N from 1
 * to 67: a token's logits do not depend on how many rows share its
 * products (batched decode, a prompt prefilled whole or after a cached
 * prefix). */
TEST(wk_bf16_batch_invariant)
{
    int was = ft_wk_bf16_activations();
    ft_wk_set_bf16_activations(1);
    static const int shapes[][2] = {{37, 131}, {64, 256}, {13, 16}, {9, 200}, {24, 2048}};
    static const int ns[] = {2, 3, 5, 6, 7, 12, 13, 24, 25, 32, 33, 67};
    for (int s = 0; s < 5; s++) {
        tmat t;
        tmat_make(&t, FT_WF_BF16, shapes[s][0], shapes[s][1], 0, 0);
        int cols = t.W.cols, nout = t.W.rows, maxn = 67;
        float *x = malloc((size_t)maxn * cols * sizeof(float)), *b = malloc((size_t)nout * sizeof(float));
        fill_x(x, maxn, cols, 0);
        for (int o = 0; o < nout; o++) b[o] = frand();
        size_t wsz = ft_wk_ws_size(&t.W, maxn);
        void *ws = ft_malloc_aligned(wsz, 64);
        float *ya = malloc((size_t)maxn * nout * sizeof(float)), *y1 = malloc((size_t)nout * sizeof(float));
        for (int ti = 0; ft_wk_list(ti); ti++) {
            const ft_wk_table *T = ft_wk_list(ti);
            for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
                int n = ns[k], split = (n * 5) % nout;
                ft_wk_act a;
                CHECK_OK(ft_wk_prep(&a, ws, wsz, &t.W, x, n));
                CHECK(a.mode == FT_WK_X_B16);
                T->product(ya, nout, &a, &t.W, 0, split, b);
                T->product(ya, nout, &a, &t.W, split, nout, b);
                int same = 1;
                for (int r = 0; r < n && same; r++) {
                    CHECK_OK(ft_wk_prep(&a, ws, wsz, &t.W, x + (size_t)r * cols, 1));
                    int sp = (r * 7 + 1) % nout;
                    T->product(y1, nout, &a, &t.W, sp, nout, b);
                    T->product(y1, nout, &a, &t.W, 0, sp, b);
                    same = !memcmp(y1, ya + (size_t)r * nout, (size_t)nout * sizeof(float));
                    CHECK_MSG(same, "%s %dx%d: row %d of %d differs from the row alone", T->name, nout, cols, r, n);
                }
            }
        }
        ft_free_aligned(ws);
        free(x);
        free(b);
        free(ya);
        free(y1);
        tmat_free(&t);
    }
    ft_wk_set_bf16_activations(was);
}

/* bf16/f16 weights with x transposed (the default from 25 rows, exact f32
 * activations): a 32-row product (decode: one block of rows, the 12 x 32
 * tile's running sum carried across the 512-column blocks) gives each row
 * the same bits as the same row in a 64-row product (prefill: columns
 * outer, y accumulated per block), in every table; several column blocks
 * and a partial last one, a bias, an output split. */
TEST(wk_xt_decode_prefill_same_bits)
{
    static const int shapes[][2] = {{37, 2048 + 45}, {24, 512}, {13, 1100}};
    for (int f = 0; f < 2; f++)
        for (int s = 0; s < 3; s++) {
            tmat t;
            tmat_make(&t, f ? FT_WF_F16 : FT_WF_BF16, shapes[s][0], shapes[s][1], 0, 0);
            int cols = t.W.cols, nout = t.W.rows;
            float *x = malloc((size_t)64 * cols * sizeof(float)), *b = malloc((size_t)nout * sizeof(float));
            fill_x(x, 64, cols, 0);
            for (int o = 0; o < nout; o++) b[o] = frand();
            size_t wsz = ft_wk_ws_size(&t.W, 64);
            void *ws = ft_malloc_aligned(wsz, 64);
            float *y32 = malloc((size_t)32 * nout * sizeof(float)), *y64 = malloc((size_t)64 * nout * sizeof(float));
            for (int ti = 0; ft_wk_list(ti); ti++) {
                const ft_wk_table *T = ft_wk_list(ti);
                ft_wk_act a;
                CHECK_OK(ft_wk_prep(&a, ws, wsz, &t.W, x, 64));
                CHECK(a.mode == FT_WK_X_T && a.nblk == 2);
                T->product(y64, nout, &a, &t.W, 0, nout, b);
                CHECK_OK(ft_wk_prep(&a, ws, wsz, &t.W, x, 32));
                CHECK(a.mode == FT_WK_X_T && a.nblk == 1);
                int split = nout / 3;
                T->product(y32, nout, &a, &t.W, 0, split, b);
                T->product(y32, nout, &a, &t.W, split, nout, b);
                CHECK_MSG(!memcmp(y32, y64, (size_t)32 * nout * sizeof(float)), "%s %s %dx%d: 32 rows differ from the same rows of 64",
                          T->name, f ? "f16" : "bf16", nout, cols);
            }
            ft_free_aligned(ws);
            free(x);
            free(b);
            free(y32);
            free(y64);
            tmat_free(&t);
        }
}

/* q8 / q4: groups 64, 128, 32, 96 (partial 64-units), 2, 34, odd 7 and
 * 21 (scalar fallback for q4), several rows_per_chunk (a partial last
 * chunk), nonzero o0. */
TEST(wk_quant_formats)
{
    static const int geo[][3] = {   /* group, cols, rows */
        {64, 192, 23}, {128, 256, 9}, {32, 96, 11}, {96, 192, 10}, {2, 34, 7}, {34, 68, 6},
        {7, 21, 5}, {21, 63, 5}, {64, 64, 4}, {64, 1152, 6},
    };
    static const int rpcs[] = {1, 3, 5, 64};
    worst_simd = worst_exact = 0;
    for (int fq = 0; fq < 2; fq++)
        for (size_t gi = 0; gi < sizeof geo / sizeof geo[0]; gi++)
            for (int ri = 0; ri < 4; ri++) {
                ft_wfmt fmt = fq ? FT_WF_Q4 : FT_WF_Q8;
                tmat t;
                tmat_make(&t, fmt, geo[gi][2], geo[gi][1], geo[gi][0], rpcs[ri]);
                char what[64];
                snprintf(what, sizeof what, "%s G %d %dx%d rpc %d", ft_wfmt_name(fmt), geo[gi][0],
                         geo[gi][2], geo[gi][1], rpcs[ri]);
                if (gi == 0 && ri == 1) {
                    for (int rows = 1; rows <= 33; rows++)
                        run_case(&t, rows, rows % 4, t.W.rows - (rows % 3), rows & 1, what);
                    run_case(&t, 45, 2, t.W.rows, 1, what);
                    run_case(&t, 70, 0, t.W.rows, 0, what);
                }
                if (ri == 1 || ri == 3) {
                    /* the f32-panel form (x transposed, weights dequantized by
                     * the codec's kernels), which q8/q4 use only when asked */
                    ft_wk_set_xt_rows(fmt, 2);
                    run_case(&t, 3, 1, t.W.rows, 1, what);
                    run_case(&t, 40, 0, t.W.rows, 0, what);
                    ft_wk_set_xt_rows(fmt, 0);
                } else {
                    static const int rs[] = {1, 2, 5, 8, 17, 33};
                    for (int k = 0; k < 6; k++) run_case(&t, rs[k], k % 3, t.W.rows, k & 1, what);
                }
                tmat_free(&t);
            }
    /* long rows: the quads are walked in L2-sized blocks (16 quads of
     * 8192 columns), 70 rows = 18 quads = two blocks */
    for (int fq = 0; fq < 2; fq++) {
        tmat t;
        tmat_make(&t, fq ? FT_WF_Q4 : FT_WF_Q8, 6, 8192, 64, 4);
        run_case(&t, 70, 1, 6, 1, fq ? "q4 8192 cols" : "q8 8192 cols");
        tmat_free(&t);
    }
    printf("  worst SIMD/ref %.3g u S', worst ref/exact %.3g of the bound\n", worst_simd, worst_exact);
}

/* Batch 1 over ranges long enough that the kernels prefetch rows ahead
 * (PF_AHEAD bytes: 4-8 rows of 2048 columns), with the rows ahead in
 * other chunks (rows_per_chunk 5) and ranges that end inside a block. */
TEST(wk_batch1_prefetch)
{
    static const ft_wfmt fmts[] = {FT_WF_BF16, FT_WF_F16, FT_WF_Q8, FT_WF_Q4};
    worst_simd = worst_exact = 0;
    for (int f = 0; f < 4; f++)
        for (int rpc = 5; rpc <= 40; rpc += 35) {
            int q = fmts[f] == FT_WF_Q8 || fmts[f] == FT_WF_Q4;
            if (!q && rpc != 5) continue;
            tmat t;
            tmat_make(&t, fmts[f], 40, 2048, q ? 64 : 0, rpc);
            char what[64];
            snprintf(what, sizeof what, "%s 40x2048 rpc %d", ft_wfmt_name(fmts[f]), rpc);
            run_case(&t, 1, 0, 40, 1, what);
            run_case(&t, 1, 3, 37, 0, what);
            run_case(&t, 2, 0, 40, 0, what);
            tmat_free(&t);
        }
    printf("  worst SIMD/ref %.3g, worst ref/exact %.3g of the bound\n", worst_simd, worst_exact);
}

/* The activation quantizer's definition on a known group. */
TEST(wk_quant_prep)
{
    tmat t;
    tmat_make(&t, FT_WF_Q4, 1, 64, 64, 1);
    float x[128];
    for (int i = 0; i < 64; i++) x[i] = x[64 + i] = (float)(i - 20) / 8.0f;   /* max |x| = 43/8 */
    size_t wsz = ft_wk_ws_size(&t.W, 2);
    void *ws = ft_malloc_aligned(wsz, 64);
    ft_wk_act a;
    for (int rows = 1; rows <= 2; rows++) {   /* the one-row layout, then the quad layout */
        CHECK_OK(ft_wk_prep(&a, ws, wsz, &t.W, x, rows));
        CHECK(a.mode == FT_WK_X_Q8 && a.nsb == 4 && a.gpr == 1 && a.nquad == 1 && a.row1 == (rows == 1));
        CHECK(a.xs[0] == (43.0f / 8.0f) / 127.0f);
        int sum = 0;
        for (int i = 0; i < 64; i++) {
            int q = (int)rintf(x[i] * (127.0f / (43.0f / 8.0f)));
            /* one row (q4, group 64: 4 groups interleaved): 64 bytes each
             * for the evens and the odds of elements 0..31, then of 32..63,
             * this group's 16 at the start of each; quad: sub-block i/16 of
             * 64 bytes, 16 per row, evens then odds */
            int e = i % 16, pos = rows == 1 ? ((i / 32) * 2 + (i & 1)) * 64 + (i % 32) / 2
                                            : (i / 16) * 64 + ((e & 1) ? 8 + e / 2 : e / 2);
            CHECK_MSG(a.xq[pos] == q, "rows %d i %d: %d vs %d", rows, i, a.xq[pos], q);
            if (rows == 2) {
                CHECK(a.xq[pos + 16] == q);   /* row 1 of the quad */
                CHECK(a.xq[pos + 32] == 0);   /* rows 2, 3: padding */
            }
            sum += q;
        }
        for (int l = 0; l < 4; l++) CHECK(a.xs4[l] == a.xs[0] && a.xs4[8 + l] == 0.0f);
        CHECK(a.xsum4[0] == a.xsum[0] && a.xsum4[1] == 0.0f);
        CHECK(a.xq[3 * 64 + 15] == 127);   /* element 63: odd, the last, in both layouts */
        CHECK(a.xsum[0] == a.xs[0] * (float)sum);
    }
    /* a NaN poisons its group's outputs instead of being undefined */
    x[5] = NAN;
    CHECK_OK(ft_wk_prep(&a, ws, wsz, &t.W, x, 1));
    float y = 0;
    ft_wk_product(&y, 1, &a, &t.W, 0, 1, NULL);
    CHECK(isnan(y));
    ft_free_aligned(ws);
    tmat_free(&t);
}

/* Real q8/q4 frames from ft_encode with chunks of whole rows, computed on
 * in place: equal to f32 math on ft_decode's output within the q bound. */
TEST(wk_codec_frames)
{
    ft_codec_ctx *ctx;
    CHECK_OK(ft_codec_ctx_create(1, &ctx));
    const int rows = 29, cols = 256;
    float *w = malloc((size_t)rows * cols * sizeof(float));
    for (int i = 0; i < rows * cols; i++) w[i] = frand() * (i % 13 == 0 ? 0.3f : 0.05f);
    for (int bits = 8; bits >= 4; bits -= 4)
        for (int rpc = 4; rpc <= 7; rpc += 3) {   /* 4 rows (29 = 7*4 + 1) and 7 rows per chunk */
            ft_codec_params p;
            ft_codec_default_params(&p);
            p.codec = bits == 8 ? FT_CODEC_Q8 : FT_CODEC_Q4;
            p.group_size = 64;
            p.group_dim = -1;
            p.chunk_size = (uint32_t)(rpc * cols * 4);
            int64_t shape[2] = {rows, cols};
            ft_tensor src;
            CHECK_OK(ft_tensor_init(&src, FT_F32, 2, shape, w));
            size_t cap = ft_encode_bound(&p, FT_F32, 2, shape), fsz = 0;
            uint8_t *frame = malloc(cap);
            CHECK_OK(ft_encode(ctx, &p, &src, frame, cap, &fsz));
            ft_frame_info fi;
            CHECK_OK(ft_frame_parse(frame, fsz, &fi));
            REQUIRE(fi.n_chunks == (uint32_t)((rows + rpc - 1) / rpc));
            const uint8_t **ch = calloc(fi.n_chunks, sizeof *ch);
            for (uint32_t c = 0; c < fi.n_chunks; c++) {
                ft_chunk_info ci;
                CHECK_OK(ft_frame_chunk(frame, fsz, &fi, c, &ci));
                CHECK(ci.elem_offset == (uint64_t)c * rpc * cols);
                ch[c] = frame + ci.enc_offset;
            }
            ft_wmat W = {bits == 8 ? FT_WF_Q8 : FT_WF_Q4, rows, cols, NULL, 64, rpc, ch};
            CHECK_OK(ft_wmat_check(&W, "frame"));
            float *wd = malloc((size_t)rows * cols * sizeof(float));
            ft_tensor dst = {FT_F32, 2, {rows, cols}, wd};
            CHECK_OK(ft_decode(ctx, frame, fsz, &dst, (size_t)rows * cols * sizeof(float)));
            for (int nr = 1; nr <= 33; nr += 8) {
                float *x = malloc((size_t)nr * cols * sizeof(float)), *y = malloc((size_t)nr * rows * sizeof(float));
                fill_x(x, nr, cols, 64);
                size_t wsz = ft_wk_ws_size(&W, nr);
                void *ws = ft_malloc_aligned(wsz, 64);
                ft_wk_act a;
                CHECK_OK(ft_wk_prep(&a, ws, wsz, &W, x, nr));
                for (int ti = 0; ft_wk_list(ti); ti++) {
                    ft_wk_list(ti)->product(y, rows, &a, &W, 0, rows, NULL);
                    for (int r = 0; r < nr; r++)
                        for (int o = 0; o < rows; o++) {
                            double ex = 0, S = 0, qe = 0;
                            for (int g = 0; g < cols / 64; g++) {
                                double amax = 0, sw = 0;
                                for (int i = g * 64; i < g * 64 + 64; i++) {
                                    double xi = x[(size_t)r * cols + i], wi = wd[(size_t)o * cols + i];
                                    ex += xi * wi;
                                    S += (fabs(xi) + 0.01) * (fabs(wi) + 1.0);
                                    amax = fmax(amax, fabs(xi));
                                    sw += fabs(wi);
                                }
                                qe += amax / 254 * sw;
                            }
                            double bound = qe + 512.0 * (cols + 64) / (1 << 24) * S;
                            CHECK_MSG(fabs(y[(size_t)r * rows + o] - ex) <= bound,
                                      "%s q%d rpc %d rows %d: r %d o %d: %.9g vs %.9g (bound %.3g)",
                                      ft_wk_list(ti)->name, bits, rpc, nr, r, o, y[(size_t)r * rows + o], ex, bound);
                        }
                }
                ft_free_aligned(ws);
                free(x);
                free(y);
            }
            free(wd);
            free(ch);
            free(frame);
        }
    free(w);
    ft_codec_ctx_free(ctx);
}

/* Attention over bf16/f16 K/V rows: every table vs the reference, and
 * the reference vs f32 attention on the widened rows (equal: same math). */
TEST(wk_attend_h)
{
    static const int hds[] = {1, 7, 16, 33, 64, 100, 128, 130};
    for (int f16 = 0; f16 < 2; f16++)
        for (int h = 0; h < 8; h++)
            for (int npos = 1; npos <= 37; npos += 6) {
                int hd = hds[h], ld = hd + 5;
                uint16_t *K = malloc((size_t)npos * ld * 2), *V = malloc((size_t)npos * ld * 2);
                float *Kf = malloc((size_t)npos * ld * 4), *Vf = malloc((size_t)npos * ld * 4);
                float q[130], o1[130], o2[130], sc1[64], sc2[64];
                for (int i = 0; i < hd; i++) q[i] = frand();
                for (int i = 0; i < npos * ld; i++) {
                    float kv = frand() * 2, vv = frand();
                    K[i] = f16 ? ft_f32_to_f16_1(kv) : ft_f32_to_bf16_1(kv);
                    V[i] = f16 ? ft_f32_to_f16_1(vv) : ft_f32_to_bf16_1(vv);
                    Kf[i] = f16 ? ft_f16_to_f32_1(K[i]) : ft_bf16_to_f32_1(K[i]);
                    Vf[i] = f16 ? ft_f16_to_f32_1(V[i]) : ft_bf16_to_f32_1(V[i]);
                }
                float scale = 1.0f / sqrtf((float)hd);
                ft_wk_attend_h_ref(o1, q, K, V, ld, npos, hd, scale, sc1, f16);
                ft_k_attend_ref(o2, q, Kf, Vf, ld, npos, hd, scale, sc2);
                CHECK_MSG(!memcmp(o1, o2, (size_t)hd * 4), "ref f16 %d hd %d npos %d", f16, hd, npos);
                for (int ti = 1; ft_wk_list(ti); ti++) {
                    ft_wk_list(ti)->attend_h(o2, q, K, V, ld, npos, hd, scale, sc2, f16);
                    for (int i = 0; i < hd; i++)   /* |v| <= 1, probabilities sum to 1 */
                        CHECK_MSG(fabsf(o2[i] - o1[i]) <= 2e-6f * (1 + hd / 16), "%s f16 %d hd %d npos %d i %d: %g vs %g",
                                  ft_wk_list(ti)->name, f16, hd, npos, i, o2[i], o1[i]);
                }
                free(K); free(V); free(Kf); free(Vf);
            }
}

/* Every table's activation quantizer writes the scalar one's bytes: q8
 * and q4, groups with partial sub-blocks, zero groups, Inf and NaN, and
 * values that round to +-127.5 * (1 - eps). */
TEST(wk_prep_q_tables)
{
    static const int geo[][2] = {{64, 192}, {16, 48}, {34, 68}, {7, 21}, {128, 256}, {2, 6}, {96, 192}};
    for (size_t gi = 0; gi < sizeof geo / sizeof geo[0]; gi++)
        for (int q4 = 0; q4 < 2; q4++)
            for (int rows = 1; rows <= 9; rows += 4) {   /* 1: the one-row layout */
                int G = geo[gi][0], cols = geo[gi][1], gpr = cols / G, nsb = (G + 15) / 16, nq = (rows + 3) / 4;
                size_t nxq = (size_t)nq * gpr * nsb * 64, nf = (size_t)nq * gpr * 16, nr = (size_t)rows * gpr;
                float *x = malloc((size_t)rows * cols * sizeof(float));
                fill_x(x, rows, cols, G);
                if (rows > 4) { x[3] = INFINITY; x[cols + 1] = NAN; x[2 * cols] = 127.49999f; x[2 * cols + 1] = -1.0f; }
                int8_t *xq[2];
                float *f[2][4];
                for (int k = 0; k < 2; k++) {
                    xq[k] = ft_malloc_aligned(nxq, 64);
                    memset(xq[k], 0, nxq);
                    for (int j = 0; j < 4; j++) {
                        size_t n = j < 2 ? nf : nr;
                        f[k][j] = calloc(n, sizeof(float));
                    }
                }
                ft_wk_qdst d0 = {xq[0], f[0][0], f[0][1], f[0][2], f[0][3], cols, G, gpr, nsb, q4, rows == 1, (G + 63) / 64};
                ft_wk_prep_q_ref(&d0, x, rows);
                for (int ti = 1; ft_wk_list(ti); ti++) {
                    memset(xq[1], 0, nxq);
                    for (int j = 0; j < 4; j++) memset(f[1][j], 0, (j < 2 ? nf : nr) * sizeof(float));
                    ft_wk_qdst d1 = {xq[1], f[1][0], f[1][1], f[1][2], f[1][3], cols, G, gpr, nsb, q4, rows == 1, (G + 63) / 64};
                    ft_wk_list(ti)->prep_q(&d1, x, rows);
                    CHECK_MSG(!memcmp(xq[0], xq[1], nxq), "%s G %d q4 %d rows %d: int8 values", ft_wk_list(ti)->name, G, q4, rows);
                    for (int j = 0; j < 4; j++)   /* bitwise (NaN included) */
                        CHECK_MSG(!memcmp(f[0][j], f[1][j], (j < 2 ? nf : nr) * sizeof(float)), "%s G %d q4 %d rows %d: scales %d",
                                  ft_wk_list(ti)->name, G, q4, rows, j);
                }
                for (int k = 0; k < 2; k++) {
                    ft_free_aligned(xq[k]);
                    for (int j = 0; j < 4; j++) free(f[k][j]);
                }
                free(x);
            }
}
