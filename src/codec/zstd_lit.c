/* Fast decoder for the zstd frames the byte-plane codec writes: frames
 * whose blocks hold only Huffman-coded literals (ft_zstd_literals_encode),
 * raw blocks or RLE blocks. It is an ordinary zstd frame (RFC 8878), so
 * libzstd decodes it too; this decoder exists for speed: zstd decodes the
 * literals into its own buffer with a one-symbol-per-lookup Huffman table
 * and copies them out, while here each 11-bit lookup emits up to four
 * symbols (an exponent plane averages ~2.6 bits per symbol) straight into
 * the destination, four streams interleaved.
 *
 * Contract (ft_zstd_lit_decode): FT_OK only when the whole input is one
 * zstd frame of that shape that decodes to exactly `raw` bytes and passes
 * the checks libzstd makes on it (Huffman weights, FSE table of the
 * weights, each stream consumed to its last bit, sizes); anything else
 * (sequences, treeless or raw literals, dictionaries, checksums, an odd
 * window, corrupt data) returns FT_ERR_UNSUPPORTED without a message and
 * the caller hands the input to libzstd, which decides. Never reads
 * outside src[0, n) nor writes outside dst[0, raw). */
#include "codec_internal.h"

#include <string.h>

/* The stream reads (rd32/rd64 by memcpy) and the table entries (64-bit
 * words, symbols stored low byte first) assume a little-endian host, as
 * every target of the project is. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "zstd_lit.c assumes a little-endian host"
#endif

#define ZL_NO FT_ERR_UNSUPPORTED   /* "not for this decoder": use libzstd */
#define ZL_BLOCK_MAX (128u * 1024u)
#define ZL_MAX_TLOG 11

static inline uint32_t rd16(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8; }
static inline uint32_t rd24(const uint8_t *p) { return rd16(p) | (uint32_t)p[2] << 16; }
static inline uint32_t rd32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline uint64_t rd64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static inline unsigned highbit(uint32_t v) { return 31u - (unsigned)__builtin_clz(v); }   /* v > 0 */

/* ------------------------------------------------ backward bit stream */

/* zstd's backward bit stream (lib/common/bitstream.h), same semantics:
 * the FSE-coded weights use its exact end-of-stream behaviour. */
typedef struct {
    uint64_t c;
    unsigned used;
    const uint8_t *p, *start;
} bstream;

enum { BS_UNFINISHED, BS_END_OF_BUFFER, BS_COMPLETED, BS_OVERFLOW };

static int bs_init(bstream *b, const uint8_t *s, size_t n)
{
    if (n < 1 || s[n - 1] == 0) return -1;
    b->start = s;
    if (n >= 8) {
        b->p = s + n - 8;
        b->c = rd64(b->p);
        b->used = 8 - highbit(s[n - 1]);
    } else {
        b->p = s;
        b->c = 0;
        for (size_t i = 0; i < n; i++) b->c |= (uint64_t)s[i] << (8 * i);
        b->used = 8 - highbit(s[n - 1]) + (unsigned)(8 - n) * 8;
    }
    return 0;
}

static inline uint64_t bs_read(bstream *b, unsigned nb)   /* nb may be 0 */
{
    uint64_t v = ((b->c << (b->used & 63)) >> 1) >> ((63 - nb) & 63);
    b->used += nb;
    return v;
}

static int bs_reload(bstream *b)
{
    if (b->used > 64) return BS_OVERFLOW;
    if (b->p >= b->start + 8) {
        b->p -= b->used >> 3;
        b->used &= 7;
        b->c = rd64(b->p);
        return BS_UNFINISHED;
    }
    if (b->p == b->start) return b->used < 64 ? BS_END_OF_BUFFER : BS_COMPLETED;
    size_t nb = b->used >> 3;
    int r = BS_UNFINISHED;
    if ((size_t)(b->p - b->start) < nb) {
        nb = (size_t)(b->p - b->start);
        r = BS_END_OF_BUFFER;
    }
    b->p -= nb;
    b->used -= (unsigned)nb * 8;
    b->c = rd64(b->p);
    return r;
}

/* ------------------------------------------- Huffman weights (FSE) */

/* FSE normalized counts (RFC 8878 4.1.1), read forward from s[0, n):
 * bytes used, or 0 when malformed (libzstd decides). At most 13 symbols
 * (weights 0..12) are accepted. */
