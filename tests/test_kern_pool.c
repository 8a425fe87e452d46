/* The kernel thread pool: every slot runs exactly once per run, over many
 * runs; late or slow workers; NULL pool; scratch; allocation failures. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdatomic.h>
#include <time.h>

#include "kernels/kern.h"
#include "mem.h"

#define MAXT 8

struct count_arg {
    _Atomic int hits[MAXT];
    _Atomic int bad_nth;
    int want_nth;
    int slow_slot; /* -1: none; this slot sleeps 200 us */
};

static void count_fn(void *a, int ith, int nth) {
    struct count_arg *c = a;
    if (nth != c->want_nth || ith < 0 || ith >= nth)
        atomic_fetch_add(&c->bad_nth, 1);
    else
        atomic_fetch_add(&c->hits[ith], 1);
    if (ith == c->slow_slot) {
        struct timespec ts = {0, 200000};
        nanosleep(&ts, NULL);
    }
}

static void run_many(int n_threads, int n_runs, int slow_slot) {
    struct kern_pool *p;
    cr_assert_eq(kern_pool_create(n_threads, &p), 0);
    cr_assert_eq(kern_pool_n_threads(p), n_threads);
    for (int r = 0; r < n_runs; r++) {
        struct count_arg c = {.want_nth = n_threads, .slow_slot = (r % 7 == 0) ? slow_slot : -1};
        kern_pool_run(p, count_fn, &c);
        cr_assert_eq(atomic_load(&c.bad_nth), 0, "run %d: wrong nth/ith", r);
        for (int i = 0; i < n_threads; i++)
            cr_assert_eq(atomic_load(&c.hits[i]), 1, "run %d slot %d ran %d times", r, i,
                         atomic_load(&c.hits[i]));
    }
    kern_pool_destroy(p);
}

Test(kern_pool, each_slot_once_per_run_2_threads) {
    run_many(2, 20000, -1);
}

Test(kern_pool, each_slot_once_per_run_oversubscribed) {
    run_many(5, 5000, -1); /* more threads than the 2 vCPUs: workers get descheduled */
}

Test(kern_pool, slow_slots_still_once) {
    run_many(3, 700, 0);
    run_many(3, 700, 2);
}

Test(kern_pool, runs_after_workers_slept) {
    struct kern_pool *p;
    cr_assert_eq(kern_pool_create(3, &p), 0);
    for (int r = 0; r < 4; r++) {
        struct timespec ts = {0, 3 * 1000 * 1000}; /* past the spin budget: workers sleep */
        nanosleep(&ts, NULL);
        struct count_arg c = {.want_nth = 3, .slow_slot = -1};
        kern_pool_run(p, count_fn, &c);
        for (int i = 0; i < 3; i++)
            cr_assert_eq(atomic_load(&c.hits[i]), 1, "run %d slot %d", r, i);
    }
    kern_pool_destroy(p);
}

Test(kern_pool, null_and_single_thread_run_inline) {
    struct count_arg c = {.want_nth = 1, .slow_slot = -1};
    kern_pool_run(NULL, count_fn, &c);
    cr_assert_eq(atomic_load(&c.hits[0]), 1);
    cr_assert_eq(kern_pool_n_threads(NULL), 1);
    struct kern_pool *p;
    cr_assert_eq(kern_pool_create(1, &p), 0);
    kern_pool_run(p, count_fn, &c);
    cr_assert_eq(atomic_load(&c.hits[0]), 2);
    kern_pool_destroy(p);
    kern_pool_destroy(NULL);
}

Test(kern_pool, default_threads_is_online_cpus) {
    struct kern_pool *p;
    cr_assert_eq(kern_pool_create(0, &p), 0);
    cr_assert_geq(kern_pool_n_threads(p), 1);
    kern_pool_destroy(p);
}

Test(kern_pool, scratch_grows_and_fails_cleanly) {
    struct kern_pool *p;
    cr_assert_eq(kern_pool_create(2, &p), 0);
    cr_assert_null(kern_pool_scratch(NULL, 10));
    char *a = kern_pool_scratch(p, 100);
    cr_assert_not_null(a);
    cr_assert_eq((uintptr_t)a % 64, 0);
    cr_assert_eq(kern_pool_scratch(p, 50), a, "a smaller request reuses the buffer");
    mem_fail_nth(1);
    cr_assert_null(kern_pool_scratch(p, 1 << 20), "injected OOM");
    cr_assert_eq(kern_pool_scratch(p, 100), a, "the old buffer stays");
    char *b = kern_pool_scratch(p, 1 << 20);
    cr_assert_not_null(b);
    b[(1 << 20) - 1] = 1;
    kern_pool_destroy(p);
}

Test(kern_pool, create_fails_cleanly_on_oom) {
    uint64_t held = mem_bytes(MEM_KERN);
    for (uint64_t n = 1; n <= 2; n++) {
        struct kern_pool *p = (struct kern_pool *)0x1;
        mem_fail_nth(n);
        cr_assert_eq(kern_pool_create(3, &p), -ENOMEM, "allocation %lu fails", (unsigned long)n);
        cr_assert_eq(p, (struct kern_pool *)0x1, "out untouched");
        cr_assert_eq(mem_bytes(MEM_KERN), held, "nothing leaked");
    }
    mem_fail_nth(0);
}
