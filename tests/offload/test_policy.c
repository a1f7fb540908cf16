#include "ft_test.h"
#include "flextier/offload.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

TEST(parse_and_format)
{
    ft_policy p;
    ft_policy_default(&p);
    CHECK_OK(ft_policy_parse("w=0,20,30,50 c=0,100 gbs=8 ngb=4 cw=q4 cc=q4 "
                             "remote=ucx://a:7000,ucx://b:7000 disk=file:/tmp/x", &p));
    CHECK(p.w_pct[0] == 0 && p.w_pct[3] == 50 && p.c_pct[1] == 100 && p.c_pct[2] == 0);
    CHECK(p.gpu_batch_size == 8 && p.num_gpu_batches == 4);
    CHECK(p.compress_weights == FT_CODEC_Q4 && p.compress_cache == FT_CODEC_Q4);
    CHECK(p.n_remotes == 2 && !strcmp(p.remotes[1], "ucx://b:7000"));
    CHECK_OK(ft_policy_validate(&p));
    char buf[256];
    ft_policy_format(&p, buf, sizeof buf);
    CHECK(!strcmp(buf, "w=0,20,30,50 c=0,100,0,0 a=100,0,0,0 gbs=8 ngb=4 cw=q4 cc=q4"));
    ft_policy q;
    ft_policy_default(&q);
    CHECK_OK(ft_policy_parse(buf, &q));
    CHECK(!memcmp(q.w_pct, p.w_pct, sizeof p.w_pct) && q.compress_cache == FT_CODEC_Q4);
    CHECK_OK(ft_policy_parse("cw=bp", &q));
    CHECK(q.compress_weights == FT_CODEC_BYTEPLANE);
}

TEST(parse_errors_leave_policy_unchanged)
{
    static const char *bad[] = {"w=50,60", "w=abc", "w=10", "gbs=0", "ngb=x", "cw=zstd",
                                "cc=bp", "remote=tcp://x:1", "disk=/tmp", "frob=1", "w", "w=1,2,3,4,5"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ft_policy p, before;
        ft_policy_default(&p);
        before = p;
        ft_status st = ft_policy_parse(bad[i], &p);
        if (st == FT_OK) st = ft_policy_validate(&p);
        CHECK_MSG(st != FT_OK, "'%s' accepted", bad[i]);
        if (ft_policy_parse(bad[i], &p) != FT_OK) CHECK(!memcmp(&p, &before, sizeof p));
    }
    ft_policy p;
    ft_policy_default(&p);
    CHECK_OK(ft_policy_parse("w=0,0,0,100", &p));
    CHECK(ft_policy_validate(&p) == FT_ERR_INVALID_ARG);   /* no remote node */
    CHECK_OK(ft_policy_parse("a=50,50", &p));
    CHECK(ft_policy_validate(&p) != FT_OK);
}

TEST(placement_midpoint_rule)
{
    ft_policy p;
    ft_policy_default(&p);
    CHECK_OK(ft_policy_parse("w=25,25,0,50", &p));
    uint64_t bytes[4] = {100, 100, 100, 100};
    ft_tier t[4];
    ft_policy_place(&p, bytes, 4, t);
    /* midpoints 12.5, 37.5, 62.5, 87.5 % */
    CHECK(t[0] == FT_TIER_DEVICE && t[1] == FT_TIER_HOST && t[2] == FT_TIER_REMOTE && t[3] == FT_TIER_REMOTE);
    uint64_t big[3] = {10, 1000, 10};
    ft_policy_place(&p, big, 3, t);
    CHECK(t[0] == FT_TIER_DEVICE && t[1] == FT_TIER_HOST && t[2] == FT_TIER_REMOTE);
}

static void inputs(ft_cost_inputs *in)
{
    memset(in, 0, sizeof *in);
    in->n_layers = 32;
    in->layer_params = 200u << 20;
    in->weights_fmt = FT_WF_BF16;   /* 2 bytes per parameter; q4 0.5625 */
    in->kv_bytes_per_token = 2 * 4096 * 4;
    in->hidden = 4096;
    in->prompt_len = 64;
    in->gen_len = 32;
    in->flops = 1e12;
    in->mem_bw = 20e9;
    in->bw[FT_TIER_HOST] = 20e9;
    in->bw[FT_TIER_DISK] = 1e9;
    in->bw[FT_TIER_REMOTE] = 0.125e9;
    in->n_remotes = 1;
    for (int t = 0; t < FT_TIER_COUNT; t++) in->cap[t] = UINT64_MAX;
    in->decode_bw[FT_CODEC_Q4] = 8e9;
    in->decode_bw[FT_CODEC_RAW] = 10e9;
}

TEST(cost_model_link_bound_scales_with_ratio)
{
    ft_cost_inputs in;
    inputs(&in);
    ft_policy p;
    ft_policy_default(&p);
    p.n_remotes = 1;
    CHECK_OK(ft_policy_parse("w=0,0,0,100", &p));
    ft_cost_estimate raw, q4;
    ft_cost_predict(&in, &p, &raw);
    p.compress_weights = FT_CODEC_Q4;
    ft_cost_predict(&in, &p, &q4);
    CHECK(!strcmp(raw.bottleneck, "remote") && !strcmp(q4.bottleneck, "remote"));
    CHECK(fabs(q4.decode_tps / raw.decode_tps - 3.55) < 0.05);
    /* two remote nodes double the link */
    in.n_remotes = 2;
    ft_cost_estimate two;
    ft_cost_predict(&in, &p, &two);
    CHECK(fabs(two.decode_tps / q4.decode_tps - 2.0) < 0.05);
    /* all on device: compute bound, faster than any streaming */
    ft_policy_default(&p);
    ft_cost_estimate dev;
    ft_cost_predict(&in, &p, &dev);
    CHECK(!strcmp(dev.bottleneck, "compute") && dev.decode_tps > two.decode_tps);
}

