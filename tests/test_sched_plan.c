/* Step plans: decode first, the token budget, chunked prefill, max_seqs,
 * admission, refusal, preemption, the finish reasons and cancellation, with
 * exact plans where the arithmetic is short. Times are injected (ns). */
#include "tests/lib/sched_util.h"

#define MS 1000000ull

static void entry_is(const struct sched_plan *pl, uint32_t i, uint64_t id, uint32_t pos0,
                     uint32_t n, bool decode, bool logits) {
    cr_assert_lt(i, pl->n_entries, "entry %u of %u", i, pl->n_entries);
    const struct sched_entry *e = &pl->entries[i];
    cr_assert_eq(e->id, id, "entry %u: id %lx want %lx", i, (unsigned long)e->id,
                 (unsigned long)id);
    cr_assert_eq(e->pos0, pos0, "entry %u: pos0 %u want %u", i, e->pos0, pos0);
    cr_assert_eq(e->n_tokens, n, "entry %u: n %u want %u", i, e->n_tokens, n);
    cr_assert_eq(e->is_decode, decode, "entry %u: decode %d", i, e->is_decode);
    cr_assert_eq(e->want_logits, logits, "entry %u: logits %d", i, e->want_logits);
}

Test(sched_plan, decode_first_within_the_budget) {
    struct st_pool p;
    st_pool_init(&p, 64, 4);
    struct sched_config c = st_config(&p, 4, 8);
    struct sched *s = st_create(&c);
    const struct sched_event *ev;
    uint32_t nev;
    uint64_t a = st_submit(s, 0, 0, 6, 10, 0);
    struct sched_plan pl = st_step(s, &p, 0, &ev, &nev);
    cr_assert_eq(pl.n_entries, 1);
    entry_is(&pl, 0, a, 0, 6, false, true);
    cr_assert_eq(pl.n_admitted, 1);
    cr_assert_eq(nev, 1);
    uint64_t b = st_submit(s, 0, 0, 10, 10, 1 * MS);
    pl = st_step(s, &p, 1 * MS, &ev, &nev);
    cr_assert_eq(pl.n_entries, 2);
    entry_is(&pl, 0, a, 6, 1, true, true);
    entry_is(&pl, 1, b, 0, 7, false, false); /* 8 - 1 decode token */
    cr_assert_eq(pl.n_tokens, 8);
    cr_assert_eq(pl.n_decode_tokens, 1);
    cr_assert_eq(pl.n_prefill_tokens, 7);
    cr_assert_eq(nev, 1, "only the decode samples");
    pl = st_step(s, &p, 2 * MS, &ev, &nev);
    cr_assert_eq(pl.n_entries, 2);
    entry_is(&pl, 0, a, 7, 1, true, true);
    entry_is(&pl, 1, b, 7, 3, false, true);
    cr_assert_eq(pl.n_tokens, 4);
    pl = st_step(s, &p, 3 * MS, &ev, &nev);
    cr_assert_eq(pl.n_entries, 2);
    entry_is(&pl, 0, a, 8, 1, true, true);
    entry_is(&pl, 1, b, 10, 1, true, true);
    sched_destroy(s);
}

/* A 100-token prompt is cut into chunks; the three decoding sequences get
 * their token in every step meanwhile. */
