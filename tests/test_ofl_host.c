/* The host tier (offload/ofl_host.h): budget, contents, reuse, threads,
 * pinning kinds and their fallbacks, NUMA placement, bad configs, that the
 * process's malloc stays glibc's, and that libllmd.so (no private jemalloc)
 * still loads late and says what its tier needs.
 *
 * Each test stays under 256 MiB and a few seconds. What fits, measured by
 * fill_* and held as the minimum (see offload/README.md). A large allocation
 * (>= 16 KiB) takes its size class plus one 4 KiB page; these are the most
 * that can fit, so nothing is lost to fragmentation:
 *   2 MiB in 64 MiB          31 (31 x (2 MiB + 4 KiB) <= 64 MiB)   96.9%
 *   2 MiB + 4 KiB in 64 MiB  25 (class 2.5 MiB)                    78.1% of bytes asked
 *   64 KiB in 32 MiB         481 (x 68 KiB)                         93.9%
 *   4 KiB in 32 MiB          8192 (small: no extra page)           100%
 *   100 B in 16 MiB          131072 (class 128 B, 64-byte aligned) 100% of the
 *                            budget in size-class bytes, 78.1% of bytes asked
 */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <dirent.h>
#include <errno.h>
#include <linux/capability.h>
#include <pthread.h>
#include <sched.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "mem.h"
#include "offload/ofl_host.h"

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)

/* VmLck of this process, bytes. */
static uint64_t vm_locked(void) {
    FILE *f = fopen("/proc/self/status", "re");
    cr_assert(f);
    char line[256];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmLck: %llu kB", &kb) == 1)
            break;
    fclose(f);
    return (uint64_t)kb << 10;
}

static struct ofl_host *mk_cfg(const struct ofl_host_config *cfg) {
    struct ofl_host *h = NULL;
    char err[256];
    int rc = ofl_host_create(cfg, &h, err, sizeof err);
    cr_assert_eq(rc, 0, "ofl_host_create(%llu): %d %s", (unsigned long long)cfg->bytes, rc, err);
    cr_assert(ofl_host_check(h));
    return h;
}

static struct ofl_host *mk(uint64_t bytes) {
    struct ofl_host_config cfg = {.bytes = bytes, .numa_node = -1};
    return mk_cfg(&cfg);
}

static uint64_t used(const struct ofl_host *h) {
    struct ofl_host_stats s;
    ofl_host_stats_get(h, &s);
    return s.used_bytes;
}

/* A byte pattern that differs per allocation and per offset. */
static uint8_t pat(size_t i, size_t o) {
    return (uint8_t)(i * 131 + o * 7 + (o >> 12));
}

/* Allocate `bytes` until NULL, writing every allocation whole; check the
 * budget after each, then every byte, then that the allocations do not
 * overlap. Returns the count; ptrs[] gets them. */
static size_t fill(struct ofl_host *h, size_t bytes, void **ptrs, size_t max) {
    struct ofl_host_stats s;
    size_t n = 0;
    while (n < max) {
        uint8_t *p = ofl_host_alloc(h, bytes);
        if (!p)
            break;
        cr_assert_eq((uintptr_t)p % (bytes % 4096 ? 64 : 4096), 0, "alloc %zu: %p misaligned", n,
                     (void *)p);
        for (size_t o = 0; o < bytes; o++)
            p[o] = pat(n, o);
        ptrs[n++] = p;
        ofl_host_stats_get(h, &s);
        cr_assert_leq(s.used_bytes, s.budget_bytes, "alloc %zu: used %llu > budget %llu", n,
                      (unsigned long long)s.used_bytes, (unsigned long long)s.budget_bytes);
    }
    cr_assert_lt(n, max, "fill of %zu-byte allocations never failed", bytes);
    ofl_host_stats_get(h, &s);
    cr_assert_eq(s.used_bytes, n * ofl_host_usable_size(h, bytes));
    cr_assert_geq(s.alloc_failures_total, 1);
    for (size_t i = 0; i < n; i++) {
        const uint8_t *p = ptrs[i];
        for (size_t o = 0; o < bytes; o++)
            if (p[o] != pat(i, o))
                cr_assert_fail("alloc %zu of %zu bytes: byte %zu is %u, want %u", i, bytes, o, p[o],
                               pat(i, o));
    }
    for (size_t i = 1; i < n; i++)
        for (size_t j = 0; j < i && j < 64; j++) {
            uintptr_t a = (uintptr_t)ptrs[i], b = (uintptr_t)ptrs[i - 1 - j % i];
            cr_assert(a + bytes <= b || b + bytes <= a, "allocs %zu and %zu overlap", i,
                      i - 1 - j % i);
        }
    cr_assert(ofl_host_check(h));
    return n;
}

