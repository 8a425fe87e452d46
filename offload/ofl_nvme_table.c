/* ofl_nvme_table.c - the NVMe tier's slot table and its completion bookkeeping, shared
 * by the API (ofl_nvme.c) and the tier thread (ofl_nvme_io.c); calls nothing in either.
 *
 * Table: one 80-byte record per slot (hash, checksum, length, tenant, links), a chained
 * hash table keyed by the xxh3 of the page hash (heads: a power of two >= n_slots), a
 * doubly linked LRU of complete entries, a tenant table (heads: a power of two, chains
 * through the slots, walked by purge) and a free stack. All of it is allocated at open:
 * no operation allocates, except the index record buffer when it grows.
 *
 * Here too: the tag free stack and the tier thread's queue (take, enqueue, wake), a
 * finished tag's bookkeeping (ofl_nvme_complete_locked, onto the done list), and the
 * index flush.
 *
 * Index order: every ADD/DEL record is encoded into n->idx_pend under the lock at the
 * moment the table changes, and flushes (under idx_lock) write buffers whole and in turn,
 * so the file's order is the table's order. A DEL for an evicted entry therefore always
 * precedes the ADD of whatever later takes its slot, and a purge's DELs follow any ADD of
 * the purged entries. Records are not fdatasynced one by one (the file is synced at close
 * and by purge): after a power loss the index may lack its newest records, which only
 * loses entries, or claim a slot whose newer data did not reach the disk, which the data
 * checksum catches on read. Never a wrong page.
 */
#include <assert.h>
#include <errno.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <xxhash.h>

#include "log.h"
#include "mem.h"
#include "offload/ofl_nvme_impl.h"

uint64_t ofl_nvme_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- the table; every function here runs under n->lock ---- */

static uint32_t ofl_nvme_hbucket(const struct ofl_nvme *n, const uint8_t *hash) {
    return (uint32_t)XXH3_64bits(hash, OFL_HASH_BYTES) & n->hmask;
}

uint32_t ofl_nvme_tbucket(const struct ofl_nvme *n, uint32_t tenant) {
    return (uint32_t)XXH3_64bits(&tenant, sizeof tenant) & n->tmask;
}

uint32_t ofl_nvme_find_locked(const struct ofl_nvme *n, const uint8_t *hash) {
    for (uint32_t s = n->hbuckets[ofl_nvme_hbucket(n, hash)]; s != OFL_NONE; s = n->slots[s].hnext)
        if (memcmp(n->slots[s].hash, hash, OFL_HASH_BYTES) == 0)
            return s;
    return OFL_NONE;
}

void ofl_nvme_hash_insert_locked(struct ofl_nvme *n, uint32_t s) {
    uint32_t b = ofl_nvme_hbucket(n, n->slots[s].hash);
    n->slots[s].hnext = n->hbuckets[b];
    n->hbuckets[b] = s;
}

void ofl_nvme_hash_remove_locked(struct ofl_nvme *n, uint32_t s) {
    uint32_t *p = &n->hbuckets[ofl_nvme_hbucket(n, n->slots[s].hash)];
    while (*p != OFL_NONE && *p != s)
        p = &n->slots[*p].hnext;
    if (ALWAYS(*p == s))
        *p = n->slots[s].hnext;
    n->slots[s].hnext = OFL_NONE;
}

void ofl_nvme_tenant_insert_locked(struct ofl_nvme *n, uint32_t s) {
    uint32_t b = ofl_nvme_tbucket(n, n->slots[s].tenant), h = n->tbuckets[b];
    n->slots[s].tprev = OFL_NONE;
    n->slots[s].tnext = h;
    if (h != OFL_NONE)
        n->slots[h].tprev = s;
    n->tbuckets[b] = s;
}

void ofl_nvme_tenant_remove_locked(struct ofl_nvme *n, uint32_t s) {
    struct ofl_slot *sl = &n->slots[s];
    if (sl->tprev != OFL_NONE)
        n->slots[sl->tprev].tnext = sl->tnext;
    else
        n->tbuckets[ofl_nvme_tbucket(n, sl->tenant)] = sl->tnext;
    if (sl->tnext != OFL_NONE)
        n->slots[sl->tnext].tprev = sl->tprev;
    sl->tprev = sl->tnext = OFL_NONE;
}

void ofl_nvme_lru_push_locked(struct ofl_nvme *n, uint32_t s) {
    n->slots[s].prev = OFL_NONE;
    n->slots[s].next = n->lru_head;
    if (n->lru_head != OFL_NONE)
        n->slots[n->lru_head].prev = s;
    else
        n->lru_tail = s;
    n->lru_head = s;
}

void ofl_nvme_lru_remove_locked(struct ofl_nvme *n, uint32_t s) {
    struct ofl_slot *sl = &n->slots[s];
    if (sl->prev != OFL_NONE)
        n->slots[sl->prev].next = sl->next;
    else
        n->lru_head = sl->next;
    if (sl->next != OFL_NONE)
        n->slots[sl->next].prev = sl->prev;
    else
        n->lru_tail = sl->prev;
    sl->prev = sl->next = OFL_NONE;
}

