/* vmm_cuda.c - the CUDA backend of vmm/: KV pages are CUDA VMM allocations.
 *
 * Built only by `make cuda` (WITH_CUDA=1); the default build links
 * vmm/vmm_cuda_stub.c instead. <cuda.h> and <cudaTypedefs.h> are included
 * for types only: libcuda is never linked, so one binary runs on machines
 * with and without a GPU. vmm_cuda_backend_create() dlopen()s libcuda.so.1,
 * dlsym()s one symbol, cuGetProcAddress_v2 (what <cuda.h> #defines
 * cuGetProcAddress to since CUDA 12.0; it takes the CUdriverProcAddressQueryResult
 * out-argument), and asks it for every other entry point by base name at a
 * pinned ABI version, VMM_CUDA_ABI (see there).
 *
 * The backend maps the vtable of vmm_backend.h onto the Virtual Memory
 * Management section of the CUDA Driver API (CUDA Driver API reference,
 * "Virtual Memory Management", https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__VA.html;
 * CUDA C++ Programming Guide, "Virtual Memory Management"):
 *   granularity  cuMemGetAllocationGranularity(MINIMUM) for pinned device
 *                memory on this device (2 MiB on Hopper)
 *   reserve      cuMemAddressReserve (aligned to the granularity)
 *   release      cuMemAddressFree
 *   phys_alloc   cuMemCreate x n, all or nothing
 *   map          cuMemMap + cuMemSetAccess(READWRITE for this device)
 *   map_span     n x cuMemMap, then one cuMemSetAccess over the n pages
 *   unmap        cuMemUnmap, one call per page
 *   copy         cuMemcpyDtoDAsync on the backend's stream + synchronize
 *
 * Sharing: one physical allocation handle may be mapped at any number of
 * reserved addresses at once (cuMemMap only requires the target range to be
 * reserved and unmapped; the allocation lives until every mapping is unmapped
 * and the handle released, see cuMemRelease/cuMemUnmap in that section).
 * That is how a prefix page is shared between sequences, and it is also how
 * copy() works: handles are opaque, so phys_alloc() maps every page once more
 * into a private "pool view" of n*P bytes, page i at view + i*P, and copy()
 * addresses pages through it. A handle -> index table, sorted by handle, finds
 * i. Access is set once for the whole view (one cuMemSetAccess over a span of
 * many mappings is allowed and much cheaper than n calls), and the view is
 * zeroed once, so a fresh page reads as zeros, as on the host backend.
 *
 * Every CUresult goes through vmm_cu_err(), which logs the driver's error
 * name and the call, then maps it with vmm_cu_errno() (vmm/vmm_cuda_err.c).
 *
 * The primary context of the device is retained, so the engine, cuBLAS and
 * the CUDA runtime all share one context. Every operation makes it current
 * on the calling thread first (a thread-local store in the driver), because
 * vmm.c may call from a map-ahead thread.
 *
 * Thread safety: none inside; vmm.c serializes calls (vmm_backend.h).
 */
#include "vmm/vmm_backend.h"
#include "vmm/vmm_cuda_util.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log.h"
#include "mem.h"

/* The ABI version asked of cuGetProcAddress for every entry point. Each PFN_
 * type below is the signature in effect at CUDA 12.0, and cuGetProcAddress
 * returns the newest variant not newer than the version asked, so asking for
 * 12000 pins the signatures this file was compiled against even under a
 * newer driver. It must not be CUDA_VERSION (13000 with these headers): a
 * 12.x driver answers CUDA_ERROR_INVALID_VALUE for a version newer than
 * itself. 12.0 is also the first driver with cuGetProcAddress_v2. */
#define VMM_CUDA_ABI 12000

/* The numeric codes vmm_cu_errno() relies on, checked against this header. */
_Static_assert(CUDA_SUCCESS == 0, "CUresult value");
_Static_assert(CUDA_ERROR_INVALID_VALUE == 1, "CUresult value");
_Static_assert(CUDA_ERROR_OUT_OF_MEMORY == 2, "CUresult value");
_Static_assert(CUDA_ERROR_NO_DEVICE == 100, "CUresult value");
_Static_assert(CUDA_ERROR_INVALID_DEVICE == 101, "CUresult value");
_Static_assert(CUDA_ERROR_NOT_SUPPORTED == 801, "CUresult value");
_Static_assert(sizeof(CUmemGenericAllocationHandle) == sizeof(uint64_t), "handle fits");
_Static_assert(sizeof(CUdeviceptr) == sizeof(uintptr_t), "CUdeviceptr is an address");

