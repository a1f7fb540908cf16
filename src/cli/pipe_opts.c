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

void ft_cli_pipe_finish(ft_cli_pipe *p)
{
    if (p->stage && p->link) {
        ft_status st = ft_pipe_end(p->stage, p->link, 30000);
        if (st) fprintf(stderr, "flextier: pipeline: ending the run: %s\n", ft_last_error());
    }
    if (p->mode == FT_PIPE_MPI && !p->stage) {   /* the driver failed before its ring ran: end the job */
        ft_cli_mpi_abort();
        return;
    }
    if (p->mode == FT_PIPE_MPI && p->stage) {
        ft_pipe_link_close(p->link);
        p->link = NULL;
        if (ft_cli_mpi_allgather_double(peak_rss(), p->rss)) memset(p->rss, 0, sizeof p->rss);
        ft_cli_mpi_finalize();
    }
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

ft_status ft_cli_pipe_base(ft_cli_pipe *p, const char *dir, const ft_cli_offload *off, const ft_load_params *lp,
                           int max_batch, int max_seq, int max_rows, unsigned threads, ft_pipe_stage_params *out)
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
    out->max_batch = max_batch;
    out->max_seq = max_seq;
    out->max_rows = max_rows;
    out->threads = threads;
    out->weights = lp->weights;
    out->config_flags = lp->config_flags;
    out->kv_dtype = off->kv_dtype >= 0 ? off->kv_dtype : FT_BF16;
    if (off->enabled) {
        if (off->auto_policy)
            return ft_set_error(FT_ERR_UNSUPPORTED, "--policy auto with --pipeline: give each stage's policy");
        if (off->p.policy.c_pct[FT_TIER_DEVICE] != 100.0f)
            return ft_set_error(FT_ERR_UNSUPPORTED, "--pipeline: the stages keep the KV cache in memory (c=100); "
                                "they may offload their weights (w=)");
        const ft_policy *pol = &off->p.policy;
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
    }
    return FT_OK;
}