void ofl_nvme_free_push_locked(struct ofl_nvme *n, uint32_t s) {
    n->slots[s].state = OFL_SLOT_FREE;
    n->slots[s].next = n->free_top;
    n->free_top = s;
    n->n_free++;
}

/* Queue an ADD or DEL record of slot s for the index. A buffer that cannot grow loses the
 * record (counted, logged once): the entry then just does not survive a restart, or, for
 * a DEL, may come back from the index and fail its checksum on read. */
static void ofl_nvme_idx_push_locked(struct ofl_nvme *n, uint8_t op, uint32_t s) {
    if (n->idx_n == n->idx_cap) {
        size_t cap = n->idx_cap ? 2 * n->idx_cap : 64;
        uint8_t *p = mem_realloc(n->idx_pend, cap * OFL_INDEX_REC_BYTES);
        if (!p) {
            n->c.index_errors_total++;
            if (!n->idx_err_logged)
                LOG_WARN("ofl", "nvme %s: no memory for index records: some are lost", n->path);
            n->idx_err_logged = true;
            return;
        }
        n->idx_pend = p;
        n->idx_cap = cap;
    }
    const struct ofl_slot *sl = &n->slots[s];
    struct ofl_index_rec r = {.op = op, .slot = s};
    memcpy(r.hash, sl->hash, OFL_HASH_BYTES);
    memcpy(r.model_fp, sl->state == OFL_SLOT_FOREIGN ? n->ffp[sl->fp_i] : n->fp, OFL_FP_BYTES);
    if (op == OFL_INDEX_ADD) {
        r.tenant = sl->tenant;
        r.len = sl->len;
        r.csum = sl->csum;
    }
    ofl_index_rec_encode(&r, n->idx_pend + n->idx_n++ * OFL_INDEX_REC_BYTES);
}

/* A DEAD slot with no I/O left and no purge holding it goes back to the free stack. */
static void ofl_nvme_slot_release_locked(struct ofl_nvme *n, uint32_t s) {
    struct ofl_slot *sl = &n->slots[s];
    if (sl->state == OFL_SLOT_DEAD && sl->n_io == 0 && !sl->scrub)
        ofl_nvme_free_push_locked(n, s);
}

/* Take entry s (PENDING, VALID or FOREIGN) out of every structure: DEAD. A VALID or
 * FOREIGN entry gets a DEL record (a PENDING one never had an ADD); a FOREIGN one's names
 * its own model, whose next open then knows the slot is gone. The caller releases or keeps
 * the slot. */
void ofl_nvme_entry_unlink_locked(struct ofl_nvme *n, uint32_t s) {
    struct ofl_slot *sl = &n->slots[s];
    assert(sl->state == OFL_SLOT_PENDING || sl->state == OFL_SLOT_VALID ||
           sl->state == OFL_SLOT_FOREIGN);
    if (sl->state == OFL_SLOT_FOREIGN) {
        ofl_nvme_idx_push_locked(n, OFL_INDEX_DEL, s);
        ofl_nvme_lru_remove_locked(n, s);
        n->n_foreign--;
        sl->state = OFL_SLOT_DEAD;
        return;
    }
    if (sl->state == OFL_SLOT_VALID) {
        ofl_nvme_idx_push_locked(n, OFL_INDEX_DEL, s);
        ofl_nvme_lru_remove_locked(n, s);
        n->n_valid--;
        if (n->entry_hook)
            n->entry_hook(n->entry_ctx, sl->hash, sl->tenant, false);
    } else {
        n->n_pending--;
    }
    ofl_nvme_hash_remove_locked(n, s);
    ofl_nvme_tenant_remove_locked(n, s);
    sl->state = OFL_SLOT_DEAD;
}

void ofl_nvme_entry_remove_locked(struct ofl_nvme *n, uint32_t s) {
    ofl_nvme_entry_unlink_locked(n, s);
    ofl_nvme_slot_release_locked(n, s);
}

/* A slot for a new write: the free stack, else the least recently used entry without I/O
 * in flight (evicted: counted as a drop), ours or another model's (those replayed from the
 * index are older than anything this run wrote or read). At most qd entries have reads in
 * flight, so the scan looks at qd + 1 at most. OFL_NONE when every slot is busy. */
uint32_t ofl_nvme_slot_take_locked(struct ofl_nvme *n) {
    if (n->free_top == OFL_NONE) {
        uint32_t s = n->lru_tail;
        for (uint32_t k = 0; s != OFL_NONE && k <= n->qd; k++, s = n->slots[s].prev) {
            if (n->slots[s].n_io == 0) {
                ofl_nvme_entry_remove_locked(n, s);
                n->c.evictions_total++;
                n->c.drops_total++;
                break;
            }
        }
        if (n->free_top == OFL_NONE)
            return OFL_NONE;
    }
    uint32_t s = n->free_top;
    n->free_top = n->slots[s].next;
    n->n_free--;
    n->slots[s].next = OFL_NONE;
    return s;
}

