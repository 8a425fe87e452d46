/* ofl.c - the tier manager (ofl.h): which cold pages live in which tier,
 * the demotion chain device -> host -> NVMe -> dropped, restores, purge, the
 * spill-vs-recompute policy and the eviction log.
 *
 * The host tier's entries are indexed here (open addressing on the chain
 * hash, one LRU list); the NVMe tier indexes its own slots (ofl_nvme.h) and
 * persists them. Both tiers copy whole pages; nothing here interprets K/V.
 */
#include "offload/ofl.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log.h"
#include "mem.h"
#include "offload/ofl_host.h"
#include "offload/ofl_nvme.h"
#include "vmm/vmm.h"

#define OFL_NIL         UINT32_MAX
#define OFL_PROBE_PAGES 4 /* pages each tier's bandwidth probe moves */

struct ofl_entry {
    uint8_t hash[OFL_KEY_BYTES];
    void *buf; /* [page_bytes] in the host tier; NULL: entry free */
    uint32_t tenant;
    uint32_t prev, next; /* LRU links; head = least recently used */
    uint32_t slot;       /* its table slot */
    uint8_t prio;
};

struct ofl {
    struct vmm *v;
    size_t page_bytes;
    uint32_t tpp;
    enum ofl_policy policy;
    struct ofl_host *host;
    struct ofl_nvme *nvme;
    void (*tier_hook)(void *ctx, const uint8_t *hash, uint32_t tenant, enum ofl_tier tier,
                      bool held);
    void *tier_ctx;
    /* host entries */
    struct ofl_entry *entries; /* [cap] */
    uint32_t cap, n_used;
    uint32_t *free_ids; /* [cap] stack of free entry ids */
    uint32_t n_free;
    uint32_t *table; /* [mask + 1] entry ids, OFL_NIL empty */
    uint32_t mask;
    uint32_t lru_head, lru_tail;
    void *stage;       /* [page_bytes] NVMe restores land here before the device */
    bool stage_pinned; /* registered through cfg->pin: unpin before freeing */
    void (*unpin)(void *ctx, void *addr, size_t bytes);
    void *pin_ctx;
    uint64_t cookie;
    uint32_t n_inflight; /* NVMe writes queued, completion not yet reaped */
    struct ofl_log log;
    struct ofl_stats c;
    bool disk_full_logged;
    bool nvme_suspect; /* an NVMe restore failed: its copies may be stale (a cut or
                        * damaged file), so a demotion replaces one instead of
                        * keeping it (-EEXIST) */
    /* between ofl_flush_begin() and ofl_flush(): every page is kept (the
     * policy set aside) and counted */
    bool flushing;
    enum ofl_policy saved_policy;
    uint32_t fl_queued, fl_failed, fl_present, fl_lost;
};

static uint64_t ofl_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void ofl_err(char *buf, size_t len, const char *msg) {
    if (buf && len)
        snprintf(buf, len, "%s", msg);
}

static void ofl_event(struct ofl *o, const uint8_t *hash, uint32_t page, uint32_t tenant,
                      uint32_t bytes, enum ofl_tier from, enum ofl_tier to, enum ofl_reason why) {
    struct ofl_event ev = {.page = page,
                           .tenant = tenant,
                           .bytes = bytes,
                           .from = (uint8_t)from,
                           .to = (uint8_t)to,
                           .reason = (uint8_t)why};
    memcpy(ev.hash, hash, sizeof ev.hash);
    ofl_log_add(&o->log, ev);
    if (o->tier_hook && from == OFL_TIER_HOST)
        o->tier_hook(o->tier_ctx, hash, tenant, OFL_TIER_HOST, false);
    if (o->tier_hook && to == OFL_TIER_HOST)
        o->tier_hook(o->tier_ctx, hash, tenant, OFL_TIER_HOST, true);
}

static void ofl_nvme_entry(void *ctx, const uint8_t *hash, uint32_t tenant, bool valid) {
    struct ofl *o = ctx;
    if (tenant == UINT32_MAX)
        return; /* ofl_probe_nvme's pages */
    o->tier_hook(o->tier_ctx, hash, tenant, OFL_TIER_NVME, valid);
}

