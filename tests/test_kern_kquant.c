/* The K-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K; Q8_K activations) against the format's
 * definition and ggml's algorithms:
 *  - dequantization of blocks whose bytes are written here by hand from
 *    ggml-common.h's layout, every value compared exactly;
 *  - the reference quantizers against bytes ggml's own quantize_row_q*_K_ref
 *    wrote for the same input (llama.cpp c392e50), and round-trip bounds;
 *  - the matmul at every ISA level against a double-precision product of
 *    the dequantized operands, odd shapes included; the portable path bit
 *    for bit against a model of ggml's generic vec_dot order, the AVX2 and
 *    AVX-VNNI levels (and Q2_K/Q3_K above them) bit for bit against a
 *    model of ggml's AVX2 order, and Q4_K/Q5_K/Q6_K from AVX-512 up
 *    against the one-sum order their packs run (kq_util.h).
 * Batch invariance of the K types is in test_kern_invariance.c. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>

#include "kernels/cpu/kern_cpu.h"
#include "tests/lib/kern_util.h"
#include "tests/lib/kq_util.h"

/* ---- dequantization of hand-built blocks --------------------------------- */

static const int hand_sc[8] = {1, 2, 3, 63, 17, 32, 0, 45};
static const int hand_mn[8] = {0, 5, 16, 63, 33, 1, 7, 62};
/* hand_sc/hand_mn packed by hand: bytes 0-3 sc[0..3] | (sc[4..7] >> 4) << 6,
 * bytes 4-7 mn[0..3] | (mn[4..7] >> 4) << 6, bytes 8-11 (sc[4..7] & 15) |
 * (mn[4..7] & 15) << 4 */
static const uint8_t hand_scales[12] = {0x41, 0x82, 0x03, 0xBF, 0x80, 0x05,
                                        0x10, 0xFF, 0x11, 0x10, 0x70, 0xED};

static void hand_q45(enum kern_wtype t, uint8_t *blk) {
    memset(blk, 0, 176);
    const uint16_t d = 0x3800, dmin = 0x3400; /* 0.5, 0.25 */
    memcpy(blk, &d, 2);
    memcpy(blk + 2, &dmin, 2);
    memcpy(blk + 4, hand_scales, 12);
    uint8_t *qs = blk + (t == KERN_W_Q5_K ? 48 : 16);
    for (int i = 0; i < 128; i++)
        qs[i] = (uint8_t)(i * 7 + 3);
    if (t == KERN_W_Q5_K)
        for (int l = 0; l < 32; l++)
            blk[16 + l] = (uint8_t)(l * 37 + 11);
}

Test(kern_kquant, q4_K_dequantizes_a_hand_built_block) {
    uint8_t blk[176];
    hand_q45(KERN_W_Q4_K, blk);
    float y[256];
    kern_dequant_row(KERN_W_Q4_K, blk, y, 256);
    for (int e = 0; e < 256; e++) {
        int j = e / 32, l = e % 32;
        uint8_t b = (uint8_t)((32 * (j / 2) + l) * 7 + 3);
        int q = j % 2 ? b >> 4 : b & 15;
        double want = 0.5 * hand_sc[j] * q - 0.25 * hand_mn[j];
        cr_assert_eq(y[e], (float)want, "q4_K e %d: %g want %g", e, y[e], want);
    }
    /* three values worked out on paper: qs[0] = 3, qs[127] = 0x7C */
    cr_assert_eq(y[0], 1.5f);     /* 0.5 * 1 * 3 - 0.25 * 0 */
    cr_assert_eq(y[32], -1.25f);  /* high nibble 0: -0.25 * 5 */
    cr_assert_eq(y[255], 142.0f); /* 0.5 * 45 * 7 - 0.25 * 62 */
    struct kq_ints k;
    kq_decode(KERN_W_Q4_K, blk, &k);
    for (int j = 0; j < 8; j++)
        cr_assert(k.sc[32 * j] == hand_sc[j] && k.mn[32 * j] == hand_mn[j], "sub-block %d", j);
}

Test(kern_kquant, q5_K_dequantizes_a_hand_built_block) {
    uint8_t blk[176];
    hand_q45(KERN_W_Q5_K, blk);
    float y[256];
    kern_dequant_row(KERN_W_Q5_K, blk, y, 256);
    for (int e = 0; e < 256; e++) {
        int j = e / 32, l = e % 32;
        uint8_t b = (uint8_t)((32 * (j / 2) + l) * 7 + 3);
        uint8_t hb = (uint8_t)(l * 37 + 11);
        int q = (j % 2 ? b >> 4 : b & 15) + 16 * ((hb >> j) & 1);
        double want = 0.5 * hand_sc[j] * q - 0.25 * hand_mn[j];
        cr_assert_eq(y[e], (float)want, "q5_K e %d: %g want %g", e, y[e], want);
    }
    /* qh[0] = 11 = 0b1011: sub-blocks 0, 1 and 3 add 16 to element 0 */
    cr_assert_eq(y[0], 9.5f);    /* 0.5 * 1 * (3 + 16) */
    cr_assert_eq(y[32], 14.75f); /* 0.5 * 2 * 16 - 0.25 * 5 */
}

