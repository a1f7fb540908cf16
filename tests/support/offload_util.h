/* Shared by the offloading tests: a context whose layer weights come from
 * a scheduler (o, may be NULL) and whose KV cache, when kvp is given, is
 * offloaded by that policy (group/chunk: 0 = defaults). */
#ifndef FT_TEST_OFFLOAD_UTIL_H
#define FT_TEST_OFFLOAD_UTIL_H
#include "flextier/offload.h"

static inline ft_status offload_ctx(ft_model *m, ft_ctx_params cp, ft_offload *o, const ft_policy *kvp,
                                    uint32_t group, uint32_t chunk, ft_ctx **c, ft_kv_offload **kv)
{
    *c = NULL;
    *kv = NULL;
    cp.external_kv = kvp != NULL;
    ft_status st = ft_ctx_create(m, &cp, c);
    if (st) return st;
    if (o) ft_ctx_set_layer_hook(*c, ft_offload_hook, o);
    if (!kvp) return FT_OK;
    ft_kv_offload_params kp;
    ft_kv_offload_default_params(&kp);
    kp.policy = *kvp;
    kp.max_batch = cp.max_batch;
    kp.max_seq = cp.max_seq;
    if (group) kp.group_size = group;
    kp.chunk_tokens = chunk;
    if ((st = ft_kv_offload_create(m, &kp, kv))) {
        ft_ctx_free(*c);
        *c = NULL;
        return st;
    }
    ft_kv_hooks h;
    ft_kv_offload_hooks(*kv, &h);
    ft_ctx_set_kv_hooks(*c, &h);
    return FT_OK;
}
#endif
