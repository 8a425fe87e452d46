/* isa.c - the run-time choice of instruction-set level (see kern.h).
 *
 * cpuid and xgetbv are read once; the level in use is kept in an atomic so
 * every kernel reads it for the price of a load. LLMD_ISA forces a lower
 * level (to compare paths, or on a CPU whose wide units are suspected).
 *
 * Feature bits (Intel SDM vol. 2A, CPUID; AMD APM vol. 3 agrees):
 *   leaf 1 ecx: 12 FMA, 27 OSXSAVE, 29 F16C;
 *   leaf 7.0 ebx: 5 AVX2, 16 AVX512F, 17 AVX512DQ, 30 AVX512BW, 31 AVX512VL;
 *   leaf 7.0 ecx: 11 AVX512_VNNI;
 *   leaf 7.0 edx: 24 AMX-TILE, 25 AMX-INT8;
 *   leaf 7.1 eax: 4 AVX-VNNI, 5 AVX512_BF16;
 *   XCR0: bits 1-2 SSE/AVX state, 5-7 opmask and zmm state, 17-18 tile
 *   configuration and data.
 * Linux hands a process the AMX tile data only on request (XFD; the
 * kernel's Documentation/arch/x86/xstate.rst): arch_prctl
 * ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA, asked the first time the amx
 * level is chosen, not before (the grant enlarges every signal frame of
 * the process, so LLMD_ISA=avx512 must not ask); a refusal (an older
 * kernel, a seccomp filter) is logged and lowers the top level to AVX512.
 *
 * The vendor string (leaf 0) picks whether the float rows' decode tile
 * prefetches in software (kern_rows_prefetch).
 */
#include "kernels/cpu/kern_cpu.h"
#include "kernels/kern.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#if defined(__linux__) && defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "log.h"

static _Atomic int kern_isa_cur = -1;
static _Atomic int kern_isa_top = -1;
static _Atomic int kern_isa_bf16 = -1;      /* avx512_bf16 present (reported) */
static _Atomic int kern_isa_amx_grant = -1; /* 1 granted, 0 refused, -1 not asked */

static const char *const kern_isa_names[KERN_ISA_N] = {"scalar", "avx2", "avx-vnni", "avx512",
                                                       "amx"};

/* Ask for the tile data (see the top): 0, or the errno of the refusal. */
static int isa_amx_request(void) {
#if defined(__linux__) && defined(__x86_64__) && defined(SYS_arch_prctl)
    enum { ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 ? 0 : errno;
#else
    return ENOSYS;
#endif
}

/* isa, or AVX512 where it is AMX and the OS refuses the tile data: asked
 * once, by whichever thread gets here first; the one that records a
 * refusal warns and lowers the top level. */
static enum kern_isa isa_granted(enum kern_isa isa) {
    if (isa != KERN_ISA_AMX)
        return isa;
    int g = atomic_load_explicit(&kern_isa_amx_grant, memory_order_acquire);
    if (g < 0) {
        const int err = isa_amx_request();
        int want = -1;
        if (atomic_compare_exchange_strong(&kern_isa_amx_grant, &want, err == 0) && err) {
            atomic_store_explicit(&kern_isa_top, KERN_ISA_AVX512, memory_order_relaxed);
            LOG_WARN("kern",
                     "amx: the OS did not grant the AMX tile data (arch_prctl: %s); using avx512",
                     strerror(err));
        }
        g = atomic_load_explicit(&kern_isa_amx_grant, memory_order_acquire);
    }
    return g ? KERN_ISA_AMX : KERN_ISA_AVX512;
}

/* cpuid rather than __builtin_cpu_supports: clang 14 does not know "f16c"
 * or "avxvnni", and the fuzz build compiles these files with clang. */
static int isa_detect(bool *bf16) {
    *bf16 = false;
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d))
        return KERN_ISA_SCALAR;
    const bool fma = (c >> 12) & 1, osxsave = (c >> 27) & 1, f16c = (c >> 29) & 1;
    if (!fma || !osxsave || !f16c || __get_cpuid_max(0, NULL) < 7)
        return KERN_ISA_SCALAR;
    unsigned xlo, xhi;
    __asm__ volatile("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
    (void)xhi;
    if ((xlo & 6) != 6)
        return KERN_ISA_SCALAR;
    unsigned b7, c7, d7, a71 = 0, t;
    __cpuid_count(7, 0, a, b7, c7, d7);
    const unsigned max7 = a;
    if (max7 >= 1)
        __cpuid_count(7, 1, a71, t, t, t);
    if (!((b7 >> 5) & 1))
        return KERN_ISA_SCALAR;
    int level = KERN_ISA_AVX2;
    if ((a71 >> 4) & 1)
        level = KERN_ISA_AVX_VNNI;
    const bool zmm_os = (xlo & 0xe0) == 0xe0;
    const bool f = (b7 >> 16) & 1, dq = (b7 >> 17) & 1, bw = (b7 >> 30) & 1, vl = (b7 >> 31) & 1;
    const bool vnni512 = (c7 >> 11) & 1;
    if (zmm_os && f && dq && bw && vl && vnni512) {
        level = KERN_ISA_AVX512;
        *bf16 = (a71 >> 5) & 1;
        /* the tile data is asked for when the level is chosen (isa_granted) */
        if (((d7 >> 24) & 1) && ((d7 >> 25) & 1) && (xlo & 0x60000) == 0x60000)
            level = KERN_ISA_AMX;
    }
    return level;
#else
    return KERN_ISA_SCALAR;
#endif
}

