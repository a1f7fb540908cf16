/* config.json parsing: real files from the fixtures, and bad input. */
#include "ft_test.h"
#include "flextier/engine.h"

#include <math.h>

static const char *data_dir(void) { const char *d = getenv("FT_TEST_DATA"); return d ? d : "tests/data"; }

TEST(fixture_configs)
{
    char dir[512];
    ft_model_config c;
    snprintf(dir, sizeof dir, "%s/models/opt-tiny-proj", data_dir());
    CHECK_OK(ft_model_config_load(dir, &c));
    CHECK(c.arch == FT_ARCH_OPT && c.hidden == 64 && c.n_layers == 2 && c.n_heads == 4);
    CHECK(c.ffn == 128 && c.word_embed_proj_dim == 32 && c.do_layer_norm_before == 1);
    CHECK(c.final_norm == 1 && c.head_dim == 16 && c.n_eos == 1 && c.eos_ids[0] == 2);
    CHECK(c.bos_id == 2 && c.pad_id == 1 && c.tie_word_embeddings == 1);
    snprintf(dir, sizeof dir, "%s/models/opt-tiny-postln", data_dir());
    CHECK_OK(ft_model_config_load(dir, &c));
    CHECK(c.do_layer_norm_before == 0 && c.final_norm == 0);
    snprintf(dir, sizeof dir, "%s/models/llama-tiny-tied-rope3", data_dir());
    CHECK_OK(ft_model_config_load(dir, &c));
    CHECK(c.arch == FT_ARCH_LLAMA && c.n_kv_heads == 2 && c.ffn == 172 && c.head_dim == 16);
    CHECK(c.rope_type == FT_ROPE_LLAMA3 && c.rope_factor == 8.0f && c.rope_orig_max_pos == 64);
    CHECK(c.rope_theta == 500000.0f && c.tie_word_embeddings == 1 && c.norm_eps == 1e-5f);
}

static ft_status parse(const char *s, ft_model_config *c)
{
    return ft_model_config_parse(s, strlen(s), "test.json", c);
}

#define LLAMA "\"model_type\":\"llama\",\"hidden_size\":64,\"num_hidden_layers\":2," \
              "\"num_attention_heads\":4,\"intermediate_size\":100,\"vocab_size\":50"

TEST(llama_fields)
{
    ft_model_config c;
    CHECK_OK(parse("{" LLAMA ",\"eos_token_id\":[3,7],\"num_key_value_heads\":1}", &c));
    CHECK(c.n_eos == 2 && c.eos_ids[1] == 7 && c.n_kv_heads == 1 && c.head_dim == 16);
    CHECK(c.max_pos == 2048 && c.rope_theta == 10000.0f && c.rope_type == FT_ROPE_DEFAULT);
    CHECK_OK(parse("{" LLAMA ",\"head_dim\":32}", &c));
    CHECK(c.head_dim == 32);
    CHECK_OK(parse("{" LLAMA ",\"rope_scaling\":null,\"bos_token_id\":null}", &c));
    const char *g = "{\"temperature\":0.7,\"top_p\":0.9,\"do_sample\":true,\"eos_token_id\":[4]}";
    CHECK_OK(ft_model_config_parse_generation(g, strlen(g), "gen.json", &c));
    CHECK(c.gen_do_sample && c.gen_temperature == 0.7f && c.eos_ids[0] == 4 && c.n_eos == 1);
}

static void expect(const char *json, ft_status want, const char *needle)
{
    ft_model_config c;
    memset(&c, 0x5a, sizeof c);
    unsigned char before = ((unsigned char *)&c)[0];
    ft_status st = parse(json, &c);
    CHECK_MSG(st == want, "%s -> %s (%s)", json, ft_status_str(st), ft_last_error());
    CHECK_MSG(strstr(ft_last_error(), needle) != NULL, "%s: detail '%s' lacks '%s'", json, ft_last_error(), needle);
    CHECK_MSG(strstr(ft_last_error(), "test.json") != NULL, "detail lacks the file name");
    CHECK(((unsigned char *)&c)[0] == before);   /* output untouched on error */
}

