/* bench_ofl_host - the host tier (offload/ofl_host.h): spill and restore
 * bandwidth of 2 MiB KV pages, alloc+free cost per page, and how many pages
 * fit in a budget; each against its baseline, in the same run.
 *
 * Spill: for each of N pages, ofl_host_alloc(2 MiB) + memcpy from a source
 * buffer (the stand-in for device pages) into it. Restore: memcpy from the
 * tier back to a destination buffer + ofl_host_free. Baseline: memcpy of the
 * same source into a plain, pre-faulted buffer of the same size, and back. The
 * tier and the baseline alternate (the order swaps each repetition), so noise
 * hits both alike; figures are medians of REPS repetitions. Alloc+free: N
 * allocations then N frees, per page; for scale, glibc malloc+free of the
 * same untouched 2 MiB blocks, which at this size moves the heap's end with a
 * brk system call about once per call (strace), where the tier makes none.
 * Create: the time to map, bind, fault in and pin the tier. Fit: 2 MiB
 * allocations until NULL, at several budgets.
 *
 * Prints a table and writes build/bench_ofl_host.json. About 5-10 s, under
 * 600 MiB (source, destination, baseline buffer of 128 MiB, tier of 132 MiB;
 * then tiers of up to 500 MiB, one at a time).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tests/bench/bench_util.h"
#include "offload/ofl_host.h"

#define MIB      ((size_t)1 << 20)
#define PAGE     (2 * MIB)
#define N_PAGES  64
#define REPS     15
#define N_BUDGET 4

struct result {
    const char *kind;
    int numa_node;
    double create_ms;                 /* 128 MiB tier */
    double spill_gbs, spill_base_gbs; /* GB/s (1e9 B/s) */
    double restore_gbs, restore_base_gbs;
    double alloc_free_us, malloc_free_us; /* per page */
    uint64_t budget_mib[N_BUDGET];
    size_t fit[N_BUDGET], ideal[N_BUDGET];
};

static struct ofl_host *tier(size_t bytes, double *create_ms) {
    struct ofl_host_config cfg = {.bytes = bytes, .numa_node = -1};
    struct ofl_host *h = NULL;
    char err[256];
    double t0 = bench_now();
    int rc = ofl_host_create(&cfg, &h, err, sizeof err);
    if (create_ms)
        *create_ms = (bench_now() - t0) * 1e3;
    if (rc) {
        fprintf(stderr, "bench_ofl_host: %s\n", err);
        exit(1);
    }
    return h;
}

/* One spill + restore of N_PAGES pages through the tier; seconds of each. */
static void tier_round(struct ofl_host *h, uint8_t *src, uint8_t *dst, double *spill,
                       double *restore) {
    void *p[N_PAGES];
    double t0 = bench_now();
    for (int i = 0; i < N_PAGES; i++) {
        p[i] = ofl_host_alloc(h, PAGE);
        if (!p[i]) {
            fprintf(stderr, "bench_ofl_host: tier full at page %d\n", i);
            exit(1);
        }
        memcpy(p[i], src + (size_t)i * PAGE, PAGE);
    }
    double t1 = bench_now();
    for (int i = 0; i < N_PAGES; i++) {
        memcpy(dst + (size_t)i * PAGE, p[i], PAGE);
        ofl_host_free(h, p[i]);
    }
    *spill = t1 - t0;
    *restore = bench_now() - t1;
}

/* The same copies through a plain buffer. */
static void base_round(uint8_t *buf, uint8_t *src, uint8_t *dst, double *spill, double *restore) {
    double t0 = bench_now();
    for (int i = 0; i < N_PAGES; i++)
        memcpy(buf + (size_t)i * PAGE, src + (size_t)i * PAGE, PAGE);
    double t1 = bench_now();
    for (int i = 0; i < N_PAGES; i++)
        memcpy(dst + (size_t)i * PAGE, buf + (size_t)i * PAGE, PAGE);
    *spill = t1 - t0;
    *restore = bench_now() - t1;
}

static void bandwidth(struct result *r, struct ofl_host *h) {
    size_t bytes = (size_t)N_PAGES * PAGE;
    uint8_t *src = mem_alloc(MEM_MISC, bytes), *dst = mem_alloc(MEM_MISC, bytes);
    uint8_t *buf = mem_alloc(MEM_MISC, bytes);
    if (!src || !dst || !buf) {
        fprintf(stderr, "bench_ofl_host: out of memory\n");
        exit(1);
    }
    memset(src, 1, bytes); /* fault everything in before timing */
    memset(dst, 2, bytes);
    memset(buf, 3, bytes);
    double ts[REPS], tr[REPS], bs[REPS], br[REPS];
    for (int k = 0; k < REPS; k++) {
        if (k % 2) {
            tier_round(h, src, dst, &ts[k], &tr[k]);
            base_round(buf, src, dst, &bs[k], &br[k]);
        } else {
            base_round(buf, src, dst, &bs[k], &br[k]);
            tier_round(h, src, dst, &ts[k], &tr[k]);
        }
    }
    r->spill_gbs = (double)bytes / bench_median(ts, REPS) / 1e9;
    r->restore_gbs = (double)bytes / bench_median(tr, REPS) / 1e9;
    r->spill_base_gbs = (double)bytes / bench_median(bs, REPS) / 1e9;
    r->restore_base_gbs = (double)bytes / bench_median(br, REPS) / 1e9;
    mem_free(src);
    mem_free(dst);
    mem_free(buf);
}

