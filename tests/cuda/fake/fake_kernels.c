/* CPU re-implementations of the CUDA backend's kernel launchers
 * (src/cuda/codec_kernels.cu, forward.cu) for the FT_CUDA=FAKE test
 * configuration (fake_cuda.h). Each launcher checks its arguments as the
 * real one does and enqueues a sequential version of the kernel on the
 * emulated stream. The codec kernels run the same kern_math.h functions
 * as the GPU; the compute kernels are plain loops (attention follows the
 * GPU kernel's tiled online softmax, so the algorithm is exercised). */
#include "fake_cuda.h"
#include "cuda/cuda_internal.h"
#include "engine/kernels.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#define ENQ(s, fn, a) do { void *p_ = malloc(sizeof a); memcpy(p_, &a, sizeof a); return fk_enqueue(s, fn, p_); } while (0)

/* ------------------------------------------------------------- codec */

typedef struct { void *dst; int ddt; const void *src; int sdt; uint64_t n; } conv_a;
static void conv_op(void *p)
{
    conv_a *a = p;
    for (uint64_t i = 0; i < a->n; i++) km_store(a->ddt, a->dst, i, km_load(a->sdt, a->src, i));
}
cudaError_t ftk_convert(void *dst, int dst_dt, const void *src, int src_dt, uint64_t n, cudaStream_t s)
{
    if (n == 0) return cudaSuccess;
    conv_a a = {dst, dst_dt, src, src_dt, n};
    ENQ(s, conv_op, a);
}

typedef struct { ftk_qgeom g; uint64_t *table; } qt_a;
static void qt_op(void *p) { qt_a *a = p; km_q_table(&a->g, a->table); }
cudaError_t ftk_q_table(const ftk_qgeom *g, uint64_t *table, cudaStream_t s)
{
    if (g->n_chunks == 0) return cudaSuccess;
    qt_a a = {*g, table};
    ENQ(s, qt_op, a);
}

typedef struct { ftk_qgeom g; const uint8_t *frame; const uint64_t *table; int odt; void *dst; } qd_a;
static void qd_op(void *p)
{
    qd_a *a = p;
    if (ftk_q_fast(&a->g, a->dst)) {   /* the device's dispatch: 8 at a time, no table */
        for (uint32_t t = 0; t < (uint32_t)(a->g.numel / 8); t++) {
            float v[8];
            km_q_dequant8(&a->g, a->frame, t, v);
            for (int j = 0; j < 8; j++) km_store(a->odt, a->dst, 8 * (uint64_t)t + (uint64_t)j, v[j]);
        }
        return;
    }
    for (uint64_t e = 0; e < a->g.numel; e++) km_store(a->odt, a->dst, e, km_q_dequant(&a->g, a->frame, a->table, e));
}
int ftk_q_fast(const ftk_qgeom *g, const void *dst) { return km_q_fast8_ok(g) && ((uintptr_t)dst & 15) == 0; }
cudaError_t ftk_q_dequant(const ftk_qgeom *g, const uint8_t *frame, const uint64_t *table, int out_dt, void *dst,
                          cudaStream_t s)
{
    if (g->numel == 0) return cudaSuccess;
    qd_a a = {*g, frame, table, out_dt, dst};
    ENQ(s, qd_op, a);
}

typedef struct { int dt; const uint8_t *planes; uint64_t numel, E; int odt; void *dst; } bp_a;
static void bp_op(void *p)
{
    bp_a *a = p;
    for (uint64_t e = 0; e < a->numel; e++)
        km_bp_store(a->dt, a->odt, a->dst, e, km_bp_bits(a->dt, a->planes, a->numel, a->E, e));
}
cudaError_t ftk_bp_merge(int dt, const uint8_t *planes, uint64_t numel, uint64_t chunk_elems, int out_dt, void *dst,
                         cudaStream_t s)
{
    if (numel == 0) return cudaSuccess;
    bp_a a = {dt, planes, numel, chunk_elems, out_dt, dst};
    ENQ(s, bp_op, a);
}

