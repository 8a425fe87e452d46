/* kern_matmul against double-precision references, every weight type, both
 * ISAs, odd sizes; and Q8_0 against a scalar model of ggml's algorithm. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>

#include "tests/lib/kern_util.h"

/* The activation row as the kernel sees it: F16 rounds to f16, Q8_0/Q4_0
 * quantize to Q8_0 (ggml's reference) and dequantize. */
static void ref_act(enum kern_wtype t, const float *x, double *out, int n) {
    if (t == KERN_W_F16) {
        for (int i = 0; i < n; i++)
            out[i] = kern_f16_to_f32_1(kern_f32_to_f16_1(x[i]));
    } else if (kt_is_quant(t)) {
        unsigned char blk[34 * 64];
        float tmp[2048];
        kern_quantize_row_q8_0(x, blk, n);
        kern_dequant_row(KERN_W_Q8_0, blk, tmp, n);
        for (int i = 0; i < n; i++)
            out[i] = tmp[i];
    } else {
        for (int i = 0; i < n; i++)
            out[i] = x[i];
    }
}

/* Y vs sum_k deq(W)[r][k] * act(X)[t][k] in double; error bound relative to
 * sum |w x| (f32 accumulation of n terms). */
static void check_case(enum kern_isa isa, enum kern_wtype t, int n_in, int n_out, int n_tok,
                       int n_threads) {
    kern_set_isa(isa);
    float *wf = mem_alloc(MEM_TEST, sizeof(float) * (size_t)n_in * n_out);
    float *x = mem_alloc(MEM_TEST, sizeof(float) * (size_t)n_in * n_tok);
    float *y = mem_alloc(MEM_TEST, sizeof(float) * (size_t)n_out * n_tok);
    float *wd = mem_alloc(MEM_TEST, sizeof(float) * (size_t)n_in);
    double *xa = mem_alloc(MEM_TEST, sizeof(double) * (size_t)n_in * n_tok);
    kt_fill(wf, (size_t)n_in * n_out, 11 + n_in);
    kt_fill(x, (size_t)n_in * n_tok, 29 + n_tok);
    for (int i = 0; i < n_in * n_tok; i += 7)
        x[i] *= 9.0f; /* uneven magnitudes inside blocks */
    void *w = kt_make_w(t, wf, n_in, n_out);
    struct kern_pool *p = NULL;
    if (n_threads > 0)
        cr_assert_eq(kern_pool_create(n_threads, &p), 0);
    kern_matmul(p, y, x, w, t, n_in, n_out, n_tok);
    for (int k = 0; k < n_tok; k++)
        ref_act(t, x + (size_t)k * n_in, xa + (size_t)k * n_in, n_in);
    size_t rb = kern_row_bytes(t, n_in);
    for (int r = 0; r < n_out; r++) {
        kern_dequant_row(t, (const char *)w + rb * r, wd, n_in);
        for (int k = 0; k < n_tok; k++) {
            double s = 0, a = 0;
            for (int i = 0; i < n_in; i++) {
                s += wd[i] * xa[(size_t)k * n_in + i];
                a += fabs(wd[i] * xa[(size_t)k * n_in + i]);
            }
            double got = y[(size_t)k * n_out + r];
            cr_assert(fabs(got - s) <= 2e-6 * a + 1e-30,
                      "isa %d type %d n_in %d n_out %d n_tok %d thr %d: y[%d][%d] = %.9g want "
                      "%.9g (sum|wx| %.3g)",
                      isa, t, n_in, n_out, n_tok, n_threads, k, r, got, s, a);
        }
    }
    kern_pool_destroy(p);
    mem_free(w);
    mem_free(xa);
    mem_free(wd);
    mem_free(y);
    mem_free(x);
    mem_free(wf);
}

static void check_type(enum kern_wtype t) {
    static const int n_ins[] = {64, 172, 288};
    static const int n_outs[] = {13, 37};
    /* 17 and 20 tokens: every tail of the tiles (avx512 floats 6 + 6 + 4 + 1
     * and 6 x 3 + 2) */
    static const int n_toks[] = {1, 3, 17, 20};
    for (size_t ii = 0; ii < kt_n_isas(); ii++)
        for (size_t a = 0; a < 3; a++) {
            if (kt_is_quant(t) && n_ins[a] % 32)
                continue;
            for (size_t b = 0; b < 2; b++)
                for (size_t c = 0; c < 4; c++)
                    check_case(kt_isas[ii], t, n_ins[a], n_outs[b], n_toks[c], c >= 2 ? 2 : 0);
        }
}

