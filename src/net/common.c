/* Helpers shared by the memory node (server.c) and its client
 * (src/store/ucx_client.c, the ucx:// store backend):
 * addresses, the UCX transport policy, TCP sockets. */
#include "net.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

ft_status ft_net_resolve(const char *hostport, int passive,
                         struct sockaddr_storage *addr, socklen_t *alen)
{
    char host[256];
    const char *colon, *h = hostport;
    size_t hl;
    if (!hostport) goto bad;
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
    /* a decimal port 0..65535: getaddrinfo would take 99999 modulo 65536
     * or a service name */
    const char *ps = colon + 1;
    size_t pl = strlen(ps);
    unsigned long port = 0;
    for (size_t i = 0; i < pl; i++) {
        if (ps[i] < '0' || ps[i] > '9' || pl > 5) goto bad_port;
        port = port * 10 + (unsigned long)(ps[i] - '0');
    }
    if (port > 65535) goto bad_port;
    memcpy(host, h, hl);
    host[hl] = 0;
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
    int e = getaddrinfo(host, ps, &hints, &res);
    if (e != 0 || !res)
        return ft_set_error(FT_ERR_NET, "cannot resolve '%s': %s", hostport, gai_strerror(e));
    if (res->ai_addrlen > sizeof *addr) {
        freeaddrinfo(res);
        goto bad;
    }
    memset(addr, 0, sizeof *addr);
    memcpy(addr, res->ai_addr, res->ai_addrlen);
    *alen = res->ai_addrlen;
    freeaddrinfo(res);
    return FT_OK;
bad_port:
    return ft_set_error(FT_ERR_INVALID_ARG, "port '%s' in '%s' is not a number within 0..65535",
                        colon + 1, hostport);
bad:
    return ft_set_error(FT_ERR_INVALID_ARG, "expected HOST:PORT, got '%s'",
                        hostport ? hostport : "(null)");
}

int ft_net_is_loopback(const struct sockaddr_storage *a)
{
    if (a->ss_family == AF_INET) {
        const struct sockaddr_in *s = (const struct sockaddr_in *)a;
        return (ntohl(s->sin_addr.s_addr) >> 24) == 127;
    }
    if (a->ss_family == AF_INET6) {
        const struct sockaddr_in6 *s = (const struct sockaddr_in6 *)a;
        if (IN6_IS_ADDR_LOOPBACK(&s->sin6_addr)) return 1;
        return IN6_IS_ADDR_V4MAPPED(&s->sin6_addr) && s->sin6_addr.s6_addr[12] == 127;
    }
    return 0;
}

int ft_net_is_any(const struct sockaddr_storage *a)
{
    if (a->ss_family == AF_INET)
        return ((const struct sockaddr_in *)a)->sin_addr.s_addr == htonl(INADDR_ANY);
    if (a->ss_family == AF_INET6)
        return IN6_IS_ADDR_UNSPECIFIED(&((const struct sockaddr_in6 *)a)->sin6_addr);
    return 0;
}

