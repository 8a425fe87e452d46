/* Tests of vmm/ on the host backend: geometry, ranges, sharing, copy-on-write,
 * seal/evict, errors, stats and the text map. Pools are tiny (4 KiB pages,
 * 64 tokens a page) so each test takes milliseconds. */
#include <errno.h>
#include <stdint.h>

#include "tests/lib/vmm_util.h"

static uint8_t *tok(struct vmm *v, uint32_t r, uint32_t t) {
    return (uint8_t *)(vmm_range_base(v, r) + (uintptr_t)t * vmm_token_bytes(v));
}

Test(vmm_geometry, page_rounds_up_to_token_and_granularity) {
    /* stories260K: S = 1280 B; 4 KiB becomes lcm(4096, 1280) = 20 KiB = 16 tokens. */
    struct vmm_config cfg = {.huge = VMM_HUGE_OFF,
                             .token_bytes = 1280,
                             .page_bytes = 4096,
                             .n_pages = 4,
                             .n_ranges = 2,
                             .max_tokens = 100};
    struct vmm *v;
    char err[256];
    cr_assert_eq(vmm_create(&cfg, &v, err, sizeof err), 0, "%s", err);
    cr_assert_eq(vmm_page_bytes(v), 20480, "P %zu", vmm_page_bytes(v));
    cr_assert_eq(vmm_tokens_per_page(v), 16);
    cr_assert_eq(vmm_token_bytes(v), 1280);
    cr_assert_eq(vmm_range_max_pages(v), 7, "ceil(100 / 16)");
    cr_assert_str_eq(vmm_backend_name(v), "host");
    vmm_destroy(v);
}

Test(vmm_geometry, token_bytes_padded_to_64_and_page_zero_means_smallest) {
    struct vmm_config cfg = {.huge = VMM_HUGE_OFF,
                             .token_bytes = 100,
                             .budget_bytes = 1 << 20,
                             .n_ranges = 1,
                             .max_tokens = 10000};
    struct vmm *v;
    cr_assert_eq(vmm_create(&cfg, &v, NULL, 0), 0);
    cr_assert_eq(vmm_token_bytes(v), 128);
    cr_assert_eq(vmm_page_bytes(v), 4096);
    cr_assert_eq(vmm_n_pages(v), 256, "budget / P: %u", vmm_n_pages(v));
    vmm_destroy(v);
}

/* 1 MiB of budget for one range of 10 tokens (one 4 KiB page): the pool
 * gets the one page the range can use, not 256 nobody can map. */
Test(vmm_geometry, budget_beyond_what_ranges_can_map_is_capped) {
    struct vmm_config cfg = {.huge = VMM_HUGE_OFF,
                             .token_bytes = 100,
                             .budget_bytes = 1 << 20,
                             .n_ranges = 3,
                             .max_tokens = 10};
    struct vmm *v;
    cr_assert_eq(vmm_create(&cfg, &v, NULL, 0), 0);
    cr_assert_eq(vmm_n_pages(v), 3, "3 ranges x 1 page: %u", vmm_n_pages(v));
    vmm_destroy(v);
    cfg.n_pages = 40; /* an explicit count is taken as it is */
    cr_assert_eq(vmm_create(&cfg, &v, NULL, 0), 0);
    cr_assert_eq(vmm_n_pages(v), 40);
    vmm_destroy(v);
}

Test(vmm_geometry, bad_config_is_refused_with_a_reason) {
    struct vmm_config cfg = {
        .huge = VMM_HUGE_OFF, .token_bytes = 0, .n_ranges = 1, .max_tokens = 1};
    struct vmm *v = NULL;
    char err[256] = "";
    cr_assert_eq(vmm_create(&cfg, &v, err, sizeof err), -EINVAL);
    cr_assert_null(v);
    cr_assert(strstr(err, "token_bytes") != NULL, "%s", err);
}

Test(vmm_geometry, max_map_count_overflow_is_refused) {
    /* 70,000 pages in one range could need 70,001 VMAs: more than 65530. */
    struct vmm_config cfg = {.huge = VMM_HUGE_OFF,
                             .token_bytes = 64,
                             .page_bytes = 4096,
                             .n_pages = 4,
                             .n_ranges = 1,
                             .max_tokens = 64 * 70000};
    struct vmm *v = NULL;
    char err[512] = "";
    int rc = vmm_create(&cfg, &v, err, sizeof err);
    cr_assert_eq(rc, -ENOMEM, "rc %d: %s", rc, err);
    cr_assert(strstr(err, "vm.max_map_count") && strstr(err, "bigger page size"), "%s", err);
    cr_log_info("refusal: %s", err);
}

