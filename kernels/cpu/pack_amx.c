/* pack_amx.c - the AMX kernels for repacked Q8_0/Q4_0 and Q4_K/Q5_K/Q6_K
 * matrices at the amx level (the layouts and the per-element sequences are
 * in pack.c and pack_k.c).
 *
 * AMX (Intel SDM vol. 1, ch. 18 "Intel Advanced Matrix Extensions"): eight
 * tile registers of up to 16 rows x 64 bytes; TDPBSUD C, A, B adds to
 * int32 C[i][j] the products of A's signed bytes in row i with B's
 * unsigned ones in column j, four at a time: C[i][j] += sum over k of
 * A[i][k] * B[k / 4][4 j + k % 4], exactly (int32 sums of byte products).
 *
 * The pack's record is already B's layout: its 64-byte chunk L holds, for
 * row l = 0..15 of the group, the four stored bytes of elements 4L..4L+3
 * at 4l (Q8_0: w + 128, unsigned). So for one block, with A the 16 tokens'
 * 32 activations (rows of the q8s scratch, at their stride) and B the
 * record's 8 chunks (Q4_0: its nibbles split into 8 chunks first, as the
 * AVX512 kernel does in registers), one TDPBSUD leaves in C[j][l] the sum
 * over the block of stored byte x activation for token j and row l. Adding
 * the token's block offset ob gives the block's exact integer sum, the
 * same integer the AVX512 kernel's vpdpbusd chains reach. Then, per token,
 * one vector of 16 rows: acc = fma((float)sum, d_w * d_x, acc), pack.c's
 * sequence: the bits of every other level's pack kernel, for any tile.
 *
 * Tiles: two sets of C (16 tokens x 16 int32), A (16 tokens x 32 bytes:
 * one block) and B (8 x 64 bytes), tmm0-2 and tmm3-5, take a pair of
 * blocks, so the second product need not wait for the first's store; the
 * 16 accumulators stay in zmm registers across the blocks of a row group.
 * A block's float work (16 tokens x a load, an add, a conversion, a
 * multiply and an fma) is what bounds the kernel: on an Emerald Rapids
 * vCPU, the tile work alone ran a 1536 x 4096 x 512 product at ~375
 * GFLOP/s and the float work alone at ~400, together at ~220, 1.3-1.4x
 * the AVX512 kernel; three row groups a pass (three products in flight)
 * and issuing a block's tiles one block ahead of its float work measured
 * no better on that noisy host (docs/benchmarks.md, "AMX tiles for packed
 * Q8_0/Q4_0 prefill"). Token slices of fewer than 16 go to the AVX512
 * kernel (the same bits).
 *
 * K-quants (pack_k.c's one-sum sequence): a product per sub-block, A its
 * 32 (Q6_K: 16) activations of 16 tokens, B its quants as bytes (the
 * record's nibbles and high bits unpacked once per record and 16 tokens,
 * 4 KiB), gives each (token, row) the sub-block's exact dot; per token one
 * vpmulld by the rows' scales a sub-block adds them into the block's
 * integer, and the AVX512 kernel's two fmas follow: its bits. Q6_K's
 * quants go in signed (q - 32, TDPBSSD), so it needs no -32 term. The
 * vpmulld work (two port-0 uops each) bounds these: one thread ran a
 * 1536 x 4096 x 512 Q4_K product at ~405 GFLOP/s, 1.45x the AVX512 kernel,
 * and Q6_K (16 sub-blocks of 16) at ~215, 1.25x (docs/benchmarks.md, "K-quant
 * packs in one integer a block").
 *
 * The tile configuration belongs to the thread: each call loads it and
 * releases the tiles before it returns. The process asks the kernel for
 * the tile state once, when the amx level is first chosen (isa.c: arch_prctl
 * ARCH_REQ_XCOMP_PERM); without it there is no amx level.
 */
#include "kernels/cpu/kern_cpu.h"

#include <immintrin.h>
#include <string.h>

