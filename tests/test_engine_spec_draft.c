/* Speculative decoding with a draft model (issue 16): greedy output is
 * exactly the token ids without speculation, alone and batched; a draft of
 * another vocabulary is refused naming the first difference; the draft's
 * KV lives in the target's pages (the pool holds exactly the committed
 * tokens' pages after every step, and nothing once the requests finish);
 * llmd_stats and llmd_engine_info show the draft's share. stories260K
 * (f32 KV) is the target; the draft is stories260K itself, whose drafts
 * must then all be accepted (a draft KV position missing or stale would
 * show as a rejection), or its q8_0 copy, which disagrees now and then. */
#include "engine/core/engine_test.h"
#include "mem.h"
#include "tests/lib/spec_util.h"

#define Q8 REF_MODELS "/stories260K-q8_0.gguf"

static const char *const prompts[] = {
    "Tom had a dog. The dog was big. Tom had a dog.",
    "Once upon a time, there was a little girl named Lily. She loved to play outside.",
    "Once upon a time",
    "The sun was hot. The birds sang. The sun",
    "One day, a little boy named Tim found a box. In the box was a toy car.",
    "Sue liked red. Sue liked blue.",
};
#define N_PROMPTS (sizeof(prompts) / sizeof(prompts[0]))

static void make_jobs(struct job *jobs, int n, uint32_t max_tokens) {
    for (int i = 0; i < n; i++) {
        memset(&jobs[i], 0, sizeof(jobs[i]));
        jobs[i].prompt = prompts[i % N_PROMPTS];
        jobs[i].max_tokens = max_tokens - (uint32_t)(i % 3) * 5;
    }
}

/* Every draft token verified was accepted (the draft is the target). */
static void expect_all_accepted(const struct job *jobs, int n, const char *what) {
    for (int i = 0; i < n; i++) {
        if (jobs[i].no_spec)
            continue;
        cr_assert_gt(jobs[i].usage.spec_draft_tokens, 0, "%s: job %d drafted", what, i);
        cr_assert_eq(jobs[i].usage.spec_accepted_tokens, jobs[i].usage.spec_draft_tokens,
                     "%s: job %d: %u of %u drafts accepted", what, i,
                     jobs[i].usage.spec_accepted_tokens, jobs[i].usage.spec_draft_tokens);
    }
}

/* Draft tokens verified and accepted over jobs[0..n). */
static void total_drafts(const struct job *jobs, int n, uint32_t *drafted, uint32_t *accepted) {
    *drafted = *accepted = 0;
    for (int i = 0; i < n; i++) {
        *drafted += jobs[i].usage.spec_draft_tokens;
        *accepted += jobs[i].usage.spec_accepted_tokens;
    }
}

/* make_jobs(spec, n, 60) on an engine like o with the target itself as
 * draft, run to the end; the ids must equal alone's. The engine's stats
 * into st. */
static void run_self_drafted(const struct eng_opts *o, const struct job *alone, struct job *spec,
                             int n, const char *what, struct llmd_stats *st) {
    struct eng_opts so = *o;
    so.spec = LLMD_SPEC_DRAFT;
    so.spec_model = F32;
    struct llmd_engine *e = open_engine(&so);
    make_jobs(spec, n, 60);
    for (int i = 0; i < n; i++)
        submit(e, &spec[i]);
    run(e, spec, n, false);
    expect_same(alone, spec, n, what);
    llmd_stats_get(e, st);
    llmd_engine_close(e);
}

