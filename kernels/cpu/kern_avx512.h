/* kern_avx512.h - small AVX-512 helpers shared by the AVX512 and AMX
 * kernels (pack_avx512.c, pack_k_avx512.c, pack_amx.c, matmul_avx512.c,
 * quant_avx512.c, attention_avx512.c), and the level's target attribute. Include only from
 * files whose functions target avx512f and avx512bw: these inline into
 * them. */
#ifndef LLMD_KERN_AVX512_H
#define LLMD_KERN_AVX512_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "kernels/cpu/kern_cpu.h"

#define KERN_AVX512_AI __attribute__((target("avx512f,avx512bw"), always_inline)) inline

/* The features of the AVX512 level (kern_isa: F, VL, BW, DQ, VNNI, with
 * the AVX2 ones), for the functions of its kernel files. */
#define KERN_AVX512_TARGET                                                                         \
    __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512dq,avx512vnni")))

/* vpternlogd's (a & c) | b: with c the 0x0F bytes, a's low nibble under
 * b's high bits; every b the K kernels pass is masked to bit 4 or bits
 * 4..5, so it is zero where a goes and the result is the 5- or 6-bit
 * quant. */
#define KERN_AVX512_SEL 0xEC

/* The four bytes at p (int8 activations, or two int16 sums) in every
 * dword. */
static KERN_AVX512_AI __m512i kern_avx512_bcast4(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

/* a << s (s > 0) or a >> -s as 16-bit lanes; s is a constant once inlined. */
static KERN_AVX512_AI __m512i kern_avx512_sh16(__m512i a, const int s) {
    return s > 0   ? _mm512_slli_epi16(a, (unsigned)s)
           : s < 0 ? _mm512_srli_epi16(a, (unsigned)-s)
                   : a;
}

/* Q4_K/Q5_K mins of a K-pack record rp (pack_k.c): mn[i] the rows' min
 * pairs of sub-blocks 2i, 2i + 1 as int16, row l's in dword l. */
static KERN_AVX512_AI void kern_avx512_k_mins(const uint8_t *rp, __m512i mn[4]) {
    for (int i = 0; i < 4; i++)
        mn[i] = _mm512_cvtepu8_epi16(
            _mm256_loadu_si256((const __m256i *)(rp + KERN_PK_K45_MN + 32 * i)));
}

/* msum of every row for one token: the mins times the token's eight
 * 32-sums s (its q8K row's S, at the block), exact int32. */
static KERN_AVX512_AI __m512i kern_avx512_k_msum(const __m512i mn[4], const int16_t *s) {
    return _mm512_add_epi32(_mm512_add_epi32(_mm512_madd_epi16(mn[0], kern_avx512_bcast4(s)),
                                             _mm512_madd_epi16(mn[1], kern_avx512_bcast4(s + 2))),
                            _mm512_add_epi32(_mm512_madd_epi16(mn[2], kern_avx512_bcast4(s + 4)),
                                             _mm512_madd_epi16(mn[3], kern_avx512_bcast4(s + 6))));
}

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
