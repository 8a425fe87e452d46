/* The tiers below the device pool in the engine (issue 5 acceptance):
 * spills and restores never change a token, cached prefixes survive a
 * restart through the NVMe tier, a corrupted slot is refused and recomputed,
 * a full disk stops NVMe spills without hurting service, and a purge removes
 * a tenant from every tier. stories260K, greedy, f32 KV (16 tokens, 20 KiB a
 * page). Tier files live in a fresh temporary directory per test. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/lib/offload_util.h"

TestSuite(offload_engine, .init = setup, .fini = teardown, .timeout = 300);

/* 32 requests over 4 shared 192-token prefixes (12 pages each), 8..40 own
 * tokens each, 12 generated: prefixes interleave so each is evicted before
 * its next user comes. */
enum { N_JOBS = 32 };
static void make_jobs(struct job *j) {
    for (int i = 0; i < N_JOBS; i++) {
        memset(&j[i], 0, sizeof j[i]);
        fill(j[i].prompt, 0, 192, 100 + (unsigned)(i % 4));
        j[i].n_prompt = 192 + 8 + (uint32_t)(i * 7 % 33);
        fill(j[i].prompt, 192, j[i].n_prompt, 500 + (unsigned)i);
        j[i].max_tokens = 12;
    }
}

static void solo(struct job *j, int n) {
    struct llmd_engine *e = open_engine(&(struct eng_opts){.max_seqs = 1, .no_cache = true});
    for (int i = 0; i < n; i++) {
        submit(e, &j[i]);
        run(e);
        cr_assert_eq(j[i].n_out, j[i].max_tokens);
    }
    llmd_engine_close(e);
}

static void expect_same(const struct job *a, const struct job *b, int n, const char *what) {
    for (int i = 0; i < n; i++) {
        cr_assert_eq(b[i].finish, LLMD_FINISH_LENGTH, "%s: job %d finish %d", what, i, b[i].finish);
        cr_assert_eq(b[i].n_out, a[i].n_out, "%s: job %d: %u tokens", what, i, b[i].n_out);
        for (uint32_t k = 0; k < a[i].n_out; k++)
            cr_assert_eq(b[i].out[k], a[i].out[k], "%s: job %d token %u: %d, alone %d", what, i, k,
                         b[i].out[k], a[i].out[k]);
    }
}

/* In waves of 8 (4 running at once) so prefixes come back after eviction. */
static void run_jobs(struct llmd_engine *e, struct job *j) {
    for (int w = 0; w < N_JOBS; w += 8) {
        for (int i = w; i < w + 8; i++)
            submit(e, &j[i]);
        run(e);
    }
}

Test(offload_engine, spills_to_host_never_change_a_token) {
    static struct job alone[N_JOBS], tiered[N_JOBS];
    make_jobs(alone);
    solo(alone, N_JOBS);
    make_jobs(tiered);
    /* 60 device pages: 4 running requests need ~56; the 4 prefixes 48 more */
    struct llmd_engine *e =
        open_engine(&(struct eng_opts){.max_seqs = 4, .kv_pages = 60, .host_bytes = 8u << 20});
    run_jobs(e, tiered);
    expect_same(alone, tiered, N_JOBS, "host tier");
    struct llmd_stats st = stats(e);
    cr_log_info("spills %lu restores %lu restored tokens %lu hits %lu preemptions %lu",
                (unsigned long)st.spills_host_total, (unsigned long)st.restores_host_total,
                (unsigned long)st.restored_tokens_total, (unsigned long)st.prefix_hit_tokens_total,
                (unsigned long)st.preemptions_total);
    cr_assert_gt(st.spills_host_total, 0, "a small device pool must spill");
    cr_assert_gt(st.restores_host_total, 0, "evicted prefixes must come back from the host");
    cr_assert_eq(st.restored_tokens_total, st.restores_host_total * TPP);
    cr_assert_eq(st.spill_bytes_host_total, st.spills_host_total * PAGE);
    cr_assert_eq(st.offload_drops_total, 0, "8 MiB holds every spilled page");
    uint32_t restored = 0;
    for (int i = 0; i < N_JOBS; i++)
        restored += tiered[i].usage.restored_tokens;
    cr_assert_gt(restored, 0, "per-request usage shows the restored tokens");
    /* the eviction log saw every move */
    static struct llmd_eviction ev[4096];
    uint64_t cursor = 0, lost = 0, n_spill = 0, n_hit = 0;
    uint32_t n = llmd_evictions_read(e, &cursor, ev, 4096, &lost);
    for (uint32_t i = 0; i < n; i++) {
        n_spill += ev[i].from == LLMD_TIER_DEVICE && ev[i].to == LLMD_TIER_HOST;
        n_hit += strcmp(ev[i].reason, "hit") == 0;
    }
    cr_assert_eq(lost, 0);
    cr_assert_eq(n_spill, st.spills_host_total);
    cr_assert_eq(n_hit, st.restores_host_total);
    cr_assert_eq(llmd_evictions_read(e, &cursor, ev, 4096, NULL), 0, "nothing new");
    llmd_engine_close(e);
}

