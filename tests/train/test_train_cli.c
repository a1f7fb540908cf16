/* flextier finetune and run --lora (src/cli/cmd_finetune.c) on the tiny
 * Llama fixture: a run writes a PEFT adapter that run --lora loads, equal
 * seeds give identical adapters, and bad data / hyper-parameters get
 * clear errors. */
#include "ft_test.h"
#include "support/cli_run.h"
#include "support/fixture.h"

#include <json-c/json.h>
#include <stdio.h>
#include <string.h>

static char model[1024], opt[1024], moe[1024];
static const char *tmp;

static void setup(void)
{
    if (tmp) return;
    tmp = ft_test_tmpdir("train_cli");
    ft_fixture_dir("models", "llama-tiny", model, sizeof model);
    ft_fixture_dir("models", "opt-tiny", opt, sizeof opt);
    ft_fixture_dir("models", "mixtral-tiny", moe, sizeof moe);
    char path[1200];
    snprintf(path, sizeof path, "%s/data.txt", tmp);
    FILE *f = fopen(path, "w");
    for (int i = 0; f && i < 40; i++)
        fprintf(f, "The quick brown fox jumps over the lazy dog. Hello world %d, hello again.\n", i);
    if (f) fclose(f);
    snprintf(path, sizeof path, "%s/data.jsonl", tmp);
    f = fopen(path, "w");
    for (int i = 0; f && i < 30; i++) fprintf(f, "{\"text\": \"FlexTier streams weights through tiers, %d.\"}\n", i);
    if (f) fclose(f);
    snprintf(path, sizeof path, "%s/bad.jsonl", tmp);
    f = fopen(path, "w");
    if (f) { fputs("{\"text\": \"ok\"}\n{\"txt\": 1}\n", f); fclose(f); }
    snprintf(path, sizeof path, "%s/chat.jsonl", tmp);
    f = fopen(path, "w");
    if (f) { fputs("{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}\n", f); fclose(f); }
    snprintf(path, sizeof path, "%s/short.txt", tmp);
    f = fopen(path, "w");
    if (f) { fputs("Hello.\n", f); fclose(f); }
}

#define FT_ARGS "--steps 3 --seq-len 16 --batch 2 --grad-accum 2 --warmup 1 --lr 1e-2"

/* mpirun -n 1, 2, 3 --data-parallel mpi: the same losses and adapter
 * bytes as one process without MPI (when the CLI has MPI and mpirun exists) */
