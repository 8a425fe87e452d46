/* Starvation (issue 4 acceptance): one tenant floods short requests,
 * another sends one long prompt; the long prompt's TTFT stays bounded.
 *
 * The bound we enforce, in steps, for max_seqs S, max_batched_tokens B, a
 * flood whose requests live at most L steps (1 prefill + max_tokens
 * decodes), and a long prompt of P tokens:
 *   admission:  at most L steps (the admission line gives the next free slot
 *               to the tenant that has waited longest, docs/scheduler.md);
 *   prefill:    deficit round robin between the two tenants gives it at least
 *               half of the prefill budget B - S (S decode tokens go first),
 *               so at most ceil(P / ((B - S) / 2)) steps, plus one step of
 *               quantum rounding;
 *   first token: sampled in the step that completes the prefill.
 * With S = 8, B = 64, L = 6, P = 400: 6 + 15 + 1 = 22 steps. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>

#include "llmd.h"
#include "tests/lib/ref_util.h"

#define F32 REF_MODELS "/stories260K-f32.gguf"

struct tjob {
    uint64_t id;
    int first_step; /* step of the first token, -1 before */
    int *step;
};

static void on_token(void *user, uint64_t id, int32_t token, const char *text, size_t len,
                     enum llmd_finish finish) {
    (void)id;
    (void)token;
    (void)text;
    (void)len;
    (void)finish;
    struct tjob *j = user;
    if (j->first_step < 0)
        j->first_step = *j->step;
}

Test(engine_fair, long_prompt_ttft_bounded_under_a_flood, .timeout = 120) {
    enum { S = 8, B = 64, L = 6, P = 400 };
    struct llmd_engine_config cfg = {.model = F32,
                                     .n_threads = 2,
                                     .n_ctx = 512,
                                     .max_seqs = S,
                                     .max_batched_tokens = B,
                                     .kv_type = LLMD_KV_F32};
    struct llmd_engine *e;
    char err[512] = "";
    cr_assert_eq(llmd_engine_open(&cfg, &e, err, sizeof(err)), 0, "%s", err);
    int step = 0;
    static struct tjob flood[2000];
    struct tjob big = {.first_step = -1, .step = &step};
    int32_t shortp[8], longp[P];
    srand(3);
    for (int i = 0; i < P; i++)
        longp[i] = i == 0 ? 1 : 3 + rand() % 509;
    int n_flood = 0, big_at = -1;
    for (step = 0; step < 400 && big.first_step < 0; step++) {
        for (int k = 0; k < 4 && n_flood < 2000; k++, n_flood++) { /* 4 new short requests a step */
            for (int i = 0; i < 8; i++)
                shortp[i] = i == 0 ? 1 : 3 + rand() % 509;
            flood[n_flood] = (struct tjob){.first_step = -1, .step = &step};
            struct llmd_request r = {.prompt_ids = shortp,
                                     .n_prompt_ids = 8,
                                     .max_tokens = L - 1,
                                     .tenant = 1,
                                     .on_token = on_token,
                                     .user = &flood[n_flood]};
            cr_assert_eq(llmd_submit(e, &r, &flood[n_flood].id, NULL), 0);
        }
        if (step == 20) { /* the flood is saturating by now */
            struct llmd_request r = {.prompt_ids = longp,
                                     .n_prompt_ids = P,
                                     .max_tokens = 4,
                                     .tenant = 2,
                                     .on_token = on_token,
                                     .user = &big};
            cr_assert_eq(llmd_submit(e, &r, &big.id, NULL), 0);
            big_at = step;
        }
        cr_assert_geq(llmd_engine_step(e), 0);
    }
    cr_assert_geq(big.first_step, 0, "the long prompt never produced a token");
    struct llmd_stats st;
    llmd_stats_get(e, &st);
    cr_assert_gt(st.requests_waiting, 20, "the flood must saturate: %lu waiting",
                 (unsigned long)st.requests_waiting);
    int ttft = big.first_step - big_at;
    int bound = L + (P + (B - S) / 2 - 1) / ((B - S) / 2) + 1;
    cr_log_info("long prompt TTFT %d steps (bound %d)", ttft, bound);
    cr_assert_leq(ttft, bound, "TTFT %d steps, bound %d", ttft, bound);
    llmd_engine_close(e);
}

/* Weighted fair sharing through the public API: two tenants flooding
 * 300-token prompts with weights 1 and 3. Each request's first token marks
 * its prefill done. DRR shares prefill TOKENS 1:3 (tests/test_sched_fair.c
 * measures 1:2.997); counted in whole prefills, slot admission and chunk
 * boundaries blur it: measured 5 for tenant 1 while tenant 2 did 12. The
 * test asks for 2..6 (1:6 to 1:2), i.e. clearly weighted, clearly not
 * starved. */
static void on_first(void *user, uint64_t id, int32_t token, const char *text, size_t len,
                     enum llmd_finish finish) {
    (void)id;
    (void)text;
    (void)len;
    int *firsts = user; /* [0]: this request's flag, [1]: its tenant's counter */
    if (token >= 0 && finish == LLMD_FINISH_NONE && !firsts[0]) {
        firsts[0] = 1;
        (*(int **)(firsts + 2))[0]++;
    }
}

Test(engine_fair, tenant_weights_share_prefill_tokens, .timeout = 120) {
    struct llmd_engine_config cfg = {.model = F32,
                                     .n_threads = 2,
                                     .n_ctx = 512,
                                     .max_seqs = 8,
                                     .max_batched_tokens = 64,
                                     .kv_type = LLMD_KV_F32,
                                     .no_prefix_cache = 1};
    struct llmd_engine *e;
    char err[512] = "";
    cr_assert_eq(llmd_engine_open(&cfg, &e, err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(llmd_tenant_set(e, 1, 1, 0), 0);
    cr_assert_eq(llmd_tenant_set(e, 2, 3, 0), 0);
    cr_assert_eq(llmd_tenant_set(e, 3, 0, 0), -EINVAL);
    static int32_t p[300];
    srand(8);
    for (int i = 0; i < 300; i++)
        p[i] = i == 0 ? 1 : 3 + rand() % 509;
    static int done[3];
    static struct {
        int flag, pad;
        int *counter;
    } rec[2][20];
    uint64_t id;
    for (int k = 0; k < 20; k++)
        for (int t = 0; t < 2; t++) {
            rec[t][k].counter = &done[t + 1];
            struct llmd_request r = {.prompt_ids = p,
                                     .n_prompt_ids = 300,
                                     .max_tokens = 50,
                                     .tenant = (uint32_t)t + 1,
                                     .on_token = on_first,
                                     .user = &rec[t][k]};
            cr_assert_eq(llmd_submit(e, &r, &id, NULL), 0);
        }
    /* run until tenant 2 has finished 12 prefills (both still have work) */
    for (int step = 0; step < 2000 && done[2] < 12; step++)
        cr_assert_gt(llmd_engine_step(e), 0);
    cr_log_info("prefills done: tenant 1 (weight 1) %d, tenant 2 (weight 3) %d", done[1], done[2]);
    cr_assert_eq(done[2], 12);
    cr_assert(done[1] >= 2 && done[1] <= 6, "tenant 1 finished %d prefills while tenant 2 did 12",
              done[1]);
    llmd_engine_close(e);
}
