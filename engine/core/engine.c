/* engine.c - the serving engine behind include/llmd.h: the scheduler's plan
 * run as one batched forward pass per step over vmm-paged KV.
 *
 * Each step (llmd_engine_step): sched_plan -> release preempted ranges,
 * acquire ranges for admitted requests -> grow every entry's range to cover
 * its tokens -> model_forward_batch over the flattened tokens -> sample each
 * entry that wants logits with the request's own sampler -> sched_complete
 * -> on_token callbacks; finished requests release their range in the same
 * step. The scheduler's page guarantee (docs/scheduler.md) means a grow
 * never finds the pool empty; if one fails anyway (a bug, or the backend
 * failing), the engine finishes every live request with LLMD_FINISH_ERROR
 * and refuses further steps rather than produce a wrong token.
 *
 * Scheduler slots are not vmm ranges: slot_range[] maps one to the other.
 *
 * Map-ahead (kv.h): after each step the engine posts each decoding
 * sequence's next page (and one spare) to the map-ahead thread, so the next
 * steps' grows find their pages mapped. The scheduler counts pages through
 * kv (pages by need; pages mapped ahead count as free and kv takes them back
 * when a grow needs them), so its admissions and preemptions are the same
 * with map-ahead on or off. A step in which some decode token's grow had to
 * map a page itself counts in decode_map_waits_total.
 *
 * Speculative decoding (docs/engine.md): before the plan, each decoding
 * request that speculates drafts up to its k tokens by prompt lookup
 * (spec.h) and offers them to the scheduler (sched_draft_set), which
 * appends what fits to its decode entry. The step computes the logits of
 * all 1 + n_draft positions; the request's sampler verifies the draft
 * token by token (smp_verify: the argmax when greedy, else the token the
 * sampler draws, with the draw it would spend without speculation, the
 * draft accepted when it is that token) and commits the accepted prefix
 * plus the model's own next token. After sched_complete the sequence is
 * trimmed back to its committed tokens (kv_seq_trim), so the KV of
 * rejected positions holds no page and no full page with an uncommitted
 * token is ever inserted into the prefix cache (pages are inserted up to
 * the committed positions only).
 *
 * With a draft model (spec_draft.h) the request only offers a length
 * before the plan; after the batch's pages are reserved the draft runs
 * every entry's unseen committed tokens and drafts the speculating ones'
 * tokens into the batch (eng_draft_run); a step in which nothing drafts
 * or prefills skips the draft, which catches up when it next runs. Its KV
 * lives in the same pages, after the target's in each token's slot (kv.h
 * draft_hp), so the trim above and the prefix cache cover it; pages enter
 * the cache only up to the positions both models hold (d_comp).
 */
#include "llmd.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/model/kv.h"
#include "engine/model/model.h"
#include "engine/model/model_forward.h"
#include "engine/model/model_fp.h"
#include "engine/core/engine_test.h"
#include "engine/core/kvev.h"
#include "engine/core/pfx.h"
#include "engine/core/sched.h"
#include "engine/core/spec.h"
#include "engine/core/spec_draft.h"
#include "engine/model/smp.h"
#include "engine/model/tok.h"
#include "kernels/kern.h"
#include "log.h"
#include "mem.h"
#include "offload/ofl.h"
#include "vmm/vmm.h"
#include "vmm/vmm_cuda_util.h"

#define ENG_NONE        UINT32_MAX
#define ENG_PIECE_BYTES 256 /* text of one sampled token (a token's bytes + a held UTF-8 tail) */

struct eng_req {
    uint64_t id;
    int32_t *prompt; /* [n_prompt], owned */
    uint32_t n_prompt;
    struct smp *smp;
    struct tok_stream ts;
    llmd_token_fn on_token;
    void *user;
    uint32_t slot; /* scheduler slot while running, else ENG_NONE */
    uint32_t tenant;
    uint32_t max_tokens; /* the request's; 0: up to the context */
    uint32_t n_shared;   /* prefix pages shared at the last admission */
    /* prefix cache: chain[i] is the hash of full prompt page i; hits[] are
     * the cached pages found at submission, pinned until admission shares
     * them; pages [0, n_inserted) are in the cache (shared or inserted) */
    struct pfx_hash *chain;
    uint32_t n_chain;
    uint32_t *hits;
    uint32_t n_hits;
    bool pinned;
    uint32_t n_inserted;
    uint64_t lookup_gen; /* e->insert_gen at the last lookup */
    uint8_t *ns;         /* [n_ns] prefix-cache namespace bytes, owned */
    uint32_t n_ns;
    uint32_t chain_cap;       /* entries chain[] and hits[] can hold */
    uint32_t n_restored;      /* pages this request's lookups restored from a tier (all lookups) */
    bool purged;              /* its tenant was purged while it lived: it adds no page to the
                               * cache (what it computes after the purge stays private) */
    struct llmd_usage *usage; /* the caller's, or NULL */
    uint64_t submit_ns;       /* CLOCK_MONOTONIC at llmd_submit(), for usage->queue_ns */
    bool spec;                /* speculates (the engine's spec, not turned off for it) */
    int32_t *draft;           /* [spec_tokens] this step's draft, owned; NULL: no spec */
    uint32_t n_draft;         /* tokens in draft[] offered for this step */
    struct spec_len len;      /* its drafts' acceptance, for their length */
    uint32_t d_comp;          /* with a draft model: positions [0, d_comp) of its range
                               * hold the draft's KV (set at admission, then each step) */
    uint32_t d_spare;         /* this step's spare catch-up tokens (spec_catch_up_plan), for
                               * a decode that drafts nothing; eng_draft_run consumes it */
    struct llmd_logprobs *lp; /* the caller's (llmd_request.logprobs), or NULL */
    uint32_t n_top;           /* alternatives in lp->top[] */
    uint32_t lp_row;          /* this step's events so far: the logits row of the next */
    llmd_prompt_fn on_prompt; /* the prompt's logprobs; NULL: none (and the prefix cache) */
    uint32_t echo_next;       /* on_prompt: the next prompt position to report */
    uint32_t lg_skip;         /* this step: logits rows before the sampling row (echo) */
    bool prompt_only;         /* its one token is not returned: the finish alone */
    uint64_t seq;             /* submission order (sched ids are handles: not ordered) */
    int32_t priority;         /* as asked */
    struct eng_req *hold;     /* held back from admission until this live request has put the
                               * prompt page it misses next in the cache; NULL: not held */
    struct eng_req *prev, *next;
};

struct llmd_engine {
    struct model *m;
    struct kern_pool *pool;
    struct kv_cache *kv;
    struct model_ctx *ctx;
    struct sched *s;
    struct pfx *pfx;                     /* NULL when the prefix cache is off */
    struct ofl *ofl;                     /* tiers below the device; NULL when none */
    struct kvev *kvev;                   /* KV-cache event publisher; NULL when none */
    uint64_t window_dropped_pages_total; /* pages a sliding window let go (eng_window_drop) */
    int32_t *kvev_tok;                   /* [tpp] one page's tokens, for its store event */
    uint8_t model_fp[MODEL_FP_BYTES];
    uint64_t restored_tokens_total;
    double prefill_tok_s; /* moving average over prefill-heavy steps */
    uint32_t tpp;         /* tokens per KV page */
    uint32_t n_pinned;    /* pins held for waiting requests' hits */
    uint64_t insert_gen;  /* bumped when pages enter the prefix cache */
    uint64_t prefix_hit_tokens_total;
    uint64_t prefix_query_tokens_total; /* llmd_stats.prefix_query_tokens_total */
    uint32_t max_seqs, max_batched, n_ctx;
    struct llmd_engine_info info; /* filled at open; llmd_engine_info_get() */
    bool broken;                  /* a step failed: no further steps */
    /* inside an on_token call: submit, cancel and step refuse (-EBUSY). A
     * callback that cancelled a request whose event comes later in the same
     * step left step_req[] pointing at a freed record, and a nested step
     * overwrote the scheduler's event array under the outer loop */
    bool in_callback;

    uint32_t *slot_range;      /* [max_seqs] vmm range of a slot, or ENG_NONE */
    struct eng_req **slot_req; /* [max_seqs] */
    struct eng_req *reqs;      /* every live request, queued or running */
    uint32_t n_reqs;
    uint64_t submit_seq;           /* eng_req.seq of the last submission */
    uint32_t n_held;               /* requests with a hold */
    int32_t *tok_buf;              /* [max_batched] the step's tokens */
    float *logits;                 /* [n_rows][n_vocab]: one row per logit position */
    struct model_batch_seq *batch; /* [max_seqs] */
    struct sched_result *results;  /* [max_seqs] */
    struct eng_req **step_req;     /* [max_seqs] request of each entry */
    char *pieces;                  /* [n_rows][ENG_PIECE_BYTES]: one per committed token */
    uint64_t prompt_tokens_total, generated_tokens_total;
    uint64_t decode_map_waits_total; /* steps where a decode token's grow mapped a page */
    /* speculative decoding */
    enum llmd_spec spec;
    uint32_t spec_tokens;               /* the longest draft; 0: off */
    struct spec_ngram_config ngram;     /* the drafter's match lengths */
    uint32_t n_rows;                    /* rows of logits[] and pieces[] */
    uint32_t *row0;                     /* [max_seqs] first row of logits/pieces of entry i */
    int32_t *acc;                       /* [max_seqs][spec_tokens] accepted draft tokens */
    const char **acc_piece;             /* [max_seqs][spec_tokens] their text */
    size_t *acc_bytes;                  /* [max_seqs][spec_tokens] */
    struct tok_stream *ts_at;           /* [max_seqs][spec_tokens + 2] the detokenizer before
                                         * entry i's run ([0]) and after each of its tokens */
    uint32_t *ev_k;                     /* [max_seqs] entry i's tokens emitted this step */
    uint32_t *kv_end;                   /* [max_seqs] committed KV positions of entry i's seq */
    uint64_t spec_rollback_pages_total; /* pages only rejected draft positions had filled */
    bool spec_fixed_len;                /* drafts as long as found: no policy */
    struct spec_cost cost;              /* a step's time: fixed + per token, measured */
    struct spec_prior spec_prior;       /* every request's recent acceptance: the prior */
    struct spec_fit fit;                /* the forward pass's cost, fitted online */
    bool fit_on;                        /* the probe ran: fit holds its prior */
    double step_overhead_ns;            /* moving average: a step's time outside the forward */
    uint32_t last_prefill_tokens;       /* the last plan's, predicting this step's */
    double *spec_alpha;                 /* [max_seqs] scratch of eng_spec_offer */
    uint32_t *spec_kmax, *spec_k;       /* [max_seqs] */
    uint32_t *spec_lag;                 /* [max_seqs] tokens each one's draft has to catch up */
    uint32_t *spec_spare;               /* [max_seqs] with a draft: spec_catch_up_plan's */
    bool test_spare;                    /* eng_test_force_spare is on */
    uint32_t test_spare_rng;            /* its generator's state */
    uint64_t spare_tokens;              /* spare catch-up tokens run (eng_test_spare_tokens) */
    struct eng_req **spec_req;          /* [max_seqs] */
    struct spec_draft *draft;           /* LLMD_SPEC_DRAFT: the draft model; else NULL */
    int32_t *dtok;                      /* [max_batched + max_seqs] its first pass's tokens */
    struct spec_draft_seq *dseq;        /* [max_seqs] */
    uint64_t draft_ns;                  /* the last step's draft passes, ns */
    bool draft_ran;                     /* the draft ran this step (else it lags) */
    float *echo_logits; /* [max_batched][n_vocab]: the prompt rows on_prompt asks for;
                         * allocated at the first such request */
};

static uint64_t eng_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* --- the pool as the scheduler sees it ------------------------------------ */

static uint32_t eng_free_pages(void *ctx) {
    struct llmd_engine *e = ctx;
    return kv_pages_free(e->kv, NULL); /* pages mapped ahead included: kv takes them back */
}

static uint32_t eng_evictable_pages(void *ctx) {
    struct llmd_engine *e = ctx;
    struct vmm_stats st;
    vmm_stats_get(e->kv->vmm, &st);
    /* pinned pages cannot be evicted; some may be mapped (not CACHED), so
     * this undercounts: safe, the scheduler only waits a little longer */
    return st.pages_cached > e->n_pinned ? (uint32_t)st.pages_cached - e->n_pinned : 0;
}

static uint32_t eng_seq_pages(void *ctx, uint32_t slot) {
    struct llmd_engine *e = ctx;
    if (slot >= e->max_seqs || e->slot_range[slot] == ENG_NONE)
        return 0;
    return kv_seq_pages(e->kv, e->slot_range[slot]); /* by need: not those mapped ahead */
}

static const struct sched_page_ops eng_page_ops = {
    .free_pages = eng_free_pages,
    .evictable_pages = eng_evictable_pages,
    .seq_pages = eng_seq_pages,
};

/* --- requests ------------------------------------------------------------- */

/* Drop the pins a request holds on its prefix hits. */
static void eng_req_unpin(struct llmd_engine *e, struct eng_req *r) {
    if (!r->pinned)
        return;
    for (uint32_t i = 0; i < r->n_hits; i++)
        vmm_page_unpin(e->kv->vmm, r->hits[i]);
    e->n_pinned -= r->n_hits;
    r->pinned = false;
}

static void eng_hold_release(struct llmd_engine *e, struct eng_req *r);

static void eng_req_free(struct llmd_engine *e, struct eng_req *r) {
    eng_req_unpin(e, r);
    if (r->hold)
        eng_hold_release(e, r);
    for (struct eng_req *h = e->reqs; e->n_held && h; h = h->next)
        if (h->hold == r) /* it leaves: whoever waited for its pages goes its own way */
            eng_hold_release(e, h);
    mem_free(r->draft);
    mem_free(r->ns);
    mem_free(r->chain);
    mem_free(r->hits);
    if (r->prev)
        r->prev->next = r->next;
    else if (e->reqs == r)
        e->reqs = r->next;
    if (r->next)
        r->next->prev = r->prev;
    e->n_reqs--;
    smp_destroy(r->smp);
    mem_free(r->prompt);
    mem_free(r);
}

static struct eng_req *eng_req_find(struct llmd_engine *e, uint64_t id) {
    for (struct eng_req *r = e->reqs; r; r = r->next)
        if (r->id == id)
            return r;
    return NULL;
}

/* Give the range of `slot` back to the pool. */
static void eng_slot_release(struct llmd_engine *e, uint32_t slot) {
    if (slot >= e->max_seqs || e->slot_range[slot] == ENG_NONE)
        return;
    kv_seq_close(e->kv, e->slot_range[slot]);
    e->slot_range[slot] = ENG_NONE;
    if (e->slot_req[slot])
        e->slot_req[slot]->slot = ENG_NONE;
    e->slot_req[slot] = NULL;
}

/* Every on_token call goes through here, so re-entry is caught. */
static void eng_emit(struct llmd_engine *e, struct eng_req *r, int32_t token, const char *text,
                     size_t len, enum llmd_finish f) {
    e->in_callback = true;
    r->on_token(r->user, r->id, token, text, len, f);
    e->in_callback = false;
}

/* Emit a returned token's event: the k-th of entry i's tokens this step.
 * An answer that ends (length, EOS or a stop id, the context or the KV
 * budget) inside a UTF-8 character ends with U+FFFD for the bytes the
 * detokenizer held back at its end -- after the last returned token: after
 * this one, or before it when it is an EOS or a stop id, whose text is not
 * returned (a speculative run's later tokens were detokenized too, hence
 * the states saved per token) -- as llmd generate prints it without the
 * engine and llama.cpp's and vLLM's servers return it. After a stop string
 * those bytes lie past the stop and go with it; a cancelled or failed
 * request ends with no text. */
