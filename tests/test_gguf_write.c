/* Tests of the GGUF writer: round trips through the reader (memory and
 * file), argument checks, write errors, and failed allocations. */
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include "tests/lib/gguf_util.h"

/* One scalar of every value type, one array of every element type. */
static const uint8_t v_u8 = 200;
static const int8_t v_i8 = -100;
static const uint16_t v_u16 = 60000;
static const int16_t v_i16 = -30000;
static const uint32_t v_u32 = 4000000000u;
static const int32_t v_i32 = -2000000000;
static const float v_f32 = 3.25f;
static const bool v_bool = true;
static const uint64_t v_u64 = 0x123456789abcdef0ull;
static const int64_t v_i64 = -0x123456789abcdefll;
static const double v_f64 = -1.0e300;

static const uint8_t a_u8[] = {1, 2, 255};
static const int8_t a_i8[] = {-1, 0, 127};
static const uint16_t a_u16[] = {1, 65535};
static const int16_t a_i16[] = {-32768, 5};
static const uint32_t a_u32[] = {7, 8, 9, 10};
static const int32_t a_i32[] = {-7};
static const float a_f32[] = {1.5f, -2.5f};
static const uint8_t a_bool[] = {1, 0, 1};
static const uint64_t a_u64[] = {UINT64_MAX, 0};
static const int64_t a_i64[] = {INT64_MIN, INT64_MAX};
static const double a_f64[] = {0.125, 1e-300};

struct arr_case {
    const char *key;
    enum gguf_vtype elem;
    const void *data;
    uint64_t n;
    size_t size;
};

#define ARR(k, t, a)                                                                               \
    { k, t, a, sizeof(a) / sizeof(a[0]), sizeof(a[0]) }
static const struct arr_case arrs[] = {
    ARR("a.u8", GGUF_VT_UINT8, a_u8),     ARR("a.i8", GGUF_VT_INT8, a_i8),
    ARR("a.u16", GGUF_VT_UINT16, a_u16),  ARR("a.i16", GGUF_VT_INT16, a_i16),
    ARR("a.u32", GGUF_VT_UINT32, a_u32),  ARR("a.i32", GGUF_VT_INT32, a_i32),
    ARR("a.f32", GGUF_VT_FLOAT32, a_f32), ARR("a.bool", GGUF_VT_BOOL, a_bool),
    ARR("a.u64", GGUF_VT_UINT64, a_u64),  ARR("a.i64", GGUF_VT_INT64, a_i64),
    ARR("a.f64", GGUF_VT_FLOAT64, a_f64),
};

/* Strings with lengths: an embedded NUL and an empty one. */
static const char *const strs[] = {"alpha", "b\0c", "", "\xe2\x96\x81the"};
static const size_t str_lens[] = {5, 3, 0, 6};

struct tensor_case {
    const char *name;
    enum gguf_ttype type;
    uint32_t n_dims;
    uint64_t ne[4];
};

static const struct tensor_case tensors[] = {
    {"t.f32", GGUF_T_F32, 2, {3, 2}},
    {"t.f16", GGUF_T_F16, 3, {4, 2, 2}},
    {"t.bf16", GGUF_T_BF16, 1, {2}},
    {"t.q8_0", GGUF_T_Q8_0, 2, {32, 3}},
    {"t.q4_0", GGUF_T_Q4_0, 4, {64, 1, 1, 2}},
    {"t.zero", GGUF_T_F32, 1, {5}}, /* NULL data: zeros */
};
#define N_TENSORS (sizeof(tensors) / sizeof(tensors[0]))

static uint8_t tdata[N_TENSORS][4096];

static uint64_t n_elem(const struct tensor_case *t) {
    uint64_t n = 1;
    for (uint32_t d = 0; d < t->n_dims; d++)
        n *= t->ne[d];
    return n;
}

/* A writer holding every value type and every tensor type; returns 0 or
 * the first error (so the allocation-failure test can use it). */
