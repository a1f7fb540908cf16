/* A program that embeds the whole library through the umbrella header:
 * a tensor through a mem: store, a model config parsed and a model built
 * from it, an offloading policy parsed, the CUDA entry point asked, and
 * (full MODEL_DIR) a session opened on a model directory that generates
 * text greedily, twice, with the same result; full MODEL_DIR cuda also
 * asks the CUDA backend whether a device can be used (the plugin). */
#include "flextier/flextier.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(const char *what)
{
    fprintf(stderr, "full: %s: %s\n", what, ft_last_error());
    return 1;
}

int main(int argc, char **argv)
{
    if (ft_version_number() != FT_VERSION_NUMBER) return fail("version");
    ft_store *s = NULL;
    if (ft_store_open("mem:", NULL, &s)) return fail("store");
    float v[256];
    for (int i = 0; i < 256; i++) v[i] = (float)i * 0.5f;
    int64_t shape[1] = {256};
    ft_tensor t, out;
    ft_tensor_init(&t, FT_F32, 1, shape, v);
    ft_codec_params cp;
    ft_codec_default_params(&cp);
    cp.codec = FT_CODEC_ZSTD;
    if (ft_write_tensor(s, "v", &t, &cp) || ft_read_tensor(s, "v", -1, &out)) return fail("tensor");
    int same = out.ndim == 1 && out.shape[0] == 256 && !memcmp(out.data, v, sizeof v);
    ft_free_aligned(out.data);
    ft_store_close(s);
    if (!same) return fail("tensor differs");

    static const char cfg_json[] =
        "{\"model_type\": \"llama\", \"hidden_size\": 64, \"intermediate_size\": 96,"
        " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
        " \"vocab_size\": 128, \"max_position_embeddings\": 64, \"rms_norm_eps\": 1e-5,"
        " \"hidden_act\": \"silu\", \"rope_theta\": 10000.0, \"tie_word_embeddings\": false}";
    ft_model_config cfg;
    ft_model *m = NULL;
    if (ft_model_config_parse(cfg_json, strlen(cfg_json), "config.json", &cfg)) return fail("config");
    if (ft_model_create(&cfg, &m)) return fail("model");
    printf("model: %d layers, %llu weight bytes\n", cfg.n_layers, (unsigned long long)ft_model_weight_bytes(m));
    ft_model_free(m);

    ft_policy pol;
    if (ft_policy_parse("w=0,50,50 c=0,100", &pol)) return fail("policy");
    printf("cuda built: %d\n", ft_cuda_built());
    if (argc > 2 && !strcmp(argv[2], "cuda")) {   /* opens the CUDA backend plugin */
        char why[512];
        ft_status cs = ft_cuda_available(why, sizeof why);
        printf("cuda: %s: %s\n", ft_status_str(cs), why);
    }
    if (argc > 1) {
        ft_session_params sp;
        ft_session_default_params(&sp);
        sp.max_seq = 64;
        ft_session *ses = NULL;
        if (ft_session_open(argv[1], &sp, &ses)) return fail("session open");
        ft_text_params tp;
        memset(&tp, 0, sizeof tp);
        tp.gen.max_new_tokens = 8;
        tp.gen.ignore_eos = 1;
        tp.gen.sampling = (ft_sampling){0};   /* greedy */
        const char *prompt = "The quick brown fox";
        char *a = NULL, *b = NULL;
        ft_gen_stats gs;
        if (ft_session_generate_text(ses, 1, &prompt, &tp, &a, &gs)) return fail("generate");
        if (ft_session_generate_text(ses, 1, &prompt, &tp, &b, NULL)) return fail("generate again");
        int ok = a && b && !strcmp(a, b) && gs.decode_tokens + gs.prefill_tokens > 0;
        printf("session: %zu+%zu tokens: '%s'\n", gs.prefill_tokens, gs.decode_tokens, a ? a : "");
        free(a);
        free(b);
        ft_session_close(ses);
        if (!ok) return fail("session output differs between two greedy runs");
    }
    printf("full ok (flextier %s)\n", ft_version_string());
    return 0;
}
