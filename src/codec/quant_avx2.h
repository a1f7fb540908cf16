/* AVX2 (+FMA, F16C) group-quantization kernels, included once by
 * quant_x86.c. Same contract and the same bits as the scalar kernels
 * (see quant_kern.h and the comment at the top of quant_x86.c); 8 lanes. */

#define T2 __attribute__((target("avx2,fma,f16c")))

static T2 AI __m256 a2_ld_x(ft_dtype dt, const void *p, size_t i)
{
    if (dt == FT_F32) return _mm256_loadu_ps((const float *)p + i);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)p + i));
    if (dt == FT_BF16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    return _mm256_cvtph_ps(h);
}

static T2 AI __m256 a2_q8_8(const uint8_t *p)
{
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

/* 8 bytes of nibbles -> 16 values (two vectors of 8), element order. */
static T2 AI void a2_q4_16(const uint8_t *p, __m256 *a, __m256 *b)
{
    const __m128i m = _mm_set1_epi8(15);
    __m128i v = _mm_loadl_epi64((const __m128i *)p);
    __m128i il = _mm_unpacklo_epi8(_mm_and_si128(v, m), _mm_and_si128(_mm_srli_epi16(v, 4), m));
    *a = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(il));
    *b = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(il, 8)));
}

static T2 AI void a2_st_y(ft_dtype dt, void *out, size_t i, __m256 y)
{
    if (dt == FT_F32) { _mm256_storeu_ps((float *)out + i, y); return; }
    __m128i h;
    if (dt == FT_BF16) {
        __m256i u = _mm256_castps_si256(y);
        __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(y, y, _CMP_UNORD_Q));
        __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
        __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb));
        r = _mm256_blendv_epi8(r, _mm256_or_si256(u, _mm256_set1_epi32(0x400000)), nan);
        r = _mm256_srli_epi32(r, 16);
        h = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
    } else {
        h = _mm256_cvtps_ph(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    }
    _mm_storeu_si128((__m128i *)((uint16_t *)out + i), h);
}

static T2 AI void a2_dec_impl(int bits, ft_dtype odt, int vec, int fin, const uint8_t *p,
                              uint64_t k, size_t n, float mn0, float st0, const float *mn,
                              const float *st, void *out)
{
    size_t i = 0;
    if (bits == 4 && (k & 1) && n) {
        if (vec) ft_qdec_vec_ref(4, odt, p, k, 1, mn, st, fin, out);
        else ft_qdec_bcast_ref(4, odt, p, k, 1, mn0, st0, out);
        i = 1;
    }
    const __m256 bm = _mm256_set1_ps(mn0), bs = _mm256_set1_ps(st0);
#define MN(o) (vec ? _mm256_loadu_ps(mn + i + (o)) : bm)
#define ST(o) (vec ? _mm256_loadu_ps(st + i + (o)) : bs)
    if (bits == 4 && !vec && odt != FT_F32 && n - i >= 64) {
        /* 16 possible outputs: build them with the general path's
         * arithmetic, split into low/high byte tables and look the
         * nibbles up with PSHUFB. */
        uint16_t tb[16];
        a2_st_y(odt, tb, 0, _mm256_fmadd_ps(_mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7), bs, bm));
        a2_st_y(odt, tb, 8, _mm256_fmadd_ps(_mm256_setr_ps(8, 9, 10, 11, 12, 13, 14, 15), bs, bm));
        const __m128i t0 = _mm_loadu_si128((const __m128i *)tb), t1 = _mm_loadu_si128((const __m128i *)(tb + 8));
        const __m128i ff = _mm_set1_epi16(0xff);
        const __m256i TL = _mm256_broadcastsi128_si256(_mm_packus_epi16(_mm_and_si128(t0, ff), _mm_and_si128(t1, ff)));
        const __m256i TH = _mm256_broadcastsi128_si256(_mm_packus_epi16(_mm_srli_epi16(t0, 8), _mm_srli_epi16(t1, 8)));
        const __m128i m = _mm_set1_epi8(15);
        for (; i + 32 <= n; i += 32) {
            __m128i v = _mm_loadu_si128((const __m128i *)(p + ((k + i) >> 1)));
            __m128i lo = _mm_and_si128(v, m), hi = _mm_and_si128(_mm_srli_epi16(v, 4), m);
            __m256i idx = _mm256_set_m128i(_mm_unpackhi_epi8(lo, hi), _mm_unpacklo_epi8(lo, hi));
            __m256i L = _mm256_shuffle_epi8(TL, idx), H = _mm256_shuffle_epi8(TH, idx);
            __m256i o0 = _mm256_unpacklo_epi8(L, H), o1 = _mm256_unpackhi_epi8(L, H);
            _mm256_storeu_si256((__m256i *)((uint16_t *)out + i), _mm256_permute2x128_si256(o0, o1, 0x20));
            _mm256_storeu_si256((__m256i *)((uint16_t *)out + i + 16), _mm256_permute2x128_si256(o0, o1, 0x31));
        }
    }
    if (bits == 4) {
        for (; i + 16 <= n; i += 16) {
            __m256 a, b;
            a2_q4_16(p + ((k + i) >> 1), &a, &b);
            a2_st_y(odt, out, i, _mm256_fmadd_ps(a, ST(0), MN(0)));
            a2_st_y(odt, out, i + 8, _mm256_fmadd_ps(b, ST(8), MN(8)));
        }
    } else {
        for (; i + 8 <= n; i += 8)
            a2_st_y(odt, out, i, _mm256_fmadd_ps(a2_q8_8(p + k + i), ST(0), MN(0)));
    }