static void eng_emit_token(struct llmd_engine *e, struct eng_req *r, uint32_t i,
                           const struct sched_event *ev, enum llmd_finish f) {
    uint32_t k = e->ev_k[i]++;
    char fin[SCHED_STOP_MAX_BYTES + ENG_PIECE_BYTES + 4];
    size_t nf = 0;
    if ((f == LLMD_FINISH_LENGTH || f == LLMD_FINISH_EOS || f == LLMD_FINISH_CONTEXT ||
         f == LLMD_FINISH_KV_BUDGET) &&
        !NEVER(k > e->spec_tokens) && !NEVER(ev->text_bytes + 3 > sizeof(fin))) {
        /* an EOS or a stop id is not returned: the state before it */
        struct tok_stream ts =
            e->ts_at[(size_t)i * (e->spec_tokens + 2) + k + (f == LLMD_FINISH_EOS ? 0 : 1)];
        if (tok_stream_flush(&ts, fin + ev->text_bytes, 3, &nf) == 0 && nf) {
            memcpy(fin, ev->text, ev->text_bytes);
            eng_emit(e, r, ev->token, fin, ev->text_bytes + nf, f);
            return;
        }
    }
    eng_emit(e, r, ev->token, ev->text, ev->text_bytes, f);
}

static enum llmd_finish eng_finish(enum sched_finish f) {
    switch (f) {
    case SCHED_FINISH_NONE:
        return LLMD_FINISH_NONE;
    case SCHED_FINISH_LENGTH:
        return LLMD_FINISH_LENGTH;
    case SCHED_FINISH_STOP:
        return LLMD_FINISH_STOP;
    case SCHED_FINISH_EOS:
        return LLMD_FINISH_EOS;
    case SCHED_FINISH_CONTEXT:
        return LLMD_FINISH_CONTEXT;
    case SCHED_FINISH_KV_BUDGET:
        return LLMD_FINISH_KV_BUDGET;
    case SCHED_FINISH_CANCELLED:
        return LLMD_FINISH_CANCELLED;
    default:
        return LLMD_FINISH_ERROR;
    }
}

/* --- open / close --------------------------------------------------------- */

static int eng_err(char *errbuf, size_t errlen, int rc, const char *what) {
    if (errbuf && errlen)
        snprintf(errbuf, errlen, "%s", what);
    return rc;
}

static int eng_alloc_tables(struct llmd_engine *e) {
    uint32_t n = e->max_seqs, k = e->spec_tokens;
    /* a row of logits (and a piece) per position that wants one: each
     * entry's last token, and each draft token, at most max_batched */
    uint64_t rows = (uint64_t)n * (1 + k);
    e->n_rows = rows < e->max_batched ? (uint32_t)rows : e->max_batched;
    e->n_rows = e->n_rows < n ? n : e->n_rows;
    e->slot_range = mem_alloc(MEM_SCHED, n * sizeof(*e->slot_range));
    e->slot_req = mem_calloc(MEM_SCHED, n, sizeof(*e->slot_req));
    e->tok_buf = mem_alloc(MEM_SCHED, e->max_batched * sizeof(*e->tok_buf));
    e->logits = mem_alloc(MEM_SCHED, (size_t)e->n_rows * e->m->hp.n_vocab * sizeof(float));
    e->batch = mem_alloc(MEM_SCHED, n * sizeof(*e->batch));
    e->results = mem_alloc(MEM_SCHED, n * sizeof(*e->results));
    e->step_req = mem_alloc(MEM_SCHED, n * sizeof(*e->step_req));
    e->pieces = mem_alloc(MEM_SCHED, (size_t)e->n_rows * ENG_PIECE_BYTES);
    e->row0 = mem_alloc(MEM_SCHED, n * sizeof(*e->row0));
    e->kv_end = mem_alloc(MEM_SCHED, n * sizeof(*e->kv_end));
    size_t nk = (size_t)n * (k ? k : 1);
    e->acc = mem_alloc(MEM_SCHED, nk * sizeof(*e->acc));
    e->acc_piece = mem_alloc(MEM_SCHED, nk * sizeof(*e->acc_piece));
    e->acc_bytes = mem_alloc(MEM_SCHED, nk * sizeof(*e->acc_bytes));
    e->ts_at = mem_alloc(MEM_SCHED, (size_t)n * (k + 2) * sizeof(*e->ts_at));
    e->ev_k = mem_alloc(MEM_SCHED, n * sizeof(*e->ev_k));
    e->spec_alpha = mem_alloc(MEM_SCHED, n * sizeof(*e->spec_alpha));
    e->spec_kmax = mem_alloc(MEM_SCHED, n * sizeof(*e->spec_kmax));
    e->spec_k = mem_alloc(MEM_SCHED, n * sizeof(*e->spec_k));
    e->spec_req = mem_alloc(MEM_SCHED, n * sizeof(*e->spec_req));
    e->spec_lag = mem_calloc(MEM_SCHED, n, sizeof(*e->spec_lag));
    if (e->draft) {
        e->dtok = mem_alloc(MEM_SCHED, ((size_t)e->max_batched + n) * sizeof(*e->dtok));
        e->dseq = mem_alloc(MEM_SCHED, n * sizeof(*e->dseq));
        e->spec_spare = mem_calloc(MEM_SCHED, n, sizeof(*e->spec_spare));
        if (!e->dtok || !e->dseq || !e->spec_spare)
            return -ENOMEM;
    }
    /* before any failure return: llmd_engine_close() walks slot_range[] */
    for (uint32_t i = 0; e->slot_range && i < n; i++)
        e->slot_range[i] = ENG_NONE;
    if (!e->slot_range || !e->slot_req || !e->tok_buf || !e->logits || !e->batch || !e->results ||
        !e->step_req || !e->pieces || !e->row0 || !e->kv_end || !e->acc || !e->acc_piece ||
        !e->acc_bytes || !e->ts_at || !e->ev_k || !e->spec_alpha || !e->spec_kmax || !e->spec_k ||
        !e->spec_req || !e->spec_lag)
        return -ENOMEM;
    return 0;
}

/* pfx's spill hook: a cold cached page leaves the device for the host tier. */
static void eng_spill(void *ctx, const struct pfx_hash *h, uint32_t page, uint32_t tenant,
                      uint8_t prio) {
    struct llmd_engine *e = ctx;
    if (e->ofl)
        ofl_spill(e->ofl, h->b, page, tenant, prio);
}

/* pfx's removal hook: a block left the device's index. */
static void eng_pfx_removed(void *ctx, const struct pfx_hash *h, uint32_t tenant) {
    struct llmd_engine *e = ctx;
    (void)tenant;
    kvev_removed(e->kvev, KVEV_GPU, h->b);
}

/* ofl's tier hook: the host or NVMe tier took or let go of a block. On the
 * NVMe tier's thread too: e->kvev is set before the tiers exist. */
static void eng_tier_changed(void *ctx, const uint8_t *hash, uint32_t tenant, enum ofl_tier tier,
                             bool held) {
    struct llmd_engine *e = ctx;
    enum kvev_medium m = tier == OFL_TIER_HOST ? KVEV_CPU : KVEV_DISK;
    if (held)
        kvev_stored(e->kvev, m, hash, NULL, NULL, 0, tenant);
    else
        kvev_removed(e->kvev, m, hash);
}

/* The model's fingerprint (weights + KV type: a cached page is only valid
 * for the exact model that wrote it), which the prefix cache and the NVMe
 * tier's index key on. */
static int eng_fingerprint(struct llmd_engine *e, char *errbuf, size_t errlen) {
    /* with a draft model a page holds its KV too: its weights count */
    const struct model *dm = e->draft ? spec_draft_model(e->draft) : NULL;
    uint64_t n_t = gguf_n_tensors(e->m->gguf), n = n_t + (dm ? gguf_n_tensors(dm->gguf) : 0);
    const void **bufs = mem_alloc(MEM_SCHED, n * sizeof(*bufs));
    size_t *lens = mem_alloc(MEM_SCHED, n * sizeof(*lens));
    if (!bufs || !lens) {
        mem_free(bufs);
        mem_free(lens);
        return eng_err(errbuf, errlen, -ENOMEM, "llmd: out of memory");
    }
    for (uint64_t i = 0; i < n; i++) {
        const struct gguf_tensor *t =
            i < n_t ? gguf_tensor_at(e->m->gguf, i) : gguf_tensor_at(dm->gguf, i - n_t);
        bufs[i] = t->data;
        lens[i] = t->bytes;
    }
    model_fingerprint(bufs, lens, n, (uint32_t)e->kv->dtype, e->model_fp);
    mem_free(bufs);
    mem_free(lens);
    /* the hash read every tensor through the mapping: give the packed and
     * copied matrices' pages back again (model_load had) */
    model_release_pages(e->m);
    if (dm)
        model_release_pages(dm);
    return 0;
}

/* The prefix cache's HMAC key: the configured file, else LLMD_PFX_SECRET,
 * else - with an NVMe tier, whose pages are only found again under the same
 * key - the key file beside the tier (made on first use), else a random key
 * for this process. Called with the tiers open: their lock keeps a second
 * process off the tier, so the key file is created by one process only. */
static int eng_pfx_key(struct llmd_engine *e, const struct llmd_engine_config *cfg,
                       uint8_t key[PFX_KEY_BYTES], char *errbuf, size_t errlen) {
    struct ofl_stats os = {0};
    if (e->ofl)
        ofl_stats_get(e->ofl, &os);
    if (cfg->prefix_secret || getenv("LLMD_PFX_SECRET") || !os.nvme) {
        bool random_key = false;
        int rc = pfx_secret_load(cfg->prefix_secret, key, &random_key);
        e->info.prefix_key = cfg->prefix_secret ? "file" : random_key ? "random" : "env";
        if (rc < 0 && errbuf && errlen)
            snprintf(errbuf, errlen, "llmd: prefix-cache secret %s: %s",
                     cfg->prefix_secret ? cfg->prefix_secret : "from LLMD_PFX_SECRET",
                     strerror(-rc));
        return rc;
    }
    char path[4096];
    if (snprintf(path, sizeof path, "%s.key", cfg->nvme_tier_path) >= (int)sizeof path)
        return eng_err(errbuf, errlen, -ENAMETOOLONG, "llmd: the NVMe tier's path is too long");
    bool created = false;
    int rc = pfx_secret_keyfile(path, key, &created);
    e->info.prefix_key = "tier";
    if (rc == 0 && created)
        LOG_INFO("engine",
                 "prefix-cache key: created %s (mode 0600); the NVMe tier's pages are "
                 "found again only with it",
                 path);
    if (rc < 0 && errbuf && errlen)
        snprintf(errbuf, errlen, "llmd: the prefix-cache key file %s (beside the NVMe tier): %s",
                 path,
                 rc == -EPERM    ? "group or others may read it, or it is not a regular file: "
                                   "chmod 600 it (or give --prefix-secret)"
                 : rc == -EINVAL ? "not a key (64 hex digits or 32 raw bytes)"
                                 : strerror(-rc));
    return rc;
}

/* The prefix cache: the HMAC key and the index over the KV pool. */
static int eng_pfx_open(struct llmd_engine *e, const struct llmd_engine_config *cfg, char *errbuf,
                        size_t errlen) {
    struct pfx_config pc = {0};
    int rc = eng_pfx_key(e, cfg, pc.secret, errbuf, errlen);
    if (rc < 0)
        return rc;
    memcpy(pc.model_fp, e->model_fp, sizeof pc.model_fp);
    pc.spill = eng_spill;
    pc.spill_ctx = e;
    if (e->kvev) {
        pc.removed = eng_pfx_removed;
        pc.removed_ctx = e;
    }
    rc = pfx_create(&pc, e->kv->vmm, &e->pfx);
    explicit_bzero(pc.secret, sizeof pc.secret);
    if (rc < 0)
        return eng_err(errbuf, errlen, rc, "llmd: cannot create the prefix cache");
    return 0;
}

/* Prefill rate at start-up, for the spill-vs-recompute policy: one forward
 * pass over a page of tokens in a scratch range (timed the second time, the
 * first warms the caches). Returns tokens per second, 0 when it could not
 * run. */
static double eng_prefill_probe(struct llmd_engine *e) {
    uint32_t n = e->tpp < e->max_batched ? e->tpp : e->max_batched, range;
    if (n == 0 || kv_seq_open(e->kv, &range) < 0)
        return 0;
    double rate = 0;
    if (kv_seq_reserve(e->kv, range, n) == 0) {
        for (uint32_t i = 0; i < n; i++)
            e->tok_buf[i] = (int32_t)(i % e->m->hp.n_vocab);
        struct model_batch_seq b = {.seq = range, .pos0 = 0, .n_tok = n, .tokens = e->tok_buf};
        for (int round = 0; round < 2; round++) {
            uint64_t t0 = eng_now();
            if (model_forward_batch(e->ctx, e->kv, &b, 1) < 0)
                break;
            uint64_t dt = eng_now() - t0;
            rate = 1e9 * n / (double)(dt ? dt : 1);
        }
    }
    kv_seq_close(e->kv, range);
    return rate;
}

/* The draft-length policy's cost model (spec.h): the forward pass of one
 * token and of 1 + K tokens (K = spec_tokens, capped by the step's token
 * budget), each wanting every row of logits as a verification does, at
 * position 32 of a scratch range; the fastest of 6 timed runs of each,
 * interleaved after a warm-up (noise only adds time; interleaving spreads
 * a neighbour's burst over both). token_ns = (t(1+K) - t(1)) / K, fixed_ns =
 * t(1) - token_ns: the prior of the model the steps then fit
 * (spec_fit), plus the step's own overhead, measured on every step
 * (eng_step_time). 13 forward passes of a few tokens at open, only with
 * speculation, and as many of the draft model's (spec_draft_probe). Where
 * it cannot run the policy gets no cost model and drafts nothing. */
static void eng_spec_probe(struct llmd_engine *e) {
    uint32_t pos = 32 < e->n_ctx / 2 ? 32 : e->n_ctx / 2, k = e->spec_tokens, range;
    if (k + 1 > e->max_batched)
        k = e->max_batched - 1;
    if (k + 1 > e->n_rows)
        k = e->n_rows - 1;
    if (pos + k + 1 > e->max_batched) /* tok_buf holds max_batched tokens */
        pos = e->max_batched - k - 1;
    if (k == 0 || pos + k + 1 > e->n_ctx || kv_seq_open(e->kv, &range) < 0)
        return;
    double t[2] = {0, 0};
    if (kv_seq_reserve(e->kv, range, pos + k + 1) == 0) {
        for (uint32_t i = 0; i < pos + k + 1; i++)
            e->tok_buf[i] = (int32_t)((i * 7 + 3) % e->m->hp.n_vocab);
        struct model_batch_seq b = {.seq = range, .n_tok = pos, .tokens = e->tok_buf};
        bool ok = pos == 0 || model_forward_batch(e->ctx, e->kv, &b, 1) == 0;
        for (int round = 0; ok && round < 13; round++) {
            int w = round % 2; /* round 0: the warm-up */
            uint32_t n = w ? k + 1 : 1;
            b = (struct model_batch_seq){.seq = range,
                                         .pos0 = pos,
                                         .n_tok = n,
                                         .tokens = e->tok_buf + pos,
                                         .logits = e->logits,
                                         .n_logits = n};
            uint64_t t0 = eng_now();
            ok = model_forward_batch(e->ctx, e->kv, &b, 1) == 0;
            double dt = (double)(eng_now() - t0);
            if (round > 0 && (t[w] == 0 || dt < t[w]))
                t[w] = dt;
        }
        if (ok && t[0] > 0) {
            e->cost = spec_cost_from_probe(t[0], t[1], k);
            spec_fit_init(&e->fit, &e->cost);
            e->fit_on = true;
        }
        /* the draft's passes, over its slots of the same positions: a
         * failure leaves them unpriced (drafts then look free to make) */
        if (ok && e->draft && spec_draft_probe(e->draft, range, pos, k, e->tok_buf) < 0)
            LOG_WARN("engine", "the draft model's passes could not be timed: its drafts are "
                               "priced as free");
    }
    kv_seq_close(e->kv, range);
}

/* The host tier's pin hooks over a CUDA pool (ofl_host.h). */
static int eng_cuda_pin(void *ctx, void *addr, size_t bytes) {
    return vmm_cuda_host_register(ctx, addr, bytes);
}

static void eng_cuda_unpin(void *ctx, void *addr, size_t bytes) {
    (void)bytes;
    vmm_cuda_host_unregister(ctx, addr);
}

