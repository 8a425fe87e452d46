/* pfx.c - the prefix cache index (see pfx.h, docs/prefix-cache.md).
 *
 * Data: one entry per vmm page (a page holds at most one cached prefix page),
 * so the entry of page p is entries[p] and needs no allocation after create.
 * The hash table is open addressing with linear probing over slots that hold
 * page ids, sized at create to a power of two >= 2 * n_pages: the load stays
 * <= 1/2 whatever happens, so a probe is ~1.5 slots on a hit and ~2.5 on a
 * miss, and the table never grows. The home slot is the first 8 bytes of the
 * hash: HMAC output keyed by the secret, so no client can craft a cluster.
 * Deletion shifts the rest of the cluster back (no tombstones, so the table
 * never degrades and needs no rebuild); a page whose slot moves is re-sealed
 * in vmm with its new slot, keeping vmm's hash_slot exact.
 *
 * Each indexed entry is on two intrusive LRU lists (u32 links, oldest at
 * head): its priority class's list, which eviction walks, and its tenant's
 * list, which the retention limit and purge walk. Every touch (hit, insert,
 * met in use by an eviction scan) moves it to the tail of both, so both
 * orders agree with one global recency order. Purged entries still mapped by
 * a range ("doomed") leave the table and both lists for a doomed list that
 * eviction drains first.
 *
 * Tenants: a dense array of records plus an open-addressing index by id,
 * doubled as tenants appear; records are never freed (tenants are the
 * server's authenticated API tenants: few, and a record is ~30 bytes).
 */
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "engine/core/pfx_impl.h"
#include "log.h"
#include "mem.h"
#include "vmm/vmm.h"

#define PFX_NIL         UINT32_MAX
#define PFX_SLOT_DOOMED (UINT32_MAX - 1) /* hash_slot sealed into vmm for a doomed page */
#define PFX_EVICT_SCAN  64 /* default evict_scan_max: a step's worth of vmm calls (~µs each) */
#define PFX_TENANTS_MIN 16
#define PFX_MAX_PAGES   (1u << 30) /* keeps 2 * n_pages slots below PFX_SLOT_DOOMED */

enum pfx_estate { PFX_E_NONE = 0, PFX_E_INDEXED, PFX_E_DOOMED };
enum { PFX_L_CLS = 0, PFX_L_TEN = 1 }; /* which links of an entry */

struct pfx_link {
    uint32_t prev, next;
};

struct pfx_list {
    uint32_t head, tail, n; /* head: least recently used */
};

struct pfx_entry {
    struct pfx_hash h;
    uint64_t last_use_ns;    /* CLOCK_MONOTONIC of the last touch */
    uint32_t tenant;         /* owner's id */
    uint32_t trec;           /* owner's record in p->tenants */
    uint32_t slot;           /* table slot, or PFX_SLOT_DOOMED */
    struct pfx_link link[2]; /* [PFX_L_CLS]: class or doomed list; [PFX_L_TEN]: tenant list */
    uint8_t prio;            /* < PFX_N_PRIO */
    uint8_t state;           /* enum pfx_estate */
};

struct pfx_tenant {
    uint32_t id;
    uint32_t limit; /* max entries, PFX_NO_LIMIT */
    struct pfx_list lru;
};

struct pfx {
    struct pfx_hasher hs;
    struct vmm *v; /* borrowed */
    uint32_t n_pages, tpp, evict_scan_max;
    struct pfx_entry *entries; /* [n_pages] */
    uint32_t *slots;           /* [mask + 1] page ids, PFX_NIL empty */
    uint32_t mask;
    uint32_t n_entries, n_doomed;
    struct pfx_list cls[PFX_N_PRIO];
    struct pfx_list doomed;
    struct pfx_tenant *tenants; /* [cap_tenants], n_tenants used */
    uint32_t *tenant_idx;       /* [2 * cap_tenants]: record index + 1, 0 empty */
    uint32_t n_tenants, cap_tenants;
    struct pfx_stats c; /* counters; gauges are filled in by pfx_stats_get */
    void (*spill)(void *ctx, const struct pfx_hash *h, uint32_t page, uint32_t tenant,
                  uint8_t prio);
    void *spill_ctx;
    void (*removed)(void *ctx, const struct pfx_hash *h, uint32_t tenant);
    void *removed_ctx;
};

