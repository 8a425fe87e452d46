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
