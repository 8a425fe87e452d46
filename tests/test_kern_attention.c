/* kern_attention with GQA on a strided, multi-layer KV buffer (every cache
 * type) against a naive double-precision softmax(QK^T/sqrt(d))V over the
 * values the cache holds (kern_kv_load), and the quantized caches against
 * the f32 one on the same data (the quantization error, bounded). */
#include <criterion/criterion.h>
#include <math.h>

#include "kernels/cpu/kern_cpu.h"
#include "tests/lib/kern_util.h"

#define N_LAYER 2
#define PAD     24 /* bytes of padding per token, so the stride is not a neat size */

struct kv_buf {
    unsigned char *base;
    struct kern_kv kv; /* layer 1 */
};

/* Token layout: [layer][k|v][n_kv_head][head_dim] + PAD. Fills n_ctx tokens. */
static void kv_build(struct kv_buf *b, enum kern_kv_type t, int n_head, int n_kv, int hd, int n_ctx,
                     uint64_t seed) {
    const size_t row = kern_kv_row_bytes(t, n_kv, hd);
    const size_t stride = N_LAYER * 2 * row + PAD;
    b->base = mem_calloc(MEM_TEST, (size_t)n_ctx, stride);
    float *tmp = mem_alloc(MEM_TEST, sizeof(float) * (size_t)n_kv * hd);
    for (int tok = 0; tok < n_ctx; tok++)
        for (int l = 0; l < N_LAYER; l++)
            for (int kvsel = 0; kvsel < 2; kvsel++) {
                kt_fill(tmp, (size_t)n_kv * hd, seed + (uint64_t)tok * 16 + l * 2 + kvsel);
                kern_kv_store(b->base + tok * stride + (l * 2 + kvsel) * row, tmp, n_kv, hd, t);
            }
    mem_free(tmp);
    b->kv = (struct kern_kv){.k = b->base + 2 * row,
                             .v = b->base + 3 * row,
                             .stride_bytes = stride,
                             .type = t,
                             .n_head = n_head,
                             .n_kv_head = n_kv,
                             .head_dim = hd};
}

/* Element d of kv head h of token tok, as the cache holds it (rotated back
 * for Q4_0). */
static double kv_get(const struct kern_kv *kv, const void *base, int tok, int h, int d) {
    float row[16 * KERN_ATT_MAX_HEAD_DIM];
    cr_assert_leq(kv->n_kv_head * kv->head_dim, 16 * KERN_ATT_MAX_HEAD_DIM);
    kern_kv_load(row, (const char *)base + (size_t)tok * kv->stride_bytes, kv->n_kv_head,
                 kv->head_dim, kv->type);
    return row[h * kv->head_dim + d];
}

/* window > 0: a sliding window (kern_kv.window); the keys no query of the
 * batch sees are overwritten with NaN first, so reading one shows. */
static void check_attention_w(enum kern_isa isa, enum kern_kv_type t, int n_head, int n_kv, int hd,
                              int n_tok, int pos0, int n_threads, int window) {
    kern_set_isa(isa);
    struct kv_buf b;
    kv_build(&b, t, n_head, n_kv, hd, pos0 + n_tok, 100 + hd);
    b.kv.window = window;
    for (int tok = 0; window && t == KERN_KV_F32 && tok < pos0 + 1 - window; tok++) {
        float *k = (float *)((unsigned char *)b.kv.k + (size_t)tok * b.kv.stride_bytes);
        float *v = (float *)((unsigned char *)b.kv.v + (size_t)tok * b.kv.stride_bytes);
        for (int e = 0; e < n_kv * hd; e++)
            k[e] = v[e] = NAN;
    }
    const size_t nq = (size_t)n_tok * n_head * hd;
    float *q = mem_alloc(MEM_TEST, nq * sizeof(float));
    float *out = mem_alloc(MEM_TEST, nq * sizeof(float));
    double *sc = mem_alloc(MEM_TEST, sizeof(double) * (size_t)(pos0 + n_tok));
    kt_fill(q, nq, 7);
    for (size_t i = 0; i < nq; i++)
        q[i] *= 3.0f;
    struct kern_pool *p = NULL;
    if (n_threads > 1)
        cr_assert_eq(kern_pool_create(n_threads, &p), 0);
    kern_attention(p, out, q, n_tok, pos0, &b.kv);
    const int group = n_head / n_kv;
    for (int i = 0; i < n_tok; i++)
        for (int h = 0; h < n_head; h++) {
            const float *qh = q + ((size_t)i * n_head + h) * hd;
            const int nk = pos0 + i + 1, kh = h / group;
            const int j0 = window && nk > window ? nk - window : 0;
            double mx = -INFINITY, sum = 0;
            for (int j = j0; j < nk; j++) {
                double s = 0;
                for (int d = 0; d < hd; d++)
                    s += qh[d] * kv_get(&b.kv, b.kv.k, j, kh, d);
                sc[j] = s / sqrt((double)hd);
                mx = fmax(mx, sc[j]);
            }
            for (int j = j0; j < nk; j++)
                sum += (sc[j] = exp(sc[j] - mx));
            for (int d = 0; d < hd; d++) {
                double want = 0;
                for (int j = j0; j < nk; j++)
                    want += sc[j] / sum * kv_get(&b.kv, b.kv.v, j, kh, d);
                double got = out[((size_t)i * n_head + h) * hd + d];
                cr_assert(fabs(got - want) <= 2e-5,
                          "isa %d kv %d hd %d tok %d head %d d %d: %.8g want %.8g", isa, t, hd, i,
                          h, d, got, want);
            }
        }
    kern_pool_destroy(p);
    mem_free(sc);
    mem_free(out);
    mem_free(q);
    mem_free(b.base);
}

