/* Tests of the GGUF reader on malformed input: every truncation of a small
 * writer-made file, each header field corrupted in turn, and random bit
 * flips in the real model's header. Each bad file must give -EINVAL and a
 * message naming the field, never a crash (make test runs this under ASan).
 *
 * Truncated and flipped copies live in plain malloc() blocks of the exact
 * length, not in the mem.h funnel, whose 64-byte rounding would hide a read
 * just past the end from ASan.
 */
#include <stdlib.h>

#include "tests/lib/gguf_util.h"

/* Open buf[0..len) from an exact-size copy; returns rc, message in err. */
static int open_copy(const void *buf, size_t len, char *err, size_t errlen) {
    void *copy = malloc(len ? len : 1);
    cr_assert_not_null(copy);
    memcpy(copy, buf, len);
    struct gguf *g = NULL;
    int rc = gguf_open_mem(copy, len, &g, err, errlen);
    if (rc == 0)
        gguf_close(g);
    free(copy);
    return rc;
}

static void expect_bad(const void *buf, size_t len, const char *want, const char *what) {
    uint64_t before = mem_bytes(MEM_GGUF);
    char err[512];
    int rc = open_copy(buf, len, err, sizeof(err));
    cr_assert_eq(rc, -EINVAL, "%s: rc %d (%s)", what, rc, err);
    cr_assert(strncmp(err, "gguf: ", 6) == 0 && strstr(err, " at offset "),
              "%s: message '%s' lacks 'gguf: ... at offset'", what, err);
    cr_assert(strstr(err, want), "%s: message '%s' lacks '%s'", what, err, want);
    cr_assert_eq(mem_bytes(MEM_GGUF), before, "%s: leaked", what);
}

/* Offset of the value type of key k (the key's bytes are unique in the file). */
static size_t key_type_off(const void *buf, size_t len, const char *k) {
    return fx_find(buf, len, k) + strlen(k);
}

/* Offsets within the tensor info of name: n_dims, ne[0], type, offset. */
struct tinfo_off {
    size_t n_dims, ne, type, offset;
};

static struct tinfo_off tinfo(const void *buf, size_t len, const char *name, uint32_t n_dims) {
    struct tinfo_off o;
    o.n_dims = fx_find(buf, len, name) + strlen(name);
    o.ne = o.n_dims + 4;
    o.type = o.ne + 8 * n_dims;
    o.offset = o.type + 4;
    return o;
}

static uint64_t get_u64(const void *buf, size_t off) {
    uint64_t v;
    memcpy(&v, (const char *)buf + off, 8);
    return v;
}

Test(gguf_bad, fixture_is_valid) {
    size_t len;
    void *buf = fx_small(&len);
    char err[256];
    cr_assert_eq(open_copy(buf, len, err, sizeof(err)), 0, "%s", err);
    mem_free(buf);
}

/* Every prefix up to the end of the tensor infos and padding, and a few
 * that cut tensor data, is refused. */
Test(gguf_bad, every_truncation_is_refused) {
    size_t len;
    void *buf = fx_small(&len);
    struct gguf *g;
    cr_assert_eq(gguf_open_mem(buf, len, &g, NULL, 0), 0);
    size_t data_off = gguf_data_offset(g);
    const struct gguf_tensor *last = gguf_tensor_at(g, gguf_n_tensors(g) - 1);
    size_t data_end = data_off + last->offset + last->bytes, last_bytes = last->bytes;
    gguf_close(g);
    cr_assert_lt(data_end, len + 1);
    char what[64];
    for (size_t n = 0; n < data_off; n++) {
        snprintf(what, sizeof(what), "truncated to %zu of %zu", n, len);
        expect_bad(buf, n, "", what);
    }
    size_t cuts[] = {data_off + 1, data_off + 40, data_end - last_bytes / 2, data_end - 1};
    for (size_t i = 0; i < sizeof(cuts) / sizeof(cuts[0]); i++) {
        snprintf(what, sizeof(what), "data truncated to %zu", cuts[i]);
        expect_bad(buf, cuts[i], "past the end", what);
    }
    mem_free(buf);
}