Test(engine_spec_draft, greedy_ids_equal_without_speculation_alone_and_batched, .timeout = 240) {
    enum { N = 8 };
    static struct job alone[N], spec[N];
    make_jobs(alone, N, 48);
    alone[3].no_spec = 1;
    solo(alone, N);
    static const struct eng_opts cases[] = {
        {.max_seqs = 1, .max_batched = 64, .spec_tokens = 6, .no_map_ahead = 1},
        {.max_seqs = 4, .max_batched = 24, .spec_tokens = 5},
        {.max_seqs = 8, .max_batched = 128, .spec_tokens = 8, .no_prefix_cache = 1},
        {.max_seqs = 8, .max_batched = 12, .spec_tokens = 3, .no_map_ahead = 1},
        {.max_seqs = 4, .max_batched = 64, .spec_tokens = 8, .adaptive = 1},
    };
    const char *drafts[] = {F32, Q8};
    for (size_t d = 0; d < 2; d++)
        for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
            if (d == 1 && c % 2) /* the q8_0 draft: fewer cases, the same edges */
                continue;
            struct eng_opts o = cases[c];
            o.spec = LLMD_SPEC_DRAFT;
            o.spec_model = drafts[d];
            struct llmd_engine *e = open_engine(&o);
            make_jobs(spec, N, 48);
            spec[3].no_spec = 1;
            for (int i = 0; i < N; i++)
                submit(e, &spec[i]);
            run(e, spec, N, false);
            char what[128];
            snprintf(what, sizeof what, "draft %s, max_seqs %u, %u tokens a step, drafts of %u%s",
                     d ? "q8_0" : "f32", o.max_seqs, o.max_batched, o.spec_tokens,
                     o.adaptive ? ", adaptive" : "");
            expect_same(alone, spec, N, what);
            expect_counts(e, spec, N, o.adaptive ? 0 : 20, what);
            if (d == 0 && !o.adaptive)
                expect_all_accepted(spec, N, what);
            llmd_engine_close(e);
        }
}

/* A draft that lags catches up. Three decodes fill a budget of three
 * tokens, so no draft fits and the steps skip the draft model: its
 * positions fall behind the text by up to 20 tokens a job. When the
 * shortest job ends a draft token fits, and the pass first runs what the
 * draft missed, 40 tokens in passes of at most max_batched + max_seqs = 6.
 * The draft is the target itself, so a missing or misplaced position would
 * show as a rejected draft; the ids equal the plain run's, and the pool
 * holds exactly the committed tokens' pages after every step. */
Test(engine_spec_draft, a_lagging_draft_catches_up, .timeout = 120) {
    enum { N = 3 };
    static struct job alone[N], spec[N];
    for (int i = 0; i < N; i++) {
        memset(&alone[i], 0, sizeof alone[i]);
        alone[i].prompt = prompts[i];
        alone[i].max_tokens = 60 - 20 * (uint32_t)i;
        spec[i] = alone[i];
    }
    solo(alone, N);
    struct llmd_engine *e = open_engine(&(struct eng_opts){.max_seqs = N,
                                                           .max_batched = N,
                                                           .spec_tokens = 4,
                                                           .spec = LLMD_SPEC_DRAFT,
                                                           .spec_model = F32,
                                                           .no_map_ahead = 1,
                                                           .no_prefix_cache = 1});
    for (int i = 0; i < N; i++)
        submit(e, &spec[i]);
    run(e, spec, N, true);
    expect_same(alone, spec, N, "lagging draft");
    cr_assert_gt(spec[0].usage.spec_draft_tokens, 10, "the longest job drafted after the lag: %u",
                 spec[0].usage.spec_draft_tokens);
    for (int i = 0; i < N; i++)
        cr_assert_eq(spec[i].usage.spec_accepted_tokens, spec[i].usage.spec_draft_tokens,
                     "job %d: %u of %u drafts accepted", i, spec[i].usage.spec_accepted_tokens,
                     spec[i].usage.spec_draft_tokens);
    llmd_engine_close(e);
}

/* A lagging draft and the prefix cache: a prompt's pages hold both models'
 * KV (a prefill runs the draft), so a second round whose prompts are the
 * first round's prompts and answers hits them and the draft (the target
 * itself) still agrees on every token; its ids equal the plain run's. The
 * first round lags as above. */
