/* bench_vmm - map/unmap latency per page of vmm/ on the host backend,
 * against raw mmap on the same memfd and the same address, in the same run.
 *
 * For each page size (64 KiB, 2 MiB, 8 MiB) one pool with a pre-faulted
 * memfd and one range. A repetition times:
 *   vmm map    vmm_range_grow of one page (free stack, metadata, one mmap)
 *   touch      one write per 4 KiB over the page (populates the PTEs, so the
 *              unmap that follows has real work, as BASELINES.md measures it)
 *   vmm unmap  vmm_range_shrink to 0 (one mmap(PROT_NONE) over the page)
 * and the same page of the same memfd at the same address with raw
 * mmap(MAP_SHARED|MAP_FIXED) / touch / mmap(PROT_NONE|MAP_FIXED). vmm and raw
 * alternate (and swap order each repetition), so noise hits both alike. Each round gives a median
 * and a p99; the figures are the medians over ROUNDS rounds. First touch of memory the memfd has
 * not allocated yet is timed on a second pool without prefault.
 *
 * Prints a table and writes build/bench_vmm.json. Runs in well under a minute.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>

#include "vmm/vmm.h"

#define ROUNDS 5
#define KIB    ((size_t)1 << 10)
#define MIB    ((size_t)1 << 20)

struct result {
    size_t page_bytes;
    const char *huge_kind;
    int reps;
    double vmm_map_med, vmm_map_p99, vmm_unmap_med, vmm_unmap_p99; /* us */
    double raw_map_med, raw_map_p99, raw_unmap_med, raw_unmap_p99; /* us */
    double touch_ms_per_mib;                                       /* populated memfd */
    double first_touch_ms_per_mib;                                 /* unallocated memfd */
};

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Sorts x in place; q in [0, 1]. */
static double quantile(double *x, int n, double q) {
    qsort(x, (size_t)n, sizeof *x, cmp_double);
    int i = (int)(q * (n - 1) + 0.5);
    return x[i];
}

static void touch(uint8_t *p, size_t bytes) {
    for (size_t o = 0; o < bytes; o += 4 * KIB)
        ((volatile uint8_t *)p)[o] = (uint8_t)o;
}

static struct vmm *pool(size_t page_bytes, uint32_t n_pages, bool prefault,
                        struct vmm_backend **be_out) {
    struct vmm_backend *be;
    if (vmm_host_backend_create(VMM_HUGE_AUTO, &be) != 0)
        return NULL;
    vmm_host_prefault_set(be, prefault);
    struct vmm_config cfg = {
        .backend = be,
        .token_bytes = 64,
        .page_bytes = page_bytes,
        .n_pages = n_pages,
        .n_ranges = 1,
        .max_tokens = (uint32_t)(n_pages * (page_bytes / 64)),
    };
    struct vmm *v;
    char err[256];
    int rc = vmm_create(&cfg, &v, err, sizeof err);
    if (rc) {
        fprintf(stderr, "bench_vmm: %s\n", err);
        return NULL;
    }
    *be_out = be;
    return v;
}

/* One vmm repetition: grow by one page, touch it, shrink it away. Times in
 * us, touch in ms per MiB. */
static int rep_vmm(struct vmm *v, uint32_t r, size_t page_bytes, double *map_us, double *unmap_us,
                   double *touch_ms_mib, uint32_t *page) {
    uint8_t *base = (uint8_t *)vmm_range_base(v, r);
    double t0 = now_us();
    if (vmm_range_grow(v, r, vmm_tokens_per_page(v)))
        return -1;
    double t1 = now_us();
    touch(base, page_bytes);
    double t2 = now_us();
    *page = vmm_range_page(v, r, 0);
    if (vmm_range_shrink(v, r, 0))
        return -1;
    double t3 = now_us();
    *map_us = t1 - t0;
    *unmap_us = t3 - t2;
    *touch_ms_mib = (t2 - t1) / ((double)page_bytes / MIB) / 1e3;
    return 0;
}

