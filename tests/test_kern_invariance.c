/* Batch invariance: a row's result is bit-identical whether it is computed
 * alone or in a batch, with 1, 2 or 3 threads, for matmul (every type, every
 * ISA level) and attention. */
#include <criterion/criterion.h>

#include "kernels/cpu/kern_cpu.h"
#include "tests/lib/kern_util.h"

/* Batches of 17 and 20 tokens: every tail of every level's prefill tiles
 * (avx512 floats 6 + 6 + 4 + 1 and 6 x 3 + 2, AVX2 floats 5 x 3 + 2 singles
 * and 6 x 3 + 2, int8 4 x 4 + 1 and 5 x 4) */
enum { INV_TOK = 20, INV_TOK_B = 17 };

/* Y for batches of INV_TOK_B and INV_TOK tokens vs each token alone, for threads in {NULL pool, 1,
 * 2, 3}. */
static void check_matmul(enum kern_isa isa, enum kern_wtype t, int n_in, int n_out) {
    kern_set_isa(isa);
    float *wf = mem_alloc(MEM_TEST, sizeof(float) * (size_t)n_in * n_out);
    float *x = mem_alloc(MEM_TEST, sizeof(float) * (size_t)n_in * INV_TOK);
    float *ref = mem_alloc(MEM_TEST, sizeof(float) * (size_t)n_out * INV_TOK);
    float *y = mem_alloc(MEM_TEST, sizeof(float) * (size_t)n_out * INV_TOK);
    kt_fill(wf, (size_t)n_in * n_out, 3);
    kt_fill(x, (size_t)n_in * INV_TOK, 4);
    void *w = kt_make_w(t, wf, n_in, n_out);
    for (int k = 0; k < INV_TOK; k++)
        kern_matmul(NULL, ref + (size_t)k * n_out, x + (size_t)k * n_in, w, t, n_in, n_out, 1);
    for (int nt = 1; nt <= 3; nt++) {
        struct kern_pool *p;
        cr_assert_eq(kern_pool_create(nt, &p), 0);
        static const int batches[] = {INV_TOK_B, INV_TOK};
        for (int bi = 0; bi < 2; bi++) {
            kern_matmul(p, y, x, w, t, n_in, n_out, batches[bi]);
            cr_assert_arr_eq(
                y, ref, sizeof(float) * (size_t)n_out * batches[bi],
                "isa %d type %d n_in %d: batch of %d on %d threads differs from 1 by 1", isa, t,
                n_in, batches[bi], nt);
        }
        for (int k = 0; k < INV_TOK; k++) {
            kern_matmul(p, y, x + (size_t)k * n_in, w, t, n_in, n_out, 1);
            cr_assert_arr_eq(y, ref + (size_t)k * n_out, sizeof(float) * (size_t)n_out,
                             "isa %d type %d: token %d alone on %d threads", isa, t, k, nt);
        }
        kern_pool_destroy(p);
    }
    kern_matmul(NULL, y, x, w, t, n_in, n_out, INV_TOK);
    cr_assert_arr_eq(y, ref, sizeof(float) * (size_t)n_out * INV_TOK, "NULL pool batch");
    mem_free(w);
    mem_free(y);
    mem_free(ref);
    mem_free(x);
    mem_free(wf);
}

Test(kern_invariance, matmul_rows_bit_identical) {
    for (size_t ii = 0; ii < kt_n_isas(); ii++)
        for (size_t ti = 0; ti < sizeof(kt_types) / sizeof(kt_types[0]); ti++) {
            const enum kern_wtype t = kt_types[ti];
            check_matmul(kt_isas[ii], t, kt_is_kquant(t) ? 512 : kt_is_quant(t) ? 288 : 172, 301);
        }
}

/* A 4096-wide f16 row fills 16 KiB of converted activation: with no pool the
 * 32 KiB stack buffer takes 2 tokens per pass, so 20 tokens go in 10 passes. */
Test(kern_invariance, matmul_multi_pass_fallback) {
    for (size_t ii = 0; ii < kt_n_isas(); ii++)
        check_matmul(kt_isas[ii], KERN_W_F16, 4096, 5);
}

