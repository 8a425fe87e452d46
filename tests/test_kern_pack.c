/* Repacked matrices: Q8_0/Q4_0 (kernels/cpu/pack.c, pack_avx2.c,
 * pack_avx512.c) and Q4_K/Q5_K/Q6_K (pack_k.c, pack_k_avx512.c). The byte
 * layout against its definition, every level (the portable kernel, the
 * AVX2 and the AVX512 ones) bit for bit against a model of the per-element
 * sequence and against the rows of every level that packs the type (Q4_0:
 * of every level), batch invariance over tokens and threads, which level
 * packs which type, and the error paths of packing. */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>

#include "tests/lib/kern_util.h"
#include "tests/lib/kq_util.h"

/* The signed weight j of row r, block b of a Q8_0 or Q4_0 matrix. */
static int kp_weight(enum kern_wtype t, const void *w, int n_in, int r, int b, int j) {
    const unsigned char *row = (const unsigned char *)w + kern_row_bytes(t, (size_t)n_in) * r;
    if (t == KERN_W_Q8_0)
        return ((const int8_t *)(row + 34 * b + 2))[j];
    const unsigned char *qs = row + 18 * b + 2;
    return (j < 16 ? qs[j] & 0x0F : qs[j - 16] >> 4) - 8;
}

static float kp_scale(enum kern_wtype t, const void *w, int n_in, int r, int b) {
    const unsigned char *row = (const unsigned char *)w + kern_row_bytes(t, (size_t)n_in) * r;
    uint16_t h;
    memcpy(&h, row + (t == KERN_W_Q8_0 ? 34 : 18) * b, 2);
    return kern_f16_to_f32_1(h);
}

/* What pack.c's header says element (r, t) is, for Q8_0 and Q4_0 alike:
 * acc = fmaf(sum_b, d_w * d_x, acc) over the blocks in order, sum_b the
 * block's exact sum. */
static float kp_model(enum kern_wtype t, const void *w, int n_in, int r, const float *x) {
    unsigned char xq[34 * 128];
    kern_quantize_row_q8_0(x, xq, n_in);
    float acc = 0.0f;
    for (int b = 0; b < n_in / 32; b++) {
        uint16_t dx;
        memcpy(&dx, xq + 34 * b, 2);
        int32_t sum = 0;
        for (int j = 0; j < 32; j++)
            sum += kp_weight(t, w, n_in, r, b, j) * ((const int8_t *)(xq + 34 * b + 2))[j];
        acc = fmaf((float)sum, kp_scale(t, w, n_in, r, b) * kern_f16_to_f32_1(dx), acc);
    }
    return acc;
}

static const enum kern_wtype kp_types[] = {KERN_W_Q8_0, KERN_W_Q4_0};
static const enum kern_wtype kp_ktypes[] = {KERN_W_Q4_K, KERN_W_Q5_K, KERN_W_Q6_K};

/* The sequence of element (r, token x) at level isa for any packed type:
 * kp_model, or for a K-quant the order pack_k.c's header gives the level's
 * pack (kq_util.h): the one-sum order from AVX-512 up, below it ggml's
 * AVX2 order (the portable kernel's too). */
static float kp_model_any(enum kern_isa isa, enum kern_wtype t, const void *w, int n_in, int r,
                          const float *x) {
    if (!kt_is_kquant(t))
        return kp_model(t, w, n_in, r, x);
    struct kern_blk_q8_K xq[16];
    cr_assert_leq(n_in, 16 * 256);
    kern_quantize_row_q8_K(x, xq, n_in);
    return kq_model_level(isa, t, (const uint8_t *)w + kern_row_bytes(t, (size_t)n_in) * r, xq,
                          n_in);
}