static void free_all(struct ofl_host *h, void **ptrs, size_t n) {
    for (size_t i = 0; i < n; i++)
        ofl_host_free(h, ptrs[i]);
    cr_assert_eq(used(h), 0, "used %llu after freeing all", (unsigned long long)used(h));
    cr_assert(ofl_host_check(h));
}

/* Fill, check the usable fraction, free all, fill again: the same count
 * must fit (nothing of the region leaks), twice. */
static void fill_twice(uint64_t budget, size_t bytes, double min_frac, size_t min_count) {
    struct ofl_host *h = mk(budget);
    size_t max = budget / (bytes < 64 ? 64 : bytes) + 16;
    void **ptrs = mem_alloc(MEM_TEST, max * sizeof *ptrs);
    cr_assert(ptrs);
    size_t n1 = fill(h, bytes, ptrs, max);
    double frac = (double)(n1 * ofl_host_usable_size(h, bytes)) / (double)budget;
    cr_log_info("%zu-byte allocations: %zu fit in %llu MiB (%.1f%% of the budget in size-class "
                "bytes, %.1f%% in bytes asked)",
                bytes, n1, (unsigned long long)(budget >> 20), 100 * frac,
                100.0 * (double)(n1 * bytes) / (double)budget);
    cr_assert_geq(frac, min_frac, "%zu-byte allocations: only %.1f%% of the budget usable", bytes,
                  100 * frac);
    cr_assert_geq(n1, min_count, "%zu-byte allocations: %zu fit, want >= %zu", bytes, n1,
                  min_count);
    for (int round = 0; round < 2; round++) {
        free_all(h, ptrs, n1);
        size_t n2 = fill(h, bytes, ptrs, max);
        cr_assert_eq(n2, n1, "refill %d: %zu fit, first fill %zu", round, n2, n1);
    }
    free_all(h, ptrs, n1);
    struct ofl_host_stats s;
    ofl_host_stats_get(h, &s);
    cr_assert_eq(s.allocs_total, 3 * n1);
    cr_assert_eq(s.frees_total, 3 * n1);
    ofl_host_destroy(h);
    mem_free(ptrs);
}

Test(ofl_host, fill_2mib_pages) {
    fill_twice(64 * MIB, 2 * MIB, 0.96, 31);
}

Test(ofl_host, fill_pages_just_over_a_size_class) {
    /* 2 MiB + 4 KiB rounds up to the 2.5 MiB class */
    fill_twice(64 * MIB, 2 * MIB + 4 * KIB, 0.78, 25);
}

Test(ofl_host, fill_64kib) {
    fill_twice(32 * MIB, 64 * KIB, 0.93, 481);
}

Test(ofl_host, fill_4kib) {
    fill_twice(32 * MIB, 4 * KIB, 0.999, 8192);
}

Test(ofl_host, fill_100_bytes) {
    fill_twice(16 * MIB, 100, 0.999, 131072);
}

Test(ofl_host, budget_rounds_up_to_2mib) {
    struct ofl_host *h = mk(3 * MIB + 1);
    struct ofl_host_stats s;
    ofl_host_stats_get(h, &s);
    cr_assert_eq(s.budget_bytes, 4 * MIB);
    cr_assert_eq(s.used_bytes, 0);
    cr_assert_eq(s.allocs_total, 0);
    ofl_host_destroy(h);
}

