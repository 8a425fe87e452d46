/* The KV row types (kernels/cpu/kv_quant.c, layouts in kern.h): row sizes,
 * the bytes each store writes (GGUF blocks for Q8_0/Q4_0, E4M3 codes for
 * FP8), the rotation, and the round-trip error of each type. */
#include <criterion/criterion.h>
#include <math.h>

#include "kernels/cpu/kern_cpu.h"
#include "tests/lib/kern_util.h"

static float fp8_value(uint8_t b) {
    return kern_f16_to_f32_1(kern_cpu_fp8_f16_bits(b)) * 256.0f;
}

Test(kern_kvquant, row_bytes_follow_the_layouts) {
    static const struct {
        enum kern_kv_type t;
        int nkv, hd;
        size_t want;
    } c[] = {
        {KERN_KV_F32, 4, 8, 128},    {KERN_KV_F16, 4, 8, 64},      {KERN_KV_Q8_0, 4, 8, 34},
        {KERN_KV_Q4_0, 4, 8, 18},    {KERN_KV_FP8, 4, 8, 48},      {KERN_KV_Q8_0, 3, 20, 68},
        {KERN_KV_Q4_0, 3, 20, 36},   {KERN_KV_Q8_0, 8, 128, 1088}, {KERN_KV_Q4_0, 8, 128, 576},
        {KERN_KV_FP8, 8, 128, 1056}, {KERN_KV_Q8_0, 1, 1, 34},     {KERN_KV_Q8_0, 0, 8, 0},
        {KERN_KV_F16, 4, -1, 0},     {KERN_KV_N, 4, 8, 0},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++)
        cr_assert_eq(kern_kv_row_bytes(c[i].t, c[i].nkv, c[i].hd), c[i].want,
                     "type %d %dx%d: %zu, want %zu", c[i].t, c[i].nkv, c[i].hd,
                     kern_kv_row_bytes(c[i].t, c[i].nkv, c[i].hd), c[i].want);
}

/* A Q8_0 row is GGUF's Q8_0 blocks over the whole row; a partial last block
 * is the quantization of its values followed by zeros. */
Test(kern_kvquant, q8_0_row_is_gguf_blocks) {
    float x[64], pad[32] = {0};
    unsigned char got[68], want[68];
    kt_fill(x, 64, 3);
    kern_kv_store(got, x, 8, 8, KERN_KV_Q8_0); /* 64 values: two whole blocks */
    kern_quantize_row_q8_0(x, want, 64);
    cr_assert_arr_eq(got, want, 68);
    kern_kv_store(got, x, 3, 20, KERN_KV_Q8_0); /* 60 values: one block and 28 */
    memcpy(pad, x + 32, 28 * sizeof(float));
    kern_quantize_row_q8_0(x, want, 32);
    kern_quantize_row_q8_0(pad, want + 34, 32);
    cr_assert_arr_eq(got, want, 68);
    float back[60];
    kern_kv_load(back, got, 3, 20, KERN_KV_Q8_0);
    for (int i = 0; i < 60; i++) {
        float amax = 0;
        for (int j = i / 32 * 32; j < (i / 32 + 1) * 32 && j < 60; j++)
            amax = fmaxf(amax, fabsf(x[j]));
        /* d/2 of rounding plus 127 * |f16(d) - d| <= 127 * d * 2^-11 */
        cr_assert(fabsf(back[i] - x[i]) <= amax / 127 * (0.5f + 127.0f / 2048), "%d: %g vs %g", i,
                  back[i], x[i]);
    }
}

Test(kern_kvquant, rotation_blocks_and_inverse) {
    cr_assert_eq(kern_kv_rot_block(8), 8);
    cr_assert_eq(kern_kv_rot_block(128), 128);
    cr_assert_eq(kern_kv_rot_block(80), 16);
    cr_assert_eq(kern_kv_rot_block(96), 32);
    cr_assert_eq(kern_kv_rot_block(20), 4);
    cr_assert_eq(kern_kv_rot_block(7), 1);
    cr_assert_eq(kern_kv_rot_block(256), 256);
    /* block 2: [a + b, a - b] / sqrt 2 */
    float p[2] = {3.0f, 1.0f};
    kern_kv_rotate(p, 1, 2);
    cr_assert_float_eq(p[0], 4.0f / sqrtf(2.0f), 1e-6f);
    cr_assert_float_eq(p[1], 2.0f / sqrtf(2.0f), 1e-6f);
    /* one-hot 0 -> the constant 1/sqrt(8) (the first row of H is all ones) */
    float e0[8] = {1};
    kern_kv_rotate(e0, 1, 8);
    for (int i = 0; i < 8; i++)
        cr_assert_float_eq(e0[i], 0.35355339f, 1e-7f, "%d: %g", i, e0[i]);
    const int hds[] = {8, 80, 128, 12, 7};
    for (size_t k = 0; k < sizeof hds / sizeof hds[0]; k++) {
        const int hd = hds[k];
        float x[3 * 128], y[3 * 128];
        kt_fill(x, 3 * (size_t)hd, 11 + k);
        memcpy(y, x, sizeof(float) * 3 * (size_t)hd);
        kern_kv_rotate(y, 3, hd);
        double nx = 0, ny = 0;
        for (int i = 0; i < 3 * hd; i++) {
            nx += (double)x[i] * x[i];
            ny += (double)y[i] * y[i];
        }
        cr_assert(fabs(nx - ny) <= 1e-5 * nx, "hd %d: norm %g -> %g", hd, nx, ny);
        kern_kv_rotate(y, 3, hd);
        for (int i = 0; i < 3 * hd; i++)
            cr_assert(fabsf(y[i] - x[i]) <= 2e-6f, "hd %d, %d: %g back to %g", hd, i, y[i], x[i]);
    }
}

