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
 * Spec: "<shape>[:<type>[:<arch>]]", arch llama (default), qwen2 (Q/K/V
 * biases), qwen3 (per-head Q/K norms, head_dim twice n_embd / n_head) or
 * llama3 (RoPE base 500000 and Llama 3.1's rope_freqs.weight):
 * the same shapes in those architectures' keys and tensors. Types: f32, f16 (default), q8_0, q4_0,
 * q4_k, q5_k, q6_k (every matrix that type), and q4_k_m / q5_k_m, llama-quantize's mixes: the
 * default type Q4_K / Q5_K, with Q6_K for output.weight and for attn_v and ffn_down in the first
 * and last eighth of the layers and every third between (llama_tensor_get_type's use_more_bits).
 * Norms stay f32. Rows that are not whole blocks fall back: to q8_0 when they are whole 32-blocks
 * (llama-quantize picks q5_0/q5_1 for Q4_K/Q5_K there, which llmd lacks, and q8_0 for Q6_K), else
 * to f16 (model_dummy.c). Shapes: tiny        2 layers,  n_embd   64, heads  4/2,  n_ff  128, vocab
 * 512 tiny-256    4 layers,  n_embd  256, heads  4/2,  n_ff  768, vocab  1024 (the smallest whose
 * rows are whole K-quant super-blocks) dummy-100m  6 layers,  n_embd  512, heads  8/4,  n_ff 1376,
 * vocab 32000 dummy-1g   16 layers,  n_embd 1536, heads 12/4,  n_ff 4096, vocab 32000 llama3-8b-2l
 * 2 layers of Llama-3-8B: 4096, 32/8, 14336, vocab 128256 llama3-8b     all 32 layers of it (16 GB
 * of f16 weights: GPU benchmarks) (dummy-100m and dummy-1g are the shapes of
 * ../shared/BASELINES.md.)
 *
 * Thread safety: reentrant.
 */
#ifndef LLMD_MODEL_DUMMY_H
#define LLMD_MODEL_DUMMY_H

#include <stddef.h>

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

#endif /* LLMD_MODEL_DUMMY_H */