uint32_t ofl_hashes(struct ofl *o, enum ofl_tier tier, uint8_t (*out)[OFL_KEY_BYTES],
                    uint32_t max) {
    if (tier == OFL_TIER_NVME)
        return o->nvme ? ofl_nvme_hashes(o->nvme, out, max) : 0;
    if (tier != OFL_TIER_HOST)
        return 0;
    uint32_t n = 0;
    for (uint32_t e = o->lru_head; e != OFL_NIL; e = o->entries[e].next) {
        if (n < max)
            memcpy(out[n], o->entries[e].hash, OFL_KEY_BYTES);
        n++;
    }
    return n;
}

/* ---- the host index ---- */

static uint32_t ofl_home(const struct ofl *o, const uint8_t *hash) {
    uint32_t h;
    memcpy(&h, hash, sizeof h); /* an HMAC output: uniform already */
    return h & o->mask;
}

static uint32_t ofl_table_find(const struct ofl *o, const uint8_t *hash) {
    for (uint32_t i = ofl_home(o, hash);; i = (i + 1) & o->mask) {
        uint32_t e = o->table[i];
        if (e == OFL_NIL)
            return OFL_NIL;
        if (memcmp(o->entries[e].hash, hash, OFL_KEY_BYTES) == 0)
            return i;
    }
}

/* Backward-shift deletion keeps every probe run unbroken (Knuth 6.4, R). */
static void ofl_table_del(struct ofl *o, uint32_t i) {
    for (uint32_t j = (i + 1) & o->mask;; j = (j + 1) & o->mask) {
        uint32_t e = o->table[j];
        if (e == OFL_NIL)
            break;
        uint32_t home = ofl_home(o, o->entries[e].hash);
        /* e may move to i when i lies cyclically in [home, j) */
        if (((j - home) & o->mask) >= ((j - i) & o->mask)) {
            o->table[i] = e;
            o->entries[e].slot = i;
            i = j;
        }
    }
    o->table[i] = OFL_NIL;
}

static void ofl_lru_del(struct ofl *o, uint32_t e) {
    struct ofl_entry *en = &o->entries[e];
    if (en->prev != OFL_NIL)
        o->entries[en->prev].next = en->next;
    else
        o->lru_head = en->next;
    if (en->next != OFL_NIL)
        o->entries[en->next].prev = en->prev;
    else
        o->lru_tail = en->prev;
}

static void ofl_lru_push(struct ofl *o, uint32_t e) {
    struct ofl_entry *en = &o->entries[e];
    en->prev = o->lru_tail;
    en->next = OFL_NIL;
    if (o->lru_tail != OFL_NIL)
        o->entries[o->lru_tail].next = e;
    else
        o->lru_head = e;
    o->lru_tail = e;
}

/* Forget host entry e and free its buffer (zeroed first when `scrub`). */
static void ofl_host_drop(struct ofl *o, uint32_t e, bool scrub) {
    struct ofl_entry *en = &o->entries[e];
    ofl_lru_del(o, e);
    ofl_table_del(o, en->slot);
    if (scrub)
        memset(en->buf, 0, o->page_bytes);
    ofl_host_free(o->host, en->buf);
    en->buf = NULL;
    o->free_ids[o->n_free++] = e;
    o->n_used--;
}

/* ---- policy ---- */

static void ofl_policy_update(struct ofl *o) {
    struct ofl_stats *c = &o->c;
    c->recompute_ns_per_page =
        c->prefill_tokens_per_s > 0 ? 1e9 * o->tpp / c->prefill_tokens_per_s : 0;
    c->host_restore_ns_per_page =
        c->host_bw_bytes_per_s > 0 ? 1e9 * (double)o->page_bytes / c->host_bw_bytes_per_s : 0;
    c->nvme_restore_ns_per_page = c->nvme_read_bw_bytes_per_s > 0
                                      ? 1e9 * (double)o->page_bytes / c->nvme_read_bw_bytes_per_s
                                      : 0;
}

/* Is keeping a page in a tier whose restore costs restore_ns worth it? */
static bool ofl_worth(const struct ofl *o, double restore_ns) {
    if (o->policy == OFL_POLICY_ALWAYS || o->c.recompute_ns_per_page <= 0 || restore_ns <= 0)
        return true;
    return restore_ns < o->c.recompute_ns_per_page;
}

