/* spec.h - speculative decoding's policy parts: the prompt-lookup drafter
 * and the per-request draft length.
 *
 * Model (issue 16, docs/engine.md "Speculative decoding"): a speculating
 * request proposes up to k tokens that may follow its text; the engine runs
 * them through the target model in the request's decode entry (1 + k
 * positions of one batched step) and commits the longest prefix the target
 * agrees with plus the target's own next token. This module owns only the
 * decisions that need no model: which tokens to propose (prompt lookup)
 * and how many (the draft-length policy). It has no I/O, no clock and no
 * allocation, so every decision is testable with plain arrays
 * (tests/test_spec_ngram.c, tests/test_spec_len.c).
 *
 * Workflow, per step, over the decoding requests that speculate:
 *   alpha[i] = spec_len_alpha(&req[i].len, spec_prior_alpha(&engine_prior));
 *   spec_len_plan(&cost, draft, alpha, k_max, n, n_other, k);  how many
 *   n_i = spec_ngram_draft(&text_i, &cfg, draft_i, k[i]); which (<= k[i])
 *   ... the engine verifies them in the step ...
 *   spec_len_update(&req[i].len, n_i, accepted_i);       learn (every step)
 *   spec_prior_update(&engine_prior, n_i, accepted_i);   (each verified draft)
 *
 * Thread safety: every function is pure or touches only the struct passed
 * in (one owner each). Nothing blocks.
 */
#ifndef LLMD_SPEC_H
#define LLMD_SPEC_H

#include <stdbool.h>
#include <stdint.h>

#define SPEC_TOKENS_MAX 32 /* the longest draft a request may ask for (--spec-tokens) */

/* A request's text as the drafter sees it: a[0..n_a) followed by
 * b[0..n_b) (the prompt, then the generated tokens), both borrowed. */
struct spec_text {
    const int32_t *a;
    uint32_t n_a;
    const int32_t *b;
    uint32_t n_b;
};

struct spec_ngram_config {
    uint32_t n_min;  /* shortest suffix worth matching, >= 1 (1: a single token) */
    uint32_t n_max;  /* longest suffix tried first, >= n_min, <= SPEC_NGRAM_N_MAX */
    uint32_t window; /* tokens searched back from the end; 0: SPEC_NGRAM_WINDOW */
};

#define SPEC_NGRAM_N_MAX 8
#define SPEC_NGRAM_WINDOW                                                                          \
    8192 /* bounds one search to ~window * (1 + mean match) compares                               \
          * (about 10 us on this Xeon): a RAG prompt of a few pages                                \
          * is searched whole, a long chat's distant past is not */

/* Prompt lookup (Saxena, "Prompt Lookup Decoding", 2023; vLLM's ngram
 * proposer; llama.cpp's lookup): for n from n_max down to n_min, find the
 * most recent earlier occurrence of the text's last n tokens, and copy the
 * tokens that followed it, up to k, into out[0..k). The occurrence must end
 * before the text does (it is not the suffix itself) and start within the
 * last cfg->window tokens; its continuation may run into the suffix (a
 * text that repeats a period-p pattern drafts that pattern). Returns the
 * tokens drafted, 0..k: 0 when no suffix of n_min tokens occurs earlier, or
 * k is 0, or the text is shorter than n_min + 1. One backward scan:
 * O(min(window, length) * n_max) compares, no allocation. Pure; any thread. */
uint32_t spec_ngram_draft(const struct spec_text *t, const struct spec_ngram_config *cfg,
                          int32_t *out, uint32_t k);

/* --- how many: the draft-length policy ----------------------------------
 *
 * Model. A step that runs n tokens takes about fixed_ns + n * token_ns
 * (measured by the engine at start-up, docs/engine.md): on a GPU or a
 * bandwidth-bound CPU decode the fixed part (reading the weights) dominates
 * and a draft token is nearly free; when the step is compute-bound every
 * token costs as much as the step's share. A request's drafted tokens are
 * accepted one after the other with probability alpha each (the geometric
 * model of Leviathan et al. 2023, section 3.5), so a draft of k tokens
 * returns E(k) = 1 + alpha + ... + alpha^k tokens. The step's throughput is
 * R = (sum_i E_i + n_other) / (fixed_ns + token_ns * (n + sum_i k_i +
 * n_other)); a draft's j-th token raises it exactly when alpha^j > token_ns
 * * R: its expected return beats what its time would yield otherwise. So
 * each request gets the longest draft whose last token passes that test,
 * which is none when the step is compute-bound (token_ns * R near 1: a
 * large batch, or a model too small for its weights to matter) or when its
 * drafts keep failing (alpha small). */

