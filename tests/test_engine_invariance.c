/* Batch invariance of the serving engine (issue 4 acceptance): every
 * request produces exactly the tokens it produces alone, whatever else runs
 * beside it, however its prompt is chunked, and under memory pressure that
 * forces preemption. Also: cancelling at random points leaves nothing
 * behind. stories260K, greedy, f32 KV. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>

#include "llmd.h"
#include "tests/lib/ref_util.h"

#define F32   REF_MODELS "/stories260K-f32.gguf"
#define MAX_N 64

struct job {
    int32_t prompt[160];
    uint32_t n_prompt, max_tokens;
    /* results */
    uint64_t id;
    int32_t out[MAX_N];
    uint32_t n_out;
    enum llmd_finish finish;
};

static void on_token(void *user, uint64_t id, int32_t token, const char *text, size_t len,
                     enum llmd_finish finish) {
    (void)text;
    (void)len;
    struct job *j = user;
    cr_assert_eq(id, j->id);
    if (token >= 0 && finish != LLMD_FINISH_CANCELLED && j->n_out < MAX_N)
        j->out[j->n_out++] = token;
    j->finish = finish;
}

/* n jobs with varied prompts (BOS + 1..150 ids from a fixed stream) and
 * lengths (4..48 tokens). */
static void make_jobs(struct job *jobs, int n, unsigned seed) {
    srand(seed);
    for (int i = 0; i < n; i++) {
        struct job *j = &jobs[i];
        memset(j, 0, sizeof(*j));
        j->n_prompt = 1 + (uint32_t)(rand() % 150);
        j->prompt[0] = 1;
        for (uint32_t k = 1; k < j->n_prompt; k++)
            j->prompt[k] = 3 + rand() % 509;
        j->max_tokens = 4 + (uint32_t)(rand() % 45);
    }
}

static const char *model = F32;

static struct llmd_engine *open_engine(uint32_t max_seqs, uint32_t max_batched, uint64_t budget) {
    struct llmd_engine_config cfg = {.model = model,
                                     .n_threads = 2,
                                     .n_ctx = 256,
                                     .max_seqs = max_seqs,
                                     .max_batched_tokens = max_batched,
                                     .kv_budget_bytes = budget,
                                     .kv_type = LLMD_KV_F32};
    struct llmd_engine *e;
    char err[512] = "";
    cr_assert_eq(llmd_engine_open(&cfg, &e, err, sizeof(err)), 0, "open: %s", err);
    return e;
}

static void submit(struct llmd_engine *e, struct job *j) {
    struct llmd_request r = {.prompt_ids = j->prompt,
                             .n_prompt_ids = j->n_prompt,
                             .max_tokens = j->max_tokens,
                             .on_token = on_token,
                             .user = j};
    cr_assert_eq(llmd_submit(e, &r, &j->id, NULL), 0);
}

static void run_to_end(struct llmd_engine *e) {
    int live, steps = 0;
    while ((live = llmd_engine_step(e)) > 0)
        cr_assert_lt(++steps, 100000, "no progress");
    cr_assert_eq(live, 0, "step: %d", live);
    struct llmd_stats st;
    llmd_stats_get(e, &st);
    /* every page is free, or cached for later prefix hits: none mapped */
    cr_assert_eq(st.kv_pages_free + st.kv_pages_cached, st.kv_pages_total,
                 "pages left mapped: %lu free + %lu cached of %lu", (unsigned long)st.kv_pages_free,
                 (unsigned long)st.kv_pages_cached, (unsigned long)st.kv_pages_total);
}

/* Each job alone: the oracle. */
static void solo(struct job *jobs, int n) {
    struct llmd_engine *e = open_engine(1, 256, 0);
    for (int i = 0; i < n; i++) {
        submit(e, &jobs[i]);
        run_to_end(e);
        cr_assert_eq(jobs[i].finish, LLMD_FINISH_LENGTH);
        cr_assert_eq(jobs[i].n_out, jobs[i].max_tokens);
    }
    llmd_engine_close(e);
}

static void expect_same(const struct job *a, const struct job *b, int n, const char *what) {
    for (int i = 0; i < n; i++) {
        cr_assert_eq(b[i].finish, LLMD_FINISH_LENGTH, "%s: job %d finish %d", what, i, b[i].finish);
        cr_assert_eq(b[i].n_out, a[i].n_out, "%s: job %d: %u tokens, alone %u", what, i, b[i].n_out,
                     a[i].n_out);
        for (uint32_t k = 0; k < a[i].n_out; k++)
            cr_assert_eq(b[i].out[k], a[i].out[k], "%s: job %d token %u: %d, alone %d", what, i, k,
                         b[i].out[k], a[i].out[k]);
    }
}

