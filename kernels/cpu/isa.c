/* isa.c - run-time choice between the portable and the AVX2/FMA/F16C paths.
 *
 * The choice is made once, lazily, and kept in an atomic so every kernel can
 * read it for the price of a load. LLMD_ISA=scalar forces the portable path
 * (to compare the two, or on a CPU whose AVX2 is suspected).
 */
#include "kernels/kern.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

static _Atomic int kern_isa_cur = -1;

/* cpuid rather than __builtin_cpu_supports: clang 14 does not know "f16c",
 * and the fuzz build compiles these files with clang. AVX2 also needs the
 * OS to save ymm state (OSXSAVE and XCR0 bits 1-2). */
static int isa_have_avx2(void) {
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d))
        return 0;
    const int fma = (c >> 12) & 1, osxsave = (c >> 27) & 1, f16c = (c >> 29) & 1;
    if (!fma || !osxsave || !f16c)
        return 0;
    unsigned xlo, xhi;
    __asm__ volatile("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
    if ((xlo & 6) != 6)
        return 0;
    if (__get_cpuid_max(0, NULL) < 7)
        return 0;
    __cpuid_count(7, 0, a, b, c, d);
    return (b >> 5) & 1;
#else
    return 0;
#endif
}

enum kern_isa kern_isa(void) {
    int v = atomic_load_explicit(&kern_isa_cur, memory_order_relaxed);
    if (v >= 0)
        return (enum kern_isa)v;
    const char *env = getenv("LLMD_ISA");
    v = isa_have_avx2() ? KERN_ISA_AVX2 : KERN_ISA_SCALAR;
    if (env && strcmp(env, "scalar") == 0)
        v = KERN_ISA_SCALAR;
    LOG_DEBUG("kern", "isa %s", v == KERN_ISA_AVX2 ? "avx2" : "scalar");
    atomic_store_explicit(&kern_isa_cur, v, memory_order_relaxed);
    return (enum kern_isa)v;
}

void kern_set_isa(enum kern_isa isa) {
    if (isa == KERN_ISA_AVX2 && !isa_have_avx2())
        isa = KERN_ISA_SCALAR;
    atomic_store_explicit(&kern_isa_cur, (int)isa, memory_order_relaxed);
}
