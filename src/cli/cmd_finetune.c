/* flextier finetune: LoRA fine-tuning of a model directory on a text or
 * JSONL file (the train layer, docs/training.md); and flextier run --lora
 * (greedy generation with a PEFT adapter applied, unmerged). */
#include "cli.h"
#include "session_opts.h"
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
    "LoRA fine-tuning (llama, mistral, qwen2; base weights frozen in their stored format).\n"
    "Data: plain text, or JSONL (.jsonl) with one {\"text\": ...} object per line; tokenized,\n"
    "packed into sequences of --seq-len tokens; the last --eval-frac of them are held out\n"
    "(loss and perplexity before and after). Writes a PEFT adapter (adapter_config.json +\n"
    "adapter_model.safetensors) that peft.PeftModel.from_pretrained and `flextier run --lora` load.\n"
    "  --steps N           optimizer steps (default 100)\n"
    "  --lr X              peak learning rate (default 1e-3)\n"
    "  --rank R            LoRA rank (default 8)       --alpha A   lora_alpha (default 16)\n"
    "  --targets LIST      q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj or all (default)\n"
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
    "  --weights-dtype F   the frozen weights: auto (as stored), f32, bf16, q8, q4\n"
    "  --activations A     what the backward pass reads: recompute (default: each layer's\n"
    "                      forward again from its saved input), or the activations saved by\n"
    "                      the forward with write_tensor to mem (this process), disk (--disk-dir)\n"
    "                      or remote (--remote: a memory node)\n"
    "  --activations-codec C  saved activations' encoding: lossless (byte-plane, default: the\n"
    "                      results equal recompute's bit for bit), raw, or q8 (lossy)\n"
    "  --dropout X         lora_dropout: only 0 is implemented\n"
    "  --threads N         worker threads (default: every core; results do not depend on it)\n"
    "  --save-every N      also write the adapter and the training state (AdamW moments,\n"
    "                      step: trainer_state.safetensors + .json) to --out every N steps\n"
    "  --stop-after N      stop after N steps of this run (writing the state), to resume later\n"
    "  --resume DIR        continue the run whose state is in DIR (same data and options):\n"
    "                      the result equals the uninterrupted run's bit for bit\n"
    "Base weights through the tiers: the offloading options of `flextier run` (--policy,\n"
    "--disk-dir, --remote, --compress-weights, --memory, ...): the forward streams the layers\n"
    "upwards, the backward downwards, each reading the next layer ahead; the results equal the\n"
    "in-memory run's for the same stored format. --memory counts the trainer's working memory.\n";

static int is_jsonl(const char *path)
{
    size_t n = strlen(path);
    return n > 6 && !strcmp(path + n - 6, ".jsonl");
}

static ft_status append(int32_t **all, size_t *n, size_t *cap, const int32_t *ids, size_t k)
{
    if (*n + k > *cap) {
        size_t c = (*cap ? *cap * 2 : 4096);
        while (c < *n + k) c *= 2;
        int32_t *p = realloc(*all, c * sizeof(int32_t));
        if (!p) return ft_set_error(FT_ERR_NOMEM, "data: out of memory");
        *all = p;
        *cap = c;
    }
    memcpy(*all + *n, ids, k * sizeof(int32_t));
    *n += k;
    return FT_OK;
}

typedef struct jl_ctx {
    const ft_tokenizer *tok;
    int32_t **all;
    size_t *n, *cap;
    int32_t eos;
} jl_ctx;

static ft_status jl_doc(void *user, const char *text, size_t len)
{
    jl_ctx *c = user;
    int32_t *ids = NULL;
    size_t k = 0;
    ft_status st = ft_tokenizer_encode(c->tok, text, len, 1, &ids, &k);
    if (!st) st = append(c->all, c->n, c->cap, ids, k);
    if (!st && c->eos >= 0) st = append(c->all, c->n, c->cap, &c->eos, 1);
    free(ids);
    return st;
}

/* the file's tokens: plain text as one document, JSONL one document per
 * line ({"text": ...}), each followed by EOS when the model has one */
