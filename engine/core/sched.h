/* sched.h - the iteration-level scheduler: which tokens run in each step.
 *
 * Model (DESIGN.md §6, docs/scheduler.md): requests wait in per-tenant queues,
 * are admitted into one of max_seqs sequence slots once the KV pages they need
 * are free or evictable (the pages are then reserved for them), and each step
 * runs a flat batch: one decode token per running sequence first, then prefill
 * chunks shared among tenants by deficit round robin, within
 * max_batched_tokens. The scheduler plans; it never runs the model and never
 * touches vmm: it reads page counts through struct sched_page_ops.
 *
 * Workflow, once per step on the engine's loop thread:
 *   (speculative decoding: sched_draft_set() for each decoding request that
 *   has a draft) ->
 *   sched_plan(now) -> release the slots of plan.preempted, acquire the slots
 *   of plan.admitted, grow each entry's range to pos0 + n_tokens tokens
 *   (evicting cached pages when the free list is short), run the batch ->
 *   sched_complete(results, now) -> stream each event's text, release the
 *   slot of each finished request.
 * sched_submit() and sched_cancel() come between steps.
 *
 * Thread safety: none. One thread (the engine loop) owns a struct sched and
 * makes every call; no call blocks or sleeps, and each does work bounded by
 * the configuration (stated per function). Time is never read inside: every
 * call takes `now_ns` (CLOCK_MONOTONIC ns from the caller), so tests are
 * deterministic.
 */
#ifndef LLMD_SCHED_H
#define LLMD_SCHED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct sched;

#define SCHED_TOKEN_NONE     (-1)
#define SCHED_SLOT_NONE      UINT32_MAX
#define SCHED_STOP_MAX_N     8    /* stop strings per request (OpenAI allows 4) */
#define SCHED_STOP_MAX_BYTES 128  /* bytes per stop string; bounds the matcher's work */
#define SCHED_PRIO_LIMIT     1000 /* priorities are clamped to [-1000, 1000] */
#define SCHED_DRAFT_MAX      32   /* speculative tokens one decode entry may carry */

enum sched_finish {
    SCHED_FINISH_NONE = 0,  /* still running or waiting */
    SCHED_FINISH_LENGTH,    /* max_tokens generated */
    SCHED_FINISH_STOP,      /* a stop string matched (it is not in the text) */
    SCHED_FINISH_EOS,       /* the EOS token was sampled */
    SCHED_FINISH_CONTEXT,   /* prompt + generated reached the context limit */
    SCHED_FINISH_KV_BUDGET, /* ... reached what the whole KV pool holds, short of the
                             * context (the pool is smaller than one context) */
    SCHED_FINISH_CANCELLED, /* sched_cancel() */
    SCHED_FINISH_REFUSED,   /* never set by the scheduler: what the engine reports when
                             * sched_submit() returns -EAGAIN */
    SCHED_FINISH_N
};

/* How a preempted sequence gives its pages back. RECOMPUTE: its pages are
 * freed and it is prefilled again later, generated tokens included. SPILL:
 * the engine keeps the pages it had computed (sched_preempt.n_computed) in
 * the prefix cache, whose evictions spill them to the host tier (offload/),
 * and the request's lookup at resume restores them; what no tier kept is
 * recomputed. The scheduler plans both alike: a resumed request's hit comes
 * back through sched_set_cached(). */
enum sched_preempt_mode { SCHED_PREEMPT_RECOMPUTE = 0, SCHED_PREEMPT_SPILL };

/* The KV page pool as the scheduler sees it; provided by the engine (tests
 * use a fake). All counts in pages. Called only from inside sched_* calls. */
struct sched_page_ops {
    uint32_t (*free_pages)(void *ctx);               /* pages on the free list */
    uint32_t (*evictable_pages)(void *ctx);          /* cached pages no range maps */
    uint32_t (*seq_pages)(void *ctx, uint32_t slot); /* pages mapped by slot (0 if none) */
};

struct sched_tenant_config {
    uint32_t tenant;
    uint32_t weight;      /* DRR share of prefill tokens, >= 1 */
    int32_t max_priority; /* request priorities are capped at this ceiling */
};

