/* Test support: start and stop the flextier program's servers - `flextier
 * serve` (a memory node) and `flextier agent` - on 127.0.0.1 with a free
 * port. Through $FT_EXEC_WRAPPER when set (qemu-user in the aarch64
 * build); `serve` also gets the options in $FT_TEST_SERVE_EXTRA (the UCX
 * variant of the net tests: --trusted-network). Every process started is
 * killed at exit, even when a test bailed out early. */
#ifndef FT_SUPPORT_PROCS_H
#define FT_SUPPORT_PROCS_H
#include <sys/types.h>

typedef struct ft_proc {
    pid_t pid;
    int   port;
    char  uri[80];        /* serve: ucx://127.0.0.1:PORT, agent: agent://... */
    char  hostport[64];   /* 127.0.0.1:PORT */
} ft_proc;

/* `$FT_BIN cmd args...` (args NULL-terminated, may be NULL); waits up to
 * 60 s for "listening on 127.0.0.1:PORT" on its stdout. Its stderr goes
 * to /dev/null unless FT_TEST_VERBOSE is set. 0, or -1 (said on stderr). */
int ft_proc_start(ft_proc *p, const char *cmd, const char *const *args);

/* SIGTERM (hard: SIGKILL), wait up to 20 s (then SIGKILL) and reap. The
 * exit status of a normal exit, -1 otherwise. */
int ft_proc_stop(ft_proc *p, int hard);

/* The test reaped pid itself: no longer kill it at exit. */
void ft_proc_forget(pid_t pid);
#endif
