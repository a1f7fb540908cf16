/* The CLI built without MPI: the pipeline's MPI mode refuses clearly. */
#include "pipe_mpi.h"

static ft_status none(void)
{
    return ft_set_error(FT_ERR_UNSUPPORTED, "this flextier was built without MPI (install libopenmpi-dev and "
                        "rebuild, or use flextier worker processes: --pipeline HOST:PORT,...)");
}

int ft_cli_mpi_built(void) { return 0; }
ft_status ft_cli_mpi_init(int *rank, int *size) { (void)rank; (void)size; return none(); }
void ft_cli_mpi_finalize(void) {}
void ft_cli_mpi_abort(void) {}
ft_status ft_cli_mpi_link(int rank, int size, ft_pipe_link **out) { (void)rank; (void)size; (void)out; return none(); }
ft_status ft_cli_mpi_allgather(const void *mine, size_t len, void *all, size_t cap, size_t *lens)
{
    (void)mine; (void)len; (void)all; (void)cap; (void)lens;
    return none();
}
ft_status ft_cli_mpi_allgather_double(double v, double *all) { (void)v; (void)all; return none(); }
ft_status ft_cli_mpi_send(void *user, int to, const void *buf, size_t len)
{
    (void)user; (void)to; (void)buf; (void)len;
    return none();
}
ft_status ft_cli_mpi_recv(void *user, int from, void *buf, size_t len)
{
    (void)user; (void)from; (void)buf; (void)len;
    return none();
}
