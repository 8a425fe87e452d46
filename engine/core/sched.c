/* sched.c - the scheduler's requests: submission with admission control and
 * refusal, per-tenant queues, cancellation, completion of a step with the
 * stop conditions, stats. The step planner is in sched_plan.c.
 *
 * Page accounting. A running sequence holds a reservation of private pages:
 * at admission pages_for(prefill target) + headroom_pages, minus the full
 * pages shared from the prefix cache, capped at what the sequence can ever
 * use (pages_for(min(context, prompt + max_tokens))). Decode extends the
 * reservation one page at a time when it crosses the reserved extent
 * (sched_plan). The pages the engine may still hand out are
 *   avail = free + evictable - sum over running of (reserved - mapped)+
 * and nothing is admitted or extended beyond avail, so a step never runs out
 * of pages: the engine releases preempted slots first and evicts cached
 * pages when the free list alone is short.
 *
 * Queue order and aging. A waiting request of priority p that arrived at a
 * sorts by key = p * aging_ns - a (larger first, then the smaller id): its
 * effective priority p + wait / aging_ns grows by one level per aging_ns of
 * waiting, and since every waiting request ages at the same rate the order
 * between two of them never changes, so a plain heap keeps it. After
 * (ceiling - p) * aging_ns of waiting nothing that arrives later can pass it.
 *
 * Refusal. The predicted wait of a new request is the page deficit
 *   waiting_pages + its pages - avail
 * divided by the page-release rate over the last rate_window_ns (reservations
 * of finished and cancelled requests; a preemption is no progress: the
 * victim wants its pages back), measured from the first release
 * when the scheduler is younger than the window. With no release seen yet
 * the wait is unknown and the request is queued (never refused on a guess).
 * It counts every waiting request as ahead of the new one, which is
 * pessimistic for a tenant with a large DRR share.
 */
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "engine/core/sched_impl.h"
#include "log.h"
#include "mem.h"

#define SCHED_GEN_CAP0 16 /* first size of a request's generated-token array */

/* ---- tenants ------------------------------------------------------------ */

static struct sched_tenant *tenant_find(struct sched *s, uint32_t id) {
    for (uint32_t i = 0; i < s->n_tenants; i++)
        if (s->tenants[i].id == id)
            return &s->tenants[i];
    return NULL;
}

static struct sched_tenant *tenant_add(struct sched *s, uint32_t id) {
    if (s->n_tenants == s->cfg.max_tenants)
        return NULL;
    struct sched_tenant *t = &s->tenants[s->n_tenants++];
    memset(t, 0, sizeof(*t));
    t->id = id;
    t->weight = s->cfg.default_weight;
    t->max_prio = s->cfg.default_max_priority;
    return t;
}

int sched_tenant_set(struct sched *s, const struct sched_tenant_config *tc) {
    if (!tc || tc->weight == 0)
        return -EINVAL;
    struct sched_tenant *t = tenant_find(s, tc->tenant);
    if (!t && !(t = tenant_add(s, tc->tenant)))
        return -ENOSPC;
    t->weight = tc->weight;
    t->max_prio = tc->max_priority;
    return 0;
}

/* ---- lifecycle ---------------------------------------------------------- */

static int cfg_normalize(const struct sched_config *in, struct sched_config *c) {
    *c = *in;
    if (!c->ops || !c->ops->free_pages || !c->ops->evictable_pages || !c->ops->seq_pages)
        return -EINVAL;
    if (!c->n_pages || !c->tokens_per_page || !c->max_ctx || !c->max_seqs ||
        c->max_batched_tokens < c->max_seqs)
        return -EINVAL;
    if (c->preempt_mode != SCHED_PREEMPT_RECOMPUTE && c->preempt_mode != SCHED_PREEMPT_SPILL)
        return -EINVAL;
    if (!c->quantum_tokens)
        c->quantum_tokens = 16;
    if (!c->aging_ns)
        c->aging_ns = 1000000000ull;
    if (c->aging_ns > 1000000000000ull) /* keeps prio * aging_ns far from int64 overflow */
        return -EINVAL;
    if (!c->rate_window_ns)
        c->rate_window_ns = 10000000000ull;
    if (c->rate_window_ns < SCHED_RATE_BUCKETS)
        return -EINVAL;
    if (!c->max_waiting)
        c->max_waiting = 4096;
    if (!c->max_tenants)
        c->max_tenants = 64;
    if (!c->default_max_priority)
        c->default_max_priority = SCHED_PRIO_LIMIT;
    if (!c->default_weight)
        c->default_weight = 1;
    if (c->n_tenants > c->max_tenants || (c->n_tenants && !c->tenants))
        return -EINVAL;
    if ((uint64_t)c->max_waiting + c->max_seqs > UINT32_MAX / 2)
        return -EINVAL;
    return 0;
}

