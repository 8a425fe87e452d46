/* SentencePiece tokenizer: llama.cpp's test vectors for the llama-spm vocab,
 * the stories260K prompts of reference.jsonl, pieces, and error paths. */
#include "tests/lib/tok_util.h"

#include <errno.h>

#define SPM_VOCAB "ggml-vocab-llama-spm.gguf"

Test(tok_spm, llama_vectors_match_llama_cpp) {
    static struct tt_vec v[64];
    char *inp;
    size_t n = tt_vectors(SPM_VOCAB, v, 64, &inp);
    cr_assert_eq(n, 46, "vectors %zu", n);
    struct tt_model m = tt_open("vocab/" SPM_VOCAB);
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

/* Decode one JSON string starting after its opening quote into out (no NUL
 * bytes expected); returns the length. Handles the escapes JSON allows. */
static size_t json_str(const char *p, char *out) {
    size_t n = 0;
    while (*p != '"') {
        if (*p != '\\') {
            out[n++] = *p++;
            continue;
        }
        p++;
        char c = *p++;
        switch (c) {
        case 'n':
            out[n++] = '\n';
            break;
        case 't':
            out[n++] = '\t';
            break;
        case 'r':
            out[n++] = '\r';
            break;
        case 'b':
            out[n++] = '\b';
            break;
        case 'f':
            out[n++] = '\f';
            break;
        case 'u': {
            unsigned cp = (unsigned)strtoul((char[5]){p[0], p[1], p[2], p[3], 0}, NULL, 16);
            p += 4;
            if (cp >= 0xD800 && cp < 0xDC00 && p[0] == '\\' && p[1] == 'u') {
                unsigned lo = (unsigned)strtoul((char[5]){p[2], p[3], p[4], p[5], 0}, NULL, 16);
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                p += 6;
            }
            if (cp < 0x80) {
                out[n++] = (char)cp;
            } else if (cp < 0x800) {
                out[n++] = (char)(0xC0 | cp >> 6);
                out[n++] = (char)(0x80 | (cp & 0x3F));
            } else if (cp < 0x10000) {
                out[n++] = (char)(0xE0 | cp >> 12);
                out[n++] = (char)(0x80 | ((cp >> 6) & 0x3F));
                out[n++] = (char)(0x80 | (cp & 0x3F));
            } else {
                out[n++] = (char)(0xF0 | cp >> 18);
                out[n++] = (char)(0x80 | ((cp >> 12) & 0x3F));
                out[n++] = (char)(0x80 | ((cp >> 6) & 0x3F));
                out[n++] = (char)(0x80 | (cp & 0x3F));
            }
            break;
        }
        default:
            out[n++] = c;
            break; /* \" \\ \/ */
        }
    }
    return n;
}

Test(tok_spm, stories_prompts_match_reference) {
    size_t len;
    char *ref = tt_read("reference.jsonl", &len);
    struct tt_model m = tt_open("stories260K-f32.gguf");
    cr_assert(tok_add_bos_default(m.t));
    size_t n_checked = 0;
    for (char *line = ref, *eol; *line; line = eol + 1) {
        eol = strchr(line, '\n');
        cr_assert_not_null(eol);
        *eol = 0;
        char *p = strstr(line, "\"prompt\": \"");
        char *q = strstr(line, "\"prompt_ids\": [");
        if (!p || !q)
            continue;
        char prompt[4096];
        size_t n_prompt = json_str(p + strlen("\"prompt\": \""), prompt);
        int32_t want[512];
        size_t n_want = 0;
        for (char *s = q + strlen("\"prompt_ids\": ["), *end; *s != ']'; s = end) {
            want[n_want++] = (int32_t)strtol(s, &end, 10);
            while (*end == ',' || *end == ' ')
                end++;
        }
        size_t n_ids;
        int32_t *ids = tt_encode(m.t, prompt, n_prompt, tok_add_bos_default(m.t), &n_ids);
        char got[8192], exp[8192];
        cr_expect(n_ids == n_want && memcmp(ids, want, n_ids * sizeof(*ids)) == 0,
                  "prompt '%.*s': got %s want %s", (int)n_prompt, prompt,
                  tt_fmt_ids(got, sizeof(got), ids, n_ids),
                  tt_fmt_ids(exp, sizeof(exp), want, n_want));
        mem_free(ids);
        n_checked++;
    }
    cr_assert_geq(n_checked, 7, "checked %zu prompts", n_checked);
    tt_close(&m);
    mem_free(ref);
}

Test(tok_spm, once_upon_a_time_and_byte_fallback) {
    struct tt_model m = tt_open("stories260K-f32.gguf");
    size_t n;
    int32_t *ids = tt_encode(m.t, "Once upon a time", 16, true, &n);
    int32_t want[] = {1, 403, 407, 261, 378};
    cr_assert_eq(n, 5, "n %zu", n);
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(ids[i], want[i], "id %zu: %d want %d", i, ids[i], want[i]);
    mem_free(ids);
    ids = tt_encode(m.t, "\xC3\xAB", 2, false, &n); /* "ë": no token, two byte tokens */
    cr_assert_eq(n, 3, "n %zu", n);
    cr_assert_eq(ids[1], 198, "%d", ids[1]);
    cr_assert_eq(ids[2], 174, "%d", ids[2]);
    mem_free(ids);
    tt_close(&m);
}

Test(tok_spm, metadata) {
    struct tt_model m = tt_open("vocab/" SPM_VOCAB);
    cr_assert_eq(tok_kind(m.t), TOK_SPM);
    cr_assert_eq(tok_n_vocab(m.t), 32000, "%u", tok_n_vocab(m.t));
    cr_assert_eq(tok_bos(m.t), 1, "%d", tok_bos(m.t));
    cr_assert_eq(tok_eos(m.t), 2, "%d", tok_eos(m.t));
    cr_assert(tok_add_bos_default(m.t));
    size_t n;
    int32_t ids[4];
    cr_assert_eq(tok_encode(m.t, "", 0, false, ids, 4, &n), 0);
    cr_assert_eq(n, 0, "empty text gives no ids, got %zu", n);
    cr_assert_eq(tok_encode(m.t, "", 0, true, ids, 4, &n), 0);
    cr_assert_eq(n, 1, "%zu", n);
    cr_assert_eq(ids[0], 1, "%d", ids[0]);
    tt_close(&m);
}

/* Pieces undo encoding: the text comes back with the dummy-prefix space. */
Test(tok_spm, pieces_round_trip) {
    static struct tt_vec v[64];
    char *inp;
    size_t n = tt_vectors(SPM_VOCAB, v, 64, &inp);
    struct tt_model m = tt_open("vocab/" SPM_VOCAB);
    for (size_t i = 0; i < n; i++) {
        if (v[i].len == 0 || memmem(v[i].s, v[i].len, "\xE2\x96\x81", 3))
            continue; /* a literal U+2581 decodes as ' ' */
        size_t n_ids;
        int32_t *ids = tt_encode(m.t, v[i].s, v[i].len, true, &n_ids);
        char buf[4096];
        size_t k = tt_detok(m.t, ids, n_ids, buf, sizeof(buf));
        cr_assert(k == v[i].len + 1 && buf[0] == ' ' && memcmp(buf + 1, v[i].s, v[i].len) == 0,
                  "vector %zu: '%.*s' came back as '%.*s'", i, (int)v[i].len, v[i].s, (int)k, buf);
        mem_free(ids);
    }
    size_t k;
    char buf[16];
    cr_assert_eq(tok_piece(m.t, 1, buf, sizeof(buf), &k), 0);
    cr_assert_eq(k, 0, "BOS is a control token: empty piece, got %zu", k);
    cr_assert_eq(tok_piece(m.t, 3 + 0x41, buf, sizeof(buf), &k), 0);
    cr_assert(k == 1 && buf[0] == 'A', "<0x41> piece");
    cr_assert_eq(tok_piece(m.t, 32000, buf, sizeof(buf), &k), -EINVAL);
    cr_assert_eq(tok_piece(m.t, -1, buf, sizeof(buf), &k), -EINVAL);
    tt_close(&m);
    mem_free(inp);
}

Test(tok_spm, enospc_reports_needed) {
    struct tt_model m = tt_open("stories260K-f32.gguf");
    int32_t ids[3] = {-7, -7, -7};
    size_t n = 0;
    cr_assert_eq(tok_encode(m.t, "Once upon a time", 16, true, ids, 2, &n), -ENOSPC);
    cr_assert_eq(n, 5, "needed %zu", n);
    cr_assert_eq(ids[0], 1, "prefix is filled: %d", ids[0]);
    cr_assert_eq(ids[1], 403, "%d", ids[1]);
    cr_assert_eq(ids[2], -7, "nothing past cap: %d", ids[2]);
    cr_assert_eq(tok_encode(m.t, "Once upon a time", 16, true, NULL, 0, &n), -ENOSPC);
    cr_assert_eq(n, 5, "needed %zu", n);
    char buf[2];
    cr_assert_eq(tok_piece(m.t, 403, buf, 1, &n), -ENOSPC);
    cr_assert_eq(n, 5, "' Once' is 5 bytes, got %zu", n);
    tt_close(&m);
}

/* 100 KB of text must not take quadratic time (no timing assertion). */
Test(tok_spm, large_input_finishes) {
    struct tt_model m = tt_open("vocab/" SPM_VOCAB);
    static const char chunk[] = "Once upon a time, in a land far away, lived 42 happy llamas. ";
    size_t len = 100 * 1024;
    char *text = mem_alloc(MEM_TEST, len);
    for (size_t i = 0; i < len; i++)
        text[i] = chunk[i % (sizeof(chunk) - 1)];
    size_t n;
    int32_t *ids = tt_encode(m.t, text, len, true, &n);
    cr_assert_gt(n, len / 10, "%zu ids", n);
    mem_free(ids);
    memset(text, 'a', len); /* one long run: merges pile up in one place */
    ids = tt_encode(m.t, text, len, false, &n);
    cr_assert_gt(n, 0);
    mem_free(ids);
    mem_free(text);
    tt_close(&m);
}

static void build_spm(struct tt_gguf *b, const char *model) {
    static const char *const toks[] = {"<unk>", "<s>", "</s>",
                                       "\xE2\x96\x81"
                                       "a",
                                       "a"};
    static const float scores[] = {0, 0, 0, -1, -2};
    static const int32_t types[] = {2, 3, 3, 1, 1};
    tt_gguf_init(b);
    if (model)
        tt_kv_str(b, "tokenizer.ggml.model", model);
    tt_kv_strs(b, "tokenizer.ggml.tokens", toks, 5);
    tt_kv_arr(b, "tokenizer.ggml.scores", GGUF_VT_FLOAT32, scores, 5, 4);
    tt_kv_arr(b, "tokenizer.ggml.token_type", GGUF_VT_INT32, types, 5, 4);
}

static int create_from(struct tt_gguf *b, struct tok **t, char *err, size_t errlen) {
    struct gguf *g;
    tt_gguf_finish(b);
    int rc = gguf_open_mem(b->buf, b->len, &g, err, errlen);
    cr_assert_eq(rc, 0, "gguf_open_mem: %d %s", rc, err);
    rc = tok_create(g, t, err, errlen);
    if (rc == 0) {
        size_t n;
        int32_t ids[8];
        cr_assert_eq(tok_encode(*t, "a a", 3, true, ids, 8, &n), 0);
        cr_assert(n == 3 && ids[0] == 1 && ids[1] == 3 && ids[2] == 3, "n %zu", n);
        tok_destroy(*t);
    }
    gguf_close(g);
    return rc;
}

Test(tok_spm, create_errors_name_the_key) {
    struct tt_gguf b;
    struct tok *t;
    char err[256];

    build_spm(&b, "llama");
    cr_assert_eq(create_from(&b, &t, err, sizeof(err)), 0, "%s", err);

    build_spm(&b, NULL);
    cr_assert_eq(create_from(&b, &t, err, sizeof(err)), -EINVAL);
    cr_assert(strstr(err, "tokenizer.ggml.model"), "%s", err);

    build_spm(&b, "bert");
    cr_assert_eq(create_from(&b, &t, err, sizeof(err)), -ENOTSUP);
    cr_assert(strstr(err, "bert"), "%s", err);

    build_spm(&b, "llama");
    tt_kv_u32(&b, "tokenizer.ggml.bos_token_id", 5);
    cr_assert_eq(create_from(&b, &t, err, sizeof(err)), -EINVAL);
    cr_assert(strstr(err, "bos_token_id"), "%s", err);

    static const float short_scores[] = {0};
    tt_gguf_init(&b);
    static const char *const toks[] = {"<unk>", "<s>"};
    tt_kv_str(&b, "tokenizer.ggml.model", "llama");
    tt_kv_strs(&b, "tokenizer.ggml.tokens", toks, 2);
    tt_kv_arr(&b, "tokenizer.ggml.scores", GGUF_VT_FLOAT32, short_scores, 1, 4);
    cr_assert_eq(create_from(&b, &t, err, sizeof(err)), -EINVAL);
    cr_assert(strstr(err, "tokenizer.ggml.scores"), "%s", err);

    tt_gguf_init(&b);
    tt_kv_str(&b, "tokenizer.ggml.model", "llama");
    cr_assert_eq(create_from(&b, &t, err, sizeof(err)), -EINVAL);
    cr_assert(strstr(err, "tokenizer.ggml.tokens"), "%s", err);
}

/* A byte token (type 6) whose text is not "<0xNN>" with two hex digits is
 * refused, naming the token's index and the offset of its string in the
 * file; either case of hex digit is fine, and a good vocabulary after the
 * bad ones still loads. They used to load and decode to nothing. */
Test(tok_spm, byte_token_text_must_be_two_hex_digits) {
    static const char *const bad[] = {"<0xZZ>", "<0x4>", "<0x411>", "<0x41", "0x41>", "A"};
    static const char *const good[] = {"<0x41>", "<0xab>", "<0xFf>"};
    static const float scores[] = {0, 0, 0, -1, -2, 0};
    static const int32_t types[] = {2, 3, 3, 1, 1, 6};
    struct tt_gguf b;
    struct tok *t;
    char err[256];
    for (int pass = 0; pass < 2; pass++) {
        size_t n = pass ? sizeof(good) / sizeof(good[0]) : sizeof(bad) / sizeof(bad[0]);
        for (size_t i = 0; i < n; i++) {
            const char *byte = pass ? good[i] : bad[i];
            const char *toks[] = {"<unk>",
                                  "<s>",
                                  "</s>",
                                  "\xE2\x96\x81"
                                  "a",
                                  "a",
                                  byte};
            tt_gguf_init(&b);
            tt_kv_str(&b, "tokenizer.ggml.model", "llama");
            tt_kv_strs(&b, "tokenizer.ggml.tokens", toks, 6);
            tt_kv_arr(&b, "tokenizer.ggml.scores", GGUF_VT_FLOAT32, scores, 6, 4);
            tt_kv_arr(&b, "tokenizer.ggml.token_type", GGUF_VT_INT32, types, 6, 4);
            int rc = create_from(&b, &t, err, sizeof(err));
            if (pass) {
                cr_assert_eq(rc, 0, "'%s': %s", byte, err);
                continue;
            }
            /* the string of token 5: its u64 length, 8 bytes before the text */
            const uint8_t *at = memmem(b.buf, b.len, byte, strlen(byte));
            while (at && memcmp(at - 8, &(uint64_t){strlen(byte)}, 8) != 0)
                at = memmem(at + 1, b.len - (size_t)(at + 1 - b.buf), byte, strlen(byte));
            cr_assert_not_null(at, "'%s' not in the file", byte);
            char want[160];
            snprintf(want, sizeof(want),
                     "tokenizer.ggml.tokens[5] at offset %zu: byte token '%s' is not <0xNN> with "
                     "two hex digits",
                     (size_t)(at - 8 - b.buf), byte);
            cr_assert_eq(rc, -EINVAL, "'%s': rc %d", byte, rc);
            cr_assert_str_eq(err, want);
        }
    }
}

/* Every allocation of tok_create and tok_encode can fail cleanly. */
Test(tok_spm, oom_at_every_allocation) {
    char path[1024], err[256];
    tt_path(path, sizeof(path), "stories260K-f32.gguf");
    struct gguf *g;
    if (gguf_open(path, &g, err, sizeof(err)) == -ENOENT)
        cr_skip_test("no %s", path);
    uint64_t base = mem_bytes(MEM_TOK);
    int n_fail = 0;
    for (uint64_t k = 1; k < 200; k++) {
        struct tok *t = NULL;
        mem_fail_nth(k);
        int rc = tok_create(g, &t, err, sizeof(err));
        if (rc == 0) {
            size_t n;
            int32_t ids[16];
            rc = tok_encode(t, "Once upon a time", 16, true, ids, 16, &n);
            cr_assert(rc == 0 || rc == -ENOMEM, "encode rc %d at k=%lu", rc, (unsigned long)k);
            tok_destroy(t);
            if (rc == 0) {
                mem_fail_nth(0);
                break;
            }
        } else {
            cr_assert_eq(rc, -ENOMEM, "create rc %d at k=%lu", rc, (unsigned long)k);
        }
        mem_fail_nth(0);
        n_fail++;
        cr_assert_eq(mem_bytes(MEM_TOK), base, "leak at k=%lu", (unsigned long)k);
    }
    cr_assert_gt(n_fail, 3, "%d fault points", n_fail);
    cr_assert_eq(mem_bytes(MEM_TOK), base);
    gguf_close(g);
}
