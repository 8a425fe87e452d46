/* llmd_request.usage: what a server reports per request (usage,
 * prompt_tokens_details.cached_tokens) and observes (queue time). */
#include <criterion/criterion.h>
#include <errno.h>

#include "llmd.h"
#include "tests/lib/ref_util.h"

#define F32 REF_MODELS "/stories260K-f32.gguf"

struct seen {
    struct llmd_usage *u;
    int calls;
    struct llmd_usage first; /* as the first on_token saw it */
    enum llmd_finish finish;
};

static void on_token(void *user, uint64_t id, int32_t token, const char *text, size_t len,
                     enum llmd_finish finish) {
    (void)id, (void)token, (void)text, (void)len;
    struct seen *s = user;
    if (s->calls++ == 0)
        s->first = *s->u;
    s->finish = finish;
}

static struct llmd_engine *open_engine(void) {
    struct llmd_engine_config cfg = {
        .model = F32, .n_threads = 1, .n_ctx = 512, .kv_type = LLMD_KV_F32};
    struct llmd_engine *e;
    char err[256];
    cr_assert_eq(llmd_engine_open(&cfg, &e, err, sizeof(err)), 0, "%s", err);
    return e;
}

Test(engine_usage, prompt_cache_hits_and_queue_time, .timeout = 60) {
    struct llmd_engine *e = open_engine();
    /* 37 tokens: two full pages of 16 */
    const char *p = "Once upon a time there was a big dog. The dog liked to run in the park "
                    "with his friend the cat, and they played all day long.";
    struct llmd_usage ua, ub;
    struct seen a = {.u = &ua}, b = {.u = &ub};
    struct llmd_request r = {.prompt = p,
                             .prompt_len = strlen(p),
                             .max_tokens = 3,
                             .on_token = on_token,
                             .user = &a,
                             .usage = &ua};
    uint64_t id;
    cr_assert_eq(llmd_submit(e, &r, &id, NULL), 0);
    cr_assert_gt(ua.prompt_tokens, 32, "%u", ua.prompt_tokens);
    cr_assert_eq(ua.queue_ns, 0, "not admitted yet");
    while (llmd_engine_step(e) > 0)
        ;
    cr_assert_gt(a.first.queue_ns, 0, "the first token comes after the admission");
    cr_assert_eq(a.first.cached_tokens, 0);
    cr_assert_eq(ua.completion_tokens, 3);

    r.user = &b;
    r.usage = &ub;
    cr_assert_eq(llmd_submit(e, &r, &id, NULL), 0);
    while (llmd_engine_step(e) > 0)
        ;
    cr_assert_eq(b.first.cached_tokens, 32, "two cached pages: %u", b.first.cached_tokens);
    cr_assert_gt(ub.queue_ns, 0);
    llmd_engine_close(e);
}

Test(engine_usage, cancelled_before_admission_has_no_queue_time, .timeout = 60) {
    struct llmd_engine *e = open_engine();
    struct llmd_usage u;
    struct seen a = {.u = &u};
    struct llmd_request r = {.prompt = "Hi",
                             .prompt_len = 2,
                             .max_tokens = 100,
                             .on_token = on_token,
                             .user = &a,
                             .usage = &u};
    uint64_t id;
    cr_assert_eq(llmd_submit(e, &r, &id, NULL), 0);
    cr_assert_eq(llmd_cancel(e, id), 0);
    cr_assert_eq(a.calls, 1);
    cr_assert_eq(a.finish, LLMD_FINISH_CANCELLED);
    cr_assert_eq(u.queue_ns, 0);
    cr_assert_eq(u.completion_tokens, 0);
    llmd_engine_close(e);
}
