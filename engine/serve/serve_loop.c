/* serve_loop.c - the engine thread, its command queue, and the requests'
 * published state (see serve_loop.h for the model).
 *
 * A request (struct serve_req) has three kinds of fields: fixed at
 * creation; engine-thread only (its id, the text on_token appended since the
 * last publication, timing); and published, under l->mu (the text its
 * waiter has not taken, counters, finish). It is reference counted under
 * l->mu: the submitter's reference, the engine's (from a successful
 * llmd_submit() to the publication of its finish), and one for a queued
 * cancel command, which is embedded in the request so that cancelling never
 * allocates.
 *
 * Bounds: each loop iteration runs the commands queued so far (one
 * llmd_submit or llmd_cancel each), at most one llmd_engine_step(), and one
 * publication that is O(requests touched by that step).
 */
#include "engine/serve/serve_loop.h"

#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <time.h>

#include "engine/serve/req.h"
#include "log.h"
#include "mem.h"

enum serve_cmd_kind { SERVE_CMD_SUBMIT, SERVE_CMD_CANCEL, SERVE_CMD_LIST, SERVE_CMD_CALL };

struct serve_cmd {
    enum serve_cmd_kind kind;
    struct serve_req *r;
    const struct llmd_request *q; /* SUBMIT: borrowed from the waiting submitter */
    int rc;                       /* SUBMIT: llmd_submit()'s result */
    struct serve_seq *seqs;       /* LIST: [cap], the waiter's */
    uint32_t cap, n, total;
    int (*fn)(struct llmd_engine *e, void *arg); /* CALL */
    void *arg;
    uint32_t retry_after_s;
    bool done; /* under mu */
    struct serve_cmd *next;
};

struct serve_req {
    /* fixed at creation */
    struct serve_loop *l;
    uint64_t arrival_ns;
    pthread_cond_t cv;           /* published state changed */
    struct serve_cmd cancel_cmd; /* queued at most once (cancel_queued) */
    /* engine thread only */
    uint64_t id;
    bool live; /* submitted, finish not yet delivered by on_token */
    struct serve_req *live_prev, *live_next;
    bool touched; /* on l->touched */
    struct serve_req *touched_next;
    bool doomed; /* on l->doomed, holding a reference */
    bool failed; /* text was lost (no memory): cancel, report an error */
    char *pend;  /* [n_pend] text since the last publication */
    size_t n_pend, cap_pend;
    uint32_t pend_tokens;
    enum llmd_finish pend_finish;
    struct llmd_usage usage; /* the engine writes it (engine thread) */
    bool want_lp;            /* logprobs asked: the engine fills lp before each token */
    struct llmd_logprobs lp;
    struct req_lp_buf pend_lp; /* records since the last publication */
    uint32_t n_tokens;         /* sampled so far */
    uint32_t tenant;
    int32_t priority;
    uint64_t t_last_ns; /* the last token's time, 0 before the first */
    struct serve_req *doomed_next;
    /* under l->mu */
    int refs;
    struct serve_req *wake; /* its publications wake this one's waiter too (a reference) */
    bool cancel_queued;
    char *text; /* [n_text] published, not yet taken by the waiter */
    size_t n_text, cap_text;
    struct req_lp_buf lp_pub; /* logprob records published, not yet taken */
    struct serve_progress prog;
};

struct serve_loop {
    struct llmd_engine *e;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv_engine; /* work for the engine thread */
    pthread_cond_t cv_done;   /* a submission was answered */
    /* under mu */
    struct serve_cmd *q_head, *q_tail;
    bool closed;     /* submissions refused */
    bool cancel_all; /* engine thread: cancel every live request */
    bool stop;       /* engine thread: exit once nothing is live or queued */
    struct serve_metrics pub;
    /* engine thread only */
    struct serve_metrics loc;
    struct serve_req *live_head;
    struct serve_req *touched;
    struct serve_req *doomed;
    bool spec; /* the engine speculates (constant) */
};

/* --- histograms ----------------------------------------------------------- */

/* Bucket bounds in seconds. TTFT and end-to-end span a tiny model on a
 * loopback (milliseconds) to long prompts on a CPU (minutes); ITL is one
 * decode step (sub-millisecond to seconds); queue time is zero when idle
 * and bounded by --max-queue-wait otherwise. */
