/* kern.h - CPU compute kernels and the thread pool that runs them.
 *
 * Model: every launcher is a plain function over row-major float tensors;
 * the parallel ones (kern_matmul, kern_attention) take a struct kern_pool and
 * split work inside one kern_pool_run(). p == NULL runs them on the caller.
 * Typical decode step: kern_rmsnorm -> kern_matmul (q,k,v) -> kern_rope ->
 * kern_kv_store -> kern_attention -> kern_matmul (o) -> ... -> kern_swiglu.
 *
 * Numerics (chosen to follow ggml's CPU backend, which the references use):
 *  - F32 weights: f32 dot. F16 weights: the activation row is first rounded to
 *    f16 (RNE, as F16C) and the exact f16 x f16 products are summed in f32.
 *    BF16 weights: upcast (exact) and f32 dot with the f32 activation.
 *  - Q8_0/Q4_0 weights: the activation row is quantized to Q8_0 blocks with
 *    ggml's reference algorithm (kern_quantize_row_q8_0: d = amax/127 stored
 *    as f16, id = d ? 1/d : 0, q = roundf(x*id)); each block's integer dot is
 *    scaled by d_w*d_x (both f16 -> f32) and summed in f32 (Q4_0, and Q8_0
 *    from the avx512 level up: one fma a block; Q8_0 at avx2 and avx-vnni: eight
 *    lane sums a block, ggml's AVX2 vec_dot; scalar Q8_0: ggml's generic
 *    dot). ggml's own AVX2 quantizer uses 127/amax and round-half-even; we
 *    use the reference rule on both ISAs so the two paths see the same
 *    integers.
 *  - Q2_K..Q6_K weights: the activation row is quantized to Q8_K
 *    (kern_quantize_row_q8_K, ggml's rule; on x86 ggml uses the reference
 *    quantizer too) and each 256-block's dot is integer. The portable path
 *    then sums as ggml's generic vec_dot_q*_K_q8_K (8 int lanes per block,
 *    element e in lane e % 8, scaled into 8 float sums, mins subtracted;
 *    Q2_K: one int per block, sumf += d isum - dmin summs); the AVX2 path
 *    (used at avx-vnni too, and for Q2_K/Q3_K at every level above it)
 *    sums as ggml's AVX2 vec_dot (lane (e % 32) / 4, one fma per block and
 *    lane; Q2_K's mins a second fma into the same lanes, before it): the
 *    two give the bits of ggml's CPU backend on a generic or an AVX2
 *    build. Q4_K/Q5_K/Q6_K from the avx512 level up: one integer a block
 *    (acc = fma(d_w d_x, isum, acc), then for Q4_K/Q5_K acc = fma(-(d_x
 *    dmin), msum, acc); kernels/cpu/pack_k.c), which tile products give
 *    exactly.
 *  - Batch invariance: each output element is produced by one thread with one
 *    reduction whose order depends only on n_in (matmul) or on the key count
 *    and head_dim (attention): never on n_tok, n_out, the row's place in the
 *    batch, the thread count or the split. Results are bit-identical across
 *    those, for a given ISA level. Between levels: Q4_0 (rows or packs)
 *    gives the same bits on every level, scalar included; Q2_K and Q3_K on
 *    avx2, avx-vnni, avx512 and amx; Q8_0, Q4_K, Q5_K and Q6_K on avx2 and
 *    avx-vnni, and on avx512 and amx; between those two groups these, the
 *    float types from avx512 up (16 lanes) and the other rows at scalar
 *    differ in the last bits.
 *
 * Thread safety: kernels are reentrant; one kern_pool must be driven by one
 * caller thread at a time (kern_pool_run and kern_pool_scratch are not
 * concurrent with each other on the same pool).
 */
