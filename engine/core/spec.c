/* spec.c - the prompt-lookup drafter (see spec.h).
 *
 * One backward scan finds what the definition asks for (for n from n_max
 * down to n_min, the most recent earlier occurrence of the last n tokens):
 * for each place c where a continuation could start, from the end
 * backwards, m(c) is the length of the common suffix of text[0..c) and the
 * whole text, capped at n_max and at the window. The answer is the largest
 * c with the largest m(c) >= n_min: scanning from the end and keeping only
 * a strictly longer match gives exactly that, and a match of n_max ends the
 * scan at once (nothing older can beat it). Most places mismatch at the
 * first compare, so a scan costs about one compare per token searched.
 */
#include "engine/core/spec.h"

#include <math.h>
#include <stdbool.h>
#include <stddef.h>

static inline int32_t spec_at(const struct spec_text *t, uint32_t i) {
    return i < t->n_a ? t->a[i] : t->b[i - t->n_a];
}

uint32_t spec_ngram_draft(const struct spec_text *t, const struct spec_ngram_config *cfg,
                          int32_t *out, uint32_t k) {
    uint64_t len = (uint64_t)t->n_a + t->n_b;
    uint32_t n_min = cfg->n_min, n_max = cfg->n_max;
    if (k == 0 || n_min == 0 || n_max < n_min || len > UINT32_MAX || len < (uint64_t)n_min + 1)
        return 0;
    uint32_t end = (uint32_t)len;
    if (n_max > SPEC_NGRAM_N_MAX)
        n_max = SPEC_NGRAM_N_MAX;
    if (n_max < n_min)
        return 0;
    uint32_t window = cfg->window ? cfg->window : SPEC_NGRAM_WINDOW;
    uint32_t lo = end > window ? end - window : 0; /* a match starts at lo or later */
    uint32_t best = 0, best_c = 0;
    /* c: where the continuation starts; the match is text[c - m, c) */
    for (uint32_t c = end - 1; c >= lo + n_min && c > 0; c--) {
        uint32_t cap = c - lo < n_max ? c - lo : n_max, m = 0;
        while (m < cap && spec_at(t, c - 1 - m) == spec_at(t, end - 1 - m))
            m++;
        if (m > best) {
            best = m;
            best_c = c;
            if (m == n_max)
                break;
        }
    }
    if (best < n_min)
        return 0;
    uint32_t n = end - best_c < k ? end - best_c : k;
    for (uint32_t i = 0; i < n; i++)
        out[i] = spec_at(t, best_c + i);
    return n;
}

double spec_len_alpha(const struct spec_len *l, double a0) {
    return ((double)l->s + 2.0 * a0) / ((double)l->s + (double)l->f + 2.0);
}

double spec_prior_alpha(const struct spec_prior *p) {
    return (p->s + 1.0) / (p->s + p->f + 2.0);
}

void spec_prior_update(struct spec_prior *p, uint32_t drafted, uint32_t accepted) {
    if (drafted == 0)
        return;
    accepted = accepted < drafted ? accepted : drafted;
    p->s = p->s * SPEC_PRIOR_DECAY + accepted;
    p->f = p->f * SPEC_PRIOR_DECAY + (accepted < drafted ? 1.0 : 0.0);
}

uint32_t spec_len_cap(const struct spec_len *l, uint32_t k_max) {
    uint32_t cap = l->cap ? l->cap : SPEC_LEN_CAP0;
    return cap < k_max ? cap : k_max;
}

void spec_len_update(struct spec_len *l, uint32_t drafted, uint32_t accepted) {
    l->s *= SPEC_LEN_DECAY;
    l->f *= SPEC_LEN_DECAY;
    if (drafted == 0)
        return;
    accepted = accepted < drafted ? accepted : drafted;
    l->s += (float)accepted;
    l->f += accepted < drafted ? 1.0f : 0.0f;
    uint32_t cap = l->cap ? l->cap : SPEC_LEN_CAP0;
    l->cap = accepted == drafted ? (cap + 2 < SPEC_TOKENS_MAX ? cap + 2 : SPEC_TOKENS_MAX)
                                 : accepted + 1;
}

/* The draft's time for a choice (spec_draft_step's formula) with the
 * passes of at least `paid` draft positions charged; 0 without a draft. */
static double spec_draft_ns(const struct spec_draft_step *d, const uint32_t *k, uint32_t n,
                            uint32_t n_other, uint32_t paid) {
    if (!d)
        return 0;
    uint32_t longest = paid;
    double first = d->runs ? n_other : 0;
    for (uint32_t i = 0; i < n; i++) {
        longest = k[i] > longest ? k[i] : longest;
        first += k[i] ? 1.0 + (d->lag ? d->lag[i] : 0) : 0;
    }
    double ns = d->runs || longest ? d->cost.fixed_ns + d->cost.token_ns * first : 0;
    for (uint32_t j = 1; j < longest; j++) {
        uint32_t still = 0;
        for (uint32_t i = 0; i < n; i++)
            still += k[i] > j;
        ns += d->cost.fixed_ns + d->cost.token_ns * still;
    }
    return ns;
}

