/* ofl_host.c - the host tier: pinned host memory carved by a jemalloc arena.
 *
 * The region. One anonymous private mapping of the budget (rounded up to
 * 2 MiB, 2 MiB aligned), in this order: madvise(MADV_HUGEPAGE) (fewer TLB
 * misses on 2 MiB page copies, faster faulting); hwloc_set_area_membind(BIND)
 * to the chosen NUMA node, before any page exists, so every page is allocated
 * there; MADV_POPULATE_WRITE (or one write per 4 KiB on kernels before 5.14)
 * to fault it all in now rather than on the first spill; then pinning, the
 * first that works of cfg->pin (PINNED), mlock (MLOCKED), nothing (PLAIN).
 * The memory is never given back to the kernel while the tier lives: purging
 * would unpin it (and MADV_DONTNEED fails on mlocked pages anyway).
 *
 * The arena. jemalloc (a private copy, see tools/jemalloc_private.sh, or in
 * libllmd.so libjemalloc.so.2 opened RTLD_LOCAL: see ofl_je_load) gets an
 * arena from mallctl("arenas.create") with our extent hooks (jemalloc(3),
 * arena.<i>.extent_hooks), which decide where its memory comes from:
 *   alloc     an extent for data (alignment <= 4 KiB): the next `size` bytes
 *             of the region (a cursor from the bottom up), NULL once the
 *             region cannot hold it, which jemalloc turns into a failed
 *             allocation. An extent for jemalloc's own metadata (the arena's
 *             "base" blocks, which it asks for with 2 MiB alignment; our own
 *             requests never ask more than 4 KiB): a plain mmap outside the
 *             region. Metadata is CPU-only bookkeeping that needs no pinning,
 *             and keeping it out of the region leaves all of the budget for
 *             data (stats meta_bytes counts it). ofl_host_alloc checks every
 *             pointer it returns against the region, so a future jemalloc that
 *             asked for data with a large alignment would fail loudly there,
 *             not hand out unpinned memory.
 *   dalloc    region: opt out (return true), so jemalloc keeps the extent as
 *             "retained" and reuses it; metadata: munmap.
 *   split     allowed inside the region; merge allowed when both halves are in
 *             the region.
 *   commit, decommit, purge_lazy, purge_forced: none (NULL opts out): the
 *             memory stays committed and pinned.
 * Decay is immediate for the arena (dirty_decay_ms = muzzy_decay_ms = 0): a
 * freed extent is "purged" at once, every purge hook opts out, and the extent
 * lands in jemalloc's retained set, where it coalesces with its free
 * neighbours and can be split for a request of any size. Left dirty, it would
 * not merge with retained neighbours, and jemalloc refuses to split a dirty
 * extent more than 64 times the request (opt.lg_extent_max_active_fit): a
 * freed 32 MiB extent would serve no 64 KiB allocation (measured: 60 of 512
 * fitted).
 *
 * Priming. jemalloc 5.3 never coalesces across two extents that came from
 * separate alloc-hook calls (each is a "head"), and left to itself it grows an
 * arena in a geometric series of extent sizes (2.5, 3, 3.5, 4, 5, ... MiB),
 * each split into pages with a tail too small for another: measured, 23
 * allocations of 2 MiB fitted in a 62 MiB region that way, where 30 can. So
 * create hands the whole region over at once: it allocates the largest size
 * class that fits what is left, repeats until less than one large size class
 * (16 KiB) is left, and frees them all. The region is then a few large
 * extents (often one: jemalloc first asks for a size of its series rounded up,
 * and takes the whole region when that fits), and from then on all splitting,
 * coalescing and first-fit reuse inside them is jemalloc's.
 *
 * What fits. Each allocation takes its size class (4 per doubling above
 * 16 KiB, so 2 MiB, 2.5 MiB, 3 MiB, ...), and jemalloc 5.3 adds one 4 KiB page
 * to each large (>= 16 KiB) allocation (opt.cache_oblivious, fixed at its
 * build time). N allocations of 2 MiB so need N x (2 MiB + 4 KiB), and the
 * end of each primed extent may lose up to one allocation. Measured with
 * 2 MiB pages (tests/bench/bench_ofl_host.c; at most = budget / (2 MiB + 4 KiB)):
 * 64 MiB 31 of at most 31, 100 MiB 48 of 49, 130 MiB 63 of 64, 500 MiB 247
 * of 249. A budget that is a jemalloc page-size class (2^k, or 1.25, 1.5,
 * 1.75 x 2^k) is primed as a single extent and loses nothing.
 *
 * NUMA (hwloc, one topology per tier): the node is cfg->numa_node, else the
 * one nearest cfg->device_pci_bus_id (the first node of the PCI device's
 * non-I/O ancestor), else the node of the calling thread's CPUs (the node of
 * the CPU it last ran on when its binding spans several). ofl_host_bind_thread
 * binds an I/O thread to that node's CPUs.
 */
#include <assert.h>
#include <dlfcn.h>
#include <errno.h>
#include <hwloc.h>
#include <jemalloc/jemalloc.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "mem.h"
#include "offload/ofl_host.h"

