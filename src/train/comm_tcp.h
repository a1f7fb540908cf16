/* Internal to src/train (and its fuzzer): the wire format of the
 * data-parallel ranks over TCP (comm_tcp.c; docs/training.md "Over TCP",
 * docs/protocol.md "Data-parallel ranks").
 *
 * After the front door's handshake (src/net/door.h), a connection between
 * two ranks carries frames:
 *
 *   u32 magic "FTDP", u16 type, u16 zero, u64 length, then length bytes
 *
 *   HELLO  32 bytes: u32 version (1), u32 rank, u32 size, u32 zero,
 *          u64 job, u64 max_msg; each side sends one, first
 *   DATA   a message of ft_train_comm's send (length <= max_msg)
 *   PING   empty: "alive" (sent when the connection was quiet)
 *   BYE    empty: the sender ends the run normally, sends nothing more
 *   ERR    <= 200 bytes of text: the sender failed (why), sends nothing more
 *
 * The receiving side is a state machine over bytes (ft_dp_rx), kept apart
 * from the sockets so that it can be fuzzed whole (fuzz/fuzz_dp_frame.c):
 * nothing a peer sends makes it allocate more than max_msg for one message
 * or hold more than max_queued bytes of messages not yet taken. */
#ifndef FT_TRAIN_COMM_TCP_H
#define FT_TRAIN_COMM_TCP_H
#include "flextier/core.h"

#define FT_DP_MAGIC     0x50445446u   /* "FTDP" */
#define FT_DP_VERSION   1u
#define FT_DP_HDR       16u
#define FT_DP_HELLO_LEN 32u
#define FT_DP_MAX_TEXT  200u

enum { FT_DP_HELLO = 1, FT_DP_DATA = 2, FT_DP_PING = 3, FT_DP_BYE = 4, FT_DP_ERR = 5 };

typedef struct ft_dp_hello {
    uint32_t version, rank, size;
    uint64_t job, max_msg;
} ft_dp_hello;

/* Header: FT_OK and *type, *len, or FT_ERR_PROTOCOL (bad magic, type,
 * reserved bits, or a length beyond what the type allows: HELLO exactly
 * 32, PING/BYE 0, ERR <= 200, DATA <= max_msg). */
ft_status ft_dp_hdr_parse(const uint8_t h[FT_DP_HDR], uint64_t max_msg, unsigned *type, uint64_t *len);
void ft_dp_hdr_encode(uint8_t h[FT_DP_HDR], unsigned type, uint64_t len);
/* HELLO's body (32 bytes): FT_ERR_PROTOCOL for another version, a rank
 * not below size, a size of 0 or over 4096, nonzero reserved bits. */
ft_status ft_dp_hello_parse(const uint8_t *b, size_t n, ft_dp_hello *out);
void ft_dp_hello_encode(uint8_t b[FT_DP_HELLO_LEN], const ft_dp_hello *h);

typedef struct ft_dp_msg {
    struct ft_dp_msg *next;
    size_t len;
    uint8_t data[];
} ft_dp_msg;

/* The receiving side of one connection after HELLO. */
typedef struct ft_dp_rx {
    uint64_t max_msg, max_queued;
    uint8_t  hdr[FT_DP_HDR];
    size_t   hhave;
    unsigned type;            /* the frame being read (0: a header) */
    uint64_t len, have;
    ft_dp_msg *cur;           /* DATA being filled */
    uint8_t  text[FT_DP_MAX_TEXT];
    ft_dp_msg *head, *tail;   /* complete DATA messages, in order */
    uint64_t queued;          /* their bytes */
    int      bye, err;        /* BYE / ERR received (the stream ends there) */
    char     why[FT_DP_MAX_TEXT + 1];   /* ERR's text, printable */
    uint64_t pings;
} ft_dp_rx;

void ft_dp_rx_init(ft_dp_rx *rx, uint64_t max_msg, uint64_t max_queued);
/* Feed n bytes of the stream. FT_ERR_PROTOCOL (a malformed frame, bytes
 * after BYE or ERR, more than max_queued untaken) or FT_ERR_NOMEM; the
 * stream is then dead (the caller closes it). */
ft_status ft_dp_rx_feed(ft_dp_rx *rx, const uint8_t *p, size_t n);
/* The oldest complete message (the caller frees it), or NULL. */
ft_dp_msg *ft_dp_rx_pop(ft_dp_rx *rx);
void ft_dp_rx_free(ft_dp_rx *rx);
#endif
