/* matmul.c - Y = X . W^T for every weight type: driver and portable path.
 *
 * Driver. Thread 0 converts the activation once (F16: rounded to f16, kept
 * as f16, as f32 at the AVX512 level; Q8_0/Q4_0: quantized to q8 act rows,
 * see kern_cpu.h) into the pool's scratch, then one kern_pool_run() lets the
 * threads claim contiguous chunks of output rows from an atomic counter (a
 * late or slow thread just claims fewer). Within a chunk the tokens go in
 * blocks whose activations fit in L2, and the rect kernel tiles rows x
 * tokens so each weight row read from memory serves several tokens.
 *
 * Batch invariance: every (token, row) element is one call of the same
 * per-element reduction, in an order fixed by n_in alone; tiling only
 * decides which elements run side by side. The scalar dots below sum left to
 * right (Q8_0 per ggml's generic vec_dot: an int per block, then sumf +=
 * sumi * (d_w * d_x); Q4_0 the same with one fused multiply-add per block,
 * sumf = fmaf(sumi, d_w * d_x, sumf), which is every level's Q4_0 order
 * (matmul_q.h, pack.c); the K-quants' portable dots, in ggml's generic
 * order too, and their AVX2 tiles are matmul_k.c and matmul_k_avx2.c, with
 * Q8_K activations from quant_k.c).
 */
#include "kernels/cpu/kern_cpu.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "log.h"
#include "mem.h"

#define MM_STACK_SCRATCH (32 * 1024)

/* A chunk's weights and a token block's activations each take a quarter
 * of a core's L2 (kern_cache_l2), so both stay there together while a chunk
 * runs: prefill reads each weight once from DRAM and re-reads activations
 * from L2/L3. Decode ignores the weight share. On a Zen 3 (512 KiB L2:
 * 128 KiB blocks) no other share beat a quarter beyond the noise, and half
 * was the slowest; on an Emerald Rapids Xeon (2 MiB: 512 KiB blocks) the
 * sizes from 128 KiB to 1 MiB blocks ran within the noise of each other
 * (docs/benchmarks.md, "L2 blocking", "L2 blocks at a 2 MiB L2"). */
static size_t mm_l2_share(void) {
    return kern_cache_l2() / 4;
}

/* ---- portable per-element dots ---- */

static float mm_dot_f32(const float *w, const float *x, int n) {
    float s = 0.0f;
    for (int i = 0; i < n; i++)
        s += w[i] * x[i];
    return s;
}

static float mm_dot_f16(const uint16_t *w, const uint16_t *x, int n) {
    float s = 0.0f;
    for (int i = 0; i < n; i++)
        s += kern_f16_to_f32_1(w[i]) * kern_f16_to_f32_1(x[i]);
    return s;
}

static float mm_dot_bf16(const uint16_t *w, const float *x, int n) {
    float s = 0.0f;
    for (int i = 0; i < n; i++) {
        uint32_t u = (uint32_t)w[i] << 16;
        float wf;
        memcpy(&wf, &u, sizeof(wf));
        s += wf * x[i];
    }
    return s;
}

static float mm_dot_q8_0(const struct kern_blk_q8_0 *w, const int8_t *xq, const float *xd, int n) {
    float sumf = 0.0f;
    for (int b = 0; b < n / KERN_QK; b++) {
        int sumi = 0;
        for (int j = 0; j < KERN_QK; j++)
            sumi += w[b].qs[j] * xq[b * KERN_QK + j];
        sumf += sumi * (kern_f16_to_f32_1(w[b].d) * xd[b]);
    }
    return sumf;
}

static float mm_dot_q4_0(const struct kern_blk_q4_0 *w, const int8_t *xq, const float *xd, int n) {
    float sumf = 0.0f;
    for (int b = 0; b < n / KERN_QK; b++) {
        int sumi = 0;
        for (int j = 0; j < KERN_QK / 2; j++) {
            sumi += ((w[b].qs[j] & 0x0F) - 8) * xq[b * KERN_QK + j];
            sumi += ((w[b].qs[j] >> 4) - 8) * xq[b * KERN_QK + j + KERN_QK / 2];
        }
        sumf = fmaf((float)sumi, kern_f16_to_f32_1(w[b].d) * xd[b], sumf);
    }
    return sumf;
}

