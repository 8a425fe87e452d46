/* kcu_kv_quant.cu - the store of K/V rows into a quantized KV cache (Q8_0,
 * Q4_0 with the Hadamard rotation, FP8 E4M3 with a per-head scale), in the
 * bytes kern_kv_store writes on the CPU (layouts: kernels/kern.h,
 * kernels/cuda/kcu_kvq.cuh).
 *
 * One block per (token, K or V). The row (n = n_head_kv * head_dim floats,
 * zero-padded to whole 32-element blocks) is staged in shared memory; for
 * Q4_0 each head is rotated there (kcu_fwht_smem: the CPU's butterflies in
 * the CPU's order, so the rotated values are kern_kv_rotate's bits). Then
 * one warp per 32-element block (Q8_0, Q4_0) or per head (FP8) reduces the
 * block's or head's magnitude and writes the scale and the codes:
 *  Q8_0  ggml's quantize_row_q8_0_ref: d = amax / 127, id = d ? 1/d : 0,
 *        q = roundf(x * id) (half away from zero, as C's roundf), d stored
 *        as f16 (RNE);
 *  Q4_0  ggml's quantize_row_q4_0_ref: max = the value of largest
 *        magnitude, the first one on a tie (the warp reduction breaks ties
 *        by the lower lane), d = max / -8, id = d ? 1/d : 0,
 *        q = min(15, (int8)(x * id + 8.5f));
 *  FP8   s = amax(head) / 448, is = s ? 1/s : 0, e4m3(x * is) (RNE,
 *        saturating: kcu_f2fp8).
 * The maxima are order-independent and every product and sum is written
 * with __fmul_rn/__fadd_rn (no FMA contraction, which the CPU's C17 build
 * does not do either); the divisions are IEEE (nvcc's default
 * -prec-div=true); so the bytes equal the CPU's for the same f32 input.
 *
 * A decode step stores 2 * n_layer rows a token, a few KiB next to the
 * matmuls' megabytes: the kernel favours being obviously the CPU's rule over
 * speed.
 */
#include <math.h>

#include "kernels/cuda/kcu_kvq.cuh"

#define KVQ_THREADS 256
/* Shared staging of one row: KCU_KV_MAX_ROW floats are 48 KiB, the default
 * limit without an opt-in: 96 heads of 128, far above any GQA model's K row
 * (Llama-3-70B: 8 x 128). */
static_assert(KCU_KV_MAX_ROW * sizeof(float) <= 48 * 1024,
              "the row fits the default shared memory");

/* Write v's 2 (f16) or 4 (f32) bytes little-endian at any address. */
__device__ __forceinline__ void kvq_st_u16(unsigned char *p, uint16_t v) {
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
}
__device__ __forceinline__ void kvq_st_f32(unsigned char *p, float f) {
    const uint32_t u = __float_as_uint(f);
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(u >> 8 * i);
}

/* Q8_0: one warp, block b of the staged row. */
__device__ __forceinline__ void kvq_q8_block(unsigned char *dst, const float *xs, int b, int lane) {
    const float x = xs[b * KCU_QK + lane];
    const float amax = kcu_warp_max(fabsf(x));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    unsigned char *blk = dst + (size_t)b * KCU_Q8_BYTES;
    /* a non-finite x gives -127, as the CPU's quantizer (kernels/cpu/quant.c) */
    const float r = roundf(__fmul_rn(x, id));
    blk[2 + lane] = (unsigned char)(int8_t)(r >= -127.0f && r <= 127.0f ? r : -127.0f);
    if (lane == 0)
        kvq_st_u16(blk, kcu_f2h(d));
}

/* Q4_0: one warp, block b of the staged (rotated) row. */
__device__ __forceinline__ void kvq_q4_block(unsigned char *dst, const float *xs, int b, int lane) {
    const float x = xs[b * KCU_QK + lane];
    /* the first lane of largest |x| (a NaN never wins: the CPU's `amax < |v|` skips it) */
    float a = isnan(x) ? -1.0f : fabsf(x);
    int who = lane;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float a2 = __shfl_xor_sync(KCU_FULL_MASK, a, o);
        const int w2 = __shfl_xor_sync(KCU_FULL_MASK, who, o);
        if (a2 > a || (a2 == a && w2 < who)) {
            a = a2;
            who = w2;
        }
    }
    const float xw = __shfl_sync(KCU_FULL_MASK, x, who);
    const float max = a > 0.0f ? xw : 0.0f; /* the CPU's max stays +0 when no |v| exceeds 0 */
    const float d = max / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const int xi = (int)(int8_t)__fadd_rn(__fmul_rn(x, id), 8.5f);
    const int q = xi < 15 ? xi : 15;
    const int q_hi = __shfl_down_sync(KCU_FULL_MASK, q, 16); /* element lane + 16 */
    unsigned char *blk = dst + (size_t)b * KCU_Q4_BYTES;
    if (lane < 16)
        blk[2 + lane] = (unsigned char)((unsigned)q | (unsigned)q_hi << 4);
    if (lane == 0)
        kvq_st_u16(blk, kcu_f2h(d));
}

