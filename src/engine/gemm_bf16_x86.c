/* bf16 GEMM kernels with vdpbf16ps (contract and order of operations:
 * gemm_bf16.h). Compiled with target attributes, called only where
 * ft_gb_simd() says the CPU has AVX512_BF16.
 *
 * Per block of 64 outputs and chunk of FT_GB_KC values of k, a panel
 * pan[p][j] holds the pair (B(2p, n0 + j), B(2p + 1, n0 + j)) as one
 * 32-bit word (zeros past K and past the outputs): 4 vectors per pair.
 * Every 6 rows of A then run over it: per pair, 6 broadcasts of A's
 * 32-bit pair and 24 vdpbf16ps into 24 accumulators (6 rows x 64
 * outputs, each output in one lane: no horizontal sums, C's rows stored
 * as vectors). */
#include "gemm_bf16.h"

#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>

#define BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma")))
#define INL inline __attribute__((always_inline))
#if defined(__SANITIZE_ADDRESS__)
#define FT_GB_SANITIZE 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FT_GB_SANITIZE 1
#endif
#endif
#ifdef FT_GB_SANITIZE
#define UNROLL
#else
#define UNROLL _Pragma("GCC unroll 32")
#endif

enum { NR = 64, NP = FT_GB_KC / 2 };

/* 16 x 16 32-bit transpose: r[i] = row i in, column i out */
BF16 static INL void tr16x16(__m512i r[16])
{
    __m512i t[16];
    UNROLL for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    UNROLL for (int i = 0; i < 4; i++) {
        r[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    UNROLL for (int i = 0; i < 4; i++) {
        t[i] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0x88);
        t[i + 4] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0xDD);
        t[i + 8] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0x88);
        t[i + 12] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0xDD);
    }
    UNROLL for (int i = 0; i < 8; i++) {
        r[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
        r[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xDD);
    }
}

static INL uint32_t pair_nt(const uint16_t *w, int k, int K)
{
    return (uint32_t)w[k] | (k + 1 < K ? (uint32_t)w[k + 1] << 16 : 0u);
}

/* nt panel: pan[p*64 + j] = W[n0 + j][k0 + 2p .. + 1] for j < nn, pairs p < np */
BF16 static void pack_nt(uint32_t *pan, const uint16_t *W, int ldw, int K, int n0, int nn, int k0, int np)
{
    int j = 0;
    for (; j + 16 <= nn; j += 16) {
        int p = 0;
        /* whole tiles: 16 rows x 32 values, inside K */
        for (; p + 16 <= np && k0 + 2 * p + 32 <= K; p += 16) {
            __m512i r[16];
            UNROLL for (int i = 0; i < 16; i++)
                r[i] = _mm512_loadu_si512(W + (size_t)(n0 + j + i) * (size_t)ldw + (size_t)(k0 + 2 * p));
            tr16x16(r);
            UNROLL for (int i = 0; i < 16; i++) _mm512_store_si512(pan + (size_t)(p + i) * NR + (size_t)j, r[i]);
        }
        for (; p < np; p++)
            for (int i = 0; i < 16; i++)
                pan[(size_t)p * NR + (size_t)(j + i)] =
                    pair_nt(W + (size_t)(n0 + j + i) * (size_t)ldw, k0 + 2 * p, K);
    }
    for (; j < NR; j++)
        for (int p = 0; p < np; p++)
            pan[(size_t)p * NR + (size_t)j] = j < nn ? pair_nt(W + (size_t)(n0 + j) * (size_t)ldw, k0 + 2 * p, K) : 0u;
}

