/* pack_avx512.c - the AVX512 kernel for repacked Q8_0/Q4_0 matrices (the
 * layout and the per-element sequence are in pack.c).
 *
 * Per record (one block of 16 rows): the 16 scales in one vcvtph2ps and
 * one multiply by the token's d_x; then per lane L (four weights of every
 * row) one 64-byte load (Q4_0: half of one) and, per token, one
 * vpdpbusd with the token's 4 activations broadcast as the signed
 * operand, into two int32 chains: even lanes into the first, started from
 * the block's offset ob, odd lanes into the second. Q4_0 masks each byte
 * once per lane: the low nibbles for an even lane, the high nibbles left
 * in place (16 times the weight) for an odd one, whose chain is shifted
 * right by 4 (exact: every term is a multiple of 16) before the two are
 * added: a shift per odd lane fewer for one shift a block, and two adds a
 * block fewer than four chains (one thread, 4096 x 512 in L2: 1.14x; docs/benchmarks.md,
 * "Q4_0 decode: high nibbles in place, two chains (Xeon)"). Row l's exact
 * block sum lands in lane l, converted once and fused into one
 * accumulator. So the kernel runs pack.c's sequence and gives the bits of
 * the portable kernel and of the AVX2 one.
 *
 * Q8_0 summed its eight lanes apart before (ggml's AVX2 order): a
 * conversion and an fma per lane, 24 vector operations per record and
 * token where the one sum takes 10 (docs/benchmarks.md, "Q8_0 in one
 * integer sum per block").
 *
 * Tiles: decode takes 2 groups (32 rows) x 1 token, prefill 1 group x 3
 * tokens. One-token tiles prefetch each group's records into L2 a few
 * KiB ahead (kern_cpu_prefetch_ahead). The hardware prefetchers alone left
 * one thread at 0.5 of the read roofline on Q4_0 (Zen 5; docs/benchmarks.md,
 * "Software prefetch in the packed kernels"); the next tile's bytes into
 * L1, the prefetch before this one, ran one thread's decode product at
 * 1/1.31 (Q8_0) and 1/1.14 (Q4_0) of this one's speed on the Xeon ("Decode
 * prefetch into L2 a few KiB ahead (Xeon)").
 */
#include "kernels/cpu/kern_avx512.h"
#include "kernels/cpu/kern_cpu.h"

#include <immintrin.h>

#define PK_TARGET KERN_AVX512_TARGET
#define PK_AI     __attribute__((always_inline)) inline

/* G groups from g0 x T tokens from t (G * T <= 3): per group, token and
 * block, two int32 chains (the order of integer additions changes
 * nothing), the first started from the block's offset, then one
 * accumulator. */
static PK_TARGET PK_AI void pk_tile(const struct kern_mm *m, int g0, const int G, int t,
                                    const int T, enum kern_wtype wt) {
    const int n = m->n_in, nb = n / KERN_QK;
    const size_t rec = kern_cpu_pack_rec_bytes(wt);
    const bool q8 = wt == KERN_W_Q8_0;
    const uint8_t *base[2];
    const int8_t *xq[3];
    const float *xd[3];
    const int32_t *xob[3];
    __m512 acc[2][3];
    const __m512i low4 = _mm512_set1_epi8(0x0F), high4 = _mm512_set1_epi8((char)0xF0);
#pragma GCC unroll 2
    for (int gi = 0; gi < G; gi++)
        base[gi] = (const uint8_t *)m->w + rec * (size_t)(g0 + gi) * nb;
#pragma GCC unroll 3
    for (int j = 0; j < T; j++) {
        xq[j] = (const int8_t *)m->act + (size_t)(t + j) * m->act_stride;
        xd[j] = (const float *)(xq[j] + n);
        xob[j] = (const int32_t *)(xd[j] + nb) + n / 4;
    }
#pragma GCC unroll 2
    for (int gi = 0; gi < G; gi++)
#pragma GCC unroll 3
        for (int j = 0; j < T; j++)
            acc[gi][j] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        __m512 sc[2][3];
        __m512i isum[2][3][2];
        /* one token: each group's records are one stream, prefetched into
         * L2 a few KiB ahead (kern_cpu_prefetch_ahead). The first group's
         * start was ahead of the tile before's last stream; the second's
         * is nobody's, so it goes at the first step. Prefetching in
         * prefill tiles cost Q8_0 4% (Zen 5), so only here. */
        if (T == 1) {
            if (b == 0 && G > 1) {
                const size_t run = rec * (size_t)nb;
                kern_cpu_prefetch_l2((uintptr_t)base[1],
                                     run < KERN_CPU_PREFETCH_AHEAD ? run : KERN_CPU_PREFETCH_AHEAD);
            }
#pragma GCC unroll 2
            for (int gi = 0; gi < G; gi++)
                kern_cpu_prefetch_ahead(base[gi] + rec * (size_t)b, rec);
        }
#pragma GCC unroll 2
        for (int gi = 0; gi < G; gi++) {
            const __m512 dw =
                _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(base[gi] + rec * (size_t)b)));
#pragma GCC unroll 3
            for (int j = 0; j < T; j++) {
                sc[gi][j] = _mm512_mul_ps(dw, _mm512_set1_ps(xd[j][b]));
                isum[gi][j][0] = _mm512_set1_epi32(xob[j][b]);
                isum[gi][j][1] = _mm512_setzero_si512();
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
                    /* an odd lane's high nibbles stay in place: 16x */
                    const __m512i v = _mm512_loadu_si512(q + 64 * (size_t)(L / 2));
                    wl = _mm512_and_si512(v, L % 2 ? high4 : low4);
                }
#pragma GCC unroll 3
                for (int j = 0; j < T; j++)
                    isum[gi][j][L % 2] = _mm512_dpbusd_epi32(
                        isum[gi][j][L % 2], wl, kern_avx512_bcast4(xq[j] + b * KERN_QK + 4 * L));
            }
        }
        /* acc = fma((float)sum, d_w * d_x, acc): pack.c's sequence */
#pragma GCC unroll 2
        for (int gi = 0; gi < G; gi++)
#pragma GCC unroll 3
            for (int j = 0; j < T; j++) {
                const __m512i odd = q8 ? isum[gi][j][1] : _mm512_srai_epi32(isum[gi][j][1], 4);
                const __m512i sum = _mm512_add_epi32(isum[gi][j][0], odd);
                acc[gi][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), sc[gi][j], acc[gi][j]);
            }
    }
#pragma GCC unroll 2
    for (int gi = 0; gi < G; gi++) {
        const int r = (g0 + gi) * KERN_PACK_ROWS, left = m->n_out - r;
        const __mmask16 keep = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
#pragma GCC unroll 3
        for (int j = 0; j < T; j++)
            _mm512_mask_storeu_ps(m->y + (size_t)(t + j) * m->n_out + r, keep, acc[gi][j]);
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