Test(kern_kquant, q6_K_dequantizes_a_hand_built_block) {
    static const int8_t sc[16] = {1, -1, 2, -3, 127, -128, 5, 0, 9, -9, 64, -64, 3, 7, -2, 11};
    uint8_t blk[210];
    for (int i = 0; i < 128; i++)
        blk[i] = (uint8_t)(i * 13 + 5);
    for (int i = 0; i < 64; i++)
        blk[128 + i] = (uint8_t)(i * 29 + 7);
    memcpy(blk + 192, sc, 16);
    const uint16_t d = 0x3000; /* 0.125 */
    memcpy(blk + 208, &d, 2);
    float y[256];
    kern_dequant_row(KERN_W_Q6_K, blk, y, 256);
    for (int e = 0; e < 256; e++) {
        int half = e / 128, quarter = (e % 128) / 32, l = e % 32;
        uint8_t lo = blk[64 * half + 32 * (quarter % 2) + l];
        int q = (quarter < 2 ? lo & 15 : lo >> 4) |
                ((blk[128 + 32 * half + l] >> (2 * quarter)) & 3) << 4;
        double want = 0.125 * sc[e / 16] * (q - 32);
        cr_assert_eq(y[e], (float)want, "q6_K e %d: %g want %g", e, y[e], want);
    }
    /* element 0: ql[0] = 5, qh[0] = 7 -> q = 5 | 3 << 4 = 53 */
    cr_assert_eq(y[0], 2.625f); /* 0.125 * 1 * 21 */
    /* element 64: high nibble of ql[0] (0), bits 4-5 of qh[0] (0) -> -32 */
    cr_assert_eq(y[64], 0.125f * 127 * -32);
}

/* Q2_K by hand: 16 groups, scales and mins over 0..15, every level 0..3,
 * the bytes written here from ggml-common.h's block_q2_K: scales[16] (scale
 * in the low nibble, min in the high one), qs[64] (bits 2r, 2r + 1 of
 * qs[32h + l]: element 128h + 32r + l), f16 d, f16 dmin. */
Test(kern_kquant, q2_K_dequantizes_a_hand_built_block) {
    static const int sc[16] = {0, 15, 1, 7, 8, 3, 15, 2, 9, 4, 11, 6, 13, 5, 10, 12};
    static const int mn[16] = {15, 0, 3, 9, 1, 14, 15, 2, 6, 0, 7, 11, 4, 8, 5, 10};
    int lv[256];
    uint8_t blk[84] = {0};
    for (int g = 0; g < 16; g++)
        blk[g] = (uint8_t)(sc[g] | mn[g] << 4);
    for (int e = 0; e < 256; e++) {
        lv[e] = (e * 3 + e / 16) % 4;
        int h = e / 128, r = (e % 128) / 32, l = e % 32;
        blk[16 + 32 * h + l] |= (uint8_t)(lv[e] << (2 * r));
    }
    const uint16_t d = 0x3000, dmin = 0x2c00; /* 0.125, 0.0625 */
    memcpy(blk + 80, &d, 2);
    memcpy(blk + 82, &dmin, 2);
    float y[256];
    kern_dequant_row(KERN_W_Q2_K, blk, y, 256);
    for (int e = 0; e < 256; e++) {
        double want = 0.125 * sc[e / 16] * lv[e] - 0.0625 * mn[e / 16];
        cr_assert_eq(y[e], (float)want, "q2_K e %d: %g want %g", e, y[e], want);
    }
    /* element 0: level 0, min 15 -> -0.9375; element 17: level (51 + 1) %
     * 4 = 0, scale 15, min 0 -> 0; element 18: level 3 -> 0.125 * 15 * 3 */
    cr_assert_eq(y[0], -0.9375f);
    cr_assert_eq(y[17], 0.0f);
    cr_assert_eq(y[18], 5.625f);
}

/* Q3_K by hand: 16 scales over the whole 6-bit range, every level -4..3,
 * the bytes written here from ggml-common.h's block_q3_K: hmask[32] (bit
 * 4h + r of hmask[l]: level bit 2 of element 128h + 32r + l), qs[64] (bits
 * 2r, 2r + 1 of qs[32h + l]: its low 2 bits), scales[12] (scale + 32: low
 * nibble in byte j % 8, low half for j < 8; high 2 bits at bit 2(j / 4) of
 * byte 8 + j % 4), f16 d. */
Test(kern_kquant, q3_K_dequantizes_a_hand_built_block) {
    static const int sc[16] = {-32, 31, 0, 1, -1, 5, -17, 12, 30, -30, 7, -8, 2, -2, 16, -16};
    int lv[256];
    uint8_t blk[110] = {0};
    for (int e = 0; e < 256; e++) {
        lv[e] = (e * 5 + e / 16) % 8 - 4; /* every level in every group */
        int u = lv[e] + 4, h = e / 128, r = (e % 128) / 32, l = e % 32;
        blk[32 + 32 * h + l] |= (uint8_t)((u & 3) << (2 * r));
        blk[l] |= (uint8_t)((u >> 2) << (4 * h + r));
    }
    for (int j = 0; j < 16; j++) {
        int u = sc[j] + 32;
        blk[96 + j % 8] |= (uint8_t)((u & 15) << (j < 8 ? 0 : 4));
        blk[96 + 8 + j % 4] |= (uint8_t)((u >> 4) << (2 * (j / 4)));
    }
    const uint16_t d = 0x3000; /* 0.125 */
    memcpy(blk + 108, &d, 2);
    float y[256];
    kern_dequant_row(KERN_W_Q3_K, blk, y, 256);
    for (int e = 0; e < 256; e++) {
        double want = 0.125 * sc[e / 16] * lv[e];
        cr_assert_eq(y[e], (float)want, "q3_K e %d: %g want %g", e, y[e], want);
    }
    /* element 0: level -4, scale -32 -> 0.125 * 128; element 17: level
     * (85 + 1) % 8 - 4 = 2, scale 31 */
    cr_assert_eq(y[0], 16.0f);
    cr_assert_eq(y[17], 0.125f * 31 * 2);
    /* byte 96 holds scale 0's low nibble (0) and scale 8's (62 & 15 = 14) */
    cr_assert_eq(blk[96], 0xE0);
}

/* ---- quantizers ------------------------------------------------------------ */

