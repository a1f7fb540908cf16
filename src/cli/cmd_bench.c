/* flextier bench ... (filled in below) */
#include "cli.h"
#include <string.h>
int ft_cmd_bench(int argc, char **argv)
{
    (void)argc; (void)argv;
    fprintf(stderr, "flextier: bench: not built yet\n");
    return FT_EXIT_ERR;
}
