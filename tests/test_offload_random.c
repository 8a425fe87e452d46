/* Output invariance under random tier configurations: for seeded random
 * device budgets, host tier sizes, NVMe tier sizes (or none), max_seqs,
 * batch sizes and offload_always on or off, every greedy output equals the
 * request's output alone without any cache. Requests share random
 * prefixes, come in waves, and between waves a tenant may be purged or the
 * engine restarted on the same NVMe slot file (whose geometry changes with
 * its size from one configuration to the next). Bounded: a fixed list of
 * seeds, a few seconds in a debug build. stories260K, f32 KV. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define MAX_OUT    16
#define MAX_PROMPT 256
#define OFFLOAD_TEST_OWN_ENGINE
#include "tests/lib/offload_util.h"

#define N_JOBS   32
#define N_PREFIX 4

/* xorshift64*: the test's own stream, apart from anything else's rand(). */
static uint64_t rng_state;
static uint32_t rnd(uint32_t n) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 2685821657736338717ull) >> 33) % n;
}

TestSuite(offload_random, .init = setup, .fini = teardown, .timeout = 240);

struct cfg {
    uint32_t kv_pages, max_seqs, max_batched;
    uint64_t host_bytes, nvme_bytes; /* nvme_bytes 0: no NVMe tier */
    int always;
};

static struct llmd_engine *open_engine(const struct cfg *c, bool no_cache) {
    struct llmd_engine_config cfg = {.model = F32,
                                     .n_threads = 2,
                                     .n_ctx = 512,
                                     .max_seqs = c->max_seqs,
                                     .max_batched_tokens = c->max_batched,
                                     .kv_budget_bytes = (uint64_t)c->kv_pages * PAGE,
                                     .kv_type = LLMD_KV_F32,
                                     .no_prefix_cache = no_cache,
                                     .prefix_secret = secret_path,
                                     .host_tier_bytes = c->host_bytes,
                                     .nvme_tier_path = c->nvme_bytes ? nvme_path : NULL,
                                     .nvme_tier_bytes = c->nvme_bytes,
                                     .offload_always = c->always};
    struct llmd_engine *e;
    char err[512] = "";
    cr_assert_eq(llmd_engine_open(&cfg, &e, err, sizeof err), 0, "open: %s", err);
    return e;
}

static void run(struct llmd_engine *e, const char *what) {
    int live, steps = 0;
    while ((live = llmd_engine_step(e)) > 0)
        cr_assert_lt(++steps, 100000, "%s: no progress", what);
    cr_assert_eq(live, 0, "%s: step %d", what, live);
    struct llmd_stats st;
    llmd_stats_get(e, &st);
    cr_assert_eq(st.kv_pages_free + st.kv_pages_cached, st.kv_pages_total, "%s: pages left mapped",
                 what);
    cr_assert_eq(st.offload_checksum_failures_total, 0, "%s", what);
}

/* N_JOBS jobs over N_PREFIX shared prefixes of 0..12 pages, each with 1..40
 * own tokens and 1..MAX_OUT to generate, in 3 tenants. */
static void make_jobs(struct job *jobs) {
    static int32_t prefix[N_PREFIX][192];
    uint32_t n_prefix[N_PREFIX];
    for (int p = 0; p < N_PREFIX; p++) {
        n_prefix[p] = rnd(13) * TPP;
        for (uint32_t k = 0; k < n_prefix[p]; k++)
            prefix[p][k] = k == 0 ? 1 : 3 + (int32_t)rnd(509);
    }
    for (int i = 0; i < N_JOBS; i++) {
        struct job *j = &jobs[i];
        memset(j, 0, sizeof *j);
        int p = (int)rnd(N_PREFIX);
        memcpy(j->prompt, prefix[p], n_prefix[p] * sizeof(int32_t));
        j->n_prompt = n_prefix[p] + 1 + rnd(40);
        for (uint32_t k = n_prefix[p]; k < j->n_prompt; k++)
            j->prompt[k] = k == 0 ? 1 : 3 + (int32_t)rnd(509);
        j->max_tokens = 1 + rnd(MAX_OUT);
        j->tenant = (uint32_t)p % 3; /* a prefix stays in one namespace: it can hit */
    }
}

