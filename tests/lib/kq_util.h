/* kq_util.h - the K-quant formats written out for the tests, independently
 * of kernels/cpu (tests/test_kern_kquant.c, test_kern_pack.c): a block's
 * integers, a model of ggml's AVX2 dot order, which the AVX2 and AVX-VNNI
 * levels' rows and packs reproduce bit for bit, and a model of the one-sum
 * order, which the AVX-512 and AMX levels' Q4_K/Q5_K/Q6_K rows and packs
 * reproduce (kernels/cpu/pack_k.c). */
#ifndef LLMD_KQ_TEST_UTIL_H
#define LLMD_KQ_TEST_UTIL_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/cpu/kern_cpu.h"

/* ---- the format, written out here ---------------------------------------- */

/* Integer view of one block: element e is d * sc[e] * q[e] - dmin * mn[e]
 * (Q6_K: q already minus 32, mn 0; Q3_K: q minus 4, sc minus 32, mn 0). Written from
 * ggml-common.h's comments and ggml-quants.c's dequantize_row_*, independently of quant_k.c. */
struct kq_ints {
    float d, dmin;
    int q[256], sc[256], mn[256];
};

static inline void kq_decode(enum kern_wtype t, const uint8_t *blk, struct kq_ints *o) {
    uint16_t h;
    memcpy(&h, t == KERN_W_Q6_K ? blk + 208 : t == KERN_W_Q3_K ? blk + 108 : blk, 2);
    o->d = kern_f16_to_f32_1(h);
    o->dmin = 0;
    if (t == KERN_W_Q2_K) {
        /* scales[16] (low nibble scale, high nibble min), qs[64], d, dmin
         * (ggml-common.h block_q2_K) */
        const uint8_t *s = blk, *qs = blk + 16;
        memcpy(&h, blk + 80, 2);
        o->d = kern_f16_to_f32_1(h);
        memcpy(&h, blk + 82, 2);
        o->dmin = kern_f16_to_f32_1(h);
        for (int e = 0; e < 256; e++) {
            int half = e / 128, quarter = (e % 128) / 32, l = e % 32;
            o->q[e] = (qs[32 * half + l] >> (2 * quarter)) & 3;
            o->sc[e] = s[e / 16] & 15;
            o->mn[e] = s[e / 16] >> 4;
        }
        return;
    }
    if (t == KERN_W_Q3_K) {
        /* hmask[32], qs[64], scales[12], d (ggml-common.h block_q3_K) */
        const uint8_t *hm = blk, *qs = blk + 32, *s = blk + 96;
        for (int e = 0; e < 256; e++) {
            int half = e / 128, quarter = (e % 128) / 32, l = e % 32, g = e / 16;
            int low2 = (qs[32 * half + l] >> (2 * quarter)) & 3;
            int high = (hm[l] >> (4 * half + quarter)) & 1;
            o->q[e] = (low2 | high << 2) - 4;
            int sc4 = g < 8 ? s[g] & 15 : s[g - 8] >> 4;
            o->sc[e] = (sc4 | ((s[8 + g % 4] >> (2 * (g / 4))) & 3) << 4) - 32;
            o->mn[e] = 0;
        }
        return;
    }
    if (t == KERN_W_Q6_K) {
        const uint8_t *ql = blk, *qh = blk + 128;
        const int8_t *sc = (const int8_t *)(blk + 192);
        for (int e = 0; e < 256; e++) {
            int half = e / 128, quarter = (e % 128) / 32, l = e % 32;
            uint8_t lo = ql[64 * half + 32 * (quarter % 2) + l];
            int low4 = quarter < 2 ? lo & 15 : lo >> 4;
            int high2 = (qh[32 * half + l] >> (2 * quarter)) & 3;
            o->q[e] = (low4 | high2 << 4) - 32;
            o->sc[e] = sc[e / 16];
            o->mn[e] = 0;
        }
        return;
    }
    memcpy(&h, blk + 2, 2);
    o->dmin = kern_f16_to_f32_1(h);
    const uint8_t *s = blk + 4;
    const uint8_t *qh = blk + 16, *qs = blk + (t == KERN_W_Q5_K ? 48 : 16);
    int scale[8], min[8];
    for (int j = 0; j < 4; j++) {
        scale[j] = s[j] & 63;
        min[j] = s[j + 4] & 63;
        scale[j + 4] = (s[j + 8] & 15) | (s[j] >> 6) << 4;
        min[j + 4] = (s[j + 8] >> 4) | (s[j + 4] >> 6) << 4;
    }
    for (int e = 0; e < 256; e++) {
        int j = e / 32, l = e % 32;
        uint8_t b = qs[32 * (j / 2) + l];
        o->q[e] = j % 2 ? b >> 4 : b & 15;
        if (t == KERN_W_Q5_K)
            o->q[e] += ((qh[l] >> j) & 1) * 16;
        o->sc[e] = scale[j];
        o->mn[e] = min[j];
    }
}

