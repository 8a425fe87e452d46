/* matmul.c - Y = X . W^T for every weight type: driver and portable path.
 *
 * Driver. Thread 0 converts the activation once (F16: rounded to f16, kept
 * as f16, as f32 at the AVX512 level; Q8_0/Q4_0: quantized to q8 act rows,
 * see kern_cpu.h) into the pool's scratch, then one kern_pool_run() lets the
 * threads claim contiguous chunks of output rows from an atomic counter (a
 * late or slow thread just claims fewer; the chunks shrink towards the
 * end). Within a chunk the tokens go in blocks whose activations fit in
 * L2, and the rect kernel tiles rows x tokens so each weight row read from
 * memory serves several tokens. kern_matmul_fused runs adjacent matrices
 * that read the same converted activation (Q, K and V; gate and up, with
 * SwiGLU applied to each chunk) as one such run: one conversion and one
 * pool run instead of three (two), and no SwiGLU pass on the caller alone
 * (docs/benchmarks.md, "Decode: Q, K, V and gate, up in one run").
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

/* A run multiplies one activation by up to MM_MAX_PARTS matrices
 * (kern_matmul_fused; one for kern_matmul[_packed]) that read it in the
 * same converted form. Concatenated parts lie one after another in the
 * run's rows (part i from row0[i], a multiple of row_align); SwiGLU's two
 * parts share their rows, and a chunk ends with the gate's y = silu(gate)
 * * up for its rows. */
#define MM_MAX_PARTS 3

struct mm_job {
    struct kern_mm m[MM_MAX_PARTS];
    kern_cpu_rect_fn rect[MM_MAX_PARTS];
    float *y[MM_MAX_PARTS]; /* each part's whole output */
    int row0[MM_MAX_PARTS]; /* concatenated: part i's first row among the run's */
    int n_parts;
    bool swiglu;    /* parts 0 and 1 share rows: y0 = silu(y0) * y1 after each chunk */
    int n_rows;     /* the run's rows */
    int row_align;  /* chunks start at multiples of it: 1, or a pack's 16 rows */
    int t0, t1;     /* tokens of this pass */
    int tok_block;  /* tokens per L2 block */
    int tok_tile;   /* below tok_mult a block is a multiple of this: the rect's prefill tile */
    int tok_mult;   /* a block is a multiple of this when it can be (0: 12) */
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

/* Rows [r0, r1) of the run for tokens [t, te): each part's share. */
static void mm_chunk(const struct mm_job *j, int r0, int r1, int t, int te) {
    if (j->swiglu) {
        j->rect[0](&j->m[0], r0, r1, t, te);
        j->rect[1](&j->m[1], r0, r1, t, te);
        for (int i = t; i < te; i++) {
            float *g = j->m[0].y + (size_t)i * (size_t)j->m[0].n_out + r0;
            kern_swiglu(g, g, j->m[1].y + (size_t)i * (size_t)j->m[1].n_out + r0, r1 - r0);
        }
        return;
    }
    for (int k = 0; k < j->n_parts; k++) {
        const int a = r0 > j->row0[k] ? r0 : j->row0[k];
        const int e = j->row0[k] + j->m[k].n_out;
        const int b = r1 < e ? r1 : e;
        if (a < b)
            j->rect[k](&j->m[k], a - j->row0[k], b - j->row0[k], t, te);
    }
}

static void mm_worker(void *arg, int ith, int nth) {
    (void)ith;
    (void)nth;
    struct mm_job *j = arg;
    int r0 = atomic_load_explicit(&j->next_row, memory_order_relaxed);
    for (;;) {
        if (r0 >= j->n_rows)
            return;
        const int r1 = r0 + mm_chunk_at(j, j->n_rows - r0); /* r0: a multiple of row_align */
        if (!atomic_compare_exchange_weak_explicit(&j->next_row, &r0, r1, memory_order_relaxed,
                                                   memory_order_relaxed))
            continue; /* r0 now holds the row another thread left */
        for (int t = j->t0; t < j->t1; t += j->tok_block) {
            int te = t + j->tok_block < j->t1 ? t + j->tok_block : j->t1;
            mm_chunk(j, r0, r1, t, te);
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

/* Set a part's output and activation for the pass starting at token t0
 * (act: its first token's converted row, or x's). */
static void mm_bind(struct mm_job *j, const void *act, size_t act_stride, size_t t0) {
    for (int k = 0; k < j->n_parts; k++) {
        j->m[k].act = act;
        j->m[k].act_stride = act_stride;
        j->m[k].y = j->y[k] + t0 * (size_t)j->m[k].n_out;
    }
}

/* Convert x (per pass, into scratch) and run j's parts (outputs j->y,
 * j->n_rows rows in all) over tokens [0, n_tok). w_row is the bytes of
 * weights a chunk reads per row (chunk sizing), w_bytes all the parts'
 * weights (the serial threshold); act_bytes 0 means the kernels read x as
 * it is. */
static void mm_run(struct kern_pool *p, struct mm_job *j, const float *x, int n_tok, size_t w_row,
                   size_t w_bytes, size_t act_bytes,
                   void (*convert)(enum kern_wtype, const float *, void *, int)) {
    const int n_in = j->m[0].n_in, n_out = j->n_rows;
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
        mm_bind(j, x, (size_t)n_in * sizeof(float), 0);
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
            for (int k = 0; k < j->n_parts; k++)
                for (size_t i = 0; i < (size_t)n_tok * (size_t)j->m[k].n_out; i++)
                    j->y[k][i] = NAN;
            return;
        }
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
                                 .t = j->m[0].wtype,
                                 .x = x + (size_t)t0 * n_in,
                                 .dst = scratch,
                                 .n_in = n_in,
                                 .n_tok = t1 - t0,
                                 .act_bytes = act_bytes};
            if (nth > 1 && (size_t)(t1 - t0) * (size_t)n_in >= MM_CONV_PAR_ELEMS)
                kern_pool_run(p, mm_conv_worker, &cv);
            else
                mm_conv_worker(&cv, 0, 1);
            mm_bind(j, scratch, act_bytes, (size_t)t0);
            j->t0 = 0;
            j->t1 = t1 - t0;
        } else {
            j->t0 = t0;
            j->t1 = t1;
        }
        atomic_store_explicit(&j->next_row, 0, memory_order_relaxed);
        if (w_bytes * (size_t)(t1 - t0) < MM_SERIAL_BYTES)
            mm_worker(j, 0, 1); /* the same chunks, claimed by the caller alone */
        else
            kern_pool_run(p, mm_worker, j);
    }
    mem_free(heap);
}