static ft_status tokenize_data(const char *path, const ft_tokenizer *tok, const ft_model_config *cfg, int32_t **out,
                               size_t *nout)
{
    uint8_t *raw = NULL;
    size_t rawn = 0, n = 0, cap = 0;
    int32_t *all = NULL, *ids = NULL;
    size_t k = 0;
    ft_status st = ft_cli_read_file(path, &raw, &rawn);
    if (st) return st;
    if (memchr(raw, 0, rawn)) {
        st = ft_set_error(FT_ERR_CORRUPT, "data: %s holds NUL bytes (not text)", path);
        goto done;
    }
    int32_t eos = cfg->n_eos > 0 ? cfg->eos_ids[0] : -1;
    if (!is_jsonl(path)) {
        if ((st = ft_tokenizer_encode(tok, (const char *)raw, rawn, 1, &ids, &k))) goto done;
        if ((st = append(&all, &n, &cap, ids, k))) goto done;
    } else {
        jl_ctx c = {tok, &all, &n, &cap, eos};
        if ((st = ft_train_jsonl_each((const char *)raw, rawn, path, jl_doc, &c))) goto done;
    }
    for (size_t i = 0; i < n; i++)
        if (all[i] < 0 || all[i] >= cfg->vocab) {
            st = ft_set_error(FT_ERR_CORRUPT, "data: token id %d is outside the model's vocab_size %d", (int)all[i],
                              cfg->vocab);
            goto done;
        }
    *out = all;
    *nout = n;
    all = NULL;
done:
    free(ids);
    free(all);
    ft_free_aligned(raw);
    return st;
}

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

static ft_status evaluate(ft_trainer *t, const int32_t *seqs, long n, long T, long batch, double *loss, double *ppl)
{
    double sum = 0.0;
    int64_t cnt = 0;
    for (long i = 0; i < n; i += batch) {
        long nb = n - i < batch ? n - i : batch;
        double s;
        int64_t c;
        ft_status st = ft_trainer_eval(t, seqs + (size_t)i * (size_t)T, (int)nb, (int)T, &s, &c);
        if (st) return st;
        sum += s;
        cnt += c;
    }
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
    const char *resume_dir = NULL;
    long save_every = 0, stop_after = 0, threads = 0;
    long steps = 100, rank = 8, seq = 128, batch = 4, accum = 1, warmup = -1, seed = 0;
    double lr = 1e-3, alpha = 16, wd = 0.01, clip = 1.0, evalf = 0.1, dropout = 0.0;
    const char *acts = "recompute", *act_codec = "lossless";
    ft_cli_session so;
    ft_cli_session_init(&so);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(FT_USAGE, stdout);
            fputs(ft_cli_offload_usage, stdout);
            return FT_EXIT_OK;
        }
        if (!strcmp(a, "--kv-dtype") || !strcmp(a, "--compress-cache") || !strcmp(a, "--device") ||
            !strncmp(a, "--expert", 8))
            return ft_cli_usage_error(FT_USAGE, "%s is not implemented for finetune (no KV cache; the CPU; dense "
                                      "models)", a);
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
        else if (!strcmp(a, "--resume")) resume_dir = v;
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
        else if (!strcmp(a, "--dropout")) { fd = &dropout; fhi = 1.0; }
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
    long *perm = NULL;
    size_t ntok = 0;
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
    if ((st = tokenize_data(data, tok, cfg, &ids, &ntok))) { ft_cli_fail(data, st); goto done; }
    long nseq = (long)(ntok / (size_t)seq);
    long neval = evalf > 0.0 && nseq >= 2 ? (long)ceil(evalf * (double)nseq) : 0;
    long ntrain = nseq - neval;
    if (ntrain < 1) {
        fprintf(stderr, "flextier: finetune: %s has %zu tokens: %ld sequence(s) of %ld, too few for training%s\n",
                data, ntok, nseq, seq, nseq ? " and a held-out split (--eval-frac 0, or a shorter --seq-len)" : "");
        goto done;
    }
    const int32_t *evals = ids + (size_t)ntrain * (size_t)seq;
    printf("finetune: %s (%s, weights %s), %zu tokens of %s: %ld training + %ld held-out sequences of %ld\n", dir,
           cfg->model_type, ft_wfmt_name(ft_model_weights_format(m)), ntok, data, ntrain, neval, seq);
    printf("lora: rank %ld, alpha %g, targets %s, %zu trainable parameters; steps %ld x %ld x %ld sequences, lr %g "
           "(%s, warmup %ld), seed %ld\n", rank, alpha, targets, ft_trainer_param_count(t), steps, accum, batch, lr,
           sched, warmup, seed);
    double eloss, eppl;
    if (neval) {
        if ((st = evaluate(t, evals, neval, seq, batch, &eloss, &eppl))) { ft_cli_fail("eval", st); goto done; }
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
            memcpy(step_tok + k * (size_t)seq, ids + (size_t)perm[cursor++] * (size_t)seq, (size_t)seq * sizeof(int32_t));
        }
        double loss, gn, lrs = ft_trainer_lr_at(t, (int)s);
        if ((st = ft_trainer_step(t, step_tok, (int)batch, (int)seq, &loss, &gn))) {
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
        if (save_every && (s + 1) % save_every == 0 && s + 1 < end_step) {
            if ((st = save_all(t, outdir, dir, &rid))) { ft_cli_fail(outdir, st); goto done; }
            printf("state saved to %s at step %ld\n", outdir, s + 1);
        }
    }
    if (end_step - start > 1)
        printf("trained %ld steps in %.1f s: %.2f tok/s after the first step (%.2f overall)\n", end_step - start,
               ft_now() - t0, (double)(end_step - start - 1) * (double)per * (double)seq / (ft_now() - t1),
               (double)(end_step - start) * (double)per * (double)seq / (ft_now() - t0));
    if (neval) {
        double aloss, appl;
        if ((st = evaluate(t, evals, neval, seq, batch, &aloss, &appl))) { ft_cli_fail("eval", st); goto done; }
        printf("held-out after: loss %.4f perplexity %.3f (before %.3f)\n", aloss, appl, eppl);
    }
    if (save_every || stop_after || resume_dir) st = save_all(t, outdir, dir, &rid);
    else st = ft_trainer_save_adapter(t, outdir, dir);
    if (st) { ft_cli_fail(outdir, st); goto done; }
    printf("adapter written to %s (PEFT: adapter_config.json, adapter_model.safetensors)%s\n", outdir,
           end_step < steps ? "; stopped early: continue with --resume" : "");
    if (tp.act_uri) {
        ft_train_act_stats as;
        ft_trainer_act_stats(t, &as);
        printf("activations: saved to %s (%s): %.1f MiB per pass as f32, %.1f MiB stored (%.2fx), write %.2f s, read "
               "%.2f s in all\n", tp.act_uri, act_codec, (double)as.raw_bytes / 1048576.0 / (double)(end_step - start)
               / (double)accum, (double)as.stored_bytes / 1048576.0,
               as.stored_bytes ? (double)as.raw_bytes / (double)(end_step - start) / (double)accum /
                                     (double)as.stored_bytes : 0.0, as.write_s, as.read_s);
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
    free(ids);
    ft_trainer_free(t);
    ft_session_close(ses);
    return rc;
}

