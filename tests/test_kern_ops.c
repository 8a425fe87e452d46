/* Elementwise and small kernels against double-precision references, and
 * the f16 conversion against F16C bit for bit. */
#include <criterion/criterion.h>
#include <math.h>

#include "kernels/cpu/kern_cpu.h"
#include "tests/lib/kern_util.h"

Test(kern_ops, rmsnorm_matches_double_and_aliases) {
    enum { N = 173 };
    float x[N], w[N], y[N];
    kt_fill(x, N, 1);
    kt_fill(w, N, 2);
    double ss = 0;
    for (int i = 0; i < N; i++)
        ss += (double)x[i] * x[i];
    const double sc = 1.0 / sqrt(ss / N + 1e-5);
    kern_rmsnorm(y, x, w, N, 1e-5f);
    for (int i = 0; i < N; i++)
        cr_assert(fabs(y[i] - x[i] * sc * w[i]) <= 1e-6 * (fabs(x[i] * sc * w[i]) + 1e-3),
                  "y[%d] %.9g want %.9g", i, y[i], x[i] * sc * w[i]);
    kern_rmsnorm(x, x, w, N, 1e-5f);
    cr_assert_arr_eq(x, y, sizeof(y), "in place gives the same bits");
}

Test(kern_ops, rope_matches_closed_form) {
    enum { NH = 3, HD = 16, NROT = 12 };
    const int positions[] = {0, 1, 7, 300, 2047};
    for (size_t pi = 0; pi < sizeof(positions) / sizeof(positions[0]); pi++) {
        const int pos = positions[pi];
        float x[NH * HD], x0[NH * HD];
        kt_fill(x0, NH * HD, 3 + pos);
        memcpy(x, x0, sizeof(x));
        kern_rope(x, NH, HD, NROT, pos, 10000.0f);
        for (int h = 0; h < NH; h++)
            for (int i = 0; i < HD / 2; i++) {
                const float *a = x0 + h * HD + 2 * i;
                double want0 = a[0], want1 = a[1];
                if (2 * i < NROT) {
                    double th = pos * pow(10000.0, -2.0 * i / NROT);
                    want0 = a[0] * cos(th) - a[1] * sin(th);
                    want1 = a[0] * sin(th) + a[1] * cos(th);
                }
                /* theta in float: ~1 ulp per pair step, times pos */
                const double tol = 1e-6 + 4e-7 * (i + 1) * pos * pow(10000.0, -2.0 * i / NROT);
                const float *g = x + h * HD + 2 * i;
                cr_assert(fabs(g[0] - want0) <= tol && fabs(g[1] - want1) <= tol,
                          "pos %d head %d pair %d: (%.8g, %.8g) want (%.8g, %.8g)", pos, h, i, g[0],
                          g[1], want0, want1);
            }
    }
}

Test(kern_ops, softmax_matches_double) {
    enum { N = 301 };
    float x[N];
    kt_fill(x, N, 4);
    for (int i = 0; i < N; i++)
        x[i] *= 30.0f;
    double mx = -INFINITY, s = 0, e[N];
    for (int i = 0; i < N; i++)
        mx = fmax(mx, x[i]);
    for (int i = 0; i < N; i++)
        s += (e[i] = exp((double)x[i] - mx));
    kern_softmax(x, N);
    double tot = 0;
    for (int i = 0; i < N; i++) {
        cr_assert(fabs(x[i] - e[i] / s) <= 1e-6 * e[i] / s + 1e-12, "p[%d] %.9g want %.9g", i, x[i],
                  e[i] / s);
        tot += x[i];
    }
    cr_assert(fabs(tot - 1.0) < 1e-5, "sum %.9g", tot);
}

Test(kern_ops, swiglu_matches_double_and_aliases) {
    enum { N = 77 };
    float g[N], u[N], y[N];
    kt_fill(g, N, 5);
    kt_fill(u, N, 6);
    for (int i = 0; i < N; i++)
        g[i] *= 12.0f;
    kern_swiglu(y, g, u, N);
    for (int i = 0; i < N; i++) {
        double want = g[i] / (1.0 + exp(-(double)g[i])) * u[i];
        cr_assert(fabs(y[i] - want) <= 1e-6 * fabs(want) + 1e-7, "y[%d] %.9g want %.9g", i, y[i],
                  want);
    }
    kern_swiglu(g, g, u, N);
    cr_assert_arr_eq(g, y, sizeof(y));
}

/* Every half round-trips on both ISAs; both ISAs round random floats to the
 * same bits; rounding is to nearest, ties to even. */
