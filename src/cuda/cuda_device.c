/* CUDA backend: errors, device detection, memory helpers, and the
 * synchronous codec entry points (conversion, KV-row quantization). */
#include "cuda_internal.h"
#include "flextier/cuda.h"

#include <dirent.h>
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>

ft_status ft_cuda_status(cudaError_t e, const char *what)
{
    if (e == cudaSuccess) return FT_OK;
    /* Clear a non-sticky error so that it is not reported again by the
     * next cudaGetLastError (a sticky one stays: the context is lost). */
    (void)cudaGetLastError();
    ft_status st = FT_ERR_INTERNAL;
    if (e == cudaErrorMemoryAllocation) st = FT_ERR_NOMEM;
    else if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver ||
             e == cudaErrorInvalidDevice || e == cudaErrorDevicesUnavailable ||
             e == cudaErrorStubLibrary || e == cudaErrorSystemDriverMismatch ||
             e == cudaErrorCompatNotSupportedOnDevice || e == cudaErrorNoKernelImageForDevice ||
             e == cudaErrorUnsupportedPtxVersion)
        st = FT_ERR_UNSUPPORTED;
    return ft_set_error(st, "%s: %s: %s", what, cudaGetErrorName(e), cudaGetErrorString(e));
}

/* What is missing for a GPU: NULL when an NVIDIA device node and the
 * driver's library (libcuda.so.1) are both there. Without them the
 * runtime's "no device" or "driver version is insufficient" (what cudart
 * answers when it finds no libcuda at all) means no GPU or no driver, and
 * is said so. */
static const char *gpu_missing(void)
{
    int node = 0;
    DIR *d = opendir("/dev");
    if (d) {
        struct dirent *e;
        while (!node && (e = readdir(d)))
            node = !strncmp(e->d_name, "nvidia", 6) && e->d_name[6] >= '0' && e->d_name[6] <= '9';
        closedir(d);
    }
    if (!node) return "no /dev/nvidia<N> device";
    void *h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (!h) return "the NVIDIA driver library libcuda.so.1 cannot be loaded";
    dlclose(h);
    return NULL;
}

ft_status ft_cuda_available(char *detail, size_t n)
{
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    char why[512];
    const char *missing = NULL;
    if (e != cudaSuccess) {
        if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver) missing = gpu_missing();
        if (missing)
            snprintf(why, sizeof why, "no NVIDIA GPU or driver found (%s; cudaGetDeviceCount: %s)", missing,
                     cudaGetErrorName(e));
        else
            snprintf(why, sizeof why, "no usable CUDA device (cudaGetDeviceCount: %s: %s)", cudaGetErrorName(e),
                     cudaGetErrorString(e));
        (void)cudaGetLastError();
    } else if (count < 1) {
        snprintf(why, sizeof why, "no NVIDIA GPU or driver found (cudaGetDeviceCount: 0 devices)");
    } else {
        if (detail && n) snprintf(detail, n, "%d CUDA device%s", count, count == 1 ? "" : "s");
        return FT_OK;
    }
    if (detail && n) snprintf(detail, n, "%s", why);
    return ft_set_error(FT_ERR_UNSUPPORTED, "%s", why);
}

ft_status ft_cuda_require(int device)
{
    ft_status st = ft_cuda_available(NULL, 0);
    if (st) return st;
    int count = 0;
    FT_CU(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
    if (device < 0 || device >= count)
        return ft_set_error(FT_ERR_INVALID_ARG, "CUDA device %d does not exist (%d device%s)", device,
                            count, count == 1 ? "" : "s");
    FT_CU(cudaSetDevice(device), "cudaSetDevice");
    return FT_OK;
}

ft_status ft_cuda_device_info_get(int device, ft_cuda_device_info *out)
{
    if (!out) return ft_set_error(FT_ERR_INVALID_ARG, "cuda: NULL argument");
    ft_status st = ft_cuda_require(device);
    if (st) return st;
    struct cudaDeviceProp prop;
    FT_CU(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
    ft_cuda_device_info info;
    memset(&info, 0, sizeof info);
    info.device = device;
    snprintf(info.name, sizeof info.name, "%s", prop.name);
    info.cc_major = prop.major;
    info.cc_minor = prop.minor;
    info.sm_count = prop.multiProcessorCount;
    info.total_mem = (uint64_t)prop.totalGlobalMem;
    FT_CU(cudaRuntimeGetVersion(&info.runtime_version), "cudaRuntimeGetVersion");
    FT_CU(cudaDriverGetVersion(&info.driver_version), "cudaDriverGetVersion");
    *out = info;
    return FT_OK;
}

/* ---------------------------------------------------------------- memory */

ft_status ft_cuda_malloc(size_t n, void **out)
{
    if (!out) return ft_set_error(FT_ERR_INVALID_ARG, "cuda: NULL argument");
    void *p = NULL;
    char what[64];
    snprintf(what, sizeof what, "cudaMalloc(%zu bytes)", n);
    FT_CU(cudaMalloc(&p, n ? n : 1), what);
    *out = p;
    return FT_OK;
}

void ft_cuda_free(void *p)
{
    if (p) (void)cudaFree(p);
}

ft_status ft_cuda_host_alloc(size_t n, void **out)
{
    if (!out) return ft_set_error(FT_ERR_INVALID_ARG, "cuda: NULL argument");
    void *p = NULL;
    char what[64];
    snprintf(what, sizeof what, "cudaHostAlloc(%zu bytes)", n);
    FT_CU(cudaHostAlloc(&p, n ? n : 1, cudaHostAllocDefault), what);
    *out = p;
    return FT_OK;
}

void ft_cuda_host_free(void *p)
{
    if (p) (void)cudaFreeHost(p);
}

ft_status ft_cuda_copy_to_device(void *dst, const void *src, size_t n)
{
    if (!n) return FT_OK;
    FT_CU(cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice), "cudaMemcpy (host to device)");
    return FT_OK;
}

ft_status ft_cuda_copy_to_host(void *dst, const void *src, size_t n)
{
    if (!n) return FT_OK;
    FT_CU(cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost), "cudaMemcpy (device to host)");
    return FT_OK;
}