int sched_create(const struct sched_config *cfg, struct sched **out) {
    struct sched_config c;
    int rc = cfg_normalize(cfg, &c);
    if (rc)
        return rc;
    struct sched *s = mem_calloc(MEM_SCHED, 1, sizeof(*s));
    if (!s)
        return -ENOMEM;
    s->cfg = c;
    s->cfg.tenants = NULL;
    s->cfg.n_tenants = 0;
    uint64_t cap_tokens = (uint64_t)c.n_pages * c.tokens_per_page;
    s->ctx_eff = cap_tokens < c.max_ctx ? (uint32_t)cap_tokens : c.max_ctx;
    s->n_handles = c.max_waiting + c.max_seqs;
    uint32_t m = c.max_seqs;
    s->tenants = mem_calloc(MEM_SCHED, c.max_tenants, sizeof(*s->tenants));
    s->live = mem_calloc(MEM_SCHED, s->n_handles, sizeof(*s->live));
    s->gens = mem_calloc(MEM_SCHED, s->n_handles, sizeof(*s->gens));
    s->free_handles = mem_calloc(MEM_SCHED, s->n_handles, sizeof(*s->free_handles));
    s->slots = mem_calloc(MEM_SCHED, m, sizeof(*s->slots));
    s->entries = mem_calloc(MEM_SCHED, m, sizeof(*s->entries));
    s->preempted = mem_calloc(MEM_SCHED, m, sizeof(*s->preempted));
    s->admitted = mem_calloc(MEM_SCHED, m, sizeof(*s->admitted));
    s->order = mem_calloc(MEM_SCHED, m, sizeof(*s->order));
    s->pf = mem_calloc(MEM_SCHED, m, sizeof(*s->pf));
    s->events = mem_calloc(MEM_SCHED, c.max_batched_tokens, sizeof(*s->events));
    if (!s->tenants || !s->live || !s->gens || !s->free_handles || !s->slots || !s->entries ||
        !s->preempted || !s->admitted || !s->order || !s->pf || !s->events) {
        rc = -ENOMEM;
        goto fail;
    }
    for (uint32_t i = 0; i < s->n_handles; i++) {
        s->free_handles[i] = s->n_handles - 1 - i; /* handle 0 is used first */
        s->gens[i] = 1;
    }
    s->n_free_handles = s->n_handles;
    for (uint32_t i = 0; i < c.n_tenants; i++) {
        if (tenant_find(s, c.tenants[i].tenant)) {
            rc = -EINVAL;
            goto fail;
        }
        rc = sched_tenant_set(s, &c.tenants[i]);
        if (rc)
            goto fail;
    }
    *out = s;
    return 0;
fail:
    sched_destroy(s);
    return rc;
}

static void req_free(struct sched_req *r) {
    sched_stop_fini(&r->stop);
    mem_free(r->gen);
    mem_free(r);
}

void sched_destroy(struct sched *s) {
    if (!s)
        return;
    if (s->live)
        for (uint32_t i = 0; i < s->n_handles; i++)
            if (s->live[i])
                req_free(s->live[i]);
    if (s->tenants)
        for (uint32_t i = 0; i < s->n_tenants; i++)
            mem_free(s->tenants[i].heap);
    mem_free(s->tenants);
    mem_free(s->live);
    mem_free(s->gens);
    mem_free(s->free_handles);
    mem_free(s->slots);
    mem_free(s->entries);
    mem_free(s->preempted);
    mem_free(s->admitted);
    mem_free(s->order);
    mem_free(s->pf);
    mem_free(s->events);
    mem_free(s->text);
    mem_free(s);
}

/* ---- handles ------------------------------------------------------------ */

static struct sched_req *req_lookup(const struct sched *s, uint64_t id) {
    uint32_t h = (uint32_t)id;
    if (h >= s->n_handles || !s->live[h] || s->gens[h] != (uint32_t)(id >> 32))
        return NULL;
    return s->live[h];
}

static void req_drop(struct sched *s, struct sched_req *r) {
    uint32_t h = (uint32_t)r->id;
    s->live[h] = NULL;
    s->gens[h] = s->gens[h] == UINT32_MAX ? 1 : s->gens[h] + 1;
    s->free_handles[s->n_free_handles++] = h;
    req_free(r);
}

/* ---- heaps: max-heap by (key, then the smaller id) ---------------------- */

static bool heap_before(const struct sched_req *a, const struct sched_req *b) {
    return a->key != b->key ? a->key > b->key : a->id < b->id;
}

static void heap_set(struct sched_tenant *t, uint32_t i, struct sched_req *r) {
    t->heap[i] = r;
    r->heap_idx = i;
}