Test(sched_plan, chunked_prefill_never_stalls_decode) {
    struct st_pool p;
    st_pool_init(&p, 256, 4);
    struct sched_config c = st_config(&p, 4, 16);
    struct sched *s = st_create(&c);
    const struct sched_event *ev;
    uint32_t nev;
    uint64_t d[3];
    for (int i = 0; i < 3; i++)
        d[i] = st_submit(s, 0, 0, 4, 50, 0);
    st_step(s, &p, 0, &ev, &nev); /* the three prompts: 12 tokens */
    uint64_t big = st_submit(s, 0, 0, 100, 5, 1);
    uint32_t pos = 0, steps = 0;
    while (pos < 100) {
        struct sched_plan pl = st_step(s, &p, (2 + steps) * MS, &ev, &nev);
        steps++;
        for (int i = 0; i < 3; i++)
            entry_is(&pl, (uint32_t)i, d[i], 4 + steps - 1, 1, true, true);
        const struct sched_entry *e = st_entry(&pl, big);
        cr_assert_not_null(e, "step %u: no chunk for the long prompt", steps);
        cr_assert_eq(e->pos0, pos, "chunks must be contiguous");
        cr_assert_eq(e->n_tokens, pos + 13 <= 100 ? 13u : 100 - pos, "chunk %u", e->n_tokens);
        pos += e->n_tokens;
        cr_assert_eq(e->want_logits, pos == 100);
    }
    cr_assert_eq(steps, 8, "ceil(100 / 13) steps, took %u", steps);
    sched_destroy(s);
}

Test(sched_plan, max_chunk_tokens_caps_one_sequence) {
    struct st_pool p;
    st_pool_init(&p, 256, 4);
    struct sched_config c = st_config(&p, 4, 64);
    c.max_chunk_tokens = 10;
    struct sched *s = st_create(&c);
    const struct sched_event *ev;
    uint32_t nev;
    uint64_t a = st_submit(s, 0, 0, 25, 5, 0);
    uint64_t b = st_submit(s, 0, 0, 25, 5, 0);
    struct sched_plan pl = st_step(s, &p, 0, &ev, &nev);
    entry_is(&pl, 0, a, 0, 10, false, false);
    entry_is(&pl, 1, b, 0, 10, false, false);
    cr_assert_eq(pl.n_entries, 2);
    sched_destroy(s);
}

Test(sched_plan, max_seqs_bounds_the_batch) {
    struct st_pool p;
    st_pool_init(&p, 256, 4);
    struct sched_config c = st_config(&p, 4, 64);
    struct sched *s = st_create(&c);
    const struct sched_event *ev;
    uint32_t nev;
    uint64_t id[6];
    for (int i = 0; i < 6; i++)
        id[i] = st_submit(s, 0, 0, 4, i < 4 ? 3 : 2, (uint64_t)i);
    struct sched_plan pl = st_step(s, &p, 1 * MS, &ev, &nev);
    cr_assert_eq(pl.n_entries, 4);
    cr_assert_eq(pl.n_admitted, 4);
    for (int i = 0; i < 4; i++)
        cr_assert_eq(pl.entries[i].id, id[i], "FIFO within a priority");
    struct sched_stats st;
    sched_stats_get(s, &st);
    cr_assert_eq(st.running, 4);
    cr_assert_eq(st.waiting, 2);
    st_step(s, &p, 2 * MS, &ev, &nev);
    pl = st_step(s, &p, 3 * MS, &ev, &nev); /* generation 3: the first four finish */
    cr_assert_eq(nev, 4);
    for (uint32_t i = 0; i < nev; i++)
        cr_assert_eq(ev[i].finish, SCHED_FINISH_LENGTH);
    pl = st_step(s, &p, 4 * MS, &ev, &nev);
    cr_assert_eq(pl.n_admitted, 2, "freed slots are taken at the next step");
    cr_assert_not_null(st_entry(&pl, id[4]));
    cr_assert_not_null(st_entry(&pl, id[5]));
    sched_destroy(s);
}

/* 8 pages of 4 tokens: A reserves 5 prompt pages + 1 headroom, B (3) waits
 * until A finishes, then runs. */
