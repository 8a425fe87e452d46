/* The instruction-set levels (kernels/cpu/isa.c): names round-trip, a
 * forced level is clamped to what the CPU has, LLMD_ISA picks a lower level
 * at start-up and a bad or too-high value falls back to the highest. The
 * detection itself is compared with /proc/cpuinfo's flags, which the kernel
 * reads from the same cpuid bits. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kern.h"

/* Does /proc/cpuinfo list flag f (a whole word on the "flags" line)? */
static bool cpu_flag(const char *f) {
    FILE *fp = fopen("/proc/cpuinfo", "r");
    if (!fp)
        return false;
    char line[8192];
    bool found = false;
    while (!found && fgets(line, sizeof(line), fp)) {
        if (strncmp(line, "flags", 5) != 0)
            continue;
        for (char *tok = strtok(strchr(line, ':') + 1, " \n"); tok; tok = strtok(NULL, " \n"))
            if (strcmp(tok, f) == 0)
                found = true;
        break;
    }
    fclose(fp);
    return found;
}

Test(kern_isa, names_round_trip) {
    for (int i = 0; i < KERN_ISA_N; i++) {
        enum kern_isa got;
        cr_assert_eq(kern_isa_parse(kern_isa_name((enum kern_isa)i), &got), 0);
        cr_assert_eq((int)got, i);
    }
    enum kern_isa got = KERN_ISA_AVX2;
    cr_assert_eq(kern_isa_parse("avx1024", &got), -EINVAL);
    cr_assert_eq(kern_isa_parse(NULL, &got), -EINVAL);
    cr_assert_eq(got, KERN_ISA_AVX2, "a failed parse leaves *out alone");
    cr_assert_str_eq(kern_isa_name(KERN_ISA_N), "?");
}

Test(kern_isa, detection_agrees_with_proc_cpuinfo) {
    const bool avx2 = cpu_flag("avx2") && cpu_flag("fma") && cpu_flag("f16c");
    const bool avx512 = avx2 && cpu_flag("avx512f") && cpu_flag("avx512bw") &&
                        cpu_flag("avx512vl") && cpu_flag("avx512dq") && cpu_flag("avx512_vnni");
    const bool avx_vnni = avx2 && cpu_flag("avx_vnni");
    enum kern_isa want = avx512     ? KERN_ISA_AVX512
                         : avx_vnni ? KERN_ISA_AVX_VNNI
                         : avx2     ? KERN_ISA_AVX2
                                    : KERN_ISA_SCALAR;
    cr_assert_eq(kern_isa_max(), want, "max %s, /proc/cpuinfo says %s",
                 kern_isa_name(kern_isa_max()), kern_isa_name(want));
}

Test(kern_isa, set_clamps_to_the_cpu) {
    const enum kern_isa top = kern_isa_max();
    for (int i = 0; i < KERN_ISA_N; i++) {
        enum kern_isa got = kern_set_isa((enum kern_isa)i);
        cr_assert_eq(got, i <= (int)top ? (enum kern_isa)i : top, "asked %d", i);
        cr_assert_eq(kern_isa(), got);
    }
    cr_assert_eq(kern_set_isa((enum kern_isa)99), top);
}

/* LLMD_ISA is read at the first kern_isa() of a process: each case runs in
 * its own (Criterion forks a process per test). */
Test(kern_isa, env_scalar_forces_the_portable_path) {
    setenv("LLMD_ISA", "scalar", 1);
    cr_assert_eq(kern_isa(), KERN_ISA_SCALAR);
}

Test(kern_isa, env_avx2_when_the_cpu_has_it) {
    setenv("LLMD_ISA", "avx2", 1);
    cr_assert_eq(kern_isa(), kern_isa_max() >= KERN_ISA_AVX2 ? KERN_ISA_AVX2 : kern_isa_max());
}

Test(kern_isa, env_bad_value_uses_the_highest) {
    setenv("LLMD_ISA", "sse9", 1);
    cr_assert_eq(kern_isa(), kern_isa_max());
}

Test(kern_isa, describe_names_the_level_in_use) {
    kern_set_isa(KERN_ISA_SCALAR);
    char buf[128];
    cr_assert_gt(kern_isa_describe(buf, sizeof(buf)), 0);
    char want[64];
    snprintf(want, sizeof(want), "scalar (max %s", kern_isa_name(kern_isa_max()));
    cr_assert(strncmp(buf, want, strlen(want)) == 0, "'%s'", buf);
}
