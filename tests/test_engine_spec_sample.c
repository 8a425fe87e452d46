/* Speculative decoding with temperature > 0 keeps the model's output
 * distribution (rejection sampling coupled to the target's own draw,
 * smp_verify), and a seed gives the very ids it gives without speculation.
 *
 * Same ids: sampled requests (several seeds, temperatures, top-k, top-p,
 * min-p, the penalties and a logit bias) speculating by prompt lookup and
 * with a draft model, alone and batched, preempted and restored, commit
 * exactly the ids of each request run alone without speculation; drafts
 * are both accepted and rejected in every case.
 *
 * Distribution: on stories260K, the
 * joint distribution of a request's first three tokens (temperature 1,
 * top-k 3: at most 27 outcomes) is computed exactly from the model's
 * logits, and 3000 requests with distinct seeds, speculating on a prompt
 * that repeats itself (so drafts are proposed and often accepted for
 * tokens 2 and 3), are tested against it with Pearson's chi-square. The
 * test's false-alarm rate is 1e-4 per run (a correct engine fails it once
 * in 10000 seeds sets; the seeds are fixed, so a run is reproducible). The
 * same test without speculation is the control that the exact
 * distribution is computed right. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "engine/model/kv.h"
#include "engine/model/model.h"
#include "engine/model/model_forward.h"
#include "engine/model/tok.h"
#include "kernels/kern.h"
#include "llmd.h"
#include "mem.h"
#include "tests/lib/ref_util.h"
#include "tests/lib/spec_util.h"
#include "tests/lib/stat_util.h"

#define PROMPT "The cat was very happy. The cat was very happy. The cat"
#define K      3 /* top-k */
#define N_REQ  3000

/* Top K ids of logits[n] (ties: lower id first) and their probabilities
 * under softmax(logits) restricted to them. */
static void top_probs(const float *l, uint32_t n, int32_t *id, double *p) {
    for (int k = 0; k < K; k++) {
        int32_t best = -1;
        for (uint32_t i = 0; i < n; i++) {
            bool taken = false;
            for (int j = 0; j < k; j++)
                taken |= id[j] == (int32_t)i;
            if (!taken && (best < 0 || l[i] > l[best]))
                best = (int32_t)i;
        }
        id[k] = best;
    }
    double sum = 0;
    for (int k = 0; k < K; k++)
        sum += p[k] = exp((double)l[id[k]] - l[id[0]]);
    for (int k = 0; k < K; k++)
        p[k] /= sum;
}

/* The exact distribution of the first three tokens: cell (a, b, c) is
 * token a of the prompt's top K, then b of the top K after it, then c. */
struct joint {
    int32_t t1[K], t2[K][K], t3[K][K][K];
    double p[K * K * K];
};

static void exact_joint(struct joint *J) {
    struct model *m;
    char err[256] = "";
    cr_assert_eq(model_load(F32, &(struct model_load_opts){.quiet = true}, &m, err, sizeof err), 0,
                 "%s", err);
    struct kern_pool *pool;
    struct kv_cache *kv;
    struct model_ctx *ctx;
    struct kv_config kc = {.dtype = KV_F32, .n_ctx = 128, .n_seqs = 1};
    cr_assert_eq(kv_cache_create(&m->hp, &kc, &kv, err, sizeof err), 0, "%s", err);
    cr_assert_eq(kern_pool_create(1, &pool), 0);
    cr_assert_eq(model_ctx_create(m, pool, 128, &ctx), 0);
    int32_t *ids;
    size_t n;
    cr_assert_eq(
        tok_encode_alloc(m->tok, PROMPT, strlen(PROMPT), tok_add_bos_default(m->tok), 3, &ids, &n),
        0);
    uint32_t seq, V = m->hp.n_vocab;
    cr_assert_eq(kv_seq_open(kv, &seq), 0);
    cr_assert_eq(kv_seq_reserve(kv, seq, (uint32_t)n + 2), 0);
    float *l = mem_alloc(MEM_TEST, V * sizeof(float));
    double p1[K], p2[K], p3[K];
    cr_assert_eq(model_forward(ctx, kv, seq, ids, (uint32_t)n, 0, l), 0);
    top_probs(l, V, J->t1, p1);
    for (int a = 0; a < K; a++) {
        ids[n] = J->t1[a];
        cr_assert_eq(model_forward(ctx, kv, seq, ids + n, 1, (uint32_t)n, l), 0);
        top_probs(l, V, J->t2[a], p2);
        for (int b = 0; b < K; b++) {
            ids[n + 1] = J->t2[a][b];
            cr_assert_eq(model_forward(ctx, kv, seq, ids + n + 1, 1, (uint32_t)n + 1, l), 0);
            top_probs(l, V, J->t3[a][b], p3);
            for (int c = 0; c < K; c++)
                J->p[(a * K + b) * K + c] = p1[a] * p2[b] * p3[c];
        }
    }
    mem_free(l);
    mem_free(ids);
    model_ctx_destroy(ctx);
    kern_pool_destroy(pool);
    kv_cache_destroy(kv);
    model_free(m);
}

