/* pool.c - the kernel thread pool (see kernels/kern.h).
 *
 * Design. n-1 persistent workers plus the caller. A run publishes fn/arg,
 * then one 64-bit word `claim` = gen << 32 | next_slot, then the 32-bit
 * futex word `gen`. Workers wait for `gen` to change (spin, then futex) and
 * claim slots with a CAS on `claim` that also checks the generation, so a
 * worker that wakes late can never take a slot of a newer run with an older
 * fn. The caller runs slot 0, then claims leftover slots itself, then waits
 * (spin, then futex) for `done` to count the n-1 other slots. A descheduled
 * worker therefore costs at most its share of the work, never a stall: on a
 * 2-vCPU machine with a busy neighbour a run degrades to 1-thread speed
 * instead of waiting a scheduler tick (llama.cpp's barrier does the latter,
 * see BASELINES.md). When the caller itself keeps being preempted (more
 * runnable threads than CPUs), the pool runs solo for a while (below).
 *
 * Sleep/wake uses the Dekker pattern with seq_cst atomics: a sleeper raises
 * its flag, re-checks the word and futex-waits on the value it saw; a waker
 * changes the word, then reads the flag and calls futex_wake only when
 * somebody may sleep, so a run with spinning workers makes no system call
 * but, once per 250 us at most, the reads of the caller's CPU clock below.
 */
#include "kernels/kern.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "mem.h"

/* How long a waiting thread spins before it sleeps. Decode on a small model
 * issues a run every few to tens of microseconds, and a futex wake-up costs
 * 5-50 us on a VM, so spinning through those gaps keeps a run at ~1 us. Past
 * 100 us (a sampler step, an HTTP write) the wait is long enough that the
 * CPU is better given back to a neighbour. */
#define KERN_POOL_SPIN_NS     100000
#define KERN_POOL_MAX_THREADS 256

/* An oversubscribed machine. With a busy neighbour on a 2-vCPU machine, two
 * pool threads and the neighbour are three runnable threads on two CPUs:
 * the caller itself is preempted mid-run, a scheduler slice at a time, and
 * one thread alone decodes faster than two (docs/benchmarks.md, "Threads
 * under contention"). Waits on workers do not show it (they were 3% of such
 * a run); the caller's CPU time against its wall time over its own part of
 * the runs does. A run is sampled when KERN_POOL_SAMPLE_GAP_NS have passed
 * since the last sample (the thread CPU clock is a system call, ~1 us on a
 * VM); a run whose own part took over KERN_POOL_WINDOW_NS / 4 of CPU time
 * (a prefill pass) is left out. Once the samples cover KERN_POOL_WINDOW_NS
 * of wall time, if n_threads x the caller's CPU share is under
 * KERN_POOL_SOLO_CPUS (two threads: off-CPU over a fifth of the time; 16:
 * over nine tenths), n threads preempted that much are worth less than
 * one that is not, and the pool runs solo (every slot on the caller, in
 * turn: the same fn calls, the same bits; the workers go to sleep) for
 * solo_ns, then tries threads again: 100 ms at first, doubled while the
 * machine stays oversubscribed, at most 1.6 s. */
#define KERN_POOL_SAMPLE_GAP_NS 250000ull
#define KERN_POOL_WINDOW_NS     20000000ull
#define KERN_POOL_SOLO_CPUS     1.6
#define KERN_POOL_SOLO_NS       100000000ull
#define KERN_POOL_SOLO_MAX_NS   1600000000ull

struct kern_pool {
    int n_threads;
    pthread_t *threads; /* [n_threads-1] */
    int n_started;

    /* written by the caller before each run, read by workers after a claim */
    void (*fn)(void *arg, int ith, int nth);
    void *arg;
    void *scratch; /* caller thread only */
    size_t scratch_bytes;

    _Alignas(64) _Atomic uint64_t claim; /* gen << 32 | next unclaimed slot */
    _Atomic uint32_t gen;                /* futex word: run counter */
    _Atomic int n_sleeping;              /* workers in futex_wait on gen */
    _Atomic int stop;

    _Alignas(64) _Atomic uint32_t done; /* futex word: slots >= 1 finished this run */
    _Atomic int caller_sleeping;

    /* oversubscription (caller thread only) */
    uint64_t last_sample;       /* monotonic ns of the last sample's start */
    bool no_cpu_clock;          /* the thread CPU clock failed: no detection */
    uint64_t win_wall, win_cpu; /* the window's sampled own parts, ns */
    uint64_t solo_until;        /* monotonic ns; 0: threaded */
    uint64_t solo_ns;           /* the next solo period */
    bool probing;               /* the window after a solo period */
    uint64_t solo_periods;      /* kern_pool_solo_periods() */
};

