/* The quantized KV caches in the model layer on stories260K (head_dim 8:
 * four heads share a Q8_0/Q4_0 block): the token stride and page geometry
 * each type gives, the refusals (an unknown type, a quantized cache on a
 * GPU), and that a prompt's logits do not depend on how it was chunked,
 * whatever the cache type. */
#include <criterion/criterion.h>
#include <errno.h>
#include <string.h>

#include "engine/model/kv.h"
#include "engine/model/model.h"
#include "engine/model/model_forward.h"
#include "kernels/kern.h"
#include "tests/lib/ref_util.h"

#define F32 REF_MODELS "/stories260K-f32.gguf"

static struct model *m;

static void setup(void) {
    char err[512] = "";
    cr_assert_eq(model_load(F32, &(struct model_load_opts){.quiet = true}, &m, err, sizeof(err)), 0,
                 "%s", err);
}

static void teardown(void) {
    model_free(m);
}

/* Row = 4 heads x 8 = 32 values: f32 128 B, f16 64, q8_0 one block (34),
 * q4_0 one block (18), fp8 4 x (4 + 8) = 48; a token is 5 layers x K and V,
 * padded to 64 B; a page is 16 tokens rounded up to whole 4 KiB host pages
 * and whole tokens. */
Test(model_kvquant, stride_and_pages_follow_the_type, .init = setup, .fini = teardown) {
    static const struct {
        enum kv_dtype t;
        size_t row, stride, page;
        uint32_t tpp;
    } c[] = {
        {KV_F32, 128, 1280, 20480, 16}, {KV_F16, 64, 640, 20480, 32}, {KV_Q8_0, 34, 384, 12288, 32},
        {KV_Q4_0, 18, 192, 12288, 64},  {KV_FP8, 48, 512, 8192, 16},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        char err[256] = "";
        struct kv_cache *kv;
        struct kv_config kc = {.dtype = c[i].t, .n_ctx = 256, .n_seqs = 2};
        cr_assert_eq(kv_cache_create(&m->hp, &kc, &kv, err, sizeof err), 0, "%s", err);
        cr_assert_eq(kv->layer_bytes, c[i].row, "%s: row %zu", kv_dtype_name(c[i].t),
                     kv->layer_bytes);
        cr_assert_eq(kv->stride_bytes, c[i].stride, "%s: stride %zu", kv_dtype_name(c[i].t),
                     kv->stride_bytes);
        cr_assert_eq(vmm_page_bytes(kv->vmm), c[i].page, "%s: page %zu", kv_dtype_name(c[i].t),
                     vmm_page_bytes(kv->vmm));
        cr_assert_eq(kv->tpp, c[i].tpp, "%s: %u tokens a page", kv_dtype_name(c[i].t), kv->tpp);
        /* K of layer 4 and V after it end inside the token */
        cr_assert_leq(9 * kv->layer_bytes + kv->layer_bytes, kv->stride_bytes);
        kv_cache_destroy(kv);
    }
}

Test(model_kvquant, names_parse_both_ways) {
    for (int t = 0; t < KV_DTYPE_N; t++) {
        enum kv_dtype d;
        cr_assert_eq(kv_dtype_parse(kv_dtype_name((enum kv_dtype)t), &d), 0);
        cr_assert_eq((int)d, t);
    }
    enum kv_dtype d = KV_F16;
    cr_assert_eq(kv_dtype_parse("q4", &d), -EINVAL);
    cr_assert_eq(kv_dtype_parse("Q8_0", &d), -EINVAL);
    cr_assert_eq(kv_dtype_parse(NULL, &d), -EINVAL);
    cr_assert_eq(d, KV_F16, "untouched on error");
    cr_assert_str_eq(kv_dtype_name(KV_DTYPE_N), "?");
}

Test(model_kvquant, bad_types_are_refused, .init = setup, .fini = teardown) {
    char err[256] = "";
    struct kv_cache *kv = NULL;
    struct kv_config kc = {.dtype = KV_DTYPE_N, .n_ctx = 64, .n_seqs = 1};
    cr_assert_eq(kv_cache_create(&m->hp, &kc, &kv, err, sizeof err), -EINVAL);
    cr_assert(strstr(err, "unknown KV type 5") && strstr(err, "q8_0"), "%s", err);
    cr_assert_null(kv);
    /* a quantized cache on a GPU: refused before any CUDA call, so here too */
    const enum kv_dtype q[] = {KV_Q8_0, KV_Q4_0, KV_FP8};
    for (int i = 0; i < 3; i++) {
        kc = (struct kv_config){.dtype = q[i], .n_ctx = 64, .n_seqs = 1, .device = KV_DEV_CUDA};
        err[0] = '\0';
        cr_assert_eq(kv_cache_create(&m->hp, &kc, &kv, err, sizeof err), -ENOTSUP);
        cr_assert(strstr(err, kv_dtype_name(q[i])) && strstr(err, "CPU only"), "%s", err);
        cr_assert_null(kv);
    }
}

/* A 40-token prompt in one chunk, in chunks of 7, and token by token: the
 * same last logits to the bit, in every cache type (the store quantizes each
 * token's row alone; attention reduces in an order set by the key count). */
Test(model_kvquant, logits_do_not_depend_on_chunking, .init = setup, .fini = teardown,
     .timeout = 60) {
    int32_t ids[40];
    for (int i = 0; i < 40; i++)
        ids[i] = i ? 259 + (i * 37) % 250 : 1;
    struct kern_pool *pool;
    struct model_ctx *ctx;
    cr_assert_eq(kern_pool_create(2, &pool), 0);
    cr_assert_eq(model_ctx_create(m, pool, 40, &ctx), 0);
    for (int t = 0; t < KV_DTYPE_N; t++) {
        char err[256] = "";
        struct kv_cache *kv;
        struct kv_config kc = {.dtype = (enum kv_dtype)t, .n_ctx = 64, .n_seqs = 3};
        cr_assert_eq(kv_cache_create(&m->hp, &kc, &kv, err, sizeof err), 0, "%s", err);
        static float l[3][512];
        const uint32_t chunks[3] = {40, 7, 1};
        for (int r = 0; r < 3; r++) {
            uint32_t seq;
            cr_assert_eq(kv_seq_open(kv, &seq), 0);
            cr_assert_eq(kv_seq_reserve(kv, seq, 40), 0);
            for (uint32_t p = 0; p < 40; p += chunks[r]) {
                uint32_t n = 40 - p < chunks[r] ? 40 - p : chunks[r];
                cr_assert_eq(model_forward(ctx, kv, seq, ids + p, n, p, l[r]), 0);
            }
        }
        cr_assert_arr_eq(l[1], l[0], sizeof l[0], "%s: chunks of 7", kv_dtype_name(kc.dtype));
        cr_assert_arr_eq(l[2], l[0], sizeof l[0], "%s: token by token", kv_dtype_name(kc.dtype));
        kv_cache_destroy(kv);
    }
    model_ctx_destroy(ctx);
    kern_pool_destroy(pool);
}
