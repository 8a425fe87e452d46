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
 * K-quants (pack_k.c's one-sum sequence): the block's integer isum is the
 * sum over its 256 elements of w x with w = sc q (Q6_K: sc (q - 32)), so
 * once per record each weight is multiplied by its sub-block's scale and
 * split into two byte planes, w = 2^sh hi + lo (8 KiB a record, as B
 * tiles), and per 16 tokens eight full products (four 64-chunks, each
 * plane; TDPBSUD, or TDPBSSD on Q6_K's signed planes) accumulate C_hi and
 * C_lo over the whole block: isum = 2^sh C_hi + C_lo, exactly, with no
 * scale work per token. Each record's planes serve up to 8 slices of 16
 * tokens, whose float accumulators wait in memory; the mins and the two
 * fmas are the AVX512 kernel's, so its bits.
 * An earlier form, a product per sub-block and a vpmulld by the scales per
 * token, was bound by those multiplies (port 0): with the planes one
 * thread's 1536 x 4096 x 512 products ran 1.1-1.4x as fast on Q4_K, 1.26x
 * on Q5_K and 2.2x on Q6_K (16 sub-blocks), and dummy-1g q4_k_m prefill
 * 1.22-1.99x (docs/benchmarks.md, "K-quant packs in one integer a
 * block").
 *
 * The tile configuration belongs to the thread: each call loads it and
 * releases the tiles before it returns. The process asks the kernel for
 * the tile state once, when the amx level is first chosen (isa.c: arch_prctl
 * ARCH_REQ_XCOMP_PERM); without it there is no amx level.
 */
#include "kernels/cpu/kern_avx512.h"
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

/* ---- K-quants: the scales folded into the weights ---- */

#define AMX_KSL 8 /* 16-token slices that share one record's planes */

/* The record's quant vector for B row kr (elements 4kr..4kr+3 of 64-chunk
 * kc, four bytes of each of the 16 rows), and its sub-block in *sub:
 * Q4_K/Q5_K unsigned (0..31), Q6_K signed (q - 32). */
static AMX_TARGET AMX_AI __m512i amx_k_quants(enum kern_wtype wt, const uint8_t *rp, int kc, int kr,
                                              int *sub) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const int c = 2 * kc + kr / 8, k = kr % 8; /* 32-chunk, lane */
    if (wt == KERN_W_Q6_K) {
        const int nh = c / 4, r = c % 4;
        const __m512i l = _mm512_loadu_si512(rp + KERN_PK_Q6K_QL + 64 * (4 * k + 2 * nh + r % 2));
        const __m512i h = _mm512_loadu_si512(rp + KERN_PK_Q6K_QH + 64 * (2 * k + nh));
        /* qh bits 2r, 2r + 1 to bits 4, 5 */
        const __m512i hb = kern_avx512_sh16(h, 4 - 2 * r);
        const __m512i q = _mm512_ternarylogic_epi32(r / 2 ? _mm512_srli_epi16(l, 4) : l,
                                                    _mm512_and_si512(hb, _mm512_set1_epi8(0x30)),
                                                    m4, KERN_AVX512_SEL);
        *sub = 2 * c + k / 4;
        return _mm512_sub_epi8(q, _mm512_set1_epi8(32));
    }
    const bool q5 = wt == KERN_W_Q5_K;
    const __m512i v =
        _mm512_loadu_si512(rp + (q5 ? KERN_PK_Q5K_QS : KERN_PK_Q4K_QS) + 64 * (4 * k + kc));
    __m512i q = _mm512_and_si512(kr < 8 ? v : _mm512_srli_epi16(v, 4), m4);
    if (q5) { /* qh bit c: the 16 of sub-block c */
        const __m512i h = _mm512_loadu_si512(rp + KERN_PK_Q5K_QH + 64 * k);
        q = _mm512_or_si512(q,
                            _mm512_and_si512(kern_avx512_sh16(h, 4 - c), _mm512_set1_epi8(0x10)));
    }
    *sub = c;
    return q;
}

/* The record's weights times their scales, w = sc q (Q6_K: sc (q - 32)),
 * as two byte planes w = 2^sh hi + lo with 0 <= lo < 2^sh: B tiles
 * hi[kc], lo[kc] for the four 64-chunks. |w| <= 63 * 31 (sh 5: hi 0..61)
 * or 128 * 32 (Q6_K, sh 6: hi -64..64, lo 0..63), so both fit a byte and
 * sum_e w_e x_e = 2^sh (hi . x) + (lo . x) exactly. */
static AMX_TARGET AMX_AI void amx_k_planes(enum kern_wtype wt, const uint8_t *rp, uint8_t (*hi)[64],
                                           uint8_t (*lo)[64]) {
    const bool q6 = wt == KERN_W_Q6_K;
    const unsigned sh = q6 ? 6 : 5;
    const __m512i low = _mm512_set1_epi8((char)((1 << sh) - 1)), even = _mm512_set1_epi16(0x00FF);
    const __mmask64 odd = 0xAAAAAAAAAAAAAAAAull;
    __m512i sc16[16]; /* sub-block s: (sc_l, sc_l) as int16, row l's dword */
    for (int s = 0; s < (q6 ? 16 : 8); s++) {
        const __m128i b = _mm_loadu_si128(
            (const __m128i *)(rp + (q6 ? KERN_PK_Q6K_SC : KERN_PK_K45_SC) + 16 * s));
        const __m512i x = q6 ? _mm512_and_si512(_mm512_cvtepi8_epi32(b), _mm512_set1_epi32(0xFFFF))
                             : _mm512_cvtepu8_epi32(b);
        sc16[s] = _mm512_or_si512(x, _mm512_slli_epi32(x, 16));
    }
    for (int kc = 0; kc < 4; kc++)
        for (int kr = 0; kr < 16; kr++) {
            int s;
            const __m512i q = amx_k_quants(wt, rp, kc, kr, &s);
            /* even and odd bytes as int16 (sign-extended for Q6_K) */
            const __m512i qe =
                q6 ? _mm512_srai_epi16(_mm512_slli_epi16(q, 8), 8) : _mm512_and_si512(q, even);
            const __m512i qo = q6 ? _mm512_srai_epi16(q, 8) : _mm512_srli_epi16(q, 8);
            const __m512i pe = _mm512_mullo_epi16(qe, sc16[s]);
            const __m512i po = _mm512_mullo_epi16(qo, sc16[s]);
            _mm512_store_si512(
                lo[16 * kc + kr],
                _mm512_and_si512(_mm512_mask_blend_epi8(odd, pe, _mm512_slli_epi16(po, 8)), low));
            _mm512_store_si512(hi[16 * kc + kr],
                               _mm512_mask_blend_epi8(odd, _mm512_srli_epi16(pe, sh),
                                                      _mm512_slli_epi16(po, 8 - sh)));
        }
}

/* ldtilecfg for the K kernel: all eight tiles 16 rows x 64 bytes (C: int32
 * per token and row; A: a 64-chunk of 16 tokens' activations; B: a plane's
 * 64-chunk). */
static AMX_TARGET void amx_k_config(void) {
    _Alignas(64) struct amx_cfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int i = 0; i < 8; i++) {
        c.rows[i] = AMX_T;
        c.colsb[i] = 64;
    }
    _tile_loadconfig(&c);
}

/* Rows [r0, r1) x the whole 16-token slices of tokens [t0, t1) of a K
 * pack. Per record, its scaled planes (8 KiB, amx_k_planes) serve up to
 * AMX_KSL slices; per slice, C_hi (tmm0) and C_lo (tmm1) accumulate the
 * four 64-chunks' products (A: tmm2/tmm5, B: tmm3-4/tmm6-7, two chunks in
 * flight), and isum = 2^sh C_hi + C_lo is exactly the block's integer of
 * every (token, row); then the mins and the two fmas as in
 * pack_k_avx512.c, so its bits. Returns the first token not done. */
static AMX_TARGET int amx_k_rect(const struct kern_mm *m, int r0, int r1, int t0, int t1) {
    const enum kern_wtype wt = m->wtype;
    const bool q6 = wt == KERN_W_Q6_K;
    const int n = m->n_in, nb = n / KERN_QK_K, n_sl = (t1 - t0) / AMX_T;
    const size_t rec = kern_cpu_pack_k_rec_bytes(wt);
    const long stride = (long)m->act_stride;
    _Alignas(64) uint8_t hi[64][64], lo[64][64];
    _Alignas(64) int32_t chi[AMX_T][16], clo[AMX_T][16];
    _Alignas(64) float acc[AMX_KSL * AMX_T][16];
    if (!n_sl)
        return t0;
    amx_k_config();
    for (int g = r0 / KERN_PACK_ROWS; g < (r1 + KERN_PACK_ROWS - 1) / KERN_PACK_ROWS; g++) {
        const uint8_t *base = (const uint8_t *)m->w + rec * (size_t)g * nb;
        for (int c0 = 0; c0 < n_sl; c0 += AMX_KSL) {
            const int ns = n_sl - c0 < AMX_KSL ? n_sl - c0 : AMX_KSL, tb = t0 + AMX_T * c0;
            memset(acc, 0, sizeof(acc[0]) * (size_t)(ns * AMX_T));
            for (int b = 0; b < nb; b++) {
                const uint8_t *rp = base + rec * (size_t)b;
                amx_k_planes(wt, rp, hi, lo);
                const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)rp));
                __m512 dm = _mm512_setzero_ps();
                __m512i mn[4];
                if (!q6) {
                    dm = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(rp + 32)));
                    kern_avx512_k_mins(rp, mn);
                }
                for (int sl = 0; sl < ns; sl++) {
                    const int t = tb + AMX_T * sl;
                    const int8_t *xa =
                        (const int8_t *)m->act + (size_t)t * m->act_stride + (size_t)b * KERN_QK_K;
                    _tile_zero(0);
                    _tile_zero(1);
                    for (int kc = 0; kc < 4; kc += 2) {
                        _tile_loadd(2, xa + 64 * kc, stride);
                        _tile_loadd(3, hi[16 * kc], 64);
                        _tile_loadd(4, lo[16 * kc], 64);
                        _tile_loadd(5, xa + 64 * (kc + 1), stride);
                        _tile_loadd(6, hi[16 * (kc + 1)], 64);
                        _tile_loadd(7, lo[16 * (kc + 1)], 64);
                        if (q6) {
                            _tile_dpbssd(0, 2, 3);
                            _tile_dpbssd(1, 2, 4);
                            _tile_dpbssd(0, 5, 6);
                            _tile_dpbssd(1, 5, 7);
                        } else {
                            _tile_dpbsud(0, 2, 3);
                            _tile_dpbsud(1, 2, 4);
                            _tile_dpbsud(0, 5, 6);
                            _tile_dpbsud(1, 5, 7);
                        }
                    }
                    _tile_stored(0, chi, 64);
                    _tile_stored(1, clo, 64);
#pragma GCC unroll 4
                    for (int j = 0; j < AMX_T; j++) {
                        const int8_t *xj = (const int8_t *)m->act + (size_t)(t + j) * m->act_stride;
                        const __m512i isum = _mm512_add_epi32(
                            _mm512_slli_epi32(_mm512_load_si512(chi[j]), q6 ? 6 : 5),
                            _mm512_load_si512(clo[j]));
                        const __m512 dx = _mm512_set1_ps(kern_cpu_act_q8K_d(xj, n)[b]);
                        float *aj = acc[AMX_T * sl + j];
                        __m512 a = _mm512_fmadd_ps(_mm512_mul_ps(dw, dx), _mm512_cvtepi32_ps(isum),
                                                   _mm512_load_ps(aj));
                        if (!q6) {
                            const __m512i msum =
                                kern_avx512_k_msum(mn, kern_cpu_act_q8K_s32(xj, n) + 8 * b);
                            /* -(d_x dmin), negated before the fma (pack_k_avx512.c) */
                            const __m512 dmx = kern_avx512_neg_prod(dm, dx);
                            a = _mm512_fmadd_ps(dmx, _mm512_cvtepi32_ps(msum), a);
                        }
                        _mm512_store_ps(aj, a);
                    }
                }
            }
            const int r = g * KERN_PACK_ROWS, left = m->n_out - r;
            const __mmask16 keep = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
            for (int j = 0; j < ns * AMX_T; j++)
                _mm512_mask_storeu_ps(m->y + (size_t)(tb + j) * m->n_out + r, keep,
                                      _mm512_load_ps(acc[j]));
        }
    }
    _tile_release();
    return t0 + AMX_T * n_sl;
}

/* Rows [r0, r1) (r0 a multiple of 16) x tokens [t0, t1) of a pack:
 * 16-token tiles on AMX, the rest on the AVX512 kernel. */
static AMX_TARGET void amx_rect(const struct kern_mm *m, int r0, int r1, int t0, int t1) {
    const int g1 = (r1 + KERN_PACK_ROWS - 1) / KERN_PACK_ROWS;
    int t = t0;
    if (m->wtype != KERN_W_Q8_0 && m->wtype != KERN_W_Q4_0) {
        t = amx_k_rect(m, r0, r1, t0, t1);
    } else if (t1 - t0 >= AMX_T) {
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
