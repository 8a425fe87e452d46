/* tok_util.h - helpers shared by the tests/test_tok_*.c programs.
 *
 * Header-only (static functions) because each tests/test_*.c is its own
 * program linked only with libllmd.a. Test data comes from ../shared/models
 * (override with LLMD_MODELS); a test whose file is absent is skipped.
 */
#ifndef LLMD_TOK_TESTLIB_H
#define LLMD_TOK_TESTLIB_H

#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model/gguf.h"
#include "engine/model/tok.h"
#include "mem.h"

static inline const char *tt_models_dir(void) {
    const char *d = getenv("LLMD_MODELS");
    return d ? d : "../shared/models";
}

static inline void tt_path(char *buf, size_t cap, const char *rel) {
    snprintf(buf, cap, "%s/%s", tt_models_dir(), rel);
}

/* Whole file into a NUL-terminated mem_alloc'd buffer; skips the test when
 * the file is absent. */
static inline char *tt_read(const char *rel, size_t *len) {
    char path[1024];
    tt_path(path, sizeof(path), rel);
    FILE *f = fopen(path, "rb");
    if (!f)
        cr_skip_test("test data %s not found (set LLMD_MODELS)", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = mem_alloc(MEM_TEST, (size_t)n + 1);
    cr_assert_not_null(buf);
    cr_assert_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    buf[n] = 0;
    *len = (size_t)n;
    return buf;
}

struct tt_model {
    struct gguf *g;
    struct tok *t;
};

static inline struct tt_model tt_open(const char *rel) {
    char path[1024], err[256] = "";
    tt_path(path, sizeof(path), rel);
    struct tt_model m = {0};
    int rc = gguf_open(path, &m.g, err, sizeof(err));
    if (rc == -ENOENT)
        cr_skip_test("model %s not found (set LLMD_MODELS)", path);
    cr_assert_eq(rc, 0, "gguf_open %s: %d %s", path, rc, err);
    rc = tok_create(m.g, &m.t, err, sizeof(err));
    cr_assert_eq(rc, 0, "tok_create %s: %d %s", path, rc, err);
    return m;
}

static inline void tt_close(struct tt_model *m) {
    tok_destroy(m->t);
    gguf_close(m->g);
}

/* Encode, growing the output as needed. Caller frees with mem_free(). */
static inline int32_t *tt_encode(const struct tok *t, const char *s, size_t len, bool bos,
                                 size_t *n) {
    size_t cap = 16;
    int32_t *ids = mem_alloc(MEM_TEST, cap * sizeof(*ids));
    int rc = tok_encode(t, s, len, bos, ids, cap, n);
    if (rc == -ENOSPC) {
        cr_assert_gt(*n, cap);
        mem_free(ids);
        cap = *n;
        ids = mem_alloc(MEM_TEST, cap * sizeof(*ids) + 1);
        rc = tok_encode(t, s, len, bos, ids, cap, n);
    }
    cr_assert_eq(rc, 0, "tok_encode: %d", rc);
    return ids;
}

/* "[1, 2, 3]" into buf. */
static inline const char *tt_fmt_ids(char *buf, size_t cap, const int32_t *ids, size_t n) {
    size_t k = (size_t)snprintf(buf, cap, "[");
    for (size_t i = 0; i < n && k < cap; i++)
        k += (size_t)snprintf(buf + k, cap - k, "%s%d", i ? " " : "", ids[i]);
    if (k < cap)
        snprintf(buf + k, cap - k, "]");
    return buf;
}

/* One llama.cpp vocab test: a string (may contain NUL-free bytes of any
 * kind) and its expected ids. */
struct tt_vec {
    const char *s;
    size_t len;
    int32_t ids[256];
    size_t n_ids;
};

/* Parse <name>.inp/.out the way llama.cpp's test-tokenizer-0 does: the .inp
 * text is cut at every "\n__ggml_vocab_test__\n" (each string is followed by
 * one separator), and line i of .out holds the ids of string i. Returns the
 * number of vectors; *inp_buf must be freed by the caller. */
static inline size_t tt_vectors(const char *name, struct tt_vec *v, size_t max, char **inp_buf) {
    char rel[512];
    size_t n_inp, n_out;
    snprintf(rel, sizeof(rel), "vocab/%s.inp", name);
    char *inp = tt_read(rel, &n_inp);
    snprintf(rel, sizeof(rel), "vocab/%s.out", name);
    char *out = tt_read(rel, &n_out);
    static const char sep[] = "\n__ggml_vocab_test__\n";
    size_t n = 0;
    for (char *p = inp, *q; (q = strstr(p, sep)); p = q + strlen(sep)) {
        cr_assert_lt(n, max);
        v[n].s = p;
        v[n].len = (size_t)(q - p);
        n++;
    }
    char *line = out;
    for (size_t i = 0; i < n; i++) {
        char *eol = strchr(line, '\n');
        cr_assert_not_null(eol, "%s.out has fewer lines than tests (%zu)", name, n);
        *eol = 0;
        v[i].n_ids = 0;
        for (char *p = line, *end; *p; p = end) {
            long id = strtol(p, &end, 10);
            if (end == p)
                break;
            cr_assert_lt(v[i].n_ids, 256);
            v[i].ids[v[i].n_ids++] = (int32_t)id;
        }
        line = eol + 1;
    }
    mem_free(out);
    *inp_buf = inp;
    return n;
}

/* Strictly valid UTF-8 (RFC 3629: no overlongs, surrogates or > U+10FFFF). */
static inline bool tt_utf8_valid(const char *s, size_t n) {
    const uint8_t *p = (const uint8_t *)s;
    for (size_t i = 0; i < n;) {
        uint8_t c = p[i];
        size_t k;
        uint8_t lo = 0x80, hi = 0xBF;
        if (c < 0x80)
            k = 1;
        else if (c >= 0xC2 && c <= 0xDF)
            k = 2;
        else if (c >= 0xE0 && c <= 0xEF)
            k = 3, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
        else if (c >= 0xF0 && c <= 0xF4)
            k = 4, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
        else
            return false;
        if (k > n - i)
            return false;
        for (size_t j = 1; j < k; j++) {
            uint8_t d = p[i + j];
            if (d < (j == 1 ? lo : 0x80) || d > (j == 1 ? hi : 0xBF))
                return false;
        }
        i += k;
    }
    return true;
}

/* Concatenated pieces of ids into buf; returns the length. */
static inline size_t tt_detok(const struct tok *t, const int32_t *ids, size_t n, char *buf,
                              size_t cap) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        size_t m;
        int rc = tok_piece(t, ids[i], buf + k, cap - k, &m);
        cr_assert_eq(rc, 0, "tok_piece %d: %d", ids[i], rc);
        k += m;
    }
    return k;
}