static uint64_t pfx_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- intrusive lists ---- */

static void pfx_list_init(struct pfx_list *l) {
    *l = (struct pfx_list){PFX_NIL, PFX_NIL, 0};
}

static void pfx_list_push(struct pfx *p, struct pfx_list *l, int w, uint32_t e) {
    struct pfx_link *k = &p->entries[e].link[w];
    k->prev = l->tail;
    k->next = PFX_NIL;
    if (l->tail != PFX_NIL)
        p->entries[l->tail].link[w].next = e;
    else
        l->head = e;
    l->tail = e;
    l->n++;
}

static void pfx_list_del(struct pfx *p, struct pfx_list *l, int w, uint32_t e) {
    struct pfx_link *k = &p->entries[e].link[w];
    if (k->prev != PFX_NIL)
        p->entries[k->prev].link[w].next = k->next;
    else
        l->head = k->next;
    if (k->next != PFX_NIL)
        p->entries[k->next].link[w].prev = k->prev;
    else
        l->tail = k->prev;
    k->prev = k->next = PFX_NIL;
    l->n--;
}

static struct pfx_list *pfx_cls_list(struct pfx *p, uint32_t e) {
    struct pfx_entry *en = &p->entries[e];
    return en->state == PFX_E_DOOMED ? &p->doomed : &p->cls[en->prio];
}

/* The entry is in use now: most recently used end of both its lists. */
static void pfx_touch(struct pfx *p, uint32_t e, uint64_t now) {
    struct pfx_entry *en = &p->entries[e];
    struct pfx_list *l = pfx_cls_list(p, e);
    pfx_list_del(p, l, PFX_L_CLS, e);
    pfx_list_push(p, l, PFX_L_CLS, e);
    if (en->state == PFX_E_INDEXED) {
        struct pfx_list *t = &p->tenants[en->trec].lru;
        pfx_list_del(p, t, PFX_L_TEN, e);
        pfx_list_push(p, t, PFX_L_TEN, e);
    }
    en->last_use_ns = now;
}

/* ---- the hash table ---- */

static uint32_t pfx_home(const struct pfx *p, const struct pfx_hash *h) {
    uint64_t x;
    memcpy(&x, h->b, sizeof x);
    return (uint32_t)x & p->mask;
}

/* Slot holding h, or PFX_NIL. */
static uint32_t pfx_table_find(const struct pfx *p, const struct pfx_hash *h) {
    for (uint32_t i = pfx_home(p, h);; i = (i + 1) & p->mask) {
        uint32_t e = p->slots[i];
        if (e == PFX_NIL)
            return PFX_NIL;
        if (memcmp(p->entries[e].h.b, h->b, PFX_HASH_BYTES) == 0)
            return i;
    }
}

/* First empty slot of h's probe sequence; the load <= 1/2 guarantees one. */
static uint32_t pfx_table_place(struct pfx *p, const struct pfx_hash *h, uint32_t e) {
    uint32_t i = pfx_home(p, h);
    while (p->slots[i] != PFX_NIL)
        i = (i + 1) & p->mask;
    p->slots[i] = e;
    return i;
}

static void pfx_reseal(struct pfx *p, uint32_t e) {
    struct pfx_entry *en = &p->entries[e];
    int rc = vmm_page_seal(p->v, e, en->slot, en->tenant);
    if (NEVER(rc != 0))
        LOG_ERROR("pfx", "re-seal of page %u failed (%d): vmm disagrees with the index", e, rc);
}

/* Empty slot i and shift the rest of its cluster back (Knuth 6.4 Algorithm
 * R): an entry at j moves to the hole unless its home lies cyclically in
 * (hole, j]. Moved pages are re-sealed with their new slot. */
