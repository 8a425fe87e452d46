/* The prefix cache index on a real host pool: longest-prefix lookup, sharing
 * the hits into a second range, tenant isolation and scopes, eviction order,
 * retention limits, purge, stats text, table collisions and fault injection.
 * pfx_check and vmm_check run after every step. */
#include "tests/lib/pfx_util.h"

#define N_PAGES 32

static struct vmm *v;
static struct pfx *p;
static struct pfx_config cfg;

static void setup(void) {
    v = vt_pool(N_PAGES, 8, 16 * PT_TPP, false);
    pt_config(&cfg);
    p = pt_pfx(v, &cfg);
}

static void teardown(void) {
    if (p) {
        cr_assert(pfx_check(p));
        pfx_destroy(p);
    }
    struct vmm_stats s;
    vmm_stats_get(v, &s);
    cr_assert_eq(s.pages_cached, 0, "destroy evicts cached pages: %lu left",
                 (unsigned long)s.pages_cached);
    vmm_destroy(v);
    cr_assert_eq(mem_bytes(MEM_PFX), 0, "pfx leaked %lu bytes", (unsigned long)mem_bytes(MEM_PFX));
}

TestSuite(pfx_cache, .init = setup, .fini = teardown);

static void chk(void) {
    cr_assert(pfx_check(p));
    cr_assert(vmm_check(v));
}

static void release(uint32_t r) {
    cr_assert_eq(vmm_range_release(v, r), 0);
    chk();
}

/* A chain of n pages with page values vals under scope name. */
static void chain_of(const char *name, const int *vals, uint32_t n, struct pfx_hash *h) {
    int32_t tok[8 * PT_TPP];
    pt_tokens(tok, vals, n);
    struct pfx_ns ns = pt_ns(name);
    pt_chain(p, &ns, 1, tok, n, h);
}

Test(pfx_cache, lookup_returns_longest_prefix_and_a_miss_ends_it) {
    int vals[4] = {1, 2, 3, 4};
    struct pfx_hash h[4];
    chain_of("t", vals, 4, h);
    uint32_t r, pages[4];
    cr_assert_eq(vmm_range_acquire(v, &r), 0);
    cr_assert_eq(vmm_range_grow(v, r, 4 * PT_TPP), 0);
    for (uint32_t i = 0; i < 4; i++)
        if (i != 2) /* page 2 stays uncached */
            cr_assert_eq(pfx_insert(p, &h[i], vmm_range_page(v, r, i), 7, PFX_PRIO_NORMAL), 0);
    chk();
    cr_assert_eq(pfx_lookup(p, h, 4, pages), 2, "the miss at page 2 ends the run");
    cr_assert_eq(pages[0], vmm_range_page(v, r, 0));
    cr_assert_eq(pages[1], vmm_range_page(v, r, 1));
    cr_assert_eq(pfx_lookup(p, h + 3, 1, pages), 1, "page 3 is cached on its own");
    cr_assert_eq(pfx_lookup(p, h + 2, 2, pages), 0);
    release(r);
}