Test(offload_engine, spills_through_host_to_nvme_never_change_a_token) {
    static struct job alone[N_JOBS], tiered[N_JOBS];
    make_jobs(alone);
    solo(alone, N_JOBS);
    make_jobs(tiered);
    /* a host tier of ~12 pages: most spills go on down to NVMe */
    struct llmd_engine *e = open_engine(&(struct eng_opts){.max_seqs = 4,
                                                           .kv_pages = 60,
                                                           .host_bytes = 12 * PAGE,
                                                           .nvme = true,
                                                           .nvme_bytes = 16u << 20});
    run_jobs(e, tiered);
    expect_same(alone, tiered, N_JOBS, "host + NVMe tiers");
    struct llmd_stats st = stats(e);
    cr_log_info("host spills %lu restores %lu, nvme spills %lu restores %lu",
                (unsigned long)st.spills_host_total, (unsigned long)st.restores_host_total,
                (unsigned long)st.spills_nvme_total, (unsigned long)st.restores_nvme_total);
    cr_assert_gt(st.spills_nvme_total, 0, "a small host tier must demote to NVMe");
    cr_assert_gt(st.restores_nvme_total, 0, "pages must come back from NVMe");
    cr_assert_eq(st.offload_checksum_failures_total, 0);
    cr_assert_eq(st.offload_write_failures_total, 0);
    llmd_engine_close(e);
}

/* A 400-token prefix (25 pages) + 20 tokens of a question. */
static void rag_job(struct job *j, unsigned q_seed, uint32_t tenant) {
    memset(j, 0, sizeof *j);
    fill(j->prompt, 0, 400, 77);
    j->n_prompt = 420;
    fill(j->prompt, 400, 420, q_seed);
    j->max_tokens = 16;
    j->tenant = tenant;
}

static const struct eng_opts restart_opts = {
    .max_seqs = 2, .kv_pages = 64, .host_bytes = 4u << 20, .nvme = true, .nvme_bytes = 16u << 20};

/* Process 1 serves the prefix and closes (its cached pages go down to
 * NVMe); process 2 on the same model, key and slot file prefills at most a
 * page's worth of the prefix. */
Test(offload_engine, cached_prefix_survives_a_restart_through_nvme) {
    static struct job a, b, b0;
    rag_job(&a, 1, 0);
    rag_job(&b, 2, 0);
    b0 = b;
    solo(&b0, 1);
    struct llmd_engine *e = open_engine(&restart_opts);
    submit(e, &a);
    run(e);
    llmd_engine_close(e);

    e = open_engine(&restart_opts);
    struct llmd_stats s0 = stats(e);
    cr_assert_eq(s0.prefill_tokens_total, 0);
    submit(e, &b);
    run(e);
    struct llmd_stats s1 = stats(e);
    cr_log_info("after restart: prefilled %lu, restored %lu tokens, nvme restores %lu",
                (unsigned long)s1.prefill_tokens_total, (unsigned long)s1.restored_tokens_total,
                (unsigned long)s1.restores_nvme_total);
    cr_assert_leq(s1.prefill_tokens_total, TPP + 20, "prefilled %lu",
                  (unsigned long)s1.prefill_tokens_total);
    cr_assert_geq(s1.restores_nvme_total, 400 / TPP);
    cr_assert_eq(b.usage.restored_tokens, (400 / TPP) * TPP);
    cr_assert_arr_eq(b.out, b0.out, sizeof(int32_t) * 16, "a restored prefix changed a token");
    llmd_engine_close(e);
}

