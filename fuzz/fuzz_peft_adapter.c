/* Fuzz the PEFT adapter reader for inference (ft_peft_adapter_read: the
 * adapter_model.safetensors keys, dtypes and shapes, after a fixed valid
 * adapter_config.json of rank 4) and its application to a model
 * (ft_peft_adapter_apply onto tests/data/models/llama-tiny: module names
 * matched against the model's, shapes checked): any input is read or
 * refused cleanly; what is read has rank 4, positive shapes and data. The
 * input is written to DIR/adapter_model.safetensors in a temporary
 * directory made once. */
#include "flextier/engine.h"
#include "flextier/train.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef FT_SOURCE_DIR
#define FT_SOURCE_DIR "."
#endif

static char dir[] = "/tmp/ft_fuzz_peft_XXXXXX";
static char cpath[64], spath[80];
static ft_model *model;

static void cleanup(void)
{
    unlink(cpath);
    unlink(spath);
    rmdir(dir);
    ft_model_free(model);
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
        atexit(cleanup);
    }
    FILE *f = fopen(spath, "wb");
    if (!f) abort();
    if (size && fwrite(data, 1, size, f) != size) abort();
    fclose(f);
    ft_peft_adapter *a = NULL;
    if (ft_peft_adapter_read(dir, &a) != FT_OK) return 0;
    if (a->rank != 4 || !a->n || a->scale != 2.0f) abort();
    for (size_t i = 0; i < a->n; i++)
        if (a->mods[i].rank != 4 || a->mods[i].in < 1 || a->mods[i].out < 1 || !a->mods[i].A || !a->mods[i].B ||
            !a->mods[i].module[0])
            abort();
    if (model) {
        ft_lora *l = NULL;
        if (ft_lora_create(model, &l) == FT_OK) {
            if (ft_peft_adapter_apply(a, 0.5f, l) == FT_OK && ft_lora_count(l) != a->n) abort();
            ft_lora_free(l);
        }
    }
    ft_peft_adapter_free(a);
    return 0;
}
