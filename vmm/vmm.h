/* vmm.h - the KV page pool and the sequence ranges it maps pages into.
 *
 * Model (DESIGN.md §2-3): a pool of N physical pages of P bytes, and n_ranges
 * sequence slots, each a reserved, contiguous VA range of T_max tokens of S
 * bytes (token t of a sequence at base + t*S). Pages are mapped into a range
 * as its prefix [0, n_mapped): page idx covers tokens [idx*tpp, (idx+1)*tpp)
 * with tpp = P / S. A page may be mapped into several ranges at once (prefix
 * sharing, refcounted); vmm_range_cow() makes a shared page private before it
 * is written. A sealed page (full, hashed prefix page) stays CACHED when its
 * last mapping goes, until vmm_page_evict().
 *
 * Workflow: vmm_create -> vmm_range_acquire -> vmm_range_grow (or
 * vmm_range_share for cached prefix pages, then grow) -> write K/V at
 * vmm_range_base + t*S -> vmm_page_seal full pages -> vmm_range_release.
 *
 * Guarantees: every operation is all-or-nothing: when it returns an error the
 * pool and every range are exactly as before (a failed backend call in the
 * middle of a grow unmaps what it mapped). Thread safety: one pool mutex; every
 * function may be called from any thread (the scheduler thread and a map-ahead
 * thread at once, typically); calls that map or unmap hold the lock across the
 * backend calls (microseconds per page, no I/O).
 */
#ifndef LLMD_VMM_H
#define LLMD_VMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "vmm_backend.h"

struct vmm;

#define VMM_PAGE_NONE UINT32_MAX

enum vmm_page_state {
    VMM_PAGE_FREE = 0, /* on the free list, refcount 0 */
    VMM_PAGE_MAPPED,   /* mapped by refcount >= 1 ranges */
    VMM_PAGE_CACHED,   /* sealed, refcount 0: mapped nowhere, kept for the prefix cache */
    VMM_PAGE_SPILLING, /* sealed, unmapped, being copied to a lower tier (offload/) */
    VMM_PAGE_RESTORING /* off the free list, filled from a lower tier, not yet sealed */
};

struct vmm_config {
    /* NULL: vmm creates the host backend with `huge`. vmm takes ownership of a
     * given backend: it destroys it in vmm_destroy(), and on vmm_create() failure. */
    struct vmm_backend *backend;
    enum vmm_huge huge;    /* host backend made by vmm only */
    size_t token_bytes;    /* S, bytes of one token's K+V for all layers; padded up to 64 B */
    size_t page_bytes;     /* requested P, bytes; first capped to max_tokens padded strides
                            * (a bigger page could never be addressed), then rounded UP to a
                            * multiple of both the backend granularity and the padded S;
                            * 0 = the smallest such */
    uint32_t n_pages;      /* pool size in pages; 0: budget_bytes / P (at least 1) */
    uint64_t budget_bytes; /* pool budget in bytes, used when n_pages is 0; when both are
                              0, n_ranges * (pages a range can map): every range can
                              reach max_tokens at once. A budget_bytes above that is
                              capped to it (n_pages is never capped). */
    uint32_t n_ranges;     /* sequence slots, >= 1 */
    uint32_t max_tokens;   /* T_max, >= 1: each range reserves T_max*S bytes of VA, rounded
                            * up to whole pages */
    bool zero_pages;       /* zero a page when it leaves the free list (else its contents are
                            * unspecified: stale data of an earlier user) */
    bool prefault;         /* host backend made by vmm: allocate every page at creation so
                            * first use costs no allocation (a given backend keeps its own
                            * setting, see vmm_host_prefault_set) */
};

/* Create a pool. cfg is borrowed. On success *out owns the pool; free it with
 * vmm_destroy(). On failure errbuf (may be NULL) gets one line saying why.
 * Returns 0, -EINVAL (bad config), -ENOMEM (host memory, VA, or a config that
 * could exceed vm.max_map_count on the host backend), -ENOTSUP (huge pages
 * required but unavailable), -EIO (backend). Any thread. */
int vmm_create(const struct vmm_config *cfg, struct vmm **out, char *errbuf, size_t errlen);

/* Destroy a pool: unmaps every page still mapped, frees the pages, releases
 * the VA and destroys the backend. NULL is a no-op. No other thread may use
 * the pool during or after the call. */
void vmm_destroy(struct vmm *v);