TEST(finetune_data_parallel_mpirun)
{
    setup();
    if (ft_sh("command -v mpirun >/dev/null && %s finetune --help | grep -q 'MPI: built in'", ft_test_bin()) != 0) {
        printf("  skip: no mpirun, or a CLI without MPI\n");
        CHECK(ft_sh("%s finetune --model %s --data %s/data.txt --out %s/dpx --data-parallel mpi > %s/dpx.out 2>&1",
                    ft_test_bin(), model, tmp, tmp, tmp) != 0);
        return;
    }
/* with lora_dropout: its masks follow the global micro-batch, not the process */
#define DP_ARGS \
    "--steps 3 --seq-len 16 --batch 1 --grad-accum 6 --warmup 1 --lr 1e-2 --threads 1 --eval-frac 0.2 --dropout 0.2"
#define MPIRUN "mpirun --allow-run-as-root --oversubscribe --mca btl self,tcp --mca pml ob1"
    CHECK(ft_sh("%s finetune --model %s --data %s/data.txt --out %s/dp0 " DP_ARGS
                " | grep -o 'step [0-9/]* loss [0-9.]*\\|held-out after.*' > %s/dp0.txt", ft_test_bin(), model, tmp, tmp,
                tmp) == 0);
    CHECK(ft_file_has(tmp, "dp0.txt", "step 3/3 loss"));
    CHECK(ft_file_has(tmp, "dp0/adapter_config.json", "\"lora_dropout\":0.2"));
    for (int n = 1; n <= 3; n++) {
        CHECK_MSG(ft_sh(MPIRUN " -n %d %s finetune --model %s --data %s/data.txt --out %s/dp%d " DP_ARGS
                        " --data-parallel mpi > %s/dp%d.out 2>&1", n, ft_test_bin(), model, tmp, tmp, n, tmp, n) == 0,
                  "mpirun -n %d failed", n);
        CHECK_MSG(ft_sh("grep -o 'step [0-9/]* loss [0-9.]*\\|held-out after.*' %s/dp%d.out | cmp -s - %s/dp0.txt",
                        tmp, n, tmp) == 0, "mpirun -n %d: other losses", n);
        CHECK_MSG(ft_sh("cmp -s %s/dp0/adapter_model.safetensors %s/dp%d/adapter_model.safetensors", tmp, tmp, n) == 0,
                  "mpirun -n %d: another adapter", n);
    }
    /* two ranks streaming their layers from one disk directory and saving
     * their activations there: the same run */
    CHECK(ft_sh(MPIRUN " -n 2 %s finetune --model %s --data %s/data.txt --out %s/dps " DP_ARGS
                " --data-parallel mpi --policy w=0,0,100 --disk-dir %s/dps-disk --activations disk > %s/dps.out 2>&1",
                ft_test_bin(), model, tmp, tmp, tmp, tmp) == 0);
    CHECK(ft_sh("grep -o 'step [0-9/]* loss [0-9.]*\\|held-out after.*' %s/dps.out | cmp -s - %s/dp0.txt", tmp, tmp) == 0);
    CHECK(ft_sh("cmp -s %s/dp0/adapter_model.safetensors %s/dps/adapter_model.safetensors", tmp, tmp) == 0);
    CHECK(ft_file_has(tmp, "dps.out", "offload: "));
    /* more processes than micro-batches, an unknown mode */
    CHECK(ft_sh(MPIRUN " -n 2 %s finetune --model %s --data %s/data.txt --out %s/dpy --grad-accum 1 --data-parallel mpi "
                "> %s/dpy.out 2>&1", ft_test_bin(), model, tmp, tmp, tmp) != 0);
    CHECK(ft_file_has(tmp, "dpy.out", "--grad-accum 1 < 2 processes"));
    CHECK(ft_sh("%s finetune --model %s --data %s/data.txt --out %s/dpz --data-parallel ucx > %s/dpz.out 2>&1",
                ft_test_bin(), model, tmp, tmp, tmp) == 2);
    CHECK(ft_file_has(tmp, "dpz.out", "only mpi"));
}

/* OPT: its PEFT names in the adapter, run --lora through learned positions */
TEST(finetune_opt)
{
    setup();
    CHECK(ft_sh("%s finetune --model %s --data %s/data.txt --out %s/opt --targets q_proj,out_proj,fc1,fc2 " FT_ARGS
                " > %s/opt.out 2>&1", ft_test_bin(), opt, tmp, tmp, tmp) == 0);
    CHECK(ft_file_has(tmp, "opt.out", "step 3/3 loss"));
    CHECK(ft_file_has(tmp, "opt/adapter_config.json", "\"fc1\""));
    CHECK(ft_sh("%s run --model %s --lora %s/opt --prompt 'Hello world' --max-new-tokens 4 --ids > %s/optgen 2>&1",
                ft_test_bin(), opt, tmp, tmp) == 0);
}