/* How one matrix runs: its kernel, its chunking constraints and how its
 * activation is converted. Parts whose plans agree on everything but the
 * matrix can share one converted activation and one run. */
struct mm_plan {
    struct kern_mm m;
    kern_cpu_rect_fn rect;
    int row_align, tok_tile, tok_mult;
    size_t w_row;     /* bytes of the matrix per row, as the file has it */
    size_t act_bytes; /* of a converted activation row; 0: x as it is */
    void (*convert)(enum kern_wtype, const float *, void *, int);
};

/* The plan for n_out rows w of type wtype; false for a type without rows
 * (kern_row_bytes 0). n_in > 0. */
static bool mm_plan_rows(struct mm_plan *pl, const void *w, enum kern_wtype wtype, int n_in,
                         int n_out) {
    const size_t w_stride = kern_row_bytes(wtype, n_in);
    if (NEVER(w_stride == 0)) {
        LOG_ERROR("kern", "matmul: bad row: type %d n_in %d", (int)wtype, n_in);
        return false;
    }
    const enum kern_isa isa = kern_isa();
    kern_cpu_rect_fn rect = mm_rect_for(isa, wtype);
    *pl = (struct mm_plan){
        .m = {.w = w, .w_stride = w_stride, .wtype = wtype, .n_in = n_in, .n_out = n_out},
        .rect = rect ? rect : mm_rect_scalar, /* one portable kernel, every type */
        .row_align = 1,
        /* the AVX2 level's float tile takes 3 tokens (matmul_avx2.c): a
         * 4096-wide f16 row's 8-token blocks ran as 3 + 3 + 1 + 1 */
        .tok_tile = kern_cpu_isa_ymm16(isa) &&
                            (wtype == KERN_W_F32 || wtype == KERN_W_F16 || wtype == KERN_W_BF16)
                        ? 3
                        : 4,
        .w_row = w_stride,
        .act_bytes = mm_act_bytes(wtype, n_in),
        .convert = mm_convert,
    };
    if (wtype == KERN_W_F16 && isa >= KERN_ISA_AVX512) {
        /* f16 activations stored as f32 at this level only: its 4 x 6 tile
         * would convert 6 activation vectors beside the 4 weight ones for
         * 24 FMAs, and on Intel cores vcvtph2ps takes the FMA ports; the
         * f16 layout was measured on a Zen 3 (AVX2) alone. The values, so
         * the bits, are the same either way. */
        pl->act_bytes = ((size_t)n_in * sizeof(float) + 63) & ~(size_t)63;
        pl->convert = mm_convert_f16_wide;
    }
    return true;
}

