/* vmm.c - the page pool and sequence ranges over a backend (see vmm.h).
 *
 * Data: per page a 32-byte record (handle, refcount, state, seal); the free
 * pages as an index stack (O(1) take and give back; LIFO, so a page just
 * freed is the next one used, warm in caches and TLBs); per range the pool
 * page of every mapped index; the free slots as another index stack. All of
 * it is host memory from the mem.h funnel, allocated once in vmm_create.
 *
 * VA: one reservation for all ranges. Range r starts at va + r*stride with
 * stride = (max_pages + 1) * P: the extra page is a guard that stays
 * unmapped, so a write past the end of one range faults instead of landing in
 * the next range's page 0.
 *
 * All or nothing: an operation first checks everything that can be checked
 * (slot, bounds, free pages), then makes its backend calls reading the free
 * stack without popping it, and only when every call succeeded commits the
 * metadata. When call k fails it undoes calls 1..k-1 (an unmap of what it
 * mapped, a remap of what it unmapped) and returns the error: the metadata
 * was never touched. An undo call that fails too is logged; it cannot happen
 * with injected faults, which fire once.
 *
 * Locking: one mutex, v->lock, taken by every public function except the
 * geometry getters (constant after create). Backend calls run under it: they
 * take microseconds (DESIGN §3: 7-9 us a map on the host) and never do I/O, so
 * the scheduler waits at most one map-ahead batch. No other lock is taken
 * while it is held (besides the allocator's, inside log calls).
 */
#include "vmm/vmm.h"

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "log.h"
#include "mem.h"

#define VMM_TOKEN_ALIGN 64   /* S is padded to a cache line */
#define VMM_MAP_SLACK   1024 /* mappings left to the rest of the process (model, stacks, libs) */

/* One pool page; host memory, 32 bytes (DESIGN §3 asks <= 64). */
struct vmm_page {
    uint64_t handle;      /* backend handle */
    uint64_t last_use_ns; /* CLOCK_MONOTONIC at the last map or share */
    uint32_t refcount;    /* range mappings */
    uint32_t hash_slot;   /* VMM_PAGE_NONE unless sealed */
    uint32_t tenant;
    uint8_t state; /* enum vmm_page_state */
    bool sealed;
    uint16_t pins; /* vmm_page_pin()s: keep a CACHED page from eviction */
};
_Static_assert(sizeof(struct vmm_page) <= 64, "page metadata must stay within 64 bytes");

struct vmm_range {
    uint32_t *pages;    /* [max_pages] pool page per index; VMM_PAGE_NONE below n_dropped and
                         * from n_mapped on */
    uint32_t n_mapped;  /* the extent: indices [n_dropped, n_mapped) are mapped */
    uint32_t n_dropped; /* leading indices unmapped by vmm_range_drop_front */
    bool in_use;
};

struct vmm {
    pthread_mutex_t lock;
    struct vmm_backend *be; /* owned */
    size_t page_bytes;      /* P */
    size_t token_bytes;     /* padded S */
    size_t stride;          /* bytes between range bases: (max_pages + 1) * P */
    uintptr_t va;           /* the one reservation, va_bytes long */
    size_t va_bytes;
    uint32_t tpp;       /* tokens per page */
    uint32_t n_pages;   /* N */
    uint32_t n_handles; /* N, + 1 zero page with zero_pages */
    uint32_t n_ranges;
    uint32_t max_pages;  /* pages per range */
    uint32_t max_tokens; /* T_max */
    bool zero_pages;
    uint64_t zero_handle;   /* never mapped, never written: reads as zero */
    uint64_t *handles;      /* [n_handles] */
    struct vmm_page *pages; /* [n_pages] */
    uint32_t *free_stack;   /* [n_pages], top at n_free - 1 */
    uint32_t n_free;
    uint32_t n_state[VMM_PAGE_RESTORING + 1]; /* pages per state */
    struct vmm_range *ranges;                 /* [n_ranges] */
    uint32_t *range_pages;                    /* [n_ranges][max_pages], backs ranges[].pages */
    uint32_t *slot_stack;                     /* [n_ranges], free slots, top at n_slots_free - 1 */
    uint32_t n_slots_free;
    uint32_t *scratch;  /* [n_pages] for vmm_check and vmm_page_owners, under the lock */
    uint64_t *span;     /* [max_pages] handles of one map_span call, under the lock */
    uint64_t fault_nth; /* backend calls until the injected failure; 0 = off */
    struct vmm_stats c; /* the _total counters; the gauges are computed */
};

/* ---- small helpers ---- */

static void vmm_lock(const struct vmm *v) {
    pthread_mutex_lock(&((struct vmm *)v)->lock);
}

static void vmm_unlock(const struct vmm *v) {
    pthread_mutex_unlock(&((struct vmm *)v)->lock);
}

static uint64_t vmm_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uintptr_t vmm_va_of(const struct vmm *v, uint32_t r, uint32_t idx) {
    return v->va + (uintptr_t)r * v->stride + (uintptr_t)idx * v->page_bytes;
}

static struct vmm_range *vmm_range_held(struct vmm *v, uint32_t r) {
    return r < v->n_ranges && v->ranges[r].in_use ? &v->ranges[r] : NULL;
}

static void vmm_page_state_set(struct vmm *v, uint32_t p, enum vmm_page_state s) {
    v->n_state[v->pages[p].state]--;
    v->n_state[s]++;
    v->pages[p].state = (uint8_t)s;
}

/* Consume one step of the fault hook; true when this call must fail. */
static bool vmm_fault_fires(struct vmm *v) {
    if (v->fault_nth == 0)
        return false;
    return --v->fault_nth == 0;
}

/* The three backend calls vmm makes after create, counted and hooked. */
static int vmm_be_map(struct vmm *v, uintptr_t va, uint64_t handle) {
    int rc = vmm_fault_fires(v) ? -EIO : v->be->ops->map(v->be, va, handle);
    if (rc)
        v->c.backend_errors_total++;
    else
        v->c.map_calls_total++;
    return rc;
}

/* n pages in one map_span call (the backend has the slot): one fault-hook
 * step, and n pages counted in map_calls_total on success. */