Test(sched_plan, admission_waits_for_pages_then_admits) {
    struct st_pool p;
    st_pool_init(&p, 8, 4);
    struct sched_config c = st_config(&p, 4, 64);
    struct sched *s = st_create(&c);
    const struct sched_event *ev;
    uint32_t nev;
    uint64_t a = st_submit(s, 0, 0, 20, 4, 0);
    uint64_t b = st_submit(s, 0, 0, 8, 4, 1);
    struct sched_req_info ia, ib;
    struct sched_plan pl = st_step(s, &p, 1 * MS, &ev, &nev);
    cr_assert_eq(pl.n_entries, 1);
    cr_assert_eq(sched_req_info(s, a, &ia), 0);
    cr_assert_eq(ia.pages_reserved, 6, "reserved %u", ia.pages_reserved);
    for (int step = 2; step <= 4; step++) {
        pl = st_step(s, &p, (uint64_t)step * MS, &ev, &nev);
        cr_assert_eq(sched_req_info(s, b, &ib), 0);
        cr_assert_eq(ib.state, SCHED_REQ_WAITING, "step %d", step);
        cr_assert_null(st_entry(&pl, b));
    }
    cr_assert_eq(nev, 1);
    cr_assert_eq(ev[0].finish, SCHED_FINISH_LENGTH, "A done after 4 tokens");
    pl = st_step(s, &p, 5 * MS, &ev, &nev);
    entry_is(&pl, 0, b, 0, 8, false, true);
    cr_assert_eq(sched_req_info(s, b, &ib), 0);
    cr_assert_eq(ib.queue_ns, 5 * MS - 1, "queued from 1 ns to 5 ms");
    sched_destroy(s);
}

/* Release history: 4 pages over the first second gives 4 pages/s. With the
 * pool full, requests needing 2, 2 and 5 pages predict 0.5, 1.0 and 2.25 s:
 * the limit of 1 s refuses the third with Retry-After ceil(1.25) = 2. */
/* A held request is not admitted while held, whatever is free; it blocks
 * the requests of its tenant that rank below it but not another tenant's
 * (it takes no place in the admission line); released, it is admitted at
 * the next plan. Running requests cannot be held. */
Test(sched_plan, a_held_request_waits_and_blocks_no_other_tenant) {
    struct st_pool p;
    st_pool_init(&p, 64, 4);
    struct sched_config c = st_config(&p, 4, 64);
    struct sched *s = st_create(&c);
    const struct sched_event *ev;
    uint32_t nev;
    uint64_t a = st_submit(s, 0, 0, 8, 4, 0);
    uint64_t b = st_submit(s, 0, 0, 8, 4, 1);
    uint64_t other = st_submit(s, 1, 0, 8, 4, 2);
    cr_assert_eq(sched_set_held(s, a, true), 0);
    struct sched_plan pl = st_step(s, &p, 1 * MS, &ev, &nev);
    cr_assert_eq(pl.n_admitted, 1);
    cr_assert_eq(pl.admitted[0].id, other, "tenant 1 is not blocked by tenant 0's hold");
    struct sched_req_info info;
    cr_assert_eq(sched_req_info(s, a, &info), 0);
    cr_assert_eq(info.state, SCHED_REQ_WAITING);
    cr_assert_eq(sched_req_info(s, b, &info), 0);
    cr_assert_eq(info.state, SCHED_REQ_WAITING, "b ranks below the held a");
    cr_assert(sched_check(s));
    pl = st_step(s, &p, 2 * MS, &ev, &nev);
    cr_assert_eq(pl.n_admitted, 0, "still held");
    cr_assert_eq(sched_set_held(s, a, false), 0);
    pl = st_step(s, &p, 3 * MS, &ev, &nev);
    cr_assert_eq(pl.n_admitted, 2);
    cr_assert_eq(pl.admitted[0].id, a);
    cr_assert_eq(pl.admitted[1].id, b);
    cr_assert_eq(sched_set_held(s, a, true), -EBUSY, "running");
    cr_assert_eq(sched_set_held(s, 12345, true), -ENOENT);
    cr_assert(sched_check(s));
    sched_destroy(s);
}

/* regress: a held request that became its tenant's head kept the admission
 * ticket an earlier head had taken, and no other tenant admitted until the
 * hold ended (the ticket is given up with the hold). */
