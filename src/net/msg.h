/* The memory node's wire protocol, version 2 (docs/protocol.md).
 *
 * Every message is a fixed 64-byte little-endian header, then key_len key
 * bytes, then data_len payload bytes. On the TCP connection (the node's
 * only listening socket, where every session starts and authenticates)
 * messages follow each other on the byte stream; on the optional UCX data
 * path (shared memory, RDMA) header + key travel as the UCP active
 * message's header and the payload as its data. Every field is
 * bounds-checked by ft_msg_parse; the per-opcode rules below are part of
 * the parser, so a handler never sees a message outside them. */
#ifndef FT_NET_MSG_H
#define FT_NET_MSG_H
#include "flextier/core.h"
#include "flextier/store.h"

#define FT_MSG_MAGIC    0x474d5446u   /* "FTMG" */
#define FT_MSG_VERSION  2u
#define FT_MSG_HDR_SIZE 64u
#define FT_MSG_MAX_HDR  (FT_MSG_HDR_SIZE + FT_KEY_MAX)

#define FT_MSG_NONCE        32u             /* HELLO payloads            */
#define FT_MSG_PROOF        32u             /* HMAC-SHA256 (AUTH)        */
#define FT_MSG_MAX_ADDR     16384u          /* UCX worker address (UCXB) */
#define FT_MSG_MAX_DETAIL   200u            /* error reply text          */
#define FT_MSG_MAX_RANGE    (64ull << 20)   /* GETR length               */
#define FT_MSG_RANGE_SIZE   24u             /* GETR payload              */
#define FT_MSG_REF_SIZE     16u             /* PUTDV payload: addr, len  */
#define FT_MSG_GETRV_SIZE   40u             /* GETRV payload             */

/* UCP AM ids of the UCX data path */
#define FT_AM_REQUEST 17u
#define FT_AM_REPLY   18u

enum ft_msg_op {
    FT_OP_HELLO = 1,   /* payload: client nonce             -> server nonce, arg = node flags   */
    FT_OP_PUT   = 2,   /* key, payload: a whole frame                                           */
    FT_OP_GET   = 3,   /* key                               -> the frame                        */
    FT_OP_DEL   = 4,   /* key                                                                    */
    FT_OP_LIST  = 5,   /*                                   -> key list                          */
    FT_OP_STAT  = 6,   /* key (-> frame header) or none (-> server stats)                       */
    FT_OP_GETR  = 7,   /* key, payload: range               -> frame bytes, aux = version        */
    FT_OP_AUTH  = 8,   /* payload: client proof (or none)   -> node proof [+ UCX address],
                                                               aux = session, arg = node flags  */
    FT_OP_UCXB  = 9,   /* payload: client UCX worker address: open the UCX data path            */
    FT_OP_PUTB  = 10,  /* key, xid, arg = bytes to reserve, aux = frame header size             */
    FT_OP_PUTD  = 11,  /* xid, arg = frame offset, payload: frame bytes                         */
    FT_OP_PUTC  = 12,  /* key, xid, arg = frame size, payload: the frame header -> commit       */
    FT_OP_PING  = 13,  /* nothing                                                               */
    FT_OP_CMAB  = 14,  /* arg = FT_CMAB_OFFER -> the offer (nonce, Unix socket name: cma.h);
                          arg = FT_CMAB_CLAIM: the nonce was presented there, open the
                          shared-memory data path (same host, same user, kernel's word)         */
    FT_OP_PUTDV = 15,  /* xid, arg = frame offset, payload: u64 addr, u64 len in the client's
                          memory: the node reads the bytes itself                               */
    FT_OP_GETRV = 16,  /* key, payload: range (24 bytes) + u64 addr, u64 cap in the client's
                          memory: the node writes the bytes there -> arg = bytes, aux = version */
    FT_OP_MAX   = 16
};
#define FT_OP_REPLY 0x8000u   /* reply opcode = request opcode | FT_OP_REPLY */

/* HELLO reply / AUTH reply flags (arg) */
#define FT_NODE_TOKEN   0x1u   /* the node authenticates with a token          */
#define FT_NODE_UCX     0x2u   /* AUTH reply: a UCX worker address follows      */
#define FT_NODE_UCX_TCP 0x4u   /* AUTH reply: the operator named the network
                                  trusted, UCX may run over TCP                 */
#define FT_NODE_LOCAL   0x8u   /* AUTH reply: the client is on the node's host;
                                  arg bits 32..63 = the node's pid (CMAB)       */
/* CMAB request steps (arg) */
#define FT_CMAB_OFFER   1u
#define FT_CMAB_CLAIM   2u
/* AUTH request flags (arg) */
#define FT_CLIENT_UCX   0x1u   /* send the node's UCX address if it has one    */

/* Host-order view of a header. */
typedef struct ft_msg {
    uint16_t version, opcode;
    uint64_t req_id;
    int32_t  status;      /* replies: ft_status; requests: 0 */
    uint32_t key_len;
    uint64_t data_len;
    uint64_t aux, arg;
    uint64_t xid;         /* PUTB/PUTD/PUTC: the client's transfer id (!= 0) */
    uint64_t session;     /* UCX data path: the session the node handed out  */
    const char *key;      /* points into the parsed buffer (not terminated)  */
} ft_msg;

/* Encode m's header + key (m->key_len bytes at m->key) into buf (>=
 * FT_MSG_HDR_SIZE + key_len); returns the header length. m->version is
 * ignored (FT_MSG_VERSION is written). */
FT_API size_t ft_msg_encode(void *buf, const ft_msg *m);

/* The header length a stream must deliver, from its first
 * FT_MSG_HDR_SIZE bytes: checks magic, version and key_len only.
 * FT_ERR_PROTOCOL / FT_ERR_UNSUPPORTED (another version). */
ft_status ft_msg_header_len(const void *hdr, size_t *hlen);

/* Parse a header of hdr_len bytes. reply: expect a reply opcode. Checks
 * magic, version (FT_ERR_UNSUPPORTED if another), opcode and its
 * direction, the reply status range, that hdr_len == 64 + key_len, key
 * length and bytes, and every per-opcode rule (key present or absent,
 * payload sizes, data_len <= max_data for frame payloads, xid).
 * FT_ERR_PROTOCOL on any violation. The payload itself (data_len bytes)
 * is not looked at: a datagram transport checks that data_len bytes came. */
FT_API ft_status ft_msg_parse(const void *hdr, size_t hdr_len, int reply, uint64_t max_data,
                       ft_msg *out);

/* GETR request payload: u64 version (0 = whichever is current), u64
 * offset, u64 length (1..FT_MSG_MAX_RANGE). The reply carries frame bytes
 * [offset, offset + min(length, size - offset)) and aux = the version
 * served; another version than the current one fails with FT_ERR_BUSY. */

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
