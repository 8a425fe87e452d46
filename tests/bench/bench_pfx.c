/* bench_pfx - what the prefix cache costs: the model fingerprint of 1 GiB of
 * weights (against SHA-256 over the same bytes, the alternative it beat), the
 * keyed page hash per page at 16 and 256 tokens a page (Llama-3-8B f16 and
 * Qwen2.5-7B pages on a GPU, DESIGN.md §2), and index insert / lookup /
 * evict per page on a host pool. Medians of 5 runs (3 for the 1 GiB ones).
 *
 * Prints a table and writes build/bench_pfx.json. Runs in a few seconds.
 */
#include <openssl/evp.h>
#include <stdio.h>
#include <string.h>

#include "tests/bench/bench_util.h"
#include "engine/model/model_fp.h"
#include "engine/core/pfx.h"
#include "vmm/vmm.h"

#define GIB    ((size_t)1 << 30)
#define N_HASH 4096 /* pages per chain timing */
#define N_IDX  8192 /* pages in the index timing pool */

static double fp_s, sha_s, chain16_ns, chain256_ns, insert_ns, lookup_ns, evict_ns;

static void bench_fingerprint(void) {
    uint8_t *w = mem_alloc(MEM_MISC, GIB);
    if (!w) {
        fprintf(stderr, "bench_pfx: no 1 GiB buffer\n");
        exit(1);
    }
    for (size_t i = 0; i < GIB; i += 8)
        memcpy(w + i, &i, 8);
    const void *bufs[1] = {w};
    size_t lens[1] = {GIB};
    uint8_t out[32];
    double t[3];
    for (int r = 0; r < 3; r++) {
        double t0 = bench_now();
        model_fingerprint(bufs, lens, 1, 1, out);
        t[r] = bench_now() - t0;
    }
    fp_s = bench_median(t, 3);
    unsigned len;
    for (int r = 0; r < 3; r++) {
        double t0 = bench_now();
        EVP_Digest(w, GIB, out, &len, EVP_sha256(), NULL);
        t[r] = bench_now() - t0;
    }
    sha_s = bench_median(t, 3);
    mem_free(w);
}

static struct vmm *pool(size_t token_bytes, size_t page_bytes, uint32_t n_pages) {
    struct vmm_config cfg = {.huge = VMM_HUGE_OFF,
                             .token_bytes = token_bytes,
                             .page_bytes = page_bytes,
                             .n_pages = n_pages,
                             .n_ranges = 1,
                             .max_tokens = (uint32_t)(n_pages * (page_bytes / token_bytes))};
    struct vmm *v = NULL;
    char err[256];
    if (vmm_create(&cfg, &v, err, sizeof err)) {
        fprintf(stderr, "bench_pfx: vmm_create: %s\n", err);
        exit(1);
    }
    return v;
}

static struct pfx *cache(struct vmm *v) {
    struct pfx_config cfg = {.evict_scan_max = 64};
    memset(cfg.secret, 7, sizeof cfg.secret);
    struct pfx *p = NULL;
    if (pfx_create(&cfg, v, &p)) {
        fprintf(stderr, "bench_pfx: pfx_create failed\n");
        exit(1);
    }
    return p;
}

/* ns per page of pfx_chain over N_HASH pages of tpp tokens. */
static double bench_chain(size_t token_bytes, uint32_t tpp) {
    struct vmm *v = pool(token_bytes, token_bytes * tpp, 4);
    struct pfx *p = cache(v);
    int32_t *tok = mem_alloc(MEM_MISC, (size_t)N_HASH * tpp * sizeof *tok);
    struct pfx_hash *h = mem_alloc(MEM_MISC, N_HASH * sizeof *h);
    for (size_t i = 0; i < (size_t)N_HASH * tpp; i++)
        tok[i] = (int32_t)(i * 2654435761u % 128000);
    struct pfx_ns ns = {.bytes = "tenant-0001", .n_bytes = 11};
    double t[5];
    for (int r = 0; r < 5; r++) {
        uint32_t n = 0;
        double t0 = bench_now();
        pfx_chain(p, &ns, 1, tok, N_HASH * tpp, h, &n);
        t[r] = (bench_now() - t0) * 1e9 / N_HASH;
    }
    mem_free(tok);
    mem_free(h);
    pfx_destroy(p);
    vmm_destroy(v);
    return bench_median(t, 5);
}