/* Driver entry points, resolved by vmm_cuda_resolve(). */
struct vmm_cuda_fns {
    PFN_cuInit_v2000 init;
    PFN_cuDeviceGet_v2000 device_get;
    PFN_cuDeviceGetAttribute_v2000 device_get_attribute;
    PFN_cuDevicePrimaryCtxRetain_v7000 primary_ctx_retain;
    PFN_cuDevicePrimaryCtxRelease_v11000 primary_ctx_release;
    PFN_cuCtxSetCurrent_v4000 ctx_set_current;
    PFN_cuGetErrorName_v6000 get_error_name;
    PFN_cuGetErrorString_v6000 get_error_string;
    PFN_cuMemGetAllocationGranularity_v10020 mem_get_allocation_granularity;
    PFN_cuMemAddressReserve_v10020 mem_address_reserve;
    PFN_cuMemAddressFree_v10020 mem_address_free;
    PFN_cuMemCreate_v10020 mem_create;
    PFN_cuMemRelease_v10020 mem_release;
    PFN_cuMemMap_v10020 mem_map;
    PFN_cuMemUnmap_v10020 mem_unmap;
    PFN_cuMemSetAccess_v10020 mem_set_access;
    PFN_cuStreamCreate_v2000 stream_create;
    PFN_cuStreamDestroy_v4000 stream_destroy;
    PFN_cuStreamSynchronize_v2000 stream_synchronize;
    PFN_cuMemcpyDtoDAsync_v3020 memcpy_dtod_async;
    PFN_cuMemcpyHtoDAsync_v3020 memcpy_htod_async;
    PFN_cuMemcpyDtoHAsync_v3020 memcpy_dtoh_async;
    PFN_cuMemsetD8Async_v3020 memset_d8_async;
    /* optional (NULL when the driver lacks them): the host tier's pinning */
    PFN_cuMemHostRegister_v6050 mem_host_register;
    PFN_cuMemHostUnregister_v4000 mem_host_unregister;
    PFN_cuDeviceGetPCIBusId_v4010 device_get_pci_bus_id;
};

/* Base names as cuGetProcAddress wants them (no _v2 suffix: the version
 * argument picks the variant). */
static const struct {
    const char *sym;
    size_t off;
} vmm_cuda_syms[] = {
    {"cuInit", offsetof(struct vmm_cuda_fns, init)},
    {"cuDeviceGet", offsetof(struct vmm_cuda_fns, device_get)},
    {"cuDeviceGetAttribute", offsetof(struct vmm_cuda_fns, device_get_attribute)},
    {"cuDevicePrimaryCtxRetain", offsetof(struct vmm_cuda_fns, primary_ctx_retain)},
    {"cuDevicePrimaryCtxRelease", offsetof(struct vmm_cuda_fns, primary_ctx_release)},
    {"cuCtxSetCurrent", offsetof(struct vmm_cuda_fns, ctx_set_current)},
    {"cuGetErrorName", offsetof(struct vmm_cuda_fns, get_error_name)},
    {"cuGetErrorString", offsetof(struct vmm_cuda_fns, get_error_string)},
    {"cuMemGetAllocationGranularity",
     offsetof(struct vmm_cuda_fns, mem_get_allocation_granularity)},
    {"cuMemAddressReserve", offsetof(struct vmm_cuda_fns, mem_address_reserve)},
    {"cuMemAddressFree", offsetof(struct vmm_cuda_fns, mem_address_free)},
    {"cuMemCreate", offsetof(struct vmm_cuda_fns, mem_create)},
    {"cuMemRelease", offsetof(struct vmm_cuda_fns, mem_release)},
    {"cuMemMap", offsetof(struct vmm_cuda_fns, mem_map)},
    {"cuMemUnmap", offsetof(struct vmm_cuda_fns, mem_unmap)},
    {"cuMemSetAccess", offsetof(struct vmm_cuda_fns, mem_set_access)},
    {"cuStreamCreate", offsetof(struct vmm_cuda_fns, stream_create)},
    {"cuStreamDestroy", offsetof(struct vmm_cuda_fns, stream_destroy)},
    {"cuStreamSynchronize", offsetof(struct vmm_cuda_fns, stream_synchronize)},
    {"cuMemcpyDtoDAsync", offsetof(struct vmm_cuda_fns, memcpy_dtod_async)},
    {"cuMemcpyHtoDAsync", offsetof(struct vmm_cuda_fns, memcpy_htod_async)},
    {"cuMemcpyDtoHAsync", offsetof(struct vmm_cuda_fns, memcpy_dtoh_async)},
    {"cuMemsetD8Async", offsetof(struct vmm_cuda_fns, memset_d8_async)},
};

/* Entry points the backend works without (their functions answer -ENOTSUP). */
static const struct {
    const char *sym;
    size_t off;
} vmm_cuda_opt_syms[] = {
    {"cuMemHostRegister", offsetof(struct vmm_cuda_fns, mem_host_register)},
    {"cuMemHostUnregister", offsetof(struct vmm_cuda_fns, mem_host_unregister)},
    {"cuDeviceGetPCIBusId", offsetof(struct vmm_cuda_fns, device_get_pci_bus_id)},
};

