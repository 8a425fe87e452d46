/* smp.c - token sampling (see smp.h for the chain and its sources).
 *
 * Cost: greedy is one pass over the vocabulary. Stochastic sampling sorts the
 * candidates that survive top-k (all of them when top-k is off) by
 * probability, O(V log V) per token; for V = 32k that is ~1 ms at worst, well
 * under a decode step of a real model, so no partial-sort trick is needed yet.
 * A request with a logit_bias or a penalty adds one copy of the row and one
 * pass over it (smp_logits), and 5 bytes a vocabulary entry of counts.
 */
#include "engine/model/smp.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "mem.h"

struct smp_cand {
    float p;
    int32_t id;
};

struct smp {
    struct smp_params p;
    uint32_t n_vocab;
    uint64_t rng[4];
    struct smp_cand *cand; /* [n_vocab] scratch */
    /* logit processing (NULL when off) */
    bool penalize;     /* a penalty is on */
    uint32_t *count;   /* [n_vocab] each token's generated count */
    uint8_t *seen;     /* [n_vocab] 1: in the prompt or generated (repetition) */
    int32_t *bias_ids; /* [n_bias] */
    float *bias;       /* [n_bias] */
    float *row;        /* [n_vocab] the processed logits */
};

struct smp_params smp_params_default(void) {
    return (struct smp_params){
        .temperature = 0.0f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f, .seed = 0};
}

/* splitmix64, to expand one seed into xoshiro's state (Vigna's advice). */
static uint64_t smp_splitmix(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t smp_rotl(uint64_t x, int k) {
    return (x << k) | (x >> (64 - k));
}

static uint64_t smp_next(uint64_t s[4]) {
    uint64_t r = smp_rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = smp_rotl(s[3], 45);
    return r;
}

/* Uniform in [0, 1) with 53 random bits. */
static double smp_uniform(uint64_t s[4]) {
    return (double)(smp_next(s) >> 11) * (1.0 / 9007199254740992.0);
}

int smp_create(const struct smp_params *p, uint32_t n_vocab, struct smp **out) {
    if (n_vocab == 0 || isnan(p->temperature) || !(p->top_p >= 0.0f && p->top_p <= 1.0f) ||
        !(p->min_p >= 0.0f && p->min_p <= 1.0f) || !isfinite(p->presence_penalty) ||
        !isfinite(p->frequency_penalty) || !isfinite(p->repetition_penalty) ||
        p->repetition_penalty < 0.0f || (p->n_bias && (!p->bias_ids || !p->bias)))
        return -EINVAL;
    for (uint32_t i = 0; i < p->n_bias; i++)
        if (p->bias_ids[i] < 0 || (uint32_t)p->bias_ids[i] >= n_vocab || !isfinite(p->bias[i]))
            return -EINVAL;
    struct smp *s = mem_calloc(MEM_SMP, 1, sizeof(*s));
    if (!s)
        return -ENOMEM;
    s->penalize = p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f ||
                  (p->repetition_penalty != 0.0f && p->repetition_penalty != 1.0f);
    s->cand = mem_alloc(MEM_SMP, (size_t)n_vocab * sizeof(*s->cand));
    bool ok = s->cand != NULL;
    if (ok && s->penalize) {
        s->count = mem_calloc(MEM_SMP, n_vocab, sizeof(*s->count));
        s->seen = mem_calloc(MEM_SMP, n_vocab, sizeof(*s->seen));
        ok = s->count && s->seen;
    }
    if (ok && p->n_bias) {
        s->bias_ids = mem_alloc(MEM_SMP, p->n_bias * sizeof(*s->bias_ids));
        s->bias = mem_alloc(MEM_SMP, p->n_bias * sizeof(*s->bias));
        ok = s->bias_ids && s->bias;
        if (ok) {
            memcpy(s->bias_ids, p->bias_ids, p->n_bias * sizeof(*s->bias_ids));
            memcpy(s->bias, p->bias, p->n_bias * sizeof(*s->bias));
        }
    }
    if (ok && (s->penalize || p->n_bias))
        ok = (s->row = mem_alloc(MEM_SMP, (size_t)n_vocab * sizeof(*s->row))) != NULL;
    if (!ok) {
        smp_destroy(s);
        return -ENOMEM;
    }
    s->p = *p;
    s->p.bias_ids = s->bias_ids; /* the copies: p's are the caller's */
    s->p.bias = s->bias;
    s->n_vocab = n_vocab;
    uint64_t x = p->seed;
    for (int i = 0; i < 4; i++)
        s->rng[i] = smp_splitmix(&x);
    *out = s;
    return 0;
}

void smp_destroy(struct smp *s) {
    if (!s)
        return;
    mem_free(s->cand);
    mem_free(s->count);
    mem_free(s->seen);
    mem_free(s->bias_ids);
    mem_free(s->bias);
    mem_free(s->row);
    mem_free(s);
}

void smp_prompt(struct smp *s, const int32_t *ids, uint32_t n) {
    for (uint32_t i = 0; s->penalize && i < n; i++)
        if (ids[i] >= 0 && (uint32_t)ids[i] < s->n_vocab)
            s->seen[ids[i]] = 1;
}

void smp_accept(struct smp *s, int32_t token) {
    if (!s->penalize || token < 0 || (uint32_t)token >= s->n_vocab)
        return;
    s->seen[token] = 1;
    s->count[token]++;
}

const float *smp_logits(struct smp *s, const float *logits) {
    if (!s->row)
        return logits;
    const struct smp_params *p = &s->p;
    memcpy(s->row, logits, (size_t)s->n_vocab * sizeof(*s->row));
    for (uint32_t i = 0; i < p->n_bias; i++)
        s->row[p->bias_ids[i]] += p->bias[i];
    float rep = p->repetition_penalty;
    bool use_rep = rep != 0.0f && rep != 1.0f;
    for (uint32_t v = 0; s->penalize && v < s->n_vocab; v++) {
        float x = s->row[v];
        if (use_rep && s->seen[v])
            x = x > 0.0f ? x / rep : x * rep;
        if (s->count[v])
            x -= (float)s->count[v] * p->frequency_penalty + p->presence_penalty;
        s->row[v] = x;
    }
    return s->row;
}

int32_t smp_argmax(const float *x, uint32_t n) {
    int32_t best = 0;
    float bv = -INFINITY;
    int found = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (isnan(x[i]))
            continue;
        if (!found || x[i] > bv) {
            bv = x[i];
            best = (int32_t)i;
            found = 1;
        }
    }
    return best;
}

