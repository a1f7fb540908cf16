/* Internal to the CLI: shared helpers and subcommand entry points. */
#ifndef FT_CLI_H
#define FT_CLI_H
#include "flextier/core.h"
#include "flextier/codec.h"
#include <stdio.h>

/* Exit codes: 0 ok, 1 runtime error, 2 usage error. */
#define FT_EXIT_OK 0
#define FT_EXIT_ERR 1
#define FT_EXIT_USAGE 2

/* Print "flextier: <what>: <status> (<detail>)" to stderr; returns 1. */
int ft_cli_fail(const char *what, ft_status st);
/* Print a usage error + hint; returns 2. */
int ft_cli_usage_error(const char *usage, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Whole-file read ("-" = stdin) into a 64-byte aligned buffer (free with
 * ft_free_aligned). */
ft_status ft_cli_read_file(const char *path, uint8_t **data, size_t *size);
/* Write atomically: a temp file in the same directory, fsync, rename.
 * "-" writes to stdout. On failure no file is left behind. */
ft_status ft_cli_write_file(const char *path, const void *data, size_t size);
/* "64M", "1G", "4096", "256k" (binary units) */
ft_status ft_cli_parse_size(const char *s, uint64_t *out);
/* Format bytes as "64.0 MiB". */
void ft_cli_fmt_bytes(double bytes, char *buf, size_t n);
/* Parse a non-negative integer option value within [lo, hi]. */
ft_status ft_cli_parse_int(const char *s, long lo, long hi, long *out);

/* The options that describe a tensor and its encoding, shared by `codec
 * encode` and `put` (getopt letters): c CODEC, l LEVEL, g group size,
 * G group dim, k chunk size, d dtype, s shape. Any pointer may be NULL
 * when the command has no such option. */
typedef struct ft_cli_tensor_args {
    ft_codec_params *cp;
    ft_dtype *dtype;
    uint32_t *ndim;
    int64_t *shape;
    int *have_codec, *have_dtype, *have_shape;
} ft_cli_tensor_args;
/* 1: option c applied; 0: not one of these; -1: bad value (the detail,
 * naming the option, is in ft_last_error()). */
int ft_cli_tensor_opt(int c, const char *arg, const ft_cli_tensor_args *a);

/* Copy tensor NAME out of a .safetensors file or model directory into a
 * new aligned buffer (free out->data with ft_free_aligned). */
ft_status ft_cli_load_st_tensor(const char *path, const char *name, ft_tensor *out);
/* A synthetic BPE tokenizer.json of exactly vocab tokens for gen-model
 * (gen_tokenizer.c): llama != 0: Llama 2-style (sentencepiece BPE with
 * byte fallback, <unk> <s> </s>); else OPT/GPT-2 byte-level (<s> <pad>
 * </s> <unk>). *json is malloc'd (free()), NUL-terminated, *len excludes
 * the NUL. vocab must be >= ft_cli_gen_tokenizer_min_vocab(llama). */
ft_status ft_cli_gen_tokenizer(int llama, long vocab, char **json, size_t *len);
long ft_cli_gen_tokenizer_min_vocab(int llama);
/* An explicit --threads N above the CPUs this process may use
 * (ft_usable_cpus: affinity, cgroup CPU quota) is honoured, with a warning
 * on stderr that the threads will share CPUs. threads 0: nothing. */
void ft_cli_warn_threads(long threads);

/* The daemons (serve, agent, worker): log at INFO at least, SIGTERM and
 * SIGINT set the returned flag (their params' stop), SIGPIPE ignored. */
volatile int *ft_cli_daemon_start(void);
/* Their on_ready: prints "<arg>: listening on HOST:PORT" (arg: the
 * command's name as a string, e.g. "flextier serve") and flushes stdout,
 * which scripts wait for. */
void ft_cli_print_listening(void *arg, const char *bound);
/* Median of n doubles (sorts in place). */
double ft_cli_median(double *v, size_t n);

int ft_cmd_codec(int argc, char **argv);
int ft_cmd_chat_template(int argc, char **argv);
int ft_cmd_plan(int argc, char **argv);
int ft_cmd_perplexity(int argc, char **argv);
int ft_cmd_bench(int argc, char **argv);
/* src/cli/cmd_store.c */
int ft_cmd_serve(int argc, char **argv);
int ft_cmd_put(int argc, char **argv);
int ft_cmd_get(int argc, char **argv);
int ft_cmd_ls(int argc, char **argv);
int ft_cmd_rm(int argc, char **argv);
int ft_cmd_stat(int argc, char **argv);
/* src/cli/cmd_agent.c */
int ft_cmd_agent(int argc, char **argv);
/* src/cli/cmd_server.c, cmd_chat.c */
int ft_cmd_server(int argc, char **argv);
int ft_cmd_chat(int argc, char **argv);
/* src/cli/cmd_worker.c */
int ft_cmd_worker(int argc, char **argv);
/* src/cli/cmd_store.c: flextier bench transfer URI ... (argv[0] = "transfer") */
int ft_bench_transfer(int argc, char **argv);
/* engine (cmd_run.c) */
int ft_cmd_run(int argc, char **argv);
/* cmd_finetune.c: LoRA fine-tuning; export --merge-lora */
int ft_cmd_finetune(int argc, char **argv);
int ft_cmd_export(int argc, char **argv);
/* gen_model.c */
int ft_cmd_gen_model(int argc, char **argv);
/* `flextier bench run ...`: argv[0] is "run". */
int ft_bench_run(int argc, char **argv);
#endif