Test(pfx_cache, hits_shared_into_a_second_range_read_identical_bytes) {
    int vals[3] = {5, 6, 7};
    struct pfx_hash h[3];
    chain_of("t", vals, 3, h);
    uint32_t hits;
    uint32_t r0 = pt_seq(v, p, h, 3, 1, PFX_PRIO_NORMAL, &hits);
    cr_assert_eq(hits, 0);
    for (uint32_t i = 0; i < 3; i++) /* distinct bytes per page and offset */
        for (size_t b = 0; b < vmm_page_bytes(v); b++)
            pt_page_va(v, r0, i)[b] = (uint8_t)(b * 13 + i * 101);
    uint32_t p0[3];
    for (uint32_t i = 0; i < 3; i++)
        p0[i] = vmm_range_page(v, r0, i);
    release(r0);
    for (uint32_t i = 0; i < 3; i++)
        cr_assert_eq(pt_state(v, p0[i]), VMM_PAGE_CACHED, "page %u stays cached", p0[i]);

    uint32_t r1, pages[3];
    cr_assert_eq(vmm_range_acquire(v, &r1), 0);
    cr_assert_eq(pfx_lookup(p, h, 3, pages), 3);
    for (uint32_t i = 0; i < 3; i++) {
        cr_assert_eq(pages[i], p0[i], "idx %u: page %u, want %u", i, pages[i], p0[i]);
        cr_assert_eq(vmm_range_share(v, r1, pages[i]), 0);
    }
    chk();
    for (uint32_t i = 0; i < 3; i++)
        for (size_t b = 0; b < vmm_page_bytes(v); b++)
            cr_assert_eq(pt_page_va(v, r1, i)[b], (uint8_t)(b * 13 + i * 101), "idx %u byte %zu", i,
                         b);
    release(r1);
}

Test(pfx_cache, insert_rules) {
    int vals[2] = {1, 2};
    struct pfx_hash h[2];
    chain_of("t", vals, 2, h);
    uint32_t r0, r1;
    cr_assert_eq(vmm_range_acquire(v, &r0), 0);
    cr_assert_eq(vmm_range_acquire(v, &r1), 0);
    cr_assert_eq(vmm_range_grow(v, r0, 2 * PT_TPP), 0);
    cr_assert_eq(vmm_range_grow(v, r1, 2 * PT_TPP), 0);
    uint32_t a = vmm_range_page(v, r0, 0), b = vmm_range_page(v, r1, 0);
    cr_assert_eq(pfx_insert(p, &h[0], a, 1, PFX_N_PRIO), -EINVAL, "bad class");
    cr_assert_eq(pfx_insert(p, &h[0], N_PAGES, 1, 0), -EINVAL, "bad page");
    cr_assert_eq(pfx_insert(p, &h[0], N_PAGES - 1, 1, 0), -EINVAL, "FREE page");
    cr_assert_eq(pfx_insert(p, &h[0], a, 1, 0), 0);
    cr_assert_eq(pfx_insert(p, &h[1], a, 1, 0), -EINVAL, "page already indexed");
    cr_assert_eq(pfx_insert(p, &h[0], b, 2, 0), -EEXIST, "same prefix computed twice");
    struct vmm_page_info vi;
    cr_assert_eq(vmm_page_info(v, b, &vi), 0);
    cr_assert_eq(vi.hash_slot, VMM_PAGE_NONE, "the duplicate stays unsealed");
    chk();
    release(r1);
    cr_assert_eq(pt_state(v, b), VMM_PAGE_FREE, "the private copy is freed, not cached");
    release(r0);
    cr_assert_eq(pt_state(v, a), VMM_PAGE_CACHED);
    cr_assert_eq(pfx_insert(p, &h[1], a, 1, 0), -EINVAL, "CACHED page already indexed");
}

Test(pfx_cache, tenants_share_only_a_named_namespace) {
    int vals[3] = {9, 9, 9};
    struct pfx_hash ha[3], hb[3], hs[3];
    chain_of("tenant-a", vals, 3, ha);
    chain_of("tenant-b", vals, 3, hb);
    uint32_t hits, pages[3];
    release(pt_seq(v, p, ha, 3, 1, PFX_PRIO_NORMAL, &hits));
    cr_assert_eq(pfx_lookup(p, hb, 3, pages), 0, "identical tokens, other tenant: no hit");
    release(pt_seq(v, p, hb, 3, 2, PFX_PRIO_NORMAL, &hits));
    cr_assert_eq(hits, 0);

    chain_of("shared-org", vals, 3, hs); /* both tenants opt into the same namespace */
    release(pt_seq(v, p, hs, 3, 1, PFX_PRIO_NORMAL, &hits));
    cr_assert_eq(hits, 0);
    uint32_t r = pt_seq(v, p, hs, 3, 2, PFX_PRIO_NORMAL, &hits);
    cr_assert_eq(hits, 3, "the shared namespace hits");
    release(r);
    struct pfx_stats s;
    pfx_stats_get(p, &s);
    cr_assert_eq(s.entries, 9);
}

