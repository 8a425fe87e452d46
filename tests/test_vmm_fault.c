/* Fault injection: every backend call of every vmm operation is made to fail
 * in turn (vmm_fault_inject), and the failed operation must leave the pool
 * exactly as it was: the counts, every range's n_mapped and page ids, the
 * mappings of the memfd, the bytes already written, and vmm_check. */
#include <errno.h>
#include <stdint.h>

#include "tests/lib/vmm_util.h"

#define N_RANGES 3

typedef int (*vt_op)(struct vmm *v, void *arg);

static uint8_t *tok(struct vmm *v, uint32_t r, uint32_t t) {
    return (uint8_t *)(vmm_range_base(v, r) + (uintptr_t)t * vmm_token_bytes(v));
}

/* Write a byte pattern of (range, idx) into every mapped page's first byte. */
static void tag_all(struct vmm *v) {
    for (uint32_t r = 0; r < N_RANGES; r++)
        for (uint32_t i = 0; i < vmm_range_n_mapped(v, r); i++)
            if (vmm_range_page(v, r, i) != VMM_PAGE_NONE)
                *tok(v, r, i * 64) = (uint8_t)(vmm_range_page(v, r, i) + 1);
}

static void tags_intact(struct vmm *v, const char *what, uint64_t nth) {
    for (uint32_t r = 0; r < N_RANGES; r++)
        for (uint32_t i = vmm_range_n_dropped(v, r); i < vmm_range_n_mapped(v, r); i++)
            cr_assert_eq(*tok(v, r, i * 64), (uint8_t)(vmm_range_page(v, r, i) + 1),
                         "%s nth %lu: range %u idx %u lost its bytes", what, (unsigned long)nth, r,
                         i);
}

/* Run op with the nth backend call failing, for nth = 1, 2, ... until it
 * succeeds; each failure must change nothing. Returns the number of calls
 * the operation makes (the first nth that did not fire). */
static uint64_t fail_each_call(struct vmm *v, vt_op op, void *arg, const char *what) {
    for (uint64_t nth = 1; nth < 64; nth++) {
        struct vt_snap before, after;
        vt_snap_take(v, &before, N_RANGES);
        int maps_before = vt_memfd_maps();
        vmm_fault_inject(v, nth);
        int rc = op(v, arg);
        vmm_fault_inject(v, 0);
        if (rc >= 0) {
            tag_all(v); /* new pages get their tags for the next operation */
            return nth;
        }
        cr_assert_eq(rc, -EIO, "%s nth %lu: rc %d", what, (unsigned long)nth, rc);
        vt_snap_take(v, &after, N_RANGES);
        vt_snap_expect_same(&before, &after, N_RANGES, what, nth);
        cr_assert_eq(after.s.backend_errors_total, before.s.backend_errors_total + 1);
        cr_assert_eq(vt_memfd_maps(), maps_before, "%s nth %lu: memfd mappings changed", what,
                     (unsigned long)nth);
        cr_assert(vmm_check(v), "%s nth %lu", what, (unsigned long)nth);
        tags_intact(v, what, nth);
    }
    cr_assert_fail("%s never succeeded", what);
    return 0;
}

/* Range 0: 2 pages; range 1 shares range 0's page 0 and has 1 own page;
 * range 2 acquired, empty. */
static struct vmm *setup(bool zero_pages) {
    struct vmm *v = vt_pool(16, N_RANGES, 64 * 8, zero_pages);
    uint32_t r;
    for (int i = 0; i < N_RANGES; i++)
        cr_assert_eq(vmm_range_acquire(v, &r), 0);
    cr_assert_eq(vmm_range_grow(v, 0, 128), 0);
    cr_assert_eq(vmm_range_share(v, 1, vmm_range_page(v, 0, 0)), 0);
    cr_assert_eq(vmm_range_grow(v, 1, 128), 0);
    tag_all(v);
    return v;
}

static int op_grow(struct vmm *v, void *arg) {
    (void)arg;
    return vmm_range_grow(v, 1, 64 * 6); /* 4 more pages */
}

static int op_grow_empty(struct vmm *v, void *arg) {
    (void)arg;
    return vmm_range_grow(v, 2, 64 * 5);
}

static int op_share(struct vmm *v, void *arg) {
    (void)arg;
    return vmm_range_share(v, 2, vmm_range_page(v, 0, 1));
}