#ifndef LLMD_KERN_H
#define LLMD_KERN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- thread pool --------------------------------------------------------
 * Persistent workers wait on a generation counter: they spin briefly, then
 * sleep on a futex. kern_pool_run() publishes a job and the caller runs slot
 * 0 itself. Slots 1..n-1 are claimed atomically by whichever thread gets
 * there first, so a descheduled worker never stalls a run: the caller takes
 * its slot instead. fn(arg, ith, nth) is called exactly once per ith in
 * [0, nth) per run, not necessarily on a fixed OS thread; per-slot state
 * indexed by ith is therefore safe, thread-local state is not. */
struct kern_pool;

/* Start a pool of n_threads (<= 0: number of online CPUs; capped at 256)
 * including the caller, i.e. n_threads-1 workers. Returns 0, -ENOMEM, or
 * -EAGAIN (thread creation failed). Caller frees with kern_pool_destroy(). */
int kern_pool_create(int n_threads, struct kern_pool **out);

/* Stop and join the workers, free the pool; NULL is a no-op. Not concurrent
 * with kern_pool_run(). */
void kern_pool_destroy(struct kern_pool *p);

int kern_pool_n_threads(const struct kern_pool *p); /* 1 for NULL */

/* Run fn(arg, ith, nth) for every ith in [0, nth), nth = n_threads, and
 * return when all have returned. p may be NULL: runs fn(arg, 0, 1). No
 * allocation; costs a few microseconds when workers are spinning. */
void kern_pool_run(struct kern_pool *p, void (*fn)(void *arg, int ith, int nth), void *arg);

/* On an oversubscribed machine (over 20 ms of sampled runs, n_threads x
 * the caller's share of its CPU under 1.6: with two threads, off its CPU
 * more than a fifth of the time) the pool runs solo for a while -- every
 * slot on the caller thread, in turn, the workers asleep -- then tries
 * threads again (pool.c): one thread beats two that are preempted in
 * turn. Results are the same either way. The count of such periods (0 for
 * NULL), and a test hook that starts one of `ns` nanoseconds (0: threaded
 * again from the next run). Caller thread. */
uint64_t kern_pool_solo_periods(const struct kern_pool *p);
void kern_pool_test_solo(struct kern_pool *p, uint64_t ns);

/* A pool-owned scratch buffer of at least `bytes` (64-byte aligned), grown
 * as needed (grown buffers are not copied). Borrowed: valid until the next
 * kern_pool_scratch() call or kern_pool_destroy(). Returns NULL on OOM (the
 * old buffer stays) or when p is NULL. Caller thread only, never inside a
 * run: kern_matmul uses it for the converted activation rows. */
void *kern_pool_scratch(struct kern_pool *p, size_t bytes);

/* ---- instruction set -----------------------------------------------------
 * Levels, in order; every kernel has a path for each level it gains from
 * and falls back to AVX2's (then the portable one) otherwise:
 *   SCALAR    portable C;
 *   AVX2      AVX2 + FMA + F16C (Haswell, Zen 1);
 *   AVX_VNNI  + AVX-VNNI: 256-bit int8 dot products (VEX vpdpbusd;
 *             Alder Lake, Zen 5 without AVX-512 enabled, ...);
 *   AVX512    AVX2 + AVX-512 F/BW/VL/DQ and AVX512-VNNI (Cascade Lake, Ice
 *             Lake, Sapphire Rapids, Zen 4/5): its VNNI is the EVEX form, so
 *             it does not imply AVX-VNNI (Cascade Lake lacks the VEX form).
 *             Skylake-X (no VNNI) runs AVX2.
 *   AMX       AVX512 + AMX-TILE and AMX-INT8 (Sapphire Rapids and later
 *             Xeons), with the tile state granted to the process (Linux
 *             arch_prctl ARCH_REQ_XCOMP_PERM, asked when the level is
 *             first chosen; a lower LLMD_ISA never asks):
 *             packed Q8_0/Q4_0 prefill in 16 x 16 int8 tiles, the same bits
 *             as AVX512; everything else as AVX512.
 * Every level needs the OS to save the registers it uses (XCR0). The int8
 * dot products of the VNNI levels give the same integers as AVX2's
 * maddubs/madd, so where a kernel's float reduction keeps AVX2's order its
 * results are bit-identical across those levels; where it does not (wider
 * vectors sum in another order) results differ in the last bits between
 * levels, never between batch shapes on one level. */