/* Bytes ggml's quantize_row_q2_K_ref / q3_K_ref / q4_K_ref / q5_K_ref /
 * q6_K_ref (libggml-base, llama.cpp c392e50, after ggml_cpu_init) write
 * for golden_input(): the dummy writer must give llama-quantize's bytes. */
static const uint8_t golden_q2_K[84] = {
    0x3c, 0x24, 0xbb, 0x24, 0x3f, 0x23, 0xff, 0x24, 0x2c, 0x24, 0xfe, 0x23, 0x00, 0x00,
    0x88, 0x34, 0xdc, 0xdd, 0x89, 0xcc, 0x89, 0xdd, 0xdd, 0x33, 0x99, 0xc9, 0x89, 0x89,
    0x9d, 0x9d, 0x98, 0x89, 0x79, 0xb0, 0x58, 0xa0, 0x40, 0xfa, 0x2c, 0x02, 0xd9, 0x01,
    0xa2, 0xbd, 0xe4, 0xac, 0x02, 0x47, 0xb9, 0xfc, 0xf8, 0xe9, 0xb8, 0xed, 0xbc, 0x03,
    0xac, 0xb9, 0xe8, 0xfc, 0xb9, 0xec, 0xac, 0xe8, 0x9d, 0x68, 0xa8, 0x76, 0x16, 0x89,
    0x88, 0x9f, 0x59, 0x9c, 0x96, 0xd9, 0x6f, 0x3f, 0xe4, 0x61, 0x9d, 0x30, 0xc9, 0x35,
};
static const uint8_t golden_q3_K[110] = {
    0x5f, 0xfe, 0xdd, 0xaf, 0xfd, 0xef, 0xff, 0x00, 0xbf, 0x5c, 0xfe, 0xfe, 0x56, 0xba, 0x7d, 0xdf,
    0xc8, 0x02, 0xac, 0x36, 0x7e, 0xf1, 0xc8, 0xdf, 0x44, 0xce, 0x73, 0xc0, 0x12, 0x10, 0xaf, 0x3f,
    0x41, 0x07, 0x0c, 0x45, 0x1c, 0x00, 0x00, 0x00, 0x00, 0x0f, 0x03, 0x03, 0xc3, 0x37, 0x0d, 0x10,
    0x0b, 0x9a, 0x05, 0x89, 0x69, 0x5a, 0xb2, 0xfd, 0x2b, 0xee, 0xfa, 0x57, 0x75, 0xb6, 0xbe, 0x37,
    0xcc, 0x10, 0x5c, 0x73, 0x10, 0x43, 0x01, 0x00, 0x31, 0xcc, 0x40, 0x44, 0xcc, 0x74, 0xc5, 0x4c,
    0x07, 0xba, 0x21, 0x85, 0x26, 0x30, 0x39, 0x53, 0xeb, 0x60, 0xdd, 0xab, 0xb7, 0x03, 0xe6, 0x5c,
    0x57, 0x66, 0xe7, 0xca, 0x00, 0x0a, 0x0f, 0x6a, 0x80, 0xa6, 0xff, 0x95, 0x7c, 0x29,
};
static const uint8_t golden_q4_K[144] = {
    0x4d, 0x1f, 0x81, 0x2d, 0xf0, 0xed, 0x3c, 0xbf, 0x0a, 0xef, 0x0b, 0xbf, 0xd6, 0xd8, 0x00, 0x02,
    0xd0, 0xf5, 0xa2, 0xe1, 0xa3, 0xd4, 0xe3, 0x0f, 0xb4, 0xa5, 0xb5, 0xb5, 0xd5, 0xf5, 0xa0, 0xc4,
    0xe1, 0xb1, 0xf0, 0xb0, 0xb0, 0xe4, 0xf1, 0xa3, 0xe2, 0xa1, 0xb4, 0xf2, 0xc0, 0xf1, 0xa4, 0xc5,
    0xe4, 0xd3, 0xb1, 0xe1, 0xc0, 0xd2, 0xc4, 0x0f, 0xb3, 0xd1, 0xc1, 0xb1, 0xa2, 0xc4, 0xb3, 0xb1,
    0xc4, 0xd4, 0xc2, 0xd2, 0xb1, 0xe4, 0xb3, 0xa1, 0xe1, 0xa1, 0xd3, 0xe4, 0xe3, 0xd3, 0xb0, 0xc0,
    0xb4, 0xe2, 0xb2, 0xc4, 0xc2, 0xd5, 0xe0, 0x0f, 0xd1, 0xb4, 0xc2, 0xf2, 0xb4, 0xf2, 0xf1, 0xb2,
    0xe2, 0xe2, 0xd1, 0xd4, 0xd4, 0xd3, 0xe1, 0xf5, 0xe2, 0xf0, 0xc4, 0xe2, 0xf5, 0xf5, 0xd2, 0xb3,
    0x9c, 0xce, 0xde, 0xda, 0xae, 0xfb, 0xac, 0x00, 0xba, 0x7c, 0xfc, 0xfd, 0x9c, 0xda, 0x8b, 0xeb,
    0xbc, 0x9d, 0xbd, 0xae, 0x7b, 0xbb, 0xba, 0xcc, 0xab, 0xcb, 0xbc, 0xeb, 0x9c, 0x8e, 0xfd, 0x8d,
};
static const uint8_t golden_q5_K[176] = {
    0xc2, 0x1a, 0x83, 0x2d, 0xf5, 0xf0, 0x3f, 0xbe, 0x0b, 0xef, 0x0b, 0xbf, 0xb7, 0xdc, 0x00, 0x04,
    0xea, 0xea, 0xea, 0xea, 0xea, 0xea, 0xea, 0x15, 0xea, 0x6a, 0xea, 0xea, 0xea, 0xea, 0x6a, 0xea,
    0xea, 0xea, 0xea, 0xea, 0x6a, 0xea, 0xea, 0xea, 0xea, 0xea, 0xea, 0xea, 0xea, 0x6a, 0xea, 0xea,
    0xa0, 0xeb, 0x45, 0xd2, 0x57, 0xb7, 0xd7, 0x0e, 0x78, 0x5a, 0x7b, 0x7b, 0xab, 0xfa, 0x41, 0x98,
    0xd3, 0x72, 0xe0, 0x71, 0x61, 0xd8, 0xf2, 0x57, 0xd4, 0x43, 0x68, 0xe4, 0x81, 0xf3, 0x48, 0x8a,
    0xf8, 0xc7, 0x83, 0xf3, 0xa0, 0xe5, 0xb8, 0x0f, 0x95, 0xd3, 0xa2, 0x71, 0x65, 0xa8, 0x87, 0x81,
    0xa9, 0xd8, 0xb4, 0xd4, 0x92, 0xe8, 0x86, 0x61, 0xf2, 0x62, 0xc5, 0xe9, 0xe5, 0xd6, 0x81, 0xb1,
    0x78, 0xd3, 0x63, 0x88, 0x83, 0xaa, 0xd0, 0x0f, 0xa1, 0x67, 0x84, 0xe3, 0x77, 0xf4, 0xf1, 0x73,
    0xd4, 0xc3, 0xb1, 0x97, 0x98, 0xa6, 0xc1, 0xea, 0xc3, 0xe0, 0x87, 0xc4, 0xda, 0xe9, 0xa3, 0x75,
    0x3a, 0x9f, 0xbf, 0xa6, 0x5f, 0xe8, 0x5a, 0x00, 0x66, 0xfa, 0xfa, 0xfc, 0x3b, 0xb7, 0xf8, 0xd8,
    0x7b, 0x3c, 0x6d, 0x3f, 0xf9, 0x78, 0x77, 0x9a, 0x49, 0x99, 0x6a, 0xc9, 0x3c, 0xff, 0xed, 0x1e,
};
static const uint8_t golden_q6_K[210] = {
    0xc7, 0xe9, 0x21, 0x25, 0x6e, 0x0d, 0xce, 0x00, 0xfd, 0x2a, 0x39, 0x49, 0x09, 0xca, 0xd6,
    0x4c, 0x03, 0x5d, 0x31, 0x24, 0x33, 0xa1, 0x5d, 0x7b, 0x15, 0x41, 0xb0, 0x49, 0xb5, 0x6e,
    0x90, 0xce, 0x61, 0x25, 0xd9, 0x54, 0xfa, 0x42, 0x14, 0x01, 0xed, 0x3b, 0x0d, 0xcc, 0xa0,
    0xf7, 0xd9, 0xdf, 0x2d, 0x20, 0xc8, 0xe0, 0xa2, 0x5c, 0xf1, 0xe8, 0x0e, 0xed, 0x72, 0x97,
    0x68, 0x14, 0x2e, 0xfa, 0xfd, 0x53, 0x53, 0xac, 0x53, 0xcb, 0xf7, 0x00, 0xa5, 0xfe, 0xf2,
    0x22, 0x0e, 0xb2, 0xc5, 0xc3, 0x18, 0x70, 0x37, 0x3b, 0xe0, 0x73, 0xb5, 0x5a, 0xf6, 0x10,
    0xaa, 0xc9, 0xbe, 0x19, 0x11, 0xce, 0xbc, 0x23, 0x6b, 0x4d, 0xdd, 0x9f, 0xc3, 0x01, 0xef,
    0x5b, 0xad, 0xb4, 0xac, 0x55, 0x55, 0x8c, 0x08, 0xf5, 0xce, 0x2a, 0x09, 0xf2, 0x04, 0x54,
    0x43, 0x72, 0xb4, 0x24, 0x07, 0x20, 0xc4, 0x7e, 0x9a, 0x99, 0x66, 0xaa, 0x65, 0xa9, 0x99,
    0x00, 0x55, 0xa5, 0xa5, 0x65, 0x69, 0x59, 0x56, 0x65, 0x81, 0x4c, 0x60, 0x2c, 0xbc, 0x03,
    0x90, 0xfe, 0x31, 0xfd, 0x5f, 0x01, 0x18, 0x50, 0xff, 0x7b, 0x55, 0xaa, 0xa6, 0x95, 0x66,
    0x95, 0x5a, 0x00, 0x56, 0x55, 0x96, 0xaa, 0x65, 0x9a, 0x5a, 0x96, 0xa1, 0x15, 0x54, 0x4a,
    0x2b, 0x7a, 0xb4, 0xa3, 0x65, 0xb0, 0x6e, 0xe5, 0x53, 0x03, 0xd9, 0x0d, 0x9c, 0x15, 0x61,
    0xea, 0x80, 0xea, 0x7e, 0xea, 0x94, 0x17, 0x7e, 0xef, 0x00, 0x00, 0x41, 0x17, 0x7e, 0x15,
};

