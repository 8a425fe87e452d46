/* gguf.c - open and validate a GGUF file (see gguf.h); accessors, name
 * lookups and the type tables are in gguf_meta.c, which calls nothing here.
 *
 * The file is mapped (or borrowed) whole and parsed once, front to back, with
 * a bounds-checked cursor. Every length read from the file is compared with
 * the bytes left before it is used, and every count is bounded by the
 * smallest possible encoding of its items before anything is allocated for
 * it, so a hostile count of 2^60 fails at once and what open allocates is a
 * small multiple of the file size. Values stay in the mapping: open builds
 * only indexes (the key and tensor tables, their hash tables, and one view
 * array per string array, since the tokenizer reads 150k-entry vocabularies
 * by index).
 *
 * Beyond the format itself, open rejects what would make a later reader
 * guess: empty keys, duplicate keys or tensor names, nested arrays, bools other than 0/1,
 * tensor types llmd cannot compute with, rows that are not whole blocks, and
 * tensors whose data overlap. Errors read "gguf: <what> at offset <N>: <why>",
 * <what> naming the header field, key or tensor.
 *
 * A mapped file that another process truncates while it is open still
 * faults (SIGBUS) on access: that is the cost of mmap, shared with ggml.
 */
#include "engine/model/gguf_impl.h"
#include "log.h"
#include "mem.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "GGUF values are read in host order");

#define GGUF_DEFAULT_ALIGNMENT 32
/* Smallest encodings, used to bound counts by the bytes left: a key/value
 * pair is at least an empty key (u64 length), a u32 type and a 1-byte value;
 * a tensor info an empty name, u32 n_dims, one u64 ne, u32 type, u64 offset. */
#define GGUF_MIN_KV_BYTES    13
#define GGUF_MIN_TINFO_BYTES 32
/* Longest part of a name quoted in an error message, in bytes. */
#define GGUF_ERR_NAME 64

typedef unsigned long long ull; /* for printf */

struct gguf_cur {
    const uint8_t *base;
    uint64_t len; /* bytes */
    uint64_t off; /* bytes from base */
    char *err;    /* NULL: no message wanted */
    size_t errlen;
    char what[96]; /* the item being parsed: "n_kv", "key 'x'", "tensor 'y'" */
};

__attribute__((format(printf, 3, 4))) static int cur_fail(struct gguf_cur *c, uint64_t off,
                                                          const char *fmt, ...) {
    if (c->err && c->errlen) {
        int n = snprintf(c->err, c->errlen, "gguf: %s at offset %llu: ", c->what, (ull)off);
        if (n >= 0 && (size_t)n < c->errlen) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(c->err + n, c->errlen - (size_t)n, fmt, ap);
            va_end(ap);
        }
    }
    return -EINVAL;
}

static int cur_nomem(struct gguf_cur *c) {
    if (c->err && c->errlen)
        snprintf(c->err, c->errlen, "gguf: out of memory while reading %s", c->what);
    return -ENOMEM;
}

/* Printable copy of a name from the file: at most GGUF_ERR_NAME bytes, other
 * than printable ASCII replaced by '?', "..." when cut. */
static void name_copy(char *dst, size_t cap, struct gguf_str s) {
    size_t k = 0;
    for (uint64_t i = 0; i < s.len && i < GGUF_ERR_NAME && k + 1 < cap; i++) {
        unsigned char ch = (unsigned char)s.ptr[i];
        dst[k++] = ch >= 0x20 && ch < 0x7f ? (char)ch : '?';
    }
    if (s.len > GGUF_ERR_NAME && k + 3 < cap) {
        memcpy(dst + k, "...", 3);
        k += 3;
    }
    dst[k] = '\0';
}

static void cur_what_name(struct gguf_cur *c, const char *kind, struct gguf_str name) {
    char n[GGUF_ERR_NAME + 4];
    name_copy(n, sizeof(n), name);
    snprintf(c->what, sizeof(c->what), "%s '%s'", kind, n);
}

static uint64_t cur_left(const struct gguf_cur *c) {
    return c->len - c->off;
}

