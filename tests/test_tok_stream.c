/* Streaming detokenizer: every chunk is valid UTF-8, the chunks add up to
 * the text, and bad byte sequences become U+FFFD. */
#include "tests/lib/tok_util.h"

#define FFFD "\xEF\xBF\xBD"

/* Feed ids one by one; check each chunk; return the concatenation length. */
static size_t stream_all(const struct tok *t, const int32_t *ids, size_t n, char *buf, size_t cap) {
    struct tok_stream s;
    tok_stream_init(&s);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        size_t m;
        int rc = tok_stream_push(t, &s, ids[i], buf + k, cap - k, &m);
        cr_assert_eq(rc, 0, "push id %d: %d", ids[i], rc);
        cr_assert(tt_utf8_valid(buf + k, m), "chunk %zu (id %d) is not valid UTF-8", i, ids[i]);
        k += m;
    }
    size_t m;
    cr_assert_eq(tok_stream_flush(&s, buf + k, cap - k, &m), 0);
    cr_assert(tt_utf8_valid(buf + k, m));
    return k + m;
}

static void check_text(const struct tok *t, const char *text) {
    size_t n, len = strlen(text);
    int32_t *ids = tt_encode(t, text, len, true, &n);
    char buf[8192];
    size_t k = stream_all(t, ids, n, buf, sizeof(buf));
    cr_assert(k == len + 1 && buf[0] == ' ' && memcmp(buf + 1, text, len) == 0,
              "'%s' streamed as '%.*s'", text, (int)k, buf);
    mem_free(ids);
}

Test(tok_stream, multibyte_split_across_byte_tokens) {
    struct tt_model m = tt_open("stories260K-f32.gguf");
    check_text(m.t, "Zo\xC3\xAB");                                       /* Zoë */
    check_text(m.t, "a \xF0\x9F\x98\x80 b \xF0\x9F\xA6\x99!");           /* emoji */
    check_text(m.t, "\xE4\xBD\xA0\xE5\xA5\xBD\xE4\xB8\x96\xE7\x95\x8C"); /* CJK */
    check_text(m.t, "Once upon a time, Zo\xC3\xAB said \xE2\x80\x9Chi\xE2\x80\x9D.");
    tt_close(&m);
}

Test(tok_stream, llama_vectors_stream_back) {
    static struct tt_vec v[64];
    char *inp;
    size_t n = tt_vectors("ggml-vocab-llama-spm.gguf", v, 64, &inp);
    struct tt_model m = tt_open("vocab/ggml-vocab-llama-spm.gguf");
    for (size_t i = 0; i < n; i++) {
        if (v[i].len == 0 || memmem(v[i].s, v[i].len, "\xE2\x96\x81", 3))
            continue;
        char text[2048];
        memcpy(text, v[i].s, v[i].len);
        text[v[i].len] = 0;
        check_text(m.t, text);
    }
    tt_close(&m);
    mem_free(inp);
}

/* In stories260K, byte b is token b + 3. */
static size_t feed_bytes(const struct tok *t, struct tok_stream *s, const char *bytes, char *out,
                         size_t cap) {
    size_t k = 0;
    for (const char *p = bytes; *p; p++) {
        size_t m;
        cr_assert_eq(tok_stream_push(t, s, (uint8_t)*p + 3, out + k, cap - k, &m), 0);
        cr_assert(tt_utf8_valid(out + k, m), "chunk after byte 0x%02x", (uint8_t)*p);
        k += m;
    }
    return k;
}

Test(tok_stream, invalid_sequences_become_replacement) {
    struct tt_model m = tt_open("stories260K-f32.gguf");
    struct {
        const char *in, *want_push, *want_flush;
    } cases[] = {
        {"\xC3"
         "a",
         FFFD "a", ""},
        {"\xFF"
         "b",
         FFFD "b", ""},
        {"\xE2\x82", "", FFFD}, /* incomplete at the end: one U+FFFD */
        {"\xF0\x9F\x98\x80", "\xF0\x9F\x98\x80", ""},
        {"\xED\xA0\x80", FFFD FFFD FFFD, ""}, /* surrogate: E D is invalid after ED */
        {"\xC0\xAF", FFFD FFFD, ""},          /* overlong */
        {"\xE2\x82"
         "x",
         FFFD "x", ""}, /* truncated then ASCII */
        {"\x80\x80", FFFD FFFD, ""},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct tok_stream s;
        tok_stream_init(&s);
        char out[64];
        size_t k = feed_bytes(m.t, &s, cases[i].in, out, sizeof(out));
        cr_assert(k == strlen(cases[i].want_push) && memcmp(out, cases[i].want_push, k) == 0,
                  "case %zu: pushed %zu bytes", i, k);
        size_t f;
        cr_assert_eq(tok_stream_flush(&s, out, sizeof(out), &f), 0);
        cr_assert(f == strlen(cases[i].want_flush) && memcmp(out, cases[i].want_flush, f) == 0,
                  "case %zu: flushed %zu bytes", i, f);
    }
    tt_close(&m);
}

Test(tok_stream, enospc_leaves_state_unchanged) {
    struct tt_model m = tt_open("stories260K-f32.gguf");
    struct tok_stream s;
    tok_stream_init(&s);
    char out[16];
    size_t n;
    cr_assert_eq(tok_stream_push(m.t, &s, 0xC3 + 3, out, 0, &n), 0); /* held back */
    cr_assert_eq(n, 0, "%zu", n);
    cr_assert_eq(tok_stream_push(m.t, &s, 0xAB + 3, out, 1, &n), -ENOSPC);
    cr_assert_eq(n, 2, "needs %zu", n);
    cr_assert_eq(tok_stream_push(m.t, &s, 0xAB + 3, out, sizeof(out), &n), 0);
    cr_assert(n == 2 && memcmp(out, "\xC3\xAB", 2) == 0, "retry gives the whole char");
    cr_assert_eq(tok_stream_push(m.t, &s, 0xE2 + 3, out, sizeof(out), &n), 0);
    cr_assert_eq(tok_stream_flush(&s, out, 2, &n), -ENOSPC);
    cr_assert_eq(n, 3, "%zu", n);
    cr_assert_eq(tok_stream_flush(&s, out, 3, &n), 0);
    cr_assert(n == 3 && memcmp(out, FFFD, 3) == 0);
    cr_assert_eq(tok_stream_flush(&s, out, 3, &n), 0);
    cr_assert_eq(n, 0, "flushed twice: %zu", n);
    cr_assert_eq(tok_stream_push(m.t, &s, 512, out, sizeof(out), &n), -EINVAL);
    tt_close(&m);
}

/* GPT-2 splits characters across byte-level tokens too (emoji, CJK). */
Test(tok_stream, gpt2_vectors_stream_back) {
    static struct tt_vec v[64];
    char *inp;
    size_t n = tt_vectors("ggml-vocab-gpt-2.gguf", v, 64, &inp);
    struct tt_model m = tt_open("vocab/ggml-vocab-gpt-2.gguf");
    for (size_t i = 0; i < n; i++) {
        size_t n_ids;
        int32_t *ids = tt_encode(m.t, v[i].s, v[i].len, false, &n_ids);
        char buf[4096];
        size_t k = stream_all(m.t, ids, n_ids, buf, sizeof(buf));
        cr_assert(k == v[i].len && memcmp(buf, v[i].s, k) == 0,
                  "vector %zu: '%.*s' came back '%.*s'", i, (int)v[i].len, v[i].s, (int)k, buf);
        mem_free(ids);
    }
    tt_close(&m);
    mem_free(inp);
}
