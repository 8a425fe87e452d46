/* gguf_write.c - build GGUF v3 files (see gguf_write.h).
 *
 * Each metadata value is encoded when it is set (the bytes that follow the
 * value type in the file), so writing is a walk that concatenates. One walk,
 * emit(), serves three sinks: a counting sink that sizes the file, a memory
 * sink, and a file sink that stages small pieces in a 1 MiB buffer (the
 * tokenizer arrays are 150k tiny strings: one write(2) each would be slow)
 * and passes large tensor data straight to write(2), so a big model is never
 * copied whole.
 */
#include "engine/model/gguf_write.h"
#include "engine/model/gguf_impl.h"
#include "mem.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define GGUF_WRITE_VERSION 3
#define GGUF_WRITE_ALIGN   32
/* File staging buffer: large enough that metadata costs a handful of
 * syscalls, small next to any model. */
#define GGUF_STAGE_BYTES (1u << 20)

struct gguf_wkv {
    char *key; /* owned */
    enum gguf_vtype type;
    uint8_t *val; /* owned: the encoded value */
    size_t val_bytes;
};

struct gguf_wtensor {
    char *name; /* owned */
    enum gguf_ttype type;
    uint32_t n_dims;
    uint64_t ne[4];
    const void *data; /* borrowed; NULL = zeros */
    uint64_t bytes;
    uint64_t offset; /* set by layout() */
};

struct gguf_writer {
    struct gguf_wkv *kv;
    size_t n_kv, cap_kv;
    struct gguf_wtensor *t;
    size_t n_t, cap_t;
    uint32_t alignment;
};

int gguf_writer_create(struct gguf_writer **out) {
    assert(out);
    struct gguf_writer *w = mem_calloc(MEM_GGUF, 1, sizeof(*w));
    if (!w)
        return -ENOMEM;
    w->alignment = GGUF_WRITE_ALIGN;
    *out = w;
    return 0;
}

void gguf_writer_destroy(struct gguf_writer *w) {
    if (!w)
        return;
    for (size_t i = 0; i < w->n_kv; i++) {
        mem_free(w->kv[i].key);
        mem_free(w->kv[i].val);
    }
    for (size_t i = 0; i < w->n_t; i++)
        mem_free(w->t[i].name);
    mem_free(w->kv);
    mem_free(w->t);
    mem_free(w);
}

/* Room for one more element in an array of `size`-byte elements. */
static int grow(void **arr, size_t *cap, size_t n, size_t size) {
    if (n < *cap)
        return 0;
    size_t ncap = *cap ? *cap * 2 : 16;
    void *p = *arr ? mem_realloc(*arr, ncap * size) : mem_alloc(MEM_GGUF, ncap * size);
    if (!p)
        return -ENOMEM;
    *arr = p;
    *cap = ncap;
    return 0;
}

/* Store an encoded value under key; takes ownership of val (freed on
 * failure). A key already set keeps its place and gets the new value. */
static int kv_put(struct gguf_writer *w, const char *key, enum gguf_vtype type, uint8_t *val,
                  size_t val_bytes) {
    assert(w && key);
    if (key[0] == '\0') { /* gguf_open() refuses it */
        mem_free(val);
        return -EINVAL;
    }
    uint32_t align = w->alignment;
    if (strcmp(key, "general.alignment") == 0) {
        align = 0;
        if (type == GGUF_VT_UINT32)
            memcpy(&align, val, 4);
        if (align == 0 || (align & (align - 1)) != 0) {
            mem_free(val);
            return -EINVAL;
        }
    }
    for (size_t i = 0; i < w->n_kv; i++) {
        if (strcmp(w->kv[i].key, key) == 0) {
            mem_free(w->kv[i].val);
            w->kv[i].type = type;
            w->kv[i].val = val;
            w->kv[i].val_bytes = val_bytes;
            w->alignment = align;
            return 0;
        }
    }
    char *k = mem_strdup(MEM_GGUF, key);
    if (!k || grow((void **)&w->kv, &w->cap_kv, w->n_kv, sizeof(*w->kv)) != 0) {
        mem_free(k);
        mem_free(val);
        return -ENOMEM;
    }
    w->kv[w->n_kv++] = (struct gguf_wkv){k, type, val, val_bytes};
    w->alignment = align;
    return 0;
}

