/* The qwen2 and qwen3 architectures (model.h, enum model_arch) end to end
 * on dummy models of the tiny shape, f32 weights, f32 KV.
 *
 * qwen2 (Q/K/V biases, NEOX RoPE): greedy ids equal llama.cpp's. The
 * oracle is llama.cpp c392e50, through tests/data/llamacpp_greedy.c (its
 * header says how to build it):
 *   llmd dummy -s tiny -t f32 -a qwen2 -o tiny-qwen2.gguf
 *   llamacpp_greedy tiny-qwen2.gguf 32 "Once upon a time" "Hello, world!" ""
 * (the file is regenerated from a fixed seed: the same bytes every time).
 *
 * llama3 (llama, RoPE base 500000, Llama 3.1's rope_freqs.weight): greedy
 * ids on a 371-token prompt equal llama.cpp's, and differ without the
 * factors.
 *
 * qwen3 (per-head RMSNorm of Q and K, head_dim 32 from key_length while
 * n_embd / n_head is 16, NEOX RoPE): llama.cpp c392e50 predates Qwen3 and
 * refuses the file ("unknown model architecture: 'qwen3'"), so there is no
 * oracle at the pinned commit. Checked instead by what the architecture
 * implies: scaling one head's rows of W_q or W_k by any factor leaves every
 * logit unchanged (only an RMSNorm over that head makes that true), while
 * scaling a row of W_v does change them (the check can fail); the logits
 * do not depend on how the prompt is chunked; and it shares the NEOX RoPE
 * that the qwen2 oracle checks. */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <string.h>
#include <unistd.h>

#include "engine/model/gguf.h"
#include "llmd.h"
#include "engine/model/kv.h"
#include "engine/model/model.h"
#include "engine/model/model_dummy.h"
#include "engine/model/model_forward.h"
#include "engine/model/tok.h"
#include "kernels/kern.h"
#include "mem.h"

#define N_GEN 32

struct arch_ref {
    const char *prompt;
    int32_t greedy[N_GEN];
};

/* llama.cpp c392e50 on tiny:f32:qwen2 (command above) */
static const struct arch_ref qwen2_refs[] = {
    {"Once upon a time",
     {42,  246, 508, 374, 246, 221, 338, 392, 472, 366, 246, 221, 48,  460, 235, 260,
      401, 358, 70,  480, 228, 314, 358, 70,  246, 483, 70,  480, 228, 314, 480, 246}},
    {"Hello, world!",
     {221, 140, 392, 472, 366, 474, 5,  9,   374, 380, 303, 289, 314, 480, 140, 246,
      99,  246, 99,  246, 99,  143, 62, 377, 163, 413, 163, 283, 28,  5,   9,   374}},
    {"", {408, 462, 90,  28,  140, 28, 140, 377, 163, 90,  221, 140, 377, 180, 400, 504,
          90,  432, 474, 221, 140, 72, 261, 99,  294, 362, 408, 432, 221, 140, 72,  261}},
};

/* llama.cpp c392e50 on tiny:f32:llama3 (llama, RoPE base 500000, Llama
 * 3.1's rope_freqs.weight): `llamacpp_greedy tiny-llama3.gguf 32 "$P"` with
 * P the sentence below nine times, 371 prompt tokens, so positions reach
 * where the scaled (long-wavelength) pairs turn. */
#define LLAMA3_SENTENCE "Once upon a time there was a little dog. "
static const int32_t llama3_ref[N_GEN] = {464, 225, 346, 148, 298, 405, 55,  65,  212, 419, 401,
                                          340, 232, 474, 33,  0,   174, 422, 288, 384, 152, 476,
                                          149, 95,  442, 174, 422, 288, 384, 152, 476, 149};

struct run {
    struct model *m;
    struct kern_pool *pool;
    struct kv_cache *kv;
    struct model_ctx *ctx;
    uint32_t seq;
    float *logits;
};

static void run_open(struct run *r, const char *spec) {
    char err[512] = "";
    cr_assert_eq(model_load(spec, &(struct model_load_opts){.quiet = true}, &r->m, err, sizeof err),
                 0, "load %s: %s", spec, err);
    struct kv_config kc = {.dtype = KV_F32, .n_ctx = 512, .n_seqs = 1};
    cr_assert_eq(kv_cache_create(&r->m->hp, &kc, &r->kv, err, sizeof err), 0, "kv: %s", err);
    cr_assert_eq(kern_pool_create(1, &r->pool), 0);
    cr_assert_eq(model_ctx_create(r->m, r->pool, 64, &r->ctx), 0);
    cr_assert_eq(kv_seq_open(r->kv, &r->seq), 0);
    r->logits = mem_alloc(MEM_TEST, r->m->hp.n_vocab * sizeof(float));
}