/* nn panel: pan[p*64 + j] = (W[k0 + 2p][n0 + j], W[k0 + 2p + 1][n0 + j]) */
BF16 static void pack_nn(uint32_t *pan, const uint16_t *W, int ldw, int K, int n0, int nn, int k0, int np)
{
    const __m512i lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6,
                                        37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
    const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
    __mmask32 m[2];
    for (int h = 0; h < 2; h++) {
        int c = nn - 32 * h;
        m[h] = c >= 32 ? ~(__mmask32)0 : c <= 0 ? 0 : (__mmask32)((1u << c) - 1);
    }
    for (int p = 0; p < np; p++) {
        int ka = k0 + 2 * p;
        const uint16_t *ra = W + (size_t)ka * (size_t)ldw + (size_t)n0;
        const uint16_t *rb = ka + 1 < K ? ra + ldw : NULL;
        UNROLL for (int h = 0; h < 2; h++) {
            __m512i a = _mm512_maskz_loadu_epi16(m[h], ra + 32 * h);
            __m512i b = rb ? _mm512_maskz_loadu_epi16(m[h], rb + 32 * h) : _mm512_setzero_si512();
            _mm512_store_si512(pan + (size_t)p * NR + 32 * h, _mm512_permutex2var_epi16(a, lo, b));
            _mm512_store_si512(pan + (size_t)p * NR + 32 * h + 16, _mm512_permutex2var_epi16(a, hi, b));
        }
    }
}

/* MR rows of C (outputs n0 .. n0 + 63, masks m) from the panel: first:
 * C = s, else C + s; bias: then + bias */
BF16 static INL void kern(float *C, int ldc, const uint16_t *A, int lda, const uint32_t *pan, int np, const int MR,
                          const __mmask16 *m, int first, const float *bias)
{
    __m512 acc[6][4];
    UNROLL for (int r = 0; r < MR; r++) UNROLL for (int v = 0; v < 4; v++) acc[r][v] = _mm512_setzero_ps();
    for (int p = 0; p < np; p++) {
        __m512bh b[4];
        UNROLL for (int v = 0; v < 4; v++) b[v] = (__m512bh)_mm512_load_si512(pan + (size_t)p * NR + 16 * v);
        UNROLL for (int r = 0; r < MR; r++) {
            int32_t w;
            memcpy(&w, A + (size_t)r * (size_t)lda + 2 * (size_t)p, sizeof w);
            __m512bh a = (__m512bh)_mm512_set1_epi32(w);
            UNROLL for (int v = 0; v < 4; v++) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], a, b[v]);
        }
    }
    UNROLL for (int r = 0; r < MR; r++) UNROLL for (int v = 0; v < 4; v++) {
        float *c = C + (size_t)r * (size_t)ldc + 16 * v;
        __m512 s = acc[r][v];
        if (!first) s = _mm512_add_ps(_mm512_maskz_loadu_ps(m[v], c), s);
        if (bias) s = _mm512_add_ps(s, _mm512_maskz_loadu_ps(m[v], bias + 16 * v));
        _mm512_mask_storeu_ps(c, m[v], s);
    }
}

/* The source lines of a panel, prefetched into L2 while the panel
 * before it is computed on (the weights come from DRAM; nn reads 128
 * bytes of each of 256 rows, which the hardware prefetchers do not
 * follow): rows of `lines` 64-byte lines from base, stride apart. */
typedef struct {
    const char *base;
    size_t stride;
    int rows, lines;
} gb_src;

static gb_src gb_src_of(int nn, const uint16_t *W, int ldw, int K, int n1, int nb, int k0)
{
    gb_src s = {NULL, (size_t)ldw * 2, 0, 0};
    if (nb >= n1) return s;
    const int cnt = n1 - nb < NR ? n1 - nb : NR, kn = K - k0 < FT_GB_KC ? K - k0 : FT_GB_KC;
    if (nn) {
        s.base = (const char *)(W + (size_t)k0 * (size_t)ldw + (size_t)nb);
        s.rows = kn;
        s.lines = (cnt * 2 + 63) / 64 + 1;
    } else {
        s.base = (const char *)(W + (size_t)nb * (size_t)ldw + (size_t)k0);
        s.rows = cnt;
        s.lines = (kn * 2 + 63) / 64 + 1;
    }
    return s;
}

static INL void gb_prefetch(const gb_src *s, int a, int b)
{
    for (int i = a; i < b; i++) {
        int r = i / s->lines, l = i % s->lines;
        _mm_prefetch(s->base + (size_t)r * s->stride + (size_t)l * 64, _MM_HINT_T1);
    }
}

