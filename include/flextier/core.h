/*
 * flextier/core.h - status codes, logging, dtypes, tensor descriptors,
 * dtype conversion, aligned allocation, a thread pool and checksums.
 *
 * Conventions (see docs/ and ../shared/DESIGN.md):
 *  - Every fallible function returns ft_status; FT_OK (0) is success,
 *    errors are negative. Outputs are written only on success.
 *  - On error, a human-readable detail is kept per thread and returned by
 *    ft_last_error() (e.g. which file and field was bad).
 *  - Free functions accept NULL.
 *  - Library code never exits or aborts on bad input.
 */
#ifndef FLEXTIER_CORE_H
#define FLEXTIER_CORE_H

#include <stddef.h>
#include <stdint.h>
#include <stdarg.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------- version, export */

/* The library's version (CMakeLists.txt reads it from here). The header
 * a program was compiled with: FT_VERSION_*; the library it runs with:
 * ft_version_number() / ft_version_string(). */
#define FT_VERSION_MAJOR 0
#define FT_VERSION_MINOR 1
#define FT_VERSION_PATCH 0
#define FT_VERSION_NUMBER (FT_VERSION_MAJOR * 10000 + FT_VERSION_MINOR * 100 + FT_VERSION_PATCH)
#define FT_VERSION_STR_(x) #x
#define FT_VERSION_STR(x) FT_VERSION_STR_(x)
#define FT_VERSION_STRING FT_VERSION_STR(FT_VERSION_MAJOR) "." FT_VERSION_STR(FT_VERSION_MINOR) "." \
                          FT_VERSION_STR(FT_VERSION_PATCH)

/* FT_API marks the public functions: the libraries are compiled with
 * -fvisibility=hidden, so a shared library exports exactly these (and the
 * few internal entry points the libraries above it call, marked FT_API in
 * src/ headers). Defining FT_API before including a header overrides it. */
#ifndef FT_API
#  if defined(__GNUC__) || defined(__clang__)
#    define FT_API __attribute__((visibility("default")))
#  else
#    define FT_API
#  endif
#endif

/* The version of the library linked at run time: FT_VERSION_NUMBER and
 * FT_VERSION_STRING as it was built (a program can compare them with the
 * macros it was compiled with). */
FT_API unsigned    ft_version_number(void);
FT_API const char *ft_version_string(void);

/* ---------------------------------------------------------------- status */

typedef enum ft_status {
    FT_INPROGRESS       = 1,   /* asynchronous operation not finished yet   */
    FT_OK               = 0,
    FT_ERR_INVALID_ARG  = -1,  /* caller passed something invalid            */
    FT_ERR_NOMEM        = -2,  /* allocation failed or a size limit was hit  */
    FT_ERR_CORRUPT      = -3,  /* encoded data / file failed validation      */
    FT_ERR_UNSUPPORTED  = -4,  /* valid but not supported (version, dtype)   */
    FT_ERR_IO           = -5,  /* file system error (errno in the message)   */
    FT_ERR_NOT_FOUND    = -6,  /* key, file or tensor does not exist         */
    FT_ERR_NO_SPACE     = -7,  /* capacity exhausted                         */
    FT_ERR_BUFFER_SMALL = -8,  /* caller's output buffer is too small        */
    FT_ERR_AUTH         = -9,  /* authentication failed                      */
    FT_ERR_NET          = -10, /* transport error, peer unreachable or dead  */
    FT_ERR_TIMEOUT      = -11, /* operation timed out                        */
    FT_ERR_PROTOCOL     = -12, /* peer violated the wire protocol            */
    FT_ERR_BUSY         = -13, /* resource in use (e.g. leased)              */
    FT_ERR_EXISTS       = -14, /* object already exists                      */
    FT_ERR_CANCELED     = -15, /* operation canceled                         */
    FT_ERR_INTERNAL     = -16  /* a bug: please report                        */
} ft_status;

/* Static, never-NULL description of a status ("corrupt data", ...). */
FT_API const char *ft_status_str(ft_status st);

/* Per-thread detail of the last error set by the library; "" if none. */
FT_API const char *ft_last_error(void);
/* Record a detail message for the calling thread and return st. */
FT_API ft_status ft_set_error(ft_status st, const char *fmt, ...)
           __attribute__((format(printf, 2, 3)));