/* The tiers below the device pool. */
static int eng_ofl_open(struct llmd_engine *e, const struct llmd_engine_config *cfg, char *errbuf,
                        size_t errlen) {
    if (cfg->no_prefix_cache)
        return eng_err(errbuf, errlen, -EINVAL,
                       "llmd: offload tiers need the prefix cache (drop --no-prefix-cache)");
    if (!cfg->host_tier_bytes)
        return eng_err(errbuf, errlen, -EINVAL, "llmd: an NVMe tier needs a host tier too");
    e->prefill_tok_s = eng_prefill_probe(e);
    struct ofl_config oc = {
        .vmm = e->kv->vmm,
        .host_bytes = cfg->host_tier_bytes,
        .nvme_path = cfg->nvme_tier_path,
        .nvme_bytes = cfg->nvme_tier_bytes,
        .policy = cfg->offload_always ? OFL_POLICY_ALWAYS : OFL_POLICY_AUTO,
        .prefill_tokens_per_s = e->prefill_tok_s,
        .tier_hook = e->kvev ? eng_tier_changed : NULL,
        .tier_ctx = e,
    };
    memcpy(oc.model_fp, e->model_fp, sizeof oc.model_fp);
    char bus[32];
    if (e->kv->device == KV_DEV_CUDA) {
        /* a GPU pool: the tiers' memory is page-locked by the driver and
         * placed on the GPU's NUMA node */
        oc.pin = eng_cuda_pin;
        oc.unpin = eng_cuda_unpin;
        oc.pin_ctx = vmm_get_backend(e->kv->vmm);
        if (vmm_cuda_pci_bus_id(oc.pin_ctx, bus, sizeof bus) == 0)
            oc.device_pci_bus_id = bus;
    }
    int rc = ofl_create(&oc, &e->ofl, errbuf, errlen);
    if (rc == -ENODEV && oc.device_pci_bus_id) {
        /* hwloc does not see the GPU (a build without PCI discovery, a
         * container): the tier still works, on the caller's node */
        LOG_WARN("engine",
                 "host tier: no NUMA placement near GPU %s (%s); using this thread's node", bus,
                 errbuf && errlen ? errbuf : "hwloc does not see it");
        oc.device_pci_bus_id = NULL;
        if (errbuf && errlen)
            errbuf[0] = '\0';
        rc = ofl_create(&oc, &e->ofl, errbuf, errlen);
    }
    if (rc < 0 && errbuf && errlen && !errbuf[0])
        snprintf(errbuf, errlen, "llmd: offload tiers: %s", strerror(-rc));
    return rc;
}

/* llmd.h's KV types, in its order (LLMD_KV_F16 is 0: a zeroed config), as
 * the model layer's (whose values the fingerprint hashes). */
static const enum kv_dtype eng_kv_types[] = {[LLMD_KV_F16] = KV_F16,
                                             [LLMD_KV_F32] = KV_F32,
                                             [LLMD_KV_Q8_0] = KV_Q8_0,
                                             [LLMD_KV_Q4_0] = KV_Q4_0,
                                             [LLMD_KV_FP8] = KV_FP8};
#define ENG_N_KV_TYPES (sizeof eng_kv_types / sizeof eng_kv_types[0])

static bool eng_kv_type_ok(enum llmd_kv_type t) {
    return (unsigned)t < ENG_N_KV_TYPES;
}

/* Call with a type eng_kv_type_ok() accepts. */
static enum kv_dtype eng_kv_dtype(enum llmd_kv_type t) {
    return eng_kv_types[t];
}

const char *llmd_kv_type_name(enum llmd_kv_type t) {
    return eng_kv_type_ok(t) ? kv_dtype_name(eng_kv_types[t]) : "?";
}

int llmd_kv_type_parse(const char *name, enum llmd_kv_type *out) {
    enum kv_dtype d;
    if (kv_dtype_parse(name, &d) < 0)
        return -EINVAL;
    for (unsigned i = 0; i < ENG_N_KV_TYPES; i++)
        if (eng_kv_types[i] == d) {
            *out = (enum llmd_kv_type)i;
            return 0;
        }
    return -EINVAL;
}

int llmd_device_check(enum llmd_device device, int index, char *errbuf, size_t errlen) {
    if (device == LLMD_DEVICE_CPU)
        return 0;
    if (device != LLMD_DEVICE_CUDA)
        return eng_err(errbuf, errlen, -EINVAL, "llmd: unknown device");
    if (index < 0) {
        if (errbuf && errlen)
            snprintf(errbuf, errlen, "llmd: --device cuda:%d: no such device", index);
        return -EINVAL;
    }
    struct vmm_backend *b = NULL;
    int rc = vmm_cuda_backend_create(index, &b);
    if (rc == 0) {
        b->ops->destroy(b);
        return 0;
    }
    if (errbuf && errlen)
        snprintf(errbuf, errlen, "llmd: --device cuda:%d: %s", index,
                 rc == -ENOTSUP  ? vmm_cuda_why_unavailable()
                 : rc == -EINVAL ? "no such device"
                                 : strerror(-rc));
    return rc;
}

/* Speculative decoding's settings. The drafter matches suffixes of 1 to 4
 * tokens: a 4-token match in a RAG answer is nearly always a quote, and a
 * longer one adds little (vLLM's and llama.cpp's prompt lookup use the
 * same range). */
static int eng_spec_config(struct llmd_engine *e, const struct llmd_engine_config *cfg,
                           char *errbuf, size_t errlen) {
    if (cfg->spec != LLMD_SPEC_NONE && cfg->spec != LLMD_SPEC_NGRAM && cfg->spec != LLMD_SPEC_DRAFT)
        return eng_err(errbuf, errlen, -EINVAL, "llmd: unknown speculative decoding method");
    if (cfg->spec == LLMD_SPEC_DRAFT && !cfg->spec_model_path)
        return eng_err(errbuf, errlen, -EINVAL, "llmd: --spec draft needs --spec-model PATH");
    if (cfg->spec != LLMD_SPEC_DRAFT && cfg->spec_model_path)
        return eng_err(errbuf, errlen, -EINVAL, "llmd: --spec-model needs --spec draft");
    if (cfg->spec == LLMD_SPEC_DRAFT && cfg->device != LLMD_DEVICE_CPU)
        return eng_err(errbuf, errlen, -ENOTSUP,
                       "llmd: --spec draft runs on the CPU only (use --spec ngram with --device "
                       "cuda)");
    if (cfg->spec_tokens > LLMD_SPEC_TOKENS_MAX) {
        if (errbuf && errlen)
            snprintf(errbuf, errlen, "llmd: spec_tokens %u is more than the %d a draft may have",
                     cfg->spec_tokens, LLMD_SPEC_TOKENS_MAX);
        return -EINVAL;
    }
    _Static_assert(LLMD_SPEC_TOKENS_MAX <= SCHED_DRAFT_MAX, "a draft must fit an entry");
    e->spec = cfg->spec;
    e->spec_tokens = cfg->spec == LLMD_SPEC_NONE ? 0 : cfg->spec_tokens ? cfg->spec_tokens : 8;
    e->ngram = (struct spec_ngram_config){.n_min = 1, .n_max = 4};
    e->spec_fixed_len = cfg->spec_fixed_len != 0;
    return 0;
}

/* What the engine runs with, once open: every 0 of cfg resolved. */
static void eng_info_fill(struct llmd_engine *e, const struct llmd_engine_config *cfg) {
    struct llmd_engine_info *in = &e->info;
    in->n_ctx = e->n_ctx;
    in->max_seq_tokens = sched_max_seq_tokens(e->s);
    in->max_seqs = e->max_seqs;
    in->max_batched_tokens = e->max_batched;
    in->max_chunk_tokens = cfg->max_chunk_tokens;
    in->tokens_per_page = e->tpp;
    in->page_bytes = vmm_page_bytes(e->kv->vmm);
    in->kv_pages = vmm_n_pages(e->kv->vmm);
    in->kv_budget_bytes = in->kv_pages * in->page_bytes;
    in->max_queue_wait_ns = cfg->max_queue_wait_ns;
    in->n_vocab = e->m->hp.n_vocab;
    in->n_ctx_train = e->m->hp.n_ctx_train;
    in->model_name = e->m->name;
    in->n_layer = e->m->hp.n_layer;
    in->n_embd = e->m->hp.n_embd;
    in->n_head = e->m->hp.n_head;
    in->n_head_kv = e->m->hp.n_head_kv;
    in->weight_bytes = e->m->weight_bytes;
    in->packed_bytes = e->m->packed_bytes;
    in->copied_bytes = e->m->copied_bytes;
    in->weight_types = e->m->wtypes;
    in->n_threads = kern_pool_n_threads(e->pool);
    in->kv_type = cfg->kv_type;
    in->sliding_window = e->m->hp.n_swa;
    in->kv_token_bytes = e->kv->stride_bytes;
    in->device = cfg->device;
    in->device_index = cfg->device == LLMD_DEVICE_CUDA ? cfg->device_index : 0;
    in->prefix_cache = e->pfx != NULL;
    in->map_ahead = !cfg->no_map_ahead;
    in->offload_always = e->ofl && cfg->offload_always;
    in->spec = e->spec;
    in->spec_tokens = e->spec_tokens;
    in->spec_model = e->draft ? spec_draft_name(e->draft) : NULL;
    in->kv_draft_token_bytes = e->kv->draft_bytes;
    in->spec_step_fixed_ns = (uint64_t)e->cost.fixed_ns;
    in->spec_step_token_ns = (uint64_t)e->cost.token_ns;
    if (!e->pfx)
        in->prefix_key = "none";
    if (e->ofl) {
        struct ofl_stats os;
        ofl_stats_get(e->ofl, &os);
        in->host_tier_bytes = os.host_bytes;
        in->nvme_tier_bytes = !os.nvme               ? 0
                              : cfg->nvme_tier_bytes ? cfg->nvme_tier_bytes
                                                     : 4ull << 30;
        in->host_tier_pages_max = os.host_pages_max;
        in->nvme_tier_pages_max = os.nvme ? os.nvme_slots : 0;
    }
}

/* The KV-cache event publisher: the router's view of this engine starts
 * empty (AllBlocksCleared), before the tiers replay what persisted. */
static int eng_kvev_open(struct llmd_engine *e, const struct llmd_engine_config *cfg, char *errbuf,
                         size_t errlen) {
    if (cfg->no_prefix_cache) {
        if (errbuf && errlen)
            snprintf(errbuf, errlen,
                     "llmd: KV-cache events describe the prefix cache; they need it on");
        return -EINVAL;
    }
    e->kvev_tok = mem_alloc(MEM_SCHED, (size_t)e->tpp * sizeof(*e->kvev_tok));
    if (!e->kvev_tok)
        return eng_err(errbuf, errlen, -ENOMEM, "llmd: out of memory");
    struct kvev_config kc = {.endpoint = cfg->kv_events_endpoint,
                             .replay_endpoint = cfg->kv_events_replay_endpoint,
                             .topic = cfg->kv_events_topic,
                             .block_size = e->tpp,
                             .no_token_ids = cfg->kv_events_no_token_ids != 0};
    int rc = kvev_open(&kc, &e->kvev, errbuf, errlen);
    if (rc < 0)
        return rc;
    kvev_cleared(e->kvev);
    return 0;
}

/* What the NVMe tier kept from an earlier run, announced after the clear
 * (its parents and tokens are not on disk: the stores carry none). */
static void eng_kvev_announce(struct llmd_engine *e) {
    uint32_t n = e->kvev && e->ofl ? ofl_hashes(e->ofl, OFL_TIER_NVME, NULL, 0) : 0;
    uint8_t(*h)[OFL_KEY_BYTES] = n ? mem_alloc(MEM_SCHED, (size_t)n * OFL_KEY_BYTES) : NULL;
    if (h) {
        n = ofl_hashes(e->ofl, OFL_TIER_NVME, h, n);
        for (uint32_t i = 0; i < n; i++)
            kvev_stored(e->kvev, KVEV_DISK, h[i], NULL, NULL, 0, 0);
        mem_free(h);
    }
    if (e->kvev)
        kvev_flush(e->kvev);
}

/* A device page the prefix cache just sealed: its store event, with its
 * parent (the chain's previous page) and tokens. */
static void eng_kvev_sealed(struct llmd_engine *e, struct eng_req *r, uint32_t i, uint32_t tenant) {
    if (!e->kvev)
        return;
    uint32_t n_gen = 0, t0 = i * e->tpp;
    const int32_t *gen = sched_req_generated(e->s, r->id, &n_gen);
    uint32_t n = 0;
    for (; n < e->tpp; n++) {
        uint32_t t = t0 + n;
        if (t < r->n_prompt)
            e->kvev_tok[n] = r->prompt[t];
        else if (t - r->n_prompt < n_gen)
            e->kvev_tok[n] = gen[t - r->n_prompt];
        else
            break;
    }
    kvev_stored(e->kvev, KVEV_GPU, r->chain[i].b, i ? r->chain[i - 1].b : NULL, e->kvev_tok,
                n == e->tpp ? n : 0, tenant);
}

