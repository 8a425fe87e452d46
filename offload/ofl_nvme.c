/* ofl_nvme.c - the NVMe tier's API, open and close, and the index replay (see ofl_nvme.h).
 *
 * Files: the slot table, the tag queue, completions and the index flush are in
 * ofl_nvme_table.c (its header comment has the table's layout and the index order); the
 * tier thread is ofl_nvme_io.c. Calls run one way: this file calls both and starts the
 * thread, ofl_nvme_io.c calls ofl_nvme_table.c, and ofl_nvme_table.c calls neither.
 *
 * Operations: ofl_nvme_write/read take a tag (a bounce buffer, registered with io_uring)
 * and a slot under the lock, copy the page outside it, and queue the tag for the tier
 * thread (ofl_nvme_io.c), which does the I/O, checksums writes, verifies reads, hands each tag
 * back through ofl_nvme_complete_locked() (ofl_nvme_table.c); ofl_nvme_poll() returns the tag
 * to the free stack. A tag is held until its completion is polled, so at most queue_depth
 * operations are outstanding and completions never need memory of their own.
 */
#include "offload/ofl_nvme.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/falloc.h>
#include <linux/fs.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "mem.h"
#include "offload/ofl_nvme_impl.h"

#define NV_COMPACT_MIN_RECS 1024       /* below this an index is never worth rewriting at open */
#define NV_ZERO_CHUNK       (1u << 20) /* bytes of zeros written per call when punching fails */

static uint32_t nv_pow2_at_least(uint32_t x) {
    uint32_t p = 16;
    while (p < x && p < (1u << 31))
        p <<= 1;
    return p;
}

/* ---- the API ---- */

int ofl_nvme_write(struct ofl_nvme *n, const uint8_t hash[OFL_HASH_BYTES], uint32_t tenant,
                   const void *src, uint32_t len, uint64_t cookie) {
    if (!n || !hash || !src || len == 0 || len > n->slot_bytes)
        return -EINVAL;
    int rc = 0;
    pthread_mutex_lock(&n->lock);
    uint32_t s = OFL_NONE;
    struct ofl_tag *t = NULL;
    if (n->disk_full) {
        n->c.enospc_refused_total++;
        rc = -ENOSPC;
    } else if (ofl_nvme_find_locked(n, hash) != OFL_NONE) {
        rc = -EEXIST;
    } else if (!n->tag_free || (s = ofl_nvme_slot_take_locked(n)) == OFL_NONE) {
        rc = -EAGAIN;
    }
    if (rc) {
        pthread_mutex_unlock(&n->lock);
        return rc;
    }
    t = ofl_nvme_tag_take_locked(n);
    struct ofl_slot *sl = &n->slots[s];
    memcpy(sl->hash, hash, OFL_HASH_BYTES);
    sl->tenant = tenant;
    sl->len = len;
    sl->csum = 0; /* set at completion, from the tier thread's checksum of the copy */
    sl->state = OFL_SLOT_PENDING;
    sl->n_io = 1;
    ofl_nvme_hash_insert_locked(n, s);
    ofl_nvme_tenant_insert_locked(n, s);
    n->n_pending++;
    n->c.writes_total++;
    pthread_mutex_unlock(&n->lock);

    /* The copy runs without the lock: the tag and the slot are ours. The padding is zeroed
     * so no stale bytes of an earlier page (another tenant's) reach the disk. */
    t->op = OFL_NVME_WRITE;
    t->slot = s;
    t->len = len;
    t->io_len = (len + OFL_ALIGN - 1) & ~(OFL_ALIGN - 1);
    t->cookie = cookie;
    t->dst = NULL;
    t->into_dst = false;
    memcpy(t->buf, src, len);
    memset(t->buf + len, 0, t->io_len - len);
    t->csum = 0;
    t->t0_ns = ofl_nvme_now_ns();

    pthread_mutex_lock(&n->lock);
    bool wake = ofl_nvme_enqueue_locked(n, t);
    pthread_mutex_unlock(&n->lock);
    if (wake)
        ofl_nvme_wake(n);
    return 0;
}

int ofl_nvme_read(struct ofl_nvme *n, const uint8_t hash[OFL_HASH_BYTES], void *dst, uint32_t cap,
                  uint64_t cookie) {
    if (!n || !hash || !dst)
        return -EINVAL;
    pthread_mutex_lock(&n->lock);
    uint32_t s = ofl_nvme_find_locked(n, hash);
    int rc = 0;
    if (s == OFL_NONE || n->slots[s].state != OFL_SLOT_VALID)
        rc = -ENOENT;
    else if (n->slots[s].len > cap)
        rc = -EINVAL;
    else if (!n->tag_free)
        rc = -EAGAIN;
    if (rc) {
        pthread_mutex_unlock(&n->lock);
        return rc;
    }
    struct ofl_slot *sl = &n->slots[s];
    struct ofl_tag *t = ofl_nvme_tag_take_locked(n);
    sl->n_io++;
    ofl_nvme_lru_remove_locked(n, s);
    ofl_nvme_lru_push_locked(n, s);
    t->op = OFL_NVME_READ;
    t->slot = s;
    t->len = sl->len;
    t->io_len = (sl->len + OFL_ALIGN - 1) & ~(OFL_ALIGN - 1);
    t->csum = sl->csum;
    t->dst = dst;
    t->into_dst = ((uintptr_t)dst & (OFL_ALIGN - 1)) == 0 && cap >= t->io_len;
    t->cookie = cookie;
    t->t0_ns = ofl_nvme_now_ns();
    n->c.reads_total++;
    bool wake = ofl_nvme_enqueue_locked(n, t);
    pthread_mutex_unlock(&n->lock);
    if (wake)
        ofl_nvme_wake(n);
    return 0;
}

