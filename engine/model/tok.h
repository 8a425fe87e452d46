/* tok.h - text <-> token ids, bit-for-bit like llama.cpp's tokenizers.
 *
 * Two kinds, chosen by tokenizer.ggml.model:
 *   "llama" -> TOK_SPM: SentencePiece-style merge of adjacent symbols by the
 *              highest score, byte fallback through <0xNN> tokens
 *              (llama.cpp llm_tokenizer_spm).
 *   "gpt2"  -> TOK_BPE: GPT-2 byte-level BPE: pre-tokenizer regex (PCRE2),
 *              byte-to-unicode mapping, merges by rank (llm_tokenizer_bpe).
 *
 * Workflow: tok_create() from an open GGUF (or tok_create_vocab() from any
 * in-memory description); tok_encode() for prompts; tok_piece() or the
 * tok_stream_* helpers to turn generated ids back into text; tok_destroy().
 *
 * Special tokens in the input text are not parsed: "<s>" is encoded as the
 * characters '<', 's', '>' (llama.cpp's parse_special=false). Unlike
 * llama.cpp, user-defined tokens (type 4) are not matched in the text either
 * [TAG_TOK_USER_DEFINED]; the vocabularies tested so far have none.
 * Encoding never fails on bad UTF-8: SPM falls back to byte tokens, BPE
 * replaces each invalid sequence by U+FFFD as llama.cpp does.
 *
 * Thread safety: a struct tok is immutable after creation; every function
 * taking a const struct tok * may run on any thread at once. A tok_stream is
 * owned by one caller. No function blocks on I/O.
 */
#ifndef LLMD_TOK_H
#define LLMD_TOK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct gguf;
struct tok;

enum tok_kind { TOK_SPM, TOK_BPE };

/* Byte-level BPE pre-tokenizers, by tokenizer.ggml.pre (the names llama.cpp's
 * converter writes; the splits are the Split regexes of each family's
 * tokenizer.json, Hugging Face tokenizers):
 *   "gpt-2"     GPT-2: 's|'t|... ?\p{L}+| ?\p{N}+|...
 *   "llama-bpe" Llama 3: case-insensitive contractions, a letter run with
 *               one leading non-letter, digits in runs of at most 3, and
 *               whole words looked up before merging (ignore_merges)
 *   "qwen2"     Qwen2 / 2.5 / 3: as llama-bpe but one digit a word, merges
 *               always, and the text NFC-normalised first (the tokenizer's
 *               normalizer; llama.cpp skips this step, so the two differ on
 *               text that is not already NFC) */
enum tok_pre { TOK_PRE_GPT2 = 0, TOK_PRE_LLAMA3, TOK_PRE_QWEN2, TOK_PRE_N };

/* The pre-tokenizer named `name` (tokenizer.ggml.pre's spelling, n bytes).
 * Returns 0, -ENOENT (not one llmd implements). */
int tok_pre_parse(const char *name, size_t n, enum tok_pre *out);

/* "gpt-2", "llama-bpe", "qwen2" ("?" out of range). Static. */
const char *tok_pre_name(enum tok_pre p);

/* The Split regex of pre-tokenizer p, as its tokenizer.json writes it (NULL
 * out of range). Static. */
const char *tok_pre_pattern(enum tok_pre p);

/* Token types, the values of tokenizer.ggml.token_type (llama.cpp's
 * LLAMA_TOKEN_TYPE_*). */
enum tok_type {
    TOK_TYPE_UNDEFINED = 0,
    TOK_TYPE_NORMAL = 1,
    TOK_TYPE_UNKNOWN = 2,
    TOK_TYPE_CONTROL = 3,
    TOK_TYPE_USER_DEFINED = 4,
    TOK_TYPE_UNUSED = 5,
    TOK_TYPE_BYTE = 6,
};

/* A byte string view; not NUL-terminated. */
struct tok_str {
    const char *ptr;
    size_t len; /* bytes */
};

