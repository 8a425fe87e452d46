/* pack_k_avx2.c - the AVX2 kernel for repacked Q4_K/Q5_K/Q6_K matrices
 * (the layout and the per-element sequence are in pack_k.c); also the
 * AVX-VNNI level's.
 *
 * pack_k_avx512.c's scheme on half a record: a ymm register holds 32 of a
 * 64-byte lane chunk's bytes, four weights (two chunks' nibbles for
 * Q4_K/Q5_K) of each of 8 rows, so a tile is one record half (rows 8h ..
 * 8h + 7 of a group) and 1 to 4 tokens. Per record half: the 8 d (and
 * dmin) in one vcvtph2ps, times each token's d_x; each sub-block's
 * 8 scales as int16 pairs (sc, sc), row l's in dword l (one vpmovzxbd or
 * vpmovsxbd and a blend with itself shifted); then for lane k (0..7) and
 * each 32-chunk c, one 32-byte load, the nibbles unpacked with and/shift
 * (Q5_K's fifth bit and Q6_K's upper two or-ed in), vpmaddubsw against the
 * token's four activations broadcast (per row two int16 pair sums, at most
 * 2 * 63 * 128) and vpmaddwd with the scale pairs: sc times the row's four
 * products, added into lane k in int32 (Q6_K's -32 by four more vpmaddwd
 * a lane, the rows' scale pairs of two chunks against the token's -32 x
 * sums, as at AVX512). The lanes are exact integers, so this is the same
 * integer as the rows kernel's (matmul_k_avx2.c), formed 8 rows a vector:
 * each lane is converted and fused into its accumulator once per block,
 * the mins likewise (one vpmaddwd of the rows' min pairs with the token's
 * two 32-sums per pair of sub-blocks), and the AVX2 trees run across the
 * accumulators at the end. pack_k.c's sequence, so the bits of the rows
 * kernel and of every other level.
 *
 * Why a pack at AVX2: the rows kernel spends ~90 instructions per row and
 * 256-block (decoding the 12 packed scale bytes, spreading each scale with
 * a shuffle, then 4 loads, 16 multiplies and ~20 other integer operations
 * for 144 bytes), a row at a time, and ran dummy-1g's Q4_K shapes in a
 * decode sweep at 0.52-0.70 of a read of the same bytes on a Zen 3: bound
 * by its instructions, not by memory. Here the scale, min and float work
 * serve 8 rows: the same sweep ran 1.19-1.30x the rows on one thread
 * (0.68-0.84 of the read), 1.11-1.21x on two. Q6_K gains less (its scales
 * are one byte already, and the -32 costs four multiplies a lane) and ran
 * 0.84-0.93x the rows, so pack.c packs Q4_K and Q5_K at these levels and
 * leaves Q6_K on the rows; its kernel here runs when a Q6_K pack meets
 * them (the tests run every level on every pack). docs/benchmarks.md,
 * "K-quant packs at AVX2".
 *
 * Tiles: one half x T tokens (T <= 4, the unpacked vectors serving every
 * token); the float accumulators (8 lanes and 4 mins a token) are touched
 * once per block and live where the compiler puts them. The lane loop is
 * kept rolled: unrolled, GCC hoisted every product of a block ahead of its
 * adds and spilled them all to the stack (Q6_K decode ran at 0.70x the
 * rows that way). A group's two halves and the tiles of a pass run in turn
 * on its records (2368-3360 bytes each), which stay in L1/L2 after the first;
 * each half's first tile prefetches half of the next group's bytes
 * (pack_avx2.c does the same).
 */
#include "kernels/cpu/kern_avx2.h"

#include <immintrin.h>
#include <stdbool.h>
#include <string.h>

#define PKA_AI   __attribute__((always_inline)) inline
#define QK       KERN_QK_K
#define PKA_MAXT 4 /* tokens per tile */

