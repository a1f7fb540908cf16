/* Token files and the mutual HMAC challenge-response (auth.h). */
#include "auth.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

ft_status ft_net_read_token(const char *path, size_t min_len, uint8_t *buf, size_t cap,
                            size_t *len)
{
    /* O_NONBLOCK: a FIFO or device put there must not hang us in open();
     * O_NOFOLLOW: the file itself, not where a link points; only a
     * regular file passes the fstat below */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0 && errno == ELOOP)
        return ft_set_error(FT_ERR_INVALID_ARG, "token file %s is a symbolic link: name the file itself", path);
    if (fd < 0) return ft_set_error(FT_ERR_IO, "token file %s: %s", path, strerror(errno));
    struct stat sb;
    ft_status st = FT_OK;
    if (fstat(fd, &sb) != 0) {
        st = ft_set_error(FT_ERR_IO, "token file %s: %s", path, strerror(errno));
    } else if (!S_ISREG(sb.st_mode)) {
        st = ft_set_error(FT_ERR_INVALID_ARG, "token file %s is not a regular file", path);
    } else if (sb.st_uid != geteuid() && sb.st_uid != 0) {
        st = ft_set_error(FT_ERR_INVALID_ARG, "token file %s belongs to another user (uid %u)", path,
                          (unsigned)sb.st_uid);
    } else if (sb.st_mode & 077) {
        st = ft_set_error(FT_ERR_INVALID_ARG,
                          "token file %s is accessible by group or others (mode 0%03o): "
                          "chmod 600 it", path, (unsigned)(sb.st_mode & 0777));
    }
    size_t n = 0;
    while (st == FT_OK && n < cap) {
        ssize_t r = read(fd, buf + n, cap - n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) st = ft_set_error(FT_ERR_IO, "token file %s: %s", path, strerror(errno));
        if (r <= 0) break;
        n += (size_t)r;
    }
    char extra;
    if (st == FT_OK && n == cap && read(fd, &extra, 1) == 1)
        st = ft_set_error(FT_ERR_INVALID_ARG, "token file %s over %zu bytes", path, cap);
    close(fd);
    while (st == FT_OK && n && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ')) n--;
    if (st == FT_OK && n == 0) st = ft_set_error(FT_ERR_INVALID_ARG, "token file %s is empty", path);
    if (st == FT_OK && n < min_len)
        st = ft_set_error(FT_ERR_INVALID_ARG,
                          "token in %s has %zu bytes, at least %zu needed (e.g. `openssl rand "
                          "-hex 32 > FILE`)", path, n, min_len);
    if (st != FT_OK) {
        memset(buf, 0, cap);
        return st;
    }
    *len = n;
    return FT_OK;
}

ft_status ft_net_random(void *buf, size_t n)
{
    if (RAND_bytes(buf, (int)n) != 1)
        return ft_set_error(FT_ERR_INTERNAL, "no random bytes from the system (RAND_bytes)");
    return FT_OK;
}

void ft_auth_proof(const uint8_t *token, size_t token_len, int server,
                   const uint8_t nc[FT_MSG_NONCE], const uint8_t ns[FT_MSG_NONCE],
                   uint8_t out[FT_MSG_PROOF])
{
    /* label || Nc || Ns; distinct labels so that a node's proof is never a
     * valid client proof or the other way round */
    uint8_t msg[16 + 2 * FT_MSG_NONCE];
    memset(msg, 0, 16);
    memcpy(msg, server ? "FTv2 server" : "FTv2 client", 11);
    memcpy(msg + 16, nc, FT_MSG_NONCE);
    memcpy(msg + 16 + FT_MSG_NONCE, ns, FT_MSG_NONCE);
    unsigned int n = FT_MSG_PROOF;
    if (!HMAC(EVP_sha256(), token, (int)token_len, msg, sizeof msg, out, &n) || n != FT_MSG_PROOF)
        memset(out, 0, FT_MSG_PROOF);   /* cannot match a real proof */
}

/* ------------------------------------------------------------ node side */

void ft_hs_server_init(ft_hs_server *hs, const uint8_t *token, size_t token_len, const uint8_t *ns)
{
    memset(hs, 0, sizeof *hs);
    hs->state = FT_HS_HELLO;
    hs->token = token;
    hs->token_len = token ? token_len : 0;
    if (ns) {
        memcpy(hs->ns, ns, FT_MSG_NONCE);
        hs->fixed_ns = 1;
    }
}

static ft_status hs_fail(ft_hs_server *hs, ft_hs_reply *r, ft_status st, const char *detail)
{
    hs->state = FT_HS_FAILED;
    r->status = st;
    r->detail = detail;
    r->len = 0;
    return st;
}