/* One entry of the handle -> pool index table. */
struct vmm_cuda_slot {
    CUmemGenericAllocationHandle handle;
    uint32_t i; /* page index in the pool view */
};

struct vmm_cuda {
    struct vmm_backend b; /* first: b.priv points back here */
    void *lib;            /* dlopen() handle of libcuda.so.1 */
    struct vmm_cuda_fns fn;
    CUdevice dev;
    CUcontext ctx; /* the device's primary context, retained */
    CUstream stream;
    size_t gran_bytes;
    CUmemAllocationProp prop; /* pinned device memory on dev */
    CUmemAccessDesc access;   /* read-write for dev */
    /* The pool, set by phys_alloc(): n_pages handles, each mapped once more
     * at view + i * b.page_bytes. */
    uint32_t n_pages;
    CUdeviceptr view;
    struct vmm_cuda_slot *slots; /* [n_pages], sorted by handle */
    /* Timings of the last successful map(), for vmm_cuda_map_split_ns(). */
    bool mapped_once;
    uint64_t last_map_ns;
    uint64_t last_access_ns;
};

static const struct vmm_backend_ops vmm_cuda_ops;

/* The error-name functions of the loaded driver, for vmm_cu_err(), which has
 * no backend at hand. Process-wide: every backend loads the same libcuda,
 * and RTLD_NODELETE keeps it mapped, so the pointers never dangle. */
static _Atomic(PFN_cuGetErrorName_v6000) vmm_cu_error_name;
static _Atomic(PFN_cuGetErrorString_v6000) vmm_cu_error_string;

/* Why the last create on this thread failed (vmm_cuda_why_unavailable()). */
static _Thread_local char vmm_cuda_why[256];

static struct vmm_cuda *vmm_cuda_of(struct vmm_backend *b) {
    return b->priv;
}

static uint64_t vmm_cuda_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static const char *vmm_cu_name(CUresult r) {
    PFN_cuGetErrorName_v6000 fn = atomic_load(&vmm_cu_error_name);
    const char *name = NULL;
    if (!fn || fn(r, &name) != CUDA_SUCCESS || !name)
        return "CUDA_ERROR_(unknown)";
    return name;
}

/* The one mapper of CUresult: logs the driver's error name, its text and the
 * call that failed, then returns vmm_cu_errno(r). Returns 0 for success
 * without logging. */
static int vmm_cu_err(CUresult r, const char *what) {
    if (r == CUDA_SUCCESS)
        return 0;
    PFN_cuGetErrorString_v6000 str_fn = atomic_load(&vmm_cu_error_string);
    const char *text = NULL;
    if (!str_fn || str_fn(r, &text) != CUDA_SUCCESS || !text)
        text = "";
    LOG_ERROR("vmm", "cuda: %s failed: %s (%d) %s", what, vmm_cu_name(r), (int)r, text);
    return vmm_cu_errno((int)r);
}

/* Record why create failed, and say it once on stderr (warn level: the
 * caller usually falls back to the host backend, and the operator should
 * learn why). Returns rc. */
__attribute__((format(printf, 2, 3))) static int vmm_cuda_fail(int rc, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(vmm_cuda_why, sizeof(vmm_cuda_why), fmt, ap);
    va_end(ap);
    LOG_WARN("vmm", "cuda backend unavailable: %s", vmm_cuda_why);
    return rc;
}

/* Make the backend's context current on this thread. */
static int vmm_cuda_ctx(struct vmm_cuda *c) {
    return vmm_cu_err(c->fn.ctx_set_current(c->ctx), "cuCtxSetCurrent");
}

/* dlopen libcuda.so.1 and resolve vmm_cuda_syms into c->fn. Returns 0 or
 * -ENOTSUP (no driver, or one older than 12.0 / lacking a symbol). */
