/* Tests of vmm's offload calls on the host backend: spill (begin, read, end)
 * and restore (restore, seal or abort). The oracle is the bytes: what a range
 * wrote is what a spill reads, and what a restore writes is what a range that
 * shares the restored page reads. vmm_check after every step. */
#include <errno.h>
#include <stdint.h>

#include "tests/lib/vmm_util.h"

#define PB 4096

static uint8_t *page_va(struct vmm *v, uint32_t r, uint32_t idx) {
    return (uint8_t *)(vmm_range_base(v, r) + (uintptr_t)idx * vmm_page_bytes(v));
}

/* Range 0 gets one page filled with `seed`-derived bytes, sealed, released:
 * the page is CACHED. Returns it. */
static uint32_t cached_page(struct vmm *v, uint8_t seed) {
    uint32_t r;
    cr_assert_eq(vmm_range_acquire(v, &r), 0);
    cr_assert_eq(vmm_range_grow(v, r, 1), 0);
    uint8_t *p = page_va(v, r, 0);
    for (int i = 0; i < PB; i++)
        p[i] = (uint8_t)(seed + i * 7);
    uint32_t page = vmm_range_page(v, r, 0);
    cr_assert_eq(vmm_page_seal(v, page, 5, 9), 0);
    cr_assert_eq(vmm_range_release(v, r), 0);
    struct vmm_page_info pi;
    cr_assert_eq(vmm_page_info(v, page, &pi), 0);
    cr_assert_eq(pi.state, VMM_PAGE_CACHED);
    return page;
}

static void expect_bytes(const uint8_t *p, uint8_t seed) {
    for (int i = 0; i < PB; i++)
        cr_assert_eq(p[i], (uint8_t)(seed + i * 7), "byte %d", i);
}

Test(vmm_offload, spill_reads_the_bytes_and_frees_the_page) {
    struct vmm *v = vt_pool(4, 2, 256, false);
    uint32_t page = cached_page(v, 3);
    static uint8_t buf[PB];
    cr_assert_eq(vmm_page_spill_begin(v, page), 0);
    cr_assert(vmm_check(v));
    struct vmm_stats s;
    vmm_stats_get(v, &s);
    cr_assert_eq(s.pages_spilling, 1);
    cr_assert_eq(s.pages_cached, 0);
    cr_assert_eq(vmm_page_read(v, page, buf), 0);
    expect_bytes(buf, 3);
    cr_assert_eq(vmm_page_spill_end(v, page, true), 0);
    cr_assert(vmm_check(v));
    vmm_stats_get(v, &s);
    cr_assert_eq(s.pages_free, 4);
    cr_assert_eq(s.pages_spilling, 0);
    cr_assert_eq(s.spills_total, 1);
    struct vmm_page_info pi;
    cr_assert_eq(vmm_page_info(v, page, &pi), 0);
    cr_assert_eq(pi.state, VMM_PAGE_FREE);
    cr_assert_eq(pi.hash_slot, VMM_PAGE_NONE, "unsealed");
    vmm_destroy(v);
}

Test(vmm_offload, a_spilling_page_refuses_share_pin_seal_evict) {
    struct vmm *v = vt_pool(4, 2, 256, false);
    uint32_t page = cached_page(v, 1), r;
    cr_assert_eq(vmm_page_spill_begin(v, page), 0);
    cr_assert_eq(vmm_range_acquire(v, &r), 0);
    cr_assert_eq(vmm_range_share(v, r, page), -EBUSY);
    cr_assert_eq(vmm_page_pin(v, page), -EINVAL);
    cr_assert_eq(vmm_page_seal(v, page, 1, 1), -EBUSY);
    cr_assert_eq(vmm_page_evict(v, page), -EINVAL);
    cr_assert_eq(vmm_page_spill_begin(v, page), -EINVAL, "already spilling");
    cr_assert(vmm_check(v));
    /* a failed spill puts it back in the cache, bytes intact */
    cr_assert_eq(vmm_page_spill_end(v, page, false), 0);
    cr_assert(vmm_check(v));
    cr_assert_eq(vmm_range_share(v, r, page), 0);
    expect_bytes(page_va(v, r, 0), 1);
    cr_assert_eq(vmm_range_release(v, r), 0);
    vmm_destroy(v);
}

Test(vmm_offload, spill_begin_refuses_mapped_pinned_free) {
    struct vmm *v = vt_pool(4, 2, 256, false);
    uint32_t page = cached_page(v, 2), r;
    cr_assert_eq(vmm_page_pin(v, page), 0);
    cr_assert_eq(vmm_page_spill_begin(v, page), -EBUSY, "pinned");
    vmm_page_unpin(v, page);
    cr_assert_eq(vmm_range_acquire(v, &r), 0);
    cr_assert_eq(vmm_range_share(v, r, page), 0);
    cr_assert_eq(vmm_page_spill_begin(v, page), -EBUSY, "mapped");
    cr_assert_eq(vmm_range_release(v, r), 0);
    uint32_t free_page = page == 0 ? 1 : 0;
    cr_assert_eq(vmm_page_spill_begin(v, free_page), -EINVAL, "free");
    cr_assert_eq(vmm_page_spill_begin(v, 99), -EINVAL, "out of range");
    cr_assert_eq(vmm_page_spill_end(v, page, true), -EINVAL, "not spilling");
    cr_assert(vmm_check(v));
    vmm_destroy(v);
}