static int build(struct gguf_writer **out) {
    struct gguf_writer *w;
    int rc = gguf_writer_create(&w);
    if (rc)
        return rc;
    static const struct {
        const char *key;
        enum gguf_vtype t;
        const void *v;
    } scalars[] = {
        {"s.u8", GGUF_VT_UINT8, &v_u8},     {"s.i8", GGUF_VT_INT8, &v_i8},
        {"s.u16", GGUF_VT_UINT16, &v_u16},  {"s.i16", GGUF_VT_INT16, &v_i16},
        {"s.u32", GGUF_VT_UINT32, &v_u32},  {"s.i32", GGUF_VT_INT32, &v_i32},
        {"s.f32", GGUF_VT_FLOAT32, &v_f32}, {"s.bool", GGUF_VT_BOOL, &v_bool},
        {"s.u64", GGUF_VT_UINT64, &v_u64},  {"s.i64", GGUF_VT_INT64, &v_i64},
        {"s.f64", GGUF_VT_FLOAT64, &v_f64},
    };
    for (size_t i = 0; i < sizeof(scalars) / sizeof(scalars[0]) && !rc; i++)
        rc = gguf_writer_set_val(w, scalars[i].key, scalars[i].t, scalars[i].v);
    if (!rc)
        rc = gguf_writer_set_u32(w, "w.u32", 42);
    if (!rc)
        rc = gguf_writer_set_i32(w, "w.i32", -42);
    if (!rc)
        rc = gguf_writer_set_u64(w, "w.u64", 1ull << 40);
    if (!rc)
        rc = gguf_writer_set_f32(w, "w.f32", 0.5f);
    if (!rc)
        rc = gguf_writer_set_bool(w, "w.bool", false);
    if (!rc)
        rc = gguf_writer_set_str(w, "w.str", "h\xc3\xa9llo");
    if (!rc)
        rc = gguf_writer_set_str(w, "w.empty", "");
    for (size_t i = 0; i < sizeof(arrs) / sizeof(arrs[0]) && !rc; i++)
        rc = gguf_writer_set_arr(w, arrs[i].key, arrs[i].elem, arrs[i].data, arrs[i].n);
    if (!rc)
        rc = gguf_writer_set_arr(w, "a.none", GGUF_VT_INT32, NULL, 0);
    if (!rc)
        rc = gguf_writer_set_arr_str(w, "a.str", strs, str_lens, 4);
    if (!rc) {
        static const char *const plain[] = {"x", "yy", "zzz"};
        rc = gguf_writer_set_arr_str(w, "a.str0", plain, NULL, 3);
    }
    for (size_t i = 0; i < N_TENSORS && !rc; i++) {
        for (size_t j = 0; j < sizeof(tdata[i]); j++)
            tdata[i][j] = (uint8_t)(i * 31 + j * 7 + 1);
        const struct tensor_case *t = &tensors[i];
        rc = gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne,
                                    strcmp(t->name, "t.zero") ? tdata[i] : NULL);
    }
    if (rc) {
        gguf_writer_destroy(w);
        return rc;
    }
    *out = w;
    return 0;
}