int gguf_writer_set_val(struct gguf_writer *w, const char *key, enum gguf_vtype type,
                        const void *val) {
    size_t size = gguf_vtype_size(type);
    if (size == 0)
        return -EINVAL;
    uint8_t *v = mem_alloc(MEM_GGUF, size);
    if (!v)
        return -ENOMEM;
    if (type == GGUF_VT_BOOL)
        v[0] = *(const bool *)val ? 1 : 0;
    else
        memcpy(v, val, size);
    return kv_put(w, key, type, v, size);
}

int gguf_writer_set_u32(struct gguf_writer *w, const char *key, uint32_t v) {
    return gguf_writer_set_val(w, key, GGUF_VT_UINT32, &v);
}

int gguf_writer_set_i32(struct gguf_writer *w, const char *key, int32_t v) {
    return gguf_writer_set_val(w, key, GGUF_VT_INT32, &v);
}

int gguf_writer_set_u64(struct gguf_writer *w, const char *key, uint64_t v) {
    return gguf_writer_set_val(w, key, GGUF_VT_UINT64, &v);
}

int gguf_writer_set_f32(struct gguf_writer *w, const char *key, float v) {
    return gguf_writer_set_val(w, key, GGUF_VT_FLOAT32, &v);
}

int gguf_writer_set_bool(struct gguf_writer *w, const char *key, bool v) {
    return gguf_writer_set_val(w, key, GGUF_VT_BOOL, &v);
}

static uint8_t *put_u32(uint8_t *p, uint32_t v) {
    memcpy(p, &v, 4);
    return p + 4;
}

static uint8_t *put_u64(uint8_t *p, uint64_t v) {
    memcpy(p, &v, 8);
    return p + 8;
}

int gguf_writer_set_str(struct gguf_writer *w, const char *key, const char *s) {
    assert(s);
    size_t n = strlen(s);
    uint8_t *v = mem_alloc(MEM_GGUF, 8 + n);
    if (!v)
        return -ENOMEM;
    memcpy(put_u64(v, n), s, n);
    return kv_put(w, key, GGUF_VT_STRING, v, 8 + n);
}

int gguf_writer_set_arr_str(struct gguf_writer *w, const char *key, const char *const *items,
                            const size_t *lens, uint64_t n) {
    assert(items || n == 0);
    size_t bytes = 12; /* element type, count */
    for (uint64_t i = 0; i < n; i++) {
        size_t len = lens ? lens[i] : strlen(items[i]);
        if (__builtin_add_overflow(bytes, len, &bytes) || __builtin_add_overflow(bytes, 8, &bytes))
            return -EINVAL;
    }
    uint8_t *v = mem_alloc(MEM_GGUF, bytes);
    if (!v)
        return -ENOMEM;
    uint8_t *p = put_u64(put_u32(v, GGUF_VT_STRING), n);
    for (uint64_t i = 0; i < n; i++) {
        size_t len = lens ? lens[i] : strlen(items[i]);
        p = put_u64(p, len);
        memcpy(p, items[i], len);
        p += len;
    }
    assert((size_t)(p - v) == bytes);
    return kv_put(w, key, GGUF_VT_ARRAY, v, bytes);
}