int ofl_nvme_poll(struct ofl_nvme *n, struct ofl_nvme_cpl *out, uint32_t max, int wait_ms) {
    if (!n || !out || max == 0)
        return -EINVAL;
    pthread_mutex_lock(&n->lock);
    if (wait_ms != 0 && !n->d_head && n->n_outstanding > 0) {
        struct timespec dl;
        clock_gettime(CLOCK_MONOTONIC, &dl);
        if (wait_ms > 0) {
            dl.tv_sec += wait_ms / 1000;
            dl.tv_nsec += (long)(wait_ms % 1000) * 1000000L;
            if (dl.tv_nsec >= 1000000000L) {
                dl.tv_sec++;
                dl.tv_nsec -= 1000000000L;
            }
        }
        while (!n->d_head && n->n_outstanding > 0) {
            if (wait_ms < 0)
                pthread_cond_wait(&n->cpl_cv, &n->lock);
            else if (pthread_cond_timedwait(&n->cpl_cv, &n->lock, &dl) == ETIMEDOUT)
                break;
        }
    }
    uint32_t k = 0;
    while (n->d_head && k < max) {
        struct ofl_tag *t = n->d_head;
        n->d_head = t->next;
        if (!n->d_head)
            n->d_tail = NULL;
        out[k++] =
            (struct ofl_nvme_cpl){.cookie = t->cookie, .op = t->op, .rc = t->rc, .len = t->len};
        t->dst = NULL;
        t->next = n->tag_free;
        n->tag_free = t;
        n->n_outstanding--;
    }
    pthread_mutex_unlock(&n->lock);
    return (int)k;
}

bool ofl_nvme_contains(struct ofl_nvme *n, const uint8_t hash[OFL_HASH_BYTES]) {
    if (!n || !hash)
        return false;
    pthread_mutex_lock(&n->lock);
    uint32_t s = ofl_nvme_find_locked(n, hash);
    bool yes = s != OFL_NONE && n->slots[s].state == OFL_SLOT_VALID;
    pthread_mutex_unlock(&n->lock);
    return yes;
}

bool ofl_nvme_pending(struct ofl_nvme *n, const uint8_t hash[OFL_HASH_BYTES]) {
    if (!n || !hash)
        return false;
    pthread_mutex_lock(&n->lock);
    uint32_t s = ofl_nvme_find_locked(n, hash);
    bool yes = s != OFL_NONE && n->slots[s].state == OFL_SLOT_PENDING;
    pthread_mutex_unlock(&n->lock);
    return yes;
}

int ofl_nvme_tenant(struct ofl_nvme *n, const uint8_t hash[OFL_HASH_BYTES], uint32_t *tenant) {
    if (!n || !hash || !tenant)
        return -EINVAL;
    pthread_mutex_lock(&n->lock);
    uint32_t s = ofl_nvme_find_locked(n, hash);
    bool yes = s != OFL_NONE && n->slots[s].state == OFL_SLOT_VALID;
    if (yes)
        *tenant = n->slots[s].tenant;
    pthread_mutex_unlock(&n->lock);
    return yes ? 0 : -ENOENT;
}

uint32_t ofl_nvme_hashes(struct ofl_nvme *n, uint8_t (*out)[OFL_HASH_BYTES], uint32_t max) {
    uint32_t k = 0;
    pthread_mutex_lock(&n->lock);
    for (uint32_t s = 0; s < n->n_slots; s++) {
        if (n->slots[s].state != OFL_SLOT_VALID)
            continue;
        if (k < max)
            memcpy(out[k], n->slots[s].hash, OFL_HASH_BYTES);
        k++;
    }
    pthread_mutex_unlock(&n->lock);
    return k;
}

int ofl_nvme_drop(struct ofl_nvme *n, const uint8_t hash[OFL_HASH_BYTES]) {
    if (!n || !hash)
        return -EINVAL;
    pthread_mutex_lock(&n->lock);
    uint32_t s = ofl_nvme_find_locked(n, hash);
    if (s != OFL_NONE) {
        ofl_nvme_entry_remove_locked(n, s);
        n->c.removed_total++;
    }
    pthread_mutex_unlock(&n->lock);
    return s != OFL_NONE ? 0 : -ENOENT;
}

/* Clear slot s on disk: punch it (and allocate it again, so a preallocated file keeps its
 * space), or write zeros when the file system cannot punch. Returns 1 punched, 2 zeroed,
 * -errno. *zeros is a lazily allocated, 4 KiB-aligned block of zeros the caller frees. */
