/* The device choice (llmd_engine_config.device, model_ctx_use_cuda) in a
 * build without CUDA: a GPU engine is refused with -ENOTSUP and a message
 * naming the build that has one, an unknown device with -EINVAL, and the
 * CPU path is untouched. (The GPU path itself is tests/device/'s.) */
#include <criterion/criterion.h>
#include <errno.h>

#include "engine/model/kv.h"
#include "engine/model/model.h"
#include "engine/model/model_cuda.h"
#include "engine/model/model_forward.h"
#include "kernels/kern.h"
#include "llmd.h"
#include "tests/lib/ref_util.h"

#define F32 REF_MODELS "/stories260K-f32.gguf"

static void on_token(void *user, uint64_t id, int32_t token, const char *text, size_t len,
                     enum llmd_finish finish) {
    (void)id, (void)text, (void)len, (void)finish;
    int *n = user;
    if (token >= 0)
        (*n)++;
}

Test(engine_device, cuda_engine_refused_naming_make_cuda, .timeout = 60) {
    struct llmd_engine_config cfg = {.model = F32,
                                     .n_threads = 1,
                                     .n_ctx = 512,
                                     .kv_type = LLMD_KV_F32,
                                     .device = LLMD_DEVICE_CUDA};
    struct llmd_engine *e = NULL;
    char err[512] = "";
    cr_assert_eq(llmd_engine_open(&cfg, &e, err, sizeof(err)), -ENOTSUP, "%s", err);
    cr_assert_null(e);
    cr_assert(strstr(err, "make cuda"), "%s", err);
    cfg.device = (enum llmd_device)7;
    cr_assert_eq(llmd_engine_open(&cfg, &e, err, sizeof(err)), -EINVAL, "%s", err);
    cr_assert(strstr(err, "device"), "%s", err);
    /* the default is the CPU, and it runs */
    cfg.device = LLMD_DEVICE_CPU;
    cr_assert_eq(llmd_engine_open(&cfg, &e, err, sizeof(err)), 0, "%s", err);
    int n = 0;
    struct llmd_request r = {
        .prompt = "Once", .prompt_len = 4, .max_tokens = 5, .on_token = on_token, .user = &n};
    uint64_t id;
    cr_assert_eq(llmd_submit(e, &r, &id, NULL), 0);
    while (llmd_engine_step(e) > 0)
        ;
    cr_assert_eq(n, 5);
    llmd_engine_close(e);
}

Test(engine_device, gpu_forward_pass_needs_a_gpu_cache_and_a_cuda_build, .timeout = 60) {
    struct model *m = NULL;
    char err[512] = "";
    cr_assert_eq(model_load(F32, &(struct model_load_opts){.quiet = true}, &m, err, sizeof(err)), 0,
                 "%s", err);
    struct kv_config kc = {.dtype = KV_F32, .n_ctx = 64, .n_seqs = 1};
    struct kv_cache *kv = NULL;
    cr_assert_eq(kv_cache_create(&m->hp, &kc, &kv, err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(kv->device, KV_DEV_HOST);
    struct model_ctx *c = NULL;
    cr_assert_eq(model_ctx_create(m, NULL, 8, &c), 0);
    /* a host cache: refused before anything is uploaded */
    cr_assert_eq(model_ctx_use_cuda(c, kv, 0, 1, err, sizeof(err)), -EINVAL);
    cr_assert(strstr(err, "KV cache on the GPU"), "%s", err);
    cr_assert(!model_ctx_on_cuda(c));
    /* a GPU cache in this build: the backend says how to get one */
    struct kv_cache *gkv = NULL;
    kc.device = KV_DEV_CUDA;
    cr_assert_eq(kv_cache_create(&m->hp, &kc, &gkv, err, sizeof(err)), -ENOTSUP);
    cr_assert_null(gkv);
    cr_assert(strstr(err, "make cuda"), "%s", err);
    struct model_cuda *mc = NULL;
    struct model_cuda_opts o = {.max_tok = 8, .max_seqs = 1, .max_ctx = 64};
    cr_assert_eq(model_cuda_create(m, &o, &mc, err, sizeof(err)), -ENOTSUP);
    cr_assert_null(mc);
    cr_assert(strstr(model_cuda_unavailable(), "make cuda"));
    model_ctx_destroy(c);
    kv_cache_destroy(kv);
    model_free(m);
}