Test(kern_pack, layout_follows_its_definition) {
    enum { N_IN = 64, N_OUT = 19 };
    float wf[N_IN * N_OUT];
    kt_fill(wf, N_IN * N_OUT, 5);
    for (int ti = 0; ti < 2; ti++) {
        const enum kern_wtype t = kp_types[ti];
        void *w = kt_make_w(t, wf, N_IN, N_OUT);
        struct kern_pack pk;
        cr_assert_eq(kern_pack_make(NULL, &pk, t, w, N_IN, N_OUT), 0);
        const size_t rec = t == KERN_W_Q8_0 ? 544 : 288;
        cr_assert_eq(pk.bytes, rec * 2 * 2, "2 groups x 2 blocks");
        for (int r = 0; r < 32; r++)
            for (int b = 0; b < 2; b++) {
                const unsigned char *p = (const unsigned char *)pk.data + rec * ((r / 16) * 2 + b);
                const int l = r % 16;
                uint16_t d;
                memcpy(&d, p + 2 * l, 2);
                cr_assert_eq(kern_f16_to_f32_1(d), r < N_OUT ? kp_scale(t, w, N_IN, r, b) : 0.0f);
                for (int j = 0; j < 32; j++) {
                    const int want = r < N_OUT ? kp_weight(t, w, N_IN, r, b, j) : 0;
                    int got;
                    if (t == KERN_W_Q8_0) {
                        got = p[32 + (j / 4) * 64 + 4 * l + j % 4] - 128;
                    } else {
                        const int k = j / 8, e = j % 4, hi = (j % 8) >= 4;
                        const unsigned char byte = p[32 + k * 64 + 4 * l + e];
                        got = (hi ? byte >> 4 : byte & 0x0F) - 8;
                    }
                    cr_assert_eq(got, want, "type %d row %d block %d weight %d", t, r, b, j);
                }
            }
        kern_pack_free(&pk);
        cr_assert_null(pk.data);
        mem_free(w);
    }
}

/* Element e (0..255) of row l in a K record, read by pack_k.c's header:
 * the quant (Q6_K: minus 32), its scale and min; *d, *dmin the row's. */
static void kp_k_element(enum kern_wtype t, const unsigned char *p, int l, int e, int *q, int *sc,
                         int *mn) {
    const int i = e % 32, k = i / 4, ee = i % 4;
    if (t == KERN_W_Q6_K) {
        const int c = e / 32, n = c / 4, r = c % 4;
        const unsigned char lo = p[288 + 64 * (4 * k + 2 * n + r % 2) + 4 * l + ee];
        const unsigned char hi = p[2336 + 64 * (2 * k + n) + 4 * l + ee];
        *q = ((r < 2 ? lo & 15 : lo >> 4) | ((hi >> (2 * r)) & 3) << 4) - 32;
        *sc = (int8_t)p[32 + 16 * (e / 16) + l];
        *mn = 0;
        return;
    }
    const int j = e / 32;
    const unsigned char byte =
        p[(t == KERN_W_Q4_K ? 320 : 832) + 64 * (4 * k + j / 2) + 4 * l + ee];
    *q = j % 2 ? byte >> 4 : byte & 15;
    if (t == KERN_W_Q5_K)
        *q += ((p[320 + 64 * k + 4 * l + ee] >> j) & 1) * 16;
    *sc = p[64 + 16 * j + l];
    *mn = p[192 + 32 * (j / 2) + 2 * l + j % 2];
}

static float kp_f16_at(const unsigned char *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return kern_f16_to_f32_1(h);
}

Test(kern_pack, k_layout_follows_its_definition) {
    enum { N_IN = 512, N_OUT = 19 };
    static float wf[N_IN * N_OUT];
    kt_fill(wf, N_IN * N_OUT, 5);
    static const size_t recs[] = {2368, 2880, 3360};
    for (int ti = 0; ti < 3; ti++) {
        const enum kern_wtype t = kp_ktypes[ti];
        void *w = kt_make_w(t, wf, N_IN, N_OUT);
        struct kern_pack pk;
        cr_assert_eq(kern_pack_make(NULL, &pk, t, w, N_IN, N_OUT), 0);
        const size_t rec = recs[ti];
        cr_assert_eq(pk.bytes, rec * 2 * 2, "type %d: 2 groups x 2 blocks", t);
        cr_assert_eq(pk.type, t);
        for (int r = 0; r < 32; r++)
            for (int b = 0; b < 2; b++) {
                const unsigned char *p = (const unsigned char *)pk.data + rec * ((r / 16) * 2 + b);
                const int l = r % 16;
                struct kq_ints want = {0};
                if (r < N_OUT)
                    kq_decode(
                        t, (const uint8_t *)w + kern_row_bytes(t, N_IN) * r + kq_block_bytes(t) * b,
                        &want);
                cr_assert_eq(kp_f16_at(p + 2 * l), want.d, "type %d row %d block %d: d", t, r, b);
                if (t != KERN_W_Q6_K)
                    cr_assert_eq(kp_f16_at(p + 32 + 2 * l), want.dmin, "type %d row %d: dmin", t,
                                 r);
                for (int e = 0; e < 256; e++) {
                    int q, sc, mn;
                    kp_k_element(t, p, l, e, &q, &sc, &mn);
                    if (r >= N_OUT) { /* padding: every byte zero */
                        cr_assert(q == (t == KERN_W_Q6_K ? -32 : 0) && sc == 0 && mn == 0,
                                  "type %d padding row %d element %d", t, r, e);
                        continue;
                    }
                    cr_assert(q == want.q[e] && sc == want.sc[e] && mn == want.mn[e],
                              "type %d row %d block %d element %d: q %d sc %d mn %d, want %d %d %d",
                              t, r, b, e, q, sc, mn, want.q[e], want.sc[e], want.mn[e]);
                }
            }
        kern_pack_free(&pk);
        mem_free(w);
    }
}

