/* libFuzzer target: the codec agent's wire messages (src/net/agent_msg.c):
 * headers as request and reply, and every body parser. */
#include "net/agent_msg.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    /* first byte: how the rest splits into header and payload */
    size_t hl = data[0] < size - 1 ? data[0] + FT_AMSG_HDR_SIZE / 2 : size - 1;
    if (hl > size - 1) hl = size - 1;
    const uint8_t *h = data + 1, *body = data + 1 + hl;
    size_t bl = size - 1 - hl;
    ft_amsg m;
    /* as the agent's TCP reader does: the header length, then the header
     * with the data length it states */
    size_t hlen = 0;
    if (size - 1 >= FT_AMSG_HDR_SIZE && ft_amsg_header_len(data + 1, &hlen) == FT_OK && hlen <= size - 1) {
        uint64_t dl = 0;
        for (int i = 7; i >= 0; i--) dl = (dl << 8) | data[1 + 24 + i];
        ft_amsg_parse(data + 1, hlen, (size_t)dl, 0, 1u << 20, &m);
        ft_amsg_parse(data + 1, hlen, (size_t)dl, 1, UINT64_MAX, &m);
    }
    ft_amsg_parse(h, hl, bl, 0, 1u << 20, &m);
    ft_amsg_parse(h, hl, bl, 1, UINT64_MAX, &m);
    ft_amsg_parse(data + 1, size - 1, 0, 0, 1u << 20, &m);
    ft_amsg_hello hh;
    ft_amsg_hello_parse(data + 1, size - 1, &hh);
    ft_tensor t;
    ft_codec_params cp;
    const uint8_t *rk;
    size_t rkl;
    uint64_t nb = 0;
    /* as the agent: only tensors its staging can hold get that far */
    if (ft_amsg_write_parse(data + 1, size - 1, &t, &cp, &rk, &rkl) == FT_OK &&
        ft_tensor_nbytes(&t, &nb) == FT_OK && nb <= (1ull << 30))
        (void)ft_encode_bound(&cp, t.dtype, t.ndim, t.shape);
    int od;
    ft_amsg_read_parse(data + 1, size - 1, &od, &rk, &rkl);
    ft_tensor_stat ts;
    ft_amsg_stat_parse(data + 1, size - 1, &ts);
    ft_store_stats ss;
    ft_amsg_stats_parse(data + 1, size - 1, &ss);
    char **keys = NULL;
    size_t n = 0;
    if (ft_amsg_list_parse(body, bl, &keys, &n) == FT_OK) ft_list_free(keys, n);
    return 0;
}
