/* flextier chat: an interactive multi-turn chat in a terminal over a
 * session (every engine and offloading option of `run`). The model's
 * chat template renders the conversation; the KV cache of one slot keeps
 * the conversation, and each turn computes only the tokens after the
 * prefix it shares with the cache (the new user message and the
 * template's markup). Line editing and history: libedit. Ctrl-C stops the
 * reply being written and keeps the conversation; /clear starts over;
 * /exit or Ctrl-D leaves. */
#include "cli.h"
#include "session_opts.h"
#include "flextier/chat.h"
#include "flextier/session.h"

#include <errno.h>
#include <json-c/json.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifdef FT_HAVE_LIBEDIT
#include <editline/readline.h>
#else
/* no line editor in this build: plain lines from stdin */
static char *readline(const char *prompt)
{
    fputs(prompt, stdout);
    fflush(stdout);
    char *line = NULL;
    size_t cap = 0;
    ssize_t n = getline(&line, &cap, stdin);
    if (n < 0) {
        free(line);
        return NULL;
    }
    if (n && line[n - 1] == '\n') line[n - 1] = 0;
    return line;
}
static void add_history(const char *line) { (void)line; }
#endif

static const char USAGE[] =
    "usage: flextier chat --model DIR [--system TEXT] [--chat-template FILE] [options]\n"
    "An interactive chat with the model, rendered with its chat template. Type a message\n"
    "and Enter; the reply streams as it is generated. Ctrl-C stops a reply (the\n"
    "conversation stays); /clear forgets the conversation; /exit or Ctrl-D leaves.\n"
    "  --system TEXT          a system message first\n"
    "  --chat-template FILE   a Jinja chat template (for a model without one)\n"
    "  --max-new-tokens N     per reply (default: until the end of the context)\n"
    "  --ctx N                positions for the whole conversation (default\n"
    "                         min(4096, the model's))\n"
    "  --temperature T --top-k K --top-p P --repetition-penalty R --seed S\n"
    "                         sampling (default: the model's generation_config.json)\n"
    "  --stats                after each reply: tokens reused, computed, generated, tok/s\n"
    "  --threads N            compute threads\n";

static volatile sig_atomic_t interrupted;

static void on_sigint(int sig)
{
    (void)sig;
    interrupted = 1;
}

typedef struct {
    ft_session *s;
    const ft_model_config *cfg;
    const ft_tokenizer *tok;
    ft_chat_template *tmpl;
    ft_sampler *sampler;
    ft_sampling samp;
    uint64_t rng;
    int32_t *cache;          /* the tokens in slot 0's KV cache          */
    int ncache, ctx, max_new, stats;
    float *logits;
} chat;

static int is_eos(const chat *c, int32_t t)
{
    for (int i = 0; i < c->cfg->n_eos; i++)
        if (c->cfg->eos_ids[i] == t) return 1;
    return 0;
}

/* Feed tokens into slot 0 in chunks; the last chunk's logits land in
 * c->logits. */
static ft_status feed(chat *c, const int32_t *t, int n)
{
    const int chunk = 512;
    for (int i = 0; i < n; i += chunk) {
        size_t k = (size_t)(n - i < chunk ? n - i : chunk);
        const int32_t *p = t + i;
        int slot = 0;
        ft_status st = ft_session_forward(c->s, 1, &slot, &p, &k, c->logits, 0);
        if (st) return st;
        memcpy(c->cache + c->ncache, p, k * sizeof *p);
        c->ncache += (int)k;
        if (interrupted) return FT_ERR_CANCELED;
    }
    return FT_OK;
}

/* One reply to the conversation in msgs; appends it as the assistant's
 * message. */
