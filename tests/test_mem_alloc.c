/* Tests of the allocation funnel: accounting and the N-th failure hook. */
#include <criterion/criterion.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif

#include "mem.h"

Test(mem, counts_bytes_per_tag) {
    uint64_t before = mem_bytes(MEM_TEST);
    char *p = mem_alloc(MEM_TEST, 1000);
    cr_assert_not_null(p);
    cr_assert_eq((uintptr_t)p % 64, 0, "payload %p not 64-byte aligned", (void *)p);
    cr_assert_eq(mem_bytes(MEM_TEST), before + 1000, "held %lu want %lu",
                 (unsigned long)mem_bytes(MEM_TEST), (unsigned long)(before + 1000));
    p = mem_realloc(p, 3000);
    cr_assert_not_null(p);
    cr_assert_eq(mem_bytes(MEM_TEST), before + 3000);
    mem_free(p);
    cr_assert_eq(mem_bytes(MEM_TEST), before);
}

Test(mem, nth_allocation_fails_once) {
    mem_fail_nth(2);
    void *a = mem_alloc(MEM_TEST, 8);
    void *b = mem_alloc(MEM_TEST, 8);
    void *c = mem_alloc(MEM_TEST, 8);
    cr_assert_not_null(a);
    cr_assert_null(b, "second allocation must fail");
    cr_assert_not_null(c, "the hook fires once");
    mem_free(a);
    mem_free(c);
    mem_fail_nth(0);
}

Test(mem, calloc_overflow_is_refused) {
    cr_assert_null(mem_calloc(MEM_TEST, SIZE_MAX / 2, 4));
    char *s = mem_strndup(MEM_TEST, "hello world", 5);
    cr_assert_str_eq(s, "hello");
    mem_free(s);
}

/* mem_alloc_huge: past 1 MiB its own 2 MiB-aligned mapping (the header at
 * its start), up to it a heap block; every byte writable, counted like any
 * block, failed by the hook, freed by mem_free, moved to the heap by
 * mem_realloc with its bytes; under ASan the mapping's slack is poisoned
 * (an overread fails as on the heap). */
Test(mem, huge_blocks_are_aligned_counted_and_freed) {
    const size_t mib = (size_t)1 << 20;
    const size_t sizes[] = {1, 64, mib - 64, mib - 63, 2 * mib - 64, 2 * mib, 5 * mib};
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        const size_t n = sizes[i];
        const bool mapped = n + 64 > mib;
        uint64_t before = mem_bytes(MEM_TEST);
        unsigned char *p = mem_alloc_huge(MEM_TEST, n);
        cr_assert_not_null(p, "%zu bytes", n);
        cr_assert_eq((uintptr_t)p % 64, 0);
        if (mapped)
            cr_assert_eq(((uintptr_t)p - 64) % (2 * mib), 0,
                         "%zu bytes: mapping at %p, not 2 MiB aligned", n, (void *)(p - 64));
        cr_assert_eq(mem_bytes(MEM_TEST), before + n);
        memset(p, 0xA5, n);
        cr_assert_eq(p[0], 0xA5);
        cr_assert_eq(p[n - 1], 0xA5);
#if defined(__SANITIZE_ADDRESS__)
        if (mapped) /* (a heap block's redzone starts at its 64-byte rounding) */
            cr_assert(__asan_address_is_poisoned(p + n), "%zu bytes: the byte past it readable", n);
#endif
        if (n == 2 * mib - 64) {
            unsigned char *q = mem_realloc(p, 3 * n);
            cr_assert_not_null(q);
            for (size_t k = 0; k < n; k += 4093)
                cr_assert_eq(q[k], 0xA5, "byte %zu after the move", k);
            cr_assert_eq(q[n - 1], 0xA5);
            cr_assert_eq(mem_bytes(MEM_TEST), before + 3 * n);
            p = q;
        }
        mem_free(p);
        cr_assert_eq(mem_bytes(MEM_TEST), before, "%zu bytes", n);
    }
    mem_fail_nth(1);
    uint64_t before = mem_bytes(MEM_TEST);
    cr_assert_null(mem_alloc_huge(MEM_TEST, 4 * mib), "the hook fails huge blocks too");
    cr_assert_eq(mem_bytes(MEM_TEST), before);
    mem_fail_nth(1);
    cr_assert_null(mem_alloc_huge(MEM_TEST, 4096), "and the small ones");
    cr_assert_null(mem_alloc_huge(MEM_TEST, SIZE_MAX - 100), "a size past the address space");
    cr_assert_null(mem_alloc_huge(MEM_TEST, SIZE_MAX - 10), "one that wraps with the header");
    mem_fail_nth(0);
}
