/* pack_avx2.c - the AVX2 kernel for repacked Q8_0/Q4_0 matrices (the
 * layout and the per-element sequences are in pack.c); also the AVX-VNNI
 * level's.
 *
 * A ymm register holds half a record's 64-byte lane chunk: four weights of
 * each of 8 rows, so a tile is one record half (8 rows) and one token
 * (Q8_0), or for Q4_0 a half and four tokens (prefill) or both halves and
 * one token (decode: the token's broadcasts serve 16 rows, and the halves
 * are two independent chains; 1.09x the one-half tile in a decode sweep
 * on a Zen 3, 0.85-0.93 of a read of the same bytes). Per record half: the 8 scales in one
 * vcvtph2ps and one multiply by the token's d_x; then per lane L the
 * 32-byte load and the token's 4 activations broadcast:
 *  - Q8_0: the stored byte is w + 128; w = byte ^ 0x80, and maddubs takes
 *    |w| (unsigned) and x * sign(w), madd widens, and int32 lane l is row
 *    l's exact lane sum (pair sums within 2 * 128 * 127: x is in [-127,
 *    127], kern_cpu_act_q8); the eight lanes add up, as int32 in two
 *    chains, to row l's block sum, then one conversion and one fma with
 *    d_w * d_x for all 8 rows;
 *  - Q4_0: the nibbles u (0..15) of the 8 lanes (four loads, each two
 *    lanes), maddubs against x, and the eight int16 pair sums added as
 *    int16 (|sum| <= 8 * 2 * 15 * 127 = 30480: exact), widened once by
 *    madd: row l's block sum in lane l, plus the block's offset ob; then
 *    one conversion and one fma with d_w * d_x for all 8 rows. The
 *    unpacked nibbles serve the 4 tokens of a tile.
 * Both are pack.c's sequences, so the bits of every level and of the AVX2
 * rows path.
 *
 * Q8_0 against the rows kernel (matmul_q.h, 8 x 1 for decode): one scale
 * conversion and one d_w * d_x product serve 8 rows instead of one. A
 * group's two halves and the tokens of a pass run in turn on its records,
 * which stay in L1/L2 after the first half's pass (a group of 16 rows x
 * 4096 Q4_0 weights is 36 KiB). Each half's pass over the first token
 * prefetches half of the next group's records (prefetching all of them in
 * the first pass left the DRAM idle in the second: Q8_0 decode was
 * 0.78-0.92x of the rows, 0.98-1.12x after).
 *
 * Used for Q4_0 at the avx2 and avx-vnni levels (pack.c says which levels
 * pack which type), decode and prefill. The Q8_0 kernel runs when a Q8_0
 * pack meets these levels (kern_pack_make packs any packed type whatever
 * the level; the tests run every level on one). */
#include "kernels/cpu/kern_avx2.h"

#include <immintrin.h>
#include <stdbool.h>
#include <string.h>

#define PK2_AI __attribute__((always_inline)) inline

/* Q8_0: rows 8h..8h+7 of group g (h 0 or 1) x token t; pf: prefetch the
 * next group's records on the way. */