/* Throughput of a choice: returned tokens per ns. */
static double spec_rate(const struct spec_cost *c, const struct spec_draft_step *d,
                        const double *alpha, const uint32_t *k, uint32_t n, uint32_t n_other,
                        uint32_t paid) {
    double ret = n_other, tok = n + n_other;
    for (uint32_t i = 0; i < n; i++) {
        double e = 1.0, p = 1.0;
        for (uint32_t j = 0; j < k[i]; j++)
            e += (p *= alpha[i]);
        ret += e;
        tok += k[i];
    }
    return ret / (c->fixed_ns + c->token_ns * tok + spec_draft_ns(d, k, n, n_other, paid));
}

/* Request i's best draft length at throughput r, at most lim: the m that
 * maximises its return minus what its time would yield, sum_{j<=m}
 * alpha^j - r * price(m), price(m) = m * token_ns plus, with a draft
 * model, its share of the passes: its first token's catch-up and last
 * token in the first pass (lag + 1 draft tokens), and one draft token per
 * position past the first. Without a draft model each token costs the
 * same and its return falls, so the best m is the last token that passes
 * alpha^j > token_ns * r (kept as that test: the policy's decisions since
 * d2b9b9b). The smallest best m on a tie. */
static uint32_t spec_best_len(const struct spec_cost *c, const struct spec_draft_step *d,
                              double alpha, uint32_t lag, uint32_t lim, double r) {
    uint32_t m = 0;
    double p = alpha;
    if (!d) {
        while (m < lim && p > c->token_ns * r) {
            m++;
            p *= alpha;
        }
        return m;
    }
    double gain = 0, price = 0, best = 0;
    for (uint32_t j = 1; j <= lim; j++, p *= alpha) {
        gain += p;
        price += c->token_ns + d->cost.token_ns * (j == 1 ? 1.0 + lag : 1.0);
        if (gain - r * price > best) {
            best = gain - r * price;
            m = j;
        }
    }
    return m;
}

/* The best drafts of at most `cap` tokens when the draft's passes for cap
 * positions are paid whatever is drafted (a constant): a ratio of
 * separable sums, which Dinkelbach's fixed point maximises. Each round sets
 * every k[i] to its best length at the throughput of the last
 * (spec_best_len), which can only raise the throughput, so the rounds
 * settle (in practice in two or three). Returns the throughput of k as
 * charged (all cap passes). */
static double spec_plan_capped(const struct spec_cost *c, const struct spec_draft_step *d,
                               const double *alpha, const uint32_t *k_max, uint32_t n,
                               uint32_t n_other, uint32_t cap, uint32_t *k) {
    for (uint32_t i = 0; i < n; i++)
        k[i] = 0;
    double r = spec_rate(c, d, alpha, k, n, n_other, cap);
    for (int round = 0; round < (d ? 8 : 4); round++) { /* 4: prompt lookup's since d2b9b9b */
        bool changed = false;
        for (uint32_t i = 0; i < n; i++) {
            uint32_t lim = k_max[i] < cap ? k_max[i] : cap;
            uint32_t m = spec_best_len(c, d, alpha[i], d && d->lag ? d->lag[i] : 0, lim, r);
            changed |= m != k[i];
            k[i] = m;
        }
        if (!changed)
            break;
        r = spec_rate(c, d, alpha, k, n, n_other, cap);
    }
    return r;
}

/* With a draft, every cap is a candidate: the best choice drafting at most
 * K tokens is the best of the cap-K problem (where its passes are exactly
 * what is charged), and a cap-L answer costs no more than charged. So the
 * best over the caps, compared at their real cost, is the best choice. */