/* Slot stride on disk: a page rounded up to 4 KiB. */
#define STRIDE ((PAGE + 4095u) / 4096u * 4096u)

/* Flip one byte in every slot that holds data: the restore is refused at the
 * first page, the prefix is recomputed, the output is unchanged. */
Test(offload_engine, corrupted_slot_is_refused_and_recomputed) {
    static struct job a, b, b0;
    rag_job(&a, 1, 0);
    rag_job(&b, 2, 0);
    b0 = b;
    solo(&b0, 1);
    struct llmd_engine *e = open_engine(&restart_opts);
    submit(e, &a);
    run(e);
    llmd_engine_close(e);

    int fd = open(nvme_path, O_RDWR);
    cr_assert_geq(fd, 0);
    struct stat sb;
    cr_assert_eq(fstat(fd, &sb), 0);
    static uint8_t slot[STRIDE];
    uint32_t flipped = 0;
    for (off_t off = 0; off + STRIDE <= sb.st_size; off += STRIDE) {
        cr_assert_eq(pread(fd, slot, STRIDE, off), (ssize_t)STRIDE);
        bool any = false;
        for (uint32_t i = 0; i < STRIDE && !any; i++)
            any = slot[i] != 0;
        if (!any)
            continue;
        slot[1000] ^= 0x5a;
        cr_assert_eq(pwrite(fd, slot, STRIDE, off), (ssize_t)STRIDE);
        flipped++;
    }
    close(fd);
    cr_assert_geq(flipped, 400 / TPP, "slots with data: %u", flipped);

    e = open_engine(&restart_opts);
    submit(e, &b);
    run(e);
    struct llmd_stats st = stats(e);
    cr_assert_eq(st.offload_checksum_failures_total, 1, "one refused restore ends the run");
    cr_assert_eq(st.restores_nvme_total, 0);
    cr_assert_geq(st.prefill_tokens_total, 420, "the whole prompt recomputed");
    cr_assert_arr_eq(b.out, b0.out, sizeof(int32_t) * 16, "a corrupt slot changed a token");
    llmd_engine_close(e);
}

/* The slot file may not grow past 41 pages (RLIMIT_FSIZE; SIGXFSZ ignored):
 * NVMe writes past it fail with EFBIG, spills to NVMe stop, service goes on.
 * A 1-byte host tier holds one page (its index is sized from the bytes asked
 * for, though its region is 2 MiB), so every spill overflows into NVMe. */
Test(offload_engine, full_disk_stops_nvme_spills_not_service) {
    static struct job alone[N_JOBS], tiered[N_JOBS];
    make_jobs(alone);
    solo(alone, N_JOBS);
    make_jobs(tiered);
    /* The limit lets the device pool's memfd (40 pages) be made, refuses
     * the slot file's preallocation (it stays sparse) and fails every slot
     * write past slot 40. */
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit rl = {.rlim_cur = 41 * PAGE + 4096, .rlim_max = RLIM_INFINITY};
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &rl), 0);
    struct llmd_engine *e = open_engine(&(struct eng_opts){
        .max_seqs = 2, .kv_pages = 40, .host_bytes = 1, .nvme = true, .nvme_bytes = 16u << 20});
    run_jobs(e, tiered);
    expect_same(alone, tiered, N_JOBS, "disk full");
    struct llmd_stats st = stats(e);
    cr_log_info("nvme spills %lu, write failures %lu, drops %lu",
                (unsigned long)st.spills_nvme_total, (unsigned long)st.offload_write_failures_total,
                (unsigned long)st.offload_drops_total);
    cr_assert_gt(st.offload_write_failures_total, 0, "writes past the limit must fail");
    cr_assert_gt(st.offload_drops_total, 0);
    llmd_engine_close(e);
    rl.rlim_cur = RLIM_INFINITY;
    setrlimit(RLIMIT_FSIZE, &rl);
}