/* want[k][r] = the model of element (r, token k) at level isa. */
static void kp_want(enum kern_isa isa, enum kern_wtype t, const void *w, int n_in, int n_out,
                    int n_tok, const float *x, float *want) {
    for (int k = 0; k < n_tok; k++)
        for (int r = 0; r < n_out; r++)
            want[(size_t)k * n_out + r] = kp_model_any(isa, t, w, n_in, r, x + (size_t)k * n_in);
}

/* Every level against the model of the sequence, bit for bit, and that
 * sequence is the rows' where the level packs the type. w: n_out rows of
 * type t. */
static void kp_check_w(enum kern_wtype t, const void *w, int n_in, int n_out, int n_tok,
                       int n_threads) {
    float *x = mem_alloc(MEM_TEST, sizeof(float) * (size_t)n_in * n_tok);
    float *y = mem_alloc(MEM_TEST, sizeof(float) * (size_t)n_out * n_tok);
    float *want = mem_alloc(MEM_TEST, sizeof(float) * (size_t)n_out * n_tok);
    kt_fill(x, (size_t)n_in * n_tok, 9 + n_tok);
    for (int i = 0; i < n_in * n_tok; i += 5)
        x[i] *= 7.0f;
    struct kern_pool *p = NULL;
    if (n_threads)
        cr_assert_eq(kern_pool_create(n_threads, &p), 0);
    /* packed over p's threads (a share of the groups each): the bytes of a
     * pack made on the caller, and the pack the kernels below run on */
    struct kern_pack pk, pk1;
    cr_assert_eq(kern_pack_make(p, &pk, t, w, n_in, n_out), 0);
    cr_assert_eq(kern_pack_make(NULL, &pk1, t, w, n_in, n_out), 0);
    cr_assert_eq(pk.bytes, pk1.bytes);
    cr_assert_arr_eq(pk.data, pk1.data, pk.bytes,
                     "type %d n_in %d n_out %d: packed on %d threads, not the caller's bytes", t,
                     n_in, n_out, n_threads);
    kern_pack_free(&pk1);
    for (size_t ii = 0; ii < kt_n_isas(); ii++) {
        kern_set_isa(kt_isas[ii]);
        kp_want(kt_isas[ii], t, w, n_in, n_out, n_tok, x, want);
        kern_matmul_packed(p, y, x, &pk, n_tok);
        for (int k = 0; k < n_tok; k++)
            for (int r = 0; r < n_out; r++)
                cr_assert_eq(y[(size_t)k * n_out + r], want[(size_t)k * n_out + r],
                             "%s type %d n_in %d n_out %d n_tok %d thr %d: y[%d][%d] %.9g want "
                             "%.9g",
                             kern_isa_name(kt_isas[ii]), t, n_in, n_out, n_tok, n_threads, k, r,
                             y[(size_t)k * n_out + r], want[(size_t)k * n_out + r]);
    }
    /* the rows give the same bits wherever the level packs the type
     * (packing changes no result), and Q4_0's on every level, scalar
     * included; the Q8_0 rows of the other levels keep ggml's AVX2 lanes */
    for (size_t ii = 0; ii < kt_n_isas(); ii++) {
        kern_set_isa(kt_isas[ii]);
        if (t != KERN_W_Q4_0 && !kern_pack_supported(t, n_in))
            continue;
        kp_want(kt_isas[ii], t, w, n_in, n_out, n_tok, x, want);
        kern_matmul(p, y, x, w, t, n_in, n_out, n_tok);
        cr_assert_arr_eq(y, want, sizeof(float) * (size_t)n_out * n_tok,
                         "%s: type %d rows n_in %d n_out %d n_tok %d: not the pack's sequence",
                         kern_isa_name(kt_isas[ii]), t, n_in, n_out, n_tok);
    }
    kern_pool_destroy(p);
    kern_pack_free(&pk);
    mem_free(want);
    mem_free(y);
    mem_free(x);
}

static void kp_check(enum kern_wtype t, int n_in, int n_out, int n_tok, int n_threads) {
    float *wf = mem_alloc(MEM_TEST, sizeof(float) * (size_t)n_in * n_out);
    kt_fill(wf, (size_t)n_in * n_out, 7 + n_out);
    void *w = kt_make_w(t, wf, n_in, n_out);
    kp_check_w(t, w, n_in, n_out, n_tok, n_threads);
    mem_free(w);
    mem_free(wf);
}

