/* dev_bench.h - what the tests/device benchmarks share: their table goes to
 * stdout and to $OUT/device/<name> (the device tool brings that back), a
 * monotonic clock, and the roofline they compare against: a device-to-device
 * cudaMemcpy, timed with CUDA events, (bytes read + written) / median time.
 * Header-only: each benchmark is its own binary. Needs the CUDA runtime. */
#ifndef LLMD_DEV_BENCH_H
#define LLMD_DEV_BENCH_H

#include <cuda_runtime_api.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

static FILE *dev_out; /* $OUT/device/<name>, or NULL */

/* Open $OUT/device/<name> for writing when $OUT is set. */
static void dev_out_open(const char *name) {
    const char *dir = getenv("OUT");
    if (!dir || !*dir)
        return;
    char path[4096];
    snprintf(path, sizeof(path), "%s/device", dir);
    mkdir(path, 0755); /* may exist */
    snprintf(path, sizeof(path), "%s/device/%s", dir, name);
    dev_out = fopen(path, "w");
    if (!dev_out)
        printf("cannot write %s: %s\n", path, strerror(errno));
}

/* printf to stdout and to the output file when open. */
static void dev_say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void dev_say(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    if (dev_out) {
        va_start(ap, fmt);
        vfprintf(dev_out, fmt, ap);
        va_end(ap);
    }
    fflush(stdout);
}

static double dev_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int dev_cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median of v[0..n), n >= 1; sorts v. */
static double dev_median(double *v, int n) {
    qsort(v, (size_t)n, sizeof(double), dev_cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* A cudaMemcpy device to device of `bytes` on the legacy stream, `warm`
 * untimed then `runs` (<= 64) timed: (read + written bytes) per second over
 * the median time. 0 when a CUDA call failed. */
static double dev_d2d_bps(size_t bytes, int warm, int runs) {
    void *a = NULL, *c = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    double t[64], bps = 0;
    int ok = runs > 0 && runs <= 64 && cudaMalloc(&a, bytes) == cudaSuccess &&
             cudaMalloc(&c, bytes) == cudaSuccess && cudaMemset(a, 1, bytes) == cudaSuccess &&
             cudaEventCreate(&e0) == cudaSuccess && cudaEventCreate(&e1) == cudaSuccess;
    for (int r = -warm; ok && r < runs; r++) {
        float ms = 0;
        ok = cudaEventRecord(e0, NULL) == cudaSuccess &&
             cudaMemcpyAsync(c, a, bytes, cudaMemcpyDeviceToDevice, NULL) == cudaSuccess &&
             cudaEventRecord(e1, NULL) == cudaSuccess && cudaEventSynchronize(e1) == cudaSuccess &&
             cudaEventElapsedTime(&ms, e0, e1) == cudaSuccess;
        if (r >= 0)
            t[r] = ms * 1e-3;
    }
    if (ok)
        bps = 2.0 * (double)bytes / dev_median(t, runs);
    if (e0)
        cudaEventDestroy(e0);
    if (e1)
        cudaEventDestroy(e1);
    cudaFree(a);
    cudaFree(c);
    return bps;
}

#endif /* LLMD_DEV_BENCH_H */