static void check_attention(enum kern_isa isa, enum kern_kv_type t, int n_head, int n_kv, int hd,
                            int n_tok, int pos0, int n_threads) {
    check_attention_w(isa, t, n_head, n_kv, hd, n_tok, pos0, n_threads, 0);
}

/* A sliding window: each query sees its last `window` keys; windows across
 * chunk edges (33, 40 keys) and one as long as the context (no masking). */
Test(kern_attention, sliding_window_matches_naive) {
    for (size_t ii = 0; ii < kt_n_isas(); ii++) {
        check_attention_w(kt_isas[ii], KERN_KV_F32, 8, 2, 16, 1, 100, 1, 33);
        check_attention_w(kt_isas[ii], KERN_KV_F32, 8, 2, 16, 9, 70, 2, 40);
        check_attention_w(kt_isas[ii], KERN_KV_F32, 4, 4, 8, 17, 0, 2, 5);
        check_attention_w(kt_isas[ii], KERN_KV_F32, 4, 4, 8, 3, 5, 1, 64);
        check_attention_w(kt_isas[ii], KERN_KV_Q8_0, 6, 3, 20, 3, 60, 2, 17);
    }
}

Test(kern_attention, gqa_f32_cache_matches_naive) {
    for (size_t ii = 0; ii < kt_n_isas(); ii++) {
        check_attention(kt_isas[ii], KERN_KV_F32, 8, 2, 16, 1, 0, 1);
        check_attention(kt_isas[ii], KERN_KV_F32, 8, 2, 16, 5, 70, 2);
        check_attention(kt_isas[ii], KERN_KV_F32, 6, 3, 20, 3, 33, 3); /* hd tail */
        check_attention(kt_isas[ii], KERN_KV_F32, 4, 4, 8, 17, 0, 2);  /* MHA, stories260K hd */
        /* P.V's passes of NG heads x E slices and their single-slice rest:
         * NG 1 (E 6: 6 + 3 slices), 2 (E 4: 4 + 1), 3 (dummy-1g's 12/4, E 3:
         * 3 + 3 + 2), 4 (E 2: 2 + 1), then E 1 for 5, 6, 7, 8 */
        check_attention(kt_isas[ii], KERN_KV_F32, 2, 2, 72, 2, 50, 1);
        check_attention(kt_isas[ii], KERN_KV_F32, 8, 4, 40, 2, 40, 2);
        check_attention(kt_isas[ii], KERN_KV_F32, 12, 4, 64, 2, 40, 2);
        check_attention(kt_isas[ii], KERN_KV_F32, 8, 2, 24, 2, 40, 1);
        check_attention(kt_isas[ii], KERN_KV_F32, 10, 2, 24, 2, 40, 1);
        check_attention(kt_isas[ii], KERN_KV_F32, 6, 1, 16, 2, 33, 2);
        check_attention(kt_isas[ii], KERN_KV_F32, 7, 1, 40, 3, 33, 2);
        check_attention(kt_isas[ii], KERN_KV_F32, 8, 1, 16, 2, 33, 1);
    }
}

/* The quantized caches, on every level: head_dim 8 (four heads a Q8_0/Q4_0
 * block, stories260K), 20 (heads across blocks, 8-lane loads straddling
 * them), 64, and 12 with a group above 8. */
