/* matmul_avx512.c - kern_matmul's micro-kernels at the AVX512 level.
 *
 * Q8_0/Q4_0 rows: matmul_q.h with the EVEX vpdpbusd on ymm; the 32
 * vector registers keep an 8 x 1 decode tile's accumulators and operands
 * without spills. Q4_0 is bit-identical to the AVX2 level; Q8_0 sums one
 * integer a block, as this level's pack does (see matmul_q.h). (The model
 * packs these types where it can: pack_avx512.c.)
 *
 * F32/F16/BF16 rows: one 16-lane f32 accumulator per element, acc =
 * fma(w[k..k+16], x[k..k+16], acc) for k = 0, 16, ..., a masked step for
 * the tail, then a fixed 16-lane tree: the order depends only on n_in, so
 * every tile shape gives the same bits (but not AVX2's, which sums 8
 * lanes). F16: x was rounded to f16 by the driver, so the products are the
 * exact f16 x f16 ones, as on the other levels. Tiles: prefill 4 rows x 6
 * tokens (24 accumulators, 4 weight vectors and one activation vector: 29
 * of the 32 registers; a weight vector's conversion feeds 6 FMAs), then
 * one 4- or 2-token tile and single tokens at a block's end; decode 8 x 1,
 * which prefetches the next tile into L2 where the CPU gains from it
 * (kern_rows_prefetch: Intel yes, AMD no; two copies of each type's rect).
 * The driver's token blocks are multiples of 12 or of 4 tokens. With
 * single-token tails a block of 12 (dummy-1g's n_in 1536) ran as one
 * 3 x 8 and four 3 x 1 tiles, and a block of 8 (4096-wide rows, as in
 * bench_kern) as one 4 x 6 and two 4 x 1: which is why a Sapphire Rapids
 * vCPU once measured 3x8 (82 GFLOP/s) ahead of 4x6 (65) there. On a Zen 5,
 * dummy-1g f16 prefill 512: 4x6 1.08x 3x8 with the same tails, 1.27x 3x8
 * with single-token tails; bench_kern's 8-token blocks: level
 * (docs/benchmarks.md).
 */
#include "kernels/cpu/kern_avx512.h"
#include "kernels/cpu/kern_cpu.h"

#include <immintrin.h>

#define MMQ_TARGET          KERN_AVX512_TARGET
#define MMQ_DPBUSD(a, u, s) _mm256_dpbusd_epi32((a), (u), (s))
#define MMQ_NAME(x)         mmq_avx512_##x
#define MMQ_Q8_ONE_SUM      1 /* pack.c: the level packs Q8_0 */
#include "kernels/cpu/matmul_q.h"

#define MF_TARGET MMQ_TARGET
#define MF_AI     __attribute__((always_inline)) inline
#define MF_R      4 /* prefill tile: rows */
#define MF_T      6 /* and tokens (the driver's token blocks are multiples of 4 or 12) */

static MF_TARGET MF_AI float mf_hsum16(__m512 v) {
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* 16 weights of a float-like type at element k of row w, unmasked. */
static MF_TARGET MF_AI __m512 mf_load_w_full(enum kern_wtype wt, const void *w, int k) {
    if (wt == KERN_W_F32)
        return _mm512_loadu_ps((const float *)w + k);
    const __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)w + k));
    if (wt == KERN_W_F16)
        return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); /* bf16 */
}

/* 16 weights of a float-like type at element k of row w (lanes outside
 * `keep` are 0). */
static MF_TARGET MF_AI __m512 mf_load_w(enum kern_wtype wt, const void *w, int k, __mmask16 keep) {
    if (wt == KERN_W_F32)
        return _mm512_maskz_loadu_ps(keep, (const float *)w + k);
    const __m256i h = _mm256_maskz_loadu_epi16(keep, (const uint16_t *)w + k);
    if (wt == KERN_W_F16)
        return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); /* bf16 */
}

/* One k step of an R x T tile at element k: full (a constant) loads 16
 * elements unmasked, otherwise the lanes in `keep` (the rest are 0). A
 * full step is what a masked step with every lane kept did, so the tiles
 * give the bits they gave when every step was masked. */
static MF_TARGET MF_AI void mf_step(__m512 acc[8][8], const void *const *w, const float *const *x,
                                    const int R, const int T, enum kern_wtype wt, int k,
                                    __mmask16 keep, const bool full) {
    __m512 wv[8];
#pragma GCC unroll 8
    for (int i = 0; i < R; i++)
        wv[i] = full ? mf_load_w_full(wt, w[i], k) : mf_load_w(wt, w[i], k, keep);
#pragma GCC unroll 8
    for (int j = 0; j < T; j++) {
        const __m512 xv = full ? _mm512_loadu_ps(x[j] + k) : _mm512_maskz_loadu_ps(keep, x[j] + k);
#pragma GCC unroll 8
        for (int i = 0; i < R; i++)
            acc[i][j] = _mm512_fmadd_ps(wv[i], xv, acc[i][j]);
    }
}

/* The steps run unmasked but for the last when n_in is not a multiple of
 * 16: with a mask on every step the 4 x 6 f16 tile ran at 1/1.2 of this
 * speed (1536 x 168 x 84 tokens in L2, one thread; docs/benchmarks.md,
 * "f16 prefill: a mask on the tail step only (Xeon)"). */