Test(sched_plan, a_held_head_gives_up_its_tenants_ticket) {
    struct st_pool p;
    st_pool_init(&p, 16, 4);
    struct sched_config c = st_config(&p, 4, 64);
    struct sched *s = st_create(&c);
    const struct sched_event *ev;
    uint32_t nev;
    uint64_t a = st_submit(s, 0, 0, 40, 8, 0);
    struct sched_plan pl = st_step(s, &p, 1 * MS, &ev, &nev);
    cr_assert_eq(pl.n_admitted, 1);
    uint64_t big = st_submit(s, 0, 0, 40, 8, 2 * MS); /* cannot fit: takes the ticket */
    uint64_t r = st_submit(s, 0, 0, 8, 4, 3 * MS);
    cr_assert_eq(sched_set_held(s, r, true), 0);
    pl = st_step(s, &p, 4 * MS, &ev, &nev);
    cr_assert_eq(pl.n_admitted, 0);
    cr_assert_eq(sched_cancel(s, big, 5 * MS, NULL), 0); /* r is the head now, held */
    uint64_t other = st_submit(s, 1, 0, 4, 4, 6 * MS);
    pl = st_step(s, &p, 7 * MS, &ev, &nev);
    cr_assert_eq(pl.n_admitted, 1, "tenant 1 waits behind tenant 0's held head");
    cr_assert_eq(pl.admitted[0].id, other);
    (void)a;
    cr_assert(sched_check(s));
    sched_destroy(s);
}

Test(sched_plan, refuses_when_predicted_wait_exceeds_limit) {
    struct st_pool p;
    st_pool_init(&p, 16, 4);
    struct sched_config c = st_config(&p, 4, 64);
    c.rate_window_ns = 1600 * MS; /* buckets of 100 ms */
    c.max_queue_wait_ns = 1000 * MS;
    struct sched *s = st_create(&c);
    const struct sched_event *ev;
    uint32_t nev;
    st_submit(s, 0, 0, 12, 1, 0);
    st_step(s, &p, 0, &ev, &nev);
    cr_assert_eq(ev[0].finish, SCHED_FINISH_LENGTH, "4 pages released at t=0");
    uint64_t l = st_submit(s, 0, 0, 60, 4, 900 * MS);
    st_step(s, &p, 900 * MS, &ev, &nev);
    struct sched_req_info il;
    cr_assert_eq(sched_req_info(s, l, &il), 0);
    cr_assert_eq(il.pages_reserved, 16);
    st_submit(s, 0, 0, 4, 4, 900 * MS);
    st_submit(s, 0, 0, 4, 4, 900 * MS);
    struct sched_request r = {.prompt_len = 16, .max_tokens = 4, .eos = SCHED_TOKEN_NONE};
    uint64_t id = 0;
    uint32_t retry = 0;
    cr_assert_eq(sched_submit(s, &r, 900 * MS, &id, &retry), -EAGAIN);
    cr_assert_eq(retry, 2, "retry after %u s", retry);
    struct sched_stats st;
    sched_stats_get(s, &st);
    cr_assert_eq(st.refusals_total, 1);
    cr_assert_eq(st.waiting, 2, "the refused request is not queued");
    /* once L is done the deficit is gone and the same request is accepted */
    for (int i = 0; i < 4; i++)
        st_step(s, &p, (901 + i) * MS, &ev, &nev);
    cr_assert_eq(sched_submit(s, &r, 905 * MS, &id, &retry), 0);
    sched_destroy(s);
}

Test(sched_plan, cold_start_queues_and_max_waiting_refuses) {
    struct st_pool p;
    st_pool_init(&p, 4, 4);
    struct sched_config c = st_config(&p, 2, 16);
    c.max_queue_wait_ns = 1; /* any positive predicted wait would refuse */
    c.max_waiting = 3;
    struct sched *s = st_create(&c);
    for (int i = 0; i < 3; i++)
        st_submit(s, 0, 0, 12, 4, 0); /* no release seen yet: queued, not refused */
    struct sched_request r = {.prompt_len = 4, .max_tokens = 1, .eos = SCHED_TOKEN_NONE};
    uint64_t id;
    uint32_t retry = 0;
    cr_assert_eq(sched_submit(s, &r, 0, &id, &retry), -EAGAIN);
    cr_assert_geq(retry, 1);
    sched_destroy(s);
}

