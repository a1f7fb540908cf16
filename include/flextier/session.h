/*
 * flextier/session.h - the library's front door: open a model directory
 * with a device, weight and cache formats, and an offloading policy (given,
 * or planned for this machine); generate from token ids or text, batched,
 * streaming, with sampling; read the metrics; close.
 *
 * A session owns everything a run needs: the model (loaded in its compute
 * format, or with its layers placed on the policy's tiers), the tokenizer,
 * the compute context on the chosen device, the weight scheduler and the
 * KV cache offloader. `flextier run`, `bench run`, `perplexity` and the
 * Python binding's flextier.Session are thin callers of this API.
 *
 * Contexts are sized lazily: the first call that needs more sequences,
 * positions or rows per call than the current context holds builds a
 * larger one (the model, the weights on the tiers and the plan are kept).
 * max_batch / max_seq in the parameters size it up front and are what an
 * automatic policy is planned for.
 *
 * Thread-safety: a session is used by one thread at a time. Different
 * sessions are independent (each has its own thread pools).
 */
#ifndef FLEXTIER_SESSION_H
#define FLEXTIER_SESSION_H

#include "flextier/core.h"
#include "flextier/engine.h"
#include "flextier/model.h"
#include "flextier/offload.h"
#include "flextier/cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ft_device_kind {
    FT_DEVICE_CPU = 0,
    FT_DEVICE_CUDA = 1       /* one NVIDIA GPU (flextier/cuda.h)             */
} ft_device_kind;

typedef enum ft_offload_mode {
    FT_OFFLOAD_NONE = 0,     /* every weight in memory (the device)          */
    FT_OFFLOAD_POLICY = 1,   /* ft_session_params.policy as given            */
    FT_OFFLOAD_AUTO = 2      /* planned: measure this machine and the tiers,
                                then ft_plan for max_batch / plan_* lengths */
} ft_offload_mode;

/* A LoRA adapter for a session: a PEFT adapter directory and a scale that
 * multiplies its alpha / r (1: as trained; PEFT's set_scale). */
typedef struct ft_session_lora {
    const char *dir;
    float scale;
} ft_session_lora;

