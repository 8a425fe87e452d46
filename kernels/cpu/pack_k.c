/* pack_k.c - repacked Q4_K/Q5_K/Q6_K matrices (see kern.h): the record
 * layout, the packing of one record, the activation rows they take, and
 * the portable kernel.
 *
 * Layout. As for Q8_0/Q4_0 (pack.c): rows in groups of 16 (the last padded
 * with zero rows), one record per (group g, 256-block b), records in (g, b)
 * order. Row l (0..15) of the group; all multi-byte fields little-endian:
 *   Q4_K, 2368 B:  f16 d[16]         at 0
 *                  f16 dmin[16]      at 32
 *                  u8 sc[8][16]      at 64:   sc[j][l], sub-block j's scale
 *                  u8 mn[4][16][2]   at 192:  mn[m][l][h], min of 2m + h
 *                  qs[8][4][64]      at 320:  qs[k][c][4l + e] = the row's
 *                                    qs[32c + 4k + e] (low nibble: element
 *                                    64c + 4k + e, high: 64c + 32 + 4k + e)
 *   Q5_K, 2880 B:  as Q4_K up to 320, then
 *                  qh[8][64]         at 320:  qh[k][4l + e] = qh[4k + e]
 *                                    (bit j: element 32j + 4k + e's 16)
 *                  qs[8][4][64]      at 832:  as Q4_K
 *   Q6_K, 3360 B:  f16 d[16]         at 0
 *                  s8 sc[16][16]     at 32:   sc[s][l] = scales[s]
 *                  ql[8][2][2][64]   at 288:  ql[k][n][p][4l + e] =
 *                                    ql[64n + 32p + 4k + e]
 *                  qh[8][2][64]      at 2336: qh[k][n][4l + e] =
 *                                    qh[32n + 4k + e]
 * (ggml's fields, kern_cpu.h, re-sorted: nothing is requantized). So one
 * 64-byte load holds four consecutive weights (elements 4k..4k+3 of a
 * 32-chunk) of every row: against the token's four activations broadcast,
 * one vpmaddubsw and one vpdpwssd with the sub-block's scale as int16 pairs
 * add every row's share of lane k (the AVX2 order, below), or one vpdpbusd
 * adds it to the sub-block's dot (the one-sum order). The scales and
 * mins are stored unpacked to one byte each (Q4_K/Q5_K: 256 B a record
 * instead of 192, 2.8% more than the rows) so the kernel spreads them with
 * one shuffle; Q6_K's record is the rows' bytes exactly.
 *
 * Activations ("q8Ks rows"): per token the q8K act row of kern_matmul
 * (kern_cpu.h: int8 x[n], f32 d[n/256], int16 S[n/32] the 32-sums; the
 * Q4_K/Q5_K mins read (S[2m], S[2m+1]) as one int32) followed, for Q6_K, by
 * int16 o[n/4]: o[64b + 8k + c] = -32 X(b, c, k), X the sum of the four
 * activations 256b + 32c + 4k .. +3 of 32-chunk c, lane k; so the pair
 * (o[.. + 2i], o[.. + 2i + 1]) against a row's scale pair for chunks 2i,
 * 2i + 1 is the -32 of Q6_K's q - 32 for lane k, four pairs a lane (the
 * quants themselves go in unsigned, 0..63), then int16 X16[n/16], the sums
 * of each 16 activations (the one-sum kernels' -32, below).
 *
 * Two sequences per element (row, token), each with exact integers, so
 * their grouping is free and only the float steps below fix the bits:
 *
 * ggml's lanes, at the AVX2 and AVX-VNNI levels (pack_k_avx2.c, and the
 * portable kernel below; the AVX2 K tiles' on the rows, matmul_k_avx2.c,
 * ggml's AVX2 vec_dot): per block the 8 int32 lanes, lane k = sum over
 * elements e with (e % 32) / 4 == k of sc(e) q(e) x(e), then acc_k =
 * fmaf(d_w d_x, lane_k, acc_k); Q4_K mins: accm_m = fmaf(-(d_x dmin_w),
 * mn_2m S_2m + mn_2m+1 S_2m+1, accm_m); Q5_K: summ = fmaf(-(d_x dmin_w), the
 * four summed, summ); at the end ((acc0 + acc4) + (acc2 + acc6)) + ((acc1 +
 * acc5) + (acc3 + acc7)), plus (accm0 + accm2) + (accm1 + accm3) or summ.
 * These levels give ggml's bits on an AVX2 build.
 *
 * One integer a block, at the AVX-512 and AMX levels (pack_k_avx512.c,
 * pack_amx.c, and their rows: matmul_k_avx2.c's one_sum kernels): per
 * block isum = the sum over all 256 elements of sc(e) q(e) x(e) and, for
 * Q4_K/Q5_K, msum = the sum over sub-blocks j of mn_j S_j; then acc =
 * fmaf(d_w d_x, isum, acc) and acc = fmaf(-(d_x dmin_w), msum, acc); the
 * result is acc. A vector then holds one row's whole integer instead of a
 * lane of it, so the lanes' float work goes (8 conversions and fmas a
 * block and token become one or two), the sub-block dots are single
 * vpdpbusd chains times one scale, and tile products give the block's
 * integer exactly (pack_amx.c): 1.3x the lanes' AVX512 kernel on Q4_K,
 * and the AMX kernel more (docs/benchmarks.md, "K-quant packs in one
 * integer a block"). It is not ggml's AVX2 order, so against llama.cpp
 * these levels match as the other orders do, by a margin, not bit for bit
 * (tests/test_model_kquant.c: 280 of 288 teacher-forced steps, as at the
 * portable level). tests/lib/kq_util.h models both.
 *
 * The Q6_K activation row also carries the 16-sums X16 (kern_cpu.h): the
 * one-sum kernels take Q6_K's quants unsigned (0..63) and start isum at
 * -32 times the sum of sc_s X16_s; AMX folds the scales and the -32 into
 * its weight planes instead.
 */
