/* The CUDA backend in the default build (vmm/vmm_cuda_stub.c): every entry
 * point answers -ENOTSUP, leaves its out-params alone and allocates nothing,
 * so callers can probe for CUDA and fall back to the host backend. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "mem.h"
#include "vmm/vmm_backend.h"
#include "vmm/vmm_cuda_util.h"

Test(vmm_cuda_stub, create_is_enotsup_and_leaves_out_untouched) {
    struct vmm_backend *sentinel = (struct vmm_backend *)(uintptr_t)0x5eed;
    struct vmm_backend *b = sentinel;
    uint64_t held = mem_bytes(MEM_VMM);
    for (int i = 0; i < 3; i++) {
        int rc = vmm_cuda_backend_create(0, &b);
        cr_assert_eq(rc, -ENOTSUP, "call %d: rc %d want %d", i, rc, -ENOTSUP);
        cr_assert_eq(b, sentinel, "call %d: *out %p was overwritten", i, (void *)b);
    }
    cr_assert_eq(vmm_cuda_backend_create(7, &b), -ENOTSUP, "any ordinal");
    cr_assert_eq(mem_bytes(MEM_VMM), held, "vmm bytes %lu want %lu",
                 (unsigned long)mem_bytes(MEM_VMM), (unsigned long)held);
}

Test(vmm_cuda_stub, says_why) {
    struct vmm_backend *b = NULL;
    cr_assert_eq(vmm_cuda_backend_create(0, &b), -ENOTSUP);
    const char *why = vmm_cuda_why_unavailable();
    cr_assert_not_null(why);
    cr_assert(strstr(why, "without CUDA") != NULL, "why: \"%s\"", why);
}

Test(vmm_cuda_stub, helpers_are_enotsup) {
    char buf[16] = {0};
    uint64_t map_ns = 42, access_ns = 43;
    cr_assert_eq(vmm_cuda_memcpy_htod(NULL, 0x1000, buf, sizeof(buf)), -ENOTSUP);
    cr_assert_eq(vmm_cuda_memcpy_dtoh(NULL, buf, 0x1000, sizeof(buf)), -ENOTSUP);
    cr_assert_eq(vmm_cuda_map_split_ns(NULL, &map_ns, &access_ns), -ENOTSUP);
    cr_assert_eq(map_ns, 42, "map_ns written: %lu", (unsigned long)map_ns);
    cr_assert_eq(access_ns, 43, "access_ns written: %lu", (unsigned long)access_ns);
}
