/* test_vmm_pool_cuda.c - the vmm/ pool (vmm.h) over the CUDA backend: the
 * behaviours of the host suite (tests/test_vmm_range.c, test_vmm_fault.c,
 * test_vmm_stress.c, test_vmm_thread.c) with vmm_config.backend a CUDA
 * backend, so ranges are CUdeviceptr spans and every byte is written and
 * read through vmm_cuda_memcpy_htod/dtoh instead of host pointers.
 *
 * Plain C with the tiny harness of test_vmm_cuda.c: each failed check prints
 * "FAIL" with both values, and main ends with "N passed, N failed, N
 * skipped". Built and run by tests/device/run.sh against build/cuda/libllmd.a,
 * first on tests/device/fake_libcuda.c, then on the real driver. Without a
 * GPU it prints "cuda backend unavailable: <reason>" and "0 passed, 0 failed,
 * 1 skipped", and exits 0.
 *
 * Covers: page-size rounding against the 2 MiB granularity (S = 128 KiB ->
 * 16 tokens a page; S = 56 KiB -> 14 MiB = 256 tokens, DESIGN's Qwen
 * example); grow/shrink/release with exact stats; sharing (bytes written
 * through one range are read through another); copy-on-write keeps the
 * original; zero_pages; seal/cached/evict; -ENOSPC/-EBUSY/-ERANGE/-EINVAL;
 * every backend call of grow/share/cow/map-ahead/shrink/release failing in
 * turn changes nothing; a 20,000-step random run against a reference model
 * with byte tags read back every 256 steps; map-ahead from a second thread
 * (whose context the backend must make current itself); map_span: a grow of
 * several pages sets access once over them (counted by the fake driver) and
 * a driver call failing inside the span changes nothing; and the "vmm over
 * cuda" latencies of growing and shrinking one page.
 *
 * Sizes are modest (at most 48 + 1 pages of 2 MiB per pool; one 28 MiB pool)
 * so the run takes seconds on a GPU. One backend (`keep`) stays alive for the
 * whole run so the device's primary context is retained across pools rather
 * than torn down and recreated by each vmm_destroy().
 *
 * Threads: the backend is not thread-safe (vmm_backend.h), and the copies of
 * vmm_cuda_util.h run outside the pool lock, so the thread test holds a lock
 * of its own (io_lock) around its copies and around the map-ahead thread's
 * calls; the two threads' vmm calls still contend on the pool lock.
 */
#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>

#include "log.h"
#include "mem.h"
#include "vmm/vmm.h"
#include "vmm/vmm_backend.h"
#include "vmm/vmm_cuda_util.h"
#include "tests/device/dev_check.h"

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* ---- a pool over a fresh CUDA backend, and byte access through it ---- */

struct tp {
    struct vmm *v;
    struct vmm_backend *b; /* owned by v; valid until vmm_destroy(v) */
    size_t P, S;
};

/* A pool of n_pages pages (P rounded from page_bytes) over a new CUDA
 * backend. false (with a FAIL) when it cannot be made. */
static bool tp_open(struct tp *t, size_t token_bytes, size_t page_bytes, uint32_t n_pages,
                    uint32_t n_ranges, uint32_t max_tokens, bool zero_pages) {
    memset(t, 0, sizeof(*t));
    int rc = vmm_cuda_backend_create(0, &t->b);
    CHECK(rc == 0, "vmm_cuda_backend_create: %d (%s)", rc, vmm_cuda_why_unavailable());
    if (rc)
        return false;
    struct vmm_config cfg = {.backend = t->b,
                             .token_bytes = token_bytes,
                             .page_bytes = page_bytes,
                             .n_pages = n_pages,
                             .n_ranges = n_ranges,
                             .max_tokens = max_tokens,
                             .zero_pages = zero_pages};
    char err[256] = "";
    rc = vmm_create(&cfg, &t->v, err, sizeof(err));
    CHECK(rc == 0, "vmm_create: %d %s", rc, err);
    if (rc)
        return false; /* vmm_create destroyed the backend */
    CHECK(vmm_check(t->v), "fresh pool");
    t->P = vmm_page_bytes(t->v);
    t->S = vmm_token_bytes(t->v);
    return true;
}

static void tp_close(struct tp *t) {
    vmm_destroy(t->v);
    t->v = NULL;
    t->b = NULL;
}

/* Device address of byte `off` of page idx of range r. */
static uintptr_t tp_at(const struct tp *t, uint32_t r, uint32_t idx, size_t off) {
    return vmm_range_base(t->v, r) + (uintptr_t)idx * t->P + off;
}

static int tp_put(struct tp *t, uint32_t r, uint32_t idx, size_t off, const void *src, size_t n) {
    return vmm_cuda_memcpy_htod(t->b, tp_at(t, r, idx, off), src, n);
}

static int tp_get(struct tp *t, uint32_t r, uint32_t idx, size_t off, void *dst, size_t n) {
    return vmm_cuda_memcpy_dtoh(t->b, dst, tp_at(t, r, idx, off), n);
}

static uint8_t pat(size_t i, uint32_t seed) {
    return (uint8_t)((i * 131u + seed * 7u + (i >> 12)) & 0xff);
}

/* Fill page idx of r with the pattern of seed (0: zeros). */
static int tp_fill(struct tp *t, uint32_t r, uint32_t idx, uint32_t seed) {
    uint8_t *buf = mem_alloc(MEM_TEST, t->P);
    if (!buf)
        return -ENOMEM;
    for (size_t i = 0; i < t->P; i++)
        buf[i] = seed ? pat(i, seed) : 0;
    int rc = tp_put(t, r, idx, 0, buf, t->P);
    mem_free(buf);
    return rc;
}

/* Offset of the first byte of page idx of r that differs from the pattern
 * of seed (0: zeros), t->P if none, or (size_t)-1 if the read failed.
 * *got gets the byte found there. */
static size_t tp_diff(struct tp *t, uint32_t r, uint32_t idx, uint32_t seed, unsigned *got) {
    uint8_t *buf = mem_alloc(MEM_TEST, t->P);
    size_t d = (size_t)-1;
    *got = 0;
    if (buf && tp_get(t, r, idx, 0, buf, t->P) == 0) {
        for (d = 0; d < t->P; d++)
            if (buf[d] != (seed ? pat(d, seed) : 0))
                break;
        *got = d < t->P ? buf[d] : 0;
    }
    mem_free(buf);
    return d;
}

#define CHECK_PAGE(t, r, idx, seed, what)                                                          \
    do {                                                                                           \
        unsigned got_;                                                                             \
        size_t d_ = tp_diff(t, r, idx, seed, &got_);                                               \
        CHECK(d_ == (t)->P, "%s: range %u idx %u: byte %zd is %#x (seed %u)", what, (unsigned)(r), \
              (unsigned)(idx), (ssize_t)d_, got_, (unsigned)(seed));                               \
    } while (0)

/* ---- geometry ---- */

