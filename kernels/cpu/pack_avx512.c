/* pack_avx512.c - the AVX512 kernel for repacked Q8_0/Q4_0 matrices (the
 * layout and the per-element sequence are in pack.c).
 *
 * Per record (one block of 16 rows): the 16 scales in one vcvtph2ps, then
 * per 4 weights of every row one 64-byte load and one vpdpbusd per token,
 * its signed operand the token's 4 activations broadcast to all lanes; the
 * int32 lane l is row l's exact block sum. Then per token: subtract the
 * offset (128 or 8 times the block's activation sum), convert, and
 * acc = fma(S, d_w * d_x, acc): the portable kernel's sequence, 16 rows a
 * vector, so both give the same bits.
 *
 * Tiles: decode (one token) takes 4 groups (64 rows) at once, Q8_0 with
 * two integer accumulators per group (even and odd k; integer sums are
 * exact in any order), so 8 vpdpbusd chains hide the instruction's
 * latency; prefill takes 1 group x 12 tokens (12 chains, each weight load
 * feeding 12 tokens: 24 accumulators, 27 of the 32 zmm registers).
 */
#include "kernels/cpu/kern_cpu.h"

#include <immintrin.h>
#include <string.h>

#define PK_TARGET                                                                                  \
    __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512dq,avx512vnni")))
#define PK_AI __attribute__((always_inline)) inline

static PK_TARGET PK_AI __m512i pk_bcast4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

/* G groups from g0 x T tokens from t. */
static PK_TARGET PK_AI void pk_tile(const struct kern_mm *m, int g0, const int G, int t,
                                    const int T, enum kern_wtype wt) {
    const int n = m->n_in, nb = n / KERN_QK;
    const size_t rec = kern_cpu_pack_rec_bytes(wt);
    const bool q8 = wt == KERN_W_Q8_0;
    const uint8_t *base[4];
    const int8_t *xq[12];
    const float *xd[12];
    const int32_t *xo[12];
    __m512 acc[4][12];
    /* one integer accumulator per element when there are enough elements
     * for independent chains, two (even and odd k) in the decode tile */
    const bool two = G * T < 4;
    const __m512i low4 = _mm512_set1_epi8(0x0F);
#pragma GCC unroll 4
    for (int gi = 0; gi < G; gi++)
        base[gi] = (const uint8_t *)m->w + rec * (size_t)(g0 + gi) * nb;
#pragma GCC unroll 12
    for (int j = 0; j < T; j++) {
        xq[j] = (const int8_t *)m->act + (size_t)(t + j) * m->act_stride;
        xd[j] = (const float *)(xq[j] + n);
        xo[j] = (const int32_t *)(xd[j] + nb);
    }
#pragma GCC unroll 4
    for (int gi = 0; gi < G; gi++)
#pragma GCC unroll 12
        for (int j = 0; j < T; j++)
            acc[gi][j] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        /* each lane starts at the block's offset term (pack.c), so the dot
         * products leave the exact sum of w * x */
        __m512i s0[4][12], s1[4][12];
#pragma GCC unroll 4
        for (int gi = 0; gi < G; gi++)
#pragma GCC unroll 12
            for (int j = 0; j < T; j++) {
                s0[gi][j] = _mm512_set1_epi32(xo[j][b]);
                s1[gi][j] = _mm512_setzero_si512();
            }
        const int8_t *xb[12];
#pragma GCC unroll 12
        for (int j = 0; j < T; j++)
            xb[j] = xq[j] + b * KERN_QK;
        if (q8) {
#pragma GCC unroll 8
            for (int k = 0; k < 8; k++) {
#pragma GCC unroll 4
                for (int gi = 0; gi < G; gi++) {
                    const __m512i wk =
                        _mm512_loadu_si512(base[gi] + rec * (size_t)b + 32 + 64 * (size_t)k);
#pragma GCC unroll 12
                    for (int j = 0; j < T; j++) {
                        if (two && (k & 1))
                            s1[gi][j] = _mm512_dpbusd_epi32(s1[gi][j], wk, pk_bcast4(xb[j] + 4 * k));
                        else
                            s0[gi][j] = _mm512_dpbusd_epi32(s0[gi][j], wk, pk_bcast4(xb[j] + 4 * k));
                    }
                }
            }
        } else {
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
#pragma GCC unroll 4
                for (int gi = 0; gi < G; gi++) {
                    const __m512i v =
                        _mm512_loadu_si512(base[gi] + rec * (size_t)b + 32 + 64 * (size_t)k);
                    const __m512i lo = _mm512_and_si512(v, low4);
                    const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
#pragma GCC unroll 12
                    for (int j = 0; j < T; j++) {
                        s0[gi][j] = _mm512_dpbusd_epi32(s0[gi][j], lo, pk_bcast4(xb[j] + 8 * k));
                        if (two)
                            s1[gi][j] =
                                _mm512_dpbusd_epi32(s1[gi][j], hi, pk_bcast4(xb[j] + 8 * k + 4));
                        else
                            s0[gi][j] =
                                _mm512_dpbusd_epi32(s0[gi][j], hi, pk_bcast4(xb[j] + 8 * k + 4));
                    }
                }
            }
        }
