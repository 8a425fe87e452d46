/* pack_k_avx512.c - the AVX512 kernel for repacked Q4_K/Q5_K/Q6_K matrices
 * at the avx512 and amx levels (the layout, and this sequence's model, are
 * in pack_k.c: "one integer a block").
 *
 * Per record (one 256-block of 16 rows), per token: for each sub-block s,
 * one vpdpbusd per lane k (the 64-byte load of elements 4k..4k+3 of every
 * row, nibbles unpacked with and/shift, Q5_K's fifth bit or Q6_K's upper
 * two merged with one vpternlogd, against the token's four activations
 * broadcast) adds the row's four products to the sub-block's int32; eight
 * (Q6_K: four) lanes make the sub-block's dot, which one vpmulld by the
 * rows' scales (widened to int32) adds to the block's integer. Q6_K's -32:
 * the quants go in unsigned (0..63) and the integer starts at -32 times
 * the sum over sub-blocks of sc_s X16_s (X16: the token's 16-sums, from
 * the q8Ks row; 8 vpdpwssd of scale pairs). Q4_K/Q5_K mins: one vpmaddwd
 * per pair of sub-blocks of the rows' min pairs with the token's 32-sums,
 * summed. Then per block two fmas (one for Q6_K) on 16 rows a vector:
 * acc = fma(d_w d_x, isum, acc), acc = fma(-(d_x dmin), msum, acc). Every
 * integer is exact, so this is pack_k.c's one-sum sequence bit for bit,
 * and the amx level's (pack_amx.c) and the rows' at these levels
 * (matmul_k_avx2.c run one-sum).
 *
 * Work per record and token (Q4_K, 4096 weights): 64 vpdpbusd, 8 vpmulld
 * (two uops each), 4 vpmaddwd, a few adds and floats; on Sapphire Rapids
 * the 512-bit integer multiplies issue on port 0 alone, so ~84 cycles for
 * 2368 bytes, where the per-lane float sequence this replaces (ggml's AVX2
 * order: vpmaddubsw + vpdpwssd per 64 bytes, 8 float lanes) took ~130
 * (docs/benchmarks.md, "K-quant packs in one integer a block"). Q6_K: 64
 * vpdpbusd, 16 vpmulld, 8 vpdpwssd.
 *
 * Tiles: one group (16 rows) x T tokens (up to 6, each unpacked vector
 * serving more tokens: 1.07-1.14x tiles of 4 on the Xeon, three
 * interleaved rounds, though GCC then spills some Q6_K vectors to L1).
 * The sub-block sums run in 2T independent vpdpbusd chains, so a single
 * token has
 * enough parallel work: decode is one group x one token. Prefill shares
 * each unpacked vector between tokens. Each record step prefetches
 * (pkk_prefetch): without a prefetch one thread decoded q4_k_m at 0.40 of
 * the read roofline (Zen 5, docs/benchmarks.md, "Software prefetch in the
 * packed kernels"); the L2 prefetch ahead ran one thread's decode product
 * 1.15x (Q4_K) and 1.27x (Q6_K) the speed of the L1 prefetch of the next
 * group on the Xeon ("Decode prefetch into L2 a few KiB ahead (Xeon)").
 */
#include "kernels/cpu/kern_avx512.h"
#include "kernels/cpu/kern_cpu.h"

#include <immintrin.h>

#define PKK_TARGET KERN_AVX512_TARGET
#define PKK_AI     __attribute__((always_inline)) inline
#define QK         KERN_QK_K
#define PKK_MAXT   6 /* tokens per prefill tile */

/* Record b of a tile's group (a run of nb records from base): a one-token
 * tile (decode, and a prefill's single-token leftovers) prefetches its own
 * stream into L2 a few KiB ahead (kern_cpu_prefetch_ahead; the next
 * group's start comes with it), a prefill tile the same step of the next
 * group into L1 (kern_cpu_prefetch_next); docs/benchmarks.md, "Software
 * prefetch in the packed kernels" and "Decode prefetch into L2 a few KiB
 * ahead (Xeon)". */
static PKK_TARGET PKK_AI void pkk_prefetch(const uint8_t *base, size_t rec, int nb, int b,
                                           const int T) {
    if (T == 1)
        kern_cpu_prefetch_ahead(base + rec * (size_t)b, rec);
    else
        kern_cpu_prefetch_next(base, rec * (size_t)nb, rec, b);
}