/* A request's acceptance estimate: decayed counts of accepted draft tokens
 * (s) and of drafts that ended in a rejection (f); alpha = (s + 2 a0) / (s
 * + f + 2), the geometric model's estimate under a prior of mean a0 worth
 * two observations. a0 is what every request's drafts achieved lately
 * (struct spec_prior): with a uniform prior (a0 = 1/2) a request that has
 * drafted little is judged a coin flip, and since the policy drafts when
 * the estimate is high, it drafts on estimates that chance made high and
 * reaps the acceptance of the workload (the winner's curse: simulated
 * against a bandwidth-bound cost model, drafts accepted 5-30% of the time
 * cost it 3-4% at batch 8, tests/test_spec_len.c, docs/engine.md). Every update first multiplies s
 * and f by SPEC_LEN_DECAY, so the estimate follows the request's recent text and drifts back to a0
 * while the request does not draft. Text is not geometric: a quote is accepted token after token
 * and then ends, so a long streak would keep alpha near 1 for many failed drafts after it. Hence a
 * fast decay (0.8: a failure weighs as much as the last five steps' tokens together), and a cap on
 * the next draft's length from the last outcome, the schedule of Hugging Face's assisted generation
 * ("heuristic": 2 more after a fully accepted draft, else what was accepted
 * plus 1), so a streak's end costs one short draft, not a run of long ones.
 * Caller-embedded; zeroed is the initial state (cap SPEC_LEN_CAP0). */
struct spec_len {
    float s, f;
    uint32_t cap; /* the next draft's most tokens; 0: SPEC_LEN_CAP0 */
};
#define SPEC_LEN_DECAY 0.8f
#define SPEC_LEN_CAP0  4

/* The estimate now under the prior mean a0 (in (0, 1)), in (0, 1). Pure. */
double spec_len_alpha(const struct spec_len *l, double a0);

/* The longest draft the last outcome allows, at most k_max. Pure. */
uint32_t spec_len_cap(const struct spec_len *l, uint32_t k_max);

/* After a decode step: `drafted` tokens were verified (0: none, the
 * estimate only decays), the first `accepted` (<= drafted) of them
 * accepted. */
void spec_len_update(struct spec_len *l, uint32_t drafted, uint32_t accepted);

/* What the drafts of every request achieved lately: the same decayed
 * counts as struct spec_len's (accepted tokens s, rejections f), decayed by
 * SPEC_PRIOR_DECAY per verified draft (about the last 50 drafts count);
 * alpha = (s + 1) / (s + f + 2). The prior mean of spec_len_alpha(). Drafts
 * of one engine are one workload's: prompts that quote their documents
 * accept most drafts, random ones few. Caller-embedded; zeroed: 1/2. */
struct spec_prior {
    double s, f;
};
#define SPEC_PRIOR_DECAY 0.98

/* The prior mean now, in (0, 1). Pure. */
double spec_prior_alpha(const struct spec_prior *p);

/* After one verified draft of `drafted` (>= 1; 0: no-op) tokens, the first
 * `accepted` accepted. */
void spec_prior_update(struct spec_prior *p, uint32_t drafted, uint32_t accepted);

/* The step's cost model: fixed_ns + n * token_ns for n tokens (both > 0;
 * ns). */
struct spec_cost {
    double fixed_ns, token_ns;
};

/* A draft model's share of a step, for spec_len_plan (NULL: drafts are
 * free to make, as prompt lookup's are). A draft pass over n tokens costs
 * cost.fixed_ns + n * cost.token_ns (spec_draft_cost). A step runs the
 * draft's first pass when a request drafts or when `runs` (the step has a
 * prefill chunk, which always goes through the draft), over the prefill
 * chunks and, of each drafting request, the committed tokens the draft has
 * not seen (lag[i]) and its last token; decodes that draft nothing stay
 * out (their lag grows; a step never pays another request's catch-up).
 * Then one more pass per draft position past the first over the requests
 * still drafting:
 *   first  = fixed + token * (sum_{i: k[i] > 0} (lag[i] + 1) + (runs ? n_other : 0))
 *   others = sum_{j=1}^{K-1} (fixed + token * #{i : k[i] > j}),  K = max k[i]
 * So a request's first draft token costs the target's token_ns and the
 * draft's (lag[i] + 1) * token_ns (plus the first pass's fixed part,
 * shared, unless it runs anyway), each later one token_ns + the draft's
 * token_ns (plus that position's pass, shared). The catch-up is priced
 * into the step that pays it: a request whose draft fell far behind
 * drafts again only when one step's gain covers it, or once the spare
 * catch-up (spec_catch_up_plan) has brought its lag that far down. */
