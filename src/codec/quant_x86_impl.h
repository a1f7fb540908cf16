/* ----------------------------------------------------------------- loads */

static TGT AI __m512 QX(q8_16)(const uint8_t *p)
{
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)));
}

/* 16 bytes of nibbles -> 32 values, element order (low nibble first). */
static TGT AI void QX(q4_32)(const uint8_t *p, __m512 *a, __m512 *b)
{
    const __m128i m = _mm_set1_epi8(15);
    __m128i v = _mm_loadu_si128((const __m128i *)p);
    __m128i lo = _mm_and_si128(v, m), hi = _mm_and_si128(_mm_srli_epi16(v, 4), m);
    *a = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi)));
    *b = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpackhi_epi8(lo, hi)));
}

/* 8 bytes of nibbles -> 16 values. */
static TGT AI __m512 QX(q4_16)(const uint8_t *p)
{
    const __m128i m = _mm_set1_epi8(15);
    __m128i v = _mm_loadl_epi64((const __m128i *)p);
    __m128i lo = _mm_and_si128(v, m), hi = _mm_and_si128(_mm_srli_epi16(v, 4), m);
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi)));
}

static TGT AI __m512 QX(ld_x)(ft_dtype dt, const void *p, size_t i)
{
    if (dt == FT_F32) return _mm512_loadu_ps((const float *)p + i);
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i));
    if (dt == FT_BF16) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    return _mm512_cvtph_ps(h);
}

/* ---------------------------------------------------------------- stores */

static TGT AI __m256i QX(to_bf16)(__m512 y)
{
    __m512i u = _mm512_castps_si512(y);
    __mmask16 nan = _mm512_cmp_ps_mask(y, y, _CMP_UNORD_Q);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb));
    r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(u, _mm512_set1_epi32(0x400000)));
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16));
}

static TGT AI void QX(st_y)(ft_dtype dt, void *out, size_t i, __m512 y)
{
    if (dt == FT_F32) _mm512_storeu_ps((float *)out + i, y);
    else if (dt == FT_BF16) _mm256_storeu_si256((__m256i *)((uint16_t *)out + i), QX(to_bf16)(y));
    else _mm256_storeu_si256((__m256i *)((uint16_t *)out + i),
                             _mm512_cvtps_ph(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

static inline size_t QX(osize)(ft_dtype dt) { return dt == FT_F32 ? 4 : 2; }

/* ---------------------------------------------------------------- decode */

/* Store a pair of 16-lane results (32 values). With AVX512-BF16 and
 * finite parameters, bf16 uses VCVTNE2PS2BF16: y = q*step + min with
 * finite fp16 step and min is a multiple of 2^-24 (never an f32
 * subnormal) and far below overflow, where that instruction is exactly
 * round-to-nearest-even like ft_f32_to_bf16_1. */
static TGT AI void QX(st_y2)(ft_dtype dt, int fin, void *out, size_t i, __m512 a, __m512 b)
{
#if QX_NEBF16
    if (dt == FT_BF16 && fin) {
        _mm512_storeu_si512((uint16_t *)out + i, (__m512i)_mm512_cvtne2ps_pbh(b, a));
        return;
    }
#else
    if (dt == FT_BF16 && fin) {
        /* Finite y: RNE is (u + 0x7fff + lsb) >> 16, no NaN fix-up. packus
         * interleaves the two vectors per 128-bit lane; the qword permute
         * restores element order. */
        const __m512i bias = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1);
        __m512i ua = _mm512_castps_si512(a), ub = _mm512_castps_si512(b);
        ua = _mm512_add_epi32(ua, _mm512_add_epi32(bias, _mm512_and_si512(_mm512_srli_epi32(ua, 16), one)));
        ub = _mm512_add_epi32(ub, _mm512_add_epi32(bias, _mm512_and_si512(_mm512_srli_epi32(ub, 16), one)));
        __m512i pk = _mm512_packus_epi32(_mm512_srli_epi32(ua, 16), _mm512_srli_epi32(ub, 16));
        pk = _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7), pk);
        _mm512_storeu_si512((uint16_t *)out + i, pk);
        return;
    }
#endif
    QX(st_y)(dt, out, i, a);
    QX(st_y)(dt, out, i + 16, b);
}