/* Q4_0 stores the rotated row as GGUF Q4_0 blocks; the load rotates back. */
Test(kern_kvquant, q4_0_row_is_rotated_gguf_blocks) {
    float x[60], r[64] = {0};
    unsigned char got[36], want[36];
    kt_fill(x, 60, 5);
    memcpy(r, x, sizeof x);
    kern_kv_rotate(r, 3, 20);
    kern_kv_store(got, x, 3, 20, KERN_KV_Q4_0);
    kern_quantize_row_q4_0(r, want, 64); /* the 4 padding zeros end the second block */
    cr_assert_arr_eq(got, want, 36);
    float back[60], plain[64];
    kern_kv_load(back, got, 3, 20, KERN_KV_Q4_0);
    kern_dequant_row(KERN_W_Q4_0, want, plain, 64);
    kern_kv_rotate(plain, 3, 20);
    for (int i = 0; i < 60; i++)
        cr_assert_eq(back[i], plain[i], "%d", i);
}

/* What the rotation is for: a head with one outlier channel (a RoPE'd K
 * often has a few) loses its small channels to 4-bit rounding without the
 * rotation (the block's step is set by the outlier), and keeps most of them
 * with it (the outlier is spread evenly, so every channel gets the same,
 * smaller step). Mean squared error of the head, measured: 0.00098
 * rotated against 0.00265 plain. */
Test(kern_kvquant, q4_0_rotation_spreads_an_outlier) {
    enum { HD = 32 };
    float x[HD], back[HD], plain[HD];
    unsigned char q[18];
    kt_fill(x, HD, 21);
    for (int i = 0; i < HD; i++)
        x[i] *= 0.1f;
    x[5] = 4.0f;
    kern_kv_store(q, x, 1, HD, KERN_KV_Q4_0);
    kern_kv_load(back, q, 1, HD, KERN_KV_Q4_0);
    kern_quantize_row_q4_0(x, q, HD);
    kern_dequant_row(KERN_W_Q4_0, q, plain, HD);
    double e_rot = 0, e_plain = 0;
    for (int i = 0; i < HD; i++) {
        e_rot += (back[i] - x[i]) * (back[i] - x[i]) / HD;
        e_plain += (plain[i] - x[i]) * (plain[i] - x[i]) / HD;
    }
    cr_log_info("mean squared error: rotated %.4g, plain %.4g", e_rot, e_plain);
    cr_assert(e_rot * 2 < e_plain, "rotated %.4g, plain %.4g", e_rot, e_plain);
}

Test(kern_kvquant, fp8_codes_round_to_nearest_even) {
    static const struct {
        float x;
        uint8_t want;
    } c[] = {
        {0.0f, 0x00},      {-0.0f, 0x80},     {1.0f, 0x38},      {-1.0f, 0xB8},
        {448.0f, 0x7E},    {-448.0f, 0xFE},   {500.0f, 0x7E},    {1e30f, 0x7E},
        {240.0f, 0x77},    {0x1p-6f, 0x08},   {0x1p-9f, 0x01},   {0x1p-10f, 0x00},
        {0x1.8p-9f, 0x02}, {0x0.fp-6f, 0x08}, {1.0625f, 0x38},   {1.1875f, 0x3A},
        {1.05f, 0x38},     {1.1f, 0x39},      {464.0f, 0x7E},    {0x1.cp-7f, 0x07},
        {0x1.ep-7f, 0x08}, {INFINITY, 0x7E},  {-INFINITY, 0xFE},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++)
        cr_assert_eq(kern_cpu_fp8_from_f32(c[i].x), c[i].want, "%a -> 0x%02x, want 0x%02x", c[i].x,
                     kern_cpu_fp8_from_f32(c[i].x), c[i].want);
    cr_assert_eq(kern_cpu_fp8_from_f32(NAN) & 0x7F, 0x7E, "NaN saturates, never 0x7F");
    /* every finite code decodes to its E4M3 value and encodes back to itself */
    for (int b = 0; b < 256; b++) {
        if ((b & 0x7F) == 0x7F)
            continue; /* NaN */
        const int e = (b >> 3) & 15, m = b & 7;
        const float want = (b & 0x80 ? -1.0f : 1.0f) *
                           (e ? ldexpf(1.0f + (float)m / 8, e - 7) : ldexpf((float)m / 8, -6));
        cr_assert_eq(fp8_value((uint8_t)b), want, "0x%02x: %a, want %a", b, fp8_value((uint8_t)b),
                     want);
        cr_assert_eq(kern_cpu_fp8_from_f32(want), b, "0x%02x does not come back", b);
    }
}

