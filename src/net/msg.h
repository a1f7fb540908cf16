/* The memory node's wire protocol (docs/protocol.md): a fixed 48-byte
 * little-endian header, followed in the same UCP active-message header by
 * key_len key bytes; the AM payload carries data_len bytes (a frame, a
 * token, a list, stats). Every field is bounds-checked by ft_msg_parse. */
#ifndef FT_NET_MSG_H
#define FT_NET_MSG_H
#include "flextier/core.h"
#include "flextier/store.h"

#define FT_MSG_MAGIC    0x474d5446u   /* "FTMG" */
#define FT_MSG_VERSION  1u
#define FT_MSG_HDR_SIZE 48u
#define FT_MSG_MAX_HDR  (FT_MSG_HDR_SIZE + FT_KEY_MAX)
#define FT_MSG_MAX_TOKEN 4096u

/* UCP AM ids */
#define FT_AM_REQUEST 17u
#define FT_AM_REPLY   18u

enum ft_msg_op {
    FT_OP_HELLO = 1,   /* data: token (0..4096 bytes)          aux: 0        */
    FT_OP_PUT   = 2,   /* key, data: frame                     aux: xxh3 of frame */
    FT_OP_GET   = 3,   /* key                                                */
    FT_OP_DEL   = 4,   /* key                                                */
    FT_OP_LIST  = 5,   /* -                                                  */
    FT_OP_STAT  = 6,   /* key (tensor header) or none (server stats)          */
    FT_OP_GETR  = 7,   /* key, data: 24-byte range request (ft_msg_range)    */
    FT_OP_MAX   = 7
};
#define FT_OP_REPLY 0x8000u   /* reply opcode = request opcode | FT_OP_REPLY */

/* Host-order view of a header. */
typedef struct ft_msg {
    uint16_t version, opcode;
    uint64_t req_id;
    int32_t  status;      /* replies: ft_status; requests: 0 */
    uint32_t key_len;
    uint64_t data_len;
    uint64_t aux;
    uint32_t flags;
    const char *key;      /* points into the parsed buffer (not terminated) */
} ft_msg;

/* Encode header + key into buf (>= FT_MSG_HDR_SIZE + key_len); returns
 * the header length. */
size_t ft_msg_encode(void *buf, uint16_t opcode, uint64_t req_id, int32_t status,
                     const char *key, uint32_t key_len, uint64_t data_len,
                     uint64_t aux, uint32_t flags);

/* Parse an AM header of hdr_len bytes that came with a payload of
 * data_len bytes. reply: expect a reply opcode. Checks magic, version
 * (FT_ERR_UNSUPPORTED if another), opcode, reserved bits, key length and
 * validity, that data_len matches the header and is within max_data, and
 * per-opcode rules. FT_ERR_PROTOCOL on any violation. */
ft_status ft_msg_parse(const void *hdr, size_t hdr_len, size_t data_len,
                       int reply, uint64_t max_data, ft_msg *out);

/* GETR request payload: u64 version (0 = whichever is current), u64
 * offset, u64 length. The reply carries frame bytes [offset, offset +
 * min(length, size - offset)) and aux = the version served; a request for
 * another version than the current one fails with FT_ERR_BUSY. */
#define FT_MSG_RANGE_SIZE 24u
#define FT_MSG_MAX_RANGE  (64ull << 20)

/* Server stats: 12 little-endian u64 in ft_store_stats order. */
#define FT_MSG_STATS_SIZE (12u * 8u)
void ft_msg_stats_encode(const ft_store_stats *s, uint8_t *out);
ft_status ft_msg_stats_parse(const void *buf, size_t len, ft_store_stats *out);

/* Key list: u32 count, then count x (u16 len, bytes). */
ft_status ft_msg_list_parse(const void *buf, size_t len, char ***keys, size_t *n);

static inline void ft_put_le16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static inline void ft_put_le32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static inline void ft_put_le64(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static inline uint16_t ft_get_le16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline uint32_t ft_get_le32(const uint8_t *p) { uint32_t v = 0; for (int i = 3; i >= 0; i--) v = (v << 8) | p[i]; return v; }
static inline uint64_t ft_get_le64(const uint8_t *p) { uint64_t v = 0; for (int i = 7; i >= 0; i--) v = (v << 8) | p[i]; return v; }
#endif
