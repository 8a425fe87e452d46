/* model_forward.c - Llama forward pass on the CPU over vmm-paged KV.
 *
 * One call runs a flattened batch: the tokens of several sequences (decode
 * tokens and prefill chunks mixed) go through every matrix product together,
 * [n_tok][width] row-major f32, while RoPE, the KV writes and attention use
 * each token's own sequence and position. kern_matmul and kern_attention
 * reduce every output element in an order that depends only on its row
 * length (or key count), so a token's logits are bit-identical however it
 * was batched or chunked: the oracle of the batching tests.
 */
#include "engine/model/model_forward.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "engine/model/kv.h"
#include "engine/model/model.h"
#include "engine/model/model_cuda.h"
#include "kernels/kern.h"
#include "mem.h"

struct model_ctx {
    const struct model *m;
    struct kern_pool *pool;
    uint32_t max_tok;
    float *x;          /* [max_tok][n_embd] residual stream */
    float *xb;         /* [max_tok][n_embd] normed input */
    float *q;          /* [max_tok][n_head*head_dim] */
    float *k;          /* [max_tok][n_head_kv*head_dim] */
    float *v;          /* [max_tok][n_head_kv*head_dim] */
    float *att;        /* [max_tok][n_head*head_dim] attention output */
    float *hb;         /* [max_tok][n_ff] gate, then SwiGLU output */
    float *hb2;        /* [max_tok][n_ff] up */
    float *o;          /* [max_tok][n_embd] projection output */
    uint32_t *tok_seq; /* [max_tok] KV sequence of each flattened token */
    uint32_t *tok_pos; /* [max_tok] its position in that sequence */
    float *lbuf;       /* [lbuf_rows][n_vocab] logits of a batch, grown on demand */
    uint32_t lbuf_rows;
    struct model_cuda *cu; /* non-NULL: the batch runs on this GPU */
};

int model_ctx_create(const struct model *m, struct kern_pool *pool, uint32_t max_tok,
                     struct model_ctx **out) {
    if (max_tok == 0)
        return -EINVAL;
    const struct model_hparams *hp = &m->hp;
    struct model_ctx *c = mem_calloc(MEM_MODEL, 1, sizeof(*c));
    if (!c)
        return -ENOMEM;
    c->m = m;
    c->pool = pool;
    c->max_tok = max_tok;
    size_t q_dim = (size_t)hp->n_head * hp->head_dim, kv_dim = (size_t)hp->n_head_kv * hp->head_dim;
    size_t n = max_tok;
    c->x = mem_alloc(MEM_MODEL, n * hp->n_embd * sizeof(float));
    c->xb = mem_alloc(MEM_MODEL, n * hp->n_embd * sizeof(float));
    c->o = mem_alloc(MEM_MODEL, n * hp->n_embd * sizeof(float));
    c->q = mem_alloc(MEM_MODEL, n * q_dim * sizeof(float));
    c->att = mem_alloc(MEM_MODEL, n * q_dim * sizeof(float));
    c->k = mem_alloc(MEM_MODEL, n * kv_dim * sizeof(float));
    c->v = mem_alloc(MEM_MODEL, n * kv_dim * sizeof(float));
    c->hb = mem_alloc(MEM_MODEL, n * hp->n_ff * sizeof(float));
    c->hb2 = mem_alloc(MEM_MODEL, n * hp->n_ff * sizeof(float));
    c->tok_seq = mem_alloc(MEM_MODEL, n * sizeof(uint32_t));
    c->tok_pos = mem_alloc(MEM_MODEL, n * sizeof(uint32_t));
    if (!c->x || !c->xb || !c->o || !c->q || !c->att || !c->k || !c->v || !c->hb || !c->hb2 ||
        !c->tok_seq || !c->tok_pos) {
        model_ctx_destroy(c);
        return -ENOMEM;
    }
    *out = c;
    return 0;
}

void model_ctx_destroy(struct model_ctx *c) {
    if (!c)
        return;
    mem_free(c->x);
    mem_free(c->xb);
    mem_free(c->o);
    mem_free(c->q);
    mem_free(c->att);
    mem_free(c->k);
    mem_free(c->v);
    mem_free(c->hb);
    mem_free(c->hb2);
    mem_free(c->tok_seq);
    mem_free(c->tok_pos);
    mem_free(c->lbuf);
    model_cuda_destroy(c->cu);
    mem_free(c);
}