Test(gguf_bad, zero_length_and_no_errbuf) {
    struct gguf *g = (struct gguf *)0x1;
    char err[16];
    cr_assert_eq(gguf_open_mem(NULL, 0, &g, err, sizeof(err)), -EINVAL);
    cr_assert_eq(strlen(err), sizeof(err) - 1, "message cut to the buffer: '%s'", err);
    cr_assert_eq(gguf_open_mem("GGUF", 4, &g, NULL, 0), -EINVAL);
    cr_assert_eq(g, (struct gguf *)0x1, "*out untouched");
}

/* One corruption of the fixture and the words its message must contain. */
struct corrupt_case {
    const char *name;
    void (*apply)(void *buf, size_t len);
    const char *want;
};

static void c_magic(void *b, size_t n) {
    (void)n;
    ((char *)b)[0] = 'X';
}
static void c_version1(void *b, size_t n) {
    (void)n;
    fx_put_u32(b, 4, 1);
}
static void c_version99(void *b, size_t n) {
    (void)n;
    fx_put_u32(b, 4, 99);
}
static void c_n_tensors(void *b, size_t n) {
    (void)n;
    fx_put_u64(b, 8, 1ull << 62);
}
static void c_n_kv(void *b, size_t n) {
    (void)n;
    fx_put_u64(b, 16, 1ull << 62);
}
static void c_key_len(void *b, size_t n) {
    fx_put_u64(b, fx_find(b, n, "general.name") - 8, 1ull << 63);
}
static void c_str_len(void *b, size_t n) {
    fx_put_u64(b, key_type_off(b, n, "general.name") + 4, 1ull << 63);
}
static void c_arr_count_str(void *b, size_t n) {
    fx_put_u64(b, key_type_off(b, n, "tokenizer.ggml.tokens") + 8, 1ull << 61);
}
static void c_arr_count_f32(void *b, size_t n) {
    fx_put_u64(b, key_type_off(b, n, "tokenizer.ggml.scores") + 8, 1ull << 61);
}
static void c_arr_item_len(void *b, size_t n) {
    /* tokens: type, elem type, count, then "<unk>" (8 + 5 bytes), "<s>" */
    fx_put_u64(b, key_type_off(b, n, "tokenizer.ggml.tokens") + 16 + 13, 1ull << 63);
}
static void c_vtype(void *b, size_t n) {
    fx_put_u32(b, key_type_off(b, n, "llama.block_count"), 13);
}
static void c_elem_type(void *b, size_t n) {
    fx_put_u32(b, key_type_off(b, n, "tokenizer.ggml.scores") + 4, 13);
}
static void c_nested(void *b, size_t n) {
    fx_put_u32(b, key_type_off(b, n, "tokenizer.ggml.scores") + 4, GGUF_VT_ARRAY);
}
static void c_bool(void *b, size_t n) {
    ((uint8_t *)b)[key_type_off(b, n, "fx.flag") + 4] = 2;
}
static void c_dup_key(void *b, size_t n) {
    ((char *)b)[fx_find(b, n, "dup.b") + 4] = 'a';
}
static void c_align0(void *b, size_t n) {
    fx_put_u32(b, key_type_off(b, n, "general.alignment") + 4, 0);
}
static void c_align3(void *b, size_t n) {
    fx_put_u32(b, key_type_off(b, n, "general.alignment") + 4, 3);
}
static void c_align_type(void *b, size_t n) {
    fx_put_u32(b, key_type_off(b, n, "general.alignment"), GGUF_VT_INT32);
}
static void c_n_dims0(void *b, size_t n) {
    fx_put_u32(b, tinfo(b, n, "tA.weight", 2).n_dims, 0);
}
static void c_n_dims5(void *b, size_t n) {
    fx_put_u32(b, tinfo(b, n, "tA.weight", 2).n_dims, 5);
}
static void c_ne0(void *b, size_t n) {
    fx_put_u64(b, tinfo(b, n, "tA.weight", 2).ne + 8, 0);
}
static void c_ne_huge(void *b, size_t n) {
    fx_put_u64(b, tinfo(b, n, "tA.weight", 2).ne, 1ull << 63);
}
static void c_ne_overflow(void *b, size_t n) {
    struct tinfo_off o = tinfo(b, n, "tA.weight", 2);
    fx_put_u64(b, o.ne, 1ull << 40);
    fx_put_u64(b, o.ne + 8, 1ull << 40);
}
static void c_ttype99(void *b, size_t n) {
    fx_put_u32(b, tinfo(b, n, "tB.weight", 2).type, 99);
}
static void c_ttype_q5_0(void *b, size_t n) {
    fx_put_u32(b, tinfo(b, n, "tB.weight", 2).type, 6);
}
/* tB is [32, 2]: rows of 32 are not whole q4_K super-blocks of 256 */
static void c_ttype_q4k(void *b, size_t n) {
    fx_put_u32(b, tinfo(b, n, "tB.weight", 2).type, 12);
}
static void c_row_blocks(void *b, size_t n) {
    fx_put_u64(b, tinfo(b, n, "tB.weight", 2).ne, 16);
}
static void c_misaligned(void *b, size_t n) {
    size_t o = tinfo(b, n, "tB.weight", 2).offset;
    fx_put_u64(b, o, get_u64(b, o) + 4);
}
static void c_past_eof(void *b, size_t n) {
    fx_put_u64(b, tinfo(b, n, "tC.weight", 1).offset, 1ull << 40);
}
static void c_overlap(void *b, size_t n) {
    fx_put_u64(b, tinfo(b, n, "tB.weight", 2).offset, 0);
}
static void c_dup_tensor(void *b, size_t n) {
    ((char *)b)[fx_find(b, n, "tC.weight") + 1] = 'A';
}

