/* Helpers shared by the CUDA tests: test data (with support/synth.h), frames, the case matrices
 * of the codec tests, and (cuda_test_require) the skip when no CUDA
 * device can be used: exit code 77, which ctest reports as skipped
 * (SKIP_RETURN_CODE 77 in tests/cuda/CMakeLists.txt). */
#ifndef FT_CUDA_TEST_UTIL_H
#define FT_CUDA_TEST_UTIL_H
#include "ft_test.h"
#include "support/synth.h"
#include "flextier/codec.h"
#include "flextier/cuda.h"

#include <math.h>

/* Exit 77 (skipped) with the reason when there is no usable device. Call
 * from a constructor so that it runs before any test. */
static inline void cuda_test_require(void)
{
    char why[512];
    if (ft_cuda_available(why, sizeof why) != FT_OK) {
        printf("SKIP: %s\n", why);
        fflush(stdout);
        exit(77);
    }
    ft_cuda_device_info info;
    if (ft_cuda_device_info_get(0, &info) == FT_OK)
        printf("device 0: %s, compute capability %d.%d, %d SMs, %.1f GiB, runtime %d, driver %d\n", info.name,
               info.cc_major, info.cc_minor, info.sm_count, (double)info.total_mem / 1073741824.0,
               info.runtime_version, info.driver_version);
}

#define CUDA_TEST_REQUIRE_DEVICE                                                \
    __attribute__((constructor)) static void cuda_test_require_ctor(void) { cuda_test_require(); }

static inline float ut_uniform(uint64_t *s) { return (float)(ft_test_rand(s) >> 40) / (float)(1 << 24) * 2.0f - 1.0f; }

/* Byte-plane test data: kind 0 weight-like (Gaussian, compressible
 * exponent), 1 random bit patterns (stored chunks, NaN payloads), 2 f32
 * copies of bf16 values (constant low planes), 3 all zero. */
static inline void *ut_make_bp_data(ft_dtype dt, uint64_t n, int kind, uint64_t seed)
{
    uint8_t *p = ft_malloc_aligned(n * 4 + 64, 64);
    uint64_t s = seed;
    for (uint64_t i = 0; i < n; i++) {
        if (kind == 1) {
            uint64_t r = ft_test_rand(&s);
            if (dt == FT_F32) memcpy((uint8_t *)p + 4 * i, &r, 4);
            else memcpy((uint8_t *)p + 2 * i, &r, 2);
            continue;
        }
        float v = kind == 3 ? 0.0f : (float)(0.02 * ft_rand_gauss(&s));
        if (kind == 2) v = ft_bf16_to_f32_1(ft_f32_to_bf16_1(v));
        ft_test_store_f(dt, p, i, v);
    }
    return p;
}

/* Encode t with p (chunk size `chunk`); returns the frame (free with
 * ft_free_aligned) and its size, or NULL. */
static inline uint8_t *ut_encode(ft_codec_ctx *cc, ft_codec_id codec, ft_codec_id entropy, uint32_t G, int32_t gdim,
                                 uint32_t chunk, const ft_tensor *t, size_t *fs)
{
    ft_codec_params p;
    ft_codec_default_params(&p);
    p.codec = codec;
    if (entropy) p.entropy = entropy;
    if (G) p.group_size = G;
    p.group_dim = gdim;
    if (chunk) p.chunk_size = chunk;
    size_t bound = ft_encode_bound(&p, t->dtype, t->ndim, t->shape);
    if (!bound) return NULL;
    uint8_t *f = ft_malloc_aligned(bound + 64, 64);
    if (ft_encode(cc, &p, t, f, bound, fs) != FT_OK) {
        fprintf(stderr, "  encode failed: %s\n", ft_last_error());
        ft_free_aligned(f);
        return NULL;
    }
    return f;
}

typedef struct {
    uint32_t ndim;
    int64_t shape[4];
    int32_t gdim;
    uint32_t G;
} ut_qcase;

/* group_dim first / middle / last, G in {1, 3, 7, 64, 128, > D}, short
 * last groups, odd element counts (q4 pad nibble), a scalar, an empty
 * tensor, and sizes spanning several 4 KiB chunks. */