static void run_close(struct run *r) {
    kv_seq_close(r->kv, r->seq);
    mem_free(r->logits);
    model_ctx_destroy(r->ctx);
    kern_pool_destroy(r->pool);
    kv_cache_destroy(r->kv);
    model_free(r->m);
}

static void run_restart(struct run *r) {
    kv_seq_close(r->kv, r->seq);
    cr_assert_eq(kv_seq_open(r->kv, &r->seq), 0);
}

/* ids[0..n) at positions pos.. in chunks of `chunk`, the last logits kept */
static void feed(struct run *r, const int32_t *ids, uint32_t n, uint32_t pos, uint32_t chunk) {
    for (uint32_t i = 0; i < n; i += chunk) {
        uint32_t k = n - i < chunk ? n - i : chunk;
        cr_assert_eq(kv_seq_reserve(r->kv, r->seq, pos + i + k), 0);
        cr_assert_eq(model_forward(r->ctx, r->kv, r->seq, ids + i, k, pos + i,
                                   i + k == n ? r->logits : NULL),
                     0);
    }
}

static int32_t argmax(const float *x, uint32_t n) {
    uint32_t best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return (int32_t)best;
}

/* The prompt's ids as llama.cpp tokenizes it (BOS, the SentencePiece
 * prefix): the dummy vocabulary is byte by byte. */
static uint32_t prompt_ids(const struct run *r, const char *p, int32_t *ids, size_t cap) {
    size_t n = 0;
    cr_assert_eq(tok_encode(r->m->tok, p, strlen(p), true, ids, cap, &n), 0);
    return (uint32_t)n;
}

Test(model_arch, qwen2_greedy_equals_llamacpp, .timeout = 60) {
    struct run r;
    run_open(&r, "dummy:tiny:f32:qwen2");
    cr_assert_eq(r.m->hp.arch, MODEL_ARCH_QWEN2);
    cr_assert(r.m->hp.rope_neox);
    cr_assert_not_null(r.m->layers[1].bv, "the V bias is bound");
    for (size_t k = 0; k < sizeof(qwen2_refs) / sizeof(qwen2_refs[0]); k++) {
        const struct arch_ref *ref = &qwen2_refs[k];
        int32_t ids[128];
        uint32_t n = prompt_ids(&r, ref->prompt, ids, 64);
        run_restart(&r);
        feed(&r, ids, n, 0, 8);
        for (int i = 0; i < N_GEN; i++) {
            int32_t t = argmax(r.logits, r.m->hp.n_vocab);
            cr_assert_eq(t, ref->greedy[i], "'%s' token %d: llmd %d, llama.cpp %d", ref->prompt, i,
                         t, ref->greedy[i]);
            feed(&r, &t, 1, n + (uint32_t)i, 1);
        }
    }
    run_close(&r);
}

/* Greedy ids after ids[0..n), from a fresh sequence. */
static void greedy(struct run *r, const int32_t *ids, uint32_t n, int32_t *out) {
    run_restart(r);
    feed(r, ids, n, 0, 64);
    for (int i = 0; i < N_GEN; i++) {
        out[i] = argmax(r->logits, r->m->hp.n_vocab);
        feed(r, &out[i], 1, n + (uint32_t)i, 1);
    }
}

Test(model_arch, llama3_rope_scaling_equals_llamacpp, .timeout = 60) {
    struct run r;
    run_open(&r, "dummy:tiny:f32:llama3");
    cr_assert_eq(r.m->hp.arch, MODEL_ARCH_LLAMA);
    cr_assert_not_null(r.m->rope_freqs, "rope_freqs.weight is bound");
    cr_assert_float_eq(r.m->hp.rope_base, 500000.0f, 0);
    char prompt[512] = "";
    for (int i = 0; i < 9; i++)
        strcat(prompt, LLAMA3_SENTENCE);
    int32_t ids[512], got[N_GEN];
    uint32_t n = prompt_ids(&r, prompt, ids, 512);
    cr_assert_eq(n, 371);
    greedy(&r, ids, n, got);
    for (int i = 0; i < N_GEN; i++)
        cr_assert_eq(got[i], llama3_ref[i], "token %d: llmd %d, llama.cpp %d", i, got[i],
                     llama3_ref[i]);
    /* without the factors the ids are others: the comparison above tests them */
    const float *ff = r.m->rope_freqs;
    r.m->rope_freqs = NULL;
    greedy(&r, ids, n, got);
    r.m->rope_freqs = ff;
    cr_assert_neq(memcmp(got, llama3_ref, sizeof got), 0, "the scaling changed no id");
    run_close(&r);
}

