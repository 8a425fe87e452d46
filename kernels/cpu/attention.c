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
 */
#include "kernels/cpu/kern_cpu.h"

#include <assert.h>
#include <immintrin.h>
#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>

#define ATT_CHUNK    32                    /* keys per online-softmax step: amortizes the rescale */
#define ATT_GMAX     8                     /* query heads per pass over K/V; bounds the stack */
#define ATT_MAX_HDIM KERN_ATT_MAX_HEAD_DIM /* acc[ATT_GMAX][ATT_MAX_HDIM] on the stack: 8 KiB */

struct att_job {
    float *out;
    const float *q;
    const struct kern_kv *kv;
    int pos0, n_items;
    float scale;
    bool avx2;
    _Atomic int next;
};

/* Chunk kernels: scores s[g][i] = dot(q_g, K_{c0+i}) * scale for the ng
 * heads of a group, and acc[g][:] += sum_i p[g][i] * V_{c0+i} in key order. */
struct att_chunk {
    const float *q; /* [ng][hd] */
    const char *kbase, *vbase;
    size_t stride;
    enum kern_kv_type type;
    int ng, hd, c0, nk;
    float scale;
};
typedef void (*att_scores_fn)(const struct att_chunk *c, float s[][ATT_CHUNK]);
typedef void (*att_pv_fn)(const struct att_chunk *c, const float s[][ATT_CHUNK],
                          float acc[][ATT_MAX_HDIM]);

static inline float att_kv_at(const void *p, enum kern_kv_type t, int i) {
    return t == KERN_KV_F16 ? kern_f16_to_f32_1(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

/* ---- portable: left-to-right dot, one key at a time ---- */

static void att_scores_scalar(const struct att_chunk *c, float s[][ATT_CHUNK]) {
    for (int i = 0; i < c->nk; i++) {
        const void *k = c->kbase + (size_t)(c->c0 + i) * c->stride;
        for (int g = 0; g < c->ng; g++) {
            const float *q = c->q + (size_t)g * c->hd;
            float d = 0.0f;
            for (int e = 0; e < c->hd; e++)
                d += q[e] * att_kv_at(k, c->type, e);
            s[g][i] = d * c->scale;
        }
    }
}

static void att_pv_scalar(const struct att_chunk *c, const float s[][ATT_CHUNK],
                          float acc[][ATT_MAX_HDIM]) {
    for (int i = 0; i < c->nk; i++) {
        const void *v = c->vbase + (size_t)(c->c0 + i) * c->stride;
        for (int g = 0; g < c->ng; g++)
            for (int e = 0; e < c->hd; e++)
                acc[g][e] += s[g][i] * att_kv_at(v, c->type, e);
    }
}

/* ---- AVX2: each dot is one 8-lane FMA chain over head_dim, a fixed hsum,
 * then the scalar tail; four keys run side by side only to hide the FMA
 * latency. P.V keeps 8 dims of every head in registers across the chunk;
 * per element the FMAs still go in key order. ---- */

#define AI __attribute__((always_inline)) inline

static KERN_AVX2 AI __m256 att_load8(const void *p, enum kern_kv_type t, int i) {
    if (t == KERN_KV_F16)
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i)));
    return _mm256_loadu_ps((const float *)p + i);
}

static KERN_AVX2 AI float att_hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static KERN_AVX2 AI void att_dots(const struct att_chunk *c, const float *q, int i0, const int N,
                                  float *out) {
    const void *k[4];
    __m256 acc[4];
#pragma GCC unroll 4
    for (int n = 0; n < N; n++) {
        k[n] = c->kbase + (size_t)(c->c0 + i0 + n) * c->stride;
        acc[n] = _mm256_setzero_ps();
    }
    int e = 0;
    for (; e + 8 <= c->hd; e += 8) {
        const __m256 qv = _mm256_loadu_ps(q + e);
#pragma GCC unroll 4
        for (int n = 0; n < N; n++)
            acc[n] = _mm256_fmadd_ps(qv, att_load8(k[n], c->type, e), acc[n]);
    }
#pragma GCC unroll 4
    for (int n = 0; n < N; n++) {
        float r = att_hsum8(acc[n]);
        for (int f = e; f < c->hd; f++)
            r += q[f] * (c->type == KERN_KV_F16 ? _cvtsh_ss(((const uint16_t *)k[n])[f])
                                                : ((const float *)k[n])[f]);
        out[n] = r * c->scale;
    }
}