static void mm_rect_scalar(const struct kern_mm *m, int r0, int r1, int t0, int t1) {
    const int n = m->n_in;
    for (int r = r0; r < r1; r++) {
        const void *w = (const char *)m->w + (size_t)r * m->w_stride;
        for (int t = t0; t < t1; t++) {
            const void *a = (const char *)m->act + (size_t)t * m->act_stride;
            float v = 0.0f;
            switch (m->wtype) {
            case KERN_W_F32:
                v = mm_dot_f32(w, a, n);
                break;
            case KERN_W_F16:
                v = mm_dot_f16(w, a, n);
                break;
            case KERN_W_BF16:
                v = mm_dot_bf16(w, a, n);
                break;
            case KERN_W_Q8_0:
                v = mm_dot_q8_0(w, a, (const float *)((const int8_t *)a + n), n);
                break;
            case KERN_W_Q4_0:
                v = mm_dot_q4_0(w, a, (const float *)((const int8_t *)a + n), n);
                break;
            case KERN_W_Q2_K:
                v = kern_cpu_dot_q2_K(w, a, n);
                break;
            case KERN_W_Q3_K:
                v = kern_cpu_dot_q3_K(w, a, n);
                break;
            case KERN_W_Q4_K:
                v = kern_cpu_dot_q4_K(w, a, n);
                break;
            case KERN_W_Q5_K:
                v = kern_cpu_dot_q5_K(w, a, n);
                break;
            case KERN_W_Q6_K:
                v = kern_cpu_dot_q6_K(w, a, n);
                break;
            }
            m->y[(size_t)t * m->n_out + r] = v;
        }
    }
}

/* The micro-kernel of level isa for wtype: the level's own, else AVX2's,
 * else NULL (the portable one). The AVX512 level falls back to AVX2, not to
 * AVX-VNNI: a CPU with AVX-512 VNNI may lack AVX-VNNI's VEX encoding. */
static kern_cpu_rect_fn mm_rect_for(enum kern_isa isa, enum kern_wtype wtype) {
    kern_cpu_rect_fn f = NULL;
    if (isa >= KERN_ISA_AVX512) {
        f = kern_cpu_rect_avx512(wtype);
        if (!f)
            f = kern_cpu_rect_k1_avx2(wtype); /* Q4_K/Q5_K/Q6_K: the packs' sequence */
    } else if (isa == KERN_ISA_AVX_VNNI)
        f = kern_cpu_rect_avxvnni(wtype);
    if (!f && isa >= KERN_ISA_AVX2)
        f = kern_cpu_rect_avx2(wtype);
    if (!f && isa >= KERN_ISA_AVX2)
        f = kern_cpu_rect_k_avx2(wtype); /* K-quants: matmul_k_avx2.c */
    return f;
}

/* ---- driver ---- */

struct mm_job {
    struct kern_mm m;
    kern_cpu_rect_fn rect;
    int row_align; /* chunks start at multiples of it: 1, or a pack's 16 rows */
    int t0, t1;    /* tokens of this pass */
    int tok_block; /* tokens per L2 block */
    int tok_tile;  /* below tok_mult a block is a multiple of this: the rect's prefill tile */
    int tok_mult;  /* a block is a multiple of this when it can be (0: 12) */
    int chunk_rows; /* a chunk's rows while many are left */
    int tail_rows;  /* the smallest chunk: a multiple of row_align */
    int nth;
    _Atomic int next_row;
};

/* Rows of the chunk that starts with rem rows left: chunk_rows while there
 * are plenty, then a 2*nth-th of what is left (guided scheduling), never
 * under tail_rows. The last chunks are small, so the thread that takes the
 * last one finishes soon after the others: with a fixed chunk a thread
 * waited for half a chunk at the end of each product on average, 5% of a
 * 2-thread q4_0 decode on the Xeon (docs/benchmarks.md, "Decode: smaller
 * chunks at the end of a product"). Which thread computes a row never
 * changes its bits. */
static int mm_chunk_at(const struct mm_job *j, int rem) {
    int c = rem / (2 * j->nth);
    c = (c + j->tail_rows - 1) / j->tail_rows * j->tail_rows;
    if (c > j->chunk_rows)
        c = j->chunk_rows;
    if (c < j->tail_rows)
        c = j->tail_rows;
    return c < rem ? c : rem;
}

