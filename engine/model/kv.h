/* kv.h - the KV cache of a model, in vmm pages (DESIGN.md §2).
 *
 * Layout: token-major. Each sequence owns one contiguous vmm range; token t
 * of it lives at base + t*S, where the token stride
 * S = n_layer * 2 * R (padded to 64 B by vmm), R the bytes of one K or V row
 * of one layer (kern_kv_row_bytes: H_kv*d*b for f32/f16, the row's 32-value
 * blocks for q8_0/q4_0, per-head scale + bytes for fp8), and inside a token
 * K of layer l is at 2l*R, V at (2l+1)*R:
 *
 *   base                     base+S                    base+2S
 *   | K0 V0 K1 V1 ... K(L-1) V(L-1) | K0 V0 ...          | ...
 *   |<------------- token 0 ------->|<---- token 1 ----->|
 *
 * Attention reads K(l) of every token as a strided tensor (stride S), so no
 * page table or gather is needed. Pages are mapped as the sequence grows.
 *
 * Map-ahead (cfg.map_ahead): a thread (kv_ahead.h) maps the pages a
 * sequence will need soon, posted by kv_seq_ahead(), so kv_seq_reserve()
 * finds them mapped. Pages mapped ahead of need hold no token and belong to
 * nobody yet: kv_seq_pages() does not count them, kv_pages_free() does, and
 * kv_reclaim() (run by kv_seq_reserve() itself when the free list is short)
 * unmaps them again. So whoever counts pages through kv (the scheduler) sees
 * the pool exactly as without map-ahead, and any page it counts as free can
 * be had at once.
 *
 * Thread safety: one owner thread (the engine's) makes every kv_* call; the
 * map-ahead thread only calls vmm. The forward pass only reads the base
 * address and writes KV bytes of its own sequence.
 */
#ifndef LLMD_KV_H
#define LLMD_KV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/kern.h"
#include "vmm/vmm.h"

struct kv_ahead;
struct model_hparams;

/* Element type of K and V; the values are kern_kv_type's and are what the
 * model fingerprint hashes (model_fp.h), so they never change meaning. */
enum kv_dtype { KV_F32 = 0, KV_F16 = 1, KV_Q8_0 = 2, KV_Q4_0 = 3, KV_FP8 = 4, KV_DTYPE_N };

/* Where the pages live: host memory (the CPU forward pass) or a CUDA device
 * (the vmm CUDA backend; then every address kv.h returns is a device
 * address the host must not dereference). */
enum kv_device { KV_DEV_HOST = 0, KV_DEV_CUDA = 1 };

struct kv_config {
    enum kv_dtype dtype;   /* element type of K and V (quantized on CUDA: rows <= 12288 values) */
    uint32_t n_ctx;        /* max tokens per sequence */
    uint32_t n_seqs;       /* sequence slots */
    size_t page_bytes;     /* requested page size (0: 16 tokens); capped and rounded as
                            * vmm.h says */
    uint64_t budget_bytes; /* physical KV budget (0: enough for n_seqs * n_ctx) */
    enum vmm_huge huge;    /* host pages only */
    bool map_ahead;        /* start the map-ahead thread */
    enum kv_device device;
    int cuda_ordinal; /* KV_DEV_CUDA: the device */
    /* speculative decoding's draft model (docs/architecture.md, KV): its K and
     * V of a token sit in the same token slot, after the target's (padded to
     * 64 B), so one range and one page hold both models' KV of its tokens.
     * NULL: none. Borrowed for the call; KV_DEV_HOST only (-ENOTSUP). */
    const struct model_hparams *draft_hp;
};

