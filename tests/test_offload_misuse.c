/* The KV tiers under hostile use of the engine API: purges while the
 * tenant's requests run or wait with pinned (restored) hits, cancels of
 * restored requests, eviction-log reads at the edges, a close right after
 * submit, a page larger than the host tier. Every greedy output must equal
 * the run without any cache; pages must all come back (free or cached).
 * stories260K, f32 KV (16 tokens, 20 KiB a page). */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/lib/offload_util.h"

TestSuite(offload_misuse, .init = setup, .fini = teardown, .timeout = 120);

/* A 320-token document (20 pages) + 16 tokens of a question. */
static void doc_job(struct job *j, unsigned q_seed, uint32_t tenant) {
    memset(j, 0, sizeof *j);
    fill(j->prompt, 0, 320, 77);
    j->n_prompt = 336;
    fill(j->prompt, 320, 336, q_seed);
    j->max_tokens = 16;
    j->tenant = tenant;
}

static void solo(struct job *j, int n) {
    struct llmd_engine *e = open_engine(&(struct eng_opts){.max_seqs = 1, .no_cache = true});
    for (int i = 0; i < n; i++) {
        struct job c = j[i];
        submit(e, &c);
        run(e);
        cr_assert_eq(c.n_out, c.max_tokens);
        memcpy(j[i].out, c.out, sizeof c.out);
        j[i].n_out = c.n_out;
    }
    llmd_engine_close(e);
}

static void expect_same(const struct job *want, const struct job *got, const char *what) {
    cr_assert_eq(got->finish, LLMD_FINISH_LENGTH, "%s: finish %d", what, got->finish);
    cr_assert_eq(got->n_out, want->n_out, "%s: %u tokens", what, got->n_out);
    for (uint32_t k = 0; k < want->n_out; k++)
        cr_assert_eq(got->out[k], want->out[k], "%s: token %u: %d, alone %d", what, k, got->out[k],
                     want->out[k]);
}

/* A request of tenant 1 waits with its 20 restored-or-cached hits pinned
 * while tenant 1 is purged: it must still produce the solo output, and the
 * purge must leave nothing of tenant 1 that a later request could hit. */
Test(offload_misuse, purge_while_a_request_waits_with_pinned_hits) {
    static struct job a, b, c, want;
    doc_job(&a, 1, 1);
    doc_job(&b, 2, 1);
    doc_job(&c, 3, 1);
    want = b;
    solo(&want, 1);
    struct llmd_engine *e =
        open_engine(&(struct eng_opts){.max_seqs = 1, .kv_pages = 64, .host_bytes = 4u << 20});
    submit(e, &a);
    run(e);
    submit(e, &b);
    cr_assert_eq(stats(e).prefix_hit_tokens_total, 0, "not admitted yet");
    struct llmd_purge_counts pc;
    cr_assert_eq(llmd_tenant_purge(e, 1, &pc), 0);
    cr_assert_eq(pc.device_pages, 21, "a's 21 full pages");
    run(e);
    expect_same(&want, &b, "waiting through a purge");
    cr_assert_eq(b.usage.cached_tokens, 0, "b was admitted with purged pages");
    /* b lived through the purge: what it computed stays private */
    submit(e, &c);
    run(e);
    cr_assert_eq(c.usage.cached_tokens, 0);
    llmd_engine_close(e);
}

/* Tenant 1 is purged while its request is half way through a chunked
 * prefill: the output is unchanged, and the pages it computes after the
 * purge do not enter the cache (a second purge finds nothing: before the
 * fix it found 13 pages of tenant 1, which could then spill to NVMe). */
Test(offload_misuse, purge_while_a_request_prefills) {
    static struct job a, b, want;
    doc_job(&a, 1, 1);
    doc_job(&b, 2, 1);
    want = a;
    solo(&want, 1);
    struct llmd_engine *e = open_engine(&(struct eng_opts){
        .max_seqs = 1, .kv_pages = 64, .host_bytes = 4u << 20, .max_batched = 64});
    submit(e, &a);
    for (int i = 0; i < 2; i++)
        cr_assert_gt(llmd_engine_step(e), 0);
    struct llmd_purge_counts pc;
    cr_assert_eq(llmd_tenant_purge(e, 1, &pc), 0);
    cr_assert_eq(pc.device_pages, 8, "two chunks of 64 tokens");
    run(e);
    expect_same(&want, &a, "prefilling through a purge");
    cr_assert_eq(llmd_tenant_purge(e, 1, &pc), 0);
    cr_assert_eq(pc.device_pages + pc.host_pages + pc.nvme_pages, 0,
                 "pages computed after the purge were cached: device %u host %u nvme %u",
                 pc.device_pages, pc.host_pages, pc.nvme_pages);
    submit(e, &b);
    run(e);
    cr_assert_eq(b.usage.cached_tokens, 0);
    cr_assert_eq(stats(e).prefix_hit_tokens_total, 0);
    llmd_engine_close(e);
}