/* Geometry, constant for the pool's life; any thread, no lock. */
size_t vmm_page_bytes(const struct vmm *v);        /* P, bytes */
size_t vmm_token_bytes(const struct vmm *v);       /* padded S, bytes */
uint32_t vmm_tokens_per_page(const struct vmm *v); /* P / S */
uint32_t vmm_n_pages(const struct vmm *v);         /* N */
uint32_t vmm_range_max_pages(const struct vmm *v); /* pages a range can map */
const char *vmm_backend_name(const struct vmm *v); /* "host", "cuda"; static string */
/* The pool's backend (borrowed, owned by the pool), for backend-specific
 * calls such as vmm_cuda_host_register(); any thread, no lock, but calls
 * into it must not race with the pool's own (vmm_backend.h). */
struct vmm_backend *vmm_get_backend(struct vmm *v);

/* Take a free sequence slot; the lowest free index first on a fresh pool.
 * Returns 0, -EBUSY (no free slot). Any thread. */
int vmm_range_acquire(struct vmm *v, uint32_t *range);

/* Unmap every page of `range` (one backend call), drop their refcounts (a
 * page left at 0 becomes FREE, or CACHED if sealed) and free the slot.
 * Returns 0, -EINVAL (not acquired), -EIO/-ENOMEM (unmap failed: nothing
 * changed, the range is still held). Any thread. */
int vmm_range_release(struct vmm *v, uint32_t range);

/* Base VA of range (host: a process address; cuda: a CUdeviceptr); token t
 * at base + t*S. Constant for the pool's life, acquired or not; 0 for an
 * out-of-bounds index. Any thread, no lock. */
uintptr_t vmm_range_base(const struct vmm *v, uint32_t range);

/* The extent of range: indices [0, n) have held a page, [n_dropped, n) are
 * mapped (without vmm_range_drop_front, all of them). 0 for a free slot. */
uint32_t vmm_range_n_mapped(const struct vmm *v, uint32_t range);

/* Leading indices of range unmapped by vmm_range_drop_front (0 for a free
 * slot). */
uint32_t vmm_range_n_dropped(const struct vmm *v, uint32_t range);

/* A sliding window: unmap indices [n_dropped, n_pages) of range (one backend
 * call), the oldest pages no later token reads; their refcounts drop as in
 * release (a sealed page stays CACHED for the prefix cache). The extent and
 * every address stay: vmm_range_page() of a dropped index is VMM_PAGE_NONE,
 * grow goes on from the extent, shrink may not cut into the dropped front
 * (-EINVAL), release unmaps what is left. n_pages <= n_dropped is a no-op.
 * Returns 0, -EINVAL (not acquired, n_pages > the extent), -EIO/-ENOMEM
 * (unmap failed: nothing changed). Any thread. */
int vmm_range_drop_front(struct vmm *v, uint32_t range, uint32_t n_pages);

/* Tokens covered by the mapped pages: n_mapped * tokens_per_page. */
uint32_t vmm_range_capacity(const struct vmm *v, uint32_t range);

/* Pool page mapped at page index idx of range, or VMM_PAGE_NONE. */
uint32_t vmm_range_page(const struct vmm *v, uint32_t range, uint32_t idx);

/* Map pages so that tokens [0, n_tokens) are backed: pages [n_mapped,
 * ceil(n_tokens/tpp)) are taken from the free list (zeroed if zero_pages) and
 * mapped. No-op when already backed (pages mapped ahead count). All or
 * nothing. Returns 0, -EINVAL (not acquired), -ERANGE (n_tokens > max_tokens),
 * -ENOSPC (not enough free pages), -ENOMEM/-EIO (backend). Any thread; holds
 * the lock across the backend calls (one map per page, or one map_span for
 * all of them where the backend has it: cuda). */
int vmm_range_grow(struct vmm *v, uint32_t range, uint32_t n_tokens);

/* Unmap the pages wholly past n_tokens (index >= ceil(n_tokens/tpp)) in one
 * backend call; their refcounts drop as in release. No-op when nothing lies
 * past. Returns 0, -EINVAL (not acquired, or n_tokens > 0 ends inside a
 * front vmm_range_drop_front unmapped), -ERANGE (n_tokens > max_tokens),
 * -EIO/-ENOMEM (unmap failed, nothing changed). Any thread. */
int vmm_range_shrink(struct vmm *v, uint32_t range, uint32_t n_tokens);

