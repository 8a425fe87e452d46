/* kv's map-ahead (engine/model/kv.h, engine/model/kv_ahead.c): pages mapped ahead count
 * as free and not as a sequence's need, a reserve that finds the free list
 * short takes them back from other sequences, the target is capped by the
 * budget and the request's length, close cancels the thread's work before
 * the range goes back (so a range acquired again can take shared pages at
 * index 0), and with map-ahead off nothing changes. A KV geometry of 256 B
 * tokens (2 layers, 2 KV heads of 8, f32) in 4 KiB pages: 16 tokens a page,
 * 128 tokens (8 pages) a sequence, 6 pages in the pool. */
#include <criterion/criterion.h>
#include <errno.h>

#include "engine/model/kv.h"
#include "engine/model/model.h"

static struct kv_cache *open_kv(bool ahead, uint32_t n_pages) {
    struct model_hparams hp = {.n_layer = 2, .n_head_kv = 2, .head_dim = 8};
    struct kv_config cfg = {.dtype = KV_F32,
                            .n_ctx = 128,
                            .n_seqs = 3,
                            .budget_bytes = (uint64_t)n_pages * 4096,
                            .huge = VMM_HUGE_OFF,
                            .map_ahead = ahead};
    struct kv_cache *kv;
    char err[256] = "";
    cr_assert_eq(kv_cache_create(&hp, &cfg, &kv, err, sizeof err), 0, "%s", err);
    cr_assert_eq(vmm_tokens_per_page(kv->vmm), 16);
    cr_assert_eq(vmm_n_pages(kv->vmm), n_pages);
    return kv;
}

static uint32_t vmm_free(const struct kv_cache *kv) {
    struct vmm_stats st;
    vmm_stats_get(kv->vmm, &st);
    return (uint32_t)st.pages_free;
}

Test(kv_ahead, pages_mapped_ahead_count_as_free_not_as_need) {
    struct kv_cache *kv = open_kv(true, 6);
    uint32_t a, ahead = 99, budget = 10;
    cr_assert_eq(kv_seq_open(kv, &a), 0);
    cr_assert_eq(kv_seq_reserve(kv, a, 10), 0);
    cr_assert_eq(kv_pages_free(kv, &ahead), 5);
    cr_assert_eq(ahead, 0);
    /* token 10 is next: its page is mapped, so the spare is page 1 */
    kv_seq_ahead(kv, a, 11, 128, &budget);
    cr_assert_eq(budget, 9, "budget %u", budget);
    kv_ahead_sync(kv);
    cr_assert_eq(vmm_range_n_mapped(kv->vmm, a), 2);
    cr_assert_eq(kv_seq_pages(kv, a), 1);
    cr_assert_eq(kv_pages_free(kv, &ahead), 5, "a page mapped ahead is still free");
    cr_assert_eq(ahead, 1);
    cr_assert_eq(vmm_free(kv), 4);
    /* the grow into it maps nothing */
    cr_assert(kv_seq_backed(kv, a, 20));
    cr_assert_eq(kv_seq_reserve(kv, a, 20), 0);
    cr_assert_eq(kv_seq_pages(kv, a), 2);
    cr_assert_eq(kv_pages_free(kv, &ahead), 4);
    cr_assert_eq(ahead, 0);
    struct vmm_stats st;
    vmm_stats_get(kv->vmm, &st);
    cr_assert_eq(st.grow_waited_total, 1, "only the first reserve mapped: %lu",
                 (unsigned long)st.grow_waited_total);
    cr_assert_eq(st.map_ahead_pages_total, 1);
    cr_assert(kv_check(kv));
    kv_seq_close(kv, a);
    cr_assert_eq(kv_pages_free(kv, NULL), 6);
    kv_cache_destroy(kv);
}

