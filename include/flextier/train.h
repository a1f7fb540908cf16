/* LoRA fine-tuning (the train layer, src/train; docs/training.md).
 *
 * The base model's weights stay frozen in their stored format (f32, bf16,
 * q8, q4: the engine's products run on them as they are); only LoRA
 * adapters (rank r, scale alpha / r, on the projections PEFT names:
 * q_proj k_proj v_proj o_proj gate_proj up_proj down_proj; OPT's out_proj
 * fc1 fc2; phi3's qkv_proj gate_up_proj) are trained,
 * in f32, with AdamW (PyTorch's update), warmup + cosine / linear decay,
 * gradient accumulation and clipping by the global norm. The backward pass
 * recomputes each layer's forward (per-layer activation checkpointing):
 * memory is the layers' inputs plus one layer's activations.
 *
 * Architectures: llama, mistral, qwen2, qwen3, phi3 (fused projections),
 * gemma2, gemma3_text, opt (pre- and post-LN), and the mixtures of experts mixtral,
 * qwen3_moe, olmoe (LoRA on attention and, as PEFT's target_parameters, on
 * the experts' fused gate_up_proj / down_proj), with the model's layers in
 * memory or given by a layer function (streamed by the offloading
 * scheduler both ways), activations recomputed or saved through a store,
 * on the CPU (threads over the products, the transposed products and
 * attention heads); several processes with ft_trainer_step_dp. Everything
 * else (qwen2_moe, the router, transformers 4's per-expert modules, ...)
 * is refused with FT_ERR_UNSUPPORTED and a message naming what. */
#ifndef FLEXTIER_TRAIN_H
#define FLEXTIER_TRAIN_H
#include "flextier/engine.h"
#include "flextier/model.h"
#include "flextier/chat.h"
#include "flextier/codec.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Target modules (PEFT names), a bit mask: the llama family's, then
 * OPT's out_proj, fc1, fc2 (q/k/v_proj are shared), phi3's qkv_proj and
 * gate_up_proj (o_proj, down_proj shared), then the experts of the
 * mixtures of experts (transformers 5's fused expert parameters, PEFT's
 * target_parameters gate_up_proj and down_proj: "experts.gate_up_proj",
 * "experts.down_proj"; on an MoE model gate_up_proj and down_proj mean
 * these). FT_LORA_ALL ("all") means every projection of the model's
 * family (MoE: q/k/v/o and the experts). */
enum {
    FT_LORA_Q = 1, FT_LORA_K = 2, FT_LORA_V = 4, FT_LORA_O = 8,
    FT_LORA_GATE = 16, FT_LORA_UP = 32, FT_LORA_DOWN = 64,
    FT_LORA_ALL = 127,
    FT_LORA_OUT = 128, FT_LORA_FC1 = 256, FT_LORA_FC2 = 512,
    FT_LORA_QKV = 1024, FT_LORA_GATE_UP = 2048,   /* phi3's fused projections */
    FT_LORA_EXP_GATE_UP = 4096, FT_LORA_EXP_DOWN = 8192,   /* the MoE experts' (target_parameters) */
    FT_LORA_ANY = 16383
};
/* "q_proj" -> FT_LORA_Q; 0 if unknown. */
FT_API unsigned ft_lora_target_bit(const char *name);
/* A comma-separated list ("q_proj,v_proj" or "all") into a mask; FT_ERR_INVALID_ARG
 * naming the unknown entry. */
FT_API ft_status ft_lora_parse_targets(const char *list, unsigned *mask);

typedef enum ft_lr_schedule { FT_SCHED_COSINE = 0, FT_SCHED_LINEAR = 1, FT_SCHED_CONSTANT = 2 } ft_lr_schedule;

