/* Randomized stress of vmm/ against a reference model.
 *
 * 16 ranges of up to 8 pages share a pool of 48 pages of 4 KiB (so the pool
 * runs dry often: 128 slots of range for 48 pages). Each step picks one of
 * acquire, release, grow, shrink, share, cow, seal, evict, map-ahead at
 * random (fixed seed), predicts its result from the model (per range: its
 * page ids; per page: refcount, seal, and the 8-byte tag written into it),
 * and compares. Every 64 steps the whole layout is compared and vmm_check
 * runs; every 256 steps the tag of every mapped page is read back through
 * every range that maps it. At the end every page is free again and no
 * mapping of the memfd remains.
 *
 * 1,000,000 steps take 5-9 s on the debug build and under ASan alike on
 * 2 vCPUs: the time is the kernel's (mmap), which ASan does not slow down.
 */
#include <errno.h>
#include <stdint.h>

#include "tests/lib/vmm_util.h"

#define N_STEPS  1000000
#define N_RANGES 16
#define MAX_P    8
#define N_PAGES  48
#define TPP      64

struct model {
    bool in_use[N_RANGES];
    uint32_t n[N_RANGES];
    uint32_t pg[N_RANGES][MAX_P];
    uint32_t ref[N_PAGES];
    bool sealed[N_PAGES];
    uint64_t tag[N_PAGES];
    uint64_t next_tag;
};

static uint64_t rng_state = 0x9E3779B97F4A7C15u;

static uint32_t rnd(uint32_t n) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state % n);
}

static uint64_t *page_word(struct vmm *v, uint32_t r, uint32_t idx) {
    return (uint64_t *)(vmm_range_base(v, r) + (uintptr_t)idx * vmm_page_bytes(v));
}

static uint32_t model_free(const struct model *m) {
    uint32_t n = 0;
    for (uint32_t p = 0; p < N_PAGES; p++)
        n += m->ref[p] == 0 && !m->sealed[p];
    return n;
}

static bool model_is_free(const struct model *m, uint32_t p) {
    return m->ref[p] == 0 && !m->sealed[p];
}

/* A page newly owned by range r at idx: check it was free, give it a tag. */
static void model_take(struct model *m, struct vmm *v, uint32_t r, uint32_t idx, uint32_t p,
                       uint64_t step) {
    cr_assert(p < N_PAGES && model_is_free(m, p), "step %lu: page %u handed out is not free",
              (unsigned long)step, p);
    m->ref[p] = 1;
    m->pg[r][idx] = p;
    m->tag[p] = ++m->next_tag;
    *page_word(v, r, idx) = m->tag[p];
}

static void model_unref(struct model *m, uint32_t p) {
    m->ref[p]--;
}

static void model_compare(const struct model *m, struct vmm *v, uint64_t step, bool bytes) {
    cr_assert(vmm_check(v), "step %lu", (unsigned long)step);
    struct vmm_stats s;
    vmm_stats_get(v, &s);
    cr_assert_eq(s.pages_free, model_free(m), "step %lu: free %lu vs model %u", (unsigned long)step,
                 (unsigned long)s.pages_free, model_free(m));
    for (uint32_t r = 0; r < N_RANGES; r++) {
        cr_assert_eq(vmm_range_n_mapped(v, r), m->n[r], "step %lu range %u", (unsigned long)step,
                     r);
        for (uint32_t i = 0; i < m->n[r]; i++) {
            cr_assert_eq(vmm_range_page(v, r, i), m->pg[r][i], "step %lu range %u idx %u",
                         (unsigned long)step, r, i);
            if (bytes)
                cr_assert_eq(*page_word(v, r, i), m->tag[m->pg[r][i]],
                             "step %lu range %u idx %u page %u: bytes", (unsigned long)step, r, i,
                             m->pg[r][i]);
        }
    }
    for (uint32_t p = 0; p < N_PAGES; p++) {
        struct vmm_page_info pi;
        vmm_page_info(v, p, &pi);
        cr_assert_eq(pi.refcount, m->ref[p], "step %lu page %u", (unsigned long)step, p);
    }
}

