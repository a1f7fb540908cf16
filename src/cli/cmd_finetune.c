/* flextier finetune: LoRA fine-tuning of a model directory on a text or
 * JSONL file (the train layer, docs/training.md); and flextier run --lora
 * (greedy generation with a PEFT adapter applied, unmerged). */
#include "cli.h"
#include "pipe_mpi.h"
#include "session_opts.h"
#include "train_dp.h"
#include "flextier/engine.h"
#include "flextier/model.h"
#include "flextier/offload.h"
#include "flextier/session.h"
#include "flextier/train.h"

#include <json-c/json.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

static const char FT_USAGE[] =
    "usage: flextier finetune --model DIR --data FILE --out DIR [--steps N] [options]\n"
    "LoRA fine-tuning (llama, mistral, qwen2, qwen3, phi3, gemma2/3, opt, and mixtral, qwen3_moe,\n"
    "olmoe on their attention and experts; base weights frozen in their stored format).\n"
    "Data: plain text, or JSONL (.jsonl) with one {\"text\": ...} or {\"messages\": [...]} object per\n"
    "line (chat: rendered with the model's chat template or --chat-template FILE, the loss\n"
    "on the assistant turns only); tokenized,\n"
    "packed into sequences of --seq-len tokens; the last --eval-frac of them are held out\n"
    "(loss and perplexity before and after). Writes a PEFT adapter (adapter_config.json +\n"
    "adapter_model.safetensors) that peft.PeftModel.from_pretrained and `flextier run --lora` load.\n"
    "  --steps N           optimizer steps (default 100)\n"
    "  --lr X              peak learning rate (default 1e-3)\n"
    "  --rank R            LoRA rank (default 8)       --alpha A   lora_alpha (default 16)\n"
    "  --targets LIST      q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj or all (default);\n"
    "                      OPT: out_proj,fc1,fc2 for o/up/down; phi3: qkv_proj,gate_up_proj;\n"
    "                      mixtral/qwen3_moe/olmoe: q/k/v/o_proj and the experts' gate_up_proj,down_proj\n"
    "  --seq-len N         tokens per sequence (default 128, at most the model's context)\n"
    "  --batch B           sequences per micro-batch (default 4)\n"
    "  --grad-accum N      micro-batches per step (default 1)\n"
    "  --warmup N          linear warmup steps (default steps / 10)\n"
    "  --schedule S        cosine (default), linear, constant\n"
    "  --weight-decay X    AdamW decoupled weight decay (default 0.01)\n"
    "  --clip X            max global gradient norm, 0 = off (default 1.0)\n"
    "  --seed N            adapter init and data order (default 0): equal seeds, equal runs\n"
    "  --eval-frac X       held-out fraction of the sequences (default 0.1; 0 = none)\n"
    "  --init DIR          start from this PEFT adapter instead of a fresh one\n"
    "  --chat-template F   the Jinja chat template for {\"messages\"} lines (default: the model's)\n"
    "  --weights-dtype F   the frozen weights: auto (as stored), f32, bf16, q8, q4\n"
    "  --activations A     what the backward pass reads: recompute (default: each layer's\n"
    "                      forward again from its saved input), or the activations saved by\n"
    "                      the forward with write_tensor to mem (this process), disk (--disk-dir)\n"
    "                      or remote (--remote: a memory node)\n"
    "  --activations-codec C  saved activations' encoding: lossless (byte-plane, default: the\n"
    "                      results equal recompute's bit for bit), raw, or q8 (lossy)\n"
    "  --dropout X         lora_dropout in [0, 1) (default 0): PEFT's dropout on the adapters'\n"
    "                      input, its masks a function of the seed, step and position\n"
    "  --threads N         worker threads (default: every core; results do not depend on it)\n"
    "  --save-every N      also write the adapter and the training state (AdamW moments,\n"
    "                      step: trainer_state.safetensors + .json) to --out every N steps\n"
    "  --stop-after N      stop after N steps of this run (writing the state), to resume later\n"
    "  --resume DIR        continue the run whose state is in DIR (same data and options):\n"
    "                      the result equals the uninterrupted run's bit for bit\n"
    "  --data-parallel mpi under `mpirun -n N`: each process computes grad-accum / N of the\n"
    "                      step's micro-batches (--grad-accum >= N); the gradients are summed\n"
    "                      in micro-batch order, so any N gives the one-process run bit for\n"
    "                      bit; rank 0 prints, evaluates and writes --out\n"
    "Base weights through the tiers: the offloading options of `flextier run` (--policy,\n"
    "--disk-dir, --remote, --compress-weights, --memory, --expert-cache, ...): the forward streams\n"
    "the layers upwards, the backward downwards, each reading the next layer ahead; the results\n"
    "equal the in-memory run's for the same stored format. --memory counts the trainer's working\n"
    "memory (the embeddings and LM head stay in memory).\n";

