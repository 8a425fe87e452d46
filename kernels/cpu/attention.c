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
 * key order. Chunk boundaries depend only on the key index, so the result
 * depends only on the number of keys and head_dim (batch invariance), never
 * on n_tok, pos0 or the threads. One pass over K and V, no scratch.
 */
#include "kernels/cpu/kern_cpu.h"

#include <assert.h>
#include <immintrin.h>
#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>

#define ATT_CHUNK    32  /* keys per online-softmax step: amortizes the rescale */
#define ATT_GMAX     8   /* query heads per pass over K/V; bounds the stack */
#define ATT_MAX_HDIM 256 /* acc[ATT_GMAX][ATT_MAX_HDIM] on the stack: 8 KiB */

struct att_job {
    float *out;
    const float *q;
    const struct kern_kv *kv;
    int pos0, n_items;
    float scale;
    bool avx2;
    _Atomic int next;
};

/* ---- portable helpers ---- */

static float att_dot_scalar(const float *q, const void *k, enum kern_kv_type t, int n) {
    float s = 0.0f;
    if (t == KERN_KV_F16) {
        const uint16_t *kh = k;
        for (int i = 0; i < n; i++)
            s += q[i] * kern_f16_to_f32_1(kh[i]);
    } else {
        const float *kf = k;
        for (int i = 0; i < n; i++)
            s += q[i] * kf[i];
    }
    return s;
}

static void att_axpy_scalar(float *acc, float p, const void *v, enum kern_kv_type t, int n) {
    if (t == KERN_KV_F16) {
        const uint16_t *vh = v;
        for (int i = 0; i < n; i++)
            acc[i] += p * kern_f16_to_f32_1(vh[i]);
    } else {
        const float *vf = v;
        for (int i = 0; i < n; i++)
            acc[i] += p * vf[i];
    }
}

/* ---- AVX2 helpers (same structure: 8-lane FMA, fixed hsum, scalar tail) ---- */

static KERN_AVX2 __m256 att_load8(const void *p, enum kern_kv_type t, int i) {
    if (t == KERN_KV_F16)
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i)));
    return _mm256_loadu_ps((const float *)p + i);
}

static KERN_AVX2 float att_dot_avx2(const float *q, const void *k, enum kern_kv_type t, int n) {
    __m256 acc = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8)
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), att_load8(k, t, i), acc);
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    float r = _mm_cvtss_f32(s);
    for (; i < n; i++)
        r +=
            q[i] * (t == KERN_KV_F16 ? _cvtsh_ss(((const uint16_t *)k)[i]) : ((const float *)k)[i]);
    return r;
}

static KERN_AVX2 void att_axpy_avx2(float *acc, float p, const void *v, enum kern_kv_type t,
                                    int n) {
    const __m256 pv = _mm256_set1_ps(p);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(acc + i,
                         _mm256_fmadd_ps(pv, att_load8(v, t, i), _mm256_loadu_ps(acc + i)));
    for (; i < n; i++)
        acc[i] +=
            p * (t == KERN_KV_F16 ? _cvtsh_ss(((const uint16_t *)v)[i]) : ((const float *)v)[i]);
}

/* ---- one work item ---- */

static void att_item(const struct att_job *j, int item) {
    const struct kern_kv *kv = j->kv;
    const int hd = kv->head_dim, group = kv->n_head / kv->n_kv_head;
    const int t = item / kv->n_kv_head, kvh = item % kv->n_kv_head;
    const int n_keys = j->pos0 + t + 1;
    const size_t esz = kv->type == KERN_KV_F16 ? 2 : 4;
    const char *kbase = (const char *)kv->k + (size_t)kvh * hd * esz;
    const char *vbase = (const char *)kv->v + (size_t)kvh * hd * esz;
    _Alignas(32) float acc[ATT_GMAX][ATT_MAX_HDIM];
    float s[ATT_GMAX][ATT_CHUNK], m[ATT_GMAX], l[ATT_GMAX];

    for (int g0 = 0; g0 < group; g0 += ATT_GMAX) {
        const int ng = group - g0 < ATT_GMAX ? group - g0 : ATT_GMAX;
        const int h0 = kvh * group + g0;
        const float *q = j->q + ((size_t)t * kv->n_head + h0) * hd;
        for (int g = 0; g < ng; g++) {
            m[g] = -INFINITY;
            l[g] = 0.0f;
            for (int d = 0; d < hd; d++)
                acc[g][d] = 0.0f;
        }
        for (int c0 = 0; c0 < n_keys; c0 += ATT_CHUNK) {
            const int nk = n_keys - c0 < ATT_CHUNK ? n_keys - c0 : ATT_CHUNK;
            for (int i = 0; i < nk; i++) {
                const void *k = kbase + (size_t)(c0 + i) * kv->stride_bytes;
                for (int g = 0; g < ng; g++)
                    s[g][i] = (j->avx2 ? att_dot_avx2(q + g * hd, k, kv->type, hd)
                                       : att_dot_scalar(q + g * hd, k, kv->type, hd)) *
                              j->scale;
            }
            for (int g = 0; g < ng; g++) {
                float cm = s[g][0];
                for (int i = 1; i < nk; i++)
                    cm = s[g][i] > cm ? s[g][i] : cm;
                if (cm > m[g]) {
                    const float corr = expf(m[g] - cm);
                    l[g] *= corr;
                    for (int d = 0; d < hd; d++)
                        acc[g][d] *= corr;
                    m[g] = cm;
                }
                for (int i = 0; i < nk; i++) {
                    s[g][i] = expf(s[g][i] - m[g]);
                    l[g] += s[g][i];
                }
            }
            for (int i = 0; i < nk; i++) {
                const void *v = vbase + (size_t)(c0 + i) * kv->stride_bytes;
                for (int g = 0; g < ng; g++) {
                    if (j->avx2)
                        att_axpy_avx2(acc[g], s[g][i], v, kv->type, hd);
                    else
                        att_axpy_scalar(acc[g], s[g][i], v, kv->type, hd);
                }
            }
        }
        for (int g = 0; g < ng; g++) {
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
        .avx2 = kern_isa() == KERN_ISA_AVX2,
    };
    kern_pool_run(p, att_worker, &j);
}