static void test_geometry(void) {
    struct tp t;
    /* S = 128 KiB, P = 0: the granularity itself, 16 tokens. */
    if (tp_open(&t, 128 * KIB, 0, 4, 2, 100, false)) {
        CHECK(strcmp(vmm_backend_name(t.v), "cuda") == 0, "backend %s", vmm_backend_name(t.v));
        CHECK(t.P == 2 * MIB, "P %zu want %zu", t.P, 2 * MIB);
        CHECK(vmm_tokens_per_page(t.v) == 16, "tpp %u want 16", vmm_tokens_per_page(t.v));
        CHECK(vmm_range_max_pages(t.v) == 7, "max pages %u want ceil(100/16) = 7",
              vmm_range_max_pages(t.v));
        struct vmm_stats s;
        vmm_stats_get(t.v, &s);
        CHECK(s.va_reserved_bytes == 2 * 8 * 2 * MIB, "va %" PRIu64 " want 2 ranges x 8 x 2 MiB",
              s.va_reserved_bytes);
        CHECK(vmm_range_base(t.v, 0) % (2 * MIB) == 0, "base %#" PRIxPTR, vmm_range_base(t.v, 0));
        tp_close(&t);
    }
    /* A 3 MiB request rounds up to the next granularity multiple. */
    if (tp_open(&t, 128 * KIB, 3 * MIB, 2, 1, 64, false)) {
        CHECK(t.P == 4 * MIB, "P %zu want %zu", t.P, 4 * MIB);
        CHECK(vmm_tokens_per_page(t.v) == 32, "tpp %u", vmm_tokens_per_page(t.v));
        tp_close(&t);
    }
    /* DESIGN's Qwen example: S = 56 KiB, P = lcm(2 MiB, 56 KiB) = 14 MiB,
     * 256 tokens. Token 255 is the last of page 0, token 256 the first of
     * page 1: each lands where base + t*S says. */
    if (tp_open(&t, 56 * KIB, 0, 2, 1, 512, false)) {
        CHECK(t.P == 14 * MIB, "P %zu want %zu", t.P, 14 * MIB);
        CHECK(vmm_tokens_per_page(t.v) == 256, "tpp %u want 256", vmm_tokens_per_page(t.v));
        uint32_t r = 0;
        CHECK(vmm_range_acquire(t.v, &r) == 0, "acquire");
        CHECK(vmm_range_grow(t.v, r, 257) == 0, "grow 257");
        CHECK(vmm_range_n_mapped(t.v, r) == 2, "n_mapped %u", vmm_range_n_mapped(t.v, r));
        uintptr_t base = vmm_range_base(t.v, r);
        uint64_t a = 0xA255, b = 0xB256, x = 0, y = 0;
        CHECK(vmm_cuda_memcpy_htod(t.b, base + 255 * t.S + t.S - 8, &a, 8) == 0, "htod t255");
        CHECK(vmm_cuda_memcpy_htod(t.b, base + 256 * t.S, &b, 8) == 0, "htod t256");
        CHECK(tp_get(&t, r, 0, t.P - 8, &x, 8) == 0 && x == a, "page 0 tail %#" PRIx64, x);
        CHECK(tp_get(&t, r, 1, 0, &y, 8) == 0 && y == b, "page 1 head %#" PRIx64, y);
        CHECK(vmm_check(t.v), "qwen");
        tp_close(&t);
    }
    /* A bad config is refused, and the given backend is destroyed. */
    struct vmm_backend *b = NULL;
    int rc = vmm_cuda_backend_create(0, &b);
    CHECK(rc == 0, "create: %d", rc);
    if (rc == 0) {
        struct vmm_config cfg = {.backend = b, .token_bytes = 64, .n_ranges = 0, .max_tokens = 1};
        struct vmm *v = NULL;
        rc = vmm_create(&cfg, &v, NULL, 0);
        CHECK(rc == -EINVAL && v == NULL, "n_ranges 0: rc %d", rc);
    }
}

/* ---- ranges ---- */

static void test_grow_shrink_release(void) {
    struct tp t;
    if (!tp_open(&t, 128 * KIB, 0, 8, 3, 16 * 6, false))
        return;
    uint32_t r[4];
    for (int i = 0; i < 3; i++) {
        CHECK(vmm_range_acquire(t.v, &r[i]) == 0 && r[i] == (uint32_t)i, "slot %u", r[i]);
    }
    CHECK(vmm_range_acquire(t.v, &r[3]) == -EBUSY, "fourth acquire");
    CHECK(vmm_range_release(t.v, 1) == 0, "release 1");
    CHECK(vmm_range_release(t.v, 1) == -EINVAL, "double release");
    CHECK(vmm_range_acquire(t.v, &r[3]) == 0 && r[3] == 1, "reacquire %u", r[3]);

    CHECK(vmm_range_grow(t.v, 0, 1) == 0, "grow 1");
    CHECK(vmm_range_n_mapped(t.v, 0) == 1 && vmm_range_capacity(t.v, 0) == 16, "1 page, cap %u",
          vmm_range_capacity(t.v, 0));
    CHECK(vmm_range_grow(t.v, 0, 16) == 0 && vmm_range_n_mapped(t.v, 0) == 1, "still 1 page");
    CHECK(vmm_range_grow(t.v, 0, 40) == 0 && vmm_range_n_mapped(t.v, 0) == 3, "3 pages: %u",
          vmm_range_n_mapped(t.v, 0));
    CHECK(vmm_range_page(t.v, 0, 3) == VMM_PAGE_NONE, "idx 3 unmapped");
    /* Every token's first 8 bytes, then read back: base + t*S across pages. */
    uintptr_t base = vmm_range_base(t.v, 0);
    unsigned bad = 0;
    for (uint64_t tk = 0; tk < 48; tk++) {
        uint64_t w = 0x7000 + tk;
        bad += vmm_cuda_memcpy_htod(t.b, base + tk * t.S, &w, 8) != 0;
    }
    for (uint64_t tk = 0; tk < 48; tk++) {
        uint64_t w = 0;
        bad += vmm_cuda_memcpy_dtoh(t.b, &w, base + tk * t.S, 8) != 0 || w != 0x7000 + tk;
    }
    CHECK(bad == 0, "%u of 48 tokens wrong", bad);
    struct vmm_stats s;
    vmm_stats_get(t.v, &s);
    CHECK(s.pages_free == 5 && s.pages_mapped == 3, "free %" PRIu64 " mapped %" PRIu64,
          s.pages_free, s.pages_mapped);
    CHECK(s.map_calls_total == 3 && s.grow_waited_total == 2 && s.unmap_calls_total == 0,
          "maps %" PRIu64 " waited %" PRIu64 " unmaps %" PRIu64, s.map_calls_total,
          s.grow_waited_total, s.unmap_calls_total);
    CHECK(s.ranges_in_use == 3, "ranges in use %" PRIu64, s.ranges_in_use);

    CHECK(vmm_range_shrink(t.v, 0, 17) == 0 && vmm_range_n_mapped(t.v, 0) == 2,
          "token 16 lives on page 1: %u", vmm_range_n_mapped(t.v, 0));
    CHECK(vmm_range_shrink(t.v, 0, 32) == 0 && vmm_range_n_mapped(t.v, 0) == 2, "no-op shrink");
    uint64_t w = 0;
    CHECK(vmm_cuda_memcpy_dtoh(t.b, &w, base + 31 * t.S, 8) == 0 && w == 0x7000 + 31,
          "token 31 kept: %#" PRIx64, w);
    CHECK(vmm_range_grow(t.v, 2, 16 * 6) == 0, "grow range 2 to 6 pages");
    CHECK(vmm_range_grow(t.v, 1, 1) == -ENOSPC, "8 pages all mapped");
    CHECK(vmm_range_release(t.v, 2) == 0, "release 2");
    CHECK(vmm_range_shrink(t.v, 0, 0) == 0 && vmm_range_n_mapped(t.v, 0) == 0, "shrink 0");
    vmm_stats_get(t.v, &s);
    CHECK(s.pages_free == 8 && s.pages_mapped == 0, "free %" PRIu64, s.pages_free);
    CHECK(s.unmap_calls_total == 3, "one unmap call per shrink or release: %" PRIu64,
          s.unmap_calls_total);
    CHECK(s.map_calls_total == 9, "maps %" PRIu64, s.map_calls_total);
    CHECK(s.ranges_in_use == 2, "ranges in use %" PRIu64, s.ranges_in_use);
    CHECK(s.backend_errors_total == 0, "backend errors %" PRIu64, s.backend_errors_total);
    CHECK(vmm_check(t.v), "grow/shrink");

    /* Without zero_pages a page comes back with its stale bytes (LIFO). */
    CHECK(vmm_range_grow(t.v, 0, 1) == 0, "grow");
    uint32_t p = vmm_range_page(t.v, 0, 0);
    CHECK(tp_fill(&t, 0, 0, 9) == 0, "fill");
    CHECK(vmm_range_shrink(t.v, 0, 0) == 0 && vmm_range_grow(t.v, 0, 1) == 0, "cycle");
    CHECK(vmm_range_page(t.v, 0, 0) == p, "LIFO: page %u want %u", vmm_range_page(t.v, 0, 0), p);
    CHECK_PAGE(&t, 0, 0, 9, "stale page");
    tp_close(&t);
}

static void test_zero_pages(void) {
    struct tp t;
    if (!tp_open(&t, 128 * KIB, 0, 4, 1, 64, true))
        return;
    CHECK(vmm_n_pages(t.v) == 4, "the zero page is not part of the pool: %u", vmm_n_pages(t.v));
    uint32_t r;
    CHECK(vmm_range_acquire(t.v, &r) == 0, "acquire");
    CHECK(vmm_range_grow(t.v, r, 64) == 0, "grow 4 pages");
    for (uint32_t i = 0; i < 4; i++)
        CHECK_PAGE(&t, r, i, 0, "fresh page");
    for (uint32_t i = 0; i < 4; i++)
        CHECK(tp_fill(&t, r, i, 0xAB + i) == 0, "fill %u", i);
    CHECK(vmm_range_shrink(t.v, r, 0) == 0 && vmm_range_grow(t.v, r, 64) == 0, "cycle");
    for (uint32_t i = 0; i < 4; i++)
        CHECK_PAGE(&t, r, i, 0, "reused page");
    CHECK(vmm_check(t.v), "zero pages");
    tp_close(&t);
}

