/* rmsnorm.c - RMS normalization, as ggml_compute_forward_rms_norm + mul.
 *
 * The sum of squares is accumulated left to right in double (ggml_float),
 * the scale is 1/sqrtf(mean + eps) in float, and y = (x * scale) * w, so
 * the result matches ggml and is the same on every ISA. It is O(n) on a
 * vector that is in cache; vectorizing it is not worth a second order.
 */
#include "kernels/kern.h"

#include <math.h>

void kern_rmsnorm(float *y, const float *x, const float *w, int n, float eps) {
    double sum = 0.0;
    for (int i = 0; i < n; i++)
        sum += (double)(x[i] * x[i]);
    const float mean = (float)(sum / n);
    const float scale = 1.0f / sqrtf(mean + eps);
    for (int i = 0; i < n; i++)
        y[i] = (x[i] * scale) * w[i];
}
