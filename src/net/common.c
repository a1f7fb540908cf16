/* Helpers shared by the memory node (server.c) and its client (client.c). */
#include "net.h"

#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <string.h>

/* "host:port" or "[v6]:port" */
ft_status ft_net_resolve(const char *hostport, int passive,
                         struct sockaddr_storage *addr, socklen_t *alen)
{
    char host[256];
    const char *colon, *h = hostport;
    size_t hl;
    if (hostport[0] == '[') {
        const char *e = strchr(hostport, ']');
        if (!e || e[1] != ':') goto bad;
        h = hostport + 1;
        hl = (size_t)(e - h);
        colon = e + 1;
    } else {
        colon = strrchr(hostport, ':');
        if (!colon) goto bad;
        hl = (size_t)(colon - hostport);
    }
    if (hl == 0 || hl >= sizeof host || !colon[1]) goto bad;
    memcpy(host, h, hl);
    host[hl] = 0;
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    if (passive) hints.ai_flags = AI_PASSIVE;
    int e = getaddrinfo(host, colon + 1, &hints, &res);
    if (e != 0 || !res)
        return ft_set_error(FT_ERR_NET, "cannot resolve '%s': %s", hostport, gai_strerror(e));
    memcpy(addr, res->ai_addr, res->ai_addrlen);
    *alen = res->ai_addrlen;
    freeaddrinfo(res);
    return FT_OK;
bad:
    return ft_set_error(FT_ERR_INVALID_ARG, "expected HOST:PORT, got '%s'", hostport);
}

ft_status ft_net_read_token(const char *path, char *buf, size_t cap, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return ft_set_error(FT_ERR_IO, "token file %s: %s", path, strerror(errno));
    size_t n = fread(buf, 1, cap, f);
    int big = n == cap && fgetc(f) != EOF;
    fclose(f);
    if (big) return ft_set_error(FT_ERR_INVALID_ARG, "token file %s over %zu bytes", path, cap - 1);
    while (n && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ')) n--;
    if (n == 0) return ft_set_error(FT_ERR_INVALID_ARG, "token file %s is empty", path);
    *len = n;
    return FT_OK;
}

ucs_status_t ft_net_ucp_open(const char *name, ucp_context_h *ctx, ucp_worker_h *w, int *efd)
{
    ucp_config_t *cfg = NULL;
    ucs_status_t s = ucp_config_read(NULL, NULL, &cfg);
    if (s == UCS_OK) {
        ucp_params_t up;
        memset(&up, 0, sizeof up);
        up.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
        up.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
        up.name = name;
        s = ucp_init(&up, cfg, ctx);
        ucp_config_release(cfg);
    }
    if (s == UCS_OK) {
        ucp_worker_params_t wp;
        memset(&wp, 0, sizeof wp);
        wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
        wp.thread_mode = UCS_THREAD_MODE_SINGLE;
        s = ucp_worker_create(*ctx, &wp, w);
    }
    if (s == UCS_OK) s = ucp_worker_get_efd(*w, efd);
    return s;
}
