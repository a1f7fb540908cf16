/* Replays a fuzz corpus without libFuzzer: every file in the directories
 * given, plus deterministic mutations of each (bit flips, truncations,
 * byte overwrites), through LLVMFuzzerTestOneInput. Under ASan/UBSan this
 * turns the corpus into a regression test. FT_REPLAY_MUTATIONS sets the
 * mutations per file (default 200). */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "flextier/core.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static long run_file(const char *path, int mutations)
{
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    if (n < 0 || n > (64 << 20)) { fclose(f); return 0; }
    uint8_t *buf = malloc((size_t)n + 1), *mut = malloc((size_t)n + 1);
    if (!buf || !mut || fread(buf, 1, (size_t)n, f) != (size_t)n) {
        fclose(f); free(buf); free(mut); return 0;
    }
    fclose(f);
    long runs = 0;
    /* exact-size copy so ASan sees reads past the end */
    uint8_t *exact = malloc(n ? (size_t)n : 1);
    memcpy(exact, buf, (size_t)n);
    LLVMFuzzerTestOneInput(exact, (size_t)n);
    free(exact);
    runs++;
    uint64_t seed = (uint64_t)n * 2654435761u;
    for (int m = 0; m < mutations && n > 0; m++) {
        size_t len = (size_t)n;
        memcpy(mut, buf, len);
        uint64_t r = ft_rand_u64(&seed);
        switch (r % 4) {
        case 0: mut[ft_rand_u64(&seed) % len] ^= (uint8_t)(1u << (ft_rand_u64(&seed) % 8)); break;
        case 1: len = ft_rand_u64(&seed) % len; break;
        case 2: mut[ft_rand_u64(&seed) % len] = (uint8_t)ft_rand_u64(&seed); break;
        default:
            for (int k = 0; k < 4; k++) mut[ft_rand_u64(&seed) % len] = (uint8_t)ft_rand_u64(&seed);
        }
        uint8_t *e = malloc(len ? len : 1);
        memcpy(e, mut, len);
        LLVMFuzzerTestOneInput(e, len);
        free(e);
        runs++;
    }
    free(buf);
    free(mut);
    return runs;
}

int main(int argc, char **argv)
{
    const char *m = getenv("FT_REPLAY_MUTATIONS");
    int mutations = m ? atoi(m) : 200;
    long files = 0, runs = 0;
    for (int a = 1; a < argc; a++) {
        struct stat sb;
        if (stat(argv[a], &sb) != 0) { fprintf(stderr, "replay: %s: missing\n", argv[a]); return 1; }
        if (!S_ISDIR(sb.st_mode)) { runs += run_file(argv[a], mutations); files++; continue; }
        DIR *d = opendir(argv[a]);
        struct dirent *e;
        while (d && (e = readdir(d))) {
            if (e->d_name[0] == '.') continue;
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", argv[a], e->d_name);
            runs += run_file(path, mutations);
            files++;
        }
        if (d) closedir(d);
    }
    if (files == 0) { fprintf(stderr, "replay: empty corpus\n"); return 1; }
    printf("replayed %ld files, %ld inputs\n%ld passed, 0 failed\n", files, runs, runs);
    return 0;
}