static int cur_need(struct gguf_cur *c, uint64_t n, const char *field) {
    if (n <= cur_left(c))
        return 0;
    return cur_fail(c, c->off, "%s truncated: needs %llu bytes, %llu left", field, (ull)n,
                    (ull)cur_left(c));
}

static int cur_u32(struct gguf_cur *c, const char *field, uint32_t *v) {
    int rc = cur_need(c, 4, field);
    if (rc)
        return rc;
    memcpy(v, c->base + c->off, 4);
    c->off += 4;
    return 0;
}

static int cur_u64(struct gguf_cur *c, const char *field, uint64_t *v) {
    int rc = cur_need(c, 8, field);
    if (rc)
        return rc;
    memcpy(v, c->base + c->off, 8);
    c->off += 8;
    return 0;
}

/* A string: u64 length, then that many bytes, viewed in place. */
static int cur_str(struct gguf_cur *c, const char *field, struct gguf_str *s) {
    uint64_t at = c->off, n;
    int rc = cur_need(c, 8, field);
    if (rc)
        return rc;
    memcpy(&n, c->base + c->off, 8);
    c->off += 8;
    if (n > cur_left(c)) {
        return cur_fail(c, at, "%s length %llu exceeds the %llu bytes left", field, (ull)n,
                        (ull)cur_left(c));
    }
    s->ptr = (const char *)c->base + c->off;
    s->len = n;
    c->off += n;
    return 0;
}

/* A table for n entries: a power of two >= 2n, so probes stay short. */
static uint32_t *slots_alloc(uint64_t n, uint64_t *mask) {
    uint64_t cap = 8;
    while (cap < 2 * n)
        cap <<= 1;
    *mask = cap - 1;
    return mem_calloc(MEM_GGUF, cap, sizeof(uint32_t));
}

/* Index entry i by its name; false if the name is already there. */
static bool slots_insert(uint32_t *slots, uint64_t mask, const void *entries, size_t stride,
                         uint64_t i) {
    const struct gguf_str *s = gguf_entry_name(entries, stride, i);
    if (gguf_slots_find(slots, mask, entries, stride, s->ptr, s->len) >= 0)
        return false;
    uint64_t h = gguf_hash(s->ptr, s->len) & mask;
    while (slots[h])
        h = (h + 1) & mask;
    slots[h] = (uint32_t)(i + 1);
    return true;
}

static int parse_header(struct gguf *g, struct gguf_cur *c) {
    snprintf(c->what, sizeof(c->what), "magic");
    int rc = cur_need(c, 4, "magic");
    if (rc)
        return rc;
    const uint8_t *m = c->base;
    if (memcmp(m, "GGUF", 4) != 0) {
        return cur_fail(c, 0, "bad magic %02x %02x %02x %02x, want \"GGUF\"", m[0], m[1], m[2],
                        m[3]);
    }
    c->off = 4;
    snprintf(c->what, sizeof(c->what), "version");
    if ((rc = cur_u32(c, "version", &g->version)))
        return rc;
    /* v1 had 32-bit counts and lengths; v2 and v3 share this layout (v3 only
     * added big-endian files, which announce themselves as a huge version). */
    if (g->version != 2 && g->version != 3)
        return cur_fail(c, 4, "unsupported version %u (llmd reads 2 and 3)", g->version);
    snprintf(c->what, sizeof(c->what), "n_tensors");
    if ((rc = cur_u64(c, "n_tensors", &g->n_tensors)))
        return rc;
    snprintf(c->what, sizeof(c->what), "n_kv");
    if ((rc = cur_u64(c, "n_kv", &g->n_kv)))
        return rc;
    uint64_t left = cur_left(c);
    if (g->n_kv > left / GGUF_MIN_KV_BYTES || g->n_kv >= GGUF_MAX_ENTRIES) {
        return cur_fail(c, 16, "%llu key/value pairs cannot fit in the %llu bytes left",
                        (ull)g->n_kv, (ull)left);
    }
    snprintf(c->what, sizeof(c->what), "n_tensors");
    if (g->n_tensors > left / GGUF_MIN_TINFO_BYTES || g->n_tensors >= GGUF_MAX_ENTRIES ||
        g->n_kv * GGUF_MIN_KV_BYTES + g->n_tensors * GGUF_MIN_TINFO_BYTES > left) {
        return cur_fail(c, 8,
                        "%llu tensor infos and %llu key/value pairs cannot fit in the %llu "
                        "bytes left",
                        (ull)g->n_tensors, (ull)g->n_kv, (ull)left);
    }
    return 0;
}

