/* kern_matmul_fused (kernels/cpu/matmul.c): several products of one input
 * in one run give, bit for bit, what separate kern_matmul /
 * kern_matmul_packed calls give (and kern_swiglu after them, for SWIGLU),
 * at every level this machine has, on no pool and on pools of 1 to 3
 * threads, for a decode token and prefill batches (one of several passes
 * without a pool): parts that share a conversion (packs of one type, rows
 * of one type), parts that cannot (another type, packed beside unpacked,
 * the same type apart) and row counts that are not a pack's 16 (the
 * concatenated rows then have gaps). */
#include <criterion/criterion.h>
#include <string.h>

#include "tests/lib/kern_util.h"

enum { KF_N_IN = 512, KF_MAX_OUT = 96, KF_MAX_TOK = 60 };

/* A matrix of the test: its rows and, where packed, its pack. */
struct kf_w {
    enum kern_wtype t;
    int n_out;
    bool packed;
    void *rows;
    struct kern_pack pk;
};

static void kf_make(struct kf_w *w, enum kern_wtype t, int n_out, bool packed, uint64_t seed) {
    float *wf = mem_alloc(MEM_TEST, sizeof(float) * KF_N_IN * (size_t)n_out);
    kt_fill(wf, (size_t)KF_N_IN * (size_t)n_out, seed);
    *w = (struct kf_w){.t = t, .n_out = n_out, .rows = kt_make_w(t, wf, KF_N_IN, n_out)};
    mem_free(wf);
    /* packed at the highest level that packs the type; every level runs it */
    if (packed && kern_pack_supported(t, KF_N_IN)) {
        cr_assert_eq(kern_pack_make(NULL, &w->pk, t, w->rows, KF_N_IN, n_out), 0);
        w->packed = true;
    }
}

static void kf_free(struct kf_w *w) {
    kern_pack_free(&w->pk);
    mem_free(w->rows);
}

/* What the parts must hold: each product alone, on the same pool. */
static void kf_alone(struct kern_pool *p, const struct kf_w *w, float *y, const float *x,
                     int n_tok) {
    if (w->packed)
        kern_matmul_packed(p, y, x, &w->pk, n_tok);
    else
        kern_matmul(p, y, x, w->rows, w->t, KF_N_IN, w->n_out, n_tok);
}

/* Fused against alone for matrices w[0..n) at every level, pool and batch. */
static void kf_check(struct kf_w *w, int n, enum kern_mm_fuse how, const char *what) {
    float *x = mem_alloc(MEM_TEST, sizeof(float) * KF_N_IN * KF_MAX_TOK);
    kt_fill(x, (size_t)KF_N_IN * KF_MAX_TOK, 77);
    float *want[3], *got[3];
    for (int k = 0; k < n; k++) {
        want[k] = mem_alloc(MEM_TEST, sizeof(float) * KF_MAX_OUT * KF_MAX_TOK);
        got[k] = mem_alloc(MEM_TEST, sizeof(float) * KF_MAX_OUT * KF_MAX_TOK);
    }
    /* 60 tokens: without a pool the stack's scratch holds fewer, so the
     * run goes in passes, each part's output offset by its own n_out */
    const int toks[] = {1, 13, KF_MAX_TOK};
    for (size_t ii = 0; ii < kt_n_isas(); ii++) {
        kern_set_isa(kt_isas[ii]);
        for (int nt = 0; nt <= 3; nt++) {
            struct kern_pool *p = NULL;
            if (nt > 0)
                cr_assert_eq(kern_pool_create(nt, &p), 0);
            for (int ti = 0; ti < 3; ti++) {
                const int n_tok = toks[ti];
                struct kern_mm_part parts[3];
                for (int k = 0; k < n; k++) {
                    const size_t bytes = sizeof(float) * (size_t)w[k].n_out * (size_t)n_tok;
                    kf_alone(p, &w[k], want[k], x, n_tok);
                    memset(got[k], 0xA5, bytes); /* every element must be written */
                    parts[k] = (struct kern_mm_part){.y = got[k],
                                                     .pack = w[k].packed ? &w[k].pk : NULL,
                                                     .w = w[k].rows,
                                                     .wtype = w[k].t,
                                                     .n_out = w[k].n_out};
                }
                if (how == KERN_MM_SWIGLU)
                    kern_swiglu(want[0], want[0], want[1], w[0].n_out * n_tok);
                kern_matmul_fused(p, x, KF_N_IN, n_tok, parts, n, how);
                for (int k = 0; k < n; k++)
                    cr_assert_arr_eq(got[k], want[k],
                                     sizeof(float) * (size_t)w[k].n_out * (size_t)n_tok,
                                     "%s: part %d at %s, %d threads, %d tokens", what, k,
                                     kern_isa_name(kt_isas[ii]), nt, n_tok);
            }
            kern_pool_destroy(p);
        }
    }
    kern_set_isa(kern_isa_max());
    for (int k = 0; k < n; k++) {
        mem_free(want[k]);
        mem_free(got[k]);
    }
    mem_free(x);
}

