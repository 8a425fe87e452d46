/* ofl_nvme.h - the NVMe tier: KV pages in fixed-size slots of a file or block device.
 *
 * Model (DESIGN §5): a data file of n_slots slots, each holding at most one page (slot_bytes
 * of payload, padded to a 4 KiB multiple on disk) under its 32-byte prefix hash, with the
 * tenant, length and xxh3-64 checksum of the payload kept in memory and in an append-only
 * index file that is replayed at open, so cached prefixes survive a restart. Every read is
 * verified against the checksum before it is reported. The LRU entry is evicted when no
 * slot is free. Faults never crash: a failed or short write, a failed read or a checksum
 * mismatch drops that entry (the engine recomputes), a full disk stops further writes.
 *
 * Workflow: ofl_nvme_open -> ofl_nvme_write / ofl_nvme_read (asynchronous, each accepted
 * call gets exactly one completion) -> ofl_nvme_poll (reap completions) -> ofl_nvme_close.
 * At most queue_depth calls are outstanding (accepted and not yet returned by poll).
 *
 * Threads: a tier thread owns the I/O (io_uring, or pread/pwrite when io_uring is not
 * available); every function may be called from any thread, poll from one consumer at a
 * time. Only open, close, purge and poll with wait_ms != 0 block; write copies the page
 * (memory speed), the rest take a mutex for microseconds.
 * Signals: a file-size limit (RLIMIT_FSIZE) makes the kernel send SIGXFSZ, which kills the
 * process unless it is ignored; ignoring it is the embedding program's business (then the
 * write fails with EFBIG and the tier treats it as a full disk).
 */
#ifndef LLMD_OFL_NVME_H
#define LLMD_OFL_NVME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "offload/ofl_index.h" /* OFL_HASH_BYTES, OFL_FP_BYTES */

struct ofl_nvme;

enum ofl_nvme_op { OFL_NVME_WRITE = 1, OFL_NVME_READ = 2 };

struct ofl_nvme_config {
    const char *path;       /* data file (created if absent) or block device; borrowed */
    const char *index_path; /* NULL: path + ".idx" (give one for a block device); borrowed */
    uint64_t bytes;         /* tier size in bytes: n_slots = bytes / slot stride; a block device
                             * must hold it */
    uint32_t slot_bytes;    /* payload bytes of a slot (one KV page); the slot stride on disk
                             * is slot_bytes rounded up to 4096 (O_DIRECT alignment) */
    uint8_t model_fp[OFL_FP_BYTES]; /* index entries of another fingerprint are not read, but
                                     * keep their slots (see ofl_nvme_open) */
    uint32_t queue_depth;           /* 0: 32. Outstanding operations, in-flight I/O and bounce
                                     * buffers (queue_depth * stride bytes, registered) */
    int direct;                     /* -1 auto (O_DIRECT if the file system takes it, else
                                     * buffered, logged), 0 buffered, 1 O_DIRECT required */
    int uring;                      /* -1 auto (io_uring, else pread/pwrite on the tier thread,
                                     * logged), 0 pread/pwrite, 1 io_uring required */
    /* (optional, default: none) called first thing on the tier thread, e.g. to bind it to
     * the host tier's NUMA node (ofl_host_bind_thread); must not call into the tier */
    void (*thread_init)(void *ctx);
    void *thread_ctx;
    /* (optional, default: none) called when an entry becomes readable (valid true: its
     * write completed) and when a readable one goes (valid false: evicted for a slot,
     * dropped, purged, failed a read), not for entries replayed at open. Runs under the
     * tier's lock on whichever thread made the change: must not call into the tier */
    void (*entry_hook)(void *ctx, const uint8_t hash[OFL_HASH_BYTES], uint32_t tenant, bool valid);
    void *entry_ctx;
};

/* Open the tier: open or create the data file (preallocated with fallocate; a file system
 * without room keeps a sparse file, logged), replay the index (entries outside this
 * geometry ignored, a torn tail cut off; compacted when mostly dead; an entry of another
 * model_fp is never read, and keeps its slot until LRU eviction takes it like any entry,
 * with a DEL record for that model, so models that take turns on one tier keep their
 * entries and never overwrite each other's), set up io_uring
 * with registered buffers and file, start the tier thread. cfg is borrowed. On success *out
 * owns the tier: close it with ofl_nvme_close(). On failure errbuf (may be NULL) gets one
 * line. Returns 0, -EINVAL (bad config, or a device smaller than bytes), -ENOTSUP (direct=1
 * or uring=1 and not available), -EBUSY (index held by another process), -EEXIST (a regular
 * data file that holds bytes but had no index: not a tier, left untouched), -ENOMEM, -errno
 * of a failed open/fallocate/read. An index this call created is removed again when it
 * fails. Blocks on I/O. */
int ofl_nvme_open(const struct ofl_nvme_config *cfg, struct ofl_nvme **out, char *errbuf,
                  size_t errlen);

