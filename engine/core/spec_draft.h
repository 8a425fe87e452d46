/* spec_draft.h - speculative decoding's draft model: a second, smaller
 * GGUF with the target's vocabulary that proposes each speculating
 * request's next tokens (Leviathan et al. 2023, Chen et al. 2023).
 *
 * Model (docs/engine.md "The drafter: a draft model"): the draft's KV lives
 * in the target's ranges, in each token's slot after the target's
 * (kv_cache_draft_view), so it is paged, counted, shared by the prefix
 * cache, spilled and trimmed with the target's and needs no range or page
 * of its own. Every committed position of every sequence gets the draft's
 * KV too: the draft runs each step's prefill chunks and decode tokens
 * (spec_draft_run's first pass), so a sealed page holds both models' KV
 * and a prefix hit needs no draft prefill. Drafting is greedy (the
 * argmax): the draft distribution q is one-hot, so smp_verify()'s
 * rejection rule keeps the target's distribution exactly at any
 * temperature.
 *
 * Workflow: spec_draft_load (before the KV cache: its geometry needs the
 * draft's hyperparameters) -> kv_cache_create with draft_hp ->
 * spec_draft_start -> spec_draft_run once a step, after the target's pages
 * are reserved and before its forward pass -> spec_draft_close.
 *
 * Thread safety: one owner thread (the engine's); spec_draft_run blocks on
 * the forward passes (the kernel pool).
 */
#ifndef LLMD_SPEC_DRAFT_H
#define LLMD_SPEC_DRAFT_H

#include <stddef.h>
#include <stdint.h>

#include "engine/core/spec.h"

struct model;
struct model_hparams;
struct kv_cache;
struct kern_pool;
struct spec_draft;

/* Load the draft model at `path` (a GGUF path or "dummy:SHAPE[:TYPE]") and
 * check it against `target` (borrowed): the same vocabulary size, the same
 * token strings (tokenizer.ggml.tokens) and the same EOS. Refusals name the
 * first difference in errbuf ("llmd: --spec-model X: token 17 is 'a' there
 * and 'b' in the target"). Returns 0, -EINVAL (a different vocabulary),
 * the loader's errors (-ENOENT, -EINVAL, -ENOMEM, ...). Caller frees with
 * spec_draft_close(). pool (borrowed, may be NULL) packs the draft's
 * matrices at load (model_load_opts.pool). */
int spec_draft_load(const char *path, const struct model *target, struct kern_pool *pool,
                    struct spec_draft **out, char *errbuf, size_t errlen);

/* The draft's hyperparameters (kv_config.draft_hp). Borrowed, valid until
 * spec_draft_close(). */
const struct model_hparams *spec_draft_hparams(const struct spec_draft *d);

/* The draft model itself (borrowed, valid until spec_draft_close()): the
 * engine's fingerprint hashes its weights. */
const struct model *spec_draft_model(const struct spec_draft *d);

/* The draft's name (its file name without .gguf, or the dummy spec); static
 * for the draft's life. */
const char *spec_draft_name(const struct spec_draft *d);

/* Get ready to run over kv (made with this draft's draft_hp; borrowed, must
 * outlive d) on `pool` (borrowed): a forward context for up to max_tok
 * tokens a pass and buffers for max_seqs sequences. Returns 0, -EINVAL (kv
 * has no draft slot), -ENOMEM. */
int spec_draft_start(struct spec_draft *d, struct kv_cache *kv, struct kern_pool *pool,
                     uint32_t max_tok, uint32_t max_seqs);

/* One sequence's part of a step. The draft model runs tokens[0..n_tok) at
 * positions pos0.. of range `seq` (what it has not seen of the committed
 * text: a prefill chunk, or a decode's last token and at most one before
 * it), then, if n_draft > 0, drafts n_draft tokens greedily into
 * draft[0..n_draft): draft j is the argmax after position pos0 + n_tok - 1
 * + j, and drafts 0..n_draft-2 are run to get the next. Positions [0, pos0
 * + n_tok + n_draft - 1) of seq must be reserved. tokens and draft are
 * borrowed for the call. */
struct spec_draft_seq {
    uint32_t seq, pos0, n_tok;
    const int32_t *tokens; /* [n_tok] */
    uint32_t n_draft;
    int32_t *draft; /* [n_draft], written */
};

/* Run one step's draft passes: all n sequences as one batch (sum of n_tok
 * <= max_tok), then one batch per draft position over those still
 * drafting, at most max n_draft - 1 more. A sequence of n_tok 0 takes no
 * part (and drafts nothing). Each pass of at most two tokens a sequence
 * (a decode's) is timed into the draft's cost model (spec_draft_cost).
 * Returns 0, or the forward pass's error (-EINVAL, -ERANGE: the caller's
 * positions; the drafts are then unspecified but valid token ids). */
int spec_draft_run(struct spec_draft *d, const struct spec_draft_seq *s, uint32_t n);

/* Measure the draft's passes for the draft-length policy (spec.h, struct
 * spec_draft_step): run tokens[0..pos) at positions 0.. of range seq (its
 * draft slots; the range must hold pos + k + 1 positions), then time passes
 * of 1 and 1 + k tokens at pos, the fastest of 6 of each after a warm-up,
 * interleaved; their line (fixed + per token) starts the cost model that
 * spec_draft_run's timed passes then fit (spec_fit). Returns 0, -EINVAL (k
 * 0, or pos or k + 1 over max_tok), or the forward pass's error (the model
 * stays unmeasured: spec_draft_cost gives zeros). */
int spec_draft_probe(struct spec_draft *d, uint32_t seq, uint32_t pos, uint32_t k,
                     const int32_t *tokens);

/* The draft's cost model now: a pass of n tokens ~ fixed_ns + n * token_ns
 * (ns); zeros until spec_draft_probe succeeded. */
void spec_draft_cost(const struct spec_draft *d, struct spec_cost *out);

/* NULL is a no-op. */
void spec_draft_close(struct spec_draft *d);

#endif /* LLMD_SPEC_DRAFT_H */