static ft_status reply(chat *c, json_object *msgs)
{
    char *text = NULL;
    ft_status st = ft_chat_template_apply(c->tmpl, json_object_to_json_string_ext(msgs, JSON_C_TO_STRING_PLAIN), 1,
                                          NULL, &text);
    if (st) return st;
    int32_t *ids = NULL;
    size_t n = 0;
    st = ft_tokenizer_encode(c->tok, text, strlen(text), 0, &ids, &n);
    free(text);
    if (st) return st;
    if (!n) {
        free(ids);
        return ft_set_error(FT_ERR_INVALID_ARG, "the chat template rendered nothing");
    }
    if ((int)n >= c->ctx) {
        free(ids);
        return ft_set_error(FT_ERR_NO_SPACE, "the conversation has %zu tokens: the context holds %d (/clear to "
                            "start over, or a larger --ctx)", n, c->ctx);
    }
    /* reuse the cache's shared prefix; compute one token at least */
    int L = 0;
    while (L < c->ncache && (size_t)L < n - 1 && c->cache[L] == ids[L]) L++;
    if (ft_session_slot_truncate(c->s, 0, L)) {
        ft_clear_error();
        ft_session_slot_reset(c->s, 0);
        L = 0;
    }
    c->ncache = L;
    double t0 = ft_now();
    st = feed(c, ids + L, (int)n - L);
    double t1 = ft_now();
    free(ids);
    if (st == FT_ERR_CANCELED) {
        /* stopped while reading the prompt: the slot holds a prefix of it */
        fputs("\n", stdout);
        return FT_OK;
    }
    if (st) return st;
    ft_detok *dt = NULL;
    if ((st = ft_detok_create(c->tok, 1, &dt))) return st;
    size_t cap = 256, len = 0;
    char *out = malloc(cap);
    if (!out) {
        ft_detok_free(dt);
        return ft_set_error(FT_ERR_NOMEM, "allocation");
    }
    out[0] = 0;
    int gen = 0, stopped = 0;
    for (;;) {
        int32_t t = ft_sampler_sample(c->sampler, &c->samp, c->logits, c->cache, (size_t)c->ncache, &c->rng);
        if (is_eos(c, t)) break;
        gen++;
        char buf[512];
        size_t w = 0;
        if ((st = ft_detok_push(dt, t, buf, sizeof buf, &w))) break;
        if (w) {
            fwrite(buf, 1, w, stdout);
            fflush(stdout);
            if (len + w + 1 > cap) {
                cap = (len + w + 1) * 2;
                char *o2 = realloc(out, cap);
                if (!o2) { st = ft_set_error(FT_ERR_NOMEM, "allocation"); break; }
                out = o2;
            }
            memcpy(out + len, buf, w);
            len += w;
            out[len] = 0;
        }
        if (interrupted) { stopped = 1; break; }
        if ((c->max_new && gen >= c->max_new) || c->ncache + 1 >= c->ctx) break;
        const int32_t *p = &t;
        size_t one = 1;
        int slot = 0;
        if ((st = ft_session_forward(c->s, 1, &slot, &p, &one, c->logits, 0))) break;
        c->cache[c->ncache++] = t;
    }
    char buf[64];
    size_t w = 0;
    if (!st && !ft_detok_flush(dt, buf, sizeof buf, &w) && w) {
        fwrite(buf, 1, w, stdout);
        if (len + w + 1 <= cap) {
            memcpy(out + len, buf, w);
            len += w;
            out[len] = 0;
        }
    }
    ft_detok_free(dt);
    fputs(stopped ? " [stopped]\n" : "\n", stdout);
    fflush(stdout);
    double t2 = ft_now();
    if (c->stats)
        fprintf(stderr, "[prompt %zu tokens: %d reused, %zu computed in %.2f s; %d generated, %.1f tok/s]\n", n, L,
                n - (size_t)L, t1 - t0, gen, gen > 1 && t2 > t1 ? (gen - 1) / (t2 - t1) : 0.0);
    if (!st) {
        json_object *m = json_object_new_object();
        json_object_object_add(m, "role", json_object_new_string("assistant"));
        json_object_object_add(m, "content", json_object_new_string_len(out, (int)len));
        json_object_array_add(msgs, m);
    }
    free(out);
    return st;
}

static json_object *new_conversation(const char *system)
{
    json_object *msgs = json_object_new_array();
    if (system) {
        json_object *m = json_object_new_object();
        json_object_object_add(m, "role", json_object_new_string("system"));
        json_object_object_add(m, "content", json_object_new_string(system));
        json_object_array_add(msgs, m);
    }
    return msgs;
}

