/* Test helper: start `flextier serve` and `flextier agent` (FT_BIN) on
 * 127.0.0.1 with free ports (tests/support/procs.h: through
 * FT_EXEC_WRAPPER, qemu-user in the aarch64 build, when set; every process
 * started is killed at exit). */
#ifndef FT_TEST_AGENT_UTIL_H
#define FT_TEST_AGENT_UTIL_H
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

typedef ft_proc proc_t;   /* pid, port, hostport (127.0.0.1:PORT), uri */

/* `FT_BIN cmd args...`, listening on a free port (support/procs.h). */
static inline int proc_start(proc_t *p, const char *cmd, const char *const *args)
{
    return ft_proc_start(p, cmd, args);
}

/* SIGTERM (or SIGKILL when hard) and reap. */
static inline void proc_stop(proc_t *p, int hard) { (void)ft_proc_stop(p, hard); }

/* A memory node, and an agent in front of it. extra: more agent args. */
static inline int start_node(proc_t *node, const char *const *extra)
{
    const char *a[12] = {"--listen", "127.0.0.1:0", "--capacity", "1G"};
    int n = 4;
    for (int i = 0; extra && extra[i] && n < 11; i++) a[n++] = extra[i];
    a[n] = NULL;
    return proc_start(node, "serve", a);
}

static inline int start_agent(proc_t *agent, const proc_t *node, const char *const *extra)
{
    static char nodeuri[2][80];
    static int k;
    char *u = nodeuri[k++ & 1];
    snprintf(u, 80, "ucx://%s", node->hostport);
    const char *a[16] = {"--listen", "127.0.0.1:0", "--node", u, "--threads", "2"};
    int n = 6;
    for (int i = 0; extra && extra[i] && n < 15; i++) a[n++] = extra[i];
    a[n] = NULL;
    return proc_start(agent, "agent", a);
}
#endif