static size_t fse_read_ncount(const uint8_t *s, size_t n, short *norm, unsigned *nsym, unsigned *alog)
{
    size_t bit = 0, nbits_total = 8 * n;
    if (n < 1) return 0;
    unsigned al = (s[0] & 15) + 5;
    if (al > 6) return 0;   /* Huffman weights: accuracy log <= 6 */
    bit = 4;
    int remaining = (1 << al) + 1, threshold = 1 << al, nb = (int)al + 1;
    unsigned sym = 0;
    memset(norm, 0, 13 * sizeof norm[0]);
    while (remaining > 1) {
        if (sym > 12) return 0;
        int max = (2 * threshold - 1) - remaining;
        if (bit + (size_t)nb > nbits_total) return 0;
        uint32_t w = 0;
        for (int k = 0; k < nb; k++) w |= (uint32_t)((s[(bit + (size_t)k) >> 3] >> ((bit + (size_t)k) & 7)) & 1) << k;
        int count;
        if ((int)(w & (uint32_t)(threshold - 1)) < max) {
            count = (int)(w & (uint32_t)(threshold - 1));
            bit += (size_t)nb - 1;
        } else {
            count = (int)(w & (uint32_t)(2 * threshold - 1));
            if (count >= threshold) count -= max;
            bit += (size_t)nb;
        }
        count--;
        remaining -= count < 0 ? -count : count;
        if (remaining < 1) return 0;
        norm[sym++] = (short)count;
        if (count == 0) {   /* repeat flags: 2 bits each, 3 = another 3 zeros follow */
            for (;;) {
                if (bit + 2 > nbits_total) return 0;
                unsigned r = (s[bit >> 3] >> (bit & 7)) & 1;
                r |= ((s[(bit + 1) >> 3] >> ((bit + 1) & 7)) & 1) << 1;
                bit += 2;
                sym += r;
                if (sym > 13) return 0;
                if (r != 3) break;
            }
        }
        while (remaining < threshold) {
            nb--;
            threshold >>= 1;
        }
    }
    if (remaining != 1 || sym == 0) return 0;
    /* libzstd decodes the weights in a workspace sized for an accuracy log
     * of 6 and symbols 0..11 (HUF_READ_STATS_WORKSPACE_SIZE_U32) and
     * refuses counts that need more (FSE_DECOMPRESS_WKSP_SIZE): refuse the
     * same (found by fuzz_zstd_lit: 13 symbols at log 6) */
    size_t need = 4 * ((1 + ((size_t)1 << al)) + 1 + (2 * (size_t)sym + ((size_t)1 << al) + 8 + 3) / 4 + 129);
    if (need > 4 * (size_t)(65 + 1 + 24 + 129)) return 0;
    *nsym = sym;
    *alog = al;
    return (bit + 7) >> 3;
}

typedef struct { uint8_t sym, nb; uint16_t base; } fse_cell;

/* FSE decoding table (RFC 8878 4.1.1, "FSE table"); -1 when invalid. */
static int fse_build(const short *norm, unsigned nsym, unsigned al, fse_cell *t)
{
    unsigned size = 1u << al, high = size - 1, next[13];
    for (unsigned s = 0; s < nsym; s++) {
        if (norm[s] == -1) {
            t[high--].sym = (uint8_t)s;
            next[s] = 1;
        } else {
            next[s] = (unsigned)norm[s];
        }
    }
    unsigned pos = 0, step = (size >> 1) + (size >> 3) + 3, mask = size - 1;
    for (unsigned s = 0; s < nsym; s++)
        for (int i = 0; i < norm[s]; i++) {
            t[pos].sym = (uint8_t)s;
            do pos = (pos + step) & mask; while (pos > high);
        }
    if (pos != 0) return -1;
    for (unsigned u = 0; u < size; u++) {
        unsigned s = t[u].sym, ns = next[s]++;
        unsigned nb = al - highbit(ns);
        t[u].nb = (uint8_t)nb;
        t[u].base = (uint16_t)((ns << nb) - size);
    }
    return 0;
}

/* The Huffman tree description (RFC 8878 4.2.1): weights of symbols 0..
 * nsym-1 (the last one implied), table log. Bytes used, or 0. */