#define AMX_TARGET                                                                                 \
    __attribute__((                                                                                \
        target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512dq,avx512vnni,amx-tile,amx-int8")))
#define AMX_T  16 /* tokens a tile: A's and C's rows */
#define AMX_AI __attribute__((always_inline)) inline

/* ldtilecfg's 64-byte operand: palette 1, then per tile its bytes a row
 * (colsb, at 16) and its rows (at 48). */
struct amx_cfg {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

/* Two tile sets of C (tmm0, tmm3), A (tmm1, tmm4) and B (tmm2, tmm5) for
 * products over k bytes: A k bytes x 16 tokens, B k/4 rows of 64 bytes. */
static AMX_TARGET void amx_config(int k) {
    _Alignas(64) struct amx_cfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int i = 0; i < 6; i += 3) {
        c.rows[i] = AMX_T; /* C: int32 per (token, row of the group) */
        c.colsb[i] = 64;
        c.rows[i + 1] = AMX_T; /* A: k activations per token */
        c.colsb[i + 1] = (uint16_t)k;
        c.rows[i + 2] = (uint8_t)(k / 4); /* B: k/4 chunks of 4 bytes x 16 rows */
        c.colsb[i + 2] = 64;
    }
    _tile_loadconfig(&c);
}

/* C = A x B over one block: A the 16 tokens' activations at xa, B the
 * record's 8 chunks at src (tile numbers are literals for the intrinsics). */
#define AMX_PRODUCT(C, A, B, xa, src, stride)                                                      \
    do {                                                                                           \
        _tile_zero(C);                                                                             \
        _tile_loadd(A, xa, (long)(stride));                                                        \
        _tile_loadd(B, src, 64);                                                                   \
        _tile_dpbsud(C, A, B);                                                                     \
    } while (0)

/* Group g x tokens t..t+15, blocks two at a time (tile sets 0 and 1). */
static AMX_TARGET void amx_tile(const struct kern_mm *m, int g, int t) {
    const enum kern_wtype wt = m->wtype;
    const int n = m->n_in, nb = n / KERN_QK;
    const size_t rec = kern_cpu_pack_rec_bytes(wt);
    const uint8_t *base = (const uint8_t *)m->w + rec * (size_t)g * nb;
    const int8_t *xq0 = (const int8_t *)m->act + (size_t)t * m->act_stride;
    const float *xd[AMX_T];
    const int32_t *xob[AMX_T];
    for (int j = 0; j < AMX_T; j++) {
        xd[j] = (const float *)(xq0 + (size_t)j * m->act_stride + n);
        xob[j] = (const int32_t *)(xd[j] + nb) + n / 4;
    }
    _Alignas(64) int32_t c[2][AMX_T][16];
    _Alignas(64) uint8_t nib[2][8][64]; /* Q4_0: the record's lanes as bytes */
    const __m512i low4 = _mm512_set1_epi8(0x0F);
    __m512 acc[AMX_T];
#pragma GCC unroll 16
    for (int j = 0; j < AMX_T; j++)
        acc[j] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b += 2) {
        const bool two = b + 1 < nb;
        const uint8_t *src[2];
        for (int h = 0; h < 1 + two; h++) {
            const uint8_t *r = base + rec * (size_t)(b + h);
            src[h] = r + 32;
            if (wt == KERN_W_Q4_0) {
                for (int k = 0; k < 4; k++) {
                    const __m512i v = _mm512_loadu_si512(r + 32 + 64 * k);
                    _mm512_store_si512(nib[h][2 * k], _mm512_and_si512(v, low4));
                    _mm512_store_si512(nib[h][2 * k + 1],
                                       _mm512_and_si512(_mm512_srli_epi16(v, 4), low4));
                }
                src[h] = nib[h][0];
            }
        }
        AMX_PRODUCT(0, 1, 2, xq0 + (size_t)b * KERN_QK, src[0], m->act_stride);
        if (two)
            AMX_PRODUCT(3, 4, 5, xq0 + (size_t)(b + 1) * KERN_QK, src[1], m->act_stride);
        _tile_stored(0, c[0], 64);
        if (two)
            _tile_stored(3, c[1], 64);
        for (int h = 0; h < 1 + two; h++) {
            const int bb = b + h;
            const __m512 dw =
                _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(base + rec * (size_t)bb)));
#pragma GCC unroll 16
            for (int j = 0; j < AMX_T; j++) {
                const __m512i sum =
                    _mm512_add_epi32(_mm512_load_si512(c[h][j]), _mm512_set1_epi32(xob[j][bb]));
                const __m512 sc = _mm512_mul_ps(dw, _mm512_set1_ps(xd[j][bb]));
                acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), sc, acc[j]);
            }
        }
    }
    const int r = g * KERN_PACK_ROWS, left = m->n_out - r;
    const __mmask16 keep = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
