/* swiglu.c - y = silu(gate) * up, silu(g) = g / (1 + expf(-g)).
 *
 * ggml's generic silu; its AVX2 path uses a polynomial exp that differs in
 * the last bits, which the references do not depend on. Scalar expf keeps
 * both ISAs identical; the FFN's matmuls cost ~1000x more than this loop.
 */
#include "kernels/kern.h"

#include <math.h>

void kern_swiglu(float *y, const float *gate, const float *up, int n) {
    for (int i = 0; i < n; i++) {
        const float g = gate[i];
        y[i] = g / (1.0f + expf(-g)) * up[i];
    }
}
