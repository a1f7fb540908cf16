/* CPU emulation of the CUDA runtime and cuBLAS subset used by src/cuda
 * (see fake_cuda.h). */
#include "fake_cuda.h"

#include <cublas_v2.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flextier/core.h"

typedef struct fk_op {
    void (*fn)(void *);
    void *args;
    struct fk_op *next;
} fk_op;

struct CUstream_st {
    fk_op *head, *tail;
    uint64_t enq, done;          /* ops enqueued / run */
    struct CUstream_st *next_stream;
};

struct CUevent_st {
    struct CUstream_st *stream;  /* of the last record (NULL: never recorded) */
    uint64_t seq;                /* complete when stream->done >= seq */
};

static struct CUstream_st null_stream;
static struct CUstream_st *streams = &null_stream;   /* all live streams */

static struct CUstream_st *S(cudaStream_t s) { return s ? s : &null_stream; }

static void run_until(struct CUstream_st *st, uint64_t seq)
{
    while (st->done < seq && st->head) {
        fk_op *op = st->head;
        st->head = op->next;
        if (!st->head) st->tail = NULL;
        op->fn(op->args);        /* may run other streams (event waits) */
        free(op->args);
        free(op);
        st->done++;
    }
}

static void run_all(void)
{
    int again = 1;
    while (again) {
        again = 0;
        for (struct CUstream_st *s = streams; s; s = s->next_stream)
            if (s->done < s->enq) { run_until(s, s->enq); again = 1; }
    }
}

cudaError_t fk_enqueue(cudaStream_t s, void (*fn)(void *), void *args)
{
    fk_op *op = calloc(1, sizeof *op);
    if (!op) return cudaErrorMemoryAllocation;
    op->fn = fn;
    op->args = args;
    struct CUstream_st *st = S(s);
    if (st->tail) st->tail->next = op;
    else st->head = op;
    st->tail = op;
    st->enq++;
    return cudaSuccess;
}

/* ------------------------------------------------------------ device */

static int no_device(void)
{
    const char *e = getenv("FT_FAKE_CUDA_NODEV");
    return e && *e == '1';
}

cudaError_t cudaGetDeviceCount(int *count)
{
    if (no_device()) return cudaErrorNoDevice;
    *count = 1;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) { return device == 0 && !no_device() ? cudaSuccess : cudaErrorInvalidDevice; }

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device)
{
    if (device != 0) return cudaErrorInvalidDevice;
    memset(prop, 0, sizeof *prop);
    snprintf(prop->name, sizeof prop->name, "FAKE CUDA device (CPU emulation for tests)");
    prop->major = 9;
    prop->minor = 0;
    prop->multiProcessorCount = 1;
    prop->totalGlobalMem = (size_t)8 << 30;
    return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int *v) { *v = 13000; return cudaSuccess; }
cudaError_t cudaDriverGetVersion(int *v) { *v = 13000; return cudaSuccess; }
cudaError_t cudaGetLastError(void) { return cudaSuccess; }
cudaError_t cudaDeviceSynchronize(void) { run_all(); return cudaSuccess; }

const char *cudaGetErrorName(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    default: return "cudaErrorUnknown";
    }
}

const char *cudaGetErrorString(cudaError_t e)
{
    return e == cudaErrorNoDevice ? "no CUDA-capable device is detected (fake)" : "fake CUDA error";
}

/* ------------------------------------------------------------ memory */

cudaError_t cudaMalloc(void **p, size_t n)
{
    *p = malloc(n ? n : 1);
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}

cudaError_t cudaFree(void *p)
{
    run_all();                   /* cudaFree synchronizes the device */
    free(p);
    return cudaSuccess;
}

cudaError_t cudaHostAlloc(void **p, size_t n, unsigned int flags)
{
    (void)flags;
    *p = malloc(n ? n : 1);
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}

cudaError_t cudaFreeHost(void *p)
{
    run_all();
    free(p);
    return cudaSuccess;
}

typedef struct { void *dst; const void *src; size_t n; } copy_args;

static void copy_op(void *a)
{
    copy_args *c = a;
    memcpy(c->dst, c->src, c->n);
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind, cudaStream_t s)
{
    (void)kind;
    if (!n) return cudaSuccess;
    if (!dst || !src) return cudaErrorInvalidValue;
    copy_args *c = malloc(sizeof *c);
    *c = (copy_args){dst, src, n};
    return fk_enqueue(s, copy_op, c);
}

/* Synchronous copies go through the legacy default stream: they wait for
 * the work on it, not for non-blocking streams. */
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind)
{
    (void)kind;
    run_until(&null_stream, null_stream.enq);
    if (n) memcpy(dst, src, n);
    return cudaSuccess;
}

