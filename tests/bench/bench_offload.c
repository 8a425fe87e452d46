/* bench_offload - restore vs recompute: the time to first token of a request
 * whose long prefix is (a) not cached: recomputed, (b) cached on the device,
 * (c) in the host tier, (d) in the NVMe tier, measured in one run on the same
 * model and prompt. The prefill in (a) is the baseline.
 *
 *   bench_offload [MODEL PREFIX_TOKENS [REPS]]
 *
 * Default: stories260K (../shared/models) with a 400-token prefix, else
 * dummy:tiny; `bench_offload dummy:dummy-1g 8000 3` is the long-context
 * figure in docs/benchmarks.md (a few minutes). The NVMe tier is a file in
 * $TMPDIR (default /tmp). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/bench/bench_util.h"
#include "llmd.h"

struct bo_req {
    double t_submit, t_first;
    bool done;
};

static void bo_on_token(void *user, uint64_t id, int32_t token, const char *text, size_t len,
                        enum llmd_finish finish) {
    (void)id;
    (void)token;
    (void)text;
    (void)len;
    struct bo_req *r = user;
    if (r->t_first == 0)
        r->t_first = bench_now();
    if (finish != LLMD_FINISH_NONE)
        r->done = true;
}

/* Time to first token of prompt[0..n) with one generated token. */
static double bo_ttft(struct llmd_engine *e, const int32_t *prompt, uint32_t n) {
    struct bo_req r = {0};
    struct llmd_request q = {.prompt_ids = prompt,
                             .n_prompt_ids = n,
                             .max_tokens = 1,
                             .on_token = bo_on_token,
                             .user = &r};
    uint64_t id;
    r.t_submit = bench_now();
    if (llmd_submit(e, &q, &id, NULL) < 0)
        return -1;
    while (llmd_engine_step(e) > 0) {
    }
    return r.done ? r.t_first - r.t_submit : -1;
}

static struct llmd_engine *bo_open(const char *model, uint32_t n_ctx, uint64_t kv_pages,
                                   uint64_t page_bytes, uint64_t host, const char *nvme,
                                   int no_cache) {
    struct llmd_engine_config c = {.model = model,
                                   .n_ctx = n_ctx,
                                   .max_seqs = 1,
                                   .max_batched_tokens = 512,
                                   .kv_budget_bytes = kv_pages * page_bytes,
                                   .no_prefix_cache = no_cache,
                                   .host_tier_bytes = host,
                                   .nvme_tier_path = nvme,
                                   .nvme_tier_bytes = 2 * kv_pages * page_bytes + (64u << 20),
                                   .offload_always = 1};
    struct llmd_engine *e = NULL;
    char err[512] = "";
    if (llmd_engine_open(&c, &e, err, sizeof err) < 0) {
        fprintf(stderr, "bench_offload: %s\n", err);
        exit(1);
    }
    return e;
}

int main(int argc, char **argv) {
    const char *model = "../shared/models/stories260K-f32.gguf";
    uint32_t n_prefix = 400;
    int reps = 5;
    if (access(model, R_OK) != 0)
        model = "dummy:tiny";
    if (argc >= 3) {
        model = argv[1];
        n_prefix = (uint32_t)atoi(argv[2]);
    }
    if (argc >= 4)
        reps = atoi(argv[3]);
    if (n_prefix < 32 || reps < 1 || reps > 50) {
        fprintf(stderr, "usage: bench_offload [MODEL PREFIX_TOKENS [REPS]]\n");
        return 2;
    }
    uint32_t n = n_prefix + 1, n_ctx = n + 16;
    int32_t *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
    srand(1);
    a[0] = b[0] = 1;
    for (uint32_t i = 1; i < n; i++) {
        a[i] = 3 + rand() % 250;
        b[i] = 3 + rand() % 250;
    }
    char nvme[256];
    snprintf(nvme, sizeof nvme, "%s/llmd-bench-offload-%d.slots",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid());

    /* page geometry from a throwaway engine */
    struct llmd_engine *e = bo_open(model, n_ctx, 0, 0, 0, NULL, 1);
    struct llmd_stats st;
    llmd_stats_get(e, &st);
    uint64_t page = st.kv_page_bytes, seq_pages = st.kv_pages_total;
    double t[50], med[4];
    for (int i = 0; i < reps; i++)
        t[i] = bo_ttft(e, a, n);
    med[0] = bench_median(t, reps);
    llmd_engine_close(e);

    /* device hit: the second run of the same prompt */
    e = bo_open(model, n_ctx, seq_pages + 2, page, 0, NULL, 0);
    bo_ttft(e, a, n);
    for (int i = 0; i < reps; i++)
        t[i] = bo_ttft(e, a, n);
    med[1] = bench_median(t, reps);
    llmd_engine_close(e);

    /* host tier: a pool of one sequence; b evicts a (to the host), a evicts b */
    e = bo_open(model, n_ctx, seq_pages + 2, page, 4 * seq_pages * page + (8u << 20), NULL, 0);
    bo_ttft(e, a, n);
    bo_ttft(e, b, n);
    for (int i = 0; i < reps; i++) {
        t[i] = bo_ttft(e, a, n);
        bo_ttft(e, b, n);
    }
    med[2] = bench_median(t, reps);
    llmd_stats_get(e, &st);
    if (st.restores_host_total == 0)
        fprintf(stderr, "bench_offload: no host restore happened: the figure is not one\n");
    llmd_engine_close(e);

    /* NVMe tier: a host tier of two pages, so everything goes on to NVMe */
    e = bo_open(model, n_ctx, seq_pages + 2, page, 2 * page, nvme, 0);
    bo_ttft(e, a, n);
    bo_ttft(e, b, n);
    for (int i = 0; i < reps; i++) {
        t[i] = bo_ttft(e, a, n);
        bo_ttft(e, b, n);
    }
    med[3] = bench_median(t, reps);
    llmd_stats_get(e, &st);
    llmd_engine_close(e);
    unlink(nvme);
    char idx[300];
    snprintf(idx, sizeof idx, "%s.idx", nvme);
    unlink(idx);

    printf("restore vs recompute: %s, %u-token prefix, %lu-byte pages, TTFT median of %d\n", model,
           n_prefix, (unsigned long)page, reps);
    printf("  %-22s %10s %10s\n", "prefix from", "TTFT ms", "vs recompute");
    static const char *const what[] = {"recompute (no cache)", "device (prefix hit)",
                                       "host tier (restore)", "NVMe tier (restore)"};
    for (int i = 0; i < 4; i++)
        printf("  %-22s %10.2f %9.2fx\n", what[i], med[i] * 1e3, med[0] / med[i]);
    printf("  NVMe tier: %lu restores, %lu checksum failures\n",
           (unsigned long)st.restores_nvme_total,
           (unsigned long)st.offload_checksum_failures_total);
    free(a);
    free(b);
    return 0;
}
