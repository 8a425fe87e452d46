/* model_eval.c - the KV cache types against f32 over a text (model_eval.h).
 *
 * Every cache runs the same tokens in lock step, one decode step a token,
 * so at each position the f32 logits and each type's are at hand together
 * and nothing is stored per position: memory is one logits row per cache
 * whatever the text's length. Sums are in double; a distribution is the
 * log-softmax of the f32 logits (max subtracted), so KL and the next token's
 * log-probability come from the same numbers.
 */
#include "engine/model/model_eval.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>

#include "engine/model/model.h"
#include "engine/model/model_forward.h"
#include "engine/model/smp.h"
#include "engine/model/tok.h"
#include "mem.h"

/* What one cache holds during a run. */
struct eval_run {
    struct kv_cache *kv;
    uint32_t seq;
    float *logits; /* [n_vocab] this position's */
    double *lp;    /* [n_vocab] their log-softmax */
    double kl_sum, nll_sum;
    uint64_t agree;
    struct model_eval_result *out;
};

static void eval_log_softmax(const float *l, double *lp, uint32_t n) {
    const double lse = smp_logsumexp(l, n);
    for (uint32_t i = 0; i < n; i++)
        lp[i] = (double)l[i] - lse;
}

static uint32_t eval_argmax(const float *l, uint32_t n) {
    uint32_t best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (l[i] > l[best])
            best = i;
    return best;
}

static void eval_runs_free(struct eval_run *r, uint32_t n) {
    for (uint32_t i = 0; r && i < n; i++) {
        kv_cache_destroy(r[i].kv);
        mem_free(r[i].logits);
        mem_free(r[i].lp);
    }
    mem_free(r);
}

/* One window: w[0] = BOS, then len - 1 text tokens, through every cache. */
static int eval_window(const struct model *m, struct model_ctx *ctx, struct eval_run *r,
                       uint32_t n_run, const int32_t *w, uint32_t len) {
    const uint32_t nv = m->hp.n_vocab;
    int rc = 0;
    uint32_t opened = 0;
    for (; opened < n_run; opened++) {
        if ((rc = kv_seq_open(r[opened].kv, &r[opened].seq)) < 0)
            goto done;
        if ((rc = kv_seq_reserve(r[opened].kv, r[opened].seq, len)) < 0) {
            opened++; /* open: closed below */
            goto done;
        }
    }
    for (uint32_t j = 0; j + 1 < len; j++) {
        for (uint32_t k = 0; k < n_run; k++)
            if ((rc = model_forward(ctx, r[k].kv, r[k].seq, &w[j], 1, j, r[k].logits)) < 0)
                goto done;
        const uint32_t next = (uint32_t)w[j + 1], top_ref = eval_argmax(r[0].logits, nv);
        eval_log_softmax(r[0].logits, r[0].lp, nv);
        for (uint32_t k = 0; k < n_run; k++) {
            if (k > 0) {
                eval_log_softmax(r[k].logits, r[k].lp, nv);
                double kl = 0;
                for (uint32_t i = 0; i < nv; i++)
                    kl += exp(r[0].lp[i]) * (r[0].lp[i] - r[k].lp[i]);
                kl = kl > 0 ? kl : 0; /* rounding can leave -1e-17 where they agree */
                r[k].kl_sum += kl;
                if (kl > r[k].out->kl_max)
                    r[k].out->kl_max = kl;
            }
            r[k].nll_sum -= r[k].lp[next];
            r[k].agree += eval_argmax(r[k].logits, nv) == top_ref;
            r[k].out->n_pred++;
        }
    }
done:
    for (uint32_t k = 0; k < opened; k++)
        kv_seq_close(r[k].kv, r[k].seq);
    return rc;
}

int model_eval_kv(const struct model *m, struct kern_pool *pool, const int32_t *ids, uint32_t n_ids,
                  uint32_t window, const enum kv_dtype *types, uint32_t n_types,
                  struct model_eval_result *ref, struct model_eval_result *res, char *errbuf,
                  size_t errlen) {
    const struct model_hparams *hp = &m->hp;
    const uint32_t ctx_max = hp->n_ctx_train ? hp->n_ctx_train : 512;
    if (window == 0)
        window = ctx_max < 512 ? ctx_max : 512;
    const int32_t bos = tok_bos(m->tok);
    const char *why = n_ids == 0                       ? "no tokens"
                      : window < 2 || window > ctx_max ? "the window must hold 2 tokens and fit "
                                                         "the context"
                      : bos < 0                        ? "the model has no BOS token"
                                                       : NULL;
    for (uint32_t i = 0; !why && i < n_ids; i++)
        if (ids[i] < 0 || (uint32_t)ids[i] >= hp->n_vocab)
            why = "a token outside the vocabulary";
    if (why) {
        snprintf(errbuf, errlen, "eval: %s (window %u, context %u)", why, window, ctx_max);
        return -EINVAL;
    }
    const uint32_t n_run = n_types + 1;
    struct eval_run *r = mem_calloc(MEM_MODEL, n_run, sizeof *r);
    int32_t *w = mem_alloc(MEM_MODEL, (size_t)window * sizeof *w);
    struct model_ctx *ctx = NULL;
    int rc = r && w ? model_ctx_create(m, pool, 1, &ctx) : -ENOMEM;
    for (uint32_t k = 0; rc == 0 && k < n_run; k++) {
        struct model_eval_result *o = k ? &res[k - 1] : ref;
        *o = (struct model_eval_result){.type = k ? types[k - 1] : KV_F32};
        r[k].out = o;
        struct kv_config kc = {.dtype = o->type, .n_ctx = window, .n_seqs = 1};
        rc = kv_cache_create(hp, &kc, &r[k].kv, errbuf, errlen);
        if (rc == 0) {
            if (errbuf && errlen)
                errbuf[0] = '\0'; /* vmm writes "ok" there on success */
            o->token_bytes = r[k].kv->stride_bytes;
            r[k].logits = mem_alloc(MEM_MODEL, hp->n_vocab * sizeof(float));
            r[k].lp = mem_alloc(MEM_MODEL, hp->n_vocab * sizeof(double));
            rc = r[k].logits && r[k].lp ? 0 : -ENOMEM;
        }
    }
    for (uint32_t at = 0; rc == 0 && at < n_ids; at += window - 1) {
        uint32_t len = n_ids - at < window - 1 ? n_ids - at : window - 1;
        w[0] = bos;
        for (uint32_t j = 0; j < len; j++)
            w[1 + j] = ids[at + j];
        rc = eval_window(m, ctx, r, n_run, w, len + 1);
    }
    for (uint32_t k = 0; rc == 0 && k < n_run; k++) {
        struct model_eval_result *o = r[k].out;
        const double n = o->n_pred ? (double)o->n_pred : 1;
        o->kl_mean = r[k].kl_sum / n;
        o->top1 = (double)r[k].agree / n;
        o->ppl = exp(r[k].nll_sum / n);
    }
    if (rc == -ENOMEM && errbuf && errlen && !errbuf[0])
        snprintf(errbuf, errlen, "eval: out of memory");
    model_ctx_destroy(ctx);
    mem_free(w);
    eval_runs_free(r, n_run);
    return rc;
}