Test(pfx_cache, scope_shares_system_prompt_keeps_documents_private) {
    /* 2 pages of system prompt + 1 straddling page + 2 pages of document. */
    int32_t ta[5 * PT_TPP], tb[5 * PT_TPP];
    int va[5] = {1, 2, 30, 31, 32}, vb[5] = {1, 2, 30, 31, 32}; /* same document too */
    pt_tokens(ta, va, 5);
    pt_tokens(tb, vb, 5);
    uint32_t sys_tokens = 2 * PT_TPP + 10; /* the system prompt ends inside page 2 */
    struct pfx_ns sa[2] = {pt_ns("org-1"), pt_ns("tenant-a")},
                  sb[2] = {pt_ns("org-1"), pt_ns("tenant-b")};
    sa[0].end_tokens = sb[0].end_tokens = sys_tokens;
    struct pfx_hash ha[5], hb[5];
    pt_chain(p, sa, 2, ta, 5, ha);
    pt_chain(p, sb, 2, tb, 5, hb);
    uint32_t hits;
    uint32_t ra = pt_seq(v, p, ha, 5, 1, PFX_PRIO_NORMAL, &hits);
    cr_assert_eq(hits, 0);
    uint32_t rb = pt_seq(v, p, hb, 5, 2, PFX_PRIO_NORMAL, &hits);
    cr_assert_eq(hits, 2, "the system prompt's full pages are computed once");
    for (uint32_t i = 0; i < 2; i++)
        cr_assert_eq(vmm_range_page(v, ra, i), vmm_range_page(v, rb, i), "idx %u shared", i);
    for (uint32_t i = 2; i < 5; i++)
        cr_assert_neq(vmm_range_page(v, ra, i), vmm_range_page(v, rb, i), "idx %u private", i);
    release(ra);
    release(rb);
    struct pfx_stats s;
    pfx_stats_get(p, &s);
    cr_assert_eq(s.entries, 2 + 3 + 3);
}

/* Page that pfx_evict(1) freed: the only one of cand[] that became FREE. */
static uint32_t evict_one(const uint32_t *cand, uint32_t n) {
    uint32_t got = 0;
    cr_assert_eq(pfx_evict(p, 1, &got), 0);
    cr_assert_eq(got, 1);
    chk();
    uint32_t freed = VMM_PAGE_NONE;
    for (uint32_t i = 0; i < n; i++)
        if (cand[i] != VMM_PAGE_NONE && pt_state(v, cand[i]) == VMM_PAGE_FREE) {
            cr_assert_eq(freed, VMM_PAGE_NONE, "two pages freed");
            freed = cand[i];
        }
    return freed;
}

Test(pfx_cache, eviction_takes_lowest_class_then_lru) {
    /* Six single-page prefixes, inserted in order a..f with these classes. */
    const uint8_t prio[6] = {2, 3, 2, 0, 3, 1};
    struct pfx_hash h[6];
    uint32_t pg[6];
    for (int i = 0; i < 6; i++) {
        int val = 100 + i;
        chain_of("t", &val, 1, &h[i]);
        uint32_t r = pt_seq(v, p, &h[i], 1, 1, prio[i], NULL);
        pg[i] = vmm_range_page(v, r, 0);
        release(r);
    }
    uint32_t out[1];
    cr_assert_eq(pfx_lookup(p, &h[1], 1, out), 1); /* b becomes the MRU of class 3 */
    cr_assert_eq(pfx_lookup(p, &h[0], 1, out), 1); /* a becomes the MRU of class 2 */
    /* class 3: e, b; class 2: c, a; class 1: f; class 0: d. */
    const int order[6] = {4, 1, 2, 0, 5, 3};
    for (int k = 0; k < 6; k++) {
        uint32_t got = evict_one(pg, 6);
        cr_assert_eq(got, pg[order[k]], "eviction %d: page %u, want %u", k, got, pg[order[k]]);
        for (int i = 0; i < 6; i++)
            if (pg[i] == got)
                pg[i] = VMM_PAGE_NONE;
    }
    uint32_t n = 9;
    cr_assert_eq(pfx_evict(p, 1, &n), 0, "nothing left");
    cr_assert_eq(n, 0);
}

