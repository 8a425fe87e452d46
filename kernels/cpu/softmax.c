/* softmax.c - in-place softmax, as ggml_vec_soft_max_f32.
 *
 * max first, then e_i = expf(x_i - max) with the sum in double, then a
 * multiply by (float)(1/sum). Left to right, the same on every ISA.
 */
#include "kernels/kern.h"

#include <math.h>

void kern_softmax(float *x, int n) {
    if (n <= 0)
        return;
    float max = x[0];
    for (int i = 1; i < n; i++)
        max = x[i] > max ? x[i] : max;
    double sum = 0.0;
    for (int i = 0; i < n; i++) {
        const float v = expf(x[i] - max);
        sum += (double)v;
        x[i] = v;
    }
    const float inv = (float)(1.0 / sum);
    for (int i = 0; i < n; i++)
        x[i] *= inv;
}
