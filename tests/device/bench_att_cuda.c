/* bench_att_cuda.c - decode attention bandwidth over token-major KV in real
 * VMM pages against a contiguous per-layer layout: DESIGN.md §2's question
 * of what the strided, page-mapped layout costs on a GPU (TLB reach, DRAM
 * locality).
 *
 * Shape: Llama-3-8B (32 layers, 8 KV heads, head_dim 128, f16; 32 query
 * heads): one token's K+V for all layers is S = 128 KiB, a 2 MiB page holds
 * 16 tokens, and a decode step of one layer reads a 2 KiB K row and a 2 KiB V
 * row every 128 KiB. Layouts, both read by the same kcu_attention call:
 *
 *  - vmm: a vmm pool over the CUDA backend (vmm_cuda_backend_create + vmm_create,
 *    2 MiB pages), one range per sequence grown to T tokens; layer 16's K/V
 *    (mid-token offsets), stride S.
 *  - contig: cudaMalloc, K of the layer as [T][8*128] f16 rows back to back,
 *    V after it: stride = 2 KiB (the layer's row), v_off = T * 2 KiB.
 *
 * For T = 8k and 32k keys and batches of 1 and 8 sequences, it times
 * kcu_attention (cudaEvents around each call, L2 flushed in between by a
 * 256 MiB memset outside the timed region; median of 25 runs after 3
 * warm-ups) and reports GB/s = bytes of K+V read / median time, and the
 * ratio to the device-to-device cudaMemcpy bandwidth measured in the same run
 * (counting the bytes read plus the bytes written). Output: a table on
 * stdout, also written to $OUT/device/bench_att.txt when $OUT is set.
 * Without a GPU: "cuda unavailable: <reason>", exit 0. Memory: 32 GiB of
 * pool pages + ~2 GiB; about 10-20 s on an H200, most of it creating and
 * mapping the 16,384 pages.
 *
 * Build (after `make cuda`):
 *   cc -std=c17 -D_GNU_SOURCE -I. -Iinclude -I$CUDA_HOME/include -Wall -Wextra
 *      -Wshadow -Werror -O2 -g -pthread -o build/cuda/tests/device/bench_att_cuda
 *      tests/device/bench_att_cuda.c build/cuda/libllmd.a
 *      -L$CUDA_HOME/lib64 -lcudart -lcublas -lstdc++ -ldl -lm -pthread
 */
#include <cuda_runtime.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "mem.h"
#include "kernels/kern.h"
#include "kernels/kern_cuda.h"
#include "vmm/vmm.h"
#include "vmm/vmm_backend.h"
#include "vmm/vmm_cuda_util.h"
#include "tests/device/dev_bench.h"

#define N_LAYER   32
#define N_HEAD    32
#define N_HEAD_KV 8
#define HEAD_DIM  128
#define LAYER     16                                 /* the layer read: K/V mid-token */
#define ROW_BYTES ((size_t)N_HEAD_KV * HEAD_DIM * 2) /* 2 KiB: one layer's K of a token */
#define TOK_BYTES ((size_t)N_LAYER * 2 * ROW_BYTES)  /* S = 128 KiB */
#define PAGE      ((size_t)2 << 20)                  /* 2 MiB */
#define MAX_SEQS  8
#define MAX_T     32768
#define N_RUNS    25
#define N_WARM    3
#define FLUSH     ((size_t)256 << 20) /* > L2 (50 MiB on H100/H200) several times over */
#define MEMCPY_B  ((size_t)1 << 30)

