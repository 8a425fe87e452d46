/* gguf_meta.c - accessors of an open GGUF file (see gguf.h), the name
 * lookups and the type tables. Everything here reads what gguf.c validated
 * at open, so nothing checks bounds again; lookups by name go through the
 * hash tables gguf.c builds at open with gguf_hash() (O(1) expected). This
 * file calls nothing in gguf.c: open depends on the accessors, never the
 * other way round.
 */
#include "engine/model/gguf_impl.h"

#include <assert.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <string.h>

uint64_t gguf_hash(const void *p, size_t n) {
    const unsigned char *b = p;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

int64_t gguf_slots_find(const uint32_t *slots, uint64_t mask, const void *entries, size_t stride,
                        const void *p, size_t n) {
    for (uint64_t h = gguf_hash(p, n) & mask; slots[h]; h = (h + 1) & mask) {
        const struct gguf_str *s = gguf_entry_name(entries, stride, slots[h] - 1);
        if (s->len == n && memcmp(s->ptr, p, n) == 0)
            return (int64_t)slots[h] - 1;
    }
    return -1;
}

size_t gguf_vtype_size(enum gguf_vtype t) {
    switch (t) {
    case GGUF_VT_UINT8:
    case GGUF_VT_INT8:
    case GGUF_VT_BOOL:
        return 1;
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
        return 0;
    }
}

uint32_t gguf_version(const struct gguf *g) {
    return g->version;
}

uint64_t gguf_n_kv(const struct gguf *g) {
    return g->n_kv;
}

uint64_t gguf_alignment(const struct gguf *g) {
    return g->alignment;
}

uint64_t gguf_data_offset(const struct gguf *g) {
    return g->data_off;
}

uint64_t gguf_offset_of(const struct gguf *g, const void *p) {
    const uint8_t *b = p;
    return b >= g->base && b < g->base + g->len ? (uint64_t)(b - g->base) : UINT64_MAX;
}

int gguf_kv_at(const struct gguf *g, uint64_t i, struct gguf_str *key, enum gguf_vtype *type) {
    if (i >= g->n_kv)
        return -ENOENT;
    *key = g->kv[i].key;
    *type = g->kv[i].type;
    return 0;
}

static const struct gguf_kv *kv_find(const struct gguf *g, const char *key) {
    assert(key);
    int64_t i = gguf_slots_find(g->kv_slots, g->kv_mask, g->kv, sizeof(*g->kv), key, strlen(key));
    return i < 0 ? NULL : &g->kv[i];
}

int gguf_get_type(const struct gguf *g, const char *key, enum gguf_vtype *type) {
    const struct gguf_kv *kv = kv_find(g, key);
    if (!kv)
        return -ENOENT;
    *type = kv->type;
    return 0;
}

/* An integer value as sign and magnitude, so one range check serves every
 * output type: 0, or -EINVAL when the value is not an integer. */
static int kv_int(const struct gguf_kv *kv, bool *neg, uint64_t *mag) {
    const uint8_t *p = kv->val;
    int64_t s;
    switch (kv->type) {
    case GGUF_VT_UINT8:
        *neg = false;
        *mag = p[0];
        return 0;
    case GGUF_VT_UINT16: {
        uint16_t v;
        memcpy(&v, p, 2);
        *neg = false;
        *mag = v;
        return 0;
    }
    case GGUF_VT_UINT32: {
        uint32_t v;
        memcpy(&v, p, 4);
        *neg = false;
        *mag = v;
        return 0;
    }
    case GGUF_VT_UINT64:
        *neg = false;
        memcpy(mag, p, 8);
        return 0;
    case GGUF_VT_INT8:
        s = (int8_t)p[0];
        break;
    case GGUF_VT_INT16: {
        int16_t v;
        memcpy(&v, p, 2);
        s = v;
        break;
    }
    case GGUF_VT_INT32: {
        int32_t v;
        memcpy(&v, p, 4);
        s = v;
        break;
    }
    case GGUF_VT_INT64:
        memcpy(&s, p, 8);
        break;
    default:
        return -EINVAL;
    }
    *neg = s < 0;
    *mag = s < 0 ? 0 - (uint64_t)s : (uint64_t)s;
    return 0;
}

static int get_int(const struct gguf *g, const char *key, bool *neg, uint64_t *mag) {
    const struct gguf_kv *kv = kv_find(g, key);
    if (!kv)
        return -ENOENT;
    return kv_int(kv, neg, mag);
}

int gguf_get_u32(const struct gguf *g, const char *key, uint32_t *out) {
    bool neg;
    uint64_t mag;
    int rc = get_int(g, key, &neg, &mag);
    if (rc)
        return rc;
    if (neg || mag > UINT32_MAX)
        return -EINVAL;
    *out = (uint32_t)mag;
    return 0;
}

int gguf_get_u64(const struct gguf *g, const char *key, uint64_t *out) {
    bool neg;
    uint64_t mag;
    int rc = get_int(g, key, &neg, &mag);
    if (rc)
        return rc;
    if (neg)
        return -EINVAL;
    *out = mag;
    return 0;
}

int gguf_get_i32(const struct gguf *g, const char *key, int32_t *out) {
    bool neg;
    uint64_t mag;
    int rc = get_int(g, key, &neg, &mag);
    if (rc)
        return rc;
    if (mag > (neg ? (uint64_t)INT32_MAX + 1 : (uint64_t)INT32_MAX))
        return -EINVAL;
    *out = neg ? (int32_t)(-(int64_t)mag) : (int32_t)mag;
    return 0;
}

int gguf_get_f32(const struct gguf *g, const char *key, float *out) {
    const struct gguf_kv *kv = kv_find(g, key);
    if (!kv)
        return -ENOENT;
    if (kv->type == GGUF_VT_FLOAT32) {
        memcpy(out, kv->val, 4);
        return 0;
    }
    if (kv->type != GGUF_VT_FLOAT64)
        return -EINVAL;
    double d;
    memcpy(&d, kv->val, 8);
    if (isfinite(d) && fabs(d) > FLT_MAX)
        return -EINVAL;
    *out = (float)d;
    return 0;
}

int gguf_get_bool(const struct gguf *g, const char *key, bool *out) {
    const struct gguf_kv *kv = kv_find(g, key);
    if (!kv)
        return -ENOENT;
    if (kv->type != GGUF_VT_BOOL)
        return -EINVAL;
    *out = kv->val[0] != 0;
    return 0;
}

int gguf_get_str(const struct gguf *g, const char *key, struct gguf_str *out) {
    const struct gguf_kv *kv = kv_find(g, key);
    if (!kv)
        return -ENOENT;
    if (kv->type != GGUF_VT_STRING)
        return -EINVAL;
    *out = kv->str;
    return 0;
}

int gguf_get_arr(const struct gguf *g, const char *key, enum gguf_vtype *elem_type, uint64_t *n,
                 const void **data) {
    const struct gguf_kv *kv = kv_find(g, key);
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
    const struct gguf_kv *kv = kv_find(g, key);
    if (!kv)
        return -ENOENT;
    if (kv->type != GGUF_VT_ARRAY || kv->elem_type != GGUF_VT_STRING)
        return -EINVAL;
    *n = kv->n;
    *items = kv->items;
    return 0;
}

uint64_t gguf_n_tensors(const struct gguf *g) {
    return g->n_tensors;
}

const struct gguf_tensor *gguf_tensor_at(const struct gguf *g, uint64_t i) {
    return i < g->n_tensors ? &g->tensors[i] : NULL;
}

const struct gguf_tensor *gguf_find_tensor(const struct gguf *g, const char *name) {
    assert(name);
    int64_t i =
        gguf_slots_find(g->t_slots, g->t_mask, g->tensors, sizeof(*g->tensors), name, strlen(name));
    return i < 0 ? NULL : &g->tensors[i];
}

uint32_t gguf_type_block(enum gguf_ttype t) {
    switch (t) {
    case GGUF_T_F32:
    case GGUF_T_F16:
    case GGUF_T_BF16:
        return 1;
    case GGUF_T_Q4_0:
    case GGUF_T_Q8_0:
        return 32;
    case GGUF_T_Q2_K:
    case GGUF_T_Q3_K:
    case GGUF_T_Q4_K:
    case GGUF_T_Q5_K:
    case GGUF_T_Q6_K:
        return 256; /* ggml's QK_K */
    default:
        return 0;
    }
}

uint64_t gguf_type_bytes(enum gguf_ttype t, uint64_t n) {
    uint64_t per, blk = gguf_type_block(t);
    switch (t) {
    case GGUF_T_F32:
        per = 4;
        break;
    case GGUF_T_F16:
    case GGUF_T_BF16:
        per = 2;
        break;
    case GGUF_T_Q4_0:
        per = 18; /* f16 scale + 32 nibbles */
        break;
    case GGUF_T_Q8_0:
        per = 34; /* f16 scale + 32 int8 */
        break;
    case GGUF_T_Q2_K:
        per = 84; /* 16 B of 4-bit scales/mins + 64 B of 2-bit levels + f16 d, dmin */
        break;
    case GGUF_T_Q3_K:
        per = 110; /* 32 B of high bits + 64 B of 2-bit pairs + 12 B of 6-bit scales + f16 d */
        break;
    case GGUF_T_Q4_K:
        per = 144; /* f16 d, dmin + 12 B of 6-bit scales/mins + 128 B of nibbles */
        break;
    case GGUF_T_Q5_K:
        per = 176; /* as Q4_K + 32 B of high bits */
        break;
    case GGUF_T_Q6_K:
        per = 210; /* 128 B low nibbles + 64 B high 2 bits + 16 int8 scales + f16 d */
        break;
    default:
        return 0;
    }
    if (n % blk != 0 || n / blk > UINT64_MAX / per)
        return 0;
    return n / blk * per;
}

/* ggml's ggml_type ids and names, including ids ggml has since removed, so
 * a refusal can name what the file holds. */
static const char *const gguf_type_names[] = {
    [0] = "f32",     [1] = "f16",         [2] = "q4_0",        [3] = "q4_1",        [4] = "q4_2",
    [5] = "q4_3",    [6] = "q5_0",        [7] = "q5_1",        [8] = "q8_0",        [9] = "q8_1",
    [10] = "q2_K",   [11] = "q3_K",       [12] = "q4_K",       [13] = "q5_K",       [14] = "q6_K",
    [15] = "q8_K",   [16] = "iq2_xxs",    [17] = "iq2_xs",     [18] = "iq3_xxs",    [19] = "iq1_s",
    [20] = "iq4_nl", [21] = "iq3_s",      [22] = "iq2_s",      [23] = "iq4_xs",     [24] = "i8",
    [25] = "i16",    [26] = "i32",        [27] = "i64",        [28] = "f64",        [29] = "iq1_m",
    [30] = "bf16",   [31] = "q4_0_4_4",   [32] = "q4_0_4_8",   [33] = "q4_0_8_8",   [34] = "tq1_0",
    [35] = "tq2_0",  [36] = "iq4_nl_4_4", [37] = "iq4_nl_4_8", [38] = "iq4_nl_8_8", [39] = "mxfp4",
};

const char *gguf_type_name(enum gguf_ttype t) {
    size_t n = sizeof(gguf_type_names) / sizeof(gguf_type_names[0]);
    return (size_t)t < n && gguf_type_names[t] ? gguf_type_names[t] : "?";
}

static const char *const gguf_vtype_names[] = {
    "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64",
};

const char *gguf_vtype_name(enum gguf_vtype t) {
    size_t n = sizeof(gguf_vtype_names) / sizeof(gguf_vtype_names[0]);
    return (size_t)t < n ? gguf_vtype_names[t] : "?";
}

bool gguf_str_eq(struct gguf_str s, const char *c) {
    size_t n = strlen(c);
    return s.len == n && memcmp(s.ptr, c, n) == 0;
}