/* 20 x 4096 elements: a batch converts its activations on every thread of
 * the pool (MM_CONV_PAR_ELEMS), a token alone on the caller. */
Test(kern_invariance, matmul_parallel_activation_conversion) {
    for (size_t ii = 0; ii < kt_n_isas(); ii++) {
        check_matmul(kt_isas[ii], KERN_W_Q8_0, 4096, 19);
        check_matmul(kt_isas[ii], KERN_W_Q4_K, 4096, 9);
    }
}

/* A q8K act row of 8192 values is 8,832 bytes: 3 tokens per stack pass. */
Test(kern_invariance, matmul_multi_pass_fallback_kquant) {
    for (size_t ii = 0; ii < kt_n_isas(); ii++)
        check_matmul(kt_isas[ii], KERN_W_Q4_K, 8192, 5);
}

/* Scratch that cannot grow: the matmul halves its passes and still agrees. */
Test(kern_invariance, matmul_scratch_oom_same_bits) {
    enum { N_IN = 256, N_OUT = 19 };
    static float wf[N_OUT * N_IN], x[INV_TOK * N_IN], ref[INV_TOK * N_OUT], y[INV_TOK * N_OUT];
    kt_fill(wf, N_OUT * N_IN, 8);
    kt_fill(x, INV_TOK * N_IN, 9);
    void *w = kt_make_w(KERN_W_Q8_0, wf, N_IN, N_OUT);
    struct kern_pool *p;
    cr_assert_eq(kern_pool_create(2, &p), 0);
    kern_matmul(p, ref, x, w, KERN_W_Q8_0, N_IN, N_OUT, 1);
    kern_matmul(p, ref + N_OUT, x + N_IN, w, KERN_W_Q8_0, N_IN, N_OUT, INV_TOK - 1);
    mem_fail_nth(1); /* the scratch cannot grow to 20 rows: 10 rows */
    kern_matmul(p, y, x, w, KERN_W_Q8_0, N_IN, N_OUT, INV_TOK);
    mem_fail_nth(0);
    cr_assert_arr_eq(y, ref, sizeof(y));
    kern_pool_destroy(p);
    mem_free(w);
}

/* A Q4_0 product on the rows whose scratch cannot grow for the whole batch
 * runs in passes of fewer tokens (matmul.c), with the same bits, and the
 * next call that fits runs in one pass again. 1 and 2 threads. */
Test(kern_invariance, matmul_q4_0_scratch_or_not_same_bits) {
    enum { N_IN = 1024, N_OUT = 301, N_TOK = 24 };
    static float wf[N_OUT * N_IN], x[N_TOK * N_IN], ref[N_TOK * N_OUT], y[N_TOK * N_OUT];
    kt_fill(wf, N_OUT * N_IN, 10);
    kt_fill(x, N_TOK * N_IN, 11);
    void *w = kt_make_w(KERN_W_Q4_0, wf, N_IN, N_OUT);
    for (size_t ii = 0; ii < kt_n_isas(); ii++) {
        kern_set_isa(kt_isas[ii]);
        for (int k = 0; k < N_TOK; k++)
            kern_matmul(NULL, ref + k * N_OUT, x + k * N_IN, w, KERN_W_Q4_0, N_IN, N_OUT, 1);
        for (int nt = 1; nt <= 2; nt++) {
            struct kern_pool *p;
            cr_assert_eq(kern_pool_create(nt, &p), 0);
            kern_matmul(p, y, x, w, KERN_W_Q4_0, N_IN, N_OUT, 4); /* the scratch: 4 rows */
            cr_assert_arr_eq(y, ref, sizeof(float) * 4 * N_OUT, "%s, %d threads, 4 tokens",
                             kern_isa_name(kt_isas[ii]), nt);
            mem_fail_nth(1); /* the scratch cannot grow to 24 rows: shorter passes */
            kern_matmul(p, y, x, w, KERN_W_Q4_0, N_IN, N_OUT, N_TOK);
            mem_fail_nth(0);
            cr_assert_arr_eq(y, ref, sizeof y, "%s, %d threads, shorter passes",
                             kern_isa_name(kt_isas[ii]), nt);
            kern_matmul(p, y, x, w, KERN_W_Q4_0, N_IN, N_OUT, N_TOK);
            cr_assert_arr_eq(y, ref, sizeof y, "%s, %d threads, one pass",
                             kern_isa_name(kt_isas[ii]), nt);
            kern_pool_destroy(p);
        }
    }
    mem_free(w);
}