/* The input of the golden blocks (scratch generator: kt_randf from seed
 * 2025, every element 7 of a sub-block six times larger, sub-block 6
 * scaled by 1e-3). */
static void golden_input(float *x) {
    uint64_t s = 2025;
    for (int i = 0; i < 256; i++) {
        x[i] = kt_randf(&s);
        if (i % 32 == 7)
            x[i] *= 6.0f;
        if (i >= 192 && i < 224)
            x[i] *= 0.001f;
    }
}

static void expect_golden(enum kern_wtype t, const uint8_t *want) {
    float x[256];
    uint8_t got[210];
    golden_input(x);
    if (t == KERN_W_Q2_K)
        kern_quantize_row_q2_K(x, got, 256);
    else if (t == KERN_W_Q3_K)
        kern_quantize_row_q3_K(x, got, 256);
    else if (t == KERN_W_Q4_K)
        kern_quantize_row_q4_K(x, got, 256);
    else if (t == KERN_W_Q5_K)
        kern_quantize_row_q5_K(x, got, 256);
    else
        kern_quantize_row_q6_K(x, got, 256);
    for (size_t i = 0; i < kq_block_bytes(t); i++)
        cr_assert_eq(got[i], want[i], "type %d byte %zu: %#04x, ggml wrote %#04x", t, i, got[i],
                     want[i]);
}

