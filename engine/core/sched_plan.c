/* sched_plan.c - plan one step: decodes first, then fair prefill chunks.
 *
 * Phase 1, decode. Every running sequence whose prompt is in the KV cache
 * gets one decode token, in run order (priority, then arrival, then id). A
 * decode that crosses its reserved pages extends the reservation by one page
 * from avail; when avail is empty the last sequence in run order (lowest
 * priority, then newest) is preempted, until the page is there or the
 * sequence itself was the victim. So decode never waits behind prefill, and
 * a victim never outranks the sequence it makes room for.
 *
 * Phase 2, prefill, shared among tenants by deficit round robin (Shreedhar
 * and Varghese, "Efficient Fair Queuing using Deficit Round Robin", SIGCOMM
 * 1995). The "link" is the step's remaining token budget; a tenant's turn adds
 * weight * quantum_tokens to its deficit counter and it is served prefill
 * tokens up to that counter: first chunks of its partially prefilled
 * sequences in admission order (they already hold their pages), then new
 * admissions from its queue. Tokens are divisible, so a turn spends its whole
 * counter unless the tenant runs out of work, which resets the counter to 0
 * (DRR's rule for an emptied queue). When the budget ends mid-turn the turn
 * resumes at the next step, so shares hold across steps: over any interval
 * where both are backlogged two tenants get prefill tokens in the ratio of
 * their weights, to within one quantum each per round (S&V, Lemma 2).
 * quantum_tokens = 16 by default: small enough that a 2048-token budget
 * interleaves many tenants in one step, large enough that a round does not
 * cost a visit per token.
 *
 * Admission goes through a line of tenants: a tenant whose first waiting
 * request cannot be admitted (no slot, not enough pages, or another tenant
 * ahead in line) takes a ticket, and only the tenant with the oldest ticket
 * may admit; admitting leaves the line, and failing again takes a new ticket
 * at the back. So the slots and pages that running sequences release go to
 * tenants in turn, and a big request is never passed by a stream of small
 * ones: once its tenant is first in line nothing else is admitted until it
 * fits, which takes at most until the running sequences finish (each is
 * bounded by max_tokens and the context limit).
 *
 * Phase 3, drafts (speculative decoding, sched_draft_set). Each decode
 * entry whose request offered a draft grows by up to that many tokens, in
 * run order, from what the first two phases left: budget tokens and avail
 * pages (never a preemption), and never past what the request can still
 * return (max_tokens - 1 more after the entry's first token, the context).
 * Drafts come last because they are a bet: a prompt's chunk is certain
 * work, a draft token is worth its acceptance probability.
 *
 * Work per call: the run order is an insertion sort, O(max_seqs^2); a DRR
 * turn either spends a full quantum or exhausts its tenant's candidates, so
 * there are O(n_tenants * (max_seqs + max_batched_tokens / quantum_tokens))
 * turns, each scanning at most max_seqs candidates; admissions cost O(log
 * waiting). No allocation.
 */
#include <assert.h>
#include <errno.h>
#include <string.h>

#include "engine/core/sched_impl.h"
#include "log.h"

#define NO_ENTRY UINT32_MAX

/* Run order: higher priority, then earlier arrival, then smaller id. */
static bool run_before(const struct sched_req *a, const struct sched_req *b) {
    if (a->prio != b->prio)
        return a->prio > b->prio;
    if (a->arrival_ns != b->arrival_ns)
        return a->arrival_ns < b->arrival_ns;
    return a->id < b->id;
}

static bool has_entry(const struct sched *s, const struct sched_req *r) {
    return r->step == s->step && r->entry != NO_ENTRY;
}

