/* Experts as the unit of streaming (issue 23): a mixture of experts whose
 * policy leaves experts on the disk tier reads, after each layer's router
 * has run, only the experts the call's rows selected, through an expert
 * cache of a byte budget (LRU or LFU eviction), with the next layer's
 * experts predicted and read ahead. Lossless placements (byte-plane
 * frames) give logits bit-identical to the in-memory engine whatever the
 * cache size, eviction and prefetching; the per-layer statistics add up
 * (needed = resident + hits + misses; prefetch hits are hits) and a cache
 * holding every expert reads each at most once. The fixtures' random
 * routers spread the choices: hit rates and prefetch accuracy are printed,
 * not bounded. */
#include "ft_test.h"
#include "pagecache.h"
#include "support/fixture.h"
#include "flextier/offload.h"
#include "support/server_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#define STEPS 8

/* The scheduler's hook; at call `at` sends `sig` to a memory node (the
 * replica tests; NULL: the plain hook). */
typedef struct {
    ft_offload *o;
    int calls, at, sig;
    pid_t pid;
} fault_hook;
static fault_hook *g_fault;

static ft_status fault_hook_fn(void *u, int layer, ft_layer_weights *w)
{
    fault_hook *f = u;
    if (++f->calls == f->at && f->pid > 0) kill(f->pid, f->sig);
    return ft_offload_hook(f->o, layer, w);
}

/* prefill of every prompt, then STEPS greedy steps fed `feed` (the
 * reference run writes it): the last-position logits of every call */
static float *run(ft_model *m, ft_offload *o, const ft_fixture *f, int32_t *feed, ft_status *st)
{
    const ft_model_config *cfg = ft_model_get_config(m);
    size_t V = (size_t)cfg->vocab, np = (size_t)f->np, maxp = 0;
    for (int i = 0; i < f->np; i++) maxp = f->plen[i] > maxp ? f->plen[i] : maxp;
    ft_ctx_params cp = {.max_batch = f->np, .max_seq = (int)maxp + STEPS + 1, .threads = 1};
    ft_ctx *c = NULL;
    float *all = calloc((1 + STEPS) * np * V, sizeof(float));
    if ((*st = ft_ctx_create(m, &cp, &c))) goto out;
    if (o && g_fault) ft_ctx_set_layer_hook(c, fault_hook_fn, g_fault);
    else if (o) ft_ctx_set_layer_hook(c, ft_offload_hook, o);
    int slots[FT_FIXTURE_MAXP];
    const int32_t *tp[FT_FIXTURE_MAXP];
    size_t nt[FT_FIXTURE_MAXP];
    for (int i = 0; i < f->np; i++) { slots[i] = i; tp[i] = f->prompt[i]; nt[i] = f->plen[i]; }
    if ((*st = ft_ctx_forward(c, np, slots, tp, nt, all, 0))) goto out;
    for (int s = 1; s <= STEPS; s++) {
        int32_t *tok = feed + (size_t)(s - 1) * np;
        for (size_t i = 0; i < np; i++) {
            if (!o) {
                const float *row = all + ((size_t)(s - 1) * np + i) * V;
                int32_t best = 0;
                for (size_t v = 1; v < V; v++) if (row[v] > row[best]) best = (int32_t)v;
                tok[i] = best;
            }
            tp[i] = &tok[i];
            nt[i] = 1;
        }
        if ((*st = ft_ctx_forward(c, np, slots, tp, nt, all + (size_t)s * np * V, 0))) goto out;
    }
out:
    ft_ctx_free(c);
    return all;
}

/* The fixture `name` (dir set), its model loaded in memory (*ref_m) and
 * the reference logits of its prompts (run: feed holds the tokens fed),
 * *n of them. NULL (said) when any of it failed. */
static float *reference(const char *name, char *dir, size_t dn, ft_fixture *f, ft_model **ref_m, int32_t *feed,
                        size_t *n)
{
    *ref_m = NULL;
    ft_fixture_dir("models", name, dir, dn);
    int ok = ft_fixture_load(dir, f) && f->np > 0;
    CHECK_MSG(ok, "fixture %s", name);
    if (!ok) return NULL;
    CHECK_OK(ft_model_load(dir, NULL, ref_m));
    if (!*ref_m) return NULL;
    *n = (1 + STEPS) * (size_t)f->np * (size_t)ft_model_get_config(*ref_m)->vocab;
    ft_status st;
    float *ref = run(*ref_m, NULL, f, feed, &st);
    CHECK_OK(st);
    if (st != FT_OK) { free(ref); ref = NULL; }
    return ref;
}