enum kern_isa {
    KERN_ISA_SCALAR,
    KERN_ISA_AVX2,
    KERN_ISA_AVX_VNNI,
    KERN_ISA_AVX512,
    KERN_ISA_AMX,
    KERN_ISA_N
};

/* The level in use: chosen once, at first use, as the highest this CPU and
 * OS support, or lower when the environment has LLMD_ISA=scalar|avx2|
 * avx-vnni|avx512|amx (a level above what the CPU has is refused with a
 * warning: the highest available is used). Thread-safe, one atomic load. */
enum kern_isa kern_isa(void);

/* The highest level this CPU and OS support (cpuid + xgetbv, read once).
 * AMX counts from the CPU and XCR0 until the amx level is first chosen
 * (kern_isa, kern_set_isa), which asks the OS for the tile data; after a
 * refusal (logged) this says AVX512. */
enum kern_isa kern_isa_max(void);

/* Use `isa`, clamped to kern_isa_max() (tests, benchmarks). Returns the
 * level now in use. Not concurrent with running kernels. */
enum kern_isa kern_set_isa(enum kern_isa isa);

/* "scalar", "avx2", "avx-vnni", "avx512", "amx" ("?" out of range).
 * Static. */
const char *kern_isa_name(enum kern_isa isa);

/* The level named `name` (as kern_isa_name prints it, in any case: "AVX2"
 * is avx2). Returns 0, -EINVAL. */
int kern_isa_parse(const char *name, enum kern_isa *out);

/* One line for summaries: the level in use and the highest available,
 * the optional extensions the CPU has that some kernel uses, and the L2
 * the products block for ("avx512 (max avx512; avx512_bf16; L2 2048 KiB)",
 * see kern_cache_l2). Returns what snprintf does. */
int kern_isa_describe(char *buf, size_t len);

/* Whether the avx512 float rows' one-token tiles (decode, products of 2
 * or 3 tokens, a prefill's single-token leftovers; f32, f16 and bf16
 * weights) prefetch the next tile into L2 in software
 * (kern_cpu_prefetch_next_l2). On for Intel: on the Emerald Rapids Xeon a
 * standalone f16 product read 1.07-1.32x as fast with it as without, and
 * dummy-1g f16 decoded 1.14x (one thread) and 1.09x (two) as fast as with
 * the L1 prefetch it replaced. Off for AMD and Hygon: a Zen 5 decoded it
 * 1.17x and 1.16x as fast without (docs/benchmarks.md, "f16 decode: the
 * next tile into L2 (Xeon)" and "The float decode tile's L2 prefetch on
 * AMD (Zen 5)"); Zen 3 ran the AVX2 tile faster without a prefetch too,
 * and no other AMD core or Hygon was measured. Read once from cpuid's vendor (kern_cpu_vendor; on
 * for any other vendor, off off the x86); thread-safe. A prefetch changes no result. */
bool kern_rows_prefetch(void);

/* 1: on, 0: off, -1: the CPU's default, from the next product on (tests,
 * benchmarks). Returns the value now in use. Not concurrent with running
 * kernels. */
bool kern_set_rows_prefetch(int on);

/* ---- caches --------------------------------------------------------------- */

#define KERN_L2_DEFAULT (512u << 10) /* when nothing reports one (Zen 3's) */
#define KERN_L2_MIN     (64 << 10)
#define KERN_L2_MAX     (64 << 20)