/* Offload over the cuda backend's xfer (D2H/H2D on the copy stream): a
 * cached page spilled to host memory reads its bytes; a page restored from
 * them, sealed and shared into a range, reads the same bytes on the device. */
static void test_spill_and_restore(void) {
    struct tp t;
    if (!tp_open(&t, 128 * KIB, 0, 3, 2, 64, false))
        return;
    uint32_t a, b;
    CHECK(vmm_range_acquire(t.v, &a) == 0 && vmm_range_grow(t.v, a, 1) == 0, "grow a");
    uint32_t p = vmm_range_page(t.v, a, 0);
    CHECK(tp_fill(&t, a, 0, 9) == 0, "fill");
    CHECK(vmm_page_seal(t.v, p, 1, 2) == 0 && vmm_range_release(t.v, a) == 0, "seal, release");
    uint8_t *host = mem_alloc(MEM_TEST, t.P);
    CHECK(host != NULL, "host buffer");
    if (!host) {
        tp_close(&t);
        return;
    }
    CHECK(vmm_page_spill_begin(t.v, p) == 0, "spill begin");
    CHECK(vmm_page_read(t.v, p, host) == 0, "read (D2H)");
    size_t bad = t.P;
    for (size_t i = 0; i < t.P && bad == t.P; i++)
        if (host[i] != pat(i, 9))
            bad = i;
    CHECK(bad == t.P, "spilled byte %zu is %#x", bad, bad < t.P ? host[bad] : 0);
    CHECK(vmm_page_spill_end(t.v, p, true) == 0, "spill end");
    struct vmm_stats s;
    vmm_stats_get(t.v, &s);
    CHECK(s.pages_free == 3 && s.spills_total == 1, "free %" PRIu64 " spills %" PRIu64,
          s.pages_free, s.spills_total);
    uint32_t q;
    CHECK(vmm_page_restore(t.v, host, &q) == 0, "restore (H2D)");
    CHECK(vmm_page_seal(t.v, q, 1, 2) == 0, "seal the restored page");
    CHECK(vmm_range_acquire(t.v, &b) == 0 && vmm_range_share(t.v, b, q) == 0, "share it");
    CHECK_PAGE(&t, b, 0, 9, "restored page");
    CHECK(vmm_range_release(t.v, b) == 0 && vmm_page_evict(t.v, q) == 0, "release, evict");
    CHECK(vmm_check(t.v), "spill and restore");
    mem_free(host);
    tp_close(&t);
}

static void test_share_and_cow(void) {
    struct tp t;
    if (!tp_open(&t, 128 * KIB, 0, 4, 2, 64, false))
        return;
    uint32_t a, b;
    CHECK(vmm_range_acquire(t.v, &a) == 0 && vmm_range_acquire(t.v, &b) == 0, "acquire");
    CHECK(vmm_range_grow(t.v, a, 16) == 0, "grow a");
    uint32_t p = vmm_range_page(t.v, a, 0);
    CHECK(vmm_range_share(t.v, b, p) == 0 && vmm_range_page(t.v, b, 0) == p, "share");
    /* Written through a, read through b (and the reverse). */
    CHECK(tp_fill(&t, a, 0, 5) == 0, "fill through a");
    CHECK_PAGE(&t, b, 0, 5, "read through b");
    char msg[8] = "shared!", got[8] = "";
    CHECK(tp_put(&t, b, 0, 5 * t.S, msg, 8) == 0, "put through b");
    CHECK(tp_get(&t, a, 0, 5 * t.S, got, 8) == 0 && memcmp(got, msg, 8) == 0, "got \"%.8s\"", got);
    CHECK(tp_fill(&t, a, 0, 5) == 0, "refill");
    struct vmm_page_info pi;
    CHECK(vmm_page_info(t.v, p, &pi) == 0 && pi.refcount == 2 && pi.state == VMM_PAGE_MAPPED &&
              pi.last_use_ns != 0,
          "refcount %u state %d", pi.refcount, pi.state);
    uint32_t owners[4] = {0};
    CHECK(vmm_page_owners(t.v, p, owners, 4) == 2 && owners[0] == a && owners[1] == b, "owners");
    CHECK(vmm_check(t.v), "shared");

    /* Copy-on-write: b gets a private copy; the original stays intact. */
    CHECK(vmm_range_cow(t.v, b, 0) == 0, "cow");
    uint32_t q = vmm_range_page(t.v, b, 0);
    CHECK(q != p && q != VMM_PAGE_NONE, "b's page %u, a's %u", q, p);
    CHECK_PAGE(&t, b, 0, 5, "copied page");
    CHECK(tp_fill(&t, b, 0, 0x55) == 0, "write the copy");
    CHECK_PAGE(&t, a, 0, 5, "original after the copy was written");
    CHECK(vmm_page_info(t.v, p, &pi) == 0 && pi.refcount == 1, "refcount %u", pi.refcount);
    CHECK(vmm_range_cow(t.v, a, 0) == 0 && vmm_range_page(t.v, a, 0) == p, "private: no-op");
    struct vmm_stats s;
    vmm_stats_get(t.v, &s);
    CHECK(s.cow_total == 1, "cow_total %" PRIu64, s.cow_total);

    /* Release a: b keeps its own bytes; a's page is free. */
    CHECK(vmm_range_release(t.v, a) == 0, "release a");
    CHECK_PAGE(&t, b, 0, 0x55, "b after a's release");
    CHECK(vmm_page_info(t.v, p, &pi) == 0 && pi.state == VMM_PAGE_FREE, "state %d", pi.state);
    CHECK(vmm_check(t.v), "cow");
    tp_close(&t);
}

static void test_seal_evict(void) {
    struct tp t;
    if (!tp_open(&t, 128 * KIB, 0, 4, 2, 64, false))
        return;
    uint32_t a, b;
    CHECK(vmm_range_acquire(t.v, &a) == 0, "acquire");
    CHECK(vmm_range_grow(t.v, a, 16) == 0, "grow");
    uint32_t p = vmm_range_page(t.v, a, 0);
    CHECK(tp_fill(&t, a, 0, 42) == 0, "fill");
    CHECK(vmm_page_seal(t.v, p, 42, 7) == 0, "seal");
    CHECK(vmm_page_evict(t.v, p) == -EBUSY, "evict while mapped");
    CHECK(vmm_range_release(t.v, a) == 0, "release");
    struct vmm_page_info pi;
    vmm_page_info(t.v, p, &pi);
    CHECK(pi.state == VMM_PAGE_CACHED && pi.hash_slot == 42 && pi.tenant == 7,
          "state %d slot %u tenant %u", pi.state, pi.hash_slot, pi.tenant);
    struct vmm_stats s;
    vmm_stats_get(t.v, &s);
    CHECK(s.pages_cached == 1 && s.pages_free == 3, "cached %" PRIu64 " free %" PRIu64,
          s.pages_cached, s.pages_free);
    /* The cached page keeps its bytes while mapped nowhere. */
    CHECK(vmm_range_acquire(t.v, &b) == 0, "acquire b");
    CHECK(vmm_range_share(t.v, b, p) == 0, "share the cached page");
    CHECK_PAGE(&t, b, 0, 42, "cached page shared again");
    CHECK(vmm_range_cow(t.v, b, 0) == 0 && vmm_range_page(t.v, b, 0) != p,
          "sealed, refcount 1: still copied");
    CHECK_PAGE(&t, b, 0, 42, "copy of the sealed page");
    vmm_page_info(t.v, p, &pi);
    CHECK(pi.state == VMM_PAGE_CACHED, "back to the cache: %d", pi.state);
    CHECK(vmm_page_evict(t.v, p) == 0, "evict");
    vmm_page_info(t.v, p, &pi);
    CHECK(pi.state == VMM_PAGE_FREE && pi.hash_slot == VMM_PAGE_NONE, "state %d", pi.state);
    CHECK(vmm_page_evict(t.v, p) == -EINVAL, "evict a free page");
    CHECK(vmm_page_seal(t.v, p, 1, 1) == -EINVAL, "seal a free page");
    CHECK(vmm_check(t.v), "seal");
    tp_close(&t);
}

