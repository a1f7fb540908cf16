/* Fuzz the cross-memory attach offer a client receives from a server
 * (src/net/cma.c, ft_cma_offer_name): the nonce and the Unix socket name
 * the client will connect to.
 * Invariants: no crash or out-of-bounds access; an accepted name starts
 * with "flextier-cma-", is printable ASCII without spaces, NUL-padded, and
 * is the offer's bytes; a refused one leaves an empty name. */
#include "net/cma.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t offer[FT_CMA_OFFER_SIZE];
    memset(offer, 0, sizeof offer);
    memcpy(offer, data, size < sizeof offer ? size : sizeof offer);
    char name[FT_CMA_NAME + 1];
    memset(name, 'x', sizeof name);
    if (ft_cma_offer_name(offer, name) == FT_OK) {
        size_t n = strlen(name);
        if (n > FT_CMA_NAME || strncmp(name, "flextier-cma-", 13)) abort();
        for (size_t i = 0; i < n; i++)
            if (name[i] < 0x21 || name[i] > 0x7e || (uint8_t)name[i] != offer[FT_CMA_NONCE + i]) abort();
        for (size_t i = n; i < FT_CMA_NAME; i++)
            if (offer[FT_CMA_NONCE + i]) abort();
    } else if (name[0]) {
        abort();
    }
    return 0;
}
