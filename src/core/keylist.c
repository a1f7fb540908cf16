/* Key lists (keylist.h): moved out of the store so that the wire-message
 * parsers below it (src/net) can build the lists they receive. */
#include "keylist.h"

#include <stdlib.h>
#include <string.h>

ft_status ft_keylist_add(ft_keylist *l, const char *key, size_t len)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 16;
        char **v = realloc(l->v, cap * sizeof *v);
        if (!v) return ft_set_error(FT_ERR_NOMEM, "key list");
        l->v = v;
        l->cap = cap;
    }
    char *k = malloc(len + 1);
    if (!k) return ft_set_error(FT_ERR_NOMEM, "key list");
    memcpy(k, key, len);
    k[len] = 0;
    l->v[l->n++] = k;
    return FT_OK;
}

void ft_keylist_free(ft_keylist *l)
{
    if (!l) return;
    for (size_t i = 0; i < l->n; i++) free(l->v[i]);
    free(l->v);
    l->v = NULL;
    l->n = l->cap = 0;
}