/* ------------------------------------------------------- codec entries */

static int float_dt(ft_dtype d) { return d == FT_F32 || d == FT_F16 || d == FT_BF16; }

ft_status ft_cuda_convert(void *dst, ft_dtype dst_dt, const void *src, ft_dtype src_dt, size_t n)
{
    if (!float_dt(dst_dt) || !float_dt(src_dt))
        return ft_set_error(FT_ERR_UNSUPPORTED, "cuda convert: %s to %s", ft_dtype_name(src_dt),
                            ft_dtype_name(dst_dt));
    if (!n) return FT_OK;
    if (!dst || !src) return ft_set_error(FT_ERR_INVALID_ARG, "cuda convert: NULL pointer");
    if (dst_dt == src_dt) {
        FT_CU(cudaMemcpy(dst, src, (size_t)ft_dtype_nbytes(src_dt, n), cudaMemcpyDeviceToDevice),
              "cudaMemcpy (device to device)");
        return FT_OK;
    }
    FT_CU(ftk_convert(dst, (int)dst_dt, src, (int)src_dt, n, 0), "convert kernel");
    FT_CU(cudaStreamSynchronize(0), "convert kernel");
    return FT_OK;
}

ft_status ft_cuda_qrow_encode(int bits, const float *src, size_t rows, size_t n, uint32_t group,
                              void *dst)
{
    if (!ft_qrow_bytes(bits, n, group) || ((!src || !dst) && rows))
        return ft_set_error(FT_ERR_INVALID_ARG, "cuda qrow: %zu values in groups of %u at %d bits", n,
                            group, bits);
    if (!rows) return FT_OK;
    size_t ng = n / group;
    void *par = NULL;
    unsigned long long *err = NULL, herr = ULLONG_MAX;
    ft_status st = ft_cuda_malloc(rows * ng * 2 * sizeof(float), &par);
    if (!st) st = ft_cuda_malloc(sizeof *err, (void **)&err);
    if (!st) st = ft_cuda_copy_to_device(err, &herr, sizeof herr);
    if (!st) st = ft_cuda_status(ftk_qrow_encode(bits, src, rows, n, group, dst, par, err, 0),
                                 "qrow encode kernel");
    if (!st) st = ft_cuda_status(cudaStreamSynchronize(0), "qrow encode kernel");
    if (!st) st = ft_cuda_copy_to_host(&herr, err, sizeof herr);
    ft_cuda_free(par);
    ft_cuda_free(err);
    if (st) return st;
    if (herr != ULLONG_MAX) {
        unsigned long long g = herr >> 2;
        size_t row = (size_t)(g / ng), elem = (size_t)(g % ng) * group;
        if ((herr & 3) == 1)
            return ft_set_error(FT_ERR_INVALID_ARG, "cannot quantize a non-finite value in row %zu, "
                                "group at element %zu", row, elem);
        return ft_set_error(FT_ERR_UNSUPPORTED, "row %zu, group at element %zu: range cannot be "
                            "quantized with fp16 parameters", row, elem);
    }
    return FT_OK;
}

ft_status ft_cuda_qrow_decode(int bits, const void *src, size_t rows, size_t n, uint32_t group,
                              float *dst)
{
    if (!ft_qrow_bytes(bits, n, group) || ((!src || !dst) && rows))
        return ft_set_error(FT_ERR_INVALID_ARG, "cuda qrow: %zu values in groups of %u at %d bits", n,
                            group, bits);
    if (!rows) return FT_OK;
    FT_CU(ftk_qrow_decode(bits, src, rows, n, group, dst, 0), "qrow decode kernel");
    FT_CU(cudaStreamSynchronize(0), "qrow decode kernel");
    return FT_OK;
}
