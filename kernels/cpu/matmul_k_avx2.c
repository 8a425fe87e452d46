/* matmul_k_avx2.c - AVX2 micro-kernels for Q2_K, Q3_K, Q4_K, Q5_K and Q6_K
 * weights.
 *
 * One micro-kernel computes an R x T tile (R weight rows, T tokens) of
 * kern_matmul against q8K act rows (kern_cpu.h). Each output element keeps
 * the reduction of ggml's AVX2 ggml_vec_dot_q{2,3,4,5,6}_K_q8_K (ggml-cpu-
 * quants.c, the __AVX2__ branch; llama.cpp c392e50), written from what it
 * computes rather than copied:
 *  - per 256-block, 8 int32 lanes; lane k holds the products of elements
 *    e with (e % 32) / 4 == k (maddubs pairs, then madd by the sub-block's
 *    scale), exact integers, so any way of forming them gives their value;
 *  - acc = fma(d_x * f16(d_w), float(lane), acc), one 8-lane accumulator;
 *  - Q4_K mins: 4 lanes, lane m = mins[2m] S[2m] + mins[2m+1] S[2m+1]
 *    (S[j]: the sum of the activation's sub-block j), into a 4-lane
 *    accm = fma(-(d_x * f16(dmin)), float(lane), accm);
 *    Q5_K mins: one int per block into summ = fma(-(d_x * f16(dmin)),
 *    float(mins), summ) (what GCC makes of ggml's `summs += dmin * ...`);
 *    Q2_K mins: 8 lanes, lane k = mins[2k] s[2k] + mins[2k+1] s[2k+1] (s:
 *    the 16-sums of the q8K16 row), into acc itself before the block's
 *    products: acc = fma(-(d_x * f16(dmin)), float(lane), acc);
 *  - result: hsum8(acc) [((a0+a4)+(a2+a6))+((a1+a5)+(a3+a7))], plus
 *    (accm0+accm2)+(accm1+accm3) for Q4_K, plus summ for Q5_K.
 * So on an AVX2 build of llama.cpp the products are bit for bit ggml's
 * (tests/test_kern_kquant.c checks against a model of it). R and T only
 * decide which elements share the weight unpacking and the loads: every
 * tile shape gives identical elements, which keeps kern_matmul batch
 * invariant. The AVX-VNNI level runs these kernels as they are (the same
 * bits as AVX2); the AVX-512 and AMX levels run them for Q2_K/Q3_K, and for
 * Q4_K/Q5_K/Q6_K with one_sum (pack_k.c's one-integer sequence, their
 * packs' bits).
 *
 * Shapes: decode (one token) uses 4 x 1, prefill 2 x 4 (each unpacked
 * weight vector serves 4 tokens; the 8 + 4-lane accumulators spill to L1
 * once per block, a few loads among ~100 integer operations). Measured on a
 * 4096 x 4096 q4_K/q6_K kern_matmul (bench_kern.c's shape), one thread: 2,
 * 4 and 8 decode rows, and 1x4, 2x2, 4x2, 2x4 and 3x4 prefill tiles, all
 * within 5% of each other, the matrix L3-resident: there each row's integer
 * work (~75 uops per 256 weights, ~14 GB/s of q4_K per thread) bounds these
 * kernels. From DRAM the weight loads bound decode unless the next tile is
 * prefetched (kern_cpu_prefetch_next: dummy-1g q4_k_m decode on a Zen 3
 * went from 13 to 38 tok/s with it, docs/benchmarks.md).
 */
#include "kernels/cpu/kern_cpu.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#define AI __attribute__((always_inline)) inline
#define QK KERN_QK_K