/* One case: up to three matrices (type, rows, packed where the level
 * packs it), made from seeds seed, seed + 1, ... */
struct kf_case {
    const char *what;
    enum kern_mm_fuse how;
    int n;
    enum kern_wtype t[3];
    int n_out[3];
    bool packed[3];
};

static void kf_run(const struct kf_case *c, uint64_t seed) {
    struct kf_w w[3];
    for (int k = 0; k < c->n; k++)
        kf_make(&w[k], c->t[k], c->n_out[k], c->packed[k], seed + (uint64_t)k);
    kf_check(w, c->n, c->how, c->what);
    for (int k = 0; k < c->n; k++)
        kf_free(&w[k]);
}

static void kf_run_all(const struct kf_case *cases, int n) {
    for (int i = 0; i < n; i++)
        kf_run(&cases[i], 1 + 3 * (uint64_t)i);
}

#define KF_CASES(c) kf_run_all((c), (int)(sizeof(c) / sizeof((c)[0])))

Test(kern_fused, concatenated_packs_give_the_separate_bits, .timeout = 120) {
    static const struct kf_case cases[] = {
        /* 83 and 40: not multiples of 16, so the run's rows have gaps */
        {"q4_0 packs 83 + 40 + 96",
         KERN_MM_CONCAT,
         3,
         {KERN_W_Q4_0, KERN_W_Q4_0, KERN_W_Q4_0},
         {83, 40, 96},
         {true, true, true}},
        /* another type: its own run */
        {"q4_k, q4_k, q6_k packs",
         KERN_MM_CONCAT,
         3,
         {KERN_W_Q4_K, KERN_W_Q4_K, KERN_W_Q6_K},
         {64, 32, 32},
         {true, true, true}},
    };
    KF_CASES(cases);
}

Test(kern_fused, concatenated_rows_and_mixed_parts_give_the_separate_bits, .timeout = 120) {
    static const struct kf_case cases[] = {
        {"f16 rows 37 + 29 + 64",
         KERN_MM_CONCAT,
         3,
         {KERN_W_F16, KERN_W_F16, KERN_W_F16},
         {37, 29, 64},
         {false, false, false}},
        /* the same type packed and not, and a float between: nothing shares */
        {"q8_0 pack, f32 rows, q8_0 rows",
         KERN_MM_CONCAT,
         3,
         {KERN_W_Q8_0, KERN_W_F32, KERN_W_Q8_0},
         {48, 17, 48},
         {true, false, false}},
        /* unpacked q4_0 rows share at every level */
        {"q4_0 rows 35 + 50 + 19",
         KERN_MM_CONCAT,
         3,
         {KERN_W_Q4_0, KERN_W_Q4_0, KERN_W_Q4_0},
         {35, 50, 19},
         {false, false, false}},
        /* the same type apart: three runs */
        {"q4_0 pack, f16 rows, q4_0 pack",
         KERN_MM_CONCAT,
         3,
         {KERN_W_Q4_0, KERN_W_F16, KERN_W_Q4_0},
         {40, 24, 40},
         {true, false, true}},
        {"one q8_0 pack", KERN_MM_CONCAT, 1, {KERN_W_Q8_0}, {50}, {true}},
    };
    KF_CASES(cases);
}

Test(kern_fused, swiglu_gives_the_separate_bits, .timeout = 120) {
    static const struct kf_case cases[] = {
        {"q4_0 packs", KERN_MM_SWIGLU, 2, {KERN_W_Q4_0, KERN_W_Q4_0}, {83, 83}, {true, true}},
        {"f16 rows", KERN_MM_SWIGLU, 2, {KERN_W_F16, KERN_W_F16}, {61, 61}, {false, false}},
        /* gate and up of different types (no mix in model_dummy.c has
         * them, a hand-made file may): three steps */
        {"q4_k gate, q6_k up",
         KERN_MM_SWIGLU,
         2,
         {KERN_W_Q4_K, KERN_W_Q6_K},
         {64, 64},
         {true, true}},
    };
    KF_CASES(cases);
}
