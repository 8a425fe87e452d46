/* Sampler tests: greedy tie-breaking, filters, and seed reproducibility. */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>

#include "engine/model/smp.h"
#include "tests/lib/stat_util.h"

Test(smp, greedy_takes_lowest_id_on_tie) {
    float l[6] = {1.0f, 3.0f, NAN, 3.0f, -INFINITY, 2.0f};
    cr_assert_eq(smp_argmax(l, 6), 1, "argmax %d", smp_argmax(l, 6));
    struct smp *s;
    struct smp_params p = smp_params_default();
    cr_assert_eq(smp_create(&p, 6, &s), 0);
    cr_assert_eq(smp_sample(s, l), 1);
    smp_destroy(s);
}

Test(smp, top_k_one_is_greedy) {
    float l[5] = {0.5f, 0.1f, 2.5f, 2.4f, -1.0f};
    struct smp_params p = {
        .temperature = 1.5f, .top_k = 1, .top_p = 1.0f, .min_p = 0.0f, .seed = 7};
    struct smp *s;
    cr_assert_eq(smp_create(&p, 5, &s), 0);
    for (int i = 0; i < 100; i++)
        cr_assert_eq(smp_sample(s, l), 2);
    smp_destroy(s);
}

Test(smp, min_p_removes_unlikely_ids) {
    /* p(0) ~ 0.73, p(1) ~ 0.27, p(2) ~ 3e-5: min_p 0.1 keeps only ids 0 and 1 */
    float l[3] = {11.0f, 10.0f, 0.5f};
    struct smp_params p = {
        .temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.1f, .seed = 3};
    struct smp *s;
    cr_assert_eq(smp_create(&p, 3, &s), 0);
    int counts[3] = {0};
    for (int i = 0; i < 4000; i++)
        counts[smp_sample(s, l)]++;
    cr_assert_eq(counts[2], 0, "id 2 drawn %d times", counts[2]);
    /* expected 0.731 of 4000 = 2924, binomial sd ~ 28 */
    cr_assert(counts[0] > 2750 && counts[0] < 3100, "id 0 drawn %d times", counts[0]);
    smp_destroy(s);
}

Test(smp, top_p_keeps_the_nucleus) {
    float l[4] = {3.0f, 2.9f, 0.0f, -1.0f}; /* p ~ .50 .45 .03 .01 */
    struct smp_params p = {
        .temperature = 1.0f, .top_k = 0, .top_p = 0.9f, .min_p = 0.0f, .seed = 11};
    struct smp *s;
    cr_assert_eq(smp_create(&p, 4, &s), 0);
    for (int i = 0; i < 2000; i++) {
        int32_t id = smp_sample(s, l);
        cr_assert(id == 0 || id == 1, "drew %d outside the nucleus", id);
    }
    smp_destroy(s);
}

Test(smp, same_seed_same_ids) {
    float l[64];
    for (int i = 0; i < 64; i++)
        l[i] = sinf((float)i);
    struct smp_params p = {
        .temperature = 0.8f, .top_k = 20, .top_p = 0.95f, .min_p = 0.0f, .seed = 42};
    struct smp *a, *b;
    cr_assert_eq(smp_create(&p, 64, &a), 0);
    cr_assert_eq(smp_create(&p, 64, &b), 0);
    int differ = 0;
    for (int i = 0; i < 200; i++) {
        int32_t x = smp_sample(a, l), y = smp_sample(b, l);
        cr_assert_eq(x, y, "step %d: %d vs %d", i, x, y);
    }
    p.seed = 43;
    struct smp *c;
    cr_assert_eq(smp_create(&p, 64, &c), 0);
    for (int i = 0; i < 50; i++)
        differ += smp_sample(a, l) != smp_sample(c, l);
    cr_assert(differ > 0, "a different seed must give a different sequence");
    smp_destroy(a);
    smp_destroy(b);
    smp_destroy(c);
}

Test(smp, rejects_bad_params) {
    struct smp *s = NULL;
    struct smp_params p = smp_params_default();
    cr_assert_eq(smp_create(&p, 0, &s), -EINVAL);
    p.top_p = 1.5f;
    cr_assert_eq(smp_create(&p, 10, &s), -EINVAL);
    cr_assert_null(s);
}

/* --- smp_verify: speculative sampling keeps the distribution ------------ */

/* The distribution smp_sample() draws from for temperature t and top_k k,
 * computed here independently: softmax(l / t) over the k largest. */
static void ref_probs(const float *l, uint32_t n, float t, int k, double *p) {
    double mx = -INFINITY, sum = 0;
    for (uint32_t i = 0; i < n; i++)
        mx = l[i] / t > mx ? l[i] / t : mx;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t above = 0; /* ids ranked before i */
        for (uint32_t j = 0; j < n; j++)
            above += l[j] > l[i] || (l[j] == l[i] && j < i);
        p[i] = k > 0 && above >= (uint32_t)k ? 0.0 : exp(l[i] / t - mx);
        sum += p[i];
    }
    for (uint32_t i = 0; i < n; i++)
        p[i] /= sum;
}

