/* Fuzz the memory node's wire parsers (src/net/msg.c): the request/reply
 * header parser, the stream header-length probe, the stats parser and the
 * key-list parser.
 * Input: byte 0 selects the parser (mod 4); for the header parsers bytes
 * 1..8 are the payload length a datagram transport says arrived (checked
 * against the header like the node's UCX path does) and the rest is the
 * header; for the others the rest is the payload. */
#include "net/msg.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    unsigned mode = data[0] % 4;
    if (mode <= 1) {
        if (size < 9) return 0;
        uint64_t dlen = ft_get_le64(data + 1);
        const uint8_t *hdr = data + 9;
        size_t hlen = size - 9;
        size_t want = 0;
        ft_status hs = hlen >= FT_MSG_HDR_SIZE ? ft_msg_header_len(hdr, &want) : FT_ERR_PROTOCOL;
        ft_msg m;
        if (ft_msg_parse(hdr, hlen, (int)mode, 1ull << 40, &m) != FT_OK) return 0;
        /* what was accepted is consistent and re-encodes to the same bytes */
        if (hs != FT_OK || want != hlen) abort();
        if (m.key_len > FT_KEY_MAX || hlen != FT_MSG_HDR_SIZE + m.key_len) abort();
        if (m.data_len > (1ull << 40)) abort();
        (void)dlen;
        for (uint32_t i = 0; i < m.key_len; i++)
            if ((unsigned char)m.key[i] < 0x21 || (unsigned char)m.key[i] > 0x7e) abort();
        if (!mode) {
            /* per-opcode payload rules hold */
            if (m.opcode == FT_OP_HELLO && m.data_len != FT_MSG_NONCE) abort();
            if (m.opcode == FT_OP_AUTH && m.data_len != 0 && m.data_len != FT_MSG_PROOF) abort();
            if (m.opcode == FT_OP_GETR && m.data_len != FT_MSG_RANGE_SIZE) abort();
            if (m.opcode == FT_OP_UCXB && (m.data_len == 0 || m.data_len > FT_MSG_MAX_ADDR)) abort();
            if (m.opcode == FT_OP_PUTD && (m.data_len == 0 || m.arg + m.data_len > (1ull << 40))) abort();
            if ((m.opcode == FT_OP_PUTB || m.opcode == FT_OP_PUTD || m.opcode == FT_OP_PUTC ||
                 m.opcode == FT_OP_PUTDV) != (m.xid != 0))
                abort();
        }
        uint8_t again[FT_MSG_MAX_HDR];
        size_t n = ft_msg_encode(again, &m);
        if (n != hlen || memcmp(again, hdr, n)) abort();
    } else if (mode == 2) {
        ft_store_stats st;
        if (ft_msg_stats_parse(data + 1, size - 1, &st) == FT_OK) {
            uint8_t again[FT_MSG_STATS_SIZE];
            ft_msg_stats_encode(&st, again);
            if (memcmp(again, data + 1, sizeof again)) abort();
        }
    } else {
        char **keys = NULL;
        size_t n = 0;
        if (ft_msg_list_parse(data + 1, size - 1, &keys, &n) == FT_OK) {
            for (size_t i = 0; i < n; i++)
                if (ft_key_validate(keys[i]) != FT_OK) abort();
            ft_list_free(keys, n);
        }
    }
    return 0;
}