/* n packed scalars of type t; bools must be 0 or 1 (gguf.md: anything else
 * means a broken writer). The caller has bounded n * size by the bytes left. */
static int parse_scalars(struct gguf_cur *c, enum gguf_vtype t, uint64_t n, const uint8_t **val) {
    uint64_t bytes = n * gguf_vtype_size(t);
    int rc = cur_need(c, bytes, "value");
    if (rc)
        return rc;
    const uint8_t *p = c->base + c->off;
    for (uint64_t i = 0; t == GGUF_VT_BOOL && i < n; i++) {
        if (p[i] > 1)
            return cur_fail(c, c->off + i, "bool value %u is neither 0 nor 1", p[i]);
    }
    *val = p;
    c->off += bytes;
    return 0;
}

static int parse_str_arr(struct gguf_cur *c, struct gguf_kv *kv, uint64_t at) {
    if (kv->n > cur_left(c) / 8) {
        return cur_fail(c, at, "array count %llu of strings exceeds the %llu bytes left",
                        (ull)kv->n, (ull)cur_left(c));
    }
    struct gguf_str *items = mem_alloc(MEM_GGUF, kv->n * sizeof(*items));
    if (!items)
        return cur_nomem(c);
    kv->items = items;
    for (uint64_t j = 0; j < kv->n; j++) {
        uint64_t n;
        if (cur_left(c) < 8)
            return cur_fail(c, c->off, "string #%llu of the array truncated", (ull)j);
        memcpy(&n, c->base + c->off, 8);
        if (n > cur_left(c) - 8) {
            return cur_fail(c, c->off,
                            "string #%llu of the array: length %llu exceeds the %llu "
                            "bytes left",
                            (ull)j, (ull)n, (ull)(cur_left(c) - 8));
        }
        items[j].ptr = (const char *)c->base + c->off + 8;
        items[j].len = n;
        c->off += 8 + n;
    }
    return 0;
}

static int parse_value(struct gguf_cur *c, struct gguf_kv *kv) {
    uint64_t at = c->off;
    uint32_t t;
    int rc = cur_u32(c, "value type", &t);
    if (rc)
        return rc;
    if (t > GGUF_VT_FLOAT64)
        return cur_fail(c, at, "unknown value type %u", t);
    kv->type = (enum gguf_vtype)t;
    if (t == GGUF_VT_STRING)
        return cur_str(c, "string", &kv->str);
    if (t != GGUF_VT_ARRAY)
        return parse_scalars(c, kv->type, 1, &kv->val);

    at = c->off;
    if ((rc = cur_u32(c, "array element type", &t)))
        return rc;
    if (t > GGUF_VT_FLOAT64)
        return cur_fail(c, at, "unknown array element type %u", t);
    if (t == GGUF_VT_ARRAY)
        return cur_fail(c, at, "nested arrays (array of arrays) are not supported");
    kv->elem_type = (enum gguf_vtype)t;
    at = c->off;
    if ((rc = cur_u64(c, "array count", &kv->n)))
        return rc;
    if (t == GGUF_VT_STRING)
        return parse_str_arr(c, kv, at);
    if (kv->n > cur_left(c) / gguf_vtype_size(kv->elem_type)) {
        return cur_fail(c, at, "array count %llu of %s exceeds the %llu bytes left", (ull)kv->n,
                        gguf_vtype_name(kv->elem_type), (ull)cur_left(c));
    }
    return parse_scalars(c, kv->elem_type, kv->n, &kv->val);
}

static int check_alignment(struct gguf *g, struct gguf_cur *c, const struct gguf_kv *kv,
                           uint64_t at) {
    if (kv->type != GGUF_VT_UINT32) {
        return cur_fail(c, at, "general.alignment has type %s, want u32",
                        gguf_vtype_name(kv->type));
    }
    uint32_t a;
    memcpy(&a, kv->val, 4);
    if (a == 0 || (a & (a - 1)) != 0)
        return cur_fail(c, at, "alignment %u is not a nonzero power of 2", a);
    g->alignment = a;
    return 0;
}