Test(engine_spec_draft, a_prefix_hit_after_a_lagging_draft, .timeout = 120) {
    enum { N = 3 };
    static struct job first[N], alone[N], spec[N];
    static char text[N][9000];
    for (int i = 0; i < N; i++) {
        memset(&first[i], 0, sizeof first[i]);
        first[i].prompt = prompts[i];
        first[i].max_tokens = 60 - 20 * (uint32_t)i;
    }
    struct llmd_engine *e = open_engine(&(struct eng_opts){.max_seqs = N,
                                                           .max_batched = N,
                                                           .spec_tokens = 4,
                                                           .spec = LLMD_SPEC_DRAFT,
                                                           .spec_model = F32});
    for (int i = 0; i < N; i++)
        submit(e, &first[i]);
    run(e, first, N, false);
    for (int i = 0; i < N; i++) {
        snprintf(text[i], sizeof text[i], "%s%s", prompts[i], first[i].text);
        memset(&alone[i], 0, sizeof alone[i]);
        alone[i].prompt = text[i];
        alone[i].max_tokens = 24;
        spec[i] = alone[i];
    }
    solo(alone, N);
    for (int i = 0; i < N; i++) {
        submit(e, &spec[i]);
        run(e, &spec[i], 1, false);
    }
    expect_same(alone, spec, N, "after a lagging draft");
    cr_assert_geq(spec[0].usage.cached_tokens, 16, "the first prompt's page was a hit: %u",
                  spec[0].usage.cached_tokens);
    expect_all_accepted(spec, N, "after a lagging draft");
    llmd_engine_close(e);
}

/* Lagging drafts through preemption, spills to the host tier and their
 * restores, and prefix hits: 16 jobs on 3-4 sequences whose step budget
 * leaves little or no room for drafts and whose KV budget (10-16 pages of
 * 16 tokens) preempts, with and without the policy. The draft is the target
 * itself: every draft accepted means every position it read held its KV,
 * resumed requests' included; the ids equal the plain run's. (From a
 * review's cases.) */
Test(engine_spec_draft, a_lagging_draft_through_preemption_and_spills, .timeout = 240) {
    enum { N = 16 };
    static struct job alone[N], spec[N];
    make_jobs(alone, N, 60);
    solo(alone, N);
    static const struct eng_opts cases[] = {
        {.max_seqs = 4, .max_batched = 4, .spec_tokens = 6, .budget = 16 * 40960},
        {.max_seqs = 4,
         .max_batched = 5,
         .spec_tokens = 6,
         .budget = 14 * 40960,
         .host_bytes = 4u << 20},
        {.max_seqs = 3,
         .max_batched = 3,
         .spec_tokens = 3,
         .budget = 10 * 40960,
         .host_bytes = 4u << 20},
        {.max_seqs = 4,
         .max_batched = 64,
         .spec_tokens = 8,
         .budget = 14 * 40960,
         .host_bytes = 4u << 20,
         .adaptive = 1},
    };
    uint64_t preempted = 0, restored = 0;
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        char what[64];
        snprintf(what, sizeof what, "case %zu", c);
        struct llmd_stats st;
        run_self_drafted(&cases[c], alone, spec, N, what, &st);
        uint32_t drafted, accepted;
        total_drafts(spec, N, &drafted, &accepted);
        cr_assert_eq(accepted, drafted, "%s: %u of %u drafts accepted", what, accepted, drafted);
        preempted += st.preemptions_total;
        restored += st.restores_host_total;
    }
    cr_assert_gt(preempted, 0, "the budgets preempted");
    cr_assert_gt(restored, 0, "the host tier restored pages");
}

/* The spare catch-up (spec_catch_up_plan), forced through engine_test.h:
 * the policy grants it only where a draft pays at the measured costs, and
 * no test model does. Each step half the speculating decodes draft nothing
 * and half of those catch up 1 to lag + 2 tokens (the engine clamps that to
 * the lag and to the pass's room). With the target as its own draft every
 * later draft must still be accepted (a position the catch-up skipped or
 * ran twice would show as a rejection), the ids equal the plain run's, and
 * the pages be exact after every step; the second case adds preemption,
 * host-tier spills and restores. */