#pragma GCC unroll 16
    for (int j = 0; j < AMX_T; j++)
        _mm512_mask_storeu_ps(m->y + (size_t)(t + j) * m->n_out + r, keep, acc[j]);
}

/* ---- K-quants: one product per sub-block ---- */

/* The record's quants as B tiles, sub-block s at q[s]: Q4_K/Q5_K 8
 * sub-blocks of 8 chunks (unsigned, 0..31), Q6_K 16 of 4 chunks (signed,
 * q - 32); chunk k of sub-block s holds, at 4l, the four bytes of elements
 * 4k..4k+3 of the sub-block of row l (pack_k.c's lanes, re-sorted). */
static AMX_TARGET AMX_AI void amx_k_unpack(enum kern_wtype wt, const uint8_t *rp,
                                           uint8_t (*q)[64]) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    if (wt == KERN_W_Q6_K) {
        const __m512i b45 = _mm512_set1_epi8(0x30), m32 = _mm512_set1_epi8(32);
        for (int k = 0; k < 8; k++)
            for (int nh = 0; nh < 2; nh++) {
                const uint8_t *ql = rp + KERN_PK_Q6K_QL + 64 * (4 * k + 2 * nh);
                const __m512i l0 = _mm512_loadu_si512(ql), l1 = _mm512_loadu_si512(ql + 64);
                const __m512i h = _mm512_loadu_si512(rp + KERN_PK_Q6K_QH + 64 * (2 * k + nh));
                const __m512i lo[4] = {l0, l1, _mm512_srli_epi16(l0, 4), _mm512_srli_epi16(l1, 4)};
                const __m512i hb[4] = {_mm512_slli_epi16(h, 4), _mm512_slli_epi16(h, 2), h,
                                       _mm512_srli_epi16(h, 2)};
                for (int r = 0; r < 4; r++) { /* chunk c = 4nh + r: sub-block 2c + k / 4 */
                    const __m512i v =
                        _mm512_ternarylogic_epi32(lo[r], _mm512_and_si512(hb[r], b45), m4, 0xEC);
                    _mm512_store_si512(q[4 * (2 * (4 * nh + r) + k / 4) + k % 4],
                                       _mm512_sub_epi8(v, m32));
                }
            }
        return;
    }
    const bool q5 = wt == KERN_W_Q5_K;
    const size_t qs_at = q5 ? KERN_PK_Q5K_QS : KERN_PK_Q4K_QS;
    const __m512i b4 = _mm512_set1_epi8(0x10);
    for (int k = 0; k < 8; k++) {
        const __m512i h =
            q5 ? _mm512_loadu_si512(rp + KERN_PK_Q5K_QH + 64 * k) : _mm512_setzero_si512();
        for (int c = 0; c < 4; c++) {
            const __m512i v = _mm512_loadu_si512(rp + qs_at + 64 * (4 * k + c));
            __m512i lo = _mm512_and_si512(v, m4),
                    hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
            if (q5) { /* qh bit 2c (2c + 1): the 16 of sub-block 2c (2c + 1) */
                const __m512i s = _mm512_srli_epi16(h, (unsigned)(2 * c));
                lo = _mm512_or_si512(lo, _mm512_and_si512(_mm512_slli_epi16(s, 4), b4));
                hi = _mm512_or_si512(hi, _mm512_and_si512(_mm512_slli_epi16(s, 3), b4));
            }
            _mm512_store_si512(q[8 * (2 * c) + k], lo);
            _mm512_store_si512(q[8 * (2 * c + 1) + k], hi);
        }
    }
}

