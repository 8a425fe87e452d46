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

/* cos and sin of each pair's angle at pos (ggml's rope cache), divided by
 * its frequency factor when ff is given. */
static void rope_cache(float *c, float *s, int n_rot, int pos, float freq_base, const float *ff) {
    assert(n_rot % 2 == 0 && n_rot / 2 <= ROPE_MAX_PAIRS);
    const float theta_scale = powf(freq_base, -2.0f / (float)n_rot);
    float theta = (float)pos;
    for (int i = 0; i < n_rot / 2; i++) {
        float t = ff ? theta / ff[i] : theta;
        c[i] = cosf(t);
        s[i] = sinf(t);
        theta *= theta_scale;
    }
}

void kern_rope_ff(float *x, int n_head, int head_dim, int n_rot, int pos, float freq_base,
                  const float *freq_factors, bool neox) {
    assert(n_rot <= head_dim);
    float c[ROPE_MAX_PAIRS], s[ROPE_MAX_PAIRS];
    const int n_pairs = n_rot / 2;
    rope_cache(c, s, n_rot, pos, freq_base, freq_factors);
    /* pair i: dims (2i, 2i+1), or (i, i + n_pairs) in NEOX mode */
    const int step = neox ? 1 : 2, off = neox ? n_pairs : 1;
    for (int h = 0; h < n_head; h++) {
        float *v = x + (size_t)h * head_dim;
        for (int i = 0; i < n_pairs; i++) {
            float *a = v + i * step, *b = a + off;
            const float x0 = *a, x1 = *b;
            *a = x0 * c[i] - x1 * s[i];
            *b = x0 * s[i] + x1 * c[i];
        }
    }
}

void kern_rope_neox(float *x, int n_head, int head_dim, int n_rot, int pos, float freq_base) {
    kern_rope_ff(x, n_head, head_dim, n_rot, pos, freq_base, NULL, true);
}

void kern_rope(float *x, int n_head, int head_dim, int n_rot, int pos, float freq_base) {
    kern_rope_ff(x, n_head, head_dim, n_rot, pos, freq_base, NULL, false);
}