typedef struct ft_session_params {
    ft_device_kind device;
    /* Matrix format: an ft_wfmt, or FT_WEIGHTS_AS_STORED (the default:
     * the checkpoint's dtype). With a q8/q4 weight compression policy the
     * matrices are kept in that format. CUDA packs its own device formats
     * (leave it FT_WEIGHTS_AS_STORED). */
    int weights;
    /* The in-memory KV cache: FT_F32, FT_BF16 or FT_F16; -1 (default):
     * bf16 on the CPU (an offloaded cache exchanges f32 rows). */
    int kv_dtype;
    unsigned threads;        /* compute threads; 0: ft_default_threads()     */
    int strict;              /* unknown config.json keys and tokenizer fields
                                are errors (default: a warning naming them)  */
    /* What the first context is sized for (0: 1 sequence, min(2048,
     * max_position_embeddings) positions); calls needing more grow it. */
    uint32_t max_batch, max_seq;
    /* Offloading. POLICY: `policy` (tiers, codecs, remotes, disk). AUTO:
     * `policy` supplies the remotes and disk directory, weight_codecs and
     * cache_codecs (masks of 1u << ft_codec_id; 0: none, bp, q4 and none,
     * q4) the codecs to consider, plan_prompt_len / plan_gen_len the run
     * to plan for. device_mem: the device budget (0: unlimited). */
    ft_offload_mode offload;
    ft_policy policy;
    unsigned weight_codecs, cache_codecs;
    uint32_t plan_prompt_len, plan_gen_len;
    uint64_t device_mem;
    const char *token_file;  /* memory nodes' / agents' shared secret       */
    unsigned decode_threads; /* streamed frames' checks and decoding;
                                0: every core                               */
    /* With policy.replicas > 1: a memory node whose link moves nothing
     * this long while a request waits is given up on (0: 1000 ms; a
     * killed node is noticed at once). ft_offload_params.failover_ms. */
    unsigned failover_ms;
    /* Mixtures of experts with streamed experts: the expert cache's byte
     * budget (0: what device_mem leaves, or one layer's experts),
     * FT_EXPERT_LRU / FT_EXPERT_LFU, and prefetching of the next layer's
     * experts (ft_offload_params.expert_*). */
    uint64_t expert_cache_bytes;
    int expert_evict, expert_prefetch;
    /* Long steps report here (NULL: silent): stage is "load", "place"
     * (weights onto tiers) or "plan"; done/total in bytes (plan: 0/0). */
    void (*progress)(void *user, const char *stage, uint64_t done, uint64_t total);
    void *user;
    /* The whole process's resident memory, in bytes (docs/offload.md,
     * "Memory budget"): weights in any form and their staging, the KV
     * cache, activations and scratch, embeddings and LM head, I/O
     * buffers, the tokenizer, calibration and planning, and the page
     * cache the disk tier's reads would hold. 0: FLEXTIER_MEMORY from the
     * environment, else the default (ft_memory_default_budget: the memory
     * cgroup's limit, else the available memory, minus a headroom);
     * FT_MEMORY_UNLIMITED: none. A configuration that cannot fit is
     * refused before the weights are loaded (FT_ERR_NO_SPACE with the
     * numbers); AUTO plans within it, moving what does not fit to the
     * disk tier (policy.disk_uri, or a private temporary directory removed
     * at close) or to memory nodes. device_mem stays the device's budget
     * (on a CPU: the working set of decoded weights and device cache). */
    uint64_t memory;
    /* AUTO may choose lossy formats (q8/q4 weights or cache); without it
     * the plan keeps the numerics (raw or byte-plane weights, f32 cache
     * rows) unless weight_codecs / cache_codecs, the policy's cw=/cc= or
     * q8/q4 `weights` ask for one. */
    int allow_lossy;
    /* AUTO: measure the machine again instead of using the calibration
     * cache (ft_calibrate_params.recalibrate). */
    int recalibrate;
    /* POLICY on the CPU: calibrate as AUTO does and predict the given
     * policy's decode tok/s (ft_session_policy's predicted_tps), so a run
     * shows the cost model's prediction beside what it measures. */
    int predict;
    /* LoRA adapters (n_lora of them, read at open; the array need not
     * outlive the call), applied unmerged in every forward call in the
     * given order: y = W x + b + sum_k scale_k (alpha_k / r_k) B_k A_k x
     * (docs/training.md, "Adapters at inference"). Any stored format and
     * offloading policy; the CPU device only (FT_ERR_UNSUPPORTED on CUDA
     * and for pipelines). */
    const ft_session_lora *lora;
    size_t n_lora;
    /* Nonzero: the caller computes with the session's model and weight
     * scheduler but without its contexts (a trainer, flextier/train.h:
     * ft_trainer_memory) and holds this many bytes of working memory: the
     * memory budget counts them in place of a context's KV cache and
     * scratch. */
    uint64_t work_bytes;
} ft_session_params;

#define FT_MEMORY_UNLIMITED UINT64_MAX

FT_API void ft_session_default_params(ft_session_params *p);

typedef struct ft_session ft_session;

/* Open a Hugging Face model directory (config.json, *.safetensors,
 * tokenizer.json or vocab.json + merges.txt). Errors: those of model and
 * tokenizer loading (naming the file and field), of the policy
 * (FT_ERR_INVALID_ARG / FT_ERR_UNSUPPORTED with the reason), of the tiers
 * (opening a disk directory or a memory node), FT_ERR_NO_SPACE when the
 * policy does not fit device_mem, FT_ERR_UNSUPPORTED for a device this
 * build or machine does not have. */
FT_API ft_status ft_session_open(const char *model_dir, const ft_session_params *p, ft_session **out);
FT_API void ft_session_close(ft_session *s);                          /* NULL ok */

/* A session that is the driver of a pipeline across processes
 * (flextier/pipe.h, docs/pipeline.md): the caller has built the ring (the
 * stages before this one: `flextier worker` processes, MPI ranks or
 * threads) and hands over the last stage and its link; the session loads
 * the tokenizer, and ft_session_generate / ft_session_generate_text run
 * through ft_pipe_generate with micro_batches groups (0: one per stage).
 * The stage keeps owning its model and weight scheduler (stats come from
 * it); free the stage and link after ft_session_close. ft_session_forward
 * is FT_ERR_UNSUPPORTED (the driver holds the last layers only). The
 * parameters' device must be the CPU and the offload mode not AUTO;
 * their policy is reported by ft_session_policy when the stage offloads. */
