/* pack_k_avx512.c - the AVX512 kernel for repacked Q4_K/Q5_K/Q6_K matrices
 * (the layout and the per-element sequence are in pack_k.c).
 *
 * Per record (one 256-block of 16 rows), per token: the 16 d (and dmin) in
 * one vcvtph2ps and one multiply by the token's d_x; each sub-block's 16
 * scales spread to int16 pairs (sc, sc), one per row's dword, by one
 * vpshufb of the 16 bytes broadcast (Q6_K: into the high bytes, then an
 * arithmetic shift sign-extends them). Then for lane k (0..7) and each
 * 32-chunk c: one 64-byte load holds elements 32c + 4k .. +3 of every row
 * (two chunks' nibbles for Q4_K/Q5_K, unpacked with and/shift, plus the
 * fifth or the upper two bits merged in with one vpternlogd);
 * vpmaddubsw against the token's four activations broadcast gives per row
 * the two int16 pair sums (at most 2 * 31 * 128, or 2 * 63 * 128 for
 * Q6_K's unsigned quants), and vpdpwssd with the chunk's scale pairs adds
 * sc times their sum to the row's lane k; Q6_K's -32 comes in as four more
 * vpdpwssd a lane, the rows' scale pairs of two chunks against the token's
 * -32 x sums: exact int32, the integer of the AVX2 tiles. Each lane is converted and fused into its
 * accumulator once per block, 16 rows a vector, the mins likewise (one
 * vpmaddwd of the rows' min pairs with the token's two 32-sums per pair of
 * sub-blocks), and the AVX2 trees run across the accumulators at the end.
 * So this runs pack_k.c's sequence: the portable kernel's bits, which are
 * the AVX2 level's on the rows.
 *
 * Work per record and token (Q4_K, 4096 weights): 32 loads, 48 and/shift,
 * 64 vpmaddubsw, 64 vpdpwssd, ~40 for the scales, mins and floats: ~250
 * uops, on Sapphire Rapids' two 512-bit ports (p0 and p5 both multiply;
 * shifts are p0's, shuffles p5's) ~130 cycles for 2368 bytes, several
 * times one core's share of DRAM bandwidth, so decode streams.
 *
 * Tiles: one group (16 rows) x T tokens. Lane k's integer runs in two
 * chains (even and odd chunks) of 2 or 4 vpdpwssd each, and the lanes are
 * independent, so a single token has enough parallel work: decode is one
 * group x one token. Prefill shares each unpacked vector between tokens;
 * the 8 scale vectors stay in registers and the float accumulators, touched
 * once per block, go to L1 when they do not fit. Each record step
 * prefetches the same step of the next group (kern_cpu_prefetch_next):
 * without it one thread decoded q4_k_m at 0.40 of the read roofline, the
 * "several times" above notwithstanding (docs/benchmarks.md).
 */
#include "kernels/cpu/kern_cpu.h"

#include <immintrin.h>
#include <string.h>

#define PKK_TARGET                                                                                 \
    __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512dq,avx512vnni")))
#define PKK_AI   __attribute__((always_inline)) inline
#define QK       KERN_QK_K
#define PKK_MAXT 4 /* tokens per prefill tile */

static PKK_TARGET PKK_AI __m512i pkk_bcast4(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

/* a << s (s > 0) or a >> -s as 16-bit lanes; s is a constant once inlined. */
static PKK_TARGET PKK_AI __m512i pkk_sh16(__m512i a, const int s) {
    return s > 0   ? _mm512_slli_epi16(a, (unsigned)s)
           : s < 0 ? _mm512_srli_epi16(a, (unsigned)-s)
                   : a;
}

/* vpternlogd's (a & c) | b: with c the 0x0F bytes, a's low nibble under
 * b's high bits; every b here is masked to bit 4 or bits 4..5, so it is
 * zero where a goes and the result is the 5- or 6-bit quant. */
#define PKK_SEL 0xEC

/* The 16 bytes at p (row l's at p[l]) as 16 int16 pairs, row l's in dword
 * l: zero-extended (idx from pkk_idx(false)) or sign-extended. */
static PKK_TARGET PKK_AI __m512i pkk_spread(const uint8_t *p, __m512i idx, const bool sgn) {
    const __m512i v =
        _mm512_shuffle_epi8(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)p)), idx);
    return sgn ? _mm512_srai_epi16(v, 8) : v;
}

