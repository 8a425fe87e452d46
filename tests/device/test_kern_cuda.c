/* test_kern_cuda.c - the CUDA kernels of kernels/kern_cuda.h against the CPU
 * kernels of kernels/kern.h, on seeded random inputs.
 *
 * Plain C on the CUDA runtime API (cudaMalloc/cudaMemcpy/
 * cudaDeviceSynchronize) with the tiny harness of the other device tests:
 * each failed check prints "FAIL file:line: ..." with both values, each group
 * prints "ok"/"FAIL" and its time, and the last line is "N passed, N failed,
 * N skipped". Exit 1 if anything failed. Without a usable GPU (cudaGetDevice-
 * Count fails, e.g. no driver, or finds no device) it prints "cuda
 * unavailable: <reason>" and "0 passed, 0 failed, 1 skipped", and exits 0.
 *
 * Tolerances (the reasons are in kernels/cuda/): exact for embed, dequant
 * and to_half (same rounding); 1e-6 relative for rmsnorm (double sum in
 * another order), swiglu (CUDA's expf vs glibc's) and add; 1e-5 for RoPE
 * (cosf/sinf); 1e-4 absolute for attention (outputs of magnitude ~1; f32
 * online softmax in another order); 1e-4 of sum|w*x| for the Q8_0 GEMV
 * against a double-precision dot over the dequantized weights (not against
 * kern_matmul, which quantizes the activations). Stored f16 values may differ
 * from the CPU's by one f16 ulp when the f32 values before rounding differ in
 * their last bits.
 *
 * Quantized KV (issue 15): kcu_kv_store's Q8_0, Q4_0 (Hadamard-rotated) and
 * FP8 rows must equal kern_kv_store's byte for byte on the same f32 rows
 * (the same rules, no FMA contraction, IEEE divisions: kcu_kv_quant.cu), at
 * 7 shapes (stories260K's 4 x 8, heads across blocks, rotation blocks of
 * 16..256, an odd head_dim) and at odd row offsets; kcu_rope_store with a
 * quantized type must write kern_kv_store's bytes of the GPU's own rotated
 * k. The E4M3 conversion (native on sm_89+) must give
 * kern_cpu_fp8_from_f32's byte on every rounding boundary, the saturation
 * edge, NaN/inf/zeros and a sweep of 17M f32 patterns. Attention over the
 * three quantized caches (decode, prefill, mixed batches, as for f16)
 * within the same 1e-4: the dequantized values are the CPU's exactly, only
 * the order of the sums differs.
 *
 * Attention runs over the token-major layout of DESIGN.md §2, built in host
 * memory (two layers; the test reads layer 1, so K and V sit mid-token and
 * the stride exceeds the row) and copied to the device: decode at 1, 31, 32,
 * 33, 257, 1000 and 8192 keys, prefill chunks of 1..200 tokens with pos0 = 0
 * and > 0, a batch mixing both, on GQA 32/8, 8/2, 16/1, 6/2 and MHA 4/4 with
 * head_dim 48, 64, 80, 128, 256, f32 and f16 caches, and a misaligned range
 * (the kernels' scalar-load path); the rows of a batch must also be
 * bit-identical to each sequence run alone. Runs in a few seconds on an
 * H100/H200.
 *
 * Usage: test_kern_cuda [name]: with an argument, only the groups whose
 * name contains it (e.g. "attention").
 *
 * Build (after `make cuda`):
 *   cc -std=c17 -D_GNU_SOURCE -I. -Iinclude -I$CUDA_HOME/include -Wall -Wextra
 *      -Wshadow -Werror -O1 -g -pthread -o build/cuda/tests/device/test_kern_cuda
 *      tests/device/test_kern_cuda.c build/cuda/libllmd.a
 *      -L$CUDA_HOME/lib64 -lcudart -lcublas -ldl -lm -pthread
 */
#include <cuda_runtime.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mem.h"
#include "kernels/cpu/kern_cpu.h"
#include "kernels/kern.h"
#include "kernels/kern_cuda.h"
#include "tests/device/dev_check.h"

static struct kern_pool *pool; /* the CPU references' threads */

_Static_assert((int)KCU_KV_F32 == (int)KERN_KV_F32 && (int)KCU_KV_F16 == (int)KERN_KV_F16 &&
                   (int)KCU_KV_Q8_0 == (int)KERN_KV_Q8_0 && (int)KCU_KV_Q4_0 == (int)KERN_KV_Q4_0 &&
                   (int)KCU_KV_FP8 == (int)KERN_KV_FP8,
               "enum kcu_kv is enum kern_kv_type, value for value");

/* A failed CUDA runtime call outside the kernels under test: the run cannot
 * go on meaningfully. */
#define CU(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            printf("FAIL %s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_));     \
            printf("%u passed, %u failed, 0 skipped\n", n_pass, n_fail + 1);                       \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- helpers ---- */

static uint64_t rng_state = 0x9e3779b97f4a7c15u;

static uint64_t rng_u64(void) { /* splitmix64 */
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15u);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

static float frand(void) { /* uniform in [-1, 1) */
    return (float)((double)(rng_u64() >> 11) * (2.0 / 9007199254740992.0) - 1.0);
}

static int irand(int n) {
    return (int)(rng_u64() % (uint64_t)n);
}

static void *halloc(size_t bytes) {
    void *p = mem_calloc(MEM_TEST, 1, bytes ? bytes : 1);
    if (!p) {
        printf("FAIL: host allocation of %zu bytes\n", bytes);
        printf("%u passed, %u failed, 0 skipped\n", n_pass, n_fail + 1);
        exit(1);
    }
    return p;
}

static void *dalloc(size_t bytes) {
    void *p = NULL;
    CU(cudaMalloc(&p, bytes ? bytes : 1));
    return p;
}

