/* The codec agent's wire protocol (docs/agent.md), between the agent://
 * store backend (src/store/agent_client.c) and `flextier agent`
 * (src/agent/agent.c). It lives in net, with the memory node's messages,
 * so that both ends depend on it and it on neither.
 *
 * A client connects to the agent's TCP port, which is the memory node's
 * front door (src/net/door.h: the node's HMAC challenge-response, HELLO
 * and AUTH in the node's header; the token never crosses the wire). Then
 * messages follow each other on that connection: a fixed 64-byte
 * little-endian header, key_len key bytes, data_len body bytes (node
 * name and UCX worker address, tensor descriptor with a packed UCX
 * remote key, a frame, a list, stats). Tensor bytes do not travel in
 * messages: the agent reads the client's tensor (WRITE) or writes the
 * decoded tensor into the client's buffer (READ) by cross-memory attach
 * (same machine) or UCP RMA (RDMA from a DPU; TCP only on a network the
 * operator named trusted). Every field is bounds-checked by
 * ft_amsg_header_len, ft_amsg_parse and the body parsers (fuzzed:
 * fuzz/fuzz_agent_msg.c, the agent's handshake by fuzz/fuzz_door.c). */
#ifndef FT_AGENT_MSG_H
#define FT_AGENT_MSG_H
#include "flextier/core.h"
#include "flextier/codec.h"
#include "flextier/store.h"
#include "msg.h"

#define FT_AMSG_MAGIC    0x47415446u   /* "FTAG" */
#define FT_AMSG_VERSION  2u            /* 1: over UCX sockaddr, token in clear */
#define FT_AMSG_HDR_SIZE 64u
#define FT_AMSG_MAX_HDR  (FT_AMSG_HDR_SIZE + FT_KEY_MAX)
#define FT_AMSG_MAX_NODE 255u
#define FT_AMSG_MAX_RKEY 4096u        /* packed UCX remote key */
#define FT_AMSG_ERR_MAX  200u         /* error detail text in a reply */
#define FT_AMSG_CHALLENGE 16u         /* HELLO reply body (random): the agent
                                         offers cross-memory attach      */
#define FT_AMSG_CMA_SIZE 16u          /* CMA request body: u64 step, u64 0 */

enum ft_amsg_op {
    FT_AOP_HELLO = 1,  /* body: hello (memory node, UCX worker address); the
                          reply body: the CMA challenge                     */
    FT_AOP_WRITE = 2,  /* key; body: tensor desc + codec params + rkey;
                          addr/len: the client's tensor bytes               */
    FT_AOP_READ  = 3,  /* key; body: output dtype + rkey; addr/len: the
                          client's buffer and its capacity. Reply body: the
                          decoded tensor's desc; a BUFFER_SMALL reply has
                          the bytes needed in aux                          */
    FT_AOP_DEL   = 4,  /* key                                               */
    FT_AOP_LIST  = 5,  /* reply body: key list (u32 n, n x (u16 len, key))  */
    FT_AOP_STAT  = 6,  /* key; reply body: tensor stat                      */
    FT_AOP_STATS = 7,  /* reply body: 12 x u64 node statistics              */
    FT_AOP_PUTF  = 8,  /* key; body: an encoded frame (no codec work)       */
    FT_AOP_GETF  = 9,  /* key; reply body: the stored frame                 */
    FT_AOP_CMA   = 10, /* body: u64 step, u64 0. Step 1: reply body = the
                          offer (nonce, Unix socket name: net/cma.h); step
                          2: the client presented the nonce there, the
                          kernel names its process, the agent reaches it
                          with process_vm_readv/writev (CMA)               */
    FT_AOP_MAX   = 10
};
#define FT_AOP_REPLY 0x8000u

/* Host-order view of a header. */
typedef struct ft_amsg {
    uint16_t opcode;
    uint64_t req_id;
    int32_t  status;      /* replies: ft_status; requests: 0 */
    uint32_t key_len;
    uint64_t data_len;    /* AM payload bytes */
    uint64_t addr;        /* WRITE/READ: client buffer address */
    uint64_t len;         /* WRITE: tensor bytes; READ: buffer capacity */
    uint64_t aux;         /* replies: WRITE stored bytes, READ bytes needed */
    const char *key;      /* into the parsed buffer (not terminated) */
} ft_amsg;

size_t ft_amsg_encode(void *buf, uint16_t opcode, uint64_t req_id, int32_t status,
                      const char *key, uint32_t key_len, uint64_t data_len, uint64_t addr,
                      uint64_t len, uint64_t aux);

