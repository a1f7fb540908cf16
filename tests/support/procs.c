/* Test support: server processes (procs.h). One copy of what the net,
 * offload and agent tests each used to carry. */
#include "procs.h"
#include "flextier/core.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_PROCS 64
static pid_t g_procs[MAX_PROCS];

static void kill_all(void)
{
    for (int i = 0; i < MAX_PROCS; i++)
        if (g_procs[i] > 0) {
            kill(g_procs[i], SIGKILL);
            waitpid(g_procs[i], NULL, 0);
            g_procs[i] = 0;
        }
}

static void track(pid_t pid, int add)
{
    static int registered;
    if (!registered) { atexit(kill_all); registered = 1; }
    for (int i = 0; i < MAX_PROCS; i++)
        if (add ? g_procs[i] == 0 : g_procs[i] == pid) { g_procs[i] = add ? pid : 0; return; }
}

void ft_proc_forget(pid_t pid) { track(pid, 0); }

int ft_proc_start(ft_proc *p, const char *cmd, const char *const *args)
{
    memset(p, 0, sizeof *p);
    const char *bin = getenv("FT_BIN"), *wrap = getenv("FT_EXEC_WRAPPER");
    if (!bin) { fprintf(stderr, "FT_BIN not set\n"); return -1; }
    const char *argv[48];
    int n = 0;
    if (wrap && *wrap) argv[n++] = wrap;
    argv[n++] = bin;
    argv[n++] = cmd;
    for (int i = 0; args && args[i] && n < 38; i++) argv[n++] = args[i];
    char extra[256];
    const char *ex = getenv("FT_TEST_SERVE_EXTRA");
    if (ex && !strcmp(cmd, "serve")) {
        snprintf(extra, sizeof extra, "%s", ex);
        char *save = NULL;
        for (char *tok = strtok_r(extra, " ", &save); tok && n < 46; tok = strtok_r(NULL, " ", &save))
            argv[n++] = tok;
    }
    argv[n] = NULL;
    int fds[2];
    if (pipe(fds) != 0) return -1;
    pid_t pid = fork();
    if (pid < 0) {
        close(fds[0]);
        close(fds[1]);
        return -1;
    }
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
    track(pid, 1);
    char buf[512];
    size_t got = 0;
    buf[0] = 0;
    double dl = ft_now() + 60;   /* qemu-user is slow */
    p->pid = pid;
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
        track(pid, 0);
        p->pid = 0;
        fprintf(stderr, "%s did not start: '%s'\n", cmd, buf);
        return -1;
    }
    snprintf(p->hostport, sizeof p->hostport, "127.0.0.1:%d", p->port);
    snprintf(p->uri, sizeof p->uri, "%s://127.0.0.1:%d", strcmp(cmd, "agent") ? "ucx" : "agent", p->port);
    return 0;
}

int ft_proc_stop(ft_proc *p, int hard)
{
    if (p->pid <= 0) return -1;
    kill(p->pid, hard ? SIGKILL : SIGTERM);
    double dl = ft_now() + 20;
    int status = 0, ret = -1;
    for (;;) {
        pid_t r = waitpid(p->pid, &status, WNOHANG);
        if (r == p->pid) {
            ret = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
            break;
        }
        if (r < 0) break;   /* already reaped: the pid may be another's now */
        if (ft_now() >= dl) {
            kill(p->pid, SIGKILL);
            waitpid(p->pid, NULL, 0);
            break;
        }
        usleep(10000);
    }
    track(p->pid, 0);
    p->pid = 0;
    return ret;
}
