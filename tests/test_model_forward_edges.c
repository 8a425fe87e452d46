/* Edges of model_forward() and kv_cache_create() on the dummy:tiny model
 * (2 layers, 64 wide, 4/2 heads, 512 tokens; f32 weights, 256 B of f16 KV
 * per token): bad token ids, empty calls and positions outside the
 * reservation or the context must be refused without touching the KV, and
 * page sizes from 1 B to 1 GiB must give a working cache of bounded size
 * whose results do not depend on the page size.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "engine/model/kv.h"
#include "engine/model/model.h"
#include "engine/model/model_forward.h"
#include "kernels/kern.h"
#include "mem.h"

static struct model *m;
static struct kern_pool *pool;

static void setup(void) {
    char err[512] = "";
    cr_assert_eq(
        model_load("dummy:tiny", &(struct model_load_opts){.quiet = true}, &m, err, sizeof(err)), 0,
        "%s", err);
    cr_assert_eq(kern_pool_create(1, &pool), 0);
}

static void teardown(void) {
    kern_pool_destroy(pool);
    model_free(m);
}

/* Two sequence slots of n_ctx tokens of f16 (256 B) or f32 (512 B). */
static struct kv_cache *kv_make(enum kv_dtype dtype, uint32_t n_ctx, size_t page_bytes) {
    char err[512] = "";
    struct kv_cache *kv;
    struct kv_config kc = {.dtype = dtype, .n_ctx = n_ctx, .n_seqs = 2, .page_bytes = page_bytes};
    int rc = kv_cache_create(&m->hp, &kc, &kv, err, sizeof(err));
    cr_assert_eq(rc, 0, "kv_cache_create(n_ctx %u, page %zu B): %d %s", n_ctx, page_bytes, rc, err);
    return kv;
}

static const int32_t prompt[12] = {1, 72, 101, 108, 108, 111, 32, 119, 111, 114, 108, 100};

/* Prefill the prompt in chunks of `chunk` into a fresh sequence and return
 * the last logits in out[n_vocab]. */
static void run_prompt(struct kv_cache *kv, uint32_t chunk, float *out) {
    struct model_ctx *ctx;
    uint32_t seq;
    cr_assert_eq(model_ctx_create(m, pool, 12, &ctx), 0);
    cr_assert_eq(kv_seq_open(kv, &seq), 0);
    cr_assert_eq(kv_seq_reserve(kv, seq, 12), 0);
    for (uint32_t p = 0; p < 12; p += chunk) {
        uint32_t n = 12 - p < chunk ? 12 - p : chunk;
        cr_assert_eq(model_forward(ctx, kv, seq, prompt + p, n, p, out), 0, "chunk at %u", p);
    }
    kv_seq_close(kv, seq);
    model_ctx_destroy(ctx);
}

/* ---- model_forward ---- */

struct fwd {
    struct kv_cache *kv;
    struct model_ctx *ctx;
    uint32_t seq;
    float *logits;
};

/* n_ctx 16 of f16 (one 4 KiB page holds all 16), max_tok 8, 4 tokens
 * reserved and run. */
static struct fwd fwd_open(void) {
    struct fwd f = {.kv = kv_make(KV_F16, 16, 0)};
    cr_assert_eq(model_ctx_create(m, pool, 8, &f.ctx), 0);
    cr_assert_eq(kv_seq_open(f.kv, &f.seq), 0);
    cr_assert_eq(kv_seq_reserve(f.kv, f.seq, 4), 0);
    f.logits = mem_alloc(MEM_TEST, m->hp.n_vocab * sizeof(float));
    cr_assert_not_null(f.logits);
    cr_assert_eq(model_forward(f.ctx, f.kv, f.seq, prompt, 4, 0, f.logits), 0);
    return f;
}

static void fwd_close(struct fwd *f) {
    mem_free(f->logits);
    kv_seq_close(f->kv, f->seq);
    model_ctx_destroy(f->ctx);
    kv_cache_destroy(f->kv);
}

/* The KV bytes of positions [0, 4), to show a refused call left them. */
static void kv_snapshot(const struct fwd *f, unsigned char *out, size_t n) {
    cr_assert_leq(n, 4 * f->kv->stride_bytes);
    memcpy(out, kv_slot(f->kv, f->seq, 0, 0, 0), n);
}

