/* bench_spec - speculative decoding off against on: decode tokens/s,
 * acceptance rate and mean accepted length, at batch 1 and 8, for
 *   (a) "retell": the prompt is a story the model wrote, then the start of
 *       the same story again, so its answer repeats text of its prompt
 *       (what prompt lookup exists for: RAG answers quoting documents);
 *   (b) "random": random token ids, where drafts are useless;
 * and three engines per model: speculation off, on (the draft-length
 * policy decides, the default), and on with fixed-length drafts
 * (spec_fixed_len: every draft as long as the text has, up to K) to show
 * what the policy saves; with BENCH_DRAFT=MODEL a fourth, "draft": a draft
 * model drafts (--spec draft, the policy deciding the lengths), e.g.
 * BENCH_DRAFT=dummy:dummy-1g:q4_0 bench_spec dummy:dummy-1g (the same
 * weights' seed, quantized: a cheaper draft that mostly agrees). Greedy;
 * every run's token ids must equal the "off" run's (the program fails
 * otherwise).
 *
 * Runs are interleaved (off, on, fixed, off, ...) and the median of
 * BENCH_RUNS is printed: the machine is shared with other jobs. A run
 * repeats the workload until it has taken BENCH_MIN_MS (default 300 ms;
 * a tiny model's workload takes milliseconds, below the noise of a shared
 * machine). Decode tok/s counts each request's tokens after its first one
 * over the time from the step that gave the last request its first token
 * to the end, summed over the repeats. Beside it, the same tokens over the
 * process's CPU time divided by the threads ("cpu t/s"): a neighbour's
 * load stretches wall time but not the CPU time this process got, so on
 * a shared machine that column is the steadier comparison (on an idle one
 * the two agree, the pool's workers spinning through the gaps).
 *
 * Usage: bench_spec [MODEL ...]   (default: stories260K-f32 from
 * ../shared/models, then dummy:dummy-100m:f16, a bandwidth-bound size)
 * Env: BENCH_RUNS (default 5), BENCH_GEN (tokens per request, default
 * 128), BENCH_THREADS (default 2), BENCH_SPEC_TOKENS (K, default 8),
 * BENCH_MIN_MS (default 300), BENCH_DRAFT (a draft model: adds the "draft" mode),
 * BENCH_JSON (default build/bench_spec.json).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "llmd.h"
#include "mem.h"
#include "tests/bench/bench_util.h"

#define MAX_REQ 8
#define MAX_TOK 2048

static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int env_int(const char *k, int def) {
    const char *v = getenv(k);
    return v ? atoi(v) : def;
}

struct job {
    int32_t prompt[MAX_TOK];
    uint32_t n_prompt;
    int32_t out[MAX_TOK];
    uint32_t n_out;
    double t_first, t_last;
    struct llmd_usage usage;
};

static void on_token(void *user, uint64_t id, int32_t token, const char *text, size_t len,
                     enum llmd_finish finish) {
    (void)id, (void)text, (void)len, (void)finish;
    struct job *j = user;
    if (token < 0)
        return;
    j->t_last = bench_now();
    if (j->n_out == 0)
        j->t_first = j->t_last;
    if (j->n_out < MAX_TOK)
        j->out[j->n_out++] = token;
}

enum { MODE_OFF, MODE_ON, MODE_FIXED, MODE_DRAFT, N_MODES };
static const char *const mode_name[N_MODES] = {"off", "on", "fixed", "draft"};

static struct llmd_engine *open_mode(const char *model, int mode, int threads, int k) {
    static const enum llmd_spec spec[N_MODES] = {LLMD_SPEC_NONE, LLMD_SPEC_NGRAM, LLMD_SPEC_NGRAM,
                                                 LLMD_SPEC_DRAFT};
    struct llmd_engine_config cfg = {.model = model,
                                     .n_threads = threads,
                                     .n_ctx = 1024,
                                     .max_seqs = MAX_REQ,
                                     .max_batched_tokens = 512,
                                     .no_prefix_cache = 1,
                                     .spec = spec[mode],
                                     .spec_tokens = (uint32_t)k,
                                     .spec_fixed_len = mode == MODE_FIXED,
                                     .spec_model_path =
                                         mode == MODE_DRAFT ? getenv("BENCH_DRAFT") : NULL};
    struct llmd_engine *e;
    char err[512] = "";
    if (llmd_engine_open(&cfg, &e, err, sizeof err) < 0) {
        fprintf(stderr, "bench_spec: %s: %s\n", model, err);
        return NULL;
    }
    return e;
}

struct result {
    double tok_s, secs, cpu_tok_s, cpu_s;
    uint64_t tokens, drafted, accepted, verify_steps;
};

/* Run jobs[0..n) together to the end; fills r. */
static int run_once(struct llmd_engine *e, struct job *jobs, int n, uint32_t gen,
                    struct result *r) {
    struct llmd_stats s0, s1;
    llmd_stats_get(e, &s0);
    for (int i = 0; i < n; i++) {
        jobs[i].n_out = 0;
        jobs[i].usage = (struct llmd_usage){0};
        uint64_t id;
        struct llmd_request q = {.prompt_ids = jobs[i].prompt,
                                 .n_prompt_ids = jobs[i].n_prompt,
                                 .max_tokens = gen,
                                 .on_token = on_token,
                                 .user = &jobs[i],
                                 .usage = &jobs[i].usage};
        if (llmd_submit(e, &q, &id, NULL) < 0)
            return -1;
    }
    int live;
    while ((live = llmd_engine_step(e)) > 0) {
    }
    if (live < 0)
        return -1;
    llmd_stats_get(e, &s1);
    double t0 = 0, t1 = 0;
    uint64_t toks = 0;
    for (int i = 0; i < n; i++) {
        t0 = jobs[i].t_first > t0 ? jobs[i].t_first : t0;
        t1 = jobs[i].t_last > t1 ? jobs[i].t_last : t1;
        toks += jobs[i].n_out - 1;
    }
    /* tokens after the last first token: the decode phase of them all */
    uint64_t after = 0;
    (void)toks;
    for (int i = 0; i < n; i++)
        after += jobs[i].n_out > 0 ? jobs[i].n_out - 1 : 0;
    r->tok_s = t1 > t0 ? (double)after / (t1 - t0) : 0; /* the rate of this repeat */
    r->tokens = after;
    r->secs = t1 > t0 ? t1 - t0 : 0;
    r->drafted = s1.spec_draft_tokens_total - s0.spec_draft_tokens_total;
    r->accepted = s1.spec_accepted_tokens_total - s0.spec_accepted_tokens_total;
    r->verify_steps = s1.spec_steps_total - s0.spec_steps_total;
    return 0;
}

