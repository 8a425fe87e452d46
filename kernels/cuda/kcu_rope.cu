/* kcu_rope.cu - RoPE on q and k, and the store of k and v into the KV cache.
 *
 * One block per token. The angles follow kern_rope (ggml's rope cache):
 * theta_0 = pos, theta_{i+1} = theta_i * theta_scale in f32, where
 * theta_scale = powf(base, -2/n_rot) is computed once on the host with the
 * same libm call as the CPU, so the angles are bit-identical; one thread
 * runs the (serial, n_rot/2 <= 128 multiplies) recurrence into shared
 * memory, then the block takes cosf/sinf in parallel (CUDA's are within
 * 2 ulp of glibc's, hence the 1e-5 tolerance of the device test rather than
 * exact equality). Each rotated pair is written back to q/k and, for k,
 * straight into the cache; dims past n_rot are copied; v is converted and
 * stored. Rotations use __fmul_rn/__fsub_rn/__fadd_rn so nvcc does not fuse
 * them into FMAs the CPU does not do. f16 stores round to nearest even.
 * A quantized cache (Q8_0, Q4_0, FP8) needs the whole row before it can
 * write a block's scale: the kernel then only rotates (STORE false) and
 * kcu_kv_store (kcu_kv_quant.cu) quantizes the rotated k and v.
 */
#include <math.h>

#include "kernels/cuda/kcu_util.cuh"

#define ROPE_THREADS   128
#define ROPE_MAX_PAIRS 128 /* head_dim <= 256 (kern_cuda.h) */

template <typename T> __device__ __forceinline__ void rope_st(T *p, float v);
template <> __device__ __forceinline__ void rope_st<float>(float *p, float v) {
    *p = v;
}
template <> __device__ __forceinline__ void rope_st<uint16_t>(uint16_t *p, float v) {
    *p = kcu_f2h(v);
}