/* A page larger than a whole range is capped: 10 tokens of 1280 B need
 * 12800 B, so a 1 GiB request becomes 20 KiB (whole tokens, whole 4 KiB). */
Test(vmm_geometry, page_beyond_max_tokens_is_capped) {
    struct vmm_config cfg = {.huge = VMM_HUGE_OFF,
                             .token_bytes = 1280,
                             .page_bytes = (size_t)1 << 30,
                             .n_pages = 2,
                             .n_ranges = 1,
                             .max_tokens = 10};
    struct vmm *v;
    char err[256] = "";
    cr_assert_eq(vmm_create(&cfg, &v, err, sizeof err), 0, "%s", err);
    cr_assert_eq(vmm_page_bytes(v), 20480, "P %zu", vmm_page_bytes(v));
    vmm_destroy(v);
    /* regress: a request less than a token over the range (16 tokens: 20480 B)
     * escaped the cap (20481 / 1280 is 16, not > 16) and became 40 KiB */
    cfg.max_tokens = 16;
    cfg.page_bytes = 20481;
    cr_assert_eq(vmm_create(&cfg, &v, err, sizeof err), 0, "%s", err);
    cr_assert_eq(vmm_page_bytes(v), 20480, "P %zu", vmm_page_bytes(v));
    vmm_destroy(v);
    cfg.page_bytes = 20480;
    cr_assert_eq(vmm_create(&cfg, &v, err, sizeof err), 0, "%s", err);
    cr_assert_eq(vmm_page_bytes(v), 20480, "P %zu", vmm_page_bytes(v));
    vmm_destroy(v);
}

/* A pool bigger than the machine's memory (here: 1 TiB when every range is
 * provisioned fully) is refused up front, not left to the OOM killer. */
Test(vmm_geometry, pool_larger_than_memory_is_refused) {
    struct vmm_config cfg = {.huge = VMM_HUGE_OFF,
                             .token_bytes = 1 << 20,
                             .page_bytes = 64 << 20,
                             .n_ranges = 16,
                             .max_tokens = 65536};
    struct vmm *v = NULL;
    char err[512] = "";
    int rc = vmm_create(&cfg, &v, err, sizeof err);
    cr_assert_eq(rc, -ENOMEM, "rc %d: %s", rc, err);
    cr_assert_null(v);
    cr_assert(strstr(err, "available memory"), "%s", err);
}

Test(vmm_geometry, huge_on_fails_clearly_or_uses_huge_pages) {
    struct vmm_config cfg = {
        .huge = VMM_HUGE_ON, .token_bytes = 64, .n_pages = 1, .n_ranges = 1, .max_tokens = 1};
    struct vmm *v = NULL;
    char err[512] = "";
    int rc = vmm_create(&cfg, &v, err, sizeof err);
    if (rc == 0) {
        cr_assert(vmm_page_bytes(v) >= (2u << 20), "P %zu", vmm_page_bytes(v));
        vmm_destroy(v);
    } else {
        cr_assert(rc == -ENOTSUP || rc == -ENOMEM, "rc %d", rc);
        cr_assert(strstr(err, "huge") != NULL, "%s", err);
    }
}

Test(vmm_range, acquire_until_busy_then_release_frees_slot) {
    struct vmm *v = vt_pool(4, 3, 256, false);
    uint32_t r[4];
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(vmm_range_acquire(v, &r[i]), 0);
        cr_assert_eq(r[i], (uint32_t)i, "slot %u", r[i]);
    }
    cr_assert_eq(vmm_range_acquire(v, &r[3]), -EBUSY);
    cr_assert_eq(vmm_range_release(v, 1), 0);
    cr_assert_eq(vmm_range_release(v, 1), -EINVAL, "double release");
    cr_assert_eq(vmm_range_acquire(v, &r[3]), 0);
    cr_assert_eq(r[3], 1);
    cr_assert(vmm_check(v));
    vmm_destroy(v);
}

