/* matmul_k.c - the portable K-quant dots: one weight row (Q4_K, Q5_K or
 * Q6_K blocks) against one q8K act row (kern_cpu.h).
 *
 * Each follows the order of ggml's generic ggml_vec_dot_q4_K_q8_K /
 * q5_K_q8_K / q6_K_q8_K (ggml-cpu-quants.c, the #else branch; llama.cpp
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

float kern_cpu_dot_q4_K(const void *w, const void *act, int n) {
    const struct kern_blk_q4_K *x = w;
    const int8_t *q8 = act;
    const float *yd = kern_cpu_act_q8K_d(act, n);
    const int16_t *s32 = kern_cpu_act_q8K_s32(act, n);
    float sums[8] = {0}, sumf = 0;
    for (int b = 0; b < n / QK; b++, q8 += QK) {
        int32_t lane[8] = {0};
        int mins = 0;
        for (int j = 0; j < QK / 32; j++) {
            int sc, m;
            kern_cpu_scale_min_k4(x[b].scales, j, &sc, &m);
            const uint8_t *q = x[b].qs + 32 * (j / 2);
            const int sh = (j & 1) * 4;
            for (int i = 0; i < 32; i++)
                lane[i % 8] += sc * (((q[i] >> sh) & 0xF) * q8[32 * j + i]);
            mins += m * s32[8 * b + j];
        }
        const float d = kern_f16_to_f32_1(x[b].d) * yd[b];
        for (int l = 0; l < 8; l++)
            sums[l] += d * lane[l];
        const float dmin = kern_f16_to_f32_1(x[b].dmin) * yd[b];
        sumf -= dmin * mins;
    }
    for (int l = 0; l < 8; l++)
        sumf += sums[l];
    return sumf;
}

float kern_cpu_dot_q5_K(const void *w, const void *act, int n) {
    const struct kern_blk_q5_K *x = w;
    const int8_t *q8 = act;
    const float *yd = kern_cpu_act_q8K_d(act, n);
    const int16_t *s32 = kern_cpu_act_q8K_s32(act, n);
    float sums[8] = {0}, sumf = 0;
    for (int b = 0; b < n / QK; b++, q8 += QK) {
        int32_t lane[8] = {0};
        int mins = 0;
        for (int j = 0; j < QK / 32; j++) {
            int sc, m;
            kern_cpu_scale_min_k4(x[b].scales, j, &sc, &m);
            const uint8_t *q = x[b].qs + 32 * (j / 2);
            const int sh = (j & 1) * 4;
            for (int i = 0; i < 32; i++) {
                const int v = ((q[i] >> sh) & 0xF) | (((x[b].qh[i] >> j) & 1) << 4);
                lane[i % 8] += sc * (v * q8[32 * j + i]);
            }
            mins += m * s32[8 * b + j];
        }
        const float d = kern_f16_to_f32_1(x[b].d) * yd[b];
        for (int l = 0; l < 8; l++)
            sums[l] += d * lane[l];
        const float dmin = kern_f16_to_f32_1(x[b].dmin) * yd[b];
        sumf -= dmin * mins;
    }
    for (int l = 0; l < 8; l++)
        sumf += sums[l];
    return sumf;
}

float kern_cpu_dot_q6_K(const void *w, const void *act, int n) {
    const struct kern_blk_q6_K *x = w;
    const int8_t *q8 = act;
    const float *yd = kern_cpu_act_q8K_d(act, n);
    float sums[8] = {0}, sumf = 0;
    for (int b = 0; b < n / QK; b++, q8 += QK) {
        int32_t lane[8] = {0};
        for (int h = 0; h < QK / 128; h++) {
            const uint8_t *ql = x[b].ql + 64 * h, *qh = x[b].qh + 32 * h;
            for (int r = 0; r < 4; r++) {
                const int e0 = 128 * h + 32 * r; /* 32 elements, 2 scale groups */
                for (int i = 0; i < 32; i++) {
                    const uint8_t lo = ql[32 * (r & 1) + i];
                    const int v =
                        ((r < 2 ? lo & 0xF : lo >> 4) | (((qh[i] >> (2 * r)) & 3) << 4)) - 32;
                    lane[i % 8] += x[b].scales[(e0 + i) / 16] * (v * q8[e0 + i]);
                }
            }
        }
        const float d = kern_f16_to_f32_1(x[b].d) * yd[b];
        for (int l = 0; l < 8; l++)
            sums[l] += d * lane[l];
    }
    for (int l = 0; l < 8; l++)
        sumf += sums[l];
    return sumf;
}
