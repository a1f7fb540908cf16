/* flextier worker: a pipeline stage for drivers on other machines
 * (flextier/pipe.h, docs/pipeline.md). */
#include "cli.h"
#include "flextier/pipe.h"

#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>

static const char worker_usage[] =
    "usage: flextier worker [--models DIR] [--listen HOST:PORT] [--token-file FILE]\n"
    "                       [--trusted-network] [--remote URI]... [--disk file:DIR]...\n"
    "                       [--node-token-file FILE] [--decode-threads N] [--once]\n"
    "\n"
    "Runs one stage of a pipelined model for a driver (`flextier run|bench run\n"
    "--pipeline HOST:PORT,...`): the driver authenticates with the token, names the\n"
    "model directory (under --models on this machine), the stage's layers and its\n"
    "offloading policy; activations then travel over UCX. One driver at a time.\n"
    "A job is data, not configuration: it may name only what this command line allows.\n"
    "  --models           the directory whose models drivers may name (without it every\n"
    "                     job is refused; a path resolving outside it is refused as\n"
    "                     not found)\n"
    "  --remote           a memory node (ucx://HOST:PORT, agent://...) a job's policy\n"
    "                     may use (remote=); repeat for more; none by default\n"
    "  --disk             a disk directory (file:DIR) a job's policy may use (disk=)\n"
    "  --listen           where drivers connect (default 127.0.0.1:13350; port 0 = any\n"
    "                     free port, printed as 'listening on HOST:PORT')\n"
    "  --token-file       the token drivers must prove (required off loopback)\n"
    "  --trusted-network  UCX may use TCP between the stages (no RDMA: the lab, a\n"
    "                     private network); without it only RDMA devices\n"
    "  --node-token-file  this stage's token for memory nodes its policy uses\n"
    "  --decode-threads   threads verifying and decoding streamed weights (1)\n"
    "  --once             exit after one run\n"
    "Prints its peak RSS after each run.\n";

int ft_cmd_worker(int argc, char **argv)
{
    static const struct option opts[] = {
        {"listen", required_argument, 0, 'L'}, {"token-file", required_argument, 0, 't'},
        {"trusted-network", no_argument, 0, 'T'}, {"node-token-file", required_argument, 0, 'n'},
        {"decode-threads", required_argument, 0, 'd'}, {"once", no_argument, 0, 'o'},
        {"models", required_argument, 0, 'm'}, {"remote", required_argument, 0, 'r'},
        {"disk", required_argument, 0, 'D'},
        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    static const char *remotes[16], *disks[16];
    int n_remotes = 0, n_disks = 0;
    ft_worker_params p;
    memset(&p, 0, sizeof p);
    p.listen = "127.0.0.1:13350";
    ft_offload_params off;
    ft_offload_default_params(&off);
    int c;
    long v;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'L': p.listen = optarg; break;
        case 't': p.token_file = optarg; break;
        case 'T': p.trusted_network = 1; break;
        case 'n': off.token_file = optarg; break;
        case 'd':
            if (ft_cli_parse_int(optarg, 1, 256, &v)) return ft_cli_usage_error(worker_usage, "--decode-threads: %s", ft_last_error());
            off.decode_threads = (unsigned)v;
            break;
        case 'o': p.once = 1; break;
        case 'm': p.models_dir = optarg; break;
        case 'r':
            if (n_remotes == 16) return ft_cli_usage_error(worker_usage, "at most 16 --remote");
            remotes[n_remotes++] = optarg;
            break;
        case 'D':
            if (strncmp(optarg, "file:", 5) || !optarg[5])
                return ft_cli_usage_error(worker_usage, "--disk %s: expected file:DIR", optarg);
            if (n_disks == 16) return ft_cli_usage_error(worker_usage, "at most 16 --disk");
            disks[n_disks++] = optarg;
            break;
        case 'h': fputs(worker_usage, stdout); return FT_EXIT_OK;
        default:
            return ft_cli_usage_error(worker_usage, "unknown or incomplete option '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc) return ft_cli_usage_error(worker_usage, "worker takes no arguments");
    struct stat msb;
    if (p.models_dir && (stat(p.models_dir, &msb) != 0 || !S_ISDIR(msb.st_mode)))
        return ft_cli_usage_error(worker_usage, "--models %s is not a directory", p.models_dir);
    p.remotes = remotes;
    p.n_remotes = n_remotes;
    p.disks = disks;
    p.n_disks = n_disks;
    if (!p.models_dir)
        FT_LOG(FT_LOG_WARN, "worker: no --models DIR: every job will be refused (a job may name only "
                            "models under it)");
    p.stop = ft_cli_daemon_start();
    p.on_ready = ft_cli_print_listening;
    p.arg = (void *)"flextier worker";
    p.off = &off;
    ft_status st = ft_worker_run(&p);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    fprintf(stderr, "flextier worker: peak RSS %.1f MiB\n", (double)ru.ru_maxrss / 1024.0);
    if (st != FT_OK) return ft_cli_fail("worker", st);
    return FT_EXIT_OK;
}
