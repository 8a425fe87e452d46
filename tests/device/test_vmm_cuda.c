/* test_vmm_cuda.c - the CUDA backend of vmm/ on a real GPU, through its
 * vtable (vmm_backend.h) and the helpers of vmm_cuda_util.h.
 *
 * Plain C with a tiny harness (tests/device/ runs where Criterion may not be
 * installed): each check prints "ok"/"FAIL" with both values, and main ends
 * with "N passed, N failed, N skipped". Built and run by tests/device/run.sh
 * against build/cuda/libllmd.a.
 *
 * Without a GPU (or in a build without CUDA) it prints
 * "cuda backend unavailable: <reason>" and "0 passed, 0 failed, 1 skipped",
 * and exits 0. Any other create error is a failure.
 *
 * Covers: granularity, reserve/release, phys_alloc argument checks and OOM
 * all-or-nothing, fresh pages read as zeros, one handle mapped at two VAs
 * (bytes written through one are read through the other), copy, unmap and
 * remap keep the page's bytes, double map and foreign handles refused, and
 * the latency medians of cuMemMap, cuMemSetAccess, unmap and copy.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log.h"
#include "mem.h"
#include "vmm/vmm_backend.h"
#include "vmm/vmm_cuda_util.h"
#include "tests/device/dev_check.h"

#define N_PAGES  64u  /* pool size for the functional checks */
#define N_TIMED  500u /* map/unmap pairs timed; ~5-50 us each on current GPUs */
#define N_COPIES 100u /* page copies timed */

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static double median_us(uint64_t *ns, size_t n) {
    qsort(ns, n, sizeof(*ns), cmp_u64);
    return n ? (double)ns[n / 2] / 1e3 : 0.0;
}

static void fill(unsigned char *p, size_t n, uint32_t seed) {
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)((i * 131u + seed * 7u + (i >> 12)) & 0xff);
}

/* Index of the first byte where a and b differ, or n. */
static size_t first_diff(const unsigned char *a, const unsigned char *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (a[i] != b[i])
            return i;
    return n;
}

static void check_reserve(struct vmm_backend *b, size_t g) {
    uintptr_t va = 0;
    int rc = b->ops->reserve(b, 8 * g, &va);
    CHECK(rc == 0 && va != 0 && va % g == 0, "reserve rc %d va %#" PRIxPTR, rc, va);
    if (rc == 0)
        b->ops->release(b, va, 8 * g);
    rc = b->ops->reserve(b, g + 1, &va);
    CHECK(rc == -EINVAL, "reserve of a non-multiple: rc %d want %d", rc, -EINVAL);
    rc = b->ops->reserve(b, 0, &va);
    CHECK(rc == -EINVAL, "reserve of 0 bytes: rc %d want %d", rc, -EINVAL);
}

/* Pool of 1 GiB pages larger than any current GPU: cuMemCreate fails part
 * way, and phys_alloc must hand back what it created and stay usable. */
static void check_phys_alloc_oom(struct vmm_backend *b, size_t g) {
    size_t big = (size_t)1 << 30;
    big -= big % g;
    uint32_t n = 256; /* 256 GiB */
    uint64_t *h = mem_calloc(MEM_TEST, n, sizeof(*h));
    uint64_t t0 = now_ns();
    int rc = b->ops->phys_alloc(b, big, n, h);
    CHECK(rc == -ENOMEM, "phys_alloc of 256 GiB: rc %d want %d", rc, -ENOMEM);
    CHECK(b->page_bytes == 0, "page_bytes %zu after a failed phys_alloc", b->page_bytes);
    printf("phys_alloc 256 x 1 GiB -> %d in %.1f ms (all-or-nothing rollback)\n", rc,
           (double)(now_ns() - t0) / 1e6);
    mem_free(h);
}

