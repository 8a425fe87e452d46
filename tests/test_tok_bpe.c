/* GPT-2 byte-level BPE: llama.cpp's test vectors for the gpt-2 vocab,
 * pieces, pre-tokenizer edge cases and error paths. */
#include "tests/lib/tok_util.h"

#define BPE_VOCAB "ggml-vocab-gpt-2.gguf"

Test(tok_bpe, gpt2_vectors_match_llama_cpp) {
    static struct tt_vec v[64];
    char *inp;
    size_t n = tt_vectors(BPE_VOCAB, v, 64, &inp);
    cr_assert_eq(n, 46, "vectors %zu", n);
    struct tt_model m = tt_open("vocab/" BPE_VOCAB);
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        size_t n_ids;
        int32_t *ids = tt_encode(m.t, v[i].s, v[i].len, false, &n_ids);
        if (n_ids != v[i].n_ids || memcmp(ids, v[i].ids, n_ids * sizeof(*ids)) != 0) {
            char got[4096], want[4096];
            cr_log_error("vector %zu '%.*s': got %s want %s", i, (int)v[i].len, v[i].s,
                         tt_fmt_ids(got, sizeof(got), ids, n_ids),
                         tt_fmt_ids(want, sizeof(want), v[i].ids, v[i].n_ids));
            bad++;
        }
        mem_free(ids);
    }
    cr_assert_eq(bad, 0, "%d of %zu vectors differ", bad, n);
    tt_close(&m);
    mem_free(inp);
}

Test(tok_bpe, metadata) {
    struct tt_model m = tt_open("vocab/" BPE_VOCAB);
    cr_assert_eq(tok_kind(m.t), TOK_BPE);
    cr_assert_eq(tok_n_vocab(m.t), 50257, "%u", tok_n_vocab(m.t));
    cr_assert_eq(tok_bos(m.t), 50256, "%d", tok_bos(m.t));
    cr_assert_eq(tok_eos(m.t), 50256, "%d", tok_eos(m.t));
    cr_assert_not(tok_add_bos_default(m.t), "gpt2 adds no BOS unless the file says so");
    size_t n;
    int32_t ids[4];
    cr_assert_eq(tok_encode(m.t, "", 0, false, ids, 4, &n), 0);
    cr_assert_eq(n, 0, "%zu", n);
    tt_close(&m);
}

/* Byte-level BPE is lossless for any valid UTF-8: pieces give the text back. */
Test(tok_bpe, pieces_round_trip) {
    static struct tt_vec v[64];
    char *inp;
    size_t n = tt_vectors(BPE_VOCAB, v, 64, &inp);
    struct tt_model m = tt_open("vocab/" BPE_VOCAB);
    for (size_t i = 0; i < n; i++) {
        size_t n_ids;
        int32_t *ids = tt_encode(m.t, v[i].s, v[i].len, false, &n_ids);
        char buf[4096];
        size_t k = tt_detok(m.t, ids, n_ids, buf, sizeof(buf));
        cr_assert(k == v[i].len && memcmp(buf, v[i].s, k) == 0,
                  "vector %zu: '%.*s' came back as '%.*s'", i, (int)v[i].len, v[i].s, (int)k, buf);
        mem_free(ids);
    }
    size_t k;
    char buf[16];
    cr_assert_eq(tok_piece(m.t, 50256, buf, sizeof(buf), &k), 0);
    cr_assert_eq(k, 0, "<|endoftext|> is a control token: empty piece, got %zu", k);
    cr_assert_eq(tok_piece(m.t, 220, buf, sizeof(buf), &k), 0); /* "Ġ" */
    cr_assert(k == 1 && buf[0] == ' ', "token 220 is a space");
    tt_close(&m);
}

/* Whitespace runs: `\s+(?!\S)` leaves the last space to the next word;
 * invalid UTF-8 becomes U+FFFD (llama.cpp) and streams as such. */