static void pfx_table_del(struct pfx *p, uint32_t i) {
    for (uint32_t j = (i + 1) & p->mask;; j = (j + 1) & p->mask) {
        uint32_t e = p->slots[j];
        if (e == PFX_NIL)
            break;
        uint32_t k = pfx_home(p, &p->entries[e].h);
        bool stays = i <= j ? (i < k && k <= j) : (i < k || k <= j);
        if (stays)
            continue;
        p->slots[i] = e;
        p->entries[e].slot = i;
        pfx_reseal(p, e);
        i = j;
    }
    p->slots[i] = PFX_NIL;
}

/* ---- tenants ---- */

static uint32_t pfx_tenant_home(uint32_t id, uint32_t mask) {
    return (uint32_t)(((uint64_t)id * 0x9e3779b97f4a7c15ull) >> 32) & mask;
}

/* Record index of tenant id, or PFX_NIL. */
static uint32_t pfx_tenant_find(const struct pfx *p, uint32_t id) {
    uint32_t mask = 2 * p->cap_tenants - 1;
    for (uint32_t i = pfx_tenant_home(id, mask);; i = (i + 1) & mask) {
        uint32_t r = p->tenant_idx[i];
        if (r == 0)
            return PFX_NIL;
        if (p->tenants[r - 1].id == id)
            return r - 1;
    }
}

static void pfx_tenant_index(uint32_t *idx, uint32_t mask, uint32_t id, uint32_t rec) {
    uint32_t i = pfx_tenant_home(id, mask);
    while (idx[i])
        i = (i + 1) & mask;
    idx[i] = rec + 1;
}

/* Tables for cap records: the old ones copied over. All or nothing. */
static int pfx_tenants_resize(struct pfx *p, uint32_t cap) {
    struct pfx_tenant *t = mem_alloc(MEM_PFX, (size_t)cap * sizeof *t);
    uint32_t *idx = mem_calloc(MEM_PFX, 2 * (size_t)cap, sizeof *idx);
    if (!t || !idx) {
        mem_free(t);
        mem_free(idx);
        return -ENOMEM;
    }
    if (p->n_tenants)
        memcpy(t, p->tenants, (size_t)p->n_tenants * sizeof *t);
    for (uint32_t r = 0; r < p->n_tenants; r++)
        pfx_tenant_index(idx, 2 * cap - 1, t[r].id, r);
    mem_free(p->tenants);
    mem_free(p->tenant_idx);
    p->tenants = t;
    p->tenant_idx = idx;
    p->cap_tenants = cap;
    return 0;
}

/* Record of tenant id, created (no limit, no entries) when missing. */
static int pfx_tenant_get(struct pfx *p, uint32_t id, uint32_t *rec) {
    uint32_t r = pfx_tenant_find(p, id);
    if (r == PFX_NIL) {
        if (p->n_tenants == p->cap_tenants) {
            int rc = pfx_tenants_resize(p, 2 * p->cap_tenants);
            if (rc)
                return rc;
        }
        r = p->n_tenants++;
        p->tenants[r] = (struct pfx_tenant){.id = id, .limit = PFX_NO_LIMIT};
        pfx_list_init(&p->tenants[r].lru);
        pfx_tenant_index(p->tenant_idx, 2 * p->cap_tenants - 1, id, r);
    }
    *rec = r;
    return 0;
}

/* ---- create / destroy ---- */

