/* ofl_host.h - the host tier: a budgeted pool of pinned host memory that KV
 * pages spill into (cold prefix-cache pages, preempted sequences).
 *
 * Model (DESIGN.md §5): one region of `budget_bytes` of host memory, placed on
 * one NUMA node (nearest the device, found with hwloc) and pinned once at
 * creation: registered with the device driver through cfg->pin (PINNED), else
 * mlock()ed (MLOCKED), else left as plain pages (PLAIN); ofl_host_kind()
 * says which. A private jemalloc arena carves the region: its extent hooks
 * hand out region memory only, so what is allocated never exceeds the budget,
 * and splitting, coalescing and reuse of free space are jemalloc's.
 *
 * Workflow: ofl_host_create -> each I/O thread calls ofl_host_bind_thread once
 * -> ofl_host_alloc a page's bytes, copy the page in (spill) ... copy it out
 * (restore) -> ofl_host_free -> ofl_host_destroy.
 *
 * Thread safety: alloc, free, usable_size, stats, check, kind, numa_node and
 * bind_thread may be called from any thread at once (jemalloc's arena locks,
 * atomics for the counters). create and destroy run alone. create blocks while
 * it faults the region in (measured on the dev VM: 0.2-0.9 ms per MiB for
 * memory the VM has handed out before, up to 4.7 ms per MiB for fresh memory);
 * no other call blocks on I/O.
 */
#ifndef LLMD_OFL_HOST_H
#define LLMD_OFL_HOST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct ofl_host;

/* The budget is rounded up to this: the x86-64 huge page size, so the region
 * can be backed by transparent huge pages and its NUMA binding and pinning
 * work in whole huge pages. */
#define OFL_HOST_REGION_ALIGN ((size_t)2 << 20)

enum ofl_host_kind {
    OFL_HOST_PLAIN = 0, /* ordinary pages: the kernel may swap or migrate them */
    OFL_HOST_MLOCKED,   /* mlock()ed: resident, but unknown to the device driver */
    OFL_HOST_PINNED,    /* registered with the device driver by cfg->pin */
};

struct ofl_host_config {
    uint64_t bytes; /* budget, bytes, > 0; rounded up to OFL_HOST_REGION_ALIGN */
    int numa_node;  /* hwloc logical index of the node to place the region on; -1: the node
                     * nearest device_pci_bus_id, or without one, the node of the calling
                     * thread's CPUs */
    const char *device_pci_bus_id; /* "0000:3b:00.0" (cuDeviceGetPCIBusId), borrowed; NULL:
                                    * no device. Used only when numa_node is -1 */
    /* (optional, default: mlock) Register [addr, addr + bytes) with a device
     * driver (cuMemHostRegister) and return 0 or -errno; on failure the tier
     * falls back to mlock, then to plain pages, and logs why. Called once, from
     * ofl_host_create. unpin is required with pin, and is called once from
     * ofl_host_destroy (or a failing create) with the same arguments. */
    int (*pin)(void *ctx, void *addr, size_t bytes);
    void (*unpin)(void *ctx, void *addr, size_t bytes);
    void *pin_ctx; /* borrowed; must stay valid until unpin has run */
};

/* Create a host tier: map the region, bind it to the NUMA node, fault it in,
 * pin it, and create its jemalloc arena. cfg is borrowed. On success *out
 * owns the tier; free it with ofl_host_destroy(). On failure errbuf (may be
 * NULL) gets one line saying why, and nothing is left behind.
 * Returns 0, -EINVAL (bytes 0, numa_node out of range, pin without unpin, a
 * malformed bus id), -ENODEV (hwloc does not see device_pci_bus_id),
 * -ENOMEM (budget above the memory available on the node, mmap, host memory,
 * or jemalloc could not create the arena), -EIO (hwloc could not read the
 * topology), -ENOTSUP (libllmd.so only, which carries no jemalloc: the
 * process could not load libjemalloc.so.2; the message says how to fix it).
 * A failing pin or mlock is not an error (see kind). Blocks for
 * the prefault (see the top of this file). */
int ofl_host_create(const struct ofl_host_config *cfg, struct ofl_host **out, char *errbuf,
                    size_t errlen);

