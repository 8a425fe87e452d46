/* matmul_avx2.c - AVX2/FMA/F16C micro-kernels for kern_matmul.
 *
 * One micro-kernel computes an R x T tile (R weight rows, T tokens) with one
 * 8-lane f32 accumulator per output element. Per element the sequence is
 * always the same: acc = fma(w[k..k+8], x[k..k+8], acc) for k = 0, 8, ...,
 * a masked step for the tail (zeros beyond n_in), then hsum8 (fixed tree).
 * R and T only decide how many elements share the loads, so every tile
 * shape gives bit-identical elements, which is what makes kern_matmul batch
 * invariant. Q8_0/Q4_0 are matmul_q.h's tiles, the int8 dot formed with
 * maddubs + madd.
 *
 * Shapes: decode (one token) uses 8 x 1: eight independent FMA chains and
 * eight weight streams in flight. Prefill uses 4 x 3: 12 accumulators + 3
 * activation vectors + 1 weight vector fill the 16 ymm registers; each
 * weight load feeds 3 FMAs and each activation load 4, 13.3 bytes loaded
 * per FMA where 2 x 4 loaded 20 (prefill is bound by those L1/L2 loads:
 * 4 x 3 ran 1.2x faster on a Zen 3, docs/benchmarks.md).
 *
 * F16 activations come as f16 (the driver rounded them to f16 anyway) and
 * are widened here like the weights: 9.3 bytes per FMA, and a token block
 * holds twice the tokens. Seven conversions per 12 FMAs did not slow the
 * tile on a Zen 3; halving the loads took f16 prefill from 77-81 to 92-93
 * GFLOP/s on one thread (docs/benchmarks.md, "f16 activations as f16").
 */
#include "kernels/cpu/kern_cpu.h"

#include <immintrin.h>
#include <stdbool.h>
#include <string.h>

#define AI __attribute__((always_inline)) inline

static KERN_AVX2 AI float mm_hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* 8 weights of a float-like type at element k of row w. */
static KERN_AVX2 AI __m256 mm_load_w(enum kern_wtype wt, const void *w, int k) {
    if (wt == KERN_W_F32)
        return _mm256_loadu_ps((const float *)w + k);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)w + k));
    if (wt == KERN_W_F16)
        return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)); /* bf16 */
}

/* 8 activations at element k of the converted row x: f16 for F16 weights,
 * else f32. */
static KERN_AVX2 AI __m256 mm_load_x(enum kern_wtype wt, const void *x, int k) {
    if (wt == KERN_W_F16)
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)x + k)));
    return _mm256_loadu_ps((const float *)x + k);
}