/* ---- NVMe ---- */

static int ofl_host_demote_one(struct ofl *o);

static void ofl_nvme_cpl_one(struct ofl *o, const struct ofl_nvme_cpl *cp) {
    if (cp->op != OFL_NVME_WRITE)
        return;
    if (NEVER(o->n_inflight == 0))
        return;
    o->n_inflight--;
    if (cp->rc == 0)
        return;
    o->c.drops_total++; /* the tier counts the failure itself (ofl_stats_get) */
    if (o->flushing)
        o->fl_failed++;
    if ((cp->rc == -ENOSPC || cp->rc == -EFBIG) && !o->disk_full_logged) {
        o->disk_full_logged = true;
        LOG_WARN("ofl", "NVMe tier: the disk is full; spills to NVMe stop, service goes on");
    }
}

/* Reap write completions, waiting up to wait_ms for the first. */
static int ofl_reap(struct ofl *o, int wait_ms) {
    struct ofl_nvme_cpl cp[32];
    int n = ofl_nvme_poll(o->nvme, cp, 32, wait_ms);
    for (int i = 0; i < n; i++)
        ofl_nvme_cpl_one(o, &cp[i]);
    return n;
}

void ofl_poll(struct ofl *o) {
    if (!o->nvme)
        return;
    while (ofl_reap(o, 0) > 0) {
    }
}

/* Wait for every NVMe write in flight, a bounded time (10 s without
 * progress). */
static void ofl_drain(struct ofl *o) {
    int idle = 0;
    while (o->nvme && o->n_inflight > 0 && idle < 10)
        idle = ofl_reap(o, 1000) > 0 ? 0 : idle + 1;
}

void ofl_flush_begin(struct ofl *o) {
    if (o->flushing)
        return;
    o->flushing = true;
    o->saved_policy = o->policy;
    /* a page not kept now is gone with the process: the next run, not this
     * one's measurements, decides whether to restore it (restores do not ask
     * the policy), and the writes cost nothing on any request's path */
    o->policy = OFL_POLICY_ALWAYS;
    o->fl_queued = o->fl_failed = o->fl_present = o->fl_lost = 0;
}

void ofl_flush(struct ofl *o, struct ofl_flush_counts *out) {
    ofl_flush_begin(o); /* no-op when the caller began */
    if (o->nvme) {
        while (o->lru_head != OFL_NIL)
            ofl_host_demote_one(o);
        ofl_drain(o);
    }
    struct ofl_flush_counts fc = {
        .written = o->fl_queued > o->fl_failed ? o->fl_queued - o->fl_failed : 0,
        .present = o->fl_present,
        .lost = o->fl_lost + o->fl_failed,
    };
    o->policy = o->saved_policy;
    o->flushing = false;
    if (out)
        *out = fc;
}

/* Copy host entry e to NVMe (the tier copies it into a bounce buffer before
 * returning). Returns 0 (queued), -EEXIST (already there), -errno. */
static int ofl_nvme_put(struct ofl *o, const uint8_t *hash, uint32_t tenant, const void *src) {
    int rc = -EAGAIN;
    /* every bounce buffer busy: wait for one, a bounded number of times */
    for (int tries = 0; rc == -EAGAIN && tries < 64; tries++) {
        rc = ofl_nvme_write(o->nvme, hash, tenant, src, (uint32_t)o->page_bytes, ++o->cookie);
        if (rc == -EAGAIN)
            ofl_reap(o, 10);
    }
    if (rc == 0)
        o->n_inflight++;
    return rc;
}

/* Make room in the host tier: demote its least recently used entry to NVMe
 * (or drop it). Returns 0 when one entry went, -ENOENT when the tier is
 * empty. */
