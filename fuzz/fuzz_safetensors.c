/* Fuzz the safetensors header parser: any input must open or fail cleanly;
 * every tensor of an opened image must lie inside the input. */
#include "flextier/model.h"
#include "model/model_internal.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ft_checkpoint *ck = NULL;
    if (ft_checkpoint_open_memory(data, size, "fuzz", &ck) != FT_OK) return 0;
    volatile uint8_t sink = 0;
    for (size_t i = 0; i < ft_checkpoint_count(ck); i++) {
        const char *name = ft_checkpoint_name(ck, i);
        if (!name || !ft_checkpoint_dtype_str(ck, name)) abort();
        ft_tensor t;
        if (ft_checkpoint_get(ck, name, &t) != FT_OK) continue;
        uint64_t nb;
        if (ft_tensor_nbytes(&t, &nb) != FT_OK) abort();
        const uint8_t *p = t.data;
        if (p < data || nb > size || p + nb > data + size) abort();
        for (uint64_t k = 0; k < nb; k++) sink ^= p[k];   /* ASan checks each byte */
    }
    (void)ft_checkpoint_metadata(ck, "format");
    (void)sink;
    ft_checkpoint_close(ck);
    return 0;
}