static size_t huf_read_weights(const uint8_t *s, size_t n, uint8_t *w, unsigned *nsym_out,
                               unsigned *tlog_out)
{
    if (n < 1) return 0;
    unsigned hb = s[0], ow = 0;
    size_t used;
    if (hb >= 128) {   /* direct: 4 bits per weight */
        ow = hb - 127;
        used = 1 + ((size_t)ow + 1) / 2;
        if (used > n || ow >= 256) return 0;
        for (unsigned i = 0; i < ow; i++) w[i] = (uint8_t)(i & 1 ? s[1 + i / 2] & 15 : s[1 + i / 2] >> 4);
    } else {   /* FSE-coded weights, hb bytes: counts, then two interleaved states */
        used = 1 + (size_t)hb;
        if (hb == 0 || used > n) return 0;
        short norm[13];
        unsigned nsym = 0, al = 0;
        size_t nc = fse_read_ncount(s + 1, hb, norm, &nsym, &al);
        if (nc == 0 || nc >= hb) return 0;
        fse_cell t[64];
        if (fse_build(norm, nsym, al, t)) return 0;
        bstream b;
        if (bs_init(&b, s + 1 + nc, hb - nc)) return 0;
        unsigned s1 = (unsigned)bs_read(&b, al);
        bs_reload(&b);
        unsigned s2 = (unsigned)bs_read(&b, al);
        bs_reload(&b);
        const unsigned omax = 255;
        for (;;) {
            if (ow + 2 > omax) return 0;
            w[ow++] = t[s1].sym;
            s1 = t[s1].base + (unsigned)bs_read(&b, t[s1].nb);
            if (bs_reload(&b) == BS_OVERFLOW) { w[ow++] = t[s2].sym; break; }
            if (ow + 2 > omax) return 0;
            w[ow++] = t[s2].sym;
            s2 = t[s2].base + (unsigned)bs_read(&b, t[s2].nb);
            if (bs_reload(&b) == BS_OVERFLOW) { w[ow++] = t[s1].sym; break; }
        }
    }
    /* weights -> table log and the implied last weight (HUF_readStats) */
    uint32_t total = 0, rank1 = 0;
    for (unsigned i = 0; i < ow; i++) {
        if (w[i] > 12) return 0;
        total += (1u << w[i]) >> 1;
        rank1 += w[i] == 1;
    }
    if (total == 0) return 0;
    unsigned tlog = highbit(total) + 1;
    if (tlog > ZL_MAX_TLOG) return 0;
    uint32_t rest = (1u << tlog) - total;
    if (rest != 1u << highbit(rest)) return 0;
    unsigned last = highbit(rest) + 1;
    w[ow] = (uint8_t)last;
    rank1 += last == 1;
    if (rank1 < 2 || (rank1 & 1)) return 0;
    *nsym_out = ow + 1;
    *tlog_out = tlog;
    return used;
}

/* ------------------------------------------------ the decoding table */

/* Entry for each value of the next `tlog` bits: up to 4 whole symbols
 * (low byte first), how many, the bits they take, and the first
 * symbol's length (for the stream tails). */
typedef struct {
    uint32_t syms;
    uint8_t n, bits, len1, pad;
} huf_cell;

struct ft_huf_table {
    unsigned nsym, tlog;
    uint8_t w[256];
    huf_cell t[1u << ZL_MAX_TLOG];
};