/* More waiting requests than one step looks up again (64): the purge must
 * still reach the oldest ones, which the scheduler admits first (before the
 * fix the first in line was admitted with the 20 purged pages). */
Test(offload_misuse, purge_reaches_every_waiting_request) {
    enum { N = 66 };
    static struct job a, w[N], want;
    doc_job(&a, 1, 1);
    a.n_prompt = 80; /* a short document: 66 requests prefill it */
    doc_job(&want, 2, 1);
    want.n_prompt = 80;
    fill(want.prompt, 64, 80, 2);
    want.max_tokens = 2;
    solo(&want, 1);
    struct llmd_engine *e =
        open_engine(&(struct eng_opts){.max_seqs = 1, .kv_pages = 64, .host_bytes = 4u << 20});
    submit(e, &a);
    run(e);
    for (int i = 0; i < N; i++) {
        w[i] = want;
        submit(e, &w[i]);
    }
    struct llmd_purge_counts pc;
    cr_assert_eq(llmd_tenant_purge(e, 1, &pc), 0);
    cr_assert_eq(pc.device_pages, 5);
    run(e);
    for (int i = 0; i < N; i++) {
        cr_assert_eq(w[i].usage.cached_tokens, 0, "request %d hit %u purged tokens", i,
                     w[i].usage.cached_tokens);
        cr_assert_eq(w[i].n_out, 2);
        cr_assert_arr_eq(w[i].out, want.out, 2 * sizeof(int32_t));
    }
    cr_assert_eq(stats(e).prefix_hit_tokens_total, 0);
    llmd_engine_close(e);
}

/* Host tiers far beyond the machine are refused at once, saying why: 30000
 * GiB once made ofl_create size its index in a loop that never ended (the
 * page count doubled past 2^31 in 32 bits), and 100000 GiB failed with a
 * bare "Cannot allocate memory". */
Test(offload_misuse, huge_host_tier_is_refused_at_once, .timeout = 20) {
    static const uint64_t gib[] = {30000, 100000, 16000000};
    for (size_t i = 0; i < sizeof gib / sizeof gib[0]; i++) {
        struct llmd_engine_config cfg = {.model = F32,
                                         .n_threads = 1,
                                         .n_ctx = 256,
                                         .kv_type = LLMD_KV_F32,
                                         .prefix_secret = secret_path,
                                         .host_tier_bytes = gib[i] << 30};
        struct llmd_engine *e = NULL;
        char err[512] = "";
        int rc = llmd_engine_open(&cfg, &e, err, sizeof err);
        cr_assert_eq(rc, -ENOMEM, "%lu GiB: %d %s", (unsigned long)gib[i], rc, err);
        cr_assert(strstr(err, "host tier: budget of"), "%lu GiB: %s", (unsigned long)gib[i], err);
    }
}

/* The eviction log at its edges: max 0 (out may be NULL) reads nothing and
 * moves nothing; lost may be NULL; a cursor past the newest event (kept
 * from an engine that has since restarted) reads the log from its start,
 * where it used to read nothing until the new log caught up with it. */
