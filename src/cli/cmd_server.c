/* flextier server: the OpenAI-compatible HTTP server (include/flextier/server.h,
 * docs/server.md) over a session opened with every engine and offloading
 * option of `run`. */
#include "cli.h"
#include "session_opts.h"
#include "flextier/server.h"
#include "flextier/chat.h"

#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char USAGE[] =
    "usage: flextier server --model DIR [--listen HOST:PORT] [--api-key-file F] [options]\n"
    "An OpenAI-compatible HTTP API: POST /v1/chat/completions, POST /v1/completions,\n"
    "GET /v1/models, GET /health, GET /metrics (Prometheus). Requests are batched\n"
    "continuously; shared prompt prefixes are computed once (docs/server.md).\n"
    "  --listen HOST:PORT     address (default 127.0.0.1:8080; port 0: any free port,\n"
    "                         printed on stderr); [::1]:PORT for IPv6\n"
    "  --api-key-file F       clients must send 'Authorization: Bearer KEY' (the file's\n"
    "                         first line); required for a non-loopback address\n"
    "  --insecure             allow a non-loopback address without a key\n"
    "  --model-name NAME      the id /v1/models reports (default: the directory's name)\n"
    "  --chat-template FILE   a Jinja chat template, for a model without one (or to\n"
    "                         replace its own)\n"
    "  --slots N              sequences decoded together (default 4)\n"
    "  --ctx N                positions per sequence, prompt + completion (default\n"
    "                         min(2048, the model's))\n"
    "  --prefill-chunk N      prompt tokens per step per request (default 512)\n"
    "  --step-tokens N        tokens per step over all requests (default slots +\n"
    "                         prefill chunk)\n"
    "  --queue N              requests waiting for a slot before 429 (default 64)\n"
    "  --max-connections N    (default 64)\n"
    "  --max-body SIZE        request body limit (default 1M)\n"
    "  --max-tokens N         the largest max_tokens accepted (default: --ctx)\n"
    "  --default-max-tokens N when a request gives none (default 256)\n"
    "  --timeout S            idle connections are closed (default 60)\n"
    "  --no-prefix-cache      prefill every prompt in full\n"
    "  --prefix-store URI     keep prefixes whose slot is reused in a store (mem:,\n"
    "                         file:DIR, ucx://HOST:PORT) and bring them back\n"
    "  --prefix-store-entries N  prefixes kept there (default 256)\n"
    "  --threads N            compute threads\n";

static void log_line(void *user, const char *line)
{
    (void)user;
    time_t t = time(NULL);
    struct tm tm;
    char ts[32];
    gmtime_r(&t, &tm);
    strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%SZ", &tm);
    fprintf(stderr, "%s %s\n", ts, line);
}

/* The first line of a key file, without its newline. */
static ft_status read_key(const char *path, char **out)
{
    uint8_t *d = NULL;
    size_t n = 0;
    ft_status st = ft_cli_read_file(path, &d, &n);
    if (st) return st;
    size_t k = 0;
    while (k < n && d[k] != '\n' && d[k] != '\r') k++;
    while (k && (d[k - 1] == ' ' || d[k - 1] == '\t')) k--;
    if (!k || memchr(d, 0, k)) {
        ft_free_aligned(d);
        return ft_set_error(FT_ERR_INVALID_ARG, "%s: the first line is empty (it must hold the API key)", path);
    }
    *out = strndup((const char *)d, k);
    ft_free_aligned(d);
    return *out ? FT_OK : ft_set_error(FT_ERR_NOMEM, "allocation");
}