int model_ctx_use_cuda(struct model_ctx *c, const struct kv_cache *kv, int device,
                       uint32_t max_seqs, char *errbuf, size_t errlen) {
    const char *why = kv->device != KV_DEV_CUDA ? "the GPU forward pass needs a KV cache on the GPU"
                      : kv->cuda_ordinal != device ? "the KV cache is on another GPU"
                      : max_seqs == 0              ? "max_seqs is 0"
                      : c->cu                      ? "the context already runs on a GPU"
                                                   : NULL;
    if (why) {
        if (errbuf && errlen)
            snprintf(errbuf, errlen, "model: %s", why);
        return -EINVAL;
    }
    const char *q8 = getenv("LLMD_CUDA_Q8");
    struct model_cuda_opts o = {
        .device = device,
        .max_tok = c->max_tok,
        .max_seqs = max_seqs,
        .max_ctx = kv->n_ctx,
        .q8 = q8 && strcmp(q8, "native") == 0 ? MODEL_CUDA_Q8_NATIVE : MODEL_CUDA_Q8_UPCAST,
    };
    return model_cuda_create(c->m, &o, &c->cu, errbuf, errlen);
}

bool model_ctx_on_cuda(const struct model_ctx *c) {
    return c->cu != NULL;
}

/* Products of one input x with n (1 to 3) matrices of the same n_in, in
 * one pool run where their kernels allow (kern_matmul_fused: the pack
 * where w has one, else its rows; one conversion of x, one range of rows;
 * SWIGLU: y[0] = silu(y[0]) * y[1] after). The bits of kern_matmul /
 * kern_matmul_packed on each. */
static void model_matmul_fused(struct model_ctx *c, const float *x, float *const y[],
                               const struct model_w *const w[], int n, enum kern_mm_fuse how,
                               uint32_t n_tok) {
    struct kern_mm_part parts[3];
    for (int k = 0; k < n; k++)
        parts[k] = (struct kern_mm_part){.y = y[k],
                                         .pack = &w[k]->pack,
                                         .w = w[k]->data,
                                         .wtype = w[k]->type,
                                         .n_out = (int)w[k]->n_out};
    kern_matmul_fused(c->pool, x, (int)w[0]->n_in, (int)n_tok, parts, n, how);
}

static void model_matmul(struct model_ctx *c, float *y, const float *x, const struct model_w *w,
                         uint32_t n_tok) {
    model_matmul_fused(c, x, &y, &w, 1, KERN_MM_CONCAT, n_tok);
}

/* The per-token elementwise steps of a batch -- the RMS norms and the
 * residual adds (SwiGLU runs inside the gate and up products) -- split
 * over the pool when the batch is big
 * enough: run on the caller alone they took ~2% of the samples of a
 * 512-token f16 prefill on two threads of a Zen 3, wall time in which the
 * other thread waited. Slot ith takes a contiguous run of the tokens;
 * each token's values are computed as on one thread (the same calls), so
 * the bits never depend on the split. */
enum mf_op { MF_NORM, MF_ADD };

struct mf_job {
    struct model_ctx *c;
    enum mf_op op;
    const float *w; /* MF_NORM: the norm's weights */
    uint32_t n_tok;
};

/* Below this many elements a step runs on the caller (a pool run costs
 * microseconds; a decode token's norm, well under one). */
#define MF_PAR_ELEMS (16u << 10)

static void mf_rows(struct model_ctx *c, enum mf_op op, const float *w, uint32_t t0, uint32_t t1) {
    const struct model_hparams *hp = &c->m->hp;
    const size_t e = hp->n_embd;
    switch (op) {
    case MF_NORM:
        for (uint32_t i = t0; i < t1; i++)
            kern_rmsnorm(c->xb + i * e, c->x + i * e, w, (int)e, hp->rms_eps);
        break;
    case MF_ADD:
        for (size_t j = t0 * e; j < t1 * e; j++)
            c->x[j] += c->o[j];
        break;
    }
}

static void mf_worker(void *arg, int ith, int nth) {
    const struct mf_job *j = arg;
    const uint32_t t0 = (uint32_t)((uint64_t)j->n_tok * (uint64_t)ith / (uint64_t)nth);
    const uint32_t t1 = (uint32_t)((uint64_t)j->n_tok * (uint64_t)(ith + 1) / (uint64_t)nth);
    mf_rows(j->c, j->op, j->w, t0, t1);
}

static void mf_run(struct model_ctx *c, enum mf_op op, const float *w, uint32_t n_tok) {
    if (kern_pool_n_threads(c->pool) > 1 && (size_t)n_tok * c->m->hp.n_embd >= MF_PAR_ELEMS) {
        struct mf_job j = {.c = c, .op = op, .w = w, .n_tok = n_tok};
        kern_pool_run(c->pool, mf_worker, &j);
    } else {
        mf_rows(c, op, w, 0, n_tok);
    }
}