template <typename T, bool STORE>
__global__ void __launch_bounds__(ROPE_THREADS)
    rope_store_kernel(float *q, float *k, const float *v, const int32_t *pos,
                      const uint64_t *kv_tok, size_t k_off, size_t v_off, int n_head, int n_head_kv,
                      int head_dim, int n_rot, float theta_scale) {
    __shared__ float cs[ROPE_MAX_PAIRS], sn[ROPE_MAX_PAIRS];
    const size_t t = blockIdx.x;
    const int n_pairs = n_rot / 2;
    if (threadIdx.x == 0) {
        float theta = (float)__ldg(pos + t);
        for (int i = 0; i < n_pairs; i++) {
            cs[i] = theta; /* the angle for now; cos/sin below */
            theta = __fmul_rn(theta, theta_scale);
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < n_pairs; i += blockDim.x) {
        const float th = cs[i];
        sn[i] = sinf(th);
        cs[i] = cosf(th);
    }
    __syncthreads();

    const uintptr_t slot =
        (uintptr_t)__ldg(reinterpret_cast<const unsigned long long *>(kv_tok) + t);
    T *kc = reinterpret_cast<T *>(slot + k_off);
    T *vc = reinterpret_cast<T *>(slot + v_off);
    float *qt = q + t * (size_t)n_head * head_dim;
    float *kt = k + t * (size_t)n_head_kv * head_dim;
    const float *vt = v + t * (size_t)n_head_kv * head_dim;

    /* rotated pairs of every q head, then every k head */
    const int n_rows = n_head + n_head_kv;
    for (int e = threadIdx.x; e < n_rows * n_pairs; e += blockDim.x) {
        const int r = e / n_pairs, i = e - r * n_pairs;
        const bool is_k = r >= n_head;
        const int h = is_k ? r - n_head : r;
        float *x = (is_k ? kt : qt) + (size_t)h * head_dim + 2 * i;
        const float x0 = x[0], x1 = x[1], c = cs[i], s = sn[i];
        const float y0 = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
        const float y1 = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
        x[0] = y0;
        x[1] = y1;
        if (STORE && is_k) {
            T *o = kc + (size_t)h * head_dim + 2 * i;
            rope_st<T>(o, y0);
            rope_st<T>(o + 1, y1);
        }
    }
    if (!STORE)
        return;
    /* k dims past n_rot are stored as they are */
    const int tail = head_dim - n_rot;
    for (int e = threadIdx.x; e < n_head_kv * tail; e += blockDim.x) {
        const int h = e / tail, d = n_rot + (e - h * tail);
        rope_st<T>(kc + (size_t)h * head_dim + d, kt[(size_t)h * head_dim + d]);
    }
    for (int e = threadIdx.x; e < n_head_kv * head_dim; e += blockDim.x)
        rope_st<T>(vc + e, vt[e]);
}

/* kern_cuda.h's contract. -EINVAL for NULL pointers, n_tok < 0, n_head or
 * n_head_kv <= 0, head_dim outside 1..256, n_rot odd, negative or > head_dim,
 * rope_base <= 0 or NaN, an unknown kvt, k_off/v_off not a multiple of the
 * element size (f32, f16), and kcu_kv_store's refusals for a quantized kvt
 * (checked before the first launch). Every kv_tok[i] must be element-aligned
 * device memory with room for a row (kern_kv_row_bytes) at k_off and at
 * v_off. */
extern "C" int kcu_rope_store(kcu_stream s, float *q, float *k, const float *v, int n_tok,
                              const int32_t *pos, const uint64_t *kv_tok, size_t k_off,
                              size_t v_off, enum kcu_kv kvt, int n_head, int n_head_kv,
                              int head_dim, int n_rot, float rope_base) {
    if (!q || !k || !v || !pos || !kv_tok || n_tok < 0 || n_head <= 0 || n_head_kv <= 0 ||
        head_dim <= 0 || head_dim > 2 * ROPE_MAX_PAIRS || n_rot < 0 || n_rot % 2 ||
        n_rot > head_dim || !(rope_base > 0.0f) || (unsigned)kvt > (unsigned)KCU_KV_FP8)
        return -EINVAL;
    const bool quant = kvt != KCU_KV_F32 && kvt != KCU_KV_F16;
    const size_t esz = kvt == KCU_KV_F16 ? 2 : quant ? 1 : 4;
    if (k_off % esz || v_off % esz)
        return -EINVAL;
    /* kcu_kv_store's own refusal, before anything is launched */
    if (quant && kcu_kv_store(s, k, v, 0, kv_tok, k_off, v_off, kvt, n_head_kv, head_dim))
        return -EINVAL;
    if (n_tok == 0)
        return 0;
    /* as kern_rope: the host's powf, so the angles match the CPU bit for bit */
    const float theta_scale = n_rot ? powf(rope_base, -2.0f / (float)n_rot) : 1.0f;
    if (quant) {
        rope_store_kernel<float, false><<<n_tok, ROPE_THREADS, 0, s>>>(
            q, k, v, pos, kv_tok, k_off, v_off, n_head, n_head_kv, head_dim, n_rot, theta_scale);
        const int rc = kcu_check("kcu_rope_store");
        return rc ? rc
                  : kcu_kv_store(s, k, v, n_tok, kv_tok, k_off, v_off, kvt, n_head_kv, head_dim);
    }
    if (kvt == KCU_KV_F16)
        rope_store_kernel<uint16_t, true><<<n_tok, ROPE_THREADS, 0, s>>>(
            q, k, v, pos, kv_tok, k_off, v_off, n_head, n_head_kv, head_dim, n_rot, theta_scale);
    else
        rope_store_kernel<float, true><<<n_tok, ROPE_THREADS, 0, s>>>(
            q, k, v, pos, kv_tok, k_off, v_off, n_head, n_head_kv, head_dim, n_rot, theta_scale);
    return kcu_check("kcu_rope_store");
}