void spec_len_plan(const struct spec_cost *c, const struct spec_draft_step *d, const double *alpha,
                   const uint32_t *k_max, uint32_t n, uint32_t n_other, uint32_t *k) {
    for (uint32_t i = 0; i < n; i++)
        k[i] = 0;
    if (n == 0 || !(c->fixed_ns > 0) || !(c->token_ns > 0))
        return;
    uint32_t top = 0;
    for (uint32_t i = 0; i < n; i++)
        top = k_max[i] > top ? k_max[i] : top;
    if (!d) { /* drafting is free: one problem, no shared cost */
        spec_plan_capped(c, NULL, alpha, k_max, n, n_other, top, k);
        return;
    }
    if (!(d->cost.fixed_ns >= 0) || !(d->cost.token_ns >= 0))
        return;                                             /* a NaN cost: no draft */
    double best = spec_rate(c, d, alpha, k, n, n_other, 0); /* no draft */
    uint32_t best_cap = 0;
    for (uint32_t cap = 1; cap <= top; cap++) {
        spec_plan_capped(c, d, alpha, k_max, n, n_other, cap, k);
        double r = spec_rate(c, d, alpha, k, n, n_other, 0);
        if (r > best) {
            best = r;
            best_cap = cap;
        }
    }
    if (best_cap)
        spec_plan_capped(c, d, alpha, k_max, n, n_other, best_cap, k); /* deterministic */
    else
        for (uint32_t i = 0; i < n; i++)
            k[i] = 0;
}

void spec_catch_up_plan(const struct spec_cost *c, const struct spec_draft_step *d,
                        const double *alpha, const uint32_t *k_max, const uint32_t *k, uint32_t n,
                        uint32_t n_other, uint32_t *spare) {
    bool lagging = false, drafts = false;
    for (uint32_t i = 0; i < n; i++) {
        spare[i] = 0;
        lagging |= d && d->lag && d->lag[i] > 0 && k[i] == 0;
        drafts |= k[i] > 0;
    }
    if (!lagging || !(d->cost.token_ns > 0) || !(d->cost.fixed_ns >= 0))
        return;
    /* the step's time as the plan prices it, and the share of it to spend */
    double tok = n + n_other;
    for (uint32_t i = 0; i < n; i++)
        tok += k[i];
    double budget = SPEC_CATCH_UP_SHARE *
                    (c->fixed_ns + c->token_ns * tok + spec_draft_ns(d, k, n, n_other, 0));
    if (!drafts && !d->runs)
        budget -= d->cost.fixed_ns; /* the pass would run for the catch-up alone */
    if (!(budget >= d->cost.token_ns))
        return;
    double left = floor(budget / d->cost.token_ns);
    /* who would draft with no draft lagging: spare[] holds that plan's k */
    struct spec_draft_step caught = *d;
    caught.lag = NULL;
    spec_len_plan(c, &caught, alpha, k_max, n, n_other, spare);
    for (uint32_t i = 0; i < n; i++)
        spare[i] = spare[i] > 0 && k[i] == 0 && d->lag[i] > 0 ? UINT32_MAX : 0; /* a candidate */
    while (left >= 1) {
        uint32_t best = n;
        for (uint32_t i = 0; i < n; i++) /* smallest lag first: it drafts soonest */
            if (spare[i] == UINT32_MAX && (best == n || d->lag[i] < d->lag[best]))
                best = i;
        if (best == n)
            break;
        spare[best] = d->lag[best] < left ? d->lag[best] : (uint32_t)left;
        left -= spare[best];
    }
    for (uint32_t i = 0; i < n; i++)
        if (spare[i] == UINT32_MAX)
            spare[i] = 0; /* the budget ran out before it */
}

struct spec_cost spec_cost_from_probe(double t1, double tk, uint32_t k) {
    double per = tk > t1 ? (tk - t1) / k : t1 / 1000;
    return (struct spec_cost){.fixed_ns = t1 > per ? t1 - per : t1 / 1000, .token_ns = per};
}

void spec_fit_init(struct spec_fit *f, const struct spec_cost *probe) {
    *f = (struct spec_fit){.probe = *probe};
}

void spec_fit_add(struct spec_fit *f, uint32_t n_tokens, double ns) {
    double n = n_tokens;
    f->w = f->w * SPEC_FIT_DECAY + 1;
    f->n = f->n * SPEC_FIT_DECAY + n;
    f->nn = f->nn * SPEC_FIT_DECAY + n * n;
    f->t = f->t * SPEC_FIT_DECAY + ns;
    f->nt = f->nt * SPEC_FIT_DECAY + n * ns;
}

/* Ridge regression of the slope toward the probe's: c = (S_nt + r c0) /
 * (S_nn + r) over the centred sums, a = mean t - c mean n. */
void spec_fit_get(const struct spec_fit *f, struct spec_cost *out) {
    if (f->w < 1e-9) {
        *out = f->probe;
        return;
    }
    double mn = f->n / f->w, mt = f->t / f->w;
    double snn = f->nn - f->n * mn, snt = f->nt - f->n * mt;
    double c = (snt + SPEC_FIT_RIDGE * f->probe.token_ns) / (snn + SPEC_FIT_RIDGE);
    double a = mt - c * mn;
    out->token_ns = c > mt * 1e-3 ? c : mt * 1e-3; /* a token is never free, nor the step */
    out->fixed_ns = a > mt * 1e-3 ? a : mt * 1e-3;
}