static KERN_AVX2 AI float k_hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static KERN_AVX2 AI float k_hsum4(__m128 s) {
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Shuffles that spread int16 k of each 8 x int16 half over that half's 8
 * int16 lanes: bytes 2k, 2k+1 repeated. Q4_K/Q5_K hold the same 8 scales
 * in both halves; Q6_K two different ones (k_q6_even_odd). */
static _Alignas(32) const uint8_t k_shuf16[8][32] = {
#define K_SH(k)                                                                                    \
    {                                                                                              \
        2 * k, 2 * k + 1, 2 * k, 2 * k + 1, 2 * k, 2 * k + 1, 2 * k, 2 * k + 1, 2 * k, 2 * k + 1,  \
            2 * k, 2 * k + 1, 2 * k, 2 * k + 1, 2 * k, 2 * k + 1, 2 * k, 2 * k + 1, 2 * k,         \
            2 * k + 1, 2 * k, 2 * k + 1, 2 * k, 2 * k + 1, 2 * k, 2 * k + 1, 2 * k, 2 * k + 1,     \
            2 * k, 2 * k + 1, 2 * k, 2 * k + 1                                                     \
    }
    K_SH(0), K_SH(1), K_SH(2), K_SH(3), K_SH(4), K_SH(5), K_SH(6), K_SH(7),
#undef K_SH
};

/* Q6_K: the 16 int8 scales, even ones first, then odd ones; widened to
 * int16 that puts scale 2c at int16 c of the low half and 2c + 1 at int16
 * c of the high half, which k_shuf16[c] spreads over chunk c's halves
 * (elements 0-15 and 16-31 of the chunk) in one in-lane shuffle: 10
 * shuffles a row and block (2 + 8) where a byte shuffle and a widening
 * each chunk took 16 (an L2-resident 1536 x 256 decode matmul ran 1.07x as
 * fast this way on a Zen 3; docs/benchmarks.md). */
static _Alignas(16) const uint8_t k_q6_even_odd[16] = {0, 2, 4, 6, 8, 10, 12, 14,
                                                       1, 3, 5, 7, 9, 11, 13, 15};

/* The 8 scales and 8 mins of a Q4_K/Q5_K block (kern_cpu.h's packing) as
 * int16: *sc both halves of a ymm (for the shuffles), *mn one xmm. */
static KERN_AVX2 AI void k_scales_mins(const uint8_t *s, __m256i *sc, __m128i *mn) {
    uint32_t u[3];
    memcpy(u, s, 12);
    const uint32_t lo6 = 0x3f3f3f3f, lo4 = 0x0f0f0f0f, lo2 = 0x03030303;
    const uint32_t sc_lo = u[0] & lo6, mn_lo = u[1] & lo6;
    const uint32_t sc_hi = (u[2] & lo4) | (((u[0] >> 6) & lo2) << 4);
    const uint32_t mn_hi = ((u[2] >> 4) & lo4) | (((u[1] >> 6) & lo2) << 4);
    const __m128i b = _mm_set_epi32((int)mn_hi, (int)mn_lo, (int)sc_hi, (int)sc_lo);
    *sc = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(b));
    *mn = _mm_cvtepu8_epi16(_mm_srli_si128(b, 8));
}

/* The 16 scales of a Q3_K block (kern_cpu.h's packing) as int8 -32..31,
 * scale j in byte j: the low 4 bits of scales j and j + 8 share byte j % 8,
 * the high 2 bits of j sit at bits 2(j / 4) of byte 8 + j % 4. */
static KERN_AVX2 AI __m128i k_q3_scales(const uint8_t *s) {
    uint32_t u[3];
    memcpy(u, s, 12);
    const uint32_t lo4 = 0x0f0f0f0f, lo2 = 0x03030303;
    const __m128i b = _mm_set_epi32((int)(((u[1] >> 4) & lo4) | (((u[2] >> 6) & lo2) << 4)),
                                    (int)(((u[0] >> 4) & lo4) | (((u[2] >> 4) & lo2) << 4)),
                                    (int)((u[1] & lo4) | (((u[2] >> 2) & lo2) << 4)),
                                    (int)((u[0] & lo4) | ((u[2] & lo2) << 4)));
    return _mm_sub_epi8(b, _mm_set1_epi8(32));
}

/* One chunk of 32 weights, levels lv (0..63 unsigned) of groups 2c, 2c + 1
 * with chunk c's scales spread by k_shuf16[c] from sc16 (k_q6_even_odd's
 * order), against T tokens' activations at xq[j] + off: sumi[j] += the
 * products, (lv - bias) . a as lv . a - bias . a when bias is not zero
 * (Q6_K 32, Q3_K 4; Q2_K none), int16 pairs then madd by the scale. */