static int op_cow(struct vmm *v, void *arg) {
    (void)arg;
    return vmm_range_cow(v, 1, 0);
}

static int op_map_ahead(struct vmm *v, void *arg) {
    (void)arg;
    return vmm_range_map_ahead(v, 0, 3);
}

static int op_shrink(struct vmm *v, void *arg) {
    (void)arg;
    return vmm_range_shrink(v, 1, 1);
}

static int op_drop_front(struct vmm *v, void *arg) {
    (void)arg;
    return vmm_range_drop_front(v, 1, 1); /* the page range 0 shares */
}

static int op_release(struct vmm *v, void *arg) {
    (void)arg;
    return vmm_range_release(v, 0);
}

Test(vmm_fault, grow_of_several_pages_is_all_or_nothing) {
    struct vmm *v = setup(false);
    cr_assert_eq(fail_each_call(v, op_grow, NULL, "grow"), 5, "4 maps, then success");
    cr_assert_eq(vmm_range_n_mapped(v, 1), 6);
    cr_assert_eq(fail_each_call(v, op_grow_empty, NULL, "grow empty"), 6);
    cr_assert(vmm_check(v));
    vmm_destroy(v);
}

Test(vmm_fault, grow_with_zeroing_is_all_or_nothing) {
    struct vmm *v = setup(true);
    cr_assert_eq(fail_each_call(v, op_grow, NULL, "grow zero"), 9, "4 x (zero + map)");
    cr_assert(vmm_check(v));
    vmm_destroy(v);
}

Test(vmm_fault, drop_front_is_all_or_nothing) {
    struct vmm *v = setup(false);
    cr_assert_eq(fail_each_call(v, op_drop_front, NULL, "drop front"), 2, "one unmap");
    cr_assert_eq(vmm_range_n_dropped(v, 1), 1);
    struct vmm_page_info pi;
    vmm_page_info(v, vmm_range_page(v, 0, 0), &pi);
    cr_assert_eq(pi.refcount, 1, "range 0 still maps it");
    cr_assert_eq(fail_each_call(v, op_release, NULL, "release after a drop"), 2);
    cr_assert(vmm_check(v));
    vmm_destroy(v);
}

Test(vmm_fault, share_is_all_or_nothing) {
    struct vmm *v = setup(false);
    cr_assert_eq(fail_each_call(v, op_share, NULL, "share"), 2);
    struct vmm_page_info pi;
    vmm_page_info(v, vmm_range_page(v, 0, 1), &pi);
    cr_assert_eq(pi.refcount, 2);
    vmm_destroy(v);
}

Test(vmm_fault, cow_is_all_or_nothing_and_keeps_the_original_mapped) {
    struct vmm *v = setup(false);
    uint32_t shared = vmm_range_page(v, 1, 0);
    memcpy(tok(v, 0, 1), "original", 9);
    cr_assert_eq(fail_each_call(v, op_cow, NULL, "cow"), 4, "copy, unmap, map");
    cr_assert_neq(vmm_range_page(v, 1, 0), shared);
    cr_assert_str_eq((char *)tok(v, 1, 1), "original", "copied bytes");
    memcpy(tok(v, 1, 1), "changed", 8);
    cr_assert_str_eq((char *)tok(v, 0, 1), "original", "the original is intact");
    cr_assert(vmm_check(v));
    vmm_destroy(v);
}

Test(vmm_fault, map_ahead_is_all_or_nothing) {
    struct vmm *v = setup(false);
    cr_assert_eq(fail_each_call(v, op_map_ahead, NULL, "map_ahead"), 4);
    cr_assert_eq(vmm_range_n_mapped(v, 0), 5);
    vmm_destroy(v);
}

Test(vmm_fault, shrink_and_release_are_all_or_nothing) {
    struct vmm *v = setup(false);
    cr_assert_eq(fail_each_call(v, op_shrink, NULL, "shrink"), 2, "one unmap call");
    cr_assert_eq(vmm_range_n_mapped(v, 1), 1);
    cr_assert_eq(fail_each_call(v, op_release, NULL, "release"), 2);
    cr_assert_eq(vmm_range_n_mapped(v, 0), 0);
    struct vmm_stats s;
    vmm_stats_get(v, &s);
    cr_assert_eq(s.ranges_in_use, 2);
    cr_assert(vmm_check(v));
    vmm_destroy(v);
}
