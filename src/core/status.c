/* Status strings, per-thread error detail, logging. */
#include "flextier/core.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <stdatomic.h>
#include <time.h>
#include <pthread.h>

const char *ft_status_str(ft_status st)
{
    switch (st) {
    case FT_INPROGRESS:       return "in progress";
    case FT_OK:               return "success";
    case FT_ERR_INVALID_ARG:  return "invalid argument";
    case FT_ERR_NOMEM:        return "out of memory";
    case FT_ERR_CORRUPT:      return "corrupt data";
    case FT_ERR_UNSUPPORTED:  return "unsupported";
    case FT_ERR_IO:           return "I/O error";
    case FT_ERR_NOT_FOUND:    return "not found";
    case FT_ERR_NO_SPACE:     return "no space left";
    case FT_ERR_BUFFER_SMALL: return "buffer too small";
    case FT_ERR_AUTH:         return "authentication failed";
    case FT_ERR_NET:          return "network error";
    case FT_ERR_TIMEOUT:      return "timed out";
    case FT_ERR_PROTOCOL:     return "protocol error";
    case FT_ERR_BUSY:         return "resource busy";
    case FT_ERR_EXISTS:       return "already exists";
    case FT_ERR_CANCELED:     return "canceled";
    case FT_ERR_INTERNAL:     return "internal error";
    }
    return "unknown status";
}

static _Thread_local char tls_err[512];

const char *ft_last_error(void) { return tls_err; }
void ft_clear_error(void) { tls_err[0] = '\0'; }

ft_status ft_set_error(ft_status st, const char *fmt, ...)
{
    /* Format into a local buffer first: callers commonly add context to
     * the previous detail, passing ft_last_error() as an argument. */
    char buf[sizeof tls_err];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    memcpy(tls_err, buf, sizeof buf);
    FT_LOG(FT_LOG_DEBUG, "%s: %s", ft_status_str(st), tls_err);
    return st;
}

/* -1 = not yet read from the environment. */
static atomic_int g_level = -1;

static int level_from_env(void)
{
    const char *s = getenv("FLEXTIER_LOG");
    if (!s || !*s) return FT_LOG_WARN;
    static const char *names[] = {"error", "warn", "info", "debug", "trace"};
    for (int i = 0; i < 5; i++)
        if (!strcasecmp(s, names[i])) return i;
    if (s[0] >= '0' && s[0] <= '4' && s[1] == '\0') return s[0] - '0';
    return FT_LOG_WARN;
}

void ft_log_set_level(ft_log_level lvl) { atomic_store(&g_level, (int)lvl); }

ft_log_level ft_log_get_level(void)
{
    int l = atomic_load_explicit(&g_level, memory_order_relaxed);
    if (l < 0) {
        l = level_from_env();
        atomic_store(&g_level, l);
    }
    return (ft_log_level)l;
}

void ft_log(ft_log_level lvl, const char *fmt, ...)
{
    static const char *tags[] = {"error", "warn", "info", "debug", "trace"};
    if ((int)lvl > (int)ft_log_get_level()) return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    /* One fprintf per line so concurrent lines do not interleave. */
    fprintf(stderr, "[%02d:%02d:%02d.%03ld flextier %s] %s\n", tm.tm_hour,
            tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000L,
            tags[(unsigned)lvl < 5 ? lvl : 4], msg);
}

double ft_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
