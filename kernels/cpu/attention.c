/* attention.c - causal multi-head attention (GQA) over a strided KV cache.
 *
 * Work item = (query token, kv head): the n_head/n_kv_head query heads that
 * share a kv head are processed together so each K/V row is read once per
 * group. Threads claim items from an atomic counter (later tokens see more
 * keys, so a static split would be uneven).
 *
 * Per query head the keys are visited in order 0..n-1 in chunks of
 * ATT_CHUNK: scores s_j = dot(q, K_j) * scale; then an online softmax
 * (running max m and sum l in f32; when a chunk raises m, l and the output
 * accumulator are rescaled by expf(m_old - m_new)); then acc += p_j * V_j in
 * key order. The probabilities p_j = exp(s_j - m) come from libm's expf on
 * the portable path and from an 8-lane polynomial (att_exp8) on the others. Chunk boundaries depend
 * only on the key index, so the result depends only on the number of keys and head_dim (batch
 * invariance), never on n_tok, pos0 or the threads. One pass over K and V, no scratch.
 *
 * Cache types (layouts in kern.h): every chunk kernel reads element e of the
 * item's kv head through one accessor per type, the type a constant in each
 * specialized copy. Quantized values are dequantized in registers: Q8_0 and
 * Q4_0 give d * q (exact in f32: an 11-bit by 4- or 8-bit product), FP8 the
 * E4M3 value times its head's scale (one rounding), the same value on every
 * path. An 8-lane load that would straddle two Q8_0/Q4_0 blocks (a head_dim
 * that is not a multiple of 8) is assembled element by element. Q4_0 rows
 * hold rotated heads: the item rotates its queries first and its outputs
 * back (kern_kv_rotate), inside the item, so invariance holds.
 *
 * Levels: scalar runs the portable kernels, avx2 and avx-vnni the AVX2
 * ones below; avx512 and amx run attention_avx512.c's (the AVX2 bits in
 * twice the lanes) when head_dim is a multiple of 8, on the quantized
 * caches' dequantized chunks too, else the AVX2 ones. The chunk interface
 * is attention.h.
 */
#include "kernels/cpu/attention.h"
#include "kernels/cpu/kern_cpu.h"

#include <assert.h>
#include <immintrin.h>
#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>

struct att_job {
    float *out;
    const float *q;
    const struct kern_kv *kv;
    int pos0, n_items;
    float scale;
    bool avx2;
    bool avx512; /* attention_avx512.c takes the head_dim */
    _Atomic int next;
};

#define AI __attribute__((always_inline)) inline

