/* Internal: matrix products on weights as they are stored (ft_wmat,
 * include/flextier/engine.h: f32, bf16, f16 row-major; q8/q4 group-
 * quantized in the codec's chunk layout), and attention over a bf16/f16
 * KV cache. Documented with measurements in docs/engine.md, "Kernels on
 * stored formats".
 *
 * One linear layer, y[r*ldy + o] = sum_i x[r*cols + i] * W[o][i] (+ b[o])
 * for r < rows, is computed in two steps:
 *
 *   1. ft_wk_prep: once per product, before the output rows are split
 *      over threads. It prepares the activations into a workspace the
 *      caller provides (ft_wk_ws_size bytes, 64-byte aligned; nothing is
 *      allocated) and fills an ft_wk_act that points into it.
 *   2. ft_wk_product over output rows [o0, o1): thread-safe for disjoint
 *      ranges sharing one ft_wk_act (read only), so the engine splits
 *      [0, W->rows) over its pool. Any split computes the same values.
 *
 * The activation form ("mode") depends only on the weight format, the
 * number of rows and (bf16) ft_wk_bf16_activations(), never on the CPU, so every kernel table computes the
 * same mathematical product and each SIMD table is tested against the
 * scalar one:
 *
 *   f32 rows < 16,              FT_WK_X_F32: x as given. Exact f32
 *   bf16/f16 rows < 25          products (16-bit weights widened exactly:
 *                               bf16 by a shift, f16 by vcvtph2ps), f32
 *                               sums. Decode: memory-bound. (bf16: also
 *                               x deinterleaved, xd, for the SIMD tables.)
 *   f32 rows >= 16,             FT_WK_X_T: x transposed into blocks of
 *   bf16/f16 rows >= 25         ldx rows (16 when rows <= 16, else 32).
 *                               Weight rows (f32 as stored; bf16/f16
 *                               widened, q8/q4 dequantized as the codec
 *                               decodes them, into a small f32 panel per
 *                               block of columns) are broadcast against
 *                               vectors of x along the rows: exact f32
 *                               products of the stored (dequantized)
 *                               weights and the f32 activations, f32 sums.
 *   bf16 with bf16 activations  FT_WK_X_B16 (ft_wk_bf16_activations(),
 *   on (any rows)               replacing both forms above): x rounded to
 *                               bf16 (RNE, as ft_f32_to_bf16_1), rows
 *                               padded with zeros to 32 columns: exact
 *                               products of bf16 x and bf16 w, f32 sums.
 *                               Batch-invariant: in every table each
 *                               output is one fixed sequence of operations
 *                               on its own row of x and row of W, whatever
 *                               the row count and the output range, so a
 *                               row's result has the same bits alone or
 *                               among others (tested). avx512bf16: dot
 *                               kernels with vdpbf16ps (lane l of 16 sums
 *                               the pairs at columns 32k + 2l, k in order,
 *                               then one fixed reduction); the others
 *                               widen both to f32 and use FMAs.
 *   q8/q4 (any rows)            FT_WK_X_Q8: x quantized per weight group:
 *                               symmetric int8, scale xs = max|x| / 127 per
 *                               (row, group), xq = round_half_even(x *
 *                               (127 / max|x|)) (0 for an all-zero group).
 *                               The product is then exactly
 *                                 sum_g sum_{i in g} (xq_i xs) (q_i s + m)
 *                               = sum_g xs s dot(xq, q) + m xs sum(xq),
 *                               dequantized activations times dequantized
 *                               weights, with integer dots (AVX-512 VNNI
 *                               vpdpbusd, AVX2 vpmaddubsw) and f32 sums.
 *                               xs * sum(xq) (not the exact sum of x) in
 *                               the min term keeps it that product.
 *                               (FT_WK_X_T also serves q8/q4, exactly, if
 *                               ft_wk_set_xt_rows asks: slower, measured.)
 *
 * Bounds (tests/engine/test_wkernels.c checks them, with measured values
 * in docs/engine.md): a SIMD table equals the scalar table within f32
 * reassociation, |d| <= 2 (n + 64) 2^-24 sum_i |x_i w_i| (+ the bias's
 * last bit); the q8/q4 product differs from exact f32 math on the
 * dequantized weights by at most sum_g (xs_g / 2) sum_{i in g} |w_i|
 * (activation rounding) plus reassociation; every other mode by
 * reassociation only (bf16 X_B16: the rounded x is the operand; against
 * the unrounded x the activation rounding adds at most 2^-8 S). */
