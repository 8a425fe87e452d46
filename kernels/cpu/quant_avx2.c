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
#include "kernels/cpu/kern_avx2.h"

#include <immintrin.h>
#include <string.h>

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
        const float amax = kern_avx2_hmax8(m);
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

/* Q8_K activation rows (kern_cpu_act_q8K's rule, quant_k.c, from ggml's
 * quantize_row_q8_K_ref) eight lanes at a time, with the same bytes for
 * every input, non-finite ones included. Per block of 256: amax = the
 * largest |x| as vmaxps finds it (a NaN never enters, as in the scalar
 * `ax > amax`), max = the first x with |x| = amax (the scalar keeps the
 * first on ties, so the sign is the first one's), iscale = -127 / max in
 * scalar code; then q = min(127, nearest_int(iscale * x)) with
 * nearest_int's own arithmetic (x + 1.5 * 2^23, the low 23 bits less 2^22:
 * a multiply then an add, never fused, as the scalar code is compiled) and
 * the int8 conversion taking the low byte as C's does (masked to the byte
 * before the packs, which then cannot saturate: a largest |x| below
 * 127 / FLT_MAX, ~3.7e-37, makes iscale infinite, and then q is -2^22,
 * whose low byte is 0, for x != 0 and 0 through a NaN for x = 0). The
 * 32-sums are exact int16 (|q| <= 127, at most 32 * 127): maddubs against
 * ones, madd, and an hadd tree across 8 chunks.
 *
 * The scalar loop cost ~2.7 ns an element on a Zen 3, ~4 us for each
 * 1536-wide decode matmul of a K-quant model, 5-14% of a q4_K matmul of
 * dummy-1g's shapes at the read bandwidth (docs/benchmarks.md, "K-quant
 * packs at AVX2"). */
KERN_AVX2 void kern_cpu_act_q8K_avx2(const float *x, void *dst, int n) {
    enum { QKK = KERN_QK_K };
    int8_t *qs = dst;
    float *d = (float *)(qs + n);
    int16_t *s32 = (int16_t *)(d + n / QKK);
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256 magic = _mm256_set1_ps(12582912.f);
    const __m256i mant = _mm256_set1_epi32(0x007fffff), bias = _mm256_set1_epi32(0x00400000);
    const __m256i lim = _mm256_set1_epi32(127), low8 = _mm256_set1_epi32(0xFF);
    const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
    const __m256i unzip = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int b = 0; b < n / QKK; b++) {
        const float *xb = x + (size_t)b * QKK;
        int8_t *qb = qs + (size_t)b * QKK;
        __m256 m = _mm256_setzero_ps();
        for (int k = 0; k < QKK / 8; k++)
            m = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(xb + 8 * k), abs_mask), m);
        const float amax = kern_avx2_hmax8(m);
        if (!(amax > 0.0f)) {
            memset(qb, 0, QKK);
            memset(s32 + (size_t)b * (QKK / 32), 0, sizeof(int16_t) * (QKK / 32));
            d[b] = 0.0f;
            continue;
        }
        float max = 0.0f;
        const __m256 va = _mm256_set1_ps(amax);
        for (int k = 0; k < QKK / 8; k++) {
            const __m256 v = _mm256_loadu_ps(xb + 8 * k);
            const int eq =
                _mm256_movemask_ps(_mm256_cmp_ps(_mm256_and_ps(v, abs_mask), va, _CMP_EQ_OQ));
            if (eq) {
                max = xb[8 * k + __builtin_ctz((unsigned)eq)];
                break;
            }
        }
        const float iscale = -127.f / max;
        const __m256 vs = _mm256_set1_ps(iscale);
        __m256i sums[QKK / 32];
        for (int c = 0; c < QKK / 32; c++) {
            __m256i q[4];
            for (int k = 0; k < 4; k++) {
                const __m256 p =
                    _mm256_add_ps(_mm256_mul_ps(vs, _mm256_loadu_ps(xb + 32 * c + 8 * k)), magic);
                q[k] = _mm256_sub_epi32(_mm256_and_si256(_mm256_castps_si256(p), mant), bias);
                q[k] = _mm256_and_si256(_mm256_min_epi32(q[k], lim), low8); /* the low byte */
            }
            /* 0..255 in every lane: the unsigned packs are exact */
            const __m256i q32 =
                _mm256_permutevar8x32_epi32(_mm256_packus_epi16(_mm256_packus_epi32(q[0], q[1]),
                                                                _mm256_packus_epi32(q[2], q[3])),
                                            unzip);
            _mm256_storeu_si256((__m256i *)(qb + 32 * c), q32);
            sums[c] = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, q32), ones16);
        }
        const __m256i h01 = _mm256_hadd_epi32(sums[0], sums[1]);
        const __m256i h23 = _mm256_hadd_epi32(sums[2], sums[3]);
        const __m256i h45 = _mm256_hadd_epi32(sums[4], sums[5]);
        const __m256i h67 = _mm256_hadd_epi32(sums[6], sums[7]);
        const __m256i a = _mm256_hadd_epi32(h01, h23), c = _mm256_hadd_epi32(h45, h67);
        const __m256i s = _mm256_add_epi32(_mm256_permute2x128_si256(a, c, 0x20),
                                           _mm256_permute2x128_si256(a, c, 0x31));
        const __m128i s16 =
            _mm_packs_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
        _mm_storeu_si128((__m128i *)(s32 + (size_t)b * (QKK / 32)), s16);
        d[b] = 1 / iscale;
    }
}
