/* flextier serve | put | get | ls | rm | stat */
#include "cli.h"
#include "flextier/store.h"

#include <fcntl.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

static const char store_usage[] =
    "usage:\n"
    "  flextier serve [--listen HOST:PORT] --capacity SIZE [--spill-dir DIR --spill-capacity SIZE]\n"
    "                 [--token-file FILE] [--max-connections N] [--max-unauth N]\n"
    "                 [--auth-timeout SECONDS] [--lease-timeout SECONDS]\n"
    "                 [--trusted-network] [--insecure] [--overcommit]\n"
    "  flextier put URI KEY FILE --dtype DT [--shape D0,D1,..] [-c CODEC] [-l LEVEL]\n"
    "               [--group-size G] [--group-dim D] [--chunk-size SIZE]\n"
    "  flextier get URI KEY OUT [--dtype f32|bf16|f16]\n"
    "  flextier ls URI\n"
    "  flextier rm URI KEY\n"
    "  flextier stat URI [KEY]\n"
    "\n"
    "URI: mem: | file:DIR | ucx://HOST:PORT. serve listens on 127.0.0.1:13337 by default\n"
    "(port 0 = any free port; the bound address is printed on stdout). Without --token-file\n"
    "it listens only on a loopback address (--insecure: anywhere). --trusted-network lets\n"
    "UCX carry data over TCP, which trusts every peer that can reach it (docs/protocol.md).\n"
    "The token file must be private to its owner (chmod 600) and hold >= 16 bytes.\n"
    "Client commands accept --token-file FILE (or FLEXTIER_TOKEN_FILE in the environment);\n"
    "a token is never taken from the command line. FILE/OUT may be '-' (stdin/stdout);\n"
    "they hold raw little-endian row-major tensor bytes.\n";