static int nv_slot_clear(struct ofl_nvme *n, uint32_t s, void **zeros_mem, uint8_t **zeros) {
    off_t off = (off_t)s * n->stride;
    if (!n->no_punch) {
        if (fallocate(n->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off, n->stride) == 0) {
            if (!n->sparse && !n->blkdev)
                (void)fallocate(n->fd, FALLOC_FL_KEEP_SIZE, off, n->stride);
            return 1;
        }
        if (errno != EOPNOTSUPP && errno != ENOSYS)
            LOG_WARN("ofl", "nvme %s: punching slot %u: %s: writing zeros", n->path, s,
                     strerror(errno));
        else
            n->no_punch = true;
    }
    uint32_t chunk = n->stride < NV_ZERO_CHUNK ? n->stride : NV_ZERO_CHUNK;
    if (!*zeros) {
        *zeros_mem = mem_calloc(MEM_OFL, 1, (size_t)chunk + OFL_ALIGN);
        if (!*zeros_mem)
            return -ENOMEM;
        *zeros = (uint8_t *)(((uintptr_t)*zeros_mem + OFL_ALIGN - 1) & ~(uintptr_t)(OFL_ALIGN - 1));
    }
    for (uint32_t done = 0; done < n->stride;) {
        uint32_t k = n->stride - done < chunk ? n->stride - done : chunk;
        ssize_t w = pwrite(n->fd, *zeros, k, off + done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return w < 0 ? -errno : -EIO;
        done += (uint32_t)w;
    }
    return 2;
}

int ofl_nvme_purge_tenant(struct ofl_nvme *n, uint32_t tenant, uint32_t *n_purged) {
    if (n_purged)
        *n_purged = 0;
    if (!n)
        return -EINVAL;
    uint32_t list = OFL_NONE, count = 0, in_flight = 0;
    pthread_mutex_lock(&n->purge_lock);
    pthread_mutex_lock(&n->lock);
    uint32_t s = n->tbuckets[ofl_nvme_tbucket(n, tenant)];
    while (s != OFL_NONE) {
        uint32_t next = n->slots[s].tnext;
        if (n->slots[s].tenant == tenant) {
            in_flight += n->slots[s].state == OFL_SLOT_PENDING;
            ofl_nvme_entry_unlink_locked(n, s);
            n->slots[s].scrub = 1;
            n->slots[s].next = list;
            list = s;
            count++;
        }
        s = next;
    }
    for (;;) { /* wait until no I/O touches the purged slots */
        bool busy = false;
        for (s = list; s != OFL_NONE && !busy; s = n->slots[s].next)
            busy = n->slots[s].n_io > 0;
        if (!busy)
            break;
        pthread_cond_wait(&n->io_cv, &n->lock);
    }
    n->c.purged_total += count;
    pthread_mutex_unlock(&n->lock);

    /* The DEL records are durable before the data goes, so a crash in between finds the
     * entries removed or, at worst, present with cleared data that fails its checksum. */
    ofl_nvme_idx_flush(n);
    pthread_mutex_lock(&n->idx_lock);
    int rc = ofl_index_sync(n->ix) ? -EIO : 0;
    pthread_mutex_unlock(&n->idx_lock);
    uint32_t punched = 0, zeroed = 0, failed = 0;
    void *zeros_mem = NULL;
    uint8_t *zeros = NULL;
    for (s = list; s != OFL_NONE; s = n->slots[s].next) {
        int r = nv_slot_clear(n, s, &zeros_mem, &zeros);
        punched += r == 1;
        zeroed += r == 2;
        failed += r < 0;
    }
    mem_free(zeros_mem);
    if (count && fdatasync(n->fd) != 0)
        failed = failed ? failed : 1;
    if (failed)
        rc = -EIO;

    pthread_mutex_lock(&n->lock);
    for (s = list; s != OFL_NONE;) {
        uint32_t next = n->slots[s].next;
        n->slots[s].scrub = 0;
        ofl_nvme_free_push_locked(n, s);
        s = next;
    }
    pthread_mutex_unlock(&n->lock);
    LOG_INFO("ofl",
             "nvme %s: purged tenant %u: %u entries (%u being written), %u slots punched, "
             "%u zeroed, %u failed",
             n->path, tenant, count, in_flight, punched, zeroed, failed);
    if (failed)
        LOG_WARN("ofl", "nvme %s: purge of tenant %u: %u slots could not be cleared", n->path,
                 tenant, failed);
    pthread_mutex_unlock(&n->purge_lock);
    if (n_purged)
        *n_purged = count;
    return rc;
}

void ofl_nvme_stats_get(struct ofl_nvme *n, struct ofl_nvme_stats *out) {
    pthread_mutex_lock(&n->lock);
    *out = n->c;
    out->n_slots = n->n_slots;
    out->slot_bytes = n->slot_bytes;
    out->slot_stride_bytes = n->stride;
    out->slots_used = n->n_valid + n->n_pending;
    out->entries = n->n_valid;
    out->foreign_entries = n->n_foreign;
    out->outstanding = n->n_outstanding;
    out->disk_full = n->disk_full;
    out->direct = n->direct;
    out->uring = n->uring;
    out->fixed_buffers = n->fixed_buffers;
    out->fixed_file = n->fixed_file;
    out->sparse = n->sparse;
    pthread_mutex_unlock(&n->lock);
    out->index_bytes = atomic_load_explicit(&n->idx_bytes, memory_order_relaxed);
}

int ofl_nvme_stats_format(struct ofl_nvme *n, char *buf, size_t len) {
    struct ofl_nvme_stats s;
    ofl_nvme_stats_get(n, &s);
    int k = snprintf(
        buf, len,
        "# ofl_nvme\n"
        "ofl_nvme_io:%s\nofl_nvme_direct:%d\nofl_nvme_sparse:%d\nofl_nvme_disk_full:%d\n"
        "ofl_nvme_slots:%" PRIu64 "\nofl_nvme_slot_bytes:%" PRIu64
        "\nofl_nvme_slot_stride_bytes:%" PRIu64 "\nofl_nvme_slots_used:%" PRIu64
        "\nofl_nvme_entries:%" PRIu64 "\nofl_nvme_outstanding:%" PRIu64
        "\nofl_nvme_writes_total:%" PRIu64 "\nofl_nvme_write_failures_total:%" PRIu64
        "\nofl_nvme_reads_total:%" PRIu64 "\nofl_nvme_read_failures_total:%" PRIu64
        "\nofl_nvme_checksum_failures_total:%" PRIu64 "\nofl_nvme_evictions_total:%" PRIu64
        "\nofl_nvme_drops_total:%" PRIu64 "\nofl_nvme_removed_total:%" PRIu64
        "\nofl_nvme_purged_total:%" PRIu64 "\nofl_nvme_disk_full_total:%" PRIu64
        "\nofl_nvme_enospc_refused_total:%" PRIu64 "\nofl_nvme_written_bytes_total:%" PRIu64
        "\nofl_nvme_read_bytes_total:%" PRIu64 "\nofl_nvme_write_ns_total:%" PRIu64
        "\nofl_nvme_read_ns_total:%" PRIu64 "\nofl_nvme_busy_ns_total:%" PRIu64
        "\nofl_nvme_index_replayed:%" PRIu64 "\nofl_nvme_index_ignored_fp:%" PRIu64
        "\nofl_nvme_index_ignored_geom:%" PRIu64 "\nofl_nvme_index_torn:%" PRIu64
        "\nofl_nvme_index_corrupt:%" PRIu64 "\nofl_nvme_index_compacted:%" PRIu64
        "\nofl_nvme_index_errors_total:%" PRIu64 "\nofl_nvme_index_bytes:%" PRIu64
        "\nofl_nvme_foreign_entries:%" PRIu64 "\n",
        s.uring ? (s.fixed_buffers ? "io_uring+fixed" : "io_uring") : "pread/pwrite", (int)s.direct,
        (int)s.sparse, (int)s.disk_full, s.n_slots, s.slot_bytes, s.slot_stride_bytes, s.slots_used,
        s.entries, s.outstanding, s.writes_total, s.write_failures_total, s.reads_total,
        s.read_failures_total, s.checksum_failures_total, s.evictions_total, s.drops_total,
        s.removed_total, s.purged_total, s.disk_full_total, s.enospc_refused_total,
        s.bytes_written_total, s.bytes_read_total, s.write_ns_total, s.read_ns_total,
        s.busy_ns_total, s.index_replayed, s.index_ignored_fp, s.index_ignored_geom, s.index_torn,
        s.index_corrupt, s.index_compacted, s.index_errors_total, s.index_bytes, s.foreign_entries);
    return k >= 0 && (size_t)k < len ? 0 : -ENOSPC;
}

void ofl_nvme_fault_inject(struct ofl_nvme *n, int op, uint64_t nth, int res) {
    if (op != OFL_NVME_WRITE && op != OFL_NVME_READ)
        return;
    pthread_mutex_lock(&n->lock);
    n->fault_nth[op] = nth;
    n->fault_res[op] = res;
    atomic_store(&n->fault_armed, n->fault_nth[OFL_NVME_WRITE] || n->fault_nth[OFL_NVME_READ]);
    pthread_mutex_unlock(&n->lock);
}

#define NV_CHECK(cond, ...)                                                                        \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            LOG_ERROR("ofl", "check: " __VA_ARGS__);                                               \
            return false;                                                                          \
        }                                                                                          \
    } while (0)

