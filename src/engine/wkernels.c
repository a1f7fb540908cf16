/* Products on stored weights: validation, activation preparation (one
 * definition for every table), the scalar reference product and
 * attention, and the run-time dispatch. SIMD tables: wkernels_x86.c. */
#include "wkernels.h"
#include "kernels.h"
#include "flextier/core.h"

#include <cblas.h>
#include <math.h>
#include <pthread.h>
#include <string.h>

static int is_q(ft_wfmt f) { return f == FT_WF_Q8 || f == FT_WF_Q4; }

ft_status ft_wmat_check(const ft_wmat *W, const char *what)
{
    if (!what) what = "weight matrix";
    if (!W) return ft_set_error(FT_ERR_INVALID_ARG, "%s: no matrix", what);
    if (W->fmt < FT_WF_F32 || W->fmt > FT_WF_Q4)
        return ft_set_error(FT_ERR_INVALID_ARG, "%s: unknown weight format %d", what, (int)W->fmt);
    if (W->rows < 1 || W->cols < 1)
        return ft_set_error(FT_ERR_INVALID_ARG, "%s: shape %d x %d", what, W->rows, W->cols);
    if (!is_q(W->fmt)) {
        if (!W->data) return ft_set_error(FT_ERR_INVALID_ARG, "%s: %s matrix without data", what,
                                          ft_wfmt_name(W->fmt));
        return FT_OK;
    }
    if (W->group < 1 || W->cols % W->group)
        return ft_set_error(FT_ERR_INVALID_ARG, "%s: group %d does not divide cols %d", what,
                            W->group, W->cols);
    if (W->rows_per_chunk < 1)
        return ft_set_error(FT_ERR_INVALID_ARG, "%s: rows_per_chunk %d", what, W->rows_per_chunk);
    if (!W->chunk) return ft_set_error(FT_ERR_INVALID_ARG, "%s: no chunk table", what);
    int nch = (W->rows + W->rows_per_chunk - 1) / W->rows_per_chunk;
    for (int c = 0; c < nch; c++)
        if (!W->chunk[c]) return ft_set_error(FT_ERR_INVALID_ARG, "%s: chunk %d missing", what, c);
    return FT_OK;
}

/* ------------------------------------------------------ preparation */

static ft_wk_mode wk_mode(const ft_wmat *W, int rows)
{
    if (is_q(W->fmt)) return FT_WK_X_Q8;
    if (W->fmt == FT_WF_BF16 && rows > FT_WK_DECODE_ROWS) return FT_WK_X_BF16;
    return FT_WK_X_F32;
}

static size_t al64(size_t n) { return (n + 63) & ~(size_t)63; }

/* F32 weights, 8..32 rows: room for x transposed (used when the engine's
 * AVX-512 matmul_xt exists). */
static int wk_f32_xt(const ft_wmat *W, int rows)
{
    return W->fmt == FT_WF_F32 && rows >= 8 && rows <= FT_WK_DECODE_ROWS;
}

size_t ft_wk_ws_size(const ft_wmat *W, int rows)
{
    if (!W || rows < 1 || W->cols < 1) return 0;
    size_t R = (size_t)rows, C = (size_t)W->cols;
    switch (wk_mode(W, rows)) {
    case FT_WK_X_F32:
        return wk_f32_xt(W, rows) ? al64(C * 32 * sizeof(float)) : 0;
    case FT_WK_X_BF16:
        return al64(R * ((C + 31) & ~(size_t)31) * 2);
    case FT_WK_X_Q8: {
        if (W->group < 1) return 0;
        size_t gpr = C / (size_t)W->group, gpad = ((size_t)W->group + 63) & ~(size_t)63;
        return al64(R * gpr * gpad) + 2 * al64(R * gpr * sizeof(float));
    }
    }
    return 0;
}

/* Position of element i of a group in its prepared (padded, for q4
 * permuted) form. */
static inline size_t qpos(int q4, int i)
{
    int u = i >> 6, j = i & 63;
    if (q4) j = (j & 1) ? 32 + (j >> 1) : (j >> 1);
    return (size_t)u * 64 + (size_t)j;
}

/* The activation quantizer (see wkernels.h): per (row, group) symmetric
 * int8. Integer and max operations only, plus one multiply and one
 * rounding per element, so it is the same on every CPU. */