Test(kern_kquant, quantizers_write_ggml_reference_bytes) {
    expect_golden(KERN_W_Q2_K, golden_q2_K);
    expect_golden(KERN_W_Q3_K, golden_q3_K);
    expect_golden(KERN_W_Q4_K, golden_q4_K);
    expect_golden(KERN_W_Q5_K, golden_q5_K);
    expect_golden(KERN_W_Q6_K, golden_q6_K);
}

/* Q3_K's level search (make_q3_quants: up to five sweeps) converges in one
 * on golden_input, so one block does not pin it; nor does it pin Q2_K's
 * absolute-error search: 80 blocks of five distributions (uniform, cubed,
 * in [1, 2), every 16th element 9x, and each odd group of 16 the negation
 * of the one before it, so the largest scale ties with its negation) hash
 * to what ggml's quantize_row_q2_K_ref / q3_K_ref wrote for them (FNV-1a 64
 * over the 6720 or 8800 bytes; a Q3_K search stopped after one sweep, a
 * tie that takes the later group, or Q2_K's search with squared errors
 * changes it). Rarer paths (a fifth sweep that moves a level) are pinned by
 * test_model_kquant's whole-file hashes. */
static uint64_t kq_quant_hash(enum kern_wtype t) {
    enum { N = 4096 };
    static float x[N];
    static uint8_t q[N / 256 * 110];
    uint64_t h = KT_FNV_BASIS;
    for (int mode = 0; mode < 5; mode++) {
        uint64_t s = 1000 + mode;
        for (int i = 0; i < N; i++) {
            float u = kt_randf(&s);
            x[i] = mode == 0   ? u
                   : mode == 1 ? u * u * u
                   : mode == 2 ? fabsf(u) + 1
                   : mode == 3 ? (i % 16 == 5 ? 9 * u : u)
                               : ((i / 16) % 2 ? -x[i - 16] : u);
        }
        if (t == KERN_W_Q2_K)
            kern_quantize_row_q2_K(x, q, N);
        else
            kern_quantize_row_q3_K(x, q, N);
        h = kt_fnv1a(h, q, kern_row_bytes(t, N));
    }
    return h;
}

Test(kern_kquant, q2_K_q3_K_quantizers_match_ggml_over_many_blocks) {
    uint64_t h2 = kq_quant_hash(KERN_W_Q2_K), h3 = kq_quant_hash(KERN_W_Q3_K);
    cr_assert_eq(h2, 0x821bc9586659b3e3ull, "q2_K FNV-1a %#018llx", (unsigned long long)h2);
    cr_assert_eq(h3, 0x74f60e495c7e229aull, "q3_K FNV-1a %#018llx", (unsigned long long)h3);
}

/* Quantize -> dequantize on rows of four distributions (uniform, cubed,
 * all positive in [1, 2), uniform x 0.05). Measured worst relative RMS
 * errors 0.363 / 0.141 / 0.072 / 0.038 / 0.017 for Q2_K / Q3_K / Q4_K /
 * Q5_K / Q6_K (the cubed rows), bounds 1.3 times that; the largest element
 * error is at most 1.6 steps of the row's range (range / levels; Q3_K's
 * symmetric 8 levels are 7 steps), bound 2. (Rows much smaller than ~1e-3
 * lose more: d and dmin become f16 subnormals, in ggml as here.) */
Test(kern_kquant, quantizers_round_trip_within_bounds) {
    static const enum kern_wtype types[5] = {KERN_W_Q2_K, KERN_W_Q3_K, KERN_W_Q4_K, KERN_W_Q5_K,
                                             KERN_W_Q6_K};
    static const double rel_rms[5] = {0.47, 0.184, 0.095, 0.05, 0.022};
    static const double levels[5] = {3, 7, 15, 31, 32};
    enum { N = 1024 };
    static float x[N], y[N];
    for (int ti = 0; ti < 5; ti++)
        for (int mode = 0; mode < 4; mode++) {
            uint64_t s = 77 + mode;
            for (int i = 0; i < N; i++) {
                float u = kt_randf(&s);
                x[i] = mode == 0 ? u : mode == 1 ? u * u * u : mode == 2 ? fabsf(u) + 1 : u * 0.05f;
            }
            void *w = kt_make_w(types[ti], x, N, 1);
            kern_dequant_row(types[ti], w, y, N);
            mem_free(w);
            double e2 = 0, x2 = 0, emax = 0, amax = 0;
            for (int i = 0; i < N; i++) {
                e2 += (double)(y[i] - x[i]) * (y[i] - x[i]);
                x2 += (double)x[i] * x[i];
                emax = fmax(emax, fabs(y[i] - x[i]));
                amax = fmax(amax, fabs(x[i]));
            }
            double rel = sqrt(e2 / x2);
            cr_assert(rel <= rel_rms[ti], "type %d mode %d: relative rms error %.4f > %.4f",
                      types[ti], mode, rel, rel_rms[ti]);
            /* a coarse per-element bound: a step of the whole row's range */
            cr_assert(emax <= 2 * amax / levels[ti], "type %d mode %d: max error %g (amax %g)",
                      types[ti], mode, emax, amax);
        }
    /* an all-zero row stays zero */
    memset(x, 0, sizeof(x));
    for (int ti = 0; ti < 5; ti++) {
        void *w = kt_make_w(types[ti], x, N, 1);
        kern_dequant_row(types[ti], w, y, N);
        mem_free(w);
        for (int i = 0; i < N; i++)
            cr_assert_eq(y[i], 0.0f, "type %d zero row element %d", types[ti], i);
    }
}