/* Wait for every accepted operation to finish (completions not polled are discarded),
 * stop the tier thread, fdatasync the data file and the index, free everything. NULL is a
 * no-op. No other call may run on n during or after it. Blocks. */
void ofl_nvme_close(struct ofl_nvme *n);

/* Write src[0..len) (len 1..slot_bytes) as the page of `hash`, owned by tenant. The bytes
 * are copied into a bounce buffer before the call returns (src is borrowed for the call
 * only; the tier thread checksums the copy while the write is in flight), a slot is taken
 * (the least recently used entry is evicted if none is free: counted in evictions_total and
 * drops_total) and the write is queued. The entry becomes readable (ofl_nvme_contains) when
 * the write completed whole and, for buffered I/O, was fdatasynced; its index record is
 * appended then. Returns 0 (a completion with `cookie` will come), -EEXIST (hash present or
 * being written), -ENOSPC (the tier stopped taking writes after the disk filled), -EAGAIN
 * (queue_depth operations outstanding, or every slot busy with I/O: poll and retry),
 * -EINVAL (len 0 or > slot_bytes). On an error no completion comes. Any thread; never
 * blocks on I/O. */
int ofl_nvme_write(struct ofl_nvme *n, const uint8_t hash[OFL_HASH_BYTES], uint32_t tenant,
                   const void *src, uint32_t len, uint64_t cookie);

/* Read the page of `hash` into dst[0..len) (len is the length it was written with; dst is
 * borrowed until the completion and must hold cap >= len bytes). The data is verified
 * against its checksum before the completion reports 0; a mismatch or an I/O error drops
 * the entry, and dst then holds unspecified bytes. A dst aligned to 4096 with cap >= len
 * rounded up to 4096 receives the I/O directly (no bounce copy; up to that rounded length
 * is written). Touches the entry in the LRU. Returns 0 (a completion will come), -ENOENT (no
 * complete entry: absent, dropped, or its write not finished), -EAGAIN (queue_depth
 * operations outstanding), -EINVAL (cap < len). On an error no completion comes. Any thread;
 * never blocks on I/O. */
int ofl_nvme_read(struct ofl_nvme *n, const uint8_t hash[OFL_HASH_BYTES], void *dst, uint32_t cap,
                  uint64_t cookie);

/* One finished operation. */
struct ofl_nvme_cpl {
    uint64_t cookie; /* the caller's, from write/read */
    int op;          /* enum ofl_nvme_op */
    int rc;          /* 0; -EIO (I/O error, short write or read); -EBADMSG (checksum mismatch,
                      * read); -ENOSPC (write: the disk, a quota or the file-size limit is full:
                      * ENOSPC, EDQUOT and EFBIG, also when a short write's tail says so);
                      * -ENOENT (the entry was dropped or purged meanwhile). Every rc but 0
                      * means the entry is gone */
    uint32_t len;    /* payload bytes written or read (valid when rc == 0) */
};

/* Move up to max finished operations into out[0..), oldest first. wait_ms: 0 returns at
 * once, > 0 waits up to that many ms for the first one, -1 waits until one comes (but
 * returns 0 at once when nothing is outstanding). Returns the count (>= 0), -EINVAL (max
 * 0). Any thread, one consumer at a time; blocks only as wait_ms says. */
int ofl_nvme_poll(struct ofl_nvme *n, struct ofl_nvme_cpl *out, uint32_t max, int wait_ms);

/* True when hash has a complete entry (its write finished whole; it may still fail its
 * checksum when read). Any thread. */
bool ofl_nvme_contains(struct ofl_nvme *n, const uint8_t hash[OFL_HASH_BYTES]);

/* True when hash's entry is being written: queued or in flight, not yet readable. Any
 * thread. */
bool ofl_nvme_pending(struct ofl_nvme *n, const uint8_t hash[OFL_HASH_BYTES]);

/* The tenant that wrote hash's complete entry, in *tenant. Returns 0, -ENOENT (no complete
 * entry), -EINVAL. Any thread. */
int ofl_nvme_tenant(struct ofl_nvme *n, const uint8_t hash[OFL_HASH_BYTES], uint32_t *tenant);

/* The hashes of every readable entry (this model's, complete): writes the first
 * min(count, max) into out[] and returns the count. Any thread; O(slots) under the lock. */
uint32_t ofl_nvme_hashes(struct ofl_nvme *n, uint8_t (*out)[OFL_HASH_BYTES], uint32_t max);

/* Remove hash's entry (a write still in flight for it completes with -ENOENT); its slot is
 * reused once no I/O touches it. Returns 0, -ENOENT. Any thread; never blocks on I/O. */
int ofl_nvme_drop(struct ofl_nvme *n, const uint8_t hash[OFL_HASH_BYTES]);

