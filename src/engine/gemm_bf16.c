/* bf16 GEMMs (gemm_bf16.h): rounding, the scalar references, dispatch. */
#include "gemm_bf16.h"
#include "flextier/core.h"

#include <math.h>
#include <string.h>

int ft_gb_lda(int K) { return (K + 31) / 32 * 32; }

void ft_gb_round(uint16_t *A, int lda, const float *x, int ldx, int rows, int K)
{
    for (int r = 0; r < rows; r++) {
        uint16_t *a = A + (size_t)r * (size_t)lda;
        ft_f32_to_bf16(a, x + (size_t)r * (size_t)ldx, (size_t)K);
        if (lda > K) memset(a + K, 0, (size_t)(lda - K) * sizeof(uint16_t));
    }
}

/* B(k, n): nt W[n][k], nn W[k][n] */
static float bval(int nn, const uint16_t *W, int ldw, int k, int n)
{
    return ft_bf16_to_f32_1(nn ? W[(size_t)k * (size_t)ldw + (size_t)n] : W[(size_t)n * (size_t)ldw + (size_t)k]);
}

static void gb_ref(int nn, float *C, int ldc, const uint16_t *A, int lda, int rows, const uint16_t *W, int ldw, int K,
                   int n0, int n1, const float *bias, int acc)
{
    for (int r = 0; r < rows; r++) {
        const uint16_t *a = A + (size_t)r * (size_t)lda;
        for (int n = n0; n < n1; n++) {
            float *c = C + (size_t)r * (size_t)ldc + (size_t)n;
            float v = acc ? *c : 0.0f;
            for (int k0 = 0; k0 < K; k0 += FT_GB_KC) {
                int k1 = K - k0 < FT_GB_KC ? K : k0 + FT_GB_KC;
                float s = 0.0f;
                for (int k = k0; k < k1; k += 2) {
                    if (k + 1 < k1) s = fmaf(ft_bf16_to_f32_1(a[k + 1]), bval(nn, W, ldw, k + 1, n), s);
                    else s = s + 0.0f;   /* the odd K's padding: a zero product */
                    s = fmaf(ft_bf16_to_f32_1(a[k]), bval(nn, W, ldw, k, n), s);
                }
                v = k0 == 0 && !acc ? s : v + s;
            }
            if (bias) v = v + bias[n];
            *c = v;
        }
    }
}

void ft_gb_nt_ref(float *C, int ldc, const uint16_t *A, int lda, int rows, const uint16_t *W, int ldw, int K, int n0,
                  int n1, const float *bias, int acc)
{
    gb_ref(0, C, ldc, A, lda, rows, W, ldw, K, n0, n1, bias, acc);
}

void ft_gb_nn_ref(float *C, int ldc, const uint16_t *A, int lda, int rows, const uint16_t *W, int ldw, int K, int n0,
                  int n1, const float *bias, int acc)
{
    gb_ref(1, C, ldc, A, lda, rows, W, ldw, K, n0, n1, bias, acc);
}

int ft_gb_simd(void)
{
#if defined(__x86_64__)
    const ft_cpu_features *c = ft_cpu();
    return ft_simd_enabled() && c->avx512f && c->avx512bw && c->avx512vl && c->avx512bf16;
#else
    return 0;
#endif
}

void ft_gb_nt(float *C, int ldc, const uint16_t *A, int lda, int rows, const uint16_t *W, int ldw, int K, int n0,
              int n1, const float *bias, int acc)
{
    if (rows < 1 || n1 <= n0) return;
    if (ft_gb_simd()) ft_gb_nt_avx512bf16(C, ldc, A, lda, rows, W, ldw, K, n0, n1, bias, acc);
    else ft_gb_nt_ref(C, ldc, A, lda, rows, W, ldw, K, n0, n1, bias, acc);
}

void ft_gb_nn(float *C, int ldc, const uint16_t *A, int lda, int rows, const uint16_t *W, int ldw, int K, int n0,
              int n1, const float *bias, int acc)
{
    if (rows < 1 || n1 <= n0) return;
    if (ft_gb_simd()) ft_gb_nn_avx512bf16(C, ldc, A, lda, rows, W, ldw, K, n0, n1, bias, acc);
    else ft_gb_nn_ref(C, ldc, A, lda, rows, W, ldw, K, n0, n1, bias, acc);
}
