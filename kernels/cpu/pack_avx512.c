/* pack_avx512.c - the AVX512 kernel for repacked Q8_0/Q4_0 matrices (the
 * layout and the per-element sequence are in pack.c).
 *
 * Per record (one block of 16 rows): the 16 scales in one vcvtph2ps and
 * one multiply by the token's d_x; then per lane L (four weights of every
 * row) one 64-byte load and, per token, one vpdpbusd with the token's 4
 * activations broadcast as the signed operand. Q8_0: the vpdpbusd starts
 * from the lane's offset term, so its int32 lane l is row l's exact lane
 * sum, converted and fused into that lane's accumulator, 16 rows a vector;
 * the lanes are added in AVX2's tree at the end. Q4_0: the vpdpbusds of
 * the eight lanes accumulate row l's exact block sum in lane l (four
 * chains, the first started from the block's offset ob), converted once
 * and fused into one accumulator. So the kernel runs pack.c's sequences
 * and gives the bits of the portable kernel and of the AVX2 level (Q4_0's
 * one-sum order was measured on a Zen 3 only: no AVX-512 CPU at hand).
 *
 * Tiles: decode takes 2 groups (32 rows) x 1 token, prefill 1 group x 3
 * tokens. Q8_0: 8 accumulators per (group, token), 16 or 24, and every
 * vpdpbusd starts a chain of its own (no dependency between lanes), only
 * the fmas of one lane chain across blocks; Q4_0: one accumulator and four
 * vpdpbusd chains of two per (group, token) and block. Decode prefetches the
 * next tile's records while it works (kern_cpu_prefetch_next): the
 * hardware prefetchers left one thread at 0.5 of the read roofline on
 * Q4_0 (docs/benchmarks.md, "Software prefetch in the packed kernels").
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

/* G groups from g0 x T tokens from t (G * T <= 3): 8 lane accumulators
 * per group and token for Q8_0, one (and four int32 chains) for Q4_0. */
static PK_TARGET PK_AI void pk_tile(const struct kern_mm *m, int g0, const int G, int t,
                                    const int T, enum kern_wtype wt) {
    const int n = m->n_in, nb = n / KERN_QK;
    const size_t rec = kern_cpu_pack_rec_bytes(wt);
    const bool q8 = wt == KERN_W_Q8_0;
    const uint8_t *base[2];
    const int8_t *xq[3];
    const float *xd[3];
    const int32_t *xo[3], *xob[3];
    __m512 acc[2][3][8];
    const __m512i low4 = _mm512_set1_epi8(0x0F);
#pragma GCC unroll 2
    for (int gi = 0; gi < G; gi++)
        base[gi] = (const uint8_t *)m->w + rec * (size_t)(g0 + gi) * nb;
#pragma GCC unroll 3
    for (int j = 0; j < T; j++) {
        xq[j] = (const int8_t *)m->act + (size_t)(t + j) * m->act_stride;
        xd[j] = (const float *)(xq[j] + n);
        xo[j] = (const int32_t *)(xd[j] + nb);
        xob[j] = xo[j] + n / 4;
    }
#pragma GCC unroll 2
    for (int gi = 0; gi < G; gi++)
#pragma GCC unroll 3
        for (int j = 0; j < T; j++)
#pragma GCC unroll 8
            for (int L = 0; L < 8; L++)
                acc[gi][j][L] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        __m512 sc[2][3];
        /* Q4_0: the block's integer sum per row, in four chains (the order
         * of integer additions changes nothing) started from its offset */
        __m512i isum[2][3][4];
        /* decode: the G groups are one run of G * nb records and the next
         * tile's follows; prefetching it measured 1.43x on Q4_0 decode (one
         * thread, Zen 5) and cost Q8_0 prefill 4%, so only here */
        if (T == 1)
            kern_cpu_prefetch_next(base[0], rec * (size_t)G * nb, rec * (size_t)G, b);
#pragma GCC unroll 2
        for (int gi = 0; gi < G; gi++) {
            const __m512 dw =
                _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(base[gi] + rec * (size_t)b)));
