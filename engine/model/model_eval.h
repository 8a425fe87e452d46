/* model_eval.h - what a KV cache type costs in quality: the next-token
 * distributions a model gives over a text with a cache of that type,
 * against the same model with an f32 cache (docs/kv-quant.md).
 *
 * Teacher forcing: the text's tokens go through the model one at a time,
 * into one cache per type at once, and at every position each type's
 * distribution is compared with the f32 one: KL(p_f32 || p_type), whether
 * the most likely token is the same, and the probability of the text's
 * next token (perplexity). A text longer than a window is cut into windows
 * of at most `window` tokens, each starting with BOS (a window sees no
 * earlier window: the caches restart), so a text of any length runs within
 * the model's context.
 *
 * Workflow: model_load(), kern_pool_create(), tok_encode() the text without
 * BOS, model_eval_kv(). Used by `llmd eval` and tests/test_model_kvquant.c.
 * Thread safety: one call at a time per pool (it runs forward passes on it);
 * the model is only read.
 */
#ifndef LLMD_MODEL_EVAL_H
#define LLMD_MODEL_EVAL_H

#include <stddef.h>
#include <stdint.h>

#include "engine/model/kv.h"

struct model;
struct kern_pool;

/* One cache type's figures over the text. */
struct model_eval_result {
    enum kv_dtype type;
    uint64_t token_bytes; /* the cache's token stride (bytes a token, padded) */
    uint32_t n_pred;      /* positions compared: every token of every window but its first */
    double kl_mean;       /* mean KL(p_f32 || p_type) over them, nats (0 for f32) */
    double kl_max;        /* the largest one */
    double top1;          /* fraction of positions whose argmax is f32's (ties: lowest id) */
    double ppl;           /* exp(mean of -ln p_type(the text's next token)) */
};

/* Run ids[n_ids] (token ids, no BOS; n_ids >= 1) through m in windows of at
 * most `window` tokens (BOS included; 2 <= window <= the model's context,
 * 0: min(context, 512)), with an f32 cache and one cache of each of
 * types[n_types] (duplicates and f32 allowed), and fill ref (the f32 run:
 * kl 0, top1 1) and res[n_types]. The model needs a BOS token. Costs one
 * decode step per token and type (token by token: the quantity measured is
 * the cache, so the cache is written as decoding writes it). Returns 0,
 * -EINVAL (n_ids 0, a bad window, a token outside the vocabulary, no BOS:
 * errbuf says which), -ENOMEM, or a forward-pass error. pool may be NULL
 * (one thread). ids and types are borrowed. */
int model_eval_kv(const struct model *m, struct kern_pool *pool, const int32_t *ids, uint32_t n_ids,
                  uint32_t window, const enum kv_dtype *types, uint32_t n_types,
                  struct model_eval_result *ref, struct model_eval_result *res, char *errbuf,
                  size_t errlen);

#endif /* LLMD_MODEL_EVAL_H */