/* ------------------------------------------------------ run --lora */

static const char RL_USAGE[] =
    "usage: flextier run --model DIR --lora ADAPTER_DIR (--prompt TEXT | --prompt-file FILE |\n"
    "         --prompt-ids ID,ID,...) [--max-new-tokens N] [--weights-dtype F] [--ids]\n"
    "Greedy generation with one PEFT LoRA adapter applied unmerged (y = W x + alpha/r B A x),\n"
    "through the trainer's forward with a K/V cache (one row per position). Other\n"
    "run options (sampling, offloading, batches, several adapters) are not implemented with\n"
    "--lora. --ids prints the token ids; --prompt-ids takes the prompt as token ids (to compare\n"
    "with transformers + peft on the same ids).\n";

int ft_cmd_run_lora(int argc, char **argv)
{
    const char *dir = NULL, *lora = NULL, *prompt = NULL, *pfile = NULL, *pids = NULL;
    long max_new = 32;
    int weights = FT_WEIGHTS_AS_STORED, print_ids = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(RL_USAGE, stdout);
            return FT_EXIT_OK;
        }
        if (!strcmp(a, "--ids")) { print_ids = 1; continue; }
        if (i + 1 >= argc) return ft_cli_usage_error(RL_USAGE, "option %s needs a value", a);
        const char *v = argv[++i];
        if (!strcmp(a, "--model")) dir = v;
        else if (!strcmp(a, "--lora")) {
            if (lora) return ft_cli_usage_error(RL_USAGE, "several --lora adapters are not implemented (one only)");
            lora = v;
        } else if (!strcmp(a, "--prompt")) prompt = v;
        else if (!strcmp(a, "--prompt-file")) pfile = v;
        else if (!strcmp(a, "--prompt-ids")) pids = v;
        else if (!strcmp(a, "--max-new-tokens")) {
            if (ft_cli_parse_int(v, 0, 1 << 20, &max_new)) return ft_cli_usage_error(RL_USAGE, "bad --max-new-tokens %s", v);
        } else if (!strcmp(a, "--weights-dtype")) {
            if (ft_cli_parse_weights(v, &weights)) return ft_cli_usage_error(RL_USAGE, "--weights-dtype: %s", ft_last_error());
        } else return ft_cli_usage_error(RL_USAGE, "option %s is not implemented with --lora", a);
    }
    if (!dir || !lora || (!!prompt + !!pfile + !!pids) != 1)
        return ft_cli_usage_error(RL_USAGE, "--model, --lora and one of --prompt / --prompt-file / --prompt-ids are "
                                  "required");
    if (pids) print_ids = 1;
    int rc = FT_EXIT_ERR;
    ft_status st;
    ft_model *m = NULL;
    ft_tokenizer *tok = NULL;
    ft_trainer *t = NULL;
    uint8_t *raw = NULL;
    size_t rawn = 0, n = 0;
    int32_t *ids = NULL, *seqv = NULL;
    float *lg = NULL;
    char *text = NULL;
    ft_train_params tp;
    ft_train_params_default(&tp);
    if ((st = ft_lora_read_config(lora, &tp))) { ft_cli_fail(lora, st); goto done; }
    ft_load_params lp;
    ft_load_params_default(&lp);
    lp.weights = weights;
    if ((st = ft_model_load(dir, &lp, &m))) { ft_cli_fail(dir, st); goto done; }
    if ((st = ft_tokenizer_load_dir(dir, &tok))) { ft_cli_fail(dir, st); goto done; }
    if ((st = ft_trainer_create(m, &tp, &t))) { ft_cli_fail("run --lora", st); goto done; }
    if ((st = ft_trainer_load_adapter(t, lora))) { ft_cli_fail(lora, st); goto done; }
    if (pids) {
        size_t cap = strlen(pids) / 2 + 1;
        ids = malloc(cap * sizeof(int32_t));
        if (!ids) { ft_cli_fail("run --lora", FT_ERR_NOMEM); goto done; }
        const char *q = pids;
        st = FT_OK;
        while (*q && n < cap) {
            char *e;
            long id = strtol(q, &e, 10);
            if (e == q || id < 0 || id >= ft_model_get_config(m)->vocab || (*e && *e != ',')) {
                st = ft_set_error(FT_ERR_INVALID_ARG, "--prompt-ids: '%s': expected ids in [0, vocab) separated by "
                                  "commas", pids);
                break;
            }
            ids[n++] = (int32_t)id;
            q = *e ? e + 1 : e;
        }
    } else if (pfile) {
        if ((st = ft_cli_read_file(pfile, &raw, &rawn))) { ft_cli_fail(pfile, st); goto done; }
        st = ft_tokenizer_encode(tok, (const char *)raw, rawn, 1, &ids, &n);
    } else {
        st = ft_tokenizer_encode(tok, prompt, strlen(prompt), 1, &ids, &n);
    }
    if (st) { ft_cli_fail("encode", st); goto done; }
    const ft_model_config *cfg = ft_model_get_config(m);
    if (n == 0) { fprintf(stderr, "flextier: run --lora: the prompt has no tokens\n"); goto done; }
    if ((long)n + max_new > cfg->max_pos) max_new = cfg->max_pos - (long)n;
    if (max_new < 0) { fprintf(stderr, "flextier: run --lora: the prompt is longer than the context\n"); goto done; }
    seqv = malloc(((size_t)n + (size_t)max_new) * sizeof(int32_t));
    lg = malloc((size_t)cfg->vocab * sizeof(float));
    if (!seqv || !lg) { ft_cli_fail("run --lora", FT_ERR_NOMEM); goto done; }
    memcpy(seqv, ids, n * sizeof(int32_t));
    if ((st = ft_trainer_generate(t, seqv, (int)n, (int)max_new, seqv + n))) { ft_cli_fail("generate", st); goto done; }
    size_t len = n + (size_t)max_new;
    if (print_ids) {
        for (size_t i = n; i < len; i++) printf("%s%d", i > n ? " " : "", (int)seqv[i]);
        printf("\n");
    } else {
        size_t tl;
        if ((st = ft_tokenizer_decode(tok, seqv + n, len - n, 1, &text, &tl))) { ft_cli_fail("decode", st); goto done; }
        printf("%s%s\n", prompt ? prompt : "", text);
    }
    rc = FT_EXIT_OK;
done:
    free(text);
    free(lg);
    free(seqv);
    free(ids);
    ft_free_aligned(raw);
    ft_trainer_free(t);
    ft_tokenizer_free(tok);
    ft_model_free(m);
    return rc;
}