/* The 8 bytes at p (row l's at p[l]) as int16 pairs (v, v), row l's in
 * dword l: zero-extended, or sign-extended (sgn). */
static KERN_AVX2 PKA_AI __m256i pka_pairs(const uint8_t *p, const bool sgn) {
    const __m128i b = _mm_loadl_epi64((const __m128i *)p);
    const __m256i v = sgn ? _mm256_cvtepi8_epi32(b) : _mm256_cvtepu8_epi32(b);
    return _mm256_blend_epi16(v, _mm256_slli_epi32(v, 16), 0xAA);
}

/* a << s (s > 0) or a >> -s as 16-bit lanes; s is a constant once inlined. */
static KERN_AVX2 PKA_AI __m256i pka_sh16(__m256i a, const int s) {
    return s > 0 ? _mm256_slli_epi16(a, s) : s < 0 ? _mm256_srli_epi16(a, -s) : a;
}

/* Q4_K / Q5_K: half h of group g x tokens [t, t + T); pf: prefetch half of
 * the next group's bytes on the way. */
static KERN_AVX2 PKA_AI void pka_tile45(const struct kern_mm *m, int g, int h, int t, const int T,
                                        const enum kern_wtype wt, bool pf) {
    const int n = m->n_in, nb = n / QK;
    const bool q5 = wt == KERN_W_Q5_K;
    const size_t rec = kern_cpu_pack_k_rec_bytes(wt), qs_at = q5 ? KERN_PK_Q5K_QS : KERN_PK_Q4K_QS;
    const uint8_t *base = (const uint8_t *)m->w + rec * (size_t)g * nb;
    const int8_t *xq[PKA_MAXT];
    const float *xd[PKA_MAXT];
    const int16_t *xs[PKA_MAXT];
    __m256 acc[PKA_MAXT][8], accm[PKA_MAXT][4];
    const __m256i m4 = _mm256_set1_epi8(0x0F), b4 = _mm256_set1_epi8(0x10);
#pragma GCC unroll 4
    for (int j = 0; j < T; j++) {
        xq[j] = (const int8_t *)m->act + (size_t)(t + j) * m->act_stride;
        xd[j] = kern_cpu_act_q8K_d(xq[j], n);
        xs[j] = kern_cpu_act_q8K_s32(xq[j], n);
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++)
            acc[j][k] = _mm256_setzero_ps();
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++)
            accm[j][i] = _mm256_setzero_ps();
    }
    for (int b = 0; b < nb; b++) {
        const uint8_t *rp = base + rec * (size_t)b;
        if (pf)
            kern_cpu_prefetch_next(base, rec * (size_t)nb + (rec / 2) * (size_t)(h * nb), rec / 2,
                                   b);
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(rp + 16 * h)));
        const __m256 dm = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(rp + 32 + 16 * h)));
        __m256 d[PKA_MAXT];
        /* the mins: pair i of sub-blocks (2i, 2i + 1), 8 rows at once */
        __m256i mn[4];
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++)
            mn[i] = _mm256_cvtepu8_epi16(
                _mm_loadu_si128((const __m128i *)(rp + KERN_PK_K45_MN + 32 * i + 16 * h)));
#pragma GCC unroll 4
        for (int j = 0; j < T; j++) {
            const __m256 dx = _mm256_set1_ps(xd[j][b]);
            d[j] = _mm256_mul_ps(dw, dx);
            /* accm += -(d_x dmin) * mins, negated before the fma as the
             * portable kernel does (a NaN dmin keeps the same sign) */
            const __m256 dmx = kern_avx2_neg_prod(dm, dx);
            __m256i p[4];
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++)
                p[i] = _mm256_madd_epi16(mn[i], kern_avx2_bcast4(xs[j] + 8 * b + 2 * i));
            if (q5) {
                const __m256i s =
                    _mm256_add_epi32(_mm256_add_epi32(p[0], p[1]), _mm256_add_epi32(p[2], p[3]));
                accm[j][0] = _mm256_fmadd_ps(dmx, _mm256_cvtepi32_ps(s), accm[j][0]);
            } else {
#pragma GCC unroll 4
                for (int i = 0; i < 4; i++)
                    accm[j][i] = _mm256_fmadd_ps(dmx, _mm256_cvtepi32_ps(p[i]), accm[j][i]);
            }
        }
        __m256i sc[8];