TEST(planner_respects_capacity_and_prefers_compression_when_link_bound)
{
    ft_cost_inputs in;
    inputs(&in);
    ft_policy base, best;
    ft_policy_default(&base);
    ft_cost_estimate e;
    CHECK_OK(ft_plan(&in, &base, 1, 1, 0, 0, 0, &best, &e));
    CHECK(best.w_pct[FT_TIER_DEVICE] == 100);                   /* everything fits */
    /* Device budget: a quarter of the f32 weights; no host/disk tier. */
    in.cap[FT_TIER_DEVICE] = (uint64_t)in.n_layers * in.layer_params * 4 / 4;
    in.cap[FT_TIER_HOST] = 0;
    in.cap[FT_TIER_DISK] = 0;
    CHECK(ft_plan(&in, &base, 1, 1, 0, 0, 0, &best, &e) == FT_ERR_NO_SPACE);  /* no remote given */
    base.n_remotes = 1;
    snprintf(base.remotes[0], sizeof base.remotes[0], "ucx://127.0.0.1:7000");
    CHECK_OK(ft_plan(&in, &base, 1, 1, 0, 0, 0, &best, &e));
    CHECK(e.feasible && e.mem[FT_TIER_DEVICE] <= in.cap[FT_TIER_DEVICE]);
    CHECK(best.w_pct[FT_TIER_REMOTE] > 0 && best.compress_weights == FT_CODEC_RAW);
    ft_policy best_q;
    ft_cost_estimate eq;
    CHECK_OK(ft_plan(&in, &base, 1, 1, (1u << FT_CODEC_RAW) | (1u << FT_CODEC_Q4), 0, 0, &best_q, &eq));
    CHECK(best_q.compress_weights == FT_CODEC_Q4 && eq.decode_tps > 2.5 * e.decode_tps);
    /* the planner's choice is at least as good as every grid point we try */
    ft_policy p = base;
    for (int dev = 0; dev <= 20; dev += 10) {
        p.w_pct[0] = (float)dev; p.w_pct[1] = 0; p.w_pct[2] = 0; p.w_pct[3] = (float)(100 - dev);
        p.compress_weights = FT_CODEC_Q4;
        ft_cost_estimate x;
        ft_cost_predict(&in, &p, &x);
        if (x.feasible) CHECK(x.decode_tps <= eq.decode_tps * (1 + 1e-9));
    }
    /* bigger batches amortize the streamed weights */
    ft_policy b8;
    ft_cost_estimate e8;
    CHECK_OK(ft_plan(&in, &base, 8, 1, 1u << FT_CODEC_Q4, 0, 0, &b8, &e8));
    CHECK(b8.gpu_batch_size * b8.num_gpu_batches == 8 && e8.decode_tps > 4 * eq.decode_tps);
}

/* A cache that does not fit the device goes to the host, compressed when
 * the host link is the bottleneck; the cache's memory per tier follows the
 * row format (f32 rows, or q4 groups of 64 with 4 bytes of parameters). */
TEST(planner_offloads_the_cache_when_it_does_not_fit)
{
    ft_cost_inputs in;
    inputs(&in);
    in.n_layers = 4;
    in.layer_params = 8u << 20;
    in.prompt_len = 1024;
    in.gen_len = 128;
    ft_policy base, best;
    ft_policy_default(&base);
    ft_cost_estimate e;
    /* batch 32: cache 4 x 32 x 1152 x 32 KiB = 4.5 GiB f32; weights 128 MiB f32 */
    double cache = 4.0 * 32 * 1152 * (double)in.kv_bytes_per_token;
    /* 4 GiB: the device holds part of the cache plus two staging buffers
     * of one layer (2 x 1.1 GiB when all of it streams) */
    in.cap[FT_TIER_DEVICE] = 4ull << 30;
    CHECK(ft_plan(&in, &base, 32, 1, 0, 0, 0, &best, &e) == FT_ERR_NO_SPACE);   /* cache on device only */
    CHECK_OK(ft_plan(&in, &base, 32, 1, 0, 0, FT_CACHE_TIERS, &best, &e));
    CHECK(best.c_pct[FT_TIER_DEVICE] < 100 && best.c_pct[FT_TIER_HOST] > 0 && e.feasible);
    CHECK(e.mem[FT_TIER_DEVICE] <= in.cap[FT_TIER_DEVICE]);
    CHECK(fabs((double)e.mem[FT_TIER_HOST] - cache * best.c_pct[FT_TIER_HOST] / 100.0) < 1e3);
    /* with q4 allowed and a slow host link, q4 wins and holds 32/4.5 = 7.1x less */
    in.bw[FT_TIER_HOST] = 2e9;
    ft_policy bq;
    ft_cost_estimate eq;
    CHECK_OK(ft_plan(&in, &base, 32, 1, 0, (1u << FT_CODEC_RAW) | (1u << FT_CODEC_Q4), FT_CACHE_TIERS, &bq, &eq));
    CHECK(bq.compress_cache == FT_CODEC_Q4 && bq.c_pct[FT_TIER_HOST] > 0);
    CHECK(fabs((double)eq.mem[FT_TIER_HOST] - cache * bq.c_pct[FT_TIER_HOST] / 100.0 / (32.0 / 4.5)) < 1e3);
}

/* A memory node on this machine: its transfers are CPU copies that add up
 * with decoding; over a network they overlap (the link runs beside). */
TEST(cost_model_loopback_node_adds_to_decoding)
{
    ft_cost_inputs in;
    inputs(&in);
    in.bw[FT_TIER_REMOTE] = 4e9;
    in.cores = 1;
    in.compute_threads = 1;
    ft_policy p;
    ft_policy_default(&p);
    p.n_remotes = 1;
    CHECK_OK(ft_policy_parse("w=0,0,0,100", &p));
    ft_cost_estimate net, local;
    ft_cost_predict(&in, &p, &net);
    in.remote_local = 1;
    ft_cost_predict(&in, &p, &local);
    double W = (double)in.layer_params * 2;   /* bf16, verified as it arrives */
    double t_dec = W / in.decode_bw[FT_CODEC_RAW], t_link = W / in.bw[FT_TIER_REMOTE];
    /* one core: compute and the I/O worker take turns */
    CHECK(fabs(net.t_layer_decode - fmax(net.t_compute + t_dec, t_link)) < 1e-6 * net.t_layer_decode);
    CHECK(fabs(local.t_layer_decode - (local.t_compute + t_dec + t_link)) < 1e-6 * local.t_layer_decode);
    CHECK(local.decode_tps < net.decode_tps);
}

/* A fetch on this machine's cores while compute runs (issue 20): the
 * reads at the rate measured with the compute threads busy and the frames'
 * checks at the rate measured on fresh frames, busy. A loopback node and
 * the disk tier through the page cache; not a network node, not a disk
 * read past the page cache. */
