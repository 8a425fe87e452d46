/* kvev_pack.c - vLLM's KV-event payload in msgpack (kvev.h).
 *
 * Source of the layout: vLLM vllm/distributed/kv_events.py (EventBatch,
 * BlockStored, BlockRemoved, AllBlocksCleared as msgspec structs with
 * array_like=True, tag=True, omit_defaults=True: a struct is an array of its
 * fields in declaration order, the class name first, trailing fields equal
 * to their default left out) and the consumer in llm-d-kv-cache
 * pkg/kvevents (decodes exactly that: a 2- or 3-array batch, events as
 * tagged arrays). Encoding: the msgpack specification through msgpack-c. */
#include "engine/core/kvev.h"

#include <errno.h>
#include <string.h>

#include <msgpack.h>

#include "mem.h"

static int kvev_buf_write(void *data, const char *buf, size_t len) {
    struct kvev_buf *b = data;
    if (b->len + len > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + len)
            cap *= 2;
        uint8_t *p = b->data ? mem_realloc(b->data, cap) : mem_alloc(MEM_KVEV, cap);
        if (!p)
            return -1;
        b->data = p;
        b->cap = cap;
    }
    memcpy(b->data + b->len, buf, len);
    b->len += len;
    return 0;
}

const char *kvev_medium_name(unsigned m) {
    static const char *const names[KVEV_N_MEDIA] = {"GPU", "CPU", "DISK"};
    return m < KVEV_N_MEDIA ? names[m] : "?";
}

static int kvev_pack_cstr(msgpack_packer *pk, const char *s) {
    size_t n = strlen(s);
    return msgpack_pack_str(pk, n) || msgpack_pack_str_body(pk, s, n);
}

static int kvev_pack_hash(msgpack_packer *pk, const uint8_t *h) {
    return msgpack_pack_bin(pk, KVEV_HASH_BYTES) || msgpack_pack_bin_body(pk, h, KVEV_HASH_BYTES);
}

/* How many events from i on one vLLM event takes (see kvev.h). */
static uint32_t kvev_run(const struct kvev_batch *b, uint32_t i) {
    const struct kvev_event *e = &b->events[i];
    if (e->type == KVEV_CLEARED)
        return 1;
    uint32_t n = 1;
    for (; i + n < b->n_events; n++) {
        const struct kvev_event *f = &b->events[i + n], *prev = f - 1;
        if (f->type != e->type || f->medium != e->medium)
            break;
        if (e->type == KVEV_STORED && (f->tenant != e->tenant || !f->has_parent ||
                                       memcmp(f->parent, prev->hash, KVEV_HASH_BYTES) != 0 ||
                                       (f->n_tokens == 0) != (e->n_tokens == 0)))
            break;
    }
    return n;
}

static int kvev_pack_stored(msgpack_packer *pk, const struct kvev_batch *b, uint32_t i, uint32_t n,
                            bool token_ids) {
    const struct kvev_event *e = &b->events[i];
    bool tenants = false;
    for (uint32_t j = 0; j < n; j++)
        tenants |= b->events[i + j].tenant != 0;
    int rc = msgpack_pack_array(pk, tenants ? 9 : 8) || kvev_pack_cstr(pk, "BlockStored") ||
             msgpack_pack_array(pk, n);
    for (uint32_t j = 0; j < n && !rc; j++)
        rc = kvev_pack_hash(pk, b->events[i + j].hash);
    if (rc)
        return rc;
    rc = e->has_parent ? kvev_pack_hash(pk, e->parent) : msgpack_pack_nil(pk);
    uint32_t n_tok = 0;
    for (uint32_t j = 0; token_ids && j < n; j++)
        n_tok += b->events[i + j].n_tokens;
    rc = rc || msgpack_pack_array(pk, n_tok);
    for (uint32_t j = 0; token_ids && j < n && !rc; j++) {
        const struct kvev_event *f = &b->events[i + j];
        for (uint32_t t = 0; t < f->n_tokens && !rc; t++)
            rc = msgpack_pack_int32(pk, b->tokens[f->tok_off + t]);
    }
    rc = rc || msgpack_pack_uint32(pk, b->block_size) || msgpack_pack_nil(pk) ||
         kvev_pack_cstr(pk, kvev_medium_name(e->medium)) || msgpack_pack_nil(pk);
    if (rc || !tenants)
        return rc;
    /* extra_keys: one entry a block, a tuple (here an array) or nil */
    rc = msgpack_pack_array(pk, n);
    for (uint32_t j = 0; j < n && !rc; j++) {
        uint32_t t = b->events[i + j].tenant;
        rc = t ? msgpack_pack_array(pk, 2) || kvev_pack_cstr(pk, "llmd.tenant") ||
                     msgpack_pack_uint32(pk, t)
               : msgpack_pack_nil(pk);
    }
    return rc;
}

static int kvev_pack_removed(msgpack_packer *pk, const struct kvev_batch *b, uint32_t i,
                             uint32_t n) {
    int rc = msgpack_pack_array(pk, 3) || kvev_pack_cstr(pk, "BlockRemoved") ||
             msgpack_pack_array(pk, n);
    for (uint32_t j = 0; j < n && !rc; j++)
        rc = kvev_pack_hash(pk, b->events[i + j].hash);
    return rc || kvev_pack_cstr(pk, kvev_medium_name(b->events[i].medium));
}

int kvev_pack_batch(const struct kvev_batch *b, bool token_ids, struct kvev_buf *out) {
    msgpack_packer pk;
    msgpack_packer_init(&pk, out, kvev_buf_write);
    uint32_t n_out = 0;
    for (uint32_t i = 0; i < b->n_events; i += kvev_run(b, i))
        n_out++;
    size_t len0 = out->len;
    int rc = msgpack_pack_array(&pk, 3) || msgpack_pack_double(&pk, b->ts) ||
             msgpack_pack_array(&pk, n_out);
    for (uint32_t i = 0, n; i < b->n_events && !rc; i += n) {
        n = kvev_run(b, i);
        switch (b->events[i].type) {
        case KVEV_STORED:
            rc = kvev_pack_stored(&pk, b, i, n, token_ids);
            break;
        case KVEV_REMOVED:
            rc = kvev_pack_removed(&pk, b, i, n);
            break;
        default:
            rc = msgpack_pack_array(&pk, 1) || kvev_pack_cstr(&pk, "AllBlocksCleared");
            break;
        }
    }
    rc = rc || msgpack_pack_int32(&pk, b->dp_rank);
    if (rc) {
        out->len = len0;
        return -ENOMEM;
    }
    return 0;
}
