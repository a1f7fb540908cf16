/* Fuzz the tokenizer: the first byte selects a mode (mod 9).
 *  0     the rest is a tokenizer.json: load it; if it loads, encode and
 *        decode a fixed multilingual string, decode arbitrary ids.
 *  1..4  encode the rest (arbitrary bytes, invalid UTF-8 included) with the
 *        gpt2 / llama3 / llama2 / mistral fixture tokenizer; every id must be
 *        in range; for the byte-level ones decode(encode(x)) must equal x
 *        with invalid UTF-8 replaced by U+FFFD.
 *  5..8  decode the rest as little-endian int32 ids with those tokenizers,
 *        in full and streamed: same text, valid UTF-8, whole characters.
 * The fixtures are found relative to this source file (tests/data). */
#include "flextier/model.h"
#include "model/model_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *kinds[4] = {"gpt2", "llama3", "llama2", "mistral"};
static ft_tokenizer *fixture[4];
static int loaded;

static void load_fixtures(void)
{
    loaded = 1;
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", __FILE__);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0; else snprintf(dir, sizeof dir, ".");
    for (int k = 0; k < 4; k++) {
        char p[1200];
        snprintf(p, sizeof p, "%s/../tests/data/tokenizers/%s/tokenizer.json", dir, kinds[k]);
        if (ft_tokenizer_load(p, &fixture[k]) != FT_OK) fixture[k] = NULL;
    }
}

static int utf8_whole(const char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        size_t l = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 ? 2 : 0;
        if (!l || i + l > n) return 0;
        for (size_t k = 1; k < l; k++)
            if (((unsigned char)s[i + k] & 0xC0) != 0x80) return 0;
        i += l;
    }
    return 1;
}

static void check_decode(const ft_tokenizer *t, const int32_t *ids, size_t n, int skip)
{
    char *full = NULL;
    size_t fl = 0;
    if (ft_tokenizer_decode(t, ids, n, skip, &full, &fl) != FT_OK) return;
    if (!utf8_whole(full, fl) || strlen(full) > fl) abort();   /* NUL only from a token containing it */
    ft_detok *d = NULL;
    if (ft_detok_create(t, skip, &d) != FT_OK) { free(full); return; }
    char buf[16];
    size_t pos = 0;
    for (size_t i = 0; i <= n; i++) {
        ft_status st;
        do {
            size_t w = 0;
            st = i < n ? ft_detok_push(d, ids[i], buf, sizeof buf, &w) : ft_detok_flush(d, buf, sizeof buf, &w);
            if (st != FT_OK && st != FT_ERR_BUFFER_SMALL) abort();
            if (!utf8_whole(buf, w) || pos + w > fl || memcmp(full + pos, buf, w)) abort();
            pos += w;
        } while (st == FT_ERR_BUFFER_SMALL);
    }
    if (pos != fl) abort();
    ft_detok_free(d);
    free(full);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ft_log_set_level(FT_LOG_ERROR);   /* unknown-key warnings would flood the run */
    if (!size) return 0;
    if (!loaded) load_fixtures();
    int mode = data[0] % 9;
    const uint8_t *p = data + 1;
    size_t n = size - 1;
    if (mode == 0) {
        ft_tokenizer *t = NULL;
        if (ft_tokenizer_load_memory((const char *)p, n, "fuzz.json", &t) != FT_OK) return 0;
        static const char text[] = "Hello  world!\n I'm 日本 😀👍🏽 café <s></s> 12345";
        int32_t *ids = NULL;
        size_t ni = 0;
        if (ft_tokenizer_encode(t, text, sizeof text - 1, 1, &ids, &ni) == FT_OK) {
            for (size_t i = 0; i < ni; i++)
                if (ids[i] < 0 || (size_t)ids[i] >= ft_tokenizer_vocab_size(t)) abort();
            check_decode(t, ids, ni, 0);
            check_decode(t, ids, ni, 1);
            free(ids);
        }
        int32_t some[8] = {0, 1, 2, 3, 4, 5, 255, 300};
        check_decode(t, some, 8, 0);
        ft_tokenizer_free(t);
        return 0;
    }
    const ft_tokenizer *t = fixture[(mode - 1) % 4];
    if (!t) return 0;
    if (mode <= 4) {
        int32_t *ids = NULL;
        size_t ni = 0;
        if (ft_tokenizer_encode(t, (const char *)p, n, mode & 1, &ids, &ni) != FT_OK) abort();
        for (size_t i = 0; i < ni; i++)
            if (ids[i] < 0 || (size_t)ids[i] >= ft_tokenizer_vocab_size(t)) abort();
        if (mode <= 2) {   /* byte-level: lossless up to U+FFFD replacement */
            int32_t *clean = NULL;
            char *back = NULL, *back2 = NULL;
            size_t nb = 0, nb2 = 0, nc = 0;
            int32_t *plain = NULL;
            size_t np = 0;
            if (ft_tokenizer_encode(t, (const char *)p, n, 0, &plain, &np) != FT_OK) abort();
            if (ft_tokenizer_decode(t, plain, np, 0, &back, &nb) != FT_OK) abort();
            /* encoding the decoded (valid) text gives the same ids */
            if (ft_tokenizer_encode(t, back, nb, 0, &clean, &nc) != FT_OK) abort();
            if (nc != np || memcmp(clean, plain, np * sizeof *plain)) abort();
            free(plain);
            if (ft_tokenizer_decode(t, clean, nc, 0, &back2, &nb2) != FT_OK) abort();
            if (nb != nb2 || memcmp(back, back2, nb)) abort();
            free(clean); free(back); free(back2);
        }
        check_decode(t, ids, ni, mode & 1);
        free(ids);
        return 0;
    }
    size_t ni = n / 4;
    int32_t *ids = malloc((ni ? ni : 1) * sizeof *ids);
    if (!ids) return 0;
    for (size_t i = 0; i < ni; i++)
        ids[i] = (int32_t)((uint32_t)p[4 * i] | (uint32_t)p[4 * i + 1] << 8 | (uint32_t)p[4 * i + 2] << 16 |
                           (uint32_t)p[4 * i + 3] << 24);
    check_decode(t, ids, ni, 0);
    check_decode(t, ids, ni, 1);
    free(ids);
    return 0;
}