Test(kern_ops, f16_conversion_is_exact_and_isa_independent) {
    static uint16_t h[65536], h2[65536], h3[65536];
    static float f[65536];
    for (int i = 0; i < 65536; i++)
        h[i] = (uint16_t)i;
    for (size_t ii = 0; ii < kt_n_isas(); ii++) {
        kern_set_isa(kt_isas[ii]);
        kern_f16_to_f32(f, h, 65536);
        kern_f32_to_f16(h2, f, 65536);
        for (int i = 0; i < 65536; i++) {
            if (isnan(f[i]))
                cr_assert((h2[i] & 0x7c00) == 0x7c00 && (h2[i] & 0x3ff), "NaN %#x -> %#x", i,
                          h2[i]);
            else
                cr_assert_eq(h2[i], h[i], "isa %d: %#x -> %g -> %#x", kt_isas[ii], i, f[i], h2[i]);
        }
    }
    uint64_t s = 7;
    for (int i = 0; i < 65536; i++) {
        uint32_t u = (uint32_t)kt_rng_next(&s);
        if (i % 4 == 0)
            u = (u & 0x80000000u) | ((u & 0x0fffffffu) + 0x30000000u); /* f16 range */
        memcpy(&f[i], &u, 4);
    }
    kern_set_isa(KERN_ISA_SCALAR);
    kern_f32_to_f16(h2, f, 65536);
    for (size_t ii = 1; ii < kt_n_isas(); ii++) {
        kern_set_isa(kt_isas[ii]);
        kern_f32_to_f16(h3, f, 65536);
        for (int i = 0; i < 65536; i++)
            cr_assert_eq(h2[i], h3[i], "%a: scalar %#x %s %#x", (double)f[i], h2[i],
                         kern_isa_name(kt_isas[ii]), h3[i]);
    }
    cr_assert_eq(kern_f32_to_f16_1(1.0f + 1.0f / 2048), 0x3c00, "tie rounds to even (down)");
    cr_assert_eq(kern_f32_to_f16_1(1.0f + 3.0f / 2048), 0x3c02, "tie rounds to even (up)");
    cr_assert_eq(kern_f32_to_f16_1(65520.0f), 0x7c00, "65520 overflows");
    cr_assert_eq(kern_f32_to_f16_1(65519.0f), 0x7bff);
    cr_assert_eq(kern_f32_to_f16_1(0x1p-25f), 0, "half the smallest subnormal: tie to 0");
    cr_assert_eq(kern_f32_to_f16_1(0x1.8p-25f), 1);
}

/* The activation rows of the Q8_0/Q4_0 matmuls (kern_cpu_act_q8: AVX2 at
 * that level, AVX512 sixteen blocks at a time from there up) hold, at every
 * level, the bytes of ggml's reference rule (kern_quantize_row_q8_0,
 * scalar code): random blocks, zeros, halves that roundf takes away from
 * zero (q +-0.5 exactly: amax 127 makes d 1) and the floats just below
 * them, signed zeros, subnormals, values up to ~1e36, an infinity and NaNs
 * (-127, quant.c's rule); 48 blocks (three of AVX512's groups of sixteen)
 * and 53 (a partial group). */
static void act_q8_check(int nb) {
    const int n = nb * 32;
    float *x = mem_alloc(MEM_TEST, sizeof(float) * (size_t)n);
    unsigned char *ref = mem_alloc(MEM_TEST, (size_t)nb * 34);
    unsigned char *got = mem_alloc(MEM_TEST, kern_cpu_act_q8_bytes(n));
    kt_fill(x, (size_t)n, 21);
    for (int b = 0; b < nb; b++) {
        float *xb = x + 32 * b;
        for (int j = 0; j < 32; j++)
            switch (b % 8) {
            case 1:
                xb[j] = 0.0f;
                break;
            case 2: /* halves, and the floats just below them (q rounds down) */
                xb[j] = j == 0 ? 127.0f : (float)(j - 16) + (j % 2 ? 0.5f : -0.5f);
                if (j % 4 == 3)
                    xb[j] = nextafterf(xb[j], 0.0f);
                if (j == 30)
                    xb[j] = 0.49999997f;
                break;
            case 3:
                xb[j] = j == 5 ? -127.0f : (float)(16 - j) * 3.5f;
                break;
            case 4:
                xb[j] = j % 2 ? -0.0f : 0.0f;
                break;
            case 5:
                xb[j] *= 0x1p-140f;
                break; /* subnormal inputs */
            case 6:
                xb[j] *= 0x1p+120f;
                break; /* up to ~1e36 */
            case 7:
                xb[j] = xb[j] * 1e-3f + (j == 9 ? -2.0f : 0.0f);
                break;
            default:
                break;
            }
        if (b == 8) { /* d infinite: every other product 0, these -127 */
            xb[3] = INFINITY;
            xb[7] = NAN;
        }
        if (b == 24 || b == 50) /* a NaN beside finite values */
            xb[5] = -NAN;
    }
    kern_quantize_row_q8_0(x, ref, n);
    /* the packed kernels' rows: these bytes, then their group sums
     * (kern_cpu_act_q8s), the same at every level as at scalar */
    const size_t sb = kern_cpu_act_q8s_bytes(n);
    unsigned char *sums[2], *sums_got = mem_alloc(MEM_TEST, sb);
    const enum kern_wtype st[2] = {KERN_W_Q8_0, KERN_W_Q4_0};
    kern_set_isa(KERN_ISA_SCALAR);
    for (int k = 0; k < 2; k++) {
        sums[k] = mem_alloc(MEM_TEST, sb);
        memset(sums[k], 0, sb);
        kern_cpu_act_q8s(st[k], x, sums[k], n);
    }
    for (size_t ii = 0; ii < kt_n_isas(); ii++) {
        kern_set_isa(kt_isas[ii]);
        for (int k = 0; k < 2; k++) {
            memset(sums_got, 0, sb);
            kern_cpu_act_q8s(st[k], x, sums_got, n);
            cr_assert_arr_eq(sums_got, sums[k], sb, "%s, %d blocks: type %d's sums",
                             kern_isa_name(kt_isas[ii]), nb, (int)st[k]);
        }
        memset(got, 0xA5, kern_cpu_act_q8_bytes(n));
        kern_cpu_act_q8(x, got, n);
        const float *d = (const float *)(got + n);
        for (int b = 0; b < nb; b++) {
            uint16_t h;
            memcpy(&h, ref + 34 * b, 2);
            cr_assert_eq(memcmp(&d[b], &(float){kern_f16_to_f32_1(h)}, 4), 0,
                         "%s, %d blocks, block %d: d %a, the reference %a",
                         kern_isa_name(kt_isas[ii]), nb, b, (double)d[b],
                         (double)kern_f16_to_f32_1(h));
            for (int j = 0; j < 32; j++)
                cr_assert_eq((int8_t)got[32 * b + j], (int8_t)ref[34 * b + 2 + j],
                             "%s, %d blocks, block %d x[%d] %a: q %d, the reference %d",
                             kern_isa_name(kt_isas[ii]), nb, b, j, (double)x[32 * b + j],
                             (int8_t)got[32 * b + j], (int8_t)ref[34 * b + 2 + j]);
        }
    }
    kern_set_isa(kern_isa_max());
    for (int k = 0; k < 2; k++)
        mem_free(sums[k]);
    mem_free(sums_got);
    mem_free(got);
    mem_free(ref);
    mem_free(x);
}