#ifndef FT_ENGINE_WKERNELS_H
#define FT_ENGINE_WKERNELS_H

#include "flextier/engine.h"

#include <stddef.h>
#include <stdint.h>

typedef enum ft_wk_mode {
    FT_WK_X_F32 = 0,    /* x used as given (bf16: also deinterleaved)    */
    FT_WK_X_T = 1,      /* x transposed in blocks of ldx rows            */
    FT_WK_X_Q8 = 2,     /* x quantized per group to int8                 */
    FT_WK_X_B16 = 3     /* bf16 weights: x rounded to bf16 (every row count) */
} ft_wk_mode;

/* Prepared activations: pointers into the caller's workspace (and, for
 * FT_WK_X_F32, to the caller's x, which must stay valid and unchanged
 * until the products that use it are done). */
typedef struct ft_wk_act {
    ft_wk_mode mode;
    ft_wfmt fmt;             /* the weights' format it was prepared for */
    int rows, cols, group;
    const float *x;          /* X_F32: rows x cols, row stride cols          */
    /* X_F32 with bf16 weights and cols >= 32: x deinterleaved per 32
     * columns (row r at xd + r*(cols & ~31); block i: x[i + 2k] at i + k,
     * x[i + 2k + 1] at i + 16 + k, k < 16; the last cols % 32 columns
     * only in x), so that 32 bf16 weights widen with one shift (evens) and
     * one AND (odds); else NULL. */
    const float *xd;
    /* X_T: block b (rows [b*ldx, b*ldx + ldx)) at xt + b*cols*ldx holds
     * x[b*ldx + j][i] at [i*ldx + j], zeros past `rows`; 64-byte aligned. */
    const float *xt;
    int ldx, nblk;
    /* X_B16: row r's values rounded to bf16 at xh + r*ldh (ldh = cols
     * rounded up to a multiple of 32, zeros past cols); 64-byte aligned. */
    const uint16_t *xh;
    int ldh;
    /* X_Q8: rows are taken in quads (4 rows, zero padded past `rows`).
     * Group g of quad q is nsb 16-element sub-blocks, sub-block s at
     * xq + ((q*gpr + g)*nsb + s)*64: 16 bytes per row of the quad, q4
     * (only) storing each sub-block's even elements first, then its odd
     * ones (so that low nibbles meet evens); a group whose size is not a
     * multiple of 16 is zero padded. Per (quad, group), 16 floats:
     * xs4 = the rows' scales, each repeated 4 times (lane 4j + l: row j);
     * xsum4 = (xs * sum of the row's int8 values) in lane 4j, 0 elsewhere.
     * xs / xsum: the same per (row, group), [r*gpr + g].
     * One row (row1 = 1) is laid out for a one-row kernel instead: group
     * g is nu = ceil(group / 64) units of 64 bytes at xq + (g*nu + u)*64,
     * q4 storing a unit's even elements first and its odd ones from byte
     * 32 (where a unit's 32 weight bytes put their high nibbles). q4 with
     * group 64 (the default) instead interleaves 4 groups, so that one
     * vpdpbusd serves 4 groups (16 bytes each, in 4-lane quarters): group
     * g = 4c + j, element e = 32h + 2i + d (h, d in {0, 1}, i < 16) at
     * xq + c*256 + (2h + d)*64 + j*16 + i (ft_wk_qpos1). */
    const int8_t *xq;
    int nsb, gpr, nquad, row1, nu;
    const float *xs4, *xsum4, *xs, *xsum;
} ft_wk_act;

/* Check a matrix view against the ft_wmat contract (sizes, format, group
 * dividing cols, chunk pointers present). The detail names `what`. The
 * chunk sizes cannot be checked here: the caller guarantees each chunk
 * holds its rows' parameters and values (as a verified frame does). */
ft_status ft_wmat_check(const ft_wmat *W, const char *what);

/* Bytes of workspace ft_wk_prep needs for `rows` rows against W (0 when
 * x is used as given only). */
size_t ft_wk_ws_size(const ft_wmat *W, int rows);