struct spec_draft_step {
    struct spec_cost cost;
    bool runs;           /* the first pass runs whatever is drafted */
    const uint32_t *lag; /* [n] (NULL: none) committed tokens the draft has not run */
};

/* The cost model, fitted as the engine runs: a least-squares line through
 * the steps' (tokens, forward-pass ns), each step's weight decaying by
 * SPEC_FIT_DECAY per step (about the last 50 steps count: the machine's
 * load and the contexts' lengths change), its slope pulled toward the
 * start-up probe's by a ridge of SPEC_FIT_RIDGE (in weight * tokens^2), so
 * a run of equal-sized steps, which says nothing about the slope, keeps
 * the probe's while the level follows the steps. A probe taken on a busy
 * machine, or at a shorter context than the requests', is corrected within
 * tens of steps of varied sizes. Caller-embedded; one owner. */
struct spec_fit {
    double w, n, nn, t, nt; /* decayed sums of 1, n, n^2, t, n*t over the steps */
    struct spec_cost probe;
};
#define SPEC_FIT_DECAY 0.98
#define SPEC_FIT_RIDGE 0.25

/* The probe's line from its two fastest times: t1 ns for a pass of one
 * token, tk ns for one of 1 + k tokens (k >= 1): token_ns = (tk - t1) / k,
 * fixed_ns = t1 - token_ns, neither below t1 / 1000 (a token is never
 * free, nor the pass: noise can make tk <= t1). Pure. */
struct spec_cost spec_cost_from_probe(double t1, double tk, uint32_t k);

/* Start from the probe's model (copied). */
void spec_fit_init(struct spec_fit *f, const struct spec_cost *probe);

/* A step of n_tokens took ns in the forward pass. */
void spec_fit_add(struct spec_fit *f, uint32_t n_tokens, double ns);

/* The fitted model (slope and intercept both kept positive: a token is
 * never free, nor the step). */
void spec_fit_get(const struct spec_fit *f, struct spec_cost *out);

/* Draft lengths for the step's n speculating decodes: k[i] in [0,
 * k_max[i]] by the rule above, given alpha[i] (in [0, 1)) and n_other
 * tokens of other work in the step (decodes that do not speculate, prefill
 * chunks; each counted as one token of return), maximising the step's
 * throughput R = returned tokens / (target's time + the draft's, d: NULL
 * for none). All arrays [n], borrowed. Without d: a fixed point (k from
 * the throughput, the throughput from k; Dinkelbach's method for a ratio
 * of sums), at most 4 rounds, O(n * max k_max). With d: the same for each
 * number L of draft positions the step pays for (0..max k_max, k[i] <= L,
 * the j-th token priced at token_ns plus the draft's token_ns from j = 2),
 * keeping the best L: the draft's passes are shared, so their fixed cost
 * is a joint choice. O(n * (max k_max)^2). Pure. */
void spec_len_plan(const struct spec_cost *c, const struct spec_draft_step *d, const double *alpha,
                   const uint32_t *k_max, uint32_t n, uint32_t n_other, uint32_t *k);

/* The lock-out of a lagging draft, and the spare catch-up that ends it.
 * spec_len_plan prices a request's catch-up into the step it drafts in, so
 * a request whose draft fell far behind (it drafted nothing for a while)
 * drafts again only when one step's gain covers its whole lag, and since
 * its lag grows while it does not draft, it may never again (at batch 8, a
 * lag of 25-84 tokens for acceptance estimates 0.6-0.95 on a draft of a
 * tenth of the target's cost; docs/engine.md). So a step also spends a
 * bounded share of its time catching such drafts up: the requests that
 * draft nothing this step but would draft if no draft lagged
 * (spec_len_plan with every lag 0: the steady state being bought), smallest
 * lag first, get spare[i] <= lag[i] catch-up tokens, in all at most
 * SPEC_CATCH_UP_SHARE of the step's estimated time (target and draft, as
 * spec_len_plan prices them) at the draft's token_ns, less the draft's
 * fixed pass cost when no pass runs anyway (no draft, no prefill). A
 * request whose drafts would not pay even caught up gets nothing, so a
 * draft that never pays costs nothing here. k[i] is spec_len_plan's
 * choice; all arrays [n], borrowed; spare written (0 without d, without
 * lags or with an unmeasured draft). O(n * (max k_max)^2 + n^2). Pure. */
#define SPEC_CATCH_UP_SHARE 0.125
void spec_catch_up_plan(const struct spec_cost *c, const struct spec_draft_step *d,
                        const double *alpha, const uint32_t *k_max, const uint32_t *k, uint32_t n,
                        uint32_t n_other, uint32_t *spare);

#endif /* LLMD_SPEC_H */