/* 6 pages, each sequence holds 2 and A must cross into its third page: the
 * victim is the lowest priority (D), or with equal priorities the newest
 * (C). The victim recomputes prompt + its generated token and then finishes
 * with exactly the tokens it would have produced unpreempted. */
static void preempt_case(bool with_d) {
    struct st_pool p;
    st_pool_init(&p, with_d ? 8 : 6, 4);
    struct sched_config c = st_config(&p, 4, 64);
    c.headroom_pages = 0;
    c.max_ctx = 64;
    struct sched *s = st_create(&c);
    const struct sched_event *ev;
    uint32_t nev;
    uint64_t d = with_d ? st_submit(s, 0, 0, 5, 6, 0) : 0;
    uint64_t a = st_submit(s, 0, 5, 8, 4, 1); /* done before it needs a 4th page */
    uint64_t b = st_submit(s, 0, 1, 5, 6, 2);
    uint64_t cc = st_submit(s, 0, 1, 5, 6, 3);
    st_step(s, &p, 1 * MS, &ev, &nev);
    cr_assert_eq(p.free, 0);
    struct sched_plan pl = st_step(s, &p, 2 * MS, &ev, &nev);
    uint64_t victim = with_d ? d : cc;
    cr_assert_eq(pl.n_preempted, 1, "preempted %u", pl.n_preempted);
    cr_assert_eq(pl.preempted[0].id, victim);
    cr_assert_eq(pl.preempted[0].mode, SCHED_PREEMPT_RECOMPUTE);
    entry_is(&pl, 0, a, 8, 1, true, true);
    cr_assert_not_null(st_entry(&pl, b));
    struct sched_req_info iv;
    cr_assert_eq(sched_req_info(s, victim, &iv), 0);
    cr_assert_eq(iv.state, SCHED_REQ_WAITING);
    cr_assert_eq(iv.n_preempted, 1);
    cr_assert_eq(iv.n_generated, 1);
    cr_assert_eq(iv.n_target, 6, "prompt 5 + 1 generated token to recompute");
    int32_t got[8];
    uint32_t n_got = 1;
    got[0] = st_token(victim, 0);
    bool done = false;
    for (uint64_t t = 3; t < 40 && !done; t++) {
        pl = st_step(s, &p, t * MS, &ev, &nev);
        const struct sched_entry *e = st_entry(&pl, victim);
        if (e && !e->is_decode)
            cr_assert(e->pos0 + e->n_tokens <= 6, "recompute prefill ends at 6");
        for (uint32_t i = 0; i < nev; i++) {
            if (ev[i].id != victim)
                continue;
            got[n_got++] = ev[i].token;
            done = ev[i].finish != SCHED_FINISH_NONE;
            cr_assert_eq(ev[i].n_generated, n_got);
        }
    }
    cr_assert(done, "the victim finishes");
    cr_assert_eq(n_got, 6, "same total tokens: %u", n_got);
    for (uint32_t g = 0; g < n_got; g++)
        cr_assert_eq(got[g], st_token(victim, g), "token %u", g);
    struct sched_stats st;
    sched_stats_get(s, &st);
    cr_assert_eq(st.preemptions_total, 1);
    cr_assert_eq(st.recompute_tokens_total, 6);
    sched_destroy(s);
}

Test(sched_plan, preempts_lowest_priority) {
    preempt_case(true);
}

Test(sched_plan, preempts_newest_among_equals_and_victim_completes) {
    preempt_case(false);
}

/* Complete the current plan by hand: entry i gets tok[i] with text txt[i]. */
static const struct sched_event *complete_with(struct sched *s, const struct sched_plan *pl,
                                               const int32_t *tok, const char *const *txt,
                                               uint32_t *nev) {
    struct sched_result res[8];
    for (uint32_t i = 0; i < pl->n_entries; i++)
        res[i] = (struct sched_result){.id = pl->entries[i].id,
                                       .token = pl->entries[i].want_logits ? tok[i] : -1,
                                       .piece = txt[i],
                                       .piece_bytes = strlen(txt[i])};
    const struct sched_event *ev;
    cr_assert_eq(sched_complete(s, res, pl->n_entries, 0, &ev, nev), 0);
    return ev;
}

