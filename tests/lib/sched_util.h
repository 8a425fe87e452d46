/* sched_util.h - a fake page pool and a fake model for the scheduler
 * tests. The pool plays the engine's part exactly as docs/scheduler.md says
 * it must: release preempted slots, then grow each entry's slot to back
 * pos0 + n_tokens tokens, evicting cached pages when the free list is short;
 * it fails the test if a step ever needs a page that is not there. The model
 * samples token (id-derived seed + generation index) % 1000 + 10, never EOS
 * unless a test asks for it, and every token's text is "t".
 */
#ifndef LLMD_SCHED_TEST_UTIL_H
#define LLMD_SCHED_TEST_UTIL_H

#include <criterion/criterion.h>
#include <errno.h>
#include <string.h>

#include "engine/core/sched.h"
#include "mem.h"

#define ST_MAX_SLOTS 64

struct st_pool {
    uint32_t n_pages, tpp;
    uint32_t free, evictable;
    uint32_t held[ST_MAX_SLOTS];
    uint32_t evictions;
};

static uint32_t st_free_pages(void *ctx) {
    return ((struct st_pool *)ctx)->free;
}
static uint32_t st_evictable_pages(void *ctx) {
    return ((struct st_pool *)ctx)->evictable;
}
static uint32_t st_seq_pages(void *ctx, uint32_t slot) {
    return slot < ST_MAX_SLOTS ? ((struct st_pool *)ctx)->held[slot] : 0;
}

static const struct sched_page_ops st_ops = {
    .free_pages = st_free_pages,
    .evictable_pages = st_evictable_pages,
    .seq_pages = st_seq_pages,
};

static inline void st_pool_init(struct st_pool *p, uint32_t n_pages, uint32_t tpp) {
    memset(p, 0, sizeof(*p));
    p->n_pages = n_pages;
    p->tpp = tpp;
    p->free = n_pages;
}

static inline void st_pool_release(struct st_pool *p, uint32_t slot) {
    cr_assert_lt(slot, ST_MAX_SLOTS);
    p->free += p->held[slot];
    p->held[slot] = 0;
}

/* A config with small, test-friendly defaults over pool p. */
static inline struct sched_config st_config(struct st_pool *p, uint32_t max_seqs,
                                            uint32_t max_batched) {
    return (struct sched_config){
        .ops = &st_ops,
        .ops_ctx = p,
        .n_pages = p->n_pages,
        .tokens_per_page = p->tpp,
        .max_ctx = p->n_pages * p->tpp,
        .max_seqs = max_seqs,
        .max_batched_tokens = max_batched,
        .headroom_pages = 1,
    };
}

static inline struct sched *st_create(const struct sched_config *c) {
    struct sched *s = NULL;
    int rc = sched_create(c, &s);
    cr_assert_eq(rc, 0, "sched_create: %d", rc);
    return s;
}

static inline uint64_t st_submit(struct sched *s, uint32_t tenant, int32_t prio, uint32_t prompt,
                                 uint32_t max_tokens, uint64_t now) {
    struct sched_request r = {.tenant = tenant,
                              .priority = prio,
                              .prompt_len = prompt,
                              .max_tokens = max_tokens,
                              .eos = SCHED_TOKEN_NONE};
    uint64_t id = 0;
    int rc = sched_submit(s, &r, now, &id, NULL);
    cr_assert_eq(rc, 0, "submit prompt %u: %d", prompt, rc);
    return id;
}

/* Play the engine's part for plan pl on pool p: preempted slots first, then
 * grow every entry's slot. Asserts a page is there for each growth. */
static inline void st_pool_apply(struct st_pool *p, const struct sched_plan *pl) {
    for (uint32_t i = 0; i < pl->n_preempted; i++)
        st_pool_release(p, pl->preempted[i].slot);
    for (uint32_t i = 0; i < pl->n_admitted; i++)
        cr_assert_eq(p->held[pl->admitted[i].slot], 0, "admitted into busy slot %u",
                     pl->admitted[i].slot);
    for (uint32_t i = 0; i < pl->n_entries; i++) {
        const struct sched_entry *e = &pl->entries[i];
        uint32_t want = (e->pos0 + e->n_tokens + p->tpp - 1) / p->tpp;
        while (p->held[e->slot] < want) {
            if (p->free == 0) {
                cr_assert_gt(p->evictable, 0, "step needs a page: none free or evictable (slot %u)",
                             e->slot);
                p->evictable--;
                p->free++;
                p->evictions++;
            }
            p->free--;
            p->held[e->slot]++;
        }
    }
}

static inline int32_t st_token(uint64_t id, uint32_t g) {
    return (int32_t)(((id * 2654435761u) + g * 40503u) % 1000u) + 10;
}

/* Results for plan pl from the fake model: tokens are st_token(id, n_gen). */
static inline void st_results(struct sched *s, const struct sched_plan *pl,
                              struct sched_result *res) {
    for (uint32_t i = 0; i < pl->n_entries; i++) {
        const struct sched_entry *e = &pl->entries[i];
        res[i] = (struct sched_result){.id = e->id, .token = SCHED_TOKEN_NONE};
        if (e->want_logits) {
            uint32_t n;
            sched_req_generated(s, e->id, &n);
            res[i].token = st_token(e->id, n);
            res[i].piece = "t";
            res[i].piece_bytes = 1;
        }
    }
}

/* One whole step: plan, apply, complete, release finished slots. Returns
 * the plan (valid until the next step) and the events. */
static inline struct sched_plan st_step(struct sched *s, struct st_pool *p, uint64_t now,
                                        const struct sched_event **ev, uint32_t *n_ev) {
    struct sched_plan pl;
    int rc = sched_plan(s, now, &pl);
    cr_assert_eq(rc, 0, "plan: %d", rc);
    st_pool_apply(p, &pl);
    *n_ev = 0;
    if (pl.n_entries) {
        struct sched_result res[ST_MAX_SLOTS];
        st_results(s, &pl, res);
        rc = sched_complete(s, res, pl.n_entries, now, ev, n_ev);
        cr_assert_eq(rc, 0, "complete: %d", rc);
        for (uint32_t i = 0; i < *n_ev; i++)
            if ((*ev)[i].finish != SCHED_FINISH_NONE)
                st_pool_release(p, (*ev)[i].slot);
    }
    cr_assert(sched_check(s), "sched_check after step at %lu", (unsigned long)now);
    return pl;
}

/* The entry of id in pl, or NULL. */
static inline const struct sched_entry *st_entry(const struct sched_plan *pl, uint64_t id) {
    for (uint32_t i = 0; i < pl->n_entries; i++)
        if (pl->entries[i].id == id)
            return &pl->entries[i];
    return NULL;
}

#endif /* LLMD_SCHED_TEST_UTIL_H */
