/* offload_test_util.h - what the tests/test_offload_*.c binaries share: a
 * request record with its output and usage, its token callback, and a fresh
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
#include "ref.h"

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

#endif /* LLMD_OFFLOAD_TEST_UTIL_H */