static int ofl_host_demote_one(struct ofl *o) {
    uint32_t e = o->lru_head;
    if (e == OFL_NIL)
        return -ENOENT;
    struct ofl_entry *en = &o->entries[e];
    enum ofl_tier to = OFL_TIER_NONE;
    enum ofl_reason why = OFL_REASON_DEMOTE;
    if (o->nvme && ofl_worth(o, o->c.nvme_restore_ns_per_page)) {
        int rc = ofl_nvme_put(o, en->hash, en->tenant, en->buf);
        /* a failed restore is a sign of more: without this, each stale copy would
         * stay and refuse the good page, and the tier heal one page per restore */
        if (rc == -EEXIST && o->nvme_suspect && ofl_nvme_drop(o->nvme, en->hash) == 0)
            rc = ofl_nvme_put(o, en->hash, en->tenant, en->buf);
        if (rc == 0 || rc == -EEXIST)
            to = OFL_TIER_NVME;
        if (rc == 0) {
            o->c.spills_total[OFL_TIER_NVME]++;
            o->c.spill_bytes_total[OFL_TIER_NVME] += o->page_bytes;
            o->fl_queued += o->flushing;
        } else if (rc == -ENOSPC) {
            why = OFL_REASON_FAULT;
        }
        if (rc == -EEXIST)
            o->fl_present += o->flushing;
    } else if (o->nvme) {
        why = OFL_REASON_POLICY;
        o->c.policy_drops_total++;
    }
    if (to == OFL_TIER_NONE) {
        o->c.drops_total++;
        o->fl_lost += o->flushing;
    }
    ofl_event(o, en->hash, OFL_NIL, en->tenant, to == OFL_TIER_NVME ? (uint32_t)o->page_bytes : 0,
              OFL_TIER_HOST, to, why);
    ofl_host_drop(o, e, false);
    return 0;
}

/* ---- spill / find / restore ---- */

int ofl_spill(struct ofl *o, const uint8_t hash[OFL_KEY_BYTES], uint32_t page, uint32_t tenant,
              uint8_t prio) {
    if (!ofl_worth(o, o->c.host_restore_ns_per_page)) {
        o->c.drops_total++;
        o->c.policy_drops_total++;
        ofl_event(o, hash, page, tenant, 0, OFL_TIER_DEVICE, OFL_TIER_NONE, OFL_REASON_POLICY);
        return -ECANCELED;
    }
    if (ofl_table_find(o, hash) != OFL_NIL)
        return -EEXIST;
    /* room: an entry record and the bytes; demote LRU pages until both are
     * there, or the tier is empty and still cannot take the page */
    void *buf = NULL;
    while (!(o->n_free > 0 && (buf = ofl_host_alloc(o->host, o->page_bytes))))
        if (ofl_host_demote_one(o) < 0)
            break;
    if (!buf) {
        o->c.drops_total++;
        o->fl_lost += o->flushing;
        ofl_event(o, hash, page, tenant, 0, OFL_TIER_DEVICE, OFL_TIER_NONE, OFL_REASON_EVICT);
        return -ENOSPC;
    }
    int rc = vmm_page_read(o->v, page, buf);
    if (rc < 0) {
        ofl_host_free(o->host, buf);
        o->c.drops_total++;
        o->fl_lost += o->flushing;
        ofl_event(o, hash, page, tenant, 0, OFL_TIER_DEVICE, OFL_TIER_NONE, OFL_REASON_FAULT);
        return -EIO;
    }
    uint32_t e = o->free_ids[--o->n_free];
    struct ofl_entry *en = &o->entries[e];
    memcpy(en->hash, hash, OFL_KEY_BYTES);
    en->buf = buf;
    en->tenant = tenant;
    en->prio = prio;
    uint32_t i = ofl_home(o, hash);
    while (o->table[i] != OFL_NIL)
        i = (i + 1) & o->mask;
    o->table[i] = e;
    en->slot = i;
    ofl_lru_push(o, e);
    o->n_used++;
    o->c.spills_total[OFL_TIER_HOST]++;
    o->c.spill_bytes_total[OFL_TIER_HOST] += o->page_bytes;
    ofl_event(o, hash, page, tenant, (uint32_t)o->page_bytes, OFL_TIER_DEVICE, OFL_TIER_HOST,
              OFL_REASON_EVICT);
    return 0;
}

