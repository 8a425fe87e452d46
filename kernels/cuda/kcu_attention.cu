/* kcu_attention.cu - causal GQA attention over the token-major KV cache.
 *
 * KV addressing (DESIGN.md §2): key t of a sequence, kv head g, at
 * base + t*stride + k_off + g*head_dim*esz (V at v_off): each token's head
 * row is head_dim contiguous elements, rows of consecutive tokens are
 * `stride` bytes apart. Scores are dot(q, K_t) * (1/sqrtf(head_dim)), the
 * softmax is online (running max m, running sum l, the accumulator rescaled
 * by expf(m_old - m_new)) in f32, q stays f32 for an f16 cache: the numerics
 * of kern_attention, with a different summation order (agreement ~1e-6).
 *
 * Decode rows (a sequence with n_tok == 1): split-K flash-decoding (Dao,
 * Haziza, Massa, Sizov 2023, "Flash-Decoding for long-context inference").
 * The keys are cut into n_splits = min(ceil(n_keys / ATT_SPLIT_KEYS),
 * ATT_MAX_SPLITS) contiguous chunks; block (split, kv head, seq) computes the
 * partial (m, l, acc[head_dim]) of up to ATT_GMAX query heads that share the
 * kv head, so each K/V row is read once per block; a second kernel merges the
 * partials (out = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s). The split
 * count depends only on the sequence's own key count, so a row's result does
 * not depend on the rest of the batch. Inside a block, 4 warps take
 * interleaved sub-blocks of 32 keys: lane j computes the scores of key j for
 * every head of the group (its own K row, 16-byte loads; q broadcast from
 * shared memory), the warp updates (m, l) once per sub-block, then every lane
 * accumulates its head_dim/32 output dims over the 32 keys (V rows read
 * coalesced). The warps' partials are merged in shared memory before the one
 * write to the workspace.
 *
 * Prefill chunks (n_tok > 1): FlashAttention's tiling (Dao et al. 2022,
 * arXiv:2205.14135, Algorithm 1) without tensor cores: block (query tile of
 * ATT_BM tokens, head, seq) keeps Q in shared memory and streams K/V tiles of
 * ATT_BN keys through it, causal with the chunk's offset (query i at position
 * pos0+i sees keys 0..pos0+i). Four threads own one query row: each scores 8
 * keys of the tile, the row's max and sum are combined with two shuffles,
 * and each accumulates a quarter of the row's output dims. Plain f32 FMAs:
 * simple and exact enough; a tensor-core version is the obvious next step if
 * prefill attention shows in profiles.
 *
 * Quantized caches (Q8_0, Q4_0, FP8; kcu_kvq.cuh): the same kernels with T a
 * tag type whose reader (kcu_kv_rd<T>) dequantizes each element in
 * registers to the value kern_attention computes with, through the scalar
 * loads (a head may start inside a 32-element block, so no 16-byte path).
 * Q4_0 rows hold Hadamard-rotated heads (QuaRot, arXiv:2404.00456): the
 * decode and prefill kernels rotate q in shared memory after loading it, and
 * the outputs are rotated back (decode: in the combine kernel; prefill:
 * through shared memory before the write), kcu_fwht_smem being
 * kern_kv_rotate's butterflies. Tolerance against the CPU is then the f16
 * path's: the values are the same, only the summation order differs.
 * Unverified on a GPU until tests/device/run.sh has run (docs/kv-quant.md).
 */
#include <math.h>
#include <type_traits>

#include "kernels/cuda/kcu_kvq.cuh"

/* Decode: 256 keys per split keeps a split's K+V (128 KiB for 8 heads of 128
 * f16 dims) large against the per-block overhead (loading q, merging 4 warps,
 * writing (head_dim + 2) floats per head), while one sequence of 8k keys on 8
 * kv heads already yields 256 blocks, about two per SM of an H100/H200. The
 * cap bounds the workspace (n_seqs * n_head * 64 * (head_dim + 2) floats) and
 * the merge, and still gives 512 blocks at 32k keys and above. */