struct sched_config {
    const struct sched_page_ops *ops; /* borrowed; must outlive the scheduler */
    void *ops_ctx;                    /* passed to every op */
    uint32_t n_pages;                 /* pool size, pages (caps a sequence's length) */
    uint32_t tokens_per_page;         /* tpp, >= 1 (vmm_tokens_per_page) */
    uint32_t max_ctx;                 /* context limit, tokens per sequence */
    uint32_t max_seqs;                /* sequence slots; also the most entries in a step */
    uint32_t max_batched_tokens;      /* tokens per step, >= max_seqs */
    uint32_t max_chunk_tokens;        /* most prefill tokens for one sequence in one step;
                                       * 0 = no cap beyond max_batched_tokens */
    uint32_t headroom_pages;          /* decode pages reserved at admission */
    uint32_t quantum_tokens;          /* DRR quantum per unit of weight; 0 = 16 */
    uint64_t aging_ns;                /* waiting this long is worth one priority level;
                                       * 0 = 1 s */
    uint64_t max_queue_wait_ns;       /* refuse when the predicted wait exceeds this;
                                       * 0 = never refuse on wait */
    uint64_t rate_window_ns;          /* page-release rate window; 0 = 10 s */
    uint32_t max_waiting;             /* waiting requests, all tenants; 0 = 4096 */
    uint32_t max_tenants;             /* 0 = 64 */
    uint32_t default_weight;          /* for tenants not configured; 0 = 1 */
    int32_t default_max_priority;     /* ceiling for tenants not configured; 0 = none
                                       * (SCHED_PRIO_LIMIT): configure a tenant to cap at 0 */
    enum sched_preempt_mode preempt_mode;
    const struct sched_tenant_config *tenants; /* [n_tenants], copied; may be NULL */
    uint32_t n_tenants;
};

/* Create a scheduler. cfg is copied (ops and ops_ctx are borrowed). Returns
 * 0, -EINVAL (a zero size, max_batched_tokens < max_seqs, a tenant weight of
 * 0 or a tenant twice, n_tenants > max_tenants), -ENOTSUP (SPILL), -ENOMEM.
 * Caller frees with sched_destroy(). */
int sched_create(const struct sched_config *cfg, struct sched **out);

/* Free the scheduler and every request in it (no events are produced: the
 * engine drops its sequences itself). NULL is a no-op. */
void sched_destroy(struct sched *s);

/* Set (or add) a tenant's weight and priority ceiling. Takes effect at the
 * next plan; queued requests keep the priority they were capped at. Returns
 * 0, -EINVAL (weight 0), -ENOSPC (max_tenants reached), -ENOMEM. */
int sched_tenant_set(struct sched *s, const struct sched_tenant_config *t);

#define SCHED_STOP_IDS_MAX                                                                         \
    24 /* stop token ids of one request: a client's 16 and the                                     \
        * vocabulary's end-of-generation tokens */

struct sched_request {
    uint32_t tenant;
    int32_t priority;        /* higher runs first; capped by the tenant's ceiling */
    uint32_t prompt_len;     /* tokens, >= 1 */
    uint32_t cached_tokens;  /* prompt tokens the prefix cache already holds (0 for now);
                              * at most prompt_len - 1 are used */
    uint32_t max_tokens;     /* tokens to generate; 0 = up to the context limit */
    int32_t eos;             /* EOS token id, or SCHED_TOKEN_NONE */
    const char *const *stop; /* [n_stop] NUL-terminated stop strings, copied */
    uint32_t n_stop;
    const int32_t *stop_ids; /* [n_stop_ids] token ids that finish it as EOS does, copied */
    uint32_t n_stop_ids;     /* at most SCHED_STOP_IDS_MAX */
};

/* Queue a request arriving at now_ns. On success *id (never 0) names it until
 * its finish event. On -EAGAIN *retry_after_s (may be NULL) is the hint in
 * seconds (>= 1), and the request does not exist: the engine reports it as
 * SCHED_FINISH_REFUSED (HTTP 429 + Retry-After). Returns 0, -EINVAL (bad
 * fields, an empty or too long stop string), -E2BIG (the prompt alone reaches
 * the context limit or needs more pages than the pool has), -EAGAIN
 * (predicted wait > max_queue_wait_ns, or max_waiting reached), -ENOSPC (a
 * new tenant beyond max_tenants), -EBUSY (called between sched_plan and
 * sched_complete), -ENOMEM. Work: O(max_seqs + n_tenants + log waiting). */
int sched_submit(struct sched *s, const struct sched_request *r, uint64_t now_ns, uint64_t *id,
                 uint32_t *retry_after_s);