Test(kern_ops, act_q8_is_the_reference_rule_at_every_level) {
    act_q8_check(48);
    act_q8_check(53);
}

Test(kern_ops, kv_store_and_dequant) {
    float x[40], y[40];
    uint16_t h[40];
    kt_fill(x, 40, 8);
    kern_kv_store(y, x, 5, 8, KERN_KV_F32);
    cr_assert_arr_eq(x, y, sizeof(x));
    kern_kv_store(h, x, 5, 8, KERN_KV_F16);
    for (int i = 0; i < 40; i++)
        cr_assert_eq(h[i], kern_f32_to_f16_1(x[i]));
    kern_dequant_row(KERN_W_F16, h, y, 40);
    for (int i = 0; i < 40; i++)
        cr_assert(fabsf(y[i] - x[i]) <= fabsf(x[i]) / 2048 + 1e-7f, "f16 %d", i);
    for (int i = 0; i < 40; i++)
        h[i] = kt_bf16(x[i]);
    kern_dequant_row(KERN_W_BF16, h, y, 40);
    for (int i = 0; i < 40; i++)
        cr_assert(fabsf(y[i] - x[i]) <= fabsf(x[i]) / 256, "bf16 %d", i);
    kern_dequant_row(KERN_W_F32, x, y, 40);
    cr_assert_arr_eq(x, y, sizeof(x));
}

/* NEOX RoPE is the normal one on de-interleaved pairs: pair i is (i, i +
 * n_rot/2) instead of (2i, 2i+1), the same angles, bit for bit; dims past
 * n_rot are left alone. */
Test(kern_ops, rope_neox_is_rope_on_split_halves) {
    enum { H = 3, D = 24, R = 16 };
    float x[H * D], y[H * D], z[H * D];
    for (int i = 0; i < H * D; i++)
        x[i] = sinf(0.37f * (float)i) * 2.0f;
    for (int pos = 0; pos < 300; pos += 37) {
        memcpy(y, x, sizeof x);
        kern_rope_neox(y, H, D, R, pos, 10000.0f);
        for (int h = 0; h < H; h++)
            for (int i = 0; i < D; i++) /* x with each head's first R dims interleaved */
                z[h * D + i] = i >= R       ? x[h * D + i]
                               : i % 2 == 0 ? x[h * D + i / 2]
                                            : x[h * D + R / 2 + i / 2];
        kern_rope(z, H, D, R, pos, 10000.0f);
        for (int h = 0; h < H; h++)
            for (int i = 0; i < R / 2; i++) {
                cr_assert_eq(y[h * D + i], z[h * D + 2 * i], "pos %d head %d pair %d", pos, h, i);
                cr_assert_eq(y[h * D + i + R / 2], z[h * D + 2 * i + 1], "pos %d head %d", pos, h);
            }
        for (int h = 0; h < H; h++)
            for (int i = R; i < D; i++)
                cr_assert_eq(y[h * D + i], x[h * D + i]);
    }
}