int main(void) {
    struct vmm_backend *b = NULL;
    int rc = vmm_cuda_backend_create(0, &b);
    if (rc == -ENOTSUP) {
        printf("cuda backend unavailable: %s\n", vmm_cuda_why_unavailable());
        printf("0 passed, 0 failed, 1 skipped\n");
        return 0;
    }
    if (rc != 0) {
        printf("FAIL: vmm_cuda_backend_create: %d (%s)\n", rc, vmm_cuda_why_unavailable());
        printf("0 passed, 1 failed, 0 skipped\n");
        return 1;
    }
    CHECK(strcmp(b->ops->name, "cuda") == 0, "name %s", b->ops->name);

    size_t g = b->ops->granularity(b);
    printf("granularity %zu bytes\n", g);
    CHECK(g >= 4096 && (g & (g - 1)) == 0, "granularity %zu not a power of two >= 4 KiB", g);
    size_t P = g;

    check_reserve(b, g);

    uint64_t h[N_PAGES];
    rc = b->ops->phys_alloc(b, g + 4096, N_PAGES, h);
    CHECK(rc == -EINVAL, "phys_alloc of a non-multiple: rc %d want %d", rc, -EINVAL);
    check_phys_alloc_oom(b, g);

    uint64_t t0 = now_ns();
    rc = b->ops->phys_alloc(b, P, N_PAGES, h);
    printf("phys_alloc %u x %zu bytes: %.2f ms\n", N_PAGES, P, (double)(now_ns() - t0) / 1e6);
    CHECK(rc == 0, "phys_alloc rc %d", rc);
    if (rc != 0)
        goto out_destroy;
    CHECK(b->page_bytes == P, "page_bytes %zu want %zu", b->page_bytes, P);
    uint64_t again[1];
    rc = b->ops->phys_alloc(b, P, 1, again);
    CHECK(rc == -EBUSY, "second phys_alloc: rc %d want %d", rc, -EBUSY);

    unsigned char *src = mem_alloc(MEM_TEST, P), *dst = mem_alloc(MEM_TEST, P);
    uintptr_t r1 = 0, r2 = 0;
    CHECK(b->ops->reserve(b, 4 * P, &r1) == 0, "reserve r1");
    CHECK(b->ops->reserve(b, 4 * P, &r2) == 0, "reserve r2");

    /* A fresh page reads as zeros. */
    rc = b->ops->map(b, r1, h[0]);
    CHECK(rc == 0, "map h[0] rc %d", rc);
    memset(dst, 0xaa, P);
    rc = vmm_cuda_memcpy_dtoh(b, dst, r1, P);
    memset(src, 0, P);
    size_t d = first_diff(src, dst, P);
    CHECK(rc == 0 && d == P, "fresh page: rc %d, byte %zu is %#x", rc, d, d < P ? dst[d] : 0);
    CHECK(b->ops->unmap(b, r1, P) == 0, "unmap h[0]");

    /* One handle at two VAs: write through r1 + P, read through r2 + 2P. */
    CHECK(b->ops->map(b, r1 + P, h[3]) == 0, "map h[3] at r1+P");
    CHECK(b->ops->map(b, r2 + 2 * P, h[3]) == 0, "map h[3] at r2+2P");
    fill(src, P, 3);
    CHECK(vmm_cuda_memcpy_htod(b, r1 + P, src, P) == 0, "htod r1+P");
    memset(dst, 0, P);
    CHECK(vmm_cuda_memcpy_dtoh(b, dst, r2 + 2 * P, P) == 0, "dtoh r2+2P");
    d = first_diff(src, dst, P);
    CHECK(d == P, "shared page: byte %zu differs", d);

    /* Double map of a mapped VA is refused and leaves the mapping intact. */
    rc = b->ops->map(b, r1 + P, h[4]);
    CHECK(rc < 0, "map over a mapped VA: rc %d want < 0", rc);
    memset(dst, 0, P);
    CHECK(vmm_cuda_memcpy_dtoh(b, dst, r1 + P, P) == 0, "dtoh after refused map");
    CHECK(first_diff(src, dst, P) == P, "refused map changed the bytes");
    rc = b->ops->map(b, r1 + 3 * P, 0xdeadbeefull);
    CHECK(rc == -EINVAL, "map of a foreign handle: rc %d want %d", rc, -EINVAL);
    rc = b->ops->map(b, r1 + 1, h[5]);
    CHECK(rc == -EINVAL, "map at a misaligned VA: rc %d want %d", rc, -EINVAL);

    /* Unmap and remap at another place: the page keeps its bytes. */
    CHECK(b->ops->unmap(b, r1 + P, P) == 0, "unmap r1+P");
    CHECK(b->ops->map(b, r1 + 3 * P, h[3]) == 0, "remap h[3] at r1+3P");
    memset(dst, 0, P);
    CHECK(vmm_cuda_memcpy_dtoh(b, dst, r1 + 3 * P, P) == 0, "dtoh r1+3P");
    CHECK(first_diff(src, dst, P) == P, "remapped page lost its bytes");

    /* copy(h[6] <- h[3]), read h[6] through a fresh mapping. */
    CHECK(b->ops->copy(b, h[6], h[3]) == 0, "copy");
    CHECK(b->ops->map(b, r1, h[6]) == 0, "map h[6] at r1");
    memset(dst, 0, P);
    CHECK(vmm_cuda_memcpy_dtoh(b, dst, r1, P) == 0, "dtoh r1");
    d = first_diff(src, dst, P);
    CHECK(d == P, "copied page: byte %zu differs", d);
    rc = b->ops->copy(b, h[6], 0xdeadbeefull);
    CHECK(rc == -EINVAL, "copy from a foreign handle: rc %d want %d", rc, -EINVAL);
    CHECK(b->ops->copy(b, h[6], h[6]) == 0, "copy onto itself is a no-op");

    CHECK(b->ops->unmap(b, r1, P) == 0, "unmap r1");
    CHECK(b->ops->unmap(b, r1 + 3 * P, P) == 0, "unmap r1+3P");
    CHECK(b->ops->unmap(b, r2 + 2 * P, P) == 0, "unmap r2+2P");
    rc = b->ops->unmap(b, r2, P + 1);
    CHECK(rc == -EINVAL, "unmap of a partial page: rc %d want %d", rc, -EINVAL);

    /* Latency medians: map (cuMemMap + cuMemSetAccess), unmap, copy. */
    uint64_t *t_map = mem_calloc(MEM_TEST, N_TIMED, sizeof(uint64_t));
    uint64_t *t_acc = mem_calloc(MEM_TEST, N_TIMED, sizeof(uint64_t));
    uint64_t *t_all = mem_calloc(MEM_TEST, N_TIMED, sizeof(uint64_t));
    uint64_t *t_unm = mem_calloc(MEM_TEST, N_TIMED, sizeof(uint64_t));
    unsigned timed_fail = 0;
    for (unsigned i = 0; i < N_TIMED; i++) {
        uintptr_t va = r2 + (i % 4) * P;
        uint64_t a = now_ns();
        int e = b->ops->map(b, va, h[i % N_PAGES]);
        uint64_t m = now_ns();
        e = e ? e : vmm_cuda_map_split_ns(b, &t_map[i], &t_acc[i]);
        uint64_t u = now_ns();
        e = e ? e : b->ops->unmap(b, va, P);
        t_unm[i] = now_ns() - u;
        t_all[i] = m - a;
        timed_fail += e != 0;
    }
    CHECK(timed_fail == 0, "%u of %u timed map/unmap pairs failed", timed_fail, N_TIMED);
    uint64_t t_cpy[N_COPIES];
    for (unsigned i = 0; i < N_COPIES; i++) {
        uint64_t a = now_ns();
        rc = b->ops->copy(b, h[10 + i % 8], h[20 + i % 8]);
        t_cpy[i] = now_ns() - a;
        timed_fail += rc != 0;
    }
    CHECK(timed_fail == 0, "timed copies failed");
    printf("latency median over %u (page %zu bytes): map %.1f us = cuMemMap %.1f us + "
           "cuMemSetAccess %.1f us; unmap %.1f us\n",
           N_TIMED, P, median_us(t_all, N_TIMED), median_us(t_map, N_TIMED),
           median_us(t_acc, N_TIMED), median_us(t_unm, N_TIMED));
    printf("latency median over %u: copy of one page (DtoD + sync) %.1f us\n", N_COPIES,
           median_us(t_cpy, N_COPIES));
    mem_free(t_map);
    mem_free(t_acc);
    mem_free(t_all);
    mem_free(t_unm);

    b->ops->release(b, r1, 4 * P);
    b->ops->release(b, r2, 4 * P);
    mem_free(src);
    mem_free(dst);
    t0 = now_ns();
    b->ops->phys_free(b, h, N_PAGES);
    printf("phys_free %u pages: %.2f ms\n", N_PAGES, (double)(now_ns() - t0) / 1e6);
    CHECK(b->page_bytes == 0, "page_bytes %zu after phys_free", b->page_bytes);

out_destroy:
    b->ops->destroy(b);
    CHECK(mem_bytes(MEM_VMM) == 0, "vmm still holds %" PRIu64 " bytes", mem_bytes(MEM_VMM));
    CHECK(mem_bytes(MEM_TEST) == 0, "test still holds %" PRIu64 " bytes", mem_bytes(MEM_TEST));
    printf("%u passed, %u failed, 0 skipped\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