enum kern_isa kern_isa_max(void) {
    int v = atomic_load_explicit(&kern_isa_top, memory_order_relaxed);
    if (v >= 0)
        return (enum kern_isa)v;
    bool bf16;
    v = isa_detect(&bf16);
    atomic_store_explicit(&kern_isa_bf16, bf16, memory_order_relaxed);
    atomic_store_explicit(&kern_isa_top, v, memory_order_relaxed);
    return (enum kern_isa)v;
}

const char *kern_isa_name(enum kern_isa isa) {
    return (unsigned)isa < KERN_ISA_N ? kern_isa_names[isa] : "?";
}

int kern_isa_parse(const char *name, enum kern_isa *out) {
    for (int i = 0; i < KERN_ISA_N; i++)
        if (name && strcasecmp(name, kern_isa_names[i]) == 0) { /* LLMD_ISA=AVX2 too */
            *out = (enum kern_isa)i;
            return 0;
        }
    return -EINVAL;
}

enum kern_isa kern_isa(void) {
    int v = atomic_load_explicit(&kern_isa_cur, memory_order_relaxed);
    if (v >= 0)
        return (enum kern_isa)v;
    const enum kern_isa top = kern_isa_max();
    enum kern_isa want = top;
    const char *env = getenv("LLMD_ISA");
    if (env && *env) {
        if (kern_isa_parse(env, &want) < 0) {
            LOG_WARN("kern",
                     "LLMD_ISA=%s: not one of scalar, avx2, avx-vnni, avx512, amx; using %s", env,
                     kern_isa_name(top));
            want = top;
        } else if (want > top) {
            LOG_WARN("kern", "LLMD_ISA=%s: this CPU has at most %s; using it", env,
                     kern_isa_name(top));
            want = top;
        }
    }
    want = isa_granted(want);
    LOG_DEBUG("kern", "isa %s (max %s)", kern_isa_name(want), kern_isa_name(kern_isa_max()));
    atomic_store_explicit(&kern_isa_cur, (int)want, memory_order_relaxed);
    return want;
}

enum kern_isa kern_set_isa(enum kern_isa isa) {
    const enum kern_isa top = kern_isa_max();
    if ((unsigned)isa >= KERN_ISA_N || isa > top)
        isa = top;
    isa = isa_granted(isa);
    atomic_store_explicit(&kern_isa_cur, (int)isa, memory_order_relaxed);
    return isa;
}

int kern_isa_describe(char *buf, size_t len) {
    const enum kern_isa cur = kern_isa(), top = kern_isa_max();
    const bool bf16 = atomic_load_explicit(&kern_isa_bf16, memory_order_relaxed) > 0;
    return snprintf(buf, len, "%s (max %s%s; L2 %zu KiB)", kern_isa_name(cur), kern_isa_name(top),
                    bf16 ? "; avx512_bf16" : "", kern_cache_l2() / 1024);
}

static _Atomic int kern_rows_pf = -1; /* -1: not read yet */

void kern_cpu_vendor(char out[13]) {
    out[0] = '\0';
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, v[3];
    if (!__get_cpuid(0, &a, &v[0], &v[2], &v[1])) /* ebx, edx, ecx spell it */
        return;
    memcpy(out, v, 12);
    out[12] = '\0';
#endif
}

/* Intel's and any unknown vendor's default is on; AMD's and Hygon's (a Zen
 * licensee) off; off the x86, off. */
static bool rows_pf_detect(void) {
#if defined(__x86_64__) || defined(__i386__)
    char name[13];
    kern_cpu_vendor(name);
    return strcmp(name, "AuthenticAMD") != 0 && strcmp(name, "HygonGenuine") != 0;
#else
    return false;
#endif
}

bool kern_rows_prefetch(void) {
    int v = atomic_load_explicit(&kern_rows_pf, memory_order_relaxed);
    if (v < 0) {
        v = rows_pf_detect();
        atomic_store_explicit(&kern_rows_pf, v, memory_order_relaxed);
    }
    return v;
}

bool kern_set_rows_prefetch(int on) {
    atomic_store_explicit(&kern_rows_pf, on < 0 ? -1 : on > 0, memory_order_relaxed);
    return kern_rows_prefetch();
}
