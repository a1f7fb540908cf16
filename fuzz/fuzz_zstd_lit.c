/* Fuzz the byte-plane codec's fast zstd decoder (src/codec/zstd_lit.c),
 * which frames reach only behind their chunk hashes (fuzz_frame cannot get
 * there): input = u32 little-endian expected size (mod 512 KiB) + a zstd
 * frame. It must never read or write out of bounds, and whatever it
 * accepts libzstd must accept with the same bytes (else abort). */
#include "codec/codec_internal.h"

#include <stdlib.h>
#include <string.h>
#include <zstd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static ft_worker_ws ws;   /* kept across inputs, as a worker's is */
    if (size < 4) return 0;
    size_t raw = ((size_t)data[0] | (size_t)data[1] << 8 | (size_t)data[2] << 16 |
                  (size_t)data[3] << 24) % (512u << 10);
    /* exact-size copies: ASan sees any read past the frame or write past raw */
    uint8_t *frame = malloc(size - 4 ? size - 4 : 1), *out = malloc(raw ? raw : 1);
    uint8_t *ref = malloc(raw ? raw : 1);
    if (!frame || !out || !ref) abort();
    memcpy(frame, data + 4, size - 4);
    if (ft_zstd_lit_decode(&ws, frame, size - 4, out, raw) == FT_OK) {
        size_t r = ZSTD_decompress(ref, raw, frame, size - 4);
        if (ZSTD_isError(r) || r != raw || memcmp(ref, out, raw)) abort();
    }
    free(frame);
    free(out);
    free(ref);
    return 0;
}