/* A plain description of a vocabulary, fillable from any source. */
struct tok_vocab {
    enum tok_kind kind;
    uint32_t n_tokens;
    const struct tok_str *tokens; /* [n_tokens] token texts (SPM: spaces as U+2581) */
    const float *scores;          /* [n_tokens] or NULL (all 0); SPM merge priority */
    const int32_t *types;         /* [n_tokens] enum tok_type, or NULL (all NORMAL) */
    uint32_t n_merges;            /* BPE only */
    const struct tok_str *merges; /* [n_merges] "left right", rank = index; BPE only */
    int32_t bos, eos, unk;        /* token ids, -1 = none */
    int add_bos;                  /* -1 = unset (kind default), 0, 1 */
    bool add_space_prefix;        /* SPM: prepend U+2581 to non-empty text */
    enum tok_pre pre;             /* BPE: the pre-tokenizer */
    const struct gguf *file;      /* the file tokens[] point into, for the offsets in
                                   * error messages; NULL: none (borrowed for the call) */
};

/* Build a tokenizer from tokenizer.ggml.* keys of g: model, tokens, scores,
 * token_type, merges, bos/eos/unknown_token_id, add_bos_token,
 * add_space_prefix, and for gpt2 pre (absent: gpt-2, with a warning; a
 * name tok_pre_parse() does not know is refused, naming it: a wrong split
 * silently changes every prompt).
 * g is borrowed: token texts point into it, so g must outlive the tok.
 * Returns 0, -EINVAL (a key missing, of the wrong type or inconsistent; the
 * message names the key), -ENOTSUP (model other than "llama"/"gpt2", or an
 * unsupported gpt2 pre-tokenizer), -ENOMEM. errbuf may be NULL. On error
 * *out is untouched. Caller frees with tok_destroy(). */
int tok_create(const struct gguf *g, struct tok **out, char *errbuf, size_t errlen);

/* tok_create(), splitting text with the pre-tokenizer `pre` (a tok_pre_parse
 * name: "gpt-2", "llama-bpe", "qwen2"; borrowed for the call) instead of
 * what tokenizer.ggml.pre says: for a file whose pre llmd does not know but
 * whose family splits text as one it does (the user's word, logged as a
 * warning). NULL: tok_create(). Also -EINVAL for an unknown name, or a
 * name with a SentencePiece vocabulary (it has no pre-tokenizer). */
int tok_create_pre(const struct gguf *g, const char *pre, struct tok **out, char *errbuf,
                   size_t errlen);

/* As tok_create() from a plain description. The arrays of v are copied;
 * the bytes behind tokens[i].ptr and merges[i].ptr are borrowed and must
 * outlive the tok. Returns 0, -EINVAL (an id out of range, a bad merge, an
 * SPM byte token whose text is not "<0xNN>" with two hex digits),
 * -ENOMEM. */
int tok_create_vocab(const struct tok_vocab *v, struct tok **out, char *errbuf, size_t errlen);

/* Free; NULL is a no-op. */
void tok_destroy(struct tok *t);

enum tok_kind tok_kind(const struct tok *t);
uint32_t tok_n_vocab(const struct tok *t);
int32_t tok_bos(const struct tok *t); /* -1 if none */
int32_t tok_eos(const struct tok *t); /* -1 if none */

/* The type of token id (enum tok_type; TOK_TYPE_UNDEFINED out of range)
 * and its text as the vocabulary spells it (byte-level BPE: in the GPT-2
 * byte mapping; {NULL, 0} out of range). */
enum tok_type tok_token_type(const struct tok *t, int32_t id);
struct tok_str tok_token_text(const struct tok *t, int32_t id);

/* The end-of-generation tokens: the EOS, tokenizer.ggml.eot_token_id and
 * eom_token_id where the file gives them (Llama 3's <|eot_id|> and
 * <|eom_id|>, ChatML's <|im_end|>), and every control token spelled
 * <|eot_id|>, <|eom_id|>, <|im_end|>, <|endoftext|> or <|end_of_text|>
 * (llama.cpp's rule too: a converter that wrote only one of them still
 * stops at the others). Distinct, the EOS first, at most TOK_EOG_MAX.
 * Copies them into ids[] and returns how many (0: no EOS and none of
 * those). Pure. */