static void heap_up(struct sched_tenant *t, uint32_t i) {
    struct sched_req *r = t->heap[i];
    while (i > 0 && heap_before(r, t->heap[(i - 1) / 2])) {
        heap_set(t, i, t->heap[(i - 1) / 2]);
        i = (i - 1) / 2;
    }
    heap_set(t, i, r);
}

static void heap_down(struct sched_tenant *t, uint32_t i) {
    struct sched_req *r = t->heap[i];
    for (;;) {
        uint32_t c = 2 * i + 1;
        if (c >= t->n_wait)
            break;
        if (c + 1 < t->n_wait && heap_before(t->heap[c + 1], t->heap[c]))
            c++;
        if (!heap_before(t->heap[c], r))
            break;
        heap_set(t, i, t->heap[c]);
        i = c;
    }
    heap_set(t, i, r);
}

void sched_heap_push(struct sched_tenant *t, struct sched_req *r) {
    assert(t->n_wait < t->cap);
    heap_set(t, t->n_wait++, r);
    heap_up(t, r->heap_idx);
}

void sched_heap_remove(struct sched_tenant *t, struct sched_req *r) {
    uint32_t i = r->heap_idx;
    assert(i < t->n_wait && t->heap[i] == r);
    struct sched_req *last = t->heap[--t->n_wait];
    r->heap_idx = UINT32_MAX;
    if (last == r)
        return;
    heap_set(t, i, last);
    heap_up(t, i);
    heap_down(t, last->heap_idx);
}

/* ---- page accounting ---------------------------------------------------- */

uint32_t sched_admit_pages(const struct sched *s, const struct sched_req *r) {
    uint64_t limit = (uint64_t)r->prompt_len + r->max_tokens;
    if (limit > s->ctx_eff)
        limit = s->ctx_eff;
    uint32_t want = sched_pages_for(s, r->n_target) + s->cfg.headroom_pages;
    uint32_t most = sched_pages_for(s, limit);
    if (want > most)
        want = most;
    uint32_t prefix = r->cached_tokens / s->cfg.tokens_per_page;
    return want > prefix ? want - prefix : 0;
}

uint32_t sched_held_private(const struct sched *s, const struct sched_req *r) {
    uint32_t held = s->cfg.ops->seq_pages(s->cfg.ops_ctx, r->slot);
    return held > r->prefix_pages ? held - r->prefix_pages : 0;
}

int64_t sched_avail(const struct sched *s) {
    const struct sched_page_ops *ops = s->cfg.ops;
    int64_t avail =
        (int64_t)ops->free_pages(s->cfg.ops_ctx) + (int64_t)ops->evictable_pages(s->cfg.ops_ctx);
    for (uint32_t i = 0; i < s->cfg.max_seqs; i++) {
        const struct sched_req *r = s->slots[i];
        if (!r)
            continue;
        uint32_t held = sched_held_private(s, r);
        if (r->pages_reserved > held)
            avail -= r->pages_reserved - held;
    }
    return avail;
}

uint32_t sched_pages_avail(const struct sched *s) {
    int64_t a = sched_avail(s);
    return a <= 0 ? 0 : a >= UINT32_MAX ? UINT32_MAX : (uint32_t)a;
}

void sched_rate_record(struct sched *s, uint32_t pages, uint64_t now_ns) {
    uint64_t bucket_ns = s->cfg.rate_window_ns / SCHED_RATE_BUCKETS;
    uint64_t e = now_ns / bucket_ns;
    uint32_t b = (uint32_t)(e % SCHED_RATE_BUCKETS);
    if (s->rate_epoch[b] != e) {
        s->rate_epoch[b] = e;
        s->rate_pages[b] = 0;
    }
    s->rate_pages[b] += pages;
    if (!s->rate_any) {
        s->rate_any = true;
        s->rate_t0_ns = now_ns;
    }
}

/* Pages released per second over the window; 0 when none was seen. */
static double rate_pages_per_s(const struct sched *s, uint64_t now_ns) {
    if (!s->rate_any)
        return 0;
    uint64_t bucket_ns = s->cfg.rate_window_ns / SCHED_RATE_BUCKETS;
    uint64_t e = now_ns / bucket_ns, sum = 0;
    for (uint32_t b = 0; b < SCHED_RATE_BUCKETS; b++)
        if (s->rate_epoch[b] <= e && s->rate_epoch[b] + SCHED_RATE_BUCKETS > e)
            sum += s->rate_pages[b];
    uint64_t span = now_ns > s->rate_t0_ns ? now_ns - s->rate_t0_ns : 0;
    span += bucket_ns; /* the current bucket counts whole */
    if (span > s->cfg.rate_window_ns)
        span = s->cfg.rate_window_ns;
    return (double)sum * 1e9 / (double)span;
}

