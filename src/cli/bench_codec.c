/* flextier bench codec: every codec on the same tensor, side by side with
 * the zstd and lz4 command-line benchmarks (zstd -b1, lz4 -b1) run on the
 * same bytes in the same run. Medians of --iters runs. */
#include "cli.h"

#include <getopt.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/wait.h>

static const char bench_codec_usage[] =
    "usage: flextier bench codec [FILE | --synthetic gaussian] [--dtype DT] [--shape D0,D1..]\n"
    "                            [--size N] [-c CODEC[,CODEC..]] [-T THREADS[,THREADS..]]\n"
    "                            [--iters N] [--chunk-size SIZE] [--tensor NAME] [--no-ref] [--json]\n"
    "\n"
    "Encodes and decodes one tensor with each codec and prints ratio, encode and\n"
    "decode GB/s (raw tensor bytes per second, median of --iters runs) per thread\n"
    "count. FILE is raw little-endian data of --dtype (default bf16), or with --tensor\n"
    "NAME a .safetensors file or model directory holding that tensor; without FILE a\n"
    "synthetic Gaussian weight tensor (sigma 0.02, per-row scale) of --size elements\n"
    "(default 16M) in rows of the last --shape dim (default 4096) is used. q8/q4 decode\n"
    "dequantizes to the tensor's dtype. Unless --no-ref, `zstd -b1` and `lz4 -b1` run on\n"
    "the same bytes and the table ends with our speed relative to theirs.\n";

typedef struct {
    char name[32];
    unsigned threads;
    double ratio, enc_gbs, dec_gbs;
    int ok;
} row;

double ft_cli_median(double *v, size_t n)
{
    for (size_t i = 1; i < n; i++)
        for (size_t j = i; j > 0 && v[j - 1] > v[j]; j--) { double t = v[j]; v[j] = v[j - 1]; v[j - 1] = t; }
    return n ? (n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2])) : 0;
}

/* Run `tool -b1 -i<secs> file` and parse "N -> M (xR), C MB/s, D MB/s". */
static int run_ref(const char *tool, const char *file, row *r)
{
    int pipefd[2];
    if (pipe(pipefd)) return -1;
    pid_t pid = fork();
    if (pid < 0) { close(pipefd[0]); close(pipefd[1]); return -1; }
    if (pid == 0) {
        dup2(pipefd[1], 1);
        dup2(pipefd[1], 2);
        close(pipefd[0]);
        close(pipefd[1]);
        execlp(tool, tool, "-b1", "-i3", file, (char *)NULL);
        _exit(127);
    }
    close(pipefd[1]);
    char buf[8192];
    size_t n = 0;
    ssize_t k;
    while ((k = read(pipefd[0], buf + n, sizeof buf - 1 - n)) > 0) {
        n += (size_t)k;
        if (n >= sizeof buf - 1) {   /* keep the tail */
            memmove(buf, buf + n / 2, n - n / 2);
            n -= n / 2;
        }
    }
    close(pipefd[0]);
    int status;
    waitpid(pid, &status, 0);
    buf[n] = '\0';
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return -1;
    /* Find the last "->" line. */
    char *last = NULL, *p = buf;
    while ((p = strstr(p, "->"))) { last = p; p += 2; }
    if (!last) return -1;
    char *start = last;
    while (start > buf && start[-1] != '\r' && start[-1] != '\n') start--;
    unsigned long long in = 0, out = 0;
    char *colon = strrchr(start, ':');
    if (!colon || colon > last) colon = start;
    double c = 0, d = 0, ratio = 0;
    if (sscanf(colon + (*colon == ':'), " %llu -> %llu (%*[x]%lf), %lf MB/s ,%lf", &in, &out, &ratio, &c, &d) < 5 &&
        sscanf(colon + (*colon == ':'), " %llu -> %llu (%lf),%lf MB/s ,%lf", &in, &out, &ratio, &c, &d) < 5)
        return -1;
    snprintf(r->name, sizeof r->name, "%s -b1 (cli)", tool);
    r->threads = 1;
    r->ratio = out ? (double)in / (double)out : 0;
    r->enc_gbs = c * 1e6 / 1e9;   /* MB/s is 10^6 bytes */
    r->dec_gbs = d * 1e6 / 1e9;
    r->ok = 1;
    return 0;
}

