/* vmm_cuda_err.c - CUresult to -errno, shared by both builds.
 *
 * The mapping is a pure function of the numeric CUresult so that it can be
 * unit-tested in the default build, which has no <cuda.h> on its include
 * path. The values are those of enum cudaError_enum in the CUDA 13.0 cuda.h
 * (unchanged since CUDA 2.x for these codes); the real backend checks them
 * against the header with _Static_assert (vmm/cuda/vmm_cuda.c).
 *
 * Why these errnos: OOM is the one error a caller recovers from (evict,
 * shrink the pool), so it must stay distinct; NOT_SUPPORTED and NO_DEVICE
 * mean "this machine cannot", which callers answer by choosing the host
 * backend; INVALID_VALUE and INVALID_DEVICE are the caller's bad arguments.
 * Everything else (launch failures, ECC, a lost device) is -EIO.
 */
#include "vmm/vmm_cuda_util.h"

#include <errno.h>

enum {
    VMM_CU_SUCCESS = 0,
    VMM_CU_ERROR_INVALID_VALUE = 1,
    VMM_CU_ERROR_OUT_OF_MEMORY = 2,
    VMM_CU_ERROR_NO_DEVICE = 100,
    VMM_CU_ERROR_INVALID_DEVICE = 101,
    VMM_CU_ERROR_NOT_SUPPORTED = 801,
};

int vmm_cu_errno(int cu_result) {
    switch (cu_result) {
    case VMM_CU_SUCCESS:
        return 0;
    case VMM_CU_ERROR_INVALID_VALUE:
    case VMM_CU_ERROR_INVALID_DEVICE:
        return -EINVAL;
    case VMM_CU_ERROR_OUT_OF_MEMORY:
        return -ENOMEM;
    case VMM_CU_ERROR_NO_DEVICE:
    case VMM_CU_ERROR_NOT_SUPPORTED:
        return -ENOTSUP;
    default:
        return -EIO;
    }
}
