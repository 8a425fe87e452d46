/* test_vmm_pin_cuda.c - host memory the GPU copies from at full speed: the
 * CUDA backend's cuMemHostRegister wrapper (vmm_cuda_util.h) as the host
 * tier's pin hook (offload/ofl_host.h), the way the engine wires them for a
 * GPU pool.
 *
 * Plain C, the harness of test_vmm_cuda.c; built and run by
 * tests/device/run.sh against the fake driver (where a registration left at
 * exit is reported as a leak), under ASan, and against the real driver.
 * Without a GPU: "cuda backend unavailable: <reason>", "0 passed, 0 failed,
 * 1 skipped", exit 0.
 *
 * Covers: register/unregister argument checks and a double registration
 * refused; the PCI bus id's form; a host tier pinned through the hook
 * (kind "pinned"); a page spilled into tier memory and restored from it
 * into another device page, bytes checked through device copies; every
 * registration undone at destroy.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "log.h"
#include "offload/ofl_host.h"
#include "vmm/vmm.h"
#include "vmm/vmm_backend.h"
#include "vmm/vmm_cuda_util.h"
#include "tests/device/dev_check.h"

static int pin(void *ctx, void *addr, size_t bytes) {
    return vmm_cuda_host_register(ctx, addr, bytes);
}

static void unpin(void *ctx, void *addr, size_t bytes) {
    (void)bytes;
    vmm_cuda_host_unregister(ctx, addr);
}

static void check_register(struct vmm_backend *b) {
    size_t n = 4u << 20;
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(p != MAP_FAILED, "mmap");
    if (p == MAP_FAILED)
        return;
    CHECK(vmm_cuda_host_register(NULL, p, n) == -EINVAL, "NULL backend");
    CHECK(vmm_cuda_host_register(b, NULL, n) == -EINVAL, "NULL address");
    CHECK(vmm_cuda_host_register(b, p, 0) == -EINVAL, "0 bytes");
    int rc = vmm_cuda_host_register(b, p, n);
    CHECK(rc == 0, "register 4 MiB: %d", rc);
    rc = vmm_cuda_host_register(b, p, n);
    CHECK(rc < 0, "a second registration of the same memory is refused: %d", rc);
    vmm_cuda_host_unregister(b, p);
    munmap(p, n);

    char bus[32] = "";
    rc = vmm_cuda_pci_bus_id(b, bus, sizeof bus);
    CHECK(rc == 0 && strlen(bus) == 12 && bus[4] == ':' && bus[7] == ':' && bus[10] == '.',
          "PCI bus id '%s' (rc %d)", bus, rc);
    CHECK(vmm_cuda_pci_bus_id(b, bus, 4) == -EINVAL, "short buffer refused");
}

/* A spill into pinned tier memory and a restore from it. */
static void check_tier(struct vmm_backend *b_borrowed, struct vmm *v) {
    struct ofl_host_config hc = {
        .bytes = 8u << 20, .numa_node = -1, .pin = pin, .unpin = unpin, .pin_ctx = b_borrowed};
    struct ofl_host *h = NULL;
    char err[256] = "";
    int rc = ofl_host_create(&hc, &h, err, sizeof err);
    CHECK(rc == 0, "host tier over the pin hook: %s", err);
    if (rc)
        return;
    CHECK(ofl_host_kind(h) == OFL_HOST_PINNED, "tier kind %s, want pinned",
          ofl_host_kind_name(ofl_host_kind(h)));
    size_t P = vmm_page_bytes(v);
    unsigned char *buf = ofl_host_alloc(h, P), *want = malloc(P), *got = malloc(P);
    CHECK(buf && want && got, "a page of tier memory");
    uint32_t r = 0, r2 = 0;
    if (buf && want && got && vmm_range_acquire(v, &r) == 0 && vmm_range_grow(v, r, 1) == 0) {
        for (size_t i = 0; i < P; i++)
            want[i] = (unsigned char)(i * 29u + 5u);
        rc = vmm_cuda_memcpy_htod(b_borrowed, vmm_range_base(v, r), want, P);
        CHECK(rc == 0, "fill a device page: %d", rc);
        uint32_t page = vmm_range_page(v, r, 0);
        rc = vmm_page_read(v, page, buf); /* the spill's copy: D2H into pinned memory */
        CHECK(rc == 0 && memcmp(buf, want, P) == 0, "spilled bytes equal (rc %d)", rc);
        vmm_range_release(v, r);
        uint32_t back = VMM_PAGE_NONE;
        rc = vmm_page_restore(v, buf, &back); /* H2D from pinned memory */
        CHECK(rc == 0, "restore: %d", rc);
        if (rc == 0) {
            CHECK(vmm_page_seal(v, back, 7, 1) == 0, "seal the restored page");
            CHECK(vmm_range_acquire(v, &r2) == 0 && vmm_range_share(v, r2, back) == 0,
                  "map the restored page");
            memset(got, 0, P);
            rc = vmm_cuda_memcpy_dtoh(b_borrowed, got, vmm_range_base(v, r2), P);
            CHECK(rc == 0 && memcmp(got, want, P) == 0, "restored bytes equal (rc %d)", rc);
            vmm_range_release(v, r2);
            vmm_page_evict(v, back);
        }
    }
    ofl_host_free(h, buf);
    free(want);
    free(got);
    ofl_host_destroy(h); /* unpins: the fake reports a registration left behind */
}

int main(void) {
    log_set_level(LOG_LEVEL_WARN);
    struct vmm_backend *b = NULL;
    int rc = vmm_cuda_backend_create(0, &b);
    if (rc == -ENOTSUP) {
        printf("cuda backend unavailable: %s\n0 passed, 0 failed, 1 skipped\n",
               vmm_cuda_why_unavailable());
        return 0;
    }
    if (rc) {
        printf("FAIL: vmm_cuda_backend_create: %d\n0 passed, 1 failed, 0 skipped\n", rc);
        return 1;
    }
    check_register(b);
    struct vmm *v = NULL;
    char err[256] = "";
    struct vmm_config vc = {.backend = b,
                            .token_bytes = 8192,
                            .page_bytes = 2u << 20,
                            .n_pages = 4,
                            .n_ranges = 2,
                            .max_tokens = 512};
    rc = vmm_create(&vc, &v, err, sizeof err);
    CHECK(rc == 0, "pool over the backend: %s", err);
    if (rc == 0) {
        check_tier(b, v);
        CHECK(vmm_check(v), "pool invariants");
        vmm_destroy(v);
    }
    printf("%u passed, %u failed, 0 skipped\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