static void check_scalars(const struct gguf *g) {
    uint32_t u32;
    int32_t i32;
    uint64_t u64;
    float f;
    bool b;
    struct gguf_str s;
    enum gguf_vtype t;
    cr_assert_eq(gguf_get_type(g, "s.u8", &t), 0);
    cr_assert_eq(t, GGUF_VT_UINT8);
    cr_assert_eq(gguf_get_u32(g, "s.u8", &u32), 0);
    cr_assert_eq(u32, 200);
    cr_assert_eq(gguf_get_i32(g, "s.i8", &i32), 0);
    cr_assert_eq(i32, -100);
    cr_assert_eq(gguf_get_u32(g, "s.i8", &u32), -EINVAL, "negative into u32");
    cr_assert_eq(gguf_get_u64(g, "s.i8", &u64), -EINVAL, "negative into u64");
    cr_assert_eq(gguf_get_u32(g, "s.u16", &u32), 0);
    cr_assert_eq(u32, 60000);
    cr_assert_eq(gguf_get_i32(g, "s.i16", &i32), 0);
    cr_assert_eq(i32, -30000);
    cr_assert_eq(gguf_get_u32(g, "s.u32", &u32), 0);
    cr_assert_eq(u32, v_u32);
    cr_assert_eq(gguf_get_i32(g, "s.u32", &i32), -EINVAL, "4e9 does not fit i32");
    cr_assert_eq(gguf_get_i32(g, "s.i32", &i32), 0);
    cr_assert_eq(i32, v_i32);
    cr_assert_eq(gguf_get_f32(g, "s.f32", &f), 0);
    cr_assert_eq(f, v_f32);
    cr_assert_eq(gguf_get_bool(g, "s.bool", &b), 0);
    cr_assert(b);
    cr_assert_eq(gguf_get_u64(g, "s.u64", &u64), 0);
    cr_assert_eq(u64, v_u64);
    cr_assert_eq(gguf_get_u32(g, "s.u64", &u32), -EINVAL, "2^60 does not fit u32");
    cr_assert_eq(gguf_get_u64(g, "s.i64", &u64), -EINVAL);
    cr_assert_eq(gguf_get_type(g, "s.i64", &t), 0);
    cr_assert_eq(t, GGUF_VT_INT64);
    cr_assert_eq(gguf_get_f32(g, "s.f64", &f), -EINVAL, "-1e300 does not fit f32");
    cr_assert_eq(gguf_get_u32(g, "w.u32", &u32), 0);
    cr_assert_eq(u32, 42);
    cr_assert_eq(gguf_get_i32(g, "w.i32", &i32), 0);
    cr_assert_eq(i32, -42);
    cr_assert_eq(gguf_get_u64(g, "w.u64", &u64), 0);
    cr_assert_eq(u64, 1ull << 40);
    cr_assert_eq(gguf_get_f32(g, "w.f32", &f), 0);
    cr_assert_eq(f, 0.5f);
    cr_assert_eq(gguf_get_bool(g, "w.bool", &b), 0);
    cr_assert(!b);
    cr_assert_eq(gguf_get_str(g, "w.str", &s), 0);
    cr_assert(gguf_str_eq(s, "h\xc3\xa9llo"));
    cr_assert_eq(gguf_get_str(g, "w.empty", &s), 0);
    cr_assert_eq(s.len, 0);
}

static void check_arrays(const struct gguf *g) {
    for (size_t i = 0; i < sizeof(arrs) / sizeof(arrs[0]); i++) {
        enum gguf_vtype et;
        uint64_t n;
        const void *data;
        cr_assert_eq(gguf_get_arr(g, arrs[i].key, &et, &n, &data), 0, "%s", arrs[i].key);
        cr_assert_eq(et, arrs[i].elem, "%s elem %s", arrs[i].key, gguf_vtype_name(et));
        cr_assert_eq(n, arrs[i].n, "%s n %lu", arrs[i].key, (unsigned long)n);
        cr_assert_eq(memcmp(data, arrs[i].data, n * arrs[i].size), 0, "%s data", arrs[i].key);
    }
    enum gguf_vtype et;
    uint64_t n;
    const void *data;
    cr_assert_eq(gguf_get_arr(g, "a.none", &et, &n, &data), 0);
    cr_assert_eq(n, 0);
    const struct gguf_str *items;
    cr_assert_eq(gguf_get_str_arr(g, "a.str", &n, &items), 0);
    cr_assert_eq(n, 4);
    for (size_t i = 0; i < 4; i++) {
        cr_assert_eq(items[i].len, str_lens[i], "a.str[%zu] len %lu", i,
                     (unsigned long)items[i].len);
        cr_assert_eq(memcmp(items[i].ptr, strs[i], str_lens[i]), 0, "a.str[%zu]", i);
    }
    cr_assert_eq(gguf_get_str_arr(g, "a.str0", &n, &items), 0);
    cr_assert_eq(n, 3);
    cr_assert(gguf_str_eq(items[2], "zzz"));
}