Test(model_forward, token_id_outside_vocab_is_einval_and_writes_nothing, .init = setup,
     .fini = teardown) {
    struct fwd f = fwd_open();
    size_t n = 4 * f.kv->stride_bytes;
    unsigned char *before = mem_alloc(MEM_TEST, n), *after = mem_alloc(MEM_TEST, n);
    kv_snapshot(&f, before, n);
    const int32_t bad[] = {-1, (int32_t)m->hp.n_vocab, INT32_MIN, INT32_MAX};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        /* the bad id last, so a pass that ran the good ones first would show */
        int32_t ids[3] = {5, 6, bad[i]};
        int rc = model_forward(f.ctx, f.kv, f.seq, ids, 3, 0, f.logits);
        cr_assert_eq(rc, -EINVAL, "id %d: rc %d", bad[i], rc);
    }
    kv_snapshot(&f, after, n);
    cr_assert_arr_eq(before, after, n, "a refused call wrote KV");
    mem_free(before);
    mem_free(after);
    fwd_close(&f);
}

Test(model_forward, zero_tokens_is_einval, .init = setup, .fini = teardown) {
    struct fwd f = fwd_open();
    cr_assert_eq(model_forward(f.ctx, f.kv, f.seq, prompt, 0, 0, f.logits), -EINVAL);
    cr_assert_eq(model_forward(f.ctx, f.kv, f.seq, NULL, 0, 4, NULL), -EINVAL);
    fwd_close(&f);
}

