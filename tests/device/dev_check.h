/* dev_check.h - the harness the tests/device programs share: CHECK(cond,
 * fmt, ...) counts a pass, or prints "FAIL file:line: cond: message" and
 * counts a failure; each program ends with dev_summary(), the
 * "N passed, N failed, N skipped" line tests/device/run.sh sums. Plain C
 * (the device machine may lack Criterion). Header-only: each program is
 * its own binary. */
#ifndef LLMD_DEV_CHECK_H
#define LLMD_DEV_CHECK_H

#include <stdio.h>

static unsigned n_pass, n_fail;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (cond) {                                                                                \
            n_pass++;                                                                              \
        } else {                                                                                   \
            n_fail++;                                                                              \
            printf("FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                                 \
            printf(__VA_ARGS__);                                                                   \
            printf("\n");                                                                          \
        }                                                                                          \
    } while (0)

#endif /* LLMD_DEV_CHECK_H */