int pfx_create(const struct pfx_config *cfg, struct vmm *v, struct pfx **out) {
    if (!cfg || !v || !out)
        return -EINVAL;
    uint32_t n_pages = vmm_n_pages(v);
    if (n_pages == 0 || n_pages > PFX_MAX_PAGES)
        return -EINVAL;
    uint32_t cap = 16;
    while (cap < 2 * n_pages)
        cap *= 2;
    int rc = -ENOMEM;
    struct pfx *p = mem_calloc(MEM_PFX, 1, sizeof *p);
    if (!p)
        goto fail;
    p->v = v;
    p->spill = cfg->spill;
    p->spill_ctx = cfg->spill_ctx;
    p->removed = cfg->removed;
    p->removed_ctx = cfg->removed_ctx;
    p->n_pages = n_pages;
    p->tpp = vmm_tokens_per_page(v);
    p->evict_scan_max = cfg->evict_scan_max ? cfg->evict_scan_max : PFX_EVICT_SCAN;
    p->mask = cap - 1;
    if (!(p->entries = mem_calloc(MEM_PFX, n_pages, sizeof *p->entries)))
        goto fail_p;
    if (!(p->slots = mem_alloc(MEM_PFX, (size_t)cap * sizeof *p->slots)))
        goto fail_entries;
    memset(p->slots, 0xff, (size_t)cap * sizeof *p->slots); /* PFX_NIL */
    if ((rc = pfx_tenants_resize(p, PFX_TENANTS_MIN)) != 0)
        goto fail_slots;
    if ((rc = pfx_hasher_init(&p->hs, cfg->secret, cfg->model_fp, p->tpp)) != 0)
        goto fail_tenants;
    for (uint32_t e = 0; e < n_pages; e++)
        p->entries[e].link[0] = p->entries[e].link[1] = (struct pfx_link){PFX_NIL, PFX_NIL};
    for (int c = 0; c < PFX_N_PRIO; c++)
        pfx_list_init(&p->cls[c]);
    pfx_list_init(&p->doomed);
    *out = p;
    return 0;

fail_tenants:
    mem_free(p->tenants);
    mem_free(p->tenant_idx);
fail_slots:
    mem_free(p->slots);
fail_entries:
    mem_free(p->entries);
fail_p:
    mem_free(p);
fail:
    return rc;
}

void pfx_destroy(struct pfx *p) {
    if (!p)
        return;
    for (uint32_t e = 0; e < p->n_pages; e++) {
        if (p->entries[e].state == PFX_E_NONE)
            continue;
        int rc = vmm_page_evict(p->v, e);
        if (rc)
            LOG_WARN("pfx", "destroy: page %u still mapped (%d): it stays sealed in vmm", e, rc);
        assert(rc == 0 && "pfx_destroy with a cached page still mapped by a range");
    }
    pfx_hasher_fini(&p->hs);
    mem_free(p->tenants);
    mem_free(p->tenant_idx);
    mem_free(p->slots);
    mem_free(p->entries);
    mem_free(p);
}

int pfx_chain(const struct pfx *p, const struct pfx_ns *ns, uint32_t n_ns, const int32_t *tokens,
              uint32_t n_tokens, struct pfx_hash *out, uint32_t *n_out) {
    if (!p || !ns || !n_out)
        return -EINVAL;
    return pfx_hasher_chain(&p->hs, ns, n_ns, tokens, n_tokens, out, n_out);
}

/* ---- unlinking ---- */

/* Forget entry e (INDEXED or DOOMED) in every structure; vmm untouched. */
static void pfx_unlink(struct pfx *p, uint32_t e) {
    struct pfx_entry *en = &p->entries[e];
    pfx_list_del(p, pfx_cls_list(p, e), PFX_L_CLS, e);
    if (en->state == PFX_E_INDEXED) {
        pfx_list_del(p, &p->tenants[en->trec].lru, PFX_L_TEN, e);
        pfx_table_del(p, en->slot);
        p->n_entries--;
        if (p->removed)
            p->removed(p->removed_ctx, &en->h, en->tenant);
    } else {
        p->n_doomed--;
    }
    en->state = PFX_E_NONE;
    en->slot = PFX_NIL;
}

/* Evict entry e's page if no range maps it. Returns 0 (freed and forgotten),
 * -EBUSY (mapped: nothing changed). A page vmm no longer holds as CACHED
 * (someone evicted behind pfx's back) is forgotten and reported. */
static int pfx_try_evict(struct pfx *p, uint32_t e) {
    int rc = vmm_page_evict(p->v, e);
    if (rc == -EBUSY)
        return rc;
    if (NEVER(rc != 0))
        LOG_ERROR("pfx", "page %u: vmm evict %d, index out of step; dropping the entry", e, rc);
    pfx_unlink(p, e);
    return 0;
}

