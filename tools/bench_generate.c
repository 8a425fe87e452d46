/* bench_generate - prefill and decode tokens/s of the CPU forward pass,
 * next to the memory-bandwidth roofline measured in the same run.
 *
 * Roofline: decoding one token reads every weight once (all matrices, the
 * classifier, but one row of the embedding table), so tokens/s cannot exceed
 * read bandwidth / those bytes. The bandwidth is measured here, with the same
 * thread count, as a streaming sum over a buffer much larger than the caches.
 *
 * Usage: bench_generate [MODEL ...]   (default: stories260K-f32 from
 * ../shared/models when present, dummy-1g:f16, dummy-1g:q8_0)
 * Env: BENCH_RUNS (default 3), BENCH_PROMPT (prefill tokens, default 128),
 * BENCH_GEN (decode tokens, default 64). Writes build/bench_generate.json.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine/kv.h"
#include "engine/model.h"
#include "engine/model_forward.h"
#include "engine/smp.h"
#include "kernels/kern.h"
#include "mem.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof(double), cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct bw_arg {
    const float *buf;
    size_t n;
    double sums[64];
};

static void bw_fn(void *arg, int ith, int nth) {
    struct bw_arg *a = arg;
    size_t lo = a->n * (size_t)ith / (size_t)nth, hi = a->n * (size_t)(ith + 1) / (size_t)nth;
    float s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0;
    for (size_t i = lo; i + 8 <= hi; i += 8) {
        s0 += a->buf[i];
        s1 += a->buf[i + 1];
        s2 += a->buf[i + 2];
        s3 += a->buf[i + 3];
        s4 += a->buf[i + 4];
        s5 += a->buf[i + 5];
        s6 += a->buf[i + 6];
        s7 += a->buf[i + 7];
    }
    a->sums[ith] = s0 + s1 + s2 + s3 + s4 + s5 + s6 + s7;
}

/* Read bandwidth in bytes/s with the pool's threads: median of runs. */
static double read_bandwidth(struct kern_pool *pool, int runs) {
    size_t n = (size_t)512 << 20 >> 2; /* 512 MiB of floats */
    float *buf = mem_alloc(MEM_MISC, n * sizeof(float));
    if (!buf)
        return 0;
    for (size_t i = 0; i < n; i++)
        buf[i] = (float)(i & 7);
    struct bw_arg a = {.buf = buf, .n = n};
    double t[16];
    for (int r = 0; r < runs; r++) {
        double t0 = now();
        kern_pool_run(pool, bw_fn, &a);
        t[r] = now() - t0;
    }
    mem_free(buf);
    return (double)(n * sizeof(float)) / median(t, runs);
}

static int env_int(const char *k, int def) {
    const char *v = getenv(k);
    return v ? atoi(v) : def;
}

