/* libFuzzer target: the check of a peer's UCX worker address before
 * ucp_ep_create (ft_net_ucx_addr_check, src/net/common.c), which walks
 * UCX 1.13's packed format field by field within the given length.
 * Input: the address bytes. Corpus: real addresses of UCX 1.13 (format
 * 1 and 2, TCP only and every transport, with and without the worker
 * name).
 * Invariants: no read outside the input (ASan: the replay copies it to
 * an exact-size buffer); an accepted address has no accepted proper
 * prefix and no accepted extension by a byte (the walk must end exactly
 * at the end); its version nibble is 0 or 1 (UCX asserts on others). */
#include "net/net.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (ft_net_ucx_addr_check(data, size) != FT_OK) return 0;
    if ((data[0] & 0xfu) > 1) abort();
    for (size_t k = 0; k < size; k++)
        if (ft_net_ucx_addr_check(data, k) == FT_OK) abort();
    uint8_t *more = malloc(size + 1);
    if (!more) return 0;
    memcpy(more, data, size);
    more[size] = 0;
    if (ft_net_ucx_addr_check(more, size + 1) == FT_OK) abort();
    free(more);
    return 0;
}
