/* vmm_host.c - the host backend: a memfd pool mapped with mmap(MAP_FIXED).
 *
 * One memfd per pool ("llmd-vmm", so it shows in /proc/self/maps), sized N*P;
 * physical page i is the file range [i*P, (i+1)*P) and its handle is i. A
 * reservation is an anonymous PROT_NONE, MAP_NORESERVE mapping; map() puts a
 * MAP_SHARED|MAP_FIXED view of one file page over part of it, and unmap()
 * puts anonymous PROT_NONE memory back (so the VA stays reserved and nothing
 * else can land there). copy() is a memcpy through one MAP_SHARED view of the
 * whole file, kept for the pool's life.
 *
 * Huge pages are detected, never assumed (DESIGN §3: unmapping a populated
 * 2 MiB page costs 130-230 us with 4 KiB PTEs, 4-7 us with a huge page):
 * hugetlb (MFD_HUGETLB) when free huge pages exist, else shmem THP when
 * /sys/kernel/mm/transparent_hugepage/shmem_enabled allows it ("advise" needs
 * madvise(MADV_HUGEPAGE) on every mapping) and the page size is a multiple of
 * the huge page size, else 4 KiB pages.
 *
 * Each mapped page may cost a VMA (adjacent file pages merge, but the worst
 * case is one each), and a process has vm.max_map_count of them;
 * vmm_host_map_limits() gives vmm_create the numbers to refuse a config that
 * could exceed it. Not thread-safe: vmm.c serializes calls.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "log.h"
#include "mem.h"
#include "vmm/vmm_backend.h"

#define HOST_THP_DEFAULT_BYTES ((size_t)2 << 20) /* x86-64 PMD size, if sysfs is silent */

enum host_kind { HOST_NONE = 0, HOST_HUGETLB, HOST_THP };

struct host {
    enum vmm_huge policy;
    enum host_kind kind; /* decided at create, final after phys_alloc */
    size_t gran;         /* bytes, reported by granularity() */
    size_t base_bytes;   /* the system page size */
    size_t huge_bytes;   /* huge page size of `kind`, 0 for none */
    size_t thp_bytes;    /* shmem THP size if THP is allowed, else 0 */
    bool thp_advise;     /* shmem_enabled is "advise": madvise each mapping */
    bool prefault;
    int fd;        /* memfd, -1 before phys_alloc */
    uint8_t *view; /* [n_pages][page_bytes] whole-pool MAP_SHARED view */
    size_t pool_bytes;
    uint32_t n_pages;
};

static const struct vmm_backend_ops host_ops;

static struct host *host_of(const struct vmm_backend *b) {
    return b && b->ops == &host_ops ? b->priv : NULL;
}

/* First unsigned number after `key` in a small text file, or 0. */
static uint64_t host_read_key(const char *path, const char *key) {
    FILE *f = fopen(path, "re");
    if (!f)
        return 0;
    char line[256];
    uint64_t val = 0;
    size_t klen = strlen(key);
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, key, klen) == 0) {
            unsigned long long x = 0;
            if (sscanf(line + klen, " %llu", &x) == 1)
                val = x;
            break;
        }
    }
    fclose(f);
    return val;
}

/* shmem THP policy: the bracketed word of shmem_enabled. Sets thp_bytes and
 * thp_advise when THP may back a memfd. */
static void host_detect_thp(struct host *h) {
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/shmem_enabled", "re");
    if (!f)
        return;
    char line[256] = {0};
    char *ok = fgets(line, sizeof line, f);
    fclose(f);
    if (!ok)
        return;
    char *l = strchr(line, '['), *r = l ? strchr(l, ']') : NULL;
    if (!l || !r)
        return;
    *r = '\0';
    const char *mode = l + 1;
    if (strcmp(mode, "always") && strcmp(mode, "within_size") && strcmp(mode, "advise") &&
        strcmp(mode, "force"))
        return;
    h->thp_advise = strcmp(mode, "advise") == 0;
    uint64_t sz = host_read_key("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size", "");
    h->thp_bytes = sz ? (size_t)sz : HOST_THP_DEFAULT_BYTES;
}

static size_t host_granularity(struct vmm_backend *b) {
    return host_of(b)->gran;
}

/* Alignment for reservations: a huge page when huge pages may back them, so
 * that a P-aligned offset in a range is also huge-page aligned. */
static size_t host_va_align(const struct host *h) {
    size_t a = h->gran;
    if (h->thp_bytes > a && h->policy != VMM_HUGE_OFF)
        a = h->thp_bytes;
    if (h->huge_bytes > a)
        a = h->huge_bytes;
    return a;
}