TEST(finetune_then_run_lora)
{
    setup();
    CHECK(ft_sh("%s finetune --model %s --data %s/data.txt --out %s/ad " FT_ARGS " > %s/out 2>&1", ft_test_bin(), model,
                tmp, tmp, tmp) == 0);
    CHECK(ft_file_has(tmp, "out", "step 3/3 loss"));
    CHECK(ft_file_has(tmp, "out", "tok/s"));
    CHECK(ft_file_has(tmp, "out", "held-out after: loss"));
    CHECK(ft_file_has(tmp, "ad/adapter_config.json", "\"peft_type\":\"LORA\""));
    CHECK(ft_sh("%s run --model %s --lora %s/ad --prompt 'Hello world' --max-new-tokens 5 --ids --ignore-eos "
                "--temperature 0 > %s/gen 2>&1",
                ft_test_bin(), model, tmp, tmp) == 0);
    size_t n = 0;
    char p[1200];
    snprintf(p, sizeof p, "%s/gen", tmp);
    char *g = ft_slurp(p, &n);
    int k = 0;
    for (char *s = g; s && *s; s++) k += *s == ' ';
    CHECK_MSG(g && k == 4, "run --lora printed '%s'", g ? g : "");
    free(g);
    /* merged into the model: the same greedy ids without --lora */
    CHECK(ft_sh("%s export --model %s --merge-lora %s/ad --out %s/merged > %s/exp 2>&1", ft_test_bin(), model, tmp,
                tmp, tmp) == 0);
    CHECK(ft_file_has(tmp, "exp", "merged 1 adapter"));
    CHECK(ft_sh("%s run --model %s --lora %s/ad --prompt 'Hello world' --max-new-tokens 8 --ids --ignore-eos "
                "--temperature 0 --kv-dtype f32 > %s/gen3 2>&1", ft_test_bin(), model, tmp, tmp) == 0);
    CHECK(ft_sh("%s run --model %s/merged --prompt 'Hello world' --max-new-tokens 8 --ids --ignore-eos "
                "--temperature 0 --kv-dtype f32 > %s/gen2 2>&1 && cmp -s %s/gen3 %s/gen2", ft_test_bin(), tmp, tmp,
                tmp, tmp) == 0);
    /* the same seed: the same adapter, byte for byte; JSONL data */
    CHECK(ft_sh("%s finetune --model %s --data %s/data.txt --out %s/ad2 " FT_ARGS " > /dev/null 2>&1", ft_test_bin(),
                model, tmp, tmp) == 0);
    CHECK(ft_sh("cmp -s %s/ad/adapter_model.safetensors %s/ad2/adapter_model.safetensors", tmp, tmp) == 0);
    CHECK(ft_sh("%s finetune --model %s --data %s/data.jsonl --out %s/ad3 " FT_ARGS " --seed 3 > %s/out3 2>&1",
                ft_test_bin(), model, tmp, tmp, tmp) == 0);
    CHECK(ft_file_has(tmp, "out3", "step 3/3"));
    CHECK(ft_sh("cmp -s %s/ad/adapter_model.safetensors %s/ad3/adapter_model.safetensors", tmp, tmp) != 0);
    /* --init continues from an adapter */
    CHECK(ft_sh("%s finetune --model %s --data %s/data.txt --out %s/ad4 --init %s/ad " FT_ARGS " > /dev/null 2>&1",
                ft_test_bin(), model, tmp, tmp, tmp) == 0);
}

/* interrupted twice (--stop-after) and resumed: the same adapter, byte for byte */
TEST(resume_equals_uninterrupted)
{
    setup();
    const char *b = ft_test_bin();
    CHECK(ft_sh("%s finetune --model %s --data %s/data.txt --out %s/full " FT_ARGS " --steps 5 > /dev/null 2>&1", b,
                model, tmp, tmp) == 0);
    CHECK(ft_sh("%s finetune --model %s --data %s/data.txt --out %s/part " FT_ARGS " --steps 5 --stop-after 2 "
                "> %s/r1 2>&1", b, model, tmp, tmp, tmp) == 0);
    CHECK(ft_file_has(tmp, "r1", "continue with --resume"));
    CHECK(ft_sh("%s finetune --model %s --data %s/data.txt --out %s/part --resume %s/part " FT_ARGS " --steps 5 "
                "--stop-after 2 > /dev/null 2>&1", b, model, tmp, tmp, tmp) == 0);
    CHECK(ft_sh("%s finetune --model %s --data %s/data.txt --out %s/part --resume %s/part " FT_ARGS " --steps 5 "
                "> %s/r3 2>&1", b, model, tmp, tmp, tmp, tmp) == 0);
    CHECK(ft_file_has(tmp, "r3", "resumed from"));
    CHECK(ft_sh("cmp -s %s/full/adapter_model.safetensors %s/part/adapter_model.safetensors", tmp, tmp) == 0);
    /* other options than the saved run's are refused */
    CHECK(ft_sh("%s finetune --model %s --data %s/data.txt --out %s/part --resume %s/part " FT_ARGS " --steps 5 "
                "--batch 3 > %s/r4 2>&1", b, model, tmp, tmp, tmp, tmp) == 1);
    CHECK(ft_file_has(tmp, "r4", "batch differs"));
}