/* Remove every entry of tenant, including writes in flight (they complete with -ENOENT):
 * waits for I/O on those slots, appends and fdatasyncs the DEL records, then punches each
 * slot (fallocate PUNCH_HOLE, then fallocate again to keep the space) or overwrites it with
 * zeros where punching is not supported, fdatasyncs the data, and only then returns the
 * slots to the free list. Entries written after the call started are not included. Logs
 * the counts (LOG_INFO). *n_purged (may be NULL) gets the number of entries removed.
 * Returns 0, -EIO (a slot could not be cleared or the index not synced: the entries are
 * gone from the tier all the same). Any thread; blocks on I/O. */
int ofl_nvme_purge_tenant(struct ofl_nvme *n, uint32_t tenant, uint32_t *n_purged);

struct ofl_nvme_stats {
    uint64_t n_slots;                 /* slots in the data file */
    uint64_t slot_bytes;              /* payload bytes a slot holds */
    uint64_t slot_stride_bytes;       /* bytes a slot takes on disk (4 KiB multiple) */
    uint64_t slots_used;              /* complete entries plus writes in flight */
    uint64_t entries;                 /* complete entries */
    uint64_t foreign_entries;         /* slots held by other models' entries (from the index) */
    uint64_t outstanding;             /* operations accepted and not yet polled */
    uint64_t writes_total;            /* writes accepted */
    uint64_t write_failures_total;    /* writes completed with an error (disk full included) */
    uint64_t reads_total;             /* reads accepted */
    uint64_t read_failures_total;     /* reads completed with -EIO or -EBADMSG */
    uint64_t checksum_failures_total; /* reads whose data failed its checksum */
    uint64_t evictions_total;         /* LRU entries evicted to make room */
    uint64_t drops_total;             /* entries lost without being asked: evictions, failed
                                       * writes and reads, checksum mismatches */
    uint64_t removed_total;           /* entries removed by ofl_nvme_drop */
    uint64_t purged_total;            /* entries removed by ofl_nvme_purge_tenant */
    uint64_t disk_full_total;         /* writes that failed with ENOSPC/EFBIG */
    uint64_t enospc_refused_total;    /* writes refused with -ENOSPC after that */
    uint64_t bytes_written_total;     /* payload bytes of completed writes */
    uint64_t bytes_read_total;        /* payload bytes of verified reads */
    uint64_t write_ns_total;          /* sum over completed writes of queue-to-completion ns */
    uint64_t read_ns_total;           /* same for reads */
    uint64_t busy_ns_total;      /* ns the tier thread had I/O in flight: (bytes_written_total +
                                  * bytes_read_total) / busy_ns_total is the tier's bandwidth */
    uint64_t index_replayed;     /* entries restored from the index at open */
    uint64_t index_ignored_fp;   /* index records of another model fingerprint */
    uint64_t index_ignored_geom; /* index records outside this slot size or tier size */
    uint64_t index_torn;         /* 1 when a torn last record was cut off at open */
    uint64_t index_corrupt;      /* records dropped at open after a corrupt one */
    uint64_t index_compacted;    /* 1 when the index was rewritten at open */
    uint64_t index_errors_total; /* index appends that failed (those records are lost) */
    uint64_t index_bytes;        /* index file length */
    bool disk_full;              /* writes stopped: the disk or the file-size limit is full */
    bool direct;                 /* O_DIRECT in use (else buffered + fdatasync per batch) */
    bool uring;                  /* io_uring in use (else pread/pwrite on the tier thread) */
    bool fixed_buffers;          /* bounce buffers registered with io_uring */
    bool fixed_file;             /* data file registered with io_uring */
    bool sparse;                 /* preallocation failed: the data file is sparse */
};

/* A consistent snapshot of the counters (index_bytes as of the last index write). Any
 * thread; takes only the tier's short table lock, never the index lock, so it does not wait
 * behind an index flush or a purge's I/O. */
void ofl_nvme_stats_get(struct ofl_nvme *n, struct ofl_nvme_stats *out);

/* INFO-style text: "# ofl_nvme\nofl_nvme_slots:256\n..." (keys <prefix>_<noun>_<unit>,
 * counters end in _total), NUL-terminated in buf[len]. Returns 0, -ENOSPC (truncated).
 * Any thread. */
int ofl_nvme_stats_format(struct ofl_nvme *n, char *buf, size_t len);

/* Test hook: the nth I/O of `op` (enum ofl_nvme_op) from now completes with result res
 * instead of its real one (the I/O itself still runs): a negative errno, or a byte count
 * smaller than the request for a short transfer. Fires once; nth 0 turns it off. Any thread. */
void ofl_nvme_fault_inject(struct ofl_nvme *n, int op, uint64_t nth, int res);

/* Walk every invariant: slot states against the hash chains, the LRU, the tenant lists and
 * the free list; counts. Logs the first violation and returns false. O(n_slots). For tests;
 * any thread. */
bool ofl_nvme_check(struct ofl_nvme *n);

#endif /* LLMD_OFL_NVME_H */