static int parse_kvs(struct gguf *g, struct gguf_cur *c) {
    g->kv = mem_calloc(MEM_GGUF, g->n_kv, sizeof(*g->kv));
    g->kv_slots = slots_alloc(g->n_kv, &g->kv_mask);
    if (!g->kv || !g->kv_slots)
        return cur_nomem(c);
    for (uint64_t i = 0; i < g->n_kv; i++) {
        struct gguf_kv *kv = &g->kv[i];
        uint64_t at = c->off;
        snprintf(c->what, sizeof(c->what), "key #%llu", (ull)i);
        int rc = cur_str(c, "key", &kv->key);
        if (rc)
            return rc;
        /* an empty key names nothing a reader could ask for: a writer bug */
        if (kv->key.len == 0)
            return cur_fail(c, at, "empty key");
        cur_what_name(c, "key", kv->key);
        if (!slots_insert(g->kv_slots, g->kv_mask, g->kv, sizeof(*g->kv), i))
            return cur_fail(c, at, "duplicate key");
        uint64_t vat = c->off;
        if ((rc = parse_value(c, kv)))
            return rc;
        if (gguf_str_eq(kv->key, "general.alignment") && (rc = check_alignment(g, c, kv, vat)))
            return rc;
    }
    return 0;
}

static int parse_tensor_info(struct gguf *g, struct gguf_cur *c, uint64_t i) {
    struct gguf_tensor *t = &g->tensors[i];
    uint64_t at = c->off;
    snprintf(c->what, sizeof(c->what), "tensor #%llu", (ull)i);
    int rc = cur_str(c, "name", &t->name);
    if (rc)
        return rc;
    cur_what_name(c, "tensor", t->name);
    if (!slots_insert(g->t_slots, g->t_mask, g->tensors, sizeof(*g->tensors), i))
        return cur_fail(c, at, "duplicate tensor name");

    at = c->off;
    if ((rc = cur_u32(c, "n_dims", &t->n_dims)))
        return rc;
    if (t->n_dims < 1 || t->n_dims > 4)
        return cur_fail(c, at, "n_dims %u is not in 1..4", t->n_dims);
    uint64_t n_elem = 1;
    for (uint32_t d = 0; d < 4; d++)
        t->ne[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        at = c->off;
        if ((rc = cur_u64(c, "ne", &t->ne[d])))
            return rc;
        if (t->ne[d] == 0)
            return cur_fail(c, at, "ne[%u] is 0", d);
        if (t->ne[d] > INT64_MAX) /* ggml keeps ne as int64_t */
            return cur_fail(c, at, "ne[%u] = %llu exceeds 2^63-1", d, (ull)t->ne[d]);
        if (__builtin_mul_overflow(n_elem, t->ne[d], &n_elem))
            return cur_fail(c, at, "element count overflows at ne[%u]", d);
    }

    at = c->off;
    uint32_t type;
    if ((rc = cur_u32(c, "tensor type", &type)))
        return rc;
    uint32_t blk = gguf_type_block((enum gguf_ttype)type);
    if (blk == 0) {
        return cur_fail(c, at, "unsupported tensor type %u (%s)", type,
                        gguf_type_name((enum gguf_ttype)type));
    }
    t->type = (enum gguf_ttype)type;
    if (t->ne[0] % blk != 0) {
        /* llama-quantize falls back to another type for such rows (a 64-wide
         * K-quant row becomes q5_0, q8_0 or f16); a file that did not is bad */
        char shape[96];
        int k = snprintf(shape, sizeof(shape), "%llu", (ull)t->ne[0]);
        for (uint32_t d = 1; d < t->n_dims && k > 0 && (size_t)k < sizeof(shape); d++)
            k += snprintf(shape + k, sizeof(shape) - (size_t)k, ", %llu", (ull)t->ne[d]);
        return cur_fail(c, at,
                        "shape [%s]: row length ne[0] = %llu is not a multiple of %u, the block "
                        "size of %s",
                        shape, (ull)t->ne[0], blk, gguf_type_name(t->type));
    }
    t->bytes = gguf_type_bytes(t->type, n_elem);
    if (t->bytes == 0)
        return cur_fail(c, at, "byte size of %llu elements overflows", (ull)n_elem);

    at = c->off;
    if ((rc = cur_u64(c, "data offset", &t->offset)))
        return rc;
    if (t->offset % g->alignment != 0) {
        return cur_fail(c, at, "data offset %llu is not a multiple of the alignment %llu",
                        (ull)t->offset, (ull)g->alignment);
    }
    return 0;
}

