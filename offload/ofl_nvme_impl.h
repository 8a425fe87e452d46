/* ofl_nvme_impl.h - what the NVMe tier's three files share. Not a public header.
 *   ofl_nvme.c        the API, open and close, the index replay; starts the tier thread
 *   ofl_nvme_io.c     the tier thread: the ring, every slot I/O
 *   ofl_nvme_table.c  the slot table, the tag queue, completions, the index flush
 * Calls run one way: ofl_nvme.c calls ofl_nvme_io.c (only ofl_nvme_thread) and
 * ofl_nvme_table.c; ofl_nvme_io.c calls ofl_nvme_table.c; ofl_nvme_table.c calls neither.
 *
 * Slot states:
 *   FREE     on the free stack; in no other structure.
 *   PENDING  a write was accepted: in the hash chain and its tenant list (so a second
 *            write of the hash is -EEXIST and a purge finds it), not in the LRU, n_io 1.
 *   VALID    a complete entry: hash chain, tenant list and LRU; n_io counts reads in flight.
 *   DEAD     removed from every structure while I/O still touches it (n_io > 0), or held
 *            by a purge (scrub) until it has been cleared; becomes FREE when both are done.
 *   FOREIGN  an entry of another model, found in the index at open (one slot file may serve
 *            several models in turn): only in the LRU, so it ages out with the rest and is
 *            evicted like an entry of ours (with a DEL record of its own fingerprint, which
 *            tells its model the slot is gone); never read, never in the hash chain or a
 *            tenant list (this model cannot find it, nor purge it), never free otherwise.
 * Locks: purge_lock, then idx_lock, then lock; lock is never held while another is taken.
 * Every field of the table, the tag lists and the counters is guarded by n->lock. The
 * slot's hash, len and csum are stable while n_io > 0 (nothing rewrites a slot with I/O in
 * flight), so the tier thread reads them outside the lock through its tags.
 */
#ifndef LLMD_OFL_NVME_IMPL_H
#define LLMD_OFL_NVME_IMPL_H

#include <liburing.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "offload/ofl_index.h"
#include "offload/ofl_nvme.h"

#define OFL_NONE       UINT32_MAX
#define OFL_ALIGN      4096u      /* O_DIRECT buffer, offset and length alignment */
#define OFL_EFD_TAG    UINT64_MAX /* user_data of the eventfd read in the ring */
#define OFL_QD_DEFAULT 32u
#define OFL_QD_MAX     1024u      /* n_io is 16 bits; bounce memory is qd * stride */
#define OFL_SLOT_MAX   (1u << 30) /* an I/O length must fit the CQE's int result */

enum ofl_slot_state {
    OFL_SLOT_FREE = 0,
    OFL_SLOT_PENDING,
    OFL_SLOT_VALID,
    OFL_SLOT_DEAD,
    OFL_SLOT_FOREIGN
};

struct ofl_slot {
    uint8_t hash[OFL_HASH_BYTES];
    uint64_t csum; /* xxh3-64 of the payload */
    uint32_t len;  /* payload bytes */
    uint32_t tenant;
    uint32_t hnext;        /* hash chain (PENDING, VALID) */
    uint32_t prev, next;   /* LRU, MRU at n->lru_head (VALID); free stack (FREE, next);
                            * a purge's private list (DEAD with scrub, next) */
    uint32_t tprev, tnext; /* tenant bucket list (PENDING, VALID) */
    uint32_t fp_i;         /* FOREIGN: its model's fingerprint is n->ffp[fp_i] */
    uint16_t n_io;         /* accepted operations on this slot not yet completed */
    uint8_t state;         /* enum ofl_slot_state */
    uint8_t scrub;         /* DEAD and held by a purge: not freed when n_io reaches 0 */
};

/* One outstanding operation and its bounce buffer; outstanding from acceptance until
 * ofl_nvme_poll returns its completion. */
