/* The scheduler's part of speculative decoding (sched_draft_set, entry
 * n_draft, results with accepted draft tokens): a draft is appended to its
 * decode entry from what decodes and prefill chunks left (tokens and pages,
 * never a preemption), within what the request may still return; the
 * committed tokens come out as one event each, a finish among them drops
 * the rest, the KV of rejected positions does not count as computed, and
 * bad results change nothing. */
#include <criterion/criterion.h>

#include "tests/lib/sched_util.h"

/* A request of prompt `prompt` run until it decodes (its prefill done). */
static uint64_t decoding(struct sched *s, struct st_pool *p, uint32_t prompt, uint32_t max_tokens,
                         uint64_t *now) {
    uint64_t id = st_submit(s, 0, 0, prompt, max_tokens, *now);
    struct sched_req_info info = {0};
    for (int i = 0; i < 64 && info.n_generated == 0; i++) {
        const struct sched_event *ev;
        uint32_t n_ev = 0;
        st_step(s, p, ++*now, &ev, &n_ev);
        cr_assert_eq(sched_req_info(s, id, &info), 0);
    }
    cr_assert_eq(info.n_generated, 1, "the prefill's token");
    return id;
}

/* Two requests submitted together and stepped once: both prefilled, one
 * token each. */
static void two_decoding(struct sched *s, struct st_pool *p, uint32_t pa, uint32_t ma, uint32_t pb,
                         uint32_t mb, uint64_t *now, uint64_t *a, uint64_t *b) {
    *a = st_submit(s, 0, 0, pa, ma, *now);
    *b = st_submit(s, 0, 0, pb, mb, *now);
    const struct sched_event *ev;
    uint32_t n_ev = 0;
    st_step(s, p, ++*now, &ev, &n_ev);
    cr_assert_eq(n_ev, 2, "both prefilled in one step");
}

/* Results for plan pl: every entry the fake model's tokens; entry i0
 * accepts the first n_acc of its draft (st_token ids, pieces "a"). */
struct spec_res {
    struct sched_result res[ST_MAX_SLOTS];
    int32_t acc[SCHED_DRAFT_MAX];
    const char *piece[SCHED_DRAFT_MAX];
    size_t bytes[SCHED_DRAFT_MAX];
};

static void spec_results(struct sched *s, const struct sched_plan *pl, uint64_t id, uint32_t n_acc,
                         struct spec_res *r) {
    st_results(s, pl, r->res);
    for (uint32_t i = 0; i < pl->n_entries; i++) {
        if (pl->entries[i].id != id)
            continue;
        uint32_t g;
        sched_req_generated(s, id, &g);
        for (uint32_t j = 0; j < n_acc; j++) {
            r->acc[j] = st_token(id, g + j);
            r->piece[j] = "a";
            r->bytes[j] = 1;
        }
        r->res[i].n_accepted = n_acc;
        r->res[i].accepted = r->acc;
        r->res[i].accepted_piece = r->piece;
        r->res[i].accepted_piece_bytes = r->bytes;
        r->res[i].token = st_token(id, g + n_acc);
    }
}