/* Group g x tokens t..t+15 of a K pack: per record, each sub-block's
 * product (A: the 16 tokens' activations of the sub-block, B: its chunks)
 * gives the int32 dot of every (token, row); per token, one vpmulld by the
 * rows' scales a sub-block sums them to the block's integer isum, the mins
 * (Q4_K/Q5_K) to msum as in pack_k_avx512.c, then the same two fmas: the
 * one-sum sequence, so the AVX512 kernel's bits. Q6_K's quants go in
 * signed (q - 32, TDPBSSD), so it needs no -32 term. */
static AMX_TARGET void amx_k_tile(const struct kern_mm *m, int g, int t) {
    const enum kern_wtype wt = m->wtype;
    const bool q6 = wt == KERN_W_Q6_K;
    const int n = m->n_in, nb = n / KERN_QK_K, ns = q6 ? 16 : 8, es = KERN_QK_K / ns;
    const size_t rec = kern_cpu_pack_k_rec_bytes(wt);
    const uint8_t *base = (const uint8_t *)m->w + rec * (size_t)g * nb;
    const int8_t *xq0 = (const int8_t *)m->act + (size_t)t * m->act_stride;
    const float *xd[AMX_T];
    const int16_t *xs[AMX_T];
    for (int j = 0; j < AMX_T; j++) {
        xd[j] = kern_cpu_act_q8K_d(xq0 + (size_t)j * m->act_stride, n);
        xs[j] = kern_cpu_act_q8K_s32(xq0 + (size_t)j * m->act_stride, n);
    }
    _Alignas(64) uint8_t q[64][64];        /* the record's B tiles */
    _Alignas(64) int32_t c[16][AMX_T][16]; /* per sub-block: C */
    _Alignas(64) int32_t sc[16][16];       /* per sub-block: the rows' scales */
    __m512 acc[AMX_T];
#pragma GCC unroll 16
    for (int j = 0; j < AMX_T; j++)
        acc[j] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *rp = base + rec * (size_t)b;
        const int8_t *xa = xq0 + (size_t)b * KERN_QK_K;
        amx_k_unpack(wt, rp, q);
        for (int s = 0; s < ns; s += 2) {
            _tile_zero(0);
            _tile_loadd(1, xa + es * s, (long)m->act_stride);
            _tile_loadd(2, q[(es / 4) * s], 64);
            _tile_zero(3);
            _tile_loadd(4, xa + es * (s + 1), (long)m->act_stride);
            _tile_loadd(5, q[(es / 4) * (s + 1)], 64);
            if (q6) {
                _tile_dpbssd(0, 1, 2);
                _tile_dpbssd(3, 4, 5);
            } else {
                _tile_dpbsud(0, 1, 2);
                _tile_dpbsud(3, 4, 5);
            }
            _tile_stored(0, c[s], 64);
            _tile_stored(3, c[s + 1], 64);
        }
        for (int s = 0; s < ns; s++)
            _mm512_store_si512(sc[s], q6 ? _mm512_cvtepi8_epi32(_mm_loadu_si128(
                                               (const __m128i *)(rp + KERN_PK_Q6K_SC + 16 * s)))
                                         : _mm512_cvtepu8_epi32(_mm_loadu_si128(
                                               (const __m128i *)(rp + KERN_PK_K45_SC + 16 * s))));
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)rp));
        __m512 dm = _mm512_setzero_ps();
        __m512i mn[4];
        if (!q6) {
            dm = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(rp + 32)));
            for (int i = 0; i < 4; i++)
                mn[i] = _mm512_cvtepu8_epi16(
                    _mm256_loadu_si256((const __m256i *)(rp + KERN_PK_K45_MN + 32 * i)));
        }