/* ----------------------------------------------------- streams, events */

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags)
{
    (void)flags;
    struct CUstream_st *st = calloc(1, sizeof *st);
    if (!st) return cudaErrorMemoryAllocation;
    st->next_stream = streams;
    streams = st;
    *s = st;
    return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    if (!s) return cudaErrorInvalidValue;
    run_until(s, s->enq);
    for (struct CUstream_st **p = &streams; *p; p = &(*p)->next_stream)
        if (*p == s) { *p = s->next_stream; break; }
    free(s);
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    run_until(S(s), S(s)->enq);
    return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags)
{
    (void)flags;
    *e = calloc(1, sizeof **e);
    return *e ? cudaSuccess : cudaErrorMemoryAllocation;
}

cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    free(e);
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
    e->stream = S(s);
    e->seq = S(s)->enq;
    return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
    if (e->stream) run_until(e->stream, e->seq);
    return cudaSuccess;
}

/* No clock in the emulation: elapsed times are 0. Both events must be
 * complete, as CUDA requires (cudaErrorNotReady otherwise). */
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b)
{
    if (!a->stream || !b->stream) return cudaErrorInvalidResourceHandle;
    if (a->stream->done < a->seq || b->stream->done < b->seq) return cudaErrorNotReady;
    *ms = 0.0f;
    return cudaSuccess;
}

typedef struct { struct CUstream_st *st; uint64_t seq; } wait_args;

static void wait_op(void *a)
{
    wait_args *w = a;
    run_until(w->st, w->seq);
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags)
{
    (void)flags;
    if (!e->stream) return cudaSuccess;          /* never recorded: nothing to wait for */
    wait_args *w = malloc(sizeof *w);
    *w = (wait_args){e->stream, e->seq};         /* the record as of now */
    return fk_enqueue(s, wait_op, w);
}

/* ------------------------------------------------------------- cuBLAS */

struct cublasContext {
    cudaStream_t s;
};

cublasStatus_t cublasCreate_v2(cublasHandle_t *h)
{
    *h = calloc(1, sizeof **h);
    return *h ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_ALLOC_FAILED;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t h)
{
    free(h);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t h, cudaStream_t s)
{
    h->s = s;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t m)
{
    (void)h;
    return m == CUBLAS_DEFAULT_MATH ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_SUPPORTED;
}

cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t h, void *ws, size_t n)
{
    (void)h;
    return ws && n ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
}

const char *cublasGetStatusName(cublasStatus_t s) { return s ? "CUBLAS_STATUS_(fake error)" : "CUBLAS_STATUS_SUCCESS"; }
const char *cublasGetStatusString(cublasStatus_t s) { return s ? "fake cuBLAS error" : "success"; }

typedef struct {
    int ta, tb, m, n, k, lda, ldb, ldc, bf16;
    float alpha, beta;
    const void *A, *B;
    float *C;
} gemm_args;

static float elem(const void *p, int bf16, size_t i)
{
    return bf16 ? ft_bf16_to_f32_1(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

/* Column-major C (m x n) = alpha op(A) op(B) + beta C, op(X) = X or X^T. */
static void gemm_op(void *a)
{
    gemm_args *g = a;
    for (int j = 0; j < g->n; j++)
        for (int i = 0; i < g->m; i++) {
            double acc = 0;
            for (int l = 0; l < g->k; l++) {
                float x = elem(g->A, g->bf16, g->ta ? (size_t)i * g->lda + l : (size_t)l * g->lda + i);
                float y = elem(g->B, g->bf16, g->tb ? (size_t)l * g->ldb + j : (size_t)j * g->ldb + l);
                acc += (double)x * y;
            }
            float *c = g->C + (size_t)j * g->ldc + i;
            *c = (float)(g->alpha * acc + (g->beta != 0.0f ? g->beta * *c : 0.0f));
        }
}

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const void *alpha, const void *A, cudaDataType at, int lda, const void *B,
                            cudaDataType bt, int ldb, const void *beta, void *C, cudaDataType ct, int ldc,
                            cublasComputeType_t compute, cublasGemmAlgo_t algo)
{
    (void)algo;
    if (at != bt || (at != CUDA_R_16BF && at != CUDA_R_32F) || ct != CUDA_R_32F || compute != CUBLAS_COMPUTE_32F)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (m < 0 || n < 0 || k < 0 || lda < (ta == CUBLAS_OP_N ? m : k) || ldb < (tb == CUBLAS_OP_N ? k : n) || ldc < m)
        return CUBLAS_STATUS_INVALID_VALUE;
    gemm_args *g = malloc(sizeof *g);
    *g = (gemm_args){ta != CUBLAS_OP_N, tb != CUBLAS_OP_N, m, n, k, lda, ldb, ldc, at == CUDA_R_16BF,
                     *(const float *)alpha, *(const float *)beta, A, B, C};
    return fk_enqueue(h->s, gemm_op, g) ? CUBLAS_STATUS_ALLOC_FAILED : CUBLAS_STATUS_SUCCESS;
}