/* The last logits of `prompt` after the forward pass, in chunks of chunk. */
static void logits_of(struct run *r, const int32_t *ids, uint32_t n, uint32_t chunk, float *out) {
    run_restart(r);
    feed(r, ids, n, 0, chunk);
    memcpy(out, r->logits, r->m->hp.n_vocab * sizeof(float));
}

static float max_diff(const float *a, const float *b, uint32_t n) {
    float d = 0;
    for (uint32_t i = 0; i < n; i++)
        d = fmaxf(d, fabsf(a[i] - b[i]));
    return d;
}

/* Scale rows [r0, r0 + n) of an f32 matrix in the model's (writable, in
 * memory) dummy image by f. */
static void scale_rows(const struct model_w *w, uint32_t r0, uint32_t n, float f) {
    cr_assert_eq(w->type, KERN_W_F32);
    float *p = (float *)w->data + (size_t)r0 * w->n_in;
    for (size_t i = 0; i < (size_t)n * w->n_in; i++)
        p[i] *= f;
}

Test(model_arch, qwen3_q_and_k_heads_are_normalised, .timeout = 60) {
    struct run r;
    run_open(&r, "dummy:tiny:f32:qwen3");
    const struct model_hparams *hp = &r.m->hp;
    cr_assert_eq(hp->arch, MODEL_ARCH_QWEN3);
    cr_assert_eq(hp->head_dim, 32, "key_length, not n_embd / n_head = %u", hp->n_embd / hp->n_head);
    cr_assert_eq(r.m->layers[0].wq.n_out, hp->n_head * 32);
    cr_assert_eq(r.m->layers[0].wo.n_in, hp->n_head * 32);
    uint32_t nv = hp->n_vocab;
    float *base = mem_alloc(MEM_TEST, nv * sizeof(float)), *x = mem_alloc(MEM_TEST, nv * 4);
    int32_t ids[64];
    uint32_t n = prompt_ids(&r, "Once upon a time", ids, 64);
    logits_of(&r, ids, n, 64, base);
    logits_of(&r, ids, n, 5, x);
    cr_assert_eq(max_diff(base, x, nv), 0.0f, "chunking changes the logits");
    /* head 1 of W_q times 7 and head 0 of W_k times 0.25, in every layer:
     * the per-head RMSNorm takes the scale out (up to eps and rounding) */
    for (uint32_t il = 0; il < hp->n_layer; il++) {
        scale_rows(&r.m->layers[il].wq, hp->head_dim, hp->head_dim, 7.0f);
        scale_rows(&r.m->layers[il].wk, 0, hp->head_dim, 0.25f);
    }
    logits_of(&r, ids, n, 64, x);
    float d = max_diff(base, x, nv);
    cr_assert_lt(d, 1e-3f, "scaled Q/K heads moved a logit by %g", d);
    cr_assert_eq(argmax(x, nv), argmax(base, nv));
    /* a V row scaled is not normalised away: this check can fail */
    scale_rows(&r.m->layers[0].wv, 0, 1, 7.0f);
    logits_of(&r, ids, n, 64, x);
    cr_assert_gt(max_diff(base, x, nv), 1e-2f, "scaling W_v changed nothing");
    mem_free(base);
    mem_free(x);
    run_close(&r);
}

Test(model_arch, unknown_dummy_architectures_are_refused) {
    struct model *m;
    char err[512] = "";
    cr_assert_eq(model_load("dummy:tiny:f32:mamba", &(struct model_load_opts){.quiet = true}, &m,
                            err, sizeof err),
                 -EINVAL);
    cr_assert(
        strstr(err,
               "unknown architecture 'mamba' (llama, qwen2, qwen3, llama3, phi3, mistral-swa)"),
        "%s", err);
}

/* A rope_freqs.weight factor of 0 (or NaN) would give NaN logits with no
 * error: refused at load, naming the pair. */