typedef struct {
    int bits;
    const float *src;
    uint64_t rows, n;
    uint32_t group;
    uint8_t *dst;
    float *par;
    unsigned long long *err;
} qre_a;
static void qre_op(void *p)
{
    qre_a *a = p;
    const uint64_t ng = a->n / a->group, nb = a->bits == 8 ? a->n : (a->n + 1) / 2, rb = 4 * ng + nb;
    for (uint64_t t = 0; t < a->rows * ng; t++) {          /* phase 1 */
        uint64_t r = t / ng, j = t - r * ng;
        uint16_t h = 0, sv = 0;
        float mn = 0, inv = 0;
        int bad = km_qrow_group(a->bits, a->src + r * a->n + j * a->group, a->group, &h, &sv, &mn, &inv);
        if (bad && 4 * t + (uint64_t)bad < *a->err) *a->err = 4 * t + (uint64_t)bad;
        uint8_t *hp = a->dst + r * rb + 4 * j;
        hp[0] = (uint8_t)h; hp[1] = (uint8_t)(h >> 8); hp[2] = (uint8_t)sv; hp[3] = (uint8_t)(sv >> 8);
        a->par[2 * t] = bad ? 0.0f : mn;
        a->par[2 * t + 1] = bad ? 0.0f : inv;
    }
    for (uint64_t t = 0; t < a->rows * nb; t++) {          /* phase 2 */
        uint64_t r = t / nb, b = t - r * nb;
        a->dst[r * rb + 4 * ng + b] = km_qrow_byte(a->bits, a->src + r * a->n, a->n, a->group, a->par + 2 * r * ng, b);
    }
}
cudaError_t ftk_qrow_encode(int bits, const float *src, uint64_t rows, uint64_t n, uint32_t group, uint8_t *dst,
                            void *params, unsigned long long *err, cudaStream_t s)
{
    if (rows == 0 || n == 0) return cudaSuccess;
    qre_a a = {bits, src, rows, n, group, dst, params, err};
    ENQ(s, qre_op, a);
}

typedef struct { int bits; const uint8_t *src; uint64_t rows, n; uint32_t group; float *dst; } qrd_a;
static void qrd_op(void *p)
{
    qrd_a *a = p;
    const uint64_t rb = 4 * (a->n / a->group) + (a->bits == 8 ? a->n : (a->n + 1) / 2);
    for (uint64_t t = 0; t < a->rows * a->n; t++) {
        uint64_t r = t / a->n, k = t - r * a->n;
        a->dst[t] = km_qrow_value(a->bits, a->src + r * rb, a->n, a->group, k);
    }
}
cudaError_t ftk_qrow_decode(int bits, const uint8_t *src, uint64_t rows, uint64_t n, uint32_t group, float *dst,
                            cudaStream_t s)
{
    if (rows == 0 || n == 0) return cudaSuccess;
    qrd_a a = {bits, src, rows, n, group, dst};
    ENQ(s, qrd_op, a);
}

/* ----------------------------------------------------------- compute */