static KERN_AVX2 AI void k_chunk16(__m256i *sumi, const int8_t *const *xq, size_t off, int T,
                                   __m256i lv, __m256i sc16, int c, __m256i bias, bool biased) {
    const __m256i s16 = _mm256_shuffle_epi8(sc16, _mm256_load_si256((const __m256i *)k_shuf16[c]));
#pragma GCC unroll 8
    for (int j = 0; j < T; j++) {
        const __m256i a = _mm256_load_si256((const __m256i *)(xq[j] + off));
        __m256i p16 = _mm256_maddubs_epi16(lv, a);
        if (biased)
            p16 = _mm256_sub_epi16(p16, _mm256_maddubs_epi16(bias, a));
        sumi[j] = _mm256_add_epi32(sumi[j], _mm256_madd_epi16(s16, p16));
    }
}

/* One tile, weights of type wt (a compile-time constant after inlining). */
/* The sum of s's 4 int32 lanes, of v's 8 (exact: integers). */
static KERN_AVX2 AI int32_t k_hsum_i32x4(__m128i s) {
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}
static KERN_AVX2 AI int32_t k_hsum_i32(__m256i v) {
    return k_hsum_i32x4(_mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1)));
}

/* one_sum: Q4_K/Q5_K/Q6_K in pack_k.c's one-sum sequence (the levels whose
 * packs run it) instead of ggml's lanes. */
static KERN_AVX2 AI void k_tile(const struct kern_mm *m, int r, int t, const int R, const int T,
                                enum kern_wtype wt, const bool one_sum) {
    const int n = m->n_in, nb = n / QK;
    const char *w[8];
    const int8_t *xq[4];
    const float *xd[4];
    const int16_t *xs[4];
    __m256 acc[8][4];
    __m128 accm[8][4];
    float acc1[8][4]; /* one_sum */
    const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(3);
    const __m256i m32 = _mm256_set1_epi8(32), one = _mm256_set1_epi8(1);
    const __m256i m4b = _mm256_set1_epi8(4);
#pragma GCC unroll 8
    for (int i = 0; i < R; i++)
        w[i] = (const char *)m->w + (size_t)(r + i) * m->w_stride;
#pragma GCC unroll 8
    for (int j = 0; j < T; j++) {
        xq[j] = (const int8_t *)m->act + (size_t)(t + j) * m->act_stride;
        xd[j] = kern_cpu_act_q8K_d(xq[j], n);
        xs[j] = wt == KERN_W_Q2_K ? kern_cpu_act_q8K_s16(xq[j], n) : kern_cpu_act_q8K_s32(xq[j], n);
    }
#pragma GCC unroll 8
    for (int i = 0; i < R; i++)
#pragma GCC unroll 8
        for (int j = 0; j < T; j++) {
            acc[i][j] = _mm256_setzero_ps();
            accm[i][j] = _mm_setzero_ps();
            acc1[i][j] = 0.0f;
        }
    const size_t blk = kern_row_bytes(wt, QK);
    for (int b = 0; b < nb; b++) {
        kern_cpu_prefetch_next(w[0], (size_t)R * m->w_stride, (size_t)R * blk, b);
#pragma GCC unroll 8
        for (int i = 0; i < R; i++) {
            __m256i sumi[4];
#pragma GCC unroll 8
            for (int j = 0; j < T; j++)
                sumi[j] = _mm256_setzero_si256();
            float dw, dmw = 0;
            __m128i mins = _mm_setzero_si128();
            __m256i mins16 = _mm256_setzero_si256();
            if (wt == KERN_W_Q6_K) {
                const struct kern_blk_q6_K *x = (const struct kern_blk_q6_K *)w[i] + b;
                dw = _cvtsh_ss(x->d);
                const __m256i sc16 = _mm256_cvtepi8_epi16(
                    _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)x->scales),
                                     _mm_load_si128((const __m128i *)k_q6_even_odd)));
#pragma GCC unroll 2
                for (int h = 0; h < 2; h++) {
                    const __m256i l0 = _mm256_loadu_si256((const __m256i *)(x->ql + 64 * h));
                    const __m256i l1 = _mm256_loadu_si256((const __m256i *)(x->ql + 64 * h + 32));
                    const __m256i hb = _mm256_loadu_si256((const __m256i *)(x->qh + 32 * h));
                    __m256i q6[4];
                    q6[0] = _mm256_or_si256(_mm256_and_si256(l0, m4),
                                            _mm256_slli_epi16(_mm256_and_si256(hb, m2), 4));
                    q6[1] = _mm256_or_si256(
                        _mm256_and_si256(l1, m4),
                        _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2), m2), 4));
                    q6[2] = _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                        _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 4), m2), 4));
                    q6[3] = _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                        _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 6), m2), 4));
