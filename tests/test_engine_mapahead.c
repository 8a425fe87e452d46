/* Map-ahead in the engine (issue 7): with the thread on, a long decode never
 * maps a page on the step's path (decode_map_waits_total stays 0) and
 * yields the same tokens as with it off, where every decode token that
 * starts a new page is one counted wait. Map-ahead changes no admission or
 * preemption (the whole per-step trace of the scheduler is equal, thread
 * synchronized or not) and leaks no page. stories260K, greedy, f32 KV:
 * 16 tokens a page. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "llmd.h"
#include "tests/lib/ref_util.h"

#define F32     REF_MODELS "/stories260K-f32.gguf"
#define TPP     16 /* tokens per page: default page of 16 tokens */
#define MAX_OUT 256
#define MAX_LOG 4096

struct job {
    int32_t prompt[160];
    uint32_t n_prompt, max_tokens;
    uint64_t id;
    int32_t out[MAX_OUT];
    uint32_t n_out;
    enum llmd_finish finish;
};

static void on_token(void *user, uint64_t id, int32_t token, const char *text, size_t len,
                     enum llmd_finish finish) {
    (void)text;
    (void)len;
    struct job *j = user;
    cr_assert_eq(id, j->id);
    if (token >= 0 && j->n_out < MAX_OUT)
        j->out[j->n_out++] = token;
    j->finish = finish;
}

enum mode { AHEAD_OFF, AHEAD_SYNC, AHEAD_ASYNC };

static struct llmd_engine *open_engine(enum mode m, uint32_t max_seqs, uint32_t max_batched,
                                       uint64_t budget, int no_cache) {
    struct llmd_engine_config cfg = {.model = F32,
                                     .n_threads = 1,
                                     .n_ctx = 256,
                                     .max_seqs = max_seqs,
                                     .max_batched_tokens = max_batched,
                                     .kv_budget_bytes = budget,
                                     .kv_type = LLMD_KV_F32,
                                     .no_prefix_cache = no_cache,
                                     .no_map_ahead = m == AHEAD_OFF};
    struct llmd_engine *e;
    char err[512] = "";
    cr_assert_eq(llmd_engine_open(&cfg, &e, err, sizeof(err)), 0, "open: %s", err);
    return e;
}

static void submit(struct llmd_engine *e, struct job *j) {
    struct llmd_request r = {.prompt_ids = j->prompt,
                             .n_prompt_ids = j->n_prompt,
                             .max_tokens = j->max_tokens,
                             .on_token = on_token,
                             .user = j};
    cr_assert_eq(llmd_submit(e, &r, &j->id, NULL), 0);
}

/* Decode positions p (the position of the token fed back) that start a new
 * page: a job's decode steps feed positions [n_prompt, n_prompt + n_out - 1). */
static uint32_t crossings(const struct job *j) {
    uint32_t n = 0;
    for (uint32_t p = j->n_prompt; p + 1 < j->n_prompt + j->n_out; p++)
        n += p % TPP == 0;
    return n;
}

