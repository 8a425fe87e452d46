/* f16.c - f16 <-> f32 conversion and the KV-cache store.
 *
 * The scalar conversion is bit-exact with F16C's vcvtps2ph under
 * round-to-nearest-even (overflow to inf, subnormals rounded, NaN kept quiet
 * with its top payload bits), so both ISAs store the same f16 bits; a test
 * checks that over all 2^16 halves and random floats.
 */
#include "kernels/cpu/kern_cpu.h"

#include <immintrin.h>
#include <string.h>

uint16_t kern_f32_to_f16_1(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof(x));
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t absx = x & 0x7fffffffu;
    if (absx > 0x7f800000u) /* NaN: quiet it, keep the top payload bits */
        return (uint16_t)(sign | 0x7e00u | ((absx >> 13) & 0x3ffu));
    if (absx >= 0x477ff000u) /* >= 65520 rounds to inf */
        return (uint16_t)(sign | 0x7c00u);
    if (absx < 0x38800000u) { /* below 2^-14: f16 subnormal or zero */
        if (absx < 0x33000000u)
            return (uint16_t)sign;
        uint32_t e = absx >> 23;
        uint32_t m = (absx & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - e; /* value in units of 2^-24 = m >> shift */
        uint32_t r = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1)))
            r++;
        return (uint16_t)(sign | r);
    }
    uint32_t h = ((absx >> 23) - 112) << 10 | ((absx >> 13) & 0x3ffu);
    uint32_t rem = absx & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1)))
        h++; /* a carry into the exponent is the right result */
    return (uint16_t)(sign | h);
}

float kern_f16_to_f32_1(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu;
    uint32_t m = h & 0x3ffu;
    uint32_t x;
    if (e == 0x1f) {
        x = sign | 0x7f800000u | (m << 13);
    } else if (e != 0) {
        x = sign | ((e + 112) << 23) | (m << 13);
    } else if (m == 0) {
        x = sign;
    } else { /* subnormal: normalize */
        e = 113;
        while (!(m & 0x400u)) {
            m <<= 1;
            e--;
        }
        x = sign | (e << 23) | ((m & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &x, sizeof(f));
    return f;
}

KERN_AVX2 void kern_cpu_f32_to_f16_avx2(uint16_t *dst, const float *src, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
        _mm_storeu_si128((__m128i *)(dst + i), h);
    }
    for (; i < n; i++)
        dst[i] = kern_f32_to_f16_1(src[i]);
}

KERN_AVX2 void kern_cpu_f16_to_f32_avx2(float *dst, const uint16_t *src, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    for (; i < n; i++)
        dst[i] = kern_f16_to_f32_1(src[i]);
}

void kern_f32_to_f16(uint16_t *dst, const float *src, int n) {
    if (kern_isa() >= KERN_ISA_AVX2) {
        kern_cpu_f32_to_f16_avx2(dst, src, n);
        return;
    }
    for (int i = 0; i < n; i++)
        dst[i] = kern_f32_to_f16_1(src[i]);
}

void kern_f16_to_f32(float *dst, const uint16_t *src, int n) {
    if (kern_isa() >= KERN_ISA_AVX2) {
        kern_cpu_f16_to_f32_avx2(dst, src, n);
        return;
    }
    for (int i = 0; i < n; i++)
        dst[i] = kern_f16_to_f32_1(src[i]);
}