static const ut_qcase ut_qcases[] = {
    {2, {37, 70}, -1, 64},   {2, {64, 130}, 0, 7},    {3, {5, 9, 33}, 1, 4},  {1, {1000}, 0, 128},
    {0, {0}, 0, 64},         {2, {0, 16}, -1, 64},    {2, {16, 16}, -1, 1},   {2, {300, 257}, -1, 64},
    {4, {3, 4, 5, 7}, 2, 3}, {2, {33, 2}, 0, 300},    {2, {1, 33}, -1, 64},   {2, {129, 64}, 0, 64},
    /* groups along the last dimension, whole and a multiple of 8: the
     * kernels' 8-at-a-time path (km_q_fast8_ok) */
    {2, {48, 256}, -1, 64},  {2, {10, 96}, 1, 32},    {1, {520}, 0, 8},
};
#define UT_NQCASES (sizeof ut_qcases / sizeof ut_qcases[0])

/* The q8/q4 frame matrix of the GPU and host-math tests: each codec, case,
 * input dtype (f32, f16, bf16) and chunk size (4 KiB, the default),
 * encoded from mixed test data. Walk it with
 *   for (ut_qframe q = {0}; ut_qframe_next(cc, &q);) { ... q.f ... }
 * (each step frees the previous frame; a failed encode is a failed CHECK
 * and the step has q.f == NULL). Outputs to decode to: ut_qf_odts. */
typedef struct {
    int k;   /* steps taken */
    int codec;
    size_t ci;
    ft_dtype idt;
    uint32_t chunk;
    int ch;
    uint64_t n;
    void *data;
    uint8_t *f;
    size_t fs;
} ut_qframe;
static const ft_dtype ut_qf_odts[3] = {FT_F32, FT_BF16, FT_F16};

static inline int ut_qframe_next(ft_codec_ctx *cc, ut_qframe *q)
{
    static const ft_dtype idts[] = {FT_F32, FT_F16, FT_BF16};
    static const uint32_t chunks[] = {4096, FT_DEFAULT_CHUNK_SIZE};
    ft_free_aligned(q->f);
    ft_free_aligned(q->data);
    q->f = NULL;
    q->data = NULL;
    if (q->k == (int)(2 * UT_NQCASES * 3 * 2)) return 0;
    int k = q->k++;
    q->ch = k % 2;
    int a = k / 2 % 3;
    q->ci = (size_t)(k / 6) % UT_NQCASES;
    q->codec = FT_CODEC_Q8 + k / (int)(6 * UT_NQCASES);
    q->idt = idts[a];
    q->chunk = chunks[q->ch];
    const ut_qcase *c = &ut_qcases[q->ci];
    ft_tensor t;
    CHECK_OK(ft_tensor_init(&t, q->idt, c->ndim, c->shape, NULL));
    ft_tensor_numel(&t, &q->n);
    t.data = q->data = ft_test_mixed(q->idt, q->n, 1000 * q->ci + 10 * (uint64_t)a + (uint64_t)q->codec);
    q->fs = 0;
    q->f = ut_encode(cc, (ft_codec_id)q->codec, 0, c->G, c->gdim, q->chunk, &t, &q->fs);
    CHECK(q->f != NULL);
    return 1;
}

/* "q4 case 3 bf16->f32 chunk 4096" */
static inline void ut_qframe_what(const ut_qframe *q, ft_dtype odt, char *buf, size_t n)
{
    snprintf(buf, n, "%s case %zu %s->%s chunk %u", ft_codec_name((ft_codec_id)q->codec), q->ci,
             ft_dtype_name(q->idt), ft_dtype_name(odt), q->chunk);
}

static inline int ut_same_bits(const void *a, const void *b, size_t n, const char *what)
{
    if (!memcmp(a, b, n)) return 1;
    const uint8_t *x = a, *y = b;
    size_t i = 0;
    while (x[i] == y[i]) i++;
    fprintf(stderr, "  %s: first difference at byte %zu of %zu (%02x vs %02x)\n", what, i, n, x[i], y[i]);
    return 0;
}
#endif
