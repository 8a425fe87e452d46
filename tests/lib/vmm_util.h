/* vmm_util.h - helpers shared by the tests/test_vmm_*.c binaries:
 * a small host pool, and a snapshot of everything an all-or-nothing
 * operation must leave unchanged when it fails. Header-only (each test file
 * is its own binary). */
#ifndef LLMD_VMM_TEST_UTIL_H
#define LLMD_VMM_TEST_UTIL_H

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "mem.h"
#include "vmm/vmm.h"

/* A host pool of n_pages pages of 4 KiB (S = 64 B, 64 tokens a page). */
static inline struct vmm *vt_pool(uint32_t n_pages, uint32_t n_ranges, uint32_t max_tokens,
                                  bool zero_pages) {
    struct vmm_config cfg = {
        .huge = VMM_HUGE_OFF,
        .token_bytes = 64,
        .page_bytes = 4096,
        .n_pages = n_pages,
        .n_ranges = n_ranges,
        .max_tokens = max_tokens,
        .zero_pages = zero_pages,
    };
    struct vmm *v = NULL;
    char err[256];
    int rc = vmm_create(&cfg, &v, err, sizeof err);
    cr_assert_eq(rc, 0, "vmm_create: %d %s", rc, err);
    cr_assert(vmm_check(v));
    return v;
}

#define VT_MAX_RANGES 32
#define VT_MAX_IDX    64

/* Everything observable about the pool's layout. */
struct vt_snap {
    struct vmm_stats s;
    uint32_t n_mapped[VT_MAX_RANGES];
    uint32_t page[VT_MAX_RANGES][VT_MAX_IDX];
};

static inline void vt_snap_take(const struct vmm *v, struct vt_snap *sn, uint32_t n_ranges) {
    memset(sn, 0, sizeof *sn);
    vmm_stats_get(v, &sn->s);
    for (uint32_t r = 0; r < n_ranges && r < VT_MAX_RANGES; r++) {
        sn->n_mapped[r] = vmm_range_n_mapped(v, r);
        for (uint32_t i = 0; i < VT_MAX_IDX; i++)
            sn->page[r][i] = vmm_range_page(v, r, i);
    }
}

/* The layout and the gauges must match; counters of calls may differ. */
static inline void vt_snap_expect_same(const struct vt_snap *a, const struct vt_snap *b,
                                       uint32_t n_ranges, const char *what, uint64_t nth) {
    cr_assert_eq(a->s.pages_free, b->s.pages_free, "%s nth %lu: free %lu vs %lu", what,
                 (unsigned long)nth, (unsigned long)a->s.pages_free,
                 (unsigned long)b->s.pages_free);
    cr_assert_eq(a->s.pages_mapped, b->s.pages_mapped, "%s nth %lu: mapped", what,
                 (unsigned long)nth);
    cr_assert_eq(a->s.pages_cached, b->s.pages_cached, "%s nth %lu: cached", what,
                 (unsigned long)nth);
    cr_assert_eq(a->s.ranges_in_use, b->s.ranges_in_use, "%s nth %lu: ranges", what,
                 (unsigned long)nth);
    for (uint32_t r = 0; r < n_ranges && r < VT_MAX_RANGES; r++) {
        cr_assert_eq(a->n_mapped[r], b->n_mapped[r], "%s nth %lu: range %u n_mapped %u vs %u", what,
                     (unsigned long)nth, r, a->n_mapped[r], b->n_mapped[r]);
        for (uint32_t i = 0; i < VT_MAX_IDX; i++)
            cr_assert_eq(a->page[r][i], b->page[r][i], "%s nth %lu: range %u idx %u page %u vs %u",
                         what, (unsigned long)nth, r, i, a->page[r][i], b->page[r][i]);
    }
}

/* Lines of /proc/self/maps that name the pool's memfd. */
static inline int vt_memfd_maps(void) {
    FILE *f = fopen("/proc/self/maps", "r");
    cr_assert_not_null(f);
    char line[512];
    int n = 0;
    while (fgets(line, sizeof line, f))
        n += strstr(line, "memfd:llmd-vmm") != NULL;
    fclose(f);
    return n;
}

#endif /* LLMD_VMM_TEST_UTIL_H */
