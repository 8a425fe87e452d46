/* pfx.h - the prefix cache: which vmm pages already hold the K/V of a token
 * prefix (DESIGN.md §4, docs/prefix-cache.md).
 *
 * Model: every FULL page i of a sequence has a chained keyed hash
 *   h_i = HMAC-SHA256(secret, h_{i-1} || tokens of page i (int32 LE) || model fp || namespace)
 * with h_{-1} = 32 zero bytes (HMAC: RFC 2104). A page's K/V depends on every
 * earlier token, hence the chain. The index maps h_i -> vmm page; the page is
 * sealed in vmm, so when its last range lets go it stays CACHED (refcount 0)
 * until pfx evicts it. Only pfx evicts cached pages.
 *
 * Workflow (the engine, for one new sequence):
 *   pfx_chain(ns, tokens) -> h[0..n)           any thread, pure
 *   k = pfx_lookup(h, n, pages)               longest cached prefix
 *   vmm_range_share(range, pages[0..k))        before any other pfx call
 *   prefill tokens [k*tpp, ...), then for each page that became full:
 *   pfx_insert(h[i], page, tenant, prio)       seals it (or -EEXIST: keep it private)
 *   pfx_evict(want) when vmm has too few free pages
 *
 * Thread safety: pfx_chain(), pfx_secret_load() and pfx_stats_format() of a
 * snapshot are any-thread. Every other call mutates or walks the index and
 * must come from one thread at a time (the scheduler's); none blocks on I/O.
 * The borrowed vmm is thread-safe by itself.
 */
#ifndef LLMD_PFX_H
#define LLMD_PFX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/model/model_fp.h"

struct pfx;
struct vmm;

#define PFX_KEY_BYTES  32
#define PFX_HASH_BYTES 32
#define PFX_N_PRIO     4 /* priority classes: 0 most valuable .. 3 evicted first */
#define PFX_NO_LIMIT   UINT32_MAX

/* Priority classes the engine uses; any value < PFX_N_PRIO is accepted. */
enum pfx_prio {
    PFX_PRIO_PINNED = 0, /* operator-declared shared scopes (system prompts) */
    PFX_PRIO_HIGH = 1,   /* requests of high priority */
    PFX_PRIO_NORMAL = 2, /* the default */
    PFX_PRIO_LOW = 3,    /* batch/offline work: first to go */
};

struct pfx_hash {
    uint8_t b[PFX_HASH_BYTES];
};

/* A namespace scope. bytes are opaque and chosen by the SERVER from what it
 * authenticated (the tenant of the API key, an operator-declared shared scope,
 * a request's cache_salt appended to the tenant): never a client-supplied
 * value taken on trust, or one tenant could name another's namespace and read
 * its cached prefixes back through timing or hit counts.
 *
 * Scope rule: scopes are listed widest first. Scope k covers the FULL pages
 * that lie wholly inside tokens [0, end_tokens) and are not covered by an
 * earlier scope; the last scope's end_tokens is ignored and it covers every
 * page left. So the chain starts in the widest scope and narrows, never widens
 * (end_tokens must not decrease), and a page that straddles a scope's end
 * belongs to the narrower scope. Example: {org, 1000}, {tenant, -}: with 16
 * tokens a page, pages 0..61 (tokens < 992) hash under "org", page 62 on
 * under "tenant". */
struct pfx_ns {
    const void *bytes;   /* borrowed; may be NULL when n_bytes is 0 */
    uint32_t n_bytes;    /* 0 is a valid (global) namespace */
    uint32_t end_tokens; /* scope ends before this token (all scopes but the last) */
};

struct pfx_config {
    uint8_t secret[PFX_KEY_BYTES];    /* HMAC key: pfx_secret_load() */
    uint8_t model_fp[MODEL_FP_BYTES]; /* model_fingerprint() */
    uint32_t evict_scan_max;          /* bound on referenced entries one call may step
                                       * over (see pfx_evict); 0: 64 */
    /* (optional, default: evicted pages are dropped) Called by pfx_evict()
     * for each indexed entry it evicts, with the page SPILLING in vmm
     * (vmm_page_spill_begin done, so nothing maps, pins or frees it): the
     * hook may vmm_page_read() it into a lower tier (offload/). The page is
     * freed when the hook returns, whatever it did. Runs on the owner
     * thread; must not call back into pfx. Limit evictions and purges never
     * spill. */
    void (*spill)(void *ctx, const struct pfx_hash *h, uint32_t page, uint32_t tenant,
                  uint8_t prio);
    void *spill_ctx;
    /* (optional, default: none) Called whenever an entry leaves the index
     * (evicted, spilled: after the spill hook, purged, over a tenant's
     * limit), with its hash and owner, before pfx_insert() could take the
     * hash again. Runs on the owner thread; must not call back into pfx. */
    void (*removed)(void *ctx, const struct pfx_hash *h, uint32_t tenant);
    void *removed_ctx;
};