static int vmm_be_map_span(struct vmm *v, uintptr_t va, const uint64_t *handles, uint32_t n) {
    int rc = vmm_fault_fires(v) ? -EIO : v->be->ops->map_span(v->be, va, handles, n);
    if (rc)
        v->c.backend_errors_total++;
    else
        v->c.map_calls_total += n;
    return rc;
}

static int vmm_be_unmap(struct vmm *v, uintptr_t va, size_t bytes) {
    int rc = vmm_fault_fires(v) ? -EIO : v->be->ops->unmap(v->be, va, bytes);
    if (rc)
        v->c.backend_errors_total++;
    else
        v->c.unmap_calls_total++;
    return rc;
}

static int vmm_be_copy(struct vmm *v, uint64_t dst, uint64_t src) {
    int rc = vmm_fault_fires(v) ? -EIO : v->be->ops->copy(v->be, dst, src);
    if (rc)
        v->c.backend_errors_total++;
    return rc;
}

/* An undo step failed: the metadata still says what was there before, the
 * mapping may not. Nothing better to do than say so loudly. */
static void vmm_undo_failed(const char *what, int rc) {
    LOG_ERROR("vmm", "undo of a failed %s failed too (%s): the range may fault", what,
              strerror(-rc));
}

/* Drop one reference to page p; at 0 it becomes CACHED (sealed) or FREE. */
static void vmm_page_unref_locked(struct vmm *v, uint32_t p) {
    struct vmm_page *pg = &v->pages[p];
    if (NEVER(pg->refcount == 0))
        return;
    if (--pg->refcount)
        return;
    if (pg->sealed) {
        vmm_page_state_set(v, p, VMM_PAGE_CACHED);
    } else {
        vmm_page_state_set(v, p, VMM_PAGE_FREE);
        v->free_stack[v->n_free++] = p;
    }
}

/* Map the n free pages on top of the free stack at [first, first + n) of
 * range r with one map_span call, after zeroing them (zero_pages). The span
 * call is all or nothing, so a failure leaves nothing to undo. */
static int vmm_range_span_locked(struct vmm *v, uint32_t r, uint32_t first, uint32_t n) {
    int rc = 0;
    for (uint32_t k = 0; k < n && rc == 0; k++) {
        v->span[k] = v->pages[v->free_stack[v->n_free - 1 - k]].handle;
        if (v->zero_pages)
            rc = vmm_be_copy(v, v->span[k], v->zero_handle);
    }
    return rc ? rc : vmm_be_map_span(v, vmm_va_of(v, r, first), v->span, n);
}

/* Map n free pages at indices [n_mapped, n_mapped + n) of range r: one
 * map_span call when the backend has it and n > 1, else one map call a
 * page. Caller checked n <= n_free and n_mapped + n <= max_pages. All or
 * nothing. */
static int vmm_range_extend_locked(struct vmm *v, uint32_t r, uint32_t n) {
    struct vmm_range *rg = &v->ranges[r];
    uint32_t first = rg->n_mapped, k;
    int rc = 0;
    assert(n <= v->n_free && first + n <= v->max_pages);
    bool span = n > 1 && v->be->ops->map_span;
    if (span && (rc = vmm_range_span_locked(v, r, first, n)) != 0)
        return rc;
    for (k = span ? n : 0; k < n; k++) {
        uint64_t h = v->pages[v->free_stack[v->n_free - 1 - k]].handle;
        if (v->zero_pages && (rc = vmm_be_copy(v, h, v->zero_handle)) != 0)
            break;
        if ((rc = vmm_be_map(v, vmm_va_of(v, r, first + k), h)) != 0)
            break;
    }
    if (rc) {
        int urc = k ? vmm_be_unmap(v, vmm_va_of(v, r, first), (size_t)k * v->page_bytes) : 0;
        if (urc)
            vmm_undo_failed("grow", urc);
        return rc;
    }
    uint64_t now = vmm_now_ns();
    for (k = 0; k < n; k++) {
        uint32_t p = v->free_stack[--v->n_free];
        struct vmm_page *pg = &v->pages[p];
        assert(pg->state == VMM_PAGE_FREE && pg->refcount == 0);
        vmm_page_state_set(v, p, VMM_PAGE_MAPPED);
        pg->refcount = 1;
        pg->last_use_ns = now;
        rg->pages[first + k] = p;
    }
    rg->n_mapped = first + n;
    return 0;
}

/* Unmap indices [keep, n_mapped) of range r in one backend call (keep 0:
 * all of it, the dropped front included: the range starts again from 0). A
 * keep inside the dropped front is the caller's error (-EINVAL). */
static int vmm_range_cut_locked(struct vmm *v, uint32_t r, uint32_t keep) {
    struct vmm_range *rg = &v->ranges[r];
    if (keep >= rg->n_mapped)
        return 0;
    if (keep && keep < rg->n_dropped)
        return -EINVAL;
    uint32_t from = keep > rg->n_dropped ? keep : rg->n_dropped;
    int rc = from < rg->n_mapped ? vmm_be_unmap(v, vmm_va_of(v, r, from),
                                                (size_t)(rg->n_mapped - from) * v->page_bytes)
                                 : 0;
    if (rc)
        return rc;
    for (uint32_t i = rg->n_mapped; i-- > from;) {
        vmm_page_unref_locked(v, rg->pages[i]);
        rg->pages[i] = VMM_PAGE_NONE;
    }
    rg->n_mapped = keep;
    if (keep == 0)
        rg->n_dropped = 0;
    return 0;
}

/* ---- create / destroy ---- */

/* P: the smallest multiple of lcm(gran, S) that is >= req. 0 on overflow. */
static size_t vmm_page_round(size_t gran, size_t s, size_t req) {
    size_t a = gran, b = s;
    while (b) {
        size_t t = a % b;
        a = b;
        b = t;
    }
    size_t unit = gran / a;
    if (unit > SIZE_MAX / s)
        return 0;
    unit *= s;
    if (req <= unit)
        return unit;
    size_t n = req / unit + (req % unit != 0);
    return n > SIZE_MAX / unit ? 0 : n * unit;
}

