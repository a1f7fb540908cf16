/* AVX-512 group-quantization kernels (see quant_kern.h for the contract).
 * Each kernel handles the aligned bulk and hands heads (an odd q4 start)
 * and tails to its scalar twin, so results equal ft_qkern_ref() bit for
 * bit: decode is (float)q * step + min (the product is exact, so the FMA
 * used here rounds exactly like the scalar multiply-add), bf16 output uses
 * the same integer round-to-nearest-even as ft_f32_to_bf16_1 (not
 * VCVTNEPS2BF16, which flushes subnormals), f16 output VCVTPS2PH with RNE
 * (which ft_f32_to_f16_1 mirrors, NaN handling included). */
#include "quant_kern.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#include <string.h>

#define AI __attribute__((always_inline)) inline

/* The kernels are compiled twice from quant_x86_impl.h: plain AVX-512
 * (F, BW, VL) and with AVX512-BF16 for the bf16 output conversion. */
#define TGT __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#define QX(name) name##_avx512
#define QX_NEBF16 0
#include "quant_x86_impl.h"
#undef TGT
#undef QX
#undef QX_NEBF16

#define TGT __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c")))
#define QX(name) name##_avx512bf16
#define QX_NEBF16 1
#include "quant_x86_impl.h"
#undef TGT
#undef QX
#undef QX_NEBF16

#include "quant_avx2.h"

#define TABLE(sfx, label)                                                     \
    static const ft_qkern qkern_##sfx = {                                     \
        label, dec_bcast_##sfx, dec_vec_##sfx, dec_groups_##sfx, minmax_##sfx, \
        minmax_vec_##sfx, enc_bcast_##sfx, enc_vec_##sfx};
TABLE(avx512, "avx512")
TABLE(avx512bf16, "avx512+bf16")
TABLE(avx2, "avx2")

static int have_avx512(void)
{
    const ft_cpu_features *c = ft_cpu();
    return c->avx512f && c->avx512bw && c->avx512vl && c->f16c && c->fma;
}

const ft_qkern *ft_qkern_avx512(void)
{
    if (!have_avx512()) return NULL;
    return ft_cpu()->avx512bf16 ? &qkern_avx512bf16 : &qkern_avx512;
}

static int have_avx2(void)
{
    const ft_cpu_features *c = ft_cpu();
    return c->avx2 && c->fma && c->f16c;
}

const ft_qkern *ft_qkern_avx2(void) { return have_avx2() ? &qkern_avx2 : NULL; }

const ft_qkern *ft_qkern_list(int i)
{
    const ft_qkern *all[4];
    int n = 0;
    all[n++] = ft_qkern_ref();
    if (have_avx2()) all[n++] = &qkern_avx2;
    if (have_avx512()) all[n++] = &qkern_avx512;
    if (have_avx512() && ft_cpu()->avx512bf16) all[n++] = &qkern_avx512bf16;
    return i >= 0 && i < n ? all[i] : NULL;
}

const ft_qkern *ft_qkern_neon(void) { return NULL; }

#elif !defined(__aarch64__)   /* AArch64: quant_neon.c */
const ft_qkern *ft_qkern_avx512(void) { return NULL; }
const ft_qkern *ft_qkern_avx2(void) { return NULL; }
const ft_qkern *ft_qkern_neon(void) { return NULL; }
const ft_qkern *ft_qkern_list(int i) { return i == 0 ? ft_qkern_ref() : NULL; }
#endif
