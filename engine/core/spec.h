/* spec.h - speculative decoding's policy parts: the prompt-lookup drafter
 * and the per-request draft length.
 *
 * Model (issue 16, docs/engine.md "Speculative decoding"): a speculating
 * request proposes up to k tokens that may follow its text; the engine runs
 * them through the target model in the request's decode entry (1 + k
 * positions of one batched step) and commits the longest prefix the target
 * agrees with plus the target's own next token. This module owns only the
 * decisions that need no model: which tokens to propose (prompt lookup,
 * below). It has no I/O, no clock and no allocation, so every decision is
 * testable with plain arrays (tests/test_spec_ngram.c).
 *
 * Workflow, per step, for each decoding request that speculates:
 *   n = spec_ngram_draft(&text, &cfg, draft, k);   n <= k tokens; 0: none found
 *   ... the engine verifies them in the step ...
 *
 * Thread safety: every function is pure. Nothing blocks.
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

#endif /* LLMD_SPEC_H */