static inline uint16_t att_u16(const char *p) {
    uint16_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* Element e of the item's kv head in the KV row `row`, as f32. */
static AI float att_at(const struct att_chunk *c, const char *row, int e,
                       const enum kern_kv_type t) {
    switch (t) {
    case KERN_KV_F32: {
        float v;
        memcpy(&v, row + (size_t)(c->e0 + e) * 4, sizeof v);
        return v;
    }
    case KERN_KV_F16:
        return kern_f16_to_f32_1(att_u16(row + (size_t)(c->e0 + e) * 2));
    case KERN_KV_Q8_0: {
        const int i = c->e0 + e;
        const char *b = row + (size_t)(i / KERN_QK) * sizeof(struct kern_blk_q8_0);
        return (float)(int8_t)b[2 + i % KERN_QK] * kern_f16_to_f32_1(att_u16(b));
    }
    case KERN_KV_Q4_0: {
        const int i = c->e0 + e, j = i % KERN_QK;
        const char *b = row + (size_t)(i / KERN_QK) * sizeof(struct kern_blk_q4_0);
        const uint8_t x = (uint8_t)b[2 + (j & 15)];
        return (float)((j < 16 ? x & 15 : x >> 4) - 8) * kern_f16_to_f32_1(att_u16(b));
    }
    default: { /* KERN_KV_FP8 */
        const char *h = row + c->hoff;
        float sc;
        memcpy(&sc, h, sizeof sc);
        return kern_f16_to_f32_1(kern_cpu_fp8_f16_bits((uint8_t)h[4 + e])) * (sc * 256.0f);
    }
    }
}

/* ---- portable: left-to-right dot, one key at a time ---- */

static AI void att_scores_scalar_t(const struct att_chunk *c, float s[][ATT_CHUNK],
                                   const enum kern_kv_type t) {
    for (int i = 0; i < c->nk; i++) {
        const char *k = c->kbase + (size_t)(c->c0 + i) * c->stride;
        for (int g = 0; g < c->ng; g++) {
            const float *q = c->q + (size_t)g * c->hd;
            float d = 0.0f;
            for (int e = 0; e < c->hd; e++)
                d += q[e] * att_at(c, k, e, t);
            s[g][i] = d * c->scale;
        }
    }
}

static AI void att_pv_scalar_t(const struct att_chunk *c, const float s[][ATT_CHUNK],
                               float acc[][ATT_MAX_HDIM], const enum kern_kv_type t) {
    for (int i = 0; i < c->nk; i++) {
        const char *v = c->vbase + (size_t)(c->c0 + i) * c->stride;
        for (int g = 0; g < c->ng; g++)
            for (int e = 0; e < c->hd; e++)
                acc[g][e] += s[g][i] * att_at(c, v, e, t);
    }
}

/* One copy per cache type, the type a constant in each. */
#define ATT_BY_TYPE(t, CALL)                                                                       \
    switch (t) {                                                                                   \
    case KERN_KV_F32:                                                                              \
        CALL(KERN_KV_F32);                                                                         \
        break;                                                                                     \
    case KERN_KV_F16:                                                                              \
        CALL(KERN_KV_F16);                                                                         \
        break;                                                                                     \
    case KERN_KV_Q8_0:                                                                             \
        CALL(KERN_KV_Q8_0);                                                                        \
        break;                                                                                     \
    case KERN_KV_Q4_0:                                                                             \
        CALL(KERN_KV_Q4_0);                                                                        \
        break;                                                                                     \
    default:                                                                                       \
        CALL(KERN_KV_FP8);                                                                         \
        break;                                                                                     \
    }

static void att_scores_scalar(const struct att_chunk *c, float s[][ATT_CHUNK]) {
#define ATT_CALL(T) att_scores_scalar_t(c, s, T)
    ATT_BY_TYPE(c->type, ATT_CALL)
#undef ATT_CALL
}

static void att_pv_scalar(const struct att_chunk *c, const float s[][ATT_CHUNK],
                          float acc[][ATT_MAX_HDIM]) {
#define ATT_CALL(T) att_pv_scalar_t(c, s, acc, T)
    ATT_BY_TYPE(c->type, ATT_CALL)
#undef ATT_CALL
}

/* ---- AVX2: each dot is one 8-lane FMA chain over head_dim, a fixed hsum,
 * then the scalar tail. The scores run up to 4 heads x N keys side by side
 * (12 chains; each K slice loaded and converted once for those heads: it
 * was once per head, 3x the conversions for a 12/4-head model, and 4
 * chains did not hide the FMA latency). P.V keeps 8 x E dims of every head
 * in registers across the chunk (NG * E chains: with one 8-dim slice a
 * pass, NG chains of 32 dependent FMAs were latency-bound); per element the
 * FMAs still go in key order. The rows of consecutive keys are a token's
 * stride apart (kv.h: 32 KiB for dummy-1g), each on its own 4 KiB page,
 * which the hardware prefetchers do not follow: the scores ask for the
 * chunk's V rows and P.V for the next chunk's K rows (att_prefetch_row).
 * On a Zen 3, decode attention at 8192 keys, 12/4 heads x 128, f16: 1.27x
 * on one thread, 1.53x on two (docs/benchmarks.md). An earlier try at
 * loading each K slice once for the group (NG x 3 keys, 9 chains, no
 * prefetch) ran decode at 0.85x on a Zen 5; this form is unmeasured
 * there. ---- */

/* Elements e..e+7 of the item's kv head in the row, as f32. */
static KERN_AVX2 AI __m256 att_load8(const struct att_chunk *c, const char *row, int e,
                                     const enum kern_kv_type t) {
    switch (t) {
    case KERN_KV_F32:
        return _mm256_loadu_ps((const float *)(row + (size_t)(c->e0 + e) * 4));
    case KERN_KV_F16:
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + (size_t)(c->e0 + e) * 2)));
    case KERN_KV_Q8_0: {
        const int i = c->e0 + e, j = i % KERN_QK;
        const char *b = row + (size_t)(i / KERN_QK) * sizeof(struct kern_blk_q8_0);
        if (j > KERN_QK - 8)
            break; /* straddles two blocks */
        const __m256 q =
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(b + 2 + j))));
        return _mm256_mul_ps(q, _mm256_set1_ps(_cvtsh_ss(att_u16(b))));
    }
    case KERN_KV_Q4_0: {
        const int i = c->e0 + e, j = i % KERN_QK;
        const char *b = row + (size_t)(i / KERN_QK) * sizeof(struct kern_blk_q4_0);
        if ((j > 8 && j < 16) || j > 24)
            break; /* crosses from low to high nibbles, or into the next block */
        __m128i x = _mm_loadl_epi64((const __m128i *)(b + 2 + (j & 15)));
        if (j >= 16)
            x = _mm_srli_epi16(x, 4);
        x = _mm_and_si128(x, _mm_set1_epi8(15));
        const __m256 q =
            _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_cvtepu8_epi32(x), _mm256_set1_epi32(8)));
        return _mm256_mul_ps(q, _mm256_set1_ps(_cvtsh_ss(att_u16(b))));
    }
    default: { /* KERN_KV_FP8: the bits of kern_cpu_fp8_f16_bits in 8 lanes */
        const char *h = row + c->hoff;
        float sc;
        memcpy(&sc, h, sizeof sc);
        const __m128i w = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(h + 4 + e)));
        const __m128i bits =
            _mm_or_si128(_mm_slli_epi16(_mm_and_si128(w, _mm_set1_epi16(0x7F)), 7),
                         _mm_slli_epi16(_mm_and_si128(w, _mm_set1_epi16(0x80)), 8));
        return _mm256_mul_ps(_mm256_cvtph_ps(bits), _mm256_set1_ps(sc * 256.0f));
    }
    }
    _Alignas(32) float tmp[8];
    for (int f = 0; f < 8; f++)
        tmp[f] = att_at(c, row, e + f, t);
    return _mm256_load_ps(tmp);
}