/* Tokens [t, t + T) of group g: the 16 rows' results (those that exist). */
static PKK_TARGET PKK_AI void pkk_store(const struct kern_mm *m, int g, int t, const int T,
                                        const __m512 *acc) {
    const int r = g * KERN_PACK_ROWS, left = m->n_out - r;
    const __mmask16 keep = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
#pragma GCC unroll 6
    for (int j = 0; j < T; j++)
        _mm512_mask_storeu_ps(m->y + (size_t)(t + j) * m->n_out + r, keep, acc[j]);
}

/* Q4_K / Q5_K: group g x tokens [t, t + T). */
static PKK_TARGET PKK_AI void pkk_tile45(const struct kern_mm *m, int g, int t, const int T,
                                         const enum kern_wtype wt) {
    const int n = m->n_in, nb = n / QK;
    const bool q5 = wt == KERN_W_Q5_K;
    const size_t rec = kern_cpu_pack_k_rec_bytes(wt), qs_at = q5 ? KERN_PK_Q5K_QS : KERN_PK_Q4K_QS;
    const uint8_t *base = (const uint8_t *)m->w + rec * (size_t)g * nb;
    const int8_t *xq[PKK_MAXT];
    const float *xd[PKK_MAXT];
    const int16_t *xs[PKK_MAXT];
    __m512 acc[PKK_MAXT];
    const __m512i m4 = _mm512_set1_epi8(0x0F), b4 = _mm512_set1_epi8(0x10);
#pragma GCC unroll 6
    for (int j = 0; j < T; j++) {
        xq[j] = (const int8_t *)m->act + (size_t)(t + j) * m->act_stride;
        xd[j] = kern_cpu_act_q8K_d(xq[j], n);
        xs[j] = kern_cpu_act_q8K_s32(xq[j], n);
        acc[j] = _mm512_setzero_ps();
    }
    for (int b = 0; b < nb; b++) {
        const uint8_t *rp = base + rec * (size_t)b;
        pkk_prefetch(base, rec, nb, b, T);
        __m512i isum[PKK_MAXT];
#pragma GCC unroll 6
        for (int j = 0; j < T; j++)
            isum[j] = _mm512_setzero_si512();
#pragma GCC unroll 6
        for (int c = 0; c < 4; c++) {
            /* sub-blocks 2c (the low nibbles) and 2c + 1 (the high ones) */
            __m512i alo[PKK_MAXT], ahi[PKK_MAXT];
#pragma GCC unroll 6
            for (int j = 0; j < T; j++)
                alo[j] = ahi[j] = _mm512_setzero_si512();
#pragma GCC unroll 8
            for (int k = 0; k < 8; k++) {
                const __m512i v = _mm512_loadu_si512(rp + qs_at + 64 * (4 * k + c));
                __m512i lo, hi;
                if (q5) {
                    /* qh bit 2c (2c + 1) is the 16 of sub-block 2c (2c + 1) */
                    const __m512i h = _mm512_loadu_si512(rp + KERN_PK_Q5K_QH + 64 * k);
                    lo = _mm512_ternarylogic_epi32(
                        v, _mm512_and_si512(kern_avx512_sh16(h, 4 - 2 * c), b4), m4,
                        KERN_AVX512_SEL);
                    hi = _mm512_ternarylogic_epi32(
                        _mm512_srli_epi16(v, 4),
                        _mm512_and_si512(kern_avx512_sh16(h, 3 - 2 * c), b4), m4, KERN_AVX512_SEL);
                } else {
                    lo = _mm512_and_si512(v, m4);
                    hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
                }
#pragma GCC unroll 6
                for (int j = 0; j < T; j++) {
                    const int8_t *x = xq[j] + QK * b + 64 * c + 4 * k;
                    alo[j] = _mm512_dpbusd_epi32(alo[j], lo, kern_avx512_bcast4(x));
                    ahi[j] = _mm512_dpbusd_epi32(ahi[j], hi, kern_avx512_bcast4(x + 32));
                }
            }
            const __m512i slo = _mm512_cvtepu8_epi32(
                _mm_loadu_si128((const __m128i *)(rp + KERN_PK_K45_SC + 32 * c)));
            const __m512i shi = _mm512_cvtepu8_epi32(
                _mm_loadu_si128((const __m128i *)(rp + KERN_PK_K45_SC + 32 * c + 16)));
#pragma GCC unroll 6
            for (int j = 0; j < T; j++)
                isum[j] =
                    _mm512_add_epi32(isum[j], _mm512_add_epi32(_mm512_mullo_epi32(alo[j], slo),
                                                               _mm512_mullo_epi32(ahi[j], shi)));
        }
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)rp));
        const __m512 dm = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(rp + 32)));
        /* the mins: pair i of sub-blocks (2i, 2i + 1), every row at once */
        __m512i mn[4];
        kern_avx512_k_mins(rp, mn);