Test(kern_pack, every_level_gives_the_sequence_bit_for_bit, .timeout = 120) {
    static const int n_ins[] = {32, 96, 320};
    static const int n_outs[] = {1, 15, 16, 17, 70};
    /* 33: 4-token tiles and a remainder (the AVX2 Q4_0 kernel), 11 of 3 (the AVX512) */
    static const int n_toks[] = {1, 3, 4, 9, 17, 33};
    for (int ti = 0; ti < 2; ti++)
        for (int a = 0; a < 3; a++)
            for (int b = 0; b < 5; b++)
                for (int c = 0; c < 6; c++)
                    kp_check(kp_types[ti], n_ins[a], n_outs[b], n_toks[c], c % 3 ? c % 3 + 1 : 0);
}

/* The K-quants: one to sixteen blocks a row, groups whole and partial, every
 * tile (4 tokens, and the remainders 1 to 3), one to three threads. The
 * rows of the largest matrix are the first rows of the others. */
Test(kern_pack, k_every_level_gives_the_sequence_bit_for_bit, .timeout = 240) {
    static const int n_ins[] = {256, 768, 4096};
    static const int n_outs[] = {1, 15, 16, 17, 70};
    static const int n_toks[] = {1, 2, 3, 4, 5, 7, 17};
    enum { MAX_OUT = 70 };
    for (int ti = 0; ti < 3; ti++)
        for (int a = 0; a < 3; a++) {
            const enum kern_wtype t = kp_ktypes[ti];
            const int n_in = n_ins[a];
            float *wf = mem_alloc(MEM_TEST, sizeof(float) * (size_t)n_in * MAX_OUT);
            kt_fill(wf, (size_t)n_in * MAX_OUT, 11 + n_in);
            void *w = kt_make_w(t, wf, n_in, MAX_OUT);
            for (int b = 0; b < 5; b++)
                for (int c = 0; c < 7; c++) {
                    if (n_in == 4096 && n_toks[c] > 5 && n_outs[b] > 17)
                        continue; /* the largest products once: 4096 x 70 x 5 */
                    kp_check_w(t, w, n_in, n_outs[b], n_toks[c], (b + c) % 4);
                }
            mem_free(w);
            mem_free(wf);
        }
}

/* Long batches: at the amx level a K record's scaled planes serve up to 8
 * slices of 16 tokens (pack_amx.c), so 149 tokens in one pass (a pool of
 * one: the pool's scratch holds them all) take a chunk of 8 slices, one of
 * 1 and a 5-token tail; 40 tokens on 2 threads, 2 slices and 8. Every
 * level against the model, as above. */
Test(kern_pack, k_long_batches_give_the_sequence_bit_for_bit, .timeout = 120) {
    for (int ti = 0; ti < 3; ti++) {
        kp_check(kp_ktypes[ti], 256, 17, 149, 1);
        kp_check(kp_ktypes[ti], 768, 33, 40, 2);
    }
}

Test(kern_pack, close_to_the_double_product) {
    enum { N_IN = 256, N_OUT = 40 };
    float wf[N_IN * N_OUT], x[N_IN], y[N_OUT], wd[N_IN];
    kt_fill(wf, N_IN * N_OUT, 13);
    kt_fill(x, N_IN, 17);
    unsigned char xq[34 * (N_IN / 32)];
    float xd[N_IN];
    kern_quantize_row_q8_0(x, xq, N_IN);
    kern_dequant_row(KERN_W_Q8_0, xq, xd, N_IN);
    for (int ti = 0; ti < 2; ti++) {
        void *w = kt_make_w(kp_types[ti], wf, N_IN, N_OUT);
        struct kern_pack pk;
        cr_assert_eq(kern_pack_make(NULL, &pk, kp_types[ti], w, N_IN, N_OUT), 0);
        kern_matmul_packed(NULL, y, x, &pk, 1);
        for (int r = 0; r < N_OUT; r++) {
            kern_dequant_row(kp_types[ti], (const char *)w + kern_row_bytes(kp_types[ti], N_IN) * r,
                             wd, N_IN);
            double s = 0, a = 0;
            for (int i = 0; i < N_IN; i++) {
                s += (double)wd[i] * xd[i];
                a += fabs((double)wd[i] * xd[i]);
            }
            cr_assert(fabs(y[r] - s) <= 2e-6 * a, "type %d row %d: %.9g vs %.9g", kp_types[ti], r,
                      y[r], s);
        }
        kern_pack_free(&pk);
        mem_free(w);
    }
}