Test(ofl_host, too_big_zero_and_usable_size) {
    struct ofl_host *h = mk(8 * MIB);
    cr_assert_null(ofl_host_alloc(h, 0));
    cr_assert_null(ofl_host_alloc(h, 9 * MIB));
    cr_assert_null(ofl_host_alloc(h, SIZE_MAX / 2));
    struct ofl_host_stats s;
    ofl_host_stats_get(h, &s);
    cr_assert_eq(s.alloc_failures_total, 2, "got %llu", (unsigned long long)s.alloc_failures_total);
    cr_assert_eq(ofl_host_usable_size(h, 2 * MIB), 2 * MIB);
    cr_assert_eq(ofl_host_usable_size(h, 2 * MIB + 1), 2 * MIB + 512 * KIB);
    cr_assert_eq(ofl_host_usable_size(h, 100), 128); /* 64-byte aligned class */
    cr_assert_eq(ofl_host_usable_size(h, 0), 0);
    void *p = ofl_host_alloc(h, 100);
    cr_assert_not_null(p);
    cr_assert_eq(used(h), 128);
    ofl_host_free(h, p);
    ofl_host_free(h, NULL);
    cr_assert_eq(used(h), 0);
    ofl_host_destroy(h);
    ofl_host_destroy(NULL);
}

/* ---- two threads ---------------------------------------------------- */

struct thr {
    struct ofl_host *h;
    uint32_t seed;
    double until;
    long ops, nulls, bad;
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint32_t rnd(uint32_t *s) {
    *s = *s * 1664525u + 1013904223u;
    return *s >> 8;
}

#define THR_LIVE 8

/* Random sizes, up to THR_LIVE live allocations, each filled with its own
 * byte and verified (every 64th byte and the last) when freed. */
static void *thr_main(void *arg) {
    static const size_t sizes[] = {100, 3000, 4 * KIB, 64 * KIB, 1 * MIB, 2 * MIB};
    struct thr *t = arg;
    uint8_t *p[THR_LIVE] = {0};
    size_t n[THR_LIVE] = {0};
    uint8_t tag[THR_LIVE] = {0};
    while (now_s() < t->until) {
        uint32_t i = rnd(&t->seed) % THR_LIVE;
        if (p[i]) {
            for (size_t o = 0; o < n[i]; o += 64)
                t->bad += p[i][o] != tag[i];
            t->bad += p[i][n[i] - 1] != tag[i];
            ofl_host_free(t->h, p[i]);
            p[i] = NULL;
        } else {
            n[i] = sizes[rnd(&t->seed) % (sizeof sizes / sizeof sizes[0])];
            tag[i] = (uint8_t)rnd(&t->seed);
            p[i] = ofl_host_alloc(t->h, n[i]);
            if (p[i])
                memset(p[i], tag[i], n[i]);
            else
                t->nulls++;
        }
        t->ops++;
    }
    for (int i = 0; i < THR_LIVE; i++)
        ofl_host_free(t->h, p[i]);
    return NULL;
}

Test(ofl_host, two_threads_alloc_and_free, .timeout = 20) {
    /* 16 MiB < 2 threads x 8 live x 2 MiB: the budget runs out now and then */
    struct ofl_host *h = mk(16 * MIB);
    struct thr t[2] = {{.h = h, .seed = 1}, {.h = h, .seed = 2}};
    pthread_t th[2];
    double until = now_s() + 0.8;
    for (int i = 0; i < 2; i++) {
        t[i].until = until;
        cr_assert_eq(pthread_create(&th[i], NULL, thr_main, &t[i]), 0);
    }
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    struct ofl_host_stats s;
    ofl_host_stats_get(h, &s);
    cr_log_info("two threads: %ld + %ld ops, %ld + %ld NULLs", t[0].ops, t[1].ops, t[0].nulls,
                t[1].nulls);
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(t[i].bad, 0, "thread %d: %ld bytes changed under it", i, t[i].bad);
        cr_assert_gt(t[i].ops, 100, "thread %d ran %ld ops", i, t[i].ops);
    }
    cr_assert_eq(s.used_bytes, 0);
    cr_assert_eq(s.allocs_total, s.frees_total);
    cr_assert_eq(s.alloc_failures_total, (uint64_t)(t[0].nulls + t[1].nulls));
    cr_assert(ofl_host_check(h));
    ofl_host_destroy(h);
}

/* ---- kinds ---------------------------------------------------------- */