/* chat JSONL rendered with a template: trains on the assistant turns */
TEST(finetune_chat_messages)
{
    setup();
    char cdir[1024];
    ft_fixture_dir("lora", "chat", cdir, sizeof cdir);
    CHECK(ft_sh("%s finetune --model %s --data %s/chat.jsonl --chat-template %s/template.jinja --out %s/chat "
                "--steps 3 --seq-len 16 --batch 2 --lr 1e-2 > %s/cout 2>&1", ft_test_bin(), model, cdir, cdir, tmp,
                tmp) == 0);
    CHECK(ft_file_has(tmp, "cout", "chat data: 73 of 227 tokens in assistant turns"));
    CHECK(ft_file_has(tmp, "cout", "step 3/3 loss"));
    CHECK(ft_file_has(tmp, "chat/adapter_config.json", "\"peft_type\":\"LORA\""));
}

/* run --lora (and export --merge-lora, then run) with PEFT's final adapter
 * gives transformers + peft's greedy tokens (tests/data/lora/NAME/run.json) */
static void run_lora_peft(const char *fixture, const char *name, int merge)
{
    setup();
    char dir[1024], path[1200], ids[512] = "", want[512] = "", mdir[1024];
    ft_fixture_dir("lora", fixture, dir, sizeof dir);
    ft_fixture_dir("models", name, mdir, sizeof mdir);
    snprintf(path, sizeof path, "%s/run.json", dir);
    json_object *run = json_object_from_file(path);
    REQUIRE(run);
    json_object *p = json_object_object_get(run, "prompt"), *g = json_object_object_get(run, "greedy");
    for (size_t i = 0; i < json_object_array_length(p); i++)
        snprintf(ids + strlen(ids), sizeof ids - strlen(ids), "%s%d", i ? "," : "",
                 json_object_get_int(json_object_array_get_idx(p, i)));
    for (size_t i = 0; i < json_object_array_length(g); i++)
        snprintf(want + strlen(want), sizeof want - strlen(want), "%s%d", i ? " " : "",
                 json_object_get_int(json_object_array_get_idx(g, i)));
    CHECK(ft_sh("%s run --model %s --lora %s/final --prompt-ids %s --max-new-tokens %zu --temperature 0 "
                "> %s/peft_gen 2>&1",
                ft_test_bin(), mdir, dir, ids, json_object_array_length(g), tmp) == 0);
    CHECK_MSG(ft_file_has(tmp, "peft_gen", want), "%s: run --lora does not give %s", fixture, want);
    if (merge) {
        CHECK(ft_sh("rm -rf %s/pm && %s export --model %s --merge-lora %s/final --out %s/pm > %s/pm.out 2>&1 && %s run "
                    "--model %s/pm --prompt-ids %s --max-new-tokens %zu --temperature 0 > %s/peft_gen 2>&1", tmp,
                    ft_test_bin(), mdir, dir, tmp, tmp, ft_test_bin(), tmp, ids, json_object_array_length(g),
                    tmp) == 0);
        CHECK_MSG(ft_file_has(tmp, "peft_gen", want), "%s: the merged model does not give %s", fixture, want);
    }
    json_object_put(run);
}

TEST(run_lora_matches_peft_greedy) { run_lora_peft("llama-tiny", "llama-tiny", 0); }
/* LoRA on the experts (PEFT's target_parameters on transformers 5's fused
 * gate_up_proj / down_proj), unmerged and merged into the per-expert weights */
TEST(run_lora_matches_peft_greedy_experts)
{
    run_lora_peft("mixtral-tiny-experts", "mixtral-tiny", 1);
    run_lora_peft("qwen3moe-tiny-experts", "qwen3moe-tiny", 1);
    run_lora_peft("olmoe-tiny-experts", "olmoe-tiny", 1);
}