enum ofl_tier ofl_find(struct ofl *o, const uint8_t hash[OFL_KEY_BYTES]) {
    if (o->host && ofl_table_find(o, hash) != OFL_NIL)
        return OFL_TIER_HOST;
    if (!o->nvme)
        return OFL_TIER_NONE;
    /* a page demoted a moment ago may still be on its way to the disk:
     * its write lands within milliseconds, far sooner than a recompute,
     * so wait for it (bounded: a stuck device costs at most ~1 s, then the
     * page is recomputed) rather than call it a miss */
    for (int i = 0; i < 100 && ofl_nvme_pending(o->nvme, hash); i++)
        ofl_reap(o, 10);
    return ofl_nvme_contains(o->nvme, hash) ? OFL_TIER_NVME : OFL_TIER_NONE;
}

/* Read hash's NVMe page into o->stage, waiting for it. */
static int ofl_nvme_get(struct ofl *o, const uint8_t *hash) {
    uint64_t cookie = ++o->cookie;
    int rc = -EAGAIN;
    for (int tries = 0; rc == -EAGAIN && tries < 64; tries++) {
        rc = ofl_nvme_read(o->nvme, hash, o->stage, (uint32_t)o->page_bytes, cookie);
        if (rc == -EAGAIN)
            ofl_poll(o);
    }
    if (rc < 0)
        return rc;
    for (;;) {
        struct ofl_nvme_cpl cp[8];
        int n = ofl_nvme_poll(o->nvme, cp, 8, -1);
        if (n < 0)
            return n;
        for (int i = 0; i < n; i++) {
            if (cp[i].cookie == cookie && cp[i].op == OFL_NVME_READ)
                rc = cp[i].rc == 0 ? 1 : cp[i].rc;
            else
                ofl_nvme_cpl_one(o, &cp[i]);
        }
        if (rc != 0)
            return rc < 0 ? rc : 0;
    }
}

int ofl_restore(struct ofl *o, const uint8_t hash[OFL_KEY_BYTES], uint32_t *page, uint32_t *tenant,
                uint8_t *prio) {
    uint32_t i = o->host ? ofl_table_find(o, hash) : OFL_NIL;
    if (i != OFL_NIL) {
        uint32_t e = o->table[i];
        struct ofl_entry *en = &o->entries[e];
        int rc = vmm_page_restore(o->v, en->buf, page);
        if (rc == -ENOSPC)
            return rc;
        *tenant = en->tenant;
        *prio = en->prio;
        if (rc == 0) {
            o->c.restores_total[OFL_TIER_HOST]++;
            o->c.restore_bytes_total[OFL_TIER_HOST] += o->page_bytes;
            ofl_event(o, hash, *page, en->tenant, (uint32_t)o->page_bytes, OFL_TIER_HOST,
                      OFL_TIER_DEVICE, OFL_REASON_HIT);
        } else {
            o->c.read_failures_total++;
            o->c.drops_total++;
            ofl_event(o, hash, OFL_NIL, en->tenant, 0, OFL_TIER_HOST, OFL_TIER_NONE,
                      OFL_REASON_FAULT);
        }
        ofl_host_drop(o, e, false);
        return rc < 0 ? -EIO : 0;
    }
    if (!o->nvme)
        return -ENOENT;
    uint32_t owner = 0;
    if (ofl_nvme_tenant(o->nvme, hash, &owner) < 0)
        return -ENOENT;
    int rc = ofl_nvme_get(o, hash);
    if (rc < 0) {
        o->nvme_suspect = true;
        if (rc != -EBADMSG) /* checksum failures: the tier's own counter */
            o->c.read_failures_total++;
        o->c.drops_total++;
        ofl_event(o, hash, OFL_NIL, owner, 0, OFL_TIER_NVME, OFL_TIER_NONE, OFL_REASON_FAULT);
        ofl_nvme_drop(o->nvme, hash); /* -ENOENT when the tier dropped it already */
        return rc == -EBADMSG ? rc : -EIO;
    }
    rc = vmm_page_restore(o->v, o->stage, page);
    if (rc < 0)
        return rc == -ENOSPC ? rc : -EIO;
    *tenant = owner;
    *prio = 2; /* PFX_PRIO_NORMAL: the NVMe index keeps no class */
    o->c.restores_total[OFL_TIER_NVME]++;
    o->c.restore_bytes_total[OFL_TIER_NVME] += o->page_bytes;
    ofl_event(o, hash, *page, owner, (uint32_t)o->page_bytes, OFL_TIER_NVME, OFL_TIER_DEVICE,
              OFL_REASON_HIT);
    return 0;
}

