/* offload_util.h - what the tests/test_offload_*.c binaries share: a
 * request record with its output and usage, its token callback, opening an
 * engine with tiers, submitting and running to idle, and a fresh
 * temporary directory per test holding the NVMe slot file and a fixed
 * prefix-cache key (hashes must match across engine restarts). Header-only
 * (each test file is its own binary). stories260K with f32 KV: 16 tokens,
 * 20 KiB a page. */
#ifndef LLMD_OFFLOAD_TEST_UTIL_H
#define LLMD_OFFLOAD_TEST_UTIL_H

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "llmd.h"
#include "tests/lib/ref_util.h"

#define F32  REF_MODELS "/stories260K-f32.gguf"
#define PAGE 20480u /* f32 KV page of stories260K: 16 tokens x 1280 B */
#define TPP  16u
#ifndef MAX_OUT
#define MAX_OUT 64
#endif
#ifndef MAX_PROMPT
#define MAX_PROMPT 480
#endif

struct job {
    int32_t prompt[MAX_PROMPT];
    uint32_t n_prompt, max_tokens, tenant;
    uint64_t id;
    int32_t out[MAX_OUT];
    uint32_t n_out;
    enum llmd_finish finish;
    struct llmd_usage usage;
};

static inline void on_token(void *user, uint64_t id, int32_t token, const char *text, size_t len,
                            enum llmd_finish finish) {
    (void)text;
    (void)len;
    struct job *j = user;
    cr_assert_eq(id, j->id);
    if (token >= 0 && j->n_out < MAX_OUT)
        j->out[j->n_out++] = token;
    j->finish = finish;
}

static char dir[64], nvme_path[128], secret_path[128];

static inline void setup(void) {
    strcpy(dir, "/tmp/llmd-ofl-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    snprintf(nvme_path, sizeof nvme_path, "%s/kv.slots", dir);
    snprintf(secret_path, sizeof secret_path, "%s/secret", dir);
    FILE *f = fopen(secret_path, "w");
    cr_assert_not_null(f);
    fputs("000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f\n", f);
    fclose(f);
    chmod(secret_path, 0600);
}

static inline void teardown(void) {
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}

static inline void submit(struct llmd_engine *e, struct job *j) {
    struct llmd_request r = {.prompt_ids = j->prompt,
                             .n_prompt_ids = j->n_prompt,
                             .max_tokens = j->max_tokens,
                             .tenant = j->tenant,
                             .on_token = on_token,
                             .user = j,
                             .usage = &j->usage};
    j->n_out = 0;
    j->finish = LLMD_FINISH_NONE;
    memset(&j->usage, 0, sizeof j->usage);
    cr_assert_eq(llmd_submit(e, &r, &j->id, NULL), 0);
}

static inline struct llmd_stats stats(struct llmd_engine *e) {
    struct llmd_stats st;
    llmd_stats_get(e, &st);
    return st;
}

#ifndef OFFLOAD_TEST_OWN_ENGINE /* test_offload_random opens its own */
/* Engine settings the offload tests vary; the rest is fixed (2 threads, 512
 * context, f32 KV, the test's key, offload_always). */
struct eng_opts {
    uint32_t max_seqs, kv_pages, max_batched; /* max_batched 0: 128 */
    uint64_t host_bytes, nvme_bytes, page_bytes;
    bool nvme, no_cache;
};

static inline struct llmd_engine *open_engine(const struct eng_opts *o) {
    struct llmd_engine_config cfg = {.model = F32,
                                     .n_threads = 2,
                                     .n_ctx = 512,
                                     .max_seqs = o->max_seqs,
                                     .max_batched_tokens = o->max_batched ? o->max_batched : 128,
                                     .kv_budget_bytes = (uint64_t)o->kv_pages * PAGE,
                                     .page_bytes = o->page_bytes,
                                     .kv_type = LLMD_KV_F32,
                                     .no_prefix_cache = o->no_cache,
                                     .prefix_secret = secret_path,
                                     .host_tier_bytes = o->host_bytes,
                                     .nvme_tier_path = o->nvme ? nvme_path : NULL,
                                     .nvme_tier_bytes = o->nvme_bytes,
                                     .offload_always = 1};
    struct llmd_engine *e;
    char err[512] = "";
    cr_assert_eq(llmd_engine_open(&cfg, &e, err, sizeof err), 0, "open: %s", err);
    return e;
}

/* Step until idle; then no page may be left mapped. */
static inline void run(struct llmd_engine *e) {
    int live, steps = 0;
    while ((live = llmd_engine_step(e)) > 0)
        cr_assert_lt(++steps, 100000, "no progress");
    cr_assert_eq(live, 0, "step: %d", live);
    struct llmd_stats st = stats(e);
    cr_assert_eq(st.kv_pages_free + st.kv_pages_cached, st.kv_pages_total, "pages left mapped");
}
#endif /* OFFLOAD_TEST_OWN_ENGINE */

/* t[from, to) from a pseudo-random stream (seed); t[0] = BOS. */
static inline void fill(int32_t *t, uint32_t from, uint32_t to, unsigned seed) {
    srand(seed);
    for (uint32_t i = 0; i < to; i++) {
        int32_t v = 3 + rand() % 509;
        if (i >= from)
            t[i] = i == 0 ? 1 : v;
    }
}

#endif /* LLMD_OFFLOAD_TEST_UTIL_H */