/* Cancel request id wherever it is. Its reservation is released now; if it
 * held a slot, *slot (may be NULL) gets it and the engine releases that
 * range before the next step (else SCHED_SLOT_NONE). No event follows.
 * Returns 0, -ENOENT (unknown or finished), -EBUSY (between plan and
 * complete: cancel after sched_complete). Work: O(log waiting). */
int sched_cancel(struct sched *s, uint64_t id, uint64_t now_ns, uint32_t *slot);

/* Change the prefix-cache hit of a WAITING request (the engine looked its
 * prefix up again after other requests filled the cache, or after a
 * preemption). Its page need is recomputed; the engine must keep the pages
 * it promises pinned until admission. At most n_target - 1 tokens are used
 * (n_target: the prompt, plus the generated tokens of a preempted request,
 * whose recompute covers them). Returns 0, -ENOENT (unknown id), -EBUSY (running, or between plan
 * and complete). O(1). */
int sched_set_cached(struct sched *s, uint64_t id, uint32_t cached_tokens);

/* Hold a WAITING request back from admission (held), or let it go again.
 * The engine holds a request whose prompt pages another live request is
 * computing right now, so the two do not prefill the same prefix side by
 * side: it is admitted once those pages are in the prefix cache and it can
 * share them. A held request at the head of its tenant's queue keeps the
 * tenant's later ones waiting too (they rank below it) but takes no place
 * in the admission line, so other tenants admit as before. A preemption
 * or a new admission does not clear the flag; the engine does. Returns 0,
 * -ENOENT (unknown id), -EBUSY (running, or between plan and complete).
 * O(1). */
int sched_set_held(struct sched *s, uint64_t id, bool held);

/* Pages the scheduler could still promise: free + evictable minus what
 * running sequences have reserved but not yet mapped; 0 when overcommitted.
 * An engine that makes cached pages unevictable (pins a prefix hit for a
 * waiting request) must take at most this many, or a running sequence's
 * promised page is gone. O(max_seqs). */
uint32_t sched_pages_avail(const struct sched *s);

/* Offer n_draft speculative tokens for the next decode entry of running,
 * decoding request id (speculative decoding, docs/scheduler.md): the next
 * sched_plan() appends up to that many to its decode entry (entry.n_draft;
 * the engine puts its draft at positions pos0 + 1 ..), after every decode
 * and prefill chunk has had its tokens and pages, so a draft never delays
 * a prompt and never preempts: it gets what is left of max_batched_tokens
 * and of the pages, and never more than the request can still return
 * (max_tokens, the context). Holds for the next plan only (0 withdraws an
 * offer). Returns 0, -ENOENT (unknown id), -EINVAL (not running, still
 * prefilling, or n_draft > SCHED_DRAFT_MAX), -EBUSY (between plan and
 * complete). O(1). */
int sched_draft_set(struct sched *s, uint64_t id, uint32_t n_draft);

/* Tokens one sequence may reach: min(max_ctx, n_pages * tokens_per_page). A
 * prompt this long or longer is refused (-E2BIG); reaching it ends the
 * request with SCHED_FINISH_CONTEXT, or SCHED_FINISH_KV_BUDGET when the pool
 * is the smaller. O(1). */
uint32_t sched_max_seq_tokens(const struct sched *s);

struct sched_entry {
    uint64_t id;
    uint32_t slot;     /* sequence slot, < max_seqs */
    uint32_t pos0;     /* position of the first token in the sequence */
    uint32_t n_tokens; /* tokens [pos0, pos0 + n_tokens) of prompt ++ generated, then the
                        * draft: n_tokens = 1 + n_draft for a decode */
    uint32_t n_draft;  /* decode only: draft tokens after the last generated one, at
                        * positions pos0 + 1 .. pos0 + n_draft; the engine verifies
                        * them (logits of all 1 + n_draft positions) */
    bool is_decode;    /* the last generated token (and a draft, if n_draft) */
    bool want_logits;  /* sample a token after the last position of this entry */
};

struct sched_preempt {
    uint64_t id;
    uint32_t slot; /* release this range before running the step */
    enum sched_preempt_mode mode;
    uint32_t n_computed; /* tokens [0, this) of prompt + generated had their K/V in the
                          * range: SPILL mode keeps those pages (the engine caches them) */
};

