/* kv_ahead.c - the map-ahead thread (see kv_ahead.h).
 *
 * State: want[r], the pending target of range r (0: none), n_pending of
 * them, and busy, the range whose vmm call is in flight. The thread takes
 * the next pending range round-robin from a cursor (so one range posted
 * again and again cannot starve the others), clears its target, marks it
 * busy, drops the lock for the vmm call, and clears busy after. A cancel
 * clears the target and waits on `idle` while the range is busy. The lock
 * is never held across a vmm call, and vmm takes no lock of ours: no order
 * to keep.
 *
 * Scan cost: O(n_ranges) per target taken, n_ranges = the engine's max_seqs
 * (tens); a map-ahead call costs microseconds a page, so the scan is noise.
 */
#include "engine/model/kv_ahead.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>

#include "mem.h"
#include "vmm/vmm.h"

#define KV_AHEAD_NONE UINT32_MAX

struct kv_ahead {
    struct vmm *v; /* borrowed */
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t work; /* the thread waits here for a target or stop */
    pthread_cond_t idle; /* owners wait here for busy to change */
    uint32_t n_ranges;
    uint32_t *want; /* [n_ranges] pending target, pages; 0: none */
    uint32_t n_pending;
    uint32_t cursor; /* next range to look at */
    uint32_t busy;   /* range in a vmm call, or KV_AHEAD_NONE */
    bool stop;
};

/* The next pending range from the cursor on; caller checked n_pending. */
static uint32_t kv_ahead_take_locked(struct kv_ahead *a, uint32_t *target) {
    for (uint32_t k = 0; k < a->n_ranges; k++) {
        uint32_t r = (a->cursor + k) % a->n_ranges;
        if (!a->want[r])
            continue;
        *target = a->want[r];
        a->want[r] = 0;
        a->n_pending--;
        a->cursor = (r + 1) % a->n_ranges;
        return r;
    }
    return KV_AHEAD_NONE;
}

static void *kv_ahead_main(void *arg) {
    struct kv_ahead *a = arg;
    pthread_mutex_lock(&a->lock);
    for (;;) {
        while (!a->stop && a->n_pending == 0)
            pthread_cond_wait(&a->work, &a->lock);
        if (a->stop)
            break;
        uint32_t target = 0, r = kv_ahead_take_locked(a, &target);
        if (r == KV_AHEAD_NONE) { /* cannot happen: n_pending counts the targets */
            a->n_pending = 0;
            continue;
        }
        a->busy = r;
        pthread_mutex_unlock(&a->lock);
        /* the owner only grows the range meanwhile, so this may map a page
         * more than asked; such pages are reclaimable like any other */
        uint32_t have = vmm_range_n_mapped(a->v, r);
        if (have < target)
            (void)vmm_range_map_ahead(a->v, r, target - have);
        pthread_mutex_lock(&a->lock);
        a->busy = KV_AHEAD_NONE;
        pthread_cond_broadcast(&a->idle);
    }
    pthread_mutex_unlock(&a->lock);
    return NULL;
}

int kv_ahead_create(struct vmm *v, uint32_t n_ranges, struct kv_ahead **out) {
    struct kv_ahead *a = mem_calloc(MEM_MODEL, 1, sizeof *a);
    if (!a)
        return -ENOMEM;
    a->v = v;
    a->n_ranges = n_ranges;
    a->busy = KV_AHEAD_NONE;
    a->want = mem_calloc(MEM_MODEL, a->n_ranges ? a->n_ranges : 1, sizeof *a->want);
    int rc = -ENOMEM;
    if (!a->want)
        goto fail_a;
    if ((rc = -pthread_mutex_init(&a->lock, NULL)) != 0)
        goto fail_want;
    if ((rc = -pthread_cond_init(&a->work, NULL)) != 0)
        goto fail_lock;
    if ((rc = -pthread_cond_init(&a->idle, NULL)) != 0)
        goto fail_work;
    if (pthread_create(&a->thread, NULL, kv_ahead_main, a) != 0) {
        rc = -EAGAIN;
        goto fail_idle;
    }
    *out = a;
    return 0;

fail_idle:
    pthread_cond_destroy(&a->idle);
fail_work:
    pthread_cond_destroy(&a->work);
fail_lock:
    pthread_mutex_destroy(&a->lock);
fail_want:
    mem_free(a->want);
fail_a:
    mem_free(a);
    return rc;
}

void kv_ahead_destroy(struct kv_ahead *a) {
    if (!a)
        return;
    pthread_mutex_lock(&a->lock);
    a->stop = true;
    pthread_cond_signal(&a->work);
    pthread_mutex_unlock(&a->lock);
    pthread_join(a->thread, NULL);
    pthread_cond_destroy(&a->idle);
    pthread_cond_destroy(&a->work);
    pthread_mutex_destroy(&a->lock);
    mem_free(a->want);
    mem_free(a);
}

void kv_ahead_post(struct kv_ahead *a, uint32_t range, uint32_t n_pages) {
    if (range >= a->n_ranges)
        return;
    pthread_mutex_lock(&a->lock);
    if (a->want[range] && !n_pages)
        a->n_pending--;
    else if (!a->want[range] && n_pages)
        a->n_pending++;
    a->want[range] = n_pages;
    if (n_pages)
        pthread_cond_signal(&a->work);
    pthread_mutex_unlock(&a->lock);
}

void kv_ahead_cancel(struct kv_ahead *a, uint32_t range) {
    if (range >= a->n_ranges)
        return;
    pthread_mutex_lock(&a->lock);
    if (a->want[range]) {
        a->want[range] = 0;
        a->n_pending--;
    }
    while (a->busy == range)
        pthread_cond_wait(&a->idle, &a->lock);
    pthread_mutex_unlock(&a->lock);
}

void kv_ahead_cancel_all(struct kv_ahead *a) {
    pthread_mutex_lock(&a->lock);
    for (uint32_t r = 0; r < a->n_ranges; r++)
        a->want[r] = 0;
    a->n_pending = 0;
    while (a->busy != KV_AHEAD_NONE)
        pthread_cond_wait(&a->idle, &a->lock);
    pthread_mutex_unlock(&a->lock);
}

void kv_ahead_drain(struct kv_ahead *a) {
    pthread_mutex_lock(&a->lock);
    while (a->n_pending || a->busy != KV_AHEAD_NONE)
        pthread_cond_wait(&a->idle, &a->lock);
    pthread_mutex_unlock(&a->lock);
}
