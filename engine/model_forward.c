/* model_forward.c - Llama forward pass on the CPU over vmm-paged KV.
 *
 * Activations are f32, [n_tok][width] row-major. Matrix products go through
 * kern_matmul, whose per-element reduction order depends only on the row
 * length, so a token's logits do not depend on how its prompt was chunked.
 */
#include "engine/model_forward.h"

#include <errno.h>
#include <math.h>
#include <string.h>

#include "engine/kv.h"
#include "engine/model.h"
#include "kernels/kern.h"
#include "mem.h"

struct model_ctx {
    const struct model *m;
    struct kern_pool *pool;
    uint32_t max_tok;
    float *x;   /* [max_tok][n_embd] residual stream */
    float *xb;  /* [max_tok][n_embd] normed input */
    float *q;   /* [max_tok][n_head*head_dim] */
    float *k;   /* [max_tok][n_head_kv*head_dim] */
    float *v;   /* [max_tok][n_head_kv*head_dim] */
    float *att; /* [max_tok][n_head*head_dim] attention output */
    float *hb;  /* [max_tok][n_ff] gate, then SwiGLU output */
    float *hb2; /* [max_tok][n_ff] up */
    float *o;   /* [max_tok][n_embd] projection output */
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
    if (!c->x || !c->xb || !c->o || !c->q || !c->att || !c->k || !c->v || !c->hb || !c->hb2) {
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
    mem_free(c);
}

static void model_matmul(struct model_ctx *c, float *y, const float *x, const struct model_w *w,
                         uint32_t n_tok) {
    kern_matmul(c->pool, y, x, w->data, w->type, (int)w->n_in, (int)w->n_out, (int)n_tok);
}

/* Attention block of layer il for n_tok tokens at pos0: x += Wo·attn(...). */
static void model_attention(struct model_ctx *c, struct kv_cache *kv, uint32_t seq, uint32_t il,
                            uint32_t n_tok, uint32_t pos0) {
    const struct model_hparams *hp = &c->m->hp;
    const struct model_layer *L = &c->m->layers[il];
    size_t q_dim = (size_t)hp->n_head * hp->head_dim, kv_dim = (size_t)hp->n_head_kv * hp->head_dim;

    for (uint32_t i = 0; i < n_tok; i++)
        kern_rmsnorm(c->xb + i * hp->n_embd, c->x + i * hp->n_embd, L->attn_norm, (int)hp->n_embd,
                     hp->rms_eps);
    model_matmul(c, c->q, c->xb, &L->wq, n_tok);
    model_matmul(c, c->k, c->xb, &L->wk, n_tok);
    model_matmul(c, c->v, c->xb, &L->wv, n_tok);
    for (uint32_t i = 0; i < n_tok; i++) {
        int pos = (int)(pos0 + i);
        kern_rope(c->q + i * q_dim, (int)hp->n_head, (int)hp->head_dim, (int)hp->n_rot, pos,
                  hp->rope_base);
        kern_rope(c->k + i * kv_dim, (int)hp->n_head_kv, (int)hp->head_dim, (int)hp->n_rot, pos,
                  hp->rope_base);
        enum kern_kv_type t = kv->dtype == KV_F16 ? KERN_KV_F16 : KERN_KV_F32;
        kern_kv_store(kv_slot(kv, seq, pos0 + i, il, 0), c->k + i * kv_dim, (int)kv_dim, t);
        kern_kv_store(kv_slot(kv, seq, pos0 + i, il, 1), c->v + i * kv_dim, (int)kv_dim, t);
    }
    struct kern_kv view;
    kv_layer_view(kv, seq, il, (int)hp->n_head, &view);
    kern_attention(c->pool, c->att, c->q, (int)n_tok, (int)pos0, &view);
    model_matmul(c, c->o, c->att, &L->wo, n_tok);
    for (size_t j = 0; j < (size_t)n_tok * hp->n_embd; j++)
        c->x[j] += c->o[j];
}

/* SwiGLU FFN block of layer il: x += W_down·(silu(W_gate·xb) * W_up·xb). */
static void model_ffn(struct model_ctx *c, uint32_t il, uint32_t n_tok) {
    const struct model_hparams *hp = &c->m->hp;
    const struct model_layer *L = &c->m->layers[il];
    for (uint32_t i = 0; i < n_tok; i++)
        kern_rmsnorm(c->xb + i * hp->n_embd, c->x + i * hp->n_embd, L->ffn_norm, (int)hp->n_embd,
                     hp->rms_eps);
    model_matmul(c, c->hb, c->xb, &L->w_gate, n_tok);
    model_matmul(c, c->hb2, c->xb, &L->w_up, n_tok);
    kern_swiglu(c->hb, c->hb, c->hb2, (int)(n_tok * hp->n_ff));
    model_matmul(c, c->o, c->hb, &L->w_down, n_tok);
    for (size_t j = 0; j < (size_t)n_tok * hp->n_embd; j++)
        c->x[j] += c->o[j];
}

int model_forward(struct model_ctx *c, struct kv_cache *kv, uint32_t seq, const int32_t *tokens,
                  uint32_t n_tok, uint32_t pos0, float *logits) {
    const struct model *m = c->m;
    const struct model_hparams *hp = &m->hp;
    if (n_tok == 0 || n_tok > c->max_tok)
        return -EINVAL;
    if (vmm_range_capacity(kv->vmm, seq) < pos0 + n_tok)
        return -ERANGE;
    size_t row_bytes = gguf_type_bytes(m->tok_embd.type, hp->n_embd);
    for (uint32_t i = 0; i < n_tok; i++) {
        if (tokens[i] < 0 || (uint32_t)tokens[i] >= hp->n_vocab)
            return -EINVAL;
        const char *row = (const char *)m->tok_embd.data + (size_t)tokens[i] * row_bytes;
        kern_dequant_row(m->tok_embd.type, row, c->x + (size_t)i * hp->n_embd, (int)hp->n_embd);
    }
    for (uint32_t il = 0; il < hp->n_layer; il++) {
        model_attention(c, kv, seq, il, n_tok, pos0);
        model_ffn(c, il, n_tok);
    }
    if (logits) {
        float *last = c->x + (size_t)(n_tok - 1) * hp->n_embd;
        kern_rmsnorm(c->xb, last, m->output_norm, (int)hp->n_embd, hp->rms_eps);
        model_matmul(c, logits, c->xb, &m->output, 1);
    }
    return 0;
}
