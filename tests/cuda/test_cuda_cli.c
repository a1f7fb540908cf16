/* `--device cuda` end to end, and the library's answers when CUDA cannot
 * be used. Runs everywhere: without a usable device (or in a build
 * without CUDA) it checks that every entry point and both commands say
 * so clearly (exit 1, "no NVIDIA GPU or driver found (...)" or "this
 * build has no CUDA backend ..."); with a device it runs the commands: greedy
 * text, logits close to the CPU's, streamed weights (raw == resident,
 * q4), the benchmark's JSON, and the offloading combinations the GPU
 * path refuses. */
#include "ft_test.h"
#include "support/cli_run.h"
#include "flextier/cuda.h"
#include "flextier/engine.h"

#include <math.h>
#include <stdarg.h>
#include <sys/wait.h>
#include <unistd.h>

static char tmpdir[256];

static int setup(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/ft_cuda_cli_%d", (int)getpid());
    return ft_sh("rm -rf %s && mkdir -p %s && %s gen-model --arch llama --out %s/m --hidden 64 --layers 3 --heads 4 "
              "--kv-heads 2 --ffn 96 --seed 5 > /dev/null", tmpdir, tmpdir, ft_test_bin(), tmpdir) == 0;
}

static void teardown(void) { ft_sh("rm -rf %s", tmpdir); }

TEST(cuda_unavailable_is_explained)
{
    char why[512];
    if (ft_cuda_available(why, sizeof why) == FT_OK) {
        printf("  a CUDA device is present (%s): the no-device answers are not exercised here\n", why);
        return;
    }
    /* no GPU (or no driver) here, a GPU the runtime cannot use, or no backend */
    const char *expect = !ft_cuda_built() ? "this build has no CUDA backend"
                         : strstr(why, "no usable CUDA device") == why ? "no usable CUDA device (cudaGetDeviceCount: "
                                                                       : "no NVIDIA GPU or driver found (";
    CHECK_MSG(strstr(why, expect) == why, "detail: %s", why);
    CHECK(strstr(ft_last_error(), expect) != NULL);
    REQUIRE(setup());
    char dir[512];
    snprintf(dir, sizeof dir, "%s/m", tmpdir);
    ft_model *m = NULL;
    CHECK_OK(ft_model_load(dir, NULL, &m));
    REQUIRE(m);
    ft_cuda_ctx_params p;
    memset(&p, 0, sizeof p);
    p.max_batch = 1;
    p.max_seq = 8;
    ft_cuda_ctx *c = NULL;
    CHECK(ft_cuda_ctx_create(m, &p, &c) == FT_ERR_UNSUPPORTED && !c);
    CHECK_MSG(strstr(ft_last_error(), expect), "%s", ft_last_error());
    ft_cuda_decoder *d = NULL;
    CHECK(ft_cuda_decoder_create(0, &d) == FT_ERR_UNSUPPORTED && !d);
    ft_cuda_host_weights *hw = NULL;
    ft_cuda_host_weights_params hp = {FT_CODEC_Q4, 0, -1, 1};
    CHECK(ft_cuda_host_weights_create(m, &hp, &hw) == FT_ERR_UNSUPPORTED && !hw);
    ft_model_free(m);

    CHECK(ft_sh("%s run --model %s --prompt hi --max-new-tokens 4 --device cuda > %s/o1 2> %s/e1", ft_test_bin(), dir, tmpdir,
             tmpdir) == 1);
    CHECK(ft_file_has(tmpdir, "e1", "CUDA device: ") && ft_file_has(tmpdir, "e1", expect));
    CHECK(ft_sh("%s bench run --model %s --prompt-len 4 --gen-len 4 --device cuda > %s/o2 2> %s/e2", ft_test_bin(), dir, tmpdir,
             tmpdir) == 1);
    CHECK(ft_file_has(tmpdir, "e2", expect));
    CHECK(ft_sh("%s run --model %s --prompt hi --device tpu > /dev/null 2> %s/e3", ft_test_bin(), dir, tmpdir) == 2);
    CHECK(ft_file_has(tmpdir, "e3", "--device: must be cpu or cuda"));
    CHECK(ft_sh("%s run --model %s --prompt hi --device 2> /dev/null", ft_test_bin(), dir) == 2);
    CHECK(ft_sh("%s run --model %s --prompt hi --max-new-tokens 4 --temperature 0 --device cpu > /dev/null 2>&1", ft_test_bin(),
             dir) == 0);
    CHECK(ft_sh("%s run --help | grep -q -- '--device cpu|cuda'", ft_test_bin()) == 0);
    CHECK(ft_sh("%s bench run --help | grep -q -- '--device cpu|cuda'", ft_test_bin()) == 0);
    teardown();
}