TEST(cost_model_local_fetch_while_computing)
{
    for (int t = FT_TIER_DISK; t <= FT_TIER_REMOTE; t++) {
        ft_cost_inputs in;
        inputs(&in);
        in.bw[t] = 3e9;
        in.cores = 2;
        in.compute_threads = 1;
        in.decode_threads = 2;
        in.remote_local = t == FT_TIER_REMOTE;
        ft_policy p;
        ft_policy_default(&p);
        p.n_remotes = 1;
        snprintf(p.disk_uri, sizeof p.disk_uri, "/tmp");
        CHECK_OK(ft_policy_parse(t == FT_TIER_REMOTE ? "w=0,0,0,100" : "w=0,0,100,0", &p));
        ft_cost_estimate e0, e1, e2;
        ft_cost_predict(&in, &p, &e0);
        double W = (double)in.layer_params * 2;
        /* measured: the reads 1.5x slower with the cores busy, the checks
         * of fresh frames 1 ns per byte free, 4 busy */
        in.fetch_busy[t].bw_busy = 2e9;
        in.fetch_busy[t].check_free = 1e-9;
        in.fetch_busy[t].check_busy = 4e-9;
        ft_cost_predict(&in, &p, &e1);
        /* a stream of layers: the checks of one overlap the reads of the
         * next (sched.c issues them before checking): the longer counts */
        double free_s = fmax(W / 3e9, W * 1e-9), busy_s = fmax(W / 2e9, W * 4e-9);
        double want = busy_s;
        CHECK(e1.t_compute < busy_s && want > free_s);
        CHECK(fabs(e1.t_layer_decode - fmax(want, e0.t_layer_decode)) < 1e-9 * want);
        CHECK(e1.decode_tps < e0.decode_tps);
        /* faster busy than free (noise): the free rates */
        in.fetch_busy[t].bw_busy = 6e9;
        in.fetch_busy[t].check_busy = 0.5e-9;
        ft_cost_predict(&in, &p, &e2);
        CHECK(fabs(e2.t_layer_decode - fmax(free_s, e0.t_layer_decode)) < 1e-9 * free_s);
        /* not on this machine's cores: the busy rates are not used */
        if (t == FT_TIER_REMOTE) in.remote_local = 0;
        else in.disk_direct = 1;
        ft_cost_predict(&in, &p, &e1);
        memset(&in.fetch_busy, 0, sizeof in.fetch_busy);
        ft_cost_predict(&in, &p, &e2);
        CHECK(e1.t_layer_decode == e2.t_layer_decode);
    }
}

/* The disk tier through the page cache: the kernel's copies run on the
 * store's reading threads, then the checks on the I/O workers, and the
 * cores are shared fairly with the compute thread (it does not keep its
 * core while they run). 2 cores, 1 compute thread, 4 readers, 2 workers. */
TEST(cost_model_page_cache_copies_share_the_cores)
{
    ft_cost_inputs in;
    inputs(&in);
    in.cores = 2;
    in.compute_threads = 1;
    in.decode_threads = 2;
    in.n_tensors = 4;   /* a layer of 4 tensors, bf16 */
    for (int k = 0; k < 4; k++) in.tensor_bytes[FT_CODEC_RAW][k] = in.layer_params / 2;
    in.bw[FT_TIER_DISK] = 1e12;   /* the reads' wall time: negligible */
    ft_policy p;
    ft_policy_default(&p);
    strcpy(p.disk_uri, "file:/tmp/x");
    CHECK_OK(ft_policy_parse("w=0,0,100,0", &p));
    ft_cost_estimate e0, e;
    ft_cost_predict(&in, &p, &e0);
    double C = e0.t_compute, W = (double)in.layer_params * 2;
    REQUIRE(C > 0);
    /* the checks: a fifth of the compute's time per worker */
    in.decode_bw[FT_CODEC_RAW] = W / (0.4 * C);
    double K = W / in.decode_bw[FT_CODEC_RAW] / 2;
    ft_cost_predict(&in, &p, &e0);
    CHECK(fabs(e0.t_layer_decode - C) < 1e-9 * C);   /* the bound before: compute keeps its core */
    /* the copies: half the compute's time in CPU seconds */
    in.disk_cpu_per_byte = 0.5 * C / W;
    ft_cost_predict(&in, &p, &e);
    /* 5 threads: a share of 2/5 until the copies are done (4 threads of
     * C/8 each), then 3 (2/3) until the checks are, then compute alone */
    double t1 = (C / 8) / 0.4, p1 = t1 * 0.4, t2 = K / (2.0 / 3), p2 = K;
    REQUIRE(C > p1 + p2);
    double want = t1 + t2 + (C - p1 - p2);
    CHECK_MSG(fabs(e.t_layer_decode - want) < 1e-9 * want, "layer %.6g ms, want %.6g", 1e3 * e.t_layer_decode,
              1e3 * want);
    CHECK(e.t_layer_decode > e0.t_layer_decode);
    /* read past the page cache: the disk works beside the cores, not this */
    in.disk_direct = 1;
    ft_cost_predict(&in, &p, &e);
    CHECK(e.t_layer_decode < want);
}

/* A memory node on this machine copies on two cores (its pool on the
 * shared-memory path; sender and receiver on TCP): the link probe's time
 * is two cores' work in the CPU budget the step shares with compute. */
TEST(cost_model_local_node_copies_on_two_cores)
{
    ft_cost_inputs in;
    inputs(&in);
    in.cores = 2;
    in.compute_threads = 2;
    in.decode_threads = 1;
    in.remote_local = 1;
    in.bw[FT_TIER_REMOTE] = 3e9;
    ft_policy p;
    ft_policy_default(&p);
    p.n_remotes = 1;
    CHECK_OK(ft_policy_parse("w=0,0,0,100", &p));
    ft_cost_estimate e;
    ft_cost_predict(&in, &p, &e);
    REQUIRE(e.t_compute > 0 && e.t_link[FT_TIER_REMOTE] > 0);
    /* the link as long as compute: the cores' budget binds */
    in.bw[FT_TIER_REMOTE] *= e.t_link[FT_TIER_REMOTE] / e.t_compute;
    ft_cost_predict(&in, &p, &e);
    double tc = e.t_compute, td = e.t_decode, tl = e.t_link[FT_TIER_REMOTE];
    CHECK(fabs(tl - tc) < 1e-9 * tc);
    double want = (2 * tc + (td + tl) + tl) / 2;
    CHECK_MSG(fabs(e.t_layer_decode - want) < 1e-9 * want, "layer %.6g ms, want %.6g", 1e3 * e.t_layer_decode,
              1e3 * want);
    /* one core: the node's copies and compute take turns on it as before */
    in.cores = 1;
    in.compute_threads = 1;
    ft_cost_predict(&in, &p, &e);
    want = e.t_compute + e.t_decode + e.t_link[FT_TIER_REMOTE];
    CHECK(fabs(e.t_layer_decode - want) < 1e-9 * want);
}

/* A codec agent (agent://) decodes the remote byte-plane weights on its
 * own core: the compute core no longer pays for it, the agent's core is a
 * resource of its own beside compute and the link. (q8/q4 and raw frames
 * are computed on in place: only their checksums are checked here.) */