#pragma GCC unroll 16
        for (int j = 0; j < AMX_T; j++) {
            __m512i isum = _mm512_mullo_epi32(_mm512_load_si512(c[0][j]), _mm512_load_si512(sc[0]));
            for (int s = 1; s < ns; s++)
                isum = _mm512_add_epi32(
                    isum, _mm512_mullo_epi32(_mm512_load_si512(c[s][j]), _mm512_load_si512(sc[s])));
            const __m512 dx = _mm512_set1_ps(xd[j][b]);
            acc[j] = _mm512_fmadd_ps(_mm512_mul_ps(dw, dx), _mm512_cvtepi32_ps(isum), acc[j]);
            if (!q6) {
                int32_t p[4];
                memcpy(p, xs[j] + 8 * b, sizeof p);
                const __m512i msum = _mm512_add_epi32(
                    _mm512_add_epi32(_mm512_madd_epi16(mn[0], _mm512_set1_epi32(p[0])),
                                     _mm512_madd_epi16(mn[1], _mm512_set1_epi32(p[1]))),
                    _mm512_add_epi32(_mm512_madd_epi16(mn[2], _mm512_set1_epi32(p[2])),
                                     _mm512_madd_epi16(mn[3], _mm512_set1_epi32(p[3]))));
                /* -(d_x dmin), negated before the fma (pack_k_avx512.c) */
                const __m512 dmx =
                    _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(_mm512_mul_ps(dm, dx)),
                                                         _mm512_set1_epi32((int)0x80000000u)));
                acc[j] = _mm512_fmadd_ps(dmx, _mm512_cvtepi32_ps(msum), acc[j]);
            }
        }
    }
    const int r = g * KERN_PACK_ROWS, left = m->n_out - r;
    const __mmask16 keep = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
#pragma GCC unroll 16
    for (int j = 0; j < AMX_T; j++)
        _mm512_mask_storeu_ps(m->y + (size_t)(t + j) * m->n_out + r, keep, acc[j]);
}

/* Rows [r0, r1) (r0 a multiple of 16) x tokens [t0, t1) of a pack:
 * 16-token tiles on AMX, the rest on the AVX512 kernel. */
static AMX_TARGET void amx_rect(const struct kern_mm *m, int r0, int r1, int t0, int t1) {
    const int g1 = (r1 + KERN_PACK_ROWS - 1) / KERN_PACK_ROWS;
    const bool k = m->wtype != KERN_W_Q8_0 && m->wtype != KERN_W_Q4_0;
    int t = t0;
    if (t1 - t0 >= AMX_T) {
        /* a block's 32 bytes, Q4_K/Q5_K's sub-block of 32, Q6_K's of 16 */
        amx_config(m->wtype == KERN_W_Q6_K ? 16 : 32);
        for (int g = r0 / KERN_PACK_ROWS; g < g1; g++)
            for (t = t0; t + AMX_T <= t1; t += AMX_T) {
                if (k)
                    amx_k_tile(m, g, t);
                else
                    amx_tile(m, g, t);
            }
        _tile_release();
    }
    if (t < t1)
        kern_cpu_pack_rect_avx512(m->wtype)(m, r0, r1, t, t1);
}

kern_cpu_rect_fn kern_cpu_pack_rect_amx(enum kern_wtype t) {
    switch (t) {
    case KERN_W_Q8_0:
    case KERN_W_Q4_0:
    case KERN_W_Q4_K:
    case KERN_W_Q5_K:
    case KERN_W_Q6_K:
        return amx_rect;
    default:
        return kern_cpu_pack_rect_avx512(t);
    }
}
