/* attention.h - the chunk kernels' interface inside kern_attention
 * (attention.c: the driver, the portable and AVX2 kernels;
 * attention_avx512.c: the AVX512 level's for f16 and f32 caches).
 *
 * An item (query token, kv head) visits its keys in chunks of ATT_CHUNK:
 * a scores kernel fills s[g][i] = dot(q_g, K_{c0+i}) * scale for the ng
 * query heads of the group, the driver turns them into probabilities (the
 * online softmax), and a P.V kernel adds acc[g][:] += sum_i p[g][i] *
 * V_{c0+i}, each element's multiply-adds in key order. Internal to
 * kernels/cpu; not thread-shared (one chunk, one thread).
 */
#ifndef LLMD_KERN_ATTENTION_H
#define LLMD_KERN_ATTENTION_H

#include <stdbool.h>
#include <stddef.h>

#include "kernels/cpu/kern_cpu.h"

#define ATT_CHUNK    32                    /* keys per online-softmax step: amortizes the rescale */
#define ATT_GMAX     8                     /* query heads per pass over K/V; bounds the stack */
#define ATT_MAX_HDIM KERN_ATT_MAX_HEAD_DIM /* acc[ATT_GMAX][ATT_MAX_HDIM] on the stack: 8 KiB */

/* One chunk of one item: the ng heads' queries, the keys c0..c0+nk-1. */
struct att_chunk {
    const float *q;            /* [ng][hd] */
    const char *kbase, *vbase; /* KV row of token 0 (the layer's, all heads) */
    size_t stride;
    enum kern_kv_type type;
    int ng, hd, c0, nk;
    int e0;      /* the kv head's first element in the row (h * hd) */
    size_t hoff; /* FP8: the kv head's byte offset in the row */
    /* prefetch: the kv head's bytes in a row ([pf_off, pf_off + pf_len)),
     * and whether the next chunk is a whole one (its K is fetched ahead) */
    size_t pf_off, pf_len;
    bool pf_next;
    float scale;
};
typedef void (*att_scores_fn)(const struct att_chunk *c, float s[][ATT_CHUNK]);
typedef void (*att_pv_fn)(const struct att_chunk *c, const float s[][ATT_CHUNK],
                          float acc[][ATT_MAX_HDIM]);

/* Ask for the item's kv head in the row of key `key` from base (K or V):
 * each key is a token's stride away (kv.h: tens of KiB, a 4 KiB page of its
 * own), which the hardware prefetchers do not follow. A hint only: never
 * faults, and past the keys it is not issued. */
static inline __attribute__((always_inline)) void att_prefetch_row(const struct att_chunk *c,
                                                                   const char *base, int key) {
    const char *p = base + (size_t)key * c->stride + c->pf_off;
    for (size_t o = 0; o < c->pf_len; o += 64)
        __builtin_prefetch(p + o, 0, 3);
}

/* The AVX512 level's chunk kernels (attention_avx512.c): the AVX2
 * kernels' bits, twice the lanes; kern_isa() >= KERN_ISA_AVX512. They
 * read f16 and f32 chunks (attention.c dequantizes the others' into an
 * f32 scratch first); kern_cpu_att_avx512_takes says whether they take
 * head_dim (a multiple of 8). */
bool kern_cpu_att_avx512_takes(int head_dim);
void kern_cpu_att_scores_avx512(const struct att_chunk *c, float s[][ATT_CHUNK]);
void kern_cpu_att_pv_avx512(const struct att_chunk *c, const float s[][ATT_CHUNK],
                            float acc[][ATT_MAX_HDIM]);

#endif /* LLMD_KERN_ATTENTION_H */
