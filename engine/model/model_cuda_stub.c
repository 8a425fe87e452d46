/* model_cuda_stub.c - model_cuda.h in a build without CUDA (the default
 * build; `make cuda` links engine/model/cuda/model_cuda.c instead). Every create
 * fails with -ENOTSUP and says how to get a CUDA build. */
#include "engine/model/model_cuda.h"

#include <errno.h>
#include <stdio.h>

static const char mcu_stub_why[] =
    "llmd was built without CUDA support: build it with `make cuda` and run build/cuda/llmd";

const char *model_cuda_unavailable(void) {
    return mcu_stub_why;
}

int model_cuda_create(const struct model *m, const struct model_cuda_opts *o,
                      struct model_cuda **out, char *errbuf, size_t errlen) {
    (void)m;
    (void)o;
    (void)out;
    if (errbuf && errlen)
        snprintf(errbuf, errlen, "%s", mcu_stub_why);
    return -ENOTSUP;
}

void model_cuda_destroy(struct model_cuda *mc) {
    (void)mc;
}

int model_cuda_forward(struct model_cuda *mc, struct kv_cache *kv,
                       const struct model_batch_seq *seqs, uint32_t n_seqs) {
    (void)mc;
    (void)kv;
    (void)seqs;
    (void)n_seqs;
    return -ENOTSUP;
}

void model_cuda_stats_get(const struct model_cuda *mc, struct model_cuda_stats *out) {
    (void)mc;
    *out = (struct model_cuda_stats){0};
}
