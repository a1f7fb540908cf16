/*
 * flextier/pipe.h - a model pipelined across processes and machines
 * (FlexGen's distributed mode; docs/pipeline.md).
 *
 * The model's layers are cut into S stages of contiguous layers, one per
 * process (usually one per machine). Stage 0 holds the embeddings and
 * layers [0, l1); stage S-1, the driver, holds the last layers, the final
 * norm and the LM head, samples, and feeds the next tokens back to stage 0.
 * Every stage loads only what it computes (its layers, and its end of the
 * model), through the offloading scheduler, so a stage may itself stream
 * its layers from other tiers (its own policy).
 *
 * The stages form a ring: a message goes from stage i to stage i+1, and
 * from the driver to stage 0. The sequences of a batch are split into
 * micro-batches that circulate independently, so with at least S of them
 * every stage computes while the others do (a decode step of micro-batch m
 * at stage i overlaps the step of m+1 at stage i-1). Activations travel as
 * f32 hidden states, tokens as ids; the logits stay with the driver.
 *
 * Transports (ft_pipe_link): in-process queues (tests), UCX tag messages
 * (RDMA, or TCP on a network named trusted), MPI (under mpirun; the CLI's
 * build with Open MPI). Workers are `flextier worker` processes that a
 * driver configures over an authenticated TCP connection (the memory
 * node's challenge-response), or ranks of one mpirun.
 *
 * The output equals the single-process engine's bit for bit when each
 * micro-batch is one forward call there too (the engine's kernels choose
 * their form by the number of rows of a call; with one micro-batch the
 * pipeline equals ft_generate over the whole batch).
 */
#ifndef FLEXTIER_PIPE_H
#define FLEXTIER_PIPE_H

#include "flextier/engine.h"
#include "flextier/offload.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FT_PIPE_MAX_STAGES 16
#define FT_PIPE_PATH_MAX 1024

/* ------------------------------------------------------------- transport */

/* A participant's view of the ring: send to the next stage, receive from
 * the previous one. send copies the message (it returns before delivery;
 * the buffer may be reused at once); recv blocks until a whole message is
 * in buf (FT_ERR_BUFFER_SMALL if it is larger than cap: the link is then
 * unusable), until timeout_ms (< 0: none; FT_ERR_TIMEOUT), or until the
 * transport fails (FT_ERR_NET). */
typedef struct ft_pipe_link ft_pipe_link;
typedef struct ft_pipe_link_ops {
    const char *name;    /* "local", "ucx", "mpi" */
    ft_status (*send)(ft_pipe_link *l, const void *buf, size_t len);
    ft_status (*recv)(ft_pipe_link *l, void *buf, size_t cap, size_t *len, int timeout_ms);
    /* waits for sends in flight (up to a few seconds), then frees */
    void (*close)(ft_pipe_link *l);
} ft_pipe_link_ops;
struct ft_pipe_link {
    const ft_pipe_link_ops *ops;
};
FT_API void ft_pipe_link_close(ft_pipe_link *l);   /* NULL ok */

/* In-process ring of n participants (threads): links[i] sends to
 * (i + 1) % n and receives from (i - 1 + n) % n. */
FT_API ft_status ft_pipe_local_ring(int n, ft_pipe_link **links);

/* UCX: a link over tag messages (ucp_tag_send/recv). Create, publish
 * ft_pipe_ucx_address, then connect to the next stage's address. tag: a
 * job id both ends use. trusted_tcp: UCX may use its TCP transport (it
 * trusts every peer that reaches it: only on a network named trusted);
 * else RDMA only. devices: UCX_NET_DEVICES for this context (the rail
 * towards the other stages; NULL or "": UCX's choice). watch_fd >= 0: a
 * socket whose closing (the driver's control connection) fails recv. */
FT_API ft_status ft_pipe_ucx_create(uint64_t tag, int trusted_tcp, const char *devices, ft_pipe_link **out);
FT_API ft_status ft_pipe_ucx_address(ft_pipe_link *l, void *buf, size_t cap, size_t *len);
FT_API ft_status ft_pipe_ucx_connect(ft_pipe_link *l, const void *next_addr, size_t len);
FT_API void ft_pipe_ucx_watch(ft_pipe_link *l, int fd);

/* ----------------------------------------------------------------- stage */

/* What a stage computes and how (one per process). */
typedef struct ft_pipe_stage_params {
    char model_dir[FT_PIPE_PATH_MAX];
    int stage, n_stages;         /* 0 <= stage < n_stages <= FT_PIPE_MAX_STAGES */
    int l0, l1;                  /* its layers [l0, l1)                      */
    int max_batch, max_seq, max_rows;   /* the context (all micro-batches)   */
    unsigned threads;            /* compute threads (0: ft_default_threads)  */
    int weights;                 /* ft_load_params.weights                   */
    int kv_dtype;                /* ft_dtype of its in-memory KV cache       */
    unsigned config_flags;       /* FT_CONFIG_STRICT                         */
    char policy[512];            /* its own weight offloading (compact policy;
                                    "": every layer it holds in memory). The
                                    KV cache stays in memory (c=100).        */
    uint64_t job;                /* id of the run (UCX tag)                  */
} ft_pipe_stage_params;

FT_API void ft_pipe_stage_default(ft_pipe_stage_params *p);
/* Layer boundaries of an equal split: bounds[i] .. bounds[i+1] for stage i
 * (the first stages take one more layer when they do not divide). */
