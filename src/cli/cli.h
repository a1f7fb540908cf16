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

int ft_cmd_codec(int argc, char **argv);
int ft_cmd_bench(int argc, char **argv);
/* engine (cmd_run.c) */
int ft_cmd_run(int argc, char **argv);
int ft_cmd_gen_model(int argc, char **argv);
/* `flextier bench run ...`: argv[0] is "run". */
int ft_bench_run(int argc, char **argv);
#endif