Test(kern_matmul, f32_matches_double_reference) {
    check_type(KERN_W_F32);
}
Test(kern_matmul, f16_matches_double_reference) {
    check_type(KERN_W_F16);
}
Test(kern_matmul, bf16_matches_double_reference) {
    check_type(KERN_W_BF16);
}
Test(kern_matmul, q8_0_matches_double_reference) {
    check_type(KERN_W_Q8_0);
}
Test(kern_matmul, q4_0_matches_double_reference) {
    check_type(KERN_W_Q4_0);
}

/* ggml_vec_dot_q8_0_q8_0 (generic) on ggml-format blocks: an int sum per
 * block, then sumf += sumi * (d_w * d_x) in float. */
static float ggml_model_q8_0(const unsigned char *wrow, const unsigned char *xrow, int n) {
    float sumf = 0;
    for (int b = 0; b < n / 32; b++) {
        const unsigned char *wb = wrow + 34 * b, *xb = xrow + 34 * b;
        uint16_t dw, dx;
        memcpy(&dw, wb, 2);
        memcpy(&dx, xb, 2);
        int sumi = 0;
        for (int j = 0; j < 32; j++)
            sumi += (int8_t)wb[2 + j] * (int8_t)xb[2 + j];
        sumf += sumi * (kern_f16_to_f32_1(dw) * kern_f16_to_f32_1(dx));
    }
    return sumf;
}

Test(kern_matmul, q8_0_matches_ggml_model) {
    enum { N_IN = 288, N_OUT = 37, N_TOK = 5 };
    static float wf[N_OUT * N_IN], x[N_TOK * N_IN], y[N_TOK * N_OUT];
    static unsigned char xq[N_TOK][34 * N_IN / 32];
    kt_fill(wf, N_OUT * N_IN, 5);
    kt_fill(x, N_TOK * N_IN, 6);
    unsigned char *w = kt_make_w(KERN_W_Q8_0, wf, N_IN, N_OUT);
    for (int k = 0; k < N_TOK; k++)
        kern_quantize_row_q8_0(x + k * N_IN, xq[k], N_IN);
    for (size_t ii = 0; ii < kt_n_isas(); ii++) {
        kern_set_isa(kt_isas[ii]);
        kern_matmul(NULL, y, x, w, KERN_W_Q8_0, N_IN, N_OUT, N_TOK);
        for (int k = 0; k < N_TOK; k++)
            for (int r = 0; r < N_OUT; r++) {
                float want = ggml_model_q8_0(w + 34 * (N_IN / 32) * r, xq[k], N_IN);
                float got = y[k * N_OUT + r];
                if (kt_isas[ii] == KERN_ISA_SCALAR)
                    cr_assert_eq(got, want, "scalar is ggml's generic: y[%d][%d] %.9g vs %.9g", k,
                                 r, got, want);
                else
                    cr_assert(fabsf(got - want) <= 1e-6f * fabsf(want) + 1e-6f,
                              "avx2 y[%d][%d] %.9g vs %.9g", k, r, got, want);
            }
    }
    mem_free(w);
}

/* The quantizers against hand-checked values of ggml's reference. */
Test(kern_matmul, quantizers_follow_ggml_reference) {
    float x[32];
    for (int j = 0; j < 32; j++)
        x[j] = (float)(j - 16) / 4.0f; /* -4 .. 3.75 */
    unsigned char b8[34], b4[18];
    kern_quantize_row_q8_0(x, b8, 32);
    uint16_t d;
    memcpy(&d, b8, 2);
    cr_assert_eq(d, kern_f32_to_f16_1(4.0f / 127), "q8 d %#x", d);
    for (int j = 0; j < 32; j++) {
        int want = (int)roundf(x[j] * (1.0f / (4.0f / 127)));
        cr_assert_eq((int8_t)b8[2 + j], want, "q8 qs[%d] %d want %d", j, (int8_t)b8[2 + j], want);
    }
    kern_quantize_row_q4_0(x, b4, 32);
    memcpy(&d, b4, 2);
    cr_assert_eq(kern_f16_to_f32_1(d), 0.5f, "q4 d = max/-8 = -4/-8");
    /* x[0] = -4 -> -4/0.5 + 8.5 = 0.5 -> 0; x[16] = 0 -> 8 */
    cr_assert_eq(b4[2] & 0x0F, 0);
    cr_assert_eq(b4[2] >> 4, 8);
    float back[32];
    kern_dequant_row(KERN_W_Q4_0, b4, back, 32);
    for (int j = 0; j < 32; j++)
        cr_assert(fabsf(back[j] - x[j]) <= 0.5f, "q4 back[%d] %g vs %g", j, back[j], x[j]);
    kern_dequant_row(KERN_W_Q8_0, b8, back, 32);
    for (int j = 0; j < 32; j++)
        cr_assert(fabsf(back[j] - x[j]) <= 0.5f * 4.0f / 127 + 1e-6f, "q8 back[%d]", j);
}

