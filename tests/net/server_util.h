/* Test helper: start and stop a `flextier serve` memory node (FT_BIN) on
 * 127.0.0.1 with a free port. Every server started is killed at exit even
 * if the test bailed out early. Shared by the net and offload tests. */
#ifndef FT_TEST_SERVER_UTIL_H
#define FT_TEST_SERVER_UTIL_H
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
    char  uri[64];
} srv_t;

/* Every server a test starts is killed at exit even if the test bailed
 * out early (no orphan processes). */
static pid_t g_pids[64] __attribute__((unused));
static inline void kill_leftovers(void)
{
    for (int i = 0; i < 64; i++)
        if (g_pids[i] > 0) {
            kill(g_pids[i], SIGKILL);
            waitpid(g_pids[i], NULL, 0);
            g_pids[i] = 0;
        }
}
static inline void track(pid_t pid, int add)
{
    static int registered;
    if (!registered) { atexit(kill_leftovers); registered = 1; }
    for (int i = 0; i < 64; i++)
        if (add ? g_pids[i] == 0 : g_pids[i] == pid) { g_pids[i] = add ? pid : 0; return; }
}

/* Start `flextier serve --listen LISTEN args...`; parse the bound port. */
static inline int srv_start(srv_t *s, const char *listen, const char *const *args)
{
    const char *bin = getenv("FT_BIN");
    if (!bin) { fprintf(stderr, "FT_BIN not set\n"); return -1; }
    const char *argv[32] = {bin, "serve", "--listen", listen};
    int n = 4;
    for (int i = 0; args && args[i] && n < 22; i++) argv[n++] = args[i];
    /* FT_TEST_SERVE_EXTRA: more options for every node (e.g. the UCX-path
     * variant of the tests runs them with --trusted-network) */
    static char extra[256];
    const char *ex = getenv("FT_TEST_SERVE_EXTRA");
    if (ex) {
        snprintf(extra, sizeof extra, "%s", ex);
        for (char *tok = strtok(extra, " "); tok && n < 30; tok = strtok(NULL, " ")) argv[n++] = tok;
    }
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
        execv(bin, (char *const *)argv);
        _exit(127);
    }
    close(fds[1]);
    track(pid, 1);
    char buf[256];
    size_t got = 0;
    buf[0] = '\0';
    double dl = ft_now() + 10;
    s->pid = pid;
    s->port = 0;
    while (ft_now() < dl && got < sizeof buf - 1) {
        struct pollfd p = {fds[0], POLLIN, 0};
        if (poll(&p, 1, 100) <= 0) continue;
        ssize_t r = read(fds[0], buf + got, sizeof buf - 1 - got);
        if (r <= 0) break;
        got += (size_t)r;
        buf[got] = 0;
        char *nl = strchr(buf, '\n');
        char *at = strstr(buf, "listening on 127.0.0.1:");
        if (nl && at) {
            s->port = atoi(at + strlen("listening on 127.0.0.1:"));
            break;
        }
    }
    close(fds[0]);
    if (!s->port) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        track(pid, 0);
        fprintf(stderr, "server did not start: '%s'\n", buf);
        return -1;
    }
    snprintf(s->uri, sizeof s->uri, "ucx://127.0.0.1:%d", s->port);
    return 0;
}

/* SIGTERM and wait; returns the exit status (or -1 if it had to be
 * killed). */
static inline int srv_stop(srv_t *s)
{
    if (s->pid <= 0) return -1;
    kill(s->pid, SIGTERM);
    double dl = ft_now() + 8;
    int status = 0;
    while (ft_now() < dl) {
        pid_t r = waitpid(s->pid, &status, WNOHANG);
        if (r == s->pid) {
            track(s->pid, 0);
            s->pid = 0;
            return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        }
        usleep(20000);
    }
    kill(s->pid, SIGKILL);
    waitpid(s->pid, NULL, 0);
    track(s->pid, 0);
    s->pid = 0;
    return -1;
}
#endif