int llmd_engine_open(const struct llmd_engine_config *cfg, struct llmd_engine **out, char *errbuf,
                     size_t errlen) {
    if (!cfg || !cfg->model)
        return eng_err(errbuf, errlen, -EINVAL, "llmd: no model given");
    if (errbuf && errlen)
        errbuf[0] = '\0'; /* the fallback messages below test for an empty buffer */
    if (!eng_kv_type_ok(cfg->kv_type)) {
        if (errbuf && errlen)
            snprintf(errbuf, errlen, "llmd: unknown kv_type %d (known: %s)", (int)cfg->kv_type,
                     kv_dtype_names());
        return -EINVAL;
    }
    /* a device this build or machine lacks is refused before the model loads */
    int drc = llmd_device_check(cfg->device, cfg->device_index, errbuf, errlen);
    if (drc < 0)
        return drc;
    struct llmd_engine *e = mem_calloc(MEM_SCHED, 1, sizeof(*e));
    if (!e)
        return eng_err(errbuf, errlen, -ENOMEM, "llmd: out of memory");
    /* the pool first: it packs the model's matrices at load */
    int rc = kern_pool_create(cfg->n_threads, &e->pool);
    if (rc < 0) {
        if (errbuf && errlen)
            snprintf(errbuf, errlen, "llmd: setup failed: %s", strerror(-rc));
        goto fail;
    }
    rc = model_load(cfg->model,
                    &(struct model_load_opts){.quiet = true,
                                              .no_pack = cfg->device == LLMD_DEVICE_CUDA,
                                              .tokenizer_pre = cfg->tokenizer_pre,
                                              .pool = e->pool},
                    &e->m, errbuf, errlen);
    if (rc < 0)
        goto fail;
    const struct model_hparams *hp = &e->m->hp;
    if (cfg->device == LLMD_DEVICE_CUDA &&
        (hp->arch != MODEL_ARCH_LLAMA || e->m->rope_freqs || hp->n_swa)) {
        /* its kernels know neither the Q/K/V biases, the Q/K norms nor NEOX RoPE */
        rc = eng_err(errbuf, errlen, -ENOTSUP, "");
        if (errbuf && errlen)
            snprintf(errbuf, errlen,
                     "llmd: --device cuda runs the llama architecture without RoPE scaling "
                     "or a sliding window only; %s is a %s model%s (run it with --device cpu)",
                     e->m->name, model_arch_name(hp->arch),
                     e->m->rope_freqs ? " with rope_freqs.weight"
                     : hp->n_swa      ? " with a sliding window"
                                      : "");
        goto fail;
    }
    e->max_seqs = cfg->max_seqs ? cfg->max_seqs : 8;
    e->max_batched = cfg->max_batched_tokens ? cfg->max_batched_tokens : 256;
    e->n_ctx = cfg->n_ctx ? cfg->n_ctx : hp->n_ctx_train;
    if (e->max_batched < e->max_seqs) {
        if (errbuf && errlen)
            snprintf(errbuf, errlen, "llmd: max_batched_tokens (%u) must be >= max_seqs (%u)",
                     e->max_batched, e->max_seqs);
        rc = -EINVAL;
        goto fail;
    }
    if ((rc = eng_spec_config(e, cfg, errbuf, errlen)) < 0)
        goto fail;
    if (cfg->spec == LLMD_SPEC_DRAFT && hp->n_swa) {
        /* the draft's KV shares each page: dropping the window's front would
         * take keys a draft without the window still reads */
        rc = eng_err(errbuf, errlen, -ENOTSUP,
                     "llmd: --spec draft with a sliding-window model is not implemented (use "
                     "--spec ngram)");
        goto fail;
    }
    if (cfg->spec == LLMD_SPEC_DRAFT &&
        (rc = spec_draft_load(cfg->spec_model_path, e->m, e->pool, &e->draft, errbuf, errlen)) < 0)
        goto fail;
    struct kv_config kc = {
        .dtype = eng_kv_dtype(cfg->kv_type),
        .n_ctx = e->n_ctx,
        .n_seqs = e->max_seqs,
        .page_bytes = cfg->page_bytes,
        .budget_bytes = cfg->kv_budget_bytes,
        .device = cfg->device == LLMD_DEVICE_CUDA ? KV_DEV_CUDA : KV_DEV_HOST,
        .cuda_ordinal = cfg->device_index,
        .map_ahead = !cfg->no_map_ahead,
        .draft_hp = e->draft ? spec_draft_hparams(e->draft) : NULL,
    };
    if (cfg->device != LLMD_DEVICE_CPU && cfg->device != LLMD_DEVICE_CUDA) {
        rc = eng_err(errbuf, errlen, -EINVAL, "llmd: unknown device");
        goto fail;
    }
    /* vmm_create() leaves "ok" in errbuf on success: clear it, or a later
     * failure here would report "ok" instead of its reason */
    rc = kv_cache_create(hp, &kc, &e->kv, errbuf, errlen);
    if (rc == 0 && errbuf && errlen)
        errbuf[0] = '\0';
    if (rc < 0 || (rc = model_ctx_create(e->m, e->pool, e->max_batched, &e->ctx)) < 0 ||
        (cfg->device == LLMD_DEVICE_CUDA &&
         (rc = model_ctx_use_cuda(e->ctx, e->kv, cfg->device_index, e->max_seqs, errbuf, errlen)) <
             0) ||
        (rc = eng_alloc_tables(e)) < 0 ||
        (e->draft && (rc = spec_draft_start(e->draft, e->kv, e->pool, e->max_batched + e->max_seqs,
                                            e->max_seqs)) < 0)) {
        if (errbuf && errlen && !errbuf[0])
            snprintf(errbuf, errlen, "llmd: setup failed: %s", strerror(-rc));
        goto fail;
    }
    struct sched_config sc = {
        .ops = &eng_page_ops,
        .ops_ctx = e,
        .n_pages = vmm_n_pages(e->kv->vmm),
        .tokens_per_page = vmm_tokens_per_page(e->kv->vmm),
        .max_ctx = e->n_ctx,
        .max_seqs = e->max_seqs,
        .max_batched_tokens = e->max_batched,
        .max_chunk_tokens = cfg->max_chunk_tokens,
        .headroom_pages = 1,
        .max_queue_wait_ns = cfg->max_queue_wait_ns,
        /* with the prefix cache a victim's pages stay cached (and spill) */
        .preempt_mode = cfg->no_prefix_cache ? SCHED_PREEMPT_RECOMPUTE : SCHED_PREEMPT_SPILL,
    };
    if ((rc = sched_create(&sc, &e->s)) < 0) {
        eng_err(errbuf, errlen, rc, "llmd: scheduler configuration refused");
        goto fail;
    }
    e->tpp = vmm_tokens_per_page(e->kv->vmm);
    /* the tiers before the prefix cache: their lock is held before the key
     * file beside an NVMe tier is read or made (eng_pfx_key) */
    if (!cfg->no_prefix_cache && (rc = eng_fingerprint(e, errbuf, errlen)) < 0)
        goto fail;
    /* events before the tiers: the NVMe tier's thread reports into them */
    if (cfg->kv_events_endpoint && (rc = eng_kvev_open(e, cfg, errbuf, errlen)) < 0)
        goto fail;
    if ((cfg->host_tier_bytes || cfg->nvme_tier_path) &&
        (rc = eng_ofl_open(e, cfg, errbuf, errlen)) < 0)
        goto fail;
    if (!cfg->no_prefix_cache && (rc = eng_pfx_open(e, cfg, errbuf, errlen)) < 0)
        goto fail;
    eng_kvev_announce(e);
    if (e->spec_tokens && !e->spec_fixed_len)
        eng_spec_probe(e);
    eng_info_fill(e, cfg);
    *out = e;
    return 0;
fail:
    llmd_engine_close(e);
    return rc;
}

/* With an NVMe tier: spill every unreferenced cached device page (through
 * the host tier, which hands them on to NVMe) and wait for the writes, the
 * spill policy set aside (ofl_flush_begin), so the prefixes survive a
 * restart. Without one, host copies die with the process: skip the work. */
static int eng_ofl_flush(struct llmd_engine *e, struct llmd_flush_counts *out) {
    struct ofl_stats os;
    *out = (struct llmd_flush_counts){0};
    if (!e->ofl || !e->pfx)
        return -ENOTSUP;
    ofl_stats_get(e->ofl, &os);
    if (!os.nvme)
        return -ENOTSUP;
    ofl_flush_begin(e->ofl);
    uint32_t got = 0;
    while (pfx_evict(e->pfx, UINT32_MAX, &got) == -EAGAIN && got > 0) {
    }
    struct ofl_flush_counts fc;
    ofl_flush(e->ofl, &fc);
    ofl_stats_get(e->ofl, &os);
    *out = (struct llmd_flush_counts){
        .written = fc.written, .present = fc.present, .lost = fc.lost, .nvme_pages = os.nvme_pages};
    return 0;
}

int llmd_engine_flush(struct llmd_engine *e, struct llmd_flush_counts *out) {
    struct llmd_flush_counts fc;
    if (e->in_callback)
        return -EBUSY;
    int rc = eng_ofl_flush(e, &fc);
    if (out)
        *out = fc;
    return rc;
}

void llmd_engine_close(struct llmd_engine *e) {
    if (!e)
        return;
    /* ranges first: eng_slot_release() writes to the slot's request */
    for (uint32_t i = 0; e->slot_range && i < e->max_seqs; i++)
        eng_slot_release(e, i);
    while (e->reqs)
        eng_req_free(e, e->reqs);
    sched_destroy(e->s);
    struct llmd_flush_counts fc;
    if (eng_ofl_flush(e, &fc) == 0 && (fc.written || fc.lost))
        LOG_INFO("engine",
                 "closing: %u cached pages written to the NVMe tier, %u already there, %u lost; "
                 "it holds %llu",
                 fc.written, fc.present, fc.lost, (unsigned long long)fc.nvme_pages);
    pfx_destroy(e->pfx); /* after every range is released: frees the cached pages */
    ofl_destroy(e->ofl);
    kvev_close(e->kvev); /* after the tiers: their last moves are events too */
    mem_free(e->kvev_tok);
    spec_draft_close(e->draft); /* before the kernel pool and the KV it runs on */
    model_ctx_destroy(e->ctx);
    kern_pool_destroy(e->pool);
    kv_cache_destroy(e->kv);
    model_free(e->m);
    mem_free(e->slot_range);
    mem_free(e->slot_req);
    mem_free(e->tok_buf);
    mem_free(e->logits);
    mem_free(e->batch);
    mem_free(e->results);
    mem_free(e->step_req);
    mem_free(e->pieces);
    mem_free(e->row0);
    mem_free(e->kv_end);
    mem_free(e->acc);
    mem_free(e->acc_piece);
    mem_free(e->acc_bytes);
    mem_free(e->ts_at);
    mem_free(e->ev_k);
    mem_free(e->spec_alpha);
    mem_free(e->spec_kmax);
    mem_free(e->spec_k);
    mem_free(e->spec_req);
    mem_free(e->spec_lag);
    mem_free(e->spec_spare);
    mem_free(e->dtok);
    mem_free(e->dseq);
    mem_free(e->echo_logits);
    mem_free(e);
}

/* --- submit / cancel ------------------------------------------------------ */

static int eng_req_prompt(struct llmd_engine *e, const struct llmd_request *q, struct eng_req *r) {
    if (q->prompt_ids) {
        r->prompt = mem_alloc(MEM_SCHED, (size_t)q->n_prompt_ids * sizeof(int32_t));
        if (!r->prompt)
            return -ENOMEM;
        for (uint32_t i = 0; i < q->n_prompt_ids; i++)
            if (q->prompt_ids[i] < 0 || (uint32_t)q->prompt_ids[i] >= e->m->hp.n_vocab)
                return -EINVAL;
        memcpy(r->prompt, q->prompt_ids, (size_t)q->n_prompt_ids * sizeof(int32_t));
        r->n_prompt = q->n_prompt_ids;
        return 0;
    }
    size_t n = 0;
    int rc = tok_encode_alloc(e->m->tok, q->prompt, q->prompt_len, tok_add_bos_default(e->m->tok),
                              0, &r->prompt, &n);
    if (rc < 0)
        return rc;
    if (n > UINT32_MAX)
        return -E2BIG;
    r->n_prompt = (uint32_t)n;
    return 0;
}

/* Extend r's pinned device hits with pages restored from the tiers below:
 * chain pages [n_hits, lim) that the host or NVMe tier holds are copied into
 * free device pages, indexed and pinned, in order, at most up to `avail`
 * pinned pages in all. The first page no tier holds (or that fails its
 * checksum) ends the run: the rest is prefilled. */
static void eng_restore_hits(struct llmd_engine *e, struct eng_req *r, uint32_t lim,
                             uint32_t avail) {
    struct vmm *v = e->kv->vmm;
    while (r->n_hits < lim && r->n_hits < avail) {
        const struct pfx_hash *h = &r->chain[r->n_hits];
        /* a page on the device again (recomputed since it spilled) is a hit,
         * not a restore: the caller's lookup takes it */
        if (ofl_find(e->ofl, h->b) == OFL_TIER_NONE || pfx_contains(e->pfx, h))
            break;
        uint32_t got = 0;
        if (kv_pages_free(e->kv, NULL) == 0 && (pfx_evict(e->pfx, 1, &got), got == 0))
            break;                        /* only pinned or mapped pages left: recompute instead */
        kv_reclaim(e->kv, 1, UINT32_MAX); /* a page mapped ahead may be the free one */
        uint32_t page, owner;
        uint8_t prio;
        if (ofl_restore(e->ofl, h->b, &page, &owner, &prio) < 0)
            break;
        int rc = pfx_insert(e->pfx, h, page, owner, prio < PFX_N_PRIO ? prio : PFX_PRIO_NORMAL);
        if (rc < 0) {
            LOG_WARN("engine", "restored page %u not indexed: %s", page, strerror(-rc));
            vmm_page_restore_abort(v, page);
            break;
        }
        eng_kvev_sealed(e, r, r->n_hits, owner);
        e->insert_gen++;
        if (NEVER(vmm_page_pin(v, page) < 0))
            break;
        r->hits[r->n_hits++] = page;
        r->n_restored++;
        e->n_pinned++;
        e->restored_tokens_total += e->tpp;
    }
}

/* Tokens the request's next prefill covers: its prompt, and the tokens it
 * generated before a preemption. */
static uint32_t eng_req_target(const struct llmd_engine *e, const struct eng_req *r) {
    uint32_t n_gen = 0;
    sched_req_generated(e->s, r->id, &n_gen);
    return r->n_prompt + n_gen;
}

/* Look the request's chain up and pin the longest cached run, leaving at
 * least one token to compute (its logits start decoding); pages the tiers
 * below hold extend the run. Any pins from an earlier lookup are dropped
 * first. */
static int eng_req_pin_hits(struct llmd_engine *e, struct eng_req *r) {
    eng_req_unpin(e, r);
    uint32_t k = (eng_req_target(e, r) - 1) / e->tpp;
    if (k > r->n_chain)
        k = r->n_chain;
    /* each pin takes one page off eng_evictable_pages(), which running
     * sequences' reservations may be counting on: pin only what the
     * scheduler has not promised (a shorter run of hits is still a prefix) */
    uint32_t avail = sched_pages_avail(e->s);
    if (k > avail)
        k = avail;
    r->n_hits = 0;
    r->pinned = true;
    for (;;) {
        /* device hits from n_hits on, then what the tiers below hold; a
         * restored run may be followed by pages on the device again */
        uint32_t got = pfx_lookup(e->pfx, r->chain + r->n_hits, k - r->n_hits, r->hits + r->n_hits);
        for (uint32_t i = r->n_hits; i < r->n_hits + got; i++)
            if (vmm_page_pin(e->kv->vmm, r->hits[i]) < 0) {
                while (i-- > 0) /* cannot happen: a hit is CACHED or MAPPED */
                    vmm_page_unpin(e->kv->vmm, r->hits[i]);
                e->n_pinned -= r->n_hits;
                r->n_hits = 0;
                r->pinned = false;
                return -EIO;
            }
        r->n_hits += got;
        e->n_pinned += got;
        uint32_t before = r->n_hits;
        if (!e->ofl || r->n_hits == k)
            break;
        eng_restore_hits(e, r, k, avail);
        if (r->n_hits == before || r->n_hits == k)
            break;
    }
    /* after the restores: pages this lookup put in the cache are no reason
     * for this request to look again (others do look) */
    r->lookup_gen = e->insert_gen;
    return 0;
}

/* Waiting requests look their prefix up again when pages entered the cache
 * since their last lookup: requests submitted together with the same
 * document share it as soon as the first one has computed it, and a
 * preempted request finds the pages it had computed. Bounded: at most
 * ENG_RELOOKUP_MAX requests a step, O(pages hit) each. */
#define ENG_RELOOKUP_MAX 64
static void eng_req_relookup(struct llmd_engine *e, struct eng_req *r) {
    if (eng_req_pin_hits(e, r) < 0 || sched_set_cached(e->s, r->id, r->n_hits * e->tpp) < 0) {
        /* keep the scheduler and the pins in step: no hit at all */
        eng_req_unpin(e, r);
        r->n_hits = 0;
        sched_set_cached(e->s, r->id, 0);
    }
}

static void eng_relookup(struct llmd_engine *e) {
    uint32_t done = 0;
    for (struct eng_req *r = e->reqs; r && done < ENG_RELOOKUP_MAX; r = r->next) {
        if (r->slot != ENG_NONE || r->n_chain == 0 || r->lookup_gen == e->insert_gen)
            continue;
        done++;
        eng_req_relookup(e, r);
    }
}

/* --- holds: a prefix is prefilled once at a time -------------------------
 * Requests that arrive together with the same prompt (n choices of one
 * HTTP request, a burst of questions about one document) would each be
 * admitted while none of the prompt's pages is cached yet and prefill it
 * side by side, each keeping a private copy. Instead a request whose next
 * missing prompt page another live request is computing is held back from
 * admission (sched_set_held) until that page is in the cache; it then
 * shares every full page and computes only its last partial page and what
 * follows (docs/prefix-cache.md "Holds"). */

/* The pages of r's chain its admission may share: one token is always
 * computed (its logits start decoding). */
static uint32_t eng_req_hit_max(const struct llmd_engine *e, const struct eng_req *r) {
    uint32_t k = (eng_req_target(e, r) - 1) / e->tpp;
    return k < r->n_chain ? k : r->n_chain;
}

/* True when o, submitted before r, computes the page r misses next
 * (chain[r->n_hits]: equal hashes, so the same tokens up to it in the same
 * namespace), has not put it in the cache yet, and runs now or is sure to
 * run first (it waits in r's tenant at no lower priority). The relation
 * points to earlier submissions only, so holds never form a cycle: the
 * earliest request of any chain of holds is not held. */
static bool eng_hold_by(const struct llmd_engine *e, const struct eng_req *o,
                        const struct eng_req *r) {
    uint32_t i = r->n_hits;
    return o != r && o->seq < r->seq && !o->purged && r->slot == ENG_NONE &&
           i < eng_req_hit_max(e, r) && i < o->n_chain && o->n_inserted <= i &&
           memcmp(o->chain[i].b, r->chain[i].b, PFX_HASH_BYTES) == 0 &&
           (o->slot != ENG_NONE || (o->tenant == r->tenant && o->priority >= r->priority));
}

/* Let r be admitted again. Its scheduler record may be gone already (r is
 * being freed): then there is nothing to clear. */
