/* Fuzz the JSONL training-data reader (ft_train_jsonl_each and, with chat
 * lines, ft_train_jsonl_each_ex; the train layer): any input is read or
 * refused cleanly; every text handed out is inside bounds and
 * NUL-terminated at its length; every chat line handed out is a JSON array
 * of objects with a string "role", one of them "assistant". */
#include "flextier/train.h"

#include <json-c/json.h>
#include <stdlib.h>
#include <string.h>

static ft_status each(void *user, const char *text, size_t len)
{
    size_t *total = user;
    if (!text || text[len] != 0 || strlen(text) != len) abort();
    *total += len;
    return FT_OK;
}

static ft_status chat(void *user, const char *messages, size_t line)
{
    size_t *total = user;
    json_object *m = json_tokener_parse(messages);
    if (!m || !json_object_is_type(m, json_type_array) || json_object_array_length(m) == 0 || line == 0) abort();
    int asst = 0;
    for (size_t i = 0; i < json_object_array_length(m); i++) {
        json_object *r = json_object_object_get(json_object_array_get_idx(m, i), "role");
        if (!r || !json_object_is_type(r, json_type_string)) abort();
        asst |= !strcmp(json_object_get_string(r), "assistant");
    }
    if (!asst) abort();
    json_object_put(m);
    *total += strlen(messages);
    return FT_OK;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    size_t total = 0;
    if (ft_train_jsonl_each((const char *)data, size, "fuzz.jsonl", each, &total) == FT_OK && total > 64 * size + 64)
        abort();
    total = 0;
    if (ft_train_jsonl_each_ex((const char *)data, size, "fuzz.jsonl", each, chat, &total) == FT_OK &&
        total > 64 * size + 64)
        abort();
    return 0;
}