int ft_cmd_chat(int argc, char **argv)
{
    const char *dir = NULL, *system = NULL, *tmpl_file = NULL;
    long threads = 0, max_new = 0, ctx = 0, top_k = -1, stats = 0;
    double temp = -1, top_p = -1, rep = -1;
    unsigned long long seed = 0;
    int have_seed = 0;
    ft_cli_session o;
    ft_cli_session_init(&o);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int r = ft_cli_session_cmd_arg(&o, USAGE, argc, argv, &i);
        if (r == FT_CLI_HELP) return FT_EXIT_OK;
        if (r < 0) return FT_EXIT_USAGE;
        if (r) continue;
        if (!strcmp(a, "--stats")) { stats = 1; continue; }
        if (i + 1 >= argc) return ft_cli_usage_error(USAGE, "option %s needs a value", a);
        const char *v = argv[++i];
        char *end = NULL;
        if (!strcmp(a, "--model")) dir = v;
        else if (!strcmp(a, "--system")) system = v;
        else if (!strcmp(a, "--chat-template")) tmpl_file = v;
        else if (!strcmp(a, "--threads") || !strcmp(a, "--max-new-tokens") || !strcmp(a, "--ctx") ||
                 !strcmp(a, "--top-k")) {
            long *dst = !strcmp(a, "--threads") ? &threads : !strcmp(a, "--ctx") ? &ctx
                      : !strcmp(a, "--top-k") ? &top_k : &max_new;
            if (ft_cli_parse_int(v, 0, 1 << 24, dst)) return ft_cli_usage_error(USAGE, "%s: %s", a, ft_last_error());
        } else if (!strcmp(a, "--temperature") || !strcmp(a, "--top-p") || !strcmp(a, "--repetition-penalty")) {
            double d = strtod(v, &end);
            if (!end || *end || !(d >= 0 && d <= 100)) return ft_cli_usage_error(USAGE, "%s %s: a number", a, v);
            *(!strcmp(a, "--temperature") ? &temp : !strcmp(a, "--top-p") ? &top_p : &rep) = d;
        } else if (!strcmp(a, "--seed")) {
            errno = 0;
            seed = strtoull(v, &end, 10);
            if (errno || !end || *end) return ft_cli_usage_error(USAGE, "--seed %s: an integer", v);
            have_seed = 1;
        } else return ft_cli_usage_error(USAGE, "unknown option %s", a);
    }
    if (!dir) return ft_cli_usage_error(USAGE, "--model DIR is required");
    int rc = FT_EXIT_ERR;
    chat c;
    memset(&c, 0, sizeof c);
    json_object *msgs = NULL;
    ft_status st;
    o.sp.threads = (unsigned)threads;
    if ((st = ft_cli_session_open(&o, dir, 1, 256, 256, &c.s))) {
        ft_cli_fail("open", st);
        goto done;
    }
    c.cfg = ft_session_config(c.s);
    c.tok = ft_session_tokenizer(c.s);
    if (!c.tok) {
        fprintf(stderr, "flextier chat: %s has no tokenizer\n", dir);
        goto done;
    }
    if (tmpl_file) {
        const char *bos = c.cfg->bos_id >= 0 ? ft_tokenizer_token_str(c.tok, c.cfg->bos_id) : NULL;
        const char *eos = c.cfg->n_eos ? ft_tokenizer_token_str(c.tok, c.cfg->eos_ids[0]) : NULL;
        if (ft_cli_load_template_file(tmpl_file, bos, eos, &c.tmpl)) goto done;
    } else if ((st = ft_chat_template_load_dir(dir, &c.tmpl))) {
        if (st == FT_ERR_NOT_FOUND) {
            fprintf(stderr, "flextier chat: %s has no chat template (tokenizer_config.json chat_template or "
                    "chat_template.jinja): give one with --chat-template FILE, or use flextier run\n", dir);
            rc = FT_EXIT_USAGE;
        } else {
            ft_cli_fail("chat template", st);
        }
        goto done;
    }
    c.ctx = (int)(ctx ? ctx : (c.cfg->max_pos < 4096 ? c.cfg->max_pos : 4096));
    if (c.ctx > c.cfg->max_pos) {
        fprintf(stderr, "flextier chat: --ctx %d exceeds the model's %d positions\n", c.ctx, c.cfg->max_pos);
        rc = FT_EXIT_USAGE;
        goto done;
    }
    c.max_new = (int)max_new;
    c.stats = (int)stats;
    ft_session_default_sampling(c.s, &c.samp);
    if (temp >= 0) c.samp.temperature = (float)temp;
    if (top_k >= 0) c.samp.top_k = (int)top_k;
    if (top_p >= 0) c.samp.top_p = (float)top_p;
    if (rep >= 0) c.samp.repetition_penalty = (float)rep;
    c.rng = (have_seed ? seed : (uint64_t)(ft_now() * 1e6)) ^ 0x9e3779b97f4a7c15ull;
    if ((st = ft_session_reserve(c.s, 1, (size_t)c.ctx, 512)) || (st = ft_sampler_create(c.cfg->vocab, &c.sampler))) {
        ft_cli_fail("context", st);
        goto done;
    }
    c.cache = malloc((size_t)c.ctx * sizeof *c.cache);
    c.logits = malloc((size_t)c.cfg->vocab * sizeof *c.logits);
    if (!c.cache || !c.logits) {
        fprintf(stderr, "flextier chat: out of memory\n");
        goto done;
    }
    ft_session_slot_reset(c.s, 0);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;   /* no SA_RESTART: a read in the prompt returns */
    sigaction(SIGINT, &sa, NULL);
