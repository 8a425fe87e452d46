/* Speculative decoding in the engine (issue 16): with prompt-lookup drafts
 * verified in the batched step, greedy output is exactly the token ids of
 * greedy output without speculation, alone or batched (1, 4 and 8 at once,
 * several token budgets), and after every step the pool holds exactly the
 * pages the committed tokens need. Usage and stats count the drafted and
 * accepted tokens consistently. stories260K, f32 KV, prompts that repeat
 * text so that drafts get accepted. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmd.h"
#include "tests/lib/ref_util.h"

#define F32   REF_MODELS "/stories260K-f32.gguf"
#define MAX_N 256

struct job {
    const char *prompt;
    uint32_t max_tokens;
    int no_spec;
    uint64_t id;
    int32_t out[MAX_N];
    uint32_t n_out;
    char text[4096];
    size_t n_text;
    enum llmd_finish finish;
    struct llmd_usage usage;
};

static void on_token(void *user, uint64_t id, int32_t token, const char *text, size_t len,
                     enum llmd_finish finish) {
    struct job *j = user;
    cr_assert_eq(id, j->id);
    cr_assert_eq(j->finish, LLMD_FINISH_NONE, "a token after the finish");
    if (token >= 0 && finish != LLMD_FINISH_CANCELLED && j->n_out < MAX_N)
        j->out[j->n_out++] = token;
    if (j->n_text + len < sizeof(j->text)) {
        memcpy(j->text + j->n_text, text, len);
        j->n_text += len;
        j->text[j->n_text] = 0;
    }
    j->finish = finish;
}

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

struct eng_opts {
    uint32_t max_seqs, max_batched, spec_tokens;
    enum llmd_spec spec;
    uint64_t budget;
    int no_map_ahead, no_prefix_cache;
    uint32_t n_ctx;
};

static struct llmd_engine *open_engine(const struct eng_opts *o) {
    struct llmd_engine_config cfg = {.model = F32,
                                     .n_threads = 2,
                                     .n_ctx = o->n_ctx ? o->n_ctx : 512,
                                     .max_seqs = o->max_seqs,
                                     .max_batched_tokens = o->max_batched,
                                     .kv_budget_bytes = o->budget,
                                     .kv_type = LLMD_KV_F32,
                                     .no_map_ahead = o->no_map_ahead,
                                     .no_prefix_cache = o->no_prefix_cache,
                                     .spec = o->spec,
                                     .spec_tokens = o->spec_tokens};
    struct llmd_engine *e;
    char err[512] = "";
    cr_assert_eq(llmd_engine_open(&cfg, &e, err, sizeof(err)), 0, "open: %s", err);
    return e;
}

static void submit(struct llmd_engine *e, struct job *j) {
    struct llmd_request r = {.prompt = j->prompt,
                             .prompt_len = strlen(j->prompt),
                             .max_tokens = j->max_tokens,
                             .on_token = on_token,
                             .user = j,
                             .usage = &j->usage,
                             .no_speculative = j->no_spec};
    cr_assert_eq(llmd_submit(e, &r, &j->id, NULL), 0);
}

/* Pages each running job's committed tokens need: its KV holds prompt +
 * completion - 1 tokens once it decodes (the last token is computed by the
 * next step). With distinct prompts and no prefix sharing between them,
 * the pool's mapped pages are exactly their sum. */
static void check_pages(struct llmd_engine *e, struct job *jobs, int n, bool exact_pool) {
    cr_assert(llmd_engine_check(e), "engine invariants");
    struct llmd_engine_info in;
    llmd_engine_info_get(e, &in);
    uint64_t sum = 0;
    for (int i = 0; i < n; i++) {
        struct job *j = &jobs[i];
        uint32_t pages[64];
        int got = llmd_request_pages(e, j->id, pages, 64);
        if (got < 0)
            continue; /* waiting or finished */
        sum += (uint64_t)got;
        if (j->usage.completion_tokens == 0)
            continue; /* prefilling: its chunks' pages */
        uint32_t kv = j->usage.prompt_tokens + j->usage.completion_tokens - 1;
        uint32_t want = (kv + in.tokens_per_page - 1) / in.tokens_per_page;
        cr_assert_eq((uint32_t)got, want, "job %d: %d pages for %u committed tokens, need %u", i,
                     got, kv, want);
    }
    if (!exact_pool)
        return;
    struct llmd_stats st;
    llmd_stats_get(e, &st);
    cr_assert_eq(st.kv_pages_ahead, 0);
    cr_assert_eq(st.kv_pages_free + st.kv_pages_cached + sum, st.kv_pages_total,
                 "%lu free + %lu cached + %lu held != %lu", (unsigned long)st.kv_pages_free,
                 (unsigned long)st.kv_pages_cached, (unsigned long)sum,
                 (unsigned long)st.kv_pages_total);
}

/* Step to the end, checking pages after every step. */
static void run(struct llmd_engine *e, struct job *jobs, int n, bool exact_pool) {
    int live, steps = 0;
    while ((live = llmd_engine_step(e)) > 0) {
        cr_assert_lt(++steps, 20000, "no progress");
        llmd_engine_sync(e);
        check_pages(e, jobs, n, exact_pool);
    }
    cr_assert_eq(live, 0, "step: %d", live);
    struct llmd_stats st;
    llmd_stats_get(e, &st);
    cr_assert_eq(st.kv_pages_free + st.kv_pages_cached, st.kv_pages_total, "pages left mapped");
}

