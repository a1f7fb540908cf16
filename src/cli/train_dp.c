/* `flextier finetune --data-parallel tcp`: the options and the ranks'
 * communicator over TCP (train_dp.h; docs/training.md "Over TCP"). */
#include "cli.h"
#include "train_dp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char ft_cli_dp_usage[] =
    "  --data-parallel tcp the ranks over TCP, without MPI, each started by hand (or ssh):\n"
    "    --dp-rank K       this process's rank, 0..N-1 (rank 0 prints, evaluates, writes --out)\n"
    "    --dp-peers LIST   HOST:PORT of every rank, in rank order (N = their number; rank K\n"
    "                      listens on the K-th): the same list for every rank\n"
    "    --dp-token-file F the ranks' shared token (default $FLEXTIER_TOKEN_FILE): every\n"
    "                      connection proves it (the memory node's handshake); without one\n"
    "                      the addresses must be loopback unless --dp-insecure\n"
    "    --dp-insecure     no token, other addresses: anyone who reaches a rank's port can join\n"
    "    --dp-timeout S    wait S s for the ranks to join; a rank silent for S s is dead and\n"
    "                      every rank stops with an error (default 60)\n";

void ft_cli_dp_init(ft_cli_dp *d)
{
    memset(d, 0, sizeof *d);
    d->rank = -1;
    d->timeout_s = 60;
}

int ft_cli_dp_arg(ft_cli_dp *d, const char *usage, int argc, char **argv, int *i)
{
    const char *a = argv[*i];
    if (strncmp(a, "--dp-", 5)) return 0;
    d->given = 1;
    if (!strcmp(a, "--dp-insecure")) {
        d->insecure = 1;
        return 1;
    }
    if (*i + 1 >= argc) {
        ft_cli_usage_error(usage, "option %s needs a value", a);
        return -1;
    }
    const char *v = argv[++*i];
    if (!strcmp(a, "--dp-rank")) {
        if (ft_cli_parse_int(v, 0, FT_CLI_DP_MAX_RANKS - 1, &d->rank)) {
            ft_cli_usage_error(usage, "bad value for --dp-rank: %s (an integer in [0, %d])", v, FT_CLI_DP_MAX_RANKS - 1);
            return -1;
        }
    } else if (!strcmp(a, "--dp-timeout")) {
        if (ft_cli_parse_int(v, 1, 86400, &d->timeout_s)) {
            ft_cli_usage_error(usage, "bad value for --dp-timeout: %s (seconds, 1..86400)", v);
            return -1;
        }
    } else if (!strcmp(a, "--dp-token-file")) {
        d->token_file = v;
    } else if (!strcmp(a, "--dp-peers")) {
        if (strlen(v) >= sizeof d->pbuf) {
            ft_cli_usage_error(usage, "--dp-peers: a list of %zu bytes", strlen(v));
            return -1;
        }
        memcpy(d->pbuf, v, strlen(v) + 1);
        d->n = 0;
        for (char *s = d->pbuf, *e;; s = e + 1) {
            e = strchr(s, ',');
            if (e) *e = 0;
            if (!*s || d->n == FT_CLI_DP_MAX_RANKS) {
                ft_cli_usage_error(usage, "--dp-peers %s: %s", v, *s ? "more than 256 ranks" : "an empty entry");
                return -1;
            }
            d->peers[d->n++] = s;
            if (!e) break;
        }
    } else {
        ft_cli_usage_error(usage, "unknown option %s", a);
        return -1;
    }
    return 1;
}

int ft_cli_dp_check(ft_cli_dp *d, const char *usage, const char *mode, long accum)
{
    if (mode && strcmp(mode, "mpi") && strcmp(mode, "tcp")) {
        ft_cli_usage_error(usage, "--data-parallel %s: only mpi (under mpirun -n N) and tcp (--dp-rank, "
                           "--dp-peers) are implemented", mode);
        return FT_EXIT_USAGE;
    }
    d->tcp = mode && !strcmp(mode, "tcp");
    if (!d->tcp) {
        if (d->given) {
            ft_cli_usage_error(usage, "the --dp-* options belong to --data-parallel tcp");
            return FT_EXIT_USAGE;
        }
        return 0;
    }
    if (d->rank < 0 || !d->n) {
        ft_cli_usage_error(usage, "--data-parallel tcp needs --dp-rank K and --dp-peers HOST:PORT,...");
        return FT_EXIT_USAGE;
    }
    if (d->rank >= d->n) {
        ft_cli_usage_error(usage, "--dp-rank %ld: --dp-peers names %d rank%s (0..%d)", d->rank, d->n,
                           d->n == 1 ? "" : "s", d->n - 1);
        return FT_EXIT_USAGE;
    }
    if (accum < d->n) {
        ft_cli_usage_error(usage, "--grad-accum %ld < %d processes: each process computes whole micro-batches of "
                           "the step (use --grad-accum N or a multiple)", accum, d->n);
        return FT_EXIT_USAGE;
    }
    if (!d->token_file) {
        const char *e = getenv("FLEXTIER_TOKEN_FILE");
        if (e && *e) d->token_file = e;
    }
    return 0;
}

int ft_cli_dp_begin(ft_cli_dp *d, ft_train_comm *comm)
{
    comm->rank = (int)d->rank;
    comm->size = d->n;
    if (d->rank != 0 && !freopen("/dev/null", "w", stdout)) {
        ft_cli_fail("finetune: stdout", FT_ERR_IO);
        return FT_EXIT_ERR;
    }
    return 0;
}

ft_status ft_cli_dp_open(ft_cli_dp *d, const char *run, const int32_t *ids, size_t ntok, size_t n_params,
                         ft_train_comm *comm)
{
    ft_train_tcp_params p;
    memset(&p, 0, sizeof p);
    p.rank = (int)d->rank;
    p.size = d->n;
    p.peers = d->peers;
    p.token_file = d->token_file;
    p.insecure = d->insecure;
    p.timeout_ms = (int)(d->timeout_s * 1000);
    p.job = ft_xxh3_seed(ids, ntok * sizeof *ids, ft_xxh3(run, strlen(run)));
    /* ft_trainer_step_dp's messages: its 24-byte header and the gradient */
    p.max_msg = n_params * sizeof(float) > 64 ? n_params * sizeof(float) : 64;
    ft_status st = ft_train_tcp_open(&p, &d->comm);
    if (st) return st;
    *comm = *d->comm;
    return FT_OK;
}

void ft_cli_dp_end(ft_cli_dp *d, int ok)
{
    ft_train_tcp_close(d->comm, ok ? FT_OK : FT_ERR_CANCELED);
    d->comm = NULL;
}