Test(vmm_range, grow_maps_prefix_and_bytes_are_writable) {
    struct vmm *v = vt_pool(8, 2, 512, false);
    uint32_t r;
    cr_assert_eq(vmm_range_acquire(v, &r), 0);
    cr_assert_eq(vmm_range_grow(v, r, 1), 0);
    cr_assert_eq(vmm_range_n_mapped(v, r), 1);
    cr_assert_eq(vmm_range_capacity(v, r), 64);
    cr_assert_eq(vmm_range_grow(v, r, 64), 0, "still one page");
    cr_assert_eq(vmm_range_n_mapped(v, r), 1);
    cr_assert_eq(vmm_range_grow(v, r, 200), 0);
    cr_assert_eq(vmm_range_n_mapped(v, r), 4);
    cr_assert(vmm_check(v));
    for (uint32_t t = 0; t < 256; t++)
        memset(tok(v, r, t), (int)t, 64);
    for (uint32_t t = 0; t < 256; t++)
        cr_assert_eq(tok(v, r, t)[63], (uint8_t)t, "token %u", t);
    for (uint32_t i = 0; i < 4; i++)
        cr_assert_neq(vmm_range_page(v, r, i), VMM_PAGE_NONE, "idx %u", i);
    cr_assert_eq(vmm_range_page(v, r, 4), VMM_PAGE_NONE);
    struct vmm_stats s;
    vmm_stats_get(v, &s);
    cr_assert_eq(s.pages_free, 4);
    cr_assert_eq(s.pages_mapped, 4);
    cr_assert_eq(s.map_calls_total, 4);
    cr_assert_eq(s.grow_waited_total, 2);
    vmm_destroy(v);
}

Test(vmm_range, errors_enospc_erange_einval_leave_pool_unchanged) {
    struct vmm *v = vt_pool(3, 2, 512, false);
    uint32_t r;
    cr_assert_eq(vmm_range_grow(v, 0, 1), -EINVAL, "not acquired");
    cr_assert_eq(vmm_range_acquire(v, &r), 0);
    cr_assert_eq(vmm_range_grow(v, r, 513), -ERANGE);
    cr_assert_eq(vmm_range_grow(v, r, 64 * 4), -ENOSPC, "4 pages of 3");
    cr_assert_eq(vmm_range_n_mapped(v, r), 0, "all or nothing");
    cr_assert_eq(vmm_range_grow(v, r, 64 * 3), 0);
    cr_assert_eq(vmm_range_grow(v, r, 64 * 3 + 1), -ENOSPC);
    cr_assert_eq(vmm_range_n_mapped(v, r), 3);
    cr_assert_eq(vmm_range_shrink(v, r, 513), -ERANGE);
    cr_assert_eq(vmm_range_cow(v, r, 3), -EINVAL);
    cr_assert_eq(vmm_range_share(v, r, 99), -EINVAL);
    cr_assert(vmm_check(v));
    vmm_destroy(v);
}

Test(vmm_range, shrink_unmaps_only_whole_pages_past_the_end) {
    struct vmm *v = vt_pool(8, 1, 512, false);
    uint32_t r;
    cr_assert_eq(vmm_range_acquire(v, &r), 0);
    cr_assert_eq(vmm_range_grow(v, r, 64 * 4), 0);
    cr_assert_eq(vmm_range_shrink(v, r, 65), 0);
    cr_assert_eq(vmm_range_n_mapped(v, r), 2, "token 64 lives on page 1");
    cr_assert_eq(vmm_range_shrink(v, r, 128), 0);
    cr_assert_eq(vmm_range_n_mapped(v, r), 2);
    cr_assert_eq(vmm_range_shrink(v, r, 0), 0);
    cr_assert_eq(vmm_range_n_mapped(v, r), 0);
    struct vmm_stats s;
    vmm_stats_get(v, &s);
    cr_assert_eq(s.pages_free, 8);
    cr_assert_eq(s.unmap_calls_total, 2, "one call per shrink that unmapped");
    cr_assert(vmm_check(v));
    vmm_destroy(v);
}

/* A sliding window's front: the oldest pages go (a sealed one to CACHED),
 * the extent and addresses stay, the rest reads as written, grow goes on
 * from the extent, and nothing may touch the dropped indices. */