struct sample {
    uint64_t id;
    int32_t out[3];
    uint32_t n;
    struct llmd_usage usage;
};

static void on_token(void *user, uint64_t id, int32_t token, const char *text, size_t len,
                     enum llmd_finish finish) {
    (void)id, (void)text, (void)len, (void)finish;
    struct sample *s = user;
    if (token >= 0 && s->n < 3)
        s->out[s->n++] = token;
}

/* The cell of a sample, or -1 if it is outside every top K (impossible). */
static int cell_of(const struct joint *J, const struct sample *s) {
    for (int a = 0; a < K; a++)
        for (int b = 0; b < K; b++)
            for (int c = 0; c < K; c++)
                if (s->out[0] == J->t1[a] && s->out[1] == J->t2[a][b] &&
                    s->out[2] == J->t3[a][b][c])
                    return (a * K + b) * K + c;
    return -1;
}

static void gof(enum llmd_spec spec) {
    static struct joint J;
    exact_joint(&J);
    struct llmd_engine_config cfg = {.model = F32,
                                     .n_threads = 2,
                                     .n_ctx = 128,
                                     .max_seqs = 32,
                                     .max_batched_tokens = 512,
                                     .kv_type = LLMD_KV_F32,
                                     .spec = spec,
                                     .spec_tokens = 4,
                                     .spec_fixed_len = 1};
    struct llmd_engine *e;
    char err[256] = "";
    cr_assert_eq(llmd_engine_open(&cfg, &e, err, sizeof err), 0, "%s", err);
    static struct sample smp[N_REQ];
    memset(smp, 0, sizeof smp);
    uint64_t counts[K * K * K] = {0}, drafted = 0, accepted = 0;
    for (int i = 0; i < N_REQ; i++) {
        struct llmd_request r = {.prompt = PROMPT,
                                 .prompt_len = strlen(PROMPT),
                                 .max_tokens = 3,
                                 .temperature = 1.0f,
                                 .top_k = K,
                                 .seed = 1000003u * (uint64_t)i + 17,
                                 .on_token = on_token,
                                 .user = &smp[i],
                                 .usage = &smp[i].usage};
        cr_assert_eq(llmd_submit(e, &r, &smp[i].id, NULL), 0);
        if (i % 64 == 63 || i == N_REQ - 1)
            while (llmd_engine_step(e) > 0) {
            }
    }
    for (int i = 0; i < N_REQ; i++) {
        cr_assert_eq(smp[i].n, 3, "request %d: %u tokens", i, smp[i].n);
        int c = cell_of(&J, &smp[i]);
        cr_assert_geq(c, 0, "request %d: %d %d %d outside the top %d", i, smp[i].out[0],
                      smp[i].out[1], smp[i].out[2], K);
        counts[c]++;
        drafted += smp[i].usage.spec_draft_tokens;
        accepted += smp[i].usage.spec_accepted_tokens;
    }
    double chi2;
    uint32_t df;
    double pv = stat_chi2_p(counts, J.p, K * K * K, N_REQ, &chi2, &df);
    cr_log_info("spec %d: chi2 %.1f on %u df, p-value %.3g; %lu drafted, %lu accepted", spec, chi2,
                df, pv, (unsigned long)drafted, (unsigned long)accepted);
    cr_assert_gt(pv, 1e-4, "spec %d: chi2 %.1f on %u df, p-value %.2g", spec, chi2, df, pv);
    if (spec) {
        /* drafts were accepted and rejected many times (a rejection commits
         * the sampler's own token, drawn as without speculation, so this run's
         * counts equal the control's: the test keeps the statistical
         * check of speculative output; a_seed_gives_the_ids_... is the sharper
         * one) */
        cr_assert_gt(accepted, N_REQ / 4, "accepted %lu", (unsigned long)accepted);
        cr_assert_gt(drafted - accepted, N_REQ / 10, "rejected %lu",
                     (unsigned long)(drafted - accepted));
    }
    llmd_engine_close(e);
}