struct kv_cache {
    struct vmm *vmm;
    enum kv_dtype dtype;
    uint32_t n_ctx;
    uint32_t n_layer, n_head_kv, head_dim;
    size_t stride_bytes; /* S, padded: the target's KV, then the draft's if any */
    size_t layer_bytes;  /* one K or V row of one layer: kern_kv_row_bytes(dtype, H_kv, d) */
    size_t token_offset; /* where this model's KV starts in a token's slot: 0 (the
                          * target), draft_offset in a kv_cache_draft_view() */
    size_t draft_offset; /* the draft model's KV in a token's slot; 0: no draft */
    size_t draft_bytes;  /* bytes of it a token (0: no draft) */
    uint32_t draft_n_layer, draft_n_head_kv, draft_head_dim;
    size_t draft_layer_bytes;
    enum kv_device device;
    int cuda_ordinal; /* KV_DEV_CUDA: the device the pages are on */
    uint32_t n_seqs, tpp;
    uint32_t *need;         /* [n_seqs] pages a sequence holds by need: shared ones and
                             * those its kv_seq_reserve() calls cover; the rest of its
                             * mapped pages were mapped ahead */
    struct kv_ahead *ahead; /* NULL when map-ahead is off */
};

/* Create the cache and its page pool. A budget smaller than one page still
 * gets one page. Returns 0, -EINVAL (n_ctx or n_seqs 0, or a geometry vmm
 * refuses), -ENOMEM (out of memory, or a configuration whose mappings could
 * exceed vm.max_map_count: errbuf says what to change), -ENOTSUP (a CUDA
 * cache in a build or on a machine without CUDA: errbuf says which), or a
 * backend error.
 * A quantized dtype (q8_0, q4_0, fp8) on KV_DEV_CUDA is -ENOTSUP: the CUDA
 * kernels read f32 and f16 only (errbuf says so).
 * Caller frees with kv_cache_destroy(). */
int kv_cache_create(const struct model_hparams *hp, const struct kv_config *cfg,
                    struct kv_cache **out, char *errbuf, size_t errlen);
void kv_cache_destroy(struct kv_cache *kv);

/* A view of kv for the draft model's forward pass (cfg.draft_hp given):
 * a copy of *kv with the draft's layer geometry and token_offset =
 * draft_offset, so kv_slot() and kv_layer_view() address the draft's K and
 * V in each token's slot. It shares kv's pool, ranges and counts: pass it
 * only to model_forward_batch(), never to kv_seq_* or kv_cache_destroy();
 * valid until kv_cache_destroy(kv). Returns 0, -EINVAL (kv has no draft). */
int kv_cache_draft_view(const struct kv_cache *kv, struct kv_cache *out);

/* Open a sequence: take a range slot. -EBUSY when all n_seqs are in use. */
int kv_seq_open(struct kv_cache *kv, uint32_t *seq);

/* Make tokens [0, n_tokens) of seq writable (maps pages as needed; when
 * the free list is short, first takes back pages mapped ahead for other
 * sequences). -ERANGE past n_ctx, -ENOSPC when the page budget is
 * exhausted, -EIO/-ENOMEM (backend). */
int kv_seq_reserve(struct kv_cache *kv, uint32_t seq, uint32_t n_tokens);

/* kv_seq_reserve(), and with map-ahead on also the pages of the n_more
 * tokens after n_tokens in the same grow (one backend call: cuda sets access
 * once), if the free list has them: they count as mapped ahead, not as
 * need. For the step that ends a prompt's prefill, so that the first decode
 * token, which may start a new page, finds it mapped. Errors as
 * kv_seq_reserve() (about n_tokens; the n_more tokens are best effort). */
int kv_seq_reserve_more(struct kv_cache *kv, uint32_t seq, uint32_t n_tokens, uint32_t n_more);

/* True when tokens [0, n_tokens) of seq are mapped already, so that
 * kv_seq_reserve() for them makes no backend call. */
bool kv_seq_backed(const struct kv_cache *kv, uint32_t seq, uint32_t n_tokens);

/* Map pool page `page` (MAPPED or CACHED) as the next page of seq: prefix
 * sharing at admission, before any reserve of seq (so no page was mapped
 * ahead, and the page lands at index kv_seq_pages()). Errors as
 * vmm_range_share(); -EBUSY as well when pages were mapped ahead. */
int kv_seq_share(struct kv_cache *kv, uint32_t seq, uint32_t page);

/* Pages seq holds by need (see need above): its mapped pages less those
 * mapped ahead. The extent: pages a sliding window dropped
 * (kv_seq_drop_front) still count, so that the scheduler's reservations,
 * which grow with a sequence's length, stay matched; the pool's free count
 * has the dropped pages back all the same. */
uint32_t kv_seq_pages(const struct kv_cache *kv, uint32_t seq);