/* ---- purge ---- */

int ofl_purge_tenant(struct ofl *o, uint32_t tenant, struct ofl_purge_counts *out) {
    struct ofl_purge_counts pc = {0};
    for (uint32_t e = o->lru_head; e != OFL_NIL;) {
        uint32_t next = o->entries[e].next;
        if (o->entries[e].tenant == tenant) {
            ofl_event(o, o->entries[e].hash, OFL_NIL, tenant, 0, OFL_TIER_HOST, OFL_TIER_NONE,
                      OFL_REASON_PURGE);
            ofl_host_drop(o, e, true);
            pc.host_pages++;
        }
        e = next;
    }
    if (o->nvme) {
        ofl_poll(o); /* writes in flight land first, so none survives the purge */
        ofl_nvme_purge_tenant(o->nvme, tenant, &pc.nvme_pages);
        if (pc.nvme_pages) {
            /* one event for all of them (the tier does not hand out the hashes); bytes
             * stays 0 as for every purge: the count is in *out and the log line */
            uint8_t none[OFL_KEY_BYTES] = {0};
            ofl_event(o, none, OFL_NIL, tenant, 0, OFL_TIER_NVME, OFL_TIER_NONE, OFL_REASON_PURGE);
        }
    }
    o->c.purged_total += pc.host_pages + pc.nvme_pages;
    LOG_INFO("ofl", "purged tenant %" PRIu32 ": %" PRIu32 " host pages, %" PRIu32 " NVMe pages",
             tenant, pc.host_pages, pc.nvme_pages);
    if (out)
        *out = pc;
    return 0;
}

/* ---- measuring ---- */

static int ofl_cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Host tier: median time of copying a page into a host-tier buffer. */
static void ofl_probe_host(struct ofl *o) {
    void *buf = ofl_host_alloc(o->host, o->page_bytes);
    if (!buf)
        return;
    uint64_t t[OFL_PROBE_PAGES * 2];
    for (int i = 0; i < OFL_PROBE_PAGES * 2; i++) {
        uint64_t t0 = ofl_now_ns();
        memcpy(buf, o->stage, o->page_bytes);
        t[i] = ofl_now_ns() - t0;
    }
    ofl_host_free(o->host, buf);
    qsort(t, OFL_PROBE_PAGES * 2, sizeof t[0], ofl_cmp_u64);
    uint64_t med = t[OFL_PROBE_PAGES] ? t[OFL_PROBE_PAGES] : 1;
    o->c.host_bw_bytes_per_s = 1e9 * (double)o->page_bytes / (double)med;
}

/* NVMe tier: write up to OFL_PROBE_PAGES pages under probe hashes, read them
 * back, drop them. Only into free slots: a full tier would evict that many
 * cached pages at every start to make room for the probe. With no free slot
 * the rates stay unknown (0), which the policy takes as worth keeping. */
static void ofl_probe_nvme(struct ofl *o) {
    uint8_t h[OFL_KEY_BYTES];
    memset(h, 0xff, sizeof h);
    struct ofl_nvme_stats ns;
    ofl_nvme_stats_get(o->nvme, &ns);
    uint64_t n_free = ns.n_slots > ns.slots_used ? ns.n_slots - ns.slots_used : 0;
    uint32_t n_probe = n_free < OFL_PROBE_PAGES ? (uint32_t)n_free : OFL_PROBE_PAGES;
    uint64_t t0 = ofl_now_ns();
    uint32_t n_w = 0;
    for (uint32_t i = 0; i < n_probe; i++) {
        h[0] = (uint8_t)i;
        if (ofl_nvme_put(o, h, UINT32_MAX, o->stage) == 0)
            n_w++;
    }
    ofl_drain(o);
    uint64_t tw = ofl_now_ns() - t0;
    t0 = ofl_now_ns();
    uint32_t n_r = 0;
    for (uint32_t i = 0; i < n_probe; i++) {
        h[0] = (uint8_t)i;
        if (ofl_nvme_contains(o->nvme, h) && ofl_nvme_get(o, h) == 0)
            n_r++;
    }
    uint64_t tr = ofl_now_ns() - t0;
    for (uint32_t i = 0; i < n_probe; i++) {
        h[0] = (uint8_t)i;
        ofl_nvme_drop(o->nvme, h);
    }
    if (n_w && tw)
        o->c.nvme_write_bw_bytes_per_s = 1e9 * (double)n_w * (double)o->page_bytes / (double)tw;
    if (n_r && tr)
        o->c.nvme_read_bw_bytes_per_s = 1e9 * (double)n_r * (double)o->page_bytes / (double)tr;
}