TEST(bad_configs)
{
    expect("", FT_ERR_CORRUPT, "JSON");
    expect("[1]", FT_ERR_CORRUPT, "object");
    expect("{\"hidden_size\":64}", FT_ERR_CORRUPT, "model_type");
    expect("{\"model_type\":\"gpt_neox\"}", FT_ERR_UNSUPPORTED, "gpt_neox");
    expect("{\"model_type\":\"llama\",\"hidden_size\":64}", FT_ERR_CORRUPT, "num_hidden_layers");
    expect("{" LLAMA ",\"num_hidden_layers\":0}", FT_ERR_CORRUPT, "num_hidden_layers");
    expect("{\"model_type\":\"llama\",\"hidden_size\":66,\"num_hidden_layers\":2,"
           "\"num_attention_heads\":4,\"intermediate_size\":100,\"vocab_size\":50}",
           FT_ERR_CORRUPT, "num_attention_heads");
    expect("{" LLAMA ",\"num_key_value_heads\":3}", FT_ERR_CORRUPT, "num_key_value_heads");
    expect("{" LLAMA ",\"vocab_size\":1e30}", FT_ERR_CORRUPT, "vocab_size");
    expect("{" LLAMA ",\"hidden_size\":\"64\"}", FT_ERR_CORRUPT, "hidden_size");
    expect("{" LLAMA ",\"hidden_size\":99999999}", FT_ERR_CORRUPT, "hidden_size");
    expect("{" LLAMA ",\"eos_token_id\":77}", FT_ERR_CORRUPT, "eos_token_id");
    expect("{" LLAMA ",\"rope_scaling\":{\"rope_type\":\"longrope\",\"factor\":2}}", FT_ERR_UNSUPPORTED,
           "longrope");
    expect("{" LLAMA ",\"rope_parameters\":{\"rope_type\":\"su\",\"rope_theta\":10000}}", FT_ERR_UNSUPPORTED,
           "rope_parameters.rope_type");
    expect("{" LLAMA ",\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8}}", FT_ERR_CORRUPT, "rope_scaling");
    expect("{" LLAMA ",\"hidden_act\":\"gelu\"}", FT_ERR_UNSUPPORTED, "hidden_act");
    expect("{" LLAMA "} x", FT_ERR_CORRUPT, "trailing");
    expect("{\"model_type\":\"opt\",\"hidden_size\":64,\"num_hidden_layers\":2,\"num_attention_heads\":4,"
           "\"ffn_dim\":8,\"vocab_size\":50,\"max_position_embeddings\":16,\"activation_function\":\"gelu\"}",
           FT_ERR_UNSUPPORTED, "activation_function");
    expect("{\"model_type\":\"opt\",\"hidden_size\":64,\"num_hidden_layers\":2,\"num_attention_heads\":4,"
           "\"ffn_dim\":8,\"vocab_size\":50}", FT_ERR_CORRUPT, "max_position_embeddings");
}

TEST(mistral_qwen2)
{
    char dir[512];
    ft_model_config c;
    snprintf(dir, sizeof dir, "%s/models/mistral-tiny", data_dir());
    CHECK_OK(ft_model_config_load(dir, &c));
    CHECK(c.arch == FT_ARCH_LLAMA && c.sliding_window == 64 && !strcmp(c.model_type, "mistral"));
    snprintf(dir, sizeof dir, "%s/models/qwen2-tiny", data_dir());
    CHECK_OK(ft_model_config_load(dir, &c));
    CHECK(c.arch == FT_ARCH_QWEN2 && c.tie_word_embeddings && c.rope_theta == 1e6f);
    for (int l = 0; l < 2; l++) CHECK(ft_model_config_layer_window(&c, l) == 0);
}

#define QWEN "\"model_type\":\"qwen2\",\"hidden_size\":64,\"num_hidden_layers\":4," \
             "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"intermediate_size\":100,\"vocab_size\":50"

