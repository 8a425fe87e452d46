/* matmul_avx2.c - AVX2/FMA/F16C micro-kernels for kern_matmul.
 *
 * One micro-kernel computes an R x T tile (R weight rows, T tokens) with one
 * 8-lane f32 accumulator per output element. Per element the sequence is
 * always the same: acc = fma(w[k..k+8], x[k..k+8], acc) for k = 0, 8, ...,
 * a masked step for the tail (zeros beyond n_in), then hsum8 (fixed tree).
 * For Q8_0/Q4_0 the step is per 32-block: the int8 products summed into 8
 * int32 lanes (maddubs/madd, exact), converted to f32, and
 * acc = fma(d_w * d_x, lanes, acc). R and T only decide how many elements
 * share the loads, so every tile shape gives bit-identical elements, which
 * is what makes kern_matmul batch invariant.
 *
 * Shapes: decode (one token) uses 8 x 1: eight independent FMA chains and
 * eight weight streams in flight (measured 10-25% faster than 4 x 1, which
 * is latency-bound on the Q8_0 integer path). Prefill uses 2 x 4: 8 accumulators + 4 activation
 * vectors + 1 weight vector fit in the 16 ymm registers, and each weight
 * load feeds 4 FMAs.
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

static KERN_AVX2 AI void mm_tile_float(const struct kern_mm *m, int r, int t, const int R,
                                       const int T, enum kern_wtype wt) {
    const int n = m->n_in;
    const void *w[8];
    const float *x[4];
    __m256 acc[8][4];
#pragma GCC unroll 8
    for (int i = 0; i < R; i++)
        w[i] = (const char *)m->w + (size_t)(r + i) * m->w_stride;
#pragma GCC unroll 8
    for (int j = 0; j < T; j++)
        x[j] = (const float *)((const char *)m->act + (size_t)(t + j) * m->act_stride);
#pragma GCC unroll 8
    for (int i = 0; i < R; i++)
#pragma GCC unroll 8
        for (int j = 0; j < T; j++)
            acc[i][j] = _mm256_setzero_ps();
    int k = 0;
    for (; k + 8 <= n; k += 8) {
        __m256 xv[4];
#pragma GCC unroll 8
        for (int j = 0; j < T; j++)
            xv[j] = _mm256_loadu_ps(x[j] + k);
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
        const size_t esz = wt == KERN_W_F32 ? 4 : 2;
        __m256 xv[4];
#pragma GCC unroll 8
        for (int j = 0; j < T; j++)
            xv[j] = _mm256_maskload_ps(x[j] + k, mask);
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

/* Block b of a Q8_0 row: 32 int8 weights, and d. */
static KERN_AVX2 AI __m256i mm_load_q8(const void *w, int b, float *d) {
    const struct kern_blk_q8_0 *blk = (const struct kern_blk_q8_0 *)w + b;
    *d = _cvtsh_ss(blk->d);
    return _mm256_loadu_si256((const __m256i *)blk->qs);
}

/* Block b of a Q4_0 row: the 32 unsigned nibbles (w + 8, element order),
 * and d. */
static KERN_AVX2 AI __m256i mm_load_q4(const void *w, int b, float *d) {
    const struct kern_blk_q4_0 *blk = (const struct kern_blk_q4_0 *)w + b;
    *d = _cvtsh_ss(blk->d);
    __m128i q = _mm_loadu_si128((const __m128i *)blk->qs);
    __m256i v = _mm256_insertf128_si256(_mm256_castsi128_si256(q), _mm_srli_epi16(q, 4), 1);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
}

/* The 8 int32 lanes of a block dot, lane l = sum of w*x over elements
 * 4l..4l+3, are exact integers, so any way of computing them gives the same
 * bits; the tiles pick the cheapest:
 *  - Q8_0: maddubs(|w|, sign(x, w)): |w| <= 128 fits u8 (|-128| is 0x80)
 *    and x * sign(w) fits s8 because a quantized activation is in
 *    [-127, 127] (pair sums <= 2*128*127, no saturation). The mirror form,
 *    maddubs(|x|, sign(w, x)), would turn w = -128 into -128 * -1 = -128;
 *    ggml's quantizers never write -128, but a file may;
 *  - Q4_0: maddubs(nibble, x) - maddubs(8, x) per int16 pair (|.| <= 2*8*127),
 *    the second term once per token and block. */