Test(engine_spec_draft, a_forced_spare_catch_up_keeps_the_draft_exact, .timeout = 240) {
    enum { N = 16 };
    static struct job alone[N], spec[N];
    make_jobs(alone, N, 60);
    solo(alone, N);
    static const struct eng_opts cases[] = {
        {.max_seqs = 4, .max_batched = 64, .spec_tokens = 6},
        {.max_seqs = 4,
         .max_batched = 5,
         .spec_tokens = 6,
         .budget = 14 * 40960,
         .host_bytes = 4u << 20},
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        char what[64];
        snprintf(what, sizeof what, "forced spare, case %zu", c);
        struct eng_opts so = cases[c];
        so.spec = LLMD_SPEC_DRAFT;
        so.spec_model = F32;
        struct llmd_engine *e = open_engine(&so);
        eng_test_force_spare(e, 12345u + (uint32_t)c);
        make_jobs(spec, N, 60);
        for (int i = 0; i < N; i++)
            submit(e, &spec[i]);
        run(e, spec, N, false);
        expect_same(alone, spec, N, what);
        uint32_t drafted, accepted;
        total_drafts(spec, N, &drafted, &accepted);
        cr_assert_gt(drafted, 100, "%s: drafted %u", what, drafted);
        cr_assert_eq(accepted, drafted, "%s: %u of %u drafts accepted", what, accepted, drafted);
        uint64_t spare = eng_test_spare_tokens(e);
        cr_log_info("%s: %llu spare catch-up tokens, %u drafted", what, (unsigned long long)spare,
                    drafted);
        cr_assert_gt(spare, 50, "%s: the spare catch-up ran %llu tokens", what,
                     (unsigned long long)spare);
        struct llmd_stats st;
        llmd_stats_get(e, &st);
        if (c == 1)
            cr_assert(st.preemptions_total > 0 && st.restores_host_total > 0,
                      "%s: %llu preemptions, %llu restores", what,
                      (unsigned long long)st.preemptions_total,
                      (unsigned long long)st.restores_host_total);
        llmd_engine_close(e);
    }
}

/* The draft's KV comes with a prefix-cache hit: the same prompt again
 * shares its pages, and the draft (the target itself) still agrees on
 * every token. */
Test(engine_spec_draft, prefix_hit_brings_the_drafts_kv, .timeout = 120) {
    static struct job alone[2], spec[2];
    static const char long_prompt[] =
        "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
        "park. One day, she saw a big red ball. She ran to get it, and her friend Ben came too.";
    for (int i = 0; i < 2; i++) {
        memset(&alone[i], 0, sizeof alone[i]);
        alone[i].prompt = long_prompt;
        alone[i].max_tokens = 40;
        spec[i] = alone[i];
    }
    solo(alone, 2);
    struct llmd_engine *e = open_engine(&(struct eng_opts){.max_seqs = 2,
                                                           .max_batched = 64,
                                                           .spec_tokens = 6,
                                                           .spec = LLMD_SPEC_DRAFT,
                                                           .spec_model = F32});
    for (int i = 0; i < 2; i++) {
        submit(e, &spec[i]);
        run(e, &spec[i], 1, false);
    }
    cr_assert_gt(spec[1].usage.cached_tokens, 0, "the second run hit the cache");
    expect_same(alone, spec, 2, "prefix hit");
    expect_all_accepted(spec, 2, "prefix hit");
    llmd_engine_close(e);
}

/* Without prefix cache and map-ahead every mapped page is a running job's:
 * after every step free + held is the pool (run() checks it), the draft
 * adding no page of its own, and once the jobs finish every page is free. */