/* Attention block of layer il for the batch: x += Wo·attn(...). */
static void model_attention(struct model_ctx *c, struct kv_cache *kv,
                            const struct model_batch_seq *seqs, uint32_t n_seqs, uint32_t il,
                            uint32_t n_tok) {
    const struct model_hparams *hp = &c->m->hp;
    const struct model_layer *L = &c->m->layers[il];
    size_t q_dim = (size_t)hp->n_head * hp->head_dim, kv_dim = (size_t)hp->n_head_kv * hp->head_dim;
    const enum kern_kv_type t = (enum kern_kv_type)kv->dtype; /* same values (kv.c) */
    const int nkv = (int)hp->n_head_kv, hd = (int)hp->head_dim;

    mf_run(c, MF_NORM, L->attn_norm, n_tok);
    model_matmul_fused(c, c->xb, (float *const[]){c->q, c->k, c->v},
                       (const struct model_w *const[]){&L->wq, &L->wk, &L->wv}, 3, KERN_MM_CONCAT,
                       n_tok);
    for (uint32_t i = 0; i < n_tok; i++) {
        int pos = (int)c->tok_pos[i];
        float *q = c->q + i * q_dim, *k = c->k + i * kv_dim, *v = c->v + i * kv_dim;
        if (L->bq) { /* qwen2: y = W x + b, as ggml adds the bias after the product */
            for (size_t j = 0; j < q_dim; j++)
                q[j] += L->bq[j];
            for (size_t j = 0; j < kv_dim; j++) {
                k[j] += L->bk[j];
                v[j] += L->bv[j];
            }
        }
        if (L->q_norm) { /* qwen3: each head of Q and K RMS-normalised, before RoPE */
            for (int h = 0; h < (int)hp->n_head; h++)
                kern_rmsnorm(q + (size_t)h * hd, q + (size_t)h * hd, L->q_norm, hd, hp->rms_eps);
            for (int h = 0; h < nkv; h++)
                kern_rmsnorm(k + (size_t)h * hd, k + (size_t)h * hd, L->k_norm, hd, hp->rms_eps);
        }
        kern_rope_ff(q, (int)hp->n_head, hd, (int)hp->n_rot, pos, hp->rope_base, c->m->rope_freqs,
                     hp->rope_neox);
        kern_rope_ff(k, nkv, hd, (int)hp->n_rot, pos, hp->rope_base, c->m->rope_freqs,
                     hp->rope_neox);
        kern_kv_store(kv_slot(kv, c->tok_seq[i], (uint32_t)pos, il, 0), c->k + i * kv_dim, nkv, hd,
                      t);
        kern_kv_store(kv_slot(kv, c->tok_seq[i], (uint32_t)pos, il, 1), c->v + i * kv_dim, nkv, hd,
                      t);
    }
    /* each sequence attends over its own range, after every K/V of the
     * batch is stored (a prefill chunk's tokens see each other) */
    size_t off = 0;
    for (uint32_t s = 0; s < n_seqs; s++) {
        struct kern_kv view;
        kv_layer_view(kv, seqs[s].seq, il, (int)hp->n_head, &view);
        view.window = (int)hp->n_swa;
        kern_attention(c->pool, c->att + off * q_dim, c->q + off * q_dim, (int)seqs[s].n_tok,
                       (int)seqs[s].pos0, &view);
        off += seqs[s].n_tok;
    }
    model_matmul(c, c->o, c->att, &L->wo, n_tok);
    mf_run(c, MF_ADD, NULL, n_tok);
}
/* SwiGLU FFN block of layer il: x += W_down·(silu(W_gate·xb) * W_up·xb). */
static void model_ffn(struct model_ctx *c, uint32_t il, uint32_t n_tok) {
    const struct model_layer *L = &c->m->layers[il];
    mf_run(c, MF_NORM, L->ffn_norm, n_tok);
    model_matmul_fused(c, c->xb, (float *const[]){c->hb, c->hb2},
                       (const struct model_w *const[]){&L->w_gate, &L->w_up}, 2, KERN_MM_SWIGLU,
                       n_tok);
    model_matmul(c, c->o, c->hb, &L->w_down, n_tok);
    mf_run(c, MF_ADD, NULL, n_tok);
}

/* Rows of logits b wants: 0 without a buffer, else max(n_logits, 1). */
static uint32_t model_logit_rows(const struct model_batch_seq *b) {
    return !b->logits ? 0 : b->n_logits ? b->n_logits : 1;
}