static KERN_AVX2 PK2_AI void pk2_half(const struct kern_mm *m, int g, int h, int t, bool pf) {
    const int n = m->n_in, nb = n / KERN_QK;
    const size_t rec = kern_cpu_pack_rec_bytes(KERN_W_Q8_0);
    const uint8_t *base = (const uint8_t *)m->w + rec * (size_t)g * nb;
    const int8_t *xq = (const int8_t *)m->act + (size_t)t * m->act_stride;
    const float *xd = (const float *)(xq + n);
    const __m256i ones = _mm256_set1_epi16(1), flip = _mm256_set1_epi8((char)0x80);
    __m256 acc = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *r = base + rec * (size_t)b;
        if (pf) /* the next group's records, half of them a pass */
            kern_cpu_prefetch_next(base, rec * (size_t)nb + (rec / 2) * (size_t)(h * nb), rec / 2,
                                   b);
        const __m256 sc = _mm256_mul_ps(
            _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(r + 16 * h))), _mm256_set1_ps(xd[b]));
        const uint8_t *q = r + 32 + 32 * h;
        const int8_t *x = xq + (size_t)b * KERN_QK;
        __m256i sum[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
#pragma GCC unroll 8
        for (int L = 0; L < 8; L++) {
            const __m256i xb = kern_avx2_bcast4(x + 4 * L);
            const __m256i w =
                _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(q + 64 * L)), flip);
            sum[L % 2] = _mm256_add_epi32(
                sum[L % 2],
                _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(xb, w)),
                                  ones));
        }
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(sum[0], sum[1])), sc, acc);
    }
    const int r0 = g * KERN_PACK_ROWS + 8 * h;
    kern_avx2_store8(m->y + (size_t)t * m->n_out, r0, m->n_out - r0, acc);
}

/* Q4_0: rows 8h..8h+7 of group g x tokens t..t+3 (prefill). Per block
 * the 8 lanes' maddubs pair sums are added as int16 (|sum| <= 8 * 2 * 15 *
 * 127 = 30480: exact), widened once by madd to row l's block sum in lane
 * l, offset by the block's ob, then acc = fma((float)sum, d_w * d_x, acc). */
static KERN_AVX2 PK2_AI void pk2_q4_tile(const struct kern_mm *m, int g, int h, int t, bool pf) {
    enum { T = 4 };
    const int n = m->n_in, nb = n / KERN_QK;
    const size_t rec = kern_cpu_pack_rec_bytes(KERN_W_Q4_0);
    const uint8_t *base = (const uint8_t *)m->w + rec * (size_t)g * nb;
    const int8_t *xq[4];
    const float *xd[4];
    const int32_t *xob[4];
#pragma GCC unroll 4
    for (int j = 0; j < T; j++) {
        xq[j] = (const int8_t *)m->act + (size_t)(t + j) * m->act_stride;
        xd[j] = (const float *)(xq[j] + n);
        xob[j] = (const int32_t *)(xd[j] + nb) + n / 4;
    }
    const __m256i ones = _mm256_set1_epi16(1), low4 = _mm256_set1_epi8(0x0F);
    __m256 acc[4];
#pragma GCC unroll 4
    for (int j = 0; j < T; j++)
        acc[j] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *r = base + rec * (size_t)b;
        if (pf)
            kern_cpu_prefetch_next(base, rec * (size_t)nb + (rec / 2) * (size_t)(h * nb), rec / 2,
                                   b);
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(r + 16 * h)));
        const uint8_t *q = r + 32 + 32 * h;
        __m256i u[8];
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(q + 64 * k));
            u[2 * k] = _mm256_and_si256(v, low4);
            u[2 * k + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
        }
#pragma GCC unroll 4
        for (int j = 0; j < T; j++) {
            const int8_t *x = xq[j] + (size_t)b * KERN_QK;
            __m256i s16 = _mm256_maddubs_epi16(u[0], kern_avx2_bcast4(x));
#pragma GCC unroll 8
            for (int L = 1; L < 8; L++)
                s16 =
                    _mm256_add_epi16(s16, _mm256_maddubs_epi16(u[L], kern_avx2_bcast4(x + 4 * L)));
            const __m256i sum =
                _mm256_add_epi32(_mm256_madd_epi16(s16, ones), _mm256_set1_epi32(xob[j][b]));
            acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum),
                                     _mm256_mul_ps(dw, _mm256_set1_ps(xd[j][b])), acc[j]);
        }
    }
    const int r0 = g * KERN_PACK_ROWS + 8 * h;
#pragma GCC unroll 4
    for (int j = 0; j < T; j++)
        kern_avx2_store8(m->y + (size_t)(t + j) * m->n_out, r0, m->n_out - r0, acc[j]);
}