static KERN_AVX2 AI float att_hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Scores of NG heads g0.. x N keys i0.. at once: each K slice is loaded
 * (and converted) once for the NG heads, NG * N independent chains. Every
 * (head, key) dot is one 8-lane FMA chain over head_dim in order, the hsum
 * of att_hsum8, then the tail left to right: the same for any NG and N. */
static KERN_AVX2 AI void att_dots_heads(const struct att_chunk *c, int g0, const int NG, int i0,
                                        const int N, float s[][ATT_CHUNK],
                                        const enum kern_kv_type t) {
    const char *k[8];
    const float *q[4];
    __m256 acc[4][8];
#pragma GCC unroll 8
    for (int n = 0; n < N; n++)
        k[n] = c->kbase + (size_t)(c->c0 + i0 + n) * c->stride;
#pragma GCC unroll 4
    for (int g = 0; g < NG; g++) {
        q[g] = c->q + (size_t)(g0 + g) * c->hd;
#pragma GCC unroll 8
        for (int n = 0; n < N; n++)
            acc[g][n] = _mm256_setzero_ps();
    }
    int e = 0;
    for (; e + 8 <= c->hd; e += 8) {
#pragma GCC unroll 8
        for (int n = 0; n < N; n++) {
            const __m256 kv = att_load8(c, k[n], e, t);
#pragma GCC unroll 4
            for (int g = 0; g < NG; g++)
                acc[g][n] = _mm256_fmadd_ps(_mm256_loadu_ps(q[g] + e), kv, acc[g][n]);
        }
    }
#pragma GCC unroll 4
    for (int g = 0; g < NG; g++)
#pragma GCC unroll 8
        for (int n = 0; n < N; n++) {
            float r = att_hsum8(acc[g][n]);
            for (int f = e; f < c->hd; f++)
                r += q[g][f] * att_at(c, k[n], f, t);
            s[g0 + g][i0 + n] = r * c->scale;
        }
}

/* Heads g0 .. g0 + NG - 1 (NG <= 4): N = 12 / NG keys a pass (NG * N
 * accumulators, one K vector, within the 16 ymm registers), the rest of
 * the chunk one key at a time. */
static KERN_AVX2 AI void att_scores_heads(const struct att_chunk *c, int g0, const int NG,
                                          float s[][ATT_CHUNK], const enum kern_kv_type t) {
    const int N = NG == 1 ? 8 : 12 / NG;
    /* the first heads' pass also asks for the chunk's V rows (P.V's) */
    const bool pf = g0 == 0 && c->pf_len > 0;
    int i = 0;
    for (; i + N <= c->nk; i += N) {
        if (pf)
            for (int n = 0; n < N; n++)
                att_prefetch_row(c, c->vbase, c->c0 + i + n);
        att_dots_heads(c, g0, NG, i, N, s, t);
    }
    if (pf)
        for (int n = i; n < c->nk; n++)
            att_prefetch_row(c, c->vbase, c->c0 + n);
    for (; i < c->nk; i++)
        att_dots_heads(c, g0, NG, i, 1, s, t);
}