typedef struct ft_train_params {
    int rank;                 /* LoRA r (default 8)                              */
    float alpha;              /* lora_alpha (default 16); scale = alpha / r      */
    float dropout;            /* lora_dropout in [0, 1) (default 0): PEFT's, on
                                 the adapter's input, masks from the seed      */
    unsigned targets;         /* FT_LORA_* mask (default FT_LORA_ALL)           */
    float lr;                 /* peak learning rate (default 2e-4)              */
    float beta1, beta2, eps;  /* AdamW (0.9, 0.999, 1e-8)                       */
    float weight_decay;       /* decoupled (default 0.01)                       */
    float clip;               /* max global gradient norm; 0: no clipping (1.0)  */
    int warmup;               /* linear warmup steps (default 0)                */
    int total_steps;          /* for the decay (required, >= 1)                 */
    ft_lr_schedule schedule;  /* default cosine                                 */
    int grad_accum;           /* micro-batches per optimizer step (default 1)   */
    uint64_t seed;            /* adapter initialisation (default 0)             */
    int vocab_chunk;          /* LM-head rows per cross-entropy chunk (4096)    */
    unsigned threads;         /* 0: every core (FLEXTIER_THREADS); results do
                                 not depend on it (tested)                     */
    /* Base weights not in memory (a model loaded with external layers,
     * streamed by the offloading scheduler): before computing layer l the
     * trainer calls layer_fn(layer_user, l, next, w), which fills w with
     * layer l's weights (valid until the next call) and may read layer
     * `next` ahead (-1: none). The forward walks 0..L-1, the backward
     * L-1..0, so next follows the direction of travel. ft_offload_fetch
     * (flextier/offload.h) over an ft_offload is such a function.
     * NULL: the model's layers are in memory. */
    ft_status (*layer_fn)(void *user, int layer, int next, ft_layer_weights *w);
    void *layer_user;
    /* Saved activations instead of recomputing (docs/training.md):
     * act_uri NULL: each layer's forward is recomputed in the backward
     * (per-layer checkpointing, the default); else a store URI (mem:,
     * file:DIR, ucx://HOST:PORT, flextier/store.h) into which the forward
     * writes each layer's activations with ft_write_tensor, encoded with
     * act_codec (FT_CODEC_BYTEPLANE: lossless, the default 0 means it too;
     * FT_CODEC_RAW; FT_CODEC_Q8: lossy, groups of 64), read back by the
     * backward. Lossless codecs give the recompute run's results bit for
     * bit. act_token_file: the memory node's secret (NULL: the
     * environment's). */
    const char *act_uri;
    int act_codec;
    const char *act_token_file;
} ft_train_params;

FT_API void ft_train_params_default(ft_train_params *p);

/* Bytes a trainer over a model of this configuration holds for batch x
 * seq tokens beside the model (adapters, gradients and AdamW moments, the
 * layers' inputs, one layer's activations, the cross-entropy's chunk and
 * the transposed-matrix scratch; saved activations in a mem: store are
 * not counted: they depend on the codec). For memory budgets. */
FT_API uint64_t ft_trainer_memory(const ft_model_config *c, const ft_train_params *p, int batch, int seq);


typedef struct ft_trainer ft_trainer;

/* Saved activations' traffic since creation: bytes as computed (f32) and
 * as stored (frames), and seconds spent writing and reading. */
typedef struct ft_train_act_stats {
    uint64_t raw_bytes, stored_bytes;
    double write_s, read_s;
} ft_train_act_stats;
FT_API void ft_trainer_act_stats(const ft_trainer *t, ft_train_act_stats *out);

/* A trainer over a loaded model (which must outlive it). The adapters are
 * initialised as PEFT does: lora_A kaiming-uniform(a = sqrt(5)), i.e.
 * uniform(-1/sqrt(in), 1/sqrt(in)), from the seed; lora_B zeros. */
FT_API ft_status ft_trainer_create(const ft_model *m, const ft_train_params *p, ft_trainer **out);
FT_API void ft_trainer_free(ft_trainer *t);      /* NULL ok */

/* Replace the adapters by a PEFT adapter directory's (adapter_config.json
 * + adapter_model.safetensors, f32): its r, alpha and targets must equal
 * the trainer's (FT_ERR_INVALID_ARG naming the difference). */
FT_API ft_status ft_trainer_load_adapter(ft_trainer *t, const char *dir);
/* Read a PEFT adapter directory's adapter_config.json into p's rank,
 * alpha and targets (the rest of p is left as it is); what is not
 * implemented (DoRA, rsLoRA, other modules, patterns) is refused. */
