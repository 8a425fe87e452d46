/* matmul_k.c - the portable K-quant dots: one weight row (Q2_K, Q3_K, Q4_K,
 * Q5_K or Q6_K blocks) against one q8K act row (kern_cpu.h; Q2_K a q8K16
 * row).
 *
 * Q2_K follows ggml's generic ggml_vec_dot_q2_K_q8_K: per block one int
 * for the scaled products and one for the mins times the 16-sums, then
 * sumf += d_x f16(d_w) isum - d_x f16(dmin_w) summs. The others follow the
 * order of ggml's generic ggml_vec_dot_q3_K_q8_K /
 * q4_K_q8_K / q5_K_q8_K / q6_K_q8_K (ggml-cpu-quants.c, the #else branch; llama.cpp
 * c392e50), written from its definition: per 256-block, eight int32 lanes,
 * element e of the block in lane e % 8, each product scaled by its
 * sub-block's integer scale (exact integers, so any summation inside a
 * lane gives the same value); then, per block, sums[l] += d * lane[l] with
 * d = f16(d_w) * d_x; for Q4_K/Q5_K the mins go in one int per block,
 * sumf -= f16(dmin_w) * d_x * mins (the product first); after the last
 * block sumf += sums[0], ..., sums[7]. ISO C: nothing is fused into an
 * fma (ggml's own generic build may contract these with -march=native; on
 * x86 it never runs them, it has AVX2). kern_matmul calls these from its
 * portable rect; the order depends only on n, which keeps it batch
 * invariant.
 */
#include "kernels/cpu/kern_cpu.h"

#define QK KERN_QK_K

/* lane[l] += sc * sum over the 32 elements 32j + 8c + l (c = 0..3) of
 * a * q8: one sub-block of 32 into the 8 lanes of ggml's generic order. */
static inline void dot_sub32(int32_t *lane, int sc, const int8_t *a, const int8_t *q8) {
    int32_t s[8] = {0};
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 8; l++)
            s[l] += a[8 * c + l] * q8[8 * c + l];
    for (int l = 0; l < 8; l++)
        lane[l] += sc * s[l];
}

/* lane[l] += sc[g] * (the products of elements 16g + l and 16g + 8 + l),
 * g = 0..15: a block of 16 groups of 16 with a signed scale each (Q3_K,
 * Q6_K) into the 8 lanes of ggml's generic order. */
static inline void dot_g16(int32_t *lane, const int8_t *a, const int8_t *q8, const int *sc) {
    for (int g = 0; g < QK / 16; g++)
        for (int l = 0; l < 8; l++)
            lane[l] +=
                sc[g] * (a[16 * g + l] * q8[16 * g + l] + a[16 * g + 8 + l] * q8[16 * g + 8 + l]);
}

/* The end of ggml's generic K dots: sums[l] += d * lane[l], d = d_w * d_x. */
static inline void dot_scale(float *sums, float d, const int32_t *lane) {
    for (int l = 0; l < 8; l++)
        sums[l] += d * lane[l];
}

/* The Q4_K/Q5_K dot; qh is NULL for Q4_K. The block's fields are at the
 * same offsets in both but qs, which the caller passes. */
static float dot_k45(const struct kern_blk_q4_K *x4, size_t stride, const uint8_t *qs0,
                     const uint8_t *qh0, const void *act, int n) {
    const int8_t *q8 = act;
    const float *yd = kern_cpu_act_q8K_d(act, n);
    const int16_t *s32 = kern_cpu_act_q8K_s32(act, n);
    float sums[8] = {0}, sumf = 0;
    for (int b = 0; b < n / QK; b++, q8 += QK) {
        const struct kern_blk_q4_K *x =
            (const struct kern_blk_q4_K *)((const char *)x4 + stride * b);
        const uint8_t *qs = qs0 + stride * b, *qh = qh0 ? qh0 + stride * b : NULL;
        int8_t a[QK];
        for (int k = 0; k < QK / 64; k++)
            for (int l = 0; l < 32; l++) {
                a[64 * k + l] = (int8_t)(qs[32 * k + l] & 0xF);
                a[64 * k + 32 + l] = (int8_t)(qs[32 * k + l] >> 4);
                if (qh) {
                    a[64 * k + l] += (int8_t)(((qh[l] >> (2 * k)) & 1) << 4);
                    a[64 * k + 32 + l] += (int8_t)(((qh[l] >> (2 * k + 1)) & 1) << 4);
                }
            }
        int32_t lane[8] = {0};
        int mins = 0;
        for (int j = 0; j < QK / 32; j++) {
            int sc, m;
            kern_cpu_scale_min_k4(x->scales, j, &sc, &m);
            dot_sub32(lane, sc, a + 32 * j, q8 + 32 * j);
            mins += m * s32[8 * b + j];
        }
        dot_scale(sums, kern_f16_to_f32_1(x->d) * yd[b], lane);
        const float dmin = kern_f16_to_f32_1(x->dmin) * yd[b];
        sumf -= dmin * mins;
    }
    for (int l = 0; l < 8; l++)
        sumf += sums[l];
    return sumf;
}

