/* matmul_q.h - the Q8_0/Q4_0 micro-kernels on rows, included once per
 * level (matmul_avx2.c: the int8 dot as maddubs + madd; matmul_avxvnni.c:
 * the VEX vpdpbusd, 16 ymm registers; matmul_avx512.c: the EVEX vpdpbusd,
 * 32 registers). The includer defines:
 *   MMQ_TARGET        the function attribute (target("..."))
 *   MMQ_DPBUSD(a,u,s) a + the int8 dot of u (unsigned) and s (signed), per
 *                     int32 lane of 4 bytes: _mm256_dpbusd[_avx]_epi32, or
 *                     madd(maddubs(u, s), 1) + a (exact here: no pair of
 *                     products below reaches the int16 limit, see below)
 *   MMQ_NAME(x)       the level's name for x
 *   MMQ_Q8_ONE_SUM    1 where the level packs Q8_0 (the AVX512 one): its
 *                     rows then sum Q8_0 as the pack does, below
 *
 * One micro-kernel computes an R x T tile (R weight rows, T tokens). Per
 * element the sequence is always the same. Q8_0 where MMQ_Q8_ONE_SUM is 0:
 * one 8-lane f32 accumulator; per 32-block, 8 int32 lanes (lane l = the
 * exact sum of w*x over elements 4l..4l+3), converted to f32, acc =
 * fma(d_w * d_x, lanes, acc), then a fixed hsum8: ggml's AVX2 vec_dot,
 * which the q8_0 references were made with. Q4_0, and Q8_0 where
 * MMQ_Q8_ONE_SUM is 1: the 8 lanes summed to the block's exact integer
 * sum, then one scalar acc = fmaf(sum, d_w * d_x, acc) (pack.c's sequence;
 * for Q4_0 also matmul.c's scalar dot: the same bits on every level). Rows
 * only run that sequence where no pack does, and the horizontal sum costs
 * them about half their speed. R and T only decide how many elements share
 * the loads, so every tile shape gives bit-identical elements (batch
 * invariance), and since the lanes are exact integers the levels with the
 * same sequence give the same bits.
 *
 * The lanes, exact for every input byte:
 *  - Q8_0: vpdpbusd(|w|, x * sign(w)): |w| <= 128 fits u8 (|-128| is 0x80),
 *    x is a quantized activation in [-127, 127] so x * sign(w) fits s8;
 *  - Q4_0: vpdpbusd(-8 * sum4(x), nibble, x): the nibbles 0..15 are the
 *    unsigned operand as they are, and starting the lane at -8 * (sum of
 *    its four x) subtracts the offset of 8 (w = nibble - 8); that start is
 *    computed once per token and block (vpdpbusd of 8 and x, negated).
 * Pair sums stay within int16 for maddubs: 2 * 128 * 127, 2 * 15 * 128.
 *
 * Shapes: decode (one token) uses 8 x 1: eight independent chains and
 * eight weight streams in flight (measured 10-25% faster than 4 x 1 on the
 * AVX2 level, which is latency-bound there). Prefill uses 3 x 4 on Q8_0 and
 * 2 x 4 on Q4_0: each weight load feeds 4 tokens, each activation load 3
 * (or 2) rows. With 16 ymm registers (avx2, avx-vnni) GCC keeps most of the
 * 3 x 4 tile's 12 accumulators on the stack (FMAs with a memory operand,
 * L1-resident); it was measured faster all the same, on a Zen 3 (about
 * 1.15x bench_kern's q8_0 prefill) and a Zen 5 (1.05-1.08x), and the avx512
 * level's 32 registers hold it whole.
 */

#include <immintrin.h>
#include <math.h>

#include "kernels/cpu/kern_cpu.h"

#ifndef MMQ_AI
#define MMQ_AI __attribute__((always_inline)) inline
#endif