/* Q8_K by hand: max = -4 (the largest magnitude is negative), so iscale =
 * -127 / -4 = 31.75 and d = 1 / 31.75; q rounds half to even. */
Test(kern_kquant, q8_K_follows_ggml_reference) {
    float x[256];
    for (int j = 0; j < 256; j++)
        x[j] = (float)((j % 32) - 16) / 4.0f * (j < 32 ? 1.0f : 0.5f); /* -4 .. 3.75 */
    struct kern_blk_q8_K b;
    kern_quantize_row_q8_K(x, &b, 256);
    cr_assert_eq(b.d, 1.0f / 31.75f, "d %.9g", b.d);
    for (int j = 0; j < 256; j++) {
        float v = 31.75f * x[j];
        int want = (int)rintf(v); /* the default rounding mode: half to even */
        if (want > 127)
            want = 127;
        cr_assert_eq(b.qs[j], want, "qs[%d] = %d want %d (%.4f)", j, b.qs[j], want, v);
    }
    cr_assert_eq(b.qs[0], -127);
    cr_assert_eq(b.qs[2], -111); /* -3.5 * 31.75 = -111.125 */
    for (int g = 0; g < 16; g++) {
        int s = 0;
        for (int i = 0; i < 16; i++)
            s += b.qs[16 * g + i];
        cr_assert_eq(b.bsums[g], s, "bsums[%d]", g);
    }
    /* largest magnitude positive: iscale negative, so q has the other sign */
    for (int j = 0; j < 256; j++)
        x[j] = j == 9 ? 2.0f : 0.5f;
    kern_quantize_row_q8_K(x, &b, 256);
    cr_assert_eq(b.d, -2.0f / 127.0f);
    cr_assert_eq(b.qs[9], -127);
    cr_assert_eq(b.qs[0], -32); /* -31.75 */
    memset(x, 0, sizeof(x));
    kern_quantize_row_q8_K(x, &b, 256);
    cr_assert(b.d == 0.0f && b.qs[5] == 0 && b.bsums[3] == 0);
}

/* The q8K activation row (kern_cpu_act_q8K: the values, d and the 32-sums)
 * is the same bytes at every level: the AVX2 quantizer against the
 * portable one, over blocks chosen to catch each step of the rule -- ties
 * of |x| with either sign first (the first one's sign wins), halves that
 * round to even, zeros and -0, a subnormal largest value (iscale infinite:
 * q = -2^22 whose low byte is 0), NaN and infinities, huge values, a single
 * nonzero value in the last lane -- plus random blocks. */
Test(kern_kquant, q8_K_activation_rows_match_at_every_level) {
    enum { NB = 14, N = NB * 256 };
    static float x[N];
    kt_fill(x, N, 77);
    for (int b = 0; b < NB; b++) {
        float *xb = x + 256 * b;
        for (int j = 0; j < 256; j++)
            switch (b) {
            case 1: /* -3 first, +3 later: max = -3 */
                xb[j] = j == 40 ? -3.0f : j == 200 ? 3.0f : xb[j];
                break;
            case 2: /* +3 first, -3 later in the same 8 lanes: max = +3 */
                xb[j] = j == 9 ? 3.0f : j == 12 ? -3.0f : xb[j];
                break;
            case 3: /* iscale 31.75: x = k / 127 gives q = k / 4, quarters and halves */
                xb[j] = j == 0 ? -4.0f : (float)((j % 64) - 32) / 127.0f;
                break;
            case 4:
                xb[j] = j % 2 ? -0.0f : 0.0f;
                break;
            case 5:
                xb[j] *= 0x1p-140f; /* every value subnormal */
                break;
            case 6:
                xb[j] = j == 100 ? NAN : xb[j];
                break;
            case 7:
                xb[j] = j == 3 ? INFINITY : xb[j];
                break;
            case 8:
                xb[j] = j == 250 ? -INFINITY : j == 5 ? NAN : xb[j];
                break;
            case 9:
                xb[j] *= 0x1p+120f;
                break;
            case 10:
                xb[j] = j == 255 ? -1e-3f : 0.0f;
                break;
            case 11: /* a subnormal largest value, the rest zero or smaller */
                xb[j] = j == 17 ? 0x1p-130f : j % 3 ? 0x1p-140f : 0.0f;
                break;
            case 12:
                xb[j] = j == 0 ? NAN : 0.0f; /* amax 0: all zeros, d 0 */
                break;
            default:
                break;
            }
    }
    const size_t bytes = kern_cpu_act_q8K_bytes(N);
    static uint8_t want[N * 2], got[N * 2];
    cr_assert(bytes <= sizeof(want));
    kern_set_isa(KERN_ISA_SCALAR);
    memset(want, 0x5A, sizeof(want));
    kern_cpu_act_q8K(x, want, N);
    const float *wd = kern_cpu_act_q8K_d(want, N);
    const int8_t *wq = (const int8_t *)want;
    /* the first of |x| = 3 decides the sign: -127 / max maps it to -127 */
    cr_assert_eq(wd[1], 1.0f / (-127.0f / -3.0f), "block 1: d %a", (double)wd[1]);
    cr_assert(wq[256 + 40] == -127 && wq[256 + 200] == 127);
    cr_assert_eq(wd[2], 1.0f / (-127.0f / 3.0f), "block 2: d %a", (double)wd[2]);
    cr_assert(wq[512 + 9] == -127 && wq[512 + 12] == 127);
    cr_assert(wd[12] == 0.0f && wq[12 * 256] == 0);
    for (size_t ii = 1; ii < kt_n_isas(); ii++) {
        kern_set_isa(kt_isas[ii]);
        memset(got, 0x5A, sizeof(got));
        kern_cpu_act_q8K(x, got, N);
        for (size_t i = 0; i < bytes; i++)
            cr_assert_eq(got[i], want[i], "%s: byte %zu (block %zu of the values): %d, portable %d",
                         kern_isa_name(kt_isas[ii]), i, i < N ? i / 256 : (size_t)-1, got[i],
                         want[i]);
    }
    kern_set_isa(kern_isa_max());
}

