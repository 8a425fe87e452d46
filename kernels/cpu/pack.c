/* pack.c - repacked Q8_0/Q4_0 matrices (see kern.h): the layout, the
 * packing, the activation rows they take, and the portable kernel; the
 * entry points for every packed type (the K-quants' layout and kernels
 * are pack_k.c's).
 *
 * Layout. Rows go in groups of KERN_PACK_ROWS = 16 (the last group padded
 * with zero rows). Group g, block b (32 weights of each of its 16 rows) is
 * one record, records in (g, b) order:
 *   Q8_0, 544 B:  f16 d[16] (row l's scale), then for k = 0..7 64 bytes:
 *                 byte 4l + e = w[l][4k + e] + 128 (as u8)
 *   Q4_0, 288 B:  f16 d[16], then for k = 0..3 64 bytes:
 *                 byte 4l + e = u[l][8k + e] | u[l][8k + 4 + e] << 4
 * where w is the signed weight and u = w + 8 the stored nibble. One 64-byte
 * load thus holds four consecutive weights of every row, the unsigned
 * operand of one vpdpbusd whose signed operand is the token's four
 * activations broadcast to all 16 lanes. Same bytes as the rows (16 x 34 or
 * 16 x 18 per record): a pack costs a copy of the matrix, nothing more.
 *
 * Activations ("q8s rows"): per token the Q8_0 quantization of kern_matmul
 * (kern_cpu_act_q8: int8 x[n], f32 d_x[n/32]) followed by int32 o[n/4],
 * each group of four x's offset term: -128 s for Q8_0, -8 s for Q4_0, s
 * the sum of the four, and int32 ob[n/32], each block's eight o summed.
 * Then lane L (0..7) of block b, the exact sum of w x over elements
 * 4L..4L+3 of the block, is
 *   Q8_0: o + sum (w + 128) x         Q4_0: o + sum u x
 * in int32, and the block's exact sum of w x is ob plus the lanes' sums
 * of (w + 128) x or u x.
 *
 * The sequence per element (row, token), which the portable kernel below
 * runs literally, the AVX512 one (pack_avx512.c) 16 rows a vector, the AMX
 * one (pack_amx.c) 16 tokens x 16 rows a tile product and the AVX2 one
 * (pack_avx2.c) 8 rows a vector, for any batch or tile, so every level
 * gives the same bits: one accumulator, acc = fmaf((float)sum_b,
 * d_w * d_x, acc) over the blocks in order, sum_b the block's exact integer
 * sum (the eight lanes above added, offsets included). It is the order of
 * ggml's repacked q4_0_8x8 kernels, and of the rows wherever the model
 * packs the type: Q4_0 on every level (matmul.c, matmul_q.h), Q8_0 from
 * the AVX512 level up (matmul_q.h; on the levels that do not pack Q8_0 its rows
 * keep the eight lane sums of ggml's AVX2 vec_dot, see matmul_q.h, and
 * test_model_reference.c has how each order meets the references). With
 * the sum formed in integers before any float operation, a kernel spends
 * one conversion and one fma per block of 8 or 16 rows, not per lane:
 *  - Q4_0, with the AVX2 kernel's int16 partial sums (pack_avx2.c): a
 *    matmul sweep on a Zen 3 ran 512-token prefill 1.8-1.9x as fast as
 *    the lane order and decode 1.03-1.2x (0.84-0.88 of a read of the same
 *    bytes, from 0.70-0.80; docs/benchmarks.md, "Q4_0 in one integer sum
 *    per block");
 *  - Q8_0 at AVX512, where it summed its eight lanes apart before (a
 *    conversion and an fma per lane): on an Emerald Rapids vCPU a
 *    512-token product ran 1.4-1.6x as fast, dummy-1g q8_0 prefill 1.42x
 *    on one thread and 1.33x on two, decode level ("Q8_0 in one integer
 *    sum per block (Xeon, avx512)").
 */
#include "kernels/cpu/kern_cpu.h"

#include <errno.h>
#include <math.h>
#include <string.h>

#include "mem.h"

size_t kern_cpu_pack_rec_bytes(enum kern_wtype t) {
    return t == KERN_W_Q8_0   ? 32 + 8 * 64
           : t == KERN_W_Q4_0 ? 32 + 4 * 64
                              : kern_cpu_pack_k_rec_bytes(t);
}

/* Elements of one record's block: 32, or 256 for the K-quants. */
static int pack_blk_elems(enum kern_wtype t) {
    return t == KERN_W_Q8_0 || t == KERN_W_Q4_0 ? KERN_QK : KERN_QK_K;
}

/* Which levels pack which types: every packed type at AVX512 and AMX;
 * Q4_0, Q4_K and Q5_K at AVX2 and AVX-VNNI (pack_avx2.c, pack_k_avx2.c).
 * Not Q8_0 there, whose decode already runs near the read bandwidth on the
 * rows and whose prefill ran 5-7% slower packed when the pack still summed
 * eight lanes (docs/benchmarks.md, "An AVX2 kernel for the Q4_0 pack";
 * its one-token tiles have not been measured since), nor Q6_K, whose AVX2 pack kernel ran
 * 0.84-0.93x the rows in a decode sweep on a Zen 3 ("K-quant packs at
 * AVX2"; that kernel stays for Q6_K packs that meet these levels, which
 * the tests make). */