/* FP8: one warp, head h of the staged row. */
__device__ __forceinline__ void kvq_fp8_head(unsigned char *dst, const float *xs, int h, int D,
                                             int lane) {
    const float *x = xs + (size_t)h * D;
    float amax = 0.0f;
    for (int e = lane; e < D; e += 32)
        amax = fmaxf(amax, fabsf(x[e]));
    amax = kcu_warp_max(amax);
    const float s = amax / KCU_FP8_MAX, is = s != 0.0f ? 1.0f / s : 0.0f;
    unsigned char *hd = dst + (size_t)h * (4 + (size_t)D);
    if (lane == 0)
        kvq_st_f32(hd, s);
    for (int e = lane; e < D; e += 32)
        hd[4 + e] = kcu_f2fp8(__fmul_rn(x[e], is));
}

template <int KT>
__global__ void __launch_bounds__(KVQ_THREADS)
    kvq_store_kernel(const float *k, const float *v, const uint64_t *kv_tok, size_t k_off,
                     size_t v_off, int n_head_kv, int D, int rot_b, float rot_s) {
    extern __shared__ float xs[]; /* [n_blocks * 32] */
    const size_t t = blockIdx.x;
    const bool is_v = blockIdx.y != 0;
    const int n = n_head_kv * D, nb = (n + KCU_QK - 1) / KCU_QK;
    const float *src = (is_v ? v : k) + t * (size_t)n;
    const uintptr_t slot =
        (uintptr_t)__ldg(reinterpret_cast<const unsigned long long *>(kv_tok) + t);
    unsigned char *dst = reinterpret_cast<unsigned char *>(slot + (is_v ? v_off : k_off));
    for (int e = threadIdx.x; e < nb * KCU_QK; e += blockDim.x)
        xs[e] = e < n ? src[e] : 0.0f;
    if (KT == KCU_KV_Q4_0)
        kcu_fwht_smem(xs, n_head_kv, D, D, rot_b, rot_s); /* synchronizes */
    else
        __syncthreads();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    if (KT == KCU_KV_FP8) {
        for (int h = warp; h < n_head_kv; h += nw)
            kvq_fp8_head(dst, xs, h, D, lane);
    } else {
        for (int b = warp; b < nb; b += nw) {
            if (KT == KCU_KV_Q8_0)
                kvq_q8_block(dst, xs, b, lane);
            else
                kvq_q4_block(dst, xs, b, lane);
        }
    }
}

/* kern_cuda.h's contract. -EINVAL for NULL pointers, n_tok < 0, n_head_kv
 * or head_dim <= 0, head_dim > 256, a row over KCU_KV_MAX_ROW values, or kvt
 * not one of the quantized types. One launch of n_tok x 2 blocks. */
extern "C" int kcu_kv_store(kcu_stream s, const float *k, const float *v, int n_tok,
                            const uint64_t *kv_tok, size_t k_off, size_t v_off, enum kcu_kv kvt,
                            int n_head_kv, int head_dim) {
    if (!k || !v || !kv_tok || n_tok < 0 || n_head_kv <= 0 || head_dim <= 0 || head_dim > 256 ||
        (size_t)n_head_kv * (size_t)head_dim > KCU_KV_MAX_ROW ||
        (kvt != KCU_KV_Q8_0 && kvt != KCU_KV_Q4_0 && kvt != KCU_KV_FP8))
        return -EINVAL;
    if (n_tok == 0)
        return 0;
    const int n = n_head_kv * head_dim, nb = (n + KCU_QK - 1) / KCU_QK;
    const size_t smem = (size_t)nb * KCU_QK * sizeof(float);
    const int rot_b = kcu_rot_block(head_dim);
    const float rot_s = kcu_rot_scale(rot_b);
    const dim3 grid((unsigned)n_tok, 2);
    switch (kvt) {
    case KCU_KV_Q8_0:
        kvq_store_kernel<KCU_KV_Q8_0><<<grid, KVQ_THREADS, smem, s>>>(
            k, v, kv_tok, k_off, v_off, n_head_kv, head_dim, rot_b, rot_s);
        break;
    case KCU_KV_Q4_0:
        kvq_store_kernel<KCU_KV_Q4_0><<<grid, KVQ_THREADS, smem, s>>>(
            k, v, kv_tok, k_off, v_off, n_head_kv, head_dim, rot_b, rot_s);
        break;
    default:
        kvq_store_kernel<KCU_KV_FP8><<<grid, KVQ_THREADS, smem, s>>>(
            k, v, kv_tok, k_off, v_off, n_head_kv, head_dim, rot_b, rot_s);
        break;
    }
    return kcu_check("kcu_kv_store");
}

__global__ void kvq_fp8_kernel(uint8_t *dst, const float *src, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = kcu_f2fp8(src[i]);
}

/* kern_cuda.h's contract: -EINVAL for NULL pointers with n > 0. */
extern "C" int kcu_fp8_from_f32(kcu_stream s, uint8_t *dst, const float *src, size_t n) {
    if (n && (!dst || !src))
        return -EINVAL;
    if (n == 0)
        return 0;
    kvq_fp8_kernel<<<kcu_grid_1d(n, 256), 256, 0, s>>>(dst, src, n);
    return kcu_check("kcu_fp8_from_f32");
}