Test(kern_pack, batch_and_threads_never_change_a_row) {
    enum { N_IN = 320, N_OUT = 83, N_TOK = 11 };
    float *wf = mem_alloc(MEM_TEST, sizeof(float) * N_IN * N_OUT);
    float x[N_IN * N_TOK], ref[N_TOK * N_OUT], y[N_TOK * N_OUT];
    kt_fill(wf, N_IN * N_OUT, 21);
    kt_fill(x, N_IN * N_TOK, 23);
    for (int ti = 0; ti < 2; ti++) {
        void *w = kt_make_w(kp_types[ti], wf, N_IN, N_OUT);
        struct kern_pack pk;
        cr_assert_eq(kern_pack_make(NULL, &pk, kp_types[ti], w, N_IN, N_OUT), 0);
        for (size_t ii = 0; ii < kt_n_isas(); ii++) {
            kern_set_isa(kt_isas[ii]);
            for (int k = 0; k < N_TOK; k++)
                kern_matmul_packed(NULL, ref + k * N_OUT, x + k * N_IN, &pk, 1);
            for (int nt = 1; nt <= 3; nt++) {
                struct kern_pool *p;
                cr_assert_eq(kern_pool_create(nt, &p), 0);
                kern_matmul_packed(p, y, x, &pk, N_TOK);
                cr_assert_arr_eq(y, ref, sizeof(y), "%s type %d: %d tokens on %d threads",
                                 kern_isa_name(kt_isas[ii]), kp_types[ti], N_TOK, nt);
                kern_pool_destroy(p);
            }
        }
        kern_pack_free(&pk);
        mem_free(w);
    }
    mem_free(wf);
}

/* Q8_0 weights -128 and 127 (a file may hold -128, ggml's quantizers never
 * write it) and Q4_0 nibbles 0 and 15, against activations that quantize
 * to +-127, through the pack at every level, decode and prefill tiles: the
 * stored bytes 0 and 255 (w + 128) against activations of both signs. */
Test(kern_pack, extreme_blocks_do_not_overflow) {
    enum { N = 128, N_OUT = 19, N_TOK = 6 };
    static float x[N_TOK * N], y[N_TOK * N_OUT];
    for (int i = 0; i < N_TOK * N; i++)
        x[i] = (i / 3 + i / N) % 2 ? -1.0f : 1.0f;
    for (int ti = 0; ti < 2; ti++) {
        const enum kern_wtype t = kp_types[ti];
        const size_t rb = kern_row_bytes(t, N), bb = t == KERN_W_Q8_0 ? 34 : 18;
        static uint8_t w[N_OUT * 4 * 34];
        for (int r = 0; r < N_OUT; r++)
            for (int b = 0; b < N / 32; b++) {
                uint8_t *blk = w + rb * r + bb * b;
                const uint16_t one = 0x3c00;
                memcpy(blk, &one, 2);
                for (int j = 0; j < (int)bb - 2; j++) /* runs of equal signs, then flips */
                    blk[2 + j] = t == KERN_W_Q8_0 ? ((j / 2 + r + b) % 3 ? 0x80 : 0x7F)
                                                  : ((j + r + b) % 3 ? 0x00 : 0xFF);
            }
        struct kern_pack pk;
        cr_assert_eq(kern_pack_make(NULL, &pk, t, w, N, N_OUT), 0);
        for (size_t ii = 0; ii < kt_n_isas(); ii++) {
            kern_set_isa(kt_isas[ii]);
            for (int n_tok = 1; n_tok <= N_TOK; n_tok += N_TOK - 1) {
                kern_matmul_packed(NULL, y, x, &pk, n_tok);
                for (int k = 0; k < n_tok; k++)
                    for (int r = 0; r < N_OUT; r++) {
                        const float want = kp_model(t, w, N, r, x + (size_t)k * N);
                        cr_assert_eq(y[k * N_OUT + r], want,
                                     "type %d isa %s n_tok %d y[%d][%d]: %.9g vs %.9g", t,
                                     kern_isa_name(kt_isas[ii]), n_tok, k, r, y[k * N_OUT + r],
                                     want);
                    }
            }
        }
        kern_pack_free(&pk);
    }
}

/* Weights at the ends of their ranges (scales and mins 63, every nibble 15,
 * Q6_K levels -32 and 31 with scales -128 and 127) against activations of
 * +-127, through the pack, at every level: the int16 pair sums and the
 * int32 lanes at their largest. */
