/* spec_util.h - what the speculative-decoding engine tests share: a job
 * (prompt text or ids, limits, stop strings) with its output, text, usage
 * and the step of each token; opening an engine; running it to the end
 * while checking after every step that each decoding job's sequence holds
 * exactly the pages its committed tokens need; the non-speculative oracle
 * and the comparison against it. Header-only (each test file is its own
 * binary). stories260K with f32 KV: 16 tokens a page. */
#ifndef LLMD_SPEC_TEST_UTIL_H
#define LLMD_SPEC_TEST_UTIL_H

#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmd.h"
#include "tests/lib/ref_util.h"

#define F32       REF_MODELS "/stories260K-f32.gguf"
#define SPEC_MAXN 512

struct job {
    const char *prompt; /* text, or ... */
    const int32_t *ids; /* ... ids (n_ids) */
    uint32_t n_ids;
    uint32_t max_tokens;
    int no_spec;
    const struct llmd_request *sampling; /* NULL: greedy; else a template: its sampler
                                          * fields (temperature ... stop_token_ids) are used */
    const char *stop[2];
    uint32_t n_stop;
    uint64_t id;
    int32_t out[SPEC_MAXN];
    uint32_t step_of[SPEC_MAXN]; /* the step each token came in */
    uint32_t n_out;
    char text[8192];
    size_t n_text;
    enum llmd_finish finish;
    uint32_t finish_step, finish_rank; /* the finish's step; its rank among that step's tokens */
    struct llmd_usage usage;
};

static uint32_t spec_step_now; /* the step being run, for on_token */

static inline void spec_on_token(void *user, uint64_t id, int32_t token, const char *text,
                                 size_t len, enum llmd_finish finish) {
    struct job *j = user;
    cr_assert_eq(id, j->id);
    cr_assert_eq(j->finish, LLMD_FINISH_NONE, "a token after the finish");
    uint32_t rank = 0;
    for (uint32_t k = j->n_out; k-- > 0 && j->step_of[k] == spec_step_now;)
        rank++;
    if (token >= 0 && finish != LLMD_FINISH_CANCELLED && j->n_out < SPEC_MAXN) {
        j->step_of[j->n_out] = spec_step_now;
        j->out[j->n_out++] = token;
    }
    if (j->n_text + len < sizeof(j->text)) {
        memcpy(j->text + j->n_text, text, len);
        j->n_text += len;
        j->text[j->n_text] = 0;
    }
    j->finish = finish;
    j->finish_step = spec_step_now;
    j->finish_rank = rank;
}

struct eng_opts {
    const char *model; /* NULL: stories260K f32 */
    uint32_t max_seqs, max_batched, spec_tokens, n_ctx;
    enum llmd_spec spec;
    const char *spec_model; /* LLMD_SPEC_DRAFT: the draft model */
    uint64_t budget, host_bytes;
    int no_map_ahead, no_prefix_cache;
    int adaptive; /* 1: the draft-length policy decides; 0: drafts run to spec_tokens */
};

static inline struct llmd_engine *open_engine(const struct eng_opts *o) {
    struct llmd_engine_config cfg = {.model = o->model ? o->model : F32,
                                     .n_threads = 2,
                                     .n_ctx = o->n_ctx ? o->n_ctx : 512,
                                     .max_seqs = o->max_seqs,
                                     .max_batched_tokens = o->max_batched,
                                     .kv_budget_bytes = o->budget,
                                     .kv_type = LLMD_KV_F32,
                                     .no_map_ahead = o->no_map_ahead,
                                     .no_prefix_cache = o->no_prefix_cache,
                                     .host_tier_bytes = o->host_bytes,
                                     .offload_always = o->host_bytes > 0,
                                     .spec = o->spec,
                                     .spec_tokens = o->spec_tokens,
                                     .spec_model_path = o->spec_model,
                                     .spec_fixed_len = !o->adaptive};
    struct llmd_engine *e;
    char err[512] = "";
    cr_assert_eq(llmd_engine_open(&cfg, &e, err, sizeof(err)), 0, "open: %s", err);
    return e;
}

static inline void submit(struct llmd_engine *e, struct job *j) {
    /* the sampler's fields from the template (greedy without one), the
     * job's own over them */
    struct llmd_request r = j->sampling ? *j->sampling : (struct llmd_request){0};
    r.prompt = j->ids ? NULL : j->prompt;
    r.prompt_len = j->ids ? 0 : strlen(j->prompt);
    r.prompt_ids = j->ids;
    r.n_prompt_ids = j->n_ids;
    r.max_tokens = j->max_tokens;
    r.stop = j->stop;
    r.n_stop = j->n_stop;
    r.on_token = spec_on_token;
    r.user = j;
    r.usage = &j->usage;
    r.no_speculative = j->no_spec;
    j->n_out = 0;
    j->n_text = 0;
    j->text[0] = 0;
    j->finish = LLMD_FINISH_NONE;
    cr_assert_eq(llmd_submit(e, &r, &j->id, NULL), 0);
}

