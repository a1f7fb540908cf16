/* A program that embeds only the codec: built against the installed
 * headers and flextier-codec alone (test_install.sh checks that nothing of
 * UCX, BLAS or json-c comes with it). Round-trips synthetic weights through
 * a lossless and a lossy codec and checks the run-time version. */
#include "flextier/codec.h"

#include <stdio.h>
#include <string.h>

int main(void)
{
    if (ft_version_number() != FT_VERSION_NUMBER || strcmp(ft_version_string(), FT_VERSION_STRING)) {
        fprintf(stderr, "codec_only: library %s, headers %s\n", ft_version_string(), FT_VERSION_STRING);
        return 1;
    }
    enum { N = 64 * 1024 };
    int64_t shape[2] = {N / 1024, 1024};
    uint16_t *w = ft_malloc_aligned(N * 2, 64), *back = ft_malloc_aligned(N * 2, 64);
    ft_codec_ctx *cc = NULL;
    if (!w || !back || ft_codec_ctx_create(2, &cc) || ft_synth_weights(FT_BF16, N, 1024, 7, w)) {
        fprintf(stderr, "codec_only: setup: %s\n", ft_last_error());
        return 1;
    }
    ft_tensor t;
    ft_tensor_init(&t, FT_BF16, 2, shape, w);
    const ft_codec_id codecs[] = {FT_CODEC_BYTEPLANE, FT_CODEC_Q4};
    for (int k = 0; k < 2; k++) {
        ft_codec_params p;
        ft_codec_default_params(&p);
        p.codec = codecs[k];
        size_t cap = ft_encode_bound(&p, FT_BF16, 2, shape), size = 0;
        void *frame = ft_malloc_aligned(cap, 64);
        ft_tensor d = {.dtype = FT_BF16, .data = back};
        if (!frame || ft_encode(cc, &p, &t, frame, cap, &size) || ft_decode(cc, frame, size, &d, N * 2)) {
            fprintf(stderr, "codec_only: %s: %s\n", ft_codec_name(codecs[k]), ft_last_error());
            return 1;
        }
        int exact = !memcmp(back, w, N * 2);
        if (exact != !ft_codec_is_lossy(codecs[k])) {
            fprintf(stderr, "codec_only: %s round trip %s\n", ft_codec_name(codecs[k]), exact ? "exact" : "differs");
            return 1;
        }
        printf("%s: %zu -> %zu bytes\n", ft_codec_name(codecs[k]), (size_t)N * 2, size);
        ft_free_aligned(frame);
    }
    ft_codec_ctx_free(cc);
    ft_free_aligned(w);
    ft_free_aligned(back);
    printf("codec_only ok (flextier %s)\n", ft_version_string());
    return 0;
}