/* The raw baseline: the same memfd page at the same address. */
static int rep_raw(uint8_t *base, int fd, uint32_t page, size_t page_bytes, double *map_us,
                   double *unmap_us) {
    double t0 = now_us();
    void *m = mmap(base, page_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd,
                   (off_t)((size_t)page * page_bytes));
    double t1 = now_us();
    if (m == MAP_FAILED)
        return -1;
    touch(base, page_bytes);
    double t2 = now_us();
    m = mmap(base, page_bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED,
             -1, 0);
    double t3 = now_us();
    if (m == MAP_FAILED)
        return -1;
    *map_us = t1 - t0;
    *unmap_us = t3 - t2;
    return 0;
}

static int bench_size(size_t page_bytes, int reps, struct result *res) {
    struct vmm_backend *be;
    struct vmm *v = pool(page_bytes, 2, true, &be);
    if (!v)
        return -1;
    uint32_t r, tpp = vmm_tokens_per_page(v);
    vmm_range_acquire(v, &r);
    uint8_t *base = (uint8_t *)vmm_range_base(v, r);
    int fd = vmm_host_fd(be);
    double *s[5];
    for (int k = 0; k < 5; k++)
        s[k] = calloc((size_t)reps, sizeof(double));
    double med[ROUNDS][9];
    uint32_t page = 0; /* vmm's LIFO free stack hands out page 0 every time */
    for (int round = 0; round < ROUNDS; round++) {
        for (int i = 0; i < reps; i++) {
            /* Alternate which goes first, so neither always follows the other's unmap. */
            for (int half = 0; half < 2; half++) {
                if ((half == 0) == (i % 2 == 0)) {
                    if (rep_vmm(v, r, page_bytes, &s[0][i], &s[1][i], &s[4][i], &page))
                        return -1;
                } else if (rep_raw(base, fd, page, page_bytes, &s[2][i], &s[3][i])) {
                    return -1;
                }
            }
        }
        for (int k = 0; k < 4; k++) {
            med[round][2 * k] = quantile(s[k], reps, 0.5);
            med[round][2 * k + 1] = quantile(s[k], reps, 0.99);
        }
        med[round][8] = quantile(s[4], reps, 0.5);
    }
    double col[ROUNDS], out[9];
    for (int k = 0; k < 9; k++) {
        for (int round = 0; round < ROUNDS; round++)
            col[round] = med[round][k];
        out[k] = quantile(col, ROUNDS, 0.5);
    }
    *res = (struct result){
        .page_bytes = page_bytes,
        .huge_kind = vmm_host_huge_kind(be),
        .reps = reps,
        .vmm_map_med = out[0],
        .vmm_map_p99 = out[1],
        .vmm_unmap_med = out[2],
        .vmm_unmap_p99 = out[3],
        .raw_map_med = out[4],
        .raw_map_p99 = out[5],
        .raw_unmap_med = out[6],
        .raw_unmap_p99 = out[7],
        .touch_ms_per_mib = out[8],
    };
    for (int k = 0; k < 5; k++)
        free(s[k]);
    vmm_destroy(v);

    /* First touch: a pool whose memfd has not allocated its pages yet. */
    uint32_t n = (uint32_t)(64 * MIB / page_bytes);
    n = n < 4 ? 4 : n > 64 ? 64 : n;
    v = pool(page_bytes, n, false, &be);
    if (!v)
        return -1;
    vmm_range_acquire(v, &r);
    base = (uint8_t *)vmm_range_base(v, r);
    double *ft = calloc(n, sizeof(double));
    for (uint32_t i = 0; i < n; i++) {
        if (vmm_range_grow(v, r, (i + 1) * tpp))
            return -1;
        double t0 = now_us();
        touch(base + (size_t)i * page_bytes, page_bytes);
        ft[i] = (now_us() - t0) / ((double)page_bytes / MIB) / 1e3;
    }
    res->first_touch_ms_per_mib = quantile(ft, (int)n, 0.5);
    free(ft);
    vmm_destroy(v);
    return 0;
}

