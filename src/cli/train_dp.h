/* Internal to the CLI: `flextier finetune --data-parallel tcp` (train_dp.c;
 * the mpi mode is pipe_mpi.c): the --dp-* options and the ranks'
 * communicator over TCP (ft_train_tcp_open, flextier/train.h). */
#ifndef FT_CLI_TRAIN_DP_H
#define FT_CLI_TRAIN_DP_H
#include "flextier/train.h"

#define FT_CLI_DP_MAX_RANKS 256

typedef struct ft_cli_dp {
    int tcp;                        /* --data-parallel tcp */
    long rank;                      /* --dp-rank (-1: not given) */
    char pbuf[8192];                /* --dp-peers, split */
    const char *peers[FT_CLI_DP_MAX_RANKS];
    int n;
    const char *token_file;         /* --dp-token-file, else $FLEXTIER_TOKEN_FILE */
    int insecure;                   /* --dp-insecure */
    long timeout_s;                 /* --dp-timeout (default 60) */
    int given;                      /* some --dp-* option was given */
    ft_train_comm *comm;            /* open */
} ft_cli_dp;

extern const char ft_cli_dp_usage[];
void ft_cli_dp_init(ft_cli_dp *d);
/* argv[*i] when it is a --dp-* option: 1 (its value taken), -1 after a
 * usage error (said), 0 not one of them. */
int ft_cli_dp_arg(ft_cli_dp *d, const char *usage, int argc, char **argv, int *i);
/* After the options: --data-parallel MODE (NULL: none) with the --dp-*
 * options and --grad-accum. 0, or FT_EXIT_USAGE after a usage error. */
int ft_cli_dp_check(ft_cli_dp *d, const char *usage, const char *mode, long grad_accum);
/* tcp: this rank and the size into comm (send/recv come with the open);
 * ranks other than 0 write nothing to stdout. 0 or FT_EXIT_ERR (said). */
int ft_cli_dp_begin(ft_cli_dp *d, ft_train_comm *comm);
/* tcp: join the other ranks; the job is the hash of `run` (the options
 * that must agree, as text) and of the training tokens; max_msg from the
 * trainer's parameter count. *comm becomes the open communicator. */
ft_status ft_cli_dp_open(ft_cli_dp *d, const char *run, const int32_t *ids, size_t ntok, size_t n_params,
                         ft_train_comm *comm);
/* tcp: the end (BYE), or the failure passed on to the others. */
void ft_cli_dp_end(ft_cli_dp *d, int ok);
#endif
