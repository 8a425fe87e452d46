/* attention_avx512.c - kern_attention's chunk kernels at the AVX512 level,
 * for f16 and f32 chunks with head_dim a multiple of 8 (attention.c gives
 * them a quantized cache's chunks dequantized to f32; other head dims run
 * its AVX2 kernels).
 *
 * The AVX2 kernels' bits in twice the lanes. Scores: each (head, key) dot
 * is the AVX2 one, an 8-lane FMA chain over head_dim in order and the same
 * hsum; a zmm holds two keys' chains side by side (key a in lanes 0..7, b
 * in 8..15, the query's 8 elements in both halves), so one FMA advances
 * two dots and one vcvtph2ps converts two keys' slices. P.V: every element
 * of acc is its own chain of multiply-adds in key order whatever the
 * width, so 16-element slices give the AVX2 bits. test_kern_attention pins
 * the AVX2 hash at every level from AVX2 up.
 *
 * Why: on an Emerald Rapids Xeon a dummy-1g q4_0 run with an 8192-token
 * prompt spent 82% of its samples in the AVX2 attention (scores 36%, P.V
 * 40%), its prefill at 98 tok/s against 300-400 at 512 tokens: attention
 * at long context is FMA- and conversion-bound from L2/L3, and the AVX2
 * kernels used half of each FMA (docs/benchmarks.md, "Attention at the
 * avx512 level").
 */
#include "kernels/cpu/attention.h"
#include "kernels/cpu/kern_avx512.h"

#include <immintrin.h>

#define A5_AI     __attribute__((always_inline)) inline
#define A5_TARGET KERN_AVX512_TARGET

bool kern_cpu_att_avx512_takes(int head_dim) {
    return head_dim % 8 == 0;
}

/* Elements e..e+7 of the kv head in rows ra (lanes 0..7) and rb (8..15). */
static A5_TARGET A5_AI __m512 a5_load_pair(const struct att_chunk *c, const char *ra,
                                           const char *rb, int e, const enum kern_kv_type t) {
    const size_t i = (size_t)(c->e0 + e);
    if (t == KERN_KV_F16) {
        const __m128i lo = _mm_loadu_si128((const __m128i *)(ra + i * 2));
        const __m128i hi = _mm_loadu_si128((const __m128i *)(rb + i * 2));
        return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1));
    }
    return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps((const float *)(ra + i * 4))),
                              _mm256_loadu_ps((const float *)(rb + i * 4)), 1);
}

/* Elements e..e+15 of the kv head in a row. */
static A5_TARGET A5_AI __m512 a5_load16(const struct att_chunk *c, const char *row, int e,
                                        const enum kern_kv_type t) {
    const size_t i = (size_t)(c->e0 + e);
    if (t == KERN_KV_F16)
        return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(row + i * 2)));
    return _mm512_loadu_ps((const float *)(row + i * 4));
}

/* Elements e..e+7 of the kv head in a row (attention.c's att_load8 for
 * these types). */
static A5_TARGET A5_AI __m256 a5_load8(const struct att_chunk *c, const char *row, int e,
                                       const enum kern_kv_type t) {
    const size_t i = (size_t)(c->e0 + e);
    if (t == KERN_KV_F16)
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + i * 2)));
    return _mm256_loadu_ps((const float *)(row + i * 4));
}

/* attention.c's att_hsum8, operation for operation. */
static A5_TARGET A5_AI float a5_hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Scores of NG heads g0.. (NG <= 4) x P key pairs from key i0: NG * P
 * zmm chains, each K slice pair loaded and converted once for the NG
 * heads. odd: the last pair's second key is its first again (the chunk's
 * last key alone), computed and not stored. */