FT_API void ft_clear_error(void);

/* --------------------------------------------------------------- logging */

typedef enum ft_log_level {
    FT_LOG_ERROR = 0, FT_LOG_WARN = 1, FT_LOG_INFO = 2,
    FT_LOG_DEBUG = 3, FT_LOG_TRACE = 4
} ft_log_level;

/* The level comes from FLEXTIER_LOG (error|warn|info|debug|trace or 0-4),
 * default warn. ft_log_set_level overrides it. Thread-safe. */
FT_API void ft_log_set_level(ft_log_level lvl);
FT_API ft_log_level ft_log_get_level(void);
FT_API void ft_log(ft_log_level lvl, const char *fmt, ...)
           __attribute__((format(printf, 2, 3)));
#define FT_LOG(lvl, ...) \
    do { if ((lvl) <= ft_log_get_level()) ft_log((lvl), __VA_ARGS__); } while (0)

/* ---------------------------------------------------------------- dtypes */

typedef enum ft_dtype {
    FT_F32 = 0, FT_F16 = 1, FT_BF16 = 2,
    FT_I8 = 3, FT_U8 = 4, FT_I32 = 5,
    /* Packed group-quantized payloads (values only; scales live in the
     * frame). Bits per element via ft_dtype_bits(). */
    FT_Q8 = 6, FT_Q4 = 7,
    FT_DTYPE_COUNT = 8
} ft_dtype;

FT_API const char *ft_dtype_name(ft_dtype dt);          /* "bf16"; "?" if invalid */
/* Parse "f32|float32|f16|float16|bf16|bfloat16|i8|u8|i32|q8|q4". */
FT_API ft_status ft_dtype_parse(const char *s, ft_dtype *out);
FT_API unsigned ft_dtype_bits(ft_dtype dt);             /* 0 if invalid          */
FT_API int ft_dtype_is_float(ft_dtype dt);              /* f32, f16, bf16        */

/* ---------------------------------------------------------------- tensor */

#define FT_MAX_DIMS 8

/* A contiguous, row-major tensor view. Does not own data. */
typedef struct ft_tensor {
    ft_dtype dtype;
    uint32_t ndim;                 /* 0..FT_MAX_DIMS; 0 = scalar (1 elem) */
    int64_t  shape[FT_MAX_DIMS];
    void    *data;
} ft_tensor;

/* Fill a descriptor; validates ndim, dims >= 0, and that the byte size
 * fits in int64. */
FT_API ft_status ft_tensor_init(ft_tensor *t, ft_dtype dt, uint32_t ndim,
                                const int64_t *shape, void *data);
/* Element count and byte size, overflow-checked (FT_ERR_INVALID_ARG). */
FT_API ft_status ft_shape_numel(uint32_t ndim, const int64_t *shape, uint64_t *out);
FT_API ft_status ft_tensor_numel(const ft_tensor *t, uint64_t *out);
FT_API ft_status ft_tensor_nbytes(const ft_tensor *t, uint64_t *out);
/* Bytes for n elements of dt (rounds packed types up to whole bytes). */
FT_API uint64_t ft_dtype_nbytes(ft_dtype dt, uint64_t n);
/* Parse "4096,4096" (or "4096x4096"); "" or "scalar" = 0 dims. */
FT_API ft_status ft_shape_parse(const char *s, uint32_t *ndim, int64_t *shape);
/* Format "[4096, 4096]" into buf. */
FT_API void ft_shape_format(uint32_t ndim, const int64_t *shape, char *buf, size_t n);

/* ------------------------------------------------------- dtype conversion */

/* Round-to-nearest-even; NaN stays NaN (quiet), Inf stays Inf; f16
 * overflow goes to Inf, underflow to subnormals/zero. SIMD paths (F16C,
 * AVX-512 BF16) are chosen at run time; the _ref functions are the plain
 * scalar definitions they are tested against. */
