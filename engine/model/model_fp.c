/* model_fp.c - model fingerprint (see model_fp.h).
 *
 * Two XXH3-128 streams with different seeds read the same chunk one after
 * the other, so memory is read once and the second pass hits cache; the
 * chunk (256 KiB) is small enough for L2 on every x86 this runs on and large
 * enough that the per-chunk update overhead is nil. xxHash is compiled in
 * (XXH_INLINE_ALL): its streaming state then lives on our stack, with no
 * allocation outside mem.h and no dependence on the library's struct layout.
 */
#include "engine/model/model_fp.h"

#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#define MODEL_FP_CHUNK  (256u << 10)
#define MODEL_FP_SEED_A 0x6c6c6d642d667031ull /* "llmd-fp1" */
#define MODEL_FP_SEED_B 0x6c6c6d642d667032ull /* "llmd-fp2" */

static void model_fp_update(XXH3_state_t *a, XXH3_state_t *b, const void *p, size_t len) {
    XXH3_128bits_update(a, p, len);
    XXH3_128bits_update(b, p, len);
}

static void model_fp_u64(XXH3_state_t *a, XXH3_state_t *b, uint64_t x) {
    uint8_t le[8];
    for (int i = 0; i < 8; i++)
        le[i] = (uint8_t)(x >> (8 * i));
    model_fp_update(a, b, le, sizeof le);
}

/* XXH128_canonicalFromHash writes big-endian: fixed bytes on every host. */
static void model_fp_digest(const XXH3_state_t *s, uint8_t out[16]) {
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits_digest(s));
    memcpy(out, c.digest, 16);
}

void model_fingerprint(const void *const *bufs, const size_t *lens, size_t n, uint32_t kv_dtype,
                       uint8_t out[MODEL_FP_BYTES]) {
    XXH3_state_t a, b;
    XXH3_INITSTATE(&a);
    XXH3_INITSTATE(&b);
    XXH3_128bits_reset_withSeed(&a, MODEL_FP_SEED_A);
    XXH3_128bits_reset_withSeed(&b, MODEL_FP_SEED_B);
    for (size_t i = 0; i < n; i++) {
        const uint8_t *p = bufs[i];
        model_fp_u64(&a, &b, lens[i]);
        for (size_t off = 0; off < lens[i]; off += MODEL_FP_CHUNK) {
            size_t len = lens[i] - off < MODEL_FP_CHUNK ? lens[i] - off : MODEL_FP_CHUNK;
            model_fp_update(&a, &b, p + off, len);
        }
    }
    model_fp_u64(&a, &b, kv_dtype);
    model_fp_u64(&a, &b, n);
    model_fp_digest(&a, out);
    model_fp_digest(&b, out + 16);
}