#pragma GCC unroll 4
        for (int gi = 0; gi < G; gi++) {
            const __m512 dw = _mm512_cvtph_ps(
                _mm256_loadu_si256((const __m256i *)(base[gi] + rec * (size_t)b)));
#pragma GCC unroll 12
            for (int j = 0; j < T; j++) {
                const __m512i S = two ? _mm512_add_epi32(s0[gi][j], s1[gi][j]) : s0[gi][j];
                acc[gi][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(S),
                                             _mm512_mul_ps(dw, _mm512_set1_ps(xd[j][b])),
                                             acc[gi][j]);
            }
        }
    }
#pragma GCC unroll 4
    for (int gi = 0; gi < G; gi++) {
        const int r = (g0 + gi) * KERN_PACK_ROWS, left = m->n_out - r;
        const __mmask16 keep = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
#pragma GCC unroll 12
        for (int j = 0; j < T; j++)
            _mm512_mask_storeu_ps(m->y + (size_t)(t + j) * m->n_out + r, keep, acc[gi][j]);
    }
}

#define PK_TILE_T(G, T)                                                                            \
    case T:                                                                                        \
        pk_tile(m, g, G, t, T, wt);                                                                \
        break

/* Rows [r0, r1) (r0 a multiple of 16) x tokens [t0, t1). */
static PK_TARGET PK_AI void pk_rect(const struct kern_mm *m, int r0, int r1, int t0, int t1,
                                    enum kern_wtype wt) {
    const int g1 = (r1 + KERN_PACK_ROWS - 1) / KERN_PACK_ROWS;
    int g = r0 / KERN_PACK_ROWS;
    if (t1 - t0 >= 4) {
        for (; g < g1; g++)
            for (int t = t0; t < t1; t += 12) {
                switch (t1 - t < 12 ? t1 - t : 12) {
                    PK_TILE_T(1, 1);
                    PK_TILE_T(1, 2);
                    PK_TILE_T(1, 3);
                    PK_TILE_T(1, 4);
                    PK_TILE_T(1, 5);
                    PK_TILE_T(1, 6);
                    PK_TILE_T(1, 7);
                    PK_TILE_T(1, 8);
                    PK_TILE_T(1, 9);
                    PK_TILE_T(1, 10);
                    PK_TILE_T(1, 11);
                    PK_TILE_T(1, 12);
                }
            }
        return;
    }
    for (; g + 4 <= g1; g += 4)
        for (int t = t0; t < t1; t++)
            pk_tile(m, g, 4, t, 1, wt);
    for (; g < g1; g++)
        for (int t = t0; t < t1; t++)
            pk_tile(m, g, 1, t, 1, wt);
}

static PK_TARGET void pk_rect_q8_0(const struct kern_mm *m, int r0, int r1, int t0, int t1) {
    pk_rect(m, r0, r1, t0, t1, KERN_W_Q8_0);
}
static PK_TARGET void pk_rect_q4_0(const struct kern_mm *m, int r0, int r1, int t0, int t1) {
    pk_rect(m, r0, r1, t0, t1, KERN_W_Q4_0);
}

kern_cpu_rect_fn kern_cpu_pack_rect_avx512(enum kern_wtype t) {
    return t == KERN_W_Q8_0 ? pk_rect_q8_0 : t == KERN_W_Q4_0 ? pk_rect_q4_0 : NULL;
}