static KERN_AVX2 AI void mm_tile_float(const struct kern_mm *m, int r, int t, const int R,
                                       const int T, enum kern_wtype wt) {
    const int n = m->n_in;
    const void *w[8];
    const void *x[4];
    __m256 acc[8][4];
#pragma GCC unroll 8
    for (int i = 0; i < R; i++)
        w[i] = (const char *)m->w + (size_t)(r + i) * m->w_stride;
#pragma GCC unroll 8
    for (int j = 0; j < T; j++)
        x[j] = (const char *)m->act + (size_t)(t + j) * m->act_stride;
#pragma GCC unroll 8
    for (int i = 0; i < R; i++)
#pragma GCC unroll 8
        for (int j = 0; j < T; j++)
            acc[i][j] = _mm256_setzero_ps();
    int k = 0;
    const size_t esz = wt == KERN_W_F32 ? 4 : 2;
    for (; k + 8 <= n; k += 8) {
        __m256 xv[4];
        /* not in decode (T 1): the 8 rows' streams of 3 KiB and more are
         * caught by the hardware prefetchers, and the software prefetch
         * cost f16 decode 1.11-1.13x on a Zen 3 (docs/benchmarks.md) */
        if (T > 1)
            kern_cpu_prefetch_next(w[0], (size_t)R * m->w_stride, (size_t)R * 8 * esz, k / 8);
#pragma GCC unroll 8
        for (int j = 0; j < T; j++)
            xv[j] = mm_load_x(wt, x[j], k);
#pragma GCC unroll 8
        for (int i = 0; i < R; i++) {
            __m256 wv = mm_load_w(wt, w[i], k);
#pragma GCC unroll 8
            for (int j = 0; j < T; j++)
                acc[i][j] = _mm256_fmadd_ps(wv, xv[j], acc[i][j]);
        }
    }
    if (k < n) {
        static const int32_t mask_tab[16] = {-1, -1, -1, -1, -1, -1, -1, -1,
                                             0,  0,  0,  0,  0,  0,  0,  0};
        const int rem = n - k;
        const __m256i mask = _mm256_loadu_si256((const __m256i *)(mask_tab + 8 - rem));
        __m256 xv[4];
#pragma GCC unroll 8
        for (int j = 0; j < T; j++) {
            if (wt == KERN_W_F16) {
                _Alignas(16) uint16_t hb[8] = {0};
                memcpy(hb, (const uint16_t *)x[j] + k, (size_t)rem * 2);
                xv[j] = _mm256_cvtph_ps(_mm_load_si128((const __m128i *)hb));
            } else {
                xv[j] = _mm256_maskload_ps((const float *)x[j] + k, mask);
            }
        }
#pragma GCC unroll 8
        for (int i = 0; i < R; i++) {
            _Alignas(32) unsigned char buf[32] = {0};
            memcpy(buf, (const char *)w[i] + (size_t)k * esz, (size_t)rem * esz);
            __m256 wv = mm_load_w(wt, buf, 0);
#pragma GCC unroll 8
            for (int j = 0; j < T; j++)
                acc[i][j] = _mm256_fmadd_ps(wv, xv[j], acc[i][j]);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < R; i++)
#pragma GCC unroll 8
        for (int j = 0; j < T; j++)
            m->y[(size_t)(t + j) * m->n_out + r + i] = mm_hsum8(acc[i][j]);
}

static KERN_AVX2 AI void mm_tile(const struct kern_mm *m, int r, int t, const int R, const int T,
                                 enum kern_wtype wt) {
    mm_tile_float(m, r, t, R, T, wt);
}

/* Cover rows [r0, r1) x tokens [t0, t1) with 4x3 tiles (prefill) or 8x1
 * tiles (decode), and smaller tiles for the edges. */
static KERN_AVX2 AI void mm_rect(const struct kern_mm *m, int r0, int r1, int t0, int t1,
                                 enum kern_wtype wt) {
    int r = r0;
    if (t1 - t0 >= 3) {
        for (; r + 4 <= r1; r += 4) {
            int t = t0;
            for (; t + 3 <= t1; t += 3)
                mm_tile(m, r, t, 4, 3, wt);
            for (; t < t1; t++)
                mm_tile(m, r, t, 4, 1, wt);
        }
    }
    for (; r + 8 <= r1; r += 8)
        for (int t = t0; t < t1; t++)
            mm_tile(m, r, t, 8, 1, wt);
    for (; r + 4 <= r1; r += 4)
        for (int t = t0; t < t1; t++)
            mm_tile(m, r, t, 4, 1, wt);
    for (; r < r1; r++) {
        int t = t0;
        for (; t + 4 <= t1; t += 4)
            mm_tile(m, r, t, 1, 4, wt);
        for (; t < t1; t++)
            mm_tile(m, r, t, 1, 1, wt);
    }
}

static KERN_AVX2 void mm_rect_f32(const struct kern_mm *m, int r0, int r1, int t0, int t1) {
    mm_rect(m, r0, r1, t0, t1, KERN_W_F32);
}
static KERN_AVX2 void mm_rect_f16(const struct kern_mm *m, int r0, int r1, int t0, int t1) {
    mm_rect(m, r0, r1, t0, t1, KERN_W_F16);
}
static KERN_AVX2 void mm_rect_bf16(const struct kern_mm *m, int r0, int r1, int t0, int t1) {
    mm_rect(m, r0, r1, t0, t1, KERN_W_BF16);
}
/* Q8_0/Q4_0: matmul_q.h with the int8 dot as maddubs + madd. */
static KERN_AVX2 AI __m256i mmq_avx2_dpbusd(__m256i a, __m256i u, __m256i s) {
    return _mm256_add_epi32(a, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
}
#define MMQ_TARGET          KERN_AVX2
#define MMQ_DPBUSD(a, u, s) mmq_avx2_dpbusd((a), (u), (s))
#define MMQ_NAME(x)         mmq_avx2_##x
#define MMQ_Q8_ONE_SUM      0
#define MMQ_AI              AI
#include "kernels/cpu/matmul_q.h"

kern_cpu_rect_fn kern_cpu_rect_avx2(enum kern_wtype t) {
    switch (t) {
    case KERN_W_F32:
        return mm_rect_f32;
    case KERN_W_F16:
        return mm_rect_f16;
    case KERN_W_BF16:
        return mm_rect_bf16;
    case KERN_W_Q8_0:
        return mmq_avx2_rect_q8_0;
    case KERN_W_Q4_0:
        return mmq_avx2_rect_q4_0;
    default: /* the K-quants are matmul_k_avx2.c's */
        break;
    }
    return NULL;
}