Test(model_arch, a_zero_rope_factor_is_refused) {
    void *buf;
    size_t len;
    char err[512] = "";
    cr_assert_eq(model_dummy_write_mem("tiny:f32:llama3", &buf, &len, err, sizeof err), 0, "%s",
                 err);
    struct gguf *g;
    cr_assert_eq(gguf_open_mem(buf, len, &g, err, sizeof err), 0, "%s", err);
    const struct gguf_tensor *t = gguf_find_tensor(g, "rope_freqs.weight");
    cr_assert_not_null(t);
    size_t off = (size_t)((const char *)t->data - (const char *)buf) + 3 * sizeof(float);
    gguf_close(g);
    memset((char *)buf + off, 0, sizeof(float)); /* pair 3's factor: 0 */
    char path[] = "/tmp/llmd-arch-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, buf, len), (ssize_t)len);
    close(fd);
    mem_free(buf);
    struct model *m;
    int rc = model_load(path, &(struct model_load_opts){.quiet = true}, &m, err, sizeof err);
    unlink(path);
    cr_assert_eq(rc, -EINVAL);
    cr_assert(strstr(err, "rope_freqs.weight[3] = 0 is not a finite positive factor"), "%s", err);
}

/* phi3 (fused Q/K/V and gate/up, NEOX RoPE, a 32-token sliding window on
 * every layer): 128 greedy ids, four windows, equal llama.cpp c392e50's:
 *   llmd dummy -s tiny -t f32 -a phi3 -o tiny-phi3.gguf
 *   llamacpp_greedy tiny-phi3.gguf 128 "Once upon a time" "$PHI3_LONG"
 * The second prompt (116 tokens) is longer than the window, so the prefill
 * masks too. Without the window (n_swa 0) the ids part from llama.cpp's:
 * the check can fail. */
#define PHI3_GEN 128
#define PHI3_LONG                                                                                  \
    "The old lighthouse keeper climbed the stairs every night, counting each step, and the sea "   \
    "answered him with waves."
static const struct {
    const char *prompt;
    int32_t greedy[PHI3_GEN];
} phi3_refs[] = {
    {"Once upon a time",
     {197, 79,  267, 48,  333, 339, 183, 425, 350, 339, 183, 425, 350, 55,  260, 164, 172, 501, 28,
      397, 260, 197, 451, 213, 125, 22,  197, 451, 213, 493, 136, 260, 401, 493, 136, 119, 197, 79,
      19,  183, 122, 28,  374, 400, 125, 495, 139, 326, 425, 218, 481, 350, 339, 183, 425, 415, 6,
      139, 435, 319, 263, 146, 58,  68,  371, 465, 261, 118, 423, 210, 371, 88,  507, 161, 506, 17,
      126, 476, 509, 453, 303, 319, 9,   105, 25,  76,  479, 222, 161, 506, 245, 378, 42,  246, 164,
      284, 238, 480, 273, 288, 42,  90,  85,  191, 110, 171, 506, 234, 487, 387, 207, 51,  102, 146,
      29,  287, 1,   510, 174, 124, 155, 392, 300, 5,   430, 410, 17,  165}},
    {PHI3_LONG,
     {15,  48,  164, 392, 335, 339, 88,  436, 392, 303, 16,  461, 470, 438, 458, 377, 423, 268, 423,
      268, 423, 268, 241, 335, 41,  425, 279, 447, 9,   303, 303, 73,  272, 398, 174, 239, 60,  319,
      263, 506, 17,  165, 495, 100, 464, 464, 279, 313, 229, 497, 297, 479, 205, 89,  251, 274, 255,
      313, 229, 4,   200, 371, 389, 467, 362, 54,  250, 173, 213, 422, 354, 360, 148, 124, 223, 425,
      343, 407, 390, 413, 482, 161, 96,  139, 506, 281, 178, 363, 13,  275, 352, 251, 222, 206, 161,
      506, 124, 223, 425, 32,  489, 269, 55,  317, 68,  68,  68,  68,  412, 251, 294, 294, 294, 294,
      294, 294, 294, 294, 294, 294, 294, 294, 294, 294, 255, 300, 408, 504}},
};

/* The first of PHI3_GEN greedy ids that differs from ref, or PHI3_GEN. */
static int phi3_run(struct run *r, const char *prompt, const int32_t *ref, uint32_t chunk) {
    int32_t ids[160];
    uint32_t n = prompt_ids(r, prompt, ids, 160);
    run_restart(r);
    feed(r, ids, n, 0, chunk);
    for (int i = 0; i < PHI3_GEN; i++) {
        int32_t t = argmax(r->logits, r->m->hp.n_vocab);
        if (t != ref[i])
            return i;
        feed(r, &t, 1, n + (uint32_t)i, 1);
    }
    return PHI3_GEN;
}