/* ---- a tiny GGUF writer for error-path tests -------------------------- */

struct tt_gguf {
    uint8_t buf[8192];
    size_t len;
    uint64_t n_kv;
};

static inline void tt_put(struct tt_gguf *b, const void *p, size_t n) {
    cr_assert_leq(b->len + n, sizeof(b->buf));
    memcpy(b->buf + b->len, p, n);
    b->len += n;
}

static inline void tt_put_u32(struct tt_gguf *b, uint32_t v) {
    tt_put(b, &v, 4);
}

static inline void tt_put_str(struct tt_gguf *b, const char *s) {
    uint64_t n = strlen(s);
    tt_put(b, &n, 8);
    tt_put(b, s, n);
}

static inline void tt_gguf_init(struct tt_gguf *b) {
    b->len = 0;
    b->n_kv = 0;
    tt_put(b, "GGUF", 4);
    tt_put_u32(b, 3);
    uint64_t zero = 0;
    tt_put(b, &zero, 8); /* n_tensors */
    tt_put(b, &zero, 8); /* n_kv, patched by tt_kv_* */
}

static inline void tt_kv_key(struct tt_gguf *b, const char *key, uint32_t type) {
    tt_put_str(b, key);
    tt_put_u32(b, type);
    b->n_kv++;
    memcpy(b->buf + 16, &b->n_kv, 8);
}

static inline void tt_kv_str(struct tt_gguf *b, const char *key, const char *v) {
    tt_kv_key(b, key, GGUF_VT_STRING);
    tt_put_str(b, v);
}

static inline void tt_kv_u32(struct tt_gguf *b, const char *key, uint32_t v) {
    tt_kv_key(b, key, GGUF_VT_UINT32);
    tt_put_u32(b, v);
}

static inline void tt_kv_strs(struct tt_gguf *b, const char *key, const char *const *v, size_t n) {
    tt_kv_key(b, key, GGUF_VT_ARRAY);
    tt_put_u32(b, GGUF_VT_STRING);
    uint64_t n64 = n;
    tt_put(b, &n64, 8);
    for (size_t i = 0; i < n; i++)
        tt_put_str(b, v[i]);
}

static inline void tt_kv_arr(struct tt_gguf *b, const char *key, uint32_t et, const void *v,
                             size_t n, size_t esize) {
    tt_kv_key(b, key, GGUF_VT_ARRAY);
    tt_put_u32(b, et);
    uint64_t n64 = n;
    tt_put(b, &n64, 8);
    tt_put(b, v, n * esize);
}

/* Pad to general.alignment (32) so that the (empty) data section starts
 * inside the buffer, as a strict reader may require. */
static inline void tt_gguf_finish(struct tt_gguf *b) {
    static const uint8_t zero[32];
    tt_put(b, zero, (32 - b->len % 32) % 32);
}

#endif /* LLMD_TOK_TESTLIB_H */
