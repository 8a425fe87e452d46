/* The logit processing a request asks for (penalties, logit_bias,
 * stop_token_ids, ignore_eos) changes that request's tokens only, and a
 * seeded request samples the same tokens whatever runs beside it. The
 * formulas themselves: tests/test_smp_sample.c. */
#include <criterion/criterion.h>
#include <errno.h>

#include "llmd.h"
#include "tests/lib/ref_util.h"

#define F32   REF_MODELS "/stories260K-f32.gguf"
#define N_GEN 24
#define EOS   2 /* stories260K's */

struct got {
    uint32_t n;
    int32_t ids[512];
    char text[4096];
    size_t len;
    enum llmd_finish finish;
};

static void on_token(void *user, uint64_t id, int32_t token, const char *text, size_t len,
                     enum llmd_finish finish) {
    (void)id;
    struct got *g = user;
    if (token >= 0 && g->n < 512)
        g->ids[g->n++] = token;
    cr_assert_lt(g->len + len, sizeof g->text);
    memcpy(g->text + g->len, text, len);
    g->len += len;
    g->finish = finish;
}

static struct llmd_engine *open_engine(void) {
    struct llmd_engine_config cfg = {
        .model = F32, .n_threads = 1, .n_ctx = 256, .kv_type = LLMD_KV_F32};
    struct llmd_engine *e;
    char err[256];
    cr_assert_eq(llmd_engine_open(&cfg, &e, err, sizeof(err)), 0, "%s", err);
    return e;
}

static struct llmd_request req(const char *p, struct got *g) {
    return (struct llmd_request){
        .prompt = p, .prompt_len = strlen(p), .max_tokens = N_GEN, .on_token = on_token, .user = g};
}

static void submit(struct llmd_engine *e, const struct llmd_request *r) {
    uint64_t id;
    cr_assert_eq(llmd_submit(e, r, &id, NULL), 0);
}

static void run(struct llmd_engine *e) {
    while (llmd_engine_step(e) > 0)
        ;
}

static void expect_same(const struct got *a, const struct got *b, const char *what) {
    cr_assert_eq(a->n, b->n, "%s: %u tokens vs %u", what, a->n, b->n);
    for (uint32_t i = 0; i < a->n; i++)
        cr_assert_eq(a->ids[i], b->ids[i], "%s: token %u", what, i);
}

Test(engine_penalties, a_request_s_parameters_stay_its_own, .timeout = 120) {
    const char *p = "Once upon a time";
    static struct got plain, seeded, pen, plain2, seeded2, other;
    int32_t ban[1] = {432}; /* ",": greedy's first token */
    float ban_b[1] = {-100};
    struct llmd_engine *e = open_engine();
    struct llmd_request rp = req(p, &plain);
    struct llmd_request rs = req("The cat sat", &seeded);
    rs.temperature = 1.0f;
    rs.seed = 1234;
    submit(e, &rp);
    run(e);
    submit(e, &rs);
    run(e);
    /* the same two inside a busy batch, beside a penalized request and a
     * sampled one with another seed */
    struct llmd_request rq = req(p, &pen);
    rq.presence_penalty = 2.0f;
    rq.frequency_penalty = 1.0f;
    rq.repetition_penalty = 1.3f;
    rq.logit_bias_ids = ban;
    rq.logit_bias = ban_b;
    rq.n_logit_bias = 1;
    struct llmd_request ro = req("Lily and Tom", &other);
    ro.temperature = 1.5f;
    ro.seed = 99;
    ro.repetition_penalty = 2.0f;
    rp.user = &plain2;
    rs.user = &seeded2;
    submit(e, &rq);
    submit(e, &ro);
    submit(e, &rp);
    submit(e, &rs);
    run(e);
    llmd_engine_close(e);
    expect_same(&plain, &plain2, "greedy beside penalized requests");
    expect_same(&seeded, &seeded2, "seed 1234 alone and in a busy batch");
    cr_assert_neq(pen.ids[0], 432, "the banned token is never chosen");
    for (uint32_t i = 0; i < pen.n; i++)
        cr_assert_neq(pen.ids[i], 432, "token %u", i);
    bool differs = false;
    for (uint32_t i = 0; i < pen.n && i < plain.n; i++)
        differs |= pen.ids[i] != plain.ids[i];
    cr_assert(differs, "the penalties change the text");
}

