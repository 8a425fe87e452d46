/* sched_impl.h - internals shared by sched.c (requests, queues, completion,
 * stats) and sched_plan.c (step planning). Not for other modules: they use
 * sched.h.
 *
 * Requests live in a handle table sized at creation for every request that
 * can be alive at once (max_waiting + max_seqs), so ids resolve in O(1) and
 * are never reused (a 32-bit generation per handle). Waiting requests sit in
 * a binary max-heap per tenant ordered by an aging key (see sched_key); a
 * tenant's heap always has room for all of its requests, waiting or running,
 * so requeueing a preempted one never allocates.
 */
#ifndef LLMD_SCHED_IMPL_H
#define LLMD_SCHED_IMPL_H

#include "engine/core/sched.h"

#define SCHED_RATE_BUCKETS 16 /* page-release history: window / 16 per bucket */

struct sched_req {
    uint64_t id;
    uint32_t tenant; /* index into s->tenants */
    int32_t prio;    /* capped */
    int64_t key;     /* prio * aging_ns - arrival_ns: the larger runs first */
    uint64_t arrival_ns;
    uint64_t wait_since_ns; /* when it last entered its queue */
    uint64_t queue_ns;      /* waits before earlier admissions, summed */
    uint32_t prompt_len;
    uint32_t cached_tokens; /* prefix-cache hit used at the next admission */
    uint32_t max_tokens;    /* UINT32_MAX: up to the context limit */
    uint32_t n_gen;         /* tokens generated, in gen[] */
    uint32_t gen_cap;
    int32_t *gen;          /* [gen_cap], MEM_SCHED */
    uint32_t n_target;     /* prefill target: prompt_len + n_gen at admission */
    uint32_t n_computed;   /* tokens in the KV cache */
    uint32_t prefix_pages; /* shared prefix-cache pages (not reserved by us) */
    uint32_t pages_reserved;
    uint32_t need_pages; /* waiting: private pages it needs to be admitted */
    uint32_t slot;       /* running: its slot; else SCHED_SLOT_NONE */
    uint32_t heap_idx;   /* waiting: index in its tenant's heap */
    uint32_t n_preempted;
    uint32_t entry;      /* index of its entry in the plan of step `step` */
    uint32_t draft_want; /* draft tokens offered for the next plan (sched_draft_set) */
    bool held;           /* waiting: not admitted while set (sched_set_held) */
    uint64_t step;
    uint64_t admit_seq; /* order of the last admission */
    enum sched_req_state state;
    int32_t eos;
    int32_t stop_ids[SCHED_STOP_IDS_MAX]; /* [n_stop_ids]: finish as eos does */
    uint32_t n_stop_ids;
    struct sched_stop stop;
};

struct sched_tenant {
    uint32_t id, weight;
    int32_t max_prio;
    struct sched_req **heap; /* [cap]: waiting requests, max-heap by key */
    uint32_t n_wait, cap;
    uint32_t n_running;
    int64_t deficit; /* DRR deficit counter, tokens */
    uint64_t line;   /* admission-line ticket, 0 = not in line */
};

struct sched {
    struct sched_config cfg; /* normalized; cfg.tenants is NULL */
    uint32_t ctx_eff;        /* min(max_ctx, n_pages * tpp): tokens a sequence may reach */

    struct sched_tenant *tenants; /* [cfg.max_tenants] */
    uint32_t n_tenants;
    uint32_t drr_next; /* tenant whose DRR turn it is */
    bool drr_credited; /* it already got this turn's quantum */

    uint32_t n_handles;      /* max_waiting + max_seqs */
    struct sched_req **live; /* [n_handles] */
    uint32_t *gens;          /* [n_handles] generation of each handle */
    uint32_t *free_handles;  /* [n_handles] stack */
    uint32_t n_free_handles;

    struct sched_req **slots; /* [max_seqs] */
    uint32_t n_running, n_waiting;
    uint64_t waiting_pages; /* sum of need_pages over waiting requests */
    uint64_t line_ticket;   /* last admission-line ticket handed out */

    /* the current plan and its scratch, [max_seqs] each */
    bool plan_out;
    uint64_t step;
    struct sched_entry *entries;
    struct sched_preempt *preempted;
    struct sched_admit *admitted;
    struct sched_req **order;
    struct sched_req **pf;
    struct sched_plan plan;

    struct sched_event *events; /* [max_batched_tokens]: a token of the step each at most */
    char *text;                 /* event text arena, MEM_SCHED */
    size_t text_cap;

    uint64_t rate_epoch[SCHED_RATE_BUCKETS];
    uint64_t rate_pages[SCHED_RATE_BUCKETS];
    uint64_t rate_t0_ns; /* first release seen; 0 with rate_any false */
    bool rate_any;

    uint64_t admit_seq;
    struct sched_stats st;
};

/* Pages covering n tokens. */
static inline uint32_t sched_pages_for(const struct sched *s, uint64_t n_tokens) {
    return (uint32_t)((n_tokens + s->cfg.tokens_per_page - 1) / s->cfg.tokens_per_page);
}

static inline bool sched_req_decoding(const struct sched_req *r) {
    return r->n_computed >= r->n_target;
}

/* Private pages a request needs to be admitted now (see sched.c). */
uint32_t sched_admit_pages(const struct sched *s, const struct sched_req *r);
/* Pages the engine can still hand out: free + evictable minus what running
 * sequences have reserved but not mapped yet. */
int64_t sched_avail(const struct sched *s);
/* Private pages slot's sequence maps now. */
uint32_t sched_held_private(const struct sched *s, const struct sched_req *r);

void sched_heap_push(struct sched_tenant *t, struct sched_req *r);
void sched_heap_remove(struct sched_tenant *t, struct sched_req *r);
/* Queue r (not running) in its tenant's heap at now_ns. */
void sched_enqueue(struct sched *s, struct sched_req *r, uint64_t now_ns);
/* Take waiting r out of its queue (its tenant leaves the admission line
 * when nothing of it is left waiting). */
void sched_dequeue(struct sched *s, struct sched_req *r);
/* Take r out of its slot; pages_reserved is released, and counted in the
 * release rate when r is done (finished or cancelled: a preempted request
 * will want its pages back, so its release is no progress). */
void sched_unslot(struct sched *s, struct sched_req *r, bool done, uint64_t now_ns);
void sched_rate_record(struct sched *s, uint32_t pages, uint64_t now_ns);

#endif /* LLMD_SCHED_IMPL_H */
