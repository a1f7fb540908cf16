/* Internal to src/model (and its tests / fuzz targets). */
#ifndef FT_MODEL_INTERNAL_H
#define FT_MODEL_INTERNAL_H
#include "flextier/model.h"

/* Parse one safetensors image held in memory (borrowed: buf must outlive
 * the checkpoint). name is used in error messages. Same validation as
 * ft_checkpoint_open on a single file. */
ft_status ft_checkpoint_open_memory(const void *buf, size_t size, const char *name,
                                    ft_checkpoint **out);

/* Largest JSON header accepted (the Python library's limit). */
#define FT_ST_MAX_HEADER (100u * 1000u * 1000u)

/* Parse a tokenizer.json held in memory (need not be NUL-terminated). name
 * is used in error messages. */
ft_status ft_tokenizer_load_memory(const char *json, size_t len, const char *name,
                                   ft_tokenizer **out);

#endif