#ifdef FT_HAVE_LIBEDIT
    rl_catch_signals = 0;   /* SIGINT stays ours, at the prompt too */
#endif
    msgs = new_conversation(system);
    int tty = isatty(0);
    if (tty) fprintf(stderr, "flextier chat: %s. /clear forgets the conversation, /exit leaves; Ctrl-C stops a "
                     "reply.\n", dir);
    for (;;) {
        interrupted = 0;
        char *line = readline(tty ? "> " : "");
        sigaction(SIGINT, &sa, NULL);   /* whatever the line editor did with it */
        if (!line) {
            if (interrupted) {   /* Ctrl-C at the prompt: a new line */
                fputc('\n', stdout);
                continue;
            }
            if (tty) fputc('\n', stdout);
            break;
        }
        char *l = line;
        while (*l == ' ' || *l == '\t') l++;
        size_t ln = strlen(l);
        while (ln && (l[ln - 1] == ' ' || l[ln - 1] == '\t' || l[ln - 1] == '\r')) l[--ln] = 0;
        if (!*l) { free(line); continue; }
        if (tty) add_history(l);
        if (!strcmp(l, "/exit") || !strcmp(l, "/quit")) { free(line); break; }
        if (!strcmp(l, "/clear")) {
            json_object_put(msgs);
            msgs = new_conversation(system);
            free(line);
            fprintf(stdout, "[conversation cleared]\n");
            fflush(stdout);
            continue;
        }
        if (l[0] == '/' && l[1] && !strchr(l, ' ')) {
            fprintf(stdout, "[unknown command %s: /clear, /exit]\n", l);
            fflush(stdout);
            free(line);
            continue;
        }
        json_object *m = json_object_new_object();
        json_object_object_add(m, "role", json_object_new_string("user"));
        json_object_object_add(m, "content", json_object_new_string(l));
        json_object_array_add(msgs, m);
        free(line);
        interrupted = 0;
        if ((st = reply(&c, msgs))) {
            ft_cli_fail("reply", st);
            /* the user's message stays out of the conversation */
            json_object_array_del_idx(msgs, json_object_array_length(msgs) - 1, 1);
            ft_clear_error();
        }
    }
    rc = FT_EXIT_OK;
done:
    json_object_put(msgs);
    free(c.cache);
    free(c.logits);
    ft_sampler_free(c.sampler);
    ft_chat_template_free(c.tmpl);
    ft_session_close(c.s);
    return rc;
}