/* A sliding window moved past first_token: unmap seq's pages that hold only
 * tokens before it (indices < first_token / tpp, vmm_range_drop_front), so
 * a long sequence holds the window's pages and no more. The positions stay
 * where they are (no token moves); attention must not read a dropped token
 * (kern_kv.window). Returns the pages dropped now (>= 0), -EINVAL (bad
 * seq), -EIO/-ENOMEM (the unmap failed: nothing changed). */
int kv_seq_drop_front(struct kv_cache *kv, uint32_t seq, uint32_t first_token);

/* Ask the map-ahead thread to map what seq needs for n_tokens tokens, plus
 * KV_AHEAD_SPARE pages, never past max_tokens tokens, taking at most
 * *budget pages not mapped yet (*budget is reduced by what is asked). No-op
 * without map-ahead. Never blocks. */
#define KV_AHEAD_SPARE 1
void kv_seq_ahead(struct kv_cache *kv, uint32_t seq, uint32_t n_tokens, uint32_t max_tokens,
                  uint32_t *budget);

/* Roll seq back to its first n_tokens tokens (speculative decoding: the
 * positions of rejected draft tokens). Its pages by need become
 * ceil(n_tokens / tpp) if that is fewer; the pages past them return to the
 * pool: without map-ahead they are unmapped onto the free list; with it,
 * up to KV_AHEAD_SPARE of them stay mapped as the sequence's pages ahead
 * (free in every count, the page the thread would map for its next tokens)
 * and any more are unmapped, the thread's target on seq cancelled first.
 * The bytes of dropped positions in a page still held stay as they are:
 * attention reads no position past the sequence's length, and each is
 * written again before it is read. n_tokens must cover every page shared
 * into seq (the engine rolls back only decode positions). Returns the
 * pages seq no longer needs (>= 0), -EINVAL (bad seq), -EIO/-ENOMEM (the
 * unmap failed: nothing changed). */
int kv_seq_trim(struct kv_cache *kv, uint32_t seq, uint32_t n_tokens);

/* Close a sequence: stop the thread's work on it, unmap its pages (mapped
 * ahead ones too) and free the slot. */
void kv_seq_close(struct kv_cache *kv, uint32_t seq);

/* Pages on the free list plus pages mapped ahead (*ahead, may be NULL, gets
 * those): what can be had without evicting a cached page. One pool
 * snapshot, so a map-ahead in flight does not change it. */
uint32_t kv_pages_free(const struct kv_cache *kv, uint32_t *ahead);

/* Make sure n pages are on the free list, unmapping pages mapped ahead (of
 * every sequence but `keep`, UINT32_MAX: none kept) when they are not; it
 * first stops the thread (waits for its call in flight). Returns the free
 * pages now. */
uint32_t kv_reclaim(struct kv_cache *kv, uint32_t n, uint32_t keep);

/* Wait until the map-ahead thread did all that was asked (tests). */
void kv_ahead_sync(struct kv_cache *kv);

/* vmm_check(), and every sequence maps at least the pages it needs. Logs
 * the first violation. For tests. */
bool kv_check(const struct kv_cache *kv);

/* Strided view of layer il of seq for the attention kernel. */
void kv_layer_view(const struct kv_cache *kv, uint32_t seq, uint32_t il, int n_head,
                   struct kern_kv *out);

/* Address of K (is_v = 0) or V (is_v = 1) of token t, layer il: one KV row
 * of dtype (kern.h: [n_head_kv][head_dim] elements, or their blocks). */
void *kv_slot(const struct kv_cache *kv, uint32_t seq, uint32_t t, uint32_t il, int is_v);

/* The type's name as the command line takes it: "f32", "f16", "q8_0",
 * "q4_0", "fp8" ("?" out of range). Static. */
const char *kv_dtype_name(enum kv_dtype t);

/* The type named `name` (kv_dtype_name's spelling). Returns 0, -EINVAL. */
int kv_dtype_parse(const char *name, enum kv_dtype *out);

/* "f32|f16|q8_0|q4_0|fp8": for usage lines and error messages. Static. */
const char *kv_dtype_names(void);

#endif /* LLMD_KV_H */