static const double serve_le_ttft[] = {0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
                                       0.75,  1,    2.5,  5,    7.5,  10,   20,  40,   80};
static const double serve_le_itl[] = {0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.04,
                                      0.05,  0.075,  0.1,   0.15, 0.2,  0.3,  0.4,
                                      0.5,   0.75,   1,     2.5,  5,    10};
static const double serve_le_e2e[] = {0.1, 0.25, 0.5, 1,  2.5, 5,   10,  15,
                                      20,  30,   40,  60, 120, 240, 480, 960};
static const double serve_le_queue[] = {0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                        1,     2.5,   5,    10,    30,   60,  120};

#define SERVE_N(a) ((uint32_t)(sizeof(a) / sizeof((a)[0])))

const double *serve_hist_bounds(enum serve_hist_kind k, uint32_t *n) {
    switch (k) {
    case SERVE_HIST_TTFT:
        *n = SERVE_N(serve_le_ttft);
        return serve_le_ttft;
    case SERVE_HIST_ITL:
        *n = SERVE_N(serve_le_itl);
        return serve_le_itl;
    case SERVE_HIST_E2E:
        *n = SERVE_N(serve_le_e2e);
        return serve_le_e2e;
    default:
        *n = SERVE_N(serve_le_queue);
        return serve_le_queue;
    }
}

_Static_assert(SERVE_N(serve_le_itl) <= SERVE_HIST_MAX_BUCKETS, "ITL buckets fit");
_Static_assert(SERVE_N(serve_le_ttft) <= SERVE_HIST_MAX_BUCKETS, "TTFT buckets fit");

static void serve_observe(struct serve_loop *l, enum serve_hist_kind k, uint64_t ns) {
    uint32_t n;
    const double *le = serve_hist_bounds(k, &n);
    double s = (double)ns * 1e-9;
    uint32_t i = 0;
    while (i < n && s > le[i])
        i++;
    struct serve_hist *h = &l->loc.hist[k];
    h->counts[i]++;
    h->sum += s;
    h->n++;
}

static uint64_t serve_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* --- requests ------------------------------------------------------------- */

static void serve_req_free(struct serve_req *r) {
    pthread_cond_destroy(&r->cv);
    mem_free(r->text);
    mem_free(r->pend);
    req_lp_buf_free(&r->pend_lp);
    req_lp_buf_free(&r->lp_pub);
    mem_free(r);
}

/* Drop one reference; caller holds mu. */
static void serve_req_unref_locked(struct serve_req *r) {
    while (r && --r->refs == 0) { /* the one it woke loses a reference too */
        struct serve_req *w = r->wake;
        serve_req_free(r);
        r = w;
    }
}

static void serve_touch(struct serve_loop *l, struct serve_req *r) {
    if (r->touched)
        return;
    r->touched = true;
    r->touched_next = l->touched;
    l->touched = r;
}

static void serve_live_unlink(struct serve_loop *l, struct serve_req *r) {
    if (r->live_prev)
        r->live_prev->live_next = r->live_next;
    else
        l->live_head = r->live_next;
    if (r->live_next)
        r->live_next->live_prev = r->live_prev;
    r->live_prev = r->live_next = NULL;
    r->live = false;
    l->loc.live--;
}

/* The engine's callback, on the engine thread inside llmd_engine_step() or
 * llmd_cancel(). Records, never blocks, never locks. */