Test(vmm_range, drop_front_unmaps_the_oldest_pages_and_keeps_the_extent) {
    struct vmm *v = vt_pool(12, 1, 64 * 12, false);
    uint32_t r;
    cr_assert_eq(vmm_range_acquire(v, &r), 0);
    cr_assert_eq(vmm_range_grow(v, r, 64 * 6), 0);
    for (uint32_t i = 0; i < 6; i++)
        memset(tok(v, r, i * 64), 'a' + (int)i, 64);
    uint32_t p0 = vmm_range_page(v, r, 0), p1 = vmm_range_page(v, r, 1);
    cr_assert_eq(vmm_page_seal(v, p0, 7, 0), 0);
    uintptr_t base = vmm_range_base(v, r);
    cr_assert_eq(vmm_range_drop_front(v, r, 3), 0);
    cr_assert(vmm_check(v));
    cr_assert_eq(vmm_range_n_mapped(v, r), 6, "the extent stays");
    cr_assert_eq(vmm_range_n_dropped(v, r), 3);
    cr_assert_eq(vmm_range_base(v, r), base);
    for (uint32_t i = 0; i < 3; i++)
        cr_assert_eq(vmm_range_page(v, r, i), VMM_PAGE_NONE);
    struct vmm_page_info pi;
    vmm_page_info(v, p0, &pi);
    cr_assert_eq(pi.state, VMM_PAGE_CACHED, "sealed: kept for the prefix cache");
    vmm_page_info(v, p1, &pi);
    cr_assert_eq(pi.state, VMM_PAGE_FREE);
    struct vmm_stats s;
    vmm_stats_get(v, &s);
    cr_assert_eq(s.pages_free, 12 - 6 + 2);
    cr_assert_eq(s.pages_cached, 1);
    cr_assert_eq(s.range_pages_mapped, 3);
    cr_assert_eq(s.dropped_front_total, 3);
    for (uint32_t i = 3; i < 6; i++)
        cr_assert_eq(tok(v, r, i * 64)[63], 'a' + (int)i, "page %u lost its bytes", i);
    /* the front is out of bounds for everything that writes */
    cr_assert_eq(vmm_range_cow(v, r, 2), -EINVAL);
    cr_assert_eq(vmm_range_shrink(v, r, 64 * 2), -EINVAL);
    cr_assert_eq(vmm_range_drop_front(v, r, 7), -EINVAL, "past the extent");
    cr_assert_eq(vmm_range_drop_front(v, r, 2), 0, "behind the front: nothing");
    cr_assert_eq(vmm_range_n_dropped(v, r), 3);
    /* decode goes on: grow from the extent, then drop more */
    cr_assert_eq(vmm_range_grow(v, r, 64 * 9), 0);
    cr_assert_eq(vmm_range_n_mapped(v, r), 9);
    cr_assert_eq(vmm_range_drop_front(v, r, 6), 0);
    cr_assert(vmm_check(v));
    vmm_stats_get(v, &s);
    cr_assert_eq(s.range_pages_mapped, 3);
    cr_assert_eq(vmm_range_shrink(v, r, 64 * 7), 0, "rollback past the front is fine");
    cr_assert_eq(vmm_range_n_mapped(v, r), 7);
    cr_assert_eq(vmm_range_release(v, r), 0);
    vmm_stats_get(v, &s);
    cr_assert_eq(s.pages_free, 11);
    cr_assert_eq(s.pages_cached, 1);
    cr_assert(vmm_check(v));
    cr_assert_eq(vmm_range_acquire(v, &r), 0);
    cr_assert_eq(vmm_range_n_dropped(v, r), 0, "a new user starts at 0");
    vmm_destroy(v);
}

Test(vmm_range, shrink_then_grow_gives_stale_page_without_zeroing) {
    struct vmm *v = vt_pool(4, 1, 512, false);
    uint32_t r;
    cr_assert_eq(vmm_range_acquire(v, &r), 0);
    cr_assert_eq(vmm_range_grow(v, r, 1), 0);
    uint32_t p = vmm_range_page(v, r, 0);
    memset(tok(v, r, 0), 0xAB, 4096);
    cr_assert_eq(vmm_range_shrink(v, r, 0), 0);
    cr_assert_eq(vmm_range_grow(v, r, 1), 0);
    cr_assert_eq(vmm_range_page(v, r, 0), p, "LIFO free list gives the same page back");
    cr_assert_eq(tok(v, r, 0)[4095], 0xAB, "stale contents with zero_pages off");
    vmm_destroy(v);
}