typedef struct { const char *policy; uint64_t cache; int evict, no_prefetch; } setting;

static void check_model(const char *name)
{
    char dir[512], disk[600];
    snprintf(disk, sizeof disk, "/tmp/ft-offload-ex-%d", (int)getpid());
    ft_fixture f;
    ft_model *ref_m = NULL;
    int32_t feed[STEPS * FT_FIXTURE_MAXP];
    size_t n = 0;
    float *ref = reference(name, dir, sizeof dir, &f, &ref_m, feed, &n);
    if (!ref) { ft_model_free(ref_m); return; }
    const ft_model_config *cfg = ft_model_get_config(ref_m);
    REQUIRE(cfg->n_experts > 0);
    int sparse = 0;
    for (int l = 0; l < cfg->n_layers; l++) sparse += cfg->layer_moe[l];
    ft_status st;
    /* every expert on disk (byte-plane: lossless), or half the layer
     * tensors resident (a hot set of experts stays), with caches of one
     * layer's experts (the least) or all of them */
    const setting set[] = {
        {"w=0,0,100 cw=bp", 0, FT_EXPERT_LRU, 0},
        {"w=0,0,100 cw=bp", 0, FT_EXPERT_LFU, 0},
        {"w=0,0,100 cw=bp", 0, FT_EXPERT_LRU, 1},
        {"w=0,0,100 cw=bp", UINT64_MAX / 2, FT_EXPERT_LRU, 0},
        {"w=50,0,50 cw=bp", 0, FT_EXPERT_LFU, 0},
        {"w=0,0,100", 0, FT_EXPERT_LRU, 0},
    };
    for (size_t k = 0; k < sizeof set / sizeof set[0]; k++) {
        ft_offload_params p;
        ft_offload_default_params(&p);
        char full[800];
        snprintf(full, sizeof full, "%s disk=file:%s", set[k].policy, disk);
        CHECK_OK(ft_policy_parse(full, &p.policy));
        p.expert_cache_bytes = set[k].cache;
        p.expert_evict = set[k].evict;
        p.expert_prefetch = !set[k].no_prefetch;
        ft_load_params lp = {0};
        lp.external_layers = 1;
        ft_model *m = NULL;
        CHECK_OK(ft_model_load(dir, &lp, &m));
        ft_offload *o = NULL;
        st = ft_offload_create(m, dir, &p, &o);
        CHECK_MSG(st == FT_OK, "%s %s: %s", name, set[k].policy, ft_last_error());
        if (st == FT_OK) {
            int entries = 0;
            uint64_t cbytes = 0;
            ft_offload_expert_cache(o, &entries, &cbytes);
            CHECK_MSG(entries >= cfg->n_experts && entries <= sparse * cfg->n_experts, "%s: %d entries", name,
                      entries);
            if (set[k].cache == 0) CHECK(entries == cfg->n_experts);
            float *got = run(m, o, &f, feed, &st);
            CHECK_MSG(st == FT_OK, "%s %s: %s", name, set[k].policy, ft_last_error());
            size_t diff = 0;
            for (size_t i = 0; got && i < n; i++) diff += got[i] != ref[i];
            CHECK_MSG(diff == 0, "%s %s (cache %d, %s%s): %zu logits differ", name, set[k].policy, entries,
                      set[k].evict == FT_EXPERT_LFU ? "LFU" : "LRU", set[k].no_prefetch ? ", no prefetch" : "", diff);
            ft_expert_stats t = {0};
            for (int l = 0; l < cfg->n_layers; l++) {
                ft_expert_stats e;
                CHECK_OK(ft_offload_expert_stats(o, l, &e));
                CHECK_MSG(e.needed == e.resident + e.hits + e.misses, "%s layer %d: %llu needed != %llu + %llu + %llu",
                          name, l, (unsigned long long)e.needed, (unsigned long long)e.resident,
                          (unsigned long long)e.hits, (unsigned long long)e.misses);
                CHECK(e.prefetch_hits <= e.hits && e.predicted_used <= e.predicted);
                if (!cfg->layer_moe[l]) CHECK(e.needed == 0);
                if (set[k].no_prefetch) CHECK(e.predicted == 0 && e.prefetch_hits == 0);
                t.needed += e.needed; t.resident += e.resident; t.hits += e.hits; t.misses += e.misses;
                t.prefetch_hits += e.prefetch_hits; t.bytes += e.bytes; t.predicted += e.predicted;
                t.predicted_used += e.predicted_used;
            }
            CHECK(t.needed > 0 && t.misses > 0 && t.bytes > 0);
            if (set[k].policy[2] == '5') CHECK(t.resident > 0);
            /* a cache of every expert reads each at most once */
            if (entries == sparse * cfg->n_experts)
                CHECK_MSG(t.misses <= (uint64_t)entries, "%s: %llu misses with every expert cached", name,
                          (unsigned long long)t.misses);
            uint64_t streamed = t.hits + t.misses;
            printf("  %-14s %-16s cache %2d/%2d (%6.1f KiB) %s%s: needed %4llu, resident %3llu, hit rate %5.1f%% "
                   "(prefetched %5.1f%%), read %7.1f KiB, prefetch accuracy %5.1f%%\n",
                   name, set[k].policy, entries, sparse * cfg->n_experts, (double)cbytes / 1024,
                   set[k].evict == FT_EXPERT_LFU ? "LFU" : "LRU", set[k].no_prefetch ? " no-pf" : "      ",
                   (unsigned long long)t.needed, (unsigned long long)t.resident,
                   streamed ? 100.0 * (double)t.hits / (double)streamed : 0.0,
                   streamed ? 100.0 * (double)t.prefetch_hits / (double)streamed : 0.0, (double)t.bytes / 1024,
                   t.predicted ? 100.0 * (double)t.predicted_used / (double)t.predicted : 0.0);
            free(got);
            ft_offload_free(o);
        }
        ft_model_free(m);
    }
    free(ref);
    ft_fixture_free(&f);
    ft_model_free(ref_m);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf %s", disk);
    if (system(cmd) != 0) printf("  (could not remove %s)\n", disk);
}