static void step_grow(struct model *m, struct vmm *v, uint32_t r, uint64_t step) {
    uint32_t n_tokens = rnd(MAX_P * TPP + 16);
    uint32_t need = (n_tokens + TPP - 1) / TPP;
    int want = !m->in_use[r]                    ? -EINVAL
               : n_tokens > MAX_P * TPP         ? -ERANGE
               : need <= m->n[r]                ? 0
               : need - m->n[r] > model_free(m) ? -ENOSPC
                                                : 0;
    int rc = vmm_range_grow(v, r, n_tokens);
    cr_assert_eq(rc, want, "step %lu grow r %u to %u tokens", (unsigned long)step, r, n_tokens);
    if (rc == 0)
        for (; m->n[r] < need; m->n[r]++)
            model_take(m, v, r, m->n[r], vmm_range_page(v, r, m->n[r]), step);
}

static void step_shrink(struct model *m, struct vmm *v, uint32_t r, uint64_t step) {
    uint32_t n_tokens = rnd(MAX_P * TPP + 1);
    uint32_t keep = (n_tokens + TPP - 1) / TPP;
    int rc = vmm_range_shrink(v, r, n_tokens);
    cr_assert_eq(rc, m->in_use[r] ? 0 : -EINVAL, "step %lu shrink", (unsigned long)step);
    if (rc == 0)
        for (; m->n[r] > keep; m->n[r]--)
            model_unref(m, m->pg[r][m->n[r] - 1]);
}

static void step_share(struct model *m, struct vmm *v, uint32_t r, uint64_t step) {
    uint32_t p = rnd(N_PAGES), o = rnd(N_RANGES);
    if (rnd(4) && m->n[o])
        p = m->pg[o][rnd(m->n[o])]; /* mostly a page that is mapped */
    int want = !m->in_use[r] || model_is_free(m, p) ? -EINVAL : m->n[r] == MAX_P ? -ERANGE : 0;
    int rc = vmm_range_share(v, r, p);
    cr_assert_eq(rc, want, "step %lu share page %u into r %u", (unsigned long)step, p, r);
    if (rc == 0) {
        m->pg[r][m->n[r]++] = p;
        m->ref[p]++;
    }
}

static void step_cow(struct model *m, struct vmm *v, uint32_t r, uint64_t step) {
    uint32_t idx = rnd(MAX_P);
    if (!m->in_use[r] || idx >= m->n[r]) {
        cr_assert_eq(vmm_range_cow(v, r, idx), -EINVAL, "step %lu", (unsigned long)step);
        return;
    }
    uint32_t p = m->pg[r][idx];
    bool priv = m->ref[p] == 1 && !m->sealed[p];
    int want = priv ? 0 : model_free(m) == 0 ? -ENOSPC : 0;
    int rc = vmm_range_cow(v, r, idx);
    cr_assert_eq(rc, want, "step %lu cow r %u idx %u", (unsigned long)step, r, idx);
    if (rc || priv) {
        cr_assert_eq(vmm_range_page(v, r, idx), p);
        return;
    }
    uint32_t q = vmm_range_page(v, r, idx);
    cr_assert_eq(*page_word(v, r, idx), m->tag[p], "step %lu cow copied the bytes",
                 (unsigned long)step);
    model_unref(m, p);
    model_take(m, v, r, idx, q, step);
}

static void step_evict(struct model *m, struct vmm *v, uint64_t step) {
    uint32_t p = rnd(N_PAGES);
    for (uint32_t k = 0; k < N_PAGES && rnd(2); k++) /* prefer a cached page */
        if (m->ref[(p + k) % N_PAGES] == 0 && m->sealed[(p + k) % N_PAGES]) {
            p = (p + k) % N_PAGES;
            break;
        }
    int want = m->ref[p] ? -EBUSY : m->sealed[p] ? 0 : -EINVAL;
    int rc = vmm_page_evict(v, p);
    cr_assert_eq(rc, want, "step %lu evict %u", (unsigned long)step, p);
    if (rc == 0)
        m->sealed[p] = false;
}

