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
FT_API ft_status ft_checkpoint_open(const char *path, ft_checkpoint **out);
FT_API void ft_checkpoint_close(ft_checkpoint *ck);     /* NULL ok; unmaps all */
/* Drop the checkpoint files' pages that no mapping holds from the page
 * cache (a memory cgroup charges them to the reader): for loading under a
 * memory budget, after unmapping (madvise MADV_DONTNEED) what was read. */
FT_API void ft_checkpoint_drop_cache(const ft_checkpoint *ck);

/* Number of tensors, and the i-th name (sorted by name, stable for the
 * checkpoint's lifetime; NULL if i is out of range). */
FT_API size_t ft_checkpoint_count(const ft_checkpoint *ck);
FT_API const char *ft_checkpoint_name(const ft_checkpoint *ck, size_t i);

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
FT_API ft_status ft_checkpoint_get(const ft_checkpoint *ck, const char *name,
                                   ft_tensor *out);
/* The file and byte offset of p, a pointer into one of the checkpoint's
 * mappings (a view ft_checkpoint_get gave): for reading a tensor's bytes
 * with pread instead of through the mapping (the streamed embeddings and
 * LM head). *path is valid until close. FT_ERR_NOT_FOUND: p is in none. */
FT_API ft_status ft_checkpoint_locate(const ft_checkpoint *ck, const void *p, const char **path, uint64_t *offset);
/* The raw safetensors dtype string of a tensor ("BF16", "F64"), or NULL if
 * absent: lets a caller report what an unsupported tensor is. */
FT_API const char *ft_checkpoint_dtype_str(const ft_checkpoint *ck, const char *name);
/* A value from a file's "__metadata__" (for sharded checkpoints, the first
 * shard that has the key), or NULL. Valid until close. */
FT_API const char *ft_checkpoint_metadata(const ft_checkpoint *ck, const char *key);

/* Writer (tests and tools; `flextier gen-model` uses the streaming variant
 * below): write tensors as one .safetensors file atomically (temp file in
 * the same directory, fsync, rename; nothing is left behind on failure). Tensors are written in the
 * given order, each data section offset 8-byte aligned relative to the
 * data start (header padded with spaces to a multiple of 8, like the
 * Python library). meta_kv: NULL or a NULL-terminated list of key, value,
 * key, value, ... strings stored as "__metadata__". Names must be
 * non-empty, unique and not "__metadata__"; dtypes F32/F16/BF16/I8/U8/I32
 * (FT_ERR_UNSUPPORTED otherwise). Tensor data are read, not kept. */
typedef struct { const char *name; ft_tensor tensor; } ft_named_tensor;
FT_API ft_status ft_safetensors_write(const char *path, const ft_named_tensor *tensors,
                                      size_t n, const char *const *meta_kv);

/* Streaming writer: as ft_safetensors_write, but the tensors' bytes come
 * from fill() instead of tensor.data (ignored; may be NULL), so a file far
 * larger than memory is written with one FT_ST_FILL_MAX buffer. fill(user,
 * i, offset, buf, len) must put bytes [offset, offset + len) of tensors[i]
 * into buf. It is called on the writer's thread, in file order: tensor by
 * tensor (the order ft_safetensors_write uses), each tensor's bytes once,
 * at increasing offsets that are multiples of FT_ST_FILL_MAX, len <=
 * FT_ST_FILL_MAX. A status other than FT_OK from fill aborts the write
 * (returned as is; the temp file is removed). */
#define FT_ST_FILL_MAX ((size_t)8 << 20)
typedef ft_status (*ft_st_fill_fn)(void *user, size_t i, uint64_t offset, void *buf, size_t len);
FT_API ft_status ft_safetensors_write_stream(const char *path, const ft_named_tensor *tensors, size_t n,
                                             const char *const *meta_kv, ft_st_fill_fn fill, void *user);

/* -------------------------------------------------------------- tokenizer */

/* A tokenizer loaded from a Hugging Face tokenizer.json.
 *
 * Supported (everything else is rejected at load with FT_ERR_UNSUPPORTED
 * naming the component, e.g. "model type WordPiece is not supported"):
 *  - model BPE (merges as "a b" strings or [a, b] pairs; byte_fallback,
 *    unk_token, fuse_unk, ignore_merges; no dropout / subword prefixes);
 *  - normalizers Prepend, Replace (string pattern), Sequence, NFC (accepted
 *    as a no-op: input that is not already NFC is not normalized);
 *  - pre-tokenizers ByteLevel (GPT-2 regex, byte-to-unicode mapping),
 *    Split (regex via PCRE2 with UTF + UCP, or string; behaviors Isolated,
 *    Removed, MergedWithPrevious, MergedWithNext; invert), Metaspace
 *    (prepend_scheme always / first / never, split), Sequence;
 *  - post-processors TemplateProcessing (single), RobertaProcessing,
 *    BertProcessing, ByteLevel, Sequence;
 *  - decoders ByteLevel, Metaspace, Replace (string), ByteFallback, Fuse,
 *    Strip (start only), Sequence, none (tokens joined by spaces);
 *  - added tokens matched (leftmost-longest) before the model splits text,
 *    honoring special, normalized, lstrip, rstrip and single_word.
 *
 * Input text: arbitrary bytes. Invalid UTF-8 is first replaced by U+FFFD
 * (one per maximal invalid subpart, as Python's errors="replace"), then
 * tokenized like the Hugging Face library tokenizes that string.
 * Ids out of range in decode are skipped (as Hugging Face does). */
