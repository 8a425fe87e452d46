/* kv.c - the KV cache on vmm ranges (see kv.h). */
#include "engine/kv.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "engine/model.h"
#include "mem.h"
#include "vmm/vmm_cuda_util.h"

int kv_cache_create(const struct model_hparams *hp, const struct kv_config *cfg,
                    struct kv_cache **out, char *errbuf, size_t errlen) {
    if (cfg->n_ctx == 0 || cfg->n_seqs == 0) {
        snprintf(errbuf, errlen, "kv: n_ctx and n_seqs must be positive");
        return -EINVAL;
    }
    struct kv_cache *kv = mem_calloc(MEM_MODEL, 1, sizeof(*kv));
    if (!kv)
        return -ENOMEM;
    kv->dtype = cfg->dtype;
    kv->n_ctx = cfg->n_ctx;
    kv->n_layer = hp->n_layer;
    kv->n_head_kv = hp->n_head_kv;
    kv->head_dim = hp->head_dim;
    kv->elem_bytes = cfg->dtype == KV_F16 ? 2 : 4;
    kv->layer_bytes = (size_t)hp->n_head_kv * hp->head_dim * kv->elem_bytes;

    /* default page: 16 tokens, so a long context is not thousands of maps
     * (vmm caps any request at what n_ctx tokens can use) */
    uint64_t token_bytes = model_kv_token_bytes(hp, (uint32_t)kv->elem_bytes);
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
    *out = kv;
    return 0;
}

void kv_cache_destroy(struct kv_cache *kv) {
    if (!kv)
        return;
    vmm_destroy(kv->vmm);
    mem_free(kv);
}

int kv_seq_open(struct kv_cache *kv, uint32_t *seq) {
    return vmm_range_acquire(kv->vmm, seq);
}

int kv_seq_reserve(struct kv_cache *kv, uint32_t seq, uint32_t n_tokens) {
    if (n_tokens > kv->n_ctx)
        return -ERANGE;
    if (vmm_range_capacity(kv->vmm, seq) >= n_tokens)
        return 0;
    return vmm_range_grow(kv->vmm, seq, n_tokens);
}

void kv_seq_close(struct kv_cache *kv, uint32_t seq) {
    vmm_range_release(kv->vmm, seq);
}

void *kv_slot(const struct kv_cache *kv, uint32_t seq, uint32_t t, uint32_t il, int is_v) {
    uintptr_t base = vmm_range_base(kv->vmm, seq);
    return (void *)(base + (uintptr_t)t * kv->stride_bytes +
                    (uintptr_t)(2 * il + (uint32_t)is_v) * kv->layer_bytes);
}

void kv_layer_view(const struct kv_cache *kv, uint32_t seq, uint32_t il, int n_head,
                   struct kern_kv *out) {
    *out = (struct kern_kv){
        .k = kv_slot(kv, seq, 0, il, 0),
        .v = kv_slot(kv, seq, 0, il, 1),
        .stride_bytes = kv->stride_bytes,
        .type = kv->dtype == KV_F16 ? KERN_KV_F16 : KERN_KV_F32,
        .n_head = n_head,
        .n_kv_head = (int)kv->n_head_kv,
        .head_dim = (int)kv->head_dim,
    };
}
