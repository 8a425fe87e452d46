/* gguf.h - read-only access to a GGUF v3 file (weights and metadata).
 *
 * Format: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md
 * (header: magic "GGUF", u32 version, u64 n_tensors, u64 n_kv; then the
 * key/value metadata; then tensor infos; then aligned tensor data).
 *
 * Workflow: gguf_open() mmaps and validates the whole file up front: every
 * count, string length and array length is bounded by the file size, every
 * tensor's type is known, its byte size computed without overflow, its
 * offset aligned to general.alignment and its data inside the file. After a
 * successful open nothing reads out of bounds, so accessors cannot fail on
 * memory safety, only on absent keys or wrong types. A bad file gets an error
 * message naming the field and its byte offset.
 *
 * Strings in the file are not NUL-terminated: they are returned as
 * struct gguf_str views into the mapping, valid until gguf_close().
 *
 * Thread safety: after open, every accessor is read-only and may be called
 * from any thread at once. open/close are not concurrent with accessors.
 */
#ifndef LLMD_GGUF_H
#define LLMD_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Metadata value types (gguf.md "gguf_metadata_value_type"). */
enum gguf_vtype {
    GGUF_VT_UINT8 = 0,
    GGUF_VT_INT8 = 1,
    GGUF_VT_UINT16 = 2,
    GGUF_VT_INT16 = 3,
    GGUF_VT_UINT32 = 4,
    GGUF_VT_INT32 = 5,
    GGUF_VT_FLOAT32 = 6,
    GGUF_VT_BOOL = 7,
    GGUF_VT_STRING = 8,
    GGUF_VT_ARRAY = 9,
    GGUF_VT_UINT64 = 10,
    GGUF_VT_INT64 = 11,
    GGUF_VT_FLOAT64 = 12,
};

/* Tensor types llmd knows (ggml_type ids). Others are rejected at open with
 * "unsupported tensor type N" naming the tensor. */
enum gguf_ttype {
    GGUF_T_F32 = 0,
    GGUF_T_F16 = 1,
    GGUF_T_Q4_0 = 2,
    GGUF_T_Q8_0 = 8,
    GGUF_T_Q2_K = 10,
    GGUF_T_Q3_K = 11,
    GGUF_T_Q4_K = 12,
    GGUF_T_Q5_K = 13,
    GGUF_T_Q6_K = 14,
    GGUF_T_BF16 = 30,
};

struct gguf_str {
    const char *ptr; /* not NUL-terminated; borrowed, valid until gguf_close */
    uint64_t len;    /* bytes */
};

struct gguf_tensor {
    struct gguf_str name;
    uint32_t n_dims; /* 1..4 */
    uint64_t ne[4];  /* ggml order: ne[0] is the row length; unused dims = 1 */
    enum gguf_ttype type;
    uint64_t offset;  /* bytes, from the start of the data section */
    uint64_t bytes;   /* size of the data in bytes */
    const void *data; /* borrowed, points into the mapping */
};

struct gguf;

/* Open and validate `path` (mmap, read-only). On error returns -EINVAL (bad
 * file: errbuf says which field at which offset), -ENOENT/-EACCES (open
 * failed), -ENOMEM; *out is untouched. errbuf may be NULL. Caller closes
 * with gguf_close(). */
int gguf_open(const char *path, struct gguf **out, char *errbuf, size_t errlen);

/* As gguf_open() over a caller's buffer (borrowed: must outlive the
 * struct gguf). Used by the fuzzer and by in-memory dummy models. */
int gguf_open_mem(const void *buf, size_t len, struct gguf **out, char *errbuf, size_t errlen);

/* Unmap and free; NULL is a no-op. */
void gguf_close(struct gguf *g);

uint32_t gguf_version(const struct gguf *g);
uint64_t gguf_n_kv(const struct gguf *g);
uint64_t gguf_alignment(const struct gguf *g); /* general.alignment or 32 */

/* File offset of the data section in bytes (tensor offsets are relative to
 * it); for readers that bypass the mapping (O_DIRECT, NVMe offload). At most
 * the file size (a file without tensors may end before the padding). */
uint64_t gguf_data_offset(const struct gguf *g);

