/* quant_avx512.c - AVX-512 quantization of activation rows to Q8_0, and the
 * packed kernels' group sums: the rules of kern_cpu_act_q8 (quant.c,
 * ggml's quantize_row_q8_0_ref) and kern_cpu_act_q8s (pack.c), with the
 * same bits.
 *
 * quant_avx2.c computes each block's scale in scalar code: a horizontal
 * maximum, two divisions and a software f16 round trip, about as long as
 * the block's 32 products. Here sixteen blocks' scales are one vector:
 * amax per block (its largest |x|: vmaxps with the running maximum as the
 * second operand, so a NaN never enters it, as in fmaxf; a maximum of
 * non-NaN values is the same in any order), d = amax / 127 and id = 1 / d
 * (0 where d < 2^-126) by vdivps, which rounds as the scalar division
 * does, and d's f16 round trip by vcvtps2ph / vcvtph2ps (round to nearest
 * even, overflow to infinity: kern_f32_to_f16_1's rule). Then q =
 * roundf(x * id) as quant_avx2.c builds it (truncate, then +-1 where the
 * remainder is at least a half), and vpmovsdb narrows with saturation (the
 * two packs of the AVX2 code, in one step); a non-finite x's own product
 * converts to INT32_MIN, saturates to -128 and a byte maximum lifts it to
 * -127, quant.c's rule.
 *
 * On the Xeon the AVX2 code and the scalar sums took 1.45-2.19 us for a
 * 1536-wide row, this 0.57-0.70 us; in a two-thread dummy-1g q4_0 decode,
 * which converts on the caller alone, 0.76% of the samples became 0.46%
 * (docs/benchmarks.md, "Decode: the activation's scales as vectors").
 */
#include "kernels/cpu/kern_avx512.h"
#include "kernels/cpu/kern_cpu.h"

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define QA_TARGET KERN_AVX512_TARGET

/* The 32 bytes of one block: q = roundf(x * id), non-finite products -127. */
static QA_TARGET inline void qa_block(const float *x, float id, int8_t *q) {
    const __m512 vid = _mm512_set1_ps(id), half = _mm512_set1_ps(0.5f);
    const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), sign = _mm512_set1_epi32(INT32_MIN);
    const __m512i one = _mm512_castps_si512(_mm512_set1_ps(1.0f));
    for (int k = 0; k < 2; k++) {
        const __m512 p = _mm512_mul_ps(_mm512_loadu_ps(x + 16 * k), vid);
        const __m512 t = _mm512_roundscale_ps(p, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
        const __m512 rem = _mm512_castsi512_ps(
            _mm512_and_si512(_mm512_castps_si512(_mm512_sub_ps(p, t)), abs_mask));
        const __mmask16 up = _mm512_cmp_ps_mask(rem, half, _CMP_GE_OQ);
        const __m512 step = _mm512_castsi512_ps(
            _mm512_or_si512(_mm512_and_si512(_mm512_castps_si512(p), sign), one)); /* +-1 */
        const __m512i v = _mm512_cvttps_epi32(_mm512_mask_add_ps(t, up, t, step));
        _mm_storeu_si128((__m128i *)(q + 16 * k),
                         _mm_max_epi8(_mm512_cvtsepi32_epi8(v), _mm_set1_epi8(-127)));
    }
}

QA_TARGET void kern_cpu_act_q8_avx512(const float *x, void *dst, int n) {
    int8_t *qs = dst;
    float *d = (float *)(qs + n);
    const int nb = n / KERN_QK;
    const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff);
    for (int b0 = 0; b0 < nb; b0 += 16) {
        const int m = nb - b0 < 16 ? nb - b0 : 16;
        _Alignas(64) float amax[16] = {0}, id[16];
        for (int k = 0; k < m; k++) {
            const float *xb = x + (size_t)(b0 + k) * KERN_QK;
            __m512 a = _mm512_max_ps(
                _mm512_castsi512_ps(_mm512_and_si512(_mm512_loadu_si512(xb), abs_mask)),
                _mm512_setzero_ps());
            a = _mm512_max_ps(
                _mm512_castsi512_ps(_mm512_and_si512(_mm512_loadu_si512(xb + 16), abs_mask)), a);
            amax[k] = _mm512_reduce_max_ps(a);
        }
        const __m512 dq = _mm512_div_ps(_mm512_load_ps(amax), _mm512_set1_ps((1 << 7) - 1));
        const __mmask16 normal = _mm512_cmp_ps_mask(dq, _mm512_set1_ps(0x1p-126f), _CMP_GE_OQ);
        _mm512_store_ps(id, _mm512_maskz_div_ps(normal, _mm512_set1_ps(1.0f), dq));
        const __m512 dr =
            _mm512_cvtph_ps(_mm512_cvtps_ph(dq, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        _mm512_mask_storeu_ps(d + b0, (__mmask16)((1u << m) - 1), dr);
        for (int k = 0; k < m; k++)
            qa_block(x + (size_t)(b0 + k) * KERN_QK, id[k], qs + (size_t)(b0 + k) * KERN_QK);
    }
}

QA_TARGET void kern_cpu_act_q8_sums_avx512(const int8_t *qs, int32_t *o, int32_t *ob, int n,
                                           int32_t mul) {
    const __m512i ones = _mm512_set1_epi8(1), vmul = _mm512_set1_epi32(mul);
    for (int i = 0; i < n; i += 64) { /* two blocks: sixteen groups of four */
        const __mmask64 live = n - i >= 64 ? ~(__mmask64)0 : ((__mmask64)1 << (n - i)) - 1;
        const __m512i q = _mm512_maskz_loadu_epi8(live, qs + i);
        /* vpdpbusd: 1 (unsigned) x q (signed), four products a dword */
        const __m512i s =
            _mm512_mullo_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, q), vmul);
        const __mmask16 groups = (__mmask16)(n - i >= 64 ? 0xFFFF : (1u << ((n - i) / 4)) - 1);
        _mm512_mask_storeu_epi32(o + i / 4, groups, s);
        ob[i / KERN_QK] = _mm512_mask_reduce_add_epi32(0x00FF, s);
        if (n - i > KERN_QK)
            ob[i / KERN_QK + 1] = _mm512_mask_reduce_add_epi32(0xFF00, s);
    }
}