static A5_TARGET A5_AI void a5_dots(const struct att_chunk *c, int g0, const int NG, int i0,
                                    const int P, bool odd, float s[][ATT_CHUNK],
                                    const enum kern_kv_type t) {
    const char *ka[8], *kb[8];
    const float *q[4];
    __m512 acc[4][8];
#pragma GCC unroll 8
    for (int n = 0; n < P; n++) {
        ka[n] = c->kbase + (size_t)(c->c0 + i0 + 2 * n) * c->stride;
        kb[n] = odd && n == P - 1 ? ka[n] : ka[n] + c->stride;
    }
#pragma GCC unroll 4
    for (int g = 0; g < NG; g++) {
        q[g] = c->q + (size_t)(g0 + g) * c->hd;
#pragma GCC unroll 8
        for (int n = 0; n < P; n++)
            acc[g][n] = _mm512_setzero_ps();
    }
    for (int e = 0; e < c->hd; e += 8) {
        __m512 qv[4];
#pragma GCC unroll 4
        for (int g = 0; g < NG; g++)
            qv[g] = _mm512_broadcast_f32x8(_mm256_loadu_ps(q[g] + e));
#pragma GCC unroll 8
        for (int n = 0; n < P; n++) {
            const __m512 kv = a5_load_pair(c, ka[n], kb[n], e, t);
#pragma GCC unroll 4
            for (int g = 0; g < NG; g++)
                acc[g][n] = _mm512_fmadd_ps(qv[g], kv, acc[g][n]);
        }
    }
#pragma GCC unroll 4
    for (int g = 0; g < NG; g++)
#pragma GCC unroll 8
        for (int n = 0; n < P; n++) {
            s[g0 + g][i0 + 2 * n] = a5_hsum8(_mm512_castps512_ps256(acc[g][n])) * c->scale;
            if (!(odd && n == P - 1))
                s[g0 + g][i0 + 2 * n + 1] =
                    a5_hsum8(_mm512_extractf32x8_ps(acc[g][n], 1)) * c->scale;
        }
}

/* Heads g0 .. g0 + NG - 1 (NG <= 4): 16 keys a pass (8 with 4 heads: at
 * most 24 accumulators), then pairs, then the last key alone. The first
 * heads' passes ask for the chunk's V rows (P.V's), as at AVX2. */
static A5_TARGET A5_AI void a5_scores_heads(const struct att_chunk *c, int g0, const int NG,
                                            float s[][ATT_CHUNK], const enum kern_kv_type t) {
    const int P = NG <= 3 ? 8 : 4;
    const bool pf = g0 == 0 && c->pf_len > 0;
    int i = 0;
    for (; i + 2 * P <= c->nk; i += 2 * P) {
        if (pf)
            for (int n = 0; n < 2 * P; n++)
                att_prefetch_row(c, c->vbase, c->c0 + i + n);
        a5_dots(c, g0, NG, i, P, false, s, t);
    }
    if (pf)
        for (int n = i; n < c->nk; n++)
            att_prefetch_row(c, c->vbase, c->c0 + n);
    for (; i + 2 <= c->nk; i += 2)
        a5_dots(c, g0, NG, i, 1, false, s, t);
    if (i < c->nk)
        a5_dots(c, g0, NG, i, 1, true, s, t);
}

static A5_TARGET A5_AI void a5_scores_t(const struct att_chunk *c, float s[][ATT_CHUNK],
                                        const enum kern_kv_type t) {
    for (int g0 = 0; g0 < c->ng; g0 += 4) {
        switch (c->ng - g0) {
        case 1:
            a5_scores_heads(c, g0, 1, s, t);
            break;
        case 2:
            a5_scores_heads(c, g0, 2, s, t);
            break;
        case 3:
            a5_scores_heads(c, g0, 3, s, t);
            break;
        default:
            a5_scores_heads(c, g0, 4, s, t);
            break;
        }
    }
}

A5_TARGET void kern_cpu_att_scores_avx512(const struct att_chunk *c, float s[][ATT_CHUNK]) {
    if (c->type == KERN_KV_F16)
        a5_scores_t(c, s, KERN_KV_F16);
    else
        a5_scores_t(c, s, KERN_KV_F32);
}

/* NG heads x E 16-element slices from e, in registers across the chunk
 * (NG * E chains); each element's FMAs in key order. The first slices'
 * pass asks for the next chunk's K rows, as at AVX2. */
static A5_TARGET A5_AI void a5_pv_block(const struct att_chunk *c, const float s[][ATT_CHUNK],
                                        float acc[][ATT_MAX_HDIM], int e, const int NG, const int E,
                                        const enum kern_kv_type t) {
    __m512 a[ATT_GMAX][8];
#pragma GCC unroll 8
    for (int g = 0; g < NG; g++)
#pragma GCC unroll 8
        for (int x = 0; x < E; x++)
            a[g][x] = _mm512_loadu_ps(&acc[g][e + 16 * x]);
    const bool pf = e == 0 && c->pf_next && c->pf_len > 0;
    for (int i = 0; i < c->nk; i++) {
        const char *row = c->vbase + (size_t)(c->c0 + i) * c->stride;
        if (pf)
            att_prefetch_row(c, c->kbase, c->c0 + ATT_CHUNK + i);
        __m512 v[8];
#pragma GCC unroll 8
        for (int x = 0; x < E; x++)
            v[x] = a5_load16(c, row, e + 16 * x, t);
#pragma GCC unroll 8
        for (int g = 0; g < NG; g++) {
            const __m512 p = _mm512_set1_ps(s[g][i]);
#pragma GCC unroll 8
            for (int x = 0; x < E; x++)
                a[g][x] = _mm512_fmadd_ps(p, v[x], a[g][x]);
        }
    }
#pragma GCC unroll 8
    for (int g = 0; g < NG; g++)
#pragma GCC unroll 8
        for (int x = 0; x < E; x++)
            _mm512_storeu_ps(&acc[g][e + 16 * x], a[g][x]);
}

