/* vmm_backend.h - the small vtable under vmm/: where physical KV pages come
 * from and how they are mapped into reserved virtual ranges.
 *
 * Model: a backend hands out (1) virtual address ranges with no memory behind
 * them (reserve/release), (2) physical pages, all of one size, created once
 * for the pool (phys_alloc/phys_free), and (3) mappings of one physical page
 * at a page-aligned address inside a reservation (map/unmap). Reserving VA
 * and mapping memory are separate steps, as in CUDA VMM
 * (cuMemAddressReserve / cuMemCreate / cuMemMap, CUDA Driver API §6.14
 * "Virtual Memory Management") and as in jemalloc's extent hooks (alloc vs
 * commit). The same physical page may be mapped at several addresses at once:
 * that is how prefix pages are shared between sequences.
 *
 * Backends: "host" (memfd + mmap(MAP_FIXED), vmm/vmm_host.c) and "cuda"
 * (driver API through dlopen, vmm/cuda/vmm_cuda.c, built by `make cuda`; the
 * default build links vmm/vmm_cuda_stub.c, whose create returns -ENOTSUP).
 *
 * Thread safety: a backend is not thread-safe; vmm.c serializes every call
 * under the pool lock. No call blocks on I/O. Errors are 0 / -errno.
 */
#ifndef LLMD_VMM_BACKEND_H
#define LLMD_VMM_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct vmm_backend;

/* Eleven slots: the eight the design names, xfer for offload/, destroy
 * (past STYLE's eight: a page's bytes must cross to the host somehow), and
 * the optional map_span (DESIGN §3: set access once per contiguous span).
 * `b` is always first.
 * Handles are backend-defined 64-bit values (host: page index in the memfd;
 * cuda: CUmemGenericAllocationHandle). Addresses are uintptr_t (host: process
 * VA; cuda: CUdeviceptr). */
struct vmm_backend_ops {
    const char *name;
    /* Smallest mappable unit in bytes (host: the page size of the memfd,
     * 4 KiB or 2 MiB with huge pages; cuda: cuMemGetAllocationGranularity
     * with CU_MEM_ALLOC_GRANULARITY_MINIMUM). Page sizes are multiples. */
    size_t (*granularity)(struct vmm_backend *b);
    /* Reserve `bytes` (a multiple of granularity) of inaccessible VA.
     * -ENOMEM when the address space is exhausted. */
    int (*reserve)(struct vmm_backend *b, size_t bytes, uintptr_t *va);
    /* Give back a reservation made by reserve(); every page in it must have
     * been unmapped first. */
    void (*release)(struct vmm_backend *b, uintptr_t va, size_t bytes);
    /* Create the pool's n physical pages of page_bytes each and write their
     * handles to handles[0..n). Called once per pool. All or nothing:
     * -ENOMEM (out of memory), -EINVAL (page_bytes not a granularity
     * multiple). Pages are pre-faulted where the backend can. vmm.c calls
     * it once, before reserve(). New pages must read as zero: with
     * vmm_config.zero_pages, vmm zeroes a page by copy() from one extra page
     * of the pool that is never mapped nor written (host: a fresh memfd is
     * zero; a backend whose new memory is not zero clears it here). */
    int (*phys_alloc)(struct vmm_backend *b, size_t page_bytes, uint32_t n, uint64_t *handles);
    /* Free the n pages created by phys_alloc(); none may still be mapped. */
    void (*phys_free)(struct vmm_backend *b, const uint64_t *handles, uint32_t n);
    /* Map one physical page at va (page-aligned, inside a reservation, not
     * currently mapped), readable and writable. -ENOMEM, -EIO. */
    int (*map)(struct vmm_backend *b, uintptr_t va, uint64_t handle);
    /* (optional, default: map() once per page.) Map the n >= 1 physical
     * pages handles[0..n) (borrowed) at va, va + P, ..., va + (n-1)*P, all
     * inside one reservation and unmapped, readable and writable, with
     * access set once over the whole span (cuda: n cuMemMap, then one
     * cuMemSetAccess; each page stays its own mapping, unmapped as before).
     * All or nothing: on failure no page of the span is left mapped.
     * -EINVAL, -ENOMEM, -EIO. */
    int (*map_span)(struct vmm_backend *b, uintptr_t va, const uint64_t *handles, uint32_t n);
    /* Unmap `bytes` at va (whole pages); the VA stays reserved and becomes
     * inaccessible again. */
    int (*unmap)(struct vmm_backend *b, uintptr_t va, size_t bytes);
    /* Copy the whole contents of physical page src to physical page dst
     * (used by copy-on-write and by offload). Completes before returning
     * (cuda: async on the backend's copy stream, then synchronized). */
    int (*copy)(struct vmm_backend *b, uint64_t dst, uint64_t src);
    /* Copy the whole contents of physical page `handle` to host memory
     * (to_page false: spill) or from it (to_page true: restore); `host` is
     * page_bytes long, any alignment. Completes before returning (cuda:
     * cuMemcpyDtoHAsync/HtoDAsync on the copy stream, then synchronized).
     * Used by offload/. -EINVAL (bad handle), -EIO. */
    int (*xfer)(struct vmm_backend *b, uint64_t handle, void *host, bool to_page);
    /* Free the backend itself (after phys_free and every release). */
    void (*destroy)(struct vmm_backend *b);
};