#define TOK_EOG_MAX 8
uint32_t tok_eog(const struct tok *t, int32_t ids[TOK_EOG_MAX]);
bool tok_is_eog(const struct tok *t, int32_t id);

/* Whether a prompt should start with BOS: SPM true unless add_bos_token says
 * false; BPE false unless it says true. Always false when there is no BOS. */
bool tok_add_bos_default(const struct tok *t);

/* Encode len bytes of text (need not be NUL-terminated or valid UTF-8) into
 * ids[0..cap). With add_bos and a BOS token, ids[0] is BOS. *n_ids is set to
 * the number of ids the text needs, also on -ENOSPC (then ids[0..cap) holds
 * the first cap of them). Empty text gives no ids (only BOS if asked).
 * Returns 0, -ENOSPC (cap too small), -ENOMEM (scratch memory, a PCRE2
 * resource limit, or len over 512 MiB). Time is O(n log n) in len; scratch
 * is O(len) and freed before returning. */
int tok_encode(const struct tok *t, const char *text, size_t len, bool add_bos, int32_t *ids,
               size_t cap, size_t *n_ids);

/* As tok_encode() into a buffer it allocates: *ids holds *n_ids ids plus
 * room for `extra` more (a caller appends generated tokens there). The
 * buffer is sized one id per byte first and once more to the count
 * tok_encode() reports if that was short (byte fallback can take 3 ids a
 * byte). Returns 0, -ENOMEM. Caller frees *ids with mem_free(). */
int tok_encode_alloc(const struct tok *t, const char *text, size_t len, bool add_bos, size_t extra,
                     int32_t **ids, size_t *n_ids);

/* The raw bytes token id contributes to the text, as llama.cpp's
 * token_to_piece(special=false): SPM normal tokens with U+2581 turned into
 * ' ', byte tokens <0xNN> as byte NN; BPE normal tokens through the inverse
 * GPT-2 byte mapping (a code point outside the mapping is copied as its
 * UTF-8, where llama.cpp would print "[UNK_BYTE_..]"); user-defined tokens
 * verbatim; control, unknown, unused and undefined tokens as "".
 * Writes min(cap, *n) bytes, no NUL. *n is the piece's length, also on
 * -ENOSPC. Returns 0, -EINVAL (id out of range), -ENOSPC (cap too small). */
int tok_piece(const struct tok *t, int32_t id, char *buf, size_t cap, size_t *n);

/* Streaming detokenizer: turns ids one at a time into complete, valid UTF-8.
 * Caller-embedded; no heap, nothing to free. */
struct tok_stream {
    uint8_t pending[8]; /* an incomplete trailing UTF-8 sequence (<= 3 bytes) */
    uint32_t n_pending; /* bytes */
};

void tok_stream_init(struct tok_stream *s);

/* Append the piece of id and write to out only complete, valid UTF-8: a
 * trailing incomplete sequence is held back in s; each invalid sequence
 * (maximal subpart, as in WHATWG/Unicode "U+FFFD substitution of maximal
 * subparts") becomes U+FFFD. *n_out is the number of bytes written, or on
 * -ENOSPC the number needed (then s is unchanged and nothing counts as
 * consumed: retry with a bigger buffer). A piece of up to P bytes needs at
 * most 3 * (P + 3) bytes of out. Returns 0, -EINVAL (id out of range),
 * -ENOSPC. */
int tok_stream_push(const struct tok *t, struct tok_stream *s, int32_t id, char *out, size_t cap,
                    size_t *n_out);

/* Emit what is still held back as one U+FFFD (3 bytes) and reset s.
 * Returns 0 or -ENOSPC (cap < 3 with something pending; s unchanged). */
int tok_stream_flush(struct tok_stream *s, char *out, size_t cap, size_t *n_out);

#endif /* LLMD_TOK_H */