int main(void) {
    const size_t sizes[] = {64 * KIB, 2 * MIB, 8 * MIB};
    const int reps[] = {2000, 150, 60};
    struct result res[3];
    printf("vmm host backend: per-page latency, median and p99 in us over %d rounds (medians)\n",
           ROUNDS);
    printf("%-8s %-5s %5s | %9s %9s | %9s %9s | %9s %9s | %9s %9s | %6s %6s | %8s %8s\n", "page",
           "huge", "reps", "vmm map", "p99", "raw map", "p99", "vmm unmp", "p99", "raw unmp", "p99",
           "map x", "unmp x", "touch", "1sttouch");
    for (int i = 0; i < 3; i++) {
        if (bench_size(sizes[i], reps[i], &res[i]) != 0) {
            fprintf(stderr, "bench_vmm: page size %zu failed: %s\n", sizes[i], strerror(errno));
            return 1;
        }
        struct result *x = &res[i];
        printf("%5zu KiB %-5s %5d | %9.1f %9.1f | %9.1f %9.1f | %9.1f %9.1f | %9.1f %9.1f | "
               "%6.2f %6.2f | %8.3f %8.3f\n",
               x->page_bytes / KIB, x->huge_kind, x->reps, x->vmm_map_med, x->vmm_map_p99,
               x->raw_map_med, x->raw_map_p99, x->vmm_unmap_med, x->vmm_unmap_p99, x->raw_unmap_med,
               x->raw_unmap_p99, x->vmm_map_med / x->raw_map_med,
               x->vmm_unmap_med / x->raw_unmap_med, x->touch_ms_per_mib, x->first_touch_ms_per_mib);
    }
    printf("touch / 1sttouch: ms per MiB, one write per 4 KiB (populated memfd / unallocated)\n");
    mkdir("build", 0755);
    FILE *f = fopen("build/bench_vmm.json", "w");
    if (!f) {
        perror("bench_vmm: build/bench_vmm.json");
        return 1;
    }
    fprintf(f, "{\"bench\":\"vmm\",\"backend\":\"host\",\"rounds\":%d,\"results\":[", ROUNDS);
    for (int i = 0; i < 3; i++) {
        struct result *x = &res[i];
        fprintf(f,
                "%s\n{\"page_bytes\":%zu,\"huge_kind\":\"%s\",\"reps\":%d,"
                "\"vmm_map_us_p50\":%.2f,\"vmm_map_us_p99\":%.2f,"
                "\"raw_map_us_p50\":%.2f,\"raw_map_us_p99\":%.2f,"
                "\"vmm_unmap_us_p50\":%.2f,\"vmm_unmap_us_p99\":%.2f,"
                "\"raw_unmap_us_p50\":%.2f,\"raw_unmap_us_p99\":%.2f,"
                "\"map_ratio\":%.3f,\"unmap_ratio\":%.3f,"
                "\"touch_ms_per_mib\":%.4f,\"first_touch_ms_per_mib\":%.4f}",
                i ? "," : "", x->page_bytes, x->huge_kind, x->reps, x->vmm_map_med, x->vmm_map_p99,
                x->raw_map_med, x->raw_map_p99, x->vmm_unmap_med, x->vmm_unmap_p99,
                x->raw_unmap_med, x->raw_unmap_p99, x->vmm_map_med / x->raw_map_med,
                x->vmm_unmap_med / x->raw_unmap_med, x->touch_ms_per_mib,
                x->first_touch_ms_per_mib);
    }
    fprintf(f, "\n]}\n");
    fclose(f);
    printf("wrote build/bench_vmm.json\n");
    return 0;
}