struct sched_admit {
    uint64_t id;
    uint32_t slot;          /* acquire a range for it before running the step */
    uint32_t cached_tokens; /* share the prefix cache's pages for tokens [0, this) */
};

/* One step. Arrays are borrowed from the scheduler, valid until the next
 * sched_plan() or sched_complete(). entries[] lists decodes first, then
 * prefill chunks. */
struct sched_plan {
    const struct sched_entry *entries;
    uint32_t n_entries; /* <= max_seqs */
    const struct sched_preempt *preempted;
    uint32_t n_preempted;
    const struct sched_admit *admitted;
    uint32_t n_admitted;
    uint32_t n_tokens; /* sum of entries' n_tokens, <= max_batched_tokens */
    uint32_t n_decode_tokens, n_prefill_tokens;
    uint32_t n_draft_tokens; /* sum of entries' n_draft (in n_tokens, not in n_decode_tokens) */
};

/* Plan the next step at now_ns into *out. The plan is safe: every page the
 * entries need beyond what their slots hold is free or evictable once the
 * preempted slots are released. With n_entries = 0 there is no step to run
 * or complete (but release any preempted slot). Returns 0, -EBUSY (the
 * previous plan was not completed). Work: O(max_seqs^2 + turns * (max_seqs +
 * n_tenants) + admitted * log waiting) with turns = O(n_tenants * (max_seqs +
 * max_batched_tokens / quantum_tokens)); no allocation. */
int sched_plan(struct sched *s, uint64_t now_ns, struct sched_plan *out);

/* The outcome of one entry of the last plan, in the plan's order. An
 * entry with a draft commits its accepted draft tokens, then `token`: the
 * target's own token after them (its correction of the first rejected
 * draft token, or the one after a fully accepted draft). */
struct sched_result {
    uint64_t id;             /* must equal entries[i].id */
    int32_t token;           /* sampled token if want_logits, else SCHED_TOKEN_NONE */
    const char *piece;       /* the token's bytes (borrowed), e.g. tok_stream_push output */
    size_t piece_bytes;      /* length of piece */
    uint32_t n_accepted;     /* draft tokens accepted, <= entries[i].n_draft; they come first */
    const int32_t *accepted; /* [n_accepted] the draft's first tokens */
    const char *const *accepted_piece;  /* [n_accepted] their bytes (borrowed) */
    const size_t *accepted_piece_bytes; /* [n_accepted] */
};

/* One token a sequence committed in the step just completed (a speculating
 * sequence may have several, in order; a finish among them drops the rest). */
struct sched_event {
    uint64_t id;
    int32_t token;            /* the token sampled */
    const char *text;         /* bytes safe to stream (stop strings held back), borrowed */
    size_t text_bytes;        /* valid until the next sched_complete() or sched_destroy() */
    enum sched_finish finish; /* NONE while it goes on */
    uint32_t slot;            /* finished: release this range now */
    uint32_t n_generated;     /* tokens generated so far, this one included */
};

/* Apply the results of the last plan (n must equal its n_entries; results[i]
 * belongs to entries[i]). Each entry's tokens count as computed, a
 * decode's up to its last accepted draft token (the rest is rolled back:
 * the engine trims the sequence to sched_req_info().n_computed); each
 * want_logits entry yields one event per committed token in *events /
 * *n_events (borrowed, valid until the next sched_complete()), each checked
 * for the stop conditions in turn: the first that finishes the request
 * drops the tokens after it. A finished request's slot and reservation
 * are released here and its id dies. Returns 0, -EINVAL (no plan
 * outstanding, a count, id or token mismatch, more accepted tokens than
 * drafted: nothing changed), -ENOMEM (the text buffer could not grow:
 * nothing changed, call again). Work: O(tokens * stop matching), see
 * sched_stop_push. */
int sched_complete(struct sched *s, const struct sched_result *results, uint32_t n, uint64_t now_ns,
                   const struct sched_event **events, uint32_t *n_events);

enum sched_req_state { SCHED_REQ_WAITING = 0, SCHED_REQ_RUNNING };

struct sched_req_info {
    enum sched_req_state state;
    uint32_t tenant;
    int32_t priority;              /* after the tenant's ceiling */
    uint32_t slot;                 /* SCHED_SLOT_NONE while waiting */
    uint32_t n_computed, n_target; /* tokens in the KV; prompt + generated at admission */
    uint32_t n_generated, n_preempted;
    uint32_t pages_reserved; /* private pages it may hold */
    uint64_t queue_ns;       /* waiting time so far, all admissions together */
};