struct vmm_backend {
    const struct vmm_backend_ops *ops;
    size_t page_bytes; /* set by phys_alloc */
    void *priv;        /* the backend's own state */
};

/* Huge-page policy of the host backend. */
enum vmm_huge {
    VMM_HUGE_AUTO = 0, /* use huge pages when the machine allows (detected) */
    VMM_HUGE_OFF,      /* 4 KiB pages */
    VMM_HUGE_ON,       /* require them: -ENOTSUP if not available */
};

/* Create the host backend. `huge` as above; the kind actually used is
 * reported by vmm_host_huge_kind(). Returns 0, -ENOMEM, -ENOTSUP.
 * The caller destroys it with b->ops->destroy(b) (vmm_destroy does this for
 * a backend it was given). */
int vmm_host_backend_create(enum vmm_huge huge, struct vmm_backend **out);

/* "none", "hugetlb" (MFD_HUGETLB) or "thp" (shmem transparent huge pages).
 * The final kind is known after phys_alloc (AUTO uses THP only when the page
 * size is a multiple of the huge page size, and falls back from hugetlb when
 * the pool does not fit in the free huge pages). */
const char *vmm_host_huge_kind(const struct vmm_backend *b);

/* Host backend knobs and facts. Each takes any backend and does nothing (or
 * returns false/-1) for one that is not the host backend, so vmm.c calls them
 * without knowing which backend it holds. */

/* Allocate every page of the pool in phys_alloc (fallocate of the memfd) so
 * that first use costs no allocation; default off. Call before phys_alloc. */
void vmm_host_prefault_set(struct vmm_backend *b, bool on);

/* True when b's mappings each cost a process mapping (a VMA): then *limit
 * gets vm.max_map_count and *in_use the current count (/proc/self/maps). */
bool vmm_host_map_limits(const struct vmm_backend *b, uint64_t *limit, uint64_t *in_use);

/* True when b's pages are host memory: then *avail gets the bytes the
 * kernel could still give (MemAvailable of /proc/meminfo). */
bool vmm_host_mem_available(const struct vmm_backend *b, uint64_t *avail);

/* The pool's memfd (borrowed; valid until phys_free), or -1. For benchmarks
 * that time raw mmap against vmm on the same file. */
int vmm_host_fd(const struct vmm_backend *b);

/* Create the CUDA backend on device `ordinal`: loads libcuda.so.1 with
 * dlopen and resolves the driver entry points with cuGetProcAddress.
 * Returns 0; -ENOTSUP when llmd was built without CUDA (the stub) or no
 * driver/GPU is present (with a message naming which; the same text is
 * returned by vmm_cuda_why_unavailable(), vmm/vmm_cuda_util.h); -EINVAL for
 * a negative ordinal or one the driver does not know; -EIO with the
 * driver's error name logged for any other CUresult. *out is written only
 * on success. */
int vmm_cuda_backend_create(int ordinal, struct vmm_backend **out);

#endif /* LLMD_VMM_BACKEND_H */