static KERN_AVX2 AI void att_scores_avx2_t(const struct att_chunk *c, float s[][ATT_CHUNK],
                                           const enum kern_kv_type t) {
    for (int g0 = 0; g0 < c->ng; g0 += 4) {
        switch (c->ng - g0) {
        case 1:
            att_scores_heads(c, g0, 1, s, t);
            break;
        case 2:
            att_scores_heads(c, g0, 2, s, t);
            break;
        case 3:
            att_scores_heads(c, g0, 3, s, t);
            break;
        default:
            att_scores_heads(c, g0, 4, s, t);
            break;
        }
    }
}

/* Rows c0..c0+nk-1 of the item's kv head from base, dequantized into
 * out[i][0..hd): the values att_at gives, bit for bit (d * q is exact; FP8
 * goes through the same f16 bits and the same s * 256). Whole blocks at a
 * time where the head is block-aligned (head_dim a multiple of 32), 16
 * FP8 values at a time; att_load8 and att_at elsewhere. */
static KERN_AVX2 AI void att_deq_rows(const struct att_chunk *c, const char *base,
                                      float out[][ATT_MAX_HDIM], const enum kern_kv_type t) {
    const bool blocks = c->e0 % KERN_QK == 0 && c->hd % KERN_QK == 0;
    /* with K's rows ask for the chunk's V rows, with V's the next chunk's K */
    const bool is_k = base == c->kbase, pf = c->pf_len > 0 && (is_k || c->pf_next);
    for (int i = 0; i < c->nk; i++) {
        const char *row = base + (size_t)(c->c0 + i) * c->stride;
        if (pf)
            att_prefetch_row(c, is_k ? c->vbase : c->kbase, c->c0 + i + (is_k ? 0 : ATT_CHUNK));
        float *o = out[i];
        int e = 0;
        if (t == KERN_KV_Q8_0 && blocks) {
            const char *b = row + (size_t)(c->e0 / KERN_QK) * sizeof(struct kern_blk_q8_0);
            for (; e < c->hd; e += KERN_QK, b += sizeof(struct kern_blk_q8_0)) {
                const __m256 d = _mm256_set1_ps(_cvtsh_ss(att_u16(b)));
                const __m128i lo = _mm_loadu_si128((const __m128i *)(b + 2));
                const __m128i hi = _mm_loadu_si128((const __m128i *)(b + 18));
                const __m128i q8[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
#pragma GCC unroll 4
                for (int k = 0; k < 4; k++)
                    _mm256_storeu_ps(
                        o + e + 8 * k,
                        _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8[k])), d));
            }
        } else if (t == KERN_KV_Q4_0 && blocks) {
            const char *b = row + (size_t)(c->e0 / KERN_QK) * sizeof(struct kern_blk_q4_0);
            const __m128i m4 = _mm_set1_epi8(15), k8 = _mm_set1_epi8(8);
            for (; e < c->hd; e += KERN_QK, b += sizeof(struct kern_blk_q4_0)) {
                const __m256 d = _mm256_set1_ps(_cvtsh_ss(att_u16(b)));
                const __m128i x = _mm_loadu_si128((const __m128i *)(b + 2));
                const __m128i lo = _mm_sub_epi8(_mm_and_si128(x, m4), k8);
                const __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(x, 4), m4), k8);
                const __m128i q8[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
#pragma GCC unroll 4
                for (int k = 0; k < 4; k++)
                    _mm256_storeu_ps(
                        o + e + 8 * k,
                        _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8[k])), d));
            }
        } else if (t == KERN_KV_FP8) {
            /* sign-extended byte << 7, masked to bit 15 and bits 13..7: the
             * f16 bits of kern_cpu_fp8_f16_bits, 16 at a time */
            const char *h = row + c->hoff;
            float sc;
            memcpy(&sc, h, sizeof sc);
            const __m256 s256 = _mm256_set1_ps(sc * 256.0f);
            const __m256i mask = _mm256_set1_epi16((short)0xBF80);
            for (; e + 16 <= c->hd; e += 16) {
                const __m256i w = _mm256_and_si256(
                    _mm256_slli_epi16(
                        _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(h + 4 + e))), 7),
                    mask);
                _mm256_storeu_ps(o + e,
                                 _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(w)), s256));
                _mm256_storeu_ps(
                    o + e + 8,
                    _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(w, 1)), s256));
            }
        }
        for (; e + 8 <= c->hd; e += 8)
            _mm256_storeu_ps(o + e, att_load8(c, row, e, t));
        for (; e < c->hd; e++)
            o[e] = att_at(c, row, e, t);
    }
}

