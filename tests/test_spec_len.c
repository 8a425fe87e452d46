/* The draft-length policy (engine/core/spec.h): the acceptance estimate
 * follows a request's recent drafts and forgets, and the joint plan gives
 * each request the draft that maximises the step's throughput under the
 * cost model -- checked against an exhaustive search -- which is none when
 * the step is compute-bound or the drafts keep failing. */
#include <criterion/criterion.h>
#include <math.h>

#include "engine/core/spec.h"
#include "tests/lib/kern_util.h"

Test(spec_len, estimate_follows_acceptance_and_forgets) {
    struct spec_len l = {0};
    cr_assert_float_eq(spec_len_alpha(&l, 0.5), 0.5, 1e-12, "the prior");
    for (int i = 0; i < 40; i++)
        spec_len_update(&l, 4, 4);
    cr_assert_gt(spec_len_alpha(&l, 0.5), 0.95, "all accepted: %f", spec_len_alpha(&l, 0.5));
    for (int i = 0; i < 40; i++) /* the accepted ones forgotten: 0.8^40 */
        spec_len_update(&l, 4, 0);
    cr_assert_lt(spec_len_alpha(&l, 0.5), 0.15, "all rejected (1/7 at the steady state): %f",
                 spec_len_alpha(&l, 0.5));
    /* a draft of 4 with 2 accepted: 2 successes and a failure */
    struct spec_len m = {0};
    cr_assert_eq(spec_len_cap(&m, 8), SPEC_LEN_CAP0);
    spec_len_update(&m, 4, 2);
    cr_assert_float_eq(m.s, 2.0f, 1e-6);
    cr_assert_float_eq(m.f, 1.0f, 1e-6);
    /* the cap: what was accepted + 1 after a rejection, 2 more after a full run */
    cr_assert_eq(spec_len_cap(&m, 8), 3);
    spec_len_update(&m, 3, 3);
    cr_assert_eq(spec_len_cap(&m, 8), 5);
    cr_assert_eq(spec_len_cap(&m, 4), 4, "never past k_max");
    spec_len_update(&m, 5, 0);
    cr_assert_eq(spec_len_cap(&m, 8), 1);
    spec_len_update(&m, 0, 0);
    cr_assert_eq(spec_len_cap(&m, 8), 1, "a step without a draft keeps it");
    /* steps without a draft: back toward the prior */
    double a0 = spec_len_alpha(&l, 0.5);
    for (int i = 0; i < 200; i++)
        spec_len_update(&l, 0, 0);
    cr_assert_gt(spec_len_alpha(&l, 0.5), a0);
    cr_assert_float_eq(spec_len_alpha(&l, 0.5), 0.5, 0.01, "%f", spec_len_alpha(&l, 0.5));
}

/* Returned tokens per ns of a choice, the step taking extra_ns more than
 * the target's forward pass (a draft model's passes). */
static double rate_plus(const struct spec_cost *c, const double *alpha, const uint32_t *k,
                        uint32_t n, uint32_t other, double extra_ns) {
    double ret = other, tok = n + other;
    for (uint32_t i = 0; i < n; i++) {
        for (uint32_t j = 0; j <= k[i]; j++)
            ret += pow(alpha[i], j);
        tok += k[i];
    }
    return ret / (c->fixed_ns + c->token_ns * tok + extra_ns);
}

static double rate(const struct spec_cost *c, const double *alpha, const uint32_t *k, uint32_t n,
                   uint32_t other) {
    return rate_plus(c, alpha, k, n, other, 0);
}

/* The best throughput over every assignment of k in [0, k_max]^n. */
static double best_rate(const struct spec_cost *c, const double *alpha, const uint32_t *k_max,
                        uint32_t n, uint32_t other) {
    uint32_t k[4] = {0};
    double best = 0;
    for (;;) {
        double r = rate(c, alpha, k, n, other);
        best = r > best ? r : best;
        uint32_t i = 0;
        while (i < n && k[i] == k_max[i])
            k[i++] = 0;
        if (i == n)
            return best;
        k[i]++;
    }
}

