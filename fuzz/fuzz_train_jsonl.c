/* Fuzz the JSONL training-data reader (ft_train_jsonl_each, the train
 * layer): any input is read or refused cleanly; every text handed out is
 * inside bounds and NUL-terminated at its length. */
#include "flextier/train.h"

#include <stdlib.h>
#include <string.h>

static ft_status each(void *user, const char *text, size_t len)
{
    size_t *total = user;
    if (!text || text[len] != 0 || strlen(text) != len) abort();
    *total += len;
    return FT_OK;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    size_t total = 0;
    if (ft_train_jsonl_each((const char *)data, size, "fuzz.jsonl", each, &total) == FT_OK && total > 64 * size + 64)
        abort();
    return 0;
}
