/* The kernel thread pool: every slot runs exactly once per run, over many
 * runs; late or slow workers; NULL pool; scratch; allocation failures; the
 * solo periods of an oversubscribed machine. */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

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

/* --- solo periods ------------------------------------------------------- */

struct who_arg {
    pthread_t caller;
    _Atomic int hits[MAXT];
    _Atomic int elsewhere; /* slots run off the caller thread */
    long spin_ns;          /* slot 0 spins this long */
};

static long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

static void who_fn(void *a, int ith, int nth) {
    struct who_arg *w = a;
    (void)nth;
    atomic_fetch_add(&w->hits[ith], 1);
    if (!pthread_equal(pthread_self(), w->caller))
        atomic_fetch_add(&w->elsewhere, 1);
    if (ith == 0)
        for (long t0 = now_ns(); now_ns() - t0 < w->spin_ns;)
            ;
}

/* A solo period runs every slot once, all on the caller thread; after it
 * the workers take slots again. */
Test(kern_pool, a_solo_period_runs_every_slot_on_the_caller, .timeout = 30) {
    struct kern_pool *p;
    cr_assert_eq(kern_pool_create(3, &p), 0);
    kern_pool_test_solo(p, 60000000000ull); /* a minute: the loop ends it */
    for (int r = 0; r < 200; r++) {
        struct who_arg w = {.caller = pthread_self()};
        kern_pool_run(p, who_fn, &w);
        for (int i = 0; i < 3; i++)
            cr_assert_eq(atomic_load(&w.hits[i]), 1, "run %d slot %d", r, i);
        cr_assert_eq(atomic_load(&w.elsewhere), 0, "run %d: a slot ran on a worker", r);
    }
    kern_pool_test_solo(p, 0);
    int elsewhere = 0;
    for (int r = 0; r < 5000 && !elsewhere; r++) {
        /* a loaded machine (tests run side by side) may start a solo
         * period of its own: end it, this test is about the forced one */
        if (kern_pool_solo_periods(p))
            kern_pool_test_solo(p, 0);
        struct who_arg w = {.caller = pthread_self(), .spin_ns = 200000};
        kern_pool_run(p, who_fn, &w);
        for (int i = 0; i < 3; i++)
            cr_assert_eq(atomic_load(&w.hits[i]), 1, "run %d slot %d", r, i);
        elsewhere = atomic_load(&w.elsewhere);
    }
    cr_assert_gt(elsewhere, 0, "the workers took no slot after the solo period");
    kern_pool_destroy(p);
}

static _Atomic int hog_stop;
static void *hog(void *a) {
    (void)a;
    while (!atomic_load_explicit(&hog_stop, memory_order_relaxed))
        ;
    return NULL;
}

/* Twice as many spinning threads as CPUs (up to 128 CPUs): the caller is
 * off its CPU about two thirds of the time, so a pool of two goes solo
 * within a few windows of 20 ms (its threshold is a fifth). */
Test(kern_pool, an_oversubscribed_machine_starts_a_solo_period, .timeout = 60) {
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int nh = (int)(ncpu > 0 && ncpu < 64 ? 2 * ncpu : 128);
    pthread_t h[128];
    atomic_store(&hog_stop, 0);
    for (int i = 0; i < nh; i++)
        cr_assert_eq(pthread_create(&h[i], NULL, hog, NULL), 0);
    struct kern_pool *p;
    cr_assert_eq(kern_pool_create(2, &p), 0);
    long t0 = now_ns();
    while (kern_pool_solo_periods(p) == 0 && now_ns() - t0 < 20000000000L) {
        struct who_arg w = {.caller = pthread_self(), .spin_ns = 100000};
        kern_pool_run(p, who_fn, &w);
        cr_assert_eq(atomic_load(&w.hits[0]) + atomic_load(&w.hits[1]), 2);
    }
    uint64_t solo = kern_pool_solo_periods(p);
    atomic_store(&hog_stop, 1);
    for (int i = 0; i < nh; i++)
        pthread_join(h[i], NULL);
    kern_pool_destroy(p);
    cr_assert_gt(solo, 0, "no solo period in %.1f s of oversubscribed runs",
                 (double)(now_ns() - t0) / 1e9);
    cr_assert_eq(kern_pool_solo_periods(NULL), 0);
}