/* Load the HMAC secret: from the file `path` if non-NULL (64 hex digits, or
 * exactly 32 raw bytes; surrounding whitespace ignored; warns when group or
 * others may read it), else from the environment variable LLMD_PFX_SECRET (64
 * hex digits), else 32 random bytes for this process (RAND_bytes), with an
 * info line saying cached prefixes will not survive a restart. *ephemeral (may
 * be NULL) says which. A configured but bad source is an error, never a
 * silent fallback to a random key. Returns 0, -EINVAL (bad length or
 * digits), -errno of open/read, -EIO (RAND_bytes failed). Any thread. */
int pfx_secret_load(const char *path, uint8_t key[PFX_KEY_BYTES], bool *ephemeral);

/* The key file kept beside an NVMe tier (PATH.key), for a tier without a
 * configured secret: read it when it exists, else create it with a random
 * key (64 hex digits and a newline, mode 0600, made atomically: a reader
 * never sees half a key) and say so in *created. An existing file is refused
 * when group or others may read it, or when it is not a regular file (a
 * symbolic link included): the key is what keeps one deployment's cached
 * prefixes unguessable. Returns 0, -EPERM (refused: its mode or type),
 * -EINVAL (not a key), -errno of open/read/link (-EACCES: not ours to read).
 * Any thread. */
int pfx_secret_keyfile(const char *path, uint8_t key[PFX_KEY_BYTES], bool *created);

/* Create an empty index for every page of v. cfg is borrowed (copied); v is
 * borrowed and must outlive the index. On success *out owns it; free it with
 * pfx_destroy(). Returns 0, -EINVAL (NULL args), -ENOMEM. Owner thread. */
int pfx_create(const struct pfx_config *cfg, struct vmm *v, struct pfx **out);

/* Evict every unreferenced entry's page back to vmm's free list and free the
 * index. NULL is a no-op. Entries still mapped by some range (a programmer
 * error: release ranges first) are asserted against in debug builds; in
 * release they are logged and their pages stay sealed in vmm. Owner thread. */
void pfx_destroy(struct pfx *p);

/* Hashes of the full pages of tokens[0, n_tokens): out[i] for pages i in
 * [*n_out, n_tokens / tpp), where on entry *n_out is how many leading hashes
 * out[] already holds for these tokens and scopes (0 for a fresh chain; the
 * engine passes its previous count to extend a chain as decode fills pages,
 * at the cost of the new pages only). On return *n_out = n_tokens / tpp.
 * tokens and ns[0..n_ns) are borrowed. Returns 0, -EINVAL (n_ns == 0, end_tokens
 * decreasing, *n_out > n_tokens / tpp, NULL bytes with n_bytes > 0), -ENOMEM
 * (OpenSSL context). Any thread: reads only the immutable key and fp. */
int pfx_chain(const struct pfx *p, const struct pfx_ns *ns, uint32_t n_ns, const int32_t *tokens,
              uint32_t n_tokens, struct pfx_hash *out, uint32_t *n_out);

/* The longest run of cached pages from chain[0]: writes pages[0..k) and
 * returns k (0..n); the first miss ends it. Hits move to the most recently
 * used end; counts hit pages k and missed pages n - k (tokens: times tpp).
 * The caller must vmm_range_share() the pages, in order, before its next
 * pfx_insert/pfx_evict/pfx_purge_tenant/pfx_tenant_limit (which may evict
 * them). Owner thread; O(k). */
uint32_t pfx_lookup(struct pfx *p, const struct pfx_hash *chain, uint32_t n, uint32_t *pages);

/* True when h is in the index. No counter, no LRU touch. Owner thread; O(1). */
bool pfx_contains(const struct pfx *p, const struct pfx_hash *h);

/* The hashes of every indexed entry (purged ones not): writes the first
 * min(count, max) into out[] in page order and returns the count. Owner
 * thread; O(pages). For `llmctl blocks` and tests. */
uint32_t pfx_hashes(const struct pfx *p, struct pfx_hash *out, uint32_t max);

/* Index page under h and seal it in vmm (vmm_page_seal(page, slot, tenant)),
 * so it stays CACHED when unmapped. The page must be MAPPED (or RESTORING:
 * filled from a lower tier by vmm_page_restore, it becomes CACHED), hold the
 * full page whose chain hash is h, and not be in the index. tenant owns the entry
 * for retention and purge; prio < PFX_N_PRIO. If the tenant is at its
 * retention limit, its least recently used unreferenced entries are evicted
 * first (at most evict_scan_max in-use ones stepped over). Returns 0,
 * -EEXIST (h is cached already: the caller keeps its page private and
 * unsealed), -EDQUOT (tenant at its limit with nothing of its own evictable:
 * page left unsealed; entries evicted on the way stay evicted), -EINVAL (bad
 * page, page not MAPPED or RESTORING, already indexed or sealed, bad prio), -ENOMEM (first
 * entry of a new tenant: tenant table growth). On -EEXIST, -EINVAL and -ENOMEM
 * nothing changed. Owner thread; O(1) expected. */
