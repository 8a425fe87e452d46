/* kv.c - the KV cache on vmm ranges (see kv.h).
 *
 * Pages by need and pages mapped ahead: need[seq] is what seq's range would
 * map without the map-ahead thread (its shared pages and what its reserves
 * covered); the range's mapped extent is need[seq] plus what the thread
 * mapped ahead. Every count kv gives out is of the first kind, and the pages
 * mapped ahead are counted as free (kv_pages_free), since kv_reclaim() can
 * turn them back into free pages at any time. A reserve that finds the free
 * list short reclaims them before it reports -ENOSPC, so the pages a caller
 * counted as free are always there.
 */
#include "engine/model/kv.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "engine/model/kv_ahead.h"
#include "engine/model/model.h"
#include "kernels/kern_cuda.h"
#include "log.h"
#include "mem.h"
#include "vmm/vmm_cuda_util.h"

_Static_assert((int)KV_F32 == (int)KERN_KV_F32 && (int)KV_F16 == (int)KERN_KV_F16 &&
                   (int)KV_Q8_0 == (int)KERN_KV_Q8_0 && (int)KV_Q4_0 == (int)KERN_KV_Q4_0 &&
                   (int)KV_FP8 == (int)KERN_KV_FP8 && (int)KV_DTYPE_N == (int)KERN_KV_N,
               "kv_dtype is kern_kv_type, value for value");

static const char *const kv_names[KV_DTYPE_N] = {"f32", "f16", "q8_0", "q4_0", "fp8"};

const char *kv_dtype_name(enum kv_dtype t) {
    return (unsigned)t < KV_DTYPE_N ? kv_names[t] : "?";
}

int kv_dtype_parse(const char *name, enum kv_dtype *out) {
    for (int i = 0; name && i < KV_DTYPE_N; i++)
        if (strcmp(name, kv_names[i]) == 0) {
            *out = (enum kv_dtype)i;
            return 0;
        }
    return -EINVAL;
}

const char *kv_dtype_names(void) {
    return "f32|f16|q8_0|q4_0|fp8";
}

static uint32_t kv_pages_for(const struct kv_cache *kv, uint32_t n_tokens) {
    return n_tokens / kv->tpp + (n_tokens % kv->tpp != 0);
}