struct gguf_span {
    uint64_t start, end; /* bytes, within the data section */
    uint64_t i;          /* tensor index */
};

static int span_cmp(const void *a, const void *b) {
    const struct gguf_span *x = a, *y = b;
    return x->start < y->start ? -1 : x->start > y->start;
}

/* Place the data section after the tensor infos and check that each
 * tensor's data lies inside it and overlaps no other. */
static int place_tensors(struct gguf *g, struct gguf_cur *c, const uint64_t *info_off) {
    snprintf(c->what, sizeof(c->what), "data section");
    uint64_t a = g->alignment;
    g->data_off = (c->off + a - 1) & ~(a - 1); /* c->off <= len < 2^63, a <= 2^31 */
    if (g->n_tensors == 0) {
        /* Vocabulary-only files may end without the padding. */
        if (g->data_off > g->len)
            g->data_off = g->len;
        return 0;
    }
    if (g->data_off > g->len) {
        return cur_fail(c, c->off,
                        "tensor data would start at %llu, past the end of the file "
                        "(%llu bytes)",
                        (ull)g->data_off, (ull)g->len);
    }
    uint64_t data_len = g->len - g->data_off;
    struct gguf_span *spans = mem_alloc(MEM_GGUF, g->n_tensors * sizeof(*spans));
    if (!spans)
        return cur_nomem(c);
    int rc = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        struct gguf_tensor *t = &g->tensors[i];
        if (t->offset > data_len || t->bytes > data_len - t->offset) {
            cur_what_name(c, "tensor", t->name);
            rc = cur_fail(c, info_off[i],
                          "data offset %llu + %llu bytes runs past the end of "
                          "the data section (%llu bytes)",
                          (ull)t->offset, (ull)t->bytes, (ull)data_len);
            goto out;
        }
        t->data = g->base + g->data_off + t->offset;
        spans[i] = (struct gguf_span){t->offset, t->offset + t->bytes, i};
    }
    qsort(spans, g->n_tensors, sizeof(*spans), span_cmp);
    for (uint64_t k = 1; k < g->n_tensors; k++) {
        if (spans[k].start < spans[k - 1].end) {
            char other[GGUF_ERR_NAME + 4];
            name_copy(other, sizeof(other), g->tensors[spans[k - 1].i].name);
            cur_what_name(c, "tensor", g->tensors[spans[k].i].name);
            rc = cur_fail(c, info_off[spans[k].i], "data at offset %llu overlaps tensor '%s'",
                          (ull)spans[k].start, other);
            goto out;
        }
    }
out:
    mem_free(spans);
    return rc;
}

static int parse_tensors(struct gguf *g, struct gguf_cur *c) {
    snprintf(c->what, sizeof(c->what), "tensor infos");
    g->tensors = mem_calloc(MEM_GGUF, g->n_tensors, sizeof(*g->tensors));
    g->t_slots = slots_alloc(g->n_tensors, &g->t_mask);
    uint64_t *info_off = mem_alloc(MEM_GGUF, g->n_tensors * sizeof(uint64_t));
    int rc = 0;
    if (!g->tensors || !g->t_slots || !info_off) {
        rc = cur_nomem(c);
        goto out;
    }
    for (uint64_t i = 0; i < g->n_tensors && rc == 0; i++) {
        info_off[i] = c->off;
        rc = parse_tensor_info(g, c, i);
    }
    if (rc == 0)
        rc = place_tensors(g, c, info_off);
out:
    mem_free(info_off);
    return rc;
}