Test(sched_spec, draft_rides_on_the_decode_and_commits_its_accepted_prefix) {
    struct st_pool p;
    st_pool_init(&p, 64, 16);
    struct sched_config c = st_config(&p, 4, 64);
    struct sched *s = st_create(&c);
    uint64_t now = 0, id = decoding(s, &p, 10, 50, &now);
    cr_assert_eq(sched_draft_set(s, id, 5), 0);
    struct sched_plan pl;
    cr_assert_eq(sched_plan(s, ++now, &pl), 0);
    cr_assert_eq(pl.n_entries, 1);
    const struct sched_entry *e = &pl.entries[0];
    cr_assert(e->is_decode && e->want_logits);
    cr_assert_eq(e->pos0, 10);
    cr_assert_eq(e->n_draft, 5);
    cr_assert_eq(e->n_tokens, 6);
    cr_assert_eq(pl.n_decode_tokens, 1);
    cr_assert_eq(pl.n_draft_tokens, 5);
    cr_assert_eq(pl.n_tokens, 6);
    st_pool_apply(&p, &pl);
    struct spec_res r;
    spec_results(s, &pl, id, 2, &r);
    const struct sched_event *ev;
    uint32_t n_ev;
    cr_assert_eq(sched_complete(s, r.res, 1, now, &ev, &n_ev), 0);
    cr_assert_eq(n_ev, 3, "two accepted draft tokens and the target's own");
    for (uint32_t j = 0; j < 3; j++) {
        cr_assert_eq(ev[j].id, id);
        cr_assert_eq(ev[j].token, st_token(id, 1 + j), "event %u", j);
        cr_assert_eq(ev[j].n_generated, 2 + j);
        cr_assert_eq(ev[j].finish, SCHED_FINISH_NONE);
        cr_assert_eq(ev[j].text_bytes, 1);
        cr_assert_eq(ev[j].text[0], j < 2 ? 'a' : 't');
    }
    struct sched_req_info info;
    cr_assert_eq(sched_req_info(s, id, &info), 0);
    cr_assert_eq(info.n_computed, 13, "positions 10..12 hold committed tokens, 13..15 rolled back");
    cr_assert_eq(info.n_generated, 4);
    uint32_t n;
    const int32_t *gen = sched_req_generated(s, id, &n);
    for (uint32_t j = 0; j < n; j++)
        cr_assert_eq(gen[j], st_token(id, j));
    /* the offer held for that plan only */
    cr_assert_eq(sched_plan(s, ++now, &pl), 0);
    cr_assert_eq(pl.entries[0].n_draft, 0);
    cr_assert_eq(pl.entries[0].n_tokens, 1);
    cr_assert_eq(pl.entries[0].pos0, 13);
    st_pool_apply(&p, &pl);
    st_results(s, &pl, r.res);
    cr_assert_eq(sched_complete(s, r.res, 1, now, &ev, &n_ev), 0);
    struct sched_stats st;
    sched_stats_get(s, &st);
    cr_assert_eq(st.spec_steps_total, 1);
    cr_assert_eq(st.spec_draft_tokens_total, 5);
    cr_assert_eq(st.spec_accepted_tokens_total, 2);
    cr_assert_eq(st.spec_accepted_len[2], 1);
    cr_assert_eq(st.generated_tokens_total, 5);
    cr_assert_eq(st.decode_tokens_total, 2);
    cr_assert(sched_check(s));
    sched_destroy(s);
}

Test(sched_spec, drafts_take_only_what_prefill_left) {
    struct st_pool p;
    st_pool_init(&p, 64, 16);
    struct sched_config c = st_config(&p, 4, 12);
    struct sched *s = st_create(&c);
    uint64_t now = 0, a = decoding(s, &p, 10, 50, &now);
    uint64_t b = st_submit(s, 0, 0, 5, 10, now);
    cr_assert_eq(sched_draft_set(s, a, 8), 0);
    struct sched_plan pl;
    cr_assert_eq(sched_plan(s, ++now, &pl), 0);
    cr_assert_eq(pl.n_entries, 2);
    cr_assert_eq(st_entry(&pl, b)->n_tokens, 5, "the prompt first");
    cr_assert_eq(st_entry(&pl, a)->n_draft, 6, "12 - 1 decode - 5 prefill");
    cr_assert_eq(pl.n_tokens, 12);
    cr_assert_eq(pl.entries[0].id, a, "the decode still comes first");
    sched_destroy(s);
}

Test(sched_spec, drafts_stop_at_what_the_request_may_return) {
    struct st_pool p;
    st_pool_init(&p, 64, 16);
    struct sched_config c = st_config(&p, 4, 64);
    c.max_ctx = 24;
    struct sched *s = st_create(&c);
    uint64_t now = 0, a, b;
    two_decoding(s, &p, 10, 4, 20, 0, &now, &a, &b); /* a: 1 of 4 generated; b: 21 of 24 */
    cr_assert_eq(sched_draft_set(s, a, 8), 0);
    cr_assert_eq(sched_draft_set(s, b, 8), 0);
    struct sched_plan pl;
    cr_assert_eq(sched_plan(s, ++now, &pl), 0);
    cr_assert_eq(st_entry(&pl, a)->n_draft, 2, "3 more tokens: the decode's and 2 drafted");
    cr_assert_eq(st_entry(&pl, b)->n_draft, 2, "3 tokens to the context");
    st_pool_apply(&p, &pl);
    struct spec_res r;
    spec_results(s, &pl, a, 2, &r);
    /* b accepts both too: its entry in r.res is the second */
    struct spec_res r2;
    spec_results(s, &pl, b, 2, &r2);
    for (uint32_t i = 0; i < pl.n_entries; i++)
        if (pl.entries[i].id == b)
            r.res[i] = r2.res[i];
    const struct sched_event *ev;
    uint32_t n_ev;
    cr_assert_eq(sched_complete(s, r.res, pl.n_entries, now, &ev, &n_ev), 0);
    cr_assert_eq(n_ev, 6);
    cr_assert_eq(ev[2].finish, SCHED_FINISH_LENGTH);
    cr_assert_eq(ev[2].n_generated, 4);
    cr_assert_eq(ev[5].finish, SCHED_FINISH_CONTEXT);
    cr_assert_eq(ev[5].n_generated, 4);
    cr_assert(sched_check(s));
    sched_destroy(s);
}