/* run_once() repeated until min_s have passed (at least once): the rate
 * over all of them, the counts of one repeat (the mean). */
static int run(struct llmd_engine *e, struct job *jobs, int n, uint32_t gen, double min_s,
               int threads, struct result *r) {
    struct result all = {0};
    int reps = 0;
    double t0 = bench_now(), c0 = cpu_now();
    do {
        struct result one;
        if (run_once(e, jobs, n, gen, &one) < 0)
            return -1;
        all.tokens += one.tokens;
        all.secs += one.secs;
        all.drafted += one.drafted;
        all.accepted += one.accepted;
        all.verify_steps += one.verify_steps;
        reps++;
    } while (bench_now() - t0 < min_s);
    double cpu = cpu_now() - c0; /* prefill included (in "draft" the draft's prefill too) */
    *r = (struct result){
        .tok_s = all.secs > 0 ? (double)all.tokens / all.secs : 0,
        .cpu_tok_s = cpu > 0 ? (double)(all.tokens + (uint64_t)n * reps) * threads / cpu : 0,
        .drafted = all.drafted / (uint64_t)reps,
        .accepted = all.accepted / (uint64_t)reps,
        .verify_steps = all.verify_steps / (uint64_t)reps};
    return 0;
}

/* (a): BOS + a story the model writes greedily from a seed of a few
 * tokens (gen tokens), + BOS + the story's first 8 tokens. (b): BOS + 64
 * random ids. Distinct per request. */