static int vmm_cuda_resolve(struct vmm_cuda *c) {
    /* RTLD_NODELETE: dlclose() in destroy drops our reference but never
     * unmaps the driver. Unloading libcuda while its worker threads and
     * atexit handlers are live is unsafe, and a second backend in the same
     * process would otherwise re-initialize the driver from scratch. */
    c->lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    if (!c->lib)
        return vmm_cuda_fail(-ENOTSUP, "no CUDA driver (libcuda.so.1 not found): %s", dlerror());

    PFN_cuGetProcAddress_v12000 get_proc;
    void *sym = dlsym(c->lib, "cuGetProcAddress_v2");
    if (!sym) {
        dlclose(c->lib);
        c->lib = NULL;
        return vmm_cuda_fail(-ENOTSUP,
                             "CUDA driver too old (no cuGetProcAddress_v2; needs 12.0 or newer)");
    }
    _Static_assert(sizeof(sym) == sizeof(get_proc), "data and function pointers differ");
    memcpy(&get_proc, &sym, sizeof(sym)); /* POSIX: dlsym returns code addresses */

    for (size_t i = 0; i < sizeof(vmm_cuda_syms) / sizeof(vmm_cuda_syms[0]); i++) {
        void *p = NULL;
        CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        CUresult r = get_proc(vmm_cuda_syms[i].sym, &p, VMM_CUDA_ABI,
                              CU_GET_PROC_ADDRESS_LEGACY_STREAM, &st);
        if (r != CUDA_SUCCESS || st != CU_GET_PROC_ADDRESS_SUCCESS || !p) {
            dlclose(c->lib);
            c->lib = NULL;
            return vmm_cuda_fail(-ENOTSUP,
                                 "CUDA driver lacks %s for ABI %d (CUresult %d, status %d)",
                                 vmm_cuda_syms[i].sym, VMM_CUDA_ABI, (int)r, (int)st);
        }
        memcpy((char *)&c->fn + vmm_cuda_syms[i].off, &p, sizeof(p));
    }
    for (size_t i = 0; i < sizeof(vmm_cuda_opt_syms) / sizeof(vmm_cuda_opt_syms[0]); i++) {
        void *p = NULL;
        CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        CUresult r = get_proc(vmm_cuda_opt_syms[i].sym, &p, VMM_CUDA_ABI,
                              CU_GET_PROC_ADDRESS_LEGACY_STREAM, &st);
        if (r == CUDA_SUCCESS && st == CU_GET_PROC_ADDRESS_SUCCESS && p)
            memcpy((char *)&c->fn + vmm_cuda_opt_syms[i].off, &p, sizeof(p));
    }
    atomic_store(&vmm_cu_error_name, c->fn.get_error_name);
    atomic_store(&vmm_cu_error_string, c->fn.get_error_string);
    return 0;
}

/* cuInit and the device checks. Returns 0, -ENOTSUP (no device, or no VMM
 * support), -EINVAL (ordinal out of range), -EIO. */
static int vmm_cuda_device_open(struct vmm_cuda *c, int ordinal) {
    CUresult r = c->fn.init(0);
    if (r == CUDA_ERROR_NO_DEVICE)
        return vmm_cuda_fail(-ENOTSUP, "no CUDA device");
    if (r != CUDA_SUCCESS)
        return vmm_cuda_fail(vmm_cu_err(r, "cuInit"), "cuInit failed: %s", vmm_cu_name(r));

    r = c->fn.device_get(&c->dev, ordinal);
    if (r != CUDA_SUCCESS)
        return vmm_cuda_fail(vmm_cu_err(r, "cuDeviceGet"), "no CUDA device %d: %s", ordinal,
                             vmm_cu_name(r));

    int vmm_ok = 0;
    r = c->fn.device_get_attribute(&vmm_ok, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                                   c->dev);
    if (r != CUDA_SUCCESS)
        return vmm_cuda_fail(vmm_cu_err(r, "cuDeviceGetAttribute"),
                             "cuDeviceGetAttribute(VMM) failed: %s", vmm_cu_name(r));
    if (!vmm_ok)
        return vmm_cuda_fail(-ENOTSUP, "CUDA device %d has no virtual memory management", ordinal);
    return 0;
}