#define CU(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            dev_say("bench_att_cuda: %s:%d: %s: %s\n", __FILE__, __LINE__, #call,                  \
                    cudaGetErrorString(e_));                                                       \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static int cmp_f(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

struct bench {
    float *q, *out;
    void *ws, *flush;
    size_t ws_bytes;
    struct kcu_att_seq *dseqs;
    cudaEvent_t ev[2 * N_RUNS];
};

/* Median milliseconds of one kcu_attention call over N_RUNS, or a negative
 * value when a call failed. Each timed call starts with a cold L2. */
static float time_attention(struct bench *b, const struct kcu_att_seq *seqs, int n_seqs,
                            const struct kcu_att_shape *sh) {
    CU(cudaMemcpy(b->dseqs, seqs, sizeof(*seqs) * n_seqs, cudaMemcpyHostToDevice));
    float ms[N_RUNS];
    for (int r = -N_WARM; r < N_RUNS; r++) {
        CU(cudaMemsetAsync(b->flush, r & 0xff, FLUSH, NULL));
        if (r >= 0)
            CU(cudaEventRecord(b->ev[2 * r], NULL));
        int rc = kcu_attention(NULL, b->out, b->q, b->dseqs, seqs, n_seqs, sh, b->ws, b->ws_bytes);
        if (rc) {
            dev_say("bench_att_cuda: kcu_attention: %d\n", rc);
            return -1.0f;
        }
        if (r >= 0)
            CU(cudaEventRecord(b->ev[2 * r + 1], NULL));
    }
    CU(cudaDeviceSynchronize());
    for (int r = 0; r < N_RUNS; r++)
        CU(cudaEventElapsedTime(&ms[r], b->ev[2 * r], b->ev[2 * r + 1]));
    qsort(ms, N_RUNS, sizeof(ms[0]), cmp_f);
    return ms[N_RUNS / 2];
}

/* Every output element must be the (uniform) V value: the kernel read the
 * pages it was pointed at. */
static bool check_out(const struct bench *b, int n_seqs, float want) {
    const size_t n = (size_t)n_seqs * N_HEAD * HEAD_DIM;
    float *h = mem_alloc(MEM_TEST, n * sizeof(float));
    if (!h)
        return false;
    CU(cudaMemcpy(h, b->out, n * sizeof(float), cudaMemcpyDeviceToHost));
    bool ok = true;
    for (size_t i = 0; i < n && ok; i++)
        ok = fabsf(h[i] - want) <= 1e-3f * fabsf(want);
    mem_free(h);
    return ok;
}

static int n_pass, n_fail; /* rows whose output was right, or wrong */

static void row(const char *layout, int T, int n_seqs, float ms, double memcpy_gbs, bool ok) {
    ok ? n_pass++ : n_fail++;
    const double bytes = (double)n_seqs * T * 2.0 * ROW_BYTES;
    const double gbs = ms > 0 ? bytes / (ms * 1e-3) / 1e9 : 0.0;
    dev_say("%-7s %6d %5d %10.1f %10.1f %8.1f %9.2f %s\n", layout, T, n_seqs, bytes / (1 << 20),
            ms * 1e3, gbs, gbs / memcpy_gbs, ok ? "ok" : "WRONG OUTPUT");
}

int main(void) {
    int n_dev = 0;
    cudaError_t e = cudaGetDeviceCount(&n_dev);
    if (e != cudaSuccess || n_dev == 0) {
        printf("cuda unavailable: %s\n0 passed, 0 failed, 1 skipped\n",
               e != cudaSuccess ? cudaGetErrorString(e) : "no CUDA device");
        return 0;
    }
    /* the backend retains the primary context the runtime then uses */
    struct vmm_backend *be = NULL;
    int rc = vmm_cuda_backend_create(0, &be);
    if (rc == -ENOTSUP) {
        printf("cuda unavailable: %s\n0 passed, 0 failed, 1 skipped\n", vmm_cuda_why_unavailable());
        return 0;
    }
    if (rc) {
        printf("bench_att_cuda: vmm_cuda_backend_create: %d (%s)\n", rc,
               vmm_cuda_why_unavailable());
        return 1;
    }
    CU(cudaSetDevice(0));
    dev_out_open("bench_att.txt");
    struct cudaDeviceProp prop;
    CU(cudaGetDeviceProperties(&prop, 0));
    dev_say("# bench_att_cuda: decode attention, Llama-3-8B shape (32 layers, %d/%d heads, "
            "head_dim %d, f16 KV), layer %d\n",
            N_HEAD, N_HEAD_KV, HEAD_DIM, LAYER);
    dev_say("# device: %s, %d SMs, %.1f GiB\n", prop.name, prop.multiProcessorCount,
            (double)prop.totalGlobalMem / (1 << 30));

    const double t0 = dev_now_s();
    const struct vmm_config cfg = {.backend = be,
                                   .token_bytes = TOK_BYTES,
                                   .page_bytes = PAGE,
                                   .n_pages = MAX_SEQS * (MAX_T / (PAGE / TOK_BYTES)),
                                   .n_ranges = MAX_SEQS,
                                   .max_tokens = MAX_T};
    struct vmm *v = NULL;
    char err[256] = "";
    rc = vmm_create(&cfg, &v, err, sizeof(err));
    if (rc) {
        dev_say("bench_att_cuda: vmm_create: %d %s\n", rc, err);
        return 1;
    }
    dev_say("# vmm pool: %u pages of %zu KiB (%u tokens each), S = %zu KiB, created in %.2f s\n",
            vmm_n_pages(v), vmm_page_bytes(v) >> 10, vmm_tokens_per_page(v),
            vmm_token_bytes(v) >> 10, dev_now_s() - t0);
    uint32_t ranges[MAX_SEQS];
    for (int i = 0; i < MAX_SEQS; i++) {
        rc = vmm_range_acquire(v, &ranges[i]);
        if (rc) {
            dev_say("bench_att_cuda: vmm_range_acquire: %d\n", rc);
            return 1;
        }
    }

    struct bench b = {0};
    CU(cudaMalloc((void **)&b.q, (size_t)MAX_SEQS * N_HEAD * HEAD_DIM * sizeof(float)));
    CU(cudaMalloc((void **)&b.out, (size_t)MAX_SEQS * N_HEAD * HEAD_DIM * sizeof(float)));
    CU(cudaMemset(b.q, 0, (size_t)MAX_SEQS * N_HEAD * HEAD_DIM * sizeof(float)));
    b.ws_bytes = kcu_attention_ws_bytes(MAX_SEQS, N_HEAD, HEAD_DIM, MAX_T);
    CU(cudaMalloc(&b.ws, b.ws_bytes));
    CU(cudaMalloc(&b.flush, FLUSH));
    CU(cudaMalloc((void **)&b.dseqs, sizeof(struct kcu_att_seq) * MAX_SEQS));
    for (int i = 0; i < 2 * N_RUNS; i++)
        CU(cudaEventCreate(&b.ev[i]));
    /* contiguous layout: per sequence [MAX_T][row] of K then the V rows */
    uint8_t *contig[MAX_SEQS];
    for (int i = 0; i < MAX_SEQS; i++) {
        CU(cudaMalloc((void **)&contig[i], 2 * (size_t)MAX_T * ROW_BYTES));
        CU(cudaMemset(contig[i], 0x20, 2 * (size_t)MAX_T * ROW_BYTES));
    }
    /* every K/V element is f16 0x2020, so every output element is that value */
    const float want = kern_f16_to_f32_1(0x2020);

    const double cp = dev_d2d_bps(MEMCPY_B, 2, 11) / 1e9;
    dev_say("# cudaMemcpy D2D: %.1f GB/s (bytes read + written; the roofline below)\n", cp);
    dev_say("%-7s %6s %5s %10s %10s %8s %9s\n", "layout", "ctx", "batch", "KV_MiB", "median_us",
            "GB/s", "/memcpy");

    const int ctxs[2] = {8192, MAX_T}, batches[2] = {1, MAX_SEQS};
    for (int ci = 0; ci < 2; ci++) {
        const int T = ctxs[ci];
        const double tg = dev_now_s();
        for (int i = 0; i < MAX_SEQS; i++) {
            rc = vmm_range_grow(v, ranges[i], (uint32_t)T);
            if (rc) {
                dev_say("bench_att_cuda: vmm_range_grow to %d: %d\n", T, rc);
                return 1;
            }
            CU(cudaMemset((void *)vmm_range_base(v, ranges[i]), 0x20, (size_t)T * TOK_BYTES));
        }
        CU(cudaDeviceSynchronize());
        dev_say("# grew %d ranges to %d tokens and filled them in %.2f s\n", MAX_SEQS, T,
                dev_now_s() - tg);
        for (int bi = 0; bi < 2; bi++) {
            const int n = batches[bi];
            struct kcu_att_seq seqs[MAX_SEQS];
            /* vmm: token-major pages, layer LAYER's K and V inside each token */
            const struct kcu_att_shape sv = {.stride = TOK_BYTES,
                                             .k_off = 2 * LAYER * ROW_BYTES,
                                             .v_off = (2 * LAYER + 1) * ROW_BYTES,
                                             .kvt = KCU_KV_F16,
                                             .n_head = N_HEAD,
                                             .n_head_kv = N_HEAD_KV,
                                             .head_dim = HEAD_DIM};
            for (int i = 0; i < n; i++)
                seqs[i] = (struct kcu_att_seq){.base = (uint64_t)vmm_range_base(v, ranges[i]),
                                               .pos0 = T - 1,
                                               .n_tok = 1,
                                               .q_row = i};
            float ms = time_attention(&b, seqs, n, &sv);
            row("vmm", T, n, ms, cp, ms > 0 && check_out(&b, n, want));
            /* contig: the layer's K rows back to back, V after them */
            const struct kcu_att_shape sc = {.stride = ROW_BYTES,
                                             .k_off = 0,
                                             .v_off = (size_t)T * ROW_BYTES,
                                             .kvt = KCU_KV_F16,
                                             .n_head = N_HEAD,
                                             .n_head_kv = N_HEAD_KV,
                                             .head_dim = HEAD_DIM};
            for (int i = 0; i < n; i++)
                seqs[i].base = (uint64_t)(uintptr_t)contig[i];
            ms = time_attention(&b, seqs, n, &sc);
            row("contig", T, n, ms, cp, ms > 0 && check_out(&b, n, want));
        }
    }
    dev_say("# total %.1f s\n", dev_now_s() - t0);

    for (int i = 0; i < MAX_SEQS; i++) {
        CU(cudaFree(contig[i]));
        vmm_range_release(v, ranges[i]);
    }
    for (int i = 0; i < 2 * N_RUNS; i++)
        CU(cudaEventDestroy(b.ev[i]));
    CU(cudaFree(b.q));
    CU(cudaFree(b.out));
    CU(cudaFree(b.ws));
    CU(cudaFree(b.flush));
    CU(cudaFree(b.dseqs));
    vmm_destroy(v); /* destroys the backend too */
    dev_say("%d passed, %d failed, 0 skipped\n", n_pass, n_fail);
    if (dev_out)
        fclose(dev_out);
    return n_fail ? 1 : 0;
}