/* The NVMe tier's I/O thread runs on the host tier's NUMA node: its bounce
 * buffers and the host pages it copies from are local there. */
static void ofl_bind_io_thread(void *ctx) {
    int rc = ofl_host_bind_thread(ctx);
    if (rc < 0)
        LOG_WARN("ofl", "cannot bind the NVMe tier thread to the host tier's node: %s",
                 strerror(-rc));
}

/* ---- create / destroy ---- */

int ofl_create(const struct ofl_config *cfg, struct ofl **out, char *errbuf, size_t errlen) {
    if (!cfg || !cfg->vmm || !out)
        return -EINVAL;
    if (cfg->host_bytes == 0) {
        ofl_err(errbuf, errlen, "offload: an NVMe tier needs a host tier (--host-tier)");
        return -EINVAL;
    }
    struct ofl *o = mem_calloc(MEM_OFL, 1, sizeof *o);
    if (!o)
        return -ENOMEM;
    o->v = cfg->vmm;
    o->page_bytes = vmm_page_bytes(cfg->vmm);
    o->tpp = vmm_tokens_per_page(cfg->vmm);
    o->policy = cfg->policy;
    o->tier_hook = cfg->tier_hook;
    o->tier_ctx = cfg->tier_ctx;
    o->lru_head = o->lru_tail = OFL_NIL;
    o->c.prefill_tokens_per_s = cfg->prefill_tokens_per_s;
    int rc = ofl_log_init(&o->log, cfg->log_events);
    if (rc < 0)
        goto fail;
    /* the tier first: it refuses a budget above the memory there is, with
     * a message, before the index below is sized from that budget */
    struct ofl_host_config hc = {.bytes = cfg->host_bytes,
                                 .numa_node = -1,
                                 .device_pci_bus_id = cfg->device_pci_bus_id,
                                 .pin = cfg->pin,
                                 .unpin = cfg->unpin,
                                 .pin_ctx = cfg->pin_ctx};
    if ((rc = ofl_host_create(&hc, &o->host, errbuf, errlen)) < 0)
        goto fail;
    o->c.host_kind = ofl_host_kind_name(ofl_host_kind(o->host));
    /* one entry per page the budget holds; the table stays a power of two
     * at least twice that, so the count must stay well inside 32 bits */
    uint64_t cap = cfg->host_bytes / o->page_bytes + 1;
    if (cap > (1u << 30)) {
        if (errbuf && errlen)
            snprintf(errbuf, errlen,
                     "offload: a host tier of %" PRIu64 " pages of %zu bytes is too many (at "
                     "most 2^30)",
                     cap, o->page_bytes);
        rc = -EINVAL;
        goto fail;
    }
    o->cap = (uint32_t)cap;
    uint32_t tsize = 16;
    while (tsize < 2 * o->cap)
        tsize *= 2;
    o->mask = tsize - 1;
    o->entries = mem_calloc(MEM_OFL, o->cap, sizeof *o->entries);
    o->free_ids = mem_alloc(MEM_OFL, (size_t)o->cap * sizeof *o->free_ids);
    o->table = mem_alloc(MEM_OFL, (size_t)tsize * sizeof *o->table);
    o->stage = mem_calloc(MEM_OFL, 1, o->page_bytes);
    rc = -ENOMEM;
    if (!o->entries || !o->free_ids || !o->table || !o->stage)
        goto fail;
    if (cfg->pin && cfg->unpin) {
        /* the H2D copy of an NVMe restore then runs from page-locked memory;
         * a refusal only costs speed */
        o->stage_pinned = cfg->pin(cfg->pin_ctx, o->stage, o->page_bytes) == 0;
        o->unpin = cfg->unpin;
        o->pin_ctx = cfg->pin_ctx;
    }
    for (uint32_t i = 0; i < o->cap; i++)
        o->free_ids[i] = o->cap - 1 - i;
    o->n_free = o->cap;
    memset(o->table, 0xff, (size_t)tsize * sizeof *o->table);
    if (cfg->nvme_path) {
        struct ofl_nvme_config nc = {.path = cfg->nvme_path,
                                     .bytes = cfg->nvme_bytes ? cfg->nvme_bytes : 4ull << 30,
                                     .slot_bytes = (uint32_t)o->page_bytes,
                                     .direct = -1,
                                     .uring = -1,
                                     .thread_init = ofl_bind_io_thread,
                                     .thread_ctx = o->host,
                                     .entry_hook = cfg->tier_hook ? ofl_nvme_entry : NULL,
                                     .entry_ctx = o};
        memcpy(nc.model_fp, cfg->model_fp, sizeof nc.model_fp);
        if (o->page_bytes > UINT32_MAX) {
            ofl_err(errbuf, errlen, "offload: KV page too large for the NVMe tier");
            rc = -EINVAL;
            goto fail;
        }
        if ((rc = ofl_nvme_open(&nc, &o->nvme, errbuf, errlen)) < 0)
            goto fail;
        ofl_probe_nvme(o);
    }
    ofl_probe_host(o);
    ofl_policy_update(o);
    LOG_INFO("ofl",
             "host tier %.1f MiB (%s), %.2f GB/s; NVMe tier %s, write %.2f GB/s, read %.2f GB/s",
             (double)cfg->host_bytes / (1 << 20), o->c.host_kind, o->c.host_bw_bytes_per_s / 1e9,
             o->nvme ? cfg->nvme_path : "off", o->c.nvme_write_bw_bytes_per_s / 1e9,
             o->c.nvme_read_bw_bytes_per_s / 1e9);
    *out = o;
    return 0;
fail:
    ofl_destroy(o);
    return rc;
}