TEST(sliding_windows)
{
    ft_model_config c;
    /* Qwen2: layers >= max_window_layers, only with use_sliding_window */
    CHECK_OK(parse("{" QWEN ",\"use_sliding_window\":true,\"sliding_window\":8,\"max_window_layers\":2}", &c));
    CHECK(ft_model_config_layer_window(&c, 1) == 0 && ft_model_config_layer_window(&c, 2) == 8 &&
          ft_model_config_layer_window(&c, 3) == 8);
    CHECK_OK(parse("{" QWEN ",\"use_sliding_window\":false,\"sliding_window\":8,\"max_window_layers\":0}", &c));
    CHECK(c.sliding_window == 0 && ft_model_config_layer_window(&c, 3) == 0);
    /* transformers 5's layer_types wins over max_window_layers */
    CHECK_OK(parse("{" QWEN ",\"use_sliding_window\":true,\"sliding_window\":8,\"max_window_layers\":0,"
                   "\"layer_types\":[\"full_attention\",\"sliding_attention\",\"full_attention\","
                   "\"sliding_attention\"]}", &c));
    CHECK(ft_model_config_layer_window(&c, 0) == 0 && ft_model_config_layer_window(&c, 1) == 8 &&
          ft_model_config_layer_window(&c, 2) == 0);
    /* class defaults where keys are absent (transformers' MistralConfig / Qwen2Config) */
    CHECK_OK(parse("{\"model_type\":\"mistral\",\"hidden_size\":64,\"num_hidden_layers\":2,"
                   "\"num_attention_heads\":8,\"intermediate_size\":100,\"vocab_size\":50}", &c));
    CHECK(c.sliding_window == 4096 && c.n_kv_heads == 8 && c.max_pos == 131072);
    CHECK_OK(parse("{\"model_type\":\"mistral\",\"hidden_size\":64,\"num_hidden_layers\":2,"
                   "\"num_attention_heads\":8,\"intermediate_size\":100,\"vocab_size\":50,\"sliding_window\":null}", &c));
    CHECK(c.sliding_window == 0);
    expect("{" QWEN ",\"use_sliding_window\":true,\"sliding_window\":8,\"layer_types\":[\"full_attention\"]}",
           FT_ERR_CORRUPT, "layer_types");
    expect("{" QWEN ",\"use_sliding_window\":true,\"sliding_window\":8,\"layer_types\":[\"full_attention\","
           "\"chunked_attention\",\"full_attention\",\"full_attention\"]}", FT_ERR_UNSUPPORTED, "chunked_attention");
    expect("{" QWEN ",\"layer_types\":[\"full_attention\",\"sliding_attention\",\"full_attention\","
           "\"full_attention\"]}", FT_ERR_CORRUPT, "layer_types");
    /* a window larger than the context */
    expect("{" QWEN ",\"use_sliding_window\":true,\"sliding_window\":4096,\"max_position_embeddings\":1024}",
           FT_ERR_CORRUPT, "sliding_window");
}

