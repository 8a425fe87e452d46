/* kv.h - the KV cache of a model, in vmm pages (DESIGN.md §2).
 *
 * Layout: token-major. Each sequence owns one contiguous vmm range; token t
 * of it lives at base + t*S, where the token stride
 * S = n_layer * 2 * n_head_kv * head_dim * b (padded to 64 B by vmm), and
 * inside a token K of layer l is at 2l*H_kv*d*b, V at (2l+1)*H_kv*d*b:
 *
 *   base                     base+S                    base+2S
 *   | K0 V0 K1 V1 ... K(L-1) V(L-1) | K0 V0 ...          | ...
 *   |<------------- token 0 ------->|<---- token 1 ----->|
 *
 * Attention reads K(l) of every token as a strided tensor (stride S), so no
 * page table or gather is needed. Pages are mapped as the sequence grows.
 *
 * Thread safety: as vmm: kv_seq_reserve/kv_seq_close serialize on the pool
 * lock; the forward pass only reads the base address and writes KV bytes of
 * its own sequence.
 */
#ifndef LLMD_KV_H
#define LLMD_KV_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/kern.h"
#include "vmm/vmm.h"

struct model_hparams;

enum kv_dtype { KV_F32 = 0, KV_F16 = 1 };

/* Where the pages live: host memory (the CPU forward pass) or a CUDA device
 * (the vmm CUDA backend; then every address kv.h returns is a device
 * address the host must not dereference). */
enum kv_device { KV_DEV_HOST = 0, KV_DEV_CUDA = 1 };

struct kv_config {
    enum kv_dtype dtype;   /* element type of K and V */
    uint32_t n_ctx;        /* max tokens per sequence */
    uint32_t n_seqs;       /* sequence slots */
    size_t page_bytes;     /* requested page size (0: 16 tokens); capped and rounded as
                            * vmm.h says */
    uint64_t budget_bytes; /* physical KV budget (0: enough for n_seqs * n_ctx) */
    enum vmm_huge huge;    /* host pages only */
    enum kv_device device;
    int cuda_ordinal; /* KV_DEV_CUDA: the device */
};

struct kv_cache {
    struct vmm *vmm;
    enum kv_dtype dtype;
    uint32_t n_ctx;
    uint32_t n_layer, n_head_kv, head_dim;
    size_t elem_bytes;   /* 4 or 2 */
    size_t stride_bytes; /* S, padded */
    size_t layer_bytes;  /* H_kv * d * b: one K or V block of one layer */
    enum kv_device device;
    int cuda_ordinal; /* KV_DEV_CUDA: the device the pages are on */
};

/* Create the cache and its page pool. A budget smaller than one page still
 * gets one page. Returns 0, -EINVAL (n_ctx or n_seqs 0, or a geometry vmm
 * refuses), -ENOMEM (out of memory, or a configuration whose mappings could
 * exceed vm.max_map_count: errbuf says what to change), -ENOTSUP (a CUDA
 * cache in a build or on a machine without CUDA: errbuf says which), or a
 * backend error.
 * Caller frees with kv_cache_destroy(). */
int kv_cache_create(const struct model_hparams *hp, const struct kv_config *cfg,
                    struct kv_cache **out, char *errbuf, size_t errlen);
void kv_cache_destroy(struct kv_cache *kv);

/* Open a sequence: take a range slot. -EBUSY when all n_seqs are in use. */
int kv_seq_open(struct kv_cache *kv, uint32_t *seq);

/* Make tokens [0, n_tokens) of seq writable (maps pages as needed).
 * -ERANGE past n_ctx, -ENOSPC when the page budget is exhausted. */
int kv_seq_reserve(struct kv_cache *kv, uint32_t seq, uint32_t n_tokens);

/* Close a sequence: unmap its pages and free the slot. */
void kv_seq_close(struct kv_cache *kv, uint32_t seq);

/* Strided view of layer il of seq for the attention kernel. */
void kv_layer_view(const struct kv_cache *kv, uint32_t seq, uint32_t il, int n_head,
                   struct kern_kv *out);

/* Address of K (is_v = 0) or V (is_v = 1) of token t, layer il:
 * [n_head_kv][head_dim] elements of dtype. */
void *kv_slot(const struct kv_cache *kv, uint32_t seq, uint32_t t, uint32_t il, int is_v);

#endif /* LLMD_KV_H */