Test(engine_spec_sample, speculation_keeps_the_distribution, .timeout = 240) {
    gof(LLMD_SPEC_NGRAM);
}

Test(engine_spec_sample, control_without_speculation, .timeout = 240) {
    gof(LLMD_SPEC_NONE);
}

/* --- a seed gives the ids it gives without speculation ------------------ */

#define Q8 REF_MODELS "/stories260K-q8_0.gguf"

static const char *const rep_prompts[] = {
    "Tom had a dog. The dog was big. Tom had a dog. The dog was big. Tom had",
    "The sun was hot. The birds sang. The sun was hot. The birds sang. The sun",
    "Once upon a time, there was a little girl named Lily. She loved to play outside.",
    "Sue liked red. Sue liked blue. Sue liked red. Sue liked blue. Sue",
};

static const int32_t bias_ids[2] = {13, 400};
static const float bias[2] = {2.5f, -100.0f};

/* The samplers the jobs cycle through: what a user sets (serve's fields). */
static const struct llmd_request samplers[] = {
    {.temperature = 0.8f},
    {.temperature = 0.3f, .top_k = 40, .top_p = 0.9f},
    {.temperature = 0.6f,
     .min_p = 0.05f,
     .repetition_penalty = 1.1f,
     .frequency_penalty = 0.2f,
     .presence_penalty = 0.1f},
    {.temperature = 1.2f,
     .top_p = 0.95f,
     .logit_bias_ids = bias_ids,
     .logit_bias = bias,
     .n_logit_bias = 2},
};
#define N_SAMPLERS (sizeof(samplers) / sizeof(samplers[0]))

static struct llmd_request job_smp[16];

static void make_sampled_jobs(struct job *jobs, int n, uint64_t seed0) {
    for (int i = 0; i < n; i++) {
        memset(&jobs[i], 0, sizeof(jobs[i]));
        job_smp[i] = samplers[(size_t)i % N_SAMPLERS];
        job_smp[i].seed = seed0 + 7919u * (uint64_t)i;
        jobs[i].prompt = rep_prompts[(size_t)(i / 2) % 4];
        jobs[i].max_tokens = 56 - (uint32_t)(i % 3) * 8;
        jobs[i].sampling = &job_smp[i];
    }
}