/* Fill the geometry fields of v from cfg and the backend granularity. */
static int vmm_geometry(struct vmm *v, const struct vmm_config *cfg, char *errbuf, size_t errlen) {
    size_t gran = v->be->ops->granularity(v->be);
    if (cfg->token_bytes == 0 || cfg->token_bytes > SIZE_MAX / 2 || cfg->n_ranges == 0 ||
        cfg->max_tokens == 0 || gran == 0) {
        log_errbuf(errbuf, errlen,
                   "vmm: token_bytes, n_ranges and max_tokens must be > 0 (got %zu, %u, %u)",
                   cfg->token_bytes, cfg->n_ranges, cfg->max_tokens);
        return -EINVAL;
    }
    v->token_bytes = (cfg->token_bytes + VMM_TOKEN_ALIGN - 1) & ~(size_t)(VMM_TOKEN_ALIGN - 1);
    /* A range never holds more than max_tokens tokens, so page bytes past
     * max_tokens strides can never be addressed: clamp the request before
     * rounding, or a 1 GiB page asked of a small context prefaults 1 GiB a
     * page for nothing. */
    size_t want = cfg->page_bytes;
    if (cfg->max_tokens && want && (want - 1) / v->token_bytes >= cfg->max_tokens) /* > n x S */
        want = (size_t)cfg->max_tokens * v->token_bytes;
    v->page_bytes = vmm_page_round(gran, v->token_bytes, want);
    if (v->page_bytes == 0 || v->page_bytes / v->token_bytes > UINT32_MAX) {
        log_errbuf(errbuf, errlen,
                   "vmm: page size %zu B cannot be rounded to a multiple of %zu B "
                   "and the %zu B token stride",
                   cfg->page_bytes, gran, v->token_bytes);
        return -EINVAL;
    }
    v->tpp = (uint32_t)(v->page_bytes / v->token_bytes);
    v->max_pages = cfg->max_tokens / v->tpp + (cfg->max_tokens % v->tpp != 0);
    /* neither a page count nor a budget: provision every range fully */
    uint64_t n = cfg->n_pages        ? cfg->n_pages
                 : cfg->budget_bytes ? cfg->budget_bytes / v->page_bytes
                                     : (uint64_t)cfg->n_ranges * v->max_pages;
    if (n == 0)
        n = 1;
    /* a budget beyond what every range can map at once is memory nobody
     * can use (and a prefaulted pool commits it): give the ranges their
     * fill. A caller that wants more pages (cached prefixes) sets n_pages. */
    if (!cfg->n_pages && n > (uint64_t)cfg->n_ranges * v->max_pages) {
        LOG_INFO("vmm", "budget of %" PRIu64 " pages capped to %" PRIu64 " (%u ranges x %u pages)",
                 n, (uint64_t)cfg->n_ranges * v->max_pages, cfg->n_ranges, v->max_pages);
        n = (uint64_t)cfg->n_ranges * v->max_pages;
    }
    if (n > UINT32_MAX - 2) {
        log_errbuf(errbuf, errlen, "vmm: %" PRIu64 " pages is too many (at most %u)", n,
                   UINT32_MAX - 2);
        return -EINVAL;
    }
    v->n_pages = (uint32_t)n;
    v->n_ranges = cfg->n_ranges;
    v->max_tokens = cfg->max_tokens;
    uint64_t stride = ((uint64_t)v->max_pages + 1) * v->page_bytes;
    if (stride / v->page_bytes != (uint64_t)v->max_pages + 1 || stride > SIZE_MAX / v->n_ranges) {
        log_errbuf(errbuf, errlen, "vmm: %u ranges of %u tokens overflow the address space",
                   cfg->n_ranges, cfg->max_tokens);
        return -EINVAL;
    }
    v->stride = (size_t)stride;
    v->va_bytes = v->stride * v->n_ranges;
    v->zero_pages = cfg->zero_pages;
    v->n_handles = v->n_pages + (v->zero_pages ? 1 : 0);
    return 0;
}

/* Refuse a host pool larger than the memory the kernel could give it: a
 * prefaulted memfd of that size would push the machine into the OOM killer
 * (and a lazily faulted one would fail later, mid-step, with SIGBUS) rather
 * than fail here with a message. 90% leaves room for everything else. */
static int vmm_mem_budget(struct vmm *v, char *errbuf, size_t errlen) {
    uint64_t avail;
    if (!vmm_host_mem_available(v->be, &avail))
        return 0;
    uint64_t want = (uint64_t)v->n_handles * v->page_bytes;
    if (want <= avail / 10 * 9)
        return 0;
    log_errbuf(errbuf, errlen,
               "vmm: a pool of %u pages of %zu B (%.2f GiB) exceeds 90%% of the %.2f GiB of "
               "available memory; set a smaller budget, context or page size",
               v->n_handles, v->page_bytes, (double)want / (1 << 30), (double)avail / (1 << 30));
    return -ENOMEM;
}

/* Refuse a config whose worst case could exceed vm.max_map_count, for a
 * backend whose mappings are process VMAs (host). Worst case: every page of
 * every range mapped as its own VMA, plus one PROT_NONE gap per range. */
static int vmm_map_budget(struct vmm *v, char *errbuf, size_t errlen) {
    uint64_t limit, in_use;
    if (!vmm_host_map_limits(v->be, &limit, &in_use))
        return 0;
    uint64_t worst = (uint64_t)v->n_ranges * ((uint64_t)v->max_pages + 1);
    if (worst + in_use + VMM_MAP_SLACK <= limit)
        return 0;
    log_errbuf(errbuf, errlen,
               "vmm: up to %" PRIu64 " mappings (%u ranges x (%u pages + 1)) + %" PRIu64
               " in use + %u slack exceed vm.max_map_count %" PRIu64
               "; use a bigger page size (now %zu B), fewer ranges or fewer max_tokens",
               worst, v->n_ranges, v->max_pages, in_use, VMM_MAP_SLACK, limit, v->page_bytes);
    return -ENOMEM;
}