Test(pfx_cache, referenced_pages_are_never_evicted) {
    int vals[3] = {1, 2, 3};
    struct pfx_hash h[3];
    chain_of("t", vals, 3, h);
    uint32_t r = pt_seq(v, p, h, 3, 1, PFX_PRIO_LOW, NULL);
    uint32_t n = 9;
    cr_assert_eq(pfx_evict(p, 3, &n), 0);
    cr_assert_eq(n, 0, "all three are mapped");
    for (uint32_t i = 0; i < 3; i++)
        cr_assert_eq(pt_state(v, vmm_range_page(v, r, i)), VMM_PAGE_MAPPED);
    struct pfx_stats s;
    pfx_stats_get(p, &s);
    cr_assert_eq(s.entries, 3);
    chk();
    cr_assert_eq(vmm_range_shrink(v, r, 2 * PT_TPP), 0); /* page 2 now unmapped: CACHED */
    cr_assert_eq(pfx_evict(p, 3, &n), 0);
    cr_assert_eq(n, 1, "only the unmapped page goes");
    chk();
    release(r);
}

Test(pfx_cache, eviction_scan_is_bounded) {
    pfx_destroy(p);
    cfg.evict_scan_max = 2;
    p = pt_pfx(v, &cfg);
    /* Three mapped entries at the LRU end, then one unreferenced. */
    int vals[3] = {1, 2, 3}, uval = 50;
    struct pfx_hash h[3], hu;
    chain_of("t", vals, 3, h);
    chain_of("t", &uval, 1, &hu);
    uint32_t r = pt_seq(v, p, h, 3, 1, PFX_PRIO_NORMAL, NULL);
    uint32_t ru = pt_seq(v, p, &hu, 1, 1, PFX_PRIO_NORMAL, NULL);
    uint32_t upage = vmm_range_page(v, ru, 0);
    release(ru);
    uint32_t n = 9;
    cr_assert_eq(pfx_evict(p, 1, &n), -EAGAIN, "two in-use entries stepped over");
    cr_assert_eq(n, 0);
    chk();
    /* The two skipped moved to the MRU end: the third, then the free one. */
    cr_assert_eq(pfx_evict(p, 1, &n), 0);
    cr_assert_eq(n, 1);
    cr_assert_eq(pt_state(v, upage), VMM_PAGE_FREE);
    release(r);
}