/* One request alone: prompt of 5, 220 tokens asked (the context is 256). */
static void long_decode(enum mode m, struct job *j, struct llmd_stats *st) {
    memset(j, 0, sizeof *j);
    j->n_prompt = 5;
    j->prompt[0] = 1;
    for (uint32_t k = 1; k < j->n_prompt; k++)
        j->prompt[k] = 40 + (int32_t)k * 7;
    j->max_tokens = 220;
    struct llmd_engine *e = open_engine(m, 1, 64, 0, 0);
    submit(e, j);
    int live, steps = 0;
    uint64_t ahead_seen = 0;
    while ((live = llmd_engine_step(e)) > 0) {
        cr_assert_lt(++steps, 1000, "no progress");
        if (m == AHEAD_SYNC)
            llmd_engine_sync(e);
        struct llmd_stats s;
        llmd_stats_get(e, &s);
        if (s.kv_pages_ahead > ahead_seen)
            ahead_seen = s.kv_pages_ahead;
        if (m != AHEAD_ASYNC) { /* the pool map shows them as 'a' */
            char map[4096];
            cr_assert_eq(llmd_pool_map(e, map, sizeof map), 0);
            uint64_t n_a = 0;
            for (const char *c = map; *c; c++)
                n_a += *c == 'a';
            cr_assert_eq(n_a, s.kv_pages_ahead, "step %d: map %s", steps, map);
        }
        /* pages by need: what the tokens in the KV cover, none of those mapped ahead */
        uint32_t pages[32];
        int n = llmd_request_pages(e, j->id, pages, 32);
        uint32_t in_kv = j->n_prompt + j->n_out - 1;
        cr_assert_eq(n, (int)((in_kv + TPP - 1) / TPP), "step %d: %d pages for %u tokens", steps, n,
                     in_kv);
        cr_assert(llmd_engine_check(e), "step %d", steps);
    }
    cr_assert_eq(live, 0);
    llmd_stats_get(e, st);
    cr_assert_eq(st->kv_pages_free + st->kv_pages_cached, st->kv_pages_total, "pages left mapped");
    cr_assert_eq(st->kv_pages_ahead, 0);
    if (m == AHEAD_SYNC)
        /* the page the next token starts, plus the spare one */
        cr_assert_eq(ahead_seen, 2, "at most 2 pages mapped ahead, saw %lu",
                     (unsigned long)ahead_seen);
    if (m == AHEAD_OFF)
        cr_assert_eq(ahead_seen, 0);
    cr_assert(llmd_engine_check(e));
    llmd_engine_close(e);
}

Test(engine_mapahead, long_decode_never_waits_and_matches_map_ahead_off, .timeout = 120) {
    static struct job on, off;
    struct llmd_stats son, soff;
    long_decode(AHEAD_OFF, &off, &soff);
    long_decode(AHEAD_SYNC, &on, &son);
    cr_assert(off.finish == LLMD_FINISH_LENGTH || off.finish == LLMD_FINISH_EOS, "finish %d",
              off.finish);
    cr_assert_eq(on.finish, off.finish);
    cr_assert_eq(on.n_out, off.n_out);
    for (uint32_t k = 0; k < off.n_out; k++)
        cr_assert_eq(on.out[k], off.out[k], "token %u: %d with map-ahead, %d without", k, on.out[k],
                     off.out[k]);
    /* 5 prompt tokens, then one decode step per generated token after the first */
    cr_assert_eq(soff.steps_total, off.n_out, "steps %lu, tokens %u",
                 (unsigned long)soff.steps_total, off.n_out);
    cr_assert_eq(son.steps_total, soff.steps_total);
    uint32_t want = crossings(&off);
    cr_assert_geq(off.n_out, 100, "a long decode: %u tokens", off.n_out);
    cr_assert_geq(want, 6, "crossings %u", want);
    cr_assert_eq(soff.decode_map_waits_total, want, "map-ahead off: %lu waits, %u crossings",
                 (unsigned long)soff.decode_map_waits_total, want);
    cr_assert_eq(son.decode_map_waits_total, 0, "map-ahead on: %lu waits",
                 (unsigned long)son.decode_map_waits_total);
    cr_log_info("%u tokens, %u page crossings: %lu waits off, %lu on", off.n_out, want,
                (unsigned long)soff.decode_map_waits_total,
                (unsigned long)son.decode_map_waits_total);
}

/* A prompt of exactly one page: the first decode token starts page 1. The
 * step that prefills the prompt maps that page too, in the same grow, so
 * even with the thread free-running (no sync) that decode does not wait;
 * without map-ahead it waits once. Deterministic: no thread involved. */