/* The private jemalloc (tools/jemalloc_private.sh): jemalloc's functions of
 * the same names without the prefix. Types and MALLOCX_* macros come from
 * <jemalloc/jemalloc.h>. Weak: libllmd.a carries the copy in this file's
 * archive member, but libllmd.so does not (its initial-exec TLS would make
 * every late dlopen of libllmd.so fail), and there ofl_je_load() falls back
 * to dlopen("libjemalloc.so.2", RTLD_LOCAL), which works when jemalloc was
 * loaded at start-up (linked or LD_PRELOADed) or glibc has static TLS room
 * (GLIBC_TUNABLES=glibc.rtld.optional_static_tls=16384). */
extern void *ofl_je_mallocx(size_t size, int flags) __attribute__((weak));
extern void ofl_je_dallocx(void *ptr, int flags) __attribute__((weak));
extern size_t ofl_je_sallocx(const void *ptr, int flags) __attribute__((weak));
extern size_t ofl_je_nallocx(size_t size, int flags) __attribute__((weak));
extern int ofl_je_mallctl(const char *name, void *oldp, size_t *oldlenp, void *newp, size_t newlen)
    __attribute__((weak));

/* The jemalloc in use, set once by ofl_je_load() before the first tier
 * exists, read-only afterwards. */
static struct {
    void *(*mallocx)(size_t size, int flags);
    void (*dallocx)(void *ptr, int flags);
    size_t (*sallocx)(const void *ptr, int flags);
    size_t (*nallocx)(size_t size, int flags);
    int (*mallctl)(const char *name, void *oldp, size_t *oldlenp, void *newp, size_t newlen);
} je;
static pthread_mutex_t ofl_je_lock = PTHREAD_MUTEX_INITIALIZER;

#define OFL_PAGE ((size_t)4096)
/* Largest alignment a data extent can ask of the hooks: ofl_host_alloc asks
 * at most 4 KiB, and jemalloc aligns large extents to a page. */
#define OFL_DATA_ALIGN_MAX OFL_PAGE
/* Bound on the priming loop: each round takes the largest size class that
 * fits (>= 80% of what is left, classes being 4 per doubling), so even a
 * 1 TiB region is covered in about 20 rounds. */
#define OFL_PRIME_MAX 64

struct ofl_host {
    extent_hooks_t hooks; /* first member: jemalloc hands &hooks back to each hook */
    uint8_t *base;        /* the region [base, base + region_bytes) */
    size_t region_bytes;
    _Atomic size_t cursor; /* region bytes handed to jemalloc, from base up; only grows */
    unsigned arena;
    bool arena_made;
    enum ofl_host_kind kind;
    bool numa_bound;    /* hwloc_set_area_membind succeeded */
    double prefault_ms; /* time to fault the region in */
    int (*pin)(void *ctx, void *addr, size_t bytes);
    void (*unpin)(void *ctx, void *addr, size_t bytes);
    void *pin_ctx;
    hwloc_topology_t topo;
    hwloc_obj_t node; /* NULL: unknown */
    _Atomic uint64_t used_bytes, meta_bytes;
    _Atomic uint64_t allocs_total, frees_total, alloc_failures_total;
};