#pragma GCC unroll 8
        for (int s = 0; s < 8; s++)
            sc[s] = pka_pairs(rp + KERN_PK_K45_SC + 16 * s + 8 * h, false);
#pragma GCC unroll 1
        for (int k = 0; k < 8; k++) {
            __m256i la[PKA_MAXT], lb[PKA_MAXT];
            __m256i qh = _mm256_setzero_si256();
            if (q5)
                qh = _mm256_loadu_si256((const __m256i *)(rp + KERN_PK_Q5K_QH + 64 * k + 32 * h));
#pragma GCC unroll 4
            for (int j = 0; j < T; j++)
                la[j] = lb[j] = _mm256_setzero_si256();
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) {
                const __m256i v =
                    _mm256_loadu_si256((const __m256i *)(rp + qs_at + 64 * (4 * k + c) + 32 * h));
                __m256i lo = _mm256_and_si256(v, m4);
                __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
                if (q5) { /* qh bit 2c (2c + 1) is the 16 of sub-block 2c (2c + 1) */
                    lo = _mm256_or_si256(lo, _mm256_and_si256(pka_sh16(qh, 4 - 2 * c), b4));
                    hi = _mm256_or_si256(hi, _mm256_and_si256(pka_sh16(qh, 3 - 2 * c), b4));
                }
#pragma GCC unroll 4
                for (int j = 0; j < T; j++) {
                    const int8_t *x = xq[j] + QK * b + 64 * c + 4 * k;
                    la[j] = _mm256_add_epi32(
                        la[j], _mm256_madd_epi16(_mm256_maddubs_epi16(lo, kern_avx2_bcast4(x)),
                                                 sc[2 * c]));
                    lb[j] = _mm256_add_epi32(
                        lb[j], _mm256_madd_epi16(_mm256_maddubs_epi16(hi, kern_avx2_bcast4(x + 32)),
                                                 sc[2 * c + 1]));
                }
            }
#pragma GCC unroll 4
            for (int j = 0; j < T; j++)
                acc[j][k] = _mm256_fmadd_ps(
                    d[j], _mm256_cvtepi32_ps(_mm256_add_epi32(la[j], lb[j])), acc[j][k]);
        }
    }
    const int r0 = g * KERN_PACK_ROWS + 8 * h;
#pragma GCC unroll 4
    for (int j = 0; j < T; j++) {
        __m256 y = kern_avx2_tree8(acc[j]);
        if (q5)
            y = _mm256_add_ps(y, accm[j][0]);
        else
            y = _mm256_add_ps(y, _mm256_add_ps(_mm256_add_ps(accm[j][0], accm[j][2]),
                                               _mm256_add_ps(accm[j][1], accm[j][3])));
        kern_avx2_store8(m->y + (size_t)(t + j) * m->n_out, r0, m->n_out - r0, y);
    }
}

/* Q6_K: half h of group g x tokens [t, t + T). Lanes 0..3 take the even
 * 16-scales (elements 0..15 of each 32-chunk), lanes 4..7 the odd ones. */