/* Check the batch and lay out per-token sequence and position. */
static int model_batch_prepare(struct model_ctx *c, struct kv_cache *kv,
                               const struct model_batch_seq *seqs, uint32_t n_seqs,
                               uint32_t *n_tok) {
    const struct model_hparams *hp = &c->m->hp;
    uint32_t n = 0;
    for (uint32_t s = 0; s < n_seqs; s++) {
        const struct model_batch_seq *b = &seqs[s];
        if (b->n_tok == 0 || b->n_tok > c->max_tok - n)
            return -EINVAL;
        /* capacity is whole pages and can pass n_ctx: check both */
        if (b->pos0 > UINT32_MAX - b->n_tok || b->pos0 + b->n_tok > kv->n_ctx ||
            vmm_range_capacity(kv->vmm, b->seq) < b->pos0 + b->n_tok)
            return -ERANGE;
        for (uint32_t s2 = 0; s2 < s; s2++)
            if (seqs[s2].seq == b->seq)
                return -EINVAL; /* one entry per sequence: its tokens are consecutive */
        if (b->n_logits > b->n_tok)
            return -EINVAL;
        for (uint32_t i = 0; i < b->n_tok; i++) {
            if (b->tokens[i] < 0 || (uint32_t)b->tokens[i] >= hp->n_vocab)
                return -EINVAL;
            c->tok_seq[n] = b->seq;
            c->tok_pos[n] = b->pos0 + i;
            n++;
        }
    }
    *n_tok = n;
    return n ? 0 : -EINVAL;
}

int model_forward_batch(struct model_ctx *c, struct kv_cache *kv,
                        const struct model_batch_seq *seqs, uint32_t n_seqs) {
    const struct model *m = c->m;
    const struct model_hparams *hp = &m->hp;
    uint32_t n_tok;
    int rc = model_batch_prepare(c, kv, seqs, n_seqs, &n_tok);
    if (rc < 0)
        return rc;
    if (c->cu)
        return model_cuda_forward(c->cu, kv, seqs, n_seqs);
    if (kv->device != KV_DEV_HOST)
        return -EINVAL; /* device pages: the host cannot touch them */
    size_t row_bytes = kern_row_bytes(m->tok_embd.type, hp->n_embd);
    uint32_t t = 0;
    for (uint32_t s = 0; s < n_seqs; s++)
        for (uint32_t i = 0; i < seqs[s].n_tok; i++, t++) {
            const char *row =
                (const char *)m->tok_embd.data + (size_t)seqs[s].tokens[i] * row_bytes;
            kern_dequant_row(m->tok_embd.type, row, c->x + (size_t)t * hp->n_embd, (int)hp->n_embd);
        }
    for (uint32_t il = 0; il < hp->n_layer; il++) {
        model_attention(c, kv, seqs, n_seqs, il, n_tok);
        model_ffn(c, il, n_tok);
    }
    /* the classifier runs once over the last n_logits tokens of every
     * sequence that wants logits; their normed rows are gathered into xb */
    uint32_t n_out = 0, end = 0;
    for (uint32_t s = 0; s < n_seqs; s++) {
        end += seqs[s].n_tok;
        uint32_t rows = model_logit_rows(&seqs[s]);
        for (uint32_t j = 0; j < rows; j++)
            kern_rmsnorm(c->xb + (size_t)n_out++ * hp->n_embd,
                         c->x + (size_t)(end - rows + j) * hp->n_embd, m->output_norm,
                         (int)hp->n_embd, hp->rms_eps);
    }
    if (n_out == 0)
        return 0;
    if (n_out > 1 && n_out > c->lbuf_rows) {
        /* grow-only: the first wide batch allocates, later steps reuse it */
        size_t bytes = (size_t)n_out * hp->n_vocab * sizeof(float);
        float *nb = c->lbuf ? mem_realloc(c->lbuf, bytes) : mem_alloc(MEM_MODEL, bytes);
        if (nb) {
            c->lbuf = nb;
            c->lbuf_rows = n_out;
        }
    }
    if (n_out == 1 || n_out > c->lbuf_rows) {
        /* one row at a time straight into the caller's buffers */
        for (uint32_t s = 0, k = 0; s < n_seqs; s++)
            for (uint32_t j = 0; j < model_logit_rows(&seqs[s]); j++)
                model_matmul(c, seqs[s].logits + (size_t)j * hp->n_vocab,
                             c->xb + (size_t)k++ * hp->n_embd, &m->output, 1);
        return 0;
    }
    model_matmul(c, c->lbuf, c->xb, &m->output, n_out);
    for (uint32_t s = 0, k = 0; s < n_seqs; s++) {
        uint32_t rows = model_logit_rows(&seqs[s]);
        if (rows)
            memcpy(seqs[s].logits, c->lbuf + (size_t)k * hp->n_vocab,
                   (size_t)rows * hp->n_vocab * sizeof(float));
        k += rows;
    }
    return 0;
}

int model_forward(struct model_ctx *c, struct kv_cache *kv, uint32_t seq, const int32_t *tokens,
                  uint32_t n_tok, uint32_t pos0, float *logits) {
    struct model_batch_seq b = {
        .seq = seq, .pos0 = pos0, .n_tok = n_tok, .tokens = tokens, .logits = logits};
    return model_forward_batch(c, kv, &b, 1);
}
