/* Products on stored weights: validation, activation preparation (one
 * definition for every table), the scalar reference product and
 * attention, and the run-time dispatch. SIMD tables: wkernels_x86.c. */
#include "wkernels.h"
#include "kernels.h"
#include "flextier/core.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
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

/* From how many rows on each format uses x transposed (FT_WK_X_T).
 * Measured with bench_wkernels -x 1 (docs/engine.md): f32 from 16 rows
 * (the engine's ft_k_matmul_xt, weights streamed directly, beats
 * ft_k_matmul_rows); bf16/f16 from 25 (the panel's arithmetic pays off
 * against the dot kernels only near 32 rows); q8/q4 never by default:
 * their integer kernels beat dequantized f32 panels at every row count
 * (1.3x at 512 rows), so a prompt and a decode step round activations
 * the same way. */
#define XT_F32 16
#define XT_H16 25
#define XT_Q (1 << 30)
static int xt_rows[5] = {XT_F32, XT_H16, XT_H16, XT_Q, XT_Q};
static const int xt_default[5] = {XT_F32, XT_H16, XT_H16, XT_Q, XT_Q};

void ft_wk_set_xt_rows(ft_wfmt fmt, int rows)
{
    if (fmt >= FT_WF_F32 && fmt <= FT_WF_Q4)
        xt_rows[fmt] = rows > 0 ? rows : xt_default[fmt];
}

/* bf16 activations (FT_WK_X_B16 for bf16 weights at every row count). */
static int bf16_act = -1;   /* -1: not read from the environment yet */

int ft_wk_bf16_activations(void)
{
    int v = __atomic_load_n(&bf16_act, __ATOMIC_RELAXED);
    if (v < 0) {
        const char *e = getenv("FLEXTIER_BF16_ACTIVATIONS");
        v = e && e[0] == '1' && !e[1];
        __atomic_store_n(&bf16_act, v, __ATOMIC_RELAXED);
    }
    return v;
}

void ft_wk_set_bf16_activations(int on) { __atomic_store_n(&bf16_act, on ? 1 : 0, __ATOMIC_RELAXED); }

static ft_wk_mode wk_mode_b(const ft_wmat *W, int rows, int b16)
{
    if (W->fmt == FT_WF_BF16 && b16) return FT_WK_X_B16;
    if (rows >= xt_rows[W->fmt]) return FT_WK_X_T;
    return is_q(W->fmt) ? FT_WK_X_Q8 : FT_WK_X_F32;
}

static ft_wk_mode wk_mode(const ft_wmat *W, int rows) { return wk_mode_b(W, rows, ft_wk_bf16_activations()); }

static size_t al64(size_t n) { return (n + 63) & ~(size_t)63; }

typedef struct { size_t xq, xs4, xsum4, xs, xsum, total; int gpr, nsb, nquad; } qlayout;

static qlayout q_layout(const ft_wmat *W, int rows)
{
    qlayout L;
    L.gpr = W->cols / W->group;
    L.nsb = (W->group + 15) / 16;
    L.nquad = (rows + 3) / 4;
    size_t ng = (size_t)L.nquad * (size_t)L.gpr;
    L.xq = 0;
    L.xs4 = al64(ng * (size_t)L.nsb * 64);
    L.xsum4 = L.xs4 + al64(ng * 16 * sizeof(float));
    L.xs = L.xsum4 + al64(ng * 16 * sizeof(float));
    L.xsum = L.xs + al64(ng * 4 * sizeof(float));
    L.total = L.xsum + al64(ng * 4 * sizeof(float));
    return L;
}

/* X_B16: the padded row length of xh. */
static int b16_ld(int cols) { return (cols + 31) & ~31; }

static size_t ws_size_mode(const ft_wmat *W, int rows, ft_wk_mode mode)
{
    switch (mode) {
    case FT_WK_X_F32: return W->fmt == FT_WF_BF16 ? al64((size_t)rows * (size_t)(W->cols & ~31) * sizeof(float)) : 0;
    case FT_WK_X_T: {
        size_t ldx = rows <= 16 ? 16 : 32, nb = ((size_t)rows + ldx - 1) / ldx;
        return al64(nb * (size_t)W->cols * ldx * sizeof(float));
    }
    case FT_WK_X_Q8:
        if (W->group < 1 || W->cols % W->group) return 0;
        return q_layout(W, rows).total;
    case FT_WK_X_B16: return al64((size_t)rows * (size_t)b16_ld(W->cols) * sizeof(uint16_t));
    }
    return 0;
}

size_t ft_wk_ws_size(const ft_wmat *W, int rows)
{
    if (!W || rows < 1 || W->cols < 1 || W->fmt < FT_WF_F32 || W->fmt > FT_WF_Q4) return 0;
    size_t n = ws_size_mode(W, rows, wk_mode_b(W, rows, 0));
    if (W->fmt == FT_WF_BF16) {   /* enough for either setting of ft_wk_bf16_activations */
        size_t n2 = ws_size_mode(W, rows, FT_WK_X_B16);
        if (n2 > n) n = n2;
    }
    return n;
}

