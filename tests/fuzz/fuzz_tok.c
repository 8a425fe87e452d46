/* fuzz_tok.c - libFuzzer target for both tokenizers and the streaming
 * detokenizer (built by tests/fuzz/run.sh).
 *
 * The SPM (llama) and GPT-2 vocabularies from ../shared/models/vocab (or
 * $LLMD_MODELS/vocab) are loaded once. Each input is used three ways:
 *  1. as text: tok_encode() with a small cap (the -ENOSPC path must count
 *     the same ids and store a prefix of them) and with room for all;
 *  2. the encoded ids go through tok_piece() (also with a too-small cap) and
 *     through the stream, whose output must be valid UTF-8 and equal a
 *     one-shot maximal-subpart decode of the concatenated pieces;
 *  3. as raw little-endian int32 ids, many out of range, pushed through
 *     tok_piece() and the stream: out of range must be -EINVAL and leave the
 *     stream as it was.
 * Once at start, every id of each vocabulary goes through tok_piece() and
 * one stream (all in order, each with a 0-byte cap first), so every piece
 * is checked whatever inputs the fuzzer happens to try.
 * A broken property calls abort(), which libFuzzer reports as a crash.
 * Without the vocabularies every input is a no-op.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model/gguf.h"
#include "engine/model/tok.h"
#include "mem.h"

#define CHECK(x)                                                                                   \
    do {                                                                                           \
        if (!(x)) {                                                                                \
            fprintf(stderr, "fuzz_tok: %s:%d: %s\n", __FILE__, __LINE__, #x);                      \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

struct vocab {
    struct gguf *g;
    struct tok *t;
};

static struct vocab vocabs[2];
static int n_vocabs;

static void vocab_load(const char *dir, const char *file) {
    char path[1024], err[256] = "";
    snprintf(path, sizeof(path), "%s/vocab/%s", dir, file);
    struct vocab *v = &vocabs[n_vocabs];
    if (gguf_open(path, &v->g, err, sizeof(err)) != 0) {
        fprintf(stderr, "fuzz_tok: %s not loaded (%s)\n", path, err);
        return;
    }
    int rc = tok_create(v->g, &v->t, err, sizeof(err));
    if (rc) {
        fprintf(stderr, "fuzz_tok: tok_create %s: %d %s\n", path, rc, err);
        abort(); /* the reference vocabularies must load */
    }
    n_vocabs++;
}

/* At exit, so LeakSanitizer sees the vocabularies freed. */
static void vocabs_free(void) {
    for (int i = 0; i < n_vocabs; i++) {
        tok_destroy(vocabs[i].t);
        gguf_close(vocabs[i].g);
    }
    n_vocabs = 0;
}

/* Length of the well-formed UTF-8 sequence at s[0..n) (Unicode Table 3-7),
 * or 0 if there is none. */
static size_t utf8_valid_len(const uint8_t *s, size_t n) {
    uint8_t c = s[0], lo = 0x80, hi = 0xBF;
    size_t need;
    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF)
        need = 2;
    else if (c >= 0xE0 && c <= 0xEF)
        need = 3, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
    else if (c >= 0xF0 && c <= 0xF4)
        need = 4, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
    else
        return 0;
    if (need > n)
        return 0;
    for (size_t j = 1; j < need; j++)
        if (s[j] < (j == 1 ? lo : 0x80) || s[j] > (j == 1 ? hi : 0xBF))
            return 0;
    return need;
}

static void check_utf8(const char *p, size_t n) {
    const uint8_t *s = (const uint8_t *)p;
    for (size_t i = 0; i < n;) {
        size_t k = utf8_valid_len(s + i, n - i);
        CHECK(k > 0);
        i += k;
    }
}

/* Reference: one-shot decode of s[0..n) replacing each maximal subpart of
 * an ill-formed sequence (its lead byte and the continuation bytes that fit
 * it, at least one byte) by U+FFFD. out has room for 3 * n bytes. */
static size_t ref_decode(const uint8_t *s, size_t n, char *out) {
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        size_t v = utf8_valid_len(s + i, n - i);
        if (v) {
            memcpy(out + k, s + i, v);
            k += v;
            i += v;
            continue;
        }
        uint8_t c = s[i], lo = 0x80, hi = 0xBF;
        size_t need = 0, m = 1;
        if (c >= 0xC2 && c <= 0xDF)
            need = 2;
        else if (c >= 0xE0 && c <= 0xEF)
            need = 3, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
        else if (c >= 0xF0 && c <= 0xF4)
            need = 4, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
        while (m < need && i + m < n && s[i + m] >= (m == 1 ? lo : 0x80) &&
               s[i + m] <= (m == 1 ? hi : 0xBF))
            m++;
        memcpy(out + k, "\xEF\xBF\xBD", 3);
        k += 3;
        i += m;
    }
    return k;
}

struct stream_check {
    struct tok_stream s;
    char *out; /* everything emitted so far */
    size_t n_out, cap_out;
    uint8_t *raw; /* every piece byte pushed so far */
    size_t n_raw, cap_raw;
};

static void append(char **buf, size_t *n, size_t *cap, const void *p, size_t len) {
    if (len == 0)
        return;
    if (*n + len > *cap) {
        size_t c = (*n + len) * 2 + 64;
        char *b = mem_realloc(*buf, c);
        CHECK(b);
        *buf = b;
        *cap = c;
    }
    memcpy(*buf + *n, p, len);
    *n += len;
}