static void pool_futex_wait(_Atomic uint32_t *word, uint32_t val) {
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}

static void pool_futex_wake(_Atomic uint32_t *word, int n) {
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE_PRIVATE, n, NULL, NULL, 0);
}

static inline void pool_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static uint64_t pool_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Spin until *word != val, for at most KERN_POOL_SPIN_NS. Returns the new
 * value, or val if the budget ran out. */
static uint32_t pool_spin_while_eq(_Atomic uint32_t *word, uint32_t val) {
    uint64_t t0 = 0;
    for (unsigned i = 1;; i++) {
        uint32_t cur = atomic_load_explicit(word, memory_order_acquire);
        if (cur != val)
            return cur;
        pool_cpu_relax();
        if ((i & 255) == 0) {
            uint64_t now = pool_now_ns();
            if (t0 == 0)
                t0 = now;
            else if (now - t0 > KERN_POOL_SPIN_NS)
                return val;
        }
    }
}

/* Claim and run slots of generation g until none is left. */
static void pool_run_slots(struct kern_pool *p, uint32_t g) {
    const uint32_t n = (uint32_t)p->n_threads;
    for (;;) {
        uint64_t v = atomic_load_explicit(&p->claim, memory_order_acquire);
        uint32_t slot = (uint32_t)v;
        if ((uint32_t)(v >> 32) != g || slot >= n)
            return;
        if (!atomic_compare_exchange_weak_explicit(&p->claim, &v, v + 1, memory_order_acq_rel,
                                                   memory_order_acquire))
            continue;
        /* The caller keeps fn/arg until `done` counts this slot. */
        p->fn(p->arg, (int)slot, (int)n);
        uint32_t d = atomic_fetch_add(&p->done, 1) + 1;
        if (d == n - 1 && atomic_load(&p->caller_sleeping))
            pool_futex_wake(&p->done, 1);
    }
}

static void *pool_worker_main(void *a) {
    struct kern_pool *p = a;
    /* Workers are created while gen is 0. Starting from 0, not from a fresh
     * load, lets a worker that starts late still see the runs (and the stop)
     * published before it got to run. */
    uint32_t seen = 0;
    for (;;) {
        uint32_t g = pool_spin_while_eq(&p->gen, seen);
        if (g == seen) {
            atomic_fetch_add(&p->n_sleeping, 1);
            while ((g = atomic_load(&p->gen)) == seen)
                pool_futex_wait(&p->gen, seen);
            atomic_fetch_sub(&p->n_sleeping, 1);
        }
        if (atomic_load(&p->stop))
            return NULL;
        seen = g;
        pool_run_slots(p, g);
    }
}

/* The calling thread's CPU time, ns; 0 (and detection off) if the clock
 * fails. */
static uint64_t pool_cpu_ns(struct kern_pool *p) {
    struct timespec ts;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) {
        p->no_cpu_clock = true;
        return 0;
    }
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Add one sampled run's own part (wall and CPU ns) to the window; at the
 * window's end, decide whether the caller was preempted enough to go solo.
 * A run that took over a quarter of the window in CPU time (a prefill pass)
 * is left out, so that it cannot decide alone; wall time would drop the
 * most preempted runs instead. */
static void pool_sample(struct kern_pool *p, uint64_t wall, uint64_t cpu) {
    if (p->no_cpu_clock || cpu > KERN_POOL_WINDOW_NS / 4)
        return;
    p->win_wall += wall;
    p->win_cpu += cpu < wall ? cpu : wall;
    if (p->win_wall < KERN_POOL_WINDOW_NS)
        return;
    const bool oversubscribed =
        (double)p->n_threads * (double)p->win_cpu < KERN_POOL_SOLO_CPUS * (double)p->win_wall;
    if (oversubscribed) {
        if (p->probing) /* still oversubscribed after a solo period */
            p->solo_ns =
                p->solo_ns * 2 < KERN_POOL_SOLO_MAX_NS ? p->solo_ns * 2 : KERN_POOL_SOLO_MAX_NS;
        p->solo_until = pool_now_ns() + p->solo_ns;
        p->solo_periods++;
    } else {
        p->solo_ns = KERN_POOL_SOLO_NS;
    }
    p->probing = false;
    p->win_wall = p->win_cpu = 0;
}

uint64_t kern_pool_solo_periods(const struct kern_pool *p) {
    return p ? p->solo_periods : 0;
}

void kern_pool_test_solo(struct kern_pool *p, uint64_t ns) {
    if (p)
        p->solo_until = ns ? pool_now_ns() + ns : 0; /* 0: threaded from the next run */
}