Test(kv_ahead, reserve_takes_back_pages_mapped_ahead_for_others) {
    struct kv_cache *kv = open_kv(true, 6);
    uint32_t a, b, budget = 10, ahead;
    cr_assert_eq(kv_seq_open(kv, &a), 0);
    cr_assert_eq(kv_seq_open(kv, &b), 0);
    cr_assert_eq(kv_seq_reserve(kv, a, 16), 0);
    kv_seq_ahead(kv, a, 17, 128, &budget); /* page 1 for token 16, page 2 spare */
    kv_ahead_sync(kv);
    cr_assert_eq(vmm_range_n_mapped(kv->vmm, a), 3);
    cr_assert_eq(vmm_free(kv), 3);
    cr_assert_eq(kv_pages_free(kv, NULL), 5);
    /* b needs 4: the free list has 3, the 2 mapped ahead for a come back */
    cr_assert_eq(kv_seq_reserve(kv, b, 64), 0);
    cr_assert_eq(vmm_range_n_mapped(kv->vmm, a), 1, "a keeps what it needs");
    cr_assert_eq(vmm_range_n_mapped(kv->vmm, b), 4);
    cr_assert_eq(kv_pages_free(kv, &ahead), 1);
    cr_assert_eq(ahead, 0);
    cr_assert(kv_check(kv));
    /* and past what is there, a plain -ENOSPC that changes nothing */
    cr_assert_eq(kv_seq_reserve(kv, b, 128), -ENOSPC);
    cr_assert_eq(vmm_range_n_mapped(kv->vmm, b), 4);
    cr_assert_eq(kv_seq_pages(kv, b), 4);
    /* kv_reclaim with pages to spare on the free list takes nothing back */
    budget = 1;
    kv_seq_ahead(kv, b, 65, 128, &budget);
    kv_ahead_sync(kv);
    cr_assert_eq(vmm_range_n_mapped(kv->vmm, b), 5);
    cr_assert_eq(kv_reclaim(kv, 0, UINT32_MAX), 0);
    cr_assert_eq(vmm_range_n_mapped(kv->vmm, b), 5);
    cr_assert_eq(kv_reclaim(kv, 1, UINT32_MAX), 1);
    cr_assert_eq(vmm_range_n_mapped(kv->vmm, b), 4);
    cr_assert(kv_check(kv));
    kv_seq_close(kv, a);
    kv_seq_close(kv, b);
    cr_assert_eq(vmm_free(kv), 6);
    kv_cache_destroy(kv);
}

Test(kv_ahead, target_is_capped_by_budget_and_request_length) {
    struct kv_cache *kv = open_kv(true, 6);
    uint32_t a, budget = 0;
    cr_assert_eq(kv_seq_open(kv, &a), 0);
    cr_assert_eq(kv_seq_reserve(kv, a, 16), 0);
    kv_seq_ahead(kv, a, 17, 128, &budget); /* no budget: nothing */
    kv_ahead_sync(kv);
    cr_assert_eq(vmm_range_n_mapped(kv->vmm, a), 1);
    budget = 1; /* wants 3 pages, may take 1 more */
    kv_seq_ahead(kv, a, 17, 128, &budget);
    kv_ahead_sync(kv);
    cr_assert_eq(vmm_range_n_mapped(kv->vmm, a), 2);
    cr_assert_eq(budget, 0);
    budget = 10; /* a request of 20 tokens never needs page 2 */
    kv_seq_ahead(kv, a, 17, 20, &budget);
    kv_ahead_sync(kv);
    cr_assert_eq(vmm_range_n_mapped(kv->vmm, a), 2);
    cr_assert_eq(budget, 10);
    kv_seq_close(kv, a);
    kv_cache_destroy(kv);
    kv = open_kv(true, 24); /* nor past the context: the range ends at 8 pages */
    cr_assert_eq(kv_seq_open(kv, &a), 0);
    cr_assert_eq(kv_seq_reserve(kv, a, 120), 0);
    kv_seq_ahead(kv, a, 121, 1000, &budget);
    kv_ahead_sync(kv);
    cr_assert_eq(vmm_range_n_mapped(kv->vmm, a), 8, "the range ends at 8 pages");
    cr_assert(kv_check(kv));
    kv_seq_close(kv, a);
    kv_cache_destroy(kv);
}

/* Post and close at once, 300 times: whatever the thread was doing, the
 * closed range holds nothing afterwards, and the range acquired again takes
 * a shared page at index 0. */
Test(kv_ahead, close_cancels_the_thread_before_the_range_goes) {
    struct kv_cache *kv = open_kv(true, 24);
    uint32_t keep, a;
    cr_assert_eq(kv_seq_open(kv, &keep), 0);
    cr_assert_eq(kv_seq_reserve(kv, keep, 16), 0);
    uint32_t shared = vmm_range_page(kv->vmm, keep, 0);
    for (int i = 0; i < 300; i++) {
        uint32_t budget = 8;
        cr_assert_eq(kv_seq_open(kv, &a), 0);
        cr_assert_eq(kv_seq_share(kv, a, shared), 0, "round %d", i);
        cr_assert_eq(vmm_range_page(kv->vmm, a, 0), shared, "round %d", i);
        cr_assert_eq(kv_seq_reserve(kv, a, 20), 0);
        kv_seq_ahead(kv, a, 21 + (uint32_t)i % 60, 128, &budget);
        if (i % 3 == 0) { /* let it finish: pages past the need, and no share now */
            kv_ahead_sync(kv);
            cr_assert_gt(vmm_range_n_mapped(kv->vmm, a), kv_seq_pages(kv, a), "round %d", i);
            cr_assert_eq(kv_seq_share(kv, a, shared), -EBUSY, "round %d", i);
        }
        kv_seq_close(kv, a);
        cr_assert_eq(vmm_range_n_mapped(kv->vmm, a), 0, "round %d", i);
        cr_assert(kv_check(kv), "round %d", i);
    }
    kv_ahead_sync(kv);
    cr_assert_eq(vmm_free(kv), 23);
    kv_seq_close(kv, keep);
    kv_cache_destroy(kv);
}