int ft_cmd_server(int argc, char **argv)
{
    const char *dir = NULL, *listen = "127.0.0.1:8080", *key_file = NULL, *tmpl_file = NULL;
    ft_server_params sp;
    ft_server_default_params(&sp);
    ft_cli_session o;
    ft_cli_session_init(&o);
    long threads = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int r = ft_cli_session_cmd_arg(&o, USAGE, argc, argv, &i);
        if (r == FT_CLI_HELP) return FT_EXIT_OK;
        if (r < 0) return FT_EXIT_USAGE;
        if (r) continue;
        if (!strcmp(a, "--insecure")) { sp.insecure = 1; continue; }
        if (!strcmp(a, "--no-prefix-cache")) { sp.no_prefix_cache = 1; continue; }
        if (i + 1 >= argc) return ft_cli_usage_error(USAGE, "option %s needs a value", a);
        const char *v = argv[++i];
        long n = 0;
        unsigned *dst = NULL;
        long lo = 1, hi = 1 << 20;
        if (!strcmp(a, "--model")) dir = v;
        else if (!strcmp(a, "--listen")) listen = v;
        else if (!strcmp(a, "--api-key-file")) key_file = v;
        else if (!strcmp(a, "--model-name")) sp.model_name = v;
        else if (!strcmp(a, "--chat-template")) tmpl_file = v;
        else if (!strcmp(a, "--prefix-store")) sp.prefix_store = v;
        else if (!strcmp(a, "--prefix-store-entries")) dst = &sp.prefix_store_entries;
        else if (!strcmp(a, "--slots")) { dst = &sp.slots; hi = 1024; }
        else if (!strcmp(a, "--ctx")) dst = &sp.ctx;
        else if (!strcmp(a, "--prefill-chunk")) dst = &sp.prefill_chunk;
        else if (!strcmp(a, "--step-tokens")) dst = &sp.step_tokens;
        else if (!strcmp(a, "--queue")) { dst = &sp.queue; lo = 0; }
        else if (!strcmp(a, "--max-connections")) { dst = &sp.max_connections; hi = 65536; }
        else if (!strcmp(a, "--max-tokens")) dst = &sp.max_tokens;
        else if (!strcmp(a, "--default-max-tokens")) dst = &sp.default_max_tokens;
        else if (!strcmp(a, "--timeout")) { dst = &sp.timeout_s; hi = 86400; }
        else if (!strcmp(a, "--threads")) {
            if (ft_cli_parse_int(v, 1, 1024, &threads)) return ft_cli_usage_error(USAGE, "--threads: %s", ft_last_error());
        } else if (!strcmp(a, "--max-body")) {
            uint64_t b;
            if (ft_cli_parse_size(v, &b) || !b || b > (1ull << 30))
                return ft_cli_usage_error(USAGE, "--max-body %s: a size from 1 byte to 1G", v);
            sp.max_body = (size_t)b;
        } else return ft_cli_usage_error(USAGE, "unknown option %s", a);
        if (dst) {
            if (ft_cli_parse_int(v, lo, hi, &n)) return ft_cli_usage_error(USAGE, "%s: %s", a, ft_last_error());
            *dst = (unsigned)n;
        }
    }
    if (!dir) return ft_cli_usage_error(USAGE, "--model DIR is required");
    /* HOST:PORT, [V6]:PORT */
    char host[256];
    const char *colon = strrchr(listen, ':');
    if (!colon || colon == listen || (size_t)(colon - listen) >= sizeof host)
        return ft_cli_usage_error(USAGE, "--listen %s: expected HOST:PORT", listen);
    memcpy(host, listen, (size_t)(colon - listen));
    host[colon - listen] = 0;
    long port;
    if (ft_cli_parse_int(colon + 1, 0, 65535, &port))
        return ft_cli_usage_error(USAGE, "--listen %s: the port must be 0 to 65535", listen);
    sp.host = host;
    sp.port = (unsigned)port;
    char name[256];
    if (!sp.model_name) {
        const char *b = dir + strlen(dir);
        while (b > dir && b[-1] == '/') b--;
        const char *e = b;
        while (b > dir && b[-1] != '/') b--;
        snprintf(name, sizeof name, "%.*s", (int)(e - b), b);
        sp.model_name = name[0] ? name : "model";
    }
    sp.log = log_line;

    int rc = FT_EXIT_ERR;
    char *key = NULL;
    ft_session *s = NULL;
    ft_server *srv = NULL;
    ft_chat_template *tmpl = NULL;
    ft_status st;
    if (key_file && (st = read_key(key_file, &key))) {
        ft_cli_fail("--api-key-file", st);
        return FT_EXIT_USAGE;
    }
    sp.api_key = key;
    o.sp.threads = (unsigned)threads;
    o.sp.max_seq = sp.ctx;
    sp.prefix_store_token_file = o.sp.token_file;
    if ((st = ft_cli_session_open(&o, dir, sp.slots ? sp.slots : 4, 256, 64, &s))) {
        ft_cli_fail("open", st);
        goto done;
    }
    if (tmpl_file) {
        const ft_tokenizer *tok = ft_session_tokenizer(s);
        const ft_model_config *cfg = ft_session_config(s);
        const char *bos = tok && cfg->bos_id >= 0 ? ft_tokenizer_token_str(tok, cfg->bos_id) : "";
        const char *eos = tok && cfg->n_eos ? ft_tokenizer_token_str(tok, cfg->eos_ids[0]) : "";
        if (ft_cli_load_template_file(tmpl_file, bos ? bos : "", eos ? eos : "", &tmpl)) goto done;
    } else if ((st = ft_chat_template_load_dir(dir, &tmpl))) {
        if (st != FT_ERR_NOT_FOUND) {
            ft_cli_fail("chat template", st);
            goto done;
        }
        fprintf(stderr, "flextier server: %s has no chat template: /v1/chat/completions answers 400 "
                "(give one with --chat-template FILE)\n", dir);
        ft_clear_error();
    }
    sp.chat_template = tmpl;
    /* signals are taken by sigwait below, not by the server's threads */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
    if ((st = ft_server_start(s, &sp, &srv))) {
        ft_cli_fail("server", st);
        goto done;
    }
    int cap_seq = 0;
    ft_session_capacity(s, NULL, &cap_seq, NULL);
    if (sp.ctx && (int)sp.ctx < cap_seq) cap_seq = (int)sp.ctx;
    fprintf(stderr, "flextier server: listening on http://%s%s%s:%u (model %s, %u slots x %u positions%s%s)\n",
            strchr(host, ':') && host[0] != '[' ? "[" : "", host, strchr(host, ':') && host[0] != '[' ? "]" : "",
            ft_server_port(srv), sp.model_name, sp.slots ? sp.slots : 4, (unsigned)cap_seq, key ? ", API key required" : "",
            sp.no_prefix_cache ? ", no prefix cache" : "");
    fflush(stderr);
    int sig = 0;
    sigwait(&set, &sig);
    fprintf(stderr, "flextier server: %s: stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    rc = FT_EXIT_OK;
done:
    ft_server_stop(srv);
    ft_chat_template_free(tmpl);
    ft_session_close(s);
    if (key) {
        memset(key, 0, strlen(key));
        free(key);
    }
    return rc;
}