void ofl_destroy(struct ofl *o) {
    if (!o)
        return;
    while (o->lru_head != OFL_NIL)
        ofl_host_drop(o, o->lru_head, false);
    ofl_nvme_close(o->nvme);
    ofl_host_destroy(o->host);
    mem_free(o->entries);
    mem_free(o->free_ids);
    mem_free(o->table);
    if (o->stage_pinned)
        o->unpin(o->pin_ctx, o->stage, o->page_bytes);
    mem_free(o->stage);
    ofl_log_fini(&o->log);
    mem_free(o);
}

void ofl_prefill_rate_set(struct ofl *o, double tokens_per_s) {
    o->c.prefill_tokens_per_s = tokens_per_s;
    ofl_policy_update(o);
}

void ofl_stats_get(struct ofl *o, struct ofl_stats *out) {
    *out = o->c;
    if (o->host) {
        struct ofl_host_stats hs;
        ofl_host_stats_get(o->host, &hs);
        out->host_bytes = hs.budget_bytes;
        out->host_used_bytes = hs.used_bytes;
        out->host_pages = o->n_used;
        uint64_t fit = hs.budget_bytes / o->page_bytes;
        out->host_pages_max = fit < o->cap ? fit : o->cap;
    }
    if (o->nvme) {
        struct ofl_nvme_stats ns;
        ofl_nvme_stats_get(o->nvme, &ns);
        out->nvme = true;
        out->nvme_direct = ns.direct;
        out->nvme_uring = ns.uring;
        out->nvme_disk_full = ns.disk_full;
        out->nvme_slots = ns.n_slots;
        out->nvme_pages = ns.slots_used;
        out->write_failures_total = ns.write_failures_total;
        out->checksum_failures_total = ns.checksum_failures_total;
    }
}

struct ofl_log *ofl_eviction_log(struct ofl *o) {
    return &o->log;
}