static KERN_AVX2 AI void mm_tile_q(const struct kern_mm *m, int r, int t, const int R, const int T,
                                   enum kern_wtype wt) {
    const int n = m->n_in, nb = n / KERN_QK;
    const void *w[8];
    const int8_t *xq[4];
    const float *xd[4];
    __m256 acc[8][4];
    const __m256i ones = _mm256_set1_epi16(1), eights = _mm256_set1_epi8(8);
#pragma GCC unroll 8
    for (int i = 0; i < R; i++)
        w[i] = (const char *)m->w + (size_t)(r + i) * m->w_stride;
#pragma GCC unroll 8
    for (int j = 0; j < T; j++) {
        xq[j] = (const int8_t *)m->act + (size_t)(t + j) * m->act_stride;
        xd[j] = (const float *)(xq[j] + n);
    }
#pragma GCC unroll 8
    for (int i = 0; i < R; i++)
#pragma GCC unroll 8
        for (int j = 0; j < T; j++)
            acc[i][j] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        __m256i xv[4], xa[4];
#pragma GCC unroll 8
        for (int j = 0; j < T; j++) {
            xv[j] = _mm256_load_si256((const __m256i *)(xq[j] + b * KERN_QK));
            if (wt == KERN_W_Q4_0)
                xa[j] = _mm256_maddubs_epi16(eights, xv[j]);
        }
#pragma GCC unroll 8
        for (int i = 0; i < R; i++) {
            float dw;
            if (wt == KERN_W_Q4_0) {
                __m256i wv = mm_load_q4(w[i], b, &dw);
#pragma GCC unroll 8
                for (int j = 0; j < T; j++) {
                    __m256i p16 = _mm256_sub_epi16(_mm256_maddubs_epi16(wv, xv[j]), xa[j]);
                    __m256 p = _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, ones));
                    acc[i][j] = _mm256_fmadd_ps(_mm256_set1_ps(dw * xd[j][b]), p, acc[i][j]);
                }
            } else {
                __m256i wv = mm_load_q8(w[i], b, &dw);
                __m256i aw = _mm256_sign_epi8(wv, wv);
#pragma GCC unroll 8
                for (int j = 0; j < T; j++) {
                    __m256i p16 = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(xv[j], wv));
                    __m256 p = _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, ones));
                    acc[i][j] = _mm256_fmadd_ps(_mm256_set1_ps(dw * xd[j][b]), p, acc[i][j]);
                }
            }
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
    if (wt == KERN_W_Q8_0 || wt == KERN_W_Q4_0)
        mm_tile_q(m, r, t, R, T, wt);
    else
        mm_tile_float(m, r, t, R, T, wt);
}

/* Cover rows [r0, r1) x tokens [t0, t1) with 2x4 tiles (prefill) or 8x1
 * tiles (decode), and smaller tiles for the edges. */
static KERN_AVX2 AI void mm_rect(const struct kern_mm *m, int r0, int r1, int t0, int t1,
                                 enum kern_wtype wt) {
    int r = r0;
    if (t1 - t0 >= 4) {
        for (; r + 2 <= r1; r += 2) {
            int t = t0;
            for (; t + 4 <= t1; t += 4)
                mm_tile(m, r, t, 2, 4, wt);
            for (; t < t1; t++)
                mm_tile(m, r, t, 2, 1, wt);
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
static KERN_AVX2 void mm_rect_q8_0(const struct kern_mm *m, int r0, int r1, int t0, int t1) {
    mm_rect(m, r0, r1, t0, t1, KERN_W_Q8_0);
}
static KERN_AVX2 void mm_rect_q4_0(const struct kern_mm *m, int r0, int r1, int t0, int t1) {
    mm_rect(m, r0, r1, t0, t1, KERN_W_Q4_0);
}

kern_cpu_rect_fn kern_cpu_rect_avx2(enum kern_wtype t) {
    switch (t) {
    case KERN_W_F32:
        return mm_rect_f32;
    case KERN_W_F16:
        return mm_rect_f16;
    case KERN_W_BF16:
        return mm_rect_bf16;
    case KERN_W_Q8_0:
        return mm_rect_q8_0;
    case KERN_W_Q4_0:
        return mm_rect_q4_0;
    default: /* the K-quants are matmul_k_avx2.c's */
        break;
    }
    return NULL;
}