Test(kern_pack, k_extreme_blocks_do_not_overflow) {
    enum { N = 512, N_OUT = 3 };
    static float x[N], y[N_OUT];
    for (int i = 0; i < N; i++)
        x[i] = i % 2 ? -1.0f : 1.0f;
    struct kern_blk_q8_K xq[2];
    kern_quantize_row_q8_K(x, xq, N);
    for (int ti = 0; ti < 3; ti++) {
        const enum kern_wtype t = kp_ktypes[ti];
        const size_t rb = kern_row_bytes(t, N), bb = kq_block_bytes(t);
        static uint8_t w[N_OUT * 2 * 210];
        memset(w, 0xFF, sizeof(w));
        for (int r = 0; r < N_OUT; r++)
            for (int b = 0; b < 2; b++) {
                uint8_t *blk = w + rb * r + bb * b;
                const uint16_t one = 0x3c00;
                if (t == KERN_W_Q6_K) {
                    memset(blk + 128, (b + r) % 2 ? 0x00 : 0xFF, 64); /* q 15 or 63 */
                    memset(blk + 192, (b + r) % 2 ? 0x80 : 0x7F, 16); /* scales -128, 127 */
                    memcpy(blk + 208, &one, 2);
                } else {
                    memcpy(blk, &one, 2);
                    memcpy(blk + 2, &one, 2);
                }
            }
        struct kern_pack pk;
        cr_assert_eq(kern_pack_make(NULL, &pk, t, w, N, N_OUT), 0);
        for (size_t ii = 0; ii < kt_n_isas(); ii++) {
            kern_set_isa(kt_isas[ii]);
            kern_matmul_packed(NULL, y, x, &pk, 1);
            for (int r = 0; r < N_OUT; r++) {
                const float want = kq_model_level(kt_isas[ii], t, w + rb * r, xq, N);
                cr_assert_eq(y[r], want, "type %d isa %s row %d: %.9g vs %.9g", t,
                             kern_isa_name(kt_isas[ii]), r, y[r], want);
            }
        }
        kern_pack_free(&pk);
    }
}

/* A NaN dmin (a corrupt Q4_K/Q5_K block) gives the same NaN, sign
 * included, at every level of the pack and on the AVX2 rows: the mins term
 * is fmaf(-(d_x dmin), ...) everywhere, negated before the fma (the AVX2
 * and AVX512 pack kernels once used a negating fma, which keeps a NaN's
 * sign where the negation flips it). */
Test(kern_pack, k_nan_dmin_gives_the_same_bits_at_every_level) {
    enum { N = 256, N_OUT = 1 };
    static float x[N], y[N_OUT], want[N_OUT];
    for (int i = 0; i < N; i++)
        x[i] = 1.0f;
    for (int ti = 0; ti < 2; ti++) {
        const enum kern_wtype t = kp_ktypes[ti];
        static uint8_t w[176];
        memset(w, 0x11, sizeof(w));
        const uint16_t one = 0x3c00, nan = 0x7e00;
        memcpy(w, &one, 2);
        memcpy(w + 2, &nan, 2);
        struct kern_pack pk;
        cr_assert_eq(kern_pack_make(NULL, &pk, t, w, N, N_OUT), 0);
        kern_set_isa(KERN_ISA_SCALAR);
        kern_matmul_packed(NULL, want, x, &pk, 1);
        cr_assert(isnan(want[0]) && signbit(want[0]), "type %d: %a", t, (double)want[0]);
        for (size_t ii = 1; ii < kt_n_isas(); ii++) {
            kern_set_isa(kt_isas[ii]);
            kern_matmul_packed(NULL, y, x, &pk, 1);
            cr_assert_eq(memcmp(y, want, sizeof(y)), 0, "type %d pack at %s: %a vs %a", t,
                         kern_isa_name(kt_isas[ii]), (double)y[0], (double)want[0]);
            kern_matmul(NULL, y, x, w, t, N, N_OUT, 1);
            cr_assert_eq(memcmp(y, want, sizeof(y)), 0, "type %d rows at %s: %a vs %a", t,
                         kern_isa_name(kt_isas[ii]), (double)y[0], (double)want[0]);
        }
        kern_set_isa(kern_isa_max());
        kern_pack_free(&pk);
    }
}