static void mm_worker(void *arg, int ith, int nth) {
    (void)ith;
    (void)nth;
    struct mm_job *j = arg;
    const int n_out = j->m.n_out;
    int r0 = atomic_load_explicit(&j->next_row, memory_order_relaxed);
    for (;;) {
        if (r0 >= n_out)
            return;
        const int r1 = r0 + mm_chunk_at(j, n_out - r0); /* r0: a multiple of row_align */
        if (!atomic_compare_exchange_weak_explicit(&j->next_row, &r0, r1, memory_order_relaxed,
                                                   memory_order_relaxed))
            continue; /* r0 now holds the row another thread left */
        for (int t = j->t0; t < j->t1; t += j->tok_block) {
            int te = t + j->tok_block < j->t1 ? t + j->tok_block : j->t1;
            j->rect(&j->m, r0, r1, t, te);
        }
        r0 = atomic_load_explicit(&j->next_row, memory_order_relaxed);
    }
}

/* Bytes of one converted activation row (0: the caller's x is used as is). */
static size_t mm_act_bytes(enum kern_wtype t, int n_in) {
    switch (t) {
    case KERN_W_F16:
        return ((size_t)n_in * sizeof(uint16_t) + 63) & ~(size_t)63;
    case KERN_W_Q8_0:
    case KERN_W_Q4_0:
        return kern_cpu_act_q8_bytes(n_in);
    case KERN_W_Q2_K:
        return kern_cpu_act_q8K16_bytes(n_in);
    case KERN_W_Q3_K:
    case KERN_W_Q4_K:
    case KERN_W_Q5_K:
    case KERN_W_Q6_K:
        return kern_cpu_act_q8K_bytes(n_in);
    default:
        return 0;
    }
}

static void mm_convert(enum kern_wtype t, const float *x, void *dst, int n_in) {
    if (t == KERN_W_F16) {
        kern_f32_to_f16(dst, x, n_in); /* the dots then use exact f16 values */
    } else if (t == KERN_W_Q2_K) {
        kern_cpu_act_q8K16(x, dst, n_in);
    } else if (t == KERN_W_Q3_K || t == KERN_W_Q4_K || t == KERN_W_Q5_K || t == KERN_W_Q6_K) {
        kern_cpu_act_q8K(x, dst, n_in);
    } else {
        kern_cpu_act_q8(x, dst, n_in);
    }
}

/* F16 activations at the AVX512 level: the same f16 values, widened back to
 * f32, which is what that level's float tile reads (see kern_matmul). */
static void mm_convert_f16_wide(enum kern_wtype t, const float *x, void *dst, int n_in) {
    (void)t;
    uint16_t h[256];
    float *d = dst;
    for (int i = 0; i < n_in; i += 256) {
        int k = n_in - i < 256 ? n_in - i : 256;
        kern_f32_to_f16(h, x + i, k);
        kern_f16_to_f32(d + i, h, k);
    }
}

static int mm_chunk_rows(size_t w_stride, int n_out, int n_tok, int nth, int align) {
    int c;
    if (n_tok == 1) {
        c = (n_out + 4 * nth - 1) / (4 * nth);
        if (c < 16)
            c = 16;
    } else {
        /* at most the L2 share, and small enough for 4 chunks a thread (a
         * large L2 and many threads would otherwise leave threads idle) */
        c = (int)(mm_l2_share() / w_stride);
        const int per_thread = (n_out + 4 * nth - 1) / (4 * nth);
        if (nth > 1 && c > per_thread)
            c = per_thread;
        if (c < 4)
            c = 4;
    }
    c = (c + 3) & ~3;
    return (c + align - 1) / align * align;
}

/* Below this many weight bytes x tokens a product runs on the caller alone:
 * waking a worker and bouncing the chunk counter between cores costs a few
 * microseconds, more than a 128 KiB product takes (~4 us at 30 GB/s). For
 * stories260K this turns 2-thread decode from slower than 1 thread into the
 * same speed. The reduction order per element is unchanged (invariance). */
#define MM_SERIAL_BYTES (128u << 10)

/* Activation conversion of a pass: token i of n_tok by slot i % nth (the
 * tokens are independent, so who converts one never changes its bytes). */
struct mm_conv {
    void (*convert)(enum kern_wtype, const float *, void *, int);
    enum kern_wtype t;
    const float *x;
    unsigned char *dst;
    int n_in, n_tok;
    size_t act_bytes;
};