/* The header length (64 + key_len) a stream must deliver, from its first
 * FT_AMSG_HDR_SIZE bytes: magic, version, key_len. FT_ERR_PROTOCOL /
 * FT_ERR_UNSUPPORTED. */
ft_status ft_amsg_header_len(const void *hdr, size_t *hlen);

/* Parse a header of hdr_len bytes that came with a payload of
 * data_len bytes. reply: expect a reply opcode. FT_ERR_PROTOCOL on any
 * violation (magic, reserved bits, opcode and direction, status range,
 * header length, key rules, per-opcode key/body presence, data_len over
 * max_data), FT_ERR_UNSUPPORTED for another version. */
ft_status ft_amsg_parse(const void *hdr, size_t hdr_len, size_t data_len, int reply,
                        uint64_t max_data, ft_amsg *out);

/* HELLO body (the first message after the front door's handshake): u16
 * node_len, node ("" = the agent's default memory node), u16 addr_len,
 * the client's UCP worker address (0 bytes: the client has no UCX; the
 * agent checks it with ft_net_ucx_addr_check and opens an RMA endpoint
 * to it). Pointers into buf. */
#define FT_AMSG_MAX_WADDR 4096u
typedef struct ft_amsg_hello {
    char node[FT_AMSG_MAX_NODE + 1];
    const uint8_t *waddr;
    size_t waddr_len;
} ft_amsg_hello;
#define FT_AMSG_MAX_HELLO (4u + FT_AMSG_MAX_NODE + FT_AMSG_MAX_WADDR)
size_t ft_amsg_hello_encode(uint8_t *buf, size_t cap, const char *node, const void *waddr,
                            size_t waddr_len);
ft_status ft_amsg_hello_parse(const void *buf, size_t len, ft_amsg_hello *out);

/* Tensor descriptor: u32 dtype, u32 ndim, FT_MAX_DIMS x i64 shape. */
#define FT_AMSG_DESC_SIZE (8u + 8u * FT_MAX_DIMS)
void ft_amsg_desc_encode(const ft_tensor *t, uint8_t *out);
/* Checks dtype, ndim and dims (ft_tensor_init rules, unused dims 0);
 * data is left NULL. */
ft_status ft_amsg_desc_parse(const uint8_t *in, ft_tensor *out);

/* WRITE body: desc, codec params (u32 codec, i32 level, u32 entropy,
 * u32 chunk_size, u32 group_size, i32 group_dim), u32 rkey_len, rkey. */
#define FT_AMSG_CP_SIZE 24u
size_t ft_amsg_write_encode(uint8_t *buf, size_t cap, const ft_tensor *t,
                            const ft_codec_params *cp, const void *rkey, size_t rkey_len);
/* The codec params are range-checked here; ft_encode_bound checks them
 * against the tensor. */
ft_status ft_amsg_write_parse(const void *buf, size_t len, ft_tensor *t, ft_codec_params *cp,
                              const uint8_t **rkey, size_t *rkey_len);

/* READ body: i32 output dtype (-1 = stored), u32 rkey_len, rkey. */
size_t ft_amsg_read_encode(uint8_t *buf, size_t cap, int out_dtype, const void *rkey,
                           size_t rkey_len);
ft_status ft_amsg_read_parse(const void *buf, size_t len, int *out_dtype, const uint8_t **rkey,
                             size_t *rkey_len);

/* STAT reply body: desc, u32 codec, u32 entropy, i32 level, u32 0,
 * u64 raw_bytes, u64 stored_bytes. */
#define FT_AMSG_STAT_SIZE (FT_AMSG_DESC_SIZE + 32u)
void ft_amsg_stat_encode(const ft_tensor_stat *s, uint8_t *out);
ft_status ft_amsg_stat_parse(const void *buf, size_t len, ft_tensor_stat *out);

/* STATS reply body: 12 x u64 in ft_store_stats order. */
#define FT_AMSG_STATS_SIZE FT_MSG_STATS_SIZE
void ft_amsg_stats_encode(const ft_store_stats *s, uint8_t *out);
ft_status ft_amsg_stats_parse(const void *buf, size_t len, ft_store_stats *out);

/* LIST reply body: u32 count, count x (u16 len, key bytes). *out is
 * allocated (free with free); ft_amsg_list_parse returns keys for
 * ft_list_free. */
ft_status ft_amsg_list_encode(char **keys, size_t n, uint8_t **out, size_t *len);
ft_status ft_amsg_list_parse(const void *buf, size_t len, char ***keys, size_t *n);
#endif
