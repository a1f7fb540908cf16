/* Internal to src/pipe. */
#ifndef FT_PIPE_INTERNAL_H
#define FT_PIPE_INTERNAL_H
#include "flextier/pipe.h"
#include "pipe_msg.h"

struct ft_pipe_stage {
    ft_pipe_stage_params p;
    ft_model *m;
    ft_offload *off;
    ft_ctx *ctx;
    ft_pipe_limits lim;
    size_t cap;                 /* largest message                         */
    uint8_t *in, *out;          /* message buffers (64-byte aligned)       */
    int *slots;                 /* a message's sequences, unpacked         */
    size_t *ntok;
    const int32_t **tokp;
    int32_t *tok;
    uint64_t sent, received;    /* message numbers on the ring             */
};

void ft_pipe_stage_unpack(ft_pipe_stage *s, const ft_pipe_msg *m);

/* A job is data, not configuration (worker_job.c): refuse a job whose
 * model is not under the worker's models_dir (one error for "not allowed"
 * and "not found"), or whose policy names a memory node or disk directory
 * that the worker's command line did not give. On success sp->model_dir is
 * the resolved path under models_dir. FT_ERR_AUTH otherwise. */
FT_API ft_status ft_worker_job_check(const ft_worker_params *p, ft_pipe_stage_params *sp);
#endif
