/* Fuzz the frame parser and every decoder: any input must parse or fail
 * cleanly, decode or fail cleanly, in every output dtype, without reading
 * or writing out of bounds. */
#include "flextier/codec.h"

#include <stdlib.h>
#include <string.h>

#define MAX_OUT (8u << 20)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static ft_codec_ctx *ctx;
    if (!ctx && ft_codec_ctx_create(1, &ctx)) return 0;
    ft_frame_info fi;
    if (ft_frame_parse(data, size, &fi) != FT_OK) return 0;
    for (uint32_t i = 0; i < fi.n_chunks && i < 4; i++) {
        ft_chunk_info c;
        if (ft_frame_chunk(data, size, &fi, i, &c) != FT_OK) abort();
        if (c.enc_offset + c.enc_size > fi.frame_size) abort();   /* parser let it through */
    }
    if (fi.numel > MAX_OUT / 4) return 0;
    static const ft_dtype outs[] = {FT_F32, FT_BF16, FT_F16};
    size_t cap = (size_t)fi.numel * 4;
    void *out = malloc(cap ? cap : 1);
    for (int k = 0; k < 4; k++) {
        ft_tensor t = {0};
        t.dtype = k == 3 ? fi.dtype : outs[k];
        t.data = out;
        (void)ft_decode(ctx, data, size, &t, (size_t)ft_dtype_nbytes(t.dtype, fi.numel));
    }
    free(out);
    return 0;
}