/* The L2 the products block for (kern_cache_l2) decides the chunks of rows
 * and the blocks of tokens, never a bit: 64 KiB (16 KiB blocks: 4 f32 rows
 * or tokens of 1024), the machine's, and 64 MiB (one chunk, one block),
 * the rows of every type and the packs of every packable one, 1 and 2
 * threads and no pool, every level. */
Test(kern_invariance, matmul_same_bits_for_any_l2) {
    enum { N_IN = 1024, N_OUT = 77, N_TOK = 29 };
    static float wf[N_OUT * N_IN], x[N_TOK * N_IN], ref[N_TOK * N_OUT], y[N_TOK * N_OUT];
    kt_fill(wf, N_OUT * N_IN, 14);
    kt_fill(x, N_TOK * N_IN, 15);
    const size_t l2_machine = kern_cache_l2();
    static const size_t l2s[] = {KERN_L2_MIN, 0, KERN_L2_MAX};
    for (size_t ti = 0; ti < sizeof(kt_types) / sizeof(kt_types[0]); ti++) {
        const enum kern_wtype t = kt_types[ti];
        void *w = kt_make_w(t, wf, N_IN, N_OUT);
        struct kern_pack pk;
        const bool packed = kern_pack_make(NULL, &pk, t, w, N_IN, N_OUT) == 0;
        for (size_t ii = 0; ii < kt_n_isas(); ii++) {
            kern_set_isa(kt_isas[ii]);
            for (int pass = 0; pass < (packed ? 2 : 1); pass++) {
                kern_set_cache_l2(0);
                for (int k = 0; k < N_TOK; k++) /* one token: no blocks at all */
                    if (pass == 0)
                        kern_matmul(NULL, ref + k * N_OUT, x + k * N_IN, w, t, N_IN, N_OUT, 1);
                    else
                        kern_matmul_packed(NULL, ref + k * N_OUT, x + k * N_IN, &pk, 1);
                for (int li = 0; li < 3; li++) {
                    const size_t l2 = kern_set_cache_l2(l2s[li]);
                    cr_assert_eq(l2, l2s[li] ? l2s[li] : l2_machine);
                    for (int nt = 0; nt <= 2; nt++) {
                        struct kern_pool *p = NULL;
                        if (nt)
                            cr_assert_eq(kern_pool_create(nt, &p), 0);
                        if (pass == 0)
                            kern_matmul(p, y, x, w, t, N_IN, N_OUT, N_TOK);
                        else
                            kern_matmul_packed(p, y, x, &pk, N_TOK);
                        cr_assert_arr_eq(y, ref, sizeof y, "%s type %d %s: L2 %zu KiB, %d threads",
                                         kern_isa_name(kt_isas[ii]), t, pass ? "pack" : "rows",
                                         l2 / 1024, nt);
                        if (p)
                            kern_pool_destroy(p);
                    }
                }
            }
        }
        kern_set_cache_l2(0);
        if (packed)
            kern_pack_free(&pk);
        mem_free(w);
    }
}

/* The float rows' decode tile runs with or without its software prefetch
 * (kern_rows_prefetch: by the CPU's vendor); both give the bits of the
 * batch, on every level, one token at a time and in a batch, n_out not a
 * multiple of the 8-row tile and n_in with a 4-element tail. At avx512 the
 * setting picks the other copy of each kernel. */