static void thirty_two(void) {
    enum { N = 32 };
    static struct job alone[N], together[N];
    make_jobs(alone, N, 7);
    solo(alone, N);
    static const uint32_t budgets[][2] = {{7, 7}, {16, 64}, {32, 512}}; /* max_seqs, tokens */
    for (size_t b = 0; b < sizeof(budgets) / sizeof(budgets[0]); b++) {
        make_jobs(together, N, 7);
        struct llmd_engine *e = open_engine(budgets[b][0], budgets[b][1], 0);
        for (int i = 0; i < N; i++)
            submit(e, &together[i]);
        run_to_end(e);
        char what[64];
        snprintf(what, sizeof(what), "max_batched_tokens %u", budgets[b][1]);
        expect_same(alone, together, N, what);
        llmd_engine_close(e);
    }
}

Test(engine_invariance, thirty_two_concurrent_requests_equal_solo_runs, .timeout = 300) {
    thirty_two();
}

/* The same on a dummy model (random weights, 64-wide, 2 layers). */
Test(engine_invariance, dummy_model_thirty_two_requests_equal_solo_runs, .timeout = 300) {
    model = "dummy:tiny";
    thirty_two();
}

/* 64 requests on 16 slots with a KV budget of a quarter of their demand. */
Test(engine_invariance, memory_pressure_preempts_without_changing_tokens, .timeout = 300) {
    enum { N = 64 };
    static struct job alone[N], together[N];
    make_jobs(alone, N, 11);
    solo(alone, N);
    make_jobs(together, N, 11);
    uint64_t demand_pages = 0; /* 16 tokens a page (f32 KV, 20 KiB pages) */
    for (int i = 0; i < N; i++)
        demand_pages += (together[i].n_prompt + together[i].max_tokens + 15) / 16;
    struct llmd_engine *e = open_engine(16, 128, demand_pages / 4 * 20480);
    for (int i = 0; i < N; i++)
        submit(e, &together[i]);
    run_to_end(e);
    expect_same(alone, together, N, "quarter budget");
    struct llmd_stats st;
    llmd_stats_get(e, &st);
    cr_log_info("demand %lu pages, pool %lu, preemptions %lu", (unsigned long)demand_pages,
                (unsigned long)st.kv_pages_total, (unsigned long)st.preemptions_total);
    cr_assert_lt(st.kv_pages_total * 3, demand_pages, "the pool must be well below demand");
    cr_assert_gt(st.preemptions_total, 0, "a quarter budget must preempt");
    llmd_engine_close(e);
}

/* 100 requests cancelled at random points (queued, prefilling, decoding):
 * no page and no sequence is left behind, and the rest still finish. */
Test(engine_invariance, cancelling_at_random_points_leaves_nothing, .timeout = 300) {
    enum { N = 120 };
    static struct job jobs[N];
    make_jobs(jobs, N, 23);
    struct llmd_engine *e = open_engine(8, 64, 0);
    for (int i = 0; i < N; i++)
        submit(e, &jobs[i]);
    srand(99);
    int cancelled = 0;
    for (int step = 0; step < 100000; step++) {
        /* cancel one live request about every other step, 100 in all */
        if (cancelled < 100 && rand() % 2 == 0) {
            int i = rand() % N;
            if (jobs[i].finish == LLMD_FINISH_NONE) {
                cr_assert_eq(llmd_cancel(e, jobs[i].id), 0);
                cr_assert_eq(jobs[i].finish, LLMD_FINISH_CANCELLED);
                cancelled++;
            }
        }
        if (llmd_engine_step(e) == 0)
            break;
    }
    int finished = 0;
    for (int i = 0; i < N; i++) {
        cr_assert(jobs[i].finish == LLMD_FINISH_CANCELLED || jobs[i].finish == LLMD_FINISH_LENGTH,
                  "job %d finish %d", i, jobs[i].finish);
        finished += jobs[i].finish == LLMD_FINISH_LENGTH;
        cr_assert_eq(llmd_cancel(e, jobs[i].id), -ENOENT);
    }
    cr_assert_eq(cancelled + finished, N);
    cr_assert_geq(cancelled, 50, "cancelled %d", cancelled);
    struct llmd_stats st;
    llmd_stats_get(e, &st);
    cr_assert_eq(st.kv_pages_free + st.kv_pages_cached, st.kv_pages_total);
    cr_assert_eq(st.requests_waiting + st.requests_running, 0);
    llmd_engine_close(e);
}
