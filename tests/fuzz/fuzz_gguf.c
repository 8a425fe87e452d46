/* fuzz_gguf.c - libFuzzer target for the GGUF reader (built by tests/fuzz/run.sh).
 *
 * Opens the input with gguf_open_mem() and, when it opens, walks everything a
 * consumer could touch: every key through every typed getter, every array
 * element, every string-array item, every tensor by index and by name, and
 * the first and last byte of its data. ASan turns any read the validation
 * at open failed to bound into a crash; a trap marks a lookup by name that
 * disagrees with the index.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "engine/model/gguf.h"

static volatile uint64_t fuzz_sink; /* keeps the reads from being optimized away */

static uint64_t elem_size(enum gguf_vtype t) {
    switch (t) {
    case GGUF_VT_UINT16:
    case GGUF_VT_INT16:
        return 2;
    case GGUF_VT_UINT32:
    case GGUF_VT_INT32:
    case GGUF_VT_FLOAT32:
        return 4;
    case GGUF_VT_UINT64:
    case GGUF_VT_INT64:
    case GGUF_VT_FLOAT64:
        return 8;
    default:
        return 1;
    }
}

static void walk_key(const struct gguf *g, const char *key, enum gguf_vtype type) {
    uint32_t u32;
    uint64_t u64, n;
    int32_t i32;
    float f;
    bool b;
    struct gguf_str s;
    enum gguf_vtype et;
    const void *data;
    const struct gguf_str *items;
    if (gguf_get_u32(g, key, &u32) == 0)
        fuzz_sink += u32;
    if (gguf_get_u64(g, key, &u64) == 0)
        fuzz_sink += u64;
    if (gguf_get_i32(g, key, &i32) == 0)
        fuzz_sink += (uint64_t)i32;
    if (gguf_get_f32(g, key, &f) == 0)
        fuzz_sink += f == f;
    if (gguf_get_bool(g, key, &b) == 0)
        fuzz_sink += b;
    if (gguf_get_str(g, key, &s) == 0 && s.len)
        fuzz_sink += (unsigned char)s.ptr[0] + (unsigned char)s.ptr[s.len - 1];
    if (gguf_get_arr(g, key, &et, &n, &data) == 0) {
        const unsigned char *p = data;
        uint64_t size = elem_size(et);
        for (uint64_t i = 0; i < n * size; i++)
            fuzz_sink += p[i];
    }
    if (gguf_get_str_arr(g, key, &n, &items) == 0) {
        for (uint64_t i = 0; i < n; i++) {
            if (items[i].len)
                fuzz_sink +=
                    (unsigned char)items[i].ptr[0] + (unsigned char)items[i].ptr[items[i].len - 1];
        }
    }
    if (gguf_get_type(g, key, &et) != 0 || et != type)
        __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    struct gguf *g;
    char err[256];
    if (gguf_open_mem(data, size, &g, err, sizeof(err)) != 0)
        return 0;
    fuzz_sink += gguf_version(g) + gguf_alignment(g) + gguf_data_offset(g);
    for (uint64_t i = 0; i < gguf_n_kv(g); i++) {
        struct gguf_str k;
        enum gguf_vtype type;
        char key[256];
        if (gguf_kv_at(g, i, &k, &type) != 0)
            __builtin_trap();
        if (k.len >= sizeof(key) || memchr(k.ptr, 0, k.len))
            continue; /* not reachable by a C-string lookup */
        memcpy(key, k.ptr, k.len);
        key[k.len] = '\0';
        walk_key(g, key, type);
    }
    for (uint64_t i = 0; i < gguf_n_tensors(g); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(g, i);
        const unsigned char *p = t->data;
        fuzz_sink += p[0] + p[t->bytes - 1] + t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
        fuzz_sink += gguf_type_bytes(t->type, 1) + (uintptr_t)gguf_type_name(t->type);
        char name[256];
        if (t->name.len < sizeof(name) && !memchr(t->name.ptr, 0, t->name.len)) {
            memcpy(name, t->name.ptr, t->name.len);
            name[t->name.len] = '\0';
            if (gguf_find_tensor(g, name) != t)
                __builtin_trap();
        }
    }
    gguf_close(g);
    return 0;
}
