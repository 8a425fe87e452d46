/* serve_loop.h - one thread owns an llmd engine; requests arrive from many.
 *
 * Model: the engine is single-threaded (include/llmd.h), so one engine
 * thread owns it and loops { run the queued commands (submit, cancel);
 * llmd_engine_step(); sleep on a condvar while nothing is live }. Other
 * threads hand it commands through a mutex-protected FIFO. on_token runs
 * on the engine thread and appends to the request's private buffer; after
 * every step (and every batch of commands) the engine thread takes the lock
 * once and publishes every touched request's new text and finish, a
 * snapshot of llmd_stats and the latency histograms, then wakes the waiters.
 * A waiter therefore never sees its request finish before the counters
 * that include it, and the lock is taken once a step, not once a token.
 *
 * Workflow:
 *   serve_loop_create(engine, &l);                     // takes the engine
 *   serve_req_submit(l, &req, arrival_ns, &r, &retry); // any thread; waits
 *   serve_req_wait(l, r, from, timeout, ...);          // text, then finish
 *   serve_req_cancel(l, r); serve_req_put(l, r);
 *   serve_loop_close(l);    // cancel everything, refuse new submissions
 *   serve_loop_destroy(l);  // join the thread, close the engine
 *
 * Threads: create/close/destroy belong to one owner; every other function
 * may be called from any thread but the engine thread. One mutex (a leaf:
 * nothing else is locked under it) guards the queue and the published state.
 */
#ifndef LLMD_SERVE_LOOP_H
#define LLMD_SERVE_LOOP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "llmd.h"

struct serve_loop;
struct serve_req;

/* Latency histograms, in seconds (Prometheus "le" buckets, cumulative when
 * formatted). The bounds are fixed per kind: serve_hist_bounds(). */
enum serve_hist_kind {
    SERVE_HIST_TTFT,  /* arrival to the first output token */
    SERVE_HIST_ITL,   /* between consecutive output tokens of one request */
    SERVE_HIST_E2E,   /* arrival to the last token (finished requests) */
    SERVE_HIST_QUEUE, /* llmd_submit() to first admission (llmd_usage.queue_ns) */
    SERVE_HIST_N,
};

#define SERVE_HIST_MAX_BUCKETS 24

struct serve_hist {
    uint64_t counts[SERVE_HIST_MAX_BUCKETS + 1]; /* per bucket, not cumulative; last: +Inf */
    double sum;                                  /* seconds */
    uint64_t n;
};

/* Everything /metrics shows, as of the last publication. */
struct serve_metrics {
    struct llmd_stats engine;
    struct serve_hist hist[SERVE_HIST_N];
    uint64_t finished_total[LLMD_FINISH_KV_BUDGET + 1]; /* by enum llmd_finish (the last) */
    uint64_t refused_total;  /* submissions refused by admission control (-EAGAIN) */
    uint64_t rejected_total; /* other failed submissions (-EINVAL, -E2BIG, ...) */
    uint64_t live;           /* submitted, not finished */
    bool broken;             /* a step failed: the engine runs nothing more */
};

/* The bucket upper bounds of kind k: *n values, increasing, in seconds.
 * Static storage. */
const double *serve_hist_bounds(enum serve_hist_kind k, uint32_t *n);

/* Start the engine thread over e, taking ownership of e (closed by
 * serve_loop_destroy(), also when this fails). Configure the engine
 * (tenants) before. Returns 0, -ENOMEM, -EAGAIN (no thread). */
int serve_loop_create(struct llmd_engine *e, struct serve_loop **out);

/* Refuse every later submission (-ESHUTDOWN) and cancel every request
 * submitted before: their waiters see LLMD_FINISH_CANCELLED. Returns at
 * once; idempotent. Owner thread. */
void serve_loop_close(struct serve_loop *l);

/* Close, wait for the engine thread, close the engine, free. Every
 * serve_req must have been put. NULL ok. Owner thread. */
void serve_loop_destroy(struct serve_loop *l);

/* Hand q to the engine thread and wait until it has run llmd_submit(): q and
 * everything it points to are borrowed until return (the engine copies);
 * q->on_token and q->user are ignored, and q->logprobs and q->on_prompt only
 * say whether the tokens' and the prompt's log-probabilities are wanted (the
 * loop records them itself and publishes them for serve_req_take_lp(), the
 * prompt's first). arrival_ns (CLOCK_MONOTONIC) starts
 * the request's TTFT and end-to-end latency. On success *out holds one
 * reference, dropped with serve_req_put(). Returns what llmd_submit()
 * returned (0, -EINVAL, -E2BIG, -EAGAIN with *retry_after_s, -ENOMEM, -EIO),
 * or -ESHUTDOWN (closed), -ENOMEM. On a refusal by llmd_submit(),
 * *prompt_tokens (may be NULL) gets the prompt's length as the engine
 * tokenized it (0 when it never was), so the error can say how long it was.
 * Blocks for at most one engine step. */