int vmm_cuda_backend_create(int ordinal, struct vmm_backend **out) {
    int rc;
    CUresult r;

    vmm_cuda_why[0] = '\0';
    if (!out || ordinal < 0)
        return vmm_cuda_fail(-EINVAL, "bad arguments (ordinal %d)", ordinal);
    struct vmm_cuda *c = mem_calloc(MEM_VMM, 1, sizeof(*c));
    if (!c)
        return vmm_cuda_fail(-ENOMEM, "out of host memory");
    c->b.ops = &vmm_cuda_ops;
    c->b.priv = c;

    rc = vmm_cuda_resolve(c);
    if (rc)
        goto fail_free;
    rc = vmm_cuda_device_open(c, ordinal);
    if (rc)
        goto fail_close;

    r = c->fn.primary_ctx_retain(&c->ctx, c->dev);
    if (r != CUDA_SUCCESS) {
        rc = vmm_cuda_fail(vmm_cu_err(r, "cuDevicePrimaryCtxRetain"),
                           "cuDevicePrimaryCtxRetain failed: %s", vmm_cu_name(r));
        goto fail_close;
    }
    rc = vmm_cuda_ctx(c);
    if (rc)
        goto fail_ctx;

    c->prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    c->prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
    c->prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    c->prop.location.id = c->dev;
    c->access.location = c->prop.location;
    c->access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    /* MINIMUM, not RECOMMENDED: the two are equal (2 MiB) on current GPUs,
     * and pages are sized by the pool, which may round up further. */
    r = c->fn.mem_get_allocation_granularity(&c->gran_bytes, &c->prop,
                                             CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    if (r != CUDA_SUCCESS || c->gran_bytes == 0) {
        rc = r ? vmm_cu_err(r, "cuMemGetAllocationGranularity") : -EIO;
        vmm_cuda_fail(rc, "cuMemGetAllocationGranularity failed: %s", vmm_cu_name(r));
        goto fail_ctx;
    }
    /* Non-blocking: copies must not serialize with the legacy default
     * stream that other code in the process may use. */
    r = c->fn.stream_create(&c->stream, CU_STREAM_NON_BLOCKING);
    if (r != CUDA_SUCCESS) {
        rc = vmm_cuda_fail(vmm_cu_err(r, "cuStreamCreate"), "cuStreamCreate failed: %s",
                           vmm_cu_name(r));
        goto fail_ctx;
    }
    LOG_INFO("vmm", "cuda: device %d, granularity %zu bytes", ordinal, c->gran_bytes);
    *out = &c->b;
    return 0;

fail_ctx:
    c->fn.primary_ctx_release(c->dev);
fail_close:
    dlclose(c->lib);
fail_free:
    mem_free(c);
    return rc;
}

static size_t vmm_cuda_granularity(struct vmm_backend *b) {
    return vmm_cuda_of(b)->gran_bytes;
}

static int vmm_cuda_reserve(struct vmm_backend *b, size_t bytes, uintptr_t *va) {
    struct vmm_cuda *c = vmm_cuda_of(b);
    if (!va || bytes == 0 || bytes % c->gran_bytes != 0)
        return -EINVAL;
    int rc = vmm_cuda_ctx(c);
    if (rc)
        return rc;
    CUdeviceptr p = 0;
    rc = vmm_cu_err(c->fn.mem_address_reserve(&p, bytes, c->gran_bytes, 0, 0),
                    "cuMemAddressReserve");
    if (rc)
        return rc;
    *va = (uintptr_t)p;
    return 0;
}

static void vmm_cuda_release(struct vmm_backend *b, uintptr_t va, size_t bytes) {
    struct vmm_cuda *c = vmm_cuda_of(b);
    if (va == 0 || vmm_cuda_ctx(c))
        return;
    vmm_cu_err(c->fn.mem_address_free((CUdeviceptr)va, bytes), "cuMemAddressFree");
}

static int vmm_cuda_slot_cmp(const void *a, const void *b) {
    CUmemGenericAllocationHandle x = ((const struct vmm_cuda_slot *)a)->handle;
    CUmemGenericAllocationHandle y = ((const struct vmm_cuda_slot *)b)->handle;
    return (x > y) - (x < y);
}

/* Index of handle h in the pool view, or -1 if h is not one of its pages. */
static int64_t vmm_cuda_slot_find(const struct vmm_cuda *c, uint64_t h) {
    struct vmm_cuda_slot key = {.handle = h};
    const struct vmm_cuda_slot *s =
        c->n_pages ? bsearch(&key, c->slots, c->n_pages, sizeof(key), vmm_cuda_slot_cmp) : NULL;
    return s ? (int64_t)s->i : -1;
}

/* Unmap pages [0, n) of the view, one cuMemUnmap per page: the driver
 * unmaps whole mappings only ("cannot unmap a sub-range", cuMemUnmap docs),
 * and each page was mapped by its own cuMemMap. */
static void vmm_cuda_view_unmap(struct vmm_cuda *c, size_t page_bytes, uint32_t n) {
    for (uint32_t i = 0; i < n; i++)
        vmm_cu_err(c->fn.mem_unmap(c->view + (CUdeviceptr)i * page_bytes, page_bytes),
                   "cuMemUnmap(view)");
}

/* Create the pool: n pages of page_bytes, mapped once into the view, zeroed.
 * All or nothing. -EINVAL (size not a granularity multiple, n == 0, or
 * n * page_bytes overflows), -EBUSY (this backend already has a pool),
 * -ENOMEM (device or host memory), -EIO. Blocks until the zeroing is done. */
static int vmm_cuda_phys_alloc(struct vmm_backend *b, size_t page_bytes, uint32_t n,
                               uint64_t *handles) {
    struct vmm_cuda *c = vmm_cuda_of(b);
    if (!handles || n == 0 || page_bytes == 0 || page_bytes % c->gran_bytes != 0 ||
        page_bytes > SIZE_MAX / n)
        return -EINVAL;
    if (c->n_pages != 0) {
        LOG_ERROR("vmm", "cuda: phys_alloc called twice on one backend");
        return -EBUSY;
    }
    size_t view_bytes = page_bytes * n;
    uint32_t n_created = 0, n_mapped = 0;
    struct vmm_cuda_slot *slots = mem_calloc(MEM_VMM, n, sizeof(*slots));
    if (!slots)
        return -ENOMEM;
    int rc = vmm_cuda_ctx(c);
    if (rc)
        goto fail_slots;

    for (; n_created < n; n_created++) {
        CUmemGenericAllocationHandle h;
        rc = vmm_cu_err(c->fn.mem_create(&h, page_bytes, &c->prop, 0), "cuMemCreate");
        if (rc)
            goto fail_release;
        slots[n_created] = (struct vmm_cuda_slot){.handle = h, .i = n_created};
    }
    rc = vmm_cu_err(c->fn.mem_address_reserve(&c->view, view_bytes, c->gran_bytes, 0, 0),
                    "cuMemAddressReserve(view)");
    if (rc)
        goto fail_release;
    for (; n_mapped < n; n_mapped++) {
        rc = vmm_cu_err(c->fn.mem_map(c->view + (CUdeviceptr)n_mapped * page_bytes, page_bytes, 0,
                                      slots[n_mapped].handle, 0),
                        "cuMemMap(view)");
        if (rc)
            goto fail_unmap;
    }
    rc = vmm_cu_err(c->fn.mem_set_access(c->view, view_bytes, &c->access, 1),
                    "cuMemSetAccess(view)");
    if (rc)
        goto fail_unmap;
    rc = vmm_cu_err(c->fn.memset_d8_async(c->view, 0, view_bytes, c->stream), "cuMemsetD8Async");
    if (!rc)
        rc = vmm_cu_err(c->fn.stream_synchronize(c->stream), "cuStreamSynchronize");
    if (rc)
        goto fail_unmap;

    for (uint32_t i = 0; i < n; i++)
        handles[i] = slots[i].handle;
    qsort(slots, n, sizeof(*slots), vmm_cuda_slot_cmp);
    c->slots = slots;
    c->n_pages = n;
    b->page_bytes = page_bytes;
    return 0;

fail_unmap:
    vmm_cuda_view_unmap(c, page_bytes, n_mapped);
    vmm_cu_err(c->fn.mem_address_free(c->view, view_bytes), "cuMemAddressFree(view)");
    c->view = 0;
fail_release:
    for (uint32_t i = 0; i < n_created; i++)
        vmm_cu_err(c->fn.mem_release(slots[i].handle), "cuMemRelease");
fail_slots:
    mem_free(slots);
    return rc;
}

/* Tear the pool down: unmap the view, release every handle, free the view.
 * The handles come from our own table, the authoritative list. */
static void vmm_cuda_pool_free(struct vmm_cuda *c) {
    if (c->n_pages == 0 || vmm_cuda_ctx(c))
        return;
    size_t page_bytes = c->b.page_bytes;
    vmm_cuda_view_unmap(c, page_bytes, c->n_pages);
    vmm_cu_err(c->fn.mem_address_free(c->view, page_bytes * c->n_pages), "cuMemAddressFree(view)");
    for (uint32_t i = 0; i < c->n_pages; i++)
        vmm_cu_err(c->fn.mem_release(c->slots[i].handle), "cuMemRelease");
    mem_free(c->slots);
    c->slots = NULL;
    c->n_pages = 0;
    c->view = 0;
    c->b.page_bytes = 0;
}

static void vmm_cuda_phys_free(struct vmm_backend *b, const uint64_t *handles, uint32_t n) {
    struct vmm_cuda *c = vmm_cuda_of(b);
    if (NEVER(n != c->n_pages))
        LOG_ERROR("vmm", "cuda: phys_free of %u pages, the pool has %u", n, c->n_pages);
    for (uint32_t i = 0; handles && i < n; i++)
        if (NEVER(vmm_cuda_slot_find(c, handles[i]) < 0))
            LOG_ERROR("vmm", "cuda: phys_free of a foreign handle %#llx",
                      (unsigned long long)handles[i]);
    vmm_cuda_pool_free(c);
}

static int vmm_cuda_map(struct vmm_backend *b, uintptr_t va, uint64_t handle) {
    struct vmm_cuda *c = vmm_cuda_of(b);
    size_t page_bytes = b->page_bytes;
    if (page_bytes == 0 || va == 0 || va % c->gran_bytes != 0 || vmm_cuda_slot_find(c, handle) < 0)
        return -EINVAL;
    int rc = vmm_cuda_ctx(c);
    if (rc)
        return rc;
    uint64_t t0 = vmm_cuda_now_ns();
    rc = vmm_cu_err(c->fn.mem_map((CUdeviceptr)va, page_bytes, 0, handle, 0), "cuMemMap");
    if (rc)
        return rc;
    uint64_t t1 = vmm_cuda_now_ns();
    /* Every new mapping starts inaccessible (cuMemUnmap docs), even when the
     * same handle is already accessible at another address. */
    rc = vmm_cu_err(c->fn.mem_set_access((CUdeviceptr)va, page_bytes, &c->access, 1),
                    "cuMemSetAccess");
    uint64_t t2 = vmm_cuda_now_ns();
    if (rc) {
        vmm_cu_err(c->fn.mem_unmap((CUdeviceptr)va, page_bytes), "cuMemUnmap");
        return rc;
    }
    c->mapped_once = true;
    c->last_map_ns = t1 - t0;
    c->last_access_ns = t2 - t1;
    return 0;
}

/* n pages at va, one cuMemMap each (each page stays its own mapping, so
 * unmap and sharing work per page as before), then access set once over
 * the span: cuMemSetAccess takes any range of whole mappings, and one call
 * costs about what one page's call costs (DESIGN §3: tens of microseconds
 * each on an A100), so a grow of n pages saves n - 1 of them. On a failure
 * every page this call mapped is unmapped again. */
static int vmm_cuda_map_span(struct vmm_backend *b, uintptr_t va, const uint64_t *handles,
                             uint32_t n) {
    struct vmm_cuda *c = vmm_cuda_of(b);
    size_t page_bytes = b->page_bytes;
    if (page_bytes == 0 || va == 0 || va % c->gran_bytes != 0 || n == 0 || !handles)
        return -EINVAL;
    for (uint32_t k = 0; k < n; k++)
        if (vmm_cuda_slot_find(c, handles[k]) < 0)
            return -EINVAL;
    int rc = vmm_cuda_ctx(c);
    if (rc)
        return rc;
    uint32_t k; /* pages mapped */
    for (k = 0; k < n; k++)
        if ((rc = vmm_cu_err(
                 c->fn.mem_map((CUdeviceptr)(va + k * page_bytes), page_bytes, 0, handles[k], 0),
                 "cuMemMap")) != 0)
            break;
    if (rc == 0)
        rc =
            vmm_cu_err(c->fn.mem_set_access((CUdeviceptr)va, (size_t)n * page_bytes, &c->access, 1),
                       "cuMemSetAccess");
    if (rc) {
        for (uint32_t i = 0; i < k; i++)
            vmm_cu_err(c->fn.mem_unmap((CUdeviceptr)(va + i * page_bytes), page_bytes),
                       "cuMemUnmap");
        return rc;
    }
    return 0;
}

/* One cuMemUnmap per page: each page was mapped by its own cuMemMap, and
 * the driver requires unmapping whole mappings. Carries on past a failure
 * so as much as possible is unmapped, and returns the first error. */
static int vmm_cuda_unmap(struct vmm_backend *b, uintptr_t va, size_t bytes) {
    struct vmm_cuda *c = vmm_cuda_of(b);
    size_t page_bytes = b->page_bytes;
    if (page_bytes == 0 || va == 0 || bytes == 0 || va % c->gran_bytes != 0 ||
        bytes % page_bytes != 0)
        return -EINVAL;
    int rc = vmm_cuda_ctx(c);
    if (rc)
        return rc;
    for (size_t off = 0; off < bytes; off += page_bytes) {
        int e = vmm_cu_err(c->fn.mem_unmap((CUdeviceptr)(va + off), page_bytes), "cuMemUnmap");
        if (e && !rc)
            rc = e;
    }
    return rc;
}

static int vmm_cuda_copy(struct vmm_backend *b, uint64_t dst, uint64_t src) {
    struct vmm_cuda *c = vmm_cuda_of(b);
    int64_t id = vmm_cuda_slot_find(c, dst), is = vmm_cuda_slot_find(c, src);
    if (id < 0 || is < 0)
        return -EINVAL;
    if (id == is)
        return 0;
    int rc = vmm_cuda_ctx(c);
    if (rc)
        return rc;
    size_t page_bytes = b->page_bytes;
    rc = vmm_cu_err(c->fn.memcpy_dtod_async(c->view + (CUdeviceptr)id * page_bytes,
                                            c->view + (CUdeviceptr)is * page_bytes, page_bytes,
                                            c->stream),
                    "cuMemcpyDtoDAsync");
    if (rc)
        return rc;
    return vmm_cu_err(c->fn.stream_synchronize(c->stream), "cuStreamSynchronize");
}

static int vmm_cuda_xfer(struct vmm_backend *b, uint64_t handle, void *host, bool to_page) {
    struct vmm_cuda *c = vmm_cuda_of(b);
    int64_t i = vmm_cuda_slot_find(c, handle);
    if (i < 0 || !host)
        return -EINVAL;
    int rc = vmm_cuda_ctx(c);
    if (rc)
        return rc;
    CUdeviceptr page = c->view + (CUdeviceptr)i * b->page_bytes;
    if (to_page)
        rc = vmm_cu_err(c->fn.memcpy_htod_async(page, host, b->page_bytes, c->stream),
                        "cuMemcpyHtoDAsync");
    else
        rc = vmm_cu_err(c->fn.memcpy_dtoh_async(host, page, b->page_bytes, c->stream),
                        "cuMemcpyDtoHAsync");
    if (rc)
        return rc;
    return vmm_cu_err(c->fn.stream_synchronize(c->stream), "cuStreamSynchronize");
}

static void vmm_cuda_destroy(struct vmm_backend *b) {
    if (!b)
        return;
    struct vmm_cuda *c = vmm_cuda_of(b);
    if (NEVER(c->n_pages != 0)) {
        LOG_ERROR("vmm", "cuda: destroy with %u pages still allocated; freeing them", c->n_pages);
        vmm_cuda_pool_free(c);
    }
    if (!vmm_cuda_ctx(c))
        vmm_cu_err(c->fn.stream_destroy(c->stream), "cuStreamDestroy");
    vmm_cu_err(c->fn.primary_ctx_release(c->dev), "cuDevicePrimaryCtxRelease");
    dlclose(c->lib);
    mem_free(c);
}

static const struct vmm_backend_ops vmm_cuda_ops = {
    .name = "cuda",
    .granularity = vmm_cuda_granularity,
    .reserve = vmm_cuda_reserve,
    .release = vmm_cuda_release,
    .phys_alloc = vmm_cuda_phys_alloc,
    .phys_free = vmm_cuda_phys_free,
    .map = vmm_cuda_map,
    .map_span = vmm_cuda_map_span,
    .unmap = vmm_cuda_unmap,
    .copy = vmm_cuda_copy,
    .xfer = vmm_cuda_xfer,
    .destroy = vmm_cuda_destroy,
};

/* Host <-> device copies for tests and diagnostics, on the backend's stream. */
int vmm_cuda_memcpy_htod(struct vmm_backend *b, uintptr_t dst, const void *src, size_t n) {
    if (!b || b->ops != &vmm_cuda_ops || (!src && n))
        return -EINVAL;
    if (n == 0)
        return 0;
    struct vmm_cuda *c = vmm_cuda_of(b);
    int rc = vmm_cuda_ctx(c);
    if (!rc)
        rc = vmm_cu_err(c->fn.memcpy_htod_async((CUdeviceptr)dst, src, n, c->stream),
                        "cuMemcpyHtoDAsync");
    if (!rc)
        rc = vmm_cu_err(c->fn.stream_synchronize(c->stream), "cuStreamSynchronize");
    return rc;
}

int vmm_cuda_memcpy_dtoh(struct vmm_backend *b, void *dst, uintptr_t src, size_t n) {
    if (!b || b->ops != &vmm_cuda_ops || (!dst && n))
        return -EINVAL;
    if (n == 0)
        return 0;
    struct vmm_cuda *c = vmm_cuda_of(b);
    int rc = vmm_cuda_ctx(c);
    if (!rc)
        rc = vmm_cu_err(c->fn.memcpy_dtoh_async(dst, (CUdeviceptr)src, n, c->stream),
                        "cuMemcpyDtoHAsync");
    if (!rc)
        rc = vmm_cu_err(c->fn.stream_synchronize(c->stream), "cuStreamSynchronize");
    return rc;
}

int vmm_cuda_map_split_ns(const struct vmm_backend *b, uint64_t *map_ns, uint64_t *access_ns) {
    if (!b || b->ops != &vmm_cuda_ops)
        return -EINVAL;
    const struct vmm_cuda *c = b->priv;
    if (!c->mapped_once)
        return -EINVAL;
    if (map_ns)
        *map_ns = c->last_map_ns;
    if (access_ns)
        *access_ns = c->last_access_ns;
    return 0;
}

int vmm_cuda_host_register(struct vmm_backend *b, void *p, size_t n) {
    if (!b || b->ops != &vmm_cuda_ops || !p || n == 0)
        return -EINVAL;
    struct vmm_cuda *c = vmm_cuda_of(b);
    if (!c->fn.mem_host_register || !c->fn.mem_host_unregister)
        return -ENOTSUP;
    int rc = vmm_cuda_ctx(c);
    return rc ? rc
              : vmm_cu_err(c->fn.mem_host_register(p, n, CU_MEMHOSTREGISTER_PORTABLE),
                           "cuMemHostRegister");
}

void vmm_cuda_host_unregister(struct vmm_backend *b, void *p) {
    if (!b || b->ops != &vmm_cuda_ops || !p)
        return;
    struct vmm_cuda *c = vmm_cuda_of(b);
    if (c->fn.mem_host_unregister && vmm_cuda_ctx(c) == 0)
        vmm_cu_err(c->fn.mem_host_unregister(p), "cuMemHostUnregister");
}

int vmm_cuda_pci_bus_id(struct vmm_backend *b, char *buf, size_t len) {
    if (!b || b->ops != &vmm_cuda_ops || !buf || len < 13 || len > INT32_MAX)
        return -EINVAL;
    struct vmm_cuda *c = vmm_cuda_of(b);
    if (!c->fn.device_get_pci_bus_id)
        return -ENOTSUP;
    return vmm_cu_err(c->fn.device_get_pci_bus_id(buf, (int)len, c->dev), "cuDeviceGetPCIBusId");
}

const char *vmm_cuda_why_unavailable(void) {
    return vmm_cuda_why;
}
