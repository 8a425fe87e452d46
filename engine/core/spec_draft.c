/* spec_draft.c - the draft model (see spec_draft.h).
 *
 * One step's work is 1 + (longest draft - 1) batched forward passes of the
 * draft model: the first over every sequence's unseen committed tokens
 * (prefill chunks, decode tokens), each drafting sequence wanting the
 * logits of its last token; then one single-token pass per further draft
 * position over the sequences still drafting. Each draft token is the
 * argmax of its row (smp_argmax: the lowest id on a tie, NaN never wins),
 * so drafts are deterministic and the kernels' batch invariance makes them
 * the same however the requests are batched.
 */
#include "engine/core/spec_draft.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "engine/model/gguf.h"
#include "engine/model/kv.h"
#include "engine/model/model.h"
#include "engine/model/model_forward.h"
#include "engine/model/smp.h"
#include "engine/model/tok.h"
#include "mem.h"

struct spec_draft {
    struct model *m;
    struct model_ctx *ctx;
    struct kv_cache view; /* the draft's geometry over the target's ranges */
    uint32_t max_tok, max_seqs;
    struct model_batch_seq *b; /* [max_seqs] */
    uint32_t *who;             /* [max_seqs] which spec_draft_seq each b[] is */
    float *logits;             /* [max_seqs][n_vocab] */
    struct spec_fit fit;       /* the passes' cost, once probed */
    bool fit_on;
};

static uint64_t sd_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* One forward pass of the draft over b[0..n_b), timed into the cost model
 * when it is a decode's pass (at most two tokens a sequence): a prefill
 * chunk's tokens share their matrix products and would bend the line. */
static int sd_pass(struct spec_draft *d, uint32_t n_b) {
    uint32_t tok = 0;
    for (uint32_t i = 0; i < n_b; i++)
        tok += d->b[i].n_tok;
    uint64_t t0 = sd_now();
    int rc = model_forward_batch(d->ctx, &d->view, d->b, n_b);
    if (rc == 0 && d->fit_on && tok <= 2 * n_b)
        spec_fit_add(&d->fit, tok, (double)(sd_now() - t0));
    return rc;
}

/* A token string for a message: printable ASCII as is, other bytes as
 * \xNN, at most 40 bytes of it. */
static void sd_quote(struct gguf_str s, char *out, size_t cap) {
    size_t o = 0;
    for (uint64_t i = 0; i < s.len && i < 40 && o + 5 < cap; i++) {
        unsigned char c = (unsigned char)s.ptr[i];
        if (c >= 0x20 && c < 0x7f && c != '\'')
            out[o++] = (char)c;
        else
            o += (size_t)snprintf(out + o, cap - o, "\\x%02x", c);
    }
    out[o] = '\0';
}

/* The same vocabulary: size, every token's string, EOS. */
static int sd_vocab_check(const char *path, const struct model *t, const struct model *d,
                          char *errbuf, size_t errlen) {
    if (d->hp.n_vocab != t->hp.n_vocab) {
        snprintf(errbuf, errlen,
                 "llmd: --spec-model %s: its vocabulary has %u tokens, the target's %u", path,
                 d->hp.n_vocab, t->hp.n_vocab);
        return -EINVAL;
    }
    const struct gguf_str *ta, *da;
    uint64_t tn, dn;
    if (gguf_get_str_arr(t->gguf, "tokenizer.ggml.tokens", &tn, &ta) < 0 ||
        gguf_get_str_arr(d->gguf, "tokenizer.ggml.tokens", &dn, &da) < 0 || tn != dn) {
        snprintf(errbuf, errlen, "llmd: --spec-model %s: its token list differs from the target's",
                 path);
        return -EINVAL;
    }
    for (uint64_t i = 0; i < tn; i++) {
        if (ta[i].len == da[i].len && memcmp(ta[i].ptr, da[i].ptr, ta[i].len) == 0)
            continue;
        char a[200], b[200];
        sd_quote(da[i], a, sizeof a);
        sd_quote(ta[i], b, sizeof b);
        snprintf(errbuf, errlen,
                 "llmd: --spec-model %s: token %llu is '%s' there and '%s' in the target", path,
                 (unsigned long long)i, a, b);
        return -EINVAL;
    }
    if (tok_eos(d->tok) != tok_eos(t->tok)) {
        snprintf(errbuf, errlen, "llmd: --spec-model %s: its EOS is token %d, the target's %d",
                 path, (int)tok_eos(d->tok), (int)tok_eos(t->tok));
        return -EINVAL;
    }
    return 0;
}

int spec_draft_load(const char *path, const struct model *target, struct kern_pool *pool,
                    struct spec_draft **out, char *errbuf, size_t errlen) {
    struct spec_draft *d = mem_calloc(MEM_SCHED, 1, sizeof(*d));
    if (!d)
        return -ENOMEM;
    char err[512] = "";
    int rc = model_load(path, &(struct model_load_opts){.quiet = true, .pool = pool}, &d->m, err,
                        sizeof err);
    if (rc < 0) {
        if (err[0]) /* the loader's message names the file */
            snprintf(errbuf, errlen, "llmd: --spec-model: %s", err);
        else
            snprintf(errbuf, errlen, "llmd: --spec-model %s: %s", path, strerror(-rc));
        mem_free(d);
        return rc;
    }
    if ((rc = sd_vocab_check(path, target, d->m, errbuf, errlen)) < 0) {
        spec_draft_close(d);
        return rc;
    }
    *out = d;
    return 0;
}

