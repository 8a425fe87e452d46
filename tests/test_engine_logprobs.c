/* llmd_request.logprobs: each sampled token's log-probability and the top
 * alternatives are log_softmax of the model's raw logits (include/llmd.h),
 * checked against model_forward() run by hand over the same tokens
 * (smp_logprobs() itself: tests/test_smp_sample.c). */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>

#include "engine/model/kv.h"
#include "engine/model/model.h"
#include "engine/model/model_forward.h"
#include "engine/model/smp.h"
#include "engine/model/tok.h"
#include "kernels/kern.h"
#include "llmd.h"
#include "tests/lib/ref_util.h"

#define F32   REF_MODELS "/stories260K-f32.gguf"
#define N_GEN 12
#define N_TOP 5

struct got {
    struct llmd_logprobs lp;
    uint32_t n;
    struct llmd_logprobs all[64];
    int32_t ids[64];
    enum llmd_finish finish;
    bool no_lp; /* the request did not ask */
};

static void on_token(void *user, uint64_t id, int32_t token, const char *text, size_t len,
                     enum llmd_finish finish) {
    (void)id, (void)text, (void)len;
    struct got *g = user;
    if (token >= 0 && g->n < 64) {
        if (!g->no_lp)
            cr_assert_eq(g->lp.chosen.token, token, "filled for this very token");
        g->all[g->n] = g->lp;
        g->ids[g->n++] = token;
    }
    g->finish = finish;
}

static struct llmd_engine *open_engine(void) {
    struct llmd_engine_config cfg = {
        .model = F32, .n_threads = 1, .n_ctx = 256, .kv_type = LLMD_KV_F32};
    struct llmd_engine *e;
    char err[256];
    cr_assert_eq(llmd_engine_open(&cfg, &e, err, sizeof(err)), 0, "%s", err);
    return e;
}

/* log_softmax(logits)[id] in double, the reference. */
static double ref_logprob(const float *lg, uint32_t n, int32_t id) {
    double max = -INFINITY, sum = 0;
    for (uint32_t i = 0; i < n; i++)
        max = lg[i] > max ? lg[i] : max;
    for (uint32_t i = 0; i < n; i++)
        sum += exp((double)lg[i] - max);
    return (double)lg[id] - max - log(sum);
}

/* Run prompt + the engine's tokens through model_forward by hand and
 * compare every reported logprob with the logits' log_softmax. */