static void preempt(struct sched *s, struct sched_req *r, uint64_t now_ns, int64_t *avail) {
    uint32_t held = sched_held_private(s, r);
    /* its unmapped reservation and its mapped private pages both come back */
    *avail += r->pages_reserved > held ? r->pages_reserved : held;
    s->preempted[s->plan.n_preempted++] = (struct sched_preempt){
        .id = r->id, .slot = r->slot, .mode = s->cfg.preempt_mode, .n_computed = r->n_computed};
    sched_unslot(s, r, false, now_ns);
    r->n_preempted++;
    r->step = s->step; /* not readmitted in this step */
    r->entry = NO_ENTRY;
    /* recompute: the generated tokens become part of the prefill */
    r->cached_tokens = 0; /* [TAG_SCHED_PFX] the engine could look the prefix up again */
    r->draft_want = 0;
    r->prefix_pages = 0;
    r->n_target = r->prompt_len + r->n_gen;
    r->n_computed = 0;
    sched_enqueue(s, r, now_ns);
    s->st.preemptions_total++;
}

static void add_entry(struct sched *s, struct sched_req *r, uint32_t n, bool decode) {
    uint32_t i = s->plan.n_entries++;
    s->entries[i] = (struct sched_entry){
        .id = r->id,
        .slot = r->slot,
        .pos0 = r->n_computed,
        .n_tokens = n,
        .is_decode = decode,
        .want_logits = decode || r->n_computed + n == r->n_target,
    };
    r->step = s->step;
    r->entry = i;
}

static void plan_decode(struct sched *s, uint64_t now_ns, int64_t *avail) {
    uint32_t n = 0;
    for (uint32_t i = 0; i < s->cfg.max_seqs; i++) {
        struct sched_req *r = s->slots[i];
        if (!r)
            continue;
        uint32_t j = n++;
        for (; j > 0 && run_before(r, s->order[j - 1]); j--)
            s->order[j] = s->order[j - 1];
        s->order[j] = r;
    }
    uint32_t last = n; /* order[0..last) may still run */
    for (uint32_t i = 0; i < last; i++) {
        struct sched_req *r = s->order[i];
        if (!sched_req_decoding(r))
            continue;
        uint32_t pages = sched_pages_for(s, (uint64_t)r->n_computed + 1);
        pages = pages > r->prefix_pages ? pages - r->prefix_pages : 0;
        uint32_t need = pages > r->pages_reserved ? pages - r->pages_reserved : 0;
        while (need > 0 && *avail < need && last > i)
            preempt(s, s->order[--last], now_ns, avail);
        if (last == i)
            break; /* r itself was the victim: nothing after it runs either */
        r->pages_reserved += need;
        *avail -= need;
        add_entry(s, r, 1, true);
        s->plan.n_decode_tokens++;
    }
}

/* Whether tenant t is first in the admission line (or the line is empty).
 * A tenant whose head is held (sched_set_held) does not count: it cannot
 * admit now, so its ticket, if an earlier head took one, blocks nobody. */
static bool line_first(const struct sched *s, const struct sched_tenant *t) {
    uint64_t mine = t->line ? t->line : UINT64_MAX;
    for (uint32_t i = 0; i < s->n_tenants; i++) {
        const struct sched_tenant *o = &s->tenants[i];
        if (o->line && o->line < mine && !(o->n_wait && o->heap[0]->held))
            return false;
    }
    return true;
}

/* Admit tenant ti's first waiting request, if the tenant is first in line
 * and a slot and the pages are there; else put the tenant in line. */
static struct sched_req *try_admit(struct sched *s, uint32_t ti, uint64_t now_ns, int64_t *avail,
                                   uint32_t *n_pf) {
    struct sched_tenant *t = &s->tenants[ti];
    struct sched_req *r = t->n_wait ? t->heap[0] : NULL;
    if (!r || r->step == s->step || r->held)
        return NULL; /* nothing waiting, preempted in this very step, or held back (it
                      * takes no ticket, and line_first() passes over a ticket an
                      * earlier head took: it blocks no other tenant) */
    if (!line_first(s, t) || s->n_running == s->cfg.max_seqs || (int64_t)r->need_pages > *avail) {
        if (!t->line)
            t->line = ++s->line_ticket;
        return NULL;
    }
    t->line = 0;
    sched_dequeue(s, r);
    uint32_t slot = 0;
    while (s->slots[slot])
        slot++;
    r->state = SCHED_REQ_RUNNING;
    r->slot = slot;
    s->slots[slot] = r;
    s->n_running++;
    t->n_running++;
    r->pages_reserved = r->need_pages;
    *avail -= r->need_pages;
    r->prefix_pages = r->cached_tokens / s->cfg.tokens_per_page;
    r->n_computed = r->cached_tokens;
    r->entry = NO_ENTRY;
    uint64_t wait = now_ns > r->wait_since_ns ? now_ns - r->wait_since_ns : 0;
    r->queue_ns += wait;
    if (wait > s->st.queue_wait_max_ns)
        s->st.queue_wait_max_ns = wait;
    r->admit_seq = ++s->admit_seq;
    s->st.admitted_total++;
    s->admitted[s->plan.n_admitted++] =
        (struct sched_admit){.id = r->id, .slot = slot, .cached_tokens = r->cached_tokens};
    s->pf[(*n_pf)++] = r;
    return r;
}