Test(pfx_cache, retention_limit_evicts_own_lru_or_refuses) {
    cr_assert_eq(pfx_tenant_limit(p, 1, 2), 0);
    struct pfx_hash h[3];
    uint32_t pg[3];
    for (int i = 0; i < 2; i++) {
        int val = 10 + i;
        chain_of("t1", &val, 1, &h[i]);
        uint32_t r = pt_seq(v, p, &h[i], 1, 1, PFX_PRIO_NORMAL, NULL);
        pg[i] = vmm_range_page(v, r, 0);
        release(r);
    }
    /* Another tenant's entry, older than nothing: must not be touched. */
    int oval = 77;
    struct pfx_hash ho;
    chain_of("t9", &oval, 1, &ho);
    uint32_t ro = pt_seq(v, p, &ho, 1, 9, PFX_PRIO_LOW, NULL);
    uint32_t opage = vmm_range_page(v, ro, 0);
    release(ro);

    int val = 12;
    chain_of("t1", &val, 1, &h[2]);
    uint32_t r = pt_seq(v, p, &h[2], 1, 1, PFX_PRIO_NORMAL, NULL);
    pg[2] = vmm_range_page(v, r, 0);
    cr_assert_eq(pt_state(v, pg[0]), VMM_PAGE_FREE, "tenant 1's LRU entry made room");
    cr_assert_eq(pt_state(v, pg[1]), VMM_PAGE_CACHED);
    cr_assert_eq(pt_state(v, opage), VMM_PAGE_CACHED, "other tenants keep theirs");

    /* Both of tenant 1's entries mapped: the next insert is refused. */
    uint32_t r2, got[1];
    cr_assert_eq(vmm_range_acquire(v, &r2), 0);
    cr_assert_eq(pfx_lookup(p, &h[1], 1, got), 1);
    cr_assert_eq(vmm_range_share(v, r2, got[0]), 0);
    cr_assert_eq(vmm_range_grow(v, r2, 2 * PT_TPP), 0);
    int v2[2] = {10 + 1, 13};
    struct pfx_hash h2[2];
    chain_of("t1", v2, 2, h2);
    uint32_t newp = vmm_range_page(v, r2, 1);
    cr_assert_eq(pfx_insert(p, &h2[1], newp, 1, PFX_PRIO_NORMAL), -EDQUOT);
    struct vmm_page_info vi;
    cr_assert_eq(vmm_page_info(v, newp, &vi), 0);
    cr_assert_eq(vi.hash_slot, VMM_PAGE_NONE, "refused page stays unsealed");
    chk();
    release(r2);
    release(r);

    cr_assert_eq(pfx_tenant_limit(p, 1, 0), 0, "a lowered limit trims now");
    cr_assert_eq(pt_state(v, pg[1]), VMM_PAGE_FREE);
    cr_assert_eq(pt_state(v, pg[2]), VMM_PAGE_FREE);
    struct pfx_stats s;
    pfx_stats_get(p, &s);
    cr_assert_eq(s.entries, 1, "tenant 9's entry only");
    cr_assert_eq(s.limit_evictions_total, 3);
    cr_assert_eq(s.insert_quota_total, 1);
}

Test(pfx_cache, purge_drops_every_entry_of_the_tenant) {
    int va[3] = {1, 2, 3}, vb = 4;
    struct pfx_hash ha[3], hb;
    chain_of("a", va, 3, ha);
    chain_of("b", &vb, 1, &hb);
    uint32_t ra = pt_seq(v, p, ha, 3, 1, PFX_PRIO_NORMAL, NULL);
    uint32_t pa[3];
    for (uint32_t i = 0; i < 3; i++)
        pa[i] = vmm_range_page(v, ra, i);
    cr_assert_eq(vmm_range_shrink(v, ra, PT_TPP), 0); /* page 0 still mapped */
    release(pt_seq(v, p, &hb, 1, 2, PFX_PRIO_NORMAL, NULL));

    uint32_t n = 0, out[3];
    cr_assert_eq(pfx_purge_tenant(p, 1, &n), 0);
    cr_assert_eq(n, 3);
    chk();
    cr_assert_eq(pfx_lookup(p, ha, 3, out), 0, "nothing of tenant 1 can be found");
    cr_assert_eq(pt_state(v, pa[0]), VMM_PAGE_MAPPED, "the range keeps its page");
    cr_assert_eq(pt_state(v, pa[1]), VMM_PAGE_FREE);
    cr_assert_eq(pt_state(v, pa[2]), VMM_PAGE_FREE);
    struct pfx_stats s;
    pfx_stats_get(p, &s);
    cr_assert_eq(s.entries, 1);
    cr_assert_eq(s.entries_doomed, 1);
    cr_assert_eq(s.purges_total, 3);
    cr_assert_eq(pfx_lookup(p, &hb, 1, out), 1, "tenant 2 untouched");

    release(ra);
    cr_assert_eq(pt_state(v, pa[0]), VMM_PAGE_CACHED, "doomed, unmapped: waits for evict");
    cr_assert_eq(pfx_evict(p, 1, &n), 0);
    cr_assert_eq(n, 1);
    cr_assert_eq(pt_state(v, pa[0]), VMM_PAGE_FREE, "doomed pages go first");
    pfx_stats_get(p, &s);
    cr_assert_eq(s.entries_doomed, 0);
    cr_assert_eq(s.entries, 1);
    cr_assert_eq(pfx_purge_tenant(p, 12345, &n), 0, "unknown tenant");
    cr_assert_eq(n, 0);
}