static const struct corrupt_case cases[] = {
    {"bad magic", c_magic, "magic"},
    {"version 1", c_version1, "version 1"},
    {"version 99", c_version99, "version 99"},
    {"n_tensors 2^62", c_n_tensors, "n_tensors"},
    {"n_kv 2^62", c_n_kv, "n_kv"},
    {"key length 2^63", c_key_len, "key length"},
    {"string length 2^63", c_str_len, "key 'general.name'"},
    {"string length 2^63", c_str_len, "string length"},
    {"string array count 2^61", c_arr_count_str, "array count"},
    {"f32 array count 2^61", c_arr_count_f32, "key 'tokenizer.ggml.scores'"},
    {"f32 array count 2^61", c_arr_count_f32, "array count"},
    {"array string length 2^63", c_arr_item_len, "string #1"},
    {"unknown value type", c_vtype, "unknown value type 13"},
    {"unknown array element type", c_elem_type, "unknown array element type 13"},
    {"array of arrays", c_nested, "nested"},
    {"bool 2", c_bool, "bool"},
    {"duplicate key", c_dup_key, "duplicate key"},
    {"alignment 0", c_align0, "alignment 0"},
    {"alignment 3", c_align3, "alignment 3"},
    {"alignment as i32", c_align_type, "general.alignment"},
    {"n_dims 0", c_n_dims0, "n_dims 0"},
    {"n_dims 5", c_n_dims5, "n_dims 5"},
    {"ne 0", c_ne0, "ne[1] is 0"},
    {"ne 2^63", c_ne_huge, "ne[0]"},
    {"element count overflow", c_ne_overflow, "overflows"},
    {"tensor type 99", c_ttype99, "unsupported tensor type 99"},
    {"tensor type q5_0", c_ttype_q5_0, "tensor 'tB.weight'"},
    {"tensor type q5_0", c_ttype_q5_0, "unsupported tensor type 6 (q5_0)"},
    {"q4_K rows of 32", c_ttype_q4k, "tensor 'tB.weight'"},
    {"q4_K rows of 32", c_ttype_q4k, "shape [32, 2]"},
    {"q4_K rows of 32", c_ttype_q4k, "not a multiple of 256, the block size of q4_K"},
    {"partial block", c_row_blocks, "not a multiple of 32"},
    {"misaligned offset", c_misaligned, "data offset 68 is not a multiple of the alignment 32"},
    {"offset past EOF", c_past_eof, "past the end"},
    {"overlapping data", c_overlap, "overlaps tensor 'tA.weight'"},
    {"duplicate tensor", c_dup_tensor, "duplicate tensor name"},
};