Test(vmm_range, shrink_then_grow_gives_zeroed_page_with_zero_pages) {
    struct vmm *v = vt_pool(4, 1, 512, true);
    uint32_t r;
    cr_assert_eq(vmm_range_acquire(v, &r), 0);
    cr_assert_eq(vmm_range_grow(v, r, 1), 0);
    memset(tok(v, r, 0), 0xAB, 4096);
    cr_assert_eq(vmm_range_shrink(v, r, 0), 0);
    cr_assert_eq(vmm_range_grow(v, r, 1), 0);
    for (uint32_t i = 0; i < 4096; i++)
        cr_assert_eq(tok(v, r, 0)[i], 0, "byte %u", i);
    cr_assert_eq(vmm_n_pages(v), 4, "the zero page is not part of the pool");
    vmm_destroy(v);
}

Test(vmm_share, write_through_one_range_reads_through_another) {
    struct vmm *v = vt_pool(4, 2, 512, false);
    uint32_t a, b;
    cr_assert_eq(vmm_range_acquire(v, &a), 0);
    cr_assert_eq(vmm_range_acquire(v, &b), 0);
    cr_assert_eq(vmm_range_grow(v, a, 64), 0);
    uint32_t p = vmm_range_page(v, a, 0);
    cr_assert_eq(vmm_range_share(v, b, p), 0);
    cr_assert_eq(vmm_range_page(v, b, 0), p);
    memcpy(tok(v, a, 5), "shared!", 8);
    cr_assert_str_eq((char *)tok(v, b, 5), "shared!");
    struct vmm_page_info pi;
    cr_assert_eq(vmm_page_info(v, p, &pi), 0);
    cr_assert_eq(pi.refcount, 2);
    cr_assert_eq(pi.state, VMM_PAGE_MAPPED);
    cr_assert_neq(pi.last_use_ns, 0);
    uint32_t owners[4];
    cr_assert_eq(vmm_page_owners(v, p, owners, 4), 2);
    cr_assert_eq(owners[0], a);
    cr_assert_eq(owners[1], b);
    cr_assert_eq(vmm_page_owners(v, p, owners, 1), 2, "count even past max");
    cr_assert(vmm_check(v));
    cr_assert_eq(vmm_range_release(v, a), 0);
    cr_assert_eq(vmm_page_info(v, p, &pi), 0);
    cr_assert_eq(pi.refcount, 1);
    cr_assert_str_eq((char *)tok(v, b, 5), "shared!", "b keeps the page");
    cr_assert(vmm_check(v));
    vmm_destroy(v);
}

Test(vmm_share, free_page_and_full_range_are_refused) {
    struct vmm *v = vt_pool(4, 2, 64, false);
    uint32_t a, b;
    cr_assert_eq(vmm_range_acquire(v, &a), 0);
    cr_assert_eq(vmm_range_acquire(v, &b), 0);
    cr_assert_eq(vmm_range_share(v, b, 3), -EINVAL, "page 3 is free");
    cr_assert_eq(vmm_range_grow(v, a, 1), 0);
    cr_assert_eq(vmm_range_grow(v, b, 1), 0);
    cr_assert_eq(vmm_range_share(v, b, vmm_range_page(v, a, 0)), -ERANGE, "b holds 1 page");
    cr_assert(vmm_check(v));
    vmm_destroy(v);
}