FT_API ft_status ft_lora_read_config(const char *dir, ft_train_params *p);
/* Write the adapters in PEFT's format into dir (created if missing). */
FT_API ft_status ft_trainer_save_adapter(const ft_trainer *t, const char *dir, const char *base_model);

/* The whole training state (adapters, AdamW moments, steps taken) as one
 * safetensors file, and back: a run resumed from it continues bit for bit
 * as the uninterrupted run (same data order given). The file must come
 * from a trainer of the same rank, alpha and targets. */
FT_API ft_status ft_trainer_save_state(const ft_trainer *t, const char *path);
FT_API ft_status ft_trainer_load_state(ft_trainer *t, const char *path);

/* One optimizer step over grad_accum micro-batches: tokens holds
 * grad_accum * batch * seq ids, micro-batch a at a * batch * seq, each
 * sequence's position i predicting its token i + 1 (labels = inputs, as
 * transformers' causal-LM loss). *loss: the mean of the micro-batches'
 * mean losses; *grad_norm: the global norm before clipping (NULL ok). */
FT_API ft_status ft_trainer_step(ft_trainer *t, const int32_t *tokens, int batch, int seq, double *loss,
                                 double *grad_norm);
/* Data-parallel steps (docs/training.md): size processes (ranks), each
 * with its own trainer over the same model, options and adapter, call
 * ft_trainer_step_dp with the same global batch (grad_accum micro-batches,
 * as ft_trainer_step). Rank k computes micro-batches
 * [k A / size, (k + 1) A / size) (A = grad_accum >= size); the gradient
 * is the left fold ((g_0 + g_1) + g_2) + ... of the micro-batches'
 * gradients, carried from rank to rank in rank order and then sent by the
 * last rank to all: every rank gets the same sum, bit for bit that of
 * ft_trainer_step in one process (which folds the same way), whatever
 * size is. send / recv move len bytes to / from a rank, blocking, in
 * order per pair of ranks (MPI_Send / MPI_Recv); a rank whose micro-batch
 * fails passes the failure on, so every rank returns an error. */
typedef struct ft_train_comm {
    int rank, size;
    void *user;
    ft_status (*send)(void *user, int to, const void *buf, size_t len);
    ft_status (*recv)(void *user, int from, void *buf, size_t len);
} ft_train_comm;
FT_API ft_status ft_trainer_step_dp(ft_trainer *t, const ft_train_comm *comm, const int32_t *tokens, int batch,
                                    int seq, double *loss, double *grad_norm);
/* An ft_train_comm over TCP between processes and machines, no MPI
 * (docs/training.md, "Over TCP"): rank k listens on peers[k] through the
 * front door of the memory node (mutual HMAC over the token; the token
 * never crosses the wire; without a token every address must be loopback
 * unless insecure), connects to the ranks below it and is connected to by
 * those above; then the door closes. Each rank checks the others' size,
 * job and max_msg (a run started with other options or data is refused).
 * Messages are framed and length-checked (at most max_msg bytes each);
 * a thread per process reads every connection and sends a heartbeat on
 * quiet ones, so a peer that dies, ends its connection or is silent for
 * timeout_ms (a stopped process, a cut link) fails every rank's next
 * send or recv with FT_ERR_NET / FT_ERR_TIMEOUT naming it, and the failure
 * is passed on to the other ranks (never a hang). Startup waits up to
 * timeout_ms for the peers to join. */
typedef struct ft_train_tcp_params {
    int rank, size;             /* this process, of size (1..256)                 */
    const char *const *peers;   /* size "HOST:PORT" (port 1..65535)               */
    const char *token_file;     /* the ranks' shared token (NULL: none)           */
    int insecure;               /* no token: allow non-loopback addresses         */
    int timeout_ms;             /* 0: 60000                                       */
    uint64_t job;               /* every rank's must be equal (0 too)             */
    size_t max_msg;             /* the largest message (0: 1 GiB)                 */
} ft_train_tcp_params;
FT_API ft_status ft_train_tcp_open(const ft_train_tcp_params *p, ft_train_comm **out);
/* End: why = FT_OK sends every peer BYE and waits (up to 5 s) for the
 * peers to have read what was sent; otherwise ERR with ft_last_error()'s
 * text. NULL is fine. */