static inline size_t kq_block_bytes(enum kern_wtype t) {
    return t == KERN_W_Q2_K   ? 84
           : t == KERN_W_Q3_K ? 110
           : t == KERN_W_Q4_K ? 144
           : t == KERN_W_Q5_K ? 176
                              : 210;
}

/* ggml's AVX2 order: lane (e % 32) / 4 into one fma per block; Q4_K mins
 * in 4 lanes (sub-blocks 2m, 2m+1), Q5_K mins in one scalar fma, Q2_K mins
 * in 8 lanes (groups 2l, 2l+1 of 16) into the same accumulator, before the
 * block's products; Q3_K and Q6_K have none. */
static inline float kq_model_avx2(enum kern_wtype t, const uint8_t *w,
                                  const struct kern_blk_q8_K *y, int n) {
    float acc[8] = {0}, accm[4] = {0}, summ = 0;
    for (int b = 0; b < n / 256; b++) {
        struct kq_ints k;
        kq_decode(t, w + kq_block_bytes(t) * b, &k);
        int lane[8] = {0}, ml[4] = {0}, ml8[8] = {0};
        for (int e = 0; e < 256; e++)
            lane[(e % 32) / 4] += k.sc[e] * (k.q[e] * y[b].qs[e]);
        for (int g = 0; g < 16; g++) {
            ml[g / 4] += y[b].bsums[g] * k.mn[16 * g];
            ml8[g / 2] += y[b].bsums[g] * k.mn[16 * g];
        }
        const float d = y[b].d * k.d, dmin = -(y[b].d * k.dmin);
        if (t == KERN_W_Q2_K)
            for (int l = 0; l < 8; l++)
                acc[l] = fmaf(dmin, (float)ml8[l], acc[l]);
        for (int l = 0; l < 8; l++)
            acc[l] = fmaf(d, (float)lane[l], acc[l]);
        if (t == KERN_W_Q4_K)
            for (int m = 0; m < 4; m++)
                accm[m] = fmaf(dmin, (float)ml[m], accm[m]);
        else if (t == KERN_W_Q5_K)
            summ = fmaf(dmin, (float)(ml[0] + ml[1] + ml[2] + ml[3]), summ);
    }
    float v = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
    if (t == KERN_W_Q4_K)
        v += (accm[0] + accm[2]) + (accm[1] + accm[3]);
    else if (t == KERN_W_Q5_K)
        v += summ;
    return v;
}

/* The one-sum order (pack_k.c): per block the exact integers isum (every
 * element's sc q x) and msum (the mins times the 16-sums), then acc =
 * fmaf(d_x d_w, isum, acc) and, for Q4_K/Q5_K, acc = fmaf(-(d_x dmin),
 * msum, acc). Q4_K, Q5_K and Q6_K only. */
static inline float kq_model_one(enum kern_wtype t, const uint8_t *w, const struct kern_blk_q8_K *y,
                                 int n) {
    float acc = 0.0f;
    for (int b = 0; b < n / 256; b++) {
        struct kq_ints k;
        kq_decode(t, w + kq_block_bytes(t) * b, &k);
        int isum = 0, msum = 0;
        for (int e = 0; e < 256; e++)
            isum += k.sc[e] * (k.q[e] * y[b].qs[e]);
        for (int g = 0; g < 16; g++)
            msum += y[b].bsums[g] * k.mn[16 * g];
        acc = fmaf(y[b].d * k.d, (float)isum, acc);
        if (t == KERN_W_Q4_K || t == KERN_W_Q5_K)
            acc = fmaf(-(y[b].d * k.dmin), (float)msum, acc);
    }
    return acc;
}

/* Whether level isa runs type t in the one-sum order: Q4_K, Q5_K and Q6_K
 * from AVX-512 up (their rows and their packs); else ggml's orders. */
static inline bool kq_one_sum(enum kern_isa isa, enum kern_wtype t) {
    return isa >= KERN_ISA_AVX512 && (t == KERN_W_Q4_K || t == KERN_W_Q5_K || t == KERN_W_Q6_K);
}

/* The non-scalar levels' model: one-sum where kq_one_sum, else AVX2's. */
static inline float kq_model_level(enum kern_isa isa, enum kern_wtype t, const uint8_t *w,
                                   const struct kern_blk_q8_K *y, int n) {
    return kq_one_sum(isa, t) ? kq_model_one(t, w, y, n) : kq_model_avx2(t, w, y, n);
}

#endif /* LLMD_KQ_TEST_UTIL_H */