static void eng_hold_release(struct llmd_engine *e, struct eng_req *r) {
    r->hold = NULL;
    e->n_held--;
    (void)sched_set_held(e->s, r->id, false);
}

/* At submission: hold r behind the live request computing its next missing
 * page, if there is one. O(live requests). */
static void eng_hold_find(struct llmd_engine *e, struct eng_req *r) {
    for (struct eng_req *o = e->reqs; o; o = o->next)
        if (eng_hold_by(e, o, r) && sched_set_held(e->s, r->id, true) == 0) {
            r->hold = o;
            e->n_held++;
            return;
        }
}

/* Before each plan, after eng_relookup(): look each held request up again
 * if pages entered the cache since (eng_relookup's bound may have passed it
 * by), and release its hold once the page it waited for is among its hits
 * or will not come (its owner was purged, or kept the page private).
 * O(live requests + pages hit), nothing when no request is held. */
static void eng_hold_update(struct llmd_engine *e) {
    for (struct eng_req *r = e->reqs; e->n_held && r; r = r->next) {
        if (!r->hold)
            continue;
        if (r->lookup_gen != e->insert_gen)
            eng_req_relookup(e, r);
        if (!eng_hold_by(e, r->hold, r))
            eng_hold_release(e, r);
    }
}

/* Hash the prompt's full pages in the request's namespace and pin the
 * longest cached run of them, leaving at least one prompt token to compute
 * (its logits start decoding). */
static int eng_req_lookup(struct llmd_engine *e, const struct llmd_request *q, struct eng_req *r) {
    uint32_t n_full = r->n_prompt / e->tpp;
    uint8_t tb[4] = {(uint8_t)q->tenant, (uint8_t)(q->tenant >> 8), (uint8_t)(q->tenant >> 16),
                     (uint8_t)(q->tenant >> 24)};
    const void *nsb = tb;
    size_t n_ns = sizeof tb;
    if (q->cache_ns) {
        if (q->cache_ns_len > UINT32_MAX)
            return -EINVAL;
        nsb = q->cache_ns;
        n_ns = q->cache_ns_len;
    }
    /* kept: a preemption extends the chain over the generated tokens */
    r->ns = mem_alloc(MEM_SCHED, n_ns ? n_ns : 1);
    if (!r->ns)
        return -ENOMEM;
    memcpy(r->ns, nsb, n_ns);
    r->n_ns = (uint32_t)n_ns;
    if (n_full == 0)
        return 0;
    r->chain = mem_alloc(MEM_SCHED, n_full * sizeof(*r->chain));
    r->hits = mem_alloc(MEM_SCHED, n_full * sizeof(*r->hits));
    if (!r->chain || !r->hits)
        return -ENOMEM;
    r->chain_cap = n_full;
    struct pfx_ns ns = {.bytes = r->ns, .n_bytes = r->n_ns};
    uint32_t n_out = 0;
    int rc = pfx_chain(e->pfx, &ns, 1, r->prompt, r->n_prompt, r->chain, &n_out);
    if (rc < 0)
        return rc;
    r->n_chain = n_out;
    return eng_req_pin_hits(e, r);
}

int llmd_submit(struct llmd_engine *e, const struct llmd_request *q, uint64_t *id,
                uint32_t *retry_after_s) {
    if (e->in_callback)
        return -EBUSY;
    /* no step will run this request, so it would never get its callback;
     * the scheduler's -EBUSY (a plan left outstanding) is not the reason */
    if (e->broken)
        return -EIO;
    if (!q->on_token || (!q->prompt && !q->prompt_ids) || (q->prompt && q->prompt_ids) ||
        q->top_logprobs > LLMD_TOP_LOGPROBS_MAX ||
        (q->top_logprobs && !q->logprobs && !q->on_prompt))
        return -EINVAL;
    if (q->on_prompt && !e->echo_logits &&
        !(e->echo_logits =
              mem_alloc(MEM_SCHED, (size_t)e->max_batched * e->m->hp.n_vocab * sizeof(float))))
        return -ENOMEM;
    struct eng_req *r = mem_calloc(MEM_SCHED, 1, sizeof(*r));
    if (!r)
        return -ENOMEM;
    r->slot = ENG_NONE;
    r->on_token = q->on_token;
    r->user = q->user;
    r->usage = q->usage;
    r->lp = q->logprobs;
    r->on_prompt = q->on_prompt;
    r->echo_next = 0;
    r->prompt_only = q->prompt_only;
    r->n_top = q->top_logprobs < e->m->hp.n_vocab ? q->top_logprobs : e->m->hp.n_vocab;
    tok_stream_init(&r->ts);
    struct smp_params sp = {
        .temperature = q->temperature,
        .top_k = q->top_k,
        /* NaN passes through so smp_create() refuses it, as it
         * refuses a NaN temperature or min_p */
        .top_p = isnan(q->top_p) || (q->top_p > 0.0f && q->top_p < 1.0f) ? q->top_p : 1.0f,
        .min_p = q->min_p,
        .seed = q->seed,
        .presence_penalty = q->presence_penalty,
        .frequency_penalty = q->frequency_penalty,
        .repetition_penalty = q->repetition_penalty,
        .bias_ids = q->logit_bias_ids,
        .bias = q->logit_bias,
        .n_bias = q->n_logit_bias};
    int rc = eng_req_prompt(e, q, r);
    if (rc == 0 && r->n_prompt == 0)
        rc = -EINVAL;
    if (rc == 0 && (q->n_stop_token_ids > LLMD_STOP_TOKEN_IDS_MAX ||
                    (q->n_stop_token_ids && !q->stop_token_ids)))
        rc = -EINVAL;
    if (rc == 0)
        rc = smp_create(&sp, e->m->hp.n_vocab, &r->smp);
    if (rc == 0) /* the repetition penalty counts the prompt's tokens */
        smp_prompt(r->smp, r->prompt, r->n_prompt);
    r->tenant = q->tenant;
    r->max_tokens = q->prompt_only ? 1 : q->max_tokens;
    r->spec = e->spec_tokens > 0 && !q->no_speculative;
    if (rc == 0 && r->spec &&
        !(r->draft = mem_calloc(MEM_SCHED, e->spec_tokens, sizeof(*r->draft))))
        rc = -ENOMEM;
    if (rc == 0 && e->pfx && !r->on_prompt) /* a hit would skip prompt positions */
        rc = eng_req_lookup(e, q, r);
    /* every end-of-generation token ends it as the EOS does (<|eot_id|>,
     * <|im_end|>, ...: tok_eog), after the client's own stop ids */
    _Static_assert(LLMD_STOP_TOKEN_IDS_MAX + TOK_EOG_MAX <= SCHED_STOP_IDS_MAX,
                   "a request's stop ids and the vocabulary's end-of-generation tokens");
    int32_t stop_ids[LLMD_STOP_TOKEN_IDS_MAX + TOK_EOG_MAX];
    uint32_t n_stop_ids = 0;
    if (rc == 0) {
        if (q->n_stop_token_ids)
            memcpy(stop_ids, q->stop_token_ids, q->n_stop_token_ids * sizeof(*stop_ids));
        n_stop_ids = q->n_stop_token_ids;
        int32_t eog[TOK_EOG_MAX];
        uint32_t n_eog = q->ignore_eos ? 0 : tok_eog(e->m->tok, eog);
        for (uint32_t i = 0; i < n_eog; i++)
            if (eog[i] != tok_eos(e->m->tok)) /* the EOS is the scheduler's eos */
                stop_ids[n_stop_ids++] = eog[i];
    }
    if (rc == 0) {
        struct sched_request sr = {.tenant = q->tenant,
                                   .priority = q->priority,
                                   .prompt_len = r->n_prompt,
                                   .cached_tokens = r->n_hits * e->tpp,
                                   .max_tokens = r->max_tokens,
                                   .eos = q->ignore_eos ? SCHED_TOKEN_NONE : tok_eos(e->m->tok),
                                   .stop = q->stop,
                                   .n_stop = q->n_stop,
                                   .stop_ids = stop_ids,
                                   .n_stop_ids = n_stop_ids};
        rc = sched_submit(e->s, &sr, eng_now(), &r->id, retry_after_s);
    }
    if (rc < 0) {
        if (q->usage) /* how long a refused prompt was (0: never tokenized) */
            *q->usage = (struct llmd_usage){.prompt_tokens = r->n_prompt};
        eng_req_unpin(e, r);
        mem_free(r->draft);
        mem_free(r->ns);
        mem_free(r->chain);
        mem_free(r->hits);
        smp_destroy(r->smp);
        mem_free(r->prompt);
        mem_free(r);
        return rc;
    }
    r->seq = ++e->submit_seq;
    r->priority = q->priority;
    if (e->pfx && r->n_chain)
        eng_hold_find(e, r);
    r->next = e->reqs;
    if (e->reqs)
        e->reqs->prev = r;
    e->reqs = r;
    e->n_reqs++;
    e->prompt_tokens_total += r->n_prompt;
    if (r->usage)
        *r->usage = (struct llmd_usage){.prompt_tokens = r->n_prompt};
    r->submit_ns = eng_now();
    *id = r->id;
    return 0;
}

int llmd_cancel(struct llmd_engine *e, uint64_t id) {
    if (e->in_callback)
        return -EBUSY;
    struct eng_req *r = eng_req_find(e, id);
    if (!r)
        return -ENOENT;
    uint32_t slot = SCHED_SLOT_NONE;
    int rc = sched_cancel(e->s, id, eng_now(), &slot);
    if (rc < 0)
        return rc;
    if (slot != SCHED_SLOT_NONE)
        eng_slot_release(e, slot);
    eng_emit(e, r, -1, "", 0, LLMD_FINISH_CANCELLED);
    eng_req_free(e, r);
    return 0;
}

/* --- one step ------------------------------------------------------------- */

/* Finish every live request with an error and refuse further steps: the
 * state of the batch that failed is not trusted. */
static int eng_fail(struct llmd_engine *e, int rc) {
    LOG_ERROR("engine", "step failed (%s): finishing %u requests with an error", strerror(-rc),
              e->n_reqs);
    e->broken = true;
    /* ranges first: eng_slot_release() writes to the slot's request */
    for (uint32_t i = 0; i < e->max_seqs; i++)
        eng_slot_release(e, i);
    while (e->reqs) {
        struct eng_req *r = e->reqs;
        eng_emit(e, r, -1, "", 0, LLMD_FINISH_ERROR);
        eng_req_free(e, r);
    }
    return rc;
}

/* Acquire ranges for admitted requests, after releasing preempted ones. */
/* Grow r's chain to n_pages hashes over its prompt ++ generated tokens.
 * Returns 0, -ENOMEM. */
static int eng_chain_extend(struct llmd_engine *e, struct eng_req *r, uint32_t n_pages) {
    if (n_pages <= r->n_chain)
        return 0;
    if (n_pages > r->chain_cap) {
        struct pfx_hash *c = mem_alloc(MEM_SCHED, (size_t)n_pages * sizeof(*c));
        uint32_t *h = mem_alloc(MEM_SCHED, (size_t)n_pages * sizeof(*h));
        if (!c || !h) {
            mem_free(c);
            mem_free(h);
            return -ENOMEM;
        }
        if (r->n_chain)
            memcpy(c, r->chain, (size_t)r->n_chain * sizeof(*c));
        if (r->n_hits)
            memcpy(h, r->hits, (size_t)r->n_hits * sizeof(*h));
        mem_free(r->chain);
        mem_free(r->hits);
        r->chain = c;
        r->hits = h;
        r->chain_cap = n_pages;
    }
    uint32_t n_gen = 0, n_tok = n_pages * e->tpp;
    const int32_t *gen = sched_req_generated(e->s, r->id, &n_gen);
    if (n_tok > r->n_prompt + n_gen)
        return -EINVAL;
    int32_t *tok = mem_alloc(MEM_SCHED, (size_t)n_tok * sizeof(*tok));
    if (!tok)
        return -ENOMEM;
    uint32_t from_prompt = n_tok < r->n_prompt ? n_tok : r->n_prompt;
    memcpy(tok, r->prompt, (size_t)from_prompt * sizeof(*tok));
    if (n_tok > from_prompt)
        memcpy(tok + from_prompt, gen, (size_t)(n_tok - from_prompt) * sizeof(*tok));
    struct pfx_ns ns = {.bytes = r->ns, .n_bytes = r->n_ns};
    uint32_t n_out = r->n_chain;
    int rc = pfx_chain(e->pfx, &ns, 1, tok, n_tok, r->chain, &n_out);
    mem_free(tok);
    if (rc == 0)
        r->n_chain = n_out;
    return rc;
}

/* A preempted request (SPILL mode) keeps what it computed: its full pages,
 * prompt and generated alike, enter the prefix cache at high value before
 * its range goes, so they stay CACHED, spill to the host tier when evicted,
 * and come back at its lookup on resume. Failures only cost a recompute. */
static void eng_preempt_keep(struct llmd_engine *e, const struct sched_preempt *p) {
    struct eng_req *r = p->slot < e->max_seqs ? e->slot_req[p->slot] : NULL;
    if (!e->pfx || !r || !r->ns || r->purged || p->mode != SCHED_PREEMPT_SPILL)
        return;
    uint32_t kept = e->draft && r->d_comp < p->n_computed ? r->d_comp : p->n_computed;
    uint32_t full = kept / e->tpp, range = e->slot_range[p->slot];
    if (full <= r->n_inserted || eng_chain_extend(e, r, full) < 0)
        return;
    for (uint32_t i = r->n_inserted; i < full && i < r->n_chain; i++) {
        uint32_t page = vmm_range_page(e->kv->vmm, range, i);
        if (pfx_insert(e->pfx, &r->chain[i], page, r->tenant, PFX_PRIO_HIGH) == 0) {
            eng_kvev_sealed(e, r, i, r->tenant);
            e->insert_gen++;
        }
    }
}

static int eng_apply_plan(struct llmd_engine *e, const struct sched_plan *pl) {
    for (uint32_t i = 0; i < pl->n_preempted; i++) {
        uint32_t slot = pl->preempted[i].slot;
        eng_preempt_keep(e, &pl->preempted[i]);
        if (slot < e->max_seqs && e->slot_req[slot])
            e->slot_req[slot]->n_inserted = 0; /* looked up again at resume */
        eng_slot_release(e, slot);
    }
    for (uint32_t i = 0; i < pl->n_admitted; i++) {
        const struct sched_admit *a = &pl->admitted[i];
        struct eng_req *r = eng_req_find(e, a->id);
        uint32_t range;
        if (!r || a->slot >= e->max_seqs || e->slot_range[a->slot] != ENG_NONE)
            return -EIO;
        int rc = kv_seq_open(e->kv, &range);
        if (rc < 0)
            return rc;
        e->slot_range[a->slot] = range;
        e->slot_req[a->slot] = r;
        r->slot = a->slot;
        /* map the promised prefix pages, then let go of the pins */
        uint32_t use = a->cached_tokens / (e->tpp ? e->tpp : 1);
        if (use > 0 && (!r->pinned || use > r->n_hits))
            return -EIO;
        for (uint32_t k = 0; k < use; k++)
            if ((rc = kv_seq_share(e->kv, range, r->hits[k])) < 0)
                return rc;
        eng_req_unpin(e, r);
        r->n_shared = use;
        r->n_inserted = use;
        r->d_comp = use * e->tpp; /* a cached page holds the draft's KV too */
        e->prefix_hit_tokens_total += (uint64_t)use * e->tpp;
        if (r->ns) /* it looked the cache up (eng_req_lookup) */
            e->prefix_query_tokens_total += eng_req_target(e, r);
        if (r->usage) {
            uint32_t restored = r->n_restored < use ? r->n_restored : use;
            r->usage->cached_tokens = use * e->tpp;
            r->usage->restored_tokens = restored * e->tpp;
            if (r->usage->queue_ns == 0) { /* the first admission */
                uint64_t q = eng_now() - r->submit_ns;
                r->usage->queue_ns = q ? q : 1;
            }
        }
    }
    return 0;
}

/* After the step ran and was verified: index the prompt pages it
 * completed, so later requests with the same prefix share them. Only
 * positions that hold committed tokens count (kv_end[i]: a rejected draft
 * position never makes a page full). A page already cached (-EEXIST) or
 * over its tenant's limit (-EDQUOT) stays private. */
