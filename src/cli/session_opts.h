/* Internal to the CLI: the engine, device and offloading options that fill
 * an ft_session_params, and the end-of-run metrics (session_opts.c). */
#ifndef FT_CLI_SESSION_OPTS_H
#define FT_CLI_SESSION_OPTS_H
#include "flextier/chat.h"
#include "flextier/session.h"
#include <stdio.h>

#define FT_CLI_MAX_LORA 8

typedef struct ft_cli_session {
    ft_session_params sp;
    /* --lora DIR[:SCALE], repeatable: sp.lora points here */
    ft_session_lora lora[FT_CLI_MAX_LORA];
    char lora_dir[FT_CLI_MAX_LORA][4096];
    int enabled, auto_policy, have_policy, codec_given, cache_codec_given, stats, weights_given, strict, memory_given;
    double last_progress;
} ft_cli_session;

extern const char ft_cli_engine_usage[];
extern const char ft_cli_offload_usage[];
extern const char ft_cli_cuda_usage[];

void ft_cli_session_init(ft_cli_session *o);
/* argv[*i] is one of these options: consume it (and its value) and return
 * 1; 0 if it is not one; -1 after printing an error. */
int ft_cli_session_arg(ft_cli_session *o, int argc, char **argv, int *i);
/* The options that chat and server share: -h/--help prints usage and the
 * engine, offloading and CUDA option lists to stdout and returns
 * FT_CLI_HELP; otherwise as ft_cli_session_arg. */
#define FT_CLI_HELP 2
int ft_cli_session_cmd_arg(ft_cli_session *o, const char *usage, int argc, char **argv, int *i);
/* --chat-template FILE: read it and load it with these bos/eos tokens;
 * reports a failure on stderr (as ft_cli_fail) and returns its status. */
ft_status ft_cli_load_template_file(const char *file, const char *bos, const char *eos, ft_chat_template **out);
/* Open the session (planning the policy first for --policy auto, for a run
 * of `batch` prompts of about prompt_len tokens and gen_len new ones),
 * with progress on stderr, and print the policy in force. */
ft_status ft_cli_session_open(ft_cli_session *o, const char *dir, uint32_t batch, uint32_t prompt_len,
                              uint32_t gen_len, ft_session **out);
/* The offloading metrics (with --offload-stats) and as JSON members. */
void ft_cli_session_report(const ft_cli_session *o, const ft_session *s, double prefill_s, double decode_s, FILE *f);
void ft_cli_session_report_json(const ft_cli_session *o, const ft_session *s, double prefill_s, double decode_s,
                                FILE *f);
/* The GPU's metrics, as text and as JSON members (leading comma). */
void ft_cli_cuda_report(const ft_session *s, FILE *f);
void ft_cli_cuda_report_json(const ft_session *s, FILE *f);

/* "DIR[:SCALE]" -> dir (cap bytes) and scale (1 without one): the part
 * after the last ':' is the scale when it is a finite number. */
ft_status ft_cli_parse_lora(const char *v, char *dir, size_t cap, float *scale);
/* "f32|bf16|f16|q8|q4|auto" -> an ft_wfmt or FT_WEIGHTS_AS_STORED */
ft_status ft_cli_parse_weights(const char *s, int *out);
#endif
