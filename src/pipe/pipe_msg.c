/* Pipeline ring messages: layout and the strict parser (pipe_msg.h). */
#include "pipe_msg.h"

#include <string.h>

static void put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static void put32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static void put64(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t get64(const uint8_t *p) { return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32; }

/* Header: 0 magic, 4 version u16, 6 type u16, 8 job u64, 16 seq u64,
 * 24 mb u32, 28 flags u32, 32 n_seq u32, 36 rows u32, 40 data_len u64,
 * 48..63 zero. */

size_t ft_pipe_msg_size(uint16_t type, uint32_t n_seq, uint32_t rows, uint32_t hidden, size_t text_len)
{
    size_t d = type == FT_PM_STEP ? (size_t)rows * 4
             : type == FT_PM_HIDDEN ? (size_t)rows * hidden * 4
             : type == FT_PM_ERROR ? text_len : 0;
    return FT_PIPE_HDR + (size_t)n_seq * 8 + d;
}

size_t ft_pipe_msg_begin(uint8_t *buf, uint16_t type, uint64_t job, uint64_t seq, uint32_t mb, uint32_t flags,
                         uint32_t n_seq, const int *slots, const size_t *ntok, uint32_t rows, size_t data_len)
{
    memset(buf, 0, FT_PIPE_HDR);
    put32(buf, FT_PIPE_MAGIC);
    put16(buf + 4, FT_PIPE_VERSION);
    put16(buf + 6, type);
    put64(buf + 8, job);
    put64(buf + 16, seq);
    put32(buf + 24, mb);
    put32(buf + 28, flags);
    put32(buf + 32, n_seq);
    put32(buf + 36, rows);
    put64(buf + 40, (uint64_t)data_len);
    uint8_t *t = buf + FT_PIPE_HDR;
    for (uint32_t i = 0; i < n_seq; i++) {
        put32(t + 8 * i, (uint32_t)slots[i]);
        put32(t + 8 * i + 4, (uint32_t)ntok[i]);
    }
    return FT_PIPE_HDR + (size_t)n_seq * 8;
}

size_t ft_pipe_msg_error(uint8_t *buf, size_t cap, uint64_t job, const char *text)
{
    size_t n = strlen(text);
    if (n > FT_PIPE_ERR_MAX) n = FT_PIPE_ERR_MAX;
    if (cap < FT_PIPE_HDR + n) n = cap > FT_PIPE_HDR ? cap - FT_PIPE_HDR : 0;
    size_t off = ft_pipe_msg_begin(buf, FT_PM_ERROR, job, 0, 0, 0, 0, NULL, NULL, 0, n);
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)text[i];
        buf[off + i] = ch >= 0x20 && ch < 0x7f ? ch : '?';
    }
    return off + n;
}

void ft_pipe_msg_seq(const ft_pipe_msg *m, uint32_t i, int *slot, size_t *ntok)
{
    *slot = (int)get32(m->seqs + 8 * (size_t)i);
    *ntok = get32(m->seqs + 8 * (size_t)i + 4);
}

#define BAD(...) ft_set_error(FT_ERR_PROTOCOL, "pipeline message: " __VA_ARGS__)

