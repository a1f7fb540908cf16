/* Engine internals shared by config.c, model.c, arch_*.c, forward.c. */
#ifndef FT_ENGINE_INTERNAL_H
#define FT_ENGINE_INTERNAL_H
#include "flextier/engine.h"
#include "graph.h"

#include <errno.h>
#include <stddef.h>
#include <sys/types.h>

#define LIM_HALF_HEAD 512   /* head_dim <= 1024 (config.c) */

/* Rows [row0, row0 + n) of a 2-D checkpoint matrix of `rows` rows, or of
 * matrix `expert` of a 3-D [n_experts][rows][cols] tensor. alt: a second
 * place to look when the first is not in the checkpoint (expert < 0 and
 * name empty: none). */
typedef struct ft_src_slice {
    char name[128];
    int expert, n_experts;     /* -1, 0: a 2-D source                      */
    int rows, row0;
} ft_src_slice;

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
    /* A layer tensor stored inside another checkpoint tensor (phi3's fused
     * qkv_proj and gate_up_proj; transformers 5's stacked experts): fill
     * *s and return 1; 0: the tensor is its own (NULL: never). */
    int (*layer_src)(const ft_model_config *c, int layer, int slot, struct ft_src_slice *s);
    /* Checkpoints saved from the base model lack the task-head prefix:
     * names starting with alt_from are also tried with alt_to instead. */
    const char *alt_from, *alt_to;
} ft_arch;

extern const ft_arch ft_arch_opt;
extern const ft_arch ft_arch_llama;
extern const ft_arch ft_arch_qwen2;
extern const ft_arch ft_arch_qwen3;
extern const ft_arch ft_arch_phi3;
extern const ft_arch ft_arch_gemma2;
extern const ft_arch ft_arch_mixtral;
extern const ft_arch ft_arch_olmoe;
/* Hugging Face names shared by the Llama-like architectures (arch_llama.c).
 * ft_hf_attn_name: the name after "model.layers.<l>." of input_layernorm,
 * the q/k/v/o projections, their biases (only with attention_bias) and the
 * q/k norms (only with qk_norm); NULL for any other slot or one this config
 * lacks. ft_hf_expert_name: for an expert slot (>= LW_COUNT) of a sparse
 * layer, writes "model.layers.<l>.<block>.experts.<e>.<ex[k]>.weight" and
 * returns 1; 0 for a dense layer. */
const char *ft_hf_attn_name(const ft_model_config *c, int slot);
int ft_hf_expert_name(const ft_model_config *c, int layer, int slot, const char *block,
                      const char *const ex[3], char *b, size_t n);
/* Every slot of layer l, fixed then experts: for (s = 0; s < ft_layer_nslots(c, l); s++). */
int ft_layer_nslots(const ft_model_config *c, int layer);
const ft_arch *ft_arch_get(ft_arch_id id);

/* Shape (2 dims at most) of a slot; returns ndim. */
int ft_global_shape(const ft_model_config *c, const ft_arch *a, int slot, int64_t shape[2]);

/* Slot accessors: a matrix slot (Q, K, V, O, GATE, UP, DOWN) has an
 * ft_wmat, every other slot (norms, biases) an f32 vector. */
int ft_slot_is_matrix(int slot);
ft_wmat *ft_layer_mat(ft_layer_weights *w, int slot);        /* NULL: vector slot */
const float **ft_layer_vec(ft_layer_weights *w, int slot);   /* NULL: matrix slot */

/* A global matrix (token embeddings, LM head) left in the checkpoint file
 * and read on demand (ft_load_params.stream_globals): rows of the
 * checkpoint's dtype at byte `off` of `fd`, converted to the compute
 * format `fmt` (always plain: ft_tensor_format keeps these bf16 or the
 * requested f32/bf16/f16) exactly as a resident load converts them.
 * With dfd (the file opened O_DIRECT) the rows are read past the page
 * cache: the 4 KiB blocks that cover them, into a 4 KiB-aligned buffer
 * with FT_GSTREAM_SLACK bytes of room past the rows. */