FT_API void ft_train_tcp_close(ft_train_comm *comm, ft_status why);
/* The summed token loss of batch sequences (no update) and the number of
 * predicted tokens: perplexity = exp(sum / n) over a held-out set. */
FT_API ft_status ft_trainer_eval(ft_trainer *t, const int32_t *tokens, int batch, int seq, double *loss_sum,
                                 int64_t *n_tokens);
/* Logits of the last position of one sequence (vocab floats), with the
 * adapters applied: y = W x + (alpha / r) B (A x). For `run --lora`. */
FT_API ft_status ft_trainer_last_logits(ft_trainer *t, const int32_t *tokens, int n, float *logits);
/* JSONL training data: calls fn(user, text, len) for the "text" string of
 * each non-blank line's object, in order (len bytes, no NUL inside: JSON
 * strings holding \u0000 are refused by the NUL check on the input, and
 * text is NUL-terminated). FT_ERR_CORRUPT naming `what` and the line for
 * a line that is not an object with a string "text" (or has trailing
 * bytes), or for no documents; FT_ERR_UNSUPPORTED for chat "messages";
 * a status other than FT_OK from fn stops and is returned. */
typedef ft_status (*ft_train_text_fn)(void *user, const char *text, size_t len);
FT_API ft_status ft_train_jsonl_each(const char *data, size_t len, const char *what, ft_train_text_fn fn, void *user);

/* A PEFT LoRA adapter directory read for inference or merging (any
 * architecture: the tensors name the modules): every adapted module's
 * Hugging Face path ("model.layers.0.self_attn.q_proj", from the keys
 * base_model.model.<module>.lora_A.weight / .lora_B.weight) with A
 * [rank][in] and B [out][rank] as f32 (f32, bf16 or f16 in the file);
 * scale = lora_alpha / r, as PEFT's scaling. What the reader does not
 * implement (DoRA, rsLoRA, rank/alpha patterns, bias, modules_to_save,
 * embedding adapters, other tensors) is refused naming it. */
typedef struct ft_peft_module {
    char module[256];
    int rank, in, out;
    float *A, *B;
    int experts;   /* > 0: LoRA on an MoE layer's fused expert parameter (PEFT's target_parameters;
                      module "model.layers.L.mlp.experts"): A [experts rank][in], B [out][experts rank] */
} ft_peft_module;
typedef struct ft_peft_adapter {
    int rank;
    float alpha, scale;
    size_t n;
    ft_peft_module *mods;
} ft_peft_adapter;
FT_API ft_status ft_peft_adapter_read(const char *dir, ft_peft_adapter **out);
FT_API void ft_peft_adapter_free(ft_peft_adapter *a);      /* NULL ok */
/* Add a's modules to an engine adapter set (flextier/engine.h, ft_lora)
 * with scale (alpha / r) * user_scale (PEFT's set_scale); a module the
 * model does not have, or of another shape, is refused. */
FT_API ft_status ft_peft_adapter_apply(const ft_peft_adapter *a, float user_scale, ft_lora *l);

/* Merge n PEFT adapters (each with its user scale, as
 * ft_peft_adapter_apply) into the Hugging Face checkpoint of model_dir:
 * W' = W + sum_k scale_k (alpha_k / r_k) B_k A_k, computed in f32 (PEFT's
 * merge_and_unload), written to out_dir/model.safetensors (one file,
 * streamed: one tensor in memory at a time) in dtype (FT_F32, FT_BF16,
 * FT_F16; -1: each tensor's own), with the directory's other files
 * (config.json, its torch_dtype set to dtype; tokenizer, generation and
 * chat-template files) copied. An adapter module without a weight of its
 * shape in the checkpoint is an error (nothing is left behind). */
FT_API ft_status ft_lora_merge_checkpoint(const char *model_dir, const char *const *adapters, const float *scales,
                                          size_t n, const char *out_dir, int dtype);

/* The same reader with chat lines: a line {"messages": [...]} (without
 * "text") calls chat(user, messages, line) with the messages as a JSON
 * array (a non-empty list of objects with a string "role", one of them
 * "assistant": FT_ERR_CORRUPT naming the line otherwise). chat NULL: such
 * lines are FT_ERR_UNSUPPORTED (ft_train_jsonl_each). */