static PKK_TARGET PKK_AI __m512i pkk_idx(const bool sgn) {
    /* dword l: bytes (l, zero, l, zero), or (zero, l, zero, l) */
    const __m512i l = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i pair = _mm512_or_si512(l, _mm512_slli_epi32(l, 16));
    return sgn ? _mm512_or_si512(_mm512_slli_epi32(pair, 8), _mm512_set1_epi32(0x00800080))
               : _mm512_or_si512(pair, _mm512_set1_epi32((int)0x80008000u));
}

/* The AVX2 tree of 8 lane accumulators. */
static PKK_TARGET PKK_AI __m512 pkk_tree8(const __m512 *a) {
    return _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a[0], a[4]), _mm512_add_ps(a[2], a[6])),
                         _mm512_add_ps(_mm512_add_ps(a[1], a[5]), _mm512_add_ps(a[3], a[7])));
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
    __m512 acc[PKK_MAXT][8], accm[PKK_MAXT][4];
    const __m512i m4 = _mm512_set1_epi8(0x0F), b4 = _mm512_set1_epi8(0x10), idx = pkk_idx(false);
#pragma GCC unroll 4
    for (int j = 0; j < T; j++) {
        xq[j] = (const int8_t *)m->act + (size_t)(t + j) * m->act_stride;
        xd[j] = kern_cpu_act_q8K_d(xq[j], n);
        xs[j] = kern_cpu_act_q8K_s32(xq[j], n);
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++)
            acc[j][k] = _mm512_setzero_ps();
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++)
            accm[j][i] = _mm512_setzero_ps();
    }
    for (int b = 0; b < nb; b++) {
        const uint8_t *rp = base + rec * (size_t)b;
        /* the next group (a tile is one group's run of records): docs/benchmarks.md,
         * "Software prefetch in the packed kernels" */
        kern_cpu_prefetch_next(base, rec * (size_t)nb, rec, b);
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)rp));
        const __m512 dm = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(rp + 32)));
        __m512 d[PKK_MAXT];
        /* the mins: pair i of sub-blocks (2i, 2i + 1), every row at once */
        __m512i mn[4];
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++)
            mn[i] = _mm512_cvtepu8_epi16(
                _mm256_loadu_si256((const __m256i *)(rp + KERN_PK_K45_MN + 32 * i)));
#pragma GCC unroll 4
        for (int j = 0; j < T; j++) {
            const __m512 dx = _mm512_set1_ps(xd[j][b]);
            d[j] = _mm512_mul_ps(dw, dx);
            /* accm += -(d_x dmin) * mins, negated before the fma as the
             * portable kernel does (a NaN dmin keeps the same sign) */
            const __m512 dmx = _mm512_castsi512_ps(_mm512_xor_si512(
                _mm512_castps_si512(_mm512_mul_ps(dm, dx)), _mm512_set1_epi32((int)0x80000000u)));
            __m512i p[4];
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++)
                p[i] = _mm512_madd_epi16(mn[i], pkk_bcast4(xs[j] + 8 * b + 2 * i));
            if (q5) {
                const __m512i s =
                    _mm512_add_epi32(_mm512_add_epi32(p[0], p[1]), _mm512_add_epi32(p[2], p[3]));
                accm[j][0] = _mm512_fmadd_ps(dmx, _mm512_cvtepi32_ps(s), accm[j][0]);
            } else {
#pragma GCC unroll 4
                for (int i = 0; i < 4; i++)
                    accm[j][i] = _mm512_fmadd_ps(dmx, _mm512_cvtepi32_ps(p[i]), accm[j][i]);
            }
        }
        __m512i sc[8];
#pragma GCC unroll 8
        for (int s = 0; s < 8; s++)
            sc[s] = pkk_spread(rp + KERN_PK_K45_SC + 16 * s, idx, false);
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            __m512i la[PKK_MAXT], lb[PKK_MAXT];
            __m512i h = _mm512_setzero_si512();
            if (q5)
                h = _mm512_loadu_si512(rp + KERN_PK_Q5K_QH + 64 * k);