Test(kern_matmul, row_bytes) {
    cr_assert_eq(kern_row_bytes(KERN_W_F32, 10), 40u);
    cr_assert_eq(kern_row_bytes(KERN_W_F16, 10), 20u);
    cr_assert_eq(kern_row_bytes(KERN_W_BF16, 10), 20u);
    cr_assert_eq(kern_row_bytes(KERN_W_Q8_0, 64), 68u);
    cr_assert_eq(kern_row_bytes(KERN_W_Q4_0, 64), 36u);
    cr_assert_eq(kern_row_bytes(KERN_W_Q4_0, 33), 0u);
    cr_assert_eq(kern_row_bytes((enum kern_wtype)3, 64), 0u); /* q4_1: not a kernel type */
    cr_assert(kern_wtype_ok(KERN_W_Q8_0) && kern_wtype_ok(KERN_W_BF16));
    cr_assert(kern_wtype_ok(KERN_W_Q2_K) && kern_wtype_ok(KERN_W_Q3_K) &&
              kern_wtype_ok(KERN_W_Q4_K) && kern_wtype_ok(KERN_W_Q5_K) &&
              kern_wtype_ok(KERN_W_Q6_K));
    cr_assert(!kern_wtype_ok(3) && !kern_wtype_ok(6) && !kern_wtype_ok(15) && !kern_wtype_ok(-1));
}

/* A Q8_0 file may hold -128 (ggml's quantizers never write it). Every
 * level, decode (1 token) and prefill (8 tokens), must compute its products
 * exactly: -128 * x is not sign(-128 by x) * |x| in int8. */
Test(kern_matmul, regress_q8_0_minus_128) {
    enum { N_IN = 64, N_OUT = 11, N_TOK = 8 };
    struct kern_blk_q8_0_t {
        uint16_t d;
        int8_t qs[32];
    } __attribute__((packed)) w[N_OUT][N_IN / 32];
    float x[N_TOK * N_IN], y1[N_TOK * N_OUT], y8[N_TOK * N_OUT], xd[N_IN];
    kt_fill(x, N_TOK * N_IN, 3);
    for (int r = 0; r < N_OUT; r++)
        for (int b = 0; b < N_IN / 32; b++) {
            w[r][b].d = kern_f32_to_f16_1(0.01f * (float)(r + 1));
            for (int j = 0; j < 32; j++)
                w[r][b].qs[j] = (int8_t)((j + r + b) % 3 == 0 ? -128 : (j * 37 + r) % 255 - 127);
        }
    for (size_t ii = 0; ii < kt_n_isas(); ii++) {
        kern_set_isa(kt_isas[ii]);
        kern_matmul(NULL, y8, x, w, KERN_W_Q8_0, N_IN, N_OUT, N_TOK);
        for (int k = 0; k < N_TOK; k++)
            kern_matmul(NULL, y1 + k * N_OUT, x + k * N_IN, w, KERN_W_Q8_0, N_IN, N_OUT, 1);
        for (int k = 0; k < N_TOK; k++) {
            unsigned char xq[34 * (N_IN / 32)];
            kern_quantize_row_q8_0(x + k * N_IN, xq, N_IN);
            kern_dequant_row(KERN_W_Q8_0, xq, xd, N_IN);
            for (int r = 0; r < N_OUT; r++) {
                double s = 0, a = 0;
                for (int i = 0; i < N_IN; i++) {
                    double wv = kern_f16_to_f32_1(w[r][i / 32].d) * w[r][i / 32].qs[i % 32];
                    s += wv * xd[i];
                    a += fabs(wv * xd[i]);
                }
                cr_assert(fabs(y1[k * N_OUT + r] - s) <= 2e-6 * a,
                          "%s decode y[%d][%d] %.9g want %.9g", kern_isa_name(kt_isas[ii]), k, r,
                          y1[k * N_OUT + r], s);
                cr_assert_eq(y8[k * N_OUT + r], y1[k * N_OUT + r],
                             "%s: y[%d][%d] batched %.9g alone %.9g", kern_isa_name(kt_isas[ii]), k,
                             r, y8[k * N_OUT + r], y1[k * N_OUT + r]);
            }
        }
    }
}

