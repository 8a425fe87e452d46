/* bench_generate - prefill and decode tokens/s of the CPU forward pass,
 * next to the memory-bandwidth roofline measured in the same run.
 *
 * Roofline: decoding one token reads every weight once (all matrices, the
 * classifier, but one row of the embedding table), so tokens/s cannot exceed
 * read bandwidth / those bytes. The bandwidth is measured here, with the same
 * thread count, as a streaming AVX2 sum over 512 MiB (tests/bench/bench_util.h).
 *
 * Usage: bench_generate [MODEL ...]   (default: stories260K-f32 from
 * ../shared/models when present, dummy-1g:f16, dummy-1g:q8_0)
 * Env: BENCH_RUNS (default 3), BENCH_PROMPT (prefill tokens, default 128),
 * BENCH_GEN (decode tokens, default 64), BENCH_THREADS (only this thread
 * count; default 1 then 2), BENCH_JSON (the JSON file, default
 * build/bench_generate.json). Prints the instruction-set level it ran.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/model/kv.h"
#include "engine/model/model.h"
#include "engine/model/model_forward.h"
#include "engine/model/smp.h"
#include "kernels/kern.h"
#include "mem.h"
#include "tests/bench/bench_util.h"

static int env_int(const char *k, int def) {
    const char *v = getenv(k);
    return v ? atoi(v) : def;
}

/* Returns 0, or 1 when the model does not load (the caller's exit code:
 * a script must not read an empty table as a result). */