Test(ofl_host, kind_matches_vmlck) {
    uint64_t before = vm_locked();
    struct ofl_host *h = mk(16 * MIB);
    uint64_t during = vm_locked();
    enum ofl_host_kind k = ofl_host_kind(h);
    cr_log_info("kind here: %s (VmLck %llu -> %llu KiB)", ofl_host_kind_name(k),
                (unsigned long long)before >> 10, (unsigned long long)during >> 10);
    cr_assert(k == OFL_HOST_PLAIN || k == OFL_HOST_MLOCKED, "kind %d", k);
    if (k == OFL_HOST_MLOCKED)
        cr_assert_geq(during - before, 16 * MIB, "mlocked, but VmLck grew by %llu KiB",
                      (unsigned long long)(during - before) >> 10);
    else
        cr_assert_eq(during, before, "plain, but VmLck grew by %llu KiB",
                     (unsigned long long)(during - before) >> 10);
    ofl_host_destroy(h);
    cr_assert_eq(vm_locked(), before, "VmLck not back after destroy");
    cr_assert_str_eq(ofl_host_kind_name(OFL_HOST_PLAIN), "plain");
    cr_assert_str_eq(ofl_host_kind_name(OFL_HOST_MLOCKED), "mlocked");
    cr_assert_str_eq(ofl_host_kind_name(OFL_HOST_PINNED), "pinned");
}

/* Make mlock fail in this test's process: drop CAP_IPC_LOCK (root ignores
 * RLIMIT_MEMLOCK with it) and set the limit to 0. */
static void forbid_mlock(void) {
    struct __user_cap_header_struct hdr = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
    struct __user_cap_data_struct data[2];
    if (syscall(SYS_capget, &hdr, data) == 0) {
        data[CAP_IPC_LOCK / 32].effective &= ~(1u << (CAP_IPC_LOCK % 32));
        data[CAP_IPC_LOCK / 32].permitted &= ~(1u << (CAP_IPC_LOCK % 32));
        syscall(SYS_capset, &hdr, data);
    }
    struct rlimit rl = {0, 0};
    cr_assert_eq(setrlimit(RLIMIT_MEMLOCK, &rl), 0);
}

Test(ofl_host, mlock_refused_falls_back_to_plain) {
    forbid_mlock();
    static char probe[4096] __attribute__((aligned(4096)));
    /* the system call: a sanitizer's mlock() is a no-op */
    if (syscall(SYS_mlock, probe, sizeof probe) == 0)
        cr_skip_test("mlock still works after dropping CAP_IPC_LOCK and RLIMIT_MEMLOCK");
    struct ofl_host *h = mk(8 * MIB);
    cr_assert_eq(ofl_host_kind(h), OFL_HOST_PLAIN);
    cr_assert_eq(vm_locked(), 0);
    void *p = ofl_host_alloc(h, 2 * MIB);
    cr_assert_not_null(p);
    memset(p, 1, 2 * MIB);
    ofl_host_free(h, p);
    ofl_host_destroy(h);
}

struct pin_rec {
    int rc;
    int pins, unpins;
    void *addr, *unpin_addr;
    size_t bytes, unpin_bytes;
};

static int fake_pin(void *ctx, void *addr, size_t bytes) {
    struct pin_rec *r = ctx;
    r->pins++;
    r->addr = addr;
    r->bytes = bytes;
    return r->rc;
}

static void fake_unpin(void *ctx, void *addr, size_t bytes) {
    struct pin_rec *r = ctx;
    r->unpins++;
    r->unpin_addr = addr;
    r->unpin_bytes = bytes;
}