TEST(qwen3moe_tiny) { check_model("qwen3moe-tiny"); }   /* layer 1 dense (mlp_only_layers) */
TEST(olmoe_tiny) { check_model("olmoe-tiny"); }
TEST(mixtral_tiny) { check_model("mixtral-tiny"); }
TEST(qwen3moe_bf16) { check_model("qwen3moe-bf16"); }
/* a shared expert in the dense MLP's slots, placed with its layer */
TEST(qwen2moe_tiny) { check_model("qwen2moe-tiny"); }
TEST(qwen2moe_shared) { check_model("qwen2moe-shared"); }


/* Experts read past the page cache: with direct_io (FLEXTIER_DIRECT_IO=1)
 * and every frame placed for it (direct_min 1: the fixtures' frames are a
 * few KiB), the expert cache's entries are 4 KiB-aligned and the disk
 * tier reads every expert frame with O_DIRECT: none of the tier's pages
 * is cached after the run (the page cache kept otherwise: drop_cache
 * off), the logits unchanged. Read buffered (FLEXTIER_DIRECT_IO=0) the
 * pages stay, so the check can fail. On a disk only. */
static void check_direct(const char *name, const char *policy)
{
    char dir[512], disk[600];
    snprintf(disk, sizeof disk, "/var/tmp/ft-offload-exd-%d", (int)getpid());
    ft_fixture f;
    ft_model *ref_m = NULL;
    int32_t feed[STEPS * FT_FIXTURE_MAXP];
    size_t n = 0;
    float *ref = reference(name, dir, sizeof dir, &f, &ref_m, feed, &n);
    if (!ref) { ft_model_free(ref_m); return; }
    const ft_model_config *cfg = ft_model_get_config(ref_m);
    ft_status st;
    char *env = getenv("FLEXTIER_DIRECT_IO") ? strdup(getenv("FLEXTIER_DIRECT_IO")) : NULL;
    for (int direct = 1; direct >= 0; direct--) {
        ft_offload_params p;
        ft_offload_default_params(&p);
        char full[800];
        snprintf(full, sizeof full, "%s disk=file:%s", policy, disk);
        CHECK_OK(ft_policy_parse(full, &p.policy));
        p.direct_min = 1;
        p.drop_cache = 0;
        ft_load_params lp = {0};
        lp.external_layers = 1;
        ft_model *m = NULL;
        CHECK_OK(ft_model_load(dir, &lp, &m));
        ft_offload *o = NULL;
        setenv("FLEXTIER_DIRECT_IO", direct ? "1" : "0", 1);
        st = ft_offload_create(m, dir, &p, &o);
        if (env) setenv("FLEXTIER_DIRECT_IO", env, 1);
        else unsetenv("FLEXTIER_DIRECT_IO");
        CHECK_MSG(st == FT_OK, "%s %s: %s", name, policy, ft_last_error());
        if (st == FT_OK) {
            struct statfs sf;
            int tmpfs = statfs(disk, &sf) != 0 || sf.f_type == 0x01021994 /* TMPFS_MAGIC */;
            CHECK(ft_test_dir_evict(disk) == 0);
            long before = ft_test_dir_cached_pages(disk);
            float *got = run(m, o, &f, feed, &st);
            CHECK_MSG(st == FT_OK, "%s: %s", name, ft_last_error());
            size_t diff = 0;
            for (size_t i = 0; got && i < n; i++) diff += got[i] != ref[i];
            CHECK_MSG(diff == 0, "%s %s direct %d: %zu logits differ", name, policy, direct, diff);
            uint64_t misses = 0;
            for (int l = 0; l < cfg->n_layers; l++) {
                ft_expert_stats e;
                CHECK_OK(ft_offload_expert_stats(o, l, &e));
                misses += e.misses;
            }
            CHECK(misses > 0);
            long after = ft_test_dir_cached_pages(disk);
            if (tmpfs || before != 0) {
                printf("  %s: a tmpfs, or could not evict (%ld pages): not checked\n", disk, before);
            } else if (direct) {
                CHECK_MSG(after == 0, "%s %s: %ld pages of the disk tier cached after direct reads", name, policy,
                          after);
            } else {
                CHECK_MSG(after > 0, "%s %s: buffered reads cached nothing (%ld)", name, policy, after);
            }
            printf("  %-14s %-12s direct %d: %llu expert misses, %ld tier pages cached after the run\n", name, policy,
                   direct, (unsigned long long)misses, after);
            free(got);
            ft_offload_free(o);
        }
        ft_model_free(m);
    }
    free(env);
    free(ref);
    ft_fixture_free(&f);
    ft_model_free(ref_m);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf %s", disk);
    if (system(cmd) != 0) printf("  (could not remove %s)\n", disk);
}