Test(kv_ahead, a_range_with_pages_mapped_ahead_refuses_a_share) {
    struct kv_cache *kv = open_kv(true, 6);
    uint32_t a, b, budget = 4;
    cr_assert_eq(kv_seq_open(kv, &a), 0);
    cr_assert_eq(kv_seq_open(kv, &b), 0);
    cr_assert_eq(kv_seq_reserve(kv, a, 16), 0);
    kv_seq_ahead(kv, b, 1, 128, &budget);
    kv_ahead_sync(kv);
    cr_assert_eq(vmm_range_n_mapped(kv->vmm, b), 2);
    cr_assert_eq(kv_seq_share(kv, b, vmm_range_page(kv->vmm, a, 0)), -EBUSY);
    cr_assert_eq(kv_seq_pages(kv, b), 0);
    kv_seq_close(kv, a);
    kv_seq_close(kv, b);
    kv_cache_destroy(kv);
}

Test(kv_ahead, off_maps_nothing_ahead) {
    struct kv_cache *kv = open_kv(false, 6);
    uint32_t a, budget = 4, ahead = 9;
    cr_assert_null(kv->ahead);
    cr_assert_eq(kv_seq_open(kv, &a), 0);
    cr_assert_eq(kv_seq_reserve(kv, a, 16), 0);
    kv_seq_ahead(kv, a, 17, 128, &budget);
    kv_ahead_sync(kv);
    cr_assert_eq(budget, 4);
    cr_assert_eq(vmm_range_n_mapped(kv->vmm, a), 1);
    cr_assert_eq(kv_pages_free(kv, &ahead), 5);
    cr_assert_eq(ahead, 0);
    cr_assert(!kv_seq_backed(kv, a, 17));
    cr_assert_eq(kv_seq_reserve(kv, a, 17), 0);
    cr_assert_eq(kv_reclaim(kv, 6, UINT32_MAX), 4, "nothing to take back");
    kv_seq_close(kv, a);
    kv_cache_destroy(kv);
}

/* Speculative rollback (kv_seq_trim): the pages past the kept tokens go
 * back to the pool. Off: unmapped at once, need and mapping both shrink.
 * On: one of them stays mapped as the spare (free in every count), any more
 * are unmapped. A trim that drops nothing, or that would grow, changes
 * nothing; a failed unmap changes nothing. */
Test(kv_ahead, trim_returns_the_pages_of_rolled_back_tokens) {
    for (int on = 0; on < 2; on++) {
        struct kv_cache *kv = open_kv(on, 6);
        uint32_t a, ahead = 0;
        cr_assert_eq(kv_seq_open(kv, &a), 0);
        cr_assert_eq(kv_seq_reserve(kv, a, 60), 0); /* 4 pages: tokens 0..59 */
        cr_assert_eq(kv_seq_trim(kv, a, 60), 0);
        cr_assert_eq(kv_seq_pages(kv, a), 4, "on %d: a trim to the length drops nothing", on);
        cr_assert_eq(kv_seq_trim(kv, a, 90), 0);
        cr_assert_eq(kv_seq_pages(kv, a), 4, "on %d: a trim never grows", on);
        cr_assert_eq(kv_seq_trim(kv, a, 33), 1); /* 3 pages: tokens 0..32 */
        cr_assert_eq(kv_seq_pages(kv, a), 3, "on %d", on);
        cr_assert_eq(kv_pages_free(kv, &ahead), 3, "on %d: the emptied page is free", on);
        cr_assert_eq(vmm_range_n_mapped(kv->vmm, a), on ? 4u : 3u, "on %d", on);
        cr_assert_eq(ahead, on ? 1u : 0u);
        cr_assert_eq(kv_seq_trim(kv, a, 5), 2); /* 1 page */
        cr_assert_eq(kv_seq_pages(kv, a), 1);
        cr_assert_eq(vmm_range_n_mapped(kv->vmm, a), on ? 2u : 1u, "on %d: at most one spare", on);
        cr_assert_eq(kv_pages_free(kv, NULL), 5);
        cr_assert(kv_check(kv));
        /* the range grows back over the spare without a map */
        cr_assert_eq(kv_seq_reserve(kv, a, 20), 0);
        cr_assert_eq(vmm_range_n_mapped(kv->vmm, a), 2);
        /* an unmap that fails leaves the sequence as it was */
        cr_assert_eq(kv_seq_reserve(kv, a, 64), 0);
        vmm_fault_inject(kv->vmm, 1);
        cr_assert_eq(kv_seq_trim(kv, a, 5), -EIO);
        cr_assert_eq(kv_seq_pages(kv, a), 4);
        cr_assert_eq(vmm_range_n_mapped(kv->vmm, a), 4);
        cr_assert(kv_check(kv));
        cr_assert_eq(kv_seq_trim(kv, 7, 5), -EINVAL);
        kv_seq_close(kv, a);
        kv_cache_destroy(kv);
    }
}