static const struct option opts[] = {
    {"listen", required_argument, 0, 'L'}, {"capacity", required_argument, 0, 'C'},
    {"spill-dir", required_argument, 0, 'S'}, {"spill-capacity", required_argument, 0, 'P'},
    {"token-file", required_argument, 0, 't'}, {"max-connections", required_argument, 0, 'M'},
    {"max-unauth", required_argument, 0, 'U'}, {"auth-timeout", required_argument, 0, 'A'},
    {"lease-timeout", required_argument, 0, 'T'}, {"trusted-network", no_argument, 0, 'R'},
    {"insecure", no_argument, 0, 'I'}, {"overcommit", no_argument, 0, 'O'},
    {"codec", required_argument, 0, 'c'}, {"level", required_argument, 0, 'l'},
    {"group-size", required_argument, 0, 'g'}, {"group-dim", required_argument, 0, 'G'},
    {"chunk-size", required_argument, 0, 'k'}, {"dtype", required_argument, 0, 'd'},
    {"shape", required_argument, 0, 's'}, {"json", no_argument, 0, 'j'},
    {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};

typedef struct {
    ft_node_params node;
    const char *token_file;
    ft_codec_params cp;
    int have_codec, have_dtype, have_shape, have_capacity, json;
    ft_dtype dtype;
    uint32_t ndim;
    int64_t shape[FT_MAX_DIMS];
    int nargs;
    char *args[4];
} store_opts;

static int parse(int argc, char **argv, store_opts *o)
{
    int c;
    long v;
    uint64_t sz;
    memset(o, 0, sizeof *o);
    ft_node_default_params(&o->node);
    ft_codec_default_params(&o->cp);
    o->cp.codec = FT_CODEC_RAW;
    optind = 1;
    opterr = 0;
    const ft_cli_tensor_args ta = {&o->cp, &o->dtype, &o->ndim, o->shape, &o->have_codec, &o->have_dtype,
                                   &o->have_shape};
    while ((c = getopt_long(argc, argv, "c:l:h", opts, NULL)) != -1) {
        int r = ft_cli_tensor_opt(c, optarg, &ta);
        if (r < 0) return ft_cli_usage_error(store_usage, "%s", ft_last_error());
        if (r) continue;
        switch (c) {
        case 'L': o->node.listen = optarg; break;
        case 'C':
            if (ft_cli_parse_size(optarg, &sz) || sz == 0)
                return ft_cli_usage_error(store_usage, "--capacity: bad size '%s'", optarg);
            o->node.capacity = sz;
            o->have_capacity = 1;
            break;
        case 'S': o->node.spill_dir = optarg; break;
        case 'P':
            if (ft_cli_parse_size(optarg, &sz))
                return ft_cli_usage_error(store_usage, "--spill-capacity: bad size '%s'", optarg);
            o->node.spill_capacity = sz;
            break;
        case 't': o->token_file = optarg; break;
        case 'M':
            if (ft_cli_parse_int(optarg, 1, 65536, &v))
                return ft_cli_usage_error(store_usage, "--max-connections: %s", ft_last_error());
            o->node.max_connections = (unsigned)v;
            break;
        case 'U':
            if (ft_cli_parse_int(optarg, 1, 65536, &v))
                return ft_cli_usage_error(store_usage, "--max-unauth: %s", ft_last_error());
            o->node.max_unauth = (unsigned)v;
            break;
        case 'A':
        case 'T': {
            char *end;
            double secs = strtod(optarg, &end);
            if (end == optarg || *end || !(secs >= 0.05 && secs <= 86400))
                return ft_cli_usage_error(store_usage, "--%s: seconds within 0.05..86400, got '%s'",
                                          c == 'A' ? "auth-timeout" : "lease-timeout", optarg);
            if (c == 'A') o->node.auth_timeout_ms = (int)(secs * 1000);
            else o->node.lease_timeout_ms = (int)(secs * 1000);
            break;
        }
        case 'R': o->node.trusted_network = 1; break;
        case 'I': o->node.insecure = 1; break;
        case 'O': o->node.overcommit = 1; break;
        case 'j': o->json = 1; break;
        case 'h': fputs(store_usage, stdout); return FT_EXIT_OK;
        default:
            return ft_cli_usage_error(store_usage, "unknown or incomplete option '%s'",
                                      argv[optind - 1]);
        }
    }
    for (int i = optind; i < argc; i++) {
        if (o->nargs == 4) return ft_cli_usage_error(store_usage, "too many arguments");
        o->args[o->nargs++] = argv[i];
    }
    return -1;
}

static int open_store(const store_opts *o, const char *uri, ft_store **s)
{
    ft_store_params p;
    ft_store_default_params(&p);
    p.token_file = o->token_file;
    ft_status st = ft_store_open(uri, &p, s);
    if (st != FT_OK) return ft_cli_fail(uri, st);
    return -1;
}

/* get, ls, rm, stat: the options, lo..hi arguments (else "<need>"), the
 * store of the first. -1: go on with *s open; else the exit code. */
static int begin(int argc, char **argv, store_opts *o, int lo, int hi, const char *need, ft_store **s)
{
    int rc = parse(argc, argv, o);
    if (rc >= 0) return rc;
    if (o->nargs < lo || o->nargs > hi) return ft_cli_usage_error(store_usage, "%s", need);
    return open_store(o, o->args[0], s);
}

/* ------------------------------------------------------------------ serve */

int ft_cmd_serve(int argc, char **argv)
{
    store_opts o;
    int rc = parse(argc, argv, &o);
    if (rc >= 0) return rc;
    if (o.nargs) return ft_cli_usage_error(store_usage, "serve takes no arguments");
    if (!o.have_capacity) return ft_cli_usage_error(store_usage, "serve needs --capacity SIZE");
    if (o.node.spill_dir && !o.node.spill_capacity)
        return ft_cli_usage_error(store_usage, "--spill-dir needs --spill-capacity SIZE");
    o.node.token_file = o.token_file;
    o.node.stop = ft_cli_daemon_start();
    o.node.on_ready = ft_cli_print_listening;
    o.node.arg = (void *)"flextier serve";
    ft_status st = ft_node_run(&o.node);
    if (st == FT_ERR_INVALID_ARG) {   /* the configuration: a usage error */
        ft_cli_fail("serve", st);
        return FT_EXIT_USAGE;
    }
    if (st != FT_OK) return ft_cli_fail("serve", st);
    return FT_EXIT_OK;
}

/* ---------------------------------------------------------------- put/get */

int ft_cmd_put(int argc, char **argv)
{
    store_opts o;
    int rc = parse(argc, argv, &o);
    if (rc >= 0) return rc;
    if (o.nargs != 3) return ft_cli_usage_error(store_usage, "put needs URI KEY FILE");
    if (!o.have_dtype) return ft_cli_usage_error(store_usage, "put needs --dtype");
    uint8_t *data = NULL;
    size_t size = 0;
    ft_status st = ft_cli_read_file(o.args[2], &data, &size);
    if (st != FT_OK) return ft_cli_fail(o.args[2], st);
    ft_tensor t;
    if (!o.have_shape) {
        unsigned bits = ft_dtype_bits(o.dtype);
        if (!bits || (size * 8) % bits) {
            ft_free_aligned(data);
            return ft_cli_usage_error(store_usage, "%zu bytes are not whole %s elements", size,
                                      ft_dtype_name(o.dtype));
        }
        o.ndim = 1;
        o.shape[0] = (int64_t)(size * 8 / bits);
    }
    uint64_t nbytes = 0;
    st = ft_tensor_init(&t, o.dtype, o.ndim, o.shape, data);
    if (st == FT_OK) st = ft_tensor_nbytes(&t, &nbytes);
    if (st == FT_OK && nbytes != size)
        st = ft_set_error(FT_ERR_INVALID_ARG, "%s holds %zu bytes, the shape needs %llu",
                          o.args[2], size, (unsigned long long)nbytes);
    if (st != FT_OK) {
        ft_free_aligned(data);
        return ft_cli_fail("put", st);
    }
    ft_store *s = NULL;
    rc = open_store(&o, o.args[0], &s);
    if (rc >= 0) { ft_free_aligned(data); return rc; }
    st = ft_write_tensor(s, o.args[1], &t, &o.cp);
    ft_tensor_stat ts;
    if (st == FT_OK && ft_stat_tensor(s, o.args[1], &ts) == FT_OK)
        fprintf(stderr, "put %s: %llu bytes as %s -> %llu bytes (ratio %.3f)\n", o.args[1],
                (unsigned long long)ts.raw_bytes, ft_codec_name(ts.codec),
                (unsigned long long)ts.stored_bytes,
                ts.stored_bytes ? (double)ts.raw_bytes / (double)ts.stored_bytes : 0.0);
    ft_store_close(s);
    ft_free_aligned(data);
    return st == FT_OK ? FT_EXIT_OK : ft_cli_fail("put", st);
}

int ft_cmd_get(int argc, char **argv)
{
    store_opts o;
    ft_store *s = NULL;
    int rc = begin(argc, argv, &o, 3, 3, "get needs URI KEY OUT", &s);
    if (rc >= 0) return rc;
    ft_tensor t;
    ft_status st = ft_read_tensor(s, o.args[1], o.have_dtype ? (int)o.dtype : -1, &t);
    ft_store_close(s);
    if (st != FT_OK) return ft_cli_fail("get", st);
    uint64_t n = 0;
    st = ft_tensor_nbytes(&t, &n);
    if (st == FT_OK) st = ft_cli_write_file(o.args[2], t.data, n);
    ft_free_aligned(t.data);
    return st == FT_OK ? FT_EXIT_OK : ft_cli_fail(o.args[2], st);
}

/* ----------------------------------------------------------- ls / rm / stat */

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int ft_cmd_ls(int argc, char **argv)
{
    store_opts o;
    ft_store *s = NULL;
    int rc = begin(argc, argv, &o, 1, 1, "ls needs URI", &s);
    if (rc >= 0) return rc;
    char **keys = NULL;
    size_t n = 0;
    ft_status st = ft_list_tensors(s, &keys, &n);
    if (st == FT_OK) {
        if (n) qsort(keys, n, sizeof *keys, cmp_str);
        for (size_t i = 0; i < n; i++) printf("%s\n", keys[i]);
        ft_list_free(keys, n);
    }
    ft_store_close(s);
    return st == FT_OK ? FT_EXIT_OK : ft_cli_fail("ls", st);
}

int ft_cmd_rm(int argc, char **argv)
{
    store_opts o;
    ft_store *s = NULL;
    int rc = begin(argc, argv, &o, 2, 2, "rm needs URI KEY", &s);
    if (rc >= 0) return rc;
    ft_status st = ft_delete_tensor(s, o.args[1]);
    ft_store_close(s);
    return st == FT_OK ? FT_EXIT_OK : ft_cli_fail("rm", st);
}

int ft_cmd_stat(int argc, char **argv)
{
    store_opts o;
    ft_store *s = NULL;
    int rc = begin(argc, argv, &o, 1, 2, "stat needs URI [KEY]", &s);
    if (rc >= 0) return rc;
    ft_status st;
    if (o.nargs == 2) {
        ft_tensor_stat t;
        st = ft_stat_tensor(s, o.args[1], &t);
        if (st == FT_OK) {
            char shape[256];
            ft_shape_format(t.ndim, t.shape, shape, sizeof shape);
            if (o.json)
                printf("{\"key\":\"%s\",\"dtype\":\"%s\",\"shape\":\"%s\",\"codec\":\"%s\","
                       "\"raw_bytes\":%llu,\"stored_bytes\":%llu}\n", o.args[1],
                       ft_dtype_name(t.dtype), shape, ft_codec_name(t.codec),
                       (unsigned long long)t.raw_bytes, (unsigned long long)t.stored_bytes);
            else
                printf("key:          %s\ndtype:        %s\nshape:        %s\ncodec:        %s\n"
                       "raw bytes:    %llu\nstored bytes: %llu\nratio:        %.3f\n",
                       o.args[1], ft_dtype_name(t.dtype), shape, ft_codec_name(t.codec),
                       (unsigned long long)t.raw_bytes, (unsigned long long)t.stored_bytes,
                       t.stored_bytes ? (double)t.raw_bytes / (double)t.stored_bytes : 0.0);
        }
    } else {
        ft_store_stats t;
        st = ft_store_stats_get(s, &t);
        if (st == FT_OK) {
            if (o.json)
                printf("{\"capacity\":%llu,\"used\":%llu,\"tensors\":%llu,\"connections\":%llu,"
                       "\"total_connections\":%llu,\"bytes_in\":%llu,\"bytes_out\":%llu,"
                       "\"spill_capacity\":%llu,\"spill_used\":%llu,\"spilled_tensors\":%llu,"
                       "\"puts\":%llu,\"gets\":%llu}\n",
                       (unsigned long long)t.capacity, (unsigned long long)t.used,
                       (unsigned long long)t.tensors, (unsigned long long)t.connections,
                       (unsigned long long)t.total_connections, (unsigned long long)t.bytes_in,
                       (unsigned long long)t.bytes_out, (unsigned long long)t.spill_capacity,
                       (unsigned long long)t.spill_used, (unsigned long long)t.spilled_tensors,
                       (unsigned long long)t.puts, (unsigned long long)t.gets);
            else
                printf("capacity:          %llu\nused:              %llu\ntensors:           %llu\n"
                       "connections:       %llu\ntotal connections: %llu\nbytes in:          %llu\n"
                       "bytes out:         %llu\nspill capacity:    %llu\nspill used:        %llu\n"
                       "spilled tensors:   %llu\nputs:              %llu\ngets:              %llu\n",
                       (unsigned long long)t.capacity, (unsigned long long)t.used,
                       (unsigned long long)t.tensors, (unsigned long long)t.connections,
                       (unsigned long long)t.total_connections, (unsigned long long)t.bytes_in,
                       (unsigned long long)t.bytes_out, (unsigned long long)t.spill_capacity,
                       (unsigned long long)t.spill_used, (unsigned long long)t.spilled_tensors,
                       (unsigned long long)t.puts, (unsigned long long)t.gets);
        }
    }
    ft_store_close(s);
    return st == FT_OK ? FT_EXIT_OK : ft_cli_fail("stat", st);
}

/* ------------------------------------------------------- bench transfer */


static const char bench_usage[] =
    "usage: flextier bench transfer URI [--size SIZE] [-c CODEC] [-l LEVEL] [--depth N]\n"
    "                               [--iters N] [--json] [--token-file FILE]\n"
    "                               [--perftest-host HOST] [--perftest-port PORT] [--no-perftest]\n"
    "                               [--reps N]\n"
    "\n"
    "Writes then reads --iters tensors of --size bytes (synthetic bf16 N(0, 0.02) weights)\n"
    "with --depth requests in flight, and reports logical GB/s (tensor bytes), wire GB/s\n"
    "(frame bytes) and the ratio (medians of --reps rounds). In the same run, before and\n"
    "after, it measures `ucx_perftest -t ucp_am_bw` with the same message size: against a\n"
    "ucx_perftest server it starts on 127.0.0.1 (default), or one already running on\n"
    "--perftest-host. For an encoding codec it also times one synchronous write against\n"
    "its parts: the encode alone and the frame's bytes written raw (wall / max).\n";

static const struct option bench_opts[] = {
    {"size", required_argument, 0, 'z'}, {"codec", required_argument, 0, 'c'},
    {"level", required_argument, 0, 'l'}, {"depth", required_argument, 0, 'D'},
    {"iters", required_argument, 0, 'n'}, {"json", no_argument, 0, 'j'},
    {"token-file", required_argument, 0, 't'}, {"perftest-host", required_argument, 0, 'H'},
    {"perftest-port", required_argument, 0, 'p'}, {"no-perftest", no_argument, 0, 'N'},
    {"reps", required_argument, 0, 'R'},
    {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};

/* Run ucx_perftest client against host:port (spawning a local server
 * when spawn is set); MB/s from the "Final:" line, or < 0. */
static double run_perftest(const char *host, int port, int spawn, uint64_t size, long iters,
                           char *why, size_t why_n)
{
    char portbuf[16], sizebuf[32], itbuf[32];
    snprintf(portbuf, sizeof portbuf, "%d", port);
    snprintf(sizebuf, sizeof sizebuf, "%llu", (unsigned long long)size);
    snprintf(itbuf, sizeof itbuf, "%ld", iters);
    pid_t srv = -1;
    if (spawn) {
        srv = fork();
        if (srv == 0) {
            int null = open("/dev/null", O_WRONLY);
            if (null >= 0) { dup2(null, 1); dup2(null, 2); }
            execlp("ucx_perftest", "ucx_perftest", "-p", portbuf, (char *)NULL);
            _exit(127);
        }
        usleep(300000);
    }
    int fds[2];
    double mbs = -1;
    if (pipe(fds) == 0) {
        pid_t cl = fork();
        if (cl == 0) {
            dup2(fds[1], 1);
            dup2(fds[1], 2);
            close(fds[0]);
            execlp("timeout", "timeout", "60", "ucx_perftest", host, "-p", portbuf, "-t",
                   "ucp_am_bw", "-s", sizebuf, "-n", itbuf, (char *)NULL);
            _exit(127);
        }
        close(fds[1]);
        char buf[8192];
        size_t n = 0;
        ssize_t r;
        while ((r = read(fds[0], buf + n, sizeof buf - 1 - n)) > 0) {
            n += (size_t)r;
            if (n > sizeof buf / 2) {   /* keep the tail */
                memmove(buf, buf + n - sizeof buf / 4, sizeof buf / 4);
                n = sizeof buf / 4;
            }
        }
        buf[n] = 0;
        close(fds[0]);
        int status = 0;
        if (cl > 0) waitpid(cl, &status, 0);
        char *f = strstr(buf, "Final:");
        double v[8];
        if (f && sscanf(f + 6, "%lf %lf %lf %lf %lf %lf", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5]) == 6)
            mbs = v[5];
        else if (WIFEXITED(status) && WEXITSTATUS(status) == 127)
            snprintf(why, why_n, "ucx_perftest not found (install ucx-utils)");
        else
            snprintf(why, why_n, "ucx_perftest gave no result");
    }
    if (srv > 0) {
        kill(srv, SIGTERM);
        waitpid(srv, NULL, 0);
    }
    return mbs;
}

static void gauss_bf16(uint16_t *dst, size_t n, uint64_t seed)
{
    uint64_t s = seed;
    for (size_t i = 0; i < n; i += 2) {
        double u1, u2;
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        u1 = ((s >> 11) + 1.0) / 9007199254740993.0;
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        u2 = (s >> 11) / 9007199254740992.0;
        double r = sqrt(-2.0 * log(u1)) * 0.02;
        dst[i] = ft_f32_to_bf16_1((float)(r * cos(2 * M_PI * u2)));
        if (i + 1 < n) dst[i + 1] = ft_f32_to_bf16_1((float)(r * sin(2 * M_PI * u2)));
    }
}

/* CPU seconds (user + system) this process has used, all threads. */
static double cpu_seconds(void)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + (double)ru.ru_stime.tv_sec +
           ru.ru_stime.tv_usec * 1e-6;
}