static int vmm_alloc_tables(struct vmm *v) {
    v->handles = mem_calloc(MEM_VMM, v->n_handles, sizeof *v->handles);
    v->pages = mem_calloc(MEM_VMM, v->n_pages, sizeof *v->pages);
    v->free_stack = mem_calloc(MEM_VMM, v->n_pages, sizeof *v->free_stack);
    v->scratch = mem_calloc(MEM_VMM, v->n_pages, sizeof *v->scratch);
    v->span = mem_calloc(MEM_VMM, v->max_pages, sizeof *v->span);
    v->ranges = mem_calloc(MEM_VMM, v->n_ranges, sizeof *v->ranges);
    v->slot_stack = mem_calloc(MEM_VMM, v->n_ranges, sizeof *v->slot_stack);
    v->range_pages = mem_calloc(MEM_VMM, (size_t)v->n_ranges * v->max_pages, sizeof(uint32_t));
    if (!v->handles || !v->pages || !v->free_stack || !v->scratch || !v->span || !v->ranges ||
        !v->slot_stack || !v->range_pages)
        return -ENOMEM;
    return 0;
}

static void vmm_free_tables(struct vmm *v) {
    mem_free(v->handles);
    mem_free(v->pages);
    mem_free(v->free_stack);
    mem_free(v->scratch);
    mem_free(v->span);
    mem_free(v->ranges);
    mem_free(v->slot_stack);
    mem_free(v->range_pages);
}

/* Metadata of a fresh pool: every page free (page 0 on top of the stack),
 * every slot free (slot 0 on top). */
static void vmm_init_tables(struct vmm *v) {
    for (uint32_t i = 0; i < v->n_pages; i++) {
        v->pages[i] = (struct vmm_page){.handle = v->handles[i], .hash_slot = VMM_PAGE_NONE};
        v->free_stack[i] = v->n_pages - 1 - i;
    }
    v->n_free = v->n_pages;
    v->n_state[VMM_PAGE_FREE] = v->n_pages;
    if (v->zero_pages)
        v->zero_handle = v->handles[v->n_pages];
    for (size_t i = 0; i < (size_t)v->n_ranges * v->max_pages; i++)
        v->range_pages[i] = VMM_PAGE_NONE;
    for (uint32_t r = 0; r < v->n_ranges; r++) {
        v->ranges[r].pages = v->range_pages + (size_t)r * v->max_pages;
        v->slot_stack[r] = v->n_ranges - 1 - r;
    }
    v->n_slots_free = v->n_ranges;
}

int vmm_create(const struct vmm_config *cfg, struct vmm **out, char *errbuf, size_t errlen) {
    struct vmm_backend *be = cfg->backend;
    struct vmm *v = NULL;
    int rc;
    log_errbuf(errbuf, errlen, "ok");
    if (!be) {
        rc = vmm_host_backend_create(cfg->huge, &be);
        if (rc == -ENOTSUP)
            log_errbuf(
                errbuf, errlen,
                "vmm: huge pages required (VMM_HUGE_ON) but unavailable: no free hugetlb pages "
                "(vm.nr_hugepages) and shmem THP off (transparent_hugepage/shmem_enabled)");
        else if (rc)
            log_errbuf(errbuf, errlen, "vmm: cannot create the host backend: %s", strerror(-rc));
        if (rc)
            return rc;
        vmm_host_prefault_set(be, cfg->prefault);
    }
    v = mem_calloc(MEM_VMM, 1, sizeof *v);
    if (!v) {
        log_errbuf(errbuf, errlen, "vmm: out of host memory");
        rc = -ENOMEM;
        goto fail_be;
    }
    v->be = be;
    if ((rc = vmm_geometry(v, cfg, errbuf, errlen)) != 0)
        goto fail_v;
    if ((rc = vmm_map_budget(v, errbuf, errlen)) != 0 ||
        (rc = vmm_mem_budget(v, errbuf, errlen)) != 0)
        goto fail_v;
    if ((rc = vmm_alloc_tables(v)) != 0) {
        log_errbuf(errbuf, errlen, "vmm: out of host memory for the tables of %u pages, %u ranges",
                   v->n_pages, v->n_ranges);
        goto fail_tables;
    }
    rc = be->ops->phys_alloc(be, v->page_bytes, v->n_handles, v->handles);
    if (rc) {
        log_errbuf(errbuf, errlen, "vmm: %s backend cannot create %u pages of %zu B: %s",
                   be->ops->name, v->n_handles, v->page_bytes, strerror(-rc));
        goto fail_tables;
    }
    rc = be->ops->reserve(be, v->va_bytes, &v->va);
    if (rc) {
        log_errbuf(errbuf, errlen, "vmm: cannot reserve %zu B of VA for %u ranges: %s", v->va_bytes,
                   v->n_ranges, strerror(-rc));
        goto fail_phys;
    }
    rc = -pthread_mutex_init(&v->lock, NULL);
    if (rc) {
        log_errbuf(errbuf, errlen, "vmm: pthread_mutex_init: %s", strerror(-rc));
        goto fail_va;
    }
    vmm_init_tables(v);
    LOG_INFO("vmm", "%s backend: %u pages of %zu B (%u tokens of %zu B), %u ranges of %u pages",
             be->ops->name, v->n_pages, v->page_bytes, v->tpp, v->token_bytes, v->n_ranges,
             v->max_pages);
    *out = v;
    return 0;

fail_va:
    be->ops->release(be, v->va, v->va_bytes);
fail_phys:
    be->ops->phys_free(be, v->handles, v->n_handles);
fail_tables:
    vmm_free_tables(v);
fail_v:
    mem_free(v);
fail_be:
    if (be->ops->destroy)
        be->ops->destroy(be);
    return rc;
}

void vmm_destroy(struct vmm *v) {
    if (!v)
        return;
    for (uint32_t r = 0; r < v->n_ranges; r++) {
        struct vmm_range *rg = &v->ranges[r];
        if (rg->in_use && rg->n_mapped > rg->n_dropped) {
            int rc = v->be->ops->unmap(v->be, vmm_va_of(v, r, rg->n_dropped),
                                       (size_t)(rg->n_mapped - rg->n_dropped) * v->page_bytes);
            if (rc)
                LOG_ERROR("vmm", "destroy: unmap of range %u failed: %s", r, strerror(-rc));
        }
    }
    v->be->ops->release(v->be, v->va, v->va_bytes);
    v->be->ops->phys_free(v->be, v->handles, v->n_handles);
    if (v->be->ops->destroy)
        v->be->ops->destroy(v->be);
    pthread_mutex_destroy(&v->lock);
    vmm_free_tables(v);
    mem_free(v);
}

/* ---- geometry ---- */

