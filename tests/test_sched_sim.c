/* A randomized simulation: a fake model and a fake page pool, 10k steps of
 * random arrivals (three tenants, priorities, prompt and output lengths, EOS,
 * stop strings), cancellations and refusals. After every step: the pool is
 * never over-committed (st_pool_apply fails the test if a step needs a page
 * that is not free or evictable), every decoding sequence has its decode
 * token, the plan respects its bounds, and sched_check holds. At the end
 * every request has finished, been cancelled or been refused, with a
 * consistent finish reason, all pages are back, and no admission waited
 * longer than the stated bound. Deterministic: fixed seeds, injected time.
 * The speculative cases offer every decoding request a random draft each
 * step and accept a random prefix of it (the fake model's own tokens), and
 * roll the fake pool back to the committed tokens: the same guarantees
 * hold, and every request's tokens are the fake model's, in order. */
#include <criterion/parameterized.h>

#include "tests/lib/sched_util.h"

#define MS      1000000ull
#define STEP_NS (10 * MS)
#define N_STEPS 10000
#define MAX_REQ 8192

struct sim_case {
    uint64_t seed;
    uint32_t n_pages, evictable, arrive_pct;
    uint64_t max_wait_bound_ns;
    bool spec;
};

struct sim_req {
    uint64_t id;
    uint32_t prompt, max_tokens, n_gen;
    int32_t eos;
    enum sched_finish finish;
    bool cancelled, done;
};