static uint64_t mix(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static void shuffle(long *perm, long n, uint64_t seed, long epoch)
{
    uint64_t s = seed * 0x100000001B3ull + (uint64_t)epoch;
    for (long i = 0; i < n; i++) perm[i] = i;
    for (long i = n - 1; i > 0; i--) {
        long j = (long)(mix(&s) % (uint64_t)(i + 1));
        long t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
}

static ft_status evaluate(ft_trainer *t, const int32_t *seqs, const uint8_t *mask, long n, long T, long batch,
                          double *loss, double *ppl)
{
    double sum = 0.0;
    int64_t cnt = 0;
    for (long i = 0; i < n; i += batch) {
        long nb = n - i < batch ? n - i : batch;
        double s;
        int64_t c;
        ft_status st = ft_trainer_eval_masked(t, seqs + (size_t)i * (size_t)T, mask ? mask + (size_t)i * (size_t)T : NULL,
                                              (int)nb, (int)T, &s, &c);
        if (st) return st;
        sum += s;
        cnt += c;
    }
    if (!cnt) return ft_set_error(FT_ERR_INVALID_ARG, "eval: the held-out sequences have no labelled token");
    *loss = sum / (double)cnt;
    *ppl = exp(*loss);
    return FT_OK;
}

static int parse_float(const char *v, double lo, double hi, double *out)
{
    char *e;
    double d = strtod(v, &e);
    if (e == v || *e || !isfinite(d) || d < lo || d > hi) return -1;
    *out = d;
    return 0;
}

typedef struct run_id { long steps, seq, batch, accum, seed, ntrain, ntok; } run_id;

static ft_status save_all(ft_trainer *t, const char *outdir, const char *model, const run_id *r)
{
    ft_status st = ft_trainer_save_adapter(t, outdir, model);
    if (st) return st;
    char path[4096];
    snprintf(path, sizeof path, "%s/trainer_state.safetensors", outdir);
    if ((st = ft_trainer_save_state(t, path))) return st;
    char js[512];
    int n = snprintf(js, sizeof js, "{\"step\": %d, \"steps\": %ld, \"seq_len\": %ld, \"batch\": %ld, "
                     "\"grad_accum\": %ld, \"seed\": %ld, \"train_sequences\": %ld, \"tokens\": %ld}\n",
                     ft_trainer_steps(t), r->steps, r->seq, r->batch, r->accum, r->seed, r->ntrain, r->ntok);
    snprintf(path, sizeof path, "%s/trainer_state.json", outdir);
    return ft_cli_write_file(path, js, (size_t)n);
}

/* check DIR/trainer_state.json against this run; load the state */
static ft_status resume(ft_trainer *t, const char *dir, const run_id *r)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/trainer_state.json", dir);
    json_object *o = json_object_from_file(path);
    if (!o || !json_object_is_type(o, json_type_object)) {
        if (o) json_object_put(o);
        return ft_set_error(FT_ERR_NOT_FOUND, "resume: cannot read %s (a --save-every/--stop-after output?)", path);
    }
    static const char *const keys[] = {"steps", "seq_len", "batch", "grad_accum", "seed", "train_sequences", "tokens"};
    const long want[] = {r->steps, r->seq, r->batch, r->accum, r->seed, r->ntrain, r->ntok};
    ft_status st = FT_OK;
    for (int i = 0; i < 7 && !st; i++) {
        json_object *v;
        if (!json_object_object_get_ex(o, keys[i], &v) || !json_object_is_type(v, json_type_int) ||
            json_object_get_int64(v) != want[i])
            st = ft_set_error(FT_ERR_INVALID_ARG, "resume: %s: %s differs from this run's %ld (resume with the same "
                              "data and options)", path, keys[i], want[i]);
    }
    json_object_put(o);
    if (st) return st;
    snprintf(path, sizeof path, "%s/trainer_state.safetensors", dir);
    return ft_trainer_load_state(t, path);
}

static void fmt_eta(double s, char *buf, size_t n)
{
    long t = (long)(s + 0.5);
    snprintf(buf, n, "%02ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
}

int ft_cmd_finetune(int argc, char **argv)
{
    const char *dir = NULL, *data = NULL, *outdir = NULL, *init = NULL, *targets = "all", *sched = "cosine";
    const char *resume_dir = NULL, *chat_template = NULL, *dpmode = NULL;
    long save_every = 0, stop_after = 0, threads = 0;
    long steps = 100, rank = 8, seq = 128, batch = 4, accum = 1, warmup = -1, seed = 0;
    double lr = 1e-3, alpha = 16, wd = 0.01, clip = 1.0, evalf = 0.1, dropout = 0.0;
    const char *acts = "recompute", *act_codec = "lossless";
    ft_cli_session so;
    ft_cli_session_init(&so);
    ft_cli_dp dpo;
    ft_cli_dp_init(&dpo);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(FT_USAGE, stdout);
            printf("  (this build: %s)\n", ft_cli_mpi_built() ? "MPI: built in" : "MPI: not built in (libopenmpi-dev)");
            fputs(ft_cli_dp_usage, stdout);
            fputs(ft_cli_offload_usage, stdout);
            return FT_EXIT_OK;
        }
        int dr = ft_cli_dp_arg(&dpo, FT_USAGE, argc, argv, &i);
        if (dr) {
            if (dr < 0) return FT_EXIT_USAGE;
            continue;
        }
        if (!strcmp(a, "--kv-dtype") || !strcmp(a, "--compress-cache") || !strcmp(a, "--device") ||
            !strcmp(a, "--decode-threads"))
            return ft_cli_usage_error(FT_USAGE, "%s is not implemented for finetune (no KV cache; the CPU)", a);
        if (!strcmp(a, "--lora"))
            return ft_cli_usage_error(FT_USAGE, "--lora applies adapters at inference (run, chat, server); finetune "
                                      "starts from one with --init DIR");
        int r = ft_cli_session_arg(&so, argc, argv, &i);
        if (r < 0) return FT_EXIT_USAGE;
        if (r > 0) continue;
        if (i + 1 >= argc) return ft_cli_usage_error(FT_USAGE, "option %s needs a value", a);
        const char *v = argv[++i];
        long *li = NULL, lo = 1, hi = 1 << 30;
        double *fd = NULL, flo = 0.0, fhi = 1e9;
        if (!strcmp(a, "--model")) dir = v;
        else if (!strcmp(a, "--data")) data = v;
        else if (!strcmp(a, "--out")) outdir = v;
        else if (!strcmp(a, "--init")) init = v;
        else if (!strcmp(a, "--chat-template")) chat_template = v;
        else if (!strcmp(a, "--resume")) resume_dir = v;
        else if (!strcmp(a, "--data-parallel")) dpmode = v;
        else if (!strcmp(a, "--save-every")) li = &save_every;
        else if (!strcmp(a, "--stop-after")) li = &stop_after;
        else if (!strcmp(a, "--threads")) { li = &threads; lo = 0; hi = 1024; }
        else if (!strcmp(a, "--targets")) targets = v;
        else if (!strcmp(a, "--schedule")) sched = v;
        else if (!strcmp(a, "--steps")) li = &steps;
        else if (!strcmp(a, "--rank")) { li = &rank; hi = 4096; }
        else if (!strcmp(a, "--seq-len")) { li = &seq; lo = 2; hi = 1 << 20; }
        else if (!strcmp(a, "--batch")) { li = &batch; hi = 4096; }
        else if (!strcmp(a, "--grad-accum")) { li = &accum; hi = 65536; }
        else if (!strcmp(a, "--warmup")) { li = &warmup; lo = 0; }
        else if (!strcmp(a, "--seed")) { li = &seed; lo = 0; hi = 0x7fffffff; }
        else if (!strcmp(a, "--lr")) { fd = &lr; flo = 1e-12; fhi = 10.0; }
        else if (!strcmp(a, "--alpha")) { fd = &alpha; flo = 1e-6; fhi = 1e6; }
        else if (!strcmp(a, "--weight-decay")) { fd = &wd; fhi = 10.0; }
        else if (!strcmp(a, "--clip")) fd = &clip;
        else if (!strcmp(a, "--eval-frac")) { fd = &evalf; fhi = 0.9; }
        else if (!strcmp(a, "--dropout")) { fd = &dropout; fhi = 0.99; }
        else if (!strcmp(a, "--activations")) acts = v;
        else if (!strcmp(a, "--activations-codec")) act_codec = v;
        else return ft_cli_usage_error(FT_USAGE, "unknown option %s", a);
        if (li && ft_cli_parse_int(v, lo, hi, li))
            return ft_cli_usage_error(FT_USAGE, "bad value for %s: %s (an integer in [%ld, %ld])", a, v, lo, hi);
        if (fd && parse_float(v, flo, fhi, fd))
            return ft_cli_usage_error(FT_USAGE, "bad value for %s: %s (a number in [%g, %g])", a, v, flo, fhi);
    }
    if (!dir || !data || !outdir) return ft_cli_usage_error(FT_USAGE, "--model, --data and --out are required");
    if (init && resume_dir) return ft_cli_usage_error(FT_USAGE, "--init and --resume exclude each other");
    if (warmup < 0) warmup = steps / 10;
    if (warmup > steps) return ft_cli_usage_error(FT_USAGE, "--warmup %ld is more than --steps %ld", warmup, steps);
    if (ft_cli_dp_check(&dpo, FT_USAGE, dpmode, accum)) return FT_EXIT_USAGE;
    const int mpi = dpmode && !dpo.tcp;

    ft_train_params tp;
    ft_train_params_default(&tp);
    ft_status st;
    if ((st = ft_lora_parse_targets(targets, &tp.targets))) return ft_cli_usage_error(FT_USAGE, "%s", ft_last_error());
    if (!strcmp(sched, "cosine")) tp.schedule = FT_SCHED_COSINE;
    else if (!strcmp(sched, "linear")) tp.schedule = FT_SCHED_LINEAR;
    else if (!strcmp(sched, "constant")) tp.schedule = FT_SCHED_CONSTANT;
    else return ft_cli_usage_error(FT_USAGE, "--schedule %s: expected cosine, linear or constant", sched);
    tp.rank = (int)rank;
    tp.alpha = (float)alpha;
    tp.dropout = (float)dropout;
    tp.lr = (float)lr;
    tp.weight_decay = (float)wd;
    tp.clip = (float)clip;
    tp.warmup = (int)warmup;
    tp.total_steps = (int)steps;
    tp.grad_accum = (int)accum;
    tp.seed = (uint64_t)seed;
    tp.threads = (unsigned)threads;
    /* saved activations: their tier's store */
    char act_uri[FT_URI_MAX];
    if (!strcmp(act_codec, "lossless")) tp.act_codec = FT_CODEC_BYTEPLANE;
    else if (!strcmp(act_codec, "raw")) tp.act_codec = FT_CODEC_RAW;
    else if (!strcmp(act_codec, "q8")) tp.act_codec = FT_CODEC_Q8;
    else return ft_cli_usage_error(FT_USAGE, "--activations-codec %s: expected lossless, raw or q8", act_codec);
    if (!strcmp(acts, "recompute")) {
        if (strcmp(act_codec, "lossless"))
            return ft_cli_usage_error(FT_USAGE, "--activations-codec needs saved activations (--activations mem, disk "
                                      "or remote)");
    } else if (!strcmp(acts, "mem")) {
        snprintf(act_uri, sizeof act_uri, "mem:");
        tp.act_uri = act_uri;
    } else if (!strcmp(acts, "disk")) {
        if (!so.sp.policy.disk_uri[0])
            return ft_cli_usage_error(FT_USAGE, "--activations disk needs --disk-dir DIR");
        snprintf(act_uri, sizeof act_uri, "%s", so.sp.policy.disk_uri);
        tp.act_uri = act_uri;
    } else if (!strcmp(acts, "remote")) {
        if (!so.sp.policy.n_remotes)
            return ft_cli_usage_error(FT_USAGE, "--activations remote needs --remote ucx://HOST:PORT");
        snprintf(act_uri, sizeof act_uri, "%s", so.sp.policy.remotes[0]);
        tp.act_uri = act_uri;
        tp.act_token_file = so.sp.token_file;
    } else {
        return ft_cli_usage_error(FT_USAGE, "--activations %s: expected recompute, mem, disk or remote", acts);
    }
    /* a disk directory or memory node given for the activations only */
    if (!so.enabled && tp.act_uri) {
        so.sp.policy.disk_uri[0] = '\0';
        so.sp.policy.n_remotes = 0;
    }

    int rc = FT_EXIT_ERR;
    ft_session *ses = NULL;
    const ft_model *m = NULL;
    const ft_tokenizer *tok = NULL;
    ft_trainer *t = NULL;
    int32_t *ids = NULL, *step_tok = NULL;
    uint8_t *tmask = NULL, *step_mask = NULL;
    ft_train_data data_tok;
    memset(&data_tok, 0, sizeof data_tok);
    long *perm = NULL;
    size_t ntok = 0;
    /* data-parallel: rank 0 prints, evaluates and writes; every rank reads
     * the same data and takes its micro-batches of each step */
    ft_train_comm comm = {0, 1, NULL, ft_cli_mpi_send, ft_cli_mpi_recv};
    if (dpo.tcp && ft_cli_dp_begin(&dpo, &comm)) return rc;
    if (mpi) {
        if ((st = ft_cli_mpi_init(&comm.rank, &comm.size))) { ft_cli_fail("--data-parallel mpi", st); return rc; }
        if (accum < comm.size) {
            if (comm.rank == 0)
                fprintf(stderr, "flextier: finetune: --grad-accum %ld < %d processes: each process computes whole "
                        "micro-batches of the step (use --grad-accum N or a multiple)\n", accum, comm.size);
            ft_cli_mpi_finalize();
            return FT_EXIT_USAGE;
        }
        if (comm.rank != 0 && !freopen("/dev/null", "w", stdout)) {
            ft_cli_fail("finetune: stdout", FT_ERR_IO);
            ft_cli_mpi_abort();
            return rc;
        }
    }
    const int lead = comm.rank == 0;
    /* the model through a session: in memory, or its layers placed on the
     * tiers and streamed (the options of run); the budget counts the
     * trainer's working memory */
    ft_model_config pre;
    if ((st = ft_model_config_load(dir, &pre))) { ft_cli_fail(dir, st); goto done; }
    so.sp.threads = (unsigned)threads;
    so.sp.work_bytes = ft_trainer_memory(&pre, &tp, (int)batch, (int)(seq < pre.max_pos ? seq : pre.max_pos));
    if ((st = ft_cli_session_open(&so, dir, (uint32_t)batch, (uint32_t)seq, 1, &ses))) { ft_cli_fail(dir, st); goto done; }
    m = ft_session_model(ses);
    tok = ft_session_tokenizer(ses);
    if (!tok) { fprintf(stderr, "flextier: finetune: %s has no tokenizer\n", dir); goto done; }
    const ft_model_config *cfg = ft_model_get_config(m);
    /* streamed layers: the scheduler fetches each layer and reads the next
     * one in the direction of travel (ft_offload_fetch) */
    if (ft_session_offload(ses)) {
        tp.layer_fn = ft_offload_fetch;
        tp.layer_user = (void *)(uintptr_t)ft_session_offload(ses);
    }
    if ((st = ft_trainer_create(m, &tp, &t))) { ft_cli_fail("finetune", st); goto done; }
    if (init && (st = ft_trainer_load_adapter(t, init))) { ft_cli_fail(init, st); goto done; }
    if (seq > cfg->max_pos) seq = cfg->max_pos;
    if ((st = ft_train_data_load(data, tok, cfg, dir, chat_template, &data_tok))) { ft_cli_fail(data, st); goto done; }
    ids = data_tok.ids;
    ntok = data_tok.n;
    if (data_tok.chat) tmask = data_tok.mask;   /* else every token is a label: no mask */
    else free(data_tok.mask);
    long nseq = (long)(ntok / (size_t)seq);
    long neval = evalf > 0.0 && nseq >= 2 ? (long)ceil(evalf * (double)nseq) : 0;
    long ntrain = nseq - neval;
    if (ntrain < 1) {
        fprintf(stderr, "flextier: finetune: %s has %zu tokens: %ld sequence(s) of %ld, too few for training%s\n",
                data, ntok, nseq, seq, nseq ? " and a held-out split (--eval-frac 0, or a shorter --seq-len)" : "");
        goto done;
    }
    const int32_t *evals = ids + (size_t)ntrain * (size_t)seq;
    const uint8_t *emask = tmask ? tmask + (size_t)ntrain * (size_t)seq : NULL;
    if (tmask) printf("chat data: %zu of %zu tokens in assistant turns (the loss is on those)\n", data_tok.labels, ntok);
    printf("finetune: %s (%s, weights %s), %zu tokens of %s: %ld training + %ld held-out sequences of %ld\n", dir,
           cfg->model_type, ft_wfmt_name(ft_model_weights_format(m)), ntok, data, ntrain, neval, seq);
    printf("lora: rank %ld, alpha %g, targets %s, %zu trainable parameters; steps %ld x %ld x %ld sequences, lr %g "
           "(%s, warmup %ld), seed %ld\n", rank, alpha, targets, ft_trainer_param_count(t), steps, accum, batch, lr,
           sched, warmup, seed);
    if (dpo.tcp) {   /* join the other ranks: same options and tokens, or refused */
        char run[512];
        snprintf(run, sizeof run, "%ld %ld %ld %ld %ld %ld %ld %u %d %a %a %a %a %a %a %s %ld %ld %zu %s %s", steps,
                 seq, batch, accum, rank, seed, warmup, tp.targets, (int)tp.schedule, lr, alpha, wd, clip, evalf,
                 dropout, targets, ntrain, neval, ft_trainer_param_count(t), ft_wfmt_name(ft_model_weights_format(m)),
                 act_codec);
        if ((st = ft_cli_dp_open(&dpo, run, ids, ntok, ft_trainer_param_count(t), &comm))) {
            ft_cli_fail("--data-parallel tcp", st);
            goto done;
        }
    }
    if (dpmode)
        printf("data-parallel: %d processes (%s), each %ld-%ld of the %ld micro-batches of a step\n", comm.size,
               mpi ? "MPI" : "TCP", accum / comm.size, (accum + comm.size - 1) / comm.size, accum);
    double eloss, eppl;
    if (neval && lead) {
        if ((st = evaluate(t, evals, emask, neval, seq, batch, &eloss, &eppl))) { ft_cli_fail("eval", st); goto done; }
        printf("held-out before: loss %.4f perplexity %.3f\n", eloss, eppl);
    }
    run_id rid = {steps, seq, batch, accum, seed, ntrain, (long)ntok};
    long start = 0;
    if (resume_dir) {
        if ((st = resume(t, resume_dir, &rid))) { ft_cli_fail(resume_dir, st); goto done; }
        start = ft_trainer_steps(t);
        printf("resumed from %s at step %ld\n", resume_dir, start);
    }
    size_t per = (size_t)accum * (size_t)batch;
    step_tok = malloc(per * (size_t)seq * sizeof(int32_t));
    step_mask = tmask ? malloc(per * (size_t)seq) : NULL;
    if (tmask && !step_mask) { ft_cli_fail("finetune", FT_ERR_NOMEM); goto done; }
    perm = malloc((size_t)ntrain * sizeof(long));
    if (!step_tok || !perm) { ft_cli_fail("finetune", FT_ERR_NOMEM); goto done; }
    /* the data order is a function of (seed, sequences consumed) */
    long consumed = start * (long)per, epoch = consumed / ntrain, cursor = consumed % ntrain;
    shuffle(perm, ntrain, (uint64_t)seed, epoch);
    double t0 = ft_now(), t1 = 0.0;
    long end_step = stop_after && start + stop_after < steps ? start + stop_after : steps;
    for (long s = start; s < end_step; s++) {
        for (size_t k = 0; k < per; k++) {
            if (cursor == ntrain) {
                cursor = 0;
                shuffle(perm, ntrain, (uint64_t)seed, ++epoch);
            }
            size_t from = (size_t)perm[cursor++] * (size_t)seq;
            memcpy(step_tok + k * (size_t)seq, ids + from, (size_t)seq * sizeof(int32_t));
            if (tmask) memcpy(step_mask + k * (size_t)seq, tmask + from, (size_t)seq);
        }
        double loss, gn, lrs = ft_trainer_lr_at(t, (int)s);
        if ((st = ft_trainer_step_dp_masked(t, dpmode ? &comm : NULL, step_tok, step_mask, (int)batch, (int)seq, &loss,
                                            &gn))) {
            fprintf(stderr, "flextier: finetune: step %ld: %s (%s)\n", s + 1, ft_status_str(st), ft_last_error());
            goto done;
        }
        if (s == start) t1 = ft_now();
        double el = ft_now() - t0, tps = (double)(s + 1 - start) * (double)per * (double)seq / el;
        char eta[32];
        fmt_eta(el / (double)(s + 1 - start) * (double)(end_step - s - 1), eta, sizeof eta);
        printf("step %ld/%ld loss %.4f lr %.3g grad_norm %.3f tok/s %.0f ETA %s\n", s + 1, steps, loss, lrs, gn, tps,
               eta);
        fflush(stdout);
        if (lead && save_every && (s + 1) % save_every == 0 && s + 1 < end_step) {
            if ((st = save_all(t, outdir, dir, &rid))) { ft_cli_fail(outdir, st); goto done; }
            printf("state saved to %s at step %ld\n", outdir, s + 1);
        }
    }
    if (end_step - start > 1)
        printf("trained %ld steps in %.1f s: %.2f tok/s after the first step (%.2f overall)\n", end_step - start,
               ft_now() - t0, (double)(end_step - start - 1) * (double)per * (double)seq / (ft_now() - t1),
               (double)(end_step - start) * (double)per * (double)seq / (ft_now() - t0));
    if (neval && lead) {
        double aloss, appl;
        if ((st = evaluate(t, evals, emask, neval, seq, batch, &aloss, &appl))) { ft_cli_fail("eval", st); goto done; }
        printf("held-out after: loss %.4f perplexity %.3f (before %.3f)\n", aloss, appl, eppl);
    }
    if (!lead) st = FT_OK;
    else if (save_every || stop_after || resume_dir) st = save_all(t, outdir, dir, &rid);
    else st = ft_trainer_save_adapter(t, outdir, dir);
    if (st) { ft_cli_fail(outdir, st); goto done; }
    printf("adapter written to %s (PEFT: adapter_config.json, adapter_model.safetensors)%s\n", outdir,
           end_step < steps ? "; stopped early: continue with --resume" : "");
    if (tp.act_uri) {
        ft_train_act_stats as;
        ft_trainer_act_stats(t, &as);
        double passes = (double)(end_step - start) * (double)accum / (double)comm.size;
        printf("activations: saved to %s (%s): %.1f MiB per pass as f32, %.1f MiB stored (%.2fx), write %.2f s, read "
               "%.2f s in all\n", tp.act_uri, act_codec, passes > 0 ? (double)as.raw_bytes / 1048576.0 / passes : 0.0,
               (double)as.stored_bytes / 1048576.0,
               as.stored_bytes && passes > 0 ? (double)as.raw_bytes / passes / (double)as.stored_bytes : 0.0,
               as.write_s, as.read_s);
    }
    if (ft_session_offload(ses)) {
        ft_offload_stats os;
        ft_offload_get_stats(ft_session_offload(ses), &os);
        uint64_t rd = 0;
        for (int k = 0; k < FT_TIER_COUNT; k++) rd += os.wire_bytes[k];
        printf("offload: %llu layer fetches, %.1f MiB read from the tiers, I/O busy %.2f s, compute waited %.2f s\n",
               (unsigned long long)os.layers_fetched, (double)rd / 1048576.0, os.io_busy_s, os.wait_s);
    }
    struct rusage ru;
    if (!getrusage(RUSAGE_SELF, &ru)) printf("peak RSS %.1f MiB\n", (double)ru.ru_maxrss / 1024.0);
    rc = FT_EXIT_OK;
done:
    free(perm);
    free(step_tok);
    free(step_mask);
    free(tmask);
    free(ids);
    ft_trainer_free(t);
    ft_session_close(ses);
    if (dpo.tcp) ft_cli_dp_end(&dpo, rc == FT_EXIT_OK);
    if (mpi) {
        fflush(stdout);
        /* a failure on some ranks only (a file, memory) would leave the
         * others waiting: end the job */
        if (rc != FT_EXIT_OK && comm.size > 1) ft_cli_mpi_abort();
        ft_cli_mpi_finalize();
    }
    return rc;
}

