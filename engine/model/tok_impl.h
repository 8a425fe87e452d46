/* tok_impl.h - internals shared by tok.c (creation, SPM, pieces, streams),
 * tok_bpe.c (GPT-2 byte-level BPE) and tok_vocab.c (hash tables, the merge
 * loop). Not a public header.
 */
#ifndef LLMD_TOK_IMPL_H
#define LLMD_TOK_IMPL_H

#include "engine/model/tok.h"

struct tok_bpe_re; /* compiled pre-tokenizer regex, tok_bpe.c */

struct tok_merge {
    struct tok_str a, b; /* left and right halves; borrowed like token texts */
};

struct tok {
    enum tok_kind kind;
    uint32_t n_vocab;
    struct tok_str *text; /* [n_vocab] borrowed token bytes */
    float *score;         /* [n_vocab] */
    uint8_t *type;        /* [n_vocab] enum tok_type */
    uint32_t *ht;         /* [ht_mask + 1] text -> id + 1; 0 = empty slot */
    uint32_t ht_mask;
    uint32_t n_merges;
    struct tok_merge *merges; /* [n_merges]; BPE only */
    uint32_t *mht;            /* [mht_mask + 1] (a, b) -> rank + 1; BPE only */
    uint32_t mht_mask;
    int32_t bos, eos, unk;    /* -1 = none */
    int32_t eog[TOK_EOG_MAX]; /* end-of-generation ids (tok_eog), the EOS first */
    uint32_t n_eog;
    bool add_bos;
    bool add_space_prefix;
    enum tok_pre pre;      /* BPE */
    bool ignore_merges;    /* BPE: a word that is a normal token is that token (llama-bpe) */
    bool nfc;              /* BPE: NFC-normalise the text first (qwen2) */
    int32_t byte_tok[256]; /* SPM byte fallback: id for each byte, -1 = drop */
    char *pieces;          /* all decoded pieces back to back */
    uint32_t *piece_off;   /* [n_vocab + 1] byte offsets into pieces */
    struct tok_bpe_re *re; /* BPE only */
};

/* tok_vocab.c: index t->text[0..n_vocab) in t->ht (a duplicate text: the
 * later id wins), and split + index the "left right" merges (BPE). Return
 * 0 or -ENOMEM; on failure what was allocated stays in t for tok_destroy(). */
int tok_vocab_index(struct tok *t);
int tok_merges_index(struct tok *t, const struct tok_str *merges, uint32_t n);

/* Id of the token whose text is exactly s[0..n), or -1. When two tokens
 * share a text the later id wins (llama.cpp's token_to_id map). */
int32_t tok_lookup(const struct tok *t, const char *s, size_t n);

/* Rank of the merge "a b", or -1. On duplicate merges the first rank wins. */
int32_t tok_merge_rank(const struct tok *t, const char *a, size_t na, const char *b, size_t nb);

/* Output ids: the first cap are stored, all are counted. */
struct tok_out {
    int32_t *ids;
    size_t cap, n;
};

static inline void tok_out_push(struct tok_out *o, int32_t id) {
    if (o->n < o->cap)
        o->ids[o->n] = id;
    o->n++;
}

/* One symbol of the merge loop: bytes text[off, off + n) of the text being
 * merged, in a doubly linked chain (indices, -1 = none). n == 0 once merged
 * into its left neighbour. */
struct tok_sym {
    int32_t prev, next;
    uint32_t off, n;
};

struct tok_bigram {
    double prio; /* higher merges first: SPM score, BPE -rank */
    int32_t left, right;
    uint32_t size; /* bytes of left + right when queued; stale if changed */
};

/* Scratch for the merge loop, reused across words of one tok_encode(). */
struct tok_work {
    struct tok_sym *sym;
    size_t cap_sym;
    struct tok_bigram *heap;
    size_t n_heap, cap_heap;
};

/* Split text[0..len) into UTF-8 symbols (by lead byte, as llama.cpp's
 * unicode_len_utf8, so any bytes work) and merge adjacent pairs best first
 * (ties: leftmost) until no pair can merge. SPM pairs merge when their
 * concatenation is a token (priority = its score); BPE pairs when they form
 * a merge (priority = -rank). On return the symbols chain from index 0
 * (none if len == 0). Returns 0 or -ENOMEM. */
int tok_work_merge(const struct tok *t, struct tok_work *w, const char *text, size_t len);
void tok_work_fini(struct tok_work *w);

/* tok_bpe.c */
int tok_bpe_init(struct tok *t, char *errbuf, size_t errlen);
void tok_bpe_fini(struct tok *t);
int tok_bpe_encode(const struct tok *t, const char *text, size_t len, struct tok_out *o);
/* Inverse GPT-2 byte mapping of s[0..n) into out (at least n bytes).
 * Returns the bytes written (<= n). */
size_t tok_bpe_decode(const struct tok *t, const char *s, size_t n, char *out);

#endif /* LLMD_TOK_IMPL_H */