Test(spec_len, plan_reaches_the_best_throughput) {
    srand(3);
    for (int iter = 0; iter < 3000; iter++) {
        uint32_t n = 1 + (uint32_t)(rand() % 3), k_max[4], k[4], other = (uint32_t)(rand() % 8);
        double alpha[4];
        for (uint32_t i = 0; i < n; i++) {
            alpha[i] = (double)(rand() % 1000) / 1000.0;
            k_max[i] = (uint32_t)(rand() % 7);
        }
        struct spec_cost c = {.fixed_ns = 1 + rand() % 100000, .token_ns = 1 + rand() % 20000};
        spec_len_plan(&c, NULL, alpha, k_max, n, other, k);
        double got = rate(&c, alpha, k, n, other), want = best_rate(&c, alpha, k_max, n, other);
        for (uint32_t i = 0; i < n; i++)
            cr_assert_leq(k[i], k_max[i]);
        cr_assert_geq(got, want * (1 - 1e-9), "iter %d: %.6g of the best %.6g", iter, got, want);
    }
}

Test(spec_len, compute_bound_steps_and_failing_drafts_get_none) {
    /* stories260K on this Xeon: a step is ~30 us + 35 us a token */
    struct spec_cost small = {.fixed_ns = 30e3, .token_ns = 35e3};
    /* a bandwidth-bound decode: 4 ms to read the weights, 0.7 ms a token */
    struct spec_cost big = {.fixed_ns = 4e6, .token_ns = 0.7e6};
    double a[8];
    uint32_t km[8], k[8];
    for (int i = 0; i < 8; i++) {
        a[i] = 0.3;
        km[i] = 8;
    }
    spec_len_plan(&small, NULL, a, km, 1, 0, k);
    cr_assert_eq(k[0], 0, "a compute-bound step: no draft at alpha 0.3");
    spec_len_plan(&big, NULL, a, km, 1, 0, k);
    cr_assert_gt(k[0], 0, "a bandwidth-bound one drafts at alpha 0.3: k %u", k[0]);
    a[0] = 0.95;
    spec_len_plan(&small, NULL, a, km, 1, 0, k);
    cr_assert_gt(k[0], 2, "likely drafts pay even when small: k %u", k[0]);
    spec_len_plan(&big, NULL, a, km, 1, 0, k);
    cr_assert_eq(k[0], 8, "and run to k_max when big");
    /* 8 decodes and 200 prefill tokens beside: the big model's step is
     * compute-bound now, and an alpha of 0.3 is no longer worth a token */
    a[0] = 0.3;
    spec_len_plan(&big, NULL, a, km, 8, 200, k);
    for (int i = 0; i < 8; i++)
        cr_assert_eq(k[i], 0, "request %d: k %u", i, k[i]);
    a[0] = 0.01;
    spec_len_plan(&big, NULL, a, km, 1, 0, k);
    cr_assert_eq(k[0], 0, "failing drafts: none");
    struct spec_cost bad = {0};
    k[0] = 5;
    spec_len_plan(&bad, NULL, a, km, 1, 0, k);
    cr_assert_eq(k[0], 0, "no cost model: no draft");
}

/* The draft model's time for a choice, written out from spec.h's formula:
 * the first pass when anything is drafted (or it runs anyway: then with
 * the step's other work), over each drafting request's lag and last token;
 * one more pass a draft position past the first. */
