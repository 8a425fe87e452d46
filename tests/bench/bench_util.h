/* bench_util.h - what every benchmark program shares: a monotonic clock,
 * medians, and the streaming read bandwidth that bounds decode (the
 * baseline each benchmark measures in its own run). Header-only: the
 * benchmarks are separate programs. */
#ifndef LLMD_BENCH_UTIL_H
#define LLMD_BENCH_UTIL_H

#include <immintrin.h>
#include <stdlib.h>
#include <time.h>

#include "kernels/kern.h"
#include "mem.h"

static inline double bench_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline int bench_cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median of v[0..n); sorts v. */
static inline double bench_median(double *v, int n) {
    qsort(v, (size_t)n, sizeof(*v), bench_cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct bench_bw_arg {
    const float *p;
    size_t n; /* floats, a multiple of 32 * threads */
    float out[64];
};

/* Sum of a slice with four AVX2 accumulators: load-bound, not add-bound
 * (a scalar sum is limited by add latency and under-reports bandwidth). */
__attribute__((target("avx2"))) static inline void bench_bw_slice(void *arg, int ith, int nth) {
    struct bench_bw_arg *b = arg;
    size_t per = b->n / (size_t)nth, lo = per * (size_t)ith;
    const float *p = b->p + lo;
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (size_t i = 0; i + 32 <= per; i += 32) {
        s0 = _mm256_add_ps(s0, _mm256_load_ps(p + i));
        s1 = _mm256_add_ps(s1, _mm256_load_ps(p + i + 8));
        s2 = _mm256_add_ps(s2, _mm256_load_ps(p + i + 16));
        s3 = _mm256_add_ps(s3, _mm256_load_ps(p + i + 24));
    }
    float t[8];
    _mm256_storeu_ps(t, _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    b->out[ith & 63] = t[0] + t[1] + t[2] + t[3] + t[4] + t[5] + t[6] + t[7];
}

/* Read bandwidth in bytes/s over `bytes` (>> the caches) with the pool's
 * threads: median of `reps` runs. 0 on allocation failure. */
static inline double bench_read_bandwidth(struct kern_pool *pool, size_t bytes, int reps) {
    size_t n = bytes / sizeof(float) / 256 * 256;
    float *buf = mem_alloc(MEM_MISC, n * sizeof(float));
    if (!buf)
        return 0;
    for (size_t i = 0; i < n; i++)
        buf[i] = (float)(i & 7);
    struct bench_bw_arg a = {.p = buf, .n = n};
    double t[32];
    if (reps > 32)
        reps = 32;
    for (int r = 0; r < reps; r++) {
        double t0 = bench_now();
        kern_pool_run(pool, bench_bw_slice, &a);
        t[r] = bench_now() - t0;
    }
    mem_free(buf);
    return (double)(n * sizeof(float)) / bench_median(t, reps);
}

#endif /* LLMD_BENCH_UTIL_H */