Test(kern_kquant, row_bytes) {
    cr_assert_eq(kern_row_bytes(KERN_W_Q2_K, 768), 252u);
    cr_assert_eq(kern_row_bytes(KERN_W_Q2_K, 128), 0u);
    cr_assert_eq(kern_row_bytes(KERN_W_Q3_K, 512), 220u);
    cr_assert_eq(kern_row_bytes(KERN_W_Q3_K, 320), 0u);
    cr_assert_eq(kern_row_bytes(KERN_W_Q4_K, 256), 144u);
    cr_assert_eq(kern_row_bytes(KERN_W_Q5_K, 512), 352u);
    cr_assert_eq(kern_row_bytes(KERN_W_Q6_K, 768), 630u);
    cr_assert_eq(kern_row_bytes(KERN_W_Q4_K, 288), 0u);
    cr_assert_eq(kern_row_bytes(KERN_W_Q6_K, 32), 0u);
}

/* ---- dots ------------------------------------------------------------------ */

/* ggml's generic ggml_vec_dot_q*_K_q8_K order (lane e % 8; the mins from
 * bsums[16] x mins[j/2]; Q2_K one int per block), on ggml-format blocks. */
static float model_generic(enum kern_wtype t, const uint8_t *w, const struct kern_blk_q8_K *y,
                           int n) {
    float sums[8] = {0}, sumf = 0;
    if (t == KERN_W_Q2_K) { /* one int per block: sumf += dall isum - dmin summs */
        for (int b = 0; b < n / 256; b++) {
            struct kq_ints k;
            kq_decode(t, w + kq_block_bytes(t) * b, &k);
            int isum = 0, summs = 0;
            for (int e = 0; e < 256; e++)
                isum += k.sc[e] * (k.q[e] * y[b].qs[e]);
            for (int g = 0; g < 16; g++)
                summs += y[b].bsums[g] * k.mn[16 * g];
            const float dall = y[b].d * k.d, dmin = y[b].d * k.dmin;
            sumf += dall * isum - dmin * summs;
        }
        return sumf;
    }
    for (int b = 0; b < n / 256; b++) {
        struct kq_ints k;
        kq_decode(t, w + kq_block_bytes(t) * b, &k);
        int aux[8] = {0}, mins = 0;
        for (int e = 0; e < 256; e++)
            aux[e % 8] += k.sc[e] * (k.q[e] * y[b].qs[e]);
        for (int g = 0; g < 16; g++)
            mins += y[b].bsums[g] * k.mn[16 * g];
        const float d = k.d * y[b].d;
        for (int l = 0; l < 8; l++)
            sums[l] += d * aux[l];
        if (t == KERN_W_Q4_K || t == KERN_W_Q5_K) {
            const float dmin = k.dmin * y[b].d;
            sumf -= dmin * mins;
        }
    }
    for (int l = 0; l < 8; l++)
        sumf += sums[l];
    return sumf;
}

/* Y vs the double product of dequant(W) and dequant_q8K(X); the bound is
 * relative to the sum of the magnitudes the float sums see (the scaled
 * integer part and the mins separately): 8 lanes of n/256 fma steps plus a
 * fixed tree, well inside 2e-6 of it. Then the bit-exact models. */
static void check_case(enum kern_isa isa, enum kern_wtype t, int n_in, int n_out, int n_tok,
                       int n_threads) {
    kern_set_isa(isa);
    const int nb = n_in / 256;
    float *wf = mem_alloc(MEM_TEST, sizeof(float) * (size_t)n_in * n_out);
    float *x = mem_alloc(MEM_TEST, sizeof(float) * (size_t)n_in * n_tok);
    float *y = mem_alloc(MEM_TEST, sizeof(float) * (size_t)n_out * n_tok);
    struct kern_blk_q8_K *xq = mem_alloc(MEM_TEST, sizeof(*xq) * (size_t)nb * n_tok);
    kt_fill(wf, (size_t)n_in * n_out, 13 + n_in + n_out);
    kt_fill(x, (size_t)n_in * n_tok, 31 + n_tok);
    for (int i = 0; i < n_in * n_tok; i += 11)
        x[i] *= 7.0f;
    uint8_t *w = kt_make_w(t, wf, n_in, n_out);
    for (int k = 0; k < n_tok; k++)
        kern_quantize_row_q8_K(x + (size_t)k * n_in, xq + (size_t)k * nb, n_in);
    struct kern_pool *p = NULL;
    if (n_threads > 0)
        cr_assert_eq(kern_pool_create(n_threads, &p), 0);
    kern_matmul(p, y, x, w, t, n_in, n_out, n_tok);
    const size_t rb = kern_row_bytes(t, n_in);
    for (int r = 0; r < n_out; r++)
        for (int k = 0; k < n_tok; k++) {
            const uint8_t *wr = w + rb * r;
            const struct kern_blk_q8_K *yk = xq + (size_t)k * nb;
            double s = 0, a = 0;
            for (int b = 0; b < nb; b++) {
                struct kq_ints q;
                kq_decode(t, wr + kq_block_bytes(t) * b, &q);
                for (int e = 0; e < 256; e++) {
                    double xv = (double)yk[b].d * yk[b].qs[e];
                    double main = (double)q.d * q.sc[e] * q.q[e], off = (double)q.dmin * q.mn[e];
                    s += (main - off) * xv;
                    a += (fabs(main) + fabs(off)) * fabs(xv);
                }
            }
            const float got = y[(size_t)k * n_out + r];
            cr_assert(fabs(got - s) <= 2e-6 * a + 1e-30,
                      "isa %s type %d n_in %d n_out %d n_tok %d thr %d: y[%d][%d] = %.9g want "
                      "%.9g (sum|wx| %.3g)",
                      kern_isa_name(isa), t, n_in, n_out, n_tok, n_threads, k, r, got, s, a);
            const float want = isa == KERN_ISA_SCALAR ? model_generic(t, wr, yk, n_in)
                                                      : kq_model_level(isa, t, wr, yk, n_in);
            cr_assert_eq(got, want,
                         "isa %s type %d n_in %d n_out %d n_tok %d: y[%d][%d] = %.9g, the %s "
                         "order gives %.9g",
                         kern_isa_name(isa), t, n_in, n_out, n_tok, k, r, got,
                         isa == KERN_ISA_SCALAR ? "generic"
                         : kq_one_sum(isa, t)   ? "one-sum"
                                                : "AVX2",
                         want);
        }
    kern_pool_destroy(p);
    mem_free(w);
    mem_free(xq);
    mem_free(y);
    mem_free(x);
    mem_free(wf);
}