/* The chunk of a quantized cache seen as f32: its K (or V) rows dequantized
 * once into a scratch, so the dots of the ng heads that share them, and
 * P.V, run the f32 kernels (dequantizing inside each dot would repeat the
 * work ng times, and without whole-block loads cost 3x the f16 path:
 * measured, decode at 8k keys, 12/4 heads x 128). The scratch holds the
 * values the direct loads give, so the result is the direct path's. 32
 * keys x 256 floats: 32 KiB of stack, in L1. */
static KERN_AVX2 AI struct att_chunk att_deq_chunk(const struct att_chunk *c, const char *base,
                                                   float out[][ATT_MAX_HDIM],
                                                   const enum kern_kv_type t) {
    att_deq_rows(c, base, out, t);
    struct att_chunk f = *c;
    f.pf_len = 0; /* the scratch is in L1: att_deq_rows asked for the rows */
    f.kbase = f.vbase = (const char *)out;
    f.stride = sizeof out[0];
    f.c0 = 0;
    f.e0 = 0;
    f.type = KERN_KV_F32;
    return f;
}

static KERN_AVX2 AI void att_scores_avx2_q(const struct att_chunk *c, float s[][ATT_CHUNK],
                                           const enum kern_kv_type t) {
    _Alignas(32) float kf[ATT_CHUNK][ATT_MAX_HDIM];
    const struct att_chunk f = att_deq_chunk(c, c->kbase, kf, t);
    att_scores_avx2_t(&f, s, KERN_KV_F32);
}

static KERN_AVX2 void att_scores_avx2(const struct att_chunk *c, float s[][ATT_CHUNK]) {
    switch (c->type) {
    case KERN_KV_F32:
        att_scores_avx2_t(c, s, KERN_KV_F32);
        break;
    case KERN_KV_F16:
        att_scores_avx2_t(c, s, KERN_KV_F16);
        break;
    case KERN_KV_Q8_0:
        att_scores_avx2_q(c, s, KERN_KV_Q8_0);
        break;
    case KERN_KV_Q4_0:
        att_scores_avx2_q(c, s, KERN_KV_Q4_0);
        break;
    default:
        att_scores_avx2_q(c, s, KERN_KV_FP8);
        break;
    }
}

/* exp(x) for x <= 0 in 8 lanes: Cody-Waite reduction x = n ln2 + r and
 * Cephes's degree-6 polynomial for exp(r) on [-ln2/2, ln2/2] (S. L.
 * Moshier, Cephes Math Library, expf.c: relative error below 2 ulp), then
 * 2^n through the exponent bits. x below -87.3 (exp < 2^-126) gives 0: a
 * probability that small changes no f32 sum it joins. */
static KERN_AVX2 AI __m256 att_exp8(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.33654f);
    const __m256 keep = _mm256_cmp_ps(x, lo, _CMP_GE_OQ);
    x = _mm256_max_ps(x, lo);
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i e =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e)), keep);
}

KERN_AVX2 void kern_cpu_exp_sub_avx2(float *s, int nk, float m) {
    const __m256 mv = _mm256_set1_ps(m);
    int i = 0;
    for (; i + 8 <= nk; i += 8)
        _mm256_storeu_ps(s + i, att_exp8(_mm256_sub_ps(_mm256_loadu_ps(s + i), mv)));
    if (i < nk) {
        _Alignas(32) float t[8] = {0};
        memcpy(t, s + i, sizeof(float) * (size_t)(nk - i));
        const __m256 v = att_exp8(_mm256_sub_ps(_mm256_load_ps(t), mv));
        _mm256_store_ps(t, v);
        memcpy(s + i, t, sizeof(float) * (size_t)(nk - i));
    }
}

/* NG heads x E 8-dim slices of accumulators stay in registers across the
 * chunk (NG and E constant): NG * E independent FMA chains, so the chunk's
 * 32 keys are not one latency-bound chain per head (each element's FMAs
 * still go in key order: the same bits for any E). */