int kv_cache_create(const struct model_hparams *hp, const struct kv_config *cfg,
                    struct kv_cache **out, char *errbuf, size_t errlen) {
    if (cfg->n_ctx == 0 || cfg->n_seqs == 0) {
        snprintf(errbuf, errlen, "kv: n_ctx and n_seqs must be positive");
        return -EINVAL;
    }
    if ((unsigned)cfg->dtype >= KV_DTYPE_N) {
        snprintf(errbuf, errlen, "kv: unknown KV type %d (known: %s)", (int)cfg->dtype,
                 kv_dtype_names());
        return -EINVAL;
    }
    /* the CUDA store stages a quantized row in shared memory (kcu_kv_store) */
    if (cfg->device == KV_DEV_CUDA && cfg->dtype != KV_F32 && cfg->dtype != KV_F16 &&
        (uint64_t)hp->n_head_kv * hp->head_dim > KCU_KV_MAX_ROW) {
        snprintf(errbuf, errlen,
                 "kv: KV type %s on CUDA takes rows of at most %d values (n_head_kv x head_dim), "
                 "this model's are %llu: use --kv-type f16 with --device cuda",
                 kv_dtype_name(cfg->dtype), KCU_KV_MAX_ROW,
                 (unsigned long long)hp->n_head_kv * hp->head_dim);
        return -ENOTSUP;
    }
    if (cfg->draft_hp && cfg->device != KV_DEV_HOST) {
        snprintf(errbuf, errlen, "kv: a draft model's KV is on the CPU only");
        return -ENOTSUP;
    }
    struct kv_cache *kv = mem_calloc(MEM_MODEL, 1, sizeof(*kv));
    if (!kv)
        return -ENOMEM;
    kv->dtype = cfg->dtype;
    kv->n_ctx = cfg->n_ctx;
    kv->n_layer = hp->n_layer;
    kv->n_head_kv = hp->n_head_kv;
    kv->head_dim = hp->head_dim;
    kv->layer_bytes =
        kern_kv_row_bytes((enum kern_kv_type)cfg->dtype, (int)hp->n_head_kv, (int)hp->head_dim);

    /* default page: 16 tokens, so a long context is not thousands of maps
     * (vmm caps any request at what n_ctx tokens can use) */
    uint64_t token_bytes = model_kv_token_bytes(hp, kv->layer_bytes);
    if (cfg->draft_hp) {
        /* the draft's rows start 64-B aligned, as the target's do */
        const struct model_hparams *d = cfg->draft_hp;
        kv->draft_n_layer = d->n_layer;
        kv->draft_n_head_kv = d->n_head_kv;
        kv->draft_head_dim = d->head_dim;
        kv->draft_layer_bytes =
            kern_kv_row_bytes((enum kern_kv_type)cfg->dtype, (int)d->n_head_kv, (int)d->head_dim);
        kv->draft_offset = (size_t)(token_bytes + 63) / 64 * 64;
        kv->draft_bytes = (size_t)model_kv_token_bytes(d, kv->draft_layer_bytes);
        token_bytes = kv->draft_offset + kv->draft_bytes;
    }
    size_t page_bytes = cfg->page_bytes ? cfg->page_bytes : (size_t)(16 * token_bytes);
    struct vmm_config vc = {
        .huge = cfg->huge,
        .token_bytes = token_bytes,
        .page_bytes = page_bytes,
        .budget_bytes = cfg->budget_bytes,
        .n_ranges = cfg->n_seqs,
        .max_tokens = cfg->n_ctx,
        .prefault = true,
    };
    kv->device = cfg->device;
    kv->cuda_ordinal = cfg->cuda_ordinal;
    if (cfg->device == KV_DEV_CUDA) {
        int rc = vmm_cuda_backend_create(cfg->cuda_ordinal, &vc.backend);
        if (rc < 0) {
            snprintf(errbuf, errlen, "kv: no CUDA KV pool on device %d: %s", cfg->cuda_ordinal,
                     rc == -ENOTSUP ? vmm_cuda_why_unavailable() : strerror(-rc));
            mem_free(kv);
            return rc;
        }
    }
    int rc = vmm_create(&vc, &kv->vmm, errbuf, errlen);
    if (rc < 0) {
        mem_free(kv);
        return rc;
    }
    kv->stride_bytes = vmm_token_bytes(kv->vmm);
    kv->n_seqs = cfg->n_seqs;
    kv->tpp = vmm_tokens_per_page(kv->vmm);
    kv->need = mem_calloc(MEM_MODEL, kv->n_seqs, sizeof *kv->need);
    if (!kv->need)
        rc = -ENOMEM;
    else if (cfg->map_ahead)
        rc = kv_ahead_create(kv->vmm, kv->n_seqs, &kv->ahead);
    if (rc < 0) {
        snprintf(errbuf, errlen, "kv: cannot start the map-ahead thread");
        kv_cache_destroy(kv);
        return rc;
    }
    *out = kv;
    return 0;
}

void kv_cache_destroy(struct kv_cache *kv) {
    if (!kv)
        return;
    kv_ahead_destroy(kv->ahead); /* before the pool it maps into */
    vmm_destroy(kv->vmm);
    mem_free(kv->need);
    mem_free(kv);
}

int kv_seq_open(struct kv_cache *kv, uint32_t *seq) {
    int rc = vmm_range_acquire(kv->vmm, seq);
    if (rc == 0)
        kv->need[*seq] = 0;
    return rc;
}

int kv_seq_reserve(struct kv_cache *kv, uint32_t seq, uint32_t n_tokens) {
    if (n_tokens > kv->n_ctx)
        return -ERANGE;
    if (seq >= kv->n_seqs)
        return -EINVAL;
    uint32_t pages = kv_pages_for(kv, n_tokens);
    int rc = 0;
    if (!kv_seq_backed(kv, seq, n_tokens)) {
        rc = vmm_range_grow(kv->vmm, seq, n_tokens);
        if (rc == -ENOSPC && kv->ahead) {
            uint32_t have = vmm_range_n_mapped(kv->vmm, seq);
            kv_reclaim(kv, pages > have ? pages - have : 1, seq);
            rc = vmm_range_grow(kv->vmm, seq, n_tokens);
        }
    }
    if (rc == 0 && pages > kv->need[seq])
        kv->need[seq] = pages;
    return rc;
}

