/* model.c - load and validate a Llama-family GGUF (see model.h).
 *
 * Everything a forward pass will touch is checked here, once, so the hot
 * loop needs no checks: tensor presence, type, and shape against the
 * hyperparameters. GGUF shapes are in ggml order, ne[0] = row length.
 */
#include "engine/model/model.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "engine/model/model_dummy.h"
#include "engine/model/tok.h"
#include "kernels/kern.h"
#include "log.h"
#include "mem.h"

static int model_err(char *errbuf, size_t errlen, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int model_err(char *errbuf, size_t errlen, int rc, const char *fmt, ...) {
    if (errbuf && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(errbuf, errlen, fmt, ap);
        va_end(ap);
    }
    return rc;
}

uint64_t model_kv_token_bytes(const struct model_hparams *hp, uint64_t row_bytes) {
    return (uint64_t)hp->n_layer * 2 * row_bytes;
}

/* Read a required u32 hyperparameter in 1..max. The bounds keep every
 * product the loader and the forward pass form (layers x width, heads x
 * head_dim) far from overflow, and turn a hostile value into an error that
 * names the key instead of an absurd allocation. */
static int model_req_u32(const struct gguf *g, const char *key, uint32_t max, uint32_t *out,
                         char *errbuf, size_t errlen) {
    int rc = gguf_get_u32(g, key, out);
    if (rc == -ENOENT)
        return model_err(errbuf, errlen, -EINVAL, "model: missing metadata key '%s'", key);
    if (rc < 0)
        return model_err(errbuf, errlen, -EINVAL, "model: metadata key '%s' is not a u32", key);
    if (*out == 0)
        return model_err(errbuf, errlen, -EINVAL, "model: metadata key '%s' is 0", key);
    if (*out > max)
        return model_err(errbuf, errlen, -EINVAL,
                         "model: metadata key '%s' is %u, above the limit of %u", key, *out, max);
    return 0;
}

/* Read an optional value, keeping *out when the key is absent. */
static int model_opt_u32(const struct gguf *g, const char *key, uint32_t *out, char *errbuf,
                         size_t errlen) {
    uint32_t v;
    int rc = gguf_get_u32(g, key, &v);
    if (rc == -ENOENT)
        return 0;
    if (rc < 0 || v == 0)
        return model_err(errbuf, errlen, -EINVAL, "model: metadata key '%s' is invalid", key);
    *out = v;
    return 0;
}

static int model_opt_f32(const struct gguf *g, const char *key, float *out, char *errbuf,
                         size_t errlen) {
    float v;
    int rc = gguf_get_f32(g, key, &v);
    if (rc == -ENOENT)
        return 0;
    if (rc < 0 || !(v > 0.0f) || isinf(v)) /* NaN fails v > 0 */
        return model_err(errbuf, errlen, -EINVAL,
                         "model: metadata key '%s' is not a finite positive float", key);
    *out = v;
    return 0;
}

static const char *const model_arch_names[MODEL_ARCH_N] = {"llama", "qwen2", "qwen3", "phi3"};

const char *model_arch_name(enum model_arch a) {
    return (unsigned)a < MODEL_ARCH_N ? model_arch_names[a] : "?";
}

static int model_read_hparams(const struct gguf *g, struct model_hparams *hp, char *errbuf,
                              size_t errlen) {
    struct gguf_str arch;
    if (gguf_get_str(g, "general.architecture", &arch) < 0)
        return model_err(errbuf, errlen, -EINVAL,
                         "model: missing metadata key 'general.architecture'");
    hp->arch = MODEL_ARCH_N;
    for (int a = 0; a < MODEL_ARCH_N; a++)
        if (gguf_str_eq(arch, model_arch_names[a]))
            hp->arch = (enum model_arch)a;
    if (hp->arch == MODEL_ARCH_N)
        return model_err(errbuf, errlen, -ENOTSUP,
                         "model: unsupported architecture '%.*s' (llmd runs llama, qwen2, qwen3, "
                         "phi3)",
                         (int)(arch.len > 64 ? 64 : arch.len), arch.ptr);
    hp->rope_neox = hp->arch != MODEL_ARCH_LLAMA;
    const char *a = model_arch_names[hp->arch];
    char k[12][80];
    static const char *const suffix[12] = {"embedding_length",
                                           "block_count",
                                           "feed_forward_length",
                                           "attention.head_count",
                                           "attention.head_count_kv",
                                           "context_length",
                                           "attention.layer_norm_rms_epsilon",
                                           "rope.freq_base",
                                           "rope.dimension_count",
                                           "attention.key_length",
                                           "attention.value_length",
                                           "attention.sliding_window"};
    for (int i = 0; i < 12; i++)
        snprintf(k[i], sizeof(k[i]), "%s.%s", a, suffix[i]);
    int rc;
    /* limits well above any published Llama (405B: 126 layers, 16384 wide,
     * 53248 FFN, 128 heads) */
    if ((rc = model_req_u32(g, k[0], 65536, &hp->n_embd, errbuf, errlen)) ||
        (rc = model_req_u32(g, k[1], 4096, &hp->n_layer, errbuf, errlen)) ||
        (rc = model_req_u32(g, k[2], 1u << 20, &hp->n_ff, errbuf, errlen)) ||
        (rc = model_req_u32(g, k[3], 1024, &hp->n_head, errbuf, errlen)))
        return rc;
    hp->n_head_kv = hp->n_head;
    hp->n_ctx_train = 2048;
    hp->rms_eps = 1e-5f;
    hp->rope_base = 10000.0f;
    if ((rc = model_opt_u32(g, k[4], &hp->n_head_kv, errbuf, errlen)) ||
        (rc = model_opt_u32(g, k[5], &hp->n_ctx_train, errbuf, errlen)) ||
        (rc = model_opt_f32(g, k[6], &hp->rms_eps, errbuf, errlen)) ||
        (rc = model_opt_f32(g, k[7], &hp->rope_base, errbuf, errlen)))
        return rc;
    hp->n_swa = 0;
    if ((rc = model_opt_u32(g, k[11], &hp->n_swa, errbuf, errlen)))
        return rc;
    uint32_t key_len = 0, val_len = 0;
    if ((rc = model_opt_u32(g, k[9], &key_len, errbuf, errlen)) ||
        (rc = model_opt_u32(g, k[10], &val_len, errbuf, errlen)))
        return rc;
    if (val_len && val_len != (key_len ? key_len : hp->n_embd / hp->n_head))
        return model_err(errbuf, errlen, -ENOTSUP,
                         "model: value_length %u differs from the key length: not implemented",
                         val_len);
    if (!key_len && hp->n_embd % hp->n_head != 0)
        return model_err(errbuf, errlen, -EINVAL,
                         "model: embedding_length %u is not a multiple of head_count %u",
                         hp->n_embd, hp->n_head);
    if (hp->n_head % hp->n_head_kv != 0)
        return model_err(errbuf, errlen, -EINVAL,
                         "model: head_count %u is not a multiple of head_count_kv %u", hp->n_head,
                         hp->n_head_kv);
    hp->head_dim = key_len ? key_len : hp->n_embd / hp->n_head;
    if (hp->head_dim > KERN_ATT_MAX_HEAD_DIM)
        return model_err(errbuf, errlen, -ENOTSUP,
                         "model: head_dim %u is above the attention kernel's limit of %u",
                         hp->head_dim, KERN_ATT_MAX_HEAD_DIM);
    hp->n_rot = hp->head_dim;
    if ((rc = model_opt_u32(g, k[8], &hp->n_rot, errbuf, errlen)))
        return rc;
    if (hp->n_rot > hp->head_dim || hp->n_rot % 2 != 0)
        return model_err(errbuf, errlen, -EINVAL,
                         "model: rope.dimension_count %u must be even and <= head_dim %u",
                         hp->n_rot, hp->head_dim);
    return 0;
}

/* The file's type as the kernels' type: the one conversion between the
 * format and the compute layer (the ids are equal, kern.h). BF16 matrices
 * are refused for now although the kernels have them: the loader has never
 * been checked against a bf16 reference. */
_Static_assert(KERN_W_F32 == (int)GGUF_T_F32 && KERN_W_F16 == (int)GGUF_T_F16 &&
                   KERN_W_Q4_0 == (int)GGUF_T_Q4_0 && KERN_W_Q8_0 == (int)GGUF_T_Q8_0 &&
                   KERN_W_Q2_K == (int)GGUF_T_Q2_K && KERN_W_Q3_K == (int)GGUF_T_Q3_K &&
                   KERN_W_Q4_K == (int)GGUF_T_Q4_K && KERN_W_Q5_K == (int)GGUF_T_Q5_K &&
                   KERN_W_Q6_K == (int)GGUF_T_Q6_K && KERN_W_BF16 == (int)GGUF_T_BF16,
               "kern.h's weight types carry ggml's type ids");
static bool model_wtype(enum gguf_ttype t, enum kern_wtype *out) {
    if (t == GGUF_T_BF16 || !kern_wtype_ok((int)t))
        return false;
    *out = (enum kern_wtype)t;
    return true;
}

/* The kernels read f32 data as float and f16 data and q8_0/q4_0 blocks
 * through uint16_t fields, so data must sit at a multiple of 4 or 2 bytes.
 * ggml writers align to 32; the GGUF spec asks general.alignment to be a
 * multiple of 8, but a file with alignment 1 (or 2) opens and would hand
 * the kernels misaligned pointers (undefined behaviour, a fault on strict
 * targets). Refused rather than copied: the weights stay zero-copy. */
static int model_check_align(const struct gguf *g, const struct gguf_tensor *t, const char *name,
                             char *errbuf, size_t errlen) {
    uintptr_t align = t->type == GGUF_T_F32 ? 4 : 2;
    if ((uintptr_t)t->data % align == 0)
        return 0;
    return model_err(errbuf, errlen, -EINVAL,
                     "model: tensor '%s' (%s) starts at file offset %llu, not a multiple of %u "
                     "bytes (general.alignment %llu)",
                     name, gguf_type_name(t->type),
                     (unsigned long long)(gguf_data_offset(g) + t->offset), (unsigned)align,
                     (unsigned long long)gguf_alignment(g));
}

/* Bind a matrix tensor of ggml shape {n_in, n_out}. */
static int model_bind_w(const struct gguf *g, const char *name, uint32_t n_in, uint32_t n_out,
                        struct model_w *w, uint64_t *bytes, char *errbuf, size_t errlen) {
    const struct gguf_tensor *t = gguf_find_tensor(g, name);
    if (!t)
        return model_err(errbuf, errlen, -EINVAL, "model: missing tensor '%s'", name);
    enum kern_wtype wt;
    if (!model_wtype(t->type, &wt))
        return model_err(errbuf, errlen, -ENOTSUP, "model: tensor '%s': unsupported type %s", name,
                         gguf_type_name(t->type));
    if (t->n_dims != 2 || t->ne[0] != n_in || t->ne[1] != n_out)
        return model_err(errbuf, errlen, -EINVAL,
                         "model: tensor '%s' has shape [%llu, %llu] (%u dims), expected [%u, %u]",
                         name, (unsigned long long)t->ne[0], (unsigned long long)t->ne[1],
                         t->n_dims, n_in, n_out);
    int rc = model_check_align(g, t, name, errbuf, errlen);
    if (rc)
        return rc;
    *w = (struct model_w){.data = t->data, .type = wt, .n_in = n_in, .n_out = n_out};
    *bytes += t->bytes;
    return 0;
}

/* Rows [row0, row0 + n_rows) of a bound matrix, as a matrix of their own
 * (phi3's fused Q/K/V and gate/up: the rows of each part are contiguous). */
static struct model_w model_w_rows(const struct model_w *w, uint32_t row0, uint32_t n_rows) {
    return (struct model_w){.data = (const char *)w->data + row0 * kern_row_bytes(w->type, w->n_in),
                            .type = w->type,
                            .n_in = w->n_in,
                            .n_out = n_rows};
}

/* Bind a norm vector of n elements: an f32 copy of it (f16 data
 * converted) in the model's own buffer. With *owned NULL (the checking
 * pass) it is only counted in *n_copy; with *owned set (the converting
 * pass, after every tensor has been checked) it is copied there and *owned
 * advances. f32 vectors are copied too, so that the forward pass reads
 * nothing from the file's mapping but embedding rows: a norm read in place
 * between two matrices faulted up to 2 MiB of their pages back in around
 * it (the page cache's large folios are mapped whole), after model_load
 * had given those pages back (model_release_pages). */
static int model_bind_norm(const struct gguf *g, const char *name, uint32_t n, const float **out,
                           float **owned, size_t *n_copy, uint64_t *bytes, char *errbuf,
                           size_t errlen) {
    const struct gguf_tensor *t = gguf_find_tensor(g, name);
    if (!t)
        return model_err(errbuf, errlen, -EINVAL, "model: missing tensor '%s'", name);
    if (t->n_dims != 1 || t->ne[0] != n)
        return model_err(errbuf, errlen, -EINVAL,
                         "model: tensor '%s' has %llu elements (%u dims), expected [%u]", name,
                         (unsigned long long)t->ne[0], t->n_dims, n);
    if (t->type != GGUF_T_F32 && t->type != GGUF_T_F16)
        return model_err(errbuf, errlen, -ENOTSUP, "model: tensor '%s': unsupported type %s", name,
                         gguf_type_name(t->type));
    int rc = model_check_align(g, t, name, errbuf, errlen);
    if (rc)
        return rc;
    *bytes += t->bytes;
    *n_copy += n;
    if (*owned) {
        if (t->type == GGUF_T_F32)
            memcpy(*owned, t->data, (size_t)n * sizeof(float));
        else
            kern_dequant_row(KERN_W_F16, t->data, *owned, (int)n);
        *out = *owned;
        *owned += n;
    }
    return 0;
}

/* Bind every norm (see model_bind_norm() for the two passes). */
static int model_bind_norms(struct model *m, float *owned, size_t *n_copy, uint64_t *bytes,
                            char *errbuf, size_t errlen) {
    const struct gguf *g = m->gguf;
    const uint32_t n_embd = m->hp.n_embd;
    int rc;
    *n_copy = 0;
    if ((rc = model_bind_norm(g, "output_norm.weight", n_embd, &m->output_norm, &owned, n_copy,
                              bytes, errbuf, errlen)))
        return rc;
    if (gguf_find_tensor(g, "rope_freqs.weight") && /* Llama 3.1: the scaled frequencies */
        (rc = model_bind_norm(g, "rope_freqs.weight", m->hp.n_rot / 2, &m->rope_freqs, &owned,
                              n_copy, bytes, errbuf, errlen)))
        return rc;
    for (uint32_t il = 0; il < m->hp.n_layer; il++) {
        struct model_layer *L = &m->layers[il];
        char n[96];
        snprintf(n, sizeof(n), "blk.%u.attn_norm.weight", il);
        if ((rc = model_bind_norm(g, n, n_embd, &L->attn_norm, &owned, n_copy, bytes, errbuf,
                                  errlen)))
            return rc;
        snprintf(n, sizeof(n), "blk.%u.ffn_norm.weight", il);
        if ((rc = model_bind_norm(g, n, n_embd, &L->ffn_norm, &owned, n_copy, bytes, errbuf,
                                  errlen)))
            return rc;
        const struct model_hparams *hp = &m->hp;
        uint32_t q_dim = hp->n_head * hp->head_dim, kv_dim = hp->n_head_kv * hp->head_dim;
        if (hp->arch == MODEL_ARCH_QWEN2) { /* the Q, K, V biases */
            const char *const names[3] = {"attn_q", "attn_k", "attn_v"};
            const float **dst[3] = {&L->bq, &L->bk, &L->bv};
            for (int j = 0; j < 3; j++) {
                snprintf(n, sizeof(n), "blk.%u.%s.bias", il, names[j]);
                if ((rc = model_bind_norm(g, n, j ? kv_dim : q_dim, dst[j], &owned, n_copy, bytes,
                                          errbuf, errlen)))
                    return rc;
            }
        }
        if (hp->arch == MODEL_ARCH_QWEN3) { /* the per-head Q and K norms */
            snprintf(n, sizeof(n), "blk.%u.attn_q_norm.weight", il);
            if ((rc = model_bind_norm(g, n, hp->head_dim, &L->q_norm, &owned, n_copy, bytes, errbuf,
                                      errlen)))
                return rc;
            snprintf(n, sizeof(n), "blk.%u.attn_k_norm.weight", il);
            if ((rc = model_bind_norm(g, n, hp->head_dim, &L->k_norm, &owned, n_copy, bytes, errbuf,
                                      errlen)))
                return rc;
        }
    }
    return 0;
}

/* Bind every weight. Every tensor is checked before the f32 norm copies are
 * allocated, and they are sized by what the file holds, so a hostile
 * block_count or embedding_length fails on a missing or misshapen tensor
 * instead of allocating (2 * n_layer + 1) * n_embd floats first. */
static int model_bind(struct model *m, char *errbuf, size_t errlen) {
    const struct gguf *g = m->gguf;
    struct model_hparams *hp = &m->hp;
    if (gguf_n_tensors(g) == 0)
        return model_err(errbuf, errlen, -EINVAL,
                         "model: the file has no tensors (a vocabulary-only GGUF?)");
    const struct gguf_tensor *emb = gguf_find_tensor(g, "token_embd.weight");
    if (!emb)
        return model_err(errbuf, errlen, -EINVAL, "model: missing tensor 'token_embd.weight'");
    if (emb->n_dims != 2 || emb->ne[0] != hp->n_embd || emb->ne[1] == 0 || emb->ne[1] > (1u << 24))
        return model_err(errbuf, errlen, -EINVAL,
                         "model: tensor 'token_embd.weight' has shape [%llu, %llu], expected "
                         "[%u, n_vocab]",
                         (unsigned long long)emb->ne[0], (unsigned long long)emb->ne[1],
                         hp->n_embd);
    hp->n_vocab = (uint32_t)emb->ne[1];
    if (gguf_find_tensor(g, "rope_factors_long.weight") ||
        gguf_find_tensor(g, "rope_factors_short.weight"))
        return model_err(errbuf, errlen, -ENOTSUP,
                         "model: LongRoPE factors (rope_factors_long/short.weight, Phi-3 128k) "
                         "are not implemented");
    uint32_t q_dim = hp->n_head * hp->head_dim, kv_dim = hp->n_head_kv * hp->head_dim;
    int rc;
    uint64_t bytes = 0;
    if ((rc = model_bind_w(g, "token_embd.weight", hp->n_embd, hp->n_vocab, &m->tok_embd, &bytes,
                           errbuf, errlen)))
        return rc;
    if (gguf_find_tensor(g, "output.weight")) {
        if ((rc = model_bind_w(g, "output.weight", hp->n_embd, hp->n_vocab, &m->output, &bytes,
                               errbuf, errlen)))
            return rc;
    } else {
        m->output = m->tok_embd; /* tied classifier */
        m->output_tied = true;
    }
    /* n_layer <= 4096 (model_read_hparams): at most ~1 MiB */
    m->layers = mem_calloc(MEM_MODEL, hp->n_layer, sizeof(*m->layers));
    if (!m->layers)
        return model_err(errbuf, errlen, -ENOMEM, "model: out of memory");
    for (uint32_t il = 0; il < hp->n_layer; il++) {
        struct model_layer *L = &m->layers[il];
        char n[96];
#define MODEL_NAME(suffix) (snprintf(n, sizeof(n), "blk.%u." suffix ".weight", il), n)
        if (hp->arch == MODEL_ARCH_PHI3) { /* fused: Q, K, V rows; gate, up rows */
            struct model_w qkv, gu;
            if ((rc = model_bind_w(g, MODEL_NAME("attn_qkv"), hp->n_embd, q_dim + 2 * kv_dim, &qkv,
                                   &bytes, errbuf, errlen)) ||
                (rc = model_bind_w(g, MODEL_NAME("ffn_up"), hp->n_embd, 2 * hp->n_ff, &gu, &bytes,
                                   errbuf, errlen)))
                return rc;
            L->wq = model_w_rows(&qkv, 0, q_dim);
            L->wk = model_w_rows(&qkv, q_dim, kv_dim);
            L->wv = model_w_rows(&qkv, q_dim + kv_dim, kv_dim);
            L->w_gate = model_w_rows(&gu, 0, hp->n_ff);
            L->w_up = model_w_rows(&gu, hp->n_ff, hp->n_ff);
        } else if ((rc = model_bind_w(g, MODEL_NAME("attn_q"), hp->n_embd, q_dim, &L->wq, &bytes,
                                      errbuf, errlen)) ||
                   (rc = model_bind_w(g, MODEL_NAME("attn_k"), hp->n_embd, kv_dim, &L->wk, &bytes,
                                      errbuf, errlen)) ||
                   (rc = model_bind_w(g, MODEL_NAME("attn_v"), hp->n_embd, kv_dim, &L->wv, &bytes,
                                      errbuf, errlen)) ||
                   (rc = model_bind_w(g, MODEL_NAME("ffn_gate"), hp->n_embd, hp->n_ff, &L->w_gate,
                                      &bytes, errbuf, errlen)) ||
                   (rc = model_bind_w(g, MODEL_NAME("ffn_up"), hp->n_embd, hp->n_ff, &L->w_up,
                                      &bytes, errbuf, errlen))) {
            return rc;
        }
        if ((rc = model_bind_w(g, MODEL_NAME("attn_output"), q_dim, hp->n_embd, &L->wo, &bytes,
                               errbuf, errlen)) ||
            (rc = model_bind_w(g, MODEL_NAME("ffn_down"), hp->n_ff, hp->n_embd, &L->w_down, &bytes,
                               errbuf, errlen)))
            return rc;
#undef MODEL_NAME
    }
    size_t n_copy;
    if ((rc = model_bind_norms(m, NULL, &n_copy, &bytes, errbuf, errlen)))
        return rc;
    if (n_copy) {
        m->owned = mem_alloc(MEM_MODEL, n_copy * sizeof(float));
        if (!m->owned)
            return model_err(errbuf, errlen, -ENOMEM, "model: out of memory");
        uint64_t again = 0; /* the bytes were counted by the checking pass */
        if ((rc = model_bind_norms(m, m->owned, &n_copy, &again, errbuf, errlen)))
            return rc;
    }
    for (uint32_t i = 0; m->rope_freqs && i < hp->n_rot / 2; i++) /* a 0 or NaN: NaN logits */
        if (!(m->rope_freqs[i] > 0.0f) || isinf(m->rope_freqs[i]))
            return model_err(errbuf, errlen, -EINVAL,
                             "model: rope_freqs.weight[%u] = %g is not a finite positive factor", i,
                             (double)m->rope_freqs[i]);
    m->weight_bytes = bytes;
    return 0;
}

/* "dir/stories260K-f32.gguf" -> "stories260K-f32" */
static void model_set_name(struct model *m, const char *spec) {
    const char *base = strrchr(spec, '/');
    base = base ? base + 1 : spec;
    size_t len = strlen(base);
    if (len > 5 && strcmp(base + len - 5, ".gguf") == 0)
        len -= 5;
    if (len >= sizeof(m->name))
        len = sizeof(m->name) - 1;
    memcpy(m->name, base, len);
    m->name[len] = '\0';
}

uint32_t model_n_matrices(const struct model *m) {
    return (m->layers ? m->hp.n_layer * 7 : 0) + 1;
}

static const struct model_w *model_matrix_at(const struct model *m, uint32_t i) {
    if (!m->layers || i >= m->hp.n_layer * 7)
        return &m->output;
    const struct model_layer *L = &m->layers[i / 7];
    const struct model_w *ws[7] = {&L->wq,     &L->wk,   &L->wv,    &L->wo,
                                   &L->w_gate, &L->w_up, &L->w_down};
    return ws[i % 7];
}

struct model_w *model_matrix(struct model *m, uint32_t i) {
    return (struct model_w *)model_matrix_at(m, i); /* m is the caller's to change */
}

/* m->wtypes: the file's tensors of two or more dimensions (the matrices;
 * norms, biases and rope_freqs are 1-D) counted per type, the most common
 * first (ties: lower type id first), as "17 q3_K, 10 q4_K, 1 q6_K": what a
 * user checks a downloaded Q*_K_M file against. */
static void model_describe_wtypes(struct model *m) {
    enum { N_T = 64 };
    uint32_t count[N_T] = {0};
    for (uint64_t i = 0; i < gguf_n_tensors(m->gguf); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(m->gguf, i);
        if (t->n_dims >= 2 && (unsigned)t->type < N_T)
            count[t->type]++;
    }
    size_t off = 0;
    m->wtypes[0] = '\0';
    for (;;) {
        int best = -1;
        for (int t = 0; t < N_T; t++)
            if (count[t] && (best < 0 || count[t] > count[best]))
                best = t;
        if (best < 0 || off >= sizeof(m->wtypes))
            break;
        int k = snprintf(m->wtypes + off, sizeof(m->wtypes) - off, "%s%u %s", off ? ", " : "",
                         count[best], gguf_type_name((enum gguf_ttype)best));
        off += k > 0 ? (size_t)k : 0;
        count[best] = 0;
    }
}

/* A pack's bytes in the block: its own, rounded up to 64. */
static size_t model_pack_span(const struct model_w *w) {
    return (kern_pack_bytes(w->type, (int)w->n_in, (int)w->n_out) + 63) & ~(size_t)63;
}

/* A matrix the level does not pack is copied into the block as the file
 * has it, from avx2 up, where the kernels stream it at the read bandwidth:
 * one thread's f16 products over 1 GB read 8.6-10.1 GB/s from the file's
 * mapping (its page cache) and 11.2-13.7 from anonymous memory, and
 * dummy-1g f16 decode ran 1.38x as fast on one thread, 1.34x on two
 * (docs/benchmarks.md, "Unpacked matrices copied onto huge pages (Xeon)").
 * At scalar the kernels are bound by the core, and nothing is copied. */
static bool model_copies(const struct model_w *w) {
    return kern_isa() >= KERN_ISA_AVX2 && !kern_pack_supported(w->type, (int)w->n_in);
}

static size_t model_copy_bytes(const struct model_w *w) {
    return kern_row_bytes(w->type, w->n_in) * w->n_out;
}

/* A copy's bytes in the block: its own, rounded up to 64. */
static size_t model_copy_span(const struct model_w *w) {
    return (model_copy_bytes(w) + 63) & ~(size_t)63;
}

struct model_copy_job {
    char *dst;
    const char *src;
    size_t bytes;
};

/* Thread ith of nth copies its share, cut at 64-byte boundaries. */
static void model_copy_part(void *arg, int ith, int nth) {
    const struct model_copy_job *j = arg;
    const size_t lines = (j->bytes + 63) / 64;
    const size_t a = lines * (size_t)ith / (size_t)nth * 64,
                 b = lines * (size_t)(ith + 1) / (size_t)nth * 64;
    const size_t end = b < j->bytes ? b : j->bytes;
    if (a < end)
        memcpy(j->dst + a, j->src + a, end - a);
}

/* One matrix's rows in the file (see model_release_pages). Never the
 * embedding's: a tied classifier's rows are the lookup's too. */
static size_t model_release(const struct model *m, const void *rows, size_t bytes) {
    const uintptr_t r = (uintptr_t)rows, e = (uintptr_t)m->tok_embd.data;
    const size_t e_bytes = kern_row_bytes(m->tok_embd.type, m->hp.n_embd) * m->hp.n_vocab;
    if (r < e + e_bytes && e < r + bytes)
        return 0;
    return gguf_range_release(m->gguf, rows, bytes);
}

size_t model_release_pages(const struct model *m) {
    size_t released = 0;
    for (uint32_t i = 0; i < model_n_matrices(m); i++) {
        const struct model_w *w = model_matrix_at(m, i);
        if (w->pack.data || w->file_rows)
            released += model_release(m, model_w_file_rows(w), model_copy_bytes(w));
    }
    return released;
}

/* Pack every matrix the level in use multiplies faster packed (kern.h),
 * and copy the others (model_copies), split over pool's threads, all into
 * one block on huge pages where the system gives them (mem_alloc_huge),
 * in the forward pass's order, so a kernel's prefetch past one matrix's
 * end lands on the next one's start. A copied matrix's data then points
 * into the block. The copies only make the kernels faster: when the block
 * with them cannot be had, the packs alone are made, and the copied
 * matrices stay on the mapping. The classifier is packed or copied on its
 * own also when it is tied: the embedding lookup keeps reading tok_embd's
 * rows. */
static int model_pack(struct model *m, struct kern_pool *pool, char *errbuf, size_t errlen) {
    const uint32_t n = model_n_matrices(m);
    size_t packs = 0, copies = 0;
    for (uint32_t i = 0; i < n; i++) {
        const struct model_w *w = model_matrix(m, i);
        if (kern_pack_supported(w->type, (int)w->n_in))
            packs += model_pack_span(w);
        else if (model_copies(w))
            copies += model_copy_span(w);
    }
    const size_t want = copies;
    if (copies && !(m->pack_buf = mem_alloc_huge(MEM_KERN, packs + copies)))
        copies = 0;
    if (!m->pack_buf && packs && !(m->pack_buf = mem_alloc_huge(MEM_KERN, packs)))
        return model_err(errbuf, errlen, -ENOMEM,
                         "model: out of memory for %.1f MB of packed weights (LLMD_ISA=scalar "
                         "packs nothing)",
                         (double)packs / 1e6);
    if (want && !copies)
        LOG_WARN("model",
                 "no memory for %.1f MB of copies of the unpacked matrices: the kernels read "
                 "them from the file's mapping",
                 (double)want / 1e6);
    size_t at = 0;
    for (uint32_t i = 0; i < n; i++) {
        struct model_w *w = model_matrix(m, i);
        if (kern_pack_supported(w->type, (int)w->n_in)) {
            int rc = kern_pack_make_in(pool, &w->pack, w->type, w->data, (int)w->n_in,
                                       (int)w->n_out, (char *)m->pack_buf + at);
            if (rc < 0)
                return model_err(errbuf, errlen, rc, "model: packing a %ux%u matrix: %s", w->n_out,
                                 w->n_in, strerror(-rc));
            at += model_pack_span(w);
            m->packed_bytes += w->pack.bytes;
        } else if (copies && model_copies(w)) {
            struct model_copy_job j = {
                .dst = (char *)m->pack_buf + at, .src = w->data, .bytes = model_copy_bytes(w)};
            kern_pool_run(pool, model_copy_part, &j);
            w->file_rows = w->data;
            w->data = j.dst;
            at += model_copy_span(w);
            m->copied_bytes += j.bytes;
        }
    }
    /* only once every matrix is made: reading one faults its neighbours'
     * pages back in (the kernel maps up to 64 KiB around a fault, and a
     * whole 2 MiB folio at once when the page cache holds the file that
     * way: then the pages that share one with the header or the embedding,
     * read later, come back, a few MiB at most) */
    m->released_bytes = model_release_pages(m);
    return 0;
}

static void model_unpack(struct model *m) {
    for (uint32_t i = 0; i < model_n_matrices(m); i++)
        kern_pack_free(&model_matrix(m, i)->pack);
    mem_free(m->pack_buf);
    m->pack_buf = NULL;
}

int model_load(const char *spec, const struct model_load_opts *opts, struct model **out,
               char *errbuf, size_t errlen) {
    char gerr[256] = "";
    struct model *m = mem_calloc(MEM_MODEL, 1, sizeof(*m));
    if (!m)
        return model_err(errbuf, errlen, -ENOMEM, "model: out of memory");
    model_set_name(m, spec);
    int rc;
    if (strncmp(spec, "dummy:", 6) == 0) {
        size_t len = 0;
        rc = model_dummy_write_mem(spec + 6, &m->dummy_buf, &len, gerr, sizeof(gerr));
        if (rc == 0)
            rc = gguf_open_mem(m->dummy_buf, len, &m->gguf, gerr, sizeof(gerr));
    } else {
        rc = gguf_open(spec, &m->gguf, gerr, sizeof(gerr));
    }
    if (rc < 0) {
        model_err(errbuf, errlen, rc, "%s: %s", spec, gerr[0] ? gerr : strerror(-rc));
        goto fail;
    }
    if (gguf_n_tensors(m->gguf) == 0) { /* before its keys: it may have none of them */
        rc = model_err(errbuf, errlen, -EINVAL,
                       "model: %s has no tensors: a vocabulary-only GGUF (llmd vocab) holds "
                       "a tokenizer for llmd tokenize, not a model",
                       spec);
        goto fail;
    }
    model_describe_wtypes(m);
    if ((rc = model_read_hparams(m->gguf, &m->hp, errbuf, errlen)) < 0 ||
        (rc = model_bind(m, errbuf, errlen)) < 0 ||
        (!(opts && opts->no_pack) &&
         (rc = model_pack(m, opts ? opts->pool : NULL, errbuf, errlen)) < 0))
        goto fail;
    rc = tok_create_pre(m->gguf, opts ? opts->tokenizer_pre : NULL, &m->tok, gerr, sizeof(gerr));
    if (rc < 0) {
        model_err(errbuf, errlen, rc, "tokenizer: %s", gerr);
        goto fail;
    }
    if (tok_n_vocab(m->tok) != m->hp.n_vocab) {
        rc = model_err(errbuf, errlen, -EINVAL,
                       "model: tokenizer has %u tokens but token_embd.weight has %u rows",
                       tok_n_vocab(m->tok), m->hp.n_vocab);
        goto fail;
    }
    *out = m;
    return 0;
fail:
    model_free(m);
    return rc;
}

void model_free(struct model *m) {
    if (!m)
        return;
    model_unpack(m);
    tok_destroy(m->tok);
    gguf_close(m->gguf);
    mem_free(m->dummy_buf);
    mem_free(m->layers);
    mem_free(m->owned);
    mem_free(m);
}