Test(engine_spec_draft, pool_holds_exactly_the_committed_pages, .timeout = 120) {
    enum { N = 6 };
    static struct job jobs[N];
    make_jobs(jobs, N, 60);
    struct llmd_engine *e = open_engine(&(struct eng_opts){.max_seqs = 6,
                                                           .max_batched = 64,
                                                           .spec_tokens = 7,
                                                           .spec = LLMD_SPEC_DRAFT,
                                                           .spec_model = Q8,
                                                           .no_map_ahead = 1,
                                                           .no_prefix_cache = 1});
    for (int i = 0; i < N; i++)
        submit(e, &jobs[i]);
    run(e, jobs, N, true);
    struct llmd_stats st;
    llmd_stats_get(e, &st);
    cr_assert_eq(st.kv_pages_free, st.kv_pages_total, "every page free at the end");
    cr_assert_eq(st.kv_draft_bytes, 0, "no draft KV held");
    llmd_engine_close(e);
}

/* The draft's share of each token's slot and of the pages in use. */
Test(engine_spec_draft, stats_and_info_show_the_draft, .timeout = 60) {
    struct llmd_engine *plain = open_engine(&(struct eng_opts){.max_seqs = 2, .max_batched = 32});
    struct llmd_engine_info pi;
    llmd_engine_info_get(plain, &pi);
    llmd_engine_close(plain);
    struct llmd_engine *e = open_engine(&(struct eng_opts){.max_seqs = 2,
                                                           .max_batched = 32,
                                                           .spec = LLMD_SPEC_DRAFT,
                                                           .spec_model = Q8,
                                                           .no_map_ahead = 1});
    struct llmd_engine_info in;
    llmd_engine_info_get(e, &in);
    cr_assert_str_eq(in.spec_model, "stories260K-q8_0");
    cr_assert_eq(in.spec, LLMD_SPEC_DRAFT);
    /* the target model as generate names it (stories260K: 5 layers, 64 wide, 8/4 heads) */
    cr_assert_str_eq(in.model_name, "stories260K-f32");
    cr_assert(in.n_layer == 5 && in.n_embd == 64 && in.n_head == 8 && in.n_head_kv == 4,
              "%u %u %u %u", in.n_layer, in.n_embd, in.n_head, in.n_head_kv);
    cr_assert(in.weight_bytes > 1000000 && in.weight_bytes < 1300000, "%lu",
              (unsigned long)in.weight_bytes);
    /* stories260K f32 KV: 1,280 B a token each, the draft's after the target's */
    cr_assert_eq(pi.kv_draft_token_bytes, 0);
    cr_assert_eq(in.kv_draft_token_bytes, pi.kv_token_bytes, "the same shape: the same bytes");
    cr_assert_eq(in.kv_token_bytes, 2 * pi.kv_token_bytes, "%lu", (unsigned long)in.kv_token_bytes);
    cr_assert_eq(in.tokens_per_page * in.kv_token_bytes, in.page_bytes);
    static struct job j;
    make_jobs(&j, 1, 40);
    submit(e, &j);
    struct llmd_stats st;
    bool seen = false;
    while (llmd_engine_step(e) > 0) {
        llmd_stats_get(e, &st);
        uint64_t used = st.kv_pages_total - st.kv_pages_free + st.kv_pages_ahead;
        cr_assert_eq(st.kv_draft_bytes, used * in.tokens_per_page * in.kv_draft_token_bytes,
                     "%lu pages in use", (unsigned long)used);
        seen |= st.kv_draft_bytes > 0;
    }
    cr_assert(seen, "the draft's KV showed while the job ran");
    cr_assert_eq(st.kv_draft_token_bytes, in.kv_draft_token_bytes);
    cr_assert_eq(in.spec_draft_fixed_ns + in.spec_draft_token_ns, 0,
                 "fixed-length drafts: the policy is off, nothing was probed");
    llmd_engine_close(e);
    /* with the policy on, the draft's passes were timed at open */
    e = open_engine(&(struct eng_opts){.max_seqs = 2,
                                       .max_batched = 32,
                                       .spec = LLMD_SPEC_DRAFT,
                                       .spec_model = Q8,
                                       .adaptive = 1});
    llmd_engine_info_get(e, &in);
    cr_assert_gt(in.spec_draft_fixed_ns, 0);
    cr_assert_gt(in.spec_draft_token_ns, 0);
    cr_assert_gt(in.spec_step_token_ns, 0);
    llmd_engine_close(e);
    cr_assert_eq(pi.spec_draft_fixed_ns + pi.spec_draft_token_ns, 0, "no draft model");
}

