/* flextier codec encode|decode|info */
#include "cli.h"

#include <getopt.h>
#include <stdlib.h>
#include <string.h>

static const char codec_usage[] =
    "usage:\n"
    "  flextier codec encode -c CODEC [-l LEVEL] [--group-size G] [--group-dim D]\n"
    "                        [--chunk-size SIZE] [-T THREADS] (--dtype DT [--shape D0,D1,..] | --tensor NAME)\n"
    "                        IN OUT\n"
    "  flextier codec decode [--dtype f32|bf16|f16] [-T THREADS] IN OUT\n"
    "  flextier codec info [--chunks] [--json] FILE\n"
    "\n"
    "CODEC: raw, lz4, zstd, deflate, byteplane (bp) [-zstd|-lz4|-deflate], q8, q4.\n"
    "IN/OUT may be '-' for stdin/stdout. Raw input is little-endian, row-major;\n"
    "without --shape it is one-dimensional. With --tensor NAME, IN is a .safetensors\n"
    "file or a model directory and dtype/shape come from it. Output files are\n"
    "written atomically.\n";

static const struct option enc_opts[] = {
    {"codec", required_argument, 0, 'c'}, {"level", required_argument, 0, 'l'},
    {"group-size", required_argument, 0, 'g'}, {"group-dim", required_argument, 0, 'G'},
    {"chunk-size", required_argument, 0, 'k'}, {"threads", required_argument, 0, 'T'},
    {"dtype", required_argument, 0, 'd'}, {"shape", required_argument, 0, 's'},
    {"chunks", no_argument, 0, 'C'}, {"json", no_argument, 0, 'j'},
    {"tensor", required_argument, 0, 't'},
    {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};

typedef struct {
    ft_codec_params p;
    int have_dtype, have_shape, list_chunks, json;
    long threads;
    ft_dtype dtype;
    uint32_t ndim;
    int64_t shape[FT_MAX_DIMS];
    const char *tensor;
} codec_opts;

/* Returns -1 on success (continue), or an exit code. */
static int parse_opts(int argc, char **argv, codec_opts *o)
{
    int c;
    ft_codec_default_params(&o->p);
    optind = 1;
    opterr = 0;
    const ft_cli_tensor_args ta = {&o->p, &o->dtype, &o->ndim, o->shape, NULL, &o->have_dtype, &o->have_shape};
    while ((c = getopt_long(argc, argv, "c:l:T:h", enc_opts, NULL)) != -1) {
        int r = ft_cli_tensor_opt(c, optarg, &ta);
        if (r < 0) return ft_cli_usage_error(codec_usage, "%s", ft_last_error());
        if (r) continue;
        switch (c) {
        case 'T':
            if (ft_cli_parse_int(optarg, 0, 1024, &o->threads))
                return ft_cli_usage_error(codec_usage, "--threads: %s", ft_last_error());
            break;
        case 'd':
            if (ft_dtype_parse(optarg, &o->dtype))
                return ft_cli_usage_error(codec_usage, "%s", ft_last_error());
            o->have_dtype = 1;
            break;
        case 's':
            if (ft_shape_parse(optarg, &o->ndim, o->shape))
                return ft_cli_usage_error(codec_usage, "%s", ft_last_error());
            o->have_shape = 1;
            break;
        case 't': o->tensor = optarg; break;
        case 'C': o->list_chunks = 1; break;
        case 'j': o->json = 1; break;
        case 'h': fputs(codec_usage, stdout); return FT_EXIT_OK;
        default:
            return ft_cli_usage_error(codec_usage, "unknown or incomplete option '%s'",
                                      argv[optind - 1]);
        }
    }
    return -1;
}

static int do_encode(int argc, char **argv)
{
    codec_opts o = {0};
    int rc = parse_opts(argc, argv, &o);
    if (rc >= 0) return rc;
    if (argc - optind != 2) return ft_cli_usage_error(codec_usage, "encode needs IN and OUT");
    if (!o.have_dtype && !o.tensor) return ft_cli_usage_error(codec_usage, "encode needs --dtype or --tensor");
    if (o.tensor && (o.have_dtype || o.have_shape))
        return ft_cli_usage_error(codec_usage, "--tensor takes dtype and shape from the file");
    const char *in = argv[optind], *outp = argv[optind + 1];
    uint8_t *data = NULL, *frame = NULL;
    size_t size = 0, fsize = 0;
    ft_codec_ctx *ctx = NULL;
    ft_tensor t;
    rc = FT_EXIT_ERR;
    ft_status st;
    if (o.tensor) {
        if ((st = ft_cli_load_st_tensor(in, o.tensor, &t))) { ft_cli_fail("read", st); goto out; }
        uint64_t nb;
        ft_tensor_nbytes(&t, &nb);
        data = t.data;
        size = (size_t)nb;
        o.dtype = t.dtype;
        o.ndim = t.ndim;
        memcpy(o.shape, t.shape, sizeof o.shape);
        o.have_shape = 1;
    } else if ((st = ft_cli_read_file(in, &data, &size))) {
        ft_cli_fail("read", st);
        goto out;
    }
    if (!o.have_shape) {
        unsigned bytes = ft_dtype_bits(o.dtype) / 8;
        if (bytes == 0 || size % bytes) {
            fprintf(stderr, "flextier: %s: %zu bytes is not a whole number of %s elements\n",
                    in, size, ft_dtype_name(o.dtype));
            goto out;
        }
        o.ndim = 1;
        o.shape[0] = (int64_t)(size / bytes);
    }
    if ((st = ft_tensor_init(&t, o.dtype, o.ndim, o.shape, data))) { ft_cli_fail("tensor", st); goto out; }
    uint64_t nbytes;
    ft_tensor_nbytes(&t, &nbytes);
    if (nbytes != size) {
        char sh[128];
        ft_shape_format(o.ndim, o.shape, sh, sizeof sh);
        fprintf(stderr, "flextier: %s has %zu bytes but %s %s needs %llu\n", in, size,
                ft_dtype_name(o.dtype), sh, (unsigned long long)nbytes);
        goto out;
    }
    size_t bound = ft_encode_bound(&o.p, t.dtype, t.ndim, t.shape);
    if (!bound) { ft_cli_fail("encode", ft_set_error(FT_ERR_INVALID_ARG, "%s", ft_last_error())); goto out; }
    if (!(frame = ft_malloc_aligned(bound, 64))) { ft_cli_fail("encode", FT_ERR_NOMEM); goto out; }
    if ((st = ft_codec_ctx_create((unsigned)o.threads, &ctx))) { ft_cli_fail("init", st); goto out; }
    double t0 = ft_now();
    if ((st = ft_encode(ctx, &o.p, &t, frame, bound, &fsize))) { ft_cli_fail("encode", st); goto out; }
    double dt = ft_now() - t0;
    if ((st = ft_cli_write_file(outp, frame, fsize))) { ft_cli_fail("write", st); goto out; }
    if (strcmp(outp, "-"))
        fprintf(stderr, "%s: %zu -> %zu bytes (%.3fx) with %s in %.3f s (%.2f GB/s)\n", outp,
                size, fsize, fsize ? (double)size / (double)fsize : 0.0, ft_codec_name(o.p.codec),
                dt, dt > 0 ? (double)size / dt / 1e9 : 0.0);
    rc = FT_EXIT_OK;
out:
    ft_codec_ctx_free(ctx);
    ft_free_aligned(frame);
    ft_free_aligned(data);
    return rc;
}

static int do_decode(int argc, char **argv)
{
    codec_opts o = {0};
    int rc = parse_opts(argc, argv, &o);
    if (rc >= 0) return rc;
    if (argc - optind != 2) return ft_cli_usage_error(codec_usage, "decode needs IN and OUT");
    const char *in = argv[optind], *outp = argv[optind + 1];
    uint8_t *frame = NULL;
    size_t size = 0;
    ft_codec_ctx *ctx = NULL;
    ft_tensor t = {0};
    rc = FT_EXIT_ERR;
    ft_status st = ft_cli_read_file(in, &frame, &size);
    if (st) { ft_cli_fail("read", st); goto out; }
    if ((st = ft_codec_ctx_create((unsigned)o.threads, &ctx))) { ft_cli_fail("init", st); goto out; }
    if ((st = ft_decode_alloc(ctx, frame, size, o.have_dtype ? (int)o.dtype : -1, &t))) {
        char what[512];
        snprintf(what, sizeof what, "decode %s", in);
        ft_cli_fail(what, st);
        goto out;
    }
    uint64_t nbytes;
    ft_tensor_nbytes(&t, &nbytes);
    if ((st = ft_cli_write_file(outp, t.data, (size_t)nbytes))) { ft_cli_fail("write", st); goto out; }
    rc = FT_EXIT_OK;
out:
    ft_free_aligned(t.data);
    ft_codec_ctx_free(ctx);
    ft_free_aligned(frame);
    return rc;
}

static int do_info(int argc, char **argv)
{
    codec_opts o = {0};
    int rc = parse_opts(argc, argv, &o);
    if (rc >= 0) return rc;
    if (argc - optind != 1) return ft_cli_usage_error(codec_usage, "info needs FILE");
    const char *in = argv[optind];
    uint8_t *frame = NULL;
    size_t size = 0;
    ft_frame_info fi;
    ft_status st = ft_cli_read_file(in, &frame, &size);
    if (st) return ft_cli_fail("read", st);
    if ((st = ft_frame_parse(frame, size, &fi)) || fi.frame_size > size) {
        char what[512];
        snprintf(what, sizeof what, "%s", in);
        if (!st) st = ft_set_error(FT_ERR_CORRUPT, "truncated: %zu of %llu bytes", size,
                                   (unsigned long long)fi.frame_size);
        else if (st == FT_ERR_BUFFER_SMALL) st = ft_set_error(FT_ERR_CORRUPT, "truncated header");
        ft_free_aligned(frame);
        return ft_cli_fail(what, st);
    }
    char sh[192];
    ft_shape_format(fi.ndim, fi.shape, sh, sizeof sh);
    double ratio = fi.frame_size ? (double)fi.raw_size / (double)fi.frame_size : 0;
    char codec[32];
    if (fi.codec == FT_CODEC_BYTEPLANE)
        snprintf(codec, sizeof codec, "byteplane-%s", ft_codec_name(fi.entropy));
    else snprintf(codec, sizeof codec, "%s", ft_codec_name(fi.codec));
    if (o.json) {
        printf("{\"version\": %u, \"codec\": \"%s\", \"level\": %d, \"dtype\": \"%s\", \"shape\": [",
               fi.version, codec, fi.level, ft_dtype_name(fi.dtype));
        for (uint32_t i = 0; i < fi.ndim; i++) printf(i ? ", %lld" : "%lld", (long long)fi.shape[i]);
        printf("], \"raw_bytes\": %llu, \"frame_bytes\": %llu, \"ratio\": %.4f, \"chunks\": %u, "
               "\"chunk_size\": %u, \"group_size\": %u, \"group_dim\": %d, \"checksum\": \"%016llx\"}\n",
               (unsigned long long)fi.raw_size, (unsigned long long)fi.frame_size, ratio, fi.n_chunks,
               fi.chunk_size, fi.group_size, fi.group_dim, (unsigned long long)fi.checksum);
    } else {
        printf("frame:      %s (version %u)\n", in, fi.version);
        printf("codec:      %s", codec);
        if (fi.level) printf(" level %d", fi.level);
        if (ft_codec_is_lossy(fi.codec)) printf(" group %u along dim %d", fi.group_size, fi.group_dim);
        printf("\ntensor:     %s %s, %llu elements\n", ft_dtype_name(fi.dtype), sh,
               (unsigned long long)fi.numel);
        printf("size:       %llu -> %llu bytes (ratio %.3fx, %.2f bits/element)\n",
               (unsigned long long)fi.raw_size, (unsigned long long)fi.frame_size, ratio,
               fi.numel ? 8.0 * (double)fi.frame_size / (double)fi.numel : 0.0);
        printf("chunks:     %u of up to %u raw bytes, header %llu bytes\n", fi.n_chunks,
               fi.chunk_size, (unsigned long long)fi.header_size);
        printf("checksum:   %016llx (XXH3-64 of the chunk hashes)\n", (unsigned long long)fi.checksum);
    }
    if (o.list_chunks && !o.json) {
        printf("%6s %14s %10s %10s %7s %s\n", "chunk", "elem_offset", "raw", "encoded", "ratio", "flags");
        for (uint32_t i = 0; i < fi.n_chunks; i++) {
            ft_chunk_info c;
            ft_frame_chunk(frame, size, &fi, i, &c);
            printf("%6u %14llu %10u %10u %7.3f %s\n", i, (unsigned long long)c.elem_offset,
                   c.raw_size, c.enc_size, c.enc_size ? (double)c.raw_size / c.enc_size : 0.0,
                   (c.flags & FT_CHUNK_STORED) ? "stored" : "");
        }
    }
    ft_free_aligned(frame);
    return FT_EXIT_OK;
}

int ft_cmd_codec(int argc, char **argv)
{
    if (argc < 2) return ft_cli_usage_error(codec_usage, "codec needs a subcommand");
    const char *sub = argv[1];
    if (!strcmp(sub, "encode")) return do_encode(argc - 1, argv + 1);
    if (!strcmp(sub, "decode")) return do_decode(argc - 1, argv + 1);
    if (!strcmp(sub, "info")) return do_info(argc - 1, argv + 1);
    if (!strcmp(sub, "-h") || !strcmp(sub, "--help")) { fputs(codec_usage, stdout); return FT_EXIT_OK; }
    return ft_cli_usage_error(codec_usage, "unknown codec subcommand '%s'", sub);
}
