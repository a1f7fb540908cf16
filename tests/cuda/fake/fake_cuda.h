/* A CPU emulation of the subset of the CUDA runtime and cuBLAS that the
 * CUDA backend's host code uses, and of the backend's kernels
 * (fake_kernels.c), for the FT_CUDA=FAKE test configuration: the host
 * code, the GPU tests, the CLI and scripts/gpu-check.sh run without a GPU
 * (under AddressSanitizer too). NOT a backend: nothing here runs on a
 * GPU, and the kernels here are sequential CPU re-implementations, not
 * the .cu code.
 *
 * Streams are emulated as deferred FIFO queues: work enqueued on a stream
 * (copies, kernels, GEMMs) runs only when the host waits for it
 * (cudaStreamSynchronize, cudaEventSynchronize, cudaDeviceSynchronize,
 * cudaFree...) or when another stream's cudaStreamWaitEvent needs it.
 * So a host buffer changed before the copy that reads it has run, a
 * missing wait between streams, or a result read before its stream was
 * synchronized shows up as wrong data here, as it could on a GPU.
 * Device memory is host memory (malloc), so AddressSanitizer sees
 * out-of-bounds device accesses of the emulated kernels and copies. */
#ifndef FT_FAKE_CUDA_H
#define FT_FAKE_CUDA_H
#include <cuda_runtime_api.h>

/* Enqueue fn(args) on stream s (0 = the legacy default stream); args is a
 * malloc'd block the queue frees after running it. */
cudaError_t fk_enqueue(cudaStream_t s, void (*fn)(void *), void *args);
#endif
