/* The engine's LoRA set (lora.c), as the CPU backend reads it. */
#ifndef FT_ENGINE_LORA_H
#define FT_ENGINE_LORA_H
#include "engine_internal.h"

typedef struct ft_lora_entry {
    int layer, slot, rank, in, out;
    float scale;
    float *A, *B;        /* [rank][in], [out][rank] */
    int next;            /* the next entry of the same (layer, slot), -1 */
} ft_lora_entry;

struct ft_lora {
    const ft_model *m;
    ft_lora_entry *e;
    size_t n, cap;
    int *head;           /* [n_layers][nslots]: the first entry, -1 */
    int nslots;          /* LW_COUNT + 3 n_experts (the experts' slots) */
    int max_rank, max_out, max_in;
    uint64_t bytes;
};

static inline int ft_lora_first(const ft_lora *l, int layer, int slot)
{
    return l && slot >= 0 && slot < l->nslots ? l->head[(size_t)layer * (size_t)l->nslots + (size_t)slot] : -1;
}
#endif
