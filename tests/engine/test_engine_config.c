/* config.json parsing: real files from the fixtures, and bad input. */
#include "ft_test.h"
#include "flextier/engine.h"

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
    CHECK(c.rope_llama3 && c.rope_factor == 8.0f && c.rope_orig_max_pos == 64);
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
    CHECK(c.max_pos == 2048 && c.rope_theta == 10000.0f && !c.rope_llama3);
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
    expect("{" LLAMA ",\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":2}}", FT_ERR_UNSUPPORTED, "yarn");
    expect("{" LLAMA ",\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8}}", FT_ERR_CORRUPT, "rope_scaling");
    expect("{" LLAMA ",\"hidden_act\":\"gelu\"}", FT_ERR_UNSUPPORTED, "hidden_act");
    expect("{" LLAMA "} x", FT_ERR_CORRUPT, "trailing");
    expect("{\"model_type\":\"opt\",\"hidden_size\":64,\"num_hidden_layers\":2,\"num_attention_heads\":4,"
           "\"ffn_dim\":8,\"vocab_size\":50,\"max_position_embeddings\":16,\"activation_function\":\"gelu\"}",
           FT_ERR_UNSUPPORTED, "activation_function");
    expect("{\"model_type\":\"opt\",\"hidden_size\":64,\"num_hidden_layers\":2,\"num_attention_heads\":4,"
           "\"ffn_dim\":8,\"vocab_size\":50}", FT_ERR_CORRUPT, "max_position_embeddings");
}

TEST(load_missing)
{
    ft_model_config c;
    CHECK(ft_model_config_load("/nonexistent", &c) == FT_ERR_NOT_FOUND);
}