static uint64_t rnd(uint64_t *x) {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

static struct sim_req *find(struct sim_req *r, uint32_t n, uint64_t id) {
    for (uint32_t i = n; i-- > 0;)
        if (r[i].id == id)
            return &r[i];
    cr_assert_fail("unknown id %lx", (unsigned long)id);
    return NULL;
}

static void check_plan(const struct sched_plan *pl, const struct sched_config *c) {
    cr_assert_leq(pl->n_tokens, c->max_batched_tokens);
    cr_assert_leq(pl->n_entries, c->max_seqs);
    uint32_t sum = 0;
    bool prefill_seen = false;
    for (uint32_t i = 0; i < pl->n_entries; i++) {
        const struct sched_entry *e = &pl->entries[i];
        sum += e->n_tokens;
        cr_assert(!(e->is_decode && prefill_seen), "decodes come first");
        prefill_seen |= !e->is_decode;
        if (c->max_chunk_tokens && !e->is_decode)
            cr_assert_leq(e->n_tokens, c->max_chunk_tokens);
        cr_assert(!e->is_decode || e->n_tokens == 1 + e->n_draft);
        cr_assert(e->is_decode || e->n_draft == 0);
        for (uint32_t j = 0; j < i; j++)
            cr_assert_neq(pl->entries[j].id, e->id, "one entry per sequence");
    }
    cr_assert_eq(sum, pl->n_tokens);
}

static void run_sim(const struct sim_case *k) {
    struct st_pool p;
    st_pool_init(&p, k->n_pages, 8);
    p.evictable = k->evictable;
    p.free = k->n_pages - k->evictable;
    struct sched_config c = st_config(&p, 8, 48);
    c.max_ctx = 400;
    c.max_chunk_tokens = 24;
    c.quantum_tokens = 8;
    c.aging_ns = 100 * MS;
    c.max_queue_wait_ns = 2000 * MS;
    c.rate_window_ns = 2000 * MS;
    c.max_waiting = 64;
    struct sched_tenant_config tc[3] = {{1, 1, 3}, {2, 2, 3}, {3, 3, 1}};
    c.tenants = tc;
    c.n_tenants = 3;
    struct sched *s = st_create(&c);
    static struct sim_req req[MAX_REQ];
    memset(req, 0, sizeof(req));
    uint32_t n_req = 0, n_refused = 0, n_cancel = 0;
    const char *stops[4] = {"ab", "cab", "bb", "aaa"};
    uint64_t x = k->seed;
    uint64_t now = 0;
    for (uint32_t step = 0;; step++) {
        now = (uint64_t)step * STEP_NS;
        bool arrivals = step < N_STEPS;
        uint32_t live = 0;
        for (uint32_t i = 0; i < n_req; i++)
            live += !req[i].done;
        if (!arrivals && live == 0)
            break;
        cr_assert_lt(step, N_STEPS + 5000, "the queue does not drain: %u live", live);
        if (arrivals && rnd(&x) % 100 < k->arrive_pct && n_req < MAX_REQ) {
            struct sim_req *q = &req[n_req];
            uint32_t big = rnd(&x) % 10 < 3;
            q->prompt = 1 + (uint32_t)(rnd(&x) % (big ? 300 : 40));
            q->max_tokens = rnd(&x) % 50 == 0 ? 0 : 1 + (uint32_t)(rnd(&x) % 80);
            q->eos = rnd(&x) % 4 == 0 ? (int32_t)(10 + rnd(&x) % 1000) : SCHED_TOKEN_NONE;
            uint32_t n_stop = rnd(&x) % 5 == 0 ? 1 + (uint32_t)(rnd(&x) % 2) : 0;
            struct sched_request r = {.tenant = 1 + (uint32_t)(rnd(&x) % 3),
                                      .priority = (int32_t)(rnd(&x) % 6) - 2,
                                      .prompt_len = q->prompt,
                                      .max_tokens = q->max_tokens,
                                      .eos = q->eos,
                                      .stop = stops + rnd(&x) % 3,
                                      .n_stop = n_stop};
            uint32_t retry = 0;
            int rc = sched_submit(s, &r, now, &q->id, &retry);
            if (rc == -EAGAIN) {
                cr_assert_geq(retry, 1);
                n_refused++;
            } else {
                cr_assert_eq(rc, 0, "submit: %d", rc);
                n_req++;
            }
        }
        if (live && rnd(&x) % 100 < 2) {
            uint32_t i = (uint32_t)(rnd(&x) % n_req);
            if (!req[i].done) {
                uint32_t slot;
                cr_assert_eq(sched_cancel(s, req[i].id, now, &slot), 0);
                if (slot != SCHED_SLOT_NONE)
                    st_pool_release(&p, slot);
                req[i].done = req[i].cancelled = true;
                n_cancel++;
            }
        }
        for (uint32_t i = 0; k->spec && i < n_req; i++) {
            struct sched_req_info info;
            if (req[i].done || sched_req_info(s, req[i].id, &info) ||
                info.state != SCHED_REQ_RUNNING || info.n_computed < info.n_target)
                continue;
            cr_assert_eq(sched_draft_set(s, req[i].id, (uint32_t)(rnd(&x) % 12)), 0);
        }
        struct sched_plan pl;
        cr_assert_eq(sched_plan(s, now, &pl), 0);
        check_plan(&pl, &c);
        for (uint32_t i = 0; i < n_req; i++) {
            struct sched_req_info info;
            if (req[i].done || sched_req_info(s, req[i].id, &info))
                continue;
            if (info.state == SCHED_REQ_RUNNING && info.n_computed >= info.n_target) {
                const struct sched_entry *e = st_entry(&pl, req[i].id);
                cr_assert(e && e->is_decode, "step %u: decoding request stalled", step);
            }
        }
        st_pool_apply(&p, &pl);
        uint32_t held = 0;
        for (uint32_t i = 0; i < ST_MAX_SLOTS; i++)
            held += p.held[i];
        cr_assert_eq(held + p.free + p.evictable, p.n_pages, "pages leak or double-count");
        if (!pl.n_entries)
            continue;
        struct sched_result res[8];
        char pieces[8][2];
        static int32_t acc[8][12];
        static char acc_text[8][12][2];
        static const char *acc_piece[8][12];
        static size_t acc_bytes[8][12];
        for (uint32_t i = 0; i < pl.n_entries; i++) {
            const struct sched_entry *e = &pl.entries[i];
            res[i] = (struct sched_result){.id = e->id, .token = SCHED_TOKEN_NONE};
            if (!e->want_logits)
                continue;
            uint32_t g;
            sched_req_generated(s, e->id, &g);
            uint32_t a = e->n_draft ? (uint32_t)(rnd(&x) % (e->n_draft + 1)) : 0;
            for (uint32_t j = 0; j < a; j++) {
                acc[i][j] = st_token(e->id, g + j);
                acc_text[i][j][0] = "abc"[acc[i][j] % 3];
                acc_piece[i][j] = acc_text[i][j];
                acc_bytes[i][j] = 1;
            }
            res[i].n_accepted = a;
            res[i].accepted = acc[i];
            res[i].accepted_piece = acc_piece[i];
            res[i].accepted_piece_bytes = acc_bytes[i];
            res[i].token = st_token(e->id, g + a);
            pieces[i][0] = "abc"[res[i].token % 3];
            pieces[i][1] = 0;
            res[i].piece = pieces[i];
            res[i].piece_bytes = 1;
        }
        const struct sched_event *ev;
        uint32_t nev;
        cr_assert_eq(sched_complete(s, res, pl.n_entries, now, &ev, &nev), 0);
        for (uint32_t i = 0; i < nev; i++) {
            struct sim_req *q = find(req, n_req, ev[i].id);
            cr_assert_eq(ev[i].n_generated, q->n_gen + 1, "generation count continues");
            cr_assert_eq(ev[i].token, st_token(q->id, q->n_gen));
            q->n_gen++;
            if (ev[i].finish == SCHED_FINISH_NONE)
                continue;
            q->finish = ev[i].finish;
            q->done = true;
            st_pool_release(&p, ev[i].slot);
        }
        /* the engine's rollback: a sequence keeps the pages of its committed tokens */
        for (uint32_t i = 0; i < pl.n_entries; i++) {
            struct sched_req_info info;
            const struct sched_entry *e = &pl.entries[i];
            if (!e->n_draft || sched_req_info(s, e->id, &info) < 0)
                continue;
            uint32_t keep = (info.n_computed + p.tpp - 1) / p.tpp;
            cr_assert_leq(keep, p.held[e->slot]);
            p.free += p.held[e->slot] - keep;
            p.held[e->slot] = keep;
        }
        cr_assert(sched_check(s), "step %u", step);
    }
    struct sched_stats st;
    sched_stats_get(s, &st);
    uint32_t by[SCHED_FINISH_N] = {0};
    for (uint32_t i = 0; i < n_req; i++) {
        struct sim_req *q = &req[i];
        cr_assert(q->done, "request %u never finished", i);
        if (q->cancelled)
            continue;
        by[q->finish]++;
        uint32_t limit = q->max_tokens ? q->max_tokens : UINT32_MAX;
        cr_assert_leq(q->n_gen, limit);
        switch (q->finish) {
        case SCHED_FINISH_LENGTH:
            cr_assert_eq(q->n_gen, q->max_tokens);
            break;
        case SCHED_FINISH_CONTEXT:
            cr_assert_eq(q->prompt + q->n_gen, 400, "request %u", i);
            break;
        case SCHED_FINISH_EOS:
            cr_assert_eq(st_token(q->id, q->n_gen - 1), q->eos);
            break;
        case SCHED_FINISH_STOP:
            break;
        default:
            cr_assert_fail("request %u: finish %d", i, q->finish);
        }
    }
    cr_assert_eq(st.running + st.waiting, 0);
    cr_assert_eq(st.pages_reserved, 0);
    cr_assert_eq(p.free + p.evictable, p.n_pages, "every page is back");
    cr_assert_eq(st.cancelled_total, n_cancel);
    cr_assert_eq(st.refusals_total, n_refused);
    cr_assert_eq(st.finished_total, n_req);
    if (k->spec) {
        cr_assert_gt(st.spec_accepted_tokens_total, 1000, "drafts were planned and accepted");
        uint64_t sum = 0, n = 0;
        for (uint32_t a = 0; a <= SCHED_DRAFT_MAX; a++) {
            sum += a * st.spec_accepted_len[a];
            n += st.spec_accepted_len[a];
        }
        cr_assert_eq(sum, st.spec_accepted_tokens_total, "the histogram sums to the total");
        cr_assert_eq(n, st.spec_steps_total);
        cr_assert_leq(st.spec_accepted_tokens_total, st.spec_draft_tokens_total);
    }
    cr_log_info("seed %lx: %u requests, %u refused, %u cancelled, %lu preemptions, "
                "finish length %u stop %u eos %u context %u, max wait %.2f s, evictions %u",
                (unsigned long)k->seed, n_req, n_refused, n_cancel,
                (unsigned long)st.preemptions_total, by[SCHED_FINISH_LENGTH], by[SCHED_FINISH_STOP],
                by[SCHED_FINISH_EOS], by[SCHED_FINISH_CONTEXT], (double)st.queue_wait_max_ns / 1e9,
                p.evictions);
    cr_assert_gt(by[SCHED_FINISH_STOP] * by[SCHED_FINISH_EOS] * by[SCHED_FINISH_LENGTH], 0,
                 "every finish reason was exercised");
    cr_assert_leq(st.queue_wait_max_ns, k->max_wait_bound_ns, "max wait %.2f s",
                  (double)st.queue_wait_max_ns / 1e9);
    sched_destroy(s);
}

ParameterizedTestParameters(sched_sim, random_traffic) {
    static struct sim_case cases[] = {
        /* tight: 64 pages of 8 tokens for 8 slots; preemptions and refusals */
        {.seed = 0x9E3779B97F4A7C15ull,
         .n_pages = 64,
         .evictable = 8,
         .arrive_pct = 15,
         .max_wait_bound_ns = 30000 * MS},
        /* roomy: the pool holds every slot at full length; waits come from slots */
        {.seed = 0xD1B54A32D192ED03ull,
         .n_pages = 512,
         .evictable = 0,
         .arrive_pct = 25,
         .max_wait_bound_ns = 30000 * MS},
        /* both again with drafts of 0..11 tokens, a random prefix accepted */
        {.seed = 0x9E3779B97F4A7C15ull,
         .n_pages = 64,
         .evictable = 8,
         .arrive_pct = 15,
         .max_wait_bound_ns = 30000 * MS,
         .spec = true},
        {.seed = 0xD1B54A32D192ED03ull,
         .n_pages = 512,
         .evictable = 0,
         .arrive_pct = 25,
         .max_wait_bound_ns = 30000 * MS,
         .spec = true},
    };
    return cr_make_param_array(struct sim_case, cases, sizeof(cases) / sizeof(cases[0]));
}

ParameterizedTest(struct sim_case *k, sched_sim, random_traffic, .timeout = 60) {
    run_sim(k);
}
