/* Tests of the allocation funnel: accounting and the N-th failure hook. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

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

/* mem_alloc_huge: its own 2 MiB-aligned mapping (the header at its
 * start), every byte writable, counted like any block, failed by the hook,
 * freed by mem_free, and moved to the heap by mem_realloc with its bytes. */
Test(mem, huge_blocks_are_aligned_counted_and_freed) {
    const size_t sizes[] = {1, 64, ((size_t)2 << 20) - 64, (size_t)2 << 20, (size_t)5 << 20};
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        const size_t n = sizes[i];
        uint64_t before = mem_bytes(MEM_TEST);
        unsigned char *p = mem_alloc_huge(MEM_TEST, n);
        cr_assert_not_null(p, "%zu bytes", n);
        cr_assert_eq((uintptr_t)p % 64, 0);
        cr_assert_eq(((uintptr_t)p - 64) % ((uintptr_t)2 << 20), 0,
                     "%zu bytes: mapping at %p, not 2 MiB aligned", n, (void *)(p - 64));
        cr_assert_eq(mem_bytes(MEM_TEST), before + n);
        memset(p, 0xA5, n);
        cr_assert_eq(p[0], 0xA5);
        cr_assert_eq(p[n - 1], 0xA5);
        if (i == 1) {
            unsigned char *q = mem_realloc(p, 3 * n);
            cr_assert_not_null(q);
            for (size_t k = 0; k < n; k++)
                cr_assert_eq(q[k], 0xA5, "byte %zu after the move", k);
            cr_assert_eq(mem_bytes(MEM_TEST), before + 3 * n);
            p = q;
        }
        mem_free(p);
        cr_assert_eq(mem_bytes(MEM_TEST), before, "%zu bytes", n);
    }
    mem_fail_nth(1);
    uint64_t before = mem_bytes(MEM_TEST);
    cr_assert_null(mem_alloc_huge(MEM_TEST, 4096), "the hook fails huge blocks too");
    cr_assert_eq(mem_bytes(MEM_TEST), before);
    cr_assert_null(mem_alloc_huge(MEM_TEST, SIZE_MAX - 100), "a size past the address space");
    mem_fail_nth(0);
}