Test(kern_attention, quantized_caches_match_naive) {
    const enum kern_kv_type ts[] = {KERN_KV_Q8_0, KERN_KV_Q4_0, KERN_KV_FP8};
    for (size_t ii = 0; ii < kt_n_isas(); ii++)
        for (int k = 0; k < 3; k++) {
            check_attention(kt_isas[ii], ts[k], 8, 4, 8, 3, 40, 1);
            check_attention(kt_isas[ii], ts[k], 6, 3, 20, 3, 33, 2);
            check_attention(kt_isas[ii], ts[k], 8, 2, 64, 2, 70, 2);
            check_attention(kt_isas[ii], ts[k], 12, 1, 12, 2, 9, 1);
        }
}

/* The same data through an f32 cache and a quantized one: the outputs differ
 * by the quantization error alone, which stays within a bound per type
 * (twice the worst case measured here: q8_0 0.0024, q4_0 0.078, fp8 0.024,
 * with K and V in [-1, 1)), and is not zero (the data really went through the
 * quantizer). */
Test(kern_attention, quantized_error_is_bounded) {
    const enum kern_kv_type ts[] = {KERN_KV_Q8_0, KERN_KV_Q4_0, KERN_KV_FP8};
    const double bound[] = {0.005, 0.16, 0.05};
    enum { NH = 8, NKV = 2, HD = 64, NTOK = 4, POS0 = 60 };
    static float q[NTOK * NH * HD], ref[NTOK * NH * HD], out[NTOK * NH * HD];
    kt_fill(q, NTOK * NH * HD, 5);
    for (size_t i = 0; i < NTOK * NH * HD; i++)
        q[i] *= 3.0f;
    struct kv_buf f;
    kv_build(&f, KERN_KV_F32, NH, NKV, HD, POS0 + NTOK, 9);
    kern_attention(NULL, ref, q, NTOK, POS0, &f.kv);
    for (int k = 0; k < 3; k++) {
        struct kv_buf b;
        kv_build(&b, ts[k], NH, NKV, HD, POS0 + NTOK, 9);
        kern_attention(NULL, out, q, NTOK, POS0, &b.kv);
        double worst = 0;
        for (size_t i = 0; i < NTOK * NH * HD; i++)
            worst = fmax(worst, fabs((double)out[i] - ref[i]));
        cr_log_info("kv %d: worst |out - f32| %.4g", ts[k], worst);
        cr_assert(worst <= bound[k] && worst > 0, "kv %d: worst %.4g, bound %.4g", ts[k], worst,
                  bound[k]);
        mem_free(b.base);
    }
    mem_free(f.base);
}

Test(kern_attention, gqa_f16_cache_matches_naive) {
    for (size_t ii = 0; ii < kt_n_isas(); ii++) {
        check_attention(kt_isas[ii], KERN_KV_F16, 8, 2, 16, 1, 0, 1);
        check_attention(kt_isas[ii], KERN_KV_F16, 8, 2, 64, 5, 70, 2);
        check_attention(kt_isas[ii], KERN_KV_F16, 12, 1, 12, 3, 33, 3); /* group > 8 */
    }
}

/* The softmax's vector exp (kernels/cpu/attention.c) against exp in double
 * over its whole domain: below 3 ulp everywhere it is not flushed to 0. */
Test(kern_attention, vector_exp_is_within_3_ulp) {
    if (kern_isa_max() < KERN_ISA_AVX2)
        cr_skip_test("no AVX2 on this CPU");
    enum { N = 30000 };
    static float s[N], x[N];
    for (int i = 0; i < N; i++)
        x[i] = s[i] = -87.3f * (float)i / (float)(N - 1) + (i % 7) * 1e-3f;
    x[0] = s[0] = 0.0f;
    for (int i = 0; i < N; i += 29) /* odd lengths exercise the tail */
        kern_cpu_exp_sub_avx2(s + i, i + 29 <= N ? 29 : N - i, 0.0f);
    double worst = 0;
    for (int i = 0; i < N; i++) {
        const double want = exp((double)x[i]);
        const double ulp = nextafterf((float)want, INFINITY) - (float)want;
        const double err = fabs(s[i] - want) / ulp;
        worst = err > worst ? err : worst;
        cr_assert(err < 3.0, "exp(%.9g) = %.9g, want %.9g (%.2f ulp)", x[i], s[i], want, err);
    }
    cr_log_info("worst %.2f ulp", worst);
    float z[3] = {-88.0f, -100.0f, -1e30f};
    kern_cpu_exp_sub_avx2(z, 3, 0.0f);
    cr_assert(z[0] == 0.0f && z[1] == 0.0f && z[2] == 0.0f, "flushed: %g %g %g", z[0], z[1], z[2]);
}