int kv_seq_reserve_more(struct kv_cache *kv, uint32_t seq, uint32_t n_tokens, uint32_t n_more) {
    uint64_t all = (uint64_t)n_tokens + n_more;
    if (kv->ahead && n_more && seq < kv->n_seqs && all <= kv->n_ctx &&
        !kv_seq_backed(kv, seq, (uint32_t)all) &&
        vmm_range_grow(kv->vmm, seq, (uint32_t)all) == 0) {
        uint32_t pages = kv_pages_for(kv, n_tokens);
        if (pages > kv->need[seq])
            kv->need[seq] = pages;
        return 0;
    }
    return kv_seq_reserve(kv, seq, n_tokens); /* no reclaim for the extra tokens */
}

bool kv_seq_backed(const struct kv_cache *kv, uint32_t seq, uint32_t n_tokens) {
    return vmm_range_capacity(kv->vmm, seq) >= n_tokens;
}

int kv_seq_share(struct kv_cache *kv, uint32_t seq, uint32_t page) {
    if (seq >= kv->n_seqs)
        return -EINVAL;
    if (vmm_range_n_mapped(kv->vmm, seq) != kv->need[seq])
        return -EBUSY;
    int rc = vmm_range_share(kv->vmm, seq, page);
    if (rc == 0)
        kv->need[seq]++;
    return rc;
}

uint32_t kv_seq_pages(const struct kv_cache *kv, uint32_t seq) {
    return seq < kv->n_seqs ? kv->need[seq] : 0;
}

int kv_seq_drop_front(struct kv_cache *kv, uint32_t seq, uint32_t first_token) {
    if (seq >= kv->n_seqs)
        return -EINVAL;
    uint32_t pages = first_token / kv->tpp, had = vmm_range_n_dropped(kv->vmm, seq);
    if (pages > kv->need[seq])
        pages = kv->need[seq]; /* never the pages mapped ahead */
    if (pages <= had)
        return 0;
    int rc = vmm_range_drop_front(kv->vmm, seq, pages);
    return rc < 0 ? rc : (int)(pages - had);
}

void kv_seq_ahead(struct kv_cache *kv, uint32_t seq, uint32_t n_tokens, uint32_t max_tokens,
                  uint32_t *budget) {
    if (!kv->ahead || seq >= kv->n_seqs || *budget == 0)
        return;
    uint32_t lim = max_tokens < kv->n_ctx ? max_tokens : kv->n_ctx;
    uint32_t most = kv_pages_for(kv, lim);
    uint32_t want = kv_pages_for(kv, n_tokens < lim ? n_tokens : lim) + KV_AHEAD_SPARE;
    if (want > most)
        want = most;
    uint32_t have = vmm_range_n_mapped(kv->vmm, seq);
    if (want <= have)
        return;
    if (want - have > *budget)
        want = have + *budget;
    *budget -= want - have;
    kv_ahead_post(kv->ahead, seq, want);
}

int kv_seq_trim(struct kv_cache *kv, uint32_t seq, uint32_t n_tokens) {
    if (seq >= kv->n_seqs)
        return -EINVAL;
    uint32_t pages = kv_pages_for(kv, n_tokens < kv->n_ctx ? n_tokens : kv->n_ctx);
    if (pages >= kv->need[seq])
        return 0;
    uint32_t keep = pages + (kv->ahead ? KV_AHEAD_SPARE : 0);
    if (vmm_range_n_mapped(kv->vmm, seq) > keep) {
        if (kv->ahead)
            kv_ahead_cancel(kv->ahead, seq); /* no map into a range while it shrinks */
        uint64_t t = (uint64_t)keep * kv->tpp;
        int rc = vmm_range_shrink(kv->vmm, seq, t < kv->n_ctx ? (uint32_t)t : kv->n_ctx);
        if (rc < 0)
            return rc;
    }
    uint32_t dropped = kv->need[seq] - pages;
    kv->need[seq] = pages;
    return (int)dropped;
}

