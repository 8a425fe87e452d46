/* gguf_tmp.c - TEMPORARY, replaced by engine/gguf.c. DELETE THIS FILE AT MERGE.
 *
 * A throwaway subset of engine/gguf.h written on branch `tok` only so that the
 * tokenizer and its tests can load real GGUF files before the real reader
 * lands. It parses the header and the key/value metadata (bounds-checked),
 * ignores tensors entirely, and implements only the accessors tok.c uses:
 * gguf_open, gguf_open_mem, gguf_close, gguf_get_u32, gguf_get_bool,
 * gguf_get_str, gguf_get_arr, gguf_get_str_arr, gguf_str_eq. The real
 * engine/gguf.c defines the same symbols, so both cannot be linked together:
 * delete this file when merging engine/gguf.c.
 */
#include "engine/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mem.h"

struct gguf_kv {
    struct gguf_str key;
    enum gguf_vtype type;
    enum gguf_vtype elem_type; /* arrays only */
    uint64_t n;                /* arrays only */
    const uint8_t *val;        /* start of the value (for arrays: of the elements) */
    struct gguf_str *items;    /* string arrays only, [n] */
};

struct gguf {
    const uint8_t *base;
    size_t len;
    bool mapped;
    uint32_t version;
    uint64_t n_kv;
    struct gguf_kv *kv;
};

struct rd {
    const uint8_t *p, *end;
};

static int rd_take(struct rd *r, size_t n, const uint8_t **out) {
    if ((size_t)(r->end - r->p) < n)
        return -EINVAL;
    *out = r->p;
    r->p += n;
    return 0;
}

static int rd_u32(struct rd *r, uint32_t *v) {
    const uint8_t *p;
    if (rd_take(r, 4, &p))
        return -EINVAL;
    memcpy(v, p, 4);
    return 0;
}

static int rd_u64(struct rd *r, uint64_t *v) {
    const uint8_t *p;
    if (rd_take(r, 8, &p))
        return -EINVAL;
    memcpy(v, p, 8);
    return 0;
}

static int rd_str(struct rd *r, struct gguf_str *s) {
    const uint8_t *p;
    if (rd_u64(r, &s->len) || s->len > (uint64_t)(r->end - r->p) || rd_take(r, s->len, &p))
        return -EINVAL;
    s->ptr = (const char *)p;
    return 0;
}

static size_t vt_size(uint32_t t) {
    static const size_t sz[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    return t < sizeof(sz) / sizeof(sz[0]) ? sz[t] : 0;
}

static int parse_kv(struct rd *r, struct gguf_kv *kv) {
    uint32_t t;
    if (rd_str(r, &kv->key) || rd_u32(r, &t))
        return -EINVAL;
    kv->type = (enum gguf_vtype)t;
    kv->val = r->p;
    if (t == GGUF_VT_STRING) {
        struct gguf_str s;
        return rd_str(r, &s);
    }
    if (t != GGUF_VT_ARRAY) {
        const uint8_t *p;
        return vt_size(t) ? rd_take(r, vt_size(t), &p) : -EINVAL;
    }
    uint32_t et;
    if (rd_u32(r, &et) || rd_u64(r, &kv->n))
        return -EINVAL;
    kv->elem_type = (enum gguf_vtype)et;
    kv->val = r->p;
    if (et == GGUF_VT_STRING) {
        if (kv->n > (uint64_t)(r->end - r->p) / 8)
            return -EINVAL;
        kv->items = mem_alloc(MEM_GGUF, kv->n * sizeof(*kv->items) + 1);
        if (!kv->items)
            return -ENOMEM;
        for (uint64_t i = 0; i < kv->n; i++)
            if (rd_str(r, &kv->items[i]))
                return -EINVAL;
        return 0;
    }
    const uint8_t *p;
    size_t es = vt_size(et);
    if (!es || kv->n > (uint64_t)(r->end - r->p) / es)
        return -EINVAL;
    return rd_take(r, kv->n * es, &p);
}

int gguf_open_mem(const void *buf, size_t len, struct gguf **out, char *errbuf, size_t errlen) {
    struct gguf *g = mem_calloc(MEM_GGUF, 1, sizeof(*g));
    if (!g)
        return -ENOMEM;
    g->base = buf;
    g->len = len;
    struct rd r = {buf, (const uint8_t *)buf + len};
    const uint8_t *magic;
    uint64_t n_tensors;
    int rc = -EINVAL;
    if (rd_take(&r, 4, &magic) || memcmp(magic, "GGUF", 4) || rd_u32(&r, &g->version) ||
        rd_u64(&r, &n_tensors) || rd_u64(&r, &g->n_kv) || g->n_kv > len / 12)
        goto fail;
    rc = -ENOMEM;
    g->kv = mem_calloc(MEM_GGUF, g->n_kv + 1, sizeof(*g->kv));
    if (!g->kv)
        goto fail;
    for (uint64_t i = 0; i < g->n_kv; i++) {
        rc = parse_kv(&r, &g->kv[i]);
        if (rc)
            goto fail;
    }
    *out = g;
    return 0;
fail:
    if (errbuf && errlen)
        snprintf(errbuf, errlen, "gguf_tmp: bad header or metadata at offset %zu",
                 (size_t)(r.p - (const uint8_t *)buf));
    gguf_close(g);
    return rc;
}

int gguf_open(const char *path, struct gguf **out, char *errbuf, size_t errlen) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    struct stat st;
    if (fstat(fd, &st) < 0) {
        int e = -errno;
        close(fd);
        return e;
    }
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (p == MAP_FAILED)
        return -ENOMEM;
    int rc = gguf_open_mem(p, (size_t)st.st_size, out, errbuf, errlen);
    if (rc) {
        munmap(p, (size_t)st.st_size);
        return rc;
    }
    (*out)->mapped = true;
    return 0;
}

