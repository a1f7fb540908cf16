/* Internal to the CLI: the pipeline options of `run` and `bench run`
 * (pipe_opts.c, docs/pipeline.md). */
#ifndef FT_CLI_PIPE_OPTS_H
#define FT_CLI_PIPE_OPTS_H
#include "flextier/pipe.h"
#include "session_opts.h"
#include <pthread.h>
#include <stdio.h>

enum { FT_PIPE_OFF = 0, FT_PIPE_LOCAL, FT_PIPE_REMOTE, FT_PIPE_MPI };

typedef struct ft_cli_pipe {
    int mode;                        /* FT_PIPE_*                           */
    int n_stages;
    const char *workers[FT_PIPE_MAX_STAGES];
    char wbuf[4096];
    int n_workers;
    const char *token_file;          /* the workers' token                  */
    int trusted;                     /* UCX over TCP between the stages     */
    int micro;                       /* micro-batches (0: one per stage)    */
    int counts[FT_PIPE_MAX_STAGES];  /* --stage-layers (0: an equal split)  */
    int n_counts;
    int mpi_transport;               /* MPI mode: 1 MPI messages, 0 UCX     */
    /* running */
    int rank;
    int bounds[FT_PIPE_MAX_STAGES + 1];
    ft_pipe_stage *stage;            /* this process's (the driver's) stage */
    ft_pipe_link *link;
    ft_pipe_remote *remote;
    ft_pipe_link *local[FT_PIPE_MAX_STAGES];
    pthread_t thr[FT_PIPE_MAX_STAGES];
    int nthr;
    double rss[FT_PIPE_MAX_STAGES];  /* MPI: every stage's peak RSS (bytes) */
    const char *transport;
    ft_offload_params off;           /* this process's stages' offloading   */
    int ended;                       /* ft_cli_pipe_end done                */
} ft_cli_pipe;

extern const char ft_cli_pipe_usage[];
/* The usage text and whether this build has the MPI mode. */
void ft_cli_pipe_print_usage(FILE *f);
void ft_cli_pipe_init(ft_cli_pipe *p);
/* 1: consumed argv[*i] (and its value); 0: not a pipeline option; -1: error printed. */
int ft_cli_pipe_arg(ft_cli_pipe *p, int argc, char **argv, int *i);
/* Micro-batches a run of n sequences gets. */
int ft_cli_pipe_micro(const ft_cli_pipe *p, size_t n);
/* Build the ring: base holds the model, the context sizes and the policy
 * (stage, layers and job filled in here). In MPI mode a rank that is not
 * the driver's runs its stage to the end here and sets *worker_done (the
 * command then exits with the status returned). */
ft_status ft_cli_pipe_start(ft_cli_pipe *p, const ft_pipe_stage_params *base, const ft_offload_params *off,
                            int *worker_done);
/* The stages' common parameters for a run: the model (its absolute path:
 * workers open the same path), context sizes, formats, and the offloading
 * policy (weights only; with its memory nodes and disk directory). */
ft_status ft_cli_pipe_base(ft_cli_pipe *p, const char *dir, const ft_cli_session *o, int max_batch, int max_seq,
                           int max_rows, unsigned threads, ft_pipe_stage_params *out);
/* The offloading parameters of this process's stages (their policy comes
 * with the stage parameters): token file, decode threads, failover. */
void ft_cli_pipe_offload_params(const ft_cli_session *o, ft_offload_params *out);
/* Whether a pipeline option was given without --pipeline (an error). */
int ft_cli_pipe_stray(const ft_cli_pipe *p);
/* Build the ring for a run of n sequences (rows prompt tokens in all, the
 * longest maxp, gen_len new tokens each) and open the driver's session
 * over it (ft_session_open_pipeline); *micro: the micro-batches. In MPI
 * mode a rank that is not the driver runs its stage to the end here and
 * sets *worker_done (*out stays NULL). */
ft_status ft_cli_pipe_open(ft_cli_pipe *p, const ft_cli_session *o, const char *dir, size_t n, size_t rows,
                           size_t maxp, size_t gen_len, int *micro, int *worker_done, ft_session **out);
/* The prompts' token counts as the session encodes them (special tokens
 * added): the longest and the sum. */
ft_status ft_cli_pipe_prompt_tokens(const char *dir, int strict, const char *const *prompts, size_t n, size_t *maxp,
                                    size_t *sum);
/* End the run: the workers finish; MPI: every stage's peak RSS gathered
 * and MPI finalized. The driver's stage stays until ft_cli_pipe_finish. */
void ft_cli_pipe_end(ft_cli_pipe *p);
/* End the run if not yet, free everything. */
void ft_cli_pipe_finish(ft_cli_pipe *p);
/* ,"pipeline":{...} for bench run --json (rss: this process's peak). */
void ft_cli_pipe_report_json(const ft_cli_pipe *p, int micro, double rss, FILE *f);
/* "pipeline: 2 stages (layers 0-3 | 4-7), 2 micro-batches, ucx" */
void ft_cli_pipe_describe(const ft_cli_pipe *p, int micro, FILE *f);
#endif
