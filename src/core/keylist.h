/* Internal: a list of key strings under construction, shared by the store
 * backends that list their keys (src/store) and the wire-message parsers
 * that receive lists (src/net). The finished array is what the public
 * ft_list_tensors returns: v[0..n-1] and v itself from malloc, freed with
 * ft_list_free (flextier/store.h) or, while still a list, ft_keylist_free.
 * FT_API: flextier-store calls these (exported, not public API). */
#ifndef FT_CORE_KEYLIST_H
#define FT_CORE_KEYLIST_H
#include "flextier/core.h"

typedef struct ft_keylist { char **v; size_t n, cap; } ft_keylist;

/* Append a copy of key[0..len) (NUL added). FT_ERR_NOMEM leaves the list
 * as it was. */
FT_API ft_status ft_keylist_add(ft_keylist *l, const char *key, size_t len);
/* Free every key and the array; the list is empty again. NULL ok. */
FT_API void ft_keylist_free(ft_keylist *l);
#endif