static void prep_q(const ft_wmat *W, const float *x, int rows, int8_t *xq, float *xs, float *xsum,
                   int gpad)
{
    int G = W->group, gpr = W->cols / G, q4 = W->fmt == FT_WF_Q4;
    memset(xq, 0, (size_t)rows * (size_t)gpr * (size_t)gpad);
    for (int r = 0; r < rows; r++)
        for (int g = 0; g < gpr; g++) {
            const float *v = x + (size_t)r * W->cols + (size_t)g * G;
            int8_t *d = xq + ((size_t)r * gpr + g) * (size_t)gpad;
            float amax = 0.0f;
            for (int i = 0; i < G; i++) {
                float a = fabsf(v[i]);
                amax = a > amax || a != a ? a : amax;   /* NaN sticks */
            }
            size_t k = (size_t)r * gpr + g;
            if (!(amax <= 3.4e38f)) { xs[k] = NAN; xsum[k] = NAN; continue; }   /* NaN / Inf */
            if (amax == 0.0f) { xs[k] = 0.0f; xsum[k] = 0.0f; continue; }
            float inv = 127.0f / amax;
            int sum = 0;
            for (int i = 0; i < G; i++) {
                float t = rintf(v[i] * inv);      /* |t| <= 127 up to rounding: clamp */
                int q = t > 127.0f ? 127 : t < -127.0f ? -127 : (int)t;
                d[qpos(q4, i)] = (int8_t)q;
                sum += q;
            }
            xs[k] = amax / 127.0f;
            xsum[k] = xs[k] * (float)sum;
        }
}

ft_status ft_wk_prep(ft_wk_act *a, void *ws, size_t ws_size, const ft_wmat *W, const float *x,
                     int rows)
{
    if (!a || !x || rows < 1)
        return ft_set_error(FT_ERR_INVALID_ARG, "wk_prep: rows %d / no activations", rows);
    ft_status st = ft_wmat_check(W, "wk_prep");
    if (st) return st;
    size_t need = ft_wk_ws_size(W, rows);
    if (need && (!ws || ws_size < need || ((uintptr_t)ws & 63)))
        return ft_set_error(FT_ERR_INVALID_ARG, "wk_prep: workspace of %zu bytes at %p, need %zu "
                            "(64-byte aligned)", ws_size, ws, need);
    ft_wk_act t;
    memset(&t, 0, sizeof t);
    t.mode = wk_mode(W, rows);
    t.fmt = W->fmt;
    t.rows = rows;
    t.cols = W->cols;
    t.group = is_q(W->fmt) ? W->group : 0;
    t.x = x;
    if (t.mode == FT_WK_X_F32 && wk_f32_xt(W, rows) && ft_k_get()->matmul_xt) {
        t.ldx = rows <= 16 ? 16 : 32;
        ft_k_transpose_rows(ws, t.ldx, x, rows, W->cols);
        t.xt = ws;
    } else if (t.mode == FT_WK_X_BF16) {
        int ldb = (W->cols + 31) & ~31;
        uint16_t *xb = ws;
        for (int r = 0; r < rows; r++) {
            ft_f32_to_bf16(xb + (size_t)r * ldb, x + (size_t)r * W->cols, (size_t)W->cols);
            for (int i = W->cols; i < ldb; i++) xb[(size_t)r * ldb + i] = 0;
        }
        t.xb = xb;
        t.ldb = ldb;
    } else if (t.mode == FT_WK_X_Q8) {
        size_t gpr = (size_t)(W->cols / W->group), gpad = ((size_t)W->group + 63) & ~(size_t)63;
        int8_t *xq = ws;
        float *xs = (float *)((char *)ws + al64((size_t)rows * gpr * gpad));
        float *xsum = (float *)((char *)xs + al64((size_t)rows * gpr * sizeof(float)));
        prep_q(W, x, rows, xq, xs, xsum, (int)gpad);
        t.xq = xq;
        t.xs = xs;
        t.xsum = xsum;
        t.gpad = (int)gpad;
        t.gpr = (int)gpr;
    }
    *a = t;
    return FT_OK;
}

/* ---------------------------------------------------- scalar reference */

static inline float wval(const ft_wmat *W, int o, int i)
{
    size_t k = (size_t)o * W->cols + i;
    switch (W->fmt) {
    case FT_WF_F32: return ((const float *)W->data)[k];
    case FT_WF_BF16: return ft_bf16_to_f32_1(((const uint16_t *)W->data)[k]);
    default: return ft_f16_to_f32_1(((const uint16_t *)W->data)[k]);
    }
}

