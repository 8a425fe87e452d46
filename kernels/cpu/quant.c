/* quant.c - row sizes, ggml's reference quantizers, and row dequantization
 * (the K-quants' blocks are in quant_k.c, which this file calls).
 *
 * The quantizers follow ggml-quants.c quantize_row_q8_0_ref/q4_0_ref line by
 * line (same float expressions, same rounding), so the dummy-model writer
 * produces the bytes llama-quantize would, and kern_matmul's activation
 * quantization gives the integers ggml's reference gives. One departure: a
 * Q8_0 block whose scale is subnormal (amax below 127 x 2^-126) quantizes
 * to zeros, where ggml's 1 / d may be infinite and its int8 conversion
 * undefined; the f16 scale is 0 there either way, so the values are the
 * same. And a non-finite x (NaN, +-inf), whose int8 conversion is
 * undefined there, quantizes to -127 here: never -128, which the Q8_0
 * kernels' sign trick cannot negate, so every kernel and batch computes the
 * same (garbage) sum from it. kern_cpu_act_q8, the activation rows, runs
 * quant_avx2.c's copy of this rule at the AVX2 and AVX-VNNI levels and
 * quant_avx512.c's from AVX512 up (prefill quantizes 512 x 4096 floats a
 * matmul); the rest is scalar.
 */
#include "kernels/cpu/kern_cpu.h"

#include <math.h>
#include <string.h>

bool kern_wtype_ok(int t) {
    switch (t) {
    case KERN_W_F32:
    case KERN_W_F16:
    case KERN_W_BF16:
    case KERN_W_Q8_0:
    case KERN_W_Q4_0:
    case KERN_W_Q2_K:
    case KERN_W_Q3_K:
    case KERN_W_Q4_K:
    case KERN_W_Q5_K:
    case KERN_W_Q6_K:
        return true;
    }
    return false;
}

size_t kern_row_bytes(enum kern_wtype t, size_t n) {
    switch (t) {
    case KERN_W_F32:
        return n * 4;
    case KERN_W_F16:
    case KERN_W_BF16:
        return n * 2;
    case KERN_W_Q8_0:
        return n % KERN_QK ? 0 : n / KERN_QK * sizeof(struct kern_blk_q8_0);
    case KERN_W_Q4_0:
        return n % KERN_QK ? 0 : n / KERN_QK * sizeof(struct kern_blk_q4_0);
    case KERN_W_Q2_K:
        return n % KERN_QK_K ? 0 : n / KERN_QK_K * sizeof(struct kern_blk_q2_K);
    case KERN_W_Q3_K:
        return n % KERN_QK_K ? 0 : n / KERN_QK_K * sizeof(struct kern_blk_q3_K);
    case KERN_W_Q4_K:
        return n % KERN_QK_K ? 0 : n / KERN_QK_K * sizeof(struct kern_blk_q4_K);
    case KERN_W_Q5_K:
        return n % KERN_QK_K ? 0 : n / KERN_QK_K * sizeof(struct kern_blk_q5_K);
    case KERN_W_Q6_K:
        return n % KERN_QK_K ? 0 : n / KERN_QK_K * sizeof(struct kern_blk_q6_K);
    }
    return 0;
}

/* One Q8_0 block of x[32]: ggml's reference. Returns d as f16 bits. */
static uint16_t quant_q8_block(const float *x, int8_t *qs) {
    float amax = 0.0f;
    for (int j = 0; j < KERN_QK; j++)
        amax = fmaxf(amax, fabsf(x[j]));
    const float d = amax / ((1 << 7) - 1);
    const float id = kern_cpu_q8_0_iscale(d);
    for (int j = 0; j < KERN_QK; j++) {
        /* a finite x gives |r| <= 127; NaN and +-inf (undefined in the
         * reference's conversion) give -127, as quant_avx2.c's lanes do */
        const float r = roundf(x[j] * id);
        qs[j] = (int8_t)(r >= -127.0f && r <= 127.0f ? r : -127.0f);
    }
    return kern_f32_to_f16_1(d);
}

/* The Q8_0/Q4_0 rows below are read and written a byte at a time, the f16
 * d by memcpy: a KV row may start at any address (kern_kv_store), where a
 * struct access to d would be a misaligned load or store. */
