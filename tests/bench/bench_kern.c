/* bench_kern - CPU kernel throughput next to the machine's read bandwidth.
 *
 * Prints, as medians of several runs: DRAM read bandwidth (streaming sum over
 * a 256 MiB buffer, 1 and 2 threads), decode matmul GB/s (4096 x 4096 weights,
 * one token: weight bytes / time), prefill matmul GFLOP/s (n_tok tokens), an
 * empty kern_pool_run, and decode attention. `make bench` runs it; env
 * BENCH_REPS overrides the repetition count.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/kern.h"
#include "mem.h"
#include "tests/bench/bench_util.h"

#define N_DIM    4096
#define BW_BYTES (256u << 20)

/* ---- matmul ---- */

static void *make_weights(enum kern_wtype t, int n_in, int n_out) {
    size_t rb = kern_row_bytes(t, n_in);
    unsigned char *w = mem_alloc(MEM_MISC, rb * (size_t)n_out);
    float *row = mem_alloc(MEM_MISC, sizeof(float) * (size_t)n_in);
    unsigned s = 1;
    for (int r = 0; r < n_out; r++) {
        for (int i = 0; i < n_in; i++)
            row[i] = (float)((s = s * 1103515245u + 12345u) >> 8) / 16777216.0f - 0.5f;
        void *d = w + rb * (size_t)r;
        if (t == KERN_W_F32)
            memcpy(d, row, rb);
        else if (t == KERN_W_F16)
            kern_f32_to_f16(d, row, n_in);
        else if (t == KERN_W_Q8_0)
            kern_quantize_row_q8_0(row, d, n_in);
        else if (t == KERN_W_Q4_K)
            kern_quantize_row_q4_K(row, d, n_in);
        else if (t == KERN_W_Q5_K)
            kern_quantize_row_q5_K(row, d, n_in);
        else if (t == KERN_W_Q6_K)
            kern_quantize_row_q6_K(row, d, n_in);
        else
            kern_quantize_row_q4_0(row, d, n_in);
    }
    mem_free(row);
    return w;
}

static double bench_matmul(struct kern_pool *p, enum kern_wtype t, const void *w, int n_tok,
                           int reps) {
    float *x = mem_alloc(MEM_MISC, sizeof(float) * (size_t)N_DIM * n_tok);
    float *y = mem_alloc(MEM_MISC, sizeof(float) * (size_t)N_DIM * n_tok);
    for (int i = 0; i < N_DIM * n_tok; i++)
        x[i] = (float)(i % 97) / 97.0f - 0.5f;
    double v[64];
    kern_matmul(p, y, x, w, t, N_DIM, N_DIM, n_tok); /* warm: scratch, pages */
    for (int r = 0; r < reps; r++) {
        double t0 = bench_now();
        kern_matmul(p, y, x, w, t, N_DIM, N_DIM, n_tok);
        v[r] = bench_now() - t0;
    }
    mem_free(y);
    mem_free(x);
    return bench_median(v, reps);
}

static void empty_fn(void *a, int ith, int nth) {
    (void)a;
    (void)ith;
    (void)nth;
}