static void *dup_to_dev(const void *h, size_t bytes) {
    void *d = dalloc(bytes);
    CU(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    return d;
}

static void to_host(void *h, const void *d, size_t bytes) {
    CU(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
}

/* After a group of launches: wait, and count an asynchronous fault as a
 * failure (the kernels must never fault on valid arguments). */
static void sync_check(const char *what) {
    cudaError_t e = cudaDeviceSynchronize();
    CHECK(e == cudaSuccess, "%s: %s", what, cudaGetErrorString(e));
    e = cudaGetLastError();
    CHECK(e == cudaSuccess, "%s: last error %s", what, cudaGetErrorString(e));
}

static bool close_to(float got, float want, float rel, float abs_tol) {
    return fabsf(got - want) <= abs_tol + rel * fabsf(want);
}

/* Largest |got - want| - (abs + rel*|want|) over n values, reporting the
 * first offender; true when all are within. */
static bool all_close(const char *what, const float *got, const float *want, size_t n, float rel,
                      float abs_tol) {
    for (size_t i = 0; i < n; i++)
        if (!close_to(got[i], want[i], rel, abs_tol) || isnan(got[i]) != isnan(want[i])) {
            printf("  %s: first mismatch at %zu: got %.9g want %.9g (diff %.3g)\n", what, i,
                   (double)got[i], (double)want[i], (double)fabsf(got[i] - want[i]));
            return false;
        }
    return true;
}

static uint32_t f_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
}

/* f32 -> bf16, round to nearest even (non-NaN inputs). */
static uint16_t f32_to_bf16(float f) {
    uint32_t u = f_bits(f);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* Random floats over many binades, plus values that stress f16 rounding:
 * ties, the overflow threshold, subnormals and zeros (no NaN). */
static void fill_wide(float *x, size_t n) {
    static const float special[] = {0.0f,          -0.0f,     65504.0f,       65519.99f,
                                    65520.0f,      -70000.0f, 6.1035156e-5f,  5.9604645e-8f,
                                    2.9802322e-8f, 1.0e-9f,   1.00048828125f, 1.00146484375f,
                                    -2.00097656f,  3.0e38f,   1.0f / 3.0f,    -1.0e-6f};
    const size_t ns = sizeof(special) / sizeof(special[0]);
    for (size_t i = 0; i < n; i++) {
        if (i < ns)
            x[i] = special[i];
        else
            x[i] = frand() * ldexpf(1.0f, irand(40) - 25);
    }
}

/* ---- embed ---- */

static void test_embed(void) {
    const int n_vocab = 61, n_tok = 9;
    const int widths[] = {64, 300};
    for (int wi = 0; wi < 2; wi++) {
        const int n_embd = widths[wi];
        const size_t n = (size_t)n_vocab * n_embd;
        float *tf = halloc(n * 4);
        uint16_t *th = halloc(n * 2), *tb = halloc(n * 2);
        fill_wide(tf, n);
        kern_f32_to_f16(th, tf, (int)n);
        for (size_t i = 0; i < n; i++)
            tb[i] = f32_to_bf16(tf[i]);
        int32_t tok[9];
        for (int i = 0; i < n_tok; i++)
            tok[i] = irand(n_vocab);
        tok[0] = n_vocab - 1;
        int32_t *dtok = dup_to_dev(tok, sizeof(tok));
        float *dx = dalloc((size_t)n_tok * n_embd * 4);
        float *got = halloc((size_t)n_tok * n_embd * 4), *want = halloc((size_t)n_tok * n_embd * 4);
        const struct {
            enum kcu_type t;
            enum kern_wtype g;
            const void *table;
            size_t esz;
        } cases[] = {{KCU_F32, KERN_W_F32, tf, 4},
                     {KCU_F16, KERN_W_F16, th, 2},
                     {KCU_BF16, KERN_W_BF16, tb, 2}};
        for (int c = 0; c < 3; c++) {
            void *dt = dup_to_dev(cases[c].table, n * cases[c].esz);
            int rc = kcu_embed(NULL, dx, dtok, n_tok, dt, cases[c].t, n_embd);
            CHECK(rc == 0, "kcu_embed type %d: %d", cases[c].t, rc);
            sync_check("kcu_embed");
            to_host(got, dx, (size_t)n_tok * n_embd * 4);
            for (int i = 0; i < n_tok; i++)
                kern_dequant_row(cases[c].g,
                                 (const char *)cases[c].table +
                                     (size_t)tok[i] * n_embd * cases[c].esz,
                                 want + (size_t)i * n_embd, n_embd);
            CHECK(memcmp(got, want, (size_t)n_tok * n_embd * 4) == 0,
                  "embed type %d n_embd %d differs", cases[c].t, n_embd);
            CU(cudaFree(dt));
        }
        CU(cudaFree(dtok));
        CU(cudaFree(dx));
        mem_free(got);
        mem_free(want);
        mem_free(tf);
        mem_free(th);
        mem_free(tb);
    }
}

/* ---- dequant ---- */

static void test_dequant(void) {
    const int n = 32 * 97;
    float *x = halloc((size_t)n * 4), *ref = halloc((size_t)n * 4);
    uint16_t *th = halloc((size_t)n * 2), *tb = halloc((size_t)n * 2);
    uint16_t *got = halloc((size_t)n * 2), *want = halloc((size_t)n * 2);
    void *q8 = halloc(kern_row_bytes(KERN_W_Q8_0, n)), *q4 = halloc(kern_row_bytes(KERN_W_Q4_0, n));
    fill_wide(x, (size_t)n);
    kern_f32_to_f16(th, x, n);
    for (int i = 0; i < n; i++)
        tb[i] = f32_to_bf16(x[i]);
    float *xs = halloc((size_t)n * 4); /* quantizer input: a realistic range, some blocks of 0 */
    for (int i = 0; i < n; i++)
        xs[i] = i / 32 == 5 ? 0.0f : frand() * ldexpf(1.0f, irand(8) - 6);
    kern_quantize_row_q8_0(xs, q8, n);
    kern_quantize_row_q4_0(xs, q4, n);
    const struct {
        enum kern_wtype t;
        const void *src;
    } cases[] = {
        {KERN_W_F32, x}, {KERN_W_F16, th}, {KERN_W_BF16, tb}, {KERN_W_Q8_0, q8}, {KERN_W_Q4_0, q4}};
    uint16_t *dd = dalloc((size_t)n * 2);
    for (int c = 0; c < 5; c++) {
        const size_t bytes = kern_row_bytes(cases[c].t, n);
        void *ds = dup_to_dev(cases[c].src, bytes);
        int rc = kcu_dequant_f16(NULL, dd, ds, (int)cases[c].t, (size_t)n);
        CHECK(rc == 0, "kcu_dequant_f16 type %d: %d", cases[c].t, rc);
        sync_check("kcu_dequant_f16");
        to_host(got, dd, (size_t)n * 2);
        kern_dequant_row(cases[c].t, cases[c].src, ref, n);
        kern_f32_to_f16(want, ref, n);
        int bad = -1;
        for (int i = 0; i < n && bad < 0; i++)
            if (got[i] != want[i])
                bad = i;
        CHECK(bad < 0, "dequant type %d: element %d got 0x%04x want 0x%04x", cases[c].t, bad,
              bad < 0 ? 0 : got[bad], bad < 0 ? 0 : want[bad]);
        CU(cudaFree(ds));
    }
    CU(cudaFree(dd));
    mem_free(x);
    mem_free(xs);
    mem_free(ref);
    mem_free(th);
    mem_free(tb);
    mem_free(got);
    mem_free(want);
    mem_free(q8);
    mem_free(q4);
}

/* ---- rmsnorm ---- */

static void test_rmsnorm(void) {
    const int n_rows = 5;
    const int widths[] = {4096, 100, 1};
    const float eps = 1e-5f;
    for (int wi = 0; wi < 3; wi++) {
        const int n = widths[wi];
        const size_t bytes = (size_t)n_rows * n * 4;
        float *x = halloc(bytes), *w = halloc((size_t)n * 4), *got = halloc(bytes),
              *want = halloc(bytes);
        for (int i = 0; i < n_rows * n; i++)
            x[i] = frand() * (1.0f + (float)(i / n)); /* rows of different scales */
        for (int i = 0; i < n; i++)
            w[i] = 1.0f + 0.5f * frand();
        float *dx = dup_to_dev(x, bytes), *dw = dup_to_dev(w, (size_t)n * 4), *dy = dalloc(bytes);
        /* plain */
        int rc = kcu_rmsnorm(NULL, dy, dx, NULL, dw, n_rows, n, eps);
        CHECK(rc == 0, "kcu_rmsnorm: %d", rc);
        sync_check("kcu_rmsnorm");
        to_host(got, dy, bytes);
        for (int r = 0; r < n_rows; r++)
            kern_rmsnorm(want + (size_t)r * n, x + (size_t)r * n, w, n, eps);
        CHECK(all_close("rmsnorm", got, want, (size_t)n_rows * n, 1e-6f, 0.0f), "n %d", n);
        /* gathered rows (repeats allowed) */
        const int32_t rows[4] = {3, 0, 4, 4};
        int32_t *drows = dup_to_dev(rows, sizeof(rows));
        rc = kcu_rmsnorm(NULL, dy, dx, drows, dw, 4, n, eps);
        CHECK(rc == 0, "kcu_rmsnorm rows: %d", rc);
        sync_check("kcu_rmsnorm rows");
        to_host(got, dy, (size_t)4 * n * 4);
        for (int r = 0; r < 4; r++)
            kern_rmsnorm(want + (size_t)r * n, x + (size_t)rows[r] * n, w, n, eps);
        CHECK(all_close("rmsnorm rows", got, want, (size_t)4 * n, 1e-6f, 0.0f), "n %d", n);
        /* in place */
        rc = kcu_rmsnorm(NULL, dx, dx, NULL, dw, n_rows, n, eps);
        CHECK(rc == 0, "kcu_rmsnorm in place: %d", rc);
        sync_check("kcu_rmsnorm in place");
        to_host(got, dx, bytes);
        for (int r = 0; r < n_rows; r++)
            kern_rmsnorm(want + (size_t)r * n, x + (size_t)r * n, w, n, eps);
        CHECK(all_close("rmsnorm in place", got, want, (size_t)n_rows * n, 1e-6f, 0.0f), "n %d", n);
        CU(cudaFree(drows));
        CU(cudaFree(dx));
        CU(cudaFree(dw));
        CU(cudaFree(dy));
        mem_free(x);
        mem_free(w);
        mem_free(got);
        mem_free(want);
    }
}

/* ---- to_half, swiglu, add ---- */

static void test_to_half(void) {
    const size_t n = 100003;
    float *x = halloc(n * 4);
    uint16_t *got = halloc(n * 2), *want = halloc(n * 2);
    fill_wide(x, n);
    float *dx = dup_to_dev(x, n * 4);
    uint16_t *dh = dalloc(n * 2);
    int rc = kcu_to_half(NULL, dh, KCU_F16, dx, n);
    CHECK(rc == 0, "kcu_to_half f16: %d", rc);
    sync_check("kcu_to_half f16");
    to_host(got, dh, n * 2);
    kern_f32_to_f16(want, x, (int)n);
    size_t bad = n;
    for (size_t i = 0; i < n && bad == n; i++)
        if (got[i] != want[i])
            bad = i;
    CHECK(bad == n, "to_half f16: element %zu (%.9g) got 0x%04x want 0x%04x", bad,
          bad < n ? (double)x[bad] : 0.0, bad < n ? got[bad] : 0, bad < n ? want[bad] : 0);
    rc = kcu_to_half(NULL, dh, KCU_BF16, dx, n);
    CHECK(rc == 0, "kcu_to_half bf16: %d", rc);
    sync_check("kcu_to_half bf16");
    to_host(got, dh, n * 2);
    bad = n;
    for (size_t i = 0; i < n && bad == n; i++)
        if (got[i] != f32_to_bf16(x[i]))
            bad = i;
    CHECK(bad == n, "to_half bf16: element %zu (%.9g) got 0x%04x want 0x%04x", bad,
          bad < n ? (double)x[bad] : 0.0, bad < n ? got[bad] : 0,
          bad < n ? f32_to_bf16(x[bad]) : 0);
    CU(cudaFree(dx));
    CU(cudaFree(dh));
    mem_free(x);
    mem_free(got);
    mem_free(want);
}

static void test_swiglu_add(void) {
    const size_t n = 10001;
    float *g = halloc(n * 4), *u = halloc(n * 4), *got = halloc(n * 4), *want = halloc(n * 4);
    for (size_t i = 0; i < n; i++) {
        g[i] = 12.0f * frand();
        u[i] = 3.0f * frand();
    }
    float *dg = dup_to_dev(g, n * 4), *du = dup_to_dev(u, n * 4), *dy = dalloc(n * 4);
    int rc = kcu_swiglu(NULL, dy, dg, du, n);
    CHECK(rc == 0, "kcu_swiglu: %d", rc);
    sync_check("kcu_swiglu");
    to_host(got, dy, n * 4);
    kern_swiglu(want, g, u, (int)n);
    CHECK(all_close("swiglu", got, want, n, 1e-6f, 1e-30f), "n %zu", n);
    rc = kcu_swiglu(NULL, dg, dg, du, n); /* y aliases gate */
    CHECK(rc == 0, "kcu_swiglu in place: %d", rc);
    sync_check("kcu_swiglu in place");
    to_host(got, dg, n * 4);
    CHECK(all_close("swiglu in place", got, want, n, 1e-6f, 1e-30f), "n %zu", n);

    CU(cudaMemcpy(dg, g, n * 4, cudaMemcpyHostToDevice));
    rc = kcu_add(NULL, dg, du, n);
    CHECK(rc == 0, "kcu_add: %d", rc);
    sync_check("kcu_add");
    to_host(got, dg, n * 4);
    for (size_t i = 0; i < n; i++)
        want[i] = g[i] + u[i];
    CHECK(all_close("add", got, want, n, 1e-6f, 0.0f), "n %zu", n);
    CU(cudaFree(dg));
    CU(cudaFree(du));
    CU(cudaFree(dy));
    mem_free(g);
    mem_free(u);
    mem_free(got);
    mem_free(want);
}

/* ---- rope + store ---- */

static bool h16_close(uint16_t got, uint16_t want, float abs_tol) {
    const float g = kern_f16_to_f32_1(got), w = kern_f16_to_f32_1(want);
    /* one f16 ulp of w (2^-10 relative) when the f32 inputs differed slightly */
    return fabsf(g - w) <= abs_tol + ldexpf(fabsf(w), -10);
}

static void rope_case(enum kcu_kv kvt, int n_head, int n_head_kv, int head_dim, int n_rot,
                      float base) {
    const int n_tok = 6, n_slots = 8200;
    const size_t esz = kvt == KCU_KV_F16 ? 2 : 4, row = (size_t)n_head_kv * head_dim * esz;
    const size_t k_off = 64, v_off = k_off + row + 32, stride = (v_off + row + 63) / 64 * 64 + 64;
    const size_t nq = (size_t)n_tok * n_head * head_dim, nk = (size_t)n_tok * n_head_kv * head_dim;
    float *q = halloc(nq * 4), *k = halloc(nk * 4), *v = halloc(nk * 4);
    float *gq = halloc(nq * 4), *gk = halloc(nk * 4);
    int32_t pos[6] = {0, 1, 7, 513, 4095, 8191};
    for (size_t i = 0; i < nq; i++)
        q[i] = frand();
    for (size_t i = 0; i < nk; i++) {
        k[i] = frand();
        v[i] = frand();
    }
    const size_t cache_bytes = (size_t)n_slots * stride;
    uint8_t *cache = halloc(cache_bytes), *gcache = halloc(cache_bytes);
    memset(cache, 0xab, cache_bytes);
    uint8_t *dcache = dup_to_dev(cache, cache_bytes);
    uint64_t kv_tok[6];
    for (int i = 0; i < n_tok; i++)
        kv_tok[i] = (uint64_t)(uintptr_t)dcache + (uint64_t)pos[i] * stride;
    float *dq = dup_to_dev(q, nq * 4), *dk = dup_to_dev(k, nk * 4), *dv = dup_to_dev(v, nk * 4);
    int32_t *dpos = dup_to_dev(pos, sizeof(pos));
    uint64_t *dtok = dup_to_dev(kv_tok, sizeof(kv_tok));
    int rc = kcu_rope_store(NULL, dq, dk, dv, n_tok, dpos, dtok, k_off, v_off, kvt, n_head,
                            n_head_kv, head_dim, n_rot, base);
    CHECK(rc == 0, "kcu_rope_store: %d", rc);
    sync_check("kcu_rope_store");
    to_host(gq, dq, nq * 4);
    to_host(gk, dk, nk * 4);
    to_host(gcache, dcache, cache_bytes);

    for (int i = 0; i < n_tok; i++) {
        kern_rope(q + (size_t)i * n_head * head_dim, n_head, head_dim, n_rot, pos[i], base);
        kern_rope(k + (size_t)i * n_head_kv * head_dim, n_head_kv, head_dim, n_rot, pos[i], base);
        uint8_t *slot = cache + (size_t)pos[i] * stride;
        const enum kern_kv_type t = kvt == KCU_KV_F16 ? KERN_KV_F16 : KERN_KV_F32;
        kern_kv_store(slot + k_off, k + (size_t)i * n_head_kv * head_dim, n_head_kv, head_dim, t);
        kern_kv_store(slot + v_off, v + (size_t)i * n_head_kv * head_dim, n_head_kv, head_dim, t);
    }
    CHECK(all_close("rope q", gq, q, nq, 0.0f, 1e-5f), "kvt %d hd %d rot %d", kvt, head_dim, n_rot);
    CHECK(all_close("rope k", gk, k, nk, 0.0f, 1e-5f), "kvt %d hd %d rot %d", kvt, head_dim, n_rot);
    /* every byte of the cache: the written rows within tolerance, the rest untouched */
    size_t bad = cache_bytes;
    for (int i = 0; i < n_tok; i++) {
        const size_t s0 = (size_t)pos[i] * stride;
        for (int part = 0; part < 2; part++) {
            const size_t off = s0 + (part ? v_off : k_off);
            for (size_t e = 0; e < (size_t)n_head_kv * head_dim; e++) {
                bool ok;
                if (kvt == KCU_KV_F16) {
                    uint16_t g16, w16;
                    memcpy(&g16, gcache + off + 2 * e, 2);
                    memcpy(&w16, cache + off + 2 * e, 2);
                    ok = h16_close(g16, w16, 1e-5f);
                } else {
                    float gf, wf;
                    memcpy(&gf, gcache + off + 4 * e, 4);
                    memcpy(&wf, cache + off + 4 * e, 4);
                    ok = close_to(gf, wf, 0.0f, 1e-5f);
                }
                if (!ok && bad == cache_bytes)
                    bad = off + e * esz;
            }
            memcpy(gcache + off, cache + off, row); /* checked: blend for the byte compare */
        }
    }
    CHECK(bad == cache_bytes, "rope_store kvt %d: stored value at byte %zu differs", kvt, bad);
    CHECK(memcmp(gcache, cache, cache_bytes) == 0, "rope_store kvt %d wrote outside its rows", kvt);

    CU(cudaFree(dcache));
    CU(cudaFree(dq));
    CU(cudaFree(dk));
    CU(cudaFree(dv));
    CU(cudaFree(dpos));
    CU(cudaFree(dtok));
    mem_free(q);
    mem_free(k);
    mem_free(v);
    mem_free(gq);
    mem_free(gk);
    mem_free(cache);
    mem_free(gcache);
}

static void test_rope_store(void) {
    rope_case(KCU_KV_F32, 8, 2, 64, 64, 10000.0f);
    rope_case(KCU_KV_F16, 8, 2, 64, 64, 10000.0f);
    rope_case(KCU_KV_F32, 32, 8, 128, 128, 500000.0f);
    rope_case(KCU_KV_F16, 32, 8, 128, 128, 500000.0f);
    rope_case(KCU_KV_F32, 6, 3, 48, 32, 10000.0f); /* partial rotation */
    rope_case(KCU_KV_F16, 4, 4, 80, 0, 10000.0f);  /* no rotation: a plain store */
}

/* ---- quantized KV store ---- */

/* KV rows for the quantizers: magnitudes over 2^-10..2^10, an outlier
 * channel, an all-zero head, signed zeros, and equal magnitudes of both
 * signs (Q4_0 takes the first of a tie). n = n_head_kv * head_dim. */
static void fill_kv(float *x, int n_tok, int n_head_kv, int head_dim) {
    const size_t n = (size_t)n_head_kv * head_dim;
    for (int t = 0; t < n_tok; t++) {
        float *r = x + (size_t)t * n;
        for (size_t i = 0; i < n; i++)
            r[i] = frand() * ldexpf(1.0f, irand(21) - 10);
        r[irand((int)n)] *= 100.0f; /* an outlier */
        if (t == 1)                 /* head 0 all zeros, with a -0 */
            for (int e = 0; e < head_dim; e++)
                r[e] = e == 1 ? -0.0f : 0.0f;
        if (t == 2 && n >= 2) { /* a tie of opposite signs */
            r[0] = -4.0f;
            r[1] = 4.0f;
        }
    }
}

/* kcu_kv_store (direct) and kcu_rope_store (RoPE, then the store) of
 * n_tok = 5 tokens into a quantized cache, against kern_kv_store on the
 * host: every byte of the written rows equal (the same f32 rows in; for
 * rope_store the GPU's own rotated k, so RoPE's cosf/sinf ulps cannot
 * move a rounding), every other byte untouched. */
static void kvq_case(enum kcu_kv kvt, int n_head_kv, int head_dim) {
    const int n_tok = 5, n_head = 2 * n_head_kv, n_rot = head_dim & ~1; /* n_rot even */
    const enum kern_kv_type t = (enum kern_kv_type)kvt;
    const size_t row = kern_kv_row_bytes(t, n_head_kv, head_dim);
    /* rows at odd offsets: the store must not assume any alignment */
    const size_t k_off = 33, v_off = k_off + row + 7, stride = (v_off + row + 63) / 64 * 64 + 64;
    const size_t n = (size_t)n_head_kv * head_dim, nk = (size_t)n_tok * n,
                 nq = (size_t)n_tok * n_head * head_dim;
    float *k = halloc(nk * 4), *v = halloc(nk * 4), *q = halloc(nq * 4);
    float *gk = halloc(nk * 4), *gq = halloc(nq * 4);
    fill_kv(k, n_tok, n_head_kv, head_dim);
    fill_kv(v, n_tok, n_head_kv, head_dim);
    for (size_t i = 0; i < nq; i++)
        q[i] = frand();
    int32_t pos[5] = {0, 3, 17, 500, 1023};
    const size_t cache_bytes = 1024 * stride;
    uint8_t *cache = halloc(cache_bytes), *gcache = halloc(cache_bytes);
    uint64_t kv_tok[5];
    for (int pass = 0; pass < 2; pass++) { /* 0: kcu_kv_store, 1: kcu_rope_store */
        memset(cache, 0xab, cache_bytes);
        uint8_t *dcache = dup_to_dev(cache, cache_bytes);
        for (int i = 0; i < n_tok; i++)
            kv_tok[i] = (uint64_t)(uintptr_t)dcache + (uint64_t)pos[i] * stride;
        float *dk = dup_to_dev(k, nk * 4), *dv = dup_to_dev(v, nk * 4), *dq = dup_to_dev(q, nq * 4);
        int32_t *dpos = dup_to_dev(pos, sizeof(pos));
        uint64_t *dtok = dup_to_dev(kv_tok, sizeof(kv_tok));
        int rc = pass == 0 ? kcu_kv_store(NULL, dk, dv, n_tok, dtok, k_off, v_off, kvt, n_head_kv,
                                          head_dim)
                           : kcu_rope_store(NULL, dq, dk, dv, n_tok, dpos, dtok, k_off, v_off, kvt,
                                            n_head, n_head_kv, head_dim, n_rot, 10000.0f);
        CHECK(rc == 0, "kvt %d %dx%d pass %d: %d", kvt, n_head_kv, head_dim, pass, rc);
        sync_check(pass == 0 ? "kcu_kv_store" : "kcu_rope_store (quantized)");
        to_host(gcache, dcache, cache_bytes);
        to_host(gk, dk, nk * 4);
        to_host(gq, dq, nq * 4);
        if (pass == 1) { /* RoPE itself against the CPU, as rope_case */
            float *ck = halloc(nk * 4);
            memcpy(ck, k, nk * 4);
            float *cq = halloc(nq * 4);
            memcpy(cq, q, nq * 4);
            for (int i = 0; i < n_tok; i++) {
                kern_rope(cq + (size_t)i * n_head * head_dim, n_head, head_dim, n_rot, pos[i],
                          10000.0f);
                kern_rope(ck + (size_t)i * n, n_head_kv, head_dim, n_rot, pos[i], 10000.0f);
            }
            CHECK(all_close("rope q (quantized kv)", gq, cq, nq, 1e-5f, 1e-5f), "kvt %d", kvt);
            CHECK(all_close("rope k (quantized kv)", gk, ck, nk, 1e-5f, 1e-5f), "kvt %d", kvt);
            mem_free(ck);
            mem_free(cq);
        } else {
            CHECK(memcmp(gk, k, nk * 4) == 0, "kcu_kv_store modified k");
        }
        for (int i = 0; i < n_tok; i++) {
            uint8_t *slot = cache + (size_t)pos[i] * stride;
            kern_kv_store(slot + k_off, (pass ? gk : k) + (size_t)i * n, n_head_kv, head_dim, t);
            kern_kv_store(slot + v_off, v + (size_t)i * n, n_head_kv, head_dim, t);
        }
        size_t bad = cache_bytes;
        for (size_t b = 0; b < cache_bytes && bad == cache_bytes; b++)
            if (gcache[b] != cache[b])
                bad = b;
        CHECK(bad == cache_bytes,
              "kvt %d %dx%d pass %d: byte %zu (token slot %zu, offset %zu) is 0x%02x, the CPU "
              "wrote 0x%02x",
              kvt, n_head_kv, head_dim, pass, bad, bad / stride, bad % stride,
              bad < cache_bytes ? gcache[bad] : 0, bad < cache_bytes ? cache[bad] : 0);
        CU(cudaFree(dcache));
        CU(cudaFree(dk));
        CU(cudaFree(dv));
        CU(cudaFree(dq));
        CU(cudaFree(dpos));
        CU(cudaFree(dtok));
    }
    mem_free(k);
    mem_free(v);
    mem_free(q);
    mem_free(gk);
    mem_free(gq);
    mem_free(cache);
    mem_free(gcache);
}

static void test_kv_store(void) {
    /* stories260K (4 x 8: four heads a block), a head across blocks (20),
     * rotation blocks of 128, 16 and 256, an odd head_dim (no rotation, a
     * zero-padded last block), a head starting mid-block (48) */
    static const int shapes[][2] = {{4, 8}, {2, 20}, {8, 128}, {3, 80}, {1, 256}, {5, 7}, {2, 48}};
    static const enum kcu_kv types[] = {KCU_KV_Q8_0, KCU_KV_Q4_0, KCU_KV_FP8};
    for (int ti = 0; ti < 3; ti++)
        for (int si = 0; si < 7; si++)
            kvq_case(types[ti], shapes[si][0], shapes[si][1]);
}

/* The E4M3 conversion against kern_cpu_fp8_from_f32: every rounding
 * boundary of every finite E4M3 magnitude (the midpoint between neighbours
 * and the f32 values either side of it), the saturation edge (448, the
 * midpoint 464 towards the missing 480, above), infinities, NaNs, signed
 * zeros, f32 subnormals, and a sweep of every 251st f32 bit pattern. The
 * bytes must be equal. */
static void test_fp8_convert(void) {
    const size_t n_sweep = (size_t)(UINT32_MAX / 251u) + 1, n_max = n_sweep + 4096;
    float *x = halloc(n_max * 4);
    size_t n = 0;
    for (int b = 0; b < 0x7E; b++) { /* neighbours b, b + 1 (0x7E is 448) */
        const float lo = kern_f16_to_f32_1(kern_cpu_fp8_f16_bits((uint8_t)b)) * 256.0f;
        const float hi = kern_f16_to_f32_1(kern_cpu_fp8_f16_bits((uint8_t)(b + 1))) * 256.0f;
        const float mid = (lo + hi) * 0.5f; /* exact: one more bit than E4M3 has */
        const float c[] = {lo, hi, mid, nextafterf(mid, 0.0f), nextafterf(mid, INFINITY)};
        for (int i = 0; i < 5; i++) {
            x[n++] = c[i];
            x[n++] = -c[i];
        }
    }
    const float edge[] = {448.0f,    nextafterf(448.0f, INFINITY),
                          463.99f,   464.0f,
                          464.01f,   480.0f,
                          1e30f,     INFINITY,
                          -INFINITY, NAN,
                          -NAN,      0.0f,
                          -0.0f,     1e-40f,
                          -1e-45f,   0.0009765625f /* 2^-10, half the smallest E4M3 */};
    for (size_t i = 0; i < sizeof(edge) / sizeof(edge[0]); i++)
        x[n++] = edge[i];
    for (size_t i = 0; i < n_sweep; i++) {
        const uint32_t u = (uint32_t)(i * 251u);
        memcpy(&x[n++], &u, 4);
    }
    uint8_t *got = halloc(n), *dgot = dalloc(n);
    float *dx = dup_to_dev(x, n * 4);
    int rc = kcu_fp8_from_f32(NULL, dgot, dx, n);
    CHECK(rc == 0, "kcu_fp8_from_f32: %d", rc);
    sync_check("kcu_fp8_from_f32");
    to_host(got, dgot, n);
    size_t n_bad = 0;
    for (size_t i = 0; i < n; i++) {
        const uint8_t want = kern_cpu_fp8_from_f32(x[i]);
        if (got[i] != want && n_bad++ < 8)
            printf("  fp8(%a = 0x%08x): GPU 0x%02x, CPU 0x%02x\n", (double)x[i], f_bits(x[i]),
                   got[i], want);
    }
    CHECK(n_bad == 0, "%zu of %zu E4M3 conversions differ from the CPU's", n_bad, n);
    CU(cudaFree(dgot));
    CU(cudaFree(dx));
    mem_free(got);
    mem_free(x);
}

/* ---- attention ---- */

/* Model shape of one attention configuration. */
struct att_cfg {
    const char *name;
    int n_head, n_head_kv, head_dim;
    enum kcu_kv kvt;
    size_t misalign; /* bytes added to every range base (scalar-load path) */
};

/* One sequence: a token-major range of n_keys tokens in host memory and its
 * device copy. */
struct att_range {
    uint8_t *host;
    uint8_t *dev; /* cudaMalloc'd block; the range starts at dev + misalign */
    size_t bytes;
};

/* Token stride and offsets: two layers of [n_head_kv][head_dim] K and V
 * (DESIGN.md §2), padded to 64 B plus 64 B so that the stride exceeds the
 * rows; the test reads layer 1. */
static void att_geom(const struct att_cfg *c, size_t *stride, size_t *k_off, size_t *v_off) {
    const size_t row = kern_kv_row_bytes((enum kern_kv_type)c->kvt, c->n_head_kv, c->head_dim);
    *k_off = 2 * row;
    *v_off = 3 * row;
    *stride = (4 * row + 63) / 64 * 64 + 64;
}

static void att_range_make(const struct att_cfg *c, int n_keys, struct att_range *r) {
    size_t stride, k_off, v_off;
    att_geom(c, &stride, &k_off, &v_off);
    r->bytes = (size_t)n_keys * stride;
    r->host = halloc(r->bytes);
    if (c->kvt != KCU_KV_F16 && c->kvt != KCU_KV_F32) {
        /* quantized: each token's four rows (two layers' K and V) written
         * by the CPU's store, the padding zero */
        const int n = c->n_head_kv * c->head_dim;
        const size_t row = k_off / 2; /* att_geom: rows j = 0..3 at j * row */
        float *x = halloc((size_t)n * 4);
        for (int t = 0; t < n_keys; t++)
            for (int j = 0; j < 4; j++) {
                for (int i = 0; i < n; i++)
                    x[i] = frand();
                kern_kv_store(r->host + (size_t)t * stride + (size_t)j * row, x, c->n_head_kv,
                              c->head_dim, (enum kern_kv_type)c->kvt);
            }
        mem_free(x);
    } else if (c->kvt == KCU_KV_F16) {
        uint16_t *h = (uint16_t *)r->host;
        for (size_t i = 0; i < r->bytes / 2; i++)
            h[i] = kern_f32_to_f16_1(frand());
    } else {
        float *f = (float *)r->host;
        for (size_t i = 0; i < r->bytes / 4; i++)
            f[i] = frand();
    }
    r->dev = dalloc(r->bytes + c->misalign);
    CU(cudaMemcpy(r->dev + c->misalign, r->host, r->bytes, cudaMemcpyHostToDevice));
}

static void att_range_free(struct att_range *r) {
    CU(cudaFree(r->dev));
    mem_free(r->host);
}

/* Run one batch of sequences (n_keys[i] keys stored, n_tok[i] queries at the
 * end) through kcu_attention and compare every output row with
 * kern_attention on the host copy. Returns false on a mismatch. */
static bool att_batch(const struct att_cfg *c, int n_seqs, const int *n_keys, const int *n_tok) {
    size_t stride, k_off, v_off;
    att_geom(c, &stride, &k_off, &v_off);
    const int H = c->n_head, D = c->head_dim;
    struct att_range r[8];
    struct kcu_att_seq seqs[8];
    int rows = 0, max_ctx = 0;
    for (int i = 0; i < n_seqs; i++) {
        att_range_make(c, n_keys[i], &r[i]);
        seqs[i] = (struct kcu_att_seq){.base = (uint64_t)(uintptr_t)(r[i].dev + c->misalign),
                                       .pos0 = n_keys[i] - n_tok[i],
                                       .n_tok = n_tok[i],
                                       .q_row = rows};
        rows += n_tok[i];
        max_ctx = n_keys[i] > max_ctx ? n_keys[i] : max_ctx;
    }
    const size_t nq = (size_t)rows * H * D;
    float *q = halloc(nq * 4), *got = halloc(nq * 4), *want = halloc(nq * 4);
    for (size_t i = 0; i < nq; i++)
        q[i] = 3.0f * frand(); /* peaked enough that the max subtraction matters */
    float *dq = dup_to_dev(q, nq * 4), *dout = dalloc(nq * 4);
    CU(cudaMemset(dout, 0xff, nq * 4)); /* NaN: a row left unwritten shows */
    struct kcu_att_seq *dseqs = dup_to_dev(seqs, sizeof(seqs[0]) * n_seqs);
    const size_t ws_bytes = kcu_attention_ws_bytes(n_seqs, H, D, max_ctx);
    void *ws = dalloc(ws_bytes);
    const struct kcu_att_shape sh = {.stride = stride,
                                     .k_off = k_off,
                                     .v_off = v_off,
                                     .kvt = c->kvt,
                                     .n_head = H,
                                     .n_head_kv = c->n_head_kv,
                                     .head_dim = D};
    int rc = kcu_attention(NULL, dout, dq, dseqs, seqs, n_seqs, &sh, ws, ws_bytes);
    CHECK(rc == 0, "%s: kcu_attention: %d", c->name, rc);
    sync_check("kcu_attention");
    to_host(got, dout, nq * 4);
    for (int i = 0; i < n_seqs; i++) {
        const struct kern_kv kv = {.k = r[i].host + k_off,
                                   .v = r[i].host + v_off,
                                   .stride_bytes = stride,
                                   .type = (enum kern_kv_type)c->kvt,
                                   .n_head = H,
                                   .n_kv_head = c->n_head_kv,
                                   .head_dim = D};
        const size_t o = (size_t)seqs[i].q_row * H * D;
        kern_attention(pool, want + o, q + o, n_tok[i], seqs[i].pos0, &kv);
    }
    bool ok = all_close(c->name, got, want, nq, 0.0f, 1e-4f);
    /* batch invariance: each sequence run alone gives the same bits */
    for (int i = 0; i < n_seqs && n_seqs > 1; i++) {
        struct kcu_att_seq one = seqs[i];
        one.q_row = 0;
        CU(cudaMemcpy(dseqs, &one, sizeof(one), cudaMemcpyHostToDevice));
        const size_t o = (size_t)seqs[i].q_row * H * D, n = (size_t)n_tok[i] * H * D;
        rc = kcu_attention(NULL, dout, dq + o, dseqs, &one, 1, &sh, ws, ws_bytes);
        CHECK(rc == 0, "%s: kcu_attention alone: %d", c->name, rc);
        sync_check("kcu_attention alone");
        to_host(want, dout, n * 4);
        CHECK(memcmp(want, got + o, n * 4) == 0, "%s: sequence %d alone differs from its batch",
              c->name, i);
    }
    for (int i = 0; i < n_seqs; i++)
        att_range_free(&r[i]);
    CU(cudaFree(dq));
    CU(cudaFree(dout));
    CU(cudaFree(dseqs));
    CU(cudaFree(ws));
    mem_free(q);
    mem_free(got);
    mem_free(want);
    return ok;
}

static const struct att_cfg att_cfgs[] = {
    {"gqa32/8 d128 f16", 32, 8, 128, KCU_KV_F16, 0},
    {"gqa32/8 d128 f32", 32, 8, 128, KCU_KV_F32, 0},
    {"mha4/4 d64 f16", 4, 4, 64, KCU_KV_F16, 0},
    {"mha4/4 d48 f32", 4, 4, 48, KCU_KV_F32, 0},
    {"gqa8/2 d48 f16", 8, 2, 48, KCU_KV_F16, 0},
    {"gqa16/1 d256 f16", 16, 1, 256, KCU_KV_F16, 0},
    {"gqa6/2 d80 f32", 6, 2, 80, KCU_KV_F32, 0},
    {"gqa32/8 d128 f16 misaligned", 32, 8, 128, KCU_KV_F16, 2},
    /* quantized caches: wide heads; stories260K's shape (8/4 x 8, four
     * heads a block); a head across blocks (20); rotation blocks of 16 (80);
     * an odd head_dim (no rotation); rows at odd addresses */
    {"gqa32/8 d128 q8_0", 32, 8, 128, KCU_KV_Q8_0, 0},
    {"gqa32/8 d128 q4_0", 32, 8, 128, KCU_KV_Q4_0, 0},
    {"gqa32/8 d128 fp8", 32, 8, 128, KCU_KV_FP8, 0},
    {"gqa8/4 d8 q8_0", 8, 4, 8, KCU_KV_Q8_0, 0},
    {"gqa8/4 d8 q4_0", 8, 4, 8, KCU_KV_Q4_0, 0},
    {"gqa8/4 d8 fp8", 8, 4, 8, KCU_KV_FP8, 0},
    {"gqa8/2 d20 q8_0", 8, 2, 20, KCU_KV_Q8_0, 0},
    {"gqa6/2 d80 q4_0", 6, 2, 80, KCU_KV_Q4_0, 0},
    {"mha3/3 d7 q4_0", 3, 3, 7, KCU_KV_Q4_0, 0},
    {"gqa16/1 d256 q4_0 misaligned", 16, 1, 256, KCU_KV_Q4_0, 1},
    {"gqa8/2 d48 fp8 misaligned", 8, 2, 48, KCU_KV_FP8, 3},
};
#define N_ATT_CFGS (int)(sizeof(att_cfgs) / sizeof(att_cfgs[0]))

static void test_attention_decode(void) {
    const int ctx[] = {1, 31, 32, 33, 257, 1000, 8192};
    for (int ci = 0; ci < N_ATT_CFGS; ci++)
        for (int i = 0; i < 7; i++) {
            const int one = 1;
            CHECK(att_batch(&att_cfgs[ci], 1, &ctx[i], &one), "%s decode at %d keys",
                  att_cfgs[ci].name, ctx[i]);
        }
}

static void test_attention_prefill(void) {
    const int ntok[] = {1, 2, 3, 17, 32, 33, 63, 100, 200};
    const int pos0[] = {0, 45, 513};
    for (int ci = 0; ci < N_ATT_CFGS; ci++)
        for (int i = 0; i < 9; i++)
            for (int j = 0; j < 3; j++) {
                const int keys = pos0[j] + ntok[i];
                CHECK(att_batch(&att_cfgs[ci], 1, &keys, &ntok[i]),
                      "%s prefill of %d tokens at pos0 %d", att_cfgs[ci].name, ntok[i], pos0[j]);
            }
}

static void test_attention_batch(void) {
    /* decode and prefill rows of different lengths in one call */
    const int keys[6] = {1000, 50, 1, 307, 8192, 40};
    const int ntok[6] = {1, 50, 1, 7, 1, 33};
    for (int ci = 0; ci < N_ATT_CFGS; ci++)
        CHECK(att_batch(&att_cfgs[ci], 6, keys, ntok), "%s mixed batch", att_cfgs[ci].name);
}

/* ---- Q8_0 GEMV ---- */

static void test_matmul_q8(void) {
    const struct { int n_in, n_out; } shapes[] = {{4096, 200}, {96, 37}, {14336, 64}};
    const int toks[] = {1, 2, 3, 5, 8, 16};
    for (int si = 0; si < 3; si++) {
        const int n_in = shapes[si].n_in, n_out = shapes[si].n_out;
        const size_t rb = kern_row_bytes(KERN_W_Q8_0, n_in);
        uint8_t *w = halloc(rb * n_out);
        float *wf = halloc((size_t)n_in * n_out * 4), *row = halloc((size_t)n_in * 4);
        for (int o = 0; o < n_out; o++) {
            for (int k = 0; k < n_in; k++)
                row[k] = frand() * 0.05f;
            kern_quantize_row_q8_0(row, w + rb * o, n_in);
            kern_dequant_row(KERN_W_Q8_0, w + rb * o, wf + (size_t)o * n_in, n_in);
        }
        uint8_t *dw = dup_to_dev(w, rb * n_out);
        for (int ti = 0; ti < 6; ti++) {
            const int n_tok = toks[ti];
            float *x = halloc((size_t)n_tok * n_in * 4), *got = halloc((size_t)n_tok * n_out * 4);
            for (size_t i = 0; i < (size_t)n_tok * n_in; i++)
                x[i] = frand();
            float *dx = dup_to_dev(x, (size_t)n_tok * n_in * 4),
                  *dy = dalloc((size_t)n_tok * n_out * 4);
            int rc = kcu_matmul_q8_0(NULL, dy, dx, dw, n_in, n_out, n_tok);
            CHECK(rc == 0, "kcu_matmul_q8_0: %d", rc);
            sync_check("kcu_matmul_q8_0");
            to_host(got, dy, (size_t)n_tok * n_out * 4);
            int bad_t = -1, bad_o = -1;
            double bad_g = 0, bad_w = 0;
            for (int t = 0; t < n_tok; t++)
                for (int o = 0; o < n_out; o++) {
                    double s = 0, sa = 0;
                    for (int k = 0; k < n_in; k++) {
                        const double p = (double)wf[(size_t)o * n_in + k] * x[(size_t)t * n_in + k];
                        s += p;
                        sa += fabs(p);
                    }
                    const double g = got[(size_t)t * n_out + o];
                    if (fabs(g - s) > 1e-4 * sa + 1e-30 && bad_t < 0) {
                        bad_t = t;
                        bad_o = o;
                        bad_g = g;
                        bad_w = s;
                    }
                }
            CHECK(bad_t < 0, "q8_0 %dx%d n_tok %d: y[%d][%d] got %.9g want %.9g", n_out, n_in,
                  n_tok, bad_t, bad_o, bad_g, bad_w);
            CU(cudaFree(dx));
            CU(cudaFree(dy));
            mem_free(x);
            mem_free(got);
        }
        CU(cudaFree(dw));
        mem_free(w);
        mem_free(wf);
        mem_free(row);
    }
}

/* ---- argument errors: -EINVAL, and nothing launched ---- */

static void test_errors(void) {
    float *d = dalloc(1 << 20);
    void *v = d;
    int32_t *di = (int32_t *)d;
    uint64_t *du = (uint64_t *)d;
    CHECK(kcu_embed(NULL, NULL, di, 1, v, KCU_F32, 8) == -EINVAL, "embed NULL x");
    CHECK(kcu_embed(NULL, d, di, 1, v, (enum kcu_type)7, 8) == -EINVAL, "embed bad type");
    CHECK(kcu_embed(NULL, d, di, 1, v, KCU_F32, 0) == -EINVAL, "embed n_embd 0");
    CHECK(kcu_embed(NULL, d, di, -1, v, KCU_F32, 8) == -EINVAL, "embed n_tok -1");
    CHECK(kcu_dequant_f16(NULL, (uint16_t *)v, v, 3, 64) == -EINVAL, "dequant type 3");
    CHECK(kcu_dequant_f16(NULL, (uint16_t *)v, v, 8, 33) == -EINVAL, "dequant q8_0 n 33");
    CHECK(kcu_dequant_f16(NULL, (uint16_t *)v, NULL, 1, 64) == -EINVAL, "dequant NULL src");
    CHECK(kcu_rmsnorm(NULL, d, d, NULL, NULL, 1, 8, 1e-5f) == -EINVAL, "rmsnorm NULL w");
    CHECK(kcu_rmsnorm(NULL, d, d, NULL, d, 1, 0, 1e-5f) == -EINVAL, "rmsnorm n 0");
    CHECK(kcu_to_half(NULL, v, KCU_F32, d, 8) == -EINVAL, "to_half to f32");
    CHECK(kcu_swiglu(NULL, d, NULL, d, 8) == -EINVAL, "swiglu NULL gate");
    CHECK(kcu_add(NULL, NULL, d, 8) == -EINVAL, "add NULL x");
    CHECK(kcu_rope_store(NULL, d, d, d, 1, di, du, 0, 256, KCU_KV_F16, 4, 4, 64, 63, 1e4f) ==
              -EINVAL,
          "rope odd n_rot");
    CHECK(kcu_rope_store(NULL, d, d, d, 1, di, du, 0, 256, KCU_KV_F16, 4, 4, 64, 66, 1e4f) ==
              -EINVAL,
          "rope n_rot > head_dim");
    CHECK(kcu_rope_store(NULL, d, d, d, 1, di, du, 0, 256, KCU_KV_F16, 4, 4, 258, 64, 1e4f) ==
              -EINVAL,
          "rope head_dim 258");
    CHECK(kcu_rope_store(NULL, d, d, d, 1, di, NULL, 0, 256, KCU_KV_F16, 4, 4, 64, 64, 1e4f) ==
              -EINVAL,
          "rope NULL kv_tok");
    CHECK(kcu_rope_store(NULL, d, d, d, 1, di, du, 1, 256, KCU_KV_F16, 4, 4, 64, 64, 1e4f) ==
              -EINVAL,
          "rope odd k_off for f16");
    CHECK(kcu_kv_store(NULL, d, d, 1, du, 0, 256, KCU_KV_F16, 4, 64) == -EINVAL,
          "kv_store of an f16 cache");
    CHECK(kcu_kv_store(NULL, d, d, 1, NULL, 0, 256, KCU_KV_Q8_0, 4, 64) == -EINVAL,
          "kv_store NULL kv_tok");
    CHECK(kcu_kv_store(NULL, d, d, 1, du, 0, 256, KCU_KV_Q4_0, 4, 257) == -EINVAL,
          "kv_store head_dim 257");
    CHECK(kcu_kv_store(NULL, d, d, 1, du, 0, 256, KCU_KV_FP8, 64, 256) == -EINVAL,
          "kv_store row of 16384 values");
    CHECK(kcu_rope_store(NULL, d, d, d, 1, di, du, 0, 256, KCU_KV_Q8_0, 64, 64, 256, 64, 1e4f) ==
              -EINVAL,
          "rope_store of a q8_0 row of 16384 values");
    CHECK(kcu_fp8_from_f32(NULL, NULL, d, 8) == -EINVAL, "fp8_from_f32 NULL dst");
    CHECK(kcu_matmul_q8_0(NULL, d, d, v, 48, 8, 1) == -EINVAL, "q8_0 n_in 48");
    CHECK(kcu_matmul_q8_0(NULL, d, d + 1, v, 64, 8, 1) == -EINVAL, "q8_0 misaligned x");
    CHECK(kcu_matmul_q8_0(NULL, d, d, NULL, 64, 8, 1) == -EINVAL, "q8_0 NULL w");

    const struct kcu_att_seq hs[1] = {{.base = (uint64_t)(uintptr_t)d, .pos0 = 9, .n_tok = 1}};
    struct kcu_att_shape sh = {.stride = 1024,
                               .k_off = 0,
                               .v_off = 512,
                               .kvt = KCU_KV_F16,
                               .n_head = 8,
                               .n_head_kv = 2,
                               .head_dim = 64};
    const size_t ws = kcu_attention_ws_bytes(1, 8, 64, 10);
    CHECK(ws > 0, "ws_bytes %zu", ws);
    CHECK(kcu_attention_ws_bytes(1, 8, 64, 100000) >= kcu_attention_ws_bytes(1, 8, 64, 10),
          "ws_bytes grows with the context");
    CHECK(kcu_attention_ws_bytes(0, 8, 64, 10) == 0, "ws_bytes of no sequence");
    struct kcu_att_seq *dseq = (struct kcu_att_seq *)(d + 4096);
    CHECK(kcu_attention(NULL, d, d, dseq, hs, 1, &sh, d, ws - 1) == -EINVAL, "att ws too small");
    CHECK(kcu_attention(NULL, d, d, dseq, hs, 1, &sh, NULL, ws) == -EINVAL, "att NULL ws");
    CHECK(kcu_attention(NULL, d, d, dseq, NULL, 1, &sh, d, ws) == -EINVAL, "att NULL seqs_host");
    CHECK(kcu_attention(NULL, d, d, dseq, hs, 1, NULL, d, ws) == -EINVAL, "att NULL shape");
    sh.n_head_kv = 3;
    CHECK(kcu_attention(NULL, d, d, dseq, hs, 1, &sh, d, ws) == -EINVAL, "att 8 heads / 3 kv");
    sh.n_head_kv = 2;
    sh.head_dim = 257;
    CHECK(kcu_attention(NULL, d, d, dseq, hs, 1, &sh, d, ws) == -EINVAL, "att head_dim 257");
    sh.head_dim = 64;
    sh.kvt = (enum kcu_kv)5;
    CHECK(kcu_attention(NULL, d, d, dseq, hs, 1, &sh, d, ws) == -EINVAL, "att bad kv type");
    sh.kvt = KCU_KV_F16;
    struct kcu_att_seq neg = hs[0];
    neg.pos0 = -1;
    CHECK(kcu_attention(NULL, d, d, dseq, &neg, 1, &sh, d, ws) == -EINVAL, "att negative pos0");
    /* nothing above may have launched or left an error behind */
    sync_check("argument errors");
    CU(cudaFree(d));
}

int main(int argc, char **argv) {
    const char *only = argc > 1 ? argv[1] : NULL; /* run the groups whose name contains it */
    int n_dev = 0;
    cudaError_t e = cudaGetDeviceCount(&n_dev);
    if (e != cudaSuccess || n_dev == 0) {
        printf("cuda unavailable: %s\n",
               e != cudaSuccess ? cudaGetErrorString(e) : "no CUDA device");
        printf("0 passed, 0 failed, 1 skipped\n");
        return 0;
    }
    CU(cudaSetDevice(0));
    if (kern_pool_create(0, &pool) != 0) {
        printf("FAIL: kern_pool_create\n0 passed, 1 failed, 0 skipped\n");
        return 1;
    }
    struct cudaDeviceProp prop;
    CU(cudaGetDeviceProperties(&prop, 0));
    printf("device 0: %s, sm_%d%d, %d SMs\n", prop.name, prop.major, prop.minor,
           prop.multiProcessorCount);

    const struct {
        const char *name;
        void (*fn)(void);
    } tests[] = {
        {"embed", test_embed},
        {"dequant", test_dequant},
        {"rmsnorm", test_rmsnorm},
        {"to_half", test_to_half},
        {"swiglu_add", test_swiglu_add},
        {"rope_store", test_rope_store},
        {"kv_store", test_kv_store},
        {"fp8_convert", test_fp8_convert},
        {"attention_decode", test_attention_decode},
        {"attention_prefill", test_attention_prefill},
        {"attention_batch", test_attention_batch},
        {"matmul_q8_0", test_matmul_q8},
        {"errors", test_errors},
    };
    for (size_t i = 0; i < sizeof(tests) / sizeof(tests[0]); i++) {
        if (only && !strstr(tests[i].name, only))
            continue;
        const unsigned f0 = n_fail;
        const uint64_t t0 = now_ns();
        rng_state = 0x9e3779b97f4a7c15u * (i + 1); /* each group reproducible alone */
        tests[i].fn();
        printf("%s %s (%.2f s)\n", n_fail == f0 ? "ok  " : "FAIL", tests[i].name,
               (double)(now_ns() - t0) / 1e9);
    }
    kern_pool_destroy(pool);
    CHECK(mem_bytes(MEM_TEST) == 0, "test still holds %" PRIu64 " bytes", mem_bytes(MEM_TEST));
    printf("%u passed, %u failed, 0 skipped\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
