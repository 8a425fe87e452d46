/* kern_cuda.h - the CUDA kernels of the forward pass (the .cu files of kernels/cuda/),
 * built by `make cuda` only. C declarations, callable from C and CUDA C++.
 *
 * Model: every launcher enqueues work on `s` (a cudaStream_t; NULL is the
 * legacy default stream) and returns at once; pointers are device
 * pointers unless a parameter says "host". Activations are f32 row-major
 * [n_tok][width]; matrix products are cuBLAS's (engine/model/cuda/), not here.
 * KV lives in vmm ranges (DESIGN.md §2): token t of a sequence at
 * base + t*stride, K of layer l at +k_off, V at +v_off, [n_head_kv][head_dim]
 * elements of the cache type.
 *
 * Numerics follow kernels/kern.h where it matters for agreement with the CPU
 * (f32 accumulation everywhere, RMSNorm's sum of squares in double, RoPE's
 * angles computed in float as ggml, f16 rounding to nearest even), so the
 * GPU's logits of an f32 model agree with the CPU's within 1e-3.
 *
 * Errors: 0, -EINVAL (a bad argument, checked on the host before any
 * launch), -EIO (the launch failed: the CUDA error is logged). Asynchronous
 * faults surface at the next synchronizing call of the caller.
 * Thread safety: launchers are reentrant; ordering is the stream's.
 */
#ifndef LLMD_KERN_CUDA_H
#define LLMD_KERN_CUDA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct CUstream_st *kcu_stream; /* == cudaStream_t == CUstream */

/* Element types of weights and GEMM inputs on the device. */
enum kcu_type { KCU_F32 = 0, KCU_F16 = 1, KCU_BF16 = 2 };
/* Element types of the KV cache: kv.h's enum kv_dtype and kern.h's enum
 * kern_kv_type, value for value (layouts in kern.h; the quantized rows are
 * byte-compatible with the CPU's, kcu_kv_store). */
enum kcu_kv {
    KCU_KV_F32 = 0,
    KCU_KV_F16 = 1,
    KCU_KV_Q8_0 = 2, /* GGUF Q8_0 blocks over the whole row */
    KCU_KV_Q4_0 = 3, /* GGUF Q4_0 blocks of the Hadamard-rotated row */
    KCU_KV_FP8 = 4,  /* per head {f32 scale; OCP E4M3[head_dim]} */
};

/* dst[n] f16 = src[n] of weight type src_type (kern.h's enum kern_wtype: F16 copies,
 * BF16 rounds, Q8_0 and Q4_0 dequantise block by block as kern_dequant_row),
 * n a multiple of 32 for the quantised types. Weight upload: the raw rows
 * are copied to the device first. */
int kcu_dequant_f16(kcu_stream s, uint16_t *dst, const void *src, int src_type, size_t n);

/* x[i][0..n_embd) = row tokens[i] of table ([n_vocab][n_embd] of type t),
 * as f32, for i < n_tok. */
int kcu_embed(kcu_stream s, float *x, const int32_t *tokens, int n_tok, const void *table,
              enum kcu_type t, int n_embd);

/* y[i] = x[rows ? rows[i] : i] / sqrt(mean(x^2) + eps) * w for i < n_rows,
 * rows of n floats; the sum of squares in double. y may alias x when rows
 * is NULL. */
int kcu_rmsnorm(kcu_stream s, float *y, const float *x, const int32_t *rows, const float *w,
                int n_rows, int n, float eps);

/* dst[n] = src[n] rounded to t (KCU_F16: RNE; KCU_BF16: RNE), the input of
 * a half-precision GEMM. */
int kcu_to_half(kcu_stream s, void *dst, enum kcu_type t, const float *src, size_t n);

/* y[n] = silu(gate) * up (silu(g) = g / (1 + expf(-g))); y may alias. */
int kcu_swiglu(kcu_stream s, float *y, const float *gate, const float *up, size_t n);

/* x[n] += y[n]. */
int kcu_add(kcu_stream s, float *x, const float *y, size_t n);

/* For each token i < n_tok: RoPE ("normal" mode, as kern_rope) on q[i]
 * ([n_head][head_dim]) and k[i] ([n_head_kv][head_dim]) in place at
 * position pos[i], then store k[i] and v[i] into the cache as kvt at
 * kv_tok[i] + k_off and kv_tok[i] + v_off, where kv_tok[i] is the device
 * address of the token's slot (range base + pos[i]*stride). A quantized kvt
 * is one more launch: kcu_kv_store of the rotated k and of v. */
int kcu_rope_store(kcu_stream s, float *q, float *k, const float *v, int n_tok, const int32_t *pos,
                   const uint64_t *kv_tok, size_t k_off, size_t v_off, enum kcu_kv kvt, int n_head,
                   int n_head_kv, int head_dim, int n_rot, float rope_base);