Test(pfx_cache, stats_text_is_exact) {
    int vals[2] = {1, 2};
    struct pfx_hash h[2];
    chain_of("t", vals, 2, h);
    release(pt_seq(v, p, h, 2, 1, PFX_PRIO_NORMAL, NULL));     /* lookup 0/2, 2 inserts */
    uint32_t r = pt_seq(v, p, h, 2, 1, PFX_PRIO_NORMAL, NULL); /* lookup 2/2 */
    int v3[2] = {1, 3};                                        /* shares page 0 with h */
    struct pfx_hash h3[2];
    chain_of("t", v3, 2, h3);
    uint32_t pages[2];
    cr_assert_eq(pfx_lookup(p, h3, 2, pages), 1); /* lookup 1/2 */
    cr_assert_eq(pfx_insert(p, &h[0], vmm_range_page(v, r, 0), 1, 0), -EINVAL);
    release(r);
    uint32_t n;
    cr_assert_eq(pfx_evict(p, 1, &n), 0);
    cr_assert_eq(pfx_purge_tenant(p, 1, &n), 0);
    struct pfx_stats s;
    pfx_stats_get(p, &s);
    char buf[1024];
    cr_assert_eq(pfx_stats_format(&s, buf, sizeof buf), 0);
    cr_assert_str_eq(buf, "# pfx\n"
                          "pfx_entries:0\n"
                          "pfx_entries_doomed:0\n"
                          "pfx_tenants:1\n"
                          "pfx_lookups_total:3\n"
                          "pfx_hit_pages_total:3\n"
                          "pfx_miss_pages_total:3\n"
                          "pfx_hit_tokens_total:192\n"
                          "pfx_miss_tokens_total:192\n"
                          "pfx_inserts_total:2\n"
                          "pfx_insert_exists_total:0\n"
                          "pfx_insert_quota_total:0\n"
                          "pfx_evictions_total:1\n"
                          "pfx_spills_total:0\n"
                          "pfx_limit_evictions_total:0\n"
                          "pfx_purges_total:1\n");
    cr_assert_eq(pfx_stats_format(&s, buf, 20), -ENOSPC);
}

Test(pfx_cache, colliding_home_slots_survive_deletes) {
    /* Hashes that share their first 8 bytes all start probing at one slot:
     * one long cluster. Deleting from its middle must shift the rest back
     * and re-seal their pages with the new slots (pfx_check verifies). */
    enum { N = 12 };
    struct pfx_hash h[N];
    uint32_t r, pg[N], out[1];
    cr_assert_eq(vmm_range_acquire(v, &r), 0);
    cr_assert_eq(vmm_range_grow(v, r, N * PT_TPP), 0);
    for (uint32_t i = 0; i < N; i++) {
        memset(&h[i], 0x11, sizeof h[i]);
        h[i].b[31] = (uint8_t)i;
        pg[i] = vmm_range_page(v, r, i);
        cr_assert_eq(pfx_insert(p, &h[i], pg[i], 1, (uint8_t)(i % 2 ? PFX_PRIO_LOW : 0)), 0);
    }
    chk();
    release(r);
    uint32_t n;
    cr_assert_eq(pfx_evict(p, N / 2, &n), 0); /* the odd ones: every other slot */
    cr_assert_eq(n, N / 2);
    chk();
    for (uint32_t i = 0; i < N; i++) {
        uint32_t k = pfx_lookup(p, &h[i], 1, out);
        cr_assert_eq(k, i % 2 ? 0u : 1u, "hash %u", i);
        if (k)
            cr_assert_eq(out[0], pg[i]);
    }
}

