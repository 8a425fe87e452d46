/* fake_libcuda.c - a stand-in libcuda.so.1 for the CUDA backend's tests on
 * machines without a GPU. Not a GPU emulator: just the subset of the driver
 * API that vmm/cuda/vmm_cuda.c resolves, with CUDA VMM semantics played by
 * host memory, so that the backend's own logic (symbol resolution, error
 * paths, rollback, the pool view, handle lookup) runs on any machine:
 *
 *   cuMemCreate          one memfd of the requested size, its first and last
 *                        4 KiB poisoned (cuMemCreate memory is not zeroed,
 *                        so a backend that promises zeros must clear it;
 *                        poisoning all of it would cost the 1 GiB OOM probe
 *                        of test_vmm_cuda 1 GiB of writes); a fixed budget
 *                        of "device memory" (1 GiB) gives OOM. The budget
 *                        bounds the host memory a run can touch (the
 *                        backend zeroes its whole pool): the suites need
 *                        about 100 MiB, and a runaway test fails with
 *                        OUT_OF_MEMORY instead of pushing the machine into
 *                        the OOM killer
 *   cuMemAddressReserve  mmap(PROT_NONE), aligned
 *   cuMemMap             mmap(MAP_SHARED|MAP_FIXED) of the memfd, PROT_NONE:
 *                        a new mapping starts inaccessible, as in CUDA;
 *                        refuses to map over a mapping (INVALID_VALUE)
 *   cuMemSetAccess       mprotect(READ|WRITE); the span must be fully mapped
 *   cuMemUnmap           whole mappings only, PROT_NONE anonymous memory back
 *   cuMemcpy*, memset    memcpy/memset (addresses are host addresses)
 *
 * As the driver, every call that works on memory, streams or copies needs a
 * current context on the calling thread (cuCtxSetCurrent is per thread:
 * thread-local here too) and answers CUDA_ERROR_INVALID_CONTEXT without one,
 * so a backend that forgets to make its context current on a second thread
 * fails here as it would on a GPU.
 *
 * FAKE_CUDA selects a failure: "nodevice" (cuInit -> CUDA_ERROR_NO_DEVICE),
 * "nosym" (cuMemSetAccess is not exported), "novmm" (the device lacks VMM).
 * Test hooks, which a real libcuda lacks (programs find them with dlsym on
 * the loaded libcuda.so.1): fake_libcuda_calls(name) counts the calls made
 * to cuMemMap or cuMemSetAccess, and fake_libcuda_fail(name, nth) makes the
 * nth call of one of them from now fail (cuMemMap: OUT_OF_MEMORY,
 * cuMemSetAccess: UNKNOWN), once, so a backend's rollback inside one
 * operation can be driven.
 * At exit it prints "fake libcuda: leak: ..." on stderr if any allocation,
 * mapping, reservation, stream or context retain is left, so tests catch a
 * backend that forgets to clean up.
 *
 * Built by tests/device/run.sh as a shared object named libcuda.so.1 and
 * found through LD_LIBRARY_PATH. Not thread-safe: callers serialize their
 * calls (vmm.c does, under its pool lock; tests that add their own copies
 * from a second thread hold a lock of their own around them).
 */
#include <cuda.h>
#include <cudaTypedefs.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define FAKE_GRAN    ((size_t)2 << 20)
#define FAKE_MAX     4096
#define FAKE_DEV_MEM ((size_t)1 << 30)
#define FAKE_POISON  0xA5 /* the head and tail bytes of a new allocation */

struct fake_alloc {
    int fd;
    size_t size;
    bool live; /* not yet released */
};

struct fake_range {
    uintptr_t va;
    size_t size;
    struct fake_alloc *a; /* NULL for a reservation */
};

