/* Pipeline options shared by `flextier run` and `flextier bench run`: where
 * the stages run (threads of this process, `flextier worker` processes, or
 * the ranks of one mpirun), how the layers are split, micro-batches; and
 * the setup and teardown of the ring (pipe_opts.h). */
#include "cli.h"
#include "pipe_opts.h"
#include "pipe_mpi.h"

#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

const char ft_cli_pipe_usage[] =
    "pipeline (the layers split over processes/machines; docs/pipeline.md):\n"
    "  --pipeline WHERE       HOST:PORT[,HOST:PORT..]: `flextier worker`s run stages\n"
    "                         0..S-2, this process the last; mpi: the ranks of mpirun\n"
    "                         (rank i = stage i, the last rank prints); local:S: S\n"
    "                         stages as threads of this process\n"
    "  --stage-layers N,N,..  layers per stage (default: an equal split)\n"
    "  --micro-batches M      sequences split in M groups that circulate on their own\n"
    "                         (default: one per stage)\n"
    "  --worker-token-file F  the workers' token\n"
    "  --trusted-network      UCX may use TCP between the stages (no RDMA)\n"
    "  --pipe-transport T     under mpirun: mpi (MPI messages, default) or ucx\n";

void ft_cli_pipe_print_usage(FILE *f)
{
    fputs(ft_cli_pipe_usage, f);
    fprintf(f, "  (this build: %s)\n", ft_cli_mpi_built() ? "MPI: built in" : "MPI: not built in (libopenmpi-dev)");
}

void ft_cli_pipe_init(ft_cli_pipe *p)
{
    memset(p, 0, sizeof *p);
    p->mpi_transport = 1;
}

static int need(int argc, char **argv, int *i, const char **v)
{
    if (*i + 1 >= argc) {
        fprintf(stderr, "flextier: %s needs a value\n", argv[*i]);
        return -1;
    }
    *v = argv[++*i];
    return 1;
}

