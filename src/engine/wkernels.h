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
 * The activation form ("mode") depends only on the weight format and the
 * number of rows, never on the CPU, so every kernel table computes the
 * same mathematical product and each SIMD table is tested against the
 * scalar one:
 *
 *   F32 weights                 x as given (exact f32 products; 8..32 rows
 *                               on AVX-512 use x transposed, as the f32
 *                               engine path did, for ft_k_matmul_xt)
 *   BF16 weights, rows <= 32    x as given: f32 x times the weight widened
 *                               exactly to f32 (decode: exact products,
 *                               f32 sums, memory-bound)
 *   BF16 weights, rows > 32     x rounded to bf16 (RNE): bf16 x bf16
 *                               products are exact in f32, summed in f32
 *                               (AVX-512 BF16 vdpbf16ps; prefill)
 *   F16 weights (any rows)      x as given, weights widened exactly
 *   Q8/Q4 weights (any rows)    x quantized per weight group: symmetric
 *                               int8, scale xs = max|x| / 127 per (row,
 *                               group), xq = round_half_even(x * 127/max|x|)
 *                               (0 when the group is all zero). The
 *                               product is then exactly
 *                                 sum_g sum_{i in g} (xq_i xs) (q_i s + m)
 *                               = sum_g xs s dot(xq, q) + m xs sum(xq),
 *                               i.e. dequantized activations times
 *                               dequantized weights, with integer dots
 *                               (AVX-512 VNNI vpdpbusd, AVX2 vpmaddubsw)
 *                               and f32 sums.
 *
 * Bounds (tests/engine/test_wkernels.c checks them, with measured values
 * in docs/engine.md): a SIMD table equals the scalar table within f32
 * reassociation, |d| <= 2^-20 * sum_i |x_i w_i| (+ the bias's last bit);
 * the q8/q4 product differs from exact f32 math on the dequantized
 * weights by at most sum_g (xs_g / 2) sum_{i in g} |w_i| (activation
 * rounding) plus reassociation; bf16 prefill by at most
 * 2^-8 sum_i |x_i w_i| (activation rounding). */
#ifndef FT_ENGINE_WKERNELS_H
#define FT_ENGINE_WKERNELS_H

#include "flextier/engine.h"

#include <stddef.h>
#include <stdint.h>

/* Products with at most this many rows take the decode path. */
#define FT_WK_DECODE_ROWS 32

typedef enum ft_wk_mode {
    FT_WK_X_F32 = 0,    /* x used as given (not copied)                  */
    FT_WK_X_BF16 = 1,   /* x rounded to bf16, rows x ldb, zero padded   */
    FT_WK_X_Q8 = 2      /* x quantized per group to int8                 */
} ft_wk_mode;

/* Prepared activations: pointers into the caller's workspace (and, for
 * FT_WK_X_F32, to the caller's x, which must stay valid and unchanged
 * until the products that use it are done). */
typedef struct ft_wk_act {
    ft_wk_mode mode;
    ft_wfmt fmt;             /* the weights' format it was prepared for */
    int rows, cols, group;
    const float *x;          /* X_F32: rows x cols, row stride cols          */
    const float *xt;         /* X_F32, F32 weights, 8..32 rows on AVX-512:
                                x transposed, xt[i*ldx + r] (ft_k_transpose_rows) */
    int ldx;
    const uint16_t *xb;      /* X_BF16: rows x ldb bf16, ldb = cols rounded
                                up to 32, zeros past cols                  */
    int ldb;
    /* X_Q8: group g of row r is gpad = group rounded up to 64 bytes at
     * xq + (r*gpr + g)*gpad, in units of 64 elements; q4 (and only q4)
     * stores each unit's even elements first, the odd ones from byte 32
     * (so that low nibbles meet evens); zero padded. xs[r*gpr + g] is the
     * group's scale, xsum[r*gpr + g] = xs * sum of its int8 values. */
    const int8_t *xq;
    int gpad, gpr;
    const float *xs, *xsum;
} ft_wk_act;

/* Check a matrix view against the ft_wmat contract (sizes, format, group
 * dividing cols, chunk pointers present). The detail names `what`. The
 * chunk sizes cannot be checked here: the caller guarantees each chunk
 * holds its rows' parameters and values (as a verified frame does). */
ft_status ft_wmat_check(const ft_wmat *W, const char *what);

/* Bytes of workspace ft_wk_prep needs for `rows` rows against W (0 when
 * x is used as given). */
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

/* ----------------------------------------------------- kernel tables */

typedef struct ft_wk_table {
    const char *name;
    void (*product)(float *y, int ldy, const ft_wk_act *a, const ft_wmat *W, int o0, int o1,
                    const float *b);
    void (*attend_h)(float *out, const float *q, const uint16_t *K, const uint16_t *V, int ld,
                     int npos, int hd, float scale, float *sc, int f16);
} ft_wk_table;

/* Every table usable on this CPU: 0 is the scalar reference (always),
 * then the SIMD ones; NULL past the end. FLEXTIER_NO_SIMD=1 leaves only
 * the scalar one. */
const ft_wk_table *ft_wk_list(int i);
/* The table ft_wk_product / ft_wk_attend_h use (the last of the list). */
const ft_wk_table *ft_wk_best(void);

/* Scalar references (the definitions). */
void ft_wk_product_ref(float *y, int ldy, const ft_wk_act *a, const ft_wmat *W, int o0, int o1,
                       const float *b);
void ft_wk_attend_h_ref(float *out, const float *q, const uint16_t *K, const uint16_t *V, int ld,
                        int npos, int hd, float scale, float *sc, int f16);

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
const ft_wk_table *ft_wk_avx512(void);     /* + AVX-512 F/BW/VL; q8/q4 with
                                              VNNI where present, else as avx2 */
const ft_wk_table *ft_wk_avx512bf16(void); /* + AVX512_BF16 (vdpbf16ps
                                              prefill) and AVX512_VNNI   */
#endif