/* Insert N_IDX pages of one range, release it, look every page up, evict all. */
static void bench_index(void) {
    struct vmm *v = pool(64, 4096, N_IDX);
    struct pfx *p = cache(v);
    struct pfx_hash *h = mem_alloc(MEM_MISC, N_IDX * sizeof *h);
    int32_t *tok = mem_alloc(MEM_MISC, (size_t)N_IDX * 64 * sizeof *tok);
    for (size_t i = 0; i < (size_t)N_IDX * 64; i++)
        tok[i] = (int32_t)i;
    struct pfx_ns ns = {0};
    uint32_t n = 0, r, page;
    double ti[5], tl[5], te[5];
    pfx_chain(p, &ns, 1, tok, N_IDX * 64, h, &n);
    for (int rep = 0; rep < 5; rep++) {
        vmm_range_acquire(v, &r);
        vmm_range_grow(v, r, N_IDX * 64);
        double t0 = bench_now();
        for (uint32_t i = 0; i < N_IDX; i++)
            pfx_insert(p, &h[i], vmm_range_page(v, r, i), 1, PFX_PRIO_NORMAL);
        ti[rep] = (bench_now() - t0) * 1e9 / N_IDX;
        vmm_range_release(v, r);
        t0 = bench_now();
        for (uint32_t i = 0; i < N_IDX; i++)
            pfx_lookup(p, &h[i], 1, &page);
        tl[rep] = (bench_now() - t0) * 1e9 / N_IDX;
        uint32_t got = 0;
        t0 = bench_now();
        pfx_evict(p, N_IDX, &got);
        te[rep] = (bench_now() - t0) * 1e9 / (got ? got : 1);
    }
    insert_ns = bench_median(ti, 5);
    lookup_ns = bench_median(tl, 5);
    evict_ns = bench_median(te, 5);
    mem_free(h);
    mem_free(tok);
    pfx_destroy(p);
    vmm_destroy(v);
}

int main(void) {
    bench_fingerprint();
    chain16_ns = bench_chain(256, 16);
    chain256_ns = bench_chain(64, 256);
    bench_index();
    printf("model fingerprint (2 x XXH3-128), 1 GiB   %8.3f s\n", fp_s);
    printf("SHA-256 (OpenSSL), 1 GiB                 %8.3f s\n", sha_s);
    printf("page hash, 16 tokens/page                %8.0f ns/page\n", chain16_ns);
    printf("page hash, 256 tokens/page               %8.0f ns/page\n", chain256_ns);
    printf("index insert (seal in vmm)               %8.0f ns/page\n", insert_ns);
    printf("index lookup (hit)                       %8.0f ns/page\n", lookup_ns);
    printf("evict (vmm_page_evict)                   %8.0f ns/page\n", evict_ns);
    FILE *f = fopen("build/bench_pfx.json", "w");
    if (!f) {
        perror("bench_pfx: build/bench_pfx.json");
        return 1;
    }
    fprintf(f,
            "{\"fingerprint_1gib_s\": %.4f, \"sha256_1gib_s\": %.4f, \"page_hash_16_ns\": %.0f, "
            "\"page_hash_256_ns\": %.0f, \"insert_ns\": %.0f, \"lookup_ns\": %.0f, "
            "\"evict_ns\": %.0f}\n",
            fp_s, sha_s, chain16_ns, chain256_ns, insert_ns, lookup_ns, evict_ns);
    fclose(f);
    printf("wrote build/bench_pfx.json\n");
    return 0;
}