static void mm_plan_pack(struct mm_plan *pl, const struct kern_pack *w) {
    const enum kern_isa isa = kern_isa();
    kern_cpu_rect_fn rect = isa == KERN_ISA_AMX      ? kern_cpu_pack_rect_amx(w->type)
                            : isa == KERN_ISA_AVX512 ? kern_cpu_pack_rect_avx512(w->type)
                            : isa >= KERN_ISA_AVX2   ? kern_cpu_pack_rect_avx2(w->type)
                                                     : NULL;
    const bool k = w->type == KERN_W_Q4_K || w->type == KERN_W_Q5_K || w->type == KERN_W_Q6_K;
    *pl = (struct mm_plan){
        .m = {.w = w->data, .wtype = w->type, .n_in = w->n_in, .n_out = w->n_out},
        .rect = rect ? rect : kern_cpu_pack_rect_scalar,
        .row_align = KERN_PACK_ROWS,
        /* AMX takes slices of 16 tokens: whole ones, however wide a row
         * (a 14336-wide row's 12-token blocks left it all to AVX512) */
        .tok_tile = isa == KERN_ISA_AMX ? 16 : 0,
        .tok_mult = isa == KERN_ISA_AMX ? 16 : 0,
        .w_row = kern_row_bytes(w->type, (size_t)w->n_in),
        .act_bytes = k ? kern_cpu_act_q8Ks_bytes(w->n_in) : kern_cpu_act_q8s_bytes(w->n_in),
        .convert = kern_cpu_act_q8s,
    };
}

/* Whether b can share a's converted activation and run: the same
 * conversion (of the same type: a pack's sums depend on it) and the same
 * chunk and token-block rules. */
static bool mm_plan_same_act(const struct mm_plan *a, const struct mm_plan *b) {
    return a->m.wtype == b->m.wtype && a->m.n_in == b->m.n_in && a->convert == b->convert &&
           a->act_bytes == b->act_bytes && a->row_align == b->row_align &&
           a->tok_tile == b->tok_tile && a->tok_mult == b->tok_mult;
}

/* Run n plans (1 <= n <= MM_MAX_PARTS, all mm_plan_same_act) over x: one
 * conversion, one pool run; swiglu: two plans of the same rows. */
static void mm_run_plans(struct kern_pool *p, const struct mm_plan *pl, float *const *y, int n,
                         bool swiglu, const float *x, int n_tok) {
    struct mm_job j = {.n_parts = n,
                       .swiglu = swiglu,
                       .row_align = pl[0].row_align,
                       .tok_tile = pl[0].tok_tile,
                       .tok_mult = pl[0].tok_mult};
    size_t w_row = 0, w_bytes = 0;
    int rows = 0;
    for (int k = 0; k < n; k++) {
        j.m[k] = pl[k].m;
        j.rect[k] = pl[k].rect;
        j.y[k] = y[k];
        j.row0[k] = swiglu ? 0 : rows;
        rows = (rows + pl[k].m.n_out + j.row_align - 1) / j.row_align * j.row_align;
        w_bytes += pl[k].w_row * (size_t)pl[k].m.n_out;
        /* a chunk reads a row of every part when the rows are shared, of
         * one part (the widest row sizes it) when they are concatenated */
        w_row = swiglu ? w_row + pl[k].w_row : w_row > pl[k].w_row ? w_row : pl[k].w_row;
    }
    j.n_rows = swiglu ? pl[0].m.n_out : j.row0[n - 1] + pl[n - 1].m.n_out;
    mm_run(p, &j, x, n_tok, w_row, w_bytes, pl[0].act_bytes, pl[0].convert);
}