/* N verifications of `draft`: the committed ids follow p (Pearson's test,
 * false-alarm rate 1e-4 per case), the acceptance rate is p(draft) (within
 * 5 binomial sd), and a rejection never returns the draft. */
static void verify_case(float t, int k, int32_t draft, uint64_t seed) {
    enum { V = 10, N = 100000 };
    const float l[V] = {1.2f, 0.3f, 2.0f, -0.5f, 1.9f, 0.0f, -2.0f, 0.8f, 1.5f, -1.0f};
    double p[V];
    ref_probs(l, V, t, k, p);
    struct smp_params sp = {.temperature = t, .top_k = k, .top_p = 1.0f, .seed = seed};
    struct smp *s;
    cr_assert_eq(smp_create(&sp, V, &s), 0);
    uint64_t counts[V] = {0}, acc = 0;
    for (int i = 0; i < N; i++) {
        bool a = false;
        int32_t id = smp_verify(s, l, draft, &a);
        cr_assert(id >= 0 && id < V, "id %d", id);
        cr_assert_eq(a, id == draft, "accepted %d but id %d, draft %d", a, id, draft);
        counts[id]++;
        acc += a;
    }
    smp_destroy(s);
    double chi2;
    uint32_t df;
    double pv = stat_chi2_p(counts, p, V, N, &chi2, &df);
    cr_assert_gt(pv, 1e-4, "t %.2f k %d draft %d: chi2 %.1f on %u df, p-value %.2g", t, k, draft,
                 chi2, df, pv);
    double pd = draft >= 0 && draft < V ? p[draft] : 0.0, sd = sqrt(N * pd * (1 - pd));
    cr_assert_leq(fabs((double)acc - N * pd), 5 * sd + 1e-9, "accepted %lu, expected %.0f",
                  (unsigned long)acc, N * pd);
}

Test(smp_verify, accepts_with_p_and_keeps_the_distribution) {
    verify_case(1.0f, 0, 4, 11);  /* a likely draft */
    verify_case(0.7f, 0, 1, 12);  /* an unlikely one */
    verify_case(1.3f, 4, 2, 13);  /* the top id under top-k */
    verify_case(1.0f, 3, 7, 14);  /* filtered out by top-k: never accepted */
    verify_case(1.0f, 0, 99, 15); /* outside the vocabulary */
}

Test(smp_verify, greedy_is_the_argmax_and_draws_nothing) {
    const float l[4] = {0.1f, 3.0f, 3.0f, -1.0f};
    struct smp_params sp = {.temperature = 0.0f, .seed = 5};
    struct smp *s;
    cr_assert_eq(smp_create(&sp, 4, &s), 0);
    bool a = true;
    cr_assert_eq(smp_verify(s, l, 2, &a), 1, "the lowest id of a tie, as smp_sample");
    cr_assert(!a);
    cr_assert_eq(smp_verify(s, l, 1, &a), 1);
    cr_assert(a);
    smp_destroy(s);
}

/* The coupling: whatever is drafted, smp_verify() commits the token
 * smp_sample() draws from the same generator state, and spends the same one
 * draw on it, so a seeded request's ids do not depend on its drafts. */
Test(smp_verify, commits_what_smp_sample_draws_whatever_the_draft) {
    const float l[6] = {1.0f, 0.2f, 1.1f, -0.3f, 0.9f, -5.0f};
    struct smp_params sp = {.temperature = 0.9f, .top_k = 5, .top_p = 0.95f, .seed = 99};
    struct smp *a, *b;
    cr_assert_eq(smp_create(&sp, 6, &a), 0);
    cr_assert_eq(smp_create(&sp, 6, &b), 0);
    uint32_t acc = 0, rej = 0;
    for (int i = 0; i < 2000; i++) {
        int32_t draft = (int32_t)((i * 7 + i / 3) % 8) - 1; /* -1..6: outside the vocabulary too */
        bool ok = true;
        int32_t got = smp_verify(a, l, draft, &ok), want = smp_sample(b, l);
        cr_assert_eq(got, want, "draw %d: verify %d, sample %d (draft %d)", i, got, want, draft);
        cr_assert_eq(ok, got == draft);
        acc += ok;
        rej += !ok;
    }
    cr_assert(acc > 100 && rej > 100, "%u accepted, %u rejected", acc, rej);
    smp_destroy(a);
    smp_destroy(b);
}

Test(smp_verify, sampling_ids_are_unchanged_by_the_refactor) {
    /* smp_sample() shares its distribution with smp_verify() now; its draws
     * must be those of before (ids recorded from the sampler of e317fdf) */
    const float l[5] = {0.5f, 0.1f, 2.5f, 2.4f, -1.0f};
    static const int32_t want[2][12] = {{2, 2, 3, 0, 4, 3, 3, 3, 3, 3, 3, 2},
                                        {3, 2, 3, 3, 3, 3, 2, 2, 2, 2, 3, 3}};
    struct smp_params sp[2] = {
        {.temperature = 1.0f, .top_p = 1.0f, .seed = 42},
        {.temperature = 0.8f, .top_k = 3, .top_p = 0.9f, .min_p = 0.05f, .seed = 7}};
    for (int c = 0; c < 2; c++) {
        struct smp *s;
        cr_assert_eq(smp_create(&sp[c], 5, &s), 0);
        for (int i = 0; i < 12; i++) {
            int32_t id = smp_sample(s, l);
            cr_assert_eq(id, want[c][i], "case %d draw %d: %d, want %d", c, i, id, want[c][i]);
        }
        smp_destroy(s);
    }
}

