/* Mixture-of-experts routing (moe.h). */
#include "moe.h"
#include "kernels.h"

#include <string.h>

void ft_moe_route(float *logits, int rows, int E, int k, int renorm, int *idx, float *wt)
{
    for (int r = 0; r < rows; r++) {
        float *p = logits + (size_t)r * (size_t)E;
        ft_k_softmax_ref(p, E);   /* torch.softmax(dtype=float) */
        int *ix = idx + (size_t)r * (size_t)k;
        float *w = wt + (size_t)r * (size_t)k;
        /* selection of the k largest, stable: a later expert replaces an
         * earlier one only when strictly larger */
        for (int j = 0; j < k; j++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int i = 0; i < j; i++) taken |= ix[i] == e;
                if (taken) continue;
                if (best < 0 || p[e] > p[best]) best = e;
            }
            ix[j] = best;
            w[j] = p[best];
        }
        if (renorm) {
            float s = 0;
            for (int j = 0; j < k; j++) s += w[j];
            for (int j = 0; j < k; j++) w[j] /= s;
        }
    }
}

void ft_moe_group(const int *idx, const float *wt, int rows, int E, int k, int *start, int *grow, float *gwt)
{
    memset(start, 0, (size_t)(E + 1) * sizeof *start);
    for (size_t i = 0; i < (size_t)rows * (size_t)k; i++) start[idx[i] + 1]++;
    for (int e = 0; e < E; e++) start[e + 1] += start[e];
    /* rows in increasing order within each expert: fill row by row */
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < k; j++) {
            size_t i = (size_t)r * (size_t)k + (size_t)j;
            int e = idx[i];
            int at = start[e]++;
            grow[at] = r;
            gwt[at] = wt[i];
        }
    /* start[e] now holds the end of e: shift back */
    for (int e = E; e > 0; e--) start[e] = start[e - 1];
    start[0] = 0;
}
