/* Concurrency: a scheduler thread and a map-ahead thread on one pool, on
 * different ranges and on the same ranges, plus an observer calling vmm_check
 * and the formatters. Threads record failures in counters (Criterion asserts
 * belong to the test's own thread); the test checks them after join. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "tests/lib/vmm_util.h"

#define N_RANGES 8
#define MAX_P    8
#define TPP      64
#define N_OPS    4000

struct ctx {
    struct vmm *v;
    atomic_bool stop;
    atomic_int bad;          /* unexpected return codes */
    atomic_int bad_bytes;    /* pages that lost their contents */
    atomic_int bad_check;    /* vmm_check failures seen by the observer */
    atomic_long ahead_pages; /* pages the map-ahead thread mapped */
    uint32_t seed;
};

static uint32_t rnd(uint32_t *s, uint32_t n) {
    *s = *s * 1664525u + 1013904223u;
    return (*s >> 8) % n;
}

static uint64_t *page_word(struct vmm *v, uint32_t r, uint32_t idx) {
    return (uint64_t *)(vmm_range_base(v, r) + (uintptr_t)idx * vmm_page_bytes(v));
}

/* Map ahead on every range (the scheduler's included), and grow/shrink its
 * own ranges 4..7. */
static void *ahead_main(void *arg) {
    struct ctx *c = arg;
    uint32_t s = 7;
    for (int i = 0; i < N_OPS; i++) {
        uint32_t r = rnd(&s, N_RANGES);
        int rc = vmm_range_map_ahead(c->v, r, 1 + rnd(&s, 2));
        if (rc > 0)
            c->ahead_pages += rc;
        else if (rc != 0 && rc != -ENOSPC && rc != -EINVAL)
            c->bad++;
        if (r >= 4 && rnd(&s, 2) == 0 && vmm_range_shrink(c->v, r, rnd(&s, 2 * TPP)) != 0)
            c->bad++;
    }
    return NULL;
}

/* vmm_check and the text formats, in a loop, until told to stop. */
static void *observer_main(void *arg) {
    struct ctx *c = arg;
    char buf[2048];
    while (!c->stop) {
        if (!vmm_check(c->v))
            c->bad_check++;
        if (vmm_stats_format(c->v, buf, sizeof buf) || vmm_pool_map_format(c->v, buf, sizeof buf))
            c->bad++;
    }
    return NULL;
}

/* The scheduler: ranges 0..3, grow (tagging new pages), check tags, shrink,
 * share and cow between its ranges, release and re-acquire. */
static void scheduler(struct ctx *c) {
    uint64_t tags[N_RANGES][MAX_P] = {{0}};
    uint32_t tokens[N_RANGES] = {0};
    uint32_t s = c->seed;
    for (int i = 0; i < N_OPS; i++) {
        uint32_t r = rnd(&s, 4), op = rnd(&s, 10);
        if (op < 5) {
            uint32_t n = rnd(&s, MAX_P * TPP + 1), need = (n + TPP - 1) / TPP;
            int rc = vmm_range_grow(c->v, r, n);
            if (rc == 0) {
                for (uint32_t k = (tokens[r] + TPP - 1) / TPP; k < need; k++) {
                    tags[r][k] = ((uint64_t)i << 8) | (r << 4) | k;
                    *page_word(c->v, r, k) = tags[r][k];
                }
                if (n > tokens[r])
                    tokens[r] = n;
            } else if (rc != -ENOSPC) {
                c->bad++;
            }
        } else if (op < 7) {
            uint32_t n = rnd(&s, tokens[r] + 1);
            if (vmm_range_shrink(c->v, r, n) != 0)
                c->bad++;
            tokens[r] = n;
        } else if (op < 8 && tokens[r] == 0) {
            /* share a page of another range as page 0, then make it private */
            uint32_t o = rnd(&s, 4), p = vmm_range_page(c->v, o, 0);
            if (o != r && p != VMM_PAGE_NONE && tokens[o] && vmm_range_shrink(c->v, r, 0) == 0 &&
                vmm_range_share(c->v, r, p) == 0) {
                /* share appends at n_mapped: if the map-ahead thread mapped
                 * a page into r between the shrink and the share, p landed
                 * at index 1, not 0 (regress_share_races_map_ahead) */
                if (vmm_range_page(c->v, r, 0) != p) {
                    vmm_range_shrink(c->v, r, 0);
                    tokens[r] = 0;
                    continue;
                }
                int rc = vmm_range_cow(c->v, r, 0);
                if (rc == 0) {
                    if (*page_word(c->v, r, 0) != tags[o][0])
                        c->bad_bytes++;
                    tags[r][0] = tags[o][0] + 1;
                    *page_word(c->v, r, 0) = tags[r][0];
                    tokens[r] = 1;
                } else if (rc == -ENOSPC) {
                    vmm_range_shrink(c->v, r, 0);
                } else {
                    c->bad++;
                }
            }
        } else if (op < 9) {
            if (vmm_range_release(c->v, r) != 0)
                c->bad++;
            uint32_t got;
            if (vmm_range_acquire(c->v, &got) != 0 || got != r)
                c->bad++;
            tokens[r] = 0;
        }
        for (uint32_t k = 0; k < (tokens[r] + TPP - 1) / TPP; k++)
            if (*page_word(c->v, r, k) != tags[r][k])
                c->bad_bytes++;
    }
}

Test(vmm_thread, scheduler_and_map_ahead_threads_keep_invariants, .timeout = 60) {
    struct ctx c = {.v = vt_pool(40, N_RANGES, MAX_P * TPP, false), .seed = 12345};
    uint32_t r;
    for (int i = 0; i < N_RANGES; i++)
        cr_assert_eq(vmm_range_acquire(c.v, &r), 0);
    pthread_t ahead, obs;
    cr_assert_eq(pthread_create(&ahead, NULL, ahead_main, &c), 0);
    cr_assert_eq(pthread_create(&obs, NULL, observer_main, &c), 0);
    scheduler(&c);
    pthread_join(ahead, NULL);
    c.stop = true;
    pthread_join(obs, NULL);
    cr_assert_eq(c.bad, 0, "unexpected return codes: %d", c.bad);
    cr_assert_eq(c.bad_bytes, 0, "pages that lost their bytes: %d", c.bad_bytes);
    cr_assert_eq(c.bad_check, 0, "vmm_check failures: %d", c.bad_check);
    cr_assert(vmm_check(c.v));
    struct vmm_stats s;
    vmm_stats_get(c.v, &s);
    cr_assert_eq(s.map_ahead_pages_total, (uint64_t)c.ahead_pages);
    cr_assert_gt(s.map_ahead_pages_total, 0, "the map-ahead thread did work");
    cr_log_info("map-ahead pages %lu, grows that waited %lu, cows %lu",
                (unsigned long)s.map_ahead_pages_total, (unsigned long)s.grow_waited_total,
                (unsigned long)s.cow_total);
    vmm_destroy(c.v);
    cr_assert_eq(vt_memfd_maps(), 0);
}