/* A snapshot of a live request. Returns 0, -ENOENT. O(1). */
int sched_req_info(const struct sched *s, uint64_t id, struct sched_req_info *out);

/* The tokens a live request generated (its KV holds prompt ++ these). Borrowed
 * view, valid until the next sched_complete() or sched_cancel(). NULL with
 * *n = 0 for an unknown id. */
const int32_t *sched_req_generated(const struct sched *s, uint64_t id, uint32_t *n);

struct sched_stats {
    uint64_t waiting, running, tenants, pages_reserved;
    uint64_t submitted_total, admitted_total, finished_total, cancelled_total;
    uint64_t preemptions_total, refusals_total, steps_total;
    uint64_t decode_tokens_total;        /* decode entries run */
    uint64_t prefill_tokens_total;       /* prefill tokens run, recompute included */
    uint64_t recompute_tokens_total;     /* prefill tokens run again after a preemption */
    uint64_t generated_tokens_total;     /* tokens committed (returned), accepted drafts included */
    uint64_t spec_steps_total;           /* decode entries that carried a draft */
    uint64_t spec_draft_tokens_total;    /* draft tokens verified */
    uint64_t spec_accepted_tokens_total; /* of which accepted */
    uint64_t spec_accepted_len[SCHED_DRAFT_MAX + 1]; /* entries by accepted tokens */
    uint64_t queue_wait_max_ns;                      /* longest wait before an admission */
    uint64_t finish_total[SCHED_FINISH_N];
};

void sched_stats_get(const struct sched *s, struct sched_stats *out);

/* INFO-style text, "# sched\nsched_requests_waiting:3\n...", NUL-terminated
 * in buf[len]. Returns 0, -ENOSPC (truncated). */
int sched_stats_format(const struct sched *s, char *buf, size_t len);

/* "length", "stop", "eos", "context", "cancelled", "refused", "none". */
const char *sched_finish_name(enum sched_finish f);

/* Walk every invariant (slots, reservations, queues and their heap order,
 * counts). Logs the first violation and returns false. O(requests). Tests. */
bool sched_check(const struct sched *s);

/* --- sched_stop.c: stop strings matched across token boundaries ---------
 * Feed the text of each token; the matcher reports a stop string even when
 * it spans tokens ("\n" + "\nfoo" for "\n\n"), and holds back the longest
 * tail of the text that is a proper prefix of some stop string, so the
 * released text never contains any part of a matched stop string (OpenAI's
 * and vLLM's behaviour). Fed valid UTF-8, it releases valid UTF-8 (a held
 * tail starts where a stop string starts, on a character boundary).
 * Caller-embedded; one owner. */
struct sched_stop {
    char *mem; /* one allocation: the strings, then the held bytes */
    const char *str[SCHED_STOP_MAX_N];
    uint32_t len[SCHED_STOP_MAX_N];
    uint32_t n, max_len; /* stop strings; bytes of the longest */
    char *held;          /* [max_len - 1], n_held bytes used */
    uint32_t n_held;
};

/* Copy n stop strings (NUL-terminated, 1..SCHED_STOP_MAX_BYTES bytes, n <= SCHED_STOP_MAX_N;
 * n = 0: never matches). Returns 0, -EINVAL, -ENOMEM (m is empty; fini is safe). */
int sched_stop_init(struct sched_stop *m, const char *const *stops, uint32_t n);
void sched_stop_fini(struct sched_stop *m);

/* Append len bytes of piece. out[0..cap) receives the released text: what is
 * now known not to start a stop string, or on a match everything before the
 * stop string (*matched = true; later pushes are not meaningful). Needs cap
 * >= sched_stop_held(m) + len, else -ENOSPC and m is unchanged. Returns 0 or
 * -ENOSPC. Work: O((held + len) * sum of stop lengths). */
int sched_stop_push(struct sched_stop *m, const char *piece, size_t len, char *out, size_t cap,
                    size_t *n_out, bool *matched);

/* Release the held bytes (the text ended without completing a stop string)
 * into out (cap >= sched_stop_held(m)); returns the number written. */
size_t sched_stop_flush(struct sched_stop *m, char *out, size_t cap);

static inline size_t sched_stop_held(const struct sched_stop *m) { /* bytes held back */
    return m->n_held;
}

#endif /* LLMD_SCHED_H */
