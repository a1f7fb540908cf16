/* The agent's wire messages: encode and parse (untrusted input on both
 * sides; fuzzed by fuzz/fuzz_agent_msg.c). */
#include "agent_msg.h"
#include "msg.h"

#include <stdlib.h>
#include <string.h>

/* Header layout (offsets):
 *  0 u32 magic  4 u16 version  6 u16 opcode  8 u64 req_id  16 i32 status
 * 20 u32 key_len  24 u64 data_len  32 u64 addr  40 u64 len  48 u64 aux
 * 56 u64 reserved (0) */
_Static_assert(FT_AMSG_STATS_SIZE == sizeof(ft_store_stats), "stats are 12 u64");

static void put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static void put32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static void put64(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static uint32_t get32(const uint8_t *p) { uint32_t v = 0; for (int i = 3; i >= 0; i--) v = (v << 8) | p[i]; return v; }
static uint64_t get64(const uint8_t *p) { uint64_t v = 0; for (int i = 7; i >= 0; i--) v = (v << 8) | p[i]; return v; }

size_t ft_amsg_encode(void *buf, uint16_t opcode, uint64_t req_id, int32_t status,
                      const char *key, uint32_t key_len, uint64_t data_len, uint64_t addr,
                      uint64_t len, uint64_t aux)
{
    uint8_t *p = buf;
    put32(p + 0, FT_AMSG_MAGIC);
    put16(p + 4, FT_AMSG_VERSION);
    put16(p + 6, opcode);
    put64(p + 8, req_id);
    put32(p + 16, (uint32_t)status);
    put32(p + 20, key_len);
    put64(p + 24, data_len);
    put64(p + 32, addr);
    put64(p + 40, len);
    put64(p + 48, aux);
    put64(p + 56, 0);
    if (key_len) memcpy(p + FT_AMSG_HDR_SIZE, key, key_len);
    return FT_AMSG_HDR_SIZE + key_len;
}

ft_status ft_amsg_header_len(const void *hdr, size_t *hlen)
{
    const uint8_t *p = hdr;
    if (get32(p) != FT_AMSG_MAGIC)
        return ft_set_error(FT_ERR_PROTOCOL, "bad agent message magic 0x%08x", get32(p));
    if (get16(p + 4) != FT_AMSG_VERSION)
        return ft_set_error(FT_ERR_UNSUPPORTED, "agent protocol version %u (this side speaks %u)",
                            get16(p + 4), FT_AMSG_VERSION);
    uint32_t kl = get32(p + 20);
    if (kl > FT_KEY_MAX) return ft_set_error(FT_ERR_PROTOCOL, "key length %u", kl);
    *hlen = FT_AMSG_HDR_SIZE + kl;
    return FT_OK;
}

ft_status ft_amsg_parse(const void *hdr, size_t hdr_len, size_t data_len, int reply,
                        uint64_t max_data, ft_amsg *out)
{
    const uint8_t *p = hdr;
    if (!hdr || hdr_len < FT_AMSG_HDR_SIZE)
        return ft_set_error(FT_ERR_PROTOCOL, "agent message header of %zu bytes (< %u)", hdr_len,
                            FT_AMSG_HDR_SIZE);
    if (get32(p) != FT_AMSG_MAGIC)
        return ft_set_error(FT_ERR_PROTOCOL, "bad agent message magic 0x%08x", get32(p));
    unsigned version = get16(p + 4);
    if (version != FT_AMSG_VERSION)
        return ft_set_error(FT_ERR_UNSUPPORTED, "agent protocol version %u (this side speaks %u)",
                            version, FT_AMSG_VERSION);
    ft_amsg m;
    memset(&m, 0, sizeof m);
    m.opcode = get16(p + 6);
    m.req_id = get64(p + 8);
    m.status = (int32_t)get32(p + 16);
    m.key_len = get32(p + 20);
    m.data_len = get64(p + 24);
    m.addr = get64(p + 32);
    m.len = get64(p + 40);
    m.aux = get64(p + 48);
    if (get64(p + 56) != 0) return ft_set_error(FT_ERR_PROTOCOL, "reserved header bits set");
    uint16_t op = m.opcode;
    if (reply) {
        if (!(op & FT_AOP_REPLY)) return ft_set_error(FT_ERR_PROTOCOL, "expected a reply opcode");
        op &= (uint16_t)~FT_AOP_REPLY;
        if (m.status > 0 || m.status < FT_ERR_INTERNAL)
            return ft_set_error(FT_ERR_PROTOCOL, "reply status %d out of range", m.status);
        if (m.key_len) return ft_set_error(FT_ERR_PROTOCOL, "reply with a key");
    } else if (m.status != 0) {
        return ft_set_error(FT_ERR_PROTOCOL, "request with a status");
    }
    if (op < FT_AOP_HELLO || op > FT_AOP_MAX)
        return ft_set_error(FT_ERR_PROTOCOL, "unknown agent opcode %u", m.opcode);
    if (m.key_len > FT_KEY_MAX || (uint64_t)hdr_len != FT_AMSG_HDR_SIZE + (uint64_t)m.key_len)
        return ft_set_error(FT_ERR_PROTOCOL, "key length %u does not match a header of %zu bytes",
                            m.key_len, hdr_len);
    if (m.data_len != (uint64_t)data_len)
        return ft_set_error(FT_ERR_PROTOCOL, "data length %llu but %zu bytes arrived",
                            (unsigned long long)m.data_len, data_len);
    if (m.data_len > max_data)
        return ft_set_error(FT_ERR_PROTOCOL, "data length %llu above limit %llu",
                            (unsigned long long)m.data_len, (unsigned long long)max_data);
    m.key = (const char *)p + FT_AMSG_HDR_SIZE;
    for (uint32_t i = 0; i < m.key_len; i++) {
        unsigned char c = (unsigned char)m.key[i];
        if (c < 0x21 || c > 0x7e) return ft_set_error(FT_ERR_PROTOCOL, "key byte %u invalid", i);
    }
    if (!reply) {
        int no_key = op == FT_AOP_HELLO || op == FT_AOP_LIST || op == FT_AOP_STATS || op == FT_AOP_CMA;
        if (!no_key && m.key_len == 0) return ft_set_error(FT_ERR_PROTOCOL, "missing key");
        if (no_key && m.key_len != 0) return ft_set_error(FT_ERR_PROTOCOL, "unexpected key");
        int body = op == FT_AOP_HELLO || op == FT_AOP_WRITE || op == FT_AOP_READ ||
                   op == FT_AOP_PUTF || op == FT_AOP_CMA;
        if (op == FT_AOP_CMA && m.data_len != FT_AMSG_CMA_SIZE)
            return ft_set_error(FT_ERR_PROTOCOL, "CMA body of %llu bytes", (unsigned long long)m.data_len);
        if (!body && m.data_len != 0) return ft_set_error(FT_ERR_PROTOCOL, "unexpected payload");
        if (op == FT_AOP_HELLO && m.data_len > FT_AMSG_MAX_HELLO)
            return ft_set_error(FT_ERR_PROTOCOL, "HELLO of %llu bytes", (unsigned long long)m.data_len);
        if ((op == FT_AOP_WRITE || op == FT_AOP_READ) &&
            m.data_len > FT_AMSG_DESC_SIZE + FT_AMSG_CP_SIZE + 4 + FT_AMSG_MAX_RKEY)
            return ft_set_error(FT_ERR_PROTOCOL, "request body of %llu bytes",
                                (unsigned long long)m.data_len);
        if (op == FT_AOP_PUTF && m.data_len < FT_FRAME_FIXED_HEADER)
            return ft_set_error(FT_ERR_PROTOCOL, "PUTF payload too small for a frame");
        if (op != FT_AOP_WRITE && op != FT_AOP_READ && (m.addr || m.len))
            return ft_set_error(FT_ERR_PROTOCOL, "buffer fields set on opcode %u", op);
    }
    *out = m;
    return FT_OK;
}

/* ------------------------------------------------------------------ hello */

size_t ft_amsg_hello_encode(uint8_t *buf, size_t cap, const char *node, const void *waddr,
                            size_t waddr_len)
{
    size_t nl = node ? strlen(node) : 0;
    if (nl > FT_AMSG_MAX_NODE || waddr_len > FT_AMSG_MAX_WADDR || cap < 4 + nl + waddr_len) return 0;
    uint8_t *p = buf;
    put16(p, (uint16_t)nl);
    if (nl) memcpy(p + 2, node, nl);
    p += 2 + nl;
    put16(p, (uint16_t)waddr_len);
    if (waddr_len) memcpy(p + 2, waddr, waddr_len);
    return 4 + nl + waddr_len;
}

ft_status ft_amsg_hello_parse(const void *buf, size_t len, ft_amsg_hello *out)
{
    const uint8_t *p = buf, *end = p + len;
    if (len < 4) return ft_set_error(FT_ERR_PROTOCOL, "HELLO of %zu bytes", len);
    size_t nl = get16(p);
    if (nl > FT_AMSG_MAX_NODE || (size_t)(end - p) < 4 + nl)
        return ft_set_error(FT_ERR_PROTOCOL, "HELLO node length %zu", nl);
    const uint8_t *node = p + 2;
    for (size_t i = 0; i < nl; i++)
        if (node[i] < 0x21 || node[i] > 0x7e)
            return ft_set_error(FT_ERR_PROTOCOL, "HELLO node byte %zu invalid", i);
    p += 2 + nl;
    size_t al = get16(p);
    if (al > FT_AMSG_MAX_WADDR || (size_t)(end - p) != 2 + al)
        return ft_set_error(FT_ERR_PROTOCOL, "HELLO worker address length %zu", al);
    memcpy(out->node, node, nl);
    out->node[nl] = 0;
    out->waddr = p + 2;
    out->waddr_len = al;
    return FT_OK;
}

/* ------------------------------------------------------ tensor descriptor */

void ft_amsg_desc_encode(const ft_tensor *t, uint8_t *out)
{
    put32(out, (uint32_t)t->dtype);
    put32(out + 4, t->ndim);
    for (unsigned i = 0; i < FT_MAX_DIMS; i++)
        put64(out + 8 + 8 * i, i < t->ndim ? (uint64_t)t->shape[i] : 0);
}

ft_status ft_amsg_desc_parse(const uint8_t *in, ft_tensor *out)
{
    uint32_t dt = get32(in), nd = get32(in + 4);
    if (dt >= FT_DTYPE_COUNT) return ft_set_error(FT_ERR_PROTOCOL, "tensor dtype %u", dt);
    if (nd > FT_MAX_DIMS) return ft_set_error(FT_ERR_PROTOCOL, "tensor of %u dims", nd);
    int64_t shape[FT_MAX_DIMS];
    for (unsigned i = 0; i < FT_MAX_DIMS; i++) {
        uint64_t v = get64(in + 8 + 8 * i);
        if (i >= nd && v != 0) return ft_set_error(FT_ERR_PROTOCOL, "unused dim %u set", i);
        if (v > (uint64_t)INT64_MAX) return ft_set_error(FT_ERR_PROTOCOL, "dim %u negative", i);
        shape[i] = (int64_t)v;
    }
    ft_tensor t;
    if (ft_tensor_init(&t, (ft_dtype)dt, nd, shape, NULL) != FT_OK)
        return ft_set_error(FT_ERR_PROTOCOL, "tensor shape: %s", ft_last_error());
    *out = t;
    return FT_OK;
}

/* ------------------------------------------------------------ WRITE / READ */

size_t ft_amsg_write_encode(uint8_t *buf, size_t cap, const ft_tensor *t,
                            const ft_codec_params *cp, const void *rkey, size_t rkey_len)
{
    size_t n = FT_AMSG_DESC_SIZE + FT_AMSG_CP_SIZE + 4 + rkey_len;
    if (rkey_len > FT_AMSG_MAX_RKEY || cap < n) return 0;
    ft_amsg_desc_encode(t, buf);
    uint8_t *c = buf + FT_AMSG_DESC_SIZE;
    put32(c, (uint32_t)cp->codec);
    put32(c + 4, (uint32_t)cp->level);
    put32(c + 8, (uint32_t)cp->entropy);
    put32(c + 12, cp->chunk_size);
    put32(c + 16, cp->group_size);
    put32(c + 20, (uint32_t)cp->group_dim);
    put32(c + FT_AMSG_CP_SIZE, (uint32_t)rkey_len);
    if (rkey_len) memcpy(c + FT_AMSG_CP_SIZE + 4, rkey, rkey_len);
    return n;
}

static ft_status rkey_tail(const uint8_t *p, size_t left, const uint8_t **rkey, size_t *rkey_len)
{
    if (left < 4) return ft_set_error(FT_ERR_PROTOCOL, "request body truncated");
    uint32_t rl = get32(p);
    if (rl > FT_AMSG_MAX_RKEY || rl != left - 4)
        return ft_set_error(FT_ERR_PROTOCOL, "remote key of %u bytes in %zu", rl, left - 4);
    *rkey = p + 4;
    *rkey_len = rl;
    return FT_OK;
}

ft_status ft_amsg_write_parse(const void *buf, size_t len, ft_tensor *t, ft_codec_params *cp,
                              const uint8_t **rkey, size_t *rkey_len)
{
    const uint8_t *p = buf;
    if (len < FT_AMSG_DESC_SIZE + FT_AMSG_CP_SIZE + 4)
        return ft_set_error(FT_ERR_PROTOCOL, "WRITE body of %zu bytes", len);
    ft_tensor d;
    ft_status st = ft_amsg_desc_parse(p, &d);
    if (st != FT_OK) return st;
    const uint8_t *c = p + FT_AMSG_DESC_SIZE;
    ft_codec_params q;
    ft_codec_default_params(&q);
    uint32_t codec = get32(c), entropy = get32(c + 8);
    if (codec >= FT_CODEC_COUNT || entropy >= FT_CODEC_COUNT)
        return ft_set_error(FT_ERR_PROTOCOL, "codec %u / entropy %u", codec, entropy);
    q.codec = (ft_codec_id)codec;
    q.level = (int32_t)get32(c + 4);
    q.entropy = (ft_codec_id)entropy;
    q.chunk_size = get32(c + 12);
    q.group_size = get32(c + 16);
    q.group_dim = (int32_t)get32(c + 20);
    st = rkey_tail(c + FT_AMSG_CP_SIZE, len - FT_AMSG_DESC_SIZE - FT_AMSG_CP_SIZE, rkey, rkey_len);
    if (st != FT_OK) return st;
    *t = d;
    *cp = q;
    return FT_OK;
}

size_t ft_amsg_read_encode(uint8_t *buf, size_t cap, int out_dtype, const void *rkey,
                           size_t rkey_len)
{
    size_t n = 8 + rkey_len;
    if (rkey_len > FT_AMSG_MAX_RKEY || cap < n) return 0;
    put32(buf, (uint32_t)out_dtype);
    put32(buf + 4, (uint32_t)rkey_len);
    if (rkey_len) memcpy(buf + 8, rkey, rkey_len);
    return n;
}

ft_status ft_amsg_read_parse(const void *buf, size_t len, int *out_dtype, const uint8_t **rkey,
                             size_t *rkey_len)
{
    const uint8_t *p = buf;
    if (len < 8) return ft_set_error(FT_ERR_PROTOCOL, "READ body of %zu bytes", len);
    int32_t od = (int32_t)get32(p);
    if (od < -1 || od >= FT_DTYPE_COUNT) return ft_set_error(FT_ERR_PROTOCOL, "output dtype %d", od);
    ft_status st = rkey_tail(p + 4, len - 4, rkey, rkey_len);
    if (st != FT_OK) return st;
    *out_dtype = od;
    return FT_OK;
}

/* ------------------------------------------------------------ stat, stats */

void ft_amsg_stat_encode(const ft_tensor_stat *s, uint8_t *out)
{
    ft_tensor t;
    memset(&t, 0, sizeof t);
    t.dtype = s->dtype;
    t.ndim = s->ndim;
    memcpy(t.shape, s->shape, sizeof t.shape);
    ft_amsg_desc_encode(&t, out);
    uint8_t *q = out + FT_AMSG_DESC_SIZE;
    put32(q, (uint32_t)s->codec);
    put32(q + 4, (uint32_t)s->entropy);
    put32(q + 8, (uint32_t)s->level);
    put32(q + 12, 0);
    put64(q + 16, s->raw_bytes);
    put64(q + 24, s->stored_bytes);
}

ft_status ft_amsg_stat_parse(const void *buf, size_t len, ft_tensor_stat *out)
{
    if (len != FT_AMSG_STAT_SIZE) return ft_set_error(FT_ERR_PROTOCOL, "stat of %zu bytes", len);
    const uint8_t *p = buf;
    ft_tensor t;
    ft_status st = ft_amsg_desc_parse(p, &t);
    if (st != FT_OK) return st;
    const uint8_t *q = p + FT_AMSG_DESC_SIZE;
    uint32_t codec = get32(q), entropy = get32(q + 4);
    if (codec >= FT_CODEC_COUNT || entropy >= FT_CODEC_COUNT || get32(q + 12) != 0)
        return ft_set_error(FT_ERR_PROTOCOL, "stat codec %u / entropy %u", codec, entropy);
    ft_tensor_stat s;
    memset(&s, 0, sizeof s);
    s.dtype = t.dtype;
    s.ndim = t.ndim;
    memcpy(s.shape, t.shape, sizeof s.shape);
    s.codec = (ft_codec_id)codec;
    s.entropy = (ft_codec_id)entropy;
    s.level = (int32_t)get32(q + 8);
    s.raw_bytes = get64(q + 16);
    s.stored_bytes = get64(q + 24);
    *out = s;
    return FT_OK;
}

/* STATS and LIST bodies are the node's (msg.c): one format, one parser. */
void ft_amsg_stats_encode(const ft_store_stats *s, uint8_t *out) { ft_msg_stats_encode(s, out); }

ft_status ft_amsg_stats_parse(const void *buf, size_t len, ft_store_stats *out)
{
    return ft_msg_stats_parse(buf, len, out);
}

/* ------------------------------------------------------------------ list */

ft_status ft_amsg_list_encode(char **keys, size_t n, uint8_t **out, size_t *len)
{
    if (n > UINT32_MAX) return ft_set_error(FT_ERR_NOMEM, "too many keys");
    size_t total = 4;
    for (size_t i = 0; i < n; i++) total += 2 + strlen(keys[i]);
    uint8_t *b = malloc(total);
    if (!b) return ft_set_error(FT_ERR_NOMEM, "key list of %zu bytes", total);
    put32(b, (uint32_t)n);
    size_t off = 4;
    for (size_t i = 0; i < n; i++) {
        size_t kl = strlen(keys[i]);
        put16(b + off, (uint16_t)kl);
        memcpy(b + off + 2, keys[i], kl);
        off += 2 + kl;
    }
    *out = b;
    *len = total;
    return FT_OK;
}

ft_status ft_amsg_list_parse(const void *buf, size_t len, char ***keys, size_t *n)
{
    return ft_msg_list_parse(buf, len, keys, n);
}
