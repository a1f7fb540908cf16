/* Wire header encode/parse (untrusted input: fuzzed by fuzz/fuzz_msg.c
 * and, for the handshake, fuzz/fuzz_hello.c). */
#include "msg.h"
#include "core/keylist.h"

#include <stdlib.h>
#include <string.h>

/* Header layout (offsets):
 *  0 u32 magic  4 u16 version  6 u16 opcode  8 u64 req_id  16 i32 status
 * 20 u32 key_len  24 u64 data_len  32 u64 aux  40 u64 arg  48 u64 xid
 * 56 u64 session */
_Static_assert(FT_MSG_HDR_SIZE == 64, "wire header is 64 bytes");
_Static_assert(FT_MSG_STATS_SIZE == sizeof(ft_store_stats), "stats are 12 u64");

size_t ft_msg_encode(void *buf, const ft_msg *m)
{
    uint8_t *p = buf;
    ft_put_le32(p + 0, FT_MSG_MAGIC);
    ft_put_le16(p + 4, FT_MSG_VERSION);
    ft_put_le16(p + 6, m->opcode);
    ft_put_le64(p + 8, m->req_id);
    ft_put_le32(p + 16, (uint32_t)m->status);
    ft_put_le32(p + 20, m->key_len);
    ft_put_le64(p + 24, m->data_len);
    ft_put_le64(p + 32, m->aux);
    ft_put_le64(p + 40, m->arg);
    ft_put_le64(p + 48, m->xid);
    ft_put_le64(p + 56, m->session);
    if (m->key_len) memcpy(p + FT_MSG_HDR_SIZE, m->key, m->key_len);
    return FT_MSG_HDR_SIZE + m->key_len;
}

static ft_status check_prefix(const uint8_t *p)
{
    if (ft_get_le32(p) != FT_MSG_MAGIC)
        return ft_set_error(FT_ERR_PROTOCOL, "bad message magic 0x%08x", ft_get_le32(p));
    uint16_t v = ft_get_le16(p + 4);
    if (v != FT_MSG_VERSION)
        return ft_set_error(FT_ERR_UNSUPPORTED, "protocol version %u (this side speaks %u)", v,
                            FT_MSG_VERSION);
    return FT_OK;
}

ft_status ft_msg_header_len(const void *hdr, size_t *hlen)
{
    const uint8_t *p = hdr;
    ft_status st = check_prefix(p);
    if (st != FT_OK) return st;
    uint32_t kl = ft_get_le32(p + 20);
    if (kl > FT_KEY_MAX) return ft_set_error(FT_ERR_PROTOCOL, "key length %u above %u", kl, FT_KEY_MAX);
    *hlen = FT_MSG_HDR_SIZE + kl;
    return FT_OK;
}