static struct fake_range maps[FAKE_MAX], resv[FAKE_MAX];
static unsigned n_maps, n_resv, n_allocs, n_streams, n_retains, n_host_regs;
static void *host_regs[FAKE_MAX]; /* cuMemHostRegister'ed addresses */
static size_t used_bytes;
static struct CUstream_st *const fake_stream = (struct CUstream_st *)0x5;
static struct CUctx_st *const fake_ctx = (struct CUctx_st *)0xc;
static _Thread_local CUcontext fake_current;   /* cuCtxSetCurrent, per thread */
static unsigned n_map_calls, n_access_calls;   /* made, failed ones included */
static unsigned fail_map_nth, fail_access_nth; /* 0: off */

/* Consume one step of a failure countdown; true when this call must fail. */
static bool fake_fires(unsigned *nth) {
    return *nth && --*nth == 0;
}

unsigned fake_libcuda_calls(const char *name);
void fake_libcuda_fail(const char *name, unsigned nth);

unsigned fake_libcuda_calls(const char *name) {
    return strcmp(name, "cuMemMap") == 0         ? n_map_calls
           : strcmp(name, "cuMemSetAccess") == 0 ? n_access_calls
                                                 : 0;
}

void fake_libcuda_fail(const char *name, unsigned nth) {
    if (strcmp(name, "cuMemMap") == 0)
        fail_map_nth = nth;
    else if (strcmp(name, "cuMemSetAccess") == 0)
        fail_access_nth = nth;
}

/* CUDA_ERROR_INVALID_CONTEXT unless this thread has made fake_ctx current. */
#define FAKE_NEED_CTX()                                                                            \
    do {                                                                                           \
        if (fake_current != fake_ctx)                                                              \
            return CUDA_ERROR_INVALID_CONTEXT;                                                     \
    } while (0)

static bool mode(const char *m) {
    const char *e = getenv("FAKE_CUDA");
    return e && strcmp(e, m) == 0;
}

static CUresult fake_init(unsigned int flags) {
    (void)flags;
    return mode("nodevice") ? CUDA_ERROR_NO_DEVICE : CUDA_SUCCESS;
}

static CUresult fake_device_get(CUdevice_v1 *dev, int ordinal) {
    if (ordinal != 0)
        return CUDA_ERROR_INVALID_DEVICE;
    *dev = 0;
    return CUDA_SUCCESS;
}

static CUresult fake_device_get_attribute(int *pi, CUdevice_attribute attrib, CUdevice_v1 dev) {
    (void)dev;
    *pi = attrib == CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED ? !mode("novmm") : 0;
    return CUDA_SUCCESS;
}

static CUresult fake_ctx_retain(CUcontext *ctx, CUdevice_v1 dev) {
    (void)dev;
    n_retains++;
    *ctx = fake_ctx;
    return CUDA_SUCCESS;
}