Test(vmm_cow, copy_leaves_original_intact) {
    struct vmm *v = vt_pool(4, 2, 512, false);
    uint32_t a, b;
    cr_assert_eq(vmm_range_acquire(v, &a), 0);
    cr_assert_eq(vmm_range_acquire(v, &b), 0);
    cr_assert_eq(vmm_range_grow(v, a, 64), 0);
    uint32_t p = vmm_range_page(v, a, 0);
    for (uint32_t i = 0; i < 4096; i++)
        tok(v, a, 0)[i] = (uint8_t)(i * 7);
    cr_assert_eq(vmm_range_share(v, b, p), 0);
    cr_assert_eq(vmm_range_cow(v, b, 0), 0);
    uint32_t q = vmm_range_page(v, b, 0);
    cr_assert_neq(q, p, "b got a private copy");
    for (uint32_t i = 0; i < 4096; i++)
        cr_assert_eq(tok(v, b, 0)[i], (uint8_t)(i * 7), "copied byte %u", i);
    memset(tok(v, b, 0), 0x55, 4096);
    for (uint32_t i = 0; i < 4096; i++)
        cr_assert_eq(tok(v, a, 0)[i], (uint8_t)(i * 7), "original byte %u", i);
    struct vmm_page_info pi;
    vmm_page_info(v, p, &pi);
    cr_assert_eq(pi.refcount, 1);
    cr_assert_eq(vmm_range_cow(v, a, 0), 0, "private: no-op");
    cr_assert_eq(vmm_range_page(v, a, 0), p);
    struct vmm_stats s;
    vmm_stats_get(v, &s);
    cr_assert_eq(s.cow_total, 1);
    cr_assert(vmm_check(v));
    vmm_destroy(v);
}

Test(vmm_seal, sealed_page_is_cached_at_zero_then_shared_and_evicted) {
    struct vmm *v = vt_pool(4, 2, 512, false);
    uint32_t a, b;
    cr_assert_eq(vmm_range_acquire(v, &a), 0);
    cr_assert_eq(vmm_range_grow(v, a, 64), 0);
    uint32_t p = vmm_range_page(v, a, 0);
    memcpy(tok(v, a, 0), "prefix", 7);
    cr_assert_eq(vmm_page_seal(v, p, 42, 7), 0);
    cr_assert_eq(vmm_page_evict(v, p), -EBUSY, "still mapped");
    cr_assert_eq(vmm_range_release(v, a), 0);
    struct vmm_page_info pi;
    vmm_page_info(v, p, &pi);
    cr_assert_eq(pi.state, VMM_PAGE_CACHED);
    cr_assert_eq(pi.hash_slot, 42);
    cr_assert_eq(pi.tenant, 7);
    struct vmm_stats s;
    vmm_stats_get(v, &s);
    cr_assert_eq(s.pages_cached, 1);
    cr_assert_eq(s.pages_free, 3);
    cr_assert(vmm_check(v));
    cr_assert_eq(vmm_range_acquire(v, &b), 0);
    cr_assert_eq(vmm_range_share(v, b, p), 0);
    cr_assert_str_eq((char *)tok(v, b, 0), "prefix");
    cr_assert_eq(vmm_range_cow(v, b, 0), 0, "sealed, refcount 1: still copied");
    cr_assert_neq(vmm_range_page(v, b, 0), p);
    vmm_page_info(v, p, &pi);
    cr_assert_eq(pi.state, VMM_PAGE_CACHED, "back to the cache");
    cr_assert_eq(vmm_page_evict(v, p), 0);
    vmm_page_info(v, p, &pi);
    cr_assert_eq(pi.state, VMM_PAGE_FREE);
    cr_assert_eq(pi.hash_slot, VMM_PAGE_NONE);
    cr_assert_eq(vmm_page_evict(v, p), -EINVAL, "not cached");
    cr_assert_eq(vmm_page_seal(v, p, 1, 1), -EINVAL, "free pages cannot be sealed");
    cr_assert(vmm_check(v));
    vmm_destroy(v);
}

/* A pin keeps a CACHED page from eviction without mapping it: what a
 * waiting request holds on the prefix-cache pages it was promised. */
Test(vmm_seal, pinned_cached_page_is_not_evicted_until_unpinned) {
    struct vmm *v = vt_pool(4, 2, 512, false);
    uint32_t a;
    cr_assert_eq(vmm_range_acquire(v, &a), 0);
    cr_assert_eq(vmm_range_grow(v, a, 16), 0);
    uint32_t p = vmm_range_page(v, a, 0);
    cr_assert_eq(vmm_page_seal(v, p, 3, 1), 0);
    cr_assert_eq(vmm_page_pin(v, p), 0, "a mapped page can be pinned");
    cr_assert_eq(vmm_range_release(v, a), 0);
    struct vmm_page_info pi;
    vmm_page_info(v, p, &pi);
    cr_assert_eq(pi.state, VMM_PAGE_CACHED);
    cr_assert_eq(pi.refcount, 0, "pins are not mappings");
    cr_assert_eq(vmm_page_pin(v, p), 0, "and a cached one");
    vmm_page_unpin(v, p);
    cr_assert_eq(vmm_page_evict(v, p), -EBUSY, "one pin left");
    cr_assert(vmm_check(v));
    vmm_page_unpin(v, p);
    cr_assert_eq(vmm_page_evict(v, p), 0);
    cr_assert_eq(vmm_page_pin(v, p), -EINVAL, "a free page cannot be pinned");
    cr_assert(vmm_check(v));
    vmm_destroy(v);
}