static void describe(const struct cfg *c, char *buf, size_t len) {
    snprintf(buf, len, "kv %u pages, max_seqs %u, batch %u, host %lu, nvme %lu, always %d",
             c->kv_pages, c->max_seqs, c->max_batched, (unsigned long)c->host_bytes,
             (unsigned long)c->nvme_bytes, c->always);
}

Test(offload_random, every_output_equals_the_uncached_solo_output) {
    static struct job solo[N_JOBS], jobs[N_JOBS];
    /* LLMD_TEST_SEED explores other seeds; the suite runs the fixed one */
    const char *seed = getenv("LLMD_TEST_SEED");
    rng_state = seed ? strtoull(seed, NULL, 0) * 0x9e3779b97f4a7c15ull + 1 : 0x9e3779b97f4a7c15ull;
    make_jobs(solo);
    struct cfg one = {.kv_pages = 64, .max_seqs = 1, .max_batched = 128};
    struct llmd_engine *e = open_engine(&one, true);
    for (int i = 0; i < N_JOBS; i++) {
        submit(e, &solo[i]);
        run(e, "solo");
        cr_assert_eq(solo[i].n_out, solo[i].max_tokens);
    }
    llmd_engine_close(e);

    uint64_t restored = 0, spilled = 0, nvme_restored = 0;
    for (int round = 0; round < 12; round++) {
        struct cfg c = {
            .kv_pages = 18 + rnd(30), /* a job needs at most 16 pages, so any job fits */
            .max_seqs = 1 + rnd(6),
            .max_batched = 32u << rnd(3),
            .host_bytes = rnd(4) == 0   ? 0
                          : rnd(3) == 0 ? 1
                                        : (uint64_t)(1 + rnd(6)) << 20,
            .always = rnd(4) != 0,
        };
        if (c.host_bytes && rnd(2))
            c.nvme_bytes = (uint64_t)(1 + rnd(64)) * PAGE;
        if (c.max_batched < c.max_seqs)
            c.max_batched = c.max_seqs;
        char what[160];
        describe(&c, what, sizeof what);
        cr_log_info("round %d: %s", round, what);
        e = open_engine(&c, false);
        memcpy(jobs, solo, sizeof jobs);
        for (int i = 0; i < N_JOBS;) {
            int wave = 1 + (int)rnd(8);
            for (int k = 0; k < wave && i < N_JOBS; k++, i++)
                submit(e, &jobs[i]);
            run(e, what);
            switch (rnd(6)) {
            case 0:
                cr_assert_eq(llmd_tenant_purge(e, rnd(3), NULL), 0);
                break;
            case 1: /* a restart: with NVMe the cached pages go down and come back */
                llmd_engine_close(e);
                e = open_engine(&c, false);
                break;
            default:
                break;
            }
        }
        struct llmd_stats st;
        llmd_stats_get(e, &st);
        restored += st.restored_tokens_total;
        spilled += st.spills_host_total;
        nvme_restored += st.restores_nvme_total;
        llmd_engine_close(e);
        for (int i = 0; i < N_JOBS; i++) {
            cr_assert_eq(jobs[i].finish, LLMD_FINISH_LENGTH, "%s: job %d finish %d", what, i,
                         jobs[i].finish);
            cr_assert_eq(jobs[i].n_out, solo[i].n_out, "%s: job %d", what, i);
            for (uint32_t k = 0; k < solo[i].n_out; k++)
                cr_assert_eq(jobs[i].out[k], solo[i].out[k],
                             "%s: job %d token %u: %d, alone %d (cached %u restored %u)", what, i,
                             k, jobs[i].out[k], solo[i].out[k], jobs[i].usage.cached_tokens,
                             jobs[i].usage.restored_tokens);
        }
    }
    cr_log_info("restored %lu tokens (%lu pages from NVMe), %lu host spills",
                (unsigned long)restored, (unsigned long)nvme_restored, (unsigned long)spilled);
    /* the fixed seed's rounds must exercise the tiers, or they prove nothing (another
     * seed may draw rounds that never spill) */
    if (!seed) {
        cr_assert_gt(spilled, 0);
        cr_assert_gt(restored, 0);
    }
}
