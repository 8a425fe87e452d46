/* bench_serve - offline throughput of the serving engine (include/llmd.h):
 * N requests submitted at once, run to completion one at a time (batch 1)
 * and with continuous batching, in the same run, same model, same threads.
 *
 * Usage: bench_serve [MODEL [N_REQUESTS [GEN_TOKENS [MAX_SEQS]]]]
 *   default: stories260K-f32 (../shared/models), 64 requests, 64 tokens,
 *   16 sequences; prompts are 32 random token ids after BOS; greedy.
 *        bench_serve --rag MODEL [N_QUESTIONS]
 *   RAG-shaped: one 2,000-token document shared by N (default 64) requests,
 *   each adding its own 50-token question, 16 tokens out; prefix cache off
 *   vs on in the same run: prefill tokens computed, TTFT median and p95.
 * Env: BENCH_THREADS (default 2), BENCH_RUNS (default 3, medians).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/bench/bench_util.h"
#include "llmd.h"

struct bjob {
    uint64_t id;
    uint32_t n;
    double t_submit, t_first; /* s, bench_now() */
};

static void on_tok(void *user, uint64_t id, int32_t token, const char *text, size_t len,
                   enum llmd_finish finish) {
    (void)id;
    (void)text;
    (void)len;
    (void)finish;
    struct bjob *j = user;
    if (token >= 0 && j->n++ == 0)
        j->t_first = bench_now();
}

/* Generated tokens/s for n requests with at most max_seqs at once. */
static double run(const char *model, int n, uint32_t gen, uint32_t max_seqs, int threads,
                  uint64_t *steps) {
    struct llmd_engine_config cfg = {.model = model,
                                     .n_threads = threads,
                                     .n_ctx = 32 + 1 + gen + 16,
                                     .max_seqs = max_seqs,
                                     .max_batched_tokens = max_seqs < 256 ? 256 : max_seqs};
    struct llmd_engine *e;
    char err[512] = "";
    if (llmd_engine_open(&cfg, &e, err, sizeof(err)) < 0) {
        fprintf(stderr, "bench_serve: %s\n", err);
        exit(1);
    }
    struct bjob *jobs = calloc((size_t)n, sizeof(*jobs));
    int32_t prompt[33];
    srand(5);
    double t0 = bench_now();
    for (int i = 0; i < n; i++) {
        prompt[0] = 1;
        for (int k = 1; k < 33; k++)
            prompt[k] = 3 + rand() % 250;
        struct llmd_request r = {.prompt_ids = prompt,
                                 .n_prompt_ids = 33,
                                 .max_tokens = gen,
                                 .on_token = on_tok,
                                 .user = &jobs[i]};
        if (llmd_submit(e, &r, &jobs[i].id, NULL) < 0) {
            fprintf(stderr, "bench_serve: submit failed\n");
            exit(1);
        }
    }
    while (llmd_engine_step(e) > 0)
        ;
    double dt = bench_now() - t0;
    uint64_t total = 0;
    for (int i = 0; i < n; i++)
        total += jobs[i].n;
    struct llmd_stats st;
    llmd_stats_get(e, &st);
    *steps = st.steps_total;
    free(jobs);
    llmd_engine_close(e);
    return (double)total / dt;
}

/* The RAG-shaped load with the prefix cache off (no_cache 1) or on:
 * prefill tokens computed, and TTFT median / p95 in *ttft50, *ttft95 (s). */
