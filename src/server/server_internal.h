/* Internal to src/server: the scheduler (sched.c: continuous batching and
 * the prefix cache over one session) and its requests, which the HTTP
 * front (http.c) submits and reads. */
#ifndef FT_SERVER_INTERNAL_H
#define FT_SERVER_INTERNAL_H
#include "flextier/server.h"

#include <pthread.h>
#include <stdatomic.h>

enum { SRV_RUNNING = 0, SRV_FINISH_STOP = 1, SRV_FINISH_LENGTH = 2, SRV_FINISH_CANCEL = 3, SRV_FINISH_ERROR = 4 };

#define SRV_MAX_STOP 16

/* One sequence to generate. The submitter fills the inputs, the scheduler
 * the outputs (under mu; cv signals new text and the end). Reference
 * counted: the scheduler and the submitter each hold one. */
typedef struct srv_req {
    /* inputs (read-only once submitted) */
    int32_t *prompt;
    size_t plen;
    size_t max_tokens;
    ft_sampling samp;
    char *stop[SRV_MAX_STOP];
    size_t nstop, stop_hold;     /* longest stop string - 1             */
    int ignore_eos;
    /* scheduler state (the scheduler thread only) */
    int slot;
    size_t fed;                  /* prompt tokens in the slot's cache     */
    int32_t pending;             /* sampled, not yet fed (-1: none)       */
    int32_t *gen;
    size_t ngen;
    uint64_t rng;
    ft_detok *dt;
    struct srv_req *next;        /* the queue                             */
    double t_submit;
    /* outputs, under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    char *text;                  /* generated text, cut at a stop string  */
    size_t tlen, tcap;
    size_t shown;                /* text[0, shown) is settled             */
    size_t cached;               /* prompt tokens found in the prefix cache */
    size_t completion_tokens;
    double ttft_s;               /* submit to first token                 */
    int finish;                  /* SRV_RUNNING until done                */
    char error[256];
    atomic_int cancel;           /* the client went away                  */
    atomic_int refs;
} srv_req;

typedef struct srv_sched srv_sched;

typedef struct srv_metrics {
    uint64_t requests, finished_stop, finished_length, cancelled, errors, rejected;
    uint64_t prompt_tokens, cached_tokens, generated_tokens, steps, forward_rows;
    uint64_t store_spills, store_spilled_tokens, store_restores, store_restored_tokens;
    double busy_s, tps;          /* tps: generated tokens/s over the last few seconds */
    unsigned queued, active, slots;
    ft_session_stats ss;         /* a snapshot taken between steps        */
} srv_metrics;

ft_status srv_sched_create(ft_session *s, const ft_server_params *p, srv_sched **out);
/* End every request (the scheduler thread joined); submit then fails. */
void srv_sched_stop(srv_sched *q);
void srv_sched_free(srv_sched *q);
/* A request with the inputs to fill (refs 1: the caller's). */
srv_req *srv_req_new(void);
void srv_req_unref(srv_req *r);
/* Queue it (the scheduler takes a reference). FT_ERR_BUSY: the queue is
 * full; FT_ERR_INVALID_ARG: the prompt and max_tokens do not fit a slot. */
ft_status srv_submit(srv_sched *q, srv_req *r);
void srv_get_metrics(srv_sched *q, srv_metrics *m);
void srv_count_rejected(srv_sched *q);
/* The client went away: r ends at the next step (or leaves the queue). */
void srv_cancel(srv_sched *q, srv_req *r);
/* The context's positions per slot. */
int srv_ctx_len(const srv_sched *q);

/* ------------------------------------------------------- requests */

/* What a request body may ask for, and what it is checked against. */
typedef struct srv_limits {
    unsigned max_tokens, max_n, default_max_tokens;
    int ctx, vocab;
    const ft_tokenizer *tok;
    const struct ft_chat_template *tmpl;   /* NULL: chat is refused      */
} srv_limits;

/* A parsed request. */
typedef struct srv_gen {
    int stream, include_usage, n, ignore_eos, have_seed;
    long long max_tokens;         /* after parsing: what to generate at most */
    ft_sampling samp;
    char *stop[SRV_MAX_STOP];
    size_t nstop;
    int32_t *prompt;
    size_t plen;
} srv_gen;

/* Parse and check a /v1/completions (chat 0) or /v1/chat/completions
 * body. 0: *g filled (free with srv_gen_free); else the HTTP status, the
 * message in err and the field in *param (may be NULL). */
int srv_parse_request(const srv_limits *L, int chat, const char *body, size_t len, srv_gen *g, char *err,
                      size_t nerr, const char **param);
void srv_gen_free(srv_gen *g);
#endif