/* n_in 0: every dot product is empty, so Y is zeros, on every level, alone,
 * batched and threaded (the prefill's chunk sizing divided by the row's 0
 * bytes). */
Test(kern_matmul, regress_empty_rows_give_zeros) {
    float y[4 * 5];
    const float x[1] = {1.0f};
    struct kern_pool *p;
    cr_assert_eq(kern_pool_create(2, &p), 0);
    for (size_t ii = 0; ii < kt_n_isas(); ii++) {
        kern_set_isa(kt_isas[ii]);
        for (size_t ti = 0; ti < sizeof(kt_types) / sizeof(kt_types[0]); ti++)
            for (int n_tok = 1; n_tok <= 4; n_tok += 3) {
                for (int i = 0; i < 20; i++)
                    y[i] = 7.0f;
                kern_matmul(n_tok > 1 ? p : NULL, y, x, x, kt_types[ti], 0, 5, n_tok);
                for (int i = 0; i < 5 * n_tok; i++)
                    cr_assert_eq(y[i], 0.0f, "%s type %d, %d tokens: y[%d] %g",
                                 kern_isa_name(kt_isas[ii]), kt_types[ti], n_tok, i, y[i]);
            }
    }
    kern_pool_destroy(p);
}

/* A converted activation row wider than the 32 KiB stack buffer with no
 * pool (a Q8_0 row of 32768 elements is 33 KiB; a Q4_0 pack's row of 15360
 * is 34 KiB): one heap row, one token a pass, the pool's bits. Only when
 * that allocation fails too is y NaN (and the error logged). */
Test(kern_matmul, wide_rows_without_a_pool_give_the_pool_bits) {
    enum { N_OUT = 20, N_TOK = 3 };
    static const struct {
        enum kern_wtype t;
        int n_in;
        bool packed;
    } cases[] = {{KERN_W_Q8_0, 32768, false}, {KERN_W_Q4_0, 15360, true}};
    for (size_t c = 0; c < 2; c++) {
        const int n_in = cases[c].n_in;
        float *wf = mem_alloc(MEM_TEST, sizeof(float) * (size_t)n_in * N_OUT);
        float *x = mem_alloc(MEM_TEST, sizeof(float) * (size_t)n_in * N_TOK);
        kt_fill(wf, (size_t)n_in * N_OUT, 31);
        kt_fill(x, (size_t)n_in * N_TOK, 37);
        void *w = kt_make_w(cases[c].t, wf, n_in, N_OUT);
        struct kern_pack pk = {0};
        if (cases[c].packed)
            cr_assert_eq(kern_pack_make(NULL, &pk, cases[c].t, w, n_in, N_OUT), 0);
        for (size_t ii = 0; ii < kt_n_isas(); ii++) {
            kern_set_isa(kt_isas[ii]);
            float want[N_OUT * N_TOK], y[N_OUT * N_TOK];
            struct kern_pool *p;
            cr_assert_eq(kern_pool_create(2, &p), 0);
            if (cases[c].packed)
                kern_matmul_packed(p, want, x, &pk, N_TOK);
            else
                kern_matmul(p, want, x, w, cases[c].t, n_in, N_OUT, N_TOK);
            kern_pool_destroy(p);
            if (cases[c].packed)
                kern_matmul_packed(NULL, y, x, &pk, N_TOK);
            else
                kern_matmul(NULL, y, x, w, cases[c].t, n_in, N_OUT, N_TOK);
            for (int i = 0; i < N_OUT * N_TOK; i++)
                cr_assert(isfinite(want[i]), "%s type %d: y[%d] %g", kern_isa_name(kt_isas[ii]),
                          cases[c].t, i, want[i]);
            cr_assert_arr_eq(y, want, sizeof y, "%s type %d n_in %d: no pool vs a pool",
                             kern_isa_name(kt_isas[ii]), cases[c].t, n_in);
            mem_fail_nth(1); /* the heap row */
            if (cases[c].packed)
                kern_matmul_packed(NULL, y, x, &pk, N_TOK);
            else
                kern_matmul(NULL, y, x, w, cases[c].t, n_in, N_OUT, N_TOK);
            mem_fail_nth(0);
            for (int i = 0; i < N_OUT * N_TOK; i++)
                cr_assert(isnan(y[i]), "%s type %d: y[%d] %g with no memory at all",
                          kern_isa_name(kt_isas[ii]), cases[c].t, i, y[i]);
        }
        kern_pack_free(&pk);
        mem_free(w);
        mem_free(x);
        mem_free(wf);
    }
}