Test(ofl_host, pin_hook_gets_the_region) {
    struct pin_rec r = {.rc = 0};
    struct ofl_host_config cfg = {
        .bytes = 16 * MIB, .numa_node = -1, .pin = fake_pin, .unpin = fake_unpin, .pin_ctx = &r};
    uint64_t lck = vm_locked();
    struct ofl_host *h = mk_cfg(&cfg);
    cr_assert_eq(ofl_host_kind(h), OFL_HOST_PINNED);
    cr_assert_eq(r.pins, 1);
    cr_assert_eq(r.bytes, 16 * MIB);
    cr_assert_eq((uintptr_t)r.addr % (2 * MIB), 0, "region %p not 2 MiB aligned", r.addr);
    cr_assert_eq(vm_locked(), lck, "pinned by the hook, yet mlocked too");
    /* every allocation lies in the region the hook was given */
    void *p[8];
    int n = 0;
    while (n < 8 && (p[n] = ofl_host_alloc(h, 2 * MIB))) {
        uintptr_t a = (uintptr_t)p[n], b = (uintptr_t)r.addr;
        cr_assert(a >= b && a + 2 * MIB <= b + r.bytes, "alloc %d at %p outside [%p, +%zu)", n,
                  p[n], r.addr, r.bytes);
        n++;
    }
    cr_assert_geq(n, 7);
    for (int i = 0; i < n; i++)
        ofl_host_free(h, p[i]);
    cr_assert_eq(r.unpins, 0);
    ofl_host_destroy(h);
    cr_assert_eq(r.unpins, 1);
    cr_assert_eq(r.unpin_addr, r.addr);
    cr_assert_eq(r.unpin_bytes, r.bytes);
}

Test(ofl_host, pin_hook_failure_falls_back) {
    struct pin_rec r = {.rc = -EIO};
    struct ofl_host_config cfg = {
        .bytes = 16 * MIB, .numa_node = -1, .pin = fake_pin, .unpin = fake_unpin, .pin_ctx = &r};
    uint64_t lck = vm_locked();
    struct ofl_host *h = mk_cfg(&cfg);
    cr_assert_eq(r.pins, 1);
    enum ofl_host_kind k = ofl_host_kind(h);
    cr_assert(k == OFL_HOST_MLOCKED || k == OFL_HOST_PLAIN, "kind %s", ofl_host_kind_name(k));
    cr_assert_eq(k == OFL_HOST_MLOCKED, vm_locked() >= lck + 16 * MIB, "kind %s, VmLck %llu KiB",
                 ofl_host_kind_name(k), (unsigned long long)vm_locked() >> 10);
    void *p = ofl_host_alloc(h, 2 * MIB);
    cr_assert_not_null(p);
    ofl_host_free(h, p);
    ofl_host_destroy(h);
    cr_assert_eq(r.unpins, 0, "unpin called for a pin that failed");
}

/* ---- NUMA ----------------------------------------------------------- */

static int n_numa_nodes(void) {
    DIR *d = opendir("/sys/devices/system/node");
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        n += strncmp(e->d_name, "node", 4) == 0 && e->d_name[4] >= '0' && e->d_name[4] <= '9';
    if (d)
        closedir(d);
    return n;
}

Test(ofl_host, numa_node_here) {
    struct ofl_host *h = mk(4 * MIB);
    if (n_numa_nodes() <= 1)
        cr_assert_eq(ofl_host_numa_node(h), 0);
    else
        cr_assert_geq(ofl_host_numa_node(h), 0);
    ofl_host_destroy(h);
    struct ofl_host_config cfg = {.bytes = 4 * MIB, .numa_node = 0};
    h = mk_cfg(&cfg);
    cr_assert_eq(ofl_host_numa_node(h), 0);
    ofl_host_destroy(h);
}

Test(ofl_host, numa_node_of_a_pci_device) {
    DIR *d = opendir("/sys/bus/pci/devices");
    struct dirent *e = NULL;
    char busid[300] = "";
    while (d && (e = readdir(d)))
        if (e->d_name[0] != '.') {
            snprintf(busid, sizeof busid, "%s", e->d_name);
            break;
        }
    if (d)
        closedir(d);
    if (!busid[0])
        cr_skip_test("no PCI device in sysfs");
    struct ofl_host_config cfg = {.bytes = 4 * MIB, .numa_node = -1, .device_pci_bus_id = busid};
    struct ofl_host *h = mk_cfg(&cfg);
    cr_log_info("PCI device %s: NUMA node %d", busid, ofl_host_numa_node(h));
    if (n_numa_nodes() <= 1)
        cr_assert_eq(ofl_host_numa_node(h), 0);
    ofl_host_destroy(h);
}

Test(ofl_host, bind_thread) {
    struct ofl_host *h = mk(4 * MIB);
    cpu_set_t before, after;
    cr_assert_eq(sched_getaffinity(0, sizeof before, &before), 0);
    cr_assert_eq(ofl_host_bind_thread(h), 0);
    cr_assert_eq(sched_getaffinity(0, sizeof after, &after), 0);
    if (n_numa_nodes() <= 1)
        cr_assert(CPU_EQUAL(&before, &after), "one node, yet the thread's CPUs changed");
    cr_assert_eq(ofl_host_bind_thread(h), 0, "second bind");
    ofl_host_destroy(h);
}