int main(void) {
    const char *e = getenv("BENCH_REPS");
    int reps = e ? atoi(e) : 7;
    if (reps < 1 || reps > 31)
        reps = 7;
    const int prefill_tok = 128;
    printf("bench_kern: isa %s, median of %d runs\n", kern_isa_name(kern_isa()), reps);

    struct kern_pool *pools[2];
    kern_pool_create(1, &pools[0]);
    kern_pool_create(2, &pools[1]);
    /* the baseline: bench_util.h's streaming sum, on the same pools */
    double bw1 = bench_read_bandwidth(pools[0], BW_BYTES, reps) * 1e-9;
    double bw2 = bench_read_bandwidth(pools[1], BW_BYTES, reps) * 1e-9;
    printf("memory read (256 MiB streaming sum): %.1f GB/s 1 thread, %.1f GB/s 2 threads\n", bw1,
           bw2);

    const enum kern_wtype types[] = {KERN_W_F32,  KERN_W_F16,  KERN_W_Q8_0, KERN_W_Q4_0,
                                     KERN_W_Q4_K, KERN_W_Q5_K, KERN_W_Q6_K};
    const char *names[] = {"f32", "f16", "q8_0", "q4_0", "q4_K", "q5_K", "q6_K"};
    printf(
        "\nmatmul %dx%d   decode GB/s (1 thr / 2 thr)   prefill n_tok=%d GFLOP/s (1 thr / 2 thr)\n",
        N_DIM, N_DIM, prefill_tok);
    for (int ti = 0; ti < (int)(sizeof(types) / sizeof(types[0])); ti++) {
        void *w = make_weights(types[ti], N_DIM, N_DIM);
        double mb = (double)kern_row_bytes(types[ti], N_DIM) * N_DIM;
        double d[2], pf[2];
        for (int i = 0; i < 2; i++) {
            d[i] = mb / bench_matmul(pools[i], types[ti], w, 1, reps) * 1e-9;
            pf[i] = 2.0 * N_DIM * N_DIM * prefill_tok /
                    bench_matmul(pools[i], types[ti], w, prefill_tok, reps < 5 ? reps : 5) * 1e-9;
        }
        printf("  %-5s (%5.1f MB)   %6.1f / %6.1f  (%.2f / %.2f of read bw)   %7.1f / %7.1f\n",
               names[ti], mb * 1e-6, d[0], d[1], d[0] / bw1, d[1] / bw2, pf[0], pf[1]);
        mem_free(w);
    }

    double v[64];
    for (int r = 0; r < reps; r++) {
        double t0 = bench_now();
        for (int i = 0; i < 10000; i++)
            kern_pool_run(pools[1], empty_fn, NULL);
        v[r] = (bench_now() - t0) / 10000 * 1e6;
    }
    printf("\nkern_pool_run, 2 threads, empty fn: %.2f us\n", bench_median(v, reps));

    /* decode attention: dummy-1g shape (12 heads / 4 kv, head_dim 128), every
     * cache type, at 2k and 8k keys: the bytes read per key fall with the
     * type, the dequantization work rises */
    const int nh = 12, nkv = 4, hd = 128, ctxs[2] = {2048, 8192};
    float *q = mem_alloc(MEM_MISC, sizeof(float) * (size_t)nh * hd);
    float *o = mem_alloc(MEM_MISC, sizeof(float) * (size_t)nh * hd);
    float *row = mem_alloc(MEM_MISC, sizeof(float) * (size_t)nkv * hd);
    for (int i = 0; i < nh * hd; i++)
        q[i] = (float)((i * 37) % 101) / 101.0f - 0.5f;
    static const char *const kvn[KERN_KV_N] = {"f32", "f16", "q8_0", "q4_0", "fp8"};
    printf("\nattention decode, 12/4 heads x 128 (us a token; GB/s of KV read), threads 1 / 2:\n");
    for (int t = 0; t < KERN_KV_N; t++) {
        const size_t rb = kern_kv_row_bytes((enum kern_kv_type)t, nkv, hd), stride = 2 * rb;
        unsigned char *kvbuf = mem_alloc(MEM_MISC, (size_t)ctxs[1] * stride);
        for (int tok = 0; tok < ctxs[1]; tok++)
            for (int s2 = 0; s2 < 2; s2++) {
                for (int i = 0; i < nkv * hd; i++)
                    row[i] =
                        (float)(((tok * 131 + s2 * 17 + i) * 2654435761u) >> 20) / 4096.0f - 0.5f;
                kern_kv_store(kvbuf + (size_t)tok * stride + (size_t)s2 * rb, row, nkv, hd,
                              (enum kern_kv_type)t);
            }
        struct kern_kv kv = {.k = kvbuf,
                             .v = kvbuf + rb,
                             .stride_bytes = stride,
                             .type = (enum kern_kv_type)t,
                             .n_head = nh,
                             .n_kv_head = nkv,
                             .head_dim = hd};
        for (int c = 0; c < 2; c++) {
            double med[2];
            for (int i = 0; i < 2; i++) {
                for (int r = 0; r < reps; r++) {
                    double t0 = bench_now();
                    kern_attention(pools[i], o, q, 1, ctxs[c] - 1, &kv);
                    v[r] = (bench_now() - t0) * 1e6;
                }
                med[i] = bench_median(v, reps);
            }
            printf("  %-5s %5d keys (%4zu B a key): %7.0f / %7.0f us  (%5.1f / %5.1f GB/s)\n",
                   kvn[t], ctxs[c], stride, med[0], med[1],
                   (double)ctxs[c] * stride / (med[0] * 1e3),
                   (double)ctxs[c] * stride / (med[1] * 1e3));
        }
        mem_free(kvbuf);
    }
    mem_free(row);
    mem_free(o);
    mem_free(q);
    kern_pool_destroy(pools[0]);
    kern_pool_destroy(pools[1]);
    return 0;
}