static MMQ_TARGET MMQ_AI float MMQ_NAME(hsum8)(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* The sum of the 8 int32 lanes of v (exact: integers). */
static MMQ_TARGET MMQ_AI int32_t MMQ_NAME(hsum_i32)(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

static MMQ_TARGET MMQ_AI void MMQ_NAME(tile)(const struct kern_mm *m, int r, int t, const int R,
                                             const int T, enum kern_wtype wt) {
    const int n = m->n_in, nb = n / KERN_QK;
    const unsigned char *w[8];
    const int8_t *xq[4];
    const float *xd[4];
    __m256 acc[8][4];
    float accq[8][4]; /* Q4_0: each element's running sum */
    const __m256i eights = _mm256_set1_epi8(8), nib = _mm256_set1_epi8(0x0F);
#pragma GCC unroll 8
    for (int i = 0; i < R; i++)
        w[i] = (const unsigned char *)m->w + (size_t)(r + i) * m->w_stride;
#pragma GCC unroll 8
    for (int j = 0; j < T; j++) {
        xq[j] = (const int8_t *)m->act + (size_t)(t + j) * m->act_stride;
        xd[j] = (const float *)(xq[j] + n);
    }
#pragma GCC unroll 8
    for (int i = 0; i < R; i++)
#pragma GCC unroll 8
        for (int j = 0; j < T; j++) {
            acc[i][j] = _mm256_setzero_ps();
            accq[i][j] = 0.0f;
        }
    const size_t bb =
        wt == KERN_W_Q4_0 ? sizeof(struct kern_blk_q4_0) : sizeof(struct kern_blk_q8_0);
    const bool one_sum = wt == KERN_W_Q4_0 || MMQ_Q8_ONE_SUM;
    for (int b = 0; b < nb; b++) {
        __m256i xv[4], x0[4];
        kern_cpu_prefetch_next(w[0], (size_t)R * m->w_stride, (size_t)R * bb, b);
#pragma GCC unroll 8
        for (int j = 0; j < T; j++) {
            xv[j] = _mm256_load_si256((const __m256i *)(xq[j] + b * KERN_QK));
            if (wt == KERN_W_Q4_0)
                x0[j] = _mm256_sub_epi32(_mm256_setzero_si256(),
                                         MMQ_DPBUSD(_mm256_setzero_si256(), eights, xv[j]));
        }
#pragma GCC unroll 8
        for (int i = 0; i < R; i++) {
            __m256 dw;
            float dwf = 0.0f;
            __m256i wv;
            if (wt == KERN_W_Q4_0) {
                const struct kern_blk_q4_0 *blk = (const struct kern_blk_q4_0 *)w[i] + b;
                dwf = _cvtsh_ss(blk->d);
                dw = _mm256_setzero_ps();
                __m128i q = _mm_loadu_si128((const __m128i *)blk->qs);
                wv = _mm256_and_si256(
                    _mm256_insertf128_si256(_mm256_castsi128_si256(q), _mm_srli_epi16(q, 4), 1),
                    nib);
            } else {
                const struct kern_blk_q8_0 *blk = (const struct kern_blk_q8_0 *)w[i] + b;
                dwf = _cvtsh_ss(blk->d);
                dw = _mm256_set1_ps(dwf);
                wv = _mm256_loadu_si256((const __m256i *)blk->qs);
            }
            const __m256i aw = wt == KERN_W_Q4_0 ? wv : _mm256_abs_epi8(wv);
#pragma GCC unroll 8
            for (int j = 0; j < T; j++) {
                const __m256i lanes = wt == KERN_W_Q4_0 ? MMQ_DPBUSD(x0[j], aw, xv[j])
                                                        : MMQ_DPBUSD(_mm256_setzero_si256(), aw,
                                                                     _mm256_sign_epi8(xv[j], wv));
                if (one_sum) { /* the block's sum, one fma */
                    const int32_t sumi = MMQ_NAME(hsum_i32)(lanes);
                    accq[i][j] = fmaf((float)sumi, dwf * xd[j][b], accq[i][j]);
                    continue;
                }
                acc[i][j] = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_broadcast_ss(xd[j] + b)),
                                            _mm256_cvtepi32_ps(lanes), acc[i][j]);
            }
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < R; i++)
#pragma GCC unroll 8
        for (int j = 0; j < T; j++)
            m->y[(size_t)(t + j) * m->n_out + r + i] =
                one_sum ? accq[i][j] : MMQ_NAME(hsum8)(acc[i][j]);
}

/* Prefill rows r0.. in tiles of R rows x 4 tokens (R a constant after
 * inlining); returns the first row it did not cover. */
static MMQ_TARGET MMQ_AI int MMQ_NAME(prefill)(const struct kern_mm *m, int r0, int r1, int t0,
                                               int t1, const int R, enum kern_wtype wt) {
    int r = r0;
    for (; r + R <= r1; r += R) {
        int t = t0;
        for (; t + 4 <= t1; t += 4)
            MMQ_NAME(tile)(m, r, t, R, 4, wt);
        for (; t < t1; t++)
            MMQ_NAME(tile)(m, r, t, R, 1, wt);
    }
    return r;
}

/* The cover: for prefill, 3x4 tiles on Q8_0 and 2x4 on Q4_0 (whose
 * offset starts x0 take four more registers), measured on a Zen 3 and a
 * Zen 5 (see docs/benchmarks.md); 8x1 for decode; smaller at the edges (the tile
 * shape never changes a result). */
static MMQ_TARGET MMQ_AI void MMQ_NAME(rect)(const struct kern_mm *m, int r0, int r1, int t0,
                                             int t1, enum kern_wtype wt) {
    int r = r0;
    if (t1 - t0 >= 4)
        r = wt == KERN_W_Q4_0 ? MMQ_NAME(prefill)(m, r0, r1, t0, t1, 2, wt)
                              : MMQ_NAME(prefill)(m, r0, r1, t0, t1, 3, wt);
    for (; r + 8 <= r1; r += 8)
        for (int t = t0; t < t1; t++)
            MMQ_NAME(tile)(m, r, t, 8, 1, wt);
    for (; r + 4 <= r1; r += 4)
        for (int t = t0; t < t1; t++)
            MMQ_NAME(tile)(m, r, t, 4, 1, wt);
    for (; r < r1; r++) {
        int t = t0;
        for (; t + 4 <= t1; t += 4)
            MMQ_NAME(tile)(m, r, t, 1, 4, wt);
        for (; t < t1; t++)
            MMQ_NAME(tile)(m, r, t, 1, 1, wt);
    }
}

static MMQ_TARGET void MMQ_NAME(rect_q8_0)(const struct kern_mm *m, int r0, int r1, int t0,
                                           int t1) {
    MMQ_NAME(rect)(m, r0, r1, t0, t1, KERN_W_Q8_0);
}
static MMQ_TARGET void MMQ_NAME(rect_q4_0)(const struct kern_mm *m, int r0, int r1, int t0,
                                           int t1) {
    MMQ_NAME(rect)(m, r0, r1, t0, t1, KERN_W_Q4_0);
}