void sched_enqueue(struct sched *s, struct sched_req *r, uint64_t now_ns) {
    struct sched_tenant *t = &s->tenants[r->tenant];
    r->state = SCHED_REQ_WAITING;
    r->slot = SCHED_SLOT_NONE;
    r->wait_since_ns = now_ns;
    r->need_pages = sched_admit_pages(s, r);
    sched_heap_push(t, r);
    s->n_waiting++;
    s->waiting_pages += r->need_pages;
}

void sched_dequeue(struct sched *s, struct sched_req *r) {
    sched_heap_remove(&s->tenants[r->tenant], r);
    s->n_waiting--;
    s->waiting_pages -= r->need_pages;
    if (s->tenants[r->tenant].n_wait == 0)
        s->tenants[r->tenant].line = 0; /* nothing left to admit: out of the line */
}

void sched_unslot(struct sched *s, struct sched_req *r, bool done, uint64_t now_ns) {
    assert(r->state == SCHED_REQ_RUNNING && s->slots[r->slot] == r);
    s->slots[r->slot] = NULL;
    s->n_running--;
    s->tenants[r->tenant].n_running--;
    if (done)
        sched_rate_record(s, r->pages_reserved, now_ns);
    r->pages_reserved = 0;
}

/* ---- submit and cancel -------------------------------------------------- */

/* Refuse (-EAGAIN) when the predicted wait for need more pages exceeds the
 * limit; *retry_s is then the seconds until it would not. */
static int predict_refuse(struct sched *s, uint32_t need, uint64_t now_ns, uint32_t *retry_s) {
    double rate = rate_pages_per_s(s, now_ns);
    int64_t deficit = (int64_t)s->waiting_pages + need - sched_avail(s);
    if (s->n_waiting >= s->cfg.max_waiting) {
        double w = rate > 0 && deficit > 0 ? (double)deficit / rate : 1.0;
        *retry_s = w < 1.0 ? 1 : w > 86400.0 ? 86400 : (uint32_t)(w + 0.999);
        return -EAGAIN;
    }
    if (!s->cfg.max_queue_wait_ns || deficit <= 0 || rate <= 0)
        return 0;
    double wait_s = (double)deficit / rate, limit_s = (double)s->cfg.max_queue_wait_ns / 1e9;
    if (wait_s <= limit_s)
        return 0;
    double w = wait_s - limit_s;
    *retry_s = w < 1.0 ? 1 : w > 86400.0 ? 86400 : (uint32_t)(w + 0.999);
    return -EAGAIN;
}

int sched_submit(struct sched *s, const struct sched_request *in, uint64_t now_ns, uint64_t *id,
                 uint32_t *retry_after_s) {
    uint32_t retry = 0;
    if (retry_after_s)
        *retry_after_s = 0;
    if (s->plan_out)
        return -EBUSY;
    if (!in || !id || in->prompt_len == 0 || in->n_stop > SCHED_STOP_MAX_N ||
        in->n_stop_ids > SCHED_STOP_IDS_MAX || (in->n_stop_ids && !in->stop_ids))
        return -EINVAL;
    if (in->prompt_len >= s->ctx_eff)
        return -E2BIG;
    struct sched_tenant *t = tenant_find(s, in->tenant);
    bool new_tenant = false;
    if (!t) {
        if (!(t = tenant_add(s, in->tenant)))
            return -ENOSPC;
        new_tenant = true;
    }
    int rc;
    struct sched_req *r = mem_calloc(MEM_SCHED, 1, sizeof(*r));
    if (!r) {
        rc = -ENOMEM;
        goto fail;
    }
    rc = sched_stop_init(&r->stop, in->stop, in->n_stop);
    if (rc)
        goto fail_req;
    r->tenant = (uint32_t)(t - s->tenants);
    int32_t p = in->priority < t->max_prio ? in->priority : t->max_prio;
    p = p > SCHED_PRIO_LIMIT ? SCHED_PRIO_LIMIT : p < -SCHED_PRIO_LIMIT ? -SCHED_PRIO_LIMIT : p;
    r->prio = p;
    r->key = (int64_t)p * (int64_t)s->cfg.aging_ns - (int64_t)now_ns;
    r->arrival_ns = now_ns;
    r->prompt_len = in->prompt_len;
    r->cached_tokens = in->cached_tokens < in->prompt_len ? in->cached_tokens : in->prompt_len - 1;
    r->max_tokens = in->max_tokens ? in->max_tokens : UINT32_MAX;
    r->n_target = in->prompt_len;
    r->eos = in->eos;
    r->n_stop_ids = in->n_stop_ids;
    for (uint32_t i = 0; i < in->n_stop_ids; i++)
        r->stop_ids[i] = in->stop_ids[i];
    r->slot = SCHED_SLOT_NONE;
    r->gen_cap = r->max_tokens < SCHED_GEN_CAP0 ? r->max_tokens : SCHED_GEN_CAP0;
    r->gen = mem_alloc(MEM_SCHED, (size_t)r->gen_cap * sizeof(*r->gen));
    if (!r->gen) {
        rc = -ENOMEM;
        goto fail_req;
    }
    /* room in the tenant's heap for all its requests: requeueing never allocates */
    uint32_t want = t->n_wait + t->n_running + 1;
    if (want > t->cap) {
        uint32_t cap = t->cap ? t->cap * 2 : 8;
        cap = cap < want ? want : cap;
        size_t bytes = (size_t)cap * sizeof(*t->heap);
        struct sched_req **h = t->heap ? mem_realloc(t->heap, bytes) : mem_alloc(MEM_SCHED, bytes);
        if (!h) {
            rc = -ENOMEM;
            goto fail_req;
        }
        t->heap = h;
        t->cap = cap;
    }
    rc = predict_refuse(s, sched_admit_pages(s, r), now_ns, &retry);
    if (rc) {
        s->st.refusals_total++;
        if (retry_after_s)
            *retry_after_s = retry;
        goto fail_req;
    }
    if (NEVER(s->n_free_handles == 0)) { /* max_waiting + max_seqs bounds the live ones */
        rc = -EAGAIN;
        goto fail_req;
    }
    uint32_t h = s->free_handles[--s->n_free_handles];
    r->id = (uint64_t)s->gens[h] << 32 | h;
    s->live[h] = r;
    sched_enqueue(s, r, now_ns);
    s->st.submitted_total++;
    *id = r->id;
    return 0;
fail_req:
    req_free(r);
fail:
    if (new_tenant) { /* it was the last one added and has nothing queued */
        mem_free(t->heap);
        s->n_tenants--;
    }
    return rc;
}

