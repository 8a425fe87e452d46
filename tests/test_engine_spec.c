/* Speculative decoding in the engine (issue 16): with prompt-lookup drafts
 * verified in the batched step, greedy output is exactly the token ids of
 * greedy output without speculation, alone or batched (1, 4 and 8 at once,
 * several token budgets), and after every step the pool holds exactly the
 * pages the committed tokens need. Usage and stats count the drafted and
 * accepted tokens consistently. stories260K, f32 KV, prompts that repeat
 * text so that drafts get accepted. */
#include "tests/lib/spec_util.h"

/* Stories that repeat themselves, and one that does not. */
static const char *const prompts[] = {
    "Tom had a dog. The dog was big. Tom had a dog. The dog was big. Tom had a dog.",
    "The cat sat on the mat. The cat sat on the mat. The cat",
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
    "park. One day, she saw a big red ball.",
    "Once upon a time",
    "Lily and Ben went to the park. They played on the swings. Lily and Ben went to the park.",
    "The sun was hot. The birds sang. The sun was hot. The birds sang. The sun",
    "One day, a little boy named Tim found a box. In the box was a toy car.",
    "Sue liked red. Sue liked blue. Sue liked red. Sue liked blue. Sue liked",
};
#define N_PROMPTS (sizeof(prompts) / sizeof(prompts[0]))

static void make_jobs(struct job *jobs, int n, uint32_t max_tokens) {
    for (int i = 0; i < n; i++) {
        memset(&jobs[i], 0, sizeof(jobs[i]));
        jobs[i].prompt = prompts[i % N_PROMPTS];
        jobs[i].max_tokens = max_tokens - (uint32_t)(i % 3) * 7;
    }
}

Test(engine_spec, greedy_ids_equal_without_speculation_alone_and_batched, .timeout = 240) {
    enum { N = 12 };
    static struct job alone[N], spec[N];
    make_jobs(alone, N, 96);
    solo(alone, N);
    static const struct eng_opts cases[] = {
        {.max_seqs = 1, .max_batched = 64, .spec_tokens = 8, .no_map_ahead = 1},
        {.max_seqs = 4, .max_batched = 24, .spec_tokens = 5},
        {.max_seqs = 8, .max_batched = 256, .spec_tokens = 16, .no_map_ahead = 1},
        {.max_seqs = 8, .max_batched = 12, .spec_tokens = 3, .no_prefix_cache = 1},
        /* the policy choosing the lengths (from timings: any may be 0) */
        {.max_seqs = 1, .max_batched = 64, .spec_tokens = 8, .adaptive = 1},
        {.max_seqs = 8, .max_batched = 128, .spec_tokens = 8, .adaptive = 1},
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        struct eng_opts o = cases[c];
        o.spec = LLMD_SPEC_NGRAM;
        struct llmd_engine *e = open_engine(&o);
        make_jobs(spec, N, 96);
        for (int i = 0; i < N; i++)
            submit(e, &spec[i]);
        run(e, spec, N, false);
        char what[96];
        snprintf(what, sizeof what, "max_seqs %u, %u tokens a step, drafts of %u", o.max_seqs,
                 o.max_batched, o.spec_tokens);
        expect_same(alone, spec, N, what);
        snprintf(what + strlen(what), sizeof what - strlen(what), "%s",
                 o.adaptive ? ", adaptive" : "");
        expect_counts(e, spec, N, o.adaptive ? 0 : 20, what);
        struct llmd_stats st;
        llmd_stats_get(e, &st);
        if (o.max_seqs == 1 && !o.adaptive) /* a job alone: fewer steps than tokens */
            cr_assert_lt(st.steps_total, st.generated_tokens_total, "%s", what);
        llmd_engine_close(e);
    }
}

/* The pool's pages after every step, exactly: distinct prompts, no prefix
 * cache, no map-ahead, so every mapped page belongs to one running job. */
Test(engine_spec, pool_holds_exactly_the_pages_of_committed_tokens, .timeout = 120) {
    enum { N = 8 };
    static struct job jobs[N];
    make_jobs(jobs, N, 150);
    struct llmd_engine *e = open_engine(&(struct eng_opts){.max_seqs = 8,
                                                           .max_batched = 96,
                                                           .spec_tokens = 12,
                                                           .spec = LLMD_SPEC_NGRAM,
                                                           .no_map_ahead = 1,
                                                           .no_prefix_cache = 1});
    for (int i = 0; i < N; i++)
        submit(e, &jobs[i]);
    run(e, jobs, N, true);
    expect_counts(e, jobs, N, 20, "exact pool");
    struct llmd_stats st;
    llmd_stats_get(e, &st);
    cr_assert_gt(st.spec_rollback_pages_total, 0,
                 "runs crossed a page boundary and were rolled back");
    llmd_engine_close(e);
}