Test(engine_spec_sample, a_seed_gives_the_ids_it_gives_without_speculation, .timeout = 240) {
    enum { N = 12 };
    static struct job alone[N], spec[N];
    static const struct eng_opts cases[] = {
        {.spec = LLMD_SPEC_NGRAM, .max_seqs = 1, .max_batched = 64, .spec_tokens = 6},
        {.spec = LLMD_SPEC_NGRAM, .max_seqs = 8, .max_batched = 48, .spec_tokens = 4},
        {.spec = LLMD_SPEC_NGRAM,
         .max_seqs = 8,
         .max_batched = 128,
         .spec_tokens = 8,
         .no_prefix_cache = 1,
         .no_map_ahead = 1},
        {.spec = LLMD_SPEC_NGRAM,
         .max_seqs = 4,
         .max_batched = 5,
         .spec_tokens = 6,
         .budget = 14 * 40960,
         .host_bytes = 4u << 20},
        {.spec = LLMD_SPEC_DRAFT,
         .spec_model = F32,
         .max_seqs = 8,
         .max_batched = 64,
         .spec_tokens = 5},
        {.spec = LLMD_SPEC_DRAFT,
         .spec_model = Q8,
         .max_seqs = 4,
         .max_batched = 32,
         .spec_tokens = 4,
         .budget = 14 * 40960,
         .host_bytes = 4u << 20},
    };
    uint64_t seed0[2] = {1, 0x9e3779b97f4a7c15ull};
    uint64_t preempted = 0;
    for (int sd = 0; sd < 2; sd++) {
        make_sampled_jobs(alone, N, seed0[sd]);
        solo(alone, N);
        for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
            const struct eng_opts *o = &cases[c];
            struct llmd_engine *e = open_engine(o);
            make_sampled_jobs(spec, N, seed0[sd]);
            for (int i = 0; i < N; i++)
                submit(e, &spec[i]);
            run(e, spec, N, false);
            char what[128];
            snprintf(what, sizeof what, "seeds %d, case %zu (%s, max_seqs %u, drafts of %u)", sd, c,
                     o->spec == LLMD_SPEC_NGRAM ? "prompt lookup" : "draft model", o->max_seqs,
                     o->spec_tokens);
            expect_same(alone, spec, N, what);
            expect_counts(e, spec, N, 20, what);
            uint64_t drafted = 0, accepted = 0;
            for (int i = 0; i < N; i++) {
                drafted += spec[i].usage.spec_draft_tokens;
                accepted += spec[i].usage.spec_accepted_tokens;
            }
            cr_assert_gt(drafted - accepted, 20, "%s: drafts rejected (%lu of %lu)", what,
                         (unsigned long)(drafted - accepted), (unsigned long)drafted);
            struct llmd_stats st;
            llmd_stats_get(e, &st);
            preempted += st.preemptions_total;
            llmd_engine_close(e);
        }
    }
    cr_assert_gt(preempted, 0, "the budgets preempted");
}

/* An answer that ends inside a UTF-8 character ends with U+FFFD, with
 * speculation as without (the engine keeps the detokenizer's state after
 * each token of a run: ts_after in engine.c). The random dummy model
 * samples byte tokens: 32 seeds x max_tokens 21..114 at temperature 0.3,
 * drafted by prompt lookup (fixed drafts of 8). Seeds 5 + 101 i cut 5
 * answers in ggml's AVX2 order and 7 in the one-sum order (avx512, amx);
 * seeds 3 + 101 i, used before that order, cut only 1 there. */
Test(engine_spec_sample, an_answer_cut_inside_a_character_ends_alike, .timeout = 120) {
    enum { N = 32 };
    static struct job alone[N], spec[N];
    static struct llmd_request smp[N];
    static const char *const model = "dummy:tiny-256:q4_k_m";
    for (int i = 0; i < N; i++) {
        memset(&alone[i], 0, sizeof alone[i]);
        smp[i] = (struct llmd_request){.temperature = 0.3f, .seed = 5 + 101u * (uint64_t)i};
        alone[i].prompt = "abc abc abc abc abc abc abc abc abc abc abc abc abc abc";
        alone[i].max_tokens = 21 + 3 * (uint32_t)i;
        alone[i].sampling = &smp[i];
    }
    solo_like(alone, N, &(struct eng_opts){.model = model, .n_ctx = 256});
    int cut = 0;
    for (int i = 0; i < N; i++)
        cut +=
            alone[i].n_text >= 3 && !memcmp(alone[i].text + alone[i].n_text - 3, "\xef\xbf\xbd", 3);
    cr_assert_geq(cut, 2, "%d answers end inside a character", cut);
    struct llmd_engine *e = open_engine(&(struct eng_opts){.model = model,
                                                           .n_ctx = 256,
                                                           .spec = LLMD_SPEC_NGRAM,
                                                           .max_seqs = 8,
                                                           .max_batched = 96,
                                                           .spec_tokens = 8});
    for (int i = 0; i < N; i++) {
        spec[i] = alone[i];
        submit(e, &spec[i]);
    }
    run(e, spec, N, false);
    expect_same(alone, spec, N, "prompt lookup");
    uint64_t accepted = 0;
    for (int i = 0; i < N; i++)
        accepted += spec[i].usage.spec_accepted_tokens;
    cr_assert_gt(accepted, 50, "accepted %lu", (unsigned long)accepted);
    llmd_engine_close(e);
}