const struct model_hparams *spec_draft_hparams(const struct spec_draft *d) {
    return &d->m->hp;
}

const struct model *spec_draft_model(const struct spec_draft *d) {
    return d->m;
}

const char *spec_draft_name(const struct spec_draft *d) {
    return d->m->name;
}

int spec_draft_start(struct spec_draft *d, struct kv_cache *kv, struct kern_pool *pool,
                     uint32_t max_tok, uint32_t max_seqs) {
    if (kv_cache_draft_view(kv, &d->view) < 0 || max_seqs == 0)
        return -EINVAL;
    d->max_tok = max_tok;
    d->max_seqs = max_seqs;
    d->b = mem_alloc(MEM_SCHED, max_seqs * sizeof(*d->b));
    d->who = mem_alloc(MEM_SCHED, max_seqs * sizeof(*d->who));
    d->logits = mem_alloc(MEM_SCHED, (size_t)max_seqs * d->m->hp.n_vocab * sizeof(float));
    if (!d->b || !d->who || !d->logits)
        return -ENOMEM;
    return model_ctx_create(d->m, pool, max_tok, &d->ctx);
}

/* The argmax of each row of the pass just run, as draft token j. */
static void sd_pick(struct spec_draft *d, const struct spec_draft_seq *s, uint32_t n_b,
                    uint32_t j) {
    for (uint32_t i = 0; i < n_b; i++)
        if (d->b[i].logits)
            s[d->who[i]].draft[j] = smp_argmax(d->b[i].logits, d->m->hp.n_vocab);
}

int spec_draft_run(struct spec_draft *d, const struct spec_draft_seq *s, uint32_t n) {
    uint32_t n_b = 0, longest = 0, rows = 0, n_vocab = d->m->hp.n_vocab;
    if (n > d->max_seqs)
        return -EINVAL;
    for (uint32_t i = 0; i < n; i++) {
        for (uint32_t j = 0; j < s[i].n_draft; j++)
            s[i].draft[j] = 0; /* a valid id whatever fails below */
        longest = s[i].n_draft > longest ? s[i].n_draft : longest;
        if (s[i].n_tok == 0)
            continue;
        bool want = s[i].n_draft > 0;
        d->who[n_b] = i;
        d->b[n_b++] = (struct model_batch_seq){
            .seq = s[i].seq,
            .pos0 = s[i].pos0,
            .n_tok = s[i].n_tok,
            .tokens = s[i].tokens,
            .logits = want ? d->logits + (size_t)rows++ * n_vocab : NULL,
        };
    }
    int rc = n_b ? sd_pass(d, n_b) : 0;
    if (rc < 0)
        return rc;
    sd_pick(d, s, n_b, 0);
    for (uint32_t j = 1; j < longest; j++) {
        n_b = 0;
        for (uint32_t i = 0; i < n; i++) {
            if (s[i].n_draft <= j || s[i].n_tok == 0)
                continue;
            d->who[n_b] = i;
            d->b[n_b] = (struct model_batch_seq){
                .seq = s[i].seq,
                .pos0 = s[i].pos0 + s[i].n_tok + j - 1,
                .n_tok = 1,
                .tokens = &s[i].draft[j - 1],
                .logits = d->logits + (size_t)n_b * n_vocab,
            };
            n_b++;
        }
        if ((rc = sd_pass(d, n_b)) < 0)
            return rc;
        sd_pick(d, s, n_b, j);
    }
    return 0;
}

int spec_draft_probe(struct spec_draft *d, uint32_t seq, uint32_t pos, uint32_t k,
                     const int32_t *tokens) {
    if (k == 0 || !d->ctx || pos > d->max_tok || k + 1 > d->max_tok)
        return -EINVAL;
    d->b[0] = (struct model_batch_seq){.seq = seq, .n_tok = pos, .tokens = tokens};
    int rc = pos ? model_forward_batch(d->ctx, &d->view, d->b, 1) : 0;
    double t[2] = {0, 0};
    for (int round = 0; rc == 0 && round < 13; round++) {
        int w = round % 2; /* round 0: the warm-up */
        d->b[0] = (struct model_batch_seq){.seq = seq,
                                           .pos0 = pos,
                                           .n_tok = w ? k + 1 : 1,
                                           .tokens = tokens + pos,
                                           .logits = d->logits};
        uint64_t t0 = sd_now();
        rc = model_forward_batch(d->ctx, &d->view, d->b, 1);
        double dt = (double)(sd_now() - t0);
        if (round > 0 && (t[w] == 0 || dt < t[w]))
            t[w] = dt;
    }
    if (rc < 0)
        return rc;
    struct spec_cost c = spec_cost_from_probe(t[0], t[1], k);
    spec_fit_init(&d->fit, &c);
    d->fit_on = true;
    return 0;
}

void spec_draft_cost(const struct spec_draft *d, struct spec_cost *out) {
    if (!d->fit_on) {
        *out = (struct spec_cost){0};
        return;
    }
    spec_fit_get(&d->fit, out);
}

void spec_draft_close(struct spec_draft *d) {
    if (!d)
        return;
    model_ctx_destroy(d->ctx);
    model_free(d->m);
    mem_free(d->b);
    mem_free(d->who);
    mem_free(d->logits);
    mem_free(d);
}
