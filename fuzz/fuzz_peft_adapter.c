/* Fuzz the PEFT adapter reader for inference (ft_peft_adapter_read: the
 * adapter_model.safetensors keys, dtypes and shapes, after a fixed valid
 * adapter_config.json of rank 4) and its application to a model
 * (ft_peft_adapter_apply onto tests/data/models/llama-tiny: module names
 * matched against the model's, shapes checked): any input is read or
 * refused cleanly; what is read has rank 4, positive shapes and data. The
 * input is written to DIR/adapter_model.safetensors in a temporary
 * directory made once. Each input is read a second time beside a config
 * with target_parameters (LoRA on the MoE experts' fused gate_up_proj /
 * down_proj: keys mlp.experts[.base_layer].lora_A/B with A [E r, in]) and
 * applied to tests/data/models/mixtral-tiny. */
#include "flextier/engine.h"
#include "flextier/train.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef FT_SOURCE_DIR
#define FT_SOURCE_DIR "."
#endif

static char dir[] = "/tmp/ft_fuzz_peft_XXXXXX", xdir[] = "/tmp/ft_fuzz_peftx_XXXXXX";
static char cpath[64], spath[80], xcpath[64], xspath[80];
static ft_model *model, *moe;

static void cleanup(void)
{
    unlink(cpath);
    unlink(spath);
    rmdir(dir);
    unlink(xcpath);
    unlink(xspath);
    rmdir(xdir);
    ft_model_free(model);
    ft_model_free(moe);
}

static void write_file(const char *path, const uint8_t *data, size_t size)
{
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    if (size && fwrite(data, 1, size, f) != size) abort();
    fclose(f);
}

/* read d's adapter, check it, apply it to m */
static void one(const char *d, const ft_model *m)
{
    ft_peft_adapter *a = NULL;
    if (ft_peft_adapter_read(d, &a) != FT_OK) return;
    if (a->rank != 4 || !a->n || a->scale != 2.0f) abort();
    for (size_t i = 0; i < a->n; i++)
        if (a->mods[i].rank != 4 || a->mods[i].in < 1 || a->mods[i].out < 1 || !a->mods[i].A || !a->mods[i].B ||
            !a->mods[i].module[0] || a->mods[i].experts < 0)
            abort();
    if (m) {
        ft_lora *l = NULL;
        if (ft_lora_create(m, &l) == FT_OK) {
            /* a plain module is one entry; an experts module one per expert (gate_up: two) */
            size_t lo = 0, hi = 0;
            for (size_t i = 0; i < a->n; i++) {
                lo += a->mods[i].experts ? (size_t)a->mods[i].experts : 1;
                hi += a->mods[i].experts ? 2 * (size_t)a->mods[i].experts : 1;
            }
            if (ft_peft_adapter_apply(a, 0.5f, l) == FT_OK && (ft_lora_count(l) < lo || ft_lora_count(l) > hi))
                abort();
            ft_lora_free(l);
        }
    }
    ft_peft_adapter_free(a);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!cpath[0]) {
        if (!mkdtemp(dir)) abort();
        snprintf(cpath, sizeof cpath, "%s/adapter_config.json", dir);
        snprintf(spath, sizeof spath, "%s/adapter_model.safetensors", dir);
        FILE *c = fopen(cpath, "w");
        if (!c) abort();
        fputs("{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8, \"target_modules\": [\"q_proj\"]}", c);
        fclose(c);
        if (ft_model_load(FT_SOURCE_DIR "/tests/data/models/llama-tiny", NULL, &model)) model = NULL;
        if (!mkdtemp(xdir)) abort();
        snprintf(xcpath, sizeof xcpath, "%s/adapter_config.json", xdir);
        snprintf(xspath, sizeof xspath, "%s/adapter_model.safetensors", xdir);
        c = fopen(xcpath, "w");
        if (!c) abort();
        fputs("{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8, \"target_modules\": [\"q_proj\"], "
              "\"target_parameters\": [\"gate_up_proj\", \"down_proj\"]}", c);
        fclose(c);
        if (ft_model_load(FT_SOURCE_DIR "/tests/data/models/mixtral-tiny", NULL, &moe)) moe = NULL;
        atexit(cleanup);
    }
    write_file(spath, data, size);
    one(dir, model);
    write_file(xspath, data, size);
    one(xdir, moe);
    return 0;
}