/* finetune on a mixture of experts (all: attention and experts), then run
 * --lora; merged, the same greedy ids */
TEST(finetune_moe_experts)
{
    setup();
    CHECK(ft_sh("%s finetune --model %s --data %s/data.txt --out %s/moe " FT_ARGS " > %s/mout 2>&1", ft_test_bin(), moe,
                tmp, tmp, tmp) == 0);
    CHECK(ft_file_has(tmp, "mout", "step 3/3 loss"));
    CHECK(ft_file_has(tmp, "moe/adapter_config.json", "\"target_parameters\""));
    CHECK(ft_file_has(tmp, "moe/adapter_config.json", "\"gate_up_proj\""));
    CHECK(ft_sh("%s run --model %s --lora %s/moe --prompt 'Hello world' --max-new-tokens 8 --ids --ignore-eos "
                "--temperature 0 --kv-dtype f32 > %s/mg1 2>&1", ft_test_bin(), moe, tmp, tmp) == 0);
    CHECK(ft_sh("%s run --model %s --prompt 'Hello world' --max-new-tokens 8 --ids --ignore-eos "
                "--temperature 0 --kv-dtype f32 > %s/mg0 2>&1", ft_test_bin(), moe, tmp) == 0);
    CHECK(ft_sh("%s export --model %s --merge-lora %s/moe --out %s/moem > /dev/null 2>&1", ft_test_bin(), moe, tmp,
                tmp) == 0);
    CHECK(ft_sh("%s run --model %s/moem --prompt 'Hello world' --max-new-tokens 8 --ids --ignore-eos "
                "--temperature 0 --kv-dtype f32 > %s/mg2 2>&1 && cmp -s %s/mg1 %s/mg2", ft_test_bin(), tmp, tmp, tmp,
                tmp) == 0);
    /* --init from it continues (target_parameters read back) */
    CHECK(ft_sh("%s finetune --model %s --data %s/data.txt --out %s/moe2 --init %s/moe " FT_ARGS " > /dev/null 2>&1",
                ft_test_bin(), moe, tmp, tmp, tmp) == 0);
}

/* A random 5-layer Llama (more layers than the scheduler's two slot
 * buffers: the backward's reads run downwards) */
static char deep[1200];
static int make_deep(void)
{
    if (deep[0]) return 1;
    snprintf(deep, sizeof deep, "%s/deep", tmp);
    return ft_sh("%s gen-model --arch llama --out %s --hidden 64 --layers 5 --heads 4 --kv-heads 2 --ffn 128 "
                 "--vocab 320 --seed 7 --threads 1 > /dev/null 2>&1", ft_test_bin(), deep) == 0;
}

#define DEEP_ARGS "--steps 3 --seq-len 24 --batch 2 --grad-accum 2 --warmup 1 --lr 1e-2 --seed 5 --eval-frac 0"

/* the same run in memory and with every layer streamed from the disk tier
 * (bf16 as stored, and q4): the same adapter, byte for byte */
TEST(streamed_equals_in_memory)
{
    setup();
    CHECK(make_deep());
    const char *fmts[] = {"bf16", "q4"};
    for (int f = 0; f < 2; f++) {
        CHECK(ft_sh("%s finetune --model %s --data %s/data.txt --out %s/m-%s --weights-dtype %s " DEEP_ARGS
                    " > %s/o-m 2>&1", ft_test_bin(), deep, tmp, tmp, fmts[f], fmts[f], tmp) == 0);
        CHECK(ft_sh("%s finetune --model %s --data %s/data.txt --out %s/s-%s --weights-dtype %s " DEEP_ARGS
                    " --policy w=0,0,100 --disk-dir %s/disk-%s > %s/o-s 2>&1", ft_test_bin(), deep, tmp, tmp, fmts[f],
                    fmts[f], tmp, fmts[f], tmp) == 0);
        /* 3 steps x 2 micro-batches over 5 layers with two slot buffers:
         * 5 reads for the first forward, then 3 per pass each way (the two
         * layers at the turn are still in the slots): 5 + 3 + 5 x 6 */
        CHECK(ft_file_has(tmp, "o-s", "offload: 38 layer fetches"));
        CHECK_MSG(ft_sh("cmp -s %s/m-%s/adapter_model.safetensors %s/s-%s/adapter_model.safetensors", tmp, fmts[f],
                        tmp, fmts[f]) == 0, "%s: the streamed run's adapter differs", fmts[f]);
    }
    /* a third of the layers resident, the rest on disk; a memory budget */
    CHECK(ft_sh("%s finetune --model %s --data %s/data.txt --out %s/s-mix --weights-dtype q4 " DEEP_ARGS
                " --policy w=40,0,60 --disk-dir %s/disk-q4 --memory 256M > %s/o-x 2>&1", ft_test_bin(), deep, tmp, tmp,
                tmp, tmp) == 0);
    CHECK(ft_sh("cmp -s %s/m-q4/adapter_model.safetensors %s/s-mix/adapter_model.safetensors", tmp, tmp) == 0);
    CHECK(ft_file_has(tmp, "o-x", "memory: budget 256.0 MiB"));
}