/* The L2 data cache of one core, in bytes, that the matrix products size
 * their blocks from (a quarter of it for a chunk of weight rows, a quarter
 * for a block of token activations; kernels/cpu/matmul.c). Read once, at
 * first use: the smallest per-core L2 hwloc reports (an L2 shared by a
 * cluster of cores divided among them), else sysconf's, else
 * KERN_L2_DEFAULT; LLMD_L2_KIB=<KiB> (digits only, 64 to 65536)
 * overrides it; any other value is ignored with a warning (an empty one
 * as if unset). Read at the first product or kern_pool_create. Clamped to
 * [KERN_L2_MIN, KERN_L2_MAX]. Thread-safe. Block sizes never change a
 * result's bits (batch invariance). */
size_t kern_cache_l2(void);

/* Where kern_cache_l2's value came from: "hwloc", "cpuid" (sysconf),
 * "default", "LLMD_L2_KIB" or "set". Static string. */
const char *kern_cache_l2_source(void);

/* Use `bytes` (clamped as above; 0: read the machine and LLMD_L2_KIB
 * again) from the next product on (tests, benchmarks). Returns the value
 * now in use. Not concurrent with running kernels. */
size_t kern_set_cache_l2(size_t bytes);

/* ---- weights -------------------------------------------------------------- */

/* The weight types the kernels compute with. The values are ggml's type ids
 * (the GGUF tensor type field), so a loader converts by checking membership,
 * not by a table; the kernels never see the file format itself. Block
 * layouts are ggml's (kern_cpu.h). */
enum kern_wtype {
    KERN_W_F32 = 0,
    KERN_W_F16 = 1,
    KERN_W_Q4_0 = 2,
    KERN_W_Q8_0 = 8,
    KERN_W_Q2_K = 10,
    KERN_W_Q3_K = 11,
    KERN_W_Q4_K = 12,
    KERN_W_Q5_K = 13,
    KERN_W_Q6_K = 14,
    KERN_W_BF16 = 30,
};

/* Elements per K-quant super-block (ggml's QK_K): a Q2_K..Q6_K row, and
 * the activation of a matmul with one, is a whole number of them. */
#define KERN_QK_K 256

/* True when t is one of enum kern_wtype (any int: a file's type id). */
bool kern_wtype_ok(int t);

/* Bytes of one row of n elements of type t (n a multiple of 32 for
 * Q4_0/Q8_0, of KERN_QK_K for the K-quants); 0 for an unknown type or a
 * bad n. */
size_t kern_row_bytes(enum kern_wtype t, size_t n);

/* Y[n_tok][n_out] = X[n_tok][n_in] . W[n_out][n_in]^T. x, y f32 (must not
 * overlap); w rows of kern_row_bytes(wtype, n_in) bytes, borrowed. n_in is a
 * multiple of 32 for Q8_0/Q4_0 and of KERN_QK_K for Q2_K..Q6_K. Threads
 * take contiguous chunks of rows (n_out); prefill tiles over tokens for
 * weight reuse. Converted activations live in kern_pool_scratch(p) (with p
 * NULL, or if it cannot grow, the tokens go through a 32 KiB stack buffer in
 * several passes, or a heap buffer of one row, one token a pass, for a row
 * larger than that; if that allocation fails too, y is filled with NaN and
 * an error logged). n_in 0 gives zeros. */
void kern_matmul(struct kern_pool *p, float *y, const float *x, const void *w,
                 enum kern_wtype wtype, int n_in, int n_out, int n_tok);

/* ---- repacked weights ------------------------------------------------------
 * At the AVX512 and AMX levels Q8_0, Q4_0, Q4_K, Q5_K and Q6_K matrices, and at the
 * AVX2 and AVX-VNNI levels Q4_0, Q4_K and Q5_K ones, run fastest
 * from a layout of their own: rows in groups of KERN_PACK_ROWS, interleaved
 * so that one 64-byte load gives every row of a group four consecutive
 * weights and one vpdpbusd advances all of them (the K-quants: with their
 * scales unpacked at pack time; at AVX2 half a load, 8 rows, with
 * vpmaddubsw + vpmaddwd; at amx the Q8_0 record is an AMX B tile as it is,
 * Q4_0's and the K-quants' are unpacked into tiles per record; byte
 * layouts: kernels/cpu/pack.c, pack_k.c). The model packs a matrix once at
 * load when kern_pack_supported() says so and multiplies with
 * kern_matmul_packed(); the GGUF rows are left as they are. A pack
 * computes the rows' bits on every level that packs the type (Q8_0 and
 * Q4_0: one integer sum and one fma per block; the K-quants at avx2 and
 * avx-vnni: the AVX2 level's eight lanes and trees, from avx512 up: one
 * integer a block), so packing changes no result, only the speed. A pack is a copy of the matrix in
 * memory, beside the rows it was made from. */