#pragma GCC unroll 4
            for (int j = 0; j < T; j++)
                la[j] = lb[j] = _mm512_setzero_si512();
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) {
                const __m512i v = _mm512_loadu_si512(rp + qs_at + 64 * (4 * k + c));
                __m512i lo, hi;
                if (q5) {
                    /* qh bit 2c (2c + 1) is the 16 of sub-block 2c (2c + 1) */
                    lo = _mm512_ternarylogic_epi32(v, _mm512_and_si512(pkk_sh16(h, 4 - 2 * c), b4),
                                                   m4, PKK_SEL);
                    hi = _mm512_ternarylogic_epi32(_mm512_srli_epi16(v, 4),
                                                   _mm512_and_si512(pkk_sh16(h, 3 - 2 * c), b4), m4,
                                                   PKK_SEL);
                } else {
                    lo = _mm512_and_si512(v, m4);
                    hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
                }
#pragma GCC unroll 4
                for (int j = 0; j < T; j++) {
                    const int8_t *x = xq[j] + QK * b + 64 * c + 4 * k;
                    la[j] = _mm512_dpwssd_epi32(la[j], _mm512_maddubs_epi16(lo, pkk_bcast4(x)),
                                                sc[2 * c]);
                    lb[j] = _mm512_dpwssd_epi32(lb[j], _mm512_maddubs_epi16(hi, pkk_bcast4(x + 32)),
                                                sc[2 * c + 1]);
                }
            }
#pragma GCC unroll 4
            for (int j = 0; j < T; j++)
                acc[j][k] = _mm512_fmadd_ps(
                    d[j], _mm512_cvtepi32_ps(_mm512_add_epi32(la[j], lb[j])), acc[j][k]);
        }
    }
    const int r = g * KERN_PACK_ROWS, left = m->n_out - r;
    const __mmask16 keep = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
#pragma GCC unroll 4
    for (int j = 0; j < T; j++) {
        __m512 y = pkk_tree8(acc[j]);
        if (q5)
            y = _mm512_add_ps(y, accm[j][0]);
        else
            y = _mm512_add_ps(y, _mm512_add_ps(_mm512_add_ps(accm[j][0], accm[j][2]),
                                               _mm512_add_ps(accm[j][1], accm[j][3])));
        _mm512_mask_storeu_ps(m->y + (size_t)(t + j) * m->n_out + r, keep, y);
    }
}

/* Q6_K: group g x tokens [t, t + T). Lanes 0..3 take the even 16-scales
 * (elements 0..15 of each 32-chunk), lanes 4..7 the odd ones, so each half
 * of the k loop holds 8 scale vectors. */
static PKK_TARGET PKK_AI void pkk_tile6(const struct kern_mm *m, int g, int t, const int T) {
    const int n = m->n_in, nb = n / QK;
    const size_t rec = kern_cpu_pack_k_rec_bytes(KERN_W_Q6_K);
    const uint8_t *base = (const uint8_t *)m->w + rec * (size_t)g * nb;
    const int8_t *xq[PKK_MAXT];
    const float *xd[PKK_MAXT];
    const int32_t *xo[PKK_MAXT];
    __m512 acc[PKK_MAXT][8];
    const __m512i m4 = _mm512_set1_epi8(0x0F), b45 = _mm512_set1_epi8(0x30), idx = pkk_idx(true);
#pragma GCC unroll 4
    for (int j = 0; j < T; j++) {
        xq[j] = (const int8_t *)m->act + (size_t)(t + j) * m->act_stride;
        xd[j] = kern_cpu_act_q8K_d(xq[j], n);
        xo[j] = (const int32_t *)((const char *)xq[j] + kern_cpu_act_q8K_bytes(n));
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++)
            acc[j][k] = _mm512_setzero_ps();
    }
    for (int b = 0; b < nb; b++) {
        const uint8_t *rp = base + rec * (size_t)b;
        kern_cpu_prefetch_next(base, rec * (size_t)nb, rec, b); /* the next group */
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)rp));
        __m512 d[PKK_MAXT];
#pragma GCC unroll 4
        for (int j = 0; j < T; j++)
            d[j] = _mm512_mul_ps(dw, _mm512_set1_ps(xd[j][b]));
#pragma GCC unroll 2
        for (int half = 0; half < 2; half++) {
            __m512i sc[8]; /* chunk c's scale for this half: 16-group 2c + half */
#pragma GCC unroll 8
            for (int c = 0; c < 8; c++)
                sc[c] = pkk_spread(rp + KERN_PK_Q6K_SC + 16 * (2 * c + half), idx, true);
            __m512i sc2[4]; /* chunks 2i, 2i + 1: the pairs (sc_2i, sc_2i+1) */
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++)
                sc2[i] = _mm512_mask_blend_epi16((__mmask32)0xAAAAAAAAu, sc[2 * i], sc[2 * i + 1]);
