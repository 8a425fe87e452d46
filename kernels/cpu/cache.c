/* cache.c - the L2 size the matrix products block for (see kern.h).
 *
 * Read once, at first use (kern_pool_create, else the first product):
 * hwloc's topology (Linux: sysfs, the kernel's view of cpuid leaf 4 /
 * 0x8000001D), per core; the smallest over the machine, so a hybrid CPU's
 * E-core cluster (one L2 for four cores) sizes the blocks for every
 * thread. An L2 shared by SMT siblings counts once per core (llmd's
 * threads usually are one a core); in a topology without cores, once per
 * PU. Without an L2 object (some VMs hide the caches) glibc's
 * sysconf(_SC_LEVEL2_CACHE_SIZE), from cpuid itself, then KERN_L2_DEFAULT.
 * LLMD_L2_KIB overrides it all (measuring block sizes, or a VM that
 * reports a host's cache). The value changes which (token, row) elements
 * run side by side, never a result's bits.

 */
#include "kernels/kern.h"

#include <ctype.h>
#include <hwloc.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "log.h"

static _Atomic size_t kern_l2_bytes; /* 0: not read yet */
static _Atomic int kern_l2_src = -1; /* enum below */
enum { L2_SRC_HWLOC, L2_SRC_SYSCONF, L2_SRC_DEFAULT, L2_SRC_ENV, L2_SRC_SET };
static const char *const l2_src_names[] = {"hwloc", "cpuid", "default", "LLMD_L2_KIB", "set"};

/* Smallest L2 a core has, in bytes; 0 when hwloc sees none. */
static size_t l2_hwloc(void) {
    hwloc_topology_t topo;
    if (hwloc_topology_init(&topo) != 0)
        return 0;
    size_t best = 0;
    if (hwloc_topology_load(topo) == 0) {
        for (hwloc_obj_t o = hwloc_get_next_obj_by_type(topo, HWLOC_OBJ_L2CACHE, NULL); o;
             o = hwloc_get_next_obj_by_type(topo, HWLOC_OBJ_L2CACHE, o)) {
            if (o->attr->cache.type == HWLOC_OBJ_CACHE_INSTRUCTION || o->attr->cache.size == 0)
                continue;
            int cores = hwloc_get_nbobjs_inside_cpuset_by_type(topo, o->cpuset, HWLOC_OBJ_CORE);
            if (cores <= 0) /* a topology without cores: one a PU */
                cores = hwloc_get_nbobjs_inside_cpuset_by_type(topo, o->cpuset, HWLOC_OBJ_PU);
            size_t per = (size_t)(o->attr->cache.size / (unsigned)(cores > 0 ? cores : 1));
            if (best == 0 || per < best)
                best = per;
        }
    }
    hwloc_topology_destroy(topo);
    return best;
}

static size_t l2_clamp(size_t b) {
    return b < KERN_L2_MIN ? KERN_L2_MIN : b > KERN_L2_MAX ? KERN_L2_MAX : b;
}

static size_t l2_detect(int *src) {
    const char *env = getenv("LLMD_L2_KIB");
    if (env && *env) {
        char *end;
        long v = strtol(env, &end, 10);
        if (isdigit((unsigned char)env[0]) && *end == '\0' && v >= KERN_L2_MIN / 1024 &&
            v <= KERN_L2_MAX / 1024) {
            *src = L2_SRC_ENV;
            return (size_t)v * 1024;
        }
        LOG_WARN("kern", "LLMD_L2_KIB='%s': not a size in KiB from %d to %d; ignored", env,
                 KERN_L2_MIN / 1024, KERN_L2_MAX / 1024);
    }
    size_t b = l2_hwloc();
    *src = L2_SRC_HWLOC;
#ifdef _SC_LEVEL2_CACHE_SIZE
    if (b == 0) {
        long s = sysconf(_SC_LEVEL2_CACHE_SIZE);
        b = s > 0 ? (size_t)s : 0;
        *src = L2_SRC_SYSCONF;
    }
#endif
    if (b == 0) {
        b = KERN_L2_DEFAULT;
        *src = L2_SRC_DEFAULT;
    }
    return l2_clamp(b);
}

size_t kern_cache_l2(void) {
    size_t v = atomic_load_explicit(&kern_l2_bytes, memory_order_relaxed);
    if (v)
        return v;
    int src;
    v = l2_detect(&src); /* two first callers both detect: the same answer */
    atomic_store_explicit(&kern_l2_src, src, memory_order_relaxed);
    atomic_store_explicit(&kern_l2_bytes, v, memory_order_relaxed);
    LOG_DEBUG("kern", "L2 %zu KiB a core (%s)", v / 1024, l2_src_names[src]);
    return v;
}

const char *kern_cache_l2_source(void) {
    kern_cache_l2();
    int s = atomic_load_explicit(&kern_l2_src, memory_order_relaxed);
    return s >= 0 ? l2_src_names[s] : "?";
}

size_t kern_set_cache_l2(size_t bytes) {
    if (bytes == 0) {
        atomic_store_explicit(&kern_l2_bytes, 0, memory_order_relaxed);
        return kern_cache_l2();
    }
    bytes = l2_clamp(bytes);
    atomic_store_explicit(&kern_l2_src, L2_SRC_SET, memory_order_relaxed);
    atomic_store_explicit(&kern_l2_bytes, bytes, memory_order_relaxed);
    return bytes;
}
