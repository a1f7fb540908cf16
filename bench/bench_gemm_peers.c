/* bench_gemm_peers: FlexTier's products on stored weights (ft_wk_prep +
 * ft_wk_product) against the libraries one could use instead, on one
 * thread, same sizes, interleaved run by run:
 *
 *   OpenBLAS cblas_sgemm (f32), oneDNN 2.6 matmul (f32 and bf16 x bf16 ->
 *   f32; weights as stored, (out, in) = "ba", and pre-packed by oneDNN,
 *   reorder excluded), libxsmm 1.17 libxsmm_sgemm / libxsmm_bsgemm.
 *
 *   build/bench/bench_gemm_peers [-r ROWS,..] [-s OUTxIN,..] [-n RUNS] [-m MiB]
 *
 * Defaults: rows 1,8,32,512; shapes 2048x2048, 5632x2048, 2048x5632; 5
 * runs (median); weights cycled through -m MiB (default 512) of copies so
 * that decode reads them from DRAM. Time: the calling thread's CPU time
 * and wall time (run with OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 in the
 * environment so that the libraries compute on the calling thread: they
 * read them when loaded).
 * Built only when libdnnl-dev and libxsmm-dev are installed (optional:
 * the engine does not use them; docs/engine.md records why). */
#include "engine/wkernels.h"
#include "flextier/core.h"

#include <cblas.h>
#include <libxsmm.h>
#include <oneapi/dnnl/dnnl.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

#define DN(call) do { dnnl_status_t s_ = (call); if (s_ != dnnl_success) { \
    fprintf(stderr, "bench_gemm_peers: %s failed (%d)\n", #call, (int)s_); exit(1); } } while (0)

typedef struct {
    dnnl_primitive_t prim;
    dnnl_memory_t src, wei, dst;
    dnnl_memory_t wpack;      /* pre-packed weights (NULL: use wei as stored) */
    dnnl_primitive_t reorder;
} dn_mm;

static dnnl_engine_t eng;
static dnnl_stream_t strm;

/* y[M,N] = x[M,K] W[N,K]^T; dt: f32 or bf16 for x and W, f32 y. */
static void dn_make(dn_mm *m, int M, int N, int K, dnnl_data_type_t dt, int packed)
{
    memset(m, 0, sizeof *m);
    dnnl_memory_desc_t smd, wmd, wany, dmd;
    dnnl_dims_t sd = {M, K}, wd = {K, N}, dd = {M, N};
    DN(dnnl_memory_desc_init_by_tag(&smd, 2, sd, dt, dnnl_ab));
    DN(dnnl_memory_desc_init_by_tag(&wmd, 2, wd, dt, dnnl_ba));   /* (out, in) row-major */
    DN(dnnl_memory_desc_init_by_tag(&wany, 2, wd, dt, dnnl_format_tag_any));
    DN(dnnl_memory_desc_init_by_tag(&dmd, 2, dd, dnnl_f32, dnnl_ab));
    dnnl_matmul_desc_t desc;
    DN(dnnl_matmul_desc_init(&desc, &smd, packed ? &wany : &wmd, NULL, &dmd));
    dnnl_primitive_desc_t pd;
    DN(dnnl_primitive_desc_create(&pd, &desc, NULL, eng, NULL));
    DN(dnnl_primitive_create(&m->prim, pd));
    DN(dnnl_memory_create(&m->src, &smd, eng, DNNL_MEMORY_NONE));
    DN(dnnl_memory_create(&m->wei, &wmd, eng, DNNL_MEMORY_NONE));
    DN(dnnl_memory_create(&m->dst, &dmd, eng, DNNL_MEMORY_NONE));
    if (packed) {
        const dnnl_memory_desc_t *pmd = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
        DN(dnnl_memory_create(&m->wpack, pmd, eng, DNNL_MEMORY_ALLOCATE));
        dnnl_primitive_desc_t rpd;
        DN(dnnl_reorder_primitive_desc_create(&rpd, &wmd, eng, pmd, eng, NULL));
        DN(dnnl_primitive_create(&m->reorder, rpd));
        dnnl_primitive_desc_destroy(rpd);
    }
    dnnl_primitive_desc_destroy(pd);
}

static void dn_run(dn_mm *m, const void *x, const void *w, float *y)
{
    DN(dnnl_memory_set_data_handle(m->src, (void *)x));
    DN(dnnl_memory_set_data_handle(m->dst, y));
    DN(dnnl_memory_set_data_handle(m->wei, (void *)w));
    dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, m->src}, {DNNL_ARG_WEIGHTS, m->wpack ? m->wpack : m->wei},
                               {DNNL_ARG_DST, m->dst}};
    DN(dnnl_primitive_execute(m->prim, strm, 3, args));
    DN(dnnl_stream_wait(strm));
}