TEST(cost_model_agent_takes_decoding_off_the_compute_cores)
{
    ft_cost_inputs in;
    inputs(&in);
    in.bw[FT_TIER_REMOTE] = 40e9;          /* a fast link: decoding matters */
    in.decode_bw[FT_CODEC_BYTEPLANE] = 1e9;
    in.ratio[FT_CODEC_BYTEPLANE] = 1.5;
    in.cores = 1;
    in.compute_threads = 1;
    ft_policy p;
    ft_policy_default(&p);
    p.n_remotes = 1;
    CHECK_OK(ft_policy_parse("w=0,0,0,100 cw=bp", &p));
    ft_cost_estimate self, agent;
    ft_cost_predict(&in, &p, &self);
    in.agent_cores = 1;
    ft_cost_predict(&in, &p, &agent);
    double W = (double)in.layer_params * 2;   /* bf16 as computed on */
    double t_dec = W / in.decode_bw[FT_CODEC_BYTEPLANE];
    double t_link = W / 1.5 / in.bw[FT_TIER_REMOTE];
    CHECK(fabs(self.t_layer_decode - fmax(self.t_compute + t_dec, t_link)) < 1e-6 * self.t_layer_decode);
    CHECK(fabs(agent.t_layer_decode - fmax(fmax(agent.t_compute, t_dec), t_link)) < 1e-6 * agent.t_layer_decode);
    CHECK(agent.t_decode < 1e-12 && agent.decode_tps > self.decode_tps);
    /* a slow agent is the bottleneck; two agent cores halve its time */
    in.decode_bw[FT_CODEC_BYTEPLANE] = 0.1e9;
    ft_cost_predict(&in, &p, &agent);
    CHECK(!strcmp(agent.bottleneck, "agent"));
    in.agent_cores = 2;
    ft_cost_estimate two;
    ft_cost_predict(&in, &p, &two);
    CHECK(fabs(agent.t_layer_decode / two.t_layer_decode - 2.0) < 0.05);
}

/* Mixtures of experts (issue 23): a decode step reads the dense part and,
 * of the experts, those its rows select (1 - (1 - k/E)^B of them under
 * uniform routing), streamed ones missing the expert cache
 * (hit = cache / streamed experts). */
TEST(cost_model_experts)
{
    ft_cost_inputs in;
    inputs(&in);
    in.n_tensors = 2;
    for (int c = 0; c < FT_CODEC_COUNT; c++) {
        in.tensor_bytes[c][0] = in.tensor_bytes[c][1] = 1u << 20;
        in.expert_bytes[c] = 3u << 20;
    }
    in.n_experts = 64;
    in.experts_used = 8;
    ft_policy p;
    ft_policy_default(&p);
    CHECK_OK(ft_policy_parse("w=0,0,100", &p));
    ft_cost_estimate e1, e2, e3;
    ft_cost_predict(&in, &p, &e1);
    double want = 64.0 * (3u << 20) * (8.0 / 64) * (1 - 1.0 / 32);
    CHECK_MSG(fabs(e1.expert_hit - 1.0 / 32) < 1e-12 && fabs(e1.expert_fetch_bytes - want) < 1e-3 * want,
              "hit %g, fetch %g (want %g)", e1.expert_hit, e1.expert_fetch_bytes, want);
    CHECK(e1.expert_cache_mem == 64.0 * (3u << 20));
    in.expert_cache = 32 * 64;   /* every expert cached: nothing read after the first use */
    ft_cost_predict(&in, &p, &e2);
    CHECK(e2.expert_hit == 1.0 && e2.expert_fetch_bytes == 0 && e2.decode_tps > e1.decode_tps);
    in.expert_cache = 0;
    in.expert_hit_rate = 0.9;     /* a measured rate replaces the uniform estimate */
    ft_cost_predict(&in, &p, &e2);
    double want9 = 64.0 * (3u << 20) * (8.0 / 64) * (1 - 0.9);
    CHECK_MSG(fabs(e2.expert_hit - 0.9) < 1e-12 && fabs(e2.expert_fetch_bytes - want9) < 1e-3 * want9,
              "hit %g, fetch %g (want %g)", e2.expert_hit, e2.expert_fetch_bytes, want9);
    CHECK(e2.decode_tps >= e1.decode_tps);
    in.expert_hit_rate = 0;
    p.gpu_batch_size = 32;        /* 32 rows select almost every expert */
    ft_cost_predict(&in, &p, &e3);
    double act = 1 - pow(56.0 / 64, 32);
    CHECK(fabs(e3.expert_fetch_bytes / (64.0 * (3u << 20) * (1 - 1.0 / 32)) - act) < 1e-9);
    /* the tiers hold every expert, whatever is read */
    CHECK(e1.mem[FT_TIER_DISK] >= (uint64_t)32 * (64ull * (3u << 20) + (2u << 20)));
}

TEST(cost_inputs_of_an_moe_model)
{
    char dir[512];
    const char *data = getenv("FT_TEST_DATA");
    snprintf(dir, sizeof dir, "%s/models/qwen3moe-tiny", data ? data : "tests/data");
    ft_load_params lp = {0};
    lp.external_layers = 1;
    ft_model *m = NULL;
    CHECK_OK(ft_model_load(dir, &lp, &m));
    REQUIRE(m);
    ft_cost_inputs in;
    memset(&in, 0, sizeof in);
    CHECK_OK(ft_cost_inputs_from_model(m, &in));
    /* layer 0 (sparse): norms, q/k/v/o (kv 16 wide), q/k norms, router; 8 experts of 3 x 32 x 32 f32,
     * 2 of them active */
    CHECK(in.n_experts == 8 && in.experts_used == 2 && in.n_tensors == 9);
    CHECK(in.expert_bytes[FT_CODEC_RAW] == 3 * 32 * 32 * 4);
    CHECK(in.layer_params == 2 * 32 * 32 + 2 * 16 * 32 + 2 * 32 + 2 * 8 + 8 * 32 + 2 * 3 * 32 * 32);
    ft_model_free(m);
}

/* A memory budget for the whole process (issue 20): the device and host
 * tiers together, plus the page cache of one layer's disk reads, stay
 * within proc_cap; what does not fit goes to disk. */