Test(kern_invariance, float_rows_same_bits_with_or_without_the_prefetch) {
    enum { N_IN = 1060, N_OUT = 83, N_TOK = 9 };
    static float wf[N_OUT * N_IN], x[N_TOK * N_IN], ref[N_TOK * N_OUT], y[N_TOK * N_OUT];
    kt_fill(wf, N_OUT * N_IN, 16);
    kt_fill(x, N_TOK * N_IN, 17);
    static const enum kern_wtype types[] = {KERN_W_F32, KERN_W_F16, KERN_W_BF16};
    const bool machine = kern_rows_prefetch();
    if (kern_isa_max() >= KERN_ISA_AVX512)
        for (size_t ti = 0; ti < 3; ti++) {
            kern_set_rows_prefetch(1);
            const kern_cpu_rect_fn on = kern_cpu_rect_avx512(types[ti]);
            kern_set_rows_prefetch(0);
            cr_assert(on && kern_cpu_rect_avx512(types[ti]) &&
                          on != kern_cpu_rect_avx512(types[ti]),
                      "type %d: one kernel for either setting", types[ti]);
        }
    for (size_t ti = 0; ti < sizeof(types) / sizeof(types[0]); ti++) {
        void *w = kt_make_w(types[ti], wf, N_IN, N_OUT);
        for (size_t ii = 0; ii < kt_n_isas(); ii++) {
            kern_set_isa(kt_isas[ii]);
            kern_matmul(NULL, ref, x, w, types[ti], N_IN, N_OUT, N_TOK);
            for (int pf = 0; pf <= 1; pf++) {
                cr_assert_eq(kern_set_rows_prefetch(pf), pf);
                for (int nt = 0; nt <= 2; nt++) {
                    struct kern_pool *p = NULL;
                    if (nt)
                        cr_assert_eq(kern_pool_create(nt, &p), 0);
                    for (int k = 0; k < N_TOK; k++)
                        kern_matmul(p, y + k * N_OUT, x + k * N_IN, w, types[ti], N_IN, N_OUT, 1);
                    cr_assert_arr_eq(y, ref, sizeof y, "%s type %d, prefetch %d, %d threads",
                                     kern_isa_name(kt_isas[ii]), types[ti], pf, nt);
                    if (p)
                        kern_pool_destroy(p);
                }
            }
            cr_assert_eq(kern_set_rows_prefetch(-1), machine);
        }
        mem_free(w);
    }
}

/* A NaN or an infinity in an activation row (a model gone bad upstream)
 * quantizes to -127 (quant.c), so every kernel computes the same garbage: the
 * Q4_0 rows, the Q8_0 rows (whose sign trick cannot negate -128) and the
 * packs, alone or batched, on every level (a pack runs the sequence of the
 * rows wherever the model packs the type, and of Q4_0's rows from AVX2
 * up). It gave a different finite number for a 16-token Q4_0 batch
 * (then run on Q8_0-widened rows) than for the token alone before (a
 * review's reproducer: n_in 32, x[5] = NaN). */