#include "kernels/cpu/kern_cpu.h"

#include <math.h>
#include <string.h>

#define QK KERN_QK_K

size_t kern_cpu_pack_k_rec_bytes(enum kern_wtype t) {
    switch (t) {
    case KERN_W_Q4_K:
        return KERN_PK_Q4K_QS + 2048;
    case KERN_W_Q5_K:
        return KERN_PK_Q5K_QS + 2048;
    case KERN_W_Q6_K:
        return KERN_PK_Q6K_QH + 1024;
    default:
        return 0;
    }
}

/* Row l of record rec from ggml block blk (NULL: a padding row, which
 * stays as the zeroed record has it: d = 0 and every weight 0). */
static void pack_k_row(enum kern_wtype t, uint8_t *rec, int l, const void *blk) {
    if (t == KERN_W_Q6_K) {
        const struct kern_blk_q6_K *x = blk;
        memcpy(rec + 2 * l, &x->d, 2);
        for (int s = 0; s < 16; s++)
            rec[KERN_PK_Q6K_SC + 16 * s + l] = (uint8_t)x->scales[s];
        for (int k = 0; k < 8; k++) /* four bytes (e = 0..3) at a time */
            for (int n = 0; n < 2; n++) {
                for (int p = 0; p < 2; p++)
                    memcpy(rec + KERN_PK_Q6K_QL + 64 * (4 * k + 2 * n + p) + 4 * l,
                           x->ql + 64 * n + 32 * p + 4 * k, 4);
                memcpy(rec + KERN_PK_Q6K_QH + 64 * (2 * k + n) + 4 * l, x->qh + 32 * n + 4 * k, 4);
            }
        return;
    }
    /* Q4_K and Q5_K share d, dmin and scales at the same offsets */
    const struct kern_blk_q4_K *x4 = blk;
    const struct kern_blk_q5_K *x5 = blk;
    const uint8_t *qs = t == KERN_W_Q4_K ? x4->qs : x5->qs;
    memcpy(rec + 2 * l, &x4->d, 2);
    memcpy(rec + 32 + 2 * l, &x4->dmin, 2);
    for (int j = 0; j < 8; j++) {
        int sc, m;
        kern_cpu_scale_min_k4(x4->scales, j, &sc, &m);
        rec[KERN_PK_K45_SC + 16 * j + l] = (uint8_t)sc;
        rec[KERN_PK_K45_MN + 32 * (j / 2) + 2 * l + j % 2] = (uint8_t)m;
    }
    const size_t qs_at = t == KERN_W_Q4_K ? KERN_PK_Q4K_QS : KERN_PK_Q5K_QS;
    for (int k = 0; k < 8; k++) { /* four bytes (e = 0..3) at a time */
        for (int c = 0; c < 4; c++)
            memcpy(rec + qs_at + 64 * (4 * k + c) + 4 * l, qs + 32 * c + 4 * k, 4);
        if (t == KERN_W_Q5_K)
            memcpy(rec + KERN_PK_Q5K_QH + 64 * k + 4 * l, x5->qh + 4 * k, 4);
    }
}

void kern_cpu_pack_k_record(enum kern_wtype t, uint8_t *rec, const void *w, size_t row_bytes,
                            int n_rows, int b) {
    const size_t blk = kern_row_bytes(t, QK);
    memset(rec, 0, kern_cpu_pack_k_rec_bytes(t));
    for (int l = 0; l < n_rows && l < KERN_PACK_ROWS; l++)
        pack_k_row(t, rec, l, (const uint8_t *)w + row_bytes * (size_t)l + blk * (size_t)b);
}

