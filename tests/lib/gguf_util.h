/* gguf_util.h - helpers shared by the tests/test_gguf_*.c files: paths
 * of the real models, reading a file into memory, and a small GGUF made by
 * the writer whose fields the malformed-input tests corrupt one at a time.
 * Header-only (static inline) because each test file is its own binary.
 */
#ifndef LLMD_TEST_GGUF_FIXTURE_H
#define LLMD_TEST_GGUF_FIXTURE_H

#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "engine/model/gguf.h"
#include "engine/model/gguf_write.h"
#include "mem.h"

#define FX_MODELS "../shared/models/"

/* Path of a file in the shared models folder; fails the test with a clear
 * message when it is missing (tests run from the repository root). */
static inline const char *fx_model(const char *name, char *buf, size_t cap) {
    snprintf(buf, cap, FX_MODELS "%s", name);
    cr_assert(access(buf, R_OK) == 0,
              "missing test model %s (tests run from the repo root; see "
              "/work/shared/models/README.md)",
              buf);
    return buf;
}

/* The whole file at path in a MEM_TEST buffer (caller frees with mem_free). */
static inline void *fx_read(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "open %s: %s", path, strerror(errno));
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *buf = mem_alloc(MEM_TEST, (size_t)n);
    cr_assert_not_null(buf);
    cr_assert_eq(fread(buf, 1, (size_t)n, f), (size_t)n, "short read of %s", path);
    fclose(f);
    *len = (size_t)n;
    return buf;
}

/* Byte offset of the first occurrence of the NUL-terminated s in buf. */
static inline size_t fx_find(const void *buf, size_t len, const char *s) {
    const char *p = memmem(buf, len, s, strlen(s));
    cr_assert_not_null(p, "'%s' not in the fixture", s);
    return (size_t)(p - (const char *)buf);
}

static inline void fx_put_u32(void *buf, size_t off, uint32_t v) {
    memcpy((char *)buf + off, &v, 4);
}

static inline void fx_put_u64(void *buf, size_t off, uint64_t v) {
    memcpy((char *)buf + off, &v, 8);
}

/* A small valid file: keys of several types (general.alignment = 32 set
 * explicitly, a string, a string array, an f32 array, a bool, two keys
 * "dup.a"/"dup.b" that differ in one byte) and three tensors. */
static inline void *fx_small(size_t *len) {
    float fx_a[8 * 2];    /* "tA.weight" F32 [8, 2] */
    uint8_t fx_b[34 * 2]; /* "tB.weight" Q8_0 [32, 2] */
    uint16_t fx_c[5];     /* "tC.weight" F16 [5] */
    for (size_t i = 0; i < sizeof(fx_a) / sizeof(fx_a[0]); i++)
        fx_a[i] = (float)i * 0.5f;
    for (size_t i = 0; i < sizeof(fx_b); i++)
        fx_b[i] = (uint8_t)(i * 7);
    for (size_t i = 0; i < 5; i++)
        fx_c[i] = (uint16_t)(0x3c00 + i);
    struct gguf_writer *w;
    cr_assert_eq(gguf_writer_create(&w), 0);
    static const char *const toks[] = {"<unk>", "<s>", "</s>", "hello"};
    static const float scores[] = {0.0f, -1.0f, -2.0f, -3.5f};
    uint64_t ne_a[] = {8, 2}, ne_b[] = {32, 2}, ne_c[] = {5};
    int rc = gguf_writer_set_u32(w, "general.alignment", 32);
    rc |= gguf_writer_set_str(w, "general.name", "fixture");
    rc |= gguf_writer_set_u32(w, "llama.block_count", 2);
    rc |= gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, NULL, 4);
    rc |= gguf_writer_set_arr(w, "tokenizer.ggml.scores", GGUF_VT_FLOAT32, scores, 4);
    rc |= gguf_writer_set_bool(w, "fx.flag", true);
    rc |= gguf_writer_set_u32(w, "dup.a", 1);
    rc |= gguf_writer_set_u32(w, "dup.b", 2);
    rc |= gguf_writer_add_tensor(w, "tA.weight", GGUF_T_F32, 2, ne_a, fx_a);
    rc |= gguf_writer_add_tensor(w, "tB.weight", GGUF_T_Q8_0, 2, ne_b, fx_b);
    rc |= gguf_writer_add_tensor(w, "tC.weight", GGUF_T_F16, 1, ne_c, fx_c);
    cr_assert_eq(rc, 0, "building the fixture");
    void *buf;
    cr_assert_eq(gguf_writer_write_mem(w, &buf, len), 0);
    gguf_writer_destroy(w);
    return buf;
}

#endif /* LLMD_TEST_GGUF_FIXTURE_H */
