/* model_cuda.h - the forward pass on an NVIDIA GPU, over KV pages mapped by
 * the vmm CUDA backend (DESIGN.md §2-3).
 *
 * Model: a model_cuda holds the model's weights on one device (uploaded
 * once at creation: f32, f16 and bf16 as they are; Q4_0 upcast to f16; Q8_0
 * upcast to f16, or kept in blocks and dequantised on the fly by
 * kcu_matmul_q8_0 with MODEL_CUDA_Q8_NATIVE), device scratch for batches of
 * up to max_tok tokens, one compute stream and a cuBLAS handle on it.
 * model_cuda_forward() runs the same flattened batch as
 * model_forward_batch() (model_forward.h): embedding, per layer RMSNorm ->
 * Q/K/V GEMMs -> RoPE and the KV store into the sequences' vmm ranges ->
 * attention over each sequence's contiguous range -> output GEMM ->
 * residual, RMSNorm -> SwiGLU FFN -> residual; then the output norm and the
 * classifier for the rows that want logits, copied back to the host.
 * Matrix products are cuBLAS GEMMs with f32 output and f32 accumulation:
 * f32 weights in f32 (CUBLAS_COMPUTE_32F_PEDANTIC: no TF32), f16/bf16
 * weights with the activations rounded to the weight type (the f16 rounding
 * the CPU's f16 path also applies; bf16 differs from the CPU, which upcasts
 * bf16 weights exactly, but model_load() refuses bf16 files today).
 * Quantised weights are not reproduced exactly: a Q8_0 weight d*q needs up
 * to 18 significant bits and Q4_0 up to 14, f16 keeps 11, so upcast models
 * (and their embedding rows) differ from the CPU's f32 dequantisation by
 * f16 rounding, and the CPU also rounds activations to Q8_0 where the GPU
 * keeps them in f16/f32: expect the greedy tokens of quantised models to
 * diverge from the CPU's somewhat earlier than an f32 model's.
 *
 * Built by `make cuda` (engine/model/cuda/model_cuda.c, linking cudart and
 * cuBLAS); the default build links engine/model/model_cuda_stub.c, whose create
 * returns -ENOTSUP saying so, so callers need no #ifdef.
 *
 * Thread safety: one thread at a time per model_cuda (the engine's); any
 * thread may be that thread (the device is made current on every call).
 */
#ifndef LLMD_MODEL_CUDA_H
#define LLMD_MODEL_CUDA_H

#include <stddef.h>
#include <stdint.h>

struct model;
struct kv_cache;
struct model_batch_seq;
struct model_cuda;

enum model_cuda_q8 {
    MODEL_CUDA_Q8_UPCAST = 0, /* Q8_0 weights upcast to f16 at load (2x memory, cuBLAS GEMMs) */
    MODEL_CUDA_Q8_NATIVE,     /* kept in Q8_0 blocks: batches of <= 16 tokens through
                                 kcu_matmul_q8_0 (f32 activations), larger ones dequantise
                                 each matrix into scratch, then cuBLAS (f16 activations):
                                 the two differ by ~1e-3 relative, so a token's logits
                                 depend on its batch's size more than with upcast weights,
                                 and batches just over 16 tokens pay a whole-matrix
                                 dequantisation per product */
};

struct model_cuda_opts {
    int device;            /* CUDA device ordinal, the one the KV pool lives on */
    uint32_t max_tok;      /* tokens per batch, >= 1 */
    uint32_t max_seqs;     /* sequences per batch, >= 1 */
    uint32_t max_ctx;      /* keys per sequence (the cache's n_ctx), >= 1 */
    enum model_cuda_q8 q8; /* how Q8_0 weights live on the device */
};

/* Upload m's weights to device o->device and allocate the scratch. m is
 * borrowed and must outlive the result. Returns 0; -ENOTSUP (built without
 * CUDA, no usable device, or a K-quant (Q2_K..Q6_K) weight, which only the CPU
 * runs: errbuf says which, naming the tensor); -ENOMEM (device or pinned host
 * memory: errbuf gives the bytes asked); -EINVAL (bad opts); -EIO (a CUDA or
 * cuBLAS call failed: errbuf names it). Free with model_cuda_destroy(). */
int model_cuda_create(const struct model *m, const struct model_cuda_opts *o,
                      struct model_cuda **out, char *errbuf, size_t errlen);

/* Synchronizes, frees everything; NULL is a no-op. */
void model_cuda_destroy(struct model_cuda *mc);

/* Run the batch seqs[0..n_seqs) (checked by the caller as
 * model_forward_batch does: n_tok total <= max_tok, positions reserved in
 * kv, whose pages are device memory of the same device) and write each
 * wanted row of logits ([n_vocab] f32, host memory) before returning.
 * Returns 0, -EINVAL (n_seqs > max_seqs, a key count past max_ctx, kv not a
 * CUDA cache), -EIO (a CUDA error; logged). */
int model_cuda_forward(struct model_cuda *mc, struct kv_cache *kv,
                       const struct model_batch_seq *seqs, uint32_t n_seqs);

struct model_cuda_stats {
    uint64_t weight_bytes;  /* device bytes of the uploaded weights */
    uint64_t scratch_bytes; /* device bytes of activations and workspaces */
    uint64_t upload_ns;     /* time the upload took */
    uint64_t steps;         /* forward calls */
};

void model_cuda_stats_get(const struct model_cuda *mc, struct model_cuda_stats *out);

/* Why CUDA is unavailable in this build or on this machine ("" when it is):
 * a static or thread-local string. */
const char *model_cuda_unavailable(void);

#endif /* LLMD_MODEL_CUDA_H */