static int make_jobs(struct llmd_engine *off, struct job *jobs, int n, bool retell, uint32_t gen,
                     unsigned seed, uint32_t n_vocab) {
    srand(seed);
    for (int i = 0; i < n; i++) {
        struct job *j = &jobs[i];
        j->prompt[0] = 1;
        if (!retell) {
            j->n_prompt = 65;
            for (uint32_t k = 1; k < j->n_prompt; k++)
                j->prompt[k] = 3 + rand() % (int)(n_vocab - 3);
            continue;
        }
        struct job s = {.n_prompt = 4};
        s.prompt[0] = 1;
        for (uint32_t k = 1; k < 4; k++)
            s.prompt[k] = 3 + rand() % (int)(n_vocab - 3);
        struct result r;
        if (run_once(off, &s, 1, gen, &r) < 0)
            return -1;
        uint32_t m = 0;
        j->prompt[m++] = 1;
        for (uint32_t k = 0; k < s.n_out && m < MAX_TOK / 2; k++)
            j->prompt[m++] = s.out[k];
        j->prompt[m++] = 1;
        for (uint32_t k = 0; k < 8 && k < s.n_out; k++)
            j->prompt[m++] = s.out[k];
        j->n_prompt = m;
    }
    return 0;
}

static int bench_model(const char *model, FILE *json, bool *first) {
    int threads = env_int("BENCH_THREADS", 2), runs = env_int("BENCH_RUNS", 5),
        k = env_int("BENCH_SPEC_TOKENS", 8);
    uint32_t gen = (uint32_t)env_int("BENCH_GEN", 128);
    double min_s = env_int("BENCH_MIN_MS", 300) / 1e3;
    if (runs < 1 || runs > 31)
        runs = 5;
    struct llmd_engine *e[N_MODES] = {0};
    const int n_modes = getenv("BENCH_DRAFT") ? N_MODES : MODE_DRAFT;
    for (int m = 0; m < n_modes; m++)
        if (!(e[m] = open_mode(model, m, threads, k)))
            return 1;
    struct llmd_engine_info in;
    llmd_engine_info_get(e[MODE_ON], &in);
    printf("\n%s: %d threads, drafts up to %d tokens; the policy's cost model: a step of n "
           "tokens = %.1f us + n * %.1f us\n",
           model, threads, k, in.spec_step_fixed_ns / 1e3, in.spec_step_token_ns / 1e3);
    printf("  %-7s %5s %-5s %11s %8s %10s %8s %9s %9s %9s %7s\n", "work", "batch", "mode",
           "decode t/s", "vs off", "cpu t/s", "vs off", "drafted", "accepted", "accept %",
           "mean a");
    static struct job jobs[N_MODES][MAX_REQ];
    int bad = 0;
    for (int w = 0; w < 2; w++) {
        for (int bi = 0; bi < 2; bi++) {
            int n = bi ? 8 : 1;
            if (make_jobs(e[MODE_OFF], jobs[0], n, w == 0, gen, 7u + (unsigned)w, in.n_vocab) < 0)
                return 1;
            for (int m = 1; m < n_modes; m++)
                memcpy(jobs[m], jobs[0], sizeof(jobs[0][0]) * (size_t)n);
            double tps[N_MODES][31], cps[N_MODES][31];
            struct result sum[N_MODES] = {0};
            for (int r = 0; r < runs; r++)
                for (int m = 0; m < n_modes; m++) {
                    struct result res;
                    if (run(e[m], jobs[m], n, gen, min_s, threads, &res) < 0)
                        return 1;
                    tps[m][r] = res.tok_s;
                    cps[m][r] = res.cpu_tok_s;
                    sum[m].drafted += res.drafted;
                    sum[m].accepted += res.accepted;
                    sum[m].verify_steps += res.verify_steps;
                    for (int i = 0; i < n; i++)
                        if (jobs[m][i].n_out != jobs[0][i].n_out ||
                            memcmp(jobs[m][i].out, jobs[0][i].out,
                                   jobs[0][i].n_out * sizeof(int32_t)) != 0) {
                            fprintf(stderr,
                                    "bench_spec: %s %s batch %d request %d: token ids "
                                    "differ from speculation off\n",
                                    model, mode_name[m], n, i);
                            bad = 1;
                        }
                }
            double off = bench_median(tps[MODE_OFF], runs),
                   coff = bench_median(cps[MODE_OFF], runs);
            for (int m = 0; m < n_modes; m++) {
                double med = m == MODE_OFF ? off : bench_median(tps[m], runs);
                double cmed = m == MODE_OFF ? coff : bench_median(cps[m], runs);
                double rate = sum[m].drafted ? (double)sum[m].accepted / sum[m].drafted : 0;
                double mean_a =
                    sum[m].verify_steps ? (double)sum[m].accepted / sum[m].verify_steps : 0;
                printf("  %-7s %5d %-5s %11.1f %7.2fx %10.1f %7.2fx %9llu %9llu %8.1f%% %7.2f\n",
                       w == 0 ? "retell" : "random", n, mode_name[m], med, off > 0 ? med / off : 0,
                       cmed, coff > 0 ? cmed / coff : 0,
                       (unsigned long long)(sum[m].drafted / (unsigned)runs),
                       (unsigned long long)(sum[m].accepted / (unsigned)runs), 100 * rate, mean_a);
                fprintf(json,
                        "%s\n  {\"model\": \"%s\", \"workload\": \"%s\", \"batch\": %d, \"mode\": "
                        "\"%s\", \"decode_tok_s\": %.2f, \"vs_off\": %.3f, \"cpu_tok_s\": %.2f, "
                        "\"cpu_vs_off\": %.3f, \"drafted\": %llu, "
                        "\"accepted\": %llu, \"acceptance\": %.4f, \"mean_accepted\": %.3f, "
                        "\"runs\": %d, \"threads\": %d, \"spec_tokens\": %d}",
                        *first ? "" : ",", model, w == 0 ? "retell" : "random", n, mode_name[m],
                        med, off > 0 ? med / off : 0, cmed, coff > 0 ? cmed / coff : 0,
                        (unsigned long long)(sum[m].drafted / (unsigned)runs),
                        (unsigned long long)(sum[m].accepted / (unsigned)runs), rate, mean_a, runs,
                        threads, k);
                *first = false;
            }
        }
    }
    printf("  greedy token ids: %s\n", bad ? "DIFFERENT (a bug)" : "identical in every run");
    if (n_modes > MODE_DRAFT) {
        llmd_engine_info_get(e[MODE_DRAFT], &in);
        printf("  the draft model's pass as fitted at the end: %.1f us + n * %.1f us (the "
               "target's step: %.1f us + n * %.1f us)\n",
               in.spec_draft_fixed_ns / 1e3, in.spec_draft_token_ns / 1e3,
               in.spec_step_fixed_ns / 1e3, in.spec_step_token_ns / 1e3);
    }
    for (int m = 0; m < n_modes; m++)
        llmd_engine_close(e[m]);
    return bad;
}

int main(int argc, char **argv) {
    const char *jpath = getenv("BENCH_JSON");
    FILE *json = fopen(jpath && *jpath ? jpath : "build/bench_spec.json", "w");
    if (!json)
        json = fopen("/dev/null", "w");
    fprintf(json, "[");
    char isa[96];
    kern_isa_describe(isa, sizeof isa);
    printf("bench_spec: isa %s, %ld online CPUs\n", isa, sysconf(_SC_NPROCESSORS_ONLN));
    bool first = true;
    int bad = 0;
    if (argc > 1) {
        for (int i = 1; i < argc; i++)
            bad |= bench_model(argv[i], json, &first);
    } else {
        const char *stories = "../shared/models/stories260K-f32.gguf";
        if (access(stories, R_OK) == 0)
            bad |= bench_model(stories, json, &first);
        bad |= bench_model("dummy:dummy-100m:f16", json, &first);
    }
    fprintf(json, "\n]\n");
    fclose(json);
    return bad;
}