size_t vmm_page_bytes(const struct vmm *v) {
    return v->page_bytes;
}

size_t vmm_token_bytes(const struct vmm *v) {
    return v->token_bytes;
}

uint32_t vmm_tokens_per_page(const struct vmm *v) {
    return v->tpp;
}

uint32_t vmm_n_pages(const struct vmm *v) {
    return v->n_pages;
}

uint32_t vmm_range_max_pages(const struct vmm *v) {
    return v->max_pages;
}

const char *vmm_backend_name(const struct vmm *v) {
    return v->be->ops->name;
}

struct vmm_backend *vmm_get_backend(struct vmm *v) {
    return v->be;
}

/* ---- ranges ---- */

int vmm_range_acquire(struct vmm *v, uint32_t *range) {
    int rc = -EBUSY;
    vmm_lock(v);
    if (v->n_slots_free) {
        uint32_t r = v->slot_stack[--v->n_slots_free];
        assert(!v->ranges[r].in_use && v->ranges[r].n_mapped == 0);
        v->ranges[r].in_use = true;
        *range = r;
        rc = 0;
    }
    vmm_unlock(v);
    return rc;
}

int vmm_range_release(struct vmm *v, uint32_t range) {
    int rc = -EINVAL;
    vmm_lock(v);
    struct vmm_range *rg = vmm_range_held(v, range);
    if (rg && (rc = vmm_range_cut_locked(v, range, 0)) == 0) {
        rg->in_use = false;
        v->slot_stack[v->n_slots_free++] = range;
    }
    vmm_unlock(v);
    return rc;
}

uintptr_t vmm_range_base(const struct vmm *v, uint32_t range) {
    return range < v->n_ranges ? vmm_va_of(v, range, 0) : 0;
}

uint32_t vmm_range_n_mapped(const struct vmm *v, uint32_t range) {
    vmm_lock(v);
    uint32_t n = range < v->n_ranges ? v->ranges[range].n_mapped : 0;
    vmm_unlock(v);
    return n;
}

uint32_t vmm_range_n_dropped(const struct vmm *v, uint32_t range) {
    vmm_lock(v);
    uint32_t n = range < v->n_ranges ? v->ranges[range].n_dropped : 0;
    vmm_unlock(v);
    return n;
}

int vmm_range_drop_front(struct vmm *v, uint32_t range, uint32_t n_pages) {
    int rc = 0;
    vmm_lock(v);
    struct vmm_range *rg = vmm_range_held(v, range);
    if (!rg || n_pages > rg->n_mapped) {
        rc = -EINVAL;
    } else if (n_pages > rg->n_dropped) {
        rc = vmm_be_unmap(v, vmm_va_of(v, range, rg->n_dropped),
                          (size_t)(n_pages - rg->n_dropped) * v->page_bytes);
        for (uint32_t i = rg->n_dropped; rc == 0 && i < n_pages; i++) {
            vmm_page_unref_locked(v, rg->pages[i]);
            rg->pages[i] = VMM_PAGE_NONE;
        }
        if (rc == 0) {
            v->c.dropped_front_total += n_pages - rg->n_dropped;
            rg->n_dropped = n_pages;
        }
    }
    vmm_unlock(v);
    return rc;
}

uint32_t vmm_range_capacity(const struct vmm *v, uint32_t range) {
    return vmm_range_n_mapped(v, range) * v->tpp;
}

uint32_t vmm_range_page(const struct vmm *v, uint32_t range, uint32_t idx) {
    vmm_lock(v);
    uint32_t p = VMM_PAGE_NONE;
    if (range < v->n_ranges && idx < v->ranges[range].n_mapped)
        p = v->ranges[range].pages[idx];
    vmm_unlock(v);
    return p;
}

/* Pages needed to back n_tokens tokens. */
static uint32_t vmm_pages_for(const struct vmm *v, uint32_t n_tokens) {
    return n_tokens / v->tpp + (n_tokens % v->tpp != 0);
}

int vmm_range_grow(struct vmm *v, uint32_t range, uint32_t n_tokens) {
    int rc = 0;
    vmm_lock(v);
    struct vmm_range *rg = vmm_range_held(v, range);
    uint32_t need = vmm_pages_for(v, n_tokens);
    if (!rg)
        rc = -EINVAL;
    else if (n_tokens > v->max_tokens)
        rc = -ERANGE;
    else if (need > rg->n_mapped && need - rg->n_mapped > v->n_free)
        rc = -ENOSPC;
    else if (need > rg->n_mapped &&
             (rc = vmm_range_extend_locked(v, range, need - rg->n_mapped)) == 0)
        v->c.grow_waited_total++;
    vmm_unlock(v);
    return rc;
}

int vmm_range_shrink(struct vmm *v, uint32_t range, uint32_t n_tokens) {
    int rc;
    vmm_lock(v);
    struct vmm_range *rg = vmm_range_held(v, range);
    if (!rg)
        rc = -EINVAL;
    else if (n_tokens > v->max_tokens)
        rc = -ERANGE;
    else
        rc = vmm_range_cut_locked(v, range, vmm_pages_for(v, n_tokens));
    vmm_unlock(v);
    return rc;
}

int vmm_range_map_ahead(struct vmm *v, uint32_t range, uint32_t n_pages) {
    int rc;
    vmm_lock(v);
    struct vmm_range *rg = vmm_range_held(v, range);
    if (!rg) {
        rc = -EINVAL;
    } else {
        uint32_t n = v->max_pages - rg->n_mapped;
        n = n < n_pages ? n : n_pages;
        if (n && v->n_free == 0) {
            rc = -ENOSPC;
        } else {
            n = n < v->n_free ? n : v->n_free;
            rc = n ? vmm_range_extend_locked(v, range, n) : 0;
            if (rc == 0) {
                v->c.map_ahead_pages_total += n;
                rc = (int)n;
            }
        }
    }
    vmm_unlock(v);
    return rc;
}

