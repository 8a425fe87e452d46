/* model_forward.h - the forward pass of a Llama-family model on the CPU,
 * with its KV cache in vmm pages (kv.h).
 *
 * One call runs n_tok consecutive tokens of one sequence (a prefill chunk,
 * or one decode token), or a batch of several sequences
 * (model_forward_batch), through every layer, writes their K and V at
 * positions [pos0, pos0 + n_tok) of the sequence's range, and returns the
 * logits of the last token. It reads top to bottom like llama2.c's
 * forward(): embed, then per layer attention and SwiGLU FFN with residuals,
 * then the output norm and classifier.
 *
 * Thread safety: a model_ctx belongs to one thread at a time; several
 * contexts may run over one model at once. The kern_pool is borrowed.
 */
#ifndef LLMD_MODEL_FORWARD_H
#define LLMD_MODEL_FORWARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct model;
struct kv_cache;
struct kern_pool;
struct model_ctx;

/* Scratch for chunks of up to max_tok tokens. Returns 0, -EINVAL, -ENOMEM.
 * `m` and `pool` are borrowed and must outlive the context. Caller frees
 * with model_ctx_destroy(). */
int model_ctx_create(const struct model *m, struct kern_pool *pool, uint32_t max_tok,
                     struct model_ctx **out);
void model_ctx_destroy(struct model_ctx *c);

/* Run this context's forward passes on CUDA device `device` from now on
 * (model_cuda.h): uploads the weights once and sizes device scratch for
 * batches of up to max_tok tokens and max_seqs sequences over kv, which must
 * be a KV_DEV_CUDA cache on that device. The Q8_0 mode is
 * MODEL_CUDA_Q8_UPCAST unless the environment has LLMD_CUDA_Q8=native.
 * Returns 0; -EINVAL (kv in host memory, max_seqs 0); -ENOTSUP (built
 * without CUDA, no device: errbuf says which); -ENOMEM; -EIO. On error the
 * context stays a CPU context. */
int model_ctx_use_cuda(struct model_ctx *c, const struct kv_cache *kv, int device,
                       uint32_t max_seqs, char *errbuf, size_t errlen);

/* True when model_ctx_use_cuda() succeeded on c. */
bool model_ctx_on_cuda(const struct model_ctx *c);

/* One sequence's part of a batch: n_tok consecutive tokens at positions
 * pos0.. of KV sequence `seq`. tokens is borrowed for the call. */
struct model_batch_seq {
    uint32_t seq;
    uint32_t pos0;
    uint32_t n_tok;
    const int32_t *tokens;
    float *logits;     /* [max(n_logits, 1)][n_vocab] f32: the logits of the last
                        * max(n_logits, 1) tokens, in position order; NULL = none */
    uint32_t n_logits; /* rows wanted, <= n_tok; 0 or 1: the last token's only. More
                        * rows verify a speculative draft (engine.c): row j predicts
                        * the token after position pos0 + n_tok - n_logits + j */
};

/* Run a flattened batch of several sequences (decode tokens and prefill
 * chunks mixed) in one pass: every matrix product covers all
 * sum(n_tok) <= max_tok tokens, attention runs per sequence over its own
 * range. Each sequence appears at most once. The caller has reserved
 * [0, pos0 + n_tok) of each sequence. A token's logits are bit-identical to
 * what model_forward() computes for that sequence alone, whichever row of
 * an entry's n_logits they are.
 * Returns 0, -EINVAL (empty batch, too many tokens, a sequence twice, a
 * token id outside the vocabulary, n_logits > n_tok, a CUDA cache on a CPU
 * context), -ERANGE
 * (positions not reserved, or past n_ctx of kv), -EIO (a CUDA error). On an
 * error other than -EIO nothing was computed and no KV was written. On a
 * CUDA context the tokens' logits agree with the CPU's to about 1e-3 (f32
 * weights) rather than bit for bit; batch invariance holds for the greedy
 * tokens, as cuBLAS may pick another algorithm for another batch size. */
int model_forward_batch(struct model_ctx *c, struct kv_cache *kv,
                        const struct model_batch_seq *seqs, uint32_t n_seqs);

/* Run tokens[0..n_tok) at positions pos0.. of sequence `seq` of kv.
 * The caller has made [0, pos0 + n_tok) writable (kv_seq_reserve). Writes
 * the last token's logits to logits[n_vocab] (f32) unless logits is NULL.
 * Returns 0, -EINVAL (n_tok 0 or > max_tok, a token id outside the
 * vocabulary), -ERANGE (positions not reserved, or past n_ctx of kv). */
int model_forward(struct model_ctx *c, struct kv_cache *kv, uint32_t seq, const int32_t *tokens,
                  uint32_t n_tok, uint32_t pos0, float *logits);

#endif /* LLMD_MODEL_FORWARD_H */