#define KERN_PACK_ROWS 16

struct kern_pack {
    void *data;           /* owned (kern_pack_free) unless made by kern_pack_make_in */
    size_t bytes;         /* of data: the matrix's own size, rows padded to 16 */
    enum kern_wtype type; /* of the rows it was made from */
    int n_in, n_out;
    bool borrowed; /* data is the caller's (kern_pack_make_in): not freed here */
};

/* True when the level in use has a packed kernel for type t and n_in
 * elements a row (a multiple of 32; of KERN_QK_K for the K-quants). */
bool kern_pack_supported(enum kern_wtype t, int n_in);

/* Pack w (n_out rows of kern_row_bytes(t, n_in) bytes; only read, not
 * kept) into pk, the groups of 16 rows split over p's threads (p NULL: on
 * the caller; the bytes are the same for any p). Returns 0, -ENOTSUP (t
 * has no packed layout), -EINVAL (n_in not a multiple of 32, or of
 * KERN_QK_K for a K-quant; n_out <= 0; w NULL), -ENOMEM (pk untouched on
 * every error). Costs one pass over the matrix; p's caller thread, as
 * kern_pool_run (any thread when p is NULL). */
int kern_pack_make(struct kern_pool *p, struct kern_pack *pk, enum kern_wtype t, const void *w,
                   int n_in, int n_out);

/* Bytes a pack of n_out rows of type t and n_in elements takes
 * (kern_pack_make's pk->bytes); 0 when t has no packed layout or the shape
 * is one kern_pack_make refuses. */
size_t kern_pack_bytes(enum kern_wtype t, int n_in, int n_out);

/* As kern_pack_make, into the caller's buf (64-byte aligned, at least
 * kern_pack_bytes(t, n_in, n_out) bytes, every one of them written), which
 * pk borrows: kern_pack_free then only zeroes pk. Lets a model put all its
 * packs in one buffer (model.c: one huge-page mapping, in the order the
 * forward pass reads them). Errors as kern_pack_make, less -ENOMEM;
 * -EINVAL also for a NULL or misaligned buf. */
int kern_pack_make_in(struct kern_pool *p, struct kern_pack *pk, enum kern_wtype t, const void *w,
                      int n_in, int n_out, void *buf);

/* Free pk's data (unless borrowed) and zero pk; a zeroed or NULL pk is a
 * no-op. */
void kern_pack_free(struct kern_pack *pk);

/* Y[n_tok][n_out] = X[n_tok][n_in] . W^T for a pack (as kern_matmul). The
 * activation is quantized as for kern_matmul (Q8_0, or Q8_K for the
 * K-quants), plus the sums the pack's kernel needs. Batch invariant like
 * kern_matmul. */
void kern_matmul_packed(struct kern_pool *p, float *y, const float *x, const struct kern_pack *w,
                        int n_tok);

/* One matrix of kern_matmul_fused: y[n_tok][n_out] = X . W^T, W the pack
 * when pack is non-NULL with data, else n_out rows w of type wtype (as
 * kern_matmul). y is the caller's, never aliasing x or another part's y. */
struct kern_mm_part {
    float *y;
    const struct kern_pack *pack;
    const void *w;
    enum kern_wtype wtype;
    int n_out;
};

/* How kern_matmul_fused combines its parts. CONCAT: independent products
 * of one input (attention's Q, K and V). SWIGLU: two parts of the same
 * n_out, gate then up; afterwards parts[0].y = silu(gate) * up as
 * kern_swiglu(gate_y, gate_y, up_y, ...) computes it, and parts[1].y holds
 * up. */