void ft_net_addr_str(const struct sockaddr_storage *a, char *buf, size_t n)
{
    char host[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (a->ss_family == AF_INET) {
        const struct sockaddr_in *s = (const struct sockaddr_in *)a;
        inet_ntop(AF_INET, &s->sin_addr, host, sizeof host);
        port = ntohs(s->sin_port);
        snprintf(buf, n, "%s:%d", host, port);
    } else if (a->ss_family == AF_INET6) {
        const struct sockaddr_in6 *s = (const struct sockaddr_in6 *)a;
        inet_ntop(AF_INET6, &s->sin6_addr, host, sizeof host);
        port = ntohs(s->sin6_port);
        snprintf(buf, n, "[%s]:%d", host, port);
    } else {
        snprintf(buf, n, "?");
    }
}

/* ------------------------------------------------------------ UCX policy */

static int tls_has(const char *list, const char *tok)
{
    size_t n = strlen(tok);
    for (const char *p = list; p && *p;) {
        const char *e = strchr(p, ',');
        size_t l = e ? (size_t)(e - p) : strlen(p);
        if (l == n && !strncmp(p, tok, n)) return 1;
        p = e ? e + 1 : NULL;
    }
    return 0;
}

static void tls_add(char *out, size_t n, const char *tok)
{
    if (tls_has(*out == '^' ? out + 1 : out, tok)) return;
    size_t l = strlen(out);
    snprintf(out + l, n - l, "%s%s", (l && strcmp(out, "^")) ? "," : "", tok);
}

/* Shared-memory transports: the node's own cross-memory path (cma.c)
 * serves clients on its host instead (UCX 1.13 cannot detect a dead peer
 * over them, so an endpoint could not be closed; System V segments are
 * group-writable too). */
static const char *const shm_tls[] = {"sysv", "posix", "cma", "knem", "xpmem"};

void ft_net_ucx_tls(const char *user, int allow_tcp, char *out, size_t n)
{
    out[0] = 0;
    if (n < 2) return;
    if (!user || !*user || !strcmp(user, "all") || user[0] == '^') {
        /* a deny list: everything but what the policy excludes */
        snprintf(out, n, "^%s", (user && user[0] == '^') ? user + 1 : "");
        for (size_t i = 0; i < sizeof shm_tls / sizeof shm_tls[0]; i++) tls_add(out, n, shm_tls[i]);
        if (!allow_tcp) tls_add(out, n, "tcp");
        return;
    }
    /* an allow list: drop what the policy excludes */
    for (const char *p = user; p && *p;) {
        const char *e = strchr(p, ',');
        size_t l = e ? (size_t)(e - p) : strlen(p);
        char tok[64];
        if (l && l < sizeof tok) {
            memcpy(tok, p, l);
            tok[l] = 0;
            int drop = !strcmp(tok, "sm") || !strcmp(tok, "shm") || !strcmp(tok, "mm") ||
                       (!allow_tcp && !strcmp(tok, "tcp"));
            for (size_t i = 0; i < sizeof shm_tls / sizeof shm_tls[0]; i++)
                drop |= !strcmp(tok, shm_tls[i]);
            if (!strcmp(tok, "all")) {
                ft_net_ucx_tls(NULL, allow_tcp, out, n);
                return;
            }
            if (!drop) tls_add(out, n, tok);
        }
        p = e ? e + 1 : NULL;
    }
}

/* The user's UCX_NET_DEVICES names a device of the rail (its own choice
 * among the devices that reach the peer: kept). Unset, "all", or only
 * other interfaces: the rail's devices are used, since a multi-rail
 * client has one context per rail and a device of another rail cannot
 * reach this peer (UCX's wireup then ends in "Endpoint timeout"). */
static int rail_named(const char *env, const char *rail)
{
    if (!env || !*env || !strcmp(env, "all")) return 0;
    for (const char *p = rail; p && *p;) {
        const char *e = strchr(p, ',');
        size_t l = e ? (size_t)(e - p) : strlen(p);
        char tok[128];
        if (l && l < sizeof tok) {
            memcpy(tok, p, l);
            tok[l] = 0;
            if (tls_has(env, tok)) return 1;
        }
        p = e ? e + 1 : NULL;
    }
    return 0;
}

ucs_status_t ft_net_ucp_open(const char *name, const ft_net_ucx_opts *o, ucp_context_h *ctx,
                             ucp_worker_h *w, int *efd)
{
    char tls[512];
    ft_net_ucx_tls(o && o->user_tls ? o->user_tls : getenv("UCX_TLS"), o && o->allow_tcp, tls, sizeof tls);
    /* nothing to reach a peer with: no RDMA device, TCP not allowed */
    if (!tls[0] || (!(o && o->allow_tcp) && access("/sys/class/infiniband", F_OK) != 0))
        return UCS_ERR_UNSUPPORTED;
    ucp_config_t *cfg = NULL;
    ucs_status_t s = ucp_config_read(NULL, NULL, &cfg);
    if (s == UCS_OK) s = ucp_config_modify(cfg, "TLS", tls);
    if (s == UCS_OK && o && o->net_devices && o->net_devices[0] && !rail_named(getenv("UCX_NET_DEVICES"), o->net_devices)) {
        const char *env = getenv("UCX_NET_DEVICES");
        if (env && *env)
            FT_LOG(FT_LOG_DEBUG, "%s: UCX_NET_DEVICES=%s does not name the interface that routes to the peer: "
                   "using %s", name, env, o->net_devices);
        s = ucp_config_modify(cfg, "NET_DEVICES", o->net_devices);
    }
    if (s == UCS_OK && o && o->rndv_scheme && !getenv("UCX_RNDV_SCHEME"))
        s = ucp_config_modify(cfg, "RNDV_SCHEME", o->rndv_scheme);
    if (s == UCS_OK && o && o->no_rcache) {
        /* a registration must end when the transfer does: no cache keeps
         * it (and its remote key) alive, no implicit on-demand paging
         * registers the whole address space */
        s = ucp_config_modify(cfg, "RCACHE_ENABLE", "n");
        if (s == UCS_OK && access("/sys/class/infiniband", F_OK) == 0)   /* else UCX warns */
            s = ucp_config_modify(cfg, "IB_REG_METHODS", "direct");
    }
    if (s == UCS_OK) {
        ucp_params_t up;
        memset(&up, 0, sizeof up);
        up.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
        up.features = o && o->features ? o->features : UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
        up.name = name;
        s = ucp_init(&up, cfg, ctx);
    }
    if (cfg) ucp_config_release(cfg);
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

/* ---------------------------------------------- UCX worker addresses */

/* The packed worker address of UCX 1.13 (src/ucp/wireup/address.c at
 * v1.13.1, non-unified mode, unpack flags WORKER_UUID | WORKER_NAME |
 * DEVICE_ADDR | IFACE_ADDR | EP_ADDR [| SYS_DEVICE]):
 *
 *   header: v1: 1 byte, version (0) in the low 4 bits, flags in the high
 *           4; v2: 2 bytes, version (1) in the low 4 bits, then flags
 *   uuid (8, v1 always; v2 with flag 0x2), client id (8, flag 0x4),
 *   worker name (u8 length + bytes, flag 0x1)
 *   0xff: no devices; else per device:
 *     md index byte (0x80: no interfaces; index: v1 5 bits, v2 7 bits,
 *       127 = the next byte), device length byte (0x80 last device,
 *       0x40 paths byte follows, 0x20 system-device byte follows; length
 *       5 bits, v2: 31 = the next byte), [paths], [sys dev], address
 *     per interface (unless no interfaces): u16 transport checksum,
 *       attributes (v1 16 bytes, v2 8), length byte (0x80 last, 0x40
 *       endpoint addresses follow: never in a worker address; length 6
 *       bits, v2: 63 = the next byte), address
 *
 * Beyond the layout: the md index must be < 64 (wireup.c writes
 * ae_cmpts[md_index], an array of UCP_MAX_MDS = 64), v1 attributes must
 * be finite with a nonzero bandwidth. What an interface address means
 * to its transport (a TCP sockaddr, an IB LID) is the transport's
 * business; only authenticated peers get this far.
 */
#define UA_MAX_IFACES 128u   /* UCP_MAX_RESOURCES */
#define UA_MAX_MDS    64u    /* UCP_MAX_MDS: UCX indexes arrays of 64 by it */

typedef struct { const uint8_t *p, *end; const char *err; } ua_cur;

static int ua_byte(ua_cur *c, uint8_t *v, const char *what)
{
    if (c->err) return 0;
    if (c->p >= c->end) { c->err = what; return 0; }
    *v = *c->p++;
    return 1;
}

static int ua_skip(ua_cur *c, size_t n, const char *what)
{
    if (c->err) return 0;
    if ((size_t)(c->end - c->p) < n) { c->err = what; return 0; }
    c->p += n;
    return 1;
}

/* A length/index byte under mask; v2 extends mask-valued ones by a byte. */
static unsigned ua_ext(ua_cur *c, unsigned mask, int v2, const char *what)
{
    uint8_t b = 0;
    if (!ua_byte(c, &b, what)) return 0;
    unsigned v = b & mask;
    if (v2 && v == mask && ua_byte(c, &b, what)) v = b;
    return v;
}

ft_status ft_net_ucx_addr_check(const void *addr, size_t len)
{
    if (!addr || len == 0) return ft_set_error(FT_ERR_PROTOCOL, "empty UCX worker address");
    if (len > 65536) return ft_set_error(FT_ERR_PROTOCOL, "UCX worker address of %zu bytes", len);
    ua_cur c = {addr, (const uint8_t *)addr + len, NULL};
    uint8_t h = 0, flags = 0, b = 0;
    ua_byte(&c, &h, "header");
    unsigned version = h & 0xfu;
    if (version > 1)
        return ft_set_error(FT_ERR_PROTOCOL, "UCX worker address of version %u (UCX 1.13 reads 0 and 1)",
                            version + 1);
    const int v2 = version == 1;
    if (v2) ua_byte(&c, &flags, "header");
    else flags = (uint8_t)(h >> 4);
    if (!v2 || (flags & 0x2u)) ua_skip(&c, 8, "worker uuid");
    if (flags & 0x4u) ua_skip(&c, 8, "client id");
    if ((flags & 0x1u) && ua_byte(&c, &b, "worker name")) ua_skip(&c, b, "worker name");
    if (c.err) goto bad;
    if (c.p < c.end && *c.p == 0xffu) {   /* UCP_NULL_RESOURCE: no devices */
        c.p++;
    } else {
        unsigned ifaces = 0, last_dev = 0;
        while (!last_dev && !c.err) {
            if (c.p >= c.end) { c.err = "device"; break; }
            const int empty = (*c.p & 0x80u) != 0;
            unsigned md = ua_ext(&c, v2 ? 0x7fu : 0x1fu, v2, "md index");
            if (!c.err && md >= UA_MAX_MDS) { c.err = "memory domain index over 63"; break; }
            if (c.p >= c.end) { c.err = "device length"; break; }
            const uint8_t dflags = *c.p & 0xe0u;
            last_dev = dflags & 0x80u;
            unsigned dlen = ua_ext(&c, 0x1fu, v2, "device length");
            if (dflags & 0x40u) ua_skip(&c, 1, "device paths");
            if (dflags & 0x20u) ua_skip(&c, 1, "system device");
            ua_skip(&c, dlen, "device address");
            int last_if = empty;
            while (!last_if && !c.err) {
                if (++ifaces > UA_MAX_IFACES) { c.err = "more than 128 interfaces"; break; }
                ua_skip(&c, 2, "transport checksum");
                const uint8_t *attr = c.p;
                if (!ua_skip(&c, v2 ? 8 : 16, "interface attributes")) break;
                if (!v2) {   /* overhead, bandwidth, latency: UCX scores lanes with them */
                    float f[3];
                    memcpy(f, attr, sizeof f);
                    int bad = f[1] == 0.0f;   /* UCX divides by the bandwidth */
                    for (int i = 0; i < 3; i++) bad |= !(f[i] == f[i]) || f[i] > 1e30f || f[i] < -1e30f;
                    if (bad) {
                        c.err = "interface attributes (not finite, or no bandwidth)";
                        break;
                    }
                }
                if (c.p >= c.end) { c.err = "interface length"; break; }
                const uint8_t iflags = *c.p & 0xc0u;
                last_if = (iflags & 0x80u) != 0;
                unsigned ilen = ua_ext(&c, 0x3fu, v2, "interface length");
                ua_skip(&c, ilen, "interface address");
                /* a worker address (ucp_worker_get_address) has no
                 * endpoint addresses: those are for UCX's own wireup */
                if (iflags & 0x40u) c.err = "endpoint addresses in a worker address";
            }
        }
    }
    if (c.err) goto bad;
    if (c.p != c.end)
        return ft_set_error(FT_ERR_PROTOCOL, "UCX worker address: %zu bytes after its end",
                            (size_t)(c.end - c.p));
    return FT_OK;
bad:
    return ft_set_error(FT_ERR_PROTOCOL, "malformed UCX worker address (%zu bytes): %s", len, c.err);
}

ucs_status_t ft_net_ucp_connect(ucp_worker_h w, const void *addr, size_t len, ucp_err_handler_cb_t cb,
                                void *arg, ucp_ep_h *ep)
{
    *ep = NULL;
    if (ft_net_ucx_addr_check(addr, len) != FT_OK) {
        FT_LOG(FT_LOG_WARN, "%s", ft_last_error());
        return UCS_ERR_INVALID_ADDR;
    }
    ucp_ep_params_t p;
    memset(&p, 0, sizeof p);
    p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLER |
                   UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    p.address = (const ucp_address_t *)addr;
    p.err_handler.cb = cb;
    p.err_handler.arg = arg;
    p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ucs_status_t s = ucp_ep_create(w, &p, ep);
    return s;
}

static int same_addr(const struct sockaddr *ifa, const struct sockaddr_storage *a)
{
    if (!ifa || ifa->sa_family != a->ss_family) return 0;
    if (a->ss_family == AF_INET)
        return ((const struct sockaddr_in *)ifa)->sin_addr.s_addr ==
               ((const struct sockaddr_in *)a)->sin_addr.s_addr;
    if (a->ss_family == AF_INET6)
        return !memcmp(&((const struct sockaddr_in6 *)ifa)->sin6_addr,
                       &((const struct sockaddr_in6 *)a)->sin6_addr, sizeof(struct in6_addr));
    return 0;
}

void ft_net_listen_devices(const struct sockaddr_storage *a, int trusted_network, char *out, size_t n)
{
    if (!n) return;
    if (ft_net_devices_for(a, out, n) != FT_OK) out[0] = 0;
    if (!trusted_network) {   /* RDMA only: the ports, not the netdev */
        char *comma = strchr(out, ',');
        if (comma) memmove(out, comma + 1, strlen(comma + 1) + 1);
        else out[0] = 0;
    }
}

ft_status ft_net_devices_for(const struct sockaddr_storage *a, char *out, size_t n)
{
    out[0] = 0;
    if (ft_net_is_any(a)) return FT_OK;
    struct ifaddrs *ifs = NULL;
    if (getifaddrs(&ifs) != 0) return ft_set_error(FT_ERR_NET, "getifaddrs: %s", strerror(errno));
    char ifname[64] = "";
    for (struct ifaddrs *i = ifs; i; i = i->ifa_next)
        if (same_addr(i->ifa_addr, a) && i->ifa_name) {
            snprintf(ifname, sizeof ifname, "%s", i->ifa_name);
            break;
        }
    freeifaddrs(ifs);
    if (!ifname[0]) return FT_OK;
    snprintf(out, n, "%s", ifname);
    /* RDMA ports behind this netdev (RoCE, IPoIB) */
    char path[256];
    snprintf(path, sizeof path, "/sys/class/net/%s/device/infiniband", ifname);
    DIR *d = opendir(path);
    struct dirent *de;
    while (d && (de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        char ports[320];
        snprintf(ports, sizeof ports, "/sys/class/infiniband/%s/ports", de->d_name);
        DIR *pd = opendir(ports);
        struct dirent *pe;
        while (pd && (pe = readdir(pd))) {
            if (pe->d_name[0] == '.') continue;
            size_t l = strlen(out);
            snprintf(out + l, n - l, ",%s:%s", de->d_name, pe->d_name);
        }
        if (pd) closedir(pd);
    }
    if (d) closedir(d);
    return FT_OK;
}

ft_status ft_net_tcp_connect(const struct sockaddr_storage *addr, socklen_t alen, int timeout_ms,
                             const char *what, int *out)
{
    int fd = socket(addr->ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return ft_set_error(FT_ERR_NET, "%s: socket: %s", what, strerror(errno));
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    int idle = 10, intvl = 2, cnt = 5;   /* a dead peer noticed in ~20 s */
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
    if (connect(fd, (const struct sockaddr *)addr, alen) != 0 && errno != EINPROGRESS) {
        ft_status st = ft_set_error(FT_ERR_NET, "%s: cannot connect: %s", what, strerror(errno));
        close(fd);
        return st;
    }
    struct pollfd p = {fd, POLLOUT, 0};
    int r;
    do r = poll(&p, 1, timeout_ms); while (r < 0 && errno == EINTR);
    int err = 0;
    socklen_t el = sizeof err;
    if (r == 0) {
        close(fd);
        return ft_set_error(FT_ERR_TIMEOUT, "%s: no connection within %d ms", what, timeout_ms);
    }
    if (r < 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0 || err) {
        ft_status st = ft_set_error(FT_ERR_NET, "%s: cannot connect: %s", what,
                                    strerror(err ? err : errno));
        close(fd);
        return st;
    }
    *out = fd;
    return FT_OK;
}