Test(sched_spec, a_draft_never_preempts_and_fits_the_pages_left) {
    struct st_pool p;
    st_pool_init(&p, 3, 16); /* 48 tokens in all */
    struct sched_config c = st_config(&p, 4, 64);
    c.headroom_pages = 0;
    struct sched *s = st_create(&c);
    uint64_t now = 0, a, b;
    two_decoding(s, &p, 14, 0, 30, 0, &now, &a, &b); /* 1 page and 2: the pool is full */
    cr_assert_eq(p.free, 0);
    cr_assert_eq(sched_draft_set(s, a, 8), 0);
    struct sched_plan pl;
    cr_assert_eq(sched_plan(s, ++now, &pl), 0);
    cr_assert_eq(pl.n_preempted, 0);
    cr_assert_eq(st_entry(&pl, a)->n_draft, 1, "positions 14 and 15: the rest of its page");
    cr_assert_eq(st_entry(&pl, b)->n_draft, 0);
    (void)b;
    sched_destroy(s);
}

Test(sched_spec, a_finish_inside_the_run_drops_what_follows) {
    struct st_pool p;
    st_pool_init(&p, 64, 16);
    struct sched_config c = st_config(&p, 4, 64);
    struct sched *s = st_create(&c);
    const char *stops[] = {"STOP"};
    struct sched_request q = {.prompt_len = 6, .eos = 77, .stop = stops, .n_stop = 1};
    uint64_t now = 0, id[2];
    for (int k = 0; k < 2; k++) {
        cr_assert_eq(sched_submit(s, &q, now, &id[k], NULL), 0);
        const struct sched_event *ev;
        uint32_t n_ev = 0;
        while (n_ev == 0)
            st_step(s, &p, ++now, &ev, &n_ev);
    }
    for (int k = 0; k < 2; k++)
        cr_assert_eq(sched_draft_set(s, id[k], 4), 0);
    struct sched_plan pl;
    cr_assert_eq(sched_plan(s, ++now, &pl), 0);
    st_pool_apply(&p, &pl);
    /* id[0]: "x", "ST", "OP" accepted, then "y": the stop completes on the third.
     * id[1]: "x", EOS accepted, then "y" */
    static const int32_t acc0[3] = {20, 21, 22}, acc1[2] = {20, 77};
    static const char *piece0[3] = {"x", "ST", "OP"}, *piece1[2] = {"x", ""};
    static const size_t bytes0[3] = {1, 2, 2}, bytes1[2] = {1, 0};
    struct sched_result res[2];
    for (uint32_t i = 0; i < 2; i++) {
        bool first = pl.entries[i].id == id[0];
        res[i] = (struct sched_result){.id = pl.entries[i].id,
                                       .token = 30,
                                       .piece = "y",
                                       .piece_bytes = 1,
                                       .n_accepted = first ? 3 : 2,
                                       .accepted = first ? acc0 : acc1,
                                       .accepted_piece = first ? piece0 : piece1,
                                       .accepted_piece_bytes = first ? bytes0 : bytes1};
    }
    const struct sched_event *ev;
    uint32_t n_ev;
    struct sched_stats st0;
    sched_stats_get(s, &st0);
    cr_assert_eq(sched_complete(s, res, 2, now, &ev, &n_ev), 0);
    cr_assert_eq(n_ev, 5, "3 tokens to the stop, 2 to the EOS");
    char text[64] = "";
    for (uint32_t j = 0; j < n_ev; j++) {
        if (ev[j].id == id[0])
            strncat(text, ev[j].text, ev[j].text_bytes);
        if (j + 1 < n_ev && ev[j + 1].id == ev[j].id)
            cr_assert_eq(ev[j].finish, SCHED_FINISH_NONE);
        else
            cr_assert_eq(ev[j].finish, ev[j].id == id[0] ? SCHED_FINISH_STOP : SCHED_FINISH_EOS,
                         "event %u: finish %d", j, ev[j].finish);
    }
    cr_assert_str_eq(text, "x", "the text ends before the stop string");
    struct sched_stats st;
    sched_stats_get(s, &st);
    cr_assert_eq(st.spec_accepted_tokens_total, 5, "the accepted tokens up to the finish");
    cr_assert_eq(st.generated_tokens_total - st0.generated_tokens_total, 5);
    cr_assert_eq(st.running, 0);
    cr_assert(sched_check(s));
    sched_destroy(s);
}

