/* Fuzz the PEFT adapter_config.json reader (ft_lora_read_config, the
 * train layer): any input must parse or fail cleanly; a config that
 * parses gives a rank in [1, 4096], a positive alpha and known targets.
 * The inference reader (ft_peft_adapter_read: any target names) reads
 * the same file; without adapter_model.safetensors it must fail cleanly
 * after the config.
 * The reader takes a directory, so the input is written to
 * DIR/adapter_config.json in a temporary directory made once. */
#include "flextier/train.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char dir[] = "/tmp/ft_fuzz_lora_XXXXXX";
static char path[64];

static void cleanup(void)
{
    unlink(path);
    rmdir(dir);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!path[0]) {
        if (!mkdtemp(dir)) abort();
        snprintf(path, sizeof path, "%s/adapter_config.json", dir);
        atexit(cleanup);
    }
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    if (size && fwrite(data, 1, size, f) != size) abort();
    fclose(f);
    ft_peft_adapter *a = NULL;
    if (ft_peft_adapter_read(dir, &a) == FT_OK) abort();   /* there is no safetensors file */
    ft_train_params p;
    ft_train_params_default(&p);
    if (ft_lora_read_config(dir, &p) != FT_OK) return 0;
    if (p.rank < 1 || p.rank > 4096 || !(p.alpha > 0.0f) || !p.targets || (p.targets & ~(unsigned)FT_LORA_ANY))
        abort();
    return 0;
}