#pragma GCC unroll 6
        for (int j = 0; j < T; j++) {
            const __m512 dx = _mm512_set1_ps(xd[j][b]);
            /* -(d_x dmin), negated before the fma as the portable model
             * does (a NaN dmin keeps the same sign) */
            const __m512 dmx = kern_avx512_neg_prod(dm, dx);
            const __m512i msum = kern_avx512_k_msum(mn, xs[j] + 8 * b);
            acc[j] = _mm512_fmadd_ps(_mm512_mul_ps(dw, dx), _mm512_cvtepi32_ps(isum[j]), acc[j]);
            acc[j] = _mm512_fmadd_ps(dmx, _mm512_cvtepi32_ps(msum), acc[j]);
        }
    }
    pkk_store(m, g, t, T, acc);
}

/* vpermw's index for int16 (a[l], b[l]) in dword l, from a at int16 0..15
 * and b at 16..31. */
static _Alignas(64) const int16_t pkk_pairs[32] = {0,  16, 1,  17, 2,  18, 3,  19, 4,  20, 5,
                                                   21, 6,  22, 7,  23, 8,  24, 9,  25, 10, 26,
                                                   11, 27, 12, 28, 13, 29, 14, 30, 15, 31};

/* Q6_K: group g x tokens [t, t + T). Chunk c's lanes 0..3 are its
 * sub-block 2c, lanes 4..7 its sub-block 2c + 1, so each half of the lanes
 * completes 8 sub-blocks; a pass over a half's four lanes and one of the
 * two 128-element halves (nh) completes 4. */
static PKK_TARGET PKK_AI void pkk_tile6(const struct kern_mm *m, int g, int t, const int T) {
    const int n = m->n_in, nb = n / QK;
    const size_t rec = kern_cpu_pack_k_rec_bytes(KERN_W_Q6_K);
    const uint8_t *base = (const uint8_t *)m->w + rec * (size_t)g * nb;
    const int8_t *xq[PKK_MAXT];
    const float *xd[PKK_MAXT];
    const int16_t *x16[PKK_MAXT];
    __m512 acc[PKK_MAXT];
    const __m512i m4 = _mm512_set1_epi8(0x0F), b45 = _mm512_set1_epi8(0x30);
    const __m512i pairs = _mm512_load_si512(pkk_pairs);
#pragma GCC unroll 6
    for (int j = 0; j < T; j++) {
        xq[j] = (const int8_t *)m->act + (size_t)(t + j) * m->act_stride;
        xd[j] = kern_cpu_act_q8K_d(xq[j], n);
        x16[j] = kern_cpu_act_q8Ks_x16(xq[j], n);
        acc[j] = _mm512_setzero_ps();
    }
    for (int b = 0; b < nb; b++) {
        const uint8_t *rp = base + rec * (size_t)b;
        pkk_prefetch(base, rec, nb, b, T);
        /* the -32 of q - 32: isum starts at -32 (sum over the 16 sub-blocks
         * of sc_s X16_s), the scale pairs (sc_2i, sc_2i+1) against the
         * token's 16-sums (X16_2i, X16_2i+1) */
        __m512i isum[PKK_MAXT];
        {
            __m512i sp[8];
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++)
                sp[i] = _mm512_permutexvar_epi16(
                    pairs, _mm512_cvtepi8_epi16(_mm256_loadu_si256(
                               (const __m256i *)(rp + KERN_PK_Q6K_SC + 32 * i))));
#pragma GCC unroll 6
            for (int j = 0; j < T; j++) {
                __m512i o = _mm512_setzero_si512();
#pragma GCC unroll 8
                for (int i = 0; i < 8; i++)
                    o = _mm512_dpwssd_epi32(o, sp[i], kern_avx512_bcast4(x16[j] + 16 * b + 2 * i));
                isum[j] = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(o, 5));
            }
        }
        /* chunk c = 4nh + r (r = p + 2i): ql byte p's low (i = 0) or high
         * nibble, qh bits 2r, 2r + 1; its lanes of this half are
         * sub-block 2c + half */
#pragma GCC unroll 2
        for (int half = 0; half < 2; half++)
#pragma GCC unroll 2
            for (int nh = 0; nh < 2; nh++)
