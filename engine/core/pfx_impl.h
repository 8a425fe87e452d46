/* pfx_impl.h - internals shared by engine/core/pfx.c (the index) and
 * engine/core/pfx_hash.c (the secret and the keyed page-hash chain). Not for other
 * modules: include engine/core/pfx.h.
 */
#ifndef LLMD_PFX_IMPL_H
#define LLMD_PFX_IMPL_H

#include "engine/core/pfx.h"

struct evp_mac_ctx_st;

/* The immutable half of the cache: key, fingerprint, page size. Caller-
 * embedded (pfx_hasher_init/fini). After init every use is read-only, so
 * any number of threads may chain at once. */
struct pfx_hasher {
    struct evp_mac_ctx_st *proto; /* HMAC-SHA256 keyed with the secret; duplicated per chain */
    uint8_t fp[MODEL_FP_BYTES];
    uint32_t tpp; /* tokens per page */
};

/* Returns 0, -EINVAL (tpp 0), -ENOMEM (OpenSSL allocation), -EIO (OpenSSL
 * refused HMAC-SHA256, e.g. a FIPS provider without it). */
int pfx_hasher_init(struct pfx_hasher *hs, const uint8_t key[PFX_KEY_BYTES],
                    const uint8_t fp[MODEL_FP_BYTES], uint32_t tpp);
void pfx_hasher_fini(struct pfx_hasher *hs);

/* pfx_chain() on a hasher; same contract. */
int pfx_hasher_chain(const struct pfx_hasher *hs, const struct pfx_ns *ns, uint32_t n_ns,
                     const int32_t *tokens, uint32_t n_tokens, struct pfx_hash *out,
                     uint32_t *n_out);

#endif /* LLMD_PFX_IMPL_H */