/* pfx_try_evict, handing an indexed entry's page to the spill hook first
 * (while vmm holds it SPILLING, so nothing else can touch it). */
static int pfx_try_spill(struct pfx *p, uint32_t e) {
    struct pfx_entry *en = &p->entries[e];
    if (!p->spill || en->state != PFX_E_INDEXED)
        return pfx_try_evict(p, e);
    int rc = vmm_page_spill_begin(p->v, e);
    if (rc == -EBUSY)
        return rc;
    if (NEVER(rc != 0))
        return pfx_try_evict(p, e);
    p->spill(p->spill_ctx, &en->h, e, en->tenant, en->prio);
    rc = vmm_page_spill_end(p->v, e, true);
    if (NEVER(rc != 0))
        LOG_ERROR("pfx", "page %u: vmm spill end %d", e, rc);
    p->c.spills_total++;
    pfx_unlink(p, e);
    return 0;
}

/* Indexed entry e (mapped by some range) leaves the index; its page stays
 * sealed, marked doomed in vmm, until eviction finds it unmapped. */
static void pfx_doom(struct pfx *p, uint32_t e) {
    struct pfx_entry *en = &p->entries[e];
    pfx_unlink(p, e);
    en->state = PFX_E_DOOMED;
    en->slot = PFX_SLOT_DOOMED;
    pfx_list_push(p, &p->doomed, PFX_L_CLS, e);
    p->n_doomed++;
    pfx_reseal(p, e);
}

/* ---- enumeration ---- */

uint32_t pfx_hashes(const struct pfx *p, struct pfx_hash *out, uint32_t max) {
    uint32_t n = 0;
    for (uint32_t e = 0; e < p->n_pages; e++) {
        if (p->entries[e].state != PFX_E_INDEXED)
            continue;
        if (n < max)
            out[n] = p->entries[e].h;
        n++;
    }
    return n;
}

/* ---- lookup / insert ---- */

uint32_t pfx_lookup(struct pfx *p, const struct pfx_hash *chain, uint32_t n, uint32_t *pages) {
    uint64_t now = pfx_now_ns();
    uint32_t k = 0;
    for (; k < n; k++) {
        uint32_t i = pfx_table_find(p, &chain[k]);
        if (i == PFX_NIL)
            break;
        pages[k] = p->slots[i];
        pfx_touch(p, pages[k], now);
    }
    p->c.lookups_total++;
    p->c.hit_pages_total += k;
    p->c.miss_pages_total += n - k;
    p->c.hit_tokens_total += (uint64_t)k * p->tpp;
    p->c.miss_tokens_total += (uint64_t)(n - k) * p->tpp;
    return k;
}

bool pfx_contains(const struct pfx *p, const struct pfx_hash *h) {
    return pfx_table_find(p, h) != PFX_NIL;
}

/* Make room under tenant rec's limit for one more entry: evict its least
 * recently used unreferenced entries; a referenced one met is touched and
 * skipped. Visits at most evict_scan_max referenced entries, and none twice. */
static int pfx_tenant_make_room(struct pfx *p, uint32_t rec) {
    struct pfx_tenant *t = &p->tenants[rec];
    uint32_t skips = 0, skip_max = t->lru.n < p->evict_scan_max ? t->lru.n : p->evict_scan_max;
    uint64_t now = pfx_now_ns();
    while (t->lru.n >= t->limit && t->lru.n > 0 && skips < skip_max) {
        uint32_t e = t->lru.head;
        if (pfx_try_evict(p, e) == 0) {
            p->c.evictions_total++;
            p->c.limit_evictions_total++;
        } else {
            pfx_touch(p, e, now);
            skips++;
        }
    }
    return t->lru.n >= t->limit ? -EDQUOT : 0;
}

