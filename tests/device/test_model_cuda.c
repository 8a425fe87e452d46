/* test_model_cuda.c - the forward pass on a GPU (engine/model/model_cuda.h) against
 * the CPU's and the greedy references, on the real driver only.
 *
 *  1. references: stories260K f32 and f16 GGUF, the 7 reference prompts of
 *     ../shared/models/reference.jsonl, 64 greedy tokens each on the GPU;
 *     equal to the CPU's greedy tokens on >= 6 of 7 (f32 and f16), and the
 *     count equal to the references is reported.
 *  2. logits: along the CPU's greedy path of each prompt (f32), the GPU's
 *     logits at the CPU's top-5 ids agree within 1e-3 at every position.
 *  3. batch invariance: the 7 prompts prefilled and decoded together in one
 *     batch (model_forward_batch over 7 ranges) give each prompt's solo
 *     greedy tokens.
 *  4. forced spill: the engine (llmd.h) on the GPU with dummy:llama3-8b-2l:f32
 *     (two layers of Llama-3-8B; f32 weights and KV, so a token's K/V is
 *     16 KiB and a 2 MiB page holds 128 tokens; f32 GEMMs keep the batch
 *     shapes' differences near 1e-6) and a pool too small for its requests'
 *     shared prefixes, with a host tier: spills and restores happen, at
 *     least 15 of 16 outputs equal the request's solo run without the prefix
 *     cache (cuBLAS is not batch-invariant: a near tie of random weights may
 *     flip; the divergence is printed), and no page is left mapped.
 *  5. map-ahead: in the solo runs of 4 (which have room), no decode step
 *     waited on a map call (llmd_stats.decode_map_waits_total == 0).
 *  6. quantized KV (issue 15): stories260K f32 with --kv-type q8_0, fp8 and
 *     q4_0 on the GPU against the CPU with the same type, the 7 prompts, 64
 *     greedy tokens each (a prefill chunk, then decode: both attention
 *     paths and both store paths). The GPU writes the CPU's bytes for the
 *     same K/V input, but its K/V differ from the CPU's in the last bits
 *     (cuBLAS, cosf/sinf), which can move a value across a rounding
 *     boundary, a whole quantization step: so the bar is that of quantized
 *     weights, >= 5 of 7 prompts equal over all 64 tokens for q8_0 and fp8,
 *     >= 4 of 7 for q4_0 (4-bit steps), and for every type a mean common
 *     prefix of >= 32 tokens; the shortest prefix is printed. A wrong
 *     kernel (layout, rotation, scale) breaks every prompt in its first
 *     tokens.
 *
 * Without a usable GPU: "cuda unavailable: <reason>" and
 * "0 passed, 0 failed, 1 skipped", exit 0. Last line always
 * "N passed, N failed, N skipped". Built and run by tests/device/run.sh.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model/kv.h"
#include "engine/model/model.h"
#include "engine/model/model_cuda.h"
#include "engine/model/model_forward.h"
#include "engine/model/smp.h"
#include "engine/model/tok.h"
#include "kernels/kern.h"
#include "llmd.h"
#include "log.h"
#include "tests/lib/ref_util.h"

#define N_GEN     64
#define MAX_IDS   512
#define LOGIT_TOL 1e-3

static int n_pass, n_fail;
static enum kv_dtype run_kv = KV_F32; /* the KV type run_open gives both devices */