static void test_errors(void) {
    struct tp t;
    if (!tp_open(&t, 128 * KIB, 0, 3, 2, 16 * 8, false))
        return;
    uint32_t r, r2, r3;
    CHECK(vmm_range_grow(t.v, 0, 1) == -EINVAL, "grow of a free slot");
    CHECK(vmm_range_acquire(t.v, &r) == 0 && vmm_range_acquire(t.v, &r2) == 0, "acquire");
    CHECK(vmm_range_acquire(t.v, &r3) == -EBUSY, "no slot left");
    CHECK(vmm_range_grow(t.v, r, 16 * 8 + 1) == -ERANGE, "past max_tokens");
    CHECK(vmm_range_shrink(t.v, r, 16 * 8 + 1) == -ERANGE, "shrink past max_tokens");
    CHECK(vmm_range_grow(t.v, r, 16 * 4) == -ENOSPC, "4 pages of 3");
    CHECK(vmm_range_n_mapped(t.v, r) == 0, "all or nothing: %u", vmm_range_n_mapped(t.v, r));
    CHECK(vmm_range_grow(t.v, r, 16 * 3) == 0, "3 pages");
    CHECK(vmm_range_grow(t.v, r, 16 * 3 + 1) == -ENOSPC, "a fourth");
    CHECK(vmm_range_cow(t.v, r, 3) == -EINVAL, "cow past n_mapped");
    CHECK(vmm_range_share(t.v, r2, 99) == -EINVAL, "share a bad page");
    CHECK(vmm_range_map_ahead(t.v, r2, 1) == -ENOSPC, "map-ahead, pool dry");
    CHECK(vmm_range_share(t.v, r2, vmm_range_page(t.v, r, 0)) == 0, "share");
    CHECK(vmm_range_cow(t.v, r2, 0) == -ENOSPC, "cow, pool dry");
    CHECK(vmm_page_evict(t.v, vmm_range_page(t.v, r, 0)) == -EBUSY, "evict a mapped page");
    uint32_t gone = vmm_range_page(t.v, r, 1);
    CHECK(vmm_range_shrink(t.v, r, 16) == 0, "free 2 pages");
    CHECK(vmm_range_share(t.v, r2, gone) == -EINVAL, "share page %u that went free", gone);
    struct vmm_stats s;
    vmm_stats_get(t.v, &s);
    CHECK(s.pages_free == 2 && s.pages_mapped == 1 && s.backend_errors_total == 0,
          "free %" PRIu64 " mapped %" PRIu64, s.pages_free, s.pages_mapped);
    CHECK(vmm_check(t.v), "errors");
    tp_close(&t);

    /* A range full of shared pages refuses one more: -ERANGE. */
    if (!tp_open(&t, 128 * KIB, 0, 4, 2, 16, false))
        return;
    CHECK(vmm_range_acquire(t.v, &r) == 0 && vmm_range_acquire(t.v, &r2) == 0, "acquire");
    CHECK(vmm_range_grow(t.v, r, 1) == 0 && vmm_range_grow(t.v, r2, 1) == 0, "grow");
    CHECK(vmm_range_share(t.v, r2, vmm_range_page(t.v, r, 0)) == -ERANGE, "range full");
    CHECK(vmm_range_map_ahead(t.v, r, 3) == 0, "map-ahead on a full range maps 0");
    tp_close(&t);
}

static void test_map_ahead(void) {
    struct tp t;
    if (!tp_open(&t, 128 * KIB, 0, 6, 2, 16 * 4, false))
        return;
    uint32_t r, r2;
    CHECK(vmm_range_acquire(t.v, &r) == 0, "acquire");
    CHECK(vmm_range_map_ahead(t.v, r, 2) == 2, "2 ahead");
    CHECK(tp_fill(&t, r, 1, 3) == 0, "pages mapped ahead are writable");
    CHECK(vmm_range_grow(t.v, r, 25) == 0, "grow into them");
    struct vmm_stats s;
    vmm_stats_get(t.v, &s);
    CHECK(s.grow_waited_total == 0 && s.map_ahead_pages_total == 2,
          "waited %" PRIu64 " ahead %" PRIu64, s.grow_waited_total, s.map_ahead_pages_total);
    CHECK_PAGE(&t, r, 1, 3, "page mapped ahead");
    CHECK(vmm_range_map_ahead(t.v, r, 10) == 2, "range holds 4");
    CHECK(vmm_range_map_ahead(t.v, r, 10) == 0, "full");
    CHECK(vmm_range_acquire(t.v, &r2) == 0, "acquire r2");
    CHECK(vmm_range_map_ahead(t.v, r2, 5) == 2, "pool has 2 left");
    CHECK(vmm_range_map_ahead(t.v, r2, 1) == -ENOSPC, "dry");
    CHECK(vmm_range_map_ahead(t.v, 7, 1) == -EINVAL, "bad range");
    CHECK(vmm_check(t.v), "map-ahead");
    tp_close(&t);
}

/* ---- fault injection (tests/test_vmm_fault.c over cuda) ---- */

#define F_RANGES 3
#define F_MAX_P  8

struct snap {
    struct vmm_stats s;
    uint32_t n_mapped[F_RANGES];
    uint32_t page[F_RANGES][F_MAX_P];
};

static void snap_take(struct tp *t, struct snap *sn) {
    memset(sn, 0, sizeof(*sn));
    vmm_stats_get(t->v, &sn->s);
    for (uint32_t r = 0; r < F_RANGES; r++) {
        sn->n_mapped[r] = vmm_range_n_mapped(t->v, r);
        for (uint32_t i = 0; i < F_MAX_P; i++)
            sn->page[r][i] = vmm_range_page(t->v, r, i);
    }
}

/* Differences in the layout and the gauges, printing the first. */
static unsigned snap_diff(const struct snap *a, const struct snap *b, const char *what,
                          uint64_t nth) {
    unsigned n = 0;
    if (a->s.pages_free != b->s.pages_free || a->s.pages_mapped != b->s.pages_mapped ||
        a->s.pages_cached != b->s.pages_cached || a->s.ranges_in_use != b->s.ranges_in_use) {
        printf("%s nth %" PRIu64 ": free %" PRIu64 "/%" PRIu64 " mapped %" PRIu64 "/%" PRIu64
               " cached %" PRIu64 "/%" PRIu64 "\n",
               what, nth, a->s.pages_free, b->s.pages_free, a->s.pages_mapped, b->s.pages_mapped,
               a->s.pages_cached, b->s.pages_cached);
        n++;
    }
    for (uint32_t r = 0; r < F_RANGES; r++) {
        if (a->n_mapped[r] != b->n_mapped[r] && n++ == 0)
            printf("%s nth %" PRIu64 ": range %u n_mapped %u vs %u\n", what, nth, r, a->n_mapped[r],
                   b->n_mapped[r]);
        for (uint32_t i = 0; i < F_MAX_P; i++)
            if (a->page[r][i] != b->page[r][i] && n++ == 0)
                printf("%s nth %" PRIu64 ": range %u idx %u page %u vs %u\n", what, nth, r, i,
                       a->page[r][i], b->page[r][i]);
    }
    return n;
}

/* Tag every mapped page: its first 8 bytes hold page id + 1. */
static void tag_all(struct tp *t) {
    for (uint32_t r = 0; r < F_RANGES; r++)
        for (uint32_t i = 0; i < vmm_range_n_mapped(t->v, r); i++) {
            uint64_t w = vmm_range_page(t->v, r, i) + 1u;
            CHECK(tp_put(t, r, i, 0, &w, 8) == 0, "tag range %u idx %u", r, i);
        }
}

/* Pages whose tag is wrong (or cannot be read: unmapped behind vmm's back). */
static unsigned tags_bad(struct tp *t, const char *what, uint64_t nth) {
    unsigned bad = 0;
    for (uint32_t r = 0; r < F_RANGES; r++)
        for (uint32_t i = 0; i < vmm_range_n_mapped(t->v, r); i++) {
            uint64_t w = 0, want = vmm_range_page(t->v, r, i) + 1u;
            int rc = tp_get(t, r, i, 0, &w, 8);
            if ((rc || w != want) && bad++ == 0)
                printf("%s nth %" PRIu64 ": range %u idx %u: rc %d tag %" PRIu64 " want %" PRIu64
                       "\n",
                       what, nth, r, i, rc, w, want);
        }
    return bad;
}

typedef int (*f_op)(struct vmm *v);

/* Run op with the nth backend call failing, nth = 1, 2, ... until it
 * succeeds; each failure must change nothing (layout, gauges, vmm_check, the
 * bytes of every mapped page). Returns the number of calls the op makes + 1. */
static uint64_t fail_each_call(struct tp *t, f_op op, const char *what) {
    for (uint64_t nth = 1; nth < 64; nth++) {
        struct snap before, after;
        snap_take(t, &before);
        vmm_fault_inject(t->v, nth);
        int rc = op(t->v);
        vmm_fault_inject(t->v, 0);
        if (rc >= 0) {
            tag_all(t);
            CHECK(tags_bad(t, what, nth) == 0, "%s: tags after success", what);
            return nth;
        }
        snap_take(t, &after);
        CHECK(rc == -EIO, "%s nth %" PRIu64 ": rc %d want %d", what, nth, rc, -EIO);
        CHECK(snap_diff(&before, &after, what, nth) == 0, "%s nth %" PRIu64 ": layout changed",
              what, nth);
        CHECK(after.s.backend_errors_total == before.s.backend_errors_total + 1,
              "%s nth %" PRIu64 ": errors %" PRIu64, what, nth, after.s.backend_errors_total);
        CHECK(vmm_check(t->v), "%s nth %" PRIu64, what, nth);
        CHECK(tags_bad(t, what, nth) == 0, "%s nth %" PRIu64 ": bytes changed", what, nth);
    }
    CHECK(false, "%s never succeeded", what);
    return 0;
}