static void expect_refused(const char *draft, int want_rc, const char *want) {
    struct llmd_engine_config cfg = {.model = F32,
                                     .n_threads = 1,
                                     .max_seqs = 1,
                                     .max_batched_tokens = 16,
                                     .spec = LLMD_SPEC_DRAFT,
                                     .spec_model_path = draft};
    struct llmd_engine *e = NULL;
    char err[512] = "";
    int rc = llmd_engine_open(&cfg, &e, err, sizeof err);
    cr_assert_eq(rc, want_rc, "%s: rc %d (%s)", draft, rc, err);
    cr_assert_null(e);
    cr_assert(strstr(err, want), "%s: '%s' lacks '%s'", draft, err, want);
}

Test(engine_spec_draft, another_vocabulary_is_refused_naming_the_difference) {
    /* dummy:tiny has 512 tokens too: <unk> <s> </s>, the bytes, then "▁" */
    expect_refused("dummy:tiny", -EINVAL,
                   "llmd: --spec-model dummy:tiny: token 259 is '\\xe2\\x96\\x81' "
                   "there and '\\xe2\\x96\\x81t' in the target");
    expect_refused("dummy:tiny-256", -EINVAL,
                   "llmd: --spec-model dummy:tiny-256: its vocabulary has 1024 tokens, the "
                   "target's 512");
    expect_refused(REF_MODELS "/no-such-model.gguf", -ENOENT,
                   "llmd: --spec-model: " REF_MODELS "/no-such-model.gguf: gguf: open");
}

Test(engine_spec_draft, config_errors) {
    struct llmd_engine_config cfg = {
        .model = F32, .n_threads = 1, .max_seqs = 1, .spec = LLMD_SPEC_DRAFT};
    struct llmd_engine *e = NULL;
    char err[256] = "";
    cr_assert_eq(llmd_engine_open(&cfg, &e, err, sizeof err), -EINVAL);
    cr_assert_str_eq(err, "llmd: --spec draft needs --spec-model PATH");
    cfg.spec = LLMD_SPEC_NGRAM;
    cfg.spec_model_path = Q8;
    cr_assert_eq(llmd_engine_open(&cfg, &e, err, sizeof err), -EINVAL);
    cr_assert_str_eq(err, "llmd: --spec-model needs --spec draft");
    cfg.spec = LLMD_SPEC_DRAFT;
    cfg.device = LLMD_DEVICE_CUDA;
    int rc = llmd_engine_open(&cfg, &e, err, sizeof err);
    cr_assert(rc == -ENOTSUP, "rc %d: %s", rc, err);
}

/* Preemption, spills to the host tier and cancellation while the draft
 * drafts: a resumed request's pages come back from the cache or the tier
 * (or are recomputed) with the draft's KV in them, so every draft is still
 * accepted and no token changes; no page is left behind. A page holds 16
 * tokens of 2 x 1,280 B here. */