static double draft_ns(const struct spec_draft_step *d, const uint32_t *k, uint32_t n,
                       uint32_t other) {
    uint32_t longest = 0;
    double first = d->cost.fixed_ns + (d->runs ? d->cost.token_ns * other : 0), ns = 0;
    for (uint32_t i = 0; i < n; i++) {
        longest = k[i] > longest ? k[i] : longest;
        if (k[i])
            first += d->cost.token_ns * (1 + d->lag[i]);
    }
    if (d->runs || longest > 0)
        ns += first;
    for (uint32_t j = 1; j < longest; j++)
        for (uint32_t i = 0, first_i = 1; i < n; i++)
            if (k[i] > j) {
                ns += d->cost.token_ns + (first_i ? d->cost.fixed_ns : 0);
                first_i = 0;
            }
    return ns;
}

static double rate_d(const struct spec_cost *c, const struct spec_draft_step *d,
                     const double *alpha, const uint32_t *k, uint32_t n, uint32_t other) {
    return rate_plus(c, alpha, k, n, other, draft_ns(d, k, n, other));
}

/* With a draft model its passes are part of the step: the plan still
 * reaches the best throughput of every assignment (exhaustive search over
 * k in [0, k_max]^n, the draft's time as spec.h defines it). */
Test(spec_len, plan_with_a_draft_model_reaches_the_best_throughput) {
    srand(5);
    int drafted = 0, none = 0;
    for (int iter = 0; iter < 4000; iter++) {
        uint32_t n = 1 + (uint32_t)(rand() % 3), k_max[4], k[4], lag[4],
                 other = (uint32_t)(rand() % 8);
        double alpha[4];
        for (uint32_t i = 0; i < n; i++) {
            alpha[i] = (double)(rand() % 1000) / 1000.0;
            k_max[i] = (uint32_t)(rand() % 7);
            lag[i] = (uint32_t)(rand() % 3 ? 0 : rand() % 40);
        }
        struct spec_cost c = {.fixed_ns = 1 + rand() % 100000, .token_ns = 1 + rand() % 20000};
        struct spec_draft_step d = {
            .cost = {.fixed_ns = rand() % 60000, .token_ns = rand() % 8000},
            .runs = rand() % 4 == 0,
            .lag = lag,
        };
        spec_len_plan(&c, &d, alpha, k_max, n, other, k);
        /* the exhaustive search, over the same rate */
        uint32_t t[4] = {0};
        double want = 0;
        for (;;) {
            double r = rate_d(&c, &d, alpha, t, n, other);
            want = r > want ? r : want;
            uint32_t i = 0;
            while (i < n && t[i] == k_max[i])
                t[i++] = 0;
            if (i == n)
                break;
            t[i]++;
        }
        double got = rate_d(&c, &d, alpha, k, n, other);
        uint32_t sum = 0;
        for (uint32_t i = 0; i < n; i++) {
            cr_assert_leq(k[i], k_max[i]);
            sum += k[i];
        }
        sum ? drafted++ : none++;
        cr_assert_geq(got, want * (1 - 1e-9), "iter %d: %.6g of the best %.6g", iter, got, want);
    }
    cr_log_info("%d plans drafted, %d did not", drafted, none);
    cr_assert_gt(drafted, 500);
    cr_assert_gt(none, 500);
}

/* The cases bench_spec measures: a draft as costly as the target (a q8_0
 * copy of a tiny compute-bound model: every draft accepted still loses)
 * drafts nothing; a draft a tenth of a bandwidth-bound target's cost
 * drafts long where drafts are accepted and nothing where they are not; a
 * long lag (the draft has not run the last 1000 tokens) makes a first draft
 * not worth its catch-up, even when the pass runs anyway (the catch-up is
 * the drafting request's alone), while another request's lag costs it
 * nothing (a decode that drafts nothing stays out of the pass). */
