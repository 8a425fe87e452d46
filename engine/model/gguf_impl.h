/* gguf_impl.h - internals shared by gguf.c (open and validation) and
 * gguf_meta.c (accessors, lookups, type tables; gguf.c calls into it, never
 * the reverse). Not for other modules: they use gguf.h.
 *
 * Lookups by name use open-addressing hash tables of uint32_t slots holding
 * index + 1 (0 = empty), sized to a power of two of at least twice the
 * entries, so a probe sequence stays short. Counts are capped at 2^31 at
 * open, which no real file comes near (it would need > 27 GB of metadata).
 */
#ifndef LLMD_GGUF_IMPL_H
#define LLMD_GGUF_IMPL_H

#include "engine/model/gguf.h"

#define GGUF_MAX_ENTRIES (1u << 31)

struct gguf_kv {
    struct gguf_str key;
    enum gguf_vtype type;
    enum gguf_vtype elem_type;    /* arrays only */
    uint64_t n;                   /* arrays: element count */
    const uint8_t *val;           /* scalar value bytes, or array elements; in the mapping */
    struct gguf_str str;          /* GGUF_VT_STRING value */
    const struct gguf_str *items; /* string arrays: n views, owned (MEM_GGUF) */
};

struct gguf {
    const uint8_t *base; /* the whole file; borrowed (gguf_open_mem) or mapped */
    size_t len;          /* bytes */
    bool mapped;         /* munmap(base, len) at close */
    uint32_t version;
    uint64_t alignment; /* bytes, a power of 2 */
    uint64_t data_off;  /* bytes from base to the data section */

    uint64_t n_kv;
    struct gguf_kv *kv; /* [n_kv], file order */
    uint32_t *kv_slots; /* [kv_mask + 1] hash of key -> index + 1 */
    uint64_t kv_mask;

    uint64_t n_tensors;
    struct gguf_tensor *tensors; /* [n_tensors], file order */
    uint32_t *t_slots;           /* [t_mask + 1] hash of name -> index + 1 */
    uint64_t t_mask;
};

/* The name of element i of an entry array (see gguf_slots_find()). */
static inline const struct gguf_str *gguf_entry_name(const void *entries, size_t stride,
                                                     uint64_t i) {
    return (const struct gguf_str *)((const char *)entries + i * stride);
}

/* FNV-1a over n bytes. */
uint64_t gguf_hash(const void *p, size_t n);

/* Index of the entry named by bytes [p, p+n) in a slot table, or -1.
 * entries is the array the slots index, stride its element size; each
 * element starts with its name as a struct gguf_str (struct gguf_kv.key,
 * struct gguf_tensor.name). */
int64_t gguf_slots_find(const uint32_t *slots, uint64_t mask, const void *entries, size_t stride,
                        const void *p, size_t n);

/* Bytes of one scalar of value type t (0 for string, array and unknown). */
size_t gguf_vtype_size(enum gguf_vtype t);

#endif /* LLMD_GGUF_IMPL_H */
