/* The instruction-set levels (kernels/cpu/isa.c): names round-trip, a
 * forced level is clamped to what the CPU has, LLMD_ISA picks a lower level
 * at start-up and a bad or too-high value falls back to the highest. The
 * detection itself is compared with /proc/cpuinfo's flags, which the kernel
 * reads from the same cpuid bits. The L2 the matrix products block for
 * (kernels/cpu/cache.c) agrees with sysfs, LLMD_L2_KIB overrides it and a
 * bad value is ignored; the float rows' decode prefetch follows the
 * vendor_id. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "kernels/cpu/kern_cpu.h"
#include "kernels/kern.h"

/* The value of /proc/cpuinfo's first line that starts with key, after
 * its colon, into out; false when there is none. */
static bool cpuinfo_value(const char *key, char *out, size_t len) {
    FILE *fp = fopen("/proc/cpuinfo", "r");
    if (!fp)
        return false;
    char line[8192];
    bool found = false;
    while (!found && fgets(line, sizeof(line), fp)) {
        char *v = strchr(line, ':');
        if (v && strncmp(line, key, strlen(key)) == 0) {
            snprintf(out, len, "%s", v + 1);
            found = true;
        }
    }
    fclose(fp);
    return found;
}

/* Does /proc/cpuinfo list flag f (a whole word on the "flags" line)? */
static bool cpu_flag(const char *f) {
    char flags[8192];
    if (!cpuinfo_value("flags", flags, sizeof flags))
        return false;
    for (char *tok = strtok(flags, " \n"); tok; tok = strtok(NULL, " \n"))
        if (strcmp(tok, f) == 0)
            return true;
    return false;
}

Test(kern_isa, names_round_trip) {
    for (int i = 0; i < KERN_ISA_N; i++) {
        enum kern_isa got;
        cr_assert_eq(kern_isa_parse(kern_isa_name((enum kern_isa)i), &got), 0);
        cr_assert_eq((int)got, i);
    }
    enum kern_isa got;
    cr_assert_eq(kern_isa_parse("AVX-VNNI", &got), 0); /* a user's spelling */
    cr_assert_eq(got, KERN_ISA_AVX_VNNI);
    cr_assert_eq(kern_isa_parse("Scalar", &got), 0);
    cr_assert_eq(got, KERN_ISA_SCALAR);
    got = KERN_ISA_AVX2;
    cr_assert_eq(kern_isa_parse("avx1024", &got), -EINVAL);
    cr_assert_eq(kern_isa_parse("avx2 ", &got), -EINVAL);
    cr_assert_eq(kern_isa_parse(NULL, &got), -EINVAL);
    cr_assert_eq(got, KERN_ISA_AVX2, "a failed parse leaves *out alone");
    cr_assert_str_eq(kern_isa_name(KERN_ISA_N), "?");
}

/* Whether this process holds the AMX tile data: ARCH_GET_XCOMP_PERM
 * (0x1022) reads back the features granted, XTILEDATA being bit 18. */
static bool tiles_granted(void) {
    uint64_t perm = 0;
    return syscall(SYS_arch_prctl, 0x1022, &perm) == 0 && (perm >> 18 & 1);
}

static bool cpu_has_amx(void) {
    return cpu_flag("avx512f") && cpu_flag("avx512_vnni") && cpu_flag("amx_tile") &&
           cpu_flag("amx_int8");
}

Test(kern_isa, detection_agrees_with_proc_cpuinfo) {
    const bool avx2 = cpu_flag("avx2") && cpu_flag("fma") && cpu_flag("f16c");
    const bool avx512 = avx2 && cpu_flag("avx512f") && cpu_flag("avx512bw") &&
                        cpu_flag("avx512vl") && cpu_flag("avx512dq") && cpu_flag("avx512_vnni");
    const bool avx_vnni = avx2 && cpu_flag("avx_vnni");
    /* amx: the CPU's tiles, and the tile data granted to this process,
     * which choosing the level (kern_isa, here the highest) asks for */
    kern_isa();
    const enum kern_isa top = kern_isa_max();
    const bool amx = avx512 && cpu_has_amx() && tiles_granted();
    enum kern_isa want = amx        ? KERN_ISA_AMX
                         : avx512   ? KERN_ISA_AVX512
                         : avx_vnni ? KERN_ISA_AVX_VNNI
                         : avx2     ? KERN_ISA_AVX2
                                    : KERN_ISA_SCALAR;
    cr_assert_eq(top, want, "max %s, /proc/cpuinfo says %s", kern_isa_name(top),
                 kern_isa_name(want));
}

/* /proc/cpuinfo's vendor_id ("" when there is none). */
static void cpu_vendor(char out[64]) {
    char v[256];
    out[0] = '\0';
    if (cpuinfo_value("vendor_id", v, sizeof v) && sscanf(v, "%63s", out) != 1)
        out[0] = '\0';
}