struct ft_pipe_stage;
struct ft_pipe_link;
FT_API ft_status ft_session_open_pipeline(const char *model_dir, const ft_session_params *p, struct ft_pipe_stage *driver,
                                   struct ft_pipe_link *link, int micro_batches, ft_session **out);

FT_API const ft_model_config *ft_session_config(const ft_session *s);
FT_API const ft_model *ft_session_model(const ft_session *s);
FT_API const ft_tokenizer *ft_session_tokenizer(const ft_session *s);
/* The policy in force ("everything on the device" without offloading)
 * and, for FT_OFFLOAD_AUTO (or POLICY with `predict`), the cost model's
 * predicted decode tok/s (else 0). */
FT_API const ft_policy *ft_session_policy(const ft_session *s, double *predicted_tps);
/* The same prediction where a thread gets cpu_share of a core (0 < share
 * <= 1; ft_cpu_share measures it): the cost model's inputs rescaled from
 * the share of the plan to this one (ft_cost_rescale_cpu), so that a run
 * can be predicted at the load it met. FT_ERR_INVALID_ARG without a
 * prediction. */
FT_API ft_status ft_session_predict_at(const ft_session *s, double cpu_share, double *tps);
/* The sampling the model's generation_config.json asks for (greedy when
 * it does not sample). */
FT_API void ft_session_default_sampling(const ft_session *s, ft_sampling *out);

/* The memory budget in force and what the session counted against it
 * (bytes; budget 0: none). need: the estimate checked at open (the
 * process as it was, the tokenizer included, plus the globals, the
 * tiers' memory, staging and scratch); source: where the budget came
 * from ("--memory", "FLEXTIER_MEMORY", "cgroup v1 memory.limit_in_bytes",
 * "MemAvailable", ...); disk_dir: the private disk tier the session made
 * ("" if none). */
typedef struct ft_session_memory {
    uint64_t budget, limit, headroom, need;
    uint64_t process, globals, layers, scratch, tiers;
    int binding;             /* an explicit budget or a cgroup's limit: the
                                disk tier's page cache is dropped         */
    char source[64];
    char disk_dir[512];
    /* the token embeddings and an untied LM head (bytes as computed on),
     * and which of them the budget left in the checkpoint file, read on
     * demand (FT_STREAM_EMBED / FT_STREAM_LM_HEAD; globals then excludes
     * them) */
    uint64_t embed, head;
    unsigned streamed;
} ft_session_memory;
FT_API void ft_session_get_memory(const ft_session *s, ft_session_memory *out);

/* Token level, as ft_ctx_forward / ft_generate (include/flextier/engine.h)
 * on the session's device. forward's all_rows needs all_logits: the
 * context is rebuilt with it when asked. */
FT_API ft_status ft_session_forward(ft_session *s, size_t n, const int *slots, const int32_t *const *tokens,
                                    const size_t *ntok, float *logits, int all_rows);
FT_API ft_status ft_session_generate(ft_session *s, size_t n, const int32_t *const *prompts, const size_t *prompt_len,
                                     const ft_gen_params *gp, int32_t *const *out, size_t *n_out, ft_gen_stats *stats);
/* Forget every sequence (slots empty). */
FT_API void ft_session_reset(ft_session *s);

/* Slots, for a caller that schedules many sequences itself (the server's
 * continuous batching, include/flextier/server.h): ft_session_forward
 * appends to each slot at its own position, so sequences at different
 * lengths (prefill chunks and decode steps) share one call.
 * reserve: build the context now for batch slots of seq positions and
 * rows new tokens per forward call (0: batch + seq); calls that stay
 * within it never rebuild it (a rebuild loses every slot's cache).
 * capacity: the context's shape (zeros before the first call).
 * slot_len: tokens cached in a slot. slot_reset: empty it.
 * slot_truncate: keep its first len tokens (the next call appends at
 * len). slot_copy: the first len tokens of src's cache into dst (a
 * shared prefix computed once; dst's length becomes len).
 * FT_ERR_UNSUPPORTED: truncate or copy where the cache cannot do it (a
 * wrapped sliding-window ring; copy with an offloaded KV cache or on the
 * GPU), FT_ERR_INVALID_ARG for a slot or length out of range. */