/* Q4_0, one token: both halves of group g (16 rows) at once, so the
 * token's activation broadcasts, scale and offset serve 16 rows and the
 * two halves' sums are independent chains; pk2_q4_tile's sequence per
 * row. pf: prefetch the next group's records. */
static KERN_AVX2 PK2_AI void pk2_q4_row16(const struct kern_mm *m, int g, int t, bool pf) {
    const int n = m->n_in, nb = n / KERN_QK;
    const size_t rec = kern_cpu_pack_rec_bytes(KERN_W_Q4_0);
    const uint8_t *base = (const uint8_t *)m->w + rec * (size_t)g * nb;
    const int8_t *xq = (const int8_t *)m->act + (size_t)t * m->act_stride;
    const float *xd = (const float *)(xq + n);
    const int32_t *xob = (const int32_t *)(xd + nb) + n / 4;
    const __m256i ones = _mm256_set1_epi16(1), low4 = _mm256_set1_epi8(0x0F);
    __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int b = 0; b < nb; b++) {
        const uint8_t *r = base + rec * (size_t)b;
        if (pf)
            kern_cpu_prefetch_next(base, rec * (size_t)nb, rec, b);
        const int8_t *x = xq + (size_t)b * KERN_QK;
        __m256i s16[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            const __m256i xa = kern_avx2_bcast4(x + 8 * k), xb = kern_avx2_bcast4(x + 8 * k + 4);
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)(r + 32 + 64 * k + 32 * h));
                s16[h] = _mm256_add_epi16(
                    s16[h],
                    _mm256_add_epi16(
                        _mm256_maddubs_epi16(_mm256_and_si256(v, low4), xa),
                        _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(v, 4), low4), xb)));
            }
        }
        const __m256i ob = _mm256_set1_epi32(xob[b]);
        const __m256 dx = _mm256_set1_ps(xd[b]);
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(r + 16 * h)));
            const __m256i sum = _mm256_add_epi32(_mm256_madd_epi16(s16[h], ones), ob);
            acc[h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(dw, dx), acc[h]);
        }
    }
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const int r0 = g * KERN_PACK_ROWS + 8 * h;
        kern_avx2_store8(m->y + (size_t)t * m->n_out, r0, m->n_out - r0, acc[h]);
    }
}

static KERN_AVX2 void pk2_rect_q4_0(const struct kern_mm *m, int r0, int r1, int t0, int t1) {
    const int g1 = (r1 + KERN_PACK_ROWS - 1) / KERN_PACK_ROWS;
    const int t4 = t0 + (t1 - t0) / 4 * 4; /* 4-token tiles up to here, then single tokens */
    for (int g = r0 / KERN_PACK_ROWS; g < g1; g++) {
        for (int h = 0; h < 2 && g * KERN_PACK_ROWS + 8 * h < r1; h++)
            for (int t = t0; t < t4; t += 4) /* a half's records stay in L1 across tiles */
                pk2_q4_tile(m, g, h, t, t == t0);
        for (int t = t4; t < t1; t++)
            pk2_q4_row16(m, g, t, t == t0);
    }
}

/* Q8_0: rows [r0, r1) (r0 a multiple of 16) x tokens [t0, t1): per group,
 * each half that holds a row, every token. */
static KERN_AVX2 void pk2_rect_q8_0(const struct kern_mm *m, int r0, int r1, int t0, int t1) {
    const int g1 = (r1 + KERN_PACK_ROWS - 1) / KERN_PACK_ROWS;
    for (int g = r0 / KERN_PACK_ROWS; g < g1; g++)
        for (int h = 0; h < 2 && g * KERN_PACK_ROWS + 8 * h < r1; h++)
            for (int t = t0; t < t1; t++)
                pk2_half(m, g, h, t, t == t0);
}

kern_cpu_rect_fn kern_cpu_pack_rect_avx2(enum kern_wtype t) {
    return t == KERN_W_Q8_0   ? pk2_rect_q8_0
           : t == KERN_W_Q4_0 ? pk2_rect_q4_0
                              : kern_cpu_pack_k_rect_avx2(t);
}