/* smp_logprobs: log_softmax with ties by lower id, -inf and underflow at the
 * floor, NaN skipped. */
Test(smp_logprobs, ties_infinities_and_the_floor) {
    float lg[6] = {-INFINITY, 1.0f, 2.0f, 2.0f, NAN, 0.0f};
    struct smp_logprob top[4];
    float chosen;
    smp_logprobs(lg, 6, 0, 4, -9999.0f, &chosen, top);
    cr_assert_eq(chosen, -9999.0f, "-inf reads as the floor");
    double lse = 2.0 + log(exp(-1.0) + 2.0 + exp(-2.0));
    int32_t want[4] = {2, 3, 1, 5}; /* equal logits: the lower id first; NaN skipped */
    for (int k = 0; k < 4; k++) {
        cr_assert_eq(top[k].id, want[k], "top %d: %d want %d", k, top[k].id, want[k]);
        cr_assert(fabs(top[k].lp - (lg[want[k]] - lse)) < 1e-6, "top %d: %f", k, top[k].lp);
    }
    smp_logprobs(lg, 6, 2, 0, -9999.0f, &chosen, top);
    cr_assert(fabs(chosen - (2.0 - lse)) < 1e-6, "%f", chosen);
    smp_logprobs(lg, 6, 99, 0, -9999.0f, &chosen, top);
    cr_assert_eq(chosen, -9999.0f, "an id out of range");
    /* a huge gap underflows below the floor */
    float gap[2] = {0.0f, -1e6f};
    smp_logprobs(gap, 2, 1, 2, -9999.0f, &chosen, top);
    cr_assert_eq(chosen, -9999.0f);
    cr_assert_eq(top[1].lp, -9999.0f);
    cr_assert_eq(top[0].id, 0);
}

/* smp_logits: the bias, then the repetition penalty over the prompt's and
 * the generated tokens, then frequency and presence over the generated
 * ones, each value exactly as the formulas give it (in f32). */
Test(smp_logits, penalties_and_bias_follow_the_formulas) {
    float lg[5] = {2.0f, -1.0f, 0.5f, 3.0f, -2.0f};
    int32_t ids[2] = {4, 0};
    float bias[2] = {10.0f, -1.0f};
    struct smp_params p = {.temperature = 0,
                           .presence_penalty = 0.5f,
                           .frequency_penalty = 0.25f,
                           .repetition_penalty = 1.5f,
                           .bias_ids = ids,
                           .bias = bias,
                           .n_bias = 2};
    struct smp *s;
    cr_assert_eq(smp_create(&p, 5, &s), 0);
    bias[0] = 0; /* copied at creation */
    int32_t prompt[1] = {1};
    smp_prompt(s, prompt, 1);
    smp_accept(s, 3);
    smp_accept(s, 3);
    smp_accept(s, 2);
    const float *out = smp_logits(s, lg);
    float want[5] = {
        2.0f - 1.0f,                      /* bias only: not seen */
        -1.0f * 1.5f,                     /* in the prompt: negative, multiplied */
        0.5f / 1.5f - (1 * 0.25f + 0.5f), /* generated once */
        3.0f / 1.5f - (2 * 0.25f + 0.5f), /* generated twice */
        -2.0f + 10.0f,                    /* biased, never seen */
    };
    for (int v = 0; v < 5; v++)
        cr_assert_float_eq(out[v], want[v], 1e-6, "logit %d: %f want %f", v, out[v], want[v]);
    cr_assert_eq(lg[3], 3.0f, "the input row is untouched");
    cr_assert_eq(smp_sample(s, lg), 4, "greedy over the processed row");
    smp_destroy(s);

    struct smp_params plain = {.temperature = 0};
    cr_assert_eq(smp_create(&plain, 5, &s), 0);
    smp_accept(s, 3);
    cr_assert_eq(smp_logits(s, lg), lg, "nothing on: the row itself");
    smp_destroy(s);

    int32_t bad_id[1] = {5};
    struct smp_params b = {.bias_ids = bad_id, .bias = bias, .n_bias = 1};
    cr_assert_eq(smp_create(&b, 5, &s), -EINVAL, "a bias id outside the vocabulary");
    b = (struct smp_params){.repetition_penalty = -1};
    cr_assert_eq(smp_create(&b, 5, &s), -EINVAL);
    b = (struct smp_params){.presence_penalty = NAN};
    cr_assert_eq(smp_create(&b, 5, &s), -EINVAL);
}
