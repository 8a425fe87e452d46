/* vmm_cuda_util.h - the CUDA backend's few functions outside the vtable.
 *
 * Model: vmm_cuda_backend_create() (vmm_backend.h) gives a backend whose
 * addresses are CUdeviceptr values, so host code cannot read or write pages
 * through them. The copies here move bytes between host memory and a mapped
 * device address, for device tests and for diagnostics; they are not on the
 * token path. The error mapper and the "why unavailable" text are shared by
 * the real backend (vmm/cuda/vmm_cuda.c, `make cuda`) and the stub
 * (vmm/vmm_cuda_stub.c, the default build), so both builds expose the same
 * symbols and callers need no #ifdef.
 *
 * Thread safety: as the backend (vmm_backend.h): calls on one backend are
 * serialized by the caller. vmm_cu_errno() is pure. vmm_cuda_why_unavailable()
 * reads thread-local state.
 */
#ifndef LLMD_VMM_CUDA_UTIL_H
#define LLMD_VMM_CUDA_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "vmm/vmm_backend.h"

/* Map a numeric CUresult to 0 or -errno, without needing <cuda.h>:
 * CUDA_SUCCESS (0) -> 0, CUDA_ERROR_INVALID_VALUE (1) -> -EINVAL,
 * CUDA_ERROR_OUT_OF_MEMORY (2) -> -ENOMEM, CUDA_ERROR_NO_DEVICE (100) ->
 * -ENOTSUP, CUDA_ERROR_INVALID_DEVICE (101) -> -EINVAL,
 * CUDA_ERROR_NOT_SUPPORTED (801) -> -ENOTSUP, anything else -> -EIO.
 * Pure; logs nothing (the backend's vmm_cu_err() logs, then calls this). */
int vmm_cu_errno(int cu_result);

/* Copy n bytes from host memory src to device address dst (mapped, readable
 * and writable through b). src is borrowed. Blocks until the copy is done.
 * Returns 0, -EINVAL (b is not a CUDA backend), -ENOTSUP (built without
 * CUDA), or the mapped CUresult (-EIO for a fault on an unmapped address). */
int vmm_cuda_memcpy_htod(struct vmm_backend *b, uintptr_t dst, const void *src, size_t n);

/* Copy n bytes from device address src to host memory dst; as above. */
int vmm_cuda_memcpy_dtoh(struct vmm_backend *b, void *dst, uintptr_t src, size_t n);

/* Time the two driver calls of the most recent successful map() on b:
 * cuMemMap and cuMemSetAccess, in nanoseconds (monotonic clock). For the
 * latency figures of tests/device/. Returns 0, -EINVAL (not a CUDA backend
 * or no map yet), -ENOTSUP (built without CUDA). */
int vmm_cuda_map_split_ns(const struct vmm_backend *b, uint64_t *map_ns, uint64_t *access_ns);

/* Page-lock n bytes of host memory at p (cuMemHostRegister, PORTABLE) so
 * copies between it and b's pages run at full PCIe/NVLink speed and can be
 * asynchronous: the host tier's `pin` hook (offload/ofl_host.h). Unregister
 * with vmm_cuda_host_unregister(b, p) before freeing the memory. Returns 0,
 * -EINVAL (not a CUDA backend, NULL, 0 bytes), -ENOTSUP (built without
 * CUDA, or a driver without the call), -ENOMEM/-EIO (the driver refused:
 * logged). These three may run outside the pool lock, from any thread (the
 * host tier's): they read only what is fixed at create, and make the
 * context current on the calling thread. */
int vmm_cuda_host_register(struct vmm_backend *b, void *p, size_t n);
void vmm_cuda_host_unregister(struct vmm_backend *b, void *p);

/* The device's PCI bus id, "0000:3b:00.0" (cuDeviceGetPCIBusId), into
 * buf[len >= 13], for placing host memory on its NUMA node. Returns 0,
 * -EINVAL, -ENOTSUP, -EIO. */
int vmm_cuda_pci_bus_id(struct vmm_backend *b, char *buf, size_t len);

/* Why the last vmm_cuda_backend_create() on this thread returned -ENOTSUP or
 * another error, e.g. "no CUDA device"; "" when it succeeded or was never
 * called (the stub always answers "llmd was built without CUDA support (make
 * cuda)"). A read-only borrowed string, valid until the next create on this
 * thread. */
const char *vmm_cuda_why_unavailable(void);

#endif /* LLMD_VMM_CUDA_UTIL_H */