/* Byte offset of element i of group g of row r in the X_Q8 layout. */
static inline size_t qoff(const ft_wk_qdst *d, int r, int g, int i)
{
    if (d->row1) return ft_wk_qpos1(d->q4, d->nu, d->group, g, i);
    int q4 = d->q4, gpr = d->gpr, nsb = d->nsb;
    int e = i & 15;
    if (q4) e = (e & 1) ? 8 + (e >> 1) : (e >> 1);
    return ft_wk_qsub(gpr, nsb, r, g, i >> 4) + (size_t)e;
}

/* The activation quantizer (see wkernels.h): per (row, group) symmetric
 * int8. Integer and max operations only, plus one multiply and one
 * rounding per element, so every table's version writes the same bytes
 * (tested). d's buffers are zeroed by the caller. */
void ft_wk_prep_q_ref(const ft_wk_qdst *d, const float *x, int rows)
{
    int G = d->group, gpr = d->gpr;
    for (int r = 0; r < rows; r++)
        for (int g = 0; g < gpr; g++) {
            const float *v = x + (size_t)r * d->cols + (size_t)g * G;
            float amax = 0.0f;
            for (int i = 0; i < G; i++) {
                float a = fabsf(v[i]);
                amax = a > amax || a != a ? a : amax;   /* NaN sticks */
            }
            float s = 0.0f, sum = 0.0f;
            if (!(amax <= 3.4e38f)) {                  /* NaN / Inf: poison the group */
                s = NAN;
                sum = NAN;
            } else if (amax > 0.0f) {
                float inv = 127.0f / amax;
                int isum = 0;
                for (int i = 0; i < G; i++) {
                    float t = rintf(v[i] * inv);      /* |t| <= 127 up to rounding: clamp */
                    int q = t > 127.0f ? 127 : t < -127.0f ? -127 : (int)t;
                    d->xq[qoff(d, r, g, i)] = (int8_t)q;
                    isum += q;
                }
                s = amax / 127.0f;
                sum = s * (float)isum;
            }
            ft_wk_prep_q_put(d, r, g, s, sum);
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
    if (t.mode == FT_WK_X_F32 && W->fmt == FT_WF_BF16 && W->cols >= 32) {
        size_t c32 = (size_t)(W->cols & ~31);
        float *xd = ws;
        for (int r = 0; r < rows; r++)
            for (size_t i = 0; i < c32; i += 32)
                for (int k = 0; k < 16; k++) {
                    xd[(size_t)r * c32 + i + (size_t)k] = x[(size_t)r * W->cols + i + 2 * (size_t)k];
                    xd[(size_t)r * c32 + i + 16 + (size_t)k] = x[(size_t)r * W->cols + i + 2 * (size_t)k + 1];
                }
        t.xd = xd;
    }
    if (t.mode == FT_WK_X_T) {
        t.ldx = rows <= 16 ? 16 : 32;
        t.nblk = (rows + t.ldx - 1) / t.ldx;
        float *xt = ws;
        for (int b = 0; b < t.nblk; b++) {
            int nr = rows - b * t.ldx < t.ldx ? rows - b * t.ldx : t.ldx;
            ft_k_transpose_rows(xt + (size_t)b * W->cols * t.ldx, t.ldx, x + (size_t)b * t.ldx * W->cols,
                                nr, W->cols);
        }
        t.xt = xt;
    } else if (t.mode == FT_WK_X_B16) {
        int ldh = b16_ld(W->cols);
        uint16_t *xh = ws;
        for (int r = 0; r < rows; r++) {
            ft_f32_to_bf16(xh + (size_t)r * ldh, x + (size_t)r * W->cols, (size_t)W->cols);   /* RNE, NaN kept */
            for (int i = W->cols; i < ldh; i++) xh[(size_t)r * ldh + i] = 0;
        }
        t.xh = xh;
        t.ldh = ldh;
    } else if (t.mode == FT_WK_X_Q8) {
        qlayout L = q_layout(W, rows);
        uint8_t *w8 = ws;
        memset(w8, 0, L.total);   /* padding rows and sub-block tails are 0 */
        ft_wk_qdst d = {(int8_t *)(w8 + L.xq), (float *)(w8 + L.xs4), (float *)(w8 + L.xsum4),
                        (float *)(w8 + L.xs), (float *)(w8 + L.xsum), W->cols, W->group, L.gpr, L.nsb,
                        W->fmt == FT_WF_Q4, rows == 1, (W->group + 63) / 64};
        ft_wk_best()->prep_q(&d, x, rows);
        t.xq = (const int8_t *)(w8 + L.xq);
        t.xs4 = (const float *)(w8 + L.xs4);
        t.xsum4 = (const float *)(w8 + L.xsum4);
        t.xs = (const float *)(w8 + L.xs);
        t.xsum = (const float *)(w8 + L.xsum);
        t.nsb = L.nsb;
        t.gpr = L.gpr;
        t.nquad = L.nquad;
        t.row1 = d.row1;
        t.nu = d.nu;
    }
    *a = t;
    return FT_OK;
}

/* ---------------------------------------------------- scalar reference */

static void product_q_ref(float *y, int ldy, const ft_wk_act *a, const ft_wmat *W, int o0, int o1,
                          const float *b)
{
    int G = W->group, gpr = a->gpr, q4 = W->fmt == FT_WF_Q4;
    ft_wk_qdst d = {NULL, NULL, NULL, NULL, NULL, W->cols, G, gpr, a->nsb, q4, a->row1, a->nu};
    for (int o = o0; o < o1; o++) {
        const uint8_t *par, *vals;
        size_t k0;
        ft_wk_qrow(W, o, &par, &vals, &k0);
        for (int r = 0; r < a->rows; r++) {
            float acc = 0.0f;
            for (int g = 0; g < gpr; g++) {
                int32_t idot = 0;
                for (int i = 0; i < G; i++) {
                    size_t k = k0 + (size_t)g * G + i;
                    int q = q4 ? (vals[k >> 1] >> ((k & 1) * 4)) & 15 : vals[k];
                    idot += q * a->xq[qoff(&d, r, g, i)];
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

/* Element i of row o, as stored (q8/q4: dequantized as the codec does). */
static inline float wval(const ft_wmat *W, int o, int i)
{
    size_t k = (size_t)o * W->cols + i;
    switch (W->fmt) {
    case FT_WF_F32: return ((const float *)W->data)[k];
    case FT_WF_BF16: return ft_bf16_to_f32_1(((const uint16_t *)W->data)[k]);
    case FT_WF_F16: return ft_f16_to_f32_1(((const uint16_t *)W->data)[k]);
    default: {
        const uint8_t *par, *vals;
        size_t k0;
        ft_wk_qrow(W, o, &par, &vals, &k0);
        int g = i / W->group;
        size_t e = k0 + (size_t)i;
        int q = W->fmt == FT_WF_Q4 ? (vals[e >> 1] >> ((e & 1) * 4)) & 15 : vals[e];
        float m = ft_f16_to_f32_1((uint16_t)(par[4 * g] | par[4 * g + 1] << 8));
        float st = ft_f16_to_f32_1((uint16_t)(par[4 * g + 2] | par[4 * g + 3] << 8));
        return (float)q * st + m;
    }
    }
}

void ft_wk_product_ref(float *y, int ldy, const ft_wk_act *a, const ft_wmat *W, int o0, int o1,
                       const float *b)
{
    if (o0 >= o1) return;
    if (a->mode == FT_WK_X_Q8) { product_q_ref(y, ldy, a, W, o0, o1, b); return; }
    for (int o = o0; o < o1; o++)
        for (int r = 0; r < a->rows; r++) {
            float acc = 0.0f;
            if (a->mode == FT_WK_X_B16) {
                /* one fused chain per output (exact products: bf16 x bf16 fits f32) */
                const uint16_t *xh = a->xh + (size_t)r * a->ldh;
                for (int i = 0; i < W->cols; i++) acc = fmaf(ft_bf16_to_f32_1(xh[i]), wval(W, o, i), acc);
            } else if (a->mode == FT_WK_X_T) {
                /* one fused chain per output, as ft_k_matmul_xt_ref */
                const float *xt = a->xt + (size_t)(r / a->ldx) * W->cols * a->ldx + r % a->ldx;
                for (int i = 0; i < W->cols; i++) acc = fmaf(xt[(size_t)i * a->ldx], wval(W, o, i), acc);
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

static const ft_wk_table ref_table = {"scalar", ft_wk_product_ref, ft_wk_attend_h_ref, ft_wk_prep_q_ref};

static const ft_wk_table *tables[6];
static int ntables;
static const ft_wk_table *best;
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;

static void tables_init(void)
{
    tables[ntables++] = &ref_table;
    const ft_wk_table *t;
    if ((t = ft_wk_avx2())) tables[ntables++] = t;
    if ((t = ft_wk_avx512())) tables[ntables++] = t;
    if ((t = ft_wk_avx512vnni())) tables[ntables++] = t;
    if ((t = ft_wk_avx512bf16())) tables[ntables++] = t;
    best = tables[ntables - 1];
    /* vdpbf16ps only where it is measured faster than widening to f32 */
    if (best == ft_wk_avx512bf16() && ntables > 1 && ft_wk_bf16_gain() < 1.5) best = tables[ntables - 2];
    const char *want = getenv("FLEXTIER_WK_TABLE");
    for (int i = 0; want && i < ntables; i++)
        if (!strcmp(want, tables[i]->name)) best = tables[i];
}

const ft_wk_table *ft_wk_list(int i)
{
    pthread_once(&tables_once, tables_init);
    return i >= 0 && i < ntables ? tables[i] : NULL;
}

const ft_wk_table *ft_wk_best(void)
{
    pthread_once(&tables_once, tables_init);
    return best;
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
