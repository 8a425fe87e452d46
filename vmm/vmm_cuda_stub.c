/* vmm_cuda_stub.c - the CUDA backend in a build without CUDA (plain `make`).
 *
 * The Makefile links this file instead of the sources in vmm/cuda/ unless WITH_CUDA=1
 * (`make cuda`), so callers such as vmm.c and llmd_main.c never need an
 * #ifdef: they ask for the CUDA backend, get -ENOTSUP, and report
 * vmm_cuda_why_unavailable() themselves (nothing is logged here: the caller's
 * error line already says it, once).
 */
#include "vmm/vmm_backend.h"
#include "vmm/vmm_cuda_util.h"

#include <errno.h>

static const char vmm_cuda_stub_why[] = "llmd was built without CUDA support (make cuda)";

int vmm_cuda_backend_create(int ordinal, struct vmm_backend **out) {
    (void)ordinal;
    (void)out; /* left untouched on failure, as for every create */
    return -ENOTSUP;
}

int vmm_cuda_memcpy_htod(struct vmm_backend *b, uintptr_t dst, const void *src, size_t n) {
    (void)b;
    (void)dst;
    (void)src;
    (void)n;
    return -ENOTSUP;
}

int vmm_cuda_memcpy_dtoh(struct vmm_backend *b, void *dst, uintptr_t src, size_t n) {
    (void)b;
    (void)dst;
    (void)src;
    (void)n;
    return -ENOTSUP;
}

int vmm_cuda_map_split_ns(const struct vmm_backend *b, uint64_t *map_ns, uint64_t *access_ns) {
    (void)b;
    (void)map_ns;
    (void)access_ns;
    return -ENOTSUP;
}

int vmm_cuda_host_register(struct vmm_backend *b, void *p, size_t n) {
    (void)b;
    (void)p;
    (void)n;
    return -ENOTSUP;
}

void vmm_cuda_host_unregister(struct vmm_backend *b, void *p) {
    (void)b;
    (void)p;
}

int vmm_cuda_pci_bus_id(struct vmm_backend *b, char *buf, size_t len) {
    (void)b;
    (void)buf;
    (void)len;
    return -ENOTSUP;
}

const char *vmm_cuda_why_unavailable(void) {
    return vmm_cuda_stub_why;
}