ft_status ft_pipe_msg_parse(const void *buf, size_t len, const ft_pipe_limits *lim, ft_pipe_msg *out)
{
    const uint8_t *b = buf;
    if (!b || !lim || !out) return ft_set_error(FT_ERR_INVALID_ARG, "pipeline message: NULL argument");
    if (len < FT_PIPE_HDR) return BAD("%zu bytes, shorter than the %u-byte header", len, FT_PIPE_HDR);
    if (get32(b) != FT_PIPE_MAGIC) return BAD("bad magic 0x%08x", get32(b));
    if (get16(b + 4) != FT_PIPE_VERSION) return BAD("version %u (this build speaks %u)", get16(b + 4), FT_PIPE_VERSION);
    for (int i = 48; i < 64; i++)
        if (b[i]) return BAD("reserved header byte %d is not zero", i);
    ft_pipe_msg m;
    memset(&m, 0, sizeof m);
    m.type = get16(b + 6);
    m.job = get64(b + 8);
    m.seq = get64(b + 16);
    m.mb = get32(b + 24);
    m.flags = get32(b + 28);
    m.n_seq = get32(b + 32);
    m.rows = get32(b + 36);
    uint64_t dlen = get64(b + 40);
    if (m.type < FT_PM_STEP || m.type > FT_PM_END) return BAD("type %u", m.type);
    if (m.flags & ~FT_PM_RESET) return BAD("flags 0x%x", m.flags);
    int data_msg = m.type == FT_PM_STEP || m.type == FT_PM_HIDDEN;
    if (!data_msg && (m.n_seq || m.rows || m.flags || m.mb))
        return BAD("an %s message carries sequences", m.type == FT_PM_END ? "end" : "error");
    if (data_msg && (m.n_seq < 1 || m.n_seq > lim->max_batch))
        return BAD("%u sequences (1..%u)", m.n_seq, lim->max_batch);
    if (data_msg && (m.rows < m.n_seq || m.rows > lim->max_rows))
        return BAD("%u rows for %u sequences (at most %u)", m.rows, m.n_seq, lim->max_rows);
    uint64_t want = m.type == FT_PM_STEP ? (uint64_t)m.rows * 4
                  : m.type == FT_PM_HIDDEN ? (uint64_t)m.rows * lim->hidden * 4
                  : m.type == FT_PM_ERROR ? dlen : 0;
    if (m.type == FT_PM_ERROR && dlen > FT_PIPE_ERR_MAX) return BAD("error text of %llu bytes", (unsigned long long)dlen);
    if (dlen != want) return BAD("%llu data bytes, expected %llu", (unsigned long long)dlen, (unsigned long long)want);
    uint64_t total = FT_PIPE_HDR + (uint64_t)m.n_seq * 8 + dlen;
    if (total != len) return BAD("%zu bytes, the header describes %llu", len, (unsigned long long)total);
    m.seqs = b + FT_PIPE_HDR;
    m.data = m.seqs + (size_t)m.n_seq * 8;
    m.data_len = (size_t)dlen;
    uint64_t rows = 0;
    uint8_t seen[65536 / 8];   /* slots are < max_batch <= 65536 (ft_ctx_create) */
    if (data_msg && lim->max_batch > 65536) return ft_set_error(FT_ERR_INVALID_ARG, "pipeline message: max_batch");
    memset(seen, 0, sizeof seen);
    for (uint32_t i = 0; i < m.n_seq; i++) {
        int slot;
        size_t nt;
        ft_pipe_msg_seq(&m, i, &slot, &nt);
        if (slot < 0 || (uint32_t)slot >= lim->max_batch) return BAD("sequence %u: slot %d (0..%u)", i, slot, lim->max_batch - 1);
        if (nt < 1) return BAD("sequence %u has no tokens", i);
        if (seen[slot >> 3] & (1u << (slot & 7))) return BAD("slot %d twice", slot);
        seen[slot >> 3] |= (uint8_t)(1u << (slot & 7));
        rows += nt;
    }
    if (data_msg && rows != m.rows) return BAD("the sequences have %llu tokens, the header says %u rows",
                                               (unsigned long long)rows, m.rows);
    if (m.type == FT_PM_STEP)
        for (uint32_t r = 0; r < m.rows; r++) {
            uint32_t t = get32(m.data + 4 * (size_t)r);
            if (t >= lim->vocab) return BAD("token id %u outside the vocabulary of %u", t, lim->vocab);
        }
    if (m.type == FT_PM_ERROR)
        for (size_t i = 0; i < m.data_len; i++)
            if (m.data[i] < 0x20 || m.data[i] > 0x7e) return BAD("error text byte %zu is not printable", i);
    *out = m;
    return FT_OK;
}