Test(vmm_map_ahead, maps_past_extent_and_grow_finds_pages) {
    struct vmm *v = vt_pool(6, 2, 64 * 4, false);
    uint32_t r, r2;
    cr_assert_eq(vmm_range_acquire(v, &r), 0);
    cr_assert_eq(vmm_range_map_ahead(v, r, 2), 2);
    cr_assert_eq(vmm_range_grow(v, r, 100), 0);
    struct vmm_stats s;
    vmm_stats_get(v, &s);
    cr_assert_eq(s.grow_waited_total, 0, "pages were mapped ahead");
    cr_assert_eq(s.map_ahead_pages_total, 2);
    cr_assert_eq(vmm_range_map_ahead(v, r, 10), 2, "range holds 4 pages");
    cr_assert_eq(vmm_range_map_ahead(v, r, 10), 0, "full");
    cr_assert_eq(vmm_range_acquire(v, &r2), 0);
    cr_assert_eq(vmm_range_map_ahead(v, r2, 5), 2, "pool has 2 left");
    cr_assert_eq(vmm_range_map_ahead(v, r2, 1), -ENOSPC);
    cr_assert_eq(vmm_range_map_ahead(v, 7, 1), -EINVAL);
    cr_assert(vmm_check(v));
    vmm_destroy(v);
}

Test(vmm_text, stats_format_exact) {
    struct vmm *v = vt_pool(4, 2, 128, false);
    uint32_t a, b;
    cr_assert_eq(vmm_range_acquire(v, &a), 0);
    cr_assert_eq(vmm_range_acquire(v, &b), 0);
    cr_assert_eq(vmm_range_grow(v, a, 128), 0);
    cr_assert_eq(vmm_range_share(v, b, vmm_range_page(v, a, 0)), 0);
    char buf[1024];
    cr_assert_eq(vmm_stats_format(v, buf, sizeof buf), 0);
    cr_assert_str_eq(buf, "# vmm\n"
                          "vmm_backend:host\n"
                          "vmm_pages:4\n"
                          "vmm_pages_free:2\n"
                          "vmm_pages_mapped:2\n"
                          "vmm_pages_cached:0\n"
                          "vmm_ranges:2\n"
                          "vmm_ranges_in_use:2\n"
                          "vmm_page_bytes:4096\n"
                          "vmm_token_bytes:64\n"
                          "vmm_va_reserved_bytes:24576\n"
                          "vmm_map_calls_total:3\n"
                          "vmm_unmap_calls_total:0\n"
                          "vmm_cow_total:0\n"
                          "vmm_dropped_front_total:0\n"
                          "vmm_map_ahead_pages_total:0\n"
                          "vmm_grow_waited_total:1\n"
                          "vmm_backend_errors_total:0\n"
                          "vmm_spills_total:0\n"
                          "vmm_restores_total:0\n");
    cr_assert_eq(vmm_stats_format(v, buf, 10), -ENOSPC);
    cr_assert_eq(strlen(buf), 9, "truncated and terminated");
    vmm_destroy(v);
}