static void step_one(struct model *m, struct vmm *v, uint64_t step) {
    uint32_t r = rnd(N_RANGES), op = rnd(100);
    if (op < 8) {
        uint32_t got;
        bool any = false;
        for (uint32_t k = 0; k < N_RANGES; k++)
            any |= !m->in_use[k];
        int rc = vmm_range_acquire(v, &got);
        cr_assert_eq(rc, any ? 0 : -EBUSY, "step %lu acquire", (unsigned long)step);
        if (rc == 0) {
            cr_assert(got < N_RANGES && !m->in_use[got] && m->n[got] == 0);
            m->in_use[got] = true;
        }
    } else if (op < 14) {
        int rc = vmm_range_release(v, r);
        cr_assert_eq(rc, m->in_use[r] ? 0 : -EINVAL, "step %lu release", (unsigned long)step);
        if (rc == 0) {
            for (; m->n[r]; m->n[r]--)
                model_unref(m, m->pg[r][m->n[r] - 1]);
            m->in_use[r] = false;
        }
    } else if (op < 44) {
        step_grow(m, v, r, step);
    } else if (op < 62) {
        step_shrink(m, v, r, step);
    } else if (op < 76) {
        step_share(m, v, r, step);
    } else if (op < 86) {
        step_cow(m, v, r, step);
    } else if (op < 89) {
        uint32_t p = rnd(N_PAGES);
        int rc = vmm_page_seal(v, p, p, 1);
        cr_assert_eq(rc, model_is_free(m, p) ? -EINVAL : 0, "step %lu seal", (unsigned long)step);
        if (rc == 0)
            m->sealed[p] = true;
    } else if (op < 94) {
        step_evict(m, v, step);
    } else {
        uint32_t k = rnd(4), room = m->in_use[r] ? MAX_P - m->n[r] : 0;
        uint32_t n = k < room ? k : room, nf = model_free(m);
        int want = !m->in_use[r] ? -EINVAL : n && !nf ? -ENOSPC : (int)(n < nf ? n : nf);
        int rc = vmm_range_map_ahead(v, r, k);
        cr_assert_eq(rc, want, "step %lu map_ahead %u", (unsigned long)step, k);
        for (int i = 0; i < rc; i++, m->n[r]++)
            model_take(m, v, r, m->n[r], vmm_range_page(v, r, m->n[r]), step);
    }
}

Test(vmm_stress, random_ops_match_the_reference_model, .timeout = 120) {
    static struct model m;
    struct vmm *v = vt_pool(N_PAGES, N_RANGES, MAX_P * TPP, false);
    cr_assert_eq(vmm_tokens_per_page(v), TPP);
    for (uint64_t step = 1; step <= N_STEPS; step++) {
        step_one(&m, v, step);
        if (step % 64 == 0)
            model_compare(&m, v, step, step % 256 == 0);
    }
    model_compare(&m, v, N_STEPS, true);
    struct vmm_stats s;
    vmm_stats_get(v, &s);
    cr_log_info("%d steps: %lu maps, %lu unmaps, %lu cows, %lu map-ahead pages", N_STEPS,
                (unsigned long)s.map_calls_total, (unsigned long)s.unmap_calls_total,
                (unsigned long)s.cow_total, (unsigned long)s.map_ahead_pages_total);
    cr_assert_gt(s.cow_total, 1000);
    for (uint32_t r = 0; r < N_RANGES; r++)
        if (m.in_use[r])
            cr_assert_eq(vmm_range_release(v, r), 0);
    for (uint32_t p = 0; p < N_PAGES; p++)
        if (m.sealed[p])
            cr_assert_eq(vmm_page_evict(v, p), 0, "page %u", p);
    vmm_stats_get(v, &s);
    cr_assert_eq(s.pages_free, N_PAGES, "every page free again");
    cr_assert_eq(s.ranges_in_use, 0);
    cr_assert(vmm_check(v));
    cr_assert_eq(vt_memfd_maps(), 1, "only the pool's own view maps the memfd");
    vmm_destroy(v);
    cr_assert_eq(vt_memfd_maps(), 0, "no mapping of the memfd remains");
}