#pragma GCC unroll 4
            for (int kk = 0; kk < 4; kk++) {
                const int k = 4 * half + kk;
                __m512i la[PKK_MAXT], lb[PKK_MAXT];
                /* the -32: lb = sum over chunk pairs of the rows' scale
                 * pairs . the token's -32 x sums */
#pragma GCC unroll 4
                for (int j = 0; j < T; j++) {
                    la[j] = lb[j] = _mm512_setzero_si512();
#pragma GCC unroll 4
                    for (int i = 0; i < 4; i++)
                        lb[j] = _mm512_dpwssd_epi32(lb[j], sc2[i],
                                                    _mm512_set1_epi32(xo[j][32 * b + 4 * k + i]));
                }
#pragma GCC unroll 2
                for (int nh = 0; nh < 2; nh++) {
                    const uint8_t *ql = rp + KERN_PK_Q6K_QL + 64 * (4 * k + 2 * nh);
                    const __m512i l0 = _mm512_loadu_si512(ql), l1 = _mm512_loadu_si512(ql + 64);
                    const __m512i h = _mm512_loadu_si512(rp + KERN_PK_Q6K_QH + 64 * (2 * k + nh));
                    __m512i q[4]; /* chunk 4nh + r: low 4 bits, and qh bits 2r, 2r + 1 */
                    q[0] = _mm512_ternarylogic_epi32(
                        l0, _mm512_and_si512(_mm512_slli_epi16(h, 4), b45), m4, PKK_SEL);
                    q[1] = _mm512_ternarylogic_epi32(
                        l1, _mm512_and_si512(_mm512_slli_epi16(h, 2), b45), m4, PKK_SEL);
                    q[2] = _mm512_ternarylogic_epi32(_mm512_srli_epi16(l0, 4),
                                                     _mm512_and_si512(h, b45), m4, PKK_SEL);
                    q[3] = _mm512_ternarylogic_epi32(_mm512_srli_epi16(l1, 4),
                                                     _mm512_and_si512(_mm512_srli_epi16(h, 2), b45),
                                                     m4, PKK_SEL);
#pragma GCC unroll 4
                    for (int r = 0; r < 4; r++) {
                        const int c = 4 * nh + r, e0 = QK * b + 32 * c + 4 * k;
#pragma GCC unroll 4
                        for (int j = 0; j < T; j++) {
                            const __m512i p = _mm512_maddubs_epi16(q[r], pkk_bcast4(xq[j] + e0));
                            if (r % 2)
                                lb[j] = _mm512_dpwssd_epi32(lb[j], p, sc[c]);
                            else
                                la[j] = _mm512_dpwssd_epi32(la[j], p, sc[c]);
                        }
                    }
                }
#pragma GCC unroll 4
                for (int j = 0; j < T; j++)
                    acc[j][k] = _mm512_fmadd_ps(
                        d[j], _mm512_cvtepi32_ps(_mm512_add_epi32(la[j], lb[j])), acc[j][k]);
            }
        }
    }
    const int r = g * KERN_PACK_ROWS, left = m->n_out - r;
    const __mmask16 keep = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
#pragma GCC unroll 4
    for (int j = 0; j < T; j++)
        _mm512_mask_storeu_ps(m->y + (size_t)(t + j) * m->n_out + r, keep, pkk_tree8(acc[j]));
}

static PKK_TARGET PKK_AI void pkk_tile(const struct kern_mm *m, int g, int t, const int T,
                                       const enum kern_wtype wt) {
    if (wt == KERN_W_Q6_K)
        pkk_tile6(m, g, t, T);
    else
        pkk_tile45(m, g, t, T, wt);
}

/* Rows [r0, r1) (r0 a multiple of 16) x tokens [t0, t1): tiles of 4
 * tokens, the last 1 to 3 tokens of a group in one tile of their own. */
static PKK_TARGET PKK_AI void pkk_rect(const struct kern_mm *m, int r0, int r1, int t0, int t1,
                                       const enum kern_wtype wt) {
    const int g1 = (r1 + KERN_PACK_ROWS - 1) / KERN_PACK_ROWS;
    for (int g = r0 / KERN_PACK_ROWS; g < g1; g++) {
        int t = t0;
        for (; t + PKK_MAXT <= t1; t += PKK_MAXT)
            pkk_tile(m, g, t, PKK_MAXT, wt);
        if (t1 - t == 3)
            pkk_tile(m, g, t, 3, wt);
        else if (t1 - t == 2)
            pkk_tile(m, g, t, 2, wt);
        else if (t1 - t == 1)
            pkk_tile(m, g, t, 1, wt);
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
