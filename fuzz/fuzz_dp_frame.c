/* libFuzzer target: what a data-parallel rank parses from its peers
 * (src/train/comm_tcp.h): the HELLO body, frame headers, and the stream
 * machine fed the input in pieces whose sizes come from the input, under
 * small and large message limits. Whatever the bytes, the machine never
 * holds a message over max_msg nor more than max_queued bytes untaken. */
#include "train/comm_tcp.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void fail(void) { abort(); }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2) return 0;
    ft_dp_hello h;
    if (ft_dp_hello_parse(data, size < FT_DP_HELLO_LEN ? size : FT_DP_HELLO_LEN, &h) == FT_OK &&
        (h.rank >= h.size || h.version != FT_DP_VERSION))
        fail();
    static const uint64_t lims[][2] = {{24, 2 * 24 + 4096}, {1, 1}, {4096, 8192 + 4096}, {0, 0}};
    for (size_t l = 0; l < sizeof lims / sizeof lims[0]; l++) {
        ft_dp_rx rx;
        ft_dp_rx_init(&rx, lims[l][0], lims[l][1]);
        size_t step = (size_t)data[0] % 17 + 1, off = 1;
        ft_status st = FT_OK;
        while (off < size && st == FT_OK) {
            size_t n = size - off < step ? size - off : step;
            st = ft_dp_rx_feed(&rx, data + off, n);
            off += n;
            if (rx.queued > rx.max_queued) fail();
            /* take a message now and then, as the ranks do */
            if (data[1] & 1) {
                ft_dp_msg *m = ft_dp_rx_pop(&rx);
                if (m && m->len > lims[l][0]) fail();
                free(m);
            }
            step = (step * 7 + 3) % 23 + 1;
        }
        for (ft_dp_msg *m; (m = ft_dp_rx_pop(&rx));) {
            if (m->len > lims[l][0]) fail();
            volatile uint8_t acc = 0;
            for (size_t i = 0; i < m->len; i++) acc ^= m->data[i];
            (void)acc;
            free(m);
        }
        if (rx.err && strlen(rx.why) > FT_DP_MAX_TEXT) fail();
        ft_dp_rx_free(&rx);
    }
    return 0;
}
