/* pack_amx.c - the AMX kernel for repacked Q8_0/Q4_0 matrices at the amx
 * level (the layout and the per-element sequence are in pack.c).
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
#define AMX_T 16 /* tokens a tile: A's and C's rows */

/* ldtilecfg's 64-byte operand: palette 1, then per tile its bytes a row
 * (colsb, at 16) and its rows (at 48). */
struct amx_cfg {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

static AMX_TARGET void amx_config(void) {
    _Alignas(64) struct amx_cfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int i = 0; i < 6; i += 3) {
        c.rows[i] = AMX_T; /* C: int32 per (token, row of the group) */
        c.colsb[i] = 64;
        c.rows[i + 1] = AMX_T; /* A: a block's 32 activations per token */
        c.colsb[i + 1] = 32;
        c.rows[i + 2] = 8; /* B: the record's 8 chunks of 4 bytes x 16 rows */
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

/* Rows [r0, r1) (r0 a multiple of 16) x tokens [t0, t1) of a Q8_0 or Q4_0
 * pack: 16-token tiles on AMX, the rest on the AVX512 kernel. */
static AMX_TARGET void amx_rect(const struct kern_mm *m, int r0, int r1, int t0, int t1) {
    const int g1 = (r1 + KERN_PACK_ROWS - 1) / KERN_PACK_ROWS;
    int t = t0;
    if (t1 - t0 >= AMX_T) {
        amx_config();
        for (int g = r0 / KERN_PACK_ROWS; g < g1; g++)
            for (t = t0; t + AMX_T <= t1; t += AMX_T)
                amx_tile(m, g, t);
        _tile_release();
    }
    if (t < t1)
        kern_cpu_pack_rect_avx512(m->wtype)(m, r0, r1, t, t1);
}

kern_cpu_rect_fn kern_cpu_pack_rect_amx(enum kern_wtype t) {
    return t == KERN_W_Q8_0 || t == KERN_W_Q4_0 ? amx_rect : kern_cpu_pack_rect_avx512(t);
}