/* saved activations (mem, disk; lossless) give recompute's adapter byte
 * for byte; q8 trains (a little differently) and says so */
/* a mixture of experts whose experts the scheduler streams on demand
 * (policy w=0,0,100), with saved activations: the in-memory adapter */
TEST(moe_streamed_equals_in_memory)
{
    setup();
    CHECK(ft_sh("%s finetune --model %s --data %s/data.txt --out %s/moe-m " FT_ARGS " > %s/moe-m.out 2>&1",
                ft_test_bin(), moe, tmp, tmp, tmp) == 0);
    CHECK(ft_sh("%s finetune --model %s --data %s/data.txt --out %s/moe-s " FT_ARGS " --policy w=0,0,100 --disk-dir "
                "%s/moe-disk --activations disk > %s/moe-s.out 2>&1", ft_test_bin(), moe, tmp, tmp, tmp, tmp) == 0);
    CHECK(ft_file_has(tmp, "moe-s.out", "offload: "));
    CHECK(ft_file_has(tmp, "moe-s.out", "activations: saved to file:"));
    CHECK_MSG(ft_sh("cmp -s %s/moe-m/adapter_model.safetensors %s/moe-s/adapter_model.safetensors", tmp, tmp) == 0,
              "the streamed MoE run's adapter differs");
}

TEST(saved_activations_equal_recompute)
{
    setup();
    CHECK(make_deep());
    CHECK(ft_sh("%s finetune --model %s --data %s/data.txt --out %s/r " DEEP_ARGS " > %s/o-r 2>&1", ft_test_bin(), deep,
                tmp, tmp, tmp) == 0);
    CHECK(ft_sh("%s finetune --model %s --data %s/data.txt --out %s/am " DEEP_ARGS " --activations mem > %s/o-am 2>&1",
                ft_test_bin(), deep, tmp, tmp, tmp) == 0);
    CHECK(ft_file_has(tmp, "o-am", "activations: saved to mem: (lossless)"));
    CHECK(ft_sh("cmp -s %s/r/adapter_model.safetensors %s/am/adapter_model.safetensors", tmp, tmp) == 0);
    CHECK(ft_sh("%s finetune --model %s --data %s/data.txt --out %s/ad " DEEP_ARGS " --activations disk --disk-dir "
                "%s/actd --activations-codec raw > %s/o-ad 2>&1", ft_test_bin(), deep, tmp, tmp, tmp, tmp) == 0);
    CHECK(ft_sh("cmp -s %s/r/adapter_model.safetensors %s/ad/adapter_model.safetensors", tmp, tmp) == 0);
    /* nothing left behind in the directory */
    CHECK(ft_sh("test -z \"$(find %s/actd -type f)\"", tmp) == 0);
    /* weights streamed and activations on disk together */
    CHECK(ft_sh("%s finetune --model %s --data %s/data.txt --out %s/as " DEEP_ARGS " --activations disk --policy "
                "w=0,0,100 --disk-dir %s/both > %s/o-as 2>&1", ft_test_bin(), deep, tmp, tmp, tmp, tmp) == 0);
    CHECK(ft_sh("cmp -s %s/r/adapter_model.safetensors %s/as/adapter_model.safetensors", tmp, tmp) == 0);
    CHECK(ft_sh("%s finetune --model %s --data %s/data.txt --out %s/aq " DEEP_ARGS " --activations mem "
                "--activations-codec q8 > %s/o-aq 2>&1", ft_test_bin(), deep, tmp, tmp, tmp) == 0);
    CHECK(ft_file_has(tmp, "o-aq", "(q8)"));
    CHECK(ft_file_has(tmp, "o-aq", "step 3/3 loss"));
    CHECK(ft_sh("cmp -s %s/r/adapter_model.safetensors %s/aq/adapter_model.safetensors", tmp, tmp) != 0);
    /* lora_dropout: the backward makes the forward's masks again, saved or recomputed */
    CHECK(ft_sh("%s finetune --model %s --data %s/data.txt --out %s/dr " DEEP_ARGS " --dropout 0.3 > %s/o-dr 2>&1",
                ft_test_bin(), deep, tmp, tmp, tmp) == 0);
    CHECK(ft_sh("%s finetune --model %s --data %s/data.txt --out %s/dm " DEEP_ARGS " --dropout 0.3 --activations mem "
                "> %s/o-dm 2>&1", ft_test_bin(), deep, tmp, tmp, tmp) == 0);
    CHECK(ft_sh("cmp -s %s/dr/adapter_model.safetensors %s/dm/adapter_model.safetensors", tmp, tmp) == 0);
    CHECK(ft_sh("cmp -s %s/r/adapter_model.safetensors %s/dr/adapter_model.safetensors", tmp, tmp) != 0);
}

