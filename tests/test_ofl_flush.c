/* The tier manager's flush (offload/ofl.h): between ofl_flush_begin() and
 * ofl_flush() every page is kept whatever the spill policy measured, and
 * the counts say what reached the disk. The policy is made to drop
 * everything (a prefill rate no copy can beat), which is what a small model
 * on a fast CPU measures: the exit flush used to drop those pages after
 * announcing them, so a restart found nothing. */
#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

#include "offload/ofl.h"
#include "tests/lib/vmm_util.h"

#define PB 4096

static char dir[64], slots[96];

static void setup(void) {
    strcpy(dir, "/tmp/llmd-ofl-flush-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    snprintf(slots, sizeof slots, "%s/kv.slots", dir);
}

static void teardown(void) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}

TestSuite(ofl_flush, .init = setup, .fini = teardown, .timeout = 60);

/* Range 0 writes one page, seals it and lets go: the page is CACHED. */
static uint32_t cached_page(struct vmm *v, uint8_t seed) {
    uint32_t r;
    cr_assert_eq(vmm_range_acquire(v, &r), 0);
    cr_assert_eq(vmm_range_grow(v, r, 1), 0);
    uint8_t *p = (uint8_t *)vmm_range_base(v, r);
    for (int i = 0; i < PB; i++)
        p[i] = (uint8_t)(seed + i * 7);
    uint32_t page = vmm_range_page(v, r, 0);
    cr_assert_eq(vmm_page_seal(v, page, 5, 9), 0);
    cr_assert_eq(vmm_range_release(v, r), 0);
    return page;
}

/* What the prefix cache's spill hook does with a cold page. */
static int spill(struct ofl *o, struct vmm *v, uint8_t seed) {
    uint32_t page = cached_page(v, seed);
    uint8_t hash[OFL_KEY_BYTES] = {seed};
    cr_assert_eq(vmm_page_spill_begin(v, page), 0);
    int rc = ofl_spill(o, hash, page, 0, 2);
    cr_assert_eq(vmm_page_spill_end(v, page, true), 0);
    return rc;
}

Test(ofl_flush, a_flush_keeps_what_the_policy_would_drop) {
    struct vmm *v = vt_pool(4, 2, 256, false);
    struct ofl_config oc = {
        .vmm = v,
        .host_bytes = 1 << 20,
        .nvme_path = slots,
        .nvme_bytes = 1 << 20,
        .policy = OFL_POLICY_AUTO,
        .prefill_tokens_per_s = 1e18, /* recomputing beats every copy */
    };
    struct ofl *o;
    char err[256] = "";
    cr_assert_eq(ofl_create(&oc, &o, err, sizeof err), 0, "%s", err);
    cr_assert_eq(spill(o, v, 1), -ECANCELED, "the policy drops it");

    ofl_flush_begin(o);
    cr_assert_eq(spill(o, v, 2), 0, "kept during a flush");
    cr_assert_eq(spill(o, v, 3), 0);
    struct ofl_flush_counts fc;
    ofl_flush(o, &fc);
    cr_assert_eq(fc.written, 2, "written %u", fc.written);
    cr_assert_eq(fc.present, 0);
    cr_assert_eq(fc.lost, 0);
    struct ofl_stats st;
    ofl_stats_get(o, &st);
    cr_assert_eq(st.nvme_pages, 2, "on the disk: %llu", (unsigned long long)st.nvme_pages);
    cr_assert_eq(st.host_pages, 0, "the host tier handed them on");
    uint8_t h2[OFL_KEY_BYTES] = {2}, h1[OFL_KEY_BYTES] = {1};
    cr_assert_eq(ofl_find(o, h2), OFL_TIER_NVME);
    cr_assert_eq(ofl_find(o, h1), OFL_TIER_NONE, "the dropped one stays dropped");

    /* the flush is over: the policy is back */
    cr_assert_eq(spill(o, v, 4), -ECANCELED);
    /* a flush with nothing to do counts nothing */
    ofl_flush(o, &fc);
    cr_assert_eq(fc.written + fc.present + fc.lost, 0);
    ofl_destroy(o);
    cr_assert(vmm_check(v));
    vmm_destroy(v);
}
