/* kcu_elementwise.cu - the memory-bound small ops of the forward pass:
 * embedding lookup, RMSNorm (optionally gathering rows), f32 -> f16/bf16
 * rounding for the half-precision GEMMs, SwiGLU and the residual add.
 *
 * Each matches its CPU reference in kernels/cpu/ expression for expression,
 * so the only differences are the order of RMSNorm's sum of squares (done in
 * double, so that order does not show in the f32 result in practice) and the
 * last-ulp differences of CUDA's expf against glibc's in SwiGLU. Products
 * that the CPU rounds separately are written with __fmul_rn so that nvcc
 * does not contract them into FMAs. Grid-stride loops over size_t counts;
 * one block per row where a row needs a reduction.
 */
#include "kernels/cuda/kcu_util.cuh"

#define EW_THREADS   256 /* elementwise blocks: 8 warps, the usual sweet spot for streaming */
#define NORM_THREADS 256 /* RMSNorm: one block per row of n_embd (2k-8k) floats */

/* ---- embedding ---- */

template <typename T> __device__ __forceinline__ float embed_ld(const T *row, int j);
template <> __device__ __forceinline__ float embed_ld<float>(const float *row, int j) {
    return __ldg(row + j);
}
template <> __device__ __forceinline__ float embed_ld<__half>(const __half *row, int j) {
    return __half2float(row[j]);
}
template <>
__device__ __forceinline__ float embed_ld<__nv_bfloat16>(const __nv_bfloat16 *row, int j) {
    return kcu_bf2f(__bfloat16_as_ushort(row[j]));
}

/* Block i copies row tokens[i] of the table into x[i]. */
template <typename T>
__global__ void embed_kernel(float *x, const int32_t *tokens, const T *table, int n_embd) {
    const size_t i = blockIdx.x;
    const T *row = table + (size_t)__ldg(tokens + i) * (size_t)n_embd;
    float *o = x + i * (size_t)n_embd;
    for (int j = threadIdx.x; j < n_embd; j += blockDim.x)
        o[j] = embed_ld<T>(row, j);
}

/* kern_cuda.h's contract. tokens must lie in [0, n_vocab) (not checked:
 * the table's height is not an argument). -EINVAL for NULL pointers, n_tok
 * < 0, n_embd <= 0 or an unknown type; n_tok == 0 launches nothing. */
extern "C" int kcu_embed(kcu_stream s, float *x, const int32_t *tokens, int n_tok,
                         const void *table, enum kcu_type t, int n_embd) {
    if (!x || !tokens || !table || n_tok < 0 || n_embd <= 0)
        return -EINVAL;
    if (n_tok == 0)
        return 0;
    const unsigned threads = n_embd >= 1024 ? 256 : 128;
    switch (t) {
    case KCU_F32:
        embed_kernel<float><<<n_tok, threads, 0, s>>>(x, tokens, (const float *)table, n_embd);
        break;
    case KCU_F16:
        embed_kernel<__half><<<n_tok, threads, 0, s>>>(x, tokens, (const __half *)table, n_embd);
        break;
    case KCU_BF16:
        embed_kernel<__nv_bfloat16>
            <<<n_tok, threads, 0, s>>>(x, tokens, (const __nv_bfloat16 *)table, n_embd);
        break;
    default:
        return -EINVAL;
    }
    return kcu_check("kcu_embed");
}

/* ---- RMSNorm ---- */

/* Block i: y[i] = x[src] * (1/sqrtf(mean + eps)) * w, src = rows ? rows[i] : i.
 * Squares are rounded to f32 and summed in double (as kern_rmsnorm); every
 * thread reads the row before any thread writes, so y == x is safe. */