Test(gguf_bad, each_corrupted_field_is_named) {
    size_t len;
    void *buf = fx_small(&len);
    void *bad = mem_alloc(MEM_TEST, len);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        memcpy(bad, buf, len);
        cases[i].apply(bad, len);
        expect_bad(bad, len, cases[i].want, cases[i].name);
    }
    mem_free(bad);
    mem_free(buf);
}

/* A truncated file on disk fails through gguf_open as well. */
Test(gguf_bad, truncated_file_on_disk) {
    size_t len;
    void *buf = fx_small(&len);
    char path[] = "/tmp/llmd-gguf-trunc-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, buf, len - 40), (ssize_t)(len - 40));
    close(fd);
    struct gguf *g;
    char err[256];
    cr_assert_eq(gguf_open(path, &g, err, sizeof(err)), -EINVAL);
    cr_assert(strstr(err, "past the end"), "'%s'", err);
    unlink(path);
    mem_free(buf);
}

/* Touch everything an open file exposes, as a consumer would. */
static void walk(const struct gguf *g) {
    for (uint64_t i = 0; i < gguf_n_kv(g); i++) {
        struct gguf_str k;
        enum gguf_vtype t, et;
        cr_assert_eq(gguf_kv_at(g, i, &k, &t), 0);
        char key[128];
        if (k.len >= sizeof(key) || memchr(k.ptr, 0, k.len))
            continue;
        memcpy(key, k.ptr, k.len);
        key[k.len] = '\0';
        uint64_t n;
        const void *data;
        const struct gguf_str *items;
        if (gguf_get_str_arr(g, key, &n, &items) == 0) {
            for (uint64_t j = 0; j < n; j++) {
                if (items[j].len)
                    (void)((volatile const char *)items[j].ptr)[items[j].len - 1];
            }
        }
        if (gguf_get_arr(g, key, &et, &n, &data) == 0 && n > 0)
            (void)((volatile const uint8_t *)data)[0];
        cr_assert_eq(gguf_get_type(g, key, &et), 0, "key %s", key);
        cr_assert_eq(et, t);
    }
    for (uint64_t i = 0; i < gguf_n_tensors(g); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(g, i);
        (void)((volatile const uint8_t *)t->data)[t->bytes - 1];
    }
}

/* Fixed-seed bit flips in the real model's metadata and tensor infos:
 * each result either opens (and is walked) or is -EINVAL with a message. */
