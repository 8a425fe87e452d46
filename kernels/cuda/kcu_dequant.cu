/* kcu_dequant.cu - weights to f16 at load time: GGUF F32/F16/BF16/Q8_0/Q4_0
 * rows to f16, one thread per output element (a one-off pass at model load,
 * bandwidth-bound; simplicity over speed).
 *
 * Block formats are ggml's (ggml-common.h, block_q8_0 / block_q4_0, as
 * kern.h documents): Q8_0 = {f16 d; int8 qs[32]}, 34 B, w_j = qs[j] * d;
 * Q4_0 = {f16 d; uint8 qs[16]}, 18 B, w_j = ((qs[j] & 0xF) - 8) * d for
 * j < 16 and ((qs[j-16] >> 4) - 8) * d for j >= 16. The f32 value is formed
 * exactly as kern_dequant_row does (one f32 multiply) and then rounded to
 * f16 to nearest even, so the result is bit-identical to kern_dequant_row
 * followed by kern_f32_to_f16. Blocks are only 2-byte aligned: d and qs are
 * read as bytes / halves.
 */
#include "kernels/cuda/kcu_util.cuh"

#define DQ_THREADS 256
#define DQ_QK      32 /* weights per quantized block */
#define DQ_Q8_B    34 /* bytes of a Q8_0 block */
#define DQ_Q4_B    18 /* bytes of a Q4_0 block */

enum {
    DQ_F32 = 0,
    DQ_F16 = 1,
    DQ_Q4_0 = 2,
    DQ_Q8_0 = 8,
    DQ_BF16 = 30
}; /* kern.h enum kern_wtype */

template <int TYPE> __device__ __forceinline__ float dq_elem(const uint8_t *src, size_t i) {
    if constexpr (TYPE == DQ_F32) {
        return __ldg(reinterpret_cast<const float *>(src) + i);
    } else if constexpr (TYPE == DQ_F16) {
        return kcu_h2f(__ldg(reinterpret_cast<const uint16_t *>(src) + i));
    } else if constexpr (TYPE == DQ_BF16) {
        return kcu_bf2f(__ldg(reinterpret_cast<const uint16_t *>(src) + i));
    } else if constexpr (TYPE == DQ_Q8_0) {
        const uint8_t *b = src + (i / DQ_QK) * DQ_Q8_B;
        const float d = kcu_h2f(__ldg(reinterpret_cast<const uint16_t *>(b)));
        const int8_t q = (int8_t)__ldg(b + 2 + i % DQ_QK);
        return __fmul_rn((float)q, d);
    } else {
        static_assert(TYPE == DQ_Q4_0, "known types");
        const uint8_t *b = src + (i / DQ_QK) * DQ_Q4_B;
        const float d = kcu_h2f(__ldg(reinterpret_cast<const uint16_t *>(b)));
        const int j = (int)(i % DQ_QK);
        const uint8_t byte = __ldg(b + 2 + (j & 15));
        const int q = (j < 16 ? (byte & 0x0F) : (byte >> 4)) - 8;
        return __fmul_rn((float)q, d);
    }
}

template <int TYPE> __global__ void dequant_kernel(uint16_t *dst, const uint8_t *src, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        if constexpr (TYPE == DQ_F16)
            dst[i] = __ldg(reinterpret_cast<const uint16_t *>(src) + i); /* a copy, NaNs kept */
        else
            dst[i] = kcu_f2h(dq_elem<TYPE>(src, i));
    }
}

/* kern_cuda.h's contract; src_type may also be F32 (rounded to f16).
 * -EINVAL for another type, NULL pointers, or n not a multiple of 32 for
 * Q8_0/Q4_0. One launch. */
extern "C" int kcu_dequant_f16(kcu_stream s, uint16_t *dst, const void *src, int src_type,
                               size_t n) {
    if (!dst || !src)
        return -EINVAL;
    const bool quant = src_type == DQ_Q8_0 || src_type == DQ_Q4_0;
    if (quant && n % DQ_QK)
        return -EINVAL;
    if (n == 0)
        return src_type == DQ_F32 || src_type == DQ_F16 || src_type == DQ_BF16 || quant ? 0
                                                                                        : -EINVAL;
    const unsigned g = kcu_grid_1d(n, DQ_THREADS);
    const uint8_t *b = (const uint8_t *)src;
    switch (src_type) {
    case DQ_F32:
        dequant_kernel<DQ_F32><<<g, DQ_THREADS, 0, s>>>(dst, b, n);
        break;
    case DQ_F16:
        dequant_kernel<DQ_F16><<<g, DQ_THREADS, 0, s>>>(dst, b, n);
        break;
    case DQ_BF16:
        dequant_kernel<DQ_BF16><<<g, DQ_THREADS, 0, s>>>(dst, b, n);
        break;
    case DQ_Q8_0:
        dequant_kernel<DQ_Q8_0><<<g, DQ_THREADS, 0, s>>>(dst, b, n);
        break;
    case DQ_Q4_0:
        dequant_kernel<DQ_Q4_0><<<g, DQ_THREADS, 0, s>>>(dst, b, n);
        break;
    default:
        return -EINVAL;
    }
    return kcu_check("kcu_dequant_f16");
}