struct ofl_tag {
    struct ofl_tag *next; /* free stack, queue, a tier thread batch, or the done list */
    uint8_t *buf;         /* [stride] bytes, 4 KiB aligned; registered buffer `i` */
    uint32_t i;
    uint8_t op;      /* enum ofl_nvme_op */
    uint32_t slot;   /* slot index */
    uint32_t len;    /* payload bytes */
    uint32_t io_len; /* len rounded up to 4 KiB: bytes moved to or from the disk */
    uint64_t csum;   /* write: of the payload; read: expected */
    void *dst;       /* read: the caller's buffer, borrowed until the completion */
    bool into_dst;   /* read: dst is 4 KiB aligned with room for io_len: the I/O lands there
                      * directly (no bounce copy) */
    uint64_t cookie; /* the caller's */
    uint64_t t0_ns;  /* CLOCK_MONOTONIC at acceptance */
    int res;         /* raw I/O result: bytes or -errno */
    int rc;          /* completion code, see struct ofl_nvme_cpl */
};

struct ofl_nvme {
    void (*thread_init)(void *ctx); /* the config's hook, run on the tier thread */
    void *thread_ctx;
    void (*entry_hook)(void *ctx, const uint8_t *hash, uint32_t tenant, bool valid);
    void *entry_ctx;
    pthread_mutex_t lock;       /* everything below unless said otherwise */
    pthread_cond_t cpl_cv;      /* the done list grew (poll waits on it) */
    pthread_cond_t io_cv;       /* a DEAD slot held by a purge has no I/O left */
    pthread_mutex_t idx_lock;   /* serializes index flushes: file order == buffer order */
    pthread_mutex_t purge_lock; /* one purge at a time (and no_punch) */

    /* constant after open */
    char *path;
    uint32_t slot_bytes, stride, n_slots, qd;
    uint8_t fp[OFL_FP_BYTES];
    int fd;
    bool direct, sparse, blkdev;

    /* the table */
    struct ofl_slot *slots; /* [n_slots] */
    uint32_t *hbuckets;     /* [hmask + 1] hash chain heads */
    uint32_t *tbuckets;     /* [tmask + 1] tenant list heads */
    uint32_t hmask, tmask;
    uint32_t lru_head, lru_tail; /* MRU, LRU */
    uint32_t free_top;
    uint32_t n_free, n_pending, n_valid, n_foreign;
    uint8_t (*ffp)[OFL_FP_BYTES]; /* [n_ffp] the other models' fingerprints FOREIGN slots name
                                   * (grown at open only; distinct, usually one or two) */
    uint32_t n_ffp, ffp_cap;
    bool ffp_oom; /* the replay could not grow ffp: open fails */

    /* operations */
    struct ofl_tag *tags; /* [qd] */
    void *bounce_mem;     /* the mem_alloc block the 4 KiB-aligned buffers are cut from */
    struct ofl_tag *tag_free;
    struct ofl_tag *q_head, *q_tail; /* accepted, for the tier thread */
    struct ofl_tag *d_head, *d_tail; /* completed, for poll */
    uint32_t n_outstanding;

    /* the index; idx_pend is appended to under lock, written by whoever flushes */
    struct ofl_index *ix;          /* file calls under idx_lock */
    uint8_t *idx_pend, *idx_spare; /* [cap][OFL_INDEX_REC_BYTES] encoded records */
    size_t idx_n, idx_cap, idx_spare_cap;
    bool idx_err_logged;
    /* ofl_index_bytes(ix), stored under idx_lock after every write to the index, so
     * stats read it without waiting behind an index flush's I/O */
    _Atomic uint64_t idx_bytes;

    /* the tier thread */
    pthread_t thread;
    bool thread_started;
    bool stopping;
    int efd;              /* eventfd: an accepted operation found the queue empty, or close */
    uint64_t efd_val;     /* target of the ring's eventfd read; tier thread only */
    struct io_uring ring; /* tier thread only, after open */
    bool uring, ring_inited, fixed_buffers, fixed_file;
    bool submit_err_logged; /* tier thread only */
    bool write_err_logged;  /* a failed write (not a full disk) was logged; tier thread only */