#undef MN
#undef ST
    if (i < n) {
        void *o = (uint8_t *)out + i * (odt == FT_F32 ? 4 : 2);
        if (vec) ft_qdec_vec_ref(bits, odt, p, k + i, n - i, mn + i, st + i, fin, o);
        else ft_qdec_bcast_ref(bits, odt, p, k + i, n - i, mn0, st0, o);
    }
}

#define A2_CASES(F, ...)                                                     \
    switch ((bits == 4 ? 3 : 0) + (dt == FT_F32 ? 0 : dt == FT_BF16 ? 1 : 2)) { \
    case 0: F(8, FT_F32, __VA_ARGS__); break;                                \
    case 1: F(8, FT_BF16, __VA_ARGS__); break;                               \
    case 2: F(8, FT_F16, __VA_ARGS__); break;                                \
    case 3: F(4, FT_F32, __VA_ARGS__); break;                                \
    case 4: F(4, FT_BF16, __VA_ARGS__); break;                               \
    default: F(4, FT_F16, __VA_ARGS__); break;                               \
    }

T2 static void dec_bcast_avx2(int bits, ft_dtype dt, const uint8_t *p, uint64_t k, size_t n,
                              float mn, float step, void *out)
{
#define F_(B, D, ...) a2_dec_impl(B, D, 0, 0, __VA_ARGS__)
    A2_CASES(F_, p, k, n, mn, step, NULL, NULL, out)
#undef F_
}

T2 static void dec_vec_avx2(int bits, ft_dtype dt, const uint8_t *p, uint64_t k, size_t n,
                            const float *mn, const float *step, int fin, void *out)
{
#define F_(B, D, ...) a2_dec_impl(B, D, 1, fin, __VA_ARGS__)
    A2_CASES(F_, p, k, n, 0.0f, 0.0f, mn, step, out)
#undef F_
}

static T2 AI void a2_groups_impl(int bits, ft_dtype odt, const uint8_t *hdr, const uint8_t *p,
                                 uint64_t k, size_t ng, size_t g, void *out)
{
    const size_t os = odt == FT_F32 ? 4 : 2;
    for (size_t j = 0; j < ng; j++) {
        uint32_t w;
        memcpy(&w, hdr + 4 * j, 4);   /* little endian: min, step */
        __m128 ms = _mm_cvtph_ps(_mm_cvtsi32_si128((int)w));
        a2_dec_impl(bits, odt, 0, 0, p, k + j * g, g, _mm_cvtss_f32(ms),
                    _mm_cvtss_f32(_mm_shuffle_ps(ms, ms, 1)), NULL, NULL,
                    (uint8_t *)out + j * g * os);
    }
}

T2 static void dec_groups_avx2(int bits, ft_dtype dt, const uint8_t *hdr, const uint8_t *p,
                               uint64_t k, size_t ng, size_t g, void *out)
{
    A2_CASES(a2_groups_impl, hdr, p, k, ng, g, out)
}

static T2 AI int a2_nonfinite(__m256 x)
{
    const __m256i e = _mm256_set1_epi32(0x7f800000);
    return _mm256_movemask_epi8(_mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(x), e), e));
}

static T2 AI int a2_minmax_impl(ft_dtype dt, const void *src, size_t n, float *mn, float *mx)
{
    __m256 a = _mm256_set1_ps(*mn), b = _mm256_set1_ps(*mx);
    int bad = 0;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 x = a2_ld_x(dt, src, i);
        bad |= a2_nonfinite(x);
        a = _mm256_min_ps(a, x);
        b = _mm256_max_ps(b, x);
    }
    if (bad) return 1;
    float la[8], lb[8];
    _mm256_storeu_ps(la, a);
    _mm256_storeu_ps(lb, b);
    float lo = la[0], hi = lb[0];
    for (int j = 1; j < 8; j++) { lo = la[j] < lo ? la[j] : lo; hi = lb[j] > hi ? lb[j] : hi; }
    if (ft_qminmax_ref(dt, (const uint8_t *)src + i * (dt == FT_F32 ? 4 : 2), n - i, &lo, &hi))
        return 1;
    *mn = lo;
    *mx = hi;
    return 0;
}

T2 static int minmax_avx2(ft_dtype dt, const void *src, size_t n, float *mn, float *mx)
{
    if (dt == FT_F32) return a2_minmax_impl(FT_F32, src, n, mn, mx);
    if (dt == FT_BF16) return a2_minmax_impl(FT_BF16, src, n, mn, mx);
    return a2_minmax_impl(FT_F16, src, n, mn, mx);
}