/* Prepare x (rows x W->cols f32, row stride W->cols) for products with W.
 * ws: ft_wk_ws_size(W, rows) bytes, 64-byte aligned (NULL when that is
 * 0). Errors (FT_ERR_INVALID_ARG): rows < 1, a bad W, a short or
 * misaligned workspace. Non-finite x gives NaN outputs for the q8/q4
 * group that holds it (IEEE semantics elsewhere). */
ft_status ft_wk_prep(ft_wk_act *a, void *ws, size_t ws_size, const ft_wmat *W,
                     const float *x, int rows);

/* y[r*ldy + o] = sum_i x[r][i] W[o][i] (+ b[o]) for r < a->rows and
 * o0 <= o < o1 (0 <= o0 <= o1 <= W->rows); b indexed by o (NULL: none).
 * W must be the matrix `a` was prepared for. Writes only those outputs. */
void ft_wk_product(float *y, int ldy, const ft_wk_act *a, const ft_wmat *W, int o0, int o1,
                   const float *b);

/* One query row of attention over a bf16 (f16 = 0) or f16 (f16 = 1) KV
 * cache: as ft_k_attend (src/engine/kernels.h) with K and V rows of
 * 16-bit values widened exactly to f32; f32 math. Append a K/V row with
 * ft_f32_to_bf16 / ft_f32_to_f16 (include/flextier/core.h; RNE). */
void ft_wk_attend_h(float *out, const float *q, const uint16_t *K, const uint16_t *V, int ld,
                    int npos, int hd, float scale, float *sc, int f16);

/* Benchmarks only (not thread-safe; call while no product runs): the row
 * count from which `fmt` uses FT_WK_X_T (0: the default, 16 for f32,
 * 25 for bf16/f16, never for q8/q4; not bf16 with bf16 activations on,
 * which is FT_WK_X_B16 at every row count). Changes which mode ft_wk_prep
 * picks, so bench_wkernels can compare the two at the same sizes. */
void ft_wk_set_xt_rows(ft_wfmt fmt, int rows);

/* ----------------------------------------------------- kernel tables */

/* Where the X_Q8 quantizer writes (ft_wk_act's layout). */
typedef struct ft_wk_qdst {
    int8_t *xq;
    float *xs4, *xsum4, *xs, *xsum;
    int cols, group, gpr, nsb, q4, row1, nu;
} ft_wk_qdst;

/* Row r, group g's scale and xs * sum(xq) into the four float arrays. */
static inline void ft_wk_prep_q_put(const ft_wk_qdst *d, int r, int g, float s, float sum)
{
    size_t k = (size_t)(r >> 2) * (size_t)d->gpr + (size_t)g;
    for (int l = 0; l < 4; l++) d->xs4[k * 16 + (size_t)(r & 3) * 4 + (size_t)l] = s;
    d->xsum4[k * 16 + (size_t)(r & 3) * 4] = sum;
    d->xs[(size_t)r * d->gpr + (size_t)g] = s;
    d->xsum[(size_t)r * d->gpr + (size_t)g] = sum;
}

/* Position of element i of a group: one-row layout (64-element units)
 * and the quad layout (16-element sub-blocks). */
static inline size_t ft_wk_qpos1(int q4, int nu, int G, int g, int i)
{
    if (q4 && G == 64)
        return (size_t)(g >> 2) * 256 + (size_t)((i >> 5) * 2 + (i & 1)) * 64 + (size_t)(g & 3) * 16 +
               (size_t)((i & 31) >> 1);
    int j = i & 63;
    if (q4) j = (j & 1) ? 32 + (j >> 1) : (j >> 1);
    return ((size_t)g * (size_t)nu + (size_t)(i >> 6)) * 64 + (size_t)j;
}

/* Byte offset of sub-block sb (16 elements) of group g of row r in
 * the X_Q8 quad layout; element e of the sub-block at + e (q8) or + (e odd ?
 * 8 + e/2 : e/2) (q4). */
static inline size_t ft_wk_qsub(int gpr, int nsb, int r, int g, int sb)
{
    return (((size_t)(r >> 2) * (size_t)gpr + (size_t)g) * (size_t)nsb + (size_t)sb) * 64 + (size_t)(r & 3) * 16;
}