static KERN_AVX2 PKA_AI void pka_tile6(const struct kern_mm *m, int g, int h, int t, const int T,
                                       bool pf) {
    const int n = m->n_in, nb = n / QK;
    const size_t rec = kern_cpu_pack_k_rec_bytes(KERN_W_Q6_K);
    const uint8_t *base = (const uint8_t *)m->w + rec * (size_t)g * nb;
    const int8_t *xq[PKA_MAXT];
    const float *xd[PKA_MAXT];
    const int32_t *xo[PKA_MAXT];
    __m256 acc[PKA_MAXT][8];
    const __m256i m4 = _mm256_set1_epi8(0x0F), b45 = _mm256_set1_epi8(0x30);
#pragma GCC unroll 4
    for (int j = 0; j < T; j++) {
        xq[j] = (const int8_t *)m->act + (size_t)(t + j) * m->act_stride;
        xd[j] = kern_cpu_act_q8K_d(xq[j], n);
        xo[j] = (const int32_t *)((const char *)xq[j] + kern_cpu_act_q8K_bytes(n));
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++)
            acc[j][k] = _mm256_setzero_ps();
    }
    for (int b = 0; b < nb; b++) {
        const uint8_t *rp = base + rec * (size_t)b;
        if (pf)
            kern_cpu_prefetch_next(base, rec * (size_t)nb + (rec / 2) * (size_t)(h * nb), rec / 2,
                                   b);
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(rp + 16 * h)));
        __m256 d[PKA_MAXT];
#pragma GCC unroll 4
        for (int j = 0; j < T; j++)
            d[j] = _mm256_mul_ps(dw, _mm256_set1_ps(xd[j][b]));
#pragma GCC unroll 2
        for (int half = 0; half < 2; half++) {
            __m256i sc[8]; /* chunk c's scale for this half: 16-group 2c + half */
#pragma GCC unroll 8
            for (int c = 0; c < 8; c++)
                sc[c] = pka_pairs(rp + KERN_PK_Q6K_SC + 16 * (2 * c + half) + 8 * h, true);
            __m256i sc2[4]; /* chunks 2i, 2i + 1: the pairs (sc_2i, sc_2i+1) */
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++)
                sc2[i] = _mm256_blend_epi16(sc[2 * i], sc[2 * i + 1], 0xAA);
#pragma GCC unroll 1
            for (int kk = 0; kk < 4; kk++) {
                const int k = 4 * half + kk;
                __m256i la[PKA_MAXT], lb[PKA_MAXT];
                /* the -32: lb = sum over chunk pairs of the rows' scale
                 * pairs . the token's -32 x sums */
#pragma GCC unroll 4
                for (int j = 0; j < T; j++) {
                    la[j] = _mm256_setzero_si256();
                    lb[j] = _mm256_add_epi32(
                        _mm256_add_epi32(
                            _mm256_madd_epi16(sc2[0], _mm256_set1_epi32(xo[j][32 * b + 4 * k + 0])),
                            _mm256_madd_epi16(sc2[1],
                                              _mm256_set1_epi32(xo[j][32 * b + 4 * k + 1]))),
                        _mm256_add_epi32(
                            _mm256_madd_epi16(sc2[2], _mm256_set1_epi32(xo[j][32 * b + 4 * k + 2])),
                            _mm256_madd_epi16(sc2[3],
                                              _mm256_set1_epi32(xo[j][32 * b + 4 * k + 3]))));
                }
#pragma GCC unroll 2
                for (int nh = 0; nh < 2; nh++) {
                    const uint8_t *ql = rp + KERN_PK_Q6K_QL + 64 * (4 * k + 2 * nh) + 32 * h;
                    const __m256i l0 = _mm256_loadu_si256((const __m256i *)ql);
                    const __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 64));
                    const __m256i qh = _mm256_loadu_si256(
                        (const __m256i *)(rp + KERN_PK_Q6K_QH + 64 * (2 * k + nh) + 32 * h));
