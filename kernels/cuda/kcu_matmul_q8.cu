/* kcu_matmul_q8.cu - y = x . W^T with W in Q8_0 blocks, for decode-sized
 * token counts: a GEMV that streams the quantized weights once per group of
 * up to 8 tokens and never materializes f16/f32 weights.
 *
 * Block format: ggml's block_q8_0 (ggml-common.h): {f16 d; int8 qs[32]}, 34
 * bytes, w_j = qs[j] * d; a row of n_in weights is n_in/32 consecutive
 * blocks. Blocks are only 2-byte aligned, so a lane reads its block as 17
 * halfwords (the warp's 32 blocks are 1088 contiguous bytes, so the loads of
 * one instruction fall in a few cache lines and L1 serves the rest).
 *
 * Work split: one warp per output row, 8 rows per block; lane i takes blocks
 * i, i+32, ... of the row and, for each of the NT tokens of the group, sums
 * q_j * x_j over the block in f32 and adds d times that to its accumulator;
 * a warp reduction finishes the dot. x is f32 (not quantized, unlike
 * kern_matmul's CPU path), read as float4 through L1/L2: the NT rows of x are
 * shared by every warp. Memory-bound for NT <= 4 on an H100/H200 (about 4
 * warp instructions per 34-byte block per token); past 8 tokens a cuBLAS GEMM
 * over f16 weights is the better tool, so larger n_tok runs 8 tokens a pass.
 */
#include "kernels/cuda/kcu_util.cuh"

#define MQ_ROWS    8  /* output rows (warps) per block */
#define MQ_QK      32 /* weights per block */
#define MQ_BLK     34 /* bytes per block */
#define MQ_MAX_TOK 8  /* tokens per pass */

template <int NT>
__global__ void __launch_bounds__(MQ_ROWS * 32)
    matmul_q8_0_kernel(float *y, const float *x, const uint8_t *w, int n_in, int n_out, int n_tok) {
    const int lane = threadIdx.x & 31;
    const int o = blockIdx.x * MQ_ROWS + (threadIdx.x >> 5);
    if (o >= n_out)
        return;
    const int t0 = blockIdx.y * NT;
    const int nt = min(NT, n_tok - t0);
    const int nb = n_in / MQ_QK;
    const uint8_t *row = w + (size_t)o * nb * MQ_BLK;
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++)
        acc[t] = 0.0f;

    for (int b = lane; b < nb; b += 32) {
        const uint16_t *bp = reinterpret_cast<const uint16_t *>(row + (size_t)b * MQ_BLK);
        const float d = kcu_h2f(__ldg(bp));
        float wq[MQ_QK];
#pragma unroll
        for (int k = 0; k < MQ_QK / 2; k++) {
            const uint16_t h = __ldg(bp + 1 + k);
            wq[2 * k] = (float)(int8_t)(h & 0xff);
            wq[2 * k + 1] = (float)(int8_t)(h >> 8);
        }
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t < nt) {
                const float4 *xp =
                    reinterpret_cast<const float4 *>(x + (size_t)(t0 + t) * n_in + b * MQ_QK);
                float s = 0.0f;
#pragma unroll
                for (int k = 0; k < MQ_QK / 4; k++) {
                    const float4 xv = __ldg(xp + k);
                    s += wq[4 * k] * xv.x;
                    s += wq[4 * k + 1] * xv.y;
                    s += wq[4 * k + 2] * xv.z;
                    s += wq[4 * k + 3] * xv.w;
                }
                acc[t] += d * s;
            }
        }
    }
#pragma unroll
    for (int t = 0; t < NT; t++) {
        const float v = kcu_warp_sum(acc[t]);
        if (lane == 0 && t < nt)
            y[(size_t)(t0 + t) * n_out + o] = v;
    }
}

/* kern_cuda.h's contract. x must be 16-byte aligned (float4 loads; any
 * cudaMalloc'd buffer and any row of it are, since n_in is a multiple of
 * 32) and w 2-byte aligned. -EINVAL for those, NULL pointers, n_in <= 0 or
 * not a multiple of 32, n_out <= 0, n_tok < 0, or more than 65535 passes of
 * 8 tokens. One launch; y must not overlap x. */
extern "C" int kcu_matmul_q8_0(kcu_stream s, float *y, const float *x, const void *w, int n_in,
                               int n_out, int n_tok) {
    if (!y || !x || !w || n_in <= 0 || n_in % MQ_QK || n_out <= 0 || n_tok < 0 ||
        (uintptr_t)x % 16 || (uintptr_t)w % 2)
        return -EINVAL;
    if (n_tok == 0)
        return 0;
    const int nt = n_tok == 1 ? 1 : n_tok == 2 ? 2 : n_tok <= 4 ? 4 : MQ_MAX_TOK;
    const int passes = (n_tok + nt - 1) / nt;
    if (passes > 65535)
        return -EINVAL;
    const dim3 grid((n_out + MQ_ROWS - 1) / MQ_ROWS, passes);
    const uint8_t *wb = (const uint8_t *)w;
    switch (nt) {
    case 1:
        matmul_q8_0_kernel<1><<<grid, MQ_ROWS * 32, 0, s>>>(y, x, wb, n_in, n_out, n_tok);
        break;
    case 2:
        matmul_q8_0_kernel<2><<<grid, MQ_ROWS * 32, 0, s>>>(y, x, wb, n_in, n_out, n_tok);
        break;
    case 4:
        matmul_q8_0_kernel<4><<<grid, MQ_ROWS * 32, 0, s>>>(y, x, wb, n_in, n_out, n_tok);
        break;
    default:
        matmul_q8_0_kernel<MQ_MAX_TOK><<<grid, MQ_ROWS * 32, 0, s>>>(y, x, wb, n_in, n_out, n_tok);
        break;
    }
    return kcu_check("kcu_matmul_q8_0");
}