/* Run `iters` ops with `depth` in flight; returns seconds or < 0 and the
 * process's CPU seconds meanwhile in *cpu. */
static double run_phase(ft_store *s, int write, ft_tensor *src, ft_tensor *dst, size_t cap,
                        const ft_codec_params *cp, long depth, long iters, ft_status *err,
                        double *cpu)
{
    ft_request **reqs = calloc((size_t)depth, sizeof *reqs);
    if (!reqs) { *err = FT_ERR_NOMEM; return -1; }
    double c0 = cpu_seconds();
    double t0 = ft_now();
    ft_status st = FT_OK;
    for (long i = 0; i < iters + depth && st == FT_OK; i++) {
        long slot = i % depth;
        if (reqs[slot]) {
            st = ft_request_wait(reqs[slot], -1);
            ft_request_free(reqs[slot]);
            reqs[slot] = NULL;
        }
        if (i >= iters || st != FT_OK) continue;
        char key[32];
        snprintf(key, sizeof key, "bench/%ld", slot);
        st = write ? ft_write_tensor_async(s, key, src, cp, &reqs[slot])
                   : ft_read_tensor_async(s, key, &dst[slot], cap, &reqs[slot]);
    }
    double dt = ft_now() - t0;
    for (long i = 0; i < depth; i++) {
        if (reqs[i]) {
            ft_status r = ft_request_wait(reqs[i], -1);
            if (st == FT_OK) st = r;
            ft_request_free(reqs[i]);
        }
    }
    free(reqs);
    *cpu = cpu_seconds() - c0;
    *err = st;
    return st == FT_OK ? dt : -1;
}