/* A sliding window (hparams.n_swa): after the step, each sequence's pages
 * that hold only tokens no later query sees (older than its next position
 * minus the window) leave its range: a long generation holds about the
 * window's pages. With the prefix cache, the prompt's pages only once
 * offered to it (n_inserted): a sealed page stays CACHED for later prompts. */
static void eng_window_drop(struct llmd_engine *e, const struct sched_plan *pl) {
    uint32_t w = e->m->hp.n_swa;
    for (uint32_t i = 0; w && i < pl->n_entries; i++) {
        const struct eng_req *r = e->step_req[i];
        uint32_t next = e->kv_end[i]; /* the next query's position */
        if (!r || next + 1 <= w)
            continue;
        uint32_t first = next + 1 - w;
        /* the chain's pages (the prompt's) go once offered to the cache */
        if (e->pfx && r->n_inserted < r->n_chain && first > r->n_inserted * e->tpp)
            first = r->n_inserted * e->tpp;
        int rc = kv_seq_drop_front(e->kv, e->slot_range[pl->entries[i].slot], first);
        if (rc > 0)
            e->window_dropped_pages_total += (uint64_t)rc;
        else if (rc < 0) /* the pages stay mapped: only memory is lost */
            LOG_WARN("engine", "sliding window: unmapping old pages failed: %s", strerror(-rc));
    }
}

static void eng_insert_pages(struct llmd_engine *e, const struct sched_plan *pl) {
    for (uint32_t i = 0; e->pfx && i < pl->n_entries; i++) {
        const struct sched_entry *en = &pl->entries[i];
        struct eng_req *r = e->step_req[i];
        if (r->purged)
            continue;
        uint32_t end = e->draft && r->d_comp < e->kv_end[i] ? r->d_comp : e->kv_end[i];
        uint32_t full = end / e->tpp; /* with a draft model: both models' KV there */
        if (full > r->n_chain)
            full = r->n_chain;
        for (; r->n_inserted < full; r->n_inserted++) {
            uint32_t page = vmm_range_page(e->kv->vmm, e->slot_range[en->slot], r->n_inserted);
            int rc = pfx_insert(e->pfx, &r->chain[r->n_inserted], page, r->tenant, PFX_PRIO_NORMAL);
            if (rc == 0) {
                eng_kvev_sealed(e, r, r->n_inserted, r->tenant);
                e->insert_gen++;
            }
            if (rc < 0 && rc != -EEXIST && rc != -EDQUOT)
                LOG_WARN("engine", "prefix cache insert of page %u: %s", page, strerror(-rc));
        }
    }
}

/* Up to `want` unreferenced cached pages of the pool, found by their vmm
 * state rather than through pfx's lists, evicted. pfx_evict's scan steps
 * over a bounded number of entries in use a call, and with many sequences
 * running its lists start with thousands of them (every running prompt's
 * pages), so the pages the scheduler counted as available (vmm CACHED: a
 * preempted sequence's, inserted last) can lie out of its reach: the step
 * then failed with -ENOSPC (regress_preempted_pages_behind_busy_entries).
 * Bound: one vmm_page_info a pool page (n_pages, a few ns each), and only
 * when the bounded scan came back short. Returns the pages freed. */
static uint32_t eng_evict_cached(struct llmd_engine *e, uint32_t want) {
    uint32_t got = 0, n = vmm_n_pages(e->kv->vmm);
    for (uint32_t pg = 0; pg < n && got < want; pg++) {
        struct vmm_page_info info;
        if (vmm_page_info(e->kv->vmm, pg, &info) == 0 && info.state == VMM_PAGE_CACHED &&
            pfx_evict_page(e->pfx, pg) == 0)
            got++;
    }
    return got;
}

/* Grow a range to n_tokens, evicting cached prefix pages when the free list
 * is short (the scheduler counted them as available); with map-ahead, the
 * page of n_more tokens past them too, in the same grow, where free (see
 * kv_seq_reserve_more). Bounded: at most 8 eviction rounds, each visiting a
 * bounded number of entries (pfx_evict), then one pass over the pool's page
 * states (eng_evict_cached). */
static int eng_reserve(struct llmd_engine *e, uint32_t range, uint32_t n_tokens, uint32_t n_more) {
    int rc = kv_seq_reserve_more(e->kv, range, n_tokens, n_more);
    const uint32_t need = (n_tokens + e->tpp - 1) / e->tpp;
    for (int round = 0; rc == -ENOSPC && e->pfx && round < 8; round++) {
        uint32_t have = kv_seq_pages(e->kv, range);
        uint32_t got = 0;
        int erc = pfx_evict(e->pfx, need > have ? need - have : 1, &got);
        if (got == 0 && erc != -EAGAIN)
            break;
        rc = kv_seq_reserve(e->kv, range, n_tokens);
    }
    if (rc == -ENOSPC && e->pfx) {
        uint32_t have = kv_seq_pages(e->kv, range);
        if (eng_evict_cached(e, need > have ? need - have : 1) > 0)
            rc = kv_seq_reserve(e->kv, range, n_tokens);
    }
    return rc;
}

/* Lay out the plan's entries as one flattened batch. */
static int eng_build_batch(struct llmd_engine *e, const struct sched_plan *pl) {
    uint32_t off = 0, rows = 0, n_vocab = e->m->hp.n_vocab;
    bool waited = false;
    for (uint32_t i = 0; i < pl->n_entries; i++) {
        const struct sched_entry *en = &pl->entries[i];
        struct eng_req *r = en->slot < e->max_seqs ? e->slot_req[en->slot] : NULL;
        if (!r || r->id != en->id || off + en->n_tokens > e->max_batched)
            return -EIO;
        uint32_t n_gen;
        const int32_t *gen = sched_req_generated(e->s, en->id, &n_gen);
        if (en->n_draft > r->n_draft || rows + 1 + en->n_draft > e->n_rows)
            return -EIO;
        for (uint32_t k = 0; k < en->n_tokens; k++) {
            uint32_t pos = en->pos0 + k;
            if (pos < r->n_prompt)
                e->tok_buf[off + k] = r->prompt[pos];
            else if (pos - r->n_prompt < n_gen)
                e->tok_buf[off + k] = gen[pos - r->n_prompt];
            else if (en->is_decode && k >= 1 && k - 1 < en->n_draft)
                e->tok_buf[off + k] = r->draft[k - 1]; /* after the last generated token */
            else
                return -EIO;
        }
        uint32_t range = e->slot_range[en->slot], end = en->pos0 + en->n_tokens;
        if (en->is_decode && !kv_seq_backed(e->kv, range, end))
            waited = true; /* this grow maps a page on the step's path */
        /* a prompt's last chunk: its first decode token's page comes along,
         * so that decode does not map it on its step's path */
        int rc = eng_reserve(e, range, end, !en->is_decode && en->want_logits);
        if (rc < 0)
            return rc;
        e->row0[i] = rows;
        e->batch[i] = (struct model_batch_seq){
            .seq = e->slot_range[en->slot],
            .pos0 = en->pos0,
            .n_tok = en->n_tokens,
            .tokens = e->tok_buf + off,
            .logits = en->want_logits ? e->logits + (size_t)rows * n_vocab : NULL,
            .n_logits = en->want_logits ? 1 + en->n_draft : 0,
        };
        rows += en->want_logits ? 1 + en->n_draft : 0;
        r->lg_skip = 0;
        if (r->on_prompt && !en->is_decode && r->echo_next < r->n_prompt) {
            /* every row of the chunk (its last one samples, when it wants
             * logits), in the echo buffer at the chunk's tokens' offset */
            e->batch[i].logits = e->echo_logits + (size_t)off * n_vocab;
            e->batch[i].n_logits = en->n_tokens;
            r->lg_skip = en->n_tokens - 1;
        }
        e->step_req[i] = r;
        off += en->n_tokens;
    }
    e->decode_map_waits_total += waited;
    return 0;
}

/* After a step: post each decoding sequence's next page, plus a spare one,
 * to the map-ahead thread. Pages inside the sequence's reservation
 * (scheduler's pages_reserved + its shared prefix) are its own already;
 * beyond that it takes only free pages nobody was promised (the budget), so
 * map-ahead does not push the pool into reclaiming under pressure. Each
 * such page still counts as free to the scheduler. O(max_seqs). */
static void eng_map_ahead(struct llmd_engine *e) {
    uint32_t ahead = 0, free_pages = kv_pages_free(e->kv, &ahead);
    uint32_t spare = free_pages - ahead, promised = 0, budget;
    for (uint32_t i = 0; i < e->max_seqs; i++) {
        struct sched_req_info info;
        struct eng_req *r = e->slot_req[i];
        uint32_t range = e->slot_range[i];
        if (!r || range == ENG_NONE || sched_req_info(e->s, r->id, &info) < 0)
            continue;
        uint32_t own = info.pages_reserved + r->n_shared, held = kv_seq_pages(e->kv, range);
        promised += own > held ? own - held : 0;
    }
    budget = spare > promised ? spare - promised : 0;
    for (uint32_t i = 0; i < e->max_seqs; i++) {
        struct sched_req_info info;
        struct eng_req *r = e->slot_req[i];
        uint32_t range = e->slot_range[i];
        if (!r || range == ENG_NONE || sched_req_info(e->s, r->id, &info) < 0 ||
            info.n_computed < info.n_target)
            continue; /* prefilling: its chunks grow it, no decode to spare */
        uint64_t lim = r->max_tokens ? (uint64_t)r->n_prompt + r->max_tokens : e->n_ctx;
        uint32_t own = info.pages_reserved + r->n_shared,
                 mapped = vmm_range_n_mapped(e->kv->vmm, range);
        /* its own unmapped reservation, then the shared budget */
        uint32_t allow = (own > mapped ? own - mapped : 0) + budget;
        /* a speculating sequence's next step may write its draft too: as
         * long as its last outcome allows (a fixed length: spec_tokens) */
        uint32_t k = !r->spec            ? 0
                     : e->spec_fixed_len ? e->spec_tokens
                                         : spec_len_cap(&r->len, e->spec_tokens);
        uint32_t next = info.n_computed + 1 + k;
        kv_seq_ahead(e->kv, range, next, lim < e->n_ctx ? (uint32_t)lim : e->n_ctx, &allow);
        budget = allow < budget ? allow : budget; /* what it took past its own */
    }
}

/* The text of token t for request r into piece (ENG_PIECE_BYTES): what the
 * streaming detokenizer releases; nothing for EOS. Returns its length. */
static size_t eng_piece(struct llmd_engine *e, struct eng_req *r, int32_t t, char *piece) {
    size_t n = 0;
    if (!tok_is_eog(e->m->tok, t) &&
        tok_stream_push(e->m->tok, &r->ts, t, piece, ENG_PIECE_BYTES, &n) < 0)
        n = 0;
    return n;
}

/* Sample every entry that wants logits; results[i] for every entry, and
 * kv_end[i], the positions of entry i's sequence that now hold committed
 * tokens. An entry with a draft is verified position by position: row j of
 * its logits decides the token after position pos0 + j, which commits draft
 * token j when smp_verify() accepts it; the first rejection commits the
 * model's own token instead and ends the run, and a fully accepted draft is
 * followed by the token the last row samples. An accepted EOS ends the run
 * as the last token too (nothing follows it). */
static void eng_sample(struct llmd_engine *e, const struct sched_plan *pl) {
    int32_t eos = tok_eos(e->m->tok);
    uint32_t n_vocab = e->m->hp.n_vocab;
    for (uint32_t i = 0; i < pl->n_entries; i++) {
        const struct sched_entry *en = &pl->entries[i];
        struct sched_result *res = &e->results[i];
        *res = (struct sched_result){.id = en->id, .token = SCHED_TOKEN_NONE};
        e->ev_k[i] = 0;
        e->kv_end[i] = en->pos0 + en->n_tokens;
        if (!en->want_logits)
            continue;
        struct eng_req *r = e->step_req[i];
        const float *lg = e->batch[i].logits + (size_t)r->lg_skip * n_vocab;
        char *pieces = e->pieces + (size_t)e->row0[i] * ENG_PIECE_BYTES;
        int32_t *acc = e->acc + (size_t)i * e->spec_tokens;
        const char **acc_piece = e->acc_piece + (size_t)i * e->spec_tokens;
        size_t *acc_bytes = e->acc_bytes + (size_t)i * e->spec_tokens;
        struct tok_stream *ts_at = e->ts_at + (size_t)i * (e->spec_tokens + 2);
        ts_at[0] = r->ts;
        uint32_t a = 0;
        int32_t t = SCHED_TOKEN_NONE;
        r->lp_row = 0;
        for (uint32_t j = 0; j < en->n_draft; j++) {
            bool ok;
            t = smp_verify(r->smp, lg + (size_t)j * n_vocab, r->draft[j], &ok);
            if (!ok || t == eos || tok_is_eog(e->m->tok, t))
                break;
            smp_accept(r->smp, t); /* the penalties of the next rows count it */
            acc[a] = t;
            acc_piece[a] = pieces + (size_t)a * ENG_PIECE_BYTES;
            acc_bytes[a] = eng_piece(e, r, t, pieces + (size_t)a * ENG_PIECE_BYTES);
            ts_at[a + 1] = r->ts;
            a++;
            t = SCHED_TOKEN_NONE;
        }
        if (t == SCHED_TOKEN_NONE) /* no draft, or all of it accepted */
            t = smp_sample(r->smp, lg + (size_t)a * n_vocab);
        smp_accept(r->smp, t);
        char *piece = pieces + (size_t)a * ENG_PIECE_BYTES;
        res->token = t;
        res->piece = piece;
        res->piece_bytes = eng_piece(e, r, t, piece);
        ts_at[a + 1] = r->ts;
        res->n_accepted = a;
        res->accepted = acc;
        res->accepted_piece = acc_piece;
        res->accepted_piece_bytes = acc_bytes;
        if (en->is_decode)
            e->kv_end[i] = en->pos0 + 1 + a;
        if (en->is_decode && r->spec) {
            spec_len_update(&r->len, en->n_draft, a);
            spec_prior_update(&e->spec_prior, en->n_draft, a);
        }
        if (r->usage)
            r->usage->spec_draft_tokens += en->n_draft;
    }
}

/* Fill r->lp for `token`, r's next committed token this step: committed
 * token k of an entry was decided by row k of its logits (accepted draft
 * tokens first, then the model's own), so rows are taken in event order.
 * O(n_vocab * (1 + n_top)). */
static void eng_logprobs(struct llmd_engine *e, struct eng_req *r, const float *rows,
                         int32_t token) {
    uint32_t n_vocab = e->m->hp.n_vocab;
    struct smp_logprob top[LLMD_TOP_LOGPROBS_MAX];
    const float *lg = rows + (size_t)r->lp_row++ * n_vocab;
    r->lp->chosen.token = token;
    r->lp->n_top = r->n_top;
    smp_logprobs(lg, n_vocab, token, r->n_top, LLMD_LOGPROB_FLOOR, &r->lp->chosen.logprob, top);
    for (uint32_t k = 0; k < r->n_top; k++)
        r->lp->top[k] = (struct llmd_token_logprob){.token = top[k].id, .logprob = top[k].lp};
}

/* on_prompt for the prompt positions this step's chunks computed: row j of
 * a chunk at pos0 predicts the token at pos0 + j + 1. A recomputed chunk
 * (after a preemption) reports nothing twice. O(rows * n_vocab * (1 +
 * n_top)). */