TEST(planner_bounds_device_and_host_by_the_process_budget)
{
    ft_cost_inputs in;
    inputs(&in);
    ft_policy base, best;
    ft_policy_default(&base);
    snprintf(base.disk_uri, sizeof base.disk_uri, "file:/nonexistent");
    in.bw[FT_TIER_DISK] = 1e9;
    in.cap[FT_TIER_HOST] = UINT64_MAX;
    in.cap[FT_TIER_DISK] = UINT64_MAX;
    double W = (double)in.n_layers * (double)in.layer_params * 2;   /* bf16 weights */
    in.proc_cap = (uint64_t)(W * 0.5);
    ft_cost_estimate e;
    CHECK_OK(ft_plan(&in, &base, 1, 1, 0, 0, FT_CACHE_TIERS, &best, &e));
    CHECK(e.feasible && e.mem_process <= in.proc_cap);
    CHECK(e.mem[FT_TIER_DEVICE] + e.mem[FT_TIER_HOST] <= in.proc_cap);
    CHECK(best.w_pct[FT_TIER_DISK] >= 50);
    /* without the bound the same inputs keep everything in memory */
    in.proc_cap = 0;
    CHECK_OK(ft_plan(&in, &base, 1, 1, 0, 0, FT_CACHE_TIERS, &best, &e));
    CHECK(best.w_pct[FT_TIER_DISK] == 0);
    /* a bound below two layer slots fits nothing: refused with the numbers */
    in.proc_cap = (uint64_t)(in.layer_params * 2);   /* one layer */
    CHECK(ft_plan(&in, &base, 1, 1, 0, 0, FT_CACHE_TIERS, &best, &e) == FT_ERR_NO_SPACE);
    CHECK(strstr(ft_last_error(), "memory budget leaves") != NULL);
}

/* Calibration timed under one load, planned under another (issue 20):
 * every CPU term slows by the same factor, the links that are devices do
 * not; a compute-bound prediction scales exactly, a device-bound one not
 * at all. */
TEST(cost_rescale_cpu_scales_cpu_terms_only)
{
    ft_cost_inputs in;
    inputs(&in);
    in.timing[FT_CODEC_RAW].batch[0] = 1;
    in.timing[FT_CODEC_RAW].batch[1] = 16;
    in.timing[FT_CODEC_RAW].layer_decode_s[0] = 0.01;
    in.timing[FT_CODEC_RAW].layer_decode_s[1] = 0.02;
    in.timing[FT_CODEC_RAW].fixed_decode_s[0] = 0.03;
    in.timing[FT_CODEC_RAW].fixed_decode_s[1] = 0.04;
    in.timing[FT_CODEC_RAW].layer_prefill_s_per_token = 0.001;
    in.disk_direct = 1;
    ft_cost_inputs k = in;
    ft_cost_rescale_cpu(&k, 2.5);
    CHECK(fabs(k.timing[FT_CODEC_RAW].layer_decode_s[1] - 0.05) < 1e-12);
    CHECK(fabs(k.timing[FT_CODEC_RAW].fixed_decode_s[0] - 0.075) < 1e-12);
    CHECK(fabs(k.timing[FT_CODEC_RAW].layer_prefill_s_per_token - 0.0025) < 1e-12);
    CHECK(fabs(k.mem_bw - 8e9) < 1 && fabs(k.decode_bw[FT_CODEC_Q4] - 3.2e9) < 1 && fabs(k.flops - 4e11) < 1);
    CHECK(k.bw[FT_TIER_DISK] == in.bw[FT_TIER_DISK]);       /* past the page cache: the device's */
    CHECK(k.bw[FT_TIER_REMOTE] == in.bw[FT_TIER_REMOTE]);   /* measured at every plan */
    in.disk_direct = 0;
    k = in;
    ft_cost_rescale_cpu(&k, 2.0);
    CHECK(k.bw[FT_TIER_DISK] == in.bw[FT_TIER_DISK]);       /* through the page cache: measured per plan */
    /* no-ops */
    ft_cost_inputs z = in;
    ft_cost_rescale_cpu(&z, 0);
    ft_cost_rescale_cpu(&z, -1);
    ft_cost_rescale_cpu(&z, NAN);
    ft_cost_rescale_cpu(&z, 1.0);
    CHECK(!memcmp(&z, &in, sizeof z));
    /* in memory, compute bound: tok/s divided by exactly k */
    ft_policy p;
    ft_policy_default(&p);
    p.gpu_batch_size = 16;
    ft_cost_estimate a, b;
    ft_cost_predict(&in, &p, &a);
    k = in;
    ft_cost_rescale_cpu(&k, 2.0);
    ft_cost_predict(&k, &p, &b);
    CHECK(fabs(a.decode_tps / b.decode_tps - 2.0) < 1e-9);
    /* every weight past the page cache on a slow disk: the disk's time */
    CHECK_OK(ft_policy_parse("w=0,0,100,0", &p));
    in.disk_direct = 1;
    in.bw[FT_TIER_DISK] = 1e8;
    k = in;
    ft_cost_rescale_cpu(&k, 2.0);
    ft_cost_predict(&in, &p, &a);
    ft_cost_predict(&k, &p, &b);
    CHECK(!strcmp(a.bottleneck, "disk") && !strcmp(b.bottleneck, "disk"));
    CHECK(fabs(a.t_layer_decode - b.t_layer_decode) < 1e-12);
}

/* The engine's times from the hooks' layer time and the steps' totals:
 * fixed = total - 2 x layer at V1, extrapolated linearly in the
 * vocabulary through one layer's step at V2. */
TEST(cost_timing_fit_from_layer_hooks)
{
    ft_cost_timing t;
    memset(&t, 0, sizeof t);
    const double layer[2] = {0.010, 0.030}, tot[2] = {0.025, 0.070}, totv2[2] = {0.020, 0.050};
    /* V1 = 1024, V2 = 8192, V = 32000: k = (32000 - 1024) / (8192 - 1024) */
    double k = (32000.0 - 1024) / (8192 - 1024);
    ft_cost_timing_fit(layer, tot, totv2, k, &t);
    CHECK(fabs(t.layer_decode_s[0] - 0.010) < 1e-12 && fabs(t.layer_decode_s[1] - 0.030) < 1e-12);
    /* batch 1: f(V1) = 0.005, f(V2) = 0.010 */
    CHECK(fabs(t.fixed_decode_s[0] - (0.005 + k * 0.005)) < 1e-12);
    /* batch 16: f(V1) = 0.010, f(V2) = 0.020 */
    CHECK(fabs(t.fixed_decode_s[1] - (0.010 + k * 0.010)) < 1e-12);
    /* no second vocabulary: the fixed part at V1 */
    const double none[2] = {0, 0};
    ft_cost_timing_fit(layer, tot, none, 0, &t);
    CHECK(fabs(t.fixed_decode_s[0] - 0.005) < 1e-12 && fabs(t.fixed_decode_s[1] - 0.010) < 1e-12);
    /* noise never makes a time negative */
    const double big[2] = {0.5, 0.5}, neg[2] = {-1, -1};
    ft_cost_timing_fit(big, tot, none, 0, &t);
    CHECK(t.fixed_decode_s[0] == 0 && t.fixed_decode_s[1] == 0);
    ft_cost_timing_fit(neg, tot, none, 0, &t);
    CHECK(t.layer_decode_s[0] == 0 && fabs(t.fixed_decode_s[0] - 0.025) < 1e-12);
}