/* A stop id is not returned, so an answer it ends has the text of the same
 * answer cut by max_tokens just before it: a U+FFFD only where a character
 * was cut before the stop id, never one made of the stop id's own bytes (a
 * review found 49 of 60 stop-id finishes ending in U+FFFD after an ASCII
 * token). The stop ids are the dummy's lone UTF-8 lead bytes; 48 seeds, with
 * and without speculation. */
Test(engine_spec_sample, a_stop_id_ends_the_text_where_max_tokens_would, .timeout = 120) {
    enum { N = 48 };
    static struct job stopped[N], spec[N], cut[N];
    static struct llmd_request smp[N], smp_cut[N];
    static const char *const model = "dummy:tiny-256:q4_k_m";
    const struct eng_opts plain = {.model = model, .n_ctx = 256, .max_seqs = 8, .max_batched = 96};
    struct llmd_engine *e = open_engine(&plain);
    static int32_t stops[16];
    uint32_t ns = 0;
    for (int32_t id = 0; id < 300 && ns < 16; id++) {
        char b[64];
        size_t n = 0;
        if (llmd_token_bytes(e, id, b, sizeof b, &n) == 0 && n == 1 &&
            (unsigned char)b[0] >= 0xC2 && (unsigned char)b[0] <= 0xEF)
            stops[ns++] = id;
    }
    cr_assert_eq(ns, 16, "%u lead-byte tokens", ns);
    for (int i = 0; i < N; i++) {
        memset(&stopped[i], 0, sizeof stopped[i]);
        smp[i] = (struct llmd_request){.temperature = 1.0f,
                                       .seed = 1 + (uint64_t)i,
                                       .stop_token_ids = stops,
                                       .n_stop_token_ids = ns};
        stopped[i].prompt = "abc abc abc abc abc abc abc abc";
        stopped[i].max_tokens = 80;
        stopped[i].sampling = &smp[i];
        submit(e, &stopped[i]);
    }
    run(e, stopped, N, false);
    /* the same answers, cut by max_tokens before the stop id */
    int n_cut = 0;
    for (int i = 0; i < N; i++) {
        memset(&cut[i], 0, sizeof cut[i]);
        if (stopped[i].finish != LLMD_FINISH_EOS || stopped[i].n_out < 2)
            continue;
        smp_cut[i] = (struct llmd_request){.temperature = 1.0f, .seed = 1 + (uint64_t)i};
        cut[i] = stopped[i];
        cut[i].max_tokens = stopped[i].n_out - 1;
        cut[i].sampling = &smp_cut[i];
        submit(e, &cut[i]);
        n_cut++;
    }
    run(e, cut, N, false);
    int ends_cut = 0;
    for (int i = 0; i < N; i++) {
        if (stopped[i].finish != LLMD_FINISH_EOS || stopped[i].n_out < 2)
            continue;
        cr_assert_eq(cut[i].finish, LLMD_FINISH_LENGTH, "seed %d", i + 1);
        cr_assert_str_eq(stopped[i].text, cut[i].text, "seed %d: stopped by id %d after %u tokens",
                         i + 1, stopped[i].out[stopped[i].n_out - 1], stopped[i].n_out - 1);
        ends_cut +=
            cut[i].n_text >= 3 && !memcmp(cut[i].text + cut[i].n_text - 3, "\xef\xbf\xbd", 3);
    }
    cr_assert_geq(n_cut, 20, "%d answers ended by a stop id", n_cut);
    llmd_engine_close(e);
    cr_log_info("%d stop-id finishes, %d of them after a cut character", n_cut, ends_cut);
    /* speculating, the same text */
    struct eng_opts so = plain;
    so.spec = LLMD_SPEC_NGRAM;
    so.spec_tokens = 8;
    e = open_engine(&so);
    for (int i = 0; i < N; i++) {
        spec[i] = stopped[i];
        submit(e, &spec[i]);
    }
    run(e, spec, N, false);
    expect_same(stopped, spec, N, "prompt lookup, stop ids");
    llmd_engine_close(e);
}
