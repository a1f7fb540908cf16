/* Internal to the CLI: the pipeline's MPI transport and bootstrap
 * (pipe_mpi.c with Open MPI; pipe_nompi.c in a build without MPI). */
#ifndef FT_CLI_PIPE_MPI_H
#define FT_CLI_PIPE_MPI_H
#include "flextier/pipe.h"

/* 1 when the CLI was built with MPI. */
int ft_cli_mpi_built(void);
/* MPI_Init (once) and this process's rank and the job's size. */
ft_status ft_cli_mpi_init(int *rank, int *size);
void ft_cli_mpi_finalize(void);
/* End every rank of the job (the driver failed before the ring ran). */
void ft_cli_mpi_abort(void);
/* A ring link over MPI point-to-point messages between ranks. */
ft_status ft_cli_mpi_link(int rank, int size, ft_pipe_link **out);
/* Every rank's bytes (each <= cap) into all[r * cap], lens[r]. */
ft_status ft_cli_mpi_allgather(const void *mine, size_t len, void *all, size_t cap, size_t *lens);
/* Every rank's value into all[r]. */
ft_status ft_cli_mpi_allgather_double(double v, double *all);
/* Blocking bytes to / from a rank (the trainer's ft_train_comm). */
ft_status ft_cli_mpi_send(void *user, int to, const void *buf, size_t len);
ft_status ft_cli_mpi_recv(void *user, int from, void *buf, size_t len);
#endif
