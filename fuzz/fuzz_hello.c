/* Fuzz the memory node's path before authentication: a byte stream as an
 * unauthenticated peer would send it (or, mode 1, a node's answers as a
 * client receives them) cut into messages exactly as the node's TCP reader
 * does (64-byte header, key, payload of data_len bytes, capped), each
 * parsed with ft_msg_parse and fed to the handshake state machine
 * (src/net/auth.c).
 * Input: byte 0: bit 0 selects the side, bit 1 whether the node has a
 * token; the rest is the stream.
 * Invariants: no crash or out-of-bounds access; the node never reaches
 * "authenticated" unless the peer sent the valid proof for its nonces
 * (which the fuzzer can only produce by chance: we check that if it
 * happens the proof really matches); after any failure the state stays
 * failed; the client never accepts a node's proof that is not the HMAC
 * of its own nonces. */
#include "net/auth.h"

#include <stdlib.h>
#include <string.h>

static const uint8_t token[] = "fuzz-token-0123456789abcdef";

/* Next message of the stream: header + payload (<= 64 KiB) or 0 at end. */
static int next_msg(const uint8_t **p, size_t *n, int reply, ft_msg *m, const uint8_t **payload)
{
    size_t hl;
    if (*n < FT_MSG_HDR_SIZE || ft_msg_header_len(*p, &hl) != FT_OK || *n < hl) return 0;
    if (ft_msg_parse(*p, hl, reply, 1u << 16, m) != FT_OK) return 0;
    if (m->data_len > *n - hl) return 0;
    *payload = *p + hl;
    *p += hl + m->data_len;
    *n -= hl + (size_t)m->data_len;
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    const int client = data[0] & 1, with_token = (data[0] >> 1) & 1;
    const uint8_t *p = data + 1;
    size_t n = size - 1;
    ft_msg m;
    const uint8_t *payload;
    if (!client) {
        uint8_t ns[FT_MSG_NONCE];
        memset(ns, 0x5a, sizeof ns);
        ft_hs_server hs;
        ft_hs_server_init(&hs, with_token ? token : NULL, sizeof token - 1, ns);
        while (next_msg(&p, &n, 0, &m, &payload)) {
            ft_hs_state before = hs.state;
            uint8_t nc[FT_MSG_NONCE];
            memcpy(nc, hs.nc, sizeof nc);
            ft_hs_reply r;
            ft_status st = ft_hs_server_step(&hs, &m, payload, &r);
            if (st != r.status) abort();
            if (before == FT_HS_FAILED && hs.state != FT_HS_FAILED) abort();
            if (st != FT_OK && (hs.state != FT_HS_FAILED || !r.detail)) abort();
            if (r.len > sizeof r.payload) abort();
            if (hs.state == FT_HS_DONE && before != FT_HS_DONE) {
                if (m.opcode != FT_OP_AUTH || before != FT_HS_AUTH) abort();
                if (with_token) {
                    uint8_t want[FT_MSG_PROOF];
                    ft_auth_proof(token, sizeof token - 1, 0, nc, ns, want);
                    if (m.data_len != FT_MSG_PROOF || memcmp(want, payload, FT_MSG_PROOF)) abort();
                }
            }
            if (hs.state == FT_HS_FAILED) break;
        }
    } else {
        ft_hs_client hc;
        if (ft_hs_client_init(&hc, with_token ? token : NULL, with_token ? sizeof token - 1 : 0))
            return 0;
        if (!next_msg(&p, &n, 1, &m, &payload)) return 0;
        uint8_t proof[FT_MSG_PROOF];
        size_t plen = 0;
        if (ft_hs_client_challenge(&hc, &m, payload, proof, &plen) != FT_OK) return 0;
        if (plen != (with_token ? FT_MSG_PROOF : 0)) abort();
        if (!next_msg(&p, &n, 1, &m, &payload)) return 0;
        size_t rest = 0;
        if (ft_hs_client_finish(&hc, &m, payload, &rest) != FT_OK) return 0;
        if (rest > m.data_len) abort();
        if (with_token) {
            uint8_t want[FT_MSG_PROOF];
            ft_auth_proof(token, sizeof token - 1, 1, hc.nc, hc.ns, want);
            if (memcmp(want, payload, FT_MSG_PROOF)) abort();
        }
    }
    return 0;
}
