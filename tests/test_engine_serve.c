/* The engine end to end (include/llmd.h): continuous batching with chunked
 * prefill, queueing and preemption must not change a single greedy token,
 * so the llama2.c references are the oracle. */
#include <criterion/criterion.h>
#include <errno.h>

#include "llmd.h"
#include "tests/lib/ref_util.h"

#define F32    REF_MODELS "/stories260K-f32.gguf"
#define N_GEN  64
#define N_REQS REF_N_CASES

struct got {
    uint64_t id;
    int32_t ids[N_GEN + 1];
    int n;
    enum llmd_finish finish;
    char text[4096];
    size_t text_len;
    int calls_after_finish;
};

static void on_token(void *user, uint64_t id, int32_t token, const char *text, size_t len,
                     enum llmd_finish finish) {
    struct got *g = user;
    cr_assert_eq(id, g->id, "callback for %lu on request %lu", (unsigned long)id,
                 (unsigned long)g->id);
    if (g->finish != LLMD_FINISH_NONE)
        g->calls_after_finish++;
    if (token >= 0 && g->n <= N_GEN)
        g->ids[g->n++] = token;
    if (len && g->text_len + len < sizeof(g->text)) {
        memcpy(g->text + g->text_len, text, len);
        g->text_len += len;
    }
    g->finish = finish;
}

static struct llmd_engine *open_engine(uint32_t max_seqs, uint32_t max_batched, uint64_t budget) {
    struct llmd_engine_config cfg = {.model = F32,
                                     .n_threads = 2,
                                     .n_ctx = 512,
                                     .max_seqs = max_seqs,
                                     .max_batched_tokens = max_batched,
                                     .kv_budget_bytes = budget,
                                     .kv_type = LLMD_KV_F32};
    struct llmd_engine *e;
    char err[512] = "";
    cr_assert_eq(llmd_engine_open(&cfg, &e, err, sizeof(err)), 0, "open: %s", err);
    return e;
}

/* Submit all 7 reference prompts at once, run to completion, compare. */
static void run_all_references(struct llmd_engine *e, uint64_t *preemptions) {
    json_t *all = ref_load_all();
    cr_assert_not_null(all, "cannot read reference.jsonl");
    static struct got got[N_REQS];
    memset(got, 0, sizeof(got));
    for (int c = 0; c < N_REQS; c++) {
        json_t *ref = ref_find(all, "stories260K.bin", ref_cases[c]);
        const char *prompt = json_string_value(json_object_get(ref, "prompt"));
        struct llmd_request r = {.prompt = prompt,
                                 .prompt_len = strlen(prompt),
                                 .max_tokens = N_GEN,
                                 .on_token = on_token,
                                 .user = &got[c]};
        /* the id is known only on return: callbacks come later, in steps */
        cr_assert_eq(llmd_submit(e, &r, &got[c].id, NULL), 0, "submit %s", ref_cases[c]);
    }
    int live, steps = 0;
    while ((live = llmd_engine_step(e)) > 0)
        cr_assert_lt(++steps, 5000, "no progress");
    cr_assert_eq(live, 0, "step: %d", live);
    for (int c = 0; c < N_REQS; c++) {
        json_t *want =
            json_object_get(ref_find(all, "stories260K.bin", ref_cases[c]), "greedy_ids");
        cr_assert_eq(got[c].finish, LLMD_FINISH_LENGTH, "%s: finish %d", ref_cases[c],
                     got[c].finish);
        cr_assert_eq(got[c].n, N_GEN, "%s: %d tokens", ref_cases[c], got[c].n);
        cr_assert_eq(got[c].calls_after_finish, 0);
        for (int i = 0; i < N_GEN; i++)
            cr_assert_eq(got[c].ids[i], (int32_t)json_integer_value(json_array_get(want, i)),
                         "%s: token %d is %d", ref_cases[c], i, got[c].ids[i]);
    }
    struct llmd_stats st;
    llmd_stats_get(e, &st);
    /* every page is free, or cached for later prefix hits: none mapped */
    cr_assert_eq(st.kv_pages_free + st.kv_pages_cached, st.kv_pages_total,
                 "pages leaked: %lu free + %lu cached of %lu", (unsigned long)st.kv_pages_free,
                 (unsigned long)st.kv_pages_cached, (unsigned long)st.kv_pages_total);
    cr_assert_eq(st.generated_tokens_total, (uint64_t)N_REQS * N_GEN);
    if (preemptions)
        *preemptions = st.preemptions_total;
    json_decref(all);
}