typedef struct ft_wk_table {
    const char *name;
    void (*product)(float *y, int ldy, const ft_wk_act *a, const ft_wmat *W, int o0, int o1,
                    const float *b);
    void (*attend_h)(float *out, const float *q, const uint16_t *K, const uint16_t *V, int ld,
                     int npos, int hd, float scale, float *sc, int f16);
    /* the X_Q8 activation quantizer for rows [0, rows), into zeroed
     * buffers: the same bytes in every table */
    void (*prep_q)(const ft_wk_qdst *d, const float *x, int rows);
} ft_wk_table;

/* Every table usable on this CPU: 0 is the scalar reference (always),
 * then the SIMD ones; NULL past the end. FLEXTIER_NO_SIMD=1 leaves only
 * the scalar one. */
const ft_wk_table *ft_wk_list(int i);
/* The table ft_wk_product / ft_wk_attend_h use: the last of the list,
 * except that avx512bf16 is used only where vdpbf16ps measured at least
 * 1.5x the multiply-adds per second of f32 FMAs (ft_wk_bf16_gain; AMD
 * Zen 4: 2x; Sapphire Rapids: 1x, half-rate instruction), else the one
 * before it. FLEXTIER_WK_TABLE=NAME picks a table of the list by name
 * (benchmarks; unknown or unusable names are ignored). */
const ft_wk_table *ft_wk_best(void);

/* Scalar references (the definitions). */
void ft_wk_product_ref(float *y, int ldy, const ft_wk_act *a, const ft_wmat *W, int o0, int o1,
                       const float *b);
void ft_wk_attend_h_ref(float *out, const float *q, const uint16_t *K, const uint16_t *V, int ld,
                        int npos, int hd, float scale, float *sc, int f16);
void ft_wk_prep_q_ref(const ft_wk_qdst *d, const float *x, int rows);

/* Helper shared with the SIMD file: row o of a q8/q4 matrix has its
 * gpr (min, step) f16 pairs at *par and its value j at index *k0 + j of
 * *vals (q8: byte; q4: nibble, the low one when the index is even; the
 * row starts on a byte when cols is even). */
static inline void ft_wk_qrow(const ft_wmat *W, int o, const uint8_t **par, const uint8_t **vals,
                              size_t *k0)
{
    int rpc = W->rows_per_chunk, c = o / rpc, lr = o % rpc;
    int nc = W->rows - c * rpc < rpc ? W->rows - c * rpc : rpc;
    size_t gpr = (size_t)(W->cols / W->group);
    const uint8_t *ch = W->chunk[c];
    *par = ch + 4 * (size_t)lr * gpr;
    *vals = ch + 4 * (size_t)nc * gpr;
    *k0 = (size_t)lr * (size_t)W->cols;
}

/* SIMD tables (wkernels_x86.c); NULL when the CPU lacks what they need. */
const ft_wk_table *ft_wk_avx2(void);       /* AVX2 + FMA + F16C            */
const ft_wk_table *ft_wk_avx512(void);     /* + AVX-512 F/BW/VL (q8/q4 decode
                                              as avx2)                    */
const ft_wk_table *ft_wk_avx512vnni(void); /* + AVX512_VNNI (q8/q4 decode) */
const ft_wk_table *ft_wk_avx512bf16(void); /* + AVX512_BF16 (bf16 X_B16: vdpbf16ps) */
/* Multiply-adds per second of vdpbf16ps over f32 FMAs (zmm, register
 * loops, best of a few short runs; 0 without AVX512_BF16). */
double ft_wk_bf16_gain(void);

/* bf16 weights compute on x rounded to bf16 (FT_WK_X_B16, at every row
 * count: batch-invariant; what llama.cpp does at every batch size; with
 * the avx512bf16 table vdpbf16ps on the stored weights, 2x the f32 FMAs
 * per instruction on AMD Zen 4) only when this is on; off, bf16 products
 * take x as given (exact f32 activations). Default from the environment,
 * FLEXTIER_BF16_ACTIVATIONS=1 (docs/engine.md says why it is not the
 * default); the setter is for tests and benchmarks (not thread-safe
 * against products in flight, and a context's workspace is sized for
 * both settings). */
int ft_wk_bf16_activations(void);
void ft_wk_set_bf16_activations(int on);
#endif