void gguf_close(struct gguf *g) {
    if (!g)
        return;
    if (g->kv)
        for (uint64_t i = 0; i < g->n_kv; i++)
            mem_free(g->kv[i].items);
    mem_free(g->kv);
    if (g->mapped)
        munmap((void *)g->base, g->len);
    mem_free(g);
}

bool gguf_str_eq(struct gguf_str s, const char *c) {
    size_t n = strlen(c);
    return s.len == n && memcmp(s.ptr, c, n) == 0;
}

static const struct gguf_kv *find(const struct gguf *g, const char *key) {
    for (uint64_t i = 0; i < g->n_kv; i++)
        if (gguf_str_eq(g->kv[i].key, key))
            return &g->kv[i];
    return NULL;
}

int gguf_get_u32(const struct gguf *g, const char *key, uint32_t *out) {
    const struct gguf_kv *kv = find(g, key);
    if (!kv)
        return -ENOENT;
    int64_t v;
    switch (kv->type) {
    case GGUF_VT_UINT8:
        v = kv->val[0];
        break;
    case GGUF_VT_UINT16: {
        uint16_t x;
        memcpy(&x, kv->val, 2);
        v = x;
        break;
    }
    case GGUF_VT_UINT32: {
        uint32_t x;
        memcpy(&x, kv->val, 4);
        v = x;
        break;
    }
    case GGUF_VT_INT32: {
        int32_t x;
        memcpy(&x, kv->val, 4);
        v = x;
        break;
    }
    case GGUF_VT_UINT64: {
        uint64_t x;
        memcpy(&x, kv->val, 8);
        if (x > UINT32_MAX)
            return -EINVAL;
        v = (int64_t)x;
        break;
    }
    case GGUF_VT_INT64: {
        memcpy(&v, kv->val, 8);
        break;
    }
    default:
        return -EINVAL;
    }
    if (v < 0 || v > UINT32_MAX)
        return -EINVAL;
    *out = (uint32_t)v;
    return 0;
}

int gguf_get_bool(const struct gguf *g, const char *key, bool *out) {
    const struct gguf_kv *kv = find(g, key);
    if (!kv)
        return -ENOENT;
    if (kv->type != GGUF_VT_BOOL)
        return -EINVAL;
    *out = kv->val[0] != 0;
    return 0;
}

int gguf_get_str(const struct gguf *g, const char *key, struct gguf_str *out) {
    const struct gguf_kv *kv = find(g, key);
    if (!kv)
        return -ENOENT;
    if (kv->type != GGUF_VT_STRING)
        return -EINVAL;
    memcpy(&out->len, kv->val, 8);
    out->ptr = (const char *)kv->val + 8;
    return 0;
}

int gguf_get_arr(const struct gguf *g, const char *key, enum gguf_vtype *elem_type, uint64_t *n,
                 const void **data) {
    const struct gguf_kv *kv = find(g, key);
    if (!kv)
        return -ENOENT;
    if (kv->type != GGUF_VT_ARRAY || kv->elem_type == GGUF_VT_STRING)
        return -EINVAL;
    *elem_type = kv->elem_type;
    *n = kv->n;
    *data = kv->val;
    return 0;
}

int gguf_get_str_arr(const struct gguf *g, const char *key, uint64_t *n,
                     const struct gguf_str **items) {
    const struct gguf_kv *kv = find(g, key);
    if (!kv)
        return -ENOENT;
    if (kv->type != GGUF_VT_ARRAY || kv->elem_type != GGUF_VT_STRING)
        return -EINVAL;
    *n = kv->n;
    *items = kv->items;
    return 0;
}