enum kern_mm_fuse { KERN_MM_CONCAT, KERN_MM_SWIGLU };

/* The products of up to 3 matrices (CONCAT; exactly 2 for SWIGLU) with one
 * activation x[n_tok][n_in], with the bits of kern_matmul /
 * kern_matmul_packed on each part (and kern_swiglu after, for SWIGLU),
 * faster: adjacent parts whose kernels read the same converted activation
 * (the same type and n_in, all packed or all not) share one conversion and
 * one pool run, their rows claimed as one range, and SWIGLU applies silu *
 * up to a chunk's rows while they are in cache. Parts that cannot share
 * run as separate calls, so any mix is accepted. Errors as kern_matmul; more
 * parts, or SWIGLU parts of different n_out, are a bug (logged, nothing
 * computed; as is a `how` that is neither). Thread safety as kern_matmul:
 * one caller per pool. */
void kern_matmul_fused(struct kern_pool *p, const float *x, int n_in, int n_tok,
                       const struct kern_mm_part *parts, int n_parts, enum kern_mm_fuse how);

/* dst[n] f32 = row src of type t (embedding lookup); for the quantized
 * types the float expressions of ggml's dequantize_row_* (bit for bit). */
void kern_dequant_row(enum kern_wtype t, const void *src, float *dst, int n);

/* ggml's reference quantizers (quantize_row_q8_0_ref / q4_0_ref): n floats
 * (multiple of 32) to n/32 blocks. Q8_0 block = {f16 d; int8 qs[32]} (34 B);
 * Q4_0 block = {f16 d; uint8 qs[16]} (18 B), element j = (qs[j] & 0xF) - 8
 * for j < 16 and (qs[j-16] >> 4) - 8 for j >= 16; d = max/-8 where max is
 * the signed value of largest magnitude. */
void kern_quantize_row_q8_0(const float *x, void *dst, int n);
void kern_quantize_row_q4_0(const float *x, void *dst, int n);

/* ggml's reference K-quantizers (quantize_row_q2_K_ref / q3_K_ref /
 * q4_K_ref / q5_K_ref / q6_K_ref in ggml-quants.c, what llama-quantize runs
 * without an importance matrix): n floats (a multiple of KERN_QK_K) to n/256
 * super-blocks of ggml's block_q2_K (84 B), block_q3_K (110 B), block_q4_K
 * (144 B), block_q5_K (176 B) or block_q6_K (210 B); layouts in
 * kernels/cpu/kern_cpu.h. Same float expressions in the same order, so the
 * bytes are llama-quantize's. Scalar, for writers and tests. */
void kern_quantize_row_q2_K(const float *x, void *dst, int n);
void kern_quantize_row_q3_K(const float *x, void *dst, int n);
void kern_quantize_row_q4_K(const float *x, void *dst, int n);
void kern_quantize_row_q5_K(const float *x, void *dst, int n);
void kern_quantize_row_q6_K(const float *x, void *dst, int n);

/* ggml's quantize_row_q8_K_ref, the activation side of every K-quant dot:
 * per 256 values {f32 d; int8 qs[256]; int16 bsums[16]} (292 B), with
 * iscale = -127/max (max: the value of largest magnitude, with its sign),
 * q = min(127, nearest(iscale * x)) rounding half to even, d = 1/iscale,
 * bsums[j] = sum of qs[16j..16j+15]; an all-zero block is d = 0, q = 0. */
void kern_quantize_row_q8_K(const float *x, void *dst, int n);

/* ---- elementwise and small ops --------------------------------------------- */

/* y[n] = x / sqrt(mean(x^2) + eps) * w, mean summed in double as ggml;
 * y may alias x. */
void kern_rmsnorm(float *y, const float *x, const float *w, int n, float eps);

