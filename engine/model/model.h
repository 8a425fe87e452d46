/* model.h - a Llama-family model loaded from GGUF: hyperparameters, weight
 * views and the tokenizer. The forward pass is in model_forward.h.
 *
 * Architecture (Touvron et al. 2023, "LLaMA"; GGUF metadata keys `llama.*`,
 * ggml docs/gguf.md "LLaMA"): token embedding, per block RMSNorm ->
 * grouped-query attention with RoPE -> residual, RMSNorm -> SwiGLU FFN ->
 * residual; output RMSNorm and a classifier tied to the embedding when the
 * file has no `output.weight`.
 *
 * The file is memory-mapped. The matrices the CPU level packs or copies
 * (model_load) are read from those copies, and their pages in the mapping
 * are given back; the norm vectors, biases and rope_freqs are copied as f32
 * into a buffer of the model's; the embedding is read in place. A model
 * spec is either a GGUF path or "dummy:<shape>", a random-weight model
 * built in memory (see model_dummy.h).
 *
 * Thread safety: a loaded model is immutable; any number of threads may run
 * forward passes over it at once (each with its own model_ctx).
 */
#ifndef LLMD_MODEL_H
#define LLMD_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/model/gguf.h"
#include "kernels/kern.h"

struct tok;

/* The architectures llmd runs, by general.architecture (their keys are
 * "<arch>.*"; llama.cpp's llm_arch and llama-model.cpp name the tensors and
 * the RoPE mode of each):
 *   llama  Llama 1/2/3, Mistral without sliding window: "normal" RoPE
 *   qwen2  Qwen2, Qwen2.5: a bias on Q, K and V (blk.N.attn_{q,k,v}.bias);
 *          NEOX RoPE (pairs i, i + n_rot/2)
 *   qwen3  Qwen3 (dense): RMSNorm over each head of Q and K before RoPE
 *          (blk.N.attn_{q,k}_norm.weight, [head_dim]), no bias; head_dim
 *          from qwen3.attention.key_length (not n_embd / n_head); NEOX RoPE
 *   phi3   Phi-3: Q, K and V in one matrix (blk.N.attn_qkv, their rows one
 *          after the other) and gate and up in one (blk.N.ffn_up, gate rows
 *          first), a separate output matrix, NEOX RoPE, and a sliding window
 *          on every layer (phi3.attention.sliding_window); llama.cpp's
 *          build_phi3. Every architecture takes <arch>.attention.sliding_window
 *          (hparams.n_swa); phi3 is the one llama.cpp c392e50 applies it to. */
enum model_arch {
    MODEL_ARCH_LLAMA = 0,
    MODEL_ARCH_QWEN2,
    MODEL_ARCH_QWEN3,
    MODEL_ARCH_PHI3,
    MODEL_ARCH_N
};

/* "llama", "qwen2", "qwen3", "phi3" ("?" out of range). Static. */
const char *model_arch_name(enum model_arch a);

struct model_hparams {
    enum model_arch
        arch;       /* llama with rope_freqs.weight: Llama 3.1 RoPE scaling (model.rope_freqs) */
    bool rope_neox; /* NEOX RoPE (kern_rope_neox) instead of the normal one */
    uint32_t n_vocab;
    uint32_t n_embd; /* model width */
    uint32_t n_layer;
    uint32_t n_head;      /* query heads */
    uint32_t n_head_kv;   /* key/value heads (GQA: n_head % n_head_kv == 0) */
    uint32_t head_dim;    /* n_embd / n_head, or <arch>.attention.key_length */
    uint32_t n_ff;        /* FFN hidden width */
    uint32_t n_rot;       /* dims of each head RoPE rotates (llama.rope.dimension_count) */
    uint32_t n_ctx_train; /* llama.context_length */
    float rms_eps;        /* llama.attention.layer_norm_rms_epsilon */
    float rope_base;      /* llama.rope.freq_base, default 10000 */
    uint32_t n_swa;       /* <arch>.attention.sliding_window: the token at position p
                           * attends keys p - n_swa < k <= p (llama.cpp's mask: a key
                           * with p - k >= n_swa is masked); 0: no window */
};

/* One weight matrix: n_out rows of n_in elements in `type`, row-major
 * ([n_out][n_in], ggml ne = {n_in, n_out}). Borrowed from the mapping,
 * or, for a matrix model_load copied (below), in the model's pack block.
 * pack: the same matrix in the kernels' packed layout when the CPU level
 * gains from one (kern_pack_supported; pack.data NULL otherwise), owned by
 * the model; the forward pass then multiplies with it (kern_matmul_packed). */
struct model_w {
    const void *data;      /* the rows: the file's, or model_load's copy of them */
    const void *file_rows; /* the file's rows when data points at a copy; else NULL */
    enum kern_wtype type;
    uint32_t n_in, n_out;
    struct kern_pack pack;
};

/* w's rows as the file has them: data, unless the loader pointed data at
 * a copy (model_load). */
static inline const void *model_w_file_rows(const struct model_w *w) {
    return w->file_rows ? w->file_rows : w->data;
}

struct model_layer {
    const float *attn_norm;      /* [n_embd] */
    const float *ffn_norm;       /* [n_embd] */
    struct model_w wq;           /* [n_head*head_dim][n_embd] */
    struct model_w wk, wv;       /* [n_head_kv*head_dim][n_embd] */
    struct model_w wo;           /* [n_embd][n_head*head_dim] */
    struct model_w w_gate, w_up; /* [n_ff][n_embd] */
    struct model_w w_down;       /* [n_embd][n_ff] */
    const float *bq;             /* qwen2: [n_head*head_dim] added to Q; else NULL */
    const float *bk, *bv;        /* qwen2: [n_head_kv*head_dim]; else NULL */
    const float *q_norm;         /* qwen3: [head_dim] RMSNorm weight of each Q head; else NULL */
    const float *k_norm;         /* qwen3: [head_dim], of each K head; else NULL */
};