static void serve_on_token(void *user, uint64_t id, int32_t token, const char *text, size_t len,
                           enum llmd_finish finish) {
    (void)id;
    struct serve_req *r = user;
    struct serve_loop *l = r->l;
    uint64_t now = serve_now();
    if (token >= 0) {
        r->pend_tokens++;
        r->n_tokens++;
        if (r->t_last_ns == 0) {
            serve_observe(l, SERVE_HIST_TTFT, now - r->arrival_ns);
            /* the first token comes after the first admission: its queue
             * time is final */
            if (r->usage.queue_ns)
                serve_observe(l, SERVE_HIST_QUEUE, r->usage.queue_ns);
        } else {
            serve_observe(l, SERVE_HIST_ITL, now - r->t_last_ns);
        }
        r->t_last_ns = now;
        /* an EOS has no text, and OpenAI lists no logprob for it */
        if (r->want_lp && finish != LLMD_FINISH_EOS && !r->failed &&
            req_lp_push(&r->pend_lp, l->e, &r->lp) < 0)
            r->failed = true;
    }
    if (len && !r->failed) {
        if (r->n_pend + len > r->cap_pend) {
            size_t cap = r->cap_pend ? r->cap_pend * 2 : 256;
            while (cap < r->n_pend + len)
                cap *= 2;
            char *p = mem_realloc(r->pend, cap);
            if (!p) {
                r->failed = true; /* cancelled after the step: see serve_doom() */
                goto out;
            }
            r->pend = p;
            r->cap_pend = cap;
        }
        memcpy(r->pend + r->n_pend, text, len);
        r->n_pend += len;
    }
out:
    if (finish != LLMD_FINISH_NONE) {
        serve_observe(l, SERVE_HIST_E2E, now - r->arrival_ns);
        if (r->failed)
            finish = LLMD_FINISH_ERROR;
        l->loc.finished_total[finish]++;
        r->pend_finish = finish;
        serve_live_unlink(l, r);
    }
    serve_touch(l, r);
}

/* The engine's on_prompt (echo with logprobs): a record per prompt token,
 * before the first generated one. Engine thread, as serve_on_token. */
static void serve_on_prompt(void *user, uint64_t id, uint32_t pos, int32_t token,
                            const struct llmd_logprobs *lp) {
    (void)id, (void)pos;
    struct serve_req *r = user;
    if (!r->failed && (lp ? req_lp_push(&r->pend_lp, r->l->e, lp)
                          : req_lp_push_first(&r->pend_lp, r->l->e, token)) < 0)
        r->failed = true;
    serve_touch(r->l, r);
}

/* --- the engine thread ---------------------------------------------------- */

/* Publish touched requests, the metrics, and the answered commands, then
 * wake their waiters. Engine thread; takes mu. */
static void serve_publish(struct serve_loop *l, struct serve_cmd *done) {
    llmd_stats_get(l->e, &l->loc.engine);
    pthread_mutex_lock(&l->mu);
    for (struct serve_req *r = l->touched, *next; r; r = next) {
        next = r->touched_next;
        r->touched = false;
        r->touched_next = NULL;
        if (r->n_pend && !r->failed && r->n_text + r->n_pend > r->cap_text) {
            size_t cap = (r->n_text + r->n_pend) * 2;
            char *p = mem_realloc(r->text, cap);
            if (p) {
                r->text = p;
                r->cap_text = cap;
            } else {
                r->failed = true;
            }
        }
        if (r->n_pend && !r->failed) {
            memcpy(r->text + r->n_text, r->pend, r->n_pend);
            r->n_text += r->n_pend;
            r->prog.text_bytes += r->n_pend;
        }
        r->n_pend = 0;
        if (r->pend_lp.n && !r->failed) {
            struct req_lp_buf *b = &r->lp_pub;
            if (b->n == 0) { /* the usual case: hand the whole buffer over */
                struct req_lp_buf t = *b;
                *b = r->pend_lp;
                r->pend_lp = t;
            } else {
                size_t n = b->n + r->pend_lp.n;
                char *p = n > b->cap ? mem_realloc(b->p, n * 2) : b->p;
                if (p) {
                    if (n > b->cap)
                        b->cap = n * 2;
                    b->p = p;
                    memcpy(b->p + b->n, r->pend_lp.p, r->pend_lp.n);
                    b->n = n;
                } else {
                    r->failed = true;
                }
            }
        }
        r->pend_lp.n = 0;
        if (r->failed && r->pend_finish != LLMD_FINISH_NONE &&
            r->pend_finish != LLMD_FINISH_ERROR) { /* text lost: not a clean finish */
            l->loc.finished_total[r->pend_finish]--;
            l->loc.finished_total[LLMD_FINISH_ERROR]++;
            r->pend_finish = LLMD_FINISH_ERROR;
        }
        if (r->failed && r->live && !r->doomed) { /* cancelled at the next iteration */
            r->doomed = true;
            r->refs++;
            r->doomed_next = l->doomed;
            l->doomed = r;
        }
        r->prog.completion_tokens += r->pend_tokens;
        r->pend_tokens = 0;
        r->prog.cached_tokens = r->usage.cached_tokens; /* the last admission's */
        r->prog.spec_draft_tokens = r->usage.spec_draft_tokens;
        r->prog.spec_accepted_tokens = r->usage.spec_accepted_tokens;
        pthread_cond_broadcast(&r->cv);
        if (r->wake)
            pthread_cond_broadcast(&r->wake->cv);
        if (r->pend_finish != LLMD_FINISH_NONE) {
            r->prog.finish = r->pend_finish;
            r->pend_finish = LLMD_FINISH_NONE;
            serve_req_unref_locked(r); /* the engine's reference */
        }
    }
    l->touched = NULL;
    l->pub = l->loc;
    bool answered = false;
    for (struct serve_cmd *c = done, *next; c; c = next) {
        /* a submit command lives on its waiter's stack, a cancel command
         * inside its request: neither is touched after this */
        next = c->next;
        struct serve_req *r = c->r;
        bool unref = c->kind == SERVE_CMD_CANCEL || (c->kind == SERVE_CMD_SUBMIT && c->rc < 0);
        answered |= c->kind != SERVE_CMD_CANCEL;
        c->done = true;
        if (unref) /* the queued cancel's, or the engine's of a failed submit */
            serve_req_unref_locked(r);
    }
    if (answered)
        pthread_cond_broadcast(&l->cv_done);
    pthread_mutex_unlock(&l->mu);
}

