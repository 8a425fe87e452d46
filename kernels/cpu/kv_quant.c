/* kv_quant.c - KV rows in every cache type: sizes, the store that quantizes
 * a row as it is written, the load that reads it back, and the Hadamard
 * rotation of the Q4_0 cache (layouts and sources in kern.h).
 *
 * A row is one token's K or V of one layer, [n_kv_head][head_dim]. The block
 * types (Q8_0, Q4_0) cut the whole row into 32-element blocks regardless of
 * head boundaries, so any head_dim works: stories260K's head_dim of 8 puts
 * four heads in one block (one scale for the four), a head_dim of 20 puts a
 * head across two. The cost of sharing a scale across heads is precision
 * when their magnitudes differ; the alternative, blocks per head padded to
 * 32, would store 4x the bytes at head_dim 8 and defeat the purpose.
 *
 * The store is scalar: one decode step writes n_layer * 2 rows of
 * n_kv_head * head_dim values a token (dummy-100m: 12 rows of 256), next to
 * matmuls that read megabytes; the quantizer is ggml's reference rule, so
 * the integers are the ones llama.cpp's reference quantizer would write.
 */
#include "kernels/cpu/kern_cpu.h"

#include <assert.h>
#include <math.h>
#include <string.h>

size_t kern_kv_row_bytes(enum kern_kv_type t, int n_kv_head, int head_dim) {
    if (n_kv_head <= 0 || head_dim <= 0)
        return 0;
    const size_t n = (size_t)n_kv_head * (size_t)head_dim, nb = (n + KERN_QK - 1) / KERN_QK;
    switch (t) {
    case KERN_KV_F32:
        return n * 4;
    case KERN_KV_F16:
        return n * 2;
    case KERN_KV_Q8_0:
        return nb * sizeof(struct kern_blk_q8_0);
    case KERN_KV_Q4_0:
        return nb * sizeof(struct kern_blk_q4_0);
    case KERN_KV_FP8:
        return (size_t)n_kv_head * kern_cpu_fp8_head_bytes(head_dim);
    case KERN_KV_N:
        break;
    }
    return 0;
}

int kern_kv_rot_block(int head_dim) {
    int b = head_dim & -head_dim; /* lowest set bit: the largest power of two dividing it */
    return b > 256 ? 256 : b;
}

/* Sylvester-order fast Walsh-Hadamard transform of x[n], n a power of two,
 * then the 1/sqrt(n) that makes it orthonormal (H = H^T = H^-1). */
static void kv_fwht(float *x, int n) {
    for (int len = 1; len < n; len <<= 1)
        for (int i = 0; i < n; i += len << 1)
            for (int j = i; j < i + len; j++) {
                const float a = x[j], b = x[j + len];
                x[j] = a + b;
                x[j + len] = a - b;
            }
    const float s = (float)(1.0 / sqrt((double)n));
    for (int i = 0; i < n; i++)
        x[i] *= s;
}

void kern_kv_rotate(float *x, int n_head, int head_dim) {
    const int b = kern_kv_rot_block(head_dim);
    if (b <= 1)
        return;
    for (size_t i = 0; i < (size_t)n_head * (size_t)head_dim; i += (size_t)b)
        kv_fwht(x + i, b);
}

uint8_t kern_cpu_fp8_from_f32(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    const uint8_t sign = (uint8_t)((u >> 24) & 0x80);
    u &= 0x7FFFFFFFu;
    if (u > 0x43E00000u) /* above 448, or NaN: the largest finite value */
        return sign | 0x7E;
    if (u < 0x3C800000u) { /* below 2^-6: subnormal, steps of 2^-9 (8 may round up to 2^-6) */
        float a;
        memcpy(&a, &u, sizeof a);
        return sign | (uint8_t)lrintf(a * 512.0f); /* the default rounding: to nearest even */
    }
    /* normal: keep 3 mantissa bits, rounding to nearest even at bit 20 */
    u += 0x7FFFFu + ((u >> 20) & 1);
    const int e = (int)(u >> 23) - 127 + 7;
    const uint32_t m = (u >> 20) & 7;
    if (e > 15 || (e == 15 && m == 7))
        return sign | 0x7E;
    return sign | (uint8_t)((uint32_t)e << 3 | m);
}

/* F16 rows at any address (kern.h): kern_f32_to_f16 and kern_f16_to_f32
 * take uint16_t pointers, so an odd address goes through a stack chunk. */
static void kv_store_f16(void *dst, const float *src, int n) {
    if ((uintptr_t)dst % sizeof(uint16_t) == 0) {
        kern_f32_to_f16(dst, src, n);
        return;
    }
    uint16_t h[256];
    for (int i = 0; i < n; i += 256) {
        const int k = n - i < 256 ? n - i : 256;
        kern_f32_to_f16(h, src + i, k);
        memcpy((unsigned char *)dst + (size_t)i * sizeof h[0], h, (size_t)k * sizeof h[0]);
    }
}

static void kv_load_f16(float *dst, const void *src, int n) {
    if ((uintptr_t)src % sizeof(uint16_t) == 0) {
        kern_f16_to_f32(dst, src, n);
        return;
    }
    uint16_t h[256];
    for (int i = 0; i < n; i += 256) {
        const int k = n - i < 256 ? n - i : 256;
        memcpy(h, (const unsigned char *)src + (size_t)i * sizeof h[0], (size_t)k * sizeof h[0]);
        kern_f16_to_f32(dst + i, h, k);
    }
}

/* Quantize the row x[n] (n = n_kv_head * head_dim) into 32-element blocks,
 * the last one zero-padded. */