Test(sched_plan, finish_reasons) {
    struct st_pool p;
    st_pool_init(&p, 64, 4);
    struct sched_config c = st_config(&p, 4, 64);
    c.max_ctx = 12;
    struct sched *s = st_create(&c);
    const char *stops[] = {"END"};
    struct sched_request rq[4] = {
        {.prompt_len = 4, .max_tokens = 2, .eos = 2},                             /* length */
        {.prompt_len = 4, .max_tokens = 9, .eos = 2},                             /* eos */
        {.prompt_len = 4, .max_tokens = 9, .eos = 2, .stop = stops, .n_stop = 1}, /* stop */
        {.prompt_len = 9, .max_tokens = 0, .eos = 2}, /* context: 9 + 3 */
    };
    uint64_t id[4];
    for (int i = 0; i < 4; i++)
        cr_assert_eq(sched_submit(s, &rq[i], 0, &id[i], NULL), 0);
    struct sched_plan pl;
    uint32_t nev;
    const struct sched_event *ev;
    enum sched_finish want[4] = {SCHED_FINISH_LENGTH, SCHED_FINISH_EOS, SCHED_FINISH_STOP,
                                 SCHED_FINISH_CONTEXT};
    const char *text[3][4] = {{"a", "b", "xE", "c"}, {"d", "", "N", "e"}, {"-", "-", "D!", "f"}};
    const int32_t tok[3][4] = {{5, 5, 5, 5}, {5, 2, 5, 5}, {5, 5, 5, 5}};
    const char *want_text[4] = {"ad", "b", "x", "cef"};
    char got[4][16] = {{0}};
    enum sched_finish fin[4] = {0};
    for (int step = 0; step < 3; step++) {
        cr_assert_eq(sched_plan(s, 0, &pl), 0);
        int32_t t[4];
        const char *x[4];
        for (uint32_t i = 0; i < pl.n_entries; i++) {
            int k = 0;
            while (id[k] != pl.entries[i].id)
                k++;
            t[i] = tok[step][k];
            x[i] = text[step][k];
        }
        ev = complete_with(s, &pl, t, x, &nev);
        for (uint32_t i = 0; i < nev; i++) {
            int k = 0;
            while (id[k] != ev[i].id)
                k++;
            strncat(got[k], ev[i].text, ev[i].text_bytes);
            if (ev[i].finish)
                fin[k] = ev[i].finish;
        }
    }
    for (int k = 0; k < 4; k++) {
        cr_assert_eq(fin[k], want[k], "request %d: %s want %s", k, sched_finish_name(fin[k]),
                     sched_finish_name(want[k]));
        cr_assert_str_eq(got[k], want_text[k], "request %d", k);
    }
    struct sched_stats st;
    sched_stats_get(s, &st);
    for (int k = 0; k < 4; k++)
        cr_assert_eq(st.finish_total[want[k]], 1);
    cr_assert_eq(st.running, 0);
    cr_assert_str_eq(sched_finish_name(SCHED_FINISH_REFUSED), "refused");
    cr_assert_str_eq(sched_finish_name(SCHED_FINISH_CANCELLED), "cancelled");
    sched_destroy(s);
}