Test(model_arch, phi3_sliding_window_equals_llamacpp, .timeout = 60) {
    struct run r;
    run_open(&r, "dummy:tiny:f32:phi3");
    cr_assert_eq(r.m->hp.arch, MODEL_ARCH_PHI3);
    cr_assert_eq(r.m->hp.n_swa, 32);
    cr_assert(r.m->hp.rope_neox);
    /* the fused matrices' parts, on the file's rows (no copies: model.h):
     * Q's rows start the fused tensor, K's follow Q's, up's follow gate's */
    struct model *rows;
    char err[256] = "";
    cr_assert_eq(model_load("dummy:tiny:f32:phi3",
                            &(struct model_load_opts){.quiet = true, .no_pack = true}, &rows, err,
                            sizeof(err)),
                 0, "%s", err);
    const struct model_layer *L = &rows->layers[1];
    const struct gguf_tensor *qkv = gguf_find_tensor(rows->gguf, "blk.1.attn_qkv.weight"),
                             *gu = gguf_find_tensor(rows->gguf, "blk.1.ffn_up.weight");
    cr_assert(qkv && gu);
    cr_assert_eq(L->wq.data, qkv->data);
    cr_assert_eq((const char *)L->wk.data - (const char *)L->wq.data,
                 (ptrdiff_t)(L->wq.n_out * L->wq.n_in * sizeof(float)));
    cr_assert_eq(L->w_gate.data, gu->data);
    cr_assert_eq((const char *)L->w_up.data - (const char *)L->w_gate.data,
                 (ptrdiff_t)(rows->hp.n_ff * rows->hp.n_embd * sizeof(float)));
    model_free(rows);
    for (size_t k = 0; k < sizeof(phi3_refs) / sizeof(phi3_refs[0]); k++) {
        int at = phi3_run(&r, phi3_refs[k].prompt, phi3_refs[k].greedy, 8);
        cr_assert_eq(at, PHI3_GEN, "'%.20s...' token %d differs from llama.cpp's",
                     phi3_refs[k].prompt, at);
        /* chunks of 64 (the context's most), the long prompt's window edge inside one: the same ids
         */
        cr_assert_eq(phi3_run(&r, phi3_refs[k].prompt, phi3_refs[k].greedy, 64), PHI3_GEN);
    }
    r.m->hp.n_swa = 0; /* attend to everything: llama.cpp's ids are lost */
    int at = phi3_run(&r, PHI3_LONG, phi3_refs[1].greedy, 8);
    cr_assert_lt(at, PHI3_GEN, "the window made no difference");
    cr_log_info("without the window the ids part from llama.cpp's at token %d", at);
    run_close(&r);
}

/* The engine on the phi3 dummy (pages of 16 tokens, f32 KV): a generation of
 * four windows gives llama.cpp's ids, and after every step the sequence
 * holds at most ceil(32 / 16) + 2 = 4 pages (the window's, the one being
 * written, one mapped ahead); the pages behind it went back to the pool,
 * some into the prefix cache. Two requests at once, the long prompt too
 * (its prefill already leaves the window behind). */
struct phi3_job {
    int32_t out[PHI3_GEN];
    uint32_t n_out;
    enum llmd_finish finish;
};

static void phi3_on_token(void *user, uint64_t id, int32_t token, const char *text, size_t len,
                          enum llmd_finish finish) {
    (void)id;
    (void)text;
    (void)len;
    struct phi3_job *j = user;
    if (token >= 0 && j->n_out < PHI3_GEN)
        j->out[j->n_out++] = token;
    j->finish = finish;
}