/* FNV-1a over the outputs of every cache type, head_dim in hds, and the
 * group shapes below (group sizes 1 to 8 and 12: two passes of
 * ATT_GMAX), 77 keys (two whole chunks and 13: every tail of the key
 * loops), three queries, at level isa. */
static uint64_t att_hash(enum kern_isa isa, const int *hds, size_t n_hds) {
    kern_set_isa(isa);
    static const int shapes[][2] = {{8, 8},  {8, 4},  {12, 4}, {8, 2}, {10, 2},
                                    {12, 2}, {14, 2}, {16, 2}, {24, 2}};
    static const enum kern_kv_type types[] = {KERN_KV_F32, KERN_KV_F16, KERN_KV_Q8_0, KERN_KV_Q4_0,
                                              KERN_KV_FP8};
    enum { N_TOK = 3, POS0 = 74 };
    uint64_t h = KT_FNV_BASIS;
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++)
        for (size_t hi = 0; hi < n_hds; hi++)
            for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
                const int nh = shapes[si][0], nkv = shapes[si][1], hd = hds[hi];
                struct kv_buf b;
                kv_build(&b, types[ti], nh, nkv, hd, POS0 + N_TOK, 7 + si);
                float *q = mem_alloc(MEM_TEST, sizeof(float) * (size_t)N_TOK * nh * hd);
                float *o = mem_alloc(MEM_TEST, sizeof(float) * (size_t)N_TOK * nh * hd);
                kt_fill(q, (size_t)N_TOK * nh * hd, 99 + si);
                kern_attention(NULL, o, q, N_TOK, POS0, &b.kv);
                h = kt_fnv1a(h, o, sizeof(float) * (size_t)N_TOK * nh * hd);
                mem_free(o);
                mem_free(q);
                mem_free(b.base);
            }
    kern_set_isa(kern_isa_max());
    return h;
}

/* The AVX2 attention's bits, pinned, at every level from AVX2 up: head_dim
 * 36 (a 4-element tail in each dot), 64 and 128. Each dot is one 8-lane
 * FMA chain over head_dim in order, a fixed hsum, then the tail
 * (attention.c); how many keys and heads run side by side, the
 * prefetches, and the AVX512 level's two keys to a zmm and 16-element P.V
 * slices (attention_avx512.c) must not change a bit. The value was
 * recorded from the kernel before keys ran several heads at a time
 * (3034419), built as the Makefile builds it (GCC, -std=c17: no
 * contraction of a * b + c outside the intrinsics; clang's default
 * contraction gives other bits) with glibc's expf for the rescale; FMA and
 * the exp polynomial are the same on every x86 with AVX2. head_dim 8, 16,
 * 24, 40, 56, 80, 104 and 120 (at AVX512: P.V's 8-element tail, and each
 * count of 16-element slices left after its blocks, 1 to 7, as blocks of
 * 4, 2 and 1) are compared with the AVX2 level's, not pinned. */
Test(kern_attention, avx2_bits_pinned) {
    if (kern_isa_max() < KERN_ISA_AVX2)
        cr_skip_test("no AVX2 on this CPU");
    static const int pinned[] = {36, 64, 128}, more[] = {8, 16, 24, 40, 56, 80, 104, 120};
    enum { N_MORE = sizeof more / sizeof more[0] };
    const uint64_t want = att_hash(KERN_ISA_AVX2, more, N_MORE);
    for (size_t ii = 0; ii < kt_n_isas(); ii++) {
        if (kt_isas[ii] < KERN_ISA_AVX2)
            continue;
        const uint64_t h = att_hash(kt_isas[ii], pinned, 3);
        cr_assert_eq(h, 0xe4580a8af5fb7ed4u, "%s: FNV-1a %#018llx", kern_isa_name(kt_isas[ii]),
                     (unsigned long long)h);
        const uint64_t m = att_hash(kt_isas[ii], more, N_MORE);
        cr_assert_eq(m, want, "%s: FNV-1a %#018llx, avx2's %#018llx", kern_isa_name(kt_isas[ii]),
                     (unsigned long long)m, (unsigned long long)want);
    }
}
