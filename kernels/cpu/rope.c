/* rope.c - rotary position embedding, "normal" mode (llama2.c, ggml mode 0).
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

void kern_rope(float *x, int n_head, int head_dim, int n_rot, int pos, float freq_base) {
    assert(n_rot % 2 == 0 && n_rot <= head_dim && n_rot / 2 <= ROPE_MAX_PAIRS);
    float c[ROPE_MAX_PAIRS], s[ROPE_MAX_PAIRS];
    const int n_pairs = n_rot / 2;
    const float theta_scale = powf(freq_base, -2.0f / (float)n_rot);
    float theta = (float)pos;
    for (int i = 0; i < n_pairs; i++) {
        c[i] = cosf(theta);
        s[i] = sinf(theta);
        theta *= theta_scale;
    }
    for (int h = 0; h < n_head; h++) {
        float *v = x + (size_t)h * head_dim;
        for (int i = 0; i < n_pairs; i++) {
            const float x0 = v[2 * i], x1 = v[2 * i + 1];
            v[2 * i] = x0 * c[i] - x1 * s[i];
            v[2 * i + 1] = x0 * s[i] + x1 * c[i];
        }
    }
}