static void product_q_ref(float *y, int ldy, const ft_wk_act *a, const ft_wmat *W, int o0, int o1,
                          const float *b)
{
    int G = W->group, gpr = a->gpr, q4 = W->fmt == FT_WF_Q4;
    for (int o = o0; o < o1; o++) {
        const uint8_t *par, *vals;
        size_t k0;
        ft_wk_qrow(W, o, &par, &vals, &k0);
        for (int r = 0; r < a->rows; r++) {
            float acc = 0.0f;
            for (int g = 0; g < gpr; g++) {
                const int8_t *xq = a->xq + ((size_t)r * gpr + g) * (size_t)a->gpad;
                int32_t idot = 0;
                for (int i = 0; i < G; i++) {
                    size_t k = k0 + (size_t)g * G + i;
                    int q = q4 ? (vals[k >> 1] >> ((k & 1) * 4)) & 15 : vals[k];
                    idot += q * xq[qpos(q4, i)];
                }
                uint16_t m16 = (uint16_t)(par[4 * g] | par[4 * g + 1] << 8);
                uint16_t s16 = (uint16_t)(par[4 * g + 2] | par[4 * g + 3] << 8);
                size_t k = (size_t)r * gpr + g;
                acc += (a->xs[k] * ft_f16_to_f32_1(s16)) * (float)idot + ft_f16_to_f32_1(m16) * a->xsum[k];
            }
            y[(size_t)r * ldy + o] = acc + (b ? b[o] : 0.0f);
        }
    }
}

void ft_wk_product_ref(float *y, int ldy, const ft_wk_act *a, const ft_wmat *W, int o0, int o1,
                       const float *b)
{
    if (o0 >= o1) return;
    if (a->mode == FT_WK_X_Q8) { product_q_ref(y, ldy, a, W, o0, o1, b); return; }
    if (a->xt) {
        ft_k_matmul_xt_ref(y + o0, ldy, a->xt, a->ldx, a->rows, (const float *)W->data + (size_t)o0 * W->cols,
                           o1 - o0, W->cols, b ? b + o0 : NULL);
        return;
    }
    for (int o = o0; o < o1; o++)
        for (int r = 0; r < a->rows; r++) {
            float acc = 0.0f;
            if (a->mode == FT_WK_X_BF16) {
                const uint16_t *xb = a->xb + (size_t)r * a->ldb;
                for (int i = 0; i < W->cols; i++) acc += ft_bf16_to_f32_1(xb[i]) * wval(W, o, i);
            } else {
                const float *x = a->x + (size_t)r * W->cols;
                for (int i = 0; i < W->cols; i++) acc += x[i] * wval(W, o, i);
            }
            y[(size_t)r * ldy + o] = acc + (b ? b[o] : 0.0f);
        }
}

static inline float hval(const uint16_t *p, int f16) { return f16 ? ft_f16_to_f32_1(*p) : ft_bf16_to_f32_1(*p); }

void ft_wk_attend_h_ref(float *out, const float *q, const uint16_t *K, const uint16_t *V, int ld,
                        int npos, int hd, float scale, float *sc, int f16)
{
    for (int p = 0; p < npos; p++) {
        float s = 0.0f;
        for (int i = 0; i < hd; i++) s += q[i] * hval(K + (size_t)p * ld + i, f16);
        sc[p] = s * scale;
    }
    ft_k_softmax_ref(sc, npos);
    for (int i = 0; i < hd; i++) out[i] = 0.0f;
    for (int p = 0; p < npos; p++)
        for (int i = 0; i < hd; i++) out[i] += sc[p] * hval(V + (size_t)p * ld + i, f16);
}

/* ------------------------------------------------------------ dispatch */

static const ft_wk_table ref_table = {"scalar", ft_wk_product_ref, ft_wk_attend_h_ref};

static const ft_wk_table *tables[5];
static int ntables;
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;

static void tables_init(void)
{
    tables[ntables++] = &ref_table;
    const ft_wk_table *t;
    if ((t = ft_wk_avx2())) tables[ntables++] = t;
    if ((t = ft_wk_avx512())) tables[ntables++] = t;
    if ((t = ft_wk_avx512bf16())) tables[ntables++] = t;
}

const ft_wk_table *ft_wk_list(int i)
{
    pthread_once(&tables_once, tables_init);
    return i >= 0 && i < ntables ? tables[i] : NULL;
}

const ft_wk_table *ft_wk_best(void)
{
    pthread_once(&tables_once, tables_init);
    return tables[ntables - 1];
}

void ft_wk_product(float *y, int ldy, const ft_wk_act *a, const ft_wmat *W, int o0, int o1,
                   const float *b)
{
    ft_wk_best()->product(y, ldy, a, W, o0, o1, b);
}

void ft_wk_attend_h(float *out, const float *q, const uint16_t *K, const uint16_t *V, int ld,
                    int npos, int hd, float scale, float *sc, int f16)
{
    ft_wk_best()->attend_h(out, q, K, V, ld, npos, hd, scale, sc, f16);
}