float kern_cpu_dot_q2_K(const void *w, const void *act, int n) {
    const struct kern_blk_q2_K *x = w;
    const int8_t *q8 = act;
    const float *yd = kern_cpu_act_q8K_d(act, n);
    const int16_t *s16 = kern_cpu_act_q8K_s16(act, n);
    float sumf = 0;
    for (int b = 0; b < n / QK; b++, q8 += QK) {
        int summs = 0, isum = 0;
        for (int g = 0; g < QK / 16; g++) {
            summs += s16[16 * b + g] * (x[b].scales[g] >> 4);
            int s = 0;
            for (int i = 0; i < 16; i++)
                s += q8[16 * g + i] * kern_cpu_q2_bits(x[b].qs, 16 * g + i);
            isum += (x[b].scales[g] & 0xF) * s;
        }
        const float dall = yd[b] * kern_f16_to_f32_1(x[b].d);
        const float dmin = yd[b] * kern_f16_to_f32_1(x[b].dmin);
        sumf += dall * isum - dmin * summs;
    }
    return sumf;
}

float kern_cpu_dot_q3_K(const void *w, const void *act, int n) {
    const struct kern_blk_q3_K *x = w;
    const int8_t *q8 = act;
    const float *yd = kern_cpu_act_q8K_d(act, n);
    float sums[8] = {0}, sumf = 0;
    for (int b = 0; b < n / QK; b++, q8 += QK) {
        int8_t a[QK];
        for (int e = 0; e < QK; e++)
            a[e] = (int8_t)(kern_cpu_q2_bits(x[b].qs, e) -
                            ((x[b].hmask[e % 32] >> (e / 32)) & 1 ? 0 : 4));
        int sc[QK / 16];
        for (int g = 0; g < QK / 16; g++)
            sc[g] = kern_cpu_scale_q3_K(x[b].scales, g);
        int32_t lane[8] = {0};
        dot_g16(lane, a, q8, sc);
        dot_scale(sums, kern_f16_to_f32_1(x[b].d) * yd[b], lane);
    }
    for (int l = 0; l < 8; l++)
        sumf += sums[l];
    return sumf;
}

float kern_cpu_dot_q4_K(const void *w, const void *act, int n) {
    const struct kern_blk_q4_K *x = w;
    return dot_k45(x, sizeof(*x), x->qs, NULL, act, n);
}

float kern_cpu_dot_q5_K(const void *w, const void *act, int n) {
    const struct kern_blk_q5_K *x = w;
    return dot_k45((const struct kern_blk_q4_K *)w, sizeof(*x), x->qs, x->qh, act, n);
}

float kern_cpu_dot_q6_K(const void *w, const void *act, int n) {
    const struct kern_blk_q6_K *x = w;
    const int8_t *q8 = act;
    const float *yd = kern_cpu_act_q8K_d(act, n);
    float sums[8] = {0}, sumf = 0;
    for (int b = 0; b < n / QK; b++, q8 += QK) {
        int8_t a[QK];
        for (int h = 0; h < QK / 128; h++) {
            const uint8_t *ql = x[b].ql + 64 * h, *qh = x[b].qh + 32 * h;
            int8_t *ah = a + 128 * h;
            for (int l = 0; l < 32; l++) {
                ah[l] = (int8_t)(((ql[l] & 0xF) | ((qh[l] & 3) << 4)) - 32);
                ah[l + 32] = (int8_t)(((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
                ah[l + 64] = (int8_t)(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
                ah[l + 96] = (int8_t)(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
            }
        }
        int sc[QK / 16];
        for (int g = 0; g < QK / 16; g++)
            sc[g] = x[b].scales[g];
        int32_t lane[8] = {0};
        dot_g16(lane, a, q8, sc);
        dot_scale(sums, kern_f16_to_f32_1(x[b].d) * yd[b], lane);
    }
    for (int l = 0; l < 8; l++)
        sumf += sums[l];
    return sumf;
}
