/* flextier agent: the codec agent (flextier/agent.h, docs/agent.md). */
#include "cli.h"
#include "flextier/agent.h"

#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

static const char agent_usage[] =
    "usage: flextier agent --node ucx://HOST:PORT [--node ...] [--listen HOST:PORT]\n"
    "                      [--token-file FILE] [--node-token-file FILE] [--threads N]\n"
    "                      [--max-staging SIZE] [--client-tls LIST] [--max-connections N]\n"
    "                      [--trusted-network] [--insecure]\n"
    "\n"
    "Encodes and decodes tensors for local clients (store URI\n"
    "agent://HOST:PORT[/NODE_HOST:PORT]) and moves the frames to and from the\n"
    "memory nodes, as a DPU's cores would: clients hand over raw tensors by\n"
    "cross-memory attach on one machine, UCX RMA from a DPU (RDMA).\n"
    "  --listen          where clients connect (default 127.0.0.1:13340; port 0 =\n"
    "                    any free port, printed as 'listening on HOST:PORT')\n"
    "  --node            a memory node (flextier serve); the first is the default\n"
    "  --token-file      the token clients must prove (their --token-file; a private\n"
    "                    file of >= 16 bytes); required off loopback\n"
    "  --node-token-file the agent's own token for the memory nodes (default\n"
    "                    FLEXTIER_TOKEN_FILE)\n"
    "  --threads         requests handled at once (default 8; each encodes or decodes\n"
    "                    a tensor and waits for its memory-node transfer; pin the\n"
    "                    agent's cores with taskset)\n"
    "  --max-staging     bytes of tensors in flight in the agent (default 2G)\n"
    "  --client-tls      UCX transports toward the clients (default: UCX_TLS);\n"
    "                    never shared memory, TCP only with --trusted-network\n"
    "  --trusted-network UCX RMA toward clients may use TCP (only where every host\n"
    "                    is trusted: UCX's TCP transport obeys any peer's RMA)\n"
    "  --insecure        listen off loopback without a token\n";

int ft_cmd_agent(int argc, char **argv)
{
    static const struct option opts[] = {
        {"listen", required_argument, 0, 'L'}, {"node", required_argument, 0, 'n'},
        {"token-file", required_argument, 0, 't'}, {"node-token-file", required_argument, 0, 'T'},
        {"threads", required_argument, 0, 'j'}, {"max-staging", required_argument, 0, 'S'},
        {"client-tls", required_argument, 0, 'C'}, {"max-connections", required_argument, 0, 'M'},
        {"trusted-network", no_argument, 0, 'R'}, {"insecure", no_argument, 0, 'I'},
        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    ft_agent_params p;
    ft_agent_default_params(&p);
    int c;
    long v;
    uint64_t sz;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'L': p.listen = optarg; break;
        case 'n':
            if (p.n_nodes == FT_AGENT_MAX_NODES)
                return ft_cli_usage_error(agent_usage, "at most %d --node", FT_AGENT_MAX_NODES);
            if (strncmp(optarg, "ucx://", 6))
                return ft_cli_usage_error(agent_usage, "--node '%s' is not ucx://HOST:PORT", optarg);
            p.nodes[p.n_nodes++] = optarg;
            break;
        case 't': p.token_file = optarg; break;
        case 'T': p.node_token_file = optarg; break;
        case 'j':
            if (ft_cli_parse_int(optarg, 1, 64, &v))
                return ft_cli_usage_error(agent_usage, "--threads: %s", ft_last_error());
            p.threads = (unsigned)v;
            break;
        case 'S':
            if (ft_cli_parse_size(optarg, &sz) || sz == 0)
                return ft_cli_usage_error(agent_usage, "--max-staging: bad size '%s'", optarg);
            p.max_staging = sz;
            break;
        case 'C': p.client_tls = optarg; break;
        case 'R': p.trusted_network = 1; break;
        case 'I': p.insecure = 1; break;
        case 'M':
            if (ft_cli_parse_int(optarg, 1, 65536, &v))
                return ft_cli_usage_error(agent_usage, "--max-connections: %s", ft_last_error());
            p.max_connections = (unsigned)v;
            break;
        case 'h': fputs(agent_usage, stdout); return FT_EXIT_OK;
        default:
            return ft_cli_usage_error(agent_usage, "unknown or incomplete option '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc) return ft_cli_usage_error(agent_usage, "agent takes no arguments");
    if (p.n_nodes == 0) return ft_cli_usage_error(agent_usage, "agent needs --node ucx://HOST:PORT");
    p.stop = ft_cli_daemon_start();
    p.on_ready = ft_cli_print_listening;
    p.arg = (void *)"flextier agent";
    ft_status st = ft_agent_run(&p);
    if (st != FT_OK) return ft_cli_fail("agent", st);
    return FT_EXIT_OK;
}
