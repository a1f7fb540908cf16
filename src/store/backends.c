/* The store's URI schemes (store_internal.h): the one place that links the
 * backends into ft_store_open. A new backend adds its scheme here. */
#include "store_internal.h"

#include <string.h>

const ft_store_scheme *const ft_store_schemes[] = {
    &ft_store_scheme_mem,
    &ft_store_scheme_file,
    &ft_store_scheme_ucx,
    &ft_store_scheme_agent,
    NULL,
};

const ft_store_scheme *ft_store_scheme_find(const char *uri, const char **spec)
{
    for (size_t i = 0; ft_store_schemes[i]; i++) {
        const ft_store_scheme *sc = ft_store_schemes[i];
        size_t n = strlen(sc->prefix);
        if (!strncmp(uri, sc->prefix, n)) { *spec = uri + n; return sc; }
        if (sc->alias && !strcmp(uri, sc->alias)) { *spec = ""; return sc; }
    }
    return NULL;
}
