/* vmm_cu_errno(): the numeric CUresult -> -errno mapping shared by the real
 * CUDA backend and the stub. Values are those of cuda.h (the CUDA build
 * checks them with _Static_assert in vmm/cuda/vmm_cuda.c). */
#include <criterion/criterion.h>
#include <errno.h>

#include "vmm/vmm_cuda_util.h"

struct cu_case {
    int cu;
    int want;
    const char *name;
};

Test(vmm_cuda_err, maps_documented_codes) {
    static const struct cu_case cases[] = {
        {0, 0, "CUDA_SUCCESS"},
        {1, -EINVAL, "CUDA_ERROR_INVALID_VALUE"},
        {2, -ENOMEM, "CUDA_ERROR_OUT_OF_MEMORY"},
        {100, -ENOTSUP, "CUDA_ERROR_NO_DEVICE"},
        {101, -EINVAL, "CUDA_ERROR_INVALID_DEVICE"},
        {801, -ENOTSUP, "CUDA_ERROR_NOT_SUPPORTED"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int got = vmm_cu_errno(cases[i].cu);
        cr_assert_eq(got, cases[i].want, "%s (%d): got %d want %d", cases[i].name, cases[i].cu, got,
                     cases[i].want);
    }
}

Test(vmm_cuda_err, everything_else_is_eio) {
    /* NOT_INITIALIZED, INVALID_CONTEXT, ILLEGAL_ADDRESS, ECC_UNCORRECTABLE,
     * LAUNCH_FAILED, NOT_PERMITTED, UNKNOWN, and values no header defines. */
    static const int others[] = {3, 201, 700, 214, 719, 800, 999, -1, 12345};
    for (size_t i = 0; i < sizeof(others) / sizeof(others[0]); i++) {
        int got = vmm_cu_errno(others[i]);
        cr_assert_eq(got, -EIO, "CUresult %d: got %d want %d", others[i], got, -EIO);
    }
}
