/* A build without libmicrohttpd: the server API reports it. */
#include "flextier/server.h"

#include <string.h>

void ft_server_default_params(ft_server_params *p)
{
    memset(p, 0, sizeof *p);
    p->host = "127.0.0.1";
    p->port = 8080;
}

ft_status ft_server_start(ft_session *s, const ft_server_params *p, ft_server **out)
{
    (void)s; (void)p; (void)out;
    return ft_set_error(FT_ERR_UNSUPPORTED, "server: flextier was built without the HTTP server (install "
                        "libmicrohttpd-dev and configure again)");
}

unsigned ft_server_port(const ft_server *srv) { (void)srv; return 0; }
void ft_server_stop(ft_server *srv) { (void)srv; }