static void bench_model(const char *spec, FILE *json, bool *first_json) {
    char err[512] = "";
    struct model *m;
    double tl = now();
    if (model_load(spec, &(struct model_load_opts){.quiet = true}, &m, err, sizeof(err)) < 0) {
        fprintf(stderr, "bench_generate: %s: %s\n", spec, err);
        return;
    }
    tl = now() - tl;
    const struct model_hparams *hp = &m->hp;
    int runs = env_int("BENCH_RUNS", 3), n_prompt = env_int("BENCH_PROMPT", 128),
        n_gen = env_int("BENCH_GEN", 64);
    if (runs < 1 || runs > 15)
        runs = 3;
    uint64_t row = gguf_type_bytes(m->tok_embd.type, hp->n_embd);
    uint64_t embd_bytes = row * hp->n_vocab;
    /* bytes read per decoded token: everything but the embedding table,
     * plus one row of it; a tied classifier reads the whole table */
    uint64_t per_tok = m->weight_bytes - embd_bytes + row +
                       (m->output.data == m->tok_embd.data ? embd_bytes : 0);
    printf("\n%s: %u layers, n_embd %u, vocab %u, %.1f MB of weights (%.1f MB read per token), "
           "built/loaded in %.1f s\n",
           spec, hp->n_layer, hp->n_embd, hp->n_vocab, (double)m->weight_bytes / 1e6,
           (double)per_tok / 1e6, tl);
    printf("  %-7s %12s %12s %12s %12s %9s\n", "threads", "read GB/s", "roofline t/s",
           "decode t/s", "prefill t/s", "fraction");
    int32_t *ids = malloc((size_t)(n_prompt + n_gen) * sizeof(int32_t));
    float *logits = malloc(hp->n_vocab * sizeof(float));
    for (int i = 0; i < n_prompt; i++)
        ids[i] = (int32_t)((i * 7919u + 13u) % hp->n_vocab);
    for (int threads = 1; threads <= 2; threads++) {
        struct kern_pool *pool;
        struct kv_cache *kv;
        struct model_ctx *ctx;
        struct kv_config kc = {.dtype = KV_F16, .n_ctx = (uint32_t)(n_prompt + n_gen), .n_seqs = 1};
        if (kern_pool_create(threads, &pool) < 0 ||
            kv_cache_create(hp, &kc, &kv, err, sizeof(err)) < 0 ||
            model_ctx_create(m, pool, (uint32_t)n_prompt, &ctx) < 0) {
            fprintf(stderr, "bench_generate: setup failed: %s\n", err);
            exit(1);
        }
        double bw = read_bandwidth(pool, 5);
        double tp[16], td[16];
        for (int r = 0; r < runs; r++) {
            uint32_t seq;
            kv_seq_open(kv, &seq);
            kv_seq_reserve(kv, seq, (uint32_t)n_prompt);
            double t0 = now();
            model_forward(ctx, kv, seq, ids, (uint32_t)n_prompt, 0, logits);
            tp[r] = (double)n_prompt / (now() - t0);
            t0 = now();
            for (int i = 0; i < n_gen; i++) {
                int32_t id = smp_argmax(logits, hp->n_vocab);
                kv_seq_reserve(kv, seq, (uint32_t)(n_prompt + i + 1));
                model_forward(ctx, kv, seq, &id, 1, (uint32_t)(n_prompt + i), logits);
            }
            td[r] = (double)n_gen / (now() - t0);
            kv_seq_close(kv, seq);
        }
        double dec = median(td, runs), pre = median(tp, runs), roof = bw / (double)per_tok;
        printf("  %-7d %12.1f %12.1f %12.1f %12.1f %9.2f\n", threads, bw / 1e9, roof, dec, pre,
               dec / roof);
        fprintf(json,
                "%s\n  {\"model\": \"%s\", \"threads\": %d, \"read_gbps\": %.2f, "
                "\"roofline_tps\": %.1f, \"decode_tps\": %.1f, \"prefill_tps\": %.1f, "
                "\"prompt_tokens\": %d, \"gen_tokens\": %d, \"runs\": %d}",
                *first_json ? "" : ",", spec, threads, bw / 1e9, roof, dec, pre, n_prompt, n_gen,
                runs);
        *first_json = false;
        model_ctx_destroy(ctx);
        kv_cache_destroy(kv);
        kern_pool_destroy(pool);
    }
    free(ids);
    free(logits);
    model_free(m);
}

int main(int argc, char **argv) {
    const char *defaults[] = {"../shared/models/stories260K-f32.gguf", "dummy:dummy-1g:f16",
                              "dummy:dummy-1g:q8_0"};
    FILE *json = fopen("build/bench_generate.json", "w");
    if (!json)
        json = fopen("/dev/null", "w");
    fprintf(json, "[");
    bool first = true;
    printf("bench_generate: median of BENCH_RUNS runs; KV f16; decode after a %d-token prompt\n",
           env_int("BENCH_PROMPT", 128));
    if (argc > 1) {
        for (int i = 1; i < argc; i++)
            bench_model(argv[i], json, &first);
    } else {
        for (size_t i = 0; i < sizeof(defaults) / sizeof(defaults[0]); i++)
            if (strncmp(defaults[i], "dummy:", 6) == 0 || access(defaults[i], R_OK) == 0)
                bench_model(defaults[i], json, &first);
    }
    fprintf(json, "\n]\n");
    fclose(json);
    return 0;
}