int pfx_insert(struct pfx *p, const struct pfx_hash *h, uint32_t page, uint32_t tenant,
               uint8_t prio) {
    if (page >= p->n_pages || prio >= PFX_N_PRIO || p->entries[page].state != PFX_E_NONE)
        return -EINVAL;
    struct vmm_page_info info;
    if (vmm_page_info(p->v, page, &info) ||
        (info.state != VMM_PAGE_MAPPED && info.state != VMM_PAGE_RESTORING) ||
        info.hash_slot != VMM_PAGE_NONE)
        return -EINVAL;
    if (pfx_table_find(p, h) != PFX_NIL) {
        p->c.insert_exists_total++;
        return -EEXIST;
    }
    uint32_t rec;
    int rc = pfx_tenant_get(p, tenant, &rec);
    if (rc)
        return rc;
    if (pfx_tenant_make_room(p, rec)) {
        p->c.insert_quota_total++;
        return -EDQUOT;
    }
    struct pfx_entry *en = &p->entries[page];
    en->h = *h; /* before placing: probes compare entries' hashes */
    uint32_t slot = pfx_table_place(p, h, page);
    if ((rc = vmm_page_seal(p->v, page, slot, tenant)) != 0) {
        /* Unmapped by another thread since the info call: nothing to cache.
         * The slot was the first empty one of its probe run, so emptying it
         * again restores the table exactly. */
        p->slots[slot] = PFX_NIL;
        return -EINVAL;
    }
    en->tenant = tenant;
    en->trec = rec;
    en->slot = slot;
    en->prio = prio;
    en->state = PFX_E_INDEXED;
    en->last_use_ns = pfx_now_ns();
    pfx_list_push(p, &p->cls[prio], PFX_L_CLS, page);
    pfx_list_push(p, &p->tenants[rec].lru, PFX_L_TEN, page);
    p->n_entries++;
    p->c.inserts_total++;
    return 0;
}

/* ---- eviction, limits, purge ---- */

int pfx_evict(struct pfx *p, uint32_t want, uint32_t *n_evicted) {
    uint32_t done = 0, skips = 0;
    uint64_t now = pfx_now_ns();
    int rc = 0;
    /* Least valuable list first: doomed, then class PFX_N_PRIO-1 .. 0. */
    for (int c = PFX_N_PRIO; c >= 0 && done < want && rc == 0; c--) {
        struct pfx_list *l = c == PFX_N_PRIO ? &p->doomed : &p->cls[c];
        /* A skipped entry goes to the tail: visiting n heads sees each once. */
        for (uint32_t n = l->n; n > 0 && done < want; n--) {
            uint32_t e = l->head;
            if (pfx_try_spill(p, e) == 0) {
                done++;
                continue;
            }
            pfx_touch(p, e, now);
            if (++skips >= p->evict_scan_max) {
                rc = -EAGAIN;
                break;
            }
        }
    }
    if (done == want)
        rc = 0;
    p->c.evictions_total += done;
    if (n_evicted)
        *n_evicted = done;
    return rc;
}

int pfx_evict_page(struct pfx *p, uint32_t page) {
    if (page >= p->n_pages || p->entries[page].state == PFX_E_NONE)
        return -ENOENT;
    int rc = pfx_try_spill(p, page);
    if (rc == 0)
        p->c.evictions_total++;
    return rc;
}

int pfx_tenant_limit(struct pfx *p, uint32_t tenant, uint32_t max_pages) {
    uint32_t rec;
    int rc = pfx_tenant_get(p, tenant, &rec);
    if (rc)
        return rc;
    struct pfx_tenant *t = &p->tenants[rec];
    t->limit = max_pages;
    for (uint32_t e = t->lru.head; e != PFX_NIL && t->lru.n > max_pages;) {
        uint32_t next = p->entries[e].link[PFX_L_TEN].next;
        if (pfx_try_evict(p, e) == 0) {
            p->c.evictions_total++;
            p->c.limit_evictions_total++;
        }
        e = next;
    }
    return 0;
}