/* Rows not a multiple of any tile (1, 3, 7, 37), 1..9 tokens (every
 * prefill tile edge), one and five blocks per row, a pool of 2. */
static void check_type(enum kern_wtype t) {
    static const int n_outs[] = {1, 3, 7, 37};
    for (size_t ii = 0; ii < kt_n_isas(); ii++)
        for (int n_tok = 1; n_tok <= 9; n_tok++)
            for (size_t o = 0; o < sizeof(n_outs) / sizeof(n_outs[0]); o++) {
                check_case(kt_isas[ii], t, 256, n_outs[o], n_tok, 0);
                if (n_tok % 4 == 1)
                    check_case(kt_isas[ii], t, 1280, n_outs[o], n_tok, n_tok == 9 ? 2 : 0);
            }
}

Test(kern_kquant, q2_K_matmul_matches_references) {
    check_type(KERN_W_Q2_K);
}
Test(kern_kquant, q3_K_matmul_matches_references) {
    check_type(KERN_W_Q3_K);
}
Test(kern_kquant, q4_K_matmul_matches_references) {
    check_type(KERN_W_Q4_K);
}
Test(kern_kquant, q5_K_matmul_matches_references) {
    check_type(KERN_W_Q5_K);
}
Test(kern_kquant, q6_K_matmul_matches_references) {
    check_type(KERN_W_Q6_K);
}

/* Extremes: weights at the ends of their ranges (scales 63, every nibble
 * 15, Q6 levels -32 and 31, Q3 scales -32 and 31 with levels -4 and 3, Q2
 * scales, mins and levels at their largest)
 * against activations of +-127, so the int16 pair sums and int32 lanes are
 * at their largest. */
Test(kern_kquant, extreme_blocks_do_not_overflow) {
    enum { N = 512 };
    static float x[N], y[4];
    for (int i = 0; i < N; i++)
        x[i] = i % 2 ? -1.0f : 1.0f;
    for (int ti = 0; ti < 5; ti++) {
        enum kern_wtype t = ti == 0   ? KERN_W_Q4_K
                            : ti == 1 ? KERN_W_Q5_K
                            : ti == 2 ? KERN_W_Q6_K
                            : ti == 3 ? KERN_W_Q3_K
                                      : KERN_W_Q2_K;
        uint8_t w[2 * 210];
        memset(w, 0xFF, sizeof(w));
        if (t == KERN_W_Q2_K) {
            /* scales and mins 15, levels 3 in both blocks */
            for (int b = 0; b < 2; b++) {
                const uint16_t d[2] = {0x3c00, 0x3c00};
                memcpy(w + 84 * b + 80, d, 4);
            }
        } else if (t == KERN_W_Q3_K) {
            /* block 0 all ones: scales 31, levels 3; block 1 zeros: -32, -4 */
            memset(w + 110, 0x00, 108);
            for (int b = 0; b < 2; b++) {
                const uint16_t d = 0x3c00;
                memcpy(w + 110 * b + 108, &d, 2);
            }
        } else if (t == KERN_W_Q6_K) {
            for (int b = 0; b < 2; b++) {
                memset(w + 210 * b + 128, b ? 0x00 : 0xFF, 64); /* q 15 + 0 or 15 + 48 */
                memset(w + 210 * b + 192, b ? 0x80 : 0x7F, 16); /* scales -128, 127 */
                const uint16_t d = 0x3c00;
                memcpy(w + 210 * b + 208, &d, 2);
            }
        } else {
            for (int b = 0; b < 2; b++) {
                const uint16_t d[2] = {0x3c00, 0x3c00};
                memcpy(w + kq_block_bytes(t) * b, d, 4);
            }
        }
        struct kern_blk_q8_K xq[2];
        kern_quantize_row_q8_K(x, xq, N);
        for (size_t ii = 0; ii < kt_n_isas(); ii++) {
            kern_set_isa(kt_isas[ii]);
            kern_matmul(NULL, y, x, w, t, N, 1, 1);
            float want = kt_isas[ii] == KERN_ISA_SCALAR ? model_generic(t, w, xq, N)
                                                        : kq_model_level(kt_isas[ii], t, w, xq, N);
            cr_assert_eq(y[0], want, "type %d isa %s: %.9g vs %.9g", t, kern_isa_name(kt_isas[ii]),
                         y[0], want);
        }
    }
}