static void fails(int want_rc, const char *args, const char *needle)
{
    int rc = ft_sh("%s %s > %s/err 2>&1", ft_test_bin(), args, tmp);
    CHECK_MSG(rc == want_rc, "'%s' exited %d, want %d", args, rc, want_rc);
    CHECK_MSG(ft_file_has(tmp, "err", needle), "'%s' does not say '%s'", args, needle);
}

TEST(finetune_errors)
{
    setup();
    char a[4096];
    snprintf(a, sizeof a, "finetune --model %s --data %s/short.txt --out %s/x", model, tmp, tmp);
    fails(1, a, "too few");
    snprintf(a, sizeof a, "finetune --model %s --data %s/bad.jsonl --out %s/x", model, tmp, tmp);
    fails(1, a, "line 2");
    snprintf(a, sizeof a, "finetune --model %s --data %s/chat.jsonl --out %s/x", model, tmp, tmp);
    fails(1, a, "assistant");
    char cdir[1024];
    ft_fixture_dir("lora", "chat", cdir, sizeof cdir);
    snprintf(a, sizeof a, "finetune --model %s --data %s/chat.jsonl --out %s/x", model, cdir, tmp);
    fails(1, a, "--chat-template");
    snprintf(a, sizeof a, "finetune --model %s --data %s/chat.jsonl --out %s/x --chat-template %s/none.jinja", model,
             cdir, tmp, tmp);
    fails(1, a, "none.jinja");
    snprintf(a, sizeof a, "finetune --model %s --data %s/nonexistent --out %s/x", model, tmp, tmp);
    fails(1, a, "nonexistent");
    snprintf(a, sizeof a, "finetune --model %s --data %s/data.txt --out %s/x --rank 0", model, tmp, tmp);
    fails(2, a, "--rank");
    snprintf(a, sizeof a, "finetune --model %s --data %s/data.txt --out %s/x --lr -1", model, tmp, tmp);
    fails(2, a, "--lr");
    snprintf(a, sizeof a, "finetune --model %s --data %s/data.txt --out %s/x --targets q_proj,fc3", model, tmp, tmp);
    fails(2, a, "fc3");
    snprintf(a, sizeof a, "finetune --model %s --data %s/data.txt --out %s/x --targets q_proj,fc1", model, tmp, tmp);
    fails(1, a, "fc1 is an OPT module name");
    snprintf(a, sizeof a, "finetune --model %s --data %s/data.txt --out %s/x --dropout 1", model, tmp, tmp);
    fails(2, a, "--dropout");
    snprintf(a, sizeof a, "finetune --model %s --data %s/data.txt --out %s/x --warmup 500 --steps 10", model, tmp, tmp);
    fails(2, a, "warmup");
    snprintf(a, sizeof a, "finetune --model %s --data %s/data.txt --out %s/x --targets q_proj,up_proj", moe, tmp, tmp);
    fails(1, a, "one fused parameter, gate_up_proj");
    snprintf(a, sizeof a, "finetune --model %s --data %s/data.txt --out %s/x --dropout 0.1", moe, tmp, tmp);
    fails(1, a, "target_parameters have no dropout");
    snprintf(a, sizeof a, "finetune --model %s --data %s/data.txt --out %s/x --targets experts.down_proj", model, tmp,
             tmp);
    fails(1, a, "mixture-of-experts module name");
    snprintf(a, sizeof a, "finetune --model %s --data %s/data.txt --out %s/x --targets q_proj,o_proj", opt, tmp, tmp);
    fails(1, a, "OPT has no module o_proj");
    snprintf(a, sizeof a, "finetune --model %s --data %s/data.txt", model, tmp);
    fails(2, a, "required");
    snprintf(a, sizeof a, "run --model %s --lora %s/ad --prompt hi --device cuda", model, tmp);
    fails(1, a, "CPU backend only");
    snprintf(a, sizeof a, "run --model %s --lora %s/ad:inf --prompt hi", model, tmp);
    fails(2, a, "finite");
    snprintf(a, sizeof a, "run --model %s --lora %s/ad --prompt hi --pipeline local:2", model, tmp);
    fails(1, a, "pipeline");
    snprintf(a, sizeof a, "export --model %s --out %s/merged", model, tmp);
    fails(2, a, "--merge-lora");
    snprintf(a, sizeof a, "export --model %s --merge-lora %s/ad --out %s/merged --dtype q4", model, tmp, tmp);
    fails(2, a, "--dtype");
    snprintf(a, sizeof a, "export --model %s --merge-lora %s/nonexistent --out %s/merged", model, tmp, tmp);
    fails(1, a, "adapter_config.json");
    snprintf(a, sizeof a, "finetune --model %s --data %s/data.txt --out %s/x --activations disk", model, tmp, tmp);
    fails(2, a, "--disk-dir");
    snprintf(a, sizeof a, "finetune --model %s --data %s/data.txt --out %s/x --activations remote", model, tmp, tmp);
    fails(2, a, "--remote");
    snprintf(a, sizeof a, "finetune --model %s --data %s/data.txt --out %s/x --activations gpu", model, tmp, tmp);
    fails(2, a, "recompute, mem, disk or remote");
    snprintf(a, sizeof a, "finetune --model %s --data %s/data.txt --out %s/x --activations-codec q8", model, tmp, tmp);
    fails(2, a, "needs saved activations");
    snprintf(a, sizeof a, "finetune --model %s --data %s/data.txt --out %s/x --activations mem --activations-codec q2",
             model, tmp, tmp);
    fails(2, a, "lossless, raw or q8");
    snprintf(a, sizeof a, "finetune --model %s --data %s/data.txt --out %s/x --device cuda", model, tmp, tmp);
    fails(2, a, "not implemented for finetune");
    snprintf(a, sizeof a, "finetune --model %s --data %s/data.txt --out %s/x --policy w=0,0,100", model, tmp, tmp);
    fails(1, a, "disk");
    snprintf(a, sizeof a, "finetune --model %s --data %s/data.txt --out %s/x --memory 1M", model, tmp, tmp);
    fails(1, a, "memory budget");
    snprintf(a, sizeof a, "finetune --model %s --data %s/data.txt --out %s/x --lora %s/ad", model, tmp, tmp, tmp);
    fails(2, a, "--init DIR");
    snprintf(a, sizeof a, "run --model %s --lora %s/nonexistent --prompt hi", model, tmp);
    fails(1, a, "adapter_config.json");
}