int sched_cancel(struct sched *s, uint64_t id, uint64_t now_ns, uint32_t *slot) {
    if (slot)
        *slot = SCHED_SLOT_NONE;
    if (s->plan_out)
        return -EBUSY;
    struct sched_req *r = req_lookup(s, id);
    if (!r)
        return -ENOENT;
    if (r->state == SCHED_REQ_WAITING) {
        sched_dequeue(s, r);
    } else {
        if (slot)
            *slot = r->slot;
        sched_unslot(s, r, true, now_ns);
    }
    s->st.cancelled_total++;
    s->st.finished_total++;
    s->st.finish_total[SCHED_FINISH_CANCELLED]++;
    req_drop(s, r);
    return 0;
}

int sched_draft_set(struct sched *s, uint64_t id, uint32_t n_draft) {
    if (s->plan_out)
        return -EBUSY;
    struct sched_req *r = req_lookup(s, id);
    if (!r)
        return -ENOENT;
    if (r->state != SCHED_REQ_RUNNING || !sched_req_decoding(r) || n_draft > SCHED_DRAFT_MAX)
        return -EINVAL;
    r->draft_want = n_draft;
    return 0;
}

/* The waiting request id, for a call that changes it between steps: 0,
 * -EBUSY (a plan is out, or it runs), -ENOENT. */
static int waiting_req(struct sched *s, uint64_t id, struct sched_req **out) {
    if (s->plan_out)
        return -EBUSY;
    struct sched_req *r = req_lookup(s, id);
    if (!r)
        return -ENOENT;
    if (r->state != SCHED_REQ_WAITING)
        return -EBUSY;
    *out = r;
    return 0;
}

int sched_set_cached(struct sched *s, uint64_t id, uint32_t cached_tokens) {
    struct sched_req *r;
    int rc = waiting_req(s, id, &r);
    if (rc < 0)
        return rc;
    s->waiting_pages -= r->need_pages;
    /* a preempted request's target covers its generated tokens too */
    r->cached_tokens = cached_tokens < r->n_target ? cached_tokens : r->n_target - 1;
    r->need_pages = sched_admit_pages(s, r);
    s->waiting_pages += r->need_pages;
    return 0;
}

int sched_set_held(struct sched *s, uint64_t id, bool held) {
    struct sched_req *r;
    int rc = waiting_req(s, id, &r);
    if (rc == 0)
        r->held = held;
    return rc;
}

/* ---- completion --------------------------------------------------------- */

/* Everything that can fail, before anything changes: the generated-token
 * arrays and the text arena grow here. */