Test(engine_mapahead, first_decode_after_a_whole_page_prompt_does_not_wait, .timeout = 60) {
    for (int m = AHEAD_OFF; m <= AHEAD_ASYNC; m += AHEAD_ASYNC - AHEAD_OFF) {
        struct job j = {.n_prompt = TPP, .max_tokens = 3};
        j.prompt[0] = 1;
        for (uint32_t k = 1; k < j.n_prompt; k++)
            j.prompt[k] = 60 + (int32_t)k;
        struct llmd_engine *e = open_engine((enum mode)m, 1, 64, 0, 1);
        submit(e, &j);
        int live, steps = 0;
        while ((live = llmd_engine_step(e)) > 0)
            cr_assert_lt(++steps, 100);
        cr_assert_eq(live, 0);
        struct llmd_stats st;
        llmd_stats_get(e, &st);
        cr_assert_eq(j.n_out, 3);
        cr_assert_eq(st.steps_total, 3, "a prefill and two decodes: %lu",
                     (unsigned long)st.steps_total);
        cr_assert_eq(crossings(&j), 1);
        cr_assert_eq(st.decode_map_waits_total, m == AHEAD_OFF ? 1 : 0, "mode %d: %lu waits", m,
                     (unsigned long)st.decode_map_waits_total);
        cr_assert(llmd_engine_check(e));
        llmd_engine_close(e);
    }
}

/* --- the scheduler's decisions do not depend on map-ahead ----------------- */

/* What the scheduler decided at each step, as seen from outside. */
struct trace {
    uint64_t row[MAX_LOG][6];
    uint32_t n;
    struct llmd_stats end;
};

static void make_jobs(struct job *jobs, int n, unsigned seed) {
    srand(seed);
    for (int i = 0; i < n; i++) {
        struct job *j = &jobs[i];
        memset(j, 0, sizeof(*j));
        j->n_prompt = 1 + (uint32_t)(rand() % 100);
        j->prompt[0] = 1;
        for (uint32_t k = 1; k < j->n_prompt; k++)
            j->prompt[k] = 3 + rand() % 509;
        /* a shared opening for a third of them: prefix hits and cached pages */
        if (i % 3 == 0 && j->n_prompt > 40)
            for (uint32_t k = 1; k < 40; k++)
                j->prompt[k] = 100 + (int32_t)k;
        j->max_tokens = 8 + (uint32_t)(rand() % 80);
    }
}

static void run_trace(enum mode m, struct job *jobs, int n, uint32_t max_seqs, uint64_t budget,
                      int no_cache, struct trace *t) {
    make_jobs(jobs, n, 5);
    struct llmd_engine *e = open_engine(m, max_seqs, 48, budget, no_cache);
    for (int i = 0; i < n; i++)
        submit(e, &jobs[i]);
    int live;
    t->n = 0;
    while ((live = llmd_engine_step(e)) > 0) {
        cr_assert_lt(t->n, MAX_LOG, "no progress");
        if (m == AHEAD_SYNC)
            llmd_engine_sync(e);
        struct llmd_stats s;
        llmd_stats_get(e, &s);
        uint64_t *r = t->row[t->n++];
        r[0] = (uint64_t)live;
        r[1] = s.requests_running;
        r[2] = s.requests_waiting;
        r[3] = s.preemptions_total;
        r[4] = s.kv_pages_free; /* pages mapped ahead count as free: equal either way */
        r[5] = s.kv_pages_cached;
        cr_assert(llmd_engine_check(e), "step %u", t->n);
    }
    cr_assert_eq(live, 0);
    llmd_stats_get(e, &t->end);
    cr_assert_eq(t->end.kv_pages_free + t->end.kv_pages_cached, t->end.kv_pages_total,
                 "pages left mapped: %lu free + %lu cached of %lu",
                 (unsigned long)t->end.kv_pages_free, (unsigned long)t->end.kv_pages_cached,
                 (unsigned long)t->end.kv_pages_total);
    cr_assert_eq(t->end.kv_pages_ahead, 0);
    cr_assert(llmd_engine_check(e));
    llmd_engine_close(e);
}

