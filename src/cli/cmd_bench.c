/* flextier bench ... (filled in below) */
#include "cli.h"
#include <string.h>
int ft_cmd_bench(int argc, char **argv)
{
    if (argc >= 2 && !strcmp(argv[1], "transfer")) return ft_bench_transfer(argc - 1, argv + 1);
    fprintf(stderr, "flextier: bench: not built yet\n");
    return FT_EXIT_ERR;
}