static void dn_pack(dn_mm *m, const void *w)
{
    DN(dnnl_memory_set_data_handle(m->wei, (void *)w));
    dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, m->wei}, {DNNL_ARG_TO, m->wpack}};
    DN(dnnl_primitive_execute(m->reorder, strm, 2, args));
    DN(dnnl_stream_wait(strm));
}

static void dn_free(dn_mm *m)
{
    dnnl_primitive_destroy(m->prim);
    dnnl_memory_destroy(m->src);
    dnnl_memory_destroy(m->wei);
    dnnl_memory_destroy(m->dst);
    if (m->wpack) dnnl_memory_destroy(m->wpack);
    if (m->reorder) dnnl_primitive_destroy(m->reorder);
}

enum { V_FT_F32, V_FT_BF16, V_BLAS, V_DN_F32, V_DN_BF16, V_DN_BF16P, V_XS_F32, V_XS_BF16, NV };
static const char *vname[NV] = {"flextier f32", "flextier bf16", "openblas sgemm", "onednn f32",
                                "onednn bf16", "onednn bf16 packed", "libxsmm sgemm", "libxsmm bsgemm"};

static int parse_list(const char *s, int *v, int max)
{
    int n = 0;
    while (*s && n < max) {
        v[n++] = atoi(s);
        const char *c = strchr(s, ',');
        if (!c) break;
        s = c + 1;
    }
    return n;
}