void kern_cpu_act_q8Ks(enum kern_wtype t, const float *x, void *dst, int n) {
    kern_cpu_act_q8K(x, dst, n);
    if (t != KERN_W_Q6_K)
        return;
    const int8_t *qs = dst;
    int16_t *o = (int16_t *)((char *)dst + kern_cpu_act_q8K_bytes(n));
    for (int b = 0; b < n / QK; b++)
        for (int k = 0; k < 8; k++)
            for (int c = 0; c < 8; c++) { /* pair i = c / 2, half c % 2 */
                const int8_t *a = qs + QK * b + 32 * c + 4 * k;
                o[64 * b + 8 * k + c] = (int16_t)(-32 * (a[0] + a[1] + a[2] + a[3]));
            }
    int16_t *x16 = o + n / 4;
    for (int s = 0; s < n / 16; s++) {
        int v = 0;
        for (int e = 0; e < 16; e++)
            v += qs[16 * s + e];
        x16[s] = (int16_t)v;
    }
}

/* Weight e (0..255) of row l of a record: its quant q (Q6_K: minus 32),
 * sub-block scale sc; by the layout above. */
static int pack_k_weight(enum kern_wtype t, const uint8_t *rec, int l, int e, int *sc) {
    const int c = e / 32, k = (e % 32) / 4, i = e % 4;
    if (t == KERN_W_Q6_K) {
        const int n = c / 4, r = c % 4;
        const uint8_t lo = rec[KERN_PK_Q6K_QL + 64 * (4 * k + 2 * n + r % 2) + 4 * l + i];
        const uint8_t hi = rec[KERN_PK_Q6K_QH + 64 * (2 * k + n) + 4 * l + i];
        *sc = (int8_t)rec[KERN_PK_Q6K_SC + 16 * (e / 16) + l];
        return ((r < 2 ? lo & 0x0F : lo >> 4) | ((hi >> (2 * r)) & 3) << 4) - 32;
    }
    const size_t qs_at = t == KERN_W_Q4_K ? KERN_PK_Q4K_QS : KERN_PK_Q5K_QS;
    const uint8_t byte = rec[qs_at + 64 * (4 * k + c / 2) + 4 * l + i];
    int q = c % 2 ? byte >> 4 : byte & 0x0F;
    if (t == KERN_W_Q5_K)
        q |= ((rec[KERN_PK_Q5K_QH + 64 * k + 4 * l + i] >> c) & 1) << 4;
    *sc = rec[KERN_PK_K45_SC + 16 * c + l];
    return q;
}

/* The portable kernel: rows [r0, r1) (r0 a multiple of 16) x tokens. */
void kern_cpu_pack_k_rect_scalar(const struct kern_mm *m, int r0, int r1, int t0, int t1) {
    const enum kern_wtype t = m->wtype;
    const int n = m->n_in, nb = n / QK;
    const size_t rec = kern_cpu_pack_k_rec_bytes(t);
    for (int r = r0; r < r1; r++) {
        const int g = r / KERN_PACK_ROWS, l = r % KERN_PACK_ROWS;
        for (int tk = t0; tk < t1; tk++) {
            const int8_t *xq = (const int8_t *)m->act + (size_t)tk * m->act_stride;
            const float *xd = kern_cpu_act_q8K_d(xq, n);
            const int16_t *xs = kern_cpu_act_q8K_s32(xq, n);
            float acc[8] = {0}, accm[4] = {0};
            for (int b = 0; b < nb; b++) {
                const uint8_t *rp = (const uint8_t *)m->w + rec * ((size_t)g * nb + b);
                int32_t lane[8] = {0};
                for (int e = 0; e < QK; e++) {
                    int sc;
                    const int q = pack_k_weight(t, rp, l, e, &sc);
                    lane[(e % 32) / 4] += sc * (q * xq[QK * b + e]);
                }
                uint16_t h;
                memcpy(&h, rp + 2 * l, 2);
                const float d = xd[b] * kern_f16_to_f32_1(h);
                for (int k = 0; k < 8; k++)
                    acc[k] = fmaf(d, (float)lane[k], acc[k]);
                if (t == KERN_W_Q6_K)
                    continue;
                memcpy(&h, rp + 32 + 2 * l, 2);
                const float dmin = kern_cpu_neg_prod(xd[b], kern_f16_to_f32_1(h));
                int32_t mins[4];
                for (int mi = 0; mi < 4; mi++) {
                    const uint8_t *mn = rp + KERN_PK_K45_MN + 32 * mi + 2 * l;
                    mins[mi] = mn[0] * xs[8 * b + 2 * mi] + mn[1] * xs[8 * b + 2 * mi + 1];
                }
                if (t == KERN_W_Q4_K)
                    for (int mi = 0; mi < 4; mi++)
                        accm[mi] = fmaf(dmin, (float)mins[mi], accm[mi]);
                else
                    accm[0] = fmaf(dmin, (float)(mins[0] + mins[1] + mins[2] + mins[3]), accm[0]);
            }
            float v =
                ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
            if (t == KERN_W_Q4_K)
                v += (accm[0] + accm[2]) + (accm[1] + accm[3]);
            else if (t == KERN_W_Q5_K)
                v += accm[0];
            m->y[(size_t)tk * m->n_out + r] = v;
        }
    }
}