static T2 AI int a2_minmax_vec_impl(ft_dtype dt, const void *src, size_t n, float *mn, float *mx)
{
    int bad = 0;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 x = a2_ld_x(dt, src, i);
        bad |= a2_nonfinite(x);
        _mm256_storeu_ps(mn + i, _mm256_min_ps(_mm256_loadu_ps(mn + i), x));
        _mm256_storeu_ps(mx + i, _mm256_max_ps(_mm256_loadu_ps(mx + i), x));
    }
    if (bad) return 1;
    return ft_qminmax_vec_ref(dt, (const uint8_t *)src + i * (dt == FT_F32 ? 4 : 2), n - i,
                              mn + i, mx + i);
}

T2 static int minmax_vec_avx2(ft_dtype dt, const void *src, size_t n, float *mn, float *mx)
{
    if (dt == FT_F32) return a2_minmax_vec_impl(FT_F32, src, n, mn, mx);
    if (dt == FT_BF16) return a2_minmax_vec_impl(FT_BF16, src, n, mn, mx);
    return a2_minmax_vec_impl(FT_F16, src, n, mn, mx);
}

static T2 AI __m256i a2_quant8(__m256 x, __m256 mn, __m256 inv, __m256 bmax)
{
    __m256 t = _mm256_mul_ps(_mm256_sub_ps(x, mn), inv);
    t = _mm256_min_ps(_mm256_max_ps(t, _mm256_setzero_ps()), bmax);
    return _mm256_cvttps_epi32(_mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

static T2 AI void a2_enc_impl(int bits, ft_dtype idt, int vec, const void *src, size_t n,
                              float mn0, float inv0, const float *mn, const float *inv,
                              uint8_t *p, uint64_t k)
{
    size_t i = 0;
    if (bits == 4 && (k & 1) && n) {
        if (vec) ft_qenc_vec_ref(4, idt, src, 1, mn, inv, p, k);
        else ft_qenc_bcast_ref(4, idt, src, 1, mn0, inv0, p, k);
        i = 1;
    }
    const __m256 bm = _mm256_set1_ps(mn0), bi = _mm256_set1_ps(inv0);
    const __m256 bmax = _mm256_set1_ps((float)((1u << bits) - 1));
    /* byte 0 of each dword -> bytes 0..3 of each 128-bit lane */
    const __m256i pick = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                          0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
#define MN(o) (vec ? _mm256_loadu_ps(mn + i + (o)) : bm)
#define IV(o) (vec ? _mm256_loadu_ps(inv + i + (o)) : bi)
    if (bits == 4) {
        /* low byte of each qword = q[2j] | q[2j+1] << 4 */
        const __m256i pa = _mm256_setr_epi8(0, 8, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                            0, 8, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
        const __m256i pb = _mm256_setr_epi8(-1, -1, 0, 8, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                            -1, -1, 0, 8, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
        for (; i + 16 <= n; i += 16) {
            __m256i a = a2_quant8(a2_ld_x(idt, src, i), MN(0), IV(0), bmax);
            __m256i b = a2_quant8(a2_ld_x(idt, src, i + 8), MN(8), IV(8), bmax);
            a = _mm256_shuffle_epi8(_mm256_or_si256(a, _mm256_srli_epi64(a, 28)), pa);
            b = _mm256_shuffle_epi8(_mm256_or_si256(b, _mm256_srli_epi64(b, 28)), pb);
            __m256i t = _mm256_or_si256(a, b);   /* lane L: a bytes 2L,2L+1; b bytes 2L,2L+1 */
            __m128i r = _mm_unpacklo_epi16(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
            _mm_storel_epi64((__m128i *)(p + ((k + i) >> 1)), r);
        }
    } else {
        for (; i + 8 <= n; i += 8) {
            __m256i q = _mm256_shuffle_epi8(a2_quant8(a2_ld_x(idt, src, i), MN(0), IV(0), bmax), pick);
            __m128i r = _mm_unpacklo_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
            _mm_storel_epi64((__m128i *)(p + k + i), r);
        }
    }
#undef MN
#undef IV
    if (i < n) {
        const void *s = (const uint8_t *)src + i * (idt == FT_F32 ? 4 : 2);
        if (vec) ft_qenc_vec_ref(bits, idt, s, n - i, mn + i, inv + i, p, k + i);
        else ft_qenc_bcast_ref(bits, idt, s, n - i, mn0, inv0, p, k + i);
    }
}

T2 static void enc_bcast_avx2(int bits, ft_dtype dt, const void *src, size_t n, float mn,
                              float inv, uint8_t *p, uint64_t k)
{
#define F_(B, D, ...) a2_enc_impl(B, D, 0, __VA_ARGS__)
    A2_CASES(F_, src, n, mn, inv, NULL, NULL, p, k)
#undef F_
}

T2 static void enc_vec_avx2(int bits, ft_dtype dt, const void *src, size_t n, const float *mn,
                            const float *inv, uint8_t *p, uint64_t k)
{
#define F_(B, D, ...) a2_enc_impl(B, D, 1, __VA_ARGS__)
    A2_CASES(F_, src, n, 0.0f, 0.0f, mn, inv, p, k)
#undef F_
}

#undef A2_CASES
#undef T2