FT_API void ft_f32_to_f16(uint16_t *dst, const float *src, size_t n);
FT_API void ft_f16_to_f32(float *dst, const uint16_t *src, size_t n);
FT_API void ft_f32_to_bf16(uint16_t *dst, const float *src, size_t n);
FT_API void ft_bf16_to_f32(float *dst, const uint16_t *src, size_t n);
FT_API void ft_f32_to_f16_ref(uint16_t *dst, const float *src, size_t n);
FT_API void ft_f16_to_f32_ref(float *dst, const uint16_t *src, size_t n);
FT_API void ft_f32_to_bf16_ref(uint16_t *dst, const float *src, size_t n);
FT_API void ft_bf16_to_f32_ref(float *dst, const uint16_t *src, size_t n);
/* Single values (scalar reference semantics). */
FT_API uint16_t ft_f32_to_f16_1(float f);
FT_API float    ft_f16_to_f32_1(uint16_t h);
FT_API uint16_t ft_f32_to_bf16_1(float f);
FT_API float    ft_bf16_to_f32_1(uint16_t h);
/* Convert n elements between any two of f32/f16/bf16 (same dtype = copy). */
FT_API ft_status ft_convert(void *dst, ft_dtype dst_dt, const void *src,
                            ft_dtype src_dt, size_t n);

/* Synthetic LLM-like weights for benchmarks and calibration: Gaussian,
 * sigma 0.02 scaled per row of `row` values by exp(0.25 * N(0,1)) (the
 * distribution the codec targets are stated on), n values of dtype dt (a
 * float dtype) into out. Deterministic in seed. */
FT_API ft_status ft_synth_weights(ft_dtype dt, uint64_t n, uint64_t row, uint64_t seed, void *out);

/* CPU features detected at run time (after ft_cpu_init / first use).
 * neon: AArch64 Advanced SIMD (HWCAP_ASIMD; every AArch64 Linux CPU has
 * it), including the f16 <-> f32 conversions. */
typedef struct ft_cpu_features {
    int avx2, fma, f16c, avx512f, avx512bw, avx512vl, avx512vbmi,
        avx512bf16, avx512fp16;
    int avx512vnni;   /* vpdpbusd on zmm (AVX512_VNNI) */
    int neon;
} ft_cpu_features;
FT_API const ft_cpu_features *ft_cpu(void);
/* FLEXTIER_NO_SIMD=1 in the environment forces the scalar paths. */
FT_API int ft_simd_enabled(void);

/* ------------------------------------------------------------ allocation */

/* Aligned allocation (align: power of two >= sizeof(void*)); NULL on
 * failure or size 0 overflow. Free with ft_free_aligned (NULL ok). */
FT_API void *ft_malloc_aligned(size_t size, size_t align);
FT_API void  ft_free_aligned(void *p);

/* ----------------------------------------------------------- thread pool */

typedef struct ft_pool ft_pool;

/* nthreads == 0: ft_default_threads(). The calling thread participates,
 * so nthreads == 1 spawns no threads. */
FT_API ft_status ft_pool_create(unsigned nthreads, ft_pool **out);
FT_API void      ft_pool_free(ft_pool *pool);
FT_API unsigned  ft_pool_size(const ft_pool *pool);
/* How long workers (and the caller) spin for the next job before they
 * sleep, in microseconds (0: sleep at once); the default, 100, suits jobs
 * microseconds apart (a decode step's products). FLEXTIER_SPIN_US, when
 * set, decides for every pool: this call then changes nothing. Call
 * between runs. */
FT_API void      ft_pool_set_spin_us(ft_pool *pool, unsigned us);
/* Parallel for: calls fn(arg, i, worker) for i in [0, n), worker in
 * [0, size). Blocks until all are done. Not reentrant: one ft_pool_run at
 * a time per pool (calls from several threads are serialized).
 * pool == NULL runs serially on the caller. */
typedef void (*ft_pool_fn)(void *arg, size_t i, unsigned worker);
FT_API void ft_pool_run(ft_pool *pool, size_t n, ft_pool_fn fn, void *arg);
/* The default thread count: FLEXTIER_THREADS if set (1..1024), else
 * ft_usable_cpus(). */
FT_API unsigned ft_default_threads(void);
/* The CPUs this process may use: those of its affinity mask
 * (sched_getaffinity: taskset, cpusets), capped by its cgroup's CPU quota
 * rounded up (cgroup v2 cpu.max, v1 cpu.cfs_quota_us / cpu.cfs_period_us,
 * the smallest along the cgroup's ancestors); at least 1. Read at each
 * call. */
