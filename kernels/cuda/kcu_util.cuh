/* kcu_util.cuh - what every file of kernels/cuda/ shares: the launch check,
 * grid sizing for elementwise loops, warp reductions, and the f16/bf16/f32
 * element loads of the KV cache and of weight tables.
 *
 * Error model (kern_cuda.h): arguments are checked on the host before any
 * launch (-EINVAL); a launch that fails is logged once with the CUDA error
 * string and mapped to -EIO. cudaGetLastError() also returns (and clears) an
 * earlier non-sticky error of the calling thread, which is then reported
 * against this launch: callers that ignore CUDA errors elsewhere see them here.
 */
#ifndef LLMD_KCU_UTIL_CUH
#define LLMD_KCU_UTIL_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <errno.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/kern_cuda.h"

extern "C" {
#include "log.h"
}

#define KCU_FULL_MASK 0xffffffffu

/* Check the launch just made (or a host-side CUDA call that returned e):
 * 0, or -EIO after logging "what: <cuda error>". */
static inline int kcu_check(const char *what) {
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess)
        return 0;
    LOG_ERROR("kcu", "%s: launch failed: %s (%s)", what, cudaGetErrorName(e),
              cudaGetErrorString(e));
    return -EIO;
}

static inline int kcu_check_call(cudaError_t e, const char *what) {
    if (e == cudaSuccess)
        return 0;
    (void)cudaGetLastError(); /* clear it: the failure is reported here */
    LOG_ERROR("kcu", "%s: %s (%s)", what, cudaGetErrorName(e), cudaGetErrorString(e));
    return -EIO;
}

/* Blocks of `threads` for a grid-stride loop over n elements: enough to fill
 * an H100/H200 (132 SMs x 2048 threads) several times over, never more than
 * the work, so the loop body runs once per element for typical sizes. */
static inline unsigned kcu_grid_1d(size_t n, unsigned threads) {
    size_t b = (n + threads - 1) / threads;
    const size_t cap = 65536; /* 16M threads of 256: 60x the resident threads */
    return (unsigned)(b < cap ? (b ? b : 1) : cap);
}

__device__ __forceinline__ float kcu_warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(KCU_FULL_MASK, v, o);
    return v;
}

__device__ __forceinline__ float kcu_warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(KCU_FULL_MASK, v, o));
    return v;
}

__device__ __forceinline__ double kcu_warp_sum_d(double v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(KCU_FULL_MASK, v, o);
    return v;
}

/* f16 bits -> f32, exact (cvt.f32.f16). */
__device__ __forceinline__ float kcu_h2f(uint16_t h) {
    return __half2float(__ushort_as_half(h));
}

/* bf16 bits -> f32, exact: the bits are the top half of the f32. */
__device__ __forceinline__ float kcu_bf2f(uint16_t b) {
    return __uint_as_float((uint32_t)b << 16);
}

/* f32 -> f16 bits, round to nearest even (cvt.rn.f16.f32): identical to
 * kern_f32_to_f16_1 for every non-NaN input (overflow to inf, subnormals
 * rounded); a NaN becomes a quiet NaN whose payload may differ. */
__device__ __forceinline__ uint16_t kcu_f2h(float f) {
    return __half_as_ushort(__float2half_rn(f));
}

/* Element i of a KV row of type T (uint16_t: f16 bits; float: f32) as f32. */
__device__ __forceinline__ float kcu_kv_ld(const uint16_t *p, int i) {
    return kcu_h2f(__ldg(p + i));
}
__device__ __forceinline__ float kcu_kv_ld(const float *p, int i) {
    return __ldg(p + i);
}

/* The f32 values of one 32-bit word of a KV row of type T. */
__device__ __forceinline__ void kcu_kv_word(uint32_t w, uint16_t, float *o) {
    const float2 f = __half22float2(*reinterpret_cast<const __half2 *>(&w));
    o[0] = f.x;
    o[1] = f.y;
}
__device__ __forceinline__ void kcu_kv_word(uint32_t w, float, float *o) {
    o[0] = __uint_as_float(w);
}

/* N consecutive elements of type T at p as f32, with the widest loads the
 * size allows: N*sizeof(T) must be 2, 4, 8, 16 or a multiple of 16, and p
 * aligned to min(16, N*sizeof(T)). Read-only path (__ldg): the KV cache and
 * the weights are not written while a kernel reads them. */
template <typename T, int N> __device__ __forceinline__ void kcu_kv_ldv(const T *p, float *o) {
    constexpr int B = N * (int)sizeof(T);
    constexpr int EW = 4 / (int)sizeof(T); /* elements per 32-bit word */
    if constexpr (B == 2) {
        o[0] = kcu_kv_ld(p, 0);
    } else if constexpr (B == 4) {
        kcu_kv_word(__ldg(reinterpret_cast<const uint32_t *>(p)), T(), o);
    } else if constexpr (B == 8) {
        const uint2 u = __ldg(reinterpret_cast<const uint2 *>(p));
        kcu_kv_word(u.x, T(), o);
        kcu_kv_word(u.y, T(), o + EW);
    } else {
        static_assert(B % 16 == 0, "vector loads of 16 bytes");
#pragma unroll
        for (int c = 0; c < B / 16; c++) {
            const uint4 u = __ldg(reinterpret_cast<const uint4 *>(p) + c);
            float *oc = o + c * 4 * EW;
            kcu_kv_word(u.x, T(), oc);
            kcu_kv_word(u.y, T(), oc + EW);
            kcu_kv_word(u.z, T(), oc + 2 * EW);
            kcu_kv_word(u.w, T(), oc + 3 * EW);
        }
    }
}

#endif /* LLMD_KCU_UTIL_CUH */