/* FP8 rows: per head the f32 scale amax/448, the largest element at +-448
 * (0x7E/0xFE), and every element within half a step of E4M3 (relative
 * 2^-4) of its value, or 2^-10 * scale in the subnormal range. */
Test(kern_kvquant, fp8_row_has_a_scale_per_head) {
    enum { NKV = 3, HD = 20 };
    float x[NKV * HD], back[NKV * HD];
    unsigned char r[NKV * (4 + HD)];
    kt_fill(x, NKV * HD, 9);
    for (int i = 0; i < HD; i++)
        x[HD + i] *= 1000.0f;                  /* heads of very different magnitudes */
    memset(x + 2 * HD, 0, HD * sizeof(float)); /* and an all-zero head */
    kern_kv_store(r, x, NKV, HD, KERN_KV_FP8);
    kern_kv_load(back, r, NKV, HD, KERN_KV_FP8);
    for (int h = 0; h < NKV; h++) {
        const unsigned char *hb = r + h * (4 + HD);
        float s, amax = 0;
        memcpy(&s, hb, 4);
        int imax = 0;
        for (int e = 0; e < HD; e++)
            if (fabsf(x[h * HD + e]) > amax) {
                amax = fabsf(x[h * HD + e]);
                imax = e;
            }
        cr_assert_eq(s, amax / 448.0f, "head %d: scale %g", h, s);
        if (amax > 0)
            cr_assert_eq(hb[4 + imax] & 0x7F, 0x7E, "head %d: the max is 0x%02x", h, hb[4 + imax]);
        for (int e = 0; e < HD; e++) {
            const float v = x[h * HD + e], err = fabsf(back[h * HD + e] - v);
            cr_assert(err <= fabsf(v) / 16 + s * 0x1p-10f, "head %d elem %d: %g -> %g", h, e, v,
                      back[h * HD + e]);
        }
    }
}

/* kern.h: a KV row may start at any address. Every type stored one byte
 * past an aligned buffer writes the bytes an aligned store writes and loads
 * back the same values (Q8_0 and Q4_0 once wrote and read their f16 d as a
 * struct field: a misaligned store and load, which the UBSan build of this
 * test stops at). */
Test(kern_kvquant, a_row_at_any_address_is_the_same_row) {
    static const enum kern_kv_type types[] = {KERN_KV_F32, KERN_KV_F16, KERN_KV_Q8_0, KERN_KV_Q4_0,
                                              KERN_KV_FP8};
    static const int shapes[][2] = {{2, 64}, {3, 20}, {1, 40}};
    float x[128], a[128], b[128];
    kt_fill(x, 128, 17);
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++)
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            const enum kern_kv_type t = types[ti];
            const int nkv = shapes[si][0], hd = shapes[si][1];
            const size_t bytes = kern_kv_row_bytes(t, nkv, hd);
            _Alignas(64) unsigned char al[1024], odd[1024 + 3];
            cr_assert_leq(bytes, 1024u);
            for (int off = 1; off <= 3; off++) {
                memset(al, 0xA5, sizeof al);
                memset(odd, 0xA5, sizeof odd);
                kern_kv_store(al, x, nkv, hd, t);
                kern_kv_store(odd + off, x, nkv, hd, t);
                cr_assert_arr_eq(odd + off, al, bytes, "type %d %dx%d at +%d", t, nkv, hd, off);
                cr_assert_eq(odd[off - 1], 0xA5, "type %d: wrote before its row", t);
                cr_assert_eq(odd[off + bytes], 0xA5, "type %d: wrote past its row", t);
                kern_kv_load(a, al, nkv, hd, t);
                kern_kv_load(b, odd + off, nkv, hd, t);
                cr_assert_arr_eq(a, b, sizeof(float) * (size_t)(nkv * hd), "type %d %dx%d at +%d",
                                 t, nkv, hd, off);
            }
        }
}
