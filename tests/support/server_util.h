/* Test support: a `flextier serve` memory node (FT_BIN) on 127.0.0.1 with
 * a free port, for the net, offload and CLI tests: procs.h with the
 * listen address first. */
#ifndef FT_SUPPORT_SERVER_UTIL_H
#define FT_SUPPORT_SERVER_UTIL_H
#include "support/procs.h"
#include "flextier/core.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

typedef ft_proc srv_t;   /* pid, port, uri (ucx://127.0.0.1:PORT), hostport */

/* `flextier serve --listen LISTEN args...` (args NULL-terminated). */
static inline int srv_start(srv_t *s, const char *listen, const char *const *args)
{
    const char *a[40] = {"--listen", listen};
    int n = 2;
    for (int i = 0; args && args[i] && n < 39; i++) a[n++] = args[i];
    a[n] = NULL;
    return ft_proc_start(s, "serve", a);
}

/* SIGTERM and wait: the exit status (0: clean), -1 if it had to be killed. */
static inline int srv_stop(srv_t *s) { return ft_proc_stop(s, 0); }
#endif