int gguf_writer_set_arr(struct gguf_writer *w, const char *key, enum gguf_vtype elem,
                        const void *data, uint64_t n) {
    size_t size = gguf_vtype_size(elem), bytes;
    if (size == 0 || n > (SIZE_MAX - 12) / size)
        return -EINVAL;
    assert(data || n == 0);
    bytes = (size_t)n * size;
    for (uint64_t i = 0; elem == GGUF_VT_BOOL && i < n; i++) {
        if (((const uint8_t *)data)[i] > 1)
            return -EINVAL;
    }
    uint8_t *v = mem_alloc(MEM_GGUF, 12 + bytes);
    if (!v)
        return -ENOMEM;
    uint8_t *p = put_u64(put_u32(v, elem), n);
    if (bytes)
        memcpy(p, data, bytes);
    return kv_put(w, key, GGUF_VT_ARRAY, v, 12 + bytes);
}

int gguf_writer_add_tensor(struct gguf_writer *w, const char *name, enum gguf_ttype type,
                           uint32_t n_dims, const uint64_t *ne, const void *data) {
    assert(w && name && (ne || n_dims == 0));
    uint32_t blk = gguf_type_block(type);
    if (blk == 0 || n_dims < 1 || n_dims > 4 || ne[0] % blk != 0)
        return -EINVAL;
    struct gguf_wtensor t = {.type = type, .n_dims = n_dims, .data = data};
    uint64_t n_elem = 1;
    for (uint32_t d = 0; d < 4; d++) {
        t.ne[d] = d < n_dims ? ne[d] : 1;
        if (t.ne[d] == 0 || t.ne[d] > INT64_MAX || __builtin_mul_overflow(n_elem, t.ne[d], &n_elem))
            return -EINVAL;
    }
    t.bytes = gguf_type_bytes(type, n_elem);
    if (t.bytes == 0 || t.bytes > INT64_MAX)
        return -EINVAL;
    for (size_t i = 0; i < w->n_t; i++) {
        if (strcmp(w->t[i].name, name) == 0)
            return -EEXIST;
    }
    t.name = mem_strdup(MEM_GGUF, name);
    if (!t.name || grow((void **)&w->t, &w->cap_t, w->n_t, sizeof(*w->t)) != 0) {
        mem_free(t.name);
        return -ENOMEM;
    }
    w->t[w->n_t++] = t;
    return 0;
}

/* Where the output goes: counting only (fd < 0, buf NULL), a memory buffer
 * of the exact size (fd < 0), or a file through the staging buffer. */
struct gguf_sink {
    int fd;
    uint8_t *buf;
    size_t cap, used; /* file: staging buffer bytes */
    uint64_t total;   /* bytes emitted */
    int err;          /* first -errno; later output is dropped */
};

