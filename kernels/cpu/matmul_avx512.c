/* matmul_avx512.c - kern_matmul's micro-kernels at the AVX512 level.
 *
 * Q8_0/Q4_0: matmul_vnni.h with the EVEX vpdpbusd on ymm; the 32 vector
 * registers keep an 8 x 1 decode tile's accumulators and operands without
 * spills. Bit-identical to the AVX2 level (see matmul_vnni.h).
 */
#include "kernels/cpu/kern_cpu.h"

#define MMQ_TARGET                                                                                 \
    __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512dq,avx512vnni")))
#define MMQ_DPBUSD(a, u, s) _mm256_dpbusd_epi32((a), (u), (s))
#define MMQ_NAME(x)         mmq_avx512_##x
#include "kernels/cpu/matmul_vnni.h"

kern_cpu_rect_fn kern_cpu_rect_avx512(enum kern_wtype t) {
    switch (t) {
    case KERN_W_Q8_0:
        return mmq_avx512_rect_q8_0;
    case KERN_W_Q4_0:
        return mmq_avx512_rect_q4_0;
    default:
        return NULL;
    }
}