static bool nv_check_locked(const struct ofl_nvme *n) {
    uint32_t by_state[5] = {0}, n_io = 0;
    for (uint32_t s = 0; s < n->n_slots; s++) {
        const struct ofl_slot *sl = &n->slots[s];
        NV_CHECK(sl->state <= OFL_SLOT_FOREIGN, "slot %u state %u", s, sl->state);
        by_state[sl->state]++;
        n_io += sl->n_io;
        if (sl->state == OFL_SLOT_FREE)
            NV_CHECK(sl->n_io == 0 && !sl->scrub, "free slot %u has io %u scrub %u", s, sl->n_io,
                     sl->scrub);
        if (sl->state == OFL_SLOT_PENDING)
            NV_CHECK(sl->n_io == 1, "pending slot %u has io %u", s, sl->n_io);
        if (sl->state == OFL_SLOT_DEAD)
            NV_CHECK(sl->n_io > 0 || sl->scrub, "dead slot %u neither busy nor held", s);
        if (sl->state == OFL_SLOT_FOREIGN)
            NV_CHECK(sl->n_io == 0 && !sl->scrub && sl->fp_i < n->n_ffp &&
                         ofl_nvme_find_locked(n, sl->hash) != s,
                     "foreign slot %u: io %u scrub %u fp %u of %u, or in the hash chain", s,
                     sl->n_io, sl->scrub, sl->fp_i, n->n_ffp);
        if (sl->state == OFL_SLOT_PENDING || sl->state == OFL_SLOT_VALID) {
            NV_CHECK(ofl_nvme_find_locked(n, sl->hash) == s, "slot %u not found by its hash", s);
            bool in_tenant = false;
            for (uint32_t x = n->tbuckets[ofl_nvme_tbucket(n, sl->tenant)];
                 x != OFL_NONE && !in_tenant; x = n->slots[x].tnext)
                in_tenant = x == s;
            NV_CHECK(in_tenant, "slot %u missing from tenant %u's list", s, sl->tenant);
            NV_CHECK(sl->len >= 1 && sl->len <= n->slot_bytes, "slot %u len %u", s, sl->len);
        }
    }
    NV_CHECK(by_state[OFL_SLOT_FREE] == n->n_free, "free slots %u, n_free %u",
             by_state[OFL_SLOT_FREE], n->n_free);
    NV_CHECK(by_state[OFL_SLOT_PENDING] == n->n_pending, "pending slots %u, n_pending %u",
             by_state[OFL_SLOT_PENDING], n->n_pending);
    NV_CHECK(by_state[OFL_SLOT_VALID] == n->n_valid, "valid slots %u, n_valid %u",
             by_state[OFL_SLOT_VALID], n->n_valid);
    NV_CHECK(by_state[OFL_SLOT_FOREIGN] == n->n_foreign, "foreign slots %u, n_foreign %u",
             by_state[OFL_SLOT_FOREIGN], n->n_foreign);
    uint32_t k = 0;
    for (uint32_t s = n->free_top; s != OFL_NONE && k <= n->n_slots; s = n->slots[s].next, k++)
        NV_CHECK(n->slots[s].state == OFL_SLOT_FREE, "slot %u on the free stack is %u", s,
                 n->slots[s].state);
    NV_CHECK(k == n->n_free, "free stack holds %u, n_free %u", k, n->n_free);
    k = 0;
    uint32_t prev = OFL_NONE;
    for (uint32_t s = n->lru_head; s != OFL_NONE && k <= n->n_slots; s = n->slots[s].next, k++) {
        NV_CHECK(n->slots[s].state == OFL_SLOT_VALID || n->slots[s].state == OFL_SLOT_FOREIGN,
                 "slot %u in the LRU is %u", s, n->slots[s].state);
        NV_CHECK(n->slots[s].prev == prev, "LRU back link of %u", s);
        prev = s;
    }
    NV_CHECK(k == n->n_valid + n->n_foreign && prev == n->lru_tail,
             "LRU holds %u, n_valid %u + n_foreign %u", k, n->n_valid, n->n_foreign);
    uint32_t n_tags_free = 0;
    for (const struct ofl_tag *t = n->tag_free; t && n_tags_free <= n->qd; t = t->next)
        n_tags_free++;
    NV_CHECK(n_tags_free + n->n_outstanding == n->qd, "%u free tags + %u outstanding != %u",
             n_tags_free, n->n_outstanding, n->qd);
    NV_CHECK(n_io <= n->n_outstanding, "%u I/O on slots > %u outstanding", n_io, n->n_outstanding);
    return true;
}

