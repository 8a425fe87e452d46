/* The prompt-lookup drafter (engine/core/spec.h): the longest recent match
 * of the text's last n tokens, n from n_max down to n_min, and the tokens
 * that followed it. Exact drafts for hand-made texts, then 20000 random
 * texts against a direct transcription of the definition, cut into
 * prompt and output at every kind of place. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/spec.h"

static const struct spec_ngram_config cfg4 = {.n_min = 1, .n_max = 4};

/* Draft for one array (all of it the "prompt"). */
static uint32_t draft1(const int32_t *t, uint32_t n, const struct spec_ngram_config *c,
                       int32_t *out, uint32_t k) {
    struct spec_text st = {.a = t, .n_a = n};
    return spec_ngram_draft(&st, c, out, k);
}

static void expect_draft(const int32_t *got, uint32_t n_got, const int32_t *want, uint32_t n_want) {
    cr_assert_eq(n_got, n_want, "drafted %u tokens, want %u", n_got, n_want);
    for (uint32_t i = 0; i < n_want; i++)
        cr_assert_eq(got[i], want[i], "draft[%u] = %d, want %d", i, got[i], want[i]);
}

Test(spec_ngram, continues_the_earlier_occurrence) {
    const int32_t t[] = {1, 2, 3, 4, 1, 2};
    int32_t out[8];
    uint32_t n = draft1(t, 6, &cfg4, out, 3);
    expect_draft(out, n, (const int32_t[]){3, 4, 1}, 3);
}

Test(spec_ngram, no_earlier_occurrence_drafts_nothing) {
    const int32_t t[] = {1, 2, 3, 4, 5, 6};
    int32_t out[8];
    cr_assert_eq(draft1(t, 6, &cfg4, out, 4), 0);
}

Test(spec_ngram, longer_match_beats_a_more_recent_shorter_one) {
    /* [1 2] occurs at 1..2 (then 9); [2] alone more recently at 5 (then 8) */
    const int32_t t[] = {5, 1, 2, 9, 7, 2, 8, 1, 2};
    int32_t out[8];
    uint32_t n = draft1(t, 9, &cfg4, out, 2);
    expect_draft(out, n, (const int32_t[]){9, 7}, 2);
    /* with n_max = 1 only the last token is matched: the most recent [2] */
    struct spec_ngram_config c1 = {.n_min = 1, .n_max = 1};
    n = draft1(t, 9, &c1, out, 2);
    expect_draft(out, n, (const int32_t[]){8, 1}, 2);
}

Test(spec_ngram, most_recent_of_equal_matches) {
    const int32_t t[] = {1, 2, 10, 1, 2, 11, 1, 2};
    int32_t out[8];
    uint32_t n = draft1(t, 8, &cfg4, out, 1);
    expect_draft(out, n, (const int32_t[]){11}, 1);
}

Test(spec_ngram, continuation_may_run_into_the_suffix) {
    /* period 3: the match [3 1 2] at 2..4 is followed by the text's own end */
    const int32_t t[] = {1, 2, 3, 1, 2, 3, 1, 2};
    int32_t out[8];
    uint32_t n = draft1(t, 8, &cfg4, out, 8);
    expect_draft(out, n, (const int32_t[]){3, 1, 2}, 3);
    /* a run of one token drafts more of it */
    const int32_t r[] = {7, 7, 7, 7};
    n = draft1(r, 4, &cfg4, out, 8);
    expect_draft(out, n, (const int32_t[]){7}, 1);
}

Test(spec_ngram, n_min_refuses_short_matches) {
    const int32_t t[] = {4, 9, 5, 6, 9};
    int32_t out[8];
    struct spec_ngram_config c2 = {.n_min = 2, .n_max = 4};
    cr_assert_eq(draft1(t, 5, &c2, out, 4), 0);
    uint32_t n = draft1(t, 5, &cfg4, out, 4);
    expect_draft(out, n, (const int32_t[]){5, 6, 9}, 3);
}