Test(vmm_text, pool_map_format_exact) {
    struct vmm *v = vt_pool(70, 12, 64 * 2, false);
    uint32_t r[12];
    for (int i = 0; i < 12; i++)
        cr_assert_eq(vmm_range_acquire(v, &r[i]), 0);
    cr_assert_eq(vmm_range_grow(v, r[0], 128), 0); /* pages 0, 1 */
    uint32_t p0 = vmm_range_page(v, r[0], 0), p1 = vmm_range_page(v, r[0], 1);
    cr_assert_eq(p0, 0);
    cr_assert_eq(p1, 1);
    cr_assert_eq(vmm_range_share(v, r[1], p1), 0); /* page 1 shared by 2 */
    for (int i = 1; i < 11; i++)
        cr_assert_eq(vmm_range_share(v, r[i], p0), 0); /* page 0 by 11 */
    cr_assert_eq(vmm_range_grow(v, r[11], 64), 0);     /* page 2 */
    cr_assert_eq(vmm_page_seal(v, 2, 0, 0), 0);
    cr_assert_eq(vmm_range_release(v, r[11]), 0); /* page 2 cached */
    char buf[256];
    cr_assert_eq(vmm_pool_map_format(v, buf, sizeof buf), 0);
    cr_assert_str_eq(buf, "+2C.............................................................\n"
                          "......\n");
    cr_assert_eq(vmm_pool_map_format(v, buf, 8), -ENOSPC);
    cr_assert_str_eq(buf, "+2C....");
    cr_assert(vmm_check(v));
    vmm_destroy(v);
}

Test(vmm_lifecycle, destroy_unmaps_everything_and_null_is_ok) {
    vmm_destroy(NULL);
    uint64_t held = mem_bytes(MEM_VMM);
    struct vmm *v = vt_pool(4, 2, 256, false);
    uint32_t r;
    cr_assert_eq(vmm_range_acquire(v, &r), 0);
    cr_assert_eq(vmm_range_grow(v, r, 200), 0);
    cr_assert_geq(vt_memfd_maps(), 1);
    vmm_destroy(v);
    cr_assert_eq(vt_memfd_maps(), 0, "no mapping of the memfd remains");
    cr_assert_eq(mem_bytes(MEM_VMM), held, "every vmm byte freed");
}

Test(vmm_lifecycle, given_backend_is_owned_even_when_create_fails) {
    uint64_t held = mem_bytes(MEM_VMM);
    struct vmm_backend *be;
    cr_assert_eq(vmm_host_backend_create(VMM_HUGE_OFF, &be), 0);
    cr_assert_gt(mem_bytes(MEM_VMM), held);
    struct vmm_config cfg = {.backend = be, .token_bytes = 64, .n_ranges = 0, .max_tokens = 1};
    struct vmm *v = NULL;
    cr_assert_eq(vmm_create(&cfg, &v, NULL, 0), -EINVAL);
    cr_assert_eq(mem_bytes(MEM_VMM), held, "vmm_create destroyed the backend it was given");
    cr_assert_eq(vmm_host_backend_create(VMM_HUGE_OFF, &be), 0);
    cfg.backend = be;
    cfg.n_ranges = 1;
    cr_assert_eq(vmm_create(&cfg, &v, NULL, 0), 0);
    cr_assert_str_eq(vmm_host_huge_kind(be), "none");
    cr_assert_geq(vmm_host_fd(be), 0);
    vmm_destroy(v);
    cr_assert_eq(mem_bytes(MEM_VMM), held);
}

Test(vmm_lifecycle, create_allocation_failures_leak_nothing) {
    struct vmm_config cfg = {.huge = VMM_HUGE_OFF,
                             .token_bytes = 64,
                             .n_pages = 4,
                             .n_ranges = 2,
                             .max_tokens = 128,
                             .zero_pages = true};
    uint64_t held = mem_bytes(MEM_VMM);
    uint64_t before = mem_calls();
    struct vmm *v;
    cr_assert_eq(vmm_create(&cfg, &v, NULL, 0), 0);
    uint64_t n_allocs = mem_calls() - before;
    vmm_destroy(v);
    cr_assert_gt(n_allocs, 3);
    for (uint64_t n = 1; n <= n_allocs; n++) {
        char err[256] = "";
        v = NULL;
        mem_fail_nth(n);
        int rc = vmm_create(&cfg, &v, err, sizeof err);
        mem_fail_nth(0);
        cr_assert_eq(rc, -ENOMEM, "allocation %lu: rc %d", (unsigned long)n, rc);
        cr_assert_null(v);
        cr_assert(strstr(err, "memory") != NULL, "allocation %lu: %s", (unsigned long)n, err);
        cr_assert_eq(mem_bytes(MEM_VMM), held, "allocation %lu leaked", (unsigned long)n);
        cr_assert_eq(vt_memfd_maps(), 0);
    }
}