FT_API unsigned ft_usable_cpus(void);
/* FLEXTIER_DIRECT_IO: 1 or 0 where it is set to that, else -1 (the
 * default: files read past the page cache under a memory budget). The
 * store's direct_io and the engine's stream_direct_io default to it. */
FT_API int ft_direct_io_env(void);

/* ------------------------------------------------------------- checksums */

FT_API uint64_t ft_xxh3(const void *data, size_t n);
FT_API uint64_t ft_xxh3_seed(const void *data, size_t n, uint64_t seed);

/* -------------------------------------------------------- random numbers */

/* splitmix64: small, fast and deterministic; for synthetic data, tests and
 * sampling (not for secrets). */
static inline uint64_t ft_rand_u64(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
/* A standard normal deviate (Box-Muller over ft_rand_u64). */
FT_API double ft_rand_gauss(uint64_t *state);

/* Synthetic LLM-like weights, the one generator of the benchmarks and
 * tests: N(0, sigma^2) values whose sigma is 0.02 * exp(0.25 * N(0,1)),
 * drawn anew at the start of every row of `row` elements (the
 * distribution the codec targets are stated on). n values of the float
 * dtype dt into out; deterministic in seed. FT_ERR_INVALID_ARG for a
 * non-float dtype or row 0. */
FT_API ft_status ft_synth_weights(ft_dtype dt, uint64_t n, uint64_t row, uint64_t seed, void *out);

/* ---------------------------------------------------------------- memory */

/* The memory this process may use (docs/offload.md, "Memory budget"):
 * its memory cgroup's limit (v2 memory.max, v1 memory.limit_in_bytes; the
 * smallest along the path from /proc/self/cgroup), else the machine's
 * MemAvailable plus what the process already holds; the default budget is
 * that limit minus a headroom of max(64 MiB, limit / 16) for what no
 * estimate sees (the C library's arenas, thread stacks, BLAS buffers). */
#define FT_MEMORY_HEADROOM_MIN (64ull << 20)
typedef struct ft_memory_info {
    uint64_t limit;            /* the bound found (bytes)                   */
    uint64_t headroom;         /* kept free below it                       */
    uint64_t budget;           /* limit - headroom                         */
    uint64_t cgroup_limit;     /* 0: none                                  */
    int cgroup_version;        /* 1, 2; 0: no limited memory cgroup        */
    uint64_t available;        /* MemAvailable (0: unknown)                */
    const char *source;        /* "cgroup v1 memory.limit_in_bytes", ...   */
} ft_memory_info;
FT_API ft_status ft_memory_default_budget(ft_memory_info *out);
FT_API uint64_t ft_memory_headroom(uint64_t limit);
/* 0 when the process is in no limited memory cgroup; *version (may be
 * NULL) gets 1 or 2. */
FT_API uint64_t ft_cgroup_memory_limit(int *version);
/* Resident set size now (/proc/self/statm; 0 if unknown). */
FT_API uint64_t ft_process_rss(void);
/* What this process's own memory cgroup is charged now (v2
 * memory.current, v1 memory.usage_in_bytes: its processes' memory and the
 * page cache they read, the executable's and libraries' pages included),
 * when that cgroup itself has a limit; else 0. */
FT_API uint64_t ft_cgroup_memory_usage(void);
/* The same less the cgroup's inactive file pages (memory.stat's
 * inactive_file; v1 total_inactive_file): clean page cache the kernel
 * reclaims before anything else, as a context about to be built sees it
 * (the checkpoint's pages read for streamed embeddings or the head
 * otherwise fill a cgroup at --memory to its limit). 0 as above. */
FT_API uint64_t ft_cgroup_memory_working_set(void);
/* The same less all its clean file pages (active_file + inactive_file,
 * plus back file_dirty + file_writeback; v1 total_*): what the kernel
 * cannot reclaim to make room in a cgroup whose limit is reached, as a
 * context about to be built under such a limit sees it. 0 as above. */
FT_API uint64_t ft_cgroup_memory_unreclaimable(void);

/* ---------------------------------------------------------------- timing */

FT_API double ft_now(void);  /* monotonic seconds */

#ifdef __cplusplus
}
#endif
#endif