Test(kern_invariance, non_finite_activations_same_bits_in_every_batch) {
    enum { N_IN = 96, N_OUT = 37, N_TOK = 33 };
    static float wf[N_OUT * N_IN], x[N_TOK * N_IN], ref[N_TOK * N_OUT], ref_pk[N_TOK * N_OUT],
        y[N_TOK * N_OUT];
    kt_fill(wf, N_OUT * N_IN, 12);
    kt_fill(x, N_TOK * N_IN, 13);
    for (int k = 0; k < N_TOK; k++) /* one per token, in varying blocks and lanes */
        x[k * N_IN + (k * 7) % N_IN] = k % 3 == 0 ? NAN : k % 3 == 1 ? INFINITY : -INFINITY;
    static const enum kern_wtype types[] = {KERN_W_Q4_0, KERN_W_Q8_0};
    static const int batches[] = {1, 16, 17, 24, N_TOK};
    for (int ti = 0; ti < 2; ti++) {
        void *w = kt_make_w(types[ti], wf, N_IN, N_OUT);
        struct kern_pack pk;
        cr_assert_eq(kern_pack_make(NULL, &pk, types[ti], w, N_IN, N_OUT), 0);
        for (size_t ii = 0; ii < kt_n_isas(); ii++) {
            kern_set_isa(kt_isas[ii]);
            for (int k = 0; k < N_TOK; k++) {
                kern_matmul(NULL, ref + k * N_OUT, x + k * N_IN, w, types[ti], N_IN, N_OUT, 1);
                kern_matmul_packed(NULL, ref_pk + k * N_OUT, x + k * N_IN, &pk, 1);
            }
            const bool same = kt_isas[ii] >= KERN_ISA_AVX2 &&
                              (types[ti] == KERN_W_Q4_0 || kern_pack_supported(types[ti], N_IN));
            if (same)
                cr_assert_arr_eq(ref_pk, ref, sizeof ref, "%s type %d: pack vs rows",
                                 kern_isa_name(kt_isas[ii]), types[ti]);
            /* a NaN stays out of its block's scale (finite garbage); an
             * infinity makes the scale infinite, and the row with it */
            for (int k = 0; k < N_TOK * N_OUT; k++)
                cr_assert_eq((bool)isfinite(ref[k]), (k / N_OUT) % 3 == 0,
                             "%s type %d: y[%d][%d] %g", kern_isa_name(kt_isas[ii]), types[ti],
                             k / N_OUT, k % N_OUT, ref[k]);
            for (int nt = 1; nt <= 2; nt++) {
                struct kern_pool *p;
                cr_assert_eq(kern_pool_create(nt, &p), 0);
                for (int bi = 0; bi < 5; bi++) {
                    const int nb = batches[bi];
                    kern_matmul(p, y, x, w, types[ti], N_IN, N_OUT, nb);
                    cr_assert_arr_eq(y, ref, sizeof(float) * nb * N_OUT,
                                     "%s type %d: rows, %d tokens on %d threads",
                                     kern_isa_name(kt_isas[ii]), types[ti], nb, nt);
                    kern_matmul_packed(p, y, x, &pk, nb);
                    cr_assert_arr_eq(y, same ? ref : ref_pk, sizeof(float) * nb * N_OUT,
                                     "%s type %d: pack, %d tokens on %d threads",
                                     kern_isa_name(kt_isas[ii]), types[ti], nb, nt);
                }
                kern_pool_destroy(p);
            }
        }
        kern_pack_free(&pk);
        mem_free(w);
    }
}

/* Attention: query i of a batch starting at pos0 vs the same query alone at
 * pos0 + i, on 1..3 threads, every cache type, head_dim 24 (the second kv
 * head of a Q8_0/Q4_0 row spans two blocks: the element-wise loads) and 64
 * (whole-block dequantization); groups of 1 to 5 query heads a kv head
 * (the AVX2 scores run up to 4 heads x N keys at once, N = 8, 6, 4, 3),
 * 45 and 100 keys before the batch, a sliding window, and a batch that
 * starts mid-way. */
enum { INV_MAXNH = 10, INV_MAXNKV = 8, INV_MAXHD = 64 };
static void check_attention(enum kern_isa isa, enum kern_kv_type t, const int hd, int nh, int nkv,
                            int pos0, int window) {
    kern_set_isa(isa);
    const int n_ctx = pos0 + INV_TOK;
    const size_t row = kern_kv_row_bytes(t, nkv, hd), stride = 2 * row + 8;
    unsigned char *buf = mem_calloc(MEM_TEST, (size_t)n_ctx, stride);
    float tmp[INV_MAXNKV * INV_MAXHD];
    for (int tok = 0; tok < n_ctx; tok++)
        for (int s = 0; s < 2; s++) {
            kt_fill(tmp, (size_t)nkv * hd, 50 + tok * 2 + s);
            kern_kv_store(buf + tok * stride + s * row, tmp, nkv, hd, t);
        }
    struct kern_kv kv = {.k = buf,
                         .v = buf + row,
                         .stride_bytes = stride,
                         .type = t,
                         .n_head = nh,
                         .n_kv_head = nkv,
                         .head_dim = hd,
                         .window = window};
    static float q[INV_TOK * INV_MAXNH * INV_MAXHD], ref[INV_TOK * INV_MAXNH * INV_MAXHD],
        out[INV_TOK * INV_MAXNH * INV_MAXHD];
    const size_t n = (size_t)INV_TOK * nh * hd, one = (size_t)nh * hd;
    kt_fill(q, n, 77);
    for (int i = 0; i < INV_TOK; i++)
        kern_attention(NULL, ref + i * one, q + i * one, 1, pos0 + i, &kv);
    for (int nt = 1; nt <= 3; nt++) {
        struct kern_pool *p;
        cr_assert_eq(kern_pool_create(nt, &p), 0);
        kern_attention(p, out, q, INV_TOK, pos0, &kv);
        cr_assert_arr_eq(out, ref, sizeof(float) * n,
                         "isa %d kv %d hd %d heads %d/%d pos0 %d window %d: batch on %d threads",
                         isa, t, hd, nh, nkv, pos0, window, nt);
        kern_attention(p, out, q + 5 * one, INV_TOK - 7, pos0 + 5, &kv); /* a batch from 5 */
        cr_assert_arr_eq(out, ref + 5 * one, sizeof(float) * (INV_TOK - 7) * one,
                         "isa %d kv %d heads %d/%d: batch from token 5 on %d", isa, t, nh, nkv, nt);
        kern_attention(p, out, q + 3 * one, 1, pos0 + 3, &kv);
        cr_assert_arr_eq(out, ref + 3 * one, sizeof(float) * one, "single on %d", nt);
        kern_pool_destroy(p);
    }
    mem_free(buf);
}