Test(sched_plan, cancel_releases_at_once) {
    struct st_pool p;
    st_pool_init(&p, 8, 4);
    struct sched_config c = st_config(&p, 4, 64);
    struct sched *s = st_create(&c);
    const struct sched_event *ev;
    uint32_t nev;
    uint64_t a = st_submit(s, 0, 0, 20, 8, 0);
    uint64_t b = st_submit(s, 0, 0, 8, 8, 0);
    st_step(s, &p, 0, &ev, &nev);
    uint32_t slot = 99;
    cr_assert_eq(sched_cancel(s, b, 1, &slot), 0, "cancel while waiting");
    cr_assert_eq(slot, SCHED_SLOT_NONE);
    struct sched_plan pl;
    cr_assert_eq(sched_plan(s, 2, &pl), 0);
    cr_assert_eq(sched_cancel(s, a, 2, &slot), -EBUSY, "not between plan and complete");
    st_pool_apply(&p, &pl);
    struct sched_result res[1];
    st_results(s, &pl, res);
    cr_assert_eq(sched_complete(s, res, 1, 2, &ev, &nev), 0);
    cr_assert_eq(sched_cancel(s, a, 3, &slot), 0);
    cr_assert_eq(slot, 0);
    st_pool_release(&p, slot);
    cr_assert_eq(sched_cancel(s, a, 3, &slot), -ENOENT);
    struct sched_stats st;
    sched_stats_get(s, &st);
    cr_assert_eq(st.cancelled_total, 2);
    cr_assert_eq(st.finish_total[SCHED_FINISH_CANCELLED], 2);
    cr_assert_eq(st.pages_reserved, 0);
    cr_assert_eq(st.running + st.waiting, 0);
    cr_assert_eq(p.free, 8);
    cr_assert(sched_check(s));
    sched_destroy(s);
}

Test(sched_plan, bad_calls) {
    struct st_pool p;
    st_pool_init(&p, 8, 4);
    struct sched_config c = st_config(&p, 4, 3);
    struct sched *s = NULL;
    cr_assert_eq(sched_create(&c, &s), -EINVAL, "max_batched_tokens < max_seqs");
    c = st_config(&p, 4, 16);
    c.preempt_mode = (enum sched_preempt_mode)7;
    cr_assert_eq(sched_create(&c, &s), -EINVAL, "unknown preemption mode");
    c = st_config(&p, 4, 16);
    struct sched_tenant_config tc[2] = {{1, 1, 0}, {1, 2, 0}};
    c.tenants = tc;
    c.n_tenants = 2;
    cr_assert_eq(sched_create(&c, &s), -EINVAL, "a tenant twice");
    tc[1].weight = 0;
    tc[1].tenant = 2;
    cr_assert_eq(sched_create(&c, &s), -EINVAL, "weight 0");
    c = st_config(&p, 4, 16);
    s = st_create(&c);
    struct sched_request r = {.prompt_len = 32, .eos = -1};
    uint64_t id;
    cr_assert_eq(sched_submit(s, &r, 0, &id, NULL), -E2BIG, "prompt fills the whole pool");
    r.prompt_len = 0;
    cr_assert_eq(sched_submit(s, &r, 0, &id, NULL), -EINVAL);
    const char *bad[] = {""};
    r = (struct sched_request){.prompt_len = 4, .stop = bad, .n_stop = 1, .eos = -1};
    cr_assert_eq(sched_submit(s, &r, 0, &id, NULL), -EINVAL);
    id = st_submit(s, 0, 0, 4, 4, 0);
    struct sched_plan pl;
    cr_assert_eq(sched_plan(s, 0, &pl), 0);
    cr_assert_eq(sched_plan(s, 0, &pl), -EBUSY);
    const struct sched_event *ev;
    uint32_t nev;
    struct sched_result res = {.id = id, .token = SCHED_TOKEN_NONE};
    cr_assert_eq(sched_complete(s, &res, 1, 0, &ev, &nev), -EINVAL, "want_logits needs a token");
    res.id = id + 1;
    res.token = 7;
    cr_assert_eq(sched_complete(s, &res, 1, 0, &ev, &nev), -EINVAL, "id mismatch");
    cr_assert_eq(sched_complete(s, &res, 0, 0, &ev, &nev), -EINVAL, "count mismatch");
    res.id = id;
    cr_assert_eq(sched_complete(s, &res, 1, 0, &ev, &nev), 0);
    cr_assert_eq(sched_complete(s, &res, 1, 0, &ev, &nev), -EINVAL, "no plan outstanding");
    cr_assert_eq(sched_tenant_set(s, &(struct sched_tenant_config){5, 0, 0}), -EINVAL);
    sched_destroy(s);
}