static KERN_AVX2 AI void att_pv_block(const struct att_chunk *c, const float s[][ATT_CHUNK],
                                      float acc[][ATT_MAX_HDIM], int e, const int NG, const int E,
                                      const enum kern_kv_type t) {
    __m256 a[ATT_GMAX][6];
#pragma GCC unroll 8
    for (int g = 0; g < NG; g++)
#pragma GCC unroll 6
        for (int x = 0; x < E; x++)
            a[g][x] = _mm256_loadu_ps(&acc[g][e + 8 * x]);
    /* the first slices' pass also asks for the next chunk's K rows */
    const bool pf = e == 0 && c->pf_next && c->pf_len > 0;
    for (int i = 0; i < c->nk; i++) {
        const char *row = c->vbase + (size_t)(c->c0 + i) * c->stride;
        if (pf)
            att_prefetch_row(c, c->kbase, c->c0 + ATT_CHUNK + i);
        __m256 v[6];
#pragma GCC unroll 6
        for (int x = 0; x < E; x++)
            v[x] = att_load8(c, row, e + 8 * x, t);
#pragma GCC unroll 8
        for (int g = 0; g < NG; g++) {
            const __m256 p = _mm256_set1_ps(s[g][i]);
#pragma GCC unroll 6
            for (int x = 0; x < E; x++)
                a[g][x] = _mm256_fmadd_ps(p, v[x], a[g][x]);
        }
    }
#pragma GCC unroll 8
    for (int g = 0; g < NG; g++)
#pragma GCC unroll 6
        for (int x = 0; x < E; x++)
            _mm256_storeu_ps(&acc[g][e + 8 * x], a[g][x]);
}

/* Slices [e, hd) of NG heads: E at a time (NG * E + E + 1 <= 16 ymm
 * registers, NG * E about 8 chains), then one at a time. Returns the first
 * element not covered (hd rounded down to 8). */
static KERN_AVX2 AI int att_pv_heads(const struct att_chunk *c, const float s[][ATT_CHUNK],
                                     float acc[][ATT_MAX_HDIM], const int NG,
                                     const enum kern_kv_type t) {
    const int E = NG == 1 ? 6 : NG == 2 ? 4 : NG == 3 ? 3 : NG == 4 ? 2 : 1;
    int e = 0;
    for (; e + 8 * E <= c->hd; e += 8 * E)
        att_pv_block(c, s, acc, e, NG, E, t);
    for (; e + 8 <= c->hd; e += 8)
        att_pv_block(c, s, acc, e, NG, 1, t);
    return e;
}

static KERN_AVX2 AI void att_pv_avx2_t(const struct att_chunk *c, const float s[][ATT_CHUNK],
                                       float acc[][ATT_MAX_HDIM], const enum kern_kv_type t) {
    int e;
    switch (c->ng) {
    case 1:
        e = att_pv_heads(c, s, acc, 1, t);
        break;
    case 2:
        e = att_pv_heads(c, s, acc, 2, t);
        break;
    case 3:
        e = att_pv_heads(c, s, acc, 3, t);
        break;
    case 4:
        e = att_pv_heads(c, s, acc, 4, t);
        break;
    case 5:
        e = att_pv_heads(c, s, acc, 5, t);
        break;
    case 6:
        e = att_pv_heads(c, s, acc, 6, t);
        break;
    case 7:
        e = att_pv_heads(c, s, acc, 7, t);
        break;
    default:
        e = att_pv_heads(c, s, acc, 8, t);
        break;
    }
    for (; e < c->hd; e++)
        for (int i = 0; i < c->nk; i++) {
            const float ve = att_at(c, c->vbase + (size_t)(c->c0 + i) * c->stride, e, t);
            for (int g = 0; g < c->ng; g++)
                acc[g][e] += s[g][i] * ve;
        }
}

static KERN_AVX2 AI void att_pv_avx2_q(const struct att_chunk *c, const float s[][ATT_CHUNK],
                                       float acc[][ATT_MAX_HDIM], const enum kern_kv_type t) {
    _Alignas(32) float vf[ATT_CHUNK][ATT_MAX_HDIM];
    const struct att_chunk f = att_deq_chunk(c, c->vbase, vf, t);
    att_pv_avx2_t(&f, s, acc, KERN_KV_F32);
}

static KERN_AVX2 void att_pv_avx2(const struct att_chunk *c, const float s[][ATT_CHUNK],
                                  float acc[][ATT_MAX_HDIM]) {
    switch (c->type) {
    case KERN_KV_F32:
        att_pv_avx2_t(c, s, acc, KERN_KV_F32);
        break;
    case KERN_KV_F16:
        att_pv_avx2_t(c, s, acc, KERN_KV_F16);
        break;
    case KERN_KV_Q8_0:
        att_pv_avx2_q(c, s, acc, KERN_KV_Q8_0);
        break;
    case KERN_KV_Q4_0:
        att_pv_avx2_q(c, s, acc, KERN_KV_Q4_0);
        break;
    default:
        att_pv_avx2_q(c, s, acc, KERN_KV_FP8);
        break;
    }
}