static float *read_floats(const char *name, size_t *n)
{
    char p[512];
    snprintf(p, sizeof p, "%s/%s", tmpdir, name);
    size_t bytes = 0;
    char *s = ft_slurp(p, &bytes);
    *n = bytes / 4;
    return (float *)s;
}

/* max over rows of V of max|a - b| / max(1, max|b|) */
static float rows_err(const float *a, const float *b, size_t n, size_t V)
{
    float worst = 0;
    for (size_t r = 0; r + V <= n; r += V) {
        float mx = 1, md = 0;
        for (size_t i = 0; i < V; i++) {
            mx = fmaxf(mx, fabsf(b[r + i]));
            float d = fabsf(a[r + i] - b[r + i]);
            if (!(d <= md)) md = d;
        }
        if (!(md / mx <= worst)) worst = md / mx;
    }
    return worst;
}

TEST(cuda_cli_end_to_end)
{
    char why[512];
    if (ft_cuda_available(why, sizeof why) != FT_OK) {
        printf("  %s: the end-to-end runs are exercised on a GPU machine\n", why);
        return;
    }
    REQUIRE(setup());
    char dir[512];
    snprintf(dir, sizeof dir, "%s/m", tmpdir);
    const char *pr = "--prompt 'Once upon a time' --max-new-tokens 16 --temperature 0 --ignore-eos";
    CHECK(ft_sh("%s run --model %s %s --device cuda --dump-logits %s/gpu.bin > %s/gpu.txt 2> %s/gpu.err", ft_test_bin(), dir,
             pr, tmpdir, tmpdir, tmpdir) == 0);
    CHECK(ft_file_has(tmpdir, "gpu.txt", "Once upon a time") && ft_file_has(tmpdir, "gpu.err", "weights resident"));
    CHECK(ft_sh("%s run --model %s %s --dump-logits %s/cpu.bin > %s/cpu.txt 2>/dev/null", ft_test_bin(), dir, pr, tmpdir,
             tmpdir) == 0);
    /* gen-model writes bf16 weights: the CPU holds exactly what the GPU
     * holds, so only the GPU's bf16 GEMM inputs differ */
    size_t ng = 0, nc = 0;
    float *lg = read_floats("gpu.bin", &ng), *lc = read_floats("cpu.bin", &nc);
    CHECK(lg && lc && ng == nc && ng > 0 && ng % 320 == 0);
    if (lg && lc && ng == nc) {
        float e = rows_err(lg, lc, ng, 320);
        CHECK_MSG(e <= 6e-2f, "prompt logits: GPU vs CPU row-relative error %g", e);
        printf("  run --device cuda: prompt logits vs the CPU: row-relative error %.3g\n", e);
    }
    /* weights streamed from host memory: raw == resident; q4 runs */
    CHECK(ft_sh("%s run --model %s %s --device cuda --policy w=0,100 --dump-logits %s/raw.bin > /dev/null 2> %s/raw.err",
             ft_test_bin(), dir, pr, tmpdir, tmpdir) == 0);
    CHECK(ft_file_has(tmpdir, "raw.err", "weights host-raw"));
    size_t nr = 0;
    float *lr = read_floats("raw.bin", &nr);
    CHECK(lr && nr == ng && lg && rows_err(lr, lg, nr, 320) <= 1e-5f);
    CHECK(ft_sh("%s run --model %s %s --device cuda --policy w=0,100 --compress-weights q4 > %s/q4.txt 2> %s/q4.err",
             ft_test_bin(), dir, pr, tmpdir, tmpdir) == 0);
    CHECK(ft_file_has(tmpdir, "q4.err", "weights host-q4") && ft_file_has(tmpdir, "q4.txt", "Once upon a time"));
    /* the disk tier through the offloading scheduler, as on the CPU: raw
     * bf16 frames give the resident logits, q4 frames the host-q4 ones
     * (the same quantization, dequantized by the same kernels) */
    CHECK(ft_sh("%s run --model %s %s --device cuda --policy w=0,0,100 --disk-dir %s/disk --dump-logits %s/disk.bin "
             "> /dev/null 2> %s/disk.err", ft_test_bin(), dir, pr, tmpdir, tmpdir, tmpdir) == 0);
    CHECK(ft_file_has(tmpdir, "disk.err", "weights tiers-raw"));
    size_t nd = 0;
    float *ld = read_floats("disk.bin", &nd);
    CHECK(ld && nd == ng && lg && rows_err(ld, lg, nd, 320) <= 1e-5f);
    CHECK(ft_sh("%s run --model %s %s --device cuda --policy w=0,100 --compress-weights q4 --dump-logits %s/hq4.bin "
             "> /dev/null 2>&1", ft_test_bin(), dir, pr, tmpdir) == 0);
    CHECK(ft_sh("%s run --model %s %s --device cuda --policy w=0,0,100 --disk-dir %s/disk4 --compress-weights q4 "
             "--dump-logits %s/dq4.bin > /dev/null 2> %s/dq4.err", ft_test_bin(), dir, pr, tmpdir, tmpdir, tmpdir) == 0);
    CHECK(ft_file_has(tmpdir, "dq4.err", "weights tiers-q4"));
    size_t nh4 = 0, nd4 = 0;
    float *lh4 = read_floats("hq4.bin", &nh4), *ld4 = read_floats("dq4.bin", &nd4);
    CHECK(lh4 && ld4 && nh4 == nd4 && nh4 == ng);
    if (lh4 && ld4 && nh4 == nd4) {
        float e = rows_err(ld4, lh4, nd4, 320);
        CHECK_MSG(e <= 1e-5f, "q4 from disk vs q4 from pinned host memory: row-relative error %g", e);
    }
    free(ld);
    free(lh4);
    free(ld4);
    /* what the GPU path refuses, with the reason */
    CHECK(ft_sh("%s run --model %s --prompt hi --device cuda --policy w=50,50 > /dev/null 2> %s/e1", ft_test_bin(), dir,
             tmpdir) == 1);
    CHECK(ft_file_has(tmpdir, "e1", "weights split between the GPU and other tiers"));
    CHECK(ft_sh("%s run --model %s --prompt hi --device cuda --policy 'w=0,100 c=0,100' > /dev/null 2> %s/e2", ft_test_bin(),
             dir, tmpdir) == 1);
    CHECK(ft_file_has(tmpdir, "e2", "KV cache must be on the device"));
    CHECK(ft_sh("%s run --model %s --prompt hi --device cuda --compress-weights q4 > /dev/null 2> %s/e3", ft_test_bin(), dir,
             tmpdir) == 1);
    CHECK(ft_file_has(tmpdir, "e3", "need --policy"));
    CHECK(ft_sh("%s run --model %s --prompt hi --device cuda --policy auto > /dev/null 2> %s/e4", ft_test_bin(), dir, tmpdir) == 1);
    CHECK(ft_file_has(tmpdir, "e4", "--policy auto"));
    /* --memory bounds the host side of a GPU run: refused before loading
     * with the numbers, or run within it */
    CHECK(ft_sh("%s run --model %s --prompt hi --device cuda --memory 1M > /dev/null 2> %s/e5", ft_test_bin(), dir,
             tmpdir) == 1);
    CHECK(ft_file_has(tmpdir, "e5", "cannot hold what --device cuda keeps in host memory") &&
          ft_file_has(tmpdir, "e5", "the f32 model it uploads"));
    CHECK(ft_sh("%s run --model %s --prompt hi --device cuda --policy w=0,100 --compress-weights q4 --memory 1M "
             "> /dev/null 2> %s/e6", ft_test_bin(), dir, tmpdir) == 1);
    CHECK(ft_file_has(tmpdir, "e6", "pinned copy for streaming"));
    CHECK(ft_sh("%s run --model %s %s --device cuda --memory 4G > /dev/null 2>&1", ft_test_bin(), dir, pr) == 0);
    /* the benchmark */
    CHECK(ft_sh("%s bench run --model %s --batch 4 --prompt-len 8 --gen-len 8 --device cuda --json > %s/b.json 2>/dev/null",
             ft_test_bin(), dir, tmpdir) == 0);
    CHECK(ft_file_has(tmpdir, "b.json", "\"device\":\"cuda\"") && ft_file_has(tmpdir, "b.json", "\"weights\":\"resident\""));
    CHECK(ft_sh("grep -q '\"decode_tok_s\":[1-9]' %s/b.json", tmpdir) == 0);
    CHECK(ft_sh("%s bench run --model %s --batch 2 --prompt-len 8 --gen-len 4 --device cuda --policy w=0,100 "
             "--compress-weights q4 > %s/b.txt 2>/dev/null", ft_test_bin(), dir, tmpdir) == 0);
    CHECK(ft_file_has(tmpdir, "b.txt", "host-q4") && ft_file_has(tmpdir, "b.txt", "overlap efficiency"));
    CHECK(ft_sh("%s bench run --model %s --batch 2 --prompt-len 8 --gen-len 4 --device cuda --policy w=0,100 "
             "--compress-weights q4 --json > %s/bq4.json 2>/dev/null", ft_test_bin(), dir, tmpdir) == 0);
    CHECK(ft_file_has(tmpdir, "bq4.json", "\"copy_s\":") && ft_file_has(tmpdir, "bq4.json", "\"stall_s\":"));
    free(lg);
    free(lc);
    free(lr);
    teardown();
}