int pfx_purge_tenant(struct pfx *p, uint32_t tenant, uint32_t *n_purged) {
    uint32_t rec = pfx_tenant_find(p, tenant), n = 0;
    if (rec != PFX_NIL) {
        struct pfx_tenant *t = &p->tenants[rec];
        while (t->lru.n) {
            uint32_t e = t->lru.head;
            if (pfx_try_evict(p, e) != 0)
                pfx_doom(p, e);
            n++;
        }
    }
    p->c.purges_total += n;
    if (n_purged)
        *n_purged = n;
    return 0;
}

/* ---- stats ---- */

void pfx_stats_get(const struct pfx *p, struct pfx_stats *out) {
    *out = p->c;
    out->entries = p->n_entries;
    out->entries_doomed = p->n_doomed;
    out->tenants = p->n_tenants;
}

int pfx_stats_format(const struct pfx_stats *s, char *buf, size_t len) {
    int n =
        snprintf(buf, len,
                 "# pfx\n"
                 "pfx_entries:%" PRIu64 "\n"
                 "pfx_entries_doomed:%" PRIu64 "\n"
                 "pfx_tenants:%" PRIu64 "\n"
                 "pfx_lookups_total:%" PRIu64 "\n"
                 "pfx_hit_pages_total:%" PRIu64 "\n"
                 "pfx_miss_pages_total:%" PRIu64 "\n"
                 "pfx_hit_tokens_total:%" PRIu64 "\n"
                 "pfx_miss_tokens_total:%" PRIu64 "\n"
                 "pfx_inserts_total:%" PRIu64 "\n"
                 "pfx_insert_exists_total:%" PRIu64 "\n"
                 "pfx_insert_quota_total:%" PRIu64 "\n"
                 "pfx_evictions_total:%" PRIu64 "\n"
                 "pfx_spills_total:%" PRIu64 "\n"
                 "pfx_limit_evictions_total:%" PRIu64 "\n"
                 "pfx_purges_total:%" PRIu64 "\n",
                 s->entries, s->entries_doomed, s->tenants, s->lookups_total, s->hit_pages_total,
                 s->miss_pages_total, s->hit_tokens_total, s->miss_tokens_total, s->inserts_total,
                 s->insert_exists_total, s->insert_quota_total, s->evictions_total, s->spills_total,
                 s->limit_evictions_total, s->purges_total);
    return n >= 0 && (size_t)n < len ? 0 : -ENOSPC;
}

/* ---- invariants ---- */

#define PFX_CHECK(cond, ...)                                                                       \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            LOG_ERROR("pfx", "check: " __VA_ARGS__);                                               \
            return false;                                                                          \
        }                                                                                          \
    } while (0)

/* List l (links w): prev/next agree, the walk ends in l->n steps at l->tail,
 * and every member has state want_state, class prio (< 0: any) and tenant
 * record trec (PFX_NIL: any). */
static bool pfx_check_list(const struct pfx *p, const struct pfx_list *l, int w, int want_state,
                           int prio, uint32_t trec) {
    uint32_t n = 0, prev = PFX_NIL;
    for (uint32_t e = l->head; e != PFX_NIL; e = p->entries[e].link[w].next) {
        PFX_CHECK(e < p->n_pages && n < l->n, "list %d: walk past %u entries", w, l->n);
        const struct pfx_entry *en = &p->entries[e];
        PFX_CHECK(en->link[w].prev == prev, "list %d: page %u prev %u, want %u", w, e,
                  en->link[w].prev, prev);
        PFX_CHECK(en->state == want_state, "list %d: page %u state %u, want %d", w, e, en->state,
                  want_state);
        PFX_CHECK(prio < 0 || en->prio == prio, "page %u prio %u on class list %d", e, en->prio,
                  prio);
        PFX_CHECK(trec == PFX_NIL || en->trec == trec, "page %u trec %u on tenant list %u", e,
                  en->trec, trec);
        prev = e;
        n++;
    }
    PFX_CHECK(n == l->n && l->tail == prev, "list %d: %u walked, n %u, tail %u vs %u", w, n, l->n,
              l->tail, prev);
    return true;
}