static void huf_build(ft_huf_table *h)
{
    unsigned tlog = h->tlog, rank[ZL_MAX_TLOG + 2] = {0};
    uint8_t sym1[1u << ZL_MAX_TLOG], len1[1u << ZL_MAX_TLOG];
    /* single-symbol table (HUF_readDTableX1): weight-1 symbols first, by symbol */
    for (unsigned s = 0; s < h->nsym; s++) rank[h->w[s]]++;
    unsigned start = 0;
    for (unsigned r = 1; r <= tlog; r++) {
        unsigned cur = start;
        start += rank[r] << (r - 1);
        rank[r] = cur;
    }
    for (unsigned s = 0; s < h->nsym; s++) {
        unsigned wt = h->w[s];
        if (!wt) continue;
        unsigned len = (1u << wt) >> 1;
        for (unsigned u = rank[wt]; u < rank[wt] + len; u++) {
            sym1[u] = (uint8_t)s;
            len1[u] = (uint8_t)(tlog + 1 - wt);
        }
        rank[wt] += len;
    }
    /* Multi-symbol entries. Entry v holds its first code (symbol s, length
     * l) and then what the remaining tlog - l bits decode to, which is the
     * entry of u = (v << l) mod 2^tlog cut to that budget. u has more
     * trailing zero bits than v (or is 0), so the entries are built in
     * order of decreasing trailing zeros, entry 0 (codes of all zeros)
     * first. cb[v]: the bits taken after 1, 2, 3, 4 symbols, a byte each
     * (repeating the total past the entry's last symbol). */
    static const uint32_t ones = 0x01010101u;
    unsigned size = 1u << tlog, mask = size - 1;
    /* built in word arrays (whole-word stores and loads), packed at the end */
    uint32_t cb[1u << ZL_MAX_TLOG];
    /* entries are written and read as whole 64-bit words (memcpy: huf_cell's
     * little-endian layout, syms | n << 32 | bits << 40 | len1 << 48) */
    _Static_assert(sizeof(huf_cell) == 8, "huf_cell is one 64-bit word");
    huf_cell *T = h->t;
    {
        unsigned pos = 0, n = 0;
        uint32_t syms = 0, cum = 0;
        while (n < 4 && pos + len1[0] <= tlog) {
            syms |= (uint32_t)sym1[0] << (8 * n);
            pos += len1[0];
            cum |= (uint32_t)pos << (8 * n);
            n++;
        }
        for (unsigned k = n; k < 4; k++) cum |= (uint32_t)pos << (8 * k);
        uint64_t e = syms | (uint64_t)n << 32 | (uint64_t)pos << 40 | (uint64_t)len1[0] << 48;
        memcpy(&T[0], &e, 8);
        cb[0] = cum;
    }
    for (int k = (int)tlog - 1; k >= 0; k--)
        for (unsigned v = 1u << k; v < size; v += 2u << k) {
            unsigned l = len1[v], u = (v << l) & mask, budget = tlog - l;
            uint32_t pc = cb[u];
            uint64_t pu;
            memcpy(&pu, &T[u], 8);
            unsigned nu = (unsigned)(pu >> 32) & 0xFF;
            /* symbols of entry u within the budget (cb bytes <= 12: no borrows) */
            uint32_t over = ((pc | 0x80808080u) - (budget + 1) * ones) & 0x80808080u;
            /* (branch-free: the data makes these branches unpredictable) */
            unsigned keep = (unsigned)__builtin_ctzll(over | 1ull << 32) >> 3;   /* bytes ascend */
            keep = keep < nu ? keep : nu;
            unsigned n = keep + (keep < 4);
            uint32_t low = (uint32_t)((1ull << (8 * n)) - 1);
            uint32_t cum = l * ones + (pc << 8), total = (cum >> (8 * (n - 1))) & 0xFF;
            uint32_t syms = (sym1[v] | (uint32_t)pu << 8) & low;
            uint64_t e = syms | (uint64_t)n << 32 | (uint64_t)total << 40 | (uint64_t)l << 48;
            memcpy(&T[v], &e, 8);
            cb[v] = (cum & low) | (total * ones & ~low);
        }
}

/* ------------------------------------------------- Huffman streams */

/* One stream's bits: T data bits below the end marker; position p (bits
 * consumed from the top). Bits below the stream's start read as zero. */
static inline uint32_t peek_slow(const uint8_t *s, size_t n, size_t T, size_t p, unsigned L)
{
    ptrdiff_t end = (ptrdiff_t)T - (ptrdiff_t)p, lo = end - (ptrdiff_t)L;
    uint32_t v = 0;
    for (ptrdiff_t g = end - 1; g >= lo; g--) {   /* tails only: a few symbols per stream */
        unsigned b = 0;
        if (g >= 0 && (size_t)(g >> 3) < n) b = (s[g >> 3] >> (g & 7)) & 1;
        v = v << 1 | b;
    }
    return v;
}

typedef struct {
    const uint8_t *s;      /* stream bytes */
    size_t n, T;
    const uint8_t *ip;     /* fast loop: container = 8 bytes at ip */
    uint64_t c;
    unsigned used;
    uint8_t *op, *oend;    /* output segment */
} hstream;

static int hs_init(hstream *h, const uint8_t *s, size_t n, uint8_t *op, uint8_t *oend)
{
    if (n < 1 || s[n - 1] == 0) return -1;
    h->s = s;
    h->n = n;
    h->T = 8 * (n - 1) + highbit(s[n - 1]);
    h->op = op;
    h->oend = oend;
    h->ip = NULL;
    if (n >= 8) {
        h->ip = s + n - 8;
        h->c = rd64(h->ip);
        h->used = 8 - highbit(s[n - 1]);
    }
    return 0;
}