#define ATT_SPLIT_KEYS 256
#define ATT_MAX_SPLITS 64
#define ATT_WARPS      4 /* decode warps per block */
#define ATT_GMAX       8 /* query heads per decode block (more: several blocks per kv head) */
#define ATT_MAX_HDIM   256
/* Prefill tiles: 32 x 32 with 128 threads, 4 per query row. Shared memory is
 * Q and K tiles (padded rows), V tile and the probabilities: 54 KiB at
 * head_dim 128, 103 KiB at 256 (opted in with cudaFuncSetAttribute). */
#define ATT_BM         32
#define ATT_BN         32
#define ATT_PF_THREADS 128

struct att_args {
    size_t stride, k_off, v_off;
    int n_head, head_dim, group, n_hchunks;
    float scale;
    int rot_b;   /* Q4_0: Hadamard block of q and the output (1: none) */
    float rot_s; /* its scale, kcu_rot_scale(rot_b) */
};

/* Number of splits of a decode row with n_keys keys: >= 1, non-decreasing in
 * n_keys (kcu_attention_ws_bytes relies on it). */
__host__ __device__ static inline int att_n_splits(int n_keys) {
    const int n = (n_keys + ATT_SPLIT_KEYS - 1) / ATT_SPLIT_KEYS;
    return n < 1 ? 1 : (n > ATT_MAX_SPLITS ? ATT_MAX_SPLITS : n);
}

/* ---- decode: partials ----
 * T: uint16_t (f16 bits), float, or a quantized tag (kcu_kvq.cuh; VEC false). NDL: output dims per
 * lane (head_dim <= 32*NDL). VEC: head_dim == 32*NDL and every row 16-byte aligned, so K rows are
 * read in 16-byte chunks and each lane's NDL V dims in one load. GB: heads computed per block (>=
 * the heads this block owns; extra ones see a zero q and are dropped), so a group of 4 does not pay
 * for 8. */
