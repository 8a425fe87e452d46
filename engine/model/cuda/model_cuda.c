/* model_cuda.c - the forward pass on an NVIDIA GPU (see model_cuda.h).
 *
 * Built by `make cuda` only. CUDA runtime API for memory, streams and the
 * kernels of kernels/cuda/ (kern_cuda.h); cuBLAS for every matrix product
 * (cublasGemmEx, cuBLAS library reference §2.8.12). The KV cache is the vmm
 * CUDA backend's (vmm/cuda/vmm_cuda.c), which retains the device's primary
 * context: the runtime uses the same one, so the ranges' addresses are
 * valid device pointers here.
 *
 * GEMM convention: activations are row-major [n_tok][n_in], weights
 * row-major [n_out][n_in]. In cuBLAS's column-major terms W is an
 * n_in x n_out matrix with lda = n_in, so Y^T (n_out x n_tok, ldc = n_out,
 * i.e. row-major Y) = op_T(W) . X^T: cublasGemmEx(OP_T, OP_N, m = n_out,
 * n = n_tok, k = n_in).
 *
 * A step copies its small tables (token ids, positions, KV slot addresses,
 * attention descriptors, output rows) to the device in one async copy from
 * pinned memory, enqueues every kernel on the compute stream, copies the
 * logits back and synchronizes once.
 */
#include "engine/model/model_cuda.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "engine/model/gguf.h"
#include "engine/model/kv.h"
#include "engine/model/model.h"
#include "engine/model/model_forward.h"
#include "kernels/kern_cuda.h"
#include "log.h"
#include "mem.h"

_Static_assert((int)KCU_KV_F32 == (int)KV_F32 && (int)KCU_KV_F16 == (int)KV_F16 &&
                   (int)KCU_KV_Q8_0 == (int)KV_Q8_0 && (int)KCU_KV_Q4_0 == (int)KV_Q4_0 &&
                   (int)KCU_KV_FP8 == (int)KV_FP8 && KV_DTYPE_N == 5,
               "enum kcu_kv is kv.h's kv_dtype, value for value");

/* One weight matrix on the device. */
struct mcu_w {
    void *d;         /* device rows: [n_out][n_in] of t, or Q8_0 blocks when q8 */
    enum kcu_type t; /* element type when !q8 */
    bool q8;         /* kept in Q8_0 blocks (MODEL_CUDA_Q8_NATIVE) */
    bool borrowed;   /* shared with another mcu_w (tied output): not freed */
    uint32_t n_in, n_out;
};

struct mcu_layer {
    float *attn_norm, *ffn_norm; /* [n_embd] */
    struct mcu_w wq, wk, wv, wo, w_gate, w_up, w_down;
};

/* The per-step tables, packed in one pinned buffer and one device buffer
 * with the same layout so one copy moves them. */
struct mcu_tables {
    size_t off_tokens, off_pos, off_kvtok, off_seqs, off_rows, bytes;
};

struct model_cuda {
    const struct model *m;
    int dev;
    struct model_cuda_opts opt;
    cudaStream_t stream;
    cublasHandle_t blas;
    struct mcu_w tok_embd, output;
    float *output_norm;
    struct mcu_layer *layers;
    /* activations, device */
    float *x, *xb, *q, *k, *v, *att, *hb, *hb2, *o, *logits;
    void *xh;      /* [max_tok][max width] half-precision GEMM input */
    uint16_t *wdq; /* [largest Q8_0 matrix] f16, prefill of MODEL_CUDA_Q8_NATIVE */
    void *att_ws;  /* kcu_attention workspace */
    size_t att_ws_bytes;
    uint32_t logit_rows; /* rows of logits per classifier pass */
    struct mcu_tables tl;
    void *d_tab, *h_tab; /* device and pinned host tables */
    float *h_logits;     /* pinned [logit_rows][n_vocab] */
    struct model_cuda_stats st;
};

static _Thread_local char mcu_why[160];

const char *model_cuda_unavailable(void) {
    return mcu_why;
}

