/* First-light acceptance: stories260K from GGUF, on the CPU, with its KV
 * cache in vmm pages, reproduces the greedy references of llama2.c and
 * llama.cpp (../shared/models/reference.jsonl; see its README), on every
 * instruction-set level this CPU has (the model is loaded after the level
 * is set: packing is decided at load). */
#include <criterion/criterion.h>
#include <math.h>

#include "engine/model/kv.h"
#include "engine/model/model.h"
#include "engine/model/model_forward.h"
#include "engine/model/smp.h"
#include "engine/model/tok.h"
#include "kernels/kern.h"
#include "tests/lib/kern_util.h"
#include "tests/lib/ref_util.h"

#define N_GEN 64

struct run {
    struct model *m;
    struct kern_pool *pool;
    struct kv_cache *kv;
    struct model_ctx *ctx;
    uint32_t seq;
    float *logits;
};

static void run_open(struct run *r, const char *file, enum kv_dtype kvt, uint32_t batch) {
    char path[512], err[512] = "";
    snprintf(path, sizeof(path), REF_MODELS "/%s", file);
    int rc = model_load(path, &(struct model_load_opts){.quiet = true}, &r->m, err, sizeof(err));
    cr_assert_eq(rc, 0, "load %s: %s", path, err);
    struct kv_config kc = {.dtype = kvt, .n_ctx = 512, .n_seqs = 1};
    cr_assert_eq(kv_cache_create(&r->m->hp, &kc, &r->kv, err, sizeof(err)), 0, "kv: %s", err);
    cr_assert_eq(kern_pool_create(1, &r->pool), 0);
    cr_assert_eq(model_ctx_create(r->m, r->pool, batch, &r->ctx), 0);
    cr_assert_eq(kv_seq_open(r->kv, &r->seq), 0);
    r->logits = malloc(r->m->hp.n_vocab * sizeof(float));
}

static void run_close(struct run *r) {
    kv_seq_close(r->kv, r->seq);
    free(r->logits);
    model_ctx_destroy(r->ctx);
    kern_pool_destroy(r->pool);
    kv_cache_destroy(r->kv);
    model_free(r->m);
}

/* Prefill ids[0..n) in chunks of `batch`, leaving the last logits. */
static void run_prefill(struct run *r, const int32_t *ids, uint32_t n, uint32_t batch) {
    for (uint32_t pos = 0; pos < n; pos += batch) {
        uint32_t k = n - pos < batch ? n - pos : batch;
        cr_assert_eq(kv_seq_reserve(r->kv, r->seq, pos + k), 0);
        cr_assert_eq(model_forward(r->ctx, r->kv, r->seq, ids + pos, k, pos,
                                   pos + k == n ? r->logits : NULL),
                     0);
    }
}

/* Tokenize `prompt` (checking it against want_prompt when given), prefill,
 * then greedy-decode N_GEN ids into out. */
static void run_greedy(struct run *r, const char *prompt, json_t *want_prompt, int32_t *out) {
    int32_t ids[512];
    size_t n = 0;
    cr_assert_eq(tok_encode(r->m->tok, prompt, strlen(prompt), true, ids, 512, &n), 0);
    if (want_prompt) {
        int32_t want[512];
        size_t nw = ref_ids(want_prompt, want, 512);
        cr_assert_eq(n, nw, "prompt '%s': %zu ids, want %zu", prompt, n, nw);
        for (size_t i = 0; i < n; i++)
            cr_assert_eq(ids[i], want[i], "prompt '%s' id %zu: %d want %d", prompt, i, ids[i],
                         want[i]);
    }
    run_prefill(r, ids, (uint32_t)n, 64);
    uint32_t pos = (uint32_t)n;
    for (int i = 0; i < N_GEN; i++) {
        out[i] = smp_argmax(r->logits, r->m->hp.n_vocab);
        if (i + 1 == N_GEN)
            break;
        cr_assert_eq(kv_seq_reserve(r->kv, r->seq, pos + 1), 0);
        cr_assert_eq(model_forward(r->ctx, r->kv, r->seq, &out[i], 1, pos, r->logits), 0);
        pos++;
    }
    /* the sequence is reused by the next prompt: start over */
    kv_seq_close(r->kv, r->seq);
    cr_assert_eq(kv_seq_open(r->kv, &r->seq), 0);
}