/* Give back this process's pages of bytes [p, p + len) of a file opened
 * with gguf_open(): madvise(MADV_DONTNEED) over the whole pages inside the
 * range (the partial pages at its ends are kept: a neighbour's bytes share
 * them). The mapping is read-only and private, so the pages are clean
 * copies of the file: they leave the process's RSS, stay in the page cache
 * while the system has room, and a later read faults the same bytes back
 * in. For after a loader made its own copy of a tensor (model.c's packs).
 * Returns the bytes given back; 0 for a gguf_open_mem buffer (its pages
 * are the only copy, never dropped), for a range not inside the file, or
 * when madvise fails (logged: the pages then stay, nothing else changes). Safe while other threads
 * read the range (they fault its pages back in). */
size_t gguf_range_release(const struct gguf *g, const void *p, size_t len);

/* File offset in bytes of p, a pointer into the file that an accessor
 * returned (a string's bytes, an array's data), for error messages; UINT64_MAX
 * when p is not inside the file. */
uint64_t gguf_offset_of(const struct gguf *g, const void *p);

/* The i-th key/value pair in file order (i < gguf_n_kv()), for listing and
 * fuzzing: *key is a borrowed view, *type its value type. Returns 0 or
 * -ENOENT (i out of range). */
int gguf_kv_at(const struct gguf *g, uint64_t i, struct gguf_str *key, enum gguf_vtype *type);

/* Value type of `key`: 0 or -ENOENT. Lets a caller accept several encodings
 * of an optional key. */
int gguf_get_type(const struct gguf *g, const char *key, enum gguf_vtype *type);

/* Metadata lookups by full key ("llama.block_count"). Each returns 0,
 * -ENOENT (no such key) or -EINVAL (wrong type, or value out of range for
 * the output type). Integer getters accept any integer type whose value fits. */
int gguf_get_u32(const struct gguf *g, const char *key, uint32_t *out);
int gguf_get_u64(const struct gguf *g, const char *key, uint64_t *out);
int gguf_get_i32(const struct gguf *g, const char *key, int32_t *out);
int gguf_get_f32(const struct gguf *g, const char *key, float *out); /* f32 or f64 */
int gguf_get_bool(const struct gguf *g, const char *key, bool *out);
int gguf_get_str(const struct gguf *g, const char *key, struct gguf_str *out);

/* Arrays. For numeric arrays, *data points at n packed little-endian
 * elements of *elem_type in the mapping (may be unaligned: read with
 * memcpy). For string arrays use gguf_get_str_arr(), whose items[] the
 * loader indexed at open time (O(1) access). */
int gguf_get_arr(const struct gguf *g, const char *key, enum gguf_vtype *elem_type, uint64_t *n,
                 const void **data);
int gguf_get_str_arr(const struct gguf *g, const char *key, uint64_t *n,
                     const struct gguf_str **items);

/* Tensors. gguf_find_tensor() returns NULL when absent. */
uint64_t gguf_n_tensors(const struct gguf *g);
const struct gguf_tensor *gguf_tensor_at(const struct gguf *g, uint64_t i);
const struct gguf_tensor *gguf_find_tensor(const struct gguf *g, const char *name);

/* Bytes of n elements of tensor type t (n a multiple of its block size:
 * 32 for Q4_0/Q8_0, 256 for the K-quants), 0 if n is not. Block sizes: F32
 * 4 B/elem, F16 and BF16 2 B/elem, Q8_0 34 B/32 elems, Q4_0 18 B/32 elems,
 * Q2_K 84 B/256, Q3_K 110 B/256, Q4_K 144 B/256, Q5_K 176 B/256, Q6_K 210 B/256
 * (ggml-common.h). Also 0
 * when t is not one of enum gguf_ttype or the size overflows uint64_t. */
uint64_t gguf_type_bytes(enum gguf_ttype t, uint64_t n);

/* Elements per block of t: 1 for F32/F16/BF16, 32 for Q4_0/Q8_0, 256 for
 * Q2_K..Q6_K, 0 when t is not one of enum gguf_ttype. A tensor's rows
 * (ne[0]) are whole blocks: gguf_open refuses others, naming the tensor,
 * its shape and the block size. */
uint32_t gguf_type_block(enum gguf_ttype t);

/* ggml's name of a tensor type id ("f32", "q8_0", "q4_K", ...); it knows all
 * ggml ids, also those llmd does not load, and returns "?" for others.
 * Static string. */
const char *gguf_type_name(enum gguf_ttype t);

/* Name of a metadata value type ("u32", "string", ...), "?" if unknown. */
const char *gguf_vtype_name(enum gguf_vtype t);

/* True when s equals the NUL-terminated c. */
bool gguf_str_eq(struct gguf_str s, const char *c);

#endif /* LLMD_GGUF_H */