Test(engine_penalties, logit_bias_forces_a_token_and_ignore_eos_runs_on, .timeout = 60) {
    struct llmd_engine *e = open_engine();
    static struct got nl, eos, on;
    int32_t ids[1] = {13}; /* <0x0A>: "\n" */
    float b[1] = {100};
    struct llmd_request r = req("Once", &nl);
    r.max_tokens = 5;
    r.logit_bias_ids = ids;
    r.logit_bias = b;
    r.n_logit_bias = 1;
    submit(e, &r);
    run(e);
    cr_assert_eq(nl.n, 5);
    cr_assert_str_eq(nl.text, "\n\n\n\n\n");
    /* EOS forced: it ends the request at once, unless ignore_eos */
    ids[0] = EOS;
    r.user = &eos;
    submit(e, &r);
    run(e);
    cr_assert_eq(eos.finish, LLMD_FINISH_EOS);
    cr_assert_eq(eos.n, 1);
    r.user = &on;
    r.ignore_eos = 1;
    submit(e, &r);
    run(e);
    llmd_engine_close(e);
    cr_assert_eq(on.finish, LLMD_FINISH_LENGTH);
    cr_assert_eq(on.n, 5);
    for (uint32_t i = 0; i < 5; i++)
        cr_assert_eq(on.ids[i], EOS, "token %u", i);
    cr_assert_eq(on.len, 0, "EOS has no text");
}

Test(engine_penalties, stop_token_ids_end_the_request, .timeout = 60) {
    struct llmd_engine *e = open_engine();
    static struct got g, s;
    struct llmd_request r = req("Once upon a time", &g);
    submit(e, &r);
    run(e);
    /* the first token that did not appear before it */
    uint32_t k = 3;
    for (bool dup = true; dup && k < g.n; k += dup) {
        dup = false;
        for (uint32_t i = 0; i < k; i++)
            dup |= g.ids[i] == g.ids[k];
    }
    cr_assert_lt(k, g.n);
    int32_t stop[1] = {g.ids[k]};
    r.user = &s;
    r.stop_token_ids = stop;
    r.n_stop_token_ids = 1;
    submit(e, &r);
    run(e);
    cr_assert_eq(s.finish, LLMD_FINISH_EOS);
    cr_assert_eq(s.n, k + 1, "the stop token is the last one sampled");
    for (uint32_t i = 0; i <= k; i++)
        cr_assert_eq(s.ids[i], g.ids[i]);
    int32_t many[LLMD_STOP_TOKEN_IDS_MAX + 1] = {0};
    r.stop_token_ids = many;
    r.n_stop_token_ids = LLMD_STOP_TOKEN_IDS_MAX + 1;
    uint64_t id;
    cr_assert_eq(llmd_submit(e, &r, &id, NULL), -EINVAL);
    /* regress: a count without the ids was copied from NULL (a crash) once the
     * engine appended the vocabulary's end-of-generation ids */
    const int32_t *ids = r.stop_token_ids;
    r.stop_token_ids = NULL;
    r.n_stop_token_ids = 3;
    cr_assert_eq(llmd_submit(e, &r, &id, NULL), -EINVAL, "stop ids counted but not given");
    r.stop_token_ids = ids;
    int32_t bad[1] = {512};
    float b[1] = {1};
    r.n_stop_token_ids = 0;
    r.logit_bias_ids = bad;
    r.logit_bias = b;
    r.n_logit_bias = 1;
    cr_assert_eq(llmd_submit(e, &r, &id, NULL), -EINVAL, "a bias id outside the vocabulary");
    llmd_engine_close(e);
}