Test(spec_len, a_draft_models_passes_decide_the_length) {
    const struct spec_cost tiny = {.fixed_ns = 19.8e3, .token_ns = 33.9e3};
    const struct spec_cost big = {.fixed_ns = 40e6, .token_ns = 1e6};
    uint32_t lag[8] = {0}, km[8], k[8];
    double a[8];
    for (int i = 0; i < 8; i++) {
        a[i] = 0.95;
        km[i] = 8;
    }
    struct spec_draft_step same = {.cost = {.fixed_ns = 19.8e3, .token_ns = 33.9e3}, .lag = lag};
    spec_len_plan(&tiny, &same, a, km, 1, 0, k);
    cr_assert_eq(k[0], 0, "a draft as costly as the target: k %u", k[0]);
    spec_len_plan(&tiny, NULL, a, km, 1, 0, k);
    cr_assert_gt(k[0], 0, "free drafts at alpha 0.95 would go in: k %u", k[0]);
    struct spec_draft_step tenth = {.cost = {.fixed_ns = 4e6, .token_ns = 0.1e6}, .lag = lag};
    spec_len_plan(&big, &tenth, a, km, 1, 0, k);
    cr_assert_geq(k[0], 6, "a cheap draft, likely accepted: k %u", k[0]);
    spec_len_plan(&big, &tenth, a, km, 8, 0, k);
    for (int i = 0; i < 8; i++)
        cr_assert_geq(k[i], 6, "batch 8, request %d: k %u", i, k[i]);
    a[0] = 0.05;
    spec_len_plan(&big, &tenth, a, km, 1, 0, k);
    cr_assert_eq(k[0], 0, "a cheap draft, rarely accepted: k %u", k[0]);
    a[0] = 0.6;
    spec_len_plan(&big, &tenth, a, km, 1, 0, k);
    uint32_t fresh = k[0];
    cr_assert_gt(fresh, 0, "alpha 0.6: k %u", fresh);
    lag[0] = 1000; /* 1000 tokens to catch up: a 104 ms draft pass */
    spec_len_plan(&big, &tenth, a, km, 1, 0, k);
    cr_assert_eq(k[0], 0, "a long lag to catch up first: k %u", k[0]);
    tenth.runs = true; /* the pass runs anyway: its fixed part is paid, the lag not */
    spec_len_plan(&big, &tenth, a, km, 1, 0, k);
    cr_assert_eq(k[0], 0, "the pass runs anyway, the lag is still this draft's: k %u", k[0]);
    tenth.runs = false;
    /* request 1 drafts likely tokens; request 0 lags 1000 and fails: its lag
     * is no part of request 1's price */
    a[0] = 0.05;
    a[1] = 0.6;
    lag[1] = 0;
    spec_len_plan(&big, &tenth, a, km, 2, 0, k);
    cr_assert_eq(k[0], 0);
    cr_assert_gt(k[1], 0, "another request's lag: k %u", k[1]);
}

/* The step's time as spec_catch_up_plan prices it, and its budget. */
static double catch_up_budget(const struct spec_cost *c, const struct spec_draft_step *d,
                              const double *alpha, const uint32_t *k, uint32_t n, uint32_t other) {
    (void)alpha;
    double tok = n + other;
    bool drafts = false;
    for (uint32_t i = 0; i < n; i++) {
        tok += k[i];
        drafts |= k[i] > 0;
    }
    double b = SPEC_CATCH_UP_SHARE * (c->fixed_ns + c->token_ns * tok + draft_ns(d, k, n, other));
    return drafts || d->runs ? b : b - d->cost.fixed_ns;
}

/* The lock-out, and its end: a request at batch 1 whose draft (a tenth of
 * the target's cost, alpha 0.9) lags 2000 tokens never drafts on the plan
 * alone (its lag grows a token a step), and with the spare catch-up drafts
 * again within the steps its lag takes at the spare rate; no step spends
 * more than its share. */
