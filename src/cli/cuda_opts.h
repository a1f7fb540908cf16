/* Internal to the CLI: `--device cuda` for `flextier run` and `flextier
 * bench run` (see cuda_opts.c). */
#ifndef FT_CLI_CUDA_OPTS_H
#define FT_CLI_CUDA_OPTS_H
#include "offload_opts.h"
#include "flextier/cuda.h"
#include <stdio.h>

typedef struct ft_cli_cuda {
    int on;                       /* --device cuda */
    int stream;                   /* weights in host memory, streamed per layer */
    ft_codec_id codec;            /* streamed weights: raw (bf16), q8, q4, byteplane */
    ft_cuda_device_info info;
    ft_cuda_host_weights *hw;
    ft_cuda_ctx *c;
} ft_cli_cuda;

extern const char ft_cli_cuda_usage[];
/* --device cpu|cuda: 1 consumed, 0 not this option, -1 error printed. */
int ft_cli_cuda_arg(ft_cli_cuda *g, int argc, char **argv, int *i);
/* Before loading the model: a device is present and the offloading
 * options are ones the CUDA path implements (weights all on the device,
 * or all in host memory; KV cache on the device). */
ft_status ft_cli_cuda_check(ft_cli_cuda *g, const ft_cli_offload *off);
/* Pack the host weights (streaming) and create the context. */
ft_status ft_cli_cuda_create(ft_cli_cuda *g, const ft_model *m, int max_batch, int max_seq, int max_rows,
                             int all_logits, unsigned threads);
/* "device: NVIDIA H200 (cc 9.0), weights streamed from host memory, q4: 1.1 GiB ..." */
void ft_cli_cuda_report(const ft_cli_cuda *g, FILE *f);
/* The same as JSON members (leading comma, no braces). */
void ft_cli_cuda_report_json(const ft_cli_cuda *g, FILE *f);
void ft_cli_cuda_free(ft_cli_cuda *g);
#endif
