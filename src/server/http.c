/* The server's HTTP front (include/flextier/server.h, docs/server.md):
 * libmicrohttpd, one thread per connection (a handler may block while its
 * request generates; the connection limit bounds the threads), the
 * OpenAI request and response shapes in json-c, server-sent events for
 * streams. Every request is checked before it reaches the scheduler:
 * the API key, the body size (413 before the body is read when
 * Content-Length says so), JSON syntax and every field's type and range
 * (400 naming the field), the prompt against the context, the queue
 * (429). A client that goes away cancels its request at the next step. */
#define _GNU_SOURCE
#include "server_internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <json-c/json.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#define MAX_N 16

struct ft_server {
    ft_session *s;
    ft_server_params p;
    srv_sched *q;
    struct MHD_Daemon *d;
    char model_name[256];
    unsigned port;
    int have_key;
    unsigned char key_digest[32];
    const ft_model_config *cfg;
    const ft_tokenizer *tok;
    atomic_ulong http[6];        /* responses by class: 2xx 4xx(400) 401 404/405 413 429/503 */
    atomic_ulong id_seq;
    double started;
};

typedef struct conn {
    char *body;
    size_t len, cap;
    int too_big, started;
} conn;

/* --------------------------------------------------------------- util */

static void sha256(const void *d, size_t n, unsigned char out[32])
{
    unsigned int len = 32;
    if (!EVP_Digest(d, n, out, &len, EVP_sha256(), NULL)) memset(out, 0, 32);
}

static void logf_(ft_server *srv, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void logf_(ft_server *srv, const char *fmt, ...)
{
    if (!srv->p.log) return;
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    srv->p.log(srv->p.log_user, line);
}

static void count_status(ft_server *srv, unsigned code)
{
    int k = code < 300 ? 0 : code == 401 ? 2 : (code == 404 || code == 405) ? 3 : code == 413 ? 4
          : (code == 429 || code == 503) ? 5 : 1;
    atomic_fetch_add(&srv->http[k], 1);
}

static enum MHD_Result send_buf(ft_server *srv, struct MHD_Connection *c, unsigned code, const char *type,
                                const char *body, size_t len)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", type);
    if (code == 401) MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    enum MHD_Result ret = MHD_queue_response(c, code, r);
    MHD_destroy_response(r);
    count_status(srv, code);
    return ret;
}

static enum MHD_Result send_json(ft_server *srv, struct MHD_Connection *c, unsigned code, json_object *o)
{
    size_t len = 0;
    const char *s = json_object_to_json_string_length(o, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE,
                                                      &len);
    enum MHD_Result r = send_buf(srv, c, code, "application/json", s, len);
    json_object_put(o);
    return r;
}

static json_object *error_obj(const char *msg, const char *type, const char *param, const char *code)
{
    json_object *e = json_object_new_object(), *o = json_object_new_object();
    json_object_object_add(e, "message", json_object_new_string(msg));
    json_object_object_add(e, "type", json_object_new_string(type));
    json_object_object_add(e, "param", param ? json_object_new_string(param) : NULL);
    json_object_object_add(e, "code", code ? json_object_new_string(code) : NULL);
    json_object_object_add(o, "error", e);
    return o;
}

