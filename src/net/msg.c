/* Wire header encode/parse (untrusted input: fuzzed by fuzz/fuzz_msg.c). */
#include "msg.h"
#include "store/store_internal.h"

#include <stdlib.h>
#include <string.h>

/* Header layout (offsets):
 *  0 u32 magic  4 u16 version  6 u16 opcode  8 u64 req_id  16 i32 status
 * 20 u32 key_len  24 u64 data_len  32 u64 aux  40 u32 flags  44 u32 reserved */
_Static_assert(FT_MSG_HDR_SIZE == 48, "wire header is 48 bytes");
_Static_assert(FT_MSG_STATS_SIZE == sizeof(ft_store_stats), "stats are 12 u64");

size_t ft_msg_encode(void *buf, uint16_t opcode, uint64_t req_id, int32_t status,
                     const char *key, uint32_t key_len, uint64_t data_len,
                     uint64_t aux, uint32_t flags)
{
    uint8_t *p = buf;
    ft_put_le32(p + 0, FT_MSG_MAGIC);
    ft_put_le16(p + 4, FT_MSG_VERSION);
    ft_put_le16(p + 6, opcode);
    ft_put_le64(p + 8, req_id);
    ft_put_le32(p + 16, (uint32_t)status);
    ft_put_le32(p + 20, key_len);
    ft_put_le64(p + 24, data_len);
    ft_put_le64(p + 32, aux);
    ft_put_le32(p + 40, flags);
    ft_put_le32(p + 44, 0);
    if (key_len) memcpy(p + FT_MSG_HDR_SIZE, key, key_len);
    return FT_MSG_HDR_SIZE + key_len;
}

ft_status ft_msg_parse(const void *hdr, size_t hdr_len, size_t data_len,
                       int reply, uint64_t max_data, ft_msg *out)
{
    const uint8_t *p = hdr;
    if (!hdr || hdr_len < FT_MSG_HDR_SIZE)
        return ft_set_error(FT_ERR_PROTOCOL, "message header of %zu bytes (< %u)",
                            hdr_len, FT_MSG_HDR_SIZE);
    if (ft_get_le32(p) != FT_MSG_MAGIC)
        return ft_set_error(FT_ERR_PROTOCOL, "bad message magic 0x%08x", ft_get_le32(p));
    ft_msg m;
    memset(&m, 0, sizeof m);
    m.version = ft_get_le16(p + 4);
    if (m.version != FT_MSG_VERSION)
        return ft_set_error(FT_ERR_UNSUPPORTED, "protocol version %u (this side speaks %u)",
                            m.version, FT_MSG_VERSION);
    m.opcode = ft_get_le16(p + 6);
    m.req_id = ft_get_le64(p + 8);
    m.status = (int32_t)ft_get_le32(p + 16);
    m.key_len = ft_get_le32(p + 20);
    m.data_len = ft_get_le64(p + 24);
    m.aux = ft_get_le64(p + 32);
    m.flags = ft_get_le32(p + 40);
    if (ft_get_le32(p + 44) != 0 || m.flags != 0)
        return ft_set_error(FT_ERR_PROTOCOL, "reserved header bits set");
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
    if (m.data_len != (uint64_t)data_len)
        return ft_set_error(FT_ERR_PROTOCOL, "data length %llu but %zu bytes arrived",
                            (unsigned long long)m.data_len, data_len);
    if (m.data_len > max_data)
        return ft_set_error(FT_ERR_PROTOCOL, "data length %llu above limit %llu",
                            (unsigned long long)m.data_len, (unsigned long long)max_data);
    m.key = (const char *)p + FT_MSG_HDR_SIZE;
    for (uint32_t i = 0; i < m.key_len; i++) {
        unsigned char c = (unsigned char)m.key[i];
        if (c < 0x21 || c > 0x7e) return ft_set_error(FT_ERR_PROTOCOL, "key byte %u invalid", i);
    }
    if (!reply) {
        int need_key = op == FT_OP_PUT || op == FT_OP_GET || op == FT_OP_DEL || op == FT_OP_GETR;
        int no_key = op == FT_OP_HELLO || op == FT_OP_LIST;
        if (need_key && m.key_len == 0) return ft_set_error(FT_ERR_PROTOCOL, "missing key");
        if (no_key && m.key_len != 0) return ft_set_error(FT_ERR_PROTOCOL, "unexpected key");
        if (op == FT_OP_HELLO && m.data_len > FT_MSG_MAX_TOKEN)
            return ft_set_error(FT_ERR_PROTOCOL, "token longer than %u", FT_MSG_MAX_TOKEN);
        if (op == FT_OP_GETR && m.data_len != FT_MSG_RANGE_SIZE)
            return ft_set_error(FT_ERR_PROTOCOL, "GETR needs a %u-byte range", FT_MSG_RANGE_SIZE);
        if (op != FT_OP_HELLO && op != FT_OP_PUT && op != FT_OP_GETR && m.data_len != 0)
            return ft_set_error(FT_ERR_PROTOCOL, "unexpected payload");
        if (op == FT_OP_PUT && m.data_len < FT_FRAME_FIXED_HEADER)
            return ft_set_error(FT_ERR_PROTOCOL, "PUT payload too small for a frame");
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
            ft_list_free(l.v, l.n);
            return FT_ERR_NOMEM;
        }
        off += kl;
    }
    if (off != len) goto bad;
    *keys = l.v;
    *n = l.n;
    return FT_OK;
bad:
    ft_list_free(l.v, l.n);
    return ft_set_error(FT_ERR_PROTOCOL, "malformed key list");
}
