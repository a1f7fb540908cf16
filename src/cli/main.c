/* flextier: one binary, subcommands. */
#include "cli.h"

#include <string.h>

typedef struct {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *help;
} command;

static const command commands[] = {
    {"codec", ft_cmd_codec, "encode, decode and inspect tensor frames"},
    {"run", ft_cmd_run, "generate text from a model directory (OPT, Llama, Mistral, Qwen2)"},
    {"gen-model", ft_cmd_gen_model, "write a random-weight Llama/OPT checkpoint (HF layout)"},
    {"finetune", ft_cmd_finetune, "LoRA fine-tuning on a text/JSONL file; writes a PEFT adapter (run --lora)"},
    {"export", ft_cmd_export, "merge LoRA adapters into a model: a Hugging Face checkpoint (--merge-lora)"},
    {"perplexity", ft_cmd_perplexity, "perplexity of a model on a text (compare weight and cache formats)"},
    {"plan", ft_cmd_plan, "measure the machine and choose an offloading policy"},
    {"bench", ft_cmd_bench, "benchmarks (codec) side by side with reference tools"},
    {"serve", ft_cmd_serve, "run a memory node (tensor store over UCX)"},
    {"agent", ft_cmd_agent, "run a codec agent (encodes/decodes for local clients, agent://)"},
    {"chat", ft_cmd_chat, "an interactive chat with a model (its chat template, the KV cache kept across turns)"},
    {"server", ft_cmd_server, "an OpenAI-compatible HTTP server with continuous batching"},
    {"worker", ft_cmd_worker, "run pipeline stages for a driver on another machine (run --pipeline)"},
    {"put", ft_cmd_put, "store a tensor under a key (mem:, file:DIR, ucx://HOST:PORT)"},
    {"get", ft_cmd_get, "read a tensor back"},
    {"ls", ft_cmd_ls, "list the keys of a store"},
    {"rm", ft_cmd_rm, "delete a tensor"},
    {"stat", ft_cmd_stat, "tensor metadata, or a memory node's statistics"},
    {"chat-template", ft_cmd_chat_template, "render a model's chat template (as transformers/jinja2 does)"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: flextier <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-8s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "  %-8s %s\n", "version", "print the version");
    fprintf(f, "\n'flextier <command> --help' describes a command.\n"
               "Environment: FLEXTIER_LOG=error|warn|info|debug|trace, FLEXTIER_THREADS=N,\n"
               "FLEXTIER_NO_SIMD=1 (scalar kernels only), FLEXTIER_DIRECT_IO=0|1 (the disk tier and\n"
               "the streamed embeddings / LM head read past the page cache with O_DIRECT; default: on\n"
               "under a memory budget).\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) { usage(stderr); return FT_EXIT_USAGE; }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
        usage(stdout);
        return FT_EXIT_OK;
    }
    if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) {
        printf("flextier %s\n", FT_VERSION_STRING);
        return FT_EXIT_OK;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(cmd, commands[i].name)) return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "flextier: unknown command '%s'\n\n", cmd);
    usage(stderr);
    return FT_EXIT_USAGE;
}
