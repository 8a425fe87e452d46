/* Speculative decoding through `llmd serve` (issue 16): the same text as a
 * server without it, the usage object's "speculative" extension (drafted
 * and accepted tokens, absent for a request that opts out with
 * "speculative": false), the field refused when it is not a boolean, the
 * /metrics counters and acceptance-length histogram agreeing with the
 * usage of the requests sent, and llmctl stats' "# speculative" section.
 * In-process servers on stories260K; drafts run to their full length
 * (spec_fixed_len) so that every repeat of the text gets drafted. */
#include <sys/wait.h>

#include "tests/lib/http_util.h"

#define PROMPT "The cat was very happy. The cat was very happy. The cat"

static const char *sock_path(void) {
    static char p[64];
    snprintf(p, sizeof(p), "/tmp/llmd-spec-%d.sock", getpid());
    return p;
}

static void start_as(struct ht_server *t, bool spec, bool draft) {
    struct llmd_engine_config ec = ht_engine_config();
    if (draft) { /* the model drafts for itself: every draft accepted */
        ec.spec_model_path = ec.model;
        ec.spec = LLMD_SPEC_DRAFT;
    }
    if (spec) {
        ec.spec = draft ? LLMD_SPEC_DRAFT : LLMD_SPEC_NGRAM;
        ec.spec_tokens = 6;
        ec.spec_fixed_len = 1;
    }
    unlink(sock_path());
    struct http_config hc = {.admin_socket = spec ? sock_path() : NULL};
    ht_start(t, &ec, &hc);
}

static void start(struct ht_server *t, bool spec) {
    start_as(t, spec, false);
}

/* llmctl's answer to cmd, in out[cap]. */
static void llmctl(const char *cmd, char *out, size_t cap) {
    char line[256];
    const char *build = getenv("LLMD_BUILD");
    snprintf(line, sizeof line, "%s/llmctl -s %s %s 2>&1", build ? build : "build/debug",
             sock_path(), cmd);
    FILE *f = popen(line, "r");
    size_t n = fread(out, 1, cap - 1, f);
    out[n] = '\0';
    cr_assert_eq(pclose(f), 0, "%s", out);
}

static json_t *complete(uint16_t port, const char *extra) {
    char body[512];
    snprintf(body, sizeof body,
             "{\"model\": \"" HT_NAME "\", \"prompt\": \"" PROMPT "\", \"max_tokens\": 60, "
             "\"temperature\": 0%s}",
             extra);
    struct ht_resp r;
    ht_post(port, "/v1/completions", body, &r);
    cr_assert_eq(r.status, 200, "%d: %s", r.status, r.body);
    json_t *j = ht_json(&r);
    ht_free(&r);
    return j;
}

static const char *text_of(json_t *j) {
    return json_string_value(
        json_object_get(json_array_get(json_object_get(j, "choices"), 0), "text"));
}

static json_int_t usage_int(json_t *j, const char *a, const char *b) {
    json_t *u = json_object_get(j, "usage");
    if (b)
        u = json_object_get(u, a);
    return json_integer_value(json_object_get(u, b ? b : a));
}

/* A Prometheus sample's value, or -1 when absent. */
static double sample(const char *page, const char *series) {
    char key[256];
    snprintf(key, sizeof key, "\n%s ", series);
    const char *p = strstr(page, key);
    return p ? strtod(p + strlen(key), NULL) : -1;
}