/* Publish a new generation and wake sleeping workers. */
static void pool_publish(struct kern_pool *p, uint32_t g) {
    atomic_store_explicit(&p->claim, (uint64_t)g << 32 | 1u, memory_order_release);
    atomic_store(&p->gen, g);
    if (atomic_load(&p->n_sleeping) > 0)
        pool_futex_wake(&p->gen, INT_MAX);
}

int kern_pool_create(int n_threads, struct kern_pool **out) {
    (void)kern_cache_l2(); /* at start-up, not in the first product (hwloc: ms) */
    if (n_threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = n > 0 ? (int)n : 1;
    }
    if (n_threads > KERN_POOL_MAX_THREADS)
        n_threads = KERN_POOL_MAX_THREADS;
    int rc = -ENOMEM;
    struct kern_pool *p = mem_calloc(MEM_KERN, 1, sizeof(*p));
    if (!p)
        goto fail;
    p->n_threads = n_threads;
    p->solo_ns = KERN_POOL_SOLO_NS;
    p->threads = mem_calloc(MEM_KERN, (size_t)n_threads, sizeof(pthread_t));
    if (!p->threads)
        goto fail_pool;
    for (int i = 0; i < n_threads - 1; i++) {
        int e = pthread_create(&p->threads[i], NULL, pool_worker_main, p);
        if (e != 0) {
            LOG_ERROR("kern", "pthread_create: error %d", e);
            rc = -EAGAIN;
            goto fail_threads;
        }
        p->n_started++;
    }
    *out = p;
    return 0;

fail_threads:
    atomic_store(&p->stop, 1);
    pool_publish(p, atomic_load(&p->gen) + 1);
    for (int i = 0; i < p->n_started; i++)
        pthread_join(p->threads[i], NULL);
    mem_free(p->threads);
fail_pool:
    mem_free(p);
fail:
    return rc;
}

void kern_pool_destroy(struct kern_pool *p) {
    if (!p)
        return;
    atomic_store(&p->stop, 1);
    pool_publish(p, atomic_load(&p->gen) + 1);
    for (int i = 0; i < p->n_started; i++)
        pthread_join(p->threads[i], NULL);
    mem_free(p->threads);
    mem_free(p->scratch);
    mem_free(p);
}

int kern_pool_n_threads(const struct kern_pool *p) {
    return p ? p->n_threads : 1;
}

void kern_pool_run(struct kern_pool *p, void (*fn)(void *arg, int ith, int nth), void *arg) {
    if (!p || p->n_threads == 1) {
        fn(arg, 0, 1);
        return;
    }
    const uint32_t n = (uint32_t)p->n_threads;
    if (p->solo_until) {
        if (pool_now_ns() < p->solo_until) {
            for (uint32_t s = 0; s < n; s++)
                fn(arg, (int)s, (int)n);
            return;
        }
        p->solo_until = 0;
        p->probing = true;
    }
    const uint64_t w0 = pool_now_ns();
    const bool sample = !p->no_cpu_clock && w0 - p->last_sample >= KERN_POOL_SAMPLE_GAP_NS;
    uint64_t c0 = 0;
    if (sample) {
        p->last_sample = w0;
        c0 = pool_cpu_ns(p);
    }
    p->fn = fn;
    p->arg = arg;
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    uint32_t g = atomic_load_explicit(&p->gen, memory_order_relaxed) + 1;
    pool_publish(p, g);

    fn(arg, 0, (int)n);
    pool_run_slots(p, g); /* take the slots of workers that are not awake yet */
    if (sample) {
        const uint64_t c1 = pool_cpu_ns(p);
        pool_sample(p, pool_now_ns() - w0, c1 > c0 ? c1 - c0 : 0);
    }

    uint32_t d = atomic_load_explicit(&p->done, memory_order_acquire);
    while (d != n - 1) {
        d = pool_spin_while_eq(&p->done, d);
        if (d == n - 1)
            break;
        atomic_store(&p->caller_sleeping, 1);
        d = atomic_load(&p->done);
        if (d != n - 1)
            pool_futex_wait(&p->done, d);
        atomic_store(&p->caller_sleeping, 0);
        d = atomic_load_explicit(&p->done, memory_order_acquire);
    }
}

void *kern_pool_scratch(struct kern_pool *p, size_t bytes) {
    if (!p)
        return NULL;
    if (bytes <= p->scratch_bytes && p->scratch)
        return p->scratch;
    void *s = mem_alloc(MEM_KERN, bytes);
    if (!s)
        return NULL;
    mem_free(p->scratch);
    p->scratch = s;
    p->scratch_bytes = bytes;
    return s;
}