bool ofl_nvme_check(struct ofl_nvme *n) {
    pthread_mutex_lock(&n->lock);
    bool ok = nv_check_locked(n);
    pthread_mutex_unlock(&n->lock);
    return ok;
}

/* ---- open and close ---- */

/* Replay callback: ADD and DEL applied to a table without I/O, in file order, the records
 * of other models included: their entries hold their slots (FOREIGN), or a run of this
 * model would take those slots as free and overwrite the data under records that stay in
 * the index, and the other model's next run would find checksum mismatches. An ADD
 * supersedes whatever held its hash or its slot (an ADD that follows a DEL lost to an
 * append failure, or an older writer that overwrote another model's slot). Free slots are
 * left FREE off the stack; open builds the stack afterwards. */
static void nv_replay_unlink(struct ofl_nvme *n, uint32_t s) {
    ofl_nvme_lru_remove_locked(n, s);
    if (n->slots[s].state == OFL_SLOT_FOREIGN) {
        n->n_foreign--;
    } else {
        ofl_nvme_hash_remove_locked(n, s);
        ofl_nvme_tenant_remove_locked(n, s);
        n->n_valid--;
    }
    n->slots[s].state = OFL_SLOT_FREE;
}

/* The index of fp in n->ffp, added when absent; OFL_NONE when the table cannot grow. */
static uint32_t nv_ffp_index(struct ofl_nvme *n, const uint8_t *fp) {
    for (uint32_t i = n->n_ffp; i-- > 0;) /* newest first: records come in runs of one model */
        if (memcmp(n->ffp[i], fp, OFL_FP_BYTES) == 0)
            return i;
    if (n->n_ffp == n->ffp_cap) {
        uint32_t cap = n->ffp_cap ? 2 * n->ffp_cap : 4;
        void *p = mem_realloc(n->ffp, (size_t)cap * OFL_FP_BYTES);
        if (!p)
            return OFL_NONE;
        n->ffp = p;
        n->ffp_cap = cap;
    }
    memcpy(n->ffp[n->n_ffp], fp, OFL_FP_BYTES);
    return n->n_ffp++;
}

/* A record of another model: its ADD makes the slot FOREIGN, its DEL frees the slot again
 * when the entry there is the one it names. */
static void nv_replay_foreign(struct ofl_nvme *n, const struct ofl_index_rec *r) {
    struct ofl_slot *sl = &n->slots[r->slot];
    if (r->op == OFL_INDEX_DEL) {
        if (sl->state == OFL_SLOT_FOREIGN && memcmp(sl->hash, r->hash, OFL_HASH_BYTES) == 0 &&
            memcmp(n->ffp[sl->fp_i], r->model_fp, OFL_FP_BYTES) == 0)
            nv_replay_unlink(n, r->slot);
        return;
    }
    uint32_t fi = nv_ffp_index(n, r->model_fp);
    if (fi == OFL_NONE) {
        n->ffp_oom = true;
        return;
    }
    if (sl->state != OFL_SLOT_FREE)
        nv_replay_unlink(n, r->slot);
    memcpy(sl->hash, r->hash, OFL_HASH_BYTES);
    sl->tenant = r->tenant;
    sl->len = r->len;
    sl->csum = r->csum;
    sl->fp_i = fi;
    sl->state = OFL_SLOT_FOREIGN;
    ofl_nvme_lru_push_locked(n, r->slot);
    n->n_foreign++;
}

static void nv_replay_apply(void *ctx, const struct ofl_index_rec *r) {
    struct ofl_nvme *n = ctx;
    if (memcmp(r->model_fp, n->fp, OFL_FP_BYTES) != 0) {
        nv_replay_foreign(n, r);
        return;
    }
    uint32_t old = ofl_nvme_find_locked(n, r->hash);
    if (r->op == OFL_INDEX_DEL) {
        if (old == r->slot)
            nv_replay_unlink(n, old);
        return;
    }
    if (old != OFL_NONE)
        nv_replay_unlink(n, old);
    if (n->slots[r->slot].state != OFL_SLOT_FREE)
        nv_replay_unlink(n, r->slot);
    struct ofl_slot *sl = &n->slots[r->slot];
    memcpy(sl->hash, r->hash, OFL_HASH_BYTES);
    sl->tenant = r->tenant;
    sl->len = r->len;
    sl->csum = r->csum;
    sl->state = OFL_SLOT_VALID;
    ofl_nvme_hash_insert_locked(n, r->slot);
    ofl_nvme_tenant_insert_locked(n, r->slot);
    ofl_nvme_lru_push_locked(n, r->slot);
    n->n_valid++;
}

/* Rewrite source: the live entries from least to most recently used, so a replay of the
 * compacted index rebuilds the same LRU order; other models' entries keep their records
 * (their fingerprints) and their places in it. */
static bool nv_compact_next(void *ctx, struct ofl_index_rec *r) {
    void **c = ctx;
    struct ofl_nvme *n = c[0];
    uint32_t *cur = c[1];
    if (*cur == OFL_NONE)
        return false;
    const struct ofl_slot *sl = &n->slots[*cur];
    *r = (struct ofl_index_rec){
        .op = OFL_INDEX_ADD, .slot = *cur, .tenant = sl->tenant, .len = sl->len, .csum = sl->csum};
    memcpy(r->hash, sl->hash, OFL_HASH_BYTES);
    memcpy(r->model_fp, sl->state == OFL_SLOT_FOREIGN ? n->ffp[sl->fp_i] : n->fp, OFL_FP_BYTES);
    *cur = sl->prev;
    return true;
}

static void nv_table_clear(struct ofl_nvme *n) {
    while (n->lru_head != OFL_NONE)
        nv_replay_unlink(n, n->lru_head);
}

/* Open the data file, size it, and find out whether O_DIRECT works on it: the first
 * 4 KiB is read and written back (unchanged) with O_DIRECT, since some file systems take
 * the flag at open and fail the I/O instead. *was_empty: the file held nothing before.
 * new_index: the index was just created; then a regular file that holds bytes is not a
 * tier's (or lost its index) and is refused with -EEXIST rather than cut and overwritten:
 * a mistyped path must not destroy a file. */