static int mcu_err(char *errbuf, size_t errlen, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int mcu_err(char *errbuf, size_t errlen, int rc, const char *fmt, ...) {
    char line[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    if (errbuf && errlen)
        snprintf(errbuf, errlen, "%s", line);
    LOG_ERROR("cuda", "%s", line);
    return rc;
}

/* A CUDA runtime result as 0 / -errno, logged with the call's name. */
static int mcu_rt(cudaError_t r, const char *what) {
    if (r == cudaSuccess)
        return 0;
    LOG_ERROR("cuda", "%s: %s (%s)", what, cudaGetErrorName(r), cudaGetErrorString(r));
    return r == cudaErrorMemoryAllocation ? -ENOMEM : -EIO;
}

static int mcu_blas(cublasStatus_t r, const char *what) {
    if (r == CUBLAS_STATUS_SUCCESS)
        return 0;
    LOG_ERROR("cuda", "%s: cuBLAS status %d", what, (int)r);
    return r == CUBLAS_STATUS_ALLOC_FAILED ? -ENOMEM : -EIO;
}

static uint64_t mcu_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int mcu_alloc(void **p, size_t bytes, uint64_t *counter) {
    int rc = mcu_rt(cudaMalloc(p, bytes ? bytes : 1), "cudaMalloc");
    if (rc == 0)
        *counter += bytes;
    return rc;
}

/* ---- weight upload -------------------------------------------------------- */

static size_t mcu_type_bytes(enum kcu_type t) {
    return t == KCU_F32 ? 4 : 2;
}

/* Upload one weight: raw rows to `stage` (device, >= its bytes), then the
 * device copy in its device type; upcast forces Q8_0 to f16 whatever the
 * mode (the embedding lookup reads f32/f16/bf16 rows only). */
static int mcu_upload_w(struct model_cuda *mc, struct mcu_w *dw, const struct model_w *w,
                        void *stage, bool upcast) {
    size_t n = (size_t)w->n_in * w->n_out;
    size_t raw = kern_row_bytes(w->type, n);
    dw->n_in = w->n_in;
    dw->n_out = w->n_out;
    int rc;
    switch (w->type) {
    case KERN_W_F32:
    case KERN_W_F16:
    case KERN_W_BF16:
        dw->t = w->type == KERN_W_F32 ? KCU_F32 : w->type == KERN_W_F16 ? KCU_F16 : KCU_BF16;
        if ((rc = mcu_alloc(&dw->d, raw, &mc->st.weight_bytes)))
            return rc;
        return mcu_rt(cudaMemcpyAsync(dw->d, w->data, raw, cudaMemcpyHostToDevice, mc->stream),
                      "cudaMemcpyAsync(weights)");
    case KERN_W_Q8_0:
        if (mc->opt.q8 == MODEL_CUDA_Q8_NATIVE && !upcast) {
            dw->q8 = true;
            if ((rc = mcu_alloc(&dw->d, raw, &mc->st.weight_bytes)))
                return rc;
            return mcu_rt(cudaMemcpyAsync(dw->d, w->data, raw, cudaMemcpyHostToDevice, mc->stream),
                          "cudaMemcpyAsync(weights)");
        }
        __attribute__((fallthrough)); /* upcast */
    case KERN_W_Q4_0:
        dw->t = KCU_F16;
        if ((rc = mcu_alloc(&dw->d, n * 2, &mc->st.weight_bytes)))
            return rc;
        if ((rc = mcu_rt(cudaMemcpyAsync(stage, w->data, raw, cudaMemcpyHostToDevice, mc->stream),
                         "cudaMemcpyAsync(weights)")))
            return rc;
        if ((rc = kcu_dequant_f16(mc->stream, dw->d, stage, (int)w->type, n)))
            return rc;
        /* the stage is reused by the next weight: finish this one first */
        return mcu_rt(cudaStreamSynchronize(mc->stream), "cudaStreamSynchronize");
    default:
        return -ENOTSUP;
    }
}

/* Weight i of the model in a fixed order: the embedding, the classifier,
 * then per layer wq, wk, wv, wo, w_gate, w_up, w_down. */
static const struct model_w *mcu_weight_at(const struct model *m, uint32_t i) {
    if (i == 0)
        return &m->tok_embd;
    if (i == 1)
        return &m->output;
    const struct model_layer *L = &m->layers[(i - 2) / 7];
    const struct model_w *ws[7] = {&L->wq,     &L->wk,   &L->wv,    &L->wo,
                                   &L->w_gate, &L->w_up, &L->w_down};
    return ws[(i - 2) % 7];
}

/* The GGUF name of weight i of mcu_weight_at()'s order, into buf. */
static const char *mcu_weight_name(const struct model *m, uint32_t i, char *buf, size_t len) {
    static const char *const names[7] = {"attn_q",   "attn_k", "attn_v",  "attn_output",
                                         "ffn_gate", "ffn_up", "ffn_down"};
    if (i == 0)
        return "token_embd.weight";
    if (i == 1)
        return m->output_tied ? "token_embd.weight" : "output.weight";
    snprintf(buf, len, "blk.%u.%s.weight", (i - 2) / 7, names[(i - 2) % 7]);
    return buf;
}

/* The GPU path has no K-quant kernels yet [TAG_CUDA_KQUANT]: refuse such a
 * model before touching the device, naming the first tensor and its type,
 * so the caller can run it on the CPU. Returns 0 or -ENOTSUP. */
static int mcu_check_types(const struct model *m, char *errbuf, size_t errlen) {
    for (uint32_t i = 0; i < 2 + 7 * m->hp.n_layer; i++) {
        const struct model_w *w = mcu_weight_at(m, i);
        if (w->type != KERN_W_F32 && w->type != KERN_W_F16 && w->type != KERN_W_BF16 &&
            w->type != KERN_W_Q8_0 && w->type != KERN_W_Q4_0) {
            char n[96];
            return mcu_err(errbuf, errlen, -ENOTSUP,
                           "cuda: tensor '%s' is %s; the GPU forward pass runs f32, f16, bf16, "
                           "q8_0 and q4_0 weights (K-quants run on the CPU)",
                           mcu_weight_name(m, i, n, sizeof(n)),
                           gguf_type_name((enum gguf_ttype)w->type));
        }
    }
    return 0;
}

static int mcu_upload_norm(struct model_cuda *mc, float **d, const float *h, uint32_t n) {
    int rc = mcu_alloc((void **)d, (size_t)n * sizeof(float), &mc->st.weight_bytes);
    if (rc)
        return rc;
    return mcu_rt(
        cudaMemcpyAsync(*d, h, (size_t)n * sizeof(float), cudaMemcpyHostToDevice, mc->stream),
        "cudaMemcpyAsync(norm)");
}

/* Every weight; host pages of the mapped file are read once. */
static int mcu_upload(struct model_cuda *mc, char *errbuf, size_t errlen) {
    const struct model *m = mc->m;
    const struct model_hparams *hp = &m->hp;
    /* the staging buffer holds the raw bytes of the largest matrix that is
     * converted on the device (Q4_0; Q8_0 unless kept native; the embedding) */
    size_t stage_bytes = 0;
    for (uint32_t i = 0; i < 2 + 7 * hp->n_layer; i++) {
        const struct model_w *w = mcu_weight_at(m, i);
        bool converted =
            w->type == KERN_W_Q4_0 ||
            (w->type == KERN_W_Q8_0 && (mc->opt.q8 == MODEL_CUDA_Q8_UPCAST || w == &m->tok_embd));
        size_t b = kern_row_bytes(w->type, (size_t)w->n_in * w->n_out);
        if (converted && b > stage_bytes)
            stage_bytes = b;
    }
    void *stage = NULL;
    uint64_t ignore = 0;
    int rc = mcu_alloc(&stage, stage_bytes, &ignore);
    if (rc)
        return mcu_err(errbuf, errlen, rc, "cuda: cannot allocate %zu bytes of upload staging",
                       stage_bytes);
    uint64_t t0 = mcu_now_ns();
    rc = mcu_upload_w(mc, &mc->tok_embd, &m->tok_embd, stage, true);
    if (rc == 0) {
        if (m->output_tied) {
            mc->output = mc->tok_embd; /* tied classifier: one copy */
            mc->output.borrowed = true;
        } else {
            rc = mcu_upload_w(mc, &mc->output, &m->output, stage, false);
        }
    }
    if (rc == 0)
        rc = mcu_upload_norm(mc, &mc->output_norm, m->output_norm, hp->n_embd);
    for (uint32_t il = 0; rc == 0 && il < hp->n_layer; il++) {
        const struct model_layer *L = &m->layers[il];
        struct mcu_layer *D = &mc->layers[il];
        if ((rc = mcu_upload_norm(mc, &D->attn_norm, L->attn_norm, hp->n_embd)) ||
            (rc = mcu_upload_norm(mc, &D->ffn_norm, L->ffn_norm, hp->n_embd)) ||
            (rc = mcu_upload_w(mc, &D->wq, &L->wq, stage, false)) ||
            (rc = mcu_upload_w(mc, &D->wk, &L->wk, stage, false)) ||
            (rc = mcu_upload_w(mc, &D->wv, &L->wv, stage, false)) ||
            (rc = mcu_upload_w(mc, &D->wo, &L->wo, stage, false)) ||
            (rc = mcu_upload_w(mc, &D->w_gate, &L->w_gate, stage, false)) ||
            (rc = mcu_upload_w(mc, &D->w_up, &L->w_up, stage, false)) ||
            (rc = mcu_upload_w(mc, &D->w_down, &L->w_down, stage, false)))
            break;
        /* unquantised copies are async from pageable memory: keep the
         * pipeline short so a failure is reported near its cause */
        if ((il & 7) == 7)
            rc = mcu_rt(cudaStreamSynchronize(mc->stream), "cudaStreamSynchronize");
    }
    int rs = mcu_rt(cudaStreamSynchronize(mc->stream), "cudaStreamSynchronize");
    cudaFree(stage);
    if (rc == 0)
        rc = rs;
    mc->st.upload_ns = mcu_now_ns() - t0;
    if (rc)
        return mcu_err(errbuf, errlen, rc,
                       "cuda: weight upload failed after %llu bytes (%s): see the log",
                       (unsigned long long)mc->st.weight_bytes, strerror(-rc));
    return 0;
}

/* ---- scratch -------------------------------------------------------------- */

static size_t mcu_align(size_t x) {
    return (x + 255) & ~(size_t)255;
}

static int mcu_scratch(struct model_cuda *mc, char *errbuf, size_t errlen) {
    const struct model_hparams *hp = &mc->m->hp;
    size_t n = mc->opt.max_tok;
    size_t q_dim = (size_t)hp->n_head * hp->head_dim, kv_dim = (size_t)hp->n_head_kv * hp->head_dim;
    size_t wide = hp->n_embd;
    wide = q_dim > wide ? q_dim : wide;
    wide = hp->n_ff > wide ? hp->n_ff : wide;
    mc->logit_rows = mc->opt.max_seqs < mc->opt.max_tok ? mc->opt.max_seqs : mc->opt.max_tok;
    if (mc->logit_rows > 64)
        mc->logit_rows = 64;
    struct {
        void **p;
        size_t bytes;
    } bufs[] = {
        {(void **)&mc->x, n * hp->n_embd * 4},
        {(void **)&mc->xb, n * hp->n_embd * 4},
        {(void **)&mc->o, n * hp->n_embd * 4},
        {(void **)&mc->q, n * q_dim * 4},
        {(void **)&mc->att, n * q_dim * 4},
        {(void **)&mc->k, n * kv_dim * 4},
        {(void **)&mc->v, n * kv_dim * 4},
        {(void **)&mc->hb, n * hp->n_ff * 4},
        {(void **)&mc->hb2, n * hp->n_ff * 4},
        {&mc->xh, n * wide * 2},
        {(void **)&mc->logits, (size_t)mc->logit_rows * hp->n_vocab * 4},
    };
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < sizeof(bufs) / sizeof(bufs[0]); i++)
        rc = mcu_alloc(bufs[i].p, bufs[i].bytes, &mc->st.scratch_bytes);
    /* the largest Q8_0 matrix kept in blocks, dequantised per prefill GEMM */
    size_t wdq = 0;
    for (uint32_t il = 0; il < hp->n_layer; il++) {
        const struct mcu_layer *D = &mc->layers[il];
        const struct mcu_w *ws[7] = {&D->wq,     &D->wk,   &D->wv,    &D->wo,
                                     &D->w_gate, &D->w_up, &D->w_down};
        for (int i = 0; i < 7; i++)
            if (ws[i]->q8 && (size_t)ws[i]->n_in * ws[i]->n_out > wdq)
                wdq = (size_t)ws[i]->n_in * ws[i]->n_out;
    }
    if (mc->output.q8 && (size_t)mc->output.n_in * mc->output.n_out > wdq)
        wdq = (size_t)mc->output.n_in * mc->output.n_out;
    if (rc == 0 && wdq)
        rc = mcu_alloc((void **)&mc->wdq, wdq * 2, &mc->st.scratch_bytes);
    mc->att_ws_bytes = kcu_attention_ws_bytes((int)mc->opt.max_seqs, (int)hp->n_head,
                                              (int)hp->head_dim, (int)mc->opt.max_ctx);
    if (rc == 0)
        rc = mcu_alloc(&mc->att_ws, mc->att_ws_bytes, &mc->st.scratch_bytes);
    struct mcu_tables *t = &mc->tl;
    t->off_tokens = 0;
    t->off_pos = mcu_align(t->off_tokens + n * sizeof(int32_t));
    t->off_kvtok = mcu_align(t->off_pos + n * sizeof(int32_t));
    t->off_seqs = mcu_align(t->off_kvtok + n * sizeof(uint64_t));
    t->off_rows = mcu_align(t->off_seqs + mc->opt.max_seqs * sizeof(struct kcu_att_seq));
    t->bytes = mcu_align(t->off_rows + n * sizeof(int32_t)); /* a row per token at most */
    if (rc == 0)
        rc = mcu_alloc(&mc->d_tab, t->bytes, &mc->st.scratch_bytes);
    if (rc == 0)
        rc = mcu_rt(cudaMallocHost(&mc->h_tab, t->bytes), "cudaMallocHost");
    if (rc == 0)
        rc = mcu_rt(cudaMallocHost((void **)&mc->h_logits,
                                   (size_t)mc->logit_rows * hp->n_vocab * sizeof(float)),
                    "cudaMallocHost");
    if (rc)
        return mcu_err(errbuf, errlen, rc,
                       "cuda: cannot allocate scratch for %u tokens (%llu device bytes so far)",
                       mc->opt.max_tok, (unsigned long long)mc->st.scratch_bytes);
    return 0;
}

/* ---- create / destroy ------------------------------------------------------ */

int model_cuda_create(const struct model *m, const struct model_cuda_opts *o,
                      struct model_cuda **out, char *errbuf, size_t errlen) {
    if (!m || !o || !out || o->max_tok == 0 || o->max_seqs == 0 || o->max_ctx == 0 || o->device < 0)
        return mcu_err(errbuf, errlen, -EINVAL, "cuda: bad options");
    int rc0 = mcu_check_types(m, errbuf, errlen);
    if (rc0)
        return rc0;
    int n_dev = 0;
    cudaError_t r = cudaGetDeviceCount(&n_dev);
    if (r != cudaSuccess || n_dev == 0) {
        snprintf(mcu_why, sizeof(mcu_why), "no usable CUDA device (%s)",
                 r != cudaSuccess ? cudaGetErrorString(r) : "none found");
        return mcu_err(errbuf, errlen, -ENOTSUP, "cuda: %s", mcu_why);
    }
    if (o->device >= n_dev)
        return mcu_err(errbuf, errlen, -EINVAL, "cuda: device %d does not exist (%d found)",
                       o->device, n_dev);
    struct model_cuda *mc = mem_calloc(MEM_MODEL, 1, sizeof(*mc));
    if (!mc)
        return mcu_err(errbuf, errlen, -ENOMEM, "cuda: out of host memory");
    mc->m = m;
    mc->opt = *o;
    mc->dev = o->device;
    mc->layers = mem_calloc(MEM_MODEL, m->hp.n_layer, sizeof(*mc->layers));
    int rc = mc->layers ? 0 : mcu_err(errbuf, errlen, -ENOMEM, "cuda: out of host memory");
    if (rc == 0 && (rc = mcu_rt(cudaSetDevice(mc->dev), "cudaSetDevice")) == 0 &&
        (rc = mcu_rt(cudaStreamCreateWithFlags(&mc->stream, cudaStreamNonBlocking),
                     "cudaStreamCreate")) == 0 &&
        (rc = mcu_blas(cublasCreate(&mc->blas), "cublasCreate")) == 0 &&
        (rc = mcu_blas(cublasSetStream(mc->blas, mc->stream), "cublasSetStream")) == 0)
        rc = mcu_upload(mc, errbuf, errlen);
    else if (rc)
        mcu_err(errbuf, errlen, rc, "cuda: device %d setup failed (%s)", mc->dev, strerror(-rc));
    if (rc == 0)
        rc = mcu_scratch(mc, errbuf, errlen);
    if (rc) {
        model_cuda_destroy(mc);
        return rc;
    }
    LOG_INFO("cuda", "device %d: %.1f MiB of weights uploaded in %.1f ms, %.1f MiB scratch",
             mc->dev, (double)mc->st.weight_bytes / 1048576.0, (double)mc->st.upload_ns / 1e6,
             (double)mc->st.scratch_bytes / 1048576.0);
    mcu_why[0] = '\0';
    *out = mc;
    return 0;
}

static void mcu_free_w(struct mcu_w *w) {
    if (!w->borrowed)
        cudaFree(w->d);
    w->d = NULL;
}

void model_cuda_destroy(struct model_cuda *mc) {
    if (!mc)
        return;
    cudaSetDevice(mc->dev);
    if (mc->stream)
        cudaStreamSynchronize(mc->stream);
    if (mc->layers) {
        for (uint32_t il = 0; il < mc->m->hp.n_layer; il++) {
            struct mcu_layer *D = &mc->layers[il];
            cudaFree(D->attn_norm);
            cudaFree(D->ffn_norm);
            struct mcu_w *ws[7] = {&D->wq,     &D->wk,   &D->wv,    &D->wo,
                                   &D->w_gate, &D->w_up, &D->w_down};
            for (int i = 0; i < 7; i++)
                mcu_free_w(ws[i]);
        }
    }
    mcu_free_w(&mc->output);
    mcu_free_w(&mc->tok_embd);
    void *bufs[] = {mc->output_norm, mc->x,      mc->xb,  mc->q,      mc->k,
                    mc->v,           mc->att,    mc->hb,  mc->hb2,    mc->o,
                    mc->xh,          mc->logits, mc->wdq, mc->att_ws, mc->d_tab};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
        cudaFree(bufs[i]);
    cudaFreeHost(mc->h_tab);
    cudaFreeHost(mc->h_logits);
    if (mc->blas)
        cublasDestroy(mc->blas);
    if (mc->stream)
        cudaStreamDestroy(mc->stream);
    mem_free(mc->layers);
    mem_free(mc);
}

void model_cuda_stats_get(const struct model_cuda *mc, struct model_cuda_stats *out) {
    *out = mc->st;
}

/* ---- the step --------------------------------------------------------------- */

static cudaDataType_t mcu_dt(enum kcu_type t) {
    return t == KCU_F32 ? CUDA_R_32F : t == KCU_F16 ? CUDA_R_16F : CUDA_R_16BF;
}

/* ys[i][n_tok][n_out_i] = x[n_tok][n_in] . W_i^T for the n weights ws, which
 * all read x (see the convention at the top). x is rounded to a weight's
 * half type once for the group, not once per product. */
static int mcu_matmuls(struct model_cuda *mc, const float *x, uint32_t n_tok,
                       const struct mcu_w *const *ws, float *const *ys, int n) {
    const float one = 1.0f, zero = 0.0f;
    enum kcu_type in_xh = KCU_F32; /* what mc->xh holds: KCU_F32 = nothing yet */
    for (int i = 0; i < n; i++) {
        const struct mcu_w *w = ws[i];
        int m_ = (int)w->n_out, n_ = (int)n_tok, k_ = (int)w->n_in, rc;
        if (w->q8 && n_tok <= 16) {
            if ((rc = kcu_matmul_q8_0(mc->stream, ys[i], x, w->d, k_, m_, n_)))
                return rc;
            continue;
        }
        const void *wd = w->d;
        enum kcu_type t = w->t;
        if (w->q8) {
            if ((rc = kcu_dequant_f16(mc->stream, mc->wdq, w->d, KERN_W_Q8_0,
                                      (size_t)w->n_in * w->n_out)))
                return rc;
            wd = mc->wdq;
            t = KCU_F16;
        }
        if (t == KCU_F32) {
            rc = mcu_blas(cublasGemmEx(mc->blas, CUBLAS_OP_T, CUBLAS_OP_N, m_, n_, k_, &one, wd,
                                       CUDA_R_32F, k_, x, CUDA_R_32F, k_, &zero, ys[i], CUDA_R_32F,
                                       m_, CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_GEMM_DEFAULT),
                          "cublasGemmEx(f32)");
        } else {
            if (in_xh != t && (rc = kcu_to_half(mc->stream, mc->xh, t, x, (size_t)n_tok * w->n_in)))
                return rc;
            in_xh = t;
            rc = mcu_blas(cublasGemmEx(mc->blas, CUBLAS_OP_T, CUBLAS_OP_N, m_, n_, k_, &one, wd,
                                       mcu_dt(t), k_, mc->xh, mcu_dt(t), k_, &zero, ys[i],
                                       CUDA_R_32F, m_, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                          "cublasGemmEx(half)");
        }
        if (rc)
            return rc;
    }
    return 0;
}

static int mcu_matmul(struct model_cuda *mc, float *y, const float *x, const struct mcu_w *w,
                      uint32_t n_tok) {
    return mcu_matmuls(mc, x, n_tok, &w, &y, 1);
}

static int mcu_layer(struct model_cuda *mc, const struct kv_cache *kv, uint32_t il, uint32_t n_tok,
                     uint32_t n_seqs, const struct kcu_att_seq *h_seqs) {
    const struct model_hparams *hp = &mc->m->hp;
    const struct mcu_layer *D = &mc->layers[il];
    char *tab = mc->d_tab;
    size_t n_x = (size_t)n_tok * hp->n_embd;
    struct kcu_att_shape sh = {
        .stride = kv->stride_bytes,
        .k_off = kv->token_offset + (size_t)(2 * il) * kv->layer_bytes,
        .v_off = kv->token_offset + (size_t)(2 * il + 1) * kv->layer_bytes,
        .kvt = (enum kcu_kv)kv->dtype, /* every type: the quantized ones store and read in place */
        .n_head = (int)hp->n_head,
        .n_head_kv = (int)hp->n_head_kv,
        .head_dim = (int)hp->head_dim,
    };
    int rc;
    if ((rc = kcu_rmsnorm(mc->stream, mc->xb, mc->x, NULL, D->attn_norm, (int)n_tok,
                          (int)hp->n_embd, hp->rms_eps)) ||
        (rc = mcu_matmuls(mc, mc->xb, n_tok, (const struct mcu_w *const[]){&D->wq, &D->wk, &D->wv},
                          (float *const[]){mc->q, mc->k, mc->v}, 3)) ||
        (rc = kcu_rope_store(
             mc->stream, mc->q, mc->k, mc->v, (int)n_tok, (const int32_t *)(tab + mc->tl.off_pos),
             (const uint64_t *)(tab + mc->tl.off_kvtok), sh.k_off, sh.v_off, sh.kvt, sh.n_head,
             sh.n_head_kv, sh.head_dim, (int)hp->n_rot, hp->rope_base)) ||
        (rc = kcu_attention(mc->stream, mc->att, mc->q,
                            (const struct kcu_att_seq *)(tab + mc->tl.off_seqs), h_seqs,
                            (int)n_seqs, &sh, mc->att_ws, mc->att_ws_bytes)) ||
        (rc = mcu_matmul(mc, mc->o, mc->att, &D->wo, n_tok)) ||
        (rc = kcu_add(mc->stream, mc->x, mc->o, n_x)) ||
        (rc = kcu_rmsnorm(mc->stream, mc->xb, mc->x, NULL, D->ffn_norm, (int)n_tok, (int)hp->n_embd,
                          hp->rms_eps)) ||
        (rc = mcu_matmuls(mc, mc->xb, n_tok, (const struct mcu_w *const[]){&D->w_gate, &D->w_up},
                          (float *const[]){mc->hb, mc->hb2}, 2)) ||
        (rc = kcu_swiglu(mc->stream, mc->hb, mc->hb, mc->hb2, (size_t)n_tok * hp->n_ff)) ||
        (rc = mcu_matmul(mc, mc->o, mc->hb, &D->w_down, n_tok)) ||
        (rc = kcu_add(mc->stream, mc->x, mc->o, n_x)))
        return rc;
    return 0;
}

/* Rows of logits b wants (model_forward.h): 0 without a buffer, else
 * max(n_logits, 1). */
static uint32_t mcu_logit_rows(const struct model_batch_seq *b) {
    return !b->logits ? 0 : b->n_logits ? b->n_logits : 1;
}

int model_cuda_forward(struct model_cuda *mc, struct kv_cache *kv,
                       const struct model_batch_seq *seqs, uint32_t n_seqs) {
    const struct model_hparams *hp = &mc->m->hp;
    if (n_seqs == 0 || n_seqs > mc->opt.max_seqs || strcmp(vmm_backend_name(kv->vmm), "cuda") != 0)
        return -EINVAL;
    char *h = mc->h_tab;
    int32_t *tokens = (int32_t *)(h + mc->tl.off_tokens), *pos = (int32_t *)(h + mc->tl.off_pos);
    uint64_t *kvtok = (uint64_t *)(h + mc->tl.off_kvtok);
    struct kcu_att_seq *as = (struct kcu_att_seq *)(h + mc->tl.off_seqs);
    int32_t *rows = (int32_t *)(h + mc->tl.off_rows);
    uint32_t n_tok = 0, n_out = 0;
    for (uint32_t s = 0; s < n_seqs; s++) {
        const struct model_batch_seq *b = &seqs[s];
        if (b->pos0 + b->n_tok > mc->opt.max_ctx || n_tok + b->n_tok > mc->opt.max_tok)
            return -EINVAL;
        uint64_t base = vmm_range_base(kv->vmm, b->seq);
        as[s] = (struct kcu_att_seq){.base = base,
                                     .pos0 = (int32_t)b->pos0,
                                     .n_tok = (int32_t)b->n_tok,
                                     .q_row = (int32_t)n_tok};
        for (uint32_t i = 0; i < b->n_tok; i++, n_tok++) {
            tokens[n_tok] = b->tokens[i];
            pos[n_tok] = (int32_t)(b->pos0 + i);
            kvtok[n_tok] = base + (uint64_t)(b->pos0 + i) * kv->stride_bytes;
        }
        for (uint32_t j = mcu_logit_rows(b); j > 0; j--)
            rows[n_out++] = (int32_t)(n_tok - j); /* the last rows, in position order */
    }
    int rc = mcu_rt(cudaSetDevice(mc->dev), "cudaSetDevice");
    if (rc == 0)
        rc = mcu_rt(
            cudaMemcpyAsync(mc->d_tab, mc->h_tab, mc->tl.bytes, cudaMemcpyHostToDevice, mc->stream),
            "cudaMemcpyAsync(tables)");
    bool queued = rc == 0;
    if (rc == 0)
        rc = kcu_embed(mc->stream, mc->x, (const int32_t *)((char *)mc->d_tab + mc->tl.off_tokens),
                       (int)n_tok, mc->tok_embd.d, mc->tok_embd.t, (int)hp->n_embd);
    for (uint32_t il = 0; rc == 0 && il < hp->n_layer; il++)
        rc = mcu_layer(mc, kv, il, n_tok, n_seqs, as);
    /* the classifier over the rows that want logits, logit_rows at a time */
    const int32_t *d_rows = (const int32_t *)((char *)mc->d_tab + mc->tl.off_rows);
    uint32_t done = 0, s_next = 0, j_next = 0;
    while (rc == 0 && done < n_out) {
        uint32_t nr = n_out - done < mc->logit_rows ? n_out - done : mc->logit_rows;
        if ((rc = kcu_rmsnorm(mc->stream, mc->xb, mc->x, d_rows + done, mc->output_norm, (int)nr,
                              (int)hp->n_embd, hp->rms_eps)) ||
            (rc = mcu_matmul(mc, mc->logits, mc->xb, &mc->output, nr)) ||
            (rc = mcu_rt(cudaMemcpyAsync(mc->h_logits, mc->logits,
                                         (size_t)nr * hp->n_vocab * sizeof(float),
                                         cudaMemcpyDeviceToHost, mc->stream),
                         "cudaMemcpyAsync(logits)")) ||
            (rc = mcu_rt(cudaStreamSynchronize(mc->stream), "cudaStreamSynchronize")))
            break;
        for (uint32_t k = 0; k < nr; k++, j_next++) {
            while (j_next == mcu_logit_rows(&seqs[s_next])) {
                s_next++;
                j_next = 0;
            }
            memcpy(seqs[s_next].logits + (size_t)j_next * hp->n_vocab,
                   mc->h_logits + (size_t)k * hp->n_vocab, hp->n_vocab * sizeof(float));
        }
        done += nr;
    }
    if (rc == 0 && n_out == 0)
        rc = mcu_rt(cudaStreamSynchronize(mc->stream), "cudaStreamSynchronize");
    if (rc && queued) {
        /* work already queued may still write KV and read the pinned tables:
         * drain it before the caller unmaps ranges or the next step refills
         * the tables; what was written cannot be told apart, so -EIO */
        cudaStreamSynchronize(mc->stream);
        rc = -EIO;
    }
    if (rc == 0)
        mc->st.steps++;
    return rc;
}