/* In place on x[n_head][head_dim]: "normal" RoPE (llama2.c, ggml mode 0) on
 * adjacent pairs (2i, 2i+1), i < n_rot/2, of each head; n_rot even and <=
 * head_dim. theta_i = pos * base^(-2i/n_rot), computed as ggml does
 * (theta *= powf(base, -2/n_rot) per pair, float). */
void kern_rope(float *x, int n_head, int head_dim, int n_rot, int pos, float freq_base);

/* As kern_rope() in NEOX mode (GPT-NeoX; ggml mode 2, GGML_ROPE_TYPE_NEOX,
 * Qwen2/Qwen3): pair i is (i, i + n_rot/2) of each head, not (2i, 2i+1);
 * the same angles. */
void kern_rope_neox(float *x, int n_head, int head_dim, int n_rot, int pos, float freq_base);

/* Either mode (neox), each pair's angle divided by freq_factors[i] when
 * given ([n_rot/2]; NULL: none): Llama 3.1's RoPE scaling as GGUF stores it
 * (rope_freqs.weight) and ggml applies it (cos/sin of theta_i / ff_i). */
void kern_rope_ff(float *x, int n_head, int head_dim, int n_rot, int pos, float freq_base,
                  const float *freq_factors, bool neox);

/* In place softmax of x[n] (max-subtracted, sum in double as ggml). */
void kern_softmax(float *x, int n);

/* y[n] = silu(gate) * up, silu(g) = g / (1 + expf(-g)); y may alias either. */
void kern_swiglu(float *y, const float *gate, const float *up, int n);

/* f16 <-> f32, round-to-nearest-even (as F16C), NaN stays NaN. */
void kern_f32_to_f16(uint16_t *dst, const float *src, int n);
void kern_f16_to_f32(float *dst, const uint16_t *src, int n);
uint16_t kern_f32_to_f16_1(float f);
float kern_f16_to_f32_1(uint16_t h);

/* ---- KV cache element types -----------------------------------------------
 * A "KV row" is one token's K (or V) of one layer: n_kv_head heads of
 * head_dim elements, [n_kv_head][head_dim] row-major in f32 before it is
 * stored. n = n_kv_head * head_dim. As stored (kern_kv_row_bytes bytes):
 *  F32, F16  n elements (f16: RNE as F16C); head h at h*head_dim*b.
 *  Q8_0      ceil(n/32) GGUF Q8_0 blocks {f16 d; int8 qs[32]} (34 B) over
 *            the whole row, element i in block i/32 at i%32: a block may
 *            hold several heads (stories260K: head_dim 8, four heads a
 *            block) or a head may span blocks; the last block is
 *            zero-padded. Values quantized by kern_quantize_row_q8_0's rule.
 *  Q4_0      ceil(n/32) GGUF Q4_0 blocks {f16 d; uint8 qs[16]} (18 B), laid
 *            out as Q8_0's, of the row after kern_kv_rotate(): each head's
 *            vector times an orthonormal block-diagonal Walsh-Hadamard
 *            matrix, which spreads an outlier channel over its block before
 *            4-bit rounding (QuaRot: Ashkboos et al. 2024, arXiv:2404.00456;
 *            llama.cpp does the same for its quantized caches, ggml-org/
 *            llama.cpp PR #21038: an n x n Hadamard matrix scaled by
 *            1/sqrt(n) on Q, K and V, the output rotated back). This
 *            rotation is fixed, not QuaRot's randomized one: it needs no
 *            seed and the rows stay a function of the model alone.
 *            kern_attention rotates q the same
 *            way (H orthogonal: (Hq).(Hk) = q.k in exact arithmetic) and
 *            rotates its output back (sum p_j H v_j = H sum p_j v_j).
 *  FP8       per head {f32 s; uint8 e[head_dim]} (4 + head_dim B): OCP
 *            FP8 E4M3 (bias 7, no infinities, max 448) of x / s with
 *            s = amax(head) / 448, rounded to nearest even; 0x7F/0xFF
 *            (NaN) are never written. Converted in software.
 * Every type's row is self-contained (scales inline), so a KV page holds
 * its tokens' scales and moves between tiers as plain bytes. */