static int complete_prepare(struct sched *s, const struct sched_result *res, uint32_t n) {
    if (!s->plan_out || n != s->plan.n_entries || (n && !res))
        return -EINVAL;
    size_t text = 0;
    for (uint32_t i = 0; i < n; i++) {
        const struct sched_entry *e = &s->entries[i];
        struct sched_req *r = req_lookup(s, e->id);
        if (res[i].id != e->id || NEVER(!r))
            return -EINVAL;
        if (!e->want_logits)
            continue;
        const struct sched_result *q = &res[i];
        if (q->token < 0 || (q->piece_bytes && !q->piece) || q->n_accepted > e->n_draft ||
            (q->n_accepted && (!q->accepted || !q->accepted_piece || !q->accepted_piece_bytes)))
            return -EINVAL;
        text += sched_stop_held(&r->stop) + q->piece_bytes;
        for (uint32_t j = 0; j < q->n_accepted; j++) {
            if (q->accepted[j] < 0 || (q->accepted_piece_bytes[j] && !q->accepted_piece[j]))
                return -EINVAL;
            text += q->accepted_piece_bytes[j];
        }
        uint32_t want = r->n_gen + 1 + q->n_accepted;
        if (want > r->gen_cap) {
            uint32_t cap = r->gen_cap;
            while (cap < want)
                cap = cap > UINT32_MAX / 2 ? UINT32_MAX : cap * 2;
            int32_t *g = mem_realloc(r->gen, (size_t)cap * sizeof(*g));
            if (!g)
                return -ENOMEM;
            r->gen = g;
            r->gen_cap = cap;
        }
    }
    if (text > s->text_cap || !s->text) { /* events always point into a buffer */
        size_t cap = text < 4096 ? 4096 : text * 2;
        char *t = s->text ? mem_realloc(s->text, cap) : mem_alloc(MEM_SCHED, cap);
        if (!t)
            return -ENOMEM;
        s->text = t;
        s->text_cap = cap;
    }
    return 0;
}

/* The finish reason after token tok, and the event text in out. */
static enum sched_finish complete_one(struct sched *s, struct sched_req *r, int32_t token,
                                      const char *piece, size_t piece_bytes, char *out, size_t cap,
                                      size_t *n_out) {
    enum sched_finish f = SCHED_FINISH_NONE;
    *n_out = 0;
    bool stop_id = false;
    for (uint32_t i = 0; i < r->n_stop_ids; i++)
        stop_id |= token == r->stop_ids[i];
    if (token == r->eos || stop_id) { /* its text is not returned */
        f = SCHED_FINISH_EOS;
    } else {
        bool matched;
        int rc = sched_stop_push(&r->stop, piece, piece_bytes, out, cap, n_out, &matched);
        if (NEVER(rc != 0)) /* complete_prepare sized the arena */
            *n_out = 0;
        else if (matched)
            return SCHED_FINISH_STOP;
        if (r->n_gen >= r->max_tokens)
            f = SCHED_FINISH_LENGTH;
        else if ((uint64_t)r->prompt_len + r->n_gen >= s->ctx_eff)
            /* a pool smaller than one context ends the sequence first: a limit
             * of the deployment, not of the model, so it is told apart */
            f = s->ctx_eff < s->cfg.max_ctx ? SCHED_FINISH_KV_BUDGET : SCHED_FINISH_CONTEXT;
    }
    if (f != SCHED_FINISH_NONE)
        *n_out += sched_stop_flush(&r->stop, out + *n_out, cap - *n_out);
    return f;
}

int sched_complete(struct sched *s, const struct sched_result *res, uint32_t n, uint64_t now_ns,
                   const struct sched_event **events, uint32_t *n_events) {
    int rc = complete_prepare(s, res, n);
    if (rc)
        return rc;
    uint32_t ne = 0;
    size_t off = 0;
    for (uint32_t i = 0; i < n; i++) {
        const struct sched_entry *e = &s->entries[i];
        const struct sched_result *q = &res[i];
        struct sched_req *r = req_lookup(s, e->id);
        if (e->is_decode) {
            /* the KV of rejected draft positions does not count */
            r->n_computed += 1 + q->n_accepted;
            s->st.decode_tokens_total++;
            if (e->n_draft) {
                s->st.spec_steps_total++;
                s->st.spec_draft_tokens_total += e->n_draft;
            }
        } else {
            r->n_computed += e->n_tokens;
            s->st.prefill_tokens_total += e->n_tokens;
            if (r->n_preempted)
                s->st.recompute_tokens_total += e->n_tokens;
        }
        if (!e->want_logits)
            continue;
        /* the accepted draft tokens, then the target's own; a finish drops the rest */
        uint32_t j = 0;
        enum sched_finish f = SCHED_FINISH_NONE;
        for (; j <= q->n_accepted && f == SCHED_FINISH_NONE; j++) {
            bool last = j == q->n_accepted;
            int32_t token = last ? q->token : q->accepted[j];
            r->gen[r->n_gen++] = token;
            s->st.generated_tokens_total++;
            struct sched_event *ev = &s->events[ne++];
            size_t len;
            f = complete_one(s, r, token, last ? q->piece : q->accepted_piece[j],
                             last ? q->piece_bytes : q->accepted_piece_bytes[j], s->text + off,
                             s->text_cap - off, &len);
            *ev = (struct sched_event){.id = r->id,
                                       .token = token,
                                       .text = s->text + off,
                                       .text_bytes = len,
                                       .finish = f,
                                       .slot = r->slot,
                                       .n_generated = r->n_gen};
            off += len;
        }
        if (e->n_draft) {
            uint32_t acc = j < q->n_accepted ? j : q->n_accepted; /* the committed ones */
            s->st.spec_accepted_tokens_total += acc;
            s->st.spec_accepted_len[acc]++;
        }
        if (f != SCHED_FINISH_NONE) {
            sched_unslot(s, r, true, now_ns);
            s->st.finished_total++;
            s->st.finish_total[f]++;
            req_drop(s, r);
        }
    }
    s->plan_out = false;
    *events = s->events;
    *n_events = ne;
    return 0;
}