static MF_TARGET MF_AI void mf_tile(const struct kern_mm *m, int r, int t, const int R, const int T,
                                    enum kern_wtype wt, const bool pf) {
    const int n = m->n_in;
    const void *w[8];
    const float *x[8];
    __m512 acc[8][8];
#pragma GCC unroll 8
    for (int i = 0; i < R; i++)
        w[i] = (const char *)m->w + (size_t)(r + i) * m->w_stride;
#pragma GCC unroll 8
    for (int j = 0; j < T; j++)
        x[j] = (const float *)((const char *)m->act + (size_t)(t + j) * m->act_stride);
#pragma GCC unroll 8
    for (int i = 0; i < R; i++)
#pragma GCC unroll 8
        for (int j = 0; j < T; j++)
            acc[i][j] = _mm512_setzero_ps();
    const size_t esz = wt == KERN_W_F32 ? 4 : 2;
    int k = 0;
    for (; k + 16 <= n; k += 16) {
        if (T == 1) { /* one token (decode, and prefill's single-token leftovers): the
                       * next tile into L2 where the CPU gains from it (kern_rows_prefetch) */
            if (pf)
                kern_cpu_prefetch_next_l2(w[0], (size_t)R * m->w_stride, (size_t)R * 16 * esz,
                                          k / 16);
        } else {
            kern_cpu_prefetch_next(w[0], (size_t)R * m->w_stride, (size_t)R * 16 * esz, k / 16);
        }
        mf_step(acc, w, x, R, T, wt, k, 0xFFFF, true);
    }
    if (k < n)
        mf_step(acc, w, x, R, T, wt, k, (__mmask16)((1u << (unsigned)(n - k)) - 1), false);
#pragma GCC unroll 8
    for (int i = 0; i < R; i++)
#pragma GCC unroll 8
        for (int j = 0; j < T; j++)
            m->y[(size_t)(t + j) * m->n_out + r + i] = mf_hsum16(acc[i][j]);
}

/* R rows (a constant) from r x tokens [t0, t1): MF_T-token tiles, then at
 * most one of 4 and 2 tokens, then a single token. */
static MF_TARGET MF_AI void mf_row_tokens(const struct kern_mm *m, int r, int t0, int t1,
                                          const int R, enum kern_wtype wt, const bool pf) {
    int t = t0;
    for (; t + MF_T <= t1; t += MF_T)
        mf_tile(m, r, t, R, MF_T, wt, pf);
    if (t + 4 <= t1) {
        mf_tile(m, r, t, R, 4, wt, pf);
        t += 4;
    }
    if (t + 2 <= t1) {
        mf_tile(m, r, t, R, 2, wt, pf);
        t += 2;
    }
    for (; t < t1; t++)
        mf_tile(m, r, t, R, 1, wt, pf);
}

/* Rows [r0, r1) x tokens [t0, t1): 4 x 6 tiles for prefill, then at most
 * one of 4 x 4 and 4 x 2 before a single token, 8 x 1 for decode, smaller
 * ones at the edges. */
static MF_TARGET MF_AI void mf_rect(const struct kern_mm *m, int r0, int r1, int t0, int t1,
                                    enum kern_wtype wt, const bool pf) {
    int r = r0;
    if (t1 - t0 >= 4) {
        for (; r + MF_R <= r1; r += MF_R)
            mf_row_tokens(m, r, t0, t1, MF_R, wt, pf);
        for (; r < r1; r++)
            mf_row_tokens(m, r, t0, t1, 1, wt, pf);
        return;
    }
    for (; r + 8 <= r1; r += 8)
        for (int t = t0; t < t1; t++)
            mf_tile(m, r, t, 8, 1, wt, pf);
    for (; r < r1; r++)
        for (int t = t0; t < t1; t++)
            mf_tile(m, r, t, 1, 1, wt, pf);
}

/* Each type twice: with the decode tile's software prefetch (_pf) and
 * without it (kern_rows_prefetch picks). */
#define MF_RECT(name, wt)                                                                          \
    static MF_TARGET void name##_pf(const struct kern_mm *m, int r0, int r1, int t0, int t1) {     \
        mf_rect(m, r0, r1, t0, t1, wt, true);                                                      \
    }                                                                                              \
    static MF_TARGET void name(const struct kern_mm *m, int r0, int r1, int t0, int t1) {          \
        mf_rect(m, r0, r1, t0, t1, wt, false);                                                     \
    }
MF_RECT(mf_rect_f32, KERN_W_F32)
MF_RECT(mf_rect_f16, KERN_W_F16)
MF_RECT(mf_rect_bf16, KERN_W_BF16)

kern_cpu_rect_fn kern_cpu_rect_avx512(enum kern_wtype t) {
    switch (t) {
    case KERN_W_F32:
        return kern_rows_prefetch() ? mf_rect_f32_pf : mf_rect_f32;
    case KERN_W_F16:
        return kern_rows_prefetch() ? mf_rect_f16_pf : mf_rect_f16;
    case KERN_W_BF16:
        return kern_rows_prefetch() ? mf_rect_bf16_pf : mf_rect_bf16;
    case KERN_W_Q8_0:
        return mmq_avx512_rect_q8_0;
    case KERN_W_Q4_0:
        return mmq_avx512_rect_q4_0;
    default:
        return NULL;
    }
}