static int bench_one(const char *cname, unsigned threads, int iters, uint32_t chunk,
                     const ft_tensor *t, size_t raw, row *r)
{
    ft_codec_params p;
    ft_codec_default_params(&p);
    if (ft_codec_parse(cname, &p.codec, &p.entropy)) return ft_cli_fail(cname, FT_ERR_INVALID_ARG);
    if (chunk) p.chunk_size = chunk;
    snprintf(r->name, sizeof r->name, "%s", cname);
    r->threads = threads;
    size_t bound = ft_encode_bound(&p, t->dtype, t->ndim, t->shape), fsize = 0;
    if (!bound) return ft_cli_fail(cname, FT_ERR_INVALID_ARG);
    uint8_t *frame = ft_malloc_aligned(bound, 64);
    void *out = ft_malloc_aligned(raw ? raw : 64, 64);
    ft_codec_ctx *ctx = NULL;
    double *te = calloc((size_t)iters, sizeof(double)), *td = calloc((size_t)iters, sizeof(double));
    int rc = FT_EXIT_ERR;
    ft_status st = FT_ERR_NOMEM;
    if (!frame || !out || !te || !td || (st = ft_codec_ctx_create(threads, &ctx))) goto done;
    /* warm-up: allocates workspaces, faults pages in */
    if ((st = ft_encode(ctx, &p, t, frame, bound, &fsize))) goto done;
    ft_tensor d = {0};
    d.dtype = t->dtype;
    d.data = out;
    if ((st = ft_decode(ctx, frame, fsize, &d, raw))) goto done;
    if (!ft_codec_is_lossy(p.codec) && memcmp(out, t->data, raw)) {
        st = ft_set_error(FT_ERR_INTERNAL, "round trip mismatch");
        goto done;
    }
    for (int i = 0; i < iters; i++) {
        double t0 = ft_now();
        if ((st = ft_encode(ctx, &p, t, frame, bound, &fsize))) goto done;
        double t1 = ft_now();
        if ((st = ft_decode(ctx, frame, fsize, &d, raw))) goto done;
        double t2 = ft_now();
        te[i] = t1 - t0;
        td[i] = t2 - t1;
    }
    r->ratio = fsize ? (double)raw / (double)fsize : 0;
    r->enc_gbs = (double)raw / ft_cli_median(te, (size_t)iters) / 1e9;
    r->dec_gbs = (double)raw / ft_cli_median(td, (size_t)iters) / 1e9;
    r->ok = 1;
    rc = FT_EXIT_OK;
done:
    if (rc) ft_cli_fail(cname, st);
    ft_codec_ctx_free(ctx);
    free(te);
    free(td);
    ft_free_aligned(frame);
    ft_free_aligned(out);
    return rc;
}