/* vec = 0: broadcast (mn0, st0); vec = 1: per-element arrays. */
static TGT AI void QX(dec_impl)(int bits, ft_dtype odt, int vec, int fin, const uint8_t *p,
                                uint64_t k, size_t n, float mn0, float st0, const float *mn,
                                const float *st, void *out)
{
    size_t i = 0;
    if (bits == 4 && (k & 1) && n) {
        if (vec) ft_qdec_vec_ref(4, odt, p, k, 1, mn, st, fin, out);
        else ft_qdec_bcast_ref(4, odt, p, k, 1, mn0, st0, out);
        i = 1;
    }
    const __m512 bm = _mm512_set1_ps(mn0), bs = _mm512_set1_ps(st0);
#define MN(o) (vec ? _mm512_loadu_ps(mn + i + (o)) : bm)
#define ST(o) (vec ? _mm512_loadu_ps(st + i + (o)) : bs)
    if (bits == 4) {
        for (; i + 32 <= n; i += 32) {
            __m512 a, b;
            QX(q4_32)(p + ((k + i) >> 1), &a, &b);
            QX(st_y2)(odt, fin, out, i, _mm512_fmadd_ps(a, ST(0), MN(0)),
                      _mm512_fmadd_ps(b, ST(16), MN(16)));
        }
        if (i + 16 <= n) {
            QX(st_y)(odt, out, i, _mm512_fmadd_ps(QX(q4_16)(p + ((k + i) >> 1)), ST(0), MN(0)));
            i += 16;
        }
    } else {
        for (; i + 32 <= n; i += 32)
            QX(st_y2)(odt, fin, out, i, _mm512_fmadd_ps(QX(q8_16)(p + k + i), ST(0), MN(0)),
                      _mm512_fmadd_ps(QX(q8_16)(p + k + i + 16), ST(16), MN(16)));
        if (i + 16 <= n) {
            QX(st_y)(odt, out, i, _mm512_fmadd_ps(QX(q8_16)(p + k + i), ST(0), MN(0)));
            i += 16;
        }
    }
#undef MN
#undef ST
    if (i < n) {
        void *o = (uint8_t *)out + i * QX(osize)(odt);
        if (vec) ft_qdec_vec_ref(bits, odt, p, k + i, n - i, mn + i, st + i, fin, o);
        else ft_qdec_bcast_ref(bits, odt, p, k + i, n - i, mn0, st0, o);
    }
}

#define QX_DEC_CASES(F, ...)                                                 \
    switch ((bits == 4 ? 3 : 0) + (odt == FT_F32 ? 0 : odt == FT_BF16 ? 1 : 2)) { \
    case 0: F(8, FT_F32, __VA_ARGS__); break;                                \
    case 1: F(8, FT_BF16, __VA_ARGS__); break;                               \
    case 2: F(8, FT_F16, __VA_ARGS__); break;                                \
    case 3: F(4, FT_F32, __VA_ARGS__); break;                                \
    case 4: F(4, FT_BF16, __VA_ARGS__); break;                               \
    default: F(4, FT_F16, __VA_ARGS__); break;                               \
    }

static inline int QX(fin16)(float a, float b)
{
    uint32_t u, v;
    memcpy(&u, &a, 4);
    memcpy(&v, &b, 4);
    return (u & 0x7f800000u) != 0x7f800000u && (v & 0x7f800000u) != 0x7f800000u;
}

TGT static void QX(dec_bcast)(int bits, ft_dtype odt, const uint8_t *p, uint64_t k, size_t n,
                              float mn, float step, void *out)
{
    int fin = QX(fin16)(mn, step);
#define F_(B, D, ...) QX(dec_impl)(B, D, 0, fin, __VA_ARGS__)
    QX_DEC_CASES(F_, p, k, n, mn, step, NULL, NULL, out)
#undef F_
}

TGT static void QX(dec_vec)(int bits, ft_dtype odt, const uint8_t *p, uint64_t k, size_t n,
                            const float *mn, const float *step, int fin, void *out)
{
#define F_(B, D, ...) QX(dec_impl)(B, D, 1, fin, __VA_ARGS__)
    QX_DEC_CASES(F_, p, k, n, 0.0f, 0.0f, mn, step, out)
#undef F_
}

/* Runs of whole groups: the parameters are converted per group and the
 * bulk loop is inlined with them (no call per group). */