/* Store n_tok tokens' rows k[i] and v[i] (f32 [n_tok][n_head_kv][head_dim],
 * borrowed, not modified) into the cache as the quantized type kvt
 * (KCU_KV_Q8_0, KCU_KV_Q4_0 or KCU_KV_FP8) at kv_tok[i] + k_off and
 * kv_tok[i] + v_off (device addresses of the tokens' slots, any alignment,
 * each with room for kern_kv_row_bytes bytes at both offsets). The bytes are
 * kern_kv_store's for the same f32 rows (GGUF Q8_0/Q4_0 block rules of
 * ggml's reference quantizers; Q4_0 after the per-head Walsh-Hadamard
 * rotation of QuaRot, arXiv:2404.00456; FP8 per the OCP OFP8 spec, E4M3
 * round to nearest even, saturating at 448, native conversion on sm_89+).
 * -EINVAL: NULL pointers, n_tok < 0, n_head_kv or head_dim <= 0, head_dim >
 * 256, n_head_kv * head_dim > KCU_KV_MAX_ROW, another kvt. */
#define KCU_KV_MAX_ROW                                                                             \
    12288 /* values of a quantized row: its f32 staging, 48 KiB of shared memory */
int kcu_kv_store(kcu_stream s, const float *k, const float *v, int n_tok, const uint64_t *kv_tok,
                 size_t k_off, size_t v_off, enum kcu_kv kvt, int n_head_kv, int head_dim);

/* dst[n] = the E4M3 bytes of src[n] as the FP8 cache stores them (RNE,
 * saturating at +-448, NaN to +-448: kern_cpu_fp8_from_f32's rule), for the
 * device test of the conversion. -EINVAL: NULL pointers with n > 0. */
int kcu_fp8_from_f32(kcu_stream s, uint8_t *dst, const float *src, size_t n);

/* One sequence of an attention batch: n_tok queries at positions
 * pos0..pos0+n_tok-1, rows q_row.. of q and out; keys 0..pos0+n_tok-1 of the
 * range at `base` (already stored). */
struct kcu_att_seq {
    uint64_t base; /* range base (device VA): token t at base + t*stride */
    int32_t pos0, n_tok, q_row, pad;
};

/* Shape of the cache and the heads, constant per model. */
struct kcu_att_shape {
    size_t stride;                   /* token stride S, bytes */
    size_t k_off, v_off;             /* offset of this layer's K and V inside a token, bytes */
    enum kcu_kv kvt;                 /* any: the quantized types read in place */
    int n_head, n_head_kv, head_dim; /* head_dim <= 256, a multiple of 32 not required */
};

/* Bytes of workspace kcu_attention needs for up to n_seqs sequences of up to
 * max_ctx keys (the split-K partials of flash-decoding). */
size_t kcu_attention_ws_bytes(int n_seqs, int n_head, int head_dim, int max_ctx);

/* out[row][n_head][head_dim] = causal attention (scale 1/sqrt(head_dim),
 * online softmax in f32) of q rows of every sequence over its own keys,
 * GQA head h -> kv head h / (n_head / n_head_kv). seqs (device) and
 * seqs_host (the same array in host memory, for grid sizes) are borrowed.
 * Decode rows (n_tok == 1) use split-K flash-decoding (Dao et al. 2023,
 * "Flash-Decoding for long-context inference") over ws; prefill chunks a
 * FlashAttention-style tiled kernel (Dao et al. 2022, arXiv:2205.14135).
 * ws_bytes >= kcu_attention_ws_bytes(n_seqs, ..., max keys of the batch).
 * A row's result depends only on its own key count within each path, not
 * on the rest of the batch; but the two paths sum in different orders, so
 * a query computed as a 1-token chunk and the same query inside a longer
 * chunk differ in the last bits (unlike kern_attention on the CPU).
 * Quantized caches are dequantized in registers to the values kern_attention
 * uses (d * q, e4m3 * s); for Q4_0 each query is rotated by the cache's
 * Hadamard matrix first and each output rotated back (H orthogonal and
 * symmetric), as kern_attention does. */
int kcu_attention(kcu_stream s, float *out, const float *q, const struct kcu_att_seq *seqs,
                  const struct kcu_att_seq *seqs_host, int n_seqs, const struct kcu_att_shape *sh,
                  void *ws, size_t ws_bytes);

/* y[n_tok][n_out] = x[n_tok][n_in] . W^T with W [n_out][n_in] in Q8_0 blocks
 * (34 B per 32 weights, as in the GGUF file), dequantised on the fly, f32
 * accumulation; n_in a multiple of 32. For decode-sized n_tok (<= 16): the
 * alternative to upcasting Q8_0 weights to f16 at load. */
int kcu_matmul_q8_0(kcu_stream s, float *y, const float *x, const void *w, int n_in, int n_out,
                    int n_tok);

#ifdef __cplusplus
}
#endif

#endif /* LLMD_KERN_CUDA_H */