int ft_bench_codec(int argc, char **argv)
{
    static const struct option opts[] = {
        {"synthetic", required_argument, 0, 'S'}, {"dtype", required_argument, 0, 'd'},
        {"shape", required_argument, 0, 's'}, {"size", required_argument, 0, 'n'},
        {"codec", required_argument, 0, 'c'}, {"threads", required_argument, 0, 'T'},
        {"iters", required_argument, 0, 'i'}, {"chunk-size", required_argument, 0, 'k'},
        {"no-ref", no_argument, 0, 'R'}, {"json", no_argument, 0, 'j'},
        {"tensor", required_argument, 0, 't'},
        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    ft_dtype dt = FT_BF16;
    uint32_t ndim = 0;
    int64_t shape[FT_MAX_DIMS];
    uint64_t nelem = 16u << 20, chunk = 0;
    const char *codecs = NULL, *threads_s = "1";
    long iters = 5;
    int json = 0, ref = 1, have_shape = 0, have_size = 0;
    const char *tensor = NULL;
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "c:T:h", opts, NULL)) != -1) {
        switch (c) {
        case 'S':
            if (strcmp(optarg, "gaussian"))
                return ft_cli_usage_error(bench_codec_usage, "unknown synthetic data '%s' (gaussian)", optarg);
            break;
        case 'd':
            if (ft_dtype_parse(optarg, &dt)) return ft_cli_usage_error(bench_codec_usage, "%s", ft_last_error());
            break;
        case 's':
            if (ft_shape_parse(optarg, &ndim, shape) || ndim == 0)
                return ft_cli_usage_error(bench_codec_usage, "bad --shape '%s'", optarg);
            have_shape = 1;
            break;
        case 'n':
            if (ft_cli_parse_size(optarg, &nelem) || nelem == 0)
                return ft_cli_usage_error(bench_codec_usage, "bad --size '%s'", optarg);
            have_size = 1;
            break;
        case 'c': codecs = optarg; break;
        case 'T': threads_s = optarg; break;
        case 'i':
            if (ft_cli_parse_int(optarg, 1, 1000, &iters))
                return ft_cli_usage_error(bench_codec_usage, "--iters: %s", ft_last_error());
            break;
        case 'k':
            if (ft_cli_parse_size(optarg, &chunk) || chunk < FT_MIN_CHUNK_SIZE || chunk > FT_MAX_CHUNK_SIZE)
                return ft_cli_usage_error(bench_codec_usage, "--chunk-size must be within 4K..64M");
            break;
        case 't': tensor = optarg; break;
        case 'R': ref = 0; break;
        case 'j': json = 1; break;
        case 'h': fputs(bench_codec_usage, stdout); return FT_EXIT_OK;
        default:
            return ft_cli_usage_error(bench_codec_usage, "unknown or incomplete option '%s'", argv[optind - 1]);
        }
    }
    if (argc - optind > 1) return ft_cli_usage_error(bench_codec_usage, "at most one FILE");
    const char *file = argc - optind == 1 ? argv[optind] : NULL;
    if (ft_dtype_bits(dt) < 8) return ft_cli_usage_error(bench_codec_usage, "--dtype must be a byte type");
    uint8_t *data = NULL;
    size_t raw = 0;
    int rc = FT_EXIT_ERR;
    char tmpl[] = "/tmp/flextier-bench-XXXXXX";
    int tmpfd = -1;
    row *rows = NULL;
    size_t nrows = 0;
    if (tensor && !file) return ft_cli_usage_error(bench_codec_usage, "--tensor needs FILE");
    if (tensor) {
        ft_tensor st_t;
        ft_status st = ft_cli_load_st_tensor(file, tensor, &st_t);
        if (st) return ft_cli_fail("read", st);
        if (ft_dtype_bits(st_t.dtype) < 8) { ft_free_aligned(st_t.data); return ft_cli_fail("read", FT_ERR_UNSUPPORTED); }
        data = st_t.data;
        dt = st_t.dtype;
        ndim = st_t.ndim;
        memcpy(shape, st_t.shape, sizeof shape);
        if (ndim == 0) { ndim = 1; shape[0] = 1; }
        uint64_t nb;
        ft_tensor_nbytes(&st_t, &nb);
        raw = (size_t)nb;
        nelem = raw / (ft_dtype_bits(dt) / 8);
    } else if (file) {
        ft_status st = ft_cli_read_file(file, &data, &raw);
        if (st) return ft_cli_fail("read", st);
        size_t es = ft_dtype_bits(dt) / 8;
        if (raw % es) {
            fprintf(stderr, "flextier: %s: %zu bytes is not a whole number of %s elements\n", file, raw, ft_dtype_name(dt));
            goto out;
        }
        nelem = raw / es;
        if (!have_shape) { ndim = 1; shape[0] = (int64_t)nelem; }
    } else {
        if (!ft_dtype_is_float(dt)) return ft_cli_usage_error(bench_codec_usage, "synthetic data needs a float dtype");
        if (!have_shape) {
            ndim = 2;
            shape[1] = 4096;
            shape[0] = (int64_t)((nelem + 4095) / 4096);
        } else if (!have_size) {
            uint64_t n;
            ft_shape_numel(ndim, shape, &n);
            nelem = n;
        }
        if (ndim == 2 && !have_shape) nelem = (uint64_t)shape[0] * 4096;
        raw = (size_t)ft_dtype_nbytes(dt, nelem);
        data = ft_malloc_aligned(raw, 64);
        if (!data) { ft_cli_fail("allocate", FT_ERR_NOMEM); goto out; }
        ft_synth_weights(dt, nelem, (uint64_t)shape[ndim - 1], 1234, data);
    }
    ft_tensor t;
    if (ft_tensor_init(&t, dt, ndim, shape, data)) { ft_cli_fail("tensor", FT_ERR_INVALID_ARG); goto out; }
    uint64_t nb;
    ft_tensor_nbytes(&t, &nb);
    if (nb != raw) {
        fprintf(stderr, "flextier: --shape does not match %zu bytes of %s\n", raw, ft_dtype_name(dt));
        rc = FT_EXIT_USAGE;
        goto out;
    }
    const char *defaults = ft_dtype_is_float(dt)
        ? "raw,lz4,zstd,deflate,bp-zstd,bp-lz4,bp-deflate,q8,q4" : "raw,lz4,zstd,deflate";
    char *clist = strdup(codecs ? codecs : defaults), *tlist = strdup(threads_s);
    size_t ncodec = 1, nthr = 1;
    for (char *q = clist; *q; q++) ncodec += *q == ',';
    for (char *q = tlist; *q; q++) nthr += *q == ',';
    rows = calloc(ncodec * nthr + 2, sizeof *rows);
    unsigned thr[64];
    size_t nt = 0;
    for (char *save = NULL, *tok = strtok_r(tlist, ",", &save); tok && nt < 64; tok = strtok_r(NULL, ",", &save)) {
        long v;
        if (ft_cli_parse_int(tok, 1, 1024, &v)) {
            free(clist); free(tlist);
            rc = ft_cli_usage_error(bench_codec_usage, "--threads: %s", ft_last_error());
            goto out;
        }
        thr[nt++] = (unsigned)v;
    }
    if (!json) {
        char sh[128], sz[32];
        ft_shape_format(ndim, shape, sh, sizeof sh);
        ft_cli_fmt_bytes((double)raw, sz, sizeof sz);
        printf("tensor: %s %s (%s) from %s; median of %ld runs; GB/s of raw tensor bytes\n",
               ft_dtype_name(dt), sh, sz, file ? file : "synthetic gaussian (sigma 0.02, per-row scale)", iters);
        printf("%-18s %7s %8s %10s %10s\n", "codec", "threads", "ratio", "enc GB/s", "dec GB/s");
        fflush(stdout);
    }
    for (char *save = NULL, *tok = strtok_r(clist, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
        for (size_t k = 0; k < nt; k++) {
            row *r = &rows[nrows++];
            if (bench_one(tok, thr[k], (int)iters, (uint32_t)chunk, &t, raw, r)) {
                free(clist); free(tlist);
                goto out;
            }
            if (!json) {
                printf("%-18s %7u %8.3f %10.3f %10.3f\n", r->name, r->threads, r->ratio, r->enc_gbs, r->dec_gbs);
                fflush(stdout);
            }
        }
    free(clist);
    free(tlist);
    size_t nours = nrows;
    if (ref) {
        tmpfd = mkstemp(tmpl);
        if (tmpfd < 0 || write(tmpfd, data, raw) != (ssize_t)raw) {
            fprintf(stderr, "flextier: cannot write a temp file for the reference tools\n");
        } else {
            static const char *tools[] = {"zstd", "lz4"};
            for (int k = 0; k < 2; k++) {
                row *r = &rows[nrows];
                if (run_ref(tools[k], tmpl, r) == 0) {
                    nrows++;
                    if (!json) printf("%-18s %7u %8.3f %10.3f %10.3f\n", r->name, r->threads, r->ratio, r->enc_gbs, r->dec_gbs);
                } else if (!json) {
                    printf("%-18s (not available: install the %s command)\n", tools[k], tools[k]);
                }
            }
        }
    }
    if (json) {
        printf("{\"dtype\": \"%s\", \"bytes\": %zu, \"iters\": %ld, \"rows\": [", ft_dtype_name(dt), raw, iters);
        for (size_t i = 0; i < nrows; i++)
            printf("%s{\"codec\": \"%s\", \"threads\": %u, \"ratio\": %.4f, \"encode_gbs\": %.4f, \"decode_gbs\": %.4f, \"reference\": %s}",
                   i ? ", " : "", rows[i].name, rows[i].threads, rows[i].ratio, rows[i].enc_gbs, rows[i].dec_gbs,
                   i >= nours ? "true" : "false");
        printf("]}\n");
    } else {
        /* Relative to the reference CLI measured in this run (zstd -b1;
         * lz4 -b1 for lz4): ours / theirs, one thread each. Absolute GB/s
         * depend on the machine, these ratios much less. */
        const row *zref = NULL, *lref = NULL;
        for (size_t i = nours; i < nrows; i++) {
            if (!strncmp(rows[i].name, "zstd", 4)) zref = &rows[i];
            if (!strncmp(rows[i].name, "lz4", 3)) lref = &rows[i];
        }
        if (zref || lref) printf("\nrelative to the reference CLI in this run (ours / theirs, 1 thread):\n");
        for (size_t k = 0; k < nours; k++) {
            const row *r = !strcmp(rows[k].name, "lz4") ? lref : zref;
            if (!r || rows[k].threads != 1 || r->ratio <= 0 || r->enc_gbs <= 0 || r->dec_gbs <= 0) continue;
            printf("  %-12s vs %-16s ratio %5.2fx  encode %5.2fx  decode %5.2fx\n", rows[k].name, r->name,
                   rows[k].ratio / r->ratio, rows[k].enc_gbs / r->enc_gbs, rows[k].dec_gbs / r->dec_gbs);
        }
    }
    rc = FT_EXIT_OK;
out:
    if (tmpfd >= 0) { close(tmpfd); unlink(tmpl); }
    free(rows);
    ft_free_aligned(data);
    return rc;
}