TEST(rope_layouts)
{
    ft_model_config a, b;
    /* 4.x top level and 5.x rope_parameters describe the same RoPE */
    CHECK_OK(parse("{" LLAMA ",\"rope_theta\":500000,\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8,"
                   "\"low_freq_factor\":1,\"high_freq_factor\":4,\"original_max_position_embeddings\":64}}", &a));
    CHECK_OK(parse("{" LLAMA ",\"rope_parameters\":{\"rope_theta\":500000,\"rope_type\":\"llama3\",\"factor\":8,"
                   "\"low_freq_factor\":1,\"high_freq_factor\":4,\"original_max_position_embeddings\":64}}", &b));
    CHECK(a.rope_type == FT_ROPE_LLAMA3 && b.rope_type == FT_ROPE_LLAMA3 && a.rope_theta == 500000.0f &&
          b.rope_theta == 500000.0f && a.rope_factor == b.rope_factor && a.rope_orig_max_pos == 64 &&
          b.rope_orig_max_pos == 64 && b.rope_high_freq_factor == 4.0f);
    CHECK_OK(parse("{" LLAMA ",\"rope_parameters\":{\"rope_theta\":1000000,\"rope_type\":\"default\"}}", &b));
    CHECK(b.rope_theta == 1e6f && b.rope_type == FT_ROPE_DEFAULT);
    CHECK_OK(parse("{" LLAMA ",\"rope_parameters\":{\"rope_theta\":10000,\"rope_type\":\"linear\",\"factor\":2}}", &b));
    CHECK(b.rope_type == FT_ROPE_LINEAR && b.rope_factor == 2.0f);
    CHECK_OK(parse("{" LLAMA ",\"rope_scaling\":{\"type\":\"dynamic\",\"factor\":2}}", &b));
    CHECK(b.rope_type == FT_ROPE_DYNAMIC && b.rope_factor == 2.0f);
    /* yarn: attention factor 0.1 ln(factor) + 1, beta defaults 32 / 1 */
    CHECK_OK(parse("{" LLAMA ",\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4}}", &b));
    CHECK(b.rope_type == FT_ROPE_YARN && b.rope_beta_fast == 32.0f && b.rope_beta_slow == 1.0f && b.rope_truncate);
    CHECK(fabsf(b.rope_attention_factor - (float)(0.1 * log(4.0) + 1.0)) < 1e-7f);
    CHECK_OK(parse("{" LLAMA ",\"rope_parameters\":{\"rope_type\":\"yarn\",\"rope_theta\":10000,"
                   "\"original_max_position_embeddings\":512,\"mscale\":1,\"mscale_all_dim\":1,\"truncate\":false}}", &b));
    CHECK(b.rope_factor == 4.0f && b.rope_attention_factor == 1.0f && !b.rope_truncate && b.rope_orig_max_pos == 512);
    /* both layouts, agreeing: fine; contradicting: refused */
    CHECK_OK(parse("{" LLAMA ",\"rope_theta\":10000,\"rope_parameters\":{\"rope_theta\":10000,\"rope_type\":\"default\"}}", &b));
    expect("{" LLAMA ",\"rope_theta\":10000,\"rope_parameters\":{\"rope_theta\":500000,\"rope_type\":\"default\"}}",
           FT_ERR_CORRUPT, "rope_theta");
    expect("{" LLAMA ",\"rope_scaling\":{\"rope_type\":\"linear\",\"factor\":2},"
           "\"rope_parameters\":{\"rope_type\":\"linear\",\"factor\":4,\"rope_theta\":10000}}", FT_ERR_CORRUPT, "factor");
    expect("{" LLAMA ",\"rope_scaling\":{\"rope_type\":\"linear\",\"factor\":2},"
           "\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":10000}}", FT_ERR_CORRUPT, "rope_type");
    expect("{" LLAMA ",\"original_max_position_embeddings\":64,\"rope_scaling\":{\"rope_type\":\"llama3\","
           "\"factor\":8,\"low_freq_factor\":1,\"high_freq_factor\":4,\"original_max_position_embeddings\":32}}",
           FT_ERR_CORRUPT, "original_max_position_embeddings");
    expect("{" LLAMA ",\"rope_scaling\":{\"rope_type\":\"linear\"}}", FT_ERR_CORRUPT, "factor");
    expect("{" LLAMA ",\"partial_rotary_factor\":0.5}", FT_ERR_UNSUPPORTED, "partial_rotary_factor");
    expect("{" LLAMA ",\"rope_parameters\":{\"full_attention\":{\"rope_type\":\"default\"}}}", FT_ERR_UNSUPPORTED,
           "rope_parameters");
}