/* Prefill tokens r still lacks beyond what this step already plans. */
static uint32_t pf_left(const struct sched *s, const struct sched_req *r) {
    uint32_t planned = has_entry(s, r) ? s->entries[r->entry].n_tokens : 0;
    return r->n_target - r->n_computed - planned;
}

/* The first partially prefilled sequence of tenant ti that can take more
 * tokens this step: its entry can grow, or it has none and one fits. */
static struct sched_req *pf_pick(const struct sched *s, uint32_t ti, uint32_t n_pf,
                                 uint32_t chunk_cap) {
    bool full = s->plan.n_entries == s->cfg.max_seqs;
    for (uint32_t i = 0; i < n_pf; i++) {
        struct sched_req *r = s->pf[i];
        if (r->tenant != ti || pf_left(s, r) == 0)
            continue;
        if (has_entry(s, r) ? s->entries[r->entry].n_tokens < chunk_cap : !full)
            return r;
    }
    return NULL;
}

enum turn_end { TURN_SPENT, TURN_IDLE };

/* One DRR turn of tenant ti: serve up to its deficit. */
static enum turn_end serve(struct sched *s, uint32_t ti, uint64_t now_ns, int64_t *avail,
                           uint32_t *budget, uint32_t *n_pf) {
    struct sched_tenant *t = &s->tenants[ti];
    uint32_t cap = s->cfg.max_chunk_tokens ? s->cfg.max_chunk_tokens : UINT32_MAX;
    while (t->deficit > 0 && *budget > 0) {
        struct sched_req *r = pf_pick(s, ti, *n_pf, cap);
        if (!r && s->plan.n_entries < s->cfg.max_seqs)
            r = try_admit(s, ti, now_ns, avail, n_pf);
        if (!r)
            return TURN_IDLE; /* (or no room for another entry: the same for this step) */
        uint32_t have = has_entry(s, r) ? s->entries[r->entry].n_tokens : 0;
        uint64_t n = pf_left(s, r);
        if (n > (uint64_t)t->deficit)
            n = (uint64_t)t->deficit;
        if (n > *budget)
            n = *budget;
        if (n > cap - have)
            n = cap - have;
        assert(n > 0);
        if (have) {
            struct sched_entry *e = &s->entries[r->entry];
            e->n_tokens += (uint32_t)n;
            e->want_logits = r->n_computed + e->n_tokens == r->n_target;
        } else {
            add_entry(s, r, (uint32_t)n, false);
        }
        t->deficit -= (int64_t)n;
        *budget -= (uint32_t)n;
        s->plan.n_prefill_tokens += (uint32_t)n;
    }
    return TURN_SPENT;
}

static void plan_prefill(struct sched *s, uint64_t now_ns, int64_t *avail, uint32_t budget) {
    uint32_t n_pf = 0;
    for (uint32_t i = 0; i < s->cfg.max_seqs; i++) {
        struct sched_req *r = s->slots[i];
        if (!r || sched_req_decoding(r))
            continue;
        uint32_t j = n_pf++;
        for (; j > 0 && r->admit_seq < s->pf[j - 1]->admit_seq; j--)
            s->pf[j] = s->pf[j - 1];
        s->pf[j] = r;
    }
    uint32_t idle = 0;
    while (budget > 0 && idle < s->n_tenants) {
        if (s->drr_next >= s->n_tenants)
            s->drr_next = 0;
        struct sched_tenant *t = &s->tenants[s->drr_next];
        if (!s->drr_credited) {
            t->deficit += (int64_t)t->weight * s->cfg.quantum_tokens;
            s->drr_credited = true;
        }
        uint32_t before = budget;
        enum turn_end end = serve(s, s->drr_next, now_ns, avail, &budget, &n_pf);
        idle = budget < before ? 0 : idle + 1;
        if (end == TURN_SPENT && t->deficit > 0)
            break; /* budget ran out mid-turn: resume next step */
        if (end == TURN_IDLE)
            t->deficit = 0; /* no work left: DRR resets an emptied queue */
        s->drr_next++;
        s->drr_credited = false;
    }
}