static void serve_run_submit(struct serve_loop *l, struct serve_cmd *c) {
    struct serve_req *r = c->r;
    struct llmd_request q = *c->q;
    q.on_token = serve_on_token;
    q.user = r;
    q.usage = &r->usage;
    r->want_lp = q.logprobs != NULL;
    q.logprobs = r->want_lp ? &r->lp : NULL;
    q.on_prompt = q.on_prompt ? serve_on_prompt : NULL;
    c->retry_after_s = 0;
    c->rc = llmd_submit(l->e, &q, &r->id, &c->retry_after_s);
    if (c->rc < 0) {
        if (c->rc == -EAGAIN)
            l->loc.refused_total++;
        else
            l->loc.rejected_total++;
        return;
    }
    r->tenant = q.tenant;
    r->priority = q.priority;
    r->live = true;
    r->live_next = l->live_head;
    if (l->live_head)
        l->live_head->live_prev = r;
    l->live_head = r;
    l->loc.live++;
    /* published with the answer: the submitter reads it under mu */
    pthread_mutex_lock(&l->mu);
    r->prog.prompt_tokens = r->usage.prompt_tokens;
    r->prog.speculative = l->spec && !q.no_speculative;
    pthread_mutex_unlock(&l->mu);
}

static void serve_run_list(struct serve_loop *l, struct serve_cmd *c) {
    uint64_t now = serve_now();
    c->n = c->total = 0;
    for (struct serve_req *r = l->live_head; r; r = r->live_next, c->total++) {
        if (c->n == c->cap)
            continue;
        c->seqs[c->n++] = (struct serve_seq){.id = r->id,
                                             .tenant = r->tenant,
                                             .priority = r->priority,
                                             .prompt_tokens = r->usage.prompt_tokens,
                                             .cached_tokens = r->usage.cached_tokens,
                                             .generated_tokens = r->n_tokens,
                                             .age_ns = now - r->arrival_ns,
                                             .queue_ns = r->usage.queue_ns};
    }
}

static void serve_cancel_one(struct serve_loop *l, struct serve_req *r) {
    if (!r->live)
        return;
    int rc = llmd_cancel(l->e, r->id);
    if (rc < 0)
        LOG_WARN("serve", "cancel of request %llu: %s", (unsigned long long)r->id, strerror(-rc));
}