Test(vmm_offload, restore_fills_a_free_page_that_seal_caches_and_a_range_reads) {
    struct vmm *v = vt_pool(2, 2, 256, false);
    static uint8_t src[PB];
    for (int i = 0; i < PB; i++)
        src[i] = (uint8_t)(11 + i * 7);
    uint32_t page, r;
    cr_assert_eq(vmm_page_restore(v, src, &page), 0);
    cr_assert(vmm_check(v));
    struct vmm_stats s;
    vmm_stats_get(v, &s);
    cr_assert_eq(s.pages_restoring, 1);
    cr_assert_eq(s.pages_free, 1);
    cr_assert_eq(s.restores_total, 1);
    /* invisible until sealed */
    cr_assert_eq(vmm_range_acquire(v, &r), 0);
    cr_assert_eq(vmm_range_share(v, r, page), -EBUSY);
    cr_assert_eq(vmm_page_evict(v, page), -EINVAL);
    cr_assert_eq(vmm_page_seal(v, page, 3, 4), 0);
    cr_assert(vmm_check(v));
    struct vmm_page_info pi;
    cr_assert_eq(vmm_page_info(v, page, &pi), 0);
    cr_assert_eq(pi.state, VMM_PAGE_CACHED);
    cr_assert_eq(pi.tenant, 4);
    cr_assert_eq(vmm_range_share(v, r, page), 0);
    expect_bytes(page_va(v, r, 0), 11);
    cr_assert_eq(vmm_range_release(v, r), 0);
    cr_assert_eq(vmm_page_evict(v, page), 0);
    cr_assert(vmm_check(v));
    vmm_destroy(v);
}

Test(vmm_offload, restore_without_a_free_page_and_abort) {
    struct vmm *v = vt_pool(2, 2, 256, false);
    static uint8_t src[PB];
    uint32_t a, b, c;
    cr_assert_eq(vmm_page_restore(v, src, &a), 0);
    cr_assert_eq(vmm_page_restore(v, src, &b), 0);
    cr_assert_neq(a, b);
    cr_assert_eq(vmm_page_restore(v, src, &c), -ENOSPC);
    cr_assert_eq(vmm_page_restore(v, NULL, &c), -EINVAL);
    cr_assert_eq(vmm_page_restore_abort(v, a), 0);
    cr_assert_eq(vmm_page_restore_abort(v, a), -EINVAL, "twice");
    cr_assert_eq(vmm_page_restore_abort(v, b), 0);
    cr_assert(vmm_check(v));
    struct vmm_stats s;
    vmm_stats_get(v, &s);
    cr_assert_eq(s.pages_free, 2);
    cr_assert_eq(s.pages_restoring, 0);
    vmm_destroy(v);
}

/* A failed backend copy changes nothing: the spill can be ended as failed
 * (page back to CACHED), the restore leaves the page free. */
Test(vmm_offload, backend_failures_leave_state_unchanged) {
    struct vmm *v = vt_pool(2, 2, 256, false);
    uint32_t page = cached_page(v, 5), got;
    static uint8_t buf[PB];
    cr_assert_eq(vmm_page_spill_begin(v, page), 0);
    vmm_fault_inject(v, 1);
    cr_assert_eq(vmm_page_read(v, page, buf), -EIO);
    cr_assert_eq(vmm_page_spill_end(v, page, false), 0);
    cr_assert(vmm_check(v));
    vmm_fault_inject(v, 1);
    cr_assert_eq(vmm_page_restore(v, buf, &got), -EIO);
    cr_assert(vmm_check(v));
    struct vmm_stats s;
    vmm_stats_get(v, &s);
    cr_assert_eq(s.pages_free, 1);
    cr_assert_eq(s.pages_cached, 1);
    cr_assert_eq(s.backend_errors_total, 2);
    vmm_destroy(v);
}

Test(vmm_offload, map_text_and_stats_show_the_states) {
    struct vmm *v = vt_pool(3, 2, 256, false);
    uint32_t page = cached_page(v, 9), rp;
    static uint8_t src[PB];
    cr_assert_eq(vmm_page_spill_begin(v, page), 0);
    cr_assert_eq(vmm_page_restore(v, src, &rp), 0);
    char map[64], info[2048];
    cr_assert_eq(vmm_pool_map_format(v, map, sizeof map), 0);
    cr_assert_eq(map[page], 'S', "%s", map);
    cr_assert_eq(map[rp], 'R', "%s", map);
    cr_assert_eq(vmm_stats_format(v, info, sizeof info), 0);
    cr_assert(strstr(info, "vmm_restores_total:1\n"), "%s", info);
    cr_assert_eq(vmm_page_spill_end(v, page, true), 0);
    cr_assert_eq(vmm_page_restore_abort(v, rp), 0);
    vmm_destroy(v);
}