typedef struct ft_gstream {
    int fd;
    int dfd;               /* O_DIRECT, -1: none (off, or refused at open) */
    int direct;            /* read past the page cache: dfd opened, or (a
                              layout-only model) it would be; a context
                              then reads the head's next chunk on its
                              reader thread into a second buffer */
    int direct_refused;    /* atomically set: a direct read was refused */
    /* the direct reads' pread (NULL: pread): tests inject a refusal at
     * read time (EINVAL) here; nothing else sets it */
    ssize_t (*dpread)(int fd, void *buf, size_t n, off_t off);
    uint64_t off;
    ft_dtype src;
    ft_wfmt fmt;
    int rows, cols;
    int drop_cache;        /* posix_fadvise DONTNEED after every read */
    int chunk_rows;        /* LM head rows per chunk (0: about 4 MiB) */
    uint64_t bytes_read;   /* atomically updated: several contexts may read */
} ft_gstream;

/* Rows per chunk of a streamed LM head (a multiple of 96, about 4 MiB of
 * the compute format; the whole matrix when smaller). */
int ft_gstream_chunk_rows(const ft_gstream *g);
/* Room past a chunk's rows in the buffers given to ft_gstream_read for a
 * direct read: the blocks before and after the rows. */
#define FT_GSTREAM_ALIGN 4096u
#define FT_GSTREAM_SLACK (2u * FT_GSTREAM_ALIGN)
/* Read rows [r0, r0 + n) into dst in the compute format; raw: scratch of
 * n rows in the checkpoint dtype (unused when the dtypes agree). With
 * g->dfd the buffer read into (raw, else dst) is read past the page cache
 * when FT_GSTREAM_ALIGN-aligned with FT_GSTREAM_SLACK bytes of room past
 * the n rows; otherwise (or refused) through the page cache. */
ft_status ft_gstream_read(ft_gstream *g, int r0, int n, void *dst, void *raw);
/* Ask the kernel to read rows [r0, r0 + n) ahead (the next chunk while
 * this one is computed); nothing for direct reads (the page cache is
 * not used: ft_gs_reader reads them ahead instead). */
void ft_gstream_prefetch(const ft_gstream *g, int r0, int n);
/* Whether reads of g go past the page cache now (dfd, not refused). */
int ft_gstream_direct_now(const ft_gstream *g);

/* A context's reader thread (a head read past the page cache, which has
 * no kernel read-ahead): start hands it the chunks of g (R rows each) to
 * read in order on its own, chunk k into buffer (k + 1) & 1 (buffer 0
 * stays the caller's until released: the embeddings use it), each as
 * soon as its buffer is free, so a read follows the previous one with
 * no hand-over. get waits for chunk k and gives its buffer (held by the
 * caller until released); an error of a read comes back from get with
 * its message (no read after it). stop: no read in flight after it (a
 * job not read to the end dropped). free stops and joins. */
typedef struct ft_gs_reader ft_gs_reader;
ft_status ft_gs_reader_create(ft_gs_reader **out);
void ft_gs_reader_free(ft_gs_reader *r);
void ft_gs_reader_start(ft_gs_reader *r, ft_gstream *g, int R, void *dst0, void *raw0, void *dst1, void *raw1);
int ft_gs_reader_active(const ft_gs_reader *r);
ft_status ft_gs_reader_get(ft_gs_reader *r, int k, int *b);
void ft_gs_reader_release(ft_gs_reader *r, int b);
void ft_gs_reader_stop(ft_gs_reader *r);