static int nv_data_open(struct ofl_nvme *n, const struct ofl_nvme_config *cfg, uint8_t *probe,
                        bool new_index, bool *was_empty, char *errbuf, size_t errlen) {
    int flags = O_RDWR | O_CREAT | O_CLOEXEC;
    n->thread_init = cfg->thread_init;
    n->thread_ctx = cfg->thread_ctx;
    n->entry_hook = cfg->entry_hook;
    n->entry_ctx = cfg->entry_ctx;
    n->direct = cfg->direct != 0;
    n->fd = open(cfg->path, flags | (n->direct ? O_DIRECT : 0), 0600);
    if (n->fd < 0 && errno == EINVAL && cfg->direct < 0) {
        n->direct = false;
        n->fd = open(cfg->path, flags, 0600);
    }
    if (n->fd < 0) {
        int rc = errno == EINVAL && cfg->direct > 0 ? -ENOTSUP : -errno;
        log_errbuf(errbuf, errlen, "%s: open%s: %s", cfg->path, n->direct ? " (O_DIRECT)" : "",
                   strerror(errno));
        return rc;
    }
    struct stat sb;
    if (fstat(n->fd, &sb) != 0) {
        log_errbuf(errbuf, errlen, "%s: fstat: %s", cfg->path, strerror(errno));
        return -errno;
    }
    uint64_t want = (uint64_t)n->n_slots * n->stride;
    *was_empty = false;
    if (S_ISBLK(sb.st_mode)) {
        uint64_t dev_bytes = 0;
        if (ioctl(n->fd, BLKGETSIZE64, &dev_bytes) != 0) {
            log_errbuf(errbuf, errlen, "%s: BLKGETSIZE64: %s", cfg->path, strerror(errno));
            return -errno;
        }
        if (dev_bytes < want) {
            log_errbuf(errbuf, errlen, "%s: device holds %" PRIu64 " bytes, tier needs %" PRIu64,
                       cfg->path, dev_bytes, want);
            return -EINVAL;
        }
        n->blkdev = true;
    } else if (S_ISREG(sb.st_mode)) {
        *was_empty = sb.st_size == 0;
        if (new_index && sb.st_size > 0) {
            log_errbuf(errbuf, errlen,
                       "%s: a file of %" PRIu64 " bytes without a tier index: not an NVMe tier (or "
                       "its index was removed); not overwriting it (remove it to start a new tier)",
                       cfg->path, (uint64_t)sb.st_size);
            return -EEXIST;
        }
        if ((uint64_t)sb.st_size > want && ftruncate(n->fd, (off_t)want) != 0) {
            log_errbuf(errbuf, errlen, "%s: ftruncate: %s", cfg->path, strerror(errno));
            return -errno;
        }
        if (fallocate(n->fd, 0, 0, (off_t)want) != 0) {
            int e = errno;
            if (e != ENOSPC && e != EFBIG && e != EOPNOTSUPP && e != ENOSYS) {
                log_errbuf(errbuf, errlen, "%s: fallocate %" PRIu64 " bytes: %s", cfg->path, want,
                           strerror(e));
                return -e;
            }
            /* past RLIMIT_FSIZE (EFBIG) the file cannot even be sized: it grows as
             * slots are written, until a write meets the limit */
            if (e != EFBIG && (uint64_t)sb.st_size < want && ftruncate(n->fd, (off_t)want) != 0) {
                log_errbuf(errbuf, errlen, "%s: ftruncate: %s", cfg->path, strerror(errno));
                return -errno;
            }
            n->sparse = true;
            if (e == ENOSPC || e == EFBIG)
                LOG_WARN("ofl",
                         "nvme %s: %s to preallocate %" PRIu64
                         " KiB: sparse file, writes stop when the disk fills",
                         cfg->path, e == EFBIG ? "the file size limit leaves no room" : "no room",
                         want >> 10);
            else
                LOG_INFO("ofl", "nvme %s: the file system cannot preallocate: sparse file",
                         cfg->path);
        }
    } else {
        log_errbuf(errbuf, errlen, "%s: neither a regular file nor a block device", cfg->path);
        return -EINVAL;
    }
    if (n->direct) {
        bool ok = pread(n->fd, probe, OFL_ALIGN, 0) == (ssize_t)OFL_ALIGN;
        int e = ok ? 0 : errno;
        if (ok && pwrite(n->fd, probe, OFL_ALIGN, 0) != (ssize_t)OFL_ALIGN) {
            e = errno;
            ok = e != EINVAL; /* ENOSPC and the like are not about O_DIRECT */
        }
        if (!ok && cfg->direct > 0) {
            log_errbuf(errbuf, errlen, "%s: O_DIRECT I/O refused: %s", cfg->path, strerror(e));
            return -ENOTSUP;
        }
        if (!ok) {
            int fl = fcntl(n->fd, F_GETFL);
            if (fl < 0 || fcntl(n->fd, F_SETFL, fl & ~O_DIRECT) != 0) {
                log_errbuf(errbuf, errlen, "%s: clearing O_DIRECT: %s", cfg->path, strerror(errno));
                return -errno;
            }
            n->direct = false;
        }
    }
    if (cfg->direct < 0)
        LOG_INFO("ofl", "nvme %s: %s", cfg->path,
                 n->direct ? "O_DIRECT I/O"
                           : "O_DIRECT not supported here: buffered I/O, one fdatasync per batch");
    return 0;
}