BF16 static void gb_run(int nn, float *C, int ldc, const uint16_t *A, int lda, int rows, const uint16_t *W, int ldw,
                        int K, int n0, int n1, const float *bias, int acc)
{
    uint32_t pan[NP * NR] __attribute__((aligned(64)));
    const int ntile = (rows + 5) / 6;
    for (int nb = n0; nb < n1; nb += NR) {
        const int cnt = n1 - nb < NR ? n1 - nb : NR;
        __mmask16 m[4];
        for (int v = 0; v < 4; v++) {
            int c = cnt - 16 * v;
            m[v] = c >= 16 ? (__mmask16)0xffff : c <= 0 ? 0 : (__mmask16)((1u << c) - 1);
        }
        if (K < 1) {   /* no terms: C = 0 or C, then the bias */
            for (int r = 0; r < rows; r++)
                for (int j = 0; j < cnt; j++) {
                    float *c = C + (size_t)r * (size_t)ldc + (size_t)(nb + j);
                    float v = acc ? *c : 0.0f;
                    *c = bias ? v + bias[nb + j] : v;
                }
            continue;
        }
        for (int k0 = 0; k0 < K; k0 += FT_GB_KC) {
            const int kn = K - k0 < FT_GB_KC ? K - k0 : FT_GB_KC, np = (kn + 1) / 2;
            if (nn) pack_nn(pan, W, ldw, K, nb, cnt, k0, np);
            else pack_nt(pan, W, ldw, K, nb, cnt, k0, np);
            const int first = k0 == 0 && !acc;
            const float *bb = bias && k0 + kn == K ? bias + nb : NULL;
            /* the next panel: the next chunk, else the next block's first */
            const gb_src nx = k0 + FT_GB_KC < K ? gb_src_of(nn, W, ldw, K, n1, nb, k0 + FT_GB_KC)
                                                : gb_src_of(nn, W, ldw, K, n1, nb + NR, 0);
            const int tot = nx.rows * nx.lines, per = (tot + ntile - 1) / ntile;
            for (int r = 0; r < rows; r += 6) {
                if (nx.base) {
                    int a = r / 6 * per;
                    gb_prefetch(&nx, a < tot ? a : tot, a + per < tot ? a + per : tot);
                }
                float *cc = C + (size_t)r * (size_t)ldc + (size_t)nb;
                const uint16_t *aa = A + (size_t)r * (size_t)lda + (size_t)k0;
                switch (rows - r < 6 ? rows - r : 6) {
                case 6: kern(cc, ldc, aa, lda, pan, np, 6, m, first, bb); break;
                case 5: kern(cc, ldc, aa, lda, pan, np, 5, m, first, bb); break;
                case 4: kern(cc, ldc, aa, lda, pan, np, 4, m, first, bb); break;
                case 3: kern(cc, ldc, aa, lda, pan, np, 3, m, first, bb); break;
                case 2: kern(cc, ldc, aa, lda, pan, np, 2, m, first, bb); break;
                default: kern(cc, ldc, aa, lda, pan, np, 1, m, first, bb); break;
                }
            }
        }
    }
}

void ft_gb_nt_avx512bf16(float *C, int ldc, const uint16_t *A, int lda, int rows, const uint16_t *W, int ldw, int K,
                         int n0, int n1, const float *bias, int acc)
{
    gb_run(0, C, ldc, A, lda, rows, W, ldw, K, n0, n1, bias, acc);
}

void ft_gb_nn_avx512bf16(float *C, int ldc, const uint16_t *A, int lda, int rows, const uint16_t *W, int ldw, int K,
                         int n0, int n1, const float *bias, int acc)
{
    gb_run(1, C, ldc, A, lda, rows, W, ldw, K, n0, n1, bias, acc);
}
#else
void ft_gb_nt_avx512bf16(float *C, int ldc, const uint16_t *A, int lda, int rows, const uint16_t *W, int ldw, int K,
                         int n0, int n1, const float *bias, int acc)
{
    ft_gb_nt_ref(C, ldc, A, lda, rows, W, ldw, K, n0, n1, bias, acc);
}
void ft_gb_nn_avx512bf16(float *C, int ldc, const uint16_t *A, int lda, int rows, const uint16_t *W, int ldw, int K,
                         int n0, int n1, const float *bias, int acc)
{
    ft_gb_nn_ref(C, ldc, A, lda, rows, W, ldw, K, n0, n1, bias, acc);
}
#endif
