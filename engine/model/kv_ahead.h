/* kv_ahead.h - one background thread that maps KV pages ahead of need.
 *
 * Model (DESIGN.md §2: "growth maps one page at a time, ahead of need, so a
 * decode step never waits on a map call"): the owner (kv.c, for the engine)
 * posts, per range, the number of pages the range should have mapped; the
 * thread calls vmm_range_map_ahead() for what is missing, off the owner's
 * thread, so the owner's next vmm_range_grow finds the pages mapped.
 *
 * Workflow: kv_ahead_create -> after each step kv_ahead_post(range, n) ->
 * before the owner releases a range, or shrinks one, kv_ahead_cancel(range)
 * or kv_ahead_cancel_all() -> kv_ahead_destroy.
 *
 * Who touches a range: the thread maps only into a range with a posted
 * target and only past its current extent. After kv_ahead_cancel(range)
 * returns the thread neither works on that range nor will start to, until
 * the next post for it: so a released range that is acquired again and gets
 * prefix pages by vmm_range_share() (which must land at given indices, see
 * vmm.h) never races with the thread.
 *
 * Thread safety: every function is called by the one owner thread. The
 * thread and the owner share one mutex (held for list work only, never
 * across a vmm call). Posts never block; cancels wait for at most the one
 * map-ahead call in flight on the range (microseconds a page). Errors of the
 * thread's vmm calls (-ENOSPC: the pool is short) are dropped: the owner's
 * own grow maps the page then, as without the thread.
 */
#ifndef LLMD_KV_AHEAD_H
#define LLMD_KV_AHEAD_H

#include <stdint.h>

struct kv_ahead;
struct vmm;

/* Start the thread for ranges [0, n_ranges) of pool v (borrowed; must
 * outlive the kv_ahead). Returns 0, -ENOMEM, -EAGAIN (no thread). Caller frees with
 * kv_ahead_destroy(). */
int kv_ahead_create(struct vmm *v, uint32_t n_ranges, struct kv_ahead **out);

/* Stop the thread (it finishes the call in flight, drops pending work) and
 * free. NULL is a no-op. */
void kv_ahead_destroy(struct kv_ahead *a);

/* Ask that `range` have n_pages pages mapped. Replaces an earlier pending
 * target of the range; n_pages 0 drops it. The thread maps only what is
 * missing when it gets to it (a range mapped to n_pages or more already
 * gets no call). Never blocks. */
void kv_ahead_post(struct kv_ahead *a, uint32_t range, uint32_t n_pages);

/* Drop the pending target of range and wait until the thread is not
 * mapping into it. */
void kv_ahead_cancel(struct kv_ahead *a, uint32_t range);

/* Drop every pending target and wait until the thread is idle. */
void kv_ahead_cancel_all(struct kv_ahead *a);

/* Wait until every posted target was handled and the thread is idle (tests
 * and benchmarks: makes a run deterministic). */
void kv_ahead_drain(struct kv_ahead *a);

#endif /* LLMD_KV_AHEAD_H */