/* io_uring with registered buffers and file, or the pread/pwrite fallback. */
static int nv_uring_setup(struct ofl_nvme *n, const struct ofl_nvme_config *cfg, char *errbuf,
                          size_t errlen) {
    if (cfg->uring == 0)
        return 0;
    int rc = io_uring_queue_init(n->qd + 2, &n->ring, 0);
    if (rc < 0) {
        if (cfg->uring > 0) {
            log_errbuf(errbuf, errlen, "io_uring_queue_init: %s", strerror(-rc));
            return -ENOTSUP;
        }
        LOG_WARN("ofl", "nvme %s: io_uring not available (%s): pread/pwrite on the tier thread",
                 n->path, strerror(-rc));
        return 0;
    }
    n->ring_inited = true;
    n->uring = true;
    struct iovec *iov = mem_alloc(MEM_OFL, (size_t)n->qd * sizeof *iov);
    if (!iov) {
        log_errbuf(errbuf, errlen, "out of memory");
        return -ENOMEM;
    }
    for (uint32_t i = 0; i < n->qd; i++)
        iov[i] = (struct iovec){.iov_base = n->tags[i].buf, .iov_len = n->stride};
    rc = io_uring_register_buffers(&n->ring, iov, n->qd);
    mem_free(iov);
    n->fixed_buffers = rc == 0;
    if (rc)
        LOG_WARN("ofl",
                 "nvme %s: io_uring_register_buffers (%u x %u bytes): %s: unregistered "
                 "buffers (RLIMIT_MEMLOCK?)",
                 n->path, n->qd, n->stride, strerror(-rc));
    rc = io_uring_register_files(&n->ring, &n->fd, 1);
    n->fixed_file = rc == 0;
    if (rc)
        LOG_WARN("ofl", "nvme %s: io_uring_register_files: %s", n->path, strerror(-rc));
    return 0;
}

static void nv_free(struct ofl_nvme *n) {
    if (n->ring_inited)
        io_uring_queue_exit(&n->ring);
    if (n->efd >= 0)
        close(n->efd);
    ofl_index_close(n->ix);
    if (n->fd >= 0)
        close(n->fd);
    mem_free(n->idx_pend);
    mem_free(n->idx_spare);
    mem_free(n->ffp);
    mem_free(n->bounce_mem);
    mem_free(n->tags);
    mem_free(n->tbuckets);
    mem_free(n->hbuckets);
    mem_free(n->slots);
    mem_free(n->path);
    pthread_cond_destroy(&n->io_cv);
    pthread_cond_destroy(&n->cpl_cv);
    pthread_mutex_destroy(&n->purge_lock);
    pthread_mutex_destroy(&n->idx_lock);
    pthread_mutex_destroy(&n->lock);
    mem_free(n);
}

static int nv_check_config(const struct ofl_nvme_config *cfg, uint32_t *n_slots, uint32_t *stride,
                           char *errbuf, size_t errlen) {
    if (!cfg->path || !*cfg->path || cfg->slot_bytes == 0 || cfg->slot_bytes > OFL_SLOT_MAX ||
        cfg->queue_depth > OFL_QD_MAX || cfg->direct < -1 || cfg->direct > 1 || cfg->uring < -1 ||
        cfg->uring > 1) {
        log_errbuf(errbuf, errlen,
                   "bad config: path, slot_bytes 1..%u, queue_depth <= %u, direct and uring -1..1",
                   OFL_SLOT_MAX, OFL_QD_MAX);
        return -EINVAL;
    }
    *stride = (cfg->slot_bytes + OFL_ALIGN - 1) & ~(OFL_ALIGN - 1);
    uint64_t slots = cfg->bytes / *stride;
    if (slots == 0) {
        log_errbuf(errbuf, errlen,
                   "NVMe tier %s: %" PRIu64 " bytes hold no slot of %u bytes (one KV page, rounded "
                   "up to 4 KiB): give at least %u",
                   cfg->path, cfg->bytes, *stride, *stride);
        return -EINVAL;
    }
    if (slots >= OFL_NONE) {
        log_errbuf(errbuf, errlen,
                   "NVMe tier %s: %" PRIu64 " bytes make %" PRIu64 " slots of %u, over %u",
                   cfg->path, cfg->bytes, slots, *stride, OFL_NONE - 1);
        return -EINVAL;
    }
    *n_slots = (uint32_t)slots;
    return 0;
}

/* Allocate the table and the tags; every slot FREE, not yet on the stack. */
static int nv_alloc(struct ofl_nvme *n) {
    n->hmask = nv_pow2_at_least(n->n_slots) - 1;
    n->tmask = nv_pow2_at_least(n->n_slots < 65536 ? n->n_slots : 65536) - 1;
    n->slots = mem_calloc(MEM_OFL, n->n_slots, sizeof *n->slots);
    n->hbuckets = mem_alloc(MEM_OFL, ((size_t)n->hmask + 1) * sizeof *n->hbuckets);
    n->tbuckets = mem_alloc(MEM_OFL, ((size_t)n->tmask + 1) * sizeof *n->tbuckets);
    n->tags = mem_calloc(MEM_OFL, n->qd, sizeof *n->tags);
    n->bounce_mem = mem_alloc(MEM_OFL, (size_t)n->qd * n->stride + OFL_ALIGN);
    if (!n->slots || !n->hbuckets || !n->tbuckets || !n->tags || !n->bounce_mem)
        return -ENOMEM;
    memset(n->hbuckets, 0xff, ((size_t)n->hmask + 1) * sizeof *n->hbuckets);
    memset(n->tbuckets, 0xff, ((size_t)n->tmask + 1) * sizeof *n->tbuckets);
    for (uint32_t s = 0; s < n->n_slots; s++) {
        struct ofl_slot *sl = &n->slots[s];
        sl->hnext = sl->prev = sl->next = sl->tprev = sl->tnext = OFL_NONE;
    }
    n->lru_head = n->lru_tail = n->free_top = OFL_NONE;
    uint8_t *b =
        (uint8_t *)(((uintptr_t)n->bounce_mem + OFL_ALIGN - 1) & ~(uintptr_t)(OFL_ALIGN - 1));
    for (uint32_t i = n->qd; i-- > 0;) {
        struct ofl_tag *t = &n->tags[i];
        t->i = i;
        t->buf = b + (size_t)i * n->stride;
        t->next = n->tag_free;
        n->tag_free = t;
    }
    return 0;
}

