/* The session's slot operations the server's scheduler and prefix cache
 * rely on (ft_session_reserve, slot_len, slot_truncate, slot_copy,
 * slot_reset over ft_ctx_truncate / ft_ctx_copy_prefix), on the demo
 * model: a prefix copied or kept by truncation continues exactly as the
 * slot it came from would; sequences at different positions share one
 * forward call; bad slots and lengths are refused; an offloaded KV cache
 * truncates but refuses copies. */
#include "ft_test.h"
#include "flextier/session.h"
#include "flextier/offload.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *demo(void)
{
    const char *d = getenv("FT_DEMO_MODEL");
    return d ? d : "demo/kjv-llama";
}

static int argmax(const float *v, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[b]) b = i;
    return b;
}

static float maxdiff(const float *a, const float *b, int n)
{
    float m = 0;
    for (int i = 0; i < n; i++)
        if (fabsf(a[i] - b[i]) > m) m = fabsf(a[i] - b[i]);
    return m;
}

static ft_status fwd(ft_session *s, int slot, const int32_t *t, size_t n, float *logits)
{
    return ft_session_forward(s, 1, &slot, &t, &n, logits, 0);
}

static void run(int kv_dtype, const char *policy)
{
    ft_session_params p;
    ft_session_default_params(&p);
    p.kv_dtype = kv_dtype;
    p.threads = 2;
    if (policy) {
        p.offload = FT_OFFLOAD_POLICY;
        REQUIRE(ft_policy_parse(policy, &p.policy) == FT_OK);
    }
    ft_session *s = NULL;
    REQUIRE(ft_session_open(demo(), &p, &s) == FT_OK);
    const ft_model_config *cfg = ft_session_config(s);
    int V = cfg->vocab;
    int32_t *ids = NULL;
    size_t n = 0;
    const char *text = "And the LORD spake unto Moses, saying, Speak unto the children of Israel, and say unto them, "
                       "When any man of you bring an offering unto the LORD";
    REQUIRE(ft_tokenizer_encode(ft_session_tokenizer(s), text, strlen(text), 1, &ids, &n) == FT_OK);
    REQUIRE(n >= 30);
    int h = (int)n / 2;
    float *A = malloc((size_t)V * 4), *B = malloc((size_t)V * 4), *C = malloc((size_t)V * 4),
          *D = malloc((size_t)V * 4), *E = malloc((size_t)V * 8);
    REQUIRE(A && B && C && D && E);
    int b = 0, q = 0, r = 0;
    ft_session_capacity(s, &b, &q, &r);
    CHECK(b == 0 && q == 0);   /* no context yet */
    CHECK(ft_session_slot_truncate(s, 0, 0) == FT_ERR_INVALID_ARG);
    CHECK_OK(ft_session_reserve(s, 4, 256, 300));
    ft_session_capacity(s, &b, &q, &r);
    CHECK(b >= 4 && q >= 256 && r >= 300);
    /* slot 0: the whole prompt; slot 1: in two halves */
    CHECK_OK(fwd(s, 0, ids, n, A));
    CHECK_OK(fwd(s, 1, ids, (size_t)h, NULL));
    CHECK_OK(fwd(s, 1, ids + h, n - (size_t)h, B));
    CHECK(ft_session_slot_len(s, 0) == (int)n && ft_session_slot_len(s, 1) == (int)n);
    CHECK_MSG(maxdiff(A, B, V) < 2e-2f && argmax(A, V) == argmax(B, V), "split prefill: %g", maxdiff(A, B, V));
    /* slot 2: slot 0's first half copied, the rest computed */
    ft_status cst = ft_session_slot_copy(s, 0, 2, h);
    if (policy) {
        CHECK(cst == FT_ERR_UNSUPPORTED);
        CHECK_OK(fwd(s, 2, ids, (size_t)h, NULL));
    } else {
        CHECK_OK(cst);
    }
    CHECK(ft_session_slot_len(s, 2) == h);
    CHECK_OK(fwd(s, 2, ids + h, n - (size_t)h, C));
    CHECK_MSG(maxdiff(A, C, V) < 2e-2f && argmax(A, V) == argmax(C, V), "copied prefix: %g", maxdiff(A, C, V));
    /* slot 0 truncated to the half and continued: exactly what slot 2 computed */
    CHECK_OK(ft_session_slot_truncate(s, 0, h));
    CHECK(ft_session_slot_len(s, 0) == h);
    CHECK_OK(fwd(s, 0, ids + h, n - (size_t)h, D));
    if (!policy) CHECK_MSG(memcmp(C, D, (size_t)V * 4) == 0, "truncated slot = copied slot: %g", maxdiff(C, D, V));
    else CHECK_MSG(maxdiff(B, D, V) < 2e-2f, "truncated offloaded slot: %g", maxdiff(B, D, V));
    /* two sequences at different positions in one call: a decode step of
     * slot 0 beside a prompt chunk of slot 3 */
    ft_session_slot_reset(s, 3);
    CHECK(ft_session_slot_len(s, 3) == 0);
    int32_t next = (int32_t)argmax(D, V);
    int slots[2] = {0, 3};
    const int32_t *toks[2] = {&next, ids};
    size_t nt[2] = {1, n};
    CHECK_OK(ft_session_forward(s, 2, slots, toks, nt, E, 0));
    CHECK(ft_session_slot_len(s, 0) == (int)n + 1 && ft_session_slot_len(s, 3) == (int)n);
    CHECK_MSG(maxdiff(E + V, A, V) < 2e-2f && argmax(E + V, V) == argmax(A, V), "mixed call: %g",
              maxdiff(E + V, A, V));
    CHECK_OK(fwd(s, 1, &next, 1, B));
    CHECK_MSG(maxdiff(E, B, V) < 2e-2f && argmax(E, V) == argmax(B, V), "decode beside a prefill: %g",
              maxdiff(E, B, V));
    /* refusals */
    CHECK(ft_session_slot_truncate(s, 0, (int)n + 5) == FT_ERR_INVALID_ARG);
    CHECK(ft_session_slot_truncate(s, 0, -1) == FT_ERR_INVALID_ARG);
    CHECK(ft_session_slot_truncate(s, 99, 0) == FT_ERR_INVALID_ARG);
    CHECK(ft_session_slot_copy(s, 0, 99, 1) == FT_ERR_INVALID_ARG);
    CHECK(ft_session_slot_copy(s, 3, 1, (int)n + 1) == (policy ? FT_ERR_UNSUPPORTED : FT_ERR_INVALID_ARG) ||
          ft_session_slot_copy(s, 3, 1, (int)n + 1) == FT_ERR_INVALID_ARG);
    CHECK(ft_session_reserve(s, 0, 10, 0) == FT_ERR_INVALID_ARG);
    free(ids);
    free(A); free(B); free(C); free(D); free(E);
    ft_session_close(s);
}

TEST(slots_f32_cache) { run(FT_F32, NULL); }
TEST(slots_bf16_cache) { run(FT_BF16, NULL); }
TEST(slots_offloaded_cache) { run(-1, "w=100,0 c=0,100"); }