#pragma GCC unroll 4
                    for (int q = 0; q < 4; q++)
                        k_chunk16(sumi, xq, (size_t)QK * b + 128 * h + 32 * q, T, q6[q], sc16,
                                  4 * h + q, m32, true);
                }
            } else if (wt == KERN_W_Q2_K || wt == KERN_W_Q3_K) {
                /* 8 chunks of 32 = groups 2c, 2c + 1 of 16; the level is the
                 * chunk's 2 bits (Q2_K, mins apart) or those plus 4 x its
                 * hmask bit, minus 4 (Q3_K) */
                /* block b at its own type's size: the other view is never read */
                const struct kern_blk_q2_K *x2 = (const void *)(w[i] + blk * b);
                const struct kern_blk_q3_K *x3 = (const void *)(w[i] + blk * b);
                const uint8_t *qs = wt == KERN_W_Q2_K ? x2->qs : x3->qs;
                __m128i sc8;
                __m256i hb = _mm256_setzero_si256();
                if (wt == KERN_W_Q2_K) {
                    dw = _cvtsh_ss(x2->d);
                    dmw = _cvtsh_ss(x2->dmin);
                    const __m128i sm = _mm_loadu_si128((const __m128i *)x2->scales);
                    const __m128i lo4 = _mm_set1_epi8(0x0F);
                    sc8 = _mm_and_si128(sm, lo4);
                    mins16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sm, 4), lo4));
                } else {
                    dw = _cvtsh_ss(x3->d);
                    sc8 = k_q3_scales(x3->scales);
                    hb = _mm256_loadu_si256((const __m256i *)x3->hmask);
                }
                const __m256i sc16 = _mm256_cvtepi8_epi16(
                    _mm_shuffle_epi8(sc8, _mm_load_si128((const __m128i *)k_q6_even_odd)));
#pragma GCC unroll 2
                for (int h = 0; h < 2; h++) {
                    const __m256i bits = _mm256_loadu_si256((const __m256i *)(qs + 32 * h));
#pragma GCC unroll 4
                    for (int q = 0; q < 4; q++) {
                        __m256i lv = _mm256_and_si256(_mm256_srli_epi16(bits, 2 * q), m2);
                        if (wt == KERN_W_Q3_K) {
                            const __m256i bm = _mm256_set1_epi8((char)(1 << (4 * h + q)));
                            const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(hb, bm), bm);
                            lv = _mm256_or_si256(lv, _mm256_and_si256(set, m4b));
                        }
                        k_chunk16(sumi, xq, (size_t)QK * b + 128 * h + 32 * q, T, lv, sc16,
                                  4 * h + q, m4b, wt == KERN_W_Q3_K);
                    }
                }
            } else {
                /* Q4_K, Q5_K: 4 chunks of 64 = sub-blocks 2c (low nibbles)
                 * and 2c + 1 (high nibbles) */
                const struct kern_blk_q4_K *x4 = (const void *)(w[i] + blk * b);
                const struct kern_blk_q5_K *x5 = (const void *)(w[i] + blk * b);
                const uint8_t *qs = wt == KERN_W_Q4_K ? x4->qs : x5->qs;
                const uint8_t *scb = wt == KERN_W_Q4_K ? x4->scales : x5->scales;
                const uint16_t d16 = wt == KERN_W_Q4_K ? x4->d : x5->d;
                const uint16_t dm16 = wt == KERN_W_Q4_K ? x4->dmin : x5->dmin;
                dw = _cvtsh_ss(d16);
                dmw = _cvtsh_ss(dm16);
                __m256i sc;
                k_scales_mins(scb, &sc, &mins);
                __m256i hb = _mm256_setzero_si256();
                if (wt == KERN_W_Q5_K)
                    hb = _mm256_loadu_si256((const __m256i *)x5->qh);
#pragma GCC unroll 4
                for (int c = 0; c < 4; c++) {
                    const __m256i bits = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
                    __m256i lo = _mm256_and_si256(bits, m4);
                    __m256i hi = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
                    if (wt == KERN_W_Q5_K) {
                        /* bit 2c of qh[l] is element l's 16 in sub-block 2c */
                        lo = _mm256_or_si256(
                            lo, _mm256_slli_epi16(
                                    _mm256_and_si256(_mm256_srli_epi16(hb, 2 * c), one), 4));
                        hi = _mm256_or_si256(
                            hi, _mm256_slli_epi16(
                                    _mm256_and_si256(_mm256_srli_epi16(hb, 2 * c + 1), one), 4));
                    }
                    const __m256i s_lo = _mm256_shuffle_epi8(
                        sc, _mm256_load_si256((const __m256i *)k_shuf16[2 * c]));
                    const __m256i s_hi = _mm256_shuffle_epi8(
                        sc, _mm256_load_si256((const __m256i *)k_shuf16[2 * c + 1]));
#pragma GCC unroll 8
                    for (int j = 0; j < T; j++) {
                        const int8_t *a = xq[j] + QK * b + 64 * c;
                        const __m256i a0 = _mm256_load_si256((const __m256i *)a);
                        const __m256i a1 = _mm256_load_si256((const __m256i *)(a + 32));
                        const __m256i p0 = _mm256_madd_epi16(s_lo, _mm256_maddubs_epi16(lo, a0));
                        const __m256i p1 = _mm256_madd_epi16(s_hi, _mm256_maddubs_epi16(hi, a1));
                        sumi[j] = _mm256_add_epi32(sumi[j], _mm256_add_epi32(p0, p1));
                    }
                }
            }