static int vmm_range_share_locked(struct vmm *v, uint32_t range, uint32_t page) {
    struct vmm_range *rg = vmm_range_held(v, range);
    if (!rg || page >= v->n_pages)
        return -EINVAL;
    struct vmm_page *pg = &v->pages[page];
    if (pg->state == VMM_PAGE_SPILLING || pg->state == VMM_PAGE_RESTORING)
        return -EBUSY;
    if (pg->state != VMM_PAGE_MAPPED && pg->state != VMM_PAGE_CACHED)
        return -EINVAL;
    if (rg->n_mapped >= v->max_pages)
        return -ERANGE;
    int rc = vmm_be_map(v, vmm_va_of(v, range, rg->n_mapped), pg->handle);
    if (rc)
        return rc;
    if (pg->refcount++ == 0)
        vmm_page_state_set(v, page, VMM_PAGE_MAPPED);
    pg->last_use_ns = vmm_now_ns();
    rg->pages[rg->n_mapped++] = page;
    return 0;
}

int vmm_range_share(struct vmm *v, uint32_t range, uint32_t page) {
    vmm_lock(v);
    int rc = vmm_range_share_locked(v, range, page);
    vmm_unlock(v);
    return rc;
}

/* Copy, unmap, map; undo in reverse. See vmm_range_cow in vmm.h. */
static int vmm_range_cow_locked(struct vmm *v, uint32_t range, uint32_t idx) {
    struct vmm_range *rg = vmm_range_held(v, range);
    if (!rg || idx >= rg->n_mapped || idx < rg->n_dropped)
        return -EINVAL;
    uint32_t old = rg->pages[idx];
    struct vmm_page *op = &v->pages[old];
    if (op->refcount == 1 && !op->sealed)
        return 0;
    if (v->n_free == 0)
        return -ENOSPC;
    uint32_t fresh = v->free_stack[v->n_free - 1];
    struct vmm_page *np = &v->pages[fresh];
    uintptr_t va = vmm_va_of(v, range, idx);
    int rc = vmm_be_copy(v, np->handle, op->handle);
    if (rc)
        return rc;
    if ((rc = vmm_be_unmap(v, va, v->page_bytes)) != 0)
        return rc;
    if ((rc = vmm_be_map(v, va, np->handle)) != 0) {
        int urc = vmm_be_map(v, va, op->handle);
        if (urc)
            vmm_undo_failed("cow", urc);
        return rc;
    }
    v->n_free--;
    vmm_page_state_set(v, fresh, VMM_PAGE_MAPPED);
    np->refcount = 1;
    np->last_use_ns = vmm_now_ns();
    rg->pages[idx] = fresh;
    vmm_page_unref_locked(v, old);
    v->c.cow_total++;
    return 0;
}

int vmm_range_cow(struct vmm *v, uint32_t range, uint32_t idx) {
    vmm_lock(v);
    int rc = vmm_range_cow_locked(v, range, idx);
    vmm_unlock(v);
    return rc;
}

/* ---- pages ---- */

int vmm_page_seal(struct vmm *v, uint32_t page, uint32_t hash_slot, uint32_t tenant) {
    int rc = -EINVAL;
    vmm_lock(v);
    if (page < v->n_pages && v->pages[page].state == VMM_PAGE_SPILLING) {
        rc = -EBUSY;
    } else if (page < v->n_pages && v->pages[page].state != VMM_PAGE_FREE) {
        struct vmm_page *pg = &v->pages[page];
        pg->sealed = true;
        pg->hash_slot = hash_slot;
        pg->tenant = tenant;
        if (pg->state == VMM_PAGE_RESTORING)
            vmm_page_state_set(v, page, VMM_PAGE_CACHED);
        rc = 0;
    }
    vmm_unlock(v);
    return rc;
}

/* ---- offload: spill and restore ---- */

static int vmm_be_xfer(struct vmm *v, uint64_t handle, void *host, bool to_page) {
    int rc = vmm_fault_fires(v) ? -EIO : v->be->ops->xfer(v->be, handle, host, to_page);
    if (rc)
        v->c.backend_errors_total++;
    return rc;
}

int vmm_page_spill_begin(struct vmm *v, uint32_t page) {
    int rc = -EINVAL;
    vmm_lock(v);
    if (page < v->n_pages) {
        struct vmm_page *pg = &v->pages[page];
        if (pg->refcount || pg->pins) {
            rc = -EBUSY;
        } else if (pg->state == VMM_PAGE_CACHED) {
            vmm_page_state_set(v, page, VMM_PAGE_SPILLING);
            rc = 0;
        }
    }
    vmm_unlock(v);
    return rc;
}

int vmm_page_spill_end(struct vmm *v, uint32_t page, bool done) {
    int rc = -EINVAL;
    vmm_lock(v);
    if (page < v->n_pages && v->pages[page].state == VMM_PAGE_SPILLING) {
        struct vmm_page *pg = &v->pages[page];
        if (done) {
            pg->sealed = false;
            pg->hash_slot = VMM_PAGE_NONE;
            pg->tenant = 0;
            vmm_page_state_set(v, page, VMM_PAGE_FREE);
            v->free_stack[v->n_free++] = page;
            v->c.spills_total++;
        } else {
            vmm_page_state_set(v, page, VMM_PAGE_CACHED);
        }
        rc = 0;
    }
    vmm_unlock(v);
    return rc;
}

int vmm_page_read(struct vmm *v, uint32_t page, void *dst) {
    int rc = -EINVAL;
    vmm_lock(v);
    if (page < v->n_pages && dst) {
        uint8_t st = v->pages[page].state;
        if (st == VMM_PAGE_MAPPED || st == VMM_PAGE_CACHED || st == VMM_PAGE_SPILLING)
            rc = vmm_be_xfer(v, v->pages[page].handle, dst, false);
    }
    vmm_unlock(v);
    return rc;
}

int vmm_page_restore(struct vmm *v, const void *src, uint32_t *page) {
    if (!src || !page)
        return -EINVAL;
    int rc = -ENOSPC;
    vmm_lock(v);
    if (v->n_free > 0) {
        uint32_t p = v->free_stack[v->n_free - 1];
        /* xfer only reads host memory when writing a page */
        rc = vmm_be_xfer(v, v->pages[p].handle, (void *)(uintptr_t)src, true);
        if (rc == 0) {
            v->n_free--;
            vmm_page_state_set(v, p, VMM_PAGE_RESTORING);
            v->c.restores_total++;
            *page = p;
        }
    }
    vmm_unlock(v);
    return rc;
}