/* Phase 3: append the offered drafts to decode entries (see the top). */
static void plan_drafts(struct sched *s, int64_t *avail, uint32_t budget) {
    uint32_t tpp = s->cfg.tokens_per_page;
    for (uint32_t i = 0; i < s->plan.n_entries && budget > 0; i++) {
        struct sched_entry *e = &s->entries[i];
        struct sched_req *r = s->slots[e->slot];
        if (!e->is_decode || !r || r->draft_want == 0)
            continue;
        /* the entry commits 1 + accepted tokens: keep them within the limits
         * (a live request has n_gen < max_tokens and len < ctx_eff) */
        uint64_t len = (uint64_t)r->prompt_len + r->n_gen;
        uint64_t left_gen = r->max_tokens == UINT32_MAX ? UINT64_MAX : r->max_tokens - r->n_gen;
        uint64_t left_ctx = s->ctx_eff > len ? s->ctx_eff - len : 1;
        uint64_t most = (left_gen < left_ctx ? left_gen : left_ctx) - 1;
        uint64_t k = r->draft_want < budget ? r->draft_want : budget;
        k = most < k ? most : k;
        /* pages: the reservation, plus what avail holds, no more */
        uint64_t can = (uint64_t)r->pages_reserved + r->prefix_pages + (*avail > 0 ? *avail : 0);
        uint64_t room = can * tpp > (uint64_t)e->pos0 + 1 ? can * tpp - e->pos0 - 1 : 0;
        k = room < k ? room : k;
        if (k == 0)
            continue;
        uint32_t pages = sched_pages_for(s, (uint64_t)e->pos0 + 1 + k);
        pages = pages > r->prefix_pages ? pages - r->prefix_pages : 0;
        uint32_t need = pages > r->pages_reserved ? pages - r->pages_reserved : 0;
        assert((int64_t)need <= *avail || need == 0);
        r->pages_reserved += need;
        *avail -= need;
        e->n_tokens += (uint32_t)k;
        e->n_draft = (uint32_t)k;
        budget -= (uint32_t)k;
        s->plan.n_draft_tokens += (uint32_t)k;
    }
    for (uint32_t i = 0; i < s->cfg.max_seqs; i++)
        if (s->slots[i])
            s->slots[i]->draft_want = 0; /* an offer holds for one plan */
}

int sched_plan(struct sched *s, uint64_t now_ns, struct sched_plan *out) {
    if (s->plan_out)
        return -EBUSY;
    s->step++;
    memset(&s->plan, 0, sizeof(s->plan));
    s->plan.entries = s->entries;
    s->plan.preempted = s->preempted;
    s->plan.admitted = s->admitted;
    int64_t avail = sched_avail(s);
    plan_decode(s, now_ns, &avail);
    plan_prefill(s, now_ns, &avail, s->cfg.max_batched_tokens - s->plan.n_decode_tokens);
    plan_drafts(s, &avail,
                s->cfg.max_batched_tokens - s->plan.n_decode_tokens - s->plan.n_prefill_tokens);
    s->plan.n_tokens = s->plan.n_decode_tokens + s->plan.n_prefill_tokens + s->plan.n_draft_tokens;
    assert(s->plan.n_tokens <= s->cfg.max_batched_tokens);
    assert(s->plan.n_entries <= s->cfg.max_seqs);
    if (s->plan.n_entries) {
        s->plan_out = true;
        s->st.steps_total++;
    }
    *out = s->plan;
    return 0;
}