Test(tok_bpe, whitespace_and_invalid_utf8) {
    struct tt_model m = tt_open("vocab/" BPE_VOCAB);
    size_t n;
    int32_t *ids = tt_encode(m.t, "a   b", 5, false, &n);
    char buf[64];
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        size_t p;
        cr_assert_eq(tok_piece(m.t, ids[i], buf + k, sizeof(buf) - k, &p), 0);
        k += p;
    }
    cr_assert(k == 5 && memcmp(buf, "a   b", 5) == 0);
    /* Words "a", "  ", " b": the run of three spaces leaves one to "b";
     * "  " has no token of its own and splits into two "Ġ". */
    int32_t want[] = {64, 220, 220, 275};
    cr_assert_eq(n, 4, "%zu ids", n);
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(ids[i], want[i], "id %zu: %d want %d", i, ids[i], want[i]);
    mem_free(ids);

    size_t n1, n2;
    int32_t *a = tt_encode(m.t, "x\xFFy", 3, false, &n1);
    int32_t *b = tt_encode(m.t, "x\xEF\xBF\xBDy", 5, false, &n2);
    cr_assert(n1 == n2 && memcmp(a, b, n1 * sizeof(*a)) == 0, "0xFF encodes as U+FFFD");
    mem_free(a);
    mem_free(b);
    tt_close(&m);
}

Test(tok_bpe, large_input_finishes) {
    struct tt_model m = tt_open("vocab/" BPE_VOCAB);
    static const char chunk[] =
        "Hello, y'all! How are you \xF0\x9F\x98\x81 ?\xE6\x88\x91\xE6\x83\xB3 "
        "1314151   tabs\t\tand\n\nnewlines. ";
    size_t len = 100 * 1024;
    char *text = mem_alloc(MEM_TEST, len);
    for (size_t i = 0; i < len; i++)
        text[i] = chunk[i % (sizeof(chunk) - 1)];
    size_t n;
    int32_t *ids = tt_encode(m.t, text, len, false, &n);
    cr_assert_gt(n, len / 10, "%zu ids", n);
    mem_free(ids);
    memset(text, ' ', len); /* one whitespace run */
    ids = tt_encode(m.t, text, len, false, &n);
    cr_assert_gt(n, 0);
    mem_free(ids);
    memset(text, 'a', len); /* one long word */
    ids = tt_encode(m.t, text, len, false, &n);
    cr_assert_gt(n, 0);
    mem_free(ids);
    mem_free(text);
    tt_close(&m);
}

static int create_from_pre(struct tt_gguf *b, const char *pre, char *err, size_t errlen) {
    struct gguf *g;
    struct tok *t;
    tt_gguf_finish(b);
    int rc = gguf_open_mem(b->buf, b->len, &g, err, errlen);
    cr_assert_eq(rc, 0, "gguf_open_mem: %d %s", rc, err);
    rc = tok_create_pre(g, pre, &t, err, errlen);
    if (rc == 0) {
        size_t n;
        int32_t ids[8];
        cr_assert_eq(tok_encode(t, "ab ab", 5, false, ids, 8, &n), 0);
        /* merges: "a b" (rank 0), "Ġ ab" (rank 1) */
        cr_assert(n == 2 && ids[0] == 2 && ids[1] == 4, "n %zu ids %d %d", n, ids[0], ids[1]);
        tok_destroy(t);
    }
    gguf_close(g);
    return rc;
}

static int create_from(struct tt_gguf *b, char *err, size_t errlen) {
    return create_from_pre(b, NULL, err, errlen);
}

static void build_bpe(struct tt_gguf *b, const char *pre, bool merges) {
    static const char *const toks[] = {"a", "b", "ab", "\xC4\xA0",
                                       "\xC4\xA0"
                                       "ab"};
    static const char *const m[] = {"a b", "\xC4\xA0 ab"};
    tt_gguf_init(b);
    tt_kv_str(b, "tokenizer.ggml.model", "gpt2");
    if (pre)
        tt_kv_str(b, "tokenizer.ggml.pre", pre);
    tt_kv_strs(b, "tokenizer.ggml.tokens", toks, 5);
    if (merges)
        tt_kv_strs(b, "tokenizer.ggml.merges", m, 2);
}

