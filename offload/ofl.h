/* ofl.h - the tiers below the device pool: where cold KV pages go and how
 * they come back (DESIGN.md §5, docs/offload.md).
 *
 * Model: a page leaves the device only as a whole, keyed by its prefix-cache
 * chain hash (a page's K/V is a pure function of that hash: the tokens, every
 * earlier token, the model and the namespace). Demotion chain:
 *   device --evict--> host (pinned memory, ofl_host) --demote--> NVMe
 *   (slot file, ofl_nvme) --demote--> dropped (recomputed when needed).
 * The host tier is exclusive (a restored page leaves it); the NVMe tier is
 * inclusive and persistent (its index survives a restart, so a restart finds
 * the prefixes spilled before it). Least recently used goes first in each
 * tier. A page is kept lower only when bringing it back beats recomputing it
 * (bytes / tier bandwidth vs tokens / prefill rate, both measured).
 *
 * Ordering: ofl_spill() copies the device page while vmm holds it SPILLING
 * (the prefix cache's spill hook), so the page is reused only after its bytes
 * are in the host tier; a demotion copies them into an NVMe bounce buffer
 * before the host copy is freed. ofl_restore() verifies NVMe data (xxh3)
 * before filling the device page, and the page is shared only once sealed.
 *
 * Workflow (the engine): ofl_create with the device vmm -> from the pfx spill
 * hook, ofl_spill -> at lookup, for the chain past the device hits,
 * ofl_find then ofl_restore + pfx_insert -> ofl_poll once a step (reaps NVMe
 * completions) -> ofl_purge_tenant for admin purges -> ofl_destroy.
 *
 * Thread safety: every call from one thread (the engine's), except
 * ofl_log_read() on ofl_eviction_log(), which any thread may call. The NVMe tier's I/O runs on its
 * own thread; only ofl_restore from NVMe and ofl_destroy wait for it.
 */
#ifndef LLMD_OFL_H
#define LLMD_OFL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "offload/ofl_log.h"

struct ofl;
struct vmm;

#define OFL_KEY_BYTES 32 /* = PFX_HASH_BYTES */

enum ofl_policy {
    OFL_POLICY_AUTO = 0, /* keep a page lower only when restoring beats recomputing */
    OFL_POLICY_ALWAYS,   /* keep every page the tiers can hold (tests, benchmarks) */
};

struct ofl_config {
    struct vmm *vmm;       /* the device pool; borrowed, outlives the ofl */
    uint64_t host_bytes;   /* host tier budget; 0: none (then no NVMe tier either) */
    const char *nvme_path; /* slot file or block device; NULL: no NVMe tier */
    uint64_t nvme_bytes;   /* NVMe tier size; 0: 4 GiB */
    uint8_t model_fp[32];  /* NVMe entries of another model are not read, but keep their slots */
    enum ofl_policy policy;
    double prefill_tokens_per_s; /* measured by the engine; 0: unknown (keep everything) */
    uint32_t log_events;         /* eviction log ring; 0: 4096 */
    /* With a GPU pool: page-lock the host tier and the NVMe staging buffer
     * with the driver (ofl_host.h's pin/unpin, e.g. cuMemHostRegister), and
     * place them near the device. NULL: mlock where allowed. */
    int (*pin)(void *ctx, void *addr, size_t bytes);
    void (*unpin)(void *ctx, void *addr, size_t bytes);
    void *pin_ctx;
    const char *device_pci_bus_id; /* borrowed for ofl_create; NULL: the caller's node */
    /* (optional, default: none) Called when a tier below the device starts (held) or
     * stops holding a page: tier OFL_TIER_HOST (on the engine thread, inside the call
     * that moved it) or OFL_TIER_NVME (when its write completed, or as it goes: under the
     * NVMe tier's lock, on the tier thread or the engine's). Pages replayed from the NVMe
     * index at create (and the pages ofl_create writes to measure the tier) are not
     * reported: ofl_hashes() lists the former. Must not call into ofl. */
    void (*tier_hook)(void *ctx, const uint8_t hash[OFL_KEY_BYTES], uint32_t tenant,
                      enum ofl_tier tier, bool held);
    void *tier_ctx;
};

/* Create the tiers: allocate and pin the host tier, open the NVMe slot file
 * and replay its index, and measure each tier's copy bandwidth with a few
 * pages (logged, exported in stats). cfg is borrowed. errbuf (may be NULL)
 * gets one line saying why on failure. Returns 0, -EINVAL (bad config),
 * -ENOMEM, -ENOTSUP (a library is missing), -errno of the slot file. */
int ofl_create(const struct ofl_config *cfg, struct ofl **out, char *errbuf, size_t errlen);

/* Flush and close the tiers (waits for NVMe writes in flight, syncs the
 * index), free everything. NULL is a no-op. */
void ofl_destroy(struct ofl *o);

/* Keep device page `page` (SPILLING in vmm: the pfx spill hook) in the host
 * tier under hash, demoting the host tier's least recently used pages to
 * NVMe (or dropping them) to make room. Returns 0 (kept), -ENOSPC (no tier
 * could take it: dropped), -ECANCELED (the policy dropped it: recomputing is
 * cheaper), -EEXIST (already below; nothing copied), -EIO (the device copy
 * failed: dropped). The page may be freed on return whatever happened. */
int ofl_spill(struct ofl *o, const uint8_t hash[OFL_KEY_BYTES], uint32_t page, uint32_t tenant,
              uint8_t prio);

