/* kern_cpu.h - internals shared by the CPU kernels (not a public header).
 *
 * The AVX2 code lives in functions marked KERN_AVX2 (target attribute), so
 * the build needs no -mavx2 and the same binary runs on any x86-64; callers
 * pick a path with kern_isa() at run time.
 *
 * Activation layout for quantized matmuls ("q8 act row"): per token, n int8
 * values (32-byte aligned) followed by n/32 floats, the f16-rounded block
 * scales d_x as f32; rows kern_cpu_act_q8_bytes(n) apart. The values are
 * those of kern_quantize_row_q8_0, only laid out for aligned loads.
 */
#ifndef LLMD_KERN_CPU_H
#define LLMD_KERN_CPU_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/kern.h"

#define KERN_AVX2 __attribute__((target("avx2,fma,f16c")))
#define KERN_QK   32 /* elements per Q8_0/Q4_0 block */

struct kern_blk_q8_0 {
    uint16_t d; /* f16 */
    int8_t qs[KERN_QK];
};
struct kern_blk_q4_0 {
    uint16_t d; /* f16 */
    uint8_t qs[KERN_QK / 2];
};
_Static_assert(sizeof(struct kern_blk_q8_0) == 34, "ggml block_q8_0 is 34 bytes");
_Static_assert(sizeof(struct kern_blk_q4_0) == 18, "ggml block_q4_0 is 18 bytes");

/* K-quant super-blocks, byte for byte ggml's (ggml-common.h block_q4_K,
 * block_q5_K, block_q6_K; QK_K = 256, K_SCALE_SIZE = 12). Q4_K and Q5_K
 * hold 8 sub-blocks of 32 with a 6-bit scale and a 6-bit min each,
 * x = d * sc[j] * q - dmin * m[j]; the 12 scale bytes pack them as
 *   j < 4:  sc[j] = scales[j] & 63,   m[j] = scales[j + 4] & 63,
 *   j >= 4: sc[j] = (scales[j + 4] & 15) | (scales[j - 4] >> 6) << 4,
 *           m[j]  = (scales[j + 4] >> 4) | (scales[j] >> 6) << 4
 * (ggml-quants.c get_scale_min_k4). Element e of sub-block j = 2k + h
 * (h = 0, 1) is the low (h = 0) or high nibble of qs[32k + e % 32]; Q5_K
 * adds bit j of qh[e % 32] as its value 16. Q6_K: 16 groups of 16 with an
 * int8 scale, x = d * scales[e / 16] * (q - 32), q 6 bits: for element e,
 * half n = e / 128, quarter r = (e % 128) / 32, l = e % 32: the low 4 bits
 * are the low (r < 2) or high nibble of ql[64n + 32(r & 1) + l], the high
 * 2 bits are bits 2r, 2r+1 of qh[32n + l]. Q3_K: 16 groups of 16 with a
 * 6-bit scale stored plus 32, x = d * (sc[e / 16] - 32) * (q - 4), q 3 bits:
 * for element e, half n, quarter r and l as for Q6_K, the low 2 bits are
 * bits 2r, 2r+1 of qs[32n + l] and the high bit is bit 4n + r of hmask[l]
 * (ggml-quants.c dequantize_row_q3_K); scales[12] hold scale j's low 4 bits
 * in the low (j < 8) or high nibble of scales[j % 8] and its high 2 bits in
 * bits 2(j / 4), 2(j / 4) + 1 of scales[8 + j % 4]. Q2_K: 16 groups of 16
 * with a 4-bit scale and a 4-bit min, x = d * (scales[g] & 15) * q -
 * dmin * (scales[g] >> 4), q the 2 bits at the place Q3_K's low bits have
 * (ggml-quants.c dequantize_row_q2_K). */