/* Range 0: 2 pages; range 1 shares range 0's page 0 and has 1 own page;
 * range 2 acquired, empty (tests/test_vmm_fault.c setup(), tpp 16). */
static bool f_setup(struct tp *t, bool zero_pages) {
    if (!tp_open(t, 128 * KIB, 0, 16, F_RANGES, 16 * F_MAX_P, zero_pages))
        return false;
    uint32_t r;
    for (int i = 0; i < F_RANGES; i++)
        CHECK(vmm_range_acquire(t->v, &r) == 0, "acquire");
    CHECK(vmm_range_grow(t->v, 0, 32) == 0, "grow 0");
    CHECK(vmm_range_share(t->v, 1, vmm_range_page(t->v, 0, 0)) == 0, "share");
    CHECK(vmm_range_grow(t->v, 1, 32) == 0, "grow 1");
    tag_all(t);
    return true;
}

static int op_grow(struct vmm *v) {
    return vmm_range_grow(v, 1, 16 * 6); /* 4 more pages */
}
static int op_grow_empty(struct vmm *v) {
    return vmm_range_grow(v, 2, 16 * 5);
}
static int op_share(struct vmm *v) {
    return vmm_range_share(v, 2, vmm_range_page(v, 0, 1));
}
static int op_cow(struct vmm *v) {
    return vmm_range_cow(v, 1, 0);
}
static int op_map_ahead(struct vmm *v) {
    return vmm_range_map_ahead(v, 0, 3);
}
static int op_shrink(struct vmm *v) {
    return vmm_range_shrink(v, 1, 1);
}
static int op_release(struct vmm *v) {
    return vmm_range_release(v, 0);
}

/* The fake driver's test hooks (tests/device/fake_libcuda.c), or NULL on a
 * real libcuda.so.1. */
static unsigned (*fake_calls)(const char *name);
static void (*fake_fail)(const char *name, unsigned nth);

static void fake_hooks_find(void) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD); /* the backend's */
    if (!lib)
        return;
    void *c = dlsym(lib, "fake_libcuda_calls"), *f = dlsym(lib, "fake_libcuda_fail");
    if (c && f) {
        memcpy(&fake_calls, &c, sizeof c);
        memcpy(&fake_fail, &f, sizeof f);
    }
    dlclose(lib); /* drops this reference only: the backend keeps its own */
}

/* DESIGN §3, "set access once per contiguous span": a grow of several pages
 * is one map_span, n cuMemMap and exactly one cuMemSetAccess; a single page
 * is one of each; the pages of a span are readable and writable (on a real
 * GPU too, which checks that one cuMemSetAccess covers separate mappings);
 * a cuMemMap or the cuMemSetAccess failing inside a span leaves nothing
 * mapped and the pool as it was. The counts and failures need the fake. */
static void test_map_span(void) {
    struct tp t;
    if (!tp_open(&t, 128 * KIB, 0, 12, 2, 16 * 8, false))
        return;
    uint32_t r;
    CHECK(vmm_range_acquire(t.v, &r) == 0, "acquire");
    unsigned m0 = fake_calls ? fake_calls("cuMemMap") : 0;
    unsigned a0 = fake_calls ? fake_calls("cuMemSetAccess") : 0;
    CHECK(vmm_range_grow(t.v, r, 16 * 4) == 0 && vmm_range_n_mapped(t.v, r) == 4, "grow 4 pages");
    if (fake_calls) {
        unsigned m = fake_calls("cuMemMap") - m0, a = fake_calls("cuMemSetAccess") - a0;
        CHECK(m == 4 && a == 1, "grow of 4 pages: %u cuMemMap want 4, %u cuMemSetAccess want 1", m,
              a);
    }
    for (uint32_t i = 0; i < 4; i++)
        CHECK(tp_fill(&t, r, i, 40 + i) == 0, "fill page %u of the span", i);
    for (uint32_t i = 0; i < 4; i++)
        CHECK_PAGE(&t, r, i, 40 + i, "span page");
    m0 = fake_calls ? fake_calls("cuMemMap") : 0;
    a0 = fake_calls ? fake_calls("cuMemSetAccess") : 0;
    CHECK(vmm_range_grow(t.v, r, 16 * 5) == 0, "grow 1 page");
    CHECK(vmm_range_map_ahead(t.v, r, 3) == 3, "map 3 ahead");
    struct vmm_stats s;
    vmm_stats_get(t.v, &s);
    CHECK(s.map_calls_total == 8, "map calls %" PRIu64 " want 8 pages", s.map_calls_total);
    if (fake_calls) {
        unsigned m = fake_calls("cuMemMap") - m0, a = fake_calls("cuMemSetAccess") - a0;
        CHECK(m == 4 && a == 2, "1 page then 3 ahead: %u cuMemMap want 4, %u cuMemSetAccess want 2",
              m, a);
        /* range 1: a span of 3 whose 2nd cuMemMap fails, then whose
         * cuMemSetAccess fails: nothing stays mapped, nothing changed */
        uint32_t r1;
        CHECK(vmm_range_acquire(t.v, &r1) == 0, "acquire 1");
        static const char *const what[] = {"cuMemMap", "cuMemSetAccess"};
        static const unsigned nth[] = {2, 1};
        for (int k = 0; k < 2; k++) {
            vmm_stats_get(t.v, &s);
            uint64_t errs = s.backend_errors_total, free0 = s.pages_free;
            fake_fail(what[k], nth[k]);
            int rc = vmm_range_grow(t.v, r1, 16 * 3);
            fake_fail(what[k], 0);
            CHECK(rc == (k == 0 ? -ENOMEM : -EIO), "%s failing: rc %d", what[k], rc);
            vmm_stats_get(t.v, &s);
            CHECK(vmm_range_n_mapped(t.v, r1) == 0 && s.pages_free == free0 &&
                      s.backend_errors_total == errs + 1,
                  "%s failing: n_mapped %u, free %" PRIu64 " was %" PRIu64 ", errors %" PRIu64,
                  what[k], vmm_range_n_mapped(t.v, r1), s.pages_free, free0,
                  s.backend_errors_total);
            CHECK(vmm_check(t.v), "%s failing", what[k]);
        }
        CHECK(vmm_range_grow(t.v, r1, 16 * 3) == 0 && vmm_range_n_mapped(t.v, r1) == 3,
              "the same span maps after the failures");
        CHECK(tp_fill(&t, r1, 2, 7) == 0, "fill");
        CHECK_PAGE(&t, r1, 2, 7, "span page after a failed span");
    }
    for (uint32_t i = 0; i < 4; i++)
        CHECK_PAGE(&t, r, i, 40 + i, "span page after the rest");
    CHECK(vmm_check(t.v), "map_span");
    printf("map_span: driver call counts and failures %s\n",
           fake_calls ? "checked (fake driver)" : "not visible (real driver): bytes only");
    tp_close(&t);
}