static uint8_t *read_all(const char *path, size_t *len) {
    int fd = open(path, O_RDONLY);
    cr_assert_geq(fd, 0);
    struct stat sb;
    cr_assert_eq(fstat(fd, &sb), 0);
    uint8_t *b = malloc((size_t)sb.st_size);
    cr_assert_not_null(b);
    cr_assert_eq(pread(fd, b, (size_t)sb.st_size, 0), sb.st_size);
    close(fd);
    *len = (size_t)sb.st_size;
    return b;
}

static bool all_zero(const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (p[i])
            return false;
    return true;
}

/* Tenants A (1) and B (2) each cache their own copy of the document, down to
 * NVMe (close flushes) and partly in the host tier; purging A removes it from
 * every tier: A's prompt hits nothing after, B's still hits, and the slots
 * that held A's pages are zero. */
Test(offload_engine, purge_removes_a_tenant_from_every_tier) {
    static struct job a, b;
    rag_job(&a, 1, 1);
    rag_job(&b, 2, 2);
    struct llmd_engine *e = open_engine(&restart_opts);
    submit(e, &a);
    submit(e, &b);
    run(e);
    llmd_engine_close(e); /* everything goes down to NVMe */
    size_t n0;
    uint8_t *before = read_all(nvme_path, &n0);

    e = open_engine(&restart_opts);
    struct llmd_purge_counts pc;
    cr_assert_eq(llmd_tenant_purge(e, 1, &pc), 0);
    cr_log_info("purged: device %u host %u nvme %u", pc.device_pages, pc.host_pages, pc.nvme_pages);
    cr_assert_geq(pc.nvme_pages, 400 / TPP);
    size_t n1;
    uint8_t *after = read_all(nvme_path, &n1);
    cr_assert_eq(n0, n1);
    uint32_t zeroed = 0, kept = 0;
    for (size_t off = 0; off + STRIDE <= n0; off += STRIDE) {
        if (all_zero(before + off, STRIDE))
            continue;
        if (all_zero(after + off, STRIDE))
            zeroed++;
        else
            kept += memcmp(before + off, after + off, STRIDE) == 0;
    }
    cr_assert_eq(zeroed, pc.nvme_pages, "every purged slot is zero: %u of %u", zeroed,
                 pc.nvme_pages);
    cr_assert_geq(kept, 400 / TPP, "B's slots untouched: %u", kept);
    free(before);
    free(after);
    /* the log says so */
    static struct llmd_eviction ev[256];
    uint64_t cursor = 0;
    uint32_t n = llmd_evictions_read(e, &cursor, ev, 256, NULL), purges = 0;
    for (uint32_t i = 0; i < n; i++) {
        purges += strcmp(ev[i].reason, "purge") == 0 && ev[i].tenant == 1;
        if (strcmp(ev[i].reason, "purge") == 0)
            cr_assert_eq(ev[i].bytes, 0, "a purge copies nothing (it said %u)", ev[i].bytes);
    }
    cr_assert_gt(purges, 0);

    struct job a2 = a, b2 = b;
    rag_job(&a2, 3, 1);
    rag_job(&b2, 4, 2);
    submit(e, &a2);
    run(e);
    struct llmd_stats s1 = stats(e);
    cr_assert_eq(s1.prefix_hit_tokens_total, 0, "A hits nothing after its purge");
    cr_assert_eq(a2.usage.cached_tokens, 0);
    submit(e, &b2);
    run(e);
    cr_assert_eq(b2.usage.cached_tokens, 400, "B still hits its 25 pages: %u",
                 b2.usage.cached_tokens);
    cr_assert_eq(b2.usage.restored_tokens, 400);
    llmd_engine_close(e);
}