enum kern_kv_type { KERN_KV_F32, KERN_KV_F16, KERN_KV_Q8_0, KERN_KV_Q4_0, KERN_KV_FP8, KERN_KV_N };

/* Bytes of one KV row of type t (see above); 0 for an unknown type or a
 * non-positive shape. */
size_t kern_kv_row_bytes(enum kern_kv_type t, int n_kv_head, int head_dim);

/* Store one KV row src[n_kv_head][head_dim] (f32, borrowed, not modified)
 * as type t into dst (kern_kv_row_bytes bytes, any alignment). Quantizes
 * the whole row in this call; deterministic: the bytes depend on src alone.
 * head_dim <= KERN_ATT_MAX_HEAD_DIM. Reentrant, allocates nothing. */
void kern_kv_store(void *dst, const float *src, int n_kv_head, int head_dim, enum kern_kv_type t);

/* The inverse: dst[n_kv_head][head_dim] f32 = the values kern_attention
 * computes with (for Q4_0 rotated back to the model's basis). For tests,
 * tools and the reference paths; reentrant. */
void kern_kv_load(float *dst, const void *src, int n_kv_head, int head_dim, enum kern_kv_type t);

/* Size of the Hadamard blocks kern_kv_rotate uses for head_dim: the largest
 * power of two dividing it, at most 256 (head_dim 8 -> 8, 128 -> 128, 80
 * -> 16, 96 -> 32; an odd head_dim -> 1: no rotation). */
int kern_kv_rot_block(int head_dim);

/* In place on x[n_head][head_dim]: each head's vector times H, the
 * block-diagonal matrix of normalized Walsh-Hadamard blocks (Sylvester
 * order, scale 1/sqrt(block)) of kern_kv_rot_block(head_dim). H is
 * symmetric and orthogonal, so a second call undoes the first (up to f32
 * rounding). Fast transform: block * log2(block) adds a head. */
void kern_kv_rotate(float *x, int n_head, int head_dim);

/* ---- attention ----------------------------------------------------------- */
struct kern_kv {
    const void *k, *v;   /* KV row of token 0 for this layer (type's layout, above):
                          * token t's row at (char *)k + t*stride_bytes; borrowed */
    size_t stride_bytes; /* token stride S in bytes (all layers' K and V of one token) */
    enum kern_kv_type type;
    int n_head, n_kv_head, head_dim; /* GQA: query head h uses kv head h / (n_head/n_kv_head) */
    int window; /* sliding window: a query at position p sees keys p - window < k <= p
                 * (the older ones need not be stored: they are never read); 0: all */
};

/* out[n_tok][n_head][head_dim] = causal attention of q[n_tok][n_head][head_dim]
 * (f32): query i at position pos0+i sees tokens 0..pos0+i (with kv->window
 * w > 0, only the last w of them), which must already be stored in kv.
 * Scale 1/sqrt(head_dim). Parallel over (token, kv head).
 * Per query the keys are visited in order, from the first it sees, in chunks of 32 with an
 * online softmax (f32 running max/sum, expf), so the result depends only on
 * the key count and head_dim. q is kept in f32 for every cache type (ggml
 * would round it to f16, or quantize it, for a quantized cache); quantized K
 * and V are dequantized in registers (value = d * q exactly for Q8_0/Q4_0,
 * e4m3 * s rounded once for FP8); for Q4_0 q is rotated first and the output
 * rotated back (kern_kv_rotate). head_dim <= KERN_ATT_MAX_HEAD_DIM (a model
 * loader must refuse wider heads: the accumulator lives on the stack).
 * out must not overlap q. */
#define KERN_ATT_MAX_HEAD_DIM 256
void kern_attention(struct kern_pool *p, float *out, const float *q, int n_tok, int pos0,
                    const struct kern_kv *kv);

#endif /* LLMD_KERN_H */