static void test_fault(void) {
    struct tp t;
    uint64_t n;
    if (f_setup(&t, false)) {
        /* the backend has map_span: one call maps the 4 pages */
        n = fail_each_call(&t, op_grow, "grow");
        CHECK(n == 2, "grow: %" PRIu64 " want 1 map_span + 1", n);
        CHECK(vmm_range_n_mapped(t.v, 1) == 6, "n_mapped %u", vmm_range_n_mapped(t.v, 1));
        n = fail_each_call(&t, op_grow_empty, "grow empty");
        CHECK(n == 2, "grow empty: %" PRIu64 " want 1 map_span + 1", n);
        tp_close(&t);
    }
    if (f_setup(&t, true)) {
        n = fail_each_call(&t, op_grow, "grow zero");
        CHECK(n == 6, "grow zero: %" PRIu64 " want 4 zero copies + 1 map_span + 1", n);
        for (uint32_t i = 2; i < 6; i++) {
            uint8_t tail[64], zero[64] = {0};
            CHECK(tp_get(&t, 1, i, t.P - 64, tail, 64) == 0 && !memcmp(tail, zero, 64),
                  "zeroed page idx %u", i);
        }
        tp_close(&t);
    }
    if (f_setup(&t, false)) {
        n = fail_each_call(&t, op_share, "share");
        CHECK(n == 2, "share: %" PRIu64, n);
        struct vmm_page_info pi;
        vmm_page_info(t.v, vmm_range_page(t.v, 0, 1), &pi);
        CHECK(pi.refcount == 2, "refcount %u", pi.refcount);
        tp_close(&t);
    }
    if (f_setup(&t, false)) {
        uint32_t shared = vmm_range_page(t.v, 1, 0);
        char orig[9] = "original", chg[8] = "changed", got[9] = "";
        CHECK(tp_put(&t, 0, 0, t.S, orig, 9) == 0, "put");
        n = fail_each_call(&t, op_cow, "cow");
        CHECK(n == 4, "cow: %" PRIu64 " want copy, unmap, map + 1", n);
        CHECK(vmm_range_page(t.v, 1, 0) != shared, "cow gave a new page");
        CHECK(tp_get(&t, 1, 0, t.S, got, 9) == 0 && !strcmp(got, orig), "copied \"%s\"", got);
        CHECK(tp_put(&t, 1, 0, t.S, chg, 8) == 0, "write the copy");
        CHECK(tp_get(&t, 0, 0, t.S, got, 9) == 0 && !strcmp(got, orig), "original \"%s\"", got);
        CHECK(vmm_check(t.v), "cow");
        tp_close(&t);
    }
    if (f_setup(&t, false)) {
        n = fail_each_call(&t, op_map_ahead, "map_ahead");
        CHECK(n == 2, "map_ahead: %" PRIu64 " want 1 map_span + 1", n);
        CHECK(vmm_range_n_mapped(t.v, 0) == 5, "n_mapped %u", vmm_range_n_mapped(t.v, 0));
        n = fail_each_call(&t, op_shrink, "shrink");
        CHECK(n == 2, "shrink: %" PRIu64, n);
        n = fail_each_call(&t, op_release, "release");
        CHECK(n == 2, "release: %" PRIu64, n);
        struct vmm_stats s;
        vmm_stats_get(t.v, &s);
        CHECK(s.ranges_in_use == 2, "ranges %" PRIu64, s.ranges_in_use);
        CHECK(vmm_check(t.v), "shrink/release");
        tp_close(&t);
    }
}

/* ---- randomized stress against a reference model ---- */

#define S_STEPS  20000
#define S_RANGES 16
#define S_MAX_P  8
#define S_PAGES  48
#define S_TPP    16

struct model {
    bool in_use[S_RANGES];
    uint32_t n[S_RANGES];
    uint32_t pg[S_RANGES][S_MAX_P];
    uint32_t ref[S_PAGES];
    bool sealed[S_PAGES];
    uint64_t tag[S_PAGES];
    uint64_t next_tag;
    unsigned bad; /* mismatches; the run stops at the first */
};

static uint64_t rng_state = 0x9E3779B97F4A7C15u;

static uint32_t rnd(uint32_t n) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state % n);
}