void kern_matmul(struct kern_pool *p, float *y, const float *x, const void *w,
                 enum kern_wtype wtype, int n_in, int n_out, int n_tok) {
    if (n_tok <= 0 || n_out <= 0)
        return;
    if (n_in <= 0) { /* empty dot products (and no row to size a chunk by) */
        memset(y, 0, sizeof(float) * (size_t)n_tok * (size_t)n_out);
        return;
    }
    struct mm_plan pl;
    if (mm_plan_rows(&pl, w, wtype, n_in, n_out))
        mm_run_plans(p, &pl, &y, 1, false, x, n_tok);
}

void kern_matmul_packed(struct kern_pool *p, float *y, const float *x, const struct kern_pack *w,
                        int n_tok) {
    if (n_tok <= 0 || !w->data)
        return;
    struct mm_plan pl;
    mm_plan_pack(&pl, w);
    mm_run_plans(p, &pl, &y, 1, false, x, n_tok);
}

/* One part as kern_matmul or kern_matmul_packed would run it. */
static void mm_part_alone(struct kern_pool *p, const struct kern_mm_part *pt, const float *x,
                          int n_in, int n_tok) {
    if (pt->pack && pt->pack->data)
        kern_matmul_packed(p, pt->y, x, pt->pack, n_tok);
    else
        kern_matmul(p, pt->y, x, pt->w, pt->wtype, n_in, pt->n_out, n_tok);
}

void kern_matmul_fused(struct kern_pool *p, const float *x, int n_in, int n_tok,
                       const struct kern_mm_part *parts, int n_parts, enum kern_mm_fuse how) {
    if (n_tok <= 0 || n_parts <= 0)
        return;
    const bool swiglu = how == KERN_MM_SWIGLU;
    if (NEVER(n_parts > MM_MAX_PARTS || (how != KERN_MM_CONCAT && !swiglu) ||
              (swiglu && (n_parts != 2 || parts[0].n_out != parts[1].n_out)))) {
        LOG_ERROR("kern", "matmul_fused: %d parts (%s)", n_parts, swiglu ? "swiglu" : "concat");
        return;
    }
    struct mm_plan pl[MM_MAX_PARTS];
    float *y[MM_MAX_PARTS];
    bool planned = n_in > 0;
    for (int k = 0; k < n_parts && planned; k++) {
        const struct kern_mm_part *pt = &parts[k];
        if (pt->n_out <= 0)
            planned = false;
        else if (pt->pack && pt->pack->data)
            mm_plan_pack(&pl[k], pt->pack);
        else
            planned = mm_plan_rows(&pl[k], pt->w, pt->wtype, n_in, pt->n_out);
        y[k] = pt->y;
    }
    if (swiglu) {
        if (planned && mm_plan_same_act(&pl[0], &pl[1])) {
            mm_run_plans(p, pl, y, 2, true, x, n_tok);
        } else { /* the same bits, in three steps */
            mm_part_alone(p, &parts[0], x, n_in, n_tok);
            mm_part_alone(p, &parts[1], x, n_in, n_tok);
            if (parts[0].n_out > 0)
                kern_swiglu(parts[0].y, parts[0].y, parts[1].y,
                            (int)((size_t)n_tok * (size_t)parts[0].n_out));
        }
        return;
    }
    /* concatenated: each run of parts that share an activation together */
    for (int k = 0; k < n_parts;) {
        int e = k + 1;
        while (planned && e < n_parts && mm_plan_same_act(&pl[k], &pl[e]))
            e++;
        if (planned && e - k > 1)
            mm_run_plans(p, pl + k, y + k, e - k, false, x, n_tok);
        else
            mm_part_alone(p, &parts[k], x, n_in, n_tok);
        k = e;
    }
}
