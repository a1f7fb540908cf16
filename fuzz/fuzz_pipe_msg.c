/* libFuzzer target: what a pipeline stage parses from the wire
 * (src/pipe): ring messages (pipe_msg.c) under a few stage limits, and
 * the stage parameters a worker takes from its driver (stage.c). */
#include "flextier/pipe.h"
#include "pipe/pipe_msg.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    static const ft_pipe_limits lims[] = {{4, 16, 8, 100}, {1, 1, 1, 1}, {64, 4096, 64, 32000}};
    ft_pipe_msg m;
    for (size_t i = 0; i < sizeof lims / sizeof lims[0]; i++)
        if (ft_pipe_msg_parse(data + 1, size - 1, &lims[i], &m) == FT_OK) {
            /* what the stages then read: every sequence and every data byte */
            volatile uint32_t acc = 0;
            for (uint32_t k = 0; k < m.n_seq; k++) {
                int slot;
                size_t nt;
                ft_pipe_msg_seq(&m, k, &slot, &nt);
                acc += (uint32_t)slot + (uint32_t)nt;
            }
            for (size_t k = 0; k < m.data_len; k++) acc += m.data[k];
            (void)acc;
        }
    ft_pipe_stage_params p;
    ft_pipe_stage_parse((const char *)data + 1, size - 1, &p);
    return 0;
}