    bool disk_full;
    bool no_punch; /* fallocate(PUNCH_HOLE) refused once: purges write zeros (purge_lock) */
    atomic_bool fault_armed;
    uint64_t fault_nth[3]; /* by op */
    int fault_res[3];
    struct ofl_nvme_stats c; /* the counters; gauges are filled in by stats_get */
};

/* ---- ofl_nvme_io.c ---- */

/* Thread body: runs until n->stopping and nothing is in flight. */
void *ofl_nvme_thread(void *arg);

/* ---- ofl_nvme_table.c; each _locked function runs with n->lock held, never waits on disk ---- */

/* CLOCK_MONOTONIC now, in ns. Any thread, no lock. */
uint64_t ofl_nvme_now_ns(void);

/* Index into n->tbuckets of tenant's list head. No lock: reads only n->tmask (set at open). */
uint32_t ofl_nvme_tbucket(const struct ofl_nvme *n, uint32_t tenant);

/* The slot that holds hash (PENDING or VALID; in the hash chain), or OFL_NONE. */
uint32_t ofl_nvme_find_locked(const struct ofl_nvme *n, const uint8_t *hash);

/* Push slot s onto its hash's chain; its hash must be set and it must be in no chain. */
void ofl_nvme_hash_insert_locked(struct ofl_nvme *n, uint32_t s);

/* Take slot s out of its hash chain (ALWAYS-checked to be there). */
void ofl_nvme_hash_remove_locked(struct ofl_nvme *n, uint32_t s);

/* Push slot s onto the head of its tenant's list; its tenant must be set. */
void ofl_nvme_tenant_insert_locked(struct ofl_nvme *n, uint32_t s);

/* Unlink slot s from its tenant's list; s must be on it. */
void ofl_nvme_tenant_remove_locked(struct ofl_nvme *n, uint32_t s);

/* Make slot s the most recently used; s must not be in the LRU. */
void ofl_nvme_lru_push_locked(struct ofl_nvme *n, uint32_t s);

/* Unlink slot s from the LRU; s must be in it. */
void ofl_nvme_lru_remove_locked(struct ofl_nvme *n, uint32_t s);

/* Mark slot s FREE and push it on the free stack; s must be in no other structure. */
void ofl_nvme_free_push_locked(struct ofl_nvme *n, uint32_t s);

/* Take entry s (PENDING, VALID or FOREIGN) out of every structure: DEAD, a DEL record if
 * it was VALID or FOREIGN. The caller frees the slot or keeps it (a purge). */
void ofl_nvme_entry_unlink_locked(struct ofl_nvme *n, uint32_t s);

/* Unlink entry s and free its slot, unless I/O still touches it (the last completion
 * frees it then). */
void ofl_nvme_entry_remove_locked(struct ofl_nvme *n, uint32_t s);

/* A slot for a new write, off the free stack (evicting an idle LRU entry, ours or another
 * model's, when it is empty, counted as a drop), or OFL_NONE when every slot is busy. */
uint32_t ofl_nvme_slot_take_locked(struct ofl_nvme *n);

/* Put accepted tag t on the tier thread's queue; true when the queue was empty: the caller
 * then calls ofl_nvme_wake() after dropping the lock. */
bool ofl_nvme_enqueue_locked(struct ofl_nvme *n, struct ofl_tag *t);

/* Wake the tier thread through n->efd (an error is logged). Needs no lock; callers drop
 * n->lock first. */
void ofl_nvme_wake(struct ofl_nvme *n);

/* A free tag, counted outstanding until ofl_nvme_poll returns it; NULL when none is free. */
struct ofl_tag *ofl_nvme_tag_take_locked(struct ofl_nvme *n);

/* Queue-to-completion bookkeeping of one finished tag: updates the slot, the table, the
 * counters and the index buffer, and puts the tag on the done list (now_ns: its end). */
void ofl_nvme_complete_locked(struct ofl_nvme *n, struct ofl_tag *t, uint64_t now_ns);

/* Write the records buffered so far to the index file. Takes idx_lock and, briefly,
 * n->lock (so call with neither held); blocks on the file; a failure is counted and logged. */
void ofl_nvme_idx_flush(struct ofl_nvme *n);

#endif /* LLMD_OFL_NVME_IMPL_H */
