/* mem.c - the allocation funnel (see include/mem.h).
 *
 * Each block carries a 64-byte header {size, tag} in front of the payload so
 * that mem_free() needs no size and every payload stays 64-byte aligned. The
 * header costs 64 B per block: llmd allocates few, large blocks (weights are
 * mmapped, KV lives in vmm pages), so the overhead is immaterial.
 */
#include "mem.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define MEM_HDR  64
#define MEM_HUGE ((size_t)2 << 20) /* x86-64's transparent huge page */

/* A huge block's slack past its bytes, poisoned under ASan as a heap
 * block's redzone is (the kernels' overreads then fail the ASan run). */
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define MEM_POISON(p, n)   ASAN_POISON_MEMORY_REGION((p), (n))
#define MEM_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define MEM_POISON(p, n)   ((void)(p), (void)(n))
#define MEM_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

struct mem_hdr {
    size_t bytes;
    enum mem_tag tag;
    size_t mapped; /* mem_alloc_huge: the mapping's bytes (the header at its start); else 0 */
};
_Static_assert(sizeof(struct mem_hdr) <= MEM_HDR, "header fits");

static _Atomic uint64_t mem_held[MEM_N_TAGS];
static _Atomic uint64_t mem_n_calls;
static _Atomic uint64_t mem_fail_at; /* absolute call number that fails; 0 = off */

static const char *const mem_names[MEM_N_TAGS] = {
    "misc", "vmm",   "ofl", "gguf", "tok", "model", "kern",
    "smp",  "sched", "cli", "test", "pfx", "http",  "kvev",
};

static int mem_should_fail(void) {
    uint64_t n = atomic_fetch_add(&mem_n_calls, 1) + 1;
    uint64_t at = atomic_load(&mem_fail_at);
    return at != 0 && n == at;
}

/* Write the header at raw, count the block, return its payload. */
static void *mem_hdr_set(unsigned char *raw, enum mem_tag tag, size_t bytes, size_t mapped) {
    struct mem_hdr *h = (struct mem_hdr *)raw;
    h->bytes = bytes;
    h->tag = tag;
    h->mapped = mapped;
    atomic_fetch_add(&mem_held[tag], bytes);
    return raw + MEM_HDR;
}

void *mem_alloc(enum mem_tag tag, size_t bytes) {
    if (mem_should_fail() || bytes > SIZE_MAX - MEM_HDR)
        return NULL;
    size_t total = (bytes + MEM_HDR + 63) & ~(size_t)63;
    unsigned char *raw = aligned_alloc(64, total);
    if (!raw)
        return NULL;
    return mem_hdr_set(raw, tag, bytes, 0);
}

void *mem_alloc_huge(enum mem_tag tag, size_t bytes) {
    if (bytes + MEM_HDR <= MEM_HUGE / 2)
        return mem_alloc(tag, bytes);
    if (mem_should_fail() || bytes > SIZE_MAX / 2 - MEM_HDR - 2 * MEM_HUGE)
        return NULL;
    /* at least 64 bytes of slack: the redzone ASan watches */
    const size_t want = (bytes + 2 * MEM_HDR + MEM_HUGE - 1) & ~(MEM_HUGE - 1);
    /* map a huge page more and trim both ends to a 2 MiB-aligned range */
    unsigned char *raw =
        mmap(NULL, want + MEM_HUGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED)
        return NULL;
    unsigned char *at =
        (unsigned char *)(((uintptr_t)raw + MEM_HUGE - 1) & ~(uintptr_t)(MEM_HUGE - 1));
    if (at > raw)
        munmap(raw, (size_t)(at - raw));
    if (raw + want + MEM_HUGE > at + want)
        munmap(at + want, (size_t)(raw + want + MEM_HUGE - (at + want)));
    (void)madvise(at, want, MADV_HUGEPAGE); /* advice: 4 KiB pages if refused */
    MEM_POISON(at + MEM_HDR + bytes, want - MEM_HDR - bytes);
    return mem_hdr_set(at, tag, bytes, want);
}

void *mem_calloc(enum mem_tag tag, size_t n, size_t size) {
    if (size != 0 && n > SIZE_MAX / size)
        return NULL;
    void *p = mem_alloc(tag, n * size);
    if (p)
        memset(p, 0, n * size);
    return p;
}

void *mem_realloc(void *p, size_t bytes) {
    if (!p)
        return mem_alloc(MEM_MISC, bytes);
    struct mem_hdr *h = (struct mem_hdr *)((unsigned char *)p - MEM_HDR);
    void *q = mem_alloc(h->tag, bytes);
    if (!q)
        return NULL;
    memcpy(q, p, h->bytes < bytes ? h->bytes : bytes);
    mem_free(p);
    return q;
}

void mem_free(void *p) {
    if (!p)
        return;
    struct mem_hdr *h = (struct mem_hdr *)((unsigned char *)p - MEM_HDR);
    atomic_fetch_sub(&mem_held[h->tag], h->bytes);
    if (h->mapped) {
        MEM_UNPOISON(h, h->mapped); /* a later mapping may reuse the range */
        munmap(h, h->mapped);
    } else
        free(h);
}

char *mem_strndup(enum mem_tag tag, const char *s, size_t n) {
    size_t len = strnlen(s, n);
    char *d = mem_alloc(tag, len + 1);
    if (!d)
        return NULL;
    memcpy(d, s, len);
    d[len] = '\0';
    return d;
}

char *mem_strdup(enum mem_tag tag, const char *s) {
    return mem_strndup(tag, s, SIZE_MAX);
}

uint64_t mem_bytes(enum mem_tag tag) {
    return atomic_load(&mem_held[tag]);
}

const char *mem_tag_name(enum mem_tag tag) {
    return (unsigned)tag < MEM_N_TAGS ? mem_names[tag] : "?";
}

void mem_fail_nth(uint64_t n) {
    atomic_store(&mem_fail_at, n ? atomic_load(&mem_n_calls) + n : 0);
}

uint64_t mem_calls(void) {
    return atomic_load(&mem_n_calls);
}