Test(tok_bpe, create_errors_name_the_key) {
    struct tt_gguf b;
    char err[256];
    build_bpe(&b, "gpt-2", true);
    cr_assert_eq(create_from(&b, err, sizeof(err)), 0, "%s", err);
    build_bpe(&b, "gpt-2", false);
    cr_assert_eq(create_from(&b, err, sizeof(err)), -EINVAL);
    cr_assert(strstr(err, "tokenizer.ggml.merges"), "%s", err);
    build_bpe(&b, "llama-bpe", true);
    cr_assert_eq(create_from(&b, err, sizeof(err)), 0, "%s", err);
    build_bpe(&b, "qwen2", true);
    cr_assert_eq(create_from(&b, err, sizeof(err)), 0, "%s", err);
    /* one llmd does not implement is refused, naming it: never split as another */
    build_bpe(&b, "deepseek-llm", true);
    cr_assert_eq(create_from(&b, err, sizeof(err)), -ENOTSUP);
    cr_assert(strstr(err, "tokenizer.ggml.pre 'deepseek-llm' is not a pre-tokenizer llmd "
                          "implements (gpt-2, llama-bpe, qwen2)"),
              "%s", err);
}

/* The user's override (--tokenizer-pre, llmd_engine_config.tokenizer_pre):
 * an unknown or missing pre splits as the one named; a name llmd does not
 * know, or one for a SentencePiece vocabulary, is refused. */
Test(tok_bpe, pre_override_replaces_an_unknown_pre) {
    struct tt_gguf b;
    char err[256] = "";
    build_bpe(&b, "deepseek-llm", true);
    cr_assert_eq(create_from_pre(&b, "qwen2", err, sizeof(err)), 0, "%s", err);
    build_bpe(&b, NULL, true);
    cr_assert_eq(create_from_pre(&b, "llama-bpe", err, sizeof(err)), 0, "%s", err);
    build_bpe(&b, "deepseek-llm", true);
    cr_assert_eq(create_from_pre(&b, "deepseek-llm", err, sizeof(err)), -EINVAL);
    cr_assert(strstr(err, "unknown pre-tokenizer 'deepseek-llm' (gpt-2, llama-bpe, qwen2)"), "%s",
              err);
    struct tt_gguf spm;
    tt_gguf_init(&spm);
    tt_kv_str(&spm, "tokenizer.ggml.model", "llama");
    static const char *const toks[] = {"<unk>", "a"};
    tt_kv_strs(&spm, "tokenizer.ggml.tokens", toks, 2);
    cr_assert_eq(create_from_pre(&spm, "gpt-2", err, sizeof(err)), -EINVAL);
    cr_assert(strstr(err, "SentencePiece"), "%s", err);
}

Test(tok_bpe, oom_at_every_allocation) {
    char path[1024], err[256];
    tt_path(path, sizeof(path), "vocab/" BPE_VOCAB);
    struct gguf *g;
    if (gguf_open(path, &g, err, sizeof(err)) == -ENOENT)
        cr_skip_test("no %s", path);
    struct tok *t;
    cr_assert_eq(tok_create(g, &t, err, sizeof(err)), 0, "%s", err);
    tok_destroy(t);
    uint64_t base = mem_bytes(MEM_TOK);
    int n_fail = 0;
    for (uint64_t k = 1; k < 400; k++) {
        t = NULL;
        mem_fail_nth(k);
        int rc = tok_create(g, &t, err, sizeof(err));
        if (rc == 0) {
            size_t n;
            int32_t ids[64];
            rc = tok_encode(t, "Hello, y'all! \xF0\x9F\x98\x81  x", 21, false, ids, 64, &n);
            cr_assert(rc == 0 || rc == -ENOMEM, "encode rc %d at k=%lu", rc, (unsigned long)k);
            tok_destroy(t);
            if (rc == 0) {
                mem_fail_nth(0);
                break;
            }
        } else {
            cr_assert_eq(rc, -ENOMEM, "create rc %d at k=%lu: %s", rc, (unsigned long)k, err);
        }
        mem_fail_nth(0);
        n_fail++;
        cr_assert_eq(mem_bytes(MEM_TOK), base, "leak at k=%lu", (unsigned long)k);
    }
    cr_assert_gt(n_fail, 5, "%d fault points", n_fail);
    gguf_close(g);
}