Test(spec_len, spare_catch_up_ends_the_lock_out) {
    const struct spec_cost big = {.fixed_ns = 40e6, .token_ns = 1e6};
    uint32_t lag[1] = {2000}, km[1] = {8}, k[1], spare[1];
    double a[1] = {0.9};
    struct spec_draft_step d = {.cost = {.fixed_ns = 4e6, .token_ns = 0.1e6}, .lag = lag};
    for (int step = 0; step < 1000; step++, lag[0]++) { /* the plan alone */
        spec_len_plan(&big, &d, a, km, 1, 0, k);
        cr_assert_eq(k[0], 0, "step %d, lag %u: drafted %u", step, lag[0], k[0]);
    }
    lag[0] = 2000;
    int steps = 0;
    uint32_t first = 0;
    for (; steps < 1000; steps++) {
        spec_len_plan(&big, &d, a, km, 1, 0, k);
        spec_catch_up_plan(&big, &d, a, km, k, 1, 0, spare);
        if (k[0] > 0) {
            cr_assert_eq(spare[0], 0, "a request that drafts catches up in its pass");
            break;
        }
        cr_assert_gt(spare[0], 0, "step %d, lag %u: no spare catch-up", steps, lag[0]);
        cr_assert_leq(spare[0], lag[0]);
        double budget = catch_up_budget(&big, &d, a, k, 1, 0);
        cr_assert_leq(spare[0] * d.cost.token_ns, budget + 1e-6, "step %d: %u tokens over %.0f ns",
                      steps, spare[0], budget);
        if (!steps)
            first = spare[0];
        lag[0] = lag[0] + 1 - spare[0]; /* its own new token, less the spare */
    }
    /* a step's budget: (40 + 1) ms / 8 - 4 ms of the pass = 1.125 ms: 11 tokens */
    cr_assert_eq(first, 11, "the first step's spare %u", first);
    cr_assert_lt(steps, 2000 / 10, "drafting again after %d steps (lag %u)", steps, lag[0]);
    cr_assert_gt(k[0], 0);
    cr_log_info("drafting again after %d steps of spare catch-up, at lag %u, k %u", steps, lag[0],
                k[0]);
}

/* What the spare catch-up never does: spend on requests whose drafts would
 * not pay caught up (a draft as costly as the target; drafts that fail),
 * on requests that draft this step or do not lag, or beyond the step's
 * share; and it goes to the smallest lags first. Random batches. */
Test(spec_len, spare_catch_up_stays_in_its_budget) {
    const struct spec_cost tiny = {.fixed_ns = 19.8e3, .token_ns = 33.9e3};
    uint32_t lag[8], km[8], k[8], spare[8], k0[8];
    double a[8];
    for (int i = 0; i < 8; i++) {
        a[i] = 0.95;
        km[i] = 8;
        lag[i] = 500;
    }
    struct spec_draft_step same = {.cost = {.fixed_ns = 19.8e3, .token_ns = 33.9e3}, .lag = lag};
    spec_len_plan(&tiny, &same, a, km, 8, 0, k);
    spec_catch_up_plan(&tiny, &same, a, km, k, 8, 0, spare);
    for (int i = 0; i < 8; i++)
        cr_assert_eq(spare[i], 0, "a draft that never pays: request %d spare %u", i, spare[i]);
    srand(11);
    int spent = 0;
    for (int iter = 0; iter < 4000; iter++) {
        uint32_t n = 1 + (uint32_t)(rand() % 8), other = (uint32_t)(rand() % 8);
        for (uint32_t i = 0; i < n; i++) {
            a[i] = (double)(rand() % 1000) / 1000.0;
            km[i] = (uint32_t)(rand() % 9);
            lag[i] = (uint32_t)(rand() % 3 ? 0 : rand() % 3000);
        }
        struct spec_cost c = {.fixed_ns = 1 + rand() % 100000, .token_ns = 1 + rand() % 20000};
        struct spec_draft_step d = {
            .cost = {.fixed_ns = rand() % 20000, .token_ns = 1 + rand() % 2000},
            .runs = rand() % 4 == 0,
            .lag = lag,
        };
        spec_len_plan(&c, &d, a, km, n, other, k);
        spec_catch_up_plan(&c, &d, a, km, k, n, other, spare);
        struct spec_draft_step caught = d;
        caught.lag = NULL;
        spec_len_plan(&c, &caught, a, km, n, other, k0);
        double sum = 0;
        for (uint32_t i = 0; i < n; i++) {
            cr_assert_leq(spare[i], lag[i], "iter %d: spare beyond the lag", iter);
            if (spare[i]) {
                cr_assert_eq(k[i], 0, "iter %d: request %u drafts and gets spare", iter, i);
                cr_assert_gt(k0[i], 0, "iter %d: request %u would not draft caught up", iter, i);
            }
            sum += spare[i];
            /* smallest lag first: a candidate short of its lag leaves nothing to larger lags */
            for (uint32_t j = 0; j < n; j++)
                if (spare[i] < lag[i] && k[i] == 0 && k0[i] > 0 && k[j] == 0 && k0[j] > 0 &&
                    lag[j] > lag[i])
                    cr_assert_eq(spare[j], 0, "iter %d: lag %u got %u before lag %u's %u", iter,
                                 lag[j], spare[j], lag[i], spare[i]);
        }
        if (sum > 0) /* (a budget below the pass's fixed cost is negative: nothing spent) */
            cr_assert_leq(sum * d.cost.token_ns, catch_up_budget(&c, &d, a, k, n, other) + 1e-6,
                          "iter %d: %.0f spare tokens over the budget", iter, sum);
        spent += sum > 0;
    }
    cr_log_info("%d of 4000 steps spent on a spare catch-up", spent);
    cr_assert_gt(spent, 200);
}

