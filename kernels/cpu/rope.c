/* rope.c - rotary position embedding, "normal" mode (llama2.c, ggml mode 0)
 * and NEOX mode (ggml mode 2: pair i is (i, i + n_rot/2)).
 *
 * Pairs (2i, 2i+1) of the first n_rot dims of every head rotate by
 * theta_i = pos * base^(-2i/n_rot). theta follows ggml's rope cache
 * (theta_0 = pos, theta_{i+1} = theta_i * powf(base, -2/n_rot), in float),
 * so positions match llama.cpp bit for bit; the cos/sin table is built once
 * per call and shared by all heads.
 */
#include "kernels/kern.h"

#include <assert.h>
#include <math.h>

#define ROPE_MAX_PAIRS 512

/* cos and sin of each pair's angle at pos (ggml's rope cache). */
static void rope_cache(float *c, float *s, int n_rot, int pos, float freq_base) {
    assert(n_rot % 2 == 0 && n_rot / 2 <= ROPE_MAX_PAIRS);
    const float theta_scale = powf(freq_base, -2.0f / (float)n_rot);
    float theta = (float)pos;
    for (int i = 0; i < n_rot / 2; i++) {
        c[i] = cosf(theta);
        s[i] = sinf(theta);
        theta *= theta_scale;
    }
}

void kern_rope_neox(float *x, int n_head, int head_dim, int n_rot, int pos, float freq_base) {
    assert(n_rot <= head_dim);
    float c[ROPE_MAX_PAIRS], s[ROPE_MAX_PAIRS];
    const int n_pairs = n_rot / 2;
    rope_cache(c, s, n_rot, pos, freq_base);
    for (int h = 0; h < n_head; h++) {
        float *v = x + (size_t)h * head_dim;
        for (int i = 0; i < n_pairs; i++) {
            const float x0 = v[i], x1 = v[i + n_pairs];
            v[i] = x0 * c[i] - x1 * s[i];
            v[i + n_pairs] = x0 * s[i] + x1 * c[i];
        }
    }
}

void kern_rope(float *x, int n_head, int head_dim, int n_rot, int pos, float freq_base) {
    assert(n_rot <= head_dim);
    float c[ROPE_MAX_PAIRS], s[ROPE_MAX_PAIRS];
    const int n_pairs = n_rot / 2;
    rope_cache(c, s, n_rot, pos, freq_base);
    for (int h = 0; h < n_head; h++) {
        float *v = x + (size_t)h * head_dim;
        for (int i = 0; i < n_pairs; i++) {
            const float x0 = v[2 * i], x1 = v[2 * i + 1];
            v[2 * i] = x0 * c[i] - x1 * s[i];
            v[2 * i + 1] = x0 * s[i] + x1 * c[i];
        }
    }
}