/* OpenAI's error shape: {"error": {"message", "type", "param", "code"}}. */
static enum MHD_Result send_error(ft_server *srv, struct MHD_Connection *c, unsigned code, const char *param,
                                  const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static enum MHD_Result send_error(ft_server *srv, struct MHD_Connection *c, unsigned code, const char *param,
                                  const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    const char *type = code == 401 ? "authentication_error" : code == 404 ? "not_found_error"
                     : code == 429 ? "rate_limit_error" : code >= 500 ? "server_error" : "invalid_request_error";
    const char *ecode = code == 401 ? "invalid_api_key" : code == 404 ? "not_found" : code == 413 ? "payload_too_large"
                      : code == 429 ? "queue_full" : code == 503 ? "unavailable" : NULL;
    return send_json(srv, c, code, error_obj(msg, type, param, ecode));
}

/* The client is gone (its socket hung up or failed). */
static int client_gone(int fd)
{
    if (fd < 0) return 0;
    struct pollfd pf = {fd, POLLRDHUP, 0};
    if (poll(&pf, 1, 0) <= 0) return 0;
    return (pf.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

static int conn_fd(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

/* ---------------------------------------------------------- answers */

static void make_id(ft_server *srv, int chat, char *id, size_t n)
{
    snprintf(id, n, "%s-%lx%06lx", chat ? "chatcmpl" : "cmpl", (unsigned long)time(NULL),
             (unsigned long)atomic_fetch_add(&srv->id_seq, 1) & 0xffffff);
}

static const char *finish_name(int f) { return f == SRV_FINISH_LENGTH ? "length" : "stop"; }

static json_object *usage_obj(srv_req **r, int n)
{
    size_t prompt = r[0]->plen, comp = 0, cached = 0;
    for (int i = 0; i < n; i++) {
        comp += r[i]->completion_tokens;
        cached += r[i]->cached;
    }
    json_object *u = json_object_new_object(), *d = json_object_new_object();
    json_object_object_add(u, "prompt_tokens", json_object_new_int64((int64_t)prompt));
    json_object_object_add(u, "completion_tokens", json_object_new_int64((int64_t)comp));
    json_object_object_add(u, "total_tokens", json_object_new_int64((int64_t)(prompt + comp)));
    json_object_object_add(d, "cached_tokens", json_object_new_int64((int64_t)(n ? r[0]->cached : 0)));
    json_object_object_add(u, "prompt_tokens_details", d);
    (void)cached;
    return u;
}

static json_object *base_obj(ft_server *srv, const char *id, const char *object)
{
    json_object *o = json_object_new_object();
    json_object_object_add(o, "id", json_object_new_string(id));
    json_object_object_add(o, "object", json_object_new_string(object));
    json_object_object_add(o, "created", json_object_new_int64((int64_t)time(NULL)));
    json_object_object_add(o, "model", json_object_new_string(srv->model_name));
    json_object_object_add(o, "system_fingerprint", json_object_new_string("flextier-" FT_VERSION_STRING));
    return o;
}

typedef struct stream {
    ft_server *srv;
    srv_req *r[MAX_N];
    int n, chat, include_usage, fd;
    size_t sent[MAX_N];
    int ended[MAX_N], role_sent[MAX_N];
    char id[64];
    char *out;
    size_t olen, opos, ocap;
    int done;
    double t0;
} stream;

static int out_add(stream *st, const char *s, size_t n)
{
    if (st->olen + n > st->ocap) {
        size_t nc = (st->olen + n) * 2 + 256;
        char *t = realloc(st->out, nc);
        if (!t) return -1;
        st->out = t;
        st->ocap = nc;
    }
    memcpy(st->out + st->olen, s, n);
    st->olen += n;
    return 0;
}

static int out_event(stream *st, json_object *o)
{
    size_t len = 0;
    const char *s = json_object_to_json_string_length(o, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE,
                                                      &len);
    int rc = out_add(st, "data: ", 6) || out_add(st, s, len) || out_add(st, "\n\n", 2);
    json_object_put(o);
    return rc ? -1 : 0;
}

/* A chunk of choice i: new text (may be NULL) and/or the finish reason. */
static int out_chunk(stream *st, int i, const char *text, size_t len, const char *finish)
{
    json_object *o = base_obj(st->srv, st->id, st->chat ? "chat.completion.chunk" : "text_completion");
    json_object *choices = json_object_new_array(), *c = json_object_new_object();
    json_object_object_add(c, "index", json_object_new_int(i));
    if (st->chat) {
        json_object *delta = json_object_new_object();
        if (!st->role_sent[i]) {
            json_object_object_add(delta, "role", json_object_new_string("assistant"));
            st->role_sent[i] = 1;
        }
        if (text) json_object_object_add(delta, "content", json_object_new_string_len(text, (int)len));
        json_object_object_add(c, "delta", delta);
    } else {
        json_object_object_add(c, "text", json_object_new_string_len(text ? text : "", text ? (int)len : 0));
    }
    json_object_object_add(c, "logprobs", NULL);
    json_object_object_add(c, "finish_reason", finish ? json_object_new_string(finish) : NULL);
    json_object_array_add(choices, c);
    json_object_object_add(o, "choices", choices);
    if (st->include_usage) json_object_object_add(o, "usage", NULL);
    return out_event(st, o);
}

/* Gather what the requests produced since the last call; 1 if anything. */
static int stream_produce(stream *st)
{
    int any = 0, all_ended = 1;
    for (int i = 0; i < st->n; i++) {
        if (st->ended[i]) continue;
        srv_req *r = st->r[i];
        pthread_mutex_lock(&r->mu);
        size_t from = st->sent[i], to = r->shown;
        char *delta = to > from ? strndup(r->text + from, to - from) : NULL;
        int fin = r->finish;
        char errmsg[256];
        snprintf(errmsg, sizeof errmsg, "%s", r->error);
        pthread_mutex_unlock(&r->mu);
        if (to > from && !delta) return -1;
        if (delta) {
            st->sent[i] = to;
            if (out_chunk(st, i, delta, to - from, NULL)) { free(delta); return -1; }
            free(delta);
            any = 1;
        }
        if (fin != SRV_RUNNING) {
            st->ended[i] = 1;
            any = 1;
            if (fin == SRV_FINISH_ERROR) {
                if (out_event(st, error_obj(errmsg, "server_error", NULL, NULL))) return -1;
            } else if (out_chunk(st, i, NULL, 0, finish_name(fin))) {
                return -1;
            }
        } else {
            all_ended = 0;
        }
    }
    if (all_ended && !st->done) {
        if (st->include_usage) {
            json_object *o = base_obj(st->srv, st->id, st->chat ? "chat.completion.chunk" : "text_completion");
            json_object_object_add(o, "choices", json_object_new_array());
            json_object_object_add(o, "usage", usage_obj(st->r, st->n));
            if (out_event(st, o)) return -1;
        }
        if (out_add(st, "data: [DONE]\n\n", 14)) return -1;
        st->done = 1;
        any = 1;
    }
    return any;
}

static void stream_cancel(stream *st)
{
    for (int i = 0; i < st->n; i++)
        if (!st->ended[i]) srv_cancel(st->srv->q, st->r[i]);
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    stream *st = cls;
    (void)pos;
    while (st->opos == st->olen) {
        st->opos = st->olen = 0;
        if (st->done) return MHD_CONTENT_READER_END_OF_STREAM;
        int any = stream_produce(st);
        if (any < 0) {
            stream_cancel(st);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        if (any) break;
        if (client_gone(st->fd)) {
            stream_cancel(st);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        /* wait for the first unfinished choice's next text */
        for (int i = 0; i < st->n; i++) {
            if (st->ended[i]) continue;
            srv_req *r = st->r[i];
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 50 * 1000000L;
            if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
            pthread_mutex_lock(&r->mu);
            if (r->shown == st->sent[i] && r->finish == SRV_RUNNING) pthread_cond_timedwait(&r->cv, &r->mu, &ts);
            pthread_mutex_unlock(&r->mu);
            break;
        }
    }
    size_t k = st->olen - st->opos;
    if (k > max) k = max;
    memcpy(buf, st->out + st->opos, k);
    st->opos += k;
    return (ssize_t)k;
}

static void log_done(ft_server *srv, const char *what, srv_req **r, int n, double t0)
{
    if (!srv->p.log) return;
    size_t comp = 0, cached;
    double ttft;
    int fin;
    for (int i = 0; i < n; i++) {   /* a cancelled request may still be in the scheduler's hands */
        pthread_mutex_lock(&r[i]->mu);
        comp += r[i]->completion_tokens;
        pthread_mutex_unlock(&r[i]->mu);
    }
    pthread_mutex_lock(&r[0]->mu);
    cached = r[0]->cached;
    ttft = r[0]->ttft_s;
    fin = r[0]->finish;
    pthread_mutex_unlock(&r[0]->mu);
    logf_(srv, "%s: prompt %zu tokens (%zu cached), %d choice%s, %zu generated, first token %.0f ms, %.2f s, %s",
          what, r[0]->plen, cached, n, n > 1 ? "s" : "", comp, ttft * 1e3, ft_now() - t0,
          fin == SRV_RUNNING ? "client gone" : fin == SRV_FINISH_CANCEL ? "cancelled"
          : fin == SRV_FINISH_ERROR ? "error" : finish_name(fin));
}

static void stream_free(void *cls)
{
    stream *st = cls;
    stream_cancel(st);
    log_done(st->srv, st->chat ? "chat (stream)" : "completion (stream)", st->r, st->n, st->t0);
    for (int i = 0; i < st->n; i++) srv_req_unref(st->r[i]);
    free(st->out);
    free(st);
}

/* Wait for every choice (cancelling them when the client goes away). 0:
 * done; -1: the client is gone. */
static int wait_all(srv_req **r, int n, int fd, ft_server *srv)
{
    for (int i = 0; i < n; i++) {
        for (;;) {
            pthread_mutex_lock(&r[i]->mu);
            int fin = r[i]->finish;
            if (fin == SRV_RUNNING) {
                struct timespec ts;
                clock_gettime(CLOCK_REALTIME, &ts);
                ts.tv_nsec += 100 * 1000000L;
                if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
                pthread_cond_timedwait(&r[i]->cv, &r[i]->mu, &ts);
                fin = r[i]->finish;
            }
            pthread_mutex_unlock(&r[i]->mu);
            if (fin != SRV_RUNNING) break;
            if (client_gone(fd)) {
                for (int k = 0; k < n; k++) srv_cancel(srv->q, r[k]);
                return -1;
            }
        }
    }
    return 0;
}

static enum MHD_Result generate(ft_server *srv, struct MHD_Connection *c, int chat, const char *body, size_t len)
{
    char err[1024] = "";
    const char *param = NULL;
    srv_gen g;
    srv_limits L = {srv->p.max_tokens, srv->p.max_n, srv->p.default_max_tokens, srv_ctx_len(srv->q),
                    srv->cfg->vocab, srv->tok, srv->p.chat_template};
    int code = srv_parse_request(&L, chat, body, len, &g, err, sizeof err, &param);
    if (code) return send_error(srv, c, (unsigned)code, param, "%s", err);
    if (!g.have_seed) g.samp.seed = (uint64_t)time(NULL) ^ ((uint64_t)atomic_fetch_add(&srv->id_seq, 1) << 32);
    size_t maxt = (size_t)g.max_tokens;
    srv_req *r[MAX_N] = {0};
    ft_status st = FT_OK;
    int n = 0;
    for (; n < g.n; n++) {
        if (!(r[n] = srv_req_new()) || !(r[n]->prompt = malloc(g.plen * sizeof(int32_t)))) {
            st = ft_set_error(FT_ERR_NOMEM, "allocation");
            n++;
            break;
        }
        memcpy(r[n]->prompt, g.prompt, g.plen * sizeof(int32_t));
        r[n]->plen = g.plen;
        r[n]->max_tokens = maxt;
        r[n]->samp = g.samp;
        r[n]->samp.seed = g.samp.seed + (uint64_t)n;
        r[n]->ignore_eos = g.ignore_eos;
        for (size_t k = 0; k < g.nstop; k++) {
            if (!(r[n]->stop[k] = strdup(g.stop[k]))) { st = ft_set_error(FT_ERR_NOMEM, "allocation"); break; }
            r[n]->nstop = k + 1;
        }
        if (st || (st = srv_submit(srv->q, r[n]))) {
            n++;
            break;
        }
    }
    srv_gen_free(&g);
    if (st) {
        for (int i = 0; i < n; i++) {
            if (r[i]) srv_cancel(srv->q, r[i]);
            srv_req_unref(r[i]);
        }
        if (st == FT_ERR_BUSY) return send_error(srv, c, 429, NULL, "%s: retry later", ft_last_error());
        if (st == FT_ERR_CANCELED) return send_error(srv, c, 503, NULL, "%s", ft_last_error());
        if (st == FT_ERR_INVALID_ARG) return send_error(srv, c, 400, NULL, "%s", ft_last_error());
        return send_error(srv, c, 500, NULL, "%s", ft_last_error());
    }
    char id[64];
    make_id(srv, chat, id, sizeof id);
    double t0 = ft_now();
    if (g.stream) {
        stream *s = calloc(1, sizeof *s);
        if (!s) {
            for (int i = 0; i < n; i++) { srv_cancel(srv->q, r[i]); srv_req_unref(r[i]); }
            return send_error(srv, c, 500, NULL, "out of memory");
        }
        s->srv = srv;
        s->n = n;
        s->chat = chat;
        s->include_usage = g.include_usage;
        s->fd = conn_fd(c);
        s->t0 = t0;
        memcpy(s->r, r, (size_t)n * sizeof *r);
        snprintf(s->id, sizeof s->id, "%s", id);
        struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, s,
                                                                      stream_free);
        if (!resp) {
            stream_free(s);
            return MHD_NO;
        }
        MHD_add_response_header(resp, "Content-Type", "text/event-stream");
        MHD_add_response_header(resp, "Cache-Control", "no-cache");
        enum MHD_Result ret = MHD_queue_response(c, 200, resp);
        MHD_destroy_response(resp);
        count_status(srv, 200);
        return ret;
    }
    if (wait_all(r, n, conn_fd(c), srv)) {
        log_done(srv, chat ? "chat" : "completion", r, n, t0);
        for (int i = 0; i < n; i++) srv_req_unref(r[i]);
        return MHD_NO;   /* the client is gone: close */
    }
    log_done(srv, chat ? "chat" : "completion", r, n, t0);
    for (int i = 0; i < n; i++)
        if (r[i]->finish == SRV_FINISH_ERROR) {
            enum MHD_Result ret = send_error(srv, c, 500, NULL, "%s", r[i]->error);
            for (int k = 0; k < n; k++) srv_req_unref(r[k]);
            return ret;
        }
    json_object *out = base_obj(srv, id, chat ? "chat.completion" : "text_completion");
    json_object *choices = json_object_new_array();
    for (int i = 0; i < n; i++) {
        json_object *ch = json_object_new_object();
        json_object_object_add(ch, "index", json_object_new_int(i));
        if (chat) {
            json_object *m = json_object_new_object();
            json_object_object_add(m, "role", json_object_new_string("assistant"));
            json_object_object_add(m, "content", json_object_new_string_len(r[i]->text ? r[i]->text : "",
                                                                           (int)r[i]->tlen));
            json_object_object_add(ch, "message", m);
        } else {
            json_object_object_add(ch, "text", json_object_new_string_len(r[i]->text ? r[i]->text : "",
                                                                        (int)r[i]->tlen));
        }
        json_object_object_add(ch, "logprobs", NULL);
        json_object_object_add(ch, "finish_reason", json_object_new_string(finish_name(r[i]->finish)));
        json_object_array_add(choices, ch);
    }
    json_object_object_add(out, "choices", choices);
    json_object_object_add(out, "usage", usage_obj(r, n));
    for (int i = 0; i < n; i++) srv_req_unref(r[i]);
    return send_json(srv, c, 200, out);
}

/* ------------------------------------------------------------ others */

static enum MHD_Result models(ft_server *srv, struct MHD_Connection *c, const char *one)
{
    json_object *m = json_object_new_object();
    json_object_object_add(m, "id", json_object_new_string(srv->model_name));
    json_object_object_add(m, "object", json_object_new_string("model"));
    json_object_object_add(m, "created", json_object_new_int64((int64_t)srv->started));
    json_object_object_add(m, "owned_by", json_object_new_string("flextier"));
    json_object_object_add(m, "context_length", json_object_new_int(srv_ctx_len(srv->q)));
    if (one) {
        if (strcmp(one, srv->model_name)) {
            json_object_put(m);
            return send_error(srv, c, 404, "model", "the model '%s' does not exist (this server has '%s')", one,
                              srv->model_name);
        }
        return send_json(srv, c, 200, m);
    }
    json_object *o = json_object_new_object(), *data = json_object_new_array();
    json_object_array_add(data, m);
    json_object_object_add(o, "object", json_object_new_string("list"));
    json_object_object_add(o, "data", data);
    return send_json(srv, c, 200, o);
}

static int pr(char **buf, size_t *len, size_t *cap, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int pr(char **buf, size_t *len, size_t *cap, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(*buf + *len, *cap - *len, fmt, ap);
        va_end(ap);
        if (k < 0) return -1;
        if ((size_t)k < *cap - *len) {
            *len += (size_t)k;
            return 0;
        }
        size_t nc = *cap * 2 + (size_t)k;
        char *t = realloc(*buf, nc);
        if (!t) return -1;
        *buf = t;
        *cap = nc;
    }
}

static enum MHD_Result metrics(ft_server *srv, struct MHD_Connection *c)
{
    srv_metrics m;
    srv_get_metrics(srv->q, &m);
    size_t len = 0, cap = 8192;
    char *b = malloc(cap);
    if (!b) return send_error(srv, c, 500, NULL, "out of memory");
    b[0] = 0;
#define P(...) pr(&b, &len, &cap, __VA_ARGS__)
    P("# HELP flextier_requests_total Generation requests accepted (one per choice).\n"
      "# TYPE flextier_requests_total counter\nflextier_requests_total %llu\n", (unsigned long long)m.requests);
    P("# HELP flextier_requests_finished_total Requests finished, by how.\n"
      "# TYPE flextier_requests_finished_total counter\n"
      "flextier_requests_finished_total{reason=\"stop\"} %llu\n"
      "flextier_requests_finished_total{reason=\"length\"} %llu\n"
      "flextier_requests_finished_total{reason=\"cancelled\"} %llu\n"
      "flextier_requests_finished_total{reason=\"error\"} %llu\n",
      (unsigned long long)m.finished_stop, (unsigned long long)m.finished_length,
      (unsigned long long)m.cancelled, (unsigned long long)m.errors);
    P("# HELP flextier_requests_rejected_total Requests refused because the queue was full (429).\n"
      "# TYPE flextier_requests_rejected_total counter\nflextier_requests_rejected_total %llu\n",
      (unsigned long long)m.rejected);
    static const char *const cls[6] = {"2xx", "400", "401", "404", "413", "429"};
    P("# HELP flextier_http_responses_total HTTP responses by status class.\n"
      "# TYPE flextier_http_responses_total counter\n");
    for (int k = 0; k < 6; k++)
        P("flextier_http_responses_total{code=\"%s\"} %lu\n", cls[k], (unsigned long)atomic_load(&srv->http[k]));
    P("# HELP flextier_prompt_tokens_total Prompt tokens of accepted requests.\n"
      "# TYPE flextier_prompt_tokens_total counter\nflextier_prompt_tokens_total %llu\n"
      "# HELP flextier_prompt_tokens_cached_total Prompt tokens found in the prefix cache (not computed).\n"
      "# TYPE flextier_prompt_tokens_cached_total counter\nflextier_prompt_tokens_cached_total %llu\n"
      "# HELP flextier_generated_tokens_total Tokens generated.\n"
      "# TYPE flextier_generated_tokens_total counter\nflextier_generated_tokens_total %llu\n",
      (unsigned long long)m.prompt_tokens, (unsigned long long)m.cached_tokens,
      (unsigned long long)m.generated_tokens);
    P("# HELP flextier_prefix_store_spilled_tokens_total Prefix tokens whose KV rows went to the prefix store.\n"
      "# TYPE flextier_prefix_store_spilled_tokens_total counter\nflextier_prefix_store_spilled_tokens_total %llu\n"
      "# HELP flextier_prefix_store_restored_tokens_total Prefix tokens brought back from the prefix store.\n"
      "# TYPE flextier_prefix_store_restored_tokens_total counter\nflextier_prefix_store_restored_tokens_total %llu\n"
      "# HELP flextier_prefix_store_restores_total Prefixes brought back from the prefix store.\n"
      "# TYPE flextier_prefix_store_restores_total counter\nflextier_prefix_store_restores_total %llu\n",
      (unsigned long long)m.store_spilled_tokens, (unsigned long long)m.store_restored_tokens,
      (unsigned long long)m.store_restores);
    P("# HELP flextier_generation_tokens_per_second Generated tokens per second over the last seconds.\n"
      "# TYPE flextier_generation_tokens_per_second gauge\nflextier_generation_tokens_per_second %.3f\n", m.tps);
    P("# HELP flextier_steps_total Batched forward steps.\n# TYPE flextier_steps_total counter\n"
      "flextier_steps_total %llu\n# HELP flextier_step_rows_total Tokens computed by the steps.\n"
      "# TYPE flextier_step_rows_total counter\nflextier_step_rows_total %llu\n"
      "# HELP flextier_busy_seconds_total Time spent in forward steps.\n"
      "# TYPE flextier_busy_seconds_total counter\nflextier_busy_seconds_total %.3f\n",
      (unsigned long long)m.steps, (unsigned long long)m.forward_rows, m.busy_s);
    P("# HELP flextier_queue_length Requests waiting for a slot.\n# TYPE flextier_queue_length gauge\n"
      "flextier_queue_length %u\n# HELP flextier_active_requests Requests in the running batch.\n"
      "# TYPE flextier_active_requests gauge\nflextier_active_requests %u\n"
      "# HELP flextier_slots Slots (sequences per batch).\n# TYPE flextier_slots gauge\nflextier_slots %u\n",
      m.queued, m.active, m.slots);
    const ft_session_stats *ss = &m.ss;
    P("# HELP flextier_memory_bytes Bytes held, by what and tier.\n# TYPE flextier_memory_bytes gauge\n");
    P("flextier_memory_bytes{what=\"kv_cache\",tier=\"device\"} %llu\n", (unsigned long long)ss->kv_bytes);
    if (ss->has_weights) {
        P("flextier_memory_bytes{what=\"weights\",tier=\"device\"} %llu\n",
          (unsigned long long)(ss->weights.resident_bytes + ss->weights.slot_bytes));
        P("flextier_memory_bytes{what=\"weights\",tier=\"host\"} %llu\n", (unsigned long long)ss->weights.host_bytes);
    } else {
        P("flextier_memory_bytes{what=\"weights\",tier=\"device\"} %llu\n", (unsigned long long)ss->weight_bytes);
    }
    if (ss->has_kv)
        for (int t = 0; t < FT_TIER_COUNT; t++)
            P("flextier_memory_bytes{what=\"kv_cache_offloaded\",tier=\"%s\"} %llu\n", ft_tier_name((ft_tier)t),
              (unsigned long long)ss->kv.tier_bytes[t]);
    P("# HELP flextier_moved_bytes_total Bytes moved from each tier (stored form: encoded bytes).\n"
      "# TYPE flextier_moved_bytes_total counter\n");
    if (ss->has_weights)
        for (int t = 0; t < FT_TIER_COUNT; t++)
            P("flextier_moved_bytes_total{what=\"weights\",dir=\"read\",tier=\"%s\"} %llu\n",
              ft_tier_name((ft_tier)t), (unsigned long long)ss->weights.wire_bytes[t]);
    if (ss->has_kv)
        for (int t = 0; t < FT_TIER_COUNT; t++) {
            P("flextier_moved_bytes_total{what=\"kv_cache\",dir=\"read\",tier=\"%s\"} %llu\n",
              ft_tier_name((ft_tier)t), (unsigned long long)ss->kv.read_stored[t]);
            P("flextier_moved_bytes_total{what=\"kv_cache\",dir=\"write\",tier=\"%s\"} %llu\n",
              ft_tier_name((ft_tier)t), (unsigned long long)ss->kv.written_stored[t]);
        }
    if (ss->has_weights)
        P("# HELP flextier_weight_layers_fetched_total Layer weight fetches (each serves the whole batch).\n"
          "# TYPE flextier_weight_layers_fetched_total counter\nflextier_weight_layers_fetched_total %llu\n",
          (unsigned long long)ss->weights.layers_fetched);
#undef P
    struct MHD_Response *r = MHD_create_response_from_buffer(len, b, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(b);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "text/plain; version=0.0.4");
    enum MHD_Result ret = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    count_status(srv, 200);
    return ret;
}

static int authorized(ft_server *srv, struct MHD_Connection *c)
{
    if (!srv->have_key) return 1;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncasecmp(h, "Bearer ", 7)) return 0;
    h += 7;
    while (*h == ' ') h++;
    unsigned char d[32];
    sha256(h, strlen(h), d);   /* digests of equal length: the compare takes the same time */
    return CRYPTO_memcmp(d, srv->key_digest, 32) == 0;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                              const char *version, const char *upload, size_t *upload_size, void **con_cls)
{
    ft_server *srv = cls;
    conn *cs = *con_cls;
    (void)version;
    int post = !strcmp(method, "POST"), get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
    int chat = !strcmp(url, "/v1/chat/completions"), compl = !strcmp(url, "/v1/completions");
    if (!cs) {
        if (!(cs = calloc(1, sizeof *cs))) return MHD_NO;
        *con_cls = cs;
        if (!strcmp(url, "/health") && get) return MHD_YES;   /* no key needed */
        if (!authorized(srv, c))
            return send_error(srv, c, 401, NULL, "missing or wrong API key (Authorization: Bearer KEY)");
        if ((chat || compl) && post) {
            const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
            if (cl && strtoull(cl, NULL, 10) > srv->p.max_body)
                return send_error(srv, c, 413, NULL, "the body is larger than this server accepts (%zu bytes)",
                                  srv->p.max_body);
        }
        return MHD_YES;
    }
    if (*upload_size) {
        if (!cs->too_big) {
            if (cs->len + *upload_size > srv->p.max_body) {
                cs->too_big = 1;
                free(cs->body);
                cs->body = NULL;
                cs->len = cs->cap = 0;
            } else {
                if (cs->len + *upload_size + 1 > cs->cap) {
                    size_t nc = (cs->len + *upload_size + 1) * 2;
                    if (nc > srv->p.max_body + 1) nc = srv->p.max_body + 1;
                    char *t = realloc(cs->body, nc);
                    if (!t) return MHD_NO;
                    cs->body = t;
                    cs->cap = nc;
                }
                memcpy(cs->body + cs->len, upload, *upload_size);
                cs->len += *upload_size;
            }
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (cs->too_big)
        return send_error(srv, c, 413, NULL, "the body is larger than this server accepts (%zu bytes)",
                          srv->p.max_body);
    if (!strcmp(url, "/health")) {
        if (!get) return send_error(srv, c, 405, NULL, "%s %s: use GET", method, url);
        return send_buf(srv, c, 200, "application/json", "{\"status\":\"ok\"}", 15);
    }
    if (!strcmp(url, "/metrics")) {
        if (!get) return send_error(srv, c, 405, NULL, "%s %s: use GET", method, url);
        return metrics(srv, c);
    }
    if (!strcmp(url, "/v1/models") || !strncmp(url, "/v1/models/", 11)) {
        if (!get) return send_error(srv, c, 405, NULL, "%s %s: use GET", method, url);
        return models(srv, c, url[10] == '/' ? url + 11 : NULL);
    }
    if (chat || compl) {
        if (!post) return send_error(srv, c, 405, NULL, "%s %s: use POST", method, url);
        return generate(srv, c, chat, cs->body ? cs->body : "", cs->len);
    }
    return send_error(srv, c, 404, NULL, "%s %s: no such endpoint (/v1/chat/completions, /v1/completions, "
                      "/v1/models, /health, /metrics)", method, url);
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe)
{
    (void)cls; (void)c; (void)toe;
    conn *cs = *con_cls;
    if (!cs) return;
    free(cs->body);
    free(cs);
    *con_cls = NULL;
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    ft_server *srv = cls;
    char line[512];
    vsnprintf(line, sizeof line, fmt, ap);
    size_t n = strlen(line);
    while (n && line[n - 1] == '\n') line[--n] = 0;
    ft_log(FT_LOG_DEBUG, "server: http: %s", line);
    (void)srv;
}

/* ------------------------------------------------------------ public */

void ft_server_default_params(ft_server_params *p)
{
    memset(p, 0, sizeof *p);
    p->host = "127.0.0.1";
    p->port = 8080;
    p->slots = 4;
    p->prefill_chunk = 512;
    p->queue = 64;
    p->max_connections = 64;
    p->max_body = 1u << 20;
    p->default_max_tokens = 256;
    p->timeout_s = 60;
}

static int is_loopback(const struct sockaddr_storage *ss)
{
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)ss;
        return (ntohl(a->sin_addr.s_addr) >> 24) == 127;
    }
    const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)ss;
    return IN6_IS_ADDR_LOOPBACK(&a->sin6_addr);
}

ft_status ft_server_start(ft_session *s, const ft_server_params *params, ft_server **out)
{
    if (!s || !out) return ft_set_error(FT_ERR_INVALID_ARG, "server: NULL argument");
    ft_server_params p;
    if (params) p = *params;
    else ft_server_default_params(&p);
    const ft_model_config *cfg = ft_session_config(s);
    if (!p.host || !*p.host) p.host = "127.0.0.1";
    if (p.port > 65535) return ft_set_error(FT_ERR_INVALID_ARG, "server: port %u", p.port);
    if (!p.slots || p.slots > 1024) return ft_set_error(FT_ERR_INVALID_ARG, "server: %u slots (1 to 1024)", p.slots);
    if (!p.ctx) p.ctx = cfg->max_pos < 2048 ? (unsigned)cfg->max_pos : 2048;
    if (p.ctx > (unsigned)cfg->max_pos)
        return ft_set_error(FT_ERR_INVALID_ARG, "server: a context of %u positions exceeds the model's %d", p.ctx,
                            cfg->max_pos);
    if (p.ctx < 2) return ft_set_error(FT_ERR_INVALID_ARG, "server: a context of %u positions", p.ctx);
    if (!p.prefill_chunk) p.prefill_chunk = 512;
    if (!p.step_tokens) p.step_tokens = p.slots + p.prefill_chunk;
    if (p.step_tokens <= p.slots)
        return ft_set_error(FT_ERR_INVALID_ARG, "server: %u tokens per step leave no room for prompts beside %u "
                            "decoding slots", p.step_tokens, p.slots);
    if (!p.max_tokens || p.max_tokens > p.ctx) p.max_tokens = p.ctx;
    if (!p.default_max_tokens) p.default_max_tokens = 256;
    if (!p.max_n) p.max_n = p.slots;
    if (p.max_n > MAX_N) p.max_n = MAX_N;
    if (!p.max_connections) p.max_connections = 64;
    if (!p.max_body) p.max_body = 1u << 20;
    if (!p.timeout_s) p.timeout_s = 60;

    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    struct sockaddr_in *a4 = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&ss;
    const char *host = p.host;
    char h6[64];
    if (host[0] == '[') {   /* [::1] */
        size_t n = strcspn(host + 1, "]");
        if (n >= sizeof h6) return ft_set_error(FT_ERR_INVALID_ARG, "server: bad address '%s'", p.host);
        memcpy(h6, host + 1, n);
        h6[n] = 0;
        host = h6;
    }
    if (!strcmp(host, "localhost")) host = "127.0.0.1";
    if (inet_pton(AF_INET, host, &a4->sin_addr) == 1) {
        a4->sin_family = AF_INET;
        a4->sin_port = htons((uint16_t)p.port);
    } else if (inet_pton(AF_INET6, host, &a6->sin6_addr) == 1) {
        a6->sin6_family = AF_INET6;
        a6->sin6_port = htons((uint16_t)p.port);
    } else {
        return ft_set_error(FT_ERR_INVALID_ARG, "server: '%s' is not an IPv4 or IPv6 address", p.host);
    }
    int have_key = p.api_key && *p.api_key;
    if (!is_loopback(&ss) && !have_key && !p.insecure)
        return ft_set_error(FT_ERR_INVALID_ARG, "server: listening on %s (not loopback) needs an API key "
                            "(--api-key-file), or --insecure to serve anyone who can reach it", p.host);

    ft_server *srv = calloc(1, sizeof *srv);
    if (!srv) return ft_set_error(FT_ERR_NOMEM, "server: allocation");
    srv->s = s;
    srv->p = p;
    srv->p.api_key = NULL;   /* only its digest is kept */
    srv->cfg = cfg;
    srv->tok = ft_session_tokenizer(s);
    srv->started = (double)time(NULL);
    srv->have_key = have_key;
    if (have_key) sha256(p.api_key, strlen(p.api_key), srv->key_digest);
    if (p.model_name && *p.model_name) {
        snprintf(srv->model_name, sizeof srv->model_name, "%s", p.model_name);
    } else {
        snprintf(srv->model_name, sizeof srv->model_name, "%s", cfg->model_type);
    }
    ft_status st = srv_sched_create(s, &srv->p, &srv->q);
    if (st) {
        free(srv);
        return st;
    }
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG;
    if (ss.ss_family == AF_INET6) flags |= MHD_USE_IPv6;
    srv->d = MHD_start_daemon(flags, (uint16_t)p.port, NULL, NULL, handle, srv,
                              MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
                              MHD_OPTION_CONNECTION_LIMIT, (unsigned)p.max_connections,
                              MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)p.timeout_s,
                              MHD_OPTION_NOTIFY_COMPLETED, completed, srv,
                              MHD_OPTION_EXTERNAL_LOGGER, mhd_log, srv,
                              MHD_OPTION_END);
    if (!srv->d) {
        srv_sched_free(srv->q);
        free(srv);
        return ft_set_error(FT_ERR_IO, "server: cannot listen on %s port %u (in use, or not an address of this "
                            "machine)", p.host, p.port);
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(srv->d, MHD_DAEMON_INFO_BIND_PORT);
    srv->port = di ? di->port : p.port;
    *out = srv;
    return FT_OK;
}

unsigned ft_server_port(const ft_server *srv) { return srv ? srv->port : 0; }

void ft_server_stop(ft_server *srv)
{
    if (!srv) return;
    /* the scheduler first: every request ends, so blocked handlers return */
    srv_sched_stop(srv->q);
    MHD_stop_daemon(srv->d);
    srv_sched_free(srv->q);
    free(srv);
}