static void ofl_err(char *errbuf, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void ofl_err(char *errbuf, size_t errlen, const char *fmt, ...) {
    if (!errbuf || errlen == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(errbuf, errlen, fmt, ap);
    va_end(ap);
}

static double ofl_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Choose the jemalloc: the private copy when it is linked in, else
 * libjemalloc.so.2 through dlopen (see the declarations above). Once per
 * process; later calls return at once. 0, -ENOTSUP; errbuf says why. */
static int ofl_je_load(char *errbuf, size_t errlen) {
    int rc = 0;
    pthread_mutex_lock(&ofl_je_lock);
    if (je.mallocx)
        goto out;
    if (ofl_je_mallocx && ofl_je_dallocx && ofl_je_sallocx && ofl_je_nallocx && ofl_je_mallctl) {
        je.dallocx = ofl_je_dallocx;
        je.sallocx = ofl_je_sallocx;
        je.nallocx = ofl_je_nallocx;
        je.mallctl = ofl_je_mallctl;
        je.mallocx = ofl_je_mallocx;
        goto out;
    }
    /* RTLD_LOCAL: jemalloc's malloc must not become the process's. The
     * handle is kept for the process's life. */
    void *dl = dlopen("libjemalloc.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!dl) {
        const char *why = dlerror();
        ofl_err(errbuf, errlen,
                "host tier: this libllmd has no jemalloc of its own and could not load "
                "libjemalloc.so.2 (%s). Install libjemalloc2; if the error is about static TLS, "
                "load it at start-up (link -ljemalloc after -lc, or LD_PRELOAD) or set "
                "GLIBC_TUNABLES=glibc.rtld.optional_static_tls=16384",
                why ? why : "unknown error");
        rc = -ENOTSUP;
        goto out;
    }
    void *f[5] = {dlsym(dl, "dallocx"), dlsym(dl, "sallocx"), dlsym(dl, "nallocx"),
                  dlsym(dl, "mallctl"), dlsym(dl, "mallocx")};
    if (!f[0] || !f[1] || !f[2] || !f[3] || !f[4]) {
        ofl_err(errbuf, errlen,
                "host tier: libjemalloc.so.2 lacks mallocx/mallctl: not "
                "jemalloc 5, or built with a symbol prefix");
        rc = -ENOTSUP;
        goto out;
    }
    /* dlsym returns void *; POSIX guarantees it converts to a function pointer. */
    memcpy(&je.dallocx, &f[0], sizeof f[0]);
    memcpy(&je.sallocx, &f[1], sizeof f[1]);
    memcpy(&je.nallocx, &f[2], sizeof f[2]);
    memcpy(&je.mallctl, &f[3], sizeof f[3]);
    memcpy(&je.mallocx, &f[4], sizeof f[4]);
    LOG_INFO("ofl", "host: using libjemalloc.so.2 (dlopen, RTLD_LOCAL)");
out:
    pthread_mutex_unlock(&ofl_je_lock);
    return rc;
}

/* ---- extent hooks ---------------------------------------------------- */

static struct ofl_host *ofl_of_hooks(extent_hooks_t *eh) {
    return (struct ofl_host *)((char *)eh - offsetof(struct ofl_host, hooks));
}

static bool ofl_in_region(const struct ofl_host *h, const void *addr, size_t size) {
    uintptr_t a = (uintptr_t)addr, b = (uintptr_t)h->base;
    return a >= b && a - b <= h->region_bytes && size <= h->region_bytes - (a - b);
}

/* Metadata: anonymous memory outside the region, `alignment`-aligned. */
static void *ofl_meta_map(struct ofl_host *h, size_t size, size_t alignment) {
    if (size > SIZE_MAX - alignment)
        return NULL;
    uint8_t *p =
        mmap(NULL, size + alignment, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    uintptr_t start = ((uintptr_t)p + alignment - 1) & ~(uintptr_t)(alignment - 1);
    size_t head = start - (uintptr_t)p, tail = alignment - head;
    if (head)
        munmap(p, head);
    if (tail)
        munmap((void *)(start + size), tail);
    atomic_fetch_add(&h->meta_bytes, size);
    return (void *)start;
}

static void ofl_meta_unmap(struct ofl_host *h, void *addr, size_t size) {
    if (munmap(addr, size) == 0)
        atomic_fetch_sub(&h->meta_bytes, size);
    else
        LOG_ERROR("ofl", "host: munmap of %zu KiB of jemalloc metadata failed: %s", size >> 10,
                  strerror(errno));
}

/* jemalloc(3) extent_alloc_t: returns `size` bytes aligned to `alignment`,
 * committed and zeroed (fresh region memory is zero: it was faulted in with
 * zeros and is handed out once), or NULL. new_addr (in-place growth) is
 * refused, which jemalloc allows. */
static void *ofl_hook_alloc(extent_hooks_t *eh, void *new_addr, size_t size, size_t alignment,
                            bool *zero, bool *commit, unsigned arena_ind) {
    struct ofl_host *h = ofl_of_hooks(eh);
    (void)arena_ind;
    if (new_addr || size == 0)
        return NULL;
    void *p = NULL;
    if (alignment > OFL_DATA_ALIGN_MAX) {
        p = ofl_meta_map(h, size, alignment);
    } else {
        /* A compare-and-swap loop: jemalloc may call us from several
         * threads at once (its growth path and its exact-size path hold
         * different locks). */
        size_t cur = atomic_load(&h->cursor), start;
        do {
            start = (cur + alignment - 1) & ~(alignment - 1);
            if (start > h->region_bytes || size > h->region_bytes - start)
                return NULL;
        } while (!atomic_compare_exchange_weak(&h->cursor, &cur, start + size));
        p = h->base + start;
    }
    if (p) {
        *zero = true;
        *commit = true;
    }
    return p;
}

/* extent_dalloc_t: false = done. Region extents stay jemalloc's (opt out). */
static bool ofl_hook_dalloc(extent_hooks_t *eh, void *addr, size_t size, bool committed,
                            unsigned arena_ind) {
    struct ofl_host *h = ofl_of_hooks(eh);
    (void)committed;
    (void)arena_ind;
    if (ofl_in_region(h, addr, size))
        return true;
    ofl_meta_unmap(h, addr, size);
    return false;
}

/* extent_destroy_t: called on retained extents when the arena is destroyed;
 * the region itself is unmapped by ofl_host_destroy. */
static void ofl_hook_destroy(extent_hooks_t *eh, void *addr, size_t size, bool committed,
                             unsigned arena_ind) {
    struct ofl_host *h = ofl_of_hooks(eh);
    (void)committed;
    (void)arena_ind;
    if (!ofl_in_region(h, addr, size))
        ofl_meta_unmap(h, addr, size);
}

/* extent_split_t / extent_merge_t: false = done. Only region extents are
 * split or merged: a metadata mapping is unmapped whole. */
static bool ofl_hook_split(extent_hooks_t *eh, void *addr, size_t size, size_t size_a,
                           size_t size_b, bool committed, unsigned arena_ind) {
    (void)size_a;
    (void)size_b;
    (void)committed;
    (void)arena_ind;
    return !ofl_in_region(ofl_of_hooks(eh), addr, size);
}

static bool ofl_hook_merge(extent_hooks_t *eh, void *addr_a, size_t size_a, void *addr_b,
                           size_t size_b, bool committed, unsigned arena_ind) {
    struct ofl_host *h = ofl_of_hooks(eh);
    (void)committed;
    (void)arena_ind;
    return !(ofl_in_region(h, addr_a, size_a) && ofl_in_region(h, addr_b, size_b));
}

static const extent_hooks_t ofl_hooks_template = {
    .alloc = ofl_hook_alloc,
    .dalloc = ofl_hook_dalloc,
    .destroy = ofl_hook_destroy,
    .split = ofl_hook_split,
    .merge = ofl_hook_merge,
};

/* ---- NUMA (hwloc) ---------------------------------------------------- */

/* The node of the calling thread's CPUs; of the CPU it last ran on when its
 * binding spans several nodes. NULL if hwloc cannot tell. */
static hwloc_obj_t ofl_node_of_thread(hwloc_topology_t t) {
    hwloc_bitmap_t cpus = hwloc_bitmap_alloc(), nodes = hwloc_bitmap_alloc();
    hwloc_obj_t node = NULL;
    if (!cpus || !nodes)
        goto out;
    if (hwloc_get_cpubind(t, cpus, HWLOC_CPUBIND_THREAD) == 0 &&
        hwloc_cpuset_to_nodeset(t, cpus, nodes) == 0 && hwloc_bitmap_weight(nodes) == 1)
        goto found;
    if (hwloc_get_last_cpu_location(t, cpus, HWLOC_CPUBIND_THREAD) != 0 ||
        hwloc_cpuset_to_nodeset(t, cpus, nodes) != 0)
        goto out;
found:
    if (hwloc_bitmap_first(nodes) >= 0)
        node = hwloc_get_numanode_obj_by_os_index(t, (unsigned)hwloc_bitmap_first(nodes));
out:
    hwloc_bitmap_free(cpus);
    hwloc_bitmap_free(nodes);
    return node;
}

static const char *const ofl_hwloc_skip[] = {"pci", "opencl", "gl"};

/* Load the topology and choose the node (h->node, NULL if hwloc reports
 * none). 0, -EINVAL, -ENODEV, -EIO; errbuf says why. */
static int ofl_numa_pick(struct ofl_host *h, const struct ofl_host_config *cfg, char *errbuf,
                         size_t errlen) {
    unsigned dom = 0, bus, dev, func;
    const char *busid = cfg->numa_node < 0 ? cfg->device_pci_bus_id : NULL;
    if (busid && sscanf(busid, "%x:%x:%x.%x", &dom, &bus, &dev, &func) != 4 &&
        sscanf(busid, "%x:%x.%x", &bus, &dev, &func) != 3) {
        ofl_err(errbuf, errlen, "host tier: malformed PCI bus id '%s'", busid);
        return -EINVAL;
    }
    if (hwloc_topology_init(&h->topo) != 0) {
        ofl_err(errbuf, errlen, "host tier: hwloc_topology_init failed");
        return -EIO;
    }
    /* PCI devices are discovered only when asked: it reads sysfs for every
     * device, which a tier without a device does not need. hwloc's Linux
     * backend reads them from sysfs itself; its "pci" plugin (libpciaccess)
     * would do the same and leaks about 1 KiB per topology (LeakSanitizer),
     * and the "opencl" and "gl" plugins would probe drivers and displays. */
    if (busid) {
        hwloc_topology_set_type_filter(h->topo, HWLOC_OBJ_PCI_DEVICE, HWLOC_TYPE_FILTER_KEEP_ALL);
        for (size_t i = 0; i < sizeof ofl_hwloc_skip / sizeof ofl_hwloc_skip[0]; i++)
            hwloc_topology_set_components(h->topo, HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST,
                                          ofl_hwloc_skip[i]);
    }
    if (hwloc_topology_load(h->topo) != 0) {
        ofl_err(errbuf, errlen, "host tier: hwloc could not read the topology: %s",
                strerror(errno));
        hwloc_topology_destroy(h->topo);
        h->topo = NULL;
        return -EIO;
    }
    int n_nodes = hwloc_get_nbobjs_by_type(h->topo, HWLOC_OBJ_NUMANODE);
    if (cfg->numa_node >= 0) {
        if (cfg->numa_node >= n_nodes) {
            ofl_err(errbuf, errlen, "host tier: NUMA node %d does not exist (hwloc sees %d)",
                    cfg->numa_node, n_nodes);
            return -EINVAL;
        }
        h->node = hwloc_get_obj_by_type(h->topo, HWLOC_OBJ_NUMANODE, (unsigned)cfg->numa_node);
    } else if (busid) {
        hwloc_obj_t pci = hwloc_get_pcidev_by_busid(h->topo, dom, bus, dev, func);
        if (!pci) {
            ofl_err(errbuf, errlen, "host tier: hwloc does not see PCI device %s", busid);
            return -ENODEV;
        }
        hwloc_obj_t anc = hwloc_get_non_io_ancestor_obj(h->topo, pci);
        int os = anc ? hwloc_bitmap_first(anc->nodeset) : -1;
        h->node = os >= 0 ? hwloc_get_numanode_obj_by_os_index(h->topo, (unsigned)os) : NULL;
    } else {
        h->node = ofl_node_of_thread(h->topo);
    }
    if (!h->node && n_nodes > 0)
        h->node = hwloc_get_obj_by_type(h->topo, HWLOC_OBJ_NUMANODE, 0);
    return 0;
}

/* Bytes the node may give: MemAvailable, and at most the node's memory.
 * 0 if unknown. */
static uint64_t ofl_mem_available(const struct ofl_host *h) {
    uint64_t avail = 0;
    FILE *f = fopen("/proc/meminfo", "re");
    if (f) {
        char line[256];
        unsigned long long kb;
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) {
                avail = (uint64_t)kb << 10;
                break;
            }
        fclose(f);
    }
    uint64_t node_mem = h->node ? h->node->attr->numanode.local_memory : 0;
    if (node_mem && (!avail || node_mem < avail))
        avail = node_mem;
    return avail;
}

/* ---- the region ------------------------------------------------------ */

/* Map, place and fault in the region. 0, -ENOMEM; errbuf says why. */
static int ofl_region_map(struct ofl_host *h, char *errbuf, size_t errlen) {
    size_t bytes = h->region_bytes, align = OFL_HOST_REGION_ALIGN;
    uint8_t *p =
        mmap(NULL, bytes + align, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        int rc = -errno;
        ofl_err(errbuf, errlen, "host tier: mmap of %zu MiB failed: %s", bytes >> 20,
                strerror(-rc));
        return rc == -EAGAIN ? -ENOMEM : rc;
    }
    uintptr_t start = ((uintptr_t)p + align - 1) & ~(uintptr_t)(align - 1);
    size_t head = start - (uintptr_t)p, tail = align - head;
    if (head)
        munmap(p, head);
    if (tail)
        munmap((void *)(start + bytes), tail);
    h->base = (uint8_t *)start;
    /* Best effort: without THP the region works, in 4 KiB pages. */
    madvise(h->base, bytes, MADV_HUGEPAGE);
    if (h->node) {
        h->numa_bound = hwloc_set_area_membind(h->topo, h->base, bytes, h->node->nodeset,
                                               HWLOC_MEMBIND_BIND, HWLOC_MEMBIND_BYNODESET) == 0;
        if (!h->numa_bound)
            LOG_WARN("ofl",
                     "host: binding %zu MiB to NUMA node %u failed (%s); pages land "
                     "where the kernel puts them",
                     bytes >> 20, h->node->logical_index, strerror(errno));
    }
    double t0 = ofl_now_ms();
    if (madvise(h->base, bytes, MADV_POPULATE_WRITE) != 0) {
        if (errno != EINVAL) { /* EINVAL: kernel before 5.14; else out of memory */
            int e = errno;
            ofl_err(errbuf, errlen, "host tier: faulting in %zu MiB failed: %s", bytes >> 20,
                    strerror(e));
            munmap(h->base, bytes);
            h->base = NULL;
            return e == EFAULT || e == EHWPOISON ? -EIO : -ENOMEM;
        }
        for (size_t o = 0; o < bytes; o += OFL_PAGE)
            ((volatile uint8_t *)h->base)[o] = 0;
    }
    h->prefault_ms = ofl_now_ms() - t0;
    return 0;
}

/* Pin the region: cfg->pin, else mlock, else nothing; sets h->kind and
 * logs the outcome. Never fails. */
static void ofl_region_pin(struct ofl_host *h) {
    size_t bytes = h->region_bytes;
    if (h->pin) {
        int rc = h->pin(h->pin_ctx, h->base, bytes);
        if (rc == 0) {
            h->kind = OFL_HOST_PINNED;
            return;
        }
        LOG_WARN("ofl",
                 "host: registering %zu MiB with the device driver failed (%s); trying "
                 "mlock",
                 bytes >> 20, strerror(rc < 0 ? -rc : rc));
    }
    /* The system call itself: sanitizers replace mlock() with a no-op that
     * reports success (locking their shadow memory could exhaust RAM), and
     * the tier would then claim MLOCKED with nothing locked. */
    if (syscall(SYS_mlock, h->base, bytes) == 0) {
        h->kind = OFL_HOST_MLOCKED;
        return;
    }
    int e = errno;
    struct rlimit rl = {0};
    getrlimit(RLIMIT_MEMLOCK, &rl);
    char lim[32] = "unlimited";
    if (rl.rlim_cur != RLIM_INFINITY)
        snprintf(lim, sizeof lim, "%llu KiB", (unsigned long long)rl.rlim_cur >> 10);
    LOG_WARN("ofl",
             "host: mlock of %zu MiB failed (%s): RLIMIT_MEMLOCK is %s; raise it "
             "(ulimit -l, systemd LimitMEMLOCK=) or grant CAP_IPC_LOCK. Using plain pages, "
             "which the kernel may swap out",
             bytes >> 20, strerror(e), lim);
    h->kind = OFL_HOST_PLAIN;
}

static void ofl_region_unpin(struct ofl_host *h) {
    if (h->kind == OFL_HOST_PINNED)
        h->unpin(h->pin_ctx, h->base, h->region_bytes);
    else if (h->kind == OFL_HOST_MLOCKED)
        syscall(SYS_munlock, h->base, h->region_bytes);
    h->kind = OFL_HOST_PLAIN;
}

/* ---- the arena ------------------------------------------------------- */

static int ofl_arena_ctl_ssize(unsigned arena, const char *leaf, ssize_t v) {
    char name[64];
    snprintf(name, sizeof name, "arena.%u.%s", arena, leaf);
    return je.mallctl(name, NULL, NULL, &v, sizeof v);
}

/* Largest large size class s with s + pad <= left, or 0. Binary search over
 * arenas.lextent.<i>.size, ascending in i. */
static size_t ofl_largest_class(unsigned n_classes, size_t pad, size_t left) {
    size_t best = 0;
    unsigned lo = 0, hi = n_classes;
    while (lo < hi) {
        unsigned mid = lo + (hi - lo) / 2;
        char name[48];
        size_t s = 0, len = sizeof s;
        snprintf(name, sizeof name, "arenas.lextent.%u.size", mid);
        if (je.mallctl(name, &s, &len, NULL, 0) != 0)
            return best;
        if (s <= left && pad <= left - s) {
            best = s;
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return best;
}

/* Hand the region to the arena in a few large extents (see the top of the
 * file): allocate the largest size class that fits until less than the
 * smallest is left, then free them all. Runs in create, single-threaded. */
static void ofl_arena_prime(struct ofl_host *h) {
    unsigned n_classes = 0;
    size_t len = sizeof n_classes;
    bool oblivious = false;
    size_t blen = sizeof oblivious;
    if (je.mallctl("arenas.nlextents", &n_classes, &len, NULL, 0) != 0)
        return;
    je.mallctl("opt.cache_oblivious", &oblivious, &blen, NULL, 0);
    size_t pad = oblivious ? OFL_PAGE : 0;
    int flags = MALLOCX_ARENA(h->arena) | MALLOCX_TCACHE_NONE | MALLOCX_ALIGN(OFL_PAGE);
    void *piece[OFL_PRIME_MAX];
    int n = 0;
    while (n < OFL_PRIME_MAX) {
        size_t s = ofl_largest_class(n_classes, pad, h->region_bytes - h->cursor);
        if (s == 0 || !(piece[n] = je.mallocx(s, flags)))
            break;
        n++;
    }
    for (int i = 0; i < n; i++)
        je.dallocx(piece[i], MALLOCX_TCACHE_NONE);
    LOG_DEBUG("ofl", "host: arena %u primed with %d extents, %zu KiB of %zu MiB left over",
              h->arena, n, (h->region_bytes - h->cursor) >> 10, h->region_bytes >> 20);
}

/* Create the arena over the region. 0, -ENOMEM; errbuf says why. */
static int ofl_arena_create(struct ofl_host *h, char *errbuf, size_t errlen) {
    h->hooks = ofl_hooks_template;
    extent_hooks_t *hp = &h->hooks;
    size_t len = sizeof h->arena;
    int rc = je.mallctl("arenas.create", &h->arena, &len, &hp, sizeof hp);
    if (rc != 0) {
        ofl_err(errbuf, errlen, "host tier: jemalloc arenas.create failed: %s", strerror(rc));
        return -ENOMEM;
    }
    h->arena_made = true;
    if (ofl_arena_ctl_ssize(h->arena, "dirty_decay_ms", 0) != 0 ||
        ofl_arena_ctl_ssize(h->arena, "muzzy_decay_ms", 0) != 0)
        LOG_WARN("ofl",
                 "host: could not set decay to 0 for arena %u: freed memory may be "
                 "reused less well",
                 h->arena);
    ofl_arena_prime(h);
    return 0;
}

static void ofl_arena_destroy(struct ofl_host *h) {
    if (!h->arena_made)
        return;
    char name[48];
    snprintf(name, sizeof name, "arena.%u.destroy", h->arena);
    int rc = je.mallctl(name, NULL, NULL, NULL, 0);
    if (rc != 0)
        LOG_ERROR("ofl", "host: jemalloc %s failed: %s", name, strerror(rc));
    h->arena_made = false;
}

/* ---- the API --------------------------------------------------------- */

int ofl_host_create(const struct ofl_host_config *cfg, struct ofl_host **out, char *errbuf,
                    size_t errlen) {
    if (errbuf && errlen)
        errbuf[0] = '\0';
    if (!cfg || !out) {
        ofl_err(errbuf, errlen, "host tier: no config or no out pointer");
        return -EINVAL;
    }
    *out = NULL;
    if (cfg->bytes == 0 || (!cfg->pin != !cfg->unpin) || cfg->numa_node < -1) {
        ofl_err(errbuf, errlen, "host tier: %s",
                cfg->bytes == 0              ? "budget of 0 bytes"
                : (!cfg->pin != !cfg->unpin) ? "pin and unpin must be given together"
                                             : "numa_node must be -1 or a node index");
        return -EINVAL;
    }
    if (cfg->bytes > SIZE_MAX / 2) {
        ofl_err(errbuf, errlen, "host tier: budget of %llu MiB is beyond any memory",
                (unsigned long long)(cfg->bytes >> 20));
        return -ENOMEM;
    }
    int rc = ofl_je_load(errbuf, errlen);
    if (rc)
        return rc;
    struct ofl_host *h = mem_calloc(MEM_OFL, 1, sizeof *h);
    if (!h) {
        ofl_err(errbuf, errlen, "host tier: out of host memory");
        return -ENOMEM;
    }
    h->region_bytes =
        ((size_t)cfg->bytes + OFL_HOST_REGION_ALIGN - 1) & ~(OFL_HOST_REGION_ALIGN - 1);
    h->pin = cfg->pin;
    h->unpin = cfg->unpin;
    h->pin_ctx = cfg->pin_ctx;

    rc = ofl_numa_pick(h, cfg, errbuf, errlen);
    if (rc)
        goto fail_topo;
    uint64_t avail = ofl_mem_available(h);
    if (avail && h->region_bytes > avail) {
        ofl_err(errbuf, errlen,
                "host tier: budget of %zu MiB exceeds the %llu MiB available on NUMA node %d",
                h->region_bytes >> 20, (unsigned long long)(avail >> 20), ofl_host_numa_node(h));
        rc = -ENOMEM;
        goto fail_topo;
    }
    rc = ofl_region_map(h, errbuf, errlen);
    if (rc)
        goto fail_topo;
    ofl_region_pin(h);
    rc = ofl_arena_create(h, errbuf, errlen);
    if (rc)
        goto fail_pin;
    LOG_INFO("ofl",
             "host: %zu MiB of %s memory on NUMA node %d%s, faulted in in %.0f ms, "
             "jemalloc arena %u",
             h->region_bytes >> 20, ofl_host_kind_name(h->kind), ofl_host_numa_node(h),
             h->numa_bound ? "" : " (not bound)", h->prefault_ms, h->arena);
    *out = h;
    return 0;

fail_pin:
    ofl_region_unpin(h);
    munmap(h->base, h->region_bytes);
fail_topo:
    if (h->topo)
        hwloc_topology_destroy(h->topo);
    mem_free(h);
    return rc;
}

void ofl_host_destroy(struct ofl_host *h) {
    if (!h)
        return;
    uint64_t used = atomic_load(&h->used_bytes);
    assert(used == 0);
    if (used)
        LOG_WARN("ofl", "host: destroyed with %llu bytes still allocated",
                 (unsigned long long)used);
    ofl_arena_destroy(h);
    if (atomic_load(&h->meta_bytes))
        LOG_WARN("ofl", "host: jemalloc left %llu KiB of metadata mapped",
                 (unsigned long long)(atomic_load(&h->meta_bytes) >> 10));
    ofl_region_unpin(h);
    munmap(h->base, h->region_bytes);
    hwloc_topology_destroy(h->topo);
    mem_free(h);
}

static int ofl_alloc_flags(const struct ofl_host *h, size_t bytes) {
    return (int)(MALLOCX_ARENA(h->arena) | MALLOCX_TCACHE_NONE |
                 MALLOCX_ALIGN(bytes % OFL_PAGE ? 64 : OFL_PAGE));
}

void *ofl_host_alloc(struct ofl_host *h, size_t bytes) {
    assert(h);
    if (bytes == 0)
        return NULL;
    int flags = ofl_alloc_flags(h, bytes);
    void *p = je.mallocx(bytes, flags);
    if (p && NEVER(!ofl_in_region(h, p, bytes))) {
        LOG_ERROR("ofl", "host: jemalloc returned %p, outside the region", p);
        je.dallocx(p, MALLOCX_TCACHE_NONE);
        p = NULL;
    }
    if (!p) {
        atomic_fetch_add_explicit(&h->alloc_failures_total, 1, memory_order_relaxed);
        return NULL;
    }
    atomic_fetch_add_explicit(&h->used_bytes, je.sallocx(p, 0), memory_order_relaxed);
    atomic_fetch_add_explicit(&h->allocs_total, 1, memory_order_relaxed);
    return p;
}

void ofl_host_free(struct ofl_host *h, void *p) {
    if (!p)
        return;
    assert(h);
    if (NEVER(!ofl_in_region(h, p, 1))) {
        LOG_ERROR("ofl", "host: free of %p, which is not in the tier; ignored", p);
        return;
    }
    atomic_fetch_sub_explicit(&h->used_bytes, je.sallocx(p, 0), memory_order_relaxed);
    atomic_fetch_add_explicit(&h->frees_total, 1, memory_order_relaxed);
    je.dallocx(p, MALLOCX_TCACHE_NONE);
}

size_t ofl_host_usable_size(const struct ofl_host *h, size_t bytes) {
    return bytes ? je.nallocx(bytes, ofl_alloc_flags(h, bytes)) : 0;
}

enum ofl_host_kind ofl_host_kind(const struct ofl_host *h) {
    return h->kind;
}

const char *ofl_host_kind_name(enum ofl_host_kind k) {
    switch (k) {
    case OFL_HOST_PLAIN:
        return "plain";
    case OFL_HOST_MLOCKED:
        return "mlocked";
    case OFL_HOST_PINNED:
        return "pinned";
    }
    return "?";
}

int ofl_host_numa_node(const struct ofl_host *h) {
    return h->node ? (int)h->node->logical_index : -1;
}

int ofl_host_bind_thread(const struct ofl_host *h) {
    if (!h->node)
        return 0;
    hwloc_bitmap_t want = hwloc_bitmap_alloc(), cur = hwloc_bitmap_alloc();
    int rc = 0;
    if (!want || !cur) {
        rc = -ENOMEM;
        goto out;
    }
    hwloc_bitmap_and(want, h->node->cpuset, hwloc_topology_get_allowed_cpuset(h->topo));
    if (hwloc_bitmap_iszero(want)) {
        rc = -ENOTSUP;
        goto out;
    }
    if (hwloc_get_cpubind(h->topo, cur, HWLOC_CPUBIND_THREAD) == 0 &&
        hwloc_bitmap_isincluded(cur, want))
        goto out;
    if (hwloc_set_cpubind(h->topo, want, HWLOC_CPUBIND_THREAD) != 0)
        rc = errno ? -errno : -EIO;
out:
    hwloc_bitmap_free(want);
    hwloc_bitmap_free(cur);
    return rc;
}

void ofl_host_stats_get(const struct ofl_host *h, struct ofl_host_stats *out) {
    *out = (struct ofl_host_stats){
        .budget_bytes = h->region_bytes,
        .used_bytes = atomic_load(&h->used_bytes),
        .meta_bytes = atomic_load(&h->meta_bytes),
        .allocs_total = atomic_load(&h->allocs_total),
        .frees_total = atomic_load(&h->frees_total),
        .alloc_failures_total = atomic_load(&h->alloc_failures_total),
    };
}

int ofl_host_stats_format(const struct ofl_host *h, char *buf, size_t len) {
    struct ofl_host_stats s;
    ofl_host_stats_get(h, &s);
    int n = snprintf(buf, len,
                     "# ofl_host\n"
                     "ofl_host_kind:%s\n"
                     "ofl_host_numa_node:%d\n"
                     "ofl_host_numa_bound:%d\n"
                     "ofl_host_budget_bytes:%llu\n"
                     "ofl_host_used_bytes:%llu\n"
                     "ofl_host_meta_bytes:%llu\n"
                     "ofl_host_allocs_total:%llu\n"
                     "ofl_host_frees_total:%llu\n"
                     "ofl_host_alloc_failures_total:%llu\n",
                     ofl_host_kind_name(h->kind), ofl_host_numa_node(h), h->numa_bound ? 1 : 0,
                     (unsigned long long)s.budget_bytes, (unsigned long long)s.used_bytes,
                     (unsigned long long)s.meta_bytes, (unsigned long long)s.allocs_total,
                     (unsigned long long)s.frees_total, (unsigned long long)s.alloc_failures_total);
    return n < 0 || (size_t)n >= len ? -ENOSPC : 0;
}

/* jemalloc's stats.arenas.<i>.<leaf> (size_t), after refreshing its epoch. */
static bool ofl_arena_stat(const struct ofl_host *h, const char *leaf, size_t *out) {
    uint64_t epoch = 1;
    size_t len = sizeof epoch;
    char name[64];
    je.mallctl("epoch", &epoch, &len, &epoch, sizeof epoch);
    snprintf(name, sizeof name, "stats.arenas.%u.%s", h->arena, leaf);
    len = sizeof *out;
    return je.mallctl(name, out, &len, NULL, 0) == 0;
}

bool ofl_host_check(const struct ofl_host *h) {
    struct ofl_host_stats s;
    ofl_host_stats_get(h, &s);
    if (s.used_bytes > s.budget_bytes) {
        LOG_ERROR("ofl", "check: used %llu > budget %llu", (unsigned long long)s.used_bytes,
                  (unsigned long long)s.budget_bytes);
        return false;
    }
    if (s.frees_total > s.allocs_total) {
        LOG_ERROR("ofl", "check: %llu frees > %llu allocs", (unsigned long long)s.frees_total,
                  (unsigned long long)s.allocs_total);
        return false;
    }
    size_t cursor = atomic_load(&h->cursor);
    if (cursor > h->region_bytes) {
        LOG_ERROR("ofl", "check: cursor %zu past the region (%zu)", cursor, h->region_bytes);
        return false;
    }
    size_t small = 0, large = 0;
    if (ofl_arena_stat(h, "small.allocated", &small) &&
        ofl_arena_stat(h, "large.allocated", &large) && small + large != s.used_bytes) {
        LOG_ERROR("ofl",
                  "check: jemalloc counts %zu bytes allocated (small %zu, large %zu), "
                  "the tier %llu",
                  small + large, small, large, (unsigned long long)s.used_bytes);
        return false;
    }
    return true;
}