void kv_seq_close(struct kv_cache *kv, uint32_t seq) {
    if (kv->ahead)
        kv_ahead_cancel(kv->ahead, seq);
    vmm_range_release(kv->vmm, seq);
    if (seq < kv->n_seqs)
        kv->need[seq] = 0;
}

uint32_t kv_pages_free(const struct kv_cache *kv, uint32_t *ahead) {
    struct vmm_stats st;
    vmm_stats_get(kv->vmm, &st);
    uint64_t need = 0; /* held by need: a window's dropped front is held by none */
    for (uint32_t i = 0; i < kv->n_seqs; i++)
        need += kv->need[i] - vmm_range_n_dropped(kv->vmm, i);
    uint64_t a = st.range_pages_mapped > need ? st.range_pages_mapped - need : 0;
    if (ahead)
        *ahead = (uint32_t)a;
    return (uint32_t)(st.pages_free + a);
}

uint32_t kv_reclaim(struct kv_cache *kv, uint32_t n, uint32_t keep) {
    struct vmm_stats st;
    vmm_stats_get(kv->vmm, &st);
    if (!kv->ahead || st.pages_free >= n)
        return (uint32_t)st.pages_free;
    kv_ahead_cancel_all(kv->ahead);
    for (uint32_t i = 0; i < kv->n_seqs; i++) {
        if (i == keep || vmm_range_n_mapped(kv->vmm, i) <= kv->need[i])
            continue;
        uint64_t t = (uint64_t)kv->need[i] * kv->tpp;
        /* a failed unmap leaves the pages mapped: the caller's grow fails */
        (void)vmm_range_shrink(kv->vmm, i, t < kv->n_ctx ? (uint32_t)t : kv->n_ctx);
    }
    vmm_stats_get(kv->vmm, &st);
    return (uint32_t)st.pages_free;
}

int kv_cache_draft_view(const struct kv_cache *kv, struct kv_cache *out) {
    if (!kv->draft_offset)
        return -EINVAL;
    *out = *kv;
    out->n_layer = kv->draft_n_layer;
    out->n_head_kv = kv->draft_n_head_kv;
    out->head_dim = kv->draft_head_dim;
    out->layer_bytes = kv->draft_layer_bytes;
    out->token_offset = kv->draft_offset;
    return 0;
}

void kv_ahead_sync(struct kv_cache *kv) {
    if (kv->ahead)
        kv_ahead_drain(kv->ahead);
}

void *kv_slot(const struct kv_cache *kv, uint32_t seq, uint32_t t, uint32_t il, int is_v) {
    uintptr_t base = vmm_range_base(kv->vmm, seq);
    return (void *)(base + (uintptr_t)t * kv->stride_bytes + kv->token_offset +
                    (uintptr_t)(2 * il + (uint32_t)is_v) * kv->layer_bytes);
}

void kv_layer_view(const struct kv_cache *kv, uint32_t seq, uint32_t il, int n_head,
                   struct kern_kv *out) {
    *out = (struct kern_kv){
        .k = kv_slot(kv, seq, 0, il, 0),
        .v = kv_slot(kv, seq, 0, il, 1),
        .stride_bytes = kv->stride_bytes,
        .type = (enum kern_kv_type)kv->dtype,
        .n_head = n_head,
        .n_kv_head = (int)kv->n_head_kv,
        .head_dim = (int)kv->head_dim,
    };
}

bool kv_check(const struct kv_cache *kv) {
    if (!vmm_check(kv->vmm))
        return false;
    for (uint32_t i = 0; i < kv->n_seqs; i++) {
        uint32_t n = vmm_range_n_mapped(kv->vmm, i);
        if (n < kv->need[i]) {
            LOG_ERROR("kv", "check: seq %u maps %u pages but needs %u", i, n, kv->need[i]);
            return false;
        }
    }
    return true;
}