#pragma GCC unroll 3
            for (int j = 0; j < T; j++) {
                sc[gi][j] = _mm512_mul_ps(dw, _mm512_set1_ps(xd[j][b]));
                if (!q8) {
                    isum[gi][j][0] = _mm512_set1_epi32(xob[j][b]);
                    isum[gi][j][1] = isum[gi][j][2] = isum[gi][j][3] = _mm512_setzero_si512();
                }
            }
        }
#pragma GCC unroll 8
        for (int L = 0; L < 8; L++) {
#pragma GCC unroll 2
            for (int gi = 0; gi < G; gi++) {
                const uint8_t *q = base[gi] + rec * (size_t)b + 32;
                __m512i wl;
                if (q8) {
                    wl = _mm512_loadu_si512(q + 64 * (size_t)L);
                } else {
                    const __m512i v = _mm512_loadu_si512(q + 64 * (size_t)(L / 2));
                    wl = _mm512_and_si512(L % 2 ? _mm512_srli_epi16(v, 4) : v, low4);
                }
#pragma GCC unroll 3
                for (int j = 0; j < T; j++) {
                    const __m512i xb = pk_bcast4(xq[j] + b * KERN_QK + 4 * L);
                    if (!q8) {
                        isum[gi][j][L % 4] = _mm512_dpbusd_epi32(isum[gi][j][L % 4], wl, xb);
                        continue;
                    }
                    const __m512i lane =
                        _mm512_dpbusd_epi32(_mm512_set1_epi32(xo[j][8 * b + L]), wl, xb);
                    acc[gi][j][L] =
                        _mm512_fmadd_ps(sc[gi][j], _mm512_cvtepi32_ps(lane), acc[gi][j][L]);
                }
            }
        }
        if (!q8) { /* acc = fma((float)sum, d_w * d_x, acc): pack.c's Q4_0 sequence */
#pragma GCC unroll 2
            for (int gi = 0; gi < G; gi++)
#pragma GCC unroll 3
                for (int j = 0; j < T; j++) {
                    const __m512i sum =
                        _mm512_add_epi32(_mm512_add_epi32(isum[gi][j][0], isum[gi][j][1]),
                                         _mm512_add_epi32(isum[gi][j][2], isum[gi][j][3]));
                    acc[gi][j][0] =
                        _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), sc[gi][j], acc[gi][j][0]);
                }
        }
    }
#pragma GCC unroll 2
    for (int gi = 0; gi < G; gi++) {
        const int r = (g0 + gi) * KERN_PACK_ROWS, left = m->n_out - r;
        const __mmask16 keep = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
#pragma GCC unroll 3
        for (int j = 0; j < T; j++) {
            __m512 *a8 = acc[gi][j];
            const __m512 y =
                !q8 ? a8[0]
                    : _mm512_add_ps(
                          _mm512_add_ps(_mm512_add_ps(a8[0], a8[4]), _mm512_add_ps(a8[2], a8[6])),
                          _mm512_add_ps(_mm512_add_ps(a8[1], a8[5]), _mm512_add_ps(a8[3], a8[7])));
            _mm512_mask_storeu_ps(m->y + (size_t)(t + j) * m->n_out + r, keep, y);
        }
    }
}

/* Rows [r0, r1) (r0 a multiple of 16) x tokens [t0, t1). */
static PK_TARGET PK_AI void pk_rect(const struct kern_mm *m, int r0, int r1, int t0, int t1,
                                    enum kern_wtype wt) {
    const int g1 = (r1 + KERN_PACK_ROWS - 1) / KERN_PACK_ROWS;
    int g = r0 / KERN_PACK_ROWS;
    if (t1 - t0 >= 4) {
        for (; g < g1; g++) {
            int t = t0;
            for (; t + 3 <= t1; t += 3)
                pk_tile(m, g, 1, t, 3, wt);
            for (; t < t1; t++)
                pk_tile(m, g, 1, t, 1, wt);
        }
        return;
    }
    for (; g + 2 <= g1; g += 2)
        for (int t = t0; t < t1; t++)
            pk_tile(m, g, 2, t, 1, wt);
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
    return t == KERN_W_Q8_0   ? pk_rect_q8_0
           : t == KERN_W_Q4_0 ? pk_rect_q4_0
                              : kern_cpu_pack_k_rect_avx512(t);
}
