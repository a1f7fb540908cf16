/*
 * flextier/model.h - Hugging Face model files: safetensors checkpoints
 * (memory-mapped, validated) and tokenizer.json tokenizers (byte-level BPE
 * and sentencepiece-style BPE with byte fallback).
 *
 * Everything read here is treated as untrusted: every header, offset and
 * JSON field is validated and a bad file gives an error status with a
 * detail message (ft_last_error()) naming the file and the tensor or field,
 * never a crash. See docs/model-loading.md.
 *
 * Thread-safety: an opened ft_checkpoint / loaded ft_tokenizer is immutable
 * and may be used from many threads at once (the tokenizer's internal merge
 * cache is per call). An ft_detok is a per-stream object: one thread at a
 * time.
 */
#ifndef FLEXTIER_MODEL_H
#define FLEXTIER_MODEL_H

#include "flextier/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------ safetensors */

typedef struct ft_checkpoint ft_checkpoint;

/* Open a checkpoint. path: a model directory (model.safetensors, or
 * model.safetensors.index.json + the shards it names) or a single
 * .safetensors file. Files are mmapped read-only (nothing is copied).
 *
 * Validated for every file: the 8-byte little-endian header length; the
 * JSON header (<= 100 MB, must start with '{', UTF-8 JSON object, depth
 * bounded, only trailing spaces after it); every tensor's dtype known,
 * shape dims exact non-negative integers, at most FT_MAX_DIMS dims,
 * numel x dtype size == end - begin; data_offsets exact non-negative
 * integers, inside the data section and non-overlapping; names unique
 * (within a file and across shards). For an index: weight_map is an object
 * of name -> shard file name (plain file names only, no '/' or ".."), every
 * mapped tensor is present in the shard named. "__metadata__" must be an
 * object of strings.
 *
 * Errors: FT_ERR_NOT_FOUND (no checkpoint at path), FT_ERR_IO, FT_ERR_CORRUPT
 * (validation failed), FT_ERR_UNSUPPORTED (unknown dtype string, > 8 dims),
 * FT_ERR_NOMEM. The detail message names the file and tensor/field.
 * *out is set only on success. */
ft_status ft_checkpoint_open(const char *path, ft_checkpoint **out);
void ft_checkpoint_close(ft_checkpoint *ck);     /* NULL ok; unmaps all */

/* Number of tensors, and the i-th name (sorted by name, stable for the
 * checkpoint's lifetime; NULL if i is out of range). */
size_t ft_checkpoint_count(const ft_checkpoint *ck);
const char *ft_checkpoint_name(const ft_checkpoint *ck, size_t i);

/* A view into the mapping: out->data points at the tensor's bytes (read-
 * only memory; writing to it faults), valid until ft_checkpoint_close.
 *
 * Alignment: safetensors does not guarantee any alignment of tensor data
 * (files written by the Python library and by ft_safetensors_write are
 * 8-byte aligned in practice, but a valid file may have odd offsets).
 * Consumers must not assume out->data is aligned for its dtype: use
 * memcpy / ft_convert to copy or convert into their own buffers.
 *
 * FT_ERR_NOT_FOUND if there is no such tensor; FT_ERR_UNSUPPORTED for a
 * valid safetensors dtype FlexTier has no ft_dtype for (F64, I64, I16, U16,
 * U32, U64, BOOL, F8_*). Supported: F32, F16, BF16, I8, U8, I32. */
ft_status ft_checkpoint_get(const ft_checkpoint *ck, const char *name,
                            ft_tensor *out);
/* The raw safetensors dtype string of a tensor ("BF16", "F64"), or NULL if
 * absent: lets a caller report what an unsupported tensor is. */
const char *ft_checkpoint_dtype_str(const ft_checkpoint *ck, const char *name);
/* A value from a file's "__metadata__" (for sharded checkpoints, the first
 * shard that has the key), or NULL. Valid until close. */
const char *ft_checkpoint_metadata(const ft_checkpoint *ck, const char *key);

/* Writer (used by `flextier gen-model` and tests): write tensors as one
 * .safetensors file atomically (temp file in the same directory, fsync,
 * rename; nothing is left behind on failure). Tensors are written in the
 * given order, each data section offset 8-byte aligned relative to the
 * data start (header padded with spaces to a multiple of 8, like the
 * Python library). meta_kv: NULL or a NULL-terminated list of key, value,
 * key, value, ... strings stored as "__metadata__". Names must be
 * non-empty, unique and not "__metadata__"; dtypes F32/F16/BF16/I8/U8/I32
 * (FT_ERR_UNSUPPORTED otherwise). Tensor data are read, not kept. */
typedef struct { const char *name; ft_tensor tensor; } ft_named_tensor;
ft_status ft_safetensors_write(const char *path, const ft_named_tensor *tensors,
                               size_t n, const char *const *meta_kv);

#ifdef __cplusplus
}
#endif
#endif