/* ---- bad configs, faults -------------------------------------------- */

static void expect_bad(const struct ofl_host_config *cfg, int want, const char *what) {
    struct ofl_host *h = (struct ofl_host *)1;
    char err[256] = "";
    int rc = ofl_host_create(cfg, &h, err, sizeof err);
    cr_assert_eq(rc, want, "%s: rc %d, want %d (%s)", what, rc, want, err);
    cr_assert_null(h, "%s: *out not NULL", what);
    cr_assert_neq(err[0], '\0', "%s: no message", what);
    cr_log_info("%s: %s", what, err);
    cr_assert_eq(mem_bytes(MEM_OFL), 0, "%s: leaked %llu bytes", what,
                 (unsigned long long)mem_bytes(MEM_OFL));
}

Test(ofl_host, bad_configs) {
    struct ofl_host_config c = {.numa_node = -1};
    expect_bad(&c, -EINVAL, "0 bytes");
    c.bytes = 1ull << 50; /* 1 PiB */
    expect_bad(&c, -ENOMEM, "1 PiB");
    c.bytes = UINT64_MAX;
    expect_bad(&c, -ENOMEM, "UINT64_MAX bytes");
    c.bytes = 4 * MIB;
    c.numa_node = 4096;
    expect_bad(&c, -EINVAL, "node 4096");
    c.numa_node = -2;
    expect_bad(&c, -EINVAL, "node -2");
    c.numa_node = -1;
    c.pin = fake_pin;
    expect_bad(&c, -EINVAL, "pin without unpin");
    c.pin = NULL;
    c.device_pci_bus_id = "not a bus id";
    expect_bad(&c, -EINVAL, "malformed bus id");
    c.device_pci_bus_id = "fff0:fe:1f.7";
    expect_bad(&c, -ENODEV, "absent device");
    cr_assert_eq(ofl_host_create(NULL, &(struct ofl_host *){NULL}, NULL, 0), -EINVAL);
    cr_assert_eq(ofl_host_create(&c, NULL, NULL, 0), -EINVAL);
}

/* Anonymous mappings of this process, to see that a failed create leaves
 * none behind. */
static int n_maps(void) {
    FILE *f = fopen("/proc/self/maps", "re");
    cr_assert(f);
    int n = 0, c;
    while ((c = getc(f)) != EOF)
        n += c == '\n';
    fclose(f);
    return n;
}

Test(ofl_host, create_survives_each_host_alloc_failure) {
    /* warm up hwloc (it loads plugins once) so the mapping count is stable */
    ofl_host_destroy(mk(4 * MIB));
    int maps = n_maps();
    uint64_t lck = vm_locked();
    struct ofl_host_config cfg = {.bytes = 4 * MIB, .numa_node = -1};
    uint64_t c0 = mem_calls();
    ofl_host_destroy(mk_cfg(&cfg));
    uint64_t n_calls = mem_calls() - c0;
    cr_assert_geq(n_calls, 1);
    for (uint64_t nth = 1; nth <= n_calls; nth++) {
        struct ofl_host *h = NULL;
        char err[256] = "";
        mem_fail_nth(nth);
        int rc = ofl_host_create(&cfg, &h, err, sizeof err);
        mem_fail_nth(0);
        cr_assert_eq(rc, -ENOMEM, "nth %llu: rc %d", (unsigned long long)nth, rc);
        cr_assert_null(h);
        cr_assert_neq(err[0], '\0');
        cr_assert_eq(mem_bytes(MEM_OFL), 0);
        cr_assert_eq(vm_locked(), lck);
        cr_assert_eq(n_maps(), maps, "nth %llu: mappings %d, were %d", (unsigned long long)nth,
                     n_maps(), maps);
    }
}