int vmm_page_restore_abort(struct vmm *v, uint32_t page) {
    int rc = -EINVAL;
    vmm_lock(v);
    if (page < v->n_pages && v->pages[page].state == VMM_PAGE_RESTORING) {
        vmm_page_state_set(v, page, VMM_PAGE_FREE);
        v->free_stack[v->n_free++] = page;
        rc = 0;
    }
    vmm_unlock(v);
    return rc;
}

int vmm_page_pin(struct vmm *v, uint32_t page) {
    int rc = -EINVAL;
    vmm_lock(v);
    if (page < v->n_pages) {
        struct vmm_page *pg = &v->pages[page];
        if (pg->state != VMM_PAGE_MAPPED && pg->state != VMM_PAGE_CACHED)
            rc = -EINVAL;
        else if (pg->pins == UINT16_MAX)
            rc = -EOVERFLOW;
        else {
            pg->pins++;
            rc = 0;
        }
    }
    vmm_unlock(v);
    return rc;
}

void vmm_page_unpin(struct vmm *v, uint32_t page) {
    vmm_lock(v);
    if (ALWAYS(page < v->n_pages) && ALWAYS(v->pages[page].pins > 0))
        v->pages[page].pins--;
    vmm_unlock(v);
}

int vmm_page_evict(struct vmm *v, uint32_t page) {
    int rc = -EINVAL;
    vmm_lock(v);
    if (page < v->n_pages) {
        struct vmm_page *pg = &v->pages[page];
        if (pg->refcount || pg->pins) {
            rc = -EBUSY;
        } else if (pg->state == VMM_PAGE_CACHED) {
            pg->sealed = false;
            pg->hash_slot = VMM_PAGE_NONE;
            pg->tenant = 0;
            vmm_page_state_set(v, page, VMM_PAGE_FREE);
            v->free_stack[v->n_free++] = page;
            rc = 0;
        }
    }
    vmm_unlock(v);
    return rc;
}

int vmm_page_info(const struct vmm *v, uint32_t page, struct vmm_page_info *out) {
    if (page >= v->n_pages)
        return -EINVAL;
    vmm_lock(v);
    const struct vmm_page *pg = &v->pages[page];
    *out = (struct vmm_page_info){
        .state = (enum vmm_page_state)pg->state,
        .refcount = pg->refcount,
        .hash_slot = pg->hash_slot,
        .tenant = pg->tenant,
        .last_use_ns = pg->last_use_ns,
    };
    vmm_unlock(v);
    return 0;
}

uint32_t vmm_page_owners(const struct vmm *v, uint32_t page, uint32_t *ranges, uint32_t max) {
    uint32_t n = 0;
    vmm_lock(v);
    for (uint32_t r = 0; r < v->n_ranges; r++) {
        const struct vmm_range *rg = &v->ranges[r];
        for (uint32_t i = rg->n_dropped; i < rg->n_mapped; i++) {
            if (rg->pages[i] != page)
                continue;
            if (n < max)
                ranges[n] = r;
            n++;
        }
    }
    vmm_unlock(v);
    return n;
}

/* ---- stats, text, test hooks ---- */

static void vmm_stats_locked(const struct vmm *v, struct vmm_stats *out) {
    *out = v->c;
    out->n_pages = v->n_pages;
    out->pages_free = v->n_free;
    out->pages_mapped = v->n_state[VMM_PAGE_MAPPED];
    out->pages_cached = v->n_state[VMM_PAGE_CACHED];
    out->pages_spilling = v->n_state[VMM_PAGE_SPILLING];
    out->pages_restoring = v->n_state[VMM_PAGE_RESTORING];
    out->n_ranges = v->n_ranges;
    out->ranges_in_use = v->n_ranges - v->n_slots_free;
    out->page_bytes = v->page_bytes;
    out->token_bytes = v->token_bytes;
    out->va_reserved_bytes = v->va_bytes;
    out->range_pages_mapped = 0;
    for (uint32_t r = 0; r < v->n_ranges; r++)
        out->range_pages_mapped += v->ranges[r].n_mapped - v->ranges[r].n_dropped;
}

void vmm_stats_get(const struct vmm *v, struct vmm_stats *out) {
    vmm_lock(v);
    vmm_stats_locked(v, out);
    vmm_unlock(v);
}

int vmm_stats_format(const struct vmm *v, char *buf, size_t len) {
    struct vmm_stats s;
    vmm_stats_get(v, &s);
    int n = snprintf(buf, len,
                     "# vmm\n"
                     "vmm_backend:%s\n"
                     "vmm_pages:%" PRIu64 "\n"
                     "vmm_pages_free:%" PRIu64 "\n"
                     "vmm_pages_mapped:%" PRIu64 "\n"
                     "vmm_pages_cached:%" PRIu64 "\n"
                     "vmm_ranges:%" PRIu64 "\n"
                     "vmm_ranges_in_use:%" PRIu64 "\n"
                     "vmm_page_bytes:%" PRIu64 "\n"
                     "vmm_token_bytes:%" PRIu64 "\n"
                     "vmm_va_reserved_bytes:%" PRIu64 "\n"
                     "vmm_map_calls_total:%" PRIu64 "\n"
                     "vmm_unmap_calls_total:%" PRIu64 "\n"
                     "vmm_cow_total:%" PRIu64 "\n"
                     "vmm_dropped_front_total:%" PRIu64 "\n"
                     "vmm_map_ahead_pages_total:%" PRIu64 "\n"
                     "vmm_grow_waited_total:%" PRIu64 "\n"
                     "vmm_backend_errors_total:%" PRIu64 "\n"
                     "vmm_spills_total:%" PRIu64 "\n"
                     "vmm_restores_total:%" PRIu64 "\n",
                     vmm_backend_name(v), s.n_pages, s.pages_free, s.pages_mapped, s.pages_cached,
                     s.n_ranges, s.ranges_in_use, s.page_bytes, s.token_bytes, s.va_reserved_bytes,
                     s.map_calls_total, s.unmap_calls_total, s.cow_total, s.dropped_front_total,
                     s.map_ahead_pages_total, s.grow_waited_total, s.backend_errors_total,
                     s.spills_total, s.restores_total);
    return n >= 0 && (size_t)n < len ? 0 : -ENOSPC;
}