static float ldw(int dt, const void *p, uint64_t i)
{
    return dt == FT_BF16 ? ft_bf16_to_f32_1(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

typedef struct { float *x; const void *emb; int dt; const int32_t *tok; const int *pos; int off, rows, E; } emb_a;
static void emb_op(void *p)
{
    emb_a *a = p;
    for (int r = 0; r < a->rows; r++)
        for (int i = 0; i < a->E; i++) {
            if (a->tok) a->x[(size_t)r * a->E + i] = ldw(a->dt, a->emb, (uint64_t)a->tok[r] * a->E + i);
            else a->x[(size_t)r * a->E + i] += ldw(a->dt, a->emb, (uint64_t)(a->pos[r] + a->off) * a->E + i);
        }
}
cudaError_t ftk_embed(float *x, const void *emb, int emb_dt, const int32_t *tokens, int rows, int E, cudaStream_t s)
{
    if (rows <= 0) return cudaSuccess;
    emb_a a = {x, emb, emb_dt, tokens, NULL, 0, rows, E};
    ENQ(s, emb_op, a);
}
cudaError_t ftk_add_pos(float *x, const void *pe, int pe_dt, const int *pos, int offset, int rows, int H, cudaStream_t s)
{
    if (rows <= 0) return cudaSuccess;
    emb_a a = {x, pe, pe_dt, NULL, pos, offset, rows, H};
    ENQ(s, emb_op, a);
}

typedef struct { float *out; const float *x, *w, *b; int rows, n, ln; float eps; } norm_a;
static void norm_op(void *p)
{
    norm_a *a = p;
    for (int r = 0; r < a->rows; r++) {
        float *o = a->out + (size_t)r * a->n;
        const float *x = a->x + (size_t)r * a->n;
        if (a->ln) ft_k_layernorm_ref(o, x, a->w, a->b, a->n, a->eps);
        else ft_k_rmsnorm_ref(o, x, a->w, a->n, a->eps);
    }
}
cudaError_t ftk_rmsnorm(float *out, const float *x, const float *w, int rows, int n, float eps, cudaStream_t s)
{
    if (rows <= 0) return cudaSuccess;
    norm_a a = {out, x, w, NULL, rows, n, 0, eps};
    ENQ(s, norm_op, a);
}
cudaError_t ftk_layernorm(float *out, const float *x, const float *w, const float *b, int rows, int n, float eps,
                          cudaStream_t s)
{
    if (rows <= 0) return cudaSuccess;
    norm_a a = {out, x, w, b, rows, n, 1, eps};
    ENQ(s, norm_op, a);
}

typedef struct { float *x; int rows, ld, nh, hd; const int *pos; const float *c, *sn; } rope_a;
static void rope_op(void *p)
{
    rope_a *a = p;
    int half = a->hd / 2;
    for (int r = 0; r < a->rows; r++)
        ft_k_rope_ref(a->x + (size_t)r * a->ld, a->nh, a->hd, a->c + (size_t)a->pos[r] * half,
                      a->sn + (size_t)a->pos[r] * half);
}
cudaError_t ftk_rope(float *x, int rows, int ld, int n_heads, int hd, const int *pos, const float *cos_t,
                     const float *sin_t, cudaStream_t s)
{
    if (rows <= 0) return cudaSuccess;
    rope_a a = {x, rows, ld, n_heads, hd, pos, cos_t, sin_t};
    ENQ(s, rope_op, a);
}

typedef struct { float *kc, *vc; const float *k, *v; const int *slot, *pos; int rows, kvdim, S; } kva_a;
static void kva_op(void *p)
{
    kva_a *a = p;
    for (int r = 0; r < a->rows; r++) {
        size_t d = ((size_t)a->slot[r] * a->S + (size_t)a->pos[r]) * a->kvdim;
        memcpy(a->kc + d, a->k + (size_t)r * a->kvdim, (size_t)a->kvdim * 4);
        memcpy(a->vc + d, a->v + (size_t)r * a->kvdim, (size_t)a->kvdim * 4);
    }
}
cudaError_t ftk_kv_append(float *kc, float *vc, const float *k, const float *v, const int *row_slot,
                          const int *row_pos, int rows, int kvdim, int max_seq, cudaStream_t s)
{
    if (rows <= 0) return cudaSuccess;
    kva_a a = {kc, vc, k, v, row_slot, row_pos, rows, kvdim, max_seq};
    ENQ(s, kva_op, a);
}

typedef struct {
    float *out;
    const float *q, *kc, *vc;
    const int *slot, *pos;
    int rows, nh, nkv, hd, S;
    float scale;
} att_a;
/* The GPU kernel's algorithm, sequentially: tiles of 128 positions, the
 * running max m, sum l and accumulator rescaled by exp(m - m'). */
static void att_op(void *p)
{
    att_a *a = p;
    const int kvdim = a->nkv * a->hd, qdim = a->nh * a->hd, T = 128;
    float *acc = malloc((size_t)a->hd * 4), sc[128];
    for (int r = 0; r < a->rows; r++)
        for (int h = 0; h < a->nh; h++) {
            int kvh = h / (a->nh / a->nkv), npos = a->pos[r] + 1;
            size_t c0 = (size_t)a->slot[r] * a->S * kvdim + (size_t)kvh * a->hd;
            const float *K = a->kc + c0, *V = a->vc + c0, *q = a->q + (size_t)r * qdim + (size_t)h * a->hd;
            float m = -INFINITY, l = 0;
            for (int d = 0; d < a->hd; d++) acc[d] = 0;
            for (int p0 = 0; p0 < npos; p0 += T) {
                int nt = npos - p0 < T ? npos - p0 : T;
                float tm = -INFINITY;
                for (int t = 0; t < nt; t++) {
                    float dot = 0;
                    for (int d = 0; d < a->hd; d++) dot += q[d] * K[(size_t)(p0 + t) * kvdim + d];
                    sc[t] = dot * a->scale;
                    tm = fmaxf(tm, sc[t]);
                }
                float mn = fmaxf(m, tm), alpha = expf(m - mn), ts = 0;
                for (int t = 0; t < nt; t++) { sc[t] = expf(sc[t] - mn); ts += sc[t]; }
                l = l * alpha + ts;
                for (int d = 0; d < a->hd; d++) {
                    float x = acc[d] * alpha;
                    for (int t = 0; t < nt; t++) x += sc[t] * V[(size_t)(p0 + t) * kvdim + d];
                    acc[d] = x;
                }
                m = mn;
            }
            for (int d = 0; d < a->hd; d++) a->out[(size_t)r * qdim + (size_t)h * a->hd + d] = acc[d] / l;
        }
    free(acc);
}
cudaError_t ftk_attention(float *out, const float *q, const float *kc, const float *vc, const int *row_slot,
                          const int *row_pos, int rows, int n_heads, int n_kv_heads, int hd, int max_seq, float scale,
                          cudaStream_t s)
{
    if (rows <= 0) return cudaSuccess;
    if (hd > 1024 || n_kv_heads <= 0 || n_heads % n_kv_heads) return cudaErrorInvalidValue;
    att_a a = {out, q, kc, vc, row_slot, row_pos, rows, n_heads, n_kv_heads, hd, max_seq, scale};
    ENQ(s, att_op, a);
}

typedef struct { float *x; const float *y; uint64_t n; int rows, cols, kind; } ew_a;
static void ew_op(void *p)
{
    ew_a *a = p;
    if (a->kind == 0) ft_k_silu_mul_ref(a->x, a->y, (int)a->n);
    else if (a->kind == 1) for (uint64_t i = 0; i < a->n; i++) a->x[i] = a->x[i] > 0 ? a->x[i] : 0;
    else if (a->kind == 2) for (uint64_t i = 0; i < a->n; i++) a->x[i] += a->y[i];
    else
        for (int r = 0; r < a->rows; r++)
            for (int c = 0; c < a->cols; c++) a->x[(size_t)r * a->cols + c] += a->y[c];
}
cudaError_t ftk_silu_mul(float *g, const float *u, uint64_t n, cudaStream_t s)
{
    if (n == 0) return cudaSuccess;
    ew_a a = {g, u, n, 0, 0, 0};
    ENQ(s, ew_op, a);
}
cudaError_t ftk_relu(float *x, uint64_t n, cudaStream_t s)
{
    if (n == 0) return cudaSuccess;
    ew_a a = {x, NULL, n, 0, 0, 1};
    ENQ(s, ew_op, a);
}
cudaError_t ftk_add(float *x, const float *y, uint64_t n, cudaStream_t s)
{
    if (n == 0) return cudaSuccess;
    ew_a a = {x, y, n, 0, 0, 2};
    ENQ(s, ew_op, a);
}
cudaError_t ftk_add_bias(float *y, const float *b, int rows, int n, cudaStream_t s)
{
    if (rows <= 0 || n <= 0) return cudaSuccess;
    ew_a a = {y, b, 0, rows, n, 3};
    ENQ(s, ew_op, a);
}

typedef struct { float *dst; const float *src; const int *idx; int nrows, n; } gat_a;
static void gat_op(void *p)
{
    gat_a *a = p;
    for (int r = 0; r < a->nrows; r++)
        memcpy(a->dst + (size_t)r * a->n, a->src + (size_t)a->idx[r] * a->n, (size_t)a->n * 4);
}
cudaError_t ftk_gather_rows(float *dst, const float *src, const int *idx, int nrows, int n, cudaStream_t s)
{
    if (nrows <= 0) return cudaSuccess;
    gat_a a = {dst, src, idx, nrows, n};
    ENQ(s, gat_op, a);
}

typedef struct { int32_t *out; const float *x; int rows, V; } am_a;
static void am_op(void *p)
{
    am_a *a = p;
    for (int r = 0; r < a->rows; r++) {
        float bv = -INFINITY;
        int bi = INT_MAX;
        for (int i = 0; i < a->V; i++) {
            float v = a->x[(size_t)r * a->V + i];
            if (km_argmax_better(v, i, bv, bi)) { bv = v; bi = i; }
        }
        a->out[r] = bi == INT_MAX ? 0 : bi;
    }
}
cudaError_t ftk_argmax(int32_t *out, const float *logits, int rows, int vocab, cudaStream_t s)
{
    if (rows <= 0) return cudaSuccess;
    am_a a = {out, logits, rows, vocab};
    ENQ(s, am_op, a);
}