typedef struct ft_model_tensor_entry {
    char name[128];        /* the checkpoint's name, or for a slice an
                              id "<source>:<part>" (src has the source) */
    int sliced;            /* src is where the data is */
    ft_src_slice src;
    int layer;             /* -1 for globals */
    int slot;
    int ndim;
    int64_t shape[2];
    ft_wfmt fmt;           /* stored format (vectors: F32) */
    int group;             /* Q8/Q4: group size along the row */
    int rows_per_chunk;    /* Q8/Q4: rows per chunk in the view */
    uint32_t n_chunks;     /* Q8/Q4 */
    uint64_t bytes;        /* bytes reserved in its block (F32/BF16/F16:
                              exact; Q8/Q4: the frame bound) */
    size_t offset;         /* bytes from the start of its block */
    uint8_t *data;         /* NULL: external layer */
    uint64_t frame_size;   /* Q8/Q4: the frame's actual size once loaded */
    const uint8_t **chunks;/* Q8/Q4: chunk payload pointers (model-owned) */
    int streamed;          /* a global read on demand (no storage) */
} ft_model_tensor_entry;

struct ft_model {
    ft_model_config cfg;
    const ft_arch *arch;
    uint8_t *gbuf, *lbuf;
    size_t layer_bytes, global_bytes;
    ft_wfmt wfmt;          /* the layer matrices' requested format */
    ft_wmat g[GW_COUNT];   /* globals; vectors as F32 with rows = 1 */
    ft_layer_weights *layers;
    ft_model_tensor_entry *tensors;
    size_t n_tensors;
    uint64_t weight_bytes;
    const uint8_t **chunk_tab;  /* storage for every entry's chunks */
    ft_wmat *expert_tab;        /* MoE: [n_layers][n_experts * 3] */
    unsigned stream;            /* FT_STREAM_* asked at creation        */
    ft_gstream *gs_emb, *gs_head;  /* streamed: the embeddings, the head
                                      (the same object when tied)       */
};
/* The entry of a global slot is streamed (not held in memory). */
int ft_model_entry_streamed(const ft_model *m, const ft_model_tensor_entry *e);
ft_status ft_model_create_stream(const ft_model_config *cfg, int external_layers, ft_wfmt want, unsigned stream,
                                 ft_model **out);

/* The stored format of tensor (layer/global, slot) of a model whose
 * matrices are requested as `want` (an ft_wfmt), by ft_load_params'
 * rules; *group receives the q8/q4 group size. */
ft_wfmt ft_tensor_format(const ft_model_config *c, int is_global, int slot, int ndim,
                         const int64_t *shape, ft_wfmt want, int *group);
/* A zeroed model whose matrices are kept in format `want`. */
/* Fill an entry's view (the layer table or a global) once its data is in
 * place: Q8/Q4 entries parse their frame and set their chunk pointers. */
ft_status ft_model_bind(ft_model *m, ft_model_tensor_entry *e);
/* Store a source tensor (any float dtype, possibly unaligned) into entry
 * e's storage in e's format. cc: a codec context for q8/q4. */
ft_status ft_model_store(ft_model *m, ft_model_tensor_entry *e, const ft_tensor *src, ft_codec_ctx *cc);

/* Look a tensor up in a checkpoint by its Hugging Face name, also under
 * the architecture's alternative prefix; `used` receives the name found. */
struct ft_checkpoint;
ft_status ft_model_find_tensor(const struct ft_checkpoint *ck, const ft_arch *a, const char *name,
                               ft_tensor *t, char *used, size_t nused);
/* An entry's data in a checkpoint: its own tensor, or its slice of the
 * source tensor (the source's whole shape checked). */
ft_status ft_model_entry_tensor(const struct ft_checkpoint *ck, const ft_arch *a, const ft_model_tensor_entry *e,
                                ft_tensor *t, char *used, size_t nused);

/* ctx accessors for sample.c */
const ft_model *ft_ctx_model(const ft_ctx *c);
int ft_ctx_max_seq(const ft_ctx *c);
int ft_ctx_max_batch(const ft_ctx *c);



#endif