/* Map existing pool page `page` (MAPPED or CACHED) as the next page of range,
 * at idx = n_mapped, refcount + 1 (a CACHED page becomes MAPPED). Shrink away
 * pages mapped ahead first if the prefix must land at a given index (and
 * check vmm_range_page() after: a map-ahead thread working on the same range
 * in between moves it). Returns
 * 0, -EINVAL (not acquired, bad page, page FREE), -EBUSY (page SPILLING or
 * RESTORING), -ERANGE (range full), -ENOMEM/-EIO (backend). Any thread. */
int vmm_range_share(struct vmm *v, uint32_t range, uint32_t page);

/* Make page idx of range private before a write: if its page is shared
 * (refcount > 1) or sealed, copy it to a fresh page and map that one instead
 * (the old page loses one reference: at 0 it is CACHED or FREE). No-op when
 * already private. Returns 0, -EINVAL (not acquired, idx >= n_mapped), -ENOSPC
 * (no free page), -ENOMEM/-EIO (backend; the old page stays mapped). Three
 * backend calls: copy, unmap, map. Any thread. */
int vmm_range_cow(struct vmm *v, uint32_t range, uint32_t idx);

/* Map up to n_pages more pages past the current extent of range, as grow
 * does, so a later grow finds them mapped. Maps min(n_pages, free pages,
 * room left in the range). Returns the number of pages mapped (>= 0; 0 when
 * the range is full or n_pages is 0), -ENOSPC (room and n_pages > 0 but no
 * free page), -EINVAL (not acquired), -ENOMEM/-EIO (backend: nothing mapped).
 * Meant for a background thread; any thread. */
int vmm_range_map_ahead(struct vmm *v, uint32_t range, uint32_t n_pages);

/* Mark page as holding a full, hashed prefix page: when its refcount reaches
 * 0 it becomes CACHED, not FREE. hash_slot and tenant are the prefix cache's
 * (vmm only stores them). Sealing a sealed page updates both; sealing a
 * RESTORING page makes it CACHED. Returns 0, -EINVAL (bad page, or FREE),
 * -EBUSY (SPILLING). Any thread. */
int vmm_page_seal(struct vmm *v, uint32_t page, uint32_t hash_slot, uint32_t tenant);

/* CACHED -> FREE (unsealed). Returns 0, -EBUSY (refcount > 0 or pinned), -EINVAL (bad
 * page, not CACHED). Any thread. */
int vmm_page_evict(struct vmm *v, uint32_t page);

/* Pin a MAPPED or CACHED page without mapping it: vmm_page_evict() refuses
 * it (-EBUSY) until the matching vmm_page_unpin(), so a page a waiting
 * request was promised by the prefix cache is still there when the request
 * gets a range and shares it. One vmm_page_unpin() per successful
 * vmm_page_pin(). Pins do not count as mappings (refcount) and do not change
 * the page's state. Returns 0, -EINVAL (bad page, or FREE/spilling),
 * -EOVERFLOW (65535 pins). Any thread; takes the pool lock. */
int vmm_page_pin(struct vmm *v, uint32_t page);
void vmm_page_unpin(struct vmm *v, uint32_t page);

/* Offload (DESIGN §5, offload/). A spill moves a cached page's bytes down a
 * tier and frees it; a restore fills a free page from a lower tier and hands
 * it to the prefix cache. The SPILLING and RESTORING states keep every other
 * call off the page meanwhile (share, pin, evict, seal refuse or skip it), so
 * a device page is reused only after its copy completed, and a restored page
 * is mapped only after its bytes are in place.
 *
 *   spill:   vmm_page_spill_begin -> vmm_page_read -> vmm_page_spill_end(done)
 *   restore: vmm_page_restore -> vmm_page_seal (-> CACHED) or _restore_abort
 */

/* CACHED page with no mapping and no pin -> SPILLING. Returns 0, -EBUSY
 * (mapped or pinned), -EINVAL (bad page, not CACHED). Any thread. */
int vmm_page_spill_begin(struct vmm *v, uint32_t page);

/* End a spill: done -> the page is unsealed and FREE (its bytes now live in
 * the lower tier); !done (the copy or the tier failed) -> back to CACHED,
 * unchanged. Returns 0, -EINVAL (not SPILLING). Any thread. */
int vmm_page_spill_end(struct vmm *v, uint32_t page, bool done);

/* Copy the page_bytes of a MAPPED, CACHED or SPILLING page to host memory
 * dst (borrowed, page_bytes long). Returns 0, -EINVAL (bad page or state,
 * NULL dst), -EIO (backend; injectable with vmm_fault_inject). Any thread;
 * holds the lock for the copy (host: a memcpy; cuda: one synchronized D2H). */