static int smp_cmp_desc(const void *a, const void *b) {
    const struct smp_cand *x = a, *y = b;
    if (x->p != y->p)
        return x->p < y->p ? 1 : -1;
    return x->id - y->id; /* stable order for equal values: lower id first */
}

/* The distribution smp_sample() draws from: s->cand[0..n) holds the
 * surviving ids with unnormalised weights (sorted, largest first) and *sum
 * their total. Returns n; 0 when no logit is finite (the caller then takes
 * the argmax). Temperature > 0 only. */
static uint32_t smp_dist(struct smp *s, const float *logits, double *sum_out) {
    const struct smp_params *p = &s->p;
    uint32_t n = 0;
    for (uint32_t i = 0; i < s->n_vocab; i++)
        if (isfinite(logits[i]))
            s->cand[n++] = (struct smp_cand){.p = logits[i] / p->temperature, .id = (int32_t)i};
    if (n == 0)
        return 0;
    qsort(s->cand, n, sizeof(*s->cand), smp_cmp_desc);
    if (p->top_k > 0 && (uint32_t)p->top_k < n)
        n = (uint32_t)p->top_k;

    /* softmax over the survivors, in double for a stable cumulative sum */
    double max = s->cand[0].p, sum = 0.0;
    for (uint32_t i = 0; i < n; i++) {
        s->cand[i].p = (float)exp((double)s->cand[i].p - max);
        sum += s->cand[i].p;
    }
    if (p->top_p < 1.0f) {
        double cum = 0.0;
        uint32_t keep = n;
        for (uint32_t i = 0; i < n; i++) {
            cum += s->cand[i].p / sum;
            if (cum >= p->top_p) {
                keep = i + 1;
                break;
            }
        }
        n = keep;
    }
    if (p->min_p > 0.0f) {
        /* candidates are sorted: cand[0] holds the largest probability */
        float floor_p = s->cand[0].p * p->min_p;
        uint32_t keep = 1;
        while (keep < n && s->cand[keep].p >= floor_p)
            keep++;
        n = keep;
    }
    sum = 0.0;
    for (uint32_t i = 0; i < n; i++)
        sum += s->cand[i].p;
    *sum_out = sum;
    return n;
}