Test(model_arch, phi3_engine_holds_a_window_of_pages, .timeout = 60) {
    struct llmd_engine_config cfg = {.model = "dummy:tiny:f32:phi3",
                                     .n_threads = 2,
                                     .n_ctx = 512,
                                     .max_seqs = 2,
                                     .kv_type = LLMD_KV_F32,
                                     .page_bytes = 16 * 512};
    struct llmd_engine *e;
    char err[512] = "";
    cr_assert_eq(llmd_engine_open(&cfg, &e, err, sizeof err), 0, "%s", err);
    struct llmd_engine_info info;
    llmd_engine_info_get(e, &info);
    cr_assert_eq(info.tokens_per_page, 16);
    static struct phi3_job jobs[2];
    uint64_t id[2];
    for (int k = 0; k < 2; k++) {
        memset(&jobs[k], 0, sizeof jobs[k]);
        struct llmd_request r = {.prompt = phi3_refs[k].prompt,
                                 .prompt_len = strlen(phi3_refs[k].prompt),
                                 .max_tokens = PHI3_GEN,
                                 .temperature = 0,
                                 .on_token = phi3_on_token,
                                 .user = &jobs[k]};
        cr_assert_eq(llmd_submit(e, &r, &id[k], NULL), 0);
    }
    uint32_t most = 0;
    int live;
    while ((live = llmd_engine_step(e)) > 0) {
        for (int k = 0; k < 2; k++) {
            uint32_t pages[64];
            int n = llmd_request_pages(e, id[k], pages, 64);
            uint32_t held = 0;
            for (int i = 0; i < n && i < 64; i++)
                held += pages[i] != UINT32_MAX;
            most = held > most ? held : most;
        }
        cr_assert_eq(llmd_engine_check(e), 1);
        /* the pool's side: every page a range maps, those mapped ahead too */
        struct llmd_stats st;
        llmd_stats_get(e, &st);
        uint64_t mapped =
            st.kv_pages_total - (st.kv_pages_free - st.kv_pages_ahead) - st.kv_pages_cached;
        cr_assert_leq(mapped, 2 * 4, "the ranges map %lu pages", (unsigned long)mapped);
    }
    cr_assert_eq(live, 0);
    cr_assert_leq(most, 4, "a sequence held %u pages", most);
    for (int k = 0; k < 2; k++) {
        cr_assert_eq(jobs[k].n_out, PHI3_GEN);
        for (int i = 0; i < PHI3_GEN; i++)
            cr_assert_eq(jobs[k].out[i], phi3_refs[k].greedy[i],
                         "request %d token %d: %d, llama.cpp %d", k, i, jobs[k].out[i],
                         phi3_refs[k].greedy[i]);
    }
    struct llmd_stats st;
    llmd_stats_get(e, &st);
    /* 146 and 244 tokens of 16-token pages: 9 + 15 pages, 3 + 2 kept at the end */
    cr_log_info("held at most %u pages; %lu dropped", most,
                (unsigned long)st.kv_window_dropped_pages_total);
    cr_assert_geq(st.kv_window_dropped_pages_total, 15);
    llmd_engine_close(e);
}

/* mistral-swa: llama with the same 32-token window (llama.attention.
 * sliding_window; llama.cpp ignores the key on llama, so phi3 above is the
 * oracle). Checked by what the window implies: while every key is inside it
 * (positions < 32) the logits are those of the same weights without it, so
 * the first 15 greedy ids after an 18-token prompt agree; past it they
 * need not, and here do not. */
Test(model_arch, mistral_swa_masks_only_past_the_window, .timeout = 60) {
    struct run r;
    run_open(&r, "dummy:tiny:f32:mistral-swa");
    cr_assert_eq(r.m->hp.arch, MODEL_ARCH_LLAMA);
    cr_assert_eq(r.m->hp.n_swa, 32);
    cr_assert_not(r.m->hp.rope_neox);
    int32_t ids[64], with[PHI3_GEN], without[PHI3_GEN];
    uint32_t n = prompt_ids(&r, "Once upon a time", ids, 64);
    cr_assert_eq(n, 18);
    for (int pass = 0; pass < 2; pass++) {
        int32_t *out = pass ? without : with;
        r.m->hp.n_swa = pass ? 0 : 32;
        run_restart(&r);
        feed(&r, ids, n, 0, 8);
        for (int i = 0; i < PHI3_GEN; i++) {
            out[i] = argmax(r.logits, r.m->hp.n_vocab);
            feed(&r, &out[i], 1, n + (uint32_t)i, 1);
        }
    }
    for (int i = 0; i < 15; i++)
        cr_assert_eq(with[i], without[i], "token %d (position %d, inside the window)", i, 17 + i);
    int first = 15;
    while (first < PHI3_GEN && with[first] == without[first])
        first++;
    cr_assert_lt(first, PHI3_GEN, "the window changed nothing in 128 tokens");
    cr_log_info("mistral-swa: the ids part from the unwindowed run's at token %d", first);
    run_close(&r);
}