ft_status ft_hs_server_step(ft_hs_server *hs, const ft_msg *m, const uint8_t *payload,
                            ft_hs_reply *r)
{
    memset(r, 0, sizeof *r);
    const uint64_t node_flags = hs->token ? FT_NODE_TOKEN : 0;
    if (hs->state == FT_HS_HELLO && m->opcode == FT_OP_HELLO) {
        memcpy(hs->nc, payload, FT_MSG_NONCE);
        if (!hs->fixed_ns && ft_net_random(hs->ns, FT_MSG_NONCE) != FT_OK)
            return hs_fail(hs, r, FT_ERR_INTERNAL, "internal error");
        memcpy(r->payload, hs->ns, FT_MSG_NONCE);
        r->len = FT_MSG_NONCE;
        r->arg = node_flags;
        hs->state = FT_HS_AUTH;
        return FT_OK;
    }
    if (hs->state == FT_HS_AUTH && m->opcode == FT_OP_AUTH) {
        if (hs->token) {
            uint8_t want[FT_MSG_PROOF];
            ft_auth_proof(hs->token, hs->token_len, 0, hs->nc, hs->ns, want);
            int ok = m->data_len == FT_MSG_PROOF && CRYPTO_memcmp(want, payload, FT_MSG_PROOF) == 0;
            OPENSSL_cleanse(want, sizeof want);
            if (!ok) return hs_fail(hs, r, FT_ERR_AUTH, "authentication failed");
            ft_auth_proof(hs->token, hs->token_len, 1, hs->nc, hs->ns, r->payload);
            r->len = FT_MSG_PROOF;
        } else if (m->data_len != 0) {
            /* the client thinks there is a token; the node has none */
            return hs_fail(hs, r, FT_ERR_AUTH, "authentication failed");
        }
        hs->client_flags = m->arg;
        r->arg = node_flags;
        hs->state = FT_HS_DONE;
        return FT_OK;
    }
    if (m->opcode == FT_OP_HELLO || m->opcode == FT_OP_AUTH)
        return hs_fail(hs, r, FT_ERR_PROTOCOL, "protocol error");
    return hs_fail(hs, r, FT_ERR_AUTH, "authentication required");
}

/* ---------------------------------------------------------- client side */

ft_status ft_hs_client_init(ft_hs_client *hs, const uint8_t *token, size_t token_len)
{
    memset(hs, 0, sizeof *hs);
    hs->token = token_len ? token : NULL;
    hs->token_len = token_len;
    return ft_net_random(hs->nc, FT_MSG_NONCE);
}

ft_status ft_hs_client_challenge(ft_hs_client *hs, const ft_msg *reply, const uint8_t *payload,
                                 uint8_t proof[FT_MSG_PROOF], size_t *plen)
{
    if (reply->opcode != (FT_OP_HELLO | FT_OP_REPLY))
        return ft_set_error(FT_ERR_PROTOCOL, "answer to HELLO has opcode 0x%x", reply->opcode);
    if (reply->status != FT_OK) return reply->status;
    if (reply->data_len != FT_MSG_NONCE)
        return ft_set_error(FT_ERR_PROTOCOL, "node nonce of %llu bytes",
                            (unsigned long long)reply->data_len);
    hs->node_flags = reply->arg;
    memcpy(hs->ns, payload, FT_MSG_NONCE);
    const int node_token = (reply->arg & FT_NODE_TOKEN) != 0;
    if (node_token && !hs->token)
        return ft_set_error(FT_ERR_AUTH, "the node requires a token (--token-file FILE or "
                                         "FLEXTIER_TOKEN_FILE)");
    if (!node_token && hs->token)
        return ft_set_error(FT_ERR_AUTH, "the node runs without a token, so it cannot prove it "
                                         "knows ours: refusing it (drop the token to connect)");
    *plen = 0;
    if (hs->token) {
        ft_auth_proof(hs->token, hs->token_len, 0, hs->nc, hs->ns, proof);
        *plen = FT_MSG_PROOF;
    }
    return FT_OK;
}

ft_status ft_hs_client_finish(ft_hs_client *hs, const ft_msg *reply, const uint8_t *payload,
                              size_t *rest_off)
{
    if (reply->opcode != (FT_OP_AUTH | FT_OP_REPLY))
        return ft_set_error(FT_ERR_PROTOCOL, "answer to AUTH has opcode 0x%x", reply->opcode);
    if (reply->status != FT_OK) return reply->status;
    size_t off = 0;
    if (hs->token) {
        uint8_t want[FT_MSG_PROOF];
        ft_auth_proof(hs->token, hs->token_len, 1, hs->nc, hs->ns, want);
        int ok = reply->data_len >= FT_MSG_PROOF &&
                 CRYPTO_memcmp(want, payload, FT_MSG_PROOF) == 0;
        OPENSSL_cleanse(want, sizeof want);
        if (!ok)
            return ft_set_error(FT_ERR_AUTH, "the node failed to prove it knows the token: "
                                             "not the node we share it with");
        off = FT_MSG_PROOF;
    }
    hs->node_flags = reply->arg;
    *rest_off = off;
    return FT_OK;
}