static char vmm_page_char(const struct vmm_page *pg) {
    switch (pg->state) {
    case VMM_PAGE_FREE:
        return '.';
    case VMM_PAGE_CACHED:
        return 'C';
    case VMM_PAGE_SPILLING:
        return 'S';
    case VMM_PAGE_RESTORING:
        return 'R';
    default:
        return pg->refcount == 1 ? 'M' : pg->refcount <= 9 ? (char)('0' + pg->refcount) : '+';
    }
}

int vmm_pool_map_format(const struct vmm *v, char *buf, size_t len) {
    if (!len)
        return -ENOSPC;
    size_t o = 0;
    int rc = 0;
    vmm_lock(v);
    for (uint32_t i = 0; i < v->n_pages && rc == 0; i++) {
        bool eol = i % 64 == 63 || i + 1 == v->n_pages;
        if (o + 1 + eol >= len) {
            rc = -ENOSPC;
            break;
        }
        buf[o++] = vmm_page_char(&v->pages[i]);
        if (eol)
            buf[o++] = '\n';
    }
    vmm_unlock(v);
    buf[o] = '\0';
    return rc;
}

void vmm_fault_inject(struct vmm *v, uint64_t nth) {
    vmm_lock(v);
    v->fault_nth = nth;
    vmm_unlock(v);
}

#define VMM_CHECK(cond, ...)                                                                       \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            LOG_ERROR("vmm", "check: " __VA_ARGS__);                                               \
            return false;                                                                          \
        }                                                                                          \
    } while (0)

static bool vmm_check_locked(const struct vmm *v) {
    uint32_t *refs = v->scratch;
    uint32_t n_state[VMM_PAGE_RESTORING + 1] = {0};
    memset(refs, 0, (size_t)v->n_pages * sizeof *refs);
    uint32_t n_used = 0;
    for (uint32_t r = 0; r < v->n_ranges; r++) {
        const struct vmm_range *rg = &v->ranges[r];
        n_used += rg->in_use;
        VMM_CHECK(rg->in_use || rg->n_mapped == 0, "free range %u maps %u pages", r, rg->n_mapped);
        VMM_CHECK(rg->n_mapped <= v->max_pages, "range %u maps %u > %u", r, rg->n_mapped,
                  v->max_pages);
        VMM_CHECK(rg->n_dropped <= rg->n_mapped, "range %u dropped %u of %u pages", r,
                  rg->n_dropped, rg->n_mapped);
        for (uint32_t i = 0; i < v->max_pages; i++) {
            uint32_t p = rg->pages[i];
            if (i >= rg->n_mapped || i < rg->n_dropped) {
                VMM_CHECK(p == VMM_PAGE_NONE,
                          "range %u idx %u outside [%u, %u) (dropped, mapped) holds page %u", r, i,
                          rg->n_dropped, rg->n_mapped, p);
                continue;
            }
            VMM_CHECK(p < v->n_pages, "range %u idx %u holds bad page %u", r, i, p);
            refs[p]++;
        }
    }
    VMM_CHECK(n_used + v->n_slots_free == v->n_ranges, "%u ranges in use + %u free != %u", n_used,
              v->n_slots_free, v->n_ranges);
    for (uint32_t k = 0; k < v->n_slots_free; k++)
        VMM_CHECK(v->slot_stack[k] < v->n_ranges && !v->ranges[v->slot_stack[k]].in_use,
                  "free slot %u is bad or in use", v->slot_stack[k]);
    for (uint32_t p = 0; p < v->n_pages; p++) {
        const struct vmm_page *pg = &v->pages[p];
        VMM_CHECK(pg->refcount == refs[p], "page %u refcount %u but %u mappings", p, pg->refcount,
                  refs[p]);
        VMM_CHECK(pg->state <= VMM_PAGE_RESTORING, "page %u bad state %u", p, pg->state);
        n_state[pg->state]++;
        if (pg->state == VMM_PAGE_MAPPED)
            VMM_CHECK(pg->refcount > 0, "page %u MAPPED with refcount 0", p);
        if (pg->state == VMM_PAGE_CACHED)
            VMM_CHECK(pg->refcount == 0 && pg->sealed, "page %u CACHED, refcount %u sealed %d", p,
                      pg->refcount, pg->sealed);
        if (pg->state == VMM_PAGE_FREE)
            VMM_CHECK(pg->refcount == 0 && !pg->sealed, "page %u FREE, refcount %u sealed %d", p,
                      pg->refcount, pg->sealed);
        if (pg->state == VMM_PAGE_FREE)
            VMM_CHECK(pg->pins == 0, "page %u FREE with %u pins", p, pg->pins);
        if (pg->state == VMM_PAGE_SPILLING)
            VMM_CHECK(pg->refcount == 0 && pg->sealed && pg->pins == 0,
                      "page %u SPILLING, refcount %u sealed %d pins %u", p, pg->refcount,
                      pg->sealed, pg->pins);
        if (pg->state == VMM_PAGE_RESTORING)
            VMM_CHECK(pg->refcount == 0 && !pg->sealed && pg->pins == 0,
                      "page %u RESTORING, refcount %u sealed %d pins %u", p, pg->refcount,
                      pg->sealed, pg->pins);
        refs[p] = 0; /* reuse as "seen on the free stack" */
    }
    for (int s = 0; s <= VMM_PAGE_RESTORING; s++)
        VMM_CHECK(n_state[s] == v->n_state[s], "state %d count %u, counted %u", s, v->n_state[s],
                  n_state[s]);
    VMM_CHECK(v->n_free == n_state[VMM_PAGE_FREE], "free stack %u but %u FREE pages", v->n_free,
              n_state[VMM_PAGE_FREE]);
    for (uint32_t k = 0; k < v->n_free; k++) {
        uint32_t p = v->free_stack[k];
        VMM_CHECK(p < v->n_pages && v->pages[p].state == VMM_PAGE_FREE,
                  "free stack slot %u holds page %u that is not FREE", k, p);
        VMM_CHECK(refs[p]++ == 0, "page %u twice on the free stack", p);
    }
    return true;
}

bool vmm_check(const struct vmm *v) {
    vmm_lock(v);
    bool ok = vmm_check_locked(v);
    vmm_unlock(v);
    return ok;
}