/* Page e's entry against vmm's view of the page and against the table. */
static bool pfx_check_page(const struct pfx *p, uint32_t e) {
    const struct pfx_entry *en = &p->entries[e];
    struct vmm_page_info vi;
    PFX_CHECK(vmm_page_info(p->v, e, &vi) == 0, "page %u: no vmm info", e);
    if (en->state == PFX_E_NONE) {
        PFX_CHECK(vi.hash_slot == VMM_PAGE_NONE && vi.state != VMM_PAGE_CACHED,
                  "page %u not indexed but vmm has it sealed (slot %u, state %d)", e, vi.hash_slot,
                  (int)vi.state);
        return true;
    }
    PFX_CHECK(vi.state == VMM_PAGE_MAPPED || vi.state == VMM_PAGE_CACHED,
              "page %u indexed but vmm state %d", e, (int)vi.state);
    PFX_CHECK(vi.hash_slot == en->slot && vi.tenant == en->tenant,
              "page %u: vmm slot %u tenant %u, index slot %u tenant %u", e, vi.hash_slot, vi.tenant,
              en->slot, en->tenant);
    if (en->state == PFX_E_DOOMED)
        return true;
    PFX_CHECK(en->state == PFX_E_INDEXED && en->prio < PFX_N_PRIO, "page %u state %u prio %u", e,
              en->state, en->prio);
    PFX_CHECK(en->slot <= p->mask && p->slots[en->slot] == e, "page %u slot %u holds %u", e,
              en->slot, en->slot <= p->mask ? p->slots[en->slot] : PFX_NIL);
    /* An unbroken probe run from the home slot: a lookup finds it. */
    PFX_CHECK(pfx_table_find(p, &en->h) == en->slot, "page %u unreachable from its home", e);
    PFX_CHECK(en->trec < p->n_tenants && p->tenants[en->trec].id == en->tenant,
              "page %u tenant record %u", e, en->trec);
    return true;
}

bool pfx_check(const struct pfx *p) {
    uint32_t n_idx = 0, n_doom = 0, n_slots = 0, n_cls = 0, n_ten = 0;
    for (uint32_t e = 0; e < p->n_pages; e++) {
        if (!pfx_check_page(p, e))
            return false;
        n_idx += p->entries[e].state == PFX_E_INDEXED;
        n_doom += p->entries[e].state == PFX_E_DOOMED;
    }
    PFX_CHECK(n_idx == p->n_entries && n_doom == p->n_doomed, "counts %u/%u, want %u/%u", n_idx,
              n_doom, p->n_entries, p->n_doomed);
    for (uint32_t i = 0; i <= p->mask; i++) {
        uint32_t e = p->slots[i];
        if (e == PFX_NIL)
            continue;
        PFX_CHECK(e < p->n_pages && p->entries[e].state == PFX_E_INDEXED && p->entries[e].slot == i,
                  "slot %u holds page %u not indexed there", i, e);
        n_slots++;
    }
    PFX_CHECK(n_slots == p->n_entries, "%u slots used, %u entries", n_slots, p->n_entries);
    for (int c = 0; c < PFX_N_PRIO; c++) {
        if (!pfx_check_list(p, &p->cls[c], PFX_L_CLS, PFX_E_INDEXED, c, PFX_NIL))
            return false;
        n_cls += p->cls[c].n;
    }
    if (!pfx_check_list(p, &p->doomed, PFX_L_CLS, PFX_E_DOOMED, -1, PFX_NIL))
        return false;
    PFX_CHECK(n_cls == p->n_entries && p->doomed.n == p->n_doomed, "lists hold %u + %u", n_cls,
              p->doomed.n);
    for (uint32_t r = 0; r < p->n_tenants; r++) {
        if (!pfx_check_list(p, &p->tenants[r].lru, PFX_L_TEN, PFX_E_INDEXED, -1, r))
            return false;
        PFX_CHECK(pfx_tenant_find(p, p->tenants[r].id) == r, "tenant %u unreachable",
                  p->tenants[r].id);
        n_ten += p->tenants[r].lru.n;
    }
    PFX_CHECK(n_ten == p->n_entries, "tenant lists hold %u, entries %u", n_ten, p->n_entries);
    return true;
}
