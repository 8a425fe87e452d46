/* kcu_kvq.cuh - the quantized KV row types on the device: element readers
 * for attention, the E4M3 conversions, and the block-cooperative Hadamard
 * transform of the Q4_0 cache. Shared by kcu_kv_quant.cu (the store) and
 * kcu_attention.cu (the reads).
 *
 * Layouts are kern.h's, byte for byte (a KV row is one token's K or V of one
 * layer, [n_head_kv][head_dim] values, rows written by kern_kv_store and by
 * kcu_kv_store are interchangeable, so a page moves between the GPU, the
 * host tier and NVMe as plain bytes):
 *  Q8_0  GGUF block_q8_0 {f16 d; int8 qs[32]} (34 B) over the whole row;
 *  Q4_0  GGUF block_q4_0 {f16 d; uint8 qs[16]} (18 B) over the whole row
 *        after the per-head block-diagonal Walsh-Hadamard rotation (QuaRot,
 *        Ashkboos et al. 2024, arXiv:2404.00456); element j < 16 of a block
 *        is qs[j] & 15, element j >= 16 is qs[j - 16] >> 4, minus 8;
 *  FP8   per head {f32 s; uint8 e4m3[head_dim]} (OCP 8-bit Floating Point
 *        Specification (OFP8) rev. 1.0, 2023, E4M3: bias 7, no infinities,
 *        largest finite 448, 0x7F/0xFF NaN).
 * Rows start anywhere (a block's d may sit at an odd address, an FP8 head's
 * scale at any address), so every multi-byte field is read byte by byte.
 *
 * The readers give the values kern_attention computes with, bit for bit:
 * d * q (exact in f32: an 11-bit significand times a 4- or 8-bit integer)
 * and e4m3 * s (one rounding; the CPU's (e4m3 / 256) * (s * 256) is the
 * same real number rounded once).
 */
#ifndef LLMD_KCU_KVQ_CUH
#define LLMD_KCU_KVQ_CUH

#include <cuda_fp8.h>

#include "kernels/cuda/kcu_util.cuh"

#define KCU_QK       32 /* elements per Q8_0/Q4_0 block (ggml's QK8_0, QK4_0) */
#define KCU_Q8_BYTES 34 /* sizeof(block_q8_0) */
#define KCU_Q4_BYTES 18 /* sizeof(block_q4_0) */
#define KCU_FP8_MAX  448.0f

/* Tag types of the quantized caches, the T of the attention templates next
 * to float and uint16_t (f16 bits). */
struct kcu_q8_0_t {};
struct kcu_q4_0_t {};
struct kcu_fp8_t {};

__device__ __forceinline__ uint32_t kcu_ld_u8(const char *p) {
    return __ldg(reinterpret_cast<const unsigned char *>(p));
}

/* A little-endian u16/f32 at any address (read-only path). */
__device__ __forceinline__ uint16_t kcu_ld_u16(const char *p) {
    return (uint16_t)(kcu_ld_u8(p) | kcu_ld_u8(p + 1) << 8);
}
__device__ __forceinline__ float kcu_ld_f32(const char *p) {
    return __uint_as_float(kcu_ld_u8(p) | kcu_ld_u8(p + 1) << 8 | kcu_ld_u8(p + 2) << 16 |
                           kcu_ld_u8(p + 3) << 24);
}

/* f32 -> E4M3 byte, round to nearest even, saturating at +-448, as
 * kern_cpu_fp8_from_f32 (the reference): on sm_89+ the native
 * cvt.rn.satfinite.e4m3x2.f32 (cuda_fp8.h), elsewhere cuda_fp8.h's software
 * conversion with the same rounding. The one case the two rules treat
 * differently is NaN: SATFINITE keeps it (0x7F), the CPU writes the largest
 * finite value with the NaN's sign, so it is mapped here first. */
__device__ __forceinline__ uint8_t kcu_f2fp8(float x) {
    if (isnan(x))
        return (uint8_t)((__float_as_uint(x) >> 24 & 0x80u) | 0x7Eu);
    return (uint8_t)__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
}

/* E4M3 byte -> f32, exact (native cvt on sm_89+). Never sees a NaN byte:
 * the stores do not write one. */
__device__ __forceinline__ float kcu_fp82f(uint32_t b) {
    const __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)b, __NV_E4M3);
    return __half2float(__half(h));
}

/* Element reader of one kv head in a KV row of type T: rd(kvh, D) once per
 * thread, then ld(row, d) = element d of head kvh of the row at `row` (the
 * layer's K or V of one token, not offset by the head). VEC: the 16-byte
 * vector loads of kcu_kv_ldv apply (f32 and f16 only). */