TEST(experts_direct_io)
{
    check_direct("qwen3moe-tiny", "w=0,0,100");
    check_direct("mixtral-tiny", "w=0,0,100 cw=bp");
}

/* The device budget sizes the expert cache (no size given), and a budget
 * that cannot hold one layer's experts is refused. */
TEST(budget_sizes_the_cache)
{
    char dir[512], disk[600];
    ft_fixture_dir("models", "qwen3moe-tiny", dir, sizeof dir);
    snprintf(disk, sizeof disk, "/tmp/ft-offload-exb-%d", (int)getpid());
    ft_load_params lp = {0};
    lp.external_layers = 1;
    int entries[2] = {0, 0};
    uint64_t budgets[2] = {0, 0};
    for (int k = 0; k < 3; k++) {
        ft_model *m = NULL;
        CHECK_OK(ft_model_load(dir, &lp, &m));
        REQUIRE(m);
        ft_offload_params p;
        ft_offload_default_params(&p);
        char spec[700];
        snprintf(spec, sizeof spec, "w=0,0,100 cw=bp disk=file:%s", disk);
        CHECK_OK(ft_policy_parse(spec, &p.policy));
        ft_offload *o = NULL;
        if (k == 0) {   /* no budget: one layer's experts; measure what is needed */
            CHECK_OK(ft_offload_create(m, dir, &p, &o));
            ft_offload_stats s;
            ft_offload_get_stats(o, &s);
            uint64_t one = 0;
            ft_offload_expert_cache(o, &entries[0], &one);
            CHECK(entries[0] == 8);
            budgets[0] = s.resident_bytes + s.slot_bytes + one * 2 - 1;   /* room for 15 experts */
            budgets[1] = s.resident_bytes + s.slot_bytes + one / 2;      /* not even one layer's */
        } else if (k == 1) {
            p.device_budget = budgets[0];
            CHECK_OK(ft_offload_create(m, dir, &p, &o));
            ft_offload_expert_cache(o, &entries[1], NULL);
            CHECK_MSG(entries[1] == 15, "%d entries", entries[1]);
        } else {
            p.device_budget = budgets[1];
            CHECK(ft_offload_create(m, dir, &p, &o) == FT_ERR_NO_SPACE && !o);
            CHECK(strstr(ft_last_error(), "expert cache") != NULL);
        }
        ft_offload_free(o);
        ft_model_free(m);
    }
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf %s", disk);
    if (system(cmd) != 0) printf("  (could not remove %s)\n", disk);
}