Test(gguf_bad, bit_flips_in_real_header, .timeout = 60) {
    char path[256];
    size_t len;
    void *file = fx_read(fx_model("stories260K-f32.gguf", path, sizeof(path)), &len);
    uint8_t *buf = malloc(len);
    cr_assert_not_null(buf);
    memcpy(buf, file, len);
    struct gguf *g;
    cr_assert_eq(gguf_open_mem(buf, len, &g, NULL, 0), 0);
    size_t hdr = gguf_data_offset(g);
    gguf_close(g);
    uint64_t before = mem_bytes(MEM_GGUF), seed = 0x9e3779b97f4a7c15ull;
    int n_ok = 0;
    for (int it = 0; it < 3000; it++) {
        for (int f = 0; f < 1 + it % 3; f++) {
            seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17; /* xorshift64 */
            buf[seed % hdr] ^= (uint8_t)(1u << ((seed >> 32) % 8));
        }
        char err[256] = "";
        int rc = gguf_open_mem(buf, len, &g, err, sizeof(err));
        if (rc == 0) {
            walk(g);
            gguf_close(g);
            n_ok++;
        } else {
            cr_assert_eq(rc, -EINVAL, "iteration %d: rc %d", it, rc);
            cr_assert(strstr(err, "gguf: "), "iteration %d: message '%s'", it, err);
        }
        memcpy(buf, file, hdr);
    }
    cr_assert_eq(mem_bytes(MEM_GGUF), before, "leaked");
    cr_log_info("bit flips: %d of 3000 still open", n_ok);
    free(buf);
    mem_free(file);
}

/* A long name from the file is quoted cut to 64 bytes and made printable. */
Test(gguf_bad, long_names_are_cut_in_messages) {
    char name[101];
    memset(name, 'n', 100);
    name[100] = '\0';
    name[3] = '\n';
    struct gguf_writer *w;
    cr_assert_eq(gguf_writer_create(&w), 0);
    uint64_t ne[] = {32};
    cr_assert_eq(gguf_writer_add_tensor(w, name, GGUF_T_Q8_0, 1, ne, NULL), 0);
    void *buf;
    size_t len;
    cr_assert_eq(gguf_writer_write_mem(w, &buf, &len), 0);
    gguf_writer_destroy(w);
    fx_put_u32(buf, fx_find(buf, len, name) + 100 + 4 + 8, 16); /* iq2_xxs */
    char want[80];
    snprintf(want, sizeof(want), "tensor 'nnn?%.60s...'", name + 4);
    expect_bad(buf, len, want, "long name");
    expect_bad(buf, len, "unsupported tensor type 16 (iq2_xxs)", "long name");
    mem_free(buf);
}

/* Append a GGUF string (u64 length, bytes) at b[*n]. */
static void put_str(uint8_t *b, size_t *n, const char *s) {
    uint64_t len = strlen(s);
    memcpy(b + *n, &len, 8);
    memcpy(b + *n + 8, s, len);
    *n += 8 + len;
}

/* A metadata key of length 0 is refused, naming the pair and its offset;
 * the same file with the key spelled out opens. It used to be accepted. */
Test(gguf_bad, empty_key_is_refused_with_its_offset) {
    for (int named = 0; named < 2; named++) {
        uint8_t b[128];
        size_t n = 0;
        uint32_t u32;
        uint64_t u64;
        memcpy(b, "GGUF", 4);
        u32 = 3;
        memcpy(b + 4, &u32, 4);
        u64 = 0; /* n_tensors */
        memcpy(b + 8, &u64, 8);
        u64 = 2; /* n_kv */
        memcpy(b + 16, &u64, 8);
        n = 24;
        put_str(b, &n, "general.name");
        u32 = GGUF_VT_STRING;
        memcpy(b + n, &u32, 4);
        n += 4;
        put_str(b, &n, "x");
        size_t at = n; /* the second pair */
        put_str(b, &n, named ? "fx.k" : "");
        u32 = GGUF_VT_UINT32;
        memcpy(b + n, &u32, 4);
        u32 = 7;
        memcpy(b + n + 4, &u32, 4);
        n += 8;
        char err[256], want[96];
        if (named) {
            cr_assert_eq(open_copy(b, n, err, sizeof(err)), 0, "%s", err);
        } else {
            snprintf(want, sizeof(want), "gguf: key #1 at offset %zu: empty key", at);
            expect_bad(b, n, want, "empty key");
            cr_assert_eq(at, 57u);
        }
    }
}