/* True when some mapping of this process overlaps [p, p + n). */
static bool is_mapped(const void *p, size_t n) {
    FILE *f = fopen("/proc/self/maps", "re");
    cr_assert(f);
    const uintptr_t a = (uintptr_t)p, b = a + n;
    unsigned long lo, hi;
    bool hit = false;
    char line[512];
    while (!hit && fgets(line, sizeof line, f))
        if (sscanf(line, "%lx-%lx", &lo, &hi) == 2)
            hit = lo < b && a < hi;
    fclose(f);
    return hit;
}

/* The region (where p and q lie) is unmapped, its pages unlocked, and the
 * accounting back at zero after every destroy. The count of mappings is not
 * compared here: now and then (1 run in 30-70, seen on a Zen 3 VM) a new
 * 6 MiB anonymous mapping stays after the three cycles that is neither the
 * region nor the arena's metadata (meta_bytes counts that, and destroy
 * warns when some is left). Most likely, not confirmed: jemalloc's global
 * metadata (base 0, never returned, which holds its radix tree of extents)
 * growing when a region lands at addresses it had not covered.
 * create_survives_each_host_alloc_failure still counts mappings. */
Test(ofl_host, destroy_releases_everything) {
    ofl_host_destroy(mk(4 * MIB));
    uint64_t lck = vm_locked();
    for (int i = 0; i < 3; i++) {
        struct ofl_host *h = mk(8 * MIB);
        void *p = ofl_host_alloc(h, 100), *q = ofl_host_alloc(h, 2 * MIB);
        cr_assert(p && q);
        cr_assert(is_mapped(p, 100) && is_mapped(q, 2 * MIB));
        struct ofl_host_stats s;
        ofl_host_stats_get(h, &s);
        cr_assert_gt(s.meta_bytes, 0, "jemalloc metadata is expected outside the region");
        ofl_host_free(h, p);
        ofl_host_free(h, q);
        ofl_host_destroy(h);
        cr_assert_not(is_mapped(p, 100), "cycle %d: the region is still mapped at %p", i, p);
        cr_assert_not(is_mapped(q, 2 * MIB), "cycle %d: the region is still mapped at %p", i, q);
        cr_assert_eq(vm_locked(), lck, "cycle %d", i);
        cr_assert_eq(mem_bytes(MEM_OFL), 0, "cycle %d", i);
    }
}

/* ---- report, isolation ---------------------------------------------- */

Test(ofl_host, stats_format) {
    struct ofl_host *h = mk(4 * MIB);
    void *p = ofl_host_alloc(h, 4096);
    char buf[1024];
    cr_assert_eq(ofl_host_stats_format(h, buf, sizeof buf), 0);
    cr_assert(strstr(buf, "# ofl_host\n"), "%s", buf);
    cr_assert(strstr(buf, "\nofl_host_budget_bytes:4194304\n"), "%s", buf);
    cr_assert(strstr(buf, "\nofl_host_used_bytes:4096\n"), "%s", buf);
    cr_assert(strstr(buf, "\nofl_host_allocs_total:1\n"), "%s", buf);
    cr_assert(strstr(buf, "\nofl_host_numa_node:0\n") || n_numa_nodes() > 1, "%s", buf);
    char kind[64];
    snprintf(kind, sizeof kind, "\nofl_host_kind:%s\n", ofl_host_kind_name(ofl_host_kind(h)));
    cr_assert(strstr(buf, kind), "%s", buf);
    cr_assert_eq(ofl_host_stats_format(h, buf, 16), -ENOSPC);
    ofl_host_free(h, p);
    ofl_host_destroy(h);
}

/* The private jemalloc must not leak into the process: malloc resolves to
 * glibc (or to a sanitizer's interceptor), and no jemalloc symbol is global. */
Test(ofl_host, process_malloc_is_not_jemalloc) {
    struct ofl_host *h = mk(4 * MIB);
    void *m = dlsym(RTLD_DEFAULT, "malloc");
    Dl_info info;
    cr_assert(m && dladdr(m, &info));
    cr_log_info("malloc comes from %s", info.dli_fname);
    cr_assert_null(strstr(info.dli_fname, "jemalloc"), "malloc from %s", info.dli_fname);
    cr_assert_null(dlsym(RTLD_DEFAULT, "mallocx"), "a global mallocx exists");
    cr_assert_null(dlsym(RTLD_DEFAULT, "je_malloc"));
    void *p = malloc(1000);
    cr_assert(p);
    free(p);
    ofl_host_destroy(h);
}

