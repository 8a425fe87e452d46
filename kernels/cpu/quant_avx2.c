/* quant_avx2.c - AVX2 quantization of activation rows to Q8_0: the rule of
 * kern_cpu_act_q8 (quant.c, ggml's quantize_row_q8_0_ref) eight lanes at a
 * time, with the same bits.
 *
 * Per block of 32: amax = the largest |x| (a NaN does not enter it, as in
 * fmaxf: vmaxps returns its second operand when either is NaN, and the
 * running maximum is always the second; a non-finite x's own product
 * converts to INT32_MIN, which the packs saturate to -128 and a byte
 * maximum lifts to -127, quant.c's rule for it),
 * d = amax / 127 and id = 1 / d (0 for a subnormal d) in scalar code as
 * the reference has them, then q = roundf(x * id). roundf rounds
 * half away from zero, which no vroundps mode does, so it is built: t =
 * x * id truncated, and t +- 1 where |x * id - t| >= 0.5 (that difference
 * is exact: |x * id| <= 127 + a rounding, far below 2^23). The int32 lanes
 * (|q| <= 127) narrow to bytes through two saturating packs (exact here)
 * and a lane permute that undoes their 128-bit interleave.
 *
 * In prefill the scalar rule took 8% of a q4_0 forward pass on a Zen 3
 * (perf, dummy-1g, 512 tokens, one thread: roundf and fmaxf calls per
 * element); docs/benchmarks.md, "Activation rows", has what this changed.
 */
#include "kernels/cpu/kern_cpu.h"

#include <immintrin.h>

KERN_AVX2 void kern_cpu_act_q8_avx2(const float *x, void *dst, int n) {
    int8_t *qs = dst;
    float *d = (float *)(qs + n);
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256 sign_mask = _mm256_castsi256_ps(_mm256_set1_epi32((int)0x80000000u));
    const __m256 half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f);
    const __m256i unzip = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7), m127 = _mm256_set1_epi8(-127);
    for (int b = 0; b < n / KERN_QK; b++) {
        const float *xb = x + (size_t)b * KERN_QK;
        __m256 v[4], m = _mm256_setzero_ps();
        for (int k = 0; k < 4; k++) {
            v[k] = _mm256_loadu_ps(xb + 8 * k);
            m = _mm256_max_ps(_mm256_and_ps(v[k], abs_mask), m);
        }
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_movehdup_ps(h));
        const float amax = _mm_cvtss_f32(h);
        const float dq = amax / ((1 << 7) - 1);
        const float id = kern_cpu_q8_0_iscale(dq);
        d[b] = kern_f16_to_f32_1(kern_f32_to_f16_1(dq));
        const __m256 vid = _mm256_set1_ps(id);
        __m256i q[4];
        for (int k = 0; k < 4; k++) {
            const __m256 p = _mm256_mul_ps(v[k], vid);
            const __m256 t = _mm256_round_ps(p, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
            const __m256 up =
                _mm256_cmp_ps(_mm256_and_ps(_mm256_sub_ps(p, t), abs_mask), half, _CMP_GE_OQ);
            const __m256 step = _mm256_or_ps(_mm256_and_ps(p, sign_mask), one); /* +-1 */
            q[k] = _mm256_cvttps_epi32(_mm256_add_ps(t, _mm256_and_ps(up, step)));
        }
        const __m256i w =
            _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
        _mm256_storeu_si256((__m256i *)(qs + (size_t)b * KERN_QK),
                            _mm256_max_epi8(_mm256_permutevar8x32_epi32(w, unzip), m127));
    }
}