template <typename T, int NDL, bool VEC, int GB>
__global__ void __launch_bounds__(ATT_WARPS * 32)
    att_decode_kernel(const float *q, const struct kcu_att_seq *seqs, struct att_args a,
                      float *ws_acc, float *ws_ml, int pitch) {
    constexpr int DP = 32 * NDL;
    __shared__ __align__(16) float q_s[GB][DP];
    __shared__ float acc_s[ATT_WARPS][GB][DP];
    __shared__ float m_s[ATT_WARPS][GB], l_s[ATT_WARPS][GB];

    const struct kcu_att_seq sq = seqs[blockIdx.z];
    if (sq.n_tok != 1)
        return;
    const int n_keys = sq.pos0 + 1;
    const int ns = att_n_splits(n_keys), split = blockIdx.x;
    if (split >= ns)
        return;
    const int D = a.head_dim;
    const int kvh = blockIdx.y / a.n_hchunks, g0 = (blockIdx.y % a.n_hchunks) * ATT_GMAX;
    const int G = min(GB, a.group - g0);
    const int h0 = kvh * a.group + g0;
    const int chunk = (n_keys + ns - 1) / ns;
    const int s0 = split * chunk, s1 = min(s0 + chunk, n_keys); /* may be empty */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

    const float *qr = q + ((size_t)sq.q_row * a.n_head + h0) * D;
    for (int e = threadIdx.x; e < GB * DP; e += blockDim.x) {
        const int g = e / DP, d = e - g * DP;
        q_s[g][d] = g < G && d < D ? qr[(size_t)g * D + d] : 0.0f;
    }
    if constexpr (std::is_same<T, kcu_q4_0_t>::value)
        kcu_fwht_smem(&q_s[0][0], GB, DP, D, a.rot_b, a.rot_s); /* synchronizes */
    else
        __syncthreads();

    const kcu_kv_rd<T> rd(kvh, D);
    const char *kb = (const char *)(uintptr_t)sq.base + a.k_off;
    const char *vb = (const char *)(uintptr_t)sq.base + a.v_off;
    float m[GB], l[GB], acc[GB][NDL];
#pragma unroll
    for (int g = 0; g < GB; g++) {
        m[g] = -INFINITY;
        l[g] = 0.0f;
#pragma unroll
        for (int i = 0; i < NDL; i++)
            acc[g][i] = 0.0f;
    }

    for (int t0 = s0 + warp * 32; t0 < s1; t0 += ATT_WARPS * 32) {
        const int nv = min(32, s1 - t0);
        /* lanes past the end read the last valid key (in bounds) and are masked */
        const char *krow = kb + (size_t)(t0 + min(lane, nv - 1)) * a.stride;
        float s[GB];
#pragma unroll
        for (int g = 0; g < GB; g++)
            s[g] = 0.0f;
        if constexpr (VEC) {
            constexpr int EPC = 16 / (int)sizeof(T); /* elements per 16-byte chunk */
            const T *kr = rd.head(krow);
#pragma unroll 4
            for (int c = 0; c < DP / EPC; c++) {
                float kv[EPC];
                kcu_kv_ldv<T, EPC>(kr + c * EPC, kv);
#pragma unroll
                for (int g = 0; g < GB; g++) {
                    const float4 *qp = reinterpret_cast<const float4 *>(&q_s[g][c * EPC]);
#pragma unroll
                    for (int e4 = 0; e4 < EPC / 4; e4++) {
                        const float4 qq = qp[e4];
                        s[g] += qq.x * kv[4 * e4];
                        s[g] += qq.y * kv[4 * e4 + 1];
                        s[g] += qq.z * kv[4 * e4 + 2];
                        s[g] += qq.w * kv[4 * e4 + 3];
                    }
                }
            }
        } else {
#pragma unroll 4
            for (int d = 0; d < D; d++) {
                const float kv = rd.ld(krow, d);
#pragma unroll
                for (int g = 0; g < GB; g++)
                    s[g] += q_s[g][d] * kv;
            }
        }
#pragma unroll
        for (int g = 0; g < GB; g++) {
            const float sc = lane < nv ? s[g] * a.scale : -INFINITY;
            const float mn = fmaxf(m[g], kcu_warp_max(sc)); /* finite: nv >= 1 */
            const float corr = expf(m[g] - mn);             /* 0 on the first sub-block */
            s[g] = expf(sc - mn);                           /* 0 for masked lanes */
            l[g] = l[g] * corr + s[g];
#pragma unroll
            for (int i = 0; i < NDL; i++)
                acc[g][i] *= corr;
            m[g] = mn;
        }
        /* P.V over the 32 keys; past nv the key is clamped and p is 0, so the
         * loop has a fixed trip count and its loads can be issued together */
#pragma unroll 8
        for (int j = 0; j < 32; j++) {
            const char *vrow = vb + (size_t)(t0 + min(j, nv - 1)) * a.stride;
            float vv[NDL];
            if constexpr (VEC) {
                kcu_kv_ldv<T, NDL>(rd.head(vrow) + lane * NDL, vv);
            } else {
#pragma unroll
                for (int i = 0; i < NDL; i++) {
                    const int d = lane + 32 * i;
                    vv[i] = d < D ? rd.ld(vrow, d) : 0.0f;
                }
            }
#pragma unroll
            for (int g = 0; g < GB; g++) {
                const float p = __shfl_sync(KCU_FULL_MASK, s[g], j);
#pragma unroll
                for (int i = 0; i < NDL; i++)
                    acc[g][i] += p * vv[i];
            }
        }
    }

    /* merge the warps' partials of this split */
#pragma unroll
    for (int g = 0; g < GB; g++) {
        const float lsum = kcu_warp_sum(l[g]);
        if (lane == 0) {
            m_s[warp][g] = m[g];
            l_s[warp][g] = lsum;
        }
#pragma unroll
        for (int i = 0; i < NDL; i++)
            acc_s[warp][g][VEC ? lane * NDL + i : lane + 32 * i] = acc[g][i];
    }
    __syncthreads();
    for (int e = threadIdx.x; e < G * D; e += blockDim.x) {
        const int g = e / D, d = e - g * D;
        float M = -INFINITY;
#pragma unroll
        for (int w = 0; w < ATT_WARPS; w++)
            M = fmaxf(M, m_s[w][g]);
        float o = 0.0f, L = 0.0f;
        if (M != -INFINITY) {
#pragma unroll
            for (int w = 0; w < ATT_WARPS; w++) {
                const float wt = m_s[w][g] == -INFINITY ? 0.0f : expf(m_s[w][g] - M);
                o += wt * acc_s[w][g][d];
                L += wt * l_s[w][g];
            }
        }
        const size_t idx = ((size_t)blockIdx.z * a.n_head + h0 + g) * pitch + split;
        ws_acc[idx * D + d] = o;
        if (d == 0) {
            ws_ml[2 * idx] = M;
            ws_ml[2 * idx + 1] = L;
        }
    }
}