#define EXPECT(m, cond, ...)                                                                       \
    do {                                                                                           \
        if (!(cond) && (m)->bad++ == 0) {                                                          \
            printf("stress: %s: ", #cond);                                                         \
            printf(__VA_ARGS__);                                                                   \
            printf("\n");                                                                          \
        }                                                                                          \
    } while (0)

static bool model_is_free(const struct model *m, uint32_t p) {
    return m->ref[p] == 0 && !m->sealed[p];
}

static uint32_t model_free(const struct model *m) {
    uint32_t n = 0;
    for (uint32_t p = 0; p < S_PAGES; p++)
        n += model_is_free(m, p);
    return n;
}

/* Page p, newly owned by range r at idx: it was free; give it a tag. */
static void model_take(struct model *m, struct tp *t, uint32_t r, uint32_t idx, uint32_t p,
                       uint64_t step) {
    EXPECT(m, p < S_PAGES && model_is_free(m, p), "step %" PRIu64 ": page %u is not free", step, p);
    if (p >= S_PAGES)
        return;
    m->ref[p] = 1;
    m->pg[r][idx] = p;
    m->tag[p] = ++m->next_tag;
    EXPECT(m, tp_put(t, r, idx, 0, &m->tag[p], 8) == 0, "step %" PRIu64 ": tag write", step);
}

static void model_compare(struct model *m, struct tp *t, uint64_t step, bool bytes) {
    EXPECT(m, vmm_check(t->v), "step %" PRIu64, step);
    struct vmm_stats s;
    vmm_stats_get(t->v, &s);
    EXPECT(m, s.pages_free == model_free(m), "step %" PRIu64 ": free %" PRIu64 " model %u", step,
           s.pages_free, model_free(m));
    for (uint32_t r = 0; r < S_RANGES; r++) {
        EXPECT(m, vmm_range_n_mapped(t->v, r) == m->n[r], "step %" PRIu64 " range %u: %u vs %u",
               step, r, vmm_range_n_mapped(t->v, r), m->n[r]);
        for (uint32_t i = 0; i < m->n[r]; i++) {
            EXPECT(m, vmm_range_page(t->v, r, i) == m->pg[r][i], "step %" PRIu64 " range %u idx %u",
                   step, r, i);
            uint64_t w = 0;
            if (bytes)
                EXPECT(m, tp_get(t, r, i, 0, &w, 8) == 0 && w == m->tag[m->pg[r][i]],
                       "step %" PRIu64 " range %u idx %u page %u: tag %" PRIu64 " want %" PRIu64,
                       step, r, i, m->pg[r][i], w, m->tag[m->pg[r][i]]);
        }
    }
    for (uint32_t p = 0; p < S_PAGES; p++) {
        struct vmm_page_info pi;
        vmm_page_info(t->v, p, &pi);
        EXPECT(m, pi.refcount == m->ref[p], "step %" PRIu64 " page %u: refcount %u vs %u", step, p,
               pi.refcount, m->ref[p]);
    }
}

static void step_grow(struct model *m, struct tp *t, uint32_t r, uint64_t step) {
    uint32_t n_tokens = rnd(S_MAX_P * S_TPP + 4);
    uint32_t need = (n_tokens + S_TPP - 1) / S_TPP;
    int want = !m->in_use[r]                    ? -EINVAL
               : n_tokens > S_MAX_P * S_TPP     ? -ERANGE
               : need <= m->n[r]                ? 0
               : need - m->n[r] > model_free(m) ? -ENOSPC
                                                : 0;
    int rc = vmm_range_grow(t->v, r, n_tokens);
    EXPECT(m, rc == want, "step %" PRIu64 " grow r %u to %u: rc %d want %d", step, r, n_tokens, rc,
           want);
    if (rc == 0)
        for (; m->n[r] < need; m->n[r]++)
            model_take(m, t, r, m->n[r], vmm_range_page(t->v, r, m->n[r]), step);
}

static void step_shrink(struct model *m, struct tp *t, uint32_t r, uint64_t step) {
    uint32_t n_tokens = rnd(S_MAX_P * S_TPP + 1);
    uint32_t keep = (n_tokens + S_TPP - 1) / S_TPP;
    int rc = vmm_range_shrink(t->v, r, n_tokens);
    EXPECT(m, rc == (m->in_use[r] ? 0 : -EINVAL), "step %" PRIu64 " shrink: rc %d", step, rc);
    if (rc == 0)
        for (; m->n[r] > keep; m->n[r]--)
            m->ref[m->pg[r][m->n[r] - 1]]--;
}

static void step_share(struct model *m, struct tp *t, uint32_t r, uint64_t step) {
    uint32_t p = rnd(S_PAGES), o = rnd(S_RANGES);
    if (rnd(4) && m->n[o])
        p = m->pg[o][rnd(m->n[o])]; /* mostly a page that is mapped */
    int want = !m->in_use[r] || model_is_free(m, p) ? -EINVAL : m->n[r] == S_MAX_P ? -ERANGE : 0;
    int rc = vmm_range_share(t->v, r, p);
    EXPECT(m, rc == want, "step %" PRIu64 " share %u into r %u: rc %d want %d", step, p, r, rc,
           want);
    if (rc == 0) {
        m->pg[r][m->n[r]++] = p;
        m->ref[p]++;
    }
}

static void step_cow(struct model *m, struct tp *t, uint32_t r, uint64_t step) {
    uint32_t idx = rnd(S_MAX_P);
    if (!m->in_use[r] || idx >= m->n[r]) {
        EXPECT(m, vmm_range_cow(t->v, r, idx) == -EINVAL, "step %" PRIu64 " cow", step);
        return;
    }
    uint32_t p = m->pg[r][idx];
    bool priv = m->ref[p] == 1 && !m->sealed[p];
    int want = priv ? 0 : model_free(m) == 0 ? -ENOSPC : 0;
    int rc = vmm_range_cow(t->v, r, idx);
    EXPECT(m, rc == want, "step %" PRIu64 " cow r %u idx %u: rc %d want %d", step, r, idx, rc,
           want);
    if (rc || priv)
        return;
    uint32_t q = vmm_range_page(t->v, r, idx);
    uint64_t w = 0;
    EXPECT(m, tp_get(t, r, idx, 0, &w, 8) == 0 && w == m->tag[p],
           "step %" PRIu64 " cow copied tag %" PRIu64 " want %" PRIu64, step, w, m->tag[p]);
    m->ref[p]--;
    model_take(m, t, r, idx, q, step);
}

static void step_evict(struct model *m, struct tp *t, uint64_t step) {
    uint32_t p = rnd(S_PAGES);
    for (uint32_t k = 0; k < S_PAGES && rnd(2); k++) /* prefer a cached page */
        if (m->ref[(p + k) % S_PAGES] == 0 && m->sealed[(p + k) % S_PAGES]) {
            p = (p + k) % S_PAGES;
            break;
        }
    int want = m->ref[p] ? -EBUSY : m->sealed[p] ? 0 : -EINVAL;
    int rc = vmm_page_evict(t->v, p);
    EXPECT(m, rc == want, "step %" PRIu64 " evict %u: rc %d want %d", step, p, rc, want);
    if (rc == 0)
        m->sealed[p] = false;
}

static void step_one(struct model *m, struct tp *t, uint64_t step) {
    uint32_t r = rnd(S_RANGES), op = rnd(100);
    if (op < 8) {
        uint32_t got = 0;
        bool any = false;
        for (uint32_t k = 0; k < S_RANGES; k++)
            any |= !m->in_use[k];
        int rc = vmm_range_acquire(t->v, &got);
        EXPECT(m, rc == (any ? 0 : -EBUSY), "step %" PRIu64 " acquire: rc %d", step, rc);
        if (rc == 0 && got < S_RANGES) {
            EXPECT(m, !m->in_use[got] && m->n[got] == 0, "step %" PRIu64 " acquired %u", step, got);
            m->in_use[got] = true;
        }
    } else if (op < 14) {
        int rc = vmm_range_release(t->v, r);
        EXPECT(m, rc == (m->in_use[r] ? 0 : -EINVAL), "step %" PRIu64 " release: rc %d", step, rc);
        if (rc == 0) {
            for (; m->n[r]; m->n[r]--)
                m->ref[m->pg[r][m->n[r] - 1]]--;
            m->in_use[r] = false;
        }
    } else if (op < 44) {
        step_grow(m, t, r, step);
    } else if (op < 62) {
        step_shrink(m, t, r, step);
    } else if (op < 76) {
        step_share(m, t, r, step);
    } else if (op < 86) {
        step_cow(m, t, r, step);
    } else if (op < 89) {
        uint32_t p = rnd(S_PAGES);
        int rc = vmm_page_seal(t->v, p, p, 1);
        EXPECT(m, rc == (model_is_free(m, p) ? -EINVAL : 0), "step %" PRIu64 " seal: rc %d", step,
               rc);
        if (rc == 0)
            m->sealed[p] = true;
    } else if (op < 94) {
        step_evict(m, t, step);
    } else {
        uint32_t k = rnd(4), room = m->in_use[r] ? S_MAX_P - m->n[r] : 0;
        uint32_t n = k < room ? k : room, nf = model_free(m);
        int want = !m->in_use[r] ? -EINVAL : n && !nf ? -ENOSPC : (int)(n < nf ? n : nf);
        int rc = vmm_range_map_ahead(t->v, r, k);
        EXPECT(m, rc == want, "step %" PRIu64 " map_ahead %u: rc %d want %d", step, k, rc, want);
        for (int i = 0; i < rc; i++, m->n[r]++)
            model_take(m, t, r, m->n[r], vmm_range_page(t->v, r, m->n[r]), step);
    }
}

static void test_stress(void) {
    static struct model m;
    struct tp t;
    if (!tp_open(&t, 128 * KIB, 0, S_PAGES, S_RANGES, S_MAX_P * S_TPP, false))
        return;
    CHECK(vmm_tokens_per_page(t.v) == S_TPP, "tpp %u", vmm_tokens_per_page(t.v));
    uint64_t t0 = now_ns(), step;
    for (step = 1; step <= S_STEPS && m.bad == 0; step++) {
        step_one(&m, &t, step);
        if (step % 64 == 0)
            model_compare(&m, &t, step, step % 256 == 0);
    }
    model_compare(&m, &t, step, true);
    CHECK(m.bad == 0, "%u mismatches against the model by step %" PRIu64, m.bad, step - 1);
    struct vmm_stats s;
    vmm_stats_get(t.v, &s);
    printf("stress: %" PRIu64 " steps in %.2f s: %" PRIu64 " maps, %" PRIu64 " unmaps, %" PRIu64
           " cows, %" PRIu64 " map-ahead pages\n",
           step - 1, (double)(now_ns() - t0) / 1e9, s.map_calls_total, s.unmap_calls_total,
           s.cow_total, s.map_ahead_pages_total);
    CHECK(s.cow_total > 100 && s.map_ahead_pages_total > 100, "cows %" PRIu64 " ahead %" PRIu64,
          s.cow_total, s.map_ahead_pages_total);
    CHECK(s.backend_errors_total == 0, "backend errors %" PRIu64, s.backend_errors_total);
    for (uint32_t r = 0; r < S_RANGES; r++)
        if (m.in_use[r])
            CHECK(vmm_range_release(t.v, r) == 0, "release %u", r);
    for (uint32_t p = 0; p < S_PAGES; p++)
        if (m.sealed[p])
            CHECK(vmm_page_evict(t.v, p) == 0, "evict %u", p);
    vmm_stats_get(t.v, &s);
    CHECK(s.pages_free == S_PAGES && s.ranges_in_use == 0, "free %" PRIu64 " in use %" PRIu64,
          s.pages_free, s.ranges_in_use);
    CHECK(vmm_check(t.v), "after stress");
    tp_close(&t);
}

/* ---- a map-ahead thread next to the scheduler (tests/test_vmm_thread.c) ---- */

#define T_RANGES 8
#define T_MAX_P  8
#define T_TPP    16
#define T_OPS    2000

struct tctx {
    struct tp *t;
    pthread_mutex_t io_lock; /* serializes the backend outside the pool lock */
    atomic_bool stop;
    atomic_int bad, bad_bytes, bad_check;
    atomic_long ahead_pages;
};

static uint32_t lcg(uint32_t *s, uint32_t n) {
    *s = *s * 1664525u + 1013904223u;
    return (*s >> 8) % n;
}

/* Map ahead on every range, and grow/shrink ranges 4..7. Ranges 0..3 are
 * the scheduler's: it releases and re-acquires them outside io_lock, so map
 * ahead may find one free (-EINVAL) in between; 4..7 are never released. */
static void *ahead_main(void *arg) {
    struct tctx *c = arg;
    uint32_t s = 7;
    for (int i = 0; i < T_OPS; i++) {
        uint32_t r = lcg(&s, T_RANGES), k = 1 + lcg(&s, 2);
        pthread_mutex_lock(&c->io_lock);
        int rc = vmm_range_map_ahead(c->t->v, r, k);
        if (rc > 0)
            c->ahead_pages += rc;
        else if (rc != 0 && rc != -ENOSPC && !(rc == -EINVAL && r < 4))
            c->bad++;
        if (r >= 4 && lcg(&s, 2) == 0 && vmm_range_shrink(c->t->v, r, lcg(&s, 2 * T_TPP)) != 0)
            c->bad++;
        pthread_mutex_unlock(&c->io_lock);
    }
    return NULL;
}

static void *observer_main(void *arg) {
    struct tctx *c = arg;
    char buf[2048];
    while (!c->stop) {
        if (!vmm_check(c->t->v))
            c->bad_check++;
        if (vmm_stats_format(c->t->v, buf, sizeof buf) ||
            vmm_pool_map_format(c->t->v, buf, sizeof buf))
            c->bad++;
    }
    return NULL;
}

static void io_put(struct tctx *c, uint32_t r, uint32_t k, uint64_t w) {
    pthread_mutex_lock(&c->io_lock);
    if (tp_put(c->t, r, k, 0, &w, 8))
        c->bad_bytes++;
    pthread_mutex_unlock(&c->io_lock);
}

static uint64_t io_get(struct tctx *c, uint32_t r, uint32_t k) {
    uint64_t w = 0;
    pthread_mutex_lock(&c->io_lock);
    if (tp_get(c->t, r, k, 0, &w, 8))
        c->bad_bytes++;
    pthread_mutex_unlock(&c->io_lock);
    return w;
}

/* The scheduler: ranges 0..3; grow (tagging new pages), shrink, share and
 * cow, release and re-acquire, checking the tags of its pages after each op. */
static void scheduler(struct tctx *c) {
    struct vmm *v = c->t->v;
    uint64_t tags[T_RANGES][T_MAX_P] = {{0}};
    uint32_t tokens[T_RANGES] = {0}, s = 12345;
    for (int i = 0; i < T_OPS; i++) {
        uint32_t r = lcg(&s, 4), op = lcg(&s, 10);
        if (op < 5) {
            uint32_t n = lcg(&s, T_MAX_P * T_TPP + 1), need = (n + T_TPP - 1) / T_TPP;
            int rc = vmm_range_grow(v, r, n);
            if (rc == 0) {
                for (uint32_t k = (tokens[r] + T_TPP - 1) / T_TPP; k < need; k++) {
                    tags[r][k] = ((uint64_t)i << 8) | (r << 4) | k;
                    io_put(c, r, k, tags[r][k]);
                }
                if (n > tokens[r])
                    tokens[r] = n;
            } else if (rc != -ENOSPC) {
                c->bad++;
            }
        } else if (op < 7) {
            uint32_t n = lcg(&s, tokens[r] + 1);
            if (vmm_range_shrink(v, r, n) != 0)
                c->bad++;
            tokens[r] = n;
        } else if (op < 8 && tokens[r] == 0) {
            /* Share another range's page 0 as page 0, then make it
             * private. Under io_lock, so the map-ahead thread cannot slip a
             * page in between the shrink and the share. */
            uint32_t o = lcg(&s, 4), p = vmm_range_page(v, o, 0);
            pthread_mutex_lock(&c->io_lock);
            if (o != r && p != VMM_PAGE_NONE && tokens[o] && vmm_range_shrink(v, r, 0) == 0 &&
                vmm_range_share(v, r, p) == 0) {
                int rc = vmm_range_cow(v, r, 0);
                uint64_t w = 0;
                if (rc == 0) {
                    if (tp_get(c->t, r, 0, 0, &w, 8) || w != tags[o][0])
                        c->bad_bytes++;
                    tags[r][0] = tags[o][0] + 1;
                    if (tp_put(c->t, r, 0, 0, &tags[r][0], 8))
                        c->bad_bytes++;
                    tokens[r] = 1;
                } else if (rc == -ENOSPC) {
                    vmm_range_shrink(v, r, 0);
                } else {
                    c->bad++;
                }
            }
            pthread_mutex_unlock(&c->io_lock);
        } else if (op < 9) {
            uint32_t got = 0;
            if (vmm_range_release(v, r) != 0 || vmm_range_acquire(v, &got) != 0 || got != r)
                c->bad++;
            tokens[r] = 0;
        }
        for (uint32_t k = 0; k < (tokens[r] + T_TPP - 1) / T_TPP; k++)
            if (io_get(c, r, k) != tags[r][k])
                c->bad_bytes++;
    }
}

static void test_thread(void) {
    struct tp t;
    if (!tp_open(&t, 128 * KIB, 0, 40, T_RANGES, T_MAX_P * T_TPP, false))
        return;
    struct tctx c = {.t = &t};
    pthread_mutex_init(&c.io_lock, NULL);
    uint32_t r;
    for (int i = 0; i < T_RANGES; i++)
        CHECK(vmm_range_acquire(t.v, &r) == 0, "acquire");
    pthread_t ahead, obs;
    int e1 = pthread_create(&ahead, NULL, ahead_main, &c);
    int e2 = pthread_create(&obs, NULL, observer_main, &c);
    CHECK(e1 == 0 && e2 == 0, "pthread_create %d %d", e1, e2);
    if (e1 == 0 && e2 == 0) {
        scheduler(&c);
        pthread_join(ahead, NULL);
        c.stop = true;
        pthread_join(obs, NULL);
    }
    CHECK(c.bad == 0, "unexpected return codes: %d", (int)c.bad);
    CHECK(c.bad_bytes == 0, "pages that lost their bytes: %d", (int)c.bad_bytes);
    CHECK(c.bad_check == 0, "vmm_check failures: %d", (int)c.bad_check);
    CHECK(vmm_check(t.v), "after threads");
    struct vmm_stats s;
    vmm_stats_get(t.v, &s);
    CHECK(s.map_ahead_pages_total == (uint64_t)c.ahead_pages && s.map_ahead_pages_total > 0,
          "map-ahead pages %" PRIu64 " vs %ld", s.map_ahead_pages_total, (long)c.ahead_pages);
    CHECK(s.backend_errors_total == 0, "backend errors %" PRIu64, s.backend_errors_total);
    printf("threads: %" PRIu64 " pages mapped ahead by the second thread, %" PRIu64
           " grows waited, %" PRIu64 " cows\n",
           s.map_ahead_pages_total, s.grow_waited_total, s.cow_total);
    pthread_mutex_destroy(&c.io_lock);
    tp_close(&t);
}

/* ---- latency of one page through vmm ---- */

#define L_N 500 /* grow/shrink pairs timed; tens of us each on a GPU */

static void print_lat(const char *what, uint64_t *ns, size_t n) {
    qsort(ns, n, sizeof(*ns), cmp_u64);
    printf("vmm over cuda: %s median %.1f us, p99 %.1f us (n=%zu)\n", what, (double)ns[n / 2] / 1e3,
           (double)ns[(n * 99) / 100] / 1e3, n);
}

static void time_one(bool zero_pages) {
    struct tp t;
    if (!tp_open(&t, 128 * KIB, 0, 4, 1, 64, zero_pages))
        return;
    uint32_t r;
    CHECK(vmm_range_acquire(t.v, &r) == 0, "acquire");
    uint64_t *tg = mem_calloc(MEM_TEST, L_N, sizeof(uint64_t));
    uint64_t *ts = mem_calloc(MEM_TEST, L_N, sizeof(uint64_t));
    unsigned bad = 0;
    for (unsigned i = 0; tg && ts && i < L_N; i++) {
        uint64_t a = now_ns();
        bad += vmm_range_grow(t.v, r, 1) != 0;
        uint64_t b = now_ns();
        bad += vmm_range_shrink(t.v, r, 0) != 0;
        tg[i] = b - a;
        ts[i] = now_ns() - b;
    }
    CHECK(tg && ts && bad == 0, "%u of %u timed grow/shrink failed", bad, L_N);
    if (tg && ts && bad == 0) {
        print_lat(zero_pages ? "grow 1 page (zero_pages: copy + map + access)"
                             : "grow 1 page (map + access)",
                  tg, L_N);
        print_lat("shrink 1 page (unmap)", ts, L_N);
    }
    mem_free(tg);
    mem_free(ts);
    tp_close(&t);
}

int main(void) {
    /* Probe, and keep the primary context retained for the whole run. */
    struct vmm_backend *keep = NULL;
    int rc = vmm_cuda_backend_create(0, &keep);
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
    uint64_t held = mem_bytes(MEM_VMM); /* keep's own */
    struct {
        const char *name;
        void (*fn)(void);
    } tests[] = {
        {"geometry", test_geometry},     {"grow_shrink_release", test_grow_shrink_release},
        {"zero_pages", test_zero_pages}, {"share_and_cow", test_share_and_cow},
        {"seal_evict", test_seal_evict}, {"spill_and_restore", test_spill_and_restore},
        {"errors", test_errors},         {"map_ahead", test_map_ahead},
        {"fault", test_fault},           {"stress", test_stress},
        {"thread", test_thread},         {"map_span", test_map_span},
    };
    fake_hooks_find();
    for (size_t i = 0; i < sizeof(tests) / sizeof(tests[0]); i++) {
        unsigned f0 = n_fail;
        uint64_t t0 = now_ns();
        tests[i].fn();
        printf("%s %s (%.2f s)\n", n_fail == f0 ? "ok  " : "FAIL", tests[i].name,
               (double)(now_ns() - t0) / 1e9);
        CHECK(mem_bytes(MEM_VMM) == held, "%s left %" PRIu64 " vmm bytes", tests[i].name,
              mem_bytes(MEM_VMM) - held);
    }
    time_one(false);
    time_one(true);

    keep->ops->destroy(keep);
    CHECK(mem_bytes(MEM_VMM) == 0, "vmm still holds %" PRIu64 " bytes", mem_bytes(MEM_VMM));
    CHECK(mem_bytes(MEM_TEST) == 0, "test still holds %" PRIu64 " bytes", mem_bytes(MEM_TEST));
    printf("%u passed, %u failed, 0 skipped\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