Test(offload_misuse, eviction_log_reads_at_the_edges) {
    static struct job a, b;
    doc_job(&a, 1, 0);
    doc_job(&b, 2, 0);
    b.prompt[1] = 400; /* another document: a's pages must spill to make room */
    struct llmd_engine *e =
        open_engine(&(struct eng_opts){.max_seqs = 1, .kv_pages = 24, .host_bytes = 4u << 20});
    submit(e, &a);
    run(e);
    submit(e, &b);
    run(e);
    struct llmd_stats st = stats(e);
    cr_assert_gt(st.spills_host_total, 0);
    uint64_t cursor = 0, lost = 99;
    cr_assert_eq(llmd_evictions_read(e, &cursor, NULL, 0, &lost), 0);
    cr_assert_eq(cursor, 0);
    cr_assert_eq(lost, 0);
    static struct llmd_eviction ev[256];
    uint32_t n = llmd_evictions_read(e, &cursor, ev, 256, NULL);
    cr_assert_eq(n, st.spills_host_total, "one event per spill");
    cr_assert_eq(cursor, n);
    for (uint32_t i = 0; i < n; i++) {
        cr_assert_eq(ev[i].seq, i + 1);
        cr_assert_eq(ev[i].bytes, PAGE);
        cr_assert_str_eq(ev[i].reason, "evict");
    }
    /* one at a time, from the middle */
    uint64_t c2 = n / 2;
    cr_assert_eq(llmd_evictions_read(e, &c2, ev, 1, NULL), 1);
    cr_assert_eq(ev[0].seq, n / 2 + 1);
    cr_assert_eq(c2, n / 2 + 1);
    /* a cursor from an earlier engine */
    uint64_t ahead = 1000000;
    cr_assert_eq(llmd_evictions_read(e, &ahead, ev, 256, &lost), n);
    cr_assert_eq(ev[0].seq, 1);
    cr_assert_eq(ahead, n);
    cr_assert_eq(lost, 0);
    llmd_engine_close(e);
}

/* A request whose hits were restored from the host tier at submission is
 * cancelled before it runs: its pins go, the restored pages stay cached
 * (a resubmission hits them on the device), nothing stays mapped. */
Test(offload_misuse, cancel_of_a_restored_request) {
    static struct job a, b, c, want;
    doc_job(&a, 1, 0);
    doc_job(&b, 2, 0);
    b.prompt[1] = 400; /* another document: a's pages spill to make room */
    doc_job(&c, 3, 0);
    want = c;
    solo(&want, 1);
    struct llmd_engine *e =
        open_engine(&(struct eng_opts){.max_seqs = 1, .kv_pages = 24, .host_bytes = 4u << 20});
    submit(e, &a);
    run(e);
    submit(e, &b);
    run(e);
    struct llmd_stats s0 = stats(e);
    cr_assert_geq(s0.host_tier_pages, 20, "a's document is in the host tier");
    submit(e, &c);
    struct llmd_stats s1 = stats(e);
    cr_assert_eq(s1.restores_host_total - s0.restores_host_total, 20, "restored at submission");
    cr_assert_eq(s1.restored_tokens_total, 320);
    cr_assert_eq(llmd_cancel(e, c.id), 0);
    cr_assert_eq(c.finish, LLMD_FINISH_CANCELLED);
    cr_assert_eq(c.n_out, 0);
    struct llmd_stats s2 = stats(e);
    cr_assert_eq(s2.kv_pages_free + s2.kv_pages_cached, s2.kv_pages_total);
    cr_assert_eq(s2.requests_waiting + s2.requests_running, 0);
    cr_assert_eq(llmd_cancel(e, c.id), -ENOENT);
    submit(e, &c);
    run(e);
    expect_same(&want, &c, "resubmitted after a cancel");
    cr_assert_eq(c.usage.cached_tokens, 320, "the restored pages stayed cached");
    cr_assert_eq(c.usage.restored_tokens, 0, "on the device already");
    cr_assert_eq(stats(e).restores_host_total, s1.restores_host_total);
    llmd_engine_close(e);
}

/* The engine is closed right after a submission whose hits came from NVMe,
 * before any step: the flush at close must leave a tier the next process
 * restores from, and the output must not change. */
Test(offload_misuse, close_right_after_submit_with_nvme) {
    static struct job a, b, want;
    doc_job(&a, 1, 0);
    doc_job(&b, 2, 0);
    want = b;
    solo(&want, 1);
    struct eng_opts o = {
        .max_seqs = 2, .kv_pages = 48, .host_bytes = 1, .nvme = true, .nvme_bytes = 64 * PAGE};
    struct llmd_engine *e = open_engine(&o);
    submit(e, &a);
    run(e);
    llmd_engine_close(e);
    for (int round = 0; round < 2; round++) {
        e = open_engine(&o);
        submit(e, &b);
        cr_assert_eq(stats(e).restores_nvme_total, 20, "round %d", round);
        llmd_engine_close(e); /* b never ran: no callback */
        cr_assert_eq(b.n_out, 0);
    }
    e = open_engine(&o);
    submit(e, &b);
    run(e);
    expect_same(&want, &b, "after two closes right after submit");
    cr_assert_eq(b.usage.restored_tokens, 320);
    struct llmd_stats st = stats(e);
    cr_assert_eq(st.offload_checksum_failures_total, 0);
    cr_assert_eq(st.offload_write_failures_total, 0);
    llmd_engine_close(e);
}

