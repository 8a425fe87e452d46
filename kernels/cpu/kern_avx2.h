/* kern_avx2.h - small AVX2 helpers shared by the pack kernels and the
 * activation quantizers (pack_avx2.c, pack_k_avx2.c, quant_avx2.c). Include only from files whose
 * functions are marked KERN_AVX2 (kern_cpu.h): these inline into them. */
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

/* -(a b) lane by lane, the product and its negation kept opaque (see
 * kern_cpu_neg_prod: no compiler may fuse or move the negation). */
static KERN_AVX2 KERN_AVX2_AI __m256 kern_avx2_neg_prod(__m256 a, __m256 b) {
    __m256 p = _mm256_mul_ps(a, b);
    __asm__("" : "+x"(p));
    p = _mm256_xor_ps(p, _mm256_set1_ps(-0.0f));
    __asm__("" : "+x"(p));
    return p;
}

/* ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)): the AVX2 tree of 8
 * lane accumulators, 8 rows a vector (the rows kernels' hsum8 order). */
static KERN_AVX2 KERN_AVX2_AI __m256 kern_avx2_tree8(const __m256 *a) {
    return _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a[0], a[4]), _mm256_add_ps(a[2], a[6])),
                         _mm256_add_ps(_mm256_add_ps(a[1], a[5]), _mm256_add_ps(a[3], a[7])));
}

/* The largest of v's 8 lanes (vmaxps: where a lane is NaN, the other). */
static KERN_AVX2 KERN_AVX2_AI float kern_avx2_hmax8(__m256 v) {
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

#endif