static void eng_echo(struct llmd_engine *e, const struct sched_plan *pl) {
    uint32_t n_vocab = e->m->hp.n_vocab;
    for (uint32_t i = 0; i < pl->n_entries; i++) {
        struct eng_req *r = e->step_req[i];
        const struct model_batch_seq *b = &e->batch[i];
        if (!r->on_prompt || pl->entries[i].is_decode || b->n_logits != b->n_tok)
            continue;
        if (r->echo_next == 0 && b->pos0 == 0) { /* the first token: no logprob */
            e->in_callback = true;
            r->on_prompt(r->user, r->id, 0, r->prompt[0], NULL);
            e->in_callback = false;
            r->echo_next = 1;
        }
        for (uint32_t j = 0; j < b->n_tok; j++) {
            uint32_t q = b->pos0 + j + 1;
            if (q != r->echo_next || q >= r->n_prompt)
                continue;
            struct smp_logprob top[LLMD_TOP_LOGPROBS_MAX];
            struct llmd_logprobs lp = {.chosen.token = r->prompt[q], .n_top = r->n_top};
            smp_logprobs(b->logits + (size_t)j * n_vocab, n_vocab, r->prompt[q], r->n_top,
                         LLMD_LOGPROB_FLOOR, &lp.chosen.logprob, top);
            for (uint32_t k = 0; k < r->n_top; k++)
                lp.top[k] = (struct llmd_token_logprob){.token = top[k].id, .logprob = top[k].lp};
            e->in_callback = true;
            r->on_prompt(r->user, r->id, q, r->prompt[q], &lp);
            e->in_callback = false;
            r->echo_next = q + 1;
        }
    }
}

int llmd_token_bytes(const struct llmd_engine *e, int32_t token, char *buf, size_t cap, size_t *n) {
    return tok_piece(e->m->tok, token, buf, cap, n);
}

/* eng_test_force_spare's choice for the n requests of eng_spec_offer (a
 * linear congruential generator: the same seed, the same run). */
static void eng_test_plan(struct llmd_engine *e, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) {
        e->test_spare_rng = e->test_spare_rng * 1103515245u + 12345u;
        uint32_t q = e->test_spare_rng >> 16;
        e->spec_k[i] = q & 1 ? e->spec_kmax[i] : 0;
        e->spec_spare[i] =
            !(q & 1) && q & 2 && e->spec_lag[i] ? 1 + (q >> 2) % (e->spec_lag[i] + 2) : 0;
    }
}

void eng_test_force_spare(struct llmd_engine *e, uint32_t seed) {
    e->test_spare = seed != 0;
    e->test_spare_rng = seed;
}

uint64_t eng_test_spare_tokens(const struct llmd_engine *e) {
    return e->spare_tokens;
}

/* Before the plan: each decoding request that speculates drafts what
 * follows its text (up to spec_tokens), then the policy cuts each draft to
 * the length its last outcome allows (spec_len_cap) and its acceptance
 * estimate and the step's cost model justify (spec_len_plan; the step's
 * other work: the decodes that do not speculate and the last step's
 * prefill tokens; with a draft model its passes too, including the tokens
 * it has to catch up), and what is left is offered to the scheduler, which
 * may cut it further (budget, pages, max_tokens). O(max_seqs * drafter
 * search). */
static void eng_spec_offer(struct llmd_engine *e) {
    uint32_t n = 0, other = e->last_prefill_tokens;
    for (uint32_t i = 0; e->spec_tokens && i < e->max_seqs; i++) {
        struct eng_req *r = e->slot_req[i];
        struct sched_req_info info;
        if (r)
            r->d_spare = 0;
        if (!r || sched_req_info(e->s, r->id, &info) < 0 || info.state != SCHED_REQ_RUNNING ||
            info.n_computed < info.n_target)
            continue;
        if (!r->spec) {
            other++;
            continue;
        }
        if (e->draft) {
            r->n_draft = e->spec_tokens; /* a draft model drafts as long as asked */
        } else {
            uint32_t n_gen = 0;
            const int32_t *gen = sched_req_generated(e->s, r->id, &n_gen);
            struct spec_text t = {.a = r->prompt, .n_a = r->n_prompt, .b = gen, .n_b = n_gen};
            r->n_draft = spec_ngram_draft(&t, &e->ngram, r->draft, e->spec_tokens);
        }
        e->spec_req[n] = r;
        e->spec_lag[n] = info.n_computed > r->d_comp ? info.n_computed - r->d_comp : 0;
        e->spec_alpha[n] = spec_len_alpha(&r->len, spec_prior_alpha(&e->spec_prior));
        /* the policy: no longer than the last outcome allows */
        e->spec_kmax[n++] = e->spec_fixed_len ? r->n_draft : spec_len_cap(&r->len, r->n_draft);
    }
    struct spec_draft_step ds = {.runs = e->last_prefill_tokens > 0, .lag = e->spec_lag};
    if (e->draft)
        spec_draft_cost(e->draft, &ds.cost);
    if (e->spec_fixed_len)
        memcpy(e->spec_k, e->spec_kmax, n * sizeof(*e->spec_k));
    else
        spec_len_plan(&e->cost, e->draft ? &ds : NULL, e->spec_alpha, e->spec_kmax, n, other,
                      e->spec_k);
    if (e->draft && !e->spec_fixed_len) /* (fixed drafts always draft: nothing lags for long) */
        spec_catch_up_plan(&e->cost, &ds, e->spec_alpha, e->spec_kmax, e->spec_k, n, other,
                           e->spec_spare);
    if (e->draft && e->test_spare)
        eng_test_plan(e, n);
    for (uint32_t i = 0; i < n; i++) {
        struct eng_req *r = e->spec_req[i];
        r->n_draft = e->spec_k[i];
        if (r->n_draft && sched_draft_set(e->s, r->id, r->n_draft) < 0)
            r->n_draft = 0;
        if (e->draft && (!e->spec_fixed_len || e->test_spare) && !r->n_draft)
            r->d_spare = e->spec_spare[i];
    }
}

/* Token at position pos of r's text (prompt ++ generated; pos in range). */
static int32_t eng_text_at(const struct eng_req *r, const int32_t *gen, uint32_t pos) {
    return pos < r->n_prompt ? r->prompt[pos] : gen[pos - r->n_prompt];
}

/* Whether entry en runs through the draft this step: a prefill chunk
 * always (so the prompt's pages hold both models' KV), a decode only when
 * it drafts (one that does not lags, and never makes a step pay its
 * catch-up beyond the spare share the policy grants: d_spare). */
static bool eng_draft_takes(const struct sched_entry *en) {
    return !en->is_decode || en->n_draft > 0;
}

/* Entry i's committed tokens [from, from + n) into the draft's pass at
 * dtok[off..], drafting nothing (a catch-up; n 0: the entry sits out).
 * -EIO when the entry's position is past its text (a bug). */
static int eng_draft_fill(struct llmd_engine *e, const struct sched_plan *pl, uint32_t i,
                          uint32_t from, uint32_t n, uint32_t off) {
    const struct sched_entry *en = &pl->entries[i];
    const struct eng_req *r = e->step_req[i];
    if (n) {
        uint32_t n_gen = 0;
        const int32_t *gen = sched_req_generated(e->s, en->id, &n_gen);
        if (en->pos0 > r->n_prompt + n_gen)
            return -EIO;
        for (uint32_t p = 0; p < n; p++)
            e->dtok[off + p] = eng_text_at(r, gen, from + p);
    }
    e->dseq[i] = (struct spec_draft_seq){
        .seq = e->slot_range[en->slot], .pos0 = from, .n_tok = n, .tokens = e->dtok + off};
    return 0;
}

/* The tokens the draft's first pass runs for the entries it takes (each
 * prefill chunk and drafting decode, from its d_comp; eng_draft_takes). */
static uint64_t eng_draft_need(const struct llmd_engine *e, const struct sched_plan *pl) {
    uint64_t need = 0;
    for (uint32_t i = 0; i < pl->n_entries; i++) {
        const struct sched_entry *en = &pl->entries[i];
        uint32_t from = e->step_req[i]->d_comp < en->pos0 ? e->step_req[i]->d_comp : en->pos0;
        if (eng_draft_takes(en))
            need += (en->is_decode ? en->pos0 + 1 : en->pos0 + en->n_tokens) - from;
    }
    return need;
}

/* Catch the draft up, when the step's tokens and what it has not seen of
 * the committed text do not fit one pass (max_batched + max_seqs tokens):
 * passes of at most that many over the committed tokens before each
 * running entry's own (positions [d_comp, pos0)), in order, drafting
 * nothing, until what is left fits (the entries' own tokens alone fit: the
 * plan's budget). Returns 0, -EIO (a position past the text: a bug), or
 * spec_draft_run()'s error. */
static int eng_draft_catch_up(struct llmd_engine *e, const struct sched_plan *pl) {
    const uint32_t cap = e->max_batched + e->max_seqs;
    for (;;) {
        if (eng_draft_need(e, pl) <= cap)
            return 0;
        uint32_t off = 0;
        for (uint32_t i = 0; i < pl->n_entries; i++) {
            const struct sched_entry *en = &pl->entries[i];
            struct eng_req *r = e->step_req[i];
            uint32_t from = r->d_comp < en->pos0 ? r->d_comp : en->pos0;
            uint32_t n = en->pos0 - from < cap - off ? en->pos0 - from : cap - off;
            if (!eng_draft_takes(en))
                n = 0; /* it sits out */
            if (eng_draft_fill(e, pl, i, from, n, off) < 0)
                return -EIO;
            off += n;
        }
        int rc = spec_draft_run(e->draft, e->dseq, pl->n_entries);
        if (rc < 0)
            return rc;
        for (uint32_t i = 0; i < pl->n_entries; i++)
            if (e->dseq[i].n_tok)
                e->step_req[i]->d_comp = e->dseq[i].pos0 + e->dseq[i].n_tok;
    }
}

/* With a draft model, after the batch is laid out (its pages reserved):
 * the draft runs, of each prefill chunk and each drafting decode, the
 * committed tokens it has not seen (from its d_comp: the chunk, or the
 * decode's last token and what it has not caught up of the tokens before
 * it), and drafts each drafting decode's n_draft tokens, which then go into
 * the target's batch after its last generated token. A prefill chunk runs
 * through it whether its request speculates or not, so a prompt's pages
 * hold both models' KV. A decode that drafts nothing stays out: its d_comp
 * lags, and it catches up in the step it next drafts in (the policy prices
 * that, spec.h), so no step pays for another request's lag; a step with
 * neither skips the draft. Pages are sealed only up to d_comp. Returns 0,
 * -EIO (a position gap: a bug), or spec_draft_run()'s error. */
static int eng_draft_run(struct llmd_engine *e, const struct sched_plan *pl) {
    uint32_t off = 0, cap = e->max_batched + e->max_seqs;
    bool run = false;
    for (uint32_t i = 0; i < pl->n_entries; i++)
        run |= eng_draft_takes(&pl->entries[i]) || e->step_req[i]->d_spare > 0;
    e->draft_ran = run;
    e->draft_ns = 0;
    if (!run)
        return 0;
    uint64_t t0 = eng_now();
    int rc = eng_draft_catch_up(e, pl);
    if (rc < 0)
        return rc;
    /* the spare catch-up gets what the pass has left after the entries' own
     * (which fit: eng_draft_catch_up) */
    uint32_t spare_left = cap - (uint32_t)eng_draft_need(e, pl);
    for (uint32_t i = 0; i < pl->n_entries; i++) {
        const struct sched_entry *en = &pl->entries[i];
        struct eng_req *r = e->step_req[i];
        uint32_t from = r->d_comp < en->pos0 ? r->d_comp : en->pos0;
        uint32_t end = en->is_decode ? en->pos0 + 1 : en->pos0 + en->n_tokens, n_gen = 0;
        if (!eng_draft_takes(en)) {
            /* a spare catch-up: committed tokens before its own, nothing drafted */
            uint32_t n = en->is_decode ? r->d_spare : 0;
            n = n < en->pos0 - from ? n : en->pos0 - from;
            n = n < spare_left ? n : spare_left;
            r->d_spare = 0;
            if (eng_draft_fill(e, pl, i, from, n, off) < 0)
                return -EIO;
            off += n;
            spare_left -= n;
            e->spare_tokens += n;
            continue;
        }
        const int32_t *gen = sched_req_generated(e->s, en->id, &n_gen);
        if (end - from > cap - off || end > r->n_prompt + n_gen)
            return -EIO;
        for (uint32_t p = from; p < end; p++)
            e->dtok[off + p - from] = eng_text_at(r, gen, p);
        e->dseq[i] = (struct spec_draft_seq){.seq = e->slot_range[en->slot],
                                             .pos0 = from,
                                             .n_tok = end - from,
                                             .tokens = e->dtok + off,
                                             .n_draft = en->is_decode ? en->n_draft : 0,
                                             .draft = r->draft};
        off += end - from;
    }
    rc = spec_draft_run(e->draft, e->dseq, pl->n_entries);
    e->draft_ns = eng_now() - t0;
    for (uint32_t i = 0; rc == 0 && i < pl->n_entries; i++) {
        /* the draft after the entry's first token, in the target's batch */
        int32_t *t = e->tok_buf + (e->batch[i].tokens - e->tok_buf);
        for (uint32_t j = 0; j < e->dseq[i].n_draft; j++)
            t[1 + j] = e->step_req[i]->draft[j];
    }
    return rc;
}

/* After sampling, with a draft model: the positions that hold the draft's
 * KV of committed tokens. A prefill chunk's all; a decode's last token
 * (position pos0) and the draft tokens it ran that were accepted: it ran
 * drafts 1..n-1 at pos0 + 1.., so a fully accepted draft leaves its last
 * token for the next step. Nothing for an entry the draft did not run (a
 * decode that drafted nothing, or a step it skipped). */
static void eng_draft_commit(struct llmd_engine *e, const struct sched_plan *pl) {
    for (uint32_t i = 0; e->draft && e->draft_ran && i < pl->n_entries; i++) {
        const struct sched_entry *en = &pl->entries[i];
        if (!eng_draft_takes(en)) { /* a spare catch-up's tokens, if it had any */
            if (e->dseq[i].n_tok)
                e->step_req[i]->d_comp = e->dseq[i].pos0 + e->dseq[i].n_tok;
            continue;
        }
        uint32_t n = en->n_draft, a = e->results[i].n_accepted;
        e->step_req[i]->d_comp = !en->is_decode ? en->pos0 + en->n_tokens
                                 : n == 0       ? en->pos0 + 1
                                 : a < n        ? en->pos0 + a + 1
                                                : en->pos0 + n;
    }
}

/* After sched_complete: every sequence that verified a draft goes back to
 * its committed tokens (the scheduler's n_computed), its rejected
 * positions' pages returned to the pool. Returns 0 or kv_seq_trim()'s
 * error (the step then fails). */
static int eng_spec_rollback(struct llmd_engine *e, const struct sched_plan *pl) {
    for (uint32_t i = 0; i < pl->n_entries; i++) {
        const struct sched_entry *en = &pl->entries[i];
        struct sched_req_info info;
        if (!en->n_draft || !e->step_req[i] || sched_req_info(e->s, en->id, &info) < 0 ||
            e->slot_range[en->slot] == ENG_NONE)
            continue; /* finished: its range is gone already */
        int rc = kv_seq_trim(e->kv, e->slot_range[en->slot], info.n_computed);
        if (rc < 0)
            return rc;
        e->spec_rollback_pages_total += (uint64_t)rc;
    }
    return 0;
}

/* Nothing runs and nothing could be admitted while waiting requests hold
 * pins: the first in line may need the very cached pages that requests
 * behind it pinned for their hits, and with nothing running no page would
 * ever come free. Drop every waiting request's hit (they prefill those
 * pages instead), so the whole pool is free or evictable and the first in
 * line fits (a request alone always fits the pool). They look up again
 * once new pages enter the cache. O(requests). */
static bool eng_unstall(struct llmd_engine *e, const struct sched_plan *pl) {
    if (pl->n_entries || pl->n_admitted || e->n_pinned == 0)
        return false;
    for (uint32_t i = 0; i < e->max_seqs; i++)
        if (e->slot_range[i] != ENG_NONE)
            return false;
    for (struct eng_req *r = e->reqs; r; r = r->next) {
        if (!r->pinned)
            continue;
        eng_req_unpin(e, r);
        r->n_hits = 0;
        sched_set_cached(e->s, r->id, 0);
    }
    return true;
}

/* Once a step with tiers: reap NVMe completions, and feed the policy the
 * prefill rate of steps that were mostly prefill (a moving average). */