static KERN_AVX2 void att_scores_avx2(const struct att_chunk *c, float s[][ATT_CHUNK]) {
    for (int g = 0; g < c->ng; g++) {
        const float *q = c->q + (size_t)g * c->hd;
        int i = 0;
        for (; i + 4 <= c->nk; i += 4)
            att_dots(c, q, i, 4, &s[g][i]);
        for (; i < c->nk; i++)
            att_dots(c, q, i, 1, &s[g][i]);
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

/* NG heads' worth of 8-dim accumulators stay in registers (NG constant). */
static KERN_AVX2 AI void att_pv_block(const struct att_chunk *c, const float s[][ATT_CHUNK],
                                      float acc[][ATT_MAX_HDIM], int e, const int NG) {
    __m256 a[ATT_GMAX];
#pragma GCC unroll 8
    for (int g = 0; g < NG; g++)
        a[g] = _mm256_loadu_ps(&acc[g][e]);
    for (int i = 0; i < c->nk; i++) {
        const __m256 v = att_load8(c->vbase + (size_t)(c->c0 + i) * c->stride, c->type, e);
#pragma GCC unroll 8
        for (int g = 0; g < NG; g++)
            a[g] = _mm256_fmadd_ps(_mm256_set1_ps(s[g][i]), v, a[g]);
    }
#pragma GCC unroll 8
    for (int g = 0; g < NG; g++)
        _mm256_storeu_ps(&acc[g][e], a[g]);
}

static KERN_AVX2 void att_pv_avx2(const struct att_chunk *c, const float s[][ATT_CHUNK],
                                  float acc[][ATT_MAX_HDIM]) {
    int e = 0;
    for (; e + 8 <= c->hd; e += 8) {
        switch (c->ng) {
        case 1:
            att_pv_block(c, s, acc, e, 1);
            break;
        case 2:
            att_pv_block(c, s, acc, e, 2);
            break;
        case 3:
            att_pv_block(c, s, acc, e, 3);
            break;
        case 4:
            att_pv_block(c, s, acc, e, 4);
            break;
        case 5:
            att_pv_block(c, s, acc, e, 5);
            break;
        case 6:
            att_pv_block(c, s, acc, e, 6);
            break;
        case 7:
            att_pv_block(c, s, acc, e, 7);
            break;
        default:
            att_pv_block(c, s, acc, e, 8);
            break;
        }
    }
    for (; e < c->hd; e++)
        for (int i = 0; i < c->nk; i++) {
            const void *v = c->vbase + (size_t)(c->c0 + i) * c->stride;
            const float ve = c->type == KERN_KV_F16 ? _cvtsh_ss(((const uint16_t *)v)[e])
                                                    : ((const float *)v)[e];
            for (int g = 0; g < c->ng; g++)
                acc[g][e] += s[g][i] * ve;
        }
}

/* ---- one work item ---- */

static void att_item(const struct att_job *j, int item) {
    const struct kern_kv *kv = j->kv;
    const int hd = kv->head_dim, group = kv->n_head / kv->n_kv_head;
    const int t = item / kv->n_kv_head, kvh = item % kv->n_kv_head;
    const int n_keys = j->pos0 + t + 1;
    const size_t esz = kv->type == KERN_KV_F16 ? 2 : 4;
    const att_scores_fn scores = j->avx2 ? att_scores_avx2 : att_scores_scalar;
    const att_pv_fn pv = j->avx2 ? att_pv_avx2 : att_pv_scalar;
    _Alignas(32) float acc[ATT_GMAX][ATT_MAX_HDIM];
    float s[ATT_GMAX][ATT_CHUNK], m[ATT_GMAX], l[ATT_GMAX];
    struct att_chunk c = {.kbase = (const char *)kv->k + (size_t)kvh * hd * esz,
                          .vbase = (const char *)kv->v + (size_t)kvh * hd * esz,
                          .stride = kv->stride_bytes,
                          .type = kv->type,
                          .hd = hd,
                          .scale = j->scale};

    for (int g0 = 0; g0 < group; g0 += ATT_GMAX) {
        const int h0 = kvh * group + g0;
        c.ng = group - g0 < ATT_GMAX ? group - g0 : ATT_GMAX;
        c.q = j->q + ((size_t)t * kv->n_head + h0) * hd;
        for (int g = 0; g < c.ng; g++) {
            m[g] = -INFINITY;
            l[g] = 0.0f;
            for (int d = 0; d < hd; d++)
                acc[g][d] = 0.0f;
        }
        for (c.c0 = 0; c.c0 < n_keys; c.c0 += ATT_CHUNK) {
            c.nk = n_keys - c.c0 < ATT_CHUNK ? n_keys - c.c0 : ATT_CHUNK;
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
    struct att_job j = {
        .out = out,
        .q = q,
        .kv = kv,
        .pos0 = pos0,
        .n_items = n_tok * kv->n_kv_head,
        .scale = 1.0f / sqrtf((float)kv->head_dim),
        .avx2 = kern_isa() >= KERN_ISA_AVX2,
    };
    /* a small problem runs on the caller alone (see MM_SERIAL_BYTES in
     * matmul.c): (keys seen) x heads x head_dim multiply-adds below ~64k
     * take less time than waking a worker */
    size_t work =
        (size_t)(pos0 + n_tok) * (size_t)n_tok * (size_t)kv->n_head * (size_t)kv->head_dim;
    if (work < (64u << 10))
        att_worker(&j, 0, 1);
    else
        kern_pool_run(p, att_worker, &j);
}