static void check(bool ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void check(bool ok, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("%s: ", ok ? "ok" : "FAIL");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    if (ok)
        n_pass++;
    else
        n_fail++;
}

/* One model on one device with one KV range per prompt. */
struct run {
    struct model *m;
    struct kern_pool *pool;
    struct kv_cache *kv;
    struct model_ctx *ctx;
    bool cuda;
};

static int run_open(struct run *r, const char *file, bool cuda, uint32_t n_seqs, char *err,
                    size_t errlen) {
    char path[512];
    snprintf(path, sizeof(path), REF_MODELS "/%s", file);
    memset(r, 0, sizeof(*r));
    r->cuda = cuda;
    int rc = model_load(path, &(struct model_load_opts){.quiet = true, .no_pack = true}, &r->m, err,
                        errlen);
    if (rc)
        return rc;
    struct kv_config kc = {.dtype = run_kv,
                           .n_ctx = 512,
                           .n_seqs = n_seqs,
                           .device = cuda ? KV_DEV_CUDA : KV_DEV_HOST};
    if ((rc = kv_cache_create(&r->m->hp, &kc, &r->kv, err, errlen)) ||
        (rc = kern_pool_create(1, &r->pool)) ||
        (rc = model_ctx_create(r->m, r->pool, 512, &r->ctx)))
        return rc;
    if (cuda && (rc = model_ctx_use_cuda(r->ctx, r->kv, 0, n_seqs, err, errlen)))
        return rc;
    return 0;
}

static void run_close(struct run *r) {
    model_ctx_destroy(r->ctx);
    kern_pool_destroy(r->pool);
    kv_cache_destroy(r->kv);
    model_free(r->m);
}

/* Greedy-decode N_GEN tokens of ids[0..n) in range `seq`; with `force`,
 * feed force[] instead of the argmax (teacher forcing) and store every
 * position's logits in all_logits[N_GEN][n_vocab]. */
static int run_greedy(struct run *r, uint32_t seq, const int32_t *ids, uint32_t n, int32_t *out,
                      const int32_t *force, float *all_logits) {
    uint32_t nv = r->m->hp.n_vocab;
    float *logits = malloc(nv * sizeof(float));
    int rc = kv_seq_reserve(r->kv, seq, n);
    if (rc == 0)
        rc = model_forward(r->ctx, r->kv, seq, ids, n, 0, logits);
    for (uint32_t i = 0; rc == 0 && i < N_GEN; i++) {
        out[i] = smp_argmax(logits, nv);
        if (all_logits)
            memcpy(all_logits + (size_t)i * nv, logits, nv * sizeof(float));
        if (i + 1 == N_GEN)
            break;
        int32_t next = force ? force[i] : out[i];
        if ((rc = kv_seq_reserve(r->kv, seq, n + i + 1)) == 0)
            rc = model_forward(r->ctx, r->kv, seq, &next, 1, n + i, logits);
    }
    free(logits);
    return rc;
}

static json_t *refs;

static uint32_t prompt_ids(struct run *r, int c, int32_t *ids) {
    json_t *ref = ref_find(refs, "stories260K-f32.gguf", ref_cases[c]);
    const char *p = json_string_value(json_object_get(ref, "prompt"));
    size_t n = 0;
    if (tok_encode(r->m->tok, p, strlen(p), true, ids, MAX_IDS, &n) < 0)
        return 0;
    return (uint32_t)n;
}

/* 1 and 2 for one GGUF file. */
static void check_references(const char *file, const char *ref_model, bool logits, int min_same) {
    struct run cpu, gpu;
    char err[512] = "";
    int rc = run_open(&cpu, file, false, 1, err, sizeof(err));
    check(rc == 0, "%s: CPU run opens (%s)", file, err);
    rc = rc ? rc : run_open(&gpu, file, true, 1, err, sizeof(err));
    check(rc == 0, "%s: GPU run opens (%s)", file, err);
    if (rc)
        return;
    uint32_t s0 = 1, s1 = 1;
    rc = kv_seq_open(cpu.kv, &s0) || kv_seq_open(gpu.kv, &s1) || s0 || s1;
    check(rc == 0, "%s: range 0 opens on both", file);
    if (rc) {
        run_close(&cpu);
        run_close(&gpu);
        return;
    }
    uint32_t nv = cpu.m->hp.n_vocab;
    float *lc = malloc((size_t)N_GEN * nv * sizeof(float)),
          *lg = malloc((size_t)N_GEN * nv * sizeof(float));
    int same_cpu = 0, same_ref = 0, logit_bad = 0;
    double worst = 0;
    for (int c = 0; c < REF_N_CASES; c++) {
        int32_t ids[MAX_IDS], oc[N_GEN], og[N_GEN], of[N_GEN];
        uint32_t n = prompt_ids(&cpu, c, ids);
        rc = run_greedy(&cpu, 0, ids, n, oc, NULL, lc);
        rc = rc ? rc : run_greedy(&gpu, 0, ids, n, og, NULL, NULL);
        check(rc == 0, "%s %s: forward passes run (%d)", file, ref_cases[c], rc);
        if (rc)
            break;
        bool eq = memcmp(oc, og, sizeof(oc)) == 0;
        same_cpu += eq;
        json_t *ref = ref_find(refs, ref_model, ref_cases[c]);
        json_t *want = json_object_get(ref, "greedy_ids");
        bool eq_ref = json_array_size(want) == N_GEN;
        for (int i = 0; eq_ref && i < N_GEN; i++)
            eq_ref = og[i] == (int32_t)json_integer_value(json_array_get(want, (size_t)i));
        same_ref += eq_ref;
        if (!eq)
            for (int i = 0; i < N_GEN; i++)
                if (oc[i] != og[i]) {
                    printf("  %s %s: GPU diverges from CPU at %d (%d vs %d)\n", file, ref_cases[c],
                           i, og[i], oc[i]);
                    break;
                }
        kv_seq_close(cpu.kv, 0);
        kv_seq_close(gpu.kv, 0);
        uint32_t s;
        kv_seq_open(cpu.kv, &s);
        kv_seq_open(gpu.kv, &s);
        if (!logits)
            continue;
        /* teacher-forced along the CPU's path: the same inputs at every position */
        rc = run_greedy(&gpu, 0, ids, n, of, oc, lg);
        check(rc == 0, "%s %s: teacher-forced GPU run (%d)", file, ref_cases[c], rc);
        for (int i = 0; rc == 0 && i < N_GEN; i++) {
            const float *a = lc + (size_t)i * nv, *b = lg + (size_t)i * nv;
            /* the CPU's top 5 */
            int top[5] = {-1, -1, -1, -1, -1};
            for (int k = 0; k < 5; k++)
                for (uint32_t t = 0; t < nv; t++) {
                    bool taken = false;
                    for (int j = 0; j < k; j++)
                        taken |= top[j] == (int)t;
                    if (!taken && (top[k] < 0 || a[t] > a[top[k]]))
                        top[k] = (int)t;
                }
            for (int k = 0; k < 5; k++) {
                double d = fabs((double)a[top[k]] - (double)b[top[k]]);
                worst = d > worst ? d : worst;
                logit_bad += d > LOGIT_TOL;
            }
        }
        kv_seq_close(gpu.kv, 0);
        kv_seq_open(gpu.kv, &s);
    }
    check(same_cpu >= min_same, "%s%s: GPU greedy == CPU greedy on %d of %d prompts (want >= %d)",
          file, getenv("LLMD_CUDA_Q8") ? " (Q8_0 native)" : "", same_cpu, REF_N_CASES, min_same);
    printf("info: %s: GPU greedy == %s references on %d of %d prompts\n", file, ref_model, same_ref,
           REF_N_CASES);
    if (logits)
        check(logit_bad == 0,
              "%s: top-5 logits within %.0e of the CPU's at every position: %d outside, "
              "largest difference %.3e",
              file, LOGIT_TOL, logit_bad, worst);
    free(lc);
    free(lg);
    run_close(&cpu);
    run_close(&gpu);
}

/* 6: the 7 prompts with a quantized KV cache of type t on both devices. */
static void check_kv_quant(enum kv_dtype t, int min_same) {
    const char *file = "stories260K-f32.gguf", *tn = kv_dtype_name(t);
    struct run cpu, gpu;
    char err[512] = "";
    run_kv = t;
    int rc = run_open(&cpu, file, false, 1, err, sizeof(err));
    check(rc == 0, "kv %s: CPU run opens (%s)", tn, err);
    rc = rc ? rc : run_open(&gpu, file, true, 1, err, sizeof(err));
    check(rc == 0, "kv %s: GPU run opens (%s)", tn, err);
    run_kv = KV_F32;
    if (rc)
        return;
    uint32_t s0 = 1, s1 = 1;
    rc = kv_seq_open(cpu.kv, &s0) || kv_seq_open(gpu.kv, &s1) || s0 || s1;
    check(rc == 0, "kv %s: range 0 opens on both", tn);
    int same = 0, prefix_sum = 0, prefix_min = N_GEN;
    for (int c = 0; rc == 0 && c < REF_N_CASES; c++) {
        int32_t ids[MAX_IDS], oc[N_GEN], og[N_GEN];
        uint32_t n = prompt_ids(&cpu, c, ids);
        rc = run_greedy(&cpu, 0, ids, n, oc, NULL, NULL);
        rc = rc ? rc : run_greedy(&gpu, 0, ids, n, og, NULL, NULL);
        check(rc == 0, "kv %s %s: forward passes run (%d)", tn, ref_cases[c], rc);
        int p = 0;
        while (rc == 0 && p < N_GEN && oc[p] == og[p])
            p++;
        if (rc == 0 && p < N_GEN)
            printf("  kv %s %s: GPU diverges from CPU at %d (%d vs %d)\n", tn, ref_cases[c], p,
                   og[p], oc[p]);
        same += p == N_GEN;
        prefix_sum += p;
        prefix_min = p < prefix_min ? p : prefix_min;
        kv_seq_close(cpu.kv, 0);
        kv_seq_close(gpu.kv, 0);
        uint32_t s;
        kv_seq_open(cpu.kv, &s);
        kv_seq_open(gpu.kv, &s);
    }
    if (rc == 0) {
        check(same >= min_same, "kv %s: GPU greedy == CPU greedy on %d of %d prompts (want >= %d)",
              tn, same, REF_N_CASES, min_same);
        check(prefix_sum >= 32 * REF_N_CASES,
              "kv %s: mean common prefix %.1f of %d tokens (want >= 32), shortest %d", tn,
              (double)prefix_sum / REF_N_CASES, N_GEN, prefix_min);
    }
    run_close(&cpu);
    run_close(&gpu);
}

/* 3: the 7 prompts as one batch of 7 sequences, prefill then decode. */
static void check_batch_invariance(void) {
    struct run gpu;
    char err[512] = "";
    int rc = run_open(&gpu, "stories260K-f32.gguf", true, REF_N_CASES, err, sizeof(err));
    check(rc == 0, "batch: GPU run with 7 ranges opens (%s)", err);
    if (rc)
        return;
    uint32_t nv = gpu.m->hp.n_vocab;
    static int32_t ids[REF_N_CASES][MAX_IDS], solo[REF_N_CASES][N_GEN], both[REF_N_CASES][N_GEN];
    uint32_t n[REF_N_CASES], seq[REF_N_CASES];
    for (int c = 0; rc == 0 && c < REF_N_CASES; c++) {
        n[c] = prompt_ids(&gpu, c, ids[c]);
        rc = kv_seq_open(gpu.kv, &seq[c]);
    }
    for (int c = 0; rc == 0 && c < REF_N_CASES; c++) {
        rc = run_greedy(&gpu, seq[c], ids[c], n[c], solo[c], NULL, NULL);
        kv_seq_close(gpu.kv, seq[c]);
        if (rc == 0)
            rc = kv_seq_open(gpu.kv, &seq[c]);
    }
    float *logits = malloc((size_t)REF_N_CASES * nv * sizeof(float));
    struct model_batch_seq b[REF_N_CASES];
    for (int i = 0; rc == 0 && i < N_GEN; i++) {
        for (int c = 0; c < REF_N_CASES; c++) {
            uint32_t pos = i == 0 ? 0 : n[c] + (uint32_t)i - 1;
            uint32_t k = i == 0 ? n[c] : 1;
            if ((rc = kv_seq_reserve(gpu.kv, seq[c], pos + k)))
                break;
            b[c] = (struct model_batch_seq){.seq = seq[c],
                                            .pos0 = pos,
                                            .n_tok = k,
                                            .tokens = i == 0 ? ids[c] : &both[c][i - 1],
                                            .logits = logits + (size_t)c * nv};
        }
        if (rc == 0)
            rc = model_forward_batch(gpu.ctx, gpu.kv, b, REF_N_CASES);
        for (int c = 0; rc == 0 && c < REF_N_CASES; c++)
            both[c][i] = smp_argmax(logits + (size_t)c * nv, nv);
    }
    check(rc == 0, "batch: 64 batched steps of 7 sequences run (%d)", rc);
    int same = 0;
    for (int c = 0; c < REF_N_CASES; c++)
        same += memcmp(solo[c], both[c], sizeof(solo[c])) == 0;
    check(same == REF_N_CASES, "batch: %d of %d prompts decode the same batched as alone", same,
          REF_N_CASES);
    free(logits);
    run_close(&gpu);
}

/* 4 and 5: the engine on the GPU. */
struct job {
    int32_t prompt[600];
    uint32_t n_prompt;
    uint64_t id;
    int32_t out[16];
    uint32_t n_out;
    enum llmd_finish finish;
};

static void on_token(void *user, uint64_t id, int32_t token, const char *text, size_t len,
                     enum llmd_finish finish) {
    (void)id;
    (void)text;
    (void)len;
    struct job *j = user;
    if (token >= 0 && j->n_out < 16)
        j->out[j->n_out++] = token;
    j->finish = finish;
}

static int engine_run(struct llmd_engine *e, struct job *jobs, int n_jobs) {
    for (int i = 0; i < n_jobs; i++) {
        struct llmd_request r = {.prompt_ids = jobs[i].prompt,
                                 .n_prompt_ids = jobs[i].n_prompt,
                                 .max_tokens = 16,
                                 .on_token = on_token,
                                 .user = &jobs[i]};
        jobs[i].n_out = 0;
        int rc = llmd_submit(e, &r, &jobs[i].id, NULL);
        if (rc)
            return rc;
    }
    int live, steps = 0;
    while ((live = llmd_engine_step(e)) > 0)
        if (++steps > 100000)
            return -ETIMEDOUT;
    return live;
}

static void check_engine_spill(void) {
    enum { N_JOBS = 16, PREFIX = 512 };
    static struct job jobs[N_JOBS], solo[N_JOBS];
    for (int i = 0; i < N_JOBS; i++) {
        /* 8 prefixes of 2 pages, each used twice, 8 requests apart: the
         * first 8 requests' prefixes alone outgrow the pool */
        srand(1000 + (unsigned)(i % 8));
        jobs[i].prompt[0] = 1;
        for (uint32_t t = 1; t < PREFIX; t++)
            jobs[i].prompt[t] = 3 + rand() % 250;
        srand(2000 + (unsigned)i);
        for (uint32_t t = PREFIX; t < PREFIX + 40; t++)
            jobs[i].prompt[t] = 3 + rand() % 250;
        jobs[i].n_prompt = PREFIX + 40;
        solo[i] = jobs[i];
    }
    struct llmd_engine_config cfg = {.model = "dummy:llama3-8b-2l:f32",
                                     .n_ctx = 1024,
                                     .max_seqs = 4,
                                     .max_batched_tokens = 1024,
                                     .kv_type = LLMD_KV_F32,
                                     .device = LLMD_DEVICE_CUDA,
                                     .no_prefix_cache = 1};
    struct llmd_engine *e = NULL;
    char err[512] = "";
    int rc = llmd_engine_open(&cfg, &e, err, sizeof(err));
    check(rc == 0, "engine: dummy:llama3-8b-2l opens on the GPU (%s)", err);
    if (rc)
        return;
    for (int i = 0; rc == 0 && i < N_JOBS; i++)
        rc = engine_run(e, &solo[i], 1);
    check(rc == 0, "engine: 16 solo runs without the prefix cache (%d)", rc);
    /* 5: the map-ahead thread, free-running (no llmd_engine_sync), kept
     * every decode step off the map calls */
    struct llmd_stats ss;
    llmd_stats_get(e, &ss);
    check(ss.decode_map_waits_total == 0,
          "engine: %llu of %llu steps had a decode token wait on a map call (want 0)",
          (unsigned long long)ss.decode_map_waits_total, (unsigned long long)ss.steps_total);
    llmd_engine_close(e);
    /* 20 pages of 128 tokens: 4 running requests of 5 pages fill it, so the
     * cached 4-page prefixes of earlier requests must spill to the host tier */
    cfg.no_prefix_cache = 0;
    cfg.kv_budget_bytes = 20ull * 2 * 1024 * 1024;
    cfg.host_tier_bytes = 64ull * 2 * 1024 * 1024;
    cfg.offload_always = 1;
    rc = llmd_engine_open(&cfg, &e, err, sizeof(err));
    check(rc == 0, "engine: opens with a 20-page pool and a host tier (%s)", err);
    if (rc)
        return;
    rc = engine_run(e, jobs, N_JOBS);
    check(rc == 0, "engine: 16 requests over 8 shared prefixes run (%d)", rc);
    int same = 0;
    for (int i = 0; i < N_JOBS; i++) {
        bool eq = jobs[i].n_out == 16 && memcmp(jobs[i].out, solo[i].out, sizeof(jobs[i].out)) == 0;
        same += eq;
        for (uint32_t t = 0; !eq && t < 16; t++)
            if (t >= jobs[i].n_out || jobs[i].out[t] != solo[i].out[t]) {
                printf("  engine: request %d diverges from its solo run at token %u\n", i, t);
                break;
            }
    }
    check(same >= N_JOBS - 1, "engine: %d of %d outputs equal their solo runs (want >= 15)", same,
          N_JOBS);
    struct llmd_stats st;
    llmd_stats_get(e, &st);
    check(st.spills_host_total > 0 && st.restores_host_total > 0,
          "engine: pages spilled to the host tier (%llu) and restored (%llu)",
          (unsigned long long)st.spills_host_total, (unsigned long long)st.restores_host_total);
    check(st.kv_pages_free + st.kv_pages_cached == st.kv_pages_total,
          "engine: no page left mapped (%llu free + %llu cached of %llu)",
          (unsigned long long)st.kv_pages_free, (unsigned long long)st.kv_pages_cached,
          (unsigned long long)st.kv_pages_total);
    printf("info: engine: %llu steps, %llu prefix-hit tokens, %llu restored tokens\n",
           (unsigned long long)st.steps_total, (unsigned long long)st.prefix_hit_tokens_total,
           (unsigned long long)st.restored_tokens_total);
    llmd_engine_close(e);
}

/* 6: speculative decoding on the GPU (issue 16): stories260K f32, 8
 * repetitive prompts at once, prompt-lookup drafts of fixed length
 * verified in the batched step; greedy ids against the same engine without
 * speculation. cuBLAS may pick another algorithm for another row count,
 * so a near-tie may flip (model_forward.h): at most one request may
 * diverge, and drafts must have been accepted. */
static void check_engine_spec(void) {
    enum { N_JOBS = 8 };
    static struct job plain[N_JOBS], spec[N_JOBS];
    static const int32_t pat[8] = {1, 403, 407, 261, 378, 432, 383, 286};
    for (int i = 0; i < N_JOBS; i++) {
        uint32_t n = 0;
        for (int rep = 0; rep < 4 + i % 3; rep++)
            for (int t = rep ? 1 : 0; t < 8; t++)
                plain[i].prompt[n++] = t == 7 ? pat[t] + i : pat[t];
        plain[i].n_prompt = n;
        spec[i] = plain[i];
    }
    struct llmd_engine_config cfg = {.model = REF_MODELS "/stories260K-f32.gguf",
                                     .n_ctx = 512,
                                     .max_seqs = N_JOBS,
                                     .max_batched_tokens = 256,
                                     .kv_type = LLMD_KV_F32,
                                     .device = LLMD_DEVICE_CUDA,
                                     .no_prefix_cache = 1};
    struct llmd_engine *e = NULL;
    char err[512] = "";
    int rc = llmd_engine_open(&cfg, &e, err, sizeof(err));
    check(rc == 0, "spec: the plain engine opens on the GPU (%s)", err);
    if (rc)
        return;
    rc = engine_run(e, plain, N_JOBS);
    llmd_engine_close(e);
    cfg.spec = LLMD_SPEC_NGRAM;
    cfg.spec_tokens = 6;
    cfg.spec_fixed_len = 1;
    if (rc == 0)
        rc = llmd_engine_open(&cfg, &e, err, sizeof(err));
    check(rc == 0, "spec: the speculating engine opens (%s)", err);
    if (rc)
        return;
    rc = engine_run(e, spec, N_JOBS);
    check(rc == 0, "spec: 8 requests run (%d)", rc);
    int same = 0;
    for (int i = 0; i < N_JOBS; i++)
        same += spec[i].n_out == 16 && memcmp(spec[i].out, plain[i].out, sizeof(spec[i].out)) == 0;
    struct llmd_stats st;
    llmd_stats_get(e, &st);
    check(same >= N_JOBS - 1, "spec: %d of %d greedy outputs equal speculation off (want >= 7)",
          same, N_JOBS);
    check(st.spec_accepted_tokens_total > 0, "spec: %llu of %llu draft tokens accepted",
          (unsigned long long)st.spec_accepted_tokens_total,
          (unsigned long long)st.spec_draft_tokens_total);
    check(st.kv_pages_free + st.kv_pages_cached == st.kv_pages_total,
          "spec: no page left mapped (%llu free + %llu cached of %llu)",
          (unsigned long long)st.kv_pages_free, (unsigned long long)st.kv_pages_cached,
          (unsigned long long)st.kv_pages_total);
    llmd_engine_close(e);
}

int main(void) {
    log_set_level(LOG_LEVEL_WARN);
    /* a KV pool on device 0 decides whether there is anything to test */
    struct model_hparams hp = {.n_layer = 1, .n_head_kv = 1, .head_dim = 64};
    struct kv_config kc = {.dtype = KV_F32, .n_ctx = 16, .n_seqs = 1, .device = KV_DEV_CUDA};
    struct kv_cache *kv = NULL;
    char err[512] = "";
    int rc = kv_cache_create(&hp, &kc, &kv, err, sizeof(err));
    if (rc == -ENOTSUP) {
        printf("cuda backend unavailable: %s\n0 passed, 0 failed, 1 skipped\n", err);
        return 0;
    }
    kv_cache_destroy(kv);
    if (rc) {
        printf("FAIL: a CUDA KV pool on device 0: %s\n0 passed, 1 failed, 0 skipped\n", err);
        return 1;
    }
    refs = ref_load_all();
    if (!refs) {
        printf("FAIL: cannot read " REF_MODELS "/reference.jsonl\n0 passed, 1 failed, 0 skipped\n");
        return 1;
    }
    check_references("stories260K-f32.gguf", "stories260K-f32.gguf", true, 6);
    check_references("stories260K-f16.gguf", "stories260K-f16.gguf", false, 6);
    /* quantised weights are upcast to f16 (or read in blocks) where the CPU
     * dequantises to f32 and rounds activations to Q8_0: a looser bar
     * (model_cuda.h), still one that a wrong kernel cannot meet */
    check_references("stories260K-q8_0.gguf", "stories260K-q8_0.gguf", false, 5);
    setenv("LLMD_CUDA_Q8", "native", 1);
    check_references("stories260K-q8_0.gguf", "stories260K-q8_0.gguf", false, 5);
    unsetenv("LLMD_CUDA_Q8");
    check_references("stories260K-q4_0.gguf", "stories260K-q4_0.gguf", false, 5);
    check_batch_invariance();
    check_kv_quant(KV_Q8_0, 5);
    check_kv_quant(KV_FP8, 5);
    check_kv_quant(KV_Q4_0, 4);
    check_engine_spill();
    check_engine_spec();
    json_decref(refs);
    printf("%d passed, %d failed, 0 skipped\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