/* Push id with a cap of small bytes first, then with what it asked for. */
static void stream_push(const struct tok *t, struct stream_check *sc, int32_t id, size_t small) {
    char buf[4096];
    size_t n = 0;
    struct tok_stream before = sc->s;
    bool in_range = id >= 0 && (uint32_t)id < tok_n_vocab(t);
    int rc = tok_stream_push(t, &sc->s, id, buf, small, &n);
    if (!in_range) {
        CHECK(rc == -EINVAL);
        CHECK(memcmp(&before, &sc->s, sizeof(before)) == 0);
        return;
    }
    char piece[4096];
    size_t np = 0;
    CHECK(tok_piece(t, id, piece, sizeof(piece), &np) == 0);
    CHECK(n <= 3 * (np + 3)); /* the documented bound */
    if (rc == -ENOSPC) {
        CHECK(n > small);
        CHECK(memcmp(&before, &sc->s, sizeof(before)) == 0);
        CHECK(n <= sizeof(buf));
        rc = tok_stream_push(t, &sc->s, id, buf, n, &n);
    }
    CHECK(rc == 0);
    CHECK(sc->s.n_pending <= 3);
    check_utf8(buf, n);
    append(&sc->out, &sc->n_out, &sc->cap_out, buf, n);
    append((char **)&sc->raw, &sc->n_raw, &sc->cap_raw, piece, np);
}

static void stream_finish(struct stream_check *sc) {
    char buf[8];
    size_t n = 0;
    bool pending = sc->s.n_pending != 0;
    int rc = tok_stream_flush(&sc->s, buf, 2, &n);
    CHECK(pending ? rc == -ENOSPC && n == 3 : rc == 0 && n == 0);
    CHECK(tok_stream_flush(&sc->s, buf, sizeof(buf), &n) == 0);
    CHECK(sc->s.n_pending == 0);
    check_utf8(buf, n);
    append(&sc->out, &sc->n_out, &sc->cap_out, buf, n);
    char *ref = mem_alloc(MEM_TEST, 3 * sc->n_raw + 1);
    CHECK(ref);
    size_t n_ref = ref_decode(sc->raw, sc->n_raw, ref);
    CHECK(n_ref == sc->n_out && (n_ref == 0 || memcmp(ref, sc->out, n_ref) == 0));
    mem_free(ref);
    mem_free(sc->out);
    mem_free(sc->raw);
}

static void check_ids(const struct tok *t, const int32_t *ids, size_t n, size_t small) {
    struct stream_check sc = {0};
    tok_stream_init(&sc.s);
    for (size_t i = 0; i < n; i++) {
        char piece[8];
        size_t np = 0;
        int rc = tok_piece(t, ids[i], piece, sizeof(piece), &np);
        if (ids[i] < 0 || (uint32_t)ids[i] >= tok_n_vocab(t))
            CHECK(rc == -EINVAL);
        else
            CHECK(rc == (np > sizeof(piece) ? -ENOSPC : 0));
        stream_push(t, &sc, ids[i], small);
    }
    stream_finish(&sc);
}

static void fuzz_one(const struct tok *t, const uint8_t *data, size_t size) {
    size_t small = data[0] % 8; /* caps for the -ENOSPC paths */
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    bool bos = data[0] & 0x80;

    int32_t few[8];
    size_t n_few = 0, n = 0;
    int rc = tok_encode(t, text, len, bos, few, small, &n_few);
    CHECK(rc == 0 || rc == -ENOSPC);
    CHECK(rc == (n_few > small ? -ENOSPC : 0));

    size_t cap = n_few ? n_few : 1;
    int32_t *ids = mem_alloc(MEM_TEST, cap * sizeof(*ids));
    CHECK(ids);
    rc = tok_encode(t, text, len, bos, ids, cap, &n);
    CHECK(rc == 0 && n == n_few);
    CHECK(memcmp(few, ids, (n < small ? n : small) * sizeof(*ids)) == 0);
    for (size_t i = 0; i < n; i++)
        CHECK(ids[i] >= 0 && (uint32_t)ids[i] < tok_n_vocab(t));
    check_ids(t, ids, n, small);
    mem_free(ids);

    /* The raw bytes as ids: a non-negative value is folded to just past the
     * vocabulary, so in-range and out-of-range ids both occur; negative
     * values (-1, INT32_MIN, ...) stay as they are. */
    size_t n_raw = len / 4;
    int32_t *raw = mem_alloc(MEM_TEST, (n_raw + 1) * sizeof(*raw));
    CHECK(raw);
    for (size_t i = 0; i < n_raw; i++) {
        uint32_t u;
        memcpy(&u, text + 4 * i, 4);
        raw[i] = (int32_t)u < 0 ? (int32_t)u : (int32_t)(u % (tok_n_vocab(t) + 4));
    }
    check_ids(t, raw, n_raw, small);
    mem_free(raw);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    const char *dir = getenv("LLMD_MODELS");
    dir = dir ? dir : "../shared/models";
    vocab_load(dir, "ggml-vocab-llama-spm.gguf");
    vocab_load(dir, "ggml-vocab-gpt-2.gguf");
    atexit(vocabs_free);
    for (int i = 0; i < n_vocabs; i++) {
        uint32_t n = tok_n_vocab(vocabs[i].t);
        int32_t *all = mem_alloc(MEM_TEST, (size_t)n * sizeof(*all));
        CHECK(all);
        for (uint32_t id = 0; id < n; id++)
            all[id] = (int32_t)id;
        check_ids(vocabs[i].t, all, n, 0);
        mem_free(all);
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0)
        return 0;
    for (int i = 0; i < n_vocabs; i++)
        fuzz_one(vocabs[i].t, data, size);
    return 0;
}