/* ---- introspection ------------------------------------------------------ */

int sched_req_info(const struct sched *s, uint64_t id, struct sched_req_info *out) {
    const struct sched_req *r = req_lookup(s, id);
    if (!r)
        return -ENOENT;
    *out = (struct sched_req_info){
        .state = r->state,
        .tenant = s->tenants[r->tenant].id,
        .priority = r->prio,
        .slot = r->slot,
        .n_computed = r->n_computed,
        .n_target = r->n_target,
        .n_generated = r->n_gen,
        .pages_reserved = r->pages_reserved,
        .n_preempted = r->n_preempted,
        .queue_ns = r->queue_ns,
    };
    return 0;
}

const int32_t *sched_req_generated(const struct sched *s, uint64_t id, uint32_t *n) {
    const struct sched_req *r = req_lookup(s, id);
    *n = r ? r->n_gen : 0;
    return r ? r->gen : NULL;
}

void sched_stats_get(const struct sched *s, struct sched_stats *out) {
    *out = s->st;
    out->waiting = s->n_waiting;
    out->running = s->n_running;
    out->tenants = s->n_tenants;
    out->pages_reserved = 0;
    for (uint32_t i = 0; i < s->cfg.max_seqs; i++)
        if (s->slots[i])
            out->pages_reserved += s->slots[i]->pages_reserved;
}

uint32_t sched_max_seq_tokens(const struct sched *s) {
    return s->ctx_eff;
}

const char *sched_finish_name(enum sched_finish f) {
    static const char *const names[SCHED_FINISH_N] = {
        [SCHED_FINISH_NONE] = "none",           [SCHED_FINISH_LENGTH] = "length",
        [SCHED_FINISH_STOP] = "stop",           [SCHED_FINISH_EOS] = "eos",
        [SCHED_FINISH_CONTEXT] = "context",     [SCHED_FINISH_KV_BUDGET] = "kv_budget",
        [SCHED_FINISH_CANCELLED] = "cancelled", [SCHED_FINISH_REFUSED] = "refused",
    };
    return (unsigned)f < SCHED_FINISH_N ? names[f] : "?";
}

int sched_stats_format(const struct sched *s, char *buf, size_t len) {
    struct sched_stats st;
    sched_stats_get(s, &st);
    int n =
        snprintf(buf, len,
                 "# sched\n"
                 "sched_requests_waiting:%" PRIu64 "\n"
                 "sched_requests_running:%" PRIu64 "\n"
                 "sched_tenants:%" PRIu64 "\n"
                 "sched_pages_reserved:%" PRIu64 "\n"
                 "sched_submitted_total:%" PRIu64 "\n"
                 "sched_admitted_total:%" PRIu64 "\n"
                 "sched_finished_total:%" PRIu64 "\n"
                 "sched_cancelled_total:%" PRIu64 "\n"
                 "sched_preemptions_total:%" PRIu64 "\n"
                 "sched_refusals_total:%" PRIu64 "\n"
                 "sched_steps_total:%" PRIu64 "\n"
                 "sched_decode_tokens_total:%" PRIu64 "\n"
                 "sched_prefill_tokens_total:%" PRIu64 "\n"
                 "sched_recompute_tokens_total:%" PRIu64 "\n"
                 "sched_generated_tokens_total:%" PRIu64 "\n"
                 "sched_queue_wait_max_ns:%" PRIu64 "\n"
                 "sched_spec_steps_total:%" PRIu64 "\n"
                 "sched_spec_draft_tokens_total:%" PRIu64 "\n"
                 "sched_spec_accepted_tokens_total:%" PRIu64 "\n",
                 st.waiting, st.running, st.tenants, st.pages_reserved, st.submitted_total,
                 st.admitted_total, st.finished_total, st.cancelled_total, st.preemptions_total,
                 st.refusals_total, st.steps_total, st.decode_tokens_total, st.prefill_tokens_total,
                 st.recompute_tokens_total, st.generated_tokens_total, st.queue_wait_max_ns,
                 st.spec_steps_total, st.spec_draft_tokens_total, st.spec_accepted_tokens_total);
    if (n < 0 || (size_t)n >= len)
        return -ENOSPC;
    for (int f = SCHED_FINISH_LENGTH; f < SCHED_FINISH_N; f++) {
        size_t k = (size_t)n;
        int m = snprintf(buf + k, len - k, "sched_finished_%s_total:%" PRIu64 "\n",
                         sched_finish_name((enum sched_finish)f), st.finish_total[f]);
        if (m < 0 || (size_t)m >= len - k)
            return -ENOSPC;
        n += m;
    }
    return 0;
}