static int host_reserve(struct vmm_backend *b, size_t bytes, uintptr_t *va) {
    struct host *h = host_of(b);
    size_t align = host_va_align(h);
    if (bytes == 0 || bytes % h->gran || bytes > SIZE_MAX - align)
        return -EINVAL;
    uint8_t *p =
        mmap(NULL, bytes + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return -errno;
    uintptr_t start = ((uintptr_t)p + align - 1) & ~(uintptr_t)(align - 1);
    size_t head = start - (uintptr_t)p, tail = align - head;
    if (head)
        munmap(p, head);
    if (tail)
        munmap((void *)(start + bytes), tail);
    *va = start;
    return 0;
}

static void host_release(struct vmm_backend *b, uintptr_t va, size_t bytes) {
    (void)b;
    if (munmap((void *)va, bytes) != 0)
        LOG_ERROR("vmm", "host: munmap of a reservation failed: %s", strerror(errno));
}

/* Open the memfd and the whole-pool view for `kind`. 0 or -errno; on failure
 * nothing is left open. */
static int host_open_pool(struct host *h, enum host_kind kind, size_t bytes) {
    int fd = memfd_create("llmd-vmm", MFD_CLOEXEC | (kind == HOST_HUGETLB ? MFD_HUGETLB : 0));
    if (fd < 0)
        return -errno;
    int rc = 0;
    if (ftruncate(fd, (off_t)bytes) != 0) {
        rc = -errno;
        goto fail_fd;
    }
    /* For hugetlb this mmap reserves the huge pages: ENOMEM if too few. */
    void *view = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (view == MAP_FAILED) {
        rc = -errno;
        goto fail_fd;
    }
    if (kind == HOST_THP && h->thp_advise)
        madvise(view, bytes, MADV_HUGEPAGE);
    if (h->prefault && fallocate(fd, 0, 0, (off_t)bytes) != 0) {
        rc = -errno;
        if (rc == -ENOSPC)
            rc = -ENOMEM;
        goto fail_view;
    }
    h->fd = fd;
    h->view = view;
    return 0;

fail_view:
    munmap(view, bytes);
fail_fd:
    close(fd);
    return rc;
}

static int host_phys_alloc(struct vmm_backend *b, size_t page_bytes, uint32_t n,
                           uint64_t *handles) {
    struct host *h = host_of(b);
    if (h->fd >= 0 || n == 0 || page_bytes == 0 || page_bytes % h->gran)
        return -EINVAL;
    if (page_bytes > SIZE_MAX / n)
        return -ENOMEM;
    size_t bytes = page_bytes * n;
    enum host_kind kind = h->kind;
    if (kind == HOST_NONE && h->policy == VMM_HUGE_AUTO && h->thp_bytes &&
        page_bytes % h->thp_bytes == 0)
        kind = HOST_THP;
    int rc = host_open_pool(h, kind, bytes);
    if (rc == -ENOMEM && kind == HOST_HUGETLB && h->policy == VMM_HUGE_AUTO) {
        LOG_WARN("vmm", "host: %zu MiB of hugetlb pages not available, using %s", bytes >> 20,
                 h->thp_bytes && page_bytes % h->thp_bytes == 0 ? "thp" : "4 KiB pages");
        kind = h->thp_bytes && page_bytes % h->thp_bytes == 0 ? HOST_THP : HOST_NONE;
        rc = host_open_pool(h, kind, bytes);
    }
    if (rc)
        return rc;
    h->kind = kind;
    h->huge_bytes = kind == HOST_THP ? h->thp_bytes : kind == HOST_HUGETLB ? h->huge_bytes : 0;
    h->pool_bytes = bytes;
    h->n_pages = n;
    b->page_bytes = page_bytes;
    for (uint32_t i = 0; i < n; i++)
        handles[i] = i;
    return 0;
}

static void host_phys_free(struct vmm_backend *b, const uint64_t *handles, uint32_t n) {
    struct host *h = host_of(b);
    (void)handles;
    (void)n;
    if (h->fd < 0)
        return;
    munmap(h->view, h->pool_bytes);
    close(h->fd);
    h->fd = -1;
    h->view = NULL;
}

static int host_map(struct vmm_backend *b, uintptr_t va, uint64_t handle) {
    struct host *h = host_of(b);
    if (handle >= h->n_pages)
        return -EINVAL;
    size_t p = b->page_bytes;
    void *got = mmap((void *)va, p, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, h->fd,
                     (off_t)(handle * p));
    if (got == MAP_FAILED)
        return -errno;
    if (h->kind == HOST_THP && h->thp_advise)
        madvise(got, p, MADV_HUGEPAGE);
    return 0;
}

static int host_unmap(struct vmm_backend *b, uintptr_t va, size_t bytes) {
    (void)b;
    void *got = mmap((void *)va, bytes, PROT_NONE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    return got == MAP_FAILED ? -errno : 0;
}

static int host_copy(struct vmm_backend *b, uint64_t dst, uint64_t src) {
    struct host *h = host_of(b);
    if (dst >= h->n_pages || src >= h->n_pages)
        return -EINVAL;
    if (dst != src)
        memcpy(h->view + dst * b->page_bytes, h->view + src * b->page_bytes, b->page_bytes);
    return 0;
}

static int host_xfer(struct vmm_backend *b, uint64_t handle, void *host, bool to_page) {
    struct host *h = host_of(b);
    if (handle >= h->n_pages || !host)
        return -EINVAL;
    uint8_t *page = h->view + handle * b->page_bytes;
    if (to_page)
        memcpy(page, host, b->page_bytes);
    else
        memcpy(host, page, b->page_bytes);
    return 0;
}

static void host_destroy(struct vmm_backend *b) {
    if (!b)
        return;
    host_phys_free(b, NULL, 0);
    mem_free(b->priv);
    mem_free(b);
}

static const struct vmm_backend_ops host_ops = {
    .name = "host",
    .granularity = host_granularity,
    .reserve = host_reserve,
    .release = host_release,
    .phys_alloc = host_phys_alloc,
    .phys_free = host_phys_free,
    .map = host_map,
    .unmap = host_unmap,
    .copy = host_copy,
    .xfer = host_xfer,
    .destroy = host_destroy,
};

int vmm_host_backend_create(enum vmm_huge huge, struct vmm_backend **out) {
    struct vmm_backend *b = mem_calloc(MEM_VMM, 1, sizeof *b);
    struct host *h = mem_calloc(MEM_VMM, 1, sizeof *h);
    if (!b || !h) {
        mem_free(b);
        mem_free(h);
        return -ENOMEM;
    }
    long ps = sysconf(_SC_PAGESIZE);
    h->base_bytes = ps > 0 ? (size_t)ps : 4096;
    h->gran = h->base_bytes;
    h->policy = huge;
    h->fd = -1;
    if (huge != VMM_HUGE_OFF) {
        uint64_t free_huge = host_read_key("/proc/meminfo", "HugePages_Free:");
        uint64_t huge_kib = host_read_key("/proc/meminfo", "Hugepagesize:");
        host_detect_thp(h);
        if (free_huge > 0 && huge_kib > 0) {
            h->kind = HOST_HUGETLB;
            h->huge_bytes = (size_t)huge_kib << 10;
            h->gran = h->huge_bytes;
        } else if (huge == VMM_HUGE_ON && h->thp_bytes) {
            h->kind = HOST_THP;
            h->huge_bytes = h->thp_bytes;
            h->gran = h->thp_bytes;
        } else if (huge == VMM_HUGE_ON) {
            mem_free(b);
            mem_free(h);
            return -ENOTSUP;
        }
    }
    b->ops = &host_ops;
    b->priv = h;
    *out = b;
    return 0;
}

const char *vmm_host_huge_kind(const struct vmm_backend *b) {
    const struct host *h = host_of(b);
    if (!h)
        return "none";
    return h->kind == HOST_HUGETLB ? "hugetlb" : h->kind == HOST_THP ? "thp" : "none";
}

void vmm_host_prefault_set(struct vmm_backend *b, bool on) {
    struct host *h = host_of(b);
    if (h)
        h->prefault = on;
}

bool vmm_host_mem_available(const struct vmm_backend *b, uint64_t *avail) {
    if (!host_of(b))
        return false;
    FILE *f = fopen("/proc/meminfo", "re");
    if (!f)
        return false;
    char line[256];
    unsigned long long kb = 0;
    bool found = false;
    while (!found && fgets(line, sizeof line, f))
        found = sscanf(line, "MemAvailable: %llu kB", &kb) == 1;
    fclose(f);
    *avail = (uint64_t)kb << 10;
    return found;
}

bool vmm_host_map_limits(const struct vmm_backend *b, uint64_t *limit, uint64_t *in_use) {
    if (!host_of(b))
        return false;
    FILE *f = fopen("/proc/sys/vm/max_map_count", "re");
    unsigned long long lim = 0;
    if (!f)
        return false;
    int got = fscanf(f, "%llu", &lim);
    fclose(f);
    if (got != 1 || lim == 0)
        return false;
    uint64_t n = 0;
    f = fopen("/proc/self/maps", "re");
    if (f) {
        int c;
        while ((c = getc(f)) != EOF)
            n += c == '\n';
        fclose(f);
    }
    *limit = lim;
    *in_use = n;
    return true;
}

int vmm_host_fd(const struct vmm_backend *b) {
    const struct host *h = host_of(b);
    return h ? h->fd : -1;
}