static void check_against_model(const char *prompt, const struct got *g) {
    struct model *m;
    struct kv_cache *kv;
    struct kern_pool *pool;
    struct model_ctx *ctx;
    uint32_t seq;
    char err[256] = "";
    cr_assert_eq(model_load(F32, &(struct model_load_opts){.quiet = true}, &m, err, sizeof err), 0,
                 "%s", err);
    struct kv_config kc = {.dtype = KV_F32, .n_ctx = 256, .n_seqs = 1};
    cr_assert_eq(kv_cache_create(&m->hp, &kc, &kv, err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(kern_pool_create(1, &pool), 0);
    cr_assert_eq(model_ctx_create(m, pool, 64, &ctx), 0);
    cr_assert_eq(kv_seq_open(kv, &seq), 0);
    uint32_t nv = m->hp.n_vocab;
    float *lg = malloc(nv * sizeof(float));
    int32_t ids[128];
    size_t n = 0;
    cr_assert_eq(tok_encode(m->tok, prompt, strlen(prompt), true, ids, 128, &n), 0);
    cr_assert_eq(kv_seq_reserve(kv, seq, (uint32_t)n), 0);
    cr_assert_eq(model_forward(ctx, kv, seq, ids, (uint32_t)n, 0, lg), 0);
    for (uint32_t i = 0; i < g->n; i++) {
        const struct llmd_logprobs *lp = &g->all[i];
        double want = ref_logprob(lg, nv, g->ids[i]);
        cr_assert(fabs(lp->chosen.logprob - want) < 1e-4, "token %u: logprob %.6f, want %.6f", i,
                  lp->chosen.logprob, want);
        for (uint32_t k = 0; k < lp->n_top; k++) {
            double wk = ref_logprob(lg, nv, lp->top[k].token);
            cr_assert(fabs(lp->top[k].logprob - wk) < 1e-4, "token %u top %u: %.6f want %.6f", i, k,
                      lp->top[k].logprob, wk);
            /* nothing outside the list beats its last entry */
            for (uint32_t t = 0; k + 1 == lp->n_top && t < nv; t++) {
                bool in = false;
                for (uint32_t q = 0; q < lp->n_top; q++)
                    in |= lp->top[q].token == (int32_t)t;
                cr_assert(in || lg[t] <= lg[lp->top[k].token], "token %u: id %u beats the top", i,
                          t);
            }
        }
        cr_assert_eq(kv_seq_reserve(kv, seq, (uint32_t)n + i + 1), 0);
        cr_assert_eq(model_forward(ctx, kv, seq, &g->ids[i], 1, (uint32_t)n + i, lg), 0);
    }
    free(lg);
    kv_seq_close(kv, seq);
    model_ctx_destroy(ctx);
    kern_pool_destroy(pool);
    kv_cache_destroy(kv);
    model_free(m);
}

static void run(struct llmd_engine *e, const char *prompt, float temp, uint64_t seed,
                uint32_t n_top, struct got *g) {
    struct llmd_request r = {.prompt = prompt,
                             .prompt_len = strlen(prompt),
                             .max_tokens = N_GEN,
                             .temperature = temp,
                             .seed = seed,
                             .on_token = on_token,
                             .user = g,
                             .logprobs = &g->lp,
                             .top_logprobs = n_top};
    uint64_t id;
    cr_assert_eq(llmd_submit(e, &r, &id, NULL), 0);
    while (llmd_engine_step(e) > 0)
        ;
}

Test(engine_logprobs, greedy_token_is_the_top_and_matches_the_logits, .timeout = 120) {
    struct llmd_engine *e = open_engine();
    static struct got g;
    const char *p = "Once upon a time";
    run(e, p, 0, 0, N_TOP, &g);
    llmd_engine_close(e);
    cr_assert_eq(g.n, N_GEN);
    for (uint32_t i = 0; i < g.n; i++) {
        const struct llmd_logprobs *lp = &g.all[i];
        cr_assert_eq(lp->n_top, N_TOP);
        cr_assert_eq(lp->top[0].token, g.ids[i], "token %u: greedy is the top", i);
        cr_assert_eq(lp->top[0].logprob, lp->chosen.logprob, "token %u", i);
        for (uint32_t k = 0; k < N_TOP; k++) {
            cr_assert(isfinite(lp->top[k].logprob) && lp->top[k].logprob <= 0, "%f",
                      lp->top[k].logprob);
            cr_assert_geq(lp->chosen.logprob, lp->top[k].logprob, "token %u top %u", i, k);
            if (k)
                cr_assert_geq(lp->top[k - 1].logprob, lp->top[k].logprob, "sorted: %u", k);
        }
    }
    check_against_model(p, &g);
}

/* Sampled tokens: the logprobs are the raw model's, whatever the
 * temperature (vLLM's default), so the same check holds. */
Test(engine_logprobs, sampled_tokens_report_raw_model_logprobs, .timeout = 120) {
    struct llmd_engine *e = open_engine();
    static struct got g;
    const char *p = "The little dog";
    run(e, p, 1.5f, 7, 3, &g);
    llmd_engine_close(e);
    cr_assert_eq(g.n, N_GEN);
    check_against_model(p, &g);
}

/* Logprobs asked for or not, a request's tokens are the same, and a
 * neighbour in the same batch does not change them. */
Test(engine_logprobs, same_tokens_with_and_without, .timeout = 120) {
    struct llmd_engine *e = open_engine();
    static struct got a, b = {.no_lp = true}, c = {.no_lp = true};
    const char *p = "Lily went to the park";
    struct llmd_request ra = {.prompt = p,
                              .prompt_len = strlen(p),
                              .max_tokens = N_GEN,
                              .temperature = 1.0f,
                              .seed = 42,
                              .on_token = on_token,
                              .user = &a,
                              .logprobs = &a.lp,
                              .top_logprobs = 20};
    struct llmd_request rb = ra;
    rb.user = &b;
    rb.logprobs = NULL;
    rb.top_logprobs = 0;
    uint64_t id;
    cr_assert_eq(llmd_submit(e, &ra, &id, NULL), 0);
    cr_assert_eq(llmd_submit(e, &rb, &id, NULL), 0);
    while (llmd_engine_step(e) > 0)
        ;
    struct llmd_request rc = rb;
    rc.user = &c;
    cr_assert_eq(llmd_submit(e, &rc, &id, NULL), 0);
    while (llmd_engine_step(e) > 0)
        ;
    llmd_engine_close(e);
    cr_assert_eq(a.n, b.n);
    cr_assert_eq(a.n, c.n);
    for (uint32_t i = 0; i < a.n; i++) {
        cr_assert_eq(a.ids[i], b.ids[i], "token %u", i);
        cr_assert_eq(a.ids[i], c.ids[i], "token %u", i);
    }
}

Test(engine_logprobs, bad_counts_are_refused) {
    struct llmd_engine *e = open_engine();
    static struct got g;
    struct llmd_request r = {.prompt = "a",
                             .prompt_len = 1,
                             .on_token = on_token,
                             .user = &g,
                             .logprobs = &g.lp,
                             .top_logprobs = LLMD_TOP_LOGPROBS_MAX + 1};
    uint64_t id;
    cr_assert_eq(llmd_submit(e, &r, &id, NULL), -EINVAL);
    r.logprobs = NULL;
    r.top_logprobs = 1;
    cr_assert_eq(llmd_submit(e, &r, &id, NULL), -EINVAL, "alternatives need logprobs");
    cr_assert_eq(g.n, 0, "no callback on a refusal");
    llmd_engine_close(e);
}

Test(engine_logprobs, token_bytes) {
    struct llmd_engine *e = open_engine();
    char b[64];
    size_t n = 0;
    struct llmd_engine_info in;
    llmd_engine_info_get(e, &in);
    cr_assert_eq(llmd_token_bytes(e, (int32_t)in.n_vocab, b, sizeof b, &n), -EINVAL);
    cr_assert_eq(llmd_token_bytes(e, -1, b, sizeof b, &n), -EINVAL);
    /* stories260K's vocabulary has byte tokens <0x0A> at 3 + 10 */
    cr_assert_eq(llmd_token_bytes(e, 13, b, sizeof b, &n), 0);
    cr_assert_eq(n, 1);
    cr_assert_eq(b[0], '\n');
    llmd_engine_close(e);
}

/* With speculative decoding, accepted draft tokens take the logprobs of
 * the rows that verified them: the values still match the model's. */
Test(engine_logprobs, speculative_rows_map_to_their_tokens, .timeout = 120) {
    struct llmd_engine_config cfg = {.model = F32,
                                     .n_threads = 1,
                                     .n_ctx = 256,
                                     .kv_type = LLMD_KV_F32,
                                     .spec = LLMD_SPEC_NGRAM,
                                     .spec_tokens = 4,
                                     .spec_fixed_len = 1};
    struct llmd_engine *e;
    char err[256];
    cr_assert_eq(llmd_engine_open(&cfg, &e, err, sizeof(err)), 0, "%s", err);
    static struct got g;
    struct llmd_usage u;
    const char *p = "Tom had a red ball. Tom had a red ball. Tom had a red ball. Tom had";
    struct llmd_request r = {.prompt = p,
                             .prompt_len = strlen(p),
                             .max_tokens = N_GEN,
                             .on_token = on_token,
                             .user = &g,
                             .usage = &u,
                             .logprobs = &g.lp,
                             .top_logprobs = 2};
    uint64_t id;
    cr_assert_eq(llmd_submit(e, &r, &id, NULL), 0);
    while (llmd_engine_step(e) > 0)
        ;
    llmd_engine_close(e);
    cr_assert_gt(u.spec_accepted_tokens, 0, "some drafts were accepted");
    for (uint32_t i = 0; i < g.n; i++)
        cr_assert_eq(g.all[i].top[0].token, g.ids[i], "token %u: greedy is the top", i);
    check_against_model(p, &g);
}

/* on_prompt: the prompt's log-likelihood. */
struct echo {
    uint32_t n, next;
    double sum;
    float lp[128];
    int32_t tok[128];
    bool after_token; /* an on_prompt came after the first on_token */
    struct got g;
};

static void on_prompt(void *user, uint64_t id, uint32_t pos, int32_t token,
                      const struct llmd_logprobs *lp) {
    (void)id;
    struct echo *x = user;
    cr_assert_eq(pos, x->next, "positions in order, each once, from 0");
    x->next = pos + 1;
    x->tok[pos] = token;
    if (pos == 0) {
        cr_assert_null(lp, "nothing precedes the first token");
        return;
    }
    cr_assert_eq(lp->chosen.token, token);
    cr_assert_eq(lp->n_top, 3);
    for (uint32_t k = 0; k < 3; k++)
        cr_assert_geq(lp->top[0].logprob, lp->top[k].logprob);
    x->after_token |= x->g.n > 0;
    x->lp[pos] = lp->chosen.logprob;
    x->tok[pos] = token;
    x->sum += lp->chosen.logprob;
    x->n++;
}

static void on_echo_token(void *user, uint64_t id, int32_t token, const char *text, size_t len,
                          enum llmd_finish finish) {
    on_token(&((struct echo *)user)->g, id, token, text, len, finish);
}

Test(engine_logprobs, prompt_logprobs_sum_to_the_log_likelihood, .timeout = 120) {
    /* chunks of 4 prompt tokens, and the prompt cached by a first run: the
     * echo request computes every position anyway */
    struct llmd_engine_config cfg = {
        .model = F32, .n_threads = 1, .n_ctx = 256, .kv_type = LLMD_KV_F32, .max_chunk_tokens = 4};
    struct llmd_engine *e;
    char err[256];
    cr_assert_eq(llmd_engine_open(&cfg, &e, err, sizeof(err)), 0, "%s", err);
    const char *p = "Once upon a time there was a big dog. The dog liked to run in the park "
                    "with his friend the cat.";
    static struct got warm;
    warm.no_lp = true;
    struct llmd_request r = {
        .prompt = p, .prompt_len = strlen(p), .max_tokens = 2, .on_token = on_token, .user = &warm};
    uint64_t id;
    cr_assert_eq(llmd_submit(e, &r, &id, NULL), 0);
    while (llmd_engine_step(e) > 0)
        ;
    static struct echo x;
    struct llmd_usage u;
    r = (struct llmd_request){.prompt = p,
                              .prompt_len = strlen(p),
                              .max_tokens = 1,
                              .on_token = on_echo_token,
                              .user = &x,
                              .usage = &u,
                              .logprobs = &x.g.lp,
                              .top_logprobs = 3,
                              .on_prompt = on_prompt};
    cr_assert_eq(llmd_submit(e, &r, &id, NULL), 0);
    while (llmd_engine_step(e) > 0)
        ;
    llmd_engine_close(e);
    cr_assert_eq(u.cached_tokens, 0, "no prefix-cache hit for it");
    cr_assert_eq(x.n, u.prompt_tokens - 1, "%u of %u", x.n, u.prompt_tokens);
    cr_assert_eq(x.next, u.prompt_tokens);
    cr_assert(!x.after_token, "the prompt's logprobs come first");
    cr_assert_eq(x.g.n, 1);

    /* the reference: the whole prompt through model_forward, every row */
    struct model *m;
    struct kv_cache *kv;
    struct kern_pool *pool;
    struct model_ctx *ctx;
    uint32_t seq;
    cr_assert_eq(model_load(F32, &(struct model_load_opts){.quiet = true}, &m, err, sizeof err), 0,
                 "%s", err);
    struct kv_config kc = {.dtype = KV_F32, .n_ctx = 256, .n_seqs = 1};
    cr_assert_eq(kv_cache_create(&m->hp, &kc, &kv, err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(kern_pool_create(1, &pool), 0);
    cr_assert_eq(model_ctx_create(m, pool, 128, &ctx), 0);
    cr_assert_eq(kv_seq_open(kv, &seq), 0);
    uint32_t nv = m->hp.n_vocab;
    int32_t ids[128];
    size_t n = 0;
    cr_assert_eq(tok_encode(m->tok, p, strlen(p), true, ids, 128, &n), 0);
    cr_assert_eq(n, u.prompt_tokens);
    float *lg = malloc(n * nv * sizeof(float));
    struct model_batch_seq b = {.seq = seq,
                                .pos0 = 0,
                                .n_tok = (uint32_t)n,
                                .tokens = ids,
                                .logits = lg,
                                .n_logits = (uint32_t)n};
    cr_assert_eq(kv_seq_reserve(kv, seq, (uint32_t)n), 0);
    cr_assert_eq(model_forward_batch(ctx, kv, &b, 1), 0);
    double want = 0;
    cr_assert_eq(x.tok[0], ids[0]);
    for (size_t q = 1; q < n; q++) {
        double l = ref_logprob(lg + (q - 1) * nv, nv, ids[q]);
        cr_assert_eq(x.tok[q], ids[q], "position %zu", q);
        cr_assert(fabs(x.lp[q] - l) < 1e-4, "position %zu: %f want %f", q, x.lp[q], l);
        want += l;
    }
    cr_assert(fabs(x.sum - want) < 1e-4, "log-likelihood %.6f, want %.6f", x.sum, want);
    free(lg);
    kv_seq_close(kv, seq);
    model_ctx_destroy(ctx);
    kern_pool_destroy(pool);
    kv_cache_destroy(kv);
    model_free(m);
}

/* prompt_only: the log-likelihood alone; the one on_token is the finish. */
Test(engine_logprobs, prompt_only_samples_nothing, .timeout = 60) {
    struct llmd_engine *e = open_engine();
    static struct echo x;
    struct llmd_usage u;
    struct llmd_request r = {.prompt = "Once upon a time",
                             .prompt_len = 16,
                             .on_token = on_echo_token,
                             .user = &x,
                             .usage = &u,
                             .top_logprobs = 3,
                             .on_prompt = on_prompt,
                             .prompt_only = 1};
    x.g.no_lp = true;
    uint64_t id;
    cr_assert_eq(llmd_submit(e, &r, &id, NULL), 0);
    while (llmd_engine_step(e) > 0)
        ;
    struct llmd_stats st;
    llmd_stats_get(e, &st);
    llmd_engine_close(e);
    cr_assert_eq(x.g.n, 0, "no token");
    cr_assert_eq(x.g.finish, LLMD_FINISH_LENGTH);
    cr_assert_eq(u.completion_tokens, 0);
    cr_assert_eq(st.generated_tokens_total, 0);
    cr_assert_eq(x.n, u.prompt_tokens - 1);
}