/* Faults under a running engine: the slot file is cut to nothing, or
 * unlinked, after the tier opened. Cut: the first restore fails (a short
 * read), the prefix is recomputed, the output never changes, and the next
 * process finds the tier whole again. Unlinked: the open descriptor keeps
 * the data, restores go on. */
Test(offload_misuse, slot_file_cut_or_removed_while_running) {
    static struct job a, b, c, want, want_c;
    doc_job(&a, 1, 0);
    doc_job(&b, 2, 0);
    doc_job(&c, 3, 0);
    want = b;
    want_c = c;
    solo(&want, 1);
    solo(&want_c, 1);
    struct eng_opts o = {
        .max_seqs = 2, .kv_pages = 48, .host_bytes = 1, .nvme = true, .nvme_bytes = 64 * PAGE};
    char idx[160];
    snprintf(idx, sizeof idx, "%s.idx", nvme_path);
    for (int mode = 0; mode < 2; mode++) {
        unlink(nvme_path); /* each mode on a new tier */
        unlink(idx);
        struct llmd_engine *e = open_engine(&o);
        submit(e, &a);
        run(e);
        llmd_engine_close(e); /* a's 21 pages go down to NVMe */
        e = open_engine(&o);
        if (mode == 0)
            cr_assert_eq(truncate(nvme_path, 0), 0);
        else
            cr_assert_eq(unlink(nvme_path), 0);
        b.n_out = 0;
        submit(e, &b);
        run(e);
        expect_same(&want, &b, mode == 0 ? "slot file cut" : "slot file unlinked");
        struct llmd_stats st = stats(e);
        cr_log_info("mode %d: nvme restores %lu, drops %lu, checksum failures %lu", mode,
                    (unsigned long)st.restores_nvme_total, (unsigned long)st.offload_drops_total,
                    (unsigned long)st.offload_checksum_failures_total);
        if (mode == 0) {
            cr_assert_eq(st.restores_nvme_total, 0, "nothing is left to restore");
            cr_assert_eq(b.usage.restored_tokens, 0);
            cr_assert_geq(st.offload_drops_total, 1, "the failed restore dropped its entry");
            /* the recomputed pages replace the stale copies at close: the next process
             * restores the whole document (it used to get one page more per restart,
             * each stale copy refusing the good page and then failing its checksum) */
            llmd_engine_close(e);
            e = open_engine(&o);
            submit(e, &c);
            run(e);
            expect_same(&want_c, &c, "after the cut");
            cr_assert_eq(c.usage.restored_tokens, 320);
            cr_assert_eq(stats(e).offload_checksum_failures_total, 0);
        } else {
            /* the open descriptor keeps the data: restores still work */
            cr_assert_eq(b.usage.restored_tokens, 320);
        }
        llmd_engine_close(e);
    }
}

/* A full NVMe tier keeps every entry across a restart: the start-up
 * bandwidth probe writes only into free slots (it used to evict 4 cached
 * pages at every start to make room for its own). */
Test(offload_misuse, restart_on_a_full_nvme_tier_keeps_its_entries) {
    static struct job a;
    doc_job(&a, 1, 0);
    struct eng_opts o = {
        .max_seqs = 1, .kv_pages = 48, .host_bytes = 1, .nvme = true, .nvme_bytes = 8 * PAGE};
    struct llmd_engine *e = open_engine(&o);
    submit(e, &a);
    run(e);
    llmd_engine_close(e);
    for (int round = 0; round < 2; round++) {
        e = open_engine(&o);
        struct llmd_stats st = stats(e);
        cr_assert_eq(st.nvme_tier_pages, 8, "round %d: %lu pages held after the start", round,
                     (unsigned long)st.nvme_tier_pages);
        llmd_engine_close(e);
    }
}