static TGT AI void QX(groups_impl)(int bits, ft_dtype odt, const uint8_t *hdr, const uint8_t *p,
                                   uint64_t k, size_t ng, size_t g, void *out)
{
    const size_t os = QX(osize)(odt);
    for (size_t j = 0; j < ng; j++) {
        uint32_t w;
        memcpy(&w, hdr + 4 * j, 4);   /* little endian: min, step */
        __m128 ms = _mm_cvtph_ps(_mm_cvtsi32_si128((int)w));
        float mn = _mm_cvtss_f32(ms), st = _mm_cvtss_f32(_mm_shuffle_ps(ms, ms, 1));
        int fin = (w & 0x7c00u) != 0x7c00u && (w & 0x7c000000u) != 0x7c000000u;
        if (fin) QX(dec_impl)(bits, odt, 0, 1, p, k + j * g, g, mn, st, NULL, NULL,
                              (uint8_t *)out + j * g * os);
        else QX(dec_impl)(bits, odt, 0, 0, p, k + j * g, g, mn, st, NULL, NULL,
                          (uint8_t *)out + j * g * os);
    }
}

TGT static void QX(dec_groups)(int bits, ft_dtype odt, const uint8_t *hdr, const uint8_t *p,
                               uint64_t k, size_t ng, size_t g, void *out)
{
    QX_DEC_CASES(QX(groups_impl), hdr, p, k, ng, g, out)
}

/* ---------------------------------------------------------------- minmax */

static TGT AI __mmask16 QX(nonfinite)(__m512 x)
{
    const __m512i e = _mm512_set1_epi32(0x7f800000);
    return _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_castps_si512(x), e), e);
}

static TGT AI int QX(minmax_impl)(ft_dtype dt, const void *src, size_t n, float *mn, float *mx)
{
    __m512 a = _mm512_set1_ps(*mn), b = _mm512_set1_ps(*mx);
    __m512 a2 = a, b2 = b;
    __mmask16 bad = 0;
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512 x = QX(ld_x)(dt, src, i), y = QX(ld_x)(dt, src, i + 16);
        bad |= QX(nonfinite)(x) | QX(nonfinite)(y);
        a = _mm512_min_ps(a, x); b = _mm512_max_ps(b, x);
        a2 = _mm512_min_ps(a2, y); b2 = _mm512_max_ps(b2, y);
    }
    for (; i + 16 <= n; i += 16) {
        __m512 x = QX(ld_x)(dt, src, i);
        bad |= QX(nonfinite)(x);
        a = _mm512_min_ps(a, x); b = _mm512_max_ps(b, x);
    }
    if (bad) return 1;
    float lo = _mm512_reduce_min_ps(_mm512_min_ps(a, a2));
    float hi = _mm512_reduce_max_ps(_mm512_max_ps(b, b2));
    if (ft_qminmax_ref(dt, (const uint8_t *)src + i * (dt == FT_F32 ? 4 : 2), n - i, &lo, &hi))
        return 1;
    *mn = lo;
    *mx = hi;
    return 0;
}

TGT static int QX(minmax)(ft_dtype dt, const void *src, size_t n, float *mn, float *mx)
{
    if (dt == FT_F32) return QX(minmax_impl)(FT_F32, src, n, mn, mx);
    if (dt == FT_BF16) return QX(minmax_impl)(FT_BF16, src, n, mn, mx);
    return QX(minmax_impl)(FT_F16, src, n, mn, mx);
}

static TGT AI int QX(minmax_vec_impl)(ft_dtype dt, const void *src, size_t n, float *mn, float *mx)
{
    __mmask16 bad = 0;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 x = QX(ld_x)(dt, src, i);
        bad |= QX(nonfinite)(x);
        _mm512_storeu_ps(mn + i, _mm512_min_ps(_mm512_loadu_ps(mn + i), x));
        _mm512_storeu_ps(mx + i, _mm512_max_ps(_mm512_loadu_ps(mx + i), x));
    }
    if (bad) return 1;
    return ft_qminmax_vec_ref(dt, (const uint8_t *)src + i * (dt == FT_F32 ? 4 : 2), n - i,
                              mn + i, mx + i);
}

TGT static int QX(minmax_vec)(ft_dtype dt, const void *src, size_t n, float *mn, float *mx)
{
    if (dt == FT_F32) return QX(minmax_vec_impl)(FT_F32, src, n, mn, mx);
    if (dt == FT_BF16) return QX(minmax_vec_impl)(FT_BF16, src, n, mn, mx);
    return QX(minmax_vec_impl)(FT_F16, src, n, mn, mx);
}

/* ---------------------------------------------------------------- encode */