/* Replica failover for expert reads: only experts live on two memory
 * nodes (two replicas of every piece; the attention, norms and router
 * resident, so no layer read touches the nodes), and a node killed
 * (SIGKILL) or stalled (SIGSTOP, given up on after failover_ms) at a point
 * of the run changes no logit: the expert reads that failed on it are
 * issued again on the other replica. */
static void expert_failover(int sig, int at)
{
    char dir[512];
    ft_fixture f;
    ft_model *ref_m = NULL;
    int32_t feed[STEPS * FT_FIXTURE_MAXP];
    size_t n = 0;
    float *ref = reference("olmoe-tiny", dir, sizeof dir, &f, &ref_m, feed, &n);
    if (!ref) { ft_model_free(ref_m); return; }
    const ft_model_config *cfg = ft_model_get_config(ref_m);
    ft_status st;
    static const char *const args[] = {"--capacity", "64M", NULL};
    srv_t nd[2];
    int up = srv_start(&nd[0], "127.0.0.1:0", args) == 0;
    if (up && srv_start(&nd[1], "127.0.0.1:0", args) != 0) { srv_stop(&nd[0]); up = 0; }
    if (!up) { free(ref); ft_model_free(ref_m); ft_fixture_free(&f); REQUIRE(0); }
    ft_offload_params p;
    ft_offload_default_params(&p);
    p.stripe_min = 512;   /* every expert matrix in two pieces, one per node, each on both */
    p.failover_ms = 1000;   /* not less: a healthy node starved by a loaded machine must not time out */
    p.expert_prefetch = 0;
    char spec[512];
    snprintf(spec, sizeof spec, "w=15,0,0,85 rep=2 remote=%s,%s", nd[0].uri, nd[1].uri);
    CHECK_OK(ft_policy_parse(spec, &p.policy));
    ft_load_params lp = {0};
    lp.external_layers = 1;
    ft_model *m = NULL;
    CHECK_OK(ft_model_load(dir, &lp, &m));
    ft_offload *o = NULL;
    st = ft_offload_create(m, dir, &p, &o);
    CHECK_MSG(st == FT_OK, "%s", ft_last_error());
    if (o) {
        fault_hook fh = {o, 0, at, sig, nd[1].pid};
        g_fault = &fh;
        float *got = run(m, o, &f, feed, &st);
        g_fault = NULL;
        CHECK_MSG(st == FT_OK, "node %s at layer call %d: %s", sig == SIGKILL ? "killed" : "stalled", at,
                  ft_last_error());
        size_t diff = 0;
        for (size_t i = 0; got && i < n; i++) diff += got[i] != ref[i];
        CHECK_MSG(diff == 0, "%zu logits differ", diff);
        ft_offload_stats s;
        ft_offload_get_stats(o, &s);
        ft_expert_stats t = {0};
        for (int l = 0; l < cfg->n_layers; l++) {
            ft_expert_stats e;
            CHECK_OK(ft_offload_expert_stats(o, l, &e));
            t.misses += e.misses;
            t.resident += e.resident;
        }
        /* given up on once (a read that fails while the node is probed
         * again is not another failover) */
        CHECK(s.failovers == 1);
        CHECK(s.retries >= 1);
        CHECK(s.layers_fetched == 0);   /* every read that failed over was an expert's */
        CHECK(t.misses > 0);
        printf("  node %s at layer call %2d: %zu logits differ; %llu expert reads retried on the replica "
               "(%llu misses, %llu resident)\n", sig == SIGKILL ? "killed" : "stalled", at, diff,
               (unsigned long long)s.retries, (unsigned long long)t.misses, (unsigned long long)t.resident);
        free(got);
        ft_offload_free(o);
    }
    ft_model_free(m);
    if (sig == SIGKILL) {
        waitpid(nd[1].pid, NULL, 0);
        ft_proc_forget(nd[1].pid);
        nd[1].pid = 0;
    } else {
        kill(nd[1].pid, SIGCONT);
    }
    srv_stop(&nd[0]);
    if (nd[1].pid > 0) srv_stop(&nd[1]);
    free(ref);
    ft_model_free(ref_m);
    ft_fixture_free(&f);
}

TEST(replica_expert_node_killed)
{
    expert_failover(SIGKILL, 2);    /* during the prefill */
    expert_failover(SIGKILL, 9);    /* during decode */
}
TEST(replica_expert_node_stalled) { expert_failover(SIGSTOP, 7); }