struct kern_blk_q2_K {
    uint8_t scales[KERN_QK_K / 16];
    uint8_t qs[KERN_QK_K / 4];
    uint16_t d, dmin; /* f16 */
};
struct kern_blk_q3_K {
    uint8_t hmask[KERN_QK_K / 8];
    uint8_t qs[KERN_QK_K / 4];
    uint8_t scales[12];
    uint16_t d; /* f16 */
};
struct kern_blk_q4_K {
    uint16_t d, dmin; /* f16 */
    uint8_t scales[12];
    uint8_t qs[KERN_QK_K / 2];
};
struct kern_blk_q5_K {
    uint16_t d, dmin; /* f16 */
    uint8_t scales[12];
    uint8_t qh[KERN_QK_K / 8];
    uint8_t qs[KERN_QK_K / 2];
};
struct kern_blk_q6_K {
    uint8_t ql[KERN_QK_K / 2];
    uint8_t qh[KERN_QK_K / 4];
    int8_t scales[KERN_QK_K / 16];
    uint16_t d; /* f16 */
};
/* Q8_K as ggml stores it (kern_quantize_row_q8_K's output). */
struct kern_blk_q8_K {
    float d;
    int8_t qs[KERN_QK_K];
    int16_t bsums[KERN_QK_K / 16];
};
_Static_assert(sizeof(struct kern_blk_q2_K) == 84, "ggml block_q2_K is 84 bytes");
_Static_assert(sizeof(struct kern_blk_q3_K) == 110, "ggml block_q3_K is 110 bytes");
_Static_assert(sizeof(struct kern_blk_q4_K) == 144, "ggml block_q4_K is 144 bytes");
_Static_assert(sizeof(struct kern_blk_q5_K) == 176, "ggml block_q5_K is 176 bytes");
_Static_assert(sizeof(struct kern_blk_q6_K) == 210, "ggml block_q6_K is 210 bytes");
_Static_assert(sizeof(struct kern_blk_q8_K) == 292, "ggml block_q8_K is 292 bytes");