Test(spec_ngram, window_bounds_the_search) {
    int32_t t[40];
    for (int i = 0; i < 40; i++)
        t[i] = 100 + i;
    t[3] = 1;
    t[4] = 2;
    t[38] = 1;
    t[39] = 2; /* [1 2] at 3..4, 35 tokens before the end */
    int32_t out[8];
    struct spec_ngram_config c = {.n_min = 1, .n_max = 4, .window = 37};
    uint32_t n = draft1(t, 40, &c, out, 2);
    expect_draft(out, n, (const int32_t[]){105, 106}, 2);
    c.window = 36; /* [1 2] would start at 3, before the window's 4: only [2] at 4 is seen */
    n = draft1(t, 40, &c, out, 2);
    expect_draft(out, n, (const int32_t[]){105, 106}, 2);
    c.n_min = 2;
    cr_assert_eq(draft1(t, 40, &c, out, 2), 0);
}

Test(spec_ngram, degenerate_inputs_draft_nothing) {
    const int32_t t[] = {1, 1};
    int32_t out[4];
    cr_assert_eq(draft1(t, 2, &cfg4, out, 0), 0, "k = 0");
    cr_assert_eq(draft1(t, 1, &cfg4, out, 4), 0, "one token");
    cr_assert_eq(draft1(t, 0, &cfg4, out, 4), 0, "empty");
    cr_assert_eq(draft1(t, 2, &(struct spec_ngram_config){.n_min = 0, .n_max = 4}, out, 4), 0);
    cr_assert_eq(draft1(t, 2, &(struct spec_ngram_config){.n_min = 3, .n_max = 2}, out, 4), 0);
    cr_assert_eq(draft1(t, 2, &cfg4, out, 4), 1, "[1] then 1");
}

/* The definition, transcribed: for n = n_max..n_min, the latest start s
 * (s >= lo, continuation s + n <= len - 1) whose n tokens equal the last n. */
static uint32_t ref_draft(const int32_t *t, uint32_t len, const struct spec_ngram_config *c,
                          int32_t *out, uint32_t k) {
    uint32_t n_max = c->n_max > SPEC_NGRAM_N_MAX ? SPEC_NGRAM_N_MAX : c->n_max;
    uint32_t w = c->window ? c->window : SPEC_NGRAM_WINDOW, lo = len > w ? len - w : 0;
    if (k == 0)
        return 0;
    for (uint32_t n = n_max; n >= c->n_min && n >= 1; n--) {
        if (len < n + 1)
            continue;
        for (int64_t s = (int64_t)len - n - 1; s >= (int64_t)lo; s--) {
            if (memcmp(t + s, t + len - n, n * sizeof(*t)) != 0)
                continue;
            uint32_t from = (uint32_t)s + n, m = len - from < k ? len - from : k;
            memcpy(out, t + from, m * sizeof(*t));
            return m;
        }
    }
    return 0;
}

Test(spec_ngram, random_texts_match_the_definition_however_split) {
    srand(16);
    int32_t t[96], got[12], want[12];
    for (int iter = 0; iter < 20000; iter++) {
        uint32_t len = (uint32_t)(rand() % 96), alphabet = 2 + (uint32_t)(rand() % 6);
        for (uint32_t i = 0; i < len; i++)
            t[i] = (int32_t)(rand() % alphabet);
        struct spec_ngram_config c = {.n_min = 1 + (uint32_t)(rand() % 3)};
        c.n_max = c.n_min + (uint32_t)(rand() % 5);
        c.window = rand() % 3 ? 0 : 1 + (uint32_t)(rand() % 60);
        uint32_t k = (uint32_t)(rand() % 12), cut = len ? (uint32_t)(rand() % (len + 1)) : 0;
        struct spec_text st = {.a = t, .n_a = cut, .b = t + cut, .n_b = len - cut};
        uint32_t n = spec_ngram_draft(&st, &c, got, k);
        uint32_t m = ref_draft(t, len, &c, want, k);
        cr_assert_eq(n, m, "iter %d: len %u n %u..%u window %u k %u cut %u: %u tokens, want %u",
                     iter, len, c.n_min, c.n_max, c.window, k, cut, n, m);
        for (uint32_t i = 0; i < m; i++)
            cr_assert_eq(got[i], want[i], "iter %d: draft[%u]", iter, i);
    }
}