static double rag(const char *model, int n, int no_cache, uint64_t *prefilled, double *ttft50,
                  double *ttft95) {
    enum { DOC = 2000, Q = 50, GEN = 16 };
    struct llmd_engine_config cfg = {.model = model,
                                     .n_threads = 2,
                                     .n_ctx = DOC + Q + GEN + 16,
                                     .max_seqs = 8,
                                     .max_batched_tokens = 512,
                                     .no_prefix_cache = no_cache};
    struct llmd_engine *e;
    char err[512] = "";
    if (llmd_engine_open(&cfg, &e, err, sizeof(err)) < 0) {
        fprintf(stderr, "bench_serve: %s\n", err);
        exit(1);
    }
    struct bjob *jobs = calloc((size_t)n, sizeof(*jobs));
    int32_t *prompt = malloc((DOC + Q) * sizeof(int32_t));
    srand(17);
    prompt[0] = 1;
    for (int k = 1; k < DOC; k++)
        prompt[k] = 3 + rand() % 250;
    double t0 = bench_now();
    for (int i = 0; i < n; i++) {
        for (int k = DOC; k < DOC + Q; k++)
            prompt[k] = 3 + rand() % 250;
        struct llmd_request r = {.prompt_ids = prompt,
                                 .n_prompt_ids = DOC + Q,
                                 .max_tokens = GEN,
                                 .on_token = on_tok,
                                 .user = &jobs[i]};
        jobs[i].t_submit = bench_now();
        if (llmd_submit(e, &r, &jobs[i].id, NULL) < 0) {
            fprintf(stderr, "bench_serve: submit failed\n");
            exit(1);
        }
    }
    while (llmd_engine_step(e) > 0)
        ;
    double dt = bench_now() - t0;
    double *ttft = malloc((size_t)n * sizeof(double));
    for (int i = 0; i < n; i++)
        ttft[i] = jobs[i].t_first - jobs[i].t_submit;
    *ttft50 = bench_median(ttft, n); /* sorts */
    *ttft95 = ttft[(n * 95) / 100 < n ? (n * 95) / 100 : n - 1];
    struct llmd_stats st;
    llmd_stats_get(e, &st);
    *prefilled = st.prefill_tokens_total;
    free(ttft);
    free(prompt);
    free(jobs);
    llmd_engine_close(e);
    return dt;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--rag") == 0) {
        const char *model = argc > 2 ? argv[2] : "../shared/models/stories260K-f32.gguf";
        int n = argc > 3 ? atoi(argv[3]) : 64;
        if (n < 1)
            return 2;
        printf("bench_serve --rag: %s, %d requests = one 2000-token document + 50-token "
               "question, 16 tokens out, 8 seqs, 512 tokens a step, 2 threads\n",
               model, n);
        for (int on = 0; on <= 1; on++) {
            uint64_t pre;
            double t50, t95, dt = rag(model, n, !on, &pre, &t50, &t95);
            printf("  prefix cache %-3s: prefill %8lu tokens, TTFT p50 %7.3f s p95 %7.3f s, "
                   "all done in %6.2f s\n",
                   on ? "on" : "off", (unsigned long)pre, t50, t95, dt);
        }
        return 0;
    }
    const char *model = argc > 1 ? argv[1] : "../shared/models/stories260K-f32.gguf";
    int n = argc > 2 ? atoi(argv[2]) : 64;
    uint32_t gen = argc > 3 ? (uint32_t)atoi(argv[3]) : 64;
    uint32_t seqs = argc > 4 ? (uint32_t)atoi(argv[4]) : 16;
    int threads = getenv("BENCH_THREADS") ? atoi(getenv("BENCH_THREADS")) : 2;
    int runs = getenv("BENCH_RUNS") ? atoi(getenv("BENCH_RUNS")) : 3;
    if (n < 1 || gen < 1 || seqs < 1 || runs < 1 || runs > 15) {
        fprintf(stderr, "usage: bench_serve [MODEL [N [GEN [MAX_SEQS]]]]\n");
        return 2;
    }
    double b1[16], bn[16];
    uint64_t s1 = 0, sn = 0;
    for (int r = 0; r < runs; r++) {
        b1[r] = run(model, n, gen, 1, threads, &s1);
        bn[r] = run(model, n, gen, seqs, threads, &sn);
    }
    double m1 = bench_median(b1, runs), mn = bench_median(bn, runs);
    printf("bench_serve: %s, %d requests x %u tokens (prompt 33), %d threads, median of %d\n",
           model, n, gen, threads, runs);
    printf("  batch 1:              %10.1f generated tok/s (%lu steps)\n", m1, (unsigned long)s1);
    printf("  continuous, %3u seqs: %10.1f generated tok/s (%lu steps), %.2fx\n", seqs, mn,
           (unsigned long)sn, mn / m1);
    return 0;
}