/* The online fit: steps of a machine slower than the probe said (a step
 * of n tokens really 50 us + 55 us * n against a probe of 13 + 20 n) move
 * the model to the steps' line within ~100 steps; a run of steps of one
 * size keeps the probe's slope (the ridge) while the level follows. */
Test(spec_len, fit_follows_the_steps_and_keeps_the_slope) {
    struct spec_fit f;
    struct spec_cost probe = {.fixed_ns = 13e3, .token_ns = 20e3}, got;
    spec_fit_init(&f, &probe);
    spec_fit_get(&f, &got);
    cr_assert_float_eq(got.token_ns, 20e3, 1, "the prior alone: %f", got.token_ns);
    cr_assert_float_eq(got.fixed_ns, 13e3, 1, "%f", got.fixed_ns);
    srand(1);
    for (int i = 0; i < 200; i++) {
        uint32_t n = 1 + (uint32_t)(rand() % 6);
        double noise = (rand() % 2001 - 1000) * 5.0; /* +-5 us */
        spec_fit_add(&f, n, 50e3 + 55e3 * n + noise);
    }
    spec_fit_get(&f, &got);
    cr_assert_float_eq(got.token_ns, 55e3, 5e3, "slope %f", got.token_ns);
    cr_assert_float_eq(got.fixed_ns, 50e3, 15e3, "intercept %f", got.fixed_ns);
    /* equal steps: the slope stays where it was, the level follows */
    struct spec_fit g;
    spec_fit_init(&g, &probe);
    for (int i = 0; i < 500; i++)
        spec_fit_add(&g, 1, 200e3);
    spec_fit_get(&g, &got);
    cr_assert_float_eq(got.token_ns, 20e3, 1, "the probe's slope is kept: %f", got.token_ns);
    cr_assert_float_eq(got.fixed_ns + got.token_ns, 200e3, 10e3, "t(1) follows: %f",
                       got.fixed_ns + got.token_ns);
}

Test(spec_len, prior_follows_every_draft) {
    struct spec_prior p = {0};
    cr_assert_float_eq(spec_prior_alpha(&p), 0.5, 1e-12);
    spec_prior_update(&p, 0, 0);
    cr_assert_float_eq(spec_prior_alpha(&p), 0.5, 1e-12, "no draft: no change");
    for (int i = 0; i < 300; i++)
        spec_prior_update(&p, 4, i % 4 == 0 ? 1 : 0); /* 1 token accepted a 4 drafts */
    /* s / (s + f) with s = 1/4 of the drafts' tokens and f = every draft: 0.2 */
    cr_assert_float_eq(spec_prior_alpha(&p), 0.2, 0.02, "%f", spec_prior_alpha(&p));
    cr_assert_float_eq(spec_len_alpha(&(struct spec_len){0}, 0.2), 0.2, 1e-12,
                       "a request that never drafted: the prior");
}