bool kern_pack_supported(enum kern_wtype t, int n_in) {
    const enum kern_isa isa = kern_isa();
    const bool level =
        isa >= KERN_ISA_AVX512 ||
        (kern_cpu_isa_ymm16(isa) && (t == KERN_W_Q4_0 || t == KERN_W_Q4_K || t == KERN_W_Q5_K));
    return level && kern_cpu_pack_rec_bytes(t) && n_in > 0 && n_in % pack_blk_elems(t) == 0;
}

/* One pack job: the matrix, its pack, and the groups each slot takes. */
struct pack_job {
    enum kern_wtype t;
    const uint8_t *w;
    uint8_t *dst;
    size_t rec, row;
    int n_out, nb, ng;
};

/* Group g's records (every byte written: the padding rows too). */
static void pack_group(const struct pack_job *j, int g) {
    const enum kern_wtype t = j->t;
    for (int b = 0; b < j->nb; b++) {
        uint8_t *r = j->dst + j->rec * ((size_t)g * j->nb + b);
        if (pack_blk_elems(t) == KERN_QK_K) {
            kern_cpu_pack_k_record(t, r, j->w + j->row * (size_t)g * KERN_PACK_ROWS, j->row,
                                   j->n_out - g * KERN_PACK_ROWS, b);
            continue;
        }
        uint16_t *d = (uint16_t *)r;
        uint8_t *q = r + 32;
        for (int l = 0; l < KERN_PACK_ROWS; l++) {
            const int o = g * KERN_PACK_ROWS + l;
            const uint8_t *src = j->w + (size_t)o * j->row;
            if (o >= j->n_out) { /* padding: d = 0, and weights of value 0 */
                d[l] = 0;
                for (int k = 0; k < (t == KERN_W_Q8_0 ? 8 : 4); k++)
                    memset(q + k * 64 + 4 * l, t == KERN_W_Q8_0 ? 128 : 8 | 8 << 4, 4);
                continue;
            }
            /* a lane's four bytes (e = 0..3) at a time, as one uint32 */
            uint32_t a, c;
            if (t == KERN_W_Q8_0) {
                const struct kern_blk_q8_0 *blk = (const struct kern_blk_q8_0 *)src + b;
                memcpy(&d[l], &blk->d, 2);
                for (int k = 0; k < 8; k++) {
                    memcpy(&a, blk->qs + 4 * k, 4);
                    a ^= 0x80808080u; /* w + 128 as u8 */
                    memcpy(q + k * 64 + 4 * l, &a, 4);
                }
            } else {
                const struct kern_blk_q4_0 *blk = (const struct kern_blk_q4_0 *)src + b;
                memcpy(&d[l], &blk->d, 2);
                for (int k = 0; k < 4; k++) {
                    /* weights 8k + e and 8k + 4 + e: low nibbles of qs for
                     * k < 2, high nibbles of qs[.. - 16] after */
                    memcpy(&a, blk->qs + 8 * (k % 2), 4);
                    memcpy(&c, blk->qs + 8 * (k % 2) + 4, 4);
                    a = k < 2 ? (a & 0x0F0F0F0Fu) | (c & 0x0F0F0F0Fu) << 4
                              : (a >> 4 & 0x0F0F0F0Fu) | (c & 0xF0F0F0F0u);
                    memcpy(q + k * 64 + 4 * l, &a, 4);
                }
            }
        }
    }
}

/* Slot ith packs a contiguous share of the groups: each group is written
 * by one slot, so the bytes are the same for any thread count. */
static void pack_worker(void *arg, int ith, int nth) {
    const struct pack_job *j = arg;
    const int g0 = (int)((int64_t)j->ng * ith / nth), g1 = (int)((int64_t)j->ng * (ith + 1) / nth);
    for (int g = g0; g < g1; g++)
        pack_group(j, g);
}

size_t kern_pack_bytes(enum kern_wtype t, int n_in, int n_out) {
    const size_t rec = kern_cpu_pack_rec_bytes(t);
    if (!rec || n_in <= 0 || n_in % pack_blk_elems(t) || n_out <= 0)
        return 0;
    const int nb = n_in / pack_blk_elems(t), ng = (n_out + KERN_PACK_ROWS - 1) / KERN_PACK_ROWS;
    return rec * (size_t)nb * (size_t)ng;
}

/* The groups split over p's threads into dst (every byte written). */
static void pack_fill(struct kern_pool *p, enum kern_wtype t, const void *w, int n_in, int n_out,
                      uint8_t *dst) {
    struct pack_job j = {.t = t,
                         .w = w,
                         .dst = dst,
                         .rec = kern_cpu_pack_rec_bytes(t),
                         .row = kern_row_bytes(t, (size_t)n_in),
                         .n_out = n_out,
                         .nb = n_in / pack_blk_elems(t),
                         .ng = (n_out + KERN_PACK_ROWS - 1) / KERN_PACK_ROWS};
    kern_pool_run(p, pack_worker, &j);
}

