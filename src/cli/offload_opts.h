/* Internal to the CLI: offloading options (see offload_opts.c). */
#ifndef FT_CLI_OFFLOAD_OPTS_H
#define FT_CLI_OFFLOAD_OPTS_H
#include "flextier/offload.h"
#include <stdio.h>

typedef struct ft_cli_offload {
    int enabled, auto_policy, have_policy, codec_given, cache_codec_given, stats;
    /* engine formats: --weights-dtype (an ft_wfmt or FT_WEIGHTS_AS_STORED)
     * and --kv-dtype (the in-memory KV cache; -1: bf16, or f32 when the
     * cache is offloaded) */
    int weights, weights_given, kv_dtype;
    unsigned threads;          /* compute threads of the run (for planning) */
    double predicted_tps;
    ft_offload_params p;
    ft_offload *o;
    ft_kv_offload *kv;         /* the KV cache offloaded (c= not all device) */
    int marked;                /* stats snapshot taken when decoding began */
    ft_offload_stats mark_w;
    ft_kv_offload_stats mark_kv;
} ft_cli_offload;

extern const char ft_cli_offload_usage[];
extern const char ft_cli_engine_usage[];
void ft_cli_offload_init(ft_cli_offload *o);
/* argv[*i] is an offloading option: consume it (and its value) and return
 * 1; 0 if it is not one; -1 after printing an error. */
int ft_cli_offload_arg(ft_cli_offload *o, int argc, char **argv, int *i);
/* Load the model: plainly, or with external layers and the scheduler
 * (planning the policy first for --policy auto). */
ft_status ft_cli_offload_load(ft_cli_offload *o, const char *dir, ft_load_params *lp, uint32_t batch,
                              uint32_t prompt_len, uint32_t gen_len, ft_model **out);
/* Before ft_ctx_create: an external KV cache when the policy offloads it. */
void ft_cli_offload_ctx_params(const ft_cli_offload *o, ft_ctx_params *cp);
/* Install the weight scheduler and the KV cache offloader on a context
 * created with those parameters. */
ft_status ft_cli_offload_attach(ft_cli_offload *o, const ft_model *m, ft_ctx *c, const ft_ctx_params *cp);
/* Snapshot the counters when decoding begins (the first on_token call):
 * the overlap efficiency is then reported per phase. */
void ft_cli_offload_mark(ft_cli_offload *o);
/* An ft_token_cb that only marks (user: the ft_cli_offload). */
int ft_cli_offload_on_token(void *user, size_t seq, int32_t token);
void ft_cli_offload_report(const ft_cli_offload *o, double prefill_s, double decode_s, FILE *f);
/* The same metrics as a JSON object (no newline). */
void ft_cli_offload_report_json(const ft_cli_offload *o, double prefill_s, double decode_s, FILE *f);
void ft_cli_offload_free(ft_cli_offload *o);

/* Check the engine format options against the policy and the device;
 * sets lp->weights. */
ft_status ft_cli_engine_formats(ft_cli_offload *o, int cuda, ft_load_params *lp);

/* cmd_plan.c */
ft_status ft_cli_cost_model_inputs(const char *dir, int weights, ft_cost_inputs *in);
/* "f32|bf16|f16|q8|q4|auto" -> an ft_wfmt or FT_WEIGHTS_AS_STORED */
ft_status ft_cli_parse_weights(const char *s, int *out);
/* Measure compute, memory, codecs and the policy's links into *in. */
ft_status ft_cli_plan_measure(const char *dir, ft_cost_inputs *in, const ft_policy *base, uint64_t device_mem,
                              uint32_t batch, uint32_t prompt_len, uint32_t gen_len, unsigned threads);
#endif
