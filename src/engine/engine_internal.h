/* Engine internals shared by config.c, model.c, arch_*.c, forward.c. */
#ifndef FT_ENGINE_INTERNAL_H
#define FT_ENGINE_INTERNAL_H
#include "flextier/engine.h"

#include <errno.h>
#include <stddef.h>

#define LIM_HALF_HEAD 512   /* head_dim <= 1024 (config.c) */

/* Per-layer weight slots, in the field order of ft_layer_weights. */
enum {
    LW_NORM1_W, LW_NORM1_B, LW_Q, LW_QB, LW_K, LW_KB, LW_V, LW_VB, LW_O, LW_OB,
    LW_NORM2_W, LW_NORM2_B, LW_GATE, LW_GATE_B, LW_UP, LW_UP_B, LW_DOWN, LW_DOWN_B,
    LW_COUNT
};
/* Model-wide weight slots. */
enum {
    GW_TOK_EMB, GW_POS_EMB, GW_PROJ_IN, GW_PROJ_OUT, GW_FINAL_NORM_W, GW_FINAL_NORM_B,
    GW_LM_HEAD, GW_COUNT
};

enum { FT_NORM_LAYER = 0, FT_NORM_RMS = 1 };
enum { FT_POS_LEARNED = 0, FT_POS_ROPE = 1 };
enum { FT_FFN_RELU = 0, FT_FFN_SWIGLU = 1 };

/* An architecture: which building blocks it uses and what its tensors are
 * called. Everything else (shapes, the forward pass) is shared. A third
 * architecture is one more table like these. */
typedef struct ft_arch {
    ft_arch_id id;
    const char *name;
    int norm, pos, ffn;
    int pos_offset;        /* learned positions: row = position + offset */
    /* Write the Hugging Face name of a global / layer tensor into buf and
     * return 1, or return 0 if this config has no such tensor. */
    int (*global_name)(const ft_model_config *c, int slot, char *buf, size_t n);
    int (*layer_name)(const ft_model_config *c, int layer, int slot, char *buf, size_t n);
    /* Checkpoints saved from the base model lack the task-head prefix:
     * names starting with alt_from are also tried with alt_to instead. */
    const char *alt_from, *alt_to;
} ft_arch;

extern const ft_arch ft_arch_opt;
extern const ft_arch ft_arch_llama;
extern const ft_arch ft_arch_qwen2;
const ft_arch *ft_arch_get(ft_arch_id id);

/* Shape (2 dims at most) of a slot; returns ndim. */
int ft_global_shape(const ft_model_config *c, const ft_arch *a, int slot, int64_t shape[2]);
int ft_layer_shape(const ft_model_config *c, int slot, int64_t shape[2]);

const float **ft_layer_slot(ft_layer_weights *w, int slot);

typedef struct ft_model_tensor_entry {
    char name[128];
    int layer;             /* -1 for globals */
    int slot;
    int ndim;
    int64_t shape[2];
    size_t offset;         /* floats from the start of its buffer (layer block) */
    float *data;
} ft_model_tensor_entry;

struct ft_model {
    ft_model_config cfg;
    const ft_arch *arch;
    float *gbuf, *lbuf;
    size_t layer_floats;
    const float *g[GW_COUNT];
    ft_layer_weights *layers;
    ft_model_tensor_entry *tensors;
    size_t n_tensors;
    uint64_t weight_bytes;
};

/* Look a tensor up in a checkpoint by its Hugging Face name, also under
 * the architecture's alternative prefix; `used` receives the name found. */
struct ft_checkpoint;
ft_status ft_model_find_tensor(const struct ft_checkpoint *ck, const ft_arch *a, const char *name,
                               ft_tensor *t, char *used, size_t nused);

/* ctx accessors for sample.c */
const ft_model *ft_ctx_model(const ft_ctx *c);
int ft_ctx_max_seq(const ft_ctx *c);
int ft_ctx_max_batch(const ft_ctx *c);

/* RoPE inverse frequencies (head_dim/2 of them), with llama3 scaling, in
 * f32 exactly as transformers computes them (forward.c; the CUDA backend
 * builds its tables from the same function). */
void ft_rope_inv_freq(const ft_model_config *cfg, float *inv, int half);
/* cos/sin tables [npos][head_dim/2] from those frequencies, times yarn's
 * attention factor (the CPU and CUDA contexts both build theirs here). */
void ft_rope_tables(const ft_model_config *cfg, size_t npos, float *cos, float *sin);
/* The smallest attention window of any layer (0: none). */
int ft_config_min_window(const ft_model_config *cfg);

#endif