typedef ft_status (*ft_train_chat_fn)(void *user, const char *messages_json, size_t line);
FT_API ft_status ft_train_jsonl_each_ex(const char *data, size_t len, const char *what, ft_train_text_fn fn,
                                        ft_train_chat_fn chat, void *user);
/* A conversation rendered with a chat template and tokenized, with a label
 * mask: mask[i] = 1 where token i is part of an assistant turn (the loss is
 * taken on those only). An assistant message i's turn is the text that
 * rendering messages[:i+1] adds to rendering messages[:i] with the
 * generation prompt (its content and the template's end of turn); the
 * whole conversation's rendering must start with both (else
 * FT_ERR_UNSUPPORTED: the template does not render prefix by prefix). The
 * text is tokenized in pieces at the turns' edges, without the tokenizer's
 * special tokens (the template writes them), so that every token is all
 * in or all out of a turn. ids and mask: malloc'd, n of them. */
FT_API ft_status ft_train_chat_tokens(const ft_chat_template *tpl, const ft_tokenizer *tok, const char *messages_json,
                                      int32_t **ids, uint8_t **mask, size_t *n);
/* A training data file as `flextier finetune` reads it: plain text (one
 * document, the tokenizer's special tokens added), or JSONL when the path
 * ends in .jsonl (ft_train_jsonl_each_ex: {"text"} documents each followed
 * by the model's first EOS; {"messages"} conversations rendered with the
 * chat template of chat_template_file, else of model_dir, their assistant
 * turns labelled: ft_train_chat_tokens). ids: n token ids; mask: n label
 * flags (all 1 without chat lines); chat: some line was a conversation;
 * labels: the flags set. Free with ft_train_data_free. */
typedef struct ft_train_data {
    int32_t *ids;
    uint8_t *mask;
    size_t n, labels;
    int chat;
} ft_train_data;
FT_API ft_status ft_train_data_load(const char *path, const ft_tokenizer *tok, const ft_model_config *cfg,
                                    const char *model_dir, const char *chat_template_file, ft_train_data *out);
FT_API void ft_train_data_free(ft_train_data *d);

/* ft_trainer_step / ft_trainer_eval with a label mask (mask[i] for
 * tokens[i], same layout): position i predicting token i + 1 counts only
 * where mask[i + 1] != 0 (transformers' labels = -100 elsewhere); the
 * mean is over the counted positions of each micro-batch. A micro-batch
 * with no counted position adds no gradient and no loss (the step's loss
 * is the mean over the micro-batches that have some; FT_ERR_INVALID_ARG
 * when none of the step's has). mask NULL: every position counts. */
FT_API ft_status ft_trainer_step_masked(ft_trainer *t, const int32_t *tokens, const uint8_t *mask, int batch, int seq,
                                        double *loss, double *grad_norm);
FT_API ft_status ft_trainer_eval_masked(ft_trainer *t, const int32_t *tokens, const uint8_t *mask, int batch, int seq,
                                        double *loss_sum, int64_t *n_tokens);
/* Both: ft_trainer_step_dp with a label mask (each rank passes the whole
 * global batch's tokens and mask, as ft_trainer_step_dp takes them). */
FT_API ft_status ft_trainer_step_dp_masked(ft_trainer *t, const ft_train_comm *comm, const int32_t *tokens,
                                           const uint8_t *mask, int batch, int seq, double *loss, double *grad_norm);

/* Greedy decoding with the adapters applied and a K/V cache (one row per
 * position): max_new token ids into out. n + max_new <= the context. */
FT_API ft_status ft_trainer_generate(ft_trainer *t, const int32_t *prompt, int n, int max_new, int32_t *out);
/* The learning rate of optimizer step s (0-based). */
FT_API double ft_trainer_lr_at(const ft_trainer *t, int s);
/* Steps taken; the number of trainable parameters. */
FT_API int ft_trainer_steps(const ft_trainer *t);
FT_API size_t ft_trainer_param_count(const ft_trainer *t);

#ifdef __cplusplus
}
#endif
#endif
