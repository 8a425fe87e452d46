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

/* Bytes of one q8 act row of n elements, a multiple of 64. */
static inline size_t kern_cpu_act_q8_bytes(int n) {
    return ((size_t)n + (size_t)(n / KERN_QK) * 4 + 63) & ~(size_t)63;
}

/* One quantized activation row x[n] -> q8 act row at dst (reference rule). */
void kern_cpu_act_q8(const float *x, void *dst, int n);

/* The activation row of a packed matmul of type t (pack.c): a q8 act row
 * followed by int32 o[n/4], each group of four's offset term. Bytes a
 * multiple of 64. */
static inline size_t kern_cpu_act_q8s_bytes(int n) {
    return ((size_t)n + (size_t)(n / KERN_QK) * 4 + (size_t)n + 63) & ~(size_t)63;
}
void kern_cpu_act_q8s(enum kern_wtype t, const float *x, void *dst, int n);

/* Bytes of one record (16 rows x one block) of a pack of type t; 0 when t
 * has no packed layout. */
size_t kern_cpu_pack_rec_bytes(enum kern_wtype t);

/* One matmul job: Y rows [r0, r1) x tokens [t0, t1). act is the converted
 * activation (f32 for F32/BF16 -- the caller's x --, f16-rounded f32 for
 * F16, q8 act rows for Q8_0/Q4_0) with act_stride bytes per token. */
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
/* The same at the AVX-VNNI and AVX512 levels (NULL: use the AVX2 one). */
kern_cpu_rect_fn kern_cpu_rect_avxvnni(enum kern_wtype t);
kern_cpu_rect_fn kern_cpu_rect_avx512(enum kern_wtype t);

/* Micro-kernels over a pack (m->w is kern_pack.data, rows r0 a multiple of
 * KERN_PACK_ROWS): the portable one (pack.c), and the AVX512 one for type t
 * (pack_avx512.c; NULL when none). Both give the same bits. */
void kern_cpu_pack_rect_scalar(const struct kern_mm *m, int r0, int r1, int t0, int t1);
kern_cpu_rect_fn kern_cpu_pack_rect_avx512(enum kern_wtype t);

/* s[0..n) = exp(s - m) in place, s - m <= 0, with attention's 8-lane
 * polynomial (attention.c: < 2 ulp; 0 below -87.3). kern_isa() >= AVX2. */
void kern_cpu_exp_sub_avx2(float *s, int n, float m);

/* AVX2 helpers from f16.c (call only when kern_isa() >= KERN_ISA_AVX2). */
void kern_cpu_f32_to_f16_avx2(uint16_t *dst, const float *src, int n);
void kern_cpu_f16_to_f32_avx2(float *dst, const uint16_t *src, int n);

#endif /* LLMD_KERN_CPU_H */