/* Far past the measured span (k > 8) the head's rows cost a layer's time
 * per parameter, whatever the second copy's noisy total says; within it,
 * the measured difference as before. */
TEST(cost_timing_fit_head_far_extrapolation)
{
    ft_cost_timing a, b, c;
    const double layer[2] = {0.002, 0.004}, tot[2] = {0.0050, 0.0100};
    /* V1 = 1024, V2 = 2048, V = 32000 (a memory bound): k = 30.25; edim
     * 2048, a layer of 45M parameters: span = 2048 x 1024 / 45M */
    double k = (32000.0 - 1024) / (2048 - 1024), span = 2048.0 * 1024 / 45e6;
    const double noisy_lo[2] = {0.0029, 0.0059}, noisy_hi[2] = {0.0035, 0.0069};
    ft_cost_timing_fit_head(layer, NULL, tot, noisy_lo, k, span, &a);
    ft_cost_timing_fit_head(layer, NULL, tot, noisy_hi, k, span, &b);
    for (int j = 0; j < 2; j++) {
        double f1 = tot[j] - 2 * layer[j];
        double want = f1 + k * layer[j] * span;   /* (V - V1) rows at the layer's cost per parameter */
        CHECK(fabs(a.fixed_decode_s[j] - want) < 1e-12 && fabs(b.fixed_decode_s[j] - want) < 1e-12);
        CHECK(a.layer_decode_s[j] == layer[j]);
    }
    /* the plain fit swings with the noise: 0 (clamped) and 2x the above */
    ft_cost_timing_fit(layer, tot, noisy_lo, k, &c);
    CHECK(c.fixed_decode_s[0] == 0);
    ft_cost_timing_fit(layer, tot, noisy_hi, k, &c);
    CHECK(c.fixed_decode_s[0] > 1.5 * a.fixed_decode_s[0]);
    /* within 8x: the measured difference */
    double k4 = (8192.0 - 1024) / (2048 - 1024);
    ft_cost_timing_fit_head(layer, NULL, tot, noisy_hi, k4, span, &a);
    ft_cost_timing_fit(layer, tot, noisy_hi, k4, &b);
    CHECK(a.fixed_decode_s[0] == b.fixed_decode_s[0] && a.fixed_decode_s[1] == b.fixed_decode_s[1]);
    /* q4 layers beside a bf16 head: the head's rows at a bf16 layer's cost
     * per parameter, the layers at their own (the q4 layer's cost put the
     * h1024 Llama's head at 2.7 ms where it takes 6-7) */
    const double bf16_layer[2] = {0.005, 0.011};
    ft_cost_timing_fit_head(layer, bf16_layer, tot, noisy_lo, k, span, &a);
    for (int j = 0; j < 2; j++) {
        double f1 = tot[j] - 2 * layer[j];
        CHECK(fabs(a.fixed_decode_s[j] - (f1 + k * bf16_layer[j] * span)) < 1e-12);
        CHECK(a.layer_decode_s[j] == layer[j]);
    }
    ft_cost_timing_fit_head(layer, bf16_layer, tot, noisy_hi, k4, span, &c);   /* within 8x: measured */
    CHECK(c.fixed_decode_s[0] == b.fixed_decode_s[0]);
}

/* Streamed from DRAM, a step is no faster than its bytes at the read
 * bandwidth (issue 20: timed on copies in the cache, the h1024 model's q4
 * step was predicted at 570-684 tok/s where it ran at 285-292). */
TEST(cost_timing_floor_at_the_read_bandwidth)
{
    ft_cost_timing t;
    memset(&t, 0, sizeof t);
    t.layer_decode_s[0] = 0.0001; t.layer_decode_s[1] = 0.004;
    t.fixed_decode_s[0] = 0.0005; t.fixed_decode_s[1] = 0.003;
    /* 5.8 MB layers and a 65.5 MB head at 33 GB/s: 0.176 ms and 1.98 ms */
    ft_cost_timing_floor(&t, 5.8e6, 65.5e6, 33e9);
    CHECK(fabs(t.layer_decode_s[0] - 5.8e6 / 33e9) < 1e-12);
    CHECK(fabs(t.fixed_decode_s[0] - 65.5e6 / 33e9) < 1e-12);
    CHECK(t.layer_decode_s[1] == 0.004 && t.fixed_decode_s[1] == 0.003);   /* slower already: kept */
    ft_cost_timing u = t;
    ft_cost_timing_floor(&t, 1e12, 1e12, 0);              /* no bandwidth: unchanged */
    ft_cost_timing_floor(&t, 1e12, 1e12, NAN);
    CHECK(!memcmp(&t, &u, sizeof t));
}