/* ---- decode: merge the splits ----
 * Block (head, seq): warp 0 turns the splits' maxima into weights
 * e^(m_s - M) (0 for an empty split) and 1/sum(weight * l_s); then every
 * thread merges output dims. rot_b > 1 (Q4_0): the merged row is rotated
 * back in shared memory before the write. */
__global__ void att_combine_kernel(float *out, const struct kcu_att_seq *seqs, int n_head,
                                   int head_dim, const float *ws_acc, const float *ws_ml, int pitch,
                                   int rot_b, float rot_s) {
    __shared__ float w_s[ATT_MAX_SPLITS];
    __shared__ float o_s[ATT_MAX_HDIM];
    __shared__ float inv_s;
    const struct kcu_att_seq sq = seqs[blockIdx.y];
    if (sq.n_tok != 1)
        return;
    const int h = blockIdx.x, D = head_dim;
    const int ns = att_n_splits(sq.pos0 + 1);
    const size_t b = ((size_t)blockIdx.y * n_head + h) * pitch;
    if (threadIdx.x < 32) {
        const int lane = threadIdx.x;
        float M = -INFINITY;
        for (int p = lane; p < ns; p += 32)
            M = fmaxf(M, ws_ml[2 * (b + p)]);
        M = kcu_warp_max(M); /* finite: split 0 always has keys */
        float L = 0.0f;
        for (int p = lane; p < ns; p += 32) {
            const float mp = ws_ml[2 * (b + p)];
            const float wt = mp == -INFINITY ? 0.0f : expf(mp - M);
            w_s[p] = wt;
            L += wt * ws_ml[2 * (b + p) + 1];
        }
        L = kcu_warp_sum(L);
        if (lane == 0)
            inv_s = 1.0f / L;
    }
    __syncthreads();
    float *o = out + ((size_t)sq.q_row * n_head + h) * D;
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float acc = 0.0f;
        for (int p = 0; p < ns; p++)
            acc += w_s[p] * ws_acc[(b + p) * D + d];
        if (rot_b > 1)
            o_s[d] = acc * inv_s;
        else
            o[d] = acc * inv_s;
    }
    if (rot_b > 1) { /* uniform: every thread takes part in the transform */
        kcu_fwht_smem(o_s, 1, D, D, rot_b, rot_s);
        for (int d = threadIdx.x; d < D; d += blockDim.x)
            o[d] = o_s[d];
    }
}

/* ---- prefill ----
 * Block (query tile, head, seq) of ATT_PF_THREADS; thread t owns query row
 * r = t/4 and, within each K/V tile, keys and output dims c0 + 4k (c0 = t%4).
 * Shared rows of Q and K are padded to an odd pitch so the 8 rows and 4 keys
 * a warp touches at once fall in distinct banks. DMAX bounds head_dim for the
 * accumulator's size. T as for decode; Q4_0 rotates the Q tile after loading
 * it and the output rows (staged in the Q tile) before writing them. */