#pragma GCC unroll 8
            for (int j = 0; j < T; j++) {
                const float dx = xd[j][b];
                if (one_sum) {
                    /* the block's integers, then acc = fma(d_w d_x, isum,
                     * acc) and acc = fma(-(d_x dmin), msum, acc) */
                    acc1[i][j] = fmaf(dx * dw, (float)k_hsum_i32(sumi[j]), acc1[i][j]);
                    if (wt != KERN_W_Q6_K) {
                        const __m128i p =
                            _mm_madd_epi16(mins, _mm_loadu_si128((const __m128i *)(xs[j] + 8 * b)));
                        const int32_t ms = k_hsum_i32x4(p);
                        acc1[i][j] = fmaf(kern_cpu_neg_prod(dx, dmw), (float)ms, acc1[i][j]);
                    }
                    continue;
                }
                if (wt == KERN_W_Q2_K) {
                    const __m256i s = _mm256_loadu_si256((const __m256i *)(xs[j] + 16 * b));
                    acc[i][j] = _mm256_fmadd_ps(_mm256_set1_ps(kern_cpu_neg_prod(dx, dmw)),
                                                _mm256_cvtepi32_ps(_mm256_madd_epi16(mins16, s)),
                                                acc[i][j]);
                }
                acc[i][j] = _mm256_fmadd_ps(_mm256_set1_ps(dx * dw), _mm256_cvtepi32_ps(sumi[j]),
                                            acc[i][j]);
                if (wt == KERN_W_Q4_K || wt == KERN_W_Q5_K) {
                    const __m128i s = _mm_loadu_si128((const __m128i *)(xs[j] + 8 * b));
                    const __m128i p = _mm_madd_epi16(mins, s);
                    const __m128 dmin = _mm_set1_ps(kern_cpu_neg_prod(dx, dmw));
                    if (wt == KERN_W_Q4_K) {
                        accm[i][j] = _mm_fmadd_ps(dmin, _mm_cvtepi32_ps(p), accm[i][j]);
                    } else {
                        __m128i h = _mm_add_epi32(p, _mm_srli_si128(p, 8));
                        h = _mm_add_epi32(h, _mm_srli_si128(h, 4));
                        accm[i][j] = _mm_fmadd_ss(dmin, _mm_cvtepi32_ps(h), accm[i][j]);
                    }
                }
            }
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < R; i++)
#pragma GCC unroll 8
        for (int j = 0; j < T; j++) {
            float v = one_sum ? acc1[i][j] : k_hsum8(acc[i][j]);
            if (wt == KERN_W_Q4_K && !one_sum)
                v += k_hsum4(accm[i][j]);
            else if (wt == KERN_W_Q5_K && !one_sum)
                v += _mm_cvtss_f32(accm[i][j]);
            m->y[(size_t)(t + j) * m->n_out + r + i] = v;
        }
}