/* ------------------------------------------------- export --merge-lora */

static const char EX_USAGE[] =
    "usage: flextier export --model DIR --merge-lora ADAPTER[:SCALE] [--merge-lora ...] --out DIR\n"
    "         [--dtype f32|bf16|f16]\n"
    "Writes DIR (--out) as a Hugging Face checkpoint with the PEFT LoRA adapters merged into the\n"
    "weights: W' = W + sum SCALE * alpha/r * B A, in f32, in the order given (as PEFT's\n"
    "merge_and_unload): model.safetensors (one file, one tensor in memory at a time) plus the\n"
    "model directory's config, tokenizer and generation files. --dtype: the float tensors'\n"
    "dtype (default: each tensor's own; config.json's torch_dtype follows). transformers and\n"
    "every flextier command (--device cuda, --pipeline) load the result.\n";

int ft_cmd_export(int argc, char **argv)
{
    const char *dir = NULL, *out = NULL;
    char ads[FT_CLI_MAX_LORA][4096];
    const char *adp[FT_CLI_MAX_LORA];
    float scales[FT_CLI_MAX_LORA];
    size_t n = 0;
    int dtype = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(EX_USAGE, stdout);
            return FT_EXIT_OK;
        }
        if (i + 1 >= argc) return ft_cli_usage_error(EX_USAGE, "option %s needs a value", a);
        const char *v = argv[++i];
        if (!strcmp(a, "--model")) dir = v;
        else if (!strcmp(a, "--out")) out = v;
        else if (!strcmp(a, "--merge-lora")) {
            if (n == FT_CLI_MAX_LORA) return ft_cli_usage_error(EX_USAGE, "at most %d adapters", FT_CLI_MAX_LORA);
            if (ft_cli_parse_lora(v, ads[n], sizeof ads[n], &scales[n]))
                return ft_cli_usage_error(EX_USAGE, "--merge-lora: %s", ft_last_error());
            adp[n] = ads[n];
            n++;
        } else if (!strcmp(a, "--dtype")) {
            if (!strcmp(v, "f32")) dtype = FT_F32;
            else if (!strcmp(v, "bf16")) dtype = FT_BF16;
            else if (!strcmp(v, "f16")) dtype = FT_F16;
            else return ft_cli_usage_error(EX_USAGE, "--dtype: '%s': expected f32, bf16 or f16", v);
        } else return ft_cli_usage_error(EX_USAGE, "unknown option %s", a);
    }
    if (!dir || !out || !n) return ft_cli_usage_error(EX_USAGE, "--model, --merge-lora and --out are required");
    ft_status st = ft_lora_merge_checkpoint(dir, adp, scales, n, out, dtype);
    if (st) return ft_cli_fail("export", st);
    printf("merged %zu adapter%s into %s/model.safetensors\n", n, n == 1 ? "" : "s", out);
    return FT_EXIT_OK;
}