Test(pfx_cache, create_fails_cleanly_at_every_allocation) {
    pfx_destroy(p);
    p = NULL;
    for (uint64_t nth = 1;; nth++) {
        struct pfx *q = NULL;
        mem_fail_nth(nth);
        int rc = pfx_create(&cfg, v, &q);
        mem_fail_nth(0);
        if (rc == 0) {
            cr_assert_eq(nth, 6, "create makes 5 allocations, not %lu", (unsigned long)nth - 1);
            pfx_destroy(q);
            break;
        }
        cr_assert_eq(rc, -ENOMEM, "nth %lu: %d", (unsigned long)nth, rc);
        cr_assert_null(q);
        cr_assert_eq(mem_bytes(MEM_PFX), 0, "nth %lu: leaked", (unsigned long)nth);
    }
}

Test(pfx_cache, insert_of_a_new_tenant_fails_cleanly) {
    /* 16 tenants fill the initial tenant table; the 17th needs it doubled. */
    uint32_t r;
    cr_assert_eq(vmm_range_acquire(v, &r), 0);
    cr_assert_eq(vmm_range_grow(v, r, 8 * PT_TPP), 0);
    for (uint32_t t = 0; t < 16; t++)
        cr_assert_eq(pfx_tenant_limit(p, 100 + t, PFX_NO_LIMIT), 0);
    int val = 1;
    struct pfx_hash h;
    chain_of("t", &val, 1, &h);
    uint32_t page = vmm_range_page(v, r, 0);
    for (uint64_t nth = 1; nth <= 2; nth++) {
        struct pfx_stats before, after;
        pfx_stats_get(p, &before);
        uint64_t bytes = mem_bytes(MEM_PFX);
        mem_fail_nth(nth);
        int rc = pfx_insert(p, &h, page, 999, PFX_PRIO_NORMAL);
        mem_fail_nth(0);
        cr_assert_eq(rc, -ENOMEM, "nth %lu: %d", (unsigned long)nth, rc);
        pfx_stats_get(p, &after);
        cr_assert_arr_eq(&before, &after, sizeof before, "nth %lu: stats changed",
                         (unsigned long)nth);
        cr_assert_eq(mem_bytes(MEM_PFX), bytes, "nth %lu: bytes", (unsigned long)nth);
        struct vmm_page_info vi;
        cr_assert_eq(vmm_page_info(v, page, &vi), 0);
        cr_assert_eq(vi.hash_slot, VMM_PAGE_NONE, "nth %lu: page sealed", (unsigned long)nth);
        chk();
    }
    cr_assert_eq(pfx_insert(p, &h, page, 999, PFX_PRIO_NORMAL), 0);
    release(r);
}

/* The spill hook: pfx_evict hands each evicted entry's page to it while vmm
 * holds it SPILLING; the hook reads the bytes. A page restored from those
 * bytes (vmm_page_restore) is inserted under the same hash and shared into a
 * new range that reads the same bytes. Purge and limit evictions never spill. */
struct spill_rec {
    struct vmm *v;
    uint32_t n;
    struct pfx_hash h[4];
    uint8_t bytes[4][4096];
    enum vmm_page_state state_seen;
};

static void spill_hook(void *ctx, const struct pfx_hash *h, uint32_t page, uint32_t tenant,
                       uint8_t prio) {
    struct spill_rec *s = ctx;
    (void)tenant;
    (void)prio;
    cr_assert_lt(s->n, 4);
    s->state_seen = pt_state(s->v, page);
    s->h[s->n] = *h;
    cr_assert_eq(vmm_page_read(s->v, page, s->bytes[s->n]), 0);
    s->n++;
}