static int cmp_dbl(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* One encoded write, synchronous, against its parts measured in the same
 * run: the encode alone (a codec context of the store's thread count) and
 * the wire alone (the frame's bytes written raw through the same store).
 * Medians of reps. A pipelined write overlaps the two: wall ~ max. */
typedef struct { double wall, encode, wire; } pipe_times;

static ft_status measure_pipeline(ft_store *s, const ft_tensor *src, const ft_codec_params *cp,
                                  uint64_t frame_bytes, int reps, pipe_times *out)
{
    double w[16], e[16], r[16];
    if (reps > 16) reps = 16;
    ft_codec_ctx *cc = NULL;
    ft_status st = ft_codec_ctx_create(0, &cc);
    size_t bound = ft_encode_bound(cp, src->dtype, src->ndim, src->shape);
    uint8_t *frame = st == FT_OK ? ft_malloc_aligned(bound ? bound : 64, 64) : NULL;
    uint8_t *raw = frame ? ft_malloc_aligned(frame_bytes ? frame_bytes : 64, 64) : NULL;
    if (st == FT_OK && (!frame || !raw)) st = ft_set_error(FT_ERR_NOMEM, "bench buffers");
    if (raw) memset(raw, 0x3c, frame_bytes);
    int64_t rshape[1] = {(int64_t)frame_bytes};
    ft_tensor rt;
    ft_tensor_init(&rt, FT_U8, 1, rshape, raw);
    ft_codec_params rawp;
    ft_codec_default_params(&rawp);
    rawp.codec = FT_CODEC_RAW;
    for (int i = 0; i < reps && st == FT_OK; i++) {
        size_t fs = 0;
        double t0 = ft_now();
        st = ft_encode(cc, cp, src, frame, bound, &fs);
        e[i] = ft_now() - t0;
        t0 = ft_now();
        if (st == FT_OK) st = ft_write_tensor(s, "bench/pipe", src, cp);
        w[i] = ft_now() - t0;
        t0 = ft_now();
        if (st == FT_OK) st = ft_write_tensor(s, "bench/wire", &rt, &rawp);
        r[i] = ft_now() - t0;
    }
    ft_delete_tensor(s, "bench/pipe");
    ft_delete_tensor(s, "bench/wire");
    ft_free_aligned(raw);
    ft_free_aligned(frame);
    ft_codec_ctx_free(cc);
    if (st != FT_OK) return st;
    qsort(w, (size_t)reps, sizeof w[0], cmp_dbl);
    qsort(e, (size_t)reps, sizeof e[0], cmp_dbl);
    qsort(r, (size_t)reps, sizeof r[0], cmp_dbl);
    out->wall = w[reps / 2];
    out->encode = e[reps / 2];
    out->wire = r[reps / 2];
    return FT_OK;
}

int ft_bench_transfer(int argc, char **argv)
{
    int c;
    long v, depth = 4, iters = 16, perftest_port = 0, reps = 1;
    uint64_t size = 64ull << 20;
    int json = 0, no_perftest = 0;
    const char *token_file = NULL, *pt_host = NULL;
    ft_codec_params cp;
    ft_codec_default_params(&cp);
    cp.codec = FT_CODEC_RAW;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "c:l:n:h", bench_opts, NULL)) != -1) {
        switch (c) {
        case 'z':
            if (ft_cli_parse_size(optarg, &size) || size < 4096 || size > (16ull << 30))
                return ft_cli_usage_error(bench_usage, "--size must be within 4K..16G");
            break;
        case 'c':
            if (ft_codec_parse(optarg, &cp.codec, &cp.entropy))
                return ft_cli_usage_error(bench_usage, "%s", ft_last_error());
            break;
        case 'l':
            if (ft_cli_parse_int(optarg, -100, 22, &v))
                return ft_cli_usage_error(bench_usage, "--level: %s", ft_last_error());
            cp.level = (int)v;
            break;
        case 'D':
            if (ft_cli_parse_int(optarg, 1, 64, &depth))
                return ft_cli_usage_error(bench_usage, "--depth: %s", ft_last_error());
            break;
        case 'n':
            if (ft_cli_parse_int(optarg, 1, 1000000, &iters))
                return ft_cli_usage_error(bench_usage, "--iters: %s", ft_last_error());
            break;
        case 'j': json = 1; break;
        case 't': token_file = optarg; break;
        case 'H': pt_host = optarg; break;
        case 'p':
            if (ft_cli_parse_int(optarg, 1, 65535, &perftest_port))
                return ft_cli_usage_error(bench_usage, "--perftest-port: %s", ft_last_error());
            break;
        case 'N': no_perftest = 1; break;
        case 'R':
            if (ft_cli_parse_int(optarg, 1, 16, &reps))
                return ft_cli_usage_error(bench_usage, "--reps: %s", ft_last_error());
            break;
        case 'h': fputs(bench_usage, stdout); return FT_EXIT_OK;
        default:
            return ft_cli_usage_error(bench_usage, "unknown or incomplete option '%s'",
                                      argv[optind - 1]);
        }
    }
    if (optind + 1 != argc) return ft_cli_usage_error(bench_usage, "bench transfer needs URI");
    const char *uri = argv[optind];

    size_t numel = (size_t)(size / 2);
    int64_t shape[2] = {(int64_t)numel, 1};
    uint32_t ndim = 1;
    if (numel % 4096 == 0) { shape[0] = (int64_t)(numel / 4096); shape[1] = 4096; ndim = 2; }
    uint16_t *data = ft_malloc_aligned(numel * 2, 64);
    ft_tensor *dst = calloc((size_t)depth, sizeof *dst);
    if (!data || !dst) { ft_free_aligned(data); free(dst); return ft_cli_fail("bench", FT_ERR_NOMEM); }
    gauss_bf16(data, numel, 42);
    ft_tensor src;
    ft_tensor_init(&src, FT_BF16, ndim, shape, data);
    int rc = FT_EXIT_ERR;
    for (long i = 0; i < depth; i++) {
        dst[i].dtype = FT_BF16;
        dst[i].data = ft_malloc_aligned(numel * 2, 64);
        if (!dst[i].data) goto out;
    }

    ft_store_params sp;
    ft_store_default_params(&sp);
    sp.token_file = token_file;
    sp.queue_depth = (unsigned)depth;
    ft_store *s = NULL;
    ft_status st = ft_store_open(uri, &sp, &s);
    if (st != FT_OK) { rc = ft_cli_fail(uri, st); goto out; }
    /* ucx_perftest before and after ours (this machine's speed drifts) */
    double pt_mbs[2] = {-1, -1};
    char why[128] = "skipped (--no-perftest)";
    int pt_port = perftest_port ? (int)perftest_port : 20000 + (int)(getpid() % 20000);
    if (!no_perftest)
        pt_mbs[0] = run_perftest(pt_host ? pt_host : "127.0.0.1", pt_port, pt_host == NULL, size,
                                 iters < 8 ? 8 : iters, why, sizeof why);
    /* warm up: create every key once (connection, pool blocks, caches) */
    double wcpu = 0, rcpu = 0;
    double wdt = run_phase(s, 1, &src, dst, numel * 2, &cp, depth, depth, &st, &wcpu);
    ft_tensor_stat ts;
    if (st == FT_OK) st = ft_stat_tensor(s, "bench/0", &ts);
    /* reps rounds of writes then reads: medians (CPU seconds with them) */
    double wt[16], rt[16], wc_[16], rc2[16], rdt = -1;
    for (long k = 0; k < reps && st == FT_OK; k++) {
        wt[k] = run_phase(s, 1, &src, dst, numel * 2, &cp, depth, iters, &st, &wc_[k]);
        rt[k] = st == FT_OK ? run_phase(s, 0, &src, dst, numel * 2, &cp, depth, iters, &st, &rc2[k]) : -1;
    }
    if (st == FT_OK) {
        qsort(wt, (size_t)reps, sizeof wt[0], cmp_dbl);
        qsort(rt, (size_t)reps, sizeof rt[0], cmp_dbl);
        qsort(wc_, (size_t)reps, sizeof wc_[0], cmp_dbl);
        qsort(rc2, (size_t)reps, sizeof rc2[0], cmp_dbl);
        wdt = wt[reps / 2];
        rdt = rt[reps / 2];
        wcpu = wc_[reps / 2];
        rcpu = rc2[reps / 2];
    }
    int lossless = !ft_codec_is_lossy(cp.codec);
    if (st == FT_OK && lossless && memcmp(dst[0].data, data, numel * 2) != 0)
        st = ft_set_error(FT_ERR_CORRUPT, "read back differs from what was written");
    for (long i = 0; i < depth; i++) {
        char key[32];
        snprintf(key, sizeof key, "bench/%ld", i);
        ft_delete_tensor(s, key);
    }
    pipe_times pt = {0, 0, 0};
    if (st == FT_OK && cp.codec != FT_CODEC_RAW)
        st = measure_pipeline(s, &src, &cp, ts.stored_bytes, iters < 3 ? 3 : iters > 9 ? 9 : (int)iters, &pt);
    ft_store_close(s);
    if (st != FT_OK) { rc = ft_cli_fail("bench transfer", st); goto out; }

    double logical = (double)size * (double)iters, wire = (double)ts.stored_bytes * (double)iters;
    double ratio = (double)ts.raw_bytes / (double)ts.stored_bytes;
    /* a remote ucx_perftest server serves one test per run: its keeper
     * (scripts/netlab.sh) restarts it, so give it a moment */
    for (int a = 0; !no_perftest && a < 4 && pt_mbs[1] <= 0; a++) {
        if (a) usleep(500000);
        pt_mbs[1] = run_perftest(pt_host ? pt_host : "127.0.0.1", pt_port, pt_host == NULL, size,
                                 iters < 8 ? 8 : iters, why, sizeof why);
    }
    double pt_gbs = -1;
    if (pt_mbs[0] > 0 && pt_mbs[1] > 0) pt_gbs = (pt_mbs[0] + pt_mbs[1]) / 2 * 1048576.0 / 1e9;
    else if (pt_mbs[0] > 0 || pt_mbs[1] > 0)
        pt_gbs = (pt_mbs[0] > 0 ? pt_mbs[0] : pt_mbs[1]) * 1048576.0 / 1e9;
    double wl = logical / wdt / 1e9, ww = wire / wdt / 1e9;
    double rl = logical / rdt / 1e9, rw = wire / rdt / 1e9;
    /* this process's CPU per GB of tensor bytes: with agent:// the codec
     * work is the agent's, with ucx:// it is ours */
    double wc = wcpu / (logical / 1e9), rc_ = rcpu / (logical / 1e9);
    if (json) {
        printf("{\"uri\":\"%s\",\"size\":%llu,\"codec\":\"%s\",\"depth\":%ld,\"iters\":%ld,"
               "\"ratio\":%.4f,\"write_logical_gbs\":%.4f,\"write_wire_gbs\":%.4f,"
               "\"read_logical_gbs\":%.4f,\"read_wire_gbs\":%.4f,\"write_cpu_s_per_gb\":%.4f,"
               "\"read_cpu_s_per_gb\":%.4f,\"perftest_am_bw_gbs\":",
               uri, (unsigned long long)size, ft_codec_name(cp.codec), depth, iters, ratio,
               wl, ww, rl, rw, wc, rc_);
        if (pt_gbs > 0) printf("%.4f", pt_gbs); else printf("null");
        if (pt.wall > 0)
            printf(",\"pipe_wall_s\":%.6f,\"pipe_encode_s\":%.6f,\"pipe_wire_s\":%.6f", pt.wall,
                   pt.encode, pt.wire);
        printf("}\n");
    } else {
        printf("bench transfer %s: %llu-byte bf16 tensors, codec %s, depth %ld, %ld iters\n",
               uri, (unsigned long long)size, ft_codec_name(cp.codec), depth, iters);
        printf("  ratio %.3f (%llu -> %llu bytes)\n", ratio, (unsigned long long)ts.raw_bytes,
               (unsigned long long)ts.stored_bytes);
        printf("  write  logical %8.3f GB/s   wire %8.3f GB/s   this process %.3f CPU s/GB\n", wl, ww, wc);
        printf("  read   logical %8.3f GB/s   wire %8.3f GB/s   this process %.3f CPU s/GB\n", rl, rw, rc_);
        if (pt_gbs > 0)
            printf("  ucx_perftest ucp_am_bw %.3f GB/s (same size; before %.3f, after %.3f) -> "
                   "write %.0f%%, read %.0f%% (wire)\n", pt_gbs,
                   pt_mbs[0] > 0 ? pt_mbs[0] * 1048576.0 / 1e9 : 0.0,
                   pt_mbs[1] > 0 ? pt_mbs[1] * 1048576.0 / 1e9 : 0.0, 100 * ww / pt_gbs,
                   100 * rw / pt_gbs);
        else
            printf("  ucx_perftest: %s\n", why);
        if (pt.wall > 0) {
            double m = pt.encode > pt.wire ? pt.encode : pt.wire;
            printf("  one write, synchronous: %.1f ms; encode alone %.1f ms, its frame raw "
                   "through the store %.1f ms -> wall / max = %.2f\n", pt.wall * 1e3,
                   pt.encode * 1e3, pt.wire * 1e3, pt.wall / m);
        }
    }
    rc = FT_EXIT_OK;
out:
    for (long i = 0; i < depth; i++) ft_free_aligned(dst[i].data);
    free(dst);
    ft_free_aligned(data);
    return rc;
}