static double thread_cpu(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* A read of every byte at the C library's vector speed: memchr for a
 * byte the buffer does not hold. */
static double read_once(const uint8_t *p, size_t n, uint64_t *sink)
{
    double t0 = thread_cpu();
    const void *q = memchr(p, 0xab, n);
    double t = thread_cpu() - t0;
    *sink += q ? 1 : 2;
    return t;
}

/* Calibration's cache flush really evicts: a buffer that fits the L2
 * (768 KiB) read again at once comes from the cache; flushed first, from
 * DRAM, several times slower (medians of 15 reads in CPU time). */
TEST(calib_flush_evicts_from_the_caches)
{
    if (!ft_calib_flush(NULL, 0)) return;   /* no flush instruction in this build */
    size_t bytes = 768u << 10;
    uint8_t *p = malloc(bytes);
    uint64_t sink = 0;
    CHECK(p != NULL);
    if (!p) return;
    memset(p, 1, bytes);
    double hot[15], cold[15];
    for (int r = 0; r < 15; r++) {
        read_once(p, bytes, &sink);
        hot[r] = read_once(p, bytes, &sink);
        CHECK(ft_calib_flush(p, bytes) == 1);
        cold[r] = read_once(p, bytes, &sink);
    }
    qsort(hot, 15, sizeof *hot, cmp_d);
    qsort(cold, 15, sizeof *cold, cmp_d);
    CHECK(sink != 0);
    CHECK(cold[7] > 1.5 * hot[7]);
    if (!(cold[7] > 1.5 * hot[7])) printf("hot %.1f us, flushed %.1f us\n", 1e6 * hot[7], 1e6 * cold[7]);
    free(p);
}

/* A thread woken to compute on another core, as the engine's pool
 * workers are for each timed step (they sleep while the caller flushes
 * the caches): ft_calib_clock counts its CPU time as it runs. The process
 * clock counts such a thread only as of its core's next scheduler tick,
 * which a few ms of work may not reach: the worker's share of 1 ms layers
 * went uncounted in most steps, and the q4 rows were predicted 1.4-2x too
 * fast. Each round the thread sleeps, is woken, does ~1.5 ms of work (a
 * loop sized by its CPU time first; it reads no clock while it works:
 * reading its own CPU clock would bring the process clock up to date)
 * and spins on until read. Of the interval read, the caller's own CPU
 * time is taken out; the rest is the thread's, about its work's CPU time
 * whether or not a loaded machine preempts it. */
typedef struct {
    atomic_int phase;   /* 0 asleep, 1 woken, 2 done (spinning), 3 read, 9 stop */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t iters;     /* one round's work                                */
    double work_s;      /* its CPU time, measured before the rounds        */
} spin_arg;

static uint64_t spin_work(uint64_t n)
{
    volatile uint64_t x = 0;
    for (uint64_t i = 0; i < n; i++) x += i * i;
    return x;
}

static void *spinner(void *a)
{
    spin_arg *s = a;
    /* size one round's work at ~1.5 ms of this thread's CPU */
    uint64_t n = 1u << 16;
    for (;;) {
        double t0 = thread_cpu();
        spin_work(n);
        double t = thread_cpu() - t0;
        if (t >= 1.5e-3 || n >= (1ull << 40)) {
            s->iters = n;
            /* the least of 3: one slow measurement (another process on
             * this core) made every round look undercounted */
            s->work_s = INFINITY;
            for (int k = 0; k < 3; k++) {
                t0 = thread_cpu();
                spin_work(n);
                s->work_s = fmin(s->work_s, thread_cpu() - t0);
            }
            break;
        }
        n = t > 1e-4 ? (uint64_t)((double)n * 1.6e-3 / t) : n * 8;
    }
    atomic_store(&s->phase, 0);
    for (;;) {
        pthread_mutex_lock(&s->mu);
        while (atomic_load(&s->phase) != 1 && atomic_load(&s->phase) != 9) pthread_cond_wait(&s->cv, &s->mu);
        pthread_mutex_unlock(&s->mu);
        if (atomic_load(&s->phase) == 9) return NULL;
        spin_work(s->iters);
        atomic_store(&s->phase, 2);
        while (atomic_load(&s->phase) != 3) {}
        atomic_store(&s->phase, 0);
    }
}

static void spin_set(spin_arg *s, int phase)
{
    pthread_mutex_lock(&s->mu);
    atomic_store(&s->phase, phase);
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

TEST(calib_clock_counts_woken_threads)
{
    spin_arg s;
    atomic_init(&s.phase, -1);
    pthread_mutex_init(&s.mu, NULL);
    pthread_cond_init(&s.cv, NULL);
    s.iters = 0;
    s.work_s = 0;
    pthread_t th;
    CHECK(pthread_create(&th, NULL, spinner, &s) == 0);
    while (atomic_load(&s.phase) != 0) {   /* the work is sized (not beside a spinning caller) */
        struct timespec nap = {0, 1000000};
        nanosleep(&nap, NULL);
    }
    ft_calib_clock c;
    ft_calib_clock_init(&c);   /* the thread exists */
    int ok = 0;
    for (int r = 0; r < 10; r++) {
        struct timespec nap = {0, 3000000};
        nanosleep(&nap, NULL);                      /* the thread sleeps meanwhile */
        double m0 = thread_cpu(), c0 = ft_calib_clock_now(&c);
        spin_set(&s, 1);
        while (atomic_load(&s.phase) != 2) {}
        double c1 = ft_calib_clock_now(&c), m1 = thread_cpu();
        atomic_store(&s.phase, 3);
        while (atomic_load(&s.phase) != 0) {}
        double other = (c1 - c0) - (m1 - m0);
        if (other >= 0.8 * s.work_s) ok++;
        else printf("round %d: the woken thread's %.3f ms of work counted as %.3f ms\n", r, 1e3 * s.work_s,
                    1e3 * other);
    }
    spin_set(&s, 9);
    pthread_join(th, NULL);
    pthread_mutex_destroy(&s.mu);
    pthread_cond_destroy(&s.cv);
#if defined(__linux__)
    CHECK(c.n >= 2);
    CHECK(s.work_s > 0);
    CHECK(ok >= 8);
#else
    CHECK(ok >= 0);
#endif
}

/* The hand-off between the I/O and compute threads (issue 20): once per
 * streamed layer where the I/O side is the longer; nothing in memory or
 * where compute hides it. */
TEST(cost_model_handoff_per_streamed_layer)
{
    ft_cost_inputs in;
    inputs(&in);
    in.cores = 2;
    in.compute_threads = 1;
    in.decode_threads = 1;
    ft_policy p;
    ft_policy_default(&p);
    ft_cost_estimate a, b;
    ft_cost_predict(&in, &p, &a);
    in.handoff_s = 0.004;
    ft_cost_predict(&in, &p, &b);
    CHECK(a.t_layer_decode == b.t_layer_decode);   /* in memory: no hand-off */
    /* link bound (a memory node over 1 Gbit/s): + one hand-off per layer */
    p.n_remotes = 1;
    CHECK_OK(ft_policy_parse("w=0,0,0,100", &p));
    in.handoff_s = 0;
    ft_cost_predict(&in, &p, &a);
    in.handoff_s = 0.004;
    ft_cost_predict(&in, &p, &b);
    CHECK(!strcmp(a.bottleneck, "remote"));
    CHECK(fabs(b.t_layer_decode - a.t_layer_decode - 0.004) < 1e-12);
    /* compute bound with a fast host tier: a hand-off shorter than the
     * slack costs nothing */
    CHECK_OK(ft_policy_parse("w=0,100,0,0", &p));
    in.flops = 1e9;   /* slow compute */
    in.handoff_s = 0;
    ft_cost_predict(&in, &p, &a);
    in.handoff_s = 1e-6;
    ft_cost_predict(&in, &p, &b);
    CHECK(a.t_layer_decode == b.t_layer_decode);
}

/* The KV cache's per-request costs (issue 20): per layer and decode step,
 * each sequence on a memory node costs its full chunks' reads (and a put
 * per chunk filled) at remote_req_s each, each sequence on the disk tier
 * two reads and two writes (K and V); on top of their bytes, and nothing
 * for a cache on the device. */
TEST(cost_model_kv_cache_requests)
{
    ft_cost_inputs in;
    inputs(&in);
    in.prompt_len = 256;
    in.gen_len = 32;   /* 272 tokens on average: 4 full chunks of 64 */
    in.cores = 2;
    in.compute_threads = 1;
    ft_policy p;
    ft_policy_default(&p);
    p.n_remotes = 1;
    p.gpu_batch_size = 8;
    ft_cost_estimate a, b;
    /* a network node, link bound */
    CHECK_OK(ft_policy_parse("w=100,0,0,0 c=0,0,0,100", &p));
    ft_cost_predict(&in, &p, &a);
    CHECK(a.t_kv_req[FT_TIER_REMOTE] == 0);
    in.remote_req_s = 1e-3;
    ft_cost_predict(&in, &p, &b);
    double want = 8 * (4 + 1.0 / 64) * 1e-3;
    CHECK(fabs(b.t_kv_req[FT_TIER_REMOTE] - want) < 1e-12);
    CHECK(fabs(b.t_link[FT_TIER_REMOTE] - a.t_link[FT_TIER_REMOTE] - want) < 1e-12);
    CHECK(!strcmp(b.bottleneck, "remote"));
    CHECK(fabs(b.t_layer_decode - a.t_layer_decode - want) < 1e-12);
    /* half the sequences there: half the requests; 128 chunk tokens: 2 */
    CHECK_OK(ft_policy_parse("c=50,0,0,50", &p));
    in.kv_chunk_tokens = 128;
    ft_cost_predict(&in, &p, &b);
    CHECK(fabs(b.t_kv_req[FT_TIER_REMOTE] - 4 * (2 + 1.0 / 128) * 1e-3) < 1e-12);
    in.kv_chunk_tokens = 0;
    /* the disk tier, read past the page cache: 2 reads + 2 writes each */
    p.n_remotes = 0;
    CHECK_OK(ft_policy_parse("w=100,0,0,0 c=0,0,100,0", &p));
    strcpy(p.disk_uri, "file:/tmp/x");
    in.disk_direct = 1;
    ft_cost_predict(&in, &p, &a);
    in.disk_read_req_s = 1e-4;
    in.disk_write_req_s = 5e-4;
    ft_cost_predict(&in, &p, &b);
    want = 8 * 2 * 6e-4;
    CHECK(fabs(b.t_kv_req[FT_TIER_DISK] - want) < 1e-12);
    CHECK(!strcmp(b.bottleneck, "disk"));
    CHECK(fabs(b.t_layer_decode - a.t_layer_decode - want) < 1e-12);
    CHECK(b.decode_tps < a.decode_tps);
    /* the cache on the device: no requests whatever their cost */
    CHECK_OK(ft_policy_parse("c=100,0,0,0", &p));
    ft_cost_predict(&in, &p, &b);
    CHECK(b.t_kv_req[FT_TIER_DISK] == 0 && b.t_kv_req[FT_TIER_REMOTE] == 0);
}

/* The disk tier read past the page cache (a budget) is read through it:
 * the kernel's copy to the slot is CPU work of the reading threads, which
 * the model adds to the I/O work on the cores at the probe's measured CPU
 * per byte (rescaled with the CPU share), a memory copy without one; a
 * disk read through the page cache is a copy already (link[DISK]). */
TEST(cost_model_disk_reads_cost_cpu)
{
    ft_cost_inputs in;
    inputs(&in);
    in.cores = 1;
    in.compute_threads = 1;
    in.decode_threads = 1;
    in.bw[FT_TIER_DISK] = 1e12;   /* the device is not the bottleneck */
    in.disk_direct = 1;
    ft_policy p;
    ft_policy_default(&p);
    CHECK_OK(ft_policy_parse("w=0,0,100,0", &p));
    strcpy(p.disk_uri, "file:/tmp/x");
    in.bw[FT_TIER_HOST] = 0;   /* no copy rate, no CPU figure: nothing added */
    ft_cost_estimate a, b, c;
    ft_cost_predict(&in, &p, &a);
    in.disk_cpu_per_byte = 0.5e-9;
    ft_cost_predict(&in, &p, &b);
    double W = (double)in.layer_params * 2;   /* bf16 */
    /* one core: compute, verification and the copy one after the other */
    CHECK(fabs(b.t_layer_decode - a.t_layer_decode - W * 0.5e-9) < 1e-9 * b.t_layer_decode);
    /* under twice the load the CPU per byte doubles */
    ft_cost_inputs h = in;
    ft_cost_rescale_cpu(&h, 2.0);
    CHECK(fabs(h.disk_cpu_per_byte - 1e-9) < 1e-21);
    /* without the CPU figure: a copy at bw[HOST] */
    in.disk_cpu_per_byte = 0;
    in.bw[FT_TIER_HOST] = 4e9;
    ft_cost_predict(&in, &p, &c);
    CHECK(fabs(c.t_layer_decode - a.t_layer_decode - W / 4e9) < 1e-9 * c.t_layer_decode);
    /* through the page cache the disk "link" is the copy: counted once,
     * by its CPU time where measured (one core: in turn with compute) */
    in.disk_direct = 0;
    in.disk_cpu_per_byte = 0.5e-9;
    ft_cost_predict(&in, &p, &b);
    in.disk_cpu_per_byte = 0;
    ft_cost_predict(&in, &p, &c);
    double link = W / in.bw[FT_TIER_DISK];
    CHECK_MSG(fabs(b.t_layer_decode - (c.t_layer_decode - link + W * 0.5e-9)) < 1e-9 * b.t_layer_decode,
              "%.9g %.9g %.9g %.9g", b.t_layer_decode, c.t_layer_decode, link, W * 0.5e-9);
}

/* A streamed LM head (issue 20) costs its bytes at the checkpoint's
 * measured read rate; without one, the disk tier's; the memory bandwidth
 * only when neither was measured. */
TEST(cost_model_streamed_head_read_rate)
{
    ft_cost_inputs in;
    inputs(&in);
    ft_policy p;
    ft_policy_default(&p);
    ft_cost_estimate a, b;
    ft_cost_predict(&in, &p, &a);
    in.head_stream_bytes = 64u << 20;
    in.bw[FT_TIER_DISK] = 0;
    ft_cost_predict(&in, &p, &b);   /* memory bandwidth: 20e9 */
    double step_a = 1.0 / a.decode_tps, step_b = 1.0 / b.decode_tps;
    CHECK(fabs((step_b - step_a) - (64.0 * 1048576) / 20e9) < 1e-9);
    in.bw[FT_TIER_DISK] = 1e9;
    ft_cost_predict(&in, &p, &b);
    CHECK(fabs((1.0 / b.decode_tps - step_a) - (64.0 * 1048576) / 1e9) < 1e-9);
    in.head_bw = 0.25e9;
    ft_cost_predict(&in, &p, &b);
    CHECK(fabs((1.0 / b.decode_tps - step_a) - (64.0 * 1048576) / 0.25e9) < 1e-9);
}