static void check_tensors(const struct gguf *g, uint64_t align) {
    cr_assert_eq(gguf_n_tensors(g), N_TENSORS);
    for (size_t i = 0; i < N_TENSORS; i++) {
        const struct tensor_case *c = &tensors[i];
        const struct gguf_tensor *t = gguf_tensor_at(g, i);
        cr_assert(gguf_str_eq(t->name, c->name), "tensor %zu", i);
        cr_assert_eq(gguf_find_tensor(g, c->name), t);
        cr_assert_eq(t->type, c->type, "%s type", c->name);
        cr_assert_eq(t->n_dims, c->n_dims, "%s n_dims", c->name);
        for (uint32_t d = 0; d < 4; d++) {
            uint64_t want = d < c->n_dims ? c->ne[d] : 1;
            cr_assert_eq(t->ne[d], want, "%s ne[%u] %lu want %lu", c->name, d,
                         (unsigned long)t->ne[d], (unsigned long)want);
        }
        uint64_t bytes = gguf_type_bytes(c->type, n_elem(c));
        cr_assert_eq(t->bytes, bytes, "%s bytes", c->name);
        cr_assert_eq(t->offset % align, 0, "%s offset %lu", c->name, (unsigned long)t->offset);
        if (strcmp(c->name, "t.zero") == 0) {
            for (uint64_t j = 0; j < bytes; j++)
                cr_assert_eq(((const uint8_t *)t->data)[j], 0, "t.zero byte %lu", (unsigned long)j);
        } else {
            cr_assert_eq(memcmp(t->data, tdata[i], bytes), 0, "%s data", c->name);
        }
    }
}

static void check_all(const struct gguf *g, uint64_t align) {
    cr_assert_eq(gguf_version(g), 3);
    cr_assert_eq(gguf_alignment(g), align);
    check_scalars(g);
    check_arrays(g);
    check_tensors(g, align);
}

Test(gguf_write, round_trip_mem) {
    uint64_t before = mem_bytes(MEM_GGUF);
    struct gguf_writer *w;
    cr_assert_eq(build(&w), 0);
    void *buf;
    size_t len;
    cr_assert_eq(gguf_writer_write_mem(w, &buf, &len), 0);
    struct gguf *g;
    char err[256];
    cr_assert_eq(gguf_open_mem(buf, len, &g, err, sizeof(err)), 0, "%s", err);
    check_all(g, 32);
    cr_assert_eq(len % 32, 0, "file ends padded");
    gguf_close(g);
    mem_free(buf);
    gguf_writer_destroy(w);
    cr_assert_eq(mem_bytes(MEM_GGUF), before, "leaked %lu bytes",
                 (unsigned long)(mem_bytes(MEM_GGUF) - before));
}

Test(gguf_write, round_trip_file_matches_mem) {
    struct gguf_writer *w;
    cr_assert_eq(build(&w), 0);
    char path[] = "/tmp/llmd-gguf-rt-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    close(fd);
    cr_assert_eq(gguf_writer_write_file(w, path), 0);
    struct gguf *g;
    char err[256];
    cr_assert_eq(gguf_open(path, &g, err, sizeof(err)), 0, "%s", err);
    check_all(g, 32);
    gguf_close(g);
    void *buf, *fbuf;
    size_t len, flen;
    cr_assert_eq(gguf_writer_write_mem(w, &buf, &len), 0);
    fbuf = fx_read(path, &flen);
    cr_assert_eq(flen, len);
    cr_assert_eq(memcmp(buf, fbuf, len), 0, "file and memory outputs differ");
    mem_free(buf);
    mem_free(fbuf);
    unlink(path);
    gguf_writer_destroy(w);
}