int vmm_page_read(struct vmm *v, uint32_t page, void *dst);

/* Take a free page, copy src[0, page_bytes) (borrowed) into it and hold it
 * RESTORING: refcount 0, unsealed, off the free list, invisible to every
 * range. vmm_page_seal() makes it CACHED for the prefix cache to index;
 * vmm_page_restore_abort() gives it back. Returns 0 and *page, -ENOSPC (no
 * free page), -EINVAL (NULL args), -EIO (backend: the page stays free). Any
 * thread; holds the lock for the copy. */
int vmm_page_restore(struct vmm *v, const void *src, uint32_t *page);

/* RESTORING -> FREE. Returns 0, -EINVAL (not RESTORING). Any thread. */
int vmm_page_restore_abort(struct vmm *v, uint32_t page);

struct vmm_page_info {
    enum vmm_page_state state;
    uint32_t refcount;    /* number of range mappings */
    uint32_t hash_slot;   /* VMM_PAGE_NONE unless sealed */
    uint32_t tenant;      /* 0 unless sealed */
    uint64_t last_use_ns; /* CLOCK_MONOTONIC of the last map or share; 0 never */
};

/* A snapshot of page's metadata. Returns 0, -EINVAL (bad page). Any thread. */
int vmm_page_info(const struct vmm *v, uint32_t page, struct vmm_page_info *out);

/* Ranges that map page, written to ranges[0..min(count, max)) in range
 * order (a range mapping it twice appears twice); returns the total count.
 * O(n_ranges * pages per range): introspection only. Any thread. */
uint32_t vmm_page_owners(const struct vmm *v, uint32_t page, uint32_t *ranges, uint32_t max);

struct vmm_stats {
    uint64_t n_pages, pages_free, pages_mapped, pages_cached;
    uint64_t n_ranges, ranges_in_use;
    uint64_t page_bytes, token_bytes, va_reserved_bytes;
    uint64_t map_calls_total;       /* pages mapped by successful backend map calls (a
                                     * map_span call counts each page of its span) */
    uint64_t unmap_calls_total;     /* successful backend unmap calls (one may span pages) */
    uint64_t cow_total;             /* pages copied by vmm_range_cow */
    uint64_t dropped_front_total;   /* pages unmapped by vmm_range_drop_front */
    uint64_t map_ahead_pages_total; /* pages mapped by vmm_range_map_ahead */
    uint64_t grow_waited_total;     /* grows that had to map a page themselves */
    uint64_t backend_errors_total;  /* failed backend calls, injected ones included */
    uint64_t pages_spilling, pages_restoring; /* gauges: offload in progress */
    uint64_t spills_total;                    /* vmm_page_spill_end(done): pages freed by a spill */
    uint64_t restores_total;                  /* vmm_page_restore: pages filled from a lower tier */
    uint64_t range_pages_mapped; /* gauge: n_mapped summed over ranges (a page mapped by k
                                  * ranges counts k times); read in one snapshot with
                                  * pages_free, so free + this is unchanged by a map-ahead */
};

/* A consistent snapshot of the counters, taken under the pool lock. O(n_ranges). Any thread. */
void vmm_stats_get(const struct vmm *v, struct vmm_stats *out);

/* INFO-style text: "# vmm\nvmm_backend:host\nvmm_pages:64\nvmm_pages_free:12\n..."
 * (keys <prefix>_<noun>_<unit>, counters end in _total), NUL-terminated in
 * buf[len]. Returns 0, -ENOSPC (truncated). Any thread. */
int vmm_stats_format(const struct vmm *v, char *buf, size_t len);

/* Compact map of the pool, one char a page, 64 a line, each line ending in
 * '\n': '.' free, 'M' mapped once, '2'..'9' mapped by that many ranges, '+'
 * by more, 'C' cached, 'S' spilling, 'R' restoring. NUL-terminated. Returns
 * 0, -ENOSPC (truncated). Any thread. */
int vmm_pool_map_format(const struct vmm *v, char *buf, size_t len);

/* Test hook: the nth backend call (map, unmap or copy) from now fails with
 * -EIO without reaching the backend; fires once. 0 turns it off. */
void vmm_fault_inject(struct vmm *v, uint64_t nth);

/* Walk every invariant: free list vs page states, refcounts == number of
 * range mappings, states vs refcount and seal, mapped prefixes, slot list,
 * counts. Logs the first violation and returns false. O(N + n_ranges *
 * pages per range). For tests; any thread. */
bool vmm_check(const struct vmm *v);

#endif /* LLMD_VMM_H */
