/* Read rate of a file: store's frames as the offloader reads them: the
 * frames in groups (a layer's tensors), each group's reads issued at once
 * (ft_read_frame_async) into one 4 KiB-aligned buffer and all waited,
 * group after group. Drop the page cache first for the disk's rate:
 *
 *   sync; echo 3 > /proc/sys/vm/drop_caches
 *   build/bench/bench_store_read DIR [--group N] [--depth N] [--direct 0|1]
 *                                    [--drop-cache 0|1] [--max-gb G] [--match SUBSTRING]
 *
 * Prints bytes read, seconds, GB/s and this process's CPU seconds per GB
 * (the copy out of the page cache is CPU work; O_DIRECT's is not). */
#include "flextier/store.h"
#include "flextier/core.h"
#include "bench_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s DIR [--group N] [--depth N] [--direct 0|1] [--drop-cache 0|1] [--max-gb G] [--match S]\n",
                argv[0]);
        return 2;
    }
    const char *dir = argv[1];
    int group = 7, depth = 8, direct = -1, drop = 1;
    double max_gb = 1e9;
    const char *match = NULL;
    for (int i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--group")) group = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--depth")) depth = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--direct")) direct = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--drop-cache")) drop = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--max-gb")) max_gb = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--match")) match = argv[i + 1];
        else {
            fprintf(stderr, "unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (group < 1 || depth < 1) {
        fprintf(stderr, "--group and --depth must be positive\n");
        return 2;
    }
    char uri[4200];
    snprintf(uri, sizeof uri, "file:%s", dir);
    ft_store_params sp;
    ft_store_default_params(&sp);
    sp.queue_depth = (unsigned)depth;
    sp.codec_threads = 1;
    sp.drop_cache = drop;
    if (direct >= 0) sp.direct_io = direct;
    ft_store *s = NULL;
    if (ft_store_open(uri, &sp, &s)) {
        fprintf(stderr, "%s: %s\n", uri, ft_last_error());
        return 1;
    }
    char **keys = NULL;
    size_t nk = 0;
    if (ft_list_tensors(s, &keys, &nk) || !nk) {
        fprintf(stderr, "%s: no frames (%s)\n", uri, ft_last_error());
        ft_store_close(s);
        return 1;
    }
    if (match) {   /* only the keys containing it */
        size_t m = 0;
        for (size_t i = 0; i < nk; i++) {
            if (strstr(keys[i], match)) keys[m++] = keys[i];
            else free(keys[i]);
        }
        nk = m;
        if (!nk) {
            fprintf(stderr, "no key contains '%s'\n", match);
            return 1;
        }
    }
    qsort(keys, nk, sizeof *keys, cmp_str);
    uint64_t *sz = calloc(nk, sizeof *sz);
    uint64_t gmax = 0;
    for (size_t i = 0; i < nk; i++) {
        ft_tensor_stat ts;
        if (ft_stat_tensor(s, keys[i], &ts)) {
            fprintf(stderr, "%s: %s\n", keys[i], ft_last_error());
            return 1;
        }
        sz[i] = (ts.stored_bytes + 4095) & ~(uint64_t)4095;
    }
    for (size_t i = 0; i < nk; i += (size_t)group) {
        uint64_t g = 0;
        for (size_t j = i; j < nk && j < i + (size_t)group; j++) g += sz[j];
        if (g > gmax) gmax = g;
    }
    uint8_t *buf = ft_malloc_aligned((size_t)gmax, 4096);
    ft_request **req = calloc((size_t)group, sizeof *req);
    size_t *got = calloc((size_t)group, sizeof *got);
    if (!buf || !req || !got) {
        fprintf(stderr, "no memory for %llu bytes\n", (unsigned long long)gmax);
        return 1;
    }
    uint64_t bytes = 0;
    double t0 = now_s(), c0 = bench_process_cpu();
    int rc = 0;
    for (size_t i = 0; i < nk && !rc && (double)bytes < max_gb * 1e9; i += (size_t)group) {
        size_t off = 0, n = 0;
        for (size_t j = i; j < nk && j < i + (size_t)group; j++, n++) {
            if (ft_read_frame_async(s, keys[j], buf + off, (size_t)sz[j], &got[n], &req[n])) {
                fprintf(stderr, "%s: %s\n", keys[j], ft_last_error());
                rc = 1;
                break;
            }
            off += (size_t)sz[j];
        }
        for (size_t k = 0; k < n; k++) {
            if (ft_request_wait(req[k], -1)) {
                fprintf(stderr, "%s: %s\n", keys[i + k], ft_last_error());
                rc = 1;
            }
            bytes += got[k];
            ft_request_free(req[k]);
        }
    }
    double dt = now_s() - t0, cpu = bench_process_cpu() - c0;
    printf("{\"frames\": %zu, \"group\": %d, \"depth\": %d, \"direct_io\": %d, \"bytes\": %llu, \"s\": %.3f, "
           "\"gb_s\": %.3f, \"cpu_s_per_gb\": %.3f}\n",
           nk, group, depth, sp.direct_io, (unsigned long long)bytes, dt, (double)bytes / dt / 1e9,
           bytes ? cpu / ((double)bytes / 1e9) : 0.0);
    ft_list_free(keys, nk);
    free(sz);
    free(req);
    free(got);
    ft_free_aligned(buf);
    ft_store_close(s);
    return rc;
}