Test(engine_spec_draft, preemption_spills_and_cancel, .timeout = 240) {
    enum { N = 16 };
    static struct job alone[N], spec[N];
    make_jobs(alone, N, 60);
    solo(alone, N);
    static const struct eng_opts cases[] = {
        {.max_seqs = 8, .max_batched = 64, .spec_tokens = 6, .budget = 16 * 40960},
        {.max_seqs = 4,
         .max_batched = 64,
         .spec_tokens = 6,
         .budget = 14 * 40960,
         .host_bytes = 4u << 20},
    };
    for (size_t c = 0; c < 2; c++) {
        const char *what = c ? "spills" : "preemption";
        struct llmd_stats st;
        run_self_drafted(&cases[c], alone, spec, N, what, &st);
        expect_all_accepted(spec, N, what);
        cr_log_info("%s: %lu preemptions, %lu spills, %lu restores", what,
                    (unsigned long)st.preemptions_total, (unsigned long)st.spills_host_total,
                    (unsigned long)st.restores_host_total);
        if (c == 0)
            cr_assert_gt(st.preemptions_total, 0, "a tight pool must preempt");
        else
            cr_assert_gt(st.spills_host_total, 0, "the pool must spill");
    }
    /* cancellation at random points */
    struct llmd_engine *e = open_engine(&(struct eng_opts){.max_seqs = 8,
                                                           .max_batched = 64,
                                                           .spec_tokens = 6,
                                                           .spec = LLMD_SPEC_DRAFT,
                                                           .spec_model = Q8});
    make_jobs(spec, N, 60);
    for (int i = 0; i < N; i++)
        submit(e, &spec[i]);
    srand(7);
    int cancelled = 0;
    for (spec_step_now = 1; llmd_engine_step(e) > 0; spec_step_now++) {
        check_pages(e, spec, N, false);
        int i = rand() % N;
        if (rand() % 2 == 0 && spec[i].finish == LLMD_FINISH_NONE &&
            spec[i].usage.spec_draft_tokens > 0) {
            cr_assert_eq(llmd_cancel(e, spec[i].id), 0);
            cancelled++;
        }
    }
    cr_assert_gt(cancelled, 0);
    struct llmd_stats st;
    llmd_stats_get(e, &st);
    cr_assert_eq(st.kv_pages_free + st.kv_pages_cached, st.kv_pages_total, "pages left behind");
    for (int i = 0; i < N; i++)
        for (uint32_t k = 0; k < spec[i].n_out; k++)
            cr_assert_eq(spec[i].out[k], alone[i].out[k], "job %d token %u", i, k);
    llmd_engine_close(e);
}

/* Opening an engine with a draft model under every allocation failure:
 * the open fails cleanly (an error, no engine, every byte given back) or
 * succeeds, and a success runs a request to the same ids. */
Test(engine_spec_draft, open_under_allocation_failures, .timeout = 240) {
    struct llmd_engine_config cfg = {.model = F32,
                                     .n_threads = 1,
                                     .n_ctx = 128,
                                     .max_seqs = 2,
                                     .max_batched_tokens = 32,
                                     .kv_type = LLMD_KV_F32,
                                     .no_map_ahead = 1,
                                     .spec = LLMD_SPEC_DRAFT,
                                     .spec_model_path = Q8,
                                     .spec_fixed_len = 1};
    uint64_t before[MEM_N_TAGS];
    for (int t = 0; t < MEM_N_TAGS; t++)
        before[t] = mem_bytes((enum mem_tag)t);
    struct llmd_engine *e;
    char err[512] = "";
    uint64_t c0 = mem_calls();
    cr_assert_eq(llmd_engine_open(&cfg, &e, err, sizeof err), 0, "%s", err);
    uint64_t n_allocs = mem_calls() - c0;
    llmd_engine_close(e);
    int failed = 0;
    for (uint64_t n = 1; n <= n_allocs; n++) {
        e = NULL;
        mem_fail_nth(n);
        int rc = llmd_engine_open(&cfg, &e, err, sizeof err);
        mem_fail_nth(0);
        if (rc < 0) {
            failed++;
            cr_assert_null(e, "n=%lu", (unsigned long)n);
        } else {
            llmd_engine_close(e);
        }
        for (int t = 0; t < MEM_N_TAGS; t++)
            cr_assert_eq(mem_bytes((enum mem_tag)t), before[t], "n=%lu (rc %d): %s holds %lu B",
                         (unsigned long)n, rc, mem_tag_name((enum mem_tag)t),
                         (unsigned long)(mem_bytes((enum mem_tag)t) - before[t]));
    }
    cr_assert_gt(failed, 0, "%lu fault points, none failed", (unsigned long)n_allocs);
}