/* 7 requests on 4 slots, 48 tokens a step: the long prompts (104 and 92
 * tokens) are prefilled in chunks next to other requests' decodes. */
Test(engine_serve, continuous_batching_matches_references, .timeout = 120) {
    struct llmd_engine *e = open_engine(4, 48, 0);
    run_all_references(e, NULL);
    llmd_engine_close(e);
}

/* A KV budget too small for 4 sequences at once: the scheduler preempts
 * and recomputes, and still not one token changes. */
Test(engine_serve, preemption_by_recompute_matches_references, .timeout = 120) {
    /* 22 pages of 16 tokens (f32 KV, 1280 B a token): the long prompts need
     * 11 pages each by the end */
    struct llmd_engine *e = open_engine(4, 64, 22 * 20480);
    uint64_t preemptions = 0;
    run_all_references(e, &preemptions);
    cr_assert_gt(preemptions, 0, "the budget was meant to force a preemption");
    llmd_engine_close(e);
}

Test(engine_serve, stop_string_ends_the_text_before_it, .timeout = 60) {
    struct llmd_engine *e = open_engine(2, 64, 0);
    struct got g = {0};
    const char *stop[] = {" Lily"};
    struct llmd_request r = {.prompt = "Once upon a time",
                             .prompt_len = 16,
                             .max_tokens = 64,
                             .stop = stop,
                             .n_stop = 1,
                             .on_token = on_token,
                             .user = &g};
    cr_assert_eq(llmd_submit(e, &r, &g.id, NULL), 0);
    while (llmd_engine_step(e) > 0)
        ;
    g.text[g.text_len] = '\0';
    /* the reference continues ", there was a little girl named Lily." */
    cr_assert_eq(g.finish, LLMD_FINISH_STOP, "finish %d: '%s'", g.finish, g.text);
    cr_assert_str_eq(g.text, ", there was a little girl named");
    llmd_engine_close(e);
}

Test(engine_serve, cancel_returns_pages_at_once, .timeout = 60) {
    struct llmd_engine *e = open_engine(2, 64, 0);
    struct got g = {0};
    struct llmd_request r = {.prompt = "Once upon a time",
                             .prompt_len = 16,
                             .max_tokens = 200,
                             .on_token = on_token,
                             .user = &g};
    cr_assert_eq(llmd_submit(e, &r, &g.id, NULL), 0);
    for (int i = 0; i < 40; i++)
        cr_assert_eq(llmd_engine_step(e), 1);
    struct llmd_stats st;
    llmd_stats_get(e, &st);
    cr_assert_lt(st.kv_pages_free, st.kv_pages_total, "a running request holds pages");
    cr_assert_eq(llmd_cancel(e, g.id), 0);
    cr_assert_eq(g.finish, LLMD_FINISH_CANCELLED);
    llmd_stats_get(e, &st);
    cr_assert_eq(st.kv_pages_free + st.kv_pages_cached, st.kv_pages_total);
    cr_assert_eq(llmd_cancel(e, g.id), -ENOENT);
    cr_assert_eq(llmd_engine_step(e), 0);
    llmd_engine_close(e);
}

Test(engine_serve, bad_requests_are_refused, .timeout = 60) {
    struct llmd_engine *e = open_engine(2, 64, 0);
    struct got g = {0};
    uint64_t id;
    struct llmd_request none = {.on_token = on_token, .user = &g};
    cr_assert_eq(llmd_submit(e, &none, &id, NULL), -EINVAL);
    int32_t bad[2] = {1, 9999};
    struct llmd_request oov = {
        .prompt_ids = bad, .n_prompt_ids = 2, .on_token = on_token, .user = &g};
    cr_assert_eq(llmd_submit(e, &oov, &id, NULL), -EINVAL);
    static int32_t longp[600];
    for (int i = 0; i < 600; i++)
        longp[i] = 300;
    struct llmd_request big = {
        .prompt_ids = longp, .n_prompt_ids = 600, .on_token = on_token, .user = &g};
    cr_assert_eq(llmd_submit(e, &big, &id, NULL), -E2BIG);
    cr_assert_eq(llmd_engine_step(e), 0);
    llmd_engine_close(e);
}