Test(kern_invariance, attention_rows_bit_identical) {
    static const int shapes[][2] = {{8, 8}, {8, 4}, {6, 2}, {8, 2}, {10, 2}};
    for (size_t ii = 0; ii < kt_n_isas(); ii++)
        for (int t = 0; t < KERN_KV_N; t++)
            for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
                const int nh = shapes[si][0], nkv = shapes[si][1];
                check_attention(kt_isas[ii], (enum kern_kv_type)t, 24, nh, nkv, 45, 0);
                check_attention(kt_isas[ii], (enum kern_kv_type)t, 64, nh, nkv, 45, 0);
                check_attention(kt_isas[ii], (enum kern_kv_type)t, 64, nh, nkv, 100, 0);
                check_attention(kt_isas[ii], (enum kern_kv_type)t, 24, nh, nkv, 100, 40);
            }
}

/* The integer tiles of the VNNI levels compute AVX2's exact lanes with
 * another instruction and keep its float sequence (kernels/cpu/
 * matmul_q.h), for decode and prefill tiles alike: Q4_0 results are
 * bit-identical across avx2, avx-vnni, avx512 and amx, Q8_0 across avx2
 * and avx-vnni (from avx512 up Q8_0 sums as its pack does: test_kern_pack). */
Test(kern_invariance, q_types_bit_identical_across_the_vnni_levels) {
    enum { N_IN = 320, N_OUT = 37, N_TOK = 9 };
    if (kern_isa_max() <= KERN_ISA_AVX2)
        cr_skip_test("no VNNI level on this CPU (%s)", kern_isa_name(kern_isa_max()));
    float *wf = mem_alloc(MEM_TEST, sizeof(float) * N_IN * N_OUT);
    float *x = mem_alloc(MEM_TEST, sizeof(float) * N_IN * N_TOK);
    float ref[N_TOK * N_OUT], y[N_TOK * N_OUT];
    kt_fill(wf, N_IN * N_OUT, 41);
    kt_fill(x, N_IN * N_TOK, 43);
    const enum kern_wtype types[] = {KERN_W_Q8_0, KERN_W_Q4_0};
    for (int ti = 0; ti < 2; ti++) {
        void *w = kt_make_w(types[ti], wf, N_IN, N_OUT);
        for (int n_tok = 1; n_tok <= N_TOK; n_tok += N_TOK - 1) {
            kern_set_isa(KERN_ISA_AVX2);
            kern_matmul(NULL, ref, x, w, types[ti], N_IN, N_OUT, n_tok);
            for (size_t ii = 2; ii < kt_n_isas(); ii++) {
                if (types[ti] == KERN_W_Q8_0 && kt_isas[ii] >= KERN_ISA_AVX512)
                    continue;
                kern_set_isa(kt_isas[ii]);
                kern_matmul(NULL, y, x, w, types[ti], N_IN, N_OUT, n_tok);
                cr_assert_arr_eq(y, ref, sizeof(float) * (size_t)n_tok * N_OUT,
                                 "type %d, %d tokens: %s differs from avx2", types[ti], n_tok,
                                 kern_isa_name(kt_isas[ii]));
            }
        }
        mem_free(w);
    }
    mem_free(x);
    mem_free(wf);
}