/* Destroy the tier: the arena, then unpin/munlock and unmap the region.
 * Every allocation must have been freed (asserted in debug builds, logged
 * otherwise); pointers into the tier are invalid afterwards. NULL is a no-op.
 * No other call may be in flight. */
void ofl_host_destroy(struct ofl_host *h);

/* Allocate `bytes` (> 0) of the tier: 4096-byte aligned when bytes is a
 * multiple of 4096, else 64-byte aligned. Contents are unspecified (stale
 * bytes of an earlier allocation). Returns NULL when the budget cannot hold
 * it (the region is full or too fragmented) or bytes is 0; never exceeds the
 * budget, never blocks on I/O. Caller frees with ofl_host_free(). Any thread. */
void *ofl_host_alloc(struct ofl_host *h, size_t bytes);

/* Free an allocation of this tier; NULL is a no-op. p must come from
 * ofl_host_alloc(h, ...): it is checked against the region, and a foreign
 * pointer asserts in debug builds and is logged and ignored in release ones
 * (never handed to jemalloc). Any thread. */
void ofl_host_free(struct ofl_host *h, void *p);

/* The usable size of an allocation of `bytes`: jemalloc's size class (2 MiB
 * for 2 MiB, 2.5 MiB for 2 MiB + 1 byte), which is what used_bytes counts.
 * A large allocation (>= 16 KiB) also takes one more 4 KiB page of the region
 * (jemalloc 5.3's cache-oblivious padding), not counted in used_bytes: N
 * allocations of 2 MiB need N x (2 MiB + 4 KiB). 0 when bytes is 0 or too
 * large. Any thread. */
size_t ofl_host_usable_size(const struct ofl_host *h, size_t bytes);

/* Constant for the tier's life; any thread. */
enum ofl_host_kind ofl_host_kind(const struct ofl_host *h);
const char *ofl_host_kind_name(enum ofl_host_kind k); /* "plain", "mlocked", "pinned" */
int ofl_host_numa_node(const struct ofl_host *h);     /* hwloc logical index, -1 unknown */

/* Bind the calling thread to the CPUs of the tier's NUMA node (those the
 * process may use), with hwloc. A thread already confined to them is left as
 * it is, so on a one-node machine this is a no-op (that still asks hwloc).
 * Returns 0, -ENOTSUP (the node has no CPU this process may use), -ENOMEM,
 * or the -errno of the failed binding. Any thread; call it from the I/O thread
 * itself. */
int ofl_host_bind_thread(const struct ofl_host *h);

struct ofl_host_stats {
    uint64_t budget_bytes;         /* the region: cfg->bytes rounded up */
    uint64_t used_bytes;           /* sum of the size classes of live allocations (see
                                    * ofl_host_usable_size), not of the bytes asked */
    uint64_t meta_bytes;           /* jemalloc's metadata for the arena: plain memory
                                    * outside the region and the budget */
    uint64_t allocs_total;         /* successful ofl_host_alloc calls */
    uint64_t frees_total;          /* ofl_host_free calls with a pointer */
    uint64_t alloc_failures_total; /* ofl_host_alloc calls that returned NULL (bytes > 0) */
};

/* The counters, each read atomically (not one snapshot across them while
 * other threads allocate). Any thread. */
void ofl_host_stats_get(const struct ofl_host *h, struct ofl_host_stats *out);

/* INFO-style text: "# ofl_host\nofl_host_kind:mlocked\nofl_host_numa_node:0\n
 * ofl_host_budget_bytes:...", keys <prefix>_<noun>_<unit>, counters ending in
 * _total; NUL-terminated in buf[len]. Returns 0, -ENOSPC (truncated). Any
 * thread. */
int ofl_host_stats_format(const struct ofl_host *h, char *buf, size_t len);

/* Walk the invariants: used <= budget, frees <= allocs, the hooks' cursor
 * inside the region, and jemalloc's own count of allocated bytes in the
 * arena equal to used_bytes. Logs the first violation and returns false.
 * Call with no alloc or free in flight (the comparison with jemalloc needs a
 * quiescent arena). For tests; any thread. */
bool ofl_host_check(const struct ofl_host *h);

#endif /* LLMD_OFL_HOST_H */