Test(kern_pack, k_batch_and_threads_never_change_a_row) {
    enum { N_IN = 768, N_OUT = 37, N_TOK = 11 };
    float *wf = mem_alloc(MEM_TEST, sizeof(float) * N_IN * N_OUT);
    static float x[N_IN * N_TOK], ref[N_TOK * N_OUT], y[N_TOK * N_OUT];
    kt_fill(wf, N_IN * N_OUT, 29);
    kt_fill(x, N_IN * N_TOK, 31);
    for (int ti = 0; ti < 3; ti++) {
        void *w = kt_make_w(kp_ktypes[ti], wf, N_IN, N_OUT);
        struct kern_pack pk;
        cr_assert_eq(kern_pack_make(NULL, &pk, kp_ktypes[ti], w, N_IN, N_OUT), 0);
        for (size_t ii = 0; ii < kt_n_isas(); ii++) {
            kern_set_isa(kt_isas[ii]);
            for (int k = 0; k < N_TOK; k++)
                kern_matmul_packed(NULL, ref + k * N_OUT, x + k * N_IN, &pk, 1);
            for (int nt = 1; nt <= 3; nt++) {
                struct kern_pool *p;
                cr_assert_eq(kern_pool_create(nt, &p), 0);
                for (int n_tok = 2; n_tok <= N_TOK; n_tok += 3) {
                    kern_matmul_packed(p, y, x, &pk, n_tok);
                    cr_assert_arr_eq(y, ref, sizeof(float) * (size_t)n_tok * N_OUT,
                                     "%s type %d: %d tokens on %d threads",
                                     kern_isa_name(kt_isas[ii]), kp_ktypes[ti], n_tok, nt);
                }
                kern_pool_destroy(p);
            }
        }
        kern_pack_free(&pk);
        mem_free(w);
    }
    mem_free(wf);
}

Test(kern_pack, refusals_leave_the_pack_untouched) {
    unsigned char w[34 * 4] = {0};
    struct kern_pack pk = {.bytes = 12345};
    cr_assert_eq(kern_pack_make(NULL, &pk, KERN_W_F16, w, 64, 1), -ENOTSUP);
    cr_assert_eq(kern_pack_make(NULL, &pk, KERN_W_Q8_0, w, 48, 1), -EINVAL,
                 "n_in not whole blocks");
    cr_assert_eq(kern_pack_make(NULL, &pk, KERN_W_Q8_0, w, 64, 0), -EINVAL);
    mem_fail_nth(1);
    cr_assert_eq(kern_pack_make(NULL, &pk, KERN_W_Q8_0, w, 64, 2), -ENOMEM);
    mem_fail_nth(0);
    cr_assert_eq(pk.bytes, 12345u);
    cr_assert_null(pk.data);
    kern_pack_free(NULL);
    kern_pack_free(&(struct kern_pack){0});
    cr_assert_eq(kern_pack_supported(KERN_W_F16, 64), false);
    cr_assert_eq(kern_pack_supported(KERN_W_Q8_0, 48), false);
    /* which level packs which type (pack.c), on every level this CPU has */
    kern_set_isa(KERN_ISA_SCALAR);
    cr_assert_eq(kern_pack_supported(KERN_W_Q8_0, 64), false, "no packed kernel at scalar");
    cr_assert_eq(kern_pack_supported(KERN_W_Q4_0, 64), false, "no packed kernel at scalar");
    for (enum kern_isa l = KERN_ISA_AVX2; l <= kern_isa_max(); l++) {
        kern_set_isa(l);
        cr_assert_eq(kern_pack_supported(KERN_W_Q4_0, 64), true, "%s", kern_isa_name(l));
        cr_assert_eq(kern_pack_supported(KERN_W_Q4_0, 48), false, "%s", kern_isa_name(l));
        cr_assert_eq(kern_pack_supported(KERN_W_Q8_0, 64), l >= KERN_ISA_AVX512,
                     "%s: Q8_0 packs from avx512 up only", kern_isa_name(l));
    }
    kern_set_isa(kern_isa_max());
}

/* kern_pack_make_in: the bytes kern_pack_make writes, where the caller
 * says, kern_pack_bytes of them and not one more; the buffer stays the
 * caller's; a NULL or misaligned buffer and the shapes kern_pack_make
 * refuses are refused, pk untouched. */