/* Finish a stream exactly, symbol by symbol; -1 unless every data bit is
 * consumed by the last symbol. */
static int hs_tail(hstream *h, const huf_cell *t, unsigned L)
{
    size_t p;
    if (h->ip) p = h->T - (8 * (size_t)(h->ip - h->s) + 63 - h->used) - 1;
    else p = 0;
    while (h->op < h->oend) {
        huf_cell c = t[peek_slow(h->s, h->n, h->T, p, L)];
        if ((size_t)(h->oend - h->op) >= c.n) {
            memcpy(h->op, &c.syms, c.n);   /* n <= 4 */
            h->op += c.n;
            p += c.bits;
        } else {
            *h->op++ = (uint8_t)c.syms;
            p += c.len1;
        }
        if (p > h->T) return -1;
    }
    return p == h->T ? 0 : -1;
}

#define HS_STEP(h)                                                          \
    do {                                                                    \
        huf_cell c_ = t[((h).c << (h).used) >> sh];                         \
        memcpy((h).op, &c_.syms, 4);                                        \
        (h).op += c_.n;                                                     \
        (h).used += c_.bits;                                                \
    } while (0)

#define HS_RELOAD(h)                                                        \
    do {                                                                    \
        (h).ip -= (h).used >> 3;                                            \
        (h).used &= 7;                                                      \
        (h).c = rd64((h).ip);                                               \
    } while (0)

/* A stream may run a round (5 lookups: <= 55 bits, <= 20 symbols written
 * as 4-byte stores) while its container can be refilled from inside the
 * stream and 20 bytes of its segment are left. */
static inline int hs_can_round(const hstream *h)
{
    return h->ip && (size_t)(h->ip - h->s) >= (h->used >> 3) && h->oend - h->op >= 20;
}

static inline __attribute__((always_inline)) int huf_decode4_body(const ft_huf_table *h, const uint8_t *s, size_t n,
                                                                  uint8_t *dst, size_t regen)
{
    if (n < 10 || regen < 6) return -1;
    size_t l1 = rd16(s), l2 = rd16(s + 2), l3 = rd16(s + 4);
    if (l1 + l2 + l3 + 6 > n) return -1;
    size_t l4 = n - 6 - l1 - l2 - l3, seg = (regen + 3) / 4;
    if (3 * seg > regen) return -1;
    const uint8_t *p = s + 6;
    hstream H[4];
    if (hs_init(&H[0], p, l1, dst, dst + seg) ||
        hs_init(&H[1], p + l1, l2, dst + seg, dst + 2 * seg) ||
        hs_init(&H[2], p + l1 + l2, l3, dst + 2 * seg, dst + 3 * seg) ||
        hs_init(&H[3], p + l1 + l2 + l3, l4, dst + 3 * seg, dst + regen))
        return -1;
    const huf_cell *t = h->t;
    const unsigned sh = 64 - h->tlog;
    /* The four streams' hot state in locals (registers: the byte stores
     * through op may alias anything in memory), run in batches of rounds
     * that are safe without per-round checks: a round moves a stream's
     * input back by at most 7 bytes and its output on by at most 20. */
    for (;;) {
        size_t R = SIZE_MAX;
        for (int k = 0; k < 4; k++) {
            if (!H[k].ip) { R = 0; break; }
            size_t in = (size_t)(H[k].ip - H[k].s) / 7, o = (size_t)(H[k].oend - H[k].op) / 20;
            if (in < R) R = in;
            if (o < R) R = o;
        }
        if (R == 0) break;
        const uint8_t *ip0 = H[0].ip, *ip1 = H[1].ip, *ip2 = H[2].ip, *ip3 = H[3].ip;
        uint8_t *op0 = H[0].op, *op1 = H[1].op, *op2 = H[2].op, *op3 = H[3].op;
        unsigned u0 = H[0].used, u1 = H[1].used, u2 = H[2].used, u3 = H[3].used;
        uint64_t c0, c1, c2, c3;
#define L_RELOAD(ip, u, c) do { ip -= u >> 3; u &= 7; c = rd64(ip); } while (0)
#define L_STEP(c, u, op)                                                    \
        do {                                                                \
            const huf_cell *e_ = &t[(c << u) >> sh];                        \
            memcpy(op, &e_->syms, 4);                                       \
            op += e_->n;                                                    \
            u += e_->bits;                                                  \
        } while (0)
        for (size_t r = 0; r < R; r++) {
            L_RELOAD(ip0, u0, c0); L_RELOAD(ip1, u1, c1); L_RELOAD(ip2, u2, c2); L_RELOAD(ip3, u3, c3);
            L_STEP(c0, u0, op0); L_STEP(c1, u1, op1); L_STEP(c2, u2, op2); L_STEP(c3, u3, op3);
            L_STEP(c0, u0, op0); L_STEP(c1, u1, op1); L_STEP(c2, u2, op2); L_STEP(c3, u3, op3);
            L_STEP(c0, u0, op0); L_STEP(c1, u1, op1); L_STEP(c2, u2, op2); L_STEP(c3, u3, op3);
            L_STEP(c0, u0, op0); L_STEP(c1, u1, op1); L_STEP(c2, u2, op2); L_STEP(c3, u3, op3);
            L_STEP(c0, u0, op0); L_STEP(c1, u1, op1); L_STEP(c2, u2, op2); L_STEP(c3, u3, op3);
        }
#undef L_STEP
#undef L_RELOAD
        H[0].ip = ip0; H[1].ip = ip1; H[2].ip = ip2; H[3].ip = ip3;
        H[0].op = op0; H[1].op = op1; H[2].op = op2; H[3].op = op3;
        H[0].used = u0; H[1].used = u1; H[2].used = u2; H[3].used = u3;
        H[0].c = c0; H[1].c = c1; H[2].c = c2; H[3].c = c3;
    }
    for (int k = 0; k < 4; k++) {
        while (hs_can_round(&H[k])) {
            HS_RELOAD(H[k]);
            HS_STEP(H[k]); HS_STEP(H[k]); HS_STEP(H[k]); HS_STEP(H[k]); HS_STEP(H[k]);
        }
        if (hs_tail(&H[k], t, h->tlog)) return -1;
    }
    return 0;
}