/* uniform in [0, 1) from the suite's generator (the same on every machine) */
static double sim_rand(uint64_t *x) {
    return (double)(kt_rng_next(x) >> 11) * 0x1.0p-53;
}

/* The policy against its own cost model: B requests decode for `steps`
 * steps, each drafted token accepted with probability p in turn (the
 * geometric model), the policy planning from its estimates. Returns
 * committed tokens per model ns over no speculation's. uniform: a0 = 1/2
 * always (the estimate before the prior). */
static double sim_gain(const struct spec_cost *c, uint32_t B, double p, int steps, bool uniform) {
    struct spec_len l[8] = {{0}};
    struct spec_prior pr = {0};
    double alpha[8];
    uint32_t kmax[8], k[8];
    uint64_t x = 88172645463325252ull;
    double t = 0, toks = 0;
    for (int s = 0; s < steps; s++) {
        double a0 = uniform ? 0.5 : spec_prior_alpha(&pr);
        for (uint32_t i = 0; i < B; i++) {
            alpha[i] = spec_len_alpha(&l[i], a0);
            kmax[i] = spec_len_cap(&l[i], 8);
        }
        spec_len_plan(c, NULL, alpha, kmax, B, 0, k);
        uint32_t n = B;
        for (uint32_t i = 0; i < B; i++) {
            uint32_t a = 0;
            while (a < k[i] && sim_rand(&x) < p)
                a++;
            n += k[i];
            toks += 1 + a;
            spec_len_update(&l[i], k[i], a);
            spec_prior_update(&pr, k[i], a);
        }
        t += c->fixed_ns + c->token_ns * n;
    }
    return toks / t / ((double)B / (c->fixed_ns + c->token_ns * B));
}

/* The winner's curse (spec.h): with a uniform prior a request that drafted
 * little looks like a coin flip, so on useless drafts the policy keeps
 * trying the ones chance made look good. On dummy-100m's cost model as
 * measured on a Zen 3 (8.2 ms + 0.9 ms a token) a simulation of the policy
 * loses 4% at batch 1 and 2-4% at batch 8 that way; with the engine-wide
 * prior it loses nothing, and where drafts pay it still gains. */
Test(spec_len, the_engine_prior_keeps_useless_drafts_from_costing) {
    const struct spec_cost c = {.fixed_ns = 8.2e6, .token_ns = 0.9e6};
    for (uint32_t B = 1; B <= 8; B += 7) {
        for (int q = 0; q < 3; q++) {
            double p = (double[]){0.05, 0.2, 0.3}[q];
            double g = sim_gain(&c, B, p, 3000, false);
            cr_log_info("batch %u, acceptance %.2f: %.3f with the engine prior, %.3f uniform", B, p,
                        g, sim_gain(&c, B, p, 3000, true));
            cr_assert_geq(g, 0.99, "batch %u, acceptance %.2f: %.3f of no drafts", B, p, g);
        }
        cr_assert_lt(sim_gain(&c, B, 0.05, 3000, true), 0.97,
                     "batch %u: the uniform prior's loss this test is about", B);
        double g = sim_gain(&c, B, 0.8, 3000, false);
        cr_log_info("batch %u, acceptance 0.80: %.3f with the engine prior, %.3f uniform", B, g,
                    sim_gain(&c, B, 0.8, 3000, true));
        cr_assert_geq(g, B == 1 ? 2.0 : 1.15, "batch %u, acceptance 0.8: %.3f", B, g);
    }
}