/* The last 8 elements (head_dim an odd multiple of 8) of NG heads. */
static A5_TARGET A5_AI void a5_pv_tail8(const struct att_chunk *c, const float s[][ATT_CHUNK],
                                        float acc[][ATT_MAX_HDIM], int e, const int NG,
                                        const enum kern_kv_type t) {
    __m256 a[ATT_GMAX];
#pragma GCC unroll 8
    for (int g = 0; g < NG; g++)
        a[g] = _mm256_loadu_ps(&acc[g][e]);
    const bool pf = e == 0 && c->pf_next && c->pf_len > 0;
    for (int i = 0; i < c->nk; i++) {
        const char *row = c->vbase + (size_t)(c->c0 + i) * c->stride;
        if (pf)
            att_prefetch_row(c, c->kbase, c->c0 + ATT_CHUNK + i);
        const __m256 v = a5_load8(c, row, e, t);
#pragma GCC unroll 8
        for (int g = 0; g < NG; g++)
            a[g] = _mm256_fmadd_ps(_mm256_set1_ps(s[g][i]), v, a[g]);
    }
#pragma GCC unroll 8
    for (int g = 0; g < NG; g++)
        _mm256_storeu_ps(&acc[g][e], a[g]);
}

/* All of head_dim for NG heads: E slices a block (NG * E + E + 1 <= 32
 * zmm registers; E divides the 8 slices of head_dim 128 and the 4 of 64),
 * the fewer than E slices left as blocks of 4, 2 and 1, then 8 elements. */
static A5_TARGET A5_AI void a5_pv_heads(const struct att_chunk *c, const float s[][ATT_CHUNK],
                                        float acc[][ATT_MAX_HDIM], const int NG,
                                        const enum kern_kv_type t) {
    const int E = NG <= 2 ? 8 : NG <= 6 ? 4 : 2;
    const int hd16 = c->hd / 16 * 16;
    int e = 0;
    for (; e + 16 * E <= hd16; e += 16 * E)
        a5_pv_block(c, s, acc, e, NG, E, t);
    if (E > 4 && e + 16 * 4 <= hd16) {
        a5_pv_block(c, s, acc, e, NG, 4, t);
        e += 16 * 4;
    }
    if (E > 2 && e + 16 * 2 <= hd16) {
        a5_pv_block(c, s, acc, e, NG, 2, t);
        e += 16 * 2;
    }
    if (e < hd16)
        a5_pv_block(c, s, acc, e, NG, 1, t);
    if (hd16 < c->hd)
        a5_pv_tail8(c, s, acc, hd16, NG, t);
}

static A5_TARGET A5_AI void a5_pv_t(const struct att_chunk *c, const float s[][ATT_CHUNK],
                                    float acc[][ATT_MAX_HDIM], const enum kern_kv_type t) {
    switch (c->ng) {
    case 1:
        a5_pv_heads(c, s, acc, 1, t);
        break;
    case 2:
        a5_pv_heads(c, s, acc, 2, t);
        break;
    case 3:
        a5_pv_heads(c, s, acc, 3, t);
        break;
    case 4:
        a5_pv_heads(c, s, acc, 4, t);
        break;
    case 5:
        a5_pv_heads(c, s, acc, 5, t);
        break;
    case 6:
        a5_pv_heads(c, s, acc, 6, t);
        break;
    case 7:
        a5_pv_heads(c, s, acc, 7, t);
        break;
    default:
        a5_pv_heads(c, s, acc, 8, t);
        break;
    }
}

A5_TARGET void kern_cpu_att_pv_avx512(const struct att_chunk *c, const float s[][ATT_CHUNK],
                                      float acc[][ATT_MAX_HDIM]) {
    if (c->type == KERN_KV_F16)
        a5_pv_t(c, s, acc, KERN_KV_F16);
    else
        a5_pv_t(c, s, acc, KERN_KV_F32);
}
