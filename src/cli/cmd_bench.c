/* flextier bench <what>: dispatch to the benchmarks. */
#include "cli.h"

#include <string.h>

int ft_bench_codec(int argc, char **argv);

static const struct {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *help;
} benches[] = {
    {"codec", ft_bench_codec, "codec ratio and speed vs zstd -b1 / lz4 -b1"},
    {"transfer", ft_bench_transfer, "write_tensor/read_tensor GB/s to a store vs ucx_perftest"},
    {"run", ft_bench_run, "prefill/decode tokens/s of a model (FlexGen's benchmark shape)"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: flextier bench <what> [options]\n\n");
    for (size_t i = 0; i < sizeof benches / sizeof benches[0]; i++)
        fprintf(f, "  %-9s %s\n", benches[i].name, benches[i].help);
    fprintf(f, "\n'flextier bench <what> --help' describes its options.\n");
}

int ft_cmd_bench(int argc, char **argv)
{
    if (argc < 2) { usage(stderr); return FT_EXIT_USAGE; }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) { usage(stdout); return FT_EXIT_OK; }
    for (size_t i = 0; i < sizeof benches / sizeof benches[0]; i++)
        if (!strcmp(argv[1], benches[i].name)) return benches[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "flextier: unknown benchmark '%s'\n", argv[1]);
    usage(stderr);
    return FT_EXIT_USAGE;
}