/* Per page: N_PAGES allocations then N_PAGES frees, median over REPS. */
static void alloc_free(struct result *r, struct ofl_host *h) {
    double t[REPS], b[REPS];
    void *p[N_PAGES];
    for (int k = 0; k < REPS; k++) {
        double t0 = bench_now();
        for (int i = 0; i < N_PAGES; i++)
            p[i] = ofl_host_alloc(h, PAGE);
        for (int i = 0; i < N_PAGES; i++)
            ofl_host_free(h, p[i]);
        t[k] = (bench_now() - t0) / N_PAGES * 1e6;
        t0 = bench_now();
        for (int i = 0; i < N_PAGES; i++)
            p[i] = malloc(PAGE);
        for (int i = 0; i < N_PAGES; i++)
            free(p[i]);
        b[k] = (bench_now() - t0) / N_PAGES * 1e6;
    }
    r->alloc_free_us = bench_median(t, REPS);
    r->malloc_free_us = bench_median(b, REPS);
}

/* 2 MiB pages until NULL in a fresh tier of `mib` MiB. */
static size_t fit(uint64_t mib) {
    struct ofl_host *h = tier(mib * MIB, NULL);
    size_t max = mib / 2 + 1, n = 0;
    void **p = mem_alloc(MEM_MISC, max * sizeof *p);
    while (p && n < max && (p[n] = ofl_host_alloc(h, PAGE)))
        n++;
    for (size_t i = 0; i < n; i++)
        ofl_host_free(h, p[i]);
    mem_free(p);
    ofl_host_destroy(h);
    return n;
}

int main(void) {
    static const uint64_t budgets[N_BUDGET] = {64, 100, 130, 500};
    struct result r = {0};
    /* two pages more than N_PAGES: each takes 2 MiB + 4 KiB, and the end of
     * a primed extent may lose one (see "What fits" in ofl_host.c) */
    struct ofl_host *h = tier((size_t)(N_PAGES + 2) * PAGE, &r.create_ms);
    r.kind = ofl_host_kind_name(ofl_host_kind(h));
    r.numa_node = ofl_host_numa_node(h);
    bandwidth(&r, h);
    alloc_free(&r, h);
    ofl_host_destroy(h);
    for (int i = 0; i < N_BUDGET; i++) {
        r.budget_mib[i] = budgets[i];
        r.fit[i] = fit(budgets[i]);
        r.ideal[i] = (size_t)(budgets[i] * MIB / (PAGE + 4096));
    }

    printf("host tier: %d x 2 MiB pages, %s memory, NUMA node %d, median of %d\n", N_PAGES, r.kind,
           r.numa_node, REPS);
    printf("create (map, bind, fault in, pin) %zu MiB: %.1f ms (%.3f ms/MiB)\n",
           (size_t)(N_PAGES + 2) * PAGE / MIB, r.create_ms,
           r.create_ms / (double)((N_PAGES + 2) * PAGE / MIB));
    printf("%-22s %10s %12s %7s\n", "", "tier", "baseline", "ratio");
    printf("%-22s %10.2f %12.2f %7.2f   GB/s, alloc+memcpy vs memcpy\n", "spill", r.spill_gbs,
           r.spill_base_gbs, r.spill_gbs / r.spill_base_gbs);
    printf("%-22s %10.2f %12.2f %7.2f   GB/s, memcpy+free vs memcpy\n", "restore", r.restore_gbs,
           r.restore_base_gbs, r.restore_gbs / r.restore_base_gbs);
    printf("%-22s %10.2f %12.2f %7.2f   us per page, vs glibc malloc+free (brk)\n", "alloc+free",
           r.alloc_free_us, r.malloc_free_us, r.alloc_free_us / r.malloc_free_us);
    printf("2 MiB pages that fit:");
    for (int i = 0; i < N_BUDGET; i++)
        printf("  %llu MiB: %zu (at most %zu)", (unsigned long long)r.budget_mib[i], r.fit[i],
               r.ideal[i]);
    printf("\n(at most: budget / (2 MiB + 4 KiB), jemalloc's page per large allocation)\n");

    mkdir("build", 0755);
    FILE *f = fopen("build/bench_ofl_host.json", "w");
    if (!f) {
        perror("bench_ofl_host: build/bench_ofl_host.json");
        return 1;
    }
    fprintf(f,
            "{\"bench\":\"ofl_host\",\"page_bytes\":%zu,\"pages\":%d,\"reps\":%d,\"kind\":\"%s\","
            "\"numa_node\":%d,\"create_ms\":%.2f,"
            "\"spill_gbs\":%.3f,\"spill_baseline_gbs\":%.3f,"
            "\"restore_gbs\":%.3f,\"restore_baseline_gbs\":%.3f,"
            "\"alloc_free_us\":%.3f,\"malloc_free_us\":%.3f,\"fit\":[",
            PAGE, N_PAGES, REPS, r.kind, r.numa_node, r.create_ms, r.spill_gbs, r.spill_base_gbs,
            r.restore_gbs, r.restore_base_gbs, r.alloc_free_us, r.malloc_free_us);
    for (int i = 0; i < N_BUDGET; i++)
        fprintf(f, "%s{\"budget_mib\":%llu,\"pages\":%zu,\"at_most\":%zu}", i ? "," : "",
                (unsigned long long)r.budget_mib[i], r.fit[i], r.ideal[i]);
    fprintf(f, "]}\n");
    fclose(f);
    printf("wrote build/bench_ofl_host.json\n");
    return 0;
}