template <typename T> struct kcu_kv_rd {
    static constexpr bool VEC = true;
    size_t hoff; /* bytes from the row to the head */
    __device__ kcu_kv_rd(int kvh, int D) : hoff((size_t)kvh * D * sizeof(T)) {
    }
    __device__ __forceinline__ const T *head(const char *row) const {
        return reinterpret_cast<const T *>(row + hoff);
    }
    __device__ __forceinline__ float ld(const char *row, int d) const {
        return kcu_kv_ld(head(row), d);
    }
};

template <> struct kcu_kv_rd<kcu_q8_0_t> {
    static constexpr bool VEC = false;
    int e0; /* the head's first element in the row */
    __device__ kcu_kv_rd(int kvh, int D) : e0(kvh * D) {
    }
    __device__ __forceinline__ float ld(const char *row, int d) const {
        const int i = e0 + d;
        const char *b = row + (size_t)(i / KCU_QK) * KCU_Q8_BYTES;
        const int8_t q = (int8_t)kcu_ld_u8(b + 2 + i % KCU_QK);
        return (float)q * kcu_h2f(kcu_ld_u16(b));
    }
};

template <> struct kcu_kv_rd<kcu_q4_0_t> {
    static constexpr bool VEC = false;
    int e0;
    __device__ kcu_kv_rd(int kvh, int D) : e0(kvh * D) {
    }
    __device__ __forceinline__ float ld(const char *row, int d) const {
        const int i = e0 + d, j = i % KCU_QK;
        const char *b = row + (size_t)(i / KCU_QK) * KCU_Q4_BYTES;
        const uint32_t x = kcu_ld_u8(b + 2 + (j & 15));
        return (float)((int)(j < 16 ? x & 15u : x >> 4) - 8) * kcu_h2f(kcu_ld_u16(b));
    }
};

template <> struct kcu_kv_rd<kcu_fp8_t> {
    static constexpr bool VEC = false;
    size_t hoff; /* the head's {f32 s; e4m3[D]} */
    __device__ kcu_kv_rd(int kvh, int D) : hoff((size_t)kvh * (4 + (size_t)D)) {
    }
    __device__ __forceinline__ float ld(const char *row, int d) const {
        const char *h = row + hoff;
        return __fmul_rn(kcu_fp82f(kcu_ld_u8(h + 4 + d)), kcu_ld_f32(h));
    }
};

/* Size of the Hadamard blocks for head_dim D, as kern_kv_rot_block: the
 * largest power of two dividing D, at most 256 (1: no rotation). */
__host__ __device__ static inline int kcu_rot_block(int D) {
    const int b = D & -D;
    return b > 256 ? 256 : b;
}

/* In place on n_vec vectors of shared memory (vector v at x + v*pitch, D
 * floats each): every vector times the block-diagonal matrix of normalized
 * Walsh-Hadamard blocks of size b (Sylvester order), i.e. kern_kv_rotate.
 * The butterflies run stage by stage in the CPU's order (stage len pairs
 * element i with i + len and writes a + c, a - c), so each value sees the
 * same additions, then the scale s = (float)(1 / sqrt((double)b)) (computed
 * on the host as the CPU does): the result is kern_kv_rotate's, bit for
 * bit. Block-cooperative: every thread of the block calls it, b uniform.
 * It always synchronizes first (the vectors' writes are visible after it,
 * even for b <= 1, which changes nothing), and last when it transforms. */
__device__ __forceinline__ void kcu_fwht_smem(float *x, int n_vec, int pitch, int D, int b,
                                              float s) {
    __syncthreads(); /* the vectors are written */
    if (b <= 1)
        return;
    const int half = b / 2, n_pairs = n_vec * (D / 2);
    for (int len = 1; len < b; len <<= 1) {
        for (int p = threadIdx.x; p < n_pairs; p += blockDim.x) {
            const int v = p / (D / 2), r = p - v * (D / 2); /* pair r of vector v */
            const int blk = r / half, k = r - blk * half;
            float *y = x + (size_t)v * pitch + blk * b + (k / len) * 2 * len + k % len;
            const float a = y[0], c = y[len];
            y[0] = __fadd_rn(a, c);
            y[len] = __fsub_rn(a, c);
        }
        __syncthreads();
    }
    for (int e = threadIdx.x; e < n_vec * D; e += blockDim.x) {
        const int v = e / D, d = e - v * D;
        x[(size_t)v * pitch + d] = __fmul_rn(x[(size_t)v * pitch + d], s);
    }
    __syncthreads();
}

/* The host's scale of kcu_fwht_smem for block b, as kv_fwht computes it. */
static inline float kcu_rot_scale(int b) {
    return (float)(1.0 / sqrt((double)b));
}

#endif /* LLMD_KCU_KVQ_CUH */