struct model {
    struct model_hparams hp;
    struct model_w tok_embd;    /* [n_vocab][n_embd] */
    struct model_w output;      /* [n_vocab][n_embd]; tok_embd's when tied (output_tied),
                                 * though model_load may then point its data at a copy */
    bool output_tied;           /* no output.weight: the classifier is tok_embd */
    const float *output_norm;   /* [n_embd] */
    const float *rope_freqs;    /* [n_rot/2] rope_freqs.weight: each RoPE pair's angle is
                                 * divided by it (Llama 3.1's scaling); NULL: none */
    struct model_layer *layers; /* [n_layer] */
    struct gguf *gguf;
    struct tok *tok;
    char name[128];          /* file name without .gguf, or the dummy spec */
    uint64_t weight_bytes;   /* bytes of all weight tensors */
    uint64_t packed_bytes;   /* bytes of the packed copies (0: none) */
    uint64_t copied_bytes;   /* bytes of the matrices copied as they are (0: none) */
    uint64_t released_bytes; /* of the file's mapping, given back after the packs and
                              * copies were made (whole pages; 0 for a dummy model) */
    char wtypes[160];        /* the file's matrices (tensors of 2+ dims) per type, most
                              * first: "17 q3_K, 10 q4_K, 2 q5_K, 1 q6_K" (model_load) */
    void *pack_buf;          /* every pack and copy, one mem_alloc_huge block; NULL: none */
    void *owned;             /* f32 copies of every norm, bias and rope_freqs */
    void *dummy_buf;         /* in-memory GGUF of a dummy model */
};

struct model_load_opts {
    bool quiet;                /* no progress/info lines on stderr */
    bool no_pack;              /* keep only the file's rows: a GPU computes from them, so
                                * the CPU's packed copies would be memory for nothing */
    const char *tokenizer_pre; /* a pre-tokenizer instead of the file's (tok_create_pre);
                                * NULL: the file's */
    struct kern_pool *pool;    /* packs the matrices over its threads (borrowed, used
                                * only during the call, from the pool's caller thread);
                                * NULL: on the calling thread. Same bytes either way */
};

/* Load `spec` (a GGUF path, or "dummy:<shape>"). Validates the architecture
 * (enum model_arch), every hyperparameter (non-zero, head_count % head_count_kv,
 * n_rot even and <= head_dim, each below a fixed limit), every tensor's
 * presence, type (matrices f32, f16, q8_0, q4_0, q2_K, q3_K, q4_K, q5_K or q6_K; norms
 * f32 or f16), shape against the hyperparameters
 * and data alignment (4 bytes for f32, else 2), then builds the tokenizer.
 * Returns 0; -EINVAL for a bad or inconsistent file (errbuf names the key or
 * tensor), -ENOTSUP for an unsupported architecture or tensor type, or a
 * head_dim above KERN_ATT_MAX_HEAD_DIM, -ENOENT/-EACCES when the file cannot
 * be opened, -ENOMEM. Unless opts->no_pack, every matrix the CPU level
 * multiplies faster in a packed layout is packed here, once (one pass over
 * it; as many bytes again in host memory, m->packed_bytes), and from the
 * avx2 level up every other matrix is copied as it is, onto huge pages
 * (m->copied_bytes; its data then points at the copy; where that memory
 * cannot be had, a warning, and the matrices stay on the mapping). The
 * mapping's pages of a packed or copied matrix are then given back
 * (model_release_pages; m->released_bytes), so the weights count once in RSS.
 * opts may be NULL.
 * Caller frees with model_free(). */
int model_load(const char *spec, const struct model_load_opts *opts, struct model **out,
               char *errbuf, size_t errlen);

/* NULL is a no-op. */
void model_free(struct model *m);

/* Give back the file mapping's pages of every packed or copied matrix
 * (gguf_range_release: the whole pages inside each; never the
 * embedding's), which the forward pass does not read. model_load does it
 * once the packs and copies are made; call it again after reading the
 * tensors through the mapping (the engine's fingerprint hashes every
 * one), or they count in RSS twice. Returns the bytes given back
 * (m->released_bytes for a model nothing else has touched); 0 for a
 * dummy model, a no_pack load or at the scalar level. Safe while other
 * threads run forward passes (they read the packs and copies, not these
 * pages). */
size_t model_release_pages(const struct model *m);

/* The matrices in the order the forward pass reads them (and model_load
 * packs and copies them into one block): layer by layer wq, wk, wv, wo,
 * w_gate, w_up, w_down, then the classifier. model_matrix(m, i) for i in
 * [0, model_n_matrices(m)); an i past the layers is the classifier (the
 * classifier alone before the layers are bound). Borrowed from m; same
 * thread rule as m itself. */
uint32_t model_n_matrices(const struct model *m);
struct model_w *model_matrix(struct model *m, uint32_t i);

/* Bytes of one token's K and V for every layer, unpadded, for KV rows of
 * row_bytes each (kern_kv_row_bytes of the cache type: 4 * n_head_kv *
 * head_dim for f32, 2 * that for f16): n_layer * 2 * row_bytes. */
uint64_t model_kv_token_bytes(const struct model_hparams *hp, uint64_t row_bytes);

#endif /* LLMD_MODEL_H */