template <typename T, int DMAX>
__global__ void __launch_bounds__(ATT_PF_THREADS)
    att_prefill_kernel(float *out, const float *q, const struct kcu_att_seq *seqs,
                       struct att_args a) {
    extern __shared__ float sm[];
    constexpr int NK = ATT_BN / 4, NA = DMAX / 4;
    const struct kcu_att_seq sq = seqs[blockIdx.z];
    const int i0 = blockIdx.x * ATT_BM;
    if (sq.n_tok <= 1 || i0 >= sq.n_tok)
        return;
    const int D = a.head_dim, P = D | 1, h = blockIdx.y, kvh = h / a.group;
    float *q_s = sm;               /* [ATT_BM][P] */
    float *k_s = q_s + ATT_BM * P; /* [ATT_BN][P] */
    float *v_s = k_s + ATT_BN * P; /* [ATT_BN][D] */
    float *p_s = v_s + ATT_BN * D; /* [ATT_BM][ATT_BN + 1] */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int r = threadIdx.x >> 2, c0 = threadIdx.x & 3;
    const int n_rows = min(ATT_BM, sq.n_tok - i0);

    for (int rr = warp; rr < ATT_BM; rr += ATT_PF_THREADS / 32) {
        const float *qr = q + ((size_t)(sq.q_row + i0 + rr) * a.n_head + h) * D;
        for (int d = lane; d < D; d += 32)
            q_s[rr * P + d] = rr < n_rows ? qr[d] : 0.0f;
    }
    constexpr bool ROT = std::is_same<T, kcu_q4_0_t>::value;
    if constexpr (ROT)
        kcu_fwht_smem(q_s, ATT_BM, P, D, a.rot_b, a.rot_s);
    /* rows past the chunk compute as its last row and are not written */
    const int qpos = sq.pos0 + i0 + min(r, n_rows - 1);
    const int kend = sq.pos0 + i0 + n_rows; /* keys [0, kend) */
    const kcu_kv_rd<T> rd(kvh, D);
    const char *kb = (const char *)(uintptr_t)sq.base + a.k_off;
    const char *vb = (const char *)(uintptr_t)sq.base + a.v_off;

    float m = -INFINITY, l = 0.0f, acc[NA];
#pragma unroll
    for (int k = 0; k < NA; k++)
        acc[k] = 0.0f;

    for (int kt0 = 0; kt0 < kend; kt0 += ATT_BN) {
        __syncthreads(); /* the previous tile is consumed (first pass: q_s is written) */
        for (int j = warp; j < ATT_BN; j += ATT_PF_THREADS / 32) {
            const int key = kt0 + j;
            const char *krow = kb + (size_t)key * a.stride;
            const char *vrow = vb + (size_t)key * a.stride;
            for (int d = lane; d < D; d += 32) {
                /* zeros past the last key: a masked p of 0 must not meet a NaN */
                k_s[j * P + d] = key < kend ? rd.ld(krow, d) : 0.0f;
                v_s[j * D + d] = key < kend ? rd.ld(vrow, d) : 0.0f;
            }
        }
        __syncthreads();

        float sc[NK];
#pragma unroll
        for (int k = 0; k < NK; k++)
            sc[k] = 0.0f;
#pragma unroll 4
        for (int d = 0; d < D; d++) {
            const float qv = q_s[r * P + d];
#pragma unroll
            for (int k = 0; k < NK; k++)
                sc[k] += qv * k_s[(c0 + 4 * k) * P + d];
        }
        float mx = -INFINITY;
#pragma unroll
        for (int k = 0; k < NK; k++) {
            sc[k] = kt0 + c0 + 4 * k <= qpos ? sc[k] * a.scale : -INFINITY;
            mx = fmaxf(mx, sc[k]);
        }
        mx = fmaxf(mx, __shfl_xor_sync(KCU_FULL_MASK, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(KCU_FULL_MASK, mx, 2));
        const float mn = fmaxf(m, mx); /* finite: key 0 is in the first tile of every row */
        const float corr = expf(m - mn);
        float rs = 0.0f;
#pragma unroll
        for (int k = 0; k < NK; k++) {
            const float p = expf(sc[k] - mn);
            p_s[r * (ATT_BN + 1) + c0 + 4 * k] = p;
            rs += p;
        }
        rs += __shfl_xor_sync(KCU_FULL_MASK, rs, 1);
        rs += __shfl_xor_sync(KCU_FULL_MASK, rs, 2);
        l = l * corr + rs;
        m = mn;
#pragma unroll
        for (int k = 0; k < NA; k++)
            acc[k] *= corr;
        __syncwarp(); /* row r's probabilities come from the 4 lanes of its own warp */
        for (int c = 0; c < ATT_BN; c++) {
            const float p = p_s[r * (ATT_BN + 1) + c];
#pragma unroll
            for (int k = 0; k < NA; k++) {
                const int d = c0 + 4 * k;
                if (d < D)
                    acc[k] += p * v_s[c * D + d];
            }
        }
    }
    const float inv = 1.0f / l;
    if constexpr (ROT) { /* the rows through the Q tile, rotated back */
        __syncthreads(); /* every thread is done with q_s */
#pragma unroll
        for (int k = 0; k < NA; k++) {
            const int d = c0 + 4 * k;
            if (d < D)
                q_s[r * P + d] = acc[k] * inv;
        }
        kcu_fwht_smem(q_s, ATT_BM, P, D, a.rot_b, a.rot_s);
#pragma unroll
        for (int k = 0; k < NA; k++)
            acc[k] = c0 + 4 * k < D ? q_s[r * P + c0 + 4 * k] : 0.0f;
    } else {
#pragma unroll
        for (int k = 0; k < NA; k++)
            acc[k] *= inv;
    }
    if (r < n_rows) {
        float *o = out + ((size_t)(sq.q_row + i0 + r) * a.n_head + h) * D;
#pragma unroll
        for (int k = 0; k < NA; k++) {
            const int d = c0 + 4 * k;
            if (d < D)
                o[d] = acc[k];
        }
    }
}

/* ---- host side ---- */

/* kern_cuda.h's contract. The split count of a decode row is
 * att_n_splits(keys) <= ATT_MAX_SPLITS, non-decreasing, so the bytes for
 * max_ctx cover every row of up to max_ctx keys: n_seqs * n_head *
 * splits(max_ctx) * (head_dim + 2) floats (acc[head_dim], m, l per split).
 * 0 for a non-positive argument. Pure host arithmetic, no CUDA call. */
extern "C" size_t kcu_attention_ws_bytes(int n_seqs, int n_head, int head_dim, int max_ctx) {
    if (n_seqs <= 0 || n_head <= 0 || head_dim <= 0 || max_ctx <= 0)
        return 0;
    return (size_t)n_seqs * (size_t)n_head * (size_t)att_n_splits(max_ctx) *
           ((size_t)head_dim + 2) * sizeof(float);
}

template <typename T, int NDL, bool VEC>
static void att_decode_launch(kcu_stream s, dim3 grid, int gb, const float *q,
                              const struct kcu_att_seq *seqs, const struct att_args &a,
                              float *ws_acc, float *ws_ml, int pitch) {
    const unsigned th = ATT_WARPS * 32;
    if (gb <= 1)
        att_decode_kernel<T, NDL, VEC, 1><<<grid, th, 0, s>>>(q, seqs, a, ws_acc, ws_ml, pitch);
    else if (gb <= 2)
        att_decode_kernel<T, NDL, VEC, 2><<<grid, th, 0, s>>>(q, seqs, a, ws_acc, ws_ml, pitch);
    else if (gb <= 4)
        att_decode_kernel<T, NDL, VEC, 4><<<grid, th, 0, s>>>(q, seqs, a, ws_acc, ws_ml, pitch);
    else
        att_decode_kernel<T, NDL, VEC, 8><<<grid, th, 0, s>>>(q, seqs, a, ws_acc, ws_ml, pitch);
}

template <typename T, int NDL>
static void att_decode_vec(kcu_stream s, dim3 grid, int gb, bool vec, const float *q,
                           const struct kcu_att_seq *seqs, const struct att_args &a, float *ws_acc,
                           float *ws_ml, int pitch) {
    if constexpr (kcu_kv_rd<T>::VEC) {
        if (vec) {
            att_decode_launch<T, NDL, true>(s, grid, gb, q, seqs, a, ws_acc, ws_ml, pitch);
            return;
        }
    }
    att_decode_launch<T, NDL, false>(s, grid, gb, q, seqs, a, ws_acc, ws_ml, pitch);
}

template <typename T>
static void att_decode(kcu_stream s, dim3 grid, int gb, bool aligned, const float *q,
                       const struct kcu_att_seq *seqs, const struct att_args &a, float *ws_acc,
                       float *ws_ml, int pitch) {
    const int D = a.head_dim;
    if (D <= 64)
        att_decode_vec<T, 2>(s, grid, gb, aligned && D == 64, q, seqs, a, ws_acc, ws_ml, pitch);
    else if (D <= 128)
        att_decode_vec<T, 4>(s, grid, gb, aligned && D == 128, q, seqs, a, ws_acc, ws_ml, pitch);
    else
        att_decode_vec<T, 8>(s, grid, gb, aligned && D == 256, q, seqs, a, ws_acc, ws_ml, pitch);
}

template <typename T, int DMAX>
static int att_prefill_launch(kcu_stream s, dim3 grid, float *out, const float *q,
                              const struct kcu_att_seq *seqs, const struct att_args &a) {
    const int D = a.head_dim, P = D | 1;
    const size_t smem =
        ((size_t)ATT_BM * P + (size_t)ATT_BN * P + (size_t)ATT_BN * D + ATT_BM * (ATT_BN + 1)) *
        sizeof(float);
    /* the limit is a property of the function, not of the launch: set it for
     * the largest head this instantiation serves, so threads launching it
     * with different head sizes never lower it under each other */
    const size_t smem_max = ((size_t)ATT_BM * (DMAX | 1) + (size_t)ATT_BN * (DMAX | 1) +
                             (size_t)ATT_BN * DMAX + ATT_BM * (ATT_BN + 1)) *
                            sizeof(float);
    int rc = kcu_check_call(cudaFuncSetAttribute(att_prefill_kernel<T, DMAX>,
                                                 cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                 (int)smem_max),
                            "kcu_attention: cudaFuncSetAttribute");
    if (rc)
        return rc;
    att_prefill_kernel<T, DMAX><<<grid, ATT_PF_THREADS, smem, s>>>(out, q, seqs, a);
    return 0;
}

template <typename T>
static int att_prefill(kcu_stream s, dim3 grid, float *out, const float *q,
                       const struct kcu_att_seq *seqs, const struct att_args &a) {
    if (a.head_dim <= 64)
        return att_prefill_launch<T, 64>(s, grid, out, q, seqs, a);
    if (a.head_dim <= 128)
        return att_prefill_launch<T, 128>(s, grid, out, q, seqs, a);
    return att_prefill_launch<T, 256>(s, grid, out, q, seqs, a);
}

/* kern_cuda.h's contract. -EINVAL, before any launch, also for: n_seqs or
 * n_head > 65535 (grid limits); stride, k_off, v_off or a range base not a
 * multiple of the element size; a sequence with n_tok, pos0 or q_row < 0 or
 * pos0 + n_tok past 2^30 (index arithmetic stays far from overflow); decode rows present and ws
 * NULL, not 4-byte aligned, or smaller than kcu_attention_ws_bytes(n_seqs, n_head, head_dim, max
 * keys of the batch's decode rows). Sequences with n_tok == 0 are skipped. Up to three launches
 * (decode, combine, prefill) plus one cudaFuncSetAttribute (prefill's dynamic shared memory) on the
 * host. The 16-byte vector path is taken when head_dim is 64, 128 or 256 and every decode row's K
 * and V rows are 16-byte aligned; otherwise element loads. */
extern "C" int kcu_attention(kcu_stream s, float *out, const float *q,
                             const struct kcu_att_seq *seqs, const struct kcu_att_seq *seqs_host,
                             int n_seqs, const struct kcu_att_shape *sh, void *ws,
                             size_t ws_bytes) {
    if (!sh || n_seqs < 0 || n_seqs > 65535)
        return -EINVAL;
    const int D = sh->head_dim;
    if (sh->n_head <= 0 || sh->n_head > 65535 || sh->n_head_kv <= 0 || sh->n_head % sh->n_head_kv ||
        D <= 0 || D > ATT_MAX_HDIM || sh->stride == 0 || (unsigned)sh->kvt > (unsigned)KCU_KV_FP8)
        return -EINVAL;
    if (n_seqs == 0)
        return 0;
    if (!out || !q || !seqs || !seqs_host)
        return -EINVAL;
    /* the quantized readers load bytes: any alignment */
    const size_t esz = sh->kvt == KCU_KV_F16 ? 2 : sh->kvt == KCU_KV_F32 ? 4 : 1;
    if (sh->stride % esz || sh->k_off % esz || sh->v_off % esz)
        return -EINVAL;

    int max_dec_keys = 0, max_pf_tok = 0;
    bool aligned = sh->stride % 16 == 0;
    for (int i = 0; i < n_seqs; i++) {
        const struct kcu_att_seq *e = &seqs_host[i];
        if (e->n_tok < 0 || e->pos0 < 0 || e->q_row < 0 || e->pos0 > (1 << 30) - e->n_tok ||
            e->base % esz)
            return -EINVAL;
        if (e->n_tok == 1) {
            max_dec_keys = e->pos0 + 1 > max_dec_keys ? e->pos0 + 1 : max_dec_keys;
            aligned = aligned && (e->base + sh->k_off) % 16 == 0 && (e->base + sh->v_off) % 16 == 0;
        } else if (e->n_tok > 1) {
            max_pf_tok = e->n_tok > max_pf_tok ? e->n_tok : max_pf_tok;
        }
    }

    struct att_args a;
    a.stride = sh->stride;
    a.k_off = sh->k_off;
    a.v_off = sh->v_off;
    a.n_head = sh->n_head;
    a.head_dim = D;
    a.group = sh->n_head / sh->n_head_kv;
    a.n_hchunks = (a.group + ATT_GMAX - 1) / ATT_GMAX;
    a.scale = 1.0f / sqrtf((float)D); /* as kern_attention */
    a.rot_b = sh->kvt == KCU_KV_Q4_0 ? kcu_rot_block(D) : 1;
    a.rot_s = kcu_rot_scale(a.rot_b);

    if (max_dec_keys > 0) {
        const int pitch = att_n_splits(max_dec_keys);
        const size_t n_part = (size_t)n_seqs * sh->n_head * pitch;
        if (!ws || (uintptr_t)ws % sizeof(float) ||
            ws_bytes < n_part * ((size_t)D + 2) * sizeof(float))
            return -EINVAL;
        float *ws_acc = (float *)ws, *ws_ml = ws_acc + n_part * D;
        const dim3 grid(pitch, sh->n_head_kv * a.n_hchunks, n_seqs);
        const int gb = a.group < ATT_GMAX ? a.group : ATT_GMAX;
        switch (sh->kvt) {
        case KCU_KV_F16:
            att_decode<uint16_t>(s, grid, gb, aligned, q, seqs, a, ws_acc, ws_ml, pitch);
            break;
        case KCU_KV_Q8_0:
            att_decode<kcu_q8_0_t>(s, grid, gb, false, q, seqs, a, ws_acc, ws_ml, pitch);
            break;
        case KCU_KV_Q4_0:
            att_decode<kcu_q4_0_t>(s, grid, gb, false, q, seqs, a, ws_acc, ws_ml, pitch);
            break;
        case KCU_KV_FP8:
            att_decode<kcu_fp8_t>(s, grid, gb, false, q, seqs, a, ws_acc, ws_ml, pitch);
            break;
        default:
            att_decode<float>(s, grid, gb, aligned, q, seqs, a, ws_acc, ws_ml, pitch);
            break;
        }
        int rc = kcu_check("kcu_attention: decode");
        if (rc)
            return rc;
        att_combine_kernel<<<dim3(sh->n_head, n_seqs), 128, 0, s>>>(
            out, seqs, sh->n_head, D, ws_acc, ws_ml, pitch, a.rot_b, a.rot_s);
        rc = kcu_check("kcu_attention: combine");
        if (rc)
            return rc;
    }
    if (max_pf_tok > 0) {
        const dim3 grid((max_pf_tok + ATT_BM - 1) / ATT_BM, sh->n_head, n_seqs);
        int rc;
        switch (sh->kvt) {
        case KCU_KV_F16:
            rc = att_prefill<uint16_t>(s, grid, out, q, seqs, a);
            break;
        case KCU_KV_Q8_0:
            rc = att_prefill<kcu_q8_0_t>(s, grid, out, q, seqs, a);
            break;
        case KCU_KV_Q4_0:
            rc = att_prefill<kcu_q4_0_t>(s, grid, out, q, seqs, a);
            break;
        case KCU_KV_FP8:
            rc = att_prefill<kcu_fp8_t>(s, grid, out, q, seqs, a);
            break;
        default:
            rc = att_prefill<float>(s, grid, out, q, seqs, a);
            break;
        }
        if (rc)
            return rc;
        rc = kcu_check("kcu_attention: prefill");
        if (rc)
            return rc;
    }
    return 0;
}