static void kv_store_blocks(void *dst, const float *x, size_t n, enum kern_kv_type t) {
    const size_t full = n / KERN_QK * KERN_QK;
    const size_t bsz =
        t == KERN_KV_Q8_0 ? sizeof(struct kern_blk_q8_0) : sizeof(struct kern_blk_q4_0);
    unsigned char *d = dst;
    if (full) {
        if (t == KERN_KV_Q8_0)
            kern_quantize_row_q8_0(x, d, (int)full);
        else
            kern_quantize_row_q4_0(x, d, (int)full);
    }
    if (full < n) {
        float tail[KERN_QK] = {0};
        memcpy(tail, x + full, (n - full) * sizeof(float));
        if (t == KERN_KV_Q8_0)
            kern_quantize_row_q8_0(tail, d + full / KERN_QK * bsz, KERN_QK);
        else
            kern_quantize_row_q4_0(tail, d + full / KERN_QK * bsz, KERN_QK);
    }
}

/* Q4_0: each head rotated into a stage, full blocks quantized as soon as
 * the stage holds them (the same bytes as rotating the whole row first:
 * blocks are quantized independently), the last block zero-padded. The
 * stage holds less than one block plus one head. */
static void kv_store_q4_rot(unsigned char *d, const float *src, int n_kv_head, int head_dim) {
    float stage[KERN_ATT_MAX_HEAD_DIM + KERN_QK];
    size_t n_st = 0;
    for (int h = 0; h < n_kv_head; h++) {
        memcpy(stage + n_st, src + (size_t)h * (size_t)head_dim, (size_t)head_dim * sizeof(float));
        kern_kv_rotate(stage + n_st, 1, head_dim);
        n_st += (size_t)head_dim;
        const size_t full = n_st / KERN_QK * KERN_QK;
        if (full) {
            kern_quantize_row_q4_0(stage, d, (int)full);
            d += full / KERN_QK * sizeof(struct kern_blk_q4_0);
            memmove(stage, stage + full, (n_st - full) * sizeof(float));
            n_st -= full;
        }
    }
    if (n_st)
        kv_store_blocks(d, stage, n_st, KERN_KV_Q4_0);
}

/* FP8: per head s = amax / 448 (f32), then e4m3(x * (1/s)), as ggml's
 * Q8_0 rule multiplies by the inverse scale; an all-zero head is s = 0. */
static void kv_store_fp8(unsigned char *d, const float *src, int n_kv_head, int head_dim) {
    for (int h = 0; h < n_kv_head; h++, d += kern_cpu_fp8_head_bytes(head_dim)) {
        const float *x = src + (size_t)h * (size_t)head_dim;
        float amax = 0.0f;
        for (int e = 0; e < head_dim; e++)
            amax = fmaxf(amax, fabsf(x[e]));
        const float s = amax / KERN_FP8_MAX, is = s ? 1.0f / s : 0.0f;
        memcpy(d, &s, sizeof s);
        for (int e = 0; e < head_dim; e++)
            d[4 + e] = kern_cpu_fp8_from_f32(x[e] * is);
    }
}

void kern_kv_store(void *dst, const float *src, int n_kv_head, int head_dim, enum kern_kv_type t) {
    assert(n_kv_head > 0 && head_dim > 0 && head_dim <= KERN_ATT_MAX_HEAD_DIM);
    const int n = n_kv_head * head_dim;
    switch (t) {
    case KERN_KV_F32:
        memcpy(dst, src, (size_t)n * sizeof(float));
        return;
    case KERN_KV_F16:
        kv_store_f16(dst, src, n);
        return;
    case KERN_KV_Q8_0:
        kv_store_blocks(dst, src, (size_t)n, t);
        return;
    case KERN_KV_Q4_0:
        kv_store_q4_rot(dst, src, n_kv_head, head_dim);
        return;
    case KERN_KV_FP8:
        kv_store_fp8(dst, src, n_kv_head, head_dim);
        return;
    case KERN_KV_N:
        break;
    }
    assert(!"kern_kv_store: unknown KV type");
}

void kern_kv_load(float *dst, const void *src, int n_kv_head, int head_dim, enum kern_kv_type t) {
    const int n = n_kv_head * head_dim;
    const unsigned char *s = src;
    switch (t) {
    case KERN_KV_F32:
        memcpy(dst, src, (size_t)n * sizeof(float));
        return;
    case KERN_KV_F16:
        kv_load_f16(dst, src, n);
        return;
    case KERN_KV_Q8_0:
    case KERN_KV_Q4_0: {
        const enum kern_wtype w = t == KERN_KV_Q8_0 ? KERN_W_Q8_0 : KERN_W_Q4_0;
        const size_t bsz = kern_row_bytes(w, KERN_QK);
        const int full = n / KERN_QK * KERN_QK;
        kern_dequant_row(w, s, dst, full);
        if (full < n) {
            float tail[KERN_QK];
            kern_dequant_row(w, s + (size_t)(full / KERN_QK) * bsz, tail, KERN_QK);
            memcpy(dst + full, tail, (size_t)(n - full) * sizeof(float));
        }
        if (t == KERN_KV_Q4_0)
            kern_kv_rotate(dst, n_kv_head, head_dim);
        return;
    }
    case KERN_KV_FP8:
        for (int h = 0; h < n_kv_head; h++, s += kern_cpu_fp8_head_bytes(head_dim)) {
            float sc;
            memcpy(&sc, s, sizeof sc);
            const float s256 = sc * 256.0f;
            for (int e = 0; e < head_dim; e++)
                dst[h * head_dim + e] = kern_f16_to_f32_1(kern_cpu_fp8_f16_bits(s[4 + e])) * s256;
        }
        return;
    case KERN_KV_N:
        break;
    }
    assert(!"kern_kv_load: unknown KV type");
}
