/* model_dummy.h - random-weight Llama models of named shapes, for scale
 * tests and benchmarks (the idea of vLLM's `--load-format dummy`).
 *
 * A dummy model is a real GGUF image: built with gguf_writer, so the same
 * loader, validation and forward pass run on it, and it can be written to a
 * file so other engines (llama.cpp) run on exactly the same weights. Its
 * tokenizer is a SentencePiece vocabulary that works byte by byte: <unk>,
 * <s>, </s>, the 256 byte tokens <0xNN>, "▁" (a space), then filler pieces,
 * so any text encodes as one token per byte (and per space).
 *
 * Weights are uniform in ±sqrt(3/n_in) (unit-variance activations), norms
 * are 1, from a seeded generator: the same spec gives the same bytes.
 *
 * Spec: "<shape>[:<type>[:<arch>]]". Architectures: llama (default),
 * qwen2 (Q/K/V biases), qwen3 (per-head Q/K norms, head_dim twice n_embd /
 * n_head), llama3 (RoPE base 500000 and Llama 3.1's rope_freqs.weight),
 * phi3 (fused attn_qkv and gate/up), mistral-swa (a sliding window): the
 * same shapes in those architectures' keys and tensors.
 *
 * Types: f32, f16 (default), q8_0, q4_0, q2_k .. q6_k (every matrix that
 * type), and q2_k_m, q3_k_m, q4_k_m, q5_k_m: llama-quantize's Q2_K, Q3_K_M,
 * Q4_K_M and Q5_K_M mixes as llama_tensor_get_type picks them (the table
 * is in docs/generate.md). Norms stay f32. Rows that are not whole blocks
 * fall back to q8_0 when they are whole 32-blocks (llama-quantize picks
 * iq4_nl, q5_0 or q5_1 there, which llmd lacks, and q8_0 for Q6_K), else
 * to f16.
 *
 * Shapes (layers, n_embd, heads/KV heads, n_ff, vocab):
 *   tiny          2,   64,  4/2,   128,    512
 *   tiny-256      4,  256,  4/2,   768,   1024  (rows of whole K blocks)
 *   dummy-100m    6,  512,  8/4,  1376,  32000
 *   dummy-1g     16, 1536, 12/4,  4096,  32000
 *   llama3-8b-2l  2 layers of Llama-3-8B: 4096, 32/8, 14336, 128256
 *   llama3-8b    all 32 layers of it (16 GB of f16 weights)
 * (dummy-100m and dummy-1g are the shapes of ../shared/BASELINES.md.)
 *
 * Thread safety: reentrant.
 */
#ifndef LLMD_MODEL_DUMMY_H
#define LLMD_MODEL_DUMMY_H

#include <stddef.h>
#include <stdint.h>

/* Build the GGUF image of `spec` in memory. *buf is the caller's, freed
 * with mem_free(). Returns 0, -EINVAL (unknown shape or type: errbuf lists
 * the known ones), -ENOMEM. */
int model_dummy_write_mem(const char *spec, void **buf, size_t *len, char *errbuf, size_t errlen);

/* Write the GGUF of `spec` to `path`. Returns 0 or -errno (errbuf says
 * why; a partial file is removed). */
int model_dummy_write_file(const char *spec, const char *path, char *errbuf, size_t errlen);

/* The names of the shapes, comma-separated, for help texts. */
const char *model_dummy_shapes(void);

/* The names of the architectures, comma-separated, for help texts. */
const char *model_dummy_archs(void);

/* The names of the weight types, comma-separated, for help texts. */
const char *model_dummy_types(void);

/* The type weight type name `type` gives matrix `kind` ("token_embd",
 * "output", "attn_q", "attn_qkv", "attn_v", "ffn_down", ...) of layer il of
 * n_layer, with n_gqa query heads a KV head and rows of n_in elements (an
 * enum gguf_ttype), or -1 for an unknown type name: the rule the writer
 * follows, for tests. */
int model_dummy_wtype(const char *type, const char *kind, uint32_t il, uint32_t n_layer,
                      uint32_t n_gqa, uint32_t n_in);

#endif /* LLMD_MODEL_DUMMY_H */