/* Draw from cand[0..n) by weight; their weights sum to `sum`. */
static int32_t smp_draw(struct smp *s, uint32_t n, double sum) {
    double r = smp_uniform(s->rng) * sum, cum = 0.0;
    for (uint32_t i = 0; i < n; i++) {
        cum += s->cand[i].p;
        if (r < cum)
            return s->cand[i].id;
    }
    return s->cand[n - 1].id; /* r at the very top: rounding */
}

/* smp_sample() of logits already processed by smp_logits(). */
static int32_t smp_sample_row(struct smp *s, const float *logits) {
    if (s->p.temperature <= 0.0f)
        return smp_argmax(logits, s->n_vocab);
    double sum;
    uint32_t n = smp_dist(s, logits, &sum);
    if (n == 0)
        return smp_argmax(logits, s->n_vocab);
    return smp_draw(s, n, sum);
}

int32_t smp_sample(struct smp *s, const float *logits) {
    return smp_sample_row(s, smp_logits(s, logits));
}

int32_t smp_verify(struct smp *s, const float *logits, int32_t draft, bool *accepted) {
    /* The token is drawn exactly as smp_sample() would draw it, with the
     * same single draw, and the draft is accepted when it is that token. */
    int32_t t = smp_sample_row(s, smp_logits(s, logits));
    *accepted = t == draft;
    return t;
}

double smp_logsumexp(const float *logits, uint32_t n) {
    double max = -INFINITY, sum = 0.0;
    for (uint32_t i = 0; i < n; i++)
        if (isfinite(logits[i]) && logits[i] > max)
            max = logits[i];
    for (uint32_t i = 0; i < n && isfinite(max); i++)
        if (isfinite(logits[i]))
            sum += exp((double)logits[i] - max);
    return isfinite(max) ? max + log(sum) : INFINITY;
}

void smp_logprobs(const float *logits, uint32_t n, int32_t chosen, uint32_t k, float floor,
                  float *chosen_lp, struct smp_logprob *top) {
    double lse = smp_logsumexp(logits, n);
#define SMP_LP(x)                                                                                  \
    (isfinite(x) && (double)(x)-lse > (double)floor ? (float)((double)(x)-lse) : floor)
    *chosen_lp = chosen >= 0 && (uint32_t)chosen < n ? SMP_LP(logits[chosen]) : floor;
    /* k largest by insertion: k <= 20 in practice, so O(n k) beats a sort */
    uint32_t m = 0;
    for (uint32_t i = 0; i < n && k > 0; i++) {
        float x = logits[i];
        if (isnan(x))
            continue;
        if (m == k && !(x > logits[top[m - 1].id]))
            continue; /* not larger than the smallest kept: ties keep the lower id */
        uint32_t j = m < k ? m++ : k - 1;
        while (j > 0 && x > logits[top[j - 1].id]) {
            top[j] = top[j - 1];
            j--;
        }
        top[j].id = (int32_t)i;
    }
    for (uint32_t j = 0; j < m; j++)
        top[j].lp = SMP_LP(logits[top[j].id]);
    for (uint32_t j = m; j < k; j++) /* fewer non-NaN logits than k */
        top[j] = (struct smp_logprob){.id = (int32_t)j, .lp = floor};
#undef SMP_LP
}