/* The tier holding hash below the device: OFL_TIER_HOST, OFL_TIER_NVME, or
 * OFL_TIER_NONE. O(1) and no I/O, except that an NVMe entry whose write is
 * still in flight is waited for (reaping completions, at most ~1 s) rather
 * than reported missing. */
enum ofl_tier ofl_find(struct ofl *o, const uint8_t hash[OFL_KEY_BYTES]);

/* Bring hash's page back: take a free device page, fill it from the host
 * tier (a copy) or from NVMe (a read, waited for and verified), and leave it
 * RESTORING in vmm for the caller to pfx_insert() (or vmm_page_restore_abort
 * on failure). *page gets it, and *tenant and *prio the entry's owner and class.
 * The host entry is consumed; an NVMe entry stays. Returns 0, -ENOENT (not
 * below), -ENOSPC (no free device page), -EBADMSG (checksum mismatch: the
 * entry is dropped and counted), -EIO (read or copy failed: dropped). */
int ofl_restore(struct ofl *o, const uint8_t hash[OFL_KEY_BYTES], uint32_t *page, uint32_t *tenant,
                uint8_t *prio);

/* The hashes tier (OFL_TIER_HOST or OFL_TIER_NVME: readable entries) holds: writes
 * the first min(count, max) into out[] and returns the count; 0 for a tier it lacks.
 * Owner thread; O(entries). */
uint32_t ofl_hashes(struct ofl *o, enum ofl_tier tier, uint8_t (*out)[OFL_KEY_BYTES], uint32_t max);

/* Reap finished NVMe I/O (failed writes are dropped and counted). Never
 * waits. Call once a step. */
void ofl_poll(struct ofl *o);

/* What one flush did to the pages it handled (device pages spilled since
 * ofl_flush_begin(), then every host-tier page). */
struct ofl_flush_counts {
    uint32_t written; /* written to the NVMe tier, the write completed */
    uint32_t present; /* already on the NVMe tier (restored from it, or written before) */
    uint32_t lost;    /* kept by no tier: the NVMe tier refused (full disk) or the write
                       * failed, or a host-tier copy could not be made */
};

/* Start a flush: from now until ofl_flush() every page is kept wherever a
 * tier can hold it, whatever the spill policy says (OFL_POLICY_AUTO drops a
 * page whose restore is measured slower than its recompute; at shutdown the
 * alternative to writing it is losing it, and the next run restores what it
 * finds), and what happens to each is counted. Call it before evicting the
 * device's cached pages into the tiers; idempotent. */
void ofl_flush_begin(struct ofl *o);

/* Hand every host-tier page on to NVMe and wait for the writes, so a clean
 * shutdown keeps the cached prefixes; end the flush (the policy is back) and
 * put its counts in *out (may be NULL). Begins one if the caller did not.
 * Without an NVMe tier nothing is written (the counts are 0 but for lost
 * device pages). Blocks on I/O (bounded: 10 s without progress). */
void ofl_flush(struct ofl *o, struct ofl_flush_counts *out);

/* Tell the policy the prefill rate measured since (tokens per second). */
void ofl_prefill_rate_set(struct ofl *o, double tokens_per_s);

struct ofl_purge_counts {
    uint32_t host_pages, nvme_pages;
};

/* Remove every entry of tenant from every tier below the device: host
 * copies are zeroed and freed, NVMe slots punched or zeroed before reuse.
 * Each entry goes to the eviction log; the totals are logged. Returns 0. */
int ofl_purge_tenant(struct ofl *o, uint32_t tenant, struct ofl_purge_counts *out);

struct ofl_stats {
    /* host tier */
    const char *host_kind; /* "pinned", "mlocked", "plain"; static; "" without */
    uint64_t host_bytes, host_used_bytes, host_pages;
    uint64_t host_pages_max; /* pages it can hold: its entries, or fewer if the budget fits fewer */
    double host_bw_bytes_per_s; /* measured copy bandwidth device<->host */
    /* NVMe tier */
    bool nvme, nvme_direct, nvme_uring, nvme_disk_full;
    uint64_t nvme_slots, nvme_pages;
    double nvme_write_bw_bytes_per_s, nvme_read_bw_bytes_per_s;
    /* moves */
    uint64_t spills_total[OFL_TIER_NONE + 1];   /* pages into each tier (NONE: drops) */
    uint64_t restores_total[OFL_TIER_NONE + 1]; /* pages restored to the device from each tier */
    uint64_t spill_bytes_total[OFL_TIER_NONE + 1];
    uint64_t restore_bytes_total[OFL_TIER_NONE + 1];
    uint64_t drops_total;          /* pages no tier kept (policy, full tiers, faults) */
    uint64_t policy_drops_total;   /* of which the policy chose */
    uint64_t write_failures_total; /* NVMe writes failed or short (entry dropped) */
    uint64_t checksum_failures_total;
    uint64_t read_failures_total;
    uint64_t purged_total;
    double prefill_tokens_per_s; /* what the policy compares against */
    double recompute_ns_per_page, host_restore_ns_per_page, nvme_restore_ns_per_page;
};

/* A snapshot of the counters. Owner thread. */
void ofl_stats_get(struct ofl *o, struct ofl_stats *out);

/* The eviction log, for ofl_log_read() from any thread. Valid until
 * ofl_destroy(). */
struct ofl_log *ofl_eviction_log(struct ofl *o);

#endif /* LLMD_OFL_H */
