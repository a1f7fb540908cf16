/* Test helper: start `flextier serve` and `flextier agent` (FT_BIN) on
 * 127.0.0.1 with free ports, through FT_EXEC_WRAPPER (qemu-user in the
 * aarch64 build) when set. Every process started is killed at exit. */
#ifndef FT_TEST_AGENT_UTIL_H
#define FT_TEST_AGENT_UTIL_H
#include "flextier/core.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct {
    pid_t pid;
    int   port;
    char  hostport[64];
} proc_t;

static pid_t g_procs[64];
static void procs_kill_all(void)
{
    for (int i = 0; i < 64; i++)
        if (g_procs[i] > 0) {
            kill(g_procs[i], SIGKILL);
            waitpid(g_procs[i], NULL, 0);
            g_procs[i] = 0;
        }
}
static void procs_track(pid_t pid, int add)
{
    static int registered;
    if (!registered) { atexit(procs_kill_all); registered = 1; }
    for (int i = 0; i < 64; i++)
        if (add ? g_procs[i] == 0 : g_procs[i] == pid) { g_procs[i] = add ? pid : 0; return; }
}

/* Start `FT_BIN cmd args...` and wait for "listening on 127.0.0.1:PORT"
 * on its stdout (timeout: 60 s, qemu is slow). */
static int proc_start(proc_t *p, const char *cmd, const char *const *args)
{
    const char *bin = getenv("FT_BIN"), *wrap = getenv("FT_EXEC_WRAPPER");
    if (!bin) { fprintf(stderr, "FT_BIN not set\n"); return -1; }
    const char *argv[40];
    int n = 0;
    if (wrap && *wrap) argv[n++] = wrap;
    argv[n++] = bin;
    argv[n++] = cmd;
    for (int i = 0; args && args[i] && n < 38; i++) argv[n++] = args[i];
    argv[n] = NULL;
    int fds[2];
    if (pipe(fds) != 0) return -1;
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        dup2(fds[1], 1);
        if (!getenv("FT_TEST_VERBOSE")) {
            int null = open("/dev/null", O_WRONLY);
            if (null >= 0) dup2(null, 2);
        }
        close(fds[0]);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    close(fds[1]);
    procs_track(pid, 1);
    char buf[512];
    size_t got = 0;
    buf[0] = 0;
    double dl = ft_now() + 60;
    p->pid = pid;
    p->port = 0;
    while (ft_now() < dl && got < sizeof buf - 1) {
        struct pollfd q = {fds[0], POLLIN, 0};
        if (poll(&q, 1, 100) <= 0) continue;
        ssize_t r = read(fds[0], buf + got, sizeof buf - 1 - got);
        if (r <= 0) break;
        got += (size_t)r;
        buf[got] = 0;
        char *at = strstr(buf, "listening on 127.0.0.1:");
        if (at && strchr(at, '\n')) {
            p->port = atoi(at + strlen("listening on 127.0.0.1:"));
            break;
        }
    }
    close(fds[0]);
    if (!p->port) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        procs_track(pid, 0);
        fprintf(stderr, "%s did not start: '%s'\n", cmd, buf);
        return -1;
    }
    snprintf(p->hostport, sizeof p->hostport, "127.0.0.1:%d", p->port);
    return 0;
}

/* SIGTERM (or SIGKILL when hard) and reap. */
static void proc_stop(proc_t *p, int hard)
{
    if (p->pid <= 0) return;
    kill(p->pid, hard ? SIGKILL : SIGTERM);
    double dl = ft_now() + 20;
    int status;
    while (ft_now() < dl && waitpid(p->pid, &status, WNOHANG) == 0) usleep(10000);
    if (ft_now() >= dl) {
        kill(p->pid, SIGKILL);
        waitpid(p->pid, NULL, 0);
    }
    procs_track(p->pid, 0);
    p->pid = 0;
}

/* A memory node, and an agent in front of it. extra: more agent args. */
static int start_node(proc_t *node, const char *const *extra)
{
    const char *a[12] = {"--listen", "127.0.0.1:0", "--capacity", "1G"};
    int n = 4;
    for (int i = 0; extra && extra[i] && n < 11; i++) a[n++] = extra[i];
    a[n] = NULL;
    return proc_start(node, "serve", a);
}

static int start_agent(proc_t *agent, const proc_t *node, const char *const *extra)
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
