/* kern_util.h - helpers shared by the tests/test_kern_*.c binaries:
 * a deterministic RNG, weight rows in every kernel weight type, and the
 * ISA list. */
#ifndef LLMD_KERN_TEST_UTIL_H
#define LLMD_KERN_TEST_UTIL_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/kern.h"
#include "mem.h"

static inline uint64_t kt_rng_next(uint64_t *s) {
    /* splitmix64 */
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* uniform in [-1, 1) */
static inline float kt_randf(uint64_t *s) {
    return (float)((double)(kt_rng_next(s) >> 11) * (2.0 / 9007199254740992.0) - 1.0);
}

/* FNV-1a 64 of p[n] continued from h (start from KT_FNV_BASIS): the
 * checksums test data records. */
#define KT_FNV_BASIS 0xcbf29ce484222325ull
static inline uint64_t kt_fnv1a(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

static inline void kt_fill(float *x, size_t n, uint64_t seed) {
    uint64_t s = seed;
    for (size_t i = 0; i < n; i++)
        x[i] = kt_randf(&s);
}

static inline uint16_t kt_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16); /* RNE, finite inputs */
}

/* Weights W[n_out][n_in] from floats in type t; caller frees with mem_free. */
static inline void *kt_make_w(enum kern_wtype t, const float *wf, int n_in, int n_out) {
    size_t rb = kern_row_bytes(t, n_in);
    unsigned char *w = mem_alloc(MEM_TEST, rb * (size_t)n_out);
    for (int r = 0; r < n_out; r++) {
        const float *src = wf + (size_t)r * n_in;
        void *dst = w + rb * (size_t)r;
        switch (t) {
        case KERN_W_F32:
            memcpy(dst, src, rb);
            break;
        case KERN_W_F16:
            for (int i = 0; i < n_in; i++)
                ((uint16_t *)dst)[i] = kern_f32_to_f16_1(src[i]);
            break;
        case KERN_W_BF16:
            for (int i = 0; i < n_in; i++)
                ((uint16_t *)dst)[i] = kt_bf16(src[i]);
            break;
        case KERN_W_Q8_0:
            kern_quantize_row_q8_0(src, dst, n_in);
            break;
        case KERN_W_Q4_0:
            kern_quantize_row_q4_0(src, dst, n_in);
            break;
        case KERN_W_Q2_K:
            kern_quantize_row_q2_K(src, dst, n_in);
            break;
        case KERN_W_Q3_K:
            kern_quantize_row_q3_K(src, dst, n_in);
            break;
        case KERN_W_Q4_K:
            kern_quantize_row_q4_K(src, dst, n_in);
            break;
        case KERN_W_Q5_K:
            kern_quantize_row_q5_K(src, dst, n_in);
            break;
        case KERN_W_Q6_K:
            kern_quantize_row_q6_K(src, dst, n_in);
            break;
        }
    }
    return w;
}

static const enum kern_wtype kt_types[] = {KERN_W_F32,  KERN_W_F16,  KERN_W_BF16, KERN_W_Q8_0,
                                           KERN_W_Q4_0, KERN_W_Q2_K, KERN_W_Q3_K, KERN_W_Q4_K,
                                           KERN_W_Q5_K, KERN_W_Q6_K};
/* Every level, lowest first; the tests run the first kt_n_isas(): those
 * this machine has. */
static const enum kern_isa kt_isas[KERN_ISA_N] = {KERN_ISA_SCALAR, KERN_ISA_AVX2, KERN_ISA_AVX_VNNI,
                                                  KERN_ISA_AVX512, KERN_ISA_AMX};
static inline size_t kt_n_isas(void) {
    return (size_t)kern_isa_max() + 1;
}

/* Q8_0/Q4_0: 32-blocks, q8_0 activations. */
static inline int kt_is_quant(enum kern_wtype t) {
    return t == KERN_W_Q8_0 || t == KERN_W_Q4_0;
}

/* The K-quants: rows of 256-blocks, q8_K activations. */
static inline int kt_is_kquant(enum kern_wtype t) {
    return t == KERN_W_Q2_K || t == KERN_W_Q3_K || t == KERN_W_Q4_K || t == KERN_W_Q5_K ||
           t == KERN_W_Q6_K;
}

#endif /* LLMD_KERN_TEST_UTIL_H */