/* Index of the first difference, or -1. */
static int first_diff(const int32_t *a, json_t *want) {
    for (int i = 0; i < N_GEN; i++)
        if (a[i] != (int32_t)json_integer_value(json_array_get(want, (size_t)i)))
            return i;
    return -1;
}

/* Greedy ids of `file` for every case against the lines of `ref_model`;
 * returns how many of the 7 match all N_GEN ids. */
static int match_cases(const char *file, const char *ref_model, bool check_prompt) {
    json_t *all = ref_load_all();
    cr_assert_not_null(all, "cannot read " REF_MODELS "/reference.jsonl");
    struct run r;
    run_open(&r, file, KV_F32, 64);
    int ok = 0;
    for (int c = 0; c < REF_N_CASES; c++) {
        json_t *ref = ref_find(all, ref_model, ref_cases[c]);
        cr_assert_not_null(ref, "no reference line for %s/%s", ref_model, ref_cases[c]);
        int32_t got[N_GEN];
        run_greedy(&r, json_string_value(json_object_get(ref, "prompt")),
                   check_prompt ? json_object_get(ref, "prompt_ids") : NULL, got);
        int d = first_diff(got, json_object_get(ref, "greedy_ids"));
        if (d < 0)
            ok++;
        else
            cr_log_info("%s %s: first divergence from %s at index %d (got %d)", file, ref_cases[c],
                        ref_model, d, got[d]);
    }
    run_close(&r);
    json_decref(all);
    return ok;
}

/* match_cases() at every level: `want` prompts from the AVX2 level up,
 * whose sums have the shape of ggml's AVX2 code that made the llama.cpp
 * lines, `want_scalar` on the portable level, which sums in ggml's generic
 * order (measured: f16 6, q8_0 6 of 7; q4_0 below; the f32 lines come from
 * llama2.c and match on every level), and `want_avx512` from the AVX512
 * level up, where a type the level packs sums as the pack does (q8_0
 * below). */
static void match_each_level(const char *file, const char *ref_model, bool check_prompt, int want,
                             int want_scalar, int want_avx512) {
    for (size_t ii = 0; ii < kt_n_isas(); ii++) {
        kern_set_isa(kt_isas[ii]);
        int ok = match_cases(file, ref_model, check_prompt);
        int bar = kt_isas[ii] == KERN_ISA_SCALAR   ? want_scalar
                  : kt_isas[ii] >= KERN_ISA_AVX512 ? want_avx512
                                                   : want;
        cr_assert_geq(ok, bar, "%s at %s: %d of %d prompts match %s", file,
                      kern_isa_name(kt_isas[ii]), ok, REF_N_CASES, ref_model);
    }
}

Test(model_reference, f32_gguf_matches_llama2c_greedy_on_all_prompts, .timeout = 120) {
    match_each_level("stories260K-f32.gguf", "stories260K.bin", true, REF_N_CASES, REF_N_CASES,
                     REF_N_CASES);
}

Test(model_reference, f16_gguf_matches_references_on_all_prompts, .timeout = 120) {
    match_each_level("stories260K-f16.gguf", "stories260K-f16.gguf", false, REF_N_CASES, 6,
                     REF_N_CASES);
}

/* q8_0: the avx2 and avx-vnni levels sum as ggml's AVX2 vec_dot (eight
 * lanes a block), which made the llama.cpp lines: 6 of 7 (long_neartie
 * diverges at index 22). From avx512 up q8_0 sums one integer a block, as its
 * pack does (kernels/cpu/pack.c: 1.3-1.6x the prefill of the lane order
 * on an Emerald Rapids vCPU): measured 5 of 7 there, long_neartie at 22 and
 * sentence at 53, where it takes id 291, the token of llama2.c and of
 * llama.cpp's f32 and f16 lines, over the q8_0 line's 359. The portable
 * level (ggml's generic order: one integer a block, mul and add) diverges
 * on sentence at 53 too and matches long_neartie: 6 of 7. */