Test(model_forward, more_tokens_than_max_tok_is_einval, .init = setup, .fini = teardown) {
    struct fwd f = fwd_open();
    int32_t ids[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    cr_assert_eq(kv_seq_reserve(f.kv, f.seq, 9), 0);
    cr_assert_eq(model_forward(f.ctx, f.kv, f.seq, ids, 9, 0, f.logits), -EINVAL);
    fwd_close(&f);
}

Test(model_forward, positions_past_the_reservation_are_erange, .init = setup, .fini = teardown) {
    struct fwd f = fwd_open();
    /* 4 reserved, but the page holds 16 (4 KiB / 256 B): capacity is whole
     * pages, so only what lies past both the page and n_ctx is refused */
    cr_assert_eq(model_forward(f.ctx, f.kv, f.seq, prompt, 1, 16, f.logits), -ERANGE);
    cr_assert_eq(model_forward(f.ctx, f.kv, f.seq, prompt, 2, 15, f.logits), -ERANGE);
    cr_assert_eq(model_forward(f.ctx, f.kv, f.seq, prompt, 1, UINT32_MAX, f.logits), -ERANGE);
    cr_assert_eq(model_forward(f.ctx, f.kv, f.seq, prompt, 2, UINT32_MAX - 1, f.logits), -ERANGE);
    fwd_close(&f);
}

Test(model_forward, unopened_or_closed_sequence_is_erange, .init = setup, .fini = teardown) {
    struct fwd f = fwd_open();
    uint32_t other;
    cr_assert_eq(kv_seq_open(f.kv, &other), 0);
    cr_assert_eq(model_forward(f.ctx, f.kv, other, prompt, 1, 0, f.logits), -ERANGE);
    kv_seq_close(f.kv, other);
    cr_assert_eq(model_forward(f.ctx, f.kv, other, prompt, 1, 0, f.logits), -ERANGE);
    cr_assert_eq(model_forward(f.ctx, f.kv, 2, prompt, 1, 0, f.logits), -ERANGE, "slot n_seqs");
    cr_assert_eq(model_forward(f.ctx, f.kv, UINT32_MAX, prompt, 1, 0, f.logits), -ERANGE);
    fwd_close(&f);
}

/* A 4 KiB page holds 16 f16 tokens, the context 8: position 8 is inside
 * the mapped page but past n_ctx, which kv_seq_reserve() never grants. It
 * used to be accepted, because only the mapped capacity was checked. */
Test(model_forward, regress_pos_past_n_ctx_inside_a_page, .init = setup, .fini = teardown) {
    struct kv_cache *kv = kv_make(KV_F16, 8, 0);
    struct model_ctx *ctx;
    uint32_t seq;
    cr_assert_eq(model_ctx_create(m, pool, 4, &ctx), 0);
    cr_assert_eq(kv_seq_open(kv, &seq), 0);
    cr_assert_eq(kv_seq_reserve(kv, seq, 8), 0);
    cr_assert_eq(kv_seq_reserve(kv, seq, 9), -ERANGE);
    cr_assert_gt(vmm_tokens_per_page(kv->vmm), 8, "premise: a page holds more than n_ctx");
    cr_assert_eq(model_forward(ctx, kv, seq, prompt, 1, 8, NULL), -ERANGE);
    cr_assert_eq(model_forward(ctx, kv, seq, prompt, 2, 7, NULL), -ERANGE);
    cr_assert_eq(model_forward(ctx, kv, seq, prompt, 8, 0, NULL), -EINVAL, "max_tok 4");
    cr_assert_eq(model_forward(ctx, kv, seq, prompt, 4, 4, NULL), 0, "the last 4 of 8 fit");
    kv_seq_close(kv, seq);
    model_ctx_destroy(ctx);
    kv_cache_destroy(kv);
}

/* ---- kv_cache ---- */

Test(kv_cache, n_ctx_1_holds_one_token, .init = setup, .fini = teardown) {
    struct kv_cache *kv = kv_make(KV_F16, 1, 0);
    struct model_ctx *ctx;
    uint32_t seq;
    cr_assert_eq(model_ctx_create(m, pool, 2, &ctx), 0);
    cr_assert_eq(kv_seq_open(kv, &seq), 0);
    cr_assert_eq(kv_seq_reserve(kv, seq, 2), -ERANGE);
    cr_assert_eq(kv_seq_reserve(kv, seq, 1), 0);
    float *logits = mem_alloc(MEM_TEST, m->hp.n_vocab * sizeof(float));
    cr_assert_eq(model_forward(ctx, kv, seq, prompt, 1, 0, logits), 0);
    cr_assert_eq(model_forward(ctx, kv, seq, prompt, 2, 0, logits), -ERANGE);
    cr_assert_eq(model_forward(ctx, kv, seq, prompt + 1, 1, 1, logits), -ERANGE);
    for (uint32_t i = 0; i < m->hp.n_vocab; i++)
        cr_assert(logits[i] == logits[i], "logit %u is NaN", i);
    mem_free(logits);
    kv_seq_close(kv, seq);
    model_ctx_destroy(ctx);
    kv_cache_destroy(kv);
}

Test(kv_cache, zero_context_or_sequences_is_einval, .init = setup, .fini = teardown) {
    char err[256] = "";
    struct kv_cache *kv = NULL;
    struct kv_config kc = {.dtype = KV_F16, .n_ctx = 0, .n_seqs = 1};
    cr_assert_eq(kv_cache_create(&m->hp, &kc, &kv, err, sizeof(err)), -EINVAL);
    kc = (struct kv_config){.dtype = KV_F16, .n_ctx = 4, .n_seqs = 0};
    cr_assert_eq(kv_cache_create(&m->hp, &kc, &kv, err, sizeof(err)), -EINVAL);
    cr_assert_null(kv);
}

Test(kv_cache, page_of_1_byte_rounds_up_to_whole_tokens, .init = setup, .fini = teardown) {
    struct kv_cache *kv = kv_make(KV_F16, 64, 1);
    size_t p = vmm_page_bytes(kv->vmm);
    cr_assert_geq(p, kv->stride_bytes);
    cr_assert_eq(p % kv->stride_bytes, 0, "page %zu B, stride %zu B", p, kv->stride_bytes);
    cr_assert_leq(p, 64 * 1024, "page %zu B for a 1 B request", p);
    kv_cache_destroy(kv);
}

Test(kv_cache, regress_page_of_1_gib_is_clamped_to_the_context, .init = setup, .fini = teardown) {
    /* 64 tokens of 256 B are 16 KiB: a bigger page could never be used,
     * and used to be prefaulted in full for each of the 2 ranges (2 GiB) */
    struct kv_cache *kv = kv_make(KV_F16, 64, (size_t)1 << 30);
    size_t p = vmm_page_bytes(kv->vmm);
    cr_assert_leq(p, 2 * 64 * kv->stride_bytes + 2 * 1024 * 1024, "page %zu B for 64 tokens", p);
    kv_cache_destroy(kv);
}

/* Page size is layout only: 1 B (a 4 KiB page of 8 f32 tokens, so the
 * 12-token prompt spans two), the default, and 1 GiB give the same logits
 * bit for bit, in one chunk and token by token. */
Test(kv_cache, logits_do_not_depend_on_page_size, .init = setup, .fini = teardown) {
    const size_t pages[] = {1, 0, (size_t)1 << 30};
    const uint32_t n_ctx[] = {12, 64, 64};
    size_t nv = m->hp.n_vocab;
    float *ref = mem_alloc(MEM_TEST, nv * sizeof(float)),
          *got = mem_alloc(MEM_TEST, nv * sizeof(float));
    struct kv_cache *kv = kv_make(KV_F32, 64, 0);
    run_prompt(kv, 12, ref);
    kv_cache_destroy(kv);
    for (size_t i = 0; i < sizeof(pages) / sizeof(pages[0]); i++) {
        for (uint32_t chunk = 1; chunk <= 12; chunk += 11) {
            kv = kv_make(KV_F32, n_ctx[i], pages[i]);
            run_prompt(kv, chunk, got);
            cr_assert_arr_eq(got, ref, nv * sizeof(float), "page %zu B, n_ctx %u, chunk %u",
                             pages[i], n_ctx[i], chunk);
            kv_cache_destroy(kv);
        }
    }
    mem_free(ref);
    mem_free(got);
}