typedef struct ft_tokenizer ft_tokenizer;

/* Load tokenizer.json. Errors name the file and the JSON field. */
FT_API ft_status ft_tokenizer_load(const char *tokenizer_json_path, ft_tokenizer **out);
/* Load the tokenizer of a model directory: dir/tokenizer.json if present;
 * else GPT-2-style dir/vocab.json + dir/merges.txt (what OPT checkpoints on
 * the Hub ship), read as byte-level BPE exactly like GPT2Tokenizer, with
 * BOS prepended when dir/tokenizer_config.json says "add_bos_token": true
 * (OPT: "</s>"); bos/eos/unk/pad tokens and added_tokens_decoder entries
 * become special added tokens. FT_ERR_NOT_FOUND if neither exists. */
FT_API ft_status ft_tokenizer_load_dir(const char *model_dir, ft_tokenizer **out);
/* As ft_tokenizer_load_dir; flags: FT_TOKENIZER_STRICT makes a field the
 * loader does not know an error (as FLEXTIER_STRICT=1 does for every
 * load), instead of a warning naming it. */
#define FT_TOKENIZER_STRICT 1u
FT_API ft_status ft_tokenizer_load_dir_ex(const char *model_dir, unsigned flags, ft_tokenizer **out);
FT_API void ft_tokenizer_free(ft_tokenizer *t);                       /* NULL ok */
/* max token id + 1, including added tokens (HF get_vocab_size(True)). */
FT_API size_t ft_tokenizer_vocab_size(const ft_tokenizer *t);
/* Id of a token string (added tokens first, then the model vocab); -1 if
 * none. For byte-level models the string is in the mapped alphabet
 * ("Ġthe"). */
FT_API int32_t ft_tokenizer_token_id(const ft_tokenizer *t, const char *token);
/* The token string of an id (added token content or vocab entry), or NULL
 * if out of range. Valid until ft_tokenizer_free. */
FT_API const char *ft_tokenizer_token_str(const ft_tokenizer *t, int32_t id);
/* Whether id is a special added token (skipped by skip_special decode). */
FT_API int ft_tokenizer_is_special(const ft_tokenizer *t, int32_t id);

/* Encode len bytes of text. add_special: as HF's add_special_tokens=True
 * (the post-processor's template: BOS etc.). *ids is malloc'd (free()), *n
 * may be 0 (then *ids is still a valid pointer to free). */
FT_API ft_status ft_tokenizer_encode(const ft_tokenizer *t, const char *text, size_t len,
                                     int add_special, int32_t **ids, size_t *n);
/* Decode to UTF-8 (NUL-terminated, *len excludes the NUL; free()). Same
 * result as HF's decode(ids, skip_special_tokens=skip_special). */
FT_API ft_status ft_tokenizer_decode(const ft_tokenizer *t, const int32_t *ids, size_t n,
                                     int skip_special, char **text, size_t *len);

/* Streaming detokenizer: push ids one at a time; it emits only complete
 * UTF-8 characters, and the concatenation of everything emitted by push
 * and flush equals ft_tokenizer_decode of all ids pushed. Bytes that do not
 * fit in buf (cap) stay queued and come out with the next push or flush
 * (cap 0 is allowed for push; a cap >= 4 always makes progress). flush emits what is pending (an incomplete character
 * at the end becomes U+FFFD, as full decode does); it returns
 * FT_ERR_BUFFER_SMALL when bytes remain queued after filling buf (call it
 * again). The detokenizer borrows t, which must outlive it. One thread at a
 * time per detokenizer; after flush it can be reused for a new stream. */
typedef struct ft_detok ft_detok;
FT_API ft_status ft_detok_create(const ft_tokenizer *t, int skip_special, ft_detok **out);
FT_API ft_status ft_detok_push(ft_detok *d, int32_t id, char *buf, size_t cap, size_t *written);
FT_API ft_status ft_detok_flush(ft_detok *d, char *buf, size_t cap, size_t *written);
FT_API void ft_detok_free(ft_detok *d);                                /* NULL ok */

#ifdef __cplusplus
}
#endif
#endif
