/* Mixture-of-experts routing as transformers computes it (mixtral,
 * qwen3_moe, olmoe): softmax of the router logits over all experts in
 * f32, the k largest (ties: the lower index first, as torch.topk on CPU
 * returns them), optionally renormalised to sum 1; and the grouping of
 * the rows by expert, so each expert's matrices are read once per call
 * for all the rows routed to it. */
#ifndef FT_ENGINE_MOE_H
#define FT_ENGINE_MOE_H
#include <stddef.h>

/* logits: rows x E (overwritten by the probabilities). idx/wt: rows x k,
 * in decreasing weight. */
void ft_moe_route(float *logits, int rows, int E, int k, int renorm, int *idx, float *wt);

/* Group rows by expert: start[e] .. start[e + 1] (start has E + 1
 * entries) index grow/gwt, the rows routed to expert e in increasing row
 * order and their weights. grow/gwt: rows x k entries. */
void ft_moe_group(const int *idx, const float *wt, int rows, int E, int k, int *start, int *grow, float *gwt);
#endif