static void expect_same_run(const struct job *a, const struct trace *ta, const struct job *b,
                            const struct trace *tb, int n, const char *what) {
    cr_assert_eq(tb->n, ta->n, "%s: %u steps, %u without map-ahead", what, tb->n, ta->n);
    static const char *const col[] = {"live",        "running", "waiting",
                                      "preemptions", "free",    "cached"};
    for (uint32_t s = 0; s < ta->n; s++)
        for (int c = 0; c < 6; c++)
            cr_assert_eq(tb->row[s][c], ta->row[s][c], "%s: step %u %s %lu, %lu without", what, s,
                         col[c], (unsigned long)tb->row[s][c], (unsigned long)ta->row[s][c]);
    for (int i = 0; i < n; i++) {
        cr_assert_eq(b[i].finish, a[i].finish, "%s: job %d", what, i);
        cr_assert_eq(b[i].n_out, a[i].n_out, "%s: job %d", what, i);
        for (uint32_t k = 0; k < a[i].n_out; k++)
            cr_assert_eq(b[i].out[k], a[i].out[k], "%s: job %d token %u", what, i, k);
    }
    cr_assert_eq(tb->end.preemptions_total, ta->end.preemptions_total, "%s", what);
    cr_assert_eq(tb->end.prefill_tokens_total, ta->end.prefill_tokens_total, "%s", what);
    cr_assert_eq(tb->end.prefix_hit_tokens_total, ta->end.prefix_hit_tokens_total, "%s", what);
    cr_assert_eq(tb->end.steps_total, ta->end.steps_total, "%s", what);
}

/* 24 requests on 4 slots; `budget_pages` of 20 KiB. */
static void same_decisions(uint64_t budget_pages, int no_cache, bool want_preempt) {
    enum { N = 24 };
    static struct job off[N], sync[N], async[N];
    static struct trace toff, tsync, tasync;
    run_trace(AHEAD_OFF, off, N, 4, budget_pages * 20480, no_cache, &toff);
    run_trace(AHEAD_SYNC, sync, N, 4, budget_pages * 20480, no_cache, &tsync);
    run_trace(AHEAD_ASYNC, async, N, 4, budget_pages * 20480, no_cache, &tasync);
    expect_same_run(off, &toff, sync, &tsync, N, "map-ahead, synchronized");
    expect_same_run(off, &toff, async, &tasync, N, "map-ahead, free-running");
    if (want_preempt) {
        cr_assert_gt(toff.end.preemptions_total, 0, "a tight budget must preempt");
    } else {
        /* no preemption: with map-ahead off each job's page crossings are
         * waits in distinct steps, and a step may hold several jobs' */
        uint32_t sum = 0, most = 0;
        for (int i = 0; i < N; i++) {
            uint32_t c = crossings(&off[i]);
            sum += c;
            most = c > most ? c : most;
        }
        cr_assert_eq(toff.end.preemptions_total, 0);
        cr_assert(toff.end.decode_map_waits_total <= sum && toff.end.decode_map_waits_total >= most,
                  "off: %lu waits, crossings %u in all, %u at most in a job",
                  (unsigned long)toff.end.decode_map_waits_total, sum, most);
        cr_assert_gt(most, 0);
        cr_assert_eq(tsync.end.decode_map_waits_total, 0, "with room: %lu waits",
                     (unsigned long)tsync.end.decode_map_waits_total);
    }
    cr_assert_leq(tsync.end.decode_map_waits_total, toff.end.decode_map_waits_total);
    cr_log_info("budget %lu pages, cache %d: %u steps, %lu preemptions, decode map waits %lu "
                "off, %lu on (synchronized), %lu on (free-running)",
                (unsigned long)budget_pages, !no_cache, toff.n,
                (unsigned long)toff.end.preemptions_total,
                (unsigned long)toff.end.decode_map_waits_total,
                (unsigned long)tsync.end.decode_map_waits_total,
                (unsigned long)tasync.end.decode_map_waits_total);
}

Test(engine_mapahead, same_admissions_and_no_leak_with_room, .timeout = 240) {
    same_decisions(0, 0, false); /* 0: every slot can fill its context */
}

Test(engine_mapahead, same_preemptions_under_a_tight_budget_with_prefix_cache, .timeout = 240) {
    same_decisions(14, 0, true);
}

Test(engine_mapahead, same_preemptions_under_a_tight_budget_without_prefix_cache, .timeout = 240) {
    same_decisions(14, 1, true);
}
