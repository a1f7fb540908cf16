/* bench_gemm_bf16: the bf16 GEMM kernels (src/engine/gemm_bf16.h) beside
 * the engine's stored-weight product on the same shapes, one thread,
 * thread CPU time, weights cycled through copies so that they come from
 * DRAM as a model's layers do.
 *
 *   build/bench/bench_gemm_bf16 [ROWS [OUT [IN [RUNS]]]]   (128 2048 2048 7)
 *
 * Rows: nt (y = x W^T, W OUT x IN), nn (dx = dy W, the same W: K = OUT),
 * engine f32 x (FT_WK_X_T), engine bf16 x (FT_WK_X_B16); GFLOP/s = 2 rows
 * out in / time. */
#include "engine/gemm_bf16.h"
#include "engine/wkernels.h"
#include "flextier/core.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "bench_util.h"

int main(int argc, char **argv)
{
    int R = argc > 1 ? atoi(argv[1]) : 128, O = argc > 2 ? atoi(argv[2]) : 2048, I = argc > 3 ? atoi(argv[3]) : 2048;
    int runs = argc > 4 ? atoi(argv[4]) : 7;
    if (R < 1 || O < 1 || I < 1 || runs < 1 || runs > 99) {
        fprintf(stderr, "usage: bench_gemm_bf16 [ROWS [OUT [IN [RUNS]]]]\n");
        return 2;
    }
    const int NC = 16;   /* copies: 16 x 8 MiB at 2048 x 2048 */
    size_t wn = (size_t)O * (size_t)I;
    uint16_t *W = malloc(wn * 2 * NC);
    int K = O > I ? O : I, lda = ft_gb_lda(K);
    float *x = malloc((size_t)R * (size_t)K * 4), *y = malloc((size_t)R * (size_t)K * 4);
    uint16_t *A = malloc((size_t)R * (size_t)lda * 2);
    size_t wsn = 0;
    if (!W || !x || !y || !A) return 1;
    for (size_t i = 0; i < wn * NC; i++) W[i] = ft_f32_to_bf16_1((float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f);
    for (size_t i = 0; i < (size_t)R * (size_t)K; i++) x[i] = (float)(i % 97) / 97.0f - 0.5f;
    const char *names[4] = {"gemm nt (x W^T)", "gemm nn (dy W)", "engine X_T (f32 x)", "engine X_B16 (bf16 x)"};
    for (int mode = 0; mode < 4; mode++) {
        double t[99];
        void *ws = NULL;
        ft_wmat M = {FT_WF_BF16, O, I, NULL, 0, 0, NULL};
        if (mode >= 2) {
            ft_wk_set_bf16_activations(mode == 3);
            wsn = ft_wk_ws_size(&M, R);
            ws = wsn ? aligned_alloc(64, (wsn + 63) / 64 * 64) : NULL;
        }
        for (int r = 0; r < runs; r++) {
            const uint16_t *w = W + wn * (size_t)(r % NC);
            double t0 = bench_thread_cpu();
            if (mode == 0) {
                ft_gb_round(A, lda, x, I, R, I);
                ft_gb_nt(y, O, A, lda, R, w, I, I, 0, O, NULL, 0);
            } else if (mode == 1) {
                ft_gb_round(A, lda, x, O, R, O);
                ft_gb_nn(y, I, A, lda, R, w, I, O, 0, I, NULL, 1);
            } else {
                M.data = w;
                ft_wk_act a;
                if (ft_wk_prep(&a, ws, wsn, &M, x, R) != FT_OK) return 1;
                ft_wk_product(y, O, &a, &M, 0, O, NULL);
            }
            t[r] = bench_thread_cpu() - t0;
        }
        free(ws);
        qsort(t, (size_t)runs, sizeof t[0], bench_cmpd);
        double med = t[runs / 2];
        printf("%-24s rows %d, %d x %d: %.2f ms, %.1f GFLOP/s\n", names[mode], R, O, I, med * 1e3,
               2.0 * R * O * I / med * 1e-9);
    }
    free(W), free(x), free(y), free(A);
    return 0;
}