static void mm_conv_worker(void *arg, int ith, int nth) {
    const struct mm_conv *c = arg;
    for (int i = ith; i < c->n_tok; i += nth)
        c->convert(c->t, c->x + (size_t)i * c->n_in, c->dst + (size_t)i * c->act_bytes, c->n_in);
}

/* Prefill passes of at least this many elements convert on every thread:
 * quantizing a 512 x 4096 activation takes about a millisecond, which the
 * other threads would otherwise wait out at every product (the
 * conversion is scalar; a pool run costs microseconds). */
#define MM_CONV_PAR_ELEMS (16u << 10)

/* Convert x (per pass, into scratch) and run j over tokens [0, n_tok).
 * w_row is the bytes of weights per output row (chunk sizing, the serial
 * threshold); act_bytes 0 means the kernel reads x as it is. */
static void mm_run(struct kern_pool *p, struct mm_job *j, float *y, const float *x, int n_tok,
                   size_t w_row, size_t act_bytes,
                   void (*convert)(enum kern_wtype, const float *, void *, int)) {
    const int n_in = j->m.n_in, n_out = j->m.n_out;
    const int nth = kern_pool_n_threads(p);
    j->chunk_rows = mm_chunk_rows(w_row, n_out, n_tok, nth, j->row_align);
    j->tail_rows = (16 + j->row_align - 1) / j->row_align * j->row_align;
    if (j->tail_rows > j->chunk_rows)
        j->tail_rows = j->chunk_rows;
    j->nth = nth;

    _Alignas(64) unsigned char stack[MM_STACK_SCRATCH];
    unsigned char *scratch = NULL, *heap = NULL;
    int per_pass = n_tok;
    if (act_bytes == 0) {
        j->m.act = x;
        j->m.act_stride = (size_t)n_in * sizeof(float);
    } else {
        while (!scratch && per_pass > 0 &&
               !(scratch = kern_pool_scratch(p, act_bytes * (size_t)per_pass)))
            per_pass /= 2;
        if (!scratch && act_bytes <= sizeof(stack)) {
            scratch = stack;
            per_pass = (int)(sizeof(stack) / act_bytes);
        }
        if (!scratch && (heap = mem_alloc(MEM_KERN, act_bytes))) {
            scratch = heap; /* no pool, or one that cannot grow: a token a pass */
            per_pass = 1;
        }
        if (!scratch) {
            LOG_ERROR("kern", "matmul: no scratch for a %d-wide row", n_in);
            for (size_t i = 0; i < (size_t)n_tok * (size_t)n_out; i++)
                y[i] = NAN;
            return;
        }
        j->m.act_stride = act_bytes;
    }
    size_t act_row = act_bytes ? act_bytes : (size_t)n_in * sizeof(float);
    /* a multiple of 12 tokens when it can be: the prefill tiles take 3, 4,
     * 6 or 12 tokens at a time (AVX2 floats, AVX2 int8 and VNNI, AVX512
     * floats, AVX512 packs), or of tok_mult (AMX: 16); else of the rect's
     * tile (tok_tile), so that no token of a block falls to single-token
     * tiles (which load a weight vector for every FMA), and at least one
     * tile */
    const int tile = j->tok_tile ? j->tok_tile : 4, mult = j->tok_mult ? j->tok_mult : 12;
    j->tok_block = (int)(mm_l2_share() / act_row);
    j->tok_block = j->tok_block >= mult ? j->tok_block / mult * mult : j->tok_block / tile * tile;
    if (j->tok_block < tile)
        j->tok_block = tile;

    for (int t0 = 0; t0 < n_tok; t0 += per_pass) {
        int t1 = t0 + per_pass < n_tok ? t0 + per_pass : n_tok;
        if (scratch) {
            /* the pass's tokens sit at the start of scratch: offset act/y */
            struct mm_conv cv = {.convert = convert,
                                 .t = j->m.wtype,
                                 .x = x + (size_t)t0 * n_in,
                                 .dst = scratch,
                                 .n_in = n_in,
                                 .n_tok = t1 - t0,
                                 .act_bytes = act_bytes};
            if (nth > 1 && (size_t)(t1 - t0) * (size_t)n_in >= MM_CONV_PAR_ELEMS)
                kern_pool_run(p, mm_conv_worker, &cv);
            else
                mm_conv_worker(&cv, 0, 1);
            j->m.act = scratch;
            j->m.y = y + (size_t)t0 * n_out;
            j->t0 = 0;
            j->t1 = t1 - t0;
        } else {
            j->m.y = y;
            j->t0 = t0;
            j->t1 = t1;
        }
        atomic_store_explicit(&j->next_row, 0, memory_order_relaxed);
        if (w_row * (size_t)n_out * (size_t)(t1 - t0) < MM_SERIAL_BYTES)
            mm_worker(j, 0, 1); /* the same chunks, claimed by the caller alone */
        else
            kern_pool_run(p, mm_worker, j);
    }
    mem_free(heap);
}