/* Cover rows [r0, r1) x tokens [t0, t1) with 2x4 tiles (prefill) or 4x1
 * tiles (decode), and smaller tiles for the edges. */
static KERN_AVX2 AI void k_rect(const struct kern_mm *m, int r0, int r1, int t0, int t1,
                                enum kern_wtype wt, const bool one_sum) {
    int r = r0;
    if (t1 - t0 >= 4) {
        for (; r + 2 <= r1; r += 2) {
            int t = t0;
            for (; t + 4 <= t1; t += 4)
                k_tile(m, r, t, 2, 4, wt, one_sum);
            for (; t < t1; t++)
                k_tile(m, r, t, 2, 1, wt, one_sum);
        }
    }
    for (; r + 4 <= r1; r += 4)
        for (int t = t0; t < t1; t++)
            k_tile(m, r, t, 4, 1, wt, one_sum);
    for (; r < r1; r++) {
        int t = t0;
        for (; t + 4 <= t1; t += 4)
            k_tile(m, r, t, 1, 4, wt, one_sum);
        for (; t < t1; t++)
            k_tile(m, r, t, 1, 1, wt, one_sum);
    }
}

static KERN_AVX2 void k_rect_q2_K(const struct kern_mm *m, int r0, int r1, int t0, int t1) {
    k_rect(m, r0, r1, t0, t1, KERN_W_Q2_K, false);
}
static KERN_AVX2 void k_rect_q3_K(const struct kern_mm *m, int r0, int r1, int t0, int t1) {
    k_rect(m, r0, r1, t0, t1, KERN_W_Q3_K, false);
}
static KERN_AVX2 void k_rect_q4_K(const struct kern_mm *m, int r0, int r1, int t0, int t1) {
    k_rect(m, r0, r1, t0, t1, KERN_W_Q4_K, false);
}
static KERN_AVX2 void k_rect_q5_K(const struct kern_mm *m, int r0, int r1, int t0, int t1) {
    k_rect(m, r0, r1, t0, t1, KERN_W_Q5_K, false);
}
static KERN_AVX2 void k_rect_q6_K(const struct kern_mm *m, int r0, int r1, int t0, int t1) {
    k_rect(m, r0, r1, t0, t1, KERN_W_Q6_K, false);
}

kern_cpu_rect_fn kern_cpu_rect_k_avx2(enum kern_wtype t) {
    switch (t) {
    case KERN_W_Q2_K:
        return k_rect_q2_K;
    case KERN_W_Q3_K:
        return k_rect_q3_K;
    case KERN_W_Q4_K:
        return k_rect_q4_K;
    case KERN_W_Q5_K:
        return k_rect_q5_K;
    case KERN_W_Q6_K:
        return k_rect_q6_K;
    default:
        return NULL;
    }
}

static KERN_AVX2 void k1_rect_q4_K(const struct kern_mm *m, int r0, int r1, int t0, int t1) {
    k_rect(m, r0, r1, t0, t1, KERN_W_Q4_K, true);
}
static KERN_AVX2 void k1_rect_q5_K(const struct kern_mm *m, int r0, int r1, int t0, int t1) {
    k_rect(m, r0, r1, t0, t1, KERN_W_Q5_K, true);
}
static KERN_AVX2 void k1_rect_q6_K(const struct kern_mm *m, int r0, int r1, int t0, int t1) {
    k_rect(m, r0, r1, t0, t1, KERN_W_Q6_K, true);
}

kern_cpu_rect_fn kern_cpu_rect_k1_avx2(enum kern_wtype t) {
    switch (t) {
    case KERN_W_Q4_K:
        return k1_rect_q4_K;
    case KERN_W_Q5_K:
        return k1_rect_q5_K;
    case KERN_W_Q6_K:
        return k1_rect_q6_K;
    default:
        return NULL;
    }
}