Test(serve_spec, same_text_and_usage_metrics_and_stats, .timeout = 120) {
    struct ht_server plain, spec;
    start(&plain, false);
    json_t *want = complete(plain.port, "");
    cr_assert_null(json_object_get(json_object_get(want, "usage"), "speculative"),
                   "no extension without speculation");
    start(&spec, true);
    json_int_t drafted = 0, accepted = 0;
    for (int i = 0; i < 3; i++) {
        json_t *got = complete(spec.port, "");
        cr_assert_str_eq(text_of(got), text_of(want), "request %d", i);
        cr_assert_eq(usage_int(got, "completion_tokens", NULL), 60);
        json_int_t d = usage_int(got, "speculative", "draft_tokens"),
                   a = usage_int(got, "speculative", "accepted_tokens");
        cr_assert_gt(d, 0, "drafted %lld", (long long)d);
        cr_assert_gt(a, 0, "accepted %lld", (long long)a);
        cr_assert_leq(a, d);
        drafted += d;
        accepted += a;
        json_decref(got);
    }
    /* opting out: the same text, no drafts, no extension */
    json_t *off = complete(spec.port, ", \"speculative\": false");
    cr_assert_str_eq(text_of(off), text_of(want));
    cr_assert_null(json_object_get(json_object_get(off, "usage"), "speculative"));
    json_decref(off);
    /* not a boolean: refused, naming the field */
    struct ht_resp r;
    ht_post(spec.port, "/v1/completions",
            "{\"model\": \"" HT_NAME "\", \"prompt\": \"x\", \"speculative\": \"no\"}", &r);
    ht_assert_error(&r, 400, "invalid_type");
    cr_assert(strstr(r.body, "speculative"), "%s", r.body);
    ht_free(&r);
    /* /metrics agrees with the usage of the requests */
    ht_wait_idle(&spec);
    ht_request(spec.port, "GET", "/metrics", NULL, NULL, &r);
    cr_assert_eq(r.status, 200);
    cr_assert_eq(sample(r.body, "llmd_spec_draft_tokens_total"), (double)drafted, "%s", r.body);
    cr_assert_eq(sample(r.body, "llmd_spec_accepted_tokens_total"), (double)accepted);
    cr_assert_eq(sample(r.body, "llmd_spec_acceptance_length_sum"), (double)accepted);
    double count = sample(r.body, "llmd_spec_acceptance_length_count");
    cr_assert_gt(count, 0);
    cr_assert_eq(sample(r.body, "llmd_spec_acceptance_length_bucket{le=\"+Inf\"}"), count);
    cr_assert_leq(sample(r.body, "llmd_spec_acceptance_length_bucket{le=\"0\"}"),
                  sample(r.body, "llmd_spec_acceptance_length_bucket{le=\"6\"}"));
    cr_assert_eq(sample(r.body, "llmd_spec_acceptance_length_bucket{le=\"6\"}"), count,
                 "drafts of 6 accept at most 6");
    ht_free(&r);
    /* llmctl stats: the section, with the same totals */
    char cmd[256], out[16384];
    const char *build = getenv("LLMD_BUILD");
    snprintf(cmd, sizeof cmd, "%s/llmctl -s %s stats 2>&1", build ? build : "build/debug",
             sock_path());
    FILE *f = popen(cmd, "r");
    size_t n = fread(out, 1, sizeof out - 1, f);
    out[n] = '\0';
    cr_assert_eq(pclose(f), 0, "%s", out);
    char line[96];
    snprintf(line, sizeof line, "\ndraft_tokens_total:%lld\n", (long long)drafted);
    cr_assert(strstr(out, "# speculative\n") && strstr(out, line), "%s", out);
    snprintf(line, sizeof line, "\naccepted_tokens_total:%lld\n", (long long)accepted);
    cr_assert(strstr(out, line), "%s", out);
    json_decref(want);
    ht_stop(&spec);
    ht_stop(&plain);
    unlink(sock_path());
}

/* A streamed answer's usage chunk carries the extension too. */
Test(serve_spec, streamed_usage_has_the_extension, .timeout = 60) {
    struct ht_server spec;
    start(&spec, true);
    struct ht_resp r;
    ht_post(spec.port, "/v1/completions",
            "{\"model\": \"" HT_NAME "\", \"prompt\": \"" PROMPT "\", \"max_tokens\": 40, "
            "\"stream\": true, \"stream_options\": {\"include_usage\": true}}",
            &r);
    cr_assert_eq(r.status, 200, "%s", r.body);
    json_t *ev[128];
    bool done = false;
    size_t n = ht_sse(r.body, ev, 128, &done);
    cr_assert(done && n > 1);
    json_t *u = json_object_get(ev[n - 1], "usage");
    cr_assert_not_null(u, "the last chunk has the usage");
    json_t *s = json_object_get(u, "speculative");
    cr_assert_not_null(s);
    cr_assert_gt(json_integer_value(json_object_get(s, "draft_tokens")), 0);
    for (size_t i = 0; i < n; i++)
        json_decref(ev[i]);
    ht_free(&r);
    ht_stop(&spec);
    unlink(sock_path());
}

/* --spec draft: the same text; the draft model's KV shows in /metrics and
 * in llmctl stats and pages (its bytes of each token and of the pages in
 * use), and every draft is accepted (the model drafts for itself). */
Test(serve_spec, draft_model_same_text_and_its_kv_shown, .timeout = 120) {
    struct ht_server plain, spec;
    start(&plain, false);
    json_t *want = complete(plain.port, "");
    start_as(&spec, true, true);
    json_t *got = complete(spec.port, "");
    cr_assert_str_eq(text_of(got), text_of(want));
    json_int_t d = usage_int(got, "speculative", "draft_tokens");
    cr_assert_gt(d, 0);
    cr_assert_eq(usage_int(got, "speculative", "accepted_tokens"), d);
    json_decref(got);
    json_decref(want);
    ht_wait_idle(&spec);
    struct ht_resp r;
    ht_request(spec.port, "GET", "/metrics", NULL, NULL, &r);
    cr_assert_eq(r.status, 200);
    double tb = sample(r.body, "llmd_kv_token_bytes"),
           db = sample(r.body, "llmd_kv_draft_token_bytes");
    cr_assert_gt(db, 0, "%s", r.body);
    cr_assert_eq(2 * db, tb, "the same model twice: half of each token's KV");
    cr_assert_geq(sample(r.body, "llmd_kv_draft_bytes"), 0);
    ht_free(&r);
    char out[16384], line[96];
    llmctl("stats", out, sizeof out);
    snprintf(line, sizeof line, "\nkv_draft_token_bytes:%.0f\n", db);
    cr_assert(strstr(out, line) && strstr(out, "\nkv_draft_bytes:"), "%s", out);
    llmctl("pages", out, sizeof out);
    snprintf(line, sizeof line, "\ndraft_token_bytes:%.0f\n", db);
    cr_assert(strstr(out, line), "%s", out);
    ht_stop(&spec);
    ht_stop(&plain);
    unlink(sock_path());
}