static TGT AI __m512i QX(quant16)(__m512 x, __m512 mn, __m512 inv, __m512 bmax)
{
    __m512 t = _mm512_mul_ps(_mm512_sub_ps(x, mn), inv);
    t = _mm512_min_ps(_mm512_max_ps(t, _mm512_setzero_ps()), bmax);
    return _mm512_cvt_roundps_epi32(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

/* 32 values (0..15) -> 16 bytes, low nibble = even element. */
static TGT AI __m128i QX(pack4)(__m512i a, __m512i b)
{
    __m128i qa = _mm512_cvtepi32_epi8(a), qb = _mm512_cvtepi32_epi8(b);
    const __m128i m = _mm_set1_epi16(0x00ff);
    qa = _mm_and_si128(_mm_or_si128(qa, _mm_srli_epi16(qa, 4)), m);
    qb = _mm_and_si128(_mm_or_si128(qb, _mm_srli_epi16(qb, 4)), m);
    return _mm_packus_epi16(qa, qb);
}

static TGT AI void QX(enc_impl)(int bits, ft_dtype idt, int vec, const void *src, size_t n,
                            float mn0, float inv0, const float *mn, const float *inv,
                            uint8_t *p, uint64_t k)
{
    size_t i = 0;
    if (bits == 4 && (k & 1) && n) {
        if (vec) ft_qenc_vec_ref(4, idt, src, 1, mn, inv, p, k);
        else ft_qenc_bcast_ref(4, idt, src, 1, mn0, inv0, p, k);
        i = 1;
    }
    const __m512 bm = _mm512_set1_ps(mn0), bi = _mm512_set1_ps(inv0);
    const __m512 bmax = _mm512_set1_ps((float)((1u << bits) - 1));
#define MN(o) (vec ? _mm512_loadu_ps(mn + i + (o)) : bm)
#define IV(o) (vec ? _mm512_loadu_ps(inv + i + (o)) : bi)
    if (bits == 4) {
        for (; i + 32 <= n; i += 32) {
            __m512i a = QX(quant16)(QX(ld_x)(idt, src, i), MN(0), IV(0), bmax);
            __m512i b = QX(quant16)(QX(ld_x)(idt, src, i + 16), MN(16), IV(16), bmax);
            _mm_storeu_si128((__m128i *)(p + ((k + i) >> 1)), QX(pack4)(a, b));
        }
    } else {
        for (; i + 16 <= n; i += 16)
            _mm_storeu_si128((__m128i *)(p + k + i),
                             _mm512_cvtepi32_epi8(QX(quant16)(QX(ld_x)(idt, src, i), MN(0), IV(0), bmax)));
    }
#undef MN
#undef IV
    if (i < n) {
        const void *s = (const uint8_t *)src + i * (idt == FT_F32 ? 4 : 2);
        if (vec) ft_qenc_vec_ref(bits, idt, s, n - i, mn + i, inv + i, p, k + i);
        else ft_qenc_bcast_ref(bits, idt, s, n - i, mn0, inv0, p, k + i);
    }
}

#define QX_ENC_CASES(VEC, ...)                                                  \
    switch ((bits == 4 ? 3 : 0) + (idt == FT_F32 ? 0 : idt == FT_BF16 ? 1 : 2)) { \
    case 0: QX(enc_impl)(8, FT_F32, VEC, __VA_ARGS__); break;                    \
    case 1: QX(enc_impl)(8, FT_BF16, VEC, __VA_ARGS__); break;                   \
    case 2: QX(enc_impl)(8, FT_F16, VEC, __VA_ARGS__); break;                    \
    case 3: QX(enc_impl)(4, FT_F32, VEC, __VA_ARGS__); break;                    \
    case 4: QX(enc_impl)(4, FT_BF16, VEC, __VA_ARGS__); break;                   \
    default: QX(enc_impl)(4, FT_F16, VEC, __VA_ARGS__); break;                   \
    }

TGT static void QX(enc_bcast)(int bits, ft_dtype idt, const void *src, size_t n, float mn,
                                 float inv, uint8_t *p, uint64_t k)
{
    QX_ENC_CASES(0, src, n, mn, inv, NULL, NULL, p, k)
}

TGT static void QX(enc_vec)(int bits, ft_dtype idt, const void *src, size_t n,
                               const float *mn, const float *inv, uint8_t *p, uint64_t k)
{
    QX_ENC_CASES(1, src, n, 0.0f, 0.0f, mn, inv, p, k)
}


#undef QX_DEC_CASES
#undef QX_ENC_CASES