/* The loop's variable shifts: with BMI2 (shlx/shrx, any AVX2-era x86)
 * they need neither the CL register nor flags; dispatched at run time. */
static int huf_decode4_generic(const ft_huf_table *h, const uint8_t *s, size_t n, uint8_t *dst, size_t regen)
{
    return huf_decode4_body(h, s, n, dst, regen);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("bmi2")))
static int huf_decode4_bmi2(const ft_huf_table *h, const uint8_t *s, size_t n, uint8_t *dst, size_t regen)
{
    return huf_decode4_body(h, s, n, dst, regen);
}

static int huf_decode4(const ft_huf_table *h, const uint8_t *s, size_t n, uint8_t *dst, size_t regen)
{
    static int bmi2 = -1;   /* benign race: every thread computes the same */
    if (bmi2 < 0) bmi2 = __builtin_cpu_supports("bmi2") ? 1 : 0;
    return bmi2 ? huf_decode4_bmi2(h, s, n, dst, regen) : huf_decode4_generic(h, s, n, dst, regen);
}
#else
#define huf_decode4 huf_decode4_generic
#endif

static int huf_decode1(const ft_huf_table *h, const uint8_t *s, size_t n, uint8_t *dst, size_t regen)
{
    hstream H;
    if (hs_init(&H, s, n, dst, dst + regen)) return -1;
    const huf_cell *t = h->t;
    const unsigned sh = 64 - h->tlog;
    while (hs_can_round(&H)) {
        HS_RELOAD(H);
        HS_STEP(H); HS_STEP(H); HS_STEP(H); HS_STEP(H); HS_STEP(H);
    }
    return hs_tail(&H, t, h->tlog);
}

/* ------------------------------------------------------- the frame */

/* A compressed block made of Huffman-coded literals and no sequences:
 * with its own tree description, or (treeless) the previous block's of
 * this frame (*have_table). */