FT_API ft_status ft_session_reserve(ft_session *s, size_t batch, size_t seq, size_t rows);
FT_API void ft_session_capacity(const ft_session *s, int *batch, int *seq, int *rows);
FT_API int ft_session_slot_len(const ft_session *s, int slot);
FT_API void ft_session_slot_reset(ft_session *s, int slot);
FT_API ft_status ft_session_slot_truncate(ft_session *s, int slot, int len);
FT_API ft_status ft_session_slot_copy(ft_session *s, int src, int dst, int len);
/* A slot's first len KV rows out (export) or in (import), as
 * ft_ctx_kv_rows: *dtype / *row_bytes describe the rows (row_bytes: one
 * position of one layer's K, or V). FT_ERR_UNSUPPORTED with an offloaded
 * KV cache or on the GPU. */
FT_API ft_status ft_session_slot_kv_layout(const ft_session *s, ft_dtype *dtype, size_t *row_bytes);
FT_API ft_status ft_session_slot_kv_rows(ft_session *s, int slot, int len, void *buf, size_t cap, int import,
                                         int rows_in_buf);

/* Text level. Each prompt is encoded with the tokenizer (its special
 * tokens added, as Hugging Face's add_special_tokens=True), generated as
 * one batch, and decoded as it goes (complete UTF-8 characters only).
 * on_text (may be NULL) receives each sequence's new text; returning
 * nonzero stops that sequence. stop (NULL/"": none): a string that ends a
 * sequence, cut from its text (stops / n_stops: more of them). out_text
 * (may be NULL): per prompt, the
 * generated text (malloc'd, NUL-terminated; free each with free()).
 * gen.on_token is called too when set. */
typedef int (*ft_text_cb)(void *user, size_t seq, const char *text, size_t len);

typedef struct ft_text_params {
    ft_gen_params gen;
    const char *stop;
    ft_text_cb on_text;
    void *user;
    /* More stop strings (n_stops of them; "" entries ignored): the text is
     * cut at the first place any of them (or `stop`) matches. */
    const char *const *stops;
    size_t n_stops;
    /* 1: encode the prompts without the tokenizer's special tokens (a
     * rendered chat template already holds them, as transformers'
     * apply_chat_template tokenizes) */
    int no_special;
} ft_text_params;

FT_API ft_status ft_session_generate_text(ft_session *s, size_t n, const char *const *prompts, const ft_text_params *p,
                                          char **out_text, ft_gen_stats *stats);

/* Metrics since open (or the last reset_stats): the weight scheduler's
 * and the KV cache offloader's (has_* = 0 when not offloaded), and the
 * phase split (decode_mark: the counters when the first token of the last
 * generate call came out). */
typedef struct ft_session_stats {
    int has_weights, has_kv;
    ft_offload_stats weights, weights_at_decode;
    ft_kv_offload_stats kv, kv_at_decode;
    uint64_t weight_bytes;     /* the model's weights as stored             */
    uint64_t kv_bytes;         /* the in-memory KV cache                    */
    ft_dtype kv_dtype;
    /* FT_DEVICE_CUDA: the GPU, its context's counters, and where the
     * weights are (streamed from pinned host memory in codec cuda_codec,
     * host_weight_bytes of it, or resident) */
    int cuda, cuda_stream;
    int cuda_sched;         /* streamed by the offloading scheduler from its
                               tiers (host, disk, memory nodes): `weights`
                               has its statistics                         */
    ft_cuda_device_info device;
    ft_cuda_stats cuda_stats;
    ft_codec_id cuda_codec;
    uint64_t host_weight_bytes;
    /* a pipeline's driver (ft_session_open_pipeline): the ring's stages,
     * the last generation's micro-batches and messages received */
    int pipe_stages, pipe_micro_batches;
    uint64_t pipe_messages;
} ft_session_stats;

/* The weight scheduler (NULL without offloading), for per-layer figures
 * such as ft_offload_expert_stats. */
FT_API const ft_offload *ft_session_offload(const ft_session *s);
FT_API void ft_session_get_stats(const ft_session *s, ft_session_stats *out);
FT_API void ft_session_reset_stats(ft_session *s);

#ifdef __cplusplus
}
#endif
#endif