static void make_jobs(struct job *jobs, int n, uint32_t max_tokens) {
    for (int i = 0; i < n; i++) {
        memset(&jobs[i], 0, sizeof(jobs[i]));
        jobs[i].prompt = prompts[i % N_PROMPTS];
        jobs[i].max_tokens = max_tokens - (uint32_t)(i % 3) * 7;
    }
}

/* The oracle: each job alone, greedy, without speculation. */
static void solo(struct job *jobs, int n) {
    struct llmd_engine *e = open_engine(&(struct eng_opts){.max_seqs = 1, .max_batched = 64});
    for (int i = 0; i < n; i++) {
        submit(e, &jobs[i]);
        run(e, &jobs[i], 1, false);
        cr_assert_eq(jobs[i].finish, LLMD_FINISH_LENGTH);
        cr_assert_eq(jobs[i].usage.spec_draft_tokens, 0);
    }
    llmd_engine_close(e);
}

static void expect_same(const struct job *a, const struct job *b, int n, const char *what) {
    for (int i = 0; i < n; i++) {
        cr_assert_eq(b[i].finish, a[i].finish, "%s: job %d finish %d, alone %d", what, i,
                     b[i].finish, a[i].finish);
        cr_assert_eq(b[i].n_out, a[i].n_out, "%s: job %d: %u tokens, alone %u", what, i, b[i].n_out,
                     a[i].n_out);
        for (uint32_t k = 0; k < a[i].n_out; k++)
            cr_assert_eq(b[i].out[k], a[i].out[k], "%s: job %d token %u: %d, alone %d", what, i, k,
                         b[i].out[k], a[i].out[k]);
        cr_assert_str_eq(b[i].text, a[i].text, "%s: job %d text", what, i);
        cr_assert_eq(b[i].usage.completion_tokens, a[i].n_out, "%s: job %d usage", what, i);
    }
}

/* Usage and stats agree, and drafts were accepted. */
static void expect_counts(struct llmd_engine *e, const struct job *jobs, int n, const char *what) {
    struct llmd_stats st;
    llmd_stats_get(e, &st);
    uint64_t drafted = 0, accepted = 0, hist_sum = 0, hist_n = 0;
    for (int i = 0; i < n; i++) {
        cr_assert_leq(jobs[i].usage.spec_accepted_tokens, jobs[i].usage.spec_draft_tokens);
        cr_assert_lt(jobs[i].usage.spec_accepted_tokens, jobs[i].usage.completion_tokens);
        if (jobs[i].no_spec)
            cr_assert_eq(jobs[i].usage.spec_draft_tokens, 0, "%s: job %d opted out", what, i);
        drafted += jobs[i].usage.spec_draft_tokens;
        accepted += jobs[i].usage.spec_accepted_tokens;
    }
    for (int a = 0; a <= LLMD_SPEC_TOKENS_MAX; a++) {
        hist_sum += (uint64_t)a * st.spec_accepted_len[a];
        hist_n += st.spec_accepted_len[a];
    }
    cr_assert_eq(st.spec_draft_tokens_total, drafted, "%s", what);
    cr_assert_eq(st.spec_accepted_tokens_total, accepted, "%s", what);
    cr_assert_eq(hist_sum, accepted, "%s: the histogram sums to the accepted tokens", what);
    cr_assert_eq(hist_n, st.spec_steps_total, "%s", what);
    cr_assert_gt(accepted, 20, "%s: drafts were accepted (%lu of %lu)", what,
                 (unsigned long)accepted, (unsigned long)drafted);
    cr_log_info("%s: %lu steps, %lu drafted, %lu accepted", what, (unsigned long)st.steps_total,
                (unsigned long)drafted, (unsigned long)accepted);
}

Test(engine_spec, greedy_ids_equal_without_speculation_alone_and_batched, .timeout = 240) {
    enum { N = 16 };
    static struct job alone[N], spec[N];
    make_jobs(alone, N, 120);
    solo(alone, N);
    static const struct eng_opts cases[] = {
        {.max_seqs = 1, .max_batched = 64, .spec_tokens = 8, .no_map_ahead = 1},
        {.max_seqs = 4, .max_batched = 24, .spec_tokens = 5},
        {.max_seqs = 8, .max_batched = 256, .spec_tokens = 16, .no_map_ahead = 1},
        {.max_seqs = 8, .max_batched = 12, .spec_tokens = 3, .no_prefix_cache = 1},
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        struct eng_opts o = cases[c];
        o.spec = LLMD_SPEC_NGRAM;
        struct llmd_engine *e = open_engine(&o);
        make_jobs(spec, N, 120);
        for (int i = 0; i < N; i++)
            submit(e, &spec[i]);
        run(e, spec, N, false);
        char what[96];
        snprintf(what, sizeof what, "max_seqs %u, %u tokens a step, drafts of %u", o.max_seqs,
                 o.max_batched, o.spec_tokens);
        expect_same(alone, spec, N, what);
        expect_counts(e, spec, N, what);
        struct llmd_stats st;
        llmd_stats_get(e, &st);
        if (o.max_seqs == 1) /* a job alone: fewer steps than tokens */
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
    expect_counts(e, jobs, N, "exact pool");
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
    expect_counts(e, jobs, N, "opt-out");
    llmd_engine_close(e);
}

Test(engine_spec, bad_configuration_is_refused, .timeout = 30) {
    struct llmd_engine_config cfg = {.model = F32, .n_threads = 1, .spec = 7};
    struct llmd_engine *e = NULL;
    char err[256] = "";
    cr_assert_eq(llmd_engine_open(&cfg, &e, err, sizeof err), -EINVAL);
    cr_assert(strstr(err, "speculative"), "%s", err);
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
    llmd_engine_close(e);
}
