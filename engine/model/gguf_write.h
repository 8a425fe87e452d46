/* gguf_write.h - build a GGUF v3 file: dummy models, test fixtures.
 *
 * Workflow: gguf_writer_create(); set metadata with gguf_writer_set_*() (a
 * key set twice keeps its first position and takes the new value); add
 * tensors with gguf_writer_add_tensor(); then gguf_writer_write_file() or
 * gguf_writer_write_mem(), as often as wanted; gguf_writer_destroy().
 *
 * Every gguf_writer_set_*() returns -EINVAL for an empty key, which the reader
 * refuses. Metadata values are copied. Tensor data is borrowed until the write: the
 * file variant streams it from the caller's buffers through a 1 MiB staging
 * buffer, so writing a 1 GB model needs no second copy. Tensors are laid out
 * in the order added, each at an offset aligned to general.alignment (32
 * unless set as a u32 with gguf_writer_set_u32()), which is what ggml writes
 * and what gguf_open() accepts.
 *
 * Thread safety: a writer is used by one thread at a time.
 */
#ifndef LLMD_GGUF_WRITE_H
#define LLMD_GGUF_WRITE_H

#include "engine/model/gguf.h"

struct gguf_writer;

/* An empty writer. Returns 0 or -ENOMEM. Caller destroys with
 * gguf_writer_destroy(). */
int gguf_writer_create(struct gguf_writer **out);

/* Free the writer and its copies of keys and values; NULL is a no-op.
 * Borrowed tensor data is not touched. */
void gguf_writer_destroy(struct gguf_writer *w);

/* Set a scalar. Each returns 0, -EINVAL (general.alignment that is not a
 * u32 nonzero power of 2) or -ENOMEM. key is copied. */
int gguf_writer_set_u32(struct gguf_writer *w, const char *key, uint32_t v);
int gguf_writer_set_i32(struct gguf_writer *w, const char *key, int32_t v);
int gguf_writer_set_u64(struct gguf_writer *w, const char *key, uint64_t v);
int gguf_writer_set_f32(struct gguf_writer *w, const char *key, float v);
int gguf_writer_set_bool(struct gguf_writer *w, const char *key, bool v);

/* Any numeric or bool scalar type: *val holds one value of `type` in host
 * layout (a bool is a C bool). Returns 0, -EINVAL (type is string or array,
 * or the alignment rule above) or -ENOMEM. */
int gguf_writer_set_val(struct gguf_writer *w, const char *key, enum gguf_vtype type,
                        const void *val);

/* A string value from the NUL-terminated s (copied). 0 or -ENOMEM. */
int gguf_writer_set_str(struct gguf_writer *w, const char *key, const char *s);

/* An array of n strings: items[i] has lens[i] bytes, or is NUL-terminated
 * when lens is NULL. Copied. Returns 0, -EINVAL (size overflow) or -ENOMEM. */
int gguf_writer_set_arr_str(struct gguf_writer *w, const char *key, const char *const *items,
                            const size_t *lens, uint64_t n);

/* A numeric (or bool) array: n packed host-layout elements of elem at data
 * (may be NULL when n is 0). Copied. Returns 0, -EINVAL (elem is string or
 * array, a bool element not 0/1, size overflow) or -ENOMEM. */
int gguf_writer_set_arr(struct gguf_writer *w, const char *key, enum gguf_vtype elem,
                        const void *data, uint64_t n);

/* Add a tensor of shape ne[0..n_dims) (ggml order, ne[0] the row length) and
 * gguf_type_bytes(type, product of ne) bytes at data. data is BORROWED until
 * the last write; NULL writes zeros. name is copied. Returns 0, -EINVAL
 * (unknown type, n_dims not 1..4, an ne of 0, ne[0] not a multiple of the
 * block size, size overflow), -EEXIST (name taken) or -ENOMEM. */
int gguf_writer_add_tensor(struct gguf_writer *w, const char *name, enum gguf_ttype type,
                           uint32_t n_dims, const uint64_t *ne, const void *data);

/* Write the file at path (created or truncated, mode 0644). Returns 0 or
 * -errno of the failing call (-ENOSPC, -EFBIG, -EIO, -EACCES, ...), -ENOMEM.
 * On a failed write a partially written regular file is removed. Blocks on
 * I/O. */
int gguf_writer_write_file(struct gguf_writer *w, const char *path);

/* The whole file in one buffer: *buf (caller frees with mem_free()) of *len
 * bytes. Returns 0, -ENOMEM or -EFBIG (larger than size_t). */
int gguf_writer_write_mem(struct gguf_writer *w, void **buf, size_t *len);

#endif /* LLMD_GGUF_WRITE_H */