Test(kern_pack, make_in_writes_the_same_bytes_into_the_callers_buffer) {
    enum { N_IN = 512, N_OUT = 21 };
    static const enum kern_wtype types[] = {KERN_W_Q8_0, KERN_W_Q4_0, KERN_W_Q4_K, KERN_W_Q5_K,
                                            KERN_W_Q6_K};
    static float wf[N_IN * N_OUT];
    kt_fill(wf, N_IN * N_OUT, 31);
    for (size_t ti = 0; ti < sizeof(types) / sizeof(types[0]); ti++) {
        const enum kern_wtype t = types[ti];
        void *w = kt_make_w(t, wf, N_IN, N_OUT);
        const size_t bytes = kern_pack_bytes(t, N_IN, N_OUT);
        if (t == KERN_W_Q8_0 || t == KERN_W_Q4_0) /* pack.c: 544 or 288 B a record */
            cr_assert_eq(bytes, (t == KERN_W_Q8_0 ? 544u : 288u) * (N_IN / 32) * 2,
                         "type %d: two groups of 16 rows", t);
        unsigned char *buf = mem_alloc(MEM_TEST, bytes + 64);
        memset(buf, 0x5A, bytes + 64);
        struct kern_pack ref, pk;
        cr_assert_eq(kern_pack_make(NULL, &ref, t, w, N_IN, N_OUT), 0);
        cr_assert_eq(ref.bytes, bytes);
        struct kern_pool *p;
        cr_assert_eq(kern_pool_create(2, &p), 0);
        cr_assert_eq(kern_pack_make_in(p, &pk, t, w, N_IN, N_OUT, buf), 0);
        kern_pool_destroy(p);
        cr_assert_eq(pk.data, (void *)buf);
        cr_assert_eq(pk.bytes, bytes);
        cr_assert(pk.borrowed);
        cr_assert_arr_eq(buf, ref.data, bytes, "type %d: not kern_pack_make's bytes", t);
        for (int k = 0; k < 64; k++)
            cr_assert_eq(buf[bytes + k], 0x5A, "type %d: byte %zu past the pack written", t,
                         bytes + (size_t)k);
        kern_pack_free(&pk); /* borrowed: zeroes pk, leaves buf */
        cr_assert_null(pk.data);
        cr_assert_eq(buf[0], ((unsigned char *)ref.data)[0]);
        struct kern_pack keep = {.bytes = 777};
        cr_assert_eq(kern_pack_make_in(NULL, &keep, t, w, N_IN, N_OUT, NULL), -EINVAL);
        cr_assert_eq(kern_pack_make_in(NULL, &keep, t, w, N_IN, N_OUT, buf + 32), -EINVAL);
        cr_assert_eq(kern_pack_make_in(NULL, &keep, t, w, N_IN, 0, buf), -EINVAL);
        cr_assert_eq(kern_pack_make_in(NULL, &keep, t, w, 96, N_OUT, buf),
                     t == KERN_W_Q8_0 || t == KERN_W_Q4_0 ? 0 : -EINVAL);
        if (keep.data) { /* 96 is whole Q8_0/Q4_0 blocks */
            cr_assert_eq(keep.bytes, kern_pack_bytes(t, 96, N_OUT));
            kern_pack_free(&keep);
        } else {
            cr_assert_eq(keep.bytes, 777u, "type %d: refused, pk untouched", t);
            cr_assert_eq(kern_pack_bytes(t, 96, N_OUT), 0u);
        }
        cr_assert_eq(kern_pack_bytes(KERN_W_F16, N_IN, N_OUT), 0u);
        cr_assert_eq(kern_pack_make_in(NULL, &keep, KERN_W_F16, w, N_IN, N_OUT, buf), -ENOTSUP);
        kern_pack_free(&ref);
        mem_free(buf);
        mem_free(w);
    }
}

Test(kern_pack, k_refusals_leave_the_pack_untouched) {
    static unsigned char w[2 * 2 * 210];
    for (int ti = 0; ti < 3; ti++) {
        const enum kern_wtype t = kp_ktypes[ti];
        struct kern_pack pk = {.bytes = 12345};
        cr_assert_eq(kern_pack_make(NULL, &pk, t, w, 288, 1), -EINVAL,
                     "type %d: n_in not whole blocks", t);
        cr_assert_eq(kern_pack_make(NULL, &pk, t, w, 32, 1), -EINVAL, "type %d: n_in 32", t);
        cr_assert_eq(kern_pack_make(NULL, &pk, t, w, 256, 0), -EINVAL, "type %d: no rows", t);
        mem_fail_nth(1);
        cr_assert_eq(kern_pack_make(NULL, &pk, t, w, 512, 2), -ENOMEM, "type %d", t);
        mem_fail_nth(0);
        cr_assert_eq(pk.bytes, 12345u);
        cr_assert_null(pk.data);
        cr_assert_eq(kern_pack_supported(t, 288), false);
        if (kern_isa_max() >= KERN_ISA_AVX512) {
            kern_set_isa(KERN_ISA_AVX512);
            cr_assert_eq(kern_pack_supported(t, 256), true, "type %d", t);
        }
        kern_set_isa(KERN_ISA_AVX2); /* Q4_K and Q5_K pack there, Q6_K stays on the rows */
        cr_assert_eq(kern_pack_supported(t, 256), t != KERN_W_Q6_K, "type %d at avx2", t);
        kern_set_isa(KERN_ISA_SCALAR);
        cr_assert_eq(kern_pack_supported(t, 256), false, "type %d: no packed kernel at scalar", t);
        kern_set_isa(kern_isa_max());
    }
}