#pragma GCC unroll 2
                for (int p = 0; p < 2; p++) {
                    __m512i a[2][PKK_MAXT];
#pragma GCC unroll 2
                    for (int i = 0; i < 2; i++)
#pragma GCC unroll 6
                        for (int j = 0; j < T; j++)
                            a[i][j] = _mm512_setzero_si512();
#pragma GCC unroll 6
                    for (int kk = 0; kk < 4; kk++) {
                        const int k = 4 * half + kk;
                        const __m512i l =
                            _mm512_loadu_si512(rp + KERN_PK_Q6K_QL + 64 * (4 * k + 2 * nh + p));
                        const __m512i h =
                            _mm512_loadu_si512(rp + KERN_PK_Q6K_QH + 64 * (2 * k + nh));
#pragma GCC unroll 2
                        for (int i = 0; i < 2; i++) {
                            const int r = p + 2 * i;
                            const __m512i q = _mm512_ternarylogic_epi32(
                                i ? _mm512_srli_epi16(l, 4) : l,
                                _mm512_and_si512(kern_avx512_sh16(h, 4 - 2 * r), b45), m4,
                                KERN_AVX512_SEL);
#pragma GCC unroll 6
                            for (int j = 0; j < T; j++)
                                a[i][j] = _mm512_dpbusd_epi32(
                                    a[i][j], q,
                                    kern_avx512_bcast4(xq[j] + QK * b + 32 * (4 * nh + r) + 4 * k));
                        }
                    }
#pragma GCC unroll 2
                    for (int i = 0; i < 2; i++) {
                        const int s = 2 * (4 * nh + p + 2 * i) + half;
                        const __m512i sc = _mm512_cvtepi8_epi32(
                            _mm_loadu_si128((const __m128i *)(rp + KERN_PK_Q6K_SC + 16 * s)));
#pragma GCC unroll 6
                        for (int j = 0; j < T; j++)
                            isum[j] = _mm512_add_epi32(isum[j], _mm512_mullo_epi32(a[i][j], sc));
                    }
                }
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)rp));
#pragma GCC unroll 6
        for (int j = 0; j < T; j++)
            acc[j] = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(xd[j][b])),
                                     _mm512_cvtepi32_ps(isum[j]), acc[j]);
    }
    pkk_store(m, g, t, T, acc);
}

static PKK_TARGET PKK_AI void pkk_tile(const struct kern_mm *m, int g, int t, const int T,
                                       const enum kern_wtype wt) {
    if (wt == KERN_W_Q6_K)
        pkk_tile6(m, g, t, T);
    else
        pkk_tile45(m, g, t, T, wt);
}

/* Rows [r0, r1) (r0 a multiple of 16) x tokens [t0, t1): tiles of 6
 * tokens, the last 1 to 5 tokens of a group in one tile of their own. */
static PKK_TARGET PKK_AI void pkk_rect(const struct kern_mm *m, int r0, int r1, int t0, int t1,
                                       const enum kern_wtype wt) {
    const int g1 = (r1 + KERN_PACK_ROWS - 1) / KERN_PACK_ROWS;
    for (int g = r0 / KERN_PACK_ROWS; g < g1; g++) {
        int t = t0;
        for (; t + PKK_MAXT <= t1; t += PKK_MAXT)
            pkk_tile(m, g, t, PKK_MAXT, wt);
        switch (t1 - t) {
        case 5:
            pkk_tile(m, g, t, 5, wt);
            break;
        case 4:
            pkk_tile(m, g, t, 4, wt);
            break;
        case 3:
            pkk_tile(m, g, t, 3, wt);
            break;
        case 2:
            pkk_tile(m, g, t, 2, wt);
            break;
        case 1:
            pkk_tile(m, g, t, 1, wt);
            break;
        default:
            break;
        }
    }
}

static PKK_TARGET void pkk_rect_q4_K(const struct kern_mm *m, int r0, int r1, int t0, int t1) {
    pkk_rect(m, r0, r1, t0, t1, KERN_W_Q4_K);
}
static PKK_TARGET void pkk_rect_q5_K(const struct kern_mm *m, int r0, int r1, int t0, int t1) {
    pkk_rect(m, r0, r1, t0, t1, KERN_W_Q5_K);
}
static PKK_TARGET void pkk_rect_q6_K(const struct kern_mm *m, int r0, int r1, int t0, int t1) {
    pkk_rect(m, r0, r1, t0, t1, KERN_W_Q6_K);
}

kern_cpu_rect_fn kern_cpu_pack_k_rect_avx512(enum kern_wtype t) {
    switch (t) {
    case KERN_W_Q4_K:
        return pkk_rect_q4_K;
    case KERN_W_Q5_K:
        return pkk_rect_q5_K;
    case KERN_W_Q6_K:
        return pkk_rect_q6_K;
    default:
        return NULL;
    }
}