/* The vendor cpuid spells is /proc/cpuinfo's vendor_id (the kernel reads
 * the same leaf); the float rows' decode prefetch is off for AMD and
 * Hygon, on for Intel (and any other vendor); the setter forces it and -1
 * goes back to the CPU's. */
Test(kern_isa, rows_prefetch_follows_the_vendor) {
    char vendor[64], ours[13];
    cpu_vendor(vendor);
    kern_cpu_vendor(ours);
    cr_assert_str_eq(ours, vendor, "cpuid's vendor against /proc/cpuinfo's");
#if defined(__x86_64__) || defined(__i386__)
    cr_assert_neq(vendor[0], '\0', "no vendor_id in /proc/cpuinfo");
    const bool want = strcmp(vendor, "AuthenticAMD") != 0 && strcmp(vendor, "HygonGenuine") != 0;
#else
    const bool want = false;
#endif
    cr_assert_eq(kern_rows_prefetch(), want, "vendor %s", vendor);
    cr_assert_eq(kern_set_rows_prefetch(!want), !want);
    cr_assert_eq(kern_rows_prefetch(), !want);
    cr_assert_eq(kern_set_rows_prefetch(7), true, "any positive value is on");
    cr_assert_eq(kern_set_rows_prefetch(-1), want);
    cr_assert_eq(kern_rows_prefetch(), want);
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

/* A fresh-eyes run typed LLMD_ISA=AVX2 and got the highest level, with a
 * warning. */
Test(kern_isa, env_names_in_upper_case_are_the_levels) {
    setenv("LLMD_ISA", "AVX2", 1);
    cr_assert_eq(kern_isa(), kern_isa_max() >= KERN_ISA_AVX2 ? KERN_ISA_AVX2 : kern_isa_max());
}

/* The top level: used where the CPU (and the OS's tile grant) has it,
 * otherwise refused with a warning for the highest there is. */
Test(kern_isa, env_amx_is_the_highest_or_clamped_to_it) {
    setenv("LLMD_ISA", "amx", 1);
    cr_assert_eq(kern_isa(), kern_isa_max());
    char d[128];
    kern_isa_describe(d, sizeof d);
    cr_assert_eq(strncmp(d, kern_isa_name(kern_isa_max()), strlen(kern_isa_name(kern_isa_max()))),
                 0, "%s", d);
}

/* A level below amx never asks for the tile data (the grant enlarges every
 * signal frame of the process): an embedder that set LLMD_ISA=avx512 keeps
 * its small sigaltstacks. */
Test(kern_isa, env_avx512_does_not_ask_for_the_tiles) {
    setenv("LLMD_ISA", "avx512", 1);
    const enum kern_isa want = kern_isa_max() >= KERN_ISA_AVX512 ? KERN_ISA_AVX512 : kern_isa_max();
    cr_assert_eq(kern_isa(), want);
    cr_assert_not(tiles_granted(), "LLMD_ISA=avx512 asked for the AMX tile data");
    if (cpu_has_amx()) { /* choosing amx later asks then */
        cr_assert_eq(kern_set_isa(KERN_ISA_AMX), KERN_ISA_AMX);
        cr_assert(tiles_granted());
    }
}

/* The OS refusing the tile data (here a seccomp filter failing
 * ARCH_REQ_XCOMP_PERM with EPERM, as a sandbox might): the level falls to
 * avx512 and stays there, for kern_isa, kern_isa_max and kern_set_isa. */
Test(kern_isa, a_refused_tile_grant_falls_back_to_avx512) {
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_arch_prctl, 0, 3),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[0])),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0x1023, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {.len = sizeof f / sizeof f[0], .filter = f};
    cr_assert_eq(prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), 0);
    if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0) {
        if (errno == EINVAL)
            cr_skip_test("this kernel has no seccomp filters: the refusal is not testable here");
        cr_assert_fail("seccomp: %s", strerror(errno));
    }
    const enum kern_isa before = kern_isa_max();
    const enum kern_isa want = before == KERN_ISA_AMX ? KERN_ISA_AVX512 : before;
    cr_assert_eq(before == KERN_ISA_AMX, cpu_has_amx());
    cr_assert_eq(kern_isa(), want);
    cr_assert_eq(kern_isa_max(), want);
    cr_assert_eq(kern_set_isa(KERN_ISA_AMX), want);
    cr_assert_not(tiles_granted());
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

/* The first line of cpu's cache index i attribute `name` in sysfs into buf;
 * false if there is none. */
static bool sysfs_cache(int cpu, int i, const char *name, char *buf, size_t len) {
    char path[96];
    snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/cache/index%d/%s", cpu, i, name);
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    const bool ok = fgets(buf, (int)len, f) != NULL;
    fclose(f);
    return ok;
}