#pragma GCC unroll 4
                    for (int r = 0; r < 4; r++) {
                        /* chunk 4nh + r: low 4 bits, and qh bits 2r, 2r + 1 */
                        const __m256i lr = r % 2 ? l1 : l0;
                        const __m256i q = _mm256_or_si256(
                            _mm256_and_si256(r < 2 ? lr : _mm256_srli_epi16(lr, 4), m4),
                            _mm256_and_si256(pka_sh16(qh, 4 - 2 * r), b45));
                        const int c = 4 * nh + r, e0 = QK * b + 32 * c + 4 * k;
#pragma GCC unroll 4
                        for (int j = 0; j < T; j++) {
                            const __m256i p = _mm256_madd_epi16(
                                _mm256_maddubs_epi16(q, kern_avx2_bcast4(xq[j] + e0)), sc[c]);
                            if (r % 2)
                                lb[j] = _mm256_add_epi32(lb[j], p);
                            else
                                la[j] = _mm256_add_epi32(la[j], p);
                        }
                    }
                }
#pragma GCC unroll 4
                for (int j = 0; j < T; j++)
                    acc[j][k] = _mm256_fmadd_ps(
                        d[j], _mm256_cvtepi32_ps(_mm256_add_epi32(la[j], lb[j])), acc[j][k]);
            }
        }
    }
    const int r0 = g * KERN_PACK_ROWS + 8 * h;
#pragma GCC unroll 4
    for (int j = 0; j < T; j++)
        kern_avx2_store8(m->y + (size_t)(t + j) * m->n_out, r0, m->n_out - r0,
                         kern_avx2_tree8(acc[j]));
}

static KERN_AVX2 PKA_AI void pka_tile(const struct kern_mm *m, int g, int h, int t, const int T,
                                      const enum kern_wtype wt, bool pf) {
    if (wt == KERN_W_Q6_K)
        pka_tile6(m, g, h, t, T, pf);
    else
        pka_tile45(m, g, h, t, T, wt, pf);
}

/* Rows [r0, r1) (r0 a multiple of 16) x tokens [t0, t1): per group, each
 * half that holds a row, tiles of 4 tokens, the last 1 to 3 in one tile. */
static KERN_AVX2 PKA_AI void pka_rect(const struct kern_mm *m, int r0, int r1, int t0, int t1,
                                      const enum kern_wtype wt) {
    const int g1 = (r1 + KERN_PACK_ROWS - 1) / KERN_PACK_ROWS;
    for (int g = r0 / KERN_PACK_ROWS; g < g1; g++)
        for (int h = 0; h < 2 && g * KERN_PACK_ROWS + 8 * h < r1; h++) {
            int t = t0;
            for (; t + PKA_MAXT <= t1; t += PKA_MAXT)
                pka_tile(m, g, h, t, PKA_MAXT, wt, t == t0);
            if (t1 - t == 3)
                pka_tile(m, g, h, t, 3, wt, t == t0);
            else if (t1 - t == 2)
                pka_tile(m, g, h, t, 2, wt, t == t0);
            else if (t1 - t == 1)
                pka_tile(m, g, h, t, 1, wt, t == t0);
        }
}

static KERN_AVX2 void pka_rect_q4_K(const struct kern_mm *m, int r0, int r1, int t0, int t1) {
    pka_rect(m, r0, r1, t0, t1, KERN_W_Q4_K);
}
static KERN_AVX2 void pka_rect_q5_K(const struct kern_mm *m, int r0, int r1, int t0, int t1) {
    pka_rect(m, r0, r1, t0, t1, KERN_W_Q5_K);
}
static KERN_AVX2 void pka_rect_q6_K(const struct kern_mm *m, int r0, int r1, int t0, int t1) {
    pka_rect(m, r0, r1, t0, t1, KERN_W_Q6_K);
}

kern_cpu_rect_fn kern_cpu_pack_k_rect_avx2(enum kern_wtype t) {
    switch (t) {
    case KERN_W_Q4_K:
        return pka_rect_q4_K;
    case KERN_W_Q5_K:
        return pka_rect_q5_K;
    case KERN_W_Q6_K:
        return pka_rect_q6_K;
    default:
        return NULL;
    }
}