Test(gguf_write, custom_alignment_and_replaced_key) {
    struct gguf_writer *w;
    cr_assert_eq(build(&w), 0);
    cr_assert_eq(gguf_writer_set_u32(w, "general.alignment", 64), 0);
    cr_assert_eq(gguf_writer_set_u32(w, "general.alignment", 0), -EINVAL);
    cr_assert_eq(gguf_writer_set_u32(w, "general.alignment", 48), -EINVAL);
    cr_assert_eq(gguf_writer_set_u64(w, "general.alignment", 64), -EINVAL, "must be u32");
    cr_assert_eq(gguf_writer_set_u32(w, "", 1), -EINVAL, "an empty key: the reader refuses it");
    cr_assert_eq(gguf_writer_set_str(w, "s.u8", "now a string"), 0);
    void *buf;
    size_t len;
    cr_assert_eq(gguf_writer_write_mem(w, &buf, &len), 0);
    struct gguf *g;
    char err[256];
    cr_assert_eq(gguf_open_mem(buf, len, &g, err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(gguf_alignment(g), 64);
    check_tensors(g, 64);
    cr_assert_eq(gguf_data_offset(g) % 64, 0);
    struct gguf_str k, s;
    enum gguf_vtype t;
    cr_assert_eq(gguf_kv_at(g, 0, &k, &t), 0);
    cr_assert(gguf_str_eq(k, "s.u8"), "a replaced key keeps its position");
    cr_assert_eq(gguf_get_str(g, "s.u8", &s), 0);
    cr_assert(gguf_str_eq(s, "now a string"));
    gguf_close(g);
    mem_free(buf);
    gguf_writer_destroy(w);
}

Test(gguf_write, empty_file) {
    struct gguf_writer *w;
    cr_assert_eq(gguf_writer_create(&w), 0);
    void *buf;
    size_t len;
    cr_assert_eq(gguf_writer_write_mem(w, &buf, &len), 0);
    cr_assert_eq(len, 32, "24-byte header padded to 32, got %zu", len);
    struct gguf *g;
    cr_assert_eq(gguf_open_mem(buf, len, &g, NULL, 0), 0);
    cr_assert_eq(gguf_n_kv(g), 0);
    cr_assert_eq(gguf_n_tensors(g), 0);
    gguf_close(g);
    cr_assert_eq(gguf_open_mem(buf, 24, &g, NULL, 0), 0, "no padding needed without tensors");
    gguf_close(g);
    mem_free(buf);
    gguf_writer_destroy(w);
    gguf_writer_destroy(NULL);
}

Test(gguf_write, bad_arguments) {
    struct gguf_writer *w;
    cr_assert_eq(gguf_writer_create(&w), 0);
    uint64_t ne[] = {32, 2}, zero[] = {0}, half[] = {16}, big[] = {1ull << 62, 1ull << 62};
    cr_assert_eq(gguf_writer_add_tensor(w, "x", (enum gguf_ttype)12, 2, ne, NULL), -EINVAL);
    cr_assert_eq(gguf_writer_add_tensor(w, "x", GGUF_T_F32, 0, ne, NULL), -EINVAL);
    cr_assert_eq(gguf_writer_add_tensor(w, "x", GGUF_T_F32, 5, ne, NULL), -EINVAL);
    cr_assert_eq(gguf_writer_add_tensor(w, "x", GGUF_T_F32, 1, zero, NULL), -EINVAL);
    cr_assert_eq(gguf_writer_add_tensor(w, "x", GGUF_T_Q8_0, 1, half, NULL), -EINVAL);
    cr_assert_eq(gguf_writer_add_tensor(w, "x", GGUF_T_F32, 2, big, NULL), -EINVAL);
    cr_assert_eq(gguf_writer_add_tensor(w, "x", GGUF_T_F32, 2, ne, NULL), 0);
    cr_assert_eq(gguf_writer_add_tensor(w, "x", GGUF_T_F16, 2, ne, NULL), -EEXIST);
    uint8_t bools[] = {0, 2};
    cr_assert_eq(gguf_writer_set_arr(w, "b", GGUF_VT_BOOL, bools, 2), -EINVAL);
    cr_assert_eq(gguf_writer_set_arr(w, "b", GGUF_VT_STRING, bools, 2), -EINVAL);
    cr_assert_eq(gguf_writer_set_arr(w, "b", GGUF_VT_ARRAY, bools, 2), -EINVAL);
    cr_assert_eq(gguf_writer_set_arr(w, "b", GGUF_VT_UINT64, bools, UINT64_MAX / 4), -EINVAL);
    cr_assert_eq(gguf_writer_set_val(w, "b", GGUF_VT_STRING, "x"), -EINVAL);
    cr_assert_eq(gguf_writer_set_val(w, "b", (enum gguf_vtype)13, bools), -EINVAL);
    gguf_writer_destroy(w);
}

/* Bigger than the 1 MiB staging buffer, so the direct-write path runs. */
Test(gguf_write, large_tensor_streams_to_file) {
    size_t n = (3u << 20) / 4 + 3;
    float *data = mem_alloc(MEM_TEST, n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        data[i] = (float)i;
    struct gguf_writer *w;
    cr_assert_eq(gguf_writer_create(&w), 0);
    uint64_t ne[] = {n};
    uint64_t ne2[] = {3};
    cr_assert_eq(gguf_writer_add_tensor(w, "small", GGUF_T_F32, 1, ne2, data), 0);
    cr_assert_eq(gguf_writer_add_tensor(w, "big", GGUF_T_F32, 1, ne, data), 0);
    char path[] = "/tmp/llmd-gguf-big-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    close(fd);
    cr_assert_eq(gguf_writer_write_file(w, path), 0);
    struct gguf *g;
    char err[256];
    cr_assert_eq(gguf_open(path, &g, err, sizeof(err)), 0, "%s", err);
    const struct gguf_tensor *t = gguf_find_tensor(g, "big");
    cr_assert_not_null(t);
    cr_assert_eq(t->offset, 32);
    cr_assert_eq(memcmp(t->data, data, n * sizeof(float)), 0);
    gguf_close(g);
    unlink(path);
    mem_free(data);
    gguf_writer_destroy(w);
}

Test(gguf_write, write_file_reports_enospc) {
    struct gguf_writer *w;
    cr_assert_eq(build(&w), 0);
    cr_assert_eq(gguf_writer_write_file(w, "/dev/full"), -ENOSPC);
    struct stat st;
    cr_assert_eq(stat("/dev/full", &st), 0, "a device is never removed");
    cr_assert_eq(gguf_writer_write_file(w, "/tmp/no-such-dir-llmd/x.gguf"), -ENOENT);
    gguf_writer_destroy(w);
}

/* A short write (file size limit) fails with -EFBIG and removes the file. */
Test(gguf_write, short_write_removes_partial_file) {
    struct gguf_writer *w;
    cr_assert_eq(build(&w), 0);
    void *buf;
    size_t len;
    cr_assert_eq(gguf_writer_write_mem(w, &buf, &len), 0);
    mem_free(buf);
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit rl;
    cr_assert_eq(getrlimit(RLIMIT_FSIZE, &rl), 0);
    rl.rlim_cur = len / 2;
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &rl), 0);
    char path[] = "/tmp/llmd-gguf-short-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    close(fd);
    int rc = gguf_writer_write_file(w, path);
    cr_assert_eq(rc, -EFBIG, "rc %d", rc);
    cr_assert_eq(access(path, F_OK), -1, "partial file %s left behind", path);
    gguf_writer_destroy(w);
}

/* Every allocation of build + write fails once in turn: the error is
 * -ENOMEM and nothing is left behind. */
Test(gguf_write, survives_each_failed_allocation) {
    uint64_t before = mem_bytes(MEM_GGUF), c0 = mem_calls();
    struct gguf_writer *w;
    void *buf;
    size_t len;
    cr_assert_eq(build(&w), 0);
    cr_assert_eq(gguf_writer_write_mem(w, &buf, &len), 0);
    uint64_t n_calls = mem_calls() - c0;
    mem_free(buf);
    gguf_writer_destroy(w);
    for (uint64_t k = 1; k <= n_calls; k++) {
        mem_fail_nth(k);
        int rc = build(&w);
        if (rc == 0) {
            rc = gguf_writer_write_mem(w, &buf, &len);
            gguf_writer_destroy(w);
        }
        mem_fail_nth(0);
        cr_assert_eq(rc, -ENOMEM, "allocation %lu: rc %d", (unsigned long)k, rc);
        cr_assert_eq(mem_bytes(MEM_GGUF), before, "allocation %lu leaked", (unsigned long)k);
    }
}

/* Copy every key and tensor of the real f32 model through the writer: the
 * output is byte for byte the file llama.cpp wrote. */
Test(gguf_write, rewrite_of_stories_is_identical) {
    char path[256];
    size_t len;
    void *orig = fx_read(fx_model("stories260K-f32.gguf", path, sizeof(path)), &len);
    struct gguf *g;
    cr_assert_eq(gguf_open_mem(orig, len, &g, NULL, 0), 0);
    struct gguf_writer *w;
    cr_assert_eq(gguf_writer_create(&w), 0);
    for (uint64_t i = 0; i < gguf_n_kv(g); i++) {
        struct gguf_str k;
        enum gguf_vtype t;
        cr_assert_eq(gguf_kv_at(g, i, &k, &t), 0);
        char key[256];
        snprintf(key, sizeof(key), "%.*s", (int)k.len, k.ptr);
        int rc;
        if (t == GGUF_VT_STRING) {
            struct gguf_str s;
            cr_assert_eq(gguf_get_str(g, key, &s), 0);
            char *c = mem_strndup(MEM_TEST, s.ptr, s.len);
            rc = gguf_writer_set_str(w, key, c);
            mem_free(c);
        } else if (t == GGUF_VT_ARRAY) {
            enum gguf_vtype et;
            uint64_t n;
            const void *data;
            const struct gguf_str *items;
            if (gguf_get_arr(g, key, &et, &n, &data) == 0) {
                rc = gguf_writer_set_arr(w, key, et, data, n);
            } else {
                cr_assert_eq(gguf_get_str_arr(g, key, &n, &items), 0);
                const char **p = mem_alloc(MEM_TEST, n * sizeof(*p));
                size_t *l = mem_alloc(MEM_TEST, n * sizeof(*l));
                for (uint64_t j = 0; j < n; j++) {
                    p[j] = items[j].ptr;
                    l[j] = items[j].len;
                }
                rc = gguf_writer_set_arr_str(w, key, p, l, n);
                mem_free(p);
                mem_free(l);
            }
        } else {
            /* This file's scalars are all u32 or f32. */
            cr_assert(t == GGUF_VT_UINT32 || t == GGUF_VT_FLOAT32, "key %s: %s", key,
                      gguf_vtype_name(t));
            uint32_t v;
            float f;
            if (t == GGUF_VT_FLOAT32) {
                cr_assert_eq(gguf_get_f32(g, key, &f), 0);
                rc = gguf_writer_set_f32(w, key, f);
            } else {
                cr_assert_eq(gguf_get_u32(g, key, &v), 0);
                rc = gguf_writer_set_u32(w, key, v);
            }
        }
        cr_assert_eq(rc, 0, "key %s", key);
    }
    for (uint64_t i = 0; i < gguf_n_tensors(g); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(g, i);
        char name[128];
        snprintf(name, sizeof(name), "%.*s", (int)t->name.len, t->name.ptr);
        cr_assert_eq(gguf_writer_add_tensor(w, name, t->type, t->n_dims, t->ne, t->data), 0);
    }
    void *buf;
    size_t blen;
    cr_assert_eq(gguf_writer_write_mem(w, &buf, &blen), 0);
    cr_assert_eq(blen, len, "rewritten %zu bytes, original %zu", blen, len);
    size_t diff = 0;
    while (diff < len && ((uint8_t *)buf)[diff] == ((uint8_t *)orig)[diff])
        diff++;
    cr_assert_eq(diff, len, "first difference at byte %zu", diff);
    mem_free(buf);
    gguf_writer_destroy(w);
    gguf_close(g);
    mem_free(orig);
}
