/* kern_avx512.h - small AVX-512 helpers shared by the AVX512 and AMX pack
 * kernels (pack_k_avx512.c, pack_amx.c). Include only from files whose
 * functions target avx512f: these inline into them. */
#ifndef LLMD_KERN_AVX512_H
#define LLMD_KERN_AVX512_H

#include <immintrin.h>

#include "kernels/cpu/kern_cpu.h"

/* -(a b) lane by lane, the product and its negation kept opaque (see
 * kern_cpu_neg_prod: no compiler may fuse or move the negation). */
static __attribute__((target("avx512f"), always_inline)) inline __m512
kern_avx512_neg_prod(__m512 a, __m512 b) {
    __m512 p = _mm512_mul_ps(a, b);
    __asm__("" : "+v"(p));
    p = _mm512_castsi512_ps(
        _mm512_xor_si512(_mm512_castps_si512(p), _mm512_set1_epi32((int)0x80000000u)));
    __asm__("" : "+v"(p));
    return p;
}

#endif /* LLMD_KERN_AVX512_H */