void kern_quantize_row_q8_0(const float *x, void *dst, int n) {
    uint8_t *y = dst;
    for (int i = 0; i < n / KERN_QK; i++, y += sizeof(struct kern_blk_q8_0)) {
        const uint16_t d = quant_q8_block(x + i * KERN_QK, (int8_t *)(y + 2));
        memcpy(y, &d, sizeof d);
    }
}

void kern_cpu_act_q8(const float *x, void *dst, int n) {
    if (kern_isa() >= KERN_ISA_AVX512) {
        kern_cpu_act_q8_avx512(x, dst, n); /* the same bits, sixteen scales at a time */
        return;
    }
    if (kern_isa() >= KERN_ISA_AVX2) {
        kern_cpu_act_q8_avx2(x, dst, n); /* the same bits, vectorised */
        return;
    }
    int8_t *qs = dst;
    float *d = (float *)(qs + n);
    for (int i = 0; i < n / KERN_QK; i++)
        d[i] = kern_f16_to_f32_1(quant_q8_block(x + i * KERN_QK, qs + i * KERN_QK));
}

void kern_quantize_row_q4_0(const float *x, void *dst, int n) {
    uint8_t *y = dst;
    const int qk = KERN_QK;
    for (int i = 0; i < n / qk; i++, y += sizeof(struct kern_blk_q4_0)) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < qk; j++) {
            const float v = x[i * qk + j];
            if (amax < fabsf(v)) {
                amax = fabsf(v);
                max = v;
            }
        }
        const float d = max / -8;
        const float id = d ? 1.0f / d : 0.0f;
        const uint16_t dh = kern_f32_to_f16_1(d);
        memcpy(y, &dh, sizeof dh);
        for (int j = 0; j < qk / 2; j++) {
            const float x0 = x[i * qk + j] * id;
            const float x1 = x[i * qk + qk / 2 + j] * id;
            const int xi0 = (int8_t)(x0 + 8.5f) < 15 ? (int8_t)(x0 + 8.5f) : 15;
            const int xi1 = (int8_t)(x1 + 8.5f) < 15 ? (int8_t)(x1 + 8.5f) : 15;
            y[2 + j] = (uint8_t)((uint8_t)xi0 | (uint8_t)xi1 << 4);
        }
    }
}

void kern_dequant_row(enum kern_wtype t, const void *src, float *dst, int n) {
    switch (t) {
    case KERN_W_F32:
        memcpy(dst, src, (size_t)n * sizeof(float));
        return;
    case KERN_W_F16:
        kern_f16_to_f32(dst, src, n);
        return;
    case KERN_W_BF16: {
        const uint16_t *s = src;
        for (int i = 0; i < n; i++) {
            uint32_t u = (uint32_t)s[i] << 16;
            memcpy(&dst[i], &u, sizeof(u));
        }
        return;
    }
    case KERN_W_Q8_0: {
        const uint8_t *b = src;
        for (int i = 0; i < n / KERN_QK; i++, b += sizeof(struct kern_blk_q8_0)) {
            uint16_t dh;
            memcpy(&dh, b, sizeof dh);
            const float d = kern_f16_to_f32_1(dh);
            for (int j = 0; j < KERN_QK; j++)
                dst[i * KERN_QK + j] = (int8_t)b[2 + j] * d;
        }
        return;
    }
    case KERN_W_Q4_0: {
        const uint8_t *b = src;
        for (int i = 0; i < n / KERN_QK; i++, b += sizeof(struct kern_blk_q4_0)) {
            uint16_t dh;
            memcpy(&dh, b, sizeof dh);
            const float d = kern_f16_to_f32_1(dh);
            for (int j = 0; j < KERN_QK / 2; j++) {
                dst[i * KERN_QK + j] = ((b[2 + j] & 0x0F) - 8) * d;
                dst[i * KERN_QK + j + KERN_QK / 2] = ((b[2 + j] >> 4) - 8) * d;
            }
        }
        return;
    }
    case KERN_W_Q2_K:
        kern_cpu_dequant_q2_K(src, dst, n);
        return;
    case KERN_W_Q3_K:
        kern_cpu_dequant_q3_K(src, dst, n);
        return;
    case KERN_W_Q4_K:
        kern_cpu_dequant_q4_K(src, dst, n);
        return;
    case KERN_W_Q5_K:
        kern_cpu_dequant_q5_K(src, dst, n);
        return;
    case KERN_W_Q6_K:
        kern_cpu_dequant_q6_K(src, dst, n);
        return;
    }
}