int kern_pack_make(struct kern_pool *p, struct kern_pack *pk, enum kern_wtype t, const void *w,
                   int n_in, int n_out) {
    const size_t bytes = kern_pack_bytes(t, n_in, n_out);
    if (!bytes || !w)
        return kern_cpu_pack_rec_bytes(t) ? -EINVAL : -ENOTSUP;
    uint8_t *dst = mem_alloc(MEM_KERN, bytes); /* 64-byte aligned */
    if (!dst)
        return -ENOMEM;
    pack_fill(p, t, w, n_in, n_out, dst);
    *pk = (struct kern_pack){.data = dst, .bytes = bytes, .type = t, .n_in = n_in, .n_out = n_out};
    return 0;
}

int kern_pack_make_in(struct kern_pool *p, struct kern_pack *pk, enum kern_wtype t, const void *w,
                      int n_in, int n_out, void *buf) {
    const size_t bytes = kern_pack_bytes(t, n_in, n_out);
    if (!bytes || !w || !buf || (uintptr_t)buf % 64)
        return kern_cpu_pack_rec_bytes(t) ? -EINVAL : -ENOTSUP;
    pack_fill(p, t, w, n_in, n_out, buf);
    *pk = (struct kern_pack){
        .data = buf, .bytes = bytes, .type = t, .n_in = n_in, .n_out = n_out, .borrowed = true};
    return 0;
}

void kern_pack_free(struct kern_pack *pk) {
    if (!pk)
        return;
    if (!pk->borrowed)
        mem_free(pk->data);
    *pk = (struct kern_pack){0};
}

void kern_cpu_act_q8s(enum kern_wtype t, const float *x, void *dst, int n) {
    if (pack_blk_elems(t) == KERN_QK_K) {
        kern_cpu_act_q8Ks(t, x, dst, n);
        return;
    }
    kern_cpu_act_q8(x, dst, n);
    const int8_t *qs = dst;
    int32_t *o = (int32_t *)((char *)dst + n + (size_t)(n / KERN_QK) * sizeof(float));
    int32_t *ob = o + n / 4;
    const int32_t mul = t == KERN_W_Q8_0 ? -128 : -8;
    if (kern_isa() >= KERN_ISA_AVX512) {
        kern_cpu_act_q8_sums_avx512(qs, o, ob, n, mul);
        return;
    }
    for (int b = 0; b < n / KERN_QK; b++) { /* n / 4 = 8 groups a block */
        int32_t sum = 0;
        for (int q = 8 * b; q < 8 * b + 8; q++) {
            o[q] = mul * (qs[4 * q] + qs[4 * q + 1] + qs[4 * q + 2] + qs[4 * q + 3]);
            sum += o[q];
        }
        ob[b] = sum;
    }
}

/* Lane L (0..7) of row l of record r: the exact sum of w x over elements
 * 4L..4L+3 of the block, x the block's activations, o the lane's offset. */
static int32_t pack_lane(enum kern_wtype t, const uint8_t *r, int l, int L, const int8_t *x,
                         int32_t o) {
    const uint8_t *q = r + 32;
    int32_t v = o;
    for (int e = 0; e < 4; e++) {
        uint8_t u;
        if (t == KERN_W_Q8_0) {
            u = q[L * 64 + 4 * l + e];
        } else {
            const uint8_t byte = q[(L / 2) * 64 + 4 * l + e];
            u = L % 2 ? byte >> 4 : byte & 0x0F;
        }
        v += u * x[4 * L + e];
    }
    return v;
}

/* The portable kernel: rows [r0, r1) (r0 a multiple of 16) x tokens. */
void kern_cpu_pack_rect_scalar(const struct kern_mm *m, int r0, int r1, int t0, int t1) {
    if (pack_blk_elems(m->wtype) == KERN_QK_K) {
        kern_cpu_pack_k_rect_scalar(m, r0, r1, t0, t1);
        return;
    }
    const int n = m->n_in, nb = n / KERN_QK;
    const size_t rec = kern_cpu_pack_rec_bytes(m->wtype);
    for (int r = r0; r < r1; r++) {
        const int g = r / KERN_PACK_ROWS, l = r % KERN_PACK_ROWS;
        for (int t = t0; t < t1; t++) {
            const int8_t *xq = (const int8_t *)m->act + (size_t)t * m->act_stride;
            const float *xd = (const float *)(xq + n);
            const int32_t *xo = (const int32_t *)(xd + nb);
            float acc = 0.0f;
            for (int b = 0; b < nb; b++) { /* the block's sum, one fma */
                const uint8_t *rp = (const uint8_t *)m->w + rec * ((size_t)g * nb + b);
                uint16_t dh;
                memcpy(&dh, rp + 2 * l, 2);
                int32_t sum = 0;
                for (int L = 0; L < 8; L++)
                    sum += pack_lane(m->wtype, rp, l, L, xq + b * KERN_QK, xo[8 * b + L]);
                acc = fmaf((float)sum, kern_f16_to_f32_1(dh) * xd[b], acc);
            }
            m->y[(size_t)t * m->n_out + r] = acc;
        }
    }
}