Test(offload_engine, bad_tier_configs_are_refused_clearly) {
    struct llmd_engine_config cfg = {
        .model = F32, .n_ctx = 256, .kv_type = LLMD_KV_F32, .nvme_tier_path = nvme_path};
    struct llmd_engine *e = NULL;
    char err[512] = "";
    cr_assert_eq(llmd_engine_open(&cfg, &e, err, sizeof err), -EINVAL);
    cr_assert(strstr(err, "host tier"), "%s", err);
    cfg.host_tier_bytes = 1 << 20;
    cfg.no_prefix_cache = 1;
    cr_assert_eq(llmd_engine_open(&cfg, &e, err, sizeof err), -EINVAL);
    cr_assert(strstr(err, "prefix cache"), "%s", err);
    cfg.no_prefix_cache = 0;
    cfg.nvme_tier_path = "/nonexistent-dir/kv.slots";
    int rc = llmd_engine_open(&cfg, &e, err, sizeof err);
    cr_assert_lt(rc, 0);
    cr_assert(strstr(err, "/nonexistent-dir/kv.slots"), "the message names the path: %s", err);
}

/* Preemption by spill: 16 requests generating 60 tokens each (admission
 * reserves their prompts; decode outgrows the pool) on a third of their
 * demand. Preempted requests keep their computed pages (in
 * the cache, spilled to the host tier when evicted) and restore them on
 * resume, so they prefill fewer tokens than the same run without tiers;
 * outputs equal solo runs either way. */
Test(offload_engine, preemption_spills_and_restores_the_victims_pages) {
    enum { N = 16 };
    static struct job alone[N], plain[N], tiered[N];
    for (int i = 0; i < N; i++) {
        memset(&alone[i], 0, sizeof alone[i]);
        alone[i].n_prompt = 33 + (uint32_t)(i * 13 % 30);
        fill(alone[i].prompt, 0, alone[i].n_prompt, 900 + (unsigned)i);
        alone[i].max_tokens = 60;
        plain[i] = tiered[i] = alone[i];
    }
    solo(alone, N);
    uint32_t demand = 0;
    for (int i = 0; i < N; i++)
        demand += (alone[i].n_prompt + alone[i].max_tokens + TPP - 1) / TPP;
    struct eng_opts o = {.max_seqs = 8, .kv_pages = demand / 3};
    struct llmd_engine *e = open_engine(&o);
    for (int i = 0; i < N; i++)
        submit(e, &plain[i]);
    run(e);
    struct llmd_stats sp = stats(e);
    llmd_engine_close(e);
    o.host_bytes = 8u << 20;
    e = open_engine(&o);
    for (int i = 0; i < N; i++)
        submit(e, &tiered[i]);
    run(e);
    struct llmd_stats st = stats(e);
    llmd_engine_close(e);
    expect_same(alone, plain, N, "preempted, no tiers");
    expect_same(alone, tiered, N, "preempted, host tier");
    cr_log_info("pool %u pages: preemptions %lu / %lu, prefill %lu / %lu tokens, host spills %lu "
                "restores %lu",
                o.kv_pages, (unsigned long)sp.preemptions_total,
                (unsigned long)st.preemptions_total, (unsigned long)sp.prefill_tokens_total,
                (unsigned long)st.prefill_tokens_total, (unsigned long)st.spills_host_total,
                (unsigned long)st.restores_host_total);
    cr_assert_gt(st.preemptions_total, 0, "a third of the demand must preempt");
    cr_assert_gt(st.spills_host_total, 0);
    cr_assert_gt(st.restores_host_total, 0, "resumed requests restore their pages");
    cr_assert_lt(st.prefill_tokens_total, sp.prefill_tokens_total, "restoring must save recompute");
}

