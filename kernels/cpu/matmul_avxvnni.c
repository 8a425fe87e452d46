/* matmul_avxvnni.c - kern_matmul's Q8_0/Q4_0 micro-kernels at the
 * AVX-VNNI level: matmul_q.h with the VEX vpdpbusd (16 ymm registers).
 * The float types run the AVX2 kernels at this level. */
#include "kernels/cpu/kern_cpu.h"

#define MMQ_TARGET          __attribute__((target("avx2,fma,f16c,avxvnni")))
#define MMQ_DPBUSD(a, u, s) _mm256_dpbusd_avx_epi32((a), (u), (s))
#define MMQ_NAME(x)         mmq_avxvnni_##x
#define MMQ_Q8_ONE_SUM      0
#include "kernels/cpu/matmul_q.h"

kern_cpu_rect_fn kern_cpu_rect_avxvnni(enum kern_wtype t) {
    switch (t) {
    case KERN_W_Q8_0:
        return mmq_avxvnni_rect_q8_0;
    case KERN_W_Q4_0:
        return mmq_avxvnni_rect_q4_0;
    default:
        return NULL;
    }
}
