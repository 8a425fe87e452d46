/* smp.h - the sampler: picks the next token id from a row of logits.
 *
 * Logit processing first, when the request asks for it (smp_logits): the
 * logit_bias added (OpenAI), then the repetition penalty over the prompt's
 * and the generated tokens (Keskar et al. 2019, "CTRL", as vLLM and
 * llama.cpp apply it: a positive logit divided by the penalty, a negative
 * one multiplied), then the frequency and presence penalties over the
 * generated tokens (OpenAI: logit - count * frequency - (count > 0) *
 * presence). Then the chain (the order llama.cpp's and vLLM's default samplers use): greedy when
 * temperature <= 0 (argmax; on a tie the lowest id, as llama2.c's run.c);
 * otherwise logits / temperature, then top-k, softmax, top-p (nucleus,
 * Holtzman et al. 2019, "The Curious Case of Neural Text Degeneration"),
 * min-p (Nguyen et al. 2024, "Min P Sampling"), renormalise and draw with a
 * seeded xoshiro256** generator (Blackman & Vigna 2018), so the same seed and
 * logits give the same ids on every run and machine.
 *
 * Thread safety: a struct smp is owned by one sequence; calls on distinct
 * samplers may run concurrently.
 */
#ifndef LLMD_SMP_H
#define LLMD_SMP_H

#include <stdbool.h>
#include <stdint.h>

struct smp_params {
    float temperature; /* <= 0: greedy */
    int top_k;         /* <= 0: off */
    float top_p;       /* >= 1: off */
    float min_p;       /* <= 0: off */
    uint64_t seed;
    float presence_penalty;   /* OpenAI's, -2..2; 0: off */
    float frequency_penalty;  /* OpenAI's, -2..2; 0: off */
    float repetition_penalty; /* vLLM's, > 0; 0 or 1: off */
    const int32_t *bias_ids;  /* [n_bias] token ids (copied; each < n_vocab) ... */
    const float *bias;        /* [n_bias] ... and what is added to their logits */
    uint32_t n_bias;
};

/* Defaults: greedy, top_k 40, top_p 0.95, min_p 0.05, seed 0. */
struct smp_params smp_params_default(void);

struct smp;

/* Create a sampler for a vocabulary of n_vocab ids. Returns 0, -EINVAL
 * (n_vocab 0, temperature NaN, top_p/min_p outside [0,1], a penalty NaN or
 * infinite, repetition_penalty < 0, a bias id outside the vocabulary or a
 * bias not finite), -ENOMEM.
 * Caller frees with smp_destroy(). */
int smp_create(const struct smp_params *p, uint32_t n_vocab, struct smp **out);
void smp_destroy(struct smp *s);

/* Tokens the penalties count: the prompt's ids[0..n) (the repetition
 * penalty's; call once, before sampling) and each token committed after it
 * (smp_accept: the repetition, frequency and presence penalties'). Ids
 * outside the vocabulary are skipped. No-ops when no penalty is on. */
void smp_prompt(struct smp *s, const int32_t *ids, uint32_t n);
void smp_accept(struct smp *s, int32_t token);

/* The logits smp_sample() and smp_verify() choose from: logits[n_vocab]
 * itself when no bias or penalty is on, else s's scratch row holding them
 * processed as the header says (valid until the next call on s). */
const float *smp_logits(struct smp *s, const float *logits);

/* Pick a token from logits[n_vocab] (f32), processed by smp_logits() first. logits is read-only.
 * Never fails: with all logits -inf or NaN it returns the argmax over the
 * finite ones, or 0. Not thread-safe on one sampler. */
int32_t smp_sample(struct smp *s, const float *logits);

/* Verify one drafted token (speculative decoding, engine.c) against the
 * target's logits[n_vocab] (f32, read-only) for that position: returns the
 * token to commit there, and *accepted says whether it is `draft`.
 * The token is smp_sample()'s, drawn with the same one draw (none when
 * greedy), and the draft is accepted when it equals it. For a
 * deterministic draft (q one-hot: prompt lookup, a greedy draft model) this
 * is the rejection rule of Leviathan, Kalman and Matias, "Fast Inference
 * from Transformers via Speculative Decoding" (ICML 2023) and Chen et al.,
 * "Accelerating Large Language Model Decoding with Speculative Sampling"
 * (2023) -- accept with min(1, p/q) = p(draft), else draw from
 * norm(max(0, p - q)), p without the draft -- coupled to the target's own
 * draw: the draft is accepted with probability p(draft), a rejection
 * commits a token from p without the draft, and every committed token
 * costs the generator exactly the draw smp_sample() would have spent on
 * it. So a request commits the very ids it would commit without
 * speculation, whatever was drafted (tests/test_smp_sample.c,
 * tests/test_engine_spec_sample.c). A draft outside the vocabulary or
 * filtered out is never accepted. Never fails. Not thread-safe on one
 * sampler. */
int32_t smp_verify(struct smp *s, const float *logits, int32_t draft, bool *accepted);

/* One token's log-probability (smp_logprobs). */
struct smp_logprob {
    int32_t id;
    float lp; /* natural log */
};

/* log(sum_i exp(logits[i])) over the finite logits[0..n) (f32, read-only), in
 * double, shifted by their max so no exp overflows; +inf when none is
 * finite (smp_logprobs then gives its floor). The normaliser of
 * log_softmax, shared by smp_logprobs and llmd eval's KL and perplexity.
 * O(n). Pure; any thread. */
double smp_logsumexp(const float *logits, uint32_t n);

/* Log-probabilities of logits[n] (f32, read-only) as log_softmax, over the
 * finite logits, in double (max-shifted log-sum-exp): *chosen_lp gets
 * chosen's, top[0..k) the k largest, largest first, equal ones by lower
 * id (k <= n; NaN skipped). Every value is clamped below at `floor` (a
 * -inf logit, an id out of range, no finite logit at all). Independent of
 * any sampler's parameters: these are the raw model's probabilities.
 * O(n * (1 + k)). Pure; any thread. */
void smp_logprobs(const float *logits, uint32_t n, int32_t chosen, uint32_t k, float floor,
                  float *chosen_lp, struct smp_logprob *top);

/* Index of the largest of x[0..n), the lowest index on ties; NaN is ignored. */
int32_t smp_argmax(const float *x, uint32_t n);

#endif /* LLMD_SMP_H */