Test(sched_spec, bad_calls_change_nothing) {
    struct st_pool p;
    st_pool_init(&p, 64, 16);
    struct sched_config c = st_config(&p, 4, 64);
    struct sched *s = st_create(&c);
    uint64_t now = 0, id = decoding(s, &p, 10, 50, &now);
    uint64_t waiting = st_submit(s, 0, 0, 30, 10, now);
    cr_assert_eq(sched_draft_set(s, waiting, 2), -EINVAL, "waiting");
    cr_assert_eq(sched_draft_set(s, id, SCHED_DRAFT_MAX + 1), -EINVAL);
    cr_assert_eq(sched_draft_set(s, id ^ (1ull << 40), 2), -ENOENT);
    cr_assert_eq(sched_draft_set(s, id, 3), 0);
    struct sched_plan pl;
    cr_assert_eq(sched_plan(s, ++now, &pl), 0);
    cr_assert_eq(sched_draft_set(s, id, 2), -EBUSY);
    cr_assert_eq(sched_draft_set(s, waiting, 2), -EBUSY);
    st_pool_apply(&p, &pl);
    struct spec_res r;
    spec_results(s, &pl, id, 3, &r);
    uint32_t i = st_entry(&pl, id) - pl.entries;
    r.res[i].n_accepted = 4; /* more than drafted */
    const struct sched_event *ev;
    uint32_t n_ev;
    cr_assert_eq(sched_complete(s, r.res, pl.n_entries, now, &ev, &n_ev), -EINVAL);
    r.res[i].n_accepted = 3;
    r.res[i].accepted = NULL;
    cr_assert_eq(sched_complete(s, r.res, pl.n_entries, now, &ev, &n_ev), -EINVAL);
    r.res[i].accepted = r.acc;
    r.acc[1] = -5;
    cr_assert_eq(sched_complete(s, r.res, pl.n_entries, now, &ev, &n_ev), -EINVAL);
    struct sched_req_info info;
    cr_assert_eq(sched_req_info(s, id, &info), 0);
    cr_assert_eq(info.n_generated, 1, "nothing changed");
    r.acc[1] = st_token(id, 2);
    cr_assert_eq(sched_complete(s, r.res, pl.n_entries, now, &ev, &n_ev), 0);
    cr_assert_eq(sched_req_info(s, id, &info), 0);
    cr_assert_eq(info.n_generated, 5);
    cr_assert_eq(info.n_computed, 14);
    cr_assert(sched_check(s));
    sched_destroy(s);
}

Test(sched_spec, complete_grows_the_token_array_for_a_long_run) {
    struct st_pool p;
    st_pool_init(&p, 64, 16);
    struct sched_config c = st_config(&p, 1, 64);
    struct sched *s = st_create(&c);
    uint64_t now = 0, id = decoding(s, &p, 4, 200, &now);
    for (int step = 0; step < 6; step++) {
        cr_assert_eq(sched_draft_set(s, id, SCHED_DRAFT_MAX), 0);
        struct sched_plan pl;
        cr_assert_eq(sched_plan(s, ++now, &pl), 0);
        cr_assert_eq(pl.entries[0].n_draft, SCHED_DRAFT_MAX);
        st_pool_apply(&p, &pl);
        struct spec_res r;
        spec_results(s, &pl, id, SCHED_DRAFT_MAX, &r);
        /* the first try fails its growth: nothing changes, the retry works */
        mem_fail_nth(step == 0 ? 1 : 0);
        const struct sched_event *ev;
        uint32_t n_ev;
        int rc = sched_complete(s, r.res, 1, now, &ev, &n_ev);
        mem_fail_nth(0);
        if (step == 0) {
            cr_assert_eq(rc, -ENOMEM);
            rc = sched_complete(s, r.res, 1, now, &ev, &n_ev);
        }
        cr_assert_eq(rc, 0);
        cr_assert_eq(n_ev, SCHED_DRAFT_MAX + 1);
    }
    uint32_t n;
    const int32_t *gen = sched_req_generated(s, id, &n);
    cr_assert_eq(n, 1 + 6 * (SCHED_DRAFT_MAX + 1));
    for (uint32_t j = 0; j < n; j++)
        cr_assert_eq(gen[j], st_token(id, j), "token %u", j);
    sched_destroy(s);
}