static int lit_block(ft_huf_table *h, int *have_table, const uint8_t *b, size_t bs, uint8_t *dst, size_t room,
                     size_t bmax, size_t *regen_out)
{
    if (bs < 1) return -1;
    unsigned type = b[0] & 3, sf = (b[0] >> 2) & 3;
    if (type < 2 || (type == 3 && !*have_table)) return -1;   /* raw / RLE literals: libzstd */
    size_t lh, regen, csize;
    int four = sf != 0;
    switch (sf) {
    case 0: case 1:
        if (bs < 3) return -1;
        lh = 3;
        regen = (rd24(b) >> 4) & 0x3FF;
        csize = (rd24(b) >> 14) & 0x3FF;
        break;
    case 2:
        if (bs < 4) return -1;
        lh = 4;
        regen = (rd32(b) >> 4) & 0x3FFF;
        csize = rd32(b) >> 18;
        break;
    default:
        if (bs < 5) return -1;
        lh = 5;
        regen = (rd32(b) >> 4) & 0x3FFFF;
        csize = (rd32(b) >> 22) | (size_t)b[4] << 10;
        break;
    }
    /* literals, then the sequences section: one byte, 0 sequences, last */
    if (regen > bmax || regen > room || lh + csize + 1 != bs || b[lh + csize] != 0) return -1;
    const uint8_t *c = b + lh;
    size_t tw = 0;
    if (type == 2) {
        uint8_t w[256];
        unsigned nsym = 0, tlog = 0;
        if ((tw = huf_read_weights(c, csize, w, &nsym, &tlog)) == 0) return -1;
        if (h->nsym != nsym || h->tlog != tlog || memcmp(h->w, w, nsym)) {
            h->nsym = nsym;
            h->tlog = tlog;
            memcpy(h->w, w, nsym);
            huf_build(h);
        }
        *have_table = 1;
    }
    int r = four ? huf_decode4(h, c + tw, csize - tw, dst, regen) : huf_decode1(h, c + tw, csize - tw, dst, regen);
    if (r) return -1;
    *regen_out = regen;
    return 0;
}

ft_status ft_zstd_lit_decode(ft_worker_ws *ws, const void *src, size_t n, void *dst, size_t raw)
{
    const uint8_t *s = src;
    uint8_t *d = dst;
    if (n < 6 || rd32(s) != 0xFD2FB528u) return ZL_NO;
    unsigned fhd = s[4], fcs_flag = fhd >> 6, single = (fhd >> 5) & 1;
    if (fhd & 0x0F) return ZL_NO;   /* reserved bit, checksum, dictionary id */
    size_t pos = 5;
    uint64_t window = 0;
    if (!single) {
        unsigned wd = s[pos++], wlog = 10 + (wd >> 3);
        window = (1ull << wlog) + ((1ull << wlog) / 8) * (wd & 7);
        if (window > (1ull << 27)) return ZL_NO;   /* libzstd's default limit */
    }
    static const unsigned fcs_bytes[4] = {0, 2, 4, 8};
    size_t fb = fcs_flag == 0 && single ? 1 : fcs_bytes[fcs_flag];
    if (fb) {
        if (n < pos + fb) return ZL_NO;
        uint64_t fcs = fb == 1 ? s[pos] : fb == 2 ? rd16(s + pos) + 256u : fb == 4 ? rd32(s + pos) : rd64(s + pos);
        if (fcs != raw) return ZL_NO;
        if (single) window = fcs;
        pos += fb;
    }
    size_t bmax = window < ZL_BLOCK_MAX ? (size_t)window : ZL_BLOCK_MAX, out = 0;
    int have_table = 0;
    if (!ws->huf) {   /* the table is kept: consecutive planes often have the same weights */
        if (!(ws->huf = ft_malloc_aligned(sizeof *ws->huf, 64))) return FT_ERR_NOMEM;
        ws->huf->nsym = 0;
    }
    for (;;) {
        if (n - pos < 3) return ZL_NO;
        uint32_t bh = rd24(s + pos);
        unsigned last = bh & 1, type = (bh >> 1) & 3;
        size_t bs = bh >> 3;
        pos += 3;
        if (bs > bmax) return ZL_NO;
        if (type == 0) {   /* raw */
            if (bs > n - pos || bs > raw - out) return ZL_NO;
            memcpy(d + out, s + pos, bs);
            out += bs;
            pos += bs;
        } else if (type == 1) {   /* RLE: one byte, bs times */
            if (n - pos < 1 || bs > raw - out) return ZL_NO;
            memset(d + out, s[pos], bs);
            out += bs;
            pos += 1;
        } else if (type == 2) {
            size_t got = 0;
            if (bs > n - pos || lit_block(ws->huf, &have_table, s + pos, bs, d + out, raw - out, bmax, &got)) return ZL_NO;
            out += got;
            pos += bs;
        } else {
            return ZL_NO;
        }
        if (last) break;
    }
    return pos == n && out == raw ? FT_OK : ZL_NO;
}
