/* The data-parallel exchange alone (ft_train_tcp_open, src/train/comm_tcp.c):
 * what ft_trainer_step_dp sends per step between 2 ranks (a 24-byte
 * header and the gradient, rank 0 -> 1, then 1 -> 0), ITERS times, timed
 * on rank 0. Run one process per rank (scripts/bench/train-dp.sh runs it
 * in the lab's namespaces):
 *   bench_dp_exchange RANK HOST:PORT,HOST:PORT GRADIENT_BYTES ITERS [TOKEN_FILE] */
#include "flextier/train.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: bench_dp_exchange RANK HOST:PORT,HOST:PORT GRADIENT_BYTES ITERS [TOKEN_FILE]\n");
        return 2;
    }
    int rank = atoi(argv[1]), iters = atoi(argv[4]);
    size_t bytes = (size_t)strtoull(argv[3], NULL, 10);
    char list[512];
    snprintf(list, sizeof list, "%s", argv[2]);
    char *comma = strchr(list, ',');
    if (!comma || (rank != 0 && rank != 1) || iters < 1 || !bytes) {
        fprintf(stderr, "bench_dp_exchange: bad arguments\n");
        return 2;
    }
    *comma = 0;
    const char *peers[2] = {list, comma + 1};
    ft_train_tcp_params p;
    memset(&p, 0, sizeof p);
    p.rank = rank;
    p.size = 2;
    p.peers = peers;
    p.token_file = argc > 5 ? argv[5] : NULL;
    p.max_msg = bytes;
    ft_train_comm *c = NULL;
    ft_status st = ft_train_tcp_open(&p, &c);
    if (st) {
        fprintf(stderr, "bench_dp_exchange: %s\n", ft_last_error());
        return 1;
    }
    uint8_t hdr[24] = {0};
    float *g = calloc(bytes / 4 + 1, 4);
    double t0 = 0;
    for (int i = 0; i <= iters && !st; i++) {
        if (i == 1) t0 = ft_now();   /* the first round trip warms up */
        if (rank == 0) {
            if (!(st = c->send(c->user, 1, hdr, sizeof hdr)) && !(st = c->send(c->user, 1, g, bytes)) &&
                !(st = c->recv(c->user, 1, hdr, sizeof hdr)))
                st = c->recv(c->user, 1, g, bytes);
        } else {
            if (!(st = c->recv(c->user, 0, hdr, sizeof hdr)) && !(st = c->recv(c->user, 0, g, bytes)) &&
                !(st = c->send(c->user, 0, hdr, sizeof hdr)))
                st = c->send(c->user, 0, g, bytes);
        }
    }
    double dt = ft_now() - t0;
    if (st) fprintf(stderr, "bench_dp_exchange: %s\n", ft_last_error());
    else if (rank == 0)
        printf("exchange of %zu bytes each way: %.2f ms per step (%d steps; %.0f MB/s, the two directions in "
               "turn)\n", bytes, dt / iters * 1e3, iters, 2.0 * (double)bytes * iters / dt / 1e6);
    free(g);
    ft_train_tcp_close(c, st);
    return st ? 1 : 0;
}