static CUresult fake_ctx_release(CUdevice_v1 dev) {
    (void)dev;
    if (n_retains == 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    n_retains--;
    return CUDA_SUCCESS;
}

static CUresult fake_ctx_set_current(CUcontext ctx) {
    if (ctx != fake_ctx || n_retains == 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    fake_current = ctx;
    return CUDA_SUCCESS;
}

static CUresult fake_error_name(CUresult r, const char **s) {
    switch (r) {
    case CUDA_ERROR_INVALID_VALUE:
        *s = "CUDA_ERROR_INVALID_VALUE";
        return CUDA_SUCCESS;
    case CUDA_ERROR_OUT_OF_MEMORY:
        *s = "CUDA_ERROR_OUT_OF_MEMORY";
        return CUDA_SUCCESS;
    default:
        *s = "CUDA_ERROR_FAKE";
        return CUDA_SUCCESS;
    }
}

static CUresult fake_error_string(CUresult r, const char **s) {
    (void)r;
    *s = "(fake libcuda)";
    return CUDA_SUCCESS;
}

static CUresult fake_granularity(size_t *g, const CUmemAllocationProp_v1 *prop,
                                 CUmemAllocationGranularity_flags opt) {
    (void)opt;
    if (prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
        prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    *g = FAKE_GRAN;
    return CUDA_SUCCESS;
}

static CUresult fake_reserve(CUdeviceptr_v2 *ptr, size_t size, size_t align, CUdeviceptr_v2 addr,
                             unsigned long long flags) {
    FAKE_NEED_CTX();
    if (size == 0 || size % FAKE_GRAN || align % FAKE_GRAN || addr || flags || n_resv == FAKE_MAX)
        return CUDA_ERROR_INVALID_VALUE;
    if (align == 0)
        align = FAKE_GRAN;
    char *p =
        mmap(NULL, size + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return CUDA_ERROR_OUT_OF_MEMORY;
    uintptr_t va = ((uintptr_t)p + align - 1) & ~(uintptr_t)(align - 1);
    if (va > (uintptr_t)p)
        munmap(p, va - (uintptr_t)p);
    munmap((char *)va + size, (uintptr_t)p + align - va);
    resv[n_resv++] = (struct fake_range){.va = va, .size = size};
    *ptr = va;
    return CUDA_SUCCESS;
}

static CUresult fake_address_free(CUdeviceptr_v2 ptr, size_t size) {
    FAKE_NEED_CTX();
    for (unsigned i = 0; i < n_resv; i++) {
        if (resv[i].va != ptr || resv[i].size != size)
            continue;
        for (unsigned j = 0; j < n_maps; j++)
            if (maps[j].va >= ptr && maps[j].va < ptr + size)
                return CUDA_ERROR_INVALID_VALUE; /* still mapped */
        munmap((void *)ptr, size);
        resv[i] = resv[--n_resv];
        return CUDA_SUCCESS;
    }
    return CUDA_ERROR_INVALID_VALUE;
}

static CUresult fake_create(CUmemGenericAllocationHandle_v1 *h, size_t size,
                            const CUmemAllocationProp_v1 *prop, unsigned long long flags) {
    FAKE_NEED_CTX();
    if (size == 0 || size % FAKE_GRAN || flags || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED)
        return CUDA_ERROR_INVALID_VALUE;
    if (size > FAKE_DEV_MEM - used_bytes)
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct fake_alloc *a = calloc(1, sizeof(*a));
    if (!a)
        return CUDA_ERROR_OUT_OF_MEMORY;
    a->fd = memfd_create("fake_cuda", MFD_CLOEXEC);
    if (a->fd < 0 || ftruncate(a->fd, (off_t)size) != 0) {
        if (a->fd >= 0)
            close(a->fd);
        free(a);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    static unsigned char poison[4096];
    memset(poison, FAKE_POISON, sizeof(poison));
    if (pwrite(a->fd, poison, sizeof(poison), 0) != (ssize_t)sizeof(poison) ||
        pwrite(a->fd, poison, sizeof(poison), (off_t)(size - sizeof(poison))) !=
            (ssize_t)sizeof(poison)) {
        close(a->fd);
        free(a);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    a->size = size;
    a->live = true;
    used_bytes += size;
    n_allocs++;
    *h = (CUmemGenericAllocationHandle_v1)(uintptr_t)a;
    return CUDA_SUCCESS;
}

static bool fake_mapped_somewhere(const struct fake_alloc *a) {
    for (unsigned j = 0; j < n_maps; j++)
        if (maps[j].a == a)
            return true;
    return false;
}

/* Free the memory once the handle is released and nothing maps it. */
static void fake_maybe_free(struct fake_alloc *a) {
    if (a->live || fake_mapped_somewhere(a))
        return;
    close(a->fd);
    used_bytes -= a->size;
    n_allocs--;
    free(a);
}

static CUresult fake_release(CUmemGenericAllocationHandle_v1 h) {
    FAKE_NEED_CTX();
    struct fake_alloc *a = (struct fake_alloc *)(uintptr_t)h;
    if (!a || !a->live)
        return CUDA_ERROR_INVALID_VALUE;
    a->live = false;
    fake_maybe_free(a);
    return CUDA_SUCCESS;
}

static bool fake_in_reservation(uintptr_t va, size_t size) {
    for (unsigned i = 0; i < n_resv; i++)
        if (va >= resv[i].va && va + size <= resv[i].va + resv[i].size)
            return true;
    return false;
}

static CUresult fake_map(CUdeviceptr_v2 ptr, size_t size, size_t offset,
                         CUmemGenericAllocationHandle_v1 h, unsigned long long flags) {
    FAKE_NEED_CTX();
    n_map_calls++;
    if (fake_fires(&fail_map_nth))
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct fake_alloc *a = (struct fake_alloc *)(uintptr_t)h;
    if (!a || !a->live || ptr % FAKE_GRAN || size % FAKE_GRAN || offset % FAKE_GRAN || flags ||
        offset + size > a->size || !fake_in_reservation(ptr, size) || n_maps == FAKE_MAX)
        return CUDA_ERROR_INVALID_VALUE;
    for (unsigned j = 0; j < n_maps; j++)
        if (ptr < maps[j].va + maps[j].size && maps[j].va < ptr + size)
            return CUDA_ERROR_INVALID_VALUE; /* overlaps a mapping */
    if (mmap((void *)ptr, size, PROT_NONE, MAP_SHARED | MAP_FIXED, a->fd, (off_t)offset) ==
        MAP_FAILED)
        return CUDA_ERROR_OUT_OF_MEMORY;
    maps[n_maps++] = (struct fake_range){.va = ptr, .size = size, .a = a};
    return CUDA_SUCCESS;
}

/* Bytes of [ptr, ptr + size) covered by mappings, or 0 if a mapping sticks
 * out of the range. */
static size_t fake_mapped_bytes(uintptr_t ptr, size_t size, bool whole_only) {
    size_t covered = 0;
    for (unsigned j = 0; j < n_maps; j++) {
        if (!(ptr < maps[j].va + maps[j].size && maps[j].va < ptr + size))
            continue;
        if (whole_only && (maps[j].va < ptr || maps[j].va + maps[j].size > ptr + size))
            return 0;
        covered += maps[j].size;
    }
    return covered;
}

static CUresult fake_unmap(CUdeviceptr_v2 ptr, size_t size) {
    FAKE_NEED_CTX();
    if (size == 0 || fake_mapped_bytes(ptr, size, true) != size)
        return CUDA_ERROR_INVALID_VALUE; /* sub-range, or not all mapped */
    mmap((void *)ptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1,
         0);
    for (unsigned j = 0; j < n_maps;) {
        if (maps[j].va >= ptr && maps[j].va < ptr + size) {
            struct fake_alloc *a = maps[j].a;
            maps[j] = maps[--n_maps];
            fake_maybe_free(a);
        } else {
            j++;
        }
    }
    return CUDA_SUCCESS;
}

static CUresult fake_set_access(CUdeviceptr_v2 ptr, size_t size, const CUmemAccessDesc_v1 *desc,
                                size_t count) {
    FAKE_NEED_CTX();
    n_access_calls++;
    if (fake_fires(&fail_access_nth))
        return CUDA_ERROR_UNKNOWN;
    if (count != 1 || desc->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
        fake_mapped_bytes(ptr, size, true) != size)
        return CUDA_ERROR_INVALID_VALUE;
    int prot = desc->flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE ? PROT_READ | PROT_WRITE
               : desc->flags == CU_MEM_ACCESS_FLAGS_PROT_READ    ? PROT_READ
                                                                 : PROT_NONE;
    return mprotect((void *)ptr, size, prot) == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

static CUresult fake_stream_create(CUstream *s, unsigned int flags) {
    FAKE_NEED_CTX();
    (void)flags;
    n_streams++;
    *s = fake_stream;
    return CUDA_SUCCESS;
}

static CUresult fake_stream_destroy(CUstream s) {
    FAKE_NEED_CTX();
    if (s != fake_stream || n_streams == 0)
        return CUDA_ERROR_INVALID_HANDLE;
    n_streams--;
    return CUDA_SUCCESS;
}

static CUresult fake_stream_sync(CUstream s) {
    FAKE_NEED_CTX();
    return s == fake_stream ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

/* Copies check that the whole span is mapped (not its access), as the
 * driver validates pointers before it queues a copy. */
static CUresult fake_memcpy_dtod(CUdeviceptr_v2 dst, CUdeviceptr_v2 src, size_t n, CUstream s) {
    FAKE_NEED_CTX();
    if (s != fake_stream || fake_mapped_bytes(dst, n, false) < n ||
        fake_mapped_bytes(src, n, false) < n)
        return CUDA_ERROR_INVALID_VALUE;
    memmove((void *)dst, (const void *)src, n);
    return CUDA_SUCCESS;
}

static CUresult fake_memcpy_htod(CUdeviceptr_v2 dst, const void *src, size_t n, CUstream s) {
    FAKE_NEED_CTX();
    if (s != fake_stream || fake_mapped_bytes(dst, n, false) < n)
        return CUDA_ERROR_INVALID_VALUE;
    memcpy((void *)dst, src, n);
    return CUDA_SUCCESS;
}

static CUresult fake_memcpy_dtoh(void *dst, CUdeviceptr_v2 src, size_t n, CUstream s) {
    FAKE_NEED_CTX();
    if (s != fake_stream || fake_mapped_bytes(src, n, false) < n)
        return CUDA_ERROR_INVALID_VALUE;
    memcpy(dst, (const void *)src, n);
    return CUDA_SUCCESS;
}

static CUresult fake_memset_d8(CUdeviceptr_v2 dst, unsigned char uc, size_t n, CUstream s) {
    FAKE_NEED_CTX();
    if (s != fake_stream || fake_mapped_bytes(dst, n, false) < n)
        return CUDA_ERROR_INVALID_VALUE;
    memset((void *)dst, uc, n);
    return CUDA_SUCCESS;
}

/* Host registration: remembered so a double register, an unregister of an
 * unknown address or one left registered at exit is caught. */
static CUresult fake_host_register(void *p, size_t n, unsigned int flags) {
    (void)flags;
    FAKE_NEED_CTX();
    if (!p || n == 0 || n_host_regs == FAKE_MAX)
        return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < n_host_regs; i++)
        if (host_regs[i] == p)
            return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    host_regs[n_host_regs++] = p;
    return CUDA_SUCCESS;
}

static CUresult fake_host_unregister(void *p) {
    FAKE_NEED_CTX();
    for (unsigned i = 0; i < n_host_regs; i++)
        if (host_regs[i] == p) {
            host_regs[i] = host_regs[--n_host_regs];
            return CUDA_SUCCESS;
        }
    return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
}

static CUresult fake_pci_bus_id(char *buf, int len, CUdevice_v1 dev) {
    if (dev != 0 || len < 13)
        return CUDA_ERROR_INVALID_VALUE;
    snprintf(buf, (size_t)len, "0000:00:00.0"); /* hwloc sees no such GPU: no placement */
    return CUDA_SUCCESS;
}

/* Assign through the PFN type so each fake's signature is checked against
 * cudaTypedefs.h at compile time. */
#define FAKE_SYM(name, pfn_type, fn)                                                               \
    if (strcmp(symbol, name) == 0) {                                                               \
        pfn_type f_ = fn;                                                                          \
        memcpy(pfn, &f_, sizeof(f_));                                                              \
        goto found;                                                                                \
    }

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *status) {
    (void)flags;
    *pfn = NULL;
    if (version > 13000)
        return CUDA_ERROR_INVALID_VALUE; /* newer than this "driver" */
    FAKE_SYM("cuInit", PFN_cuInit_v2000, fake_init);
    FAKE_SYM("cuDeviceGet", PFN_cuDeviceGet_v2000, fake_device_get);
    FAKE_SYM("cuDeviceGetAttribute", PFN_cuDeviceGetAttribute_v2000, fake_device_get_attribute);
    FAKE_SYM("cuDevicePrimaryCtxRetain", PFN_cuDevicePrimaryCtxRetain_v7000, fake_ctx_retain);
    FAKE_SYM("cuDevicePrimaryCtxRelease", PFN_cuDevicePrimaryCtxRelease_v11000, fake_ctx_release);
    FAKE_SYM("cuCtxSetCurrent", PFN_cuCtxSetCurrent_v4000, fake_ctx_set_current);
    FAKE_SYM("cuGetErrorName", PFN_cuGetErrorName_v6000, fake_error_name);
    FAKE_SYM("cuGetErrorString", PFN_cuGetErrorString_v6000, fake_error_string);
    FAKE_SYM("cuMemGetAllocationGranularity", PFN_cuMemGetAllocationGranularity_v10020,
             fake_granularity);
    FAKE_SYM("cuMemAddressReserve", PFN_cuMemAddressReserve_v10020, fake_reserve);
    FAKE_SYM("cuMemAddressFree", PFN_cuMemAddressFree_v10020, fake_address_free);
    FAKE_SYM("cuMemCreate", PFN_cuMemCreate_v10020, fake_create);
    FAKE_SYM("cuMemRelease", PFN_cuMemRelease_v10020, fake_release);
    FAKE_SYM("cuMemMap", PFN_cuMemMap_v10020, fake_map);
    FAKE_SYM("cuMemUnmap", PFN_cuMemUnmap_v10020, fake_unmap);
    if (!mode("nosym"))
        FAKE_SYM("cuMemSetAccess", PFN_cuMemSetAccess_v10020, fake_set_access);
    FAKE_SYM("cuStreamCreate", PFN_cuStreamCreate_v2000, fake_stream_create);
    FAKE_SYM("cuStreamDestroy", PFN_cuStreamDestroy_v4000, fake_stream_destroy);
    FAKE_SYM("cuStreamSynchronize", PFN_cuStreamSynchronize_v2000, fake_stream_sync);
    FAKE_SYM("cuMemcpyDtoDAsync", PFN_cuMemcpyDtoDAsync_v3020, fake_memcpy_dtod);
    FAKE_SYM("cuMemcpyHtoDAsync", PFN_cuMemcpyHtoDAsync_v3020, fake_memcpy_htod);
    FAKE_SYM("cuMemcpyDtoHAsync", PFN_cuMemcpyDtoHAsync_v3020, fake_memcpy_dtoh);
    FAKE_SYM("cuMemsetD8Async", PFN_cuMemsetD8Async_v3020, fake_memset_d8);
    FAKE_SYM("cuMemHostRegister", PFN_cuMemHostRegister_v6050, fake_host_register);
    FAKE_SYM("cuMemHostUnregister", PFN_cuMemHostUnregister_v4000, fake_host_unregister);
    FAKE_SYM("cuDeviceGetPCIBusId", PFN_cuDeviceGetPCIBusId_v4010, fake_pci_bus_id);
    if (status)
        *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return CUDA_SUCCESS; /* as the driver: success with a NULL pfn */
found:
    if (status)
        *status = CU_GET_PROC_ADDRESS_SUCCESS;
    return CUDA_SUCCESS;
}

__attribute__((destructor)) static void fake_report(void) {
    if (n_allocs || n_maps || n_resv || n_streams || n_retains || n_host_regs)
        fprintf(stderr,
                "fake libcuda: leak: %u allocations (%zu bytes), %u mappings, %u reservations, "
                "%u streams, %u context retains, %u host registrations\n",
                n_allocs, used_bytes, n_maps, n_resv, n_streams, n_retains, n_host_regs);
}