/* Cancel the requests whose text could not be kept; drop their references. */
static void serve_run_doomed(struct serve_loop *l, struct serve_req *doomed) {
    for (struct serve_req *r = doomed, *next; r; r = next) {
        next = r->doomed_next;
        serve_cancel_one(l, r);
    }
    if (!doomed)
        return;
    serve_publish(l, NULL);
    pthread_mutex_lock(&l->mu);
    for (struct serve_req *r = doomed, *next; r; r = next) {
        next = r->doomed_next;
        serve_req_unref_locked(r);
    }
    pthread_mutex_unlock(&l->mu);
}

/* How often an idle engine thread republishes the engine's counters. */
#define SERVE_IDLE_PUBLISH_NS 100000000ull

static void *serve_main(void *arg) {
    struct serve_loop *l = arg;
    pthread_mutex_lock(&l->mu);
    for (;;) {
        struct serve_cmd *batch = l->q_head;
        l->q_head = l->q_tail = NULL;
        bool cancel_all = l->cancel_all;
        l->cancel_all = false;
        struct serve_req *doomed = l->doomed;
        l->doomed = NULL;
        pthread_mutex_unlock(&l->mu);

        serve_run_doomed(l, doomed);
        for (struct serve_cmd *c = batch; c; c = c->next) {
            if (c->kind == SERVE_CMD_SUBMIT)
                serve_run_submit(l, c);
            else if (c->kind == SERVE_CMD_LIST)
                serve_run_list(l, c);
            else if (c->kind == SERVE_CMD_CALL)
                c->rc = c->fn(l->e, c->arg);
            else
                serve_cancel_one(l, c->r);
        }
        if (cancel_all) {
            for (struct serve_req *r = l->live_head, *next; r; r = next) {
                next = r->live_next; /* cancelling unlinks r */
                serve_cancel_one(l, r);
            }
        }
        if (l->loc.live > 0 && !l->loc.broken) {
            int rc = llmd_engine_step(l->e);
            if (rc < 0 && rc != -EBUSY) {
                /* every live request was finished with LLMD_FINISH_ERROR */
                LOG_ERROR("serve", "engine step failed: %s; the server runs nothing more",
                          strerror(-rc));
                l->loc.broken = true;
            }
        }
        serve_publish(l, batch);

        pthread_mutex_lock(&l->mu);
        bool work = l->q_head || l->cancel_all || l->doomed;
        if (l->stop && !work && l->loc.live == 0)
            break;
        if (!work && (l->loc.live == 0 || l->loc.broken)) {
            /* idle: wake now and then to publish the counters other
             * threads move without a step (KV events sent, NVMe writes
             * completed), so that /metrics is not left at the last step's */
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            uint64_t ns = (uint64_t)ts.tv_nsec + SERVE_IDLE_PUBLISH_NS;
            ts.tv_sec += (time_t)(ns / 1000000000u);
            ts.tv_nsec = (long)(ns % 1000000000u);
            pthread_cond_timedwait(&l->cv_engine, &l->mu, &ts);
        }
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

/* --- public --------------------------------------------------------------- */

static int serve_cond_init(pthread_cond_t *cv) {
    pthread_condattr_t a;
    if (pthread_condattr_init(&a) != 0)
        return -ENOMEM;
    int rc = pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    if (rc == 0)
        rc = pthread_cond_init(cv, &a);
    pthread_condattr_destroy(&a);
    return rc ? -rc : 0;
}

int serve_loop_create(struct llmd_engine *e, struct serve_loop **out) {
    struct serve_loop *l = mem_calloc(MEM_HTTP, 1, sizeof(*l));
    int rc = -ENOMEM;
    if (!l)
        goto fail;
    l->e = e;
    if ((rc = -pthread_mutex_init(&l->mu, NULL)) < 0)
        goto fail_free;
    if ((rc = serve_cond_init(&l->cv_engine)) < 0)
        goto fail_mu;
    if ((rc = serve_cond_init(&l->cv_done)) < 0)
        goto fail_cv_engine;
    llmd_stats_get(e, &l->loc.engine); /* before the thread: it owns e from then on */
    struct llmd_engine_info in;
    llmd_engine_info_get(e, &in);
    l->spec = in.spec != LLMD_SPEC_NONE;
    l->pub = l->loc;
    if ((rc = -pthread_create(&l->thread, NULL, serve_main, l)) < 0)
        goto fail_cv_done;
    *out = l;
    return 0;
fail_cv_done:
    pthread_cond_destroy(&l->cv_done);
fail_cv_engine:
    pthread_cond_destroy(&l->cv_engine);
fail_mu:
    pthread_mutex_destroy(&l->mu);
fail_free:
    mem_free(l);
fail:
    llmd_engine_close(e);
    return rc;
}

void serve_loop_close(struct serve_loop *l) {
    pthread_mutex_lock(&l->mu);
    if (!l->closed) {
        l->closed = true;
        l->cancel_all = true;
        pthread_cond_signal(&l->cv_engine);
    }
    pthread_mutex_unlock(&l->mu);
}

void serve_loop_destroy(struct serve_loop *l) {
    if (!l)
        return;
    serve_loop_close(l);
    pthread_mutex_lock(&l->mu);
    l->stop = true;
    pthread_cond_signal(&l->cv_engine);
    pthread_mutex_unlock(&l->mu);
    pthread_join(l->thread, NULL);
    llmd_engine_close(l->e);
    pthread_cond_destroy(&l->cv_done);
    pthread_cond_destroy(&l->cv_engine);
    pthread_mutex_destroy(&l->mu);
    mem_free(l);
}

/* Queue c and wait for the engine thread's answer. Returns 0, -ESHUTDOWN. */
static int serve_call(struct serve_loop *l, struct serve_cmd *c) {
    pthread_mutex_lock(&l->mu);
    if (l->closed) {
        pthread_mutex_unlock(&l->mu);
        return -ESHUTDOWN;
    }
    if (l->q_tail)
        l->q_tail->next = c;
    else
        l->q_head = c;
    l->q_tail = c;
    pthread_cond_signal(&l->cv_engine);
    while (!c->done)
        pthread_cond_wait(&l->cv_done, &l->mu);
    pthread_mutex_unlock(&l->mu);
    return 0;
}

int serve_req_submit(struct serve_loop *l, const struct llmd_request *q, uint64_t arrival_ns,
                     struct serve_req **out, uint32_t *retry_after_s, uint32_t *prompt_tokens) {
    struct serve_req *r = mem_calloc(MEM_HTTP, 1, sizeof(*r));
    if (!r)
        return -ENOMEM;
    int rc = serve_cond_init(&r->cv);
    if (rc < 0) {
        mem_free(r);
        return rc;
    }
    r->l = l;
    r->arrival_ns = arrival_ns;
    r->refs = 2; /* the caller's and the engine's */
    r->cancel_cmd = (struct serve_cmd){.kind = SERVE_CMD_CANCEL, .r = r};
    struct serve_cmd c = {.kind = SERVE_CMD_SUBMIT, .r = r, .q = q};
    if (serve_call(l, &c) < 0) {
        serve_req_free(r);
        return -ESHUTDOWN;
    }
    if (retry_after_s)
        *retry_after_s = c.retry_after_s;
    if (c.rc < 0) {
        /* a refused r is never touched again by the engine thread (and c
         * was answered under mu), so its usage may be read here */
        if (prompt_tokens)
            *prompt_tokens = r->usage.prompt_tokens;
        serve_req_put(l, r);
        return c.rc;
    }
    *out = r;
    return 0;
}

int serve_req_wait(struct serve_loop *l, struct serve_req *r, uint64_t timeout_ns, char **buf,
                   size_t *cap, size_t *n_new, struct serve_progress *p) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t ns = (uint64_t)ts.tv_nsec + timeout_ns;
    ts.tv_sec += (time_t)(ns / 1000000000u);
    ts.tv_nsec = (long)(ns % 1000000000u);
    pthread_mutex_lock(&l->mu);
    while (r->n_text == 0 && r->prog.finish == LLMD_FINISH_NONE)
        if (pthread_cond_timedwait(&r->cv, &l->mu, &ts) == ETIMEDOUT)
            break;
    *p = r->prog;
    *n_new = r->n_text;
    int rc = r->n_text == 0 && r->prog.finish == LLMD_FINISH_NONE ? -ETIMEDOUT : 0;
    if (r->n_text) {
        char *t = *buf;
        size_t c = *cap;
        *buf = r->text;
        *cap = r->cap_text;
        r->text = t;
        r->cap_text = c;
        r->n_text = 0;
    }
    pthread_mutex_unlock(&l->mu);
    return rc;
}

void serve_req_wake_with(struct serve_loop *l, struct serve_req *r, struct serve_req *with) {
    pthread_mutex_lock(&l->mu);
    if (!r->wake && r != with) {
        with->refs++;
        r->wake = with;
    }
    pthread_mutex_unlock(&l->mu);
}

int serve_req_wait_any(struct serve_loop *l, struct serve_req *const *r, const bool *done,
                       uint32_t n, uint64_t timeout_ns, uint32_t *which) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t ns = (uint64_t)ts.tv_nsec + timeout_ns;
    ts.tv_sec += (time_t)(ns / 1000000000u);
    ts.tv_nsec = (long)(ns % 1000000000u);
    int rc = -ETIMEDOUT;
    pthread_mutex_lock(&l->mu);
    for (;;) {
        for (uint32_t i = 0; i < n && rc < 0; i++)
            if (!done[i] && (r[i]->n_text || r[i]->prog.finish != LLMD_FINISH_NONE)) {
                *which = i;
                rc = 0;
            }
        if (rc == 0 || n == 0 || pthread_cond_timedwait(&r[0]->cv, &l->mu, &ts) == ETIMEDOUT)
            break;
    }
    pthread_mutex_unlock(&l->mu);
    return rc;
}

