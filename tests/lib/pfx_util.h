/* pfx_util.h - helpers shared by the tests/test_pfx_*.c binaries: a
 * host pool with a prefix cache on it, and the moves an engine makes around
 * the cache (map the hits, grow the rest, seal full pages). Header-only. */
#ifndef LLMD_PFX_TEST_UTIL_H
#define LLMD_PFX_TEST_UTIL_H

#include <errno.h>
#include <string.h>

#include "engine/core/pfx.h"
#include "tests/lib/vmm_util.h"

#define PT_TPP 64 /* vt_pool: 4 KiB pages of 64-byte tokens */

static inline void pt_config(struct pfx_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    for (int i = 0; i < PFX_KEY_BYTES; i++)
        cfg->secret[i] = (uint8_t)i;
    memset(cfg->model_fp, 0xa5, sizeof cfg->model_fp);
}

static inline struct pfx *pt_pfx(struct vmm *v, const struct pfx_config *cfg) {
    struct pfx *p = NULL;
    int rc = pfx_create(cfg, v, &p);
    cr_assert_eq(rc, 0, "pfx_create: %d", rc);
    cr_assert(pfx_check(p));
    return p;
}

/* One namespace scope over a NUL-terminated name. */
static inline struct pfx_ns pt_ns(const char *name) {
    return (struct pfx_ns){.bytes = name, .n_bytes = (uint32_t)strlen(name)};
}

/* Tokens of n pages: page i filled with 1000 * vals[i] + position. */
static inline void pt_tokens(int32_t *tok, const int *vals, uint32_t n_pages) {
    for (uint32_t i = 0; i < n_pages; i++)
        for (uint32_t t = 0; t < PT_TPP; t++)
            tok[i * PT_TPP + t] = 1000 * vals[i] + (int32_t)t;
}

static inline void pt_chain(const struct pfx *p, const struct pfx_ns *ns, uint32_t n_ns,
                            const int32_t *tok, uint32_t n_pages, struct pfx_hash *h) {
    uint32_t n = 0;
    int rc = pfx_chain(p, ns, n_ns, tok, n_pages * PT_TPP, h, &n);
    cr_assert_eq(rc, 0, "pfx_chain: %d", rc);
    cr_assert_eq(n, n_pages);
}

static inline uint8_t *pt_page_va(struct vmm *v, uint32_t r, uint32_t idx) {
    return (uint8_t *)(vmm_range_base(v, r) + (uintptr_t)idx * vmm_page_bytes(v));
}

/* What the engine does for a new sequence of n_pages full pages: acquire a
 * range, map the cached prefix, grow the rest, write each new page's bytes
 * (derived from its hash) and insert it. Returns the range; *hits gets the
 * cached prefix length. Every insert must succeed. */
static inline uint32_t pt_seq(struct vmm *v, struct pfx *p, const struct pfx_hash *h,
                              uint32_t n_pages, uint32_t tenant, uint8_t prio, uint32_t *hits) {
    uint32_t r, pages[64];
    cr_assert_eq(vmm_range_acquire(v, &r), 0);
    uint32_t k = pfx_lookup(p, h, n_pages, pages);
    for (uint32_t i = 0; i < k; i++)
        cr_assert_eq(vmm_range_share(v, r, pages[i]), 0, "share %u", i);
    cr_assert_eq(vmm_range_grow(v, r, n_pages * PT_TPP), 0);
    for (uint32_t i = k; i < n_pages; i++) {
        memset(pt_page_va(v, r, i), h[i].b[0], vmm_page_bytes(v));
        int rc = pfx_insert(p, &h[i], vmm_range_page(v, r, i), tenant, prio);
        cr_assert_eq(rc, 0, "insert page idx %u: %d", i, rc);
    }
    cr_assert(pfx_check(p));
    if (hits)
        *hits = k;
    return r;
}

static inline enum vmm_page_state pt_state(struct vmm *v, uint32_t page) {
    struct vmm_page_info vi;
    cr_assert_eq(vmm_page_info(v, page, &vi), 0);
    return vi.state;
}

#endif /* LLMD_PFX_TEST_UTIL_H */