/* Per-opcode request rules. */
static ft_status check_request(const ft_msg *m, uint64_t max_data)
{
    const uint16_t op = m->opcode;
    const int has_key = m->key_len != 0;
    const int xfer = op == FT_OP_PUTB || op == FT_OP_PUTD || op == FT_OP_PUTC || op == FT_OP_PUTDV;
    int key_rule;   /* 1 required, 0 forbidden, -1 optional */
    switch (op) {
    case FT_OP_PUT: case FT_OP_GET: case FT_OP_DEL: case FT_OP_GETR: case FT_OP_PUTB:
    case FT_OP_PUTC: case FT_OP_GETRV:
        key_rule = 1;
        break;
    case FT_OP_STAT: key_rule = -1; break;
    default: key_rule = 0; break;
    }
    if (key_rule == 1 && !has_key) return ft_set_error(FT_ERR_PROTOCOL, "missing key");
    if (key_rule == 0 && has_key) return ft_set_error(FT_ERR_PROTOCOL, "unexpected key");
    if (xfer != (m->xid != 0))
        return ft_set_error(FT_ERR_PROTOCOL, xfer ? "missing transfer id" : "unexpected transfer id");
    const uint64_t n = m->data_len;
    switch (op) {
    case FT_OP_HELLO:
        if (n != FT_MSG_NONCE) return ft_set_error(FT_ERR_PROTOCOL, "HELLO needs a %u-byte nonce", FT_MSG_NONCE);
        break;
    case FT_OP_AUTH:
        if (n != 0 && n != FT_MSG_PROOF)
            return ft_set_error(FT_ERR_PROTOCOL, "AUTH proof of %llu bytes", (unsigned long long)n);
        break;
    case FT_OP_UCXB:
        if (n == 0 || n > FT_MSG_MAX_ADDR)
            return ft_set_error(FT_ERR_PROTOCOL, "UCX address of %llu bytes", (unsigned long long)n);
        break;
    case FT_OP_GETR:
        if (n != FT_MSG_RANGE_SIZE) return ft_set_error(FT_ERR_PROTOCOL, "GETR needs a %u-byte range", FT_MSG_RANGE_SIZE);
        break;
    case FT_OP_GETRV:
        if (n != FT_MSG_GETRV_SIZE) return ft_set_error(FT_ERR_PROTOCOL, "GETRV needs %u bytes", FT_MSG_GETRV_SIZE);
        break;
    case FT_OP_CMAB:
        if (n != 0 || (m->arg != FT_CMAB_OFFER && m->arg != FT_CMAB_CLAIM))
            return ft_set_error(FT_ERR_PROTOCOL, "CMAB of %llu bytes, step %llu",
                                (unsigned long long)n, (unsigned long long)m->arg);
        break;
    case FT_OP_PUTDV:
        if (n != FT_MSG_REF_SIZE)
            return ft_set_error(FT_ERR_PROTOCOL, "PUTDV of %llu bytes at %llu", (unsigned long long)n,
                                (unsigned long long)m->arg);
        break;
    case FT_OP_PUT:
        if (n < FT_FRAME_FIXED_HEADER) return ft_set_error(FT_ERR_PROTOCOL, "PUT payload too small for a frame");
        if (n > max_data)
            return ft_set_error(FT_ERR_NO_SPACE, "frame of %llu bytes above the node's capacity",
                                (unsigned long long)n);
        break;
    case FT_OP_PUTB:
        if (n) return ft_set_error(FT_ERR_PROTOCOL, "unexpected payload");
        if (m->arg < FT_FRAME_FIXED_HEADER || m->aux < FT_FRAME_FIXED_HEADER || m->aux > m->arg)
            return ft_set_error(FT_ERR_PROTOCOL, "PUTB sizes %llu / %llu", (unsigned long long)m->arg,
                                (unsigned long long)m->aux);
        if (m->arg > max_data)
            return ft_set_error(FT_ERR_NO_SPACE, "frame of up to %llu bytes above the node's capacity",
                                (unsigned long long)m->arg);
        break;
    case FT_OP_PUTD:
        if (n == 0) return ft_set_error(FT_ERR_PROTOCOL, "empty PUTD");
        if (n > max_data || m->arg > max_data - n)   /* well formed, only too large */
            return ft_set_error(FT_ERR_NO_SPACE, "PUTD of %llu bytes at %llu beyond the node's "
                                "capacity", (unsigned long long)n, (unsigned long long)m->arg);
        break;
    case FT_OP_PUTC:
        if (n < FT_FRAME_FIXED_HEADER || m->arg < n)
            return ft_set_error(FT_ERR_PROTOCOL, "PUTC header of %llu bytes, frame %llu",
                                (unsigned long long)n, (unsigned long long)m->arg);
        if (m->arg > max_data)
            return ft_set_error(FT_ERR_NO_SPACE, "frame of %llu bytes above the node's capacity",
                                (unsigned long long)m->arg);
        break;
    default:
        if (n) return ft_set_error(FT_ERR_PROTOCOL, "unexpected payload");
        break;
    }
    return FT_OK;
}