void kern_matmul(struct kern_pool *p, float *y, const float *x, const void *w,
                 enum kern_wtype wtype, int n_in, int n_out, int n_tok) {
    if (n_tok <= 0 || n_out <= 0)
        return;
    if (n_in <= 0) { /* empty dot products (and no row to size a chunk by) */
        memset(y, 0, sizeof(float) * (size_t)n_tok * (size_t)n_out);
        return;
    }
    const size_t w_stride = kern_row_bytes(wtype, n_in);
    if (NEVER(w_stride == 0)) {
        LOG_ERROR("kern", "matmul: bad row: type %d n_in %d", (int)wtype, n_in);
        return;
    }
    const enum kern_isa isa = kern_isa();
    kern_cpu_rect_fn rect = mm_rect_for(isa, wtype);
    struct mm_job j = {
        .m = {.y = y, .w = w, .w_stride = w_stride, .wtype = wtype, .n_in = n_in, .n_out = n_out},
        .rect = rect ? rect : mm_rect_scalar, /* one portable kernel, every type */
        .row_align = 1,
        /* the AVX2 level's float tile takes 3 tokens (matmul_avx2.c): a
         * 4096-wide f16 row's 8-token blocks ran as 3 + 3 + 1 + 1 */
        .tok_tile = kern_cpu_isa_ymm16(isa) &&
                            (wtype == KERN_W_F32 || wtype == KERN_W_F16 || wtype == KERN_W_BF16)
                        ? 3
                        : 4,
    };
    size_t act_bytes = mm_act_bytes(wtype, n_in);
    void (*convert)(enum kern_wtype, const float *, void *, int) = mm_convert;
    if (wtype == KERN_W_F16 && isa >= KERN_ISA_AVX512) {
        /* f16 activations stored as f32 at this level only: its 4 x 6 tile
         * would convert 6 activation vectors beside the 4 weight ones for
         * 24 FMAs, and on Intel cores vcvtph2ps takes the FMA ports; the
         * f16 layout was measured on a Zen 3 (AVX2) alone. The values, so
         * the bits, are the same either way. */
        act_bytes = ((size_t)n_in * sizeof(float) + 63) & ~(size_t)63;
        convert = mm_convert_f16_wide;
    }
    mm_run(p, &j, y, x, n_tok, w_stride, act_bytes, convert);
}

void kern_matmul_packed(struct kern_pool *p, float *y, const float *x, const struct kern_pack *w,
                        int n_tok) {
    if (n_tok <= 0 || !w->data)
        return;
    const enum kern_isa isa = kern_isa();
    kern_cpu_rect_fn rect = isa == KERN_ISA_AMX      ? kern_cpu_pack_rect_amx(w->type)
                            : isa == KERN_ISA_AVX512 ? kern_cpu_pack_rect_avx512(w->type)
                            : isa >= KERN_ISA_AVX2   ? kern_cpu_pack_rect_avx2(w->type)
                                                     : NULL;
    struct mm_job j = {
        .m = {.y = y, .w = w->data, .wtype = w->type, .n_in = w->n_in, .n_out = w->n_out},
        .rect = rect ? rect : kern_cpu_pack_rect_scalar,
        .row_align = KERN_PACK_ROWS,
        /* AMX takes slices of 16 tokens: whole ones, however wide a row
         * (a 14336-wide row's 12-token blocks left it all to AVX512) */
        .tok_tile = isa == KERN_ISA_AMX ? 16 : 0,
        .tok_mult = isa == KERN_ISA_AMX ? 16 : 0,
    };
    const bool k = w->type == KERN_W_Q4_K || w->type == KERN_W_Q5_K || w->type == KERN_W_Q6_K;
    mm_run(p, &j, y, x, n_tok, kern_row_bytes(w->type, (size_t)w->n_in),
           k ? kern_cpu_act_q8Ks_bytes(w->n_in) : kern_cpu_act_q8s_bytes(w->n_in),
           kern_cpu_act_q8s);
}