int ft_cli_pipe_arg(ft_cli_pipe *p, int argc, char **argv, int *i)
{
    const char *a = argv[*i], *v;
    long x;
    if (!strcmp(a, "--trusted-network")) { p->trusted = 1; return 1; }
    if (!strcmp(a, "--pipeline")) {
        if (need(argc, argv, i, &v) < 0) return -1;
        if (!strcmp(v, "mpi")) {
            p->mode = FT_PIPE_MPI;
        } else if (!strncmp(v, "local:", 6)) {
            if (ft_cli_parse_int(v + 6, 1, FT_PIPE_MAX_STAGES, &x)) goto bad;
            p->mode = FT_PIPE_LOCAL;
            p->n_stages = (int)x;
        } else {
            if (strlen(v) >= sizeof p->wbuf) goto bad;
            snprintf(p->wbuf, sizeof p->wbuf, "%s", v);
            p->n_workers = 0;
            for (char *s = p->wbuf, *save = NULL, *t = strtok_r(s, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
                if (p->n_workers == FT_PIPE_MAX_STAGES - 1) goto bad;
                p->workers[p->n_workers++] = !strncmp(t, "worker://", 9) ? t + 9 : t;
            }
            if (!p->n_workers) goto bad;
            p->mode = FT_PIPE_REMOTE;
            p->n_stages = p->n_workers + 1;
        }
        return 1;
    }
    if (!strcmp(a, "--stage-layers")) {
        if (need(argc, argv, i, &v) < 0) return -1;
        p->n_counts = 0;
        for (const char *q = v; *q;) {
            char *e;
            long c = strtol(q, &e, 10);
            if (e == q || c < 1 || c > FT_MAX_LAYERS || p->n_counts == FT_PIPE_MAX_STAGES || (*e && *e != ',')) goto bad;
            p->counts[p->n_counts++] = (int)c;
            q = *e ? e + 1 : e;
        }
        return 1;
    }
    if (!strcmp(a, "--micro-batches")) {
        if (need(argc, argv, i, &v) < 0) return -1;
        if (ft_cli_parse_int(v, 1, 65536, &x)) goto bad;
        p->micro = (int)x;
        return 1;
    }
    if (!strcmp(a, "--worker-token-file")) {
        if (need(argc, argv, i, &v) < 0) return -1;
        p->token_file = v;
        return 1;
    }
    if (!strcmp(a, "--pipe-transport")) {
        if (need(argc, argv, i, &v) < 0) return -1;
        if (!strcmp(v, "mpi")) p->mpi_transport = 1;
        else if (!strcmp(v, "ucx")) p->mpi_transport = 0;
        else goto bad;
        return 1;
    }
    return 0;
bad:
    fprintf(stderr, "flextier: %s: bad value '%s' (see --help)\n", a, argv[*i]);
    return -1;
}

int ft_cli_pipe_micro(const ft_cli_pipe *p, size_t n)
{
    int m = p->micro ? p->micro : p->n_stages;
    if (m < 1) m = 1;
    if ((size_t)m > n) m = (int)n;
    return m;
}

/* Stage i of the ring as a thread of this process (--pipeline local:S). */
typedef struct {
    ft_pipe_stage_params sp;
    const ft_offload_params *off;
    ft_pipe_link *link;
} local_arg;

static void *local_main(void *arg)
{
    local_arg *a = arg;
    ft_pipe_stage *s = NULL;
    ft_status st = ft_pipe_stage_create(&a->sp, a->off, &s);
    if (st == FT_OK) st = ft_pipe_worker_run(s, a->link);
    if (st) fprintf(stderr, "flextier: pipeline stage %d: %s\n", a->sp.stage, ft_last_error());
    ft_pipe_stage_free(s);
    /* closing tells the others nothing more will come from here */
    ft_pipe_link_close(a->link);
    free(a);
    return NULL;
}

static double peak_rss(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_maxrss * 1024.0;
}

ft_status ft_cli_pipe_start(ft_cli_pipe *p, const ft_pipe_stage_params *base, const ft_offload_params *off,
                            int *worker_done)
{
    *worker_done = 0;
    ft_status st;
    if (p->mode == FT_PIPE_MPI) {
        int size = 0;
        if ((st = ft_cli_mpi_init(&p->rank, &size))) return st;
        if (size > FT_PIPE_MAX_STAGES)
            return ft_set_error(FT_ERR_INVALID_ARG, "mpirun -n %d: at most %d stages", size, FT_PIPE_MAX_STAGES);
        p->n_stages = size;
    }
    ft_model_config cfg;
    if ((st = ft_model_config_load_ex(base->model_dir, base->config_flags, &cfg))) return st;
    if (p->n_stages > cfg.n_layers)
        return ft_set_error(FT_ERR_INVALID_ARG, "%d stages for a model of %d layers", p->n_stages, cfg.n_layers);
    if (p->n_counts) {
        int sum = 0;
        for (int i = 0; i < p->n_counts; i++) sum += p->counts[i];
        if (p->n_counts != p->n_stages || sum != cfg.n_layers)
            return ft_set_error(FT_ERR_INVALID_ARG, "--stage-layers: %d counts adding up to %d, for %d stages of a "
                                "model of %d layers", p->n_counts, sum, p->n_stages, cfg.n_layers);
        p->bounds[0] = 0;
        for (int i = 0; i < p->n_stages; i++) p->bounds[i + 1] = p->bounds[i] + p->counts[i];
    } else {
        ft_pipe_split_layers(cfg.n_layers, p->n_stages, p->bounds);
    }
    /* the run's id: the same on every rank of an mpirun (its tag) */
    uint64_t job = p->mode == FT_PIPE_MPI ? 0x4654505049504531ull : ((uint64_t)getpid() << 32) ^ (uint64_t)(ft_now() * 1e6);
    ft_pipe_stage_params sp[FT_PIPE_MAX_STAGES];
    for (int i = 0; i < p->n_stages; i++) {
        sp[i] = *base;
        sp[i].stage = i;
        sp[i].n_stages = p->n_stages;
        sp[i].l0 = p->bounds[i];
        sp[i].l1 = p->bounds[i + 1];
        sp[i].job = job;
    }
    const int last = p->n_stages - 1;
    switch (p->mode) {
    case FT_PIPE_LOCAL:
        p->transport = "local";
        if (p->n_stages > 1) {
            if ((st = ft_pipe_local_ring(p->n_stages, p->local))) return st;
            p->link = p->local[last];
            for (int i = 0; i < last; i++) {
                local_arg *a = calloc(1, sizeof *a);
                if (!a) return FT_ERR_NOMEM;
                a->sp = sp[i];
                a->off = off;
                a->link = p->local[i];
                if (pthread_create(&p->thr[i], NULL, local_main, a)) { free(a); return FT_ERR_NOMEM; }
                p->nthr = i + 1;
            }
        }
        break;
    case FT_PIPE_REMOTE:
        p->transport = "ucx";
        if ((st = ft_pipe_connect(p->workers, p->n_workers, sp, p->token_file, p->trusted, job, &p->link, &p->remote)))
            return st;
        break;
    case FT_PIPE_MPI: {
        p->transport = p->mpi_transport ? "mpi" : "ucx";
        ft_pipe_stage *s = NULL;
        if ((st = ft_pipe_stage_create(&sp[p->rank], off, &s))) return st;
        if (p->mpi_transport) {
            st = ft_cli_mpi_link(p->rank, p->n_stages, &p->link);
        } else {
            /* UCX links; the ranks swap their worker addresses over MPI */
            size_t cap = 16384, lens[FT_PIPE_MAX_STAGES], mine = 0;
            uint8_t *all = malloc(cap * (size_t)p->n_stages), addr[16384];
            st = all ? ft_pipe_ucx_create(job, p->trusted, NULL, &p->link) : FT_ERR_NOMEM;
            if (!st) st = ft_pipe_ucx_address(p->link, addr, sizeof addr, &mine);
            if (!st) st = ft_cli_mpi_allgather(addr, mine, all, cap, lens);
            int nx = (p->rank + 1) % p->n_stages;
            if (!st) st = ft_pipe_ucx_connect(p->link, all + cap * (size_t)nx, lens[nx]);
            free(all);
        }
        if (st) { ft_pipe_stage_free(s); return st; }
        if (p->rank != last) {
            st = ft_pipe_worker_run(s, p->link);
            ft_pipe_stage_free(s);
            ft_pipe_link_close(p->link);
            p->link = NULL;
            ft_status g = ft_cli_mpi_allgather_double(peak_rss(), p->rss);
            ft_cli_mpi_finalize();
            *worker_done = 1;
            return st ? st : g;
        }
        p->stage = s;
        return FT_OK;
    }
    default:
        return ft_set_error(FT_ERR_INVALID_ARG, "pipeline: no mode");
    }
    return ft_pipe_stage_create(&sp[last], off, &p->stage);
}

void ft_cli_pipe_end(ft_cli_pipe *p)
{
    if (p->ended) return;
    p->ended = 1;
    if (p->stage && p->link) {
        ft_status st = ft_pipe_end(p->stage, p->link, 30000);
        if (st) fprintf(stderr, "flextier: pipeline: ending the run: %s\n", ft_last_error());
    }
    if (p->mode == FT_PIPE_MPI && !p->stage) {   /* the driver failed before its ring ran: end the job */
        ft_cli_mpi_abort();
        return;
    }
    if (p->mode == FT_PIPE_MPI) {
        ft_pipe_link_close(p->link);
        p->link = NULL;
        if (ft_cli_mpi_allgather_double(peak_rss(), p->rss)) memset(p->rss, 0, sizeof p->rss);
        ft_cli_mpi_finalize();
    }
}

void ft_cli_pipe_finish(ft_cli_pipe *p)
{
    ft_cli_pipe_end(p);
    ft_pipe_link_close(p->link);
    p->link = NULL;
    for (int i = 0; i < p->nthr; i++) pthread_join(p->thr[i], NULL);
    p->nthr = 0;
    ft_pipe_disconnect(p->remote);
    p->remote = NULL;
    ft_pipe_stage_free(p->stage);
    p->stage = NULL;
}

void ft_cli_pipe_describe(const ft_cli_pipe *p, int micro, FILE *f)
{
    fprintf(f, "pipeline: %d stages (layers", p->n_stages);
    for (int i = 0; i < p->n_stages; i++) fprintf(f, "%s%d-%d", i ? " | " : " ", p->bounds[i], p->bounds[i + 1] - 1);
    fprintf(f, "), %d micro-batches, transport %s\n", micro, p->transport ? p->transport : "?");
}

ft_status ft_cli_pipe_base(ft_cli_pipe *p, const char *dir, const ft_cli_session *o, int max_batch, int max_seq,
                           int max_rows, unsigned threads, ft_pipe_stage_params *out)
{
    (void)p;
    ft_pipe_stage_default(out);
    /* the workers open the same path on their machines */
    char *abs = realpath(dir, NULL);
    if (!abs) return ft_set_error(FT_ERR_NOT_FOUND, "%s: no such model directory", dir);
    if (strlen(abs) >= sizeof out->model_dir) {
        free(abs);
        return ft_set_error(FT_ERR_INVALID_ARG, "%s: path too long", dir);
    }
    snprintf(out->model_dir, sizeof out->model_dir, "%s", abs);
    free(abs);
    for (const char *c = out->model_dir; *c; c++)
        if ((unsigned char)*c < 0x20 || (unsigned char)*c > 0x7e)
            return ft_set_error(FT_ERR_INVALID_ARG, "%s: a pipeline needs a printable model path", dir);
    if (o->sp.device != FT_DEVICE_CPU)
        return ft_set_error(FT_ERR_UNSUPPORTED, "--pipeline: the stages compute on the CPU (no --device cuda)");
    out->max_batch = max_batch;
    out->max_seq = max_seq;
    out->max_rows = max_rows;
    out->threads = threads;
    out->weights = o->sp.weights;
    out->config_flags = o->sp.strict ? FT_CONFIG_STRICT : 0;
    out->kv_dtype = o->sp.kv_dtype >= 0 ? o->sp.kv_dtype : FT_BF16;
    if (o->enabled) {
        if (o->auto_policy)
            return ft_set_error(FT_ERR_UNSUPPORTED, "--policy auto with --pipeline: give each stage's policy");
        const ft_policy *pol = &o->sp.policy;
        ft_status st = ft_policy_validate(pol);
        if (st) return st;
        if (pol->c_pct[FT_TIER_DEVICE] != 100.0f)
            return ft_set_error(FT_ERR_UNSUPPORTED, "--pipeline: the stages keep the KV cache in memory (c=100); "
                                "they may offload their weights (w=)");
        char b[512];
        size_t n;
        ft_policy_format(pol, b, sizeof b);
        n = strlen(b);
        if (pol->n_remotes) {
            n += (size_t)snprintf(b + n, sizeof b - n, " remote=");
            for (uint32_t r = 0; r < pol->n_remotes && n < sizeof b; r++)
                n += (size_t)snprintf(b + n, sizeof b - n, "%s%s", r ? "," : "", pol->remotes[r]);
        }
        if (pol->disk_uri[0] && n < sizeof b) n += (size_t)snprintf(b + n, sizeof b - n, " disk=%s", pol->disk_uri);
        if (n >= sizeof out->policy) return ft_set_error(FT_ERR_INVALID_ARG, "--pipeline: the policy is too long");
        snprintf(out->policy, sizeof out->policy, "%s", b);
    } else if (o->sp.policy.n_remotes || o->sp.policy.disk_uri[0] || o->codec_given || o->cache_codec_given) {
        return ft_set_error(FT_ERR_INVALID_ARG, "--remote/--disk-dir/--compress-weights/--compress-cache need --policy");
    }
    return FT_OK;
}

void ft_cli_pipe_offload_params(const ft_cli_session *o, ft_offload_params *out)
{
    ft_offload_default_params(out);
    out->token_file = o->sp.token_file;
    out->device_budget = o->sp.device_mem;
    out->decode_threads = o->sp.decode_threads ? o->sp.decode_threads : ft_default_threads();
    if (o->sp.failover_ms) out->failover_ms = o->sp.failover_ms;
}

int ft_cli_pipe_stray(const ft_cli_pipe *p)
{
    return !p->mode && (p->trusted || p->micro || p->n_counts || p->token_file || !p->mpi_transport);
}

ft_status ft_cli_pipe_prompt_tokens(const char *dir, int strict, const char *const *prompts, size_t n, size_t *maxp,
                                    size_t *sum)
{
    ft_tokenizer *tok = NULL;
    ft_status st = ft_tokenizer_load_dir_ex(dir, strict ? FT_TOKENIZER_STRICT : 0, &tok);
    if (st) return st;
    *maxp = *sum = 0;
    for (size_t j = 0; j < n && !st; j++) {
        int32_t *ids = NULL;
        size_t k = 0;
        if ((st = ft_tokenizer_encode(tok, prompts[j], strlen(prompts[j]), 1, &ids, &k))) break;
        free(ids);
        if (k > *maxp) *maxp = k;
        *sum += k;
    }
    ft_tokenizer_free(tok);
    return st;
}

ft_status ft_cli_pipe_open(ft_cli_pipe *p, const ft_cli_session *o, const char *dir, size_t n, size_t rows,
                           size_t maxp, size_t gen_len, int *micro, int *worker_done, ft_session **out)
{
    *worker_done = 0;
    *out = NULL;
    if (n == 0 || maxp == 0) return ft_set_error(FT_ERR_INVALID_ARG, "pipeline: no prompt tokens");
    if (n > 65536 || rows > (1u << 24) || maxp + gen_len > (1u << 24))
        return ft_set_error(FT_ERR_INVALID_ARG, "pipeline: %zu sequences of up to %zu + %zu tokens: too large", n,
                            maxp, gen_len);
    /* every micro-batch's prompts are one forward call of each stage: at
     * most ceil(n / M) prompts (MPI: the ring's size is known later, so
     * room for them all) */
    size_t mrows = rows;
    if (p->mode != FT_PIPE_MPI) {
        size_t M = (size_t)ft_cli_pipe_micro(p, n), per = (n + M - 1) / M;
        if (per * maxp < mrows) mrows = per * maxp;
    }
    ft_pipe_stage_params base;
    ft_status st = ft_cli_pipe_base(p, dir, o, (int)n, (int)(maxp + gen_len), (int)mrows, o->sp.threads, &base);
    if (st) return st;
    ft_cli_pipe_offload_params(o, &p->off);
    if ((st = ft_cli_pipe_start(p, &base, &p->off, worker_done))) return st;
    if (*worker_done) return FT_OK;
    *micro = ft_cli_pipe_micro(p, n);
    ft_session_params sp = o->sp;
    sp.offload = o->enabled ? FT_OFFLOAD_POLICY : FT_OFFLOAD_NONE;
    return ft_session_open_pipeline(dir, &sp, p->stage, p->link, *micro, out);
}

void ft_cli_pipe_report_json(const ft_cli_pipe *p, int micro, double rss, FILE *f)
{
    fprintf(f, ",\"pipeline\":{\"stages\":%d,\"micro_batches\":%d,\"transport\":\"%s\",\"layers\":[", p->n_stages,
            micro, p->transport ? p->transport : "?");
    for (int i = 0; i <= p->n_stages; i++) fprintf(f, "%s%d", i ? "," : "", p->bounds[i]);
    /* every stage's peak RSS where known (MPI gathers them; elsewhere the
     * workers print their own): 0 = not known here */
    fprintf(f, "],\"stage_peak_rss_bytes\":[");
    for (int i = 0; i < p->n_stages; i++)
        fprintf(f, "%s%.0f", i ? "," : "", p->mode == FT_PIPE_MPI ? p->rss[i] : i == p->n_stages - 1 ? rss : 0);
    fprintf(f, "]}");
}