static int bench_model(const char *spec, FILE *json, bool *first_json) {
    char err[512] = "";
    struct model *m;
    double tl = bench_now();
    if (model_load(spec, &(struct model_load_opts){.quiet = true}, &m, err, sizeof(err)) < 0) {
        fprintf(stderr, "bench_generate: %s\n", err); /* err names spec */
        return 1;
    }
    tl = bench_now() - tl;
    const struct model_hparams *hp = &m->hp;
    int runs = env_int("BENCH_RUNS", 3), n_prompt = env_int("BENCH_PROMPT", 128),
        n_gen = env_int("BENCH_GEN", 64);
    if (runs < 1 || runs > 15)
        runs = 3;
    uint64_t row = kern_row_bytes(m->tok_embd.type, hp->n_embd);
    uint64_t embd_bytes = row * hp->n_vocab;
    /* bytes read per decoded token: everything but the embedding table,
     * plus one row of it; a tied classifier reads the whole table */
    uint64_t per_tok = m->weight_bytes - embd_bytes + row + (m->output_tied ? embd_bytes : 0);
    printf("\n%s: %u layers, n_embd %u, vocab %u, %.1f MB of weights (%.1f MB read per token), "
           "built/loaded in %.1f s\n",
           spec, hp->n_layer, hp->n_embd, hp->n_vocab, (double)m->weight_bytes / 1e6,
           (double)per_tok / 1e6, tl);
    printf("  %-7s %12s %12s %12s %12s %9s\n", "threads", "read GB/s", "roofline t/s", "decode t/s",
           "prefill t/s", "fraction");
    int32_t *ids = malloc((size_t)(n_prompt + n_gen) * sizeof(int32_t));
    float *logits = malloc(hp->n_vocab * sizeof(float));
    for (int i = 0; i < n_prompt; i++)
        ids[i] = (int32_t)((i * 7919u + 13u) % hp->n_vocab);
    const int only = env_int("BENCH_THREADS", 0);
    for (int threads = only > 0 ? only : 1; threads <= (only > 0 ? only : 2); threads++) {
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
        double bw = bench_read_bandwidth(pool, (size_t)512 << 20, 5);
        double tp[16], td[16];
        for (int r = 0; r < runs; r++) {
            uint32_t seq;
            kv_seq_open(kv, &seq);
            kv_seq_reserve(kv, seq, (uint32_t)n_prompt);
            double t0 = bench_now();
            model_forward(ctx, kv, seq, ids, (uint32_t)n_prompt, 0, logits);
            tp[r] = (double)n_prompt / (bench_now() - t0);
            t0 = bench_now();
            for (int i = 0; i < n_gen; i++) {
                int32_t id = smp_argmax(logits, hp->n_vocab);
                kv_seq_reserve(kv, seq, (uint32_t)(n_prompt + i + 1));
                model_forward(ctx, kv, seq, &id, 1, (uint32_t)(n_prompt + i), logits);
            }
            td[r] = (double)n_gen / (bench_now() - t0);
            kv_seq_close(kv, seq);
        }
        double dec = bench_median(td, runs), pre = bench_median(tp, runs),
               roof = bw / (double)per_tok;
        printf("  %-7d %12.1f %12.1f %12.1f %12.1f %9.2f\n", threads, bw / 1e9, roof, dec, pre,
               dec / roof);
        fprintf(json,
                "%s\n  {\"model\": \"%s\", \"threads\": %d, \"read_gbps\": %.2f, "
                "\"roofline_tps\": %.1f, \"decode_tps\": %.1f, \"prefill_tps\": %.1f, "
                "\"prompt_tokens\": %d, \"gen_tokens\": %d, \"runs\": %d, \"isa\": \"%s\", "
                "\"packed_bytes\": %llu, \"copied_bytes\": %llu}",
                *first_json ? "" : ",", spec, threads, bw / 1e9, roof, dec, pre, n_prompt, n_gen,
                runs, kern_isa_name(kern_isa()), (unsigned long long)m->packed_bytes,
                (unsigned long long)m->copied_bytes);
        *first_json = false;
        model_ctx_destroy(ctx);
        kv_cache_destroy(kv);
        kern_pool_destroy(pool);
    }
    free(ids);
    free(logits);
    model_free(m);
    return 0;
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: bench_generate [MODEL ...]\n"
                   "  MODEL: a GGUF path or dummy:SHAPE[:TYPE] (default: stories260K-f32 from\n"
                   "  ../shared/models when present, dummy:dummy-1g:f16, dummy:dummy-1g:q8_0)\n"
                   "Env: BENCH_RUNS (1..15, default 3), BENCH_PROMPT (prefill tokens, default "
                   "128),\n"
                   "  BENCH_GEN (decode tokens, default 64), BENCH_THREADS (only this thread "
                   "count),\n"
                   "  BENCH_JSON (default build/bench_generate.json)\n");
            return 0;
        }
    const char *defaults[] = {"../shared/models/stories260K-f32.gguf", "dummy:dummy-1g:f16",
                              "dummy:dummy-1g:q8_0"};
    const char *jpath = getenv("BENCH_JSON");
    FILE *json = fopen(jpath && *jpath ? jpath : "build/bench_generate.json", "w");
    if (!json)
        json = fopen("/dev/null", "w");
    fprintf(json, "[");
    bool first = true;
    int bad = 0;
    char isa[96];
    kern_isa_describe(isa, sizeof(isa));
    printf("bench_generate: median of %d runs; KV f16; decode after a %d-token prompt; isa %s\n",
           env_int("BENCH_RUNS", 3) >= 1 && env_int("BENCH_RUNS", 3) <= 15
               ? env_int("BENCH_RUNS", 3)
               : 3,
           env_int("BENCH_PROMPT", 128), isa);
    if (argc > 1) {
        for (int i = 1; i < argc; i++)
            bad |= bench_model(argv[i], json, &first);
    } else {
        for (size_t i = 0; i < sizeof(defaults) / sizeof(defaults[0]); i++)
            if (strncmp(defaults[i], "dummy:", 6) == 0 || access(defaults[i], R_OK) == 0)
                bad |= bench_model(defaults[i], json, &first);
    }
    fprintf(json, "\n]\n");
    fclose(json);
    return bad;
}