/* The AVX512 level (head_dim a multiple of 8) with a quantized cache: the
 * chunk dequantized as at AVX2, its f32 scratch through
 * attention_avx512.c's kernels (f16 and f32 caches go to them directly,
 * without this scratch on the stack). The AVX2 bits either way. */
static KERN_AVX2 AI struct att_chunk att_deq_chunk_q(const struct att_chunk *c, const char *base,
                                                     float out[][ATT_MAX_HDIM]) {
    switch (c->type) {
    case KERN_KV_Q8_0:
        return att_deq_chunk(c, base, out, KERN_KV_Q8_0);
    case KERN_KV_Q4_0:
        return att_deq_chunk(c, base, out, KERN_KV_Q4_0);
    default:
        return att_deq_chunk(c, base, out, KERN_KV_FP8);
    }
}

static KERN_AVX2 void att_scores_avx512_q(const struct att_chunk *c, float s[][ATT_CHUNK]) {
    _Alignas(32) float kf[ATT_CHUNK][ATT_MAX_HDIM];
    const struct att_chunk f = att_deq_chunk_q(c, c->kbase, kf);
    kern_cpu_att_scores_avx512(&f, s);
}

static KERN_AVX2 void att_pv_avx512_q(const struct att_chunk *c, const float s[][ATT_CHUNK],
                                      float acc[][ATT_MAX_HDIM]) {
    _Alignas(32) float vf[ATT_CHUNK][ATT_MAX_HDIM];
    const struct att_chunk f = att_deq_chunk_q(c, c->vbase, vf);
    kern_cpu_att_pv_avx512(&f, s, acc);
}

/* ---- one work item ---- */

/* Byte range of kv head h in a KV row of kv's type (the lines the item
 * reads). */
static void att_head_span(const struct kern_kv *kv, int h, size_t *off, size_t *len) {
    const int hd = kv->head_dim, e0 = h * hd;
    switch (kv->type) {
    case KERN_KV_F32:
        *off = (size_t)e0 * 4;
        *len = (size_t)hd * 4;
        break;
    case KERN_KV_F16:
        *off = (size_t)e0 * 2;
        *len = (size_t)hd * 2;
        break;
    case KERN_KV_Q8_0:
    case KERN_KV_Q4_0: {
        const size_t bb =
            kv->type == KERN_KV_Q8_0 ? sizeof(struct kern_blk_q8_0) : sizeof(struct kern_blk_q4_0);
        *off = (size_t)(e0 / KERN_QK) * bb;
        *len = (size_t)((e0 + hd - 1) / KERN_QK - e0 / KERN_QK + 1) * bb;
        break;
    }
    default:
        *off = (size_t)h * kern_cpu_fp8_head_bytes(hd);
        *len = kern_cpu_fp8_head_bytes(hd);
        break;
    }
}