static int write_all(int fd, const uint8_t *p, size_t n) {
    while (n > 0) {
        ssize_t k = write(fd, p, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0)
            return -errno;
        if (k == 0)
            return -ENOSPC;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

static void sink_flush(struct gguf_sink *s) {
    if (s->fd >= 0 && s->used && !s->err)
        s->err = write_all(s->fd, s->buf, s->used);
    s->used = 0;
}

/* Emit n bytes from p, or n zero bytes when p is NULL. */
static void sink_put(struct gguf_sink *s, const void *p, uint64_t n) {
    if (s->err || n == 0)
        return;
    if (s->fd < 0) {
        if (s->buf) {
            if (p)
                memcpy(s->buf + s->total, p, n);
            else
                memset(s->buf + s->total, 0, n);
        }
        s->total += n;
        return;
    }
    s->total += n;
    if (p && n >= s->cap) {
        sink_flush(s);
        if (!s->err)
            s->err = write_all(s->fd, p, n);
        return;
    }
    while (n > 0 && !s->err) {
        if (s->used == s->cap)
            sink_flush(s);
        size_t k = s->cap - s->used < n ? s->cap - s->used : (size_t)n;
        if (p) {
            memcpy(s->buf + s->used, p, k);
            p = (const uint8_t *)p + k;
        } else {
            memset(s->buf + s->used, 0, k);
        }
        s->used += k;
        n -= k;
    }
}

static void sink_u32(struct gguf_sink *s, uint32_t v) {
    sink_put(s, &v, 4);
}

static void sink_u64(struct gguf_sink *s, uint64_t v) {
    sink_put(s, &v, 8);
}

static void sink_str(struct gguf_sink *s, const char *str) {
    uint64_t n = strlen(str);
    sink_u64(s, n);
    sink_put(s, str, n);
}

static uint64_t align_up(uint64_t x, uint64_t a) {
    return (x + a - 1) & ~(a - 1);
}

/* Offsets of the tensors in the data section, in order added; returns the
 * data section size, or 0 with -EFBIG in *rc when it overflows. */
static uint64_t layout(struct gguf_writer *w, int *rc) {
    uint64_t off = 0;
    for (size_t i = 0; i < w->n_t; i++) {
        w->t[i].offset = off;
        uint64_t padded = align_up(w->t[i].bytes, w->alignment);
        if (padded < w->t[i].bytes || __builtin_add_overflow(off, padded, &off)) {
            *rc = -EFBIG;
            return 0;
        }
    }
    *rc = 0;
    return off;
}

static void emit(const struct gguf_writer *w, struct gguf_sink *s) {
    sink_put(s, "GGUF", 4);
    sink_u32(s, GGUF_WRITE_VERSION);
    sink_u64(s, w->n_t);
    sink_u64(s, w->n_kv);
    for (size_t i = 0; i < w->n_kv; i++) {
        sink_str(s, w->kv[i].key);
        sink_u32(s, w->kv[i].type);
        sink_put(s, w->kv[i].val, w->kv[i].val_bytes);
    }
    for (size_t i = 0; i < w->n_t; i++) {
        const struct gguf_wtensor *t = &w->t[i];
        sink_str(s, t->name);
        sink_u32(s, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims; d++)
            sink_u64(s, t->ne[d]);
        sink_u32(s, t->type);
        sink_u64(s, t->offset);
    }
    sink_put(s, NULL, align_up(s->total, w->alignment) - s->total);
    for (size_t i = 0; i < w->n_t; i++) {
        sink_put(s, w->t[i].data, w->t[i].bytes);
        sink_put(s, NULL, align_up(s->total, w->alignment) - s->total);
    }
}

int gguf_writer_write_mem(struct gguf_writer *w, void **buf, size_t *len) {
    assert(w && buf && len);
    int rc;
    layout(w, &rc);
    if (rc)
        return rc;
    struct gguf_sink s = {.fd = -1};
    emit(w, &s);
    if (s.total > SIZE_MAX)
        return -EFBIG;
    uint64_t want = s.total;
    s = (struct gguf_sink){.fd = -1, .buf = mem_alloc(MEM_GGUF, want)};
    if (!s.buf)
        return -ENOMEM;
    emit(w, &s);
    assert(s.total == want);
    *buf = s.buf;
    *len = (size_t)want;
    return 0;
}

int gguf_writer_write_file(struct gguf_writer *w, const char *path) {
    assert(w && path);
    int rc;
    layout(w, &rc);
    if (rc)
        return rc;
    struct gguf_sink s = {.cap = GGUF_STAGE_BYTES};
    s.buf = mem_alloc(MEM_GGUF, s.cap);
    if (!s.buf)
        return -ENOMEM;
    s.fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (s.fd < 0) {
        rc = -errno;
        mem_free(s.buf);
        return rc;
    }
    /* Only a regular file is removed on failure: never a device such as
     * /dev/full that a test writes to. */
    struct stat st;
    bool regular = fstat(s.fd, &st) == 0 && S_ISREG(st.st_mode);
    emit(w, &s);
    sink_flush(&s);
    rc = s.err;
    if (close(s.fd) < 0 && rc == 0)
        rc = -errno;
    mem_free(s.buf);
    if (rc && regular)
        unlink(path);
    return rc;
}
