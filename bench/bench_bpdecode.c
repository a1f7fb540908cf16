/* Byte-plane decode, stage by stage (bench/, run by hand):
 *   bench_bpdecode [--chunk SIZE] [--reps N] [--dtype bf16|f16|f32] [--size ELEMENTS]
 *                  [--model DIR_OR_FILE [--tensor NAME]] [--loop SECONDS]
 * Encodes one tensor with the default byte-plane codec (bp-zstd, level 0)
 * and times, over every chunk of the frame, each step the decoder does:
 * entropy decode of the coded planes, the merge (planes -> elements), the
 * chunk hash (XXH3 of the raw bytes, then of the payload), and for scale a
 * memcpy of the raw bytes; then ft_decode_chunk per chunk and ft_decode of
 * the whole frame (one thread). Process CPU time (robust to other load on
 * the machine; one thread) and wall time, medians of --reps.
 * Data: synthetic weights (ft_synth_weights: sigma 0.02 with a per-row
 * scale, rows of 4096), or a tensor of a safetensors checkpoint (--model;
 * default tensor: the largest float one).
 * --loop S: only decode the frame for S seconds (for perf record). */
#include "flextier/codec.h"
#include "flextier/model.h"
#include "codec/codec_internal.h"
#include "codec/byteplane.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#define ZSTD_STATIC_LINKING_ONLY
#include <zstd.h>
#include "bench_util.h"

static double med(double *v, int n)
{
    qsort(v, (size_t)n, sizeof v[0], bench_cmpd);
    return v[n / 2];
}