void serve_req_take_lp(struct serve_loop *l, struct serve_req *r, char **buf, size_t *cap,
                       size_t *n) {
    pthread_mutex_lock(&l->mu);
    *n = r->lp_pub.n;
    char *t = *buf;
    size_t c = *cap;
    *buf = r->lp_pub.p;
    *cap = r->lp_pub.cap;
    r->lp_pub.p = t;
    r->lp_pub.cap = c;
    r->lp_pub.n = 0;
    pthread_mutex_unlock(&l->mu);
}

int serve_loop_seqs(struct serve_loop *l, struct serve_seq *out, uint32_t cap, uint32_t *n,
                    uint32_t *total) {
    struct serve_cmd c = {.kind = SERVE_CMD_LIST, .seqs = out, .cap = cap};
    int rc = serve_call(l, &c);
    *n = c.n;
    *total = c.total;
    return rc;
}

int serve_loop_call(struct serve_loop *l, int (*fn)(struct llmd_engine *e, void *arg), void *arg) {
    struct serve_cmd c = {.kind = SERVE_CMD_CALL, .fn = fn, .arg = arg};
    int rc = serve_call(l, &c);
    return rc < 0 ? rc : c.rc;
}

void serve_req_cancel(struct serve_loop *l, struct serve_req *r) {
    pthread_mutex_lock(&l->mu);
    if (!r->cancel_queued && r->prog.finish == LLMD_FINISH_NONE) {
        r->cancel_queued = true;
        r->refs++;
        r->cancel_cmd.next = NULL;
        if (l->q_tail)
            l->q_tail->next = &r->cancel_cmd;
        else
            l->q_head = &r->cancel_cmd;
        l->q_tail = &r->cancel_cmd;
        pthread_cond_signal(&l->cv_engine);
    }
    pthread_mutex_unlock(&l->mu);
}

void serve_req_get(struct serve_loop *l, struct serve_req *r) {
    pthread_mutex_lock(&l->mu);
    r->refs++;
    pthread_mutex_unlock(&l->mu);
}

void serve_req_put(struct serve_loop *l, struct serve_req *r) {
    if (!r)
        return;
    pthread_mutex_lock(&l->mu);
    serve_req_unref_locked(r);
    pthread_mutex_unlock(&l->mu);
}

void serve_loop_metrics(struct serve_loop *l, struct serve_metrics *out) {
    pthread_mutex_lock(&l->mu);
    *out = l->pub;
    pthread_mutex_unlock(&l->mu);
}

uint64_t serve_loop_live(struct serve_loop *l) {
    pthread_mutex_lock(&l->mu);
    uint64_t n = l->pub.live;
    pthread_mutex_unlock(&l->mu);
    return n;
}