int ofl_nvme_open(const struct ofl_nvme_config *cfg, struct ofl_nvme **out, char *errbuf,
                  size_t errlen) {
    uint32_t n_slots, stride;
    *out = NULL;
    int rc = nv_check_config(cfg, &n_slots, &stride, errbuf, errlen);
    if (rc)
        return rc;
    struct ofl_nvme *n = mem_calloc(MEM_OFL, 1, sizeof *n);
    if (!n) {
        log_errbuf(errbuf, errlen, "out of memory");
        return -ENOMEM;
    }
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&n->lock, NULL);
    pthread_mutex_init(&n->idx_lock, NULL);
    pthread_mutex_init(&n->purge_lock, NULL);
    pthread_cond_init(&n->cpl_cv, &ca);
    pthread_cond_init(&n->io_cv, &ca);
    pthread_condattr_destroy(&ca);
    n->fd = n->efd = -1;
    n->n_slots = n_slots;
    n->stride = stride;
    n->slot_bytes = cfg->slot_bytes;
    n->qd = cfg->queue_depth ? cfg->queue_depth : OFL_QD_DEFAULT;
    memcpy(n->fp, cfg->model_fp, OFL_FP_BYTES);
    n->path = mem_strdup(MEM_OFL, cfg->path);
    rc = -ENOMEM;
    if (!n->path || nv_alloc(n) != 0) {
        log_errbuf(errbuf, errlen, "out of memory for %u slots and %u bounce buffers", n_slots,
                   n->qd);
        goto fail;
    }

    /* The index first: its flock keeps a second process off the tier before the data
     * file is touched. */
    char *ipath = NULL;
    if (!cfg->index_path) {
        size_t plen = strlen(cfg->path);
        ipath = mem_alloc(MEM_OFL, plen + 5);
        if (!ipath) {
            log_errbuf(errbuf, errlen, "out of memory");
            goto fail;
        }
        memcpy(ipath, cfg->path, plen);
        memcpy(ipath + plen, ".idx", 5);
    }
    struct ofl_index_geom g = {.slot_bytes = n->slot_bytes, .n_slots = n->n_slots};
    memcpy(g.model_fp, n->fp, OFL_FP_BYTES);
    struct ofl_index_replay rep;
    rc = ofl_index_open(ipath ? ipath : cfg->index_path, &g, nv_replay_apply, n, &n->ix, &rep,
                        errbuf, errlen);
    if (rc == 0 && n->ffp_oom) {
        log_errbuf(errbuf, errlen, "out of memory for the fingerprints of the index's entries");
        rc = -ENOMEM;
    }
    if (rc) {
        mem_free(ipath);
        goto fail;
    }

    bool was_empty = false;
    rc = nv_data_open(n, cfg, n->tags[0].buf, rep.fresh, &was_empty, errbuf, errlen);
    if (rc && rep.fresh)
        unlink(ipath ? ipath : cfg->index_path); /* ours, created for nothing; still locked */
    mem_free(ipath);
    if (rc)
        goto fail;
    uint64_t n_live = (uint64_t)n->n_valid + n->n_foreign;
    bool compact = rep.n_records > NV_COMPACT_MIN_RECS && rep.n_records > 2 * n_live;
    /* Records past the last slot: the tier was larger, and nv_data_open just cut the file
     * to this size, so their data is gone. Left in the index they would come back as
     * entries when the tier grows again, only to fail their checksums. */
    if (rep.n_ignored_geom > 0)
        compact = true;
    if (was_empty && n_live) {
        LOG_WARN("ofl",
                 "nvme %s: the data file is new: the index's %" PRIu64 " entries are dropped",
                 n->path, n_live);
        nv_table_clear(n);
        compact = true;
    }
    n->c.index_replayed = n->n_valid;
    n->c.index_ignored_fp = rep.n_ignored_fp;
    n->c.index_ignored_geom = rep.n_ignored_geom;
    n->c.index_torn = rep.torn;
    n->c.index_corrupt = rep.n_corrupt;
    if (compact) {
        uint32_t cur = n->lru_tail;
        void *ctx[2] = {n, &cur};
        int crc = ofl_index_rewrite(n->ix, nv_compact_next, ctx);
        if (crc)
            LOG_WARN("ofl", "nvme %s: index compaction failed (%s): the old index stays", n->path,
                     strerror(-crc));
        n->c.index_compacted = crc == 0;
    }
    atomic_store_explicit(&n->idx_bytes, ofl_index_bytes(n->ix), memory_order_relaxed);
    for (uint32_t s = n->n_slots; s-- > 0;)
        if (n->slots[s].state == OFL_SLOT_FREE)
            ofl_nvme_free_push_locked(n, s);
    if (rep.n_records || rep.reset)
        LOG_INFO("ofl",
                 "nvme %s: index replayed: %u entries, %u slots held by other models' entries, "
                 "%" PRIu64 " records, %" PRIu64 " of another model, %" PRIu64
                 " outside this geometry%s",
                 n->path, n->n_valid, n->n_foreign, rep.n_records, rep.n_ignored_fp,
                 rep.n_ignored_geom, rep.torn ? ", torn tail cut" : "");

    n->efd = eventfd(0, EFD_CLOEXEC);
    if (n->efd < 0) {
        rc = -errno;
        log_errbuf(errbuf, errlen, "eventfd: %s", strerror(errno));
        goto fail;
    }
    rc = nv_uring_setup(n, cfg, errbuf, errlen);
    if (rc)
        goto fail;

    /* The tier thread takes no signals: they belong to the embedding program's threads. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    rc = -pthread_create(&n->thread, NULL, ofl_nvme_thread, n);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc) {
        log_errbuf(errbuf, errlen, "pthread_create: %s", strerror(-rc));
        goto fail;
    }
    pthread_setname_np(n->thread, "llmd-ofl-nvme");
    n->thread_started = true;
    *out = n;
    return 0;

fail:
    nv_free(n);
    return rc;
}

void ofl_nvme_close(struct ofl_nvme *n) {
    if (!n)
        return;
    if (n->thread_started) {
        pthread_mutex_lock(&n->lock);
        n->stopping = true;
        pthread_mutex_unlock(&n->lock);
        ofl_nvme_wake(n);
        pthread_join(n->thread, NULL);
    }
    ofl_nvme_idx_flush(n);
    if (fdatasync(n->fd) != 0)
        LOG_WARN("ofl", "nvme %s: fdatasync: %s", n->path, strerror(errno));
    nv_free(n);
}