static void att_item(const struct att_job *j, int item) {
    const struct kern_kv *kv = j->kv;
    const int hd = kv->head_dim, group = kv->n_head / kv->n_kv_head;
    const int t = item / kv->n_kv_head, kvh = item % kv->n_kv_head;
    const int n_keys = j->pos0 + t + 1;
    /* a sliding window: the first key seen depends on the position only, so
     * the chunks (and the result) stay those of the key index */
    const int k0 = kv->window > 0 && n_keys > kv->window ? n_keys - kv->window : 0;
    const bool rot = kv->type == KERN_KV_Q4_0;
    const bool deq = kv->type != KERN_KV_F16 && kv->type != KERN_KV_F32;
    const att_scores_fn scores = j->avx512
                                     ? (deq ? att_scores_avx512_q : kern_cpu_att_scores_avx512)
                                 : j->avx2 ? att_scores_avx2
                                           : att_scores_scalar;
    const att_pv_fn pv = j->avx512 ? (deq ? att_pv_avx512_q : kern_cpu_att_pv_avx512)
                         : j->avx2 ? att_pv_avx2
                                   : att_pv_scalar;
    _Alignas(32) float acc[ATT_GMAX][ATT_MAX_HDIM];
    _Alignas(32) float qrot[ATT_GMAX * ATT_MAX_HDIM]; /* Q4_0: the rotated queries */
    float s[ATT_GMAX][ATT_CHUNK], m[ATT_GMAX], l[ATT_GMAX];
    struct att_chunk c = {.kbase = kv->k,
                          .vbase = kv->v,
                          .stride = kv->stride_bytes,
                          .type = kv->type,
                          .hd = hd,
                          .e0 = kvh * hd,
                          .hoff = (size_t)kvh * kern_cpu_fp8_head_bytes(hd),
                          .scale = j->scale};
    if (j->avx2) /* the head's bytes: whole blocks for q8_0/q4_0, FP8's scale + bytes */
        att_head_span(kv, kvh, &c.pf_off, &c.pf_len);

    for (int g0 = 0; g0 < group; g0 += ATT_GMAX) {
        const int h0 = kvh * group + g0;
        c.ng = group - g0 < ATT_GMAX ? group - g0 : ATT_GMAX;
        c.q = j->q + ((size_t)t * kv->n_head + h0) * hd;
        if (rot) {
            memcpy(qrot, c.q, sizeof(float) * (size_t)c.ng * hd);
            kern_kv_rotate(qrot, c.ng, hd);
            c.q = qrot;
        }
        for (int g = 0; g < c.ng; g++) {
            m[g] = -INFINITY;
            l[g] = 0.0f;
            for (int d = 0; d < hd; d++)
                acc[g][d] = 0.0f;
        }
        for (c.c0 = k0; c.c0 < n_keys; c.c0 += ATT_CHUNK) {
            c.nk = n_keys - c.c0 < ATT_CHUNK ? n_keys - c.c0 : ATT_CHUNK;
            c.pf_next = n_keys - c.c0 >= 2 * ATT_CHUNK; /* a whole chunk follows */
            scores(&c, s);
            for (int g = 0; g < c.ng; g++) {
                float cm = s[g][0];
                for (int i = 1; i < c.nk; i++)
                    cm = s[g][i] > cm ? s[g][i] : cm;
                if (cm > m[g]) {
                    const float corr = expf(m[g] - cm);
                    l[g] *= corr;
                    for (int d = 0; d < hd; d++)
                        acc[g][d] *= corr;
                    m[g] = cm;
                }
                if (j->avx2) {
                    kern_cpu_exp_sub_avx2(s[g], c.nk, m[g]);
                } else {
                    for (int i = 0; i < c.nk; i++)
                        s[g][i] = expf(s[g][i] - m[g]);
                }
                for (int i = 0; i < c.nk; i++)
                    l[g] += s[g][i];
            }
            pv(&c, s, acc);
        }
        for (int g = 0; g < c.ng; g++) {
            float *o = j->out + ((size_t)t * kv->n_head + h0 + g) * hd;
            const float inv = 1.0f / l[g];
            for (int d = 0; d < hd; d++)
                o[d] = acc[g][d] * inv;
            if (rot)
                kern_kv_rotate(o, 1, hd);
        }
    }
}

static void att_worker(void *arg, int ith, int nth) {
    (void)ith;
    (void)nth;
    struct att_job *j = arg;
    for (;;) {
        int it = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (it >= j->n_items)
            return;
        att_item(j, it);
    }
}

void kern_attention(struct kern_pool *p, float *out, const float *q, int n_tok, int pos0,
                    const struct kern_kv *kv) {
    assert(kv->n_kv_head > 0 && kv->n_head % kv->n_kv_head == 0);
    assert(kv->head_dim > 0 && kv->head_dim <= ATT_MAX_HDIM);
    if (n_tok <= 0)
        return;
    const enum kern_isa isa = kern_isa();
    struct att_job j = {
        .out = out,
        .q = q,
        .kv = kv,
        .pos0 = pos0,
        .n_items = n_tok * kv->n_kv_head,
        .scale = 1.0f / sqrtf((float)kv->head_dim),
        .avx2 = isa >= KERN_ISA_AVX2,
        .avx512 = isa >= KERN_ISA_AVX512 && kern_cpu_att_avx512_takes(kv->head_dim),
    };
    /* a small problem runs on the caller alone (see MM_SERIAL_BYTES in
     * matmul.c): (keys seen) x heads x head_dim multiply-adds below ~64k
     * take less time than waking a worker */
    size_t keys = (size_t)(pos0 + n_tok);
    if (kv->window > 0 && keys > (size_t)kv->window)
        keys = (size_t)kv->window;
    size_t work = keys * (size_t)n_tok * (size_t)kv->n_head * (size_t)kv->head_dim;
    if (work < (64u << 10))
        att_worker(&j, 0, 1);
    else
        kern_pool_run(p, att_worker, &j);
}