int pfx_insert(struct pfx *p, const struct pfx_hash *h, uint32_t page, uint32_t tenant,
               uint8_t prio);

/* Free up to `want` cached pages back to vmm: purged-but-still-mapped pages
 * first (see pfx_purge_tenant), then entries with vmm refcount 0, least
 * valuable first: class PFX_N_PRIO-1 down to 0, least recently used first
 * within a class. An entry met with refcount > 0 is in use: it moves to the
 * MRU end and is skipped. Bound: at most want + evict_scan_max entries are
 * visited (one vmm_page_evict each, O(1) under the vmm lock). *n_evicted
 * (may be NULL) gets the count. Returns 0 (want evicted, or no evictable entry
 * left), -EAGAIN (the bound stopped it first: call again). Owner thread. */
int pfx_evict(struct pfx *p, uint32_t want, uint32_t *n_evicted);

/* Evict the entry of `page` now, whatever its class and place in the lists,
 * if no range maps it and nothing pins it (through the spill hook first, as
 * pfx_evict does). For a caller that knows which pages are unreferenced
 * (vmm CACHED) when pfx_evict's bounded scan came back short of them: it
 * steps over at most evict_scan_max entries in use a call, and the prompt
 * pages of every running sequence are in use. Returns 0, -EBUSY (mapped or
 * pinned), -ENOENT (the page holds no entry). Owner thread; O(1). */
int pfx_evict_page(struct pfx *p, uint32_t page);

/* Cap the entries `tenant` may own at max_pages (PFX_NO_LIMIT: no cap, the
 * default; 0: the tenant caches nothing). Entries over a lowered cap are
 * evicted now, least recently used first, as far as unreferenced ones allow;
 * the rest go as inserts push. Returns 0, -ENOMEM (new tenant record).
 * Owner thread; O(entries of tenant). */
int pfx_tenant_limit(struct pfx *p, uint32_t tenant, uint32_t max_pages);

/* Drop every entry of tenant from the index now, so no lookup finds them:
 * unreferenced pages are evicted at once; pages still mapped by a range are
 * unlinked and kept sealed ("doomed"), readable only by the ranges that map
 * them, and are evicted by the next pfx_evict after their last range lets
 * go (pfx_entries_doomed counts them). *n_purged (may be NULL) gets the
 * entries dropped from the index. Returns 0. Owner thread; O(entries of
 * tenant): an admin call, not for the token loop. */
int pfx_purge_tenant(struct pfx *p, uint32_t tenant, uint32_t *n_purged);

struct pfx_stats {
    uint64_t entries;        /* pages in the index */
    uint64_t entries_doomed; /* purged pages waiting for their last range */
    uint64_t tenants;        /* tenant records (never freed) */
    uint64_t lookups_total;
    uint64_t hit_pages_total, miss_pages_total;   /* per lookup: k and n - k */
    uint64_t hit_tokens_total, miss_tokens_total; /* the same times tpp */
    uint64_t inserts_total;                       /* successful pfx_insert */
    uint64_t insert_exists_total;                 /* -EEXIST */
    uint64_t insert_quota_total;                  /* -EDQUOT */
    uint64_t evictions_total;                     /* pages freed by evict or a limit */
    uint64_t spills_total;                        /* of which handed to the spill hook */
    uint64_t limit_evictions_total;               /* of which to keep a tenant's limit */
    uint64_t purges_total;                        /* entries dropped by purge */
};

/* A snapshot of the counters. Owner thread. */
void pfx_stats_get(const struct pfx *p, struct pfx_stats *out);

/* INFO-style text of a snapshot: "# pfx\npfx_entries:12\n...", one key per
 * field of struct pfx_stats in order, NUL-terminated in buf[len]. Returns 0,
 * -ENOSPC (truncated). Any thread. */
int pfx_stats_format(const struct pfx_stats *s, char *buf, size_t len);

/* Walk every invariant: hash table <-> entries (probe chains unbroken),
 * the LRU lists and tenant lists (links, counts, classes), and each page's
 * vmm state against its entry (sealed with the entry's slot and tenant,
 * MAPPED or CACHED; pages outside the index unsealed). Logs the first
 * violation and returns false. O(table + pages). For tests; owner thread. */
bool pfx_check(const struct pfx *p);

#endif /* LLMD_PFX_H */
