/* kern_avx2.h - small AVX2 helpers shared by the pack kernels
 * (pack_avx2.c, pack_k_avx2.c). Include only from files whose functions
 * are marked KERN_AVX2 (kern_cpu.h): these inline into them. */
#ifndef LLMD_KERN_AVX2_H
#define LLMD_KERN_AVX2_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "kernels/cpu/kern_cpu.h"

#define KERN_AVX2_AI __attribute__((always_inline)) inline

/* The four bytes at p (a token's four int8 activations) in every dword. */
static KERN_AVX2 KERN_AVX2_AI __m256i kern_avx2_bcast4(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* Rows r0..r0+7 of one token's output row y: all 8, or the `left` that
 * exist (none when left <= 0: a group's padding half). */
static KERN_AVX2 KERN_AVX2_AI void kern_avx2_store8(float *y, int r0, int left, __m256 v) {
    if (left >= 8) {
        _mm256_storeu_ps(y + r0, v);
    } else if (left > 0) {
        float tmp[8];
        _mm256_storeu_ps(tmp, v);
        memcpy(y + r0, tmp, sizeof(float) * (size_t)left);
    }
}

#endif