int main(int argc, char **argv)
{
    int rowsv[8] = {1, 8, 32, 512}, nrows = 4, runs = 5;
    int shapes[8][2] = {{2048, 2048}, {5632, 2048}, {2048, 5632}}, ns = 3;
    size_t mib = 512;
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : "";
        if (!strcmp(argv[i], "-r")) { nrows = parse_list(v, rowsv, 8); i++; }
        else if (!strcmp(argv[i], "-n")) { runs = atoi(v); i++; }
        else if (!strcmp(argv[i], "-m")) { mib = (size_t)atoll(v); i++; }
        else if (!strcmp(argv[i], "-s")) {
            ns = 0;
            for (const char *s = v; *s && ns < 8;) {
                if (sscanf(s, "%dx%d", &shapes[ns][0], &shapes[ns][1]) != 2) { fprintf(stderr, "bench_gemm_peers: bad shape '%s'\n", v); return 2; }
                ns++;
                const char *c = strchr(s, ',');
                if (!c) break;
                s = c + 1;
            }
            i++;
        } else { fprintf(stderr, "usage: bench_gemm_peers [-r ROWS,..] [-s OUTxIN,..] [-n RUNS] [-m MiB]\n"); return 2; }
    }
    if (runs < 1 || runs > 64 || nrows < 1 || mib < 1) { fprintf(stderr, "bench_gemm_peers: bad arguments\n"); return 2; }
    for (int r = 0; r < nrows; r++) if (rowsv[r] < 1 || rowsv[r] > 4096) { fprintf(stderr, "bench_gemm_peers: bad rows\n"); return 2; }
    openblas_set_num_threads(1);
    libxsmm_init();
    DN(dnnl_engine_create(&eng, dnnl_cpu, 0));
    DN(dnnl_stream_create(&strm, eng, dnnl_stream_default_flags));
    printf("1 thread, CPU time, median of %d interleaved runs; GFLOP/s (weights read as GB/s in brackets)\n", runs);
    uint64_t seed = 5;
    for (int s = 0; s < ns; s++) {
        int N = shapes[s][0], K = shapes[s][1];
        size_t n = (size_t)N * K;
        int ncp = (int)((mib << 20) / (n * 6));   /* f32 + bf16 copies */
        if (ncp < 1) ncp = 1;
        float **wf = calloc((size_t)ncp, sizeof *wf);
        uint16_t **wb = calloc((size_t)ncp, sizeof *wb);
        for (int c = 0; c < ncp; c++) {
            wf[c] = ft_malloc_aligned(n * 4, 64);
            wb[c] = ft_malloc_aligned(n * 2, 64);
            if (!wf[c] || !wb[c]) { fprintf(stderr, "bench_gemm_peers: out of memory\n"); return 1; }
            for (size_t i = 0; i < n; i++) {
                float v = ((float)(ft_rand_u64(&seed) >> 40) / (float)(1 << 24) - 0.5f) * 0.1f;
                wb[c][i] = ft_f32_to_bf16_1(v);
                wf[c][i] = ft_bf16_to_f32_1(wb[c][i]);
            }
        }
        for (int ri = 0; ri < nrows; ri++) {
            int M = rowsv[ri];
            float *x = ft_malloc_aligned((size_t)M * K * 4, 64), *y = ft_malloc_aligned((size_t)M * N * 4, 64);
            uint16_t *xb = ft_malloc_aligned((size_t)M * K * 2, 64);
            for (size_t i = 0; i < (size_t)M * K; i++) { x[i] = (float)(ft_rand_u64(&seed) >> 40) / (float)(1 << 24); xb[i] = ft_f32_to_bf16_1(x[i]); }
            ft_wmat Wf = {FT_WF_F32, N, K, NULL, 0, 0, NULL}, Wb = {FT_WF_BF16, N, K, NULL, 0, 0, NULL};
            size_t wsz = ft_wk_ws_size(&Wf, M), wsz2 = ft_wk_ws_size(&Wb, M);
            void *ws = ft_malloc_aligned((wsz > wsz2 ? wsz : wsz2) + 64, 64);
            dn_mm df, db, dbp;
            dn_make(&df, M, N, K, dnnl_f32, 0);
            dn_make(&db, M, N, K, dnnl_bf16, 0);
            dn_make(&dbp, M, N, K, dnnl_bf16, 1);
            dn_pack(&dbp, wb[0]);   /* packed once, outside the timing (one weight copy) */
            double t[NV][64], tw[NV][64];
            libxsmm_blasint m_ = N, n_ = M, k_ = K;
            float one = 1.0f, zero = 0.0f;
            int cyc = 0;
            for (int k = -1; k < runs; k++)
                for (int v = 0; v < NV; v++) {
                    int c = cyc++ % ncp;
                    ft_wk_act a;
                    double t0 = cpu_now(), w0 = ft_now();
                    switch (v) {
                    case V_FT_F32: Wf.data = wf[c]; ft_wk_prep(&a, ws, wsz, &Wf, x, M); ft_wk_product(y, N, &a, &Wf, 0, N, NULL); break;
                    case V_FT_BF16: Wb.data = wb[c]; ft_wk_prep(&a, ws, wsz2, &Wb, x, M); ft_wk_product(y, N, &a, &Wb, 0, N, NULL); break;
                    case V_BLAS: cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, x, K, wf[c], K, 0.0f, y, N); break;
                    case V_DN_F32: dn_run(&df, x, wf[c], y); break;
                    case V_DN_BF16: dn_run(&db, xb, wb[c], y); break;
                    case V_DN_BF16P: dn_run(&dbp, xb, wb[0], y); break;   /* one packed copy (cache-resident when small) */
                    case V_XS_F32: libxsmm_sgemm("T", "N", &m_, &n_, &k_, &one, wf[c], &k_, x, &k_, &zero, y, &m_); break;
                    case V_XS_BF16: libxsmm_bsgemm("T", "N", &m_, &n_, &k_, &one, wb[c], &k_, xb, &k_, &zero, y, &m_); break;
                    }
                    if (k >= 0) { t[v][k] = cpu_now() - t0; tw[v][k] = ft_now() - w0; }
                }
            printf("rows %4d, %dx%d:\n", M, N, K);
            for (int v = 0; v < NV; v++) {
                qsort(t[v], (size_t)runs, sizeof(double), cmp_d);
                qsort(tw[v], (size_t)runs, sizeof(double), cmp_d);
                double tm = t[v][runs / 2], twm = tw[v][runs / 2];
                size_t wbytes = n * (v == V_FT_F32 || v == V_BLAS || v == V_DN_F32 || v == V_XS_F32 ? 4 : 2);
                printf("  %-20s %9.1f us %8.1f GFLOP/s (%5.1f GB/s)  wall %9.1f us%s\n", vname[v], tm * 1e6,
                       2.0 * M * (double)n / tm / 1e9, (double)wbytes / tm / 1e9, twm * 1e6,
                       v == V_DN_BF16P ? "  [weights packed once, not cycled]" : "");
            }
            fflush(stdout);
            dn_free(&df);
            dn_free(&db);
            dn_free(&dbp);
            ft_free_aligned(ws);
            ft_free_aligned(x);
            ft_free_aligned(y);
            ft_free_aligned(xb);
        }
        for (int c = 0; c < ncp; c++) { ft_free_aligned(wf[c]); ft_free_aligned(wb[c]); }
        free(wf);
        free(wb);
    }
    dnnl_stream_destroy(strm);
    dnnl_engine_destroy(eng);
    libxsmm_finalize();
    return 0;
}
