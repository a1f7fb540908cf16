/* Fuzz the config.json / generation_config.json parsers: any input must
 * parse or fail cleanly; a config that parses must describe a model the
 * engine's limits accept (sizes positive, heads dividing). */
#include "flextier/engine.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ft_log_set_level(FT_LOG_ERROR);   /* unknown-key warnings would flood the run */
    ft_model_config c;
    if (ft_model_config_parse((const char *)data, size, "fuzz.json", &c) != FT_OK) {
        /* generation config on its own, applied to a valid base */
        static const char base[] = "{\"model_type\":\"llama\",\"hidden_size\":64,\"num_hidden_layers\":2,"
                                   "\"num_attention_heads\":4,\"intermediate_size\":100,\"vocab_size\":50}";
        if (ft_model_config_parse(base, sizeof base - 1, "base", &c) != FT_OK) abort();
        if (ft_model_config_parse_generation((const char *)data, size, "gen.json", &c) == FT_OK)
            for (int i = 0; i < c.n_eos; i++)
                if (c.eos_ids[i] < 0 || c.eos_ids[i] >= c.vocab) abort();
        return 0;
    }
    if (c.hidden < 1 || c.n_layers < 1 || c.n_heads < 1 || c.n_kv_heads < 1 || c.vocab < 1 ||
        c.head_dim < 1 || c.ffn < 1 || c.max_pos < 1)
        abort();
    if (c.n_heads % c.n_kv_heads) abort();
    if (c.n_eos < 0 || c.n_eos > FT_MAX_EOS) abort();
    for (int i = 0; i < c.n_eos; i++)
        if (c.eos_ids[i] < 0 || c.eos_ids[i] >= c.vocab) abort();
    if (c.arch == FT_ARCH_LLAMA && c.head_dim % 2) abort();
    if (c.rope_type < FT_ROPE_DEFAULT || c.rope_type > FT_ROPE_YARN) abort();
    if (c.rope_type != FT_ROPE_DEFAULT && c.rope_type != FT_ROPE_DYNAMIC && c.arch != FT_ARCH_OPT &&
        !(c.rope_factor > 0))
        abort();
    if (c.sliding_window < 0 || c.sliding_window > c.max_pos) abort();
    for (int l = 0; l < c.n_layers; l++) {
        int w = ft_model_config_layer_window(&c, l);
        if (w && w != c.sliding_window) abort();
    }
    return 0;
}