TEST(unknown_keys)
{
    ft_model_config c;
    const char *js = "{" LLAMA ",\"use_qk_norm\":true}";
    unsetenv("FLEXTIER_STRICT");
    CHECK_OK(ft_model_config_parse_ex(js, strlen(js), "test.json", 0, &c));   /* a warning */
    CHECK(ft_model_config_parse_ex(js, strlen(js), "test.json", FT_CONFIG_STRICT, &c) == FT_ERR_UNSUPPORTED);
    CHECK(strstr(ft_last_error(), "use_qk_norm") && strstr(ft_last_error(), "test.json"));
    setenv("FLEXTIER_STRICT", "1", 1);
    CHECK(parse(js, &c) == FT_ERR_UNSUPPORTED);
    /* keys inside the rope object too */
    expect("{" LLAMA ",\"rope_scaling\":{\"rope_type\":\"linear\",\"factor\":2,\"bogus\":1}}", FT_ERR_UNSUPPORTED,
           "rope_scaling.bogus");
    /* known harmless keys pass in strict mode */
    CHECK_OK(parse("{" LLAMA ",\"architectures\":[\"LlamaForCausalLM\"],\"pretraining_tp\":1,\"dtype\":\"bfloat16\","
                   "\"attention_dropout\":0.0,\"use_cache\":true,\"transformers_version\":\"5.24.0\"}", &c));
    expect("{" LLAMA ",\"quantization_config\":{\"quant_method\":\"gptq\"}}", FT_ERR_UNSUPPORTED,
           "quantization_config");
    const char *g = "{\"min_p\":0.1}";
    CHECK(ft_model_config_parse_generation(g, strlen(g), "gen.json", &c) == FT_ERR_UNSUPPORTED);
    CHECK(strstr(ft_last_error(), "min_p") && strstr(ft_last_error(), "gen.json"));
    /* every fixture config is fully accounted for */
    char dir[600];
    static const char *const names[] = {"opt-tiny", "opt-tiny-proj", "llama-tiny", "llama-tiny-tied-rope3",
                                        "mistral-tiny", "qwen2-tiny"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        snprintf(dir, sizeof dir, "%s/models/%s", data_dir(), names[i]);
        CHECK_OK(ft_model_config_load_ex(dir, FT_CONFIG_STRICT, &c));
    }
}