/* The KV type is part of the model fingerprint, so of every page hash and
 * every NVMe index record: a restart with another KV type never restores
 * the pages of the first (they hold other bytes), while a restart with the
 * same type does. On dummy:tiny-256 (2 kv heads x 64) a q8_0 row and an
 * fp8 row are both 136 B (4 blocks of 34; 2 x (4 + 64)), so the two types
 * have the same token stride (1,088 B), page (69,632 B, 64 tokens) and
 * hence page tokens: only the fingerprint tells their pages apart (without
 * it, this test fails: fp8 restores q8_0's bytes). The quantized pages
 * travel through the host and NVMe tiers as plain bytes and come back to
 * give the same tokens. */
static struct llmd_engine *open_kv(enum llmd_kv_type t, bool tiers) {
    struct llmd_engine_config cfg = {.model = "dummy:tiny-256",
                                     .n_threads = 2,
                                     .n_ctx = 512,
                                     .max_seqs = 1,
                                     .kv_type = t,
                                     .no_prefix_cache = !tiers,
                                     .prefix_secret = secret_path,
                                     .host_tier_bytes = tiers ? 1u << 20 : 0,
                                     .nvme_tier_path = tiers ? nvme_path : NULL,
                                     .nvme_tier_bytes = 8u << 20,
                                     .offload_always = 1};
    struct llmd_engine *e;
    char err[512] = "";
    cr_assert_eq(llmd_engine_open(&cfg, &e, err, sizeof err), 0, "open %s: %s",
                 llmd_kv_type_name(t), err);
    struct llmd_engine_info in;
    llmd_engine_info_get(e, &in);
    cr_assert_eq(in.kv_token_bytes, 1088, "%s: %llu B a token", llmd_kv_type_name(t),
                 (unsigned long long)in.kv_token_bytes);
    cr_assert_eq(in.page_bytes, 69632, "%s: page %llu", llmd_kv_type_name(t),
                 (unsigned long long)in.page_bytes);
    cr_assert_eq(in.kv_type, t);
    return e;
}

Test(offload_engine, a_restart_with_another_kv_type_restores_nothing) {
    static struct job a, b, c, d, ref;
    memset(&a, 0, sizeof a);
    a.n_prompt = 400; /* six full pages: 384 tokens to restore */
    fill(a.prompt, 0, a.n_prompt, 4242);
    a.max_tokens = 8;
    b = c = d = ref = a;

    struct llmd_engine *e = open_kv(LLMD_KV_Q8_0, true);
    submit(e, &a);
    run(e);
    llmd_engine_close(e); /* the cached pages go down to the NVMe tier */

    /* the same type: every page comes back, and the same tokens */
    e = open_kv(LLMD_KV_Q8_0, true);
    submit(e, &b);
    run(e);
    llmd_engine_close(e);
    cr_assert_eq(b.usage.restored_tokens, 384, "q8_0 restored %u tokens", b.usage.restored_tokens);
    expect_same(&a, &b, 1, "q8_0 restored after a restart");

    /* another type of the same geometry: not one page may come back */
    e = open_kv(LLMD_KV_FP8, true);
    submit(e, &c);
    run(e);
    struct llmd_stats s8 = stats(e);
    llmd_engine_close(e);
    cr_assert_eq(c.usage.restored_tokens, 0, "fp8 restored %u q8_0 tokens",
                 c.usage.restored_tokens);
    cr_assert_eq(c.usage.cached_tokens, 0);
    cr_assert_eq(s8.restores_nvme_total, 0);
    cr_assert_eq(s8.offload_checksum_failures_total, 0, "not even looked at");
    /* and its tokens are fp8's own, computed: the same as without any tier */
    e = open_kv(LLMD_KV_FP8, false);
    submit(e, &ref);
    run(e);
    llmd_engine_close(e);
    expect_same(&ref, &c, 1, "fp8 after a q8_0 run");

    /* q8_0 once more, after the fp8 run reused the slots: a slot that now
     * holds fp8 bytes fails its q8_0 record's checksum and is recomputed;
     * never a wrong token */
    e = open_kv(LLMD_KV_Q8_0, true);
    submit(e, &d);
    run(e);
    llmd_engine_close(e);
    expect_same(&a, &d, 1, "q8_0 after the fp8 run");
}
