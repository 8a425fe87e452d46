/* The batched forward pass: several sequences in one flattened step give
 * the same bits as each sequence alone, and a batched greedy run of four
 * prompts reproduces the llama2.c references. */
#include <criterion/criterion.h>
#include <errno.h>

#include "engine/model/kv.h"
#include "engine/model/model.h"
#include "engine/model/model_forward.h"
#include "engine/model/smp.h"
#include "engine/model/tok.h"
#include "kernels/kern.h"
#include "mem.h"
#include "tests/lib/ref_util.h"

#define F32 REF_MODELS "/stories260K-f32.gguf"

static struct model *m;
static struct kern_pool *pool;
static struct kv_cache *kv;
static struct model_ctx *ctx;

static void setup(void) {
    char err[512] = "";
    cr_assert_eq(model_load(F32, &(struct model_load_opts){.quiet = true}, &m, err, sizeof(err)), 0,
                 "%s", err);
    struct kv_config kc = {.dtype = KV_F32, .n_ctx = 512, .n_seqs = 8};
    cr_assert_eq(kv_cache_create(&m->hp, &kc, &kv, err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(kern_pool_create(2, &pool), 0);
    cr_assert_eq(model_ctx_create(m, pool, 128, &ctx), 0);
}

static void teardown(void) {
    model_ctx_destroy(ctx);
    kern_pool_destroy(pool);
    kv_cache_destroy(kv);
    model_free(m);
}

static uint32_t open_seq(uint32_t n_tokens) {
    uint32_t s;
    cr_assert_eq(kv_seq_open(kv, &s), 0);
    cr_assert_eq(kv_seq_reserve(kv, s, n_tokens), 0);
    return s;
}

/* A mixed step (one decode token, two prefill chunks of different
 * lengths) equals running each part alone, to the bit. */
Test(model_batch, mixed_step_equals_sequences_alone, .init = setup, .fini = teardown,
     .timeout = 60) {
    int32_t a[10] = {1, 403, 407, 261, 378, 432, 383, 286, 261, 376};
    int32_t b[9] = {1, 300, 301, 302, 303, 304, 305, 306, 307};
    int32_t c[7] = {1, 420, 421, 422, 423, 424, 425};
    float la[512], lb[512], lc[512], ra[512], rb[512], rc[512];

    /* batched: A has 9 tokens of history, B 5; then one step of
     * A decode (1) + B chunk (4) + C prefill (7) */
    uint32_t sa = open_seq(10), sb = open_seq(9), sc = open_seq(7);
    cr_assert_eq(model_forward(ctx, kv, sa, a, 9, 0, NULL), 0);
    cr_assert_eq(model_forward(ctx, kv, sb, b, 5, 0, NULL), 0);
    struct model_batch_seq step[3] = {
        {.seq = sa, .pos0 = 9, .n_tok = 1, .tokens = a + 9, .logits = la},
        {.seq = sb, .pos0 = 5, .n_tok = 4, .tokens = b + 5, .logits = lb},
        {.seq = sc, .pos0 = 0, .n_tok = 7, .tokens = c, .logits = lc},
    };
    cr_assert_eq(model_forward_batch(ctx, kv, step, 3), 0);

    /* alone, in fresh sequences, whole prompts in one chunk */
    uint32_t ta = open_seq(10), tb = open_seq(9), tc = open_seq(7);
    cr_assert_eq(model_forward(ctx, kv, ta, a, 10, 0, ra), 0);
    cr_assert_eq(model_forward(ctx, kv, tb, b, 9, 0, rb), 0);
    cr_assert_eq(model_forward(ctx, kv, tc, c, 7, 0, rc), 0);
    cr_assert_arr_eq(la, ra, sizeof(la), "decode row of A differs");
    cr_assert_arr_eq(lb, rb, sizeof(lb), "chunk of B differs");
    cr_assert_arr_eq(lc, rc, sizeof(lc), "prefill of C differs");
}

/* Several rows of logits per entry (verification of a speculative draft):
 * each row equals the logits of that position computed alone, to the bit,
 * beside a plain decode, on both classifier paths (the rows in one
 * product, and one row at a time when the wide buffer cannot be had).
 * Asking for more rows than tokens is -EINVAL. */
static void check_rows(bool starve) {
    int32_t a[12] = {1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 290, 300};
    int32_t b[9] = {1, 300, 301, 302, 303, 304, 305, 306, 307};
    static float la[5][512], lb[512], ref[512];
    uint32_t sa = open_seq(12), sb = open_seq(9);
    cr_assert_eq(model_forward(ctx, kv, sa, a, 7, 0, NULL), 0);
    cr_assert_eq(model_forward(ctx, kv, sb, b, 8, 0, NULL), 0);
    struct model_batch_seq step[2] = {
        {.seq = sb, .pos0 = 8, .n_tok = 1, .tokens = b + 8, .logits = lb},
        {.seq = sa, .pos0 = 7, .n_tok = 5, .tokens = a + 7, .logits = &la[0][0], .n_logits = 5},
    };
    uint64_t before = mem_bytes(MEM_MODEL);
    if (starve)
        mem_fail_nth(1); /* the logits buffer's first allocation */
    cr_assert_eq(model_forward_batch(ctx, kv, step, 2), 0);
    mem_fail_nth(0);
    if (starve) /* no buffer grew: the rows went one at a time */
        cr_assert_eq(mem_bytes(MEM_MODEL), before, "%lu -> %lu bytes", (unsigned long)before,
                     (unsigned long)mem_bytes(MEM_MODEL));
    else
        cr_assert_gt(mem_bytes(MEM_MODEL), before, "the 6-row buffer was allocated");
    uint32_t t = open_seq(12);
    cr_assert_eq(model_forward(ctx, kv, t, a, 7, 0, NULL), 0);
    for (uint32_t j = 0; j < 5; j++) {
        cr_assert_eq(model_forward(ctx, kv, t, a + 7 + j, 1, 7 + j, ref), 0);
        cr_assert_arr_eq(la[j], ref, sizeof(ref), "row %u (position %u) differs", j, 7 + j);
    }
    uint32_t u = open_seq(9);
    cr_assert_eq(model_forward(ctx, kv, u, b, 9, 0, ref), 0);
    cr_assert_arr_eq(lb, ref, sizeof(ref), "the decode beside it differs");
    step[1].n_logits = 6;
    cr_assert_eq(model_forward_batch(ctx, kv, step + 1, 1), -EINVAL);
}

Test(model_batch, logits_of_the_last_rows_equal_positions_alone, .init = setup, .fini = teardown,
     .timeout = 60) {
    check_rows(false);
}

Test(model_batch, logits_rows_one_at_a_time_equal_too, .init = setup, .fini = teardown,
     .timeout = 60) {
    check_rows(true);
}

/* Four prompts decoded together, one flattened step per token, give the
 * llama2.c greedy ids of each. */
Test(model_batch, batched_greedy_matches_references, .init = setup, .fini = teardown,
     .timeout = 120) {
    json_t *all = ref_load_all();
    cr_assert_not_null(all, "cannot read reference.jsonl");
    enum { NS = 4, NG = 64 };
    const char *cases[NS] = {"once", "sentence", "punct_digits_utf8", "long"};
    int32_t prompt[NS][512], out[NS][NG];
    size_t np[NS];
    uint32_t seq[NS];
    float logits[NS][512];
    for (int s = 0; s < NS; s++) {
        json_t *ref = ref_find(all, "stories260K.bin", cases[s]);
        cr_assert_not_null(ref);
        np[s] = ref_ids(json_object_get(ref, "prompt_ids"), prompt[s], 512);
        seq[s] = open_seq((uint32_t)np[s] + NG);
    }
    /* prefill all four in one step when they fit, else two by two */
    struct model_batch_seq st[NS];
    uint32_t n = 0, total = 0;
    for (int s = 0; s < NS; s++) {
        if (total + np[s] > 128) {
            cr_assert_eq(model_forward_batch(ctx, kv, st, n), 0);
            n = 0;
            total = 0;
        }
        st[n++] = (struct model_batch_seq){.seq = seq[s],
                                           .pos0 = 0,
                                           .n_tok = (uint32_t)np[s],
                                           .tokens = prompt[s],
                                           .logits = logits[s]};
        total += (uint32_t)np[s];
    }
    cr_assert_eq(model_forward_batch(ctx, kv, st, n), 0);
    for (int i = 0; i < NG; i++) {
        for (int s = 0; s < NS; s++) {
            out[s][i] = smp_argmax(logits[s], 512);
            st[s] = (struct model_batch_seq){.seq = seq[s],
                                             .pos0 = (uint32_t)np[s] + (uint32_t)i,
                                             .n_tok = 1,
                                             .tokens = &out[s][i],
                                             .logits = logits[s]};
        }
        if (i + 1 < NG)
            cr_assert_eq(model_forward_batch(ctx, kv, st, NS), 0);
    }
    for (int s = 0; s < NS; s++) {
        json_t *want = json_object_get(ref_find(all, "stories260K.bin", cases[s]), "greedy_ids");
        for (int i = 0; i < NG; i++)
            cr_assert_eq(out[s][i], (int32_t)json_integer_value(json_array_get(want, (size_t)i)),
                         "%s: id %d is %d", cases[s], i, out[s][i]);
    }
    json_decref(all);
}

/* A 300-token prefill on two threads -- big enough that the norms, the
 * residual adds and SwiGLU split their tokens over the pool
 * (model_forward.c, MF_PAR_ELEMS) -- gives every position's logits the
 * bits of the same tokens run one at a time (each step on the caller). */
Test(model_batch, a_long_prefill_split_over_threads_equals_token_by_token, .init = setup,
     .fini = teardown, .timeout = 120) {
    enum { N = 300 };
    static int32_t t[N];
    static float batched[N][512], one[512];
    for (int i = 0; i < N; i++)
        t[i] = i == 0 ? 1 : 3 + (i * 37) % 500;
    struct model_ctx *big;
    cr_assert_eq(model_ctx_create(m, pool, N, &big), 0);
    cr_assert(m->hp.n_vocab == 512 && (size_t)N * m->hp.n_embd >= 16384);
    uint32_t sa = open_seq(N), sb = open_seq(N);
    struct model_batch_seq b = {
        .seq = sa, .pos0 = 0, .n_tok = N, .tokens = t, .logits = &batched[0][0], .n_logits = N};
    cr_assert_eq(model_forward_batch(big, kv, &b, 1), 0);
    for (int i = 0; i < N; i++) {
        cr_assert_eq(model_forward(big, kv, sb, t + i, 1, (uint32_t)i, one), 0);
        cr_assert_eq(memcmp(one, batched[i], sizeof(one)), 0, "position %d differs", i);
    }
    model_ctx_destroy(big);
}

Test(model_batch, bad_batches_are_refused, .init = setup, .fini = teardown) {
    int32_t t[4] = {1, 2, 3, 4}, bad = 512;
    uint32_t s0 = open_seq(4), s1;
    cr_assert_eq(kv_seq_open(kv, &s1), 0); /* nothing reserved */
    struct model_batch_seq twice[2] = {{.seq = s0, .pos0 = 0, .n_tok = 2, .tokens = t},
                                       {.seq = s0, .pos0 = 2, .n_tok = 2, .tokens = t + 2}};
    cr_assert_eq(model_forward_batch(ctx, kv, twice, 2), -EINVAL);
    struct model_batch_seq unres = {.seq = s1, .pos0 = 0, .n_tok = 1, .tokens = t};
    cr_assert_eq(model_forward_batch(ctx, kv, &unres, 1), -ERANGE);
    struct model_batch_seq oov = {.seq = s0, .pos0 = 0, .n_tok = 1, .tokens = &bad};
    cr_assert_eq(model_forward_batch(ctx, kv, &oov, 1), -EINVAL);
    struct model_batch_seq big = {.seq = s0, .pos0 = 0, .n_tok = 129, .tokens = t};
    cr_assert_eq(model_forward_batch(ctx, kv, &big, 1), -EINVAL);
    cr_assert_eq(model_forward_batch(ctx, kv, NULL, 0), -EINVAL);
}