static void eng_offload_tick(struct llmd_engine *e, const struct sched_plan *pl, uint64_t fwd_ns) {
    ofl_poll(e->ofl);
    uint32_t n_tok = 0;
    for (uint32_t i = 0; i < pl->n_entries; i++)
        n_tok += pl->entries[i].n_tokens;
    if (n_tok < 2 * pl->n_entries || n_tok < e->tpp || fwd_ns == 0)
        return; /* decode-heavy: says little about prefill */
    double rate = 1e9 * n_tok / (double)fwd_ns;
    e->prefill_tok_s = e->prefill_tok_s > 0 ? 0.9 * e->prefill_tok_s + 0.1 * rate : rate;
    ofl_prefill_rate_set(e->ofl, e->prefill_tok_s);
}

/* After a step with speculation on: the policy's cost model is the
 * forward pass's, fitted over the steps (spec_fit: the probe's, corrected
 * by what the steps took), plus the step's own work around it (planning,
 * drafting, sampling, callbacks) in the fixed part, a moving average over
 * steps (weight 1/8: a few steps follow a change, one slow step does not
 * decide); and the step's prefill tokens predict the next one's. */
static void eng_step_time(struct llmd_engine *e, const struct sched_plan *pl, uint64_t step_ns,
                          uint64_t fwd_ns) {
    /* the draft model's passes are left out: they are no fixed cost of the
     * step (they grow with the drafts), and the model has no term for them */
    uint64_t busy = fwd_ns + e->draft_ns;
    double over = step_ns > busy ? (double)(step_ns - busy) : 0;
    e->step_overhead_ns =
        e->step_overhead_ns > 0 ? 0.875 * e->step_overhead_ns + 0.125 * over : over;
    e->last_prefill_tokens = pl->n_prefill_tokens;
    if (!e->fit_on)
        return;
    /* decode-only steps: a prefill chunk's tokens share their matrix
     * products and cost a third of a decode row's at a long context, and
     * with their leverage they would bend the line toward a cheap token */
    if (pl->n_prefill_tokens == 0)
        spec_fit_add(&e->fit, pl->n_tokens, (double)fwd_ns);
    spec_fit_get(&e->fit, &e->cost);
    e->cost.fixed_ns += e->step_overhead_ns;
}

int llmd_engine_step(struct llmd_engine *e) {
    if (e->in_callback)
        return -EBUSY;
    if (e->broken)
        return -EIO;
    uint64_t now = eng_now();
    kvev_flush(e->kvev); /* the last step's events (and an admin call's since): one batch */
    if (e->pfx) {
        eng_relookup(e);
        eng_hold_update(e);
    }
    eng_spec_offer(e);
    struct sched_plan pl;
    int rc = sched_plan(e->s, now, &pl);
    if (rc == 0 && eng_unstall(e, &pl))
        rc = sched_plan(e->s, now, &pl);
    if (rc < 0)
        return eng_fail(e, rc);
    if ((rc = eng_apply_plan(e, &pl)) < 0)
        return eng_fail(e, rc);
    if (pl.n_entries == 0)
        return (int)e->n_reqs;
    if ((rc = eng_build_batch(e, &pl)) < 0 || (e->draft && (rc = eng_draft_run(e, &pl)) < 0))
        return eng_fail(e, rc);
    uint64_t t_fwd = eng_now();
    if ((rc = model_forward_batch(e->ctx, e->kv, e->batch, pl.n_entries)) < 0)
        return eng_fail(e, rc);
    uint64_t fwd_ns = eng_now() - t_fwd;
    if (e->ofl)
        eng_offload_tick(e, &pl, eng_now() - t_fwd);
    eng_echo(e, &pl);
    eng_sample(e, &pl);
    eng_draft_commit(e, &pl);
    eng_insert_pages(e, &pl);
    eng_window_drop(e, &pl);
    const struct sched_event *ev;
    uint32_t n_ev;
    if ((rc = sched_complete(e->s, e->results, pl.n_entries, eng_now(), &ev, &n_ev)) < 0)
        return eng_fail(e, rc);
    for (uint32_t j = 0; j < n_ev; j++) {
        /* step_req[i] is cleared when its request is freed below, so a
         * later event never looks at a freed record */
        uint32_t i = 0;
        while (i < pl.n_entries && !(e->step_req[i] && e->step_req[i]->id == ev[j].id))
            i++;
        if (NEVER(i == pl.n_entries))
            continue;
        struct eng_req *r = e->step_req[i];
        enum llmd_finish f = eng_finish(ev[j].finish);
        if (r->prompt_only) { /* max_tokens 1: this is its finish */
            eng_emit(e, r, -1, "", 0, LLMD_FINISH_LENGTH);
            if (ev[j].slot != SCHED_SLOT_NONE)
                eng_slot_release(e, ev[j].slot);
            e->step_req[i] = NULL;
            eng_req_free(e, r);
            continue;
        }
        /* a returned token: the first n_accepted of an entry's are its draft's */
        e->generated_tokens_total++;
        if (r->usage) {
            r->usage->completion_tokens++;
            if (e->results[i].n_accepted > 0) {
                r->usage->spec_accepted_tokens++;
                e->results[i].n_accepted--;
            }
        }
        if (r->lp)
            eng_logprobs(e, r, e->batch[i].logits + (size_t)r->lg_skip * e->m->hp.n_vocab,
                         ev[j].token);
        eng_emit_token(e, r, i, &ev[j], f);
        if (f != LLMD_FINISH_NONE) {
            if (ev[j].slot != SCHED_SLOT_NONE)
                eng_slot_release(e, ev[j].slot);
            e->step_req[i] = NULL;
            eng_req_free(e, r);
        }
    }
    if ((rc = eng_spec_rollback(e, &pl)) < 0)
        return eng_fail(e, rc);
    eng_map_ahead(e);
    if (e->spec_tokens)
        eng_step_time(e, &pl, eng_now() - now, fwd_ns);
    return (int)e->n_reqs;
}

void llmd_engine_sync(struct llmd_engine *e) {
    kv_ahead_sync(e->kv);
}

int llmd_engine_check(const struct llmd_engine *e) {
    return kv_check(e->kv) && sched_check(e->s);
}

int llmd_tenant_set(struct llmd_engine *e, uint32_t tenant, uint32_t weight, int32_t max_priority) {
    struct sched_tenant_config t = {
        .tenant = tenant, .weight = weight, .max_priority = max_priority};
    return sched_tenant_set(e->s, &t);
}

int llmd_tenant_retention(struct llmd_engine *e, uint32_t tenant, uint32_t max_pages) {
    if (!e->pfx)
        return -ENOTSUP;
    return pfx_tenant_limit(e->pfx, tenant, max_pages);
}

void llmd_engine_info_get(const struct llmd_engine *e, struct llmd_engine_info *out) {
    *out = e->info;
    out->spec_step_fixed_ns = (uint64_t)e->cost.fixed_ns; /* as fitted now */
    out->spec_step_token_ns = (uint64_t)e->cost.token_ns;
    if (e->draft) {
        struct spec_cost dc;
        spec_draft_cost(e->draft, &dc);
        out->spec_draft_fixed_ns = (uint64_t)dc.fixed_ns;
        out->spec_draft_token_ns = (uint64_t)dc.token_ns;
    }
}

void llmd_stats_get(const struct llmd_engine *e, struct llmd_stats *out) {
    struct sched_stats ss;
    struct vmm_stats vs;
    uint32_t ahead = 0;
    sched_stats_get(e->s, &ss);
    vmm_stats_get(e->kv->vmm, &vs);
    *out = (struct llmd_stats){
        .requests_waiting = ss.waiting,
        .requests_running = ss.running,
        .prompt_tokens_total = e->prompt_tokens_total,
        .generated_tokens_total = e->generated_tokens_total,
        .preemptions_total = ss.preemptions_total,
        .refusals_total = ss.refusals_total,
        .steps_total = ss.steps_total,
        .prefill_tokens_total = ss.prefill_tokens_total,
        .prefix_hit_tokens_total = e->prefix_hit_tokens_total,
        .prefix_query_tokens_total = e->prefix_query_tokens_total,
        .kv_pages_total = vs.n_pages,
        .kv_pages_free = kv_pages_free(e->kv, &ahead),
        .kv_pages_cached = vs.pages_cached,
        .kv_page_bytes = vs.page_bytes,
        .kv_token_bytes = e->kv->stride_bytes,
        .kv_draft_token_bytes = e->kv->draft_bytes,
        .kv_draft_bytes = (vs.pages_mapped + vs.pages_cached) * vs.page_bytes / vs.token_bytes *
                          e->kv->draft_bytes,
        .kv_type = (uint64_t)e->info.kv_type,
        .restored_tokens_total = e->restored_tokens_total,
        .prefill_tokens_per_s = e->prefill_tok_s,
        .decode_map_waits_total = e->decode_map_waits_total,
        .spec_steps_total = ss.spec_steps_total,
        .spec_draft_tokens_total = ss.spec_draft_tokens_total,
        .spec_accepted_tokens_total = ss.spec_accepted_tokens_total,
        .spec_rollback_pages_total = e->spec_rollback_pages_total,
        .kv_window_dropped_pages_total = e->window_dropped_pages_total,
        .cpu_solo_periods_total = kern_pool_solo_periods(e->pool),
    };
    for (int a = 0; a <= LLMD_SPEC_TOKENS_MAX; a++)
        out->spec_accepted_len[a] = ss.spec_accepted_len[a];
    out->kv_pages_ahead = ahead;
    if (e->kvev) {
        struct kvev_stats ks;
        kvev_stats_get(e->kvev, &ks);
        out->kv_events_total = ks.events_total;
        out->kv_events_dropped_total = ks.dropped_events_total;
        out->kv_event_batches_total = ks.batches_total;
    }
    if (!e->ofl)
        return;
    struct ofl_stats os;
    ofl_stats_get(e->ofl, &os);
    out->host_tier_pages = os.host_pages;
    out->host_tier_bytes_used = os.host_used_bytes;
    out->nvme_tier_pages = os.nvme_pages;
    out->spills_host_total = os.spills_total[OFL_TIER_HOST];
    out->spills_nvme_total = os.spills_total[OFL_TIER_NVME];
    out->restores_host_total = os.restores_total[OFL_TIER_HOST];
    out->restores_nvme_total = os.restores_total[OFL_TIER_NVME];
    out->spill_bytes_host_total = os.spill_bytes_total[OFL_TIER_HOST];
    out->spill_bytes_nvme_total = os.spill_bytes_total[OFL_TIER_NVME];
    out->restore_bytes_host_total = os.restore_bytes_total[OFL_TIER_HOST];
    out->restore_bytes_nvme_total = os.restore_bytes_total[OFL_TIER_NVME];
    out->offload_drops_total = os.drops_total;
    out->offload_write_failures_total = os.write_failures_total;
    out->offload_checksum_failures_total = os.checksum_failures_total;
    out->host_tier_bw_bytes_per_s = os.host_bw_bytes_per_s;
    out->nvme_read_bw_bytes_per_s = os.nvme_read_bw_bytes_per_s;
}

_Static_assert(sizeof(struct pfx_hash) == 32, "a block hash is 32 bytes");

int llmd_kv_blocks(const struct llmd_engine *e, enum llmd_tier tier, uint8_t (*hashes)[32],
                   uint32_t max) {
    if (!e->pfx)
        return -ENOTSUP;
    uint32_t n;
    switch (tier) {
    case LLMD_TIER_DEVICE:
        n = pfx_hashes(e->pfx, (struct pfx_hash *)hashes, max);
        break;
    case LLMD_TIER_HOST:
    case LLMD_TIER_NVME:
        n = e->ofl ? ofl_hashes(e->ofl, tier == LLMD_TIER_HOST ? OFL_TIER_HOST : OFL_TIER_NVME,
                                hashes, max)
                   : 0;
        break;
    default:
        return -EINVAL;
    }
    return n > INT32_MAX ? INT32_MAX : (int)n;
}

int llmd_pool_map(const struct llmd_engine *e, char *buf, size_t len) {
    int rc = vmm_pool_map_format(e->kv->vmm, buf, len);
    /* pages past a sequence's need were mapped ahead: 'a'. The thread may
     * map more after the snapshot; those still read '.', and stay so */
    for (uint32_t i = 0; rc == 0 && i < e->max_seqs; i++) {
        uint32_t range = e->slot_range[i];
        if (range == ENG_NONE)
            continue;
        for (uint32_t k = kv_seq_pages(e->kv, range);; k++) {
            uint32_t p = vmm_range_page(e->kv->vmm, range, k);
            if (p == VMM_PAGE_NONE)
                break;
            size_t at = (size_t)p + p / 64;
            if (at < len && buf[at] == 'M')
                buf[at] = 'a';
        }
    }
    return rc;
}

int llmd_request_pages(const struct llmd_engine *e, uint64_t id, uint32_t *pages, uint32_t max) {
    for (const struct eng_req *r = e->reqs; r; r = r->next) {
        if (r->id != id)
            continue;
        if (r->slot == ENG_NONE || e->slot_range[r->slot] == ENG_NONE)
            return -ENOENT;
        uint32_t range = e->slot_range[r->slot], n = kv_seq_pages(e->kv, range);
        for (uint32_t i = 0; i < n && i < max; i++)
            pages[i] = vmm_range_page(e->kv->vmm, range, i);
        return (int)n;
    }
    return -ENOENT;
}

/* After a purge: the tenant's live requests stop adding pages to the cache,
 * and waiting requests of any tenant (a shared namespace) let go of pinned
 * hits the purge took out of the index, so none is admitted with a purged
 * page. Every request, not only the ENG_RELOOKUP_MAX a step looks up again:
 * the oldest, admitted first, are the ones a bounded walk would miss.
 * O(requests + pinned pages). */
static void eng_purge_reqs(struct llmd_engine *e, uint32_t tenant) {
    for (struct eng_req *r = e->reqs; r; r = r->next) {
        if (r->tenant == tenant)
            r->purged = true;
        if (r->slot != ENG_NONE || !r->pinned)
            continue;
        uint32_t keep = 0;
        while (keep < r->n_hits && pfx_contains(e->pfx, &r->chain[keep]))
            keep++;
        if (keep == r->n_hits)
            continue;
        for (uint32_t k = keep; k < r->n_hits; k++)
            vmm_page_unpin(e->kv->vmm, r->hits[k]);
        e->n_pinned -= r->n_hits - keep;
        r->n_hits = keep;
        sched_set_cached(e->s, r->id, keep * e->tpp);
    }
}

int llmd_tenant_purge(struct llmd_engine *e, uint32_t tenant, struct llmd_purge_counts *out) {
    if (e->in_callback)
        return -EBUSY;
    if (!e->pfx)
        return -ENOTSUP;
    struct llmd_purge_counts pc = {0};
    int rc = pfx_purge_tenant(e->pfx, tenant, &pc.device_pages);
    if (rc == 0 && e->ofl) {
        struct ofl_purge_counts oc;
        rc = ofl_purge_tenant(e->ofl, tenant, &oc);
        pc.host_pages = oc.host_pages;
        pc.nvme_pages = oc.nvme_pages;
    }
    eng_purge_reqs(e, tenant);
    /* the requests whose hits were cut look up again (what is left) */
    e->insert_gen++;
    if (out)
        *out = pc;
    return rc;
}

uint32_t llmd_evictions_read(struct llmd_engine *e, uint64_t *cursor, struct llmd_eviction *out,
                             uint32_t max, uint64_t *lost) {
    if (lost)
        *lost = 0;
    if (!e->ofl)
        return 0;
    struct ofl_event ev[64];
    uint32_t n = 0;
    while (n < max) {
        uint32_t want = max - n < 64 ? max - n : 64;
        uint64_t l = 0;
        uint32_t got = ofl_log_read(ofl_eviction_log(e->ofl), cursor, ev, want, &l);
        if (lost)
            *lost += l;
        for (uint32_t i = 0; i < got; i++, n++) {
            out[n] = (struct llmd_eviction){
                .seq = ev[i].seq,
                .time_ns = ev[i].time_ns,
                .page = ev[i].page,
                .tenant = ev[i].tenant,
                .bytes = ev[i].bytes,
                .from = ev[i].from,
                .to = ev[i].to,
                .reason = ofl_reason_name(ev[i].reason),
            };
            memcpy(out[n].hash, ev[i].hash, sizeof ev[i].hash);
        }
        if (got < want)
            break;
    }
    return n;
}