/* CPU cpu's L2 from sysfs (what hwloc reads on Linux): its size in bytes
 * and how many CPUs share it; false when sysfs lists none. */
static bool sysfs_l2(int cpu, size_t *bytes, int *n_cpus) {
    char buf[256];
    for (int i = 0; sysfs_cache(cpu, i, "level", buf, sizeof buf); i++) {
        if (atoi(buf) != 2 ||
            (sysfs_cache(cpu, i, "type", buf, sizeof buf) && strncmp(buf, "Instruction", 11) == 0))
            continue;
        char unit = 0;
        unsigned long v = 0;
        if (!sysfs_cache(cpu, i, "size", buf, sizeof buf) || sscanf(buf, "%lu%c", &v, &unit) < 1)
            return false;
        *bytes = v * (unit == 'K' ? 1024 : unit == 'M' ? 1024 * 1024 : 1);
        *n_cpus = 0; /* "0", "0-1", "0,8", "0-3,16-19" */
        if (sysfs_cache(cpu, i, "shared_cpu_list", buf, sizeof buf))
            for (char *t = strtok(buf, ",\n"); t; t = strtok(NULL, ",\n")) {
                int lo, hi;
                *n_cpus += sscanf(t, "%d-%d", &lo, &hi) == 2 ? hi - lo + 1 : 1;
            }
        return *n_cpus > 0;
    }
    return false;
}

/* The L2 the products block for: hwloc's smallest per-core share is at most
 * cpu0's L2, and when every CPU sysfs lists has an L2 of one size shared by
 * as many CPUs, at least its share among them (a hybrid CPU's cores differ:
 * only the upper bound there). */
Test(kern_isa, l2_agrees_with_sysfs) {
    unsetenv("LLMD_L2_KIB");
    size_t b;
    int n;
    const size_t l2 = kern_cache_l2();
    cr_assert(l2 >= KERN_L2_MIN && l2 <= KERN_L2_MAX, "%zu", l2);
    if (!sysfs_l2(0, &b, &n)) {
        cr_log_info("no L2 in sysfs: checked only the range (%s)", kern_cache_l2_source());
        return;
    }
    cr_assert_str_eq(kern_cache_l2_source(), "hwloc");
    cr_assert(l2 <= b, "L2 %zu, cpu0's %zu", l2, b);
    bool uniform = true;
    size_t b2;
    int n2;
    for (int cpu = 1; uniform && sysfs_l2(cpu, &b2, &n2); cpu++)
        uniform = b2 == b && n2 == n;
    if (uniform)
        cr_assert(l2 >= b / (size_t)n, "L2 %zu, sysfs %zu shared by %d CPUs", l2, b, n);
}

Test(kern_isa, l2_env_overrides_and_set_clamps) {
    setenv("LLMD_L2_KIB", "1536", 1);
    cr_assert_eq(kern_cache_l2(), 1536u << 10);
    cr_assert_str_eq(kern_cache_l2_source(), "LLMD_L2_KIB");
    char buf[128];
    kern_isa_describe(buf, sizeof buf);
    cr_assert(strstr(buf, "; L2 1536 KiB)"), "'%s'", buf);
    cr_assert_eq(kern_set_cache_l2(1), (size_t)KERN_L2_MIN);
    cr_assert_str_eq(kern_cache_l2_source(), "set");
    cr_assert_eq(kern_set_cache_l2((size_t)1 << 40), (size_t)KERN_L2_MAX);
    cr_assert_eq(kern_cache_l2(), (size_t)KERN_L2_MAX);
    cr_assert_eq(kern_set_cache_l2(0), 1536u << 10, "0 reads the environment again");
}

/* A value that is not digits only, a number of KiB in range, is ignored
 * (a warning; an empty one as if unset): the machine's L2 is used. */
Test(kern_isa, l2_env_bad_values_are_ignored) {
    unsetenv("LLMD_L2_KIB");
    const size_t machine = kern_cache_l2();
    static const char *const bad[] = {"32",
                                      "65537",
                                      "512k",
                                      "",
                                      "-1",
                                      "x",
                                      " 512",
                                      "+512",
                                      "512 ",
                                      "0x200",
                                      "99999999999999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        setenv("LLMD_L2_KIB", bad[i], 1);
        cr_assert_eq(kern_set_cache_l2(0), machine, "LLMD_L2_KIB='%s'", bad[i]);
        cr_assert_str_neq(kern_cache_l2_source(), "LLMD_L2_KIB", "'%s'", bad[i]);
    }
    setenv("LLMD_L2_KIB", "64", 1);
    cr_assert_eq(kern_set_cache_l2(0), 64u << 10, "the lowest in range");
}