/* A request that opts out decodes one token a step beside ones that
 * speculate, and its output is unchanged. */
Test(engine_spec, a_request_may_turn_it_off, .timeout = 120) {
    enum { N = 4 };
    static struct job alone[N], jobs[N];
    make_jobs(alone, N, 60);
    solo(alone, N);
    make_jobs(jobs, N, 60);
    jobs[0].no_spec = jobs[2].no_spec = 1;
    struct llmd_engine *e =
        open_engine(&(struct eng_opts){.max_seqs = 4, .max_batched = 64, .spec = LLMD_SPEC_NGRAM});
    for (int i = 0; i < N; i++)
        submit(e, &jobs[i]);
    run(e, jobs, N, false);
    expect_same(alone, jobs, N, "opt-out");
    expect_counts(e, jobs, N, 5, "opt-out");
    llmd_engine_close(e);
}

Test(engine_spec, bad_configuration_is_refused, .timeout = 30) {
    struct llmd_engine_config cfg = {.model = F32, .n_threads = 1, .spec = 7};
    struct llmd_engine *e = NULL;
    char err[256] = "";
    cr_assert_eq(llmd_engine_open(&cfg, &e, err, sizeof err), -EINVAL);
    cr_assert(strstr(err, "speculative"), "%s", err);
    /* a draft length without speculation is ignored (llmd.h): no drafts */
    cfg.spec = LLMD_SPEC_NONE;
    cfg.spec_tokens = 4;
    cr_assert_eq(llmd_engine_open(&cfg, &e, err, sizeof err), 0, "%s", err);
    struct llmd_engine_info off;
    llmd_engine_info_get(e, &off);
    cr_assert_eq(off.spec, LLMD_SPEC_NONE);
    cr_assert_eq(off.spec_tokens, 0);
    llmd_engine_close(e);
    e = NULL;
    cfg.spec = LLMD_SPEC_NGRAM;
    cfg.spec_tokens = LLMD_SPEC_TOKENS_MAX + 1;
    cr_assert_eq(llmd_engine_open(&cfg, &e, err, sizeof err), -EINVAL);
    cr_assert(strstr(err, "spec_tokens 33"), "%s", err);
    cfg.spec_tokens = 0;
    cr_assert_eq(llmd_engine_open(&cfg, &e, err, sizeof err), 0, "%s", err);
    struct llmd_engine_info in;
    llmd_engine_info_get(e, &in);
    cr_assert_eq(in.spec, LLMD_SPEC_NGRAM);
    cr_assert_eq(in.spec_tokens, 8, "the default");
    /* the policy's cost model was measured at open; a fixed length needs none */
    cr_assert_gt(in.spec_step_token_ns, 0);
    cr_assert_gt(in.spec_step_fixed_ns, 0);
    llmd_engine_close(e);
    /* a step budget under the probe's 32 + 1 + 8 tokens: the probe fits it
     * (its token buffer holds max_batched: at 32 ASan saw the overflow; at
     * 16 the probe did not run at all) */
    for (uint32_t mb = 16; mb <= 32; mb += 16) {
        cfg.max_batched_tokens = mb;
        cr_assert_eq(llmd_engine_open(&cfg, &e, err, sizeof err), 0, "%s", err);
        llmd_engine_info_get(e, &in);
        cr_assert_gt(in.spec_step_token_ns, 0, "max_batched_tokens %u", mb);
        llmd_engine_close(e);
    }
    cfg.max_batched_tokens = 0;
    cfg.spec_fixed_len = 1;
    cr_assert_eq(llmd_engine_open(&cfg, &e, err, sizeof err), 0, "%s", err);
    llmd_engine_info_get(e, &in);
    cr_assert_eq(in.spec_step_token_ns, 0);
    llmd_engine_close(e);
    cfg.spec = LLMD_SPEC_NONE;
    cr_assert_eq(llmd_engine_open(&cfg, &e, err, sizeof err), 0, "%s", err);
    llmd_engine_info_get(e, &in);
    cr_assert_eq(in.spec_tokens, 0, "no speculation: no draft length");
    llmd_engine_close(e);
}