__global__ void __launch_bounds__(NORM_THREADS)
    rmsnorm_kernel(float *y, const float *x, const int32_t *rows, const float *w, int n,
                   float eps) {
    __shared__ double part[NORM_THREADS / 32];
    __shared__ float scale_s;
    const size_t i = blockIdx.x;
    const size_t src = rows ? (size_t)__ldg(rows + i) : i;
    const float *xr = x + src * (size_t)n;
    double sum = 0.0;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        const float v = xr[j];
        sum += (double)__fmul_rn(v, v);
    }
    sum = kcu_warp_sum_d(sum);
    if ((threadIdx.x & 31) == 0)
        part[threadIdx.x >> 5] = sum;
    __syncthreads();
    if (threadIdx.x == 0) {
        double t = 0.0;
        for (unsigned k = 0; k < blockDim.x / 32; k++)
            t += part[k];
        const float mean = (float)(t / n);
        scale_s = 1.0f / sqrtf(mean + eps);
    }
    __syncthreads();
    const float scale = scale_s;
    float *yr = y + i * (size_t)n;
    for (int j = threadIdx.x; j < n; j += blockDim.x)
        yr[j] = __fmul_rn(__fmul_rn(xr[j], scale), __ldg(w + j));
}

/* kern_cuda.h's contract. -EINVAL for NULL y/x/w, n_rows < 0, n <= 0, eps
 * negative or NaN. rows (optional) holds n_rows indices into x. */
extern "C" int kcu_rmsnorm(kcu_stream s, float *y, const float *x, const int32_t *rows,
                           const float *w, int n_rows, int n, float eps) {
    if (!y || !x || !w || n_rows < 0 || n <= 0 || !(eps >= 0.0f))
        return -EINVAL;
    if (n_rows == 0)
        return 0;
    rmsnorm_kernel<<<n_rows, NORM_THREADS, 0, s>>>(y, x, rows, w, n, eps);
    return kcu_check("kcu_rmsnorm");
}

/* ---- f32 -> f16 / bf16 ---- */

__global__ void to_f16_kernel(uint16_t *dst, const float *src, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = kcu_f2h(src[i]);
}

__global__ void to_bf16_kernel(__nv_bfloat16 *dst, const float *src, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __float2bfloat16_rn(src[i]);
}

/* kern_cuda.h's contract; a NaN stays a NaN (its payload may differ from
 * kern_f32_to_f16's). -EINVAL for NULL pointers or t == KCU_F32. */
extern "C" int kcu_to_half(kcu_stream s, void *dst, enum kcu_type t, const float *src, size_t n) {
    if (!dst || !src || (t != KCU_F16 && t != KCU_BF16))
        return -EINVAL;
    if (n == 0)
        return 0;
    const unsigned g = kcu_grid_1d(n, EW_THREADS);
    if (t == KCU_F16)
        to_f16_kernel<<<g, EW_THREADS, 0, s>>>((uint16_t *)dst, src, n);
    else
        to_bf16_kernel<<<g, EW_THREADS, 0, s>>>((__nv_bfloat16 *)dst, src, n);
    return kcu_check("kcu_to_half");
}

/* ---- SwiGLU and add ---- */

__global__ void swiglu_kernel(float *y, const float *gate, const float *up, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const float g = gate[i];
        y[i] = __fmul_rn(g / (1.0f + expf(-g)), up[i]);
    }
}

/* kern_cuda.h's contract. -EINVAL for NULL pointers. */
extern "C" int kcu_swiglu(kcu_stream s, float *y, const float *gate, const float *up, size_t n) {
    if (!y || !gate || !up)
        return -EINVAL;
    if (n == 0)
        return 0;
    swiglu_kernel<<<kcu_grid_1d(n, EW_THREADS), EW_THREADS, 0, s>>>(y, gate, up, n);
    return kcu_check("kcu_swiglu");
}

__global__ void add_kernel(float *x, const float *y, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] += y[i];
}

/* kern_cuda.h's contract. -EINVAL for NULL pointers. */
extern "C" int kcu_add(kcu_stream s, float *x, const float *y, size_t n) {
    if (!x || !y)
        return -EINVAL;
    if (n == 0)
        return 0;
    add_kernel<<<kcu_grid_1d(n, EW_THREADS), EW_THREADS, 0, s>>>(x, y, n);
    return kcu_check("kcu_add");
}