/* Put an accepted tag on the tier thread's queue; true when the queue was empty (the
 * caller then wakes the thread: a non-empty queue has a wake-up on its way already). */
bool ofl_nvme_enqueue_locked(struct ofl_nvme *n, struct ofl_tag *t) {
    bool was_empty = n->q_head == NULL;
    t->next = NULL;
    if (n->q_tail)
        n->q_tail->next = t;
    else
        n->q_head = t;
    n->q_tail = t;
    return was_empty;
}

void ofl_nvme_wake(struct ofl_nvme *n) {
    if (eventfd_write(n->efd, 1) != 0)
        LOG_ERROR("ofl", "nvme %s: eventfd_write: %s", n->path, strerror(errno));
}

struct ofl_tag *ofl_nvme_tag_take_locked(struct ofl_nvme *n) {
    struct ofl_tag *t = n->tag_free;
    if (t) {
        n->tag_free = t->next;
        t->next = NULL;
        n->n_outstanding++;
    }
    return t;
}

/* ---- completions ---- */

void ofl_nvme_complete_locked(struct ofl_nvme *n, struct ofl_tag *t, uint64_t now_ns) {
    struct ofl_slot *sl = &n->slots[t->slot];
    int rc = t->rc;
    assert(sl->n_io > 0);
    sl->n_io--;
    if (t->op == OFL_NVME_WRITE) {
        if (rc == -ENOSPC) {
            n->c.disk_full_total++;
            if (!n->disk_full)
                LOG_WARN("ofl",
                         "nvme %s: disk full (or file-size limit) writing slot %u: "
                         "no more writes to this tier until it is reopened",
                         n->path, t->slot);
            n->disk_full = true;
        }
        if (rc && rc != -ENOENT) /* -ENOENT: dropped before it was submitted, no I/O */
            n->c.write_failures_total++;
        if (sl->state == OFL_SLOT_DEAD) {
            rc = -ENOENT;
        } else if (rc == 0) {
            sl->csum = t->csum;
            sl->state = OFL_SLOT_VALID;
            n->n_pending--;
            n->n_valid++;
            ofl_nvme_lru_push_locked(n, t->slot);
            ofl_nvme_idx_push_locked(n, OFL_INDEX_ADD, t->slot);
            if (n->entry_hook)
                n->entry_hook(n->entry_ctx, sl->hash, sl->tenant, true);
            n->c.bytes_written_total += t->len;
            n->c.write_ns_total += now_ns - t->t0_ns;
        } else {
            n->c.drops_total++;
            ofl_nvme_entry_unlink_locked(n, t->slot);
        }
    } else {
        if (sl->state == OFL_SLOT_DEAD) {
            rc = -ENOENT; /* dropped meanwhile; a purge may have cleared it under the read */
        } else if (rc == 0) {
            n->c.bytes_read_total += t->len;
            n->c.read_ns_total += now_ns - t->t0_ns;
        } else {
            n->c.read_failures_total++;
            n->c.drops_total++;
            if (rc == -EBADMSG)
                n->c.checksum_failures_total++;
            LOG_WARN("ofl", "nvme %s: slot %u: %s: entry dropped", n->path, t->slot,
                     rc == -EBADMSG ? "checksum mismatch" : "read failed");
            ofl_nvme_entry_unlink_locked(n, t->slot);
        }
    }
    ofl_nvme_slot_release_locked(n, t->slot);
    if (sl->state == OFL_SLOT_DEAD && sl->scrub && sl->n_io == 0)
        pthread_cond_broadcast(&n->io_cv);
    t->rc = rc;
    t->next = NULL;
    if (n->d_tail)
        n->d_tail->next = t;
    else
        n->d_head = t;
    n->d_tail = t;
}

void ofl_nvme_idx_flush(struct ofl_nvme *n) {
    pthread_mutex_lock(&n->idx_lock);
    pthread_mutex_lock(&n->lock);
    uint8_t *recs = n->idx_pend;
    size_t n_recs = n->idx_n, cap = n->idx_cap;
    n->idx_pend = n->idx_spare;
    n->idx_cap = n->idx_spare_cap;
    n->idx_n = 0;
    n->idx_spare = recs;
    n->idx_spare_cap = cap;
    pthread_mutex_unlock(&n->lock);
    int rc = n_recs ? ofl_index_append(n->ix, recs, n_recs) : 0;
    atomic_store_explicit(&n->idx_bytes, ofl_index_bytes(n->ix), memory_order_relaxed);
    if (rc) {
        pthread_mutex_lock(&n->lock);
        n->c.index_errors_total++;
        if (!n->idx_err_logged)
            LOG_WARN("ofl",
                     "nvme %s: index append failed (%s): %zu records lost, entries may "
                     "not survive a restart (logged once)",
                     n->path, strerror(-rc), n_recs);
        n->idx_err_logged = true;
        pthread_mutex_unlock(&n->lock);
    }
    pthread_mutex_unlock(&n->idx_lock);
}