ft_status ft_msg_parse(const void *hdr, size_t hdr_len, int reply, uint64_t max_data, ft_msg *out)
{
    const uint8_t *p = hdr;
    if (!hdr || hdr_len < FT_MSG_HDR_SIZE)
        return ft_set_error(FT_ERR_PROTOCOL, "message header of %zu bytes (< %u)", hdr_len,
                            FT_MSG_HDR_SIZE);
    ft_status st = check_prefix(p);
    if (st != FT_OK) return st;
    ft_msg m;
    memset(&m, 0, sizeof m);
    m.version = ft_get_le16(p + 4);
    m.opcode = ft_get_le16(p + 6);
    m.req_id = ft_get_le64(p + 8);
    m.status = (int32_t)ft_get_le32(p + 16);
    m.key_len = ft_get_le32(p + 20);
    m.data_len = ft_get_le64(p + 24);
    m.aux = ft_get_le64(p + 32);
    m.arg = ft_get_le64(p + 40);
    m.xid = ft_get_le64(p + 48);
    m.session = ft_get_le64(p + 56);
    uint16_t op = m.opcode;
    if (reply) {
        if (!(op & FT_OP_REPLY)) return ft_set_error(FT_ERR_PROTOCOL, "expected a reply opcode");
        op &= (uint16_t)~FT_OP_REPLY;
        if (m.status > 0 || m.status < FT_ERR_INTERNAL)
            return ft_set_error(FT_ERR_PROTOCOL, "reply status %d out of range", m.status);
    } else if (m.status != 0) {
        return ft_set_error(FT_ERR_PROTOCOL, "request with a status");
    }
    if (op < FT_OP_HELLO || op > FT_OP_MAX)
        return ft_set_error(FT_ERR_PROTOCOL, "unknown opcode %u", m.opcode);
    if (m.key_len > FT_KEY_MAX || (uint64_t)hdr_len != FT_MSG_HDR_SIZE + (uint64_t)m.key_len)
        return ft_set_error(FT_ERR_PROTOCOL, "key length %u does not match header of %zu bytes",
                            m.key_len, hdr_len);
    m.key = (const char *)p + FT_MSG_HDR_SIZE;
    for (uint32_t i = 0; i < m.key_len; i++) {
        unsigned char c = (unsigned char)m.key[i];
        if (c < 0x21 || c > 0x7e) return ft_set_error(FT_ERR_PROTOCOL, "key byte %u invalid", i);
    }
    if (reply) {
        if (m.key_len) return ft_set_error(FT_ERR_PROTOCOL, "reply with a key");
        if (m.data_len > max_data)
            return ft_set_error(FT_ERR_PROTOCOL, "reply of %llu bytes above limit %llu",
                                (unsigned long long)m.data_len, (unsigned long long)max_data);
    } else if ((st = check_request(&m, max_data)) != FT_OK) {
        return st;
    }
    *out = m;
    return FT_OK;
}

void ft_msg_stats_encode(const ft_store_stats *s, uint8_t *out)
{
    const uint64_t v[12] = {s->capacity, s->used, s->tensors, s->connections,
                            s->total_connections, s->bytes_in, s->bytes_out,
                            s->spill_capacity, s->spill_used, s->spilled_tensors,
                            s->puts, s->gets};
    for (int i = 0; i < 12; i++) ft_put_le64(out + 8 * i, v[i]);
}

ft_status ft_msg_stats_parse(const void *buf, size_t len, ft_store_stats *out)
{
    if (len != FT_MSG_STATS_SIZE)
        return ft_set_error(FT_ERR_PROTOCOL, "stats of %zu bytes", len);
    const uint8_t *p = buf;
    uint64_t v[12];
    for (int i = 0; i < 12; i++) v[i] = ft_get_le64(p + 8 * i);
    ft_store_stats s = {v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9], v[10], v[11]};
    *out = s;
    return FT_OK;
}

ft_status ft_msg_list_parse(const void *buf, size_t len, char ***keys, size_t *n)
{
    const uint8_t *p = buf;
    if (len < 4) return ft_set_error(FT_ERR_PROTOCOL, "list of %zu bytes", len);
    uint32_t count = ft_get_le32(p);
    if (count > (len - 4) / 3)
        return ft_set_error(FT_ERR_PROTOCOL, "list count %u does not fit %zu bytes", count, len);
    size_t off = 4;
    ft_keylist l = {0};
    for (uint32_t i = 0; i < count; i++) {
        if (len - off < 2) goto bad;
        uint16_t kl = ft_get_le16(p + off);
        off += 2;
        if (kl == 0 || kl > FT_KEY_MAX || len - off < kl) goto bad;
        for (uint16_t j = 0; j < kl; j++)
            if (p[off + j] < 0x21 || p[off + j] > 0x7e) goto bad;
        if (ft_keylist_add(&l, (const char *)p + off, kl) != FT_OK) {
            ft_keylist_free(&l);
            return FT_ERR_NOMEM;
        }
        off += kl;
    }
    if (off != len) goto bad;
    *keys = l.v;
    *n = l.n;
    return FT_OK;
bad:
    ft_keylist_free(&l);
    return ft_set_error(FT_ERR_PROTOCOL, "malformed key list");
}