/* Sub-block j's 6-bit scale and min of a Q4_K/Q5_K scales[12]. */
static inline void kern_cpu_scale_min_k4(const uint8_t *q, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* The 2 bits of element e (0..255) of a Q2_K or Q3_K qs[64]: bits 2r,
 * 2r + 1 of qs[32h + l] for e = 128h + 32r + l. */
static inline int kern_cpu_q2_bits(const uint8_t *qs, int e) {
    return (qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
}

/* Group j's scale (-32..31) of a Q3_K scales[12]. */
static inline int kern_cpu_scale_q3_K(const uint8_t *s, int j) {
    const int lo = j < 8 ? s[j] & 0xF : s[j - 8] >> 4;
    return (lo | ((s[8 + j % 4] >> (2 * (j / 4))) & 3) << 4) - 32;
}

/* Bytes of one q8 act row of n elements, a multiple of 64. */
static inline size_t kern_cpu_act_q8_bytes(int n) {
    return ((size_t)n + (size_t)(n / KERN_QK) * 4 + 63) & ~(size_t)63;
}

/* One quantized activation row x[n] (n a multiple of 32) -> q8 act row at
 * dst (reference rule: ggml's quantize_row_q8_0_ref). At the AVX2 and
 * AVX-VNNI levels it runs kern_cpu_act_q8_avx2 (quant_avx2.c), from AVX512
 * up kern_cpu_act_q8_avx512 (quant_avx512.c); both give the same bytes
 * for every x. */
void kern_cpu_act_q8(const float *x, void *dst, int n);
/* The same, eight lanes at a time (the same contract; kern_isa() >= AVX2). */
void kern_cpu_act_q8_avx2(const float *x, void *dst, int n);
/* The same, sixteen blocks' scales a vector (quant_avx512.c; the same
 * contract; kern_isa() >= AVX512). */
void kern_cpu_act_q8_avx512(const float *x, void *dst, int n);
/* kern_cpu_act_q8s's sums of a q8 act row's n bytes qs (n a multiple of
 * 32): o[i] = mul * (qs[4i] + .. + qs[4i + 3]) for i < n / 4, ob[b] = the
 * sum of o[8b .. 8b + 7]; exact (quant_avx512.c; kern_isa() >= AVX512). */
void kern_cpu_act_q8_sums_avx512(const int8_t *qs, int32_t *o, int32_t *ob, int n, int32_t mul);

/* A Q8_0 block's 1 / d for its scale d = amax / 127, as both quantizers
 * take it (and quant_avx512.c's vector of them). ggml has d ? 1 / d : 0; a subnormal d (stored as
 * f16 it is 0 anyway) could make 1 / d infinite and the int8 conversion undefined, so such a block
 * quantizes to zeros. */
static inline float kern_cpu_q8_0_iscale(float d) {
    return d >= 0x1p-126f ? 1.0f / d : 0.0f;
}

/* The activation row of a packed matmul of type t (pack.c): a q8 act row
 * followed by int32 o[n/4], each group of four's offset term, and int32
 * ob[n/32], each block's (the sum of its eight o). Bytes a multiple of
 * 64. */
static inline size_t kern_cpu_act_q8s_bytes(int n) {
    return ((size_t)n + (size_t)(n / KERN_QK) * 8 + (size_t)n + 63) & ~(size_t)63;
}
void kern_cpu_act_q8s(enum kern_wtype t, const float *x, void *dst, int n);

/* Bytes of one record (16 rows x one block) of a pack of type t; 0 when t
 * has no packed layout. */
size_t kern_cpu_pack_rec_bytes(enum kern_wtype t);

/* Activation layout for K-quant matmuls ("q8K act row"): per token, n int8
 * values (32-byte aligned), then n/256 floats d (the Q8_K block scales),
 * then n/32 int16 sums of each 32 values (bsums[2j] + bsums[2j+1] of Q8_K:
 * what the Q4_K/Q5_K mins multiply); rows kern_cpu_act_q8K_bytes(n) apart.
 * The values are kern_quantize_row_q8_K's. */
static inline size_t kern_cpu_act_q8K_bytes(int n) {
    return ((size_t)n + (size_t)(n / KERN_QK_K) * 4 + (size_t)(n / 32) * 2 + 63) & ~(size_t)63;
}
static inline const float *kern_cpu_act_q8K_d(const void *act, int n) {
    return (const float *)((const int8_t *)act + n);
}
static inline const int16_t *kern_cpu_act_q8K_s32(const void *act, int n) {
    return (const int16_t *)((const int8_t *)act + n + (size_t)(n / KERN_QK_K) * 4);
}

/* Q2_K's activation row ("q8K16 row"): a q8K act row, then at
 * kern_cpu_act_q8K_bytes(n) n/16 int16 sums of each 16 values (Q8_K's
 * bsums: what Q2_K's per-16 mins multiply). Bytes a multiple of 64. */
static inline size_t kern_cpu_act_q8K16_bytes(int n) {
    return kern_cpu_act_q8K_bytes(n) + (((size_t)n / 8 + 63) & ~(size_t)63);
}
static inline const int16_t *kern_cpu_act_q8K_s16(const void *act, int n) {
    return (const int16_t *)((const char *)act + kern_cpu_act_q8K_bytes(n));
}
void kern_cpu_act_q8K16(const float *x, void *dst, int n);

/* One activation row x[n] (n a multiple of 256) -> q8K act row at dst. At
 * the AVX2 level and above it runs kern_cpu_act_q8K_avx2 (quant_avx2.c):
 * the same bytes for every x, NaN and infinities included. */
void kern_cpu_act_q8K(const float *x, void *dst, int n);
void kern_cpu_act_q8K_avx2(const float *x, void *dst, int n);

/* K-quant packs (pack_k.c): field offsets in a record (Q4_K/Q5_K share d,
 * dmin, scales and mins), the record's bytes (0 for other types), and one
 * record (group of n_rows <= 16 rows at w, row_bytes apart; block b) into
 * rec, padding rows zero. */
#define KERN_PK_K45_SC 64
#define KERN_PK_K45_MN 192
#define KERN_PK_Q4K_QS 320
#define KERN_PK_Q5K_QH 320
#define KERN_PK_Q5K_QS 832
#define KERN_PK_Q6K_SC 32
#define KERN_PK_Q6K_QL 288
#define KERN_PK_Q6K_QH 2336
size_t kern_cpu_pack_k_rec_bytes(enum kern_wtype t);
void kern_cpu_pack_k_record(enum kern_wtype t, uint8_t *rec, const void *w, size_t row_bytes,
                            int n_rows, int b);

/* The activation row of a K pack ("q8Ks row"): a q8K act row, then for
 * Q6_K n/4 int16 at kern_cpu_act_q8K_bytes(n), -32 times the sums of four
 * (the AVX2 kernel's), and n/16 int16 after them, the sums of each 16 (the
 * one-sum kernels'; pack_k.c). Bytes a multiple of 64 (the same for the
 * three types). */
static inline size_t kern_cpu_act_q8Ks_bytes(int n) {
    return kern_cpu_act_q8K_bytes(n) + (size_t)n / 2 + (((size_t)n / 8 + 63) & ~(size_t)63);
}
static inline const int16_t *kern_cpu_act_q8Ks_x16(const void *act, int n) {
    return (const int16_t *)((const char *)act + kern_cpu_act_q8K_bytes(n) + (size_t)n / 2);
}
void kern_cpu_act_q8Ks(enum kern_wtype t, const float *x, void *dst, int n);

/* One K-quant weight row (n/256 blocks) dotted with one q8K act row, in
 * ggml's generic order (matmul_k.c); n a multiple of 256. */
float kern_cpu_dot_q2_K(const void *w, const void *act, int n); /* a q8K16 row */
float kern_cpu_dot_q3_K(const void *w, const void *act, int n);
float kern_cpu_dot_q4_K(const void *w, const void *act, int n);
float kern_cpu_dot_q5_K(const void *w, const void *act, int n);
float kern_cpu_dot_q6_K(const void *w, const void *act, int n);

/* K-quant row dequantization (quant_k.c), as ggml's dequantize_row_q*_K. */
void kern_cpu_dequant_q2_K(const void *src, float *dst, int n);
void kern_cpu_dequant_q3_K(const void *src, float *dst, int n);
void kern_cpu_dequant_q4_K(const void *src, float *dst, int n);
void kern_cpu_dequant_q5_K(const void *src, float *dst, int n);
void kern_cpu_dequant_q6_K(const void *src, float *dst, int n);

/* One matmul job: Y rows [r0, r1) x tokens [t0, t1). act is the converted
 * activation (f32 for F32/BF16 -- the caller's x --, f16 for F16 -- f32
 * holding f16 values at the AVX512 level --, q8 act rows for Q8_0/Q4_0, q8K
 * act rows for the K-quants) with act_stride bytes per token. */
struct kern_mm {
    float *y;
    const void *act;
    size_t act_stride;
    const void *w;
    size_t w_stride; /* bytes per weight row */
    enum kern_wtype wtype;
    int n_in, n_out;
};
typedef void (*kern_cpu_rect_fn)(const struct kern_mm *m, int r0, int r1, int t0, int t1);

/* The AVX2 micro-kernel for weights of type t, or NULL when it has none
 * (kern_matmul then uses its portable one). Call only when kern_isa() is
 * at least KERN_ISA_AVX2. */
kern_cpu_rect_fn kern_cpu_rect_avx2(enum kern_wtype t);

/* The levels that run the AVX2 kernels' shapes (16 ymm registers): avx2,
 * and avx-vnni, whose Q8_0/Q4_0 rows use the VEX vpdpbusd in the same
 * tiles. Their tile sizes, which types they pack and when a pack hands a
 * batch to the rows are one rule for both (matmul.c, pack.c). */
static inline bool kern_cpu_isa_ymm16(enum kern_isa isa) {
    return isa == KERN_ISA_AVX2 || isa == KERN_ISA_AVX_VNNI;
}
/* The same at the AVX-VNNI and AVX512 levels (NULL: use the AVX2 one). */
kern_cpu_rect_fn kern_cpu_rect_avxvnni(enum kern_wtype t);
kern_cpu_rect_fn kern_cpu_rect_avx512(enum kern_wtype t);

/* Micro-kernels over a pack (m->w is kern_pack.data, rows r0 a multiple of
 * KERN_PACK_ROWS): the portable one (pack.c), and the AVX512 one for type t
 * (pack_avx512.c; NULL when none). Both give the same bits. */
void kern_cpu_pack_rect_scalar(const struct kern_mm *m, int r0, int r1, int t0, int t1);
kern_cpu_rect_fn kern_cpu_pack_rect_avx512(enum kern_wtype t);
/* The AMX one (pack_amx.c: Q8_0 and Q4_0 slices of 16 tokens on AMX tiles,
 * the rest and every other type through the AVX512 one; the same bits). */
kern_cpu_rect_fn kern_cpu_pack_rect_amx(enum kern_wtype t);
/* The AVX2 one (pack_avx2.c: Q8_0 and Q4_0; the K-quants' in
 * pack_k_avx2.c), which the AVX-VNNI level runs too. */
kern_cpu_rect_fn kern_cpu_pack_rect_avx2(enum kern_wtype t);
/* The same for the K-quant packs (pack_k.c, pack_k_avx512.c,
 * pack_k_avx2.c). */
void kern_cpu_pack_k_rect_scalar(const struct kern_mm *m, int r0, int r1, int t0, int t1);
kern_cpu_rect_fn kern_cpu_pack_k_rect_avx512(enum kern_wtype t);
kern_cpu_rect_fn kern_cpu_pack_k_rect_avx2(enum kern_wtype t);

/* s[0..n) = exp(s - m) in place, s - m <= 0, with attention's 8-lane
 * polynomial (attention.c: < 2 ulp; 0 below -87.3). kern_isa() >= AVX2. */
void kern_cpu_exp_sub_avx2(float *s, int n, float m);

/* The AVX2 micro-kernel for a K-quant weight type (matmul_k_avx2.c), NULL
 * for any other type. Call only when kern_isa() >= KERN_ISA_AVX2; it is
 * the K-quant path of the AVX-VNNI level too, and of the AVX-512 and AMX
 * levels for Q2_K/Q3_K. kern_cpu_rect_k1_avx2: the same kernels for
 * Q4_K/Q5_K/Q6_K in pack_k.c's one-sum sequence, the rows of the levels
 * whose packs run it (AVX-512, AMX); NULL for other types. */
kern_cpu_rect_fn kern_cpu_rect_k_avx2(enum kern_wtype t);
kern_cpu_rect_fn kern_cpu_rect_k1_avx2(enum kern_wtype t);

/* -(a b) as every K-quant kernel forms the mins factor: the product, then
 * its negation, each kept opaque so that no compiler fuses the negation
 * into a negating fma or moves it onto a (clang does both); either would
 * keep a NaN's sign where the other kernels flip it (tests/test_kern_pack.c,
 * k_nan_dmin_gives_the_same_bits_at_every_level). */
static inline __attribute__((always_inline)) float kern_cpu_neg_prod(float a, float b) {
    float p = a * b;
#if defined(__x86_64__) || defined(__i386__)
    __asm__("" : "+x"(p));
    p = -p;
    __asm__("" : "+x"(p));
#else
    __asm__("" : "+m"(p));
    p = -p;
    __asm__("" : "+m"(p));
#endif
    return p;
}

/* Software prefetch for the rows kernels' next tile. A tile of R rows
 * reads R short streams at once (a row of 4096 q8_0 weights is 68 cache
 * lines) and every tile starts R new ones: the hardware prefetchers catch
 * each late, and decode reached 0.2-0.5 of the read roofline on a Zen 3.
 * A matrix's rows are contiguous (w_stride is a row's bytes; a row view is
 * a run of whole rows), so the R rows after the tile (tile_bytes from
 * tile) are one run of bytes: while the tile works on step b of its rows,
 * prefetch step b of that run, step bytes (R x the bytes a row advances
 * per step). By the tile's end the next tile is in cache (less a float
 * kernel's tail of n_in % 8 or 16), read as one sequential stream. Past
 * the matrix or into another worker's rows it only wastes a hint (a
 * prefetch never faults); it changes no result. Figures: docs/benchmarks.md,
 * "Software prefetch in the rows kernels". The AVX2 float tiles use it in
 * prefill only: f16 decode ran 1.11-1.13x faster without it (rows of 3 KiB
 * and more; "f16 decode without the software prefetch"). */
static inline __attribute__((always_inline)) void
kern_cpu_prefetch_next(const void *tile, size_t tile_bytes, size_t step, int b) {
    /* in integers: the next tile may lie past the matrix's object */
    const uintptr_t p = (uintptr_t)tile + tile_bytes + step * (size_t)b;
    for (size_t o = 0; o < step; o += 64)
        __builtin_prefetch((const void *)(p + o), 0, 3);
}

/* The CPU's vendor as cpuid leaf 0 spells it ("GenuineIntel",
 * "AuthenticAMD"; 12 characters and a NUL), or "" off the x86 or when
 * cpuid has no leaf 0. kern_rows_prefetch's input (isa.c). */
void kern_cpu_vendor(char out[13]);

/* Software prefetch into L2 for the packed kernels' one-token tiles
 * (decode, and a prefill's single-token leftovers), which read each
 * group's records as one sequential stream.
 *
 * kern_cpu_prefetch_l2: the `bytes` from p, with prefetcht1 (locality 2).
 * kern_cpu_prefetch_ahead: the `bytes` that begin KERN_CPU_PREFETCH_AHEAD
 * bytes past p.
 *
 * One thread's read bandwidth is bounded by the misses L1 can keep in
 * flight; a prefetch into L2 is tracked by L2's larger queue instead. On
 * the Emerald Rapids Xeon, one thread's streaming read went from 11.2-11.9
 * GB/s (hardware prefetch alone) to 13.4-13.5 with prefetcht1 4 KiB
 * ahead, and one thread's packed decode product (1 token, weights in
 * DRAM), against the T0 prefetch of the next tile's bytes at the same
 * step, ran Q8_0 1.31x, Q4_0 1.14x, Q4_K 1.15x and Q6_K 1.27x as fast
 * (docs/benchmarks.md, "Decode prefetch into L2 a few KiB ahead (Xeon)";
 * 8 KiB ahead was no better, 2 KiB the same). Past the matrix it only
 * wastes a hint (a prefetch never faults); it changes no result. */
#define KERN_CPU_PREFETCH_AHEAD 4096
static inline __attribute__((always_inline)) void kern_cpu_prefetch_l2(uintptr_t p, size_t bytes) {
    for (size_t o = 0; o < bytes; o += 64)
        __builtin_prefetch((const void *)(p + o), 0, 2);
}
static inline __attribute__((always_inline)) void kern_cpu_prefetch_ahead(const void *p,
                                                                          size_t bytes) {
    /* in integers: the bytes ahead may lie past the matrix's object */
    kern_cpu_prefetch_l2((uintptr_t)p + KERN_CPU_PREFETCH_AHEAD, bytes);
}

/* kern_cpu_prefetch_next's bytes, into L2: for the avx512 float rows'
 * one-token tile, whose 8 rows (one contiguous run) were read at 8.1-8.8
 * GB/s on one thread with the next tile in L1 and 8.9-9.8 with it in L2
 * (4096 x 65536 f16, four alternating rounds; docs/benchmarks.md, "f16
 * decode: the next tile into L2 (Xeon)"). Not on AMD or Hygon: a Zen 5's
 * hardware prefetchers did better alone (kern_rows_prefetch). */
static inline __attribute__((always_inline)) void
kern_cpu_prefetch_next_l2(const void *tile, size_t tile_bytes, size_t step, int b) {
    kern_cpu_prefetch_l2((uintptr_t)tile + tile_bytes + step * (size_t)b, step);
}

/* ---- KV rows (kv_quant.c; layouts in kern.h) ---- */

#define KERN_FP8_MAX 448.0f /* the largest finite E4M3 value, 1.75 * 2^8 */

/* E4M3 byte -> f32 / 256, exactly: the byte's exponent and mantissa bits
 * shifted into an f16 (bias 15 instead of 7, so the value is 2^-8 of the
 * E4M3 one, subnormals included, and the f16 conversion is exact). Callers
 * fold the 256 into the scale (a power of two: no extra rounding). The
 * AVX2 path does the same in 8 lanes (attention.c). */
static inline uint16_t kern_cpu_fp8_f16_bits(uint8_t b) {
    return (uint16_t)(((b & 0x7Fu) << 7) | ((b & 0x80u) << 8));
}

/* f32 -> E4M3, round to nearest even, saturating at +-448 (NaN too: never
 * emits 0x7F/0xFF). x is already divided by the head's scale. */
uint8_t kern_cpu_fp8_from_f32(float x);

/* Bytes of one kv head in an FP8 KV row: its f32 scale, then head_dim
 * E4M3 bytes; head h starts at h times this. */
static inline size_t kern_cpu_fp8_head_bytes(int head_dim) {
    return 4 + (size_t)head_dim;
}

/* AVX2 helpers from f16.c (call only when kern_isa() >= KERN_ISA_AVX2). */
void kern_cpu_f32_to_f16_avx2(uint16_t *dst, const float *src, int n);
void kern_cpu_f16_to_f32_avx2(float *dst, const uint16_t *src, int n);

#endif /* LLMD_KERN_CPU_H */