/* ---- libllmd.so ------------------------------------------------------ */

/* libllmd.so must stay loadable late (dlopen from Python, a plugin host):
 * it carries no jemalloc of its own, so no initial-exec TLS. Its host tier
 * then loads libjemalloc.so.2, which a late dlopen can place only when
 * glibc has static TLS room; otherwise create says so with -ENOTSUP. Run by
 * make with LLMD_BUILD set (test-one builds libllmd.so). */
Test(ofl_host, shared_library_loads_late) {
    const char *build = getenv("LLMD_BUILD");
    char path[512];
    snprintf(path, sizeof path, "%s/libllmd.so", build ? build : "");
    if (!build || access(path, R_OK) != 0)
        cr_skip_test("no libllmd.so (set LLMD_BUILD, build it)");
    void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    cr_assert_not_null(dl, "late dlopen of libllmd.so: %s", dlerror());
    int (*create)(const struct ofl_host_config *, struct ofl_host **, char *, size_t);
    void (*destroy)(struct ofl_host *);
    void *(*alloc)(struct ofl_host *, size_t);
    void (*release)(struct ofl_host *, void *);
    *(void **)&create = dlsym(dl, "ofl_host_create");
    *(void **)&destroy = dlsym(dl, "ofl_host_destroy");
    *(void **)&alloc = dlsym(dl, "ofl_host_alloc");
    *(void **)&release = dlsym(dl, "ofl_host_free");
    cr_assert(create && destroy && alloc && release);
    struct ofl_host_config cfg = {.bytes = 4 * MIB, .numa_node = -1};
    struct ofl_host *h = NULL;
    char err[512] = "";
    int rc = create(&cfg, &h, err, sizeof err);
    const char *tun = getenv("GLIBC_TUNABLES");
    if (tun && strstr(tun, "optional_static_tls")) {
        cr_assert_eq(rc, 0, "with static TLS room: %d %s", rc, err);
        uint8_t *p = alloc(h, 2 * MIB);
        cr_assert_not_null(p);
        memset(p, 7, 2 * MIB);
        release(h, p);
        destroy(h);
    } else {
        cr_log_info("libllmd.so without static TLS room: %s", err);
        cr_assert_eq(rc, -ENOTSUP, "rc %d (%s)", rc, err);
        cr_assert_null(h);
        cr_assert(strstr(err, "libjemalloc2"), "message does not name the package: %s", err);
    }
}

/* The same test in a child of this binary started with static TLS room
 * (GLIBC_TUNABLES), where libllmd.so's tier must work. */
Test(ofl_host, shared_library_tier_works_with_static_tls_room, .timeout = 30) {
    const char *tun = getenv("GLIBC_TUNABLES");
    if (!getenv("LLMD_BUILD") || (tun && strstr(tun, "optional_static_tls")))
        cr_skip_test("no LLMD_BUILD, or already the child");
    extern char **environ;
    size_t n = 0;
    while (environ[n])
        n++;
    char **env = mem_calloc(MEM_TEST, n + 2, sizeof *env);
    cr_assert(env);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) /* BXFI_*: Criterion's sandbox marks its workers so */
        if (strncmp(environ[i], "BXFI_", 5) != 0 && strncmp(environ[i], "GLIBC_TUNABLES=", 15))
            env[k++] = environ[i];
    env[k] = "GLIBC_TUNABLES=glibc.rtld.optional_static_tls=16384";
    /* --quiet: the child's summary line must not count in run_tests.sh's */
    char *argv[] = {"test_ofl_host", "--quiet", "--filter", "ofl_host/shared_library_loads_late",
                    NULL};
    pid_t pid;
    int rc = posix_spawn(&pid, "/proc/self/exe", NULL, NULL, argv, env);
    cr_assert_eq(rc, 0, "posix_spawn: %s", strerror(rc));
    int st = 0;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    mem_free(env);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0,
              "child failed (status %#x); rerun: GLIBC_TUNABLES=%s LLMD_BUILD=%s "
              "<this binary> --filter ofl_host/shared_library_loads_late",
              st, "glibc.rtld.optional_static_tls=16384", getenv("LLMD_BUILD"));
}