FT_API void ft_pipe_split_layers(int n_layers, int n_stages, int *bounds);
/* Text form sent to a worker ("key=value" lines) and its strict parser
 * (every key known and present once, values in range; FT_ERR_PROTOCOL
 * naming the field otherwise). */
FT_API ft_status ft_pipe_stage_format(const ft_pipe_stage_params *p, char *buf, size_t cap, size_t *len);
FT_API ft_status ft_pipe_stage_parse(const char *text, size_t len, ft_pipe_stage_params *out);

typedef struct ft_pipe_stage ft_pipe_stage;
/* Load the stage's part of the model: its layers through the offloading
 * scheduler (its policy; all in memory by default), the embeddings on
 * stage 0, the final norm and LM head on the last; what it does not use of
 * the model's global tensors is given back to the kernel. off: offloading
 * parameters for its policy (token file, decode threads; NULL: defaults). */
FT_API ft_status ft_pipe_stage_create(const ft_pipe_stage_params *p, const ft_offload_params *off, ft_pipe_stage **out);
FT_API void ft_pipe_stage_free(ft_pipe_stage *s);
FT_API const ft_model_config *ft_pipe_stage_config(const ft_pipe_stage *s);
/* The offloading scheduler of its layers (stats), NULL if none. */
FT_API ft_offload *ft_pipe_stage_offload(ft_pipe_stage *s);
/* Its model (the stage's layers only are present) and parameters. */
FT_API ft_model *ft_pipe_stage_model(ft_pipe_stage *s);
FT_API const ft_pipe_stage_params *ft_pipe_stage_get_params(const ft_pipe_stage *s);
/* Bytes of its in-memory KV cache (its layers only). */
FT_API uint64_t ft_pipe_stage_kv_bytes(const ft_pipe_stage *s);

/* A worker (stage < n_stages - 1): receive, compute, pass on, until the
 * driver ends the run (or a transport error). */
FT_API ft_status ft_pipe_worker_run(ft_pipe_stage *s, ft_pipe_link *link);

/* ---------------------------------------------------------------- driver */

typedef struct ft_pipe_gen_opts {
    int micro_batches;           /* 0: as many as stages (at most n)       */
    int timeout_ms;              /* per message from the ring; <= 0: none  */
    /* every logits row the driver samples from: sequence, its step (0:
     * the prompt's last token), vocab floats */
    void (*on_logits)(void *user, size_t seq, size_t step, const float *logits);
    void *user;
} ft_pipe_gen_opts;

typedef struct ft_pipe_gen_stats {
    ft_gen_stats gen;            /* prefill: until every micro-batch has
                                    its first token; decode: the rest     */
    double wall_s;               /* the whole generation                  */
    uint64_t messages;           /* received by the driver                */
    int micro_batches;
} ft_pipe_gen_stats;

/* ft_generate over the pipeline: the driver is stage s (the last, created
 * with n_stages = the ring's size; with n_stages 1 it runs alone and link
 * may be NULL). Same arguments, sampling and results as ft_generate
 * (per-sequence random state included). */
FT_API ft_status ft_pipe_generate(ft_pipe_stage *s, ft_pipe_link *link, size_t n, const int32_t *const *prompts,
                           const size_t *prompt_len, const ft_gen_params *gp, const ft_pipe_gen_opts *po,
                           int32_t *const *out, size_t *n_out, ft_pipe_gen_stats *stats);
/* End the run: every worker finishes (the end message comes back around
 * the ring; up to timeout_ms). */
FT_API ft_status ft_pipe_end(ft_pipe_stage *s, ft_pipe_link *link, int timeout_ms);

/* ------------------------------------------------------- flextier worker */

/* `flextier worker`: listens on one TCP port (HOST:PORT), authenticates
 * each driver with the token (as the memory node does), takes its job
 * (stage parameters), builds the stage and its UCX link, then runs it;
 * one driver at a time, until *stop. */
typedef struct ft_worker_params {
    const char *listen;          /* "HOST:PORT"; port 0 = any (printed)    */
    const char *token_file;      /* required unless the address is loopback */
    int trusted_network;         /* UCX may use TCP (the lab, no RDMA)     */
    int once;                    /* exit after one job                     */
    const ft_offload_params *off;/* for the stage's own offloading         */
    /* What a job may name (a job is data, not configuration): models only
     * under models_dir (NULL: none is served); memory nodes (policy
     * remote=) only those in remotes, disk directories (policy disk=
     * file:DIR) only those in disks; anything else refuses the job. */
    const char *models_dir;
    const char *const *remotes;
    int n_remotes;
    const char *const *disks;
    int n_disks;
    volatile int *stop;
    void (*on_ready)(void *arg, const char *bound);
    void *arg;
} ft_worker_params;
FT_API ft_status ft_worker_run(const ft_worker_params *p);

/* The driver's side: connect to the workers (URIs "HOST:PORT", stage i =
 * workers[i]), authenticate, hand each its stage parameters (params[i]),
 * and build the ring of UCX links with the driver as the last stage.
 * *link: the driver's end (close it after ft_pipe_end). */
typedef struct ft_pipe_remote ft_pipe_remote;
FT_API ft_status ft_pipe_connect(const char *const *workers, int n_workers, const ft_pipe_stage_params *params,
                          const char *token_file, int trusted_network, uint64_t job, ft_pipe_link **link,
                          ft_pipe_remote **out);
FT_API void ft_pipe_disconnect(ft_pipe_remote *r);

#ifdef __cplusplus
}
#endif
#endif