/* Each running job that decodes: its KV holds prompt + completion - 1
 * tokens (the last token is computed by the next step), and its sequence
 * exactly the pages those need. With exact_pool (distinct prompts, no
 * prefix cache, no map-ahead), the pool's mapped pages are their sum. */
static inline void check_pages(struct llmd_engine *e, struct job *jobs, int n, bool exact_pool) {
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
        if (j->usage.completion_tokens == 0 || j->finish != LLMD_FINISH_NONE)
            continue; /* prefilling: its chunks' pages */
        uint32_t kv = j->usage.prompt_tokens + j->usage.completion_tokens - 1;
        uint32_t want = (kv + in.tokens_per_page - 1) / in.tokens_per_page;
        if (got < (int)want) {
            /* only a preempted job being prefilled again may hold fewer */
            struct llmd_stats st;
            llmd_stats_get(e, &st);
            if (st.preemptions_total)
                continue;
        }
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
static inline void run(struct llmd_engine *e, struct job *jobs, int n, bool exact_pool) {
    int live;
    uint32_t steps = 0;
    spec_step_now = 0;
    while ((spec_step_now++, live = llmd_engine_step(e)) > 0) {
        cr_assert_lt(++steps, 40000, "no progress");
        llmd_engine_sync(e);
        check_pages(e, jobs, n, exact_pool);
    }
    cr_assert_eq(live, 0, "step: %d", live);
    struct llmd_stats st;
    llmd_stats_get(e, &st);
    cr_assert_eq(st.kv_pages_free + st.kv_pages_cached, st.kv_pages_total, "pages left mapped");
}

/* The oracle: each job alone, without speculation, on an engine
 * like o (its context and budget) but with one sequence. */
static inline void solo_like(struct job *jobs, int n, const struct eng_opts *o) {
    struct eng_opts so = o ? *o : (struct eng_opts){0};
    so.max_seqs = 1;
    so.max_batched = so.max_batched ? so.max_batched : 64;
    so.spec = LLMD_SPEC_NONE;
    so.spec_model = NULL;
    so.host_bytes = 0;
    struct llmd_engine *e = open_engine(&so);
    for (int i = 0; i < n; i++) {
        submit(e, &jobs[i]);
        run(e, &jobs[i], 1, false);
        cr_assert_eq(jobs[i].usage.spec_draft_tokens, 0);
    }
    llmd_engine_close(e);
}

static inline void solo(struct job *jobs, int n) {
    solo_like(jobs, n, NULL);
}

static inline void expect_same(const struct job *a, const struct job *b, int n, const char *what) {
    for (int i = 0; i < n; i++) {
        cr_assert_eq(b[i].finish, a[i].finish, "%s: job %d finish %d, alone %d", what, i,
                     b[i].finish, a[i].finish);
        cr_assert_eq(b[i].n_out, a[i].n_out, "%s: job %d: %u tokens, alone %u", what, i, b[i].n_out,
                     a[i].n_out);
        for (uint32_t k = 0; k < a[i].n_out; k++)
            cr_assert_eq(b[i].out[k], a[i].out[k], "%s: job %d token %u: %d, alone %d", what, i, k,
                         b[i].out[k], a[i].out[k]);
        cr_assert_str_eq(b[i].text, a[i].text, "%s: job %d text", what, i);
        cr_assert_eq(b[i].usage.completion_tokens, a[i].usage.completion_tokens,
                     "%s: job %d usage: %u tokens, alone %u", what, i, b[i].usage.completion_tokens,
                     a[i].usage.completion_tokens);
    }
}

/* Usage and stats agree; at least min_accepted drafts were accepted. */
static inline void expect_counts(struct llmd_engine *e, const struct job *jobs, int n,
                                 uint64_t min_accepted, const char *what) {
    struct llmd_stats st;
    llmd_stats_get(e, &st);
    uint64_t drafted = 0, accepted = 0, hist_sum = 0, hist_n = 0;
    for (int i = 0; i < n; i++) {
        cr_assert_leq(jobs[i].usage.spec_accepted_tokens, jobs[i].usage.spec_draft_tokens);
        cr_assert_leq(jobs[i].usage.spec_accepted_tokens, jobs[i].usage.completion_tokens);
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
    cr_assert_geq(accepted, min_accepted, "%s: drafts were accepted (%lu of %lu)", what,
                  (unsigned long)accepted, (unsigned long)drafted);
    cr_log_info("%s: %lu steps, %lu drafted, %lu accepted, %lu pages rolled back", what,
                (unsigned long)st.steps_total, (unsigned long)drafted, (unsigned long)accepted,
                (unsigned long)st.spec_rollback_pages_total);
}

#endif /* LLMD_SPEC_TEST_UTIL_H */