int serve_req_submit(struct serve_loop *l, const struct llmd_request *q, uint64_t arrival_ns,
                     struct serve_req **out, uint32_t *retry_after_s, uint32_t *prompt_tokens);

/* What a waiter knows of its request. */
struct serve_progress {
    size_t text_bytes;          /* all the text published so far */
    uint32_t completion_tokens; /* tokens sampled, EOS included */
    uint32_t prompt_tokens;     /* llmd_usage's, known at submission */
    uint32_t cached_tokens;     /* prompt tokens from the prefix cache (at admission) */
    uint32_t spec_draft_tokens, spec_accepted_tokens; /* llmd_usage's, so far */
    bool speculative;        /* the engine speculates and the request did not opt out */
    enum llmd_finish finish; /* NONE while it goes on */
};

/* Wait until r has text the caller has not taken yet, or has finished, or
 * timeout_ns passes. The new text is handed over by swapping buffers: on
 * return (*buf)[0..*n_new) holds it and *cap is that buffer's size in
 * bytes; the caller's previous buffer goes to r for later text. The caller
 * owns whatever *buf is on return and frees it with mem_free(); *buf may
 * start NULL with *cap 0. *p is filled in every case. One waiter per
 * request. Returns 0 (new text, or finished), -ETIMEDOUT (nothing new).
 * Blocks up to timeout_ns. */
int serve_req_wait(struct serve_loop *l, struct serve_req *r, uint64_t timeout_ns, char **buf,
                   size_t *cap, size_t *n_new, struct serve_progress *p);

/* Make r's publications wake the waiter of `with` as well, so that one
 * thread can wait for several requests with serve_req_wait_any() (the n
 * choices of one HTTP request: each wakes the first's). r holds a reference
 * on `with` until r itself is freed. No effect when r wakes one already, or
 * r == with. Any thread but the engine's. */
void serve_req_wake_with(struct serve_loop *l, struct serve_req *r, struct serve_req *with);

/* Wait until one of r[0..n) whose done[i] is false has text its waiter has
 * not taken yet, or has finished, or timeout_ns passes; *which gets the
 * first such index (then serve_req_wait() on it returns at once). r[1..n)
 * must wake r[0] (serve_req_wake_with). Returns 0, -ETIMEDOUT. Blocks up to
 * timeout_ns. */
int serve_req_wait_any(struct serve_loop *l, struct serve_req *const *r, const bool *done,
                       uint32_t n, uint64_t timeout_ns, uint32_t *which);

/* The log-probability records (req.h, req_lp_next()) published for r and
 * not taken yet: at least those of every token whose text a
 * serve_req_wait() returned before, all of them once it reported the finish
 * (an EOS token has none). Swaps buffers as serve_req_wait() does: on return
 * (*buf)[0..*n) holds them, the caller owns *buf (mem_free()). Any thread
 * but the engine's; takes the lock briefly. */
void serve_req_take_lp(struct serve_loop *l, struct serve_req *r, char **buf, size_t *cap,
                       size_t *n);

/* Ask the engine thread to cancel r (a client went away). Returns at once;
 * no effect once r has finished or a cancel was already asked. */
void serve_req_cancel(struct serve_loop *l, struct serve_req *r);

/* Take one more reference on r, for another owner (a response object). */
void serve_req_get(struct serve_loop *l, struct serve_req *r);

/* Drop the caller's reference. NULL ok. */
void serve_req_put(struct serve_loop *l, struct serve_req *r);

/* One live request, for an operator (llmctl seqs). */
struct serve_seq {
    uint64_t id; /* the engine's request id */
    uint32_t tenant;
    int32_t priority;          /* as asked (the tenant's ceiling applies) */
    uint32_t prompt_tokens;    /* BOS included */
    uint32_t cached_tokens;    /* from the prefix cache at admission */
    uint32_t generated_tokens; /* sampled so far */
    uint64_t age_ns;           /* since arrival */
    uint64_t queue_ns;         /* submission to first admission; 0: never admitted yet */
};

/* Snapshot up to cap live requests into out[], newest first; *n is how
 * many were written, *total how many are live. Runs on the engine thread
 * between steps: blocks for at most one step. Returns 0, -ESHUTDOWN. */
int serve_loop_seqs(struct serve_loop *l, struct serve_seq *out, uint32_t cap, uint32_t *n,
                    uint32_t *total);

/* Run fn(engine, arg) on the engine thread between two steps (llmd_tenant_purge,
 * llmd_evictions_read: calls that must not race a step) and return what it
 * returned, or -ESHUTDOWN (closed). fn must not block; it runs outside
 * on_token. Blocks the caller for at most one step. */
int serve_loop_call(struct serve_loop *l, int (*fn)(struct llmd_engine *e, void *arg), void *arg);

/* Copy the last published metrics. */
void serve_loop_metrics(struct serve_loop *l, struct serve_metrics *out);

/* Requests submitted and not yet finished, as published. */
uint64_t serve_loop_live(struct serve_loop *l);

#endif /* LLMD_SERVE_LOOP_H */