/* Parse [base, base+len). On success *out owns the indexes, and unmaps base
 * at close when `mapped`; on failure nothing is left allocated and base is
 * the caller's to release. */
static int gguf_parse(const uint8_t *base, size_t len, bool mapped, struct gguf **out, char *err,
                      size_t errlen) {
    struct gguf_cur c = {.base = base, .len = len, .err = err, .errlen = errlen};
    snprintf(c.what, sizeof(c.what), "header");
    struct gguf *g = mem_calloc(MEM_GGUF, 1, sizeof(*g));
    if (!g)
        return cur_nomem(&c);
    g->base = base;
    g->len = len;
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    int rc = parse_header(g, &c);
    if (rc == 0)
        rc = parse_kvs(g, &c);
    if (rc == 0)
        rc = parse_tensors(g, &c);
    if (rc) {
        gguf_close(g);
        return rc;
    }
    g->mapped = mapped;
    *out = g;
    return 0;
}

int gguf_open_mem(const void *buf, size_t len, struct gguf **out, char *errbuf, size_t errlen) {
    assert(out);
    assert(buf || len == 0);
    if (errbuf && errlen)
        errbuf[0] = '\0';
    static const uint8_t empty[1];
    return gguf_parse(buf ? buf : empty, len, false, out, errbuf, errlen);
}

static int open_fail(int rc, const char *path, const char *what, char *errbuf, size_t errlen) {
    if (errbuf && errlen) {
        char b[128];
        snprintf(errbuf, errlen, "gguf: %s '%s': %s", what, path, strerror_r(-rc, b, sizeof(b)));
    }
    return rc;
}

int gguf_open(const char *path, struct gguf **out, char *errbuf, size_t errlen) {
    assert(path && out);
    if (errbuf && errlen)
        errbuf[0] = '\0';
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return open_fail(-errno, path, "open", errbuf, errlen);
    struct stat st;
    if (fstat(fd, &st) < 0) {
        int rc = -errno;
        close(fd);
        return open_fail(rc, path, "stat", errbuf, errlen);
    }
    if (!S_ISREG(st.st_mode) || st.st_size == 0) {
        close(fd);
        if (errbuf && errlen) {
            snprintf(errbuf, errlen, "gguf: file '%s' at offset 0: %s", path,
                     !S_ISREG(st.st_mode) ? "not a regular file" : "file is empty");
        }
        return -EINVAL;
    }
    size_t len = (size_t)st.st_size;
    void *p = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    int rc = p == MAP_FAILED ? -errno : 0;
    close(fd);
    if (rc)
        return open_fail(rc, path, "mmap", errbuf, errlen);
    rc = gguf_parse(p, len, true, out, errbuf, errlen);
    if (rc)
        munmap(p, len);
    return rc;
}

size_t gguf_range_release(const struct gguf *g, const void *p, size_t len) {
    if (!g || !g->mapped || !p || len == 0)
        return 0;
    const uintptr_t base = (uintptr_t)g->base, a = (uintptr_t)p;
    if (a < base || a - base > g->len || len > g->len - (a - base))
        return 0;
    const long ps = sysconf(_SC_PAGESIZE);
    const uintptr_t page = ps > 0 ? (uintptr_t)ps : 4096u;
    const uintptr_t lo = (a + page - 1) & ~(page - 1), hi = (a + len) & ~(page - 1);
    if (hi <= lo)
        return 0;
    if (madvise((void *)lo, hi - lo, MADV_DONTNEED) != 0) {
        LOG_WARN("gguf", "madvise(DONTNEED) of %zu bytes of the mapping: %s", (size_t)(hi - lo),
                 strerror(errno));
        return 0;
    }
    return hi - lo;
}

void gguf_close(struct gguf *g) {
    if (!g)
        return;
    for (uint64_t i = 0; g->kv && i < g->n_kv; i++)
        mem_free((void *)g->kv[i].items);
    mem_free(g->kv);
    mem_free(g->kv_slots);
    mem_free(g->tensors);
    mem_free(g->t_slots);
    if (g->mapped)
        munmap((void *)g->base, g->len);
    mem_free(g);
}