/* Issue 23's families: what each config turns on, and what is refused. */
TEST(new_families)
{
    char dir[512];
    ft_model_config c;
    const char *sets[] = {"models", "models-tf5"};
    for (int i = 0; i < 2; i++) {
        snprintf(dir, sizeof dir, "%s/%s/gemma3-tiny", data_dir(), sets[i]);
        CHECK_OK(ft_model_config_load_ex(dir, FT_CONFIG_STRICT, &c));
        CHECK(c.arch == FT_ARCH_GEMMA2 && c.qk_norm == 1 && c.norm_plus_one && c.sandwich_norm);
        CHECK(c.act == FT_ACT_GELU_TANH && c.attn_softcap == 0 && c.final_softcap == 0);
        CHECK(c.rope_local_theta == 100.0f && c.rope_theta == 10000.0f && c.rope_type == FT_ROPE_LINEAR);
        CHECK(c.layer_sliding[0] && c.layer_sliding[1] && !c.layer_sliding[2] && c.sliding_window == 5);
        CHECK(fabsf(c.attn_scale - 0.25f) < 1e-7f && c.embed_scale == sqrtf(32.0f));
        snprintf(dir, sizeof dir, "%s/%s/gemma2-tiny", data_dir(), sets[i]);
        CHECK_OK(ft_model_config_load_ex(dir, FT_CONFIG_STRICT, &c));
        CHECK(c.attn_softcap == 5.0f && c.final_softcap == 3.0f && c.qk_norm == 0 && c.head_dim == 16);
        CHECK(c.layer_sliding[0] && !c.layer_sliding[1] && c.layer_sliding[2] && c.tie_word_embeddings);
        snprintf(dir, sizeof dir, "%s/%s/qwen3moe-tiny", data_dir(), sets[i]);
        CHECK_OK(ft_model_config_load_ex(dir, FT_CONFIG_STRICT, &c));
        CHECK(c.arch == FT_ARCH_QWEN3 && c.n_experts == 8 && c.n_experts_used == 2 && c.moe_ffn == 32);
        CHECK(c.moe_norm_topk && c.layer_moe[0] && !c.layer_moe[1] && c.layer_moe[2] && c.ffn == 64);
        snprintf(dir, sizeof dir, "%s/%s/qwen2moe-tiny", data_dir(), sets[i]);
        CHECK_OK(ft_model_config_load_ex(dir, FT_CONFIG_STRICT, &c));
        CHECK(c.arch == FT_ARCH_QWEN2 && c.n_experts == 8 && c.n_experts_used == 2 && c.moe_ffn == 32);
        CHECK(!c.moe_norm_topk && c.shared_expert && c.no_qkv_bias && c.ffn == 64);
        CHECK(c.layer_moe[0] && !c.layer_moe[1] && c.layer_moe[2]);
        snprintf(dir, sizeof dir, "%s/%s/qwen2moe-shared", data_dir(), sets[i]);
        CHECK_OK(ft_model_config_load_ex(dir, FT_CONFIG_STRICT, &c));
        CHECK(c.shared_expert && !c.no_qkv_bias && c.ffn == 96 && c.n_experts_used == 4);   /* every layer sparse */
        snprintf(dir, sizeof dir, "%s/%s/olmoe-tiny", data_dir(), sets[i]);
        CHECK_OK(ft_model_config_load_ex(dir, FT_CONFIG_STRICT, &c));
        CHECK(c.arch == FT_ARCH_OLMOE && c.qk_norm == 2 && !c.moe_norm_topk && c.n_experts == 8);
        snprintf(dir, sizeof dir, "%s/%s/mixtral-tiny", data_dir(), sets[i]);
        CHECK_OK(ft_model_config_load_ex(dir, FT_CONFIG_STRICT, &c));
        CHECK(c.arch == FT_ARCH_MIXTRAL && c.moe_norm_topk && c.n_experts == 4 && c.moe_ffn == 64);
        snprintf(dir, sizeof dir, "%s/%s/phi3-sw", data_dir(), sets[i]);
        CHECK_OK(ft_model_config_load_ex(dir, FT_CONFIG_STRICT, &c));
        CHECK(c.arch == FT_ARCH_PHI3 && c.sliding_window == 5 && c.layer_sliding[0] && c.layer_sliding[1]);
    }
#define BASE "\"hidden_size\":32,\"num_hidden_layers\":2,\"num_attention_heads\":4,\"intermediate_size\":64," \
             "\"vocab_size\":50"
    /* refused, never guessed */
    CHECK(parse("{\"model_type\":\"phi3\"," BASE ",\"rope_scaling\":{\"type\":\"longrope\",\"short_factor\":[1],"
                "\"long_factor\":[1]}}", &c) == FT_ERR_UNSUPPORTED);
    CHECK(strstr(ft_last_error(), "LongRoPE") != NULL);
    CHECK(parse("{\"model_type\":\"phi3\"," BASE ",\"rope_scaling\":{\"type\":\"su\"}}", &c) == FT_ERR_UNSUPPORTED);
    CHECK(parse("{\"model_type\":\"phi3\"," BASE ",\"rope_scaling\":{\"type\":\"yarn\",\"factor\":2}}", &c) ==
          FT_ERR_UNSUPPORTED);
    CHECK(parse("{\"model_type\":\"gemma2\"," BASE ",\"hidden_activation\":\"gelu\"}", &c) == FT_ERR_UNSUPPORTED);
    CHECK(parse("{\"model_type\":\"gemma3_text\"," BASE ",\"use_bidirectional_attention\":true}", &c) ==
          FT_ERR_UNSUPPORTED);
    CHECK(parse("{\"model_type\":\"gemma3_text\"," BASE ",\"rope_parameters\":{\"full_attention\":{\"rope_type\":"
                "\"default\",\"rope_theta\":1e6},\"sliding_attention\":{\"rope_type\":\"linear\",\"factor\":2,"
                "\"rope_theta\":1e4}}}", &c) == FT_ERR_UNSUPPORTED);
    CHECK(parse("{\"model_type\":\"olmoe\"," BASE ",\"clip_qkv\":8.0}", &c) == FT_ERR_UNSUPPORTED);
    CHECK(parse("{\"model_type\":\"qwen3_moe\"," BASE ",\"use_sliding_window\":true}", &c) == FT_ERR_UNSUPPORTED);
    /* qwen2_moe: windows, a dense layer narrower than the shared expert, DeepSeek's MLA */
    CHECK(parse("{\"model_type\":\"qwen2_moe\",\"num_key_value_heads\":2," BASE ",\"use_sliding_window\":true}", &c) == FT_ERR_UNSUPPORTED);
    CHECK(parse("{\"model_type\":\"qwen2_moe\",\"num_key_value_heads\":2," BASE ",\"layer_types\":[\"sliding_attention\","
                "\"full_attention\"]}", &c) == FT_ERR_UNSUPPORTED);
    CHECK(parse("{\"model_type\":\"qwen2_moe\",\"num_key_value_heads\":2," BASE ",\"num_experts\":4,\"mlp_only_layers\":[1],"
                "\"shared_expert_intermediate_size\":96}", &c) == FT_ERR_UNSUPPORTED);
    CHECK(strstr(ft_last_error(), "dense layer 1") != NULL);
    CHECK_OK(parse("{\"model_type\":\"qwen2_moe\",\"hidden_size\":64,\"num_hidden_layers\":2,\"num_attention_heads\":16,"
                   "\"intermediate_size\":64,\"vocab_size\":50,\"num_experts\":4,\"mlp_only_layers\":[1],"
                   "\"shared_expert_intermediate_size\":64}", &c));   /* Qwen2MoeConfig's defaults */
    CHECK(c.shared_expert && c.n_experts_used == 4 && c.n_kv_heads == 16 && c.moe_ffn == 1408 && !c.no_qkv_bias);
    CHECK_OK(parse("{\"model_type\":\"qwen2_moe\",\"num_key_value_heads\":2," BASE ",\"num_experts\":0}", &c));
    CHECK(!c.shared_expert && c.n_experts == 0);   /* no sparse layer: a dense model */
    CHECK(parse("{\"model_type\":\"deepseek_v3\"," BASE "}", &c) == FT_ERR_UNSUPPORTED);
    CHECK(strstr(ft_last_error(), "latent attention") != NULL);
    CHECK(parse("{\"model_type\":\"deepseek_v2\"," BASE "}", &c) == FT_ERR_UNSUPPORTED);
    CHECK(parse("{\"model_type\":\"qwen3_moe\"," BASE ",\"num_experts\":4,\"num_local_experts\":8}", &c) ==
          FT_ERR_CORRUPT);
    CHECK(parse("{\"model_type\":\"mixtral\"," BASE ",\"num_local_experts\":2,\"num_experts_per_tok\":3}", &c) ==
          FT_ERR_CORRUPT);
    CHECK(parse("{\"model_type\":\"qwen3_moe\"," BASE ",\"num_experts\":4,\"mlp_only_layers\":[2]}", &c) ==
          FT_ERR_CORRUPT);
    CHECK(parse("{\"model_type\":\"qwen3_moe\"," BASE ",\"num_experts\":4,\"mlp_only_layers\":\"x\"}", &c) ==
          FT_ERR_CORRUPT);
    /* decoder_sparse_step 2: layers 1, 3, ... sparse; all dense: a dense model */
    CHECK_OK(parse("{\"model_type\":\"qwen3_moe\"," BASE ",\"num_experts\":4,\"num_experts_per_tok\":2,"
                   "\"decoder_sparse_step\":2}", &c));
    CHECK(c.n_experts == 4 && !c.layer_moe[0] && c.layer_moe[1]);
    CHECK_OK(parse("{\"model_type\":\"qwen3_moe\"," BASE ",\"num_experts\":4,\"num_experts_per_tok\":2,"
                   "\"mlp_only_layers\":[0,1]}", &c));
    CHECK(c.n_experts == 0);
    /* the qwen3 head_dim default is 128, not hidden / heads */
    CHECK_OK(parse("{\"model_type\":\"qwen3\"," BASE ",\"num_key_value_heads\":2}", &c));
    CHECK(c.head_dim == 128 && c.qk_norm == 1);
#undef BASE
}

TEST(load_missing)
{
    ft_model_config c;
    CHECK(ft_model_config_load("/nonexistent", &c) == FT_ERR_NOT_FOUND);
}