Test(model_reference, q8_0_gguf_matches_llamacpp_on_five_or_six_of_seven, .timeout = 120) {
    match_each_level("stories260K-q8_0.gguf", "stories260K-q8_0.gguf", false, 6, 6, 5);
    if (kern_isa_max() < KERN_ISA_AVX512)
        return;
    kern_set_isa(KERN_ISA_AVX512);
    json_t *all = ref_load_all();
    cr_assert_not_null(all);
    json_t *q8 = ref_find(all, "stories260K-q8_0.gguf", "sentence");
    json_t *f32 = ref_find(all, "stories260K-f32.gguf", "sentence");
    cr_assert(q8 && f32);
    struct run r;
    run_open(&r, "stories260K-q8_0.gguf", KV_F32, 64);
    int32_t got[N_GEN];
    run_greedy(&r, json_string_value(json_object_get(q8, "prompt")), NULL, got);
    run_close(&r);
    cr_assert_eq(first_diff(got, json_object_get(q8, "greedy_ids")), 53);
    const json_int_t f32_53 =
        json_integer_value(json_array_get(json_object_get(f32, "greedy_ids"), 53));
    cr_assert_eq(got[53], f32_53, "avx512 sentence[53] = %d, the f32 line's is %lld", got[53],
                 (long long)f32_53);
    json_decref(all);
}

Test(model_reference, first_position_top5_logits_within_1e4, .timeout = 60) {
    json_t *all = ref_load_all();
    cr_assert_not_null(all);
    json_t *ref = ref_find(all, "stories260K.bin", "once_top5");
    cr_assert_not_null(ref);
    struct run r;
    run_open(&r, "stories260K-f32.gguf", KV_F32, 64);
    int32_t ids[] = {1, 403, 407, 261, 378};
    run_prefill(&r, ids, 5, 64);
    json_t *top5 = json_object_get(ref, "top5_logits");
    cr_assert_eq(json_array_size(top5), 5);
    for (size_t i = 0; i < 5; i++) {
        json_t *pair = json_array_get(top5, i);
        int id = (int)json_integer_value(json_array_get(pair, 0));
        double want = json_number_value(json_array_get(pair, 1));
        cr_assert(fabs(r.logits[id] - want) <= 1e-4, "logit[%d] = %.7f, want %.7f", id,
                  r.logits[id], want);
    }
    run_close(&r);
    json_decref(all);
}

/* Chunked prefill computes the same logits bit for bit as one chunk or as
 * token-by-token: the kernels reduce in an order independent of the batch. */
Test(model_reference, logits_do_not_depend_on_prefill_chunking, .timeout = 60) {
    static const uint32_t batches[] = {1, 3, 7, 64};
    static const char *const files[] = {"stories260K-f32.gguf", "stories260K-q8_0.gguf",
                                        "stories260K-q4_0.gguf"};
    float first[512];
    int32_t ids[40];
    for (int i = 0; i < 40; i++)
        ids[i] = i == 0 ? 1 : 259 + (i * 37) % 253;
    for (size_t ii = 0; ii < kt_n_isas(); ii++)
        for (size_t f = 0; f < 3; f++)
            for (size_t b = 0; b < sizeof(batches) / sizeof(batches[0]); b++) {
                kern_set_isa(kt_isas[ii]);
                struct run r;
                run_open(&r, files[f], KV_F32, batches[b]);
                run_prefill(&r, ids, 40, batches[b]);
                if (b == 0)
                    memcpy(first, r.logits, sizeof(first));
                else
                    cr_assert_arr_eq(first, r.logits, sizeof(first),
                                     "%s at %s: batch %u differs from batch 1", files[f],
                                     kern_isa_name(kt_isas[ii]), batches[b]);
                run_close(&r);
            }
}

/* q4_0: llama.cpp's lines are the oracle (its activations are quantized to
 * q8_0 like ours). Every level sums a Q4_0 product as ggml's repacked
 * q4_0_8x8 kernels do (one integer sum and one fma per block), which
 * llama.cpp ran on this file's attention matrices (32 and 64 rows); its
 * 172-row FFN matrices (not a multiple of 8) went through its vec_dot
 * (eight lane sums a block), and its x86 activation quantizer rounds 127 /
 * amax and ties unlike the reference rule both engines' scalar paths use:
 * near-ties split on those. Measured: 6 of 7 on the portable level
 * (long_neartie diverges at index 43), 5 on the AVX2 level
 * (punct_digits_utf8 at 14, long_neartie at 57); the lane order before it
 * gave 6 on the AVX2 level and 4 on the portable one. */
Test(model_reference, q4_0_gguf_matches_llamacpp_on_five_of_seven, .timeout = 120) {
    match_each_level("stories260K-q4_0.gguf", "stories260K-q4_0.gguf", false, 5, 6, 5);
}