Test(pfx_cache, spill_hook_gets_the_bytes_and_a_restore_comes_back) {
    pfx_destroy(p);
    static struct spill_rec rec;
    memset(&rec, 0, sizeof rec);
    rec.v = v;
    cfg.spill = spill_hook;
    cfg.spill_ctx = &rec;
    p = pt_pfx(v, &cfg);
    int vals[2] = {4, 5};
    struct pfx_hash h[2];
    chain_of("t", vals, 2, h);
    release(pt_seq(v, p, h, 2, 7, PFX_PRIO_NORMAL, NULL));
    uint32_t n;
    cr_assert_eq(pfx_evict(p, 2, &n), 0);
    cr_assert_eq(n, 2);
    chk();
    cr_assert_eq(rec.n, 2);
    cr_assert_eq(rec.state_seen, VMM_PAGE_SPILLING);
    cr_assert_eq(memcmp(&rec.h[0], &h[0], sizeof h[0]), 0, "LRU first: page 0");
    for (int i = 0; i < 2; i++)
        for (int b = 0; b < 4096; b++)
            cr_assert_eq(rec.bytes[i][b], h[i].b[0], "spilled page %d byte %d", i, b);
    struct pfx_stats st;
    pfx_stats_get(p, &st);
    cr_assert_eq(st.spills_total, 2);
    cr_assert_eq(st.entries, 0);
    /* restore page 0 and share it */
    uint32_t page, pages[2], r;
    cr_assert_eq(vmm_page_restore(v, rec.bytes[0], &page), 0);
    cr_assert_eq(pfx_insert(p, &h[0], page, 7, PFX_PRIO_NORMAL), 0);
    chk();
    cr_assert_eq(pt_state(v, page), VMM_PAGE_CACHED);
    cr_assert_eq(pfx_lookup(p, h, 2, pages), 1);
    cr_assert_eq(pages[0], page);
    cr_assert_eq(vmm_range_acquire(v, &r), 0);
    cr_assert_eq(vmm_range_share(v, r, page), 0);
    for (int b = 0; b < 4096; b++)
        cr_assert_eq(pt_page_va(v, r, 0)[b], h[0].b[0]);
    release(r);
    /* a purge drops without spilling */
    cr_assert_eq(pfx_purge_tenant(p, 7, &n), 0);
    cr_assert_eq(n, 1);
    cr_assert_eq(rec.n, 2);
    chk();
}

/* pfx_evict_page: a page's entry goes at once when nothing maps it, wherever
 * it sits in the lists; a mapped one stays; a page with no entry says so. */
Test(pfx_cache, evict_page_takes_one_unreferenced_entry) {
    int vals[3] = {4, 5, 6}, uval = 60;
    struct pfx_hash h[3], hu;
    chain_of("t", vals, 3, h);
    chain_of("t", &uval, 1, &hu);
    uint32_t ru = pt_seq(v, p, &hu, 1, 1, PFX_PRIO_HIGH, NULL);
    uint32_t upage = vmm_range_page(v, ru, 0);
    release(ru);
    uint32_t r = pt_seq(v, p, h, 3, 1, PFX_PRIO_NORMAL, NULL);
    uint32_t busy = vmm_range_page(v, r, 0);
    cr_assert_eq(pfx_evict_page(p, busy), -EBUSY);
    cr_assert_eq(pt_state(v, busy), VMM_PAGE_MAPPED);
    cr_assert_eq(pfx_evict_page(p, upage), 0);
    cr_assert_eq(pt_state(v, upage), VMM_PAGE_FREE);
    cr_assert_eq(pfx_evict_page(p, upage), -ENOENT, "gone from the index");
    cr_assert_eq(pfx_evict_page(p, 1u << 30), -ENOENT);
    struct pfx_stats s;
    pfx_stats_get(p, &s);
    cr_assert_eq(s.entries, 3);
    cr_assert_eq(s.evictions_total, 1);
    chk();
    release(r);
}