/* ---- invariants --------------------------------------------------------- */

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            LOG_ERROR("sched", __VA_ARGS__);                                                       \
            return false;                                                                          \
        }                                                                                          \
    } while (0)

static bool check_req(const struct sched *s, const struct sched_req *r) {
    CHECK(req_lookup(s, r->id) == r, "req %" PRIx64 ": handle", r->id);
    CHECK(r->n_computed <= r->n_target || r->n_computed + 1 == r->prompt_len + r->n_gen,
          "req %" PRIx64 ": computed %u target %u gen %u", r->id, r->n_computed, r->n_target,
          r->n_gen);
    CHECK(r->n_gen <= r->gen_cap && r->n_gen < r->max_tokens &&
              r->prompt_len + r->n_gen < s->ctx_eff,
          "req %" PRIx64 ": gen %u past its limits", r->id, r->n_gen);
    if (r->state == SCHED_REQ_WAITING) {
        const struct sched_tenant *t = &s->tenants[r->tenant];
        CHECK(r->heap_idx < t->n_wait && t->heap[r->heap_idx] == r, "req %" PRIx64 ": heap", r->id);
        CHECK(r->slot == SCHED_SLOT_NONE && r->pages_reserved == 0 && r->n_computed == 0,
              "req %" PRIx64 ": waiting with a slot or pages", r->id);
        CHECK(r->n_target == r->prompt_len + r->n_gen, "req %" PRIx64 ": target", r->id);
    } else {
        CHECK(r->slot < s->cfg.max_seqs && s->slots[r->slot] == r, "req %" PRIx64 ": slot", r->id);
        uint32_t kv = r->n_computed > r->n_target ? r->n_computed : r->n_target;
        uint32_t need = sched_pages_for(s, kv);
        need = need > r->prefix_pages ? need - r->prefix_pages : 0;
        CHECK(r->pages_reserved >= need, "req %" PRIx64 ": reserved %u < %u", r->id,
              r->pages_reserved, need);
    }
    return true;
}

bool sched_check(const struct sched *s) {
    uint32_t n_live = 0, n_wait = 0, n_run = 0;
    uint64_t wpages = 0;
    for (uint32_t h = 0; h < s->n_handles; h++) {
        const struct sched_req *r = s->live[h];
        if (!r)
            continue;
        n_live++;
        if (!check_req(s, r))
            return false;
        if (r->state == SCHED_REQ_WAITING) {
            n_wait++;
            wpages += r->need_pages;
        } else {
            n_run++;
            CHECK(!r->held, "request %" PRIu64 ": running but held", r->id);
        }
    }
    CHECK(n_live + s->n_free_handles == s->n_handles, "handles %u live + %u free != %u", n_live,
          s->n_free_handles, s->n_handles);
    CHECK(n_wait == s->n_waiting && n_run == s->n_running, "counts: waiting %u/%u running %u/%u",
          n_wait, s->n_waiting, n_run, s->n_running);
    CHECK(wpages == s->waiting_pages, "waiting pages %" PRIu64 " != %" PRIu64, wpages,
          s->waiting_pages);
    uint32_t tw = 0, tr = 0;
    for (uint32_t i = 0; i < s->n_tenants; i++) {
        const struct sched_tenant *t = &s->tenants[i];
        CHECK(t->n_wait + t->n_running <= t->cap, "tenant %u: cap", t->id);
        for (uint32_t j = 1; j < t->n_wait; j++)
            CHECK(!heap_before(t->heap[j], t->heap[(j - 1) / 2]), "tenant %u: heap order at %u",
                  t->id, j);
        for (uint32_t j = 0; j < t->n_wait; j++)
            CHECK(t->heap[j]->tenant == i, "tenant %u: foreign request", t->id);
        CHECK(!t->line || t->n_wait, "tenant %u: in line with nothing waiting", t->id);
        tw += t->n_wait;
        tr += t->n_running;
    }
    CHECK(tw == s->n_waiting && tr == s->n_running, "tenant sums");
    return true;
}