/* Every allocation in submit and complete can fail; nothing changes then. */
Test(sched_plan, allocation_failures_leave_no_trace) {
    struct st_pool p;
    st_pool_init(&p, 64, 4);
    struct sched_config c = st_config(&p, 4, 64);
    uint64_t base = mem_bytes(MEM_SCHED);
    for (uint64_t nth = 1; nth < 40; nth++) {
        struct sched *s = NULL;
        mem_fail_nth(nth);
        int rc = sched_create(&c, &s);
        mem_fail_nth(0);
        if (rc) {
            cr_assert_eq(rc, -ENOMEM);
            cr_assert_eq(mem_bytes(MEM_SCHED), base, "create nth %lu leaks", (unsigned long)nth);
            continue;
        }
        sched_destroy(s);
        break;
    }
    struct sched *s = st_create(&c);
    uint64_t after_create = mem_bytes(MEM_SCHED);
    const char *stops[] = {"zz"};
    struct sched_request r = {
        .tenant = 9, .prompt_len = 4, .max_tokens = 40, .eos = -1, .stop = stops, .n_stop = 1};
    uint64_t id = 0;
    int rc = -ENOMEM;
    for (uint64_t nth = 1; rc; nth++) {
        mem_fail_nth(nth);
        rc = sched_submit(s, &r, 0, &id, NULL);
        mem_fail_nth(0);
        if (rc) {
            cr_assert_eq(rc, -ENOMEM, "nth %lu: %d", (unsigned long)nth, rc);
            cr_assert_eq(mem_bytes(MEM_SCHED), after_create, "submit nth %lu leaks",
                         (unsigned long)nth);
            struct sched_stats st;
            sched_stats_get(s, &st);
            cr_assert_eq(st.tenants + st.waiting, 0, "nth %lu left a trace", (unsigned long)nth);
        }
    }
    /* the generated-token array grows at 16 tokens, the text arena at first use */
    const struct sched_event *ev;
    uint32_t nev;
    for (int step = 0; step < 30; step++) {
        struct sched_plan pl;
        cr_assert_eq(sched_plan(s, 0, &pl), 0);
        st_pool_apply(&p, &pl);
        struct sched_result res[1];
        st_results(s, &pl, res);
        mem_fail_nth(1);
        rc = sched_complete(s, res, 1, 0, &ev, &nev);
        mem_fail_nth(0);
        struct sched_req_info info;
        cr_assert_eq(sched_req_info(s, id, &info), 0);
        if (rc) {
            cr_assert_eq(rc, -ENOMEM);
            cr_assert_eq(info.n_generated, (uint32_t)(step ? step : 0), "unchanged on failure");
            cr_assert_eq(sched_complete(s, res, 1, 0, &ev, &nev), 0, "retry works");
        }
        cr_assert(sched_check(s));
    }
    sched_destroy(s);
    cr_assert_eq(mem_bytes(MEM_SCHED), base);
}

Test(sched_plan, stats_format) {
    struct st_pool p;
    st_pool_init(&p, 64, 4);
    struct sched_config c = st_config(&p, 4, 64);
    struct sched *s = st_create(&c);
    const struct sched_event *ev;
    uint32_t nev;
    st_submit(s, 3, 0, 6, 1, 0);
    st_step(s, &p, 0, &ev, &nev);
    char buf[2048];
    cr_assert_eq(sched_stats_format(s, buf, sizeof(buf)), 0);
    cr_assert(strstr(buf, "# sched\n"), "%s", buf);
    cr_assert(strstr(buf, "sched_prefill_tokens_total:6\n"), "%s", buf);
    cr_assert(strstr(buf, "sched_finished_length_total:1\n"), "%s", buf);
    cr_assert(strstr(buf, "sched_requests_waiting:0\n"), "%s", buf);
    cr_assert_eq(sched_stats_format(s, buf, 40), -ENOSPC);
    sched_destroy(s);
}