enum { S_ENTROPY, S_FAST, S_MERGE, S_HASH_RAW, S_HASH_PAYLOAD, S_MEMCPY, S_CHUNK, S_FRAME, S_N };
static const char *stage_name[S_N] = {
    "entropy decode, libzstd", "entropy decode, zstd_lit.c", "merge planes -> elements", "xxh3 raw bytes",
    "xxh3 payload (seeded)", "memcpy raw bytes (scale)", "ft_decode_chunk (all of it)",
    "ft_decode whole frame (1 thr)"};

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"chunk", required_argument, 0, 'k'}, {"reps", required_argument, 0, 'r'},
        {"dtype", required_argument, 0, 'd'}, {"size", required_argument, 0, 'n'},
        {"model", required_argument, 0, 'm'}, {"tensor", required_argument, 0, 't'},
        {"loop", required_argument, 0, 'l'}, {0, 0, 0, 0}};
    uint32_t chunk = FT_DEFAULT_CHUNK_SIZE;
    int reps = 9;
    double loop = 0;
    ft_dtype dt = FT_BF16;
    uint64_t n = 16u << 20;
    const char *model = NULL, *tname = NULL;
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'k': chunk = (uint32_t)strtoul(optarg, NULL, 0); break;
        case 'r': reps = atoi(optarg); break;
        case 'd': if (ft_dtype_parse(optarg, &dt)) { fprintf(stderr, "bad dtype\n"); return 2; } break;
        case 'n': n = strtoull(optarg, NULL, 0); break;
        case 'm': model = optarg; break;
        case 't': tname = optarg; break;
        case 'l': loop = atof(optarg); break;
        default: fprintf(stderr, "see the comment at the top of bench_bpdecode.c\n"); return 2;
        }
    }
    if (reps < 1 || reps > 101) reps = 9;
    ft_tensor t;
    memset(&t, 0, sizeof t);
    ft_checkpoint *ck = NULL;
    char desc[256];
    if (model) {
        if (ft_checkpoint_open(model, &ck)) { fprintf(stderr, "%s: %s\n", model, ft_last_error()); return 1; }
        uint64_t best = 0;
        for (size_t i = 0; i < ft_checkpoint_count(ck); i++) {
            const char *nm = ft_checkpoint_name(ck, i);
            ft_tensor v;
            uint64_t nb;
            if (ft_checkpoint_get(ck, nm, &v) || !ft_dtype_is_float(v.dtype) || ft_tensor_nbytes(&v, &nb)) continue;
            if (tname ? !strcmp(nm, tname) : nb > best) { best = nb; t = v; snprintf(desc, sizeof desc, "%s", nm); }
        }
        if (!t.data) { fprintf(stderr, "no such float tensor\n"); return 1; }
        dt = t.dtype;
    } else {
        size_t es = ft_dtype_bits(dt) / 8;
        int64_t shape[2] = {(int64_t)(n / 4096), 4096};
        n = (uint64_t)shape[0] * 4096;
        ft_tensor_init(&t, dt, 2, shape, ft_malloc_aligned(n * es + 64, 64));
        if (!t.data || ft_synth_weights(dt, n, 4096, 42, t.data)) { fprintf(stderr, "synthetic data\n"); return 1; }
        snprintf(desc, sizeof desc, "synthetic sigma 0.02, per-row scale");
    }
    uint64_t nb;
    ft_tensor_nbytes(&t, &nb);
    ft_codec_params p;
    ft_codec_default_params(&p);
    p.codec = FT_CODEC_BYTEPLANE;
    p.entropy = FT_CODEC_ZSTD;
    p.chunk_size = chunk;
    ft_codec_ctx *ctx;
    if (ft_codec_ctx_create(1, &ctx)) return 1;
    size_t bound = ft_encode_bound(&p, t.dtype, t.ndim, t.shape), fs = 0;
    uint8_t *frame = ft_malloc_aligned(bound, 64), *out = ft_malloc_aligned(nb + 64, 64);
    uint8_t *scratch = ft_malloc_aligned(chunk + 64, 64);
    if (!frame || !out || !scratch || ft_encode(ctx, &p, &t, frame, bound, &fs)) {
        fprintf(stderr, "encode: %s\n", ft_last_error());
        return 1;
    }
    ft_frame_info fi;
    if (ft_frame_parse(frame, fs, &fi)) { fprintf(stderr, "parse: %s\n", ft_last_error()); return 1; }
    ft_tensor d;
    memset(&d, 0, sizeof d);
    d.dtype = t.dtype;
    d.data = out;
    if (loop > 0) {
        double t0 = ft_now();
        long k = 0;
        while (ft_now() - t0 < loop) {
            if (ft_decode(ctx, frame, fs, &d, nb)) { fprintf(stderr, "decode: %s\n", ft_last_error()); return 1; }
            k++;
        }
        printf("%ld decodes, %.3f GB/s wall\n", k, (double)k * (double)nb / (ft_now() - t0) / 1e9);
        return 0;
    }
    ft_layout L;
    ft_layout_compute(&fi, &L);
    unsigned np = ft_bp_nplanes(fi.dtype);
    ft_worker_ws ws;
    memset(&ws, 0, sizeof ws);
    double tc[S_N][101], tw[S_N][101];
    size_t fast_fallback = 0, coded_in = 0, coded_out = 0, stored = 0, nplanes_coded = 0, nplanes_raw = 0, nplanes_const = 0;
    volatile uint64_t sink = 0;
    for (int r = -1; r < reps; r++) {   /* r = -1: warm-up */
        double acc_c[S_N] = {0}, acc_w[S_N] = {0};
        uint64_t pos = fi.header_size;
        for (uint32_t i = 0; i < fi.n_chunks; i++) {
            uint32_t enc, fl;
            uint64_t h, off, cnt;
            ft_frame_entry(frame, &fi, i, &enc, &fl, &h);
            ft_layout_chunk(&L, i, &off, &cnt);
            const uint8_t *pl = frame + pos;
            size_t raw = (size_t)(cnt * L.esize), pn = (size_t)cnt;
            uint8_t *dst = out + off * L.esize;
            pos += enc;
            double c0, w0;
            if (fl & FT_CHUNK_STORED) {
                if (r == 0) stored++;
                continue;
            }
            /* the payload's header: modes, sizes, then the planes */
            unsigned modes = pl[0], ne = 0;
            for (unsigned k = 0; k < np; k++) ne += ((modes >> (2 * k)) & 3) == 1;
            const uint8_t *q = pl + 1 + 4 * ne, *P[4];
            unsigned j = 0;
            c0 = bench_process_cpu(); w0 = ft_now();
            for (unsigned k = 0; k < np; k++) {
                unsigned m = (modes >> (2 * k)) & 3;
                if (m == 0) { P[k] = q; q += pn; if (r == 0) nplanes_raw++; continue; }
                if (m == 2) { memset(scratch + k * pn, q[0], pn); P[k] = scratch + k * pn; q += 1; if (r == 0) nplanes_const++; continue; }
                const uint8_t *s = pl + 1 + 4 * j++;
                size_t len = (size_t)s[0] | (size_t)s[1] << 8 | (size_t)s[2] << 16 | (size_t)s[3] << 24;
                if (ft_entropy_decode(&ws, fi.entropy, q, len, scratch + k * pn, pn)) { fprintf(stderr, "entropy\n"); return 1; }
                P[k] = scratch + k * pn;
                q += len;
                if (r == 0) { coded_in += len; coded_out += pn; nplanes_coded++; }
            }
            acc_c[S_ENTROPY] += bench_process_cpu() - c0; acc_w[S_ENTROPY] += ft_now() - w0;
            /* the same planes with the fast decoder (zstd stage only) */
            q = pl + 1 + 4 * ne;
            j = 0;
            c0 = bench_process_cpu(); w0 = ft_now();
            for (unsigned k = 0; k < np; k++) {
                unsigned m = (modes >> (2 * k)) & 3;
                if (m != 1) { q += m == 0 ? pn : 1; continue; }
                const uint8_t *s = pl + 1 + 4 * j++;
                size_t len = (size_t)s[0] | (size_t)s[1] << 8 | (size_t)s[2] << 16 | (size_t)s[3] << 24;
                if (fi.entropy == FT_CODEC_ZSTD && ft_zstd_lit_decode(&ws, q, len, scratch + k * pn, pn)) {
                    if (r == 0) fast_fallback++;
                    if (ft_entropy_decode(&ws, fi.entropy, q, len, scratch + k * pn, pn)) return 1;
                }
                q += len;
            }
            acc_c[S_FAST] += bench_process_cpu() - c0; acc_w[S_FAST] += ft_now() - w0;
            c0 = bench_process_cpu(); w0 = ft_now();
            ft_bp_merge(fi.dtype, P, pn, dst);
            acc_c[S_MERGE] += bench_process_cpu() - c0; acc_w[S_MERGE] += ft_now() - w0;
            c0 = bench_process_cpu(); w0 = ft_now();
            uint64_t hr = ft_xxh3(dst, raw);
            acc_c[S_HASH_RAW] += bench_process_cpu() - c0; acc_w[S_HASH_RAW] += ft_now() - w0;
            c0 = bench_process_cpu(); w0 = ft_now();
            uint64_t hp = ft_xxh3_seed(pl, enc, hr);
            acc_c[S_HASH_PAYLOAD] += bench_process_cpu() - c0; acc_w[S_HASH_PAYLOAD] += ft_now() - w0;
            if (hp != h) { fprintf(stderr, "hash mismatch chunk %u\n", i); return 1; }
            c0 = bench_process_cpu(); w0 = ft_now();
            memcpy(scratch, dst, raw < chunk ? raw : chunk);
            acc_c[S_MEMCPY] += bench_process_cpu() - c0; acc_w[S_MEMCPY] += ft_now() - w0;
            sink += scratch[0];
            ft_chunk_info ch = {.elem_offset = off, .elem_count = cnt, .raw_offset = off * L.esize,
                                .raw_size = (uint32_t)raw, .enc_offset = (uint64_t)(pl - frame),
                                .enc_size = enc, .flags = fl, .hash = h};
            c0 = bench_process_cpu(); w0 = ft_now();
            if (ft_decode_chunk(ctx, &fi, &ch, pl, fi.dtype, dst, raw, 0)) { fprintf(stderr, "chunk: %s\n", ft_last_error()); return 1; }
            acc_c[S_CHUNK] += bench_process_cpu() - c0; acc_w[S_CHUNK] += ft_now() - w0;
        }
        double c0 = bench_process_cpu(), w0 = ft_now();
        if (ft_decode(ctx, frame, fs, &d, nb)) { fprintf(stderr, "decode: %s\n", ft_last_error()); return 1; }
        acc_c[S_FRAME] = bench_process_cpu() - c0; acc_w[S_FRAME] = ft_now() - w0;
        if (r >= 0)
            for (int s = 0; s < S_N; s++) { tc[s][r] = acc_c[s]; tw[s][r] = acc_w[s]; }
    }
    if (memcmp(out, t.data, nb)) { fprintf(stderr, "MISMATCH\n"); return 1; }
    printf("tensor %s: %s %.1f MB, chunk %u B (%u chunks, %zu stored), frame %.2f%% (ratio %.4f)\n",
           desc, ft_dtype_name(dt), nb / 1e6, chunk, fi.n_chunks, stored, 100.0 * fs / nb, (double)nb / fs);
    printf("planes: %zu coded (%.2f%% of their bytes; %zu left by zstd_lit.c to libzstd), %zu raw, %zu constant\n",
           nplanes_coded, coded_out ? 100.0 * coded_in / coded_out : 0, fast_fallback, nplanes_raw, nplanes_const);
    printf("%-32s %12s %12s %10s %10s\n", "stage (all chunks, 1 thread)", "us/chunk cpu", "us/chunk wall",
           "GB/s cpu", "GB/s wall");
    for (int s = 0; s < S_N; s++) {
        double mc = med(tc[s], reps), mw = med(tw[s], reps);
        printf("%-32s %12.1f %12.1f %10.3f %10.3f\n", stage_name[s], 1e6 * mc / fi.n_chunks,
               1e6 * mw / fi.n_chunks, nb / mc / 1e9, nb / mw / 1e9);
    }
    printf("(GB/s: raw tensor bytes per second of that stage alone; medians of %d)\n", reps);

    ft_ws_release(&ws);
    ft_codec_ctx_free(ctx);
    ft_free_aligned(frame);
    ft_free_aligned(out);
    ft_free_aligned(scratch);
    if (ck) ft_checkpoint_close(ck);
    else ft_free_aligned(t.data);
    (void)sink;
    return 0;
}
